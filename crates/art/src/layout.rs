//! Remote layouts of the radix tree (SMART, OSDI'23 §4.1.1, Figure 6) and
//! the key encoding. Each fixed layout is a `#[repr(C)]` type
//! ([`TreeDesc`], [`InternalNode`] and its [`NodeHead`], [`NewNode`],
//! [`LeafHead`]) that the tree encodes and decodes through (`zerocopy`;
//! words are little-endian); offsets come from the types.
//!
//! ## Descriptor
//! ```text
//!  0        8        16        24          32       40       48       64
//!  +--------+--------+---------+-----------+--------+--------+--------+
//!  | magic  | root   | max_key | max_value | flags  | locks  | (zero) |
//!  +--------+--------+---------+-----------+--------+--------+--------+
//! ```
//! The block the tree's root `art/NAME` names; the root node follows it in
//! the same chunk, then the node-lock table. `magic` is [`DESC_MAGIC`]
//! (kind tag and layout version, see `dmkit_index::Magic`); `flags` bit 0:
//! in-place leaves, bit 1: the homogeneous layout's finer node sizes; `locks`: the node-lock table of [`LOCK_WORDS`] words
//! (the baseline without lock-free internal nodes).
//!
//! ## Internal node (Figure 6a), with room for NODE_256 reserved
//! ```text
//!  0          8          16         24               16 + 8·256 = 2064
//!  +----------+----------+----------+----------+-----+----------+
//!  | reverse  |  header  |  slot 0  |  slot 1  | ... | slot 255 |
//!  | pointer  |          |          |          |     |          |
//!  +----------+----------+----------+----------+-----+----------+
//!  <------ NodeHead ----->
//!  <------------------ NewNode: 48 ----------------->
//!  <---------- read: 16 + 8 · slots(type) bytes -------->
//! ```
//! The node type (NODE_4/16/48/256) says how many slots are *visible*; the
//! space of all 256 is allocated, so the type switch happens in place. A
//! split writes only a new node's [`NewNode`] (head and four slots); the
//! slots past them must be zero already, as a fresh chunk's bytes are.
//!
//! ## Header (pessimistic, 8 bytes, changed by CAS)
//! ```text
//!  63                               16 15    13 12     8 7        0
//!  +-----------------------------------+--------+--------+----------+
//!  |  partial keys [0..6] (byte i at   | prefix |  type  |  depth   |
//!  |  bits 16+8i)                      | len(3) |  (5)   |   (8)    |
//!  +-----------------------------------+--------+--------+----------+
//! ```
//! `depth` is the key position where matching starts; the node's partial
//! keys cover positions `depth .. depth+len`, and its slots branch on the
//! byte at `depth+len`. Type 0 marks a deleted node (cache validation).
//!
//! ## Slot (homogeneous, 8 bytes, changed by CAS)
//! ```text
//!  63       56 55  54          48 47                               0
//!  +----------+---+--------------+----------------------------------+
//!  | partial  | L | leaf: units  |  child pointer (48, see          |
//!  |  key (8) |   | node: type   |  GlobalAddr::to_ptr48)           |
//!  +----------+---+--------------+----------------------------------+
//! ```
//! `L` = the child is a leaf, then bits 48..55 hold its length in 64-byte
//! units (§4.5's `Len_leaf`); otherwise bits 48..53 hold the child's node
//! type. An all-zero word is an empty slot. A slot's partial key never
//! changes once set: deletes leave the slot pointing at the dead leaf
//! (which inserts of any key with that byte may replace), so two inserts
//! of one byte always meet in one slot.
//!
//! ## Leaf (Figure 6b)
//! ```text
//!  0         8                     16                  16+K'       16+K'+V'
//!  +---------+---------------------+-------------------+------------+-------+
//!  | reverse |  meta: V R checksum |  key (padded to   | value (pad | rear  |
//!  | pointer |        lengths      |  8 bytes)         | to 8)      | lock  |
//!  +---------+---------------------+-------------------+------------+-------+
//!            <---------- a search reads these: 8 + K' + V' ---------->
//! meta: bit 63 valid (V), bit 62 replaced (R, out-of-place mode),
//!       bits 24..56 checksum (32 bits), bits 8..24 value length,
//!       bits 0..8 key length.
//! marked replaced (R set): bits 24..56 hold the mark's lease deadline
//!       instead (`dmkit_index::LeaseConfig::short_deadline`, 32 bits of
//!       µs); the leaf's bytes never change again, so the checksum is not
//!       needed to read it, and whoever undoes an expired mark recomputes
//!       it from the key and value ([`Item::unmarked`]).
//! ```
//! Out-of-place leaves take no lock: their last word (where the lock
//! sits, written 0 with the leaf; at [`intent_offset`]) is the *intent*
//! word instead. The client that marked the leaf replaced writes there
//! the new leaf it is about to link (a leaf [`Slot`] word with partial
//! key 0, so never 0: [`intent_word`]), while its mark's lease holds;
//! whoever undoes the expired mark takes that leaf back (see the tree's
//! out-of-place update).
//!
//! With in-place leaves, every leaf of a tree has room for `max_key` and
//! `max_value` (K' and V' are those, padded), so an update overwrites it
//! where it is. The checksum covers the lengths, key and value (not the
//! state bits, which change by CAS alone), so a reader detects a write in
//! progress. The lock is the last word: one WRITE of `meta ..= lock`
//! writes the item and releases the lock, and in-order placement inside a
//! WRITE makes the release land last (§4.1.1, "rear embedded lock").
//!
//! A search reads only the meta word, key and value: it validates a leaf
//! by its key, state and checksum, never by the reverse pointer (which the
//! structural checker verifies) or the lock (a leaf written under it fails
//! the checksum while torn). So the read amplification of a search is
//! `(8 + K' + V') / (key + value)` — 1.083 for the paper's 96-byte items
//! (Table 1 computes 1.10 from SMART's 10 bytes of leaf metadata).

