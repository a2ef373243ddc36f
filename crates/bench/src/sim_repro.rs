//! `dmkit sim reproduce NAME`: the papers' figures rerun on the simulator.
//! Each figure is a list of rows `{series, x, value, unit, published}`
//! (`published` = the paper's number where it states one), so a reader can
//! put the reproduction next to the paper line by line.
//!
//! Figures (specification: SMART ASPLOS'24):
//! - `smart-fig3a` — §3.1, Fig. 3a: 8-byte READ throughput vs threads at
//!   depth 8 under the four queue-pair policies.
//! - `smart-fig4a` — §3.2, Fig. 4a/4b and §6.3, Fig. 13b: 96 threads, depth
//!   1–32, without and with adaptive throttling; also PCIe bytes per READ.
//! - `smart-table1` — §6.3, Table 1: the active thread count changes
//!   between 36 and 96 every 32–2048 ms (batches of 64), without and with
//!   throttling. Long intervals need seconds of virtual time, so time is
//!   scaled: intervals, Δ and the stable phase all × `time_scale` (default
//!   1/8; the device's own time constants are microseconds, three orders
//!   below Δ, so the dynamics are those of the unscaled run).
//!
//! - `smart-fig7` — §6.2.1, Fig. 7: RACE (SMART's techniques off: per-thread
//!   QPs on the driver's default doorbells, no throttling, no conflict
//!   avoidance) vs SMART-HT (all on) on YCSB A, B and C (zipfian 0.99,
//!   8-byte keys and values), 2 memory nodes, 1–6 compute nodes × 96
//!   threads × 8 tasks. Lookups read both combined buckets and the block,
//!   "three RDMA READs" as in the paper (no client cache). The paper loads
//!   100 M keys; the reproduction loads 1 M,
//!   with ranks drawn over 100 M items so the hot keys keep the paper's
//!   shares (≈5 % for the hottest). Each point measures 20 ms after a
//!   warm-up long enough to reach the steady state: RACE's collapse under
//!   update contention builds up over virtual seconds (clients pile onto
//!   the hottest slots and their failing CASes lengthen the same-address
//!   atomic queue), so RACE runs 2.5 s unmeasured on A and 2 s on B; C and
//!   SMART-HT settle within the 100 ms they get.
//! - `smart-fig12` — §6.2.3, Fig. 12(d)–(f): the B+tree, Sherman+ (SMART's
//!   techniques and speculative lookup off) vs SMART-BT (all on), on 8
//!   servers each both a memory node and a compute node of 94 threads × 8
//!   tasks (quick: 2 × 4), YCSB A, B, C, 1 KiB nodes, 8-byte keys and
//!   values, 1 M keys, 10 ms measured after a warm-up of 120 ms (A), 180
//!   ms (B) or 20 ms (C): on A and B the hottest leaf's lock saturates and
//!   its queue of waiting clients needs that long to reach its steady
//!   length; full runs add Sherman+ with speculative lookup alone.
//!   Published at 8 servers: A 4.7 vs 5.2, B 32.5 vs 41.9, C 53.9 vs 159
//!   Mops.
//! - `smart-fig14` — §6.3, Fig. 14: SMART-HT with 100 % updates on one
//!   compute node, with and without conflict avoidance: throughput,
//!   retries per update and attempts per update (1 + retries: the measure
//!   behind the paper's "11.5" and "1.1", see `fig14`) vs threads, and the
//!   retry histogram as SMART's artifact records it (per thread, retries
//!   between consecutive completions), its own run's shares beside it.
//!   Measured in the steady state, as the artifact's 10 s runs are: 200 ms
//!   after 1 s without conflict avoidance (the hottest slot's collapse
//!   fills up as RACE's does in fig7, and swings slowly), 20 ms after 100
//!   ms with it.
//!
//! Specification: SMART radix tree OSDI'23:
//! - `smart-art-fig11` — §5.2, Fig. 11: the radix tree on YCSB LOAD, A, B,
//!   C, D and E with 8-byte integer keys (the caption: "YCSB workloads of
//!   integer keys"; Fig. 12 is the string-key twin, and the 2.8× and 6.1×
//!   of §5.2 are read off Fig. 11) and 8-byte values, zipfian 0.99 except
//!   LOAD and D, 2 memory nodes, 16 compute nodes, clients spread evenly
//!   (16 … 896 in the paper; here 16 × 1, 16 × 8 and 16 × 24 threads, × 4
//!   tasks), on the ConnectX-6 profile with its link at 100 Gb and its
//!   memory nodes' execution rate at the paper's stated bound of about 45
//!   M verbs/s each (the paper's testbed), beside Sherman as the paper
//!   ran it (the `btree` index with span 32, HOCL and on-chip locks, no
//!   speculative lookup).
//!   Rows: each system's throughput per client count, their ratio per
//!   client count, and the ratio of their peaks (the paper compares
//!   throughput–latency curves, i.e. each system at its best client
//!   count; its artifact even runs Sherman's A on 2 compute nodes) against
//!   the paper's 2.8× (C) and 6.1× (A). Each point runs 40 ms unmeasured
//!   (LOAD 5, A 120): the caches of internal nodes warm, and on A Sherman's
//!   hottest leaf lock saturates and its queue of waiting clients needs
//!   about 5 time constants (~8 ms each) to settle. Sherman's integer keys
//!   are fixed 8-byte tree keys (`BtreeConfig::fixed_keys`): an 832-byte
//!   span-32 leaf against Sherman's own 623 bytes (18-byte entries; ours
//!   carry an 8-byte meta word with a checksum). The paper's one absolute
//!   number is SMART's YCSB C peak, up to 96 Mops.
//! - `smart-art-fig15` — §5.3, Fig. 15: the factor analysis. From the
//!   naive tree (node locks, out-of-place leaves, no rear lock, no
//!   RDWC), each technique is switched on in turn and the workload the
//!   paper names for it is run: lock-free internal nodes on LOAD (paper
//!   1.5×), in-place leaves on B (1.5×), the rear lock on A (3.0×), read
//!   delegation on C (1.1×) and write combining on A (1.1×); rows are the
//!   throughput with and without the technique and their ratio (published
//!   ratio beside it). dmkit switches read delegation and write combining
//!   together (`--rdwc`), so both of their rows measure both. 16 compute
//!   nodes × 24 threads as in the paper (quick: 16 × 2), 4 tasks each.
//!   Every step without write combining runs the leaves under HOCL (a
//!   machine's writers queue locally and hand the held leaf lock over, at
//!   most 8 times in a row), as the paper gives Sherman's HOCL to its
//!   baselines; so the rear lock saves only the unlock of the last writer
//!   of each hand-over chain (quick runs: the "+rear lock" step 1.25×
//!   before the hand-over existed, 0.98× with it, 1.10× since a writer
//!   handed the lock starts from its predecessor's write-back instead of
//!   reading the leaf: both sides 3.63/3.57 → 4.97/5.45 Mops; the "+write
//!   combining" step 2.97× → 1.94×, paper 1.1×; see `smart-art-fig16` in
//!   module `art`). Rows carry each run's leaf-lock hand-overs per
//!   operation (and those handed through a shared local entry).
//!
//! - `smart-fig10`, `smart-fig11` — §6.2.2, Figs. 10 and 11: FORD+ vs
//!   SMART-DTX on SmallBank and TATP, described in module `txn`.
//!
//! Specification: the RDMA memory-semantics study:
//! - `memsem-fig13` — §IV-B, Fig. 13: the hash table's hot area with IO
//!   consolidation, 100 % updates of 64-byte values: throughput as the
//!   share of keys in the hot area falls from 1/4 to 1/32, and as the
//!   write-back batch θ grows, beside the table without a hot area (one
//!   compute node × 96 threads × 8 tasks, 2 memory nodes). The study gives
//!   no absolute points for it (`published` is null).
//! - `memsem-fig3|4|5|6|8|10|12|15|16|19` — the study's other figures:
//!   see module `memsem` (its runs count entries, operations or records,
//!   not verbs, in `sim_verbs_per_wall_second`).
//!
//! Specification: SwordBox, NSDI'24 submission: `swordbox-fig5`, `-fig10`,
//! `-fig11`, `-fig12`, `-fig13`, `-fig14` and `-sherman`, described in
//! [`crate::sim_repro_swordbox`].
//!
//! Throttled runs use Algorithm 1's candidate list, `C_max` ∈ {4, 6, 8,
//! 10, 12} (line 17), unless told otherwise. The runtime's default list adds
//! "unlimited"; with it, Table 1's dynamic run falls to ≈72 Mops: per-thread
//! tuners that measure while the NIC has headroom (few active threads)
//! rightly find one unlimited thread faster, keep it for the 60Δ stable
//! phase, and thrash the WQE cache together when the thread count rises
//! (`--tuner-candidates 4,6,8,10,12,unlimited` reruns that).

