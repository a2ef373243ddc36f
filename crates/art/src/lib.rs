//! # dmkit-art — the SMART adaptive radix tree on disaggregated memory
//!
//! A radix tree whose nodes live on memory nodes and whose clients reach
//! them with one-sided verbs only, after "SMART: A High-Performance
//! Adaptive Radix Tree for Disaggregated Memory" (Luo et al., OSDI'23,
//! §3–§4), running over the dmkit runtime (per-thread queue pairs,
//! work-request throttling, conflict avoidance) and standing on the index
//! layer, `dmkit-index` (below). Layouts are in [`layout`].
//!
//! Not here: the runtime's verbs and backoff (`dmkit-runtime`), the
//! lifecycle, retry budget, node cache and conformance suite every index
//! shares (`dmkit-index`), the benchmarks (`dmkit-bench`).
//!
//! ## Hybrid concurrency control (§4.1)
//! - **Internal nodes are lock-free.** Slots carry their partial key next
//!   to the child pointer, so one CAS changes both. Every node has room for
//!   256 slots; its type (NODE_4/16/48/256) says how many are visible, and
//!   reads fetch only those (§4.1.1).
//!   - *Normal insert*: WRITE the leaf, CAS the first empty visible slot;
//!     on failure, follow the winner if it holds our byte, else try the
//!     next empty slot.
//!   - *Type switch*, in place: CAS empty slots past the visible ones, then
//!     raise the header's type and then the parent slot's (CAS loops). A
//!     client that finds its byte in a not yet visible slot helps raise the
//!     type before it goes on, so its own insert is never invisible.
//!   - *Leaf split*: WRITE the nodes holding the rest of the two keys'
//!     common prefix (six partial keys per header, pessimistic) and the new
//!     leaf, then CAS the slot from the old leaf to the first new node.
//!   - *Header split*: a new NODE_4 with the matched partial keys and one
//!     slot for the old node, published by CAS of the parent slot; then a
//!     CAS drops the moved partial keys from the old node's header; the
//!     insert then continues from the new node (the paper writes the new
//!     leaf with the new node, one round trip fewer).
//!     Readers compare a header's depth with the key position they arrived
//!     at: behind = the redundant partial keys of a split in progress
//!     (skipped), ahead = they read the parent before the split (start
//!     over).
//!     *The window between the two CASes.* Other clients reach the new
//!     node M through the parent and can insert below it before the old
//!     node N's header is cut, so a reader that reaches N by its old link
//!     sees N's old header, which a key below M leaves. A reader that read
//!     the parent in the same operation may say "absent": that insert came
//!     after the parent read, inside the operation. A reader whose link
//!     came from a cached parent snapshot (taken before the operation)
//!     re-reads that slot before it reports a key that leaves N's header
//!     absent (one more round trip, on that path only; an insert skips it,
//!     as the header split it starts CASes that slot), and starts over if
//!     the slot no longer names N. This is sound because a node slot only
//!     ever moves to a node that a header split put above its node, never
//!     back: if it names N after N was read, it named N then, and N's
//!     header then proved the key absent. Only a mismatch needs the check:
//!     a key that passes N's whole header has N's full prefix, and such
//!     keys are below N at all times (see Scans). SMART's artifact checks
//!     nothing there (a header mismatch ends its search, cached path or
//!     not); `tree::split_window_tests` builds the window step by step.
//!     *Helping the cut.* An insert that arrives at N through M (behind
//!     its header) and would split N's header again cuts N's header for
//!     the splitter first (CAS from the uncut header it read, by the bytes
//!     its arrival says M took; then N's reverse pointer), as inserts help
//!     a type switch, and starts over; the splitter accepts a cut it finds
//!     done. Without it, a splitter that died between its CASes would
//!     block those inserts until their retries ran out.
//! - **Leaves are updated in place under a lock** (`in_place`, default):
//!   CAS the lock word at the leaf's rear with a READ of the leaf behind it
//!   in the same batch, then one WRITE of the item, its checksum and the
//!   free lock — the rear embedded lock; on fabrics without in-order
//!   placement inside a WRITE, a second WRITE in the same batch releases it
//!   (queue-pair order). Readers check the checksum and re-read torn leaves.
//!   Without write combining, a machine's writers of a leaf queue on a
//!   local lock first and hand the remote lock over (Sherman's HOCL, which
//!   the paper gives its baselines; with the rear lock, its E-HOCL): the
//!   holder with a local waiter behind it writes the leaf back without
//!   freeing the lock, at most `leaf_handover` times in a row, and the
//!   waiter writes it without a CAS, starting from the leaf its
//!   predecessor wrote back (nobody else wrote it since; with
//!   `handover_reread` it reads the leaf again). The local locks are
//!   hashed by the leaf's address; a writer handed another leaf's lock
//!   releases it and takes its own. A lock handed over keeps its lease.
//!   With `in_place` off, leaves are replaced out of place (RCU, §4.5): the
//!   old leaf is marked replaced by CAS, then the slot swings to the new one.
//!   The mark carries a lease deadline in place of the leaf's checksum; a
//!   client that finds it expired with the leaf still in its slot rolls it
//!   back (the old leaf is intact) and takes the dead updater's unlinked
//!   new leaf into its own allocator: the updater names it in the old
//!   leaf's *intent* word (its rear word, unlocked in this mode) once its
//!   mark won, in the doorbell of its slot CAS — see `ArtClient`'s
//!   out-of-place update for the ownership rule and what stays leaked.
//! - **Delete** marks the leaf deleted (under its lock, or by CAS in RCU
//!   mode). The slot keeps its partial key and points at the dead leaf
//!   until an insert of a key with that byte replaces it: partial keys never
//!   change, so two inserts of one byte always meet in one slot. Empty
//!   internal nodes are not merged back (the paper's reverse of leaf and
//!   header splits is not done); the tree never shrinks.
//!
//! ## Cache (§4.3)
//! [`cache`]: snapshots of internal nodes in the index layer's
//! `NodeCache`, one per compute machine under a byte budget with the root
//! pinned, validated by the tree's reverse check when a traversal leaves
//! them.
//!
//! ## Scans (§4.4)
//! A scan keeps a list of pending items (nodes, leaves, entries found) in
//! key order and reads the first ones in parallel each round; a node read
//! expands into its children within the bounds. Scans are not atomic, as
//! in the paper and Sherman, but every key present throughout a scan is
//! returned, no key absent throughout it is, in order and once. A node
//! whose header is not where its path says (a header split finished after
//! its parent was read) restarts the scan.
//!
//! With `scan_from_cache` (on by default; off: from the root) a scan
//! starts at the deepest node on its start key's path that the cache
//! names, as SMART's artifact starts a range query from its cache
//! (`search_range_from_cache`) — but unlike the artifact, which expands
//! the cached nodes' slots, every node is read from remote memory: a
//! snapshot can miss a slot filled since. The cached walk from the root
//! along the start key `lo` (each child named by its parent's snapshot,
//! its own snapshot naming that parent and arrived at no deeper than its
//! header, as a search's) gives nodes A0 = root, …, Ak whose *full prefix*
//! F(Ai) — the key bytes before its branching byte — is a prefix of `lo`.
//! The scan's items are Ak, then, for i = k−1 … 0, Ai's continuation: Ai
//! with the lower bound succ(F(Ai+1)) (the least string above every key
//! that starts with F(Ai+1)), in which Ai+1 is skipped wherever it shows
//! up. Each is read when the scan reaches it (a continuation counts as its
//! snapshot's slots past the start key when the scan sizes a round).
//! Why this is correct:
//! - *Prefixes never change.* Nodes are never moved, freed or merged;
//!   type switches are in place; a leaf split only turns a leaf slot into
//!   a node; a header split puts a new node M above node N and then cuts
//!   N's header by the bytes M took — N's depth grows by exactly their
//!   number, so the bytes N stands for, and its branching position, are
//!   those it had. So F(N) is fixed when N is published, and a snapshot of
//!   any age gives it: the walk reads each byte of F off the start key, and
//!   a pair of snapshots that name each other showed a real parent and
//!   child at some time. As the tree is a trie, the keys with prefix F(N)
//!   are in N's subtree at all times after N is published.
//! - *Nothing is missed.* Take a key x ≥ `lo` present throughout the
//!   scan, and the last Aj with F(Aj) a prefix of x. If j = k, x is in Ak's
//!   subtree when Ak is read, and the walk below a node read now finds
//!   what is there (as from the root). Otherwise x does not start with
//!   F(Aj+1) while `lo` does, so x ≥ succ(F(Aj+1)) — Aj's bound — and x is
//!   in Aj's subtree, outside Aj+1's: Aj's continuation finds it. The
//!   skip drops only Aj+1's subtree, all of whose keys are below the
//!   bound. A stale path is no hole: if a header split put M between Aj
//!   and Aj+1 since the snapshots, Aj's slot leads to M, which is read
//!   with the bound (its keys outside Aj+1 are all below `lo` or above the
//!   bound), and a cut Aj+1 read at its old depth restarts the scan (its
//!   snapshot is dropped).
//! - *Nothing twice, in order.* Ak's keys start with F(Ak); Ai's
//!   continuation holds keys from succ(F(Ai+1)) up to the keys starting
//!   with F(Ai), all below succ(F(Ai)), where Ai−1's continuation
//!   starts: the items cover disjoint, increasing key ranges, and leaves
//!   are checked against their item's bound as well.
//!
//! A scan puts the nodes it reads into the cache (as the artifact's
//! `range_query_on_page` does), so a machine's next scans find their
//! paths; after `CACHED_ATTEMPTS` restarts a scan starts from the root.
//!
//! ## Round trips (common path, warm cache)
//! search 1 (the leaf); update 2 (lock + read, write-back + unlock);
//! insert 2–3 (the node where it goes, then leaf + CAS); delete 2; scan
//! of n entries: the start node, then its leaves and the nodes past it
//! (from the cache's start node, not the root).
//!
//! ## Read delegation and write combining (§4.2)
//! [`rdwc`]: tasks of one compute machine (all its workers' clients) that
//! search or update one key at the same time share one remote operation,
//! within windows that keep every operation linearizable.
//!
//! ## Figure 15's switches
//! `lock_free_internal` (off: every internal-node change under a remote
//! node lock, the naive baseline; as the paper applies Sherman's HOCL to
//! its baselines, a machine's clients queue on a local table first and
//! hand the remote lock over up to 8 times), `in_place`, `rear_lock`,
//! `read_delegation`, `write_combining` and the cache budget; `dmkit sim
//! reproduce smart-art-fig15` switches them on one by one. Figure 16's:
//! `leaf_hocl` (`--leaf-hocl`) and `leaf_handover` (`--leaf-handover`, 8
//! as in Sherman) with `rear_lock`, counted in
//! `TreeCounters::lock_handovers`; `handover_reread`
//! (`--leaf-handover-reread`) for dmkit's E-HOCL before the hand-over
//! carried the leaf.
//!
//! ## Figure 17's switches
//! `node_layout` (`--art-node-layout fixed-types|homogeneous`: ART's four
//! node sizes, the default so far, or the finer ones of SMART's artifact;
//! stored in the tree) and `cache_index` (`--art-cache-index art|hash`:
//! the cache found through its snapshots' own slots, or through a hash
//! set keyed by key prefix that each entry pays for); see [`cache`].
//! The paper's SMART is `homogeneous` + `art`.
//!
//! ## The index layer
//! [`ArtTree`] is a `dmkit_index::RemoteMap` (ordered) and [`ArtClient`] a
//! `dmkit_index::MapClient`: the tree is created, opened and destroyed
//! through the layer's descriptor lifecycle (root `art/NAME`, descriptor
//! magic `dmART_`, layout version 3), its operations' task-local memory
//! is declared once (`RemoteMap::local_layout`), every retry loop counts
//! in a `dmkit_index::Retry` on the configuration's `RetryPolicy` and backs
//! off through the runtime, and errors are the layer's [`IndexError`]. An
//! operation refused or stopped before its publishing CAS (bad input,
//! memory exhausted, retries spent) has changed nothing a reader can see:
//! what it wrote stays unpublished. One that fails after it (a fabric
//! error) leaves the tree consistent — a split half done is a state
//! readers already step through — with its change possibly made. [`ArtConfig`] sizes
//! itself for a workload (`dmkit_index::IndexConfig`) and, with the `cli`
//! feature, its switches are command-line flags.
//!
//! ## Not (yet) here
//! Reclamation of dead leaves (a deleted or replaced leaf is never reused;
//! its memory returns when the tree is destroyed; so does the new leaf of
//! an out-of-place update whose client died before its mark won or
//! before it named the leaf in the intent word — one round trip — and a
//! dead client's free blocks and chunk tail). Locks and
//! "replaced" marks are leases (`dmkit_index::lease`): a dead client's
//! lock is broken, and its mark undone, once the lease ran out.

pub mod cache;
pub mod check;
pub mod layout;
pub mod rdwc;
pub mod tree;

pub use check::{check_tree, check_tree_after_crash, TreeReport};
pub use dmkit_index::IndexError;
pub use tree::{ArtClient, ArtConfig, ArtTree, TreeCounters, KIND};
