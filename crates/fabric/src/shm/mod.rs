//! The `shm` backend: memory nodes on this host, verbs executed by the
//! compute threads' own CPUs on memfd mappings.
//!
//! A node runs either embedded (in this process: [`ShmFabric::embedded`], the
//! default) or as its own process (`dmkit memnode --listen unix:PATH`,
//! reached with [`ShmFabric::open`]). Either way a compute thread's
//! [`ShmQp`] checks each request against the node's protection table, translates
//! it through the node's page table, and performs it directly:
//! WRITE copies aligned words in ascending address order (so the backend
//! declares in-order placement), CAS/FAA/masked CAS are hardware atomics.
//! The node's CPU only serves RPCs.
//!
//! Protection is enforced by this library on the caller's side, as an RNIC
//! enforces it in hardware: it stops buggy clients, not hostile code that
//! holds the memfd (only authenticated processes of the same user get it).
//!
//! Deferred READs (on by default, [`ShmConfig::deferred_reads`]): a READ is
//! checked at post but copied when its completion is polled, with its lines
//! prefetched in between, so the misses of a worker's outstanding READs
//! overlap as an RNIC overlaps them; per-queue-pair order is kept (details
//! in [`ShmQp`]).
//!
//! Latency model: with [`ShmConfig::rtt`] set, a completion becomes visible
//! `rtt` after its batch was posted (data moves at post time; only the
//! completion is delayed), emulating a network round trip. An RPC is one
//! round trip too: its request reaches the node's ring half a round trip
//! after it was sent and its reply is seen half a round trip after the
//! worker answered ([`ShmRpcChannel`]).

mod client;
mod qp;
mod rpc;
mod stream;
pub(crate) mod view;

use std::io::Write;
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use dmkit_memnode::{proto, MemNode, NodeConfig, RegionInfo, Request, Response, SessionId};

pub use qp::ShmQp;
pub use rpc::ShmRpcChannel;
use view::NodeView;

use crate::addr::NodeId;
use crate::caps::Capabilities;
use crate::error::FabricError;
use crate::exec::Executor;
use crate::rpc::RpcChannel;
use crate::{Fabric, NodeRpc, QueuePair};

/// Options of the shm backend.
#[derive(Debug, Clone, Copy)]
pub struct ShmConfig {
    /// Delay of every completion (a network round trip), or none; an RPC
    /// call is delayed by the same round trip (half each way).
    pub rtt: Option<Duration>,
    /// Most requests per batch.
    pub max_batch: usize,
    /// Largest inline WRITE.
    pub max_inline: usize,
    /// Slots of an RPC channel's rings (requests unanswered at once).
    pub rpc_slots: u32,
    /// Largest RPC request or reply payload.
    pub rpc_max_message: u32,
    /// Copy a scalar READ when its completion is polled (or before the
    /// queue pair's next non-READ request) instead of at post, prefetching
    /// its lines at post and at the poll, so the cache misses of many
    /// outstanding READs overlap as on an RNIC (see [`ShmQp`]). Checks that
    /// need no remote memory still fail at post. Ignored with `rtt`.
    pub deferred_reads: bool,
    /// After a WRITE of `len` bytes, hint the (at most 1 KiB of) lines
    /// that follow it in remote memory for writing (`PREFETCHW`), so the
    /// next WRITE of a sequential stream — a shuffle partition's buffer, a
    /// log — finds its lines owned instead of stalling on a
    /// read-for-ownership of each cold line; an RNIC writes memory without
    /// the posting CPU waiting for it. [`WritePrefetch::Stream`] (the
    /// default) hints only after a WRITE that continues a stream, so
    /// scattered WRITEs (a hash table's key-value blocks) do not pay for
    /// hints nobody uses. A hint: the bytes and order of every WRITE are
    /// unchanged. Ignored by [`ShmFabric::executor`].
    pub write_prefetch: WritePrefetch,
    /// How long an RPC channel waits with requests unanswered and no reply
    /// at all before it fails them with [`crate::RpcFailure::NoReply`] and
    /// closes ([`crate::rpc::ReplyClock`]): a memory node process that was
    /// killed never marks its channels closed. A service may take its
    /// time, so this is long; a deferred call answered later fails so.
    /// A channel that gave up stays closed: a runtime worker connects its
    /// channels once, so its later calls to that node fail too.
    /// A node worker publishes the replies of the up to 32 requests it
    /// takes from a ring in one round together (verbs sends each at
    /// once), so here the timeout must exceed 32 of the slowest service's
    /// calls.
    pub rpc_reply_timeout: Duration,
}

