//! The transaction layer's errors.
//!
//! Every error a transaction returns leaves nothing half-written: a
//! transaction that fails before its commit writes released its locks and
//! wrote nothing; one that fails during them ([`TxnError::LeaseLost`],
//! [`TxnError::Crashed`]) is rolled back or forward by recovery from its
//! undo log.

use dmkit_fabric::{FabricError, GlobalAddr};
use dmkit_index::IndexError;

/// Why a transaction aborted (it may be retried).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum AbortReason {
    /// A record it locks is locked by another transaction.
    LockHeld,
    /// A record it reads is being written by a commit.
    Dirty,
    /// A record it read changed (or was locked) before it committed.
    Validation,
    /// The free slot it meant to insert into was taken meanwhile.
    SlotTaken,
    /// A dead coordinator's transaction is being recovered by another
    /// client; the records it held are not free yet.
    Recovering,
}

impl AbortReason {
    /// Every reason, in report order.
    pub const ALL: [AbortReason; 5] = [
        AbortReason::LockHeld,
        AbortReason::Dirty,
        AbortReason::Validation,
        AbortReason::SlotTaken,
        AbortReason::Recovering,
    ];

    /// The reason's name in reports.
    pub fn name(self) -> &'static str {
        match self {
            AbortReason::LockHeld => "lock-held",
            AbortReason::Dirty => "dirty",
            AbortReason::Validation => "validation",
            AbortReason::SlotTaken => "slot-taken",
            AbortReason::Recovering => "recovering",
        }
    }
}

/// Where a coordinator stops under the crash fault
/// ([`crate::Coordinator::crash_at`]): the steps of commit.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum CrashPoint {
    /// Executed, nothing locked yet (hitchhiking off: before the
    /// validation round's locks; on: before the execution round).
    BeforeLocks,
    /// Every lock taken, no log written.
    AfterLocks,
    /// The undo log written, no commit write posted.
    AfterLog,
    /// Half of the commit writes posted (records half written).
    MidCommit,
    /// Every commit write done, no record unlocked.
    BeforeUnlock,
}

impl CrashPoint {
    /// Every crash point, in commit order.
    pub const ALL: [CrashPoint; 5] = [
        CrashPoint::BeforeLocks,
        CrashPoint::AfterLocks,
        CrashPoint::AfterLog,
        CrashPoint::MidCommit,
        CrashPoint::BeforeUnlock,
    ];

    /// Its name (`--crash-at` and reports).
    pub fn name(self) -> &'static str {
        match self {
            CrashPoint::BeforeLocks => "before-locks",
            CrashPoint::AfterLocks => "after-locks",
            CrashPoint::AfterLog => "after-log",
            CrashPoint::MidCommit => "mid-commit",
            CrashPoint::BeforeUnlock => "before-unlock",
        }
    }
}

impl std::str::FromStr for CrashPoint {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        CrashPoint::ALL
            .into_iter()
            .find(|p| p.name() == s)
            .ok_or_else(|| {
                let names: Vec<_> = CrashPoint::ALL.iter().map(|p| p.name()).collect();
                format!("{s:?}: expected one of {}", names.join(", "))
            })
    }
}

/// What can go wrong in a transaction or the database's lifecycle.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum TxnError {
    /// A conflict: the transaction released what it held; retry it.
    #[error("transaction aborted ({})", .0.name())]
    Abort(AbortReason),
    /// The application asked to abort.
    #[error("transaction aborted by the application")]
    UserAbort,
    /// A table id the database does not have.
    #[error("no table {0} in the database")]
    UnknownTable(u16),
    /// A value longer than its table's records hold.
    #[error("value of {len} bytes for table {table}: its records hold {max} bytes")]
    ValueTooLarge {
        /// The table.
        table: u16,
        /// The value's length.
        len: usize,
        /// Its record size.
        max: usize,
    },
    /// More records than a transaction may touch.
    #[error("a transaction touches at most {max} records")]
    TooManyItems {
        /// The limit (`TxnConfig::max_items`).
        max: usize,
    },
    /// The write set's undo log does not fit the coordinator's log.
    #[error("the undo log needs {need} bytes; a coordinator's log holds {capacity}")]
    LogFull {
        /// Bytes the transaction's log needs.
        need: usize,
        /// The log's capacity (`TxnConfig::log_bytes`).
        capacity: usize,
    },
    /// No free slot for a new key within the probe limit.
    #[error("table {table} full: no free slot for key {key} within {probe} buckets")]
    Full {
        /// The table.
        table: u16,
        /// The key.
        key: u64,
        /// Buckets probed.
        probe: usize,
    },
    /// The coordinator's leases ran out before it could publish (it
    /// stalled): it stops, and recovery finishes its transaction.
    #[error("lease lost: {0}")]
    LeaseLost(String),
    /// The crash fault stopped the coordinator at this point.
    #[error("coordinator crashed (fault injection) at {}", .0.name())]
    Crashed(CrashPoint),
    /// Every coordinator id is taken.
    #[error("no coordinator id left: the database allows {0}")]
    NoCoordinator(u32),
    /// A configuration the database cannot be made or opened with.
    #[error("invalid transaction configuration: {0}")]
    Config(String),
    /// Remote bytes that are not what the database wrote there.
    #[error("corrupt {what} at {addr}")]
    Corrupt {
        /// Where.
        addr: GlobalAddr,
        /// What was expected.
        what: &'static str,
    },
    /// The descriptor's lifecycle (create, open, destroy).
    #[error(transparent)]
    Index(#[from] IndexError),
    /// A verb or control request failed.
    #[error(transparent)]
    Fabric(#[from] FabricError),
}

impl TxnError {
    /// Whether the transaction may simply be retried.
    pub fn retryable(&self) -> bool {
        matches!(self, TxnError::Abort(_))
    }
}
