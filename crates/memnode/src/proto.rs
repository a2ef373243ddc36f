//! The memory node's small RPC service and its wire format.
//!
//! The node's CPU is weak and off the data path (SMART §2.1): it only serves
//! chunk allocation, named roots, region listing, statistics and shutdown.
//!
//! Framing on the Unix socket: a little-endian `u32` payload length followed
//! by a bincode payload (fixed-int encoding, length-limited so a hostile
//! length cannot make the node allocate). A frame longer than
//! [`MAX_FRAME`] closes the connection; a frame that does not decode is
//! answered with [`RpcError::BadFrame`].

use std::io::{self, Read, Write};

use bincode::Options;
use serde::{Deserialize, Serialize};

use crate::error::RpcError;

/// Largest accepted frame payload in bytes.
pub const MAX_FRAME: u32 = 64 * 1024;
/// Protocol magic in [`Hello`].
pub const PROTO_MAGIC: u64 = u64::from_le_bytes(*b"DMKITRPC");
/// Protocol version in [`Hello`]. Version 2: RPC channels (the worker
/// count in [`Welcome`]) and [`NodeStats`]'s `corm` section (bincode
/// encodes fields by position, so a version-1 peer could not decode them).
/// Version 3: chunk groups (memory owned by the sessions that hold a
/// structure), `OpenRoot`, `ListRoots`, admin requests, and the
/// refusal a node over its connection cap sends before it closes.
pub const PROTO_VERSION: u32 = 3;
/// Length of an authentication token in bytes (hex-encoded in the token file).
pub const TOKEN_LEN: usize = 32;

/// First frame a client sends.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Hello {
    /// [`PROTO_MAGIC`]; anything else closes the connection as an
    /// authentication failure.
    pub magic: u64,
    /// [`PROTO_VERSION`] of the client; the node refuses any other.
    pub version: u32,
    /// The secret of the node's token file (mode 0600), compared in constant
    /// time.
    pub token: [u8; TOKEN_LEN],
}

/// Geometry of a memory node, sent in [`Welcome`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct NodeLayout {
    /// Memory node id: the high 16 bits of every `GlobalAddr` into this node.
    pub node_id: u16,
    /// log2 of the translation page size (12 = 4 KiB, 21 = 2 MiB).
    pub page_shift: u8,
    /// Remote address space size in pages.
    pub remote_pages: u64,
    /// Memory pages in the data memfd (remote pages + spare pages for remapping).
    pub phys_pages: u64,
    /// Bytes of the control memfd.
    pub control_len: u64,
}

impl NodeLayout {
    /// Translation page size in bytes (4096 or 2 MiB).
    pub fn page_size(&self) -> u64 {
        1 << self.page_shift
    }
    /// Size of the remote address space in bytes (`remote_pages` pages; offsets
    /// below it are addressable).
    pub fn remote_len(&self) -> u64 {
        self.remote_pages << self.page_shift
    }
    /// Size of the data memfd in bytes (`phys_pages` pages, spare pages
    /// included).
    pub fn data_len(&self) -> u64 {
        self.phys_pages << self.page_shift
    }
}

/// A registered region as reported to clients.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct RegionInfo {
    /// The region's remote key, checked on every one-sided request; its low
    /// byte is the protection-table slot, the rest random.
    pub rkey: u32,
    /// Byte offset of the region in the node's remote address space.
    pub base: u64,
    /// Length of the region in bytes.
    pub len: u64,
    /// Bit set of [`crate::layout::access`].
    pub access: u64,
}

/// The node's answer to a valid [`Hello`]; the data memfd and a read-only
/// descriptor of the control memfd travel with it as `SCM_RIGHTS`.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Welcome {
    /// The session this connection opened; its non-persistent chunks are freed
    /// when it ends.
    pub session: u64,
    /// The node's geometry, needed to map the two memfds.
    pub layout: NodeLayout,
    /// The region covering the node's allocatable memory (chunks live in it).
    pub heap: RegionInfo,
    /// The node's RPC worker threads (0: it serves no RPC channel).
    pub rpc_workers: u32,
    /// The data descriptor is the node's memory file
    /// ([`crate::file`]), not a sealed memfd: a file cannot be sealed.
    pub memory_file: bool,
}

