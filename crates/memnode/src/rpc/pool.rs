//! The node's worker threads: each polls the channels assigned to it —
//! shm rings ([`super::ring`]) or any transport's [`NodeChannel`] (the
//! verbs backend's queue pairs) — runs the calls on its [`RpcWorker`], and
//! routes messages and completions between workers.
//!
//! Threads start with the node's first channel and live as long as the
//! node (they hold it weakly, and strongly only while awake), so services'
//! per-worker state survives clients coming and going. Channels go to
//! workers round robin; a channel is served by one worker only, which is
//! what keeps its requests in order.
//!
//! **Idle policy.** A worker that found nothing to do spins for
//! [`SPIN`], then sets its [`WorkerBell`](crate::layout::WorkerBell)
//! (`sleeping = 1`), checks its channels and inbox once more, and blocks in
//! `futex(FUTEX_WAIT)` on the bell. A client posts a request by storing
//! `req_tail`, then loads the bell (both sequentially consistent: either
//! the worker's re-check sees the request, or the client sees the bell) and
//! issues `FUTEX_WAKE` only if it is set. So a system call happens only on
//! the idle → busy transition, never per request under load, and an idle
//! node burns no core (on a 2-core machine the spinning window is what a
//! request arriving right after the last one saves). The wait has a
//! timeout ([`NAP`]) as a backstop: a channel whose client died between
//! posting and waking is still noticed. A worker that serves a channel
//! whose client cannot ring the bell (a remote client over verbs) naps
//! instead: 16 µs, doubling while nothing comes, up to [`MAX_NAP`] — a
//! remote request waits at most that long for an idle worker.
//!
//! A service with background work ([`super::Service::poll`]) is polled on
//! every round; while it is [`busy`](super::Service::busy) its worker does
//! not block, and while it has work for other workers
//! ([`wake_peers`](super::Service::wake_peers)) the worker wakes the
//! sleeping ones.

use std::collections::VecDeque;
use std::os::fd::{AsFd, OwnedFd};
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use super::ring::{
    futex_wait, futex_wake, ChannelGeometry, RingView, CHANNEL_BROKEN, CHANNEL_CLOSED,
};
use super::{CallKey, CallOutcome, Outgoing, RpcFailure, RpcWorker, ServiceId, WorkerId};
use crate::error::RpcError;
use crate::layout::{WorkerBell, MAX_WORKER_BELLS, WORKER_BELLS_OFFSET};
use crate::memory::{create_sealed_memfd, Mapping};
use crate::node::{MemNode, SessionId};

/// How long an idle worker keeps polling before it blocks.
pub const SPIN: Duration = Duration::from_micros(50);
/// Longest block of an idle worker (then it looks again).
pub const NAP: Duration = Duration::from_millis(200);
/// Longest nap of an idle worker that serves a channel whose client cannot
/// wake it.
pub const MAX_NAP: Duration = Duration::from_millis(1);
/// First nap of such a worker.
const FIRST_NAP: Duration = Duration::from_micros(16);
/// Requests a worker takes from one channel before it looks at the next.
const BUDGET: u64 = 32;

/// What a client needs to use a new channel: its geometry, the memfd (for
/// another process, by `SCM_RIGHTS`) and the node's mapping of it (for an
/// embedded client).
#[derive(Debug)]
pub struct RpcChannelGrant {
    /// The channel's geometry.
    pub geometry: ChannelGeometry,
    /// The channel memfd.
    pub fd: OwnedFd,
    /// The node's mapping of it.
    pub mapping: Arc<Mapping>,
}

/// What a channel's transport found when a worker asked for the next
/// request ([`NodeChannel::next`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Incoming {
    /// Nothing arrived.
    None,
    /// A request to `service`; its payload is in the buffer given.
    Request {
        /// The caller's id.
        id: u64,
        /// The service called.
        service: ServiceId,
    },
    /// A request that cannot be read (its length exceeds the channel's):
    /// answered as malformed.
    Malformed {
        /// The caller's id (as written).
        id: u64,
        /// The service (as written).
        service: ServiceId,
        /// The length it claimed.
        len: usize,
    },
    /// The client closed the channel.
    Closed,
    /// The client broke the protocol (counters, a transport error): the
    /// node drops the channel.
    Broken,
}

