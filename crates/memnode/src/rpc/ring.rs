//! The shm transport of the RPC channel: one memfd per channel holding a
//! request ring and a reply ring, single producer / single consumer each,
//! shared by one client thread and one worker thread of the node.
//!
//! ```text
//! channel memfd
//! +--------------------+ 0
//! | ChannelHeader      |  320 B: geometry, state, four counters (a line each)
//! +--------------------+ 320
//! | request slots      |  slots × slot_bytes   (client writes, worker reads)
//! +--------------------+ 320 + slots·slot_bytes
//! | reply slots        |  slots × slot_bytes   (worker writes, client reads)
//! +--------------------+
//!
//! slot (slot_bytes = 16 + max_message, rounded up to 64):
//! byte 0        8       12        14       16                    slot_bytes
//!      +--------+-------+---------+--------+-----------------------+
//!      | id     | len   | service | status | payload (len bytes)   |
//!      +--------+-------+---------+--------+-----------------------+
//! ```
//!
//! Counters grow forever; request `s` lives in slot `s mod slots`. The
//! client publishes request `s` by storing `req_tail = s + 1` after
//! writing its slot; the worker consumes it and stores `req_head`; the
//! worker publishes reply `r` with `rep_tail = r + 1`, the client frees it
//! with `rep_head`. A client keeps at most `slots` requests unanswered, so
//! the worker always finds room for a reply (the channel's flow control:
//! `RpcChannel::send` refuses past it).
//!
//! The node trusts nothing it reads here: the geometry is its own private
//! copy ([`ChannelGeometry`]), a counter that claims more than `slots`
//! entries breaks the channel (the node closes it, the others go on), a
//! slot whose length exceeds `max_message` is answered as malformed, and
//! a request's bytes are copied out of the shared memory before a service
//! sees them, so a client that rewrites them meanwhile changes nothing.
//!
//! Every access to the shared bytes goes through atomics (`AtomicU64` for
//! the aligned words, `AtomicU8` for a payload's ragged end), as the
//! one-sided verbs of the shm backend do.

use std::sync::atomic::{AtomicU32, AtomicU64, AtomicU8, Ordering};
use std::sync::Arc;
use std::time::Duration;

use serde::{Deserialize, Serialize};
use zerocopy::{FromBytes, Immutable, IntoBytes, KnownLayout};

use crate::memory::Mapping;

/// Magic number of a channel header ("DMKITRNG").
pub const RING_MAGIC: u64 = u64::from_le_bytes(*b"DMKITRNG");
/// Version of this layout.
pub const RING_VERSION: u32 = 1;
/// Bytes of the [`ChannelHeader`] (the rings start there).
pub const HEADER_BYTES: usize = std::mem::size_of::<ChannelHeader>();
/// Bytes of a [`SlotHeader`].
pub const SLOT_HEADER_BYTES: usize = std::mem::size_of::<SlotHeader>();
/// Most slots a ring may have.
pub const MAX_SLOTS: u32 = 4096;
/// Largest `max_message` a channel may have (1 MiB).
pub const MAX_MESSAGE_LIMIT: u32 = 1 << 20;

/// [`ChannelHeader::state`]: the worker serves the channel.
pub const CHANNEL_OPEN: u32 = 0;
/// [`ChannelHeader::state`]: the node closed it (shutdown, session ended).
pub const CHANNEL_CLOSED: u32 = 1;
/// [`ChannelHeader::state`]: the node found its counters corrupt and
/// dropped it.
pub const CHANNEL_BROKEN: u32 = 2;

