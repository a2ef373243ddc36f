//! `dmkit bench vector-io`: the memory-semantics study's vector IO (SP,
//! doorbell batching, SGL; §III-A, Fig. 3–5) and random vs sequential
//! access (§III-B, Fig. 6), with the local `pwritev`/`preadv` baseline in
//! the same run. Every flag that takes a list sweeps it; the table, the
//! JSON (an array of points) and the PNG cover every combination.

use std::path::PathBuf;
use std::time::Duration;

use clap::Args;
use dmkit_bench::vector_io::{self, Direction, Method, Pattern, VectorIoConfig, VectorIoResult};

use super::{open_fabric, Backend, FabricArgs};
use crate::args::OnOff;
use crate::units::{format_size, parse_size};
use crate::Res;

#[derive(Args)]
pub(crate) struct VectorIoArgs {
    #[command(flatten)]
    fabric: FabricArgs,
    /// Methods: sp (software packing), doorbell (one request per entry,
    /// one doorbell), sgl (scatter/gather list).
    #[arg(long, value_delimiter = ',', default_value = "sp,doorbell,sgl")]
    method: Vec<Method>,
    /// Entries per batch (a list sweeps).
    #[arg(long, value_delimiter = ',', default_value = "1,4,16,32")]
    batch: Vec<usize>,
    /// Bytes per entry (a list sweeps; 1B..8KiB in the study).
    #[arg(long, value_delimiter = ',', default_value = "32", value_parser = parse_size)]
    size: Vec<u64>,
    /// Threads, each with its own queue pair (a list sweeps).
    #[arg(long, value_delimiter = ',', default_value = "1")]
    threads: Vec<usize>,
    /// write (local entries to remote memory) or read.
    #[arg(long, default_value = "write")]
    direction: Direction,
    /// Remote offsets of successive batches: seq or random.
    #[arg(long, value_delimiter = ',', default_value = "random")]
    pattern: Vec<Pattern>,
    /// Bytes of the remote region (a list sweeps: Fig. 6's region sweep).
    #[arg(long, value_delimiter = ',', default_value = "64MiB", value_parser = parse_size)]
    region_size: Vec<u64>,
    /// Measured time per point (virtual time with --backend sim).
    #[arg(long, default_value = "1s", value_parser = humantime::parse_duration)]
    duration: Duration,
    /// The local pwritev/preadv baseline of each point, in the same run
    /// (not with --backend sim: it is a host measurement).
    #[arg(long, value_enum, default_value = "on")]
    local: OnOff,
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
    /// Write a PNG chart (Mops vs the swept dimension, a line per method).
    #[arg(long)]
    plot: Option<PathBuf>,
}

/// The dimension a sweep runs along (the chart's x axis).
fn x_axis(a: &VectorIoArgs) -> (&'static str, fn(&VectorIoResult) -> f64) {
    if a.size.len() > 1 {
        ("entry size (B)", |r| r.size as f64)
    } else if a.threads.len() > 1 {
        ("threads", |r| r.threads as f64)
    } else if a.region_size.len() > 1 {
        ("region size (MiB)", |r| {
            r.region_size as f64 / (1 << 20) as f64
        })
    } else {
        ("batch size (entries)", |r| r.batch as f64)
    }
}

