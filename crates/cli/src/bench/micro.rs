//! `dmkit bench micro`: one verb at random addresses of a region, per
//! thread, in batches (raw, or through the runtime's tasks).

use std::io::IsTerminal;
use std::path::PathBuf;
use std::time::Duration;

use clap::{Args, ValueEnum};
use dmkit_bench::harness;
use dmkit_bench::micro::{self, MicroConfig, Signal};
use dmkit_fabric::VerbKind;
use indicatif::{ProgressBar, ProgressStyle};

use super::{open_fabric, FabricArgs, SwitchArgs};
use crate::units::{format_size, parse_size};
use crate::Res;

#[derive(Clone, Copy, ValueEnum)]
enum Verb {
    Read,
    Write,
    Cas,
    Faa,
}

#[derive(Clone, Copy, ValueEnum)]
enum SignalArg {
    All,
    Last,
}

#[derive(Args)]
#[command(
    // The simulator's micro-benchmark is `dmkit sim speed`: its flags do
    // not apply here.
    mut_arg("profile", |a| a.hide(true)),
    mut_arg("atomic_order", |a| a.hide(true)),
    mut_arg("atomic_stalls_access", |a| a.hide(true)),
    mut_arg("machines", |a| a.hide(true)),
    mut_arg("memory_nodes", |a| a.hide(true)),
    mut_arg("colocated", |a| a.hide(true)),
    after_help = "EXAMPLES:
  dmkit bench micro --verb read --threads 2 --duration 5s
  dmkit bench micro --verb write --size 4KiB -n 100000 --json w.json
  dmkit bench micro --coros 8 --depth 4 --warmup 1s --repeat 5
  dmkit memnode --size 4GiB --listen unix:/tmp/dm0.sock &
  dmkit bench micro --connect unix:/tmp/dm0.sock --region-size 512MiB"
)]
pub(crate) struct MicroArgs {
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
    /// Unmeasured time between the start barrier and the measured window.
    #[arg(long, default_value = "0s", value_parser = humantime::parse_duration)]
    warmup: Duration,
    /// Iteration mode (perftest's -n): each thread runs this many measured
    /// requests instead of a --duration window.
    #[arg(short = 'n', long)]
    iters: Option<u64>,
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
    #[command(flatten, next_help_heading = "SMART runtime switches (with --coros)")]
    switches: SwitchArgs,
    /// Signal every request, or only the last of each batch.
    #[arg(
        help_heading = "Run and output",
        long,
        value_enum,
        default_value = "all"
    )]
    signal: SignalArg,
    /// Seed of the address generator.
    #[arg(help_heading = "Run and output", long, default_value_t = 1)]
    seed: u64,
    /// Measure this many times; prints and writes each run and the mean
    /// and spread of their throughput.
    #[arg(help_heading = "Run and output", long, default_value_t = 1)]
    repeat: usize,
    /// Write the result as JSON to this file.
    #[arg(help_heading = "Run and output", long)]
    json: Option<PathBuf>,
    /// No progress bar.
    #[arg(help_heading = "Run and output", long)]
    quiet: bool,
}

