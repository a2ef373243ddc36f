//! Remote layouts of the table (all little-endian words on the memory node).
//!
//! ## Directory (node 0, one per table)
//! ```text
//!  0        8              16     24          32       40     48      56     64
//!  +--------+--------------+------+-----------+--------+------+-------+------+
//!  | magic  | global depth | lock | max depth | groups | seed | nodes |limits|  DirHeader
//!  +--------+--------------+------+-----------+--------+------+-------+------+
//!  | entry[0] | entry[1] | ... | entry[2^max_depth - 1]                       8 B each
//!
//!  entry:  63      56 55          48 47                                        0
//!          +---------+--------------+------------------------------------------+
//!          | depth 8 |      0       |  subtable pointer (Ptr48)                |
//!          +---------+--------------+------------------------------------------+
//! ```
//! Entry `i` (for `i < 2^global_depth`) names the subtable that holds keys
//! whose hash ends in the low `global_depth` bits of `i` (extendible
//! hashing, suffix-indexed as RACE does).
//!
//! ## Subtable
//! ```text
//!  +------------------+  SubtableHeader, 64 B: magic, depth, suffix, split lock, groups
//!  | insert locks     |  2·groups words: one per combined bucket (keys' first choice)
//!  +------------------+
//!  | group 0          |  192 B = [ main bucket 0 | overflow bucket | main bucket 1 ]
//!  | group 1          |          combined bucket 2g   = main 0 + overflow (128 B)
//!  | ...              |          combined bucket 2g+1 = overflow + main 1 (128 B)
//!  +------------------+
//!
//!  bucket (64 B):  | header | slot 0 | slot 1 | ... | slot 6 |
//!  bucket header:  63      56 55                                      0
//!                  +---------+----------------------------------------+
//!                  | depth 8 |  suffix (low `depth` bits of the hash) |
//!                  +---------+----------------------------------------+
//! ```
//! Every bucket carries its subtable's depth and suffix, so a reader whose
//! cached directory is stale notices it from the very READ that fetched the
//! bucket (RACE's resizing check).
//!
//! ## Slot (8 B, updated only by CAS)
//! ```text
//!  63          56 55  54        48 47       40 39                          0
//!  +-------------+---+-------------+----------+----------------------------+
//!  | fingerprint | M | len (64 B)  | node 8   | block offset / 64 (40)     |
//!  +-------------+---+-------------+----------+----------------------------+
//! ```
//! 0 is an empty slot. `len` is the key-value block's size in 64-byte units
//! (1..=127). `M` ("moved") freezes a slot whose key a split copied to the
//! new subtable: nobody may change a frozen slot, and its key is looked up
//! again through the directory.
//!
//! ## Key-value block (out of place, 64-byte aligned, written once)
//! ```text
//!  0          2          4          8           16
//!  +----------+----------+----------+-----------+-----------+-------------+
//!  | key len  |  (0)     | value len| checksum  | key bytes | value bytes |  zero padded
//!  +----------+----------+----------+-----------+-----------+-------------+
//! ```
//! The checksum covers the lengths, key and value; a torn or recycled block
//! fails it (or fails the key comparison) and the reader retries.
//!
//! ## Multi-version block (tables with `cold_versions` K ≥ 2; updated in place)
//! The memory-semantics study's cold entries (§IV-B "Atomic operation"): a
//! writer takes a version number with one FAA on the block's counter and
//! WRITEs the value into slot `version mod K`. Every block of such a table
//! has this form (the FAA's offset must not depend on whose block a
//! fingerprint match turns out to be).
//! ```text
//!  0          2      3      4          8          16         24
//!  +----------+------+------+----------+----------+----------+-----------------+
//!  | key len  |  K   | 0|MV | val cap  | counter  | checksum | key bytes (pad 8)|  MvBlockHeader + key
//!  +----------+------+------+----------+----------+----------+-----------------+
//!  | commit 0 | commit 1 | ... | commit K-1 |                                      8 B each
//!  +----------+----------+-----+------------+
//!  | slot 0 | slot 1 | ... | slot K-1 |                 zero padded to 64 B
//!
//!  lens (word 0): key_len:16 | K:8 | 0:7 | MV:1 (bit 31) | value_cap:32
//!  counter: the next version (FAA); K at creation, whose slots hold versions 0..K-1
//!  checksum: covers lens and key (both written once)
//!  commit i: the newest version whose WRITE of slot i has landed in full
//!            (i at creation); written by that version's writer in its own
//!            8-byte WRITE posted right after the slot's, so queue-pair
//!            order lands it after every word of the slot
//!
//!  slot (16 B + value_cap padded to 8):
//!  0          8          10                    16
//!  +----------+----------+---------------------+-------------------------+
//!  | version  | value len| checksum (48 bits)  | value bytes (pad 8)     |  MvSlotHead + value
//!  +----------+----------+---------------------+-------------------------+
//!  checksum: covers version, length and value
//! ```
//! Header, key and commit words are the block's *prefix*: all a writer
//! READs in its FAA's batch (64 bytes for an 8-byte key and K = 4, against
//! the whole block, six 64-byte units with 64-byte values). A writer of
//! version `v` writes slot `v mod K` only once that slot's commit word says
//! `v − K`, so each slot's versions land one at a time and in order.
//!
//! Readers read the whole block and ignore the commit words: a slot is
//! *complete* when its checksum matches, and the block's value is the
//! complete slot with the highest version. A slot whose checksum fails is
//! being written (or torn by a fault): its version word (atomic, 8 B) is
//! either the old or the new version, and a reader may pass it over only if
//! a complete slot holds a higher version than that word; otherwise the
//! block counts as torn and the reader reads it again (see
//! `dmkit_race::table`'s "Multi-version cold entries").

