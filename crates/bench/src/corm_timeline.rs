//! `dmkit bench corm --timeline`: one client's read throughput over time
//! before, during and after a compaction of a fragmented CoRM store, on
//! shm ("CoRM: Compactable Remote Memory over RDMA", SIGMOD'21, §4.3.2,
//! Fig. 16; the simulator's version is `sim reproduce corm-fig16`).
//!
//! An embedded node's RPC workers serve the store (`workers` of them). A
//! loader (eight tasks in flight) allocates `objects` objects of `size`
//! bytes and frees three of four at random (the paper's setting: 8 M
//! objects of 32 B), leaving the store fragmented.
//! Then one client reads the kept objects in order, again and again, and
//! counts completed reads per `bucket`: with `read = direct`, DirectReads
//! corrected by ScanRead when an object moved (the paper's "scan-read
//! client"); with `read = rpc`, RPC reads the node corrects. At
//! `compact_at` another client asks for a compaction of every class and
//! waits for it (the leader merges without breaks, as the paper's run:
//! `merges_per_step = 0`), merging away at most `compact_blocks` source
//! blocks ([`paper_blocks`] scales the paper's 5,794 blocks of 8 M objects
//! to the store, so a phase compacts the same share of it). The run ends
//! at `duration`. With `pin`, the client runs on one CPU and the node's
//! workers (the leader among them) on the others.
//!
//! Reported: the series (Mops per bucket), the compaction's span and
//! blocks, the client's throughput before, during and after it, the
//! longest time without a completed read (unavailability), and the direct
//! reads that found their object moved. The JSON carries the series as
//! figure rows, so `dmkit plot` draws it.

use std::cell::RefCell;
use std::rc::Rc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use dmkit_corm::{sync, CormClient, CormError};
use dmkit_fabric::shm::ShmFabric;
use dmkit_fabric::{Fabric, RpcChannel};
use dmkit_memnode::corm::{CompactionReport, Correction, ObjPtr, Op, Policy, Reply, StoreConfig};
use dmkit_runtime::{Ctx, Local, RuntimeConfig, Worker};
use serde::Serialize;

use crate::corm_bench::{self, ReadPath, BLOCK};
use crate::micro::BenchError;

/// What to run.
#[derive(Debug, Clone)]
pub struct TimelineConfig {
    /// How the client reads.
    pub read: ReadPath,
    /// Pointer correction on the node's RPC path.
    pub correction: Correction,
    /// Objects loaded (a quarter is kept).
    pub objects: usize,
    /// Payload bytes of each object.
    pub size: u32,
    /// The node's RPC workers (the store's workers).
    pub workers: usize,
    /// Length of a bucket of the series.
    pub bucket: Duration,
    /// When the compaction is asked for, from the start of the reads.
    pub compact_at: Duration,
    /// Length of the run, from the start of the reads.
    pub duration: Duration,
    /// Seed (which objects are freed, the store's ids).
    pub seed: u64,
    /// The shm latency model's round trip of every verb and RPC, or none.
    pub rtt: Option<Duration>,
    /// Source blocks the compaction merges away at most (`None`: all it
    /// can; the paper's run freed 5,794 blocks of a store of 8 M objects,
    /// [`paper_blocks`]).
    pub compact_blocks: Option<usize>,
    /// The client on its own CPU, the node's workers (the compaction's
    /// leader among them) on the others ([`crate::pin`]).
    pub pin: bool,
}

/// Objects the paper's Fig. 16 store was loaded with (CoRM §4.3.2).
pub const PAPER_OBJECTS: usize = 8_000_000;

/// Blocks the paper's compaction freed in that store (Fig. 16's caption).
pub const PAPER_BLOCKS: usize = 5_794;

/// Indirect pointers the paper's scan-read client corrected (§4.3.2): a
/// share of `PAPER_OBJECTS / 4` kept objects of about 3.9 %.
pub const PAPER_CORRECTED: usize = 77_000;

/// The bound on merged blocks that compacts the same share of a store of
/// `objects` objects as the paper's run did of its 8 M (at least one).
pub fn paper_blocks(objects: usize) -> usize {
    ((objects as u128 * PAPER_BLOCKS as u128 / PAPER_OBJECTS as u128) as usize).max(1)
}

