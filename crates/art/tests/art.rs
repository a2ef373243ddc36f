//! The radix tree on shm: sequential behaviour against a model (int and
//! string keys, keys that are prefixes of each other, every split kind),
//! both leaf modes, with and without the cache; the structural checker
//! after each; linearizability under contention on threads; bad input and
//! memory exhaustion; scans; round trips of a warm search.

use std::cell::RefCell;
use std::collections::BTreeMap;
use std::rc::Rc;
use std::sync::Arc;

use dmkit_art::{check_tree, ArtConfig, ArtError, ArtTree};
use dmkit_fabric::shm::{ShmConfig, ShmFabric};
use dmkit_lincheck::stress::{self, on_worker, StressConfig};
use dmkit_lincheck::MapRet;
use dmkit_memnode::NodeConfig;
use dmkit_runtime::rng::Rng;
use dmkit_runtime::{MonotonicClock, RuntimeConfig, Worker};

const TESTKIT: &str = env!("CARGO_BIN_EXE_dmkit-art-testkit");

fn fabric(nodes: u16, size: u64) -> Arc<ShmFabric> {
    let cfgs: Vec<NodeConfig> = (0..nodes)
        .map(|i| NodeConfig {
            node_id: i,
            size,
            ..Default::default()
        })
        .collect();
    Arc::new(ShmFabric::embedded(ShmConfig::default(), &cfgs).unwrap())
}

fn cfg(in_place: bool, cache: bool) -> ArtConfig {
    ArtConfig {
        max_key: 24,
        max_value: 32,
        in_place,
        cache_bytes: if cache { 1 << 20 } else { 0 },
        chunk_bytes: 1 << 20,
        ..Default::default()
    }
}

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

fn model_run(in_place: bool, cache: bool, seed: u64) {
    let f = fabric(2, 256 << 20);
    let tree = ArtTree::create(f.clone(), "model", cfg(in_place, cache)).unwrap();
    let client = tree.client(1);
    let (res, _) = on_worker(f.as_ref(), &client, move |ctx, c| async move {
        let mut r = Rng::new(seed);
        let mut model: BTreeMap<Vec<u8>, Vec<u8>> = BTreeMap::new();
        for i in 0..6000u64 {
            let k = key_of(&mut r);
            let v = format!("v{i}").into_bytes();
            match r.below(10) {
                0..4 => {
                    let got = c.insert(&ctx, &k, &v).await.unwrap();
                    let want = !model.contains_key(&k);
                    assert_eq!(got, want, "insert {k:02x?} at op {i}");
                    model.entry(k).or_insert(v);
                }
                4..6 => {
                    let got = c.update(&ctx, &k, &v).await.unwrap();
                    assert_eq!(got, model.contains_key(&k), "update {k:02x?} at op {i}");
                    if let Some(x) = model.get_mut(&k) {
                        *x = v;
                    }
                }
                6 => {
                    let got = c.delete(&ctx, &k).await.unwrap();
                    assert_eq!(got, model.remove(&k).is_some(), "delete {k:02x?} at op {i}");
                }
                7 => {
                    let n = 1 + r.below(20) as usize;
                    let got = c.scan(&ctx, &k, n).await.unwrap();
                    let want: Vec<(Vec<u8>, Vec<u8>)> = model
                        .range(k.clone()..)
                        .take(n)
                        .map(|(a, b)| (a.clone(), b.clone()))
                        .collect();
                    assert_eq!(got, want, "scan {n} from {k:02x?} at op {i}");
                }
                _ => {
                    let got = c.search(&ctx, &k).await.unwrap();
                    assert_eq!(got.as_ref(), model.get(&k), "search {k:02x?} at op {i}");
                }
            }
        }
        let all = c.entries(&ctx).await.unwrap();
        let want: Vec<(Vec<u8>, Vec<u8>)> = model.into_iter().collect();
        assert_eq!(all, want, "entries");
        (all.len(), c.counters())
    });
    let rep = check_tree(&tree).unwrap();
    assert_eq!(rep.leaves as usize, res.0);
    let c = res.1;
    assert!(c.leaf_splits > 30, "{c:?}");
    assert!(c.header_splits > 0, "{c:?}");
    assert!(c.type_switches > 0, "{c:?}");
}

#[test]
fn sequential_ops_match_a_model_in_place_with_cache() {
    model_run(true, true, 1);
}

#[test]
fn sequential_ops_match_a_model_in_place_without_cache() {
    model_run(true, false, 2);
}

#[test]
fn sequential_ops_match_a_model_out_of_place() {
    model_run(false, true, 3);
}

