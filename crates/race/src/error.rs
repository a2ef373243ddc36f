//! Errors of the hash table. Every one leaves the table consistent: an
//! operation that fails changed nothing a reader can observe.

use dmkit_fabric::{FabricError, GlobalAddr};

/// What can go wrong in a table operation.
#[derive(Debug, thiserror::Error)]
pub enum RaceError {
    #[error("key of {len} bytes: keys must be 1..={max} bytes (RaceConfig::max_key)")]
    KeyLength { len: usize, max: usize },
    #[error("value of {len} bytes exceeds the configured maximum of {max} bytes (RaceConfig::max_value)")]
    ValueTooLarge { len: usize, max: usize },
    #[error("table full: subtable with suffix {suffix:#x} is at the maximum depth {max_depth} and its buckets for this key are full")]
    TableFull { suffix: u64, max_depth: u32 },
    #[error("remote memory exhausted while {what}: {source}")]
    OutOfMemory {
        what: &'static str,
        #[source]
        source: FabricError,
    },
    #[error("no table named {0:?}")]
    NoSuchTable(String),
    #[error("a table named {0:?} already exists")]
    AlreadyExists(String),
    #[error("remote structure at {addr} is not a valid {what} (bad magic or layout); wrong root or corrupted memory")]
    Corrupt {
        addr: GlobalAddr,
        what: &'static str,
    },
    #[error("bad configuration: {0}")]
    Config(String),
    #[error("task-local memory of {have} bytes is too small; the table needs {need} (RuntimeConfig::task_local_bytes)")]
    LocalMemory { have: usize, need: usize },
    #[error("hot block write-back failed: {0} (its buffered modifications may be lost)")]
    HotLeaseLost(String),
    #[error(transparent)]
    Fabric(#[from] FabricError),
}