/// One point of a series, as `sim reproduce` figures carry them.
#[derive(Debug, Clone, Serialize)]
pub struct Row {
    /// The series' name.
    pub series: String,
    /// Milliseconds since the reads started.
    pub x: f64,
    /// Throughput over the bucket.
    pub value: f64,
    /// `Mops`.
    pub unit: String,
    /// No published value (the paper's Fig. 16 is on other hardware).
    pub published: Option<f64>,
}

/// What a timeline run measured.
#[derive(Debug, Clone, Serialize)]
pub struct TimelineResult {
    /// `corm-timeline` (so `dmkit plot` draws the rows).
    pub figure: String,
    /// `shm`.
    pub profile: String,
    /// The x axis of the rows.
    pub x_label: String,
    /// `shm`.
    pub backend: String,
    /// `direct` (DirectRead, ScanRead on a moved object) or `rpc`.
    pub read: String,
    /// `scan` or `message`.
    pub correction: String,
    /// Objects loaded.
    pub objects: usize,
    /// Objects kept (and read).
    pub kept: usize,
    /// Payload bytes per object.
    pub size: u32,
    /// The node's RPC workers.
    pub workers: usize,
    /// The bound on the compaction's merged blocks (`None`: none).
    pub compact_blocks: Option<usize>,
    /// Objects the compaction moved over objects kept: the share of the
    /// client's pointers it made indirect (the paper's run: 77,000 of
    /// 2 M, 0.039).
    pub moved_fraction: f64,
    /// Where the threads ran.
    pub pinning: crate::pin::Pinning,
    /// The machine's load averages when the run ended (1, 5, 15 minutes).
    pub load_average: Option<[f64; 3]>,
    /// Seconds loading and fragmenting the store took (before the reads).
    pub load_seconds: f64,
    /// Bucket length (ms).
    pub bucket_ms: f64,
    /// Length of the run (ms).
    pub duration_ms: f64,
    /// When the compaction was asked for (ms).
    pub compaction_started_ms: f64,
    /// When it was answered (ms).
    pub compaction_ended_ms: f64,
    /// What it did.
    pub compaction: CompactionReport,
    /// Active memory before and after the compaction (bytes).
    pub active_bytes_before: u64,
    /// Active memory after it.
    pub active_bytes_after: u64,
    /// Reads completed in the run.
    pub reads: u64,
    /// Throughput before the compaction (Mops).
    pub before_mops: f64,
    /// During it (the buckets it overlaps).
    pub during_mops: f64,
    /// After it.
    pub after_mops: f64,
    /// during / before.
    pub during_over_before: f64,
    /// The longest run of buckets without a completed read (ms).
    pub longest_gap_ms: f64,
    /// Direct reads that found their object moved (corrected by ScanRead).
    pub failed_direct_reads: u64,
    /// Where the time of each phase went (the client's CPU share, its
    /// reads per CPU second, its scan reads and retries).
    pub phases: Phases,
    /// The series: Mops per bucket.
    pub rows: Vec<Row>,
    /// Wall-clock seconds the run took.
    pub wall_seconds: f64,
}

/// The client's phases: before, during and after the compaction.
#[derive(Debug, Clone, Serialize)]
pub struct Phases {
    /// Before the compaction was asked for.
    pub before: Phase,
    /// The buckets the compaction overlaps.
    pub during: Phase,
    /// After it was answered.
    pub after: Phase,
}

/// What the reading client did in one phase: enough to tell a loss of
/// CPU (the machine's other threads, the compaction's leader among them,
/// ran instead of the client) from a loss of work (each read costing more:
/// scan reads of moved objects, retries of locked ones).
#[derive(Debug, Clone, Serialize)]
pub struct Phase {
    /// Length (ms).
    pub ms: f64,
    /// Reads completed.
    pub reads: u64,
    /// The client thread's CPU time over the phase's wall time (1: it ran
    /// throughout).
    pub cpu_share: f64,
    /// Reads per microsecond of the client's CPU time (Mops per core the
    /// client had): the phase's cost per read, whatever its CPU share.
    pub mops_per_cpu: f64,
    /// DirectReads that found their object moved (each then a ScanRead).
    pub scan_reads: u64,
    /// Reads retried after a backoff (a locked or torn object).
    pub retries: u64,
}

