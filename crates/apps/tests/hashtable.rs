//! The hash table breakdown's multi-version cold entries (memory-semantics
//! study §IV-B; `dmkit_race`'s "Multi-version cold entries"): the index
//! layer's sequential model and linearizability under the checker on shm
//! threads and on simulator seeds with torn, delayed and reordered
//! requests; and readers racing writers on one key never see a mix.

use std::cell::RefCell;
use std::collections::HashMap;
use std::rc::Rc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;

use dmkit_fabric::Fabric;
use dmkit_index::conformance::{self, on_worker, stress, StressConfig, StressRecord};
use dmkit_index::{IndexError, LeaseConfig, MapClient, RemoteMap};
use dmkit_lincheck::{MapOp, MapRet};
use dmkit_race::{RaceClient, RaceConfig, RaceTable};
use dmkit_runtime::{RuntimeConfig, Worker};
use dmkit_sim::{Faults, Profile, Sim, SimConfig};

/// Sets the flag when dropped (also when its task panics).
struct StopOnDrop(Arc<AtomicBool>);

impl Drop for StopOnDrop {
    fn drop(&mut self) {
        self.0.store(true, Ordering::Relaxed);
    }
}

fn mv(versions: u32) -> RaceConfig {
    RaceConfig {
        groups: 4,
        max_key: 32,
        max_value: 64,
        // Long enough that a descheduled writer on a loaded machine rarely
        // stalls past half of it (it would update out of place).
        grace: 20_000_000,
        chunk_bytes: 256 << 10,
        cold_versions: versions,
        lease: LeaseConfig {
            lease: 5_000_000_000,
            ..LeaseConfig::default()
        },
        ..Default::default()
    }
}

#[test]
fn multi_version_entries_follow_the_sequential_model() {
    let (_, c) = conformance::sequential_model::<RaceTable>(
        conformance::shm_fabric(1, 64 << 20),
        mv(4),
        800,
        4000,
    );
    assert!(c.counters().mv_writes > 100, "{:?}", c.counters());
}

#[test]
fn bad_version_counts_are_refused() {
    let f = conformance::shm_fabric(1, 16 << 20);
    for k in [1, 17] {
        let e = RaceTable::create(f.clone(), "bad", mv(k))
            .err()
            .expect("refused");
        assert!(matches!(e, IndexError::Config { .. }), "{e}");
    }
}

#[test]
fn concurrent_threads_are_linearizable_on_multi_version_entries() {
    for (k, seed) in [(2u32, 11u64), (4, 12)] {
        let sc = StressConfig {
            workers: 3,
            tasks: 4,
            ops_per_task: 1200,
            hot_keys: 3,
            fill_percent: 10,
            seed,
            client_base: 0,
        };
        // (Deletes and re-inserts of the contended keys start fresh blocks,
        // so the versions left on them at the end say little; which path
        // updates took is asserted by the other tests' counters.)
        let conflicts = conformance::linearizable_threads::<RaceTable>(
            conformance::shm_fabric(2, 64 << 20),
            mv(k),
            &sc,
            |_, _| {},
        );
        assert!(
            conflicts > 20,
            "K={k}: contended keys must conflict: {conflicts}"
        );
    }
}

/// The multi-process test's child: `conformance::run_processes` runs this
/// test binary again with only this test selected (the table's structure,
/// `K` included, comes from the table it opens). Run on its own it does
/// nothing.
#[test]
#[ignore = "the multi-process test's child; does nothing on its own"]
fn mv_conformance_child() {
    conformance::child::<RaceTable>(mv(0));
}

/// The contended workload in three processes sharing a served memory node,
/// with K = 2 and 4: the merged history is linearizable and the final state
/// is the history's, and every contended key present at the end has a
/// multi-version block. (Which path the children's updates took is not
/// visible from here: how many versions are left on the final blocks
/// depends on when each key was last re-inserted — 0 to 14 in trial runs.
/// The thread and simulator tests assert the paths' counters.)
#[test]
fn concurrent_processes_are_linearizable_on_multi_version_entries() {
    for (k, seed) in [(2u32, 21u64), (4, 22)] {
        let sc = StressConfig {
            workers: 2,
            tasks: 3,
            ops_per_task: 1000,
            hot_keys: 3,
            fill_percent: 10,
            seed,
            client_base: 0,
        };
        let conflicts = conformance::linearizable_processes::<RaceTable>(
            "mv_conformance_child",
            64 << 20,
            mv(k),
            3,
            &sc,
            move |f, table| {
                for h in 0..sc.hot_keys {
                    let key = format!("hot-{h}").into_bytes();
                    let (v, _) = on_worker(f, &table.client(7), move |ctx, c| async move {
                        let present = c.search(&ctx, &key).await.unwrap().is_some();
                        (present, c.versions_taken(&ctx, &key).await.unwrap())
                    });
                    match v {
                        (true, Some(n)) => assert!(n >= k as u64, "K={k}: {n} versions"),
                        (false, None) => {}
                        other => panic!("K={k}, hot-{h}: not a multi-version block: {other:?}"),
                    }
                }
            },
        );
        assert!(
            conflicts > 20,
            "K={k}: contended keys must conflict: {conflicts}"
        );
    }
}

