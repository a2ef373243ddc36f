//! The worker: one thread's share of the runtime (SMART §4.1, §5.1).
//!
//! A worker owns a queue pair to every memory node, the completion queues
//! behind them, one block of registered local memory, the throttle's credits
//! and the conflict-avoidance state. It runs many tasks (the papers'
//! coroutines) on a small single-threaded executor; tasks share everything
//! the worker owns. Each [`Worker::step`] is the dedicated poll step: reap
//! completions and route them to their tasks, post deferred batches as
//! credits allow, fire timers, adapt `C_max`/`c_max`/`t_max`, then poll the
//! tasks that became ready. [`Worker::run`] loops `step` on the calling OS
//! thread; an external scheduler (the simulator) may call `step` itself and
//! interleave hundreds of workers on one thread.
//!
//! Work-request ids carry routing data: `task:16 | ticket:24 | size:24`, where
//! `size`, set on the last request of a posted batch only, is the number of
//! requests the batch charged against the credits (Algorithm 1, line 4).

use std::cell::RefCell;
use std::cmp::Reverse;
use std::collections::{BinaryHeap, VecDeque};
use std::future::Future;
use std::pin::Pin;
use std::rc::Rc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Wake, Waker};

use dmkit_fabric::{
    Batch, Completion, Fabric, FabricError, Lkey, LocalMem, NodeId, PostError, QueuePair,
};

use crate::backoff::{Adjust, ConflictAvoider};
use crate::clock::{Clock, Nanos};
use crate::config::RuntimeConfig;
use crate::ctx::Ctx;
use crate::local::LocalLayout;
use crate::stats::{Counters, WorkerStats};
use crate::throttle::{Credits, Tuner};

pub(crate) const TASK_BITS: u32 = 16;
pub(crate) const TICKET_BITS: u32 = 24;
pub(crate) const MAX_TASKS: usize = 1 << TASK_BITS;
pub(crate) const MAX_TICKETS: usize = 1 << TICKET_BITS;
const SIZE_SHIFT: u32 = TASK_BITS + TICKET_BITS;

pub(crate) fn wr_id(task: usize, ticket: usize, size: u32) -> u64 {
    task as u64 | ((ticket as u64) << TASK_BITS) | ((size as u64) << SIZE_SHIFT)
}

fn split_wr_id(id: u64) -> (usize, usize, u32) {
    (
        (id & ((1 << TASK_BITS) - 1)) as usize,
        ((id >> TASK_BITS) & ((1 << TICKET_BITS) - 1)) as usize,
        (id >> SIZE_SHIFT) as u32,
    )
}

pub(crate) struct WorkerQp {
    pub node: NodeId,
    pub qp: Box<dyn QueuePair>,
    pub lkey: Lkey,
    pub max_batch: usize,
}

/// A batch waiting for credits.
struct Deferred {
    qp: usize,
    task: usize,
    batch: Batch,
    size: u32,
    counted: bool,
}

/// What the worker knows about one task.
#[derive(Default)]
pub(crate) struct TaskState {
    /// Requests queued and not yet posted, indexed by queue pair (one batch
    /// per queue pair of the worker; a batch stays here, empty, after it is
    /// posted, for reuse).
    pub pending: Vec<Batch>,
    /// Which of `pending` may hold requests: bit `qi` for queue pair `qi`
    /// below 63, bit 63 for any from 63 up. Set by every push
    /// ([`TaskState::queue_to`]), cleared by [`State::post_task`], which
    /// posts exactly these (callgrind: scanning every queue pair's batch
    /// per post and per sync cost 10 instructions a READ with two memory
    /// nodes).
    pub queued_to: u64,
    /// Batches posted (or deferred) whose last completion has not arrived.
    pub inflight: u32,
    /// Old values / byte counts by ticket for the current sync round.
    pub results: Vec<u64>,
    /// The next queued request starts a new round (results cleared).
    pub fresh: bool,
    pub error: Option<FabricError>,
    pub waiting_sync: bool,
    /// Backoff attempt counter of the current operation.
    pub attempt: u32,
    /// The task is inside a guarded operation scope ([`Ctx::op`]): its
    /// retries count in the retry rate γ.
    ///
    /// [`Ctx::op`]: crate::Ctx::op
    pub guarded: bool,
    pub counters: Counters,
    /// An operation slot was granted while the task waited for one.
    pub op_granted: bool,
    /// The task is in `op_waiters`.
    pub op_waiting: bool,
    queued: bool,
    alive: bool,
}

