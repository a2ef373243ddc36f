//! `dmkit bench corm`: YCSB-style object reads and writes on a CoRM store
//! (CoRM, SIGMOD'21, §4.2, Fig. 12), reads one-sided (`direct`: DirectRead,
//! with ScanRead as the correction of a failed one) or through RPC
//! (`rpc`); writes always through RPC.
//!
//! On shm ([`run`]) the store runs on an embedded node whose RPC workers serve it
//! (one store worker each). A loader allocates and writes `objects`
//! objects of `size` bytes; then each client thread (a runtime worker with
//! `coros` tasks) picks objects (uniformly, or by YCSB's scrambled
//! zipfian of skew `zipf`) and reads or writes them in a closed loop. Operations that end inside the measured window
//! count ([`crate::harness`]: a start barrier, one global window after the
//! warm-up); latencies go into an HDR histogram. A direct read that finds
//! another object at the pointer's offset (the object moved) counts as a
//! failed direct read and is retried as a scan read, which corrects the
//! task's copy of the pointer.
//!
//! Against a memory node process ([`run_connected`]: `dmkit memnode
//! --corm`, over shm or verbs) the store is the node's: its workers and
//! policy are the node's flags, the run loads its objects there and frees
//! them when it ends (the node is left as it was found).
//!
//! On the simulator ([`run_sim`]) the node's modelled cores serve the
//! store (and poll its background work); the window is virtual time, and
//! the same seed gives the same result.
//!
//! Every result carries the store's accounting at the end of the window
//! ([`CormBenchResult::store`]: live objects, active and ideal memory,
//! blocks, per-class fragmentation, compactions).

use std::cell::{Cell, RefCell};
use std::rc::Rc;
use std::sync::Arc;
use std::time::{Duration, Instant};

use dmkit_corm::{CormClient, CormError};
use dmkit_fabric::shm::{ShmConfig, ShmFabric};
use dmkit_fabric::Fabric;
use dmkit_memnode::corm::class::Strategy;
use dmkit_memnode::corm::service::CormService;
use dmkit_memnode::corm::{CormStats, ObjPtr, Policy, Store, StoreConfig};
use dmkit_memnode::NodeConfig;
use dmkit_runtime::{Ctx, Local, RuntimeConfig, Worker};
use dmkit_sim::{Sim, SimConfig};
use hdrhistogram::Histogram;
use serde::Serialize;

use crate::harness::{self, TaskWindow};
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
    /// shm: the emulated network round trip of every verb and RPC
    /// (`ShmConfig::rtt`), or none.
    pub rtt: Option<Duration>,
    /// shm with an embedded node: client threads on their own CPUs, the
    /// node's RPC workers on the others ([`crate::pin`]).
    pub pin: bool,
}

/// What a run measured.
#[derive(Debug, Clone, Serialize)]
pub struct CormBenchResult {
    /// `shm` or `sim`.
    pub backend: String,
    /// The simulator's device profile (`None` on shm).
    pub profile: Option<String>,
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
    /// shm: the emulated round trip of every verb and RPC (µs; `None`:
    /// none, or another backend).
    pub rtt_us: Option<f64>,
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
    /// Latency percentiles of the counted operations (min, avg, p50, p95,
    /// p99, p99.9, max), microseconds.
    pub latency: harness::Latency,
    /// Unmeasured time before the window.
    pub warmup_s: f64,
    /// Ctrl-C ended the window early (shm): the figures are of the
    /// shortened window.
    pub interrupted: bool,
    /// Set when more client threads ran than the process has cores (shm).
    pub oversubscribed: Option<String>,
    /// Wall-clock seconds the run took.
    pub wall_seconds: f64,
    /// Requests the node's workers served per second in the window (RPC
    /// reads and writes; direct reads and their scan reads are one-sided).
    pub rpc_requests_per_s: f64,
    /// The client threads' CPU time over their wall time, warm-up and
    /// window (1: each ran throughout; shm, `None` on the simulator).
    pub client_cpu_share: Option<f64>,
    /// The client threads' CPU microseconds per completed operation
    /// (warm-up and window; shm).
    pub client_cpu_us_per_op: Option<f64>,
    /// Where the threads ran (shm with an embedded node; `None` elsewhere).
    pub pinning: Option<crate::pin::Pinning>,
    /// The machine's load averages when the run ended (1, 5, 15 minutes).
    pub load_average: Option<[f64; 3]>,
    /// The store's accounting when the window ended (issue 32 item 5):
    /// live objects and bytes, active memory (`active_bytes`, what the node
    /// holds) beside `ideal_bytes`, blocks, per-class fragmentation
    /// (`classes[].fragmentation_permille`), compactions and what they
    /// moved. With `--connect` it is the node's whole store (other
    /// clients' objects included).
    pub store: CormStats,
}