/// Writers and readers of one key on OS threads; every value is one byte
/// repeated, so a value put together from two writes shows.
#[test]
fn readers_racing_writers_never_see_a_mix() {
    let f = conformance::shm_fabric(1, 32 << 20);
    let table = RaceTable::create(f.clone(), "mix", mv(2)).unwrap();
    let key = b"the-key".to_vec();
    let k2 = key.clone();
    on_worker(f.as_ref(), &table.client(1), move |ctx, c| async move {
        assert!(c.insert(&ctx, &k2, &[0u8; 64]).await.unwrap());
    });
    let stop = Arc::new(AtomicBool::new(false));
    let reads = Arc::new(AtomicU64::new(0));
    let fast = Arc::new(AtomicU64::new(0));
    std::thread::scope(|s| {
        for w in 0..2u64 {
            let (f, table, key, stop, fast) = (
                f.clone(),
                table.clone(),
                key.clone(),
                stop.clone(),
                fast.clone(),
            );
            s.spawn(move || {
                on_worker(
                    f.as_ref(),
                    &table.client(10 + w),
                    move |ctx, c| async move {
                        // The readers stop when a writer is done, or fails.
                        let _stop = StopOnDrop(stop);
                        let mut b = 1u8 + w as u8;
                        for _ in 0..3000 {
                            let len = 8 + (b as usize % 7) * 8;
                            assert!(c.update(&ctx, &key, &vec![b; len]).await.unwrap());
                            b = b.wrapping_add(2).max(1);
                        }
                        fast.fetch_add(c.counters().mv_writes, Ordering::Relaxed);
                    },
                );
            });
        }
        for r in 0..2u64 {
            let (f, table, key, stop, reads) = (
                f.clone(),
                table.clone(),
                key.clone(),
                stop.clone(),
                reads.clone(),
            );
            s.spawn(move || {
                on_worker(
                    f.as_ref(),
                    &table.client(20 + r),
                    move |ctx, c| async move {
                        let mut mine = 0;
                        while !stop.load(Ordering::Relaxed) || mine < 200 {
                            mine += 1;
                            let v = c.search(&ctx, &key).await.unwrap().expect("present");
                            assert!(
                                v.iter().all(|&x| x == v[0]) && v.len() % 8 == 0,
                                "a mixed value: {v:?}"
                            );
                            reads.fetch_add(1, Ordering::Relaxed);
                        }
                    },
                );
            });
        }
    });
    assert!(reads.load(Ordering::Relaxed) >= 400);
    let fast = fast.load(Ordering::Relaxed);
    assert!(
        fast > 3000,
        "most updates took the FAA-and-WRITE path: {fast}"
    );
    let (v, _) = on_worker(f.as_ref(), &table.client(2), move |ctx, c| async move {
        c.versions_taken(&ctx, b"the-key").await.unwrap()
    });
    assert!(v.is_some_and(|v| v >= 2), "a multi-version block: {v:?}");
    table.destroy().unwrap();
}

/// What one simulator seed's run did: its clients' counters summed (the
/// surviving machine's only, after a kill) and, after a kill, what the
/// dead machine left.
#[derive(Debug, Default)]
struct SeedRun {
    writes: u64,
    slow: u64,
    waits: u64,
    gave_up: u64,
    /// Updates the killed machine left pending (invoked, never returned).
    pending_updates: usize,
    /// Of those updates' keys, how many a survivor then updated (an update
    /// invoked after the kill that returned).
    keys_progressed: usize,
}

