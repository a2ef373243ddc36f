//! The conformance suite of the map contract (feature `conformance`):
//! what every remote index must pass, written once.
//!
//! - [`sequential_model`]: random operations checked one by one against a
//!   `BTreeMap`, then a full scan and a second, cold handle;
//! - [`bad_input`]: keys and values outside the limits are typed errors
//!   that change nothing;
//! - [`lifecycle`]: create, create again, open, open a missing name,
//!   destroy (every byte back), destroy again, a bad name, reuse of a name;
//! - [`ordering`]: range scans of an ordered map against the model, or
//!   [`IndexError::Unsupported`] from an unordered one;
//! - [`linearizable_threads`] and [`linearizable_processes`]: a contended
//!   workload ([`stress`]) whose history is checked for linearizability
//!   (`dmkit-lincheck`), on worker threads and on processes sharing a
//!   memory node. The simulator runs the same workload under fault
//!   injection (`dmkit sim check`);
//! - [`ordered_model_ops`] and [`fill_until_out_of_memory`]: the ordered
//!   trees' model run with scans (keys of their choosing) and the run
//!   into memory exhaustion, for their own tests.
//!
//! Each check panics with what went wrong (it is test support). The
//! multi-process check runs the test binary itself again as the children
//! ([`run_processes`], [`child`]): no helper binaries ship with the
//! libraries.

pub mod stress;

use std::cell::RefCell;
use std::collections::BTreeMap;
use std::rc::Rc;
use std::sync::Arc;

use dmkit_fabric::shm::{ShmConfig, ShmFabric, Target};
use dmkit_fabric::Fabric;
use dmkit_runtime::rng::Rng;
use dmkit_runtime::{Ctx, RuntimeConfig, Worker, WorkerStats};

use crate::{Entries, IndexConfig, IndexError, MapClient, RemoteMap};
pub use stress::{StressConfig, StressRecord};

/// A fabric of `nodes` embedded shm memory nodes of `size` bytes each.
///
/// # Panics
/// If the nodes cannot be made (test setup).
pub fn shm_fabric(nodes: u16, size: u64) -> Arc<ShmFabric> {
    let cfgs: Vec<dmkit_memnode::NodeConfig> = (0..nodes)
        .map(|i| dmkit_memnode::NodeConfig {
            node_id: i,
            size,
            ..Default::default()
        })
        .collect();
    Arc::new(ShmFabric::embedded(ShmConfig::default(), &cfgs).expect("embedded memory nodes"))
}

/// Runs `body` as the only task of a fresh worker on `f` (sized for the
/// client's local layout), to completion; returns what it returned and
/// the worker's statistics.
pub fn on_worker<C, T, F, Fut>(f: &dyn Fabric, client: &C, body: F) -> (T, WorkerStats)
where
    C: MapClient,
    T: 'static,
    F: FnOnce(Ctx, C) -> Fut + 'static,
    Fut: std::future::Future<Output = T> + 'static,
{
    let mut w = Worker::builder(f)
        .local(client.local_layout())
        .build()
        .expect("a worker on a working fabric");
    let out: Rc<RefCell<Option<T>>> = Rc::default();
    let (o, c) = (out.clone(), client.clone());
    w.spawn(move |ctx| async move {
        let v = body(ctx, c).await;
        *o.borrow_mut() = Some(v);
    });
    w.run();
    let stats = w.stats();
    let v = out.borrow_mut().take().expect("the task finished");
    (v, stats)
}

/// Runs `tasks` tasks on one fresh worker on `f` (task `t` gets `t`, its
/// context and a clone of `client`) until all finish; returns the worker's
/// statistics. Contention among one worker's tasks (hand-overs, combining)
/// is what such tests look at.
pub fn on_worker_tasks<C, F, Fut>(f: &dyn Fabric, client: &C, tasks: usize, body: F) -> WorkerStats
where
    C: MapClient,
    F: Fn(usize, Ctx, C) -> Fut + Clone + 'static,
    Fut: std::future::Future<Output = ()> + 'static,
{
    let mut w = Worker::builder(f)
        .tasks(tasks)
        .local(client.local_layout())
        .build()
        .expect("a worker on a working fabric");
    for t in 0..tasks {
        let (c, body) = (client.clone(), body.clone());
        w.spawn(move |ctx| body(t, ctx, c));
    }
    w.run();
    w.stats()
}

