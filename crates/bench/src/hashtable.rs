//! The disaggregated hash table's breakdown (RDMA memory-semantics study,
//! §IV-B, Fig. 12) as YCSB runs of the RACE table: 100 % updates of
//! 64-byte values, zipfian 0.99, each step of `dmkit_apps::hashtable`
//! switched on in turn (see there for what each step is and where dmkit's
//! choices differ from the study's).

use dmkit_apps::hashtable::Step;
use dmkit_race::RaceConfig;
use dmkit_runtime::RuntimeConfig;

use crate::micro::BenchError;
use crate::ycsb::{KeyType, Workload};
use crate::ycsb_bench::{self, IndexKind, Platform, YcsbConfig, YcsbResult};

/// The shape of a breakdown run.
#[derive(Debug, Clone)]
pub struct HashtableRun {
    /// Keys loaded into the table.
    pub keys: u64,
    /// Threads per front end (per compute machine on the simulator).
    pub threads: usize,
    /// Front ends (compute machines on the simulator; 1 on shm).
    pub front_ends: usize,
    /// Tasks (coroutines) per thread.
    pub coros: usize,
    /// Hot keys of the IO-consolidation steps (the likeliest ones).
    pub hot_keys: usize,
    /// θ of the hot area.
    pub theta: u32,
    /// Measured window.
    pub duration: std::time::Duration,
    /// Unmeasured run before the window.
    pub warmup: std::time::Duration,
    /// Seed of keys, workload and simulator.
    pub seed: u64,
    /// Versions per cold entry where the step has multi-version entries
    /// (0: the step's other switches alone).
    pub versions: u32,
}

/// The YCSB configuration of `step`.
pub fn config(step: Step, r: &HashtableRun) -> YcsbConfig {
    let sw = step.switches();
    let mut runtime = RuntimeConfig {
        conflict_avoid: sw.backoff,
        seed: r.seed,
        ..RuntimeConfig::default()
    };
    runtime.tuner.candidates = crate::sim_repro::PAPER_CANDIDATES.to_vec();
    YcsbConfig {
        index: IndexKind::Race,
        workload: Workload::U,
        keys: r.keys,
        threads: r.threads,
        machines: r.front_ends,
        coros: r.coros,
        theta: 0.99,
        distribution: None,
        zipf_items: None,
        key_type: KeyType::Int,
        value_size: 64,
        duration: r.duration,
        warmup: r.warmup,
        think: std::time::Duration::ZERO,
        seed: r.seed,
        runtime,
        hot_keys: if sw.hot_area { r.hot_keys } else { 0 },
        race: RaceConfig {
            cache_entries: 0,
            hot_theta: r.theta,
            cold_versions: if sw.multi_version { r.versions } else { 0 },
            ..Default::default()
        },
        art: Default::default(),
        btree: Default::default(),
        clover: Default::default(),
    }
}

/// The simulated cluster of `step`: the front ends, one memory machine
/// with two sockets (a memory node each), the step's ports.
pub fn sim_config(
    step: Step,
    mut base: dmkit_sim::SimConfig,
    cfg: &YcsbConfig,
) -> dmkit_sim::SimConfig {
    base.compute_machines = cfg.machines;
    base.memory_nodes = 2;
    base.colocated = false;
    base.numa = Some(step.switches().numa_layout());
    base.memory_bytes = ycsb_bench::memory_estimate(cfg) / 2 + (64 << 20);
    base
}

/// Runs `step` on shm (`fabric`) or the simulator (`sim`).
pub fn run(
    step: Step,
    r: &HashtableRun,
    fabric: Option<std::sync::Arc<dyn dmkit_fabric::Fabric>>,
    sim: Option<dmkit_sim::SimConfig>,
) -> Result<YcsbResult, BenchError> {
    let cfg = config(step, r);
    let platform = match (fabric, sim) {
        (Some(f), _) => Platform::Fabric(f),
        (None, Some(s)) => Platform::Sim(Box::new(sim_config(step, s, &cfg))),
        (None, None) => return Err(BenchError::Config("a hashtable run needs a backend".into())),
    };
    ycsb_bench::run(platform, &cfg, &|_| {})
}
