//! The measurement discipline every benchmark follows, in one place.
//!
//! A benchmark that runs on OS threads against a real clock (`bench micro`,
//! `ycsb`, `rpc`, `corm`, `vector-io`, `io-consolidation` and `atomics` on
//! shm and verbs, and any new one) measures like this ([`run_threads`] does
//! steps 1–3 for a benchmark whose threads each run one runtime worker or
//! loop; [`TaskWindow`] is the window as its tasks see it):
//!
//! 1. **Start barrier.** Every worker sets itself up (queue pairs, local
//!    memory, tasks) and then calls [`Window::arrive`]. Nothing is timed
//!    before the last worker has arrived, so thread creation and setup —
//!    seconds with hundreds of threads on two cores — never count.
//! 2. **One global window.** The coordinator ([`coordinate`], on the
//!    calling thread) opens the window `warmup` after the barrier and
//!    closes it `duration` later, on one clock ([`now`], CLOCK_MONOTONIC,
//!    the runtime's `MonotonicClock`) shared by every thread. Threads do
//!    not keep windows of their own.
//! 3. **Operations count only inside it.** A worker reads the clock when
//!    an operation completes and counts it (and its latency) only if
//!    [`Window::counts`] says that instant lies in the window. Throughput
//!    is the counted operations over the window's length, whatever the
//!    threads did before or after.
//! 4. **Oversubscription is said.** When more polling threads run than
//!    the process has cores ([`oversubscribed`]), the output and the JSON
//!    carry a warning: threads then take turns on a core, and latency
//!    includes the wait for one.
//! 5. **Ctrl-C is a normal end.** [`interrupt`] (called by the CLI's
//!    signal handler) closes the window at once; the benchmark reports what
//!    was counted so far, over the window's shortened length, marked
//!    `interrupted`, and cleans up through its normal path.
//! 6. **Repeats.** `--repeat N` runs the measurement N times; [`Spread`]
//!    gives their mean, standard deviation, minimum and maximum.
//! 7. **Provenance.** Every JSON result carries a [`Provenance`]: dmkit's
//!    version and commit, the full command line, the host (CPU model,
//!    cores, memory), the seed, duration, warm-up and whether it was a
//!    quick run.
//!
//! A worker's loop is then:
//!
//! ```
//! # use dmkit_bench::harness::{self, Window, Recorder};
//! # let window = Window::new(1);
//! # std::thread::scope(|s| {
//! # let w = &window;
//! # s.spawn(move || {
//! let mut rec = Recorder::new();
//! w.arrive();
//! let mut t = harness::now();
//! while !w.done(t) {
//!     // ... one operation ...
//!     let end = harness::now();
//!     if w.counts(end) {
//!         rec.record(1, end - t);
//!     }
//!     t = end;
//! }
//! # });
//! # let timed = harness::coordinate(&window, std::time::Duration::ZERO,
//! #     Some(std::time::Duration::from_millis(5)), |_| {});
//! # assert!(timed.seconds > 0.0);
//! # });
//! ```
//!
//! The simulator keeps its own discipline: its figures run in virtual time
//! on one thread, where one global window is simply `[from, deadline)` of
//! the simulation's clock, and they are deterministic.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Barrier;
use std::time::Duration;

use hdrhistogram::Histogram;
use serde::Serialize;

/// Nanoseconds of CLOCK_MONOTONIC: the clock of every window (the same
/// clock as the runtime's `MonotonicClock`, so tasks compare its readings
/// directly).
pub fn now() -> u64 {
    use dmkit_runtime::Clock;
    dmkit_runtime::MonotonicClock.now()
}

static INTERRUPTED: AtomicBool = AtomicBool::new(false);

/// Asks every running measurement to end now (the CLI's Ctrl-C handler).
pub fn interrupt() {
    INTERRUPTED.store(true, Ordering::SeqCst);
}

/// Whether [`interrupt`] was called.
pub fn interrupted() -> bool {
    INTERRUPTED.load(Ordering::Relaxed)
}

const OPEN: u64 = u64::MAX;

/// One global timed window shared by a benchmark's workers and its
/// coordinator (see the module docs).
pub struct Window {
    barrier: Barrier,
    /// When counting starts / ends ([`now`] ns); `OPEN` until set.
    start: AtomicU64,
    end: AtomicU64,
    /// Set by a worker that failed: the others stop.
    aborted: AtomicBool,
    /// Iteration mode: workers done, and the latest time one finished.
    finished: AtomicU64,
    last_finish: AtomicU64,
    workers: u64,
}

