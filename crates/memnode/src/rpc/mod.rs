//! Services on the memory node's worker threads: the node side of the
//! fabric's RPC channel (DESIGN.md, "Memory node services").
//!
//! A memory node's CPU stays off the one-sided data path, but some
//! operations need it: CoRM's Alloc/Free/Read/Write/ReleasePtr (CoRM,
//! SIGMOD'21, §2.2.2 and §3.2.1: requests pushed into an RPC queue that the
//! node's worker threads poll), Clover's metadata server, and the RPC
//! baselines of the memory-semantics study. A [`Service`] is registered on
//! the node under a [`ServiceId`]; the node runs `workers` worker threads
//! ([`crate::NodeConfig::rpc_workers`]) that poll the clients' channels and
//! call the service's [`Service::handle`] with the request's bytes and a
//! reply buffer. [`Echo`] ([`ECHO`] = 0) is built in: the RPC baseline.
//!
//! What a service gets ([`WorkerCtx`]):
//! - **per-worker state**: [`Service::start_worker`] makes one
//!   [`Service::Worker`] per worker thread, on that worker, the first time
//!   the worker needs it; `cx.state()` is the calling worker's (CoRM's
//!   thread-local allocators). A worker never touches another's state.
//! - **messages between workers**: `cx.send(to, msg)` queues a
//!   [`Service::Message`] for worker `to`, which runs
//!   [`Service::message`] with it on its own thread (CoRM's compaction
//!   leader collecting blocks; pointer correction by the owner thread).
//!   Messages between two workers arrive in the order they were sent.
//! - **deferred replies**: `cx.defer()` in `handle` answers the call later,
//!   from any worker, with `cx.complete(token, result)` (the owner thread
//!   finds a moved object and answers for the worker that took the call).
//!   Replies of one channel still leave in request order.
//! - `cx.node()`, `cx.session()`, `cx.worker()`, `cx.workers()`, and
//!   `cx.charge_ns(ns)`: extra CPU time the simulator should account to
//!   the call (real backends ignore it).
//!
//! Transports (the shm rings of [`ring`], the verbs backend's queue pairs,
//! the simulator's modelled cores) drive the same [`RpcWorker`]: it holds a
//! worker's service states, runs calls and messages, and leaves what must
//! travel (messages, completions) in its outbox for the transport to route.
//!
//! Failures are typed ([`RpcFailure`]): an unknown service, a payload too
//! large, the service's own error as bytes ([`ServiceError`]), a node
//! shutting down, a lost connection, a malformed request, a service that
//! panicked, and on the client's side no reply within its reply timeout.
//! Nothing a client sends makes a worker panic; a service that
//! panics fails that call and the worker goes on.

pub mod atomics;
pub(crate) mod pool;
pub mod ring;

pub use pool::{Incoming, NodeChannel, RpcChannelGrant, MAX_NAP, NAP, SPIN};

use std::any::Any;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use serde::{Deserialize, Serialize};

use crate::node::{MemNode, SessionId};

/// Names a service a memory node hosts.
pub type ServiceId = u16;

/// The built-in echo service: replies with the request's bytes.
pub const ECHO: ServiceId = 0;

/// Index of a worker thread of a node (`0..workers`).
pub type WorkerId = usize;

/// Why an RPC did not return a reply. Carried on the wire as a status code
/// and payload ([`RpcFailure::encode`]); the channel stays usable after any
/// of them but [`RpcFailure::ShuttingDown`] and
/// [`RpcFailure::ConnectionLost`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, thiserror::Error)]
#[non_exhaustive]
pub enum RpcFailure {
    /// The node hosts no service under this id.
    #[error("the memory node hosts no service {0}")]
    NoSuchService(ServiceId),
    /// A request or reply larger than the channel's `max_message`.
    #[error("message of {len} B exceeds the channel's limit of {max} B")]
    TooLarge {
        /// Bytes of the message.
        len: usize,
        /// The channel's limit.
        max: usize,
    },
    /// The service refused the request; its own error, as bytes.
    #[error("the service failed ({} B of error)", .0.len())]
    Service(Vec<u8>),
    /// The node is shutting down (or closed the channel).
    #[error("the memory node is shutting down")]
    ShuttingDown,
    /// The connection to the node is gone.
    #[error("connection to the memory node lost")]
    ConnectionLost,
    /// The request could not be read (a broken or hostile writer).
    #[error("malformed request: {0}")]
    Malformed(String),
    /// The service panicked handling the request (a bug in the service).
    #[error("the service panicked: {0}")]
    Panicked(String),
    /// No reply came within the channel's reply timeout: the client's own
    /// clock, for a transport that could otherwise wait for ever (Soft-RoCE
    /// retransmits to a dead node without end; a killed shm node process
    /// never marks its rings closed). The node may be gone, or
    /// a service slower than the timeout; the channel is closed and every
    /// request pending on it fails so.
    #[error("no reply from the memory node within {waited_ms} ms")]
    NoReply {
        /// How long the channel waited with requests unanswered.
        waited_ms: u64,
    },
}