/// The recorded stress workload on two simulated compute machines, with
/// the consistency faults (torn WRITEs landing word by word, delays,
/// reordering) and, on odd seeds, no in-order placement; checked like
/// `dmkit sim check --scenario race`. With `kill_at` (virtual ns), machine
/// 1 dies then, as `dmkit sim check --scenario crash-race` kills it (its
/// tasks stop where they stand, what they posted still lands); the
/// survivors must finish, the history (the dead tasks' operations pending)
/// be linearizable, and every key read the old or the new value.
fn sim_seed(seed: u64, k: u32, kill_at: Option<u64>) -> SeedRun {
    const MACHINES: usize = 2;
    let mut sim = Sim::new(SimConfig {
        profile: Profile::cx6(),
        compute_machines: MACHINES,
        memory_nodes: 2,
        memory_bytes: 64 << 20,
        page_size: 4096,
        seed,
        faults: Faults::consistency(),
        in_order_write: seed.is_multiple_of(2),
        ..SimConfig::default()
    })
    .unwrap();
    let f = sim.dyn_fabric();
    let mut cfg = mv(k);
    // Every other seed without the client cache (every update then
    // starts from the buckets), every third with a short grace period.
    if seed % 2 == 1 {
        cfg.cache_entries = 0;
    }
    if seed % 3 == 1 {
        cfg.grace = 1_000_000;
    }
    if kill_at.is_some() {
        // A dead client's insert or split lock holds the survivors up for
        // its lease (the clocks here are not skewed).
        cfg.lease = LeaseConfig {
            lease: 2_000_000,
            skew: 200_000,
        };
    }
    let table = RaceTable::create(f.clone(), "mv-sim", cfg).unwrap();
    let sc = StressConfig {
        workers: 2 + (seed % 3) as usize,
        tasks: 2 + (seed % 4) as usize,
        ops_per_task: 200,
        hot_keys: 2 + seed % 3,
        fill_percent: (seed % 3) as u32 * 10,
        seed,
        client_base: 0,
    };
    let out: Rc<RefCell<Vec<StressRecord>>> = Rc::default();
    let failed: Rc<RefCell<Option<IndexError>>> = Rc::default();
    let rcfg = RuntimeConfig {
        op_stats: false,
        ..RuntimeConfig::default()
    };
    let layout = table.local_layout().clone();
    let mut clients: Vec<(usize, RaceClient)> = Vec::new();
    for wi in 0..sc.workers {
        let th = sim
            .add_worker(wi % MACHINES, |f: &dyn Fabric, clock| {
                Worker::builder(f)
                    .clock(clock)
                    .config(rcfg.clone())
                    .id(wi)
                    .tasks(sc.tasks)
                    .local(&layout)
                    .build()
            })
            .unwrap();
        let id = stress::client_id(&sc, wi);
        let c = table.client_on(wi % MACHINES, id);
        clients.push((wi % MACHINES, c.clone()));
        stress::spawn_tasks(sim.worker_mut(th), &c, &sc, wi, &out, &failed);
    }
    if let Some(at) = kill_at {
        sim.run_until(at);
        assert!(
            sim.kill_machine(1) > 0,
            "seed {seed}: machine 1 had threads"
        );
    }
    let o = sim.run();
    if let Some(e) = failed.borrow_mut().take() {
        panic!("seed {seed}: an operation failed: {e}");
    }
    assert_eq!(o.blocked, 0, "seed {seed}: blocked threads");
    type Finals = (Vec<StressRecord>, HashMap<String, String>);
    let finals: Rc<RefCell<Option<Finals>>> = Rc::default();
    let th = sim
        .add_worker(0, |f: &dyn Fabric, clock| {
            Worker::builder(f)
                .clock(clock)
                .config(rcfg.clone())
                .id(999)
                .tasks(1)
                .local(&layout)
                .build()
        })
        .unwrap();
    let (c, fin, hot) = (table.client_on(0, 99_999), finals.clone(), sc.hot_keys);
    sim.worker_mut(th).spawn(move |ctx| async move {
        let r = stress::final_reads(&ctx, &c, hot)
            .await
            .expect("final reads");
        *fin.borrow_mut() = Some(r);
    });
    sim.run();
    let (fin, scan) = finals.borrow_mut().take().expect("final reads finished");
    let worker_machine = |client: u32| client as usize / sc.tasks % MACHINES;
    let h = stress::retimed(out.borrow().clone(), |c, t| {
        sim.virtual_at(worker_machine(c), t)
    });
    let fin = stress::retimed(fin, |_, t| sim.virtual_at(0, t));
    assert!(h.len() >= sc.workers * sc.tasks * sc.ops_per_task || kill_at.is_some());
    let mut run = SeedRun::default();
    if let Some(at) = kill_at {
        let dead: Vec<&StressRecord> = h
            .iter()
            .filter(|r| r.returned.is_none() && matches!(r.op, MapOp::Update(_)))
            .collect();
        assert!(
            dead.iter().all(|r| worker_machine(r.client) == 1),
            "seed {seed}: only the dead machine's operations stay pending"
        );
        run.pending_updates = dead.len();
        let keys: std::collections::BTreeSet<&str> = dead.iter().map(|r| r.key.as_str()).collect();
        run.keys_progressed = keys
            .iter()
            .filter(|&&key| {
                h.iter().any(|r| {
                    r.key == key
                        && r.invoked > at
                        && matches!(r.op, MapOp::Update(_))
                        && matches!(r.returned, Some((_, MapRet::Done(true))))
                })
            })
            .count();
    }
    if let Err(e) = stress::verify(h, fin, &scan) {
        panic!("seed {seed}, K={k}: {e}");
    }
    let s = sim.stats();
    assert!(
        s.torn > 0,
        "seed {seed}: the faults must tear some requests"
    );
    for (_, c) in clients.iter().filter(|(m, _)| kill_at.is_none() || *m == 0) {
        let n = c.counters();
        run.writes += n.mv_writes;
        run.slow += n.mv_slow;
        run.waits += n.mv_waits;
        run.gave_up += n.mv_gave_up;
    }
    run
}