/// The header of a channel memfd. Lines 1–4 each hold one counter with a
/// single writer, so the two sides never write the same cache line.
///
/// ```text
/// line 0  byte 0      8        12      16          20           24      28      32        40             44     64
///         +-----------+--------+-------+-----------+------------+-------+-------+---------+--------------+------+
///         | magic     |version | slots |slot_bytes |max_message |worker | state |channel  |client_closed | pad  |
///         +-----------+--------+-------+-----------+------------+-------+-------+---------+--------------+------+
/// line 1  req_tail  (client: requests posted)
/// line 2  req_head  (worker: requests consumed)
/// line 3  rep_tail  (worker: replies posted)
/// line 4  rep_head  (client: replies consumed)
/// ```
#[repr(C)]
pub struct ChannelHeader {
    /// [`RING_MAGIC`].
    pub magic: u64,
    /// [`RING_VERSION`].
    pub version: u32,
    /// Slots of each ring.
    pub slots: u32,
    /// Bytes of one slot.
    pub slot_bytes: u32,
    /// Largest payload of a slot.
    pub max_message: u32,
    /// The worker thread that serves the channel.
    pub worker: u32,
    /// [`CHANNEL_OPEN`], [`CHANNEL_CLOSED`] or [`CHANNEL_BROKEN`] (node).
    pub state: AtomicU32,
    /// The node's id of the channel.
    pub channel: u64,
    /// 1 once the client dropped the channel (client).
    pub client_closed: AtomicU32,
    /// Padding to the end of line 0.
    pub _pad0: [u32; 5],
    /// Requests posted (client).
    pub req_tail: AtomicU64,
    /// Padding to the end of line 1.
    pub _pad1: [u64; 7],
    /// Requests consumed (worker).
    pub req_head: AtomicU64,
    /// Padding to the end of line 2.
    pub _pad2: [u64; 7],
    /// Replies posted (worker).
    pub rep_tail: AtomicU64,
    /// Padding to the end of line 3.
    pub _pad3: [u64; 7],
    /// Replies consumed (client).
    pub rep_head: AtomicU64,
    /// Padding to the end of line 4.
    pub _pad4: [u64; 7],
}
const _: () = assert!(std::mem::size_of::<ChannelHeader>() == 320);
const _: () = assert!(std::mem::offset_of!(ChannelHeader, req_tail) == 64);
const _: () = assert!(std::mem::offset_of!(ChannelHeader, rep_head) == 256);

/// The header of one slot (request or reply); the payload follows it.
///
/// ```text
/// byte 0            8          12          14         16
///      +------------+----------+-----------+----------+
///      | id         | len      | service   | status   |
///      +------------+----------+-----------+----------+
/// ```
///
/// `id` is the caller's, echoed in the reply; `status` is 0 in requests
/// and a [`super::RpcFailure`] code (0 = success) in replies.
#[repr(C)]
#[derive(
    Debug, Clone, Copy, Default, PartialEq, Eq, FromBytes, IntoBytes, KnownLayout, Immutable,
)]
pub struct SlotHeader {
    /// The caller's id of the request (echoed in its reply).
    pub id: u64,
    /// Payload bytes after the header.
    pub len: u32,
    /// The service called.
    pub service: u16,
    /// 0 in a request; the outcome's code in a reply.
    pub status: u16,
}
const _: () = assert!(std::mem::size_of::<SlotHeader>() == 16);

/// A channel's geometry as the node decided it: what both sides use
/// instead of the header's copy (which the client could overwrite).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct ChannelGeometry {
    /// The node's id of the channel.
    pub channel: u64,
    /// The worker thread that serves it.
    pub worker: u32,
    /// Slots of each ring (requests a client may have unanswered).
    pub slots: u32,
    /// Largest request or reply payload in bytes.
    pub max_message: u32,
}

impl ChannelGeometry {
    /// Bytes of one slot: its header and `max_message`, in whole lines.
    pub fn slot_bytes(&self) -> usize {
        (SLOT_HEADER_BYTES + self.max_message as usize).next_multiple_of(64)
    }

    /// Bytes of the channel memfd.
    pub fn len(&self) -> usize {
        HEADER_BYTES + 2 * self.slots as usize * self.slot_bytes()
    }

    /// Never: a channel has a header (clippy's pair for [`Self::len`]).
    pub fn is_empty(&self) -> bool {
        false
    }

    /// Whether the numbers are within what a node accepts.
    pub fn check(slots: u32, max_message: u32) -> Result<(), String> {
        if slots == 0 || slots > MAX_SLOTS {
            return Err(format!("{slots} slots: 1..={MAX_SLOTS}"));
        }
        if max_message == 0 || max_message > MAX_MESSAGE_LIMIT {
            return Err(format!(
                "max message {max_message} B: 1..={MAX_MESSAGE_LIMIT}"
            ));
        }
        Ok(())
    }
}

