//! # dmkit-bench — benchmarks
//!
//! Library side of `dmkit bench`: workloads that run against any
//! [`dmkit_fabric::Fabric`] and report JSON-serialisable results. The CLI
//! adds flags, tables and progress bars; this crate does the measuring.
//!
//! - [`harness`]: the measurement discipline every benchmark follows
//!   (start barrier, one global window, counting inside it, repeats,
//!   provenance); new benchmarks call it.
//! - [`micro`]: one verb at uniformly random addresses of a region, per
//!   thread, in batches (SMART §3's verbs micro-benchmark shape).
//! - [`rpc`]: echo round trips through a memory node's worker threads
//!   (the RPC baseline).
//! - [`corm_bench`]: object reads and writes on a CoRM store, one-sided or
//!   over RPC.
//! - [`atomics`]: the study's remote atomics (Fig. 10): spinlock and
//!   sequencer, local vs remote (vs RPC), with and without backoff.
//! - [`hashtable`]: the study's hash-table breakdown (Fig. 12) as YCSB
//!   runs of the RACE table.
//! - [`io_consolidation`]: the study's IO consolidation (Fig. 8): native
//!   32-byte WRITEs against the runtime's write-back buffer.
//! - [`vector_io`]: the memory-semantics study's vector IO (SP, doorbell
//!   batching, SGL) beside local `pwritev`/`preadv`.
//! - [`ycsb`]: YCSB key choosers, workloads and key types;
//!   [`ycsb_bench`]: the harness that loads and runs an index with them.

pub mod atomics;
pub mod corm_bench;
pub mod corm_latency;
pub mod corm_timeline;
pub mod harness;
pub mod hashtable;
pub mod io_consolidation;
pub mod micro;
pub mod pin;
pub mod plot;
pub mod report;
pub mod rng;
pub mod rpc;
pub mod sim_check;
pub mod sim_check_swordbox;
pub mod sim_micro;
pub mod sim_repro;
pub mod sim_repro_swordbox;
pub mod txn_bench;
pub mod txn_check;
pub mod vector_io;
pub mod ycsb;
pub mod ycsb_bench;

/// One job per core this process may use: how many simulations `sim
/// reproduce` and `sim check` run at once unless told.
pub fn default_jobs() -> usize {
    std::thread::available_parallelism().map_or(1, |n| n.get())
}

/// An OS thread for one simulation at a time (`sim reproduce`'s runs, `sim
/// check`'s seeds). Its stack is 64 MiB: the runs' deep async state
/// machines used to run on the main thread (8 MiB), and the reservation is
/// virtual until touched.
pub(crate) fn sim_thread(name: String) -> std::thread::Builder {
    std::thread::Builder::new().name(name).stack_size(64 << 20)
}