impl CormBenchResult {
    /// Active memory over what an ideal compactor would hold (1 = none
    /// wasted; 0 for an empty store).
    pub fn active_over_ideal(&self) -> f64 {
        if self.store.ideal_bytes == 0 {
            0.0
        } else {
            self.store.active_bytes as f64 / self.store.ideal_bytes as f64
        }
    }
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
    /// Operations in the window that were RPCs (writes, RPC reads).
    rpcs: Cell<u64>,
    /// Operations completed, warm-up included.
    all_ops: Cell<u64>,
    errors: RefCell<Vec<String>>,
}

/// Bytes of a store's address space for `objects` objects of `size`
/// bytes: twice their slots (header and cache-line versions included),
/// at least 8 MiB, whole blocks. Every `bench corm` mode sizes its store so.
pub(crate) fn store_space(objects: u64, size: u32) -> u64 {
    (objects * (u64::from(size) + 64) * 2)
        .max(8 << 20)
        .next_multiple_of(BLOCK)
}

/// Bytes of memory node for a store of `space` bytes (room for the
/// compaction's destination blocks and the node's own tables).
pub(crate) fn node_bytes(space: u64) -> u64 {
    (2 * space + (16 << 20)).next_multiple_of(1 << 20)
}

/// The store every `bench corm` mode runs: `space` bytes of 4 KiB blocks,
/// CoRM-16 object ids, no fragmentation-threshold trigger (a mode sets the
/// rest of the policy), `seed`'s ids.
pub(crate) fn store_config(space: u64, seed: u64) -> StoreConfig {
    StoreConfig {
        block_size: BLOCK,
        strategy: Strategy::Corm(16),
        policy: Policy {
            threshold: None,
            ..Policy::default()
        },
        virtual_bytes: space,
        seed: Some(seed),
        ..StoreConfig::default()
    }
}

/// An embedded shm node for a store of `space` bytes whose payloads reach
/// `largest` bytes, served by `workers` RPC workers, every verb and RPC
/// delayed by `rtt` (the shm latency model); registers `store` on it.
pub(crate) fn embedded_store(
    space: u64,
    largest: u32,
    workers: usize,
    rtt: Option<Duration>,
    store: StoreConfig,
) -> Result<(ShmFabric, Store), BenchError> {
    let fabric = ShmFabric::embedded(
        ShmConfig {
            rpc_max_message: (largest + 256).max(4096),
            rtt,
            ..Default::default()
        },
        &[NodeConfig {
            size: node_bytes(space),
            rpc_workers: workers,
            ..Default::default()
        }],
    )?;
    let node = fabric
        .embedded_node(0)
        .ok_or_else(|| BenchError::Config("no embedded node".into()))?;
    let store = CormService::register(&node, store).map_err(BenchError::Config)?;
    Ok((fabric, store))
}

