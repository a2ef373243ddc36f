//! The compute-side cache of remote nodes under a byte budget, one per
//! compute machine, shared by its workers.
//!
//! Both trees cache snapshots of internal nodes this way — the radix
//! tree's ART-indexed cache (SMART radix tree, OSDI'23 §4.3) and the
//! B+tree's index cache (Sherman, SIGMOD'22; SMART-BT) — and each keeps its
//! own *validation rule* for leaving the cache: the radix tree's reverse
//! check, the B+tree's fence keys. This module is the store they share:
//! snapshots by remote address, a byte budget, least-recently-used
//! eviction, a pinned entry (the root) that never goes, and an optional
//! side index a structure maintains with the map (the B+tree's level-1
//! nodes by lower fence).
//!
//! - Snapshots are `Arc`s: evicting or replacing one never frees a
//!   snapshot a task is still reading.
//! - Lookups (every operation walks the cached levels) take a read lock
//!   sharded per thread (`crossbeam_utils::sync::ShardedLock`): a reader
//!   locks only its own shard, so a machine's threads do not pass one lock
//!   word's cache line between their cores twice per operation; a writer
//!   takes every shard. Only snapshots read from remote memory
//!   ([`NodeCache::put_all`]) and invalidations take the write lock.
//! - Recency is a clock advanced by every put, so a lookup's mark is a
//!   plain store that is skipped when the entry is already current:
//!   eviction is least-recently-used at the granularity of puts. When the
//!   budget is exceeded, the least recently used entries go until an
//!   eighth of the budget is free.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use crossbeam_utils::sync::{ShardedLock, ShardedLockReadGuard, ShardedLockWriteGuard};

use dmkit_fabric::GlobalAddr;
use dmkit_runtime::hash::IntMap;

/// A snapshot of a remote node, as a cache holds it.
pub trait CachedNode: Send + Sync + 'static {
    /// The node's remote address (the cache's key).
    fn addr(&self) -> GlobalAddr;
    /// Bytes the snapshot counts against the budget.
    fn bytes(&self) -> usize;
}

/// A second index over the cached snapshots, kept in step with the map
/// under the same lock (e.g. the B+tree's level-1 nodes by lower fence).
pub trait SideIndex<V>: Default + Send + Sync + 'static {
    /// `v` entered the cache.
    fn added(&mut self, v: &Arc<V>);
    /// `v` left the cache (evicted, replaced or removed).
    fn removed(&mut self, v: &Arc<V>);
}

impl<V> SideIndex<V> for () {
    fn added(&mut self, _: &Arc<V>) {}
    fn removed(&mut self, _: &Arc<V>) {}
}

struct Entry<V> {
    view: Arc<V>,
    /// The recency clock when the entry was last put or used.
    used: AtomicU64,
}

impl<V> Entry<V> {
    /// Marks the entry as used at `now`, writing only when that changes
    /// its age: a warm traversal of the hot upper levels then reads the
    /// shared entries without dirtying their cache lines.
    #[inline]
    fn touch(&self, now: u64) {
        if self.used.load(Ordering::Relaxed) != now {
            self.used.store(now, Ordering::Relaxed);
        }
    }
}

struct Inner<V, X> {
    bytes: usize,
    /// Probed at every cached level of every operation: an integer hasher.
    map: IntMap<GlobalAddr, Entry<V>>,
    side: X,
}

/// One compute machine's cache of remote nodes.
pub struct NodeCache<V: CachedNode, X: SideIndex<V> = ()> {
    budget: usize,
    pinned: Option<GlobalAddr>,
    clock: AtomicU64,
    inner: ShardedLock<Inner<V, X>>,
}

/// A read-locked view of the cache for one traversal; keep it across no
/// await.
pub struct Reader<'a, V: CachedNode, X: SideIndex<V>> {
    now: u64,
    inner: ShardedLockReadGuard<'a, Inner<V, X>>,
}

impl<V: CachedNode, X: SideIndex<V>> Reader<'_, V, X> {
    /// The snapshot at `addr`, without marking it used.
    #[inline]
    pub fn get(&self, addr: GlobalAddr) -> Option<&Arc<V>> {
        self.inner.map.get(&addr).map(|e| &e.view)
    }

    /// [`Reader::get`], marking the entry as used now (for eviction).
    #[inline]
    pub fn get_touch(&self, addr: GlobalAddr) -> Option<&Arc<V>> {
        let e = self.inner.map.get(&addr)?;
        e.touch(self.now);
        Some(&e.view)
    }

    /// The side index.
    pub fn side(&self) -> &X {
        &self.inner.side
    }
}

impl<V: CachedNode, X: SideIndex<V>> NodeCache<V, X> {
    /// A cache of at most `budget` bytes (0: disabled) in which the entry
    /// at `pinned` (e.g. the root) is never evicted.
    pub fn new(budget: usize, pinned: Option<GlobalAddr>) -> Self {
        Self {
            budget,
            pinned,
            clock: AtomicU64::new(0),
            inner: ShardedLock::new(Inner {
                bytes: 0,
                map: IntMap::default(),
                side: X::default(),
            }),
        }
    }

    /// Whether the cache holds anything at all (a budget above 0).
    pub fn enabled(&self) -> bool {
        self.budget > 0
    }

    /// The byte budget.
    pub fn budget(&self) -> usize {
        self.budget
    }