use dmkit_fabric::GlobalAddr;
use dmkit_index::Magic;
use zerocopy::{FromBytes, Immutable, IntoBytes, KnownLayout};

/// Words of a bucket after its header.
pub const SLOTS_PER_BUCKET: usize = 7;
/// Bytes of a bucket.
pub const BUCKET_BYTES: u64 = 64;
/// Bytes of a bucket group (three buckets).
pub const GROUP_BYTES: u64 = 192;
/// Bytes of a combined bucket (two adjacent buckets).
pub const COMB_BYTES: u64 = 128;
/// Largest key-value block: 127 units of 64 B.
pub const MAX_BLOCK: usize = 127 * 64;
/// Largest supported `max_depth` (the suffix must stay below the hash bits
/// used for the fingerprint and bucket index).
pub const MAX_DEPTH_LIMIT: u32 = 20;

/// The directory's magic: kind and layout version (see
/// [`dmkit_index::Magic`]).
pub const DIR_MAGIC: Magic = Magic::new(b"dmRACE", 2);
/// A subtable's magic.
pub const SUBTABLE_MAGIC: u64 = u64::from_le_bytes(*b"RACESUB1");

/// Header of a table's directory.
#[repr(C)]
#[derive(
    Debug, Clone, Copy, Default, PartialEq, Eq, FromBytes, IntoBytes, KnownLayout, Immutable,
)]
pub struct DirHeader {
    /// [`DIR_MAGIC`]'s word: kind tag "dmRACE" and layout version 2.
    pub magic: u64,
    /// Low hash bits that index the directory now: entries `0..2^global_depth`
    /// are live. Grows by one when a subtable at this depth splits (RACE,
    /// USENIX ATC'21; extendible hashing).
    pub global_depth: u64,
    /// Held (nonzero) while a split publishes into the directory.
    pub lock: u64,
    /// Deepest a suffix can get: the directory has room for 2^max_depth
    /// entries, at most 2^[`MAX_DEPTH_LIMIT`].
    pub max_depth: u64,
    /// Bucket groups per subtable.
    pub groups: u64,
    /// Seed of the key hash [`KeyHash::of`]; fixed at creation so every client
    /// hashes alike.
    pub seed: u64,
    /// Memory nodes the table was created on (informational).
    pub nodes: u64,
    /// max_key:16 | cold_versions:8 | mv_layout:8 | max_value:32 — limits
    /// every client enforces (cold_versions 0: plain blocks; tables made
    /// before the field read as 0). mv_layout: [`MV_LAYOUT`] when
    /// cold_versions > 0, else 0 (0 with cold_versions > 0: layout 1).
    pub limits: u64,
}
const _: () = assert!(std::mem::size_of::<DirHeader>() == 64);

/// Byte offsets inside [`DirHeader`].
pub const DIR_GLOBAL_DEPTH: u64 = std::mem::offset_of!(DirHeader, global_depth) as u64;
/// Byte offset of [`DirHeader::lock`], the word a split takes (CAS 0 → owner)
/// while it publishes into the directory.
pub const DIR_LOCK: u64 = std::mem::offset_of!(DirHeader, lock) as u64;
/// Directory entries start right after the header.
pub const DIR_ENTRIES: u64 = std::mem::size_of::<DirHeader>() as u64;

/// Header of a subtable.
///
/// ```text
///  0       8       16       24           32       40           48        64
///  +-------+-------+--------+------------+--------+------------+---------+
///  | magic | depth | suffix | split lock | groups | split      | (0, 0)  |
///  +-------+-------+--------+------------+--------+------------+---------+
///  split lock: a lease lock word (owner 16 | deadline µs 48), 0 = free
///  split: the split in progress, for whoever must finish it if its
///         splitter dies ([`SplitRecord`]); 0 = none
/// ```
#[repr(C)]
#[derive(
    Debug, Clone, Copy, Default, PartialEq, Eq, FromBytes, IntoBytes, KnownLayout, Immutable,
)]
pub struct SubtableHeader {
    /// [`SUBTABLE_MAGIC`] ("RACESUB1").
    pub magic: u64,
    /// Local depth: how many low hash bits all of this subtable's keys share.
    pub depth: u64,
    /// Those `depth` low bits of the hash, the subtable's suffix.
    pub suffix: u64,
    /// Held (nonzero) while the subtable splits; inserters back off.
    pub split_lock: u64,
    /// Bucket groups in the subtable (each 192 bytes: two combined buckets).
    pub groups: u64,
    /// The split in progress ([`SplitRecord`]), 0 = none.
    pub split: u64,
    /// Zero; pads the header to 64 bytes.
    pub _reserved: [u64; 2],
}
const _: () = assert!(std::mem::size_of::<SubtableHeader>() == 64);

