//! Remote layouts of the store (little-endian words on the memory node),
//! each a `#[repr(C)]` type with a size assertion that the code encodes
//! and decodes through.
//!
//! ## Descriptor (home node, the root `clover/NAME`)
//! ```text
//!  0       8        16     24          32     40           48      56     64
//!  +-------+--------+------+-----------+------+------------+-------+------+
//!  | magic | limits | dir  | dir slots | pool | pool slots | grace | seed |  Descriptor
//!  +-------+--------+------+-----------+------+------------+-------+------+
//!  limits: max_key:16 | 0:16 | max_value:32
//! ```
//!
//! ## Directory (home node): the metadata server's key → chain table
//! `dir slots` entries of 16 bytes, open addressing with linear probing
//! from `hash(key) mod slots`; an entry is claimed once (CAS of `head`
//! from 0) and never freed, so its index is the key's *key id* for good.
//! ```text
//!  head:      63            48 47                                   0
//!             +---------------+--------------------------------------+
//!             | fingerprint 16|  oldest live version (ptr48)         |   moved forward only by GC
//!             +---------------+--------------------------------------+
//!  shortcut:  63                    40 39                             0
//!             +-----------------------+--------------------------------+
//!             | stamp (24)            | a recent version: offset / 64  |   written by writers and GC
//!             +-----------------------+--------------------------------+
//! ```
//! The shortcut names a version on the home node, stamped with the time
//! its writer knew it to be linked (units of [`STAMP_UNIT`] ns, modulo
//! 2^24): a reader trusts it only as long as it would trust an address it
//! learnt at that time, so a shortcut WRITE that lands late (a writer
//! descheduled between its CAS and the WRITE) is recognised as old. 0:
//! no shortcut.
//!
//! ## Version (out of place, 64-byte aligned, immutable but for `next`)
//! ```text
//!  0      8      16      24       32                    40       48
//!  +------+------+-------+--------+---------------------+--------+-----------+-------------+
//!  | next | this | birth | key id | klen16|vlen32|kind8 | sum    | key bytes | value bytes |
//!  +------+------+-------+--------+---------------------+--------+-----------+-------------+
//! ```
//! `this` is the version's own address (a READ the switch steered to
//! another version tells the reader where it landed), `birth` the
//! writer's id and counter (unique), `sum` a checksum of bytes 8..40, the
//! key and the value.
//!
//! ## The next word
//! ```text
//!  empty (the tail):  1 | kind | CLOVER_TAG (14) | key id (48)
//!  link:              0 | kind of the successor | 0 (14) | successor (ptr48)
//! ```
//! A version is written with its *empty* word, which names its key and its
//! kind (a value, or a tombstone: the key absent). Appending is one CAS of
//! the tail's next word from `empty(key, kind the operation expects)` to
//! `link(new version)`: the memory node itself checks both that the target
//! is the tail and that the key is in the state the operation requires
//! (present for update and delete, absent for insert). So a CAS moved to
//! another address by the switch (steering) still succeeds only where the
//! operation's precondition holds, and the switch learns the key of every
//! append from its compare value alone (no payload parsing).
//!
//! ## Free-block pool (home node): blocks the metadata server reclaimed
//! ```text
//!  +------+------+----------+    slots: pool slots words, block addresses (GlobalAddr)
//!  | prod | cons | 0 (48 B) |    position p lives in slot p mod pool slots
//!  +------+------+----------+
//! ```
//! One producer (the metadata server) writes slots, then `prod`; clients
//! read `prod`/`cons` and the slots `[cons, cons+k)`, then claim them with
//! a CAS of `cons` (see [`crate::pool`]).

use dmkit_fabric::{GlobalAddr, NodeId};
use dmkit_index::Magic;
use zerocopy::{FromBytes, Immutable, IntoBytes, KnownLayout};

/// The descriptor's magic: kind and layout version.
pub const DESC_MAGIC: Magic = Magic::new(b"dmCLVR", 1);