//! ## Keys
//! A key of `n ≤ max_key` bytes is matched as the *tree key* of
//! `max_key + 1` bytes: the key, zero padding up to `max_key`, then `n`.
//! That encoding is prefix-free (no key's tree key is a prefix of
//! another's) and keeps byte order (so scans return keys in order), which
//! lets variable-length keys share one tree.

use std::mem::{offset_of, size_of};

use dmkit_fabric::GlobalAddr;
use dmkit_index::Magic;
use dmkit_runtime::hash::hash64;
use zerocopy::{FromBytes, Immutable, IntoBytes, KnownLayout};

/// The tree descriptor (see the module docs).
#[repr(C)]
#[derive(
    Debug, Clone, Copy, Default, PartialEq, Eq, FromBytes, IntoBytes, KnownLayout, Immutable,
)]
pub struct TreeDesc {
    /// [`DESC_MAGIC`]'s word.
    pub magic: u64,
    /// The root node.
    pub root: u64,
    /// Longest key.
    pub max_key: u64,
    /// Longest value.
    pub max_value: u64,
    /// [`FLAG_IN_PLACE`].
    pub flags: u64,
    /// The node-lock table.
    pub locks: u64,
    /// Zero; pads the descriptor to 64 bytes.
    pub reserved: [u64; 2],
}
const _: () = assert!(size_of::<TreeDesc>() == 64);

/// The descriptor's magic: kind and layout version. Version 3 is the
/// layout-versioned magic of the index layer (version 2 was the
/// `DMKITAR2` word, 16-byte leaf heads; `DMKITART` trees had 24-byte
/// ones).
pub const DESC_MAGIC: Magic = Magic::new(b"dmART_", 3);

/// [`TreeDesc::flags`]: the tree's leaves are updated in place.
pub const FLAG_IN_PLACE: u64 = 1;
/// [`TreeDesc::flags`]: the tree's internal nodes grow through the finer
/// sizes ([`NodeLayout::Homogeneous`]).
pub const FLAG_FINE_NODES: u64 = 2;

/// Words of the node-lock table (hashed by node address).
pub const LOCK_WORDS: u64 = 1 << 14;

/// Slots reserved per internal node (NODE_256).
pub const MAX_SLOTS: usize = 256;

/// What precedes an internal node's slots.
#[repr(C)]
#[derive(
    Debug, Clone, Copy, Default, PartialEq, Eq, FromBytes, IntoBytes, KnownLayout, Immutable,
)]
pub struct NodeHead {
    /// The parent (reverse pointer): the cache's reverse check.
    pub rev: u64,
    /// The [`Header`] word.
    pub header: u64,
}

/// An internal node as it sits in remote memory.
#[repr(C)]
#[derive(Debug, Clone, FromBytes, IntoBytes, KnownLayout, Immutable)]
pub struct InternalNode {
    /// Reverse pointer and header.
    pub head: NodeHead,
    /// [`Slot`] words; the header's type says how many are visible.
    pub slots: [u64; MAX_SLOTS],
}