/// Byte offset of [`SubtableHeader::depth`] in a subtable.
pub const SUB_DEPTH: u64 = std::mem::offset_of!(SubtableHeader, depth) as u64;
/// Byte offset of [`SubtableHeader::split_lock`] in a subtable.
pub const SUB_SPLIT_LOCK: u64 = std::mem::offset_of!(SubtableHeader, split_lock) as u64;
/// Byte offset of [`SubtableHeader::split`] in a subtable.
pub const SUB_SPLIT: u64 = std::mem::offset_of!(SubtableHeader, split) as u64;

/// How far a split got, kept in its old subtable's header so that whoever
/// breaks the split lock of a splitter that died finishes the split.
///
/// ```text
///  63       56 55    48 47                                           0
///  +----------+--------+---------------------------------------------+
///  | depth+1  | phase  |  the new subtable (Ptr48)                   |
///  +----------+--------+---------------------------------------------+
/// ```
/// The top byte and the pointer are the new subtable's directory entry.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SplitRecord(pub u64);

/// The phases of a split, in order (a split record's phase field).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
#[repr(u8)]
pub enum SplitPhase {
    /// The new subtable is initialised; movers are being frozen and
    /// copied, headers flipped. Nobody can reach the new subtable yet:
    /// all of it may be redone.
    Copying = 1,
    /// Copied and flipped; the directory is being published. The new
    /// subtable may be reachable through some entries: nothing may be
    /// copied into it again.
    Publishing = 2,
    /// Published; the frozen originals are being cleared.
    Clearing = 3,
}

impl SplitRecord {
    /// The record of a split into `new_entry` (the new subtable's
    /// directory entry) at `phase`.
    pub fn new(new_entry: u64, phase: SplitPhase) -> SplitRecord {
        SplitRecord(new_entry & !(0xFF << 48) | (phase as u64) << 48)
    }
    /// The new subtable's directory entry.
    pub fn new_entry(self) -> u64 {
        self.0 & !(0xFF << 48)
    }
    /// The split's phase (`None`: no split, or garbage).
    pub fn phase(self) -> Option<SplitPhase> {
        match (self.0 >> 48) as u8 {
            1 => Some(SplitPhase::Copying),
            2 => Some(SplitPhase::Publishing),
            3 => Some(SplitPhase::Clearing),
            _ => None,
        }
    }
    /// The depth of the subtable before the split.
    pub fn depth(self) -> u32 {
        ((self.0 >> 56) as u32).saturating_sub(1)
    }
}
/// Insert locks start right after the header.
pub const SUB_LOCKS: u64 = std::mem::size_of::<SubtableHeader>() as u64;

/// The two buckets of a combined bucket, as one READ fetches them.
pub type CombinedBucket = [Bucket; 2];
const _: () = assert!(std::mem::size_of::<CombinedBucket>() as u64 == COMB_BYTES);

/// One bucket.
#[repr(C)]
#[derive(
    Debug, Clone, Copy, Default, PartialEq, Eq, FromBytes, IntoBytes, KnownLayout, Immutable,
)]
pub struct Bucket {
    /// depth:8 | suffix:56 of the subtable ([`bucket_header`]), so a reader
    /// with a stale directory notices it from the bucket it read.
    pub header: u64,
    /// Slot words: 0 when empty, else a [`Slot`] (fingerprint | moved | length
    /// in 64-byte units | ptr48 of the key-value block).
    pub slots: [u64; SLOTS_PER_BUCKET],
}
const _: () = assert!(std::mem::size_of::<Bucket>() as u64 == BUCKET_BYTES);

/// Offset of the first slot in a bucket.
pub const BUCKET_SLOTS: usize = std::mem::offset_of!(Bucket, slots);

/// Main bucket 0, the shared overflow bucket, main bucket 1.
#[repr(C)]
#[derive(
    Debug, Clone, Copy, Default, PartialEq, Eq, FromBytes, IntoBytes, KnownLayout, Immutable,
)]
pub struct BucketGroup {
    /// Main bucket 0, the overflow bucket the two main buckets share, main
    /// bucket 1.
    pub buckets: [Bucket; 3],
}
const _: () = assert!(std::mem::size_of::<BucketGroup>() as u64 == GROUP_BYTES);

/// Header of a key-value block.
#[repr(C)]
#[derive(
    Debug, Clone, Copy, Default, PartialEq, Eq, FromBytes, IntoBytes, KnownLayout, Immutable,
)]
pub struct BlockHeader {
    /// key_len:16 | 0:16 | value_len:32
    pub lens: u64,
    /// Hash of the lengths, key and value; a torn or recycled block fails it.
    pub checksum: u64,
}
const _: () = assert!(std::mem::size_of::<BlockHeader>() == 16);
/// Bytes of a block header.
pub const BLOCK_HEADER: usize = std::mem::size_of::<BlockHeader>();

