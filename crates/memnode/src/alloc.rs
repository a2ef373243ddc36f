//! The chunk allocator: hands out page-aligned extents of the node's remote
//! address space to compute-side allocators (which then carve objects out of
//! them with one-sided verbs, as the SMART and RACE designs do).
//!
//! First fit over an address-ordered free list; frees coalesce with both
//! neighbours. Chunks are large and rare, so the O(free extents) scan is
//! irrelevant next to an RPC round trip.

use std::collections::BTreeMap;

/// Extent allocator over `[start, end)`, all values multiples of `align`.
#[derive(Debug)]
pub struct ExtentAllocator {
    free: BTreeMap<u64, u64>,
    align: u64,
    free_bytes: u64,
    capacity: u64,
}

impl ExtentAllocator {
    /// An allocator whose whole range `[start, end)` is free.
    pub fn new(start: u64, end: u64, align: u64) -> Self {
        assert!(
            align.is_power_of_two()
                && start.is_multiple_of(align)
                && end.is_multiple_of(align)
                && start <= end
        );
        let mut free = BTreeMap::new();
        if end > start {
            free.insert(start, end - start);
        }
        Self {
            free,
            align,
            free_bytes: end - start,
            capacity: end - start,
        }
    }

    /// Rounds `len` up to the alignment; `None` on overflow.
    pub fn round(&self, len: u64) -> Option<u64> {
        len.checked_add(self.align - 1)
            .map(|v| v & !(self.align - 1))
    }

    /// Allocates `len` bytes (rounded up). Returns the offset and rounded length.
    pub fn alloc(&mut self, len: u64) -> Option<(u64, u64)> {
        let len = self.round(len)?;
        if len == 0 {
            return None;
        }
        let (&off, &flen) = self.free.iter().find(|(_, &l)| l >= len)?;
        self.free.remove(&off);
        if flen > len {
            self.free.insert(off + len, flen - len);
        }
        self.free_bytes -= len;
        Some((off, len))
    }

    /// Returns `[off, off+len)` to the free list, merging with neighbours.
    /// The caller guarantees the extent was allocated (the node tracks owners).
    pub fn free(&mut self, off: u64, len: u64) {
        let mut start = off;
        let mut end = off + len;
        if let Some((&poff, &plen)) = self.free.range(..off).next_back() {
            debug_assert!(poff + plen <= off, "double free of {off:#x}");
            if poff + plen == off {
                start = poff;
                self.free.remove(&poff);
            }
        }
        if let Some(&nlen) = self.free.get(&end) {
            self.free.remove(&end);
            end += nlen;
        }
        self.free.insert(start, end - start);
        self.free_bytes += len;
    }

    /// Takes exactly `[off, off+len)` out of the free list (a restarted
    /// file-backed node re-taking the chunks its metadata lists). `false`,
    /// changing nothing, if it is not all free or not aligned.
    pub fn take(&mut self, off: u64, len: u64) -> bool {
        if len == 0 || !off.is_multiple_of(self.align) || !len.is_multiple_of(self.align) {
            return false;
        }
        let Some((&foff, &flen)) = self.free.range(..=off).next_back() else {
            return false;
        };
        if off.checked_add(len).is_none_or(|e| e > foff + flen) {
            return false;
        }
        self.free.remove(&foff);
        if off > foff {
            self.free.insert(foff, off - foff);
        }
        if off + len < foff + flen {
            self.free.insert(off + len, foff + flen - off - len);
        }
        self.free_bytes -= len;
        true
    }

    /// The free extents, `(offset, length)` in address order.
    pub fn free_ranges(&self) -> Vec<(u64, u64)> {
        self.free.iter().map(|(&o, &l)| (o, l)).collect()
    }

    /// Bytes currently free.
    pub fn free_bytes(&self) -> u64 {
        self.free_bytes
    }

    /// Bytes the allocator manages.
    pub fn capacity(&self) -> u64 {
        self.capacity
    }

    /// Largest free extent.
    pub fn largest_free(&self) -> u64 {
        self.free.values().copied().max().unwrap_or(0)
    }

    /// Number of free extents (fragmentation indicator).
    pub fn free_extents(&self) -> usize {
        self.free.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn alloc_free_coalesces_back_to_one_extent() {
        let mut a = ExtentAllocator::new(4096, 4096 * 101, 4096);
        let x = a.alloc(1).unwrap();
        let y = a.alloc(8192).unwrap();
        let z = a.alloc(4096 * 3).unwrap();
        assert_eq!(x, (4096, 4096));
        assert_eq!(y, (8192, 8192));
        assert_eq!(z.0, 16384);
        assert_eq!(a.free_bytes(), 4096 * 100 - 4096 * 6);
        a.free(y.0, y.1);
        a.free(x.0, x.1);
        assert_eq!(a.free_extents(), 2);
        a.free(z.0, z.1);
        assert_eq!(a.free_extents(), 1);
        assert_eq!(a.free_bytes(), 4096 * 100);
        assert_eq!(a.largest_free(), 4096 * 100);
    }

    #[test]
    fn take_carves_an_exact_extent_or_refuses() {
        let mut a = ExtentAllocator::new(4096, 4096 * 11, 4096);
        assert!(a.take(4096 * 3, 4096 * 2));
        assert!(!a.take(4096 * 4, 4096), "already taken");
        assert!(!a.take(4096 * 10, 4096 * 2), "past the end");
        assert!(!a.take(100, 4096), "unaligned");
        assert_eq!(
            a.free_ranges(),
            vec![(4096, 4096 * 2), (4096 * 5, 4096 * 6)]
        );
        assert_eq!(a.free_bytes(), 4096 * 8);
        a.free(4096 * 3, 4096 * 2);
        assert_eq!(a.free_ranges(), vec![(4096, 4096 * 10)]);
    }

    #[test]
    fn exhaustion_and_zero_are_refused() {
        let mut a = ExtentAllocator::new(0, 4096 * 4, 4096);
        assert!(a.alloc(0).is_none());
        assert!(a.alloc(4096 * 5).is_none());
        assert!(a.alloc(u64::MAX).is_none());
        assert!(a.alloc(4096 * 4).is_some());
        assert!(a.alloc(1).is_none());
    }
}
