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
//! Latency model: with [`ShmConfig::rtt`] set, a completion becomes visible
//! `rtt` after its batch was posted (data moves at post time; only the
//! completion is delayed), emulating a network round trip.

mod client;
mod qp;
pub(crate) mod view;

use std::io::Write;
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use dmkit_memnode::{proto, MemNode, NodeConfig, RegionInfo, Request, Response, SessionId};

pub use qp::ShmQp;
use view::NodeView;

use crate::addr::NodeId;
use crate::caps::Capabilities;
use crate::error::FabricError;
use crate::exec::Executor;
use crate::{Fabric, NodeRpc, QueuePair};

/// Options of the shm backend.
#[derive(Debug, Clone, Copy)]
pub struct ShmConfig {
    /// Delay of every completion (a network round trip), or none.
    pub rtt: Option<Duration>,
    /// Most requests per batch.
    pub max_batch: usize,
    /// Largest inline WRITE.
    pub max_inline: usize,
}

impl Default for ShmConfig {
    fn default() -> Self {
        Self {
            rtt: None,
            max_batch: 256,
            max_inline: 256,
        }
    }
}

impl ShmConfig {
    fn caps(&self) -> Capabilities {
        Capabilities {
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
}

/// A fabric of shm memory nodes.
pub struct ShmFabric {
    cfg: ShmConfig,
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
        Ok(Self { cfg, nodes })
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
        Ok(Executor::new(n.id, n.view.clone(), self.cfg.caps()))
    }

    /// Creates a concrete shm queue pair (no dynamic dispatch).
    pub fn connect_qp(&self, node: NodeId) -> Result<ShmQp, FabricError> {
        let n = self.node(node)?;
        Ok(ShmQp::new(
            n.id,
            n.view.clone(),
            self.cfg.caps(),
            self.cfg.rtt,
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
        self.cfg.caps()
    }

    fn connect(&self, node: NodeId) -> Result<Box<dyn QueuePair>, FabricError> {
        Ok(Box::new(self.connect_qp(node)?))
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