/// `State::routes` entry of a node the worker has no queue pair to.
const NO_ROUTE: u64 = u64::MAX;

impl TaskState {
    /// The batch of queued requests for queue pair `qi`, to push to: the
    /// one way requests are queued, so [`TaskState::queued_to`] marks every
    /// batch that holds any.
    #[inline(always)]
    pub fn queue_to(&mut self, qi: usize) -> &mut Batch {
        self.queued_to |= 1 << qi.min(63);
        &mut self.pending[qi]
    }
}

pub(crate) struct State {
    pub qps: Vec<WorkerQp>,
    /// By memory node id, the queue pair's index (high 32 bits) and its
    /// lkey (low 32 bits), or `NO_ROUTE`: looked up per queued request, so
    /// one direct load rather than a search and a second lookup.
    routes: Vec<u64>,
    pub credits: Credits,
    tuner: Option<Tuner>,
    pub avoider: Option<ConflictAvoider>,
    deferred: VecDeque<Deferred>,
    pub tasks: Vec<TaskState>,
    ready: Vec<usize>,
    timers: BinaryHeap<Reverse<(Nanos, usize)>>,
    completions: Vec<Completion>,
    pub batch_pool: Vec<Batch>,
    pub stats: WorkerStats,
    completed_wrs: u64,
    pub op_in_use: u32,
    pub op_waiters: VecDeque<usize>,
    pub rng: crate::rng::Rng,
    /// RPC channels and calls in flight.
    pub(crate) rpc: crate::rpc::RpcState,
}

impl State {
    /// The queue pair to `node` (its index) and its lkey.
    #[inline(always)]
    pub fn route(&self, node: NodeId) -> Option<(usize, Lkey)> {
        match self.routes.get(node as usize) {
            Some(&r) if r != NO_ROUTE => Some(((r >> 32) as usize, r as u32)),
            _ => None,
        }
    }

    /// The task's batch of queued, unposted requests for queue pair `qi`,
    /// to push to (it is marked as holding requests).
    #[inline(always)]
    pub fn pending_batch(&mut self, task: usize, qi: usize) -> &mut Batch {
        self.tasks[task].queue_to(qi)
    }

    /// Whether task `task` queued requests it has not posted yet.
    #[inline]
    pub fn has_pending(&self, task: usize) -> bool {
        self.tasks[task].queued_to != 0
    }

    pub fn make_ready(&mut self, task: usize) {
        let t = &mut self.tasks[task];
        if t.alive && !t.queued {
            t.queued = true;
            self.ready.push(task);
        }
    }

    pub fn add_timer(&mut self, at: Nanos, task: usize) {
        self.timers.push(Reverse((at, task)));
    }

    pub fn next_random(&mut self) -> u64 {
        self.rng.next_u64()
    }

    /// Posts a task's queued requests: one batch per queue pair, split at
    /// the backend's batch limit and at `C_max`, each posted now if nothing
    /// waits before it and the credits allow, else deferred in order.
    /// Algorithm 1 could never post a batch larger than `C_max` (line 5
    /// waits for `credit ≥ size` forever), so a larger post goes out as
    /// `C_max`-sized doorbell batches, each charged and refunded on its own:
    /// the throttle bounds outstanding requests whatever the application's
    /// batch size (SMART Fig. 13b, Table 1: batches of 64).
    ///
    /// The common case — a batch that fits, with credits to spare — is
    /// posted where it lies in the task's pending list and left there,
    /// empty, for the task's next requests to that queue pair: no batch
    /// moves, nothing goes through the pool (perf: moving batches through
    /// the deferral path cost ~30 ns per post).
    pub fn post_task(&mut self, task: usize) {
        let c_max = self.credits.c_max() as usize;
        // In queue pair order, as a scan of every batch would.
        let mut marked = std::mem::take(&mut self.tasks[task].queued_to);
        while marked != 0 {
            let bit = marked.trailing_zeros() as usize;
            marked &= marked - 1;
            let last = if bit < 63 { bit + 1 } else { self.qps.len() };
            for qi in bit..last {
                self.post_queued(task, qi, c_max);
            }
        }
    }

