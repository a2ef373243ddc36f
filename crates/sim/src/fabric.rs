//! [`SimFabric`] and [`SimQp`]: the `sim` backend as the rest of dmkit sees
//! it — a [`Fabric`] like any other. Memory nodes are real (embedded shm
//! memory nodes: regions, keys, page tables, chunk allocator, roots), and
//! every request is executed by the same checked [`dmkit_fabric::Executor`]
//! the shm backend uses; only *when* things happen is simulated.

use std::cell::RefCell;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};

use dmkit_fabric::shm::ShmFabric;
use dmkit_fabric::{
    Batch, Capabilities, Completion, Fabric, FabricError, Lkey, LocalMem, NodeId, NodeRpc,
    PostError, QpPolicy, QpStats, QueuePair, RegionInfo, RpcChannel, RpcFailure, RpcReply,
    RpcSendError, ServiceId,
};
use dmkit_memnode::{Request, Response};

use crate::engine::Core;

/// Where the engine lives. One OS thread runs a simulation; other threads
/// may make blocking calls (tests, tools), serialised by a lock. While
/// [`crate::Sim::run_until`] runs, the engine moves into a thread-local
/// slot of the running thread ([`Shared::activate`]), so the virtual
/// threads' verbs — several calls per simulated request — reach it with a
/// thread-local borrow instead of a mutex's two atomic instructions (a
/// tenth of the simulator's time, measured with `dmkit sim speed`). A call
/// from another thread meanwhile waits until the run returns the engine.
pub(crate) struct Shared {
    id: u64,
    slot: Mutex<Option<Box<Core>>>,
    back: Condvar,
}

thread_local! {
    /// The engine of the simulation this thread is running, by its id.
    static ACTIVE: RefCell<Option<(u64, Box<Core>)>> = const { RefCell::new(None) };
}

static NEXT_ID: AtomicU64 = AtomicU64::new(1);

impl Shared {
    pub(crate) fn new(core: Core) -> Self {
        Self {
            id: NEXT_ID.fetch_add(1, Ordering::Relaxed),
            slot: Mutex::new(Some(Box::new(core))),
            back: Condvar::new(),
        }
    }

    /// Runs `f` on the engine: through the thread-local slot when this
    /// thread is running the simulation, else under the lock (waiting for
    /// a run on another thread to return the engine).
    ///
    /// # Panics
    /// When called from inside `f` (the engine is not reentrant).
    #[inline]
    pub(crate) fn with<R>(&self, f: impl FnOnce(&mut Core) -> R) -> R {
        ACTIVE.with(|a| {
            let mut a = a.borrow_mut();
            if let Some((id, core)) = a.as_mut() {
                if *id == self.id {
                    return f(core);
                }
            }
            drop(a);
            self.with_locked(f)
        })
    }

    #[cold]
    fn with_locked<R>(&self, f: impl FnOnce(&mut Core) -> R) -> R {
        f(self.home().as_mut().expect("home() waits for the engine"))
    }

    /// A panic inside the engine leaves nothing that matters more than the
    /// panic itself: a poisoned lock is taken over.
    fn lock(&self) -> MutexGuard<'_, Option<Box<Core>>> {
        self.slot.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The lock, once the engine is in it (a run on another thread has
    /// returned it).
    fn home(&self) -> MutexGuard<'_, Option<Box<Core>>> {
        let mut g = self.lock();
        while g.is_none() {
            g = self.back.wait(g).unwrap_or_else(|p| p.into_inner());
        }
        g
    }

    /// Moves the engine into this thread's slot until the guard drops (also
    /// when a panic unwinds through the run).
    ///
    /// # Panics
    /// If this thread is already running a simulation (runs do not nest).
    pub(crate) fn activate(&self) -> Active<'_> {
        let core = self.home().take().expect("home() waits for the engine");
        ACTIVE.with(|a| {
            let mut a = a.borrow_mut();
            assert!(
                a.is_none(),
                "a thread runs one simulation at a time (runs do not nest)"
            );
            *a = Some((self.id, core));
        });
        Active(self)
    }
}

/// The engine is in this thread's slot; dropping returns it to the lock.
pub(crate) struct Active<'a>(&'a Shared);

impl Drop for Active<'_> {
    fn drop(&mut self) {
        let taken = ACTIVE.with(|a| a.borrow_mut().take());
        if let Some((id, core)) = taken {
            debug_assert_eq!(id, self.0.id);
            *self.0.lock() = Some(core);
            self.0.back.notify_all();
        }
    }
}

