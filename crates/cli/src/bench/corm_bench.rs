//! `dmkit bench corm`: object reads and writes on a CoRM store, reads
//! one-sided or through RPC (`dmkit_bench::corm_bench`): on an embedded
//! node, on a `dmkit memnode --corm` process (`--connect`, shm or verbs),
//! or on the simulator.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use clap::{Args, ValueEnum};
use dmkit_bench::corm_bench::{self, CormBenchConfig, ReadPath};
use dmkit_bench::corm_timeline;
use dmkit_bench::harness;
use dmkit_fabric::shm::{ShmConfig, ShmFabric};
use dmkit_memnode::corm::Correction;

use crate::args::{load_profile, parse_listen, targets, Listen, RdmaArgs};
use crate::units::parse_size;
use crate::Res;

#[derive(Clone, Copy, ValueEnum)]
enum Read {
    /// One-sided READs (DirectRead; ScanRead when the object moved).
    Direct,
    /// RPC reads served by the node's workers.
    Rpc,
}

#[derive(Args)]
pub(crate) struct CormBenchArgs {
    /// How reads go.
    #[arg(long, value_enum, default_value = "direct")]
    read: Read,
    /// Read:write percentages: 50:50, 95:5 or 100:0 (any R:W summing to 100).
    #[arg(long, default_value = "50:50")]
    workload: String,
    /// Backend: `shm` (an embedded node, or a node process with
    /// --connect unix:PATH), `verbs` (a node process with --connect
    /// tcp:HOST:PORT; build with --features dmkit/verbs) or `sim` (the
    /// simulator, virtual time).
    #[arg(long, default_value = "shm")]
    backend: String,
    /// The memory node process serving the store (`dmkit memnode --corm`,
    /// whose flags set its workers, block size and compaction policy):
    /// unix:PATH (shm) or tcp:HOST:PORT (--backend verbs). The run loads
    /// --objects there and frees them when it ends.
    #[arg(long, value_parser = parse_listen)]
    connect: Option<Listen>,
    /// Token file for --connect (default: the node's, next to its address).
    #[arg(long)]
    token_file: Option<PathBuf>,
    #[command(flatten)]
    rdma: RdmaArgs,
    /// Simulator: device profile (cx6-200g, cx5-100g, cx3-56g, cx3-40g, or a TOML
    /// file); CoRM's testbed was ConnectX-3.
    #[arg(long, default_value = "cx3-56g")]
    profile: String,
    /// Objects in the store (default 100000; --timeline: 2000000, a
    /// quarter of the paper's Fig. 16 store, what this machine loads in
    /// seconds).
    #[arg(long)]
    objects: Option<usize>,
    /// Payload bytes per object.
    #[arg(long, default_value = "32", value_parser = parse_size)]
    size: u64,
    /// Zipfian skew of the key choice (YCSB's scrambled zipfian; 0 = uniform).
    #[arg(long, default_value_t = 0.99)]
    zipf: f64,
    /// Client threads.
    #[arg(long, default_value_t = 1)]
    threads: usize,
    /// Tasks per client thread.
    #[arg(long, default_value_t = 4)]
    coros: usize,
    /// The node's RPC workers (= the store's workers); default: the
    /// embedded node's default on shm, the profile's `rpc.cores` on sim.
    #[arg(long)]
    workers: Option<usize>,
    /// How long to measure.
    #[arg(long, default_value = "3s", value_parser = humantime::parse_duration)]
    duration: Duration,
    /// Time before measuring.
    #[arg(long, default_value = "500ms", value_parser = humantime::parse_duration)]
    warmup: Duration,
    /// Seed.
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// shm: emulated network round trip (e.g. 2us), added to every
    /// one-sided verb's completion and to every RPC (half on the way to
    /// the node's ring, half back), so direct and RPC reads pay the same
    /// network; also with --connect unix:PATH, --latency and --timeline.
    #[arg(long, value_parser = humantime::parse_duration)]
    rtt: Option<Duration>,
    /// Measure this many times (each on a freshly loaded store); prints
    /// each run and the mean and spread of their throughput.
    #[arg(long, default_value_t = 1)]
    repeat: usize,
    /// shm with an embedded node: pin each client thread to a CPU of its
    /// own and the node's RPC workers (a compaction's leader among them)
    /// to the remaining CPUs; not applied (and said so in the JSON's
    /// `pinning`) when the process has too few CPUs.
    #[arg(long)]
    pin: bool,
    /// Write the result as JSON to this file.
    #[arg(long)]
    json: Option<PathBuf>,
    /// No progress output (accepted for symmetry; the run prints one table).
    #[arg(long)]
    quiet: bool,
    /// Timeline mode (CoRM Fig. 16, shm): load --objects, free three of
    /// four, then one client reads the rest in order (--read direct: the
    /// scan-read client; rpc: RPC reads) while a compaction runs at
    /// --compact-at; throughput per --bucket for --duration. Ignores
    /// --workload, --zipf, --threads, --coros and --warmup.
    #[arg(long, help_heading = "Timeline (--timeline)")]
    timeline: bool,
    /// Timeline: when the compaction is asked for.
    #[arg(long, default_value = "300ms", value_parser = humantime::parse_duration, help_heading = "Timeline (--timeline)")]
    compact_at: Duration,
    /// Timeline: source blocks the compaction merges away at most (0: all
    /// it can). Default: the paper's 5,794 blocks of 8 M objects scaled to
    /// --objects, so one compaction takes the same share of the store.
    #[arg(long, help_heading = "Timeline (--timeline)")]
    compact_blocks: Option<usize>,
    /// Timeline: length of a bucket of the series.
    #[arg(long, default_value = "10ms", value_parser = humantime::parse_duration, help_heading = "Timeline (--timeline)")]
    bucket: Duration,
    /// Timeline: pointer correction on the node's RPC path (§3.2.1).
    #[arg(
        long,
        value_enum,
        default_value = "scan",
        help_heading = "Timeline (--timeline)"
    )]
    correction: CorrectionArg,
    /// Latency mode (CoRM §4.1, Fig. 9/10; shm or sim): one client, one
    /// call at a time — Alloc, Free, RPC Read and Write, DirectRead and a
    /// raw READ with direct pointers; after a compaction, RPC Read and
    /// Write, DirectRead corrected by ScanRead or by RPC Read, and
    /// ReleasePtr with indirect pointers — median µs per --sizes. Ignores
    /// --read, --workload, --zipf, --threads, --coros, --duration and
    /// --warmup.
    #[arg(long, help_heading = "Latency (--latency)")]
    latency: bool,
    /// Latency: payload sizes (comma-separated).
    #[arg(long, value_delimiter = ',', default_value = "16,64,256,1024", value_parser = parse_size, help_heading = "Latency (--latency)")]
    sizes: Vec<u64>,
    /// Latency: objects timed per call and size (4× are allocated).
    #[arg(long, default_value_t = 1000, help_heading = "Latency (--latency)")]
    latency_objects: usize,
}