/// The 14-bit tag of an empty next word (it tells Clover's CAS compare
/// values from other 8-byte words, for the switch and for checks).
pub const CLOVER_TAG: u64 = 0x2C1F;

/// Bytes of a version header.
pub const HEADER: usize = std::mem::size_of::<VersionHeader>();

/// Bytes of a directory entry.
pub const DIR_ENTRY: u64 = std::mem::size_of::<DirEntry>() as u64;

/// Bytes of the pool header.
pub const POOL_HEADER: u64 = std::mem::size_of::<PoolHeader>() as u64;

/// Largest key id (48 bits).
pub const MAX_KEY_ID: u64 = (1 << 48) - 1;

/// The store's descriptor.
#[repr(C)]
#[derive(
    Debug, Clone, Copy, Default, PartialEq, Eq, FromBytes, IntoBytes, KnownLayout, Immutable,
)]
pub struct Descriptor {
    /// [`DESC_MAGIC`].
    pub magic: u64,
    /// max_key:16 | 0:16 | max_value:32.
    pub limits: u64,
    /// The directory (a [`GlobalAddr`]).
    pub dir: u64,
    /// Directory entries (a power of two).
    pub dir_slots: u64,
    /// The free-block pool (a [`GlobalAddr`]).
    pub pool: u64,
    /// Pool slots (a power of two).
    pub pool_slots: u64,
    /// The reclamation grace period (ns) every client assumes.
    pub grace: u64,
    /// Hash seed.
    pub seed: u64,
}
const _: () = assert!(std::mem::size_of::<Descriptor>() == 64);

impl Descriptor {
    /// Packs the key and value limits.
    pub fn pack_limits(max_key: usize, max_value: usize) -> u64 {
        max_key as u64 | (max_value as u64) << 32
    }

    /// The key and value limits.
    pub fn unpack_limits(w: u64) -> (usize, usize) {
        ((w & 0xFFFF) as usize, (w >> 32) as usize)
    }
}

/// A directory entry.
#[repr(C)]
#[derive(
    Debug, Clone, Copy, Default, PartialEq, Eq, FromBytes, IntoBytes, KnownLayout, Immutable,
)]
pub struct DirEntry {
    /// fingerprint:16 | oldest live version (ptr48); 0: free.
    pub head: u64,
    /// A recent version (ptr48); 0: none.
    pub shortcut: u64,
}
const _: () = assert!(std::mem::size_of::<DirEntry>() == 16);

/// Byte offset of [`DirEntry::shortcut`].
pub const DIR_SHORTCUT: u64 = std::mem::offset_of!(DirEntry, shortcut) as u64;

/// Nanoseconds per unit of a shortcut's stamp (2^16: 65.5 µs; 24 bits of
/// stamp wrap after 18 minutes).
pub const STAMP_UNIT: u64 = 1 << 16;
const STAMP_BITS: u32 = 24;
const SHORTCUT_OFFSET_BITS: u32 = 40;

/// The shortcut word naming `v` (on the home node), known linked at `t`;
/// `None` if `v` is not 64-byte aligned or beyond 64 TiB.
pub fn shortcut_word(v: GlobalAddr, t: u64) -> Option<u64> {
    let units = v.offset() >> 6;
    (v.offset().is_multiple_of(64) && units != 0 && units < 1 << SHORTCUT_OFFSET_BITS).then(|| {
        let stamp = (t / STAMP_UNIT) & ((1 << STAMP_BITS) - 1);
        stamp << SHORTCUT_OFFSET_BITS | units
    })
}

