//! A compute process's view of one memory node's memory: the data mapping
//! and the read-only protection/translation tables. All unsafe memory access
//! of the shm backend lives here.
//!
//! Every access to the shared bytes goes through atomics (`AtomicU64` for
//! aligned words, `AtomicU8` for unaligned edges), so concurrent verbs from
//! other threads and processes are data-race free by construction.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use dmkit_memnode::layout::{self, ControlHeader, PageEntry, RegionEntry, MAX_REGIONS};
use dmkit_memnode::memory::Mapping;
use dmkit_memnode::NodeLayout;

use crate::addr::Rkey;
use crate::error::VerbError;
use crate::hint;
use crate::local::copy_shared;

/// Mapped memory and tables of one node.
pub(crate) struct NodeView {
    layout: NodeLayout,
    _data: Arc<Mapping>,
    _control: Arc<Mapping>,
    data: *mut u8,
    generation: &'static AtomicU64,
    state: &'static AtomicU64,
    regions: *const RegionEntry,
    pages: *const PageEntry,
    page_shift: u32,
    page_mask: u64,
}

// SAFETY: the raw pointers point into the two mappings, which `NodeView`
// keeps alive through its `Arc`s; all accesses through them are atomic.
unsafe impl Send for NodeView {}
// SAFETY: as above; `NodeView` has no interior state besides the mappings.
unsafe impl Sync for NodeView {}

impl NodeView {
    /// Checks the mappings against `layout` and the control header.
    pub(crate) fn new(
        layout: NodeLayout,
        data: Arc<Mapping>,
        control: Arc<Mapping>,
    ) -> Result<Self, String> {
        if (data.len() as u64) < layout.data_len() {
            return Err(format!(
                "data mapping is {} B, layout needs {} B",
                data.len(),
                layout.data_len()
            ));
        }
        if (control.len() as u64) < layout.control_len
            || (layout.control_len as usize) < layout::control_len(layout.remote_pages)
        {
            return Err("control mapping is smaller than its page table".into());
        }
        if !matches!(layout.page_shift, 12 | 21) {
            return Err(format!("unsupported page shift {}", layout.page_shift));
        }
        // SAFETY: the control mapping is at least control_len ≥ 4096 bytes and
        // page aligned, so a ControlHeader fits at its start; we only read
        // plain fields the node wrote before handing out the descriptor.
        let h = unsafe { &*(control.as_ptr() as *const ControlHeader) };
        if h.magic != layout::CONTROL_MAGIC
            || h.version != layout::LAYOUT_VERSION
            || h.node_id != layout.node_id as u64
            || h.page_shift != layout.page_shift as u64
            || h.remote_pages != layout.remote_pages
            || h.phys_pages != layout.phys_pages
        {
            return Err("control header does not match the announced layout".into());
        }
        let data_ptr = data.as_ptr();
        // SAFETY: both offsets are inside the control mapping (checked above
        // against control_len, which covers header, region and page tables).
        let (regions, pages) = unsafe {
            (
                control.as_ptr().add(layout::REGION_TABLE_OFFSET) as *const RegionEntry,
                control.as_ptr().add(layout::PAGE_TABLE_OFFSET) as *const PageEntry,
            )
        };
        // SAFETY: the header lives as long as the control mapping, which `Self`
        // owns (the `Arc` in `_control`); the reference never escapes `Self`.
        let generation: &'static AtomicU64 = unsafe { &*(&h.generation as *const AtomicU64) };
        // SAFETY: as for `generation`: the header outlives every use through `Self`.
        let state: &'static AtomicU64 = unsafe { &*(&h.state as *const AtomicU64) };
        Ok(Self {
            layout,
            generation,
            state,
            _data: data,
            _control: control,
            data: data_ptr,
            regions,
            pages,
            page_shift: layout.page_shift as u32,
            page_mask: layout.page_size() - 1,
        })
    }

    /// The wake-up word of the node's RPC worker `worker` (in the control
    /// mapping: read-only here, which is all `FUTEX_WAKE` needs).
    ///
    /// # Panics
    /// If `worker` is not below `MAX_WORKER_BELLS` (channels are checked
    /// when they are opened).
    pub(crate) fn bell(&self, worker: usize) -> &std::sync::atomic::AtomicU32 {
        assert!(worker < layout::MAX_WORKER_BELLS);
        // SAFETY: the bells lie inside the control mapping's first 8 KiB
        // (layout.rs asserts it), which `Self` keeps mapped; the word is an
        // atomic, and this side only reads it.
        unsafe {
            &(*(self
                ._control
                .as_ptr()
                .add(layout::WORKER_BELLS_OFFSET + 64 * worker)
                as *const layout::WorkerBell))
                .sleeping
        }
    }

    /// The node's table generation: bumped by every region or page-table change.
    #[inline(always)]
    pub(crate) fn generation(&self) -> u64 {
        self.generation.load(Ordering::Acquire)
    }

