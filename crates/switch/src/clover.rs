//! Clover's words as the switch reads them (dmkit-clover's `layout`, "The
//! next word"): a CAS that appends to a chain compares with the tail's
//! *empty* word, which names the key and its state, and swaps in a *link*
//! to the new version. The switch needs nothing else to know which key an
//! append is for and where the new tail will be (SwordBox §4.4.2: "SwordBox
//! infers the operation ... and extracts the Clover key").
//!
//! ```text
//!  empty:  1 | present | CLOVER_TAG (14) | key id (48)
//!  link:   0 | present | 0 (14)          | new version (48-bit pointer)
//! ```

use dmkit_fabric::GlobalAddr;

/// The 14-bit tag of Clover's empty words.
pub const CLOVER_TAG: u64 = 0x2C1F;

const LOW48: u64 = (1 << 48) - 1;

/// A Clover append's compare operand: (key id, whether the operation
/// expects the key present); `None` if the word is not Clover's.
pub fn empty(w: u64) -> Option<(u64, bool)> {
    (w >> 63 == 1 && (w >> 48) & 0x3FFF == CLOVER_TAG).then_some((w & LOW48, (w >> 62) & 1 == 1))
}

/// A Clover append's swap operand: (the new version's address, whether it
/// holds a value); `None` if the word is not a link.
pub fn link(w: u64) -> Option<(u64, bool)> {
    (w >> 63 == 0 && (w >> 48) & 0x3FFF == 0 && w & LOW48 != 0)
        .then(|| (GlobalAddr::from_ptr48(w).raw(), (w >> 62) & 1 == 1))
}

/// The empty word of key `key` (state `present`): what a CAS steered to a
/// version of that key compares with.
pub fn empty_word(key: u64, present: bool) -> u64 {
    1 << 63 | (present as u64) << 62 | CLOVER_TAG << 48 | (key & LOW48)
}
