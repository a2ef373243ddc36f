//! Remote spinlock and sequencer: mutual exclusion across processes and
//! threads, lease recovery after a holder is killed, lease semantics in
//! virtual time, unique sequence numbers.

use std::cell::{Cell, RefCell};
use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::rc::Rc;
use std::sync::Arc;

use dmkit_fabric::shm::{ShmConfig, ShmFabric, Target};
use dmkit_fabric::{ControlPlane, RemoteRef, SyncQp};
use dmkit_memnode::server::{Running, Server};
use dmkit_memnode::{MemNode, NodeConfig};
use dmkit_runtime::{
    Clock, LockConfig, LockError, MonotonicClock, RemoteLock, RuntimeConfig, Sequencer,
    VirtualClock,
};

mod common;
use common::worker;

const TESTKIT: &str = env!("CARGO_BIN_EXE_dmkit-runtime-testkit");

struct Served {
    _dir: tempfile::TempDir,
    socket: std::path::PathBuf,
    _running: Running,
}

impl Served {
    fn start() -> Self {
        let dir = tempfile::tempdir().unwrap();
        let socket = dir.path().join("n.sock");
        let node = MemNode::new(NodeConfig {
            size: 8 << 20,
            ..Default::default()
        })
        .unwrap();
        let running = Server::bind(
            node,
            &socket,
            &dmkit_memnode::server::default_token_path(&socket),
        )
        .unwrap()
        .spawn()
        .unwrap();
        Self {
            _dir: dir,
            socket,
            _running: running,
        }
    }
    fn client(&self) -> ShmFabric {
        ShmFabric::open(ShmConfig::default(), &[Target::new(&self.socket)]).unwrap()
    }
}

#[test]
fn lock_excludes_across_processes_and_threads() {
    let s = Served::start();
    let f = s.client();
    let (base, _, k) = f.alloc_chunk(0, 4096, true).unwrap();
    let (lock, data) = (base, base.add(64));
    let (procs, workers, tasks, iters) = (3u64, 2u64, 3u64, 60u64);
    let children: Vec<_> = (0..procs)
        .map(|_| {
            Command::new(TESTKIT)
                .args(["lock", s.socket.to_str().unwrap()])
                .args([lock.raw(), data.raw()].map(|v| format!("{v:x}")))
                .args([k as u64, workers, tasks, iters, 2000].map(|v| v.to_string()))
                .spawn()
                .unwrap()
        })
        .collect();
    for mut c in children {
        let st = c.wait().unwrap();
        assert!(
            st.success(),
            "a child saw overlapping holders or failed: {st:?}"
        );
    }
    let mut q = SyncQp::new(&f, 0, 64).unwrap();
    assert_eq!(
        q.read_u64(data, k).unwrap(),
        procs * workers * tasks * iters
    );
    assert_eq!(q.read_u64(data.add(8), k).unwrap(), 0);
    assert_eq!(q.read_u64(lock, k).unwrap(), 0, "released");
}