/// Bytes of an internal node: reverse pointer, header, 256 slots.
pub const NODE_BYTES: usize = size_of::<InternalNode>();
const _: () = assert!(NODE_BYTES == 16 + 8 * MAX_SLOTS);
/// Bytes before the slots.
pub const NODE_HEAD: usize = size_of::<NodeHead>();
/// Offset of the header word.
pub const NODE_HEADER: u64 = (offset_of!(InternalNode, head) + offset_of!(NodeHead, header)) as u64;
/// Offset of slot 0.
pub const NODE_SLOTS: u64 = offset_of!(InternalNode, slots) as u64;
/// Bytes of a slot.
pub const SLOT_BYTES: usize = size_of::<u64>();

/// What a split writes of a new node: its head and first four slots (the
/// other slots must be zero already, as a fresh chunk's bytes are).
#[repr(C)]
#[derive(
    Debug, Clone, Copy, Default, PartialEq, Eq, FromBytes, IntoBytes, KnownLayout, Immutable,
)]
pub struct NewNode {
    /// Reverse pointer (the new node's parent) and header.
    pub head: NodeHead,
    /// The first four slots: all a NODE_4 shows.
    pub slots: [u64; 4],
}

/// Bytes a split writes per new node.
pub const NEW_NODE: usize = size_of::<NewNode>();
const _: () = assert!(NEW_NODE == 48 && offset_of!(NewNode, slots) as u64 == NODE_SLOTS);

/// Partial keys a header holds.
pub const HEADER_PREFIX: usize = 6;

/// The fixed head of a leaf (key, value and the lock word follow).
#[repr(C)]
#[derive(
    Debug, Clone, Copy, Default, PartialEq, Eq, FromBytes, IntoBytes, KnownLayout, Immutable,
)]
pub struct LeafHead {
    /// The parent (reverse pointer).
    pub rev: u64,
    /// State bits, checksum and lengths (see the diagram).
    pub meta: u64,
}
/// Bytes before a leaf's key: reverse pointer, meta.
pub const LEAF_HEAD: usize = size_of::<LeafHead>();
const _: () = assert!(LEAF_HEAD == 16);
/// Offset of the meta word in a leaf (where the item a search reads
/// starts).
pub const LEAF_META: u64 = offset_of!(LeafHead, meta) as u64;
/// Bytes of the rear lock, a leaf's last word.
pub const LEAF_LOCK: usize = size_of::<u64>();

/// Longest key (the depth field is 8 bits and the tree key is one longer).
pub const MAX_KEY_LIMIT: usize = 254;

/// Node types (the 5-bit `Type_node` field). 0 = deleted.
///
/// ART's four sizes keep their field values 1–4; the sizes in between
/// (NODE_8/32/64/128, values 5–8) are the finer steps of the homogeneous
/// adaptive node ([`NodeLayout::Homogeneous`]). Types order by their
/// visible slots, not by their field values.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub enum NodeType {
    /// A node unlinked from the tree; a cached copy of it is stale.
    Deleted = 0,
    /// NODE_4: 4 visible slots.
    N4 = 1,
    /// NODE_16: 16 visible slots.
    N16 = 2,
    /// NODE_48: 48 visible slots.
    N48 = 3,
    /// NODE_256: all 256 slots visible.
    N256 = 4,
    /// NODE_8: 8 visible slots (homogeneous layout only).
    N8 = 5,
    /// NODE_32: 32 visible slots (homogeneous layout only).
    N32 = 6,
    /// NODE_64: 64 visible slots (homogeneous layout only).
    N64 = 7,
    /// NODE_128: 128 visible slots (homogeneous layout only).
    N128 = 8,
}

impl PartialOrd for NodeType {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}

impl Ord for NodeType {
    /// By visible slots (a bigger type shows more).
    fn cmp(&self, other: &Self) -> std::cmp::Ordering {
        self.slots().cmp(&other.slots())
    }
}

