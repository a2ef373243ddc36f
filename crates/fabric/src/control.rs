//! The control plane: what a memory node's CPU serves beside the
//! one-sided data path — chunks of its memory, named roots, its regions,
//! its statistics — as a typed interface of its own ([`ControlPlane`]).
//!
//! The data plane is the [`crate::QueuePair`]: verbs that the node's CPU
//! never sees. A backend offers both, and a third party adds one by
//! implementing [`crate::Fabric`] and [`ControlPlane`] with whatever
//! transport its nodes speak. dmkit's memory node speaks one RPC protocol
//! (`dmkit_memnode::{Request, Response}`, over a Unix socket, a TCP control
//! channel or an in-process call): a backend that carries it implements
//! [`NodeRpc`] and gets [`ControlPlane`] from it — the memory node's RPC is
//! one implementation of the control plane, not its definition.
//!
//! Refusals are typed ([`ControlError`]): a root that holds another value
//! is [`ControlError::RootMismatch`], a full root table
//! [`ControlError::RootTableFull`], and so on, so callers branch on what
//! happened rather than on a message.

use dmkit_memnode::proto::TOKEN_LEN;
use dmkit_memnode::{AdminOp, NodeStats, RegionInfo, Request, Response, RootInfo, RpcError};

use crate::addr::{GlobalAddr, NodeId, Rkey};
use crate::error::FabricError;

/// Why a memory node refused a control request. The node and every other
/// client are unaffected.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ControlError {
    /// No free extent is large enough.
    #[error("out of memory: asked for {requested} B, largest free extent is {largest_free} B")]
    OutOfMemory {
        /// Bytes asked for.
        requested: u64,
        /// The largest free extent.
        largest_free: u64,
    },
    /// A chunk length of 0 or beyond the node's size.
    #[error("invalid chunk length {0} (must be > 0 and at most the node's size)")]
    BadLength(u64),
    /// No chunk starts at this offset.
    #[error("no chunk was allocated at offset {offset:#x}")]
    NotAllocated {
        /// The offset given.
        offset: u64,
    },
    /// The chunk belongs to another session.
    #[error("chunk at offset {offset:#x} belongs to another session")]
    NotOwner {
        /// The chunk's offset.
        offset: u64,
    },
    /// A root name the node does not keep.
    #[error("invalid root name {0:?}: 1..=64 bytes of [A-Za-z0-9_./-]")]
    BadRootName(String),
    /// A conditional root update found another value.
    #[error("root {name:?} is {current:?}, not the expected {expected:?}")]
    RootMismatch {
        /// The root.
        name: String,
        /// What the caller expected (`None`: absent).
        expected: Option<u64>,
        /// What the root holds.
        current: Option<u64>,
    },
    /// The node keeps no more roots.
    #[error("root table is full ({0} entries)")]
    RootTableFull(usize),
    /// The node is shutting down.
    #[error("the memory node is shutting down")]
    ShuttingDown,
    /// A group release by a session holding no reference on it.
    #[error("this session holds no reference on group {0:?}")]
    NotHolder(String),
    /// An admin request without the node's token.
    #[error("admin request refused: {0}")]
    NotAdmin(String),
    /// Any other refusal, as the node put it.
    #[error("{0}")]
    Other(String),
}

impl From<RpcError> for ControlError {
    fn from(e: RpcError) -> Self {
        match e {
            RpcError::OutOfMemory {
                requested,
                largest_free,
            } => ControlError::OutOfMemory {
                requested,
                largest_free,
            },
            RpcError::BadLength(l) => ControlError::BadLength(l),
            RpcError::NotAllocated { offset } => ControlError::NotAllocated { offset },
            RpcError::NotOwner { offset } => ControlError::NotOwner { offset },
            RpcError::BadRootName(n) => ControlError::BadRootName(n),
            RpcError::RootMismatch {
                name,
                expected,
                current,
            } => ControlError::RootMismatch {
                name,
                expected,
                current,
            },
            RpcError::RootTableFull(n) => ControlError::RootTableFull(n),
            RpcError::ShuttingDown => ControlError::ShuttingDown,
            RpcError::NotHolder(g) => ControlError::NotHolder(g),
            RpcError::NotAdmin(m) => ControlError::NotAdmin(m),
            other => ControlError::Other(other.to_string()),
        }
    }
}