#[test]
fn ranges_are_inclusive_and_never_leave_their_bounds() {
    let f = fabric(1, 64 << 20);
    let tree = ArtTree::create(f.clone(), "range", cfg(true, true)).unwrap();
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
fn bad_input_is_refused_and_changes_nothing() {
    let f = fabric(1, 64 << 20);
    let tree = ArtTree::create(f.clone(), "bad", cfg(true, true)).unwrap();
    let client = tree.client(1);
    on_worker(f.as_ref(), &client, |ctx, c| async move {
        assert!(c.insert(&ctx, b"keep", b"v").await.unwrap());
        let long = vec![b'x'; 25];
        assert!(matches!(
            c.insert(&ctx, &long, b"v").await,
            Err(ArtError::KeyLength { len: 25, max: 24 })
        ));
        assert!(matches!(
            c.search(&ctx, b"").await,
            Err(ArtError::KeyLength { .. })
        ));
        assert!(matches!(
            c.update(&ctx, b"keep", &[0; 33]).await,
            Err(ArtError::ValueTooLarge { len: 33, max: 32 })
        ));
        assert_eq!(c.search(&ctx, b"keep").await.unwrap(), Some(b"v".to_vec()));
    });
    let rep = check_tree(&tree).unwrap();
    assert_eq!(rep.entries, vec![(b"keep".to_vec(), b"v".to_vec())]);
    assert!(matches!(
        ArtTree::create(f.clone(), "bad", cfg(true, true)),
        Err(ArtError::AlreadyExists(_))
    ));
    assert!(matches!(
        ArtTree::create(
            f.clone(),
            "x",
            ArtConfig {
                max_key: 300,
                ..cfg(true, true)
            }
        ),
        Err(ArtError::Config(_))
    ));
    assert!(matches!(
        ArtTree::open(f.clone(), "nope", ArtConfig::default()),
        Err(ArtError::NoSuchTree(_))
    ));
    // Too little task-local memory for the tree's buffers.
    let mut w = Worker::builder(f.as_ref())
        .clock(Arc::new(MonotonicClock))
        .config(RuntimeConfig::default())
        .id(0)
        .tasks(1)
        .local_bytes(4096)
        .build()
        .unwrap();
    let c = tree.client(2);
    let got = Rc::new(RefCell::new(None));
    let g = got.clone();
    w.spawn(move |ctx| async move {
        *g.borrow_mut() = Some(c.search(&ctx, b"keep").await);
    });
    w.run();
    assert!(matches!(
        got.borrow_mut().take(),
        Some(Err(ArtError::LocalMemory { .. }))
    ));
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
        let mut n = 0u64;
        loop {
            let k = (n * 7919).to_be_bytes();
            match c.insert(&ctx, &k, b"value").await {
                Ok(true) => n += 1,
                Ok(false) => panic!("fresh key reported present"),
                Err(ArtError::OutOfMemory { .. }) => break,
                Err(e) => panic!("unexpected {e}"),
            }
            assert!(n < 1_000_000, "never ran out");
        }
        for i in 0..n {
            let k = (i * 7919).to_be_bytes();
            assert_eq!(c.search(&ctx, &k).await.unwrap(), Some(b"value".to_vec()));
            assert!(c.update(&ctx, &k, b"other").await.unwrap());
        }
        n
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

fn stress_threads(in_place: bool, seed: u64) {
    stress_threads_with(cfg(in_place, true), seed)
}

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
        &|id| tree.client(id),
        &RuntimeConfig::default(),
        &sc,
    )
    .unwrap();
    let reader = tree.client(9999);
    let ((finals, scan), _) = on_worker(f.as_ref(), &reader, move |ctx, c| async move {
        stress::final_reads(&ctx, &c, 6).await.unwrap()
    });
    if let Err(e) = stress::verify(h, finals, &scan) {
        panic!("{e}");
    }
    let rep = check_tree(&tree).unwrap();
    assert_eq!(rep.leaves as usize, scan.len());
}

#[test]
fn concurrent_threads_are_linearizable_in_place() {
    for seed in 1..=3 {
        stress_threads(true, seed);
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

#[test]
fn concurrent_threads_are_linearizable_out_of_place() {
    for seed in 1..=3 {
        stress_threads(false, seed);
    }
}

#[test]
fn concurrent_processes_are_linearizable() {
    let node = stress::serve_node(128 << 20);
    let f = node.fabric.clone();
    let tree = ArtTree::create(f.clone(), "procs", cfg(true, true)).unwrap();
    let sc = StressConfig {
        workers: 2,
        tasks: 3,
        ops_per_task: 800,
        hot_keys: 5,
        fill_percent: 30,
        seed: 0,
        client_base: 0,
    };
    let h = stress::run_processes(TESTKIT, &node.socket, "procs", 3, &sc);
    assert_eq!(h.len(), 3 * 2 * 3 * 800);
    let conflicts = h
        .iter()
        .filter(|r| matches!(r.returned, Some((_, MapRet::Done(false)))))
        .count();
    assert!(
        conflicts > 50,
        "hot keys must see failed writes: {conflicts}"
    );
    let reader = tree.client(99);
    let ((finals, scan), _) = on_worker(f.as_ref(), &reader, move |ctx, c| async move {
        stress::final_reads(&ctx, &c, 5).await.unwrap()
    });
    if let Err(e) = stress::verify(h, finals, &scan) {
        panic!("{e}");
    }
    let rep = check_tree(&tree).unwrap();
    assert_eq!(rep.leaves as usize, scan.len());
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
    stress::on_worker_tasks(f.as_ref(), &client, 8, move |t, ctx, c| {
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
    stress::on_worker_tasks(f.as_ref(), &off, 8, |t, ctx, c| async move {
        for i in 0..50u64 {
            let v = format!("{t}.{i}");
            assert!(c.update(&ctx, b"k7", v.as_bytes()).await.unwrap());
            c.search(&ctx, b"k7").await.unwrap();
        }
    });
    let k = off.counters();
    assert_eq!((k.combined_writes, k.delegated_reads), (0, 0));
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
    let l = last.clone();
    stress::on_worker_tasks(f.as_ref(), &(a.clone(), b.clone()), 4, move |t, ctx, cs| {
        let last = l.clone();
        async move {
            let c = if t % 2 == 0 { &cs.0 } else { &cs.1 };
            let mut v = String::new();
            for i in 0..100u64 {
                v = format!("{t}.{i}");
                assert!(c.update(&ctx, b"k7", v.as_bytes()).await.unwrap());
            }
            last.borrow_mut().push(v);
        }
    });
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
