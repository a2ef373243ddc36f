//! `dmkit sim check`: concurrency scenarios on the simulator under fault
//! injection, one simulation per seed ([`run_seeds`] runs several seeds at
//! once, each on its own OS thread). Every choice of a run (its shape, the
//! faults, the interleaving) follows from the seed, so a failing seed
//! replays exactly: `dmkit sim check --scenario S --seed N`.
//!
//! Scenarios:
//! - `counters` — the runtime over the fabric: FAA on shared counters and a
//!   multi-word record updated under a [`RemoteLock`], with torn transfers,
//!   delays and cross-queue-pair reordering. The counters must equal the
//!   increments made; every reader inside the lock must see the record's
//!   words equal (mutual exclusion and queue-pair ordering); the record must
//!   end at the number of critical sections.
//! - `race` — the RACE hash table: mixed search/insert/update/delete on a
//!   few hot keys while fill inserts split subtables, under the same
//!   faults; the final scan must match the searches and the inserts, and
//!   the history must be linearizable.
//! - `art` — the radix tree, the same workload and checks, with leaf mode,
//!   rear lock and cache drawn from the seed, and the structural checker
//!   on the final tree.
//! - `btree` — the B+tree, the same workload and checks, with small nodes
//!   (so splits happen at every level during the run), HOCL, cache and
//!   speculative lookup drawn from the seed, and its structural checker.
//! - `txn` — transactions with a coordinator crashed at a step of commit,
//!   recovered by the others and a final pass (`crate::txn_check`).
//! - `crash-race`, `crash-art`, `crash-btree` — the same, with compute
//!   machine 1 killed at an instant drawn from the seed ([`Sim::kill_machine`]:
//!   its tasks stop where they stand, holding whatever locks they held;
//!   what they had posted still lands). The survivors must finish — every
//!   lock a dead client held is a lease (2 ms here) that they break — and
//!   their history, with the dead tasks' unfinished operations pending, must
//!   be linearizable; the structure must pass its checker's after-crash
//!   form (what a dead client may legally leave: a B+tree split half its
//!   parent does not name yet, a radix-tree leaf whose reverse pointer
//!   still names its old parent, an unfinished type switch). One feature
//!   stays out, with its reason: RACE's hot area (a machine's write-back
//!   buffer dies with it, acknowledged writes included — IO
//!   consolidation's trade). The radix tree runs both leaf modes: in
//!   place (leaf locks) and out of place, whose "replaced" mark carries a
//!   lease deadline — a client that dies between marking a leaf and
//!   swinging its slot leaves a mark the survivors undo once it expires.
//! - `clover`, `swordbox-locks` — Clover through SwordBox's steering, and
//!   the B+tree's locks through CAS→WRITE: see [`crate::sim_check_swordbox`].
//!
//! Every scenario runs on the ConnectX-6 profile; the responder's order
//! among atomics waiting for one address follows the seed too (see
//! [`atomic_order_of`]), so the arbitrated orders, under which requests'
//! timings are settled at execution rather than at the post, are checked
//! with the same workloads; so does whether accesses stall behind the
//! atomics on their words ([`atomic_stalls_of`]).
//!
//! Clocks: the workers run on two compute machines, and each machine reads
//! a clock of its own that drifts and jumps within a bound drawn per seed
//! ([`clock_skew_of`]) below what the code under test assumes
//! ([`skew_bound`]): the counters' lock has a skew allowance of 200 µs;
//! RACE's grace period of 2 ms tolerates 250 µs (see [`skew_bound`]); the
//! radix tree and the B+tree use no clock for correctness and get up to a
//! millisecond. The recorded histories are timed with those clocks, so
//! before they are checked each timestamp is mapped back to virtual time
//! ([`Sim::virtual_at`]), widened to every instant the reading could have
//! been taken at — the checker's view of real time stays sound. A seed's
//! report (`--seed N`) names its clocks.

use std::cell::{Cell, RefCell};
use std::rc::Rc;

use dmkit_art::{ArtConfig, ArtTree};
use dmkit_btree::{Btree, BtreeConfig};
use dmkit_fabric::Fabric;
use dmkit_index::conformance::stress::{self, StressConfig, StressRecord};
use dmkit_index::{IndexError, MapClient, RemoteMap};
use dmkit_race::{RaceConfig, RaceTable};
use dmkit_runtime::lock::{LockConfig, RemoteLock};
use dmkit_runtime::{LocalLayout, RuntimeConfig, Worker};
use dmkit_sim::profile::AtomicOrder;
use dmkit_sim::{Faults, Profile, Sim, SimConfig};

use crate::rng::Rng;
use dmkit_fabric::RemoteRef;
use dmkit_runtime::Local;

/// Task-local bytes of the counters scenario's workers (it addresses them
/// by hand).
const LOCAL_BYTES: usize = 64 << 10;