pub(crate) fn bench_micro(a: MicroArgs) -> Res {
    let verb = match a.verb {
        Verb::Read => VerbKind::Read,
        Verb::Write => VerbKind::Write,
        Verb::Cas => VerbKind::Cas,
        Verb::Faa => VerbKind::Faa,
    };
    let rcfg = a.switches.runtime_config(a.seed)?;
    let cfg = MicroConfig {
        verb,
        size: usize::try_from(a.size).map_err(|_| crate::bad_input("--size too large"))?,
        region_size: a.region_size,
        threads: a.threads,
        batch: a.batch,
        duration: a.duration,
        warmup: a.warmup,
        iters: a.iters,
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
    // Everything that can be checked before anything is allocated.
    if a.repeat == 0 {
        return Err(crate::bad_input("--repeat must be at least 1"));
    }
    micro::validate(&cfg).map_err(crate::bad_input)?;
    if let Some(p) = &a.json {
        harness::check_output("--json", p).map_err(crate::bad_input)?;
    }
    // The embedded node gets the region plus its reserved first page and slack.
    let fabric = open_fabric(&a.fabric, a.region_size + (8 << 20))?;
    micro::check(&cfg, &*fabric)?;
    if let Some(w) = harness::oversubscribed(cfg.threads) {
        eprintln!("dmkit: warning: {w}");
    }
    crate::args::stop_on_ctrl_c();
    let provenance =
        harness::Provenance::new(a.seed, cfg.duration, cfg.warmup, false).repeat(a.repeat);
    let mut runs = Vec::with_capacity(a.repeat);
    for i in 0..a.repeat {
        if harness::interrupted() {
            break;
        }
        let r = run_once(&*fabric, &cfg, a.quiet).map_err(|e| {
            if e.contains("invalid chunk length") && !a.fabric.connect.is_empty() {
                format!(
                    "{e}: --region-size {} does not fit in the memory node, which keeps \
                     its first page for itself: start the node with a larger --size, or \
                     give a smaller --region-size",
                    format_size(cfg.region_size)
                )
            } else {
                e
            }
        })?;
        if i == 0 {
            print_header();
        }
        print_row(&r);
        runs.push(r);
    }
    if runs.len() > 1 {
        let m = harness::Spread::of(&runs.iter().map(|r| r.mops).collect::<Vec<_>>());
        println!(
            "{} runs: {:.3} Mops mean, {:.3} standard deviation, {:.3} to {:.3}",
            m.n, m.mean, m.stddev, m.min, m.max
        );
    }
    if runs.last().is_some_and(|r| r.interrupted) || harness::interrupted() {
        eprintln!("dmkit: interrupted: the last run's figures are of its shortened window");
    }
    if let Some(path) = a.json {
        if runs.len() == 1 {
            harness::write_json(&path, &provenance, &runs[0])?;
        } else {
            let mops = harness::Spread::of(&runs.iter().map(|r| r.mops).collect::<Vec<_>>());
            harness::write_json(&path, &provenance, &harness::Repeated { mops, runs })?;
        }
    }
    Ok(())
}

fn run_once(
    fabric: &dyn dmkit_fabric::Fabric,
    cfg: &MicroConfig,
    quiet: bool,
) -> Result<micro::MicroResult, String> {
    let bar = (!quiet && std::io::stderr().is_terminal()).then(|| {
        let b = match cfg.iters {
            Some(_) => ProgressBar::new_spinner(),
            None => ProgressBar::new((cfg.warmup + cfg.duration).as_millis() as u64),
        };
        b.set_style(
            ProgressStyle::with_template("{spinner} {bar:40} {msg}").expect("valid template"),
        );
        b
    });
    let total = cfg.warmup + cfg.duration;
    let r = micro::run(fabric, cfg, |el, ops| {
        if let Some(b) = &bar {
            b.set_position((cfg.warmup + el).as_millis() as u64);
            if el.is_zero() {
                b.set_message("warming up");
            } else {
                b.set_message(format!(
                    "{:.1}/{:.1} s  {:.2} Mops",
                    el.as_secs_f64(),
                    total.as_secs_f64() - cfg.warmup.as_secs_f64(),
                    ops as f64 / el.as_secs_f64().max(1e-9) / 1e6
                ));
            }
        }
    })
    .map_err(|e| e.to_string())?;
    if let Some(b) = bar {
        b.finish_and_clear();
    }
    Ok(r)
}

/// The columns (README: "bench micro's columns").
fn print_header() {
    println!(
        "{:<8} {:<8} {:<6} {:>6} {:>8} {:>7} {:>5} {:>6} {:>12} {:>8} {:>9} {:>8} {:>8} {:>8} {:>8} {:>9}",
        "backend", "mode", "verb", "size", "region", "threads", "batch", "signal", "ops",
        "seconds", "Mops", "Gb/s", "p50_us", "p99_us", "p999_us", "max_us"
    );
}

fn print_row(r: &micro::MicroResult) {
    let mode = match (r.coros, r.depth) {
        (Some(c), Some(d)) => format!("rt:{c}x{d}"),
        _ => "raw".into(),
    };
    let signal = match r.signal {
        Signal::All => "all",
        Signal::Last => "last",
    };
    println!(
        "{:<8} {:<8} {:<6} {:>6} {:>8} {:>7} {:>5} {:>6} {:>12} {:>8.2} {:>9.3} {:>8.3} {:>8.2} {:>8.2} {:>8.2} {:>9.2}",
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
        r.gbps,
        r.latency.p50_us,
        r.latency.p99_us,
        r.latency.p999_us,
        r.latency.max_us,
    );
}