/// The reading client's tallies per bucket.
#[derive(Debug, Clone)]
struct Buckets {
    reads: Vec<u64>,
    scans: Vec<u64>,
    retries: Vec<u64>,
    /// The client thread's CPU time (ns).
    cpu_ns: Vec<u64>,
}

impl Buckets {
    fn new(n: usize) -> Self {
        Self {
            reads: vec![0; n],
            scans: vec![0; n],
            retries: vec![0; n],
            cpu_ns: vec![0; n],
        }
    }

    /// A read completed in bucket `b` (past the end: not counted).
    fn count(&mut self, b: usize, scanned: bool, retries: u64) {
        if b < self.reads.len() {
            self.reads[b] += 1;
            self.scans[b] += u64::from(scanned);
            self.retries[b] += retries;
        }
    }

    /// The client's CPU time while its reads were in bucket `b`.
    fn charge_cpu(&mut self, b: usize, ns: u64) {
        if let Some(x) = self.cpu_ns.get_mut(b) {
            *x += ns;
        }
    }

    /// Buckets `[a, b)` of `bucket_ns` each, summed.
    fn phase(&self, a: usize, b: usize, bucket_ns: f64) -> Phase {
        let (a, b) = (a.min(self.reads.len()), b.min(self.reads.len()).max(a));
        let a = a.min(b);
        let sum = |v: &[u64]| v[a..b].iter().sum::<u64>();
        let (reads, cpu) = (sum(&self.reads), sum(&self.cpu_ns));
        let wall = (b - a) as f64 * bucket_ns;
        Phase {
            ms: wall / 1e6,
            reads,
            cpu_share: if wall > 0.0 { cpu as f64 / wall } else { 0.0 },
            mops_per_cpu: if cpu > 0 {
                reads as f64 / cpu as f64 * 1e3
            } else {
                0.0
            },
            scan_reads: sum(&self.scans),
            retries: sum(&self.retries),
        }
    }
}

/// This thread's CPU time (ns; 0 if the clock cannot be read).
pub(crate) fn thread_cpu_ns() -> u64 {
    nix::time::clock_gettime(nix::time::ClockId::CLOCK_THREAD_CPUTIME_ID)
        .map(|t| t.tv_sec() as u64 * 1_000_000_000 + t.tv_nsec() as u64)
        .unwrap_or(0)
}

