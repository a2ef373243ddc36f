//! Layouts shared between a memory node and the compute processes that map
//! its memory (the `shm` backend). Every type here lives in the *control*
//! memfd, which clients map read-only; the node is its only writer.
//!
//! The control memfd plays the role of a NIC's MPT (memory protection table:
//! [`RegionEntry`]) and MTT (memory translation table: [`PageEntry`]) from
//! SMART §2.2 ("Memory Translation and Protection Table"): one-sided requests
//! are checked against the first and translated through the second without the
//! node's CPU.
//!
//! ```text
//! control memfd
//! +--------------------+ 0
//! | ControlHeader      |  4096 B (padded)
//! +--------------------+ 4096
//! | RegionEntry × 64   |  64 × 32 B = 2048 B
//! +--------------------+ 6144
//! | WorkerBell × 32    |  32 × 64 B = 2048 B (RPC worker wake-up words)
//! +--------------------+ 8192
//! | PageEntry × N      |  N = remote pages, 8 B each
//! +--------------------+
//! ```

use std::sync::atomic::{AtomicU64, Ordering};

/// Magic number at the start of the control memfd ("DMKITCTL").
pub const CONTROL_MAGIC: u64 = u64::from_le_bytes(*b"DMKITCTL");
/// Layout version; bumped on any change to the types in this module.
/// (2: the RPC workers' bells.)
pub const LAYOUT_VERSION: u64 = 2;
/// Number of protection-table slots. The slot index is the low byte of an rkey.
pub const MAX_REGIONS: usize = 64;
/// Offset of the region table inside the control memfd.
pub const REGION_TABLE_OFFSET: usize = 4096;
/// Offset of the page table inside the control memfd.
pub const PAGE_TABLE_OFFSET: usize = 8192;
/// Offset of the RPC workers' bells inside the control memfd.
pub const WORKER_BELLS_OFFSET: usize = 6144;
/// Most RPC worker threads a node runs (one [`WorkerBell`] each).
pub const MAX_WORKER_BELLS: usize = 32;

/// Header of the control memfd.
///
/// ```text
/// byte 0        8             16            24            32            40            48
///      +--------+-------------+-------------+-------------+-------------+-------------+
///      | magic  | version     | node_id     | page_shift  | remote_pages| phys_pages  |
///      +--------+-------------+-------------+-------------+-------------+-------------+
///      | generation (bumped by every region or page-table change) | state | pad to 4096 B
/// ```
///
/// `state` is [`NODE_SERVING`] while the node serves and [`NODE_CLOSED`] once
/// it shut down: clients check it on every post, so verbs against a node that
/// is gone fail instead of touching orphaned memory. (A node killed by a
/// signal cannot set it; its clients learn of it at their next RPC.)
#[repr(C)]
pub struct ControlHeader {
    /// [`CONTROL_MAGIC`]; a client refuses a control memfd without it.
    pub magic: u64,
    /// [`LAYOUT_VERSION`] of the writer; a client refuses any other.
    pub version: u64,
    /// Memory node id (the high 16 bits of a `GlobalAddr` into this node),
    /// widened to 64 bits.
    pub node_id: u64,
    /// log2 of the translation page size: 12 (4 KiB) or 21 (2 MiB).
    pub page_shift: u64,
    /// Pages of the remote address space, i.e. entries of the page table.
    pub remote_pages: u64,
    /// Pages of the data memfd: the remote pages plus the spare pages that page
    /// migration moves remote pages to.
    pub phys_pages: u64,
    /// Bumped by every change to the region or page table, so a client can tell
    /// its cached view went stale.
    pub generation: AtomicU64,
    /// [`NODE_SERVING`] or [`NODE_CLOSED`].
    pub state: AtomicU64,
    /// Zero; pads the header to one 4096-byte page.
    pub _reserved: [u64; 504],
}

/// [`ControlHeader::state`]: the node serves.
pub const NODE_SERVING: u64 = 0;
/// [`ControlHeader::state`]: the node has shut down.
pub const NODE_CLOSED: u64 = 1;
const _: () = assert!(std::mem::size_of::<ControlHeader>() == 4096);

/// Access rights of a registered region (bit flags in [`RegionEntry::key_word`]).
pub mod access {
    /// The region may be the source of a READ.
    pub const READ: u64 = 1;
    /// The region may be the target of a WRITE.
    pub const WRITE: u64 = 2;
    /// The region may be the target of CAS, masked CAS and FAA.
    pub const ATOMIC: u64 = 4;
    /// All three rights.
    pub const ALL: u64 = READ | WRITE | ATOMIC;
}

