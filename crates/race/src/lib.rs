//! # dmkit-race — RACE hashing on disaggregated memory (SMART-HT)
//!
//! A one-sided extendible hash table after RACE (Zuo et al., ATC'20 /
//! TOS'22) as SMART ports it (SMART, ASPLOS'24 §3.3, §5.2: "SMART-HT uses
//! the same hashing scheme as RACE"), running over the dmkit runtime so the
//! SMART techniques (thread-aware queue pairs, work-request throttling,
//! conflict avoidance through `backoff_cas`) apply unchanged. Layouts are in
//! [`layout`].
//!
//! ```
//! use std::sync::Arc;
//! use dmkit_fabric::shm::{ShmConfig, ShmFabric};
//! use dmkit_index::{MapClient, RemoteMap};
//! use dmkit_race::{RaceConfig, RaceTable};
//! use dmkit_runtime::Worker;
//!
//! // An embedded 64 MiB memory node and a table on it.
//! let fabric = Arc::new(ShmFabric::one_node(ShmConfig::default(), 64 << 20).unwrap());
//! let table = RaceTable::create(fabric.clone(), "doc", RaceConfig::default()).unwrap();
//! // A worker whose tasks have the memory the table declared.
//! let mut worker = Worker::builder(fabric.as_ref()).local(table.local_layout()).build().unwrap();
//! let client = table.client(1);
//! worker.spawn(move |ctx| async move {
//!     assert!(client.insert(&ctx, b"key", b"value").await.unwrap());
//!     assert_eq!(client.search(&ctx, b"key").await.unwrap(), Some(b"value".to_vec()));
//! });
//! worker.run();
//! table.destroy().unwrap();
//! ```
//!
//! ## Structure
//! A directory of subtables indexed by the low `global_depth` bits of the
//! key's hash; each subtable is an array of bucket groups (main bucket,
//! shared overflow bucket, main bucket), so every key has two *combined
//! buckets* (main + overflow, 128 B, one READ each) chosen by two hashes.
//! Slots are 8 bytes (fingerprint, length, 48-bit pointer) and point to
//! out-of-place key-value blocks with a checksum. Subtables are spread over
//! all memory nodes of the fabric (sharding); blocks are allocated on the
//! node of their key's subtable when it has room.
//!
//! ## Operations (round trips on the common path)
//! - **search**: READ both combined buckets (one doorbell), then the blocks
//!   whose fingerprint matches: 2 round trips, 3 READs. With the client
//!   cache (key → slot and its last value) a hit READs the slot and the
//!   block together: 1. A key not found is looked for again with the
//!   subtable header (below) before the search answers "absent".
//! - **insert** (if absent): WRITE the block, CAS the key's *insert lock*
//!   (one word per combined bucket, taken on the key's first choice), READ
//!   the subtable's split word and both combined buckets — one batch; the
//!   duplicate check (blocks of fingerprint matches, rarely needed); then
//!   CAS an empty slot and release the lock in one batch. The insert lock is
//!   how dmkit keeps keys unique: two concurrent inserts of one key take the
//!   same lock, so the second sees the first (RACE's own answer, re-reading
//!   after the CAS and deleting duplicates, leaves a window in which two
//!   slots hold the key and searches can flip between them).
//! - **update** / **delete**: locate the slot (or take it from the cache),
//!   then `backoff_cas` it to the new block / to empty; on failure locate
//!   again. The new block's WRITE rides in the CAS's batch when both live on
//!   one node (queue-pair order puts it first). The old block is retired.
//!
//! ## Online split (RACE's resizing; compiled out in the ported anchor)
//! When an insert finds both combined buckets full it splits the subtable
//! (local depth `d`, suffix `s`) into `s` and `s | 1<<d`:
//! 1. take the subtable's split lock and allocate and initialise the new
//!    subtable (unpublished, so nobody reads it yet);
//! 2. wait until every insert lock is seen free once: inserters that got a
//!    lock before the split lock read it as free and finish; later ones read
//!    the split word in their locking batch and back off without writing;
//! 3. for every slot whose key has bit `d` set, CAS it to *frozen* (the
//!    slot's M bit); a concurrent update or delete makes the CAS fail and is
//!    retried with the new value. Frozen slots never change again, and a
//!    reader that finds its key frozen retries through the directory;
//! 4. copy the frozen words (without M) to the same positions of the new
//!    subtable (bucket positions depend on hash bits above the suffix);
//! 5. rewrite the old subtable's bucket headers to depth `d+1`, so readers
//!    with a stale directory notice it from the buckets they read;
//! 6. publish under the directory lock (doubling the directory first when
//!    `d` equals the global depth: upper half copied, then depth raised);
//! 7. clear the frozen originals, then release the split lock.
//!
//! Every bucket READ that may conclude a key's absence (every one of an
//! insert, update or delete; a search's second) is followed, in the same
//! batch, by a READ of the subtable header; a reader accepts what it read
//! only if the header's depth equals the depth in the buckets it read.
//! Queue-pair order puts that header READ after the bucket READs, so a
//! reader that saw pre-split buckets also saw that the flip (step 5, which
//! precedes the clearing of step 7) had not happened yet: it never mistakes
//! a cleared or reused slot for its key's absence. A search's first READ of
//! the buckets goes without the header: a key it finds in a slot that is not
//! frozen, with its block's key and checksum, was there when the slot was
//! read (a split freezes a slot before it moves the key). `sim check
//! --scenario race` fails at seed 4 if absence is concluded without the
//! header, and passes 3,000 seeds with this rule. (An earlier version kept frozen slots for a grace period
//! instead; inserts could then find their buckets full of frozen slots and
//! split again and again — a stress loop caught a subtable reaching
//! `max_depth` that way.)
//!
//! ## Reclamation and what it assumes
//! Replaced blocks are reused only after a grace period
//! (`RaceConfig::grace`, 100 ms by default, measured on the clients' clocks).
//! Every lookup notes the time before it reads slots and checks, once it has
//! the blocks, that less than half the grace period has passed; otherwise it
//! starts over. So a block a reader fetched is the one its slot named, even
//! if the reader was descheduled in between. Each client's clock may be off
//! by at most `grace / 8` (one host: CLOCK_MONOTONIC; across machines, a
//! bounded skew — the same kind of assumption as the lock leases of
//! `dmkit-index::lease`): quarantine is measured on the retiring client's
//! clock, the reader's give-up on its own, and with offsets within `±B`
//! either measurement can be off by `2B`, so the rule holds while
//! `grace / 2 + 2B ≤ grace − 2B`, i.e. `B ≤ grace / 8` (the bound
//! `dmkit sim check --scenario race` checks with).
//! The checksum catches torn and foreign blocks on top of that.