/// `--rtt` on the simulator: refused (it is the shm latency model; the
/// simulator times its own network).
pub(crate) fn refuse_rtt_on_sim(rtt: Option<Duration>) -> Result<(), BenchError> {
    match rtt {
        Some(_) => Err(BenchError::Config(
            "--rtt is the shm latency model; the simulator times its own network".into(),
        )),
        None => Ok(()),
    }
}

/// `sim` fitted to a store of `space` bytes served by `workers` of node 0's
/// modelled cores: memory grown to what the store needs, translation
/// pages shrunk to the store's blocks.
pub(crate) fn sim_for_store(mut sim: SimConfig, space: u64, workers: usize) -> SimConfig {
    sim.memory_bytes = sim.memory_bytes.max(node_bytes(space));
    sim.page_size = sim.page_size.min(BLOCK);
    sim.rpc_workers = Some(workers);
    sim
}

/// Registers a store on the simulator's memory node 0.
pub(crate) fn sim_store(sim: &Sim, store: StoreConfig) -> Result<Store, BenchError> {
    let node = sim
        .fabric()
        .memory()
        .embedded_node(0)
        .ok_or_else(|| BenchError::Config("the simulation has no memory node 0".into()))?;
    CormService::register(&node, store).map_err(BenchError::Config)
}

fn space(cfg: &CormBenchConfig) -> u64 {
    store_space(cfg.objects as u64, cfg.size)
}

/// The store's block size (4 KiB, the paper's default).
pub(crate) const BLOCK: u64 = 4096;

/// Spawns the loader's tasks on `w`: `LOADERS` tasks allocate and write
/// the objects, their pointers go to `ptrs` in object order.
pub(crate) fn spawn_loader(
    w: &mut Worker,
    objects: usize,
    size: u32,
    ptrs: Rc<RefCell<Vec<Option<ObjPtr>>>>,
    err: Rc<RefCell<Option<CormError>>>,
) {
    *ptrs.borrow_mut() = vec![None; objects];
    let tasks = LOADERS.min(objects);
    for t in 0..tasks {
        let (p, e, n) = (ptrs.clone(), err.clone(), objects);
        w.spawn(move |ctx: Ctx| async move {
            let r = async {
                let c = CormClient::connect(&ctx, 0).await?;
                for i in (t..n).step_by(tasks) {
                    let mut q = c.alloc(&ctx, size).await?;
                    c.write(&ctx, &mut q, &value(i as u64, size as usize))
                        .await?;
                    p.borrow_mut()[i] = Some(q);
                }
                Ok::<(), CormError>(())
            }
            .await;
            if let Err(x) = r {
                e.borrow_mut().get_or_insert(x);
            }
        });
    }
}

/// Tasks that load the store (one worker).
pub(crate) const LOADERS: usize = 8;

pub(crate) fn loaded(
    ptrs: &RefCell<Vec<Option<ObjPtr>>>,
    err: &RefCell<Option<CormError>>,
) -> Result<Arc<Vec<ObjPtr>>, BenchError> {
    if let Some(e) = err.borrow_mut().take() {
        return Err(BenchError::Config(format!("loading the store: {e}")));
    }
    let v: Option<Vec<ObjPtr>> = ptrs.borrow().iter().copied().collect();
    v.map(Arc::new)
        .ok_or_else(|| BenchError::Config("loading the store: objects missing".into()))
}

