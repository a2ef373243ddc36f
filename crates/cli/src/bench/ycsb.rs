//! `dmkit bench ycsb`: YCSB on an index (remote hash table, radix tree,
//! B+tree, or an in-process peer): load, then run a workload.

use std::io::IsTerminal;
use std::path::PathBuf;
use std::time::Duration;

use clap::{Args, ValueEnum};
use dmkit_bench::plot;
use dmkit_bench::ycsb::{Distribution, KeyType, Workload};
use dmkit_bench::ycsb_bench::{self, YcsbConfig, YcsbResult};
use indicatif::{ProgressBar, ProgressStyle};

use super::{open_fabric, Backend, FabricArgs, SwitchArgs};
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
pub(crate) struct YcsbArgs {
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
    /// Hash table: put the run's N likeliest keys in a hot area served in
    /// blocks with IO consolidation (memory-semantics §IV-B; 0: off).
    #[arg(long, default_value_t = 0)]
    hot_keys: usize,
    /// The hash table's switches (its own flags: dmkit_race::RaceConfig).
    #[command(flatten)]
    race: dmkit_race::RaceConfig,
    /// The radix tree's switches (dmkit_art::ArtConfig).
    #[command(flatten)]
    art: dmkit_art::ArtConfig,
    /// The B+tree's switches (dmkit_btree::BtreeConfig).
    #[command(flatten)]
    btree: dmkit_btree::BtreeConfig,
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

pub(crate) fn bench_ycsb(a: YcsbArgs) -> Res {
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
        hot_keys: a.hot_keys,
        race: a.race,
        art: a.art,
        btree: a.btree,
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
    let progress = |u: ycsb_bench::Update| {
        if let Some(b) = &bar {
            b.set_message(u.phase);
            b.set_length(u.total);
            b.set_position(u.done);
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
        r.latency.p50_us,
        r.latency.p99_us,
        r.round_trips_per_op,
        r.verbs_per_op,
        r.bytes_read_per_op,
        r.bytes_written_per_op,
        r.retries_per_op,
        r.load_mops
    );
}
