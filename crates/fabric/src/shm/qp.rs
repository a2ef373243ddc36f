//! The shm queue pair: executes verbs with the posting thread's own CPU,
//! straight on the mapped memory (truly one-sided: the node's CPU never sees
//! them), and queues completions — delayed by the latency model if set.

use std::collections::VecDeque;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use dmkit_memnode::layout::access;

use super::view::NodeView;
use crate::addr::NodeId;
use crate::caps::Capabilities;
use crate::error::{PostError, RequestError, VerbError};
use crate::local::{Lkey, LocalMem};
use crate::wr::{Batch, Completion, LocalRef, Op, WorkRequest};
use crate::{QpStats, QueuePair};

/// A queue pair of the shm backend.
pub struct ShmQp {
    node: NodeId,
    view: Arc<NodeView>,
    caps: Capabilities,
    rtt: Option<Duration>,
    /// Completions not yet polled, in posting order.
    cq: Vec<Completion>,
    /// Local memory registered on this queue pair; the lkey is the index.
    locals: Vec<LocalSlot>,
    /// Last protection-table lookup `(rkey, access, base, end)`, valid while
    /// the node's table generation equals `cached_gen` (an MPT cache: a
    /// deregistration takes effect from the next post on).
    region_cache: Option<(u32, u64, u64, u64)>,
    cached_gen: u64,
    /// With the latency model: (instant visible, completions of that post).
    ready: VecDeque<(Instant, usize)>,
    stats: QpStats,
}

impl ShmQp {
    pub(crate) fn new(
        node: NodeId,
        view: Arc<NodeView>,
        caps: Capabilities,
        rtt: Option<Duration>,
    ) -> Self {
        Self {
            node,
            view,
            caps,
            rtt,
            cq: Vec::with_capacity(caps.max_batch),
            ready: VecDeque::new(),
            locals: Vec::new(),
            region_cache: None,
            cached_gen: u64::MAX,
            stats: QpStats::default(),
        }
    }