/// Spawns client thread `id`'s closed-loop tasks on `w`.
fn spawn_clients(
    w: &mut Worker,
    cfg: &CormBenchConfig,
    id: usize,
    window: TaskWindow,
    ptrs: Arc<Vec<ObjPtr>>,
    hist: Rc<RefCell<Histogram<u64>>>,
    tally: Rc<Tally>,
) {
    for t in 0..cfg.coros {
        let (hist, tally, window, ptrs) =
            (hist.clone(), tally.clone(), window.clone(), ptrs.clone());
        let cfg = cfg.clone();
        w.spawn(move |ctx: Ctx| async move {
            let fail = |e: CormError| tally.errors.borrow_mut().push(e.to_string());
            let c = match CormClient::connect(&ctx, 0).await {
                Ok(c) => c,
                Err(e) => return fail(e),
            };
            let mut mine: Vec<ObjPtr> = ptrs.to_vec();
            let buf = Local::at(0, BLOCK as usize);
            let mut seed = mix(cfg.seed ^ ((id as u64) << 32) ^ t as u64);
            let payload = value(seed, cfg.size as usize);
            let mut rng = Rng::new(seed);
            let zipf = (cfg.zipf > 0.0).then(|| Zipfian::new(mine.len() as u64, cfg.zipf));
            while !window.over(ctx.now()) {
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
                            c.scan_moved(&ctx, &mut mine[k], buf).await.map(drop)
                        }
                        other => other.map(drop),
                    }
                };
                let t1 = ctx.now();
                if let Err(e) = r {
                    return fail(e);
                }
                tally.all_ops.set(tally.all_ops.get() + 1);
                if window.counts(t0, t1) {
                    tally.ops.set(tally.ops.get() + 1);
                    let rpc = !read || cfg.read == ReadPath::Rpc;
                    tally.rpcs.set(tally.rpcs.get() + rpc as u64);
                    tally
                        .failed_direct
                        .set(tally.failed_direct.get() + moved as u64);
                    let _ = hist.borrow_mut().record((t1 - t0).max(1));
                }
            }
        });
    }
}

fn check(cfg: &CormBenchConfig) -> Result<(), BenchError> {
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
    Ok(())
}

fn runtime_config(cfg: &CormBenchConfig) -> RuntimeConfig {
    RuntimeConfig {
        seed: cfg.seed,
        op_stats: false,
        ..RuntimeConfig::default()
    }
}

/// Runs the benchmark on an embedded shm node.
pub fn run(cfg: &CormBenchConfig) -> Result<CormBenchResult, BenchError> {
    check(cfg)?;
    let wall = Instant::now();
    let (fabric, store) = embedded_store(
        space(cfg),
        cfg.size,
        cfg.workers,
        cfg.rtt,
        store_config(space(cfg), cfg.seed),
    )?;
    let pinning = crate::pin::Pinning::plan(cfg.pin, cfg.threads)?;
    let m = measure(&fabric, cfg, Some(pinning))?;
    result(cfg, "shm", None, m, wall, store.stats())
}

/// Runs the benchmark against the CoRM store that memory node 0 of
/// `fabric` serves (a `dmkit memnode --corm` process, over shm or verbs;
/// `backend` names it in the result). `cfg.workers` is ignored: the
/// result reports the node's. The run's objects are freed when it ends.
pub fn run_connected(
    fabric: &dyn Fabric,
    backend: &str,
    cfg: &CormBenchConfig,
) -> Result<CormBenchResult, BenchError> {
    let wall = Instant::now();
    let before = store_stats(fabric, cfg)?;
    let cfg = &CormBenchConfig {
        workers: before.workers as usize,
        ..cfg.clone()
    };
    check(cfg)?;
    if cfg.pin {
        return Err(BenchError::Config(
            "--pin places an embedded node's workers; a node process is placed by its own \
             launcher (e.g. taskset)"
                .into(),
        ));
    }
    let (m, ptrs) = measure_keeping(fabric, cfg, None)?;
    let stats = store_stats(fabric, cfg)?;
    free_all(fabric, cfg.seed, &ptrs)?;
    result(cfg, backend, None, m, wall, stats)
}

