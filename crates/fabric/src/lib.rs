//! # dmkit-fabric — the one-sided verbs contract
//!
//! The layer every data structure of dmkit is written against: remote
//! addresses ([`GlobalAddr`]), work requests (READ, WRITE, CAS, masked CAS,
//! FAA), batches posted with one doorbell, completions, the capabilities a
//! backend declares, and typed errors. Backends implement [`Fabric`] and
//! [`QueuePair`]; this crate ships the `shm` backend ([`shm`]). Beside
//! the one-sided data path, [`rpc`] is the channel to a memory node's
//! worker threads (two-sided, the node's CPU on the path).
//! Specification: SMART framework (ASPLOS'24) §2.2 (verbs, QPs, doorbells)
//! and §5.1 (read/write/cas/faa append to a buffer, post, sync); DESIGN.md's
//! fabric contract.
//!
//! Not here: coroutines, throttling and backoff (the runtime layer), the
//! simulator, tcp and rdma-core backends (later crates).
//!
//! ## The contract
//! - A request is checked against its region's key, access rights, bounds and
//!   (for atomics) 8-byte alignment; a bad one fails with a [`RequestError`]
//!   naming it, and touches nothing.
//! - Requests of one batch execute in order; after the first failure the rest
//!   of the batch is *flushed* ([`VerbError::Flushed`]) and has no effect. The
//!   queue pair stays usable (an RC QP would need a reset; backends hide that).
//! - Requests posted on one [`QueuePair`] (one thread → one memory node) take
//!   effect in posting order.
//! - Inside one WRITE each aligned 8-byte word is single-copy atomic; ascending
//!   word order is promised only if [`Capabilities::in_order_write`].
//! - Signaled requests complete exactly once; unsignaled ones complete only if
//!   they fail or are flushed.

pub mod addr;
pub mod caps;
pub mod conformance;
pub mod control;
pub mod error;
pub mod exec;
pub mod hint;
pub mod local;
pub mod rpc;
pub mod shared;
pub mod shm;
pub mod sync;
pub mod wr;

pub use addr::{GlobalAddr, NodeId, RemoteRef, Rkey};
pub use caps::Capabilities;
pub use control::{ControlError, ControlPlane, GroupChunk, NodeRpc};
pub use dmkit_memnode::{NodeStats, RegionInfo};
pub use error::{FabricError, PostError, RequestError, VerbError};
pub use exec::Executor;
pub use local::{Lkey, LocalMem};
pub use rpc::{RpcChannel, RpcFailure, RpcReply, RpcSendError, ServiceId};
pub use shared::SharedQp;
pub use sync::SyncQp;
pub use wr::{Batch, Completion, LocalRef, Op, Sgl, VerbKind, WorkRequest};

/// The heap rkey of each of `nodes`, indexed by node id (`None` for ids
/// not listed): what a data structure spread over the nodes keeps to
/// address them.
pub fn heap_rkeys(fabric: &dyn Fabric, nodes: &[NodeId]) -> Result<Vec<Option<Rkey>>, FabricError> {
    let mut rk = Vec::new();
    for &n in nodes {
        let i = n as usize;
        if rk.len() <= i {
            rk.resize(i + 1, None);
        }
        rk[i] = Some(fabric.heap(n)?.rkey);
    }
    Ok(rk)
}

/// The memory nodes sorted, and the lowest (where a structure keeps its
/// descriptor); `None` without nodes.
pub fn home_node(fabric: &dyn Fabric) -> Option<(NodeId, Vec<NodeId>)> {
    let mut nodes = fabric.nodes();
    nodes.sort_unstable();
    let home = *nodes.first()?;
    Some((home, nodes))
}

/// Registers `value` (non-zero: a structure's descriptor) under named root
/// `name` on `node` if the name is free — never set, or cleared by
/// [`release_root`]. `Ok(false)`: the name is taken.
pub fn claim_root(
    fabric: &dyn Fabric,
    node: NodeId,
    name: &str,
    value: u64,
) -> Result<bool, FabricError> {
    let expected = match fabric.get_root(node, name)? {
        None => None,
        Some(0) => Some(0),
        Some(_) => return Ok(false),
    };
    match fabric.set_root(node, name, value, Some(expected)) {
        Ok(_) => Ok(true),
        // Another client claimed it between the read and the swap. Only
        // that is a name clash: a full root table, a bad name or a node
        // shutting down are errors the caller must see as such.
        Err(FabricError::Refused {
            error: ControlError::RootMismatch { .. },
            ..
        }) => Ok(false),
        Err(e) => Err(e),
    }
}