/// What a node worker needs of one channel's transport. The shm rings
/// implement it here; another transport (the verbs backend's queue pairs)
/// implements it and hands its channels to the node's workers with
/// [`MemNode::attach_rpc_channel`]. A channel is served by one worker
/// thread only, which calls these in turn.
pub trait NodeChannel: Send {
    /// The next request that arrived, its payload copied into `payload`
    /// (cleared first).
    fn next(&mut self, payload: &mut Vec<u8>) -> Incoming;

    /// How many replies can be written now (`None`: the channel is broken).
    fn reply_room(&mut self) -> Option<usize>;

    /// Writes one reply (only when [`NodeChannel::reply_room`] said there
    /// is room; `payload` fits the channel's `max_message`).
    fn put_reply(&mut self, id: u64, service: ServiceId, status: u16, payload: &[u8]);

    /// Makes what was consumed and written so far visible to the client.
    fn publish(&mut self);

    /// The node drops the channel; `broken`: because its client broke the
    /// protocol (else: the node shuts down or the session ended).
    fn close(&mut self, broken: bool);

    /// Whether something may be waiting (a worker's last look before it
    /// sleeps).
    fn has_work(&mut self) -> bool;

    /// Whether the client wakes a sleeping worker through its bell (shm).
    /// A worker with a channel that cannot naps briefly instead.
    fn rings_bell(&self) -> bool;
}

/// The shm rings as a [`NodeChannel`].
struct RingChannel {
    ring: RingView,
    /// Requests consumed.
    head: u64,
    /// Replies posted.
    rep_tail: u64,
    slots: u64,
}

impl NodeChannel for RingChannel {
    fn next(&mut self, payload: &mut Vec<u8>) -> Incoming {
        let h = self.ring.header();
        if h.client_closed.load(Ordering::Acquire) != 0 {
            return Incoming::Closed;
        }
        let tail = h.req_tail.load(Ordering::Acquire);
        let posted = tail.wrapping_sub(self.head);
        if posted > self.slots {
            return Incoming::Broken;
        }
        if posted == 0 {
            return Incoming::None;
        }
        let read = self.ring.read_request(self.head, payload);
        self.head += 1;
        match read {
            Ok(head) => Incoming::Request {
                id: head.id,
                service: head.service,
            },
            Err(head) => Incoming::Malformed {
                id: head.id,
                service: head.service,
                len: head.len as usize,
            },
        }
    }

    fn reply_room(&mut self) -> Option<usize> {
        let head = self.ring.header().rep_head.load(Ordering::Acquire);
        let used = self.rep_tail.wrapping_sub(head);
        (used <= self.slots).then(|| (self.slots - used) as usize)
    }

    fn put_reply(&mut self, id: u64, service: ServiceId, status: u16, payload: &[u8]) {
        self.ring
            .write_reply(self.rep_tail, id, service, status, payload);
        self.rep_tail += 1;
    }

    fn publish(&mut self) {
        let h = self.ring.header();
        h.req_head.store(self.head, Ordering::Release);
        h.rep_tail.store(self.rep_tail, Ordering::Release);
    }

    fn close(&mut self, broken: bool) {
        let state = if broken {
            CHANNEL_BROKEN
        } else {
            CHANNEL_CLOSED
        };
        self.ring.header().state.store(state, Ordering::Release);
    }

    fn has_work(&mut self) -> bool {
        let h = self.ring.header();
        h.req_tail.load(Ordering::SeqCst) != self.head
            || h.client_closed.load(Ordering::SeqCst) != 0
    }

    fn rings_bell(&self) -> bool {
        true
    }
}

/// What a worker receives from the rest of the node.
enum Envelope {
    Channel(Box<Chan>),
    SessionClosed(SessionId),
    Message {
        service: ServiceId,
        from: WorkerId,
        msg: Box<dyn std::any::Any + Send>,
    },
    Complete {
        call: CallKey,
        result: Result<Vec<u8>, RpcFailure>,
    },
}