/// Scenario names.
pub const SCENARIOS: [&str; 10] = [
    "counters",
    "race",
    "art",
    "btree",
    "crash-race",
    "crash-art",
    "crash-btree",
    "clover",
    "swordbox-locks",
    "txn",
];

/// A crash scenario's plan: compute machine 1 dies at virtual time `at`
/// (ns), with every task of its workers where it stands.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Crash {
    at: u64,
}

/// The crash of seed `seed`: somewhere between 20 µs and 4 ms into the
/// run (the workloads run for 5 to 20 ms), from a generator of its own so
/// the workload is the non-crash scenario's.
fn crash_of(seed: u64) -> Crash {
    let mut r = Rng::new(seed ^ 0xDEAD_C0DE_0000_0000);
    Crash {
        at: 20_000 + r.below(3_980_001),
    }
}

/// Clock offsets of the crash scenarios (ns): their leases rest on them.
const CRASH_SKEW: u64 = 100_000;

/// The leases of the crash scenarios: 2 ms (survivors wait that long for
/// a dead holder's lock), allowing for clocks that disagree by twice
/// [`CRASH_SKEW`].
const CRASH_LEASE: dmkit_index::LeaseConfig = dmkit_index::LeaseConfig {
    lease: 2_000_000,
    skew: 2 * CRASH_SKEW,
};

/// What a passing run did.
#[derive(Debug, Clone)]
pub struct Passed {
    /// Operations checked.
    pub ops: u64,
    /// Virtual time the run took (ns).
    pub virtual_ns: u64,
    /// Faults injected (torn, delayed).
    pub torn: u64,
    /// Requests the `delay` fault held back.
    pub delayed: u64,
    /// The run's shape, for the report.
    pub shape: String,
}

/// Runs scenario `name` with `seed`: `Ok` if every check held, `Err` with
/// what failed otherwise.
pub fn run(name: &str, seed: u64) -> Result<Passed, String> {
    let out = match name {
        "counters" => counters(seed),
        "race" => race(seed, None),
        "art" => art(seed, None),
        "btree" => btree(seed, None),
        "crash-race" => race(seed, Some(crash_of(seed))),
        "crash-art" => art(seed, Some(crash_of(seed))),
        "crash-btree" => btree(seed, Some(crash_of(seed))),
        "clover" => crate::sim_check_swordbox::clover(seed),
        "swordbox-locks" => crate::sim_check_swordbox::locks(seed),
        "txn" => crate::txn_check::txn(seed),
        _ => {
            return Err(format!(
                "no scenario {name:?}; scenarios: {}",
                SCENARIOS.join(", ")
            ))
        }
    };
    let clocks = clock_note(&clock_skew_of(seed, skew_bound(name)));
    match out {
        Ok(mut p) => {
            p.shape = format!("{}; {clocks}", p.shape);
            Ok(p)
        }
        Err(why) => Err(format!("{why}\n({clocks})")),
    }
}

/// The skew allowance of the counters scenario's lock (ns).
const LOCK_SKEW: u64 = 200_000;

/// The grace period of the race scenario's table (ns).
const RACE_GRACE: u64 = 2_000_000;

/// The largest clock offset scenario `name` is checked with (ns): what its
/// code assumes.
/// - `counters`: the lock's skew allowance (its lease rule holds while
///   offsets stay within it: clocks then disagree by at most twice it).
/// - `race`: an eighth of the grace period. Blocks are quarantined for
///   `grace` on the retiring client's clock and readers give up after
///   `grace / 2` on theirs; with offsets within `±B` either measurement
///   can be off by `2B` (a jump from one end to the other), so the rule
///   holds while `grace / 2 + 2B ≤ grace − 2B`. (The hot area's lock has a
///   100 ms lease and lets go of a block at half of it.)
/// - `art`, `btree`: a millisecond, an NTP-disciplined cluster. Their only
///   clock is their locks' 100 ms leases, which no run of milliseconds
///   reaches (freed nodes are never reused).
/// - `crash-*`: 100 µs; their 2 ms leases allow clocks 200 µs apart.
pub fn skew_bound(name: &str) -> u64 {
    match name {
        "counters" => LOCK_SKEW,
        "txn" => crate::txn_check::SKEW_BOUND,
        "race" => RACE_GRACE / 8,
        n if n.starts_with("crash-") => CRASH_SKEW,
        "clover" => crate::sim_check_swordbox::CLOVER_GRACE / 8,
        _ => 1_000_000,
    }
}

/// The clocks of seed `seed`'s run, within `bound` ns: the consistency
/// faults plus a skew of a quarter to all of `bound`, drifting up to
/// 200 ppm, jumping with probability 0, 0.02 or 0.1 per period of 20 to
/// 500 µs. (From a generator of its own, so the scenario's other draws,
/// and hence its workload, do not depend on it.)
pub fn clock_skew_of(seed: u64, bound: u64) -> Faults {
    let mut r = Rng::new(seed ^ 0xC10C_5EED_0000_0000);
    let skew = bound / 4 + r.below(bound - bound / 4 + 1);
    let drift = r.below(201) as f64;
    let jump = [0.0, 0.02, 0.1][r.below(3) as usize];
    let period = 20_000 + r.below(480_001);
    Faults::consistency().with_clock_skew(skew, drift, jump, period)
}

