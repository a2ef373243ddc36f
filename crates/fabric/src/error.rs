//! Typed errors of the fabric. Each names the request it is about.

use dmkit_memnode::NodeError;

use crate::control::ControlError;

use crate::addr::{GlobalAddr, NodeId, Rkey};
use crate::wr::VerbKind;

/// Why one work request failed. The memory node and every other client are
/// unaffected by any of these.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum VerbError {
    /// A READ or WRITE of 0 bytes (RDMA allows it; the contract does not, so
    /// every backend refuses it the same way).
    #[error("zero-length request")]
    ZeroLength,
    /// The [`crate::LocalRef::lkey`] names no local memory registered on the
    /// posting queue pair.
    #[error("lkey {0} does not name local memory registered on this queue pair")]
    BadLkey(crate::local::Lkey),
    /// The local range of a READ or WRITE does not lie inside its registered
    /// local memory.
    #[error("local range [{offset:#x}, +{len}) is outside local region {lkey}")]
    LocalOutOfBounds {
        /// The local memory named.
        lkey: crate::local::Lkey,
        /// Start of the range, in bytes from the local memory's start.
        offset: u64,
        /// Length of the range in bytes.
        len: u32,
    },
    /// The remote address belongs to another memory node than the queue
    /// pair's (a queue pair connects one client to one node).
    #[error("request addresses node {got}, but this queue pair is connected to node {expected}")]
    WrongNode {
        /// The queue pair's node.
        expected: NodeId,
        /// The node in the request's [`GlobalAddr`].
        got: NodeId,
    },
    /// The rkey names no valid region of the node's protection table (never
    /// issued, or deregistered since).
    #[error("rkey {rkey:#x} does not name a registered region")]
    BadKey {
        /// The request's rkey.
        rkey: Rkey,
    },
    /// The region was registered without the right the verb needs.
    #[error("region {rkey:#x} does not allow {needed}")]
    AccessDenied {
        /// The request's rkey.
        rkey: Rkey,
        /// The missing right: `"READ"`, `"WRITE"` or `"atomics"`.
        needed: &'static str,
    },
    /// The request starts outside the region its rkey names.
    #[error("offset {offset:#x} is outside region [{base:#x}, {end:#x})")]
    OutOfBounds {
        /// Start of the request, a byte offset in the node's remote space.
        offset: u64,
        /// First byte of the region.
        base: u64,
        /// One past the region's last byte.
        end: u64,
    },
    /// The request starts inside its region but runs past its end.
    #[error("[{offset:#x}, +{len}) crosses the region end {end:#x}")]
    CrossesRegionEnd {
        /// Start of the request, a byte offset in the node's remote space.
        offset: u64,
        /// Length of the request in bytes.
        len: u64,
        /// One past the region's last byte.
        end: u64,
    },
    /// A CAS, masked CAS or FAA on a word that is not 8-byte aligned.
    #[error("atomic at offset {offset:#x} is not 8-byte aligned")]
    Unaligned {
        /// The word's byte offset in the node's remote space.
        offset: u64,
    },
    /// The request moves more bytes than
    /// [`crate::Capabilities::max_message`].
    #[error("message of {len} B exceeds the backend's {max} B limit")]
    TooLong {
        /// Bytes the request moves.
        len: usize,
        /// The backend's limit in bytes.
        max: usize,
    },
    /// An inline WRITE carries more than [`crate::Capabilities::max_inline`].
    #[error("inline write of {len} B exceeds the backend's {max} B inline limit")]
    InlineTooLarge {
        /// Bytes of the WRITE.
        len: usize,
        /// The backend's inline limit in bytes.
        max: usize,
    },
    /// The node's page table has no translation for a page the request
    /// touches (the analogue of an RNIC's translation fault).
    #[error("remote page {page} is not mapped")]
    PageNotMapped {
        /// Index of the remote page (offset / page size).
        page: u64,
    },
    /// A vector READ/WRITE's list is empty, longer than
    /// [`crate::Capabilities::max_sge`], outside its batch's entry table, or
    /// its entries do not add up to its length.
    #[error("scatter/gather list of {count} entries (from {first}) is empty, exceeds the backend's {max}, or lies outside its batch")]
    BadSgl {
        /// Index of the list's first entry in [`crate::Batch::sges`].
        first: u32,
        /// Entries in the list.
        count: u32,
        /// The backend's limit on entries per request.
        max: usize,
    },
    /// The verb needs a capability the backend lacks (masked CAS without
    /// [`crate::Capabilities::masked_cas`]); carries the verb's name.
    #[error("the backend does not offer {0}")]
    Unsupported(&'static str),
    /// Not executed: an earlier request of the same batch failed, and every
    /// later one is flushed without effect (as on an RC queue pair in error).
    #[error("flushed: an earlier request of the same batch failed")]
    Flushed,
    /// The connection to the node broke before the request completed (verbs:
    /// transport retries exhausted, a flush, a failed post or reconnection;
    /// sim: an injected link loss); whether it took effect is unknown.
    #[error("connection to node {0} lost")]
    ConnectionLost(NodeId),
    /// The queue pair had requests outstanding and no completion at all
    /// for `waited_ms` (verbs: its completion timeout; RC retransmits a
    /// request whose response is lost, and rxe does so without end at
    /// dmkit's retry count). Every request on it fails so; whether each
    /// took effect is unknown.
    #[error("no completion from node {node} within {waited_ms} ms; whether the request took effect is unknown")]
    NoCompletion {
        /// The queue pair's node.
        node: NodeId,
        /// How long the queue pair waited with no completion at all.
        waited_ms: u64,
    },
    /// A completion error of a real NIC that has no closer match above
    /// (the verbs backend names the `ibv_wc_status`).
    #[error("the NIC reported {0}")]
    Nic(&'static str),
}

/// A failed request inside a batch: its position, id, verb and address.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("request #{index} (wr_id {wr_id}, {kind:?} at {remote}): {error}")]
pub struct RequestError {
    /// Position of the request in its batch, from 0.
    pub index: usize,
    /// The caller's [`crate::WorkRequest::wr_id`].
    pub wr_id: u64,
    /// The request's verb.
    pub kind: VerbKind,
    /// The remote address the request named.
    pub remote: GlobalAddr,
    /// Why it failed.
    pub error: VerbError,
}

/// Why a batch could not be posted at all. Nothing of it took effect.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PostError {
    /// The batch holds more requests than [`crate::Capabilities::max_batch`].
    #[error("batch of {len} requests exceeds the backend's limit of {max}: request #{max} and later are over it")]
    BatchTooLarge {
        /// Requests in the batch.
        len: usize,
        /// The backend's limit.
        max: usize,
    },
    /// The queue pair can no longer post: its node shut down or its
    /// connection was lost.
    #[error("queue pair to node {0} is disconnected")]
    Disconnected(NodeId),
}