/// Which WRITEs hint the lines after them for writing
/// ([`ShmConfig::write_prefetch`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum WritePrefetch {
    /// No WRITE hints.
    Off,
    /// A WRITE hints when it continues a stream: it starts exactly where
    /// one of the queue pair's last 8 WRITEs to its node ended (so the 8
    /// interleaved partition buffers of an unbatched shuffle still
    /// qualify). The first WRITE of a stream hints nothing.
    #[default]
    Stream,
    /// Every WRITE hints (costs a few prefetches per scattered WRITE).
    Always,
}

impl Default for ShmConfig {
    fn default() -> Self {
        Self {
            rtt: None,
            max_batch: 256,
            max_inline: 256,
            rpc_slots: 64,
            rpc_max_message: 4096,
            deferred_reads: true,
            write_prefetch: WritePrefetch::default(),
            rpc_reply_timeout: Duration::from_secs(30),
        }
    }
}

impl ShmConfig {
    /// The capabilities of a fabric of these options whose nodes run
    /// `rpc_workers` RPC workers (the fewest of any node).
    fn caps(&self, rpc_workers: usize) -> Capabilities {
        Capabilities {
            rpc_workers,
            in_order_write: true,
            masked_cas: true,
            max_batch: self.max_batch,
            max_inline: self.max_inline,
            max_message: 1 << 30,
            max_sge: 16,
            on_nic_memory: false,
            explicit_doorbells: false,
        }
    }
}

/// Where a memory node process listens.
#[derive(Debug, Clone)]
pub struct Target {
    /// The node's Unix socket (`dmkit memnode --listen unix:PATH`).
    pub socket: PathBuf,
    /// The file holding the node's secret token (mode 0600); by default
    /// `SOCKET.token`.
    pub token_file: PathBuf,
}

impl Target {
    /// A node at `socket` with its default token file `SOCKET.token`.
    pub fn new(socket: impl Into<PathBuf>) -> Self {
        let socket = socket.into();
        let token_file = dmkit_memnode::server::default_token_path(&socket);
        Self { socket, token_file }
    }
}

enum Control {
    Embedded {
        node: Arc<MemNode>,
        session: SessionId,
    },
    Socket {
        stream: Mutex<UnixStream>,
    },
}

struct ShmNode {
    id: NodeId,
    view: Arc<NodeView>,
    heap: RegionInfo,
    control: Control,
    rpc_workers: usize,
}

/// A fabric of shm memory nodes.
pub struct ShmFabric {
    cfg: ShmConfig,
    caps: Capabilities,
    nodes: Vec<ShmNode>,
}

impl ShmFabric {
    /// Creates memory nodes in this process.
    pub fn embedded(cfg: ShmConfig, nodes: &[NodeConfig]) -> Result<Self, FabricError> {
        let mut made = Vec::with_capacity(nodes.len());
        for nc in nodes {
            let node = MemNode::new(nc.clone()).map_err(|error| FabricError::Node {
                node: nc.node_id,
                error,
            })?;
            made.push(node);
        }
        Self::with_nodes(cfg, made)
    }

    /// Creates one memory node in this process: node 0 of `size` bytes,
    /// the rest of its configuration [`NodeConfig`]'s defaults. The fabric
    /// of a test, an example or a single-process tool; [`Self::embedded`]
    /// for more nodes or other node settings.
    pub fn one_node(cfg: ShmConfig, size: u64) -> Result<Self, FabricError> {
        Self::embedded(
            cfg,
            &[NodeConfig {
                size,
                ..Default::default()
            }],
        )
    }

