//! The verbs micro-benchmark: each thread owns a queue pair to node 0 and
//! posts batches of one verb at uniformly random 8-byte-aligned addresses of
//! a region, waiting for each batch before posting the next.
//!
//! Before timing, the region is written once (so every page is resident and
//! mapped, as a registered RDMA region would be pinned); the measured phase
//! then touches only memory that exists.
//!
//! Timing follows [`crate::harness`]: every thread sets up, waits at the
//! start barrier, and counts a batch (and its latency, doorbell to last
//! completion) only when it completes inside the one global window that
//! opens `warmup` after the barrier. With `iters` each thread instead runs
//! that many counted requests and the window closes when the last thread
//! finishes (perftest's `-n`).

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use crate::harness::{self, Arrival, Latency, Recorder, Window};

use dmkit_fabric::{
    Batch, Completion, Fabric, FabricError, GlobalAddr, LocalMem, LocalRef, QpPolicy, QueuePair,
    Rkey, SharedQp, SyncQp, VerbKind, WorkRequest,
};
use serde::Serialize;

use crate::rng::Rng;
use dmkit_fabric::RemoteRef;
use dmkit_runtime::Local;

/// What to run.
#[derive(Debug, Clone)]
pub struct MicroConfig {
    /// The verb every request uses.
    pub verb: VerbKind,
    /// Bytes per READ/WRITE (atomics are always 8).
    pub size: usize,
    /// Bytes of the region addresses are drawn from.
    pub region_size: u64,
    /// OS threads, each with its own queue pair (or handle, by `qp_policy`) to
    /// node 0.
    pub threads: usize,
    /// Requests per batch (one doorbell).
    pub batch: usize,
    /// Wall-clock length of the measured window (after the region is
    /// written once; ignored with `iters`).
    pub duration: Duration,
    /// Unmeasured time between the start barrier and the window.
    pub warmup: Duration,
    /// Iteration mode: each thread runs this many counted requests (a
    /// multiple of its batch or depth, rounded up) instead of a timed window.
    pub iters: Option<u64>,
    /// Seed of the address streams (each thread and task derives its own).
    pub seed: u64,
    /// Signal every request, or only the last of each batch (selective
    /// signaling; the rest complete implicitly in queue-pair order).
    pub signal: Signal,
    /// Run through the runtime (tasks, `post`, `sync().await`) instead of
    /// the raw queue-pair loop.
    pub runtime: Option<RuntimeMode>,
    /// How threads map to queue pairs (SMART §3.1, Figure 3a).
    pub qp_policy: QpPolicy,
}

/// One queue pair (or shared-queue-pair handle) per thread, by `policy`.
/// A backend with doorbell registers (the simulator, verbs) makes every
/// policy itself ([`Fabric::connect_as`], costs in its own model); on the
/// others, shared and multiplexed queue pairs are [`SharedQp`] handles (a
/// real lock) and per-thread doorbells are refused.
pub fn make_qps(
    fabric: &dyn Fabric,
    node: dmkit_fabric::NodeId,
    threads: usize,
    policy: QpPolicy,
) -> Result<Vec<Box<dyn QueuePair>>, BenchError> {
    if fabric.caps().explicit_doorbells {
        return Ok((0..threads)
            .map(|_| fabric.connect_as(node, policy))
            .collect::<Result<_, _>>()?);
    }
    let group = match policy {
        QpPolicy::Shared => threads,
        QpPolicy::Multiplexed(n) => n,
        QpPolicy::PerThreadQp => 1,
        QpPolicy::PerThreadDoorbell => {
            return Err(BenchError::Config(format!(
                "--qp-policy per-thread-doorbell: the {} backend has no doorbell registers to bind \
                 (per-thread-qp already shares nothing there; the simulator models doorbells)",
                fabric.backend()
            )));
        }
    };
    let mut out: Vec<Box<dyn QueuePair>> = Vec::with_capacity(threads);
    while out.len() < threads {
        let n = group.min(threads - out.len());
        let qp = fabric.connect(node)?;
        if n == 1 && group == 1 {
            out.push(qp);
        } else {
            out.extend(
                SharedQp::share(qp, n)
                    .into_iter()
                    .map(|h| Box::new(h) as Box<dyn QueuePair>),
            );
        }
    }
    Ok(out)
}

/// The runtime variant of the benchmark.
#[derive(Debug, Clone)]
pub struct RuntimeMode {
    /// Tasks per thread (worker).
    pub coros: usize,
    /// Requests each task posts per round before `sync().await`.
    pub depth: usize,
    /// The runtime's switches and parameters.
    pub cfg: dmkit_runtime::RuntimeConfig,
}

