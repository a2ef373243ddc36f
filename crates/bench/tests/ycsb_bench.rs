//! The YCSB harness on both indexes: every workload it accepts runs, finds
//! every loaded key, and reports consistent per-operation figures.

use std::sync::Arc;
use std::time::Duration;

use dmkit_bench::micro::BenchError;
use dmkit_bench::ycsb::{KeyType, Workload};
use dmkit_bench::ycsb_bench::{self, IndexKind, Platform, YcsbConfig};
use dmkit_fabric::shm::{ShmConfig, ShmFabric};
use dmkit_fabric::Fabric;
use dmkit_race::RaceConfig;
use dmkit_runtime::RuntimeConfig;

fn cfg(index: IndexKind, workload: Workload, key_type: KeyType) -> YcsbConfig {
    YcsbConfig {
        index,
        workload,
        keys: 3000,
        threads: 2,
        machines: 1,
        coros: 3,
        theta: 0.99,
        distribution: None,
        zipf_items: None,
        key_type,
        value_size: 24,
        duration: Duration::from_millis(150),
        warmup: Duration::ZERO,
        think: Duration::ZERO,
        seed: 3,
        runtime: RuntimeConfig::default(),
        hot_keys: 0,
        race: RaceConfig {
            cache_entries: 512,
            ..Default::default()
        },
        art: Default::default(),
        btree: Default::default(),
        clover: Default::default(),
    }
}

/// Every standard workload and the key type the tests run it with (ints
/// and strings alternate, so both kinds of key are exercised).
const WORKLOADS: [(Workload, KeyType); 7] = [
    (Workload::Load, KeyType::Int),
    (Workload::A, KeyType::String),
    (Workload::B, KeyType::Int),
    (Workload::C, KeyType::String),
    (Workload::D, KeyType::Int),
    (Workload::E, KeyType::String),
    (Workload::F, KeyType::Int),
];

fn fabric() -> Arc<dyn Fabric> {
    Arc::new(ShmFabric::one_node(ShmConfig::default(), 256 << 20).unwrap())
}

#[test]
fn every_workload_runs_on_every_index() {
    let f = fabric();
    for index in [
        IndexKind::Race,
        IndexKind::LocalHash,
        IndexKind::Art,
        IndexKind::LocalArt,
        IndexKind::Btree,
    ] {
        for (w, kt) in WORKLOADS {
            if w == Workload::E && !index.ordered() {
                continue;
            }
            let kt = if index == IndexKind::LocalArt {
                KeyType::Int
            } else {
                kt
            };
            let r =
                ycsb_bench::run(Platform::Fabric(f.clone()), &cfg(index, w, kt), &|_| {}).unwrap();
            let tag = format!("{index:?} {w:?}");
            assert!(r.ops > 0 && r.mops > 0.0, "{tag}: {r:?}");
            if w == Workload::Load {
                assert_eq!(r.ops, 3000, "{tag}");
            }
            // D and E draw keys below the highest key a client inserted,
            // which includes keys other clients have reserved but may not
            // have inserted yet (a scan from one past every key finds
            // nothing); every other workload reads loaded keys only.
            if w != Workload::D && w != Workload::E {
                assert_eq!(r.misses, 0, "{tag}");
            }
            assert!(
                r.latency.p50_us > 0.0 && r.latency.p99_us >= r.latency.p50_us,
                "{tag}"
            );
            if index.remote() {
                assert!(r.round_trips_per_op >= 1.0, "{tag}: {r:?}");
                assert!(r.verbs_per_op >= r.round_trips_per_op, "{tag}");
                assert!(r.bytes_read_per_op > 0.0 || w == Workload::Load, "{tag}");
                // E scans (no point searches for the cache to serve) and
                // inserts 5 %, which a tiny run may not reach.
                if w != Workload::E {
                    let writes = w != Workload::C;
                    assert_eq!(r.bytes_written_per_op > 0.0, writes, "{tag}: {r:?}");
                    // Every remote index caches for its lookups; the
                    // B+tree's inserts use its cache too.
                    if w != Workload::Load {
                        assert!(r.cache_hit_rate.is_some(), "{tag}");
                    }
                }
            } else {
                assert_eq!(r.round_trips_per_op, 0.0);
            }
        }
    }
}

