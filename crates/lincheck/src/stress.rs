//! A recorded mixed workload on a small hot key set, for linearizability
//! tests of any remote map (RACE, the radix tree, the B+tree), on threads,
//! processes or the simulator. Not a benchmark: operations are timed with
//! the worker's clock — host-wide `CLOCK_MONOTONIC` on shm, so histories
//! from several processes merge into one, or virtual time on the simulator.

use std::cell::RefCell;
use std::collections::HashMap;
use std::fmt::Display;
use std::rc::Rc;

use dmkit_fabric::{Fabric, FabricError};
use dmkit_runtime::{Ctx, MonotonicClock, RuntimeConfig, Worker};

use crate::{MapOp, MapRet, Record};

/// Task-local bytes of the stress workers (the old default; the maps'
/// declared layouts replace it).
const LOCAL_BYTES: usize = 64 * 1024;

/// A per-worker client of the map under test.
#[allow(async_fn_in_trait)]
pub trait StressClient: Clone + 'static {
    type Error: Display + From<FabricError> + Send + 'static;
    async fn search(&self, ctx: &Ctx, key: &[u8]) -> Result<Option<Vec<u8>>, Self::Error>;
    /// Inserts if absent; whether it inserted.
    async fn insert(&self, ctx: &Ctx, key: &[u8], value: &[u8]) -> Result<bool, Self::Error>;
    /// Replaces if present; whether it replaced.
    async fn update(&self, ctx: &Ctx, key: &[u8], value: &[u8]) -> Result<bool, Self::Error>;
    /// Removes if present; whether it removed.
    async fn delete(&self, ctx: &Ctx, key: &[u8]) -> Result<bool, Self::Error>;
    /// Every entry (called on a quiescent map).
    async fn entries(&self, ctx: &Ctx) -> Result<Vec<(Vec<u8>, Vec<u8>)>, Self::Error>;
}

/// One recorded operation: keys and values are strings for readable reports.
pub type StressRecord = Record<String, String>;

/// What a stress run does.
#[derive(Debug, Clone)]
pub struct StressConfig {
    pub workers: usize,
    pub tasks: usize,
    pub ops_per_task: usize,
    /// Keys `hot-0 .. hot-{n-1}` receive the conflicting operations.
    pub hot_keys: u64,
    /// Percentage of operations that insert a fresh unique key (grows the
    /// table, so subtables split while the hot keys are in use).
    pub fill_percent: u32,
    pub seed: u64,
    /// Client ids are `client_base + worker * tasks + task`.
    pub client_base: u32,
}

/// Host-wide monotonic nanoseconds (comparable across processes).
pub fn host_now() -> u64 {
    let t = nix::time::clock_gettime(nix::time::ClockId::CLOCK_MONOTONIC)
        .expect("CLOCK_MONOTONIC is always available");
    t.tv_sec() as u64 * 1_000_000_000 + t.tv_nsec() as u64
}