/// The sizes a tree's internal nodes grow through (the radix-tree paper's
/// "homogeneous adaptive internal node", §4.1.1 and Figure 17; see
/// [`NodeLayout::fitting`]). Stored in the tree (descriptor flag
/// [`FLAG_FINE_NODES`]): readers follow whatever type a header names, only
/// the type switch chooses.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[cfg_attr(feature = "cli", derive(clap::ValueEnum))]
pub enum NodeLayout {
    /// ART's four fixed node sizes, NODE_4/16/48/256: a node of 17
    /// children shows (is read and cached with) 48 slots.
    #[default]
    #[cfg_attr(feature = "cli", value(name = "fixed-types"))]
    FixedTypes,
    /// The finer sizes homogeneous slots allow (SMART's artifact:
    /// NODE_4/8/16/32/64/128/256): a node of 17 children shows 32.
    #[cfg_attr(feature = "cli", value(name = "homogeneous"))]
    Homogeneous,
}

impl NodeLayout {
    /// The smallest type of this layout whose visible slots include index
    /// `i`.
    pub fn fitting(self, i: usize) -> NodeType {
        match self {
            NodeLayout::FixedTypes => NodeType::fitting(i),
            NodeLayout::Homogeneous => match i {
                0..4 => NodeType::N4,
                4..8 => NodeType::N8,
                8..16 => NodeType::N16,
                16..32 => NodeType::N32,
                32..64 => NodeType::N64,
                64..128 => NodeType::N128,
                _ => NodeType::N256,
            },
        }
    }
}

impl NodeType {
    /// The type of the 5-bit field value `b`; `None` for a value no node type
    /// has (a torn or garbage word).
    pub fn from_bits(b: u64) -> Option<NodeType> {
        Some(match b {
            0 => NodeType::Deleted,
            1 => NodeType::N4,
            2 => NodeType::N16,
            3 => NodeType::N48,
            4 => NodeType::N256,
            5 => NodeType::N8,
            6 => NodeType::N32,
            7 => NodeType::N64,
            8 => NodeType::N128,
            _ => return None,
        })
    }
    /// Visible slots.
    pub fn slots(self) -> usize {
        match self {
            NodeType::Deleted => 0,
            NodeType::N4 => 4,
            NodeType::N8 => 8,
            NodeType::N16 => 16,
            NodeType::N32 => 32,
            NodeType::N48 => 48,
            NodeType::N64 => 64,
            NodeType::N128 => 128,
            NodeType::N256 => 256,
        }
    }
    /// The smallest of ART's four types whose visible slots include index
    /// `i` ([`NodeLayout::FixedTypes`]).
    pub fn fitting(i: usize) -> NodeType {
        match i {
            0..4 => NodeType::N4,
            4..16 => NodeType::N16,
            16..48 => NodeType::N48,
            _ => NodeType::N256,
        }
    }
    /// The fewest children a linked node of this type has: one more than
    /// the next smaller type of either layout shows (a type switch is made
    /// by the slot past the visible ones). A lower bound that holds
    /// whichever layout grew the node.
    pub fn min_children(self) -> usize {
        match self {
            NodeType::Deleted | NodeType::N4 => 1,
            NodeType::N8 => 5,
            NodeType::N16 => 5,
            NodeType::N32 | NodeType::N48 => 17,
            NodeType::N64 => 33,
            NodeType::N128 => 65,
            NodeType::N256 => 49,
        }
    }
    /// Bytes a READ of a node of this type fetches.
    pub fn read_bytes(self) -> usize {
        NODE_HEAD + SLOT_BYTES * self.slots()
    }
}

/// A decoded header word.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Header(pub u64);