#[derive(Default)]
struct Inbox {
    q: Mutex<Vec<Envelope>>,
    any: AtomicBool,
}

/// What the workers and the node share.
pub(crate) struct PoolShared {
    workers: usize,
    inboxes: Vec<Inbox>,
    stop: AtomicBool,
    control: Arc<Mapping>,
    pub(crate) open: AtomicU64,
    pub(crate) total: AtomicU64,
    pub(crate) reclaimed: AtomicU64,
    pub(crate) broken: AtomicU64,
}

impl PoolShared {
    fn bell(&self, w: WorkerId) -> &AtomicU32 {
        assert!(w < MAX_WORKER_BELLS);
        // SAFETY: the bells lie inside the control mapping's first 8 KiB
        // (layout.rs asserts it), which the node keeps mapped while this
        // struct holds its Arc; `sleeping` is an atomic.
        unsafe {
            &(*(self.control.as_ptr().add(WORKER_BELLS_OFFSET + 64 * w) as *const WorkerBell))
                .sleeping
        }
    }

    /// Wakes worker `w` if it sleeps or is about to.
    fn wake(&self, w: WorkerId) {
        let bell = self.bell(w);
        if bell.load(Ordering::SeqCst) != 0 {
            futex_wake(bell);
        }
    }

    fn post(&self, w: WorkerId, e: Envelope) {
        let inbox = &self.inboxes[w];
        inbox.q.lock().unwrap_or_else(|p| p.into_inner()).push(e);
        inbox.any.store(true, Ordering::SeqCst);
        self.wake(w);
    }

    /// Wakes every worker but `me` that sleeps or is about to.
    fn wake_others(&self, me: WorkerId) {
        std::sync::atomic::fence(Ordering::SeqCst);
        for w in (0..self.workers).filter(|&w| w != me) {
            self.wake(w);
        }
    }

    fn wake_all(&self) {
        for w in 0..self.workers {
            futex_wake(self.bell(w));
        }
    }
}

struct Pool {
    shared: Arc<PoolShared>,
    threads: Vec<JoinHandle<()>>,
    next_worker: usize,
    next_channel: u64,
}

/// The node's worker threads, once started.
#[derive(Default)]
pub(crate) struct PoolSlot {
    inner: Mutex<Option<Pool>>,
}

impl PoolSlot {
    fn lock(&self) -> std::sync::MutexGuard<'_, Option<Pool>> {
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn shared(&self) -> Option<Arc<PoolShared>> {
        self.lock().as_ref().map(|p| p.shared.clone())
    }

    /// (open, opened in all, reclaimed, broken) channels.
    pub(crate) fn channel_counts(&self) -> [u64; 4] {
        self.shared().map_or([0; 4], |s| {
            [
                s.open.load(Ordering::SeqCst),
                s.total.load(Ordering::SeqCst),
                s.reclaimed.load(Ordering::SeqCst),
                s.broken.load(Ordering::SeqCst),
            ]
        })
    }

    /// Opens a shm channel of `session` on `node`: a fresh memfd with an
    /// initialised header, handed to the next worker.
    pub(crate) fn open(
        &self,
        node: &Arc<MemNode>,
        session: SessionId,
        slots: u32,
        max_message: u32,
    ) -> Result<RpcChannelGrant, RpcError> {
        ChannelGeometry::check(slots, max_message).map_err(RpcError::BadChannel)?;
        let mut grant = None;
        self.attach(node, session, max_message as usize, |channel, worker| {
            let geometry = ChannelGeometry {
                channel,
                worker: worker as u32,
                slots,
                max_message,
            };
            let name =
                std::ffi::CString::new(format!("dmkit-node{}-rpc{channel}", node.layout().node_id))
                    .expect("no NUL");
            let fd = create_sealed_memfd(&name, geometry.len())
                .map_err(|e| RpcError::Io(e.to_string()))?;
            let mapping = Arc::new(
                Mapping::map(fd.as_fd(), geometry.len(), true)
                    .map_err(|e| RpcError::Io(e.to_string()))?,
            );
            let ring = RingView::init(mapping.clone(), geometry).map_err(RpcError::BadChannel)?;
            grant = Some(RpcChannelGrant {
                geometry,
                fd,
                mapping,
            });
            Ok(Box::new(RingChannel {
                ring,
                head: 0,
                rep_tail: 0,
                slots: slots as u64,
            }))
        })?;
        Ok(grant.expect("made by attach's callback"))
    }

