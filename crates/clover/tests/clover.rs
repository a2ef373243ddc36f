//! Clover on shm: the index layer's conformance suite (a sequential model,
//! bad input, the lifecycle, scans refused, linearizability under
//! contention on threads and processes) with the chain checker after every
//! run, and what is the store's own: the metadata server's reclamation,
//! the round trips of a warm hint, the bounded hint cache, preconditions.

use std::sync::Arc;

use dmkit_clover::{check_chains, CloverConfig, CloverKv, MdsConfig};
use dmkit_fabric::ControlPlane;
use dmkit_index::conformance::{self, on_worker, stress, StressConfig, StressRecord};
use dmkit_index::{IndexError, MapClient, RemoteMap};
use dmkit_lincheck::{MapOp, MapRet};

fn fabric(size: u64) -> Arc<dmkit_fabric::shm::ShmFabric> {
    conformance::shm_fabric(1, size)
}

/// Small limits, a short grace period and a busy metadata server, so
/// reclamation and reuse happen within a test.
fn small() -> CloverConfig {
    CloverConfig {
        max_key: 32,
        max_value: 64,
        dir_slots: 1 << 12,
        pool_slots: 1 << 10,
        grace: 4_000_000,
        chunk_bytes: 64 << 10,
        alloc_batch: 16,
        mds: MdsConfig {
            period: 500_000,
            ..MdsConfig::default()
        },
        ..CloverConfig::default()
    }
}

/// Versions linked according to a history: every insert, update and
/// delete that returned `true` linked one.
fn linked_in(h: &[StressRecord]) -> u64 {
    h.iter()
        .filter(|r| {
            !matches!(r.op, MapOp::Search) && matches!(r.returned, Some((_, MapRet::Done(true))))
        })
        .count() as u64
}

#[test]
#[ignore = "the multi-process tests' child; does nothing on its own"]
fn conformance_child() {
    conformance::child::<CloverKv>(CloverConfig {
        gc: false,
        ..small()
    });
}

#[test]
fn sequential_ops_match_a_model() {
    let f = fabric(64 << 20);
    let (model, client) = conformance::sequential_model::<CloverKv>(f, small(), 600, 6000);
    assert!(model.len() > 200);
    let c = client.counters();
    assert!(c.appends > 1500 && c.reads > 1000, "{c:?}");
}

#[test]
fn bad_input_is_refused_and_changes_nothing() {
    conformance::bad_input::<CloverKv>(fabric(16 << 20), small());
}

#[test]
fn the_lifecycle_keeps_its_promises() {
    conformance::lifecycle::<CloverKv>(fabric(32 << 20), small());
}

#[test]
fn range_scans_are_refused() {
    conformance::ordering::<CloverKv>(fabric(16 << 20), small());
}

#[test]
fn bad_configurations_are_refused_before_anything_is_allocated() {
    let f = fabric(16 << 20);
    let free0 = f.node_stats(0).unwrap().heap_free_bytes;
    for bad in [
        CloverConfig {
            dir_slots: 1000,
            ..small()
        },
        CloverConfig {
            pool_slots: 3,
            ..small()
        },
        CloverConfig {
            max_key: 0,
            ..small()
        },
        CloverConfig {
            chunk_bytes: 64,
            ..small()
        },
    ] {
        let r = CloverKv::create(f.clone(), "b", bad);
        assert!(
            matches!(&r, Err(IndexError::Config { kind: "clover", .. })),
            "{:?}",
            r.err()
        );
    }
    assert_eq!(f.node_stats(0).unwrap().heap_free_bytes, free0);
}