impl BlockHeader {
    /// key_len:16 | 0:16 | value_len:32.
    pub fn lens_of(key: usize, value: usize) -> u64 {
        key as u64 | (value as u64) << 32
    }
    /// The key's length (0 in a block that was never written).
    pub fn key_len(&self) -> usize {
        (self.lens & 0xFFFF) as usize
    }
    /// The value's length.
    pub fn value_len(&self) -> usize {
        (self.lens >> 32) as usize
    }
    /// Whether the reserved bits are clear.
    pub fn well_formed(&self) -> bool {
        self.lens & 0xFFFF_0000 == 0
    }
}

/// Geometry of a subtable with `groups` bucket groups.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Geometry {
    /// Bucket groups of the subtable.
    pub groups: u64,
}

impl Geometry {
    /// Combined buckets (two per group).
    pub fn combs(&self) -> u64 {
        2 * self.groups
    }

    /// Offset of the first group.
    pub fn groups_at(&self) -> u64 {
        (SUB_LOCKS + 8 * self.combs()).next_multiple_of(64)
    }

    /// Bytes of a whole subtable.
    pub fn bytes(&self) -> u64 {
        self.groups_at() + GROUP_BYTES * self.groups
    }

    /// Offset of combined bucket `c`.
    pub fn comb_at(&self, c: u64) -> u64 {
        self.groups_at() + (c / 2) * GROUP_BYTES + (c % 2) * BUCKET_BYTES
    }

    /// Offset of the insert lock of combined bucket `c`.
    pub fn lock_at(&self, c: u64) -> u64 {
        SUB_LOCKS + 8 * c
    }
}

/// The slot's "moved" flag.
pub const MOVED: u64 = 1 << 55;

/// Packs a 64-byte-aligned block address into 48 bits
/// ([`GlobalAddr::to_ptr48`]).
pub fn ptr48(a: GlobalAddr) -> Option<u64> {
    a.to_ptr48()
}

/// Unpacks [`ptr48`].
pub fn unptr48(p: u64) -> GlobalAddr {
    GlobalAddr::from_ptr48(p)
}

/// A decoded slot word.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Slot(pub u64);

impl Slot {
    /// A slot for a block of `units`·64 bytes at `block`.
    pub fn new(fp: u8, units: u64, block: GlobalAddr) -> Option<Slot> {
        ((1..=127).contains(&units)).then_some(())?;
        Some(Slot((fp as u64) << 56 | units << 48 | ptr48(block)?))
    }
    /// Whether the slot word is 0 (free).
    pub fn is_empty(self) -> bool {
        self.0 == 0
    }
    /// The 8-bit fingerprint (bits 63..56), compared before a block is read.
    pub fn fp(self) -> u8 {
        (self.0 >> 56) as u8
    }
    /// Whether the "moved" bit (55) is set: a split copied the key and the slot
    /// is frozen.
    pub fn moved(self) -> bool {
        self.0 & MOVED != 0
    }
    /// The block's size in 64-byte units (bits 54..48), 1..=127.
    pub fn units(self) -> u64 {
        (self.0 >> 48) & 0x7F
    }
    /// The key-value block's address (bits 47..0, a ptr48).
    pub fn block(self) -> GlobalAddr {
        unptr48(self.0)
    }
    /// The block's size in bytes (`units · 64`), what one READ of it fetches.
    pub fn block_bytes(self) -> usize {
        self.units() as usize * 64
    }
    /// The same slot with the "moved" bit set.
    pub fn frozen(self) -> Slot {
        Slot(self.0 | MOVED)
    }
    /// The same slot with the "moved" bit clear.
    pub fn thawed(self) -> Slot {
        Slot(self.0 & !MOVED)
    }
}

/// Bucket header word for a subtable of `depth` and `suffix`.
pub fn bucket_header(depth: u32, suffix: u64) -> u64 {
    (depth as u64) << 56 | suffix
}

/// Whether a bucket header covers a key with hash `h1`.
pub fn header_covers(header: u64, h1: u64) -> bool {
    let depth = (header >> 56) as u32;
    let suffix = header & ((1 << 56) - 1);
    depth <= MAX_DEPTH_LIMIT && h1 & mask(depth) == suffix
}

/// Directory entry for a subtable of `depth` at `addr`.
pub fn dir_entry(depth: u32, addr: GlobalAddr) -> Option<u64> {
    Some((depth as u64) << 56 | ptr48(addr)?)
}

/// Low-`bits` mask.
pub fn mask(bits: u32) -> u64 {
    if bits >= 64 {
        u64::MAX
    } else {
        (1u64 << bits) - 1
    }
}

/// The hashes of a key.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct KeyHash {
    /// Suffix bits (directory) and fingerprint come from here.
    pub h1: u64,
    /// Second hash: picks the second candidate combined bucket.
    pub h2: u64,
}

impl KeyHash {
    /// Both hashes of `key` under the table's seed ([`DirHeader::seed`]).
    pub fn of(key: &[u8], seed: u64) -> Self {
        Self {
            h1: hash64(key, seed),
            h2: hash64(key, seed ^ 0x5bd1_e995_1234_5678),
        }
    }

    /// The 8-bit fingerprint (bits 31..24 of `h1`), stored in the slot.
    pub fn fp(&self) -> u8 {
        (self.h1 >> 24) as u8
    }

