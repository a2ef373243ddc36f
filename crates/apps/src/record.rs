//! The entry every application writes to remote memory: a key, a tag
//! (who wrote it, in which epoch), a checksum and a payload. A reader of
//! raw remote bytes tells a written entry from an unwritten one (tag 0)
//! and from a torn one (checksum).
//!
//! ```text
//!  0        8                            16         24
//!  +--------+----------------------------+----------+----------------------+
//!  | key    | tag: epoch 32 | writer 16 |  | check    | payload (len − 24 B) |
//!  |        |       | seq/kind 15 | 1   |  |          |                      |
//!  +--------+----------------------------+----------+----------------------+
//!  tag bit 0 is always 1 (a written entry's tag is never 0);
//!  check = hash of key, tag and payload, never 0.
//! ```

use dmkit_runtime::hash::{fmix64, hash64, Hash64};
use zerocopy::{FromBytes, Immutable, IntoBytes, KnownLayout};

/// Head of an entry.
#[repr(C)]
#[derive(
    Debug, Clone, Copy, Default, PartialEq, Eq, FromBytes, IntoBytes, KnownLayout, Immutable,
)]
pub struct EntryHead {
    /// The entry's key.
    pub key: u64,
    /// Its tag (see [`tag`]: epoch, writer and a field).
    pub tag: u64,
    /// A checksum of key, tag and payload: a torn entry fails it.
    pub check: u64,
}
const _: () = assert!(std::mem::size_of::<EntryHead>() == 24);

/// Bytes of the head: the smallest entry.
pub const HEAD: usize = std::mem::size_of::<EntryHead>();

/// A tag: epoch, writer, a 15-bit field of the application's, and the low
/// bit set.
pub fn tag(epoch: u32, writer: u16, field: u16) -> u64 {
    ((epoch as u64) << 32) | ((writer as u64) << 16) | (((field & 0x7FFF) as u64) << 1) | 1
}

/// `(epoch, writer, field)` of a tag.
pub fn untag(t: u64) -> (u32, u16, u16) {
    (
        (t >> 32) as u32,
        (t >> 16) as u16,
        ((t >> 1) & 0x7FFF) as u16,
    )
}

const PAYLOAD_SEED: u64 = 0x005E_ED0F_D47A;

/// The payload an entry of `key` carries (deterministic, so a checker can
/// recompute it): `len` bytes, its first word `value`.
///
/// Byte `i` is byte `i % 8` (little-endian) of the word `x_{i/8}`, where
/// `x_c = fmix64(x_{c−1} + 8c)` from `x_{−1} = fmix64(key ^ seed)`. Each
/// word is stored whole: stored a byte at a time, the payload was about a
/// third of a batched log writer's CPU, and the checksum's word loads right
/// after the byte stores could not be forwarded from them.
pub fn payload(key: u64, value: u64, out: &mut [u8]) {
    let mut x = fmix64(key ^ PAYLOAD_SEED);
    let mut words = out.chunks_exact_mut(8);
    let mut at = 0u64;
    for w in &mut words {
        x = fmix64(x.wrapping_add(at));
        w.copy_from_slice(&x.to_le_bytes());
        at += 8;
    }
    let rest = words.into_remainder();
    if !rest.is_empty() {
        x = fmix64(x.wrapping_add(at));
        let n = rest.len();
        rest.copy_from_slice(&x.to_le_bytes()[..n]);
    }
    let n = out.len().min(8);
    out[..n].copy_from_slice(&value.to_le_bytes()[..n]);
}

fn check_seed(key: u64, tag: u64) -> u64 {
    key ^ tag.rotate_left(17)
}

fn check_of(key: u64, tag: u64, body: &[u8]) -> u64 {
    hash64(body, check_seed(key, tag)) | 1
}

/// Writes an entry of `e.len()` bytes (at least [`HEAD`]).
///
/// The payload ([`payload`]'s bytes) is made and checksummed a word at a
/// time: each word is stored once and folded into the checksum from its
/// register, not stored and loaded back for [`hash64`] (the same checksum).
///
/// # Panics
/// If `e` is shorter than the head (programmer error).
pub fn encode(e: &mut [u8], key: u64, tag: u64, value: u64) {
    assert!(e.len() >= HEAD, "an entry has at least {HEAD} bytes");
    let (h, body) = e.split_at_mut(HEAD);
    let mut sum = Hash64::new(check_seed(key, tag), body.len());
    let mut x = fmix64(key ^ PAYLOAD_SEED);
    let mut words = body.chunks_exact_mut(8);
    let mut at = 0u64;
    for w in &mut words {
        x = fmix64(x.wrapping_add(at));
        // The first word is the value.
        let v = if at == 0 { value } else { x };
        w.copy_from_slice(&v.to_le_bytes());
        sum.word(v);
        at += 8;
    }
    let rest = words.into_remainder();
    if !rest.is_empty() {
        // A last partial word: its bytes, hashed zero-padded.
        x = fmix64(x.wrapping_add(at));
        let n = rest.len();
        let v = if at == 0 { value } else { x } & ((1u64 << (8 * n)) - 1);
        rest.copy_from_slice(&v.to_le_bytes()[..n]);
        sum.word(v);
    }
    let head = EntryHead {
        key,
        tag,
        check: sum.finish() | 1,
    };
    h.copy_from_slice(head.as_bytes());
}

