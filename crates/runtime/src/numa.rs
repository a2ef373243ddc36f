//! NUMA (RDMA memory-semantics study, §II-B4, §III-D, Fig. 9): the host's
//! sockets, pinning workers to a socket's cores and binding a memory
//! node's memory to its NIC's socket, and the *proxy socket*: a request for
//! memory that the other socket's NIC port serves is handed, through a
//! shared-memory queue, to a proxy task on that socket, which posts it on
//! its own queue pair and hands the result back.
//!
//! - [`Topology::detect`] reads the host's sockets (hwloc with the `hwloc`
//!   feature, else Linux's `/sys/devices/system/node`). On a single-socket
//!   host there is nothing to proxy: [`Topology::proxy_reason`] says so,
//!   and callers leave the proxy off.
//! - [`pin_current_thread`] and [`bind_memory_to`] use hwloc (the
//!   `hwlocality` crate, feature `hwloc`, which needs the system's
//!   libhwloc); built without it they return [`NumaError::Unsupported`]
//!   saying how to get it.
//! - [`ProxyQueue`] is the proxy path. It works the same on OS threads
//!   (shm, verbs) and on the simulator's virtual threads: requests carry
//!   the instant they become visible to the other side (`now + hop`, the
//!   cache-line transfer between sockets; 0 on real hosts, where the
//!   transfer costs what it costs) and both sides poll on the runtime's
//!   clock.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};

use dmkit_fabric::{FabricError, RemoteRef};

use crate::clock::Nanos;
use crate::ctx::Ctx;
use crate::local::Local;

/// Why a NUMA operation could not be done.
#[derive(Debug, thiserror::Error)]
pub enum NumaError {
    /// The operation is not available here (platform, build, topology).
    #[error("{0}")]
    Unsupported(String),
    /// A socket index past the host's sockets.
    #[error("socket {socket} does not exist (the host has {sockets})")]
    NoSuchSocket {
        /// The socket asked for.
        socket: usize,
        /// Sockets the host has.
        sockets: usize,
    },
    /// hwloc reported an error.
    #[error("hwloc: {0}")]
    Hwloc(String),
}

/// One socket: its id and the logical CPUs on it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Socket {
    /// The socket's index (hwloc's package index).
    pub id: usize,
    /// Its logical CPUs (OS indices).
    pub cpus: Vec<usize>,
}

/// The host's sockets.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Topology {
    /// The sockets, by index.
    pub sockets: Vec<Socket>,
    /// Where the description came from ("hwloc", "sysfs", "fallback").
    pub source: &'static str,
}

impl Topology {
    /// The host's sockets: hwloc's packages (feature `hwloc`), else the
    /// NUMA nodes Linux lists, else one socket with every CPU.
    pub fn detect() -> Self {
        #[cfg(feature = "hwloc")]
        if let Ok(t) = hw::topology() {
            return t;
        }
        Self::from_sysfs(std::path::Path::new("/sys/devices/system/node")).unwrap_or_else(|| {
            let n = std::thread::available_parallelism().map_or(1, |n| n.get());
            Topology {
                sockets: vec![Socket {
                    id: 0,
                    cpus: (0..n).collect(),
                }],
                source: "fallback",
            }
        })
    }

    /// Reads `node*/cpulist` under `dir` (Linux's NUMA nodes).
    pub fn from_sysfs(dir: &std::path::Path) -> Option<Self> {
        let mut sockets = Vec::new();
        for e in std::fs::read_dir(dir).ok()?.flatten() {
            let name = e.file_name().to_string_lossy().into_owned();
            let Some(id) = name.strip_prefix("node").and_then(|n| n.parse().ok()) else {
                continue;
            };
            let list = std::fs::read_to_string(e.path().join("cpulist")).ok()?;
            let cpus = parse_cpulist(list.trim())?;
            if !cpus.is_empty() {
                sockets.push(Socket { id, cpus });
            }
        }
        sockets.sort_by_key(|s| s.id);
        (!sockets.is_empty()).then_some(Topology {
            sockets,
            source: "sysfs",
        })
    }

    /// Whether the host has one socket.
    pub fn single_socket(&self) -> bool {
        self.sockets.len() <= 1
    }

