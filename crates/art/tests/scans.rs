//! Scans racing inserts — leaf splits, header splits and type switches
//! while the scans run — on the simulator (many seeds, many virtual
//! threads interleaving at every verb) and on threads, checked against the
//! non-atomic scan's guarantee: every key present throughout a scan is
//! returned, no key absent throughout it is, in key order and without
//! duplicates; with scans started from cached nodes
//! (`ArtConfig::scan_from_cache`, the default) and from the root.
//!
//! Keys are only inserted here, each once, with a value fixed by the key:
//! a key whose insert returned before a scan was invoked is present
//! throughout it; one whose insert was not yet invoked when the scan
//! returned is absent throughout it.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU8, Ordering::SeqCst};
use std::sync::Arc;

use dmkit_art::{check_tree, ArtClient, ArtConfig, ArtTree, TreeCounters};
use dmkit_fabric::Fabric;
use dmkit_index::conformance::{self, on_worker};
use dmkit_index::{MapClient, RemoteMap};
use dmkit_runtime::rng::Rng;
use dmkit_runtime::{Ctx, Worker};
use dmkit_sim::{Profile, Sim, SimConfig};

const MAX_KEY: usize = 12;

/// The keys, in insertion order, and their positions by key.
struct Universe {
    keys: Vec<Vec<u8>>,
    sorted: BTreeMap<Vec<u8>, usize>,
    /// 0: not inserted yet, 1: insert invoked, 2: insert returned.
    state: Vec<AtomicU8>,
}

/// Keys that split every way: stems of 1–8 bytes over a three-letter
/// alphabet with short suffixes (long shared prefixes, so chains of
/// nodes whose headers later split, and keys that are prefixes of
/// others), and 8-byte integers spread over a few top bytes (wide
/// nodes, type switches up to NODE_256).
fn universe(seed: u64, n: usize) -> Universe {
    let mut r = Rng::new(seed);
    let stems: Vec<Vec<u8>> = (0..24)
        .map(|_| {
            let len = 1 + r.below(8) as usize;
            (0..len).map(|_| b"xyz"[r.below(3) as usize]).collect()
        })
        .collect();
    let mut sorted = BTreeMap::new();
    let mut keys = Vec::with_capacity(n);
    while keys.len() < n {
        let k = if r.below(3) == 0 {
            ((r.below(4) << 56) | (r.below(1 << 20) * 0x0001_0203))
                .to_be_bytes()
                .to_vec()
        } else {
            let mut k = stems[r.below(stems.len() as u64) as usize].clone();
            for _ in 0..r.below(4) {
                k.push(b"xyz01"[r.below(5) as usize]);
            }
            k
        };
        if !sorted.contains_key(&k) {
            sorted.insert(k.clone(), keys.len());
            keys.push(k);
        }
    }
    Universe {
        keys,
        sorted,
        state: (0..n).map(|_| AtomicU8::new(0)).collect(),
    }
}

fn value_of(k: &[u8]) -> Vec<u8> {
    let mut v: Vec<u8> = k.iter().rev().copied().collect();
    v.push(b'!');
    v
}

fn cfg(scan_from_cache: bool) -> ArtConfig {
    ArtConfig {
        max_key: MAX_KEY,
        max_value: MAX_KEY + 1,
        cache_bytes: 1 << 20,
        scan_from_cache,
        chunk_bytes: 256 << 10,
        ..Default::default()
    }
}

/// Inserts the keys `ids` one by one, marking each invoked and returned.
async fn writer(ctx: Ctx, c: ArtClient, u: Arc<Universe>, ids: Vec<usize>) {
    for i in ids {
        let k = &u.keys[i];
        u.state[i].store(1, SeqCst);
        let fresh = c.insert(&ctx, k, &value_of(k)).await.expect("insert");
        assert!(fresh, "{k:02x?} is inserted once");
        u.state[i].store(2, SeqCst);
    }
}

/// Runs `scans` scans and ranges from random keys and checks each; returns
/// how many returned at least one entry.
async fn scanner(ctx: Ctx, c: ArtClient, u: Arc<Universe>, seed: u64, scans: usize) -> usize {
    let mut r = Rng::new(seed);
    let mut nonempty = 0;
    for s in 0..scans {
        let pick = |r: &mut Rng| u.keys[r.below(u.keys.len() as u64) as usize].clone();
        let mut lo = pick(&mut r);
        if r.below(4) == 0 {
            // A key that may not exist: cut or extended.
            let n = 1 + r.below(lo.len() as u64) as usize;
            lo.truncate(n);
            if r.below(2) == 0 && lo.len() < MAX_KEY {
                lo.push(r.below(256) as u8);
            }
        }
        let hi = (r.below(4) == 0).then(|| pick(&mut r).max(lo.clone()));
        let count = 1 + r.below(40) as usize;
        let must: Vec<bool> = u.state.iter().map(|s| s.load(SeqCst) == 2).collect();
        let got = match &hi {
            Some(h) => c.range(&ctx, &lo, h).await,
            None => c.scan(&ctx, &lo, count).await,
        }
        .expect("scan");
        let invoked: Vec<bool> = u.state.iter().map(|s| s.load(SeqCst) >= 1).collect();
        let what = format!("scan {s} from {lo:02x?} to {hi:02x?}, count {count}");
        check(&u, &must, &invoked, &lo, hi.as_deref(), count, &got, &what);
        nonempty += usize::from(!got.is_empty());
    }
    nonempty
}

