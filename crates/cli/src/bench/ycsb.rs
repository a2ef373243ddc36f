//! `dmkit bench ycsb`: YCSB on an index (remote hash table, radix tree,
//! B+tree, or an in-process peer): load, then run a workload.

use std::io::IsTerminal;
use std::path::PathBuf;
use std::time::Duration;

use clap::{Args, ValueEnum};
use dmkit_bench::harness;
use dmkit_bench::plot;
use dmkit_bench::ycsb::{Distribution, KeyType, Workload};
use dmkit_bench::ycsb_bench::{self, YcsbConfig, YcsbResult};
use indicatif::{ProgressBar, ProgressStyle};

use super::{open_fabric, Backend, FabricArgs, SwitchArgs};
use crate::units::parse_size;
use crate::Res;

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
#[command(after_help = "EXAMPLES:
  dmkit bench ycsb --index art --workload c
  dmkit bench ycsb --index race --workload a --threads 1,2,4,8 --json sweep.json
  dmkit plot sweep.json -o sweep.png
  dmkit bench ycsb --index btree --workload e --warmup 1s --duration 10s --repeat 3
  dmkit bench ycsb --backend sim --machines 2 --threads 16 --index race --workload c")]
pub(crate) struct YcsbArgs {
    #[command(flatten)]
    fabric: FabricArgs,
    /// Index: race (remote hash table), art (remote radix tree), btree
    /// (remote B+tree), clover (Clover's key-value store), or the in-process
    /// peers local-hash and local-art.
    #[arg(long, default_value = "race")]
    index: ycsb_bench::IndexKind,
    /// Workload: load, a, b, c, d, e or f.
    #[arg(long, default_value = "c")]
    workload: Workload,
    /// Keys loaded before the run.
    #[arg(long, default_value_t = 1_000_000)]
    keys: u64,
    /// Threads (one worker each); a list (1,2,4,8) measures each on one
    /// loaded index.
    #[arg(long, value_delimiter = ',', default_value = "2")]
    threads: Vec<usize>,
    /// Tasks per thread (SMART's coroutines; remote indexes); a list
    /// sweeps them.
    #[arg(long, value_delimiter = ',', default_value = "8")]
    coros: Vec<usize>,
    /// Zipfian skew θ; a list sweeps it.
    #[arg(long, value_delimiter = ',', default_value = "0.99")]
    zipf: Vec<f64>,
    /// Key distribution (default: the workload's: latest for d, scrambled zipfian otherwise).
    #[arg(long, value_enum)]
    distribution: Option<DistArg>,
    /// Scrambled zipfian: draw ranks over this many items [default: YCSB's
    /// 10^10]; e.g. 100000000 gives a small table a 100 M-key table's hot keys.
    #[arg(long)]
    zipf_items: Option<u64>,
    #[arg(long, value_enum, default_value = "int")]
    key_type: KeyTypeArg,
    /// Bytes per integer key, 8 to 254: wider keys are the 8-byte integer
    /// behind zero bytes (SMART's artifact's key-size sweep); int keys only.
    #[arg(long, default_value_t = 8)]
    key_size: u16,
    /// Bytes per value (e.g. 8, 1KiB).
    #[arg(long, default_value = "8", value_parser = parse_size)]
    value_size: u64,
    /// How long to run, not counting the load [default: 5s on shm, 20ms of
    /// virtual time on the simulator].
    #[arg(long, value_parser = humantime::parse_duration)]
    duration: Option<Duration>,
    /// Unmeasured run before --duration (lets contention and the runtime's
    /// adaptation settle).
    #[arg(long, default_value = "0s", value_parser = humantime::parse_duration)]
    warmup: Duration,
    /// Think time: every client pauses this long between its operations
    /// (throttles the offered load, as SMART's Figure 9; latency excludes
    /// it).
    #[arg(long = "think-time", default_value = "0s", value_parser = humantime::parse_duration)]
    think_time: Duration,
    /// Hash table: put the run's N likeliest keys in a hot area served in
    /// blocks with IO consolidation (memory-semantics §IV-B; 0: off).
    #[arg(long, default_value_t = 0)]
    hot_keys: usize,
    /// The hash table's switches (its own flags: dmkit_race::RaceConfig).
    #[command(flatten, next_help_heading = "Hash table (--index race)")]
    race: dmkit_race::RaceConfig,
    /// The radix tree's switches (dmkit_art::ArtConfig).
    #[command(flatten, next_help_heading = "Radix tree (--index art)")]
    art: dmkit_art::ArtConfig,
    /// The B+tree's switches (dmkit_btree::BtreeConfig).
    #[command(flatten, next_help_heading = "B+tree (--index btree)")]
    btree: dmkit_btree::BtreeConfig,
    /// Clover's switches and SwordBox's steering of it.
    #[command(flatten, next_help_heading = "Clover (--index clover)")]
    clover: super::clover::CloverArgs,
    #[command(flatten, next_help_heading = "SMART runtime switches")]
    switches: SwitchArgs,
    /// Seed of the key choosers and the runtime (same seed, same key
    /// streams).
    #[arg(help_heading = "Run and output", long, default_value_t = 1)]
    seed: u64,
    /// Measure each point this many times (on the loaded index when the
    /// workload inserts nothing); prints the mean and spread.
    #[arg(help_heading = "Run and output", long, default_value_t = 1)]
    repeat: usize,
    /// Write the result as JSON to this file (a sweep or --repeat: every
    /// point's result under "runs").
    #[arg(help_heading = "Run and output", long)]
    json: Option<PathBuf>,
    /// Also plot this result (throughput vs threads) to this PNG.
    #[arg(help_heading = "Run and output", long)]
    plot: Option<PathBuf>,
    /// No progress bar.
    #[arg(help_heading = "Run and output", long)]
    quiet: bool,
    /// A status line on stderr every second of the run (YCSB's -s),
    /// instead of the progress bar.
    #[arg(help_heading = "Run and output", long)]
    status: bool,
}

