//! `dmkit`: run memory nodes and benchmarks.
//!
//! ```text
//! dmkit memnode --size 4GiB --listen unix:/tmp/dm0.sock
//! dmkit bench micro --verb read --threads 2 --duration 5s [--connect unix:/tmp/dm0.sock]
//! dmkit bench ycsb --index race --workload c --keys 1000000 --threads 2 --coros 8
//! dmkit plot a.json b.json -o out.png
//! dmkit node stats --connect unix:/tmp/dm0.sock
//! ```

mod units;

use std::io::IsTerminal;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use clap::{Args, Parser, Subcommand, ValueEnum};
use dmkit_bench::micro::{self, MicroConfig, Signal};
use dmkit_bench::plot;
use dmkit_bench::ycsb::{Distribution, KeyType, Workload};
use dmkit_bench::ycsb_bench::{self, YcsbConfig, YcsbResult};
use dmkit_fabric::shm::{parse_unix_target, ShmConfig, ShmFabric, Target};
use dmkit_fabric::{Fabric, VerbKind};
use dmkit_memnode::server::{default_token_path, Server};
use dmkit_memnode::{MemNode, NodeConfig};
use indicatif::{ProgressBar, ProgressStyle};

use units::{format_size, parse_size};

/// mimalloc instead of the system allocator: the simulator keeps the state
/// of thousands of tasks and connections in small allocations and walks
/// them in an order no cache predicts; mimalloc's size-segregated pages
/// pack them more densely. `dmkit sim speed` (6 machines × 96 threads × 8
/// tasks): 5.76 → 6.41 M simulated verbs per wall second, median of five
/// alternating runs; the single-machine run is unchanged.
#[global_allocator]
static ALLOC: mimalloc::MiMalloc = mimalloc::MiMalloc;

#[derive(Parser)]
#[command(
    name = "dmkit",
    version,
    about = "A toolkit for disaggregated memory over one-sided verbs"
)]
struct Cli {
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// Run a memory node process: shm clients on a Unix socket, or verbs
    /// clients (RDMA) on a TCP control channel.
    Memnode(MemnodeArgs),
    /// Benchmarks.
    #[command(subcommand)]
    Bench(Box<BenchCmd>),
    /// Control operations on a running memory node.
    #[command(subcommand)]
    Node(NodeCmd),
    /// Plot benchmark results (JSON files of `bench ycsb`): throughput vs threads.
    Plot(PlotArgs),
    /// The deterministic RNIC simulator: reproduce the papers' figures.
    #[command(subcommand)]
    Sim(SimCmd),
}

#[derive(Subcommand)]
enum SimCmd {
    /// Rerun a paper's figure in virtual time and compare with its numbers.
    Reproduce(ReproduceArgs),
    /// The simulator's own speed: 8-byte READs on many virtual threads,
    /// simulated verbs per wall-clock second.
    Speed(SpeedArgs),
    /// Run a concurrency scenario under fault injection over many seeds;
    /// print the first failing seed and how to replay it.
    Check(CheckArgs),
}

#[derive(Args)]
struct CheckArgs {
    /// Scenario: counters, race.
    #[arg(long)]
    scenario: String,
    /// How many seeds to run (from --first).
    #[arg(long, default_value_t = 100)]
    seeds: u64,
    /// First seed.
    #[arg(long, default_value_t = 1)]
    first: u64,
    /// Run exactly this seed (a replay), with a report of what it did.
    #[arg(long, conflicts_with_all = ["seeds", "first"])]
    seed: Option<u64>,
    /// Seeds to run at once, one core each [default: the cores this
    /// process may use]. The first failing seed reported does not depend
    /// on it.
    #[arg(long)]
    jobs: Option<usize>,
}

#[derive(Args)]
struct SpeedArgs {
    /// Compute machines.
    #[arg(long, default_value_t = 6)]
    machines: usize,
    /// Memory nodes.
    #[arg(long, default_value_t = 2)]
    memory_nodes: usize,
    /// Virtual threads per compute machine.
    #[arg(long, default_value_t = 96)]
    threads: usize,
    /// Tasks per thread.
    #[arg(long, default_value_t = 8)]
    tasks: usize,
    /// READs each task posts before it waits.
    #[arg(long, default_value_t = 1)]
    depth: usize,
    /// One doorbell per task round of `--depth` READs (doorbell batching)
    /// instead of one per READ (SMART's bench tool).
    #[arg(long)]
    doorbell_batch: bool,
    /// Virtual time to simulate.
    #[arg(long, default_value = "1s", value_parser = humantime::parse_duration)]
    duration: Duration,
    /// Device profile: cx6-200g, cx5-100g, cx3-56g, or a TOML file.
    #[arg(long, default_value = "cx6-200g")]
    profile: String,
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// Write the result as JSON to this file.
    #[arg(long)]
    json: Option<PathBuf>,
}