/// One RPC task on a worker of its own: the store's accounting.
fn store_stats(fabric: &dyn Fabric, cfg: &CormBenchConfig) -> Result<CormStats, BenchError> {
    let mut w = Worker::builder(fabric)
        .config(runtime_config(cfg))
        .tasks(1)
        .build()?;
    let out: Rc<RefCell<Option<Result<CormStats, CormError>>>> = Rc::default();
    let o = out.clone();
    w.spawn(move |ctx: Ctx| async move {
        let r = async { CormClient::connect(&ctx, 0).await?.stats(&ctx).await }.await;
        *o.borrow_mut() = Some(r);
    });
    w.run();
    let r = out.borrow_mut().take();
    match r {
        Some(Ok(s)) => Ok(s),
        Some(Err(e)) => Err(BenchError::Config(format!(
            "the memory node's CoRM store (is it `dmkit memnode --corm`?): {e}"
        ))),
        None => Err(BenchError::Config(
            "the statistics task did not finish".into(),
        )),
    }
}

/// Frees the run's objects (LOADERS tasks), leaving a node process's store
/// as the run found it.
pub(crate) fn free_all(fabric: &dyn Fabric, seed: u64, ptrs: &[ObjPtr]) -> Result<(), BenchError> {
    let mut w = Worker::builder(fabric)
        .config(RuntimeConfig {
            seed,
            op_stats: false,
            ..RuntimeConfig::default()
        })
        .tasks(LOADERS)
        .build()?;
    let err: Rc<RefCell<Option<CormError>>> = Rc::default();
    let ptrs: Rc<Vec<ObjPtr>> = Rc::new(ptrs.to_vec());
    let tasks = LOADERS.min(ptrs.len()).max(1);
    for t in 0..tasks {
        let (e, p) = (err.clone(), ptrs.clone());
        w.spawn(move |ctx: Ctx| async move {
            let r = async {
                let c = CormClient::connect(&ctx, 0).await?;
                for q in p.iter().skip(t).step_by(tasks) {
                    c.free(&ctx, *q).await?;
                }
                Ok::<(), CormError>(())
            }
            .await;
            if let Err(x) = r {
                e.borrow_mut().get_or_insert(x);
            }
        });
    }
    w.run();
    let e = err.borrow_mut().take();
    match e {
        Some(e) => Err(BenchError::Config(format!(
            "freeing the run's objects: {e}"
        ))),
        None => Ok(()),
    }
}

/// What the client threads measured.
struct Measured {
    /// Latencies of the counted operations.
    hist: Histogram<u64>,
    /// Operations in the window.
    ops: u64,
    /// Failed direct reads in the window.
    failed: u64,
    /// RPCs in the window.
    rpcs: u64,
    /// Operations completed, warm-up included.
    all_ops: u64,
    /// The client threads' CPU and wall time (ns), warm-up included
    /// (shm; zero on the simulator).
    cpu_ns: u64,
    wall_ns: u64,
    errors: Vec<String>,
    timed: harness::Timed,
    pinning: Option<crate::pin::Pinning>,
}

/// Loads the store on `fabric`'s node 0, then runs the client threads
/// over one global window.
fn measure(
    fabric: &dyn Fabric,
    cfg: &CormBenchConfig,
    pinning: Option<crate::pin::Pinning>,
) -> Result<Measured, BenchError> {
    measure_keeping(fabric, cfg, pinning).map(|(m, _)| m)
}

