//! Admission control on the node's Unix socket (issue 36, Found 5): idle
//! unauthenticated connections cost no thread and little memory, the login
//! has one deadline however slowly its bytes come, and connections past
//! the cap are refused with an error the client reports — while a
//! well-behaved client is served throughout.

use std::io::{Read, Write};
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use dmkit_fabric::shm::{ShmConfig, ShmFabric, Target};
use dmkit_fabric::{ControlPlane, Fabric};
use dmkit_memnode::server::{default_token_path, Running, Server, ServerConfig};
use dmkit_memnode::{MemNode, NodeConfig};

fn serve(dir: &Path, cfg: ServerConfig) -> (Running, Target) {
    let node = MemNode::new(NodeConfig {
        size: 16 << 20,
        rpc_workers: 0,
        ..Default::default()
    })
    .unwrap();
    let sock = dir.join("n.sock");
    let token = default_token_path(&sock);
    let running = Server::bind(node, &sock, &token)
        .unwrap()
        .with_config(cfg)
        .unwrap()
        .spawn()
        .unwrap();
    (
        running,
        Target {
            socket: sock,
            token_file: token,
        },
    )
}

/// A full client: logs in (the memfds come by `SCM_RIGHTS`), allocates,
/// frees, reads statistics, logs out.
fn well_behaved(t: &Target) {
    let f = ShmFabric::open(ShmConfig::default(), std::slice::from_ref(t)).expect("login");
    let (a, len, _) = f.alloc_chunk(0, 4096, false).expect("alloc");
    assert_eq!(f.free_chunk(a).expect("free"), len);
    assert!(f.node_stats(0).expect("stats").sessions_active >= 1);
    assert_eq!(f.nodes(), vec![0]);
}

/// `(VmRSS, Threads)` of this process.
fn rss_and_threads() -> (u64, u64) {
    let s = std::fs::read_to_string("/proc/self/status").unwrap();
    let field = |k: &str| {
        s.lines()
            .find(|l| l.starts_with(k))
            .and_then(|l| l.split_whitespace().nth(1))
            .and_then(|v| v.parse().ok())
            .unwrap()
    };
    (field("VmRSS:") * 1024, field("Threads:"))
}

/// Raises this process's descriptor limit to its hard limit; returns it.
fn raise_nofile() -> u64 {
    use nix::sys::resource::{getrlimit, setrlimit, Resource};
    let (_, hard) = getrlimit(Resource::RLIMIT_NOFILE).unwrap();
    setrlimit(Resource::RLIMIT_NOFILE, hard, hard).unwrap();
    hard
}

/// 5,000 connections that never log in (each sent one byte of a frame),
/// held open together: the node serves them with no thread each and under
/// 16 MiB of memory (both ends live in this process: the bound covers the
/// node and the test's streams), and a well-behaved client logs in and
/// works before, during and after.
#[test]
fn thousands_of_idle_logins_cost_no_threads_and_little_memory() {
    const IDLE: usize = 5000;
    const RSS_BOUND: u64 = 16 << 20;
    // Two descriptors per connection in this process (both ends), plus
    // the node's and the clients' own.
    let limit = raise_nofile();
    assert!(
        limit as usize >= 2 * IDLE + 256,
        "RLIMIT_NOFILE hard limit {limit} is below what the test needs"
    );
    let dir = tempfile::tempdir().unwrap();
    let (running, t) = serve(
        dir.path(),
        ServerConfig {
            max_connections: IDLE + 16,
            login_deadline: Duration::from_secs(30),
        },
    );
    well_behaved(&t);
    let (rss0, threads0) = rss_and_threads();
    let mut idle = Vec::with_capacity(IDLE);
    for i in 0..IDLE {
        let mut s = UnixStream::connect(&t.socket).expect("connect");
        s.write_all(&[48]).unwrap();
        idle.push(s);
        if i == IDLE / 2 {
            well_behaved(&t);
        }
    }
    // Let the node accept and register every connection.
    std::thread::sleep(Duration::from_millis(300));
    well_behaved(&t);
    let (rss1, threads1) = rss_and_threads();
    let st = running.node().stats();
    assert_eq!(st.refused_connections, 0, "{st:?}");
    assert_eq!(st.auth_failures, 0, "no idle connection was dropped yet");
    assert!(
        threads1 <= threads0 + 2,
        "threads {threads0} -> {threads1} for {IDLE} idle connections"
    );
    assert!(
        rss1.saturating_sub(rss0) < RSS_BOUND,
        "RSS grew by {} B for {IDLE} idle connections",
        rss1 - rss0
    );
    eprintln!(
        "{IDLE} idle logins: RSS +{} KiB, threads {threads0} -> {threads1}",
        rss1.saturating_sub(rss0) / 1024
    );
    drop(idle);
    well_behaved(&t);
    running.stop().unwrap();
}

