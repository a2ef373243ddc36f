//! `dmkit bench`: the benchmarks (`micro`, `ycsb`), and what they share:
//! the fabric flags (backend, memory nodes, simulated cluster), SMART's
//! runtime switches, and opening the fabric those flags describe.

pub(crate) mod atomics;
pub(crate) mod clover;
pub(crate) mod consolidation;
pub(crate) mod corm_bench;
pub(crate) mod lockcheck;
pub(crate) mod micro;
pub(crate) mod rpc;
pub(crate) mod txn;
pub(crate) mod vector_io;
pub(crate) mod ycsb;

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use clap::{Args, Subcommand, ValueEnum};
use dmkit_fabric::shm::{ShmConfig, ShmFabric};
use dmkit_fabric::Fabric;
use dmkit_memnode::NodeConfig;

use crate::args::{
    load_profile, parse_atomic_order, parse_listen, targets, Listen, OnOff, RdmaArgs,
    WritePrefetchArg,
};
use crate::units::parse_size;
use crate::Res;
use atomics::AtomicsArgs;
use consolidation::ConsolidationArgs;
use micro::MicroArgs;
use vector_io::VectorIoArgs;
use ycsb::YcsbArgs;

// The variants are parsed once per process: their size does not matter.
#[allow(clippy::large_enum_variant)]
#[derive(Subcommand)]
pub(crate) enum BenchCmd {
    /// One verb at random addresses of a region, per thread, in batches.
    Micro(MicroArgs),
    /// YCSB on an index: load, then run a workload for --duration.
    Ycsb(YcsbArgs),
    /// Transactions (SmallBank, TATP, TPC-C) on FORD's one-sided OCC.
    Txn(txn::TxnArgs),
    /// Echo round trips through a memory node's RPC workers.
    Rpc(rpc::RpcArgs),
    /// Object reads and writes on a CoRM store: one-sided or RPC reads.
    Corm(corm_bench::CormBenchArgs),
    /// Vector IO (memory-semantics §III-A/B): SP, doorbell batching and
    /// SGL beside local pwritev/preadv; random vs sequential.
    VectorIo(VectorIoArgs),
    /// IO consolidation (memory-semantics §III-C): small writes into hot
    /// regions, native vs the runtime's write-back buffer, θ swept.
    IoConsolidation(ConsolidationArgs),
    /// Remote atomics (memory-semantics §III-E): spinlock and sequencer,
    /// local vs remote vs RPC, with and without backoff.
    Atomics(AtomicsArgs),
    /// A spinlock on one remote word shared by client processes (one per
    /// host), with a mutual-exclusion check (`dmkit switch --cas-to-write`).
    Lockcheck(lockcheck::LockcheckArgs),
}

#[derive(Clone, Copy, ValueEnum)]
enum Backend {
    /// Shared memory: an embedded memory node, or node processes via --connect.
    Shm,
    /// The deterministic RNIC simulator (virtual time; see `dmkit sim`).
    Sim,
    /// Real RDMA devices (rdma-core verbs): node processes via
    /// --connect tcp:HOST:PORT (build with --features dmkit/verbs).
    Verbs,
}

/// SMART's techniques, each a switch (runtime mode). Defaults: all on, or
/// what `--config` says; a flag given here overrides the file.
#[derive(Args)]
struct SwitchArgs {
    /// Runtime configuration file (TOML; see configs/runtime.toml).
    #[arg(long)]
    config: Option<PathBuf>,
    /// Thread-aware resource allocation: per-worker queue pairs (§4.1) [default: on].
    #[arg(long, value_enum)]
    thread_aware: Option<OnOff>,
    /// Adaptive work-request throttling (§4.2) [default: on].
    #[arg(long, value_enum)]
    throttle: Option<OnOff>,
    /// Conflict avoidance: backoff and task throttling (§4.3) [default: on].
    #[arg(long, value_enum)]
    conflict_avoid: Option<OnOff>,
    /// A fixed C_max instead of the epoch tuner (with --throttle on).
    #[arg(long)]
    c_max: Option<u32>,
}