/// Decodes a shortcut word read at `now` (by the reader's clock) on a
/// store whose home node is `home`: the version and the time its stamp
/// says it was known linked (the start of the stamp's unit, no later than
/// `now`).
pub fn decode_shortcut(w: u64, home: NodeId, now: u64) -> Option<(GlobalAddr, u64)> {
    let units = w & ((1 << SHORTCUT_OFFSET_BITS) - 1);
    if units == 0 {
        return None;
    }
    let stamp = w >> SHORTCUT_OFFSET_BITS;
    let now_units = now / STAMP_UNIT;
    let age = now_units.wrapping_sub(stamp) & ((1 << STAMP_BITS) - 1);
    let at = now_units.saturating_sub(age) * STAMP_UNIT;
    Some((GlobalAddr::new(home, units << 6), at))
}

impl DirEntry {
    /// The head word for the chain starting at `v` of a key with
    /// fingerprint `fp`; `None` if `v` does not fit a 48-bit pointer.
    pub fn head_word(fp: u16, v: GlobalAddr) -> Option<u64> {
        Some((fp as u64) << 48 | v.to_ptr48()?)
    }

    /// Whether the entry is claimed.
    pub fn used(&self) -> bool {
        self.head != 0
    }

    /// The key fingerprint of a claimed entry.
    pub fn fp(&self) -> u16 {
        (self.head >> 48) as u16
    }

    /// The oldest live version.
    pub fn head_addr(&self) -> GlobalAddr {
        GlobalAddr::from_ptr48(self.head)
    }

    /// The shortcut of a store with home node `home`, if set (its stamp
    /// ignored).
    pub fn shortcut_addr(&self, home: NodeId) -> Option<GlobalAddr> {
        decode_shortcut(self.shortcut, home, 0).map(|(a, _)| a)
    }
}

/// A key's state after a version: present (a value) or absent (a
/// tombstone).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Kind {
    /// A tombstone: the key is absent.
    Absent = 0,
    /// A value: the key is present.
    Present = 1,
}

impl Kind {
    fn of(bit: u64) -> Kind {
        if bit & 1 == 1 {
            Kind::Present
        } else {
            Kind::Absent
        }
    }
}

/// A decoded next word.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Next {
    /// The tail of key `key` (its id), in state `kind`.
    Empty {
        /// The key id.
        key: u64,
        /// The tail's kind.
        kind: Kind,
    },
    /// A link to the successor (of kind `kind`).
    Link {
        /// The successor.
        to: GlobalAddr,
        /// The successor's kind.
        kind: Kind,
    },
    /// Not a next word (fresh or reused memory).
    Invalid,
}

impl Next {
    /// The empty word of key `key` in state `kind`.
    pub const fn empty(key: u64, kind: Kind) -> u64 {
        1 << 63 | (kind as u64) << 62 | CLOVER_TAG << 48 | (key & MAX_KEY_ID)
    }

    /// The link word to `to` (of kind `kind`); `None` if `to` does not fit
    /// a 48-bit pointer.
    pub fn link(to: GlobalAddr, kind: Kind) -> Option<u64> {
        let p = to.to_ptr48()?;
        (p != 0).then_some((kind as u64) << 62 | p)
    }

    /// Decodes a next word.
    pub fn decode(w: u64) -> Next {
        let kind = Kind::of(w >> 62);
        if w >> 63 == 1 {
            if (w >> 48) & 0x3FFF != CLOVER_TAG {
                return Next::Invalid;
            }
            return Next::Empty {
                key: w & MAX_KEY_ID,
                kind,
            };
        }
        let p = w & MAX_KEY_ID;
        if p == 0 || (w >> 48) & 0x3FFF != 0 {
            return Next::Invalid;
        }
        Next::Link {
            to: GlobalAddr::from_ptr48(p),
            kind,
        }
    }
}

/// A version's header.
#[repr(C)]
#[derive(
    Debug, Clone, Copy, Default, PartialEq, Eq, FromBytes, IntoBytes, KnownLayout, Immutable,
)]
pub struct VersionHeader {
    /// The next word ([`Next`]).
    pub next: u64,
    /// The version's own address (a [`GlobalAddr`]).
    pub this: u64,
    /// writer id:24 | counter:40.
    pub birth: u64,
    /// The key id (its directory entry).
    pub key_id: u64,
    /// klen:16 | vlen:32 | kind:8 | 0:8.
    pub lens: u64,
    /// Checksum of bytes 8..40, the key and the value.
    pub sum: u64,
}
const _: () = assert!(std::mem::size_of::<VersionHeader>() == 48);