/// Which requests of a batch are signaled.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Signal {
    /// Every request of a batch is signaled: one completion each.
    All,
    /// Only a batch's last request is signaled (selective signaling); the
    /// others complete implicitly in queue-pair order.
    Last,
}

/// Result of one run.
#[derive(Debug, Clone, Serialize)]
pub struct MicroResult {
    /// The fabric backend's name (`shm`, `sim`, `verbs`).
    pub backend: String,
    /// The verb's name (`read`, `write`, `cas`, `masked-cas`, `faa`).
    pub verb: String,
    /// Bytes per request (8 for atomics).
    pub size: usize,
    /// Bytes of the region the addresses were drawn from.
    pub region_size: u64,
    /// OS threads that posted.
    pub threads: usize,
    /// Requests per batch (one doorbell each).
    pub batch: usize,
    /// Which requests were signaled.
    pub signal: Signal,
    /// Thread → queue pair mapping.
    pub qp_policy: String,
    /// "raw" (queue pairs directly) or "runtime" (tasks and sync).
    pub mode: String,
    /// Tasks per thread (runtime mode).
    pub coros: Option<usize>,
    /// Requests per task round (runtime mode).
    pub depth: Option<usize>,
    /// Runtime switches (runtime mode).
    pub thread_aware: Option<bool>,
    /// Adaptive work-request throttling (SMART, ASPLOS'24 §4.2) on or off
    /// (runtime mode).
    pub throttle: Option<bool>,
    /// Conflict avoidance (SMART, ASPLOS'24 §4.3) on or off (runtime mode).
    pub conflict_avoid: Option<bool>,
    /// Final C_max per worker (runtime mode with throttling; u32::MAX = unlimited).
    pub c_max: Vec<u32>,
    /// Runtime counters summed over workers (runtime mode): round trips,
    /// doorbells, posts deferred by the throttle, failed CAS, retries.
    pub round_trips: Option<u64>,
    /// Posts the throttle deferred for lack of credits.
    pub throttled_posts: Option<u64>,
    /// CAS through `backoff_cas` that failed; 0 here, as the benchmark
    /// issues plain `cas`.
    pub cas_failures: Option<u64>,
    /// Retries the runtime counted ([`dmkit_runtime::Counters::retries`]).
    pub retries: Option<u64>,
    /// Requests completed by all threads, counted per finished batch (raw) or
    /// task round (runtime).
    pub ops: u64,
    /// Wall-clock seconds of the measured window (see [`crate::harness`]).
    pub seconds: f64,
    /// Unmeasured time before it.
    pub warmup_s: f64,
    /// Iteration mode: requests per thread.
    pub iters: Option<u64>,
    /// Million operations per second, all threads.
    pub mops: f64,
    /// Payload bandwidth: operations × bytes each × 8 / seconds, in
    /// 10^9 bits per second (perftest's Gb/s).
    pub gbps: f64,
    /// `mops / threads`.
    pub mops_per_thread: f64,
    /// Latency of each request, doorbell to its batch's last completion
    /// (a task round's `post` to `sync` in runtime mode), microseconds.
    #[serde(flatten)]
    pub latency: Latency,
    /// Ctrl-C ended the window early: the figures are of the shortened
    /// window.
    pub interrupted: bool,
    /// Set when more polling threads ran than the process has cores.
    pub oversubscribed: Option<String>,
    /// Operations of each thread.
    pub per_thread_ops: Vec<u64>,
    /// Doorbells rung (batches posted), all threads.
    pub doorbells: u64,
    /// Payload bytes READ, all threads.
    pub bytes_read: u64,
    /// Payload bytes written, all threads.
    pub bytes_written: u64,
}

/// perftest's `-a`: every power of two from 2 B to 8 MiB.
pub fn all_sizes() -> Vec<usize> {
    (1..=23).map(|i| 1usize << i).collect()
}

impl MicroResult {
    /// The columns of [`MicroResult::csv_row`] (perftest's and the table's
    /// figures, one line per run).
    pub const CSV_HEADER: &'static str = "backend,mode,verb,size,region_size,threads,batch,\
signal,qp_policy,coros,depth,iters,ops,seconds,warmup_s,mops,gbps,mops_per_thread,\
min_us,avg_us,p50_us,p95_us,p99_us,p999_us,max_us,interrupted,oversubscribed";