impl SwitchArgs {
    fn runtime_config(&self, seed: u64) -> Result<dmkit_runtime::RuntimeConfig, String> {
        let mut c = match &self.config {
            Some(p) => {
                let text = std::fs::read_to_string(p)
                    .map_err(|e| format!("reading {}: {e}", p.display()))?;
                dmkit_runtime::RuntimeConfig::from_toml(&text)
                    .map_err(|e| format!("{}: {e}", p.display()))?
            }
            None => dmkit_runtime::RuntimeConfig {
                seed,
                ..Default::default()
            },
        };
        let on = |v: Option<OnOff>, current: bool| v.map_or(current, |v| v == OnOff::On);
        c.thread_aware = on(self.thread_aware, c.thread_aware);
        c.throttle = on(self.throttle, c.throttle);
        c.conflict_avoid = on(self.conflict_avoid, c.conflict_avoid);
        if self.c_max == Some(0) {
            return Err(crate::bad_input("--c-max must be at least 1"));
        }
        if self.c_max.is_some() {
            c.fixed_c_max = self.c_max;
        }
        Ok(c)
    }
}

#[derive(Args)]
struct FabricArgs {
    /// Fabric backend.
    #[arg(long, value_enum, default_value = "shm")]
    backend: Backend,
    /// Memory node processes to use (unix:PATH for shm, tcp:HOST:PORT for
    /// verbs; repeatable); default: one embedded node in this process.
    #[arg(long, value_parser = parse_listen)]
    connect: Vec<Listen>,
    /// Token file for --connect (default PATH.token).
    #[arg(long)]
    token_file: Option<PathBuf>,
    /// Emulated network round trip added to every completion (e.g. 2us).
    #[arg(long, value_parser = humantime::parse_duration)]
    rtt: Option<Duration>,
    /// Size of the embedded memory node (default: what the run needs).
    #[arg(long, value_parser = parse_size)]
    mem_size: Option<u64>,
    /// Translation page size of the embedded memory node: 4KiB or 2MiB
    /// (default 4KiB; large pages keep the translation table cache-resident,
    /// as huge pages keep an RNIC's MTT cache warm).
    #[arg(long, value_parser = parse_size)]
    page_size: Option<u64>,
    /// shm: copy a READ when its completion is polled, prefetching its
    /// lines in between, so a thread's outstanding READs overlap their
    /// cache misses as on an RNIC (off: copy at post) [default: on;
    /// always off with --rtt].
    #[arg(long, value_enum)]
    deferred_reads: Option<OnOff>,
    /// shm: after a WRITE, prefetch the remote lines that follow it for
    /// writing (a sequential stream of WRITEs does not stall on each cold
    /// line): stream (= on) only after a WRITE that continues a recent
    /// one, always after every WRITE, or off [default: on].
    #[arg(long, value_enum)]
    shm_write_prefetch: Option<WritePrefetchArg>,
    /// Simulator: device profile (cx6-200g, cx5-100g, cx3-56g, cx3-40g, or a TOML
    /// file) [default: cx6-200g].
    #[arg(long, help_heading = "Simulator (--backend sim)")]
    profile: Option<String>,
    /// Simulator: override the profile's order among atomics waiting for
    /// one address (post, arrival, random, newest, round-robin).
    #[arg(long, value_parser = parse_atomic_order, help_heading = "Simulator (--backend sim)")]
    atomic_order: Option<dmkit_sim::profile::AtomicOrder>,
    /// Simulator: override the profile's `atomic_stalls_access` (READs and
    /// WRITEs of a word wait for the atomics queued on it; post order only:
    /// another --atomic-order turns it off unless given).
    #[arg(long, value_enum, help_heading = "Simulator (--backend sim)")]
    atomic_stalls_access: Option<OnOff>,
    /// Simulator: override the profile's `response_gaps` (a response takes
    /// the first idle gap of its links once its request has executed,
    /// instead of a FIFO booked in posting order, where a response of an
    /// atomic waiting at a contended address holds back those of requests
    /// posted after it; on in the built-in profiles, off reruns the FIFO).
    #[arg(long, value_enum, help_heading = "Simulator (--backend sim)")]
    response_gaps: Option<OnOff>,
    /// Simulator: compute machines (--threads run on each).
    #[arg(long, default_value_t = 1, help_heading = "Simulator (--backend sim)")]
    machines: usize,
    /// Simulator: memory nodes.
    #[arg(long, default_value_t = 1, help_heading = "Simulator (--backend sim)")]
    memory_nodes: usize,
    /// Simulator: memory node i lives on compute machine i (Sherman's
    /// setup: every server is both).
    #[arg(long, help_heading = "Simulator (--backend sim)")]
    colocated: bool,
    #[command(flatten)]
    rdma: RdmaArgs,
    /// Verbs: how long a queue pair waits with requests outstanding and no
    /// completion before it fails them (their effect unknown) and rebuilds
    /// its connection. RC's 7 transport retries end far sooner on a NIC
    /// that counts them; rxe takes 7 as unlimited [default: 10s].
    #[arg(long, value_parser = humantime::parse_duration, help_heading = "RDMA devices (--backend verbs, tcp: listeners)")]
    completion_timeout: Option<std::time::Duration>,
}

