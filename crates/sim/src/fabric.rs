//! [`SimFabric`] and [`SimQp`]: the `sim` backend as the rest of dmkit sees
//! it — a [`Fabric`] like any other. Memory nodes are real (embedded shm
//! memory nodes: regions, keys, page tables, chunk allocator, roots), and
//! every request is executed by the same checked [`dmkit_fabric::Executor`]
//! the shm backend uses; only *when* things happen is simulated.

use std::sync::{Arc, Mutex, MutexGuard};

use dmkit_fabric::shm::ShmFabric;
use dmkit_fabric::{
    Batch, Capabilities, Completion, Fabric, FabricError, Lkey, LocalMem, NodeId, PostError,
    QpPolicy, QpStats, QueuePair, RegionInfo, Request, Response,
};

use crate::engine::Core;

/// The engine. One OS thread runs the simulation; other threads may make
/// blocking calls (tests, tools), serialised by the lock. A panic inside
/// the engine leaves nothing that matters more than the panic itself.
pub(crate) fn lock(core: &Mutex<Core>) -> MutexGuard<'_, Core> {
    core.lock().unwrap_or_else(|p| p.into_inner())
}

/// The simulated fabric. The simulation runs on one OS thread; blocking
/// calls from other threads (tests, tools) are serialised by a lock.
pub struct SimFabric {
    pub(crate) core: Arc<Mutex<Core>>,
    pub(crate) inner: ShmFabric,
    pub(crate) caps: Capabilities,
}

impl SimFabric {
    /// Declares `[addr, addr+len)` on-NIC device memory: atomics there are
    /// serialised for `atomic_nic_ns` instead of `atomic_ns` (SwordBox §3.2,
    /// Fig. 4; Sherman keeps its locks there).
    pub fn mark_device_memory(&self, addr: dmkit_fabric::GlobalAddr, len: u64) {
        lock(&self.core).set_device_memory(addr.node(), addr.offset(), len);
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
        let h = lock(&self.core)
            .connect(node, policy, exec)
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

    fn heap(&self, node: NodeId) -> Result<RegionInfo, FabricError> {
        self.inner.heap(node)
    }

    /// Control RPCs are served by the embedded node at once; the calling
    /// virtual thread is charged the profile's RPC round trip.
    fn rpc(&self, node: NodeId, req: Request) -> Result<Response, FabricError> {
        {
            let mut c = lock(&self.core);
            let ns = c.p.cpu.rpc_ns;
            c.charge(ns);
        }
        self.inner.rpc(node, req)
    }
}

/// One virtual thread's queue pair (see [`crate::engine`] for its timing).
pub struct SimQp {
    core: Arc<Mutex<Core>>,
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
        lock(&self.core).handle_exec(self.h).register_local(mem)
    }

    fn post(&mut self, batch: &mut Batch) -> Result<(), PostError> {
        lock(&self.core).post(self.h, batch)
    }

    fn poll(&mut self, out: &mut Vec<Completion>, max: usize) -> usize {
        lock(&self.core).poll(self.h, out, max)
    }

    fn pending(&self) -> usize {
        lock(&self.core).pending(self.h)
    }

    fn stats(&self) -> QpStats {
        lock(&self.core).handle_stats(self.h)
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
        loop {
            let mut c = lock(&self.core);
            if c.pending(self.h) == 0 {
                break;
            }
            if c.poll(self.h, &mut out, usize::MAX) == 0 {
                c.block_on(self.h);
            }
        }
        match out.iter().find_map(Completion::error) {
            Some(e) => Err(e.clone().into()),
            None => Ok(out),
        }
    }
}

impl Drop for SimQp {
    fn drop(&mut self) {
        lock(&self.core).drop_handle(self.h);
    }
}