    /// [`State::post_task`] for the task's batch to queue pair `qi`.
    #[inline(always)]
    fn post_queued(&mut self, task: usize, qi: usize, c_max: usize) {
        let n = self.tasks[task].pending[qi].len();
        if n == 0 {
            return;
        }
        let max = self.qps[qi].max_batch.min(c_max).max(1);
        if n <= max && self.deferred.is_empty() && self.credits.try_take(n as u32) {
            let State { tasks, qps, .. } = self;
            let t = &mut tasks[task];
            let batch = &mut t.pending[qi];
            Self::mark_last(batch, n as u32);
            t.inflight += 1;
            t.counters.doorbells += 1;
            let r = qps[qi].qp.post(batch);
            batch.clear();
            if let Err(e) = r {
                self.fail_batch(task, n as u32, e);
            }
            return;
        }
        self.post_slow(task, qi, max);
    }

    /// The rest of [`State::post_task`] for the task's batch to queue pair
    /// `qi` (too big for one post, or held back by the credits or by batches
    /// already deferred): it leaves the pending list, is split at `max`
    /// requests, and each part is posted or deferred in order.
    #[inline(never)]
    fn post_slow(&mut self, task: usize, qi: usize, max: usize) {
        let fresh = self.batch_pool.pop().unwrap_or_default();
        let mut rest = Some(std::mem::replace(&mut self.tasks[task].pending[qi], fresh));
        while let Some(mut b) = rest.take() {
            let part = if b.len() > max {
                // Split at the limit; vector requests bring their
                // scatter/gather entries along.
                let mut p = self.batch_pool.pop().unwrap_or_default();
                let mut r = self.batch_pool.pop().unwrap_or_default();
                for (i, wr) in b.requests().iter().enumerate() {
                    if i < max {
                        p.push_from(&b, wr);
                    } else {
                        r.push_from(&b, wr);
                    }
                }
                b.clear();
                self.batch_pool.push(b);
                rest = Some(r);
                p
            } else {
                b
            };
            self.submit(task, qi, part);
        }
    }

    /// Marks a batch's last request signaled, carrying the batch size for
    /// the credit refund (Algorithm 1, line 4).
    #[inline]
    fn mark_last(batch: &mut Batch, n: u32) {
        let last = batch.requests_mut().last_mut().expect("non-empty batch");
        last.signaled = true;
        last.wr_id |= (n as u64) << SIZE_SHIFT;
    }

    /// Marks a batch's last request and posts it now if nothing waits
    /// before it and the credits allow (Algorithm 1, lines 3–8); otherwise
    /// defers it in order.
    fn submit(&mut self, task: usize, qi: usize, mut batch: Batch) {
        let n = batch.len() as u32;
        Self::mark_last(&mut batch, n);
        self.tasks[task].inflight += 1;
        if self.deferred.is_empty() && self.credits.try_take(n) {
            self.post_now(task, qi, batch, n);
        } else {
            self.deferred.push_back(Deferred {
                qp: qi,
                task,
                batch,
                size: n,
                counted: false,
            });
            self.flush_deferred();
        }
    }

    /// Posts a batch whose credits are already taken, then recycles it.
    fn post_now(&mut self, task: usize, qi: usize, mut batch: Batch, size: u32) {
        let r = self.qps[qi].qp.post(&mut batch);
        self.tasks[task].counters.doorbells += 1;
        if let Err(e) = r {
            self.fail_batch(task, size, e);
        }
        batch.clear();
        self.batch_pool.push(batch);
    }

    /// Algorithm 1, SMARTPOSTSEND: posts deferred batches in order while the
    /// credits allow.
    fn flush_deferred(&mut self) {
        while let Some(front) = self.deferred.front_mut() {
            if !self.credits.try_take(front.size) {
                if !front.counted {
                    front.counted = true;
                    self.tasks[front.task].counters.throttled_posts += 1;
                }
                return;
            }
            let d = self.deferred.pop_front().expect("front exists");
            self.post_now(d.task, d.qp, d.batch, d.size);
        }
    }