impl FabricArgs {
    /// The shm backend's options these flags set.
    fn shm_config(&self) -> ShmConfig {
        let d = ShmConfig::default();
        ShmConfig {
            rtt: self.rtt.filter(|d| !d.is_zero()),
            deferred_reads: self
                .deferred_reads
                .map_or(d.deferred_reads, |v| v == OnOff::On),
            write_prefetch: self.shm_write_prefetch.map_or(d.write_prefetch, Into::into),
            ..d
        }
    }

    /// The simulated cluster these flags describe (`--backend sim`).
    fn sim_config(&self, needed: u64, seed: u64) -> Result<dmkit_sim::SimConfig, String> {
        if !self.connect.is_empty()
            || self.rtt.is_some()
            || self.deferred_reads.is_some()
            || self.shm_write_prefetch.is_some()
        {
            return Err(crate::bad_input("--connect, --rtt, --deferred-reads and --shm-write-prefetch are shm options; the simulator has its own memory nodes and timing"));
        }
        if self.completion_timeout.is_some() {
            return Err(crate::bad_input(
                "--completion-timeout is a verbs option (--backend verbs); the simulator loses no completion it is not told to",
            ));
        }
        let mut profile = load_profile(
            self.profile.as_deref().unwrap_or("cx6-200g"),
            self.atomic_order,
            self.atomic_stalls_access,
        )?;
        if let Some(v) = self.response_gaps {
            profile.link.response_gaps = v == OnOff::On;
        }
        Ok(dmkit_sim::SimConfig {
            profile,
            compute_machines: self.machines,
            memory_nodes: self.memory_nodes,
            colocated: self.colocated,
            memory_bytes: self
                .mem_size
                .unwrap_or(needed.div_ceil(self.memory_nodes.max(1) as u64) + (64 << 20)),
            page_size: self.page_size.unwrap_or(2 << 20),
            seed,
            ..Default::default()
        })
    }
}