/// Any fabric-level failure.
#[derive(Debug, thiserror::Error)]
pub enum FabricError {
    /// One request of a batch failed.
    #[error(transparent)]
    Request(#[from] RequestError),
    /// A batch could not be posted at all.
    #[error(transparent)]
    Post(#[from] PostError),
    /// A memory node refused a control request (see [`crate::ControlPlane`]).
    #[error("memory node {node} refused the request: {error}")]
    Refused {
        /// The node that refused.
        node: NodeId,
        /// What it refused and why.
        error: ControlError,
    },
    /// A node id (the high 16 bits of a [`GlobalAddr`]) that this fabric has
    /// no memory node for.
    #[error("no memory node {0} in this fabric")]
    NoSuchNode(NodeId),
    /// An embedded memory node could not be created.
    #[error("memory node {node}: {error}")]
    Node {
        /// The node's id.
        node: NodeId,
        /// Why the node failed.
        error: NodeError,
    },
    /// The fabric could not be set up: a node unreachable, its token refused,
    /// its memory not mappable, or a configuration the backend cannot run.
    #[error("connecting to memory node at {target} failed: {reason}")]
    Connect {
        /// What was being connected to (a socket path, a host:port, a node).
        target: String,
        /// Why it failed.
        reason: String,
    },
    /// The control connection to the node broke (the node exited or the
    /// network failed) during a control request.
    #[error("connection to memory node {0} lost")]
    ConnectionLost(NodeId),
    /// The backend cannot do what was asked (e.g. a queue-pair policy that
    /// needs doorbell registers the backend does not have).
    #[error("the {backend} backend does not offer {what}")]
    Unsupported {
        /// The backend's name.
        backend: &'static str,
        /// What it lacks.
        what: String,
    },
    /// The node answered a control request with something that is not an
    /// answer to it (a bug or a version mismatch).
    #[error("unexpected answer from memory node {node}: {what}")]
    Protocol {
        /// The node.
        node: NodeId,
        /// What was wrong with the answer.
        what: String,
    },
}
