//! The address cache: a worker thread's map (table, key) → record slot,
//! looked up for every record a transaction names (a hit saves the probe
//! round: FORD's and SMART-DTX's clients cache record addresses the same
//! way). Slots never move and are never emptied, so an entry never goes
//! stale and none is ever removed.
//!
//! Its look-up sits on every transaction's path, and once the cache
//! outgrows the processor's caches each look-up is a cache miss: the
//! layout spends one line per look-up. Open addressing over *buckets of
//! four entries, one 64-byte line each*, probed linearly bucket by
//! bucket; a bucket with an empty entry ends a search. Kept at most half
//! full, nearly every look-up reads one line — where a general hash map
//! (`std`'s, SwissTable) reads its control bytes and then its entry, two
//! misses (the read-only TATP profile showed both).
//!
//! An entry says where a key *is* ([`Cached::Slot`]) or, for a key a
//! probe found absent, the empty slot it would go to
//! ([`Cached::Absent`]): a later read of that key READs only the slot's
//! lock and version (one line) instead of probing its bucket again, and a
//! non-empty version there sends it back to the probe (the slot was taken
//! since, by this key or another; `txn`'s docs say why that is enough).
//!
//! Hashed by murmur3's finaliser of `key ^ table·φ` (the home bucket's
//! hash). A multiplicative hash does not do: the bucket index is the
//! hash's *low* bits, and the low bits of a product depend only on the
//! low bits of the key — TATP's composite keys (`s << 16 | sf << 8 |
//! start`) keep their variety in the high bits.

use dmkit_runtime::hash::fmix64;

use crate::db::TableId;

/// Entries per bucket (one cache line of `(key, tag)` pairs).
const WAYS: usize = 4;

/// Bits of a tag above the slot and the absent flag: the table + 1 (0:
/// an empty entry).
const SLOT_BITS: u32 = 47;

/// The tag bit of an absent key's entry (its slot is where the key
/// would go).
const ABSENT: u64 = 1 << 46;

/// The slot bits of a tag.
const SLOT_MASK: u64 = ABSENT - 1;

/// What the cache knows of a key.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Cached {
    /// The key's record is in this slot.
    Slot(u64),
    /// The key was absent; this empty slot is where it would go.
    Absent(u64),
}

/// One bucket: four keys, then their tags, in one cache line.
#[repr(C, align(64))]
#[derive(Clone, Copy, Default)]
struct Bucket {
    keys: [u64; WAYS],
    /// `(table + 1) << SLOT_BITS | absent | slot`; 0 for an empty entry.
    tags: [u64; WAYS],
}

const _: () = assert!(std::mem::size_of::<Bucket>() == 64);

/// The map (table, key) → slot (see the module docs).
#[derive(Clone)]
pub struct SlotCache {
    buckets: Vec<Bucket>,
    len: usize,
}

impl Default for SlotCache {
    fn default() -> Self {
        Self::with_buckets(16)
    }
}

impl std::fmt::Debug for SlotCache {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SlotCache")
            .field("len", &self.len)
            .field("buckets", &self.buckets.len())
            .finish()
    }
}

/// The hash of `(table, key)`.
#[inline]
fn hash(table: TableId, key: u64) -> u64 {
    fmix64(key ^ (table as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15))
}

#[inline]
fn tag_table(table: TableId) -> u64 {
    (table as u64 + 1) << SLOT_BITS
}

impl SlotCache {
    fn with_buckets(n: usize) -> Self {
        assert!(n.is_power_of_two());
        SlotCache {
            buckets: vec![Bucket::default(); n],
            len: 0,
        }
    }

    /// Entries held.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether it holds nothing.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    #[inline]
    fn mask(&self) -> usize {
        self.buckets.len() - 1
    }

    /// Hints the processor to load the line `(table, key)`'s search starts
    /// at (a transaction naming several records overlaps their misses).
    #[inline]
    pub fn prefetch(&self, table: TableId, key: u64) {
        let b = hash(table, key) as usize & self.mask();
        dmkit_fabric::hint::prefetch(&self.buckets[b]);
    }

    /// The slot of `key` in `table`, if cached as present.
    #[inline]
    pub fn get(&self, table: TableId, key: u64) -> Option<u64> {
        match self.lookup(table, key) {
            Some(Cached::Slot(s)) => Some(s),
            _ => None,
        }
    }

    /// What is cached of `key` in `table`.
    #[inline]
    pub fn lookup(&self, table: TableId, key: u64) -> Option<Cached> {
        let want = tag_table(table);
        let mask = self.mask();
        let mut b = hash(table, key) as usize & mask;
        loop {
            let bucket = &self.buckets[b];
            for w in 0..WAYS {
                let tag = bucket.tags[w];
                if tag == 0 {
                    return None;
                }
                if bucket.keys[w] == key && tag & !((1 << SLOT_BITS) - 1) == want {
                    let slot = tag & SLOT_MASK;
                    return Some(if tag & ABSENT != 0 {
                        Cached::Absent(slot)
                    } else {
                        Cached::Slot(slot)
                    });
                }
            }
            // Never all full: the cache is at most half full.
            b = (b + 1) & mask;
        }
    }

