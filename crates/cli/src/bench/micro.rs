//! `dmkit bench micro`: one verb at random addresses of a region, per
//! thread, in batches (raw, or through the runtime's tasks).

use std::io::{IsTerminal, Write};
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
  dmkit bench micro --verb read -a -n 10000 --csv sweep.csv    # perftest's -a: 2 B .. 8 MiB
  dmkit bench micro --sizes 64,4KiB,64KiB --threads 2 --duration 2s
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
    /// Bytes per READ/WRITE (atomics: 8) [default: 8].
    #[arg(long, value_parser = parse_size)]
    size: Option<u64>,
    /// Sweep the message size over these (comma-separated, with units:
    /// 64,4KiB,1MiB); one run per size.
    #[arg(long, value_delimiter = ',', value_parser = parse_size)]
    sizes: Vec<u64>,
    /// Sweep every power of two from 2 B to 8 MiB (perftest's -a).
    #[arg(short = 'a', long)]
    all_sizes: bool,
    /// Region the random addresses are drawn from [default: 1GiB; 512MiB
    /// with --connect, so that a default `dmkit memnode` (1 GiB, whose first
    /// page is its own) holds it].
    #[arg(long, value_parser = parse_size)]
    region_size: Option<u64>,
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
    /// Write one CSV line per run to this file (header first; the table's
    /// columns and every latency percentile).
    #[arg(help_heading = "Run and output", long)]
    csv: Option<PathBuf>,
    /// No progress bar.
    #[arg(help_heading = "Run and output", long)]
    quiet: bool,
}

/// The message sizes a run measures: `--size`, `--sizes` or `-a`.
fn sizes_of(a: &MicroArgs, verb: VerbKind) -> Result<Vec<usize>, String> {
    let sweep = a.all_sizes || !a.sizes.is_empty();
    if a.all_sizes && !a.sizes.is_empty() {
        return Err(crate::bad_input(
            "--all-sizes (-a) and --sizes both choose the sizes: give one",
        ));
    }
    if sweep && a.size.is_some() {
        return Err(crate::bad_input(
            "--size is one size; with --sizes or --all-sizes (-a) leave it out",
        ));
    }
    if sweep && verb.is_atomic() {
        return Err(crate::bad_input(format!(
            "--sizes and --all-sizes (-a) sweep READ and WRITE; --verb {} moves 8 bytes",
            verb.name()
        )));
    }
    let sizes: Vec<u64> = if a.all_sizes {
        micro::all_sizes().into_iter().map(|s| s as u64).collect()
    } else if !a.sizes.is_empty() {
        a.sizes.clone()
    } else {
        vec![a.size.unwrap_or(8)]
    };
    let flag = if a.all_sizes {
        "--all-sizes"
    } else if sweep {
        "--sizes"
    } else {
        "--size"
    };
    sizes
        .into_iter()
        .map(|s| usize::try_from(s).map_err(|_| crate::bad_input(format!("{flag} {s}: too large"))))
        .collect()
}

