//! Where a client's new nodes come from.
//!
//! Nodes up to the runtime allocator's largest block (127 × 64 = 8,128 B)
//! are its blocks ([`BlockAlloc`]). Larger nodes — Sherman's span-32 leaf
//! of 256-byte keys (9,280 B) or of 256- to 1,024-byte values (up to
//! 33,344 B), the radix-tree paper's Figures 14 and 18 (b)–(c) — are the
//! tree's own class: carved one after another from the tree's group
//! chunks, as Sherman's local allocator carves its pages from 32 MB chunks
//! and keeps the span at 32 whatever the key and value sizes (SMART's
//! artifact changes only `keyLen` and `simulatedValLen` for those
//! figures). Fewer entries per leaf instead would change the tree the
//! figures measure: the leaf read would no longer grow with the item, which
//! is the figures' point. A B+tree node is never freed (deletes are lazy);
//! a node a client took and never published (a lost root race) is reused
//! first, as with the blocks.

use std::sync::Arc;

use dmkit_fabric::{Fabric, FabricError, GlobalAddr, NodeId};
use dmkit_runtime::alloc::{BlockAlloc, ChunkBump, MAX_UNITS};
use dmkit_runtime::Nanos;

/// Bytes of the runtime allocator's largest block.
pub const MAX_BLOCK_BYTES: usize = MAX_UNITS as usize * 64;

/// A client's node allocator: one node size per tree.
pub(crate) enum NodeAlloc {
    /// Nodes of at most [`MAX_BLOCK_BYTES`]: the runtime's blocks.
    Blocks {
        alloc: BlockAlloc,
        /// Node size in 64-byte units.
        units: u64,
    },
    /// Larger nodes: the tree's own bump class.
    Large(LargeNodes),
}

/// Bump allocation of `node_bytes`-long nodes from the tree's chunks.
pub(crate) struct LargeNodes {
    node_bytes: u64,
    chunks: ChunkBump,
    /// Nodes taken and never published.
    free: Vec<GlobalAddr>,
}

impl NodeAlloc {
    /// An allocator of `node_bytes`-long nodes (a multiple of 64) taking
    /// `chunk_bytes` at a time in chunk group `group`.
    pub(crate) fn new(node_bytes: usize, chunk_bytes: u64, group: Arc<str>) -> Self {
        debug_assert!(node_bytes.is_multiple_of(64) && node_bytes > 0);
        if node_bytes <= MAX_BLOCK_BYTES {
            NodeAlloc::Blocks {
                alloc: BlockAlloc::new(chunk_bytes, Nanos::MAX / 4, group),
                units: (node_bytes / 64) as u64,
            }
        } else {
            NodeAlloc::Large(LargeNodes {
                node_bytes: node_bytes as u64,
                chunks: ChunkBump::new(chunk_bytes, group),
                free: Vec::new(),
            })
        }
    }

    /// A node, on `prefer` if that memory node has room, else on any of
    /// `nodes`. The error is the last memory node's refusal.
    pub(crate) fn alloc(
        &mut self,
        fabric: &dyn Fabric,
        nodes: &[NodeId],
        prefer: NodeId,
        now: Nanos,
    ) -> Result<GlobalAddr, FabricError> {
        match self {
            NodeAlloc::Blocks { alloc, units } => alloc.alloc(fabric, nodes, prefer, *units, now),
            NodeAlloc::Large(l) => l.alloc(fabric, nodes, prefer),
        }
    }

    /// Returns a node nobody else ever saw (reused by the next `alloc`).
    pub(crate) fn free_now(&mut self, a: GlobalAddr) {
        match self {
            NodeAlloc::Blocks { alloc, units } => alloc.free_now(a, *units),
            NodeAlloc::Large(l) => l.free.push(a),
        }
    }
}

impl LargeNodes {
    fn alloc(
        &mut self,
        fabric: &dyn Fabric,
        nodes: &[NodeId],
        prefer: NodeId,
    ) -> Result<GlobalAddr, FabricError> {
        if let Some(i) = self.free.iter().rposition(|a| a.node() == prefer) {
            return Ok(self.free.swap_remove(i));
        }
        self.chunks
            .carve(fabric, nodes, prefer, self.node_bytes)
            .or_else(|e| self.free.pop().ok_or(e))
    }
}