/// The hash table with its hot area holding the likeliest keys: every
/// workload finds what it loaded, through both areas.
#[test]
fn race_runs_with_a_hot_area() {
    let f = fabric();
    for (w, kt) in [
        (Workload::Load, KeyType::Int),
        (Workload::A, KeyType::String),
        (Workload::C, KeyType::Int),
        (Workload::F, KeyType::Int),
    ] {
        let c = YcsbConfig {
            hot_keys: 64,
            race: RaceConfig {
                cache_entries: 512,
                hot_block_log2: 2,
                ..Default::default()
            },
            ..cfg(IndexKind::Race, w, kt)
        };
        let r = ycsb_bench::run(Platform::Fabric(f.clone()), &c, &|_| {}).unwrap();
        let tag = format!("{w:?}");
        assert!(r.ops > 0, "{tag}");
        assert_eq!(r.misses, 0, "{tag}");
        assert_eq!(r.hot_keys, 64, "{tag}");
        if w == Workload::Load {
            assert_eq!(r.ops, 3000, "{tag}");
        }
    }
}

#[test]
fn scans_and_bad_settings_are_refused() {
    let f = fabric();
    for c in [
        cfg(IndexKind::Race, Workload::E, KeyType::Int),
        YcsbConfig {
            theta: 1.5,
            ..cfg(IndexKind::Race, Workload::C, KeyType::Int)
        },
        YcsbConfig {
            keys: 0,
            ..cfg(IndexKind::LocalHash, Workload::C, KeyType::Int)
        },
        // The hot area is the hash table's.
        YcsbConfig {
            hot_keys: 10,
            ..cfg(IndexKind::Art, Workload::C, KeyType::Int)
        },
    ] {
        assert!(matches!(
            ycsb_bench::run(Platform::Fabric(f.clone()), &c, &|_| {}),
            Err(BenchError::Config(_))
        ));
    }
    assert_eq!("btree".parse::<IndexKind>(), Ok(IndexKind::Btree));
    assert!("bptree".parse::<IndexKind>().unwrap_err().contains("btree"));
    // congee is keyed by integers.
    assert!(matches!(
        ycsb_bench::run(
            Platform::Fabric(f.clone()),
            &cfg(IndexKind::LocalArt, Workload::C, KeyType::String),
            &|_| {}
        ),
        Err(BenchError::Config(_))
    ));
}

fn sim_platform(seed: u64) -> Platform {
    Platform::Sim(Box::new(dmkit_sim::SimConfig {
        memory_nodes: 2,
        memory_bytes: 128 << 20,
        page_size: 4096,
        seed,
        ..Default::default()
    }))
}

#[test]
fn the_harness_runs_on_the_simulator_in_virtual_time() {
    for (w, kt) in [
        (Workload::Load, KeyType::Int),
        (Workload::A, KeyType::String),
        (Workload::C, KeyType::Int),
        (Workload::D, KeyType::Int),
    ] {
        let c = YcsbConfig {
            machines: 2,
            duration: Duration::from_millis(2),
            ..cfg(IndexKind::Race, w, kt)
        };
        let r = ycsb_bench::run(sim_platform(1), &c, &|_| {}).unwrap();
        let tag = format!("{w:?}");
        assert_eq!(r.backend, "sim");
        assert_eq!(r.machines, 2);
        assert!(r.ops > 0 && r.mops > 0.0, "{tag}: {r:?}");
        if w == Workload::Load {
            assert_eq!(r.ops, 3000, "{tag}");
        } else {
            // Virtual seconds: exactly the requested duration.
            assert_eq!(r.seconds, 0.002, "{tag}");
        }
        if w != Workload::D {
            assert_eq!(r.misses, 0, "{tag}");
        }
        assert!(r.round_trips_per_op >= 1.0, "{tag}: {r:?}");
        // Every simulated request counts, the load's and the warm-up's too:
        // at least those of the measured operations, and more unless the
        // run is the load itself.
        let measured = (r.verbs_per_op * r.ops as f64).round() as u64;
        if w == Workload::Load {
            assert!(r.sim_verbs >= measured, "{tag}: {r:?}");
        } else {
            assert!(r.sim_verbs > measured, "{tag}: {r:?}");
        }
    }
}

#[test]
fn a_simulated_run_is_deterministic() {
    let c = YcsbConfig {
        duration: Duration::from_millis(2),
        ..cfg(IndexKind::Race, Workload::A, KeyType::Int)
    };
    let a = ycsb_bench::run(sim_platform(5), &c, &|_| {}).unwrap();
    let b = ycsb_bench::run(sim_platform(5), &c, &|_| {}).unwrap();
    assert_eq!(
        serde_json::to_value(&a).unwrap(),
        serde_json::to_value(&b).unwrap()
    );
    let several = YcsbConfig {
        machines: 2,
        ..c.clone()
    };
    let f: Arc<dyn Fabric> = fabric();
    assert!(ycsb_bench::run(Platform::Fabric(f), &several, &|_| {}).is_err());
}

