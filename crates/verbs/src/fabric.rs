//! The compute side: [`VerbsFabric`] implements the fabric contract over
//! real RC queue pairs.
//!
//! Resources follow SMART §4.1's thread-aware allocation: one device
//! context, protection domain and set of local registrations per process;
//! per thread one completion queue shared by that thread's queue pairs (one
//! per memory node), and — where the provider has thread domains — a
//! doorbell register of its own ([`QpPolicy::PerThreadDoorbell`]).
//! Without thread domains the provider maps queue pairs to its doorbell
//! registers itself (mlx5: round-robin over the low-latency UARs, see
//! `MLX5_TOTAL_UUARS`), which is what [`QpPolicy::PerThreadQp`] gets.
//! [`QpPolicy::Shared`] and [`QpPolicy::Multiplexed`] share one real queue
//! pair between threads through [`SharedQp`] (a lock), as the
//! micro-benchmark's baselines.

use std::collections::HashMap;
use std::net::TcpStream;
use std::sync::{Arc, Mutex, RwLock, Weak};
use std::thread::ThreadId;
use std::time::Duration;

use dmkit_fabric::{
    Capabilities, Fabric, FabricError, NodeId, NodeRpc, QpPolicy, QueuePair, RegionInfo,
    RpcChannel, SharedQp,
};
use dmkit_memnode::server::read_token_file;
use dmkit_memnode::NodeLayout;
use dmkit_memnode::{Request, Response};

use crate::config::{VerbsConfig, VerbsTarget};
use crate::ctl::{self, Ctl, CtlReply, NicRegion, CTL_MAGIC, CTL_VERSION};
use crate::device::{Device, DeviceCaps, Endpoint};
use crate::error::VerbsError;
use crate::qp::{Cq, QpSizes, RawQp};
use crate::rpc::VerbsRpcChannel;
use crate::vqp::{SharedCq, VerbsQp};

/// The control connection and region table of one memory node.
pub(crate) struct NodeLink {
    pub(crate) id: NodeId,
    pub(crate) peer: String,
    ctl: Mutex<TcpStream>,
    pub(crate) heap: RegionInfo,
    pub(crate) layout: NodeLayout,
    pub(crate) device: DeviceCaps,
    /// The node's RPC worker threads.
    pub(crate) rpc_workers: u32,
    regions: RwLock<Arc<Vec<NicRegion>>>,
}

impl NodeLink {
    fn open(t: &VerbsTarget, timeout: Duration) -> Result<NodeLink, VerbsError> {
        let control = |what: String| VerbsError::Control {
            peer: t.addr.clone(),
            what,
        };
        let token = read_token_file(&t.token_file)
            .map_err(|e| control(format!("token file {}: {e}", t.token_file.display())))?;
        let mut s = TcpStream::connect(&t.addr).map_err(|e| control(format!("connect: {e}")))?;
        let _ = s.set_nodelay(true);
        let _ = s.set_read_timeout(Some(timeout));
        ctl::send(
            &mut s,
            &Ctl::Hello {
                magic: CTL_MAGIC,
                version: CTL_VERSION,
                token,
            },
        )
        .map_err(|e| control(format!("hello: {e}")))?;
        match ctl::recv::<CtlReply>(&mut s).map_err(|e| control(format!("welcome: {e}")))? {
            Some(CtlReply::Welcome {
                layout,
                heap,
                regions,
                device,
                rpc_workers,
                ..
            }) => Ok(NodeLink {
                id: layout.node_id,
                peer: t.addr.clone(),
                ctl: Mutex::new(s),
                heap,
                layout,
                device,
                rpc_workers,
                regions: RwLock::new(Arc::new(regions)),
            }),
            Some(CtlReply::Refused(why)) => Err(control(format!("refused: {why}"))),
            other => Err(control(format!("unexpected answer {other:?}"))),
        }
    }