    /// Hands a channel of `session` to the next worker (the pool starts
    /// with the first channel): `make(channel id, worker)` builds its
    /// transport. Returns the channel's id and its worker.
    pub(crate) fn attach(
        &self,
        node: &Arc<MemNode>,
        session: SessionId,
        max_message: usize,
        make: impl FnOnce(u64, WorkerId) -> Result<Box<dyn NodeChannel>, RpcError>,
    ) -> Result<(u64, WorkerId), RpcError> {
        if node.is_shutting_down() {
            return Err(RpcError::ShuttingDown);
        }
        let workers = node.rpc_host().workers();
        if workers == 0 {
            return Err(RpcError::Unsupported(
                "this memory node runs no RPC workers".into(),
            ));
        }
        let mut slot = self.lock();
        if slot.is_none() {
            *slot = Some(start(node, workers)?);
        }
        let pool = slot.as_mut().expect("started above");
        let (channel, worker) = (pool.next_channel, pool.next_worker);
        let io = make(channel, worker)?;
        pool.next_channel += 1;
        pool.next_worker = (pool.next_worker + 1) % workers;
        pool.shared.open.fetch_add(1, Ordering::Relaxed);
        pool.shared.total.fetch_add(1, Ordering::Relaxed);
        pool.shared.post(
            worker,
            Envelope::Channel(Box::new(Chan {
                io,
                key: channel,
                max: max_message,
                session,
                seq: 0,
                backlog: VecDeque::new(),
            })),
        );
        Ok((channel, worker))
    }

    /// Tells every worker that `session` ended.
    pub(crate) fn session_closed(&self, session: SessionId) {
        if let Some(s) = self.shared() {
            for w in 0..s.workers {
                s.post(w, Envelope::SessionClosed(session));
            }
        }
    }

    /// Wakes every worker (shutdown: they close their channels and exit).
    pub(crate) fn wake_all(&self) {
        if let Some(s) = self.shared() {
            s.wake_all();
        }
    }

    /// Stops the workers and waits for them (but the calling one, when the
    /// node is dropped on a worker thread).
    pub(crate) fn stop(&self) {
        let Some(pool) = self.lock().take() else {
            return;
        };
        pool.shared.stop.store(true, Ordering::SeqCst);
        pool.shared.wake_all();
        let me = std::thread::current().id();
        for t in pool.threads {
            if t.thread().id() != me {
                let _ = t.join();
            }
        }
    }
}

fn start(node: &Arc<MemNode>, workers: usize) -> Result<Pool, RpcError> {
    assert!(
        workers <= MAX_WORKER_BELLS,
        "NodeConfig checks the worker count"
    );
    let shared = Arc::new(PoolShared {
        workers,
        inboxes: (0..workers).map(|_| Inbox::default()).collect(),
        stop: AtomicBool::new(false),
        control: node.control_mapping(),
        open: AtomicU64::new(0),
        total: AtomicU64::new(0),
        reclaimed: AtomicU64::new(0),
        broken: AtomicU64::new(0),
    });
    let mut threads = Vec::with_capacity(workers);
    for w in 0..workers {
        let (weak, sh) = (Arc::downgrade(node), shared.clone());
        let spawned = std::thread::Builder::new()
            .name(format!("dmkit-rpc-{}-{w}", node.layout().node_id))
            .spawn(move || Worker::new(w, sh).run(weak));
        match spawned {
            Ok(t) => threads.push(t),
            Err(e) => {
                shared.stop.store(true, Ordering::SeqCst);
                shared.wake_all();
                for t in threads {
                    let _ = t.join();
                }
                return Err(RpcError::Io(format!("spawning RPC worker {w}: {e}")));
            }
        }
    }
    Ok(Pool {
        shared,
        threads,
        next_worker: 0,
        next_channel: 1,
    })
}