/// A mapped channel: the header and both rings, addressed through the
/// private geometry. Used by both sides (the node's worker and the
/// client's channel); each uses only its half of the operations.
pub struct RingView {
    map: Arc<Mapping>,
    geo: ChannelGeometry,
    slot_bytes: usize,
}

impl std::fmt::Debug for RingView {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RingView").field("geo", &self.geo).finish()
    }
}

impl RingView {
    /// Writes a fresh header for `geo` into `map` (the node, once, before
    /// anyone else maps it).
    pub fn init(map: Arc<Mapping>, geo: ChannelGeometry) -> Result<Self, String> {
        let v = Self::view(map, geo)?;
        let h = v.header_ptr();
        // SAFETY: the mapping holds at least a header (view checked its
        // length) and is page aligned; nobody else maps it yet, so plain
        // stores to the non-atomic fields are unobserved.
        unsafe {
            (*h).magic = RING_MAGIC;
            (*h).version = RING_VERSION;
            (*h).slots = geo.slots;
            (*h).slot_bytes = v.slot_bytes as u32;
            (*h).max_message = geo.max_message;
            (*h).worker = geo.worker;
            (*h).channel = geo.channel;
        }
        Ok(v)
    }

    /// A view of a channel the node set up (the client): checks the
    /// mapping's length and that the header matches `geo`.
    pub fn open(map: Arc<Mapping>, geo: ChannelGeometry) -> Result<Self, String> {
        let v = Self::view(map, geo)?;
        let h = v.header();
        if h.magic != RING_MAGIC
            || h.version != RING_VERSION
            || h.slots != geo.slots
            || h.max_message != geo.max_message
            || h.channel != geo.channel
            || h.slot_bytes as usize != v.slot_bytes
        {
            return Err("channel header does not match the announced geometry".into());
        }
        Ok(v)
    }

    fn view(map: Arc<Mapping>, geo: ChannelGeometry) -> Result<Self, String> {
        ChannelGeometry::check(geo.slots, geo.max_message)?;
        if map.len() < geo.len() {
            return Err(format!(
                "channel mapping is {} B, its geometry needs {} B",
                map.len(),
                geo.len()
            ));
        }
        if !map.writable() {
            return Err("a channel mapping must be writable".into());
        }
        Ok(Self {
            slot_bytes: geo.slot_bytes(),
            map,
            geo,
        })
    }

    /// The geometry.
    pub fn geometry(&self) -> ChannelGeometry {
        self.geo
    }

    /// The mapping (kept alive by every view of it).
    pub fn mapping(&self) -> &Arc<Mapping> {
        &self.map
    }

    fn header_ptr(&self) -> *mut ChannelHeader {
        self.map.as_ptr() as *mut ChannelHeader
    }

    /// The header. Only its atomics change after [`RingView::init`].
    pub fn header(&self) -> &ChannelHeader {
        // SAFETY: the mapping is page aligned and at least HEADER_BYTES long
        // (checked when the view was made) and lives as long as `self`;
        // fields that change are atomics.
        unsafe { &*self.header_ptr() }
    }

    /// Slot `seq mod slots` of the request ring (`reply = false`) or of
    /// the reply ring.
    fn slot(&self, reply: bool, seq: u64) -> *mut u8 {
        let ring = HEADER_BYTES + usize::from(reply) * self.geo.slots as usize * self.slot_bytes;
        let at = ring + (seq % self.geo.slots as u64) as usize * self.slot_bytes;
        debug_assert!(at + self.slot_bytes <= self.map.len());
        // SAFETY: at + slot_bytes ≤ geo.len() ≤ map.len() (checked when the
        // view was made).
        unsafe { self.map.as_ptr().add(at) }
    }

    fn write_slot(&self, reply: bool, seq: u64, head: SlotHeader, payload: &[u8]) {
        assert!(
            payload.len() <= self.geo.max_message as usize && head.len as usize == payload.len(),
            "a slot holds at most max_message bytes (callers check)"
        );
        let p = self.slot(reply, seq);
        // SAFETY: the slot lies inside the mapping (see `slot`), is 64-byte
        // aligned, and holds SLOT_HEADER_BYTES + max_message bytes.
        unsafe {
            copy_in(p, head.as_bytes());
            copy_in(p.add(SLOT_HEADER_BYTES), payload);
        }
    }