/// Test key `i` within the configuration's key limits: `key-000042` (or
/// the number's big-endian bytes when keys must be shorter), padded to the
/// shortest key accepted. Distinct for distinct `i`.
pub fn test_key(cfg: &impl IndexConfig, i: u64) -> Vec<u8> {
    let (min, max) = cfg.key_limits();
    let mut k = if max >= 10 {
        format!("key-{i:06}").into_bytes()
    } else {
        i.to_be_bytes()[8 - max.min(8)..].to_vec()
    };
    if k.len() < min {
        k.resize(min, b'.');
    }
    k
}

fn lcg(x: &mut u64) -> u64 {
    *x = x
        .wrapping_mul(6364136223846793005)
        .wrapping_add(1442695040888963407);
    *x >> 20
}

/// `steps` random inserts, updates, deletes and searches over `keys` keys,
/// checked one by one against a `BTreeMap`; then every key, the full scan,
/// and a second handle opened on the map (cold caches) reading every key.
/// Returns the model and the first client (for its counters). Destroys
/// the map.
///
/// # Panics
/// On any difference from the model.
pub fn sequential_model<M: RemoteMap>(
    f: Arc<dyn Fabric>,
    cfg: M::Config,
    keys: u64,
    steps: u64,
) -> (BTreeMap<Vec<u8>, Vec<u8>>, M::Client) {
    let map = M::create(f.clone(), "conformance-seq", cfg.clone()).expect("create");
    let client = map.client(1);
    let kc = cfg.clone();
    let (model, _) = on_worker(f.as_ref(), &client, move |ctx, c| async move {
        let mut model: BTreeMap<Vec<u8>, Vec<u8>> = BTreeMap::new();
        let mut x = 7u64;
        for step in 0..steps {
            let r = lcg(&mut x);
            let k = test_key(&kc, r % keys);
            let v = format!("val-{step}").into_bytes();
            match (r >> 20) % 10 {
                0..4 => {
                    let ins = c.insert(&ctx, &k, &v).await.expect("insert");
                    assert_eq!(ins, !model.contains_key(&k), "insert {k:?} at step {step}");
                    model.entry(k).or_insert(v);
                }
                4..6 => {
                    let up = c.update(&ctx, &k, &v).await.expect("update");
                    assert_eq!(up, model.contains_key(&k), "update {k:?} at step {step}");
                    if let Some(old) = model.get_mut(&k) {
                        *old = v;
                    }
                }
                6 => {
                    let del = c.delete(&ctx, &k).await.expect("delete");
                    assert_eq!(
                        del,
                        model.remove(&k).is_some(),
                        "delete {k:?} at step {step}"
                    );
                }
                _ => assert_eq!(
                    c.search(&ctx, &k).await.expect("search"),
                    model.get(&k).cloned(),
                    "search {k:?} at step {step}"
                ),
            }
        }
        for i in 0..keys {
            let k = test_key(&kc, i);
            assert_eq!(
                c.search(&ctx, &k).await.expect("search"),
                model.get(&k).cloned()
            );
        }
        let mut all = c.entries(&ctx).await.expect("entries");
        all.sort();
        assert_eq!(
            all,
            model.clone().into_iter().collect::<Vec<_>>(),
            "full scan"
        );
        model
    });
    let other = M::open(f.clone(), "conformance-seq", cfg).expect("open");
    let c2 = other.client(2);
    let m2 = model.clone();
    on_worker(f.as_ref(), &c2, move |ctx, c| async move {
        for (k, v) in &m2 {
            assert_eq!(c.search(&ctx, k).await.expect("search").as_ref(), Some(v));
        }
    });
    map.destroy().expect("destroy");
    (model, client)
}

