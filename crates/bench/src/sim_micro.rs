//! The verbs micro-benchmark in virtual time: SMART's bench tool (§3.1)
//! on the simulator. Every virtual thread is a runtime worker; each of its
//! `tasks` tasks issues `depth` READs of `size` bytes at uniformly random
//! 8-byte-aligned addresses of a region, awaits `sync`, and repeats. With
//! one task this is the bench tool's loop ("each thread repeatedly posts k
//! work requests, rings the doorbell, and then waits for
//! acknowledgments"). The reproductions post each request with its own
//! doorbell (`ibv_post_send` per request): only that reading of the tool
//! makes Fig. 3a's 19 Mops of per-thread-QP READs at 96 threads agree with
//! RACE's ≈41 Mops of 3-READ lookups on 6 compute nodes (Fig. 7f), both
//! limited by the same doorbell locks. `doorbell_per_request: false`
//! batches a round under one doorbell instead. Throughput counts the READs completed
//! inside the measured window.
//!
//! Several compute machines and memory nodes scale it out (each task
//! sends its posts to the memory nodes in turn).
//!
//! With a [`ThreadSchedule`], the number of active threads changes every
//! interval (SMART §6.3, Table 1): inactive threads' tasks sleep.

use std::cell::Cell;
use std::rc::Rc;
use std::time::Instant;

use dmkit_fabric::{Fabric, GlobalAddr, QpPolicy};
use dmkit_runtime::{RuntimeConfig, Worker};
use dmkit_sim::{Faults, Profile, Sim, SimConfig, SimStats};
use serde::Serialize;

use crate::micro::BenchError;
use crate::rng::Rng;
use dmkit_fabric::RemoteRef;
use dmkit_runtime::Local;

/// The active thread count changes every `interval_ns` to a value drawn
/// uniformly from `[min, max]`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ThreadSchedule {
    /// Length of one interval in virtual ns.
    pub interval_ns: u64,
    /// Fewest active threads.
    pub min: usize,
    /// Most active threads (at most the configuration's `threads`).
    pub max: usize,
}

impl ThreadSchedule {
    /// Active threads during interval `k` (deterministic from `seed`).
    pub fn active(&self, k: u64, seed: u64) -> usize {
        let mut r = Rng::new(seed ^ k.wrapping_mul(0xA24B_AED4_963E_E407));
        self.min + r.below((self.max - self.min + 1) as u64) as usize
    }
}

/// One run.
#[derive(Debug, Clone)]
pub struct SimMicroConfig {
    /// The device model.
    pub profile: Profile,
    /// Compute machines, each running `threads` virtual threads.
    pub machines: usize,
    /// Memory nodes; each thread's READs go to all of them in turn.
    pub memory_nodes: usize,
    /// Virtual threads per compute machine, each a runtime worker.
    pub threads: usize,
    /// Tasks per thread.
    pub tasks: usize,
    /// READs each task issues before it waits (the bench tool's
    /// concurrency depth `k`).
    pub depth: usize,
    /// Ring a doorbell per READ (`ibv_post_send` per request, as SMART's
    /// bench tool) instead of one per task round (doorbell batching).
    pub doorbell_per_request: bool,
    /// Bytes per READ.
    pub size: usize,
    /// Bytes of the region the READ addresses are drawn from, on each memory
    /// node.
    pub region_bytes: u64,
    /// How threads map to queue pairs and doorbells (SMART, ASPLOS'24 §3.1,
    /// Fig. 3a).
    pub policy: QpPolicy,
    /// Adaptive work-request throttling (SMART §4.2) on or off.
    pub throttle: bool,
    /// A fixed `C_max` instead of the tuner (when throttling).
    pub fixed_c_max: Option<u32>,
    /// The tuner's Δ (and so its whole epoch) × this factor (1 = SMART's 8 ms).
    pub tuner_scale: f64,
    /// The tuner's candidate `C_max` values (`None`: the runtime's default).
    pub candidates: Option<Vec<u32>>,
    /// Virtual time before measuring (lets the `C_max` tuner finish its
    /// first update phase).
    pub warmup_ns: u64,
    /// Virtual ns measured after the warm-up.
    pub measure_ns: u64,
    /// Seed of the simulation and of the address streams.
    pub seed: u64,
    /// A changing number of active threads (SMART, ASPLOS'24 §6.3, Table 1);
    /// `None`: all threads active throughout.
    pub schedule: Option<ThreadSchedule>,
    /// Faults to inject (none by default).
    pub faults: Faults,
}

