//! Errors of the memory node. Runtime failures are values, never panics: a
//! memory node must survive anything a client sends it.

use serde::{Deserialize, Serialize};

/// Failure inside the memory node process (setup, OS calls, I/O).
#[derive(Debug, thiserror::Error)]
pub enum NodeError {
    #[error("invalid memory node configuration: {0}")]
    Config(String),
    #[error("{what} failed: {source}")]
    Os {
        what: &'static str,
        source: nix::Error,
    },
    #[error("{what} failed: {source}")]
    Io {
        what: &'static str,
        source: std::io::Error,
    },
    #[error("protocol error: {0}")]
    Protocol(String),
    #[error("rpc refused: {0}")]
    Rpc(#[from] RpcError),
}

impl NodeError {
    pub(crate) fn os(what: &'static str, source: nix::Error) -> Self {
        NodeError::Os { what, source }
    }
}

/// An error answered to an RPC request. Serialised on the wire, so it carries
/// plain data only.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, thiserror::Error)]
pub enum RpcError {
    #[error("out of memory: asked for {requested} B, largest free extent is {largest_free} B")]
    OutOfMemory { requested: u64, largest_free: u64 },
    #[error("invalid chunk length {0} (must be > 0 and at most the node's size)")]
    BadLength(u64),
    #[error("no chunk was allocated at offset {offset:#x}")]
    NotAllocated { offset: u64 },
    #[error("chunk at offset {offset:#x} belongs to another session")]
    NotOwner { offset: u64 },
    #[error("invalid root name {0:?}: 1..=64 bytes of [A-Za-z0-9_./-]")]
    BadRootName(String),
    #[error("root {name:?} is {current:?}, not the expected {expected:?}")]
    RootMismatch {
        name: String,
        expected: Option<u64>,
        current: Option<u64>,
    },
    #[error("root table is full ({0} entries)")]
    RootTableFull(usize),
    #[error(
        "region [{base:#x}, +{len:#x}) is not inside the node's remote space or not page aligned"
    )]
    BadRegion { base: u64, len: u64 },
    #[error("protection table is full ({0} regions)")]
    RegionTableFull(usize),
    #[error("no region with rkey {0:#x}")]
    NoSuchRegion(u32),
    #[error("remote page {0} does not exist")]
    BadPage(u64),
    #[error("no spare memory page left for remapping")]
    NoSparePage,
    #[error("malformed request frame: {0}")]
    BadFrame(String),
    #[error("the memory node is shutting down")]
    ShuttingDown,
    /// The request is not served over this transport or by this node.
    #[error("not offered here: {0}")]
    Unsupported(String),
    /// An RPC channel's geometry out of bounds.
    #[error("invalid RPC channel: {0}")]
    BadChannel(String),
    /// The node failed to set something up (a memfd, a thread).
    #[error("I/O on the memory node failed: {0}")]
    Io(String),
}
