//! # dmkit-txn — distributed transactions on disaggregated memory
//!
//! FORD's one-sided optimistic concurrency control ("FORD: Fast One-sided
//! RDMA-based Distributed Transactions for Disaggregated Persistent
//! Memory", FAST'22) on SMART's runtime — SMART-DTX ("Scaling Up Memory
//! Disaggregated Applications with SMART", ASPLOS'24 §5.2, §6.2.2). The
//! memory nodes' CPUs stay idle: every step is a READ, WRITE or CAS.
//!
//! - [`db`]: tables of fixed-size records with a hash index each, sharded
//!   over the memory nodes with primary-backup replication of configurable
//!   degree; the descriptor's lifecycle; loading; quiescent checks.
//! - [`cache`]: the address cache (table, key) → record slot, one cache
//!   line per look-up.
//! - [`txn`]: coordinators and transactions — hitchhiked locking,
//!   validation, coalescent commit, undo logging; aborts back off through
//!   the runtime (conflict avoidance). Each FORD technique is a switch of
//!   [`TxnConfig`]; SMART's techniques are the runtime's switches, so
//!   FORD+ (SMART's baseline) and SMART-DTX are two configurations.
//! - [`recovery`]: a dead coordinator's transaction rolled back or
//!   forward from its undo log; its locks expire by lease.
//! - [`check`]: the serializability checker (a dependency-graph cycle
//!   search over recorded read and write sets).
//! - [`workload`]: SmallBank, TATP and TPC-C (NewOrder and Payment) with
//!   their consistency checks, and the local in-process peer.
//!
//! Not here: the benchmark harness (`dmkit-bench`'s `txn_bench`), FORD's
//! localized validation (its journal version), memory-node failures (the
//! undo log has `replicas` copies, as FORD's has one per memory node, but
//! recovery reads the first).
//!
//! Persistence: FORD keeps tables in persistent memory and makes a WRITE
//! durable with a READ behind it (selective remote flush). dmkit's
//! stand-in is a memory node whose memory is a file (`dmkit memnode
//! --memory-file PATH`, `dmkit_memnode::file`): its chunk groups and roots
//! survive the node's restart, so a database on it does, and a recovery
//! pass ([`Database::recover_all`]) after the restart rolls every
//! half-done transaction back or forward from its undo log — the test
//! `crates/cli/tests/memory_file.rs` SIGKILLs two such nodes mid-run and
//! checks the bank against its committed history. What the shm backend
//! promises is the page cache's: a WRITE that completed survives the death
//! of any process (node or client), not a kernel crash or power cut
//! unless the node was shut down cleanly (it then writes its file back).
//! There is no further flush to make, so selective remote flush has no
//! switch here; on an RNIC with persistent memory it would be one READ per
//! written node behind the commit writes, in the same doorbell. The DRAM
//! nodes (memfd; sim) keep nothing across a restart.
//!
//! Read-only TATP against the local peer (`dmkit bench txn --workload
//! tatp --read-only --local-peer`, issue 35's goal ≥ 0.5): on a shared
//! 2-core AMD EPYC (load average 12–17), 1 thread × 8 coordinators, 4 s,
//! remote/local is 0.36–0.39 (attempted 182k–196k/s against 490k–520k/s;
//! 1.28 round trips per attempt). It is CPU per transaction, not round
//! trips: at `--scale 10000`, where nearly every key is cached and the
//! tables sit in the last-level cache, round trips fall to 1.10 per
//! attempt and the remote side gains 1.5× — but the local peer gains 2.5×
//! and the ratio drops to 0.24–0.29. A profile (`perf`) of the remote
//! thread puts two fifths of it (default scale; a quarter at 10,000) in
//! copying remote words — cache misses on records and buckets — and, at
//! 10,000, an eighth in the address cache's hash look-up (a miss the peer
//! pays once, in its one map, where the remote side pays it beside the
//! record's), a tenth in reading the clock, and most of the rest in the
//! runtime's post/poll/task switch: fixed costs per verb and per
//! transaction that the peer does not pay. Remembering absent keys' slots in the address
//! cache (no probe round for them) was tried and measured worse (median
//! 0.33 against 0.37: the cache grows faster than keys repeat at 100,000
//! subscribers), and posting probes in the fetch's doorbell would save a
//! round trip only for GetNewDestination's uncached keys (a tenth of the
//! mix). What would close the gap: fewer clock reads and cheaper
//! per-verb bookkeeping in the runtime, or a denser address cache.
//!
//! ```no_run
//! # use std::sync::Arc;
//! # use dmkit_txn::{Database, TableSpec, TxnConfig, TxnError};
//! # async fn demo(fabric: Arc<dyn dmkit_fabric::Fabric>, ctx: &dmkit_runtime::Ctx) -> Result<(), TxnError> {
//! let db = Database::create(fabric, "bank", TxnConfig::default(), &[TableSpec::new("accounts", 8, 1000)])?;
//! db.load(0, (0..1000).map(|k| (k, 100u64.to_le_bytes().to_vec())))?;
//! let cache = dmkit_txn::addr_cache();
//! let mut coord = db.coordinator(&cache)?;
//! let mut t = coord.begin(ctx);
//! let (a, b) = (t.write(0, 1)?, t.write(0, 2)?);
//! t.exec().await?;
//! let (x, y) = (t.word(a, 0), t.word(b, 0));
//! t.put(a, &(x - 10).to_le_bytes())?;
//! t.put(b, &(y + 10).to_le_bytes())?;
//! t.commit().await?;
//! # Ok(()) }
//! ```

#![warn(missing_docs)]

pub mod cache;
pub mod check;
pub mod db;
pub mod error;
pub mod layout;
pub mod recovery;
pub mod txn;
pub mod workload;

pub use cache::SlotCache;
pub use check::{check_serializable, Restore};
pub use db::{Database, Row, TableId, TableSpec, TxnConfig};
pub use error::{AbortReason, CrashPoint, TxnError};
pub use recovery::{recover_logs, Recovered, RecoveryReport};
pub use txn::{addr_cache, AddrCache, CoordStats, Coordinator, ItemId, Txn, TxnRecord};