pub(crate) fn bench_micro(a: MicroArgs) -> Res {
    let verb = match a.verb {
        Verb::Read => VerbKind::Read,
        Verb::Write => VerbKind::Write,
        Verb::Cas => VerbKind::Cas,
        Verb::Faa => VerbKind::Faa,
    };
    let rcfg = a.switches.runtime_config(a.seed)?;
    let sizes = sizes_of(&a, verb)?;
    let region_size = a.region_size.unwrap_or(if a.fabric.connect.is_empty() {
        1 << 30
    } else {
        512 << 20
    });
    let cfg = MicroConfig {
        verb,
        size: sizes[0],
        region_size,
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
    let at = |size: usize| MicroConfig {
        size,
        ..cfg.clone()
    };
    // Everything that can be checked before anything is allocated.
    if a.repeat == 0 {
        return Err(crate::bad_input("--repeat must be at least 1"));
    }
    for &size in &sizes {
        micro::validate(&at(size)).map_err(crate::bad_input)?;
    }
    // Each thread's local buffers hold a batch (or a task round) of the
    // largest message.
    let largest = sizes.iter().copied().max().unwrap_or(8) as u64;
    let per_round = cfg.runtime.as_ref().map_or(cfg.batch, |r| r.depth) as u64;
    harness::check_memory(
        "--size × --batch (or --depth) × --threads of local buffers",
        largest
            .saturating_mul(per_round)
            .saturating_mul(cfg.threads as u64),
    )
    .map_err(crate::bad_input)?;
    super::check_outputs(a.json.as_deref(), None)?;
    if let Some(p) = &a.csv {
        harness::check_output("--csv", p).map_err(crate::bad_input)?;
    }
    // The embedded node gets the region plus its reserved first page and slack.
    let fabric = open_fabric(&a.fabric, region_size + (8 << 20))?;
    for &size in &sizes {
        micro::check(&at(size), &*fabric)?;
    }
    if let Some(w) = harness::oversubscribed(cfg.threads) {
        eprintln!("dmkit: warning: {w}");
    }
    let mut csv = match &a.csv {
        Some(p) => {
            let mut f =
                std::fs::File::create(p).map_err(|e| format!("--csv {}: {e}", p.display()))?;
            writeln!(f, "{}", micro::MicroResult::CSV_HEADER)
                .map_err(|e| format!("writing {}: {e}", p.display()))?;
            Some((f, p))
        }
        None => None,
    };
    crate::args::stop_on_ctrl_c();
    let provenance =
        harness::Provenance::new(a.seed, cfg.duration, cfg.warmup, false).repeat(a.repeat);
    let mut runs = Vec::with_capacity(a.repeat * sizes.len());
    let mut points = Vec::with_capacity(sizes.len());
    for &size in &sizes {
        let cfg = at(size);
        let first = runs.len();
        for _ in 0..a.repeat {
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
            if runs.is_empty() {
                print_header();
            }
            print_row(&r);
            if let Some((f, p)) = &mut csv {
                writeln!(f, "{}", r.csv_row())
                    .and_then(|()| f.flush())
                    .map_err(|e| format!("writing {}: {e}", p.display()))?;
            }
            runs.push(r);
        }
        let mine = &runs[first..];
        if mine.is_empty() {
            break;
        }
        if mine.len() > 1 {
            let m = harness::Spread::of(&mine.iter().map(|r| r.mops).collect::<Vec<_>>());
            println!(
                "{} runs of {} B: {:.3} Mops mean, {:.3} standard deviation, {:.3} to {:.3}",
                m.n, size, m.mean, m.stddev, m.min, m.max
            );
        }
        points.push(SizePoint::of(size, mine));
        if harness::interrupted() {
            break;
        }
    }
    if runs.last().is_some_and(|r| r.interrupted) || harness::interrupted() {
        eprintln!("dmkit: interrupted: the last run's figures are of its shortened window");
    }
    if let Some(path) = a.json {
        if sizes.len() > 1 {
            let body = Sweep {
                sizes: &sizes,
                points,
                runs: &runs,
            };
            harness::write_json(&path, &provenance, &body)?;
        } else if runs.len() == 1 {
            harness::write_json(&path, &provenance, &runs[0])?;
        } else {
            let mops = harness::Spread::of(&runs.iter().map(|r| r.mops).collect::<Vec<_>>());
            harness::write_json(&path, &provenance, &harness::Repeated { mops, runs })?;
        }
    }
    Ok(())
}

/// A size sweep's JSON: the sizes asked for, each size's spread over its
/// runs, and every run (what `dmkit plot --x size` reads).
#[derive(serde::Serialize)]
struct Sweep<'a> {
    sizes: &'a [usize],
    points: Vec<SizePoint>,
    runs: &'a [micro::MicroResult],
}

/// One size of a sweep: its runs' throughput, bandwidth and median latency.
#[derive(serde::Serialize)]
struct SizePoint {
    size: usize,
    mops: harness::Spread,
    gbps: harness::Spread,
    p50_us: harness::Spread,
}

impl SizePoint {
    fn of(size: usize, runs: &[micro::MicroResult]) -> Self {
        let of = |f: fn(&micro::MicroResult) -> f64| {
            harness::Spread::of(&runs.iter().map(f).collect::<Vec<_>>())
        };
        Self {
            size,
            mops: of(|r| r.mops),
            gbps: of(|r| r.gbps),
            p50_us: of(|r| r.latency.p50_us),
        }
    }
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
        "{:<8} {:<8} {:<6} {:>8} {:>8} {:>7} {:>5} {:>6} {:>12} {:>8} {:>9} {:>8} {:>8} {:>8} {:>8} {:>9}",
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
        "{:<8} {:<8} {:<6} {:>8} {:>8} {:>7} {:>5} {:>6} {:>12} {:>8.2} {:>9.3} {:>8.3} {:>8.2} {:>8.2} {:>8.2} {:>9.2}",
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