/// The clocks of `f`, for a report.
fn clock_note(f: &Faults) -> String {
    format!(
        "clocks within ±{:.1} µs (drift ≤ {} ppm, jump probability {} per {:.0} µs period)",
        f.clock_skew_ns as f64 / 1e3,
        f.clock_drift_ppm,
        f.clock_jump,
        f.clock_period_ns as f64 / 1e3
    )
}

/// Compute machines of every scenario; worker `i` runs on machine
/// `i % MACHINES` (the map clients' `client_on(id % 2)` say the same).
pub(crate) const MACHINES: usize = 2;

/// What [`run_seeds`] found.
#[derive(Debug, Clone, PartialEq)]
pub struct Seeds {
    /// Operations checked and torn requests injected, over the seeds that
    /// passed.
    pub ops: u64,
    /// Torn requests injected, over the seeds that passed.
    pub torn: u64,
    /// The smallest failing seed and what failed.
    pub failure: Option<(u64, String)>,
}

/// Runs scenario `name` for seeds `first..end`, `jobs` at a time, each
/// seed on an OS thread of its own (each is its own simulation; the
/// simulator keeps a running engine in a thread-local slot, so they share
/// nothing). The failure reported is the smallest failing seed, whatever
/// `jobs` is: seeds are taken in increasing order and every seed taken
/// runs to its end, so each seed below a failure ran.
pub fn run_seeds(name: &str, first: u64, end: u64, jobs: usize) -> Seeds {
    run_seeds_with(name, first, end, jobs, &|_| {})
}

/// [`run_seeds`], calling `progress(n)` each time a seed ends, `n` the
/// seeds ended so far (progress bars; the results do not depend on it).
pub fn run_seeds_with(
    name: &str,
    first: u64,
    end: u64,
    jobs: usize,
    progress: &(dyn Fn(u64) + Sync),
) -> Seeds {
    over_seeds(&|seed| run(name, seed), first, end, jobs, progress)
}

fn over_seeds(
    run: &(dyn Fn(u64) -> Result<Passed, String> + Sync),
    first: u64,
    end: u64,
    jobs: usize,
    progress: &(dyn Fn(u64) + Sync),
) -> Seeds {
    use std::sync::atomic::{AtomicU64, Ordering};
    use std::sync::Mutex;
    let next = AtomicU64::new(first);
    let ended = AtomicU64::new(0);
    let out = Mutex::new(Seeds {
        ops: 0,
        torn: 0,
        failure: None,
    });
    let lock = || out.lock().unwrap_or_else(|p| p.into_inner());
    let workers = end.saturating_sub(first).min(jobs.max(1) as u64) as usize;
    std::thread::scope(|s| {
        for w in 0..workers {
            let (next, lock, ended) = (&next, &lock, &ended);
            crate::sim_thread(format!("check-{w}"))
                .spawn_scoped(s, move || loop {
                    let seed = next.fetch_add(1, Ordering::Relaxed);
                    // Nothing above a known failure needs to run.
                    let beyond = lock().failure.as_ref().is_some_and(|(f, _)| seed > *f);
                    if seed >= end || beyond {
                        break;
                    }
                    let r = run(seed);
                    progress(ended.fetch_add(1, Ordering::Relaxed) + 1);
                    let mut o = lock();
                    match r {
                        Ok(p) => {
                            o.ops += p.ops;
                            o.torn += p.torn;
                        }
                        Err(why) => {
                            if o.failure.as_ref().is_none_or(|(f, _)| seed < *f) {
                                o.failure = Some((seed, why));
                            }
                        }
                    }
                })
                .expect("spawning a check thread");
        }
    });
    out.into_inner().unwrap_or_else(|p| p.into_inner())
}

/// Whether seed `seed`'s run stalls READs and WRITEs behind the atomics
/// booked on their words (`responder.atomic_stalls_access`): for seeds 0
/// mod 4, the `post` seeds of [`atomic_order_of`]; seeds 2 mod 4 run
/// `post` without it (the arbitrated orders do not model it).
pub fn atomic_stalls_of(seed: u64) -> bool {
    seed.is_multiple_of(4) && atomic_order_of(seed) == AtomicOrder::Post
}

/// The atomic order of seed `seed`'s run: `random` for seeds 1 mod 4,
/// `arrival` for 3 mod 4, the profile's own (`post`) otherwise. (From the
/// seed's residue rather than its generator, so a scenario's draws, and
/// hence its workload, do not depend on it.)
pub fn atomic_order_of(seed: u64) -> AtomicOrder {
    match seed % 4 {
        1 => AtomicOrder::Random,
        3 => AtomicOrder::Arrival,
        _ => Profile::cx6().responder.atomic_order,
    }
}