#[derive(Args)]
struct ReproduceArgs {
    /// Figure: smart-fig3a, smart-fig4a, smart-table1, smart-fig7,
    /// smart-fig12, smart-fig14, smart-art-fig11, smart-art-fig15,
    /// memsem-fig13.
    name: String,
    /// Device profile: cx6-200g, cx5-100g, cx3-56g, or a TOML file.
    #[arg(long, default_value = "cx6-200g")]
    profile: String,
    /// Override the profile's order among atomics waiting for one address:
    /// post, arrival, random, newest, round-robin (see the profile's
    /// `atomic_order`).
    #[arg(long, value_parser = parse_atomic_order)]
    atomic_order: Option<dmkit_sim::profile::AtomicOrder>,
    /// Override the profile's `atomic_stalls_access`: READs and WRITEs of
    /// a word wait for the atomics queued on it (SwordBox §3.2; post
    /// order only: another --atomic-order turns it off unless given).
    #[arg(long, value_enum)]
    atomic_stalls_access: Option<OnOff>,
    /// Seed of the simulation (same seed, same result, bit for bit).
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// Fewer points, shorter windows (a smoke run).
    #[arg(long)]
    quick: bool,
    /// smart-table1: scale intervals and the throttle's epochs by this factor.
    #[arg(long, default_value_t = 0.125)]
    time_scale: f64,
    /// Candidate C_max values of throttled runs (default: SMART Algorithm 1's
    /// 4,6,8,10,12; "unlimited" may be listed).
    #[arg(long, value_delimiter = ',', value_parser = parse_c_max)]
    tuner_candidates: Option<Vec<u32>>,
    /// Write the rows as JSON to this file.
    #[arg(long)]
    json: Option<PathBuf>,
    /// Write a PNG chart (reproduced lines and the paper's points).
    #[arg(long)]
    plot: Option<PathBuf>,
    /// Runs to execute at once, one core each [default: the cores this
    /// process may use]. The rows do not depend on it.
    #[arg(long)]
    jobs: Option<usize>,
    /// No progress bar.
    #[arg(long)]
    quiet: bool,
}

#[derive(Args)]
struct PlotArgs {
    /// Result files written by --json.
    #[arg(required = true)]
    files: Vec<PathBuf>,
    /// The PNG to write.
    #[arg(short, long)]
    output: PathBuf,
}

#[derive(Args)]
struct MemnodeArgs {
    /// Remote memory size (e.g. 4GiB).
    #[arg(long, default_value = "1GiB", value_parser = parse_size)]
    size: u64,
    /// Where to listen: unix:PATH (shm clients) or tcp:HOST:PORT (verbs
    /// clients over an RDMA device; needs a build with --features dmkit/verbs).
    #[arg(long, value_parser = parse_listen)]
    listen: Listen,
    /// Token file to create (mode 0600); default PATH.token.
    #[arg(long)]
    token_file: Option<PathBuf>,
    /// Memory node id (the high 16 bits of its global addresses).
    #[arg(long, default_value_t = 0)]
    node_id: u16,
    /// Translation page size: 4KiB or 2MiB.
    #[arg(long, default_value = "4KiB", value_parser = parse_size)]
    page_size: u64,
    /// Spare memory pages for run-time remapping.
    #[arg(long, default_value_t = 64)]
    spare_pages: u64,
    #[command(flatten)]
    rdma: RdmaArgs,
}

/// RDMA device selection (tcp: listeners and --backend verbs). Nothing is
/// hard-coded: default device = the first listed, port 1, GID = the first
/// RoCE v2 IPv4-mapped GID (RoCE) or LID routing (InfiniBand).
#[derive(Args, Clone)]
struct RdmaArgs {
    /// RDMA device name (e.g. mlx5_0, rxe0).
    #[arg(long)]
    rdma_device: Option<String>,
    /// Device port (1-based).
    #[arg(long)]
    rdma_port: Option<u8>,
    /// GID index (RoCE; on InfiniBand selects routing with a global header).
    #[arg(long)]
    gid_index: Option<u8>,
}

impl RdmaArgs {
    fn sel(&self) -> dmkit_verbs::DeviceSel {
        dmkit_verbs::DeviceSel {
            device: self.rdma_device.clone(),
            port: self.rdma_port,
            gid_index: self.gid_index,
        }
    }
}

/// Where a memory node listens / is reached.
#[derive(Clone, Debug)]
enum Listen {
    Unix(PathBuf),
    Tcp(String),
}

fn parse_listen(s: &str) -> Result<Listen, String> {
    match s.strip_prefix("tcp:") {
        Some(a)
            if a.rsplit_once(':')
                .is_some_and(|(h, p)| !h.is_empty() && p.parse::<u16>().is_ok()) =>
        {
            Ok(Listen::Tcp(a.to_string()))
        }
        Some(_) => Err(format!("{s:?}: expected tcp:HOST:PORT")),
        None => parse_unix_target(s)
            .map(Listen::Unix)
            .map_err(|_| format!("{s:?}: expected unix:PATH or tcp:HOST:PORT")),
    }
}

#[derive(Subcommand)]
enum BenchCmd {
    /// One verb at random addresses of a region, per thread, in batches.
    Micro(MicroArgs),
    /// YCSB on an index: load, then run a workload for --duration.
    Ycsb(YcsbArgs),
}

#[derive(Clone, Copy, ValueEnum)]
enum KeyTypeArg {
    /// 8-byte integers.
    Int,
    /// 32-byte e-mail-like strings.
    String,
}

#[derive(Clone, Copy, ValueEnum)]
enum DistArg {
    Uniform,
    Zipfian,
    Scrambled,
    Latest,
}