impl SimMicroConfig {
    /// SMART §3.1's setup: 8-byte READs in a 1 GB region, one memory blade.
    pub fn smart(profile: Profile, threads: usize, depth: usize, policy: QpPolicy) -> Self {
        Self {
            profile,
            machines: 1,
            memory_nodes: 1,
            threads,
            tasks: 1,
            depth,
            doorbell_per_request: true,
            size: 8,
            region_bytes: 64 << 10,
            policy,
            throttle: false,
            fixed_c_max: None,
            tuner_scale: 1.0,
            candidates: None,
            warmup_ns: 2_000_000,
            measure_ns: 10_000_000,
            seed: 1,
            schedule: None,
            faults: Faults::default(),
        }
    }
}

/// What a run measured.
#[derive(Debug, Clone, Default, Serialize)]
pub struct SimMicroResult {
    /// Compute machines.
    pub machines: usize,
    /// Memory nodes.
    pub memory_nodes: usize,
    /// Virtual threads per compute machine.
    pub threads: usize,
    /// Tasks per thread.
    pub tasks: usize,
    /// READs per task round.
    pub depth: usize,
    /// The queue-pair policy's name.
    pub policy: String,
    /// Whether adaptive throttling was on.
    pub throttle: bool,
    /// READs completed in the window, per virtual second (millions).
    pub mops: f64,
    /// READs completed inside the measured window.
    pub ops: u64,
    /// Virtual seconds simulated, warm-up included.
    pub virtual_seconds: f64,
    /// Wall-clock seconds the simulation took.
    pub wall_seconds: f64,
    /// Simulated work requests per wall-clock second.
    pub sim_verbs_per_wall_second: f64,
    /// Work requests posted in the whole run.
    pub verbs: u64,
    /// PCIe bytes per work request at the requester (SMART Fig. 4b).
    pub pcie_bytes_per_wr: f64,
    /// Final `C_max` of each worker (throttling).
    pub c_max: Vec<u32>,
    /// Worker steps the simulator took (one virtual thread scheduled once).
    pub steps: u64,
    /// The simulator's counters over the whole run, warm-up included.
    pub stats: SimStats,
}