pub(crate) fn sim_for(seed: u64, r: &mut Rng, skew_bound: u64) -> Result<Sim, String> {
    let mut profile = Profile::cx6();
    profile.responder.atomic_order = atomic_order_of(seed);
    profile.responder.atomic_stalls_access = atomic_stalls_of(seed);
    Sim::new(SimConfig {
        profile,
        compute_machines: MACHINES,
        memory_nodes: 2,
        memory_bytes: 96 << 20,
        // Chunks take whole translation pages: the scenarios' small
        // subtables would each hold 2 MiB with huge pages.
        page_size: 4096,
        seed,
        faults: clock_skew_of(seed, skew_bound),
        // Half the seeds run without in-order placement: torn WRITEs then
        // land in any word order.
        in_order_write: r.below(2) == 0,
        ..SimConfig::default()
    })
    .map_err(|e| e.to_string())
}

fn counters(seed: u64) -> Result<Passed, String> {
    let mut r = Rng::new(seed);
    let threads = 2 + r.below(4) as usize;
    let tasks = 1 + r.below(4) as usize;
    let ops = 100 + r.below(200);
    let mut sim = sim_for(seed, &mut r, skew_bound("counters"))?;
    let f = sim.dyn_fabric();
    let e = |e: dmkit_fabric::FabricError| e.to_string();
    let (counters, _, ck) = f.alloc_chunk(0, 4096, true).map_err(e)?;
    let (lockmem, _, lk) = f.alloc_chunk(1, 4096, true).map_err(e)?;
    let record = lockmem.add(64);
    const COUNTERS: u64 = 8;
    let made: Rc<RefCell<Vec<u64>>> = Rc::new(RefCell::new(vec![0; COUNTERS as usize]));
    let sections = Rc::new(Cell::new(0u64));
    let failure: Rc<RefCell<Option<String>>> = Rc::default();
    let lock = RemoteLock::new(
        RemoteRef::new(lockmem, lk),
        LockConfig {
            skew: LOCK_SKEW,
            backoff_min: 500,
            backoff_max: 20_000,
            ..LockConfig::default()
        },
    );
    for t in 0..threads {
        let th = sim
            .add_worker(t % MACHINES, |f: &dyn Fabric, clock| {
                Worker::builder(f)
                    .clock(clock)
                    .config(RuntimeConfig::default())
                    .id(t)
                    .tasks(tasks)
                    .local_bytes(LOCAL_BYTES)
                    .build()
            })
            .map_err(e)?;
        for k in 0..tasks {
            let (made, sections, failure) = (made.clone(), sections.clone(), failure.clone());
            let owner = (1 + t * tasks + k) as u16;
            let mut rng = Rng::new(seed ^ (owner as u64) << 20);
            sim.worker_mut(th).spawn(move |ctx| async move {
                let fail = |m: String| {
                    failure.borrow_mut().get_or_insert(m);
                };
                for _ in 0..ops {
                    if rng.below(3) > 0 {
                        let c = rng.below(COUNTERS);
                        match ctx
                            .faa_sync(RemoteRef::new(counters.add(8 * c), ck), 1)
                            .await
                        {
                            Ok(_) => made.borrow_mut()[c as usize] += 1,
                            Err(e) => return fail(format!("FAA: {e}")),
                        }
                        continue;
                    }
                    let g = match lock.lock(&ctx, owner).await {
                        Ok(g) => g,
                        Err(e) => return fail(format!("lock: {e}")),
                    };
                    if let Err(e) = ctx
                        .read_sync(RemoteRef::new(record, lk), Local::at(0, 64))
                        .await
                    {
                        return fail(format!("READ under the lock: {e}"));
                    }
                    let words: Vec<u64> =
                        (0..8).map(|w| ctx.local_u64(Local::at(8 * w, 8))).collect();
                    if words.iter().any(|&w| w != words[0]) {
                        return fail(format!(
                            "a reader holding the lock saw a torn record {words:?} (owner {owner})"
                        ));
                    }
                    for w in 0..8 {
                        ctx.set_local_u64(Local::at(8 * w, 8), words[0] + 1);
                    }
                    // The record WRITE and the release go out in one batch on
                    // one queue pair: queue-pair order puts the release last.
                    ctx.write(RemoteRef::new(record, lk), Local::at(0, 64));
                    if let Err(e) = g.unlock(&ctx).await {
                        return fail(format!("unlock: {e}"));
                    }
                    sections.set(sections.get() + 1);
                }
            });
        }
    }
    let out = sim.run();
    if let Some(m) = failure.borrow_mut().take() {
        return Err(m);
    }
    if out.blocked > 0 {
        return Err(format!("{} virtual threads blocked forever", out.blocked));
    }
    let mut q = dmkit_fabric::SyncQp::new(f.as_ref(), 0, 4096).map_err(e)?;
    let got = q.read(counters, ck, 8 * COUNTERS as usize).map_err(e)?;
    for (c, want) in made.borrow().iter().enumerate() {
        let v = u64::from_le_bytes(got[8 * c..8 * c + 8].try_into().expect("8 bytes"));
        if v != *want {
            return Err(format!(
                "counter {c} = {v}, but {want} increments completed"
            ));
        }
    }
    let mut q1 = dmkit_fabric::SyncQp::new(f.as_ref(), 1, 4096).map_err(e)?;
    let rec = q1.read(record, lk, 64).map_err(e)?;
    for w in 0..8 {
        let v = u64::from_le_bytes(rec[8 * w..8 * w + 8].try_into().expect("8 bytes"));
        if v != sections.get() {
            return Err(format!(
                "record word {w} = {v} after {} critical sections",
                sections.get()
            ));
        }
    }
    let s = sim.stats();
    let increments: u64 = made.borrow().iter().sum();
    Ok(Passed {
        ops: increments + sections.get(),
        virtual_ns: out.now,
        torn: s.torn,
        delayed: s.delayed,
        shape: format!("{threads} threads × {tasks} tasks × {ops} ops"),
    })
}

