//! The radix tree on shm: the index layer's conformance suite (a
//! sequential model, bad input, the lifecycle, ordered scans,
//! linearizability on threads and processes), and what is the tree's own:
//! a model run over keys that exercise every split kind (int and string
//! keys, keys that are prefixes of each other) in both leaf modes, with
//! and without the cache, and the structural checker after every run;
//! linearizability under contention with node locks and out-of-place
//! leaves; inclusive ranges; bad configurations, too little task memory
//! and memory exhaustion; the round trips of a warm search; read
//! delegation, write combining, the spinning leaf lock and the leaf
//! lock's hand-over (HOCL, E-HOCL) with linearizability under it.

use std::cell::RefCell;
use std::rc::Rc;
use std::sync::Arc;

use dmkit_art::{check_tree, ArtClient, ArtConfig, ArtTree, IndexError};
use dmkit_fabric::shm::ShmFabric;
use dmkit_fabric::ControlPlane;
use dmkit_index::conformance::{self, on_worker, stress, StressConfig};
use dmkit_index::{MapClient, RemoteMap};
use dmkit_runtime::rng::Rng;
use dmkit_runtime::{MonotonicClock, RuntimeConfig, Worker};

fn fabric(nodes: u16, size: u64) -> Arc<ShmFabric> {
    conformance::shm_fabric(nodes, size)
}

/// A small tree; a lease no live holder outlasts (the crash tests set
/// their own).
fn cfg(in_place: bool, cache: bool) -> ArtConfig {
    ArtConfig {
        max_key: 24,
        max_value: 32,
        in_place,
        cache_bytes: if cache { 1 << 20 } else { 0 },
        chunk_bytes: 1 << 20,
        lease: conformance::live_lease(),
        ..Default::default()
    }
}

/// The child process of the multi-process tests: `conformance::run_processes`
/// runs this test binary again with only this test selected. Run on its
/// own it does nothing.
#[test]
#[ignore = "the multi-process tests' child; does nothing on its own"]
fn conformance_child() {
    // The parent's tree: its structure comes from the descriptor, the
    // lease from here (no one dies in these tests; under the 100 ms
    // default a descheduled child loses its leaf lock and fails).
    conformance::child::<ArtTree>(ArtConfig {
        lease: conformance::live_lease(),
        ..ArtConfig::default()
    });
}

// ---- the conformance suite ---------------------------------------------

#[test]
fn sequential_ops_match_the_conformance_model() {
    let (model, client) =
        conformance::sequential_model::<ArtTree>(fabric(2, 64 << 20), cfg(true, true), 1500, 6000);
    assert!(model.len() > 500);
    let s = client.stats();
    assert!(s.splits > 10 && s.cache_hits > 0, "{s:?}");
}

#[test]
fn bad_input_is_refused_and_changes_nothing() {
    conformance::bad_input::<ArtTree>(fabric(1, 64 << 20), cfg(true, true));
}

#[test]
fn the_lifecycle_keeps_its_promises() {
    conformance::lifecycle::<ArtTree>(fabric(2, 64 << 20), cfg(true, true));
}

#[test]
fn range_scans_follow_the_model() {
    conformance::ordering::<ArtTree>(fabric(1, 64 << 20), cfg(true, true));
    conformance::ordering::<ArtTree>(fabric(1, 64 << 20), cfg(false, false));
    // Scans from the root with the cache on.
    let from_root = ArtConfig {
        scan_from_cache: false,
        ..cfg(true, true)
    };
    conformance::ordering::<ArtTree>(fabric(1, 64 << 20), from_root);
}

#[test]
fn concurrent_threads_are_linearizable() {
    let sc = StressConfig {
        workers: 2,
        tasks: 4,
        ops_per_task: 600,
        hot_keys: 6,
        fill_percent: 20,
        seed: 7,
        client_base: 0,
    };
    let conflicts = conformance::linearizable_threads::<ArtTree>(
        fabric(2, 256 << 20),
        cfg(true, true),
        &sc,
        |_, t| {
            check_tree(t).unwrap();
        },
    );
    assert!(
        conflicts > 50,
        "hot keys must see failed inserts/updates: {conflicts}"
    );
}