#[test]
fn retry_histograms_count_every_measured_operation() {
    // A handful of keys updated by 16 tasks with conflict avoidance off:
    // CASes fail, so some operations retry.
    let c = YcsbConfig {
        keys: 4,
        threads: 4,
        coros: 4,
        distribution: Some(dmkit_bench::ycsb::Distribution::Uniform),
        duration: Duration::from_millis(2),
        warmup: Duration::from_millis(1),
        race: RaceConfig {
            cache_entries: 0,
            ..Default::default()
        },
        runtime: RuntimeConfig {
            conflict_avoid: false,
            ..RuntimeConfig::default()
        },
        ..cfg(IndexKind::Race, Workload::U, KeyType::Int)
    };
    let r = ycsb_bench::run(sim_platform(2), &c, &|_| {}).unwrap();
    for (name, h) in [
        ("per operation", &r.retry_histogram),
        ("per thread", &r.retry_histogram_thread),
    ] {
        assert_eq!(h.len(), 9, "{name}: {r:?}");
        let total: f64 = h.iter().sum();
        assert!((total - 1.0).abs() < 1e-9, "{name}: shares sum to {total}");
        assert!(h[0] < 1.0, "{name}: no operation retried: {h:?}");
    }
    // Retries counted per operation never exceed the run's retry counter
    // (which also counts those of operations still running at the end);
    // the last bucket counts 8.
    let lower: f64 = r
        .retry_histogram
        .iter()
        .enumerate()
        .map(|(k, s)| k as f64 * s)
        .sum();
    assert!(
        lower > 0.0 && lower <= r.retries_per_op + 1e-9,
        "{lower} vs {r:?}"
    );
    // The in-process peer never retries and has no histogram.
    let local = local_peer(Workload::U);
    assert!(local.retry_histogram.is_empty() && local.retry_histogram_thread.is_empty());
}

#[test]
fn fairness_figures_see_a_stranded_client() {
    // Uncontended reads: every task completes operations, every thread
    // about as many as the others.
    let calm = YcsbConfig {
        keys: 1000,
        threads: 4,
        coros: 2,
        distribution: Some(dmkit_bench::ycsb::Distribution::Uniform),
        duration: Duration::from_millis(2),
        warmup: Duration::from_millis(1),
        race: RaceConfig {
            cache_entries: 0,
            ..Default::default()
        },
        ..cfg(IndexKind::Race, Workload::C, KeyType::Int)
    };
    let r = ycsb_bench::run(sim_platform(2), &calm, &|_| {}).unwrap();
    assert_eq!(r.idle_task_share, 0.0, "{r:?}");
    assert!(r.thread_fairness > 0.99, "{r:?}");
    // Two single-task threads CASing one slot, conflict avoidance off: the
    // noise-free model lets the same thread win every round (its next CAS
    // always lands first), so one task is stranded and one thread did all
    // the work. Both figures must say so.
    let one_key = YcsbConfig {
        workload: Workload::U,
        keys: 1,
        threads: 2,
        coros: 1,
        runtime: RuntimeConfig {
            conflict_avoid: false,
            ..RuntimeConfig::default()
        },
        ..calm.clone()
    };
    let r = ycsb_bench::run(sim_platform(2), &one_key, &|_| {}).unwrap();
    assert!(r.ops > 0, "{r:?}");
    assert_eq!(r.idle_task_share, 0.5, "{r:?}");
    assert!((r.thread_fairness - 0.5).abs() < 1e-12, "{r:?}");
    // The in-process peer has no tasks to strand.
    let local = local_peer(Workload::C);
    assert_eq!(local.idle_task_share, 0.0);
    assert!(local.thread_fairness > 0.0 && local.thread_fairness <= 1.0 + 1e-12);
}

/// A 50 ms run of the in-process peer (`local-hash`) on `w`.
fn local_peer(w: Workload) -> dmkit_bench::ycsb_bench::YcsbResult {
    ycsb_bench::run(
        Platform::Fabric(fabric()),
        &YcsbConfig {
            duration: Duration::from_millis(50),
            ..cfg(IndexKind::LocalHash, w, KeyType::Int)
        },
        &|_| {},
    )
    .unwrap()
}