    /// Caches `slot` for `key` in `table` (replacing what was cached).
    ///
    /// # Panics
    /// If `slot` does not fit 46 bits (no table has that many: a record
    /// takes at least 32 bytes of a 48-bit address space).
    pub fn insert(&mut self, table: TableId, key: u64, slot: u64) {
        assert!(slot <= SLOT_MASK, "slot {slot} out of range");
        self.put(table, key, slot);
    }

    /// Caches that `key` in `table` was absent, `slot` being the empty
    /// slot it would go to (replacing what was cached).
    ///
    /// # Panics
    /// As [`SlotCache::insert`].
    pub fn insert_absent(&mut self, table: TableId, key: u64, slot: u64) {
        assert!(slot <= SLOT_MASK, "slot {slot} out of range");
        self.put(table, key, ABSENT | slot);
    }

    fn put(&mut self, table: TableId, key: u64, slot: u64) {
        if self.place(table, key, slot) {
            self.len += 1;
            if self.len * 2 > self.buckets.len() * WAYS {
                self.grow();
            }
        }
    }

    /// Puts the entry in (`slot`: the slot with its absent flag); whether
    /// it is a new one.
    fn place(&mut self, table: TableId, key: u64, slot: u64) -> bool {
        let want = tag_table(table);
        let mask = self.mask();
        let mut b = hash(table, key) as usize & mask;
        loop {
            let bucket = &mut self.buckets[b];
            for w in 0..WAYS {
                let tag = bucket.tags[w];
                if tag == 0 {
                    bucket.keys[w] = key;
                    bucket.tags[w] = want | slot;
                    return true;
                }
                if bucket.keys[w] == key && tag & !((1 << SLOT_BITS) - 1) == want {
                    bucket.tags[w] = want | slot;
                    return false;
                }
            }
            b = (b + 1) & mask;
        }
    }

    /// Doubles the buckets and re-places every entry.
    fn grow(&mut self) {
        let old = std::mem::take(&mut self.buckets);
        *self = Self::with_buckets(old.len() * 2);
        for bucket in &old {
            for w in 0..WAYS {
                let tag = bucket.tags[w];
                if tag != 0 {
                    let table = ((tag >> SLOT_BITS) - 1) as TableId;
                    // (The absent flag travels with the slot.)
                    let slot = tag & ((1 << SLOT_BITS) - 1);
                    self.len += self.place(table, bucket.keys[w], slot) as usize;
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Against a `HashMap`: every inserted entry is found with its latest
    /// slot (present or absent) across many growths, absent keys (also the
    /// same key in another table) are not, and a look-up reads one line
    /// for nearly every key.
    #[test]
    fn slot_cache_matches_a_map_across_growth() {
        let mut c = SlotCache::default();
        let mut m = std::collections::HashMap::new();
        let mut rng = dmkit_runtime::rng::Rng::new(7);
        for i in 0..200_000u64 {
            let table = rng.below(5) as TableId;
            // TATP-like composite keys: the variety in the high bits.
            let key = (1 + rng.below(50_000)) << 16 | (1 + rng.below(4)) << 8 | (8 * rng.below(3));
            let slot = i % 3_000_000;
            // A third cached absent, some of them later present (and back).
            if rng.below(3) == 0 {
                c.insert_absent(table, key, slot);
                m.insert((table, key), Cached::Absent(slot));
            } else {
                c.insert(table, key, slot);
                m.insert((table, key), Cached::Slot(slot));
            }
        }
        assert_eq!(c.len(), m.len());
        for (&(t, k), &s) in &m {
            assert_eq!(c.lookup(t, k), Some(s), "table {t} key {k}");
            let present = match s {
                Cached::Slot(s) => Some(s),
                Cached::Absent(_) => None,
            };
            assert_eq!(c.get(t, k), present);
            let other = (t + 1) % 7;
            assert_eq!(c.lookup(other, k), m.get(&(other, k)).copied());
        }
        assert_eq!(c.get(0, u64::MAX), None);
        // The largest slot keeps apart from the absent flag.
        c.insert(9, 1, SLOT_MASK);
        c.insert_absent(9, 2, SLOT_MASK);
        assert_eq!(c.lookup(9, 1), Some(Cached::Slot(SLOT_MASK)));
        assert_eq!(c.lookup(9, 2), Some(Cached::Absent(SLOT_MASK)));
        // At most half full; entries away from their home bucket are few.
        assert!(c.len() * 2 <= c.buckets.len() * WAYS);
        let mask = c.mask();
        let displaced = m
            .keys()
            .filter(|&&(t, k)| {
                let home = &c.buckets[hash(t, k) as usize & mask];
                !(0..WAYS).any(|w| home.keys[w] == k && home.tags[w] >> SLOT_BITS == t as u64 + 1)
            })
            .count();
        assert!(
            displaced * 20 < m.len(),
            "{displaced} of {} keys outside their home line",
            m.len()
        );
    }
}
