//! Local memory registered for verbs (RDMA's local memory region, "MR").
//!
//! READ data lands in local memory and WRITE payloads are taken from it, as
//! with real verbs: work requests only name `(lkey, offset, len)`, so they are
//! small `Copy` values, and data is where the caller expects it whether or
//! not the request was signaled (SMART §4.1.3's unsignaled reads + one
//! signaled request per batch need exactly that).
//!
//! A [`LocalMem`] is registered with each [`crate::QueuePair`] that uses it
//! ([`crate::QueuePair::register_local`]); the queue pair keeps it alive, so
//! a request can never reach freed memory. All access to its bytes goes
//! through atomics: a backend may fill it (a NIC's DMA, a simulator's
//! delayed completion) while the owner looks at it, and that is a race of
//! values, never undefined behaviour.

use std::alloc::{alloc_zeroed, dealloc, Layout};
use std::ptr::NonNull;
use std::sync::atomic::{AtomicU64, AtomicU8, Ordering};
use std::sync::Arc;

/// Key of a local memory region on one queue pair (RDMA's lkey).
pub type Lkey = u32;

struct Inner {
    ptr: NonNull<u8>,
    len: usize,
}

// SAFETY: the allocation is owned by Inner and only accessed through atomics.
unsafe impl Send for Inner {}
// SAFETY: as above; no `&mut` to the bytes is ever handed out.
unsafe impl Sync for Inner {}

impl Drop for Inner {
    fn drop(&mut self) {
        // SAFETY: allocated in `LocalMem::new` with exactly this layout.
        unsafe { dealloc(self.ptr.as_ptr(), layout(self.len)) }
    }
}

/// Page alignment for a page or more; a cache line for less. Hundreds of
/// simulated workers each own a few hundred bytes of task memory: page
/// aligned, every one of them started at page offset 0, so their lines all
/// fell into the same few cache sets and evicted each other (`dmkit sim
/// speed`, 6 machines: 7.28 → 7.43 M verbs per second, median of 3).
fn layout(len: usize) -> Layout {
    let align = if len < 4096 { 64 } else { 4096 };
    Layout::from_size_align(len.max(1), align).expect("local memory layout")
}

/// A zeroed block of local memory usable by verbs, page aligned (cache-line
/// aligned when smaller than a page). Cloning shares the same memory.
#[derive(Clone)]
pub struct LocalMem(Arc<Inner>);

impl std::fmt::Debug for LocalMem {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "LocalMem({:p}, {} B)", self.0.ptr, self.0.len)
    }
}

impl LocalMem {
    /// Allocates `len` zeroed bytes, page aligned (a cache line when `len`
    /// is under a page).
    ///
    /// # Panics
    /// If the allocation fails (out of memory), like `Vec`.
    pub fn new(len: usize) -> Self {
        let l = layout(len);
        // SAFETY: the layout has non-zero size (`max(1)`).
        let p = unsafe { alloc_zeroed(l) };
        let ptr = NonNull::new(p).unwrap_or_else(|| std::alloc::handle_alloc_error(l));
        LocalMem(Arc::new(Inner { ptr, len }))
    }

    /// Size in bytes.
    #[inline]
    pub fn len(&self) -> usize {
        self.0.len
    }

    /// Start of the memory, for a backend that registers it with a NIC
    /// (the verbs backend's `ibv_reg_mr`). Valid while any clone of this
    /// `LocalMem` lives; other code must go through the safe accessors.
    pub fn as_mut_ptr(&self) -> *mut u8 {
        self.0.ptr.as_ptr()
    }

    /// Whether the region has zero bytes.
    #[inline]
    pub fn is_empty(&self) -> bool {
        self.0.len == 0
    }

    /// Whether two handles share the same memory.
    pub fn same(&self, other: &LocalMem) -> bool {
        Arc::ptr_eq(&self.0, &other.0)
    }

    /// Raw pointer to `[offset, offset+len)` if it lies inside the region.
    #[inline(always)]
    pub(crate) fn range_ptr(&self, offset: u64, len: u32) -> Option<*mut u8> {
        let end = offset.checked_add(len as u64)?;
        // SAFETY: offset + len ≤ self.len, so the pointer stays in the allocation.
        (end <= self.0.len as u64).then(|| unsafe { self.0.ptr.as_ptr().add(offset as usize) })
    }

    #[inline]
    fn checked(&self, offset: usize, len: usize) -> *mut u8 {
        match u32::try_from(len)
            .ok()
            .and_then(|l| self.range_ptr(offset as u64, l))
        {
            Some(p) => p,
            None => self.outside(offset, len),
        }
    }

    #[cold]
    #[inline(never)]
    fn outside(&self, offset: usize, len: usize) -> ! {
        panic!(
            "local access [{offset}, +{len}) outside a {} B LocalMem",
            self.0.len
        )
    }

    /// Copies `dst.len()` bytes from `offset` into `dst`.
    ///
    /// # Panics
    /// If the range is outside the region (programmer error).
    pub fn read(&self, offset: usize, dst: &mut [u8]) {
        let p = self.checked(offset, dst.len());
        // SAFETY: the range is inside the allocation (checked).
        unsafe { copy_out(p, dst) }
    }