#[test]
fn preconditions_hold_across_deletes_and_reinserts() {
    let f = fabric(16 << 20);
    let kv = CloverKv::create(f.clone(), "pre", small()).unwrap();
    on_worker(f.as_ref(), &kv.client(1), |ctx, c| async move {
        assert!(
            !c.update(&ctx, b"k", b"x").await.unwrap(),
            "update of a key never stored"
        );
        assert!(!c.delete(&ctx, b"k").await.unwrap());
        assert!(c.insert(&ctx, b"k", b"a").await.unwrap());
        assert!(
            !c.insert(&ctx, b"k", b"b").await.unwrap(),
            "insert of a present key"
        );
        assert!(c.delete(&ctx, b"k").await.unwrap());
        assert!(
            !c.delete(&ctx, b"k").await.unwrap(),
            "delete of a tombstone"
        );
        assert!(
            !c.update(&ctx, b"k", b"c").await.unwrap(),
            "update of a tombstone"
        );
        assert_eq!(c.search(&ctx, b"k").await.unwrap(), None);
        assert!(
            c.insert(&ctx, b"k", b"d").await.unwrap(),
            "insert after a delete"
        );
        assert_eq!(c.search(&ctx, b"k").await.unwrap(), Some(b"d".to_vec()));
    });
    // One chain: a, tombstone, d.
    kv.stop_mds();
    let r = check_chains(&kv, Some(kv.linked_versions())).unwrap();
    assert_eq!((r.keys, r.present), (1, 1));
    assert_eq!(r.versions + kv.mds_stats().cut, 3);
    kv.destroy().unwrap();
}

#[test]
fn a_warm_hint_costs_one_round_trip_per_read_and_per_write() {
    let f = fabric(32 << 20);
    let kv = CloverKv::create(
        f.clone(),
        "rt",
        CloverConfig {
            grace: 10_000_000_000,
            gc: false,
            chunk_bytes: 1 << 20,
            ..small()
        },
    )
    .unwrap();
    let client = kv.client(1);
    on_worker(f.as_ref(), &client, |ctx, c| async move {
        for i in 0..200u32 {
            assert!(c.insert(&ctx, &i.to_le_bytes(), b"v").await.unwrap());
        }
    });
    let (_, s) = on_worker(f.as_ref(), &client, |ctx, c| async move {
        for i in 0..200u32 {
            assert!(c.search(&ctx, &i.to_le_bytes()).await.unwrap().is_some());
            assert!(c.update(&ctx, &i.to_le_bytes(), b"w").await.unwrap());
        }
    });
    assert_eq!(s.ops["search"].per_op(|c| c.round_trips), 1.0);
    assert_eq!(s.ops["update"].per_op(|c| c.round_trips), 1.0);
    // A client without hints: the directory first (its window, then the
    // version its entry names — here the tail, thanks to the shortcut).
    let cold = CloverKv::open(
        f.clone(),
        "rt",
        CloverConfig {
            cache_entries: 0,
            gc: false,
            ..small()
        },
    )
    .unwrap();
    let (_, s) = on_worker(f.as_ref(), &cold.client(2), |ctx, c| async move {
        for i in 0..200u32 {
            assert_eq!(
                c.search(&ctx, &i.to_le_bytes()).await.unwrap(),
                Some(b"w".to_vec())
            );
        }
    });
    assert_eq!(s.ops["search"].per_op(|c| c.round_trips), 2.0);
    kv.destroy().unwrap();
}

/// A reader whose hint is many versions old: with the shortcut read
/// beside the first READ (public Clover's chasing) it reaches the tail in
/// two round trips; chasing `next` first, it pays a hop per version up to
/// the chasing threshold.
#[test]
fn a_stale_hint_jumps_to_the_shortcut_read_with_the_first_read() {
    for first in [true, false] {
        let f = fabric(32 << 20);
        let cfg = CloverConfig {
            grace: 10_000_000_000,
            gc: false,
            chase_limit: 4,
            shortcut_first: first,
            // (The writer's appends would be the reader's hints.)
            shared_hints: false,
            ..small()
        };
        let kv = CloverKv::create(f.clone(), "stale", cfg.clone()).unwrap();
        let reader = kv.client(1);
        on_worker(f.as_ref(), &reader, |ctx, c| async move {
            assert!(c.insert(&ctx, b"k", b"v0").await.unwrap());
        });
        on_worker(f.as_ref(), &kv.client(2), |ctx, c| async move {
            for i in 1..=12u8 {
                assert!(c.update(&ctx, b"k", &[b'v', i]).await.unwrap());
            }
        });
        let (v, s) = on_worker(f.as_ref(), &reader, |ctx, c| async move {
            c.search(&ctx, b"k").await.unwrap()
        });
        assert_eq!(v, Some(vec![b'v', 12]), "first {first}");
        let rt = s.ops["search"].per_op(|c| c.round_trips);
        if first {
            assert_eq!(rt, 2.0, "hint ∥ shortcut, then the tail");
            assert_eq!(reader.counters().shortcut_jumps, 1);
        } else {
            assert!(rt > 4.0, "a hop per version up to the threshold: {rt}");
        }
        kv.destroy().unwrap();
    }
}

