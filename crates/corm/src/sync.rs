//! CoRM without a runtime worker: requests over a raw RPC channel and
//! one-sided reads over a [`SyncQp`], each waited for by spinning. For
//! setup code, tools and tests that drive a store from plain threads (a
//! runtime task uses [`crate::CormClient`], which yields instead).

use dmkit_fabric::{FabricError, GlobalAddr, RpcChannel, RpcFailure, SyncQp};
use dmkit_memnode::corm::service::{
    decode_answer, decode_fault, encode_request, CormAnswer, CormFault, CormRequest, CORM,
};
use dmkit_memnode::corm::{decode, scan_block, CormStats, ObjPtr, Op, ReadFault, Reply};

/// Why a call made here failed.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum SyncError {
    /// The service refused it (the store is unharmed).
    #[error("the CoRM service refused: {0}")]
    Fault(CormFault),
    /// The channel failed (node gone, channel closed, message too large).
    #[error("RPC channel: {0}")]
    Transport(RpcFailure),
    /// The service's bytes did not decode, or answered another request's
    /// kind of answer.
    #[error("CoRM answer: {0}")]
    Answer(String),
    /// A one-sided READ failed.
    #[error("READ: {0}")]
    Read(String),
    /// The object stayed torn, locked or out of its block for every try.
    #[error("the object stayed torn, locked or missing for {0} reads")]
    Unreadable(usize),
}

impl SyncError {
    /// The service's refusal, if that is what this is (tests compare it).
    pub fn fault(self) -> Result<CormFault, SyncError> {
        match self {
            SyncError::Fault(f) => Ok(f),
            other => Err(other),
        }
    }
}

/// Sends `r` on `ch` (an idle channel) and waits for the answer.
pub fn call(ch: &mut dyn RpcChannel, r: &CormRequest) -> Result<CormAnswer, SyncError> {
    match ch.call(CORM, &encode_request(r)) {
        Ok(bytes) => decode_answer(&bytes).map_err(|e| SyncError::Answer(e.to_string())),
        Err(RpcFailure::Service(e)) => Err(match decode_fault(&e) {
            Ok(f) => SyncError::Fault(f),
            Err(x) => SyncError::Answer(x),
        }),
        Err(f) => Err(SyncError::Transport(f)),
    }
}

/// One store operation.
pub fn op(ch: &mut dyn RpcChannel, o: Op) -> Result<Reply, SyncError> {
    match call(ch, &CormRequest::Op(o))? {
        CormAnswer::Done(r) => Ok(r),
        other => Err(SyncError::Answer(format!(
            "an operation answered {other:?}"
        ))),
    }
}

/// The store's accounting.
pub fn stats(ch: &mut dyn RpcChannel) -> Result<CormStats, SyncError> {
    match call(ch, &CormRequest::Stats)? {
        CormAnswer::Stats(s) => Ok(*s),
        other => Err(SyncError::Answer(format!("stats answered {other:?}"))),
    }
}

/// DirectRead of `p` (a `slot`-byte slot, on node 0) with ScanRead as its
/// correction, in a store of `block_size`-byte blocks: READs the slot; on
/// another object there, READs the home block and finds the object by its
/// id. A torn or locked read, or a scan that misses (mid-merge), is tried
/// again, up to `tries` READs of the slot in all.
pub fn read_one_sided(
    q: &mut SyncQp,
    p: ObjPtr,
    slot: usize,
    block_size: u64,
    tries: usize,
) -> Result<Vec<u8>, SyncError> {
    let e = p.expect(block_size);
    let read = |q: &mut SyncQp, off: u64, len: usize| {
        q.read(GlobalAddr::new(0, off), p.rkey(), len)
            .map_err(|x: FabricError| SyncError::Read(x.to_string()))
    };
    for _ in 0..tries {
        let bytes = read(q, p.offset(), slot)?;
        match decode(&bytes, e) {
            Ok(v) => return Ok(v),
            Err(ReadFault::WrongObject) => {
                let block = read(q, p.home_block(block_size), block_size as usize)?;
                if let Some(off) = scan_block(&block, slot, e) {
                    if let Ok(v) = decode(&block[off..off + slot], e) {
                        return Ok(v);
                    }
                }
            }
            Err(ReadFault::Torn | ReadFault::Locked) => std::hint::spin_loop(),
        }
    }
    Err(SyncError::Unreadable(tries))
}