fn open_fabric(a: &FabricArgs, needed: u64) -> Result<Arc<dyn Fabric>, String> {
    if a.profile.is_some()
        || a.atomic_order.is_some()
        || a.atomic_stalls_access.is_some()
        || a.response_gaps.is_some()
    {
        return Err(crate::bad_input(
            "--profile, --atomic-order and --atomic-stalls-access configure the simulator (--backend sim)",
        ));
    }
    if a.machines != 1 || a.memory_nodes != 1 || a.colocated {
        return Err(crate::bad_input(
            "--machines, --memory-nodes and --colocated shape the simulator (--backend sim)",
        ));
    }
    let (mut unix, mut tcp) = (Vec::new(), Vec::new());
    for t in &a.connect {
        match t {
            Listen::Unix(p) => unix.push(p.clone()),
            Listen::Tcp(h) => tcp.push(h.clone()),
        }
    }
    match a.backend {
        Backend::Sim => Err(crate::bad_input("bench micro --backend sim: the verbs micro-benchmark on the simulator is `dmkit sim speed` \
                    (and `dmkit sim reproduce smart-fig3a|smart-fig4a` for SMART's sweeps)")),
        Backend::Verbs => {
            if !unix.is_empty() || tcp.is_empty() {
                return Err(crate::bad_input("--backend verbs: give the memory nodes as --connect tcp:HOST:PORT \
                            (start them with `dmkit memnode --listen tcp:HOST:PORT`)"));
            }
            if a.rtt.is_some()
                || a.mem_size.is_some()
                || a.page_size.is_some()
                || a.deferred_reads.is_some()
            {
                return Err(crate::bad_input("--rtt, --mem-size, --page-size and --deferred-reads are shm options; verbs nodes are separate processes"));
            }
            if a.token_file.is_some() && tcp.len() > 1 {
                return Err(crate::bad_input("--token-file names one file; with several --connect use each node's default token file"));
            }
            let targets: Vec<dmkit_verbs::VerbsTarget> = tcp
                .iter()
                .map(|addr| dmkit_verbs::VerbsTarget {
                    addr: addr.clone(),
                    token_file: a
                        .token_file
                        .clone()
                        .unwrap_or_else(|| dmkit_verbs::default_token_path(addr)),
                })
                .collect();
            let d = dmkit_verbs::VerbsConfig::default();
            let cfg = dmkit_verbs::VerbsConfig {
                device: a.rdma.sel(),
                completion_timeout: a.completion_timeout.unwrap_or(d.completion_timeout),
                ..d
            };
            dmkit_verbs::open_fabric(cfg, &targets).map_err(|e| e.to_string())
        }
        Backend::Shm if a.completion_timeout.is_some() => Err(crate::bad_input(
            "--completion-timeout is a verbs option (--backend verbs): shm completes every request it accepts",
        )),
        Backend::Shm => {
            if !tcp.is_empty() {
                return Err(crate::bad_input("tcp:HOST:PORT nodes serve RDMA devices: use --backend verbs (shm nodes listen on unix:PATH)"));
            }
            let cfg = a.shm_config();
            let f = if unix.is_empty() {
                let size = a.mem_size.unwrap_or(needed);
                let flag = if a.mem_size.is_some() {
                    "--mem-size"
                } else {
                    "the embedded memory node (--region-size, --keys, --value-size)"
                };
                dmkit_bench::harness::check_memory(flag, size).map_err(crate::bad_input)?;
                ShmFabric::embedded(
                    cfg,
                    &[NodeConfig {
                        size,
                        page_size: a.page_size.unwrap_or(NodeConfig::default().page_size),
                        ..Default::default()
                    }],
                )
            } else {
                if a.mem_size.is_some() || a.page_size.is_some() {
                    return Err(crate::bad_input("--mem-size and --page-size configure the embedded node; with --connect the node process has its own --size and --page-size"));
                }
                ShmFabric::open(cfg, &targets(&unix, &a.token_file)?)
            }
            .map_err(|e| e.to_string())?;
            Ok(Arc::new(f))
        }
    }
}

/// Checks a benchmark's output files before any work (issue: a typo in an
/// output path must not cost a whole run): `--json` must be writable;
/// `--plot` writable and named with a format the plotter writes (.png,
/// .svg, .pdf). Each refusal is a bad-input error naming the flag.
pub(crate) fn check_outputs(json: Option<&Path>, plot: Option<&Path>) -> Result<(), String> {
    if let Some(p) = json {
        dmkit_bench::harness::check_output("--json", p).map_err(crate::bad_input)?;
    }
    if let Some(p) = plot {
        dmkit_bench::plot::Format::of_path(p)
            .map_err(|e| crate::bad_input(format!("--plot {e}")))?;
        dmkit_bench::harness::check_output("--plot", p).map_err(crate::bad_input)?;
    }
    Ok(())
}

/// The measurement discipline's command-line side, shared by every bench
/// (`dmkit_bench::harness`): a warning when polling threads oversubscribe
/// the cores (not on the simulator, whose threads are virtual), and Ctrl-C
/// as a normal end of the measurement.
pub(crate) fn start_measuring(threads: usize, sim: bool) {
    if !sim {
        if let Some(w) = dmkit_bench::harness::oversubscribed(threads) {
            eprintln!("dmkit: warning: {w}");
        }
    }
    crate::args::stop_on_ctrl_c();
}