/// Runs the benchmark.
pub fn run(cfg: &SimMicroConfig) -> Result<SimMicroResult, BenchError> {
    if cfg.threads == 0
        || cfg.tasks == 0
        || cfg.depth == 0
        || cfg.size == 0
        || cfg.machines == 0
        || cfg.memory_nodes == 0
    {
        return Err(BenchError::Config(
            "machines, memory nodes, threads, tasks, depth and size must be at least 1".into(),
        ));
    }
    if cfg.schedule.is_some() && cfg.machines > 1 {
        return Err(BenchError::Config(
            "a thread schedule applies to one compute machine".into(),
        ));
    }
    if cfg.region_bytes < cfg.size as u64 + 8 {
        return Err(BenchError::Config("region smaller than one request".into()));
    }
    let wall = Instant::now();
    let mut sim = Sim::new(SimConfig {
        profile: cfg.profile.clone(),
        compute_machines: cfg.machines,
        memory_nodes: cfg.memory_nodes,
        memory_bytes: cfg.region_bytes + (64 << 20),
        page_size: 2 << 20,
        seed: cfg.seed,
        faults: cfg.faults.clone(),
        ..SimConfig::default()
    })?;
    let fabric = sim.dyn_fabric();
    // One copy shared by every task: a copy per task cost a cache miss per
    // READ posted (perf: 2 % of `sim speed`).
    let regions: Rc<[_]> = (0..cfg.memory_nodes as u16)
        .map(|n| fabric.alloc_chunk(n, cfg.region_bytes, true))
        .collect::<Result<Vec<_>, _>>()?
        .into();
    let words = (cfg.region_bytes - cfg.size as u64) / 8;
    let end = cfg.warmup_ns + cfg.measure_ns;
    let ops = Rc::new(Cell::new(0u64));
    let mut tuner = dmkit_runtime::throttle::TunerConfig::default();
    tuner.delta = ((tuner.delta as f64 * cfg.tuner_scale) as u64).max(1);
    if let Some(c) = &cfg.candidates {
        tuner.candidates = c.clone();
    }
    let rcfg = RuntimeConfig {
        tuner,
        throttle: cfg.throttle,
        fixed_c_max: cfg.fixed_c_max,
        conflict_avoid: false,
        op_stats: false,
        seed: cfg.seed,
        ..RuntimeConfig::default()
    };
    let failed: Rc<Cell<bool>> = Rc::default();
    let mut ths = Vec::with_capacity(cfg.threads * cfg.machines);
    for (mi, ti) in (0..cfg.machines).flat_map(|m| (0..cfg.threads).map(move |t| (m, t))) {
        let id = mi * cfg.threads + ti;
        let th = sim.add_worker(mi, |f: &dyn Fabric, clock| -> Result<Worker, BenchError> {
            let qps = (0..cfg.memory_nodes as u16)
                .map(|n| f.connect_as(n, cfg.policy))
                .collect::<Result<Vec<_>, _>>()?;
            Ok(Worker::builder_on(qps)
                .clock(clock)
                .config(rcfg.clone())
                .id(id)
                .tasks(cfg.tasks)
                .local_bytes(cfg.size * cfg.depth)
                .build()?)
        })?;
        ths.push(th);
        let w = sim.worker_mut(th);
        for ci in 0..cfg.tasks {
            let ops = ops.clone();
            let failed = failed.clone();
            let regions = regions.clone();
            let (size, depth, warm, seed, sched, each) = (
                cfg.size,
                cfg.depth,
                cfg.warmup_ns,
                cfg.seed,
                cfg.schedule,
                cfg.doorbell_per_request,
            );
            let mut rng =
                Rng::new(seed ^ ((id * cfg.tasks + ci) as u64 + 1).wrapping_mul(0x9E37_79B9));
            w.spawn(move |ctx| async move {
                // The memory node of the next round, kept in range by a
                // wrap rather than a division per READ.
                let mut turn = (id + ci) % regions.len();
                loop {
                    let now = ctx.now();
                    if now >= end {
                        break;
                    }
                    if let Some(s) = sched {
                        let k = now / s.interval_ns;
                        if ti >= s.active(k, seed) {
                            let next = ((k + 1) * s.interval_ns).min(end);
                            ctx.sleep(next - now).await;
                            continue;
                        }
                    }
                    turn += 1;
                    if turn == regions.len() {
                        turn = 0;
                    }
                    let (base, _, rkey) = regions[turn];
                    for i in 0..depth {
                        let off = base.offset() + 8 * rng.below(words);
                        ctx.read(
                            RemoteRef::new(GlobalAddr::new(base.node(), off), rkey),
                            Local::at(i * size, size),
                        );
                        if each {
                            ctx.post();
                        }
                    }
                    if ctx.sync().await.is_err() {
                        failed.set(true);
                        break;
                    }
                    let t = ctx.now();
                    if t >= warm && t < end {
                        ops.set(ops.get() + depth as u64);
                    }
                }
            });
        }
    }
    match cfg.schedule {
        None => {
            sim.run_until(end);
        }
        Some(s) => {
            // The SMT slowdown follows the active count interval by interval.
            let mut k = 0;
            while k * s.interval_ns < end {
                sim.set_active_threads(0, s.active(k, cfg.seed).min(cfg.threads) as u32);
                sim.run_until(((k + 1) * s.interval_ns).min(end));
                k += 1;
            }
        }
    }
    if failed.get() {
        return Err(BenchError::Config("a READ failed in the simulation".into()));
    }
    let stats = sim.stats();
    let c_max = ths
        .iter()
        .map(|&t| sim.thread_stats(t).c_max.first().copied().unwrap_or(0))
        .collect();
    let wall_seconds = wall.elapsed().as_secs_f64();
    let ops = ops.get();
    Ok(SimMicroResult {
        machines: cfg.machines,
        memory_nodes: cfg.memory_nodes,
        threads: cfg.threads,
        tasks: cfg.tasks,
        depth: cfg.depth,
        policy: cfg.policy.to_string(),
        throttle: cfg.throttle,
        mops: ops as f64 / (cfg.measure_ns as f64 / 1e9) / 1e6,
        ops,
        virtual_seconds: end as f64 / 1e9,
        wall_seconds,
        sim_verbs_per_wall_second: stats.posted as f64 / wall_seconds,
        verbs: stats.posted,
        pcie_bytes_per_wr: if stats.posted > 0 {
            stats.pcie_bytes / stats.posted as f64
        } else {
            0.0
        },
        c_max,
        steps: sim.steps(),
        stats,
    })
}