impl Header {
    /// A header for a node of type `ty` whose matching starts at key position
    /// `depth` (≤ 255), holding up to [`HEADER_PREFIX`] partial keys.
    pub fn new(depth: usize, ty: NodeType, prefix: &[u8]) -> Header {
        assert!(depth <= 255 && prefix.len() <= HEADER_PREFIX);
        let mut w = depth as u64 | (ty as u64) << 8 | (prefix.len() as u64) << 13;
        for (i, &b) in prefix.iter().enumerate() {
            w |= (b as u64) << (16 + 8 * i);
        }
        Header(w)
    }
    /// Key position (bits 7..0) where this node's matching starts.
    pub fn depth(self) -> usize {
        (self.0 & 0xFF) as usize
    }
    /// `None` for a type value outside the known ones (garbage).
    pub fn ty(self) -> Option<NodeType> {
        NodeType::from_bits(self.0 >> 8 & 0x1F)
    }
    /// Partial keys held in the header (bits 15..13), 0..=[`HEADER_PREFIX`].
    pub fn prefix_len(self) -> usize {
        (self.0 >> 13 & 0x7) as usize
    }
    /// Partial key `i` (byte `depth + i` of the tree key), the byte at bit
    /// 16 + 8i.
    pub fn prefix(self, i: usize) -> u8 {
        (self.0 >> (16 + 8 * i)) as u8
    }
    /// The same header with the type field (bits 12..8) set to `ty`.
    pub fn with_type(self, ty: NodeType) -> Header {
        Header(self.0 & !(0x1F << 8) | (ty as u64) << 8)
    }
    /// The header after cutting the first `n + 1` partial keys (the `n`
    /// that moved to a new parent and the one that became its slot's).
    pub fn cut(self, n: usize) -> Header {
        let len = self.prefix_len();
        assert!(n < len);
        let rest: Vec<u8> = (n + 1..len).map(|i| self.prefix(i)).collect();
        Header::new(
            self.depth() + n + 1,
            self.ty().unwrap_or(NodeType::N4),
            &rest,
        )
        .with_type_bits(self.0 >> 8 & 0x1F)
    }
    fn with_type_bits(self, bits: u64) -> Header {
        Header(self.0 & !(0x1F << 8) | bits << 8)
    }
}

/// A decoded slot word.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Slot(pub u64);

const LEAF_BIT: u64 = 1 << 55;

impl Slot {
    /// A slot for a leaf of `units` · 64 bytes (1..=127) at `leaf` under
    /// partial key `pkey`; `None` if `leaf` has no ptr48 form (not 64-byte
    /// aligned, or beyond node 255 or 64 TiB).
    pub fn leaf(pkey: u8, units: u64, leaf: GlobalAddr) -> Option<Slot> {
        assert!((1..=127).contains(&units), "leaf of {units} units");
        Some(Slot(
            (pkey as u64) << 56 | LEAF_BIT | units << 48 | leaf.to_ptr48()?,
        ))
    }
    /// A slot for an internal node of type `ty` at `node` under partial key
    /// `pkey`; `None` if `node` has no ptr48 form.
    pub fn node(pkey: u8, ty: NodeType, node: GlobalAddr) -> Option<Slot> {
        Some(Slot(
            (pkey as u64) << 56 | (ty as u64) << 48 | node.to_ptr48()?,
        ))
    }
    /// Whether the word is 0 (a free slot).
    pub fn is_empty(self) -> bool {
        self.0 == 0
    }
    /// The partial key (bits 63..56): the key byte this slot branches on. Never
    /// changes once set.
    pub fn pkey(self) -> u8 {
        (self.0 >> 56) as u8
    }
    /// Whether the `L` bit (55) is set: the child is a leaf.
    pub fn is_leaf(self) -> bool {
        self.0 & LEAF_BIT != 0
    }
    /// A leaf slot's length in 64-byte units.
    pub fn units(self) -> u64 {
        self.0 >> 48 & 0x7F
    }
    /// A node slot's child type.
    pub fn child_type(self) -> Option<NodeType> {
        NodeType::from_bits(self.0 >> 48 & 0x1F)
    }
    /// The same node slot with its child-type field (bits 52..48) set to `ty`,
    /// as a node type switch writes it into the parent.
    pub fn with_child_type(self, ty: NodeType) -> Slot {
        Slot(self.0 & !(0x1F << 48) | (ty as u64) << 48)
    }
    /// The child's address (bits 47..0, a ptr48).
    pub fn ptr(self) -> GlobalAddr {
        GlobalAddr::from_ptr48(self.0)
    }
}

/// Leaf state bits in the meta word.
pub const META_VALID: u64 = 1 << 63;
/// Meta bit 62: an out-of-place update wrote a new leaf and replaced this one
/// in its slot; a reader that finds it restarts.
pub const META_REPLACED: u64 = 1 << 62;
/// The meta word of a live leaf `meta` marked replaced by an out-of-place
/// update whose lease ends at short deadline `deadline`: the checksum
/// bits carry the deadline (see the module docs).
pub fn replaced_mark(meta: u64, deadline: u32) -> u64 {
    debug_assert!(meta & META_REPLACED == 0, "a leaf is marked once");
    (meta & !META_SUM) | META_REPLACED | u64::from(deadline) << META_SUM_SHIFT
}

/// The lease deadline of a meta word marked replaced.
pub fn mark_deadline(meta: u64) -> u32 {
    debug_assert!(meta & META_REPLACED != 0, "only a mark has a deadline");
    ((meta & META_SUM) >> META_SUM_SHIFT) as u32
}

