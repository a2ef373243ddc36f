//! `dmkit bench corm`: YCSB-style object reads and writes on a CoRM store
//! (CoRM, SIGMOD'21, §4.2, Fig. 12), reads one-sided (`direct`: DirectRead,
//! with ScanRead as the correction of a failed one) or through RPC
//! (`rpc`); writes always through RPC.
//!
//! The store runs on an embedded shm node whose RPC workers serve it
//! (one store worker each). A loader allocates and writes `objects`
//! objects of `size` bytes; then each client thread (a runtime worker with
//! `coros` tasks) picks objects (uniformly, or by YCSB's scrambled
//! zipfian of skew `zipf`) and reads or writes them in a closed loop. Operations that end inside the measured window
//! count; latencies go into an HDR histogram. A direct read that finds
//! another object at the pointer's offset (the object moved) counts as a
//! failed direct read and is retried as a scan read, which corrects the
//! task's copy of the pointer.
//!
//! The simulator is not supported yet: its modelled cores do not run a
//! service's background work, which CoRM's workers need.

use std::cell::{Cell, RefCell};
use std::rc::Rc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use dmkit_corm::{CormClient, CormError};
use dmkit_fabric::shm::{ShmConfig, ShmFabric};
use dmkit_memnode::corm::class::Strategy;
use dmkit_memnode::corm::service::CormService;
use dmkit_memnode::corm::{ObjPtr, Policy, StoreConfig};
use dmkit_memnode::NodeConfig;
use dmkit_runtime::{Ctx, Local, RuntimeConfig, Worker};
use hdrhistogram::Histogram;
use serde::Serialize;

use crate::micro::BenchError;
use crate::rng::Rng;
use crate::ycsb::{fnv64, Zipfian};

/// How reads go.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReadPath {
    /// One-sided READ of the object (DirectRead; ScanRead when it moved).
    Direct,
    /// RPC to the node's workers.
    Rpc,
}

impl ReadPath {
    /// `direct` or `rpc`.
    pub fn name(self) -> &'static str {
        match self {
            ReadPath::Direct => "direct",
            ReadPath::Rpc => "rpc",
        }
    }
}

/// What to run.
#[derive(Debug, Clone)]
pub struct CormBenchConfig {
    /// How reads go.
    pub read: ReadPath,
    /// Percent of operations that are reads (50, 95, 100).
    pub read_percent: u32,
    /// Objects in the store.
    pub objects: usize,
    /// Payload bytes of each object.
    pub size: u32,
    /// Zipfian skew of the key choice (YCSB's scrambled zipfian; 0 =
    /// uniform).
    pub zipf: f64,
    /// Client threads.
    pub threads: usize,
    /// Tasks per client thread.
    pub coros: usize,
    /// The node's RPC workers (the store's workers).
    pub workers: usize,
    /// Measured window.
    pub duration: Duration,
    /// Time before the window.
    pub warmup: Duration,
    /// Seed.
    pub seed: u64,
}

/// What a run measured.
#[derive(Debug, Clone, Serialize)]
pub struct CormBenchResult {
    /// `direct` or `rpc`.
    pub read: String,
    /// `R:W` percentages.
    pub workload: String,
    /// Objects in the store.
    pub objects: usize,
    /// Payload bytes per object.
    pub size: u32,
    /// Zipfian skew (0 = uniform).
    pub zipf: f64,
    /// Client threads.
    pub threads: usize,
    /// Tasks per thread.
    pub coros: usize,
    /// The node's RPC workers.
    pub workers: usize,
    /// Operations completed in the window.
    pub ops: u64,
    /// Length of the window.
    pub seconds: f64,
    /// Millions of operations per second.
    pub mops: f64,
    /// Median latency of an operation (µs).
    pub p50_us: f64,
    /// 99th-percentile latency (µs).
    pub p99_us: f64,
    /// Direct reads per second that found the object moved (and were
    /// corrected by a scan read).
    pub failed_direct_reads_per_s: f64,
    /// Wall-clock seconds the run took.
    pub wall_seconds: f64,
}

fn histogram() -> Histogram<u64> {
    Histogram::new_with_bounds(1, 100_000_000_000, 3).expect("valid bounds")
}

