//! The client's bounded cache of hints: key → (key id, a version believed
//! to be the tail, its kind, when the client learnt it). Direct-mapped by
//! the key's hash, so its size is fixed when the client is made (Clover's
//! clients cache "hints of the end of each key's linked list").
//!
//! A hint is only an address the client once reached; it may be stale (a
//! writer appended since) and, once older than half the grace period, it
//! may name a block the metadata server reclaimed — such hints are never
//! used (see the crate docs, "Reclamation").

use dmkit_fabric::GlobalAddr;
use dmkit_runtime::Nanos;

use crate::layout::Kind;

/// A key's identity in the cache: its two 64-bit hashes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct KeyHash {
    /// The first hash (directory slot, cache slot).
    pub h1: u64,
    /// The second hash (fingerprint, identity).
    pub h2: u64,
}

impl KeyHash {
    /// The hashes of `key` under `seed`.
    pub fn of(key: &[u8], seed: u64) -> Self {
        let h1 = dmkit_runtime::hash::hash64(key, seed);
        let h2 = dmkit_runtime::hash::hash64(key, seed ^ 0x5EED_C10E);
        Self { h1, h2 }
    }

    /// The directory fingerprint (never 0, so a claimed entry is nonzero).
    pub fn fp(&self) -> u16 {
        ((self.h2 >> 48) as u16).max(1)
    }
}

/// One cached hint.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Hint {
    /// The key's id (its directory entry).
    pub key_id: u64,
    /// A version of the key, the tail when it was learnt.
    pub at: GlobalAddr,
    /// That version's kind.
    pub kind: Kind,
    /// When the client learnt the address (its clock).
    pub learned: Nanos,
}

#[derive(Debug, Clone, Copy, Default)]
struct Slot {
    h1: u64,
    h2: u64,
    hint: Option<Hint>,
}

/// A bounded, direct-mapped hint cache.
#[derive(Debug, Clone)]
pub struct HintCache {
    slots: Vec<Slot>,
}

impl HintCache {
    /// A cache of `entries` (rounded up to a power of two; 0: no cache).
    pub fn new(entries: usize) -> Self {
        let n = if entries == 0 {
            0
        } else {
            entries.next_power_of_two()
        };
        Self {
            slots: vec![Slot::default(); n],
        }
    }

    /// Entries the cache holds at most.
    pub fn capacity(&self) -> usize {
        self.slots.len()
    }

    fn index(&self, h: &KeyHash) -> Option<usize> {
        (!self.slots.is_empty()).then(|| (h.h1 as usize) & (self.slots.len() - 1))
    }

    /// The hint for `h`, if cached.
    pub fn get(&self, h: &KeyHash) -> Option<Hint> {
        let s = &self.slots[self.index(h)?];
        (s.h1 == h.h1 && s.h2 == h.h2).then_some(s.hint).flatten()
    }

    /// Caches `hint` for `h` (replacing whatever shared its slot).
    pub fn put(&mut self, h: &KeyHash, hint: Hint) {
        if let Some(i) = self.index(h) {
            self.slots[i] = Slot {
                h1: h.h1,
                h2: h.h2,
                hint: Some(hint),
            };
        }
    }

    /// Forgets the hint for `h`.
    pub fn drop_hint(&mut self, h: &KeyHash) {
        if let Some(i) = self.index(h) {
            let s = &mut self.slots[i];
            if s.h1 == h.h1 && s.h2 == h.h2 {
                s.hint = None;
            }
        }
    }

    /// Hints held.
    pub fn len(&self) -> usize {
        self.slots.iter().filter(|s| s.hint.is_some()).count()
    }

    /// Whether no hint is held.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_cache_is_bounded_and_keys_do_not_alias() {
        let mut c = HintCache::new(5);
        assert_eq!(c.capacity(), 8);
        let hint = |i: u64| Hint {
            key_id: i,
            at: GlobalAddr::new(0, 64 * i),
            kind: Kind::Present,
            learned: i,
        };
        for i in 0..1000u64 {
            c.put(&KeyHash::of(&i.to_le_bytes(), 1), hint(i));
        }
        assert!(c.len() <= 8);
        let mut found = 0;
        for i in 0..1000u64 {
            if let Some(h) = c.get(&KeyHash::of(&i.to_le_bytes(), 1)) {
                assert_eq!(h, hint(i), "a hint is only ever its own key's");
                found += 1;
            }
        }
        assert_eq!(found, c.len());
        assert_eq!(HintCache::new(0).get(&KeyHash::of(b"k", 1)), None);
    }
}