    fn fail_batch(&mut self, task: usize, size: u32, e: PostError) {
        self.credits.refund(size);
        let t = &mut self.tasks[task];
        t.inflight -= 1;
        if t.error.is_none() {
            t.error = Some(e.into());
        }
        if t.inflight == 0 && t.waiting_sync {
            self.make_ready(task);
        }
    }

    /// Algorithm 1, SMARTPOLLCQ: reaps completions, refunds credits, routes
    /// results to tasks and wakes the ones whose sync is satisfied.
    fn poll_cqs(&mut self) {
        let mut comps = std::mem::take(&mut self.completions);
        for qi in 0..self.qps.len() {
            // (Delivering touches only this worker: polling on until the
            // queue is empty, then delivering, is the same as alternating.)
            if self.qps[qi].qp.poll_drain(&mut comps, 64) > 0 {
                for c in comps.drain(..) {
                    self.deliver(c);
                }
            }
        }
        self.completions = comps;
    }

    fn deliver(&mut self, c: Completion) {
        let (task, ticket, size) = split_wr_id(c.wr_id);
        let Some(t) = self.tasks.get_mut(task) else {
            debug_assert!(false, "completion for unknown task {task}");
            return;
        };
        match c.result {
            Ok(v) => {
                if let Some(slot) = t.results.get_mut(ticket) {
                    *slot = v;
                }
            }
            Err(e) => {
                if t.error.is_none() {
                    t.error = Some((*e).into());
                }
            }
        }
        if size > 0 {
            t.inflight -= 1;
            let wake = t.inflight == 0 && t.waiting_sync;
            self.credits.refund(size);
            self.completed_wrs += size as u64;
            if wake {
                self.make_ready(task);
            }
        }
    }

    fn fire_timers(&mut self, now: Nanos) {
        while let Some(&Reverse((at, task))) = self.timers.peek() {
            if at > now {
                break;
            }
            self.timers.pop();
            self.make_ready(task);
        }
    }

    fn adapt(&mut self, now: Nanos) {
        if let Some(t) = &mut self.tuner {
            if let Some(c) = t.tick(now, self.completed_wrs) {
                self.credits.set_c_max(c);
            }
        }
        if let Some(a) = &mut self.avoider {
            if let Some(Adjust::CMax(c)) = a.tick(now) {
                // More room: let waiting tasks in.
                while self.op_in_use < c {
                    let Some(w) = self.op_waiters.pop_front() else {
                        break;
                    };
                    self.grant_op(w);
                }
            }
        }
    }

    /// Releases an operation slot and admits the next waiter.
    pub fn release_op(&mut self) {
        self.op_in_use -= 1;
        let limit = self.avoider.as_ref().map_or(u32::MAX, |a| a.c_max());
        if self.op_in_use < limit {
            if let Some(w) = self.op_waiters.pop_front() {
                self.grant_op(w);
            }
        }
    }

    /// Hands an operation slot to waiting task `w` (counted now, so no more
    /// than `c_max` are ever admitted) and wakes it.
    fn grant_op(&mut self, w: usize) {
        self.op_in_use += 1;
        self.tasks[w].op_granted = true;
        self.tasks[w].op_waiting = false;
        self.make_ready(w);
    }
}

pub(crate) struct Core {
    pub clock: Arc<dyn Clock>,
    pub local: LocalMem,
    pub task_bytes: usize,
    pub op_stats: bool,
    pub st: RefCell<State>,
}

/// Tasks woken by their wakers (from any thread), and whether there are any.
#[derive(Default)]
struct Inbox {
    tasks: Mutex<Vec<usize>>,
    /// Set when a task is pushed; lets `step` skip the lock when nothing
    /// was woken from outside (the common case: the runtime's own futures
    /// never use wakers).
    any: AtomicBool,
}

struct TaskWaker {
    task: usize,
    inbox: Arc<Inbox>,
}

impl Wake for TaskWaker {
    fn wake(self: Arc<Self>) {
        self.wake_by_ref();
    }