impl Window {
    /// A window for `workers` threads (the coordinator is one more).
    pub fn new(workers: usize) -> Self {
        Self {
            barrier: Barrier::new(workers + 1),
            start: AtomicU64::new(OPEN),
            end: AtomicU64::new(OPEN),
            aborted: AtomicBool::new(false),
            finished: AtomicU64::new(0),
            last_finish: AtomicU64::new(0),
            workers: workers as u64,
        }
    }

    /// Iteration mode: this worker has run its operations, the last of
    /// them ending at `t`. The window closes when every worker finished,
    /// at the latest such `t`.
    pub fn finish(&self, t: u64) {
        self.last_finish.fetch_max(t, Ordering::AcqRel);
        self.finished.fetch_add(1, Ordering::AcqRel);
    }

    /// The start barrier: a worker calls it once, when it is ready.
    /// Returns when every worker and the coordinator have arrived. A
    /// worker that fails before it is ready must still arrive (after
    /// [`Window::abort`]).
    pub fn arrive(&self) {
        self.barrier.wait();
    }

    /// Whether an operation that completed at `t` is counted.
    #[inline]
    pub fn counts(&self, t: u64) -> bool {
        t >= self.start.load(Ordering::Relaxed) && t < self.end.load(Ordering::Relaxed)
    }

    /// Whether a worker should stop (the window closed at `t`, or a
    /// worker failed).
    #[inline]
    pub fn done(&self, t: u64) -> bool {
        t >= self.end.load(Ordering::Relaxed) || self.aborted.load(Ordering::Relaxed)
    }

    /// A worker failed: everyone stops, the window closes now.
    pub fn abort(&self) {
        self.aborted.store(true, Ordering::Relaxed);
        let t = now();
        let _ = self
            .end
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |e| {
                (e > t).then_some(t)
            });
    }

    /// Whether a worker aborted the window.
    pub fn aborted(&self) -> bool {
        self.aborted.load(Ordering::Relaxed)
    }

    /// The window's bounds, once [`coordinate`] set them.
    pub fn bounds(&self) -> (u64, u64) {
        (
            self.start.load(Ordering::Acquire),
            self.end.load(Ordering::Acquire),
        )
    }
}

/// A worker's place at the start barrier: it arrives once it is ready,
/// and if it fails (or panics) before that, dropping it aborts the window
/// and arrives for it, so nobody waits forever.
pub struct Arrival<'a> {
    window: &'a Window,
    arrived: bool,
}

impl<'a> Arrival<'a> {
    /// A place at `window`'s barrier, not yet taken.
    pub fn new(window: &'a Window) -> Self {
        Self {
            window,
            arrived: false,
        }
    }

    /// Ready: waits at the start barrier.
    pub fn arrive(&mut self) -> &'a Window {
        self.arrived = true;
        self.window.arrive();
        self.window
    }
}

impl Drop for Arrival<'_> {
    fn drop(&mut self) {
        if !self.arrived {
            self.window.abort();
            self.window.arrive();
        }
    }
}

/// What the coordinator saw of a window.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Timed {
    /// The window's length: `duration`, or less when interrupted or
    /// aborted (0 when that happened during the warm-up).
    pub seconds: f64,
    /// Ctrl-C ended the window early.
    pub interrupted: bool,
}

/// Where a running window is, for progress bars and status lines.
#[derive(Debug, Clone, Copy)]
pub struct Tick {
    /// Time since the barrier.
    pub elapsed: Duration,
    /// Still warming up.
    pub warming_up: bool,
    /// Time since the window opened (zero during the warm-up).
    pub measured: Duration,
}

