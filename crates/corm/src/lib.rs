//! # dmkit-corm — CoRM's client (issue 32 item 3)
//!
//! The API of Table 2 of "CoRM: Compactable Remote Memory over RDMA"
//! (SIGMOD'21) for runtime tasks, over the node's CoRM service
//! ([`dmkit_memnode::corm::service`], on the fabric's RPC channel) and
//! one-sided READs:
//!
//! | call | path | pointer correction (§3.2) |
//! |---|---|---|
//! | [`CormClient::alloc`], [`CormClient::free`] | RPC | node side |
//! | [`CormClient::read`], [`CormClient::write`] | RPC | node side; the pointer is corrected in place |
//! | [`CormClient::direct_read`] | READ of the slot | none: a moved object is [`CormError::Moved`] |
//! | [`CormClient::scan_read`] | READ of the home block | client side: scan for the id, correct the pointer |
//! | [`CormClient::release_ptr`] | RPC | node side; returns the pointer to use from now on |
//!
//! A one-sided read checks the header's id and home block, the two lock
//! bits and the version byte of every 64-byte segment (FaRM's scheme,
//! §3.2.3); a torn or locked object is read again after the runtime's
//! backoff ([`Ctx::backoff`]). After [`MAX_READ_RETRIES`] such reads the
//! reader keeps trying, [`PATIENCE_STEP`] apart, until [`READ_PATIENCE`]
//! has passed on the worker's clock, and only then gives up with
//! [`CormError::Busy`]: a lock is held by the node's own threads (a write
//! or a compaction's merge, which remaps pages), and on a loaded host such
//! a thread can be descheduled far longer than a thousand back-to-back
//! READs take. The node itself waits out a lock as long
//! (`BUSY_TIMEOUT`, 2 s) before it calls the object busy.
//!
//! Client mistakes are typed errors that leave the store unharmed: a freed
//! object or a double free ([`ObjError::Freed`], or [`ObjError::Stale`]
//! once the block's address was released), a pointer of another size
//! class ([`ObjError::WrongClass`]), a released pointer used again
//! ([`ObjError::Released`]), all inside [`CormError::Store`].

use dmkit_fabric::{GlobalAddr, NodeId, RemoteRef};
use dmkit_memnode::corm::service::{CormAnswer, CormFault, CormRequest, StoreInfo, CORM};
use dmkit_memnode::corm::{
    decode, scan_block, CompactionReport, CormStats, ObjError, ObjPtr, Op, ReadFault, Reply,
};
use dmkit_runtime::rpc::CallError;
use dmkit_runtime::{Ctx, Local};

pub use dmkit_memnode::corm::ObjPtr as Pointer;

pub mod sync;

/// Reads of a torn or locked object, each after the runtime's backoff,
/// before the reader slows to one read per [`PATIENCE_STEP`].
pub const MAX_READ_RETRIES: u32 = 1000;

/// How long (worker clock) a reader waits for a torn or locked object
/// before [`CormError::Busy`]; the node's workers wait as long.
pub const READ_PATIENCE: dmkit_runtime::Nanos = 2_000_000_000;

/// The pause between reads once [`MAX_READ_RETRIES`] are spent.
pub const PATIENCE_STEP: dmkit_runtime::Nanos = 50_000;

/// The CoRM service, typed for [`Ctx::call_typed`].
#[derive(Debug, Clone, Copy, Default)]
pub struct Corm;

impl dmkit_runtime::rpc::Service for Corm {
    const ID: dmkit_fabric::ServiceId = CORM;
    type Request = CormRequest;
    type Response = CormAnswer;
}