/// The multi-process check (`conformance::linearizable_processes`), with
/// the structural checker on the tree the processes built.
#[test]
fn concurrent_processes_are_linearizable() {
    let sc = StressConfig {
        workers: 2,
        tasks: 3,
        ops_per_task: 800,
        hot_keys: 5,
        fill_percent: 30,
        seed: 0,
        client_base: 0,
    };
    let conflicts = conformance::linearizable_processes::<ArtTree>(
        "conformance_child",
        128 << 20,
        cfg(true, true),
        3,
        &sc,
        |f, tree| {
            let rep = check_tree(tree).unwrap();
            let (all, _) = on_worker(f, &tree.client(98), |ctx, c| async move {
                c.entries(&ctx).await.unwrap()
            });
            assert_eq!(rep.entries, all);
        },
    );
    assert!(
        conflicts > 50,
        "hot keys must see failed writes: {conflicts}"
    );
}

// ---- the tree's own ----------------------------------------------------

/// Keys that exercise every path: 8-byte big-endian integers (dense
/// prefixes, leaf splits at every depth), strings with long common
/// prefixes (chains of nodes, header splits), keys that are prefixes of
/// others and keys with zero bytes.
fn key_of(r: &mut Rng) -> Vec<u8> {
    match r.below(5) {
        0 => (r.below(3000) * 0x0101_0101).to_be_bytes().to_vec(),
        1 => format!("user{:05}", r.below(400)).into_bytes(),
        2 => format!("a/very/long/common/{}", r.below(60)).into_bytes(),
        3 => {
            let n = 1 + r.below(4) as usize;
            vec![b'p'; n]
        }
        _ => {
            let mut k = vec![0u8; 1 + r.below(3) as usize];
            k.push(r.below(4) as u8);
            k
        }
    }
}

fn model_run(in_place: bool, cache: bool, scan_from_cache: bool, seed: u64) {
    let config = ArtConfig {
        scan_from_cache,
        ..cfg(in_place, cache)
    };
    let c = model_run_with(config, seed);
    // Scans start below the root only from a cache that holds the path.
    if cache && scan_from_cache {
        assert!(c.cached_scan_starts > 100, "{c:?}");
    } else {
        assert_eq!(c.cached_scan_starts, 0, "{c:?}");
    }
}

fn model_run_with(config: ArtConfig, seed: u64) -> dmkit_art::TreeCounters {
    let f = fabric(2, 256 << 20);
    let tree = ArtTree::create(f.clone(), "model", config).unwrap();
    let client = tree.client(1);
    let (res, _) = on_worker(f.as_ref(), &client, move |ctx, c| async move {
        let all = conformance::ordered_model_ops(&ctx, &c, seed, 6000, key_of).await;
        (all.len(), c.counters())
    });
    let rep = check_tree(&tree).unwrap();
    assert_eq!(rep.leaves as usize, res.0);
    let c = res.1;
    assert!(c.leaf_splits > 30, "{c:?}");
    assert!(c.header_splits > 0, "{c:?}");
    assert!(c.type_switches > 0, "{c:?}");
    c
}