    /// Why the proxy is off, if it is: `Some` on a single-socket host.
    pub fn proxy_reason(&self) -> Option<String> {
        self.single_socket().then(|| {
            format!(
                "single-socket host ({} CPUs, {}): the proxy is off — every core and all memory share the NIC's socket",
                self.sockets.first().map_or(0, |s| s.cpus.len()),
                self.source
            )
        })
    }
}

/// Parses a Linux CPU list ("0-3,8,10-11").
pub fn parse_cpulist(s: &str) -> Option<Vec<usize>> {
    let mut out = Vec::new();
    if s.is_empty() {
        return Some(out);
    }
    for part in s.split(',') {
        match part.split_once('-') {
            Some((a, b)) => {
                let (a, b): (usize, usize) = (a.parse().ok()?, b.parse().ok()?);
                if b < a {
                    return None;
                }
                out.extend(a..=b);
            }
            None => out.push(part.parse().ok()?),
        }
    }
    Some(out)
}

/// Pins the calling thread to the CPUs of socket `socket`.
pub fn pin_current_thread(socket: usize) -> Result<(), NumaError> {
    #[cfg(feature = "hwloc")]
    {
        hw::pin(socket)
    }
    #[cfg(not(feature = "hwloc"))]
    {
        let _ = socket;
        Err(unsupported("pinning threads"))
    }
}

/// Makes the calling process allocate its memory on socket `socket` from
/// now on (a memory node calls it before it touches its memory, so its
/// pages land on the NIC's socket).
pub fn bind_memory_to(socket: usize) -> Result<(), NumaError> {
    #[cfg(feature = "hwloc")]
    {
        hw::bind_memory(socket)
    }
    #[cfg(not(feature = "hwloc"))]
    {
        let _ = socket;
        Err(unsupported("binding memory"))
    }
}

#[cfg(not(feature = "hwloc"))]
fn unsupported(what: &str) -> NumaError {
    NumaError::Unsupported(format!(
        "{what} needs hwloc: build with `--features dmkit/hwloc` (Debian: libhwloc-dev, libudev-dev)"
    ))
}

#[cfg(feature = "hwloc")]
mod hw {
    //! The `hwloc` feature: hwlocality (Rust bindings to hwloc 2).
    use hwlocality::cpu::binding::CpuBindingFlags;
    use hwlocality::memory::binding::{MemoryBindingFlags, MemoryBindingPolicy};
    use hwlocality::object::types::ObjectType;
    use hwlocality::Topology as Hw;

    use super::{NumaError, Socket, Topology};

    fn hw() -> Result<Hw, NumaError> {
        Hw::new().map_err(|e| NumaError::Hwloc(e.to_string()))
    }

    pub(super) fn topology() -> Result<Topology, NumaError> {
        let t = hw()?;
        let sockets = t
            .objects_with_type(ObjectType::Package)
            .enumerate()
            .map(|(i, p)| Socket {
                id: i,
                cpus: p
                    .cpuset()
                    .map(|c| c.iter_set().map(usize::from).collect())
                    .unwrap_or_default(),
            })
            .collect::<Vec<_>>();
        if sockets.is_empty() {
            return Err(NumaError::Hwloc("no packages".into()));
        }
        Ok(Topology {
            sockets,
            source: "hwloc",
        })
    }

    fn package(t: &Hw, socket: usize) -> Result<&hwlocality::object::TopologyObject, NumaError> {
        let n = t.objects_with_type(ObjectType::Package).count();
        t.objects_with_type(ObjectType::Package)
            .nth(socket)
            .ok_or(NumaError::NoSuchSocket { socket, sockets: n })
    }

    pub(super) fn pin(socket: usize) -> Result<(), NumaError> {
        let t = hw()?;
        let p = package(&t, socket)?;
        let set = p
            .cpuset()
            .ok_or_else(|| NumaError::Hwloc("package without CPUs".into()))?
            .clone_target();
        t.bind_cpu(&set, CpuBindingFlags::THREAD)
            .map_err(|e| NumaError::Hwloc(e.to_string()))
    }

    pub(super) fn bind_memory(socket: usize) -> Result<(), NumaError> {
        let t = hw()?;
        let p = package(&t, socket)?;
        let set = p
            .nodeset()
            .ok_or_else(|| NumaError::Hwloc("package without memory".into()))?
            .clone_target();
        t.bind_memory(&set, MemoryBindingPolicy::Bind, MemoryBindingFlags::PROCESS)
            .map_err(|e| NumaError::Hwloc(e.to_string()))
    }
}