use serde::Serialize;

use dmkit_fabric::QpPolicy;
use dmkit_sim::Profile;

use crate::micro::BenchError;
use crate::sim_micro::{self, SimMicroConfig, ThreadSchedule};

/// One reproduced data point.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct Row {
    /// The curve the point belongs to (e.g. a queue-pair policy, or "SMART-HT
    /// a").
    pub series: String,
    /// The x coordinate, in the figure's `x_label` unit.
    pub x: f64,
    /// The reproduced value, in `unit`.
    pub value: f64,
    /// Unit of `value` and `published`: "Mops", "B/wr", "B/op", "retries/op",
    /// "us", "x" (a speed-up).
    pub unit: String,
    /// The paper's value at this point, if it states one.
    pub published: Option<f64>,
}

/// A reproduced figure.
#[derive(Debug, Clone, Serialize)]
pub struct Figure {
    /// The figure's name, e.g. `smart-fig3a`.
    pub figure: String,
    /// The device profile's name.
    pub profile: String,
    /// Seed of every run of the figure.
    pub seed: u64,
    /// Time scale applied (`smart-table1` only; 1 for the others).
    pub time_scale: f64,
    /// Candidate `C_max` values of the throttled series.
    pub tuner_candidates: Vec<u32>,
    /// Runs executed at once (each on its own OS thread, one core each).
    pub jobs: usize,
    /// Wall-clock seconds the whole figure took.
    pub wall_seconds: f64,
    /// Simulated work requests per wall-clock second over the whole figure
    /// (all jobs together).
    pub sim_verbs_per_wall_second: f64,
    /// The runs' own wall times summed: the core-seconds the figure took.
    pub core_seconds: f64,
    /// Simulated work requests per second of one core (the simulator's own
    /// speed, whatever `jobs` was).
    pub sim_verbs_per_core_second: f64,
    /// What the x coordinates are, with their unit.
    pub x_label: String,
    /// The data points, series by series.
    pub rows: Vec<Row>,
}

/// How to reproduce.
#[derive(Debug, Clone)]
pub struct ReproOptions {
    /// The device model the figure runs on.
    pub profile: Profile,
    /// Seed of every run; the same binary and seed give bit-identical rows.
    pub seed: u64,
    /// Fewer points and shorter windows (tests, smoke runs).
    pub quick: bool,
    /// Time scale of `smart-table1` (see the module docs).
    pub time_scale: f64,
    /// Candidate `C_max` values of throttled runs.
    pub candidates: Vec<u32>,
    /// Runs to execute at once, each on its own OS thread (at least 1). The
    /// rows do not depend on it: every run is its own simulation.
    pub jobs: usize,
}

/// SMART Algorithm 1, line 17.
pub const PAPER_CANDIDATES: [u32; 5] = [4, 6, 8, 10, 12];

impl Default for ReproOptions {
    fn default() -> Self {
        Self {
            profile: Profile::cx6(),
            seed: 1,
            quick: false,
            time_scale: 0.125,
            candidates: PAPER_CANDIDATES.to_vec(),
            jobs: crate::default_jobs(),
        }
    }
}

/// Figures this build reproduces.
pub const FIGURES: [&str; 43] = [
    "smart-fig3a",
    "smart-fig4a",
    "smart-table1",
    "smart-fig7",
    "smart-fig12",
    "smart-fig14",
    "smart-art-fig11",
    "smart-art-fig15",
    "memsem-fig13",
    // The memory-semantics study's other figures (module `memsem`).
    "memsem-fig3",
    "memsem-fig4",
    "memsem-fig5",
    "memsem-fig6",
    "memsem-fig8",
    "memsem-fig10",
    "memsem-fig12",
    "memsem-fig15",
    "memsem-fig16",
    "memsem-fig19",
    "swordbox-fig5",
    "swordbox-fig10",
    "swordbox-fig11",
    "swordbox-fig12",
    "swordbox-fig13",
    "swordbox-fig14",
    "swordbox-sherman",
    // SMART-DTX vs FORD+ (module `txn`).
    "smart-fig10",
    "smart-fig11",
    // SMART's and the radix tree's other figures (modules `smart`, `art`).
    "smart-fig8",
    "smart-fig9",
    "smart-fig13",
    "smart-art-fig13",
    "smart-art-fig16",
    "smart-art-fig14",
    "smart-art-fig3",
    "smart-art-fig4",
    "smart-art-fig12",
    "smart-art-fig17",
    "smart-art-fig18",
    "corm-fig9",
    "corm-fig10",
    "corm-fig12",
    "corm-fig16",
];

mod art;
mod corm;
mod memsem;
mod smart;
const _: () = assert!(memsem::FIGURES.len() == 10);
mod txn;
const _: () = assert!(txn::FIGURES.len() == 2);

/// Progress callback: `(runs done, runs total)`.
pub type Progress<'a> = &'a dyn Fn(usize, usize);

/// A run of a figure's own making: its values and the work it did
/// (requests, entries, records).
pub(crate) type ValuesRun = Box<dyn FnOnce() -> Result<(Vec<f64>, u64), BenchError> + Send>;

/// A simulation run a figure asks for.
pub(crate) enum Job {
    Micro(Box<SimMicroConfig>),
    Ycsb(Box<(dmkit_sim::SimConfig, crate::ycsb_bench::YcsbConfig)>),
    /// Any other run (modules `memsem`, `sim_repro_swordbox`): its values
    /// and the work it did.
    Values(ValuesRun),
}

/// What a [`Job`] measured.
pub(crate) enum Outcome {
    Micro(Box<sim_micro::SimMicroResult>),
    Ycsb(Box<crate::ycsb_bench::YcsbResult>),
    Values(Vec<f64>, u64),
}

impl Job {
    fn run(self) -> Result<Outcome, BenchError> {
        match self {
            Job::Micro(c) => sim_micro::run(&c).map(|r| Outcome::Micro(Box::new(r))),
            Job::Ycsb(b) => {
                let (sim, cfg) = *b;
                let platform = crate::ycsb_bench::Platform::Sim(Box::new(sim));
                crate::ycsb_bench::run(platform, &cfg, &|_| {}).map(|r| Outcome::Ycsb(Box::new(r)))
            }
            Job::Values(f) => f().map(|(v, n)| Outcome::Values(v, n)),
        }
    }
}

