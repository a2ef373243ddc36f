//! The map contract: what every remote index offers, so harnesses,
//! benchmarks, checkers and applications are written once against it.
//!
//! A remote index has two halves:
//! - the shared handle ([`RemoteMap`], `Send + Sync`): made by `create` or
//!   `open`, destroyed once, hands out clients;
//! - a per-worker client ([`MapClient`], cheap to clone into the worker's
//!   tasks, not `Send`): the operations, each an `async fn` over the task's
//!   [`Ctx`].
//!
//! Semantics every index keeps (the conformance suite checks them): keys
//! are byte strings within the index's length limits; `insert` adds a key
//! that is absent and reports whether it did, `update` replaces the value
//! of a present key, `delete` removes one; each operation is linearizable;
//! an operation that returns an error changed nothing a reader can see.

use std::sync::Arc;

use dmkit_fabric::Fabric;
use dmkit_runtime::{Ctx, LocalLayout};

use crate::error::IndexError;

/// Key-value pairs, as scans return them.
pub type Entries = Vec<(Vec<u8>, Vec<u8>)>;

/// Counters an index client keeps beyond the runtime's (for reports).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ClientStats {
    /// Lookups the client's cache answered (or shortened).
    pub cache_hits: u64,
    /// Lookups that found nothing usable in the cache.
    pub cache_misses: u64,
    /// Structural changes this client made: splits (of subtables, leaves,
    /// headers, internal nodes).
    pub splits: u64,
    /// Locks a local predecessor handed over to this client without a
    /// remote release and re-acquisition (the local half of Sherman's
    /// hierarchical lock, HOCL); 0 for indexes without one.
    pub lock_handovers: u64,
    /// Of those, locks handed over through a local entry shared by hashing
    /// that were another lock's (released by this client before it took
    /// its own).
    pub foreign_handovers: u64,
}

/// A per-worker client of a remote map.
#[allow(async_fn_in_trait)]
pub trait MapClient: Clone + 'static {
    /// The value of `key`, if present.
    async fn search(&self, ctx: &Ctx, key: &[u8]) -> Result<Option<Vec<u8>>, IndexError>;
    /// Inserts `key` if absent; whether it did (`false`: present, unchanged).
    async fn insert(&self, ctx: &Ctx, key: &[u8], value: &[u8]) -> Result<bool, IndexError>;
    /// Replaces the value of `key` if present; whether it did.
    async fn update(&self, ctx: &Ctx, key: &[u8], value: &[u8]) -> Result<bool, IndexError>;
    /// Removes `key` if present; whether it did.
    async fn delete(&self, ctx: &Ctx, key: &[u8]) -> Result<bool, IndexError>;
    /// Up to `count` entries with keys ≥ `from`, in key order.
    /// [`IndexError::Unsupported`] from an unordered map.
    async fn scan(&self, ctx: &Ctx, from: &[u8], count: usize) -> Result<Entries, IndexError>;
    /// Every entry (meant for a quiescent map: checkers, tools).
    async fn entries(&self, ctx: &Ctx) -> Result<Entries, IndexError>;
    /// The client's own counters.
    fn stats(&self) -> ClientStats;
    /// The task-local memory each task running the client's operations
    /// needs (the same as its map's [`RemoteMap::local_layout`]).
    fn local_layout(&self) -> &LocalLayout;
}

/// Whether the task behind `ctx` has the task-local memory `layout`
/// declares: [`IndexError::LocalMemory`] if its worker was built without
/// it (the check every operation makes before it touches a region).
#[inline]
pub fn check_local(ctx: &Ctx, layout: &LocalLayout) -> Result<(), IndexError> {
    let need = layout.bytes();
    if ctx.local_len() < need {
        return Err(IndexError::LocalMemory {
            have: ctx.local_len(),
            need,
        });
    }
    Ok(())
}

/// What a workload will put in an index, for sizing it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Shape {
    /// Keys the index will hold.
    pub keys: u64,
    /// Longest key.
    pub max_key: usize,
    /// Every key is exactly `max_key` bytes.
    pub fixed_keys: bool,
    /// Longest value.
    pub max_value: usize,
    /// Client workers (threads over all compute machines).
    pub clients: usize,
}

/// The configuration of a remote index: its structural limits, its
/// techniques (each a switch) and its clients' settings.
pub trait IndexConfig: Clone + Default + Send + Sync + std::fmt::Debug + 'static {
    /// Fits the structural settings to a workload: key and value limits,
    /// and whatever the workload's size decides (initial table size, …).
    /// Switches and client settings stay as they are.
    fn fit(&mut self, shape: &Shape);

    /// Shortest and longest key the configuration accepts.
    fn key_limits(&self) -> (usize, usize);

    /// Longest value the configuration accepts.
    fn max_value(&self) -> usize;

    /// Bytes of memory-node memory the index needs for `shape` (to size an
    /// embedded or simulated node; the node's pages are touched only where
    /// used, so a generous estimate costs address space, not memory).
    fn memory_estimate(&self, shape: &Shape) -> u64;
}

/// The shared handle of a remote map.
pub trait RemoteMap: Send + Sync + Sized + 'static {
    /// The kind, the root names' namespace: "race", "art", "btree".
    const KIND: &'static str;
    /// Whether keys are kept in order (range scans).
    const ORDERED: bool;
    /// The configuration.
    type Config: IndexConfig;
    /// The per-worker client.
    type Client: MapClient;

    /// Creates the map `name` on `fabric`'s memory nodes.
    fn create(
        fabric: Arc<dyn Fabric>,
        name: &str,
        cfg: Self::Config,
    ) -> Result<Arc<Self>, IndexError>;
    /// Opens the map `name`: structural settings come from the map, client
    /// settings from `cfg`.
    fn open(
        fabric: Arc<dyn Fabric>,
        name: &str,
        cfg: Self::Config,
    ) -> Result<Arc<Self>, IndexError>;
    /// Removes the map (see [`crate::Home::destroy`] for what is freed).
    fn destroy(&self) -> Result<(), IndexError>;
    /// A client for a worker on compute machine `machine` (clients of one
    /// machine share its caches and local lock tables); `id` names lock
    /// holders: unique among the map's live clients.
    fn client_on(self: &Arc<Self>, machine: usize, id: u64) -> Self::Client;
    /// A client on compute machine 0.
    fn client(self: &Arc<Self>, id: u64) -> Self::Client {
        self.client_on(0, id)
    }
    /// The task-local memory each task of a worker running this map's
    /// operations needs (give it to [`dmkit_runtime::WorkerBuilder::local`]).
    fn local_layout(&self) -> &LocalLayout;
    /// The effective configuration.
    fn config(&self) -> &Self::Config;
    /// The map's name.
    fn name(&self) -> &str;
}