/// Offset of the intent word in an out-of-place leaf whose meta word is
/// `meta` and whose key room is `kcap` (its value room is its value's
/// length): the word where an in-place leaf keeps its lock, the last of
/// the leaf's image (see the module docs).
pub fn intent_offset(meta: u64, kcap: usize) -> u64 {
    let v = ((meta & META_LENS) >> 8) as usize;
    lock_offset(leaf_bytes(kcap, v)) as u64
}

/// The intent word naming new leaf `leaf` of `units` 64-byte units (a
/// leaf slot word with partial key 0: never 0); `None` if `leaf` has no
/// ptr48 form.
pub fn intent_word(leaf: GlobalAddr, units: u64) -> Option<u64> {
    Slot::leaf(0, units, leaf).map(|s| s.0)
}

/// The leaf and its units an intent word names; `None` for 0 (no intent)
/// or a word that is not an intent.
pub fn intent_leaf(word: u64) -> Option<(GlobalAddr, u64)> {
    let s = Slot(word);
    (word != 0 && s.is_leaf() && s.pkey() == 0 && (1..=127).contains(&s.units()))
        .then(|| (s.ptr(), s.units()))
}

/// Key and value lengths in the meta word.
const META_LENS: u64 = (1 << 24) - 1;
/// The checksum's place in the meta word.
const META_SUM_SHIFT: u32 = 24;
const META_SUM: u64 = 0xFFFF_FFFF << META_SUM_SHIFT;
/// Longest value a leaf can describe (16-bit length).
pub const MAX_VALUE_LIMIT: usize = u16::MAX as usize;

/// Bytes of a leaf holding a key of `k` and a value of `v` bytes (before
/// rounding to 64-byte units).
pub fn leaf_bytes(k: usize, v: usize) -> usize {
    LEAF_HEAD + k.next_multiple_of(8) + v.next_multiple_of(8) + LEAF_LOCK
}

/// Bytes a search reads of such a leaf: meta word, key and value (from
/// [`LEAF_META`]; see [`decode_item`]).
pub fn item_bytes(k: usize, v: usize) -> usize {
    META_BYTES + k.next_multiple_of(8) + v.next_multiple_of(8)
}

/// Bytes of the meta word.
const META_BYTES: usize = size_of::<u64>();

/// The item's bytes in a leaf region of `leaf_len` bytes (a whole leaf,
/// padding included): all but the reverse pointer before [`LEAF_META`]
/// and the lock word at the end.
pub fn item_len(leaf_len: usize) -> usize {
    leaf_len - LEAF_META as usize - LEAF_LOCK
}

/// Offset of the rear lock in a leaf of `leaf_len` bytes.
pub fn lock_offset(leaf_len: usize) -> usize {
    leaf_len - LEAF_LOCK
}

const CHECKSUM_SEED: u64 = 0x5A27_1EAF_C0DE_0001;

/// The checksum bits of the meta word for these lengths, key and value.
fn checksum(lens: u64, key: &[u8], value: &[u8]) -> u64 {
    (hash64(value, hash64(key, CHECKSUM_SEED ^ lens)) << META_SUM_SHIFT) & META_SUM
}

/// The image of a leaf with room for `kcap`/`vcap` bytes (its full
/// `leaf_bytes(kcap, vcap)`), state valid, lock free.
///
/// # Panics
/// If the key is longer than [`MAX_KEY_LIMIT`] or the value than
/// [`MAX_VALUE_LIMIT`] (the tree checks both first).
pub fn encode_leaf(
    rev: GlobalAddr,
    key: &[u8],
    value: &[u8],
    kcap: usize,
    vcap: usize,
    out: &mut Vec<u8>,
) {
    assert!(key.len() <= MAX_KEY_LIMIT && value.len() <= MAX_VALUE_LIMIT);
    out.clear();
    out.resize(leaf_bytes(kcap, vcap), 0);
    let lens = key.len() as u64 | (value.len() as u64) << 8;
    let head = LeafHead {
        rev: rev.raw(),
        meta: lens | checksum(lens, key, value) | META_VALID,
    };
    let (h, body) = out.split_at_mut(LEAF_HEAD);
    h.copy_from_slice(head.as_bytes());
    body[..key.len()].copy_from_slice(key);
    let v0 = kcap.next_multiple_of(8);
    body[v0..v0 + value.len()].copy_from_slice(value);
}