#[derive(Clone, Copy, ValueEnum)]
enum CorrectionArg {
    /// Scan the block for the object's id.
    Scan,
    /// Message the block's owning worker.
    Message,
}

/// `--latency`: the run, its table (median µs per call and size), its JSON.
fn latency(a: &CormBenchArgs) -> Res {
    use dmkit_bench::corm_latency::{self, LatencyConfig};
    if a.connect.is_some() {
        return Err(crate::bad_input(
            "--latency runs on an embedded node or the simulator (it compacts the store it loads); drop --connect",
        ));
    }
    if a.pin {
        return Err(crate::bad_input(
            "--pin places the throughput modes' threads (the main run and --timeline); --latency runs one call at a time",
        ));
    }
    let sim = match a.backend.as_str() {
        "shm" => None,
        "sim" => Some(load_profile(&a.profile, None, None)?),
        other => {
            return Err(crate::bad_input(format!(
                "--latency --backend {other}: runs on shm and sim"
            )))
        }
    };
    let sizes = a
        .sizes
        .iter()
        .map(|&s| u32::try_from(s).map_err(|_| crate::bad_input("--sizes: too large")))
        .collect::<Result<Vec<u32>, String>>()?;
    let cfg = LatencyConfig {
        sizes,
        objects: a.latency_objects,
        workers: a.workers.unwrap_or(match &sim {
            Some(p) => p.rpc.cores as usize,
            None => dmkit_memnode::DEFAULT_RPC_WORKERS,
        }),
        seed: a.seed,
        rtt: rtt(a)?,
    };
    let r = match sim {
        None => corm_latency::run(&cfg),
        Some(profile) => corm_latency::run_sim(
            dmkit_sim::SimConfig {
                profile,
                seed: a.seed,
                ..Default::default()
            },
            &cfg,
        ),
    }
    .map_err(|e| e.to_string())?;
    print!("{:<22} {:<9}", "call (median µs)", "pointer");
    for s in &cfg.sizes {
        print!(" {:>9}", format!("{s} B"));
    }
    println!();
    let mut seen = Vec::new();
    for row in &r.rows {
        let key = (row.call.as_str(), row.pointer.as_str());
        if seen.contains(&key) {
            continue;
        }
        seen.push(key);
        print!("{:<22} {:<9}", row.call, row.pointer);
        for &s in &cfg.sizes {
            match r.row(&row.call, &row.pointer, s) {
                Some(x) if x.n > 0 => print!(" {:>9.2}", x.p50_us),
                _ => print!(" {:>9}", "-"),
            }
        }
        println!();
    }
    let moved: Vec<String> = r
        .compactions
        .iter()
        .map(|(s, c)| format!("{s} B: {}", c.objects_moved))
        .collect();
    println!(
        "{} backend{}; objects moved by the compaction (timed as indirect): {}",
        r.backend,
        r.profile
            .as_ref()
            .map(|p| format!(" ({p})"))
            .unwrap_or_default(),
        moved.join(", ")
    );
    if let Some(path) = &a.json {
        let provenance = harness::Provenance::new(a.seed, Duration::ZERO, Duration::ZERO, false);
        harness::write_json(path, &provenance, &r)?;
    }
    Ok(())
}

