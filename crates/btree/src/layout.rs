//! Remote layouts of the B-link tree: tree descriptor, node header, slots.
//! Each is a `#[repr(C)]` type ([`DescHead`], [`NodeHead`], [`SlotMeta`])
//! the code encodes and decodes through; the variable parts (fences, tree
//! keys, values, the lock-table array) follow them at offsets the
//! [`Geometry`] derives from the types' sizes.
//!
//! ## Descriptor ([`DescHead`], then the lock tables)
//!
//! ```text
//!  0        8        16        24          32           40       48
//!  +--------+--------+---------+-----------+------------+--------+-----------------
//!  | magic  | root   | max_key | max_value | node_bytes | nlocks | lock table of
//!  +--------+--------+---------+-----------+------------+--------+ each memory node
//!  magic: dmkit_index::Magic ("dmBTRE", layout version)      (nlocks words, raw
//!  root: raw GlobalAddr of the root node (CAS when the tree grows)  GlobalAddr)
//!  max_key: the limit (bits 0..32) | FIXED_KEYS (bit 32: every key is exactly
//!           max_key bytes, tree keys carry no length byte)
//! ```
//!
//! The root leaf a new tree starts with shares the descriptor's chunk,
//! right after it (its size rounded up to 64 bytes).
//!
//! ## Node
//!
//! Every node (leaf or internal) is `node_bytes` long (a multiple of 64;
//! 1 KiB by default) and starts with a [`NodeHead`] and the two fences:
//!
//! ```text
//!  0        8        16        24         32            32+F          32+2F
//!  +--------+--------+---------+----------+-------------+-------------+------
//!  | meta   | info   | sibling | leftmost | lo fence    | hi fence    | slots
//!  +--------+--------+---------+----------+-------------+-------------+------
//!  meta:  version (high 32) | checksum of bytes 8..32+2F (low 32)
//!  info:  level (bits 0..8, leaves 0) | count (8..24, internal: slots in use) |
//!         flags (24..32: bit 0 lo = -inf, bit 1 hi = +inf) | zero (32..64)
//!  sibling, leftmost: raw GlobalAddr (0 = none); leftmost: internal nodes'
//!         child left of their first key
//!  fences: tree keys (F = their length rounded up to 8 bytes: max_key + 1
//!         with the length byte, or max_key when every key is exactly
//!         max_key bytes — `BtreeConfig::fixed_keys`, e.g. 8-byte integers)
//! ```
//!
//! followed by fixed-size slots, `span` of them, each a [`SlotMeta`] word,
//! a tree key and a payload:
//!
//! ```text
//!  0        8             8+F
//!  +--------+-------------+----------------------------------+
//!  | meta   | tree key    | leaf: value (max_value, padded)  |
//!  |        |             | internal: child (8)              |
//!  +--------+-------------+----------------------------------+
//!  meta:  63     62      48 47            32 31               0
//!         +-------+--------+----------------+------------------+
//!         | valid | version| value length   | checksum         |
//!         +-------+--------+----------------+------------------+
//! ```
//!
//! ## Versions: per-entry, not per-cacheline
//!
//! SMART-BT (SMART, ASPLOS'24 §5.2) replaces Sherman's two-level versions
//! with FaRM's per-cacheline versions, because an RNIC need not place a
//! WRITE's bytes in address order, and relies on the RNIC writing one
//! cacheline atomically. dmkit's fabric contract promises less (aligned
//! 8-byte words; the simulator tears larger writes at that granularity), so
//! the version lives in every *slot* and every slot carries a checksum:
//! - A whole-node write (insert into an internal node, split) bumps the node
//!   version and re-seals every slot with it. A reader accepts a node when
//!   the header checksum holds, every slot carries the header's version and
//!   every slot it relies on passes its checksum; otherwise the read was torn
//!   and is retried.
//! - An entry write (leaf insert into an empty slot, update, delete) keeps
//!   the version and re-seals only its slot — the fine-grained write Sherman
//!   and SMART-BT make, with the slot's checksum standing in for the
//!   cacheline's atomicity.
//! - A speculative lookup (SMART-BT) reads one slot and accepts it when its
//!   checksum holds, it is valid and it holds the key.
//!
//! Leaves are unsorted (an insert fills any empty slot, a delete clears the
//! valid bit); internal nodes are sorted and rewritten whole.

use std::mem::{offset_of, size_of};

use dmkit_fabric::GlobalAddr;
use dmkit_index::Magic;
use dmkit_runtime::hash::hash64;
use zerocopy::{FromBytes, Immutable, IntoBytes, KnownLayout};