    /// One call on the control channel.
    pub(crate) fn call(&self, msg: &Ctl) -> Result<CtlReply, FabricError> {
        let mut s = self.ctl.lock().unwrap_or_else(|e| e.into_inner());
        let lost = |_| FabricError::ConnectionLost(self.id);
        ctl::send(&mut *s, msg).map_err(lost)?;
        match ctl::recv::<CtlReply>(&mut *s).map_err(lost)? {
            Some(r) => Ok(r),
            None => Err(FabricError::ConnectionLost(self.id)),
        }
    }

    /// The region table as last fetched.
    pub(crate) fn regions(&self) -> Arc<Vec<NicRegion>> {
        self.regions
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    /// Fetches the region table again (after the node changed it).
    pub(crate) fn refresh_regions(&self) -> Result<Arc<Vec<NicRegion>>, FabricError> {
        match self.call(&Ctl::Regions)? {
            CtlReply::Regions(r) => {
                let r = Arc::new(r);
                *self.regions.write().unwrap_or_else(|e| e.into_inner()) = r.clone();
                Ok(r)
            }
            other => Err(self.unexpected(other)),
        }
    }

    /// An answer that does not fit the call.
    pub(crate) fn unexpected(&self, reply: CtlReply) -> FabricError {
        FabricError::Protocol {
            node: self.id,
            what: format!("{reply:?}"),
        }
    }

    /// Asks the node for a queue pair connected to `client` (replacing
    /// `replace` if given); returns the node's endpoint.
    pub(crate) fn connect_qp(
        &self,
        client: Endpoint,
        replace: Option<u32>,
    ) -> Result<Endpoint, FabricError> {
        let msg = match replace {
            None => Ctl::Connect { client },
            Some(server_qpn) => Ctl::Reconnect { server_qpn, client },
        };
        match self.call(&msg)? {
            CtlReply::Connected { server } => Ok(server),
            CtlReply::Refused(why) => Err(FabricError::Connect {
                target: self.peer.clone(),
                reason: why,
            }),
            other => Err(self.unexpected(other)),
        }
    }
}

impl NodeLink {
    /// Asks the node for the node end of an RPC channel connected to the
    /// client's message queue pair `client`; returns the node's endpoint.
    pub(crate) fn connect_rpc(
        &self,
        client: Endpoint,
        slots: u32,
        max_message: u32,
    ) -> Result<Endpoint, FabricError> {
        match self.call(&Ctl::ConnectRpc {
            client,
            slots,
            max_message,
        })? {
            CtlReply::Connected { server } => Ok(server),
            CtlReply::Refused(why) => Err(FabricError::Connect {
                target: self.peer.clone(),
                reason: why,
            }),
            other => Err(self.unexpected(other)),
        }
    }
}

/// The verbs fabric: one device, control links to memory nodes.
pub struct VerbsFabric {
    pub(crate) dev: Arc<Device>,
    links: Vec<Arc<NodeLink>>,
    caps: Capabilities,
    sizes: QpSizes,
    /// See [`VerbsConfig::completion_timeout`].
    completion_timeout: std::time::Duration,
    /// See [`VerbsConfig::rpc_reply_timeout`].
    rpc_reply_timeout: std::time::Duration,
    /// Slots and message size of RPC channels.
    rpc_slots: u32,
    rpc_max_message: u32,
    thread_domains: bool,
    /// Per-thread completion queues (thread-aware allocation).
    cqs: Mutex<HashMap<ThreadId, Weak<SharedCq>>>,
    /// Open groups of shared / multiplexed queue pairs, by (node, group size).
    groups: Mutex<HashMap<(NodeId, usize), Vec<SharedQp>>>,
}

impl VerbsFabric {
    /// Opens the device and connects the control channel of every target.
    pub fn open(cfg: VerbsConfig, targets: &[VerbsTarget]) -> Result<Self, VerbsError> {
        if targets.is_empty() {
            return Err(VerbsError::Config(
                "--backend verbs needs at least one memory node (--connect tcp:HOST:PORT)".into(),
            ));
        }
        let dev = Device::open(&cfg.device)?;
        let mut links: Vec<Arc<NodeLink>> = Vec::new();
        for t in targets {
            let l = NodeLink::open(t, cfg.control_timeout)?;
            if links.iter().any(|o| o.id == l.id) {
                return Err(VerbsError::Config(format!(
                    "{} and {} are both memory node {}; give each node its own --node-id",
                    links.iter().find(|o| o.id == l.id).expect("found").peer,
                    l.peer,
                    l.id
                )));
            }
            links.push(Arc::new(l));
        }
        links.sort_by_key(|l| l.id);
        // Probe what a queue pair is granted (inline size, SGEs), so the
        // capabilities are the device's, not hopes.
        let dcaps = dev.caps();
        let want = QpSizes {
            send_wr: cfg.sq_depth.min(dcaps.max_qp_wr.max(1)),
            sge: dcaps.max_sge.clamp(1, dmkit_fabric::exec::MAX_SGE as u32),
            inline: cfg.max_inline,
        };
        let probe_cq = Arc::new(Cq::new(&dev, 4)?);
        let sizes = match RawQp::create(&dev, &probe_cq, want, false) {
            Ok(q) => q.granted,
            Err(_) => RawQp::create(&dev, &probe_cq, QpSizes { inline: 0, ..want }, false)?.granted,
        };
        let sizes = QpSizes {
            send_wr: sizes.send_wr.min(want.send_wr),
            sge: sizes.sge.min(want.sge),
            inline: sizes.inline.min(want.inline),
        };
        let thread_domains = dev.thread_domains();
        let caps = Capabilities {
            // The verbs specification does not order the placement of one
            // WRITE's bytes; data structures use a second WRITE instead.
            in_order_write: false,
            // Masked atomics need mlx5dv extended atomics: not implemented.
            masked_cas: false,
            max_batch: cfg.max_batch.min(sizes.send_wr as usize).max(1),
            max_inline: sizes.inline as usize,
            max_message: dcaps.max_msg.min(1 << 30) as usize,
            max_sge: sizes.sge as usize,
            on_nic_memory: false,
            explicit_doorbells: thread_domains,
            // The fewest of any node: a caller may count on that many.
            rpc_workers: links
                .iter()
                .map(|l| l.rpc_workers as usize)
                .min()
                .unwrap_or(0),
        };
        Ok(VerbsFabric {
            dev,
            links,
            caps,
            sizes,
            completion_timeout: cfg.completion_timeout,
            rpc_reply_timeout: cfg.rpc_reply_timeout,
            rpc_slots: cfg.rpc_slots.max(1),
            rpc_max_message: cfg.rpc_max_message,
            thread_domains,
            cqs: Mutex::new(HashMap::new()),
            groups: Mutex::new(HashMap::new()),
        })
    }

