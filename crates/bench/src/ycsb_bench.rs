//! The YCSB harness: loads an index, then runs a workload for a duration
//! on T threads (× C tasks for remote indexes) and reports throughput,
//! latency and what each operation cost on the fabric.
//!
//! Indexes:
//! - `race`: [`dmkit_race`] over the runtime (SMART-HT; SMART §5.2, §6.2.1);
//! - `local-hash`: a concurrent in-memory map (`dashmap`) driven by the same
//!   generator in the same process — the side-by-side peer that says what a
//!   local index costs on this machine.
//!
//! Each thread owns one worker (remote indexes) and one index client whose
//! caches persist from the load phase into the run phase, as a long-lived
//! SMART-HT client's would.

use std::cell::{Cell, RefCell};
use std::rc::Rc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Barrier};
use std::time::{Duration, Instant};

use dashmap::DashMap;
use dmkit_fabric::Fabric;
use dmkit_race::{RaceClient, RaceConfig, RaceError, RaceTable};
use dmkit_runtime::{Clock, Counters, MonotonicClock, RuntimeConfig, Worker};
use hdrhistogram::Histogram;
use serde::Serialize;

use crate::micro::BenchError;
use crate::ycsb::{
    default_distribution, key_bytes, Chooser, Distribution, Generator, KeyType, Workload, YcsbOp,
};

/// Which index the harness drives.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum IndexKind {
    Race,
    LocalHash,
}

impl IndexKind {
    pub fn name(self) -> &'static str {
        match self {
            IndexKind::Race => "race",
            IndexKind::LocalHash => "local-hash",
        }
    }

    /// Whether the index runs on the fabric (through the runtime).
    pub fn remote(self) -> bool {
        matches!(self, IndexKind::Race)
    }
}

impl std::str::FromStr for IndexKind {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "race" => Ok(IndexKind::Race),
            "local-hash" => Ok(IndexKind::LocalHash),
            "art" | "local-art" | "btree" => Err(format!(
                "index {s:?} is not built yet (radix tree and B+tree issues); available: race, local-hash"
            )),
            _ => Err(format!("unknown index {s:?}; available: race, local-hash")),
        }
    }
}

/// A YCSB run.
#[derive(Debug, Clone)]
pub struct YcsbConfig {
    pub index: IndexKind,
    pub workload: Workload,
    pub keys: u64,
    pub threads: usize,
    /// Tasks per thread (remote indexes).
    pub coros: usize,
    pub theta: f64,
    /// Key distribution; `None` = the workload's standard one.
    pub distribution: Option<Distribution>,
    pub key_type: KeyType,
    pub value_size: usize,
    pub duration: Duration,
    pub seed: u64,
    pub runtime: RuntimeConfig,
    /// Client cache entries per thread (race).
    pub cache_entries: usize,
}

/// What a run measured. Per-operation figures are over the measured phase
/// (the load itself for `workload load`).
#[derive(Debug, Clone, Serialize)]
pub struct YcsbResult {
    pub backend: String,
    pub index: String,
    pub workload: String,
    pub threads: usize,
    pub coros: usize,
    pub keys: u64,
    pub key_type: String,
    pub value_size: usize,
    pub zipf: f64,
    pub distribution: String,
    pub ops: u64,
    pub seconds: f64,
    pub mops: f64,
    pub p50_us: f64,
    pub p99_us: f64,
    pub round_trips_per_op: f64,
    pub verbs_per_op: f64,
    pub bytes_read_per_op: f64,
    pub bytes_written_per_op: f64,
    pub retries_per_op: f64,
    /// Operations that found nothing to read/update (should be 0 after a
    /// complete load).
    pub misses: u64,
    pub load_seconds: f64,
    pub load_mops: f64,
    /// Runtime switches (remote indexes).
    pub thread_aware: bool,
    pub throttle: bool,
    pub conflict_avoid: bool,
    /// Client cache hit rate of the measured phase (race).
    pub cache_hit_rate: Option<f64>,
    /// Subtable splits during load and run (race).
    pub splits: Option<u64>,
}

