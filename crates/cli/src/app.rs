//! `dmkit app`: the memory-semantics study's applications (§IV) —
//! `shuffle`, `join`, `log`, and the hash table's breakdown
//! (`hashtable`) — on the shm backend (OS threads, an embedded memory
//! node) or the simulator. Every run checks its output; a list of methods
//! runs them side by side in one invocation (the first is the baseline of
//! the `×` column). `--json F` writes the result (an array for several
//! methods or steps).

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use clap::{Args, Subcommand, ValueEnum};
use dmkit_apps::platform::Platform;
use dmkit_apps::{AppResult, Method};
use dmkit_fabric::shm::{ShmConfig, ShmFabric};
use dmkit_fabric::Fabric;
use dmkit_memnode::NodeConfig;

use crate::args::WritePrefetchArg;
use crate::units::parse_size;
use crate::Res;

#[derive(Subcommand)]
pub(crate) enum AppCmd {
    /// Distributed shuffle (§IV-C): n executors push to m partitions.
    Shuffle(ShuffleArgs),
    /// Distributed join (§IV-D): partition through the shuffle, build, probe.
    Join(JoinArgs),
    /// Distributed log (§IV-E): FAA-reserved appends, one by one or batched.
    Log(LogArgs),
    /// The disaggregated hash table's breakdown (§IV-B): basic, +numa,
    /// +io-consolidation, +atomics.
    Hashtable(HashtableArgs),
}

#[derive(Clone, Copy, PartialEq, Eq, ValueEnum)]
enum AppBackend {
    /// OS threads over an embedded shm memory node.
    Shm,
    /// The deterministic RNIC simulator (times are virtual).
    Sim,
}

#[derive(Clone, Copy, PartialEq, Eq, ValueEnum)]
enum NumaArg {
    /// One socket per machine.
    Off,
    /// The study's testbed: two sockets, the NIC's ports on socket 1;
    /// executors alternate between the sockets.
    Testbed,
    /// Two sockets, a port each, matched connections; executors alternate.
    Aware,
}

/// Where an application runs.
#[derive(Args)]
struct Where {
    #[arg(long, value_enum, default_value = "shm")]
    backend: AppBackend,
    /// Memory nodes.
    #[arg(long, default_value_t = 1)]
    memory_nodes: usize,
    /// Bytes per memory node (shm: the embedded node; sim: each node).
    #[arg(long, default_value = "1GiB", value_parser = parse_size)]
    mem_size: u64,
    /// shm: a network round trip added to every completion (e.g. 2us),
    /// the regime batching is for; none by default.
    #[arg(long, value_parser = humantime::parse_duration)]
    rtt: Option<Duration>,
    /// shm: after a WRITE, prefetch the remote lines that follow it for
    /// writing, so a sequential stream of WRITEs (a partition buffer, a
    /// log) does not stall on each cold line (`ShmConfig::write_prefetch`):
    /// stream (= on) only after a WRITE that continues a recent one,
    /// always after every WRITE, or off.
    #[arg(long, value_enum, default_value_t = WritePrefetchArg::On)]
    shm_write_prefetch: WritePrefetchArg,
    /// Simulator: device profile (the study's hardware: cx3-40g).
    #[arg(long, default_value = "cx3-40g")]
    profile: String,
    /// Simulator: compute machines the executors are spread over.
    #[arg(long, default_value_t = 1)]
    machines: usize,
    /// Simulator: sockets (see `dmkit_sim::numa`).
    #[arg(long, value_enum, default_value = "off")]
    numa: NumaArg,
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// Write the result(s) as JSON to this file.
    #[arg(long)]
    json: Option<PathBuf>,
    /// Runs every method this many times, interleaved (each method once
    /// per round, in the order given), each run checked; a method's row
    /// is its median round by wall time (the slower middle one for an
    /// even count), and `round_seconds` in the JSON lists every round.
    /// On a shared host a window of tens of milliseconds moves by tens of
    /// percent from one run to the next, so a ratio between methods is
    /// read from medians of interleaved rounds. Default: 5 on shm; 1 on
    /// the simulator, which is deterministic (more is refused there).
    #[arg(long)]
    rounds: Option<usize>,
}