/// The descriptor's magic: kind and layout version (see
/// [`dmkit_index::Magic`]; version 1 was the untagged `DMKITBT+` word).
pub const DESC_MAGIC: Magic = Magic::new(b"dmBTRE", 2);

/// The fixed part of the tree descriptor, the block the tree's named root
/// points to; the lock-table addresses follow it (`nlocks` words).
#[repr(C)]
#[derive(
    Debug, Clone, Copy, Default, PartialEq, Eq, FromBytes, IntoBytes, KnownLayout, Immutable,
)]
pub struct DescHead {
    /// [`DESC_MAGIC`]'s word.
    pub magic: u64,
    /// The root node (raw `GlobalAddr`; swung by CAS when the tree grows).
    pub root: u64,
    /// The key limit, with [`FIXED_KEYS`].
    pub max_key: u64,
    /// Largest value in bytes, at most [`MAX_VALUE_LIMIT`]; every leaf slot has
    /// room for it.
    pub max_value: u64,
    /// Bytes of every node (a multiple of 64; 1 KiB by default).
    pub node_bytes: u64,
    /// Lock tables that follow: one per memory node.
    pub nlocks: u64,
}
const _: () = assert!(size_of::<DescHead>() == 48);

/// Flag in the descriptor's `max_key` word: fixed-length keys.
pub const FIXED_KEYS: u64 = 1 << 32;
/// Offset of the root word in the descriptor.
pub const DESC_ROOT: u64 = offset_of!(DescHead, root) as u64;
/// Offset of the lock-table addresses in the descriptor.
pub const DESC_LOCKS: usize = size_of::<DescHead>();

/// Bytes of the descriptor of a tree over `nodes` memory nodes.
pub fn desc_bytes(nodes: usize) -> usize {
    DESC_LOCKS + size_of::<u64>() * nodes
}

/// Longest key (its tree key, with the length byte, must fit 255 bytes).
pub const MAX_KEY_LIMIT: usize = 254;
/// Largest value (the slot's length field has 16 bits).
pub const MAX_VALUE_LIMIT: usize = 4096;
/// Largest node: room for Sherman's span-32 leaf of 1 KiB values
/// (33,344 B; the radix-tree paper's largest, OSDI'23 Fig. 18c).
pub const MAX_NODE_BYTES: usize = 64 << 10;
/// Words of each memory node's lock table: 256 KiB, the on-chip memory
/// of a ConnectX-5/6 (Sherman §4.2 keeps its locks there).
pub const LOCK_WORDS: u64 = 1 << 15;

/// The fixed part of a node header (the fences follow it).
#[repr(C)]
#[derive(
    Debug, Clone, Copy, Default, PartialEq, Eq, FromBytes, IntoBytes, KnownLayout, Immutable,
)]
pub struct NodeHead {
    /// version (high 32) | checksum of the header after this word (low 32).
    pub meta: u64,
    /// level (8) | count (16) | flags (8) | zero (32).
    pub info: u64,
    /// The right sibling (raw `GlobalAddr`, 0: none).
    pub sibling: u64,
    /// Internal nodes: the child left of the first key (raw `GlobalAddr`).
    pub leftmost: u64,
}
const _: () = assert!(size_of::<NodeHead>() == 32);

/// Where the fences start in a node: right after its [`NodeHead`].
const FENCES: usize = size_of::<NodeHead>();
/// What the header checksum covers starts after the `meta` word.
const HEAD_SUMMED: usize = offset_of!(NodeHead, info);
const FLAG_LO_INF: u64 = 1;
const FLAG_HI_INF: u64 = 2;

impl NodeHead {
    /// The node version (meta bits 63..32), bumped by every whole-node write.
    pub fn version(&self) -> u32 {
        (self.meta >> 32) as u32
    }
    fn checksum(&self) -> u32 {
        self.meta as u32
    }
    /// The node's level (info bits 7..0): 0 for a leaf.
    pub fn level(&self) -> u8 {
        self.info as u8
    }
    /// Slots in use (info bits 23..8); kept for internal nodes, whose slots are
    /// sorted; 0 in leaves, which are unsorted and scanned whole.
    pub fn count(&self) -> usize {
        ((self.info >> 8) & 0xFFFF) as usize
    }
    fn flags(&self) -> u64 {
        (self.info >> 24) & 0xFF
    }
    fn info_of(level: u8, count: u16, flags: u64) -> u64 {
        level as u64 | (count as u64) << 8 | flags << 24
    }
}

/// A slot's first word: valid (1) | version (15) | value length (16) |
/// checksum of the rest of the slot (32).
#[repr(transparent)]
#[derive(
    Debug, Clone, Copy, Default, PartialEq, Eq, FromBytes, IntoBytes, KnownLayout, Immutable,
)]
pub struct SlotMeta(pub u64);

