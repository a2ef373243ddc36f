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
/// Protocol version in [`Hello`]. Version 2: [`NodeStats`] gained its
/// `corm` section (bincode encodes fields by position, so a version-1 peer
/// could not decode the longer stats).
pub const PROTO_VERSION: u32 = 2;
/// Length of an authentication token in bytes (hex-encoded in the token file).
pub const TOKEN_LEN: usize = 32;

/// First frame a client sends.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Hello {
    pub magic: u64,
    pub version: u32,
    pub token: [u8; TOKEN_LEN],
}

/// Geometry of a memory node, sent in [`Welcome`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct NodeLayout {
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
    pub fn page_size(&self) -> u64 {
        1 << self.page_shift
    }
    pub fn remote_len(&self) -> u64 {
        self.remote_pages << self.page_shift
    }
    pub fn data_len(&self) -> u64 {
        self.phys_pages << self.page_shift
    }
}

/// A registered region as reported to clients.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct RegionInfo {
    pub rkey: u32,
    /// Byte offset of the region in the node's remote address space.
    pub base: u64,
    pub len: u64,
    /// Bit set of [`crate::layout::access`].
    pub access: u64,
}

/// The node's answer to a valid [`Hello`]; the data memfd and a read-only
/// descriptor of the control memfd travel with it as `SCM_RIGHTS`.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Welcome {
    pub session: u64,
    pub layout: NodeLayout,
    /// The region covering the node's allocatable memory (chunks live in it).
    pub heap: RegionInfo,
}

/// Requests of the RPC service.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum Request {
    /// Allocate a page-aligned chunk. `persistent = false` chunks belong to
    /// the calling session and are freed when it ends (including a crash).
    AllocChunk {
        len: u64,
        persistent: bool,
    },
    /// Free a chunk by its start offset.
    FreeChunk {
        offset: u64,
    },
    GetRoot {
        name: String,
    },
    /// Set a named root; with `expected`, only if the current value matches
    /// (`Some(None)` = only if absent).
    SetRoot {
        name: String,
        value: u64,
        expected: Option<Option<u64>>,
    },
    ListRegions,
    Stats,
    Shutdown,
}

/// Answers of the RPC service.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum Response {
    Chunk { offset: u64, len: u64, rkey: u32 },
    Freed { len: u64 },
    Root(Option<u64>),
    RootSet { previous: Option<u64> },
    Regions(Vec<RegionInfo>),
    Stats(NodeStats),
    ShuttingDown,
    Error(RpcError),
}

/// Statistics of a memory node. One-sided verbs never reach the node's CPU,
/// so there are no verb counters here (see the fabric's per-QP statistics).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct NodeStats {
    pub node_id: u16,
    pub page_size: u64,
    pub remote_bytes: u64,
    pub heap_bytes: u64,
    pub heap_free_bytes: u64,
    pub heap_largest_free: u64,
    pub chunks: u64,
    pub chunk_bytes: u64,
    pub session_chunk_bytes: u64,
    pub persistent_chunk_bytes: u64,
    pub regions: u64,
    pub roots: u64,
    pub sessions_active: u64,
    pub sessions_total: u64,
    pub sessions_reaped: u64,
    pub chunks_reclaimed: u64,
    pub rpcs: u64,
    pub rpc_errors: u64,
    pub bad_frames: u64,
    pub auth_failures: u64,
    /// Connections dropped because no thread could serve them.
    pub refused_connections: u64,
    pub pages_remapped: u64,
    pub spare_pages_free: u64,
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