impl Where {
    fn rounds(&self) -> Result<usize, String> {
        match (self.backend, self.rounds) {
            (_, Some(0)) => Err("--rounds must be at least 1".into()),
            (AppBackend::Sim, Some(n)) if n > 1 => Err(format!(
                "--rounds {n}: the simulator is deterministic, every round would repeat the first"
            )),
            (AppBackend::Sim, _) => Ok(1),
            (AppBackend::Shm, n) => Ok(n.unwrap_or(DEFAULT_ROUNDS)),
        }
    }

    fn platform(&self) -> Result<Platform, String> {
        match self.backend {
            AppBackend::Shm => {
                let nodes: Vec<NodeConfig> = (0..self.memory_nodes)
                    .map(|i| NodeConfig {
                        node_id: i as u16,
                        size: self.mem_size,
                        ..Default::default()
                    })
                    .collect();
                let shm = ShmConfig {
                    rtt: self.rtt,
                    write_prefetch: self.shm_write_prefetch.into(),
                    ..ShmConfig::default()
                };
                let f = ShmFabric::embedded(shm, &nodes).map_err(|e| e.to_string())?;
                Ok(Platform::Threads(Arc::new(f) as Arc<dyn Fabric>))
            }
            AppBackend::Sim => {
                let numa = match self.numa {
                    NumaArg::Off => None,
                    NumaArg::Testbed => Some(dmkit_sim::NumaLayout {
                        sockets: 2,
                        ports: vec![1, 1],
                        rule: dmkit_sim::PortRule::First,
                    }),
                    NumaArg::Aware => Some(dmkit_sim::NumaLayout {
                        sockets: 2,
                        ports: vec![0, 1],
                        rule: dmkit_sim::PortRule::Matched,
                    }),
                };
                Platform::sim(dmkit_sim::SimConfig {
                    profile: dmkit_sim::Profile::load(&self.profile)?,
                    compute_machines: self.machines,
                    memory_nodes: self.memory_nodes,
                    memory_bytes: self.mem_size,
                    page_size: 2 << 20,
                    seed: self.seed,
                    numa,
                    ..Default::default()
                })
                .map_err(|e| e.to_string())
            }
        }
    }

    fn max_sge(&self) -> Result<usize, String> {
        Ok(match self.backend {
            AppBackend::Shm => ShmConfig::default().max_batch.min(16),
            AppBackend::Sim => dmkit_sim::Profile::load(&self.profile)?.limits.max_sge,
        })
    }
}

/// Where a shuffle source's entries sit when its stage starts
/// (`dmkit_apps::shuffle::SourceMemory`).
#[derive(Clone, Copy, PartialEq, Eq, ValueEnum)]
enum SourceMemoryArg {
    /// In registered (RDMA-enabled) memory, as the study has them: SGL and
    /// the unbatched WRITEs point at the entries, SP copies each into its
    /// packing slot. Costs `records × entry` bytes of registered memory per
    /// executor (128 MiB at 2 M records of 64 B).
    Registered,
    /// In an unregistered heap: every method copies each entry once into
    /// registered memory (a 256 KiB ring; SP's packing slots).
    Staged,
}

impl From<SourceMemoryArg> for dmkit_apps::shuffle::SourceMemory {
    fn from(a: SourceMemoryArg) -> Self {
        match a {
            SourceMemoryArg::Registered => Self::Registered,
            SourceMemoryArg::Staged => Self::Staged,
        }
    }
}

#[derive(Args)]
pub(crate) struct ShuffleArgs {
    #[command(flatten)]
    at: Where,
    /// Methods: none (unbatched), doorbell, sp, sgl; a list runs each.
    #[arg(long, value_delimiter = ',', default_value = "none,sp,sgl")]
    method: Vec<Method>,
    /// Entries per batch.
    #[arg(long, default_value_t = 16)]
    batch: usize,
    /// Source executors.
    #[arg(long, default_value_t = 4)]
    executors: usize,
    /// Partitions (default: as many as executors).
    #[arg(long)]
    parts: Option<usize>,
    /// Entries per executor.
    #[arg(long, default_value_t = 200_000)]
    records: u64,
    /// Bytes per entry.
    #[arg(long, default_value_t = 64)]
    entry: usize,
    /// Posts in flight per executor.
    #[arg(long, default_value_t = 16)]
    depth: usize,
    /// Where the entries sit when the stage starts (the study's model:
    /// registered).
    #[arg(long, value_enum, default_value = "registered")]
    source_memory: SourceMemoryArg,
}