/// Byte offset of the checksummed part of the header.
const SUMMED_FROM: usize = std::mem::offset_of!(VersionHeader, this);
const SUMMED_TO: usize = std::mem::offset_of!(VersionHeader, sum);

/// Bytes a version of a store with these limits takes (64-byte units).
pub fn block_bytes(max_key: usize, max_value: usize) -> usize {
    (HEADER + max_key + max_value).next_multiple_of(64)
}

/// Bytes a reader fetches of a version: the header and the longest key and
/// value (the switch recognises Clover's READs by this length).
pub fn read_bytes(max_key: usize, max_value: usize) -> usize {
    HEADER + max_key + max_value
}

fn checksum(header: &[u8], key: &[u8], value: &[u8]) -> u64 {
    let h = dmkit_runtime::hash::hash64(&header[SUMMED_FROM..SUMMED_TO], 0xC10E);
    let h = dmkit_runtime::hash::hash64(key, h);
    dmkit_runtime::hash::hash64(value, h) | 1
}

/// A version to write.
#[derive(Debug, Clone, Copy)]
pub struct NewVersion<'a> {
    /// Where it goes.
    pub at: GlobalAddr,
    /// The writer's birth id.
    pub birth: u64,
    /// The key id.
    pub key_id: u64,
    /// Its kind.
    pub kind: Kind,
    /// The key.
    pub key: &'a [u8],
    /// The value (empty for a tombstone).
    pub value: &'a [u8],
}

impl NewVersion<'_> {
    /// The version's image: header (with its empty next word), key, value.
    pub fn encode(&self, out: &mut Vec<u8>) {
        out.clear();
        let mut h = VersionHeader {
            next: Next::empty(self.key_id, self.kind),
            this: self.at.raw(),
            birth: self.birth,
            key_id: self.key_id,
            lens: self.key.len() as u64
                | (self.value.len() as u64) << 16
                | (self.kind as u64) << 48,
            sum: 0,
        };
        let sum = checksum(h.as_bytes(), self.key, self.value);
        h.sum = sum;
        out.extend_from_slice(h.as_bytes());
        out.extend_from_slice(self.key);
        out.extend_from_slice(self.value);
    }
}

/// A version read back and checked.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Version {
    /// The next word, decoded.
    pub next: Next,
    /// Where it lives (as it says).
    pub this: GlobalAddr,
    /// The writer's birth id.
    pub birth: u64,
    /// The key id.
    pub key_id: u64,
    /// Its kind.
    pub kind: Kind,
    /// Key and value bytes.
    pub key: Vec<u8>,
    /// The value bytes.
    pub value: Vec<u8>,
}

impl Version {
    /// Decodes and checks a version read from memory; `None` if it is torn,
    /// foreign or not a version (checksum, lengths and `next` checked).
    pub fn decode(b: &[u8]) -> Option<Version> {
        let (h, rest) = VersionHeader::read_from_prefix(b).ok()?;
        let klen = (h.lens & 0xFFFF) as usize;
        let vlen = ((h.lens >> 16) & 0xFFFF_FFFF) as usize;
        if h.lens >> 56 != 0 || klen == 0 || rest.len() < klen + vlen {
            return None;
        }
        let (key, value) = (&rest[..klen], &rest[klen..klen + vlen]);
        if checksum(h.as_bytes(), key, value) != h.sum {
            return None;
        }
        let kind = Kind::of(h.lens >> 48);
        let next = Next::decode(h.next);
        match next {
            Next::Invalid => return None,
            Next::Empty { key: k, kind: tk } if k != h.key_id || tk != kind => return None,
            _ => {}
        }
        Some(Version {
            next,
            this: GlobalAddr::from_raw(h.this),
            birth: h.birth,
            key_id: h.key_id,
            kind,
            key: key.to_vec(),
            value: value.to_vec(),
        })
    }
}

