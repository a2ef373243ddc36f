//! The remote layouts of the transaction tables: records, the undo log
//! and the database descriptor. Every word is little-endian; the code
//! encodes and decodes through these types.
//!
//! ## A record (one slot of a table's hash index)
//!
//! ```text
//!  offset 0       +--------------------------------------------------+
//!                 | key (u64)                                        |
//!  8              +--------------------------------------------------+
//!                 | payload: P bytes (the table's record size, a     |
//!                 | multiple of 8)                                   |
//!  8 + P          +----------------+---------------------------------+
//!                 | owner (16)     | lease deadline µs (48)          |  lock (primary only; 0 = free)
//!  16 + P         +--+--+----------+---------------------------------+
//!                 |D |A | version number (62)                        |  version
//!  24 + P         +--+--+--------------------------------------------+
//!   D = dirty: a commit is writing the record (readers abort)
//!   A = absent: the key was deleted (the slot keeps it: keys never move)
//!   version number 0 = an empty slot that was never written (once
//!   written a slot keeps a key for good: probes pass only empty slots)
//! ```
//!
//! The lock and the version sit *behind* the payload: one READ of the
//! whole record on a fabric with in-order placement sees the payload
//! before the version (a version read clean and unchanged proves the
//! payload was not being written: the dirty mark lands before any payload
//! word, on the same queue pair), and one 16-byte READ of the tail sees the
//! lock before the version (what validation needs: see `txn`'s docs).
//!
//! ## The undo log of a coordinator
//!
//! ```text
//!  word 0   lease word of the logging coordinator (owner | deadline; 0 = nothing to recover)
//!  word 1   transaction id
//!  word 2   state: 0 idle, 1 logged, 2 decided: roll back, 3 decided: roll forward
//!  word 3   entries
//!  then per entry: an EntryHead (4 words), the old key and old payload (1 + P/8 words)
//! ```

use zerocopy::{FromBytes, Immutable, IntoBytes, KnownLayout};

/// The dirty bit of a version word.
pub const DIRTY: u64 = 1 << 63;
/// The absent (deleted) bit of a version word.
pub const ABSENT: u64 = 1 << 62;
/// The version-number bits of a version word.
pub const NUMBER: u64 = ABSENT - 1;

/// A version word, decoded.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Version(pub u64);

impl Version {
    /// The version number (0: an empty slot).
    #[inline]
    pub fn number(self) -> u64 {
        self.0 & NUMBER
    }
    /// Whether a commit is writing the record.
    #[inline]
    pub fn dirty(self) -> bool {
        self.0 & DIRTY != 0
    }
    /// Whether the record's key is deleted.
    #[inline]
    pub fn absent(self) -> bool {
        self.0 & ABSENT != 0
    }
    /// Whether the slot never held a key.
    #[inline]
    pub fn empty(self) -> bool {
        self.number() == 0
    }
    /// Whether the record holds a live value.
    #[inline]
    pub fn present(self) -> bool {
        !self.empty() && !self.absent()
    }
    /// The word with `number` and the given flags.
    #[inline]
    pub fn make(number: u64, absent: bool) -> Version {
        assert!(number <= NUMBER, "version number overflow");
        Version(number | if absent { ABSENT } else { 0 })
    }
    /// The same word with the dirty bit set.
    #[inline]
    pub fn dirtied(self) -> Version {
        Version(self.0 | DIRTY)
    }
    /// The same word without the dirty bit.
    #[inline]
    pub fn cleaned(self) -> Version {
        Version(self.0 & !DIRTY)
    }
}

/// The two words behind a record's payload.
#[derive(
    Debug, Clone, Copy, Default, PartialEq, Eq, FromBytes, IntoBytes, Immutable, KnownLayout,
)]
#[repr(C)]
pub struct RecordTail {
    /// Lease lock word (`dmkit_index::lease`); used on the primary only.
    pub lock: u64,
    /// Version word ([`Version`]).
    pub version: u64,
}
const _: () = assert!(std::mem::size_of::<RecordTail>() == 16);

/// Bytes of a record with `payload` bytes of payload (a multiple of 8).
pub const fn record_bytes(payload: usize) -> usize {
    8 + payload + 16
}