    /// Reads slot `seq`'s header, and its payload into `out` if its length
    /// is within `max_message` (`Err(header)` if it is not: a hostile or
    /// broken writer).
    fn read_slot(
        &self,
        reply: bool,
        seq: u64,
        out: &mut Vec<u8>,
    ) -> Result<SlotHeader, SlotHeader> {
        let p = self.slot(reply, seq);
        let mut raw = [0u8; SLOT_HEADER_BYTES];
        // SAFETY: as in `write_slot`.
        unsafe { copy_out(p, &mut raw) };
        let head = SlotHeader::read_from_bytes(&raw).expect("16 bytes make a slot header");
        let len = head.len as usize;
        if len > self.geo.max_message as usize {
            return Err(head);
        }
        out.clear();
        out.resize(len, 0);
        // SAFETY: len ≤ max_message, so the payload lies inside the slot.
        unsafe { copy_out(p.add(SLOT_HEADER_BYTES), out) };
        Ok(head)
    }

    /// Client: writes request `seq` (publish it with `req_tail`).
    pub fn write_request(&self, seq: u64, id: u64, service: u16, payload: &[u8]) {
        let head = SlotHeader {
            id,
            len: payload.len() as u32,
            service,
            status: 0,
        };
        self.write_slot(false, seq, head, payload);
    }

    /// Worker: reads request `seq` into `out` (see [`Self::read_slot`]).
    pub fn read_request(&self, seq: u64, out: &mut Vec<u8>) -> Result<SlotHeader, SlotHeader> {
        self.read_slot(false, seq, out)
    }

    /// Worker: writes reply `seq` (publish it with `rep_tail`).
    pub fn write_reply(&self, seq: u64, id: u64, service: u16, status: u16, payload: &[u8]) {
        let head = SlotHeader {
            id,
            len: payload.len() as u32,
            service,
            status,
        };
        self.write_slot(true, seq, head, payload);
    }

    /// Client: reads reply `seq` into `out`.
    pub fn read_reply(&self, seq: u64, out: &mut Vec<u8>) -> Result<SlotHeader, SlotHeader> {
        self.read_slot(true, seq, out)
    }
}

/// Copies `data` into shared memory at `dst` (8-byte aligned): whole words
/// as `AtomicU64` stores, the rest as `AtomicU8` stores.
///
/// # Safety
/// `dst..dst + data.len()` must lie inside a live mapping and `dst` must be
/// 8-byte aligned.
unsafe fn copy_in(dst: *mut u8, data: &[u8]) {
    debug_assert!((dst as usize).is_multiple_of(8));
    let mut words = data.chunks_exact(8);
    let mut at = 0;
    for w in &mut words {
        let v = u64::from_ne_bytes(w.try_into().expect("8 bytes"));
        // SAFETY: (caller) aligned and inside the mapping.
        unsafe { (*(dst.add(at) as *const AtomicU64)).store(v, Ordering::Relaxed) };
        at += 8;
    }
    for &b in words.remainder() {
        // SAFETY: (caller) inside the mapping.
        unsafe { (*(dst.add(at) as *const AtomicU8)).store(b, Ordering::Relaxed) };
        at += 1;
    }
}

/// Copies shared memory at `src` (8-byte aligned) into `out`.
///
/// # Safety
/// `src..src + out.len()` must lie inside a live mapping and `src` must be
/// 8-byte aligned.
unsafe fn copy_out(src: *const u8, out: &mut [u8]) {
    debug_assert!((src as usize).is_multiple_of(8));
    let mut at = 0;
    let mut words = out.chunks_exact_mut(8);
    for w in &mut words {
        // SAFETY: (caller) aligned and inside the mapping.
        let v = unsafe { (*(src.add(at) as *const AtomicU64)).load(Ordering::Relaxed) };
        w.copy_from_slice(&v.to_ne_bytes());
        at += 8;
    }
    for b in words.into_remainder() {
        // SAFETY: (caller) inside the mapping.
        *b = unsafe { (*(src.add(at) as *const AtomicU8)).load(Ordering::Relaxed) };
        at += 1;
    }
}

