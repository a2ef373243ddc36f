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

/// Hints the lines at `p` and `p + 64` (`p + 64` is only hinted, never
/// dereferenced, so it may lie past the object).
#[inline(always)]
fn lines(p: *const u8) {
    line(p);
    line(p.wrapping_add(64));
}

/// Starts loading the cache line holding `p` into every cache level; a
/// no-op off x86_64. Any address is fine: nothing is dereferenced.
#[inline(always)]
pub fn line(p: *const u8) {
    #[cfg(target_arch = "x86_64")]
    // SAFETY: PREFETCHT0 is a hint: it never faults, whatever the address,
    // and changes no architectural state; SSE is part of the x86_64
    // baseline.
    unsafe {
        core::arch::x86_64::_mm_prefetch::<{ core::arch::x86_64::_MM_HINT_T0 }>(p.cast())
    };
    #[cfg(not(target_arch = "x86_64"))]
    let _ = p;
}

/// Starts fetching the cache line holding `p` for writing (`PREFETCHW`:
/// the line arrives owned, so a later store does not wait for its
/// read-for-ownership); a no-op off x86_64. Any address is fine: nothing
/// is dereferenced.
#[inline(always)]
pub fn line_for_write(p: *const u8) {
    #[cfg(target_arch = "x86_64")]
    // SAFETY: PREFETCHW is a hint: it never faults, whatever the address,
    // and changes no architectural state; x86_64 CPUs without it (Intel
    // before Broadwell) execute its opcode as a NOP. `readonly`: it
    // stores nothing.
    unsafe {
        core::arch::asm!("prefetchw [{p}]", p = in(reg) p, options(nostack, preserves_flags, readonly))
    };
    #[cfg(not(target_arch = "x86_64"))]
    let _ = p;
}