#[derive(Args)]
pub(crate) struct JoinArgs {
    #[command(flatten)]
    at: Where,
    /// Methods of the partition phase; a list runs each.
    #[arg(long, value_delimiter = ',', default_value = "none,sgl")]
    method: Vec<Method>,
    #[arg(long, default_value_t = 16)]
    batch: usize,
    #[arg(long, default_value_t = 4)]
    executors: usize,
    /// Inner-relation tuples per executor.
    #[arg(long, default_value_t = 100_000)]
    inner: u64,
    /// Outer-relation tuples per executor.
    #[arg(long, default_value_t = 100_000)]
    outer: u64,
    #[arg(long, default_value_t = 32)]
    entry: usize,
    #[arg(long, default_value_t = 16)]
    depth: usize,
    /// Where the partition phase's tuples sit when it starts (see `app
    /// shuffle --source-memory`).
    #[arg(long, value_enum, default_value = "registered")]
    source_memory: SourceMemoryArg,
}

#[derive(Args)]
pub(crate) struct LogArgs {
    #[command(flatten)]
    at: Where,
    /// Methods; a list runs each.
    #[arg(long, value_delimiter = ',', default_value = "none,sp,sgl")]
    method: Vec<Method>,
    /// Records per reservation.
    #[arg(long, default_value_t = 16)]
    batch: usize,
    /// Writers.
    #[arg(long, default_value_t = 4)]
    executors: usize,
    /// Records per writer. A million by default: with 100 k, a batched
    /// run's window was 10–20 ms on a 2-core shm host and its ratio to
    /// the unbatched run swung between 3× and 8× from run to run.
    #[arg(long, default_value_t = 1_000_000)]
    records: u64,
    /// Bytes per record.
    #[arg(long, default_value_t = 64)]
    entry: usize,
    #[arg(long, default_value_t = 8)]
    depth: usize,
}

#[derive(Args)]
pub(crate) struct HashtableArgs {
    /// Steps (each with the ones before it).
    #[arg(
        long,
        value_delimiter = ',',
        default_value = "basic,numa,io-consolidation,atomics"
    )]
    steps: Vec<dmkit_apps::hashtable::Step>,
    #[arg(long, value_enum, default_value = "shm")]
    backend: AppBackend,
    /// Simulator: device profile.
    #[arg(long, default_value = "cx3-40g")]
    profile: String,
    /// Front ends (compute machines; simulator only).
    #[arg(long, default_value_t = 1)]
    front_ends: usize,
    /// Threads per front end.
    #[arg(long, default_value_t = 2)]
    threads: usize,
    #[arg(long, default_value_t = 4)]
    coros: usize,
    #[arg(long, default_value_t = 100_000)]
    keys: u64,
    /// Hot keys of the IO-consolidation steps.
    #[arg(long, default_value_t = 1024)]
    hot_keys: usize,
    #[arg(long, default_value_t = 16)]
    theta: u32,
    /// Versions per cold entry in the +atomics step (the study's
    /// multi-version entries; 0: that step is backoff alone).
    #[arg(long, default_value_t = dmkit_apps::hashtable::DEFAULT_VERSIONS)]
    cold_versions: u32,
    #[arg(long, default_value = "2s", value_parser = humantime::parse_duration)]
    duration: Duration,
    #[arg(long, default_value = "200ms", value_parser = humantime::parse_duration)]
    warmup: Duration,
    #[arg(long, default_value_t = 1)]
    seed: u64,
    #[arg(long)]
    json: Option<PathBuf>,
}

/// Rounds per method on shm unless `--rounds` says otherwise.
const DEFAULT_ROUNDS: usize = 5;

/// Runs `one(method)` for every method of `methods`, `rounds` times
/// interleaved (round after round, each method once per round), and keeps
/// each method's median round (see `Where::rounds`).
fn interleaved(
    methods: &[Method],
    rounds: usize,
    mut one: impl FnMut(Method) -> Result<AppResult, String>,
) -> Result<Vec<AppResult>, String> {
    let mut runs: Vec<Vec<AppResult>> = vec![Vec::with_capacity(rounds); methods.len()];
    for _ in 0..rounds {
        for (i, &m) in methods.iter().enumerate() {
            runs[i].push(one(m)?);
        }
    }
    Ok(runs.into_iter().map(median_round).collect())
}

