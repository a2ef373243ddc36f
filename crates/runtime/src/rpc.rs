//! RPCs from tasks: [`Ctx::call`](crate::Ctx::call) sends a request to a
//! memory node's service over the worker's RPC channel to that node and
//! returns a future of the reply; [`Ctx::call_typed`](crate::Ctx::call_typed)
//! encodes a typed request and decodes the typed reply of a [`Service`]
//! (bincode, fixed-width integers, as the memory node's protocol).
//!
//! A worker owns one channel per memory node, opened when the worker is
//! built if the fabric's nodes run RPC workers
//! ([`dmkit_fabric::Capabilities::rpc_workers`]); a call on a fabric (or a
//! worker built on given queue pairs) without one fails with
//! [`CallError::NoChannel`]. The worker polls its channels in
//! [`Worker::step`](crate::Worker::step) only while calls are outstanding.
//!
//! RPCs are counted apart from verbs: they take no credits of the verbs'
//! throttle (a channel's own capacity bounds what is in flight: calls past
//! it wait in the worker, in order, and count as `rpc_throttled`); the
//! counters have `rpc_calls`, `rpc_bytes_sent`, `rpc_bytes_received`,
//! `rpc_failures`, and [`crate::WorkerStats::rpc`] a latency histogram per
//! service.

use std::collections::{HashMap, VecDeque};
use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};

use bincode::Options;
use dmkit_fabric::{
    Fabric, FabricError, NodeId, RpcChannel, RpcFailure, RpcReply, RpcSendError, ServiceId,
};
use serde::de::DeserializeOwned;
use serde::Serialize;

use crate::clock::Nanos;
use crate::ctx::Ctx;
use crate::stats::{OpStats, WorkerStats};
use crate::worker::State;

pub use dmkit_fabric::rpc::atomics::{AtomicsFault, AtomicsRequest, ATOMICS, ATOMIC_SLOTS};
pub use dmkit_fabric::rpc::ECHO;

/// A service as its callers see it: its id and the types of its request
/// and reply (the node side is a `dmkit_memnode::rpc::Service` that
/// decodes and encodes the same types).
pub trait Service {
    /// The id the node registered the service under.
    const ID: ServiceId;
    /// What a call sends.
    type Request: Serialize;
    /// What a successful call returns.
    type Response: DeserializeOwned;
}

/// The built-in echo service, typed: the reply is the request.
#[derive(Debug, Clone, Copy, Default)]
pub struct Echo;

impl Service for Echo {
    const ID: ServiceId = ECHO;
    type Request = Vec<u8>;
    type Response = Vec<u8>;
}

/// The built-in atomics service, typed: a spinlock and a sequencer served
/// by the node's CPU (the RPC-based baseline of the remote-atomics study).
/// The reply is one `u64` (see [`AtomicsRequest`]); a refusal is
/// [`CallError::Failed`] with [`RpcFailure::Service`] bytes that
/// [`dmkit_fabric::rpc::atomics::decode_fault`] reads as an
/// [`AtomicsFault`].
#[derive(Debug, Clone, Copy, Default)]
pub struct Atomics;

impl Service for Atomics {
    const ID: ServiceId = ATOMICS;
    type Request = AtomicsRequest;
    type Response = u64;
}

/// Why a call returned no reply.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CallError {
    /// The node (or the channel) answered with a failure.
    #[error(transparent)]
    Failed(#[from] RpcFailure),
    /// The worker has no channel to the node.
    #[error("no RPC channel to memory node {node}: {reason}")]
    NoChannel {
        /// The node called.
        node: NodeId,
        /// Why (the backend offers none, or opening it failed).
        reason: String,
    },
    /// A typed request that does not encode.
    #[error("the request does not encode: {0}")]
    Encode(String),
    /// A typed reply that does not decode as the service's response.
    #[error("the reply does not decode: {0}")]
    Decode(String),
}

impl CallError {
    /// The service's own error decoded as `E`, if this is one.
    pub fn service_error<E: DeserializeOwned>(&self) -> Option<E> {
        match self {
            CallError::Failed(RpcFailure::Service(bytes)) => codec().deserialize(bytes).ok(),
            _ => None,
        }
    }
}

fn codec() -> impl Options {
    bincode::DefaultOptions::new()
        .with_fixint_encoding()
        .reject_trailing_bytes()
}

/// Encodes a typed request as [`Ctx::call_typed`] sends it.
pub fn encode<T: Serialize>(value: &T) -> Result<Vec<u8>, CallError> {
    codec()
        .serialize(value)
        .map_err(|e| CallError::Encode(e.to_string()))
}

/// Decodes a reply as [`Ctx::call_typed`] does (at most `limit` bytes of
/// allocation, so a hostile length cannot exhaust memory).
pub fn decode<T: DeserializeOwned>(bytes: &[u8], limit: usize) -> Result<T, CallError> {
    codec()
        .with_limit(limit as u64)
        .deserialize(bytes)
        .map_err(|e| CallError::Decode(e.to_string()))
}