/// Clover through the harness: every workload but E (no order) on shm,
/// with no switch (there is no wire: asking for one is refused); on the
/// simulator behind SwordBox's switch, whose steering turns a hot key's
/// failed appends into successful ones.
#[test]
fn clover_runs_on_shm_and_behind_the_switch_on_the_simulator() {
    use dmkit_bench::ycsb_bench::CloverBench;
    use dmkit_switch::Steer;
    let f = fabric();
    for (w, kt) in WORKLOADS {
        if w == Workload::E {
            continue; // Clover keeps no order: no scans
        }
        // A window of 500 ms: with a test binary's threads and other
        // load sharing two cores, a 50 ms one could pass with neither
        // worker thread scheduled (0 operations, seen at load average
        // 13 with 8 test threads). Clover's directory is fitted to the
        // loaded keys (2 × keys entries, no growth) and workload D
        // inserts for as long as the run lasts: D gets 20,000 keys
        // (65,536 entries) and 100 µs of think time per operation — at
        // most 6 tasks × 10,000 operations/s × 0.5 s × 5 % inserts =
        // 1,500 inserts, however fast the machine.
        let d = w == Workload::D;
        let c = YcsbConfig {
            keys: if d { 20_000 } else { 3000 },
            duration: Duration::from_millis(500),
            think: if d {
                Duration::from_micros(100)
            } else {
                Duration::ZERO
            },
            ..cfg(IndexKind::Clover, w, kt)
        };
        let r = ycsb_bench::run(Platform::Fabric(f.clone()), &c, &|_| {}).unwrap();
        let tag = format!("clover {w:?}");
        assert!(r.ops > 0, "{tag}: {r:?}");
        if w != Workload::D {
            assert_eq!(r.misses, 0, "{tag}");
        }
        assert_eq!(r.steer, None, "{tag}");
        assert!(
            r.bytes_per_op >= r.bytes_read_per_op + r.bytes_written_per_op,
            "{tag}"
        );
    }
    let steered = |steer| YcsbConfig {
        clover: CloverBench {
            steer,
            ..Default::default()
        },
        ..cfg(IndexKind::Clover, Workload::A, KeyType::Int)
    };
    let e =
        ycsb_bench::run(Platform::Fabric(f.clone()), &steered(Steer::Write), &|_| {}).unwrap_err();
    assert!(e.to_string().contains("no wire"), "{e}");
    // The simulator: 1,024 hot keys, a switch only when asked for.
    let on_sim = |steer| {
        let c = YcsbConfig {
            keys: 1024,
            threads: 16,
            coros: 1,
            machines: 2,
            value_size: 128,
            duration: Duration::from_millis(1),
            ..steered(steer)
        };
        ycsb_bench::run(sim_platform(7), &c, &|_| {}).unwrap()
    };
    let off = on_sim(Steer::Off);
    let rw = on_sim(Steer::ReadWrite);
    assert_eq!(off.steer, None);
    assert_eq!(rw.steer.as_deref(), Some("read-write"));
    assert_eq!((off.misses, rw.misses), (0, 0));
    // Workload A's reads and updates each have their own latency tail
    // (the simulator keeps no per-type histograms, these two it does).
    for r in [&off, &rw] {
        assert!(r.p99_read_us > 0.0 && r.p99_write_us > 0.0, "{r:?}");
        assert!(r.p99_read_us.max(r.p99_write_us) >= r.latency.p99_us * 0.99);
    }
    assert!(off.cas_failures_per_op > 0.0, "{off:?}");
    assert!(
        rw.cas_failures_per_op < off.cas_failures_per_op / 2.0,
        "steering: {} CAS failures/op, none: {}",
        rw.cas_failures_per_op,
        off.cas_failures_per_op
    );
    // Warm hints: every client has met every key before the window, so a
    // read of workload C looks a key up in the directory only where two
    // keys share a slot of the client's direct-mapped hint cache (about 1 %
    // of 1,024 keys in 65,536 slots); without them the first touches of a
    // 1 ms run do (about 40 % of the reads with each worker's own hints;
    // a machine's shared table is warmed by its first worker to touch a
    // key).
    let warm = |warm_hints| {
        let c = YcsbConfig {
            keys: 1024,
            threads: 16,
            coros: 2,
            machines: 2,
            value_size: 128,
            duration: Duration::from_millis(1),
            clover: CloverBench {
                warm_hints,
                config: dmkit_clover::CloverConfig {
                    shared_hints: false,
                    ..Default::default()
                },
                ..Default::default()
            },
            ..cfg(IndexKind::Clover, Workload::C, KeyType::Int)
        };
        ycsb_bench::run(sim_platform(7), &c, &|_| {}).unwrap()
    };
    let (cold, warmed) = (warm(false), warm(true));
    assert!(cold.cache_hit_rate.unwrap() < 0.9, "{cold:?}");
    assert!(warmed.cache_hit_rate.unwrap() > 0.98, "{warmed:?}");
    assert!(warmed.bytes_per_op < cold.bytes_per_op);
    let on_shm = YcsbConfig {
        clover: CloverBench {
            warm_hints: true,
            ..Default::default()
        },
        ..cfg(IndexKind::Clover, Workload::C, KeyType::Int)
    };
    let e = ycsb_bench::run(Platform::Fabric(f.clone()), &on_shm, &|_| {}).unwrap_err();
    assert!(e.to_string().contains("--warm-hints"), "{e}");
}