/// Coordinates `window` from the calling thread: arrives at the start
/// barrier, opens the window `warmup` later, closes it after `duration`
/// (`None`: when every worker has called [`Window::finish`]; or at
/// Ctrl-C, or when a worker aborts), calling `tick` about ten times a
/// second. Returns once the window is closed; the workers see it closed
/// at their next clock reading.
pub fn coordinate(
    window: &Window,
    warmup: Duration,
    duration: Option<Duration>,
    mut tick: impl FnMut(Tick),
) -> Timed {
    window.arrive();
    let t0 = now();
    let start = t0 + warmup.as_nanos() as u64;
    window.start.store(start, Ordering::Release);
    if let Some(d) = duration {
        // A worker that aborted already closed the window.
        let end = start + d.as_nanos() as u64;
        let _ = window
            .end
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |e| {
                (e == OPEN).then_some(end)
            });
    }
    let mut was_interrupted = false;
    loop {
        let t = now();
        if duration.is_none() && window.finished.load(Ordering::Acquire) == window.workers {
            let last = window.last_finish.load(Ordering::Acquire).max(start);
            let _ = window
                .end
                .fetch_update(Ordering::AcqRel, Ordering::Acquire, |e| {
                    (e > last).then_some(last)
                });
        }
        let end = window.end.load(Ordering::Acquire);
        if t >= end {
            break;
        }
        if interrupted() {
            was_interrupted = true;
            let _ = window
                .end
                .fetch_update(Ordering::AcqRel, Ordering::Acquire, |e| {
                    (e > t).then_some(t)
                });
            break;
        }
        let nap = if duration.is_some() { 100 } else { 1 };
        std::thread::sleep(Duration::from_nanos(end - t).min(Duration::from_millis(nap)));
        let t = now();
        let end = window.end.load(Ordering::Acquire);
        tick(Tick {
            elapsed: Duration::from_nanos(t - t0),
            warming_up: t < start,
            measured: Duration::from_nanos(t.saturating_sub(start).min(end - start)),
        });
    }
    let (start, end) = window.bounds();
    Timed {
        seconds: end.saturating_sub(start) as f64 / 1e9,
        interrupted: was_interrupted,
    }
}