fn splitmix(x: &mut u64) -> u64 {
    *x = x.wrapping_add(0x9E37_79B9_7F4A_7C15);
    let mut z = *x;
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// Spawns worker `wi`'s tasks of the workload on `w`: each appends its
/// records to `out`, or stores the first error in `failed` and stops.
/// Operations are timed with the worker's clock (host-wide
/// `CLOCK_MONOTONIC` on shm — comparable across processes — or virtual time
/// on the simulator).
pub fn spawn_tasks<C: StressClient>(
    w: &mut Worker,
    client: &C,
    sc: &StressConfig,
    wi: usize,
    out: &Rc<RefCell<Vec<StressRecord>>>,
    failed: &Rc<RefCell<Option<C::Error>>>,
) {
    for ti in 0..sc.tasks {
        let (client, out, failed, sc) = (client.clone(), out.clone(), failed.clone(), sc.clone());
        let id = sc.client_base + (wi * sc.tasks + ti) as u32;
        w.spawn(move |ctx| async move {
            let mut rng = sc.seed ^ (id as u64) << 32;
            for i in 0..sc.ops_per_task {
                let r = splitmix(&mut rng);
                let value = format!("v{id}.{i}");
                let (key, op) = if (r % 100) < sc.fill_percent as u64 {
                    (format!("fill-{id}-{i}"), MapOp::Insert(value))
                } else {
                    let key = format!("hot-{}", (r >> 8) % sc.hot_keys);
                    let op = match (r >> 20) % 100 {
                        0..35 => MapOp::Search,
                        35..60 => MapOp::Insert(value),
                        60..88 => MapOp::Update(value),
                        _ => MapOp::Delete,
                    };
                    (key, op)
                };
                let invoked = ctx.now();
                let k = key.as_bytes();
                let ret = match &op {
                    MapOp::Search => client.search(&ctx, k).await.map(|v| {
                        MapRet::Found(v.map(|v| String::from_utf8(v).expect("utf-8 values")))
                    }),
                    MapOp::Insert(v) => {
                        client.insert(&ctx, k, v.as_bytes()).await.map(MapRet::Done)
                    }
                    MapOp::Update(v) => {
                        client.update(&ctx, k, v.as_bytes()).await.map(MapRet::Done)
                    }
                    MapOp::Delete => client.delete(&ctx, k).await.map(MapRet::Done),
                    MapOp::Upsert(_) => unreachable!("not generated"),
                };
                let returned = ctx.now();
                match ret {
                    Ok(ret) => out.borrow_mut().push(Record {
                        client: id,
                        key,
                        op,
                        invoked,
                        returned: Some((returned, ret)),
                    }),
                    Err(e) => {
                        *failed.borrow_mut() = Some(e);
                        return;
                    }
                }
            }
        });
    }
}

/// The client id of worker `wi` of a run.
pub fn client_id(sc: &StressConfig, wi: usize) -> u64 {
    sc.client_base as u64 * 1000 + wi as u64
}

/// Runs the workload on OS threads (one worker each, its client made by
/// `client(id)` on the worker's thread); returns the history, or the first
/// operation error.
pub fn run<C: StressClient>(
    fabric: &dyn Fabric,
    client: &(dyn Fn(u64) -> C + Sync),
    rcfg: &RuntimeConfig,
    sc: &StressConfig,
) -> Result<Vec<StressRecord>, C::Error> {
    std::thread::scope(|s| {
        let hs: Vec<_> = (0..sc.workers)
            .map(|wi| {
                let (rcfg, sc) = (rcfg.clone(), sc.clone());
                s.spawn(move || -> Result<Vec<StressRecord>, C::Error> {
                    let mut w = Worker::builder(fabric)
                        .clock(std::sync::Arc::new(MonotonicClock))
                        .config(rcfg)
                        .id(wi)
                        .tasks(sc.tasks)
                        .local_bytes(LOCAL_BYTES)
                        .build()?;
                    let client = client(client_id(&sc, wi));
                    let out: Rc<RefCell<Vec<StressRecord>>> = Rc::default();
                    let failed: Rc<RefCell<Option<C::Error>>> = Rc::default();
                    spawn_tasks(&mut w, &client, &sc, wi, &out, &failed);
                    w.run();
                    if let Some(e) = failed.borrow_mut().take() {
                        return Err(e);
                    }
                    let v = out.borrow().clone();
                    Ok(v)
                })
            })
            .collect();
        let mut all = Vec::new();
        for h in hs {
            all.extend(h.join().expect("stress worker panicked")?);
        }
        Ok(all)
    })
}

/// After a run, from a quiescent table: searches every hot key (recorded as
/// operations of client 9999, so the checker sees the final state) and
/// scans the whole table. Returns (those records, the scan).
pub async fn final_reads<C: StressClient>(
    ctx: &Ctx,
    client: &C,
    hot_keys: u64,
) -> Result<(Vec<StressRecord>, HashMap<String, String>), C::Error> {
    let mut finals = Vec::new();
    for k in 0..hot_keys {
        let key = format!("hot-{k}");
        let invoked = ctx.now();
        let v = client.search(ctx, key.as_bytes()).await?;
        finals.push(Record {
            client: 9999,
            key,
            op: MapOp::Search,
            invoked,
            returned: Some((
                ctx.now(),
                MapRet::Found(v.map(|v| String::from_utf8(v).expect("utf-8 values"))),
            )),
        });
    }
    let scan = client
        .entries(ctx)
        .await?
        .into_iter()
        .map(|(k, v)| {
            (
                String::from_utf8(k).expect("utf-8 keys"),
                String::from_utf8(v).expect("utf-8 values"),
            )
        })
        .collect();
    Ok((finals, scan))
}

/// Checks a run: the scan agrees with the final searches, every inserted
/// fill key is in the scan with its value and nothing else is, and the
/// whole history (with the final searches) is linearizable. The error says
/// what went wrong, with the operations around the earliest failing cut.
pub fn verify(
    mut h: Vec<StressRecord>,
    finals: Vec<StressRecord>,
    scan: &HashMap<String, String>,
) -> Result<(), String> {
    for f in &finals {
        let Some((_, MapRet::Found(v))) = &f.returned else {
            return Err(format!("final search of {} has no result", f.key));
        };
        if scan.get(&f.key) != v.as_ref() {
            return Err(format!(
                "scan has {:?} for {} but a search found {v:?}",
                scan.get(&f.key),
                f.key
            ));
        }
    }
    h.extend(finals);
    let mut fills = 0;
    for r in &h {
        if let (MapOp::Insert(v), Some((_, MapRet::Done(true)))) = (&r.op, &r.returned) {
            if r.key.starts_with("fill-") {
                if scan.get(&r.key) != Some(v) {
                    return Err(format!(
                        "inserted {} = {v} but the scan has {:?}",
                        r.key,
                        scan.get(&r.key)
                    ));
                }
                fills += 1;
            }
        }
    }
    let others = scan.keys().filter(|k| !k.starts_with("hot-")).count();
    if others != fills {
        return Err(format!(
            "the scan has {others} non-hot keys, the history inserted {fills}"
        ));
    }
    check_linearizable(&h)
}

/// Whether a history is linearizable; the error shows the operations of
/// the offending key around the earliest failing cut.
pub fn check_linearizable(h: &[StressRecord]) -> Result<(), String> {
    if let Err(v) = crate::check(h, |_| None) {
        // Where the execution first went wrong: the operations around the
        // earliest failing cut (more telling than a shrunk witness).
        let t = crate::earliest_failing_cut(h, |_| None).unwrap_or(0);
        let mut near: Vec<&StressRecord> = h
            .iter()
            .filter(|r| r.key == v.key && r.invoked <= t)
            .filter(|r| {
                r.returned
                    .as_ref()
                    .is_some_and(|(rt, _)| rt + 2_000_000 >= t)
            })
            .collect();
        near.sort_by_key(|r| r.invoked);
        let near: Vec<String> = near
            .iter()
            .rev()
            .take(40)
            .rev()
            .map(|r| to_line(r))
            .collect();
        return Err(format!(
            "history of {} operations is not linearizable:\n{v}\nearliest failing cut at {t}; the key's operations up to it:\n{}",
            h.len(),
            near.join("\n")
        ));
    }
    Ok(())
}

/// One line per record: `client invoked returned key op ret` with `-` for
/// "none" (keys and values contain no spaces).
pub fn to_line(r: &StressRecord) -> String {
    let op = match &r.op {
        MapOp::Search => "S -".to_string(),
        MapOp::Insert(v) => format!("I {v}"),
        MapOp::Update(v) => format!("U {v}"),
        MapOp::Delete => "D -".to_string(),
        MapOp::Upsert(v) => format!("P {v}"),
    };
    let (t, ret) = r.returned.as_ref().expect("completed operation");
    let ret = match ret {
        MapRet::Found(Some(v)) => format!("F {v}"),
        MapRet::Found(None) => "F -".into(),
        MapRet::Done(b) => format!("B {b}"),
        MapRet::Unit => "U -".into(),
    };
    format!("{} {} {} {} {} {}", r.client, r.invoked, t, r.key, op, ret)
}

/// Parses [`to_line`].
pub fn from_line(l: &str) -> Option<StressRecord> {
    let f: Vec<&str> = l.split_whitespace().collect();
    if f.len() != 8 {
        return None;
    }
    let opt = |s: &str| (s != "-").then(|| s.to_string());
    let op = match f[4] {
        "S" => MapOp::Search,
        "I" => MapOp::Insert(f[5].into()),
        "U" => MapOp::Update(f[5].into()),
        "D" => MapOp::Delete,
        "P" => MapOp::Upsert(f[5].into()),
        _ => return None,
    };
    let ret = match f[6] {
        "F" => MapRet::Found(opt(f[7])),
        "B" => MapRet::Done(f[7].parse().ok()?),
        "U" => MapRet::Unit,
        _ => return None,
    };
    Some(Record {
        client: f[0].parse().ok()?,
        invoked: f[1].parse().ok()?,
        returned: Some((f[2].parse().ok()?, ret)),
        key: f[3].into(),
        op,
    })
}

/// The body of a structure's multi-process test helper (a `*-testkit`
/// binary):
///
/// ```text
/// TESTKIT stress SOCKET NAME WORKERS TASKS OPS HOT FILL% SEED CLIENT_BASE START_NS
/// ```
/// connects to the memory node at SOCKET, opens structure NAME with `open`
/// (which returns the per-worker client factory), waits until host-monotonic
/// START_NS (so the processes overlap), runs the recorded workload and
/// prints one history line per operation ([`to_line`]).
pub fn testkit_main<C, F>(
    open: impl FnOnce(std::sync::Arc<dyn Fabric>, &str) -> Result<F, String>,
) -> std::process::ExitCode
where
    C: StressClient,
    F: Fn(u64) -> C + Sync,
{
    use std::io::Write;
    use std::process::ExitCode;
    let a: Vec<String> = std::env::args().skip(1).collect();
    let n = |i: usize| a[i].parse::<u64>();
    if a.len() != 11 || a[0] != "stress" || (3..11).any(|i| n(i).is_err()) {
        eprintln!("usage: TESTKIT stress SOCKET NAME WORKERS TASKS OPS HOT FILL% SEED CLIENT_BASE START_NS");
        return ExitCode::from(2);
    }
    let n = |i: usize| n(i).expect("checked above");
    let target = dmkit_fabric::shm::Target::new(&a[1]);
    let fabric: std::sync::Arc<dyn Fabric> = match dmkit_fabric::shm::ShmFabric::open(
        dmkit_fabric::shm::ShmConfig::default(),
        &[target],
    ) {
        Ok(f) => std::sync::Arc::new(f),
        Err(e) => {
            eprintln!("connect {}: {e}", a[1]);
            return ExitCode::from(1);
        }
    };
    let client = match open(fabric.clone(), &a[2]) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("open {}: {e}", a[2]);
            return ExitCode::from(1);
        }
    };
    let sc = StressConfig {
        workers: n(3) as usize,
        tasks: n(4) as usize,
        ops_per_task: n(5) as usize,
        hot_keys: n(6),
        fill_percent: n(7) as u32,
        seed: n(8),
        client_base: n(9) as u32,
    };
    let start = n(10);
    while host_now() < start {
        std::thread::sleep(std::time::Duration::from_micros(200));
    }
    match run(fabric.as_ref(), &client, &RuntimeConfig::default(), &sc) {
        Ok(h) => {
            let mut out = std::io::stdout().lock();
            for r in &h {
                writeln!(out, "{}", to_line(r)).expect("stdout");
            }
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("stress failed: {e}");
            ExitCode::from(1)
        }
    }
}