/// Figure 17's switches: every combination of node layout and cache
/// index answers as the model, with a cache that holds everything and
/// with one that must evict; the checker verifies each node's type is its
/// layout's; the hash index finds its snapshots (cached searches happen),
/// and the finer sizes switch types more often.
#[test]
fn sequential_ops_match_a_model_under_every_cache_design() {
    use dmkit_art::cache::CacheIndex;
    use dmkit_art::layout::NodeLayout;
    let mut switches = Vec::new();
    for node_layout in [NodeLayout::FixedTypes, NodeLayout::Homogeneous] {
        for cache_index in [CacheIndex::Art, CacheIndex::Hash] {
            for cache_bytes in [1 << 20, 12 << 10] {
                let c = model_run_with(
                    ArtConfig {
                        node_layout,
                        cache_index,
                        cache_bytes,
                        ..cfg(true, true)
                    },
                    11,
                );
                assert!(
                    c.cache_hits > 100,
                    "{node_layout:?} {cache_index:?} {cache_bytes}: {c:?}"
                );
                switches.push((node_layout, c.type_switches));
            }
        }
    }
    let of = |l| -> u64 { switches.iter().filter(|s| s.0 == l).map(|s| s.1).sum() };
    assert!(
        of(NodeLayout::Homogeneous) > of(NodeLayout::FixedTypes),
        "{switches:?}"
    );
}

#[test]
fn concurrent_threads_are_linearizable_with_the_homogeneous_layout_and_a_hash_index() {
    use dmkit_art::cache::CacheIndex;
    use dmkit_art::layout::NodeLayout;
    for seed in 1..=2 {
        stress_threads_with(
            ArtConfig {
                node_layout: NodeLayout::Homogeneous,
                cache_index: CacheIndex::Hash,
                ..cfg(true, true)
            },
            seed,
        );
    }
}

#[test]
fn sequential_ops_match_a_model_in_place_with_cache() {
    model_run(true, true, true, 1);
}

#[test]
fn sequential_ops_match_a_model_in_place_without_cache() {
    model_run(true, false, true, 2);
}

#[test]
fn sequential_ops_match_a_model_out_of_place() {
    model_run(false, true, true, 3);
}

#[test]
fn sequential_ops_match_a_model_with_scans_from_the_root() {
    model_run(true, true, false, 4);
}

#[test]
fn ranges_are_inclusive_and_never_leave_their_bounds() {
    for scan_from_cache in [true, false] {
        ranges_are_inclusive(scan_from_cache);
    }
}

fn ranges_are_inclusive(scan_from_cache: bool) {
    let f = fabric(1, 64 << 20);
    let config = ArtConfig {
        scan_from_cache,
        ..cfg(true, true)
    };
    let tree = ArtTree::create(f.clone(), "range", config).unwrap();
    let client = tree.client(1);
    on_worker(f.as_ref(), &client, |ctx, c| async move {
        for i in 0..500u64 {
            let k = format!("k{:04}", i * 2);
            assert!(c.insert(&ctx, k.as_bytes(), b"x").await.unwrap());
        }
        let got = c.range(&ctx, b"k0101", b"k0200").await.unwrap();
        let keys: Vec<String> = got
            .iter()
            .map(|(k, _)| String::from_utf8(k.clone()).unwrap())
            .collect();
        let want: Vec<String> = (51..=100).map(|i| format!("k{:04}", i * 2)).collect();
        assert_eq!(keys, want);
        assert!(c.range(&ctx, b"z", b"zz").await.unwrap().is_empty());
        assert_eq!(c.scan(&ctx, b"k0997", 5).await.unwrap().len(), 1);
    });
}

#[test]
fn bad_configurations_are_refused_before_anything_is_allocated() {
    let f = fabric(1, 64 << 20);
    let free0 = f.node_stats(0).unwrap().heap_free_bytes;
    let bad: [fn(&mut ArtConfig); 4] = [
        |c| c.max_key = 300,
        |c| c.max_key = 0,
        |c| c.max_value = 9000,
        |c| c.chunk_bytes = 4096,
    ];
    for make_bad in bad {
        let mut bad = cfg(true, true);
        make_bad(&mut bad);
        let r = ArtTree::create(f.clone(), "x", bad);
        assert!(
            matches!(&r, Err(IndexError::Config { kind: "art", .. })),
            "{:?}",
            r.err()
        );
    }
    assert_eq!(f.node_stats(0).unwrap().heap_free_bytes, free0);
}

