//! The compute-side cache of internal nodes (SMART radix tree, OSDI'23
//! §4.3), on the index layer's [`NodeCache`].
//!
//! One cache per compute machine, shared by all its workers (the paper's
//! "one shared cache" per compute node; `ArtTree::client_on` hands it
//! out). The store — snapshots by node address under a byte budget,
//! least-recently-used eviction with the root pinned, a sharded read lock
//! that a traversal takes once and never holds across an await — is
//! `dmkit_index::NodeCache`; this module is what the tree keeps in it:
//! [`NodeView`], the snapshot of one internal node as a traversal last read
//! it (address, header, reverse pointer and visible slots). A lookup walks
//! the snapshots from the root along the key under one [`Reader`] — the
//! snapshots' own slots index the cache, as the paper's local ART indexes
//! its entries by key prefix — and clones one `Arc` at the end, none per
//! level.
//!
//! Validation is the tree's and happens when a traversal leaves the cache
//! (the reverse check): the first node read through a cached slot must
//! name the cached node as its parent, sit at the depth the path implies
//! and not be deleted; a leaf read through a cached slot must hold the
//! key, valid. Anything else — including the absence of a key, which a
//! snapshot can never prove — is decided on the node as read now.
//!
//! A snapshot counts 8 bytes per slot it holds plus a fixed overhead
//! against the budget ([`CachedNode::bytes`]).
//!
//! ## Figure 17's two factors
//! The radix-tree paper credits two designs with its cache's efficiency
//! (§5.3, Figure 17: YCSB C, string keys, limited budgets): the
//! *homogeneous adaptive internal node* ("more fine-grained and flexible
//! adaptive nodes ... smaller sizes of cached nodes") and the *ART-indexed
//! cache* ("compared with a normal hash-based cache index, [it] saves
//! memory consumption of index keys without redundant key prefixes
//! stored"). Both are switches here, as in the paper's artifact:
//!
//! - The first is the tree's `NodeLayout` (`crate::layout`): the artifact
//!   keeps homogeneous slots either way and switches the node *sizes*
//!   (`HOMOGENEOUS_INTERNAL_NODE` → NODE_4/8/16/32/64/128/256 instead of
//!   ART's NODE_4/16/48/256); a snapshot holds the slots its type shows,
//!   so the finer sizes cache fewer empty slots (and read fewer) — except
//!   at 33–48 children, where NODE_64 holds more than NODE_48. What a
//!   snapshot costs is what it holds: up to 16 slots inline (192 bytes
//!   whatever the type, so NODE_8 saves nothing over NODE_16), up to 128
//!   with a 256-byte index, more as a 256-entry table. A naive ART's
//!   separate key and pointer arrays are not modelled: the artifact's
//!   baseline does not have them either.
//! - The second is [`CacheIndex`]. With `Art` the snapshots' own slots
//!   index the cache (a lookup walks them from the root by the child
//!   addresses the slots hold), so no key is stored: the paper's local ART
//!   leads to each entry by the key's bytes and holds each shared prefix
//!   once. With `Hash` (the artifact's `NormalCache`, a map from key
//!   prefix to entry) each snapshot carries the key prefix that leads to
//!   it (the tree key up to its arrival position) in a hash set a lookup
//!   probes level by level with the key's prefixes; the prefix's heap
//!   block and the set's entry count against the budget
//!   ([`PREFIX_ENTRY`]), so fewer snapshots fit. The artifact charges the
//!   full key length per entry instead (it emulates the hash index in its
//!   radix cache); dmkit stores the prefix and charges what it stores.
//!   (The address map every snapshot sits in, and the fixed 64 bytes per
//!   snapshot that stand for it, are the same under both.)

use std::borrow::{Borrow, Cow};
use std::collections::HashSet;
use std::hash::{Hash, Hasher};
use std::sync::Arc;

use dmkit_fabric::GlobalAddr;
use dmkit_index::{CachedNode, NodeCache, SideIndex};

use crate::layout::{Header, NodeType, Slot, NODE_SLOTS, SLOT_BYTES};

/// One compute machine's cache of internal nodes: the root is pinned.
pub type Cache = NodeCache<NodeView, PrefixIndex>;

/// A read-locked view of a [`Cache`] for one traversal.
pub type Reader<'a> = dmkit_index::cache::Reader<'a, NodeView, PrefixIndex>;

