//! The compute-side cache of internal nodes (SMART §4.3).
//!
//! One cache per compute machine, shared by all its workers (the paper's
//! "one shared cache" per compute node; `ArtTree::client_on` hands it
//! out, and it locks itself: traversals share a read lock, never held
//! across an await). Each entry is
//! the snapshot of one internal node as a traversal last read it: its address, header, reverse pointer and visible slots. Entries are
//! found by node address, and a lookup walks them from the root along the
//! key — the snapshots' own slots index the cache, as the paper's local ART
//! indexes its entries by key prefix. Entries are `Arc`s: evicting or
//! replacing one never frees a snapshot a task is still reading.
//!
//! Validation happens when a traversal leaves the cache (the reverse
//! check): the first node read through a cached slot must name the cached
//! node as its parent, sit at the depth the path implies and not be
//! deleted; a leaf read through a cached slot must hold the key, valid.
//! Anything else — including the absence of a key, which a snapshot can
//! never prove — is decided on the node as read now.
//!
//! The budget counts snapshot bytes (8 per slot plus a fixed overhead);
//! when it is exceeded, the least recently used eighth is evicted (the root
//! stays).

use std::borrow::Cow;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use crossbeam_utils::sync::{ShardedLock, ShardedLockReadGuard, ShardedLockWriteGuard};

use dmkit_fabric::GlobalAddr;
use dmkit_runtime::hash::IntMap;

use crate::layout::{Header, NodeType, Slot, NODE_SLOTS};

/// A snapshot of an internal node.
#[derive(Debug, Clone)]
pub struct NodeView {
    pub addr: GlobalAddr,
    pub header: Header,
    pub rev: GlobalAddr,
    /// The visible slots (as many as the header's type says).
    slots: Slots,
}

/// A snapshot's slots: up to 16 inline (in the snapshot's own allocation,
/// one memory access fewer per cached level — most nodes are NODE_4/16),
/// up to 48 on the heap with a byte → slot index (a linear search of 48
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
    pub fn new(addr: GlobalAddr, header: Header, rev: GlobalAddr, slots: Vec<u64>) -> Self {
        let slots = if slots.len() <= 16 {
            let mut words = [0u64; 16];
            words[..slots.len()].copy_from_slice(&slots);
            Slots::Inline {
                len: slots.len() as u8,
                words,
            }
        } else if slots.len() > 48 {
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
        }
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
        self.addr.add(NODE_SLOTS + 8 * i as u64)
    }

    fn bytes(&self) -> usize {
        match &self.slots {
            Slots::Inline { .. } => 64 + 8 * 16,
            Slots::Wide { words, .. } => 64 + 8 * words.len() + 256,
            Slots::Direct { .. } => 64 + 8 * 256,
        }
    }
}

struct Entry {
    view: Arc<NodeView>,
    /// The recency clock when the entry was last put or used.
    used: AtomicU64,
}

impl Entry {
    /// Marks the entry as used at `now`, writing only when that changes
    /// its age: a warm traversal of the hot upper levels then reads the
    /// shared entries without dirtying their cache lines.
    fn touch(&self, now: u64) {
        if self.used.load(Ordering::Relaxed) != now {
            self.used.store(now, Ordering::Relaxed);
        }
    }
}

struct Inner {
    bytes: usize,
    /// Probed at every cached level of every operation: an integer hasher.
    map: IntMap<GlobalAddr, Entry>,
}

/// One compute machine's cache, shared by its workers.
///
/// Lookups (the hot path: every operation walks the cached levels) take a
/// read lock and clone one `Arc` at the end of the walk. The lock is
/// sharded per thread (`crossbeam_utils::sync::ShardedLock`): a reader
/// locks only its own shard, so the machine's threads do not pass one
/// lock word's cache line between their cores twice per operation, as
/// they did with one `RwLock`; a writer takes every shard; only snapshots
/// read from remote memory (`put`) and invalidations (`remove`) take the
/// write lock. Recency is a clock advanced by every `put`, so a lookup's
/// mark is a plain store that is skipped when the entry is already
/// current — eviction is least-recently-used at the granularity of puts.
pub struct Cache {
    budget: usize,
    root: GlobalAddr,
    clock: AtomicU64,
    inner: ShardedLock<Inner>,
}

/// A read-locked view of the cache for one traversal.
pub struct Reader<'a> {
    now: u64,
    inner: ShardedLockReadGuard<'a, Inner>,
}

impl Reader<'_> {
    /// The snapshot at `addr`, without marking it used.
    pub fn get(&self, addr: GlobalAddr) -> Option<&Arc<NodeView>> {
        self.inner.map.get(&addr).map(|e| &e.view)
    }

    /// [`Reader::get`], marking the entry as used now (for eviction).
    pub fn get_touch(&self, addr: GlobalAddr) -> Option<&Arc<NodeView>> {
        let e = self.inner.map.get(&addr)?;
        e.touch(self.now);
        Some(&e.view)
    }
}