fn race(seed: u64, crash: Option<Crash>) -> Result<Passed, String> {
    let mut r = Rng::new(seed);
    let bound = skew_bound(if crash.is_some() {
        "crash-race"
    } else {
        "race"
    });
    let mut sim = sim_for(seed, &mut r, bound)?;
    let f = sim.dyn_fabric();
    let groups = 1 + r.below(4);
    let cache_entries = if r.below(2) == 0 { 0 } else { 256 };
    let sc = stress_shape(&mut r, seed);
    // Half the seeds put some of the contended keys in a hot area (blocks
    // of 1, 2 or 4 entries, write-back after 1..8 modifications), with the
    // workers split over two compute machines.
    let hot_keys: Vec<Vec<u8>> = if r.below(2) == 0 {
        Vec::new()
    } else {
        (0..sc.hot_keys)
            .filter(|_| r.below(3) != 0)
            .map(|k| format!("hot-{k}").into_bytes())
            .collect()
    };
    let cfg = RaceConfig {
        max_key: 32,
        max_value: 32,
        groups,
        initial_depth: 0,
        max_depth: 10,
        cache_entries,
        grace: RACE_GRACE,
        chunk_bytes: 256 << 10,
        seed,
        hot_block_log2: r.below(3) as u32,
        hot_theta: 1 + r.below(8) as u32,
        hot_hold: 2_000 + r.below(50_000),
        hot_keys,
        lease: crash.map_or_else(Default::default, |_| CRASH_LEASE),
        ..RaceConfig::default()
    };
    let mut cfg = cfg;
    if crash.is_some() {
        // The hot area acknowledges writes from a compute machine's
        // write-back buffer (IO consolidation): a machine that dies loses
        // the writes it buffered. No lease can bring them back; the crash
        // scenario checks the rest of the table.
        cfg.hot_keys.clear();
    }
    let hot = cfg.hot_keys.len();
    let table = RaceTable::create(f.clone(), "check", cfg).map_err(|e| e.to_string())?;
    let run = stress_on_sim(
        &mut sim,
        table.local_layout(),
        &|id| table.client_on((id % 2) as usize, id),
        &sc,
        crash,
    )?;
    let s = sim.stats();
    Ok(Passed {
        ops: run.ops,
        virtual_ns: run.now,
        torn: s.torn,
        delayed: s.delayed,
        shape: format!(
            "{}{} threads × {} tasks × {} ops, {} contended keys ({hot} in the hot area), {} % fills, {} groups",
            run.crash_note(),
            sc.workers,
            sc.tasks,
            sc.ops_per_task,
            sc.hot_keys,
            sc.fill_percent,
            table.config().groups
        ),
    })
}

/// Runs the recorded stress workload of `sc` on the simulator's virtual
/// threads (clients from `client`), reads the final state with a fresh
/// client and checks it all (`stress::verify`). Returns (operations, the
/// virtual time at the end of the workload).
/// A map scenario's workload shape, drawn from the seed's generator.
pub(crate) fn stress_shape(r: &mut Rng, seed: u64) -> StressConfig {
    StressConfig {
        workers: 2 + r.below(3) as usize,
        tasks: 1 + r.below(5) as usize,
        ops_per_task: 150 + r.below(150) as usize,
        hot_keys: 2 + r.below(6),
        fill_percent: r.below(5) as u32 * 10,
        seed,
        client_base: 0,
    }
}