/// `--timeline`: the run, its table, its JSON.
fn timeline(a: &CormBenchArgs) -> Res {
    if a.backend != "shm" {
        return Err(crate::bad_input(
            "--timeline runs on shm; the simulator's is `dmkit sim reproduce corm-fig16`",
        ));
    }
    let objects = a.objects.unwrap_or(TIMELINE_OBJECTS);
    let cfg = corm_timeline::TimelineConfig {
        read: match a.read {
            Read::Direct => ReadPath::Direct,
            Read::Rpc => ReadPath::Rpc,
        },
        correction: match a.correction {
            CorrectionArg::Scan => Correction::Scan,
            CorrectionArg::Message => Correction::Message,
        },
        objects,
        size: u32::try_from(a.size).map_err(|_| "--size too large")?,
        workers: a.workers.unwrap_or(dmkit_memnode::DEFAULT_RPC_WORKERS),
        compact_blocks: match a
            .compact_blocks
            .unwrap_or_else(|| corm_timeline::paper_blocks(objects))
        {
            0 => None,
            n => Some(n),
        },
        pin: a.pin,
        bucket: a.bucket,
        compact_at: a.compact_at,
        duration: a.duration,
        seed: a.seed,
        rtt: rtt(a)?,
    };
    let r = corm_timeline::run(&cfg).map_err(|e| e.to_string())?;
    println!(
        "{:<6} {:>10} {:>7} {:>6} {:>13} {:>8} {:>11} {:>11} {:>11} {:>10} {:>9} {:>10}",
        "read",
        "correction",
        "kept",
        "blocks",
        "compaction ms",
        "active×",
        "before Mops",
        "during Mops",
        "after Mops",
        "during/bef",
        "gap ms",
        "failed dr"
    );
    println!(
        "{:<6} {:>10} {:>7} {:>6} {:>13.2} {:>8.2} {:>11.4} {:>11.4} {:>11.4} {:>10.3} {:>9.2} {:>10}",
        r.read,
        r.correction,
        r.kept,
        r.compaction.blocks_freed,
        r.compaction_ended_ms - r.compaction_started_ms,
        r.active_bytes_before as f64 / r.active_bytes_after.max(1) as f64,
        r.before_mops,
        r.during_mops,
        r.after_mops,
        r.during_over_before,
        r.longest_gap_ms,
        r.failed_direct_reads
    );
    // Where a phase's throughput went: the client's CPU share (the
    // machine's other threads, the compaction's leader among them) and
    // its reads per CPU second (what each read cost).
    println!(
        "{:<7} {:>9} {:>10} {:>14} {:>11} {:>9}",
        "phase", "ms", "client CPU", "Mops/CPU core", "scan reads", "retries"
    );
    for (name, p) in [
        ("before", &r.phases.before),
        ("during", &r.phases.during),
        ("after", &r.phases.after),
    ] {
        println!(
            "{:<7} {:>9.1} {:>10.3} {:>14.4} {:>11} {:>9}",
            name, p.ms, p.cpu_share, p.mops_per_cpu, p.scan_reads, p.retries
        );
    }
    println!(
        "compaction: {} blocks merged away (bound {}), {} objects moved = {:.4} of the kept (the paper's run: {:.4}); loaded in {:.1} s",
        r.compaction.blocks_freed,
        r.compact_blocks
            .map(|n| n.to_string())
            .unwrap_or_else(|| "none".into()),
        r.compaction.objects_moved,
        r.moved_fraction,
        corm_timeline::PAPER_CORRECTED as f64 / (corm_timeline::PAPER_OBJECTS / 4) as f64,
        r.load_seconds
    );
    print_placement(&r.pinning, r.load_average);
    if let Some(path) = &a.json {
        let provenance = harness::Provenance::new(a.seed, a.duration, Duration::ZERO, false);
        harness::write_json(path, &provenance, &r)?;
    }
    Ok(())
}