/// Runs a benchmark's `threads` OS threads under one [`Window`], the
/// discipline of the module docs in one call: thread `t` runs
/// `thread(t, window, arrival)`, which sets itself up, calls
/// [`Arrival::arrive`] when ready, then works until [`Window::done`],
/// counting what completes inside the window ([`Window::counts`]). The
/// calling thread coordinates (`warmup`, then `duration`; `tick` about ten
/// times a second). A thread that fails (returns an error, or fails
/// before arriving) closes the window for all. Returns the window and each
/// thread's outcome, in thread order.
pub fn run_threads<R: Send, E: Send>(
    threads: usize,
    warmup: Duration,
    duration: Duration,
    thread: impl Fn(usize, &std::sync::Arc<Window>, &mut Arrival<'_>) -> Result<R, E> + Sync,
    tick: impl FnMut(Tick),
) -> (Timed, Vec<Result<R, E>>) {
    let window = std::sync::Arc::new(Window::new(threads));
    std::thread::scope(|s| {
        let handles: Vec<_> = (0..threads)
            .map(|t| {
                let (window, thread) = (&window, &thread);
                s.spawn(move || {
                    let mut arrival = Arrival::new(window);
                    let r = thread(t, window, &mut arrival);
                    if r.is_err() {
                        window.abort();
                    }
                    r
                })
            })
            .collect();
        let timed = coordinate(&window, warmup, Some(duration), tick);
        let outcomes = handles
            .into_iter()
            .map(|h| h.join().expect("a benchmark thread panicked"))
            .collect();
        (timed, outcomes)
    })
}

/// The window as a runtime task sees it, on its worker's clock
/// (`ctx.now()`): the harness's wall-clock [`Window`] on a real fabric, or
/// `[from, until)` of virtual time on the simulator.
#[derive(Clone)]
pub enum TaskWindow {
    /// Virtual nanoseconds of the simulation.
    Virtual {
        /// Counting starts.
        from: u64,
        /// Counting ends; the tasks stop.
        until: u64,
    },
    /// Virtual nanoseconds of the simulation, an operation counted when it
    /// *ends* in `[from, until)` wherever it started (`bench txn`'s rule:
    /// a transaction counts where it commits, as on a real fabric, so one
    /// that began in the warm-up still counts).
    VirtualEnd {
        /// Counting starts.
        from: u64,
        /// Counting ends; the tasks stop.
        until: u64,
    },
    /// The one global window of [`run_threads`] or [`coordinate`].
    Wall(std::sync::Arc<Window>),
}

impl TaskWindow {
    /// Whether a task should stop at `now`.
    pub fn over(&self, now: u64) -> bool {
        match self {
            TaskWindow::Virtual { until, .. } | TaskWindow::VirtualEnd { until, .. } => {
                now >= *until
            }
            TaskWindow::Wall(w) => w.done(now),
        }
    }

    /// Whether an operation from `t0` to `t1` counts: wholly inside the
    /// virtual window ([`TaskWindow::Virtual`]), or (the harness's rule)
    /// completed inside the window ([`TaskWindow::VirtualEnd`], the
    /// wall-clock [`TaskWindow::Wall`]).
    pub fn counts(&self, t0: u64, t1: u64) -> bool {
        match self {
            TaskWindow::Virtual { from, until } => t0 >= *from && t1 < *until,
            TaskWindow::VirtualEnd { from, until } => (*from..*until).contains(&t1),
            TaskWindow::Wall(w) => w.counts(t1),
        }
    }
}

/// `n` per second over a window of `seconds` (0 for an empty window, not
/// NaN or infinity).
pub fn rate(n: f64, seconds: f64) -> f64 {
    if seconds > 0.0 {
        n / seconds
    } else {
        0.0
    }
}

/// A latency histogram in nanoseconds, 1 ns to 100 s at 2 significant
/// digits (1 % resolution).
pub fn histogram() -> Histogram<u64> {
    Histogram::new_with_bounds(1, 100_000_000_000, 2).expect("valid bounds")
}

/// One worker's counted operations and their latencies.
#[derive(Clone)]
pub struct Recorder {
    /// Operations counted.
    pub ops: u64,
    /// Their latencies, nanoseconds ([`histogram`]'s bounds).
    pub hist: Histogram<u64>,
}

impl Default for Recorder {
    fn default() -> Self {
        Self::new()
    }
}

impl Recorder {
    /// Nothing recorded yet.
    pub fn new() -> Self {
        Self {
            ops: 0,
            hist: histogram(),
        }
    }

    /// `n` operations that completed together after `latency_ns` (one
    /// batch: each of its operations is recorded with its latency).
    #[inline]
    pub fn record(&mut self, n: u64, latency_ns: u64) {
        self.ops += n;
        let _ = self.hist.record_n(latency_ns.max(1), n);
    }

    /// Adds another worker's operations and latencies.
    pub fn merge(&mut self, o: &Recorder) {
        self.ops += o.ops;
        self.hist.add(&o.hist).expect("same bounds");
    }
}

/// Latency percentiles in microseconds (perftest's and YCSB's columns).
#[derive(Debug, Clone, Copy, Default, Serialize, PartialEq)]
pub struct Latency {
    /// Fastest operation.
    pub min_us: f64,
    /// Mean.
    pub avg_us: f64,
    /// Median.
    pub p50_us: f64,
    /// 95th percentile.
    pub p95_us: f64,
    /// 99th percentile.
    pub p99_us: f64,
    /// 99.9th percentile.
    pub p999_us: f64,
    /// Slowest operation.
    pub max_us: f64,
}

impl Latency {
    /// The percentiles of `h` (nanoseconds); all zero when it is empty.
    pub fn of(h: &Histogram<u64>) -> Self {
        if h.is_empty() {
            return Self::default();
        }
        let us = |ns: u64| ns as f64 / 1e3;
        Self {
            min_us: us(h.min()),
            avg_us: h.mean() / 1e3,
            p50_us: us(h.value_at_quantile(0.5)),
            p95_us: us(h.value_at_quantile(0.95)),
            p99_us: us(h.value_at_quantile(0.99)),
            p999_us: us(h.value_at_quantile(0.999)),
            max_us: us(h.max()),
        }
    }
}

/// Mean and spread of repeated measurements.
#[derive(Debug, Clone, Default, Serialize, PartialEq)]
pub struct Spread {
    /// Measurements.
    pub n: usize,
    /// Their mean.
    pub mean: f64,
    /// Sample standard deviation (0 for one value).
    pub stddev: f64,
    /// The smallest.
    pub min: f64,
    /// The largest.
    pub max: f64,
    /// Every measurement, in the order taken.
    pub values: Vec<f64>,
}

impl Spread {
    /// The spread of `values` (all zero when there are none).
    pub fn of(values: &[f64]) -> Self {
        let n = values.len();
        if n == 0 {
            return Self::default();
        }
        let mean = values.iter().sum::<f64>() / n as f64;
        let var = if n > 1 {
            values.iter().map(|v| (v - mean).powi(2)).sum::<f64>() / (n - 1) as f64
        } else {
            0.0
        };
        Self {
            n,
            mean,
            stddev: var.sqrt(),
            min: values.iter().copied().fold(f64::INFINITY, f64::min),
            max: values.iter().copied().fold(f64::NEG_INFINITY, f64::max),
            values: values.to_vec(),
        }
    }
}

/// The cores this process may run on.
pub fn cores() -> usize {
    std::thread::available_parallelism().map_or(1, |n| n.get())
}

/// A warning when `threads` busy-polling threads exceed the cores this
/// process may use (`None` when they fit).
pub fn oversubscribed(threads: usize) -> Option<String> {
    let cores = cores();
    (threads > cores).then(|| {
        format!(
            "{threads} polling threads on {cores} core{}: threads take turns on a core, so \
             latency includes the wait for one and per-thread figures are not those of \
             dedicated cores",
            if cores == 1 { "" } else { "s" }
        )
    })
}

/// The machine a result was measured on.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct Host {
    /// `model name` of /proc/cpuinfo.
    pub cpu_model: String,
    /// Cores this process may use (its affinity mask).
    pub cores: usize,
    /// Logical CPUs online.
    pub cpus: usize,
    /// Physical memory (MemTotal), bytes.
    pub memory_bytes: u64,
    /// What was available when the run started (MemAvailable), bytes.
    pub memory_available_bytes: u64,
    /// The operating system (`linux`).
    pub os: String,
}