//! ## Hot area (memory-semantics study §IV-B)
//! Optionally, keys named at creation ([`RaceConfig::hot_keys`], e.g. the
//! likeliest keys of a skewed workload) live outside the RACE table in
//! blocks of `2^t` entries: a compute machine takes a block's remote lock,
//! serves its tasks' operations from a local copy, hands the block from
//! task to task while they queue for it, and writes it back with one WRITE
//! per `θ` modifications (IO consolidation). Searches of a free block read
//! the lock word and the entry in one round trip. See [`hot`].
//!
//! ## Multi-version cold entries (memory-semantics study §IV-B)
//! With [`RaceConfig::cold_versions`] `K ≥ 2` (stored in the table) every
//! block is a multi-version block ([`layout`]'s drawing): a version
//! counter, one commit word per slot, and `K` slots, each carrying its
//! version, the value and a checksum over both. The slot word still names
//! the block; inserts and deletes are unchanged. An **update** is the
//! study's "the writer first gets a version number ... by RDMA fetch and
//! add, and then writes the data ... via RDMA Write":
//! 1. READ both combined buckets (skipped on a cache hit);
//! 2. FAA the counter of the block the first fingerprint match of the
//!    key's block size names, ∥ READ that block's prefix — header, key and
//!    commit words, not the slots: version `v`, the key to check, and
//!    whether slot `v mod K` is free for `v`;
//! 3. WRITE slot `v mod K` (version, value, checksum) ∥ WRITE its commit
//!    word `v`, posted in that order.
//!
//! A **search** reads the block as before and takes the complete slot with
//! the highest version (commit words play no part in it).
//!
//! *Writers never overwrite a newer version.* Slot `s` is written by
//! versions `s, s+K, s+2K, …`; commit word `s` holds the newest of them
//! whose slot WRITE has landed in full: its writer posts it right after the
//! slot's WRITE, and requests of one queue pair take effect in posting
//! order (the fabric contract), so it lands after every word of the slot,
//! whatever the placement inside one WRITE. Writer `v` writes only once its
//! READ (or a re-read of the commit word, up to [`table::MV_WAIT_POLLS`],
//! with the runtime's backoff between) shows commit word `s` at `v−K`, and
//! only writer `v−K` ever stores `v−K` there. So each slot's versions land
//! one at a time and in order, and the newest complete version of a block
//! only grows: a max-register, whose reads (the highest complete slot of
//! one READ) are linearizable. Writers of one key run in parallel up to
//! `K` versions apart; a writer whose slot's previous version stays in
//! flight — its writer slow, or dead after its FAA (or between its two
//! WRITEs) — gives up the fast path and updates out of place (a fresh
//! block, CAS on the slot word, as with `K = 0`), so a dead writer costs
//! its successors one slow update each, never a blocked key. A version
//! taken and not written (a foreign fingerprint match's FAA, a stalled
//! writer, a dead one) is such a hole. The prefix READ is 64 bytes for an
//! 8-byte key and `K = 4` with 64-byte values, where reading the slots as
//! well would be the whole six-unit block.
//!
//! *A slot overwritten while a slow reader reads it.* The reader's READ can
//! see the slot half old, half new. The slot's checksum (over version, length
//! and value) fails, so the slot is never returned; its version word (one
//! atomic 8-byte word) is the old or the new version, and the slot can hide
//! nothing newer than that. The reader passes over it when another complete
//! slot holds a higher version than that word, and otherwise reads the
//! block again — the lookup's retry budget ([`dmkit_index::RetryPolicy`])
//! bounds those reads, then [`IndexError::Timeout`]. A retry waits for one
//! WRITE to land; only a writer that dies halfway through its WRITE (a cut
//! connection) leaves a slot torn until the key's next update.
//!
//! *Blocks that change owner.* An out-of-place update or a delete retires
//! the block; the grace period keeps it from reuse while a writer that read
//! its slot word may still FAA or WRITE it (writers check the stall bound
//! before the WRITE, as every lookup does). Such a late write lands in a
//! retired block; the update is ordered before the CAS that retired it.
//!
//! ## Limits
//! A client that dies while holding an insert lock or a split lock blocks
//! inserts into that bucket or subtable (there is no lease on them yet).
//! Errors are the index layer's ([`IndexError`]); an operation that
//! returns an error has changed nothing visible: a table at `max_depth`
//! whose buckets are full returns [`IndexError::Full`] for that insert and
//! stays usable. Retry loops give up after the table's
//! [`dmkit_index::RetryPolicy`] with [`IndexError::Timeout`].
//!
//! ## The index layer
//! [`RaceTable`] is a [`dmkit_index::RemoteMap`] and [`RaceClient`] a
//! [`dmkit_index::MapClient`]: the table is created, opened and destroyed
//! through the layer's descriptor lifecycle (directory magic `dmRACE`,
//! layout version 2), its operations' task-local memory is declared once
//! ([`dmkit_index::RemoteMap::local_layout`]), and its retries back off
//! through the runtime. [`RaceConfig`] sizes itself for a workload
//! ([`dmkit_index::IndexConfig`]) and, with the `cli` feature, its switches
//! are command-line flags.

pub mod hot;
pub mod layout;
pub mod table;

pub use dmkit_index::IndexError;
pub use table::{RaceClient, RaceConfig, RaceTable, TableCounters, KIND};
