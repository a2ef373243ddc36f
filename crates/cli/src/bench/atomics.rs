//! `dmkit bench atomics`: the memory-semantics study's remote atomics
//! (§III-E, Fig. 10) — a spinlock and a sequencer, local vs remote vs
//! RPC-based, with and without exponential backoff, threads swept, in one
//! run. The RPC-based ones call the memory node's built-in atomics service
//! (its CPU does the atomic): on a backend whose node runs no RPC workers
//! they are reported as not run (and `--place rpc` alone fails so).

use std::path::PathBuf;
use std::time::Duration;

use clap::Args;
use dmkit_bench::atomics::{self, AtomicsConfig, AtomicsError, AtomicsResult, Place, Primitive};

use super::{open_fabric, Backend, FabricArgs};
use crate::Res;

#[derive(Args)]
pub(crate) struct AtomicsArgs {
    #[command(flatten)]
    fabric: FabricArgs,
    /// Primitives: lock, sequencer.
    #[arg(long, value_delimiter = ',', default_value = "lock,sequencer")]
    primitive: Vec<Primitive>,
    /// Where: local, remote, rpc (default: all three on shm and verbs,
    /// remote and rpc on the simulator).
    #[arg(long, value_delimiter = ',')]
    place: Option<Vec<Place>>,
    /// Backoff: off, on, or both (off,on).
    #[arg(long, value_delimiter = ',', default_value = "off,on")]
    backoff: Vec<crate::args::OnOff>,
    /// Threads (a list sweeps; on the simulator, one per client machine).
    #[arg(long, value_delimiter = ',', default_value = "1,2,4,8,14")]
    threads: Vec<usize>,
    /// Measured time per point (virtual with --backend sim).
    #[arg(long, default_value = "1s", value_parser = humantime::parse_duration)]
    duration: Duration,
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
}

pub(crate) fn bench_atomics(a: AtomicsArgs) -> Res {
    super::check_outputs(a.json.as_deref(), None)?;
    let sim = matches!(a.fabric.backend, Backend::Sim);
    let places = a.place.clone().unwrap_or_else(|| {
        if sim {
            vec![Place::Remote, Place::Rpc]
        } else {
            vec![Place::Local, Place::Remote, Place::Rpc]
        }
    });
    // Everything that can be checked before the fabric is opened.
    if a.duration.is_zero() {
        return Err(crate::bad_input("--duration must be longer than 0s"));
    }
    if a.threads.contains(&0) {
        return Err(crate::bad_input("--threads must be at least 1"));
    }
    super::check_repeat(a.repeat, sim)?;
    let fabric = if sim {
        None
    } else {
        Some(open_fabric(&a.fabric, 16 << 20)?)
    };
    let profile = if sim {
        Some(a.fabric.sim_config(0, a.seed)?.profile)
    } else {
        None
    };
    super::start_measuring(a.threads.iter().copied().max().unwrap_or(1), sim);
    let mut results: Vec<AtomicsResult> = Vec::new();
    let mut not_run = Vec::new();
    for &p in &a.primitive {
        for &place in &places {
            for b in &a.backoff {
                'point: for &threads in &a.threads {
                    for _ in 0..a.repeat {
                        if dmkit_bench::harness::interrupted() {
                            break;
                        }
                        let c = AtomicsConfig {
                            duration: a.duration,
                            ..AtomicsConfig::new(p, place, *b == crate::args::OnOff::On, threads)
                        };
                        let r = match (&fabric, &profile) {
                            (Some(f), _) => atomics::run(&**f, &c, a.warmup),
                            (None, Some(prof)) => atomics::run_sim(&c, prof, a.warmup, a.seed),
                            _ => unreachable!("a backend was chosen"),
                        };
                        match r {
                            Ok(r) => results.push(r),
                            Err(e @ AtomicsError::NoRpcWorkers(_)) => {
                                if places.len() == 1 {
                                    return Err(e.to_string());
                                }
                                not_run.push(e.to_string());
                                break 'point;
                            }
                            Err(e) => return Err(e.to_string()),
                        }
                    }
                }
            }
        }
    }
    println!(
        "{:<8} {:<10} {:<7} {:>8} {:>8} {:>10} {:>12} {:>9}",
        "backend", "primitive", "place", "backoff", "threads", "Mops", "fails/op", "verified"
    );
    for r in &results {
        println!(
            "{:<8} {:<10} {:<7} {:>8} {:>8} {:>10.3} {:>12.2} {:>9}",
            r.backend,
            r.primitive,
            r.place,
            if r.backoff { "on" } else { "off" },
            r.threads,
            r.mops,
            r.failures_per_op,
            r.verified
        );
    }
    not_run.dedup();
    for e in &not_run {
        println!("not run: {e}");
    }
    let provenance =
        dmkit_bench::harness::Provenance::new(a.seed, a.duration, a.warmup, false).repeat(a.repeat);
    super::finish_sweep(
        a.json.as_deref(),
        &provenance,
        &results,
        |r| {
            serde_json::json!({
                "primitive": r.primitive, "place": r.place, "backoff": r.backoff,
                "threads": r.threads,
            })
        },
        |r| r.mops,
    )?;
    if results.iter().any(|r| !r.verified) {
        return Err("a run broke mutual exclusion or lost a number".into());
    }
    Ok(())
}