/// Wire status codes of [`RpcFailure`] (0 = success).
pub mod status {
    /// A reply.
    pub const OK: u16 = 0;
    /// [`super::RpcFailure::NoSuchService`] (the service id travels in the slot).
    pub const NO_SUCH_SERVICE: u16 = 1;
    /// [`super::RpcFailure::TooLarge`] (payload: len, max as little-endian u64).
    pub const TOO_LARGE: u16 = 2;
    /// [`super::RpcFailure::Service`] (payload: the error bytes).
    pub const SERVICE: u16 = 3;
    /// [`super::RpcFailure::ShuttingDown`].
    pub const SHUTTING_DOWN: u16 = 4;
    /// [`super::RpcFailure::Malformed`] (payload: the reason, UTF-8).
    pub const MALFORMED: u16 = 5;
    /// [`super::RpcFailure::Panicked`] (payload: the message, UTF-8).
    pub const PANICKED: u16 = 6;
    /// [`super::RpcFailure::ConnectionLost`].
    pub const CONNECTION_LOST: u16 = 7;
    /// [`super::RpcFailure::NoReply`] (payload: the wait in ms, a
    /// little-endian u64). A client's own verdict; no node sends it.
    pub const NO_REPLY: u16 = 8;
}

impl RpcFailure {
    /// The status code and payload that carry this failure in a reply slot
    /// of `max` payload bytes (texts are cut to fit; service errors that do
    /// not fit become [`RpcFailure::TooLarge`]).
    pub fn encode(&self, max: usize) -> (u16, Vec<u8>) {
        let text = |s: &str| {
            let mut n = s.len().min(max);
            while !s.is_char_boundary(n) {
                n -= 1;
            }
            s.as_bytes()[..n].to_vec()
        };
        match self {
            RpcFailure::NoSuchService(_) => (status::NO_SUCH_SERVICE, Vec::new()),
            RpcFailure::TooLarge { len, max: m } => {
                let mut b = (*len as u64).to_le_bytes().to_vec();
                b.extend_from_slice(&(*m as u64).to_le_bytes());
                b.truncate(max);
                (status::TOO_LARGE, b)
            }
            RpcFailure::Service(e) if e.len() <= max => (status::SERVICE, e.clone()),
            RpcFailure::Service(e) => RpcFailure::TooLarge { len: e.len(), max }.encode(max),
            RpcFailure::ShuttingDown => (status::SHUTTING_DOWN, Vec::new()),
            RpcFailure::ConnectionLost => (status::CONNECTION_LOST, Vec::new()),
            RpcFailure::Malformed(s) => (status::MALFORMED, text(s)),
            RpcFailure::Panicked(s) => (status::PANICKED, text(s)),
            RpcFailure::NoReply { waited_ms } => {
                let mut b = waited_ms.to_le_bytes().to_vec();
                b.truncate(max);
                (status::NO_REPLY, b)
            }
        }
    }

    /// The outcome a reply slot carries: `Ok(())` for [`status::OK`] (the
    /// payload is the reply), else the failure. An unknown code is
    /// [`RpcFailure::Malformed`].
    pub fn decode(code: u16, service: ServiceId, payload: &[u8]) -> Result<(), RpcFailure> {
        let text = || String::from_utf8_lossy(payload).into_owned();
        let word = |i: usize| {
            payload
                .get(8 * i..8 * i + 8)
                .map_or(0, |b| u64::from_le_bytes(b.try_into().expect("8 bytes")))
        };
        Err(match code {
            status::OK => return Ok(()),
            status::NO_SUCH_SERVICE => RpcFailure::NoSuchService(service),
            status::TOO_LARGE => RpcFailure::TooLarge {
                len: word(0) as usize,
                max: word(1) as usize,
            },
            status::SERVICE => RpcFailure::Service(payload.to_vec()),
            status::SHUTTING_DOWN => RpcFailure::ShuttingDown,
            status::CONNECTION_LOST => RpcFailure::ConnectionLost,
            status::MALFORMED => RpcFailure::Malformed(text()),
            status::PANICKED => RpcFailure::Panicked(text()),
            status::NO_REPLY => RpcFailure::NoReply { waited_ms: word(0) },
            other => RpcFailure::Malformed(format!("unknown reply status {other}")),
        })
    }
}

/// A service's own error: bytes the client receives as
/// [`RpcFailure::Service`] (a service defines their encoding; bincode of an
/// error enum is the usual one, see [`ServiceError::encode`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ServiceError(pub Vec<u8>);

impl ServiceError {
    /// An error of these bytes.
    pub fn new(bytes: impl Into<Vec<u8>>) -> Self {
        Self(bytes.into())
    }

    /// An error carrying `value` encoded with bincode (as the node's control
    /// protocol encodes: fixed-width integers).
    pub fn encode<T: Serialize>(value: &T) -> Self {
        use bincode::Options;
        Self(
            bincode::DefaultOptions::new()
                .with_fixint_encoding()
                .serialize(value)
                .unwrap_or_default(),
        )
    }
}

