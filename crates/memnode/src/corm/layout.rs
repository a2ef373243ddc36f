//! The bytes of a CoRM object and of a CoRM pointer, and the pure functions
//! a one-sided reader applies to bytes it READ ([`decode`], [`scan_block`]).
//!
//! ## An object slot
//!
//! A block of one size class is cut into slots of `slot_size` bytes (a
//! multiple of 8, at 8-byte aligned offsets). A slot holds an [`ObjHeader`]
//! word, then the payload, with one *version byte* per 64-byte segment of
//! the slot (FaRM's per-cache-line versions, CoRM §3.2.3):
//!
//! ```text
//! slot offset 0        8                                   63  64              127 ... S-1
//!             +--------+-----------------------------------+---+----------------+---+   +---+
//!             | header | payload                           | v | payload        | v |...| v |
//!             +--------+-----------------------------------+---+----------------+---+   +---+
//!             segment 0 = [0, 64)                               segment 1          last segment
//!                                                                                  ends at S
//! ```
//!
//! Segment `i` is `[64·i, min(64·i + 64, S))`; its version byte is its
//! *last* byte. The payload is every other byte after the header, in
//! order: `S − 8 − ⌈S/64⌉` bytes ([`payload_capacity`]).
//!
//! ### Why the version is the segment's last byte
//!
//! dmkit's fabric promises single-copy atomicity of aligned 8-byte words
//! only (the shm backend's READ copies words in ascending order; the
//! simulator tears at 8 bytes), not FaRM's cache-line-atomic DMA. The node
//! writes an object (RPC write, allocation, the copy during compaction)
//! under the header's lock bit, in *descending* address order, and stores
//! the unlocked header with the new version last. A reader that loads words
//! in ascending order then sees the new value of a word only if it sees the
//! new value of every word above it (acquire loads, release stores): what it
//! got from a concurrent write is a suffix of the slot, and any non-empty
//! suffix holds the slot's last byte — a version byte. So a reader accepts a
//! slot only when the header is unlocked and every version byte equals the
//! header's version: a torn read always fails that check (up to an 8-bit
//! version wrap-around during one read). On an RNIC that reads whole cache
//! lines atomically in any order, the same bytes give FaRM's guarantee for
//! the classes whose slots are whole lines (segments = lines). Versions run
//! 1..=255 and never 0, so memory the node returned to the OS (zeros) never
//! passes for a valid object.
//!
//! ## The header ([`ObjHeader`], one word)
//!
//! ```text
//!  63  62                             27 26             11  10    9     8   7         0
//! +---+--------------------------------+-----------------+-----+-----+-----+-----------+
//! | 0 | home: home block's offset >> 12| object id (16)  | used| cmp | wr  | version   |
//! +---+--------------------------------+-----------------+-----+-----+-----+-----------+
//! ```
//!
//! - `version`: 1..=255 while allocated, bumped by every write; a free slot
//!   keeps its last version so the next object starts above it.
//! - `wr`, `cmp`: the two lock bits (§3.2.3): a write in progress (RPC
//!   write, free, pointer release) and an object under compaction. A
//!   one-sided reader that sees either retries.
//! - `used`: the slot holds an object (0 in a free slot, and in zeroed memory).
//! - `object id`: the block-local id (§3.1.2): random (8, 12 or 16 bits), or
//!   the slot index in offset-based classes (Mesh, "CoRM-0").
//! - `home`: the block the object was allocated in (§3.3), as the remote
//!   byte offset of that block >> 12 (blocks are at least 4 KiB, remote
//!   offsets have 48 bits).
//!
//! ## The pointer ([`ObjPtr`], 128 bits)
//!
//! ```text
//! word 0 (addr):  63      48 47                                                    0
//!                +----------+-------------------------------------------------------+
//!                | node id  | remote byte offset = home block offset + offset hint   |
//!                +----------+-------------------------------------------------------+
//! word 1 (meta):  63     56 55     48 47            32 31                            0
//!                +---------+---------+----------------+------------------------------+
//!                | gen     | class   | object id      | rkey                         |
//!                +---------+---------+----------------+------------------------------+
//! ```
//!
//! The address's block part is the object's *home block* (a pointer keeps
//! naming it after the object moved, §3.2), its in-block part the *offset
//! hint* (corrected by the RPC calls and by [`scan_block`]). `gen` is the
//! home block's incarnation: an address the node released and handed out
//! again (§3.3) has a new generation, so an old pointer to it is refused
//! (8 bits: a pointer that outlived 255 reuses of its address is not).
//! `class` is the size class, `rkey` the key of the store's read-only region.