/// A worker's channel to one node.
struct Chan {
    ch: Box<dyn RpcChannel>,
    /// Calls waiting for room in the channel, in order.
    backlog: VecDeque<(u64, ServiceId, Vec<u8>)>,
    /// Calls sent, not yet answered.
    inflight: usize,
}

/// A call the worker has not answered yet.
struct CallRec {
    task: usize,
    service: ServiceId,
    start: Nanos,
}

/// The worker's RPC state.
#[derive(Default)]
pub(crate) struct RpcState {
    /// By memory node id: its channel, or why there is none.
    chans: Vec<Option<Result<Chan, String>>>,
    /// Why a node without an entry has no channel.
    none: String,
    next_id: u64,
    calls: HashMap<u64, CallRec>,
    /// Replies arrived, waiting for their task to poll.
    done: HashMap<u64, Result<Vec<u8>, RpcFailure>>,
    /// Calls sent or waiting in a backlog.
    pub(crate) outstanding: usize,
    replies: Vec<RpcReply>,
}

impl RpcState {
    /// Opens a channel to every node of `fabric` whose nodes run RPC
    /// workers (a failure is kept, and reported by the first call).
    pub(crate) fn connect(fabric: &dyn Fabric) -> Self {
        let mut s = RpcState::default();
        if fabric.caps().rpc_workers == 0 {
            s.none = format!(
                "the {} backend's memory nodes run no RPC workers",
                fabric.backend()
            );
            return s;
        }
        for n in fabric.nodes() {
            let i = n as usize;
            if s.chans.len() <= i {
                s.chans.resize_with(i + 1, || None);
            }
            s.chans[i] = Some(
                fabric
                    .connect_rpc(n)
                    .map(|ch| Chan {
                        ch,
                        backlog: VecDeque::new(),
                        inflight: 0,
                    })
                    .map_err(|e: FabricError| e.to_string()),
            );
        }
        s.none = "not a memory node of this fabric".into();
        s
    }

    /// No channel at all (a worker built on given queue pairs).
    pub(crate) fn without(reason: &str) -> Self {
        RpcState {
            none: reason.into(),
            ..Default::default()
        }
    }

    /// Whether the worker has a channel to `node`.
    pub(crate) fn has_channel(&self, node: NodeId) -> bool {
        matches!(self.chans.get(node as usize), Some(Some(Ok(_))))
    }

    /// Takes the reply of call `id` if it arrived.
    fn take(&mut self, id: u64) -> Option<Result<Vec<u8>, RpcFailure>> {
        self.done.remove(&id)
    }

    /// Forgets call `id` (its future was dropped): a reply that still
    /// comes is discarded.
    fn abandon(&mut self, id: u64) {
        self.calls.remove(&id);
        self.done.remove(&id);
    }
}

impl State {
    /// Starts call of `task`: sends it now, or queues it behind the calls
    /// waiting for room in the channel. Returns its id.
    fn rpc_start(
        &mut self,
        task: usize,
        node: NodeId,
        service: ServiceId,
        request: Vec<u8>,
        now: Nanos,
    ) -> Result<u64, CallError> {
        let r = &mut self.rpc;
        let chan = match r.chans.get_mut(node as usize) {
            Some(Some(Ok(c))) => c,
            Some(Some(Err(reason))) => {
                return Err(CallError::NoChannel {
                    node,
                    reason: reason.clone(),
                })
            }
            _ => {
                return Err(CallError::NoChannel {
                    node,
                    reason: r.none.clone(),
                })
            }
        };
        let id = r.next_id;
        r.next_id += 1;
        let c = &mut self.tasks[task].counters;
        c.rpc_calls += 1;
        c.rpc_bytes_sent += request.len() as u64;
        r.calls.insert(
            id,
            CallRec {
                task,
                service,
                start: now,
            },
        );
        r.outstanding += 1;
        if !chan.backlog.is_empty() {
            chan.backlog.push_back((id, service, request));
            c.rpc_throttled += 1;
            return Ok(id);
        }
        match chan.ch.send(id, service, &request) {
            Ok(()) => chan.inflight += 1,
            Err(RpcSendError::Full) => {
                chan.backlog.push_back((id, service, request));
                c.rpc_throttled += 1;
            }
            Err(RpcSendError::Refused(f)) => {
                r.done.insert(id, Err(f));
                self.rpc_finish(id, false, 0, now);
            }
        }
        Ok(id)
    }

    /// Books the end of call `id` (its reply is in `rpc.done`).
    fn rpc_finish(&mut self, id: u64, ok: bool, bytes: usize, now: Nanos) {
        let Some(rec) = self.rpc.calls.remove(&id) else {
            // Abandoned: nobody will take the reply.
            self.rpc.done.remove(&id);
            self.rpc.outstanding -= 1;
            return;
        };
        self.rpc.outstanding -= 1;
        let c = &mut self.tasks[rec.task].counters;
        c.rpc_bytes_received += bytes as u64;
        if !ok {
            c.rpc_failures += 1;
        }
        let delta = crate::stats::Counters {
            rpc_calls: 1,
            rpc_bytes_received: bytes as u64,
            rpc_failures: u64::from(!ok),
            ..Default::default()
        };
        self.stats
            .rpc
            .entry(rec.service)
            .or_insert_with(OpStats::new)
            .record(now.saturating_sub(rec.start), &delta);
        self.make_ready(rec.task);
    }