/// The token of a deferred call ([`WorkerCtx::defer`]): whoever holds it
/// answers the call with [`WorkerCtx::complete`], from any worker.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Deferred {
    worker: WorkerId,
    call: CallKey,
}

impl Deferred {
    /// The worker that took the call (where the reply must go).
    pub fn worker(&self) -> WorkerId {
        self.worker
    }

    /// The transport's key of the call.
    pub fn call(&self) -> CallKey {
        self.call
    }
}

/// How a transport names a call on one worker: its channel and its
/// position in that channel.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct CallKey {
    /// The transport's id of the channel.
    pub channel: u64,
    /// The call's position in the channel.
    pub seq: u64,
}

/// What a worker's service code asks the transport to carry.
pub enum Outgoing {
    /// A message of `service` for worker `to`, from worker `from`.
    Message {
        /// Destination worker.
        to: WorkerId,
        /// The service whose [`Service::message`] runs there.
        service: ServiceId,
        /// The sending worker.
        from: WorkerId,
        /// The message (the service's [`Service::Message`], boxed).
        msg: Box<dyn Any + Send>,
    },
    /// The answer of a deferred call, for the worker that took it.
    Complete {
        /// The call.
        token: Deferred,
        /// Its reply, or why it failed.
        result: Result<Vec<u8>, RpcFailure>,
    },
}

impl std::fmt::Debug for Outgoing {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Outgoing::Message {
                to, service, from, ..
            } => f
                .debug_struct("Message")
                .field("to", to)
                .field("service", service)
                .field("from", from)
                .finish_non_exhaustive(),
            Outgoing::Complete { token, result } => f
                .debug_struct("Complete")
                .field("token", token)
                .field("ok", &result.is_ok())
                .finish(),
        }
    }
}

/// A service the memory node's workers run.
///
/// Implementations must not keep an `Arc<MemNode>` of the node they are
/// registered on (the node owns its services: that would be a cycle); the
/// node is [`WorkerCtx::node`].
pub trait Service: Send + Sync + 'static {
    /// What each worker thread keeps for this service (made by
    /// [`Service::start_worker`]).
    type Worker: Send + 'static;
    /// What workers send each other for this service ([`WorkerCtx::send`]).
    type Message: Send + 'static;

    /// A name for reports.
    fn name(&self) -> &'static str;

    /// The state worker `worker` (of `workers`) keeps, made on that worker
    /// before it first runs this service.
    fn start_worker(&self, worker: WorkerId, workers: usize) -> Self::Worker;

    /// Serves one request: `reply` is empty on entry; on `Ok` its bytes are
    /// the reply, on `Err` the error's. A reply longer than the channel's
    /// `max_message` fails as [`RpcFailure::TooLarge`]. After
    /// [`WorkerCtx::defer`] the return value is ignored.
    fn handle(
        &self,
        cx: &mut WorkerCtx<'_, Self>,
        request: &[u8],
        reply: &mut Vec<u8>,
    ) -> Result<(), ServiceError>;

    /// A message another worker (or this one) sent with
    /// [`WorkerCtx::send`]. Default: dropped.
    fn message(&self, cx: &mut WorkerCtx<'_, Self>, from: WorkerId, msg: Self::Message) {
        let _ = (cx, from, msg);
    }

    /// Session `session` ended (its client disconnected or died): called on
    /// every worker that has state for this service. Default: nothing.
    fn session_closed(&self, cx: &mut WorkerCtx<'_, Self>, session: SessionId) {
        let _ = (cx, session);
    }

    /// Background work of this worker's state (CoRM's worker stepping its
    /// peers' messages, its parked operations and a compaction it leads):
    /// called on every round of a worker that has state for the service,
    /// between requests; it may [`WorkerCtx::complete`] deferred calls.
    /// Returns whether anything happened. Default: nothing.
    ///
    /// The node's worker threads (shm, verbs) poll on every round; the
    /// simulator's modelled cores poll a worker after a job that changed
    /// something while the worker is [`busy`](Service::busy) (and every
    /// worker while one wants its peers woken), each poll a job of the
    /// core costing what the service charges.
    fn poll(&self, cx: &mut WorkerCtx<'_, Self>) -> bool {
        let _ = cx;
        false
    }

    /// Whether `state` has work in progress that only [`Service::poll`]
    /// advances: while it says so, its worker does not block. Default:
    /// never.
    fn busy(&self, state: &Self::Worker) -> bool {
        let _ = state;
        false
    }

    /// Whether work for *other* workers is pending in the service's own
    /// channels (CoRM's messages between its workers): the worker wakes
    /// sleeping peers (a system call only where one sleeps). Must turn
    /// false once the peers took the work, or they are woken in a loop.
    /// Default: never.
    fn wake_peers(&self, state: &Self::Worker) -> bool {
        let _ = state;
        false
    }
}

/// What the transport knows of the running call or message.
struct Env<'a> {
    node: &'a MemNode,
    worker: WorkerId,
    workers: usize,
    service: ServiceId,
    session: SessionId,
    /// The call being handled (none for messages and session ends).
    call: Option<CallKey>,
    deferred: bool,
    outbox: &'a mut Vec<Outgoing>,
    charged: &'a mut f64,
}

