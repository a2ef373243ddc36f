//! # dmkit-clover — a key-value store on passive memory nodes (Clover)
//!
//! Clover (Tsai, Shan, Zhang, "Disaggregating Persistent Memory and
//! Controlling Them Remotely: An Exploration of Passive Disaggregated
//! Key-Value Stores", USENIX ATC'20), as SwordBox (NSDI'24 submission,
//! §2.3, §4.4.2) describes and accelerates it: every key is an append-only
//! chain of out-of-place versions in remote memory; clients read and write
//! with one-sided verbs only; a metadata server keeps the key → chain
//! table and reclaims old versions, off the data path. It runs on every
//! backend (shm, sim, verbs) and implements the index layer's map contract
//! ([`dmkit_index::RemoteMap`], [`dmkit_index::MapClient`]). Layouts are
//! in [`layout`]. Not here: the switch that steers Clover's requests
//! (`dmkit-switch`), range scans (a hash of keys has no order).
//!
//! ```
//! use std::sync::Arc;
//! use dmkit_fabric::shm::{ShmConfig, ShmFabric};
//! use dmkit_index::{MapClient, RemoteMap};
//! use dmkit_clover::{CloverConfig, CloverKv};
//! use dmkit_runtime::Worker;
//!
//! let fabric = Arc::new(ShmFabric::one_node(ShmConfig::default(), 64 << 20).unwrap());
//! let kv = CloverKv::create(fabric.clone(), "doc", CloverConfig::default()).unwrap();
//! let mut worker = Worker::builder(fabric.as_ref()).local(kv.local_layout()).build().unwrap();
//! let client = kv.client(1);
//! worker.spawn(move |ctx| async move {
//!     assert!(client.insert(&ctx, b"key", b"v1").await.unwrap());
//!     assert!(client.update(&ctx, b"key", b"v2").await.unwrap());
//!     assert_eq!(client.search(&ctx, b"key").await.unwrap(), Some(b"v2".to_vec()));
//! });
//! worker.run();
//! kv.destroy().unwrap();
//! ```
//!
//! ## Operations (round trips on the common path)
//! - **search**: READ the version the client's hint names ∥ READ the
//!   key's shortcut in the directory (1 round trip when the version is
//!   still the tail); if it is not, go on from the shortcut's version
//!   (public Clover's pointer chasing reads the shortcut beside its first
//!   READ; `shortcut_first`), then while a next word is a link, READ the
//!   successor (one per hop); after `chase_limit` hops READ the shortcut
//!   again and continue from there (Clover's chasing threshold). Without a fresh hint: READ the key's probe
//!   window of the directory, then the version its entry names (2).
//! - **update / delete / insert on a key with a chain**: WRITE the new
//!   version ∥ CAS the believed tail's next word from *empty(key, state the
//!   operation needs)* to *link(new version)* (1). On failure the old word
//!   says why: a link — another writer was first: READ along the chain to
//!   the tail and CAS again; the tail's empty word in the other state — the
//!   operation's precondition is false (the key is absent for an update, a
//!   delete; present for an insert) and it returns `false`. Then the writer
//!   WRITEs its version's address to the key's shortcut (no wait).
//! - **insert of a new key**: WRITE its first version ∥ CAS the first free
//!   directory entry of its probe path from 0 (1, after the lookup).
//!
//! Hints are a compute machine's, shared by its workers (`shared_hints`,
//! as public Clover's client process keeps one table for all its threads
//! and coroutines), or each worker's own.
//!
//! ## Against public Clover (WukLab/pDPM, `clover/mitsume_tool.cc`)
//! Like it: no backoff (a lost CAS walks to the tail and CASes again at
//! once), no client-side lock per key (`mitsume_tool_begin` locks a
//! coroutine against the epoch's advance, not a key), the shortcut read
//! beside a walk's first READ. Unlike it: a write posts its version's
//! WRITE with the CAS (public Clover waits for the WRITE's completion
//! before it CASes: two round trips); a walk READs whole versions (public
//! Clover's writers read the 8-byte pointer); `chase_limit` re-reads the
//! shortcut every few hops (public Clover's thresholds are reset before
//! they act, so it reads the shortcut on the first hop only); writers
//! WRITE the shortcut at once (public Clover's writer queues it for its
//! process's garbage-collection threads, which WRITE it later).
//!
//! Every state change of a key is one successful CAS on its chain (or its
//! directory entry), so operations are linearizable: a search at the READ
//! that found the tail, a write at its CAS, an operation that returns
//! `false` at the CAS or READ that showed the other state. The memory node
//! itself checks the precondition (the empty word names the key and its
//! state), so a CAS moved to another address by the switch is as correct
//! as the client's own ([`layout`], "The next word").
//!
//! ## Reclamation ("garbage collection once no client can reach them")
//! A client learns a version's address only from the directory (head,
//! shortcut), from a version's next word, or from its own hint, and uses
//! an address at most `grace/2` after it learnt it (older hints are
//! dropped and the key looked up again; a walk whose step comes later
//! starts over). By induction every address a client may use was reachable
//! from the directory when it learnt it. The metadata server ([`mds`])
//! cuts a chain's prefix by moving `head` past it — after moving the
//! shortcut past it, the one other entry point — and frees the cut
//! versions `grace` after the cut: by then no client may use an address
//! learnt before the cut, and none can learn one after it. Half the grace
//! period absorbs disagreement between the clients' clocks and the
//! server's (one host: none; across machines: a bounded skew, as the lock
//! leases and RACE's grace period assume). A READ is checked again once it
//! has returned (a task descheduled between the check and the READ
//! starts over); a CAS cannot be taken back, so a writer descheduled for
//! more than `grace/2` between checking its target and posting the CAS
//! could act on a reused block — the grace period (100 ms) is chosen
//! orders of magnitude above such delays. Versions that were never linked
//! (a write whose precondition failed) go back to their writer at once. A
//! server that dies forgets its quarantine: those versions leak, nothing
//! breaks; a new server walks every chain from its head.
//!
//! ## The metadata server
//! [`Mds`] holds no state a client needs: the key → chain table is the
//! directory in remote memory (claimed by clients with one CAS per new
//! key, read one-sidedly), free space is handed out through the pool in
//! remote memory ([`pool`]), and its own work — walking chains, cutting,
//! freeing — is one-sided too. So it runs in a thread of the process that
//! made the store (`gc` on, the embedded setup), in its own process
//! (`dmkit clover-mds`), or as a virtual thread on the simulator, and a
//! store works (without reclamation) while none runs.
//!
//! ## Limits
//! Directory entries are never freed (a deleted key keeps its chain, its
//! tail a tombstone): `dir_slots` bounds the keys ever stored. Versions
//! live on the home node. A key under writes faster than the server can
//! walk its chain (one READ per version per round trip) accumulates
//! garbage until the load drops. Retry loops give up after the store's
//! [`dmkit_index::RetryPolicy`] with [`dmkit_index::IndexError::GaveUp`].

#![warn(missing_docs)]

pub mod check;
mod client;
pub mod hint;
pub mod layout;
pub mod mds;
pub mod pool;
mod store;

pub use check::{check_chains, ChainReport};
pub use client::{CloverClient, CloverCounters};
pub use dmkit_index::IndexError;
pub use mds::{Mds, MdsConfig, MdsCounters};
pub use store::{CloverConfig, CloverKv, KIND, PROBE_WINDOW};