/// The free-block pool's header.
#[repr(C)]
#[derive(
    Debug, Clone, Copy, Default, PartialEq, Eq, FromBytes, IntoBytes, KnownLayout, Immutable,
)]
pub struct PoolHeader {
    /// Positions produced (the metadata server's count).
    pub prod: u64,
    /// Positions claimed by clients.
    pub cons: u64,
    /// Unused (keeps slots on their own lines).
    pub _reserved: [u64; 6],
}
const _: () = assert!(std::mem::size_of::<PoolHeader>() == 64);

/// Byte offset of [`PoolHeader::cons`].
pub const POOL_CONS: u64 = std::mem::offset_of!(PoolHeader, cons) as u64;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn next_words_round_trip_and_tell_kinds_apart() {
        let a = GlobalAddr::new(1, 64 * 77);
        for kind in [Kind::Present, Kind::Absent] {
            let e = Next::empty(12345, kind);
            assert_eq!(Next::decode(e), Next::Empty { key: 12345, kind });
            let l = Next::link(a, kind).unwrap();
            assert_eq!(Next::decode(l), Next::Link { to: a, kind });
        }
        assert_ne!(
            Next::empty(7, Kind::Present),
            Next::empty(7, Kind::Absent),
            "a CAS expecting a value fails on a tombstone"
        );
        assert_eq!(Next::decode(0), Next::Invalid);
        assert_eq!(Next::decode(1 << 63), Next::Invalid);
        assert_eq!(Next::link(GlobalAddr::new(0, 60), Kind::Present), None);
    }

    #[test]
    fn shortcuts_carry_their_age() {
        let v = GlobalAddr::new(0, 64 * 1000);
        let t = 5_000_000_000u64;
        let w = shortcut_word(v, t).unwrap();
        let (a, at) = decode_shortcut(w, 0, t + 3_000_000).unwrap();
        assert_eq!(a, v);
        assert!(at <= t && t - at < STAMP_UNIT, "{at} for {t}");
        // Read long after (but within the wrap), it is as old as it is.
        let (_, at) = decode_shortcut(w, 0, t + 60_000_000_000).unwrap();
        assert!(at <= t);
        assert_eq!(decode_shortcut(0, 0, t), None);
        assert_eq!(shortcut_word(GlobalAddr::new(0, 32), t), None);
    }

    #[test]
    fn versions_round_trip_and_torn_ones_fail() {
        let v = NewVersion {
            at: GlobalAddr::new(0, 4096),
            birth: 99,
            key_id: 5,
            kind: Kind::Present,
            key: b"key",
            value: b"value",
        };
        let mut b = Vec::new();
        v.encode(&mut b);
        b.resize(read_bytes(16, 16), 0);
        let d = Version::decode(&b).unwrap();
        assert_eq!(
            d.next,
            Next::Empty {
                key: 5,
                kind: Kind::Present
            }
        );
        assert_eq!(
            (d.key.as_slice(), d.value.as_slice()),
            (&b"key"[..], &b"value"[..])
        );
        assert_eq!(d.this, GlobalAddr::new(0, 4096));
        // The next word is not summed (it changes once, by CAS).
        let mut linked = b.clone();
        linked[..8].copy_from_slice(
            &Next::link(GlobalAddr::new(0, 128), Kind::Absent)
                .unwrap()
                .to_le_bytes(),
        );
        assert!(Version::decode(&linked).is_some());
        for i in 8..b.len() - (read_bytes(16, 16) - HEADER - 8) {
            let mut t = b.clone();
            t[i] ^= 0x40;
            assert!(Version::decode(&t).is_none(), "byte {i} flipped");
        }
        assert!(Version::decode(&[0u8; 64]).is_none());
    }
}