    fn wake_by_ref(self: &Arc<Self>) {
        // Poisoning cannot happen: the lock guards a plain push.
        self.inbox
            .tasks
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push(self.task);
        self.inbox.any.store(true, Ordering::Release);
    }
}

type TaskFuture = Pin<Box<dyn Future<Output = ()>>>;

/// One worker. Not `Send`: it lives on the thread that created it.
pub struct Worker {
    id: usize,
    core: Rc<Core>,
    futures: Vec<Option<TaskFuture>>,
    wakers: Vec<Waker>,
    inbox: Arc<Inbox>,
    live: usize,
    capacity: usize,
    run_list: Vec<usize>,
    steps: u64,
}

/// Steps between clock reads when no timer is pending.
const CLOCK_EVERY: u64 = 8;

/// How a [`Worker`] is made: [`Worker::builder`] (queue pairs to every
/// memory node of a fabric) or [`Worker::builder_on`] (queue pairs made by
/// the caller), then the clock, configuration, id, task capacity and the
/// task-local memory the data structures it will run declared.
///
/// ```no_run
/// # use std::sync::Arc;
/// # fn demo(fabric: &dyn dmkit_fabric::Fabric, layout: &dmkit_runtime::LocalLayout)
/// #     -> Result<(), dmkit_fabric::FabricError> {
/// use dmkit_runtime::{MonotonicClock, RuntimeConfig, Worker};
/// let worker = Worker::builder(fabric)
///     .clock(Arc::new(MonotonicClock))
///     .config(RuntimeConfig::default())
///     .id(0)
///     .tasks(8)
///     .local(layout)
///     .build()?;
/// # Ok(()) }
/// ```
#[must_use = "a builder does nothing until `build`"]
pub struct WorkerBuilder<'a> {
    source: QpSource<'a>,
    clock: Arc<dyn Clock>,
    cfg: RuntimeConfig,
    id: usize,
    tasks: usize,
    local_bytes: usize,
}

enum QpSource<'a> {
    Fabric(&'a dyn Fabric),
    Given(Vec<Box<dyn QueuePair>>),
}

impl<'a> WorkerBuilder<'a> {
    /// The worker's clock (default: [`crate::MonotonicClock`]; the
    /// simulator gives virtual ones).
    pub fn clock(mut self, clock: Arc<dyn Clock>) -> Self {
        self.clock = clock;
        self
    }

    /// The runtime's switches and parameters (default: all on).
    pub fn config(mut self, cfg: RuntimeConfig) -> Self {
        self.cfg = cfg;
        self
    }

    /// The worker's id (seeds its random numbers; default 0).
    pub fn id(mut self, id: usize) -> Self {
        self.id = id;
        self
    }

    /// Room for this many tasks at once (default 1; at most 65,536).
    pub fn tasks(mut self, tasks: usize) -> Self {
        self.tasks = tasks;
        self
    }

    /// Reserves what a data structure declared for each task. A task uses
    /// one structure's scratch memory at a time (it is scratch: nothing in
    /// it outlives an operation), so the layouts of several structures
    /// share the same bytes: each task gets the largest.
    pub fn local(mut self, layout: &LocalLayout) -> Self {
        self.local_bytes = self.local_bytes.max(layout.bytes());
        self
    }

    /// Reserves at least `bytes` of local memory per task (tools and tests
    /// that address it by hand).
    pub fn local_bytes(mut self, bytes: usize) -> Self {
        self.local_bytes = self.local_bytes.max(bytes);
        self
    }

    /// Connects (unless the queue pairs were given) and makes the worker.
    ///
    /// # Panics
    /// If the task capacity is 0 or above 65,536 (programmer error).
    pub fn build(self) -> Result<Worker, FabricError> {
        let (qps, rpc) = match self.source {
            QpSource::Given(qps) => (
                qps,
                crate::rpc::RpcState::without(
                    "a worker built on given queue pairs has no RPC channel",
                ),
            ),
            QpSource::Fabric(fabric) => (
                connect_all(fabric, &self.cfg)?,
                crate::rpc::RpcState::connect(fabric),
            ),
        };
        Worker::make(
            qps,
            rpc,
            self.clock,
            self.cfg,
            self.id,
            self.tasks,
            self.local_bytes,
        )
    }
}