#[test]
fn too_little_task_memory_is_a_typed_error_that_changes_nothing() {
    let f = fabric(1, 64 << 20);
    let tree = ArtTree::create(f.clone(), "small", cfg(true, true)).unwrap();
    on_worker(f.as_ref(), &tree.client(1), |ctx, c| async move {
        assert!(c.insert(&ctx, b"keep", b"v").await.unwrap());
    });
    let need = tree.local_layout().bytes();
    assert!(need <= 64 << 10, "the layout fits the task memory it had");
    let mut w = Worker::builder(f.as_ref())
        .clock(Arc::new(MonotonicClock))
        .config(RuntimeConfig::default())
        .tasks(1)
        .local_bytes(4096)
        .build()
        .unwrap();
    let c = tree.client(2);
    let got = Rc::new(RefCell::new(Vec::new()));
    let g = got.clone();
    w.spawn(move |ctx| async move {
        let r = c.search(&ctx, b"keep").await.map(|_| ());
        g.borrow_mut().push(r);
        let r = c.insert(&ctx, b"new", b"v").await.map(|_| ());
        g.borrow_mut().push(r);
        let r = c.entries(&ctx).await.map(|_| ());
        g.borrow_mut().push(r);
    });
    w.run();
    assert_eq!(got.borrow().len(), 3);
    for r in got.borrow().iter() {
        assert!(
            matches!(r, Err(IndexError::LocalMemory { have: 4096, need: n }) if *n == need),
            "{r:?}"
        );
    }
    assert_eq!(
        check_tree(&tree).unwrap().entries,
        vec![(b"keep".to_vec(), b"v".to_vec())]
    );
}

#[test]
fn exhausted_memory_is_a_typed_error_and_the_tree_stays_usable() {
    let f = fabric(1, 8 << 20);
    let tree = ArtTree::create(
        f.clone(),
        "oom",
        ArtConfig {
            chunk_bytes: 256 << 10,
            ..cfg(true, true)
        },
    )
    .unwrap();
    let client = tree.client(1);
    let (n, _) = on_worker(f.as_ref(), &client, |ctx, c| async move {
        conformance::fill_until_out_of_memory(&ctx, &c).await
    });
    assert!(n > 100);
    let rep = check_tree(&tree).unwrap();
    assert_eq!(rep.leaves, n);
}

#[test]
fn a_warm_search_takes_one_round_trip() {
    let f = fabric(1, 128 << 20);
    let tree = ArtTree::create(f.clone(), "rt", cfg(true, true)).unwrap();
    let client = tree.client(1);
    let keys: Vec<[u8; 8]> = (0..2000u64)
        .map(|i| i.wrapping_mul(0x9E37_79B9_7F4A_7C15).to_be_bytes())
        .collect();
    let ks = keys.clone();
    on_worker(f.as_ref(), &client, move |ctx, c| async move {
        for k in &ks {
            assert!(c.insert(&ctx, k, b"12345678").await.unwrap());
        }
        for k in &ks {
            c.search(&ctx, k).await.unwrap();
        }
    });
    let ks = keys.clone();
    let (_, stats) = on_worker(f.as_ref(), &client, move |ctx, c| async move {
        for k in &ks {
            assert_eq!(c.search(&ctx, k).await.unwrap(), Some(b"12345678".to_vec()));
        }
    });
    let s = stats.ops.get("search").expect("search stats");
    let rt = s.counters.round_trips as f64 / s.count as f64;
    assert!(rt <= 1.0 + 1e-9, "warm search: {rt} round trips per op");
    // Without the cache, every level is a round trip.
    let cold = ArtTree::open(f.clone(), "rt", cfg(true, false))
        .unwrap()
        .client(2);
    let (_, stats) = on_worker(f.as_ref(), &cold, move |ctx, c| async move {
        for k in &keys {
            c.search(&ctx, k).await.unwrap();
        }
    });
    let s = stats.ops.get("search").unwrap();
    assert!(s.counters.round_trips as f64 / s.count as f64 >= 2.0);
}