/// `--timeline`'s default store: a quarter of the paper's 8 M objects.
const TIMELINE_OBJECTS: usize = 2_000_000;

/// `--rtt` (zero: none), refused off shm.
fn rtt(a: &CormBenchArgs) -> Result<Option<Duration>, String> {
    match (a.rtt.filter(|d| !d.is_zero()), a.backend.as_str()) {
        (None, _) | (Some(_), "shm") => Ok(a.rtt.filter(|d| !d.is_zero())),
        (Some(_), b) => Err(crate::bad_input(format!(
            "--rtt is the shm latency model; --backend {b} times its own network"
        ))),
    }
}

fn read_percent(w: &str) -> Result<u32, String> {
    let bad = || format!("--workload {w}: expected R:W percentages summing to 100 (e.g. 95:5)");
    let (r, wr) = w.split_once(':').ok_or_else(bad)?;
    let (r, wr): (u32, u32) = (
        r.trim().parse().map_err(|_| bad())?,
        wr.trim().parse().map_err(|_| bad())?,
    );
    if r + wr != 100 {
        return Err(bad());
    }
    Ok(r)
}

pub(crate) fn bench_corm(a: CormBenchArgs) -> Res {
    super::check_outputs(a.json.as_deref(), None)?;
    if a.latency && a.timeline {
        return Err(crate::bad_input(
            "--latency and --timeline are separate modes",
        ));
    }
    if a.pin && !a.latency && (a.connect.is_some() || a.backend != "shm") {
        return Err(crate::bad_input(
            "--pin places the threads of a run on an embedded shm node; a node process is \
             placed by its launcher (e.g. taskset), the simulator's cores are modelled",
        ));
    }
    if a.latency {
        return latency(&a);
    }
    if a.timeline {
        if a.connect.is_some() {
            return Err(crate::bad_input(
                "--timeline runs on an embedded node (it compacts a store it fragmented itself); drop --connect",
            ));
        }
        return timeline(&a);
    }
    let sim = match a.backend.as_str() {
        "shm" | "verbs" => None,
        "sim" => Some(load_profile(&a.profile, None, None)?),
        other => {
            return Err(crate::bad_input(format!(
                "--backend {other}: bench corm runs on shm, verbs and sim"
            )))
        }
    };
    let remote = connect(&a)?;
    let _ = a.quiet;
    let cfg = CormBenchConfig {
        read: match a.read {
            Read::Direct => ReadPath::Direct,
            Read::Rpc => ReadPath::Rpc,
        },
        read_percent: read_percent(&a.workload)?,
        objects: a.objects.unwrap_or(100_000),
        size: u32::try_from(a.size).map_err(|_| "--size too large")?,
        zipf: a.zipf,
        threads: a.threads,
        coros: a.coros,
        workers: a.workers.unwrap_or(match &sim {
            Some(p) => p.rpc.cores as usize,
            None => dmkit_memnode::DEFAULT_RPC_WORKERS,
        }),
        duration: a.duration,
        warmup: a.warmup,
        seed: a.seed,
        rtt: rtt(&a)?,
        pin: a.pin,
    };
    if cfg.duration.is_zero() {
        return Err(crate::bad_input("--duration must be longer than 0s"));
    }
    super::Measure {
        threads: cfg.threads,
        sim: sim.is_some(),
        seed: a.seed,
        duration: cfg.duration,
        warmup: cfg.warmup,
        repeat: a.repeat,
        json: a.json.as_deref(),
    }
    .runs(|| {
        match (&sim, &remote) {
            (None, Some(f)) => corm_bench::run_connected(&**f, &a.backend, &cfg),
            (None, None) => corm_bench::run(&cfg),
            (Some(profile), _) => corm_bench::run_sim(
                dmkit_sim::SimConfig {
                    profile: profile.clone(),
                    seed: a.seed,
                    ..Default::default()
                },
                &cfg,
            ),
        }
        .map_err(|e| e.to_string())
    })
}

