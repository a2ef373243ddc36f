//! SMART (ASPLOS'24) §6's other figures, as predictions of the calibrated
//! model (no parameter is fitted to them):
//!
//! - `smart-fig8` — §6.2.1, Fig. 8: the hash table's breakdown. From RACE
//!   (per-thread queue pairs on the driver's default doorbells, no
//!   throttling, no conflict avoidance) each technique is switched on in
//!   turn — +ThdResAlloc (thread-aware allocation), +WorkReqThrot
//!   (adaptive work-request throttling), +ConflictAvoid (conflict
//!   avoidance, i.e. SMART-HT) — on YCSB A, B and C, one compute node,
//!   threads swept, 8 tasks each, as `smart-fig7`'s runs (zipfian 0.99 over
//!   100 M ranks, 8-byte keys and values, 2 memory nodes). `published`:
//!   SMART's artifact (`ae/raw-reference/fig8-ycsb-{a,b,c}.csv`), at the
//!   thread counts it measured (1, 8, 16, …, 96).
//! - `smart-fig13` — §6.3, Fig. 13: 8-byte READs under the queue-pair
//!   policies, (a) threads swept at 16 outstanding requests per thread
//!   and (b) 96 threads with the batch size swept: per-thread QP,
//!   +ThdResAlloc (per-thread doorbell) and +WorkReqThrot (Algorithm 1's
//!   candidates). `published`: the artifact's `fig13a.csv`/`fig13b.csv`.
//!
//! - `smart-fig9` — §6.2.1, Fig. 9: throughput vs latency of the hash
//!   table on YCSB C, one compute node, 96 threads × 8 tasks, RACE and
//!   SMART-HT, the load throttled by the clients: every task pauses
//!   between its operations (the YCSB driver's think time, as the
//!   artifact's `IDLE_USEC`: 0, 16, 32, …, 8192 µs). `published`: the
//!   artifact's `ae/raw-reference/fig9.csv` (Mops, p50 and p99 in µs per
//!   pause). The text's claims are rows too: SMART-HT's p50 at most 30.3
//!   µs, its lowest p50 11.2 µs, the largest p50 and p99 reductions over
//!   RACE at one pause (69.6 % and 80.6 %).

use super::{ht_run_with, run, Acc, HtPoint, ReproOptions};
use crate::micro::BenchError;
use crate::sim_micro::SimMicroConfig;
use dmkit_fabric::QpPolicy;

/// The figures of this module.
pub(super) const FIGURES: [&str; 3] = ["smart-fig8", "smart-fig9", "smart-fig13"];

/// One pass over figure `name` (one of [`FIGURES`]): its x label.
pub(super) fn figure(name: &str, opts: &ReproOptions, acc: &mut Acc) -> Result<String, BenchError> {
    match name {
        "smart-fig8" => fig8(opts, acc),
        "smart-fig9" => fig9(opts, acc),
        "smart-fig13" => fig13(opts, acc),
        _ => unreachable!("dispatched only for this module's FIGURES"),
    }
}

/// The thread counts of SMART's artifact runs (Figs. 8 and 13a).
const ARTIFACT_THREADS: [usize; 13] = [1, 8, 16, 24, 32, 40, 48, 56, 64, 72, 80, 88, 96];

/// The artifact's value at `t` threads, if it measured there.
fn at(series: &[f64; 13], t: usize) -> Option<f64> {
    ARTIFACT_THREADS
        .iter()
        .position(|&x| x == t)
        .map(|i| series[i])
}

/// Fig. 8's four steps: name, thread-aware, throttle, conflict avoidance.
const FIG8_STEPS: [(&str, bool, bool, bool); 4] = [
    ("RACE", false, false, false),
    ("+ThdResAlloc", true, false, false),
    ("+WorkReqThrot", true, true, false),
    ("+ConflictAvoid", true, true, true),
];