    /// The device in use.
    pub fn device(&self) -> &Device {
        &self.dev
    }

    /// The geometry node `node` announced.
    pub fn layout(&self, node: NodeId) -> Option<NodeLayout> {
        self.link(node).ok().map(|l| l.layout)
    }

    /// Whether the device reports on-demand paging (the node could remap
    /// without re-registering).
    pub fn odp(&self, node: NodeId) -> Option<bool> {
        self.link(node).ok().map(|l| l.device.odp)
    }

    fn link(&self, node: NodeId) -> Result<&Arc<NodeLink>, FabricError> {
        self.links
            .iter()
            .find(|l| l.id == node)
            .ok_or(FabricError::NoSuchNode(node))
    }

    /// The calling thread's completion queue (one per thread, shared by the
    /// thread's queue pairs, at most one per node on it).
    fn thread_cq(&self) -> Result<Arc<SharedCq>, FabricError> {
        let me = std::thread::current().id();
        let mut map = self.cqs.lock().unwrap_or_else(|e| e.into_inner());
        map.retain(|_, w| w.strong_count() > 0);
        if let Some(cq) = map.get(&me).and_then(Weak::upgrade) {
            if cq.try_join() {
                return Ok(cq);
            }
        }
        // Room for every queue pair's whole send queue: a CQ overrun would
        // break every queue pair on it.
        let slots = self.links.len().max(1);
        let depth = (self.sizes.send_wr as usize * slots).min(1 << 16) as u32;
        let cq = Cq::new(&self.dev, depth).map_err(|e| connect_err("this host", e))?;
        let shared = Arc::new(SharedCq::new(Arc::new(cq), slots));
        assert!(shared.try_join(), "a fresh CQ has room");
        map.insert(me, Arc::downgrade(&shared));
        Ok(shared)
    }