/// What a map scenario's run did.
pub(crate) struct MapRun {
    /// Operations checked.
    pub(crate) ops: u64,
    /// Virtual time at the end of the workload.
    pub(crate) now: u64,
    /// With a crash: (when, threads killed, operations they left pending).
    crash: Option<(u64, usize, usize)>,
}

impl MapRun {
    /// The crash, for a report ("" without one).
    fn crash_note(&self) -> String {
        match self.crash {
            Some((at, threads, pending)) => format!(
                "machine 1 killed at {:.1} µs ({threads} threads, {pending} operations left pending); ",
                at as f64 / 1e3
            ),
            None => String::new(),
        }
    }
}

pub(crate) fn stress_on_sim<C: MapClient>(
    sim: &mut Sim,
    layout: &LocalLayout,
    client: &dyn Fn(u64) -> C,
    sc: &StressConfig,
    crash: Option<Crash>,
) -> Result<MapRun, String> {
    let out: Rc<RefCell<Vec<StressRecord>>> = Rc::default();
    let failed: Rc<RefCell<Option<IndexError>>> = Rc::default();
    let rcfg = RuntimeConfig {
        op_stats: false,
        ..RuntimeConfig::default()
    };
    for wi in 0..sc.workers {
        let th = sim
            .add_worker(wi % MACHINES, |f: &dyn Fabric, clock| {
                Worker::builder(f)
                    .clock(clock)
                    .config(rcfg.clone())
                    .id(wi)
                    .tasks(sc.tasks)
                    .local(layout)
                    .build()
            })
            .map_err(|e| e.to_string())?;
        let c = client(stress::client_id(sc, wi));
        stress::spawn_tasks(sim.worker_mut(th), &c, sc, wi, &out, &failed);
    }
    // A crash: machine 1 dies mid-run; the survivors must finish (no key
    // blocked past its lease) and their history stay linearizable, with
    // the dead tasks' unfinished operations pending.
    let mut killed = None;
    if let Some(c) = crash {
        sim.run_until(c.at);
        killed = Some((c.at, sim.kill_machine(1)));
    }
    let o = sim.run();
    if let Some(e) = failed.borrow_mut().take() {
        return Err(format!("an operation failed: {e}"));
    }
    if o.blocked > 0 {
        return Err(format!("{} virtual threads blocked forever", o.blocked));
    }
    // The final state, read by a fresh client on a virtual thread.
    type Finals<E> = Result<(Vec<StressRecord>, std::collections::HashMap<String, String>), E>;
    let finals: Rc<RefCell<Option<Finals<IndexError>>>> = Rc::default();
    let th = sim
        .add_worker(0, |f: &dyn Fabric, clock| {
            Worker::builder(f)
                .clock(clock)
                .config(rcfg.clone())
                .id(999)
                .tasks(1)
                .local(layout)
                .build()
        })
        .map_err(|e| e.to_string())?;
    // (After a crash, on the surviving machine 0: machine 1's local lock
    // tables died with it, some of their entries held.)
    let final_id = if crash.is_some() { 99_998 } else { 99_999 };
    let (c, fin, hot) = (client(final_id), finals.clone(), sc.hot_keys);
    sim.worker_mut(th).spawn(move |ctx| async move {
        let r = stress::final_reads(&ctx, &c, hot).await;
        *fin.borrow_mut() = Some(r);
    });
    sim.run();
    let (fin, scan) = finals
        .borrow_mut()
        .take()
        .ok_or("the final reads did not finish")?
        .map_err(|e| e.to_string())?;
    // Timed with each machine's clock: back to virtual time.
    let worker_machine =
        |client: u32| (client as usize - sc.client_base as usize) / sc.tasks % MACHINES;
    let h = in_virtual_time(sim, out.borrow().clone(), worker_machine);
    let fin = in_virtual_time(sim, fin, |_| 0);
    let ops = h.len() as u64;
    let pending = h.iter().filter(|r| r.returned.is_none()).count();
    stress::verify(h, fin, &scan)?;
    Ok(MapRun {
        ops,
        now: o.now,
        crash: killed.map(|(at, threads)| (at, threads, pending)),
    })
}

/// `records`, timed with the clocks of the machines their clients ran on
/// (`machine(client)`), with each call moved to the earliest virtual
/// instant its reading could have been taken at and each return to the
/// latest: every operation's interval in virtual time contains its true
/// one, so an order the checker infers from them is a real one.
pub(crate) fn in_virtual_time(
    sim: &Sim,
    records: Vec<StressRecord>,
    machine: impl Fn(u32) -> usize,
) -> Vec<StressRecord> {
    stress::retimed(records, |c, t| sim.virtual_at(machine(c), t))
}

