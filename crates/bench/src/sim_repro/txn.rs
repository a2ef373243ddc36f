//! SMART's distributed-transaction figures (ASPLOS'24 §6.2.2) on the
//! simulator: FORD+ (FORD, "FORD: Fast One-sided RDMA-based Distributed
//! Transactions for Disaggregated Persistent Memory", FAST'22, with SMART's
//! techniques off: per-thread queue pairs on the driver's default
//! doorbells, no work-request throttling, no conflict avoidance) against
//! SMART-DTX (all three on), both with FORD's hitchhiked locking, backup
//! reads and coalescent commit, a primary and one backup of every record
//! (FORD's `BACKUP_DEGREE 1`) on two memory nodes, one compute node of
//! `threads` × 8 coordinators, SmallBank (100,000 accounts) and TATP
//! (100,000 subscribers) at FORD's defaults. Each run is
//! [`crate::txn_bench`] on the simulator: a drawn transaction is retried
//! until it commits (SMART's artifact counts a conflict abort and draws
//! the next one; the committed rate is what both count).
//!
//! - `smart-fig10` — Fig. 10: committed transactions per second and median
//!   latency vs threads (1, 8, …, 96; quick: 24 and 96).
//! - `smart-fig11` — Fig. 11: 96 threads × 8 coordinators; each idles after
//!   a commit (the artifact's `IDLE_USEC`: 0, 16, …, 8192 µs; quick: 0,
//!   64 and 1024) so the offered load falls: throughput and median latency
//!   per idle time.
//!
//! `published`: per point, SMART's artifact's reference run
//! (`ae/raw-reference/fig10-*.csv`, `fig11-*.csv`: committed Mtxn/s and
//! median µs); the text's "up to 5.2× (SmallBank) and 2.6× (TATP)", the
//! peaks "4.65 M and 6.70 M", and the median-latency reductions "up to
//! 45.8 % and 77.0 %" as summary rows. The device profile is the one every
//! SMART figure uses, calibrated on the micro-benchmarks (Figs. 3 and 4);
//! nothing here is fitted. The paper's records live in Optane persistent
//! memory; the simulator's memory nodes are DRAM (the reproduction has no
//! persistent-memory write-bandwidth model), so the write-heavier
//! SmallBank is where the prediction may run above the paper.
//!
//! Where the prediction stands (seed 1, full run): SmallBank's SMART-DTX
//! peak 4.65 Mtxn/s (paper 4.65) and peak ratio 2.14× (2.19×); FORD+
//! peaks at 24 threads as in the paper (2.18 vs 2.12) but falls only to
//! 1.6 Mtxn/s at 88–96 threads (paper 0.56–0.80, an outlier-ridden tail
//! the text ties to doorbell sharing), so "up to 5.2×" is predicted as
//! 2.7×. TATP: the ratio "up to 2.6×" is 2.7×, but both systems run
//! 1.2–2× above the paper: the paper's TATP is bound by bandwidth (104
//! Gbps at 6.7 M txn/s, ≈1.9 KB per transaction) where dmkit's
//! transactions move ≈0.5 KB (likely, not verified: FORD's larger data
//! items and whole hash nodes read on address-cache misses). Below 16 threads FORD+ runs above the paper
//! (its per-transaction CPU cost is not modelled; the device is idle
//! there).

use std::time::Duration;

use dmkit_runtime::RuntimeConfig;
use dmkit_txn::TxnConfig;

use super::{Acc, Job, Outcome, ReproOptions};
use crate::micro::BenchError;
use crate::txn_bench::{self, TxnBenchConfig, TxnPlatform, TxnWorkload};

/// Figures of this module.
pub(crate) const FIGURES: [&str; 2] = ["smart-fig10", "smart-fig11"];

/// One pass over figure `name` of this module (`None`: not one of them).
pub(super) fn figure(
    name: &str,
    opts: &ReproOptions,
    acc: &mut Acc,
) -> Option<Result<String, BenchError>> {
    Some(match name {
        "smart-fig10" => fig10(opts, acc),
        "smart-fig11" => fig11(opts, acc),
        _ => return None,
    })
}