/// Requests of the RPC service.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum Request {
    /// Allocate a page-aligned chunk. `persistent = false` chunks belong to
    /// the calling session and are freed when it ends (including a crash).
    AllocChunk {
        /// Bytes wanted; the node rounds up to whole pages.
        len: u64,
        /// Whether the chunk outlives the calling session.
        persistent: bool,
    },
    /// Free a chunk by its start offset.
    FreeChunk {
        /// Start offset of the chunk, as [`Response::Chunk`] returned it.
        offset: u64,
    },
    /// Read a named root (a well-known word, typically a data structure's
    /// descriptor address, by which clients find each other's structures).
    GetRoot {
        /// 1..=64 bytes of `[A-Za-z0-9_./-]`.
        name: String,
    },
    /// Set a named root; with `expected`, only if the current value matches
    /// (`Some(None)` = only if absent).
    SetRoot {
        /// 1..=64 bytes of `[A-Za-z0-9_./-]`.
        name: String,
        /// The new value (opaque to the node).
        value: u64,
        /// Compare-and-set condition; `None` sets unconditionally.
        expected: Option<Option<u64>>,
    },
    /// List the registered regions (the protection table's valid slots).
    ListRegions,
    /// A snapshot of [`NodeStats`].
    Stats,
    /// Stop serving: the node marks itself closed, so clients' verbs fail from
    /// then on.
    Shutdown,
    /// Open an RPC channel of `slots` slots of `max_message` bytes; the
    /// answer [`Response::RpcChannel`] carries its memfd as `SCM_RIGHTS`.
    OpenRpcChannel {
        /// Slots of each ring.
        slots: u32,
        /// Largest request or reply payload.
        max_message: u32,
    },
    /// Allocate a chunk owned by chunk group `group` (a structure: its
    /// root's name). The calling session takes a reference on the group
    /// if it holds none; the chunk lives until the group's last reference
    /// goes (see [`crate::node`]'s ownership rule).
    AllocGroupChunk {
        /// Bytes wanted; the node rounds up to whole pages.
        len: u64,
        /// The group (1..=64 bytes of `[A-Za-z0-9_./-]`).
        group: String,
    },
    /// Take one more reference on chunk group `group` (created empty if
    /// new). Answer: [`Response::Held`].
    HoldGroup {
        /// The group.
        group: String,
    },
    /// Drop one of the calling session's references on `group`; the last
    /// reference of all sessions frees the group's chunks and the roots
    /// attached to it. Answer: [`Response::Released`].
    ReleaseGroup {
        /// The group.
        group: String,
    },
    /// Read named root `name` and, if it is set, take a reference on the
    /// chunk group of the same name (opening a structure). Answer:
    /// [`Response::Root`].
    OpenRoot {
        /// 1..=64 bytes of `[A-Za-z0-9_./-]`.
        name: String,
    },
    /// List the roots and chunk groups with their holders and sizes.
    /// Answer: [`Response::Roots`].
    ListRoots,
    /// An operator's request, authorised by the node's token again (the
    /// login proves a client may use the node; this proves the caller
    /// means to override ownership).
    Admin {
        /// The node's token.
        token: [u8; TOKEN_LEN],
        /// What to do.
        op: AdminOp,
    },
}

/// Admin operations ([`Request::Admin`]).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum AdminOp {
    /// Free what dead sessions left: persistent chunks whose allocating
    /// session has ended, and chunk groups no session holds. Answer:
    /// [`Response::Collected`].
    Gc,
    /// Free a chunk whoever owns it (not the node's internal ones).
    /// Answer: [`Response::Freed`].
    FreeChunk {
        /// Start offset of the chunk.
        offset: u64,
    },
    /// Collect root `name` and its chunk group now, held or not: the
    /// chunks are freed, the root name removed, and each session that
    /// held the group gets [`crate::RpcError::Revoked`] from its later
    /// requests on it. Answer: [`Response::Collected`].
    GcRoot {
        /// The root (and group) name.
        name: String,
    },
}

/// A root or chunk group as [`Request::ListRoots`] reports it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RootInfo {
    /// The root's (or group's) name.
    pub name: String,
    /// The root's value, `None` for a group without a root here (a
    /// structure's chunks on a node other than its home).
    pub value: Option<u64>,
    /// The group the root is attached to (freed with it), if any.
    pub group: Option<String>,
    /// Sessions holding the group and their reference counts.
    pub holders: Vec<(u64, u32)>,
    /// Sum of the holders' references.
    pub refs: u32,
    /// Chunks the group owns.
    pub chunks: u64,
    /// Bytes of those chunks.
    pub bytes: u64,
}