/// A chunk of a chunk group ([`ControlPlane::alloc_group_chunk`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GroupChunk {
    /// Its address.
    pub addr: GlobalAddr,
    /// Its length (whole pages).
    pub len: u64,
    /// The key of the region covering it.
    pub rkey: Rkey,
    /// The allocation took this session's reference on the group (it held
    /// none on that node): the caller owes a release.
    pub took_ref: bool,
}

/// The control plane of a set of memory nodes.
pub trait ControlPlane: Send + Sync {
    /// The region covering `node`'s allocatable memory.
    fn heap(&self, node: NodeId) -> Result<RegionInfo, FabricError>;

    /// Allocates a chunk on `node`; returns its address, rounded length and
    /// key. `persistent` chunks outlive the session that took them.
    fn alloc_chunk(
        &self,
        node: NodeId,
        len: u64,
        persistent: bool,
    ) -> Result<(GlobalAddr, u64, Rkey), FabricError>;

    /// Frees a chunk this session owns (its own, or one of a group it
    /// holds); returns its length. Another's is [`ControlError::NotOwner`].
    fn free_chunk(&self, addr: GlobalAddr) -> Result<u64, FabricError>;

    /// Allocates a chunk on `node` owned by chunk group `group` (a
    /// structure's memory, named like its root): it lives while some
    /// session holds the group. Takes a reference for this session if it
    /// holds none on that node ([`GroupChunk::took_ref`]).
    fn alloc_group_chunk(
        &self,
        node: NodeId,
        len: u64,
        group: &str,
    ) -> Result<GroupChunk, FabricError>;

    /// Takes a reference on `group` on `node`; returns the group's
    /// references, all sessions together.
    fn hold_group(&self, node: NodeId, group: &str) -> Result<u32, FabricError>;

    /// Drops one of this session's references on `group` on `node`; the
    /// last of all sessions frees the group's chunks and roots. Returns
    /// the references left and the bytes freed.
    fn release_group(&self, node: NodeId, group: &str) -> Result<(u32, u64), FabricError>;

    /// Reads root `name` and, if set, takes a reference on its group.
    fn open_root(&self, node: NodeId, name: &str) -> Result<Option<u64>, FabricError>;

    /// The node's roots and chunk groups.
    fn list_roots(&self, node: NodeId) -> Result<Vec<RootInfo>, FabricError>;

    /// An admin request authorised by the node's token.
    fn admin(
        &self,
        node: NodeId,
        token: [u8; TOKEN_LEN],
        op: AdminOp,
    ) -> Result<Response, FabricError>;

    /// Reads a named root.
    fn get_root(&self, node: NodeId, name: &str) -> Result<Option<u64>, FabricError>;

    /// Sets a named root, optionally only if it currently equals `expected`
    /// (`Some(None)`: only if absent; a mismatch is
    /// [`ControlError::RootMismatch`]). Returns the previous value.
    fn set_root(
        &self,
        node: NodeId,
        name: &str,
        value: u64,
        expected: Option<Option<u64>>,
    ) -> Result<Option<u64>, FabricError>;

    /// The node's statistics.
    fn node_stats(&self, node: NodeId) -> Result<NodeStats, FabricError>;

    /// Asks the node to shut down.
    fn shutdown_node(&self, node: NodeId) -> Result<(), FabricError>;
}

/// A transport of dmkit's memory-node RPC protocol: one request, one
/// response. Implementing it gives a [`ControlPlane`].
pub trait NodeRpc: Send + Sync {
    /// The heap region of `node` (learnt when the node was connected).
    fn node_heap(&self, node: NodeId) -> Result<RegionInfo, FabricError>;

    /// One RPC to `node`'s control service.
    fn rpc(&self, node: NodeId, req: Request) -> Result<Response, FabricError>;
}

/// An answer that is not the one asked for: a refusal, or a protocol error.
fn unexpected(node: NodeId, resp: Response) -> FabricError {
    match resp {
        Response::Error(error) => FabricError::Refused {
            node,
            error: error.into(),
        },
        other => FabricError::Protocol {
            node,
            what: format!("{other:?}"),
        },
    }
}