/// A reply not yet in the ring: deferred, or behind one.
struct Pending {
    seq: u64,
    id: u64,
    service: ServiceId,
    /// (status, payload) once known.
    reply: Option<(u16, Vec<u8>)>,
}

/// A channel as its worker keeps it.
struct Chan {
    io: Box<dyn NodeChannel>,
    key: u64,
    /// The channel's largest message.
    max: usize,
    session: SessionId,
    /// Requests taken (the next one's position in the channel).
    seq: u64,
    /// Replies waiting for an earlier one (or for room), in order.
    backlog: VecDeque<Pending>,
}

/// What serving a channel found.
enum Served {
    /// Requests taken or replies written.
    Work(usize),
    /// The client closed it.
    Closed,
    /// Its client broke the protocol.
    Broken,
}

impl Chan {
    /// Writes the backlog's ready prefix while there is room; returns how
    /// many replies it wrote (`None`: broken).
    fn flush(&mut self) -> Option<usize> {
        let mut room = self.io.reply_room()?;
        let mut n = 0;
        while room > 0 && self.backlog.front().is_some_and(|p| p.reply.is_some()) {
            let p = self.backlog.pop_front().expect("front exists");
            let (status, payload) = p.reply.expect("checked");
            self.io.put_reply(p.id, p.service, status, &payload);
            room -= 1;
            n += 1;
        }
        Some(n)
    }
}

/// Why a worker drops a channel.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Gone {
    /// Its client closed it, or its session ended.
    Reclaimed,
    /// Its client broke the protocol.
    Broken,
    /// The node stops.
    Shutdown,
}

/// One worker thread.
struct Worker {
    w: WorkerId,
    sh: Arc<PoolShared>,
    chans: Vec<Chan>,
    rpc: Option<RpcWorker>,
    /// Messages and completions addressed to this worker by itself.
    local: VecDeque<Envelope>,
    request: Vec<u8>,
    reply: Vec<u8>,
}

impl Worker {
    fn new(w: WorkerId, sh: Arc<PoolShared>) -> Self {
        Self {
            w,
            sh,
            chans: Vec::new(),
            rpc: None,
            local: VecDeque::new(),
            request: Vec::new(),
            reply: Vec::new(),
        }
    }

    fn run(mut self, node: Weak<MemNode>) {
        let mut nap = FIRST_NAP;
        loop {
            let Some(n) = node.upgrade() else { break };
            match self.serve_until_idle(&n) {
                None => break,
                Some(true) => nap = FIRST_NAP,
                Some(false) => {}
            }
            drop(n);
            // Sleep: announce it, look once more, block.
            let bell = self.sh.bell(self.w);
            bell.store(1, Ordering::SeqCst);
            let busy = self.sh.stop.load(Ordering::SeqCst)
                || self.sh.inboxes[self.w].any.load(Ordering::SeqCst)
                || !self.local.is_empty()
                || self.rpc.as_ref().is_some_and(RpcWorker::busy)
                || self.chans.iter_mut().any(|c| c.io.has_work());
            if !busy {
                // Clients that cannot ring the bell: nap briefly, longer
                // while nothing comes.
                if self.chans.iter().all(|c| c.io.rings_bell()) {
                    futex_wait(bell, 1, NAP);
                } else {
                    futex_wait(bell, 1, nap);
                    nap = (nap * 2).min(MAX_NAP);
                }
            }
            bell.store(0, Ordering::SeqCst);
        }
        self.close_all();
    }