pub(crate) fn bench_vector_io(a: VectorIoArgs) -> Res {
    super::check_outputs(a.json.as_deref(), a.plot.as_deref())?;
    let sim = matches!(a.fabric.backend, Backend::Sim);
    if a.duration.is_zero() {
        return Err(crate::bad_input("--duration must be longer than 0s"));
    }
    super::check_repeat(a.repeat, sim)?;
    if sim && a.local == OnOff::On {
        eprintln!("note: the local baseline is a host measurement; not run with --backend sim");
    }
    let mut cfgs = Vec::new();
    for &pattern in &a.pattern {
        for &region_size in &a.region_size {
            for &threads in &a.threads {
                for &size in &a.size {
                    for &batch in &a.batch {
                        for &method in &a.method {
                            cfgs.push(VectorIoConfig {
                                method,
                                direction: a.direction,
                                batch,
                                size: usize::try_from(size).map_err(|_| "--size too large")?,
                                threads,
                                region_size,
                                pattern,
                                duration: a.duration,
                                seed: a.seed,
                            });
                        }
                    }
                }
            }
        }
    }
    let max_region = a.region_size.iter().copied().max().unwrap_or(0);
    let most = a.threads.iter().copied().max().unwrap_or(1);
    let mut results = Vec::with_capacity(cfgs.len());
    if sim {
        let sc = a.fabric.sim_config(max_region, a.seed)?;
        let shape = vector_io::SimShape {
            profile: sc.profile,
            page_size: a.fabric.page_size.unwrap_or(4096),
            warmup: a.warmup,
        };
        super::start_measuring(most, true);
        for c in &cfgs {
            if dmkit_bench::harness::interrupted() {
                break;
            }
            results.push(vector_io::run_sim(c, &shape).map_err(|e| e.to_string())?);
        }
    } else {
        let fabric = open_fabric(&a.fabric, max_region + (16 << 20))?;
        super::start_measuring(most, false);
        // The local baseline does not depend on the method (nor on the
        // repeat): once per point.
        let mut local: Option<(VectorIoConfig, vector_io::LocalResult)> = None;
        for c in cfgs.iter().flat_map(|c| std::iter::repeat_n(c, a.repeat)) {
            if dmkit_bench::harness::interrupted() {
                break;
            }
            let mut r = vector_io::run(&*fabric, c, false, a.warmup).map_err(|e| e.to_string())?;
            if a.local == OnOff::On {
                let key = VectorIoConfig {
                    method: Method::Sp,
                    ..c.clone()
                };
                if local.as_ref().is_none_or(|(k, _)| *k != key) {
                    local = Some((key.clone(), vector_io::local_vectored(&key)?));
                }
                r.local = local.as_ref().map(|(_, l)| l.clone());
            }
            results.push(r);
        }
    }
    print_table(&results);
    let provenance =
        dmkit_bench::harness::Provenance::new(a.seed, a.duration, a.warmup, false).repeat(a.repeat);
    super::finish_sweep(
        a.json.as_deref(),
        &provenance,
        &results,
        |r| {
            serde_json::json!({
                "method": r.method, "pattern": r.pattern, "batch": r.batch, "size": r.size,
                "threads": r.threads, "region_size": r.region_size,
            })
        },
        |r| r.mops,
    )?;
    if let Some(path) = &a.plot {
        let (x_label, x_of) = x_axis(&a);
        let mut series: std::collections::BTreeMap<String, Vec<(f64, f64)>> = Default::default();
        for r in &results {
            let tag = if a.pattern.len() > 1 {
                format!("{} {}", r.method, r.pattern)
            } else {
                r.method.clone()
            };
            series.entry(tag).or_default().push((x_of(r), r.mops));
            if let Some(l) = &r.local {
                let name = format!(
                    "local {}",
                    if r.direction == "write" {
                        "pwritev"
                    } else {
                        "preadv"
                    }
                );
                let pts = series.entry(name).or_default();
                if !pts.iter().any(|p| p.0 == x_of(r)) {
                    pts.push((x_of(r), l.mops));
                }
            }
        }
        for v in series.values_mut() {
            v.sort_by(|p, q| p.0.total_cmp(&q.0));
        }
        let chart = dmkit_bench::plot::Chart {
            title: format!(
                "vector IO, {} ({})",
                a.direction_name(),
                results.first().map_or("", |r| r.backend.as_str())
            ),
            x_label: x_label.into(),
            y_label: "Mops (entries)".into(),
            series,
        };
        dmkit_bench::plot::write_png(&chart, path)
            .map_err(|e| format!("writing {}: {e}", path.display()))?;
    }
    Ok(())
}

impl VectorIoArgs {
    fn direction_name(&self) -> &'static str {
        match self.direction {
            Direction::Write => "write",
            Direction::Read => "read",
        }
    }
}

fn print_table(rs: &[VectorIoResult]) {
    println!(
        "{:<8} {:<9} {:<6} {:<7} {:>5} {:>6} {:>7} {:>8} {:>9} {:>11} {:>8} {:>7} {:>10} {:>8}",
        "backend",
        "method",
        "dir",
        "pattern",
        "batch",
        "size",
        "threads",
        "region",
        "Mops",
        "Mops/thread",
        "GB/s",
        "wr/bat",
        "local Mops",
        "/local"
    );
    for r in rs {
        let (lm, ratio) = match &r.local {
            Some(l) => (
                format!("{:.3}", l.mops),
                format!("{:.2}", r.mops / l.mops.max(1e-12)),
            ),
            None => ("-".into(), "-".into()),
        };
        println!(
            "{:<8} {:<9} {:<6} {:<7} {:>5} {:>6} {:>7} {:>8} {:>9.3} {:>11.3} {:>8.3} {:>7} {:>10} {:>8}",
            r.backend,
            r.method,
            r.direction,
            r.pattern,
            r.batch,
            r.size,
            r.threads,
            format_size(r.region_size),
            r.mops,
            r.mops_per_thread,
            r.gbytes_per_s,
            r.requests_per_batch,
            lm,
            ratio
        );
    }
}