/// SMART's artifact, `ae/raw-reference/fig8-ycsb-{a,b,c}.csv` (Mops at
/// [`ARTIFACT_THREADS`]), per workload in [`FIG8_STEPS`] order.
#[rustfmt::skip]
const FIG8_ARTIFACT: [[[f64; 13]; 4]; 3] = [
    [
        [0.341, 2.799, 1.584, 0.689, 0.518, 0.482, 0.407, 0.305, 0.251, 0.218, 0.203, 0.204, 0.201],
        [0.334, 2.744, 1.521, 0.709, 0.537, 0.497, 0.391, 0.296, 0.244, 0.224, 0.209, 0.213, 0.193],
        [0.324, 2.635, 4.216, 4.023, 5.146, 1.895, 1.394, 0.480, 0.453, 0.381, 0.391, 0.298, 0.226],
        [0.325, 2.683, 4.535, 5.347, 5.533, 5.553, 5.643, 5.498, 5.468, 5.323, 5.321, 5.306, 5.234],
    ],
    [
        [0.509, 3.322, 5.718, 8.218, 9.634, 9.555, 11.505, 8.340, 7.470, 7.352, 6.946, 6.137, 5.128],
        [0.500, 3.439, 6.444, 10.064, 13.644, 15.493, 17.087, 18.430, 8.868, 7.971, 5.594, 4.202, 3.064],
        [0.496, 3.418, 6.648, 10.194, 12.850, 14.608, 16.814, 17.854, 13.218, 9.782, 7.710, 6.748, 9.467],
        [0.495, 3.562, 6.872, 9.699, 12.107, 14.943, 16.757, 18.926, 20.209, 20.331, 20.198, 20.690, 20.882],
    ],
    [
        [0.571, 4.318, 6.727, 10.158, 10.435, 10.038, 11.502, 8.803, 8.132, 8.278, 7.629, 6.891, 6.455],
        [0.574, 4.578, 8.467, 12.130, 15.784, 18.705, 20.754, 21.987, 23.147, 23.850, 23.848, 23.796, 23.942],
        [0.557, 4.359, 8.357, 11.741, 15.592, 17.549, 20.051, 20.922, 22.843, 23.687, 23.621, 23.728, 23.886],
        [0.561, 4.462, 8.627, 12.063, 15.786, 18.338, 20.559, 22.233, 23.138, 23.574, 23.678, 23.719, 23.856],
    ],
];

fn fig8(opts: &ReproOptions, acc: &mut Acc) -> Result<String, BenchError> {
    use crate::ycsb::Workload;
    let threads: &[usize] = if opts.quick {
        &[16, 96]
    } else {
        &[1, 8, 16, 32, 48, 64, 96]
    };
    let workloads = [(Workload::A, "a"), (Workload::B, "b"), (Workload::C, "c")];
    for (wi, (w, wname)) in workloads.into_iter().enumerate() {
        for (si, &(step, aware, throttle, ca)) in FIG8_STEPS.iter().enumerate() {
            for &t in threads {
                // Without conflict avoidance, updates on the hottest slots
                // collapse slowly (see `smart-fig14`): 1 s unmeasured, and
                // 100 ms measured for their slow swings. Reads, and runs
                // with conflict avoidance, settle within 100 ms.
                let slow = !ca && w != Workload::C;
                let (warmup_ms, measure_ms) = if slow { (1_000, 100) } else { (100, 20) };
                let r = ht_run_with(
                    opts,
                    &HtPoint {
                        workload: w,
                        warmup_ms,
                        measure_ms,
                        machines: 1,
                        threads: t,
                        smart: true,
                        conflict_avoid: None,
                        value_size: 8,
                        hot: Default::default(),
                    },
                    |cfg| {
                        cfg.runtime.thread_aware = aware;
                        cfg.runtime.throttle = throttle;
                        cfg.runtime.conflict_avoid = ca;
                    },
                    acc,
                )?;
                let series = format!("{step} {wname}");
                let published = at(&FIG8_ARTIFACT[wi][si], t);
                acc.push(&series, t as f64, r.mops, "Mops", published);
                acc.push(
                    &format!("{series} retries"),
                    t as f64,
                    r.retries_per_op,
                    "retries/op",
                    None,
                );
            }
        }
    }
    Ok("threads (1 compute node, 8 tasks each)".into())
}

/// The pauses of SMART's artifact for Fig. 9 (`IDLE_USEC`, µs).
const FIG9_IDLE_US: [u64; 11] = [0, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192];