#[test]
fn dead_holders_lock_is_recovered_after_its_lease() {
    let s = Served::start();
    let f = s.client();
    let (lock_addr, _, k) = f.alloc_chunk(0, 4096, true).unwrap();
    let lease_ms = 300;
    let mut child = Command::new(TESTKIT)
        .args([
            "hold",
            s.socket.to_str().unwrap(),
            &format!("{:x}", lock_addr.raw()),
        ])
        .args([k as u64, lease_ms].map(|v| v.to_string()))
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut line = String::new();
    BufReader::new(child.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    let deadline_us: u64 = line
        .trim()
        .strip_prefix("held ")
        .expect("held line")
        .parse()
        .unwrap();
    child.kill().unwrap();
    child.wait().unwrap();

    let mut w = worker(&f, Arc::new(MonotonicClock), RuntimeConfig::default(), 0, 1);
    let got = Rc::new(Cell::new(None));
    let g2 = got.clone();
    w.spawn(move |ctx| async move {
        let lock = RemoteLock::new(RemoteRef::new(lock_addr, k), LockConfig::default());
        let g = lock.lock(&ctx, 2).await.unwrap();
        let at = ctx.now() / 1000;
        let broke = g.broke_lease;
        g.unlock(&ctx).await.unwrap();
        g2.set(Some((at, broke)));
    });
    w.run();
    let (at, broke) = got.get().unwrap();
    assert!(broke, "acquired by breaking the dead holder's lease");
    assert!(
        at > deadline_us,
        "acquired at {at} µs, before the lease ended at {deadline_us} µs"
    );
    let mut q = SyncQp::new(&f, 0, 64).unwrap();
    assert_eq!(q.read_u64(lock_addr, k).unwrap(), 0);
}

/// In virtual time: a live holder within its lease is never broken; a
/// holder that overruns its lease loses the lock and learns it on unlock.
#[test]
fn leases_in_virtual_time() {
    let f = ShmFabric::one_node(ShmConfig::default(), 1 << 20).unwrap();
    let (addr, _, k) = f.alloc_chunk(0, 4096, true).unwrap();
    let clock = VirtualClock::new();
    clock.advance(1_000_000);
    let cfg = LockConfig {
        lease: 1_000_000,
        backoff_max: 10_000,
        ..Default::default()
    };
    let rcfg = RuntimeConfig {
        throttle: false,
        conflict_avoid: false,
        ..Default::default()
    };
    let mut w = worker(&f, Arc::new(clock.clone()), rcfg, 0, 2);
    let log: Rc<RefCell<Vec<String>>> = Rc::default();
    let (l1, l2) = (log.clone(), log.clone());
    w.spawn(move |ctx| async move {
        let lock = RemoteLock::new(RemoteRef::new(addr, k), cfg);
        let g = lock.lock(&ctx, 1).await.unwrap();
        l1.borrow_mut().push(format!("A in at {}", ctx.now()));
        ctx.sleep(400_000).await;
        g.unlock(&ctx).await.unwrap();
        l1.borrow_mut().push(format!("A out at {}", ctx.now()));
        ctx.sleep(100_000).await;
        // Second round: overrun the lease.
        let g = lock.lock(&ctx, 1).await.unwrap();
        l1.borrow_mut().push(format!("A in at {}", ctx.now()));
        ctx.sleep(5_000_000).await;
        match g.unlock(&ctx).await {
            Err(LockError::Lost { .. }) => l1.borrow_mut().push("A lost".into()),
            other => panic!("{other:?}"),
        }
    });
    w.spawn(move |ctx| async move {
        let lock = RemoteLock::new(RemoteRef::new(addr, k), cfg);
        ctx.sleep(1).await;
        let g = lock.lock(&ctx, 2).await.unwrap();
        l2.borrow_mut()
            .push(format!("B in at {} broke={}", ctx.now(), g.broke_lease));
        ctx.sleep(10).await;
        g.unlock(&ctx).await.unwrap();
        // Wait for A's second (overrunning) hold, then break it.
        ctx.sleep(150_000).await;
        let g = lock.lock(&ctx, 2).await.unwrap();
        l2.borrow_mut()
            .push(format!("B in at {} broke={}", ctx.now(), g.broke_lease));
        g.unlock(&ctx).await.unwrap();
    });
    let mut guard = 0;
    while w.live_tasks() > 0 {
        w.step();
        clock.advance(1_000);
        guard += 1;
        assert!(guard < 100_000, "no progress: {:?}", log.borrow());
    }
    let log = log.borrow();
    let t = |s: &str| -> u64 {
        s.split(" at ")
            .nth(1)
            .unwrap()
            .split(' ')
            .next()
            .unwrap()
            .parse()
            .unwrap()
    };
    assert_eq!(log.len(), 6, "{log:?}");
    assert!(
        log[0].starts_with("A in") && log[1].starts_with("A out"),
        "{log:?}"
    );
    assert!(
        log[2].starts_with("B in") && log[2].ends_with("broke=false"),
        "{log:?}"
    );
    assert!(
        t(&log[2]) >= t(&log[1]),
        "B entered while A held a valid lease: {log:?}"
    );
    assert!(log[3].starts_with("A in"), "{log:?}");
    assert!(
        log[4].starts_with("B in") && log[4].ends_with("broke=true"),
        "{log:?}"
    );
    assert!(
        t(&log[4]) > t(&log[3]) + 1_000_000,
        "broken only after the lease: {log:?}"
    );
    assert_eq!(log[5], "A lost", "{log:?}");
}

#[test]
fn sequencer_numbers_are_unique_and_contiguous() {
    let f = Arc::new(ShmFabric::one_node(ShmConfig::default(), 1 << 20).unwrap());
    let (addr, _, k) = f.alloc_chunk(0, 4096, true).unwrap();
    let all: Vec<u64> = std::thread::scope(|s| {
        let hs: Vec<_> = (0..2)
            .map(|wi| {
                let f = f.clone();
                s.spawn(move || {
                    let clock: Arc<dyn Clock> = Arc::new(MonotonicClock);
                    let mut w = worker(f.as_ref(), clock, RuntimeConfig::default(), wi, 4);
                    let got: Rc<RefCell<Vec<u64>>> = Rc::default();
                    for _ in 0..4 {
                        let got = got.clone();
                        w.spawn(move |ctx| async move {
                            let seq = Sequencer::new(RemoteRef::new(addr, k));
                            for i in 0..250 {
                                if i % 10 == 0 {
                                    let first = seq.reserve(&ctx, 3).await.unwrap();
                                    got.borrow_mut().extend(first..first + 3);
                                } else {
                                    let n = seq.next(&ctx).await.unwrap();
                                    got.borrow_mut().push(n);
                                }
                            }
                        });
                    }
                    w.run();
                    let v = got.borrow().clone();
                    v
                })
            })
            .collect();
        hs.into_iter().flat_map(|h| h.join().unwrap()).collect()
    });
    let mut sorted = all.clone();
    sorted.sort_unstable();
    let n = 2 * 4 * (225 + 25 * 3);
    assert_eq!(sorted, (0..n as u64).collect::<Vec<_>>());
}
