//! The process-wide block allocator (CoRM §2.1.1, §3.1.1) over the node's
//! memory, and the block directory every worker reads.
//!
//! The store reserves one range of the node's remote address space and cuts
//! it into *virtual blocks* (`vb`s) of the block size; a block's *frame*
//! (its memory) is the memory pages behind its first virtual block (its
//! primary), which the node maps 1:1 when it hands out the range. So:
//!
//! - a new block takes a free virtual block and its own frame;
//! - compaction points a source block's virtual blocks at the destination's
//!   frame ([`MemNode::remap_pages`]: two remote pages, one memory page) and
//!   returns the source's frame to the OS ([`MemNode::discard_data_pages`]);
//! - a virtual block no live object is homed at any more is *released*
//!   (§3.3): unmapped (a verb there faults), and reused later with its
//!   generation bumped so old pointers to it are refused.
//!
//! A frame is in use exactly when its virtual block is the primary of a
//! live block, so *active memory* is `blocks × block size`.
//!
//! ## The directory (one word per virtual block)
//!
//! ```text
//!  63   62                  32 31      24 23      16 15       8 7        0
//! +----+----------------------+----------+----------+----------+----------+
//! |used| block (its primary)  | move seq | owner    | class    | gen      |
//! +----+----------------------+----------+----------+----------+----------+
//! ```
//!
//! Written by the block's owner, read by every worker: `used`, `gen` and
//! `class` validate pointers, `owner` routes requests that need the block's
//! metadata (free, release, pointer correction by messaging), `block` finds
//! the block a merged address now belongs to, and `move seq` is odd while a
//! merge moves the objects behind the address, so a worker that corrects a
//! pointer by scanning knows to scan again.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, Weak};

use super::config::ObjError;
use crate::layout::access;
use crate::node::MemNode;

/// A directory entry, unpacked.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub(crate) struct Dir {
    pub used: bool,
    pub gen: u8,
    pub class: u8,
    pub owner: u8,
    pub seq: u8,
    pub block: u64,
}

impl Dir {
    fn pack(self) -> u64 {
        (self.used as u64) << 63
            | (self.block & 0x7FFF_FFFF) << 32
            | (self.seq as u64) << 24
            | (self.owner as u64) << 16
            | (self.class as u64) << 8
            | self.gen as u64
    }

    fn unpack(w: u64) -> Self {
        Dir {
            used: w >> 63 != 0,
            block: (w >> 32) & 0x7FFF_FFFF,
            seq: (w >> 24) as u8,
            owner: (w >> 16) as u8,
            class: (w >> 8) as u8,
            gen: w as u8,
        }
    }
}

#[derive(Debug)]
struct Free {
    /// Virtual blocks never used yet: `fresh..nvb`.
    fresh: u64,
    /// Released virtual blocks, reused oldest first.
    released: VecDeque<u64>,
    /// Frames in use (= live blocks).
    frames: u64,
}

/// The store's range of the node and its directory.
#[derive(Debug)]
pub(crate) struct Space {
    /// Weak: the node holds the store (as a service). Once the node is
    /// gone its memory is too, and nothing of the store needs undoing.
    node: Weak<MemNode>,
    /// Remote byte offset of virtual block 0 (block aligned).
    pub base: u64,
    /// Number of virtual blocks.
    pub nvb: u64,
    pub block_shift: u32,
    page_shift: u32,
    /// The reserved chunk (its start may precede `base`).
    chunk: u64,
    dir: Box<[AtomicU64]>,
    free: Mutex<Free>,
    max_frames: u64,
    /// Key of the store's read-only region.
    pub rkey: u32,
}