    /// This run as one CSV line of [`MicroResult::CSV_HEADER`]'s columns
    /// (no field contains a comma; an absent value is empty; rates and
    /// seconds at full precision, latencies in µs to the nanosecond).
    pub fn csv_row(&self) -> String {
        let opt = |v: Option<u64>| v.map_or(String::new(), |v| v.to_string());
        let l = &self.latency;
        format!(
            "{},{},{},{},{},{},{},{},{},{},{},{},{},{},{},{},{},{},{:.3},{:.3},{:.3},{:.3},{:.3},{:.3},{:.3},{},{}",
            self.backend,
            self.mode,
            self.verb,
            self.size,
            self.region_size,
            self.threads,
            self.batch,
            match self.signal {
                Signal::All => "all",
                Signal::Last => "last",
            },
            self.qp_policy.replace(',', ";"),
            opt(self.coros.map(|c| c as u64)),
            opt(self.depth.map(|d| d as u64)),
            opt(self.iters),
            self.ops,
            self.seconds,
            self.warmup_s,
            self.mops,
            self.gbps,
            self.mops_per_thread,
            l.min_us,
            l.avg_us,
            l.p50_us,
            l.p95_us,
            l.p99_us,
            l.p999_us,
            l.max_us,
            self.interrupted,
            self.oversubscribed.is_some(),
        )
    }
}

/// A per-thread progress counter on its own cache lines.
#[repr(align(128))]
#[derive(Default)]
pub struct Padded(pub AtomicU64);