    /// Serves until nothing happened for [`SPIN`]; `None` when the worker
    /// must exit (the node stops), else whether there was any work.
    fn serve_until_idle(&mut self, n: &MemNode) -> Option<bool> {
        if self.rpc.is_none() {
            self.rpc = Some(RpcWorker::new(n, self.w, self.sh.workers));
        }
        let mut idle_since: Option<Instant> = None;
        let mut rounds = 0u32;
        let mut worked = false;
        loop {
            if self.sh.stop.load(Ordering::Acquire) || n.is_shutting_down() {
                return None;
            }
            let work = self.round(n);
            if work > 0 {
                idle_since = None;
                worked = true;
                continue;
            }
            rounds = rounds.wrapping_add(1);
            std::hint::spin_loop();
            if self.rpc.as_ref().is_some_and(RpcWorker::busy) {
                // A service's work in progress: not idle.
                idle_since = None;
                if rounds.is_multiple_of(64) {
                    std::thread::yield_now();
                }
                continue;
            }
            if rounds.is_multiple_of(64) {
                let since = *idle_since.get_or_insert_with(Instant::now);
                if since.elapsed() >= SPIN {
                    return Some(worked);
                }
            }
        }
    }

    /// One pass over the inbox and every channel; returns the work done.
    fn round(&mut self, n: &MemNode) -> usize {
        let mut work = self.drain_inbox(n);
        let mut i = 0;
        while i < self.chans.len() {
            match self.serve(n, i) {
                Served::Work(k) => {
                    work += k;
                    i += 1;
                }
                Served::Closed => {
                    self.drop_chan(i, Gone::Reclaimed);
                    work += 1;
                }
                Served::Broken => {
                    self.drop_chan(i, Gone::Broken);
                    work += 1;
                }
            }
        }
        if self.rpc().poll(n) {
            work += 1;
        }
        let work = work + self.route(n);
        // Services with work between workers (CoRM's messages): a peer
        // that went to sleep must run its part.
        if self.rpc.as_ref().is_some_and(RpcWorker::wake_peers) {
            self.sh.wake_others(self.w);
        }
        work
    }

    fn rpc(&mut self) -> &mut RpcWorker {
        self.rpc.as_mut().expect("made before the first round")
    }

    fn drain_inbox(&mut self, n: &MemNode) -> usize {
        let inbox = &self.sh.inboxes[self.w];
        let mut got: Vec<Envelope> = Vec::new();
        if inbox.any.load(Ordering::Acquire) {
            inbox.any.store(false, Ordering::SeqCst);
            got = std::mem::take(&mut *inbox.q.lock().unwrap_or_else(|p| p.into_inner()));
        }
        let mut work = got.len() + self.local.len();
        let local = std::mem::take(&mut self.local);
        for e in local.into_iter().chain(got) {
            match e {
                Envelope::Channel(c) => self.chans.push(*c),
                Envelope::SessionClosed(s) => {
                    let mut i = 0;
                    while i < self.chans.len() {
                        if self.chans[i].session == s {
                            self.drop_chan(i, Gone::Reclaimed);
                        } else {
                            i += 1;
                        }
                    }
                    self.rpc().session_closed(n, s);
                }
                Envelope::Message { service, from, msg } => {
                    self.rpc().message(n, service, from, msg);
                }
                Envelope::Complete { call, result } => self.complete(call, result),
            }
        }
        work += self.route(n);
        work
    }

    /// Carries what the services sent: messages to their workers,
    /// completions to the worker of their call.
    fn route(&mut self, _n: &MemNode) -> usize {
        let Some(rpc) = self.rpc.as_mut() else {
            return 0;
        };
        if !rpc.has_outgoing() {
            return 0;
        }
        let out = rpc.take_outgoing();
        let k = out.len();
        for o in out {
            match o {
                Outgoing::Message {
                    to,
                    service,
                    from,
                    msg,
                } => {
                    let e = Envelope::Message { service, from, msg };
                    if to == self.w {
                        self.local.push_back(e);
                    } else {
                        self.sh.post(to, e);
                    }
                }
                Outgoing::Complete { token, result } => {
                    if token.worker() == self.w {
                        self.complete(token.call(), result);
                    } else {
                        self.sh.post(
                            token.worker(),
                            Envelope::Complete {
                                call: token.call(),
                                result,
                            },
                        );
                    }
                }
            }
        }
        k
    }

