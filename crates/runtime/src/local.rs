//! Typed task-local memory: what a data structure declares once and its
//! verbs name.
//!
//! Every task owns a slice of its worker's registered local memory: READs
//! land there, WRITEs are sourced there (RDMA moves bytes between remote
//! memory and *registered* local memory, never arbitrary heap memory). A
//! data structure declares the regions it needs in a [`LocalLayout`] —
//! "the two combined buckets", "the leaf being updated", "one word for the
//! lock" — and keeps the [`Local`] handles it got back. The worker is then
//! sized from the declarations ([`crate::WorkerBuilder::local`]), and every
//! verb takes a `Local` instead of a bare offset and length (Sherman's named
//! per-coroutine buffers; rrddmma's typed local regions).
//!
//! ```
//! use dmkit_runtime::LocalLayout;
//! let mut l = LocalLayout::new();
//! let node = l.region("node", 1024);
//! let word = l.region("lock word", 8);
//! assert_eq!((node.offset(), word.offset()), (0, 1024));
//! assert_eq!(l.bytes(), 1032);
//! let slot = node.slice(16, 8);      // 8 bytes of the node image
//! assert_eq!((slot.offset(), slot.len()), (16, 8));
//! ```

/// A range of each task's local memory: `len` bytes at `offset` from the
/// start of the task's slice. Made by [`LocalLayout::region`] and narrowed
/// with [`Local::slice`]; `Copy` and two words wide, so verbs take it by
/// value on the hot path.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct Local {
    off: u32,
    len: u32,
}

impl Local {
    /// The range `[offset, offset + len)` of a task's memory. Data
    /// structures get theirs from a [`LocalLayout`]; this is for tools and
    /// tests that manage a task's memory by hand.
    ///
    /// # Panics
    /// If the range does not fit 32-bit offsets (programmer error).
    pub fn at(offset: usize, len: usize) -> Local {
        let off = u32::try_from(offset).expect("task-local offsets fit 32 bits");
        let len = u32::try_from(len).expect("task-local lengths fit 32 bits");
        assert!(off.checked_add(len).is_some(), "task-local range overflows");
        Local { off, len }
    }

    /// Bytes in the range.
    #[inline(always)]
    pub const fn len(self) -> usize {
        self.len as usize
    }

    /// Whether the range is empty.
    #[inline(always)]
    pub const fn is_empty(self) -> bool {
        self.len == 0
    }

    /// Where the range starts in the task's memory.
    #[inline(always)]
    pub const fn offset(self) -> usize {
        self.off as usize
    }

    /// Where the range ends in the task's memory.
    #[inline(always)]
    pub const fn end(self) -> usize {
        self.off as usize + self.len as usize
    }

    /// The `len` bytes at `at` inside this range.
    ///
    /// # Panics
    /// If they are not inside it (programmer error).
    #[inline(always)]
    pub fn slice(self, at: usize, len: usize) -> Local {
        if at.checked_add(len).is_none_or(|e| e > self.len as usize) {
            self.out_of_range(at, len);
        }
        Local {
            off: self.off + at as u32,
            len: len as u32,
        }
    }

    /// The first `len` bytes of this range.
    #[inline(always)]
    pub fn prefix(self, len: usize) -> Local {
        self.slice(0, len)
    }

    /// The range from `at` to this range's end.
    #[inline(always)]
    pub fn skip(self, at: usize) -> Local {
        self.slice(at, (self.len as usize).saturating_sub(at))
    }

    /// The 8-byte word at byte `at` of this range.
    #[inline(always)]
    pub fn word(self, at: usize) -> Local {
        self.slice(at, 8)
    }

    /// Piece `i` of this range cut in pieces of `size` bytes.
    #[inline(always)]
    pub fn piece(self, i: usize, size: usize) -> Local {
        self.slice(i * size, size)
    }

    #[cold]
    #[inline(never)]
    fn out_of_range(self, at: usize, len: usize) -> ! {
        panic!(
            "[{at}, +{len}) is outside the task-local range of {} bytes at {}",
            self.len, self.off
        )
    }
}

impl std::fmt::Debug for Local {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "local[{}, +{})", self.off, self.len)
    }
}

/// Alignment of every declared region: a cache line, so a READ landing in
/// one region never shares a line with another's bytes.
pub const REGION_ALIGN: usize = 64;

/// The regions of task-local memory a data structure needs, declared once
/// (typically when its shared handle is made) and reserved for every task
/// of a worker with [`crate::WorkerBuilder::local`].
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct LocalLayout {
    bytes: usize,
    regions: Vec<(&'static str, Local)>,
}

impl LocalLayout {
    /// An empty layout.
    pub fn new() -> Self {
        Self::default()
    }

    /// Declares a region of `len` bytes named `name` (for reports), at the
    /// next [`REGION_ALIGN`]-aligned offset.
    pub fn region(&mut self, name: &'static str, len: usize) -> Local {
        let at = self.bytes.next_multiple_of(REGION_ALIGN);
        let r = Local::at(at, len);
        self.bytes = r.end();
        self.regions.push((name, r));
        r
    }

    /// Bytes a task needs for every declared region.
    pub fn bytes(&self) -> usize {
        self.bytes
    }

    /// The declared regions, in declaration order.
    pub fn regions(&self) -> impl Iterator<Item = (&'static str, Local)> + '_ {
        self.regions.iter().copied()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn regions_are_aligned_and_slices_stay_inside() {
        let mut l = LocalLayout::new();
        let a = l.region("a", 8);
        let b = l.region("b", 100);
        let c = l.region("c", 0);
        assert_eq!((a.offset(), b.offset(), c.offset()), (0, 64, 192));
        assert_eq!(l.bytes(), 192);
        assert_eq!(
            l.regions().map(|r| r.0).collect::<Vec<_>>(),
            ["a", "b", "c"]
        );
        assert_eq!(b.piece(3, 20), Local::at(124, 20));
        assert_eq!(b.skip(90), Local::at(154, 10));
        assert_eq!(b.word(92), Local::at(156, 8));
        assert!(std::panic::catch_unwind(|| b.word(93)).is_err());
        assert!(std::panic::catch_unwind(|| b.slice(usize::MAX, 2)).is_err());
    }
}