/// Answers of the RPC service.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
// `Stats` is the big one (RPC and CoRM counters): a control-plane answer,
// moved once per frame, not worth a box at every call site.
#[allow(clippy::large_enum_variant)]
pub enum Response {
    /// Answer to `AllocChunk`: a zeroed chunk inside the heap region.
    Chunk {
        /// Start of the chunk, a page-aligned byte offset (never 0).
        offset: u64,
        /// Length in bytes: the request rounded up to whole pages.
        len: u64,
        /// The heap region's rkey, which covers the chunk.
        rkey: u32,
    },
    /// Answer to `FreeChunk`: the chunk is free and its memory zeroed
    /// (hole-punched, or cleared in place when a NIC pins it).
    Freed {
        /// Bytes freed (the chunk's whole length).
        len: u64,
    },
    /// Answer to `GetRoot`: the value, or `None` if unset.
    Root(Option<u64>),
    /// Answer to `SetRoot`: it was written.
    RootSet {
        /// The value it replaced (`None` if it was unset).
        previous: Option<u64>,
    },
    /// Answer to `ListRegions`.
    Regions(Vec<RegionInfo>),
    /// Answer to `Stats`.
    Stats(NodeStats),
    /// Answer to `Shutdown`: the node stops accepting connections.
    ShuttingDown,
    /// The request failed; nothing changed.
    Error(RpcError),
    /// A channel opened (its memfd travels with this frame).
    RpcChannel(crate::rpc::ring::ChannelGeometry),
    /// Answer to `AllocGroupChunk`: a zeroed chunk inside the heap region.
    GroupChunk {
        /// Start of the chunk, a page-aligned byte offset (never 0).
        offset: u64,
        /// Length in bytes: the request rounded up to whole pages.
        len: u64,
        /// The heap region's rkey, which covers the chunk.
        rkey: u32,
        /// This allocation took the session's reference on the group (it
        /// held none before); the caller owes a `ReleaseGroup`.
        took_ref: bool,
    },
    /// Answer to `HoldGroup`.
    Held {
        /// The group's references now, all sessions together.
        refs: u32,
    },
    /// Answer to `ReleaseGroup`.
    Released {
        /// References left, all sessions together (0: the group is gone).
        refs: u32,
        /// Bytes freed (non-zero only when the last reference went).
        freed_bytes: u64,
    },
    /// Answer to `ListRoots`.
    Roots(Vec<RootInfo>),
    /// Answer to `Admin { op: Gc }`.
    Collected {
        /// Chunks freed.
        chunks: u64,
        /// Bytes freed.
        bytes: u64,
    },
}

/// Statistics of a memory node. One-sided verbs never reach the node's CPU,
/// so there are no verb counters here (see the fabric's per-QP statistics).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct NodeStats {
    /// Memory node id.
    pub node_id: u16,
    /// Translation page size in bytes.
    pub page_size: u64,
    /// Size of the remote address space in bytes.
    pub remote_bytes: u64,
    /// Size of the heap region chunks are carved from (the remote space less
    /// its first page, so offset 0 stays null).
    pub heap_bytes: u64,
    /// Heap bytes not allocated to any chunk.
    pub heap_free_bytes: u64,
    /// Largest free extent of the heap in bytes: the biggest chunk that can be
    /// allocated now.
    pub heap_largest_free: u64,
    /// Chunks allocated now.
    pub chunks: u64,
    /// Bytes of the allocated chunks (whole pages), `session_chunk_bytes +
    /// persistent_chunk_bytes`.
    pub chunk_bytes: u64,
    /// Bytes of chunks owned by a session (freed when it ends).
    pub session_chunk_bytes: u64,
    /// Bytes of chunks allocated as persistent (outlive their session).
    pub persistent_chunk_bytes: u64,
    /// Valid protection-table slots (the heap region included), at most
    /// [`crate::layout::MAX_REGIONS`].
    pub regions: u64,
    /// Named roots set.
    pub roots: u64,
    /// Sessions open now.
    pub sessions_active: u64,
    /// Sessions opened since the node started.
    pub sessions_total: u64,
    /// Sessions ended since the node started, by a clean close or a dead
    /// connection alike.
    pub sessions_reaped: u64,
    /// Session-owned chunks freed because their session ended.
    pub chunks_reclaimed: u64,
    /// RPC requests handled, failed ones included (this `Stats` request too).
    pub rpcs: u64,
    /// RPC requests answered with [`Response::Error`].
    pub rpc_errors: u64,
    /// Frames after the handshake that were unreadable, too long or not a
    /// [`Request`].
    pub bad_frames: u64,
    /// Handshakes refused: no [`Hello`], or a bad magic, version or token.
    pub auth_failures: u64,
    /// Connections dropped because no thread could serve them.
    pub refused_connections: u64,
    /// Remote pages moved to another memory page (page migration).
    pub pages_remapped: u64,
    /// Spare memory pages left for page migration.
    pub spare_pages_free: u64,
    /// RPC worker threads the node runs.
    pub rpc_workers: u64,
    /// RPC channels open now.
    pub rpc_channels: u64,
    /// RPC channels opened since the node started.
    pub rpc_channels_total: u64,
    /// Channels closed by their client or reclaimed with its session.
    pub rpc_channels_reclaimed: u64,
    /// Channels dropped because their counters were corrupt.
    pub rpc_channels_broken: u64,
    /// RPC requests served (calls run, including failed ones).
    pub rpc_requests: u64,
    /// RPC requests answered with a failure.
    pub rpc_failures: u64,
    /// RPC requests whose slot could not be read.
    pub rpc_malformed: u64,
    /// Messages between RPC workers.
    pub rpc_messages: u64,
    /// The CoRM object store's accounting, when the node runs one
    /// ([`crate::corm`]): active memory, live bytes, per-class
    /// fragmentation, compaction counters.
    pub corm: Option<Box<crate::corm::CormStats>>,
}