use std::mem::size_of;

use serde::{Deserialize, Serialize};
use zerocopy::{FromBytes, Immutable, IntoBytes, KnownLayout};

/// Bytes of one version segment (a cache line).
pub const SEGMENT: usize = 64;
/// Bytes of the header at the start of every slot.
pub const HEADER_BYTES: usize = size_of::<ObjHeader>();
/// Smallest slot: header, one version byte, at least one payload byte,
/// rounded to 8.
pub const MIN_SLOT: usize = 16;
/// Granularity of the header's home field: remote offsets >> 12.
pub const HOME_SHIFT: u32 = 12;

/// An object's header word (see the module docs for the bit layout).
#[repr(transparent)]
#[derive(
    Debug, Clone, Copy, Default, PartialEq, Eq, FromBytes, IntoBytes, KnownLayout, Immutable,
)]
pub struct ObjHeader(pub u64);
const _: () = assert!(size_of::<ObjHeader>() == 8);

const VERSION_MASK: u64 = 0xFF;
/// Lock bit: a write (or free, or pointer release) is in progress.
pub const LOCK_WRITE: u64 = 1 << 8;
/// Lock bit: the object is under compaction.
pub const LOCK_COMPACT: u64 = 1 << 9;
const LOCKS: u64 = LOCK_WRITE | LOCK_COMPACT;
const USED: u64 = 1 << 10;
const ID_SHIFT: u32 = 11;
const HOME_SHIFT_IN_WORD: u32 = 27;
const HOME_MASK: u64 = (1 << 36) - 1;

impl ObjHeader {
    /// The header of an allocated, unlocked object.
    pub fn new(version: u8, id: u16, home: u64) -> Self {
        debug_assert!(version != 0, "allocated objects have versions 1..=255");
        debug_assert!(home <= HOME_MASK);
        ObjHeader(
            version as u64
                | USED
                | (id as u64) << ID_SHIFT
                | (home & HOME_MASK) << HOME_SHIFT_IN_WORD,
        )
    }

    /// The header of a free slot that last held an object of `version`.
    pub fn free(version: u8) -> Self {
        ObjHeader(version as u64)
    }

    /// The version (0 only in never-used memory).
    pub fn version(self) -> u8 {
        (self.0 & VERSION_MASK) as u8
    }

    /// Whether the slot holds an object.
    pub fn used(self) -> bool {
        self.0 & USED != 0
    }

    /// Whether either lock bit is set.
    pub fn locked(self) -> bool {
        self.0 & LOCKS != 0
    }

    /// The block-local object id.
    pub fn id(self) -> u16 {
        (self.0 >> ID_SHIFT) as u16
    }

    /// The home block (its remote byte offset >> [`HOME_SHIFT`]).
    pub fn home(self) -> u64 {
        (self.0 >> HOME_SHIFT_IN_WORD) & HOME_MASK
    }

    /// This header with lock bits `bits` set.
    pub fn with_lock(self, bits: u64) -> Self {
        ObjHeader(self.0 | (bits & LOCKS))
    }

    /// This header with both lock bits clear.
    pub fn unlocked(self) -> Self {
        ObjHeader(self.0 & !LOCKS)
    }

    /// This header with another home block.
    pub fn with_home(self, home: u64) -> Self {
        ObjHeader(
            self.0 & !(HOME_MASK << HOME_SHIFT_IN_WORD) | (home & HOME_MASK) << HOME_SHIFT_IN_WORD,
        )
    }

    /// This header with the next version.
    pub fn bumped(self) -> Self {
        ObjHeader(self.0 & !VERSION_MASK | next_version(self.version()) as u64)
    }

    /// Whether this is the unlocked-or-locked header of object `id` homed
    /// at `home`.
    pub fn is(self, e: Expect) -> bool {
        self.used() && self.id() == e.id && self.home() == e.home
    }
}

/// The version after `v`: 1..=255, never 0.
pub fn next_version(v: u8) -> u8 {
    if v == u8::MAX {
        1
    } else {
        v + 1
    }
}

/// What a reader expects to find: the object's id and home block.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Expect {
    /// Block-local object id.
    pub id: u16,
    /// Home block (remote byte offset >> [`HOME_SHIFT`]).
    pub home: u64,
}