/// A service's view of its worker while it handles a call or a message.
pub struct WorkerCtx<'a, S: Service + ?Sized> {
    env: Env<'a>,
    state: &'a mut S::Worker,
}

impl<S: Service + ?Sized> WorkerCtx<'_, S> {
    /// This worker's index.
    pub fn worker(&self) -> WorkerId {
        self.env.worker
    }

    /// How many workers the node runs.
    pub fn workers(&self) -> usize {
        self.env.workers
    }

    /// The node.
    pub fn node(&self) -> &MemNode {
        self.env.node
    }

    /// The session of the client that sent the request (0 in messages).
    pub fn session(&self) -> SessionId {
        self.env.session
    }

    /// This worker's state of the service.
    pub fn state(&mut self) -> &mut S::Worker {
        self.state
    }

    /// Queues `msg` for worker `to` (which may be this one); it runs
    /// [`Service::message`] there after the current call returns. Messages
    /// from one worker to another arrive in order.
    ///
    /// # Panics
    /// If `to` is not a worker of the node (programmer error).
    pub fn send(&mut self, to: WorkerId, msg: S::Message) {
        assert!(to < self.env.workers, "worker {to} of {}", self.env.workers);
        self.env.outbox.push(Outgoing::Message {
            to,
            service: self.env.service,
            from: self.env.worker,
            msg: Box::new(msg),
        });
    }

    /// Answers the current call later: the returned token goes to whoever
    /// will [`WorkerCtx::complete`] it (any worker, through a message).
    ///
    /// # Panics
    /// Outside [`Service::handle`], or twice in one call (programmer error).
    pub fn defer(&mut self) -> Deferred {
        let call = self
            .env
            .call
            .expect("defer() is for Service::handle, inside a call");
        assert!(!self.env.deferred, "a call is deferred once");
        self.env.deferred = true;
        Deferred {
            worker: self.env.worker,
            call,
        }
    }

    /// Answers a deferred call: `Ok(reply)` or the service's error.
    pub fn complete(&mut self, token: Deferred, result: Result<Vec<u8>, ServiceError>) {
        self.env.outbox.push(Outgoing::Complete {
            token,
            result: result.map_err(|e| RpcFailure::Service(e.0)),
        });
    }

    /// Adds `ns` of modelled CPU time to the current call or message (the
    /// simulator charges it to the worker's core on top of the profile's
    /// per-request cost; real transports ignore it). E.g. CoRM's Alloc and
    /// Free add about 0.5 µs to an RPC (CoRM §4.1).
    pub fn charge_ns(&mut self, ns: f64) {
        if ns.is_finite() && ns > 0.0 {
            *self.env.charged += ns;
        }
    }
}

/// The object-safe face of a [`Service`] (the node stores these).
trait Erased: Send + Sync {
    fn name(&self) -> &'static str;
    fn start(&self, worker: WorkerId, workers: usize) -> Box<dyn Any + Send>;
    fn handle(
        &self,
        env: Env<'_>,
        state: &mut (dyn Any + Send),
        request: &[u8],
        reply: &mut Vec<u8>,
    ) -> (Result<(), ServiceError>, bool);
    fn message(
        &self,
        env: Env<'_>,
        state: &mut (dyn Any + Send),
        from: WorkerId,
        msg: Box<dyn Any + Send>,
    );
    fn session_closed(&self, env: Env<'_>, state: &mut (dyn Any + Send), session: SessionId);
    fn poll(&self, env: Env<'_>, state: &mut (dyn Any + Send)) -> bool;
    fn busy(&self, state: &(dyn Any + Send)) -> bool;
    fn wake_peers(&self, state: &(dyn Any + Send)) -> bool;
}

impl<S: Service> Erased for S {
    fn name(&self) -> &'static str {
        Service::name(self)
    }

    fn start(&self, worker: WorkerId, workers: usize) -> Box<dyn Any + Send> {
        Box::new(self.start_worker(worker, workers))
    }

    fn handle(
        &self,
        env: Env<'_>,
        state: &mut (dyn Any + Send),
        request: &[u8],
        reply: &mut Vec<u8>,
    ) -> (Result<(), ServiceError>, bool) {
        let state = state
            .downcast_mut::<S::Worker>()
            .expect("a service's worker state is the one it made");
        let mut cx = WorkerCtx::<S> { env, state };
        let r = Service::handle(self, &mut cx, request, reply);
        (r, cx.env.deferred)
    }

    fn message(
        &self,
        env: Env<'_>,
        state: &mut (dyn Any + Send),
        from: WorkerId,
        msg: Box<dyn Any + Send>,
    ) {
        let state = state
            .downcast_mut::<S::Worker>()
            .expect("a service's worker state is the one it made");
        // Only this service's context queues messages under its id.
        if let Ok(msg) = msg.downcast::<S::Message>() {
            Service::message(self, &mut WorkerCtx::<S> { env, state }, from, *msg);
        }
    }

    fn session_closed(&self, env: Env<'_>, state: &mut (dyn Any + Send), session: SessionId) {
        let state = state
            .downcast_mut::<S::Worker>()
            .expect("a service's worker state is the one it made");
        Service::session_closed(self, &mut WorkerCtx::<S> { env, state }, session);
    }

    fn poll(&self, env: Env<'_>, state: &mut (dyn Any + Send)) -> bool {
        let state = state
            .downcast_mut::<S::Worker>()
            .expect("a service's worker state is the one it made");
        Service::poll(self, &mut WorkerCtx::<S> { env, state })
    }

    fn busy(&self, state: &(dyn Any + Send)) -> bool {
        state
            .downcast_ref::<S::Worker>()
            .is_some_and(|s| Service::busy(self, s))
    }

    fn wake_peers(&self, state: &(dyn Any + Send)) -> bool {
        state
            .downcast_ref::<S::Worker>()
            .is_some_and(|s| Service::wake_peers(self, s))
    }
}

/// The services of a node, by id.
#[derive(Default, Clone)]
pub(crate) struct ServiceTable {
    by_id: Vec<Option<Arc<dyn Erased>>>,
}

impl ServiceTable {
    fn get(&self, id: ServiceId) -> Option<&Arc<dyn Erased>> {
        self.by_id.get(id as usize)?.as_ref()
    }

