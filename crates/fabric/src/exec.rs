//! [`Executor`]: checks one work request against a memory node's protection
//! and translation tables and performs it on the node's memory — the part of
//! an RNIC's responder that every memory-backed backend shares.
//!
//! The `shm` backend executes at post time on the caller's CPU; the
//! simulator executes each request at its simulated execution instant
//! (possibly in pieces, to inject torn transfers). Both go through this
//! type, so they enforce the same checks with the same typed errors and the
//! same memory semantics: aligned words single-copy atomic, WRITE words in
//! ascending address order, CAS/FAA/masked CAS as hardware atomics.

use std::sync::atomic::Ordering;
use std::sync::Arc;

use dmkit_memnode::layout::access;

use crate::addr::NodeId;
use crate::caps::Capabilities;
use crate::error::{PostError, VerbError};
use crate::local::{Lkey, LocalMem};
use crate::shm::view::NodeView;
use crate::wr::{LocalRef, Op, Sgl, WorkRequest};
use crate::QpStats;

/// Most scatter/gather entries any memory-backed backend accepts per request.
pub const MAX_SGE: usize = 16;

/// A registered local region, flattened so a lookup is one indexed load.
struct LocalSlot {
    base: *mut u8,
    len: u64,
    mem: LocalMem,
}

// SAFETY: `base` points into `mem`, which the slot keeps alive; LocalMem is
// Send + Sync and all accesses through `base` are atomic.
unsafe impl Send for LocalSlot {}

/// Base and length of lkey 0, kept inside the executor: a worker registers
/// one local region per connection, and reaching it through `locals`' heap
/// buffer cost a cache miss per request when thousands of connections take
/// turns (perf of `dmkit sim speed`).
#[derive(Clone, Copy)]
struct FirstLocal {
    base: *mut u8,
    len: u64,
}

// SAFETY: a copy of `locals[0]`'s base and length; `locals[0]` keeps the
// memory alive as long as the executor lives (slots are never removed).
unsafe impl Send for FirstLocal {}

/// The checks and the memory access of one connection to one memory node:
/// its registered local memory (lkeys), a one-entry protection-table cache
/// and counters.
pub struct Executor {
    node: NodeId,
    view: Arc<NodeView>,
    caps: Capabilities,
    /// Local memory registered on this connection; the lkey is the index.
    locals: Vec<LocalSlot>,
    first: Option<FirstLocal>,
    /// Last protection-table lookup `(rkey, access, base, end)`, valid while
    /// the node's table generation equals `cached_gen` (an MPT cache: a
    /// deregistration takes effect from the next post on).
    region_cache: Option<(u32, u64, u64, u64)>,
    cached_gen: u64,
    stats: QpStats,
}

impl Executor {
    pub(crate) fn new(node: NodeId, view: Arc<NodeView>, caps: Capabilities) -> Self {
        Self {
            node,
            view,
            caps,
            locals: Vec::new(),
            first: None,
            region_cache: None,
            cached_gen: u64::MAX,
            stats: QpStats::default(),
        }
    }

    /// The memory node.
    pub fn node(&self) -> NodeId {
        self.node
    }

    /// The capabilities requests are checked against.
    pub fn caps(&self) -> Capabilities {
        self.caps
    }

    /// Checks requests against `caps` instead (a backend that declares
    /// other limits than the shm defaults, e.g. a simulated device).
    pub fn with_caps(mut self, caps: Capabilities) -> Self {
        self.caps = caps;
        self
    }

    /// Registers local memory; registering the same memory again returns
    /// the same key.
    pub fn register_local(&mut self, mem: &LocalMem) -> Lkey {
        if let Some(i) = self.locals.iter().position(|s| s.mem.same(mem)) {
            return i as Lkey;
        }
        let base = mem.range_ptr(0, 0).expect("offset 0 is inside any region");
        let len = mem.len() as u64;
        if self.locals.is_empty() {
            self.first = Some(FirstLocal { base, len });
        }
        self.locals.push(LocalSlot {
            base,
            len,
            mem: mem.clone(),
        });
        (self.locals.len() - 1) as Lkey
    }

    /// The first 8 bytes of the registered local range `l` (the payload of
    /// an 8-byte WRITE, as a switch model reads it); `None` if `l` is
    /// shorter or not registered here.
    pub fn local_word(&self, l: LocalRef) -> Option<u64> {
        let slot = self.locals.get(l.lkey as usize)?;
        let end = l.offset.checked_add(8)?;
        if l.len < 8 || end > slot.len || !l.offset.is_multiple_of(8) {
            return None;
        }
        Some(slot.mem.load_u64(l.offset as usize))
    }