impl<T: NodeRpc + ?Sized> ControlPlane for T {
    fn heap(&self, node: NodeId) -> Result<RegionInfo, FabricError> {
        self.node_heap(node)
    }

    fn alloc_chunk(
        &self,
        node: NodeId,
        len: u64,
        persistent: bool,
    ) -> Result<(GlobalAddr, u64, Rkey), FabricError> {
        match self.rpc(node, Request::AllocChunk { len, persistent })? {
            Response::Chunk { offset, len, rkey } => Ok((GlobalAddr::new(node, offset), len, rkey)),
            other => Err(unexpected(node, other)),
        }
    }

    fn free_chunk(&self, addr: GlobalAddr) -> Result<u64, FabricError> {
        let node = addr.node();
        let offset = addr.offset();
        match self.rpc(node, Request::FreeChunk { offset })? {
            Response::Freed { len } => Ok(len),
            other => Err(unexpected(node, other)),
        }
    }

    fn alloc_group_chunk(
        &self,
        node: NodeId,
        len: u64,
        group: &str,
    ) -> Result<GroupChunk, FabricError> {
        let req = Request::AllocGroupChunk {
            len,
            group: group.into(),
        };
        match self.rpc(node, req)? {
            Response::GroupChunk {
                offset,
                len,
                rkey,
                took_ref,
            } => Ok(GroupChunk {
                addr: GlobalAddr::new(node, offset),
                len,
                rkey,
                took_ref,
            }),
            other => Err(unexpected(node, other)),
        }
    }

    fn hold_group(&self, node: NodeId, group: &str) -> Result<u32, FabricError> {
        match self.rpc(
            node,
            Request::HoldGroup {
                group: group.into(),
            },
        )? {
            Response::Held { refs } => Ok(refs),
            other => Err(unexpected(node, other)),
        }
    }

    fn release_group(&self, node: NodeId, group: &str) -> Result<(u32, u64), FabricError> {
        match self.rpc(
            node,
            Request::ReleaseGroup {
                group: group.into(),
            },
        )? {
            Response::Released { refs, freed_bytes } => Ok((refs, freed_bytes)),
            other => Err(unexpected(node, other)),
        }
    }

    fn open_root(&self, node: NodeId, name: &str) -> Result<Option<u64>, FabricError> {
        match self.rpc(node, Request::OpenRoot { name: name.into() })? {
            Response::Root(v) => Ok(v),
            other => Err(unexpected(node, other)),
        }
    }

    fn list_roots(&self, node: NodeId) -> Result<Vec<RootInfo>, FabricError> {
        match self.rpc(node, Request::ListRoots)? {
            Response::Roots(v) => Ok(v),
            other => Err(unexpected(node, other)),
        }
    }

    fn admin(
        &self,
        node: NodeId,
        token: [u8; TOKEN_LEN],
        op: AdminOp,
    ) -> Result<Response, FabricError> {
        match self.rpc(node, Request::Admin { token, op })? {
            Response::Error(e) => Err(unexpected(node, Response::Error(e))),
            ok => Ok(ok),
        }
    }

    fn get_root(&self, node: NodeId, name: &str) -> Result<Option<u64>, FabricError> {
        match self.rpc(node, Request::GetRoot { name: name.into() })? {
            Response::Root(v) => Ok(v),
            other => Err(unexpected(node, other)),
        }
    }

    fn set_root(
        &self,
        node: NodeId,
        name: &str,
        value: u64,
        expected: Option<Option<u64>>,
    ) -> Result<Option<u64>, FabricError> {
        let req = Request::SetRoot {
            name: name.into(),
            value,
            expected,
        };
        match self.rpc(node, req)? {
            Response::RootSet { previous } => Ok(previous),
            other => Err(unexpected(node, other)),
        }
    }

    fn node_stats(&self, node: NodeId) -> Result<NodeStats, FabricError> {
        match self.rpc(node, Request::Stats)? {
            Response::Stats(s) => Ok(s),
            other => Err(unexpected(node, other)),
        }
    }

    fn shutdown_node(&self, node: NodeId) -> Result<(), FabricError> {
        match self.rpc(node, Request::Shutdown)? {
            Response::ShuttingDown => Ok(()),
            other => Err(unexpected(node, other)),
        }
    }
}