/// The two passes over a figure (see [`reproduce`]).
enum Pass {
    /// Collecting the runs: each answers a default result, rows are dropped.
    Plan(Vec<Job>),
    /// Pushing the rows: each run answers its result, in the planned order.
    Replay(std::vec::IntoIter<Outcome>),
}

pub(crate) struct Acc {
    rows: Vec<Row>,
    verbs: u64,
    pass: Pass,
}

impl Acc {
    pub(crate) fn push(
        &mut self,
        series: &str,
        x: f64,
        value: f64,
        unit: &str,
        published: Option<f64>,
    ) {
        self.rows.push(Row {
            series: series.into(),
            x,
            value,
            unit: unit.into(),
            published,
        });
    }

    /// A run the figure asks for: planned in the first pass (`None`: the
    /// caller answers a default result), its outcome in the second (the
    /// figure asks for the same runs in the same order), its requests
    /// counted.
    pub(crate) fn ask(&mut self, job: impl FnOnce() -> Job) -> Option<Outcome> {
        match &mut self.pass {
            Pass::Plan(jobs) => {
                jobs.push(job());
                None
            }
            Pass::Replay(done) => {
                let o = done.next().expect("the replay asks for the planned runs");
                self.verbs += match &o {
                    Outcome::Micro(r) => r.verbs,
                    Outcome::Ycsb(r) => r.sim_verbs,
                    Outcome::Values(_, n) => *n,
                };
                Some(o)
            }
        }
    }
}

/// Reproduces figure `name`.
///
/// A figure is written as plain loops that run a point and push its rows.
/// It is called twice: first to collect its runs (each run returns a
/// default result and the rows are dropped), then — once the runs have
/// executed, `opts.jobs` at a time, each its own simulation on its own OS
/// thread — to push its rows with the results, in the same order. So a
/// figure may use a result only for the values of its rows, never to
/// choose its next runs (none does; `rows_do_not_depend_on_jobs` in the
/// tests compares 1 and 2 jobs). Progress counts runs done.
pub fn reproduce(
    name: &str,
    opts: &ReproOptions,
    progress: Progress<'_>,
) -> Result<Figure, BenchError> {
    if !(opts.time_scale > 0.0 && opts.time_scale <= 1.0) {
        return Err(BenchError::Config(format!(
            "--time-scale {} must be in (0, 1]",
            opts.time_scale
        )));
    }
    if opts.jobs == 0 {
        return Err(BenchError::Config("--jobs must be at least 1".into()));
    }
    let wall = std::time::Instant::now();
    let mut acc = Acc {
        rows: Vec::new(),
        verbs: 0,
        pass: Pass::Plan(Vec::new()),
    };
    figure(name, opts, &mut acc)?;
    let Acc {
        pass: Pass::Plan(jobs),
        ..
    } = acc
    else {
        unreachable!("the first pass plans")
    };
    let (outcomes, core_seconds) = execute(jobs, opts.jobs, progress)?;
    let mut acc = Acc {
        rows: Vec::new(),
        verbs: 0,
        pass: Pass::Replay(outcomes.into_iter()),
    };
    let (x_label, time_scale) = figure(name, opts, &mut acc)?;
    let wall_seconds = wall.elapsed().as_secs_f64();
    Ok(Figure {
        figure: name.into(),
        profile: if name.starts_with("smart-art") {
            format!(
                "{}, link at 100 Gb, memory nodes at {OSDI23_MN_MOPS} M verbs/s",
                opts.profile.name
            )
        } else if name.starts_with("swordbox-") {
            // SwordBox's figures run on its testbed's device, whatever the
            // options' profile.
            crate::sim_repro_swordbox::profile_name()
        } else {
            opts.profile.name.clone()
        },
        seed: opts.seed,
        time_scale,
        tuner_candidates: opts.candidates.clone(),
        jobs: opts.jobs,
        wall_seconds,
        sim_verbs_per_wall_second: acc.verbs as f64 / wall_seconds,
        core_seconds,
        sim_verbs_per_core_second: acc.verbs as f64 / core_seconds.max(1e-9),
        x_label,
        rows: acc.rows,
    })
}

/// One pass over figure `name`: its x label and time scale.
fn figure(name: &str, opts: &ReproOptions, acc: &mut Acc) -> Result<(String, f64), BenchError> {
    Ok(match name {
        "smart-fig3a" => (fig3a(opts, acc)?, 1.0),
        "smart-fig4a" => (fig4a(opts, acc)?, 1.0),
        "smart-table1" => (table1(opts, acc)?, opts.time_scale),
        "smart-fig7" => (fig7(opts, acc)?, 1.0),
        "smart-fig12" => (fig12(opts, acc)?, 1.0),
        "smart-fig14" => (fig14(opts, acc)?, 1.0),
        "smart-art-fig11" => (art_fig11(opts, acc)?, 1.0),
        "smart-art-fig15" => (art_fig15(opts, acc)?, 1.0),
        "memsem-fig13" => (memsem_fig13(opts, acc)?, 1.0),
        n if smart::FIGURES.contains(&n) => (smart::figure(n, opts, acc)?, 1.0),
        n if art::FIGURES.contains(&n) => (art::figure(n, opts, acc)?, 1.0),
        _ if name.starts_with("memsem-") && memsem::FIGURES.contains(&name) => (
            memsem::figure(name, opts, acc).expect("a memsem figure")?,
            1.0,
        ),
        "smart-fig10" | "smart-fig11" => (
            txn::figure(name, opts, acc).expect("a txn figure")?,
            opts.time_scale,
        ),
        n if n.starts_with("swordbox-") => (crate::sim_repro_swordbox::figure(n, opts, acc)?, 1.0),
        n if corm::FIGURES.contains(&n) => {
            (corm::figure(n, opts, acc).expect("a corm figure")?, 1.0)
        }
        _ => {
            return Err(BenchError::Config(format!(
                "no figure {name:?}; this build reproduces: {}",
                FIGURES.join(", ")
            )))
        }
    })
}

/// Runs `jobs`, `threads` at a time, each on an OS thread of its own (the
/// simulator keeps a running engine in a thread-local slot, so runs on
/// different threads share nothing). Returns the outcomes in job order and
/// the runs' wall times summed; the first failed job (in job order) is the
/// error, and no job starts after one failed.
fn execute(
    jobs: Vec<Job>,
    threads: usize,
    progress: Progress<'_>,
) -> Result<(Vec<Outcome>, f64), BenchError> {
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::{mpsc, Mutex};
    let total = jobs.len();
    let queue = Mutex::new(jobs.into_iter().enumerate());
    let failed = AtomicBool::new(false);
    let mut results: Vec<Option<Result<Outcome, BenchError>>> = (0..total).map(|_| None).collect();
    let mut core_seconds = 0.0;
    std::thread::scope(|s| {
        let (tx, rx) = mpsc::channel();
        for w in 0..threads.min(total) {
            let (tx, queue, failed) = (tx.clone(), &queue, &failed);
            crate::sim_thread(format!("repro-{w}"))
                .spawn_scoped(s, move || loop {
                    if failed.load(Ordering::Relaxed) {
                        break;
                    }
                    let next = queue.lock().unwrap_or_else(|p| p.into_inner()).next();
                    let Some((i, job)) = next else { break };
                    let t0 = std::time::Instant::now();
                    let r = job.run();
                    if r.is_err() {
                        failed.store(true, Ordering::Relaxed);
                    }
                    if tx.send((i, r, t0.elapsed().as_secs_f64())).is_err() {
                        break;
                    }
                })
                .expect("spawning a run thread");
        }
        drop(tx);
        // Ends when every worker has finished (or panicked: the scope then
        // re-raises its panic).
        for (done, (i, r, secs)) in rx.into_iter().enumerate() {
            results[i] = Some(r);
            core_seconds += secs;
            progress(done + 1, total);
        }
    });
    let mut outcomes = Vec::with_capacity(total);
    for r in results {
        match r {
            Some(Ok(o)) => outcomes.push(o),
            Some(Err(e)) => return Err(e),
            // Jobs start in order, so a job that never started comes after
            // the failed one that stopped the others, returned above.
            None => unreachable!("a job that did not start follows a failed one"),
        }
    }
    Ok((outcomes, core_seconds))
}

