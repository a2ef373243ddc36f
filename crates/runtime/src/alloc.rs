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

/// A worker's block allocator.
pub struct BlockAlloc {
    chunk_bytes: u64,
    grace: Nanos,
    /// Bump ranges per node: (next, end).
    bump: Vec<(NodeId, u64, u64)>,
    /// Free blocks by size in 64-byte units.
    free: Vec<Vec<GlobalAddr>>,
    quarantine: VecDeque<(Nanos, GlobalAddr, u64)>,
    /// The structure's chunk group, which owns every chunk taken.
    group: Arc<str>,
}

impl BlockAlloc {
    /// An allocator taking `chunk_bytes` at a time in chunk group `group`
    /// (the structure's, so its chunks live and die with it).
    pub fn new(chunk_bytes: u64, grace: Nanos, group: Arc<str>) -> Self {
        Self {
            group,
            chunk_bytes,
            grace,
            bump: Vec::new(),
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
        let bytes = units * 64;
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
                    let (addr, len) = (c.addr, c.len);
                    let start = addr.offset();
                    self.bump.retain(|b| b.0 != node);
                    self.bump.push((node, start + bytes, start + len));
                    return Ok(addr);
                }
                Err(e) => last_err = Some(e),
            }
        }
        // Last resort: any free block of this size on any node.
        if let Some(a) = self.free[units as usize].pop() {
            return Ok(a);
        }
        Err(last_err.expect("at least one node was tried"))
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