impl Space {
    /// Reserves `virtual_bytes` of the node for blocks of `block_size`.
    pub(crate) fn new(
        node: &Arc<MemNode>,
        block_size: u64,
        virtual_bytes: u64,
        max_active_bytes: Option<u64>,
    ) -> Result<Self, String> {
        let l = node.layout();
        let ps = l.page_size();
        let max_block = (1u64 << 20).max(ps);
        if !block_size.is_power_of_two()
            || block_size < 4096
            || !block_size.is_multiple_of(ps)
            || block_size > max_block
        {
            return Err(format!(
                "block size {block_size} B: a power of two from 4 KiB to {max_block} B and a multiple of the node's {ps} B pages"
            ));
        }
        let nvb = virtual_bytes / block_size;
        if !(2..=1 << 31).contains(&nvb) {
            return Err(format!(
                "{virtual_bytes} B of address space: need 2 to 2^31 blocks of {block_size} B"
            ));
        }
        // Reserve one block more so the range can start block aligned.
        let want = (nvb + 1) * block_size;
        let (chunk, got) = node
            .reserve_internal(want)
            .map_err(|e| format!("reserving {want} B of the node for the store: {e}"))?;
        let base = chunk.next_multiple_of(block_size);
        debug_assert!(base + nvb * block_size <= chunk + got);
        let page_shift = l.page_shift as u32;
        let undo = |why: String| {
            let _ = node.release_internal(chunk);
            why
        };
        for p in (base >> page_shift)..((base + nvb * block_size) >> page_shift) {
            if node.translate(p) != Some(p) {
                return Err(undo(format!(
                    "remote page {p} was migrated: the store needs the node's 1:1 mapping"
                )));
            }
        }
        let rkey = node
            .register_region(base, nvb * block_size, access::READ)
            .map_err(|e| undo(format!("registering the store's region: {e}")))?
            .rkey;
        let max_frames = max_active_bytes.map_or(nvb, |b| (b / block_size).min(nvb));
        Ok(Space {
            base,
            nvb,
            block_shift: block_size.trailing_zeros(),
            page_shift,
            chunk,
            dir: (0..nvb).map(|_| AtomicU64::new(0)).collect(),
            free: Mutex::new(Free {
                fresh: 0,
                released: VecDeque::new(),
                frames: 0,
            }),
            max_frames,
            rkey,
            node: Arc::downgrade(node),
        })
    }

