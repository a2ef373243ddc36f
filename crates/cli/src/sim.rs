//! `dmkit sim`: the deterministic RNIC simulator's commands — `reproduce`
//! a paper's figure, measure the simulator's own `speed`, and `check` a
//! concurrency scenario under fault injection over many seeds.

use std::io::IsTerminal;
use std::path::PathBuf;
use std::time::Duration;

use clap::{Args, Subcommand};
use dmkit_bench::plot;
use indicatif::{ProgressBar, ProgressStyle};

use crate::args::{load_profile, parse_atomic_order, OnOff};
use crate::Res;

#[derive(Subcommand)]
pub(crate) enum SimCmd {
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
pub(crate) struct CheckArgs {
    /// Scenario: counters, race, art, btree, txn (a coordinator crashed at a
    /// commit step), or crash-race, crash-art, crash-btree (a compute machine killed mid-run).
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
    /// No progress bar.
    #[arg(long)]
    quiet: bool,
}

#[derive(Args)]
pub(crate) struct SpeedArgs {
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
    /// Device profile: cx6-200g, cx5-100g, cx3-56g, cx3-40g, or a TOML file.
    #[arg(long, default_value = "cx6-200g")]
    profile: String,
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// Write the result as JSON to this file.
    #[arg(long)]
    json: Option<PathBuf>,
}

#[derive(Args)]
pub(crate) struct ReproduceArgs {
    /// Figure: smart-fig3a, smart-fig4a, smart-table1, smart-fig7,
    /// smart-fig12, smart-fig14, smart-art-fig11, smart-art-fig15,
    /// memsem-fig13, memsem-fig3|4|5|6|8|10|12|15|16|19, swordbox-fig5|10|11|12|13|14,
    /// swordbox-sherman, corm-fig9|10|12|16, smart-fig8|9|10|11|13,
    /// smart-art-fig3|4|12|13|14|16|17|18.
    #[arg(required_unless_present = "all", conflicts_with = "all")]
    name: Option<String>,
    /// Run every figure this build reproduces, one after the other (needs
    /// --report).
    #[arg(long, requires = "report", conflicts_with_all = ["json", "plot"])]
    all: bool,
    /// Write the reproduction report into this directory: index.html (one
    /// self-contained page: each figure's plot beside the paper's numbers,
    /// the ratio per point, in or out of band, profile, wall time, the
    /// command to rerun it), report.md, figures/*.svg and json/*.json.
    #[arg(long, value_name = "DIR")]
    report: Option<PathBuf>,
    /// --report: a point is in band when within this fraction of the
    /// paper's value.
    #[arg(long, default_value_t = 0.3, requires = "report")]
    band: f64,
    /// Device profile: cx6-200g, cx5-100g, cx3-56g, cx3-40g, or a TOML
    /// file (default: the papers' hardware — cx3-40g for the
    /// memory-semantics figures other than memsem-fig13, cx3-56g for
    /// CoRM's, cx6-200g for the others).
    #[arg(long)]
    profile: Option<String>,
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
    /// Override the profile's `response_gaps`: a response takes the first
    /// idle gap of its links once its request has executed, instead of a
    /// FIFO booked in posting order (where the response of an atomic
    /// waiting at a contended address holds back those of requests posted
    /// after it). On in the built-in profiles; off reruns the FIFO. The
    /// SwordBox figures take it onto their own device.
    #[arg(long, value_enum)]
    response_gaps: Option<OnOff>,
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
    /// Write the figure as a chart: .png, .svg or .pdf (reproduced lines,
    /// the paper's values as hollow markers).
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

/// The profile a figure runs on unless told: the papers' hardware — the
/// study's 40 Gb ConnectX-3 (cx3-40g) for the memory-semantics figures
/// other than memsem-fig13, CoRM's 56 Gb one (cx3-56g) for CoRM's,
/// cx6-200g for the others.
fn default_profile(name: &str) -> &'static str {
    if name.starts_with("memsem-") && name != "memsem-fig13" {
        "cx3-40g"
    } else if name.starts_with("corm-") {
        "cx3-56g"
    } else {
        "cx6-200g"
    }
}

fn repro_options(
    a: &ReproduceArgs,
    name: &str,
) -> Result<dmkit_bench::sim_repro::ReproOptions, String> {
    use dmkit_bench::sim_repro;
    let mut profile = load_profile(
        a.profile.as_deref().unwrap_or(default_profile(name)),
        a.atomic_order,
        a.atomic_stalls_access,
    )?;
    if let Some(g) = a.response_gaps {
        profile.link.response_gaps = g == OnOff::On;
    }
    Ok(sim_repro::ReproOptions {
        profile,
        seed: a.seed,
        quick: a.quick,
        time_scale: a.time_scale,
        candidates: a
            .tuner_candidates
            .clone()
            .unwrap_or_else(|| sim_repro::PAPER_CANDIDATES.to_vec()),
        jobs: a.jobs.unwrap_or_else(dmkit_bench::default_jobs),
    })
}

fn progress_bar(a: &ReproduceArgs, prefix: &str) -> Option<ProgressBar> {
    (!a.quiet && std::io::stderr().is_terminal()).then(|| {
        let b = ProgressBar::new(1);
        b.set_style(
            ProgressStyle::with_template(&format!(
                "{prefix}{{spinner}} runs {{bar:40}} {{pos}}/{{len}} {{elapsed}}"
            ))
            .expect("valid template"),
        );
        // Ticks on its own, so a long run does not look frozen.
        b.enable_steady_tick(Duration::from_millis(200));
        b
    })
}

/// The command that reruns figure `name` as `a` ran it.
fn rerun_command(a: &ReproduceArgs, name: &str) -> String {
    let mut c = format!("dmkit sim reproduce {name}");
    if let Some(p) = &a.profile {
        c += &format!(" --profile {p}");
    }
    if let Some(o) = a.atomic_order {
        c += &format!(" --atomic-order {}", o.name());
    }
    if let Some(s) = a.atomic_stalls_access {
        c += &format!(
            " --atomic-stalls-access {}",
            if s == OnOff::On { "on" } else { "off" }
        );
    }
    if let Some(g) = a.response_gaps {
        c += &format!(
            " --response-gaps {}",
            if g == OnOff::On { "on" } else { "off" }
        );
    }
    c += &format!(" --seed {}", a.seed);
    if a.quick {
        c += " --quick";
    }
    if a.time_scale != 0.125 {
        c += &format!(" --time-scale {}", a.time_scale);
    }
    if let Some(t) = &a.tuner_candidates {
        let v: Vec<String> = t
            .iter()
            .map(|&c| {
                if c == dmkit_runtime::throttle::UNLIMITED {
                    "unlimited".into()
                } else {
                    c.to_string()
                }
            })
            .collect();
        c += &format!(" --tuner-candidates {}", v.join(","));
    }
    c + &format!(" --json {name}.json --plot {name}.svg")
}

/// `--report DIR` (with `--all` or one figure): run the figures, write the
/// report.
fn sim_report(a: &ReproduceArgs, dir: &std::path::Path) -> Res {
    use dmkit_bench::{report, sim_repro};
    if !(a.band.is_finite() && a.band >= 0.0) {
        return Err(crate::bad_input(format!(
            "--band {}: expected a fraction of the paper's value, at least 0",
            a.band
        )));
    }
    std::fs::create_dir_all(dir).map_err(|e| {
        crate::bad_input(format!("--report {}: cannot create it: {e}", dir.display()))
    })?;
    let names: Vec<String> = match &a.name {
        Some(n) => vec![n.clone()],
        None => sim_repro::FIGURES.iter().map(|s| s.to_string()).collect(),
    };
    // Every profile loads before anything runs.
    let mut plans = Vec::new();
    for n in &names {
        plans.push((n.clone(), repro_options(a, n)?));
    }
    let mut entries = Vec::new();
    let total = plans.len();
    for (i, (name, opts)) in plans.into_iter().enumerate() {
        let bar = progress_bar(a, &format!("[{}/{total}] {name} ", i + 1));
        if bar.is_none() && !a.quiet {
            eprintln!("[{}/{total}] {name}", i + 1);
        }
        let progress = |done: usize, total: usize| {
            if let Some(b) = &bar {
                b.set_length(total as u64);
                b.set_position(done as u64);
            }
        };
        let outcome = sim_repro::reproduce(&name, &opts, &progress).map_err(|e| e.to_string());
        if let Some(b) = bar {
            b.finish_and_clear();
        }
        match &outcome {
            Ok(f) => {
                let (n, k) = report::score(f, a.band);
                println!(
                    "{name}: {:.1} s wall, {k} of {n} points with a paper value within ±{:.0} %",
                    f.wall_seconds,
                    a.band * 100.0
                );
            }
            Err(e) => println!("{name}: failed: {e}"),
        }
        let command = rerun_command(a, &name);
        entries.push(report::Entry {
            name,
            outcome,
            command,
        });
    }
    let command = std::env::args()
        .map(|s| if s.contains(' ') { format!("'{s}'") } else { s })
        .collect::<Vec<_>>()
        .join(" ");
    let page = report::write(
        dir,
        &entries,
        &report::Options {
            quick: a.quick,
            band: a.band,
            command,
        },
    )?;
    println!("report: {} (and report.md beside it)", page.display());
    let failed: Vec<&str> = entries
        .iter()
        .filter(|e| e.outcome.is_err())
        .map(|e| e.name.as_str())
        .collect();
    if failed.is_empty() {
        Ok(())
    } else {
        Err(format!(
            "{} figure(s) failed: {}",
            failed.len(),
            failed.join(", ")
        ))
    }
}

pub(crate) fn sim_reproduce(a: ReproduceArgs) -> Res {
    use dmkit_bench::sim_repro;
    if let Some(dir) = &a.report {
        return sim_report(&a, dir);
    }
    let name = a.name.clone().expect("clap: a name unless --all");
    let opts = repro_options(&a, &name)?;
    for (flag, p) in [("--json", &a.json), ("--plot", &a.plot)] {
        if let Some(p) = p {
            dmkit_bench::harness::check_output(flag, p).map_err(crate::bad_input)?;
        }
    }
    if let Some(p) = &a.plot {
        plot::Format::of_path(p).map_err(|e| crate::bad_input(format!("--plot {e}")))?;
    }
    let bar = progress_bar(&a, "");
    let progress = |done: usize, total: usize| {
        if let Some(b) = &bar {
            b.set_length(total as u64);
            b.set_position(done as u64);
        }
    };
    let f = sim_repro::reproduce(&name, &opts, &progress).map_err(|e| e.to_string())?;
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
    if a.quick {
        println!(
            "quick run: fewer points and shorter windows than the paper's; the ratios above \
             check that the model runs, they are not a reproduction (drop --quick for that)"
        );
    }
    if let Some(path) = &a.json {
        // The figure's fields as before (its rows compare bit for bit
        // between builds), with the provenance added in front.
        let prov =
            dmkit_bench::harness::Provenance::new(a.seed, Duration::ZERO, Duration::ZERO, a.quick);
        dmkit_bench::harness::write_json(path, &prov, &f)?;
    }
    if let Some(path) = &a.plot {
        plot::write(&sim_repro::chart(&f, a.quick), path)
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

pub(crate) fn sim_speed(a: SpeedArgs) -> Res {
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

pub(crate) fn sim_check(a: CheckArgs) -> Res {
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
    // A bar on a terminal (long scenarios take minutes), counting seeds.
    let bar = (!a.quiet && std::io::stderr().is_terminal()).then(|| {
        let b = ProgressBar::new(end - first);
        b.set_style(
            ProgressStyle::with_template(&format!(
                "{} {{spinner}} seeds {{bar:40}} {{pos}}/{{len}} {{elapsed}}",
                a.scenario
            ))
            .expect("valid template"),
        );
        b.enable_steady_tick(Duration::from_millis(200));
        b
    });
    let out = sim_check::run_seeds_with(&a.scenario, first, end, jobs, &|n| {
        if let Some(b) = &bar {
            b.set_position(n);
        }
    });
    if let Some(b) = bar {
        b.finish_and_clear();
    }
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