/// How a cache finds its snapshots (Figure 17's second factor; see the
/// module docs).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[cfg_attr(feature = "cli", derive(clap::ValueEnum))]
pub enum CacheIndex {
    /// By the cached nodes' own slots, walked from the root (the paper's
    /// ART-indexed cache): no key stored.
    #[default]
    Art,
    /// By a hash set keyed by each snapshot's key prefix, which the
    /// snapshot stores (the "normal hash-based cache index").
    Hash,
}

/// Budget bytes of a [`CacheIndex::Hash`] entry besides its prefix's heap
/// block: the prefix's 16-byte pointer in the snapshot and the hash set's
/// 8-byte slot (an `Arc`) with its control byte, at the table's load of
/// 7/8 at most, rounded up.
pub const PREFIX_ENTRY: usize = 32;

/// The heap block glibc's allocator hands out for a request of `n` bytes
/// (8 bytes of header, 16-byte granules, 32 at least).
fn malloc_block(n: usize) -> usize {
    (n + 8).next_multiple_of(16).max(32)
}

/// The [`CacheIndex::Hash`] index: every snapshot that carries a key
/// prefix, found by it. A snapshot without one (the `Art` index's) is not
/// in it.
#[derive(Default)]
pub struct PrefixIndex {
    set: HashSet<ByPrefix>,
}

/// A snapshot in the [`PrefixIndex`], hashed and compared by its prefix.
struct ByPrefix(Arc<NodeView>);

impl ByPrefix {
    fn prefix(&self) -> &[u8] {
        self.0.prefix.as_deref().unwrap_or(&[])
    }
}

impl PartialEq for ByPrefix {
    fn eq(&self, other: &Self) -> bool {
        self.prefix() == other.prefix()
    }
}

impl Eq for ByPrefix {}

impl Hash for ByPrefix {
    fn hash<H: Hasher>(&self, state: &mut H) {
        self.prefix().hash(state)
    }
}

impl Borrow<[u8]> for ByPrefix {
    fn borrow(&self) -> &[u8] {
        self.prefix()
    }
}

impl PrefixIndex {
    /// The snapshot whose key prefix is `prefix`.
    pub fn get(&self, prefix: &[u8]) -> Option<&Arc<NodeView>> {
        self.set.get(prefix).map(|b| &b.0)
    }

    /// Snapshots indexed.
    pub fn len(&self) -> usize {
        self.set.len()
    }

    /// Whether none is.
    pub fn is_empty(&self) -> bool {
        self.set.is_empty()
    }
}

impl SideIndex<NodeView> for PrefixIndex {
    fn added(&mut self, v: &Arc<NodeView>) {
        if v.prefix.is_some() {
            self.set.replace(ByPrefix(v.clone()));
        }
    }

    fn removed(&mut self, v: &Arc<NodeView>) {
        let Some(p) = v.prefix.as_deref() else {
            return;
        };
        // Only this snapshot's entry: another node may have taken the
        // prefix since (a header split puts a new node where it was).
        if self.set.get(p).is_some_and(|b| b.0.addr == v.addr) {
            self.set.remove(p);
        }
    }
}

/// A snapshot of an internal node.
#[derive(Debug, Clone)]
pub struct NodeView {
    /// Remote address of the node.
    pub addr: GlobalAddr,
    /// The node's header when it was read (depth, type, partial keys).
    pub header: Header,
    /// The node's reverse pointer when it was read: its parent's address. A
    /// cached child is used only if this names the node the traversal came from
    /// (the reverse check of SMART, OSDI'23 §4.3).
    pub rev: GlobalAddr,
    /// The visible slots (as many as the header's type says).
    slots: Slots,
    /// With [`CacheIndex::Hash`]: the tree key's bytes before the node
    /// (up to the position it is arrived at), its key in the index.
    prefix: Option<Box<[u8]>>,
}

/// A snapshot's slots: up to 16 inline (in the snapshot's own allocation,
/// one memory access fewer per cached level — most nodes are NODE_4/16),
/// up to 128 on the heap with a byte → slot index (a linear search of 48
/// slots would dominate a cached traversal), more in a byte-indexed table
/// (a lookup is one memory access, not two: the index and the slot it
/// names sit on different cache lines, and the wide nodes of a large tree
/// are the ones not in the CPU's cache).
#[derive(Debug, Clone)]
enum Slots {
    Inline {
        len: u8,
        words: [u64; 16],
    },
    Wide {
        words: Box<[u64]>,
        /// Byte → slot index + 1 (0: none; 255: look further).
        index: Box<[u8; 256]>,
    },
    /// `table[b]`: the slot holding partial key `b`, its partial-key byte
    /// replaced by the slot's index (0: none — a used slot's pointer is
    /// never null); `len` visible slots.
    Direct {
        len: u16,
        table: Box<[u64; 256]>,
    },
}