/// Where a slot's tree key starts: right after its [`SlotMeta`].
const SLOT_KEY: usize = size_of::<SlotMeta>();
const SLOT_VALID: u64 = 1 << 63;
const SLOT_VERSION_SHIFT: u32 = 48;
const SLOT_VERSION_MASK: u64 = 0x7FFF;
const SLOT_VLEN_SHIFT: u32 = 32;
const SLOT_SUM: u64 = 0xFFFF_FFFF;

impl SlotMeta {
    /// An unsealed meta word (checksum 0).
    fn new(valid: bool, version: u32, vlen: usize) -> Self {
        SlotMeta(
            (valid as u64) << 63
                | ((version as u64) & SLOT_VERSION_MASK) << SLOT_VERSION_SHIFT
                | (vlen as u64) << SLOT_VLEN_SHIFT,
        )
    }
    /// Whether the valid bit (63) is set: the slot holds an entry.
    pub fn valid(self) -> bool {
        self.0 & SLOT_VALID != 0
    }
    /// The low 15 bits of the node version the slot was sealed with.
    fn version(self) -> u64 {
        (self.0 >> SLOT_VERSION_SHIFT) & SLOT_VERSION_MASK
    }
    fn value_len(self) -> usize {
        ((self.0 >> SLOT_VLEN_SHIFT) & 0xFFFF) as usize
    }
    /// The word without its checksum (what the checksum is seeded with).
    fn unsealed(self) -> Self {
        SlotMeta(self.0 & !SLOT_SUM)
    }
    /// The word, unsealed, carrying `version` instead.
    fn with_version(self, version: u32) -> Self {
        SlotMeta(
            self.unsealed().0 & !(SLOT_VERSION_MASK << SLOT_VERSION_SHIFT)
                | ((version as u64) & SLOT_VERSION_MASK) << SLOT_VERSION_SHIFT,
        )
    }
}

/// The meta word at the start of `slot`.
fn meta_of(slot: &[u8]) -> SlotMeta {
    SlotMeta::read_from_prefix(slot)
        .expect("a slot holds its meta word")
        .0
}

/// A fence: a tree key or an infinity.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub enum Fence {
    /// Below every key: the lower fence of each level's leftmost node.
    NegInf,
    /// A tree key.
    Key(Vec<u8>),
    /// Above every key: the upper fence of each level's rightmost node.
    PosInf,
}

impl Fence {
    /// Whether `tk` is at or above this (lower) fence.
    pub fn le(&self, tk: &[u8]) -> bool {
        match self {
            Fence::NegInf => true,
            Fence::Key(k) => k.as_slice() <= tk,
            Fence::PosInf => false,
        }
    }
    /// Whether `tk` is below this (upper) fence.
    pub fn gt(&self, tk: &[u8]) -> bool {
        match self {
            Fence::NegInf => false,
            Fence::Key(k) => tk < k.as_slice(),
            Fence::PosInf => true,
        }
    }
}

/// Bytes of a tree key: the key padded to `max_key` plus a length byte, or
/// just the key when every key is exactly `max_key` bytes.
pub fn tree_key_bytes(max_key: usize, fixed_keys: bool) -> usize {
    max_key + usize::from(!fixed_keys)
}

/// The sizes that follow from a tree's key and value limits and node size.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Geometry {
    /// Longest key in bytes, 1..=[`MAX_KEY_LIMIT`].
    pub max_key: usize,
    /// Largest value in bytes, at most [`MAX_VALUE_LIMIT`].
    pub max_value: usize,
    /// Every key is exactly `max_key` bytes: tree keys are the keys.
    pub fixed_keys: bool,
    /// Bytes of a tree key: `max_key + 1` (the length byte last), or
    /// `max_key` with fixed keys.
    pub tk: usize,
    /// Bytes of a tree key field (`tk` padded to 8).
    pub f: usize,
    /// Bytes of a leaf's value field (max_value padded to 8).
    pub v: usize,
    /// Bytes of every node (a multiple of 64).
    pub node_bytes: usize,
    /// Bytes of the header: [`NodeHead`] and two fences.
    pub head: usize,
    /// Bytes of a leaf slot: meta word, tree key field, value field.
    pub leaf_slot: usize,
    /// Bytes of an internal slot: meta word, tree key field, child pointer.
    pub inner_slot: usize,
    /// Slots per leaf: what fits in `node_bytes` after the header (at least 2).
    pub leaf_span: usize,
    /// Slots per internal node: what fits in `node_bytes` after the header (at
    /// least 3).
    pub inner_span: usize,
}