    /// The two candidate combined buckets (distinct when `combs > 1`).
    pub fn combs(&self, g: Geometry) -> (u64, u64) {
        let n = g.combs();
        let c1 = (self.h1 >> 32) % n;
        let mut c2 = (self.h2 >> 32) % n;
        if c2 == c1 && n > 1 {
            c2 = c1 ^ 1;
        }
        (c1, c2)
    }
}

pub use dmkit_runtime::hash::hash64;

const CHECKSUM_SEED: u64 = 0xC0FF_EE00_D15E_A5E5;

/// Size of the block holding `key` and `value`, rounded to 64 bytes.
pub fn block_bytes(key: usize, value: usize) -> usize {
    (BLOCK_HEADER + key + value).next_multiple_of(64)
}

/// Encodes a block into `out` (resized to the block's size).
pub fn encode_block(key: &[u8], value: &[u8], out: &mut Vec<u8>) {
    out.clear();
    out.resize(block_bytes(key.len(), value.len()), 0);
    let lens = BlockHeader::lens_of(key.len(), value.len());
    let head = BlockHeader {
        lens,
        checksum: block_checksum(lens, key, value),
    };
    let (h, body) = out.split_at_mut(BLOCK_HEADER);
    h.copy_from_slice(head.as_bytes());
    body[..key.len()].copy_from_slice(key);
    body[key.len()..key.len() + value.len()].copy_from_slice(value);
}

fn block_checksum(lens: u64, key: &[u8], value: &[u8]) -> u64 {
    hash64(value, hash64(key, CHECKSUM_SEED ^ lens))
}

/// Decodes a block read into `b` (either form; a multi-version block
/// gives its newest complete value); `None` when torn, recycled or garbage.
pub fn decode_block(b: &[u8]) -> Option<(&[u8], &[u8])> {
    let (head, body) = BlockHeader::read_from_prefix(b).ok()?;
    if head.lens & MV_FLAG != 0 {
        return decode_mv_block(b).map(|(k, _, v)| (k, v));
    }
    let (k, v) = (head.key_len(), head.value_len());
    if !head.well_formed() || k == 0 || k.checked_add(v)? > body.len() {
        return None;
    }
    let (key, value) = (&body[..k], &body[k..k + v]);
    (block_checksum(head.lens, key, value) == head.checksum).then_some((key, value))
}

/// The key of a block prefix (no checksum check: used by splits on blocks
/// that a live slot references, whose keys are immutable).
pub fn block_key(b: &[u8]) -> Option<&[u8]> {
    let (head, body) = BlockHeader::read_from_prefix(b).ok()?;
    let k = head.key_len();
    let body = if head.lens & MV_FLAG != 0 {
        b.get(MV_HEADER..)?
    } else {
        body
    };
    (k > 0 && k <= body.len()).then(|| &body[..k])
}

/// Bit of a block's `lens` word marking a multi-version block.
pub const MV_FLAG: u64 = 1 << 31;
/// Most versions a multi-version block keeps.
pub const MAX_VERSIONS: u32 = 16;

/// Header of a multi-version block (see the module doc's drawing).
#[repr(C)]
#[derive(
    Debug, Clone, Copy, Default, PartialEq, Eq, FromBytes, IntoBytes, KnownLayout, Immutable,
)]
pub struct MvBlockHeader {
    /// key_len:16 | K:8 | 0:7 | MV:1 | value_cap:32
    pub lens: u64,
    /// The next version number (the writers' FAA word).
    pub counter: u64,
    /// Hash of `lens` and the key.
    pub checksum: u64,
}
const _: () = assert!(std::mem::size_of::<MvBlockHeader>() == 24);
/// Bytes of a multi-version block header.
pub const MV_HEADER: usize = std::mem::size_of::<MvBlockHeader>();
/// Offset of the version counter in a multi-version block.
pub const MV_COUNTER: u64 = std::mem::offset_of!(MvBlockHeader, counter) as u64;

/// Layout version of multi-version blocks, kept in the directory's limits
/// word (tables made before it was recorded read as 1: no commit words,
/// 24-byte slot heads).
pub const MV_LAYOUT: u64 = 2;

/// Head of a multi-version slot (see the module doc's drawing).
#[repr(C)]
#[derive(
    Debug, Clone, Copy, Default, PartialEq, Eq, FromBytes, IntoBytes, KnownLayout, Immutable,
)]
pub struct MvSlotHead {
    /// The version this slot holds.
    pub version: u64,
    /// value_len:16 | checksum:48 — the checksum (the low 48 bits of a hash
    /// of version, length and value) shifted above the length.
    pub len_sum: u64,
}
const _: () = assert!(std::mem::size_of::<MvSlotHead>() == 16);
/// Bytes of a multi-version slot head.
pub const MV_SLOT_HEAD: usize = std::mem::size_of::<MvSlotHead>();
/// Bytes of a commit word.
pub const MV_COMMIT: usize = 8;

impl MvSlotHead {
    /// The value's length in bytes.
    pub fn len(&self) -> usize {
        (self.len_sum & 0xFFFF) as usize
    }
    /// Whether the head says the value is empty.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
    /// The stored checksum (48 bits).
    pub fn checksum(&self) -> u64 {
        self.len_sum >> 16
    }
}