/// [`measure`], also returning the loaded objects' pointers. With
/// `pinning` (an embedded node), the node's workers are placed once the
/// store is loaded and each client thread places itself.
fn measure_keeping(
    fabric: &dyn Fabric,
    cfg: &CormBenchConfig,
    mut pinning: Option<crate::pin::Pinning>,
) -> Result<(Measured, Arc<Vec<ObjPtr>>), BenchError> {
    let rcfg = runtime_config(cfg);
    // Load.
    let ptrs = {
        let mut w = Worker::builder(fabric)
            .config(rcfg.clone())
            .tasks(LOADERS)
            .build()?;
        let (p, e) = (Rc::default(), Rc::default());
        spawn_loader(&mut w, cfg.objects, cfg.size, Rc::clone(&p), Rc::clone(&e));
        w.run();
        loaded(&p, &e)?
    };
    if let Some(p) = pinning.as_mut() {
        p.place_node_workers(cfg.workers)?;
    }
    let pin = pinning.clone();
    // One global window (crate::harness): every client thread sets up,
    // meets the others at the start barrier, and counts what completes
    // inside the window.
    let (timed, outcomes) = harness::run_threads(
        cfg.threads,
        cfg.warmup,
        cfg.duration,
        |id, window, arrival| -> Result<_, BenchError> {
            if let Some(p) = &pin {
                p.place_client(id)?;
            }
            let mut w = Worker::builder(fabric)
                .config(rcfg.clone())
                .id(id)
                .tasks(cfg.coros)
                .local_bytes(BLOCK as usize)
                .build()?;
            let hist = Rc::new(RefCell::new(histogram()));
            let tally = Rc::new(Tally::default());
            spawn_clients(
                &mut w,
                cfg,
                id,
                TaskWindow::Wall(window.clone()),
                ptrs.clone(),
                hist.clone(),
                tally.clone(),
            );
            arrival.arrive();
            let (cpu0, wall0) = (crate::corm_timeline::thread_cpu_ns(), Instant::now());
            while w.live_tasks() > 0 {
                if w.step() == 0 {
                    std::hint::spin_loop();
                }
            }
            let cpu = crate::corm_timeline::thread_cpu_ns().saturating_sub(cpu0);
            let wall = wall0.elapsed().as_nanos() as u64;
            let h = hist.borrow().clone();
            let counts = [
                tally.ops.get(),
                tally.failed_direct.get(),
                tally.rpcs.get(),
                tally.all_ops.get(),
            ];
            Ok((h, counts, tally.errors.take(), cpu, wall))
        },
        |_| {},
    );
    let mut m = Measured {
        hist: histogram(),
        ops: 0,
        failed: 0,
        rpcs: 0,
        all_ops: 0,
        cpu_ns: 0,
        wall_ns: 0,
        errors: Vec::new(),
        timed,
        pinning,
    };
    for o in outcomes {
        let (h, [ops, failed, rpcs, all_ops], errors, cpu, wall) = o?;
        m.hist.add(&h).expect("same bounds");
        m.ops += ops;
        m.failed += failed;
        m.rpcs += rpcs;
        m.all_ops += all_ops;
        m.cpu_ns += cpu;
        m.wall_ns += wall;
        m.errors.extend(errors);
    }
    Ok((m, ptrs))
}

