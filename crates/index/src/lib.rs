//! # dmkit-index — what every remote data structure stands on
//!
//! The layer between the runtime and the data structures (RACE hashing,
//! the SMART radix tree, the Sherman B+tree, and the structures to come:
//! Clover, CoRM's object store, transaction tables). A structure written
//! against it needs only its own algorithm:
//!
//! - [`map`]: the map contract ([`RemoteMap`], [`MapClient`]) that
//!   benchmarks, checkers and applications drive every index through, and
//!   the sizing contract of its configuration ([`IndexConfig`]);
//! - [`IndexError`]: one typed error for every structure;
//! - [`lifecycle`]: create with rollback, open with magic and version
//!   checks, destroy — the descriptor's life, written once;
//! - [`retry`]: an operation's retry budget on the runtime's backoff, so
//!   the conflict-avoidance switch governs every structure's retries
//!   (SMART, ASPLOS'24 §4.3) and the limits are configuration;
//! - [`lease`]: leases on every lock a structure takes, so a client that
//!   dies holding one never blocks it for ever;
//! - [`cache`]: the byte-budget cache of remote nodes one compute machine
//!   shares (the radix tree's and the B+tree's; each keeps its validation
//!   rule);
//! - `conformance` (feature `conformance`, for tests): the suite every
//!   index passes — a sequential model, bad input, the lifecycle, and
//!   linearizability of concurrent histories on threads, processes and the
//!   simulator.
//!
//! Not here: the structures themselves, the runtime's verbs and backoff
//! (`dmkit-runtime`), the fabric (`dmkit-fabric`).
//!
//! ```no_run
//! # use std::sync::Arc;
//! # use dmkit_index::{IndexError, MapClient, RemoteMap};
//! # async fn demo<M: RemoteMap>(fabric: Arc<dyn dmkit_fabric::Fabric>, ctx: &dmkit_runtime::Ctx)
//! #     -> Result<(), IndexError> {
//! let map = M::create(fabric, "orders", M::Config::default())?;
//! let client = map.client(1);
//! client.insert(ctx, b"key", b"value").await?;
//! assert_eq!(client.search(ctx, b"key").await?, Some(b"value".to_vec()));
//! map.destroy()?;
//! # Ok(()) }
//! ```

pub mod cache;
#[cfg(feature = "cli")]
pub mod cli;
#[cfg(feature = "conformance")]
pub mod conformance;
pub mod error;
pub mod lease;
pub mod lifecycle;
pub mod map;
pub mod retry;

pub use cache::{CachedNode, NodeCache, SideIndex};
pub use error::IndexError;
pub use lease::LeaseConfig;
pub use lifecycle::{Creation, Home, Magic};
pub use map::{check_local, ClientStats, Entries, IndexConfig, MapClient, RemoteMap, Shape};
pub use retry::{Retry, RetryPolicy};