/// Why a CoRM call failed.
#[derive(Debug, thiserror::Error)]
pub enum CormError {
    /// The store refused: freed, stale, released or wrong-class pointers,
    /// sizes, memory, a busy object.
    #[error(transparent)]
    Store(#[from] ObjError),
    /// The service could not read the request, or has no worker.
    #[error("the CoRM service refused the call: {0}")]
    Service(String),
    /// The RPC did not return (no channel, node gone, …).
    #[error(transparent)]
    Call(#[from] CallError),
    /// A one-sided READ failed (a released address is unmapped).
    #[error(transparent)]
    Fabric(#[from] dmkit_fabric::FabricError),
    /// [`CormClient::direct_read`] found another object at the pointer's
    /// offset: the object moved (the pointer is indirect) or is gone.
    /// Correct the pointer with [`CormClient::scan_read`] or
    /// [`CormClient::read`].
    #[error("the object is not at the pointer's offset (moved or freed)")]
    Moved,
    /// The object stayed torn or locked for this many reads, over at
    /// least [`READ_PATIENCE`].
    #[error("the object stayed torn or locked for {0} reads (at least 2 s)")]
    Busy(u32),
    /// The pointer names a class the store does not have, or a local
    /// buffer too small for what must be read.
    #[error("{0}")]
    Usage(String),
    /// The node answered something the call does not expect.
    #[error("unexpected answer: {0}")]
    Protocol(String),
}

impl CormError {
    fn from_call(e: CallError) -> Self {
        match e.service_error::<CormFault>() {
            Some(CormFault::Obj(o)) => CormError::Store(o),
            Some(f) => CormError::Service(f.to_string()),
            None => CormError::Call(e),
        }
    }
}

/// A client of the CoRM store on one memory node. Cheap to clone; usable
/// from every task of a worker (each passes its own [`Ctx`]).
#[derive(Debug, Clone)]
pub struct CormClient {
    node: NodeId,
    info: StoreInfo,
}

impl CormClient {
    /// Connects to the store on `node` (one RPC for its geometry).
    pub async fn connect(ctx: &Ctx, node: NodeId) -> Result<Self, CormError> {
        match Self::rpc(ctx, node, CormRequest::Info).await? {
            CormAnswer::Info(info) => Ok(Self { node, info }),
            other => Err(CormError::Protocol(format!("{other:?}"))),
        }
    }

    /// The store's geometry (block size, key, classes).
    pub fn info(&self) -> &StoreInfo {
        &self.info
    }

    /// Bytes of a slot of `p`'s class: what [`CormClient::direct_read`]
    /// reads.
    pub fn slot_size(&self, p: ObjPtr) -> Result<usize, CormError> {
        self.info
            .classes
            .get(p.class() as usize)
            .map(|c| c.0 as usize)
            .ok_or_else(|| CormError::Usage(format!("no size class {}", p.class())))
    }

    async fn rpc(ctx: &Ctx, node: NodeId, r: CormRequest) -> Result<CormAnswer, CormError> {
        ctx.call_typed::<Corm>(node, &r)
            .await
            .map_err(CormError::from_call)
    }

    async fn op(&self, ctx: &Ctx, op: Op) -> Result<Reply, CormError> {
        match Self::rpc(ctx, self.node, CormRequest::Op(op)).await? {
            CormAnswer::Done(r) => Ok(r),
            other => Err(CormError::Protocol(format!("{other:?}"))),
        }
    }

    /// Allocates an object of `size` payload bytes.
    pub async fn alloc(&self, ctx: &Ctx, size: u32) -> Result<ObjPtr, CormError> {
        match self.op(ctx, Op::Alloc(size)).await? {
            Reply::Allocated(p) => Ok(p),
            other => Err(CormError::Protocol(format!("{other:?}"))),
        }
    }

    /// Frees the object.
    pub async fn free(&self, ctx: &Ctx, p: ObjPtr) -> Result<(), CormError> {
        match self.op(ctx, Op::Free(p)).await? {
            Reply::Freed => Ok(()),
            other => Err(CormError::Protocol(format!("{other:?}"))),
        }
    }

    /// Reads the object through RPC (the class's whole capacity); `p` is
    /// corrected in place (its offset hint).
    pub async fn read(&self, ctx: &Ctx, p: &mut ObjPtr) -> Result<Vec<u8>, CormError> {
        match self.op(ctx, Op::Read(*p)).await? {
            Reply::Read { ptr, data } => {
                *p = ptr;
                Ok(data)
            }
            other => Err(CormError::Protocol(format!("{other:?}"))),
        }
    }

    /// Overwrites the object's payload through RPC; `p` is corrected in
    /// place.
    pub async fn write(&self, ctx: &Ctx, p: &mut ObjPtr, data: &[u8]) -> Result<(), CormError> {
        match self.op(ctx, Op::Write(*p, data.to_vec())).await? {
            Reply::Written(ptr) => {
                *p = ptr;
                Ok(())
            }
            other => Err(CormError::Protocol(format!("{other:?}"))),
        }
    }

    /// Releases `p`'s address (§3.3) and returns the pointer to use from
    /// now on; `p` itself fails with [`ObjError::Released`] afterwards.
    pub async fn release_ptr(&self, ctx: &Ctx, p: ObjPtr) -> Result<ObjPtr, CormError> {
        match self.op(ctx, Op::ReleasePtr(p)).await? {
            Reply::Released(q) => Ok(q),
            other => Err(CormError::Protocol(format!("{other:?}"))),
        }
    }

    /// Compacts `classes` (all when `None`) now and waits for it.
    pub async fn compact(
        &self,
        ctx: &Ctx,
        classes: Option<Vec<u8>>,
    ) -> Result<CompactionReport, CormError> {
        match self.op(ctx, Op::Compact(classes)).await? {
            Reply::Compacted(r) => Ok(r),
            other => Err(CormError::Protocol(format!("{other:?}"))),
        }
    }

    /// The store's accounting.
    pub async fn stats(&self, ctx: &Ctx) -> Result<CormStats, CormError> {
        match Self::rpc(ctx, self.node, CormRequest::Stats).await? {
            CormAnswer::Stats(s) => Ok(*s),
            other => Err(CormError::Protocol(format!("{other:?}"))),
        }
    }

    fn remote(&self, off: u64) -> RemoteRef {
        RemoteRef::new(GlobalAddr::new(self.node, off), self.info.rkey)
    }

    fn check_buf(buf: Local, need: usize) -> Result<Local, CormError> {
        if buf.len() < need {
            return Err(CormError::Usage(format!(
                "a local buffer of {} B for a read of {need} B",
                buf.len()
            )));
        }
        Ok(Local::at(buf.offset(), need))
    }

    /// One-sided read of the object (CoRM's DirectRead): a READ of its
    /// slot into `buf` (at least the slot size), checked; torn or locked
    /// reads are retried after the runtime's backoff. A moved object is
    /// [`CormError::Moved`].
    pub async fn direct_read(
        &self,
        ctx: &Ctx,
        p: ObjPtr,
        buf: Local,
    ) -> Result<Vec<u8>, CormError> {
        let slot = self.slot_size(p)?;
        let buf = Self::check_buf(buf, slot)?;
        let e = p.expect(self.info.block_size);
        let mut wait = Patience::new();
        loop {
            ctx.read_sync(self.remote(p.offset()), buf).await?;
            match decode(&ctx.local_vec(buf), e) {
                Ok(v) => return Ok(v),
                Err(ReadFault::WrongObject) => return Err(CormError::Moved),
                Err(ReadFault::Torn | ReadFault::Locked) => wait.again(ctx).await?,
            }
        }
    }

    /// One-sided read that corrects the pointer (CoRM's ScanRead, §3.2.2):
    /// reads the slot at the hint; if another object is there, READs the
    /// whole home block into `buf` (at least the block size), finds the
    /// object by its id and corrects `p`'s offset hint. If the scan finds
    /// nothing (it raced with a compaction, or the object is gone), falls
    /// back to an RPC read, which corrects authoritatively.
    pub async fn scan_read(
        &self,
        ctx: &Ctx,
        p: &mut ObjPtr,
        buf: Local,
    ) -> Result<Vec<u8>, CormError> {
        match self.direct_read(ctx, *p, buf).await {
            Err(CormError::Moved) => self.scan_moved(ctx, p, buf).await,
            other => other,
        }
    }

    /// The correction half of [`CormClient::scan_read`], for a caller
    /// whose [`CormClient::direct_read`] of `p` just failed with
    /// [`CormError::Moved`]: READs the home block (not the slot again),
    /// finds the object, corrects `p`; an RPC read if the scan finds
    /// nothing.
    pub async fn scan_moved(
        &self,
        ctx: &Ctx,
        p: &mut ObjPtr,
        buf: Local,
    ) -> Result<Vec<u8>, CormError> {
        let bs = self.info.block_size;
        let slot = self.slot_size(*p)?;
        let block = Self::check_buf(buf, bs as usize)?;
        let e = p.expect(bs);
        let mut wait = Patience::new();
        loop {
            ctx.read_sync(self.remote(p.home_block(bs)), block).await?;
            let bytes = ctx.local_vec(block);
            let Some(off) = scan_block(&bytes, slot, e) else {
                return self.read(ctx, p).await;
            };
            match decode(&bytes[off..off + slot], e) {
                Ok(v) => {
                    *p = p.with_offset_hint(bs, off as u64);
                    return Ok(v);
                }
                Err(ReadFault::WrongObject) => return self.read(ctx, p).await,
                Err(ReadFault::Torn | ReadFault::Locked) => wait.again(ctx).await?,
            }
        }
    }
}

/// A one-sided reader's wait for a torn or locked object: the runtime's
/// backoff for the first [`MAX_READ_RETRIES`] reads, then one read per
/// [`PATIENCE_STEP`] until [`READ_PATIENCE`] has passed since the first
/// failed read. The clock is read only once a read has failed: a clock
/// read costs about as much as a DirectRead's checks on shm, and most
/// reads succeed at once.
struct Patience {
    reads: u32,
    since: Option<dmkit_runtime::Nanos>,
}

impl Patience {
    fn new() -> Self {
        Self {
            reads: 0,
            since: None,
        }
    }

    /// Waits before the next read, or gives up.
    async fn again(&mut self, ctx: &Ctx) -> Result<(), CormError> {
        self.reads = self.reads.saturating_add(1);
        let since = *self.since.get_or_insert_with(|| ctx.now());
        if self.reads <= MAX_READ_RETRIES {
            ctx.backoff().await;
            return Ok(());
        }
        if ctx.now().saturating_sub(since) >= READ_PATIENCE {
            return Err(CormError::Busy(self.reads));
        }
        ctx.note_retry();
        ctx.sleep(PATIENCE_STEP).await;
        Ok(())
    }
}
