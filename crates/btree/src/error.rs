//! Typed errors of the B+tree.

use dmkit_fabric::{FabricError, GlobalAddr};

#[derive(Debug, thiserror::Error)]
pub enum BtreeError {
    #[error("key of {len} bytes: keys of this tree must be {min}..={max} bytes")]
    KeyLength { len: usize, min: usize, max: usize },
    #[error("value of {len} bytes exceeds the tree's maximum of {max}")]
    ValueTooLarge { len: usize, max: usize },
    #[error("invalid tree configuration: {0}")]
    Config(String),
    #[error("tree {0:?} already exists")]
    AlreadyExists(String),
    #[error("no tree named {0:?}")]
    NoSuchTree(String),
    #[error("remote memory exhausted while {what}: {source}")]
    OutOfMemory {
        what: &'static str,
        #[source]
        source: FabricError,
    },
    #[error("corrupt {what} at {addr}")]
    Corrupt {
        addr: GlobalAddr,
        what: &'static str,
    },
    #[error("task-local memory of {have} B is too small: the tree needs {need} B per task")]
    LocalMemory { have: usize, need: usize },
    #[error("operation gave up after {0} attempts (livelock or a dead lock holder)")]
    TooManyRetries(u32),
    #[error(transparent)]
    Fabric(#[from] FabricError),
}
