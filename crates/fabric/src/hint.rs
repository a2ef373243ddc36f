//! Cache hints for loops that walk state scattered over many megabytes
//! (the simulator steps hundreds of virtual threads in turn, each with its
//! own worker, tasks and connections). A hint has no effect on what a
//! program computes, only on when its loads find their data in cache.

/// Starts loading the two cache lines at the start of `*r` (a use a
/// little later then does not wait for memory).
#[inline(always)]
pub fn prefetch<T: ?Sized>(r: &T) {
    lines((r as *const T).cast());
}

/// [`prefetch`] for every cache line of `*r`, up to 4 KiB.
#[inline]
pub fn prefetch_all<T: ?Sized>(r: &T) {
    let len = std::mem::size_of_val(r).min(4096);
    let p = (r as *const T).cast::<u8>();
    let mut off = 0;
    while off < len {
        lines(p.wrapping_add(off));
        off += 128;
    }
}

/// Hints the lines at `p` and `p + 64`; a no-op off x86_64.
#[inline(always)]
fn lines(p: *const u8) {
    #[cfg(target_arch = "x86_64")]
    {
        use std::arch::x86_64::{_mm_prefetch, _MM_HINT_T0};
        // SAFETY: a prefetch has no architectural effect: it never faults,
        // whatever the address, and reads nothing the program sees. SSE is
        // part of the x86_64 baseline. (`p + 64` is only hinted, never
        // dereferenced, so it may lie past the object.)
        unsafe {
            _mm_prefetch::<_MM_HINT_T0>(p.cast());
            _mm_prefetch::<_MM_HINT_T0>(p.wrapping_add(64).cast());
        }
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = p;
}