    pub(crate) fn insert<S: Service>(&mut self, id: ServiceId, s: S) -> bool {
        let i = id as usize;
        if self.by_id.len() <= i {
            self.by_id.resize_with(i + 1, || None);
        }
        if self.by_id[i].is_some() {
            return false;
        }
        self.by_id[i] = Some(Arc::new(s));
        true
    }

    pub(crate) fn names(&self) -> Vec<(ServiceId, &'static str)> {
        self.by_id
            .iter()
            .enumerate()
            .filter_map(|(i, s)| Some((i as ServiceId, s.as_ref()?.name())))
            .collect()
    }
}

/// Counters of one worker (summed into [`crate::NodeStats`]).
#[derive(Debug, Default)]
pub(crate) struct WorkerCounters {
    pub requests: AtomicU64,
    pub failures: AtomicU64,
    pub malformed: AtomicU64,
    pub messages: AtomicU64,
}

/// How a call ended on its worker.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CallOutcome {
    /// Answered now: `Ok` with the reply in the caller's buffer, or failed.
    Replied(Result<(), RpcFailure>),
    /// The service deferred it: the answer comes as an
    /// [`Outgoing::Complete`] later.
    Deferred,
}

/// One worker's share of the node's services, for a transport to drive:
/// the services' per-worker states, and the outbox of what they send.
pub struct RpcWorker {
    id: WorkerId,
    workers: usize,
    table: Arc<ServiceTable>,
    generation: u64,
    states: Vec<Option<State>>,
    outbox: Vec<Outgoing>,
    charged: f64,
    counters: Arc<WorkerCounters>,
}

impl std::fmt::Debug for RpcWorker {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RpcWorker")
            .field("id", &self.id)
            .field("workers", &self.workers)
            .finish_non_exhaustive()
    }
}

impl RpcWorker {
    /// Worker `id` of `workers` serving `node`'s services.
    ///
    /// # Panics
    /// If `id ≥ workers` (programmer error).
    pub fn new(node: &MemNode, id: WorkerId, workers: usize) -> Self {
        assert!(id < workers, "worker {id} of {workers}");
        let (table, generation) = node.rpc_host().table();
        Self {
            id,
            workers,
            table,
            generation,
            states: Vec::new(),
            outbox: Vec::new(),
            charged: 0.0,
            counters: node.rpc_host().add_counters(),
        }
    }

    /// This worker's index.
    pub fn id(&self) -> WorkerId {
        self.id
    }

    /// Picks up services registered since the last call.
    fn refresh(&mut self, node: &MemNode) {
        let host = node.rpc_host();
        if host.generation() != self.generation {
            (self.table, self.generation) = host.table();
        }
    }

    /// Runs one call of `session` to `service` with `request`; the reply's
    /// bytes land in `reply` (cleared first). `key` names the call for a
    /// deferred answer. Never panics on what the request holds.
    #[allow(clippy::too_many_arguments)]
    pub fn call(
        &mut self,
        node: &MemNode,
        session: SessionId,
        key: CallKey,
        service: ServiceId,
        request: &[u8],
        reply: &mut Vec<u8>,
    ) -> CallOutcome {
        self.refresh(node);
        self.counters.requests.fetch_add(1, Ordering::Relaxed);
        reply.clear();
        let (worker, workers) = (self.id, self.workers);
        let Some((svc, state)) =
            service_state(&self.table, &mut self.states, service, worker, workers)
        else {
            self.counters.failures.fetch_add(1, Ordering::Relaxed);
            return CallOutcome::Replied(Err(RpcFailure::NoSuchService(service)));
        };
        let env = Env {
            node,
            worker,
            workers,
            service,
            session,
            call: Some(key),
            deferred: false,
            outbox: &mut self.outbox,
            charged: &mut self.charged,
        };
        let ran = catch_unwind(AssertUnwindSafe(|| {
            svc.handle(env, state.as_mut(), request, reply)
        }));
        let outcome = match ran {
            Ok((_, true)) => return CallOutcome::Deferred,
            Ok((Ok(()), false)) => Ok(()),
            Ok((Err(e), false)) => Err(RpcFailure::Service(e.0)),
            Err(p) => Err(RpcFailure::Panicked(panic_text(&*p))),
        };
        if outcome.is_err() {
            self.counters.failures.fetch_add(1, Ordering::Relaxed);
        }
        CallOutcome::Replied(outcome)
    }