/// Progress callback: `(phase, done, total)`; `total` is keys for the load
/// and milliseconds for a timed run.
pub type Progress<'a> = &'a (dyn Fn(&'static str, u64, u64) + Sync);

fn validate(cfg: &YcsbConfig) -> Result<(), BenchError> {
    let bad = |s: String| Err(BenchError::Config(s));
    if cfg.keys == 0 || cfg.threads == 0 || cfg.coros == 0 {
        return bad("--keys, --threads and --coros must be at least 1".into());
    }
    if cfg.workload == Workload::E {
        return bad(format!(
            "workload e needs range scans; index {} is a hash table (use an ordered index)",
            cfg.index.name()
        ));
    }
    if !(cfg.theta > 0.0 && cfg.theta < 1.0) {
        return bad(format!("--zipf {} must be in (0, 1)", cfg.theta));
    }
    if cfg.index.remote() && cfg.threads * cfg.coros > 65_535 {
        return bad("more than 65535 tasks".into());
    }
    Ok(())
}

/// Bytes of remote memory a race run needs (for sizing an embedded node).
pub fn race_memory_estimate(cfg: &YcsbConfig) -> u64 {
    let key = match cfg.key_type {
        KeyType::Int => 8,
        KeyType::String => 32,
    };
    let block = (16 + key + cfg.value_size).next_multiple_of(64) as u64;
    let rc = race_config(cfg);
    let sub = dmkit_race::layout::Geometry { groups: rc.groups }.bytes();
    // Keys ×2 (inserts of D, blocks in quarantine), subtables at 2× the
    // initial count (splits), a block chunk per thread and node.
    2 * cfg.keys * block
        + (2 << rc.initial_depth) * sub
        + cfg.threads as u64 * 2 * rc.chunk_bytes
        + (64 << 20)
}

fn race_config(cfg: &YcsbConfig) -> RaceConfig {
    let groups = 4096u64;
    // Start with enough subtables for the keys at ~50 % load; inserts
    // beyond that split online.
    let slots = groups * 21;
    let mut depth = 0;
    while (slots << depth) < cfg.keys * 2 && depth < 12 {
        depth += 1;
    }
    RaceConfig {
        max_key: 32,
        max_value: cfg.value_size.max(8),
        groups,
        initial_depth: depth,
        max_depth: 18,
        cache_entries: cfg.cache_entries,
        seed: cfg.seed,
        ..Default::default()
    }
}

/// Per-thread measurement.
#[derive(Default)]
struct ThreadOut {
    ops: u64,
    misses: u64,
    seconds: f64,
    load_seconds: f64,
    counters: Counters,
    hist: Option<Histogram<u64>>,
    cache: (u64, u64),
    splits: u64,
}

fn histogram() -> Histogram<u64> {
    Histogram::new_with_bounds(1, 100_000_000_000, 2).expect("valid bounds")
}

fn value_for(size: usize, k: u64, version: u64) -> Vec<u8> {
    let mut v = vec![0u8; size];
    let pat = (k ^ version.rotate_left(32)).to_le_bytes();
    for (i, b) in v.iter_mut().enumerate() {
        *b = pat[i % 8];
    }
    v
}

/// Runs the benchmark.
pub fn run(
    fabric: Arc<dyn Fabric>,
    cfg: &YcsbConfig,
    progress: Progress<'_>,
) -> Result<YcsbResult, BenchError> {
    validate(cfg)?;
    let outs = match cfg.index {
        IndexKind::Race => run_race(fabric.clone(), cfg, progress)?,
        IndexKind::LocalHash => run_local(cfg, progress),
    };
    let mut hist = histogram();
    let mut counters = Counters::default();
    let (mut ops, mut misses, mut seconds, mut load_seconds) = (0, 0, 0f64, 0f64);
    let (mut hits, mut lookups, mut splits) = (0, 0, 0);
    for o in &outs {
        ops += o.ops;
        misses += o.misses;
        seconds = seconds.max(o.seconds);
        load_seconds = load_seconds.max(o.load_seconds);
        counters.merge(&o.counters);
        if let Some(h) = &o.hist {
            hist.add(h).expect("same bounds");
        }
        hits += o.cache.0;
        lookups += o.cache.0 + o.cache.1;
        splits += o.splits;
    }
    let per = |v: u64| if ops == 0 { 0.0 } else { v as f64 / ops as f64 };
    let remote = cfg.index.remote();
    Ok(YcsbResult {
        backend: if remote {
            fabric.backend().into()
        } else {
            "local".into()
        },
        index: cfg.index.name().into(),
        workload: format!("{:?}", cfg.workload).to_lowercase(),
        threads: cfg.threads,
        coros: if remote { cfg.coros } else { 1 },
        keys: cfg.keys,
        key_type: format!("{:?}", cfg.key_type).to_lowercase(),
        value_size: cfg.value_size,
        zipf: cfg.theta,
        distribution: format!(
            "{:?}",
            cfg.distribution
                .unwrap_or(default_distribution(cfg.workload))
        )
        .to_lowercase(),
        ops,
        seconds,
        mops: if seconds > 0.0 {
            ops as f64 / seconds / 1e6
        } else {
            0.0
        },
        p50_us: hist.value_at_quantile(0.5) as f64 / 1e3,
        p99_us: hist.value_at_quantile(0.99) as f64 / 1e3,
        round_trips_per_op: per(counters.round_trips),
        verbs_per_op: per(counters.verbs()),
        bytes_read_per_op: per(counters.bytes_read),
        bytes_written_per_op: per(counters.bytes_written),
        retries_per_op: per(counters.retries),
        misses,
        load_seconds,
        load_mops: if load_seconds > 0.0 {
            cfg.keys as f64 / load_seconds / 1e6
        } else {
            0.0
        },
        thread_aware: remote && cfg.runtime.thread_aware,
        throttle: remote && cfg.runtime.throttle,
        conflict_avoid: remote && cfg.runtime.conflict_avoid,
        cache_hit_rate: (remote && lookups > 0).then(|| hits as f64 / lookups as f64),
        splits: remote.then_some(splits),
    })
}

/// The key chooser of a run: the workload's standard one unless overridden.
fn chooser(cfg: &YcsbConfig) -> Chooser {
    Chooser::new(
        cfg.distribution
            .unwrap_or(default_distribution(cfg.workload)),
        cfg.keys,
        cfg.theta,
    )
}

/// Key numbers a loader (one of `loaders`) inserts.
fn load_share(keys: u64, loader: u64, loaders: u64) -> impl Iterator<Item = u64> {
    (loader..keys).step_by(loaders as usize)
}

fn run_race(
    fabric: Arc<dyn Fabric>,
    cfg: &YcsbConfig,
    progress: Progress<'_>,
) -> Result<Vec<ThreadOut>, BenchError> {
    let race_err = |e: RaceError| BenchError::Config(format!("race: {e}"));
    static RUNS: AtomicU64 = AtomicU64::new(0);
    let name = format!(
        "ycsb-{}-{}",
        std::process::id(),
        RUNS.fetch_add(1, Ordering::Relaxed)
    );
    let table = RaceTable::create(fabric.clone(), &name, race_config(cfg)).map_err(race_err)?;
    let r = drive_race(fabric, &table, cfg, progress);
    // Leave nothing behind on a memory node that outlives this run.
    let freed = table.destroy().map_err(race_err);
    let r = r?;
    freed?;
    Ok(r)
}

fn drive_race(
    fabric: Arc<dyn Fabric>,
    table: &Arc<RaceTable>,
    cfg: &YcsbConfig,
    progress: Progress<'_>,
) -> Result<Vec<ThreadOut>, BenchError> {
    let loaded = Arc::new(AtomicU64::new(0));
    let barrier = Barrier::new(cfg.threads);
    let measured = cfg.workload != Workload::Load;
    let chooser = chooser(cfg);
    let clients = (cfg.threads * cfg.coros) as u64;
    let results: Vec<Result<ThreadOut, BenchError>> = std::thread::scope(|s| {
        let hs: Vec<_> = (0..cfg.threads)
            .map(|ti| {
                let (fabric, loaded, barrier, chooser) = (&fabric, &loaded, &barrier, &chooser);
                s.spawn(move || -> Result<ThreadOut, BenchError> {
                    let clock = Arc::new(MonotonicClock);
                    let client = table.client(std::process::id() as u64 * 4096 + ti as u64);
                    let failed: Rc<RefCell<Option<String>>> = Rc::default();
                    let inserted = Rc::new(Cell::new(0u64));
                    let mut out = ThreadOut::default();
                    // Load: this thread's tasks insert their share of keys.
                    let t0 = Instant::now();
                    let load_hist = Rc::new(RefCell::new(histogram()));
                    {
                        let mut w = Worker::new(fabric.as_ref(), clock.clone(), cfg.runtime.clone(), ti, cfg.coros)?;
                        for ci in 0..cfg.coros {
                            let (client, failed, loaded, hist, inserted) =
                                (client.clone(), failed.clone(), loaded.clone(), load_hist.clone(), inserted.clone());
                            let loader = (ti * cfg.coros + ci) as u64;
                            let (kt, seed, vs, keys) = (cfg.key_type, cfg.seed, cfg.value_size, cfg.keys);
                            w.spawn(move |ctx| async move {
                                let mut n = 0;
                                for k in load_share(keys, loader, clients) {
                                    let key = key_bytes(kt, k, seed);
                                    let t = ctx.now();
                                    match client.insert(&ctx, &key, &value_for(vs, k, 0)).await {
                                        Ok(true) => {}
                                        Ok(false) => {
                                            *failed.borrow_mut() = Some(format!("load: key number {k} was already present (two key numbers with equal key bytes)"));
                                            return;
                                        }
                                        Err(e) => {
                                            *failed.borrow_mut() = Some(format!("load: {e}"));
                                            return;
                                        }
                                    }
                                    let _ = hist.borrow_mut().record((ctx.now() - t).max(1));
                                    inserted.set(inserted.get() + 1);
                                    n += 1;
                                    if n % 256 == 0 {
                                        loaded.fetch_add(256, Ordering::Relaxed);
                                    }
                                }
                                loaded.fetch_add(n % 256, Ordering::Relaxed);
                            });
                        }
                        let mut last = Instant::now();
                        while w.live_tasks() > 0 {
                            if w.step() == 0 {
                                std::hint::spin_loop();
                            }
                            if ti == 0 && last.elapsed() > Duration::from_millis(100) {
                                last = Instant::now();
                                progress("load", loaded.load(Ordering::Relaxed), cfg.keys);
                            }
                        }
                        if !measured {
                            let s = w.stats();
                            out.counters = s.counters;
                            out.ops = inserted.get();
                        }
                    }
                    out.load_seconds = t0.elapsed().as_secs_f64();
                    let load_failed = failed.borrow_mut().take();
                    // Every thread reaches the barrier, failed or not.
                    barrier.wait();
                    if let Some(e) = load_failed {
                        return Err(BenchError::Config(format!("race: {e}")));
                    }
                    if ti == 0 {
                        progress("load", cfg.keys, cfg.keys);
                    }
                    if !measured {
                        out.seconds = out.load_seconds;
                        out.hist = Some(load_hist.borrow().clone());
                        let c = client.counters();
                        out.cache = (c.cache_hits, c.cache_misses);
                        out.splits = c.splits;
                        return Ok(out);
                    }
                    let before = client.counters();
                    // Run. The harness times each operation itself.
                    let rcfg = RuntimeConfig {
                        op_stats: false,
                        ..cfg.runtime.clone()
                    };
                    let mut w = Worker::new(fabric.as_ref(), clock.clone(), rcfg, ti, cfg.coros)?;
                    let hist = Rc::new(RefCell::new(histogram()));
                    let ops = Rc::new(Cell::new(0u64));
                    let misses = Rc::new(Cell::new(0u64));
                    let start = clock.now();
                    let deadline = start + cfg.duration.as_nanos() as u64;
                    for ci in 0..cfg.coros {
                        let (client, failed, hist, ops, misses) = (client.clone(), failed.clone(), hist.clone(), ops.clone(), misses.clone());
                        let id = (ti * cfg.coros + ci) as u64;
                        let mut gen = Generator::new(cfg.workload, chooser.clone(), cfg.keys, id, clients, cfg.seed);
                        let (kt, seed, vs) = (cfg.key_type, cfg.seed, cfg.value_size);
                        w.spawn(move |ctx| async move {
                            let mut version = 1u64;
                            // One clock read per operation: its end is the next one's start.
                            let mut t = ctx.now();
                            while t < deadline {
                                let op = gen.next_op();
                                let r = race_op(&client, &ctx, op, kt, seed, vs, &mut version).await;
                                match r {
                                    Ok(true) => {}
                                    Ok(false) => misses.set(misses.get() + 1),
                                    Err(e) => {
                                        *failed.borrow_mut() = Some(format!("{op:?}: {e}"));
                                        return;
                                    }
                                }
                                let end = ctx.now();
                                let _ = hist.borrow_mut().record((end - t).max(1));
                                t = end;
                                ops.set(ops.get() + 1);
                            }
                        });
                    }
                    let mut last = Instant::now();
                    while w.live_tasks() > 0 {
                        if w.step() == 0 {
                            std::hint::spin_loop();
                        }
                        if ti == 0 && last.elapsed() > Duration::from_millis(100) {
                            last = Instant::now();
                            let el = (clock.now() - start) / 1_000_000;
                            progress("run", el.min(cfg.duration.as_millis() as u64), cfg.duration.as_millis() as u64);
                        }
                    }
                    out.seconds = (clock.now() - start) as f64 / 1e9;
                    if let Some(e) = failed.borrow_mut().take() {
                        return Err(BenchError::Config(format!("race: {e}")));
                    }
                    out.ops = ops.get();
                    out.misses = misses.get();
                    out.counters = w.stats().counters;
                    out.hist = Some(hist.borrow().clone());
                    let c = client.counters();
                    out.cache = (c.cache_hits - before.cache_hits, c.cache_misses - before.cache_misses);
                    out.splits = c.splits;
                    Ok(out)
                })
            })
            .collect();
        hs.into_iter()
            .map(|h| h.join().expect("benchmark thread panicked"))
            .collect()
    });
    results.into_iter().collect()
}

/// One YCSB operation on race; `Ok(false)` when the key was missing.
async fn race_op(
    c: &RaceClient,
    ctx: &dmkit_runtime::Ctx,
    op: YcsbOp,
    kt: KeyType,
    seed: u64,
    vs: usize,
    version: &mut u64,
) -> Result<bool, RaceError> {
    *version += 1;
    match op {
        YcsbOp::Read(k) => Ok(c.search(ctx, &key_bytes(kt, k, seed)).await?.is_some()),
        YcsbOp::Update(k) => {
            c.update(ctx, &key_bytes(kt, k, seed), &value_for(vs, k, *version))
                .await
        }
        YcsbOp::Insert(k) => {
            c.insert(ctx, &key_bytes(kt, k, seed), &value_for(vs, k, *version))
                .await
        }
        YcsbOp::ReadModifyWrite(k) => {
            let key = key_bytes(kt, k, seed);
            if c.search(ctx, &key).await?.is_none() {
                return Ok(false);
            }
            c.update(ctx, &key, &value_for(vs, k, *version)).await
        }
        YcsbOp::Scan(..) => unreachable!("workload e is refused by validate"),
    }
}

fn run_local(cfg: &YcsbConfig, progress: Progress<'_>) -> Vec<ThreadOut> {
    let map: DashMap<Box<[u8]>, Box<[u8]>> = DashMap::with_capacity(cfg.keys as usize);
    let loaded = AtomicU64::new(0);
    let barrier = Barrier::new(cfg.threads);
    let measured = cfg.workload != Workload::Load;
    let chooser = chooser(cfg);
    let threads = cfg.threads as u64;
    std::thread::scope(|s| {
        let hs: Vec<_> = (0..cfg.threads)
            .map(|ti| {
                let (map, loaded, barrier, chooser) = (&map, &loaded, &barrier, &chooser);
                s.spawn(move || {
                    let mut out = ThreadOut::default();
                    let mut hist = histogram();
                    let t0 = Instant::now();
                    let mut n = 0;
                    for k in load_share(cfg.keys, ti as u64, threads) {
                        let key = key_bytes(cfg.key_type, k, cfg.seed);
                        let t = Instant::now();
                        map.insert(key.into(), value_for(cfg.value_size, k, 0).into());
                        let _ = hist.record((t.elapsed().as_nanos() as u64).max(1));
                        n += 1;
                        if n % 4096 == 0 {
                            loaded.fetch_add(4096, Ordering::Relaxed);
                            if ti == 0 {
                                progress("load", loaded.load(Ordering::Relaxed), cfg.keys);
                            }
                        }
                    }
                    out.load_seconds = t0.elapsed().as_secs_f64();
                    barrier.wait();
                    if !measured {
                        out.ops = n;
                        out.seconds = out.load_seconds;
                        out.hist = Some(hist);
                        return out;
                    }
                    let mut hist = histogram();
                    let mut gen = Generator::new(
                        cfg.workload,
                        chooser.clone(),
                        cfg.keys,
                        ti as u64,
                        threads,
                        cfg.seed,
                    );
                    let start = Instant::now();
                    let mut version = 1u64;
                    let (mut ops, mut misses) = (0u64, 0u64);
                    loop {
                        // Check the clock every 64 operations (as cheap as
                        // the remote tasks' per-operation check, relatively).
                        if ops % 64 == 0 {
                            let el = start.elapsed();
                            if el >= cfg.duration {
                                break;
                            }
                            if ti == 0 && ops % (64 * 1024) == 0 {
                                progress(
                                    "run",
                                    el.as_millis() as u64,
                                    cfg.duration.as_millis() as u64,
                                );
                            }
                        }
                        let op = gen.next_op();
                        version += 1;
                        let t = Instant::now();
                        let hit = match op {
                            YcsbOp::Read(k) => map
                                .get(&key_bytes(cfg.key_type, k, cfg.seed)[..])
                                .map(|v| v.to_vec())
                                .is_some(),
                            YcsbOp::Update(k) => {
                                match map.get_mut(&key_bytes(cfg.key_type, k, cfg.seed)[..]) {
                                    Some(mut v) => {
                                        *v = value_for(cfg.value_size, k, version).into();
                                        true
                                    }
                                    None => false,
                                }
                            }
                            YcsbOp::Insert(k) => map
                                .insert(
                                    key_bytes(cfg.key_type, k, cfg.seed).into(),
                                    value_for(cfg.value_size, k, version).into(),
                                )
                                .is_none(),
                            YcsbOp::ReadModifyWrite(k) => {
                                let key = key_bytes(cfg.key_type, k, cfg.seed);
                                let found = map.get(&key[..]).map(|v| v.to_vec()).is_some();
                                found
                                    && match map.get_mut(&key[..]) {
                                        Some(mut v) => {
                                            *v = value_for(cfg.value_size, k, version).into();
                                            true
                                        }
                                        None => false,
                                    }
                            }
                            YcsbOp::Scan(..) => unreachable!("workload e is refused by validate"),
                        };
                        let _ = hist.record((t.elapsed().as_nanos() as u64).max(1));
                        ops += 1;
                        misses += (!hit) as u64;
                    }
                    out.seconds = start.elapsed().as_secs_f64();
                    out.ops = ops;
                    out.misses = misses;
                    out.hist = Some(hist);
                    out
                })
            })
            .collect();
        hs.into_iter()
            .map(|h| h.join().expect("benchmark thread panicked"))
            .collect()
    })
}
