//! `dmkit bench txn`: SmallBank, TATP or TPC-C on `dmkit-txn` (FORD's
//! one-sided OCC; SMART-DTX with SMART's runtime switches on, FORD+ with
//! them off): load, run for --duration, check the consistency conditions.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use clap::Args;
use dmkit_bench::harness;
use dmkit_bench::txn_bench::{self, TxnBenchConfig, TxnPlatform, TxnResult, TxnWorkload};
use dmkit_fabric::shm::ShmFabric;
use dmkit_fabric::Fabric;
use dmkit_memnode::NodeConfig;
use dmkit_txn::TxnConfig;

use super::{open_fabric, Backend, FabricArgs, SwitchArgs};
use crate::args::OnOff;
use crate::Res;

#[derive(Args)]
pub(crate) struct TxnArgs {
    #[command(flatten)]
    fabric: FabricArgs,
    /// Workload: smallbank, tatp or tpcc (NewOrder + Payment).
    #[arg(long, default_value = "smallbank")]
    workload: TxnWorkload,
    /// Scale: SmallBank accounts, TATP subscribers or TPC-C warehouses
    /// [default: FORD's — 100000 accounts, 100000 subscribers, 1 warehouse].
    #[arg(long, default_value_t = 0)]
    scale: u64,
    /// Threads (one worker each).
    #[arg(long, default_value_t = 2)]
    threads: usize,
    /// Coordinators (tasks) per thread.
    #[arg(long, default_value_t = 8)]
    coros: usize,
    /// How long to measure, not counting the load [default: 5s; 2ms of
    /// virtual time on the simulator].
    #[arg(long, value_parser = humantime::parse_duration)]
    duration: Option<Duration>,
    /// Run this long before the measured window opens [default: 0; 1ms on
    /// the simulator].
    #[arg(long, value_parser = humantime::parse_duration)]
    warmup: Option<Duration>,
    /// Each coordinator idles this long after a commit (SMART's Figure
    /// 11 lowers the offered load this way).
    #[arg(long, default_value = "0s", value_parser = humantime::parse_duration)]
    idle: Duration,
    /// Copies of every record (primary + backups), each on its own memory
    /// node: the embedded shm fabric gets this many nodes.
    #[arg(long, default_value_t = 2)]
    replicas: usize,
    /// FORD's hitchhiked locking [default: on].
    #[arg(long, value_enum, default_value = "on")]
    hitchhike: OnOff,
    /// FORD's reads served by backups [default: on].
    #[arg(long, value_enum, default_value = "on")]
    backup_reads: OnOff,
    /// FORD's coalescent commit [default: on].
    #[arg(long, value_enum, default_value = "on")]
    coalescent_commit: OnOff,
    /// The address cache also remembers absent keys' would-be slots (a
    /// read of such a key then READs that slot's lock and version, not
    /// its bucket); not one of FORD's techniques [default: on].
    #[arg(long, value_enum, default_value = "on")]
    cache_absent: OnOff,
    #[command(flatten)]
    switches: SwitchArgs,
    /// Draw only the workload's read-only transaction types.
    #[arg(long)]
    read_only: bool,
    /// TATP: also run the read-only types on the local in-process peer
    /// (the loaded records in a concurrent map), before the remote run
    /// and for as long; reports the ratio.
    #[arg(long)]
    local_peer: bool,
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// Measure this many times (each run loads its own database); prints
    /// the mean and spread of the committed rate.
    #[arg(long, default_value_t = 1)]
    repeat: usize,
    /// Write the result as JSON to this file.
    #[arg(long)]
    json: Option<PathBuf>,
}

