//! # dmkit-apps — the memory-semantics study's applications
//!
//! The four case studies of "Thinking More about RDMA Memory Semantics"
//! (IEEE Cluster'21, §IV) as library modules over dmkit's runtime, each
//! with its correctness check and the switches of its breakdown figure:
//!
//! - [`shuffle`] (§IV-C, Fig. 15): `n` executors push entries to `m`
//!   partitions' remote buffers with one-sided WRITEs under a hash shuffle
//!   rule, unbatched or batched by SP, SGL or doorbell; space is reserved
//!   and the stage handed off with FAA; the output is checked to be the
//!   input's exact partition.
//! - [`join`] (§IV-D, Fig. 16/17): a partitioned hash join — both
//!   relations through the shuffle, then build and probe with a
//!   concurrent hash map per partition; count and checksum equal a local
//!   join's.
//! - [`log`] (§IV-E, Fig. 19): a distributed log — writers reserve
//!   consecutive slots with the FAA sequencer and WRITE records (one by
//!   one, SP or SGL); readers follow the tail, detect the hole a dead
//!   writer leaves and fill it, and never return a torn or misordered
//!   record.
//! - [`hashtable`] (§IV-B, Fig. 12): the disaggregated hash table's
//!   step-by-step breakdown on dmkit's RACE table (basic, + NUMA, + IO
//!   consolidation, + atomics).
//!
//! Every application runs its executors as runtime tasks on a
//! [`platform::Platform`]: OS threads over a fabric (shm, verbs) or
//! virtual threads of the simulator, the same code on both.
//!
//! Not here: RPC-based variants of the applications (the study's RPC
//! baselines are for its atomics, Fig. 10: `dmkit bench atomics --place
//! rpc` on the memory node's built-in atomics service).

pub mod hashtable;
pub mod join;
pub mod log;
pub mod platform;
pub mod record;
pub mod shuffle;

use dmkit_fabric::FabricError;
use serde::Serialize;

/// Why an application run failed.
#[derive(Debug, thiserror::Error)]
pub enum AppError {
    #[error(transparent)]
    /// A verb failed.
    Fabric(#[from] FabricError),
    #[error("invalid configuration: {0}")]
    /// The configuration cannot run.
    Config(String),
    /// A stage did not complete: some executor did not hand it off (it died
    /// or failed). Its output is incomplete; rerun the stage.
    #[error("stage {stage} epoch {epoch}: {done} of {expected} executors handed off before the deadline")]
    Incomplete {
        /// The stage's name.
        stage: String,
        /// Its epoch (one per run of it).
        epoch: u64,
        /// Sources that handed the epoch off.
        done: u64,
        /// Sources that take part.
        expected: u64,
    },
    /// An executor was stopped on purpose (tests of mid-stage failure).
    #[error("executor {0} was killed mid-stage")]
    Killed(usize),
    #[error("a partition's buffer is full ({need} entries for {capacity})")]
    /// A partition's buffer is too small.
    Full {
        /// Entries that had to fit.
        need: u64,
        /// Entries the buffer holds.
        capacity: u64,
    },
    #[error("the output differs from the input: {0}")]
    /// The correctness check failed.
    Mismatch(String),
    #[error(transparent)]
    /// Opening or creating a remote root failed.
    Index(#[from] dmkit_index::IndexError),
}

/// How a batch of entries goes to remote memory (the study's Algorithm 1).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Method {
    /// One WRITE per entry, each its own doorbell: the study's baseline.
    None,
    /// Software packing: entries copied into one buffer, one WRITE.
    Sp,
    /// One WRITE with a scatter/gather list of the entries.
    Sgl,
    /// One WRITE per entry, all with one doorbell.
    Doorbell,
}

impl Method {
    /// Its name on the command line.
    pub fn name(self) -> &'static str {
        match self {
            Method::None => "none",
            Method::Sp => "sp",
            Method::Sgl => "sgl",
            Method::Doorbell => "doorbell",
        }
    }
}

impl std::str::FromStr for Method {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        [Method::None, Method::Sp, Method::Sgl, Method::Doorbell]
            .into_iter()
            .find(|m| m.name() == s)
            .ok_or_else(|| format!("{s:?}: expected none, sp, sgl or doorbell"))
    }
}

/// What an application run reports (`dmkit app … --json`).
#[derive(Debug, Clone, Default, Serialize)]
pub struct AppResult {
    /// The application ("shuffle", "join", "log").
    pub app: String,
    /// The backend ("shm", "sim").
    pub backend: String,
    /// How batches are written (none, doorbell, sp, sgl).
    pub method: String,
    /// Entries per batch.
    pub batch: usize,
    /// Executors (sources, writers).
    pub executors: usize,
    /// Records (entries, tuples, log records) the run moved.
    pub records: u64,
    /// Wall seconds (virtual seconds on the simulator).
    pub seconds: f64,
    /// Records per second (virtual on the simulator).
    pub records_per_s: f64,
    /// Bytes written to remote memory per record (payload and metadata).
    pub bytes_per_record: f64,
    /// The correctness check passed.
    pub verified: bool,
    /// Phases and their seconds (the breakdown figures).
    pub phases: Vec<(String, f64)>,
    /// NUMA-aware placement was on.
    pub numa: bool,
    /// Wall seconds of every round this method ran, in order, when a run
    /// repeats it (`dmkit app … --rounds N`); the other fields are those
    /// of its median round. Empty for a single run.
    pub round_seconds: Vec<f64>,
}
