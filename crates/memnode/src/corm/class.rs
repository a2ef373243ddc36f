//! Size classes (CoRM §3.1.1) and, per class, how its objects are named
//! (random ids or offsets) and whether its blocks may be compacted.
//!
//! ## The rule
//!
//! A block of `B` bytes holding `n` slots wastes least with the *largest*
//! 8-byte multiple that still fits `n` times: `⌊B/n⌋₈`. The candidate sizes
//! are those maximal sizes (the rule CoRM's `SizeTable` follows, with
//! a 128-byte bound on the block tail), and classes are picked among them
//! geometrically: from the smallest slot ([`MIN_SLOT`], or `B/65536` so a
//! block never holds more than 2¹⁶ slots), each next class is the largest
//! candidate at most `max(s + 8, ⌊9s/8⌋)`, or, when there is none (large
//! slots, where consecutive candidates are far apart), the next candidate.
//!
//! ## The bound
//!
//! An object whose smallest 8-byte-aligned footprint (header, payload,
//! versions) is `r` bytes costs `B/n` bytes of block memory in its class
//! (`n` slots per block), and
//!
//! ```text
//! B/n  ≤  max(9/8, (n+1)/n) · r + 16
//! ```
//!
//! i.e. internal fragmentation (slot rounding plus block tail) is at most
//! 12.5 % + 16 B for every class that holds 8 or more objects per block;
//! the largest classes waste what splitting a block into `n` equal slots
//! must (an object just over half a block costs a whole block). The test
//! `fragmentation_is_bounded` checks this for every payload length.

use serde::{Deserialize, Serialize};

use super::layout::{payload_capacity, slot_for_payload, MIN_SLOT};

/// Most slots a block may have (offset-based ids are slot indices, 16 bits).
pub const MAX_SLOTS: u64 = 1 << 16;

/// One size class.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct ClassInfo {
    /// Bytes of a slot (multiple of 8).
    pub slot_size: u32,
    /// Slots per block.
    pub slots: u32,
    /// Payload bytes an object of this class holds.
    pub capacity: u32,
}

/// The size classes of one block size.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SizeClasses {
    block_size: u64,
    classes: Vec<ClassInfo>,
}

impl SizeClasses {
    /// The classes for blocks of `block_size` bytes (a power of two, at
    /// least 4 KiB).
    pub fn new(block_size: u64) -> Self {
        assert!(block_size.is_power_of_two() && block_size >= 4096);
        let b = block_size;
        let min = (MIN_SLOT as u64).max(b.div_ceil(MAX_SLOTS).next_multiple_of(8));
        // Candidates: ⌊B/n⌋ rounded down to 8, ascending, distinct.
        let mut cand: Vec<u64> = (1..=b / min)
            .map(|n| (b / n) & !7)
            .filter(|&s| s >= min)
            .collect();
        cand.sort_unstable();
        cand.dedup();
        let mut sizes = vec![cand[0]];
        loop {
            let s = *sizes.last().expect("non-empty");
            let limit = (s + 8).max(s * 9 / 8);
            let above = cand.partition_point(|&c| c <= s);
            if above == cand.len() {
                break;
            }
            let within = cand.partition_point(|&c| c <= limit);
            sizes.push(if within > above {
                cand[within - 1]
            } else {
                cand[above]
            });
        }
        let classes = sizes
            .into_iter()
            .map(|s| ClassInfo {
                slot_size: s as u32,
                slots: (b / s) as u32,
                capacity: payload_capacity(s as usize) as u32,
            })
            .collect::<Vec<_>>();
        assert!(classes.len() <= 256, "class ids are 8 bits");
        SizeClasses {
            block_size,
            classes,
        }
    }

    /// The block size.
    pub fn block_size(&self) -> u64 {
        self.block_size
    }

    /// Number of classes.
    pub fn len(&self) -> usize {
        self.classes.len()
    }

    /// Whether there is no class (never: every block size has one).
    pub fn is_empty(&self) -> bool {
        self.classes.is_empty()
    }

    /// Class `c`.
    pub fn get(&self, c: u8) -> Option<&ClassInfo> {
        self.classes.get(c as usize)
    }

    /// All classes, by id.
    pub fn iter(&self) -> impl Iterator<Item = (u8, &ClassInfo)> {
        self.classes.iter().enumerate().map(|(i, c)| (i as u8, c))
    }

    /// Largest payload an object may have.
    pub fn max_payload(&self) -> u32 {
        self.classes.last().expect("non-empty").capacity
    }

    /// The smallest class whose payload holds `len` bytes.
    pub fn for_payload(&self, len: u32) -> Option<u8> {
        let i = self.classes.partition_point(|c| c.capacity < len);
        (i < self.classes.len()).then_some(i as u8)
    }
}

/// How the objects of a class are named.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum IdKind {
    /// A random id of this many bits (8..=16), unique in its block (CoRM).
    Random(u8),
    /// The slot index (offset-based, as Mesh; "CoRM-0").
    Offset,
}

/// The compaction strategy of a store: how ids are chosen per class and
/// which classes compaction may merge (CoRM §4.4).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum Strategy {
    /// No compaction (FaRM): offset ids, never merged.
    None,
    /// Offset-based compaction (Mesh, CoRM-0): two blocks merge when their
    /// objects' offsets do not clash; objects never move within a block.
    Mesh,
    /// CoRM-`bits`: random ids of `bits` bits; classes whose blocks hold
    /// more than 2^bits objects are not compacted ("vanilla", Fig. 18).
    Corm(u8),
    /// Hybrid CoRM-`bits`: random ids where 2^bits covers a block's slots,
    /// offset-based compaction for the other classes (Fig. 19).
    Hybrid(u8),
}