/// Keys and values outside the configuration's limits are typed errors
/// and change nothing; the map stays usable.
///
/// # Panics
/// On an operation that accepts bad input or changes the map.
pub fn bad_input<M: RemoteMap>(f: Arc<dyn Fabric>, cfg: M::Config) {
    let map = M::create(f.clone(), "conformance-bad", cfg.clone()).expect("create");
    let (min, max) = cfg.key_limits();
    let max_value = cfg.max_value();
    let good = test_key(&cfg, 1);
    let other = test_key(&cfg, 2);
    on_worker(f.as_ref(), &map.client(1), move |ctx, c| async move {
        assert!(c.insert(&ctx, &good, b"v").await.expect("insert"));
        let long = vec![b'x'; max + 1];
        let short = vec![b'x'; min.saturating_sub(1)];
        fn key_error<T>(r: &Result<T, IndexError>, len: usize) -> bool {
            matches!(r, Err(IndexError::KeyLength { len: l, .. }) if *l == len)
        }
        let r = c.insert(&ctx, &long, b"v").await;
        assert!(
            key_error(&r, max + 1),
            "insert of a {}-byte key: {r:?}",
            max + 1
        );
        let r = c.search(&ctx, &short).await;
        assert!(
            key_error(&r, short.len()),
            "search of a {}-byte key: {r:?}",
            short.len()
        );
        let r = c.update(&ctx, &long, b"v").await;
        assert!(key_error(&r, max + 1), "update: {r:?}");
        let r = c.delete(&ctx, &short).await;
        assert!(key_error(&r, short.len()), "delete: {r:?}");
        let big = vec![0u8; max_value + 1];
        let r = c.update(&ctx, &good, &big).await;
        assert!(
            matches!(r, Err(IndexError::ValueTooLarge { len, max }) if len == max_value + 1 && max == max_value),
            "update with a {}-byte value: {r:?}",
            max_value + 1
        );
        let r = c.insert(&ctx, &other, &big).await;
        assert!(matches!(r, Err(IndexError::ValueTooLarge { .. })), "{r:?}");
        assert_eq!(
            c.search(&ctx, &good).await.expect("search"),
            Some(b"v".to_vec())
        );
        assert_eq!(c.search(&ctx, &other).await.expect("search"), None);
        assert_eq!(
            c.entries(&ctx).await.expect("entries"),
            vec![(good.clone(), b"v".to_vec())]
        );
        // Still usable.
        assert!(c.update(&ctx, &good, b"w").await.expect("update"));
        assert!(c.delete(&ctx, &good).await.expect("delete"));
        assert_eq!(c.entries(&ctx).await.expect("entries"), vec![]);
    });
    map.destroy().expect("destroy");
}

