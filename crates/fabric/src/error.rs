//! Typed errors of the fabric. Each names the request it is about.

use dmkit_memnode::NodeError;

use crate::control::ControlError;

use crate::addr::{GlobalAddr, NodeId, Rkey};
use crate::wr::VerbKind;

/// Why one work request failed. The memory node and every other client are
/// unaffected by any of these.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum VerbError {
    #[error("zero-length request")]
    ZeroLength,
    #[error("lkey {0} does not name local memory registered on this queue pair")]
    BadLkey(crate::local::Lkey),
    #[error("local range [{offset:#x}, +{len}) is outside local region {lkey}")]
    LocalOutOfBounds {
        lkey: crate::local::Lkey,
        offset: u64,
        len: u32,
    },
    #[error("request addresses node {got}, but this queue pair is connected to node {expected}")]
    WrongNode { expected: NodeId, got: NodeId },
    #[error("rkey {rkey:#x} does not name a registered region")]
    BadKey { rkey: Rkey },
    #[error("region {rkey:#x} does not allow {needed}")]
    AccessDenied { rkey: Rkey, needed: &'static str },
    #[error("offset {offset:#x} is outside region [{base:#x}, {end:#x})")]
    OutOfBounds { offset: u64, base: u64, end: u64 },
    #[error("[{offset:#x}, +{len}) crosses the region end {end:#x}")]
    CrossesRegionEnd { offset: u64, len: u64, end: u64 },
    #[error("atomic at offset {offset:#x} is not 8-byte aligned")]
    Unaligned { offset: u64 },
    #[error("message of {len} B exceeds the backend's {max} B limit")]
    TooLong { len: usize, max: usize },
    #[error("inline write of {len} B exceeds the backend's {max} B inline limit")]
    InlineTooLarge { len: usize, max: usize },
    #[error("remote page {page} is not mapped")]
    PageNotMapped { page: u64 },
    #[error("scatter/gather list of {count} entries (from {first}) is empty, exceeds the backend's {max}, or lies outside its batch")]
    BadSgl { first: u32, count: u32, max: usize },
    #[error("the backend does not offer {0}")]
    Unsupported(&'static str),
    #[error("flushed: an earlier request of the same batch failed")]
    Flushed,
    #[error("connection to node {0} lost")]
    ConnectionLost(NodeId),
    /// A completion error of a real NIC that has no closer match above
    /// (the verbs backend names the `ibv_wc_status`).
    #[error("the NIC reported {0}")]
    Nic(&'static str),
}

/// A failed request inside a batch: its position, id, verb and address.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("request #{index} (wr_id {wr_id}, {kind:?} at {remote}): {error}")]
pub struct RequestError {
    pub index: usize,
    pub wr_id: u64,
    pub kind: VerbKind,
    pub remote: GlobalAddr,
    pub error: VerbError,
}

/// Why a batch could not be posted at all. Nothing of it took effect.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PostError {
    #[error("batch of {len} requests exceeds the backend's limit of {max}: request #{max} and later are over it")]
    BatchTooLarge { len: usize, max: usize },
    #[error("queue pair to node {0} is disconnected")]
    Disconnected(NodeId),
}

/// Any fabric-level failure.
#[derive(Debug, thiserror::Error)]
pub enum FabricError {
    #[error(transparent)]
    Request(#[from] RequestError),
    #[error(transparent)]
    Post(#[from] PostError),
    /// A memory node refused a control request (see [`crate::ControlPlane`]).
    #[error("memory node {node} refused the request: {error}")]
    Refused { node: NodeId, error: ControlError },
    #[error("no memory node {0} in this fabric")]
    NoSuchNode(NodeId),
    #[error("memory node {node}: {error}")]
    Node { node: NodeId, error: NodeError },
    #[error("connecting to memory node at {target} failed: {reason}")]
    Connect { target: String, reason: String },
    #[error("connection to memory node {0} lost")]
    ConnectionLost(NodeId),
    #[error("the {backend} backend does not offer {what}")]
    Unsupported { backend: &'static str, what: String },
    #[error("unexpected answer from memory node {node}: {what}")]
    Protocol { node: NodeId, what: String },
}