/// A queue pair to every memory node of `fabric` under `cfg`'s
/// thread-aware switch.
fn connect_all(
    fabric: &dyn Fabric,
    cfg: &RuntimeConfig,
) -> Result<Vec<Box<dyn QueuePair>>, FabricError> {
    if !cfg.thread_aware && fabric.caps().explicit_doorbells {
        // Without thread-aware allocation a worker still owns its queue
        // pairs, but they land on doorbells by the driver's default
        // round-robin rule, shared with other threads' (SMART §4.1's
        // baseline; the cost is modelled by the backend).
        return fabric
            .nodes()
            .into_iter()
            .map(|n| fabric.connect_as(n, dmkit_fabric::QpPolicy::PerThreadQp))
            .collect();
    }
    if !cfg.thread_aware {
        return Err(FabricError::Connect {
            target: fabric.backend().into(),
            reason: "thread-aware allocation is off: queue pairs shared between workers must be made by the caller \
                     (dmkit_fabric::SharedQp::share) and given to Worker::builder_on"
                .into(),
        });
    }
    fabric
        .nodes()
        .into_iter()
        .map(|n| fabric.connect(n))
        .collect()
}

impl Worker {
    /// A worker with a queue pair to every memory node of `fabric`.
    pub fn builder(fabric: &dyn Fabric) -> WorkerBuilder<'_> {
        Self::builder_from(QpSource::Fabric(fabric))
    }

    /// A worker on queue pairs made by the caller (one per memory node),
    /// e.g. handles of queue pairs shared between workers — the baselines
    /// of SMART §3.1 and `--thread-aware off`.
    pub fn builder_on(qps: Vec<Box<dyn QueuePair>>) -> WorkerBuilder<'static> {
        Self::builder_from(QpSource::Given(qps))
    }

    fn builder_from(source: QpSource<'_>) -> WorkerBuilder<'_> {
        WorkerBuilder {
            source,
            clock: Arc::new(crate::clock::MonotonicClock),
            cfg: RuntimeConfig::default(),
            id: 0,
            tasks: 1,
            local_bytes: 0,
        }
    }

    fn make(
        qps: Vec<Box<dyn QueuePair>>,
        rpc: crate::rpc::RpcState,
        clock: Arc<dyn Clock>,
        cfg: RuntimeConfig,
        id: usize,
        capacity: usize,
        local_bytes: usize,
    ) -> Result<Self, FabricError> {
        assert!(
            capacity > 0 && capacity <= MAX_TASKS,
            "task capacity must be in 1..={MAX_TASKS}"
        );
        let task_bytes = local_bytes.next_multiple_of(64).max(64);
        let local = LocalMem::new(task_bytes * capacity);
        let qps: Vec<WorkerQp> = qps
            .into_iter()
            .map(|mut qp| {
                let lkey = qp.register_local(&local);
                let (node, max_batch) = (qp.node(), qp.caps().max_batch);
                WorkerQp {
                    node,
                    qp,
                    lkey,
                    max_batch,
                }
            })
            .collect();
        let now = clock.now();
        let (tuner, c_max) = match (cfg.throttle, cfg.fixed_c_max) {
            (false, _) => (None, RuntimeConfig::unthrottled()),
            (true, Some(c)) => (None, c),
            (true, None) => {
                let (t, c) = Tuner::new(cfg.tuner.clone(), now, 0);
                (Some(t), c)
            }
        };
        let avoider = cfg
            .conflict_avoid
            .then(|| ConflictAvoider::new(cfg.backoff.clone(), capacity as u32, now));
        let mut routes = Vec::new();
        for (i, q) in qps.iter().enumerate() {
            let n = q.node as usize;
            if routes.len() <= n {
                routes.resize(n + 1, NO_ROUTE);
            }
            assert!(
                routes[n] == NO_ROUTE,
                "two queue pairs to memory node {} given to one worker",
                q.node
            );
            routes[n] = ((i as u64) << 32) | q.lkey as u64;
        }
        let st = State {
            qps,
            routes,
            credits: Credits::new(c_max),
            tuner,
            avoider,
            deferred: VecDeque::new(),
            tasks: Vec::with_capacity(capacity),
            ready: Vec::with_capacity(capacity),
            timers: BinaryHeap::new(),
            completions: Vec::with_capacity(64),
            batch_pool: Vec::new(),
            stats: WorkerStats::default(),
            completed_wrs: 0,
            op_in_use: 0,
            op_waiters: VecDeque::new(),
            rng: crate::rng::Rng::from_state(
                (cfg.seed ^ (id as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15)) | 1,
            ),
            rpc,
        };
        Ok(Self {
            id,
            core: Rc::new(Core {
                clock,
                local,
                task_bytes,
                op_stats: cfg.op_stats,
                st: RefCell::new(st),
            }),
            futures: Vec::with_capacity(capacity),
            wakers: Vec::with_capacity(capacity),
            inbox: Arc::new(Inbox::default()),
            live: 0,
            capacity,
            run_list: Vec::with_capacity(capacity),
            steps: 0,
        })
    }

    /// This worker's id.
    pub fn id(&self) -> usize {
        self.id
    }

    /// Starts a task. `f` receives the task's [`Ctx`]. A finished task's
    /// slot (its id, its slice of local memory) is reused once nothing it
    /// posted is still in flight; its counters keep accumulating.
    ///
    /// # Panics
    /// If every slot of the worker's task capacity is taken (programmer error).
    pub fn spawn<F, Fut>(&mut self, f: F)
    where
        F: FnOnce(Ctx) -> Fut,
        Fut: Future<Output = ()> + 'static,
    {
        let id = {
            let mut st = self.core.st.borrow_mut();
            let free = (0..self.futures.len()).find(|&i| {
                let t = &st.tasks[i];
                self.futures[i].is_none() && t.inflight == 0 && !st.has_pending(i) && !t.op_waiting
            });
            let id = match free {
                Some(i) => {
                    let counters = st.tasks[i].counters;
                    // The old slot's batches are empty: keep them (and
                    // their allocations).
                    let pending = std::mem::take(&mut st.tasks[i].pending);
                    st.tasks[i] = TaskState {
                        alive: true,
                        counters,
                        pending,
                        ..Default::default()
                    };
                    i
                }
                None => {
                    let id = self.futures.len();
                    assert!(
                        id < self.capacity,
                        "worker {} has room for {} tasks",
                        self.id,
                        self.capacity
                    );
                    let pending = (0..st.qps.len()).map(|_| Batch::default()).collect();
                    st.tasks.push(TaskState {
                        alive: true,
                        pending,
                        ..Default::default()
                    });
                    self.futures.push(None);
                    self.wakers.push(Waker::from(Arc::new(TaskWaker {
                        task: id,
                        inbox: self.inbox.clone(),
                    })));
                    id
                }
            };
            st.make_ready(id);
            id
        };
        let ctx = Ctx::new(self.core.clone(), id);
        self.futures[id] = Some(Box::pin(f(ctx)));
        self.live += 1;
    }

    /// Tasks that have not finished.
    pub fn live_tasks(&self) -> usize {
        self.live
    }

    /// Hints the CPU to load the worker's shared state (a scheduler that
    /// knows which worker it steps next calls this, then
    /// [`Worker::prefetch_tasks`] a little later, while it steps another).
    pub fn prefetch_core(&self) {
        use dmkit_fabric::hint::{prefetch, prefetch_all};
        prefetch_all(&*self.core);
        prefetch(&self.futures[..]);
        prefetch(&self.wakers[..]);
    }

    /// Hints the CPU to load the tasks' state and futures (once the
    /// worker's shared state is cached: see [`Worker::prefetch_core`]).
    pub fn prefetch_tasks(&self) {
        use dmkit_fabric::hint::{prefetch, prefetch_all};
        let Ok(st) = self.core.st.try_borrow() else {
            return;
        };
        prefetch_all(&st.tasks[..]);
        prefetch(&st.routes[..]);
        prefetch(&st.qps[..]);
        for f in self.futures.iter().flatten() {
            prefetch(&**f);
        }
    }

    /// One scheduling round; returns how many tasks were polled.
    pub fn step(&mut self) -> usize {
        self.steps = self.steps.wrapping_add(1);
        {
            let mut st = self.core.st.borrow_mut();
            st.poll_cqs();
            st.flush_deferred();
            // (Only while calls are out: a worker that makes none polls
            // nothing, which keeps the simulator's figures as they were.)
            if st.rpc.outstanding > 0 {
                let clock = &self.core.clock;
                st.poll_rpc(|| clock.now());
            }
            // Reading the clock costs as much as a small verb on shm (perf):
            // read it when a timer is pending, else every CLOCK_EVERY steps
            // (the tuner's and the avoider's periods are milliseconds).
            if !st.timers.is_empty() || self.steps.is_multiple_of(CLOCK_EVERY) {
                let now = self.core.clock.now();
                st.fire_timers(now);
                st.adapt(now);
            }
            // A plain load first: the swap is a locked instruction, paid
            // every step for what is almost never set.
            if self.inbox.any.load(Ordering::Relaxed)
                && self.inbox.any.swap(false, Ordering::AcqRel)
            {
                let mut inbox = self.inbox.tasks.lock().unwrap_or_else(|p| p.into_inner());
                for t in inbox.drain(..) {
                    st.make_ready(t);
                }
            }
            std::mem::swap(&mut self.run_list, &mut st.ready);
            for &t in &self.run_list {
                st.tasks[t].queued = false;
            }
        }
        let polled = self.run_list.len();
        for i in 0..polled {
            let t = self.run_list[i];
            let Some(fut) = self.futures[t].as_mut() else {
                continue;
            };
            let mut cx = Context::from_waker(&self.wakers[t]);
            if fut.as_mut().poll(&mut cx).is_ready() {
                self.futures[t] = None;
                self.live -= 1;
                self.core.st.borrow_mut().tasks[t].alive = false;
            }
        }
        self.run_list.clear();
        polled
    }

    /// Whether some task is ready to run (for an external scheduler: step
    /// again at once instead of waiting for a completion or a timer).
    pub fn has_ready(&self) -> bool {
        !self.core.st.borrow().ready.is_empty() || self.inbox.any.load(Ordering::Acquire)
    }

    /// Earliest pending timer, if any (for an external scheduler).
    pub fn next_timer(&self) -> Option<Nanos> {
        self.core
            .st
            .borrow()
            .timers
            .peek()
            .map(|Reverse((t, _))| *t)
    }

    /// Steps until every task has finished (busy polling, as SMART's
    /// dedicated polling coroutine does).
    pub fn run(&mut self) {
        while self.live > 0 {
            if self.step() == 0 {
                std::hint::spin_loop();
            }
        }
    }

    /// A snapshot of this worker's statistics.
    pub fn stats(&self) -> WorkerStats {
        let st = self.core.st.borrow();
        let mut s = st.stats.clone();
        s.workers = 1;
        // Counters live per task (so operation scopes can attribute them);
        // the worker's are their sum.
        s.counters = Counters::default();
        for t in &st.tasks {
            s.counters.merge(&t.counters);
        }
        s.completed_wrs = st.completed_wrs;
        s.c_max = vec![st.credits.c_max()];
        s.task_limit = vec![st.avoider.as_ref().map_or(u32::MAX, |a| a.c_max())];
        s.t_max = vec![st.avoider.as_ref().map_or(0, |a| a.t_max())];
        s
    }

    /// Batches kept for reuse (bounded; for tests of the recycling).
    #[doc(hidden)]
    pub fn pooled_batches(&self) -> usize {
        self.core.st.borrow().batch_pool.len()
    }

    /// Current credit state `(C_max, available)` (for tests and tools).
    pub fn credits(&self) -> (u32, i64) {
        let st = self.core.st.borrow();
        (st.credits.c_max(), st.credits.available())
    }
}

impl Drop for Worker {
    fn drop(&mut self) {
        // Drain what is still in flight so no completion refers to memory of
        // a worker that no longer exists (the queue pairs keep LocalMem alive,
        // but tasks' results would be lost silently otherwise).
        self.futures.clear();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn wr_id_round_trips() {
        for (t, k, s) in [
            (0, 0, 0),
            (65535, (1 << 24) - 1, (1 << 24) - 1),
            (7, 12345, 16),
        ] {
            assert_eq!(split_wr_id(wr_id(t, k, s)), (t, k, s));
        }
    }
}
