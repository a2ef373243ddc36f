//! CoRM's operations as a service on the node's RPC workers (issue 32
//! item 2): Alloc, Free, Read, Write, ReleasePtr, compaction control and
//! statistics, carried by the fabric's RPC channel (CoRM, SIGMOD'21,
//! §2.2.2 and §3.2.1: requests pushed into an RPC queue the node's worker
//! threads poll).
//!
//! Each RPC worker owns one [`Worker`] of the store (worker `w` of the
//! node is the store's worker `w`, so the store has as many workers as the
//! node has RPC workers). A call starts its [`Op`] on the worker that took
//! it; an operation that waits for a peer (a free on another worker's
//! block, pointer correction by messaging, a compaction in progress) is
//! answered later ([`WorkerCtx::defer`]) from the worker's
//! [`Service::poll`], which steps the store's worker between requests.
//! While a store worker has work in progress or the store has messages in
//! flight, the RPC workers do not sleep ([`Service::busy`],
//! [`Service::wake_peers`]).
//!
//! Wire format: a [`CormRequest`] encoded with bincode (fixed-width
//! integers, as the node's control protocol); a reply is a [`CormAnswer`],
//! a failure the service error [`CormFault`], both bincode.
//!
//! The node holds its services, the store holds its node weakly (its
//! memory through the node's mappings): a node serving CoRM is dropped
//! with its last outside handle, and takes the store with it.
//!
//! On the simulator the node's modelled cores poll the service as the
//! threads do on shm (`dmkit_sim::rpc`), and compaction's work is charged
//! as CPU time ([`MERGE_NS`], [`REMAP_PAGE_NS`]). A merge takes effect at
//! its step's start in virtual time: one-sided readers there never find an
//! object locked mid-merge, only moved.

use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};

use bincode::Options;
use serde::{Deserialize, Serialize};

use super::config::{ObjError, Op, OpResult, Reply, StoreConfig};
use super::stats::CormStats;
use super::worker::{Store, Ticket, Worker};
use crate::node::MemNode;
use crate::rpc::{Deferred, Service, ServiceError, ServiceId, WorkerCtx, WorkerId};

/// The service id CoRM is registered under by [`CormService::register`].
pub const CORM: ServiceId = 32;

/// Modelled CPU time an Alloc or a Free adds to an RPC (CoRM §4.1: about
/// 0.5 µs over a read or write); only the simulator counts it.
pub const ALLOC_FREE_NS: f64 = 500.0;

/// Modelled CPU time of one block merge besides its pages' remapping:
/// the compactability check, the copy and the OS remap (`mmap`). With
/// [`REMAP_PAGE_NS`] it gives what CoRM §4.3.1 measured on ConnectX-3
/// with `ibv_rereg_mr` (Fig. 15): about 100 µs for a one-page block and
/// 12 ms for a 256-page (1 MiB) one, so 53.3 µs fixed + 46.7 µs per page.
/// Only the simulator counts it, whatever its device profile (a
/// ConnectX-5 re-registers about 10× faster, ODP needs none: not
/// modelled).
pub const MERGE_NS: f64 = 53_300.0;

/// Modelled CPU time of remapping one translation page of a merged block
/// on the NIC (`ibv_rereg_mr`, ConnectX-3; see [`MERGE_NS`]).
pub const REMAP_PAGE_NS: f64 = 46_700.0;

/// A request to the CoRM service.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum CormRequest {
    /// One of the store's operations (Table 2, and compaction control).
    Op(Op),
    /// A snapshot of the store's accounting.
    Stats,
    /// What a client needs to read objects one-sidedly.
    Info,
}

/// A successful answer of the CoRM service.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum CormAnswer {
    /// The operation's reply.
    Done(Reply),
    /// The accounting.
    Stats(Box<CormStats>),
    /// The store's geometry.
    Info(StoreInfo),
}

/// What a client needs to read objects one-sidedly: the block size, the
/// region key, and each class's slot size and payload capacity.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct StoreInfo {
    /// Bytes of a block.
    pub block_size: u64,
    /// The key of the store's read-only region.
    pub rkey: u32,
    /// Per class id: (slot bytes, payload capacity).
    pub classes: Vec<(u32, u32)>,
}