/// A client trickling its login one byte every 40 ms is dropped at the
/// login deadline (counted from the accept), not kept alive by its bytes.
#[test]
fn a_trickling_login_is_dropped_at_the_deadline() {
    let deadline = Duration::from_millis(400);
    let dir = tempfile::tempdir().unwrap();
    let (running, t) = serve(
        dir.path(),
        ServerConfig {
            max_connections: 64,
            login_deadline: deadline,
        },
    );
    let mut s = UnixStream::connect(&t.socket).unwrap();
    let t0 = Instant::now();
    // A plausible frame header announcing a 44-byte hello, then payload
    // bytes one at a time.
    let mut frame = 44u32.to_le_bytes().to_vec();
    frame.extend_from_slice(&[0xAB; 44]);
    let mut closed = None;
    for b in &frame {
        if s.write_all(&[*b]).is_err() {
            closed = Some(t0.elapsed());
            break;
        }
        std::thread::sleep(Duration::from_millis(40));
        // The node closing shows as end of stream on our side.
        s.set_nonblocking(true).unwrap();
        let mut buf = [0u8; 8];
        if let Ok(0) = s.read(&mut buf) {
            closed = Some(t0.elapsed());
            break;
        }
        s.set_nonblocking(false).unwrap();
    }
    let closed = closed.expect("the node never closed the trickling connection");
    assert!(
        closed >= deadline && closed < deadline + Duration::from_millis(300),
        "closed after {closed:?}, deadline {deadline:?}"
    );
    assert_eq!(running.node().stats().auth_failures, 1);
    well_behaved(&t);
    running.stop().unwrap();
}

/// Past the cap a connection is refused with an error the client reports;
/// when a connection closes, its place is free again.
#[test]
fn connections_past_the_cap_are_refused_with_a_clear_error() {
    let dir = tempfile::tempdir().unwrap();
    let (running, t) = serve(
        dir.path(),
        ServerConfig {
            max_connections: 3,
            login_deadline: Duration::from_secs(10),
        },
    );
    // One logged-in session and two idle connections fill the cap.
    let session = ShmFabric::open(ShmConfig::default(), std::slice::from_ref(&t)).unwrap();
    let idle: Vec<UnixStream> = (0..2)
        .map(|_| UnixStream::connect(&t.socket).unwrap())
        .collect();
    std::thread::sleep(Duration::from_millis(100));
    let err = ShmFabric::open(ShmConfig::default(), std::slice::from_ref(&t))
        .err()
        .expect("a fourth connection is refused");
    let msg = err.to_string();
    assert!(msg.contains("at most 3 connections"), "{msg}");
    assert_eq!(running.node().stats().refused_connections, 1);
    // The session is still served.
    assert_eq!(session.node_stats(0).unwrap().sessions_active, 1);
    drop(idle);
    std::thread::sleep(Duration::from_millis(100));
    well_behaved(&t);
    drop(session);
    running.stop().unwrap();
}

/// A session's memory goes with its connection; the admin token frees a
/// chunk whose owner left it persistent, and nothing else can.
#[test]
fn gc_and_admin_free_need_the_token_file() {
    let dir = tempfile::tempdir().unwrap();
    let (running, t) = serve(dir.path(), ServerConfig::default());
    let node = Arc::clone(running.node());
    {
        let f = ShmFabric::open(ShmConfig::default(), std::slice::from_ref(&t)).unwrap();
        f.alloc_chunk(0, 8192, false).unwrap();
        f.alloc_chunk(0, 4096, true).unwrap();
        f.alloc_group_chunk(0, 4096, "race/gone").unwrap();
    }
    // The connection closed: its session chunk and its group are gone,
    // the persistent chunk stays until an admin collects it.
    let t0 = Instant::now();
    while node.stats().sessions_active > 0 && t0.elapsed() < Duration::from_secs(2) {
        std::thread::sleep(Duration::from_millis(10));
    }
    let st = node.stats();
    assert_eq!(st.chunk_bytes, 4096, "{st:?}");
    assert_eq!(st.chunks_reclaimed, 2);
    let f = ShmFabric::open(ShmConfig::default(), std::slice::from_ref(&t)).unwrap();
    let wrong = f.admin(0, [0; 32], dmkit_memnode::AdminOp::Gc);
    assert!(wrong.is_err(), "{wrong:?}");
    assert_eq!(node.stats().chunk_bytes, 4096);
    let token = dmkit_memnode::server::read_token_file(&t.token_file).unwrap();
    assert_eq!(
        f.admin(0, token, dmkit_memnode::AdminOp::Gc).unwrap(),
        dmkit_memnode::Response::Collected {
            chunks: 1,
            bytes: 4096
        }
    );
    assert_eq!(node.stats().chunk_bytes, 0);
    drop(f);
    running.stop().unwrap();
}