    /// Runs a message of `service` from worker `from` (an
    /// [`Outgoing::Message`] the transport delivered here).
    pub fn message(
        &mut self,
        node: &MemNode,
        service: ServiceId,
        from: WorkerId,
        msg: Box<dyn Any + Send>,
    ) {
        self.refresh(node);
        self.counters.messages.fetch_add(1, Ordering::Relaxed);
        let (worker, workers) = (self.id, self.workers);
        let Some((svc, state)) =
            service_state(&self.table, &mut self.states, service, worker, workers)
        else {
            return;
        };
        let env = Env {
            node,
            worker,
            workers,
            service,
            session: 0,
            call: None,
            deferred: false,
            outbox: &mut self.outbox,
            charged: &mut self.charged,
        };
        // A panicking message handler loses that message, not the worker.
        let _ = catch_unwind(AssertUnwindSafe(|| {
            svc.message(env, state.as_mut(), from, msg)
        }));
    }

    /// Tells every service this worker has state for that `session` ended.
    pub fn session_closed(&mut self, node: &MemNode, session: SessionId) {
        self.refresh(node);
        let (worker, workers) = (self.id, self.workers);
        for i in 0..self.states.len() {
            let (Some(state), Some(svc)) =
                (self.states[i].as_mut(), self.table.get(i as ServiceId))
            else {
                continue;
            };
            let env = Env {
                node,
                worker,
                workers,
                service: i as ServiceId,
                session,
                call: None,
                deferred: false,
                outbox: &mut self.outbox,
                charged: &mut self.charged,
            };
            let _ = catch_unwind(AssertUnwindSafe(|| {
                svc.session_closed(env, state.as_mut(), session)
            }));
        }
    }

    /// Runs every service's [`Service::poll`] on this worker (making the
    /// worker's state of a service that has none yet: background work, such
    /// as a peer's messages, may reach a worker before any call does);
    /// returns whether any did something. Never panics on a service's panic
    /// (that poll is lost, the worker goes on).
    pub fn poll(&mut self, node: &MemNode) -> bool {
        self.refresh(node);
        let (worker, workers) = (self.id, self.workers);
        let mut any = false;
        for i in 0..self.table.by_id.len() {
            let Some((svc, state)) = service_state(
                &self.table,
                &mut self.states,
                i as ServiceId,
                worker,
                workers,
            ) else {
                continue;
            };
            let env = Env {
                node,
                worker,
                workers,
                service: i as ServiceId,
                session: 0,
                call: None,
                deferred: false,
                outbox: &mut self.outbox,
                charged: &mut self.charged,
            };
            any |=
                catch_unwind(AssertUnwindSafe(|| svc.poll(env, state.as_mut()))).unwrap_or(false);
        }
        any
    }

    /// Whether a service's state on this worker has work in progress
    /// ([`Service::busy`]): the worker must not block.
    pub fn busy(&self) -> bool {
        self.any_state(|svc, st| svc.busy(st))
    }

    /// Whether a service has work pending for other workers
    /// ([`Service::wake_peers`]): the transport wakes sleeping ones.
    pub fn wake_peers(&self) -> bool {
        self.any_state(|svc, st| svc.wake_peers(st))
    }

    fn any_state(&self, f: impl Fn(&dyn Erased, &(dyn Any + Send)) -> bool) -> bool {
        self.states.iter().enumerate().any(|(i, st)| {
            st.as_ref()
                .zip(self.table.get(i as ServiceId))
                .is_some_and(|(st, svc)| f(svc.as_ref(), st.as_ref()))
        })
    }

    /// Whether the services left something for the transport to carry.
    pub fn has_outgoing(&self) -> bool {
        !self.outbox.is_empty()
    }

    /// Takes what the services sent (messages, completions), in order.
    pub fn take_outgoing(&mut self) -> Vec<Outgoing> {
        std::mem::take(&mut self.outbox)
    }

    /// Takes the modelled CPU time charged since the last take
    /// ([`WorkerCtx::charge_ns`]).
    pub fn take_charged(&mut self) -> f64 {
        std::mem::take(&mut self.charged)
    }

    /// Counts a request that could not be read (a malformed slot).
    pub fn note_malformed(&self) {
        self.counters.malformed.fetch_add(1, Ordering::Relaxed);
        self.counters.failures.fetch_add(1, Ordering::Relaxed);
    }