    /// Starts a post of `len` requests: the batch limit, whether the node
    /// is still serving, and a refresh of the protection cache if the node's
    /// tables changed. Counts one doorbell.
    #[inline]
    pub fn begin_post(&mut self, len: usize) -> Result<(), PostError> {
        if len > self.caps.max_batch {
            return Err(PostError::BatchTooLarge {
                len,
                max: self.caps.max_batch,
            });
        }
        if self.view.closed() {
            return Err(PostError::Disconnected(self.node));
        }
        self.stats.doorbells += 1;
        let generation = self.view.generation();
        if generation != self.cached_gen {
            self.region_cache = None;
            self.cached_gen = generation;
        }
        Ok(())
    }

    /// Counts a request that failed (the backend reports it).
    #[inline]
    pub fn note_error(&mut self) {
        self.stats.errors += 1;
    }

    /// Counters since creation.
    pub fn stats(&self) -> QpStats {
        self.stats
    }

    /// Checks node, length, inline size, region key, access rights and
    /// bounds; returns the remote offset. Nothing is touched.
    #[inline]
    fn check_remote(&mut self, wr: &WorkRequest) -> Result<u64, VerbError> {
        let (view, cache) = (&self.view, &mut self.region_cache);
        check_remote(self.node, &self.caps, wr, |rkey| match *cache {
            Some((k, a, b, e)) if k == rkey => Ok((a, b, e)),
            _ => {
                let (a, b, e) = view.region(rkey)?;
                *cache = Some((rkey, a, b, e));
                Ok((a, b, e))
            }
        })
    }

    /// Every check [`Executor::execute`] makes, without any effect: the
    /// remote side, the local range, scatter/gather entries, and that the
    /// remote pages are mapped.
    pub fn check(&mut self, wr: &WorkRequest, sges: &[LocalRef]) -> Result<(), VerbError> {
        let off = self.check_remote(wr)?;
        match wr.op {
            Op::Read { local } | Op::Write { local, .. } => {
                local_ptr(&self.locals, local)?;
            }
            Op::ReadV { sgl } | Op::WriteV { sgl } => {
                for l in sgl_entries(sges, sgl, self.caps.max_sge)? {
                    local_ptr(&self.locals, *l)?;
                }
            }
            _ => {}
        }
        self.view.check_mapped(off, wr.len())
    }

    /// Every check of a scalar READ that [`Executor::execute`] makes before
    /// it touches memory — remote side and local range — with nothing
    /// touched: `(remote offset, destination, length)` for
    /// [`Executor::finish_read`]. Page translation is left to the copy.
    ///
    /// # Panics
    /// If `wr` is not a scalar READ (programmer error).
    #[inline]
    pub(crate) fn prepare_read(
        &mut self,
        wr: &WorkRequest,
    ) -> Result<(u64, *mut u8, usize), VerbError> {
        let Op::Read { local } = wr.op else {
            panic!("prepare_read of a {:?}", wr.kind());
        };
        let off = self.check_remote(wr)?;
        let dst = local_ptr_first(self.first, &self.locals, local)?;
        Ok((off, dst, wr.len()))
    }

    /// Performs a READ [`Executor::prepare_read`] checked: translates and
    /// copies. Returns the bytes moved, as [`Executor::execute`] does.
    ///
    /// # Safety
    /// `dst..dst+len` must be what `prepare_read` returned on this executor
    /// (a range of local memory it keeps alive).
    #[inline]
    pub(crate) unsafe fn finish_read(
        &mut self,
        off: u64,
        dst: *mut u8,
        len: usize,
    ) -> Result<u64, VerbError> {
        // SAFETY: the caller's promise.
        unsafe { self.view.read_to(off, dst, len)? };
        self.stats.reads += 1;
        self.stats.bytes_read += len as u64;
        Ok(len as u64)
    }

    /// Hints the CPU to load the translation entry of remote `off`.
    #[inline(always)]
    pub(crate) fn prefetch_translation(&self, off: u64) {
        self.view.prefetch_translation(off);
    }

    /// Hints the CPU to fetch the first lines of `[off, off+len)` for
    /// writing (see [`crate::shm::ShmConfig::write_prefetch`]).
    #[inline(always)]
    pub(crate) fn prefetch_write(&self, off: u64, len: usize) {
        self.view.prefetch_write(off, len);
    }

    /// Hints the CPU to load the first lines of `[off, off+len)`.
    #[inline(always)]
    pub(crate) fn prefetch_data(&self, off: u64, len: usize) {
        self.view.prefetch_data(off, len);
    }

