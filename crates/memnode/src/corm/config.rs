//! The store's configuration, its operations and their answers.

use serde::{Deserialize, Serialize};

use super::class::Strategy;
use super::layout::ObjPtr;

/// How a worker finds an object an indirect pointer names (CoRM §3.2.1).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum Correction {
    /// Ask the worker owning the block (thread messaging): it looks the id
    /// up in the block's id → offset map. Stalls while the owner is busy
    /// (e.g. compacting).
    Message,
    /// Scan the block's memory for the id, whoever owns it.
    Scan,
}

/// When compaction runs (CoRM §3.1.3).
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct Policy {
    /// Compact a class when its fragmentation ratio (memory its blocks hold
    /// over what its live objects fill) exceeds this; `None`: never by
    /// threshold. Re-armed once a block's worth of the class's objects
    /// has been freed since the last compaction of the class.
    pub threshold: Option<f64>,
    /// Compact every class when an allocation finds no memory, then retry it.
    pub on_alloc_failure: bool,
    /// Block collection asks each worker for its not-full blocks at most
    /// this full (0..=1; 1 = every not-full block).
    pub collect_max_fill: f64,
    /// Merges the leader performs per step before it serves other work
    /// (0 = all at once, as the paper's Fig. 16 run).
    pub merges_per_step: usize,
    /// Destinations tried per source block, fullest first (0 = all, as
    /// CoRM's leader does). Bounds a compaction of many blocks that mostly
    /// clash: without it, O(blocks²) id comparisons.
    pub candidates_per_source: usize,
    /// Source blocks one compaction merges away at most (0 = no bound):
    /// the upper bound on compacted blocks CoRM §4.3.2 names as the way to
    /// shorten a compaction; the rest stays for the next one.
    #[serde(default)]
    pub max_merges: usize,
}

impl Default for Policy {
    fn default() -> Self {
        Policy {
            threshold: Some(1.5),
            on_alloc_failure: true,
            collect_max_fill: 1.0,
            merges_per_step: 64,
            candidates_per_source: 1024,
            max_merges: 0,
        }
    }
}

/// Configuration of a CoRM store.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct StoreConfig {
    /// Block size: a power of two, a multiple of the node's page size,
    /// 4 KiB to 1 MiB (or the page size, with 2 MiB pages).
    pub block_size: u64,
    /// Worker threads (one allocator each), 1..=255.
    pub workers: usize,
    /// Ids and compaction per class.
    pub strategy: Strategy,
    /// Pointer correction on the RPC path.
    pub correction: Correction,
    /// Compaction triggers.
    pub policy: Policy,
    /// Remote address space the store takes from the node (virtual blocks;
    /// compaction keeps source addresses until released, §3.3).
    pub virtual_bytes: u64,
    /// Most memory the store's blocks may hold (`None`: as much as its
    /// address space). Reaching it is the "allocation failure" trigger.
    pub max_active_bytes: Option<u64>,
    /// Seed of the workers' generators (ids, slots); `None`: from the OS.
    pub seed: Option<u64>,
}

impl Default for StoreConfig {
    fn default() -> Self {
        StoreConfig {
            block_size: 4096,
            workers: 1,
            strategy: Strategy::Hybrid(16),
            correction: Correction::Scan,
            policy: Policy::default(),
            virtual_bytes: 64 << 20,
            max_active_bytes: None,
            seed: None,
        }
    }
}

/// An operation a worker serves (CoRM Table 2, and compaction control).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum Op {
    /// Allocate an object of this many payload bytes.
    Alloc(u32),
    /// Free the object.
    Free(ObjPtr),
    /// Read the object's payload (the class's whole capacity: the store
    /// keeps no length a reader needs; clients know their sizes, as
    /// CoRM's `Read(addr, buf, size)`).
    Read(ObjPtr),
    /// Overwrite the object's payload (zero-padded to the capacity).
    Write(ObjPtr, Vec<u8>),
    /// Release the pointer's address (§3.3): the object stays, reachable
    /// through the returned pointer.
    ReleasePtr(ObjPtr),
    /// Compact these classes now (all when `None`); this worker leads.
    Compact(Option<Vec<u8>>),
}

/// A successful answer.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum Reply {
    /// The new object.
    Allocated(ObjPtr),
    /// The object was freed.
    Freed,
    /// The payload, and the pointer with its offset hint corrected.
    Read {
        /// The corrected pointer (direct).
        ptr: ObjPtr,
        /// The payload (the class's capacity).
        data: Vec<u8>,
    },
    /// Written; the corrected pointer.
    Written(ObjPtr),
    /// The pointer to use from now on (homed at the object's current block).
    Released(ObjPtr),
    /// A compaction finished.
    Compacted(CompactionReport),
}

/// What one compaction did.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct CompactionReport {
    /// Blocks the leader collected (its own included).
    pub blocks_collected: u64,
    /// Source blocks merged away (their memory returned).
    pub blocks_freed: u64,
    /// Objects that kept their offset.
    pub objects_kept: u64,
    /// Objects moved to another offset (their pointers became indirect).
    pub objects_moved: u64,
    /// Sources no destination could take (id or offset clashes, no room).
    pub merge_failures: u64,
    /// Nanoseconds of block collection.
    pub collection_ns: u64,
    /// Nanoseconds of merging (copies, remaps, unlocks).
    pub compaction_ns: u64,
}

/// An operation's outcome.
pub type OpResult = Result<Reply, ObjError>;

/// Why an operation failed. Every client mistake is one of these, never a
/// panic, and leaves the store unharmed.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, thiserror::Error)]
pub enum ObjError {
    /// An allocation of zero bytes.
    #[error("zero-byte allocation")]
    ZeroSize,
    /// Larger than the largest class (or than the object, for a write).
    #[error("{len} B exceed the limit of {max} B")]
    TooLarge {
        /// Requested bytes.
        len: u64,
        /// The limit.
        max: u64,
    },
    /// No memory for a new block, even after compaction.
    #[error("out of memory: the store's blocks hold {active_bytes} B of at most {limit} B")]
    OutOfMemory {
        /// Memory the blocks hold.
        active_bytes: u64,
        /// The limit.
        limit: u64,
    },
    /// Every virtual block is in use (addresses kept for moved objects
    /// until they are freed or their pointers released, §3.3).
    #[error("out of address space: release pointers to moved objects")]
    OutOfAddressSpace,
    /// Not a pointer this store handed out (node, key, range, alignment or
    /// class out of bounds).
    #[error("forged pointer: {0}")]
    Forged(String),
    /// The pointer's class is not its block's.
    #[error("pointer of class {ptr} to a block of class {block}")]
    WrongClass {
        /// The pointer's class.
        ptr: u8,
        /// The block's class.
        block: u8,
    },
    /// The block the pointer names no longer exists (every object homed at
    /// it was freed or had its pointer released, and the address was
    /// released): a use after free, a double free or a released pointer.
    #[error("stale pointer: its block's address was released")]
    Stale,
    /// No live object with this id is homed at the pointer's block: freed
    /// (a use after free, or a double free).
    #[error("no such object: freed")]
    Freed,
    /// The object lives, but this pointer was released (§3.3).
    #[error("released pointer used again")]
    Released,
    /// The object stayed locked too long (a write or compaction elsewhere
    /// in progress, or memory overwritten behind the store's back). Retry.
    #[error("object busy: locked too long")]
    Busy,
    /// The memory node the store lives on is gone (dropped).
    #[error("the memory node is gone")]
    NodeGone,
}