fn run(cfg: &SimMicroConfig, acc: &mut Acc) -> Result<sim_micro::SimMicroResult, BenchError> {
    match acc.ask(|| Job::Micro(Box::new(cfg.clone()))) {
        None => Ok(Default::default()),
        Some(Outcome::Micro(r)) => Ok(*r),
        Some(_) => unreachable!("the replay asks for the planned runs"),
    }
}

fn fig3a(opts: &ReproOptions, acc: &mut Acc) -> Result<String, BenchError> {
    let threads: &[usize] = if opts.quick {
        &[8, 32, 96]
    } else {
        &[1, 8, 16, 24, 32, 40, 48, 56, 64, 72, 80, 88, 96]
    };
    let policies = [
        QpPolicy::Shared,
        QpPolicy::Multiplexed(4),
        QpPolicy::PerThreadQp,
        QpPolicy::PerThreadDoorbell,
    ];
    for policy in policies {
        for &t in threads {
            let mut c = SimMicroConfig::smart(opts.profile.clone(), t, 8, policy);
            c.seed = opts.seed;
            if opts.quick {
                c.measure_ns = 2_000_000;
                c.warmup_ns = 500_000;
            }
            let r = run(&c, acc)?;
            let published = match (policy, t) {
                (QpPolicy::PerThreadDoorbell, 96) => Some(111.0),
                (QpPolicy::PerThreadQp, 32) => Some(39.0),
                (QpPolicy::PerThreadQp, 96) => Some(19.0),
                _ => None,
            };
            acc.push(&policy.to_string(), t as f64, r.mops, "Mops", published);
        }
    }
    Ok("threads".into())
}

fn fig4a(opts: &ReproOptions, acc: &mut Acc) -> Result<String, BenchError> {
    let depths: &[usize] = if opts.quick {
        &[1, 8, 32]
    } else {
        &[1, 2, 4, 8, 16, 32]
    };
    for throttle in [false, true] {
        for &d in depths {
            let mut c =
                SimMicroConfig::smart(opts.profile.clone(), 96, d, QpPolicy::PerThreadDoorbell);
            c.seed = opts.seed;
            c.throttle = throttle;
            c.candidates = Some(opts.candidates.clone());
            if throttle {
                // Past the tuner's first update phase (6 candidates × Δ).
                c.tuner_scale = if opts.quick { 0.125 } else { 1.0 };
                c.warmup_ns = (60_000_000.0 * c.tuner_scale) as u64;
                c.measure_ns = if opts.quick { 4_000_000 } else { 20_000_000 };
            } else if opts.quick {
                c.measure_ns = 2_000_000;
                c.warmup_ns = 500_000;
            }
            let r = run(&c, acc)?;
            let series = if throttle { "throttle" } else { "no-throttle" };
            let published = match (throttle, d) {
                (false, 1) => Some(33.0),
                (false, 4) => Some(81.6),
                (false, 8) => Some(111.0),
                (false, 16) => Some(78.1),
                (false, 32) => Some(55.2),
                (true, d) if d >= 8 => Some(109.0),
                _ => None,
            };
            acc.push(series, d as f64, r.mops, "Mops", published);
            let bytes_published = match (throttle, d) {
                (false, 8) => Some(93.0),
                (false, 32) => Some(180.0),
                _ => None,
            };
            acc.push(
                &format!("{series} pcie"),
                d as f64,
                r.pcie_bytes_per_wr,
                "B/wr",
                bytes_published,
            );
        }
    }
    Ok("depth (outstanding READs per thread)".into())
}

fn table1(opts: &ReproOptions, acc: &mut Acc) -> Result<String, BenchError> {
    const PUBLISHED: [(u64, f64, f64); 7] = [
        (32, 79.3, 97.8),
        (64, 79.2, 95.1),
        (128, 77.9, 99.7),
        (256, 74.7, 101.0),
        (512, 73.8, 105.8),
        (1024, 71.8, 109.3),
        (2048, 65.7, 109.6),
    ];
    let rows: &[(u64, f64, f64)] = if opts.quick {
        &PUBLISHED[..2]
    } else {
        &PUBLISHED
    };
    for throttle in [false, true] {
        for &(interval_ms, without, with) in rows {
            let interval_ns = (interval_ms as f64 * 1e6 * opts.time_scale) as u64;
            // Enough intervals for the average to mean something: at least
            // four, and at least 512 ms (scaled) of changes.
            let intervals = (512 / interval_ms).max(4);
            let mut c =
                SimMicroConfig::smart(opts.profile.clone(), 96, 64, QpPolicy::PerThreadDoorbell);
            c.seed = opts.seed;
            c.throttle = throttle;
            c.candidates = Some(opts.candidates.clone());
            c.tuner_scale = opts.time_scale;
            c.warmup_ns = 0;
            c.measure_ns = interval_ns * intervals;
            c.schedule = Some(ThreadSchedule {
                interval_ns,
                min: 36,
                max: 96,
            });
            let r = run(&c, acc)?;
            let series = if throttle { "throttle" } else { "no-throttle" };
            acc.push(
                series,
                interval_ms as f64,
                r.mops,
                "Mops",
                Some(if throttle { with } else { without }),
            );
        }
    }
    Ok("interval between thread-count changes (ms, unscaled)".into())
}

/// The memory-semantics study §IV-B, Fig. 13: the hash table's hot area
/// under 100 % updates of 64-byte values (zipfian 0.99), (a) as the share
/// of keys in the hot area falls from 1/4 to 1/32 (θ = 16), and (b) as the
/// write-back batch θ grows (1/16 of the keys hot); each beside the table
/// without a hot area. One compute node of 96 threads × 8 tasks, 2 memory
/// nodes, SMART's techniques on. The study gives no absolute points for
/// this figure (only that (a) loses about 6 Mops from 1/4 to 1/32):
/// `published` is null.
fn memsem_fig13(opts: &ReproOptions, acc: &mut Acc) -> Result<String, BenchError> {
    use crate::ycsb::Workload;
    let threads = if opts.quick { 8 } else { 96 };
    let keys = if opts.quick { 20_000 } else { 1_000_000 };
    let shares: &[u64] = &[4, 8, 16, 32];
    let thetas: &[u32] = if opts.quick {
        &[1, 64]
    } else {
        &[1, 4, 16, 64]
    };
    let run = |hot: HotArea, acc: &mut Acc| {
        ht_run(
            opts,
            &HtPoint {
                workload: Workload::U,
                warmup_ms: 30,
                measure_ms: 20,
                machines: 1,
                threads,
                smart: true,
                conflict_avoid: None,
                value_size: 64,
                hot,
            },
            acc,
        )
    };
    let base = run(HotArea::default(), acc)?;
    acc.push("no hot area", 0.0, base.mops, "Mops", None);
    for &d in shares {
        let hot = HotArea {
            keys: (keys / d) as usize,
            theta: 16,
        };
        let r = run(hot, acc)?;
        acc.push("(a) hot share 1/x", d as f64, r.mops, "Mops", None);
    }
    for &theta in thetas {
        let hot = HotArea {
            keys: (keys / 16) as usize,
            theta,
        };
        let r = run(hot, acc)?;
        acc.push("(b) write-back after θ", theta as f64, r.mops, "Mops", None);
        acc.push(
            "(b) bytes written",
            theta as f64,
            r.bytes_written_per_op,
            "B/op",
            None,
        );
    }
    Ok("x: 1/share of keys hot (a), θ (b); 0 = no hot area".into())
}