/// The non-atomic scan's guarantee for one scan's result `got`: `must`
/// were present throughout it, keys not `invoked` absent throughout.
#[allow(clippy::too_many_arguments)]
fn check(
    u: &Universe,
    must: &[bool],
    invoked: &[bool],
    lo: &[u8],
    hi: Option<&[u8]>,
    count: usize,
    got: &[(Vec<u8>, Vec<u8>)],
    what: &str,
) {
    assert!(
        got.windows(2).all(|w| w[0].0 < w[1].0),
        "{what}: keys in order, once each"
    );
    assert!(hi.is_some() || got.len() <= count, "{what}: at most count");
    for (k, v) in got {
        assert!(
            k.as_slice() >= lo && hi.is_none_or(|h| k.as_slice() <= h),
            "{what}: {k:02x?} is out of range"
        );
        let Some(&i) = u.sorted.get(k) else {
            panic!("{what}: {k:02x?} was never inserted");
        };
        assert!(invoked[i], "{what}: {k:02x?} was absent throughout");
        assert_eq!(v, &value_of(k), "{what}: the value of {k:02x?}");
    }
    // Up to where the scan got: its last key when it stopped at `count`.
    let end: Option<&[u8]> = match hi {
        Some(h) => Some(h),
        None if got.len() >= count => got.last().map(|(k, _)| k.as_slice()),
        None => None,
    };
    for (k, &i) in u.sorted.range(lo.to_vec()..) {
        if end.is_some_and(|e| k.as_slice() > e) {
            break;
        }
        if must[i] {
            assert!(
                got.binary_search_by(|(g, _)| g.as_slice().cmp(k)).is_ok(),
                "{what}: {k:02x?} was present throughout but not returned"
            );
        }
    }
}

/// The tree's final state: every key, checked by the structural checker.
fn final_check(f: &dyn Fabric, tree: &Arc<ArtTree>, u: &Universe) {
    check_tree(tree).expect("structure");
    let (all, _) = on_worker(f, &tree.client(99_999), |ctx, c| async move {
        c.entries(&ctx).await.expect("entries")
    });
    let want: Vec<(Vec<u8>, Vec<u8>)> = u.sorted.keys().map(|k| (k.clone(), value_of(k))).collect();
    assert_eq!(all, want, "every key, once");
}

fn sum(all: &[TreeCounters]) -> TreeCounters {
    let mut t = TreeCounters::default();
    for c in all {
        t.cached_scan_starts += c.cached_scan_starts;
        t.header_splits += c.header_splits;
        t.leaf_splits += c.leaf_splits;
        t.type_switches += c.type_switches;
        t.restarts += c.restarts;
    }
    t
}

/// One simulated run: 2 compute machines × 2 workers, each with 2 writer
/// tasks and 2 scanner tasks; the tree's counters summed over clients.
fn sim_run(seed: u64, scan_from_cache: bool) -> TreeCounters {
    sim_run_with(seed, cfg(scan_from_cache))
}

fn sim_run_with(seed: u64, config: ArtConfig) -> TreeCounters {
    let mut r = Rng::new(seed);
    let mut sim = Sim::new(SimConfig {
        profile: Profile::cx6(),
        compute_machines: 2,
        memory_nodes: 2,
        memory_bytes: 96 << 20,
        page_size: 4096,
        seed,
        in_order_write: r.below(2) == 0,
        ..SimConfig::default()
    })
    .expect("a simulator");
    let f = sim.dyn_fabric();
    let tree = ArtTree::create(f.clone(), "scans", config).expect("create");
    let u = Arc::new(universe(seed, 1200));
    let (workers, writers, scanners) = (4, 2, 2);
    let mut clients = Vec::new();
    for wi in 0..workers {
        let machine = wi % 2;
        let th = sim
            .add_worker(machine, |f: &dyn Fabric, clock| {
                Worker::builder(f)
                    .clock(clock)
                    .id(wi)
                    .tasks(writers + scanners)
                    .local(tree.local_layout())
                    .build()
            })
            .expect("a worker");
        for t in 0..writers + scanners {
            let id = (wi * (writers + scanners) + t) as u64;
            let c = tree.client_on(machine, id);
            clients.push(c.clone());
            let u = u.clone();
            if t < writers {
                let slot = wi * writers + t;
                let ids: Vec<usize> = (0..u.keys.len())
                    .filter(|i| i % (workers * writers) == slot)
                    .collect();
                sim.worker_mut(th).spawn(move |ctx| writer(ctx, c, u, ids));
            } else {
                let s = seed ^ (id << 20);
                sim.worker_mut(th).spawn(move |ctx| async move {
                    scanner(ctx, c, u, s, 60).await;
                });
            }
        }
    }
    let o = sim.run();
    assert_eq!(o.blocked, 0, "seed {seed}: no task blocked");
    let counters: Vec<TreeCounters> = clients.iter().map(|c| c.counters()).collect();
    final_check(f.as_ref(), &tree, &u);
    sum(&counters)
}