pub(crate) fn bench_ycsb(a: YcsbArgs) -> Res {
    if a.repeat == 0 {
        return Err(crate::bad_input("--repeat must be at least 1"));
    }
    let mut points = Vec::new();
    for &threads in &a.threads {
        for &coros in &a.coros {
            for &theta in &a.zipf {
                for _ in 0..a.repeat {
                    points.push(ycsb_bench::Point {
                        threads,
                        coros,
                        theta,
                    });
                }
            }
        }
    }
    let cfg = YcsbConfig {
        index: a.index,
        workload: a.workload,
        keys: a.keys,
        threads: points[0].threads,
        machines: a.fabric.machines,
        coros: points[0].coros,
        theta: points[0].theta,
        distribution: a.distribution.map(|d| match d {
            DistArg::Uniform => Distribution::Uniform,
            DistArg::Zipfian => Distribution::Zipfian,
            DistArg::Scrambled => Distribution::Scrambled,
            DistArg::Latest => Distribution::Latest,
        }),
        zipf_items: a.zipf_items,
        key_type: match (a.key_type, a.key_size) {
            (KeyTypeArg::Int, 8) => KeyType::Int,
            (KeyTypeArg::Int, n) => KeyType::WideInt(n),
            (KeyTypeArg::String, 8) => KeyType::String,
            (KeyTypeArg::String, _) => {
                return Err(crate::bad_input(
                    "--key-size sets integer keys' width; string keys are 32 bytes",
                ))
            }
        },
        value_size: usize::try_from(a.value_size)
            .map_err(|_| crate::bad_input("--value-size too large"))?,
        duration: a.duration.unwrap_or(match a.fabric.backend {
            Backend::Shm | Backend::Verbs => Duration::from_secs(5),
            Backend::Sim => Duration::from_millis(20),
        }),
        warmup: a.warmup,
        think: a.think_time,
        seed: a.seed,
        runtime: a.switches.runtime_config(a.seed)?,
        hot_keys: a.hot_keys,
        race: a.race,
        art: a.art,
        btree: a.btree,
        clover: a.clover.bench()?,
    };
    // Everything that can be checked before anything is allocated.
    for p in &points {
        ycsb_bench::validate(&cfg.at(p)).map_err(|e| crate::bad_input(e.to_string()))?;
    }
    let sim = matches!(a.fabric.backend, Backend::Sim);
    if sim && a.repeat > 1 {
        return Err(crate::bad_input("--repeat: the simulator is deterministic, a repeat gives the same figures (vary --seed instead)"));
    }
    if !sim && a.fabric.machines != 1 {
        return Err(crate::bad_input(
            "--machines: several compute machines exist only on the simulator (--backend sim)",
        ));
    }
    super::check_outputs(a.json.as_deref(), a.plot.as_deref())?;
    let lcfg = ycsb_bench::sweep_config(&cfg, &points);
    let needed = ycsb_bench::memory_estimate(&lcfg);
    let threads = if sim {
        lcfg.threads * a.fabric.machines
    } else {
        lcfg.threads
    };
    if let (false, Some(w)) = (sim, harness::oversubscribed(threads)) {
        eprintln!("dmkit: warning: {w}");
    }
    let bar = (!a.quiet && !a.status && std::io::stderr().is_terminal()).then(|| {
        let b = ProgressBar::new(cfg.keys);
        b.set_style(
            ProgressStyle::with_template("{spinner} {msg} {bar:40} {pos}/{len} {elapsed}")
                .expect("valid template"),
        );
        b
    });
    let status_at = std::sync::atomic::AtomicU64::new(0);
    let progress = |u: ycsb_bench::Update| {
        if let Some(b) = &bar {
            let msg = match (u.phase, u.warming_up) {
                ("run", true) => "warm-up (ms)".to_string(),
                ("run", false) if u.ops > 0 => format!("run (ms), {} ops", u.ops),
                ("run", false) => "run (ms)".to_string(),
                (p, _) => format!("{p} (keys)"),
            };
            b.set_message(msg);
            b.set_length(u.total);
            b.set_position(u.done);
        } else if a.status && u.phase == "run" && !u.warming_up {
            // YCSB's status lines: once a second, to stderr.
            let sec = u.done / 1000;
            if status_at.swap(sec, std::sync::atomic::Ordering::Relaxed) != sec && sec > 0 {
                eprintln!("{} ms: {} operations counted in the window", u.done, u.ops);
            }
        }
    };
    crate::args::stop_on_ctrl_c();
    let provenance =
        harness::Provenance::new(a.seed, cfg.duration, cfg.warmup, false).repeat(a.repeat);
    let results = if sim {
        let mut rs = Vec::new();
        for p in &points {
            if harness::interrupted() {
                break;
            }
            let pc = cfg.at(p);
            let platform = ycsb_bench::Platform::Sim(Box::new(
                a.fabric
                    .sim_config(ycsb_bench::memory_estimate(&pc), a.seed)?,
            ));
            rs.push(ycsb_bench::run(platform, &pc, &progress).map_err(|e| e.to_string())?);
        }
        rs
    } else {
        if !cfg.runtime.thread_aware {
            return Err(crate::bad_input(
                "bench ycsb: --thread-aware off needs a backend with doorbell registers \
                        (--backend sim); shm has none to share",
            ));
        }
        if points.len() > 1 && ycsb_bench::inserts(cfg.workload) {
            // Each point on a freshly loaded index.
            let mut rs = Vec::new();
            for p in &points {
                if harness::interrupted() {
                    break;
                }
                let pc = cfg.at(p);
                let platform = ycsb_bench::Platform::Fabric(open_fabric(
                    &a.fabric,
                    ycsb_bench::memory_estimate(&pc),
                )?);
                rs.push(ycsb_bench::run(platform, &pc, &progress).map_err(|e| e.to_string())?);
            }
            rs
        } else {
            let platform = ycsb_bench::Platform::Fabric(open_fabric(&a.fabric, needed)?);
            ycsb_bench::run_points(platform, &cfg, &points, &progress).map_err(|e| e.to_string())?
        }
    };
    if let Some(b) = bar {
        b.finish_and_clear();
    }
    print_ycsb(&results);
    for r in results.iter().filter(|r| r.index == "clover") {
        println!(
            "clover: steer {}, {:.3} CAS failures/op, {:.1} B/op, p99 read {:.2} us, p99 write {:.2} us, first-try share {:.3}",
            r.steer.as_deref().unwrap_or("none (no switch)"),
            r.cas_failures_per_op,
            r.bytes_per_op,
            r.p99_read_us,
            r.p99_write_us,
            r.retry_histogram.first().copied().unwrap_or(0.0)
        );
        if let Some(p) = &r.clover_phases {
            println!(
                "clover: per search {:.2} READs, {:.1} us ({:.3} first try); per write {:.2} CAS ({:.2} failed), {:.2} READs, {:.1} us: CAS round trips {:.1}, walks {:.1}, lookups {:.1}, allocation {:.1} ({:.3} first try; measured window)",
                p.search_reads,
                p.search_us,
                p.search_first_try,
                p.write_cas,
                p.write_cas_failed,
                p.write_reads,
                p.write_us,
                p.write_cas_us,
                p.write_walk_us,
                p.write_lookup_us,
                p.write_alloc_us,
                p.write_first_try,
            );
        }
    }
    if results.iter().any(|r| r.interrupted) || harness::interrupted() {
        eprintln!("dmkit: interrupted: the figures are of what was measured before Ctrl-C");
    }
    if let Some(path) = &a.json {
        if results.len() == 1 {
            harness::write_json(path, &provenance, &results[0])?;
        } else {
            // Each point's repeats: their mean and spread.
            let mut spread = Vec::new();
            for p in points.iter().step_by(a.repeat) {
                let same: Vec<f64> = results
                    .iter()
                    .filter(|r| (r.threads, r.coros, r.zipf) == (p.threads, p.coros, p.theta))
                    .map(|r| r.mops)
                    .collect();
                if !same.is_empty() {
                    spread.push(serde_json::json!({
                        "threads": p.threads,
                        "coros": p.coros,
                        "zipf": p.theta,
                        "mops": harness::Spread::of(&same),
                    }));
                }
            }
            let body = serde_json::json!({ "runs": results, "spread": spread });
            harness::write_json(path, &provenance, &body)?;
        }
    }
    if let Some(path) = &a.plot {
        plot::write_png(&plot::throughput_vs_threads(&results), path)
            .map_err(|e| format!("writing {}: {e}", path.display()))?;
    }
    Ok(())
}

