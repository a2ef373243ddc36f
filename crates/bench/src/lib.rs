//! # dmkit-bench — benchmarks
//!
//! Library side of `dmkit bench`: workloads that run against any
//! [`dmkit_fabric::Fabric`] and report JSON-serialisable results. The CLI
//! adds flags, tables and progress bars; this crate does the measuring.
//!
//! - [`micro`]: one verb at uniformly random addresses of a region, per
//!   thread, in batches (SMART §3's verbs micro-benchmark shape).

pub mod micro;
pub mod rng;
pub mod ycsb;