/// Twelve seeds with scans from the cache: the guarantee holds, the scans
/// did start below the root, and the inserts split headers meanwhile.
#[test]
fn scans_from_the_cache_racing_splits_on_the_simulator() {
    let mut total = Vec::new();
    for seed in 1..=12 {
        total.push(sim_run(seed, true));
    }
    let t = sum(&total);
    assert!(t.cached_scan_starts > 500, "{t:?}");
    assert!(t.header_splits > 20 && t.leaf_splits > 1000, "{t:?}");
    assert!(t.type_switches > 50, "{t:?}");
}

/// Figure 17's other designs: the finer node sizes and the hash-indexed
/// cache, with scans from the cache.
#[test]
fn scans_from_a_hash_indexed_cache_over_finer_nodes_racing_splits() {
    use dmkit_art::cache::CacheIndex;
    use dmkit_art::layout::NodeLayout;
    let mut total = Vec::new();
    for seed in 201..=204 {
        let config = ArtConfig {
            node_layout: NodeLayout::Homogeneous,
            cache_index: CacheIndex::Hash,
            ..cfg(true)
        };
        total.push(sim_run_with(seed, config));
    }
    let t = sum(&total);
    assert!(t.cached_scan_starts > 100, "{t:?}");
}

/// The same race with every scan from the root.
#[test]
fn scans_from_the_root_racing_splits_on_the_simulator() {
    let mut total = Vec::new();
    for seed in 101..=106 {
        total.push(sim_run(seed, false));
    }
    let t = sum(&total);
    assert_eq!(t.cached_scan_starts, 0, "{t:?}");
    assert!(t.header_splits > 10, "{t:?}");
}

/// The race on threads of one machine (one shared cache): 2 writer and 2
/// scanner threads, each a worker with 2 tasks, under both settings.
#[test]
fn scans_racing_splits_on_threads() {
    for scan_from_cache in [true, false] {
        let f = conformance::shm_fabric(2, 256 << 20);
        let tree = ArtTree::create(f.clone(), "scans-threads", cfg(scan_from_cache)).unwrap();
        let u = Arc::new(universe(77, 3000));
        let tasks = 2;
        let counters: Vec<(TreeCounters, usize)> = std::thread::scope(|s| {
            let handles: Vec<_> = (0..4)
                .map(|wi| {
                    let (f, tree, u) = (f.clone(), tree.clone(), u.clone());
                    s.spawn(move || {
                        let mut w = Worker::builder(f.as_ref())
                            .id(wi)
                            .tasks(tasks)
                            .local(tree.local_layout())
                            .build()
                            .expect("a worker");
                        let mut clients = Vec::new();
                        let nonempty = Arc::new(std::sync::atomic::AtomicUsize::new(0));
                        for t in 0..tasks {
                            let id = (wi * tasks + t) as u64;
                            let c = tree.client(id);
                            clients.push(c.clone());
                            let u = u.clone();
                            if wi < 2 {
                                let slot = wi * tasks + t;
                                let ids: Vec<usize> = (0..u.keys.len())
                                    .filter(|i| i % (2 * tasks) == slot)
                                    .collect();
                                w.spawn(move |ctx| writer(ctx, c, u, ids));
                            } else {
                                let ne = nonempty.clone();
                                w.spawn(move |ctx| async move {
                                    let n = scanner(ctx, c, u, 1000 + id, 400).await;
                                    ne.fetch_add(n, SeqCst);
                                });
                            }
                        }
                        w.run();
                        let c: Vec<TreeCounters> = clients.iter().map(|c| c.counters()).collect();
                        (sum(&c), nonempty.load(SeqCst))
                    })
                })
                .collect();
            handles.into_iter().map(|h| h.join().unwrap()).collect()
        });
        final_check(f.as_ref(), &tree, &u);
        let t = sum(&counters.iter().map(|c| c.0).collect::<Vec<_>>());
        let nonempty: usize = counters.iter().map(|c| c.1).sum();
        assert!(nonempty > 400, "scans found keys: {nonempty}");
        assert!(t.header_splits > 0, "{t:?}");
        if scan_from_cache {
            assert!(t.cached_scan_starts > 100, "{t:?}");
        } else {
            assert_eq!(t.cached_scan_starts, 0, "{t:?}");
        }
        tree.destroy().unwrap();
    }
}
