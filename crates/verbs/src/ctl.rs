//! The memory node's TCP control channel for the verbs backend: the
//! shm backend's RPC service (chunks, roots, regions, stats, shutdown)
//! plus queue-pair setup — QP numbers, PSNs, GIDs/LIDs, region keys and
//! base addresses. No memcached, no out-of-band scripts.
//!
//! Framing as on the Unix socket ([`dmkit_memnode::proto`]): a
//! little-endian `u32` length, then a bincode payload of at most
//! [`MAX_FRAME`](dmkit_memnode::proto::MAX_FRAME) bytes. The first frame is
//! [`Ctl::Hello`] with the node's shared secret.

use std::io::{self, Read, Write};

use bincode::Options;
use dmkit_memnode::proto::{read_frame, write_frame, MAX_FRAME, TOKEN_LEN};
use dmkit_memnode::{NodeLayout, RegionInfo, Request, Response};
use serde::{Deserialize, Serialize};

use crate::device::{DeviceCaps, Endpoint};

/// Protocol magic of the verbs control channel.
pub const CTL_MAGIC: u64 = u64::from_le_bytes(*b"DMKITVRB");
/// Protocol version. (2: RPC channels, [`Ctl::ConnectRpc`]; the node's
/// worker count in the welcome.)
pub const CTL_VERSION: u32 = 2;

/// A region as the NIC sees it: dmkit's key and bounds, and the NIC's
/// key and virtual address of the region's first byte.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct NicRegion {
    pub info: RegionInfo,
    pub nic_rkey: u32,
    pub nic_addr: u64,
}

/// Client → node.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub enum Ctl {
    Hello {
        magic: u64,
        version: u32,
        token: [u8; TOKEN_LEN],
    },
    /// One request of the memory node's RPC service.
    Rpc(Request),
    /// Create a node-side queue pair connected to `client`.
    Connect { client: Endpoint },
    /// Replace the node-side queue pair `server_qpn` (after an error moved
    /// the pair to the error state) by a fresh one connected to `client`.
    Reconnect { server_qpn: u32, client: Endpoint },
    /// The node's regions with their NIC keys.
    Regions,
    /// Create the node's end of an RPC channel (a message queue pair served
    /// by the node's workers) connected to `client`, with `slots` messages
    /// of at most `max_message` payload bytes in flight each way.
    ConnectRpc {
        /// The client's message queue pair.
        client: Endpoint,
        /// Requests the client may have unanswered.
        slots: u32,
        /// Largest request or reply payload.
        max_message: u32,
    },
}

/// Node → client.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub enum CtlReply {
    Welcome {
        session: u64,
        layout: NodeLayout,
        heap: RegionInfo,
        regions: Vec<NicRegion>,
        device: DeviceCaps,
        /// The node's RPC worker threads (0: no RPC channels).
        rpc_workers: u32,
    },
    Rpc(Response),
    Connected {
        server: Endpoint,
    },
    Regions(Vec<NicRegion>),
    Refused(String),
}

fn codec() -> impl Options {
    bincode::DefaultOptions::new()
        .with_fixint_encoding()
        .with_limit(MAX_FRAME as u64)
        .reject_trailing_bytes()
}

/// Writes one message.
pub fn send<T: Serialize>(w: &mut impl Write, msg: &T) -> io::Result<()> {
    let bytes = codec()
        .serialize(msg)
        .map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e.to_string()))?;
    write_frame(w, &bytes)
}

/// Reads one message; `Ok(None)` at end of stream.
pub fn recv<T: for<'de> Deserialize<'de>>(r: &mut impl Read) -> io::Result<Option<T>> {
    match read_frame(r)? {
        None => Ok(None),
        Some(bytes) => codec()
            .deserialize(&bytes)
            .map(Some)
            .map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e.to_string())),
    }
}