/// The node process of `--connect`, opened on the backend asked for (none
/// without --connect: the run embeds its node).
fn connect(a: &CormBenchArgs) -> Result<Option<Arc<dyn dmkit_fabric::Fabric>>, String> {
    let Some(to) = &a.connect else {
        if a.backend == "verbs" {
            return Err(crate::bad_input(
                "--backend verbs: give the memory node as --connect tcp:HOST:PORT \
                 (start it with `dmkit memnode --corm --listen tcp:HOST:PORT`)",
            ));
        }
        return Ok(None);
    };
    if a.workers.is_some() {
        return Err(crate::bad_input(
            "--workers configures the embedded node; with --connect the node process's --workers serve the store",
        ));
    }
    // Room for a payload, and for the statistics' answer.
    let rpc_max_message = (u32::try_from(a.size)
        .unwrap_or(u32::MAX)
        .saturating_add(256))
    .max(8192);
    match (a.backend.as_str(), to) {
        ("shm", Listen::Unix(path)) => {
            let cfg = ShmConfig {
                rpc_max_message,
                rtt: rtt(a)?,
                ..Default::default()
            };
            let f = ShmFabric::open(cfg, &targets(std::slice::from_ref(path), &a.token_file)?)
                .map_err(|e| e.to_string())?;
            Ok(Some(Arc::new(f)))
        }
        ("verbs", Listen::Tcp(addr)) => {
            let target = dmkit_verbs::VerbsTarget {
                addr: addr.clone(),
                token_file: a
                    .token_file
                    .clone()
                    .unwrap_or_else(|| dmkit_verbs::default_token_path(addr)),
            };
            let cfg = dmkit_verbs::VerbsConfig {
                device: a.rdma.sel(),
                rpc_max_message,
                ..Default::default()
            };
            dmkit_verbs::open_fabric(cfg, &[target])
                .map(Some)
                .map_err(|e| e.to_string())
        }
        ("sim", _) => Err(crate::bad_input(
            "--connect is for a node process; the simulator has its own memory node",
        )),
        (_, Listen::Tcp(_)) => Err(crate::bad_input(
            "tcp:HOST:PORT nodes serve RDMA devices: use --backend verbs (shm nodes listen on unix:PATH)",
        )),
        (_, Listen::Unix(_)) => Err(crate::bad_input(
            "--backend verbs reaches nodes at tcp:HOST:PORT (unix:PATH is shm)",
        )),
    }
}