/// SMART's artifact, `ae/raw-reference/fig9.csv`: per pause of
/// [`FIG9_IDLE_US`], (Mops, p50 µs, p99 µs); RACE, then SMART-HT.
#[rustfmt::skip]
const FIG9_ARTIFACT: [[(f64, f64, f64); 11]; 2] = [
    [
        (5.766, 105.936, 281.874), (5.945, 67.303, 195.763), (6.337, 50.438, 167.677),
        (6.233, 26.077, 96.765), (4.688, 13.526, 48.375), (2.668, 10.997, 24.778),
        (1.414, 9.463, 19.386), (0.728, 9.955, 22.583), (0.368, 9.787, 23.381),
        (0.186, 9.880, 23.647), (0.093, 10.310, 23.874),
    ],
    [
        (15.641, 30.374, 57.353), (14.067, 18.349, 34.057), (11.604, 11.377, 31.201),
        (7.909, 12.099, 25.478), (4.804, 11.885, 21.725), (2.674, 10.104, 19.272),
        (1.411, 9.440, 18.192), (0.727, 9.523, 21.734), (0.369, 9.325, 22.592),
        (0.186, 9.409, 22.596), (0.093, 9.979, 23.027),
    ],
];

fn fig9(opts: &ReproOptions, acc: &mut Acc) -> Result<String, BenchError> {
    use crate::ycsb::Workload;
    let idles: &[u64] = if opts.quick {
        &[0, 64, 1024]
    } else {
        &FIG9_IDLE_US
    };
    // Per system and pause: (Mops, p50, p99).
    let mut got = [Vec::new(), Vec::new()];
    for (si, (label, smart)) in [("RACE", false), ("SMART-HT", true)]
        .into_iter()
        .enumerate()
    {
        for &idle in idles {
            let r = ht_run_with(
                opts,
                &HtPoint {
                    workload: Workload::C,
                    warmup_ms: 100,
                    // Long pauses leave few operations per millisecond
                    // (0.09 Mops at 8192 µs): a longer window for them.
                    measure_ms: if idle >= 1024 { 100 } else { 20 },
                    machines: 1,
                    threads: 96,
                    smart,
                    conflict_avoid: None,
                    value_size: 8,
                    hot: Default::default(),
                },
                |cfg| cfg.think = std::time::Duration::from_micros(idle),
                acc,
            )?;
            let i = FIG9_IDLE_US.iter().position(|&x| x == idle);
            let p = i.map(|i| FIG9_ARTIFACT[si][i]);
            let x = idle as f64;
            acc.push(label, x, r.mops, "Mops", p.map(|p| p.0));
            acc.push(
                &format!("{label} p50"),
                x,
                r.latency.p50_us,
                "us",
                p.map(|p| p.1),
            );
            acc.push(
                &format!("{label} p99"),
                x,
                r.latency.p99_us,
                "us",
                p.map(|p| p.2),
            );
            got[si].push((r.latency.p50_us, r.latency.p99_us, r.mops));
        }
    }
    // The text's claims (§6.2.1), over the pauses run.
    let smart = &got[1];
    let max_p50 = smart.iter().map(|g| g.0).fold(0.0, f64::max);
    acc.push("SMART-HT highest p50", 0.0, max_p50, "us", Some(30.3));
    let (min_p50, at_mops) = smart
        .iter()
        .map(|g| (g.0, g.2))
        .fold((f64::MAX, 0.0), |a, b| if b.0 < a.0 { b } else { a });
    acc.push("SMART-HT lowest p50", 0.0, min_p50, "us", Some(11.2));
    acc.push(
        "SMART-HT throughput at its lowest p50",
        0.0,
        at_mops,
        "Mops",
        Some(12.2),
    );
    let cut = |f: fn(&(f64, f64, f64)) -> f64| {
        got[0]
            .iter()
            .zip(smart)
            .map(|(r, s)| 1.0 - f(s) / f(r).max(1e-9))
            .fold(f64::MIN, f64::max)
    };
    acc.push(
        "largest p50 cut vs RACE",
        0.0,
        cut(|g| g.0),
        "share",
        Some(0.696),
    );
    acc.push(
        "largest p99 cut vs RACE",
        0.0,
        cut(|g| g.1),
        "share",
        Some(0.806),
    );
    Ok("pause of every task between operations (µs), YCSB C, 96 threads × 8 tasks".into())
}