/// With shared hints, a tail one worker of a machine appended is every
/// worker's of that machine: a reader there finds it in one READ, a reader
/// on another machine (its own table, as a client process of public
/// Clover) walks from its stale hint.
#[test]
fn a_machine_s_workers_share_their_hints() {
    let f = fabric(32 << 20);
    let cfg = CloverConfig {
        grace: 10_000_000_000,
        gc: false,
        ..small()
    };
    let kv = CloverKv::create(f.clone(), "shared", cfg).unwrap();
    let (near, far) = (kv.client_on(0, 1), kv.client_on(1, 2));
    for c in [&near, &far] {
        on_worker(f.as_ref(), c, |ctx, c| async move {
            // The first inserts; both learn the tail.
            c.insert(&ctx, b"k", b"v0").await.unwrap();
            assert_eq!(c.search(&ctx, b"k").await.unwrap(), Some(b"v0".to_vec()));
        });
    }
    on_worker(f.as_ref(), &kv.client_on(0, 3), |ctx, c| async move {
        for i in 1..=3u8 {
            assert!(c.update(&ctx, b"k", &[b'v', i]).await.unwrap());
        }
    });
    let mut trips = Vec::new();
    for c in [&near, &far] {
        let (v, s) = on_worker(f.as_ref(), c, |ctx, c| async move {
            c.search(&ctx, b"k").await.unwrap()
        });
        assert_eq!(v, Some(vec![b'v', 3]));
        trips.push(s.ops["search"].per_op(|c| c.round_trips));
    }
    assert_eq!(trips[0], 1.0, "the machine's hint is the tail");
    assert!(
        trips[1] >= 2.0,
        "another machine's hint is stale: {trips:?}"
    );
    kv.destroy().unwrap();
}

#[test]
fn the_hint_cache_is_bounded() {
    let f = fabric(32 << 20);
    let kv = CloverKv::create(
        f.clone(),
        "bounded",
        CloverConfig {
            cache_entries: 16,
            ..small()
        },
    )
    .unwrap();
    let client = kv.client(1);
    on_worker(f.as_ref(), &client, |ctx, c| async move {
        for i in 0..1000u32 {
            assert!(c.insert(&ctx, &i.to_le_bytes(), b"v").await.unwrap());
        }
        for i in 0..1000u32 {
            assert_eq!(
                c.search(&ctx, &i.to_le_bytes()).await.unwrap(),
                Some(b"v".to_vec())
            );
        }
    });
    assert!(client.hints() <= 16, "{} hints", client.hints());
    kv.destroy().unwrap();
}

