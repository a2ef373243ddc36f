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
pub fn fmix64(mut k: u64) -> u64 {
    k ^= k >> 33;
    k = k.wrapping_mul(0xff51_afd7_ed55_8ccd);
    k ^= k >> 33;
    k = k.wrapping_mul(0xc4ce_b9fe_1a85_ec53);
    k ^ (k >> 33)
}

/// A 64-bit hash of `data` (8 bytes per step, murmur3's finaliser).
pub fn hash64(data: &[u8], seed: u64) -> u64 {
    const M: u64 = 0x9E37_79B9_7F4A_7C15;
    let mut h = fmix64(seed ^ (data.len() as u64).wrapping_mul(M));
    let mut chunks = data.chunks_exact(8);
    for c in &mut chunks {
        let v = u64::from_le_bytes(c.try_into().expect("8-byte chunk"));
        h = (h ^ fmix64(v ^ M)).wrapping_mul(M).rotate_left(29);
    }
    let rem = chunks.remainder();
    if !rem.is_empty() {
        let mut b = [0u8; 8];
        b[..rem.len()].copy_from_slice(rem);
        h = (h ^ fmix64(u64::from_le_bytes(b) ^ M))
            .wrapping_mul(M)
            .rotate_left(29);
    }
    fmix64(h)
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