    /// Whether the node has shut down.
    #[inline(always)]
    pub(crate) fn closed(&self) -> bool {
        self.state.load(Ordering::Acquire) == layout::NODE_CLOSED
    }

    pub(crate) fn layout(&self) -> NodeLayout {
        self.layout
    }

    /// The region named by `rkey`: `(access, base, end)`.
    #[inline]
    pub(crate) fn region(&self, rkey: Rkey) -> Result<(u64, u64, u64), VerbError> {
        let slot = (rkey & 0xFF) as usize;
        if slot >= MAX_REGIONS {
            return Err(VerbError::BadKey { rkey });
        }
        // SAFETY: slot < MAX_REGIONS, so the entry lies in the region table.
        let entry = unsafe { &*self.regions.add(slot) };
        match entry.snapshot() {
            Some((k, access, base, len)) if k == rkey => Ok((access, base, base + len)),
            _ => Err(VerbError::BadKey { rkey }),
        }
    }

    /// Pointer to the byte at remote `offset`; valid up to the end of its page.
    #[inline(always)]
    fn translate(&self, offset: u64) -> Result<*mut u8, VerbError> {
        let page = offset >> self.page_shift;
        if page >= self.layout.remote_pages {
            return Err(VerbError::PageNotMapped { page });
        }
        // SAFETY: page < remote_pages, so the entry lies in the page table.
        let phys = unsafe { &*self.pages.add(page as usize) }.get();
        match phys {
            Some(p) if p < self.layout.phys_pages => {
                // SAFETY: p < phys_pages, so the page lies in the data mapping.
                Ok(unsafe {
                    self.data
                        .add(((p << self.page_shift) | (offset & self.page_mask)) as usize)
                })
            }
            _ => Err(VerbError::PageNotMapped { page }),
        }
    }

    /// Asks the CPU to start loading the translation entry of remote
    /// `offset` (a hint: nothing is checked, nothing can fail). With the
    /// entry cached, a later [`NodeView::prefetch_data`] of the same offset
    /// does not stall on the table.
    #[inline(always)]
    pub(crate) fn prefetch_translation(&self, offset: u64) {
        let page = offset >> self.page_shift;
        if page < self.layout.remote_pages {
            // page < remote_pages: the entry lies in the page table.
            hint::line(self.pages.wrapping_add(page as usize) as *const u8);
        }
    }

    /// Asks the CPU to start loading the lines of `[offset, offset+len)`
    /// that lie in the page of `offset` (at most `MAX_PREFETCH_LINES`), if
    /// that page is mapped. A hint: errors are left to the copy.
    #[inline(always)]
    pub(crate) fn prefetch_data(&self, offset: u64, len: usize) {
        self.prefetch_lines(offset, len, MAX_PREFETCH_LINES, hint::line);
    }

    /// Asks the CPU to fetch the lines of `[offset, offset+len)` that lie in
    /// the page of `offset` (at most `MAX_PREFETCH_WRITE_LINES`) for
    /// writing, if that page is mapped. A hint: nothing can fail.
    #[inline(always)]
    pub(crate) fn prefetch_write(&self, offset: u64, len: usize) {
        self.prefetch_lines(offset, len, MAX_PREFETCH_WRITE_LINES, hint::line_for_write);
    }

    /// `hint` on each line of `[offset, offset+len)` inside the page of
    /// `offset`, at most `max` lines; nothing if the page is not mapped.
    #[inline(always)]
    fn prefetch_lines(&self, offset: u64, len: usize, max: usize, hint: impl Fn(*const u8)) {
        let Ok(p) = self.translate(offset) else {
            return;
        };
        let room = (self.page_mask + 1 - (offset & self.page_mask)) as usize;
        let end = p as usize + len.min(room);
        let mut line = p as usize & !63;
        let mut n = 0;
        while line < end && n < max {
            hint(line as *const u8);
            line += 64;
            n += 1;
        }
    }

    /// Calls `f(ptr, start, len)` for each page-contained piece of
    /// `[offset, offset+len)`, in ascending address order.
    #[inline]
    fn for_each_piece(
        &self,
        offset: u64,
        len: usize,
        mut f: impl FnMut(*mut u8, usize, usize),
    ) -> Result<(), VerbError> {
        let mut done = 0usize;
        while done < len {
            let off = offset + done as u64;
            let room = (self.page_mask + 1 - (off & self.page_mask)) as usize;
            let n = room.min(len - done);
            f(self.translate(off)?, done, n);
            done += n;
        }
        Ok(())
    }