/// The contended workload on threads, checked for linearizability, then
/// the structural checker on the tree it left.
fn stress_threads_with(mut c: ArtConfig, seed: u64) {
    let f = fabric(2, 256 << 20);
    c.max_value = 32;
    let tree = ArtTree::create(f.clone(), "stress", c).unwrap();
    let sc = StressConfig {
        workers: 2,
        tasks: 4,
        ops_per_task: 400,
        hot_keys: 6,
        fill_percent: 20,
        seed,
        client_base: 0,
    };
    let h = stress::run(
        f.as_ref(),
        tree.local_layout(),
        &|id| tree.client(id),
        &RuntimeConfig::default(),
        &sc,
    )
    .unwrap();
    conformance::final_check(f.as_ref(), &tree, sc.hot_keys, h);
    let rep = check_tree(&tree).unwrap();
    let (all, _) = on_worker(f.as_ref(), &tree.client(98), |ctx, c| async move {
        c.entries(&ctx).await.unwrap()
    });
    assert_eq!(rep.entries, all);
}

#[test]
fn concurrent_threads_are_linearizable_in_place() {
    for seed in 1..=3 {
        stress_threads_with(cfg(true, true), seed);
    }
}

#[test]
fn concurrent_threads_are_linearizable_with_node_locks() {
    for seed in 1..=2 {
        stress_threads_with(
            ArtConfig {
                lock_free_internal: false,
                ..cfg(false, true)
            },
            seed,
        );
    }
}

/// HOCL on the leaves (write combining off, so a machine's writers queue
/// on its local leaf locks and hand the remote lock over): two workers of
/// one machine on six hot keys, with the rear lock (E-HOCL) and without
/// (HOCL), and with a local table of two entries, where most hand-overs
/// reach a writer of another leaf (who releases that lock first). A writer
/// handed the lock starts from the leaf its predecessor wrote back; one
/// run reads it again instead (`handover_reread`).
#[test]
fn concurrent_threads_are_linearizable_with_leaf_hand_over() {
    let hocl = ArtConfig {
        read_delegation: false,
        write_combining: false,
        ..cfg(true, true)
    };
    for seed in 1..=2 {
        stress_threads_with(hocl.clone(), seed);
    }
    stress_threads_with(
        ArtConfig {
            rear_lock: false,
            ..hocl.clone()
        },
        3,
    );
    stress_threads_with(
        ArtConfig {
            leaf_lock_entries: 2,
            ..hocl.clone()
        },
        4,
    );
    stress_threads_with(
        ArtConfig {
            handover_reread: true,
            ..hocl
        },
        5,
    );
}

#[test]
fn concurrent_threads_are_linearizable_out_of_place() {
    for seed in 1..=3 {
        stress_threads_with(cfg(false, true), seed);
    }
}