pub(crate) fn bench_txn(a: TxnArgs) -> Res {
    super::check_outputs(a.json.as_deref(), None)?;
    let sim = matches!(a.fabric.backend, Backend::Sim);
    if !sim && (a.fabric.machines != 1 || a.fabric.memory_nodes != 1) {
        return Err(crate::bad_input(
            "--machines and --memory-nodes are simulator options (--backend sim)",
        ));
    }
    // Everything that can be checked before a database is built.
    if a.threads == 0 || a.coros == 0 {
        return Err(crate::bad_input("--threads and --coros must be at least 1"));
    }
    if a.duration.is_some_and(|d| d.is_zero()) {
        return Err(crate::bad_input("--duration must be longer than 0s"));
    }
    if a.repeat == 0 {
        return Err(crate::bad_input("--repeat must be at least 1"));
    }
    let cfg = TxnBenchConfig {
        workload: a.workload,
        scale: a.scale,
        threads: a.threads,
        coros: a.coros,
        duration: a.duration.unwrap_or(if sim {
            Duration::from_millis(2)
        } else {
            Duration::from_secs(5)
        }),
        txn: TxnConfig {
            replicas: a.replicas,
            hitchhike: a.hitchhike == OnOff::On,
            backup_reads: a.backup_reads == OnOff::On,
            coalescent_commit: a.coalescent_commit == OnOff::On,
            cache_absent: a.cache_absent == OnOff::On,
            ..TxnConfig::default()
        },
        runtime: a.switches.runtime_config(a.seed)?,
        seed: a.seed,
        read_only: a.read_only,
        local_peer: a.local_peer,
        warmup: a.warmup.unwrap_or(if sim {
            Duration::from_millis(1)
        } else {
            Duration::ZERO
        }),
        idle: a.idle,
    };
    let fabric: Arc<dyn Fabric> = match a.fabric.backend {
        Backend::Sim => {
            // One memory node per replica unless told otherwise; room for
            // FORD's default populations and 4096 undo logs.
            let mut sc = a.fabric.sim_config(512 << 20, a.seed)?;
            if a.fabric.memory_nodes == 1 {
                sc.memory_nodes = a.replicas.max(1);
            }
            sc.memory_bytes = a.fabric.mem_size.unwrap_or(256 << 20);
            let provenance =
                harness::Provenance::new(a.seed, cfg.duration, cfg.warmup, false).repeat(a.repeat);
            let runs = super::repeated(a.repeat, || {
                txn_bench::run_txn_on(TxnPlatform::Sim(Box::new(sc.clone())), &cfg)
            })?;
            return report(&runs, &a, &provenance);
        }
        Backend::Shm if a.fabric.connect.is_empty() => {
            // Embedded: one memory node per replica (sparse memfds).
            let size = a.fabric.mem_size.unwrap_or(1 << 30);
            let nodes: Vec<NodeConfig> = (0..a.replicas.max(1) as u16)
                .map(|i| NodeConfig {
                    node_id: i,
                    size,
                    ..Default::default()
                })
                .collect();
            Arc::new(
                ShmFabric::embedded(a.fabric.shm_config(), &nodes)
                    .map_err(|e| format!("embedded memory nodes: {e}"))?,
            )
        }
        _ => open_fabric(&a.fabric, 1 << 30)?,
    };
    // Ctrl-C ends the window: the partial result is printed and written,
    // and the database destroyed, as a full run's.
    super::start_measuring(cfg.threads, false);
    let provenance =
        harness::Provenance::new(a.seed, cfg.duration, cfg.warmup, false).repeat(a.repeat);
    let runs = super::repeated(a.repeat, || txn_bench::run_txn(fabric.clone(), &cfg))?;
    report(&runs, &a, &provenance)
}

/// Prints every run, the spread of the committed rate (in M txn/s) over
/// repeated runs, writes `--json`, and fails if a run broke an invariant.
fn report(runs: &[TxnResult], a: &TxnArgs, provenance: &harness::Provenance) -> Res {
    for r in runs {
        print_txn(r);
    }
    super::finish_runs(
        a.json.as_deref(),
        provenance,
        runs,
        |r| r.committed_per_s / 1e6,
        |r| r.interrupted,
    )?;
    if let Some(r) = runs.iter().find(|r| !r.invariants_ok) {
        return Err(format!(
            "bench txn: invariants violated: {}",
            r.invariants_error.as_deref().unwrap_or("?")
        ));
    }
    Ok(())
}

fn print_txn(r: &TxnResult) {
    println!(
        "{:<10} {:>7} {:>5} {:>10} {:>10} {:>7} {:>8} {:>8} {:>6} {:>8} {:>5}",
        "workload",
        "threads",
        "coros",
        "commit/s",
        "attempt/s",
        "abort",
        "p50_us",
        "p99_us",
        "rt/tx",
        "B/tx",
        "ok"
    );
    println!(
        "{:<10} {:>7} {:>5} {:>10.0} {:>10.0} {:>7.3} {:>8.1} {:>8.1} {:>6.2} {:>8.0} {:>5}",
        r.workload,
        r.threads,
        r.coros,
        r.committed_per_s,
        r.attempted_per_s,
        r.abort_rate,
        r.p50_us,
        r.p99_us,
        r.round_trips_per_txn,
        r.bytes_per_txn,
        r.invariants_ok
    );
    if let (Some(l), Some(x)) = (r.local_attempted_per_s, r.vs_local) {
        println!("  local peer: {l:.0} txn/s; remote/local {x:.3}");
    }
    if let (Some(r), Some(l), Some(x)) = (
        r.attempted_per_cpu_s,
        r.local_attempted_per_cpu_s,
        r.vs_local_cpu,
    ) {
        println!(
            "  per CPU second of the threads: remote {r:.0}, local {l:.0} attempted; \
             remote/local {x:.3}"
        );
    }
    for t in &r.types {
        println!(
            "  {:<22} attempted {:>9} committed {:>9} abort rate {:.3}",
            t.name, t.attempted, t.committed, t.abort_rate
        );
    }
}