    /// Counts a deferred call that failed when it was completed.
    pub fn note_failure(&self) {
        self.counters.failures.fetch_add(1, Ordering::Relaxed);
    }
}

/// A service's state on one worker, type-erased.
type State = Box<dyn Any + Send>;

/// Service `id` of `table` and worker `worker`'s state of it in `states`
/// (made on first use).
fn service_state<'a>(
    table: &ServiceTable,
    states: &'a mut Vec<Option<State>>,
    id: ServiceId,
    worker: WorkerId,
    workers: usize,
) -> Option<(Arc<dyn Erased>, &'a mut State)> {
    let svc = table.get(id)?.clone();
    let i = id as usize;
    if states.len() <= i {
        states.resize_with(i + 1, || None);
    }
    let state = states[i].get_or_insert_with(|| svc.start(worker, workers));
    Some((svc, state))
}

fn panic_text(p: &(dyn Any + Send)) -> String {
    p.downcast_ref::<&str>()
        .map(|s| s.to_string())
        .or_else(|| p.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "non-text panic".into())
}

/// The built-in echo service ([`ECHO`]): the reply is the request. The RPC
/// baseline every benchmark can use (a round trip through the node's CPU
/// with no work in it).
#[derive(Debug, Default, Clone, Copy)]
pub struct Echo;

impl Service for Echo {
    type Worker = ();
    type Message = ();

    fn name(&self) -> &'static str {
        "echo"
    }

    fn start_worker(&self, _worker: WorkerId, _workers: usize) {}

    fn handle(
        &self,
        _cx: &mut WorkerCtx<'_, Self>,
        request: &[u8],
        reply: &mut Vec<u8>,
    ) -> Result<(), ServiceError> {
        reply.extend_from_slice(request);
        Ok(())
    }
}

/// The node's side of RPC: its services, its worker counters, and (shm)
/// its worker threads.
pub(crate) struct RpcHost {
    workers: usize,
    table: std::sync::Mutex<(Arc<ServiceTable>, u64)>,
    generation: AtomicU64,
    counters: std::sync::Mutex<Vec<Arc<WorkerCounters>>>,
    pub(crate) pool: pool::PoolSlot,
}

impl std::fmt::Debug for RpcHost {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RpcHost")
            .field("workers", &self.workers)
            .finish_non_exhaustive()
    }
}

impl RpcHost {
    pub(crate) fn new(workers: usize) -> Self {
        let mut table = ServiceTable::default();
        table.insert(ECHO, Echo);
        table.insert(atomics::ATOMICS, atomics::AtomicsService::default());
        Self {
            workers,
            table: std::sync::Mutex::new((Arc::new(table), 1)),
            generation: AtomicU64::new(1),
            counters: std::sync::Mutex::new(Vec::new()),
            pool: pool::PoolSlot::default(),
        }
    }

    pub(crate) fn workers(&self) -> usize {
        self.workers
    }

    fn generation(&self) -> u64 {
        self.generation.load(Ordering::Acquire)
    }

    fn table(&self) -> (Arc<ServiceTable>, u64) {
        let t = self.table.lock().unwrap_or_else(|p| p.into_inner());
        (t.0.clone(), t.1)
    }

    pub(crate) fn register<S: Service>(&self, id: ServiceId, s: S) -> bool {
        let mut t = self.table.lock().unwrap_or_else(|p| p.into_inner());
        let mut next = (*t.0).clone();
        if !next.insert(id, s) {
            return false;
        }
        t.0 = Arc::new(next);
        t.1 += 1;
        self.generation.store(t.1, Ordering::Release);
        true
    }

    pub(crate) fn services(&self) -> Vec<(ServiceId, &'static str)> {
        self.table().0.names()
    }

    fn add_counters(&self) -> Arc<WorkerCounters> {
        let c = Arc::new(WorkerCounters::default());
        self.counters
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push(c.clone());
        c
    }

    /// (requests, failures, malformed, messages) over every worker.
    pub(crate) fn totals(&self) -> [u64; 4] {
        let mut t = [0; 4];
        for c in self
            .counters
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .iter()
        {
            t[0] += c.requests.load(Ordering::Relaxed);
            t[1] += c.failures.load(Ordering::Relaxed);
            t[2] += c.malformed.load(Ordering::Relaxed);
            t[3] += c.messages.load(Ordering::Relaxed);
        }
        t
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::NodeConfig;

    /// Counts per worker; `[n]` asks worker n to count too and defers
    /// until it did; `[0xff]` panics; `[0xee]` fails.
    struct Probe;

    impl Service for Probe {
        type Worker = u64;
        type Message = (Deferred, bool);

        fn name(&self) -> &'static str {
            "probe"
        }

        fn start_worker(&self, worker: WorkerId, _workers: usize) -> u64 {
            worker as u64 * 1000
        }

        fn handle(
            &self,
            cx: &mut WorkerCtx<'_, Self>,
            request: &[u8],
            reply: &mut Vec<u8>,
        ) -> Result<(), ServiceError> {
            *cx.state() += 1;
            match request {
                [0xff] => panic!("probe asked to panic"),
                [0xee] => Err(ServiceError::new(*b"no")),
                [w] => {
                    let t = cx.defer();
                    cx.send(*w as usize, (t, false));
                    Ok(())
                }
                _ => {
                    reply.extend_from_slice(&cx.state().to_le_bytes());
                    Ok(())
                }
            }
        }

        fn message(&self, cx: &mut WorkerCtx<'_, Self>, from: WorkerId, msg: Self::Message) {
            let (token, answered) = msg;
            if answered {
                cx.complete(token, Ok(vec![from as u8]));
            } else {
                *cx.state() += 100;
                cx.send(from, (token, true));
            }
        }
    }

