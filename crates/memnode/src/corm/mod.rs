//! # CoRM: the memory node's compacting object store
//!
//! The object allocator of "CoRM: Compactable Remote Memory over RDMA"
//! (SIGMOD'21): objects that one-sided readers reach by address, and that
//! the node may still move to give memory back — without breaking those
//! readers. This module is the node's side (issue 32 items 1, 4, 5, 6): the
//! store its worker threads serve; the RPC channel that carries clients'
//! requests to them and the client library are built on it elsewhere.
//!
//! - [`class`]: size classes (§3.1.1) and per-class naming (random ids of
//!   8–16 bits, or offsets as Mesh; the hybrid of §4.4.1).
//! - [`layout`]: the object's bytes (header with id, version, two lock bits
//!   and home block; a version in every 64-byte segment, §3.2.3), the
//!   128-bit [`ObjPtr`], and the pure functions a one-sided reader applies
//!   to bytes it read: [`decode`], [`scan_block`].
//! - [`Store`], [`Worker`]: one allocator per worker (§3.1.4) over a
//!   process-wide block allocator on the node's memory; alloc, free, read,
//!   write, release of pointers (§3.3), pointer correction by messaging the
//!   owner or by scanning the block (§3.2.1) — [`Op`], [`Reply`],
//!   [`ObjError`].
//! - compaction (§3.1.2–§3.1.4, §3.5): threshold, allocation-failure and
//!   manual triggers; a leader collects blocks from every worker, merges
//!   least-utilised first, locks moving objects, remaps the source's
//!   addresses onto the destination's memory in the node's translation
//!   table, releases addresses nothing is homed at.
//! - [`CormStats`]: memory accounting (active memory, live bytes, per-class
//!   fragmentation, compaction counters), reported in `NodeStats::corm`.
//! - [`Cluster`]: one thread playing every worker, deterministically.
//! - [`trace`]: allocation traces (Fig. 17's synthetic ones, Redis-like
//!   t1–t3 of §4.4.3) replayed on the real allocator; [`prob`]: the §3.4
//!   compaction probability.
//!
//! - [`service`]: the store as a service of the node's RPC workers.
//!
//! Not here: the client's `direct_read`/`scan_read` (crate `dmkit-corm`;
//! they use [`decode`] and [`scan_block`]), benchmarks.

pub mod class;
pub mod layout;
pub mod prob;
pub mod service;
pub mod trace;

mod block;
mod check;
mod compact;
mod config;
mod driver;
mod mem;
mod rng;
mod space;
mod stats;
mod worker;

pub use config::{
    CompactionReport, Correction, ObjError, Op, OpResult, Policy, Reply, StoreConfig,
};
pub use driver::Cluster;
pub use layout::{decode, decode_into, scan_block, Expect, ObjHeader, ObjPtr, ReadFault};
pub use rng::Rng;
pub use stats::{Accounting, ClassStats, CormStats};
pub use worker::{Store, Ticket, WorkDone, Worker};

#[cfg(test)]
mod tests;