/// A YCSB run of RACE on the simulator.
struct HtPoint {
    workload: crate::ycsb::Workload,
    /// Unmeasured run before the measured window (ms; quick runs use a tenth).
    warmup_ms: u64,
    /// The measured window (ms; quick runs measure 2).
    measure_ms: u64,
    machines: usize,
    threads: usize,
    /// SMART's three techniques on or off.
    smart: bool,
    /// Conflict avoidance alone (overrides `smart` for it).
    conflict_avoid: Option<bool>,
    value_size: usize,
    /// The hash table's hot area (off by default).
    hot: HotArea,
}

/// The hash table's hot area in a figure's run: its keys (0: none) and θ;
/// blocks and holds as the table's defaults.
#[derive(Clone, Copy)]
struct HotArea {
    keys: usize,
    theta: u32,
}

impl Default for HotArea {
    fn default() -> Self {
        Self {
            keys: 0,
            theta: dmkit_race::RaceConfig::default().hot_theta,
        }
    }
}

fn ht_run(
    opts: &ReproOptions,
    p: &HtPoint,
    acc: &mut Acc,
) -> Result<crate::ycsb_bench::YcsbResult, BenchError> {
    ht_run_with(opts, p, |_| {}, acc)
}

/// [`ht_run`] with the run's configuration adjusted by `tweak` last (a
/// figure that switches SMART's techniques one by one).
fn ht_run_with(
    opts: &ReproOptions,
    p: &HtPoint,
    tweak: impl FnOnce(&mut crate::ycsb_bench::YcsbConfig),
    acc: &mut Acc,
) -> Result<crate::ycsb_bench::YcsbResult, BenchError> {
    use crate::ycsb::KeyType;
    use crate::ycsb_bench::{IndexKind, YcsbConfig};
    let mut runtime = dmkit_runtime::RuntimeConfig {
        thread_aware: p.smart,
        throttle: p.smart,
        conflict_avoid: p.conflict_avoid.unwrap_or(p.smart),
        seed: opts.seed,
        ..Default::default()
    };
    runtime.tuner.candidates = opts.candidates.clone();
    let mut cfg = YcsbConfig {
        index: IndexKind::Race,
        workload: p.workload,
        keys: if opts.quick { 20_000 } else { 1_000_000 },
        threads: p.threads,
        machines: p.machines,
        coros: 8,
        theta: 0.99,
        distribution: None,
        // SMART loads 100 M keys: its hottest key takes ≈5 % of a zipfian
        // 0.99 stream. Fewer keys are loaded here, with the same shares.
        zipf_items: Some(100_000_000),
        key_type: KeyType::Int,
        value_size: p.value_size,
        duration: std::time::Duration::from_millis(if opts.quick { 2 } else { p.measure_ms }),
        warmup: std::time::Duration::from_millis(if opts.quick {
            (p.warmup_ms / 10).min(10)
        } else {
            p.warmup_ms
        }),
        think: std::time::Duration::ZERO,
        seed: opts.seed,
        runtime,
        hot_keys: p.hot.keys,
        race: dmkit_race::RaceConfig {
            cache_entries: 0,
            hot_theta: p.hot.theta,
            ..Default::default()
        },
        art: Default::default(),
        btree: Default::default(),
        clover: Default::default(),
    };
    tweak(&mut cfg);
    sim_ycsb(opts, opts.profile.clone(), &cfg, SPLIT, acc)
}

/// Where the memory nodes of a simulated YCSB run are.
#[derive(Clone, Copy)]
pub(crate) struct MemoryShape {
    pub(crate) nodes: usize,
    /// Memory node `i` on compute machine `i` (Sherman's setup).
    pub(crate) colocated: bool,
}

/// Two memory nodes of their own (SMART-HT's and the radix tree's setup).
const SPLIT: MemoryShape = MemoryShape {
    nodes: 2,
    colocated: false,
};

/// Runs YCSB run `cfg` on the simulator: `cfg.machines` compute machines
/// on `profile`, memory nodes as `mem` says, sized for the index, 2 MiB
/// pages.
pub(crate) fn sim_ycsb(
    opts: &ReproOptions,
    profile: Profile,
    cfg: &crate::ycsb_bench::YcsbConfig,
    mem: MemoryShape,
    acc: &mut Acc,
) -> Result<crate::ycsb_bench::YcsbResult, BenchError> {
    let needed = crate::ycsb_bench::memory_estimate(cfg);
    let sim = dmkit_sim::SimConfig {
        profile,
        compute_machines: cfg.machines,
        memory_nodes: mem.nodes,
        colocated: mem.colocated,
        memory_bytes: needed / mem.nodes as u64 + (64 << 20),
        page_size: 2 << 20,
        seed: opts.seed,
        ..Default::default()
    };
    match acc.ask(|| Job::Ycsb(Box::new((sim, cfg.clone())))) {
        None => Ok(Default::default()),
        Some(Outcome::Ycsb(r)) => Ok(*r),
        Some(_) => unreachable!("the replay asks for the planned runs"),
    }
}

/// A YCSB run of a figure in module `memsem` on the cluster `sim`.
fn ycsb_outcome(
    acc: &mut Acc,
    sim: dmkit_sim::SimConfig,
    cfg: crate::ycsb_bench::YcsbConfig,
) -> crate::ycsb_bench::YcsbResult {
    match acc.ask(|| Job::Ycsb(Box::new((sim, cfg)))) {
        None => Default::default(),
        Some(Outcome::Ycsb(r)) => *r,
        Some(_) => unreachable!("the replay asks for the planned runs"),
    }
}

