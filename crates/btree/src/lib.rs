//! # dmkit-btree — a Sherman-style B-link tree, and SMART-BT
//!
//! A B+tree whose nodes live on memory nodes and whose clients reach them
//! with one-sided verbs only: Sherman's design ("Sherman: A Write-Optimized
//! Distributed B+Tree Index on Disaggregated Memory", SIGMOD'22, as
//! summarised in the SMART radix tree paper, OSDI'23 §2.2/§3.1, and in
//! SwordBox, NSDI'24 §2.3/§4.4.1) with SMART-BT's changes (SMART,
//! ASPLOS'24 §5.2, §6.2.3). It stands on the index layer
//! ([`dmkit_index`]) and the dmkit runtime; its layouts are in [`layout`].
//!
//! ## Structure
//! - A **B-link tree** (Lehman–Yao): every node has a lower and an upper
//!   fence key and a pointer to its right sibling, so a reader that reaches
//!   a node whose range no longer holds its key (a split not yet in the
//!   parent, a stale cached parent) moves right. Node levels never change
//!   and lower fences never change, which is what makes stale pointers safe.
//! - Nodes are 1 KiB by default ([`BtreeConfig::node_bytes`]), or sized for
//!   a given span ([`BtreeConfig::span`], Sherman's default is 32; a node
//!   beyond the runtime allocator's largest block, 8,128 B — long keys or
//!   large values at span 32 — comes from the tree's own bump class, see
//!   `alloc`). Leaves
//!   are unsorted (an insert fills an empty slot with one small WRITE);
//!   internal nodes are sorted and rewritten whole.
//! - Torn reads are caught by per-entry versions and checksums (see
//!   [`layout`] for why dmkit does not rely on cacheline atomicity as
//!   SMART-BT does, nor on in-order placement as Sherman's two-level
//!   versions do). Readers never lock.
//!
//! ## Writes
//! Every write locks its node: [`hocl`], Sherman's hierarchical on-chip
//! lock — a lock table per memory node (in on-NIC device memory when the
//! fabric has it), and a local lock table per compute machine with bounded
//! hand-over. The lock CAS and the node READ go in one batch; the entry (or
//! node) WRITE and the unlock WRITE go in one batch (queue-pair order puts
//! the release after the data). Updates and deletes write one slot.
//! An insert into a full leaf splits it: the upper half goes to a new
//! sibling (written first), the leaf is rewritten with a new version and
//! the new upper fence, then the separator is inserted into the parent
//! (locked the same way, splitting upwards; a new root is swung in by CAS
//! on the descriptor). A client holds one lock at a time.
//!
//! ## Delete: lazy
//! A delete clears the entry's valid bit; nodes are never merged or freed.
//! Sherman does the same. Merging would need a second lock per delete (the
//! neighbour), a way to retire a node that readers reach through stale
//! cached pointers, and it would break the property the speculative lookup
//! rests on: a valid slot holding a key is that key's only live copy,
//! because a node's slots never move to a node that is later freed. Empty
//! leaves cost space, not correctness; the tree never shrinks.
//!
//! ## Caches
//! [`cache`] (one of each per compute machine): snapshots of internal nodes
//! in the index layer's byte-budget [`dmkit_index::NodeCache`] (least
//! recently used go first), the level-1 ones also indexed by lower fence so
//! a warm lookup reaches its leaf with no remote read of internal nodes;
//! the tree validates what the cache led to by the leaf's fences. And
//! SMART-BT's **speculative lookup**: key → address of the slot that last
//! held it; a search first reads that slot alone (≈ one entry instead of a
//! whole leaf) and accepts it if its checksum holds, it is valid and holds
//! the key; otherwise it falls back to the normal path.
//!
//! ## Round trips (warm cache)
//! search 1 (the slot, or the leaf); update and delete 2 (lock + read,
//! write + unlock); insert 2, plus 1–3 per split level.
//!
//! ## Switches (Figure 12's series)
//! Sherman+ = speculative lookup off and the runtime's SMART techniques off
//! (`--thread-aware off --throttle off --conflict-avoid off`); SMART-BT =
//! all on. `hocl`, `combine`, `on_chip_locks`, the cache budget and the
//! node size are switches too: with the `cli` feature [`BtreeConfig`] is a
//! set of command-line flags. `combine` off is the B+tree of SMART's
//! artifact, the code behind ASPLOS'24 Figure 12: lock CAS, node READ,
//! entry WRITE and unlock each synchronous, four round trips per write.
//!
//! ## The index layer
//! [`Btree`] is a [`dmkit_index::RemoteMap`] (ordered) and [`BtreeClient`]
//! a [`dmkit_index::MapClient`]: the tree is created, opened and destroyed
//! through the layer's descriptor lifecycle (magic `dmBTRE`, layout
//! version 2), its operations' task-local memory is declared once
//! ([`dmkit_index::RemoteMap::local_layout`]), errors are the layer's
//! [`IndexError`], and every retry loop counts its lost races in a
//! [`dmkit_index::Retry`] and backs off through the runtime, giving up
//! with [`IndexError::Timeout`] after [`BtreeConfig::retry`].
//! [`BtreeConfig`] sizes itself for a workload
//! ([`dmkit_index::IndexConfig`]).
//!
//! ## Not here
//! A lock holder that dies leaves its node locked (no lease): its waiters
//! give up after their retry budget. Range scans read leaves one after
//! another along sibling pointers (Sherman reads the leaves named by a
//! cached parent in parallel).

mod alloc;
pub mod cache;
pub mod check;
pub mod hocl;
pub mod layout;
pub mod tree;

pub use check::{check_tree, check_tree_after_crash, TreeReport};
pub use dmkit_index::IndexError;
pub use tree::{Btree, BtreeClient, BtreeConfig, TreeCounters, KIND};