    /// Checks a request and performs it. Returns the old value (atomics) or
    /// the bytes moved.
    #[inline]
    pub fn execute(&mut self, wr: &WorkRequest, sges: &[LocalRef]) -> Result<u64, VerbError> {
        let off = self.check_remote(wr)?;
        let len = wr.len();
        let s = &mut self.stats;
        match wr.op {
            Op::Read { local } => {
                let dst = local_ptr_first(self.first, &self.locals, local)?;
                // SAFETY: dst..dst+len lies in a LocalMem this executor keeps alive.
                unsafe { self.view.read_to(off, dst, len)? };
                s.reads += 1;
                s.bytes_read += len as u64;
                Ok(len as u64)
            }
            Op::Write { local, .. } => {
                let src = local_ptr_first(self.first, &self.locals, local)?;
                // SAFETY: src..src+len lies in a LocalMem this executor keeps alive.
                unsafe { self.view.write_from(off, src, len)? };
                s.writes += 1;
                s.bytes_written += len as u64;
                Ok(len as u64)
            }
            Op::ReadV { sgl } | Op::WriteV { sgl } => {
                let write = matches!(wr.op, Op::WriteV { .. });
                execute_vector(
                    &self.view,
                    self.first,
                    &self.locals,
                    self.caps.max_sge,
                    off,
                    sgl,
                    sges,
                    write,
                )?;
                let s = &mut self.stats;
                if write {
                    s.writes += 1;
                    s.bytes_written += len as u64;
                } else {
                    s.reads += 1;
                    s.bytes_read += len as u64;
                }
                Ok(len as u64)
            }
            op => {
                let w = self.view.word(off)?;
                let old = match op {
                    Op::Cas { expected, desired } => {
                        s.cas += 1;
                        match w.compare_exchange(
                            expected,
                            desired,
                            Ordering::AcqRel,
                            Ordering::Acquire,
                        ) {
                            Ok(v) | Err(v) => v,
                        }
                    }
                    Op::MaskedCas {
                        compare,
                        compare_mask,
                        swap,
                        swap_mask,
                    } => {
                        s.masked_cas += 1;
                        let r = w.fetch_update(Ordering::AcqRel, Ordering::Acquire, |old| {
                            (old & compare_mask == compare & compare_mask)
                                .then_some((old & !swap_mask) | (swap & swap_mask))
                        });
                        match r {
                            Ok(v) | Err(v) => v,
                        }
                    }
                    Op::Faa { add } => {
                        s.faa += 1;
                        w.fetch_add(add, Ordering::AcqRel)
                    }
                    Op::Read { .. } | Op::Write { .. } | Op::ReadV { .. } | Op::WriteV { .. } => {
                        unreachable!("handled above")
                    }
                };
                Ok(old)
            }
        }
    }
}

/// The remote-side checks every backend makes before a request touches
/// anything, with the same typed errors: node, length, message and inline
/// limits, the region named by the key (`region` answers `(access, base,
/// end)` or the key's error), access rights, bounds, masked-CAS support and
/// atomic alignment. Returns the remote offset. The shm and sim backends
/// check against the node's protection table; the verbs backend against the
/// client's copy of it, before the NIC sees the request.
#[inline(always)]
pub fn check_remote(
    node: NodeId,
    caps: &Capabilities,
    wr: &WorkRequest,
    region: impl FnOnce(crate::Rkey) -> Result<(u64, u64, u64), VerbError>,
) -> Result<u64, VerbError> {
    let remote = wr.remote;
    if remote.node() != node {
        return Err(VerbError::WrongNode {
            expected: node,
            got: remote.node(),
        });
    }
    let len = wr.len();
    if len == 0 {
        return Err(VerbError::ZeroLength);
    }
    if len > caps.max_message {
        return Err(VerbError::TooLong {
            len,
            max: caps.max_message,
        });
    }
    if let Op::Write { inline: true, .. } = wr.op {
        if len > caps.max_inline {
            return Err(VerbError::InlineTooLarge {
                len,
                max: caps.max_inline,
            });
        }
    }
    let (rights, base, end) = region(wr.rkey)?;
    let (needed, name) = match wr.op {
        Op::Read { .. } | Op::ReadV { .. } => (access::READ, "READ"),
        Op::Write { .. } | Op::WriteV { .. } => (access::WRITE, "WRITE"),
        _ => (access::ATOMIC, "atomics"),
    };
    if rights & needed == 0 {
        return Err(VerbError::AccessDenied {
            rkey: wr.rkey,
            needed: name,
        });
    }
    let off = remote.offset();
    if off < base || off >= end {
        return Err(VerbError::OutOfBounds {
            offset: off,
            base,
            end,
        });
    }
    if end - off < len as u64 {
        return Err(VerbError::CrossesRegionEnd {
            offset: off,
            len: len as u64,
            end,
        });
    }
    if matches!(wr.op, Op::MaskedCas { .. }) && !caps.masked_cas {
        return Err(VerbError::Unsupported("masked compare-and-swap"));
    }
    if wr.kind().is_atomic() && !off.is_multiple_of(8) {
        return Err(VerbError::Unaligned { offset: off });
    }
    Ok(off)
}