    /// Copies `len` bytes at `src` to `dst`, both inside this memory and
    /// not overlapping, as the fabric copies shared memory (word by word
    /// when both are 8-byte aligned): a local-to-local copy, e.g. packing
    /// entries that already sit in registered memory.
    ///
    /// # Panics
    /// If a range is outside the region or the two overlap (programmer
    /// error).
    pub fn copy_within(&self, src: usize, dst: usize, len: usize) {
        let s = self.checked(src, len);
        let d = self.checked(dst, len);
        assert!(
            src + len <= dst || dst + len <= src,
            "overlapping local copy [{src}, +{len}) -> [{dst}, +{len})"
        );
        // SAFETY: both ranges are inside the allocation (checked) and do
        // not overlap (asserted).
        unsafe { copy_shared(d, s, len) }
    }

    /// The bytes at `[offset, offset+len)`, copied out.
    pub fn to_vec(&self, offset: usize, len: usize) -> Vec<u8> {
        let mut v = vec![0; len];
        self.read(offset, &mut v);
        v
    }

    /// Copies `src` to `offset`.
    ///
    /// # Panics
    /// If the range is outside the region (programmer error).
    #[inline]
    pub fn write(&self, offset: usize, src: &[u8]) {
        let p = self.checked(offset, src.len());
        // SAFETY: the range is inside the allocation (checked).
        unsafe { copy_in(p, src) }
    }

    /// The native-endian `u64` at `offset` (8-byte aligned).
    ///
    /// # Panics
    /// If out of range or unaligned.
    #[inline]
    pub fn load_u64(&self, offset: usize) -> u64 {
        assert_eq!(offset % 8, 0, "unaligned local u64 at {offset}");
        let p = self.checked(offset, 8);
        // SAFETY: in range, 8-byte aligned (line-aligned base + aligned offset).
        unsafe { (*(p as *const AtomicU64)).load(Ordering::Acquire) }
    }

    /// Starts loading the cache line holding byte `offset` (a hint:
    /// [`crate::hint::line`]; an offset past the end hints nothing).
    #[inline(always)]
    pub fn prefetch(&self, offset: usize) {
        if let Some(p) = self.range_ptr(offset as u64, 1) {
            crate::hint::line(p);
        }
    }

    /// Faults every page of the region in, keeping its contents, as
    /// `ibv_reg_mr` does when it pins a buffer: a backend with no NIC calls
    /// it when the memory is registered, so that a benchmark's window never
    /// pays the kernel's first-touch fault and zeroing for local memory the
    /// verbs backend would have had pinned before the run. (The simulator
    /// does not call it: its hundreds of workers' buffers stay lazily
    /// mapped, and its time is virtual.) Cheap when already populated.
    pub fn populate(&self) {
        if self.0.len < 4096 {
            return;
        }
        for off in (0..self.0.len).step_by(4096) {
            let p = self.checked(off, 8);
            // SAFETY: in range (checked) and 8-byte aligned (the base is
            // line-aligned, `off` a multiple of 4096).
            dmkit_memnode::memory::touch(unsafe { &*(p as *const AtomicU64) });
        }
    }

    /// Stores a native-endian `u64` at `offset` (8-byte aligned).
    ///
    /// # Panics
    /// If out of range or unaligned.
    #[inline]
    pub fn store_u64(&self, offset: usize, v: u64) {
        assert_eq!(offset % 8, 0, "unaligned local u64 at {offset}");
        let p = self.checked(offset, 8);
        // SAFETY: in range, 8-byte aligned (line-aligned base + aligned offset).
        unsafe { (*(p as *const AtomicU64)).store(v, Ordering::Release) }
    }
}

/// Copies `dst.len()` bytes from memory at `src` that others may access
/// concurrently: aligned words as `AtomicU64`, edges as `AtomicU8`, in
/// ascending address order.
///
/// # Safety
/// `src..src+dst.len()` must be valid for reads for the duration of the call.
#[inline(always)]
pub(crate) unsafe fn copy_out(src: *const u8, dst: &mut [u8]) {
    let n = dst.len();
    let mut i = 0;
    while i < n && !(src as usize + i).is_multiple_of(8) {
        dst[i] = (*(src.add(i) as *const AtomicU8)).load(Ordering::Acquire);
        i += 1;
    }
    while i + 8 <= n {
        let w = (*(src.add(i) as *const AtomicU64)).load(Ordering::Acquire);
        dst[i..i + 8].copy_from_slice(&w.to_ne_bytes());
        i += 8;
    }
    while i < n {
        dst[i] = (*(src.add(i) as *const AtomicU8)).load(Ordering::Acquire);
        i += 1;
    }
}

