//! Compute-side allocator of remote blocks for data structures (one per
//! worker, no sharing): RACE's key-value blocks, the radix tree's nodes and
//! leaves.
//!
//! Blocks are multiples of 64 bytes (at most 127 units), carved from chunks
//! the memory node hands out in the structure's chunk group
//! (`alloc_group_chunk`: the structure outlives the client that wrote a
//! block, and the chunks go with the structure's last holder). Freed blocks wait out a grace
//! period in quarantine before reuse, so a reader that fetched a pointer
//! just before it changed still reads the block it named (checksums and key
//! checks catch the rest; see each structure's docs).

use std::collections::VecDeque;
use std::sync::Arc;

use dmkit_fabric::{Fabric, FabricError, GlobalAddr, NodeId};

use crate::clock::Nanos;

/// Largest block, in 64-byte units.
pub const MAX_UNITS: u64 = 127;

/// Bump allocation from a structure's group chunks, one chunk in use per
/// memory node: what [`BlockAlloc`] carves its blocks from, and a
/// structure's own size classes beyond [`MAX_UNITS`] (the B+tree's large
/// nodes) theirs.
pub struct ChunkBump {
    chunk_bytes: u64,
    /// The structure's chunk group, which owns every chunk taken.
    group: Arc<str>,
    /// The chunk in use on each node: (node, next, end).
    bump: Vec<(NodeId, u64, u64)>,
}

impl ChunkBump {
    /// Carving from chunks of `chunk_bytes` (or one block's bytes, if
    /// larger) taken in chunk group `group`.
    pub fn new(chunk_bytes: u64, group: Arc<str>) -> Self {
        Self {
            chunk_bytes,
            group,
            bump: Vec::new(),
        }
    }

    /// `bytes` on `prefer` if that node has room (in its chunk in use, or
    /// a fresh chunk), else on the first of `nodes` that has. The error is
    /// the last node's refusal.
    pub fn carve(
        &mut self,
        fabric: &dyn Fabric,
        nodes: &[NodeId],
        prefer: NodeId,
        bytes: u64,
    ) -> Result<GlobalAddr, FabricError> {
        let order = std::iter::once(prefer).chain(nodes.iter().copied().filter(|&n| n != prefer));
        let mut last_err = None;
        for node in order {
            if let Some(b) = self.bump.iter_mut().find(|b| b.0 == node) {
                if b.2 - b.1 >= bytes {
                    let a = GlobalAddr::new(node, b.1);
                    b.1 += bytes;
                    return Ok(a);
                }
            }
            match fabric.alloc_group_chunk(node, self.chunk_bytes.max(bytes), &self.group) {
                Ok(c) => {
                    let start = c.addr.offset();
                    self.bump.retain(|b| b.0 != node);
                    self.bump.push((node, start + bytes, start + c.len));
                    return Ok(c.addr);
                }
                Err(e) => last_err = Some(e),
            }
        }
        Err(last_err.expect("at least one node was tried"))
    }
}

/// A worker's block allocator.
pub struct BlockAlloc {
    grace: Nanos,
    /// Where new blocks come from.
    chunks: ChunkBump,
    /// Free blocks by size in 64-byte units.
    free: Vec<Vec<GlobalAddr>>,
    quarantine: VecDeque<(Nanos, GlobalAddr, u64)>,
}

impl BlockAlloc {
    /// An allocator taking `chunk_bytes` at a time in chunk group `group`
    /// (the structure's, so its chunks live and die with it).
    pub fn new(chunk_bytes: u64, grace: Nanos, group: Arc<str>) -> Self {
        Self {
            grace,
            chunks: ChunkBump::new(chunk_bytes, group),
            free: vec![Vec::new(); 128],
            quarantine: VecDeque::new(),
        }
    }

    /// A block of `units`·64 bytes (1..=[`MAX_UNITS`]), on `prefer` if that
    /// node has room, else on any node of `nodes`. The error is the last
    /// node's refusal.
    ///
    /// # Panics
    /// If `units` is out of range (programmer error).
    pub fn alloc(
        &mut self,
        fabric: &dyn Fabric,
        nodes: &[NodeId],
        prefer: NodeId,
        units: u64,
        now: Nanos,
    ) -> Result<GlobalAddr, FabricError> {
        assert!(
            (1..=MAX_UNITS).contains(&units),
            "block of {units} units (1..={MAX_UNITS})"
        );
        while let Some(&(t, a, u)) = self.quarantine.front() {
            if t > now {
                break;
            }
            self.quarantine.pop_front();
            self.free[u as usize].push(a);
        }
        let list = &mut self.free[units as usize];
        if let Some(i) = list.iter().rposition(|a| a.node() == prefer) {
            return Ok(list.swap_remove(i));
        }
        self.chunks
            .carve(fabric, nodes, prefer, units * 64)
            // Last resort: any free block of this size on any node.
            .or_else(|e| self.free[units as usize].pop().ok_or(e))
    }

    /// Returns a block nobody else ever saw (immediately reusable).
    pub fn free_now(&mut self, a: GlobalAddr, units: u64) {
        self.free[units as usize].push(a);
    }

    /// Returns a block that readers may still hold; reusable after the grace.
    pub fn retire(&mut self, a: GlobalAddr, units: u64, now: Nanos) {
        self.quarantine.push_back((now + self.grace, a, units));
    }
}