/// The vector (scatter/gather) path, kept out of line so the scalar path of
/// `execute` stays small (inlining it cost ~20 % of the 8-byte READ rate).
#[inline(never)]
#[allow(clippy::too_many_arguments)]
fn execute_vector(
    view: &NodeView,
    first: Option<FirstLocal>,
    locals: &[LocalSlot],
    max_sge: usize,
    off: u64,
    sgl: Sgl,
    sges: &[LocalRef],
    write: bool,
) -> Result<(), VerbError> {
    let pieces = sgl_entries(sges, sgl, max_sge)?;
    // Resolve every piece first: a bad entry fails the request before any
    // byte moves. A list of entries in one registered buffer (the common
    // case: lkey 0, the worker's own memory) never looks up the table.
    let mut ptrs = [std::ptr::null_mut::<u8>(); MAX_SGE];
    for (p, l) in ptrs.iter_mut().zip(pieces) {
        *p = local_ptr_first(first, locals, *l)?;
    }
    let list = ptrs.iter().zip(pieces).map(|(p, l)| (*p, l.len as usize));
    // SAFETY: each pointer was resolved against a LocalMem the executor
    // keeps alive, for exactly `l.len` bytes (and `sgl_entries` checked
    // that the lengths sum to `sgl.len`).
    unsafe { view.copy_vector(off, sgl.len as usize, list, write) }
}

/// The entries of `sgl` in its batch, checked against the table and limit
/// (shared by every backend, so a bad list fails the same way everywhere).
pub fn sgl_entries(sges: &[LocalRef], sgl: Sgl, max: usize) -> Result<&[LocalRef], VerbError> {
    let bad = VerbError::BadSgl {
        first: sgl.first,
        count: sgl.count,
        max,
    };
    let (a, n) = (sgl.first as usize, sgl.count as usize);
    if n == 0 || n > max.min(MAX_SGE) {
        return Err(bad);
    }
    let pieces = sges.get(a..a + n).ok_or(bad.clone())?;
    let total: u64 = pieces.iter().map(|p| p.len as u64).sum();
    if total != sgl.len as u64 {
        return Err(bad);
    }
    Ok(pieces)
}

/// [`local_ptr`], with lkey 0 resolved from the executor's own copy.
#[inline(always)]
fn local_ptr_first(
    first: Option<FirstLocal>,
    locals: &[LocalSlot],
    l: LocalRef,
) -> Result<*mut u8, VerbError> {
    match first {
        // SAFETY: `f` is a copy of `locals[0]`'s base and length.
        Some(f) if l.lkey == 0 => unsafe { in_region(f.base, f.len, l) },
        _ => local_ptr(locals, l),
    }
}

/// Resolves a local range to a pointer, checking key and bounds.
#[inline(always)]
fn local_ptr(locals: &[LocalSlot], l: LocalRef) -> Result<*mut u8, VerbError> {
    let slot = locals
        .get(l.lkey as usize)
        .ok_or(VerbError::BadLkey(l.lkey))?;
    // SAFETY: a slot's base and length describe its `mem`, which it keeps alive.
    unsafe { in_region(slot.base, slot.len, l) }
}

/// `l`'s range inside the registered region of `len` bytes at `base`.
///
/// # Safety
/// `base..base + len` must be one live allocation.
#[inline(always)]
unsafe fn in_region(base: *mut u8, len: u64, l: LocalRef) -> Result<*mut u8, VerbError> {
    match l.offset.checked_add(l.len as u64) {
        // SAFETY: offset + len ≤ len, so the pointer stays inside the
        // allocation (the caller's promise).
        Some(end) if end <= len => Ok(unsafe { base.add(l.offset as usize) }),
        _ => Err(VerbError::LocalOutOfBounds {
            lkey: l.lkey,
            offset: l.offset,
            len: l.len,
        }),
    }
}
