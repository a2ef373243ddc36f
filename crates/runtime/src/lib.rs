//! # dmkit-runtime — the SMART runtime
//!
//! Per-thread workers running many async tasks over the fabric, with the
//! three techniques of SMART (ASPLOS'24) as switches:
//! thread-aware resource allocation (§4.1: each [`Worker`] owns its queue
//! pairs, completion queues and local memory), adaptive work-request
//! throttling (§4.2, Algorithm 1: [`throttle`]) and conflict avoidance
//! (§4.3: [`backoff`], `backoff_cas`, `c_max` task throttling). The task API
//! ([`Ctx`]) follows §5.1: queue `read/write/cas/faa`, `post`, `sync().await`.
//!
//! Time comes only from a [`Clock`]; workers can be stepped by an external
//! scheduler, so the simulator can run many of them in virtual time.
//!
//! [`alloc`] is the per-worker allocator of remote blocks with a grace
//! period before reuse, shared by the data structures.
//!
//! [`lock`] adds the remote spinlock (with a lease) and the FAA sequencer of
//! the memory-semantics study (§III-E).
//!
//! [`rpc`]: tasks call services on the memory nodes' worker threads
//! (`ctx.call(node, service, bytes).await`, or typed with
//! `ctx.call_typed::<S>(node, &request).await`) over the fabric's RPC
//! channel, counted apart from verbs.
//! [`numa`] is the study's NUMA side (§III-D): the host's sockets, pinning
//! and memory binding (feature `hwloc`), and the proxy-socket queue.
//!
//! [`consolidate`] is IO consolidation (memory-semantics §III-C): a hint
//! that a remote region is hot, and its write-back buffer.
//!
//! Vector IO (memory-semantics §III-A): doorbell batches are a task's
//! `post`; [`Ctx::read_v`]/[`Ctx::write_v`] are scatter/gather requests;
//! [`Ctx::write_packed`] is software packing.
//!
//! Not here yet: shared/multiplexed queue-pair policies (`--thread-aware off`
//! and `--qp-policy` are refused with an error).

pub mod alloc;
pub mod backoff;
pub mod clock;
pub mod config;
pub mod consolidate;
pub mod ctx;
pub mod hash;
pub mod keys;
pub mod local;
pub mod lock;
pub mod machine;
pub mod numa;
pub mod rng;
pub mod rpc;
pub mod stats;
pub mod throttle;
pub mod worker;

pub use clock::{Clock, MonotonicClock, Nanos, VirtualClock};
pub use config::RuntimeConfig;
pub use ctx::{Ctx, OpGuard, Ticket};
pub use local::{Local, LocalLayout};
pub use lock::{LockConfig, LockError, LockGuard, RemoteLock, Sequencer};
pub use rpc::{Call, CallError, Echo};
pub use stats::{Counters, OpStats, WorkerStats};
pub use worker::{Worker, WorkerBuilder};