    fn node() -> Arc<MemNode> {
        MemNode::new(NodeConfig {
            size: 1 << 20,
            ..Default::default()
        })
        .unwrap()
    }

    /// Drives two workers by hand, as a transport does.
    #[test]
    fn state_messages_deferral_and_failures() {
        let n = node();
        assert!(n.register_service(9, Probe));
        assert!(!n.register_service(9, Probe), "an id is taken once");
        let mut w = [RpcWorker::new(&n, 0, 2), RpcWorker::new(&n, 1, 2)];
        let key = |seq| CallKey { channel: 1, seq };
        let mut reply = Vec::new();
        assert_eq!(
            w[0].call(&n, 5, key(0), 9, b"", &mut reply),
            CallOutcome::Replied(Ok(()))
        );
        assert_eq!(reply, 1u64.to_le_bytes());
        // Worker 1's state is its own.
        w[1].call(&n, 5, key(1), 9, b"", &mut reply);
        assert_eq!(reply, 1001u64.to_le_bytes());
        // A call deferred to the other worker and back.
        assert_eq!(
            w[0].call(&n, 5, key(2), 9, &[1], &mut reply),
            CallOutcome::Deferred
        );
        let Outgoing::Message {
            to, service, msg, ..
        } = w[0].take_outgoing().pop().unwrap()
        else {
            panic!()
        };
        assert_eq!((to, service), (1, 9));
        w[1].message(&n, 9, 0, msg);
        let Outgoing::Message { to, msg, .. } = w[1].take_outgoing().pop().unwrap() else {
            panic!()
        };
        assert_eq!(to, 0);
        w[0].message(&n, 9, 1, msg);
        match w[0].take_outgoing().pop().unwrap() {
            Outgoing::Complete { token, result } => {
                assert_eq!((token.worker(), token.call()), (0, key(2)));
                assert_eq!(result, Ok(vec![1]));
            }
            other => panic!("{other:?}"),
        }
        // Failures: the service's error, a panic, an unknown service.
        assert_eq!(
            w[0].call(&n, 5, key(3), 9, &[0xee], &mut reply),
            CallOutcome::Replied(Err(RpcFailure::Service(b"no".to_vec())))
        );
        assert!(matches!(
            w[0].call(&n, 5, key(4), 9, &[0xff], &mut reply),
            CallOutcome::Replied(Err(RpcFailure::Panicked(m))) if m.contains("asked to panic")
        ));
        assert_eq!(
            w[0].call(&n, 5, key(5), 77, b"", &mut reply),
            CallOutcome::Replied(Err(RpcFailure::NoSuchService(77)))
        );
        // The worker goes on after a panic.
        w[0].call(&n, 5, key(6), ECHO, b"hi", &mut reply);
        assert_eq!(reply, b"hi");
        let st = n.stats();
        assert_eq!((st.rpc_requests, st.rpc_failures), (7, 3));
    }

    #[test]
    fn failures_survive_the_wire() {
        for f in [
            RpcFailure::NoSuchService(4),
            RpcFailure::TooLarge {
                len: 9000,
                max: 4096,
            },
            RpcFailure::Service(vec![1, 2, 3]),
            RpcFailure::ShuttingDown,
            RpcFailure::ConnectionLost,
            RpcFailure::Malformed("bad".into()),
            RpcFailure::Panicked("boom".into()),
            RpcFailure::NoReply { waited_ms: 30_001 },
        ] {
            let (code, payload) = f.encode(64);
            assert_eq!(RpcFailure::decode(code, 4, &payload), Err(f));
        }
        // Too long to carry: texts are cut, service errors become TooLarge.
        let (code, p) = RpcFailure::Malformed("é".repeat(40)).encode(9);
        assert_eq!(
            RpcFailure::decode(code, 0, &p),
            Err(RpcFailure::Malformed("éééé".into()))
        );
        let (code, p) = RpcFailure::Service(vec![0; 100]).encode(16);
        assert_eq!(
            RpcFailure::decode(code, 0, &p),
            Err(RpcFailure::TooLarge { len: 100, max: 16 })
        );
        assert!(matches!(
            RpcFailure::decode(99, 0, b""),
            Err(RpcFailure::Malformed(_))
        ));
        assert_eq!(RpcFailure::decode(status::OK, 0, b"x"), Ok(()));
    }
}