/// A single-point bench's result as `--repeat` handles it.
pub(crate) trait Run: serde::Serialize {
    /// Its throughput (the spread is of this).
    fn mops(&self) -> f64;
    /// Whether Ctrl-C ended its window early.
    fn interrupted(&self) -> bool;
    /// Prints its row of the table (after the header if `header`).
    fn print_row(&self, header: bool);
}

/// How a single-point bench measures (`bench corm`, `bench rpc`): its
/// client threads (the oversubscription warning), whether on the
/// simulator, the provenance's seed and window, `--repeat` and `--json`.
pub(crate) struct Measure<'a> {
    pub(crate) threads: usize,
    pub(crate) sim: bool,
    pub(crate) seed: u64,
    pub(crate) duration: Duration,
    pub(crate) warmup: Duration,
    pub(crate) repeat: usize,
    pub(crate) json: Option<&'a Path>,
}

impl Measure<'_> {
    /// Starts measuring, runs `once` `--repeat` times printing each
    /// run's row, then prints the spread and writes `--json`
    /// ([`finish_runs`]).
    pub(crate) fn runs<T: Run>(&self, mut once: impl FnMut() -> Result<T, String>) -> Res {
        start_measuring(self.threads, self.sim);
        let provenance =
            dmkit_bench::harness::Provenance::new(self.seed, self.duration, self.warmup, false)
                .repeat(self.repeat);
        let mut header = true;
        let runs = repeated(self.repeat, || {
            let r = once()?;
            r.print_row(std::mem::take(&mut header));
            Ok(r)
        })?;
        finish_runs(self.json, &provenance, &runs, T::mops, T::interrupted)
    }
}

/// `--repeat N`: runs `once` N times, or until Ctrl-C (a run it ended
/// is kept: its figures are of the shortened window). Refuses 0.
pub(crate) fn repeated<T>(
    n: usize,
    mut once: impl FnMut() -> Result<T, String>,
) -> Result<Vec<T>, String> {
    if n == 0 {
        return Err(crate::bad_input("--repeat must be at least 1"));
    }
    let mut runs = Vec::with_capacity(n);
    for _ in 0..n {
        if dmkit_bench::harness::interrupted() {
            break;
        }
        runs.push(once()?);
    }
    Ok(runs)
}

/// After a single-point bench's runs: prints their spread, says when
/// Ctrl-C cut the last one short (`interrupted` reads a run's mark), and
/// writes `--json` ([`write_runs`]).
pub(crate) fn finish_runs<T: serde::Serialize>(
    path: Option<&Path>,
    provenance: &dmkit_bench::harness::Provenance,
    runs: &[T],
    mops: impl Fn(&T) -> f64,
    interrupted: impl Fn(&T) -> bool,
) -> Result<(), String> {
    print_spread(&runs.iter().map(&mops).collect::<Vec<_>>());
    if runs.iter().any(interrupted) {
        eprintln!("dmkit: interrupted: the last run's figures are of its shortened window");
    }
    write_runs(path, provenance, runs, mops)
}

/// Prints the mean and spread of repeated runs' throughput (nothing for
/// one run).
pub(crate) fn print_spread(mops: &[f64]) {
    if mops.len() > 1 {
        let m = dmkit_bench::harness::Spread::of(mops);
        println!(
            "{} runs: {:.4} Mops mean, {:.4} standard deviation, {:.4} to {:.4}",
            m.n, m.mean, m.stddev, m.min, m.max
        );
    }
}

/// Writes a single-point bench's `--json`: its result as it serialises
/// (one run), or `{mops: spread, runs}` (`--repeat`), each after the
/// provenance.
pub(crate) fn write_runs<T: serde::Serialize>(
    path: Option<&Path>,
    provenance: &dmkit_bench::harness::Provenance,
    runs: &[T],
    mops: impl Fn(&T) -> f64,
) -> Result<(), String> {
    let Some(path) = path else { return Ok(()) };
    match runs {
        [one] => dmkit_bench::harness::write_json(path, provenance, one),
        _ => {
            let body = serde_json::json!({
                "mops": dmkit_bench::harness::Spread::of(&runs.iter().map(mops).collect::<Vec<_>>()),
                "runs": runs,
            });
            dmkit_bench::harness::write_json(path, provenance, &body)
        }
    }
}