    /// Polls the channels with calls outstanding, routes the replies to
    /// their tasks, and sends what waited for room.
    pub(crate) fn poll_rpc(&mut self, now: impl FnOnce() -> Nanos) {
        let mut replies = std::mem::take(&mut self.rpc.replies);
        for c in self.rpc.chans.iter_mut().flatten().flatten() {
            if c.inflight > 0 {
                let n = c.ch.poll(&mut replies);
                c.inflight -= n;
            }
        }
        if !replies.is_empty() {
            let now = now();
            for RpcReply { id, result } in replies.drain(..) {
                let (ok, bytes) = match &result {
                    Ok(b) => (true, b.len()),
                    Err(_) => (false, 0),
                };
                if self.rpc.calls.contains_key(&id) {
                    self.rpc.done.insert(id, result);
                }
                self.rpc_finish(id, ok, bytes, now);
            }
            self.rpc_flush(now);
        }
        self.rpc.replies = replies;
    }

    /// Sends backlogged calls while their channels have room.
    fn rpc_flush(&mut self, now: Nanos) {
        let mut refused = Vec::new();
        for c in self.rpc.chans.iter_mut().flatten().flatten() {
            while let Some((id, service, req)) = c.backlog.front() {
                match c.ch.send(*id, *service, req) {
                    Ok(()) => {
                        c.inflight += 1;
                        c.backlog.pop_front();
                    }
                    Err(RpcSendError::Full) => break,
                    Err(RpcSendError::Refused(f)) => {
                        refused.push((*id, f));
                        c.backlog.pop_front();
                    }
                }
            }
        }
        for (id, f) in refused {
            if self.rpc.calls.contains_key(&id) {
                self.rpc.done.insert(id, Err(f));
            }
            self.rpc_finish(id, false, 0, now);
        }
    }
}

impl Ctx {
    /// Calls `service` on memory node `node` with `request`'s bytes; the
    /// future resolves to the reply's bytes. Other tasks run meanwhile.
    pub fn call(&self, node: NodeId, service: ServiceId, request: impl Into<Vec<u8>>) -> Call<'_> {
        Call {
            ctx: self,
            state: CallState::Start {
                node,
                service,
                request: request.into(),
            },
        }
    }

    /// Calls service `S` on `node` with a typed request; decodes the reply
    /// as `S::Response`.
    pub async fn call_typed<S: Service>(
        &self,
        node: NodeId,
        request: &S::Request,
    ) -> Result<S::Response, CallError> {
        let bytes = encode(request)?;
        let reply = self.call(node, S::ID, bytes).await?;
        decode(&reply, reply.len().max(64))
    }

    /// Whether this worker has an RPC channel to `node`.
    pub fn has_rpc(&self, node: NodeId) -> bool {
        self.core().st.borrow().rpc.has_channel(node)
    }
}

enum CallState {
    Start {
        node: NodeId,
        service: ServiceId,
        request: Vec<u8>,
    },
    Waiting(u64),
    Done,
}

/// Future of [`Ctx::call`].
pub struct Call<'a> {
    ctx: &'a Ctx,
    state: CallState,
}

impl Future for Call<'_> {
    type Output = Result<Vec<u8>, CallError>;

    fn poll(mut self: Pin<&mut Self>, _cx: &mut Context<'_>) -> Poll<Self::Output> {
        let ctx = self.ctx;
        match std::mem::replace(&mut self.state, CallState::Done) {
            CallState::Start {
                node,
                service,
                request,
            } => {
                let now = ctx.now();
                let mut st = ctx.core().st.borrow_mut();
                match st.rpc_start(ctx.task(), node, service, request, now) {
                    Err(e) => Poll::Ready(Err(e)),
                    Ok(id) => match st.rpc.take(id) {
                        // Refused before it was sent (too large, gone).
                        Some(r) => Poll::Ready(r.map_err(CallError::Failed)),
                        None => {
                            self.state = CallState::Waiting(id);
                            Poll::Pending
                        }
                    },
                }
            }
            CallState::Waiting(id) => match ctx.core().st.borrow_mut().rpc.take(id) {
                Some(r) => Poll::Ready(r.map_err(CallError::Failed)),
                None => {
                    self.state = CallState::Waiting(id);
                    Poll::Pending
                }
            },
            CallState::Done => panic!("a call's future polled after it completed"),
        }
    }
}

impl Drop for Call<'_> {
    fn drop(&mut self) {
        if let CallState::Waiting(id) = self.state {
            if let Ok(mut st) = self.ctx.core().st.try_borrow_mut() {
                st.rpc.abandon(id);
            }
        }
    }
}

impl WorkerStats {
    /// RPC latency and counts of service `service`, merged over workers.
    pub fn rpc_service(&self, service: ServiceId) -> Option<&OpStats> {
        self.rpc.get(&service)
    }
}
