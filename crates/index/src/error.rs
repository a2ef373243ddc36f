//! The one error type of every remote data structure.
//!
//! Every variant leaves the structure consistent: an operation that
//! returns an error changed nothing a reader can observe (each structure's
//! docs say how it keeps that promise for its own write paths).

use dmkit_fabric::{FabricError, GlobalAddr};
use dmkit_runtime::Nanos;

/// What can go wrong in an operation on, or the lifecycle of, a remote
/// data structure (hash table, radix tree, B+tree, …).
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum IndexError {
    /// A key outside the structure's length limits.
    #[error("key of {len} bytes: keys of this structure must be {min}..={max} bytes")]
    KeyLength {
        /// The key's length.
        len: usize,
        /// Shortest key accepted.
        min: usize,
        /// Longest key accepted.
        max: usize,
    },
    /// A value longer than the structure stores.
    #[error("value of {len} bytes exceeds the structure's maximum of {max} bytes")]
    ValueTooLarge {
        /// The value's length.
        len: usize,
        /// Longest value accepted.
        max: usize,
    },
    /// A configuration the structure cannot be made or opened with.
    #[error("invalid {kind} configuration: {why}")]
    Config {
        /// The structure's kind ("race", "art", "btree", …).
        kind: &'static str,
        /// What is wrong.
        why: String,
    },
    /// `create` of a name that is taken.
    #[error("a {kind} named {name:?} already exists")]
    AlreadyExists {
        /// The structure's kind.
        kind: &'static str,
        /// Its name.
        name: String,
    },
    /// `open` or `destroy` of a name that is not registered (or was
    /// destroyed).
    #[error("no {kind} named {name:?}")]
    NotFound {
        /// The structure's kind.
        kind: &'static str,
        /// Its name.
        name: String,
    },
    /// The descriptor names a layout version this build does not read.
    #[error(
        "{kind} {name:?} has layout version {found}; this dmkit reads version {supported} \
         (destroy the structure and make it again)"
    )]
    Version {
        /// The structure's kind.
        kind: &'static str,
        /// Its name.
        name: String,
        /// The version the descriptor holds.
        found: u16,
        /// The version this build writes and reads.
        supported: u16,
    },
    /// The memory node refused an allocation.
    #[error("remote memory exhausted while {what}: {source}")]
    OutOfMemory {
        /// What was being allocated.
        what: &'static str,
        /// The node's refusal.
        #[source]
        source: FabricError,
    },
    /// Remote bytes that are not what the structure wrote there.
    #[error(
        "remote structure at {addr} is not a valid {what} (bad magic or layout): \
         wrong root or corrupted memory"
    )]
    Corrupt {
        /// Where.
        addr: GlobalAddr,
        /// What was expected there.
        what: &'static str,
    },
    /// The worker's tasks have less local memory than the structure
    /// declared (build the worker with the structure's layout).
    #[error(
        "task-local memory of {have} B is too small: the structure needs {need} B per task \
         (give its local layout to WorkerBuilder::local)"
    )]
    LocalMemory {
        /// Bytes each task has.
        have: usize,
        /// Bytes the structure declared.
        need: usize,
    },
    /// An operation lost its race more often, and for longer, than its
    /// retry budget allows: a lock whose holder is alive but slow (a dead
    /// holder's lease is broken long before), or a livelock.
    #[error(
        "{op} timed out after {attempts} attempts in {elapsed_ns} ns \
         (a lock held by a slow client, or a livelock; see RetryPolicy)"
    )]
    Timeout {
        /// The operation.
        op: &'static str,
        /// Lost races counted.
        attempts: u32,
        /// Time spent, by the worker's clock.
        elapsed_ns: Nanos,
    },
    /// The structure has no room for this entry and cannot grow.
    #[error("{kind} full: {why}")]
    Full {
        /// The structure's kind.
        kind: &'static str,
        /// Where and why.
        why: String,
    },
    /// The structure does not offer this operation (e.g. range scans of a
    /// hash table).
    #[error("a {kind} does not offer {what}")]
    Unsupported {
        /// The structure's kind.
        kind: &'static str,
        /// The operation.
        what: &'static str,
    },
    /// A lock's lease ran out while its holder still worked under it; what
    /// it buffered may be lost.
    #[error("lease lost: {0}")]
    LeaseLost(String),
    /// A verb or a control request failed.
    #[error(transparent)]
    Fabric(#[from] FabricError),
}

impl IndexError {
    /// [`IndexError::Config`] of structure `kind`.
    pub fn config(kind: &'static str, why: impl Into<String>) -> Self {
        IndexError::Config {
            kind,
            why: why.into(),
        }
    }

    /// An `OutOfMemory` maker for `map_err` on an allocation of `what`.
    pub fn oom(what: &'static str) -> impl FnOnce(FabricError) -> IndexError {
        move |source| IndexError::OutOfMemory { what, source }
    }
}
