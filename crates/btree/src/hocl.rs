//! Sherman's hierarchical on-chip lock (HOCL; Sherman, SIGMOD'22 §4.2,
//! summarised in the SMART radix tree paper, OSDI'23 §2.2, and in
//! SwordBox, NSDI'24 §2.3): node locks live in a lock table on each memory
//! node (in on-NIC device memory when the fabric has it — atomics there
//! skip the host's PCIe, SwordBox §3.2 Fig. 4), and each compute machine
//! keeps a local lock table with one entry per remote lock word, so the
//! machine's clients queue locally instead of retrying CAS over the
//! network. When a holder releases a lock another local client is waiting
//! for, it hands the remote lock over without releasing it, at most
//! `max_handover` times in a row (fairness to other machines).
//!
//! The local table is a [`TicketLocks`] (one ticket lock per remote lock
//! word of every memory node, shared with the hash table's hot area).

use dmkit_runtime::machine::TicketLocks;

use crate::layout::LOCK_WORDS;

/// The local lock table of one compute machine for a tree over `nodes`
/// memory nodes: one entry per remote lock word.
pub fn local_locks(nodes: usize, max_handover: u32) -> TicketLocks {
    TicketLocks::new(nodes * LOCK_WORDS as usize, max_handover)
}