    /// Uses memory nodes already running in this process.
    pub fn with_nodes(cfg: ShmConfig, nodes: Vec<Arc<MemNode>>) -> Result<Self, FabricError> {
        let mut out = Vec::with_capacity(nodes.len());
        for node in nodes {
            let l = node.layout();
            let view = NodeView::new(l, node.data_mapping(), node.control_mapping()).map_err(
                |reason| FabricError::Connect {
                    target: format!("embedded node {}", l.node_id),
                    reason,
                },
            )?;
            out.push(ShmNode {
                id: l.node_id,
                view: Arc::new(view),
                heap: node.heap_region(),
                rpc_workers: node.rpc_workers(),
                control: Control::Embedded {
                    session: node.open_session(),
                    node,
                },
            });
        }
        Self::assemble(cfg, out)
    }

    /// Connects to memory node processes over their Unix sockets.
    pub fn open(cfg: ShmConfig, targets: &[Target]) -> Result<Self, FabricError> {
        let mut out = Vec::with_capacity(targets.len());
        for t in targets {
            let c = client::connect(&t.socket, &t.token_file)?;
            out.push(ShmNode {
                id: c.view.layout().node_id,
                view: Arc::new(c.view),
                heap: c.welcome.heap,
                rpc_workers: c.welcome.rpc_workers as usize,
                control: Control::Socket {
                    stream: Mutex::new(c.stream),
                },
            });
        }
        Self::assemble(cfg, out)
    }

    fn assemble(cfg: ShmConfig, mut nodes: Vec<ShmNode>) -> Result<Self, FabricError> {
        if nodes.is_empty() {
            return Err(FabricError::Connect {
                target: "shm".into(),
                reason: "no memory node given".into(),
            });
        }
        nodes.sort_by_key(|n| n.id);
        if let Some(w) = nodes.windows(2).find(|w| w[0].id == w[1].id) {
            return Err(FabricError::Connect {
                target: "shm".into(),
                reason: format!("two memory nodes share id {}", w[0].id),
            });
        }
        let workers = nodes.iter().map(|n| n.rpc_workers).min().unwrap_or(0);
        Ok(Self {
            caps: cfg.caps(workers),
            cfg,
            nodes,
        })
    }

    fn node(&self, id: NodeId) -> Result<&ShmNode, FabricError> {
        self.nodes
            .binary_search_by_key(&id, |n| n.id)
            .map(|i| &self.nodes[i])
            .map_err(|_| FabricError::NoSuchNode(id))
    }

    /// The in-process memory node `id`, if it is embedded.
    pub fn embedded_node(&self, id: NodeId) -> Option<Arc<MemNode>> {
        match &self.node(id).ok()?.control {
            Control::Embedded { node, .. } => Some(node.clone()),
            Control::Socket { .. } => None,
        }
    }

    /// A request executor on node `id` with this fabric's capabilities:
    /// the checks and memory access of a queue pair, without its
    /// completion queue (the simulator executes requests through it at
    /// their simulated instants).
    pub fn executor(&self, id: NodeId) -> Result<Executor, FabricError> {
        let n = self.node(id)?;
        Ok(Executor::new(n.id, n.view.clone(), self.caps))
    }

    /// Creates a concrete shm queue pair (no dynamic dispatch).
    pub fn connect_qp(&self, node: NodeId) -> Result<ShmQp, FabricError> {
        let n = self.node(node)?;
        Ok(ShmQp::new(
            n.id,
            n.view.clone(),
            self.caps,
            self.cfg.rtt,
            self.cfg.deferred_reads,
            self.cfg.write_prefetch,
        ))
    }