/// The artifact's thread counts of Fig. 10.
const THREADS: [usize; 13] = [1, 8, 16, 24, 32, 40, 48, 56, 64, 72, 80, 88, 96];

/// The artifact's idle times of Fig. 11 (µs).
const IDLE_US: [u64; 11] = [0, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192];

/// SMART's artifact, `ae/raw-reference/fig10-{smallbank,tatp}.csv`:
/// committed Mtxn/s and median µs per entry of [`THREADS`], FORD+ then
/// SMART-DTX.
type Curve = [(f64, f64); 13];
const FIG10: [(TxnWorkload, &str, Curve, Curve); 2] = [
    (
        TxnWorkload::SmallBank,
        "smallbank",
        [
            (0.212, 34.834),
            (1.044, 48.813),
            (1.559, 64.098),
            (2.120, 65.839),
            (1.505, 107.742),
            (1.269, 142.576),
            (1.433, 151.471),
            (1.147, 232.083),
            (1.139, 264.612),
            (1.071, 284.264),
            (0.988, 329.840),
            (0.558, 489.324),
            (0.803, 449.839),
        ],
        [
            (0.204, 34.271),
            (0.944, 47.173),
            (1.889, 49.046),
            (2.550, 52.853),
            (3.056, 61.298),
            (3.552, 59.530),
            (3.939, 75.058),
            (4.190, 76.445),
            (4.265, 87.872),
            (4.648, 100.844),
            (4.575, 113.274),
            (4.618, 125.136),
            (4.628, 137.234),
        ],
    ),
    (
        TxnWorkload::Tatp,
        "tatp",
        [
            (0.388, 8.744),
            (1.973, 13.171),
            (3.264, 14.947),
            (4.501, 16.102),
            (4.305, 21.639),
            (3.955, 27.280),
            (4.644, 28.194),
            (2.792, 40.172),
            (3.250, 50.852),
            (3.206, 52.431),
            (2.446, 76.774),
            (1.890, 93.692),
            (2.160, 94.150),
        ],
        [
            (0.370, 7.899),
            (1.967, 11.314),
            (3.453, 12.671),
            (4.590, 13.719),
            (5.510, 15.851),
            (5.978, 19.350),
            (5.998, 21.711),
            (6.111, 24.577),
            (6.474, 29.267),
            (6.653, 32.926),
            (6.696, 36.710),
            (6.634, 41.079),
            (6.504, 40.491),
        ],
    ),
];

/// SMART's artifact, `ae/raw-reference/fig11-{smallbank,tatp}.csv`:
/// committed Mtxn/s and median µs per entry of [`IDLE_US`].
type Idle = [(f64, f64); 11];
const FIG11: [(TxnWorkload, &str, Idle, Idle); 2] = [
    (
        TxnWorkload::SmallBank,
        "smallbank",
        [
            (0.893, 453.584),
            (0.939, 385.309),
            (0.913, 380.472),
            (0.963, 368.263),
            (1.028, 246.559),
            (0.915, 198.076),
            (1.264, 33.617),
            (0.722, 23.443),
            (0.367, 21.236),
            (0.185, 20.587),
            (0.093, 20.942),
        ],
        [
            (4.541, 137.484),
            (4.585, 107.992),
            (4.454, 96.605),
            (4.137, 79.752),
            (3.279, 68.907),
            (2.179, 60.798),
            (1.313, 32.836),
            (0.722, 23.520),
            (0.368, 20.034),
            (0.185, 19.726),
            (0.093, 19.137),
        ],
    ),
    (
        TxnWorkload::Tatp,
        "tatp",
        [
            (2.780, 86.495),
            (3.471, 52.882),
            (3.225, 50.322),
            (3.530, 41.238),
            (3.395, 29.796),
            (2.385, 20.378),
            (1.399, 12.119),
            (0.727, 8.538),
            (0.368, 6.701),
            (0.185, 5.675),
            (0.093, 5.948),
        ],
        [
            (6.540, 43.990),
            (5.955, 36.118),
            (5.493, 36.927),
            (4.713, 32.752),
            (3.686, 27.085),
            (2.446, 19.400),
            (1.388, 12.365),
            (0.728, 7.720),
            (0.368, 6.562),
            (0.185, 5.686),
            (0.093, 5.976),
        ],
    ),
];