/// The median of one method's rounds by wall time (the slower middle one
/// of an even count), with every round's seconds in `round_seconds`.
fn median_round(mut rounds: Vec<AppResult>) -> AppResult {
    assert!(!rounds.is_empty(), "a method runs at least once");
    let seconds: Vec<f64> = rounds.iter().map(|r| r.seconds).collect();
    rounds.sort_by(|a, b| a.seconds.total_cmp(&b.seconds));
    let mut r = rounds.swap_remove(rounds.len() / 2);
    if seconds.len() > 1 {
        r.round_seconds = seconds;
    }
    r
}

fn print(rs: &[AppResult]) {
    println!(
        "{:<9} {:<8} {:<9} {:>5} {:>9} {:>11} {:>10} {:>13} {:>8} {:>9} {:>8}",
        "app",
        "backend",
        "method",
        "batch",
        "executors",
        "records",
        "seconds",
        "records/s",
        "x first",
        "B/record",
        "verified"
    );
    let base = rs.first().map_or(1.0, |r| r.records_per_s);
    for r in rs {
        println!(
            "{:<9} {:<8} {:<9} {:>5} {:>9} {:>11} {:>10.4} {:>13.0} {:>8.2} {:>9.1} {:>8}",
            r.app,
            r.backend,
            r.method,
            r.batch,
            r.executors,
            r.records,
            r.seconds,
            r.records_per_s,
            r.records_per_s / base.max(1e-12),
            r.bytes_per_record,
            r.verified
        );
        for (name, v) in &r.phases {
            if name != &r.app && r.phases.len() > 1 {
                println!("{:>20} {name}: {v:.4}", "");
            }
        }
        if let [first, rest @ ..] = r.round_seconds.as_slice() {
            let (lo, hi) = rest
                .iter()
                .fold((*first, *first), |(lo, hi), &s| (lo.min(s), hi.max(s)));
            println!(
                "{:>20} median of {} rounds; seconds {lo:.4} to {hi:.4}",
                "",
                r.round_seconds.len()
            );
        }
    }
}

fn write_json<T: serde::Serialize>(path: &Option<PathBuf>, rs: &[T]) -> Res {
    let Some(p) = path else { return Ok(()) };
    let text = if rs.len() == 1 {
        serde_json::to_string_pretty(&rs[0])
    } else {
        serde_json::to_string_pretty(rs)
    }
    .expect("results serialise");
    std::fs::write(p, text + "\n").map_err(|e| format!("writing {}: {e}", p.display()))
}

pub(crate) fn app(cmd: AppCmd) -> Res {
    match cmd {
        AppCmd::Shuffle(a) => {
            let rs = interleaved(&a.method, a.at.rounds()?, |method| {
                let mut p = a.at.platform()?;
                let cfg = dmkit_apps::shuffle::ShuffleConfig {
                    executors: a.executors,
                    parts: a.parts.unwrap_or(a.executors),
                    records: a.records,
                    entry: a.entry,
                    push: dmkit_apps::shuffle::PushParams {
                        method,
                        batch: a.batch,
                        depth: a.depth,
                        max_sge: a.at.max_sge()?,
                        kill_after: None,
                        source: a.source_memory.into(),
                    },
                    seed: a.at.seed,
                };
                let (mut r, _) =
                    dmkit_apps::shuffle::run(&mut p, &cfg, None, 0).map_err(|e| e.to_string())?;
                r.numa = a.at.numa == NumaArg::Aware;
                Ok(r)
            })?;
            print(&rs);
            write_json(&a.at.json, &rs)
        }
        AppCmd::Join(a) => {
            let rs = interleaved(&a.method, a.at.rounds()?, |method| {
                let mut p = a.at.platform()?;
                let cfg = dmkit_apps::join::JoinConfig {
                    executors: a.executors,
                    inner: a.inner,
                    outer: a.outer,
                    entry: a.entry,
                    push: dmkit_apps::shuffle::PushParams {
                        method,
                        batch: a.batch,
                        depth: a.depth,
                        max_sge: a.at.max_sge()?,
                        kill_after: None,
                        source: a.source_memory.into(),
                    },
                    seed: a.at.seed,
                };
                let mut r = dmkit_apps::join::run(&mut p, &cfg).map_err(|e| e.to_string())?;
                r.numa = a.at.numa == NumaArg::Aware;
                Ok(r)
            })?;
            print(&rs);
            write_json(&a.at.json, &rs)
        }
        AppCmd::Log(a) => {
            let rs = interleaved(&a.method, a.at.rounds()?, |method| {
                let mut p = a.at.platform()?;
                let cfg = dmkit_apps::log::LogConfig {
                    executors: a.executors,
                    records: a.records,
                    entry: a.entry,
                    append: dmkit_apps::log::AppendParams {
                        method,
                        batch: a.batch,
                        depth: a.depth,
                        max_sge: a.at.max_sge()?,
                        lease: 1_000_000_000,
                        die_after: None,
                    },
                    seed: a.at.seed,
                };
                let mut r = dmkit_apps::log::run(&mut p, &cfg).map_err(|e| e.to_string())?;
                r.numa = a.at.numa == NumaArg::Aware;
                Ok(r)
            })?;
            print(&rs);
            write_json(&a.at.json, &rs)
        }
        AppCmd::Hashtable(a) => hashtable(a),
    }
}