fn codec() -> impl Options {
    bincode::DefaultOptions::new()
        .with_fixint_encoding()
        .with_limit(MAX_FRAME as u64)
        .reject_trailing_bytes()
}

/// Encodes a message into a frame payload.
pub fn encode<T: Serialize>(msg: &T) -> Vec<u8> {
    // Only our own types are encoded; they are small and never exceed the
    // limit, so failure here is a programmer error.
    codec().serialize(msg).expect("rpc message encodes")
}

/// Decodes a frame payload.
pub fn decode<T: for<'de> Deserialize<'de>>(payload: &[u8]) -> Result<T, RpcError> {
    codec()
        .deserialize(payload)
        .map_err(|e| RpcError::BadFrame(e.to_string()))
}

/// Writes one frame.
pub fn write_frame(w: &mut impl Write, payload: &[u8]) -> io::Result<()> {
    let len = u32::try_from(payload.len())
        .ok()
        .filter(|&l| l <= MAX_FRAME)
        .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidInput, "frame too large"))?;
    let mut buf = Vec::with_capacity(4 + payload.len());
    buf.extend_from_slice(&len.to_le_bytes());
    buf.extend_from_slice(payload);
    w.write_all(&buf)
}

/// Reads one frame. `Ok(None)` on a clean end of stream before a frame
/// starts; an oversized length is an `InvalidData` error.
pub fn read_frame(r: &mut impl Read) -> io::Result<Option<Vec<u8>>> {
    let mut len = [0u8; 4];
    match r.read_exact(&mut len) {
        Ok(()) => {}
        Err(e) if e.kind() == io::ErrorKind::UnexpectedEof => return Ok(None),
        Err(e) => return Err(e),
    }
    let len = u32::from_le_bytes(len);
    if len > MAX_FRAME {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            format!("frame of {len} B exceeds the {MAX_FRAME} B limit"),
        ));
    }
    let mut payload = vec![0u8; len as usize];
    r.read_exact(&mut payload)?;
    Ok(Some(payload))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn requests_round_trip_and_garbage_is_a_typed_error() {
        let reqs = [
            Request::AllocChunk {
                len: 1 << 20,
                persistent: true,
            },
            Request::SetRoot {
                name: "race/dir".into(),
                value: 42,
                expected: Some(None),
            },
            Request::Shutdown,
        ];
        for r in reqs {
            let back: Request = decode(&encode(&r)).unwrap();
            assert_eq!(back, r);
        }
        // An enum tag that does not exist.
        assert!(matches!(
            decode::<Request>(&[200, 0, 0, 0]),
            Err(RpcError::BadFrame(_))
        ));
        // A string whose length prefix claims 2^60 bytes must not allocate.
        let mut evil = vec![2, 0, 0, 0];
        evil.extend_from_slice(&(1u64 << 60).to_le_bytes());
        assert!(matches!(
            decode::<Request>(&evil),
            Err(RpcError::BadFrame(_))
        ));
        // Trailing bytes are refused.
        let mut trailing = encode(&Request::Stats);
        trailing.push(0);
        assert!(decode::<Request>(&trailing).is_err());
    }

    #[test]
    fn oversized_frames_are_refused_before_reading_them() {
        let mut data = Vec::new();
        data.extend_from_slice(&(MAX_FRAME + 1).to_le_bytes());
        let err = read_frame(&mut &data[..]).unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::InvalidData);
        assert!(read_frame(&mut &[][..]).unwrap().is_none());
    }
}