fn meminfo(key: &str) -> Option<u64> {
    let text = std::fs::read_to_string("/proc/meminfo").ok()?;
    text.lines()
        .find_map(|l| l.strip_prefix(key)?.strip_prefix(':'))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
        .map(|kib| kib * 1024)
}

/// Memory this machine can give a run now (MemAvailable; `None` where
/// /proc/meminfo is missing).
pub fn available_memory() -> Option<u64> {
    meminfo("MemAvailable")
}

impl Host {
    /// The machine this process runs on.
    pub fn this() -> Self {
        let cpuinfo = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
        let cpu_model = cpuinfo
            .lines()
            .find_map(|l| {
                let (k, v) = l.split_once(':')?;
                (k.trim() == "model name").then(|| v.trim().to_string())
            })
            .unwrap_or_else(|| "unknown".into());
        let cpus = cpuinfo
            .lines()
            .filter(|l| l.starts_with("processor"))
            .count()
            .max(1);
        Self {
            cpu_model,
            cores: cores(),
            cpus,
            memory_bytes: meminfo("MemTotal").unwrap_or(0),
            memory_available_bytes: available_memory().unwrap_or(0),
            os: std::env::consts::OS.into(),
        }
    }
}

/// Where a result comes from: enough to rerun it and to judge it.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct Provenance {
    /// dmkit's version and the commit it was built from (`unknown` when
    /// built outside git; uncommitted changes are not detected).
    pub version: String,
    /// `git rev-parse HEAD` when built (`DMKIT_COMMIT` overrides).
    pub commit: String,
    /// The full command line, as typed.
    pub command: Vec<String>,
    /// The machine.
    pub host: Host,
    /// The seed of the run's random streams.
    pub seed: u64,
    /// The measured window and the warm-up before it, seconds (virtual
    /// seconds on the simulator; 0 where a benchmark has no window).
    pub duration_s: f64,
    /// The warm-up before the window, seconds.
    pub warmup_s: f64,
    /// A quick (smoke) run: fewer points, shorter windows; not for papers.
    pub quick: bool,
    /// Measurements per point (`--repeat`).
    pub repeat: usize,
    /// Seconds since the Unix epoch when the run started.
    pub started_unix_s: u64,
}

impl Provenance {
    /// This process's provenance for a run of `seed`, `duration` after
    /// `warmup`, quick or not (one measurement per point).
    pub fn new(seed: u64, duration: Duration, warmup: Duration, quick: bool) -> Self {
        Self {
            version: env!("CARGO_PKG_VERSION").into(),
            commit: env!("DMKIT_COMMIT").into(),
            command: std::env::args().collect(),
            host: Host::this(),
            seed,
            duration_s: duration.as_secs_f64(),
            warmup_s: warmup.as_secs_f64(),
            quick,
            repeat: 1,
            started_unix_s: std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.as_secs()),
        }
    }

    /// The same with `n` measurements per point.
    pub fn repeat(mut self, n: usize) -> Self {
        self.repeat = n;
        self
    }
}