    /// Opens a concrete shm RPC channel to `node` (see
    /// [`Fabric::connect_rpc`]).
    pub fn connect_rpc_channel(&self, node: NodeId) -> Result<ShmRpcChannel, FabricError> {
        let n = self.node(node)?;
        if n.rpc_workers == 0 {
            return Err(FabricError::Unsupported {
                backend: "shm",
                what: format!("RPC channels to memory node {node}, which runs no RPC workers"),
            });
        }
        let (slots, max) = (self.cfg.rpc_slots, self.cfg.rpc_max_message);
        let ring = match &n.control {
            Control::Embedded { node: mn, session } => {
                let g = mn.open_rpc_channel(*session, slots, max).map_err(|e| {
                    FabricError::Refused {
                        node,
                        error: e.into(),
                    }
                })?;
                dmkit_memnode::rpc::ring::RingView::open(g.mapping, g.geometry)
                    .map_err(|what| FabricError::Protocol { node, what })?
            }
            Control::Socket { stream } => {
                let mut s = stream
                    .lock()
                    .map_err(|_| FabricError::ConnectionLost(node))?;
                client::open_channel(&mut s, node, slots, max)?
            }
        };
        let g = ring.geometry();
        if g.worker as usize >= dmkit_memnode::layout::MAX_WORKER_BELLS
            || g.slots != slots
            || g.max_message != max
        {
            return Err(FabricError::Protocol {
                node,
                what: format!("channel geometry {g:?} is not the one asked for"),
            });
        }
        Ok(ShmRpcChannel::new(
            node,
            ring,
            n.view.clone(),
            self.cfg.rtt,
            self.cfg.rpc_reply_timeout,
        ))
    }
}

impl Drop for ShmFabric {
    fn drop(&mut self) {
        for n in &self.nodes {
            if let Control::Embedded { node, session } = &n.control {
                node.close_session(*session);
            }
        }
    }
}

impl Fabric for ShmFabric {
    fn backend(&self) -> &'static str {
        "shm"
    }

    fn nodes(&self) -> Vec<NodeId> {
        self.nodes.iter().map(|n| n.id).collect()
    }

    fn caps(&self) -> Capabilities {
        self.caps
    }

    fn connect(&self, node: NodeId) -> Result<Box<dyn QueuePair>, FabricError> {
        Ok(Box::new(self.connect_qp(node)?))
    }

    fn connect_rpc(&self, node: NodeId) -> Result<Box<dyn RpcChannel>, FabricError> {
        Ok(Box::new(self.connect_rpc_channel(node)?))
    }
}

/// The control plane: the memory node's RPC, in process (embedded nodes)
/// or over the node's Unix socket.
impl NodeRpc for ShmFabric {
    fn node_heap(&self, node: NodeId) -> Result<RegionInfo, FabricError> {
        Ok(self.node(node)?.heap)
    }

    fn rpc(&self, node: NodeId, req: Request) -> Result<Response, FabricError> {
        let n = self.node(node)?;
        match &n.control {
            Control::Embedded { node, session } => Ok(node.handle(*session, req)),
            Control::Socket { stream } => {
                let mut s = stream
                    .lock()
                    .map_err(|_| FabricError::ConnectionLost(node))?;
                let lost = |_| FabricError::ConnectionLost(node);
                proto::write_frame(&mut *s, &proto::encode(&req)).map_err(lost)?;
                s.flush().map_err(lost)?;
                let payload = proto::read_frame(&mut *s)
                    .map_err(lost)?
                    .ok_or(FabricError::ConnectionLost(node))?;
                proto::decode(&payload).map_err(|e| FabricError::Protocol {
                    node,
                    what: e.to_string(),
                })
            }
        }
    }
}

/// Parses `unix:PATH` (or a bare path) into a socket path.
pub fn parse_unix_target(s: &str) -> Result<PathBuf, String> {
    let p = s.strip_prefix("unix:").unwrap_or(s);
    if p.is_empty() {
        return Err(format!("{s:?}: expected unix:PATH"));
    }
    if s.contains("://") || (s.contains(':') && !s.starts_with("unix:")) {
        return Err(format!(
            "{s:?}: only unix:PATH is supported by the shm backend"
        ));
    }
    Ok(Path::new(p).to_owned())
}