/// A leaf's item: what a search reads.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Item<'a> {
    /// The leaf's meta word: valid (63), replaced (62), checksum (55..24),
    /// value length (23..8), key length (7..0).
    pub meta: u64,
    /// The key (its stored length).
    pub key: &'a [u8],
    /// The value (its stored length).
    pub value: &'a [u8],
}

impl Item<'_> {
    /// Whether the valid bit is set (cleared by a delete).
    pub fn valid(&self) -> bool {
        self.meta & META_VALID != 0
    }
    /// Whether the replaced bit is set (out-of-place leaves only).
    pub fn replaced(&self) -> bool {
        self.meta & META_REPLACED != 0
    }
    /// The meta word this leaf had before it was marked replaced: valid,
    /// unmarked, its checksum recomputed (what undoing a mark writes back).
    pub fn unmarked(&self) -> u64 {
        let lens = self.meta & META_LENS;
        lens | checksum(lens, self.key, self.value) | META_VALID
    }
}

/// A whole decoded leaf.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Leaf<'a> {
    /// The reverse pointer: the address of the node whose slot points at this
    /// leaf.
    pub rev: GlobalAddr,
    /// Meta word, key and value.
    pub item: Item<'a>,
    /// The rear embedded lock (the leaf's last word; 0 = free), taken for
    /// in-place updates (SMART, OSDI'23 §4.1.2).
    pub lock: u64,
}

/// Decodes an item read into `b` from a leaf's meta word on, with key room
/// `kcap`; `None` when torn (checksum mismatch) or garbage. `b` may run
/// past the value (the lock word, padding). A leaf marked replaced has no
/// checksum (its bits hold the mark's deadline) and needs none: an
/// out-of-place leaf is written whole before a slot names it and only its
/// meta word changes after.
pub fn decode_item(b: &[u8], kcap: usize) -> Option<Item<'_>> {
    let (meta, body) = u64::read_from_prefix(b).ok()?;
    let lens = meta & META_LENS;
    let (k, v) = ((lens & 0xFF) as usize, (lens >> 8) as usize);
    let v0 = kcap.next_multiple_of(8);
    if k == 0 || k > kcap || v0 + v.next_multiple_of(8) > body.len() {
        return None;
    }
    let key = &body[..k];
    let value = &body[v0..v0 + v];
    (meta & META_REPLACED != 0 || checksum(lens, key, value) == meta & META_SUM).then_some(Item {
        meta,
        key,
        value,
    })
}

/// Decodes a whole leaf read into `b` (reverse pointer to lock word) whose
/// key room is `kcap` bytes; `None` when torn or garbage.
pub fn decode_leaf(b: &[u8], kcap: usize) -> Option<Leaf<'_>> {
    if b.len() < LEAF_HEAD + LEAF_LOCK {
        return None;
    }
    let (head, _) = LeafHead::read_from_prefix(b).ok()?;
    let item = decode_item(&b[LEAF_META as usize..][..item_len(b.len())], kcap)?;
    let lock = u64::read_from_bytes(&b[lock_offset(b.len())..]).ok()?;
    Some(Leaf {
        rev: GlobalAddr::from_raw(head.rev),
        item,
        lock,
    })
}