fn fig7(opts: &ReproOptions, acc: &mut Acc) -> Result<String, BenchError> {
    use crate::ycsb::Workload;
    let machines: &[usize] = if opts.quick { &[6] } else { &[1, 3, 6] };
    // Published points per compute-node count 1..=6, from SMART's artifact
    // (`ae/raw-reference/fig7-ycsb-{a,b,c}.csv`). The bar quotes
    // RACE's A and B at one compute node (0.2, 5.1) and everything else at
    // six; at six, RACE's A and B are 0.054 and 0.714.
    type Series = [f64; 6];
    let workloads: [(Workload, &str, Series, Series); 3] = [
        (
            Workload::A,
            "a",
            [0.195, 0.123, 0.080, 0.068, 0.059, 0.054],
            [4.972, 5.573, 5.584, 5.669, 5.682, 5.696],
        ),
        (
            Workload::B,
            "b",
            [5.055, 1.792, 1.073, 0.916, 0.790, 0.714],
            [20.265, 32.047, 35.034, 35.912, 36.852, 37.051],
        ),
        (
            Workload::C,
            "c",
            [6.943, 13.346, 20.123, 26.840, 33.355, 41.071],
            [23.506, 44.946, 64.639, 72.612, 73.751, 75.051],
        ),
    ];
    for (w, name, race, smart) in workloads {
        for on in [false, true] {
            for &m in machines {
                // RACE's collapse under update contention is a closed loop
                // filling up: each client stuck retrying CASes on a hot slot
                // lengthens the same-address atomic queue, which makes the
                // next success rarer and strands more clients. It takes
                // virtual seconds to settle: RACE A at 6 compute nodes
                // measured 0.26 / 0.14 / 0.070 / 0.049 Mops after 0.1 / 0.3
                // / 1 / 2.5 s (artifact: 0.054), B 3.2 → 0.80 after 0.1 → 1 s
                // (0.714), with `atomic_ns` at 330 then and before
                // `atomic_stalls_access`. SMART-HT (conflict
                // avoidance) and reads settle within 100 ms.
                let warmup_ms = match (on, name) {
                    (false, "a") => 2_500,
                    (false, "b") => 2_000,
                    _ => 100,
                };
                let r = ht_run(
                    opts,
                    &HtPoint {
                        workload: w,
                        warmup_ms,
                        measure_ms: 20,
                        machines: m,
                        threads: 96,
                        smart: on,
                        conflict_avoid: None,
                        value_size: 8,
                        hot: Default::default(),
                    },
                    acc,
                )?;
                let series = format!("{} {name}", if on { "SMART-HT" } else { "RACE" });
                let published = Some(if on { smart[m - 1] } else { race[m - 1] });
                acc.push(&series, m as f64, r.mops, "Mops", published);
                acc.push(
                    &format!("{series} retries"),
                    m as f64,
                    r.retries_per_op,
                    "retries/op",
                    None,
                );
            }
        }
    }
    Ok("compute nodes (96 threads × 8 tasks each)".into())
}

/// One YCSB run of the radix tree on the simulator: 16 compute nodes × `t`
/// threads × 4 tasks, 2 memory nodes, the profile's link at 100 Gb,
/// integer keys (the factor analysis's `randint`).
fn art_run(
    opts: &ReproOptions,
    w: crate::ycsb::Workload,
    t: usize,
    art: dmkit_art::ArtConfig,
    acc: &mut Acc,
) -> Result<crate::ycsb_bench::YcsbResult, BenchError> {
    use crate::ycsb::KeyType;
    tree_run(opts, TreeIndex::Art(art), w, t, KeyType::Int, acc)
}

/// Memory-side IOPS bound of the radix-tree paper's testbed (M verbs/s per
/// memory node; see `tree_run`).
const OSDI23_MN_MOPS: f64 = 45.0;

/// The ordered index of a radix-tree-paper run.
#[derive(Clone)]
enum TreeIndex {
    Art(dmkit_art::ArtConfig),
    Btree(dmkit_btree::BtreeConfig),
}

/// [`art_run`] for either tree and a key type. Both trees run as the
/// radix-tree paper ran them: thread-aware queue pairs (each client its
/// own), but without the SMART framework's work-request throttling and
/// conflict avoidance, which came a year later (ASPLOS'24) and are in
/// neither the radix tree's nor Sherman's code.
fn tree_run(
    opts: &ReproOptions,
    index: TreeIndex,
    w: crate::ycsb::Workload,
    t: usize,
    key_type: crate::ycsb::KeyType,
    acc: &mut Acc,
) -> Result<crate::ycsb_bench::YcsbResult, BenchError> {
    tree_run_with(opts, index, w, t, key_type, |_| {}, acc)
}

/// [`tree_run`] with the run's configuration adjusted by `tweak` last
/// (value size, skew, compute nodes; never the device).
fn tree_run_with(
    opts: &ReproOptions,
    index: TreeIndex,
    w: crate::ycsb::Workload,
    t: usize,
    key_type: crate::ycsb::KeyType,
    tweak: impl FnOnce(&mut crate::ycsb_bench::YcsbConfig),
    acc: &mut Acc,
) -> Result<crate::ycsb_bench::YcsbResult, BenchError> {
    use crate::ycsb_bench::{IndexKind, YcsbConfig};
    let (kind, art, btree) = match index {
        TreeIndex::Art(a) => (IndexKind::Art, a, Default::default()),
        TreeIndex::Btree(b) => (IndexKind::Btree, Default::default(), b),
    };
    let mut profile = opts.profile.clone();
    profile.link.gbps = 100.0;
    // The radix-tree paper's memory nodes execute at most about 45 M
    // verbs/s each: "the throughput of ART reaches about 45 Mops/s, which
    // is the IOPS upper bound of the RNIC we use" (OSDI'23 §3, Observation
    // 1) and "about 90 Mops in total with the two MNs" (§5.2). The
    // ConnectX-6 profile's responders, calibrated on SMART's ASPLOS'24
    // testbed, take 160 (its SMART-HT C runs 3-READ lookups at 75 Mops on
    // two memory nodes).
    profile.responder.iops = profile.responder.iops.min(OSDI23_MN_MOPS);
    let machines = 16;
    let mut runtime = dmkit_runtime::RuntimeConfig {
        seed: opts.seed,
        throttle: false,
        conflict_avoid: false,
        ..Default::default()
    };
    runtime.tuner.candidates = opts.candidates.clone();
    let mut cfg = YcsbConfig {
        index: kind,
        workload: w,
        keys: if opts.quick { 20_000 } else { 1_000_000 },
        threads: t,
        machines,
        coros: 4,
        theta: 0.99,
        distribution: None,
        zipf_items: Some(100_000_000),
        key_type,
        value_size: 8,
        duration: std::time::Duration::from_millis(if opts.quick { 1 } else { 10 }),
        // 40 ms unmeasured: the caches of internal nodes warm (the paper's
        // runs are 60 M operations long; after 5 ms the radix tree's hit
        // rate on C was 77 % and a search took 1.37 round trips, after 40
        // ms 91 % and 1.12), and on A a saturated hot lock's queue of
        // clients settles (see `smart-art-fig11` in the module docs).
        warmup: std::time::Duration::from_millis(match (opts.quick, w) {
            (true, _) => 1,
            (false, crate::ycsb::Workload::Load) => 5,
            // A is the slowest to warm: at 16 × 24 × 4 clients the radix
            // tree's search hit rate was 81 % after 40 ms and 93 % after
            // 120 ms, and every miss reads internal nodes from memory
            // nodes that A already keeps near their IOPS bound.
            (false, crate::ycsb::Workload::A) => 120,
            (false, _) => 40,
        }),
        think: std::time::Duration::ZERO,
        seed: opts.seed,
        runtime,
        hot_keys: 0,
        race: dmkit_race::RaceConfig {
            cache_entries: 0,
            ..Default::default()
        },
        art,
        btree,
        clover: Default::default(),
    };
    tweak(&mut cfg);
    sim_ycsb(opts, profile, &cfg, SPLIT, acc)
}