/// Why a benchmark could not run.
#[derive(Debug, thiserror::Error)]
pub enum BenchError {
    /// The configuration cannot run (e.g. a per-thread-doorbell policy on a
    /// backend without doorbell registers); the message says what to change.
    #[error("invalid benchmark configuration: {0}")]
    Config(String),
    /// The run failed after it started (an operation's error, a lost
    /// connection, an index that could not be created or removed).
    #[error("benchmark run failed: {0}")]
    Run(String),
    /// The fabric failed (setup or a verb).
    #[error(transparent)]
    Fabric(#[from] FabricError),
}

/// Validates a configuration; the message says what to change.
pub fn check(cfg: &MicroConfig, fabric: &dyn Fabric) -> Result<(), String> {
    validate(cfg)?;
    let size = op_size(cfg);
    let caps = fabric.caps();
    if cfg.batch > caps.max_batch {
        return Err(format!(
            "--batch {} exceeds the backend's limit of {}",
            cfg.batch, caps.max_batch
        ));
    }
    if size > caps.max_message {
        return Err(format!(
            "--size {} exceeds the backend's message limit of {}",
            size, caps.max_message
        ));
    }
    Ok(())
}

/// Most tasks one runtime worker schedules (task numbers are 16 bits in
/// its work-request ids).
pub const MAX_TASKS: usize = 65_535;

/// What [`check`] can say without a fabric: run it before anything is
/// allocated. Messages name the flag.
pub fn validate(cfg: &MicroConfig) -> Result<(), String> {
    let size = op_size(cfg);
    if size == 0 {
        return Err("--size must be at least 1 byte".into());
    }
    if cfg.verb.is_atomic() && cfg.size != 8 {
        return Err(format!(
            "atomics move 8 bytes; --size {} is not allowed with --verb {}",
            cfg.size,
            cfg.verb.name()
        ));
    }
    if cfg.region_size < size as u64 || cfg.region_size < 8 {
        return Err(format!(
            "--region-size {} is smaller than one request of {} B",
            cfg.region_size, size
        ));
    }
    if u32::try_from(size).is_err() {
        return Err(format!("--size {size} must be below 4 GiB"));
    }
    if cfg.threads == 0 || cfg.batch == 0 {
        return Err("--threads and --batch must be at least 1".into());
    }
    if cfg.threads > MAX_TASKS {
        return Err(format!(
            "--threads {} is more than {MAX_TASKS} threads",
            cfg.threads
        ));
    }
    if cfg.iters == Some(0) {
        return Err("--iters must be at least 1".into());
    }
    if cfg.iters.is_none() && cfg.duration.is_zero() {
        return Err("--duration must be longer than 0s (or give --iters)".into());
    }
    if let Some(rt) = &cfg.runtime {
        let shares = matches!(cfg.qp_policy, QpPolicy::Shared | QpPolicy::Multiplexed(_));
        if rt.cfg.thread_aware == shares {
            return Err(format!(
                "--thread-aware {} contradicts --qp-policy {}: thread-aware allocation means per-thread queue pairs",
                if rt.cfg.thread_aware { "on" } else { "off" },
                cfg.qp_policy
            ));
        }
        if rt.coros == 0 || rt.depth == 0 {
            return Err("--coros and --depth must be at least 1".into());
        }
        if rt.coros > MAX_TASKS {
            return Err(format!(
                "--coros {} is more than a worker's {MAX_TASKS} tasks",
                rt.coros
            ));
        }
        if cfg.batch != 1 {
            return Err("--batch applies to the raw loop; with --coros use --depth (requests per task round)".into());
        }
        if cfg.signal != Signal::All {
            return Err("--signal applies to the raw loop; the runtime signals each post's last request itself".into());
        }
    }
    Ok(())
}

fn op_size(cfg: &MicroConfig) -> usize {
    if cfg.verb.is_atomic() {
        8
    } else {
        cfg.size
    }
}

/// Runs the benchmark. `progress(elapsed, ops_so_far)` is called about ten
/// times a second from the calling thread.
pub fn run(
    fabric: &dyn Fabric,
    cfg: &MicroConfig,
    mut progress: impl FnMut(Duration, u64),
) -> Result<MicroResult, BenchError> {
    check(cfg, fabric).map_err(BenchError::Config)?;
    let node = *fabric
        .nodes()
        .first()
        .expect("a fabric has at least one node");
    let qps = make_qps(fabric, node, cfg.threads, cfg.qp_policy)?;
    let (base, _, rkey) = fabric.alloc_chunk(node, cfg.region_size, false)?;
    // Free the region on every way out, success or not.
    let result = measure(fabric, cfg, qps, base, rkey, &mut progress);
    let freed = fabric.free_chunk(base);
    let result = result?;
    freed?;
    Ok(result)
}

fn measure(
    fabric: &dyn Fabric,
    cfg: &MicroConfig,
    qps: Vec<Box<dyn QueuePair>>,
    base: GlobalAddr,
    rkey: Rkey,
    progress: &mut impl FnMut(Duration, u64),
) -> Result<MicroResult, BenchError> {
    prefault(fabric, base, rkey, cfg.region_size)?;
    let mut qps = qps.into_iter();
    let counters: Vec<Arc<Padded>> = (0..cfg.threads)
        .map(|_| Arc::new(Padded::default()))
        .collect();
    let window = Arc::new(Window::new(cfg.threads));
    let (timed, outcomes) = std::thread::scope(|s| {
        let handles: Vec<_> = (0..cfg.threads)
            .map(|t| {
                let (counter, window) = (&counters[t], &window);
                let qp = qps.next().expect("one queue pair per thread");
                s.spawn(move || {
                    let mut arrival = Arrival::new(window);
                    let r = match &cfg.runtime {
                        None => worker(qp, cfg, base, rkey, t as u64, &counter.0, &mut arrival),
                        Some(rt) => runtime_worker(
                            qp,
                            cfg,
                            rt,
                            base,
                            rkey,
                            t as u64,
                            counter,
                            (window, &mut arrival),
                        ),
                    };
                    if r.is_err() {
                        window.abort();
                    }
                    r
                })
            })
            .collect();
        let length = if cfg.iters.is_some() {
            None
        } else {
            Some(cfg.duration)
        };
        let timed = harness::coordinate(&window, cfg.warmup, length, |tick| {
            let ops = counters.iter().map(|c| c.0.load(Ordering::Relaxed)).sum();
            progress(tick.measured, ops);
        });
        let outcomes: Vec<_> = handles
            .into_iter()
            .map(|h| h.join().expect("bench worker panicked"))
            .collect();
        (timed, outcomes)
    });
    let mut stats = dmkit_fabric::QpStats::default();
    let mut per_thread_ops = Vec::with_capacity(cfg.threads);
    let mut c_max = Vec::new();
    let mut rt_counters: Option<dmkit_runtime::Counters> = None;
    let mut rec = Recorder::new();
    for o in outcomes {
        let (r, st, rt) = o?;
        per_thread_ops.push(r.ops);
        rec.merge(&r);
        stats.merge(&st);
        if let Some((cm, counters)) = rt {
            c_max.push(cm);
            rt_counters
                .get_or_insert_with(Default::default)
                .merge(&counters);
        }
    }
    let ops = rec.ops;
    let seconds = timed.seconds;
    let rate = |x: f64| if seconds > 0.0 { x / seconds } else { 0.0 };
    let mops = rate(ops as f64) / 1e6;
    Ok(MicroResult {
        backend: fabric.backend().into(),
        verb: cfg.verb.name().into(),
        size: op_size(cfg),
        region_size: cfg.region_size,
        threads: cfg.threads,
        batch: cfg.batch,
        signal: cfg.signal,
        qp_policy: cfg.qp_policy.to_string(),
        mode: if cfg.runtime.is_some() {
            "runtime"
        } else {
            "raw"
        }
        .into(),
        coros: cfg.runtime.as_ref().map(|r| r.coros),
        depth: cfg.runtime.as_ref().map(|r| r.depth),
        thread_aware: cfg.runtime.as_ref().map(|r| r.cfg.thread_aware),
        throttle: cfg.runtime.as_ref().map(|r| r.cfg.throttle),
        conflict_avoid: cfg.runtime.as_ref().map(|r| r.cfg.conflict_avoid),
        c_max,
        round_trips: rt_counters.map(|c| c.round_trips),
        throttled_posts: rt_counters.map(|c| c.throttled_posts),
        cas_failures: rt_counters.map(|c| c.cas_failures),
        retries: rt_counters.map(|c| c.retries),
        ops,
        seconds,
        warmup_s: cfg.warmup.as_secs_f64(),
        iters: cfg.iters,
        mops,
        gbps: rate((ops * op_size(cfg) as u64 * 8) as f64) / 1e9,
        mops_per_thread: mops / cfg.threads as f64,
        latency: Latency::of(&rec.hist),
        interrupted: timed.interrupted,
        oversubscribed: harness::oversubscribed(cfg.threads),
        per_thread_ops,
        doorbells: stats.doorbells,
        bytes_read: stats.bytes_read,
        bytes_written: stats.bytes_written,
    })
}

/// Writes the region once so every page is resident and mapped.
fn prefault(
    fabric: &dyn Fabric,
    base: GlobalAddr,
    rkey: Rkey,
    len: u64,
) -> Result<(), FabricError> {
    let step = (1u64 << 20).min(len);
    let mut q = SyncQp::new(fabric, base.node(), step as usize)?;
    let zeros = vec![0u8; step as usize];
    let mut off = 0;
    while off < len {
        let n = step.min(len - off) as usize;
        q.write(base.add(off), rkey, &zeros[..n])?;
        off += n as u64;
    }
    Ok(())
}

/// Requests a thread runs in iteration mode (`u64::MAX`: timed).
fn quota(cfg: &MicroConfig) -> u64 {
    cfg.iters.unwrap_or(u64::MAX)
}

#[allow(clippy::too_many_arguments)]
fn worker(
    mut qp: Box<dyn QueuePair>,
    cfg: &MicroConfig,
    base: GlobalAddr,
    rkey: Rkey,
    thread: u64,
    counter: &AtomicU64,
    arrival: &mut Arrival<'_>,
) -> Result<WorkerOutcome, BenchError> {
    let size = op_size(cfg);
    let slots = (cfg.region_size - size as u64) / 8 + 1;
    let mut rng = Rng::new(cfg.seed ^ (thread.wrapping_mul(0x9E37_79B9_7F4A_7C15)));
    // One local slot per batch position, 8-byte aligned.
    let stride = (size as u64).next_multiple_of(8);
    let mem = LocalMem::new((stride * cfg.batch as u64) as usize);
    mem.write(0, &vec![0xA5; mem.len()]);
    let lkey = qp.register_local(&mem);
    let mut batch = Batch::with_capacity(cfg.batch);
    let mut done: Vec<Completion> = Vec::with_capacity(cfg.batch);
    let expect = match cfg.signal {
        Signal::All => cfg.batch,
        Signal::Last => 1,
    };
    let mut rec = Recorder::new();
    let quota = quota(cfg);
    let window = arrival.arrive();
    let mut t = harness::now();
    while !window.done(t) && rec.ops < quota {
        for i in 0..cfg.batch as u64 {
            let a = base.add(rng.below(slots) * 8);
            let local = LocalRef::new(lkey, i * stride, size as u32);
            let wr = match cfg.verb {
                VerbKind::Read => batch.read(a, rkey, local),
                VerbKind::Write => batch.write(a, rkey, local),
                VerbKind::Cas => batch.cas(a, rkey, 0, 0),
                VerbKind::MaskedCas => batch.push(WorkRequest::masked_cas(a, rkey, 0, 0, 0, 0)),
                VerbKind::Faa => batch.faa(a, rkey, 1),
            };
            if cfg.signal == Signal::Last && i + 1 < cfg.batch as u64 {
                wr.set_unsignaled();
            }
        }
        qp.post(&mut batch).map_err(FabricError::from)?;
        let mut got = 0;
        while got < expect {
            got += qp.poll(&mut done, expect);
        }
        if let Some(e) = done.iter().find_map(Completion::error) {
            return Err(FabricError::from(e.clone()).into());
        }
        done.clear();
        let end = harness::now();
        if window.counts(end) {
            rec.record(cfg.batch as u64, end - t);
            counter.store(rec.ops, Ordering::Relaxed);
        }
        t = end;
    }
    if cfg.iters.is_some() {
        window.finish(t);
    }
    // The window's share of the queue pair's work: counted batches.
    let bytes = rec.ops * size as u64;
    let st = dmkit_fabric::QpStats {
        doorbells: rec.ops / cfg.batch as u64,
        bytes_read: if cfg.verb == VerbKind::Read { bytes } else { 0 },
        bytes_written: if cfg.verb == VerbKind::Write {
            bytes
        } else {
            0
        },
        ..Default::default()
    };
    drop(qp);
    Ok((rec, st, None))
}

/// One thread of the runtime variant: a worker with `coros` tasks, each
/// queueing `depth` requests, posting and awaiting `sync`.
#[allow(clippy::too_many_arguments)]
fn runtime_worker(
    qp: Box<dyn QueuePair>,
    cfg: &MicroConfig,
    rt: &RuntimeMode,
    base: GlobalAddr,
    rkey: Rkey,
    thread: u64,
    counter: &Arc<Padded>,
    (window, arrival): (&Arc<Window>, &mut Arrival<'_>),
) -> Result<WorkerOutcome, BenchError> {
    use std::cell::RefCell;
    use std::rc::Rc;

    let size = op_size(cfg);
    let stride = size.next_multiple_of(8);
    let rcfg = rt.cfg.clone();
    let clock: std::sync::Arc<dyn dmkit_runtime::Clock> =
        std::sync::Arc::new(dmkit_runtime::MonotonicClock);
    let mut w = dmkit_runtime::Worker::builder_on(vec![qp])
        .clock(clock)
        .config(rcfg)
        .id(thread as usize)
        .tasks(rt.coros)
        .local_bytes((64 << 10).max(stride * rt.depth))
        .build()?;
    let slots = (cfg.region_size - size as u64) / 8 + 1;
    let rec = Rc::new(RefCell::new(Recorder::new()));
    // The runtime counters of the counted rounds only (each round's
    // difference of its task's counters).
    let counted = Rc::new(std::cell::Cell::new(dmkit_runtime::Counters::default()));
    // Iteration mode: requests the thread's tasks have taken from its quota.
    let issued = Rc::new(std::cell::Cell::new(0u64));
    let failure: Rc<RefCell<Option<FabricError>>> = Rc::new(RefCell::new(None));
    let quota = quota(cfg);
    arrival.arrive();
    for task in 0..rt.coros as u64 {
        let (rec, failure, depth, verb) = (rec.clone(), failure.clone(), rt.depth, cfg.verb);
        let (window, counter, issued) = (window.clone(), counter.clone(), issued.clone());
        let counted = counted.clone();
        let mut rng = Rng::new(
            cfg.seed
                ^ thread.wrapping_mul(0x9E37_79B9_7F4A_7C15)
                ^ task.wrapping_mul(0xD1B5_4A32_D192_ED03),
        );
        w.spawn(move |ctx| async move {
            let mut t = harness::now();
            while !window.done(t) {
                // Iteration mode charges a round to the quota when it is
                // posted inside the window, and counts only charged rounds.
                let charged = quota == u64::MAX || window.counts(t);
                if quota != u64::MAX && charged {
                    if issued.get() >= quota {
                        break;
                    }
                    issued.set(issued.get() + depth as u64);
                }
                let before = ctx.counters();
                for j in 0..depth {
                    let a = base.add(rng.below(slots) * 8);
                    match verb {
                        VerbKind::Read => {
                            ctx.read(RemoteRef::new(a, rkey), Local::at(j * stride, size))
                        }
                        VerbKind::Write => {
                            ctx.write(RemoteRef::new(a, rkey), Local::at(j * stride, size))
                        }
                        VerbKind::Cas | VerbKind::MaskedCas => {
                            ctx.cas(RemoteRef::new(a, rkey), 0, 0)
                        }
                        VerbKind::Faa => ctx.faa(RemoteRef::new(a, rkey), 1),
                    };
                }
                ctx.post();
                if let Err(e) = ctx.sync().await {
                    failure.borrow_mut().get_or_insert(e);
                    window.abort();
                    return;
                }
                let end = harness::now();
                if charged && window.counts(end) {
                    let mut r = rec.borrow_mut();
                    r.record(depth as u64, end - t);
                    counter.0.store(r.ops, Ordering::Relaxed);
                    let mut c = counted.get();
                    c.merge(&ctx.counters().since(&before));
                    counted.set(c);
                }
                t = end;
            }
        });
    }
    w.run();
    if cfg.iters.is_some() {
        window.finish(harness::now());
    }
    if let Some(e) = failure.borrow_mut().take() {
        return Err(e.into());
    }
    let s = w.stats();
    let c = counted.get();
    let qs = dmkit_fabric::QpStats {
        doorbells: c.doorbells,
        reads: c.reads,
        writes: c.writes,
        cas: c.cas,
        faa: c.faa,
        bytes_read: c.bytes_read,
        bytes_written: c.bytes_written,
        ..Default::default()
    };
    let rec = rec.borrow().clone();
    Ok((
        rec,
        qs,
        Some((s.c_max.first().copied().unwrap_or(u32::MAX), c)),
    ))
}

/// Operations, queue-pair counters and, in runtime mode, the worker's final
/// C_max and counters.
type WorkerOutcome = (
    Recorder,
    dmkit_fabric::QpStats,
    Option<(u32, dmkit_runtime::Counters)>,
);

#[cfg(test)]
mod tests {
    use super::*;
    use dmkit_fabric::shm::{ShmConfig, ShmFabric};
    use dmkit_fabric::ControlPlane;

    /// An embedded 1 MiB memory node.
    fn small_fabric() -> ShmFabric {
        ShmFabric::one_node(ShmConfig::default(), 1 << 20).unwrap()
    }

    #[test]
    fn runs_every_verb_and_counts_what_it_did() {
        let f = small_fabric();
        for verb in [
            VerbKind::Read,
            VerbKind::Write,
            VerbKind::Cas,
            VerbKind::Faa,
        ] {
            let cfg = MicroConfig {
                verb,
                size: 8,
                region_size: 64 << 10,
                threads: 2,
                batch: 4,
                duration: Duration::from_secs(3600),
                warmup: Duration::ZERO,
                // Iteration mode: a timed window on a machine loaded by the
                // other tests may see no batch complete at all.
                iters: Some(100),
                seed: 1,
                signal: if verb == VerbKind::Write {
                    Signal::Last
                } else {
                    Signal::All
                },
                runtime: None,
                qp_policy: QpPolicy::PerThreadQp,
            };
            let r = run(&f, &cfg, |_, _| {}).unwrap();
            assert_eq!(r.ops, 2 * 100, "{r:?}");
            assert_eq!(r.per_thread_ops.iter().sum::<u64>(), r.ops);
            assert_eq!(r.doorbells * 4, r.ops);
            match verb {
                VerbKind::Read => assert_eq!(r.bytes_read, 8 * r.ops),
                VerbKind::Write => assert_eq!(r.bytes_written, 8 * r.ops),
                _ => {}
            }
        }
        // The chunk was freed each time.
        assert_eq!(f.node_stats(0).unwrap().chunk_bytes, 0);
        let bad = MicroConfig {
            verb: VerbKind::Cas,
            size: 16,
            region_size: 4096,
            threads: 1,
            batch: 1,
            duration: Duration::from_millis(1),
            warmup: Duration::ZERO,
            iters: None,
            seed: 0,
            signal: Signal::All,
            runtime: None,
            qp_policy: QpPolicy::PerThreadQp,
        };
        assert!(check(&bad, &f)
            .unwrap_err()
            .contains("atomics move 8 bytes"));
        let bad = MicroConfig {
            verb: VerbKind::Read,
            batch: 100_000,
            ..bad
        };
        assert!(check(&bad, &f).unwrap_err().contains("--batch"));
    }

    #[test]
    fn runtime_mode_counts_what_its_tasks_did() {
        let f = small_fabric();
        for verb in [VerbKind::Read, VerbKind::Faa] {
            let cfg = MicroConfig {
                verb,
                size: 8,
                region_size: 64 << 10,
                threads: 2,
                batch: 1,
                duration: Duration::from_millis(50),
                warmup: Duration::ZERO,
                iters: None,
                seed: 3,
                signal: Signal::All,
                runtime: Some(RuntimeMode {
                    coros: 4,
                    depth: 3,
                    cfg: dmkit_runtime::RuntimeConfig::default(),
                }),
                qp_policy: QpPolicy::PerThreadQp,
            };
            let r = run(&f, &cfg, |_, _| {}).unwrap();
            assert_eq!(r.mode, "runtime");
            assert!(r.ops > 0 && r.ops % 3 == 0, "{r:?}");
            assert_eq!(r.c_max.len(), 2);
            if verb == VerbKind::Read {
                assert_eq!(r.bytes_read, 8 * r.ops, "{r:?}");
            }
            let bad = MicroConfig {
                batch: 4,
                ..cfg.clone()
            };
            assert!(check(&bad, &f).unwrap_err().contains("--depth"));
        }
        assert_eq!(f.node_stats(0).unwrap().chunk_bytes, 0);
    }

    #[test]
    fn queue_pair_policies() {
        let f = small_fabric();
        let base = MicroConfig {
            verb: VerbKind::Faa,
            size: 8,
            region_size: 64 << 10,
            threads: 3,
            batch: 2,
            duration: Duration::from_secs(3600),
            warmup: Duration::ZERO,
            // Every thread must get its turn (a timed window on a loaded
            // machine may starve one at the shared queue pair's lock).
            iters: Some(200),
            seed: 5,
            signal: Signal::All,
            runtime: None,
            qp_policy: QpPolicy::Shared,
        };
        for policy in [
            QpPolicy::Shared,
            QpPolicy::Multiplexed(2),
            QpPolicy::PerThreadQp,
        ] {
            let r = run(
                &f,
                &MicroConfig {
                    qp_policy: policy,
                    ..base.clone()
                },
                |_, _| {},
            )
            .unwrap();
            assert!(
                r.ops > 0 && r.per_thread_ops.iter().all(|&o| o > 0),
                "{policy}: {r:?}"
            );
            assert_eq!(r.qp_policy, policy.to_string());
            let rt = MicroConfig {
                qp_policy: policy,
                batch: 1,
                runtime: Some(RuntimeMode {
                    coros: 2,
                    depth: 2,
                    cfg: dmkit_runtime::RuntimeConfig {
                        thread_aware: policy == QpPolicy::PerThreadQp,
                        ..Default::default()
                    },
                }),
                ..base.clone()
            };
            assert!(
                run(&f, &rt, |_, _| {}).unwrap().ops > 0,
                "runtime on {policy}"
            );
        }
        let e = run(
            &f,
            &MicroConfig {
                qp_policy: QpPolicy::PerThreadDoorbell,
                ..base.clone()
            },
            |_, _| {},
        )
        .unwrap_err();
        assert!(e.to_string().contains("no doorbell registers"), "{e}");
        assert_eq!(
            "multiplexed:4".parse::<QpPolicy>(),
            Ok(QpPolicy::Multiplexed(4))
        );
        assert!("multiplexed:0".parse::<QpPolicy>().is_err());
        assert!("everything".parse::<QpPolicy>().is_err());
        assert_eq!(
            f.node_stats(0).unwrap().chunk_bytes,
            0,
            "a refused run frees its region"
        );
    }

    /// Far more threads than cores: the window is the one asked for, not
    /// the time the threads took to start, and only operations inside it
    /// count (the old loop counted from each thread's own start).
    #[test]
    fn oversubscribed_threads_count_one_window() {
        let f = small_fabric();
        let threads = 16 * harness::cores();
        let cfg = MicroConfig {
            verb: VerbKind::Read,
            size: 8,
            region_size: 64 << 10,
            threads,
            batch: 1,
            duration: Duration::from_millis(200),
            warmup: Duration::from_millis(20),
            iters: None,
            seed: 1,
            signal: Signal::All,
            runtime: None,
            qp_policy: QpPolicy::PerThreadQp,
        };
        let t0 = std::time::Instant::now();
        let r = run(&f, &cfg, |_, _| {}).unwrap();
        assert!((r.seconds - 0.2).abs() < 1e-6, "{}", r.seconds);
        assert!(t0.elapsed().as_secs_f64() >= r.seconds + r.warmup_s);
        assert_eq!(r.per_thread_ops.iter().sum::<u64>(), r.ops);
        assert!(r.oversubscribed.is_some());
        assert!(r.latency.p50_us > 0.0 && r.latency.max_us >= r.latency.p99_us);
        assert!((r.gbps - r.mops * 64.0 / 1e3).abs() < 1e-9);
    }

    /// Iteration mode runs exactly the asked requests per thread.
    #[test]
    fn iteration_mode_runs_exactly_n_per_thread() {
        let f = small_fabric();
        for runtime in [
            None,
            Some(RuntimeMode {
                coros: 2,
                depth: 1,
                cfg: dmkit_runtime::RuntimeConfig::default(),
            }),
        ] {
            let cfg = MicroConfig {
                verb: VerbKind::Write,
                size: 64,
                region_size: 64 << 10,
                threads: 2,
                batch: 1,
                duration: Duration::from_secs(3600),
                warmup: Duration::ZERO,
                iters: Some(1000),
                seed: 1,
                signal: Signal::All,
                runtime,
                qp_policy: QpPolicy::PerThreadQp,
            };
            let r = run(&f, &cfg, |_, _| {}).unwrap();
            assert_eq!(r.per_thread_ops, vec![1000, 1000], "{r:?}");
            assert!(r.seconds > 0.0 && r.seconds < 60.0, "{}", r.seconds);
        }
    }
}