/// Create, open and destroy, and their errors: a taken name, a missing
/// one, a second destroy, a name the node cannot keep; each handle holds
/// the map, and the last handle's destroy returns every byte the map and
/// all handles' clients took; a destroyed name can be
/// created again (fresh and empty).
///
/// # Panics
/// On any deviation.
pub fn lifecycle<M: RemoteMap>(f: Arc<dyn Fabric>, cfg: M::Config) {
    let free = |f: &Arc<dyn Fabric>| -> u64 {
        f.nodes()
            .iter()
            .map(|&n| f.node_stats(n).expect("node stats").heap_free_bytes)
            .sum()
    };
    let before = free(&f);
    let map = M::create(f.clone(), "conformance-life", cfg.clone()).expect("create");
    let created = free(&f);
    assert!(created < before, "a map takes memory");
    let kind = M::KIND;
    let r = M::create(f.clone(), "conformance-life", cfg.clone());
    assert!(
        matches!(&r, Err(IndexError::AlreadyExists { kind: k, name }) if *k == kind && name == "conformance-life"),
        "second create: {:?}",
        r.err()
    );
    let r = M::open(f.clone(), "conformance-none", cfg.clone());
    assert!(
        matches!(&r, Err(IndexError::NotFound { .. })),
        "open of a missing name: {:?}",
        r.err()
    );
    for bad in ["", "a name", &"n".repeat(80)] {
        let r = M::create(f.clone(), bad, cfg.clone());
        assert!(
            matches!(&r, Err(IndexError::Config { .. })),
            "create {bad:?}: {:?}",
            r.err()
        );
    }
    assert_eq!(free(&f), created, "failed creates leave nothing behind");
    // Written through one handle, read through another.
    let kc = cfg.clone();
    on_worker(f.as_ref(), &map.client(1), move |ctx, c| async move {
        for i in 0..300 {
            assert!(c
                .insert(&ctx, &test_key(&kc, i), b"v")
                .await
                .expect("insert"));
        }
    });
    let other = M::open(f.clone(), "conformance-life", cfg.clone()).expect("open");
    let kc = cfg.clone();
    on_worker(f.as_ref(), &other.client(2), move |ctx, c| async move {
        for i in 0..300 {
            assert_eq!(
                c.search(&ctx, &test_key(&kc, i)).await.expect("search"),
                Some(b"v".to_vec())
            );
        }
        // The second handle's clients write too: their chunks are the
        // structure's, not this handle's.
        for i in 300..600 {
            assert!(c
                .insert(&ctx, &test_key(&kc, i), b"w")
                .await
                .expect("insert"));
        }
    });
    assert!(free(&f) < before);
    // Each handle holds the structure: the first destroy detaches its
    // handle (and succeeds), the structure stays the other's ...
    map.destroy().expect("destroy");
    assert!(free(&f) < before, "the other handle still holds the map");
    let r = map.destroy();
    assert!(
        matches!(&r, Err(IndexError::NotFound { .. })),
        "second destroy of one handle: {r:?}"
    );
    let kc = cfg.clone();
    on_worker(f.as_ref(), &other.client(4), move |ctx, c| async move {
        assert_eq!(
            c.search(&ctx, &test_key(&kc, 450)).await.expect("search"),
            Some(b"w".to_vec())
        );
    });
    // ... and the last handle's destroy returns every byte both handles'
    // clients took (issue 36: a second handle's destroy used to fail
    // before freeing anything).
    other.destroy().expect("destroy via the last handle");
    assert_eq!(free(&f), before, "the last destroy returns every chunk");
    let r = other.destroy();
    assert!(
        matches!(&r, Err(IndexError::NotFound { .. })),
        "destroy again: {r:?}"
    );
    let r = M::open(f.clone(), "conformance-life", cfg.clone());
    assert!(
        matches!(&r, Err(IndexError::NotFound { .. })),
        "open after destroy: {:?}",
        r.err()
    );
    let again = M::create(f.clone(), "conformance-life", cfg.clone()).expect("create again");
    let kc = cfg.clone();
    on_worker(f.as_ref(), &again.client(3), move |ctx, c| async move {
        assert_eq!(
            c.search(&ctx, &test_key(&kc, 1)).await.expect("search"),
            None
        );
        assert_eq!(c.entries(&ctx).await.expect("entries"), vec![]);
    });
    again.destroy().expect("destroy");
    assert_eq!(free(&f), before);
}

/// Range scans: an ordered map returns `count` entries from `from` in key
/// order, as the model does, at the start, middle and end of the key
/// space and past it; an unordered map refuses with
/// [`IndexError::Unsupported`].
///
/// # Panics
/// On any difference.
pub fn ordering<M: RemoteMap>(f: Arc<dyn Fabric>, cfg: M::Config) {
    let map = M::create(f.clone(), "conformance-scan", cfg.clone()).expect("create");
    let kc = cfg.clone();
    on_worker(f.as_ref(), &map.client(1), move |ctx, c| async move {
        let mut model = BTreeMap::new();
        for i in (0..400).rev() {
            let k = test_key(&kc, i * 7 % 400);
            let v = format!("v{i}").into_bytes();
            c.insert(&ctx, &k, &v).await.expect("insert");
            model.insert(k, v);
        }
        for i in (0..400).step_by(11) {
            let k = test_key(&kc, i);
            c.delete(&ctx, &k).await.expect("delete");
            model.remove(&k);
        }
        if !M::ORDERED {
            let r = c.scan(&ctx, &test_key(&kc, 0), 10).await;
            assert!(matches!(r, Err(IndexError::Unsupported { .. })), "{r:?}");
            return;
        }
        for (from, count) in [(0, 25), (123, 60), (390, 50), (0, 1000)] {
            let k = test_key(&kc, from);
            let want: Vec<_> = model
                .range(k.clone()..)
                .take(count)
                .map(|(k, v)| (k.clone(), v.clone()))
                .collect();
            let got = c.scan(&ctx, &k, count).await.expect("scan");
            assert_eq!(got, want, "scan of {count} from key {from}");
        }
        let past = vec![0xFF; kc.key_limits().1];
        assert_eq!(c.scan(&ctx, &past, 10).await.expect("scan"), vec![]);
    });
    map.destroy().expect("destroy");
}