/// The text's figures (§6.2.2): SMART-DTX over FORD+ "up to", the
/// SMART-DTX peak (M txn/s), the median-latency reduction "up to" (%).
fn text(workload: &str) -> (f64, f64, f64) {
    match workload {
        "smallbank" => (5.2, 4.65, 45.8),
        _ => (2.6, 6.70, 77.0),
    }
}

/// One run's committed Mtxn/s and median µs.
#[derive(Debug, Clone, Copy, Default)]
struct Point {
    mtxn: f64,
    p50_us: f64,
}

/// Asks for a run of `workload` by `smart` (SMART-DTX) or FORD+ with
/// `threads` × 8 coordinators, idling `idle_us` after each commit.
fn txn_run(
    opts: &ReproOptions,
    acc: &mut Acc,
    workload: TxnWorkload,
    smart: bool,
    threads: usize,
    idle_us: u64,
) -> Point {
    let mut runtime = RuntimeConfig {
        thread_aware: smart,
        throttle: smart,
        conflict_avoid: smart,
        seed: opts.seed,
        ..Default::default()
    };
    runtime.tuner.candidates = opts.candidates.clone();
    // Δ × the time scale (as `smart-table1`): the tuner's update phase
    // (one Δ per candidate) must end inside the warm-up.
    // Quick runs scale it 8× further (a smoke test, not a reproduction).
    let scale = opts.time_scale / if opts.quick { 8.0 } else { 1.0 };
    runtime.tuner.delta = ((runtime.tuner.delta as f64 * scale) as u64).max(1);
    let update = runtime.tuner.delta * opts.candidates.len() as u64;
    // The warm-up also outlasts the start-up transient (every coordinator
    // starts at once: the first 1–2 ms have a long tail) and, at the long
    // idle times, spreads the coordinators' phases; the window holds a
    // few transactions per coordinator.
    let idle = Duration::from_micros(idle_us);
    let (settle, measure) = if opts.quick {
        (
            Duration::from_millis(1),
            Duration::from_micros(500).max(2 * idle),
        )
    } else {
        (
            Duration::from_millis(3),
            Duration::from_millis(2).max(4 * idle),
        )
    };
    let warmup = Duration::from_nanos(update) + settle + idle;
    let cfg = TxnBenchConfig {
        workload,
        // Quick: 20,000 accounts or subscribers (hot SmallBank accounts
        // 1/25 of them, as FORD's 4,000 of 100,000).
        scale: if opts.quick { 20_000 } else { 0 },
        threads,
        coros: 8,
        duration: measure,
        warmup,
        idle,
        // FORD's and SMART-DTX's address caches hold found records only.
        txn: TxnConfig {
            cache_absent: false,
            ..TxnConfig::default()
        },
        runtime,
        seed: opts.seed,
        read_only: false,
        local_peer: false,
    };
    let sim = dmkit_sim::SimConfig {
        profile: opts.profile.clone(),
        compute_machines: 1,
        memory_nodes: 2,
        memory_bytes: if opts.quick { 96 << 20 } else { 256 << 20 },
        page_size: 2 << 20,
        seed: opts.seed,
        ..Default::default()
    };
    let run = move || {
        let r = txn_bench::run_txn_on(TxnPlatform::Sim(Box::new(sim)), &cfg)
            .map_err(BenchError::Run)?;
        if !r.invariants_ok {
            return Err(BenchError::Run(format!(
                "{} after the run: {}",
                r.workload,
                r.invariants_error.unwrap_or_default()
            )));
        }
        Ok((vec![r.committed_per_s / 1e6, r.p50_us], r.sim_verbs))
    };
    match acc.ask(|| Job::Values(Box::new(run))) {
        Some(Outcome::Values(v, _)) => Point {
            mtxn: v[0],
            p50_us: v[1],
        },
        Some(_) => unreachable!("a values job answers values"),
        None => Point::default(),
    }
}

const SYSTEMS: [(bool, &str); 2] = [(false, "FORD+"), (true, "SMART-DTX")];

