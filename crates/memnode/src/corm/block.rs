//! A block's metadata, kept by the worker that owns the block (CoRM
//! §3.1.4: a block is owned by at most one worker; the type moves between
//! workers by value, in a message, so ownership is Rust ownership).
//!
//! The node's memory holds the objects (headers, payloads, versions); this
//! holds what the node needs to allocate and compact without scanning it:
//! which slots are used, the id → slot map (§3.1.4: "a hash table that keeps
//! a mapping between object IDs and offsets", used for pointer correction
//! by messaging), each object's length (exact live-byte accounting), and
//! the virtual blocks mapped onto this block's memory with the number of
//! live objects homed at each (§3.3: an address is released when it drops
//! to zero).

use std::collections::{BTreeMap, HashMap};

use super::class::IdKind;
use super::rng::Rng;

/// A live object, as its owner knows it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Obj {
    /// Slot index in the block.
    pub slot: u32,
    /// Payload length the client asked for.
    pub len: u32,
    /// Home virtual block (the address its pointers name).
    pub home: u64,
}

/// One block's metadata.
#[derive(Debug)]
pub struct Block {
    /// The virtual block this block was allocated at; its frame (memory)
    /// is that virtual block's own, and new pointers name it.
    pub(crate) primary: u64,
    pub(crate) class: u8,
    pub(crate) id_kind: IdKind,
    pub(crate) slots: u32,
    used: Vec<u64>,
    count: u32,
    /// Live objects by id.
    pub(crate) objects: HashMap<u16, Obj>,
    /// Every virtual block mapped onto this block's frame (the primary and
    /// the sources merged into it) → live objects homed there.
    pub(crate) vbs: BTreeMap<u64, u32>,
}

impl Block {
    /// An empty block at virtual block `primary`.
    pub(crate) fn new(primary: u64, class: u8, id_kind: IdKind, slots: u32) -> Self {
        assert!(slots >= 1);
        Block {
            primary,
            class,
            id_kind,
            slots,
            used: vec![0; (slots as usize).div_ceil(64)],
            count: 0,
            objects: HashMap::new(),
            vbs: BTreeMap::from([(primary, 0)]),
        }
    }

    /// Live objects.
    pub fn count(&self) -> u32 {
        self.count
    }

    /// Free slots.
    pub fn free_slots(&self) -> u32 {
        self.slots - self.count
    }

    /// Whether every slot is used.
    pub fn is_full(&self) -> bool {
        self.count == self.slots
    }

    /// Whether slot `k` is used.
    pub fn slot_used(&self, k: u32) -> bool {
        self.used[k as usize / 64] >> (k % 64) & 1 != 0
    }

    fn set_used(&mut self, k: u32, on: bool) {
        let (w, b) = (k as usize / 64, k % 64);
        debug_assert_ne!(self.used[w] >> b & 1 != 0, on);
        if on {
            self.used[w] |= 1 << b;
            self.count += 1;
        } else {
            self.used[w] &= !(1 << b);
            self.count -= 1;
        }
    }

    /// A uniformly random free slot (Mesh's randomized placement, which
    /// its compaction probability assumes).
    pub(crate) fn random_free_slot(&self, rng: &mut Rng) -> u32 {
        let free = self.free_slots();
        assert!(free > 0, "no free slot");
        // Mostly-free blocks: rejection sampling; otherwise the k-th free.
        if free * 4 >= self.slots {
            loop {
                let k = rng.below(self.slots as u64) as u32;
                if !self.slot_used(k) {
                    return k;
                }
            }
        }
        let mut k = rng.below(free as u64) as u32;
        for (w, &bits) in self.used.iter().enumerate() {
            let valid = if (w + 1) * 64 <= self.slots as usize {
                u64::MAX
            } else {
                (1u64 << (self.slots as usize % 64)) - 1
            };
            let free_bits = !bits & valid;
            let n = free_bits.count_ones();
            if k < n {
                let mut f = free_bits;
                for _ in 0..k {
                    f &= f - 1;
                }
                return (w * 64) as u32 + f.trailing_zeros();
            }
            k -= n;
        }
        unreachable!("free count matches the bitmap")
    }

    /// A fresh id for an object placed at `slot`.
    fn fresh_id(&self, rng: &mut Rng, slot: u32) -> u16 {
        match self.id_kind {
            IdKind::Offset => slot as u16,
            IdKind::Random(bits) => {
                debug_assert!(self.slots as u64 <= 1 << bits);
                loop {
                    let id = rng.below(1 << bits) as u16;
                    if !self.objects.contains_key(&id) {
                        return id;
                    }
                }
            }
        }
    }

    /// Allocates a slot and an id for an object of `len` bytes homed at
    /// the primary.
    pub(crate) fn alloc(&mut self, rng: &mut Rng, len: u32) -> (u16, u32) {
        let slot = self.random_free_slot(rng);
        let id = self.fresh_id(rng, slot);
        let home = self.primary;
        self.insert(id, Obj { slot, len, home });
        (id, slot)
    }