/// `steps` random operations of an ordered map, run on `c` in `ctx` and
/// checked one by one against a `BTreeMap`: 40% inserts, 20% updates,
/// 10% deletes, 10% scans of 1 to 20 entries and 20% searches, on keys
/// drawn by `key_of` from an [`Rng`] seeded with `seed`; then the full
/// scan against the model. Returns the full scan. What the ordered
/// trees run with keys that exercise their own split paths, under
/// configurations [`sequential_model`] does not reach.
///
/// # Panics
/// On any difference from the model or any operation error.
pub async fn ordered_model_ops<C: MapClient>(
    ctx: &Ctx,
    c: &C,
    seed: u64,
    steps: u64,
    mut key_of: impl FnMut(&mut Rng) -> Vec<u8>,
) -> Entries {
    let mut r = Rng::new(seed);
    let mut model: BTreeMap<Vec<u8>, Vec<u8>> = BTreeMap::new();
    for i in 0..steps {
        let k = key_of(&mut r);
        let v = format!("v{i}").into_bytes();
        match r.below(10) {
            0..4 => {
                let got = c.insert(ctx, &k, &v).await.unwrap();
                let want = !model.contains_key(&k);
                assert_eq!(got, want, "insert {k:02x?} at op {i}");
                model.entry(k).or_insert(v);
            }
            4..6 => {
                let got = c.update(ctx, &k, &v).await.unwrap();
                assert_eq!(got, model.contains_key(&k), "update {k:02x?} at op {i}");
                if let Some(x) = model.get_mut(&k) {
                    *x = v;
                }
            }
            6 => {
                let got = c.delete(ctx, &k).await.unwrap();
                assert_eq!(got, model.remove(&k).is_some(), "delete {k:02x?} at op {i}");
            }
            7 => {
                let n = 1 + r.below(20) as usize;
                let got = c.scan(ctx, &k, n).await.unwrap();
                let want: Entries = model
                    .range(k.clone()..)
                    .take(n)
                    .map(|(a, b)| (a.clone(), b.clone()))
                    .collect();
                assert_eq!(got, want, "scan {n} from {k:02x?} at op {i}");
            }
            _ => {
                let got = c.search(ctx, &k).await.unwrap();
                assert_eq!(got.as_ref(), model.get(&k), "search {k:02x?} at op {i}");
            }
        }
    }
    let all = c.entries(ctx).await.unwrap();
    let want: Entries = model.into_iter().collect();
    assert_eq!(all, want, "entries");
    all
}

/// Inserts 8-byte keys (`n · 7919`, big-endian) with the value `value`
/// on `c` until the memory node runs out: the insert that finds no memory must
/// be [`IndexError::OutOfMemory`], and the map stays usable after it —
/// every key inserted before reads back and takes an update. Returns how
/// many keys went in.
///
/// # Panics
/// On any other outcome, or if a million inserts never ran out.
pub async fn fill_until_out_of_memory<C: MapClient>(ctx: &Ctx, c: &C) -> u64 {
    let mut n = 0u64;
    loop {
        let k = (n * 7919).to_be_bytes();
        match c.insert(ctx, &k, b"value").await {
            Ok(true) => n += 1,
            Ok(false) => panic!("fresh key reported present"),
            Err(IndexError::OutOfMemory { .. }) => break,
            Err(e) => panic!("unexpected {e}"),
        }
        assert!(n < 1_000_000, "never ran out");
    }
    for i in 0..n {
        let k = (i * 7919).to_be_bytes();
        assert_eq!(c.search(ctx, &k).await.unwrap(), Some(b"value".to_vec()));
        assert!(c.update(ctx, &k, b"other").await.unwrap());
    }
    n
}

