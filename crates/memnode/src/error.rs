//! Errors of the memory node. Runtime failures are values, never panics: a
//! memory node must survive anything a client sends it.

use serde::{Deserialize, Serialize};

/// Failure inside the memory node process (setup, OS calls, I/O).
#[derive(Debug, thiserror::Error)]
pub enum NodeError {
    /// The setup cannot work: a [`crate::NodeConfig`] the node cannot serve
    /// (page size other than 4 KiB or 2 MiB, fewer than two pages, beyond the
    /// 48-bit offset space), a socket already served, or a token file that
    /// others can read or that holds no token.
    #[error("invalid memory node configuration: {0}")]
    Config(String),
    /// An OS call (memfd, mmap, seals, socket options) failed.
    #[error("{what} failed: {source}")]
    Os {
        /// The call that failed, e.g. `"memfd_create"`.
        what: &'static str,
        /// The errno it returned.
        source: nix::Error,
    },
    /// File or socket I/O failed (token file, listener, a client connection).
    #[error("{what} failed: {source}")]
    Io {
        /// What was being done, e.g. `"bind"`.
        what: &'static str,
        /// The underlying I/O error.
        source: std::io::Error,
    },
    /// The node or its server broke its own protocol (a server thread
    /// panicked).
    #[error("protocol error: {0}")]
    Protocol(String),
    /// A setup step the node performs through its own RPC logic was refused
    /// (registering its heap region).
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
    /// No free extent of the heap fits the chunk (the allocator is first-fit
    /// over page-granular extents, so free memory may be fragmented).
    #[error("out of memory: asked for {requested} B, largest free extent is {largest_free} B")]
    OutOfMemory {
        /// Bytes asked for.
        requested: u64,
        /// Largest free extent in bytes at the time.
        largest_free: u64,
    },
    /// `AllocChunk` asked for 0 bytes or for more than the heap region.
    #[error("invalid chunk length {0} (must be > 0 and at most the node's size)")]
    BadLength(u64),
    /// `FreeChunk` named an offset where no chunk starts.
    #[error("no chunk was allocated at offset {offset:#x}")]
    NotAllocated {
        /// The offset given.
        offset: u64,
    },
    /// `FreeChunk` named a chunk the calling session does not own: another
    /// session's, a persistent chunk another session allocated, a chunk of
    /// a group the caller does not hold, or one the node reserved for
    /// itself. Nothing changed; an admin request ([`crate::proto::AdminOp`])
    /// may free it.
    #[error("chunk at offset {offset:#x} belongs to another session")]
    NotOwner {
        /// Start offset of the chunk.
        offset: u64,
    },
    /// A root name is empty, longer than 64 bytes or outside `[A-Za-z0-9_./-]`;
    /// carries the name, cut to 80 characters.
    #[error("invalid root name {0:?}: 1..=64 bytes of [A-Za-z0-9_./-]")]
    BadRootName(String),
    /// A conditional `SetRoot` found another value than it expected (the roots'
    /// compare-and-set failed); nothing was written.
    #[error("root {name:?} is {current:?}, not the expected {expected:?}")]
    RootMismatch {
        /// The root.
        name: String,
        /// The value the request required (`None` = absent).
        expected: Option<u64>,
        /// The value the root has (`None` = absent).
        current: Option<u64>,
    },
    /// Setting a new root would exceed the table; carries its size,
    /// [`crate::node::MAX_ROOTS`].
    #[error("root table is full ({0} entries)")]
    RootTableFull(usize),
    /// A region to register is empty, starts off a page boundary or reaches
    /// past the remote address space.
    #[error(
        "region [{base:#x}, +{len:#x}) is not inside the node's remote space or not page aligned"
    )]
    BadRegion {
        /// Start offset asked for.
        base: u64,
        /// Length asked for, in bytes.
        len: u64,
    },
    /// Every protection-table slot is in use; carries their number,
    /// [`crate::layout::MAX_REGIONS`].
    #[error("protection table is full ({0} regions)")]
    RegionTableFull(usize),
    /// No registered region has this rkey (it was never issued or was
    /// deregistered).
    #[error("no region with rkey {0:#x}")]
    NoSuchRegion(u32),
    /// The remote page index is beyond the node's remote address space.
    #[error("remote page {0} does not exist")]
    BadPage(u64),
    /// Page migration found no spare memory page
    /// ([`crate::NodeConfig::spare_pages`] are all in use).
    #[error("no spare memory page left for remapping")]
    NoSparePage,
    /// A request frame did not decode as a [`crate::Request`]; carries the
    /// decoder's message.
    #[error("malformed request frame: {0}")]
    BadFrame(String),
    /// The node is shutting down and allocates nothing more.
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
    /// `ReleaseGroup` by a session that holds no reference on the group
    /// (never held it, or released it already). Nothing changed.
    #[error("this session holds no reference on group {0:?}")]
    NotHolder(String),
    /// An admin request without the node's token (or on a node that has
    /// none: an embedded node takes admin calls only in process).
    #[error("admin request refused: {0}")]
    NotAdmin(String),
    /// The node serves no more connections ([`crate::server::ServerConfig::max_connections`]);
    /// sent to the refused client before the node closes the connection.
    #[error("connection refused: the memory node serves at most {0} connections")]
    TooManyConnections(usize),
    /// The group (and its root) this session held was collected by an
    /// admin request ([`crate::AdminOp::GcRoot`]): its memory is gone.
    #[error("group {0:?} was collected by an admin (node gc --root) while this session held it")]
    Revoked(String),
    /// No root or chunk group of that name on the node.
    #[error("no root or chunk group named {0:?}")]
    NoSuchRoot(String),
}