/// The shape of a table's multi-version blocks: versions kept (K) and the
/// value capacity of each slot.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MvShape {
    /// Slots (versions kept), 2..=[`MAX_VERSIONS`].
    pub versions: u32,
    /// Largest value a slot holds (the table's `max_value`, below 64 KiB).
    pub value_cap: usize,
}

impl MvShape {
    /// Bytes of one slot.
    pub fn slot_bytes(&self) -> usize {
        MV_SLOT_HEAD + self.value_cap.next_multiple_of(8)
    }
    /// Offset of commit word `i` in the block of a `key_len`-byte key.
    pub fn commit_at(&self, key_len: usize, i: u32) -> usize {
        assert!(i < self.versions, "commit word {i} of {}", self.versions);
        MV_HEADER + key_len.next_multiple_of(8) + i as usize * MV_COMMIT
    }
    /// Bytes of the block's prefix — header, key and commit words — what a
    /// writer READs in its FAA's batch.
    pub fn prefix_bytes(&self, key_len: usize) -> usize {
        MV_HEADER + key_len.next_multiple_of(8) + self.versions as usize * MV_COMMIT
    }
    /// Offset of slot `i` in the block of a `key_len`-byte key.
    pub fn slot_at(&self, key_len: usize, i: u32) -> usize {
        assert!(i < self.versions, "slot {i} of {}", self.versions);
        self.prefix_bytes(key_len) + i as usize * self.slot_bytes()
    }
    /// Bytes of the block of a `key_len`-byte key, rounded to 64.
    pub fn block_bytes(&self, key_len: usize) -> usize {
        self.prefix_bytes(key_len)
            .saturating_add(self.versions as usize * self.slot_bytes())
            .next_multiple_of(64)
    }
    /// The lengths word (`MvBlockHeader::lens`) of the block of a
    /// `key_len`-byte key.
    pub fn lens(&self, key_len: usize) -> u64 {
        key_len as u64 | (self.versions as u64) << 16 | MV_FLAG | (self.value_cap as u64) << 32
    }
}

fn mv_key_checksum(lens: u64, key: &[u8]) -> u64 {
    hash64(key, CHECKSUM_SEED ^ lens ^ 0x4D56)
}

fn mv_slot_checksum(version: u64, value: &[u8]) -> u64 {
    hash64(
        value,
        CHECKSUM_SEED ^ version.rotate_left(17) ^ value.len() as u64,
    ) >> 16
}

/// Encodes slot `version` holding `value` into `out` (resized to a slot).
pub fn encode_mv_slot(shape: MvShape, version: u64, value: &[u8], out: &mut Vec<u8>) {
    assert!(value.len() <= shape.value_cap, "value exceeds the slot");
    assert!(
        value.len() <= 0xFFFF,
        "a slot's value fits 16 bits of length"
    );
    out.clear();
    out.resize(shape.slot_bytes(), 0);
    let head = MvSlotHead {
        version,
        len_sum: value.len() as u64 | mv_slot_checksum(version, value) << 16,
    };
    out[..MV_SLOT_HEAD].copy_from_slice(head.as_bytes());
    out[MV_SLOT_HEAD..MV_SLOT_HEAD + value.len()].copy_from_slice(value);
}

/// What a multi-version slot holds when read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MvSlot<'a> {
    /// A complete version and its value.
    Complete(u64, &'a [u8]),
    /// Being written (or torn): the version word as read.
    Torn(u64),
}

/// Decodes a slot read into `b` (a slot's bytes).
pub fn decode_mv_slot(b: &[u8]) -> MvSlot<'_> {
    let Ok((head, body)) = MvSlotHead::read_from_prefix(b) else {
        return MvSlot::Torn(u64::MAX);
    };
    match body.get(..head.len()) {
        Some(v) if mv_slot_checksum(head.version, v) == head.checksum() => {
            MvSlot::Complete(head.version, v)
        }
        _ => MvSlot::Torn(head.version),
    }
}

/// Encodes a fresh multi-version block: counter K, slot `i` holding
/// version `i` (its commit word `i`), each with `value` (so the newest,
/// K-1, is `value`).
pub fn encode_mv_block(shape: MvShape, key: &[u8], value: &[u8], out: &mut Vec<u8>) {
    out.clear();
    out.resize(shape.block_bytes(key.len()), 0);
    let lens = shape.lens(key.len());
    let head = MvBlockHeader {
        lens,
        counter: shape.versions as u64,
        checksum: mv_key_checksum(lens, key),
    };
    out[..MV_HEADER].copy_from_slice(head.as_bytes());
    out[MV_HEADER..MV_HEADER + key.len()].copy_from_slice(key);
    let mut slot = Vec::new();
    for i in 0..shape.versions {
        let c = shape.commit_at(key.len(), i);
        out[c..c + MV_COMMIT].copy_from_slice(&(i as u64).to_le_bytes());
        encode_mv_slot(shape, i as u64, value, &mut slot);
        let at = shape.slot_at(key.len(), i);
        out[at..at + slot.len()].copy_from_slice(&slot);
    }
}

