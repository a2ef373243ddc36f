//! The admission door over TCP — what the verbs backend's control channel
//! runs (`dmkit_verbs`' server is a `Gate` on `serve_tcp`), checked here
//! without RDMA: the connection cap refuses with the gate's message, the
//! login has one deadline however slowly its bytes come, a bad login gets
//! the gate's answer, idle connections cost no thread, and a well-behaved
//! client is served throughout.

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use dmkit_memnode::admission::{serve_tcp, Gate, ServerConfig};
use dmkit_memnode::proto::{read_frame, write_frame};
use dmkit_memnode::{MemNode, NodeConfig};

const HELLO: &[u8] = b"hello, node";

/// A gate that admits [`HELLO`] and then echoes frames.
struct Echo {
    node: Arc<MemNode>,
}

impl Gate for Echo {
    type Stream = TcpStream;
    fn node(&self) -> &MemNode {
        &self.node
    }
    fn login(&self, hello: &[u8]) -> bool {
        hello == HELLO
    }
    fn too_many(&self, max: usize) -> Vec<u8> {
        format!("too many connections (at most {max})").into_bytes()
    }
    fn denied(&self) -> Option<Vec<u8>> {
        Some(b"authentication failed".to_vec())
    }
    fn serve(&self, mut stream: TcpStream, hello: &[u8]) {
        assert_eq!(hello, HELLO, "the gate hands over the login frame");
        let _ = write_frame(&mut stream, b"welcome");
        while let Ok(Some(f)) = read_frame(&mut stream) {
            if write_frame(&mut stream, &f).is_err() {
                return;
            }
        }
    }
}

struct Door {
    addr: std::net::SocketAddr,
    node: Arc<MemNode>,
    stop: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<std::io::Result<()>>>,
}

impl Drop for Door {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Release);
        if let Some(t) = self.thread.take() {
            t.join().unwrap().unwrap();
        }
    }
}

fn door(cfg: ServerConfig) -> Door {
    let node = MemNode::new(NodeConfig {
        size: 4 << 20,
        rpc_workers: 0,
        ..Default::default()
    })
    .unwrap();
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = l.local_addr().unwrap();
    let stop = Arc::new(AtomicBool::new(false));
    let gate = Arc::new(Echo { node: node.clone() });
    let s = stop.clone();
    let thread = std::thread::spawn(move || serve_tcp(l, cfg, gate, &|| s.load(Ordering::Acquire)));
    Door {
        addr,
        node,
        stop,
        thread: Some(thread),
    }
}

/// Logs in, has one frame echoed, logs out.
fn well_behaved(d: &Door) {
    let mut s = TcpStream::connect(d.addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    write_frame(&mut s, HELLO).unwrap();
    assert_eq!(read_frame(&mut s).unwrap().unwrap(), b"welcome");
    write_frame(&mut s, b"ping").unwrap();
    assert_eq!(read_frame(&mut s).unwrap().unwrap(), b"ping");
}

fn threads() -> u64 {
    let s = std::fs::read_to_string("/proc/self/status").unwrap();
    s.lines()
        .find(|l| l.starts_with("Threads:"))
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|v| v.parse().ok())
        .unwrap()
}

/// Past the cap a connection — which sent its login at once, as clients
/// do — reads the gate's refusal; idle connections cost no thread; a
/// bad login reads the gate's answer; once the idle ones are gone a
/// client logs in again.
#[test]
fn the_cap_refuses_clearly_and_idle_logins_cost_no_thread() {
    let d = door(ServerConfig {
        max_connections: 40,
        login_deadline: Duration::from_secs(20),
    });
    well_behaved(&d);
    let t0 = threads();
    let idle: Vec<TcpStream> = (0..40)
        .map(|_| {
            let mut s = TcpStream::connect(d.addr).unwrap();
            s.write_all(&[11]).unwrap();
            s
        })
        .collect();
    std::thread::sleep(Duration::from_millis(200));
    assert!(threads() <= t0 + 1, "threads {t0} -> {}", threads());
    // The refusal, once the loop has taken in the 40 (on a loaded host it
    // may lag: a probe it welcomed is closed and the probe retried; a node
    // that never refuses fails after 10 s).
    let t = Instant::now();
    let why = loop {
        let mut s = TcpStream::connect(d.addr).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        let _ = write_frame(&mut s, HELLO);
        let got = read_frame(&mut s).expect("an answer arrives").unwrap();
        if got != b"welcome" || t.elapsed() > Duration::from_secs(10) {
            break got;
        }
        drop(s);
        std::thread::sleep(Duration::from_millis(200));
    };
    assert_eq!(why, b"too many connections (at most 40)");
    assert!(d.node.stats().refused_connections >= 1);
    drop(idle);
    std::thread::sleep(Duration::from_millis(200));
    let mut s = TcpStream::connect(d.addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    write_frame(&mut s, b"hello, nose").unwrap();
    assert_eq!(
        read_frame(&mut s).unwrap().unwrap(),
        b"authentication failed"
    );
    assert_eq!(read_frame(&mut s).unwrap(), None, "then closed");
    well_behaved(&d);
}

/// A login trickled one byte every 40 ms is closed at the deadline
/// counted from the accept, while a well-behaved client is served.
#[test]
fn a_trickling_login_is_closed_at_the_deadline() {
    let deadline = Duration::from_millis(400);
    let d = door(ServerConfig {
        max_connections: 8,
        login_deadline: deadline,
    });
    let mut s = TcpStream::connect(d.addr).unwrap();
    let t0 = Instant::now();
    let mut frame = (HELLO.len() as u32).to_le_bytes().to_vec();
    frame.extend_from_slice(HELLO);
    let mut closed = None;
    for b in &frame[..frame.len() - 1] {
        if s.write_all(&[*b]).is_err() {
            closed = Some(t0.elapsed());
            break;
        }
        std::thread::sleep(Duration::from_millis(40));
        s.set_nonblocking(true).unwrap();
        let mut buf = [0u8; 8];
        match s.read(&mut buf) {
            Ok(0) => {
                closed = Some(t0.elapsed());
                break;
            }
            Err(e) if e.kind() != std::io::ErrorKind::WouldBlock => {
                closed = Some(t0.elapsed());
                break;
            }
            _ => {}
        }
        s.set_nonblocking(false).unwrap();
        well_behaved(&d);
    }
    let closed = closed.expect("the trickling login was never closed");
    assert!(
        closed >= deadline && closed < deadline + Duration::from_millis(400),
        "closed after {closed:?}, deadline {deadline:?}"
    );
    assert_eq!(d.node.stats().auth_failures, 1);
}