/// The contended workload of `sc` on worker threads of this process,
/// checked for linearizability with the final state of every hot key and
/// the full scan; then `after` (e.g. a structural checker) looks at the
/// quiescent map before it is destroyed. Returns how many inserts,
/// updates and deletes found their key in the other state (a measure of
/// contention: a run without any tested nothing).
///
/// # Panics
/// On an operation error or a history that is not linearizable.
pub fn linearizable_threads<M: RemoteMap>(
    f: Arc<dyn Fabric>,
    cfg: M::Config,
    sc: &StressConfig,
    after: impl FnOnce(&dyn Fabric, &Arc<M>),
) -> usize {
    let map = M::create(f.clone(), "conformance-lin", cfg).expect("create");
    let h = stress::run(
        f.as_ref(),
        map.local_layout(),
        &|id| map.client(id),
        &RuntimeConfig::default(),
        sc,
    )
    .unwrap_or_else(|e| panic!("stress run failed: {e}"));
    assert!(h.len() >= sc.workers * sc.tasks * sc.ops_per_task);
    let conflicts = conflicts(&h);
    final_check(f.as_ref(), &map, sc.hot_keys, h);
    after(f.as_ref(), &map);
    map.destroy().expect("destroy");
    conflicts
}

/// Inserts, updates and deletes of a history that found their key in the
/// other state.
pub fn conflicts(h: &[StressRecord]) -> usize {
    h.iter()
        .filter(|r| matches!(r.returned, Some((_, dmkit_lincheck::MapRet::Done(false)))))
        .count()
}

/// Reads every hot key and the whole map from a quiescent map and checks
/// the history `h` with them (see [`stress::verify`]).
///
/// # Panics
/// If the history is not linearizable or the state disagrees with it.
pub fn final_check<M: RemoteMap>(f: &dyn Fabric, map: &Arc<M>, hot: u64, h: Vec<StressRecord>) {
    let ((finals, scan), _) = on_worker(f, &map.client(99_999), move |ctx, c| async move {
        stress::final_reads(&ctx, &c, hot)
            .await
            .expect("final reads")
    });
    if let Err(e) = stress::verify(h, finals, &scan) {
        panic!("{e}");
    }
}

/// A memory node served on a Unix socket by this process, and a fabric
/// connected to it: the setup of the multi-process tests.
pub struct ServedNode {
    _dir: tempfile::TempDir,
    /// The node's socket.
    pub socket: std::path::PathBuf,
    _running: dmkit_memnode::server::Running,
    /// A fabric connected to the node.
    pub fabric: Arc<ShmFabric>,
}

/// Serves a `size`-byte memory node on a fresh socket.
///
/// # Panics
/// If the node cannot be made (test setup).
pub fn serve_node(size: u64) -> ServedNode {
    use dmkit_memnode::server::{default_token_path, Server};
    let dir = tempfile::tempdir().expect("a temporary directory");
    let socket = dir.path().join("node.sock");
    let node = dmkit_memnode::MemNode::new(dmkit_memnode::NodeConfig {
        size,
        ..Default::default()
    })
    .expect("a memory node");
    let running = Server::bind(node, &socket, &default_token_path(&socket))
        .expect("bind the node's socket")
        .spawn()
        .expect("serve the node");
    let fabric = Arc::new(
        ShmFabric::open(ShmConfig::default(), &[Target::new(&socket)])
            .expect("connect to the node"),
    );
    ServedNode {
        _dir: dir,
        socket,
        _running: running,
        fabric,
    }
}

/// The environment variable that makes a test binary a conformance child.
const CHILD_ENV: &str = "DMKIT_CONFORMANCE_CHILD";

/// The contended workload of `sc` in `procs` processes at once, each with
/// its workers, on map `name` of the node at `node.socket` (the map must
/// exist); returns the merged history (each child's seed and client ids
/// distinct). The children are this test binary, run again with only the
/// test `child_test` selected: that test calls [`child`].
///
/// # Panics
/// If a child fails or writes a line that is not a history record.
pub fn run_processes(
    child_test: &str,
    node: &ServedNode,
    name: &str,
    procs: u32,
    sc: &StressConfig,
) -> Vec<StressRecord> {
    let (children, _out, _) = spawn_children(child_test, node, name, procs, sc);
    let mut h = Vec::new();
    for (c, file) in children {
        let res = c.wait_with_output().expect("wait for a child");
        assert!(
            res.status.success(),
            "child failed: {}",
            String::from_utf8_lossy(&res.stderr)
        );
        let text = std::fs::read_to_string(&file).expect("the child's history");
        assert!(!text.is_empty(), "child wrote no history");
        for l in text.lines() {
            h.push(stress::from_line(l).unwrap_or_else(|| panic!("bad history line {l:?}")));
        }
    }
    h
}