/// Eight tasks of one worker on one key at once: their updates share
/// write-backs and their searches share remote searches (the cache is off,
/// so a search traverses remotely and its window stays open), and every
/// operation still returns what it must.
#[test]
fn tasks_of_a_worker_combine_writes_and_delegate_reads() {
    let f = fabric(1, 64 << 20);
    let tree = ArtTree::create(f.clone(), "rdwc", cfg(true, false)).unwrap();
    let client = tree.client(1);
    on_worker(f.as_ref(), &client, |ctx, c| async move {
        for i in 0..300u64 {
            c.insert(&ctx, format!("k{i}").as_bytes(), b"0")
                .await
                .unwrap();
        }
    });
    let found: Rc<RefCell<Vec<Option<Vec<u8>>>>> = Rc::default();
    let fd = found.clone();
    conformance::on_worker_tasks(f.as_ref(), &client, 8, move |t, ctx, c| {
        let found = fd.clone();
        async move {
            for i in 0..200u64 {
                let v = format!("{t}.{i}");
                assert!(c.update(&ctx, b"k7", v.as_bytes()).await.unwrap());
                let got = c.search(&ctx, b"k7").await.unwrap();
                found.borrow_mut().push(got);
            }
        }
    });
    assert!(found.borrow().iter().all(|v| v.is_some()));
    let k = client.counters();
    assert!(k.combined_writes > 0, "{k:?}");
    assert!(k.delegated_reads > 0, "{k:?}");
    let rep = check_tree(&tree).unwrap();
    assert_eq!(rep.leaves, 300);
    // Switched off, nothing is shared.
    let off = ArtTree::open(
        f.clone(),
        "rdwc",
        ArtConfig {
            read_delegation: false,
            write_combining: false,
            ..cfg(true, false)
        },
    )
    .unwrap()
    .client(2);
    conformance::on_worker_tasks(f.as_ref(), &off, 8, |t, ctx, c| async move {
        for i in 0..50u64 {
            let v = format!("{t}.{i}");
            assert!(c.update(&ctx, b"k7", v.as_bytes()).await.unwrap());
            c.search(&ctx, b"k7").await.unwrap();
        }
    });
    let k = off.counters();
    assert_eq!((k.combined_writes, k.delegated_reads), (0, 0));
}

/// Eight tasks of one worker update one key with write combining off:
/// they queue on the machine's local lock of the leaf and the holder hands
/// the remote lock to the next one (at most `leaf_handover` times in a
/// row), so most updates take no CAS; the key ends with one task's last
/// value. With no hand-over allowed, or the local queue off, none happens;
/// with a one-entry table, two keys' writers share the entry and a lock
/// handed to the other key's writer is released by it.
#[test]
fn a_machines_writers_hand_the_leaf_lock_over() {
    let run = |name: &str, c: ArtConfig, keys: &'static [&'static [u8]]| {
        let f = fabric(1, 64 << 20);
        let tree = ArtTree::create(f.clone(), name, c).unwrap();
        let client = tree.client(1);
        on_worker(f.as_ref(), &client, |ctx, c| async move {
            for i in 0..50u64 {
                c.insert(&ctx, format!("k{i}").as_bytes(), b"0")
                    .await
                    .unwrap();
            }
        });
        let last: Rc<RefCell<Vec<(usize, String)>>> = Rc::default();
        let l = last.clone();
        conformance::on_worker_tasks(f.as_ref(), &client, 8, move |t, ctx, c| {
            let last = l.clone();
            async move {
                let key = keys[t % keys.len()];
                let mut v = String::new();
                for i in 0..100u64 {
                    v = format!("{t}.{i}");
                    assert!(c.update(&ctx, key, v.as_bytes()).await.unwrap());
                }
                last.borrow_mut().push((t % keys.len(), v));
            }
        });
        for (k, &key) in keys.iter().enumerate() {
            let got = on_worker(f.as_ref(), &client, move |ctx, c| async move {
                c.search(&ctx, key).await.unwrap().unwrap()
            })
            .0;
            let got = (k, String::from_utf8(got).unwrap());
            assert!(last.borrow().contains(&got), "{got:?} not in {last:?}");
        }
        assert_eq!(check_tree(&tree).unwrap().leaves, 50);
        client.counters()
    };
    let hocl = ArtConfig {
        read_delegation: false,
        write_combining: false,
        ..cfg(true, false)
    };
    let k = run("handover", hocl.clone(), &[b"k7"]);
    assert!(k.lock_handovers > 400, "{k:?}");
    assert_eq!(k.foreign_handovers, 0, "{k:?}");
    // At most 8 in a row: of the 800 acquisitions at least one in nine
    // took the lock remotely.
    assert!(9 * (800 - k.lock_handovers) >= 800, "{k:?}");
    // The same with the leaf read again after each hand-over: as many
    // hand-overs, the same outcome (checked inside `run`).
    let r = run(
        "reread",
        ArtConfig {
            handover_reread: true,
            ..hocl.clone()
        },
        &[b"k7"],
    );
    assert!(r.lock_handovers > 400, "{r:?}");
    let k = run(
        "bound1",
        ArtConfig {
            leaf_handover: 1,
            ..hocl.clone()
        },
        &[b"k7"],
    );
    assert!(k.lock_handovers > 0 && 2 * k.lock_handovers <= 800, "{k:?}");
    for c in [
        ArtConfig {
            leaf_handover: 0,
            ..hocl.clone()
        },
        ArtConfig {
            leaf_hocl: false,
            ..hocl.clone()
        },
    ] {
        let k = run("none", c, &[b"k7"]);
        assert_eq!((k.lock_handovers, k.foreign_handovers), (0, 0), "{k:?}");
    }
    let k = run(
        "shared",
        ArtConfig {
            leaf_lock_entries: 1,
            ..hocl
        },
        &[b"k7", b"k8"],
    );
    // The queue alternates between the keys' writers: (nearly) every lock
    // handed over is the other key's.
    assert!(k.foreign_handovers > 400, "{k:?}");
}