/// Copies `src` into memory at `dst` that others may access concurrently, in
/// ascending address order (aligned words are single-copy atomic).
///
/// # Safety
/// `dst..dst+src.len()` must be valid for writes for the duration of the call.
#[inline(always)]
pub(crate) unsafe fn copy_in(dst: *mut u8, src: &[u8]) {
    let n = src.len();
    // Whole words to an aligned destination (a small put of a compile-time
    // length, inlined, becomes word stores at constant offsets, its source
    // kept in registers).
    if n.is_multiple_of(8) && (dst as usize).is_multiple_of(8) {
        for (k, w) in src.chunks_exact(8).enumerate() {
            let w = u64::from_ne_bytes(w.try_into().expect("8 bytes"));
            // SAFETY: inside `dst..dst+n` (the caller's contract) and
            // 8-byte aligned (checked above).
            (*(dst.add(8 * k) as *const AtomicU64)).store(w, Ordering::Release);
        }
        return;
    }
    let mut i = 0;
    while i < n && !(dst as usize + i).is_multiple_of(8) {
        (*(dst.add(i) as *const AtomicU8)).store(src[i], Ordering::Release);
        i += 1;
    }
    while i + 8 <= n {
        let w = u64::from_ne_bytes(src[i..i + 8].try_into().expect("8 bytes"));
        (*(dst.add(i) as *const AtomicU64)).store(w, Ordering::Release);
        i += 8;
    }
    while i < n {
        (*(dst.add(i) as *const AtomicU8)).store(src[i], Ordering::Release);
        i += 1;
    }
}

/// Copies `len` bytes between two regions that others may access
/// concurrently, in ascending address order.
///
/// # Safety
/// Both ranges must be valid for the duration of the call.
#[inline(always)]
pub(crate) unsafe fn copy_shared(dst: *mut u8, src: *const u8, len: usize) {
    if (dst as usize).is_multiple_of(8) && (src as usize).is_multiple_of(8) {
        let words = len / 8;
        for i in 0..words {
            let w = (*(src.add(8 * i) as *const AtomicU64)).load(Ordering::Acquire);
            (*(dst.add(8 * i) as *const AtomicU64)).store(w, Ordering::Release);
        }
        for i in 8 * words..len {
            let b = (*(src.add(i) as *const AtomicU8)).load(Ordering::Acquire);
            (*(dst.add(i) as *const AtomicU8)).store(b, Ordering::Release);
        }
    } else {
        // Misaligned relative to each other: bounce through a small buffer.
        let mut buf = [0u8; 256];
        let mut done = 0;
        while done < len {
            let n = (len - done).min(buf.len());
            copy_out(src.add(done), &mut buf[..n]);
            copy_in(dst.add(done), &buf[..n]);
            done += n;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn zeroed_aligned_and_bounds_checked() {
        let m = LocalMem::new(100);
        assert_eq!(m.to_vec(0, 100), vec![0; 100]);
        m.write(3, b"hello");
        assert_eq!(m.to_vec(3, 5), b"hello");
        m.store_u64(8, 42);
        assert_eq!(m.load_u64(8), 42);
        assert!(m.range_ptr(96, 4).is_some());
        assert!(m.range_ptr(97, 4).is_none());
        assert!(m.range_ptr(u64::MAX, 2).is_none());
        assert!(std::panic::catch_unwind(|| m.read(98, &mut [0; 4])).is_err());
        let c = m.clone();
        assert!(c.same(&m));
        assert!(!c.same(&LocalMem::new(1)));
    }

    #[test]
    fn copy_within_copies_any_alignment_and_refuses_overlap() {
        let m = LocalMem::new(256);
        let data: Vec<u8> = (1..=64).collect();
        m.write(0, &data);
        // Aligned: whole words.
        m.copy_within(0, 128, 64);
        assert_eq!(m.to_vec(128, 64), data);
        // An unaligned source, destination or length (copy_shared's byte
        // tail and misaligned-pair paths).
        for (src, dst, len) in [(1, 200, 40), (0, 67, 16), (8, 96, 13)] {
            m.copy_within(src, dst, len);
            assert_eq!(
                m.to_vec(dst, len),
                data[src..src + len],
                "{src} {dst} {len}"
            );
        }
        assert_eq!(m.to_vec(0, 64), data, "the source is untouched");
        assert!(std::panic::catch_unwind(|| m.copy_within(0, 32, 64)).is_err());
        assert!(std::panic::catch_unwind(|| m.copy_within(0, 250, 8)).is_err());
    }

    #[test]
    fn shared_copies_handle_every_alignment() {
        let a = LocalMem::new(600);
        let b = LocalMem::new(600);
        let data: Vec<u8> = (0..500u32).map(|i| (i * 13) as u8).collect();
        a.write(0, &data);
        for (d, s) in [(0usize, 0usize), (8, 16), (3, 0), (0, 5), (7, 1)] {
            let pd = b.range_ptr(d as u64, 400).unwrap();
            let ps = a.range_ptr(s as u64, 400).unwrap();
            // SAFETY (test): both ranges are inside their regions.
            unsafe { copy_shared(pd, ps, 400) };
            assert_eq!(b.to_vec(d, 400), data[s..s + 400]);
        }
    }
}