/// The simulated fabric. The simulation runs on one OS thread; blocking
/// calls from other threads (tests, tools) are serialised by a lock.
pub struct SimFabric {
    pub(crate) core: Arc<Shared>,
    pub(crate) inner: ShmFabric,
    pub(crate) caps: Capabilities,
}

impl SimFabric {
    /// Declares `[addr, addr+len)` on-NIC device memory: atomics there are
    /// serialised for `atomic_nic_ns` instead of `atomic_ns` (SwordBox §3.2,
    /// Fig. 4; Sherman keeps its locks there).
    pub fn mark_device_memory(&self, addr: dmkit_fabric::GlobalAddr, len: u64) {
        self.core
            .with(|c| c.set_device_memory(addr.node(), addr.offset(), len));
    }

    /// The embedded memory nodes' fabric (control plane, direct access for
    /// tools; its verbs bypass the simulation).
    pub fn memory(&self) -> &ShmFabric {
        &self.inner
    }
}

impl Fabric for SimFabric {
    fn place_in_device_memory(&self, addr: dmkit_fabric::GlobalAddr, len: u64) -> bool {
        if !self.caps.on_nic_memory {
            return false;
        }
        self.mark_device_memory(addr, len);
        true
    }

    fn backend(&self) -> &'static str {
        "sim"
    }

    fn nodes(&self) -> Vec<NodeId> {
        self.inner.nodes()
    }

    fn caps(&self) -> Capabilities {
        self.caps
    }

    /// A queue pair with its own doorbell (SMART's thread-aware allocation).
    fn connect(&self, node: NodeId) -> Result<Box<dyn QueuePair>, FabricError> {
        self.connect_as(node, QpPolicy::PerThreadDoorbell)
    }

    fn connect_as(
        &self,
        node: NodeId,
        policy: QpPolicy,
    ) -> Result<Box<dyn QueuePair>, FabricError> {
        let exec = self.inner.executor(node)?.with_caps(self.caps);
        let h = self
            .core
            .with(|c| c.connect(node, policy, exec))
            .map_err(|reason| FabricError::Connect {
                target: format!("sim node {node}"),
                reason,
            })?;
        Ok(Box::new(SimQp {
            core: self.core.clone(),
            h,
            node,
            caps: self.caps,
        }))
    }

    /// A channel to the node's simulated worker cores ([`crate::rpc`]),
    /// owned by the calling virtual thread.
    fn connect_rpc(&self, node: NodeId) -> Result<Box<dyn RpcChannel>, FabricError> {
        if self.caps.rpc_workers == 0 {
            return Err(FabricError::Unsupported {
                backend: "sim",
                what: "RPC channels: the simulated memory nodes run no workers (rpc.cores = 0)"
                    .into(),
            });
        }
        let mn = self
            .inner
            .embedded_node(node)
            .ok_or(FabricError::NoSuchNode(node))?;
        let (c, (max, cap)) = self
            .core
            .with(|c| Ok::<_, String>((c.rpc_connect(node, mn)?, c.rpc_limits())))
            .map_err(|reason| FabricError::Connect {
                target: format!("sim node {node}"),
                reason,
            })?;
        Ok(Box::new(SimRpcChannel {
            core: self.core.clone(),
            c,
            node,
            max,
            cap,
        }))
    }
}

/// One virtual thread's RPC channel (see [`crate::rpc`] for its timing).
pub struct SimRpcChannel {
    core: Arc<Shared>,
    c: u32,
    node: NodeId,
    max: usize,
    cap: usize,
}

impl RpcChannel for SimRpcChannel {
    fn node(&self) -> NodeId {
        self.node
    }

    fn max_message(&self) -> usize {
        self.max
    }

    fn capacity(&self) -> usize {
        self.cap
    }

    fn send(&mut self, id: u64, service: ServiceId, payload: &[u8]) -> Result<(), RpcSendError> {
        let c = self.c;
        self.core
            .with(|core| core.rpc_send(c, id, service, payload))
    }

    fn poll(&mut self, out: &mut Vec<RpcReply>) -> usize {
        let c = self.c;
        self.core.with(|core| core.rpc_poll(c, out))
    }

    fn pending(&self) -> usize {
        let c = self.c;
        self.core.with(|core| core.rpc_pending(c))
    }