impl Geometry {
    /// The geometry of `node_bytes`-long nodes, or why there is none.
    pub fn new(
        max_key: usize,
        max_value: usize,
        fixed_keys: bool,
        node_bytes: usize,
    ) -> Result<Self, String> {
        if max_key == 0 || max_key > MAX_KEY_LIMIT {
            return Err(format!("max_key {max_key} must be in 1..={MAX_KEY_LIMIT}"));
        }
        if max_value > MAX_VALUE_LIMIT {
            return Err(format!(
                "max_value {max_value} must be at most {MAX_VALUE_LIMIT}"
            ));
        }
        if !node_bytes.is_multiple_of(64) {
            return Err(format!("node size {node_bytes} is not a multiple of 64"));
        }
        if node_bytes > MAX_NODE_BYTES {
            return Err(format!(
                "node size {node_bytes} exceeds the largest, {MAX_NODE_BYTES} B"
            ));
        }
        let tk = tree_key_bytes(max_key, fixed_keys);
        let f = tk.next_multiple_of(8);
        let v = max_value.next_multiple_of(8);
        let head = FENCES + 2 * f;
        let leaf_slot = SLOT_KEY + f + v;
        let inner_slot = SLOT_KEY + f + size_of::<u64>();
        let room = node_bytes.saturating_sub(head);
        let g = Geometry {
            max_key,
            max_value,
            fixed_keys,
            tk,
            f,
            v,
            node_bytes,
            head,
            leaf_slot,
            inner_slot,
            leaf_span: room / leaf_slot,
            inner_span: room / inner_slot,
        };
        if g.leaf_span < 2 || g.inner_span < 3 {
            return Err(format!(
                "nodes of {node_bytes} B hold {} leaf entries of {leaf_slot} B and {} \
                 internal entries: need at least 2 and 3",
                g.leaf_span, g.inner_span
            ));
        }
        Ok(g)
    }

    /// The smallest node size (multiple of 64) holding `span` leaf entries.
    pub fn node_bytes_for_span(
        max_key: usize,
        max_value: usize,
        fixed_keys: bool,
        span: usize,
    ) -> usize {
        let f = tree_key_bytes(max_key, fixed_keys).next_multiple_of(8);
        let v = max_value.next_multiple_of(8);
        (FENCES + 2 * f + span * (SLOT_KEY + f + v)).next_multiple_of(64)
    }

    /// Bytes of a leaf slot (`leaf`) or of an internal slot.
    pub fn slot_bytes(&self, leaf: bool) -> usize {
        if leaf {
            self.leaf_slot
        } else {
            self.inner_slot
        }
    }
    /// Slots per leaf (`leaf`) or per internal node.
    pub fn span(&self, leaf: bool) -> usize {
        if leaf {
            self.leaf_span
        } else {
            self.inner_span
        }
    }
    /// Offset of slot `i` in a node.
    pub fn slot_off(&self, leaf: bool, i: usize) -> usize {
        self.head + i * self.slot_bytes(leaf)
    }
    /// Offset of a slot's payload (a leaf's value, an internal child).
    fn payload(&self) -> usize {
        SLOT_KEY + self.f
    }
    /// Where the lower and the upper fence lie in a node.
    fn lo_at(&self) -> std::ops::Range<usize> {
        FENCES..FENCES + self.tk
    }
    fn hi_at(&self) -> std::ops::Range<usize> {
        FENCES + self.f..FENCES + self.f + self.tk
    }
}

/// The header fields of a node to build.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HeadFields {
    /// Node version; whole-node writes bump it and seal every slot with its low
    /// 15 bits.
    pub version: u32,
    /// 0 for a leaf, its parent's level plus one above.
    pub level: u8,
    /// Internal nodes: slots in use; leaves: 0.
    pub count: u16,
    /// The right sibling (null: none).
    pub sibling: GlobalAddr,
    /// Internal nodes: the child left of the first key (null for a leaf).
    pub leftmost: GlobalAddr,
    /// Lower fence (inclusive).
    pub lo: Fence,
    /// Upper fence (exclusive).
    pub hi: Fence,
}

/// A node image in local memory (read or being built), its header decoded.
#[derive(Debug, Clone)]
pub struct Node<'a> {
    /// The tree's geometry, which gives every offset in the image.
    pub g: &'a Geometry,
    /// The image's bytes, at least `g.node_bytes` long.
    pub b: &'a [u8],
    head: NodeHead,
}

/// Why a node image was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Torn {
    /// Header checksum.
    Header,
    /// A slot of another version, or a slot checksum.
    Slot(usize),
}