/// Why bytes a reader got are not (yet) the object it wanted.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum ReadFault {
    /// A write overlapped the read: versions disagree. Read again.
    #[error("torn read: a write overlapped it")]
    Torn,
    /// The object is being written or compacted. Read again after a backoff.
    #[error("object locked (write or compaction in progress)")]
    Locked,
    /// Another object (or none) is at this offset: the pointer is indirect
    /// (the object moved, §3.2) or the object is gone. Correct the pointer.
    #[error("another object (or none) is at this offset")]
    WrongObject,
}

/// Number of version segments of a slot of `slot` bytes.
pub const fn segments(slot: usize) -> usize {
    slot.div_ceil(SEGMENT)
}

/// Payload bytes of a slot of `slot` bytes.
pub const fn payload_capacity(slot: usize) -> usize {
    slot - HEADER_BYTES - segments(slot)
}

/// Smallest slot (a multiple of 8) whose payload holds `len` bytes.
pub fn slot_for_payload(len: usize) -> usize {
    let mut s = (HEADER_BYTES + len + len.div_ceil(SEGMENT - 1)).next_multiple_of(8);
    s = s.max(MIN_SLOT);
    while payload_capacity(s) < len {
        s += 8;
    }
    s
}

/// The payload pieces of a slot: `(start, end)` byte ranges, ascending;
/// each is followed by its segment's version byte at `end`.
pub fn payload_pieces(slot: usize) -> impl Iterator<Item = (usize, usize)> {
    (0..segments(slot)).map(move |i| {
        let start = (i * SEGMENT).max(HEADER_BYTES);
        let end = ((i + 1) * SEGMENT).min(slot) - 1;
        (start, end)
    })
}

/// Checks bytes a reader got for the object `e` and copies its payload to
/// `out` (at most the payload's length). `slot` is the whole slot as READ
/// (its length is the class's slot size).
pub fn decode_into(slot: &[u8], e: Expect, out: &mut [u8]) -> Result<ObjHeader, ReadFault> {
    if slot.len() < MIN_SLOT || !slot.len().is_multiple_of(8) {
        return Err(ReadFault::WrongObject);
    }
    let h = ObjHeader::read_from_bytes(&slot[..HEADER_BYTES]).expect("8 bytes");
    if !h.is(e) {
        return Err(ReadFault::WrongObject);
    }
    if h.locked() {
        return Err(ReadFault::Locked);
    }
    let mut at = 0;
    for (start, end) in payload_pieces(slot.len()) {
        if slot[end] != h.version() {
            return Err(ReadFault::Torn);
        }
        let n = (end - start).min(out.len() - at);
        out[at..at + n].copy_from_slice(&slot[start..start + n]);
        at += n;
    }
    Ok(h)
}

/// [`decode_into`] returning the whole payload.
pub fn decode(slot: &[u8], e: Expect) -> Result<Vec<u8>, ReadFault> {
    let mut out = vec![0; payload_capacity(slot.len().max(MIN_SLOT))];
    decode_into(slot, e, &mut out)?;
    Ok(out)
}

/// Finds object `e` in the bytes of a whole block (CoRM's ScanRead, §3.2.2):
/// the offset of the slot whose header names it, locked or not. `None` does
/// not prove the object is gone (a scan can race with compaction); a client
/// then asks the node (an RPC read corrects the pointer authoritatively).
pub fn scan_block(block: &[u8], slot_size: usize, e: Expect) -> Option<usize> {
    if slot_size < MIN_SLOT {
        return None;
    }
    (0..block.len() / slot_size)
        .map(|k| k * slot_size)
        .find(|&off| {
            ObjHeader::read_from_bytes(&block[off..off + HEADER_BYTES]).is_ok_and(|h| h.is(e))
        })
}

/// Writes an object's bytes into a slot image: payload `data` (zero-padded
/// to the capacity), every version byte = `h.version()`, then the header.
/// The node stores such images word by word in descending order.
pub fn encode(slot: &mut [u8], h: ObjHeader, data: &[u8]) {
    let mut at = 0;
    for (start, end) in payload_pieces(slot.len()) {
        let n = (end - start).min(data.len().saturating_sub(at));
        slot[start..start + n].copy_from_slice(&data[at..at + n]);
        slot[start + n..end].fill(0);
        slot[end] = h.version();
        at += n;
    }
    slot[..HEADER_BYTES].copy_from_slice(h.as_bytes());
}