/// Runs `body` as the only task of a fresh worker on `f` (to completion)
/// and returns what it returned and the worker's statistics.
pub fn on_worker<C, T, F, Fut>(
    f: &dyn Fabric,
    client: &C,
    body: F,
) -> (T, dmkit_runtime::WorkerStats)
where
    C: Clone + 'static,
    T: 'static,
    F: FnOnce(Ctx, C) -> Fut + 'static,
    Fut: std::future::Future<Output = T> + 'static,
{
    let mut w = Worker::builder(f)
        .clock(std::sync::Arc::new(MonotonicClock))
        .config(RuntimeConfig::default())
        .id(0)
        .tasks(1)
        .local_bytes(LOCAL_BYTES)
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
pub fn on_worker_tasks<C, F, Fut>(
    f: &dyn Fabric,
    client: &C,
    tasks: usize,
    body: F,
) -> dmkit_runtime::WorkerStats
where
    C: Clone + 'static,
    F: Fn(usize, Ctx, C) -> Fut + Clone + 'static,
    Fut: std::future::Future<Output = ()> + 'static,
{
    let mut w = Worker::builder(f)
        .clock(std::sync::Arc::new(MonotonicClock))
        .config(RuntimeConfig::default())
        .id(0)
        .tasks(tasks)
        .local_bytes(LOCAL_BYTES)
        .build()
        .expect("a worker on a working fabric");
    for t in 0..tasks {
        let (c, body) = (client.clone(), body.clone());
        w.spawn(move |ctx| body(t, ctx, c));
    }
    w.run();
    w.stats()
}

/// A memory node served on a Unix socket by this process, and a fabric
/// connected to it: the setup of the multi-process tests.
pub struct ServedNode {
    _dir: tempfile::TempDir,
    pub socket: std::path::PathBuf,
    _running: dmkit_memnode::server::Running,
    pub fabric: std::sync::Arc<dmkit_fabric::shm::ShmFabric>,
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
    let fabric = std::sync::Arc::new(
        dmkit_fabric::shm::ShmFabric::open(
            dmkit_fabric::shm::ShmConfig::default(),
            &[dmkit_fabric::shm::Target::new(&socket)],
        )
        .expect("connect to the node"),
    );
    ServedNode {
        _dir: dir,
        socket,
        _running: running,
        fabric,
    }
}

/// Runs `procs` child processes of `testkit` ([`testkit_main`]) on
/// structure `name` of the node at `socket`, each with `sc`'s shape (seed
/// and client ids made distinct per child), starting together; returns
/// their merged history.
///
/// # Panics
/// If a child fails or prints a line that is not a history record.
pub fn run_processes(
    testkit: &str,
    socket: &std::path::Path,
    name: &str,
    procs: u32,
    sc: &StressConfig,
) -> Vec<StressRecord> {
    let start = host_now() + 300_000_000;
    let children: Vec<_> = (0..procs)
        .map(|p| {
            std::process::Command::new(testkit)
                .args(["stress", socket.to_str().expect("a UTF-8 path"), name])
                .args(
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
                .stdout(std::process::Stdio::piped())
                .stderr(std::process::Stdio::piped())
                .spawn()
                .expect("spawn the testkit")
        })
        .collect();
    let mut h = Vec::new();
    for c in children {
        let out = c.wait_with_output().expect("wait for the testkit");
        assert!(
            out.status.success(),
            "child failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        for l in String::from_utf8(out.stdout)
            .expect("UTF-8 history")
            .lines()
        {
            h.push(from_line(l).unwrap_or_else(|| panic!("bad history line {l:?}")));
        }
    }
    h
}