impl Cache {
    /// A cache of at most `budget` bytes (0: disabled).
    pub fn new(budget: usize, root: GlobalAddr) -> Self {
        Self {
            budget,
            root,
            clock: AtomicU64::new(0),
            inner: ShardedLock::new(Inner {
                bytes: 0,
                map: IntMap::default(),
            }),
        }
    }

    // A poisoned lock is taken over: every operation leaves the map and
    // its byte count consistent before anything that could panic.
    fn write(&self) -> ShardedLockWriteGuard<'_, Inner> {
        self.inner.write().unwrap_or_else(|p| p.into_inner())
    }

    /// Read access for a traversal; keep it across no await.
    pub fn reader(&self) -> Reader<'_> {
        Reader {
            now: self.clock.load(Ordering::Relaxed),
            inner: self.inner.read().unwrap_or_else(|p| p.into_inner()),
        }
    }

    pub fn get(&self, addr: GlobalAddr) -> Option<Arc<NodeView>> {
        self.reader().get(addr).cloned()
    }

    /// [`Cache::get`], marking the entry as used now (for eviction).
    pub fn get_touch(&self, addr: GlobalAddr) -> Option<Arc<NodeView>> {
        self.reader().get_touch(addr).cloned()
    }

    pub fn put(&self, view: Arc<NodeView>) {
        self.put_all([view]);
    }

    /// Puts several snapshots under one lock.
    pub fn put_all(&self, views: impl IntoIterator<Item = Arc<NodeView>>) {
        if self.budget == 0 {
            return;
        }
        let mut inner = self.write();
        for view in views {
            let now = self.clock.fetch_add(1, Ordering::Relaxed) + 1;
            let add = view.bytes();
            if let Some(old) = inner.map.insert(
                view.addr,
                Entry {
                    view,
                    used: AtomicU64::new(now),
                },
            ) {
                inner.bytes -= old.view.bytes();
            }
            inner.bytes += add;
            if inner.bytes > self.budget {
                self.evict(&mut inner);
            }
        }
    }

    pub fn remove(&self, addr: GlobalAddr) {
        self.remove_all([addr]);
    }

    /// Removes several snapshots under one lock.
    pub fn remove_all(&self, addrs: impl IntoIterator<Item = GlobalAddr>) {
        let mut inner = self.write();
        for addr in addrs {
            Self::remove_in(&mut inner, addr);
        }
    }

    fn remove_in(inner: &mut Inner, addr: GlobalAddr) {
        if let Some(old) = inner.map.remove(&addr) {
            inner.bytes -= old.view.bytes();
        }
    }

    fn evict(&self, inner: &mut Inner) {
        let mut ages: Vec<(u64, GlobalAddr)> = inner
            .map
            .iter()
            .filter(|(a, _)| **a != self.root)
            .map(|(a, e)| (e.used.load(Ordering::Relaxed), *a))
            .collect();
        ages.sort_unstable();
        let target = self.budget - self.budget / 8;
        for (_, a) in ages {
            if inner.bytes <= target {
                break;
            }
            Self::remove_in(inner, a);
        }
    }

    pub fn len(&self) -> usize {
        self.reader().inner.map.len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    pub fn bytes(&self) -> usize {
        self.reader().inner.bytes
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn view(i: u64, slots: usize) -> Arc<NodeView> {
        Arc::new(NodeView::new(
            GlobalAddr::new(0, 64 * i),
            Header::new(0, NodeType::N4, &[]),
            GlobalAddr::NULL,
            vec![0; slots],
        ))
    }

    #[test]
    fn the_budget_holds_and_the_least_recent_go_first() {
        let root = GlobalAddr::new(0, 64);
        let c = Cache::new(10 * 96, root);
        c.put(view(1, 4)); // the root
        for i in 2..=20 {
            c.put(view(i, 4));
            c.get_touch(GlobalAddr::new(0, 64 * 2));
        }
        assert!(c.bytes() <= 10 * 96);
        assert!(c.get(root).is_some(), "the root stays");
        assert!(
            c.get(GlobalAddr::new(0, 128)).is_some(),
            "a hot entry stays"
        );
        assert!(
            c.get(GlobalAddr::new(0, 64 * 3)).is_none(),
            "a cold one went"
        );
        let held = c.get(GlobalAddr::new(0, 64 * 20)).unwrap();
        c.remove(held.addr);
        assert_eq!(
            held.slots().len(),
            4,
            "a removed snapshot lives on while held"
        );
        let off = Cache::new(0, root);
        off.put(view(1, 4));
        assert!(off.is_empty());
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