fn mix(mut x: u64) -> u64 {
    x = (x ^ (x >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    x ^ (x >> 31)
}

fn run_err(what: &str, e: impl std::fmt::Display) -> BenchError {
    BenchError::Run(format!("{what}: {e}"))
}

fn op(ch: &mut dyn RpcChannel, o: Op) -> Result<Reply, BenchError> {
    sync::op(ch, o).map_err(|e| run_err("a CoRM call", e))
}

fn active_bytes(ch: &mut dyn RpcChannel) -> Result<u64, BenchError> {
    sync::stats(ch)
        .map(|s| s.active_bytes)
        .map_err(|e| run_err("the CoRM store's statistics", e))
}

/// Mops over buckets `[a, b)`.
fn rate(v: &[u64], a: usize, b: usize, bucket_ns: f64) -> f64 {
    let (a, b) = (a.min(v.len()), b.min(v.len()));
    if b <= a {
        return 0.0;
    }
    v[a..b].iter().sum::<u64>() as f64 / ((b - a) as f64 * bucket_ns) * 1e3
}

/// The longest run of empty buckets.
fn longest_gap(v: &[u64]) -> usize {
    let (mut best, mut cur) = (0, 0);
    for &c in v {
        cur = if c == 0 { cur + 1 } else { 0 };
        best = best.max(cur);
    }
    best
}

fn check(cfg: &TimelineConfig) -> Result<(), BenchError> {
    let bad = |m: &str| Err(BenchError::Config(m.into()));
    if cfg.objects < 4 || cfg.workers == 0 || cfg.size == 0 {
        return bad("--timeline needs --objects of at least 4, --size and --workers of at least 1");
    }
    if cfg.bucket.is_zero() || cfg.compact_at >= cfg.duration {
        return bad(
            "--timeline needs a --bucket above zero and --compact-at before the end of --duration",
        );
    }
    if cfg.duration.as_nanos() / cfg.bucket.as_nanos() > 1_000_000 {
        return bad("--timeline: more than a million buckets; raise --bucket");
    }
    Ok(())
}

/// Runs the timeline on an embedded shm node.
pub fn run(cfg: &TimelineConfig) -> Result<TimelineResult, BenchError> {
    check(cfg)?;
    let wall = Instant::now();
    let space = corm_bench::store_space(cfg.objects as u64, cfg.size);
    let base = corm_bench::store_config(space, cfg.seed);
    let (fabric, _store) = corm_bench::embedded_store(
        space,
        cfg.size,
        cfg.workers,
        cfg.rtt,
        StoreConfig {
            correction: cfg.correction,
            policy: Policy {
                merges_per_step: 0,
                max_merges: cfg.compact_blocks.unwrap_or(0),
                ..base.policy
            },
            ..base
        },
    )?;
    // Load (LOADERS tasks in flight), then free three of four at random.
    // The node's workers start with its first channel; placed from then
    // on, the loading (this thread) runs apart from them too.
    let mut ch = fabric.connect_rpc(0)?;
    let mut pinning = crate::pin::Pinning::plan(cfg.pin, 1)?;
    pinning.place_node_workers(cfg.workers)?;
    let _restore = pinning.restore_on_drop();
    pinning.place_client(0)?;
    let kept = load_and_fragment(&fabric, cfg)?;
    let load_seconds = wall.elapsed().as_secs_f64();
    let active_before = active_bytes(&mut *ch)?;
    let bucket_ns = cfg.bucket.as_nanos() as u64;
    let buckets = (cfg.duration.as_nanos() as u64).div_ceil(bucket_ns) as usize;
    let stop = Arc::new(AtomicBool::new(false));
    let t0 = Instant::now();
    let (tally, span, report) = std::thread::scope(|s| {
        let client = {
            let (stop, fabric, kept, pinning) = (stop.clone(), &fabric, kept.clone(), &pinning);
            s.spawn(move || -> Result<Buckets, BenchError> {
                pinning.place_client(0)?;
                let mut w = Worker::builder(fabric)
                    .config(RuntimeConfig {
                        seed: cfg.seed,
                        op_stats: false,
                        ..RuntimeConfig::default()
                    })
                    .tasks(1)
                    .local_bytes(BLOCK as usize)
                    .build()?;
                let tally = Rc::new(RefCell::new(Buckets::new(buckets)));
                let error: Rc<RefCell<Option<CormError>>> = Rc::default();
                let (t2, e2, read) = (tally.clone(), error.clone(), cfg.read);
                w.spawn(move |ctx: Ctx| async move {
                    let r = async {
                        let c = CormClient::connect(&ctx, 0).await?;
                        let buf = Local::at(0, BLOCK as usize);
                        let mut mine: Vec<ObjPtr> = kept;
                        // The bucket of the last read, and the thread's CPU
                        // time when it began (charged to it when it ends).
                        let (mut cur, mut cpu) = (0usize, thread_cpu_ns());
                        'run: loop {
                            for q in mine.iter_mut() {
                                if stop.load(Ordering::Relaxed) {
                                    break 'run;
                                }
                                let (mut scanned, retries) = (false, ctx.retries());
                                match read {
                                    ReadPath::Rpc => drop(c.read(&ctx, q).await?),
                                    ReadPath::Direct => match c.direct_read(&ctx, *q, buf).await {
                                        Ok(_) => {}
                                        Err(CormError::Moved) => {
                                            scanned = true;
                                            c.scan_moved(&ctx, q, buf).await?;
                                        }
                                        Err(e) => return Err(e),
                                    },
                                }
                                let b = (t0.elapsed().as_nanos() as u64 / bucket_ns) as usize;
                                let mut t = t2.borrow_mut();
                                if b != cur {
                                    let now = thread_cpu_ns();
                                    t.charge_cpu(cur, now - cpu);
                                    (cur, cpu) = (b, now);
                                }
                                t.count(b, scanned, ctx.retries() - retries);
                            }
                        }
                        t2.borrow_mut().charge_cpu(cur, thread_cpu_ns() - cpu);
                        Ok::<(), CormError>(())
                    }
                    .await;
                    if let Err(e) = r {
                        *e2.borrow_mut() = Some(e);
                    }
                });
                while w.live_tasks() > 0 {
                    if w.step() == 0 {
                        std::hint::spin_loop();
                    }
                }
                if let Some(e) = error.borrow_mut().take() {
                    return Err(run_err("the reading client", e));
                }
                let t = tally.borrow().clone();
                Ok(t)
            })
        };
        // The compaction, asked for at `compact_at` and waited for.
        let compacted = (|| {
            pinning.place_with_node()?;
            std::thread::sleep(cfg.compact_at.saturating_sub(t0.elapsed()));
            let started = t0.elapsed();
            let r = match op(&mut *ch, Op::Compact(None))? {
                Reply::Compacted(r) => r,
                other => return Err(run_err("compact", format!("{other:?}"))),
            };
            Ok(((started, t0.elapsed()), r))
        })();
        std::thread::sleep(cfg.duration.saturating_sub(t0.elapsed()));
        stop.store(true, Ordering::Relaxed);
        let tally = client
            .join()
            .map_err(|_| BenchError::Run("the reading client panicked".into()))??;
        let (span, report) = compacted?;
        Ok::<_, BenchError>((tally, span, report))
    })?;
    let active_after = active_bytes(&mut *ch)?;
    let bns = bucket_ns as f64;
    let a = (span.0.as_nanos() as u64 / bucket_ns) as usize;
    let b = (span.1.as_nanos() as u64).div_ceil(bucket_ns) as usize;
    let counts = &tally.reads;
    let (before, during, after) = (
        rate(counts, 0, a, bns),
        rate(counts, a, b, bns),
        rate(counts, b, buckets, bns),
    );
    let phases = [(0, a), (a, b), (b, buckets)].map(|(x, y)| tally.phase(x, y, bns));
    let series = format!(
        "{} client ({} correction)",
        match cfg.read {
            ReadPath::Direct => "scan-read",
            ReadPath::Rpc => "RPC",
        },
        correction_name(cfg.correction)
    );
    let ms = |d: Duration| d.as_secs_f64() * 1e3;
    Ok(TimelineResult {
        figure: "corm-timeline".into(),
        profile: "shm".into(),
        x_label: "ms since the reads started".into(),
        backend: "shm".into(),
        read: cfg.read.name().into(),
        correction: correction_name(cfg.correction).into(),
        objects: cfg.objects,
        kept: kept.len(),
        size: cfg.size,
        workers: cfg.workers,
        compact_blocks: cfg.compact_blocks,
        moved_fraction: report.objects_moved as f64 / kept.len() as f64,
        pinning,
        load_average: crate::pin::load_average(),
        load_seconds,
        bucket_ms: ms(cfg.bucket),
        duration_ms: ms(cfg.duration),
        compaction_started_ms: ms(span.0),
        compaction_ended_ms: ms(span.1),
        compaction: report,
        active_bytes_before: active_before,
        active_bytes_after: active_after,
        reads: counts.iter().sum(),
        before_mops: before,
        during_mops: during,
        after_mops: after,
        during_over_before: if before > 0.0 { during / before } else { 0.0 },
        longest_gap_ms: longest_gap(counts) as f64 * ms(cfg.bucket),
        failed_direct_reads: tally.scans.iter().sum(),
        phases: Phases {
            before: phases[0].clone(),
            during: phases[1].clone(),
            after: phases[2].clone(),
        },
        rows: counts
            .iter()
            .enumerate()
            .map(|(i, &c)| Row {
                series: series.clone(),
                x: i as f64 * ms(cfg.bucket),
                value: c as f64 / bns * 1e3,
                unit: "Mops".into(),
                published: None,
            })
            .collect(),
        wall_seconds: wall.elapsed().as_secs_f64(),
    })
}

/// Loads `cfg.objects` objects with [`corm_bench::LOADERS`] tasks in
/// flight, frees three of four at random (`cfg.seed`), and returns the
/// kept ones' pointers.
fn load_and_fragment(fabric: &ShmFabric, cfg: &TimelineConfig) -> Result<Vec<ObjPtr>, BenchError> {
    let all = {
        let mut w = Worker::builder(fabric)
            .config(RuntimeConfig {
                seed: cfg.seed,
                op_stats: false,
                ..RuntimeConfig::default()
            })
            .tasks(corm_bench::LOADERS)
            .build()?;
        let (p, e) = (Rc::default(), Rc::default());
        corm_bench::spawn_loader(&mut w, cfg.objects, cfg.size, Rc::clone(&p), Rc::clone(&e));
        w.run();
        corm_bench::loaded(&p, &e)?
    };
    let (mut kept, mut freed) = (Vec::new(), Vec::new());
    for (i, &p) in all.iter().enumerate() {
        if mix(cfg.seed ^ i as u64).is_multiple_of(4) {
            kept.push(p);
        } else {
            freed.push(p);
        }
    }
    corm_bench::free_all(fabric, cfg.seed, &freed)?;
    if kept.is_empty() {
        return Err(BenchError::Config("no object kept: raise --objects".into()));
    }
    Ok(kept)
}

fn correction_name(c: Correction) -> &'static str {
    match c {
        Correction::Scan => "scan",
        Correction::Message => "message",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn gaps_and_rates() {
        assert_eq!(longest_gap(&[3, 0, 0, 1, 0]), 2);
        assert_eq!(longest_gap(&[1, 1]), 0);
        assert!((rate(&[10, 20, 30], 1, 3, 1_000.0) - 25.0).abs() < 1e-9);
        assert_eq!(rate(&[1], 2, 3, 1_000.0), 0.0);
    }

    /// A short run: the compaction happens inside it, returns memory, and
    /// the client reads throughout, every bucket counted.
    #[test]
    fn a_short_timeline_sees_the_compaction() {
        let cfg = TimelineConfig {
            read: ReadPath::Direct,
            correction: Correction::Scan,
            objects: 4000,
            size: 32,
            workers: 1,
            bucket: Duration::from_millis(5),
            compact_at: Duration::from_millis(50),
            duration: Duration::from_millis(200),
            seed: 3,
            rtt: None,
            compact_blocks: None,
            pin: false,
        };
        let r = run(&cfg).unwrap();
        assert!(r.compaction.blocks_freed > 0, "{:?}", r.compaction);
        assert!(r.active_bytes_after < r.active_bytes_before);
        assert!(r.compaction_started_ms >= 50.0);
        assert!(r.compaction_ended_ms >= r.compaction_started_ms);
        assert_eq!(r.rows.len(), 40);
        assert!(
            r.reads > 0 && r.before_mops > 0.0 && r.after_mops > 0.0,
            "{r:?}"
        );
        assert!(r.failed_direct_reads > 0, "moved objects were read");
    }

    /// A bounded compaction merges exactly its bound; pinning is applied
    /// where the process has two CPUs, reported either way.
    #[test]
    fn a_bounded_pinned_timeline() {
        let cfg = TimelineConfig {
            read: ReadPath::Direct,
            correction: Correction::Scan,
            objects: 8000,
            size: 32,
            workers: 1,
            bucket: Duration::from_millis(5),
            compact_at: Duration::from_millis(30),
            duration: Duration::from_millis(100),
            seed: 5,
            rtt: None,
            compact_blocks: Some(5),
            pin: true,
        };
        let cpus = crate::pin::allowed_cpus().unwrap().len();
        let r = run(&cfg).unwrap();
        assert_eq!(r.compaction.blocks_freed, 5, "{:?}", r.compaction);
        assert!(r.moved_fraction < 0.1, "{}", r.moved_fraction);
        assert_eq!(
            crate::pin::allowed_cpus().unwrap().len(),
            cpus,
            "the calling thread got its CPUs back"
        );
        assert_eq!(r.pinning.applied, cpus >= 2, "{:?}", r.pinning);
        if r.pinning.applied {
            // Its node's one worker (other tests' nodes may run beside it).
            assert!(r.pinning.node_threads >= 1, "{:?}", r.pinning);
        }
        assert_eq!(paper_blocks(PAPER_OBJECTS), PAPER_BLOCKS);
        assert_eq!(paper_blocks(10), 1);
    }
}