#[test]
fn a_writer_that_finds_the_leaf_locked_spins_on_that_leaf() {
    // Tasks of two compute machines on one worker update one key: on shm
    // a task's lock CAS takes effect when posted, so while one machine's
    // task holds the leaf's rear lock (its write-back not yet posted), the
    // other's CAS fails. The loser retries the lock of the same leaf (the
    // paper's busy waiting) instead of restarting from the root.
    let f = fabric(1, 64 << 20);
    let tree = ArtTree::create(f.clone(), "spin", cfg(true, true)).unwrap();
    let (a, b) = (tree.client_on(0, 1), tree.client_on(1, 2));
    on_worker(f.as_ref(), &a, |ctx, c| async move {
        for i in 0..50u64 {
            c.insert(&ctx, format!("k{i}").as_bytes(), b"0")
                .await
                .unwrap();
        }
    });
    let last: Rc<RefCell<Vec<String>>> = Rc::default();
    let mut w = Worker::builder(f.as_ref())
        .tasks(4)
        .local(tree.local_layout())
        .build()
        .unwrap();
    for t in 0..4 {
        let c: ArtClient = if t % 2 == 0 { a.clone() } else { b.clone() };
        let last = last.clone();
        w.spawn(move |ctx| async move {
            let mut v = String::new();
            for i in 0..100u64 {
                v = format!("{t}.{i}");
                assert!(c.update(&ctx, b"k7", v.as_bytes()).await.unwrap());
            }
            last.borrow_mut().push(v);
        });
    }
    w.run();
    let (ka, kb) = (a.counters(), b.counters());
    assert!(ka.lock_retries + kb.lock_retries > 0, "{ka:?} {kb:?}");
    assert_eq!(ka.restarts + kb.restarts, 0, "{ka:?} {kb:?}");
    // The key holds one task's last value, and nothing else changed.
    let got = on_worker(f.as_ref(), &a, |ctx, c| async move {
        c.search(&ctx, b"k7").await.unwrap().unwrap()
    })
    .0;
    let got = String::from_utf8(got).unwrap();
    assert!(
        last.borrow().contains(&got),
        "{got} not in {:?}",
        last.borrow()
    );
    assert_eq!(check_tree(&tree).unwrap().leaves, 50);
}

/// The crash test's child: the contended workload under short leases,
/// until the parent kills it.
#[test]
#[ignore = "the crash test's child; does nothing on its own"]
fn killed_child() {
    conformance::child::<ArtTree>(ArtConfig {
        lease: conformance::crash_lease(),
        ..ArtConfig::default()
    });
}