/// The children of [`run_processes`], started: each with the file it will
/// write its history to, the directory of those files, and the common
/// start ([`stress::host_now`] ns).
type Children = (
    Vec<(std::process::Child, std::path::PathBuf)>,
    tempfile::TempDir,
    u64,
);

fn spawn_children(
    child_test: &str,
    node: &ServedNode,
    name: &str,
    procs: u32,
    sc: &StressConfig,
) -> Children {
    let exe = std::env::current_exe().expect("the test binary's path");
    let out = tempfile::tempdir().expect("a temporary directory");
    let start = stress::host_now() + 300_000_000;
    let children: Vec<_> = (0..procs)
        .map(|p| {
            let file = out.path().join(format!("child-{p}.history"));
            let spec = [
                node.socket.to_str().expect("a UTF-8 path").to_string(),
                name.to_string(),
                file.to_str().expect("a UTF-8 path").to_string(),
            ]
            .into_iter()
            .chain(
                [
                    sc.workers as u64,
                    sc.tasks as u64,
                    sc.ops_per_task as u64,
                    sc.hot_keys,
                    sc.fill_percent as u64,
                    sc.seed + 100 + p as u64,
                    sc.client_base as u64 + 1000 * (p as u64 + 1),
                    start,
                ]
                .map(|v| v.to_string()),
            )
            .collect::<Vec<_>>()
            .join(" ");
            let child = std::process::Command::new(&exe)
                .args([
                    child_test,
                    "--exact",
                    "--ignored",
                    "--nocapture",
                    "--test-threads=1",
                ])
                .env(CHILD_ENV, spec)
                .stdout(std::process::Stdio::null())
                .stderr(std::process::Stdio::piped())
                .spawn()
                .expect("spawn a child test process");
            (child, file)
        })
        .collect();
    (children, out, start)
}

/// A lease for the tests where nobody dies: 5 s, which no live holder
/// outlasts even descheduled on a loaded machine. Under the 100 ms default
/// a holder preempted that long (seen on two cores shared by several test
/// binaries) has its lock broken by another client and stops with a lost
/// lease — by design, but a spurious failure of a test that kills no one.
/// Breaking a dead holder's lease is what [`crash_lease`]'s tests check.
pub fn live_lease() -> crate::LeaseConfig {
    crate::LeaseConfig {
        lease: 5_000_000_000,
        ..crate::LeaseConfig::default()
    }
}

/// The lease of the crash test's locks ([`killed_processes`]), in its
/// children and its survivor: 50 ms, so survivors wait little for a dead
/// holder's.
pub fn crash_lease() -> crate::LeaseConfig {
    crate::LeaseConfig {
        lease: 50_000_000,
        skew: 1_000_000,
    }
}

/// The crash test on shm with real processes: two children (this test
/// binary again, test `child_test`, which calls [`child`] with
/// [`crash_lease`]) run the contended workload — 2 workers × 4 tasks on 8
/// hot keys, 5 % fills — on a fresh map and are killed with SIGKILL 400 ms
/// past their common start: mid-operation, holding whatever locks they
/// held. Then this process runs 4 tasks × 300 operations over the same
/// keys with its own clients (`cfg`): every operation must complete — the
/// dead holders' leases are broken, nothing waits for ever — and `after`
/// checks the quiescent map (e.g. its structural checker's after-crash
/// form). Returns the survivor's operations.
///
/// # Panics
/// If a child ended before it was killed, a survivor's operation failed, or
/// `after` panics.
pub fn killed_processes<M: RemoteMap>(
    child_test: &str,
    cfg: M::Config,
    after: impl FnOnce(&dyn Fabric, &Arc<M>),
) -> usize {
    let (procs, kill_after) = (2, std::time::Duration::from_millis(400));
    let sc = StressConfig {
        workers: 2,
        tasks: 4,
        ops_per_task: 1_000_000,
        hot_keys: 8,
        fill_percent: 5,
        seed: 11,
        client_base: 0,
    };
    let survivor = StressConfig {
        workers: 1,
        tasks: 4,
        ops_per_task: 300,
        fill_percent: 10,
        seed: 12,
        client_base: 9,
        ..sc.clone()
    };
    let node = serve_node(256 << 20);
    let f: Arc<dyn Fabric> = node.fabric.clone();
    let map = M::create(f.clone(), "conformance-killed", cfg).expect("create");
    let (children, _out, start) =
        spawn_children(child_test, &node, "conformance-killed", procs, &sc);
    let kill_at = start + kill_after.as_nanos() as u64;
    while stress::host_now() < kill_at {
        std::thread::sleep(std::time::Duration::from_millis(1));
    }
    for (mut c, _) in children {
        let running = c.try_wait().expect("poll a child").is_none();
        c.kill().expect("SIGKILL a child");
        let res = c.wait_with_output().expect("reap a child");
        assert!(
            running,
            "a child ended before it was killed: {}",
            String::from_utf8_lossy(&res.stderr)
        );
    }
    let h = stress::run(
        f.as_ref(),
        map.local_layout(),
        &|id| map.client(id),
        &RuntimeConfig::default(),
        &survivor,
    )
    .unwrap_or_else(|e| panic!("a survivor's operation failed after the kill: {e}"));
    after(f.as_ref(), &map);
    h.len()
}