fn art_fig15(opts: &ReproOptions, acc: &mut Acc) -> Result<String, BenchError> {
    use crate::ycsb::Workload;
    use dmkit_art::ArtConfig;
    let t = if opts.quick { 2 } else { 24 };
    let naive = ArtConfig {
        cache_bytes: 64 << 20,
        in_place: false,
        rear_lock: false,
        read_delegation: false,
        write_combining: false,
        lock_free_internal: false,
        ..ArtConfig::default()
    };
    let lock_free = ArtConfig {
        lock_free_internal: true,
        ..naive.clone()
    };
    let in_place = ArtConfig {
        in_place: true,
        ..lock_free.clone()
    };
    let rear = ArtConfig {
        rear_lock: true,
        ..in_place.clone()
    };
    let rdwc = ArtConfig {
        read_delegation: true,
        write_combining: true,
        ..rear.clone()
    };
    let steps = [
        (
            "+lock-free internal (load)",
            Workload::Load,
            naive,
            lock_free.clone(),
            1.5,
        ),
        (
            "+in-place leaf (b)",
            Workload::B,
            lock_free.clone(),
            in_place.clone(),
            1.5,
        ),
        ("+rear lock (a)", Workload::A, in_place, rear.clone(), 3.0),
        (
            "+read delegation (c)",
            Workload::C,
            rear.clone(),
            rdwc.clone(),
            1.1,
        ),
        ("+write combining (a)", Workload::A, rear, rdwc, 1.1),
    ];
    for (i, (name, w, before, after, published)) in steps.into_iter().enumerate() {
        let b = art_run(opts, w, t, before, acc)?;
        let a = art_run(opts, w, t, after, acc)?;
        let x = (i + 1) as f64;
        acc.push(&format!("{name} without"), x, b.mops, "Mops", None);
        acc.push(&format!("{name} with"), x, a.mops, "Mops", None);
        art::push_handovers(acc, &format!("{name} without"), x, &b);
        art::push_handovers(acc, &format!("{name} with"), x, &a);
        acc.push(
            &format!("{name} speed-up"),
            x,
            a.mops / b.mops.max(1e-9),
            "x",
            Some(published),
        );
    }
    Ok("technique added (16 compute nodes)".into())
}

fn art_fig11(opts: &ReproOptions, acc: &mut Acc) -> Result<String, BenchError> {
    use crate::ycsb::Workload;
    let machines = 16;
    let threads: &[usize] = if opts.quick { &[1] } else { &[1, 8, 24] };
    let workloads = [
        (Workload::Load, "load"),
        (Workload::A, "a"),
        (Workload::B, "b"),
        (Workload::C, "c"),
        (Workload::D, "d"),
        (Workload::E, "e"),
    ];
    // Sherman as the radix-tree paper ran it (§5.1): span 32, locks in
    // on-chip memory, HOCL; no speculative lookup (that is SMART-BT's).
    let sherman = dmkit_btree::BtreeConfig {
        speculative: false,
        span: Some(32),
        ..Default::default()
    };
    let top = *threads.last().expect("thread counts");
    for (w, name) in workloads {
        let mut peak = [0.0f64; 2];
        for &t in threads {
            let clients = (machines * t) as f64;
            let mut mops = [0.0; 2];
            for (i, (label, index)) in [
                ("art", TreeIndex::Art(Default::default())),
                ("sherman", TreeIndex::Btree(sherman.clone())),
            ]
            .into_iter()
            .enumerate()
            {
                let r = tree_run(opts, index, w, t, crate::ycsb::KeyType::Int, acc)?;
                mops[i] = r.mops;
                peak[i] = peak[i].max(r.mops);
                acc.push(&format!("{label} {name}"), clients, r.mops, "Mops", None);
                acc.push(
                    &format!("{label} {name} p99"),
                    clients,
                    r.latency.p99_us,
                    "us",
                    None,
                );
                acc.push(
                    &format!("{label} {name} round trips"),
                    clients,
                    r.round_trips_per_op,
                    "rt/op",
                    None,
                );
                acc.push(
                    &format!("{label} {name} bytes read"),
                    clients,
                    r.bytes_read_per_op,
                    "B/op",
                    None,
                );
            }
            acc.push(
                &format!("art over sherman {name}"),
                clients,
                mops[0] / mops[1].max(1e-9),
                "x",
                None,
            );
        }
        // §5.2: SMART over Sherman, 2.8× on C and 6.1× on A, peak to peak.
        let published = match name {
            "c" => Some(2.8),
            "a" => Some(6.1),
            _ => None,
        };
        acc.push(
            &format!("art over sherman {name} (peaks)"),
            (machines * top) as f64,
            peak[0] / peak[1].max(1e-9),
            "x",
            published,
        );
    }
    Ok("client threads (16 compute nodes, × 4 tasks each)".into())
}

/// SMART §6.2.3, Figure 12(d)–(f): Sherman+ (SMART's techniques and
/// speculative lookup off) against SMART-BT (on) on 8 servers that are
/// each a memory node and a compute node of 94 threads × 8 tasks, 1 KiB
/// nodes, 8-byte keys and values. Full runs add Sherman+ with speculative
/// lookup alone.
fn fig12(opts: &ReproOptions, acc: &mut Acc) -> Result<String, BenchError> {
    use crate::ycsb::{KeyType, Workload};
    use crate::ycsb_bench::{IndexKind, YcsbConfig};
    let (machines, threads) = if opts.quick { (2, 4) } else { (8, 94) };
    // Warm-up per workload (ms). Under YCSB's skew the hottest leaf's lock
    // is saturated on A and B, and in a closed loop its queue fills until
    // the throughput times the hot key's share of writes equals the lock's
    // rate; only then is the run at the steady state the paper's 30 s
    // epochs measure. The queue fills with a time constant of (clients /
    // unthrottled throughput) / (the hot leaf's share of operations): about
    // 30 ms on A (6,016 clients, ~8 Mops, 2.4 %) and 40 ms on B (~68 Mops,
    // 0.24 %), so the warm-ups are 4–5 of those. With 20 ms, A and B
    // measured the filling queue and came out 1.5–1.6× too fast.
    let workloads = [
        (Workload::A, "a", 4.7, 5.2, 120),
        (Workload::B, "b", 32.5, 41.9, 180),
        (Workload::C, "c", 53.9, 159.0, 20),
    ];
    let mut series: Vec<(&str, bool, bool)> = vec![("Sherman+", false, false)];
    if !opts.quick {
        series.push(("Sherman+ w/ SL", false, true));
    }
    series.push(("SMART-BT", true, true));
    for (w, name, sherman, smart_bt, warmup_ms) in workloads {
        for &(label, smart, spec) in &series {
            let mut runtime = dmkit_runtime::RuntimeConfig {
                thread_aware: smart,
                throttle: smart,
                conflict_avoid: smart,
                seed: opts.seed,
                ..Default::default()
            };
            runtime.tuner.candidates = opts.candidates.clone();
            let cfg = YcsbConfig {
                index: IndexKind::Btree,
                workload: w,
                keys: if opts.quick { 20_000 } else { 1_000_000 },
                threads,
                machines,
                coros: 8,
                theta: 0.99,
                distribution: None,
                zipf_items: Some(100_000_000),
                key_type: KeyType::Int,
                value_size: 8,
                duration: std::time::Duration::from_millis(if opts.quick { 1 } else { 10 }),
                warmup: std::time::Duration::from_millis(if opts.quick { 1 } else { warmup_ms }),
                think: std::time::Duration::ZERO,
                seed: opts.seed,
                runtime,
                hot_keys: 0,
                race: dmkit_race::RaceConfig {
                    cache_entries: 0,
                    ..Default::default()
                },
                art: Default::default(),
                // As the artifact's B+tree (madsys-dev/smart btree.cpp):
                // lock, read, write and unlock each a synchronous round
                // trip; up to 8 local hand-overs (kMaxHandOverDepth).
                btree: dmkit_btree::BtreeConfig {
                    speculative: spec,
                    combine: false,
                    max_handover: 8,
                    ..Default::default()
                },
                clover: Default::default(),
            };
            let mem = MemoryShape {
                nodes: machines,
                colocated: true,
            };
            let r = sim_ycsb(opts, opts.profile.clone(), &cfg, mem, acc)?;
            let published = match label {
                "Sherman+" => Some(sherman),
                "SMART-BT" => Some(smart_bt),
                _ => None,
            };
            let x = machines as f64;
            acc.push(&format!("{label} {name}"), x, r.mops, "Mops", published);
            acc.push(
                &format!("{label} {name} bytes read"),
                x,
                r.bytes_read_per_op,
                "B/op",
                None,
            );
            acc.push(
                &format!("{label} {name} round trips"),
                x,
                r.round_trips_per_op,
                "rt/op",
                None,
            );
        }
    }
    Ok(format!(
        "servers (each a memory node and {threads} threads × 8 tasks)"
    ))
}

