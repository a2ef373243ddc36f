//! `dmkit bench io-consolidation`: the memory-semantics study's IO
//! consolidation (§III-C, Fig. 8) — small random writes into hot aligned
//! regions, each its own WRITE (native) or consolidated by the runtime's
//! write-back buffer at θ modifications, θ swept, in one run.

use std::path::PathBuf;
use std::time::Duration;

use clap::Args;
use dmkit_bench::io_consolidation::{self, ConsolidationPoint, ConsolidationResult};

use super::{open_fabric, Backend, FabricArgs};
use crate::args::OnOff;
use crate::units::parse_size;
use crate::Res;

#[derive(Args)]
pub(crate) struct ConsolidationArgs {
    #[command(flatten)]
    fabric: FabricArgs,
    /// θ values: modifications buffered per write-back (a list sweeps).
    #[arg(long, value_delimiter = ',', default_value = "1,2,4,8,16,32")]
    theta: Vec<u32>,
    /// Also run the native path (every write its own WRITE), first.
    #[arg(long, value_enum, default_value = "on")]
    native: OnOff,
    /// Bytes per write.
    #[arg(long, default_value = "32", value_parser = parse_size)]
    size: u64,
    /// Bytes per hot region (aligned to its size).
    #[arg(long, default_value = "1KiB", value_parser = parse_size)]
    region: u64,
    /// Hot regions per thread.
    #[arg(long, default_value_t = 16)]
    regions: usize,
    /// Threads, each writing its own regions (a list sweeps).
    #[arg(long, value_delimiter = ',', default_value = "1")]
    threads: Vec<usize>,
    /// Measured time per point (virtual with --backend sim).
    #[arg(long, default_value = "1s", value_parser = humantime::parse_duration)]
    duration: Duration,
    /// Longest a write stays buffered.
    #[arg(long, default_value = "1ms", value_parser = humantime::parse_duration)]
    lease: Duration,
    /// Unmeasured time before each point's window (virtual with --backend sim).
    #[arg(long, default_value = "200us", value_parser = humantime::parse_duration)]
    warmup: Duration,
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// Measure each point this many times in a row; prints each point's
    /// mean and spread, and the JSON gets `points` (not on the simulator,
    /// which is deterministic).
    #[arg(long, default_value_t = 1)]
    repeat: usize,
    /// Write the points as JSON to this file (`runs`, after `provenance`).
    #[arg(long)]
    json: Option<PathBuf>,
    /// Write a PNG chart (Mops vs θ, a line per thread count; native at θ = 0).
    #[arg(long)]
    plot: Option<PathBuf>,
}

pub(crate) fn bench_consolidation(a: ConsolidationArgs) -> Res {
    super::check_outputs(a.json.as_deref(), a.plot.as_deref())?;
    let mut points = Vec::new();
    for &threads in &a.threads {
        let thetas = (a.native == OnOff::On)
            .then_some(None)
            .into_iter()
            .chain(a.theta.iter().map(|&t| Some(t)));
        for theta in thetas {
            points.push(ConsolidationPoint {
                theta,
                size: usize::try_from(a.size).map_err(|_| "--size too large")?,
                region: usize::try_from(a.region).map_err(|_| "--region too large")?,
                regions: a.regions,
                threads,
                duration: a.duration,
                lease: a.lease,
                seed: a.seed,
            });
        }
    }
    if a.duration.is_zero() {
        return Err(crate::bad_input("--duration must be longer than 0s"));
    }
    let sim = matches!(a.fabric.backend, Backend::Sim);
    super::check_repeat(a.repeat, sim)?;
    let mut results: Vec<ConsolidationResult> = Vec::new();
    let most = a.threads.iter().copied().max().unwrap_or(1);
    if sim {
        let sc = a.fabric.sim_config(0, a.seed)?;
        super::start_measuring(most, true);
        for p in &points {
            if dmkit_bench::harness::interrupted() {
                break;
            }
            results.push(
                io_consolidation::run_sim(p, &sc.profile, a.warmup).map_err(|e| e.to_string())?,
            );
        }
    } else {
        let fabric = open_fabric(
            &a.fabric,
            a.region * a.regions as u64 * most as u64 + (16 << 20),
        )?;
        super::start_measuring(most, false);
        for p in points.iter().flat_map(|p| std::iter::repeat_n(p, a.repeat)) {
            if dmkit_bench::harness::interrupted() {
                break;
            }
            results.push(io_consolidation::run(&*fabric, p, a.warmup).map_err(|e| e.to_string())?);
        }
    }
    println!(
        "{:<8} {:>7} {:>6} {:>7} {:>7} {:>7} {:>10} {:>9} {:>10} {:>10} {:>8}",
        "backend",
        "theta",
        "size",
        "region",
        "regions",
        "threads",
        "Mops",
        "x native",
        "WRs/write",
        "B/write",
        "verified"
    );
    for r in &results {
        let native = results
            .iter()
            .find(|n| n.theta == 0 && n.threads == r.threads)
            .map(|n| n.mops);
        println!(
            "{:<8} {:>7} {:>6} {:>7} {:>7} {:>7} {:>10.3} {:>9} {:>10.4} {:>10.1} {:>8}",
            r.backend,
            if r.theta == 0 {
                "native".to_string()
            } else {
                r.theta.to_string()
            },
            r.size,
            r.region,
            r.regions,
            r.threads,
            r.mops,
            native.map_or("-".into(), |n| format!("{:.2}", r.mops / n.max(1e-12))),
            r.wrs_per_write,
            r.bytes_per_write,
            r.verified
        );
    }
    let provenance =
        dmkit_bench::harness::Provenance::new(a.seed, a.duration, a.warmup, false).repeat(a.repeat);
    super::finish_sweep(
        a.json.as_deref(),
        &provenance,
        &results,
        |r| serde_json::json!({ "theta": r.theta, "threads": r.threads }),
        |r| r.mops,
    )?;
    if let Some(path) = &a.plot {
        let mut series: std::collections::BTreeMap<String, Vec<(f64, f64)>> = Default::default();
        for r in &results {
            series
                .entry(format!(
                    "{} thread{}",
                    r.threads,
                    if r.threads == 1 { "" } else { "s" }
                ))
                .or_default()
                .push((r.theta as f64, r.mops));
        }
        let chart = dmkit_bench::plot::Chart {
            title: format!(
                "IO consolidation, {} B writes into {} B regions ({})",
                a.size,
                a.region,
                results.first().map_or("", |r| r.backend.as_str())
            ),
            x_label: "θ, modifications per write-back (0 = native)".into(),
            y_label: "Mops (writes)".into(),
            series,
        };
        dmkit_bench::plot::write_png(&chart, path)
            .map_err(|e| format!("writing {}: {e}", path.display()))?;
    }
    if results.iter().any(|r| !r.verified) {
        return Err("a run's remote image differs from what it wrote".into());
    }
    Ok(())
}