/// A result with its [`Provenance`] as its first field, every other field
/// as the result serialises it (readers of the older files still find
/// theirs at the top level).
#[derive(Serialize)]
pub struct WithProvenance<'a, T: Serialize> {
    /// Where the result comes from.
    pub provenance: &'a Provenance,
    /// The result's own fields.
    #[serde(flatten)]
    pub result: &'a T,
}

/// `--repeat N`: every measurement, and the spread of their throughput.
#[derive(Debug, Clone, Serialize)]
pub struct Repeated<T: Serialize> {
    /// Mean, standard deviation, minimum and maximum of the runs' Mops.
    pub mops: Spread,
    /// Each run's full result, in order.
    pub runs: Vec<T>,
}

/// Checks before anything is allocated that `bytes` fit in the memory this
/// machine has available now (MemAvailable; no check where that is
/// unknown). The message names `flag`.
pub fn check_memory(flag: &str, bytes: u64) -> Result<(), String> {
    match available_memory() {
        Some(avail) if bytes > avail => Err(format!(
            "{flag}: needs {} but this machine has {} available",
            human_bytes(bytes),
            human_bytes(avail)
        )),
        _ => Ok(()),
    }
}

/// `bytes` in binary units with one decimal (1.5 GiB).
pub fn human_bytes(bytes: u64) -> String {
    const UNITS: [&str; 6] = ["B", "KiB", "MiB", "GiB", "TiB", "PiB"];
    let mut v = bytes as f64;
    let mut u = 0;
    while v >= 1024.0 && u + 1 < UNITS.len() {
        v /= 1024.0;
        u += 1;
    }
    if u == 0 {
        format!("{bytes} B")
    } else {
        format!("{v:.1} {}", UNITS[u])
    }
}

/// Checks before any work that `path` can be written: its directory
/// exists and a file can be created there (a file created by the check
/// is removed again). The message names `flag`.
pub fn check_output(flag: &str, path: &std::path::Path) -> Result<(), String> {
    let existed = path.exists();
    if path.is_dir() {
        return Err(format!("{flag} {}: is a directory", path.display()));
    }
    std::fs::OpenOptions::new()
        .append(true)
        .create(true)
        .open(path)
        .map_err(|e| format!("{flag} {}: cannot write there: {e}", path.display()))?;
    if !existed {
        let _ = std::fs::remove_file(path);
    }
    Ok(())
}