    /// Records object `id` (a new one, or one moved in by compaction).
    pub(crate) fn insert(&mut self, id: u16, o: Obj) {
        assert!(!self.slot_used(o.slot), "slot {} taken", o.slot);
        let prev = self.objects.insert(id, o);
        assert!(prev.is_none(), "id {id} taken");
        self.set_used(o.slot, true);
        *self.vbs.get_mut(&o.home).expect("home is mapped here") += 1;
    }

    /// Forgets object `id`; returns it and how many objects its home
    /// still holds.
    pub(crate) fn remove(&mut self, id: u16) -> Option<(Obj, u32)> {
        let o = self.objects.remove(&id)?;
        self.set_used(o.slot, false);
        let n = self.vbs.get_mut(&o.home).expect("home is mapped here");
        *n -= 1;
        Some((o, *n))
    }

    /// Re-homes object `id` at the primary (a released pointer, §3.3);
    /// returns how many objects its old home still holds.
    pub(crate) fn rehome(&mut self, id: u16) -> u32 {
        let primary = self.primary;
        let o = self.objects.get_mut(&id).expect("object exists");
        let old = std::mem::replace(&mut o.home, primary);
        *self.vbs.get_mut(&primary).expect("primary is mapped") += 1;
        let n = self.vbs.get_mut(&old).expect("home is mapped here");
        *n -= 1;
        *n
    }

    /// Whether `src` can be merged into this block: enough free slots and
    /// no id in common (offset-based classes: no offset in common).
    pub(crate) fn can_absorb(&self, src: &Block) -> bool {
        src.class == self.class
            && self.free_slots() >= src.count()
            && src.objects.keys().all(|id| !self.objects.contains_key(id))
    }

    /// Occupancy in [0, 1].
    pub fn fill(&self) -> f64 {
        self.count as f64 / self.slots as f64
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn alloc_remove_and_homes() {
        let mut rng = Rng::new(1);
        let mut b = Block::new(10, 0, IdKind::Random(8), 100);
        let mut ids = Vec::new();
        for _ in 0..100 {
            ids.push(b.alloc(&mut rng, 5));
        }
        assert!(b.is_full());
        let mut slots: Vec<_> = ids.iter().map(|x| x.1).collect();
        slots.sort_unstable();
        assert_eq!(slots, (0..100).collect::<Vec<_>>());
        assert_eq!(b.vbs[&10], 100);
        let (o, left) = b.remove(ids[3].0).unwrap();
        assert_eq!((o.slot, left), (ids[3].1, 99));
        assert!(b.remove(ids[3].0).is_none());
        assert_eq!(b.free_slots(), 1);
        assert_eq!(b.random_free_slot(&mut rng), ids[3].1);
    }

    #[test]
    fn offset_ids_are_slots_and_random_slots_cover_the_block() {
        let mut rng = Rng::new(2);
        let mut b = Block::new(0, 0, IdKind::Offset, 130);
        let mut seen = [0u32; 130];
        for _ in 0..1000 {
            let (id, slot) = b.alloc(&mut rng, 1);
            assert_eq!(id as u32, slot);
            seen[slot as usize] += 1;
            b.remove(id);
        }
        assert!(seen.iter().all(|&n| n > 0), "every slot gets picked");
        // Nearly full: the k-th-free path.
        for _ in 0..129 {
            b.alloc(&mut rng, 1);
        }
        let free = (0..130).find(|&k| !b.slot_used(k)).unwrap();
        assert_eq!(b.random_free_slot(&mut rng), free);
    }

    #[test]
    fn absorb_needs_room_and_distinct_ids() {
        let mut rng = Rng::new(3);
        let mut a = Block::new(1, 4, IdKind::Random(16), 8);
        let mut b = Block::new(2, 4, IdKind::Random(16), 8);
        for _ in 0..3 {
            a.alloc(&mut rng, 1);
            b.alloc(&mut rng, 1);
        }
        assert!(a.can_absorb(&b));
        let id = *b.objects.keys().next().unwrap();
        let slot = (0..8).find(|&k| !a.slot_used(k)).unwrap();
        let mut c = Block::new(3, 4, IdKind::Random(16), 8);
        c.vbs.insert(1, 0);
        c.insert(
            id,
            Obj {
                slot,
                len: 1,
                home: 1,
            },
        );
        assert!(!c.can_absorb(&b), "id clash");
        for _ in 0..3 {
            b.alloc(&mut rng, 1);
        }
        assert!(!a.can_absorb(&b), "no room");
        let d = Block::new(9, 5, IdKind::Random(16), 8);
        assert!(!a.can_absorb(&d), "other class");
    }
}