impl<'a> Node<'a> {
    /// A view of the node image `b` (its header decoded, nothing checked: see
    /// [`Node::check`]).
    pub fn new(g: &'a Geometry, b: &'a [u8]) -> Self {
        debug_assert!(b.len() >= g.node_bytes);
        let (head, _) = NodeHead::read_from_prefix(b).expect("a node image holds its header");
        Node { g, b, head }
    }
    /// The node version from the header's meta word.
    pub fn version(&self) -> u32 {
        self.head.version()
    }
    /// The node's level: 0 for a leaf.
    pub fn level(&self) -> u8 {
        self.head.level()
    }
    /// Whether the node is a leaf (level 0).
    pub fn is_leaf(&self) -> bool {
        self.level() == 0
    }
    /// The header's slot count (internal nodes; 0 in leaves).
    pub fn count(&self) -> usize {
        self.head.count()
    }
    /// The right sibling (null: the rightmost node of its level).
    pub fn sibling(&self) -> GlobalAddr {
        GlobalAddr::from_raw(self.head.sibling)
    }
    /// Internal nodes: the child left of the first key.
    pub fn leftmost(&self) -> GlobalAddr {
        GlobalAddr::from_raw(self.head.leftmost)
    }
    /// The lower fence (allocates a copy of the key).
    pub fn lo(&self) -> Fence {
        if self.head.flags() & FLAG_LO_INF != 0 {
            Fence::NegInf
        } else {
            Fence::Key(self.b[self.g.lo_at()].to_vec())
        }
    }
    /// The upper fence (allocates a copy of the key).
    pub fn hi(&self) -> Fence {
        if self.head.flags() & FLAG_HI_INF != 0 {
            Fence::PosInf
        } else {
            Fence::Key(self.b[self.g.hi_at()].to_vec())
        }
    }
    /// Whether `tk` lies below the upper fence (without allocating).
    pub fn below_hi(&self, tk: &[u8]) -> bool {
        self.head.flags() & FLAG_HI_INF != 0 || tk < &self.b[self.g.hi_at()]
    }
    /// Whether `tk` lies at or above the lower fence.
    pub fn above_lo(&self, tk: &[u8]) -> bool {
        self.head.flags() & FLAG_LO_INF != 0 || tk >= &self.b[self.g.lo_at()]
    }

    fn slot(&self, i: usize) -> &'a [u8] {
        let leaf = self.is_leaf();
        let o = self.g.slot_off(leaf, i);
        &self.b[o..o + self.g.slot_bytes(leaf)]
    }
    /// The meta word of slot `i` (unchecked).
    pub fn slot_meta(&self, i: usize) -> SlotMeta {
        meta_of(self.slot(i))
    }
    /// Whether slot `i`'s valid bit is set (its checksum unchecked).
    pub fn slot_valid(&self, i: usize) -> bool {
        self.slot_meta(i).valid()
    }
    /// The tree key in slot `i`.
    pub fn slot_key(&self, i: usize) -> &'a [u8] {
        &self.slot(i)[SLOT_KEY..SLOT_KEY + self.g.tk]
    }
    /// A leaf slot's value.
    pub fn slot_value(&self, i: usize) -> &'a [u8] {
        slot_value(self.g, self.slot(i))
    }
    /// An internal slot's child.
    pub fn slot_child(&self, i: usize) -> GlobalAddr {
        let (raw, _) = u64::read_from_prefix(&self.slot(i)[self.g.payload()..])
            .expect("an internal slot holds its child");
        GlobalAddr::from_raw(raw)
    }

    /// Checks the header checksum and that every slot carries this node's
    /// version; with `slots`, also every slot's checksum.
    pub fn check(&self, slots: bool) -> Result<(), Torn> {
        if self.head.checksum() != head_checksum(self.g, self.b, self.version()) {
            return Err(Torn::Header);
        }
        let leaf = self.is_leaf();
        let v = (self.version() as u64) & SLOT_VERSION_MASK;
        for i in 0..self.g.span(leaf) {
            if self.slot_meta(i).version() != v {
                return Err(Torn::Slot(i));
            }
            if slots && !slot_ok(self.slot(i)) {
                return Err(Torn::Slot(i));
            }
        }
        Ok(())
    }

    /// Checks one slot's checksum.
    pub fn check_slot(&self, i: usize) -> bool {
        slot_ok(self.slot(i))
    }

    /// The valid slot holding `tk` (leaves; slots not checksummed).
    pub fn find(&self, tk: &[u8]) -> Option<usize> {
        (0..self.g.span(self.is_leaf())).find(|&i| self.slot_valid(i) && self.slot_key(i) == tk)
    }

    /// The child to follow for `tk` (internal nodes: the last key ≤ `tk`,
    /// else the leftmost child).
    pub fn child_for(&self, tk: &[u8]) -> GlobalAddr {
        let n = self.count().min(self.g.inner_span);
        // Binary search over the sorted, valid prefix of slots.
        let (mut lo, mut hi) = (0, n);
        while lo < hi {
            let mid = (lo + hi) / 2;
            if self.slot_key(mid) <= tk {
                lo = mid + 1;
            } else {
                hi = mid;
            }
        }
        if lo == 0 {
            self.leftmost()
        } else {
            self.slot_child(lo - 1)
        }
    }

    /// An internal node's entries (key, child), in order.
    pub fn inner_entries(&self) -> Vec<(Vec<u8>, GlobalAddr)> {
        (0..self.count().min(self.g.inner_span))
            .map(|i| (self.slot_key(i).to_vec(), self.slot_child(i)))
            .collect()
    }

    /// A leaf's valid entries (tree key, value), unordered.
    pub fn leaf_entries(&self) -> Vec<(Vec<u8>, Vec<u8>)> {
        (0..self.g.leaf_span)
            .filter(|&i| self.slot_valid(i))
            .map(|i| (self.slot_key(i).to_vec(), self.slot_value(i).to_vec()))
            .collect()
    }
}