/// The descriptor registered under `name` on `node`, if claimed.
pub fn find_root(
    fabric: &dyn Fabric,
    node: NodeId,
    name: &str,
) -> Result<Option<GlobalAddr>, FabricError> {
    Ok(fabric
        .get_root(node, name)?
        .filter(|&v| v != 0)
        .map(GlobalAddr::from_raw))
}

/// Clears named root `name` on `node` if it still holds `value` (so the
/// name can be claimed again). `Ok(false)`: it held something else.
pub fn release_root(
    fabric: &dyn Fabric,
    node: NodeId,
    name: &str,
    value: u64,
) -> Result<bool, FabricError> {
    match fabric.set_root(node, name, 0, Some(Some(value))) {
        Ok(_) => Ok(true),
        Err(FabricError::Refused {
            error: ControlError::RootMismatch { .. },
            ..
        }) => Ok(false),
        Err(e) => Err(e),
    }
}

/// How a thread's connection shares NIC resources with other threads'
/// (SMART §3.1's allocation policies, Figure 3a; §4.1's per-thread doorbell).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum QpPolicy {
    /// All threads post to one queue pair.
    Shared,
    /// Each queue pair serves a group of this many threads.
    Multiplexed(usize),
    /// One queue pair per thread (dmkit's default).
    PerThreadQp,
    /// One queue pair and one doorbell register per thread (SMART §4.1);
    /// needs a backend with explicit doorbells.
    PerThreadDoorbell,
}

impl std::str::FromStr for QpPolicy {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "shared" => Ok(QpPolicy::Shared),
            "per-thread-qp" => Ok(QpPolicy::PerThreadQp),
            "per-thread-doorbell" => Ok(QpPolicy::PerThreadDoorbell),
            _ => match s.strip_prefix("multiplexed:").map(str::parse::<usize>) {
                Some(Ok(n)) if n > 0 => Ok(QpPolicy::Multiplexed(n)),
                _ => Err(format!(
                    "{s:?}: expected shared, multiplexed:N (N ≥ 1 threads per queue pair), per-thread-qp or per-thread-doorbell"
                )),
            },
        }
    }
}

impl std::fmt::Display for QpPolicy {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            QpPolicy::Shared => write!(f, "shared"),
            QpPolicy::Multiplexed(n) => write!(f, "multiplexed:{n}"),
            QpPolicy::PerThreadQp => write!(f, "per-thread-qp"),
            QpPolicy::PerThreadDoorbell => write!(f, "per-thread-doorbell"),
        }
    }
}

/// Counters of one queue pair.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct QpStats {
    /// Batches posted (one doorbell each).
    pub doorbells: u64,
    /// READs executed, scatter/gather ones included (the verbs backend counts a
    /// request when it hands it to the NIC, the others when it took effect).
    pub reads: u64,
    /// WRITEs executed, scatter/gather and inline ones included (counted when
    /// [`QpStats::reads`] are).
    pub writes: u64,
    /// Plain CAS executed, successful or not (a CAS that finds another value
    /// still completes).
    pub cas: u64,
    /// Masked CAS executed, successful or not.
    pub masked_cas: u64,
    /// FAA executed.
    pub faa: u64,
    /// Payload bytes of the counted READs.
    pub bytes_read: u64,
    /// Payload bytes of the counted WRITEs.
    pub bytes_written: u64,
    /// Requests that failed (flushed ones not included).
    pub errors: u64,
}

impl QpStats {
    /// Adds `other` into `self`.
    pub fn merge(&mut self, o: &QpStats) {
        self.doorbells += o.doorbells;
        self.reads += o.reads;
        self.writes += o.writes;
        self.cas += o.cas;
        self.masked_cas += o.masked_cas;
        self.faa += o.faa;
        self.bytes_read += o.bytes_read;
        self.bytes_written += o.bytes_written;
        self.errors += o.errors;
    }

    /// Verbs executed.
    pub fn verbs(&self) -> u64 {
        self.reads + self.writes + self.cas + self.masked_cas + self.faa
    }
}

/// The loop behind [`QueuePair::poll_drain`]: calls `poll(out, max)` until
/// it moves nothing; returns how many it moved in all. (A backend that
/// overrides `poll_drain` runs it around its own poll.)
pub fn drain(
    mut poll: impl FnMut(&mut Vec<Completion>, usize) -> usize,
    out: &mut Vec<Completion>,
    max: usize,
) -> usize {
    let mut total = 0;
    loop {
        match poll(out, max) {
            0 => return total,
            n => total += n,
        }
    }
}

/// A connection from one thread to one memory node (an RC queue pair with
/// its own send queue, completion queue and doorbell). Not shared between
/// threads: that is what makes posting order the execution order.
pub trait QueuePair: Send {
    /// The memory node this queue pair reaches.
    fn node(&self) -> NodeId;

    /// What the backend offers.
    fn caps(&self) -> Capabilities;

