//! # dmkit-bench — benchmarks
//!
//! Library side of `dmkit bench`: workloads that run against any
//! [`dmkit_fabric::Fabric`] and report JSON-serialisable results. The CLI
//! adds flags, tables and progress bars; this crate does the measuring.
//!
//! - [`micro`]: one verb at uniformly random addresses of a region, per
//!   thread, in batches (SMART §3's verbs micro-benchmark shape).
//! - [`ycsb`]: YCSB key choosers, workloads and key types;
//!   [`ycsb_bench`]: the harness that loads and runs an index with them.

pub mod micro;
pub mod plot;
pub mod rng;
pub mod sim_check;
pub mod sim_micro;
pub mod sim_repro;
pub mod ycsb;
pub mod ycsb_bench;