/// The slot word's bits below its partial key.
const BELOW_PKEY: u64 = (1 << 56) - 1;

/// A byte table's entry for partial key `b` as (slot index, slot word).
fn unpack(b: usize, t: u64) -> (usize, u64) {
    ((t >> 56) as usize, (b as u64) << 56 | (t & BELOW_PKEY))
}

impl NodeView {
    /// A snapshot of the node at `addr` from its header, reverse pointer and
    /// visible slots (as many as the header's type says), indexed for lookup by
    /// partial key.
    pub fn new(addr: GlobalAddr, header: Header, rev: GlobalAddr, slots: Vec<u64>) -> Self {
        let slots = if slots.len() <= 16 {
            let mut words = [0u64; 16];
            words[..slots.len()].copy_from_slice(&slots);
            Slots::Inline {
                len: slots.len() as u8,
                words,
            }
        } else if slots.len() > 128 {
            let mut table = Box::new([0u64; 256]);
            // First slot wins (a well-formed node has one per byte).
            for (i, &w) in slots.iter().enumerate().rev() {
                let s = Slot(w);
                if !s.is_empty() {
                    table[s.pkey() as usize] = (i as u64) << 56 | (w & BELOW_PKEY);
                }
            }
            Slots::Direct {
                len: slots.len() as u16,
                table,
            }
        } else {
            let mut index = Box::new([0u8; 256]);
            // First slot wins (a well-formed node has one per byte).
            for (i, &w) in slots.iter().enumerate().rev() {
                let s = Slot(w);
                if !s.is_empty() {
                    index[s.pkey() as usize] = (i + 1).min(255) as u8;
                }
            }
            Slots::Wide {
                words: slots.into_boxed_slice(),
                index,
            }
        };
        Self {
            addr,
            header,
            rev,
            slots,
            prefix: None,
        }
    }

    /// The same snapshot carrying `prefix` (the tree key's bytes before
    /// the node), its key in a [`CacheIndex::Hash`] index.
    pub fn with_prefix(mut self, prefix: Option<Box<[u8]>>) -> Self {
        self.prefix = prefix;
        self
    }

    /// The key prefix the snapshot carries (hash-indexed caches only).
    pub fn prefix(&self) -> Option<&[u8]> {
        self.prefix.as_deref()
    }

    /// The visible slots, in slot order (rebuilt for a byte-indexed
    /// snapshot: call it once per use).
    pub fn slots(&self) -> Cow<'_, [u64]> {
        match &self.slots {
            Slots::Inline { len, words } => Cow::Borrowed(&words[..*len as usize]),
            Slots::Wide { words, .. } => Cow::Borrowed(words),
            Slots::Direct { len, table } => {
                let mut words = vec![0u64; *len as usize];
                for (b, &t) in table.iter().enumerate() {
                    if t != 0 {
                        let (i, w) = unpack(b, t);
                        words[i] = w;
                    }
                }
                Cow::Owned(words)
            }
        }
    }

    /// The type the snapshot's header names (N4 for garbage).
    pub fn ty(&self) -> NodeType {
        self.header.ty().unwrap_or(NodeType::N4)
    }

    /// Matches the node's partial keys against `tk`, arriving at key
    /// position `e` (partial keys before `e` were matched by the parent —
    /// a header split in progress leaves them here). `Ok(position of the
    /// branching byte)` or `Err(index of the first mismatching partial key)`.
    pub fn match_prefix(&self, e: usize, tk: &[u8]) -> Result<usize, usize> {
        let d = self.header.depth();
        let len = self.header.prefix_len();
        for j in e.saturating_sub(d)..len {
            if tk.get(d + j) != Some(&self.header.prefix(j)) {
                return Err(j);
            }
        }
        Ok(d + len)
    }

    /// The visible slot holding partial key `b`.
    pub fn find(&self, b: u8) -> Option<(usize, Slot)> {
        if let Slots::Direct { table, .. } = &self.slots {
            let t = table[b as usize];
            return (t != 0).then(|| {
                let (i, w) = unpack(b as usize, t);
                (i, Slot(w))
            });
        }
        if let Slots::Wide { words, index } = &self.slots {
            let i = index[b as usize] as usize;
            // Index 255 saturates: fall back to the scan for slot 254+.
            if i > 0 && i < 255 {
                return Some((i - 1, Slot(words[i - 1])));
            }
            if i == 0 {
                return None;
            }
        }
        self.slots()
            .iter()
            .enumerate()
            .map(|(i, &w)| (i, Slot(w)))
            .find(|(_, s)| !s.is_empty() && s.pkey() == b)
    }

    /// Remote address of slot `i`.
    pub fn slot_addr(&self, i: usize) -> GlobalAddr {
        self.addr.add(NODE_SLOTS + (SLOT_BYTES * i) as u64)
    }
}