/// What a reader found at an entry.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Found {
    /// Never written (all of the head zero).
    Empty,
    /// A complete entry: key, tag, the payload's first word.
    /// A complete entry: key, tag, the payload's first word.
    Entry {
        /// The key.
        key: u64,
        /// The tag.
        tag: u64,
        /// The payload's first word.
        value: u64,
    },
    /// Written partly, or damaged.
    Torn,
}

/// Decodes an entry image.
pub fn decode(e: &[u8]) -> Found {
    let Ok((h, body)) = EntryHead::read_from_prefix(e) else {
        return Found::Torn;
    };
    if h.tag == 0 && h.check == 0 && h.key == 0 {
        return Found::Empty;
    }
    if h.tag & 1 == 0 || check_of(h.key, h.tag, body) != h.check {
        return Found::Torn;
    }
    let mut v = [0u8; 8];
    let n = body.len().min(8);
    v[..n].copy_from_slice(&body[..n]);
    Found::Entry {
        key: h.key,
        tag: h.tag,
        value: u64::from_le_bytes(v),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The payload as first written, a byte at a time: the word-wise one
    /// must give the same bytes (records already in logs and checkers'
    /// expectations depend on them).
    fn payload_bytewise(key: u64, value: u64, out: &mut [u8]) {
        let mut x = fmix64(key ^ 0x005E_ED0F_D47A);
        for (i, b) in out.iter_mut().enumerate() {
            if i % 8 == 0 {
                x = fmix64(x.wrapping_add(i as u64));
            }
            *b = (x >> (8 * (i % 8))) as u8;
        }
        let n = out.len().min(8);
        out[..n].copy_from_slice(&value.to_le_bytes()[..n]);
    }

    #[test]
    fn encode_is_the_payload_and_its_checksum() {
        for len in HEAD..=100 {
            for (key, t, value) in [
                (0, 1, 0),
                (42, tag(1, 3, 9), 7),
                (u64::MAX, tag(9, 9, 9), 1 << 40),
            ] {
                let mut e = vec![0xEEu8; len];
                encode(&mut e, key, t, value);
                // The entry as first made: the byte-wise payload, then
                // hash64 of it.
                let mut r = vec![0x11u8; len];
                payload_bytewise(key, value, &mut r[HEAD..]);
                let check = check_of(key, t, &r[HEAD..]);
                r[..HEAD].copy_from_slice(EntryHead { key, tag: t, check }.as_bytes());
                assert_eq!(e, r, "{len} B");
            }
        }
    }

    #[test]
    fn payload_is_the_bytewise_payload() {
        for len in 0..=80 {
            for key in [0, 1, 42, u64::MAX, 0x0003_0000_0001_2345] {
                let (mut a, mut b) = (vec![0xAAu8; len], vec![0x55u8; len]);
                payload(key, key ^ 0x77, &mut a);
                payload_bytewise(key, key ^ 0x77, &mut b);
                assert_eq!(a, b, "len {len} key {key}");
            }
        }
    }

    #[test]
    fn entries_round_trip_and_damage_is_seen() {
        let mut e = vec![0u8; 64];
        assert_eq!(decode(&e), Found::Empty);
        let t = tag(7, 3, 12);
        assert_eq!(untag(t), (7, 3, 12));
        encode(&mut e, 42, t, 99);
        assert_eq!(
            decode(&e),
            Found::Entry {
                key: 42,
                tag: t,
                value: 99
            }
        );
        for i in [0, 9, 17, 30, 63] {
            let mut d = e.clone();
            d[i] ^= 4;
            assert_eq!(decode(&d), Found::Torn, "byte {i}");
        }
        let mut half = e.clone();
        half[32..].fill(0);
        assert_eq!(decode(&half), Found::Torn);
        let mut small = vec![0u8; HEAD];
        encode(&mut small, 1, tag(1, 1, 1), 5);
        assert!(matches!(
            decode(&small),
            Found::Entry {
                key: 1,
                value: 0,
                ..
            }
        ));
    }
}