    // A poisoned lock is taken over: every operation leaves the map, the
    // side index and the byte count consistent before anything that could
    // panic.
    fn write(&self) -> ShardedLockWriteGuard<'_, Inner<V, X>> {
        self.inner.write().unwrap_or_else(|p| p.into_inner())
    }

    /// Read access for a traversal; keep it across no await.
    #[inline]
    pub fn reader(&self) -> Reader<'_, V, X> {
        Reader {
            now: self.clock.load(Ordering::Relaxed),
            inner: self.inner.read().unwrap_or_else(|p| p.into_inner()),
        }
    }

    /// The snapshot at `addr`.
    pub fn get(&self, addr: GlobalAddr) -> Option<Arc<V>> {
        self.reader().get(addr).cloned()
    }

    /// [`NodeCache::get`], marking the entry as used now (for eviction).
    pub fn get_touch(&self, addr: GlobalAddr) -> Option<Arc<V>> {
        self.reader().get_touch(addr).cloned()
    }

    /// Caches `view` (replacing the snapshot of the same node).
    pub fn put(&self, view: Arc<V>) {
        self.put_all([view]);
    }

    /// Caches several snapshots under one lock.
    pub fn put_all(&self, views: impl IntoIterator<Item = Arc<V>>) {
        if self.budget == 0 {
            return;
        }
        let mut inner = self.write();
        for view in views {
            let now = self.clock.fetch_add(1, Ordering::Relaxed) + 1;
            let add = view.bytes();
            inner.side.added(&view);
            let entry = Entry {
                view,
                used: AtomicU64::new(now),
            };
            if let Some(old) = inner.map.insert(entry.view.addr(), entry) {
                inner.bytes -= old.view.bytes();
                inner.side.removed(&old.view);
                // The replaced snapshot's side entry may have been the new
                // one's too: put the new one back.
                let addr = old.view.addr();
                let new = inner.map[&addr].view.clone();
                inner.side.added(&new);
            }
            inner.bytes += add;
            if inner.bytes > self.budget {
                self.evict(&mut inner);
            }
        }
    }

    /// Removes the snapshot at `addr`.
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

    fn remove_in(inner: &mut Inner<V, X>, addr: GlobalAddr) {
        if let Some(old) = inner.map.remove(&addr) {
            inner.bytes -= old.view.bytes();
            inner.side.removed(&old.view);
        }
    }

    fn evict(&self, inner: &mut Inner<V, X>) {
        let mut ages: Vec<(u64, GlobalAddr)> = inner
            .map
            .iter()
            .filter(|(a, _)| Some(**a) != self.pinned)
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

    /// Snapshots held.
    pub fn len(&self) -> usize {
        self.reader().inner.map.len()
    }

    /// Whether no snapshot is held.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Bytes held (at most the budget, after any put).
    pub fn bytes(&self) -> usize {
        self.reader().inner.bytes
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use super::*;

    struct Node {
        addr: GlobalAddr,
        bytes: usize,
        key: u32,
    }

    impl CachedNode for Node {
        fn addr(&self) -> GlobalAddr {
            self.addr
        }
        fn bytes(&self) -> usize {
            self.bytes
        }
    }

    /// A side index by `key` (as the B+tree's by lower fence).
    #[derive(Default)]
    struct ByKey(BTreeMap<u32, GlobalAddr>);

    impl SideIndex<Node> for ByKey {
        fn added(&mut self, v: &Arc<Node>) {
            self.0.insert(v.key, v.addr);
        }
        fn removed(&mut self, v: &Arc<Node>) {
            if self.0.get(&v.key) == Some(&v.addr) {
                self.0.remove(&v.key);
            }
        }
    }

    fn node(i: u64, key: u32) -> Arc<Node> {
        Arc::new(Node {
            addr: GlobalAddr::new(0, 64 * i),
            bytes: 96,
            key,
        })
    }

    #[test]
    fn the_budget_holds_and_the_least_recent_go_first() {
        let root = GlobalAddr::new(0, 64);
        let c: NodeCache<Node, ByKey> = NodeCache::new(10 * 96, Some(root));
        c.put(node(1, 1)); // the root
        for i in 2..=20 {
            c.put(node(i, i as u32));
            c.get_touch(GlobalAddr::new(0, 64 * 2));
        }
        assert!(c.bytes() <= 10 * 96);
        assert!(c.get(root).is_some(), "the pinned entry stays");
        assert!(
            c.get(GlobalAddr::new(0, 128)).is_some(),
            "a hot entry stays"
        );
        assert!(
            c.get(GlobalAddr::new(0, 64 * 3)).is_none(),
            "a cold one went"
        );
        // The side index follows every eviction.
        let r = c.reader();
        assert_eq!(r.side().0.len(), c.len());
        assert!(r.side().0.values().all(|a| r.get(*a).is_some()));
        drop(r);
        let held = c.get(GlobalAddr::new(0, 64 * 20)).unwrap();
        c.remove(held.addr);
        assert_eq!(held.key, 20, "a removed snapshot lives on while held");
        assert!(!c.reader().side().0.contains_key(&20));
        let off: NodeCache<Node> = NodeCache::new(0, None);
        off.put(node(1, 1));
        assert!(off.is_empty() && !off.enabled());
    }

    #[test]
    fn a_replaced_snapshot_keeps_the_side_index_right() {
        let c: NodeCache<Node, ByKey> = NodeCache::new(1 << 20, None);
        c.put(node(5, 7));
        // Same node, same key: the side entry survives the replacement.
        c.put(node(5, 7));
        assert_eq!(c.reader().side().0.get(&7), Some(&GlobalAddr::new(0, 320)));
        // Same node, new key: the old key's entry goes.
        c.put(node(5, 8));
        let r = c.reader();
        assert_eq!(
            (r.side().0.get(&7), r.side().0.get(&8).copied()),
            (None, Some(GlobalAddr::new(0, 320)))
        );
        assert_eq!(c.bytes(), 96);
    }
}