fn slot_value<'s>(g: &Geometry, slot: &'s [u8]) -> &'s [u8] {
    let len = meta_of(slot).value_len();
    let at = g.payload();
    &slot[at..at + len.min(g.v)]
}

/// A leaf slot read on its own (speculative lookup): its tree key and
/// value, if its checksum holds and it is valid.
pub fn leaf_slot_entry<'s>(g: &Geometry, slot: &'s [u8]) -> Option<(&'s [u8], &'s [u8])> {
    (slot.len() >= g.leaf_slot && slot_ok(&slot[..g.leaf_slot]) && meta_of(slot).valid())
        .then(|| (&slot[SLOT_KEY..SLOT_KEY + g.tk], slot_value(g, slot)))
}

fn head_checksum(g: &Geometry, b: &[u8], version: u32) -> u32 {
    hash64(&b[HEAD_SUMMED..g.head], version as u64 ^ 0x5EED_B7EE) as u32
}

fn slot_sum(slot: &[u8], unsealed: SlotMeta) -> u32 {
    hash64(&slot[SLOT_KEY..], unsealed.0) as u32
}

fn slot_ok(slot: &[u8]) -> bool {
    let m = meta_of(slot);
    m.0 as u32 == slot_sum(slot, m.unsealed())
}

/// Seals `slot` with meta word `m` (its checksum filled in).
fn seal(slot: &mut [u8], m: SlotMeta) {
    let sealed = SlotMeta(m.0 | slot_sum(slot, m) as u64);
    sealed
        .write_to_prefix(slot)
        .expect("a slot holds its meta word");
}

/// Writes a header into `b` (the node image) and seals it.
pub fn put_head(g: &Geometry, b: &mut [u8], h: &HeadFields) {
    let mut flags = 0;
    b[FENCES..g.head].fill(0);
    match &h.lo {
        Fence::NegInf => flags |= FLAG_LO_INF,
        Fence::Key(k) => b[FENCES..FENCES + k.len()].copy_from_slice(k),
        Fence::PosInf => unreachable!("a lower fence is never +inf"),
    }
    match &h.hi {
        Fence::PosInf => flags |= FLAG_HI_INF,
        Fence::Key(k) => b[FENCES + g.f..FENCES + g.f + k.len()].copy_from_slice(k),
        Fence::NegInf => unreachable!("an upper fence is never -inf"),
    }
    let mut head = NodeHead {
        meta: 0,
        info: NodeHead::info_of(h.level, h.count, flags),
        sibling: h.sibling.raw(),
        leftmost: h.leftmost.raw(),
    };
    head.write_to_prefix(b)
        .expect("a node image holds its header");
    head.meta = (h.version as u64) << 32 | head_checksum(g, b, h.version) as u64;
    head.write_to_prefix(b)
        .expect("a node image holds its header");
}

/// Builds slot bytes (meta, tree key, payload) into `out` (cleared first):
/// `payload` is a leaf's value or an internal slot's child (8 bytes).
pub fn build_slot(
    g: &Geometry,
    leaf: bool,
    valid: bool,
    version: u32,
    tk: &[u8],
    payload: &[u8],
    out: &mut Vec<u8>,
) {
    out.clear();
    out.resize(g.slot_bytes(leaf), 0);
    out[SLOT_KEY..SLOT_KEY + tk.len()].copy_from_slice(tk);
    let p = g.payload();
    out[p..p + payload.len()].copy_from_slice(payload);
    let vlen = if leaf {
        payload.len()
    } else {
        size_of::<u64>()
    };
    seal(out, SlotMeta::new(valid, version, vlen));
}

