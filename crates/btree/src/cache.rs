//! The compute-side caches, one of each per compute machine and shared by
//! its clients: snapshots of internal nodes under a byte budget (Sherman's
//! index cache, one per compute server) in the index layer's
//! [`NodeCache`], validated by the tree's rule — fence keys — when a
//! traversal leaves them; and SMART-BT's speculative-lookup table, key →
//! remote slot address.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use dmkit_fabric::GlobalAddr;
use dmkit_index::{CachedNode, NodeCache, SideIndex};
use dmkit_runtime::hash::hash64;

use crate::layout::{Fence, Node};

/// What a traversal keeps of an internal node (or, uncached, of a leaf).
#[derive(Debug, Clone)]
pub struct Snapshot {
    /// Remote address of the node.
    pub addr: GlobalAddr,
    /// Level of the node: 0 for a leaf, its parents 1, and so on up to the
    /// root.
    pub level: u8,
    /// Lower fence: the node holds tree keys `>= lo`.
    pub lo: Fence,
    /// Upper fence: the node holds tree keys `< hi`.
    pub hi: Fence,
    /// The right sibling (null for the rightmost node of its level), the B-link
    /// pointer a traversal follows when a key is at or above `hi`.
    pub sibling: GlobalAddr,
    /// Internal nodes: the child for tree keys below `keys[0]`.
    pub leftmost: GlobalAddr,
    /// Internal nodes: the separator tree keys, ascending (empty for a leaf).
    pub keys: Vec<Vec<u8>>,
    /// Internal nodes: `children[i]` holds the tree keys from `keys[i]` up to
    /// the next key.
    pub children: Vec<GlobalAddr>,
}

impl Snapshot {
    /// The snapshot of node image `n`, read from `addr` (a leaf keeps only its
    /// header fields).
    pub fn of(addr: GlobalAddr, n: &Node<'_>) -> Self {
        let (keys, children) = if n.is_leaf() {
            (Vec::new(), Vec::new())
        } else {
            n.inner_entries().into_iter().unzip()
        };
        Snapshot {
            addr,
            level: n.level(),
            lo: n.lo(),
            hi: n.hi(),
            sibling: n.sibling(),
            leftmost: n.leftmost(),
            keys,
            children,
        }
    }

    /// Whether `tk` is in `[lo, hi)`.
    pub fn covers(&self, tk: &[u8]) -> bool {
        self.lo.le(tk) && self.hi.gt(tk)
    }

    /// The child for `tk`: the last key ≤ `tk`, else the leftmost child.
    pub fn child_for(&self, tk: &[u8]) -> GlobalAddr {
        let i = self.keys.partition_point(|k| k.as_slice() <= tk);
        if i == 0 {
            self.leftmost
        } else {
            self.children[i - 1]
        }
    }
}

/// The machine's cache of internal nodes: the index layer's byte-budget
/// [`NodeCache`] with the level-1 snapshots indexed by lower fence.
pub type InnerCache = NodeCache<Snapshot, Level1>;

impl CachedNode for Snapshot {
    fn addr(&self) -> GlobalAddr {
        self.addr
    }
    fn bytes(&self) -> usize {
        96 + self.keys.iter().map(|k| k.len() + 32).sum::<usize>()
    }
}

/// The level-1 snapshots (parents of leaves) by lower fence, so a warm
/// lookup finds its leaf without a remote read. Lower fences never change
/// and no two live nodes of a level share one, so a fence names one node.
#[derive(Default)]
pub struct Level1(BTreeMap<Fence, GlobalAddr>);

impl SideIndex<Snapshot> for Level1 {
    fn added(&mut self, s: &Arc<Snapshot>) {
        if s.level == 1 {
            self.0.insert(s.lo.clone(), s.addr);
        }
    }
    fn removed(&mut self, s: &Arc<Snapshot>) {
        if s.level == 1 && self.0.get(&s.lo) == Some(&s.addr) {
            self.0.remove(&s.lo);
        }
    }
}

/// The level-1 snapshot covering `tk`, marked used.
pub fn parent_of_leaf(cache: &InnerCache, tk: &[u8]) -> Option<Arc<Snapshot>> {
    let r = cache.reader();
    let (_, a) = r.side().0.range(..=Fence::Key(tk.to_vec())).next_back()?;
    let s = r.get_touch(*a)?;
    s.covers(tk).then(|| s.clone())
}

/// SMART-BT's speculative-lookup table: tree key → address of the leaf
/// slot that last held it, one per compute machine (its clients share it,
/// as the paper's compute blade does). Two-way set-associative by a hash
/// of the key, which is also kept as a tag: no keys are stored, a conflict
/// only evicts, and a wrong guess costs nothing in correctness — the
/// speculative read checks the key it finds in the slot. Entries are pairs
/// of relaxed atomic words; a reader that sees one put's tag with another's
/// address just guesses wrong.
pub struct SpecCache {
    /// (tag, slot address) word pairs in sets of two; tag 0 = empty.
    words: Vec<AtomicU64>,
    sets: usize,
}

impl SpecCache {
    /// A table of about `cap` entries (rounded up to a power of two; 0: off).
    pub fn new(cap: usize) -> Self {
        let n = if cap == 0 {
            0
        } else {
            cap.next_power_of_two().max(2)
        };
        Self {
            words: (0..2 * n).map(|_| AtomicU64::new(0)).collect(),
            sets: n / 2,
        }
    }
    /// The set's first way and the key's tag.
    fn at(&self, tk: &[u8]) -> Option<(usize, u64)> {
        if self.words.is_empty() {
            return None;
        }
        let h = hash64(tk, 0x5BEC) | 1;
        Some((2 * ((h >> 20) as usize & (self.sets - 1)), h))
    }
    fn tag(&self, way: usize) -> u64 {
        self.words[2 * way].load(Ordering::Relaxed)
    }
    /// The leaf-slot address last recorded for tree key `tk`, if its set still
    /// holds it (a guess: the speculative read checks the key it finds).
    pub fn get(&self, tk: &[u8]) -> Option<GlobalAddr> {
        let (i, h) = self.at(tk)?;
        (i..i + 2)
            .find(|&w| self.tag(w) == h)
            .map(|w| GlobalAddr::from_raw(self.words[2 * w + 1].load(Ordering::Relaxed)))
    }
    /// Records that tree key `tk` lives in the leaf slot at `slot`, evicting
    /// one of its set's two ways if both are taken.
    pub fn put(&self, tk: &[u8], slot: GlobalAddr) {
        let Some((i, h)) = self.at(tk) else {
            return;
        };
        let w = (i..i + 2)
            .find(|&w| self.tag(w) == h)
            .or_else(|| (i..i + 2).find(|&w| self.tag(w) == 0))
            // Both taken: the hash picks the victim.
            .unwrap_or(i + ((h >> 8) as usize & 1));
        self.words[2 * w].store(h, Ordering::Relaxed);
        self.words[2 * w + 1].store(slot.raw(), Ordering::Relaxed);
    }
    /// Forgets tree key `tk` (after a delete, or a guess that proved wrong).
    pub fn remove(&self, tk: &[u8]) {
        if let Some((i, h)) = self.at(tk) {
            for w in i..i + 2 {
                if self.tag(w) == h {
                    self.words[2 * w].store(0, Ordering::Relaxed);
                }
            }
        }
    }
    /// Entries held (counts the table; for reports).
    pub fn len(&self) -> usize {
        (0..self.words.len() / 2)
            .filter(|&w| self.tag(w) != 0)
            .count()
    }
    /// Whether no entry is held (always, for a table of capacity 0).
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}