/// Why the CoRM service refused a call (the service error's bytes).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, thiserror::Error)]
pub enum CormFault {
    /// The store refused the operation (the store is unharmed).
    #[error(transparent)]
    Obj(#[from] ObjError),
    /// The request's bytes are not a [`CormRequest`].
    #[error("undecodable CoRM request: {0}")]
    BadRequest(String),
    /// This RPC worker has no store worker (the store was built for fewer
    /// workers than the node runs).
    #[error("RPC worker {0} has no CoRM worker")]
    NoWorker(WorkerId),
}

fn codec() -> impl Options {
    bincode::DefaultOptions::new()
        .with_fixint_encoding()
        .with_limit(1 << 20)
        .reject_trailing_bytes()
}

/// Encodes a request (for clients).
pub fn encode_request(r: &CormRequest) -> Vec<u8> {
    codec().serialize(r).expect("requests always encode")
}

/// Decodes a reply's bytes (for clients).
pub fn decode_answer(bytes: &[u8]) -> Result<CormAnswer, String> {
    codec().deserialize(bytes).map_err(|e| e.to_string())
}

/// Decodes a service error's bytes (for clients).
pub fn decode_fault(bytes: &[u8]) -> Result<CormFault, String> {
    codec().deserialize(bytes).map_err(|e| e.to_string())
}

/// The CoRM store as a service of the node's RPC workers.
pub struct CormService {
    store: Store,
    /// Store workers not yet taken by their RPC worker.
    spare: Mutex<Vec<Option<Worker>>>,
}

/// What one RPC worker keeps: its store worker, and the calls waiting for
/// it.
pub struct CormWorker {
    worker: Option<Worker>,
    store: Store,
    waiting: Vec<(Ticket, Deferred)>,
}

impl CormService {
    /// Builds a store on `node` with one worker per RPC worker of the node
    /// (`cfg.workers` is set to that) and registers it under [`CORM`].
    pub fn register(node: &Arc<MemNode>, mut cfg: StoreConfig) -> Result<Store, String> {
        let workers = node.rpc_workers();
        if workers == 0 {
            return Err("the node runs no RPC workers".into());
        }
        cfg.workers = workers;
        let (store, ws) = Store::new(node, cfg)?;
        let svc = CormService {
            store: store.clone(),
            spare: Mutex::new(ws.into_iter().map(Some).collect()),
        };
        if !node.register_service(CORM, svc) {
            return Err(format!("service id {CORM} is taken"));
        }
        Ok(store)
    }
}

fn answer(r: OpResult) -> Result<Vec<u8>, ServiceError> {
    match r {
        Ok(reply) => Ok(codec()
            .serialize(&CormAnswer::Done(reply))
            .expect("answers encode")),
        Err(e) => Err(ServiceError::encode(&CormFault::Obj(e))),
    }
}

impl Service for CormService {
    type Worker = CormWorker;
    type Message = ();

    fn name(&self) -> &'static str {
        "corm"
    }

    fn start_worker(&self, worker: WorkerId, _workers: usize) -> CormWorker {
        let mut spare = self.spare.lock().unwrap_or_else(|p| p.into_inner());
        CormWorker {
            worker: spare.get_mut(worker).and_then(Option::take),
            store: self.store.clone(),
            waiting: Vec::new(),
        }
    }

    fn handle(
        &self,
        cx: &mut WorkerCtx<'_, Self>,
        request: &[u8],
        reply: &mut Vec<u8>,
    ) -> Result<(), ServiceError> {
        let req: CormRequest = codec()
            .deserialize(request)
            .map_err(|e| ServiceError::encode(&CormFault::BadRequest(e.to_string())))?;
        let bytes = match req {
            CormRequest::Stats => codec()
                .serialize(&CormAnswer::Stats(Box::new(self.store.stats())))
                .expect("answers encode"),
            CormRequest::Info => {
                let classes = self.store.classes();
                let info = StoreInfo {
                    block_size: self.store.config().block_size,
                    rkey: self.store.rkey(),
                    classes: classes
                        .iter()
                        .map(|(_, c)| (c.slot_size, c.capacity))
                        .collect(),
                };
                codec()
                    .serialize(&CormAnswer::Info(info))
                    .expect("answers encode")
            }
            CormRequest::Op(op) => {
                if matches!(op, Op::Alloc(_) | Op::Free(_)) {
                    cx.charge_ns(ALLOC_FREE_NS);
                }
                let me = cx.worker();
                let st = cx.state();
                let Some(w) = st.worker.as_mut() else {
                    return Err(ServiceError::encode(&CormFault::NoWorker(me)));
                };
                let t = w.start(op);
                match w.take(t) {
                    Some(r) => answer(r)?,
                    None => {
                        let token = cx.defer();
                        cx.state().waiting.push((t, token));
                        return Ok(());
                    }
                }
            }
        };
        reply.extend_from_slice(&bytes);
        Ok(())
    }

    fn poll(&self, cx: &mut WorkerCtx<'_, Self>) -> bool {
        let st = cx.state();
        let Some(w) = st.worker.as_mut() else {
            return false;
        };
        let mut progress = w.step();
        let work = w.take_work();
        cx.charge_ns(work.merges as f64 * MERGE_NS + work.pages_remapped as f64 * REMAP_PAGE_NS);
        let st = cx.state();
        let w = st.worker.as_mut().expect("checked above");
        let mut done = Vec::new();
        st.waiting.retain(|&(t, token)| match w.take(t) {
            Some(r) => {
                done.push((token, r));
                false
            }
            None => true,
        });
        for (token, r) in done {
            progress = true;
            cx.complete(token, answer(r));
        }
        progress
    }

    fn busy(&self, st: &CormWorker) -> bool {
        !st.waiting.is_empty()
            || st.worker.as_ref().is_some_and(|w| !w.idle())
            || st.store.sh.in_flight.load(Ordering::SeqCst) > 0
    }

    fn wake_peers(&self, st: &CormWorker) -> bool {
        st.store.sh.in_flight.load(Ordering::SeqCst) > 0
    }
}
