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

use dmkit_runtime::hash::{fmix64, hash64};
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

/// The payload an entry of `key` carries (deterministic, so a checker can
/// recompute it): `len` bytes, its first word `value`.
pub fn payload(key: u64, value: u64, out: &mut [u8]) {
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

fn check_of(key: u64, tag: u64, body: &[u8]) -> u64 {
    hash64(body, key ^ tag.rotate_left(17)) | 1
}

/// Writes an entry of `e.len()` bytes (at least [`HEAD`]).
///
/// # Panics
/// If `e` is shorter than the head (programmer error).
pub fn encode(e: &mut [u8], key: u64, tag: u64, value: u64) {
    assert!(e.len() >= HEAD, "an entry has at least {HEAD} bytes");
    let (h, body) = e.split_at_mut(HEAD);
    payload(key, value, body);
    let head = EntryHead {
        key,
        tag,
        check: check_of(key, tag, body),
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