/// Re-seals slot `i` of a node image with `version` (valid bit and content
/// kept).
pub fn reseal_slot(g: &Geometry, b: &mut [u8], leaf: bool, i: usize, version: u32) {
    let o = g.slot_off(leaf, i);
    let s = &mut b[o..o + g.slot_bytes(leaf)];
    let m = meta_of(s).with_version(version);
    seal(s, m);
}

/// Builds a whole node image: `entries` are (tree key, payload) placed in
/// slots `0..`; the other slots are empty; every slot sealed with `version`.
pub fn build_node<'e>(
    g: &Geometry,
    h: &HeadFields,
    entries: impl Iterator<Item = (&'e [u8], &'e [u8])>,
    out: &mut Vec<u8>,
) {
    let leaf = h.level == 0;
    out.clear();
    out.resize(g.node_bytes, 0);
    put_head(g, out, h);
    let mut slot = Vec::new();
    let mut i = 0;
    for (k, p) in entries {
        build_slot(g, leaf, true, h.version, k, p, &mut slot);
        let o = g.slot_off(leaf, i);
        out[o..o + slot.len()].copy_from_slice(&slot);
        i += 1;
    }
    assert!(i <= g.span(leaf), "{i} entries exceed the node's span");
    for j in i..g.span(leaf) {
        build_slot(g, leaf, false, h.version, &[], &[], &mut slot);
        let o = g.slot_off(leaf, j);
        out[o..o + slot.len()].copy_from_slice(&slot);
    }
}

/// The remote address of slot `i` of the node at `node`.
pub fn slot_addr(g: &Geometry, node: GlobalAddr, leaf: bool, i: usize) -> GlobalAddr {
    node.add(g.slot_off(leaf, i) as u64)
}

#[cfg(test)]
mod tests {
    use super::*;
    use dmkit_runtime::keys::tree_key;

    fn tk(k: &[u8]) -> Vec<u8> {
        let mut v = Vec::new();
        tree_key(k, 8, &mut v);
        v
    }

    /// Sherman's span-32 node at the radix-tree paper's key and value
    /// sizes (OSDI'23 Fig. 18b–c; fixed-length integer keys): the node
    /// (what a search reads) grows with the item; 254-byte keys take a
    /// 256-byte field, as 256-byte keys would.
    #[test]
    fn span_32_nodes_grow_with_the_key_and_value() {
        for (k, v, slot, nb) in [
            (8, 8, 24, 832),
            (16, 8, 32, 1088),
            (32, 8, 48, 1664),
            (64, 8, 80, 2752),
            (128, 8, 144, 4928),
            (254, 8, 272, 9280),
            (8, 256, 272, 8768),
            (8, 512, 528, 16_960),
            (8, 1024, 1040, 33_344),
        ] {
            let bytes = Geometry::node_bytes_for_span(k, v, true, 32);
            assert_eq!(bytes, nb, "key {k}, value {v}");
            let g = Geometry::new(k, v, true, bytes).unwrap();
            assert_eq!((g.leaf_slot, g.leaf_span), (slot, 32), "key {k}, value {v}");
            assert_eq!(g.head, size_of::<NodeHead>() + 2 * k.next_multiple_of(8));
        }
        assert!(Geometry::new(8, 1024, true, MAX_NODE_BYTES + 64).is_err());
    }

    #[test]
    fn nodes_round_trip_and_tears_are_seen() {
        let g = Geometry::new(8, 8, false, 1024).unwrap();
        assert_eq!((g.f, g.head, g.leaf_slot, g.leaf_span), (16, 64, 32, 30));
        let h = HeadFields {
            version: 7,
            level: 0,
            count: 0,
            sibling: GlobalAddr::new(1, 4096),
            leftmost: GlobalAddr::NULL,
            lo: Fence::Key(tk(b"b")),
            hi: Fence::PosInf,
        };
        let (a, b) = (tk(b"c"), tk(b"d"));
        let mut img = Vec::new();
        build_node(
            &g,
            &h,
            [(a.as_slice(), &b"one"[..]), (b.as_slice(), &b"two"[..])].into_iter(),
            &mut img,
        );
        let n = Node::new(&g, &img);
        assert_eq!(n.check(true), Ok(()));
        assert_eq!((n.version(), n.level(), n.sibling()), (7, 0, h.sibling));
        assert_eq!((n.lo(), n.hi()), (h.lo.clone(), Fence::PosInf));
        assert_eq!(n.find(&b).map(|i| n.slot_value(i)), Some(&b"two"[..]));
        assert_eq!(n.find(&tk(b"e")), None);
        assert!(n.above_lo(&a) && !n.above_lo(&tk(b"a")) && n.below_hi(&a));
        // A slot of another version: torn.
        let mut t = img.clone();
        reseal_slot(&g, &mut t, true, 3, 8);
        assert_eq!(Node::new(&g, &t).check(false), Err(Torn::Slot(3)));
        // A torn word inside a slot: only the checksum sees it.
        let mut t = img.clone();
        t[g.slot_off(true, 1) + 24] ^= 1;
        assert_eq!(Node::new(&g, &t).check(false), Ok(()));
        assert_eq!(Node::new(&g, &t).check(true), Err(Torn::Slot(1)));
        // A torn header.
        let mut t = img.clone();
        t[16] ^= 1;
        assert_eq!(Node::new(&g, &t).check(false), Err(Torn::Header));
    }