/// Offset of the lock word in a record.
pub const fn lock_offset(payload: usize) -> usize {
    8 + payload
}

/// Offset of the version word in a record.
pub const fn version_offset(payload: usize) -> usize {
    16 + payload
}

/// The header of a coordinator's undo log.
#[derive(
    Debug, Clone, Copy, Default, PartialEq, Eq, FromBytes, IntoBytes, Immutable, KnownLayout,
)]
#[repr(C)]
pub struct LogHeader {
    /// Lease word of the coordinator while its transaction may have
    /// written records; 0 when nothing is left to recover.
    pub lease: u64,
    /// The logged transaction.
    pub txn: u64,
    /// [`LogState`] as a word.
    pub state: u64,
    /// Entries that follow.
    pub entries: u64,
}
const _: () = assert!(std::mem::size_of::<LogHeader>() == 32);

/// Where a log's transaction stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u64)]
pub enum LogState {
    /// Nothing logged.
    Idle = 0,
    /// Logged by its coordinator; commit writes may have begun.
    Logged = 1,
    /// A recoverer decided to roll the transaction back.
    RollBack = 2,
    /// A recoverer decided to roll it forward (it was already visible).
    RollForward = 3,
}

impl LogState {
    /// Decodes a state word.
    pub fn from_word(w: u64) -> Option<LogState> {
        Some(match w {
            0 => LogState::Idle,
            1 => LogState::Logged,
            2 => LogState::RollBack,
            3 => LogState::RollForward,
            _ => return None,
        })
    }
}

/// One undo-log entry's fixed part (followed by the old key and payload).
#[derive(
    Debug, Clone, Copy, Default, PartialEq, Eq, FromBytes, IntoBytes, Immutable, KnownLayout,
)]
#[repr(C)]
pub struct EntryHead {
    /// Table id (low 16 bits) and payload bytes (bits 16..48).
    pub table: u64,
    /// The record's slot number in its table.
    pub slot: u64,
    /// Its version word before the transaction.
    pub old: u64,
    /// The version word the transaction commits (clean).
    pub new: u64,
}
const _: () = assert!(std::mem::size_of::<EntryHead>() == 32);

impl EntryHead {
    /// Bytes of an entry for a record of `payload` bytes.
    pub const fn bytes(payload: usize) -> usize {
        32 + 8 + payload
    }
    /// The entry's table id.
    pub fn table_id(&self) -> u16 {
        self.table as u16
    }
    /// The entry's payload bytes.
    pub fn payload(&self) -> usize {
        ((self.table >> 16) & 0xFFFF_FFFF) as usize
    }
    /// The head of an entry for `table` with `payload` bytes.
    pub fn new(table: u16, payload: usize, slot: u64, old: u64, new: u64) -> EntryHead {
        EntryHead {
            table: table as u64 | (payload as u64) << 16,
            slot,
            old,
            new,
        }
    }
}

/// The first words of the database descriptor (the catalog follows).
#[derive(
    Debug, Clone, Copy, Default, PartialEq, Eq, FromBytes, IntoBytes, Immutable, KnownLayout,
)]
#[repr(C)]
pub struct DbHeader {
    /// [`crate::db::MAGIC`]'s word.
    pub magic: u64,
    /// The next coordinator id to hand out (FAA).
    pub next_coordinator: u64,
    /// Words of catalog behind this header.
    pub catalog_words: u64,
}
const _: () = assert!(std::mem::size_of::<DbHeader>() == 24);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn version_words_keep_their_flags_apart() {
        let v = Version::make(7, false);
        assert!(v.present() && !v.dirty() && v.number() == 7);
        let d = v.dirtied();
        assert!(d.dirty() && d.number() == 7 && d.cleaned() == v);
        let a = Version::make(9, true);
        assert!(a.absent() && !a.present() && !a.empty());
        assert!(Version(0).empty() && !Version(0).present());
        assert_eq!(record_bytes(8), 32);
        assert_eq!(version_offset(8) + 8, record_bytes(8));
        let e = EntryHead::new(3, 40, 11, 1, 2);
        assert_eq!((e.table_id(), e.payload()), (3, 40));
    }
}