impl super::Run for corm_bench::CormBenchResult {
    fn mops(&self) -> f64 {
        self.mops
    }

    fn interrupted(&self) -> bool {
        self.interrupted
    }

    fn print_row(&self, header: bool) {
        print_row(self, header)
    }
}

/// Where the threads ran and how busy the machine was.
fn print_placement(p: &dmkit_bench::pin::Pinning, load: Option<[f64; 3]>) {
    let load = load
        .map(|l| format!("{:.2} {:.2} {:.2}", l[0], l[1], l[2]))
        .unwrap_or_else(|| "-".into());
    match (p.applied, &p.note) {
        (true, _) => println!(
            "pinned: clients on CPU {:?}, the node's {} workers on CPU {:?}; load average {load}",
            p.client_cpus, p.node_threads, p.node_cpus
        ),
        (false, Some(note)) => println!("{note}; load average {load}"),
        (false, None) => println!("not pinned (--pin); load average {load}"),
    }
}

fn print_row(r: &corm_bench::CormBenchResult, header: bool) {
    if header {
        println!(
            "{:<6} {:>8} {:>8} {:>5} {:>7} {:>5} {:>7} {:>9} {:>8} {:>8} {:>12} {:>9} {:>10} {:>7} {:>11} {:>10} {:>7} {:>9}",
            "read",
            "workload",
            "objects",
            "size",
            "threads",
            "coros",
            "workers",
            "Mops",
            "p50 µs",
            "p99 µs",
            "failed dr/s",
            "live obj",
            "active KiB",
            "/ideal",
            "compactions",
            "RPC Mreq/s",
            "cli CPU",
            "cli µs/op"
        );
    }
    println!(
        "{:<6} {:>8} {:>8} {:>5} {:>7} {:>5} {:>7} {:>9.4} {:>8.2} {:>8.2} {:>12.1} {:>9} {:>10} {:>7.3} {:>11} {:>10.4} {:>7} {:>9}",
        r.read,
        r.workload,
        r.objects,
        r.size,
        r.threads,
        r.coros,
        r.workers,
        r.mops,
        r.p50_us,
        r.p99_us,
        r.failed_direct_reads_per_s,
        r.store.live_objects,
        r.store.active_bytes / 1024,
        r.active_over_ideal(),
        r.store.compactions,
        r.rpc_requests_per_s / 1e6,
        r.client_cpu_share
            .map(|x| format!("{x:.3}"))
            .unwrap_or_else(|| "-".into()),
        r.client_cpu_us_per_op
            .map(|x| format!("{x:.3}"))
            .unwrap_or_else(|| "-".into())
    );
    if header {
        if let Some(p) = &r.pinning {
            print_placement(p, r.load_average);
        }
    }
}