/// A multi-version block's prefix (or whole block) read into `b`: its
/// shape and key (`None` when the header is torn, recycled or garbage, or
/// `b` is shorter than the prefix).
pub fn mv_block_head(b: &[u8]) -> Option<(MvShape, &[u8])> {
    let (head, _) = MvBlockHeader::read_from_prefix(b).ok()?;
    let k = (head.lens & 0xFFFF) as usize;
    let shape = MvShape {
        versions: (head.lens >> 16 & 0xFF) as u32,
        value_cap: (head.lens >> 32) as usize,
    };
    if head.lens & MV_FLAG == 0
        || head.lens & 0x7F00_0000 != 0
        || k == 0
        || !(2..=MAX_VERSIONS).contains(&shape.versions)
        || shape.value_cap > 0xFFFF
        || shape.prefix_bytes(k) > b.len()
    {
        return None;
    }
    let key = &b[MV_HEADER..MV_HEADER + k];
    (mv_key_checksum(head.lens, key) == head.checksum).then_some((shape, key))
}

/// Commit word `i` of a block prefix `b` whose key is `key_len` bytes (as
/// [`mv_block_head`] checked it).
pub fn mv_commit(b: &[u8], shape: MvShape, key_len: usize, i: u32) -> u64 {
    let c = shape.commit_at(key_len, i);
    u64::from_le_bytes(b[c..c + MV_COMMIT].try_into().expect("8 bytes"))
}