/// One hot key rewritten over and over: the metadata server cuts its
/// chain, frees the versions after the grace period, and clients reuse
/// them through the pool — memory stays bounded, and the chain checker
/// accounts for every version linked.
#[test]
fn the_metadata_server_reclaims_superseded_versions() {
    let f = fabric(64 << 20);
    let kv = CloverKv::create(f.clone(), "gc", small()).unwrap();
    let client = kv.client(1);
    let store = kv.clone();
    on_worker(f.as_ref(), &client, move |ctx, c| async move {
        assert!(c.insert(&ctx, b"hot", b"0").await.unwrap());
        let t0 = ctx.now();
        let mut i = 0u64;
        // Several grace periods of rewrites (60 ms), and on a loaded host,
        // where the metadata server's thread lags, until it has cut and
        // freed versions and the client has reused some (at most 20 s).
        loop {
            i += 1;
            assert!(c.update(&ctx, b"hot", &i.to_le_bytes()).await.unwrap());
            if i.is_multiple_of(64) {
                assert_eq!(
                    c.search(&ctx, b"hot").await.unwrap(),
                    Some(i.to_le_bytes().to_vec())
                );
                ctx.sleep(20_000).await;
                let spent = ctx.now() - t0;
                let m = store.mds_stats();
                let done = m.cut > 100 && m.freed > 50 && c.counters().pool_blocks > 0;
                if spent >= 20_000_000_000 || (spent >= 60_000_000 && done) {
                    break;
                }
            }
        }
    });
    kv.stop_mds();
    let m = kv.mds_stats();
    let c = client.counters();
    assert!(m.cut > 100 && m.freed > 50, "{m:?}");
    assert!(c.pool_blocks > 0, "reclaimed blocks were reused: {c:?}");
    // Without reuse every version would take a new block: the chunks
    // taken stay well below the versions written.
    let per_chunk = small().chunk_bytes / small().block_bytes() as u64;
    assert!(
        c.chunks * per_chunk < c.appends,
        "{} chunks of {per_chunk} for {} versions",
        c.chunks,
        c.appends
    );
    let r = check_chains(&kv, Some(kv.linked_versions())).unwrap();
    assert_eq!(r.keys, 1);
    assert!(r.versions < c.appends / 2, "the chain was cut: {r:?}");
    kv.destroy().unwrap();
}

fn stress_config(seed: u64) -> StressConfig {
    StressConfig {
        workers: 3,
        tasks: 4,
        ops_per_task: 1500,
        hot_keys: 6,
        fill_percent: 20,
        seed,
        client_base: 0,
    }
}

#[test]
fn concurrent_threads_are_linearizable_and_every_chain_checks() {
    let f: Arc<dyn dmkit_fabric::Fabric> = fabric(64 << 20);
    let kv = CloverKv::create(f.clone(), "lin", small()).unwrap();
    let sc = stress_config(42);
    let h = stress::run(
        f.as_ref(),
        kv.local_layout(),
        &|id| kv.client(id),
        &dmkit_runtime::RuntimeConfig::default(),
        &sc,
    )
    .unwrap();
    let conflicts = conformance::conflicts(&h);
    let linked = linked_in(&h);
    conformance::final_check(f.as_ref(), &kv, sc.hot_keys, h);
    kv.stop_mds();
    assert_eq!(kv.linked_versions(), linked);
    let r = check_chains(&kv, Some(linked)).unwrap();
    assert!(r.keys >= sc.hot_keys, "{r:?}");
    assert!(
        conflicts > 50,
        "hot keys must see failed inserts/updates: {conflicts}"
    );
    kv.destroy().unwrap();
}

#[test]
fn concurrent_processes_are_linearizable_and_every_chain_checks() {
    let node = conformance::serve_node(64 << 20);
    let f: Arc<dyn dmkit_fabric::Fabric> = node.fabric.clone();
    // This process runs the metadata server; the children only use it.
    let kv = CloverKv::create(f.clone(), "procs", small()).unwrap();
    let sc = StressConfig {
        workers: 2,
        tasks: 3,
        ops_per_task: 1000,
        hot_keys: 5,
        fill_percent: 20,
        seed: 3,
        client_base: 0,
    };
    let h = conformance::run_processes("conformance_child", &node, "procs", 3, &sc);
    let linked = linked_in(&h);
    conformance::final_check(f.as_ref(), &kv, sc.hot_keys, h);
    kv.stop_mds();
    let r = check_chains(&kv, Some(linked)).unwrap();
    assert!(r.keys >= sc.hot_keys, "{r:?}");
    kv.destroy().unwrap();
}