/// Writes `result` with `provenance` as pretty JSON to `path`.
pub fn write_json<T: Serialize>(
    path: &std::path::Path,
    provenance: &Provenance,
    result: &T,
) -> Result<(), String> {
    let text = serde_json::to_string_pretty(&WithProvenance { provenance, result })
        .map_err(|e| format!("writing {}: {e}", path.display()))?;
    std::fs::write(path, text + "\n").map_err(|e| format!("writing {}: {e}", path.display()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicU64;

    /// Workers that start at different times, and many more of them than
    /// cores, still count only inside the one window: the counted rate is
    /// the rate of the window, never the sum of staggered ones.
    #[test]
    fn counts_only_inside_one_window() {
        let threads = 3 * cores() + 2;
        let window = Window::new(threads);
        let before = AtomicU64::new(0);
        let (timed, recs) = std::thread::scope(|s| {
            let hs: Vec<_> = (0..threads)
                .map(|i| {
                    let (w, before) = (&window, &before);
                    s.spawn(move || {
                        // Staggered setup: must not count.
                        std::thread::sleep(Duration::from_millis(5 * i as u64));
                        let mut rec = Recorder::new();
                        w.arrive();
                        let mut t = now();
                        let mut outside = 0;
                        while !w.done(t) {
                            std::thread::sleep(Duration::from_micros(200));
                            let e = now();
                            if w.counts(e) {
                                let (s, end) = w.bounds();
                                assert!(e >= s && e < end);
                                rec.record(1, e - t);
                            } else {
                                outside += 1;
                            }
                            t = e;
                        }
                        before.fetch_add(outside, Ordering::Relaxed);
                        rec
                    })
                })
                .collect();
            let timed = coordinate(
                &window,
                Duration::from_millis(30),
                Some(Duration::from_millis(100)),
                |_| {},
            );
            let recs: Vec<Recorder> = hs.into_iter().map(|h| h.join().unwrap()).collect();
            (timed, recs)
        });
        assert!(!timed.interrupted);
        assert!((timed.seconds - 0.1).abs() < 1e-9, "{timed:?}");
        // The warm-up's operations were seen and not counted.
        assert!(before.load(Ordering::Relaxed) > 0);
        // Each thread sleeps 200 µs per operation: at most 100 ms / 200 µs
        // operations each inside the window.
        for r in &recs {
            assert!(r.ops <= 500, "{}", r.ops);
        }
        let (s, e) = window.bounds();
        assert_eq!(e - s, 100_000_000);
    }

    #[test]
    fn an_aborting_worker_closes_the_window() {
        let window = Window::new(1);
        let timed = std::thread::scope(|s| {
            let w = &window;
            s.spawn(move || {
                w.arrive();
                std::thread::sleep(Duration::from_millis(20));
                w.abort();
            });
            coordinate(w, Duration::ZERO, Some(Duration::from_secs(60)), |_| {})
        });
        assert!(window.aborted());
        assert!(timed.seconds < 10.0, "{timed:?}");
    }

    /// The two virtual rules differ only on an operation that began
    /// before the window: `Virtual` wants it wholly inside, `VirtualEnd`
    /// (bench txn's) counts it where it ends; both stop at `until`.
    #[test]
    fn virtual_windows_count_by_their_rule() {
        let whole = TaskWindow::Virtual {
            from: 100,
            until: 200,
        };
        let by_end = TaskWindow::VirtualEnd {
            from: 100,
            until: 200,
        };
        assert!(!whole.counts(90, 150) && by_end.counts(90, 150));
        assert!(whole.counts(100, 199) && by_end.counts(100, 199));
        assert!(!whole.counts(150, 200) && !by_end.counts(150, 200));
        assert!(!by_end.counts(50, 99));
        assert!(!by_end.over(199) && by_end.over(200) && whole.over(200));
    }

    #[test]
    fn spread_and_latency() {
        let s = Spread::of(&[1.0, 2.0, 3.0]);
        assert_eq!((s.n, s.mean, s.min, s.max), (3, 2.0, 1.0, 3.0));
        assert!((s.stddev - 1.0).abs() < 1e-12);
        assert_eq!(Spread::of(&[5.0]).stddev, 0.0);
        let mut r = Recorder::new();
        for ns in 1..=1000u64 {
            r.record(1, ns * 1000);
        }
        let l = Latency::of(&r.hist);
        assert_eq!(r.ops, 1000);
        assert!((l.p50_us - 500.0).abs() <= 5.0, "{l:?}");
        assert!((l.p99_us - 990.0).abs() <= 10.0, "{l:?}");
        assert!(l.min_us <= 1.0 && l.max_us >= 995.0, "{l:?}");
        assert_eq!(Latency::of(&histogram()), Latency::default());
    }

    #[test]
    fn output_paths_are_checked_before_work() {
        let dir = tempfile_dir();
        let ok = dir.join("r.json");
        check_output("--json", &ok).unwrap();
        assert!(!ok.exists(), "the check leaves nothing behind");
        let e = check_output("--json", &dir.join("missing/r.json")).unwrap_err();
        assert!(e.starts_with("--json ") && e.contains("missing"), "{e}");
        assert!(check_output("--plot", &dir)
            .unwrap_err()
            .contains("directory"));
        let p = Provenance::new(1, Duration::from_secs(1), Duration::ZERO, false);
        write_json(&ok, &p, &Spread::of(&[1.5])).unwrap();
        let text = std::fs::read_to_string(&ok).unwrap();
        assert!(text.starts_with("{\n  \"provenance\": {"), "{text}");
        let v: serde_json::Value = serde_json::from_str(&text).unwrap();
        assert_eq!(v["mean"], 1.5);
        assert_eq!(v["provenance"]["seed"], 1);
        let _ = std::fs::remove_dir_all(&dir);
    }

    fn tempfile_dir() -> std::path::PathBuf {
        let d = std::env::temp_dir().join(format!("dmkit-harness-{}", std::process::id()));
        std::fs::create_dir_all(&d).unwrap();
        d
    }

    #[test]
    fn provenance_names_the_host() {
        let p = Provenance::new(7, Duration::from_secs(1), Duration::ZERO, true);
        assert_eq!(p.seed, 7);
        assert!(p.quick);
        assert!(p.host.cores >= 1 && p.host.memory_bytes > 0, "{p:?}");
        assert!(!p.command.is_empty());
        assert!(!p.commit.is_empty());
        assert!(oversubscribed(1).is_none());
        assert!(oversubscribed(cores() + 1)
            .unwrap()
            .contains("polling threads"));
    }
}