/// A request handed to a proxy.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ProxyOp {
    /// READ `len` bytes at `src`.
    Read {
        /// Where to read.
        src: RemoteRef,
        /// Bytes to read.
        len: usize,
    },
    /// WRITE `data` to `dst`.
    Write {
        /// Where to write.
        dst: RemoteRef,
        /// The bytes written.
        data: Vec<u8>,
    },
    /// CAS of the word at `at`.
    Cas {
        /// The 8-byte word.
        at: RemoteRef,
        /// The value it must hold.
        expected: u64,
        /// The value it gets if so.
        desired: u64,
    },
    /// FAA of the word at `at`.
    Faa {
        /// The 8-byte word.
        at: RemoteRef,
        /// Added to it.
        add: u64,
    },
}

impl ProxyOp {
    /// The remote memory it touches.
    pub fn target(&self) -> RemoteRef {
        match self {
            ProxyOp::Read { src, .. } => *src,
            ProxyOp::Write { dst, .. } => *dst,
            ProxyOp::Cas { at, .. } | ProxyOp::Faa { at, .. } => *at,
        }
    }

    /// Task-local bytes the proxy needs for it.
    fn local_len(&self) -> usize {
        match self {
            ProxyOp::Read { len, .. } => len.next_multiple_of(8),
            ProxyOp::Write { data, .. } => data.len().next_multiple_of(8),
            _ => 0,
        }
    }
}

/// What a proxy hands back.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ProxyReply {
    /// A READ's bytes.
    Data(Vec<u8>),
    /// An atomic's old value.
    Value(u64),
    /// A WRITE completed.
    Done,
}

type Answer = Option<(Nanos, Result<ProxyReply, FabricError>)>;

struct Request {
    op: ProxyOp,
    visible_at: Nanos,
    answer: Arc<Mutex<Answer>>,
}

/// The shared-memory queue between the tasks of one socket and a proxy on
/// another (see the module docs). Cheap to share (`Arc`).
pub struct ProxyQueue {
    queue: Mutex<VecDeque<Request>>,
    /// One way between the sockets: a request (or answer) is visible to the
    /// other side this long after it was queued.
    hop: Nanos,
    /// How often each side looks.
    poll: Nanos,
}

/// Requests a proxy takes in one round (one doorbell).
pub const PROXY_BATCH: usize = 16;

impl ProxyQueue {
    /// A queue whose messages take `hop` to cross and whose sides look
    /// every `poll`.
    pub fn new(hop: Nanos, poll: Nanos) -> Arc<Self> {
        Arc::new(Self {
            queue: Mutex::default(),
            hop,
            poll: poll.max(1),
        })
    }

    /// Hands `op` to the proxy and waits for its answer.
    pub async fn call(&self, ctx: &Ctx, op: ProxyOp) -> Result<ProxyReply, FabricError> {
        let answer: Arc<Mutex<Answer>> = Arc::default();
        self.queue
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push_back(Request {
                op,
                visible_at: ctx.now() + self.hop,
                answer: answer.clone(),
            });
        loop {
            ctx.sleep(self.poll).await;
            let mut a = answer.lock().unwrap_or_else(|p| p.into_inner());
            if a.as_ref().is_some_and(|(at, _)| ctx.now() >= *at) {
                return a.take().expect("checked").1;
            }
        }
    }

    /// Requests waiting (for tests and reports).
    pub fn len(&self) -> usize {
        self.queue.lock().unwrap_or_else(|p| p.into_inner()).len()
    }

    /// Whether no request waits.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The proxy's loop, run by a task on the other socket until `stop()`
    /// says so: takes up to [`PROXY_BATCH`] visible requests (that fit
    /// `scratch`), posts them with one doorbell, waits, answers. Returns
    /// the requests it served.
    pub async fn serve(&self, ctx: &Ctx, scratch: Local, stop: impl Fn() -> bool) -> u64 {
        let mut served = 0;
        while !stop() {
            let batch = self.take(ctx.now(), scratch.len());
            if batch.is_empty() {
                ctx.sleep(self.poll).await;
                continue;
            }
            served += batch.len() as u64;
            self.run(ctx, scratch, batch).await;
        }
        served
    }

