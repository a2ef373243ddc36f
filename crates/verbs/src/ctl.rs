//! The memory node's TCP control channel for the verbs backend: the
//! shm backend's RPC service (chunks, roots, regions, stats, shutdown)
//! plus queue-pair setup — QP numbers, PSNs, GIDs/LIDs, region keys and
//! base addresses. No memcached, no out-of-band scripts.
//!
//! Framing as on the Unix socket ([`dmkit_memnode::proto`]): a
//! little-endian `u32` length, then a bincode payload of at most
//! [`MAX_FRAME`] bytes. The first frame is
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
    /// dmkit's view of the region: rkey, base offset and length in the node's
    /// remote address space, access rights.
    pub info: RegionInfo,
    /// The rkey the NIC issued for the region (`ibv_reg_mr`), which work
    /// requests carry on the wire.
    pub nic_rkey: u32,
    /// The node's virtual address of the region's first byte, as registered;
    /// remote offset `o` is NIC address `nic_addr + (o - info.base)`.
    pub nic_addr: u64,
}

/// Client → node.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub enum Ctl {
    /// The first frame: authenticates the client; the node answers
    /// [`CtlReply::Welcome`], or [`CtlReply::Refused`] and closes.
    Hello {
        /// [`CTL_MAGIC`].
        magic: u64,
        /// [`CTL_VERSION`] of the client; the node refuses any other.
        version: u32,
        /// The secret of the node's token file.
        token: [u8; TOKEN_LEN],
    },
    /// One request of the memory node's RPC service.
    Rpc(Request),
    /// Create a node-side queue pair connected to `client`.
    Connect {
        /// How the client's queue pair is addressed.
        client: Endpoint,
    },
    /// Replace the node-side queue pair `server_qpn` (after an error moved
    /// the pair to the error state) by a fresh one connected to `client`.
    Reconnect {
        /// Number of the node-side queue pair to drop.
        server_qpn: u32,
        /// How the client's new queue pair is addressed.
        client: Endpoint,
    },
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
    /// Answer to [`Ctl::Hello`]: the session and everything a client needs to
    /// post verbs to the node.
    Welcome {
        /// The session opened; its non-persistent chunks are freed when the
        /// connection ends.
        session: u64,
        /// The node's geometry (page size, remote space).
        layout: NodeLayout,
        /// The region covering the node's allocatable memory.
        heap: RegionInfo,
        /// Every registered region with its NIC key and address.
        regions: Vec<NicRegion>,
        /// The node's device limits, so a client's queue pairs ask for no more
        /// than its side grants.
        device: DeviceCaps,
        /// The node's RPC worker threads (0: no RPC channels).
        rpc_workers: u32,
    },
    /// Answer to [`Ctl::Rpc`].
    Rpc(Response),
    /// Answer to [`Ctl::Connect`] and [`Ctl::Reconnect`]: the node-side queue
    /// pair exists and is connected to the client's.
    Connected {
        /// How the node-side queue pair is addressed.
        server: Endpoint,
    },
    /// Answer to [`Ctl::Regions`].
    Regions(Vec<NicRegion>),
    /// The request failed (authentication, a second Hello, a queue pair that
    /// could not be made, regions that could not be registered); carries why.
    Refused(String),
}

fn codec() -> impl Options {
    bincode::DefaultOptions::new()
        .with_fixint_encoding()
        .with_limit(MAX_FRAME as u64)
        .reject_trailing_bytes()
}

/// A message's frame payload.
pub fn encode<T: Serialize>(msg: &T) -> io::Result<Vec<u8>> {
    codec()
        .serialize(msg)
        .map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e.to_string()))
}

/// A message from its frame payload.
pub fn decode<T: for<'de> Deserialize<'de>>(bytes: &[u8]) -> io::Result<T> {
    codec()
        .deserialize(bytes)
        .map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e.to_string()))
}

/// Writes one message.
pub fn send<T: Serialize>(w: &mut impl Write, msg: &T) -> io::Result<()> {
    let bytes = encode(msg)?;
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
