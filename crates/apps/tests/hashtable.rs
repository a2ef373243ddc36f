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

/// `records`, timed with the clocks of the machines their clients ran on,
/// moved to virtual time (each call to the earliest instant its reading
/// could have been taken at, each return to the latest).
fn in_virtual_time(
    sim: &Sim,
    mut records: Vec<StressRecord>,
    machine: impl Fn(u32) -> usize,
) -> Vec<StressRecord> {
    for r in &mut records {
        let m = machine(r.client);
        r.invoked = sim.virtual_at(m, r.invoked);
        if let Some((ret, _)) = &mut r.returned {
            *ret = sim.virtual_at(m, *ret + 1) - 1;
        }
    }
    records
}

/// The recorded stress workload on two simulated compute machines, with
/// the consistency faults (torn WRITEs landing word by word, delays,
/// reordering) and, on odd seeds, no in-order placement; checked like
/// `dmkit sim check --scenario race`. Returns the clients' multi-version
/// writes, slow updates and waits.
fn sim_seed(seed: u64, k: u32) -> (u64, u64, u64) {
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
    let mut clients: Vec<RaceClient> = Vec::new();
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
        clients.push(c.clone());
        stress::spawn_tasks(sim.worker_mut(th), &c, &sc, wi, &out, &failed);
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
    let h = in_virtual_time(&sim, out.borrow().clone(), worker_machine);
    let fin = in_virtual_time(&sim, fin, |_| 0);
    assert!(h.len() >= sc.workers * sc.tasks * sc.ops_per_task);
    if let Err(e) = stress::verify(h, fin, &scan) {
        panic!("seed {seed}, K={k}: {e}");
    }
    let s = sim.stats();
    assert!(
        s.torn > 0,
        "seed {seed}: the faults must tear some requests"
    );
    clients.iter().fold((0, 0, 0), |(w, sl, wa), c| {
        let n = c.counters();
        (w + n.mv_writes, sl + n.mv_slow, wa + n.mv_waits)
    })
}

#[test]
fn simulator_seeds_with_faults_are_linearizable_on_multi_version_entries() {
    let (mut writes, mut waits) = (0, 0);
    for seed in 1..=12u64 {
        let k = if seed.is_multiple_of(3) { 4 } else { 2 };
        let (w, _slow, wa) = sim_seed(seed, k);
        writes += w;
        waits += wa;
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
/// `MV_SOAK_FIRST` (default 100), K from 2 to 5.
#[test]
#[ignore = "a soak; run with MV_SOAK_SEEDS=N"]
fn soak_multi_version_entries_over_seeds() {
    let n: u64 = std::env::var("MV_SOAK_SEEDS").map_or(50, |v| v.parse().unwrap());
    let first: u64 = std::env::var("MV_SOAK_FIRST").map_or(100, |v| v.parse().unwrap());
    for seed in first..first + n {
        sim_seed(seed, 2 + (seed % 4) as u32);
    }
}