/// SMART's artifact, `ae/raw-reference/fig13a.csv` (Mops at
/// [`ARTIFACT_THREADS`], 16 outstanding READs per thread).
#[rustfmt::skip]
const FIG13A_ARTIFACT: [[f64; 13]; 3] = [
    [2.711, 21.675, 41.469, 46.198, 40.549, 33.372, 29.052, 26.102, 24.500, 23.260, 22.976, 22.568, 20.986],
    [2.540, 20.896, 41.556, 61.022, 77.650, 89.800, 102.939, 110.900, 110.867, 107.724, 99.296, 86.581, 80.141],
    [2.493, 20.858, 39.422, 58.456, 76.234, 87.425, 98.874, 108.697, 109.876, 107.396, 109.467, 110.414, 109.516],
];

/// The batch sizes of `fig13b.csv` (96 threads).
const FIG13B_DEPTHS: [usize; 9] = [1, 4, 8, 12, 16, 20, 24, 28, 32];

/// SMART's artifact, `ae/raw-reference/fig13b.csv` (Mops at
/// [`FIG13B_DEPTHS`]).
#[rustfmt::skip]
const FIG13B_ARTIFACT: [[f64; 9]; 3] = [
    [15.848, 17.635, 18.548, 20.444, 21.355, 21.510, 22.221, 23.514, 22.808],
    [32.891, 80.753, 110.957, 104.516, 79.514, 88.815, 77.719, 66.105, 54.993],
    [32.803, 80.447, 110.500, 107.034, 108.994, 109.542, 109.516, 109.169, 109.294],
];

fn fig13(opts: &ReproOptions, acc: &mut Acc) -> Result<String, BenchError> {
    let series = [
        ("per-thread QP", QpPolicy::PerThreadQp, false),
        ("+ThdResAlloc", QpPolicy::PerThreadDoorbell, false),
        ("+WorkReqThrot", QpPolicy::PerThreadDoorbell, true),
    ];
    let point = |threads: usize, depth: usize, policy: QpPolicy, throttle: bool| {
        let mut c = SimMicroConfig::smart(opts.profile.clone(), threads, depth, policy);
        c.seed = opts.seed;
        c.throttle = throttle;
        c.candidates = Some(opts.candidates.clone());
        if throttle {
            // Past the tuner's first update phase (6 candidates × Δ), as
            // `smart-fig4a`.
            c.tuner_scale = if opts.quick { 0.125 } else { 1.0 };
            c.warmup_ns = (60_000_000.0 * c.tuner_scale) as u64;
            c.measure_ns = if opts.quick { 4_000_000 } else { 20_000_000 };
        } else if opts.quick {
            c.measure_ns = 2_000_000;
            c.warmup_ns = 500_000;
        }
        c
    };
    let threads: &[usize] = if opts.quick {
        &[8, 32, 96]
    } else {
        &ARTIFACT_THREADS
    };
    for (i, &(name, policy, throttle)) in series.iter().enumerate() {
        for &t in threads {
            let r = run(&point(t, 16, policy, throttle), acc)?;
            let published = at(&FIG13A_ARTIFACT[i], t);
            acc.push(&format!("(a) {name}"), t as f64, r.mops, "Mops", published);
        }
    }
    let depths: &[usize] = if opts.quick {
        &[1, 8, 32]
    } else {
        &FIG13B_DEPTHS
    };
    for (i, &(name, policy, throttle)) in series.iter().enumerate() {
        for &d in depths {
            let r = run(&point(96, d, policy, throttle), acc)?;
            let published = FIG13B_DEPTHS
                .iter()
                .position(|&x| x == d)
                .map(|k| FIG13B_ARTIFACT[i][k]);
            acc.push(&format!("(b) {name}"), d as f64, r.mops, "Mops", published);
        }
    }
    Ok("threads at batch 16 (a); batch size at 96 threads (b)".into())
}