pub use dmkit_runtime::keys::tree_key;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn words_round_trip() {
        let h = Header::new(7, NodeType::N16, &[1, 2, 3]);
        assert_eq!(
            (h.depth(), h.ty(), h.prefix_len()),
            (7, Some(NodeType::N16), 3)
        );
        assert_eq!((h.prefix(0), h.prefix(2)), (1, 3));
        let c = h.cut(1);
        assert_eq!((c.depth(), c.prefix_len(), c.prefix(0)), (9, 1, 3));
        assert_eq!(c.ty(), Some(NodeType::N16));
        let a = GlobalAddr::new(3, 64 * 1000);
        let s = Slot::leaf(0xAB, 5, a).unwrap();
        assert!(s.is_leaf() && s.units() == 5 && s.ptr() == a && s.pkey() == 0xAB);
        let n = Slot::node(0, NodeType::N48, a).unwrap();
        assert!(!n.is_leaf() && n.child_type() == Some(NodeType::N48) && !n.is_empty());
        assert_eq!(
            n.with_child_type(NodeType::N256).child_type(),
            Some(NodeType::N256)
        );
        assert_eq!(NodeType::fitting(4), NodeType::N16);
        assert_eq!(NodeType::fitting(47), NodeType::N48);
    }

    #[test]
    fn leaves_round_trip_and_detect_tearing() {
        let mut img = Vec::new();
        encode_leaf(GlobalAddr::new(1, 64), b"key", b"value", 8, 16, &mut img);
        assert_eq!(img.len(), leaf_bytes(8, 16));
        let l = decode_leaf(&img, 8).unwrap();
        assert_eq!(
            (l.item.key, l.item.value, l.item.valid(), l.lock, l.rev),
            (&b"key"[..], &b"value"[..], true, 0, GlobalAddr::new(1, 64))
        );
        // A search's read: from the meta word, without the lock.
        let it = decode_item(&img[8..8 + item_bytes(8, 16)], 8).unwrap();
        assert_eq!(it, l.item);
        assert_eq!(item_bytes(8, 16), item_len(img.len()));
        // Any flipped byte of the item is caught, and so are the lengths.
        for at in [LEAF_HEAD, LEAF_HEAD + 8, LEAF_HEAD + 12, 8, 9] {
            let mut t = img.clone();
            t[at] ^= 1;
            assert!(decode_leaf(&t, 8).is_none(), "byte {at}");
        }
        // The state bits are outside the checksum (they change by CAS).
        let mut dead = img.clone();
        dead[15] &= !0x80;
        assert!(!decode_leaf(&dead, 8).unwrap().item.valid());
    }

    #[test]
    fn a_replaced_mark_carries_its_deadline_and_undoes_exactly() {
        let mut img = Vec::new();
        encode_leaf(GlobalAddr::new(1, 64), b"key", b"value", 8, 16, &mut img);
        let live = decode_leaf(&img, 8).unwrap().item.meta;
        let mark = replaced_mark(live, 0xDEAD_BEEF);
        assert_eq!(mark_deadline(mark), 0xDEAD_BEEF);
        let mut marked = img.clone();
        marked[8..16].copy_from_slice(&mark.to_le_bytes());
        let it = decode_leaf(&marked, 8)
            .expect("a mark reads without its checksum")
            .item;
        assert!(it.replaced() && it.valid() && it.key == b"key" && it.value == b"value");
        assert_eq!(it.unmarked(), live);
    }

    #[test]
    fn the_intent_word_is_an_out_of_place_leafs_last_word() {
        // An out-of-place leaf's value room is its value: the intent word
        // is the image's last word, written 0 with it, past the item.
        let mut img = Vec::new();
        encode_leaf(GlobalAddr::new(1, 64), b"key", b"value!", 8, 6, &mut img);
        let meta = decode_leaf(&img, 8).unwrap().item.meta;
        let at = intent_offset(meta, 8) as usize;
        assert_eq!(at + 8, img.len());
        assert_eq!(img[at..], [0; 8]);
        assert!(at >= LEAF_META as usize + item_bytes(8, 6));
        // Marking the leaf keeps its lengths, so the offset.
        assert_eq!(intent_offset(replaced_mark(meta, 7), 8), at as u64);
        let w = intent_word(GlobalAddr::new(1, 4096), 3).unwrap();
        assert_ne!(w, 0);
        assert_eq!(intent_leaf(w), Some((GlobalAddr::new(1, 4096), 3)));
        assert_eq!(intent_leaf(0), None);
        // A node slot or a slot with a partial key is no intent.
        let node = Slot::node(0, NodeType::N4, GlobalAddr::new(1, 4096)).unwrap();
        assert_eq!(intent_leaf(node.0), None);
        let keyed = Slot::leaf(9, 3, GlobalAddr::new(1, 4096)).unwrap();
        assert_eq!(intent_leaf(keyed.0), None);
    }

    #[test]
    fn tree_keys_keep_order_and_are_prefix_free() {
        let keys: [&[u8]; 6] = [b"a", b"a\0", b"a\0\0", b"ab", b"b", b"\0"];
        let mut sorted = keys.to_vec();
        sorted.sort();
        let mut enc: Vec<Vec<u8>> = sorted
            .iter()
            .map(|k| {
                let mut t = Vec::new();
                tree_key(k, 4, &mut t);
                t
            })
            .collect();
        let before = enc.clone();
        enc.sort();
        assert_eq!(enc, before, "encoding keeps byte order");
        enc.dedup();
        assert_eq!(enc.len(), keys.len(), "encoding is injective");
    }
}