    /// The node, while it lives.
    fn node(&self) -> Option<Arc<MemNode>> {
        self.node.upgrade()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Free> {
        self.free.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The block size.
    pub(crate) fn block_size(&self) -> u64 {
        1 << self.block_shift
    }

    /// Remote byte offset of virtual block `vb`.
    pub(crate) fn vb_offset(&self, vb: u64) -> u64 {
        self.base + (vb << self.block_shift)
    }

    /// The virtual block holding remote offset `off`, if in the range.
    pub(crate) fn vb_of(&self, off: u64) -> Option<u64> {
        let rel = off.checked_sub(self.base)?;
        let vb = rel >> self.block_shift;
        (vb < self.nvb).then_some(vb)
    }

    pub(crate) fn pages(&self) -> u64 {
        1 << (self.block_shift - self.page_shift)
    }

    fn first_page(&self, vb: u64) -> u64 {
        self.vb_offset(vb) >> self.page_shift
    }

    /// The directory entry of `vb`.
    pub(crate) fn dir(&self, vb: u64) -> Dir {
        Dir::unpack(self.dir[vb as usize].load(Ordering::Acquire))
    }

    /// Sets the directory entry of `vb` (its owner only).
    pub(crate) fn set_dir(&self, vb: u64, d: Dir) {
        self.dir[vb as usize].store(d.pack(), Ordering::Release);
    }

    /// Advances the move sequence of `vb`'s directory entry (its owner
    /// only): a scanner that saw the old sequence scans again.
    pub(crate) fn bump_seq(&self, vb: u64) {
        let d = self.dir(vb);
        self.set_dir(
            vb,
            Dir {
                seq: d.seq.wrapping_add(1),
                ..d
            },
        );
    }

    /// Frames in use.
    pub(crate) fn frames(&self) -> u64 {
        self.lock().frames
    }

    /// Virtual blocks handed out at least once (`0..n`).
    pub(crate) fn touched(&self) -> u64 {
        self.lock().fresh
    }

    /// A virtual block and its frame for a new block of `class` owned by
    /// `owner`: the directory entry is published `used`.
    pub(crate) fn new_block(&self, class: u8, owner: u8) -> Result<(u64, u8), ObjError> {
        let mut f = self.lock();
        if f.frames >= self.max_frames {
            return Err(ObjError::OutOfMemory {
                active_bytes: f.frames << self.block_shift,
                limit: self.max_frames << self.block_shift,
            });
        }
        let (vb, gen) = if f.fresh < self.nvb {
            f.fresh += 1;
            (f.fresh - 1, 0)
        } else if !f.released.is_empty() {
            // Released addresses were unmapped: back to their own frame.
            let node = self.node().ok_or(ObjError::NodeGone)?;
            let vb = f.released.pop_front().expect("checked non-empty");
            node.remap_pages(self.first_page(vb), self.first_page(vb), self.pages())
                .expect("the store's pages are in range");
            (vb, self.dir(vb).gen.wrapping_add(1))
        } else {
            return Err(ObjError::OutOfAddressSpace);
        };
        f.frames += 1;
        self.set_dir(
            vb,
            Dir {
                used: true,
                gen,
                class,
                owner,
                seq: 0,
                block: vb,
            },
        );
        Ok((vb, gen))
    }

    /// Points every page of `src` at the frame of `dst_primary`.
    pub(crate) fn alias(&self, src: u64, dst_primary: u64) {
        let Some(node) = self.node() else { return };
        node.remap_pages(
            self.first_page(src),
            self.first_page(dst_primary),
            self.pages(),
        )
        .expect("the store's pages are in range");
    }

    /// Releases virtual block `vb` (§3.3): unmapped, its directory entry
    /// unused (its generation kept, bumped at reuse), queued for reuse.
    pub(crate) fn release(&self, vb: u64) {
        if let Some(node) = self.node() {
            node.unmap_pages(self.first_page(vb), self.pages())
                .expect("the store's pages are in range");
        }
        let d = self.dir(vb);
        self.set_dir(
            vb,
            Dir {
                used: false,
                gen: d.gen,
                ..Dir::default()
            },
        );
        self.lock().released.push_back(vb);
    }

    /// Returns the frame of `primary` to the OS.
    pub(crate) fn free_frame(&self, primary: u64) {
        if let Some(node) = self.node() {
            node.discard_data_pages(self.first_page(primary), self.pages())
                .expect("the store's pages are in range");
        }
        let mut f = self.lock();
        debug_assert!(f.frames > 0);
        f.frames -= 1;
    }

    /// The memory page behind `vb`'s first page (for the checker).
    pub(crate) fn translation(&self, vb: u64) -> Vec<Option<u64>> {
        (0..self.pages())
            .map(|i| {
                self.node()
                    .and_then(|n| n.translate(self.first_page(vb) + i))
            })
            .collect()
    }

    /// The identity frame's memory pages of `primary` (for the checker).
    pub(crate) fn frame_pages(&self, primary: u64) -> Vec<Option<u64>> {
        (0..self.pages())
            .map(|i| Some(self.first_page(primary) + i))
            .collect()
    }

    /// Released virtual blocks waiting for reuse (for the checker).
    pub(crate) fn released(&self) -> Vec<u64> {
        self.lock().released.iter().copied().collect()
    }
}

impl Drop for Space {
    fn drop(&mut self) {
        // Give the range back as the node handed it out: every page mapped
        // 1:1 (then the chunk free discards the memory). A node already
        // gone took its memory with it.
        let Some(node) = self.node() else { return };
        let first = self.base >> self.page_shift;
        let _ = node.remap_pages(
            first,
            first,
            self.nvb << (self.block_shift - self.page_shift),
        );
        let _ = node.deregister_region(self.rkey);
        let _ = node.release_internal(self.chunk);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn directory_words_round_trip() {
        let d = Dir {
            used: true,
            gen: 200,
            class: 17,
            owner: 31,
            seq: 5,
            block: (1 << 31) - 1,
        };
        assert_eq!(Dir::unpack(d.pack()), d);
        assert_eq!(Dir::unpack(0), Dir::default());
    }
}