impl Strategy {
    /// Bits of random ids (0 when offset-based only).
    pub fn id_bits(self) -> u8 {
        match self {
            Strategy::None | Strategy::Mesh => 0,
            Strategy::Corm(b) | Strategy::Hybrid(b) => b,
        }
    }

    /// Checks the id width.
    pub fn validate(self) -> Result<(), String> {
        match self {
            Strategy::Corm(b) | Strategy::Hybrid(b) if !(1..=16).contains(&b) => Err(format!(
                "object ids of {b} bits: CoRM ids have 1..=16 bits (0 = offset-based, --mode mesh)"
            )),
            _ => Ok(()),
        }
    }

    /// The naming and compaction policy of class `c`.
    pub fn policy(self, c: &ClassInfo) -> ClassPolicy {
        let fits = |b: u8| (c.slots as u64) <= 1u64 << b;
        match self {
            Strategy::None => ClassPolicy {
                id: IdKind::Offset,
                compact: false,
            },
            Strategy::Mesh => ClassPolicy {
                id: IdKind::Offset,
                compact: true,
            },
            Strategy::Corm(b) if fits(b) => ClassPolicy {
                id: IdKind::Random(b),
                compact: true,
            },
            Strategy::Corm(_) => ClassPolicy {
                id: IdKind::Offset,
                compact: false,
            },
            Strategy::Hybrid(b) if fits(b) => ClassPolicy {
                id: IdKind::Random(b),
                compact: true,
            },
            Strategy::Hybrid(_) => ClassPolicy {
                id: IdKind::Offset,
                compact: true,
            },
        }
    }

    /// A short name: `none`, `mesh`, `corm-16`, `hybrid-16`.
    pub fn name(self) -> String {
        match self {
            Strategy::None => "none".into(),
            Strategy::Mesh => "mesh".into(),
            Strategy::Corm(b) => format!("corm-{b}"),
            Strategy::Hybrid(b) => format!("hybrid-{b}"),
        }
    }
}

/// A class's naming and whether compaction may merge its blocks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ClassPolicy {
    /// How objects are named.
    pub id: IdKind,
    /// Whether compaction may merge the class's blocks.
    pub compact: bool,
}

/// The smallest slot footprint of a payload of `len` bytes (for the bound).
pub fn footprint(len: u32) -> u64 {
    slot_for_payload(len as usize) as u64
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn classes_are_8_aligned_ascending_and_maximal() {
        for bs in [4096u64, 8192, 65536, 1 << 20, 2 << 20] {
            let sc = SizeClasses::new(bs);
            let mut prev = 0;
            for (_, c) in sc.iter() {
                assert_eq!(c.slot_size % 8, 0);
                assert!(c.slot_size > prev);
                assert!(c.slots as u64 <= MAX_SLOTS);
                assert_eq!(c.slots as u64, bs / c.slot_size as u64);
                // Maximal: 8 more bytes would lose a slot.
                assert!(bs / (c.slot_size as u64 + 8) < c.slots as u64);
                prev = c.slot_size;
            }
            assert_eq!(sc.iter().last().unwrap().1.slots, 1);
            assert!(sc.len() <= 256);
        }
        assert_eq!(SizeClasses::new(4096).get(0).unwrap().slot_size, 16);
        assert_eq!(SizeClasses::new(2 << 20).get(0).unwrap().slot_size, 32);
    }

    #[test]
    fn fragmentation_is_bounded() {
        for bs in [4096u64, 65536, 1 << 20] {
            let sc = SizeClasses::new(bs);
            for len in 1..=sc.max_payload() {
                let c = sc.get(sc.for_payload(len).unwrap()).unwrap();
                assert!(c.capacity >= len);
                let cost = bs as f64 / c.slots as f64;
                let n = c.slots as f64;
                let r = footprint(len) as f64;
                let bound = (9.0f64 / 8.0).max((n + 1.0) / n) * r + 16.0;
                assert!(
                    cost <= bound,
                    "block {bs}, payload {len}: costs {cost} > {bound} (slot {})",
                    c.slot_size
                );
            }
            assert_eq!(sc.for_payload(sc.max_payload() + 1), None);
        }
    }

    #[test]
    fn policies_follow_the_strategy() {
        let sc = SizeClasses::new(1 << 20);
        let small = sc.get(0).unwrap(); // 65536 slots
        let big = sc.get(sc.for_payload(2048).unwrap()).unwrap();
        assert_eq!(Strategy::Corm(16).policy(small).id, IdKind::Random(16));
        assert!(!Strategy::Corm(12).policy(small).compact);
        assert_eq!(Strategy::Hybrid(12).policy(small).id, IdKind::Offset);
        assert!(Strategy::Hybrid(12).policy(small).compact);
        assert_eq!(Strategy::Corm(12).policy(big).id, IdKind::Random(12));
        assert!(!Strategy::None.policy(big).compact);
        assert_eq!(Strategy::Mesh.policy(big).id, IdKind::Offset);
        assert!(Strategy::Corm(0).validate().is_err());
        assert!(Strategy::Hybrid(17).validate().is_err());
    }
}