fn fig10(opts: &ReproOptions, acc: &mut Acc) -> Result<String, BenchError> {
    let threads: Vec<usize> = if opts.quick {
        vec![24, 96]
    } else {
        THREADS.to_vec()
    };
    for (workload, name, ford, dtx) in FIG10 {
        let mut points = [Vec::new(), Vec::new()];
        for (i, (smart, system)) in SYSTEMS.into_iter().enumerate() {
            let published = if smart { &dtx } else { &ford };
            for &t in &threads {
                let p = txn_run(opts, acc, workload, smart, t, 0);
                let pub_ = published[THREADS
                    .iter()
                    .position(|&x| x == t)
                    .expect("a thread count")];
                let series = format!("{system} {name}");
                acc.push(&series, t as f64, p.mtxn, "Mtxn/s", Some(pub_.0));
                acc.push(
                    &format!("{series} p50"),
                    t as f64,
                    p.p50_us,
                    "us",
                    Some(pub_.1),
                );
                points[i].push((t, p));
            }
        }
        let (up_to, peak, _) = text(name);
        let mut best_ratio = 0.0f64;
        for ((t, f), (_, d)) in points[0].iter().zip(&points[1]) {
            let k = THREADS.iter().position(|x| x == t).expect("a thread count");
            let ratio = d.mtxn / f.mtxn.max(1e-9);
            best_ratio = best_ratio.max(ratio);
            acc.push(
                &format!("SMART-DTX/FORD+ {name}"),
                *t as f64,
                ratio,
                "x",
                Some(dtx[k].0 / ford[k].0),
            );
        }
        let peak_of = |v: &[(usize, Point)]| v.iter().map(|p| p.1.mtxn).fold(0.0, f64::max);
        let max_t = *threads.last().expect("threads") as f64;
        acc.push(
            &format!("max ratio {name}"),
            max_t,
            best_ratio,
            "x",
            Some(up_to),
        );
        acc.push(
            &format!("peak SMART-DTX {name}"),
            max_t,
            peak_of(&points[1]),
            "Mtxn/s",
            Some(peak),
        );
        let ford_peak = ford.iter().map(|p| p.0).fold(0.0, f64::max);
        acc.push(
            &format!("peak FORD+ {name}"),
            max_t,
            peak_of(&points[0]),
            "Mtxn/s",
            Some(ford_peak),
        );
        acc.push(
            &format!("peak ratio {name}"),
            max_t,
            peak_of(&points[1]) / peak_of(&points[0]).max(1e-9),
            "x",
            Some(dtx.iter().map(|p| p.0).fold(0.0, f64::max) / ford_peak),
        );
    }
    Ok("threads (× 8 coordinators; summary rows at the largest thread count)".into())
}

fn fig11(opts: &ReproOptions, acc: &mut Acc) -> Result<String, BenchError> {
    let idles: Vec<u64> = if opts.quick {
        vec![0, 64, 1024]
    } else {
        IDLE_US.to_vec()
    };
    for (workload, name, ford, dtx) in FIG11 {
        let mut p50 = [Vec::new(), Vec::new()];
        for (i, (smart, system)) in SYSTEMS.into_iter().enumerate() {
            let published = if smart { &dtx } else { &ford };
            for &idle in &idles {
                let p = txn_run(opts, acc, workload, smart, 96, idle);
                let k = IDLE_US
                    .iter()
                    .position(|&x| x == idle)
                    .expect("an idle time");
                let series = format!("{system} {name}");
                acc.push(&series, idle as f64, p.mtxn, "Mtxn/s", Some(published[k].0));
                acc.push(
                    &format!("{series} p50"),
                    idle as f64,
                    p.p50_us,
                    "us",
                    Some(published[k].1),
                );
                p50[i].push(p.p50_us);
            }
        }
        let (_, _, cut) = text(name);
        let best = p50[0]
            .iter()
            .zip(&p50[1])
            .map(|(f, d)| 100.0 * (1.0 - d / f.max(1e-9)))
            .fold(f64::MIN, f64::max);
        acc.push(
            &format!("max p50 reduction {name}"),
            *idles.last().expect("idles") as f64,
            best,
            "%",
            Some(cut),
        );
    }
    Ok("idle µs after each commit (96 threads × 8 coordinators)".into())
}