/// Runs the benchmark on the simulator: `sim` describes the cluster (client
/// thread `i` runs on compute machine `i mod compute_machines`, the loader on
/// the first; node 0 serves the
/// store on its modelled cores, `sim.rpc_workers` of them, which are the
/// store's workers; its memory grows to what the store needs and its
/// translation pages shrink to 4 KiB blocks). The store is loaded first, by
/// RPC; the window (`warmup`, then `duration`, virtual time) starts when
/// loading ends. The same configuration and seed give the same result.
pub fn run_sim(sim_cfg: SimConfig, cfg: &CormBenchConfig) -> Result<CormBenchResult, BenchError> {
    check(cfg)?;
    let wall = Instant::now();
    refuse_rtt_on_sim(cfg.rtt)?;
    if cfg.pin {
        return Err(BenchError::Config(
            "--pin places shm threads; the simulator's cores are modelled".into(),
        ));
    }
    let profile = sim_cfg.profile.name.clone();
    let sim_cfg = sim_for_store(sim_cfg, space(cfg), cfg.workers);
    let machines = sim_cfg.compute_machines.max(1);
    let mut sim = Sim::new(sim_cfg)?;
    let store = sim_store(&sim, store_config(space(cfg), cfg.seed))?;
    let rcfg = runtime_config(cfg);
    let (p, e) = (Rc::default(), Rc::default());
    let th = sim.add_worker(0, |f: &dyn Fabric, clock| {
        Worker::builder(f)
            .clock(clock)
            .config(rcfg.clone())
            .tasks(LOADERS)
            .build()
    })?;
    spawn_loader(
        sim.worker_mut(th),
        cfg.objects,
        cfg.size,
        Rc::clone(&p),
        Rc::clone(&e),
    );
    sim.run();
    let ptrs = loaded(&p, &e)?;
    sim.clear_workers();
    let from = sim.now() + cfg.warmup.as_nanos() as u64;
    let until = from + cfg.duration.as_nanos() as u64;
    let hist = Rc::new(RefCell::new(histogram()));
    let tally = Rc::new(Tally::default());
    for id in 0..cfg.threads {
        let th = sim.add_worker(id % machines, |f: &dyn Fabric, clock| {
            Worker::builder(f)
                .clock(clock)
                .config(rcfg.clone())
                .id(id)
                .tasks(cfg.coros)
                .local_bytes(BLOCK as usize)
                .build()
        })?;
        spawn_clients(
            sim.worker_mut(th),
            cfg,
            id,
            TaskWindow::Virtual { from, until },
            ptrs.clone(),
            hist.clone(),
            tally.clone(),
        );
    }
    sim.run_until(until);
    let h = hist.borrow();
    let timed = harness::Timed {
        seconds: cfg.duration.as_secs_f64(),
        interrupted: false,
    };
    let m = Measured {
        hist: h.clone(),
        ops: tally.ops.get(),
        failed: tally.failed_direct.get(),
        rpcs: tally.rpcs.get(),
        all_ops: tally.all_ops.get(),
        cpu_ns: 0,
        wall_ns: 0,
        errors: tally.errors.borrow().clone(),
        timed,
        pinning: None,
    };
    result(cfg, "sim", Some(profile), m, wall, store.stats())
}

fn result(
    cfg: &CormBenchConfig,
    backend: &str,
    profile: Option<String>,
    merged: Measured,
    wall: Instant,
    store: CormStats,
) -> Result<CormBenchResult, BenchError> {
    let Measured {
        hist: h,
        ops,
        failed,
        rpcs,
        all_ops,
        cpu_ns,
        wall_ns,
        errors,
        timed,
        pinning,
    } = merged;
    if let Some(e) = errors.first() {
        return Err(BenchError::Config(format!(
            "{} operations failed; first: {e}",
            errors.len()
        )));
    }
    let seconds = timed.seconds;
    let us = |q: f64| h.value_at_quantile(q) as f64 / 1e3;
    Ok(CormBenchResult {
        backend: backend.into(),
        profile,
        read: cfg.read.name().into(),
        workload: format!("{}:{}", cfg.read_percent, 100 - cfg.read_percent),
        objects: cfg.objects,
        size: cfg.size,
        zipf: cfg.zipf,
        threads: cfg.threads,
        coros: cfg.coros,
        workers: cfg.workers,
        rtt_us: cfg.rtt.map(|d| d.as_secs_f64() * 1e6),
        ops,
        seconds,
        mops: harness::rate(ops as f64, seconds) / 1e6,
        p50_us: us(0.5),
        p99_us: us(0.99),
        latency: harness::Latency::of(&h),
        failed_direct_reads_per_s: harness::rate(failed as f64, seconds),
        warmup_s: cfg.warmup.as_secs_f64(),
        interrupted: timed.interrupted,
        oversubscribed: (backend != "sim")
            .then(|| harness::oversubscribed(cfg.threads))
            .flatten(),
        wall_seconds: wall.elapsed().as_secs_f64(),
        rpc_requests_per_s: harness::rate(rpcs as f64, seconds),
        client_cpu_share: (wall_ns > 0).then(|| cpu_ns as f64 / wall_ns as f64),
        client_cpu_us_per_op: (wall_ns > 0 && all_ops > 0)
            .then(|| cpu_ns as f64 / 1e3 / all_ops as f64),
        pinning,
        load_average: crate::pin::load_average(),
        store,
    })
}