/// A 128-bit CoRM object pointer (see the module docs for the bit layout).
#[repr(C)]
#[derive(
    Debug,
    Clone,
    Copy,
    Default,
    PartialEq,
    Eq,
    Hash,
    FromBytes,
    IntoBytes,
    KnownLayout,
    Immutable,
    Serialize,
    Deserialize,
)]
pub struct ObjPtr {
    /// Node id (16) | remote byte offset (48).
    pub addr: u64,
    /// Generation (8) | class (8) | object id (16) | rkey (32).
    pub meta: u64,
}
const _: () = assert!(size_of::<ObjPtr>() == 16);

const OFFSET_MASK: u64 = (1 << 48) - 1;

impl ObjPtr {
    /// Packs a pointer.
    pub fn new(node: u16, offset: u64, rkey: u32, id: u16, class: u8, gen: u8) -> Self {
        debug_assert!(offset <= OFFSET_MASK);
        ObjPtr {
            addr: (node as u64) << 48 | (offset & OFFSET_MASK),
            meta: (gen as u64) << 56 | (class as u64) << 48 | (id as u64) << 32 | rkey as u64,
        }
    }

    /// The memory node.
    pub fn node(&self) -> u16 {
        (self.addr >> 48) as u16
    }

    /// The remote byte offset the pointer names (home block + offset hint).
    pub fn offset(&self) -> u64 {
        self.addr & OFFSET_MASK
    }

    /// The key of the store's region.
    pub fn rkey(&self) -> u32 {
        self.meta as u32
    }

    /// The block-local object id.
    pub fn id(&self) -> u16 {
        (self.meta >> 32) as u16
    }

    /// The size class.
    pub fn class(&self) -> u8 {
        (self.meta >> 48) as u8
    }

    /// The home block's generation.
    pub fn gen(&self) -> u8 {
        (self.meta >> 56) as u8
    }

    /// The home block's remote byte offset, for blocks of `block_size` bytes.
    pub fn home_block(&self, block_size: u64) -> u64 {
        self.offset() & !(block_size - 1)
    }

    /// The offset hint: where in its block the object is expected.
    pub fn offset_hint(&self, block_size: u64) -> u64 {
        self.offset() & (block_size - 1)
    }

    /// This pointer with another offset hint (a corrected pointer, §3.2).
    pub fn with_offset_hint(&self, block_size: u64, hint: u64) -> Self {
        debug_assert!(hint < block_size);
        ObjPtr {
            addr: self.addr & !(block_size - 1) | hint,
            meta: self.meta,
        }
    }