#[test]
fn simulator_seeds_with_faults_are_linearizable_on_multi_version_entries() {
    let (mut writes, mut waits) = (0, 0);
    for seed in 1..=12u64 {
        let k = if seed.is_multiple_of(3) { 4 } else { 2 };
        let r = sim_seed(seed, k, None);
        writes += r.writes;
        waits += r.waits;
    }
    assert!(
        writes > 500,
        "updates must take the FAA-and-WRITE path: {writes}"
    );
    assert!(
        waits > 0,
        "some writer must wait for its slot's previous version"
    );
}

/// A longer soak over seeds (not in CI): `MV_SOAK_SEEDS=N` seeds from
/// `MV_SOAK_FIRST` (default 100), K from 2 to 5; with `MV_SOAK_KILL=1`
/// machine 1 is killed in each, somewhere in its first 400 µs.
#[test]
#[ignore = "a soak; run with MV_SOAK_SEEDS=N"]
fn soak_multi_version_entries_over_seeds() {
    let n: u64 = std::env::var("MV_SOAK_SEEDS").map_or(50, |v| v.parse().unwrap());
    let first: u64 = std::env::var("MV_SOAK_FIRST").map_or(100, |v| v.parse().unwrap());
    let kill = std::env::var("MV_SOAK_KILL").is_ok_and(|v| v == "1");
    for seed in first..first + n {
        let at = kill.then(|| 20_000 + seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) % 380_000);
        sim_seed(seed, 2 + (seed % 4) as u32, at);
    }
}

/// (seed, kill instant in virtual ns) of the kill test: seeds whose kill
/// leaves updates pending, in some of which survivors later give up
/// waiting for a slot's previous version (chosen with the code of their
/// commit; a change of timing moves them, and the test says so); 47 at 60 µs
/// has a `fill-` key's block share a `hot-` key's fingerprint and size
/// (the writer's prefix READ once took it for a torn block and retried
/// without end).
const KILLS: [(u64, u64); 6] = [
    (31, 150_000),
    (35, 400_000),
    (36, 250_000),
    (45, 120_000),
    (47, 60_000),
    (47, 180_000),
];

/// Compute machine 1 killed mid-run, with updates of its tasks in flight:
/// the survivors finish (no error, no blocked thread), the history with the
/// dead tasks' operations pending is linearizable and the final reads agree
/// with it — every key reads a complete value, the old or the new, never a
/// torn one — and survivors then update the keys the dead writers left
/// updates pending on, going out of place where a slot's previous version
/// stays unwritten.
#[test]
fn a_machine_killed_mid_update_leaves_no_torn_value_and_blocks_no_key() {
    let mut total = SeedRun::default();
    for (seed, at) in KILLS {
        let k = if seed.is_multiple_of(2) { 4 } else { 2 };
        let r = sim_seed(seed, k, Some(at));
        assert!(
            r.writes > 50,
            "seed {seed}: the survivors take the FAA-and-WRITE path: {r:?}"
        );
        total.pending_updates += r.pending_updates;
        total.keys_progressed += r.keys_progressed;
        total.gave_up += r.gave_up;
    }
    assert!(
        total.pending_updates > 0 && total.keys_progressed > 0,
        "the kills must catch updates in flight, and their keys move on: {total:?}"
    );
    assert!(
        total.gave_up > 0,
        "some survivor must give up on a slot's previous version (a dead \
         writer's hole, or a slow writer's) and update out of place: {total:?}"
    );
}