/// The run table (README: "bench ycsb's columns"), one row per measured
/// point; then each point's operation types; then the spread of repeats.
fn print_ycsb(rs: &[YcsbResult]) {
    println!(
        "{:<7} {:<10} {:<4} {:>7} {:>5} {:>5} {:>9} {:>8} {:>8} {:>8} {:>8} {:>6} {:>6} {:>8} {:>8} {:>7} {:>9}",
        "backend", "index", "wl", "threads", "coros", "zipf", "keys", "Mops", "p50_us", "p99_us", "p999_us", "rt/op", "verbs", "rd_B/op", "wr_B/op", "retry", "load_Mops"
    );
    for r in rs {
        println!(
            "{:<7} {:<10} {:<4} {:>7} {:>5} {:>5.2} {:>9} {:>8.3} {:>8.2} {:>8.2} {:>8.2} {:>6.2} {:>6.2} {:>8.1} {:>8.1} {:>7.3} {:>9.3}",
            r.backend,
            r.index,
            r.workload,
            r.threads,
            r.coros,
            r.zipf,
            r.keys,
            r.mops,
            r.latency.p50_us,
            r.latency.p99_us,
            r.latency.p999_us,
            r.round_trips_per_op,
            r.verbs_per_op,
            r.bytes_read_per_op,
            r.bytes_written_per_op,
            r.retries_per_op,
            r.load_mops
        );
    }
    if rs.iter().any(|r| !r.ops_by_type.is_empty()) {
        println!(
            "{:<7} {:>5} {:<18} {:>12} {:>8} {:>8} {:>8} {:>8}",
            "threads", "coros", "operation", "count", "avg_us", "p95_us", "p99_us", "p999_us"
        );
        for r in rs {
            for (name, t) in &r.ops_by_type {
                println!(
                    "{:<7} {:>5} {:<18} {:>12} {:>8.2} {:>8.2} {:>8.2} {:>8.2}",
                    r.threads,
                    r.coros,
                    name,
                    t.count,
                    t.latency.avg_us,
                    t.latency.p95_us,
                    t.latency.p99_us,
                    t.latency.p999_us
                );
            }
        }
    }
    let mut seen: Vec<(usize, usize, f64)> = Vec::new();
    for r in rs {
        let key = (r.threads, r.coros, r.zipf);
        if seen.contains(&key) {
            continue;
        }
        seen.push(key);
        let same: Vec<f64> = rs
            .iter()
            .filter(|o| (o.threads, o.coros, o.zipf) == key)
            .map(|o| o.mops)
            .collect();
        if same.len() > 1 {
            let m = harness::Spread::of(&same);
            println!(
                "threads {} coros {} zipf {}: {} runs, {:.3} Mops mean, {:.3} standard deviation, {:.3} to {:.3}",
                key.0, key.1, key.2, m.n, m.mean, m.stddev, m.min, m.max
            );
        }
    }
}