/// The body of the test that [`run_processes`] runs as a child: reads its
/// work from the environment, opens the map with `cfg` (client settings;
/// structure from the map), waits for the common start, runs the workload
/// and writes its history. Run any other way it does nothing.
///
/// # Panics
/// If the work cannot be done (the parent reports the child's stderr).
pub fn child<M: RemoteMap>(cfg: M::Config) {
    let Ok(spec) = std::env::var(CHILD_ENV) else {
        return;
    };
    let a: Vec<&str> = spec.split(' ').collect();
    assert_eq!(a.len(), 11, "child spec: {spec:?}");
    let n = |i: usize| {
        a[i].parse::<u64>()
            .expect("numeric field of the child spec")
    };
    let fabric: Arc<dyn Fabric> = Arc::new(
        ShmFabric::open(ShmConfig::default(), &[Target::new(a[0])])
            .unwrap_or_else(|e| panic!("connect {}: {e}", a[0])),
    );
    let map = M::open(fabric.clone(), a[1], cfg).unwrap_or_else(|e| panic!("open {}: {e}", a[1]));
    let sc = StressConfig {
        workers: n(3) as usize,
        tasks: n(4) as usize,
        ops_per_task: n(5) as usize,
        hot_keys: n(6),
        fill_percent: n(7) as u32,
        seed: n(8),
        client_base: n(9) as u32,
    };
    while stress::host_now() < n(10) {
        std::thread::sleep(std::time::Duration::from_micros(200));
    }
    let h = stress::run(
        fabric.as_ref(),
        map.local_layout(),
        &|id| map.client(id),
        &RuntimeConfig::default(),
        &sc,
    )
    .unwrap_or_else(|e| panic!("stress run failed: {e}"));
    let text: String = h.iter().map(|r| stress::to_line(r) + "\n").collect();
    std::fs::write(a[2], text).expect("write the history");
}

/// The contended workload in `procs` child processes sharing a served
/// memory node (see [`run_processes`]), checked for linearizability; then
/// `after` looks at the quiescent map before it is destroyed. Returns the
/// history's [`conflicts`].
///
/// # Panics
/// If a child fails or the merged history is not linearizable.
pub fn linearizable_processes<M: RemoteMap>(
    child_test: &str,
    node_size: u64,
    cfg: M::Config,
    procs: u32,
    sc: &StressConfig,
    after: impl FnOnce(&dyn Fabric, &Arc<M>),
) -> usize {
    let node = serve_node(node_size);
    let f: Arc<dyn Fabric> = node.fabric.clone();
    let map = M::create(f.clone(), "conformance-procs", cfg).expect("create");
    let h = run_processes(child_test, &node, "conformance-procs", procs, sc);
    assert!(h.len() >= procs as usize * sc.workers * sc.tasks * sc.ops_per_task);
    let conflicts = conflicts(&h);
    final_check(f.as_ref(), &map, sc.hot_keys, h);
    after(f.as_ref(), &map);
    map.destroy().expect("destroy");
    conflicts
}