    #[test]
    fn internal_nodes_route_by_their_sorted_keys() {
        let g = Geometry::new(8, 8, false, 1024).unwrap();
        let h = HeadFields {
            version: 1,
            level: 1,
            count: 2,
            sibling: GlobalAddr::NULL,
            leftmost: GlobalAddr::new(0, 64),
            lo: Fence::NegInf,
            hi: Fence::PosInf,
        };
        let (k1, k2) = (tk(b"g"), tk(b"p"));
        let (c1, c2) = (128u64.to_le_bytes(), 192u64.to_le_bytes());
        let mut img = Vec::new();
        build_node(
            &g,
            &h,
            [(k1.as_slice(), &c1[..]), (k2.as_slice(), &c2[..])].into_iter(),
            &mut img,
        );
        let n = Node::new(&g, &img);
        assert_eq!(n.check(true), Ok(()));
        assert_eq!(n.child_for(&tk(b"a")).raw(), GlobalAddr::new(0, 64).raw());
        assert_eq!(n.child_for(&tk(b"g")).raw(), 128);
        assert_eq!(n.child_for(&tk(b"o")).raw(), 128);
        assert_eq!(n.child_for(&tk(b"z")).raw(), 192);
    }

    #[test]
    fn geometry_refuses_nodes_too_small() {
        assert!(Geometry::new(8, 8, false, 100).is_err());
        assert!(Geometry::new(8, 512, false, 1024).is_err());
        assert!(Geometry::new(0, 8, false, 1024).is_err());
        let n = Geometry::node_bytes_for_span(8, 88, false, 32);
        let g = Geometry::new(8, 88, false, n).unwrap();
        assert_eq!(g.leaf_span, 32);
    }

    /// Fixed 8-byte keys drop the length byte: an 8-byte key field instead
    /// of 16, so a span-32 leaf of 8-byte values shrinks from 1,088 B to
    /// 832 B (Sherman's own is 623 B: 18-byte entries).
    #[test]
    fn fixed_keys_need_no_length_byte() {
        let var = Geometry::new(8, 8, false, Geometry::node_bytes_for_span(8, 8, false, 32));
        let fixed = Geometry::new(8, 8, true, Geometry::node_bytes_for_span(8, 8, true, 32));
        let (var, fixed) = (var.unwrap(), fixed.unwrap());
        assert_eq!(
            (var.tk, var.f, var.leaf_slot, var.node_bytes),
            (9, 16, 32, 1088)
        );
        assert_eq!(
            (fixed.tk, fixed.f, fixed.leaf_slot, fixed.node_bytes),
            (8, 8, 24, 832)
        );
        assert!(fixed.leaf_span >= 32 && var.leaf_span >= 32);
        // Nodes work the same with 8-byte tree keys.
        let h = HeadFields {
            version: 3,
            level: 0,
            count: 0,
            sibling: GlobalAddr::NULL,
            leftmost: GlobalAddr::NULL,
            lo: Fence::Key(5u64.to_be_bytes().to_vec()),
            hi: Fence::Key(9u64.to_be_bytes().to_vec()),
        };
        let (a, b) = (6u64.to_be_bytes(), 8u64.to_be_bytes());
        let mut img = Vec::new();
        build_node(
            &fixed,
            &h,
            [(&a[..], &b"six"[..]), (&b[..], &b"eight"[..])].into_iter(),
            &mut img,
        );
        let n = Node::new(&fixed, &img);
        assert_eq!(n.check(true), Ok(()));
        assert_eq!((n.lo(), n.hi()), (h.lo.clone(), h.hi.clone()));
        assert_eq!(n.find(&b).map(|i| n.slot_value(i)), Some(&b"eight"[..]));
        assert!(n.above_lo(&a) && n.below_hi(&b) && !n.below_hi(&9u64.to_be_bytes()));
    }
}