/// `--repeat N` of a sweep bench: at least 1, and 1 on the simulator,
/// which is deterministic (a repeat would give the same figures).
pub(crate) fn check_repeat(n: usize, sim: bool) -> Result<(), String> {
    if n == 0 {
        return Err(crate::bad_input("--repeat must be at least 1"));
    }
    if sim && n > 1 {
        return Err(crate::bad_input(
            "--repeat: the simulator is deterministic, a repeat gives the same figures \
             (vary --seed instead)",
        ));
    }
    Ok(())
}

/// A sweep's runs grouped by point: consecutive runs whose `key` (the
/// point's swept fields, a JSON object) is equal are one point's repeats.
fn group_runs<T>(
    runs: &[T],
    key: impl Fn(&T) -> serde_json::Value,
) -> Vec<(serde_json::Value, &[T])> {
    let mut groups: Vec<(serde_json::Value, &[T])> = Vec::new();
    let mut start = 0;
    for i in 1..=runs.len() {
        if i == runs.len() || key(&runs[i]) != key(&runs[start]) {
            groups.push((key(&runs[start]), &runs[start..i]));
            start = i;
        }
    }
    groups
}

/// `k=v k=v` of a point's key (its swept fields), only those of `shown`
/// (the fields that vary over the sweep).
fn point_label(key: &serde_json::Value, shown: &[String]) -> String {
    let Some(o) = key.as_object() else {
        return String::new();
    };
    let parts: Vec<String> = o
        .iter()
        .filter(|(k, _)| shown.contains(k))
        .map(|(k, v)| match v {
            serde_json::Value::String(s) => format!("{k}={s}"),
            v => format!("{k}={v}"),
        })
        .collect();
    if parts.is_empty() {
        "the point".into()
    } else {
        parts.join(" ")
    }
}

/// After a sweep's runs (each point's `--repeat` runs in a row): prints
/// each point's mean and spread (with `--repeat` > 1), says when Ctrl-C
/// cut the sweep short, and writes `--json`: `{provenance, runs: [every
/// run]}` (what `dmkit plot` reads; it draws each point's mean), and with
/// `--repeat` also `points: [{the point's swept fields…, mops: spread}]`.
pub(crate) fn finish_sweep<T: serde::Serialize>(
    path: Option<&Path>,
    provenance: &dmkit_bench::harness::Provenance,
    runs: &[T],
    key: impl Fn(&T) -> serde_json::Value,
    mops: impl Fn(&T) -> f64,
) -> Result<(), String> {
    use dmkit_bench::harness::Spread;
    let mut points = Vec::new();
    if provenance.repeat > 1 {
        println!("mean and spread of each point's Mops over its runs:");
        let groups = group_runs(runs, &key);
        // The label names the fields that vary over the sweep.
        let shown: Vec<String> = groups
            .first()
            .and_then(|(k, _)| k.as_object())
            .map(|o| {
                o.keys()
                    .filter(|f| {
                        groups
                            .iter()
                            .any(|(g, _)| g.get(f.as_str()) != o.get(f.as_str()))
                    })
                    .cloned()
                    .collect()
            })
            .unwrap_or_default();
        for (k, rs) in groups {
            let m = Spread::of(&rs.iter().map(&mops).collect::<Vec<_>>());
            println!(
                "  {}: {} run{}, {:.4} mean, {:.4} standard deviation, {:.4} to {:.4}",
                point_label(&k, &shown),
                m.n,
                if m.n == 1 { "" } else { "s" },
                m.mean,
                m.stddev,
                m.min,
                m.max
            );
            let mut k = k;
            if let Some(o) = k.as_object_mut() {
                o.insert(
                    "mops".into(),
                    serde_json::to_value(&m).expect("plain numbers"),
                );
            }
            points.push(k);
        }
    }
    if dmkit_bench::harness::interrupted() {
        eprintln!(
            "dmkit: interrupted: {} runs measured, the last one over its shortened window",
            runs.len()
        );
    }
    let Some(path) = path else { return Ok(()) };
    let body = if provenance.repeat > 1 {
        serde_json::json!({ "runs": runs, "points": points })
    } else {
        serde_json::json!({ "runs": runs })
    };
    dmkit_bench::harness::write_json(path, provenance, &body)
}