/// One slot of the protection table: a registered region of the node's
/// remote address space and its key.
///
/// ```text
/// key_word (64 bit):
///  63     62..35     34..32    31 ........................ 0
/// +-----+----------+---------+------------------------------+
/// |valid| reserved | access  | rkey = random:24 | slot:8    |
/// +-----+----------+---------+------------------------------+
/// then: base (u64 byte offset), len (u64 bytes), reserved (u64)
/// ```
///
/// Writers (the node only) store `key_word = 0`, then `base`/`len`, then the
/// new `key_word`; readers load `key_word`, `base`, `len` and `key_word` again
/// and accept the entry only if both key loads agree and are valid.
#[repr(C)]
pub struct RegionEntry {
    /// Bits 63 (valid), 34..32 (access) and 31..0 (rkey: random:24 | slot:8); 0
    /// while the slot is empty or being rewritten.
    pub key_word: AtomicU64,
    /// Start of the region, a byte offset in the node's remote address space
    /// (page aligned).
    pub base: AtomicU64,
    /// Length of the region in bytes (whole pages).
    pub len: AtomicU64,
    /// Zero; pads the entry to 32 bytes.
    pub _reserved: u64,
}
const _: () = assert!(std::mem::size_of::<RegionEntry>() == 32);
const _: () = assert!(REGION_TABLE_OFFSET + MAX_REGIONS * 32 <= PAGE_TABLE_OFFSET);

/// Valid bit of a [`RegionEntry::key_word`].
pub const REGION_VALID: u64 = 1 << 63;
/// Shift of the access bits inside a [`RegionEntry::key_word`].
pub const REGION_ACCESS_SHIFT: u32 = 32;

impl RegionEntry {
    /// Packs a key word.
    pub const fn pack(rkey: u32, access: u64) -> u64 {
        REGION_VALID | ((access & 7) << REGION_ACCESS_SHIFT) | rkey as u64
    }

    /// Reads a consistent snapshot `(rkey, access, base, len)` or `None` if
    /// the slot is empty or changing.
    #[inline]
    pub fn snapshot(&self) -> Option<(u32, u64, u64, u64)> {
        let k1 = self.key_word.load(Ordering::Acquire);
        if k1 & REGION_VALID == 0 {
            return None;
        }
        let base = self.base.load(Ordering::Acquire);
        let len = self.len.load(Ordering::Acquire);
        let k2 = self.key_word.load(Ordering::Acquire);
        if k1 != k2 {
            return None;
        }
        Some((k1 as u32, (k1 >> REGION_ACCESS_SHIFT) & 7, base, len))
    }
}

/// One entry of the page translation table: remote page → memory page.
///
/// ```text
///  63     62 ............ 40   39 .......................... 0
/// +-----+--------------------+-------------------------------+
/// |valid| reserved (0)       | physical page index           |
/// +-----+--------------------+-------------------------------+
/// ```
///
/// An invalid entry means the remote page is not mapped: a request touching
/// it fails with a "page not mapped" error (the shm analogue of an RNIC
/// translation fault).
#[repr(transparent)]
pub struct PageEntry(pub AtomicU64);
const _: () = assert!(std::mem::size_of::<PageEntry>() == 8);

/// Valid bit of a [`PageEntry`].
pub const PAGE_VALID: u64 = 1 << 63;
/// Mask of the physical page index in a [`PageEntry`].
pub const PAGE_INDEX_MASK: u64 = (1 << 40) - 1;

impl PageEntry {
    /// Physical page index, or `None` if unmapped.
    #[inline]
    pub fn get(&self) -> Option<u64> {
        let v = self.0.load(Ordering::Acquire);
        (v & PAGE_VALID != 0).then_some(v & PAGE_INDEX_MASK)
    }
}

/// The wake-up word of one RPC worker thread of the node
/// ([`crate::rpc`]), one cache line each.
///
/// ```text
/// byte 0          4                                              64
///      +----------+----------------------------------------------+
///      | sleeping | reserved                                     |
///      +----------+----------------------------------------------+
/// ```
///
/// `sleeping` is 1 while the worker is about to block or blocked in
/// `futex(FUTEX_WAIT)` on it, 0 while it polls. A client that posts a
/// request into an idle worker's channel sees 1 and wakes it with
/// `futex(FUTEX_WAKE)` — which needs only read access, so clients use the
/// read-only control mapping they already have. Only the node writes it.
#[repr(C)]
pub struct WorkerBell {
    /// 1 while the worker blocks (or is about to), else 0.
    pub sleeping: std::sync::atomic::AtomicU32,
    /// Zero; the rest of the bell's cache line.
    pub _reserved: [u32; 15],
}
const _: () = assert!(std::mem::size_of::<WorkerBell>() == 64);
const _: () = assert!(REGION_TABLE_OFFSET + MAX_REGIONS * 32 <= WORKER_BELLS_OFFSET);
const _: () = assert!(WORKER_BELLS_OFFSET + MAX_WORKER_BELLS * 64 <= PAGE_TABLE_OFFSET);

/// Size in bytes of the control memfd for `remote_pages` pages.
pub const fn control_len(remote_pages: u64) -> usize {
    let raw = PAGE_TABLE_OFFSET + remote_pages as usize * 8;
    (raw + 4095) & !4095
}