impl CachedNode for NodeView {
    fn addr(&self) -> GlobalAddr {
        self.addr
    }

    fn bytes(&self) -> usize {
        let slots = match &self.slots {
            Slots::Inline { .. } => 64 + 8 * 16,
            Slots::Wide { words, .. } => 64 + 8 * words.len() + 256,
            Slots::Direct { .. } => 64 + 8 * 256,
        };
        let index = self
            .prefix
            .as_ref()
            .map_or(0, |p| malloc_block(p.len()) + PREFIX_ENTRY);
        slots + index
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The budget counts what a snapshot holds: a NODE_256 evicts more
    /// than a NODE_4, and the root stays however old.
    #[test]
    fn the_root_is_pinned_and_wide_snapshots_count_more() {
        let view = |i: u64, ty: NodeType| {
            std::sync::Arc::new(NodeView::new(
                GlobalAddr::new(0, 64 * i),
                Header::new(0, ty, &[]),
                GlobalAddr::NULL,
                vec![0; ty.slots()],
            ))
        };
        let (n4, n256) = (view(1, NodeType::N4), view(1, NodeType::N256));
        assert!(n256.bytes() > 10 * n4.bytes());
        let root = GlobalAddr::new(0, 64);
        let c = Cache::new(8 * n4.bytes(), Some(root));
        c.put(n4);
        for i in 2..=20 {
            c.put(view(i, NodeType::N4));
        }
        assert!(c.get(root).is_some(), "the root stays");
        c.put(view(30, NodeType::N256));
        assert!(c.get(root).is_some() && c.bytes() <= 8 * view(1, NodeType::N4).bytes());
        assert!(c.reader().get(GlobalAddr::new(0, 64 * 20)).is_none());
    }

    /// Figure 17's accounting: the same nodes cost more under ART's fixed
    /// sizes than under the homogeneous layout's finer ones, and more with
    /// a hash index (which stores each node's key prefix) than without.
    #[test]
    fn fixed_types_and_a_hash_index_charge_more_for_the_same_nodes() {
        use crate::layout::NodeLayout;
        let view = |used: usize, layout: NodeLayout| {
            let ty = layout.fitting(used - 1);
            let mut slots = vec![0u64; ty.slots()];
            for (i, s) in slots.iter_mut().take(used).enumerate() {
                *s = Slot::leaf(i as u8, 1, GlobalAddr::new(0, 64 * (i as u64 + 1)))
                    .unwrap()
                    .0;
            }
            NodeView::new(
                GlobalAddr::new(0, 64),
                Header::new(0, ty, &[]),
                GlobalAddr::NULL,
                slots,
            )
        };
        let (mut fixed, mut fine) = (0, 0);
        // 33–48 children are the exception: NODE_48 against NODE_64 (the
        // artifact's finer sizes are powers of two, without 48).
        assert!(
            view(40, NodeLayout::FixedTypes).bytes() < view(40, NodeLayout::Homogeneous).bytes()
        );
        for used in [3, 5, 17, 30, 60, 100, 200] {
            let (a, b) = (
                view(used, NodeLayout::FixedTypes),
                view(used, NodeLayout::Homogeneous),
            );
            assert!(a.bytes() >= b.bytes(), "{used} children");
            for i in 0..used {
                assert_eq!(a.find(i as u8), b.find(i as u8), "both find child {i}");
            }
            fixed += a.bytes();
            fine += b.bytes();
        }
        assert!(fixed > fine + 2000, "{fixed} vs {fine}");
        // 17 children: NODE_48 against NODE_32; 60: NODE_256 against NODE_64.
        assert_eq!(
            view(17, NodeLayout::FixedTypes).bytes() - view(17, NodeLayout::Homogeneous).bytes(),
            8 * 16
        );
        assert_eq!(view(60, NodeLayout::FixedTypes).bytes(), 64 + 8 * 256);
        assert_eq!(view(60, NodeLayout::Homogeneous).bytes(), 64 + 8 * 64 + 256);
        // The hash index: the prefix's heap block and the set's entry.
        let plain = view(5, NodeLayout::Homogeneous);
        let base = plain.bytes();
        let keyed = plain.with_prefix(Some(vec![7u8; 20].into()));
        assert_eq!(keyed.bytes(), base + 32 + PREFIX_ENTRY);
        assert_eq!(keyed.prefix(), Some(&[7u8; 20][..]));
        // The same budget holds fewer hash-indexed snapshots.
        let fill = |prefixed: bool| {
            let c = Cache::new(20 * base, None);
            for i in 1..=40u64 {
                let v = view(5, NodeLayout::Homogeneous);
                let v = NodeView {
                    addr: GlobalAddr::new(0, 4096 * i),
                    ..v
                };
                let v = if prefixed {
                    v.with_prefix(Some(i.to_be_bytes().into()))
                } else {
                    v
                };
                c.put(std::sync::Arc::new(v));
            }
            c.len()
        };
        assert!(
            fill(true) < fill(false),
            "{} vs {}",
            fill(true),
            fill(false)
        );
    }

    /// The hash index finds a snapshot by its prefix, and dropping a stale
    /// snapshot keeps the entry another node took its prefix with.
    #[test]
    fn the_prefix_index_follows_puts_and_removals() {
        let node = |off: u64, p: &[u8]| {
            std::sync::Arc::new(
                NodeView::new(
                    GlobalAddr::new(0, off),
                    Header::new(p.len(), NodeType::N4, &[]),
                    GlobalAddr::NULL,
                    vec![0; 4],
                )
                .with_prefix(Some(p.into())),
            )
        };
        let c = Cache::new(1 << 20, None);
        c.put(node(64, b"ab"));
        assert_eq!(
            c.reader().side().get(b"ab").map(|v| v.addr),
            Some(GlobalAddr::new(0, 64))
        );
        assert!(c.reader().side().get(b"a").is_none());
        // Another node now arrives at "ab" (a header split): the old
        // snapshot's removal leaves the new entry.
        c.put(node(128, b"ab"));
        c.remove(GlobalAddr::new(0, 64));
        assert_eq!(
            c.reader().side().get(b"ab").map(|v| v.addr),
            Some(GlobalAddr::new(0, 128))
        );
        c.remove(GlobalAddr::new(0, 128));
        assert!(c.reader().side().is_empty());
    }

    #[test]
    fn prefixes_match_from_the_arrival_position() {
        let v = NodeView::new(
            GlobalAddr::new(0, 64),
            Header::new(2, NodeType::N4, &[7, 8, 9]),
            GlobalAddr::NULL,
            vec![
                Slot::leaf(1, 1, GlobalAddr::new(0, 128)).unwrap().0,
                0,
                0,
                0,
            ],
        );
        let mut wide = vec![0u64; 256];
        wide[200] = Slot::leaf(9, 1, GlobalAddr::new(0, 128)).unwrap().0;
        wide[255] = Slot::leaf(3, 1, GlobalAddr::new(0, 192)).unwrap().0;
        let w = NodeView::new(
            GlobalAddr::new(0, 64),
            Header::new(0, NodeType::N256, &[]),
            GlobalAddr::NULL,
            wide.clone(),
        );
        assert_eq!(w.find(9).map(|(i, _)| i), Some(200));
        assert_eq!(w.find(3), Some((255, Slot(wide[255]))));
        assert!(w.find(4).is_none());
        assert_eq!(&*w.slots(), &wide[..], "slot order survives the byte table");
        // A NODE_48-sized snapshot keeps its slots and a byte index.
        let mut mid = vec![0u64; 48];
        mid[47] = Slot::leaf(3, 1, GlobalAddr::new(0, 192)).unwrap().0;
        mid[5] = Slot::leaf(9, 1, GlobalAddr::new(0, 128)).unwrap().0;
        let m = NodeView::new(
            GlobalAddr::new(0, 64),
            Header::new(0, NodeType::N48, &[]),
            GlobalAddr::NULL,
            mid.clone(),
        );
        assert_eq!(m.find(3), Some((47, Slot(mid[47]))));
        assert_eq!(m.find(9), Some((5, Slot(mid[5]))));
        assert_eq!(&*m.slots(), &mid[..]);
        assert_eq!(v.match_prefix(2, &[0, 0, 7, 8, 9, 1]), Ok(5));
        assert_eq!(v.match_prefix(2, &[0, 0, 7, 0, 9, 1]), Err(1));
        // Arriving at 4 (a header split in progress): 7 and 8 are skipped.
        assert_eq!(v.match_prefix(4, &[0, 0, 0, 0, 9, 1]), Ok(5));
        assert_eq!(v.find(1).map(|(i, _)| i), Some(0));
        assert!(v.find(2).is_none());
    }
}