    /// The copies of a vector request of `len` bytes: piece `i` of
    /// `pieces` (local pointer, length; their lengths sum to `len`) moves to
    /// (`write`) or from the remote bytes right after piece `i - 1`'s,
    /// starting at `offset`, every piece in ascending address order as
    /// [`NodeView::write_from`] and [`NodeView::read_to`] move it. Every
    /// page is checked before any byte moves. A request inside one page (a
    /// batch of 64-byte entries is 16 pieces in 1 KiB) is translated once
    /// and copied piece after piece; a longer one keeps the page of its
    /// remote cursor, so no page is translated once per piece.
    ///
    /// # Safety
    /// Each piece's `ptr..ptr+len` must be valid for reads (`write`) or
    /// writes (a registered local range). (That the pieces' lengths sum to
    /// `len` is checked: more bytes than `len` panic before they move, so
    /// no copy leaves the pages checked.)
    #[inline]
    pub(crate) unsafe fn copy_vector(
        &self,
        offset: u64,
        len: usize,
        pieces: impl Iterator<Item = (*mut u8, usize)>,
        write: bool,
    ) -> Result<(), VerbError> {
        let page_bytes = (self.page_mask + 1) as usize;
        let at = (offset & self.page_mask) as usize;
        let mut room = len;
        let mut take = |n: usize| {
            assert!(n <= room, "vector pieces exceed the request's {len} B");
            room -= n;
        };
        if len <= page_bytes - at {
            let mut dst = self.translate(offset)?;
            for (p, n) in pieces {
                take(n);
                // SAFETY: `dst..dst + n` lies in the page `translate`
                // mapped (the pieces so far and this one fit in `len`,
                // which fits in the page from `at`); `p..p + n` is the
                // caller's valid local range.
                if write {
                    copy_shared(dst, p, n);
                } else {
                    copy_shared(p, dst, n);
                }
                dst = dst.add(n);
            }
            return Ok(());
        }
        self.check_mapped(offset, len)?;
        let mut off = offset;
        // The page translated last: its remote offset and its pointer.
        let mut page: Option<(u64, *mut u8)> = None;
        for (p, len) in pieces {
            take(len);
            let mut done = 0;
            while done < len {
                let base = off & !self.page_mask;
                let mapped = match page {
                    Some((b, m)) if b == base => m,
                    _ => {
                        let m = self.translate(base)?;
                        page = Some((base, m));
                        m
                    }
                };
                let at = (off - base) as usize;
                let n = (page_bytes - at).min(len - done);
                if write {
                    copy_shared(mapped.add(at), p.add(done), n);
                } else {
                    copy_shared(p.add(done), mapped.add(at), n);
                }
                done += n;
                off += n as u64;
            }
        }
        Ok(())
    }

    /// Whether every page of `[offset, offset+len)` is mapped.
    pub(crate) fn check_mapped(&self, offset: u64, len: usize) -> Result<(), VerbError> {
        self.for_each_piece(offset, len, |_, _, _| {})
    }

    /// READ: copies `len` remote bytes at `offset` to local memory at `dst`,
    /// word by word in ascending order.
    ///
    /// # Safety
    /// `dst..dst+len` must be valid for writes (a registered local range).
    #[inline(always)]
    pub(crate) unsafe fn read_to(
        &self,
        offset: u64,
        dst: *mut u8,
        len: usize,
    ) -> Result<(), VerbError> {
        if len == 8 && (offset | dst as u64).is_multiple_of(8) {
            // The common 8-byte word: one translation, one load, one store.
            let v = self.word(offset)?.load(Ordering::Acquire);
            (*(dst as *const AtomicU64)).store(v, Ordering::Release);
            return Ok(());
        }
        self.for_each_piece(offset, len, |p, at, n| copy_shared(dst.add(at), p, n))
    }

    /// WRITE: copies `len` bytes of local memory at `src` to remote `offset`,
    /// word by word in ascending address order.
    ///
    /// # Safety
    /// `src..src+len` must be valid for reads (a registered local range).
    #[inline(always)]
    pub(crate) unsafe fn write_from(
        &self,
        offset: u64,
        src: *const u8,
        len: usize,
    ) -> Result<(), VerbError> {
        if len == 8 && (offset | src as u64).is_multiple_of(8) {
            let v = (*(src as *const AtomicU64)).load(Ordering::Acquire);
            self.word(offset)?.store(v, Ordering::Release);
            return Ok(());
        }
        self.for_each_piece(offset, len, |p, at, n| copy_shared(p, src.add(at), n))
    }

    /// The 8-byte word at an aligned `offset`.
    #[inline(always)]
    pub(crate) fn word(&self, offset: u64) -> Result<&AtomicU64, VerbError> {
        debug_assert_eq!(offset % 8, 0);
        let p = self.translate(offset)?;
        // SAFETY: offset is 8-byte aligned and pages are page aligned inside a
        // page-aligned mapping, so p is 8-byte aligned and the word lies in one
        // page of the data mapping; it lives as long as self.
        Ok(unsafe { &*(p as *const AtomicU64) })
    }
}

/// Most cache lines one request prefetches (a longer READ streams; the
/// hardware prefetcher follows it).
const MAX_PREFETCH_LINES: usize = 8;

/// Most cache lines [`NodeView::prefetch_write`] hints (1 KiB: a batch of
/// 16 64-byte entries).
const MAX_PREFETCH_WRITE_LINES: usize = 16;