    /// Checks a request against node, length, region key, access, bounds and
    /// alignment, then executes it. Returns the old value (atomics) or bytes moved.
    #[inline]
    fn execute_one(&mut self, wr: &WorkRequest, sges: &[LocalRef]) -> Result<u64, VerbError> {
        let remote = wr.remote;
        if remote.node() != self.node {
            return Err(VerbError::WrongNode {
                expected: self.node,
                got: remote.node(),
            });
        }
        let len = wr.len();
        if len == 0 {
            return Err(VerbError::ZeroLength);
        }
        if len > self.caps.max_message {
            return Err(VerbError::TooLong {
                len,
                max: self.caps.max_message,
            });
        }
        if let Op::Write { inline: true, .. } = wr.op {
            if len > self.caps.max_inline {
                return Err(VerbError::InlineTooLarge {
                    len,
                    max: self.caps.max_inline,
                });
            }
        }
        let (rights, base, end) = match self.region_cache {
            Some((k, a, b, e)) if k == wr.rkey => (a, b, e),
            _ => {
                let (a, b, e) = self.view.region(wr.rkey)?;
                self.region_cache = Some((wr.rkey, a, b, e));
                (a, b, e)
            }
        };
        let (needed, name) = match wr.op {
            Op::Read { .. } => (access::READ, "READ"),
            Op::Write { .. } | Op::WriteV { .. } => (access::WRITE, "WRITE"),
            Op::ReadV { .. } => (access::READ, "READ"),
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
        let s = &mut self.stats;
        match wr.op {
            Op::Read { local } => {
                let dst = local_ptr(&self.locals, local)?;
                // SAFETY: dst..dst+len lies in a LocalMem this queue pair keeps alive.
                unsafe { self.view.read_to(off, dst, len)? };
                s.reads += 1;
                s.bytes_read += len as u64;
                Ok(len as u64)
            }
            Op::Write { local, .. } => {
                let src = local_ptr(&self.locals, local)?;
                // SAFETY: src..src+len lies in a LocalMem this queue pair keeps alive.
                unsafe { self.view.write_from(off, src, len)? };
                s.writes += 1;
                s.bytes_written += len as u64;
                Ok(len as u64)
            }
            Op::ReadV { sgl } | Op::WriteV { sgl } => {
                let write = matches!(wr.op, Op::WriteV { .. });
                execute_vector(
                    &self.view,
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
                if !off.is_multiple_of(8) {
                    return Err(VerbError::Unaligned { offset: off });
                }
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

/// The vector (scatter/gather) path, kept out of line so the scalar path of
/// `execute_one` stays small (inlining it cost ~20 % of the 8-byte READ rate).
#[inline(never)]
fn execute_vector(
    view: &NodeView,
    locals: &[LocalSlot],
    max_sge: usize,
    off: u64,
    sgl: crate::wr::Sgl,
    sges: &[LocalRef],
    write: bool,
) -> Result<(), VerbError> {
    let pieces = sgl_entries(sges, sgl, max_sge)?;
    // Resolve every piece first: a bad entry fails the request before any
    // byte moves.
    let mut ptrs = [std::ptr::null_mut::<u8>(); MAX_SGE];
    for (p, l) in ptrs.iter_mut().zip(pieces) {
        *p = local_ptr(locals, *l)?;
    }
    let mut at = off;
    for (p, l) in ptrs.iter().zip(pieces) {
        // SAFETY: each pointer was resolved against a LocalMem the queue pair
        // keeps alive, for exactly `l.len` bytes.
        unsafe {
            if write {
                view.write_from(at, *p, l.len as usize)?;
            } else {
                view.read_to(at, *p, l.len as usize)?;
            }
        }
        at += l.len as u64;
    }
    Ok(())
}

/// Most scatter/gather entries the shm backend accepts per request.
pub const MAX_SGE: usize = 16;

/// The entries of `sgl` in its batch, checked against the table and limit.
fn sgl_entries(
    sges: &[LocalRef],
    sgl: crate::wr::Sgl,
    max: usize,
) -> Result<&[LocalRef], VerbError> {
    let bad = VerbError::BadSgl {
        first: sgl.first,
        count: sgl.count,
        max,
    };
    let (a, n) = (sgl.first as usize, sgl.count as usize);
    if n == 0 || n > max.min(MAX_SGE) {
        return Err(bad);
    }
    let pieces = sges.get(a..a + n).ok_or(bad)?;
    let total: u64 = pieces.iter().map(|p| p.len as u64).sum();
    if total != sgl.len as u64 {
        return Err(VerbError::BadSgl {
            first: sgl.first,
            count: sgl.count,
            max,
        });
    }
    Ok(pieces)
}

/// A registered local region, flattened so a lookup is one indexed load.
struct LocalSlot {
    base: *mut u8,
    len: u64,
    mem: LocalMem,
}

// SAFETY: `base` points into `mem`, which the slot keeps alive; LocalMem is
// Send + Sync and all accesses through `base` are atomic.
unsafe impl Send for LocalSlot {}

/// Resolves a local range to a pointer, checking key and bounds.
#[inline(always)]
fn local_ptr(locals: &[LocalSlot], l: LocalRef) -> Result<*mut u8, VerbError> {
    let slot = locals
        .get(l.lkey as usize)
        .ok_or(VerbError::BadLkey(l.lkey))?;
    match l.offset.checked_add(l.len as u64) {
        // SAFETY: offset + len ≤ slot.len, so the pointer stays inside `mem`.
        Some(end) if end <= slot.len => Ok(unsafe { slot.base.add(l.offset as usize) }),
        _ => Err(VerbError::LocalOutOfBounds {
            lkey: l.lkey,
            offset: l.offset,
            len: l.len,
        }),
    }
}

impl QueuePair for ShmQp {
    fn node(&self) -> NodeId {
        self.node
    }

    fn caps(&self) -> Capabilities {
        self.caps
    }

    fn register_local(&mut self, mem: &LocalMem) -> Lkey {
        if let Some(i) = self.locals.iter().position(|s| s.mem.same(mem)) {
            return i as Lkey;
        }
        let base = mem.range_ptr(0, 0).expect("offset 0 is inside any region");
        self.locals.push(LocalSlot {
            base,
            len: mem.len() as u64,
            mem: mem.clone(),
        });
        (self.locals.len() - 1) as Lkey
    }

    #[inline]
    fn post(&mut self, batch: &mut Batch) -> Result<(), PostError> {
        if batch.len() > self.caps.max_batch {
            return Err(PostError::BatchTooLarge {
                len: batch.len(),
                max: self.caps.max_batch,
            });
        }
        if batch.is_empty() {
            return Ok(());
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
        let before = self.cq.len();
        let mut failed = false;
        for (index, wr) in batch.wrs.iter().enumerate() {
            let result = if failed {
                Err(VerbError::Flushed)
            } else {
                let r = self.execute_one(wr, &batch.sges);
                if r.is_err() {
                    failed = true;
                    self.stats.errors += 1;
                }
                r
            };
            if wr.signaled || result.is_err() {
                let result = result.map_err(|error| {
                    Box::new(RequestError {
                        index,
                        wr_id: wr.wr_id,
                        kind: wr.kind(),
                        remote: wr.remote,
                        error,
                    })
                });
                let wr_id = wr.wr_id;
                self.cq.reserve(1);
                let at = self.cq.len();
                self.cq.spare_capacity_mut()[0].write(Completion { wr_id, result });
                // SAFETY: reserve(1) made room and the slot at `at` was just written
                // (built in place: a stack temporary would cost a stall per request).
                unsafe { self.cq.set_len(at + 1) };
            }
        }
        batch.clear();
        if let Some(rtt) = self.rtt {
            let n = self.cq.len() - before;
            if n > 0 {
                self.ready.push_back((Instant::now() + rtt, n));
            }
        }
        Ok(())
    }

    #[inline]
    fn poll(&mut self, out: &mut Vec<Completion>, max: usize) -> usize {
        let visible = if self.rtt.is_none() {
            self.cq.len()
        } else {
            // Completions become visible a round trip after their post.
            let now = Instant::now();
            let mut v = 0;
            for &(t, n) in &self.ready {
                if t > now {
                    break;
                }
                v += n;
            }
            v
        };
        let n = visible.min(max);
        if n == 0 {
            return 0;
        }
        if n == self.cq.len() && out.is_empty() {
            // Common case: hand the whole queue over without copying.
            std::mem::swap(out, &mut self.cq);
        } else {
            out.extend(self.cq.drain(..n));
        }
        let mut left = n;
        while self.rtt.is_some() && left > 0 {
            let front = self.ready.front_mut().expect("ready covers the queue");
            let take = front.1.min(left);
            front.1 -= take;
            left -= take;
            if front.1 == 0 {
                self.ready.pop_front();
            }
        }
        n
    }

    fn pending(&self) -> usize {
        self.cq.len()
    }

    fn stats(&self) -> QpStats {
        self.stats
    }
}
