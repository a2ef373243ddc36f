//! # dmkit-memnode — the memory node
//!
//! What a memory blade of a disaggregated-memory system owns: a large pool of
//! memory reachable by one-sided verbs, the protection and translation tables
//! those verbs are checked against, and a tiny RPC service for the rare
//! control operations (chunk allocation, named roots, statistics, shutdown).
//! The node's CPU stays off the data path (SMART framework, ASPLOS'24, §2.1–§2.2).
//!
//! Not here: the verbs themselves (see `dmkit-fabric`).
//!
//! - [`layout`]: `#[repr(C)]` tables shared with clients through the control memfd.
//! - [`memory`]: sealed memfds and their mappings.
//! - [`file`]: a node whose memory is a file (`--memory-file`): what
//!   survives a restart, and what it promises.
//! - [`node`]: the node itself.
//! - [`proto`]: the control RPC messages and their framing.
//! - [`rpc`]: services on the node's worker threads (the RPC channel).
//! - [`server`]: the Unix-socket server handing out memfds by `SCM_RIGHTS`.
//! - [`corm`]: CoRM's compacting object store (SIGMOD'21) on the node's
//!   memory: size classes, blocks, per-worker allocators, compaction that
//!   remaps pages under one-sided readers, accounting, allocation traces.

pub mod admission;
pub mod alloc;
pub mod corm;
pub mod error;
pub mod file;
pub mod layout;
pub mod memory;
pub mod node;
pub mod proto;
pub mod rpc;
pub mod server;

pub use error::{NodeError, RpcError};
pub use node::{MemNode, NodeConfig, RetranslateHook, SessionId, DEFAULT_RPC_WORKERS};
pub use proto::{AdminOp, NodeLayout, NodeStats, RegionInfo, Request, Response, RootInfo};