fn art(seed: u64, crash: Option<Crash>) -> Result<Passed, String> {
    let mut r = Rng::new(seed);
    let mut sim = sim_for(seed, &mut r, skew_bound("art"))?;
    let f = sim.dyn_fabric();
    let cfg = ArtConfig {
        max_key: 32,
        max_value: 32,
        in_place: r.below(3) != 0,
        rear_lock: r.below(4) != 0,
        cache_bytes: if r.below(3) == 0 { 0 } else { 1 << 20 },
        lock_free_internal: r.below(4) != 0,
        read_delegation: r.below(3) != 0,
        write_combining: r.below(3) != 0,
        chunk_bytes: 256 << 10,
        lease: crash.map_or_else(Default::default, |_| CRASH_LEASE),
        ..ArtConfig::default()
    };
    // Out-of-place updates (a third of the seeds) mark a leaf replaced,
    // then swing its slot; the mark is a lease too, undone by whoever
    // finds it expired with the leaf still in its slot.
    let sc = stress_shape(&mut r, seed);
    let mut cfg = cfg;
    // The leaf locks' HOCL (without write combining), from a generator of
    // its own so every other draw stays the same: the local queue, its
    // hand-over bound, and now and then a table of a few entries, where
    // hand-overs reach writers of other leaves.
    let mut h = Rng::new(seed ^ 0x4A0D_0FE2_0000_0000);
    cfg.leaf_hocl = h.below(5) != 0;
    cfg.leaf_handover = [0, 1, 8][h.below(3) as usize];
    if h.below(4) == 0 {
        cfg.leaf_lock_entries = 1 + h.below(4) as usize;
    }
    let tree = ArtTree::create(f.clone(), "check", cfg.clone()).map_err(|e| e.to_string())?;
    // Two windows tables (machines), each shared by several workers; the
    // clients are kept to sum their counters.
    let clients: RefCell<Vec<dmkit_art::ArtClient>> = RefCell::default();
    let run = stress_on_sim(
        &mut sim,
        tree.local_layout(),
        &|id| {
            let c = tree.client_on((id % 2) as usize, id);
            clients.borrow_mut().push(c.clone());
            c
        },
        &sc,
        crash,
    );
    let sum = |f: fn(&dmkit_art::TreeCounters) -> u64| -> u64 {
        clients.borrow().iter().map(|c| f(&c.counters())).sum()
    };
    let undone = sum(|c| c.marks_undone);
    // Dead updaters' never-linked new leaves (out of place): what they
    // left, and what the survivors took back through the intent words.
    let (unlinked, reclaimed) = (
        sum(|c| c.unlinked_leaf_bytes),
        sum(|c| c.leaf_bytes_reclaimed),
    );
    if reclaimed > unlinked {
        return Err(format!(
            "{reclaimed} B of unlinked leaves reclaimed, but only {unlinked} B were left unlinked (a block taken twice)"
        ));
    }
    let rep = if crash.is_some() {
        dmkit_art::check_tree_after_crash(&tree)
    } else {
        dmkit_art::check_tree(&tree)
    }
    .map_err(|e| format!("structure: {e}"))?;
    let run = run.map_err(|e| format!("{e}\n(config {cfg:?})"))?;
    let s = sim.stats();
    Ok(Passed {
        ops: run.ops,
        virtual_ns: run.now,
        torn: s.torn,
        delayed: s.delayed,
        shape: format!(
            "{}{}{} threads × {} tasks × {} ops, {} hot keys, {} % fills, in-place {}, rear lock {}, cache {}, rd {}, wc {}, leaf hocl {} (hand-over {}, {} entries), lock-free {}, {} leaves in {} nodes",
            run.crash_note(),
            if crash.is_some() {
                format!(
                    "{undone} expired replaced marks undone, {reclaimed} B of unlinked leaves reclaimed, {} B leaked; ",
                    unlinked - reclaimed
                )
            } else {
                String::new()
            },
            sc.workers,
            sc.tasks,
            sc.ops_per_task,
            sc.hot_keys,
            sc.fill_percent,
            cfg.in_place,
            cfg.rear_lock,
            cfg.cache_bytes > 0,
            cfg.read_delegation,
            cfg.write_combining,
            cfg.leaf_hocl,
            cfg.leaf_handover,
            cfg.leaf_lock_entries,
            cfg.lock_free_internal,
            rep.leaves,
            rep.internal_nodes
        ),
    })
}