fn fig14(opts: &ReproOptions, acc: &mut Acc) -> Result<String, BenchError> {
    use crate::ycsb::Workload;
    let threads: &[usize] = if opts.quick {
        &[16, 96]
    } else {
        &[8, 16, 32, 48, 64, 96]
    };
    for ca in [false, true] {
        for &t in threads {
            // Without conflict avoidance the hottest slot's collapse fills
            // up over virtual time, as in fig7's RACE runs: at 96 threads
            // 15.5 / 17.3 / 20.5 / 19.0 attempts per update after 0.05 /
            // 0.15 / 0.4 / 1 s, and 19.0 again after 1.5 s (the first two
            // in the figure's setup, the rest from `bench ycsb` with the
            // same switches and 4 KiB pages). SMART's artifact averages
            // 10 s from a calm start, i.e. the steady state. With conflict
            // avoidance it settles within 50 ms (1.31 attempts after 0.05
            // and after 1 s). (Those before `atomic_stalls_access`; with
            // it, 16.7 / 15.0 / 16.6 attempts in 20 ms windows after 0.4 /
            // 1 / 2 s, `bench ycsb`, 2 MiB pages.) Without conflict
            // avoidance a 20 ms window is too short for the hot slots'
            // slow swings, so it measures 200 ms.
            let warmup_ms = if ca { 100 } else { 1_000 };
            let measure_ms = if ca { 20 } else { 200 };
            let r = ht_run(
                opts,
                &HtPoint {
                    workload: Workload::U,
                    warmup_ms,
                    measure_ms,
                    machines: 1,
                    threads: t,
                    smart: true,
                    conflict_avoid: Some(ca),
                    value_size: 8,
                    hot: Default::default(),
                },
                acc,
            )?;
            let series = if ca {
                "conflict-avoid"
            } else {
                "no-conflict-avoid"
            };
            // §6.3's "average number of retries ... 11.5 per update, while
            // SMART-HT is only 1.1" is what SMART's artifact prints as
            // "#average retries": `retry_sum / total_ops + 1.0`
            // (`include/smart/benchmark.h`, `dump_result`), i.e. attempts
            // per update — its 1-thread runs report 1.017–1.020 with
            // 98 % of updates never retrying (`ae/raw-reference/
            // fig14bc.csv`). So the published numbers sit on an attempts
            // row (1 + retries); the retries row has none.
            let published = (t == 96).then_some(if ca { 1.1 } else { 11.5 });
            // Throughput at 96 threads from SMART's artifact
            // (`ae/raw-reference/fig14.csv`: w/o ConflictAvoid, +CoroThrot).
            let mops_published = (t == 96).then_some(if ca { 2.663 } else { 0.176 });
            acc.push(series, t as f64, r.mops, "Mops", mops_published);
            acc.push(
                &format!("{series} retries"),
                t as f64,
                r.retries_per_op,
                "retries/op",
                None,
            );
            acc.push(
                &format!("{series} attempts"),
                t as f64,
                1.0 + r.retries_per_op,
                "attempts/op",
                published,
            );
            // How unevenly the hot slot serves its clients (no published
            // counterpart): tasks that completed nothing in the window,
            // and Jain's index over the threads' completions.
            acc.push(
                &format!("{series} idle tasks"),
                t as f64,
                r.idle_task_share,
                "share of tasks",
                None,
            );
            acc.push(
                &format!("{series} thread fairness"),
                t as f64,
                r.thread_fairness,
                "Jain index",
                None,
            );
            // The retry histogram as the artifact fills it (see
            // `YcsbResult::retry_histogram_thread`), beside its own run.
            let artifact = FIG14_ARTIFACT_HIST
                .iter()
                .find(|(c, n, _)| *c == ca && *n == t)
                .map(|(_, _, h)| h);
            for (k, &share) in r.retry_histogram_thread.iter().enumerate() {
                let bucket = if k + 1 == r.retry_histogram_thread.len() {
                    format!("{k}+")
                } else {
                    k.to_string()
                };
                acc.push(
                    &format!("{series} retried {bucket}"),
                    t as f64,
                    share,
                    "share of completions",
                    // (A share the artifact rounds to 0.000 has no ratio.)
                    artifact
                        .and_then(|h| h.get(k).copied())
                        .filter(|&p| p > 0.0),
                );
            }
        }
    }
    Ok("threads (8 tasks each; 100 % updates)".into())
}

/// SMART's artifact's retry histograms for Fig. 14 (`ae/raw-reference/
/// fig14bc.csv`: conflict avoidance off, and on with coroutine throttling):
/// per thread count, the share of completions after 0, 1, …, 7 and 8 or
/// more retries of their thread (`RecordOps` in `include/smart/thread.h`).
#[rustfmt::skip]
const FIG14_ARTIFACT_HIST: [(bool, usize, [f64; 9]); 10] = [
    (false, 16, [0.652, 0.224, 0.079, 0.023, 0.009, 0.005, 0.003, 0.002, 0.004]),
    (false, 32, [0.749, 0.170, 0.027, 0.015, 0.007, 0.004, 0.003, 0.004, 0.022]),
    (false, 48, [0.412, 0.188, 0.150, 0.126, 0.042, 0.020, 0.010, 0.010, 0.043]),
    (false, 64, [0.377, 0.185, 0.133, 0.135, 0.050, 0.022, 0.013, 0.026, 0.059]),
    (false, 96, [0.354, 0.228, 0.087, 0.081, 0.034, 0.022, 0.027, 0.083, 0.084]),
    (true, 16, [0.692, 0.211, 0.069, 0.021, 0.003, 0.001, 0.001, 0.000, 0.001]),
    (true, 32, [0.779, 0.182, 0.013, 0.010, 0.003, 0.002, 0.002, 0.001, 0.007]),
    (true, 48, [0.899, 0.057, 0.010, 0.007, 0.004, 0.003, 0.003, 0.002, 0.014]),
    (true, 64, [0.924, 0.035, 0.009, 0.006, 0.004, 0.003, 0.003, 0.002, 0.013]),
    (true, 96, [0.908, 0.048, 0.009, 0.007, 0.004, 0.003, 0.003, 0.002, 0.015]),
];

/// The figure as a plot: one panel per unit, the paper's values as hollow
/// markers of their series (see [`crate::plot`]).
///
/// A quick run's chart (`quick`) says so in its title: it checks that the
/// model runs, it is not a reproduction to print.
pub fn chart(f: &Figure, quick: bool) -> crate::plot::Plot {
    let rows: Vec<crate::plot::FigureRow> = f
        .rows
        .iter()
        .map(|r| crate::plot::FigureRow {
            series: r.series.clone(),
            x: r.x,
            value: r.value,
            unit: r.unit.clone(),
            published: r.published,
        })
        .collect();
    crate::plot::figure_plot(
        &format!(
            "{} on the simulator ({}){}",
            f.figure,
            f.profile,
            if quick { crate::plot::QUICK_MARK } else { "" }
        ),
        &f.x_label,
        &rows,
    )
}
