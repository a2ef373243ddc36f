//! [`SyncQp`]: a queue pair with its own scratch memory and one-call
//! synchronous verbs, for control paths, tools and tests. Data paths use
//! batches and the runtime's async API instead.

use crate::local::{Lkey, LocalMem};
use crate::{
    Batch, Fabric, FabricError, GlobalAddr, LocalRef, NodeId, QueuePair, Rkey, WorkRequest,
};

/// A queue pair plus scratch memory, executing one request at a time.
pub struct SyncQp {
    qp: Box<dyn QueuePair>,
    scratch: LocalMem,
    lkey: Lkey,
    batch: Batch,
}

impl SyncQp {
    /// Connects to `node` with `scratch` bytes of local memory (grown on demand).
    pub fn new(fabric: &dyn Fabric, node: NodeId, scratch: usize) -> Result<Self, FabricError> {
        let mut qp = fabric.connect(node)?;
        let scratch = LocalMem::new(scratch.max(8));
        let lkey = qp.register_local(&scratch);
        Ok(Self {
            qp,
            scratch,
            lkey,
            batch: Batch::new(),
        })
    }

    /// The underlying queue pair.
    pub fn qp(&mut self) -> &mut dyn QueuePair {
        self.qp.as_mut()
    }

    fn room(&mut self, len: usize) {
        if self.scratch.len() < len {
            self.scratch = LocalMem::new(len.next_power_of_two());
            self.lkey = self.qp.register_local(&self.scratch);
        }
    }

    fn local(&self, len: usize) -> LocalRef {
        LocalRef::new(
            self.lkey,
            0,
            u32::try_from(len).expect("SyncQp requests are below 4 GiB"),
        )
    }

    fn one(&mut self, wr: WorkRequest) -> Result<u64, FabricError> {
        self.batch.push(wr);
        let c = self.qp.execute(&mut self.batch)?;
        Ok(c.first()
            .and_then(|c| c.result.as_ref().ok().copied())
            .unwrap_or(0))
    }

    /// READ `len` bytes.
    pub fn read(
        &mut self,
        remote: GlobalAddr,
        rkey: Rkey,
        len: usize,
    ) -> Result<Vec<u8>, FabricError> {
        self.room(len);
        self.one(WorkRequest::read(remote, rkey, self.local(len)))?;
        Ok(self.scratch.to_vec(0, len))
    }

    /// READ one native-endian `u64`.
    pub fn read_u64(&mut self, remote: GlobalAddr, rkey: Rkey) -> Result<u64, FabricError> {
        self.one(WorkRequest::read(remote, rkey, self.local(8)))?;
        Ok(self.scratch.load_u64(0))
    }

    /// WRITE `data`.
    pub fn write(
        &mut self,
        remote: GlobalAddr,
        rkey: Rkey,
        data: &[u8],
    ) -> Result<(), FabricError> {
        self.room(data.len());
        self.scratch.write(0, data);
        self.one(WorkRequest::write(remote, rkey, self.local(data.len())))
            .map(|_| ())
    }

    /// WRITE one native-endian `u64`.
    pub fn write_u64(&mut self, remote: GlobalAddr, rkey: Rkey, v: u64) -> Result<(), FabricError> {
        self.write(remote, rkey, &v.to_ne_bytes())
    }

    /// CAS; returns the old value (success iff it equals `expected`).
    pub fn cas(
        &mut self,
        remote: GlobalAddr,
        rkey: Rkey,
        expected: u64,
        desired: u64,
    ) -> Result<u64, FabricError> {
        self.one(WorkRequest::cas(remote, rkey, expected, desired))
    }

    /// Masked CAS; returns the old value.
    pub fn masked_cas(
        &mut self,
        remote: GlobalAddr,
        rkey: Rkey,
        compare: u64,
        compare_mask: u64,
        swap: u64,
        swap_mask: u64,
    ) -> Result<u64, FabricError> {
        self.one(WorkRequest::masked_cas(
            remote,
            rkey,
            compare,
            compare_mask,
            swap,
            swap_mask,
        ))
    }

    /// FAA; returns the old value.
    pub fn faa(&mut self, remote: GlobalAddr, rkey: Rkey, add: u64) -> Result<u64, FabricError> {
        self.one(WorkRequest::faa(remote, rkey, add))
    }
}