    fn take(&self, now: Nanos, room: usize) -> Vec<Request> {
        let mut q = self.queue.lock().unwrap_or_else(|p| p.into_inner());
        let mut out = Vec::new();
        let mut used = 0;
        while out.len() < PROXY_BATCH {
            let Some(front) = q.front() else { break };
            let need = front.op.local_len();
            if front.visible_at > now || (used + need > room && !out.is_empty()) {
                break;
            }
            if need > room {
                // Too large for the proxy's memory: refuse it.
                let r = q.pop_front().expect("front exists");
                *r.answer.lock().unwrap_or_else(|p| p.into_inner()) = Some((
                    now,
                    Err(FabricError::Unsupported {
                        backend: "proxy",
                        what: format!(
                            "a {need}-byte request through a proxy with {room} B of memory"
                        ),
                    }),
                ));
                continue;
            }
            used += need;
            out.push(q.pop_front().expect("front exists"));
        }
        out
    }

    async fn run(&self, ctx: &Ctx, scratch: Local, batch: Vec<Request>) {
        let mut at = 0;
        let mut slots = Vec::with_capacity(batch.len());
        for r in &batch {
            let n = r.op.local_len();
            let mine = scratch.slice(at, n);
            at += n;
            let t = match &r.op {
                ProxyOp::Read { src, len } => ctx.read(*src, mine.prefix(*len)),
                ProxyOp::Write { dst, data } => {
                    ctx.put_local(mine, data);
                    ctx.write(*dst, mine.prefix(data.len()))
                }
                ProxyOp::Cas {
                    at,
                    expected,
                    desired,
                } => ctx.cas(*at, *expected, *desired),
                ProxyOp::Faa { at, add } => ctx.faa(*at, *add),
            };
            slots.push((mine, t));
        }
        ctx.post();
        let r = ctx.sync().await;
        let visible = ctx.now() + self.hop;
        for (req, (mine, t)) in batch.into_iter().zip(slots) {
            let reply = match (&r, &req.op) {
                // (One error for the proxy's batch: each caller gets it
                // as text, naming its node.)
                (Err(e), op) => Err(FabricError::Protocol {
                    node: op.target().addr.node(),
                    what: format!("through a proxy: {e}"),
                }),
                (Ok(()), ProxyOp::Read { len, .. }) => {
                    let mut v = vec![0; *len];
                    ctx.get_local(mine, &mut v);
                    Ok(ProxyReply::Data(v))
                }
                (Ok(()), ProxyOp::Write { .. }) => Ok(ProxyReply::Done),
                (Ok(()), _) => Ok(ProxyReply::Value(ctx.value(t))),
            };
            *req.answer.lock().unwrap_or_else(|p| p.into_inner()) = Some((visible, reply));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cpu_lists_parse() {
        assert_eq!(
            parse_cpulist("0-3,8,10-11"),
            Some(vec![0, 1, 2, 3, 8, 10, 11])
        );
        assert_eq!(parse_cpulist(""), Some(vec![]));
        assert_eq!(parse_cpulist("3-1"), None);
        assert_eq!(parse_cpulist("x"), None);
    }

    #[test]
    fn sysfs_topologies_and_the_single_socket_rule() {
        let d = tempfile_dir();
        for (n, list) in [(0, "0-3"), (1, "4-7")] {
            let p = d.join(format!("node{n}"));
            std::fs::create_dir_all(&p).unwrap();
            std::fs::write(p.join("cpulist"), format!("{list}\n")).unwrap();
        }
        std::fs::write(d.join("online"), "0-1\n").unwrap();
        let t = Topology::from_sysfs(&d).unwrap();
        assert_eq!(t.sockets.len(), 2);
        assert_eq!(t.sockets[1].cpus, vec![4, 5, 6, 7]);
        assert!(t.proxy_reason().is_none());
        std::fs::remove_dir_all(d.join("node1")).unwrap();
        let one = Topology::from_sysfs(&d).unwrap();
        assert!(one.proxy_reason().unwrap().contains("the proxy is off"));
        std::fs::remove_dir_all(&d).unwrap();
        // This host, whatever it is, is described.
        assert!(!Topology::detect().sockets.is_empty());
    }

    fn tempfile_dir() -> std::path::PathBuf {
        let d = std::env::temp_dir().join(format!(
            "dmkit-numa-{}-{:?}",
            std::process::id(),
            std::thread::current().id()
        ));
        std::fs::create_dir_all(&d).unwrap();
        d
    }
}