/// Blocks while `word` holds `expected`, for at most `timeout` (or until a
/// [`futex_wake`] on it, or a spurious wake-up). A shared (not private)
/// futex: the word lives in memory other processes map.
pub fn futex_wait(word: &AtomicU32, expected: u32, timeout: Duration) {
    let ts = nix::libc::timespec {
        tv_sec: timeout.as_secs() as nix::libc::time_t,
        tv_nsec: timeout.subsec_nanos() as nix::libc::c_long,
    };
    // SAFETY: FUTEX_WAIT reads the aligned 32-bit word at a live address
    // and the timespec for the duration of the call; it writes nothing.
    // Every outcome (woken, timed out, EAGAIN because the word changed,
    // EINTR) is fine for a caller that re-checks its condition.
    unsafe {
        nix::libc::syscall(
            nix::libc::SYS_futex,
            word.as_ptr(),
            nix::libc::FUTEX_WAIT,
            expected,
            &ts as *const nix::libc::timespec,
            std::ptr::null::<u32>(),
            0u32,
        );
    }
}

/// Wakes every thread blocked in [`futex_wait`] on `word` (in this process
/// or another that maps the same memory). Needs only read access to the
/// word's page.
pub fn futex_wake(word: &AtomicU32) {
    // SAFETY: FUTEX_WAKE only uses the word's address as a key; it reads
    // and writes no user memory.
    unsafe {
        nix::libc::syscall(
            nix::libc::SYS_futex,
            word.as_ptr(),
            nix::libc::FUTEX_WAKE,
            i32::MAX,
            std::ptr::null::<nix::libc::timespec>(),
            std::ptr::null::<u32>(),
            0u32,
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::memory::create_sealed_memfd;
    use std::os::fd::AsFd;

    fn ring(slots: u32, max: u32) -> RingView {
        let geo = ChannelGeometry {
            channel: 7,
            worker: 0,
            slots,
            max_message: max,
        };
        let fd = create_sealed_memfd(c"ring-test", geo.len()).unwrap();
        let map = Arc::new(Mapping::map(fd.as_fd(), geo.len(), true).unwrap());
        RingView::init(map, geo).unwrap()
    }

    #[test]
    fn slots_round_trip_and_wrap() {
        let r = ring(4, 100);
        let c = RingView::open(r.mapping().clone(), r.geometry()).unwrap();
        let mut out = Vec::new();
        for seq in 0..10u64 {
            let data: Vec<u8> = (0..(seq as usize * 11) % 101).map(|i| i as u8).collect();
            c.write_request(seq, seq * 3, 5, &data);
            let h = r.read_request(seq, &mut out).unwrap();
            assert_eq!((h.id, h.service, h.len as usize), (seq * 3, 5, data.len()));
            assert_eq!(out, data);
            r.write_reply(seq, h.id, 5, 3, &data[..data.len() / 2]);
            let h = c.read_reply(seq, &mut out).unwrap();
            assert_eq!((h.status, &out[..]), (3, &data[..data.len() / 2]));
        }
    }

    #[test]
    fn a_hostile_length_is_refused_and_bad_geometry_is_not_mapped() {
        let r = ring(2, 64);
        // A client writes a header claiming 1 MiB.
        let p = r.slot(false, 1);
        let evil = SlotHeader {
            id: 9,
            len: 1 << 20,
            service: 0,
            status: 0,
        };
        // SAFETY (test): slot 1 lies inside the mapping.
        unsafe { copy_in(p, evil.as_bytes()) };
        let mut out = Vec::new();
        assert_eq!(r.read_request(1, &mut out), Err(evil));
        let mut wrong = r.geometry();
        wrong.slots = 3;
        assert!(RingView::open(r.mapping().clone(), wrong).is_err());
        assert!(ChannelGeometry::check(0, 10).is_err());
        assert!(ChannelGeometry::check(1, MAX_MESSAGE_LIMIT + 1).is_err());
    }
}