    /// Sends and waits. Outside a step the simulation runs forward; inside
    /// one the virtual CPU stalls until the reply (as `SimQp::execute`).
    fn call(&mut self, service: ServiceId, payload: &[u8]) -> Result<Vec<u8>, RpcFailure> {
        assert_eq!(self.pending(), 0, "call() needs an idle channel");
        self.send(0, service, payload).map_err(|e| match e {
            RpcSendError::Full => unreachable!("an idle channel has room"),
            RpcSendError::Refused(f) => f,
        })?;
        let c = self.c;
        let mut out = Vec::with_capacity(1);
        loop {
            if self.core.with(|core| {
                if core.rpc_poll(c, &mut out) == 0 {
                    core.rpc_block(c);
                    false
                } else {
                    true
                }
            }) {
                return out.pop().expect("polled one").result;
            }
        }
    }
}

impl Drop for SimRpcChannel {
    fn drop(&mut self) {
        let c = self.c;
        self.core.with(|core| core.rpc_drop(c));
    }
}

/// The control plane: the embedded memory nodes' RPC.
impl NodeRpc for SimFabric {
    fn node_heap(&self, node: NodeId) -> Result<RegionInfo, FabricError> {
        self.inner.node_heap(node)
    }

    /// Control RPCs are served by the embedded node at once; the calling
    /// virtual thread is charged the profile's RPC round trip.
    fn rpc(&self, node: NodeId, req: Request) -> Result<Response, FabricError> {
        self.core.with(|c| {
            let ns = c.p.cpu.rpc_ns;
            c.charge(ns);
        });
        self.inner.rpc(node, req)
    }
}

/// One virtual thread's queue pair (see [`crate::engine`] for its timing).
pub struct SimQp {
    core: Arc<Shared>,
    h: u32,
    node: NodeId,
    caps: Capabilities,
}

impl QueuePair for SimQp {
    fn node(&self) -> NodeId {
        self.node
    }

    fn caps(&self) -> Capabilities {
        self.caps
    }

    fn register_local(&mut self, mem: &LocalMem) -> Lkey {
        let h = self.h;
        self.core.with(|c| c.handle_exec(h).register_local(mem))
    }

    fn post(&mut self, batch: &mut Batch) -> Result<(), PostError> {
        let h = self.h;
        // The error boxed while it crosses the thread-local access: a
        // pointer-sized result comes back in a register, where the 24-byte
        // one went through two stack copies that stalled on store
        // forwarding (perf: 6 % of `dmkit sim speed` on one store).
        self.core
            .with(|c| c.post(h, batch).map_err(Box::new))
            .map_err(|e| *e)
    }

    fn poll(&mut self, out: &mut Vec<Completion>, max: usize) -> usize {
        let h = self.h;
        self.core.with(|c| c.poll(h, out, max))
    }

    /// The loop of polls in one access to the engine.
    fn poll_drain(&mut self, out: &mut Vec<Completion>, max: usize) -> usize {
        let h = self.h;
        self.core
            .with(|c| dmkit_fabric::drain(|out, max| c.poll(h, out, max), out, max))
    }

    fn pending(&self) -> usize {
        let h = self.h;
        self.core.with(|c| c.pending(h))
    }

    fn stats(&self) -> QpStats {
        let h = self.h;
        self.core.with(|c| c.handle_stats(h))
    }

    /// Posts and waits. Outside a step (setup code, tests) polling runs the
    /// simulation forward. Inside a step a blocking call stalls the virtual
    /// CPU: the thread's clock jumps to the completion, and memory effects
    /// due by then are applied ahead of other threads' steps — an
    /// approximation; the runtime never blocks, data paths should not.
    fn execute(&mut self, batch: &mut Batch) -> Result<Vec<Completion>, FabricError> {
        if let Some(last) = batch.requests_mut().last_mut() {
            last.signaled = true;
        }
        self.post(batch)?;
        let mut out = Vec::with_capacity(batch.len());
        let h = self.h;
        while self.core.with(|c| {
            if c.pending(h) == 0 {
                return false;
            }
            if c.poll(h, &mut out, usize::MAX) == 0 {
                c.block_on(h);
            }
            true
        }) {}
        match out.iter().find_map(Completion::error) {
            Some(e) => Err(e.clone().into()),
            None => Ok(out),
        }
    }
}

impl Drop for SimQp {
    fn drop(&mut self) {
        let h = self.h;
        self.core.with(|c| c.drop_handle(h));
    }
}