fn hashtable(a: HashtableArgs) -> Res {
    use dmkit_bench::hashtable::{self as ht, HashtableRun};
    let run = HashtableRun {
        keys: a.keys,
        threads: a.threads,
        front_ends: if a.backend == AppBackend::Sim {
            a.front_ends
        } else {
            1
        },
        coros: a.coros,
        hot_keys: a.hot_keys,
        theta: a.theta,
        duration: a.duration,
        warmup: a.warmup,
        seed: a.seed,
        versions: a.cold_versions,
    };
    if a.backend == AppBackend::Shm {
        if let Some(why) = dmkit_runtime::numa::Topology::detect().proxy_reason() {
            eprintln!("+numa: {why}");
        }
    }
    let mut rows = Vec::new();
    println!(
        "{:<18} {:<8} {:>10} {:>9} {:>12} {:>12}",
        "step", "backend", "front-ends", "Mops", "x basic", "B written/op"
    );
    let mut base = None;
    for &step in &a.steps {
        let r = match a.backend {
            AppBackend::Shm => {
                let cfg = ht::config(step, &run);
                let size = dmkit_bench::ycsb_bench::memory_estimate(&cfg) + (64 << 20);
                let f = ShmFabric::embedded(
                    ShmConfig::default(),
                    &[NodeConfig {
                        size,
                        ..Default::default()
                    }],
                )
                .map_err(|e| e.to_string())?;
                ht::run(step, &run, Some(Arc::new(f)), None)
            }
            AppBackend::Sim => ht::run(
                step,
                &run,
                None,
                Some(dmkit_sim::SimConfig {
                    profile: dmkit_sim::Profile::load(&a.profile)?,
                    seed: a.seed,
                    ..Default::default()
                }),
            ),
        }
        .map_err(|e| e.to_string())?;
        let b = *base.get_or_insert(r.mops);
        println!(
            "{:<18} {:<8} {:>10} {:>9.3} {:>12.2} {:>12.1}",
            step.name(),
            r.backend,
            run.front_ends,
            r.mops,
            r.mops / b.max(1e-12),
            r.bytes_written_per_op
        );
        rows.push(serde_json::json!({
            "app": "hashtable",
            "step": step.name(),
            "backend": r.backend,
            "executors": run.front_ends * run.threads,
            "front_ends": run.front_ends,
            "records": r.ops,
            "seconds": r.seconds,
            "records_per_s": r.mops * 1e6,
            "bytes_per_record": r.bytes_written_per_op,
            // (A YCSB run does not check its results; the table's
            // correctness is the race tests' conformance suite.)
            "checked_by": "dmkit-race conformance and linearizability tests",
            "method": step.name(),
            "batch": if step.switches().hot_area { a.theta as usize } else { 1 },
            "cold_versions": if step.switches().multi_version { a.cold_versions } else { 0 },
        }));
    }
    write_json(&a.json, &rows)
}
