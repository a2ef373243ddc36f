//! Hashing shared by the data structures (bucket choice, fingerprints,
//! checksums of remote blocks). Not cryptographic: checksums catch torn and
//! recycled reads, not malice.

use std::collections::HashMap;
use std::hash::{BuildHasherDefault, Hasher};

/// A hasher for maps keyed by one integer (remote addresses, node ids)
/// that are probed on hot paths, where SipHash showed in profiles: one
/// multiplication per word. Not for keys an adversary picks.
#[derive(Default)]
pub struct IntHasher(u64);

impl Hasher for IntHasher {
    fn finish(&self) -> u64 {
        self.0
    }
    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.0 = (self.0.rotate_left(8) ^ b as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15);
        }
    }
    fn write_u16(&mut self, v: u16) {
        self.write_u64(v as u64);
    }
    fn write_u64(&mut self, v: u64) {
        // Folds in what earlier fields wrote (a key of several integers,
        // e.g. a node id and an offset), and the product's high half into
        // its low half: `HashMap` picks the bucket from the low bits, which
        // of a bare product depend only on the key's low bits, constant for
        // aligned addresses (and for keys whose variety is in their high
        // bits), so such keys would crowd a fraction of the buckets.
        let x = self.0 ^ v;
        let h = (x ^ x >> 29).wrapping_mul(0x9E37_79B9_7F4A_7C15);
        self.0 = h ^ h >> 32;
    }
}

/// A `HashMap` hashed by [`IntHasher`].
pub type IntMap<K, V> = HashMap<K, V, BuildHasherDefault<IntHasher>>;

/// murmur3's 64-bit finaliser.
#[inline]
pub fn fmix64(mut k: u64) -> u64 {
    k ^= k >> 33;
    k = k.wrapping_mul(0xff51_afd7_ed55_8ccd);
    k ^= k >> 33;
    k = k.wrapping_mul(0xc4ce_b9fe_1a85_ec53);
    k ^ (k >> 33)
}

/// A 64-bit hash of `data` (8 bytes per step, murmur3's finaliser).
pub fn hash64(data: &[u8], seed: u64) -> u64 {
    let mut h = Hash64::new(seed, data.len());
    let mut chunks = data.chunks_exact(8);
    for c in &mut chunks {
        h.word(u64::from_le_bytes(c.try_into().expect("8-byte chunk")));
    }
    let rem = chunks.remainder();
    if !rem.is_empty() {
        let mut b = [0u8; 8];
        b[..rem.len()].copy_from_slice(rem);
        h.word(u64::from_le_bytes(b));
    }
    h.finish()
}

/// [`hash64`] a word at a time, for a producer that has the words in
/// registers (it need not store them and load them back to hash them).
/// `Hash64::new(seed, len)`, then [`Hash64::word`] of each little-endian
/// 8-byte word of the data in order (the last one zero-padded), then
/// [`Hash64::finish`], is `hash64(data, seed)`.
#[derive(Debug, Clone, Copy)]
pub struct Hash64(u64);

impl Hash64 {
    const M: u64 = 0x9E37_79B9_7F4A_7C15;

    /// The state before the first word of `len` bytes of data.
    #[inline(always)]
    pub fn new(seed: u64, len: usize) -> Self {
        Hash64(fmix64(seed ^ (len as u64).wrapping_mul(Self::M)))
    }

    /// Folds in the next word.
    #[inline(always)]
    pub fn word(&mut self, v: u64) {
        self.0 = (self.0 ^ fmix64(v ^ Self::M))
            .wrapping_mul(Self::M)
            .rotate_left(29);
    }

    /// The hash.
    #[inline(always)]
    pub fn finish(self) -> u64 {
        fmix64(self.0)
    }
}

#[cfg(test)]
mod hash64_tests {
    use super::*;

    #[test]
    fn hash64_keeps_its_values() {
        // Checksums in remote memory depend on these (computed
        // independently of this code).
        assert_eq!(hash64(b"", 0), 0);
        assert_eq!(hash64(b"0123456789abcdefXYZ", 7), 0x728a_da8a_2767_2769);
        let d: Vec<u8> = (0..40).collect();
        assert_eq!(hash64(&d, 0xDEAD_BEEF), 0x1a26_3d98_92fd_7860);
    }

    #[test]
    fn word_by_word_is_hash64() {
        let d: Vec<u8> = (0..67u8).map(|i| i.wrapping_mul(37) ^ 0x5A).collect();
        for len in 0..=d.len() {
            let mut h = Hash64::new(len as u64 * 3, len);
            for c in d[..len].chunks(8) {
                let mut w = [0u8; 8];
                w[..c.len()].copy_from_slice(c);
                h.word(u64::from_le_bytes(w));
            }
            assert_eq!(h.finish(), hash64(&d[..len], len as u64 * 3), "len {len}");
        }
    }
}

#[cfg(test)]
mod int_hasher_tests {
    use super::*;
    use std::hash::{BuildHasher, Hash};

    fn h<T: Hash>(v: T) -> u64 {
        BuildHasherDefault::<IntHasher>::default().hash_one(v)
    }

    #[test]
    fn aligned_keys_spread_over_the_low_bits() {
        // 4096 cache-line-aligned addresses: the low 12 bits (a 4096-bucket
        // table's index) take about 1 - 1/e of the 4096 values when the hash
        // mixes well; a bare product gives at most 64 (its low 6 bits are 0).
        let mut seen = std::collections::HashSet::new();
        for k in 0..4096u64 {
            seen.insert(h(0x7f00_0000_0000 + k * 64) & 4095);
        }
        assert!(seen.len() > 2000, "{} distinct bucket indexes", seen.len());
    }

    #[test]
    fn every_field_of_a_key_counts() {
        assert_ne!(h((0u16, 4096u64)), h((1u16, 4096u64)));
    }
}