    /// The answer of a deferred call of one of this worker's channels.
    fn complete(&mut self, call: CallKey, result: Result<Vec<u8>, RpcFailure>) {
        let failed = result.is_err();
        let Some(c) = self.chans.iter_mut().find(|c| c.key == call.channel) else {
            return; // the channel is gone: nobody waits for the answer
        };
        let Some(p) = c
            .backlog
            .iter_mut()
            .find(|p| p.seq == call.seq && p.reply.is_none())
        else {
            return;
        };
        let max = c.max;
        p.reply = Some(match result {
            Ok(bytes) if bytes.len() <= max => (super::status::OK, bytes),
            Ok(bytes) => RpcFailure::TooLarge {
                len: bytes.len(),
                max,
            }
            .encode(max),
            Err(f) => f.encode(max),
        });
        if failed {
            self.rpc().note_failure();
        }
    }

    /// Takes up to [`BUDGET`] requests of channel `i` and writes what
    /// replies it can.
    fn serve(&mut self, n: &MemNode, i: usize) -> Served {
        let Some(mut work) = self.chans[i].flush() else {
            return Served::Broken;
        };
        for _ in 0..BUDGET {
            // A node shutting down serves nothing more: the rest fail so.
            if n.is_shutting_down() {
                break;
            }
            let c = &mut self.chans[i];
            // A well-behaved client has at most a channel's capacity of
            // calls unanswered; a backlog that long waits for the client.
            if c.backlog.len() >= 4096 {
                break;
            }
            let max = c.max;
            let (id, service, outcome) = match c.io.next(&mut self.request) {
                Incoming::None => break,
                Incoming::Closed => return Served::Closed,
                Incoming::Broken => return Served::Broken,
                Incoming::Request { id, service } => {
                    let seq = c.seq;
                    c.seq += 1;
                    let key = CallKey {
                        channel: c.key,
                        seq,
                    };
                    let rpc = self.rpc.as_mut().expect("made before the first round");
                    let outcome =
                        rpc.call(n, c.session, key, service, &self.request, &mut self.reply);
                    (id, service, outcome)
                }
                Incoming::Malformed { id, service, len } => {
                    c.seq += 1;
                    self.rpc.as_ref().expect("made").note_malformed();
                    let f = RpcFailure::Malformed(format!(
                        "request of {len} B in a channel of {max} B messages"
                    ));
                    (id, service, CallOutcome::Replied(Err(f)))
                }
            };
            let seq = c.seq - 1;
            let reply = match outcome {
                CallOutcome::Deferred => None,
                CallOutcome::Replied(Ok(())) if self.reply.len() <= max => {
                    Some((super::status::OK, None))
                }
                CallOutcome::Replied(Ok(())) => {
                    let (s, p) = RpcFailure::TooLarge {
                        len: self.reply.len(),
                        max,
                    }
                    .encode(max);
                    Some((s, Some(p)))
                }
                CallOutcome::Replied(Err(f)) => {
                    let (s, p) = f.encode(max);
                    Some((s, Some(p)))
                }
            };
            match reply {
                // The common case: nothing ahead of it, room to write it.
                Some((status, payload))
                    if c.backlog.is_empty() && c.io.reply_room().is_some_and(|r| r > 0) =>
                {
                    let bytes = payload.as_deref().unwrap_or(&self.reply);
                    c.io.put_reply(id, service, status, bytes);
                }
                Some((status, payload)) => c.backlog.push_back(Pending {
                    seq,
                    id,
                    service,
                    reply: Some((status, payload.unwrap_or_else(|| self.reply.clone()))),
                }),
                None => c.backlog.push_back(Pending {
                    seq,
                    id,
                    service,
                    reply: None,
                }),
            }
            work += 1;
        }
        let c = &mut self.chans[i];
        let flushed = c.flush();
        c.io.publish();
        match flushed {
            Some(k) => Served::Work(work + k),
            None => Served::Broken,
        }
    }