/// The newest complete version of a multi-version block read into `b`:
/// (key, version, value). `None` when the header fails its checksum, `b`
/// is not the whole block, or a slot being written might hide a newer
/// version than every complete one (its version word is not below the
/// newest complete version): the caller reads the block again.
pub fn decode_mv_block(b: &[u8]) -> Option<(&[u8], u64, &[u8])> {
    let (shape, key) = mv_block_head(b)?;
    if shape.block_bytes(key.len()) > b.len() {
        return None;
    }
    let mut best: Option<(u64, &[u8])> = None;
    let mut torn_max: Option<u64> = None;
    for i in 0..shape.versions {
        let at = shape.slot_at(key.len(), i);
        match decode_mv_slot(&b[at..at + shape.slot_bytes()]) {
            MvSlot::Complete(v, val) => {
                if best.is_none_or(|(bv, _)| v > bv) {
                    best = Some((v, val));
                }
            }
            MvSlot::Torn(v) => torn_max = Some(torn_max.map_or(v, |t| t.max(v))),
        }
    }
    let (v, val) = best?;
    if torn_max.is_some_and(|t| t >= v) {
        return None;
    }
    Some((key, v, val))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slot_round_trips() {
        let a = GlobalAddr::new(3, 0x1234_5640);
        let s = Slot::new(0xAB, 5, a).unwrap();
        assert_eq!(
            (s.fp(), s.units(), s.block(), s.moved()),
            (0xAB, 5, a, false)
        );
        let f = s.frozen();
        assert!(f.moved());
        assert_eq!((f.fp(), f.units(), f.block()), (0xAB, 5, a));
        assert_eq!(f.thawed(), s);
        assert!(Slot::new(1, 0, a).is_none());
        assert!(Slot::new(1, 128, a).is_none());
        assert!(Slot::new(1, 1, GlobalAddr::new(3, 65)).is_none());
        assert!(Slot::new(1, 1, GlobalAddr::new(256, 64)).is_none());
    }

    #[test]
    fn blocks_detect_damage() {
        let mut b = Vec::new();
        encode_block(b"key", b"value", &mut b);
        assert_eq!(b.len(), 64);
        assert_eq!(decode_block(&b), Some((&b"key"[..], &b"value"[..])));
        for i in 0..24 {
            let mut t = b.clone();
            t[i] ^= 0x10;
            assert_ne!(
                decode_block(&t),
                Some((&b"key"[..], &b"value"[..])),
                "byte {i}"
            );
        }
        assert_eq!(decode_block(&[0u8; 64]), None);
    }

    /// Writes slot `i` of block `b` (key `key`) with version `v` and `value`.
    fn put_slot(b: &mut [u8], mv: MvShape, key: &[u8], i: u32, v: u64, value: &[u8]) -> Vec<u8> {
        let mut img = Vec::new();
        encode_mv_slot(mv, v, value, &mut img);
        let at = mv.slot_at(key.len(), i);
        b[at..at + img.len()].copy_from_slice(&img);
        img
    }

    #[test]
    fn multi_version_blocks_give_the_newest_complete_version() {
        let mv = MvShape {
            versions: 4,
            value_cap: 64,
        };
        let key = b"cold-key";
        let mut b = Vec::new();
        encode_mv_block(mv, key, &[1; 64], &mut b);
        assert_eq!(b.len(), mv.block_bytes(key.len()));
        assert_eq!(b.len(), 6 * 64, "64-byte values, K = 4: six units");
        assert_eq!(decode_mv_block(&b), Some((&key[..], 3, &[1u8; 64][..])));
        assert_eq!(decode_block(&b), Some((&key[..], &[1u8; 64][..])));
        assert_eq!(block_key(&b), Some(&key[..]));
        assert_eq!(mv_block_head(&b).map(|(s, _)| s), Some(mv));
        // A writer reads the prefix only: header, key and commit words,
        // one 64-byte unit here.
        let pre = &b[..mv.prefix_bytes(key.len())];
        assert_eq!(pre.len(), 64);
        assert_eq!(mv_block_head(pre), Some((mv, &key[..])));
        let commits: Vec<u64> = (0..4).map(|i| mv_commit(pre, mv, key.len(), i)).collect();
        assert_eq!(commits, [0, 1, 2, 3]);
        assert_eq!(decode_mv_block(pre), None, "a prefix is not a block");
        assert_eq!(mv_block_head(&b[..pre.len() - 8]), None);
        // Versions 4 and 5 land in slots 0 and 1; a shorter value too.
        put_slot(&mut b, mv, key, 0, 4, &[4; 64]);
        put_slot(&mut b, mv, key, 1, 5, b"five");
        assert_eq!(decode_mv_block(&b), Some((&key[..], 5, &b"five"[..])));
        // The FAA word is not covered by any checksum.
        let head = MvBlockHeader::read_from_prefix(&b).unwrap().0;
        assert_eq!(head.counter, 4);
        b[MV_COUNTER as usize] = 9;
        assert!(decode_mv_block(&b).is_some());
        // Nor are the commit words: readers go by the slots' checksums.
        let c = mv.commit_at(key.len(), 2);
        b[c] ^= 0xFF;
        assert_eq!(decode_mv_block(&b), Some((&key[..], 5, &b"five"[..])));
        // A slot whose length or checksum word is damaged is torn.
        let at1 = mv.slot_at(key.len(), 1);
        for bit in [0, 3, 17, 40, 63] {
            let mut t = b.clone();
            t[at1 + 8 + bit / 8] ^= 1 << (bit % 8);
            assert_eq!(decode_mv_block(&t), None, "bit {bit}");
        }
    }

    #[test]
    fn a_torn_slot_is_never_returned_and_never_hides_a_newer_version() {
        let mv = MvShape {
            versions: 2,
            value_cap: 64,
        };
        let key = b"k";
        let mut b = Vec::new();
        encode_mv_block(mv, key, &[0xAA; 64], &mut b); // versions 0, 1
        let at0 = mv.slot_at(key.len(), 0);
        // Version 2 lands in slot 0 (old: version 0) word by word, in any
        // order: every mix of old and new words must decode to version 1
        // (the old slot's version 0 is older) or version 2 (complete),
        // never to a mixed value.
        let mut new = b.clone();
        put_slot(&mut new, mv, key, 0, 2, &[0x55; 64]);
        let words = mv.slot_bytes() / 8;
        for mask in [1u64, 2, 4, 8, 0x0F, 0xF0, 0xFFFE, 0x5555, 0xAAAA] {
            let mut t = b.clone();
            for w in 0..words {
                if mask >> (w % 16) & 1 == 1 {
                    let o = at0 + 8 * w;
                    t[o..o + 8].copy_from_slice(&new[o..o + 8]);
                }
            }
            match decode_mv_block(&t) {
                Some((_, 1, v)) => assert_eq!(v, &[0xAA; 64][..]),
                Some((_, 2, v)) => assert_eq!(v, &[0x55; 64][..]),
                None => {}
                other => panic!("mask {mask:x}: {other:?}"),
            }
            if mask & 1 == 1 {
                // The slot's version word already says 2, above every
                // complete slot: it may hide the newest version.
                assert_eq!(decode_mv_block(&t), None, "mask {mask:x}");
            }
        }
        // Now slot 1 (version 1) is being overwritten by version 3 while
        // slot 0 holds the complete version 2: the torn slot's word (1 or
        // 3) — with 3 the reader must read again, with 1 it may answer 2.
        let mut t = new.clone();
        let at1 = mv.slot_at(key.len(), 1);
        let mut v3 = new.clone();
        put_slot(&mut v3, mv, key, 1, 3, &[0x33; 64]);
        let val1 = at1 + MV_SLOT_HEAD;
        t[val1..val1 + 8].copy_from_slice(&v3[val1..val1 + 8]);
        assert_eq!(decode_mv_block(&t), Some((&key[..], 2, &[0x55u8; 64][..])));
        t[at1..at1 + 8].copy_from_slice(&v3[at1..at1 + 8]);
        assert_eq!(decode_mv_block(&t), None);
        // A damaged key or header is never a block.
        let mut t = new.clone();
        t[MV_HEADER] ^= 1;
        assert_eq!(decode_mv_block(&t), None);
        assert_eq!(decode_block(&t), None);
    }

    #[test]
    fn geometry_and_headers() {
        let g = Geometry { groups: 4 };
        assert_eq!(g.combs(), 8);
        assert_eq!(g.comb_at(0) + 64, g.comb_at(1));
        assert_eq!(g.comb_at(2) - g.comb_at(0), GROUP_BYTES);
        assert!(g.groups_at() >= SUB_LOCKS + 64);
        let h = bucket_header(3, 0b101);
        assert!(header_covers(h, 0xFF05 | 0b101));
        assert!(!header_covers(h, 0b001));
        assert!(header_covers(bucket_header(0, 0), 12345));
    }
}