    /// Registers local memory for use by requests on this queue pair and
    /// returns its key. The queue pair keeps the memory alive; registering the
    /// same memory again returns the same key.
    fn register_local(&mut self, mem: &LocalMem) -> Lkey;

    /// Posts all requests of `batch` with one doorbell and empties it. On
    /// `Err`, nothing was posted and the batch is left as it was.
    fn post(&mut self, batch: &mut Batch) -> Result<(), PostError>;

    /// Moves up to `max` ready completions into `out`; returns how many.
    fn poll(&mut self, out: &mut Vec<Completion>, max: usize) -> usize;

    /// Polls, `max` at a time, until a poll finds nothing; returns how
    /// many completions were moved into `out`. The same calls as that loop
    /// (a backend whose every call has a fixed cost, like the simulator's
    /// engine access, makes them in one).
    fn poll_drain(&mut self, out: &mut Vec<Completion>, max: usize) -> usize {
        drain(|out, max| self.poll(out, max), out, max)
    }

    /// Completions posted but not yet polled.
    fn pending(&self) -> usize;

    /// Counters since creation.
    fn stats(&self) -> QpStats;

    /// Posts `batch` and waits for everything outstanding on this queue pair.
    /// The last request is made signaled, so its completion covers the whole
    /// batch (queue-pair order) even if every request was unsignaled.
    /// Returns the completions in posting order, or the first failed request.
    fn execute(&mut self, batch: &mut Batch) -> Result<Vec<Completion>, FabricError> {
        if let Some(last) = batch.requests_mut().last_mut() {
            last.signaled = true;
        }
        self.post(batch)?;
        let mut out = Vec::with_capacity(batch.len());
        while self.pending() > 0 {
            if self.poll(&mut out, usize::MAX) == 0 {
                std::hint::spin_loop();
            }
        }
        match out.iter().find_map(Completion::error) {
            Some(e) => Err(e.clone().into()),
            None => Ok(out),
        }
    }
}

/// A set of memory nodes reachable through one backend: its data plane
/// (queue pairs, [`Fabric::connect`]) and, as its supertrait, its control
/// plane ([`ControlPlane`]: chunks, roots, regions, statistics).
pub trait Fabric: ControlPlane {
    /// Backend name for reports ("shm", ...). Data structures must not branch on it.
    fn backend(&self) -> &'static str;

    /// Memory nodes, in id order.
    fn nodes(&self) -> Vec<NodeId>;

    /// What the backend offers.
    fn caps(&self) -> Capabilities;

    /// Creates a queue pair from the calling thread to `node` (one queue
    /// pair per thread: the backend's default and dmkit's).
    fn connect(&self, node: NodeId) -> Result<Box<dyn QueuePair>, FabricError>;

    /// Creates a queue pair from the calling thread to `node` under a
    /// sharing policy. Backends with doorbell registers
    /// ([`Capabilities::explicit_doorbells`]) implement all four; the
    /// default offers only [`QpPolicy::PerThreadQp`] (= [`Fabric::connect`])
    /// and refuses the others with [`FabricError::Unsupported`] (shared
    /// queue pairs over such a backend are [`SharedQp`] handles).
    fn connect_as(
        &self,
        node: NodeId,
        policy: QpPolicy,
    ) -> Result<Box<dyn QueuePair>, FabricError> {
        match policy {
            QpPolicy::PerThreadQp => self.connect(node),
            other => Err(FabricError::Unsupported {
                backend: self.backend(),
                what: format!("queue-pair policy {other}"),
            }),
        }
    }

    /// Opens an RPC channel from the calling thread to `node`'s worker
    /// threads ([`rpc`]). Backends whose nodes run RPC workers
    /// ([`Capabilities::rpc_workers`] > 0) implement it; the default
    /// refuses with [`FabricError::Unsupported`]. The channel belongs to
    /// this fabric's session with the node: if the fabric is dropped (or
    /// its process dies) the node reclaims it, and its calls fail with
    /// [`RpcFailure::ConnectionLost`].
    fn connect_rpc(&self, node: NodeId) -> Result<Box<dyn RpcChannel>, FabricError> {
        Err(FabricError::Unsupported {
            backend: self.backend(),
            what: format!("RPC channels (to memory node {node})"),
        })
    }

    /// Asks the backend to serve `[addr, addr+len)` from on-NIC device
    /// memory (Sherman keeps its lock table there: atomics on it skip the
    /// host's PCIe round trip, SwordBox §3.2). Returns whether it does;
    /// backends without device memory (see [`Capabilities::on_nic_memory`])
    /// keep the range in host memory and return `false`.
    fn place_in_device_memory(&self, addr: GlobalAddr, len: u64) -> bool {
        let _ = (addr, len);
        false
    }
}