    /// Drops channel `i`, counted as `why` before it leaves the open
    /// count (a reader that sees it gone sees it counted).
    fn drop_chan(&mut self, i: usize, why: Gone) {
        let mut c = self.chans.swap_remove(i);
        c.io.close(why == Gone::Broken);
        match why {
            Gone::Reclaimed => self.sh.reclaimed.fetch_add(1, Ordering::SeqCst),
            Gone::Broken => self.sh.broken.fetch_add(1, Ordering::SeqCst),
            Gone::Shutdown => 0,
        };
        self.sh.open.fetch_sub(1, Ordering::SeqCst);
    }

    fn close_all(&mut self) {
        while !self.chans.is_empty() {
            self.drop_chan(self.chans.len() - 1, Gone::Shutdown);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::NodeConfig;

    /// An in-process transport whose client cannot ring the bell.
    #[derive(Default)]
    struct Wire {
        requests: VecDeque<(u64, ServiceId, Vec<u8>)>,
        replies: Vec<(u64, u16, Vec<u8>)>,
        closed: Option<bool>,
    }

    struct Fake(Arc<Mutex<Wire>>);

    impl NodeChannel for Fake {
        fn next(&mut self, payload: &mut Vec<u8>) -> Incoming {
            match self.0.lock().unwrap().requests.pop_front() {
                None => Incoming::None,
                Some((id, service, p)) => {
                    *payload = p;
                    Incoming::Request { id, service }
                }
            }
        }
        fn reply_room(&mut self) -> Option<usize> {
            Some(1)
        }
        fn put_reply(&mut self, id: u64, _: ServiceId, status: u16, payload: &[u8]) {
            self.0
                .lock()
                .unwrap()
                .replies
                .push((id, status, payload.to_vec()));
        }
        fn publish(&mut self) {}
        fn close(&mut self, broken: bool) {
            self.0.lock().unwrap().closed = Some(broken);
        }
        fn has_work(&mut self) -> bool {
            !self.0.lock().unwrap().requests.is_empty()
        }
        fn rings_bell(&self) -> bool {
            false
        }
    }

    #[test]
    fn a_transport_without_bells_is_served_within_a_nap() {
        let node = MemNode::new(NodeConfig {
            size: 1 << 20,
            rpc_workers: 1,
            ..Default::default()
        })
        .unwrap();
        let wire = Arc::new(Mutex::new(Wire::default()));
        let w2 = wire.clone();
        let s = node.open_session();
        let (id, worker) = node
            .attach_rpc_channel(s, 64, move |_, _| Ok(Box::new(Fake(w2))))
            .unwrap();
        assert_eq!((id, worker), (1, 0));
        for round in 0..3u64 {
            // Let the worker fall asleep, then post without a bell.
            std::thread::sleep(SPIN * 4 + MAX_NAP * 3);
            let t0 = Instant::now();
            wire.lock().unwrap().requests.push_back((
                round,
                super::super::ECHO,
                vec![round as u8; 3],
            ));
            while wire.lock().unwrap().replies.len() <= round as usize {
                assert!(t0.elapsed() < Duration::from_secs(5));
                std::thread::yield_now();
            }
            // At most one nap, plus scheduling noise.
            assert!(t0.elapsed() < MAX_NAP * 50, "{:?}", t0.elapsed());
        }
        // A reply too large for the channel is a typed failure.
        wire.lock()
            .unwrap()
            .requests
            .push_back((9, super::super::ECHO, vec![0; 100]));
        let t0 = Instant::now();
        while wire.lock().unwrap().replies.len() < 4 {
            assert!(t0.elapsed() < Duration::from_secs(5));
            std::thread::yield_now();
        }
        let w = wire.lock().unwrap();
        assert_eq!(w.replies[0], (0, super::super::status::OK, vec![0; 3]));
        assert_eq!(w.replies[3].1, super::super::status::TOO_LARGE);
        drop(w);
        node.close_session(s);
        let t0 = Instant::now();
        while wire.lock().unwrap().closed.is_none() {
            assert!(t0.elapsed() < Duration::from_secs(5));
            std::thread::sleep(Duration::from_millis(1));
        }
        assert_eq!(wire.lock().unwrap().closed, Some(false));
    }
}