/// Two processes hammering a few keys with in-place updates under leaf
/// locks are killed with SIGKILL mid-run; a survivor then works on the
/// same keys: every operation completes (a dead holder's leaf lock is a
/// lease, broken once it runs out) and the tree passes the after-crash
/// structural check.
#[test]
fn a_process_killed_mid_update_blocks_no_key() {
    let ops = conformance::killed_processes::<ArtTree>(
        "killed_child",
        ArtConfig {
            lease: conformance::crash_lease(),
            ..ArtConfig::default()
        },
        |_, t| {
            dmkit_art::check_tree_after_crash(t).expect("the tree after the kill");
        },
    );
    assert_eq!(ops, 1200);
}

/// `dmkit node gc --root` on a tree a live client holds: the node frees
/// its memory and name at once and fences its addresses (unmapped, handed
/// to nobody else while the holder's session lives); the holder's
/// operations then fail with typed errors (its verbs fault on the
/// unmapped pages) — none panics or hangs — and its `destroy` is refused
/// as collected.
#[test]
fn a_tree_collected_by_an_admin_gives_its_holder_typed_errors() {
    use dmkit_memnode::server::{default_token_path, read_token_file};
    use dmkit_memnode::{AdminOp, Response};
    let node = conformance::serve_node(64 << 20);
    let f = node.fabric.clone();
    let c = ArtConfig {
        retry: dmkit_index::RetryPolicy {
            max_attempts: 50,
            give_up_after: 20_000_000,
        },
        ..cfg(false, true)
    };
    let tree = ArtTree::create(f.clone(), "collected", c).unwrap();
    let keys: Vec<Vec<u8>> = (0..200u32).map(|i| i.to_be_bytes().to_vec()).collect();
    let ks = keys.clone();
    on_worker(f.as_ref(), &tree.client(1), move |ctx, c| async move {
        for k in &ks {
            assert!(c.insert(&ctx, k, b"value").await.unwrap());
        }
    });
    let token = read_token_file(&default_token_path(&node.socket)).unwrap();
    let before = f.node_stats(0).unwrap().chunks;
    let got = f
        .admin(
            0,
            token,
            AdminOp::GcRoot {
                name: "art/collected".into(),
            },
        )
        .unwrap();
    let Response::Collected { chunks, bytes } = got else {
        panic!("{got:?}")
    };
    assert!(
        chunks >= 1 && bytes >= 1 << 20,
        "{chunks} chunks, {bytes} B"
    );
    assert_eq!(f.node_stats(0).unwrap().chunks, before - chunks);
    assert!(f.list_roots(0).unwrap().is_empty(), "the name is gone");
    let ks = keys.clone();
    on_worker(f.as_ref(), &tree.client(2), move |ctx, c| async move {
        for k in ks.iter().take(20) {
            let r = c.search(&ctx, k).await;
            assert!(r.is_err(), "search after gc: {r:?}");
            let r = c.update(&ctx, k, b"other").await;
            assert!(r.is_err(), "update after gc: {r:?}");
            let r = c.insert(&ctx, b"new key", b"v").await;
            assert!(r.is_err(), "insert after gc: {r:?}");
        }
    });
    let e = tree
        .destroy()
        .expect_err("a collected tree is not destroyed again");
    assert!(e.to_string().contains("collected by an admin"), "{e}");
    // A second collection finds nothing.
    let again = f.admin(
        0,
        token,
        AdminOp::GcRoot {
            name: "art/collected".into(),
        },
    );
    assert!(again.is_err(), "{again:?}");
}

/// The same with out-of-place (RCU) updates: a process killed between
/// marking a leaf replaced and swinging its slot leaves a mark with a
/// lease; the survivor undoes it once expired, and every operation
/// completes.
#[test]
fn a_process_killed_mid_rcu_update_blocks_no_key() {
    let ops = conformance::killed_processes::<ArtTree>(
        "killed_child",
        ArtConfig {
            in_place: false,
            lease: conformance::crash_lease(),
            ..ArtConfig::default()
        },
        |_, t| {
            dmkit_art::check_tree_after_crash(t).expect("the tree after the kill");
        },
    );
    assert_eq!(ops, 1200);
}