fn btree(seed: u64, crash: Option<Crash>) -> Result<Passed, String> {
    let mut r = Rng::new(seed);
    let bound = skew_bound(if crash.is_some() {
        "crash-btree"
    } else {
        "btree"
    });
    let mut sim = sim_for(seed, &mut r, bound)?;
    let f = sim.dyn_fabric();
    let cfg = BtreeConfig {
        max_key: 32,
        max_value: 32,
        node_bytes: [384, 512, 1024][r.below(3) as usize],
        cache_bytes: if r.below(3) == 0 { 0 } else { 1 << 20 },
        speculative: r.below(3) != 0,
        hocl: r.below(3) != 0,
        max_handover: r.below(5) as u32,
        on_chip_locks: r.below(2) == 0,
        combine: r.below(2) == 0,
        chunk_bytes: 256 << 10,
        lease: crash.map_or_else(Default::default, |_| CRASH_LEASE),
        ..BtreeConfig::default()
    };
    let sc = stress_shape(&mut r, seed);
    let tree = Btree::create(f.clone(), "check", cfg.clone()).map_err(|e| e.to_string())?;
    let run = stress_on_sim(
        &mut sim,
        tree.local_layout(),
        &|id| tree.client_on((id % 2) as usize, id),
        &sc,
        crash,
    );
    let rep = if crash.is_some() {
        dmkit_btree::check_tree_after_crash(&tree)
    } else {
        dmkit_btree::check_tree(&tree)
    }
    .map_err(|e| format!("structure: {e}"))?;
    let run = run.map_err(|e| format!("{e}\n(config {cfg:?})"))?;
    let s = sim.stats();
    Ok(Passed {
        ops: run.ops,
        virtual_ns: run.now,
        torn: s.torn,
        delayed: s.delayed,
        shape: format!(
            "{}{} threads × {} tasks × {} ops, {} hot keys, {} % fills, nodes {} B, cache {}, speculative {}, hocl {} (hand-over ≤ {}), locks on chip {}, {} entries, height {}{}",
            run.crash_note(),
            sc.workers,
            sc.tasks,
            sc.ops_per_task,
            sc.hot_keys,
            sc.fill_percent,
            cfg.node_bytes,
            cfg.cache_bytes > 0,
            cfg.speculative,
            cfg.hocl,
            cfg.max_handover,
            tree.locks_on_chip(),
            rep.entries,
            rep.height,
            if rep.orphans > 0 {
                format!(", {} orphaned split halves", rep.orphans)
            } else {
                String::new()
            }
        ),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicU64, Ordering};

    /// A stand-in scenario: seed `s` checks `s` operations and fails when
    /// `fails(s)`; low seeds are slow so that, with several jobs, higher
    /// seeds finish (and fail) first.
    fn fake(fails: fn(u64) -> bool) -> impl Fn(u64) -> Result<Passed, String> + Sync {
        move |seed| {
            if seed < 8 {
                std::thread::sleep(std::time::Duration::from_millis(20));
            }
            if fails(seed) {
                return Err(format!("seed {seed} broke"));
            }
            Ok(Passed {
                ops: seed,
                virtual_ns: 0,
                torn: 1,
                delayed: 0,
                shape: String::new(),
            })
        }
    }

    #[test]
    fn every_seed_skews_the_clocks_within_its_scenarios_bound() {
        for name in SCENARIOS {
            let bound = skew_bound(name);
            let mut seen = std::collections::HashSet::new();
            for seed in 0..500 {
                let f = clock_skew_of(seed, bound);
                assert!(f.validate().is_ok());
                assert!(
                    (bound / 4..=bound).contains(&f.clock_skew_ns),
                    "{name} {seed}"
                );
                seen.insert(f.clock_skew_ns);
            }
            assert!(seen.len() > 400, "{name}: skews vary by seed");
        }
        assert!(skew_bound("race") * 8 <= RACE_GRACE);
        assert!(skew_bound("counters") <= LOCK_SKEW);
        // A seed's report names its clocks.
        let p = run("counters", 3).expect("seed 3 passes");
        assert!(p.shape.contains("clocks within ±"), "{}", p.shape);
    }

    #[test]
    fn the_smallest_failing_seed_is_reported_whatever_the_jobs() {
        let run = fake(|s| s == 7 || s == 9 || s == 40);
        for jobs in [1, 2, 3, 8] {
            let out = over_seeds(&run, 1, 100, jobs, &|_| {});
            assert_eq!(out.failure, Some((7, "seed 7 broke".into())), "{jobs} jobs");
        }
    }

    #[test]
    fn passing_seeds_add_up_the_same_whatever_the_jobs() {
        let run = fake(|_| false);
        for jobs in [1, 2, 5] {
            // The progress callback sees every seed end, once.
            let (calls, most) = (AtomicU64::new(0), AtomicU64::new(0));
            let out = over_seeds(&run, 3, 50, jobs, &|n| {
                calls.fetch_add(1, Ordering::Relaxed);
                most.fetch_max(n, Ordering::Relaxed);
            });
            assert_eq!(calls.into_inner(), 47, "{jobs} jobs");
            assert_eq!(most.into_inner(), 47, "{jobs} jobs");
            assert_eq!(out.failure, None);
            assert_eq!(out.ops, (3..50).sum::<u64>(), "{jobs} jobs");
            assert_eq!(out.torn, 47, "{jobs} jobs");
        }
        assert_eq!(
            over_seeds(&run, 5, 5, 2, &|_| {}).ops,
            0,
            "no seeds, nothing run"
        );
    }
}