    fn new_qp(&self, node: NodeId, own_doorbell: bool) -> Result<VerbsQp, FabricError> {
        let link = self.link(node)?.clone();
        let cq = self.thread_cq()?;
        VerbsQp::connect(
            self.dev.clone(),
            link,
            cq,
            self.caps,
            self.sizes,
            own_doorbell,
            self.completion_timeout,
        )
    }
}

pub(crate) fn connect_err(target: &str, e: VerbsError) -> FabricError {
    FabricError::Connect {
        target: target.into(),
        reason: e.to_string(),
    }
}

impl Fabric for VerbsFabric {
    fn backend(&self) -> &'static str {
        "verbs"
    }

    fn nodes(&self) -> Vec<NodeId> {
        self.links.iter().map(|l| l.id).collect()
    }

    fn caps(&self) -> Capabilities {
        self.caps
    }

    fn connect(&self, node: NodeId) -> Result<Box<dyn QueuePair>, FabricError> {
        Ok(Box::new(self.new_qp(node, false)?))
    }

    fn connect_as(
        &self,
        node: NodeId,
        policy: QpPolicy,
    ) -> Result<Box<dyn QueuePair>, FabricError> {
        let group = match policy {
            QpPolicy::PerThreadQp => return self.connect(node),
            QpPolicy::PerThreadDoorbell => {
                if !self.thread_domains {
                    return Err(FabricError::Unsupported {
                        backend: "verbs",
                        what: format!(
                            "per-thread doorbells on {}: the provider has no thread domains \
                             (ibv_alloc_td); its queue pairs share doorbells by its own rule",
                            self.dev.name()
                        ),
                    });
                }
                return Ok(Box::new(self.new_qp(node, true)?));
            }
            QpPolicy::Shared => usize::MAX,
            QpPolicy::Multiplexed(n) => n,
        };
        let mut groups = self.groups.lock().unwrap_or_else(|e| e.into_inner());
        let open = groups.entry((node, group)).or_default();
        if open.is_empty() {
            // A new group: one real queue pair, handles for the group's
            // threads (a shared QP hands out handles as threads ask).
            let qp = self.connect(node)?;
            let handles = if group == usize::MAX { 1024 } else { group };
            *open = SharedQp::share(qp, handles);
            open.reverse();
        }
        let h = open.pop().expect("group has a handle");
        Ok(Box::new(h))
    }

    fn connect_rpc(&self, node: NodeId) -> Result<Box<dyn RpcChannel>, FabricError> {
        let link = self.link(node)?.clone();
        if link.rpc_workers == 0 {
            return Err(FabricError::Unsupported {
                backend: "verbs",
                what: format!("RPC channels to node {node}: it runs no RPC workers"),
            });
        }
        Ok(Box::new(VerbsRpcChannel::connect(
            &self.dev,
            link,
            self.rpc_slots,
            self.rpc_max_message,
            self.rpc_reply_timeout,
        )?))
    }
}

/// The control plane: the memory node's RPC over its TCP control channel.
impl NodeRpc for VerbsFabric {
    fn node_heap(&self, node: NodeId) -> Result<RegionInfo, FabricError> {
        Ok(self.link(node)?.heap)
    }

    fn rpc(&self, node: NodeId, req: Request) -> Result<Response, FabricError> {
        let link = self.link(node)?;
        match link.call(&Ctl::Rpc(req))? {
            CtlReply::Rpc(r) => Ok(r),
            other => Err(link.unexpected(other)),
        }
    }
}