/// A 64-bit mixer (splitmix64's finaliser): the tasks' key choice.
fn mix(mut x: u64) -> u64 {
    x = (x ^ (x >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    x ^ (x >> 31)
}

fn value(tag: u64, len: usize) -> Vec<u8> {
    (0..len).map(|i| (tag as usize + i) as u8).collect()
}

#[derive(Default)]
struct Tally {
    ops: Cell<u64>,
    failed_direct: Cell<u64>,
    errors: RefCell<Vec<String>>,
}

/// Runs the benchmark on an embedded shm node.
pub fn run(cfg: &CormBenchConfig) -> Result<CormBenchResult, BenchError> {
    if cfg.threads == 0 || cfg.coros == 0 || cfg.objects == 0 || cfg.workers == 0 {
        return Err(BenchError::Config(
            "--threads, --coros, --objects and --workers must be at least 1".into(),
        ));
    }
    if !(0.0..1.0).contains(&cfg.zipf) {
        return Err(BenchError::Config("--zipf is a skew in [0, 1)".into()));
    }
    if cfg.read_percent > 100 {
        return Err(BenchError::Config("a read share above 100 %".into()));
    }
    let wall = Instant::now();
    let block = 4096u64;
    let need = (cfg.objects as u64 * (u64::from(cfg.size) + 64) * 2).max(8 << 20);
    let fabric = ShmFabric::embedded(
        ShmConfig {
            rpc_max_message: (cfg.size + 256).max(4096),
            ..Default::default()
        },
        &[NodeConfig {
            size: (2 * need + (16 << 20)).next_multiple_of(1 << 20),
            rpc_workers: cfg.workers,
            ..Default::default()
        }],
    )?;
    let node = fabric
        .embedded_node(0)
        .ok_or_else(|| BenchError::Config("no embedded node".into()))?;
    CormService::register(
        &node,
        StoreConfig {
            block_size: block,
            strategy: Strategy::Corm(16),
            policy: Policy {
                threshold: None,
                ..Policy::default()
            },
            virtual_bytes: need.next_multiple_of(block),
            seed: Some(cfg.seed),
            ..StoreConfig::default()
        },
    )
    .map_err(BenchError::Config)?;
    let rcfg = RuntimeConfig {
        seed: cfg.seed,
        op_stats: false,
        ..RuntimeConfig::default()
    };
    // Load.
    let ptrs: Arc<Mutex<Vec<ObjPtr>>> = Arc::default();
    {
        let mut w = Worker::builder(&fabric)
            .config(rcfg.clone())
            .tasks(1)
            .build()?;
        let (p, n, size) = (ptrs.clone(), cfg.objects, cfg.size);
        let err: Rc<RefCell<Option<CormError>>> = Rc::default();
        let e = err.clone();
        w.spawn(move |ctx: Ctx| async move {
            let r = async {
                let c = CormClient::connect(&ctx, 0).await?;
                for i in 0..n {
                    let mut q = c.alloc(&ctx, size).await?;
                    c.write(&ctx, &mut q, &value(i as u64, size as usize))
                        .await?;
                    p.lock().unwrap_or_else(|x| x.into_inner()).push(q);
                }
                Ok::<(), CormError>(())
            }
            .await;
            if let Err(x) = r {
                *e.borrow_mut() = Some(x);
            }
        });
        w.run();
        let failed = err.borrow_mut().take();
        if let Some(e) = failed {
            return Err(BenchError::Config(format!("loading the store: {e}")));
        }
    }
    let ptrs = Arc::new(ptrs.lock().unwrap_or_else(|x| x.into_inner()).clone());
    let flags = Arc::new((AtomicBool::new(false), AtomicBool::new(false)));
    let merged = Mutex::new((histogram(), 0u64, 0u64, Vec::<String>::new()));
    std::thread::scope(|s| -> Result<(), BenchError> {
        let mut handles = Vec::new();
        for id in 0..cfg.threads {
            let (flags, rcfg, merged, ptrs, fabric) =
                (flags.clone(), rcfg.clone(), &merged, ptrs.clone(), &fabric);
            handles.push(s.spawn(move || -> Result<(), BenchError> {
                let mut w = Worker::builder(fabric)
                    .config(rcfg)
                    .id(id)
                    .tasks(cfg.coros)
                    .local_bytes(block as usize)
                    .build()?;
                let hist = Rc::new(RefCell::new(histogram()));
                let tally = Rc::new(Tally::default());
                for t in 0..cfg.coros {
                    let (hist, tally, flags, ptrs) =
                        (hist.clone(), tally.clone(), flags.clone(), ptrs.clone());
                    let cfg = cfg.clone();
                    w.spawn(move |ctx: Ctx| async move {
                        let fail = |e: CormError| tally.errors.borrow_mut().push(e.to_string());
                        let c = match CormClient::connect(&ctx, 0).await {
                            Ok(c) => c,
                            Err(e) => return fail(e),
                        };
                        let mut mine: Vec<ObjPtr> = ptrs.to_vec();
                        let buf = Local::at(0, block as usize);
                        let mut seed = mix(cfg.seed ^ ((id as u64) << 32) ^ t as u64);
                        let payload = value(seed, cfg.size as usize);
                        let mut rng = Rng::new(seed);
                        let zipf =
                            (cfg.zipf > 0.0).then(|| Zipfian::new(mine.len() as u64, cfg.zipf));
                        while !flags.1.load(Ordering::Relaxed) {
                            seed = mix(seed.wrapping_add(0x9e37_79b9_7f4a_7c15));
                            let k = match &zipf {
                                // Scrambled: hot ranks spread over the objects.
                                Some(z) => (fnv64(z.next(&mut rng)) % mine.len() as u64) as usize,
                                None => (seed % mine.len() as u64) as usize,
                            };
                            let read = (seed >> 32) % 100 < u64::from(cfg.read_percent);
                            let t0 = ctx.now();
                            let mut moved = false;
                            let r = if !read {
                                c.write(&ctx, &mut mine[k], &payload).await.map(drop)
                            } else if cfg.read == ReadPath::Rpc {
                                c.read(&ctx, &mut mine[k]).await.map(drop)
                            } else {
                                match c.direct_read(&ctx, mine[k], buf).await {
                                    Err(CormError::Moved) => {
                                        moved = true;
                                        c.scan_read(&ctx, &mut mine[k], buf).await.map(drop)
                                    }
                                    other => other.map(drop),
                                }
                            };
                            let t1 = ctx.now();
                            if let Err(e) = r {
                                return fail(e);
                            }
                            let counting =
                                flags.0.load(Ordering::Relaxed) && !flags.1.load(Ordering::Relaxed);
                            if counting {
                                tally.ops.set(tally.ops.get() + 1);
                                tally
                                    .failed_direct
                                    .set(tally.failed_direct.get() + moved as u64);
                                let _ = hist.borrow_mut().record((t1 - t0).max(1));
                            }
                        }
                    });
                }
                while w.live_tasks() > 0 {
                    if w.step() == 0 {
                        std::hint::spin_loop();
                    }
                }
                let mut m = merged.lock().unwrap_or_else(|p| p.into_inner());
                m.0.add(&*hist.borrow()).expect("same bounds");
                m.1 += tally.ops.get();
                m.2 += tally.failed_direct.get();
                m.3.extend(tally.errors.borrow().iter().cloned());
                Ok(())
            }));
        }
        std::thread::sleep(cfg.warmup);
        flags.0.store(true, Ordering::SeqCst);
        std::thread::sleep(cfg.duration);
        flags.1.store(true, Ordering::SeqCst);
        for h in handles {
            h.join().expect("a client thread panicked")?;
        }
        Ok(())
    })?;
    let (h, ops, failed, errors) = merged.into_inner().unwrap_or_else(|p| p.into_inner());
    if let Some(e) = errors.first() {
        return Err(BenchError::Config(format!(
            "{} operations failed; first: {e}",
            errors.len()
        )));
    }
    let seconds = cfg.duration.as_secs_f64();
    let us = |q: f64| h.value_at_quantile(q) as f64 / 1e3;
    Ok(CormBenchResult {
        read: cfg.read.name().into(),
        workload: format!("{}:{}", cfg.read_percent, 100 - cfg.read_percent),
        objects: cfg.objects,
        size: cfg.size,
        zipf: cfg.zipf,
        threads: cfg.threads,
        coros: cfg.coros,
        workers: cfg.workers,
        ops,
        seconds,
        mops: ops as f64 / seconds / 1e6,
        p50_us: us(0.5),
        p99_us: us(0.99),
        failed_direct_reads_per_s: failed as f64 / seconds,
        wall_seconds: wall.elapsed().as_secs_f64(),
    })
}