#[derive(Args)]
struct YcsbArgs {
    #[command(flatten)]
    fabric: FabricArgs,
    /// Index: race (remote hash table), art (remote radix tree), btree
    /// (remote B+tree), or the in-process peers local-hash and local-art.
    #[arg(long, default_value = "race")]
    index: ycsb_bench::IndexKind,
    /// Workload: load, a, b, c, d, e or f.
    #[arg(long, default_value = "c")]
    workload: Workload,
    /// Keys loaded before the run.
    #[arg(long, default_value_t = 1_000_000)]
    keys: u64,
    /// Threads (one worker each).
    #[arg(long, default_value_t = 2)]
    threads: usize,
    /// Tasks per thread (SMART's coroutines; remote indexes).
    #[arg(long, default_value_t = 8)]
    coros: usize,
    /// Zipfian skew θ.
    #[arg(long, default_value_t = 0.99)]
    zipf: f64,
    /// Key distribution (default: the workload's: latest for d, scrambled zipfian otherwise).
    #[arg(long, value_enum)]
    distribution: Option<DistArg>,
    /// Scrambled zipfian: draw ranks over this many items [default: YCSB's
    /// 10^10]; e.g. 100000000 gives a small table a 100 M-key table's hot keys.
    #[arg(long)]
    zipf_items: Option<u64>,
    #[arg(long, value_enum, default_value = "int")]
    key_type: KeyTypeArg,
    /// Value bytes.
    #[arg(long, default_value_t = 8)]
    value_size: usize,
    /// How long to run, not counting the load [default: 5s on shm, 20ms of
    /// virtual time on the simulator].
    #[arg(long, value_parser = humantime::parse_duration)]
    duration: Option<Duration>,
    /// Unmeasured run before --duration (lets contention and the runtime's
    /// adaptation settle).
    #[arg(long, default_value = "0s", value_parser = humantime::parse_duration)]
    warmup: Duration,
    /// Client cache entries per thread (race; 0 disables).
    #[arg(long, default_value_t = 1 << 16)]
    cache: usize,
    /// Hash table: put the run's N likeliest keys in a hot area served in
    /// blocks with IO consolidation (memory-semantics §IV-B; 0: off).
    #[arg(long, default_value_t = 0)]
    hot_keys: usize,
    /// Hash table: hot entries per block, as a power of two.
    #[arg(long, default_value_t = 3)]
    hot_block_log2: u32,
    /// Hash table: buffered modifications that force a hot block's write-back (θ).
    #[arg(long, default_value_t = 16)]
    hot_theta: u32,
    /// Hash table: longest a compute machine keeps a hot block, however busy.
    #[arg(long, default_value = "50us", value_parser = humantime::parse_duration)]
    hot_hold: Duration,
    /// Radix tree: bytes of internal nodes each compute machine caches, shared by its threads (0 disables).
    #[arg(long, default_value = "64MiB", value_parser = parse_size)]
    art_cache: u64,
    /// Radix tree: in-place leaf updates under the leaf lock (off:
    /// out-of-place leaves swung by CAS).
    #[arg(long, value_enum, default_value = "on")]
    in_place_leaf: OnOff,
    /// Radix tree: release the leaf lock with the write-back.
    #[arg(long, value_enum, default_value = "on")]
    rear_lock: OnOff,
    /// Radix tree: read delegation and write combining among a thread's tasks.
    #[arg(long, value_enum, default_value = "on")]
    rdwc: OnOff,
    /// Radix tree: lock-free internal nodes (off: every internal-node change
    /// under a remote node lock — Figure 15's baseline).
    #[arg(long, value_enum, default_value = "on")]
    lock_free_internal: OnOff,
    /// B+tree: bytes of internal nodes each compute machine caches, shared by its threads (0 disables).
    #[arg(long, default_value = "64MiB", value_parser = parse_size)]
    btree_cache: u64,
    /// B+tree: SMART-BT's speculative lookup (read one cached slot first).
    #[arg(long, value_enum, default_value = "on")]
    speculative: OnOff,
    /// B+tree: Sherman's hierarchical locks (local lock table, hand-over).
    #[arg(long, value_enum, default_value = "on")]
    hocl: OnOff,
    /// B+tree: lock tables in on-NIC device memory where the fabric has it.
    #[arg(long, value_enum, default_value = "on")]
    on_chip_locks: OnOff,
    /// B+tree: Sherman's command combination — lock CAS with the node READ,
    /// entry WRITE with the unlock, one round trip each (off: SMART's
    /// artifact B+tree, four round trips per write).
    #[arg(long, value_enum, default_value = "on")]
    combine: OnOff,
    /// B+tree: HOCL hand-overs to local waiters before a remote release.
    #[arg(long, default_value_t = 4)]
    max_handover: u32,
    /// B+tree: node size.
    #[arg(long, default_value = "1KiB", value_parser = parse_size)]
    btree_node: u64,
    /// B+tree: leaf entries per node (sets the node size; Sherman's span).
    #[arg(long)]
    btree_span: Option<usize>,
    #[command(flatten)]
    switches: SwitchArgs,
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// Write the result as JSON to this file.
    #[arg(long)]
    json: Option<PathBuf>,
    /// Also plot this result (throughput vs threads) to this PNG.
    #[arg(long)]
    plot: Option<PathBuf>,
    /// No progress bar.
    #[arg(long)]
    quiet: bool,
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

#[derive(Clone, Copy, ValueEnum)]
enum Verb {
    Read,
    Write,
    Cas,
    Faa,
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

#[derive(Clone, Copy, PartialEq, Eq, ValueEnum)]
enum OnOff {
    On,
    Off,
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
        if self.c_max.is_some() {
            c.fixed_c_max = self.c_max;
        }
        Ok(c)
    }
}

#[derive(Clone, Copy, ValueEnum)]
enum SignalArg {
    All,
    Last,
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
    /// Simulator: device profile (cx6-200g, cx5-100g, cx3-56g, or a TOML file).
    #[arg(long, default_value = "cx6-200g")]
    profile: String,
    /// Simulator: override the profile's order among atomics waiting for
    /// one address (post, arrival, random, newest, round-robin).
    #[arg(long, value_parser = parse_atomic_order)]
    atomic_order: Option<dmkit_sim::profile::AtomicOrder>,
    /// Simulator: override the profile's `atomic_stalls_access` (READs and
    /// WRITEs of a word wait for the atomics queued on it; post order only:
    /// another --atomic-order turns it off unless given).
    #[arg(long, value_enum)]
    atomic_stalls_access: Option<OnOff>,
    /// Simulator: compute machines (--threads run on each).
    #[arg(long, default_value_t = 1)]
    machines: usize,
    /// Simulator: memory nodes.
    #[arg(long, default_value_t = 1)]
    memory_nodes: usize,
    /// Simulator: memory node i lives on compute machine i (Sherman's
    /// setup: every server is both).
    #[arg(long)]
    colocated: bool,
    #[command(flatten)]
    rdma: RdmaArgs,
}

impl FabricArgs {
    /// The simulated cluster these flags describe (`--backend sim`).
    fn sim_config(&self, needed: u64, seed: u64) -> Result<dmkit_sim::SimConfig, String> {
        if !self.connect.is_empty() || self.rtt.is_some() {
            return Err("--connect and --rtt are shm options; the simulator has its own memory nodes and timing".into());
        }
        Ok(dmkit_sim::SimConfig {
            profile: load_profile(&self.profile, self.atomic_order, self.atomic_stalls_access)?,
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

#[derive(Args)]
struct MicroArgs {
    #[command(flatten)]
    fabric: FabricArgs,
    /// The verb to issue.
    #[arg(long, value_enum, default_value = "read")]
    verb: Verb,
    /// Bytes per READ/WRITE (atomics: 8).
    #[arg(long, default_value = "8", value_parser = parse_size)]
    size: u64,
    /// Region the random addresses are drawn from.
    #[arg(long, default_value = "1GiB", value_parser = parse_size)]
    region_size: u64,
    /// Threads, each with its own queue pair.
    #[arg(long, default_value_t = 1)]
    threads: usize,
    /// Requests per batch (one doorbell).
    #[arg(long, default_value_t = 1)]
    batch: usize,
    /// How long to measure.
    #[arg(long, default_value = "5s", value_parser = humantime::parse_duration)]
    duration: Duration,
    /// Run through the runtime with this many tasks per thread (SMART's
    /// coroutines), each posting --depth requests and awaiting sync.
    #[arg(long)]
    coros: Option<usize>,
    /// Thread → queue pair mapping: shared, multiplexed:N, per-thread-qp,
    /// per-thread-doorbell (default per-thread-qp; shared with --thread-aware off).
    #[arg(long)]
    qp_policy: Option<dmkit_fabric::QpPolicy>,
    /// Requests each task posts per round (with --coros).
    #[arg(long, default_value_t = 1)]
    depth: usize,
    #[command(flatten)]
    switches: SwitchArgs,
    /// Signal every request, or only the last of each batch.
    #[arg(long, value_enum, default_value = "all")]
    signal: SignalArg,
    /// Seed of the address generator.
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// Write the result as JSON to this file.
    #[arg(long)]
    json: Option<PathBuf>,
    /// No progress bar.
    #[arg(long)]
    quiet: bool,
}

#[derive(Subcommand)]
enum NodeCmd {
    /// Print a node's statistics as JSON.
    Stats(ConnectArgs),
    /// Ask a node to shut down.
    Shutdown(ConnectArgs),
}

#[derive(Args)]
struct ConnectArgs {
    /// The node: unix:PATH.
    #[arg(long, value_parser = parse_unix_target)]
    connect: PathBuf,
    /// Token file (default PATH.token).
    #[arg(long)]
    token_file: Option<PathBuf>,
}

/// A closed standard output (`dmkit … | head`) ends the program quietly
/// with the status of a process killed by SIGPIPE (128 + 13), as other Unix
/// tools do, instead of `println!`'s panic and backtrace. (Rust ignores
/// SIGPIPE, so the write fails with EPIPE and `println!` panics with this
/// message; restoring the signal's default would need `unsafe`.)
fn quiet_on_closed_stdout() {
    let default = std::panic::take_hook();
    std::panic::set_hook(Box::new(move |info| {
        let p = info.payload();
        let msg = p
            .downcast_ref::<String>()
            .map(String::as_str)
            .or_else(|| p.downcast_ref::<&str>().copied())
            .unwrap_or("");
        if msg.starts_with("failed printing to stdout") && msg.contains("Broken pipe") {
            std::process::exit(141);
        }
        default(info);
    }));
}

fn main() -> ExitCode {
    quiet_on_closed_stdout();
    let cli = Cli::parse();
    let r = match cli.cmd {
        Cmd::Memnode(a) => memnode(a),
        Cmd::Bench(b) => match *b {
            BenchCmd::Micro(a) => bench_micro(a),
            BenchCmd::Ycsb(a) => bench_ycsb(a),
        },
        Cmd::Plot(a) => plot(a),
        Cmd::Sim(SimCmd::Reproduce(a)) => sim_reproduce(a),
        Cmd::Sim(SimCmd::Speed(a)) => sim_speed(a),
        Cmd::Sim(SimCmd::Check(a)) => sim_check(a),
        Cmd::Node(NodeCmd::Stats(a)) => node_stats(a),
        Cmd::Node(NodeCmd::Shutdown(a)) => node_shutdown(a),
    };
    match r {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("dmkit: {e}");
            ExitCode::FAILURE
        }
    }
}

type Res = Result<(), String>;

fn memnode(a: MemnodeArgs) -> Res {
    let node = MemNode::new(NodeConfig {
        node_id: a.node_id,
        size: a.size,
        page_size: a.page_size,
        spare_pages: a.spare_pages,
    })
    .map_err(|e| e.to_string())?;
    match &a.listen {
        Listen::Unix(path) => {
            let token = a
                .token_file
                .clone()
                .unwrap_or_else(|| default_token_path(path));
            let server = Server::bind(node, path, &token).map_err(|e| e.to_string())?;
            log(format_args!(
                "dmkit memnode: node {} serving {} (pages {}) on unix:{}; token file {}",
                a.node_id,
                format_size(a.size),
                format_size(a.page_size),
                path.display(),
                token.display()
            ));
            server.serve().map_err(|e| e.to_string())?;
        }
        Listen::Tcp(addr) => {
            let token = a
                .token_file
                .clone()
                .unwrap_or_else(|| dmkit_verbs::default_token_path(addr));
            dmkit_verbs::serve_node(node, &a.rdma.sel(), addr, &token, |bound, dev| {
                log(format_args!(
                    "dmkit memnode: node {} serving {} (pages {}) to verbs clients on tcp:{bound} via {dev}; token file {}",
                    a.node_id,
                    format_size(a.size),
                    format_size(a.page_size),
                    token.display()
                ))
            })
            .map_err(|e| e.to_string())?;
        }
    }
    log(format_args!("dmkit memnode: shut down"));
    Ok(())
}

/// Writes a log line to stderr, ignoring failure: a memory node must keep
/// serving (and exit cleanly) even when nobody reads its stderr any more.
fn log(args: std::fmt::Arguments<'_>) {
    use std::io::Write;
    let _ = writeln!(std::io::stderr(), "{args}");
}

fn targets(paths: &[PathBuf], token_file: &Option<PathBuf>) -> Result<Vec<Target>, String> {
    if token_file.is_some() && paths.len() > 1 {
        return Err("--token-file names one file; with several --connect use each node's default PATH.token".into());
    }
    Ok(paths
        .iter()
        .map(|p| Target {
            socket: p.clone(),
            token_file: token_file.clone().unwrap_or_else(|| default_token_path(p)),
        })
        .collect())
}

fn open_fabric(a: &FabricArgs, needed: u64) -> Result<Arc<dyn Fabric>, String> {
    if a.machines != 1 || a.memory_nodes != 1 || a.colocated {
        return Err(
            "--machines, --memory-nodes and --colocated shape the simulator (--backend sim)".into(),
        );
    }
    let (mut unix, mut tcp) = (Vec::new(), Vec::new());
    for t in &a.connect {
        match t {
            Listen::Unix(p) => unix.push(p.clone()),
            Listen::Tcp(h) => tcp.push(h.clone()),
        }
    }
    match a.backend {
        Backend::Sim => Err("bench micro --backend sim: the verbs micro-benchmark on the simulator is `dmkit sim speed` \
                    (and `dmkit sim reproduce smart-fig3a|smart-fig4a` for SMART's sweeps)"
            .into()),
        Backend::Verbs => {
            if !unix.is_empty() || tcp.is_empty() {
                return Err("--backend verbs: give the memory nodes as --connect tcp:HOST:PORT \
                            (start them with `dmkit memnode --listen tcp:HOST:PORT`)"
                    .into());
            }
            if a.rtt.is_some() || a.mem_size.is_some() || a.page_size.is_some() {
                return Err("--rtt, --mem-size and --page-size are shm options; verbs nodes are separate processes".into());
            }
            if a.token_file.is_some() && tcp.len() > 1 {
                return Err("--token-file names one file; with several --connect use each node's default token file".into());
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
            let cfg = dmkit_verbs::VerbsConfig {
                device: a.rdma.sel(),
                ..Default::default()
            };
            dmkit_verbs::open_fabric(cfg, &targets).map_err(|e| e.to_string())
        }
        Backend::Shm => {
            if !tcp.is_empty() {
                return Err("tcp:HOST:PORT nodes serve RDMA devices: use --backend verbs (shm nodes listen on unix:PATH)".into());
            }
            let cfg = ShmConfig {
                rtt: a.rtt.filter(|d| !d.is_zero()),
                ..Default::default()
            };
            let f = if unix.is_empty() {
                let size = a.mem_size.unwrap_or(needed);
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
                    return Err("--mem-size and --page-size configure the embedded node; with --connect the node process has its own --size and --page-size".into());
                }
                ShmFabric::open(cfg, &targets(&unix, &a.token_file)?)
            }
            .map_err(|e| e.to_string())?;
            Ok(Arc::new(f))
        }
    }
}

fn bench_micro(a: MicroArgs) -> Res {
    let verb = match a.verb {
        Verb::Read => VerbKind::Read,
        Verb::Write => VerbKind::Write,
        Verb::Cas => VerbKind::Cas,
        Verb::Faa => VerbKind::Faa,
    };
    let rcfg = a.switches.runtime_config(a.seed)?;
    let cfg = MicroConfig {
        verb,
        size: usize::try_from(a.size).map_err(|_| "--size too large")?,
        region_size: a.region_size,
        threads: a.threads,
        batch: a.batch,
        duration: a.duration,
        seed: a.seed,
        signal: match a.signal {
            SignalArg::All => Signal::All,
            SignalArg::Last => Signal::Last,
        },
        qp_policy: a
            .qp_policy
            .unwrap_or(if a.coros.is_some() && !rcfg.thread_aware {
                dmkit_fabric::QpPolicy::Shared
            } else {
                dmkit_fabric::QpPolicy::PerThreadQp
            }),
        runtime: a.coros.map(|coros| micro::RuntimeMode {
            coros,
            depth: a.depth,
            cfg: rcfg.clone(),
        }),
    };
    // The embedded node gets the region plus its reserved first page and slack.
    let fabric = open_fabric(&a.fabric, a.region_size + (8 << 20))?;
    micro::check(&cfg, &*fabric)?;
    let bar = (!a.quiet && std::io::stderr().is_terminal()).then(|| {
        let b = ProgressBar::new(cfg.duration.as_millis() as u64);
        b.set_style(
            ProgressStyle::with_template("{spinner} {bar:40} {elapsed}/{duration} {msg}")
                .expect("valid template"),
        );
        b
    });
    let r = micro::run(&*fabric, &cfg, |el, ops| {
        if let Some(b) = &bar {
            b.set_position(el.as_millis() as u64);
            b.set_message(format!(
                "{:.2} Mops",
                ops as f64 / el.as_secs_f64().max(1e-9) / 1e6
            ));
        }
    })
    .map_err(|e| e.to_string())?;
    if let Some(b) = bar {
        b.finish_and_clear();
    }
    let mode = match (r.coros, r.depth) {
        (Some(c), Some(d)) => format!("rt:{c}x{d}"),
        _ => "raw".into(),
    };
    let signal = match r.signal {
        Signal::All => "all",
        Signal::Last => "last",
    };
    println!(
        "{:<8} {:<8} {:<6} {:>6} {:>8} {:>7} {:>5} {:>6} {:>12} {:>8} {:>9} {:>11}",
        "backend",
        "mode",
        "verb",
        "size",
        "region",
        "threads",
        "batch",
        "signal",
        "ops",
        "seconds",
        "Mops",
        "Mops/thread"
    );
    println!(
        "{:<8} {:<8} {:<6} {:>6} {:>8} {:>7} {:>5} {:>6} {:>12} {:>8.2} {:>9.3} {:>11.3}",
        r.backend,
        mode,
        r.verb,
        r.size,
        format_size(r.region_size),
        r.threads,
        r.batch,
        signal,
        r.ops,
        r.seconds,
        r.mops,
        r.mops_per_thread
    );
    if let Some(path) = a.json {
        let text = serde_json::to_string_pretty(&r).expect("result serialises");
        std::fs::write(&path, text + "\n")
            .map_err(|e| format!("writing {}: {e}", path.display()))?;
    }
    Ok(())
}

fn control(a: &ConnectArgs) -> Result<ShmFabric, String> {
    ShmFabric::open(
        ShmConfig::default(),
        &targets(std::slice::from_ref(&a.connect), &a.token_file)?,
    )
    .map_err(|e| e.to_string())
}

fn node_stats(a: ConnectArgs) -> Res {
    let f = control(&a)?;
    let node = f.nodes()[0];
    let st = f.node_stats(node).map_err(|e| e.to_string())?;
    println!(
        "{}",
        serde_json::to_string_pretty(&st).expect("stats serialise")
    );
    Ok(())
}

fn node_shutdown(a: ConnectArgs) -> Res {
    let f = control(&a)?;
    f.shutdown_node(f.nodes()[0]).map_err(|e| e.to_string())
}

fn bench_ycsb(a: YcsbArgs) -> Res {
    let cfg = YcsbConfig {
        index: a.index,
        workload: a.workload,
        keys: a.keys,
        threads: a.threads,
        machines: a.fabric.machines,
        coros: a.coros,
        theta: a.zipf,
        distribution: a.distribution.map(|d| match d {
            DistArg::Uniform => Distribution::Uniform,
            DistArg::Zipfian => Distribution::Zipfian,
            DistArg::Scrambled => Distribution::Scrambled,
            DistArg::Latest => Distribution::Latest,
        }),
        zipf_items: a.zipf_items,
        key_type: match a.key_type {
            KeyTypeArg::Int => KeyType::Int,
            KeyTypeArg::String => KeyType::String,
        },
        value_size: a.value_size,
        duration: a.duration.unwrap_or(match a.fabric.backend {
            Backend::Shm | Backend::Verbs => Duration::from_secs(5),
            Backend::Sim => Duration::from_millis(20),
        }),
        warmup: a.warmup,
        seed: a.seed,
        runtime: a.switches.runtime_config(a.seed)?,
        cache_entries: a.cache,
        hot: ycsb_bench::HotSwitches {
            keys: a.hot_keys,
            block_log2: a.hot_block_log2,
            theta: a.hot_theta,
            hold_ns: a.hot_hold.as_nanos() as u64,
        },
        art: ycsb_bench::ArtSwitches {
            cache_bytes: a.art_cache as usize,
            in_place: a.in_place_leaf == OnOff::On,
            rear_lock: a.rear_lock == OnOff::On,
            rdwc: a.rdwc == OnOff::On,
            lock_free_internal: a.lock_free_internal == OnOff::On,
        },
        btree: ycsb_bench::BtreeSwitches {
            cache_bytes: a.btree_cache as usize,
            speculative: a.speculative == OnOff::On,
            hocl: a.hocl == OnOff::On,
            on_chip_locks: a.on_chip_locks == OnOff::On,
            combine: a.combine == OnOff::On,
            max_handover: a.max_handover,
            node_bytes: a.btree_node as usize,
            span: a.btree_span,
        },
    };
    let needed = ycsb_bench::memory_estimate(&cfg);
    let platform = match a.fabric.backend {
        Backend::Sim => ycsb_bench::Platform::Sim(Box::new(a.fabric.sim_config(needed, a.seed)?)),
        Backend::Shm | Backend::Verbs => {
            if !cfg.runtime.thread_aware {
                return Err(
                    "bench ycsb: --thread-aware off needs a backend with doorbell registers \
                            (--backend sim); shm has none to share"
                        .into(),
                );
            }
            ycsb_bench::Platform::Fabric(open_fabric(&a.fabric, needed)?)
        }
    };
    let bar = (!a.quiet && std::io::stderr().is_terminal()).then(|| {
        let b = ProgressBar::new(cfg.keys);
        b.set_style(
            ProgressStyle::with_template("{spinner} {msg:5} {bar:40} {pos}/{len} {elapsed}")
                .expect("valid template"),
        );
        b
    });
    let progress = |phase: &'static str, done: u64, total: u64| {
        if let Some(b) = &bar {
            b.set_message(phase);
            b.set_length(total);
            b.set_position(done);
        }
    };
    let r = ycsb_bench::run(platform, &cfg, &progress).map_err(|e| e.to_string())?;
    if let Some(b) = bar {
        b.finish_and_clear();
    }
    print_ycsb(&r);
    if let Some(path) = &a.json {
        let text = serde_json::to_string_pretty(&r).expect("result serialises");
        std::fs::write(path, text + "\n")
            .map_err(|e| format!("writing {}: {e}", path.display()))?;
    }
    if let Some(path) = &a.plot {
        plot::write_png(&plot::throughput_vs_threads(&[r]), path)
            .map_err(|e| format!("writing {}: {e}", path.display()))?;
    }
    Ok(())
}

fn print_ycsb(r: &YcsbResult) {
    println!(
        "{:<6} {:<10} {:<4} {:>7} {:>5} {:>9} {:>8} {:>8} {:>8} {:>6} {:>6} {:>8} {:>8} {:>7} {:>9}",
        "backend", "index", "wl", "threads", "coros", "keys", "Mops", "p50_us", "p99_us", "rt/op", "verbs", "rd_B/op", "wr_B/op", "retry", "load_Mops"
    );
    println!(
        "{:<6} {:<10} {:<4} {:>7} {:>5} {:>9} {:>8.3} {:>8.2} {:>8.2} {:>6.2} {:>6.2} {:>8.1} {:>8.1} {:>7.3} {:>9.3}",
        r.backend,
        r.index,
        r.workload,
        r.threads,
        r.coros,
        r.keys,
        r.mops,
        r.p50_us,
        r.p99_us,
        r.round_trips_per_op,
        r.verbs_per_op,
        r.bytes_read_per_op,
        r.bytes_written_per_op,
        r.retries_per_op,
        r.load_mops
    );
}

fn plot(a: PlotArgs) -> Res {
    let mut rs = Vec::new();
    for f in &a.files {
        let text =
            std::fs::read_to_string(f).map_err(|e| format!("reading {}: {e}", f.display()))?;
        let v: serde_json::Value =
            serde_json::from_str(&text).map_err(|e| format!("{}: {e}", f.display()))?;
        rs.push(plot::Point::from_json(&v).map_err(|e| format!("{}: {e}", f.display()))?);
    }
    plot::write_png(&plot::chart_of_points(&rs), &a.output)
        .map_err(|e| format!("writing {}: {e}", a.output.display()))
}

/// A device profile by name or path, its atomic order and access stall
/// overridden if asked.
fn load_profile(
    name: &str,
    order: Option<dmkit_sim::profile::AtomicOrder>,
    stalls: Option<OnOff>,
) -> Result<dmkit_sim::Profile, String> {
    let mut p = dmkit_sim::Profile::load(name)?;
    // Reports name the profile: say what was changed.
    if let Some(o) = order {
        if o != p.responder.atomic_order {
            p.name = format!("{}, atomic order {}", p.name, o.name());
        }
        p.responder.atomic_order = o;
    }
    // The access stall is modelled under `post` only: another order turns
    // it off unless it was asked for.
    let stalls = match stalls {
        Some(s) => Some(s == OnOff::On),
        None if p.responder.atomic_order != dmkit_sim::profile::AtomicOrder::Post => Some(false),
        None => None,
    };
    if let Some(on) = stalls {
        if on != p.responder.atomic_stalls_access {
            let what = if on { "on" } else { "off" };
            p.name = format!("{}, atomic access stall {what}", p.name);
        }
        p.responder.atomic_stalls_access = on;
    }
    p.validate()?;
    Ok(p)
}

fn parse_atomic_order(s: &str) -> Result<dmkit_sim::profile::AtomicOrder, String> {
    use dmkit_sim::profile::AtomicOrder;
    AtomicOrder::ALL
        .into_iter()
        .find(|o| o.name() == s)
        .ok_or_else(|| {
            let names: Vec<_> = AtomicOrder::ALL.iter().map(|o| o.name()).collect();
            format!("{s:?}: expected one of {}", names.join(", "))
        })
}

fn sim_reproduce(a: ReproduceArgs) -> Res {
    use dmkit_bench::sim_repro;
    let opts = sim_repro::ReproOptions {
        profile: load_profile(&a.profile, a.atomic_order, a.atomic_stalls_access)?,
        seed: a.seed,
        quick: a.quick,
        time_scale: a.time_scale,
        candidates: a
            .tuner_candidates
            .unwrap_or_else(|| sim_repro::PAPER_CANDIDATES.to_vec()),
        jobs: a.jobs.unwrap_or_else(dmkit_bench::default_jobs),
    };
    let bar = (!a.quiet && std::io::stderr().is_terminal()).then(|| {
        let b = ProgressBar::new(1);
        b.set_style(
            ProgressStyle::with_template("{spinner} runs {bar:40} {pos}/{len} {elapsed}")
                .expect("valid template"),
        );
        b
    });
    let progress = |done: usize, total: usize| {
        if let Some(b) = &bar {
            b.set_length(total as u64);
            b.set_position(done as u64);
        }
    };
    let f = sim_repro::reproduce(&a.name, &opts, &progress).map_err(|e| e.to_string())?;
    if let Some(b) = bar {
        b.finish_and_clear();
    }
    println!(
        "{} on {} (seed {}, time scale {}): {:.1} s wall with {} job{}, {:.1} core-seconds, {:.2} M simulated verbs per core-second",
        f.figure,
        f.profile,
        f.seed,
        f.time_scale,
        f.wall_seconds,
        f.jobs,
        if f.jobs == 1 { "" } else { "s" },
        f.core_seconds,
        f.sim_verbs_per_core_second / 1e6
    );
    println!(
        "{:<24} {:>8} {:>10} {:<6} {:>10} {:>7}",
        "series", "x", "value", "unit", "published", "ratio"
    );
    for r in &f.rows {
        let (p, ratio) = match r.published {
            Some(p) => (format!("{p:.1}"), format!("{:.2}", r.value / p)),
            None => ("-".into(), "-".into()),
        };
        println!(
            "{:<24} {:>8} {:>10.2} {:<6} {:>10} {:>7}",
            r.series, r.x, r.value, r.unit, p, ratio
        );
    }
    if let Some(path) = &a.json {
        let text = serde_json::to_string_pretty(&f).map_err(|e| e.to_string())?;
        std::fs::write(path, text + "\n")
            .map_err(|e| format!("writing {}: {e}", path.display()))?;
    }
    if let Some(path) = &a.plot {
        plot::write_png(&sim_repro::chart(&f), path)
            .map_err(|e| format!("writing {}: {e}", path.display()))?;
    }
    Ok(())
}

fn parse_c_max(s: &str) -> Result<u32, String> {
    match s {
        "unlimited" => Ok(dmkit_runtime::throttle::UNLIMITED),
        n => match n.parse::<u32>() {
            Ok(v) if v > 0 => Ok(v),
            _ => Err(format!(
                "{s:?}: expected a positive integer or \"unlimited\""
            )),
        },
    }
}

fn sim_speed(a: SpeedArgs) -> Res {
    use dmkit_bench::sim_micro::{self, SimMicroConfig};
    let mut c = SimMicroConfig::smart(
        dmkit_sim::Profile::load(&a.profile)?,
        a.threads,
        a.depth,
        dmkit_fabric::QpPolicy::PerThreadDoorbell,
    );
    c.machines = a.machines;
    c.memory_nodes = a.memory_nodes;
    c.tasks = a.tasks;
    c.doorbell_per_request = !a.doorbell_batch;
    c.seed = a.seed;
    c.warmup_ns = 0;
    c.measure_ns = a.duration.as_nanos() as u64;
    let r = sim_micro::run(&c).map_err(|e| e.to_string())?;
    println!(
        "{} machines x {} threads x {} tasks (depth {}{}), {} memory nodes, {} virtual: \
         {:.1} Mops simulated; {} verbs in {:.1} s wall = {:.2} M simulated verbs per wall second",
        a.machines,
        a.threads,
        a.tasks,
        a.depth,
        if a.doorbell_batch {
            ", one doorbell per round"
        } else {
            ""
        },
        a.memory_nodes,
        humantime::format_duration(a.duration),
        r.mops,
        r.verbs,
        r.wall_seconds,
        r.sim_verbs_per_wall_second / 1e6
    );
    if let Some(path) = &a.json {
        let text = serde_json::to_string_pretty(&r).map_err(|e| e.to_string())?;
        std::fs::write(path, text + "\n")
            .map_err(|e| format!("writing {}: {e}", path.display()))?;
    }
    Ok(())
}

fn sim_check(a: CheckArgs) -> Res {
    use dmkit_bench::sim_check;
    if !sim_check::SCENARIOS.contains(&a.scenario.as_str()) {
        return Err(format!(
            "no scenario {:?}; scenarios: {}",
            a.scenario,
            sim_check::SCENARIOS.join(", ")
        ));
    }
    let replay = |why: &str, seed: u64| {
        println!("scenario {} failed at seed {seed}:\n{why}", a.scenario);
        println!(
            "replay: dmkit sim check --scenario {} --seed {seed}",
            a.scenario
        );
        Err(format!("seed {seed} failed"))
    };
    if let Some(seed) = a.seed {
        return match sim_check::run(&a.scenario, seed) {
            Ok(p) => {
                println!(
                    "seed {seed}: passed — {}; {} operations checked in {:.3} ms virtual; {} torn, {} delayed requests",
                    p.shape,
                    p.ops,
                    p.virtual_ns as f64 / 1e6,
                    p.torn,
                    p.delayed
                );
                Ok(())
            }
            Err(why) => replay(&why, seed),
        };
    }
    let jobs = a.jobs.unwrap_or_else(dmkit_bench::default_jobs);
    if jobs == 0 || a.seeds == 0 {
        return Err("--jobs and --seeds must be at least 1".into());
    }
    let (first, end) = (a.first, a.first.saturating_add(a.seeds));
    let t0 = std::time::Instant::now();
    let out = sim_check::run_seeds(&a.scenario, first, end, jobs);
    if let Some((seed, why)) = out.failure {
        return replay(&why, seed);
    }
    println!(
        "scenario {}: seeds {first}..{} passed ({} operations checked, {} torn requests injected) in {:.1} s",
        a.scenario,
        end - 1,
        out.ops,
        out.torn,
        t0.elapsed().as_secs_f64()
    );
    Ok(())
}