    /// What a reader of this pointer expects in the header.
    pub fn expect(&self, block_size: u64) -> Expect {
        Expect {
            id: self.id(),
            home: self.home_block(block_size) >> HOME_SHIFT,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn image(slot: usize, h: ObjHeader, data: &[u8]) -> Vec<u8> {
        let mut s = vec![0xAA; slot];
        encode(&mut s, h, data);
        s
    }

    #[test]
    fn header_round_trips_every_field() {
        let h = ObjHeader::new(200, 0xBEEF, (1 << 36) - 1);
        assert_eq!(h.version(), 200);
        assert_eq!(h.id(), 0xBEEF);
        assert_eq!(h.home(), (1 << 36) - 1);
        assert!(h.used() && !h.locked());
        assert_eq!(h.0 >> 63, 0, "bit 63 stays clear");
        let l = h.with_lock(LOCK_COMPACT);
        assert!(l.locked() && l.id() == 0xBEEF && l.unlocked() == h);
        assert_eq!(h.with_home(7).home(), 7);
        assert_eq!(h.with_home(7).id(), 0xBEEF);
        assert_eq!(h.bumped().version(), 201);
        assert_eq!(
            ObjHeader::new(255, 1, 1).bumped().version(),
            1,
            "0 is skipped"
        );
        let f = ObjHeader::free(9);
        assert!(!f.used() && f.version() == 9);
        let bytes = h.as_bytes();
        assert_eq!(ObjHeader::read_from_bytes(bytes).unwrap(), h);
    }

    #[test]
    fn pointer_round_trips_every_field() {
        let p = ObjPtr::new(0xABCD, (1 << 48) - 4096 + 80, 0xDEAD_BEEF, 0x1234, 77, 250);
        assert_eq!(p.node(), 0xABCD);
        assert_eq!(p.offset(), (1 << 48) - 4096 + 80);
        assert_eq!(p.rkey(), 0xDEAD_BEEF);
        assert_eq!(p.id(), 0x1234);
        assert_eq!(p.class(), 77);
        assert_eq!(p.gen(), 250);
        assert_eq!(p.home_block(4096), (1 << 48) - 4096);
        assert_eq!(p.offset_hint(4096), 80);
        let q = p.with_offset_hint(4096, 160);
        assert_eq!((q.offset_hint(4096), q.id(), q.gen()), (160, 0x1234, 250));
        let bytes = p.as_bytes().to_vec();
        assert_eq!(bytes.len(), 16);
        assert_eq!(ObjPtr::read_from_bytes(&bytes).unwrap(), p);
        assert_eq!(p.expect(4096).home, ((1 << 48) - 4096) >> 12);
    }

    #[test]
    fn geometry_counts_one_version_per_segment() {
        assert_eq!(payload_capacity(16), 7);
        assert_eq!(payload_capacity(64), 55);
        assert_eq!(payload_capacity(72), 62);
        assert_eq!(payload_capacity(128), 118);
        for len in 1..3000 {
            let s = slot_for_payload(len);
            assert!(payload_capacity(s) >= len && s.is_multiple_of(8) && s >= MIN_SLOT);
            assert!(
                s == MIN_SLOT || payload_capacity(s - 8) < len,
                "minimal for {len}"
            );
        }
        let pieces: Vec<_> = payload_pieces(136).collect();
        assert_eq!(pieces, vec![(8, 63), (64, 127), (128, 135)]);
    }

    #[test]
    fn decode_round_trips_and_sees_the_slot_length() {
        let e = Expect { id: 5, home: 9 };
        for slot in [16, 64, 72, 136, 2104] {
            let cap = payload_capacity(slot);
            let data: Vec<u8> = (0..cap).map(|i| (i * 7 + 1) as u8).collect();
            let img = image(slot, ObjHeader::new(3, 5, 9), &data);
            assert_eq!(decode(&img, e).unwrap(), data, "slot {slot}");
            // Shorter data is zero padded.
            let img = image(slot, ObjHeader::new(3, 5, 9), &data[..cap / 2]);
            let back = decode(&img, e).unwrap();
            assert_eq!(&back[..cap / 2], &data[..cap / 2]);
            assert!(back[cap / 2..].iter().all(|&b| b == 0));
        }
    }

    #[test]
    fn a_torn_segment_a_lock_and_another_object_are_seen() {
        let e = Expect { id: 5, home: 9 };
        let data = vec![0x55; payload_capacity(200)];
        let img = image(200, ObjHeader::new(3, 5, 9), &data);
        // A write that got as far as the last segment (a suffix): torn.
        let mut torn = img.clone();
        *torn.last_mut().unwrap() = 4;
        assert_eq!(decode(&torn, e), Err(ReadFault::Torn));
        // Any one segment's version differing is torn.
        for (_, end) in payload_pieces(200) {
            let mut t = img.clone();
            t[end] = 4;
            assert_eq!(decode(&t, e), Err(ReadFault::Torn));
        }
        for bit in [LOCK_WRITE, LOCK_COMPACT] {
            let mut l = img.clone();
            l[..8].copy_from_slice(ObjHeader::new(3, 5, 9).with_lock(bit).as_bytes());
            assert_eq!(decode(&l, e), Err(ReadFault::Locked));
        }
        assert_eq!(
            decode(&img, Expect { id: 6, home: 9 }),
            Err(ReadFault::WrongObject)
        );
        assert_eq!(
            decode(&img, Expect { id: 5, home: 8 }),
            Err(ReadFault::WrongObject)
        );
        // Zeroed memory (a discarded page) and a free slot are nobody.
        assert_eq!(decode(&[0; 200], e), Err(ReadFault::WrongObject));
        let mut f = img.clone();
        f[..8].copy_from_slice(ObjHeader::free(3).as_bytes());
        assert_eq!(decode(&f, e), Err(ReadFault::WrongObject));
    }

    #[test]
    fn scan_finds_by_id_and_home_not_offset() {
        let slot = 96;
        let mut block = vec![0u8; 4096];
        for (k, id) in [(3usize, 40u16), (7, 41), (20, 42)] {
            let img = image(slot, ObjHeader::new(1, id, 77), &[id as u8]);
            block[k * slot..(k + 1) * slot].copy_from_slice(&img);
        }
        let e = |id| Expect { id, home: 77 };
        assert_eq!(scan_block(&block, slot, e(41)), Some(7 * slot));
        assert_eq!(scan_block(&block, slot, e(42)), Some(20 * slot));
        assert_eq!(scan_block(&block, slot, e(43)), None);
        assert_eq!(scan_block(&block, slot, Expect { id: 41, home: 78 }), None);
        assert_eq!(scan_block(&block, 8, e(41)), None);
    }
}
