//! The task-side API, shaped like SMART's (§5.1): queue `read`/`write`/`cas`/
//! `faa` into the task's buffer, `post()` them, `sync().await` for their
//! completion, `backoff_cas().await`, plus operation scopes and sleeps.
//!
//! Each task owns a slice of the worker's registered local memory
//! ([`Ctx::local_len`] bytes); READ lands there and WRITE is sourced there,
//! named by the [`Local`] ranges a data structure declared in its
//! [`crate::LocalLayout`]. Remote memory is named by a
//! [`RemoteRef`] (address and region key together).

use std::future::Future;
use std::pin::Pin;
use std::rc::Rc;
use std::task::{Context, Poll};

use dmkit_fabric::{FabricError, Lkey, LocalRef, NodeId, Op, RemoteRef, WorkRequest};

use crate::clock::Nanos;
use crate::local::Local;
use crate::stats::Counters;
use crate::worker::{wr_id, Core, State, MAX_TICKETS};

/// Ticket bit: the ticket of a READ/WRITE, carrying its length.
const LEN_TICKET: usize = 1 << (usize::BITS - 2);
/// Ticket field of requests that have no result slot.
const NO_SLOT: usize = MAX_TICKETS - 1;
/// Pieces of a vector request built on the stack (a longer list, which no
/// device takes, is built on the heap).
const INLINE_SGES: usize = 32;

/// A queued request's handle; after `sync`, [`Ctx::value`] gives its result
/// (old value for atomics, bytes moved for READ/WRITE).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Ticket(usize);

/// A task's handle on its worker. Cheap to clone; not `Send`.
#[derive(Clone)]
pub struct Ctx {
    core: Rc<Core>,
    task: usize,
    /// Bytes of local memory per task (`core.task_bytes`, kept here: read
    /// on every queued request).
    task_bytes: usize,
    /// Where the task's slice starts in the worker's local memory.
    local_base: usize,
}

impl Ctx {
    pub(crate) fn new(core: Rc<Core>, task: usize) -> Self {
        let task_bytes = core.task_bytes;
        Self {
            core,
            task,
            task_bytes,
            local_base: task * task_bytes,
        }
    }

    /// The worker's shared state.
    pub(crate) fn core(&self) -> &Rc<Core> {
        &self.core
    }

    /// This task's index on its worker.
    pub fn task(&self) -> usize {
        self.task
    }

    /// The worker's clock.
    pub fn now(&self) -> Nanos {
        self.core.clock.now()
    }

    /// Bytes of local memory this task owns.
    pub fn local_len(&self) -> usize {
        self.task_bytes
    }

    #[inline(always)]
    fn local_base(&self) -> usize {
        self.local_base
    }

    #[inline(always)]
    fn check_local(&self, off: usize, len: usize) {
        if off.checked_add(len).is_none_or(|e| e > self.task_bytes) {
            self.local_out_of_range(off, len);
        }
    }

    #[cold]
    #[inline(never)]
    fn local_out_of_range(&self, off: usize, len: usize) -> ! {
        panic!(
            "task-local range [{off}, +{len}) exceeds the task's {} B",
            self.task_bytes
        );
    }

    /// Copies `data` into the start of the task-local range `dst`.
    ///
    /// # Panics
    /// If `data` is longer than `dst` or `dst` lies outside the task's
    /// memory (programmer error).
    #[inline]
    pub fn put_local(&self, dst: Local, data: &[u8]) {
        let dst = dst.prefix(data.len());
        self.check_local(dst.offset(), dst.len());
        self.core
            .local
            .write(self.local_base() + dst.offset(), data);
    }

    /// Copies the start of the task-local range `src` into `out`.
    ///
    /// # Panics
    /// If `out` is longer than `src` or `src` lies outside the task's memory.
    pub fn get_local(&self, src: Local, out: &mut [u8]) {
        let src = src.prefix(out.len());
        self.check_local(src.offset(), src.len());
        self.core.local.read(self.local_base() + src.offset(), out);
    }

    /// Copies the task-local range `src` into the start of `dst` (they must
    /// not overlap), without a buffer between.
    ///
    /// # Panics
    /// If `dst` is shorter than `src`, a range lies outside the task's
    /// memory, or the two overlap.
    pub fn copy_local(&self, dst: Local, src: Local) {
        let dst = dst.prefix(src.len());
        self.check_local(src.offset(), src.len());
        self.check_local(dst.offset(), dst.len());
        let base = self.local_base();
        self.core
            .local
            .copy_within(base + src.offset(), base + dst.offset(), src.len());
    }

    /// The bytes of the task-local range `src`.
    pub fn local_vec(&self, src: Local) -> Vec<u8> {
        let mut v = vec![0; src.len()];
        self.get_local(src, &mut v);
        v
    }

    /// The native-endian `u64` at the start of `src` (8-byte aligned).
    #[inline]
    pub fn local_u64(&self, src: Local) -> u64 {
        let w = src.prefix(8);
        self.check_local(w.offset(), 8);
        self.core.local.load_u64(self.local_base() + w.offset())
    }

    /// Starts loading the cache line at the start of the task-local `at`
    /// (a hint, like the CPU's prefetch instruction: nothing is read,
    /// nothing waits, and a range outside the task's memory is no error).
    #[inline(always)]
    pub fn prefetch_local(&self, at: Local) {
        if at.offset() < self.local_len() {
            self.core.local.prefetch(self.local_base() + at.offset());
        }
    }

    /// Stores a native-endian `u64` at the start of `dst` (8-byte aligned).
    #[inline]
    pub fn set_local_u64(&self, dst: Local, v: u64) {
        let w = dst.prefix(8);
        self.check_local(w.offset(), 8);
        self.core.local.store_u64(self.local_base() + w.offset(), v)
    }

    /// The task-local range `src` decoded as a `T` — a remote layout type
    /// (`#[repr(C)]`, little-endian words) read by the verbs before.
    ///
    /// # Panics
    /// If `src` is shorter than a `T` (programmer error).
    #[inline]
    pub fn get_as<T: zerocopy::FromBytes + zerocopy::IntoBytes>(&self, src: Local) -> T {
        let mut v = T::new_zeroed();
        self.get_local(src, v.as_mut_bytes());
        v
    }

    /// Encodes `v` (a remote layout type) at the start of the task-local
    /// range `dst`, for a WRITE to send.
    #[inline]
    pub fn put_as<T: zerocopy::IntoBytes + zerocopy::Immutable>(&self, dst: Local, v: &T) {
        self.put_local(dst, v.as_bytes());
    }

    /// The queue pair to `node` and its lkey. An unknown node becomes the
    /// task's error (reported by the next `sync`).
    #[inline]
    fn qp_of(&self, st: &mut State, node: NodeId) -> Option<(usize, Lkey)> {
        match st.route(node) {
            Some(r) => Some(r),
            None => {
                self.unknown_node(st, node);
                None
            }
        }
    }

    #[cold]
    #[inline(never)]
    fn unknown_node(&self, st: &mut State, node: NodeId) {
        let t = &mut st.tasks[self.task];
        if t.error.is_none() {
            t.error = Some(FabricError::NoSuchNode(node));
        }
    }

    /// Queues a READ or WRITE. The work request is built once, from
    /// scalars, directly in its batch slot: patching a request in memory and
    /// copying it cost a store-forwarding stall per request (perf). READ and
    /// WRITE need no result slot (a request that completes moved exactly its
    /// length, which the ticket carries), so they never touch `results`.
    #[inline(always)]
    fn queue_rw(&self, remote: RemoteRef, local: Local, write: bool) -> Ticket {
        let (off, len) = (local.offset(), local.len());
        self.check_local(off, len);
        let mut guard = self.core.st.borrow_mut();
        let st = &mut *guard;
        let Some((qi, lkey)) = self.qp_of(st, remote.addr.node()) else {
            return Ticket(usize::MAX);
        };
        // No result slot, so the round's results stay as they are (an
        // atomic queued later clears them). One lookup of the task for the
        // counters and the batch.
        let t = &mut st.tasks[self.task];
        let c = &mut t.counters;
        if write {
            c.writes += 1;
            c.bytes_written += len as u64;
        } else {
            c.reads += 1;
            c.bytes_read += len as u64;
        }
        let local = LocalRef::new(lkey, (self.local_base() + off) as u64, len as u32);
        t.queue_to(qi).push(WorkRequest {
            wr_id: wr_id(self.task, NO_SLOT, 0),
            remote: remote.addr,
            rkey: remote.rkey,
            signaled: false,
            op: if write {
                Op::Write {
                    local,
                    inline: false,
                }
            } else {
                Op::Read { local }
            },
        });
        Ticket(LEN_TICKET | len)
    }

    /// Queues an atomic. It is signaled (its old value is needed) and gets
    /// a result slot in the task's current sync round.
    fn queue_atomic(&self, remote: RemoteRef, op: Op) -> Ticket {
        let mut guard = self.core.st.borrow_mut();
        let st = &mut *guard;
        let Some((qi, _)) = self.qp_of(st, remote.addr.node()) else {
            return Ticket(usize::MAX);
        };
        let t = &mut st.tasks[self.task];
        if t.fresh {
            t.results.clear();
            t.fresh = false;
        }
        let ticket = t.results.len();
        assert!(
            ticket < NO_SLOT,
            "more than {NO_SLOT} atomics in one sync round"
        );
        t.results.push(0);
        if matches!(op, Op::Faa { .. }) {
            t.counters.faa += 1;
        } else {
            t.counters.cas += 1;
        }
        st.pending_batch(self.task, qi).push(WorkRequest {
            wr_id: wr_id(self.task, ticket, 0),
            remote: remote.addr,
            rkey: remote.rkey,
            signaled: true,
            op,
        });
        Ticket(ticket)
    }

    /// Queues a vector READ/WRITE over task-local `pieces`.
    fn queue_v(&self, remote: RemoteRef, pieces: &[Local], write: bool) -> Ticket {
        let mut guard = self.core.st.borrow_mut();
        let st = &mut *guard;
        let Some((qi, lkey)) = self.qp_of(st, remote.addr.node()) else {
            return Ticket(usize::MAX);
        };
        let base = self.local_base() as u64;
        // One pass over the pieces (check, translate, sum) into a list on
        // the stack: a list of up to `INLINE_SGES` pieces (every list a
        // device takes) costs no heap allocation per request.
        let mut inline = [LocalRef::new(0, 0, 0); INLINE_SGES];
        let spilled: Vec<LocalRef>;
        let mut total = 0u64;
        let mut sge = |p: &Local| {
            self.check_local(p.offset(), p.len());
            total += p.len() as u64;
            LocalRef::new(lkey, base + p.offset() as u64, p.len() as u32)
        };
        let sges: &[LocalRef] = if pieces.len() <= INLINE_SGES {
            for (s, p) in inline.iter_mut().zip(pieces) {
                *s = sge(p);
            }
            &inline[..pieces.len()]
        } else {
            spilled = pieces.iter().map(sge).collect();
            &spilled
        };
        let t = &mut st.tasks[self.task];
        if write {
            t.counters.writes += 1;
            t.counters.bytes_written += total;
        } else {
            t.counters.reads += 1;
            t.counters.bytes_read += total;
        }
        let b = st.pending_batch(self.task, qi);
        let wr = if write {
            b.write_v(remote.addr, remote.rkey, sges)
        } else {
            b.read_v(remote.addr, remote.rkey, sges)
        };
        wr.wr_id = wr_id(self.task, NO_SLOT, 0);
        wr.signaled = false;
        Ticket(LEN_TICKET | total as usize)
    }

    /// Queues a vector READ: `src[0..Σlen)` scattered, in order, into the
    /// task-local `pieces` — one request, one round trip
    /// (memory-semantics §III-A, "SGL").
    pub fn read_v(&self, src: RemoteRef, pieces: &[Local]) -> Ticket {
        self.queue_v(src, pieces, false)
    }

    /// Queues a vector WRITE: the task-local `pieces` gathered, in order,
    /// into `dst[0..Σlen)`.
    pub fn write_v(&self, dst: RemoteRef, pieces: &[Local]) -> Ticket {
        self.queue_v(dst, pieces, true)
    }

    /// Software-packed WRITE (memory-semantics §III-A, "SP"): copies `pieces`
    /// back to back into the task-local `scratch` and queues one WRITE of
    /// the packed bytes to `dst`.
    pub fn write_packed(&self, dst: RemoteRef, scratch: Local, pieces: &[&[u8]]) -> Ticket {
        let mut at = 0;
        for p in pieces {
            self.put_local(scratch.slice(at, p.len()), p);
            at += p.len();
        }
        self.write(dst, scratch.prefix(at))
    }

    /// Queues a READ of `dst.len()` bytes at `src` into the task-local `dst`.
    #[inline(always)]
    pub fn read(&self, src: RemoteRef, dst: Local) -> Ticket {
        self.queue_rw(src, dst, false)
    }

    /// Queues a WRITE of the task-local `src` to `dst`.
    #[inline(always)]
    pub fn write(&self, dst: RemoteRef, src: Local) -> Ticket {
        self.queue_rw(dst, src, true)
    }

    /// Queues a CAS of the 8-byte word at `at`.
    pub fn cas(&self, at: RemoteRef, expected: u64, desired: u64) -> Ticket {
        self.queue_atomic(at, Op::Cas { expected, desired })
    }

    /// Queues a masked CAS (see `dmkit_fabric::Op::MaskedCas`).
    pub fn masked_cas(
        &self,
        at: RemoteRef,
        compare: u64,
        compare_mask: u64,
        swap: u64,
        swap_mask: u64,
    ) -> Ticket {
        self.queue_atomic(
            at,
            Op::MaskedCas {
                compare,
                compare_mask,
                swap,
                swap_mask,
            },
        )
    }

    /// Queues a FAA of the 8-byte word at `at`.
    pub fn faa(&self, at: RemoteRef, add: u64) -> Ticket {
        self.queue_atomic(at, Op::Faa { add })
    }

    /// Posts everything this task queued: one batch (one doorbell) per
    /// memory node, deferred by the throttle while credits are short.
    pub fn post(&self) {
        self.core.st.borrow_mut().post_task(self.task);
    }

    /// Waits until every request this task posted has completed (posting
    /// whatever is still queued first). Returns the first failure, if any.
    /// One `sync` that waits counts as one round trip.
    pub fn sync(&self) -> Sync<'_> {
        Sync {
            ctx: self,
            started: false,
            waited: false,
        }
    }

    /// The result of a request of the last completed sync round.
    ///
    /// # Panics
    /// If the ticket is not from the current round (programmer error).
    pub fn value(&self, t: Ticket) -> u64 {
        if t.0 != usize::MAX && t.0 & LEN_TICKET != 0 {
            return (t.0 & !LEN_TICKET) as u64;
        }
        let st = self.core.st.borrow();
        *st.tasks[self.task]
            .results
            .get(t.0)
            .expect("ticket of the current sync round")
    }

    /// READ and wait; the data is in `dst`.
    pub async fn read_sync(&self, src: RemoteRef, dst: Local) -> Result<(), FabricError> {
        self.read(src, dst);
        self.sync().await
    }

    /// WRITE and wait.
    pub async fn write_sync(&self, dst: RemoteRef, src: Local) -> Result<(), FabricError> {
        self.write(dst, src);
        self.sync().await
    }

    /// CAS and wait; returns the old value.
    pub async fn cas_sync(
        &self,
        at: RemoteRef,
        expected: u64,
        desired: u64,
    ) -> Result<u64, FabricError> {
        let t = self.cas(at, expected, desired);
        self.sync().await?;
        Ok(self.value(t))
    }

    /// FAA and wait; returns the old value.
    pub async fn faa_sync(&self, at: RemoteRef, add: u64) -> Result<u64, FabricError> {
        let t = self.faa(at, add);
        self.sync().await?;
        Ok(self.value(t))
    }

    /// SMART's `backoff_cas_sync` (§5.1): CAS and wait; if it failed and
    /// conflict avoidance is on, sleep `min(t0·2^i, t_max) + rand(t0)` (i =
    /// failures so far in this operation) before returning the old value, so
    /// the caller can retry with a new expected value. The outcome feeds the
    /// worker's retry rate γ.
    pub async fn backoff_cas(
        &self,
        at: RemoteRef,
        expected: u64,
        desired: u64,
    ) -> Result<u64, FabricError> {
        let old = self.cas_sync(at, expected, desired).await?;
        self.cas_outcome(old == expected).await;
        Ok(old)
    }

    /// The second half of [`Ctx::backoff_cas`], for a CAS the caller posted
    /// itself (e.g. batched with a READ that must follow it): records
    /// whether it succeeded and, after a failure with conflict avoidance on,
    /// sleeps the backoff delay.
    pub async fn cas_outcome(&self, ok: bool) {
        let delay = {
            let mut st = self.core.st.borrow_mut();
            let st = &mut *st;
            if let Some(a) = &mut st.avoider {
                a.record(ok);
            }
            let t = &mut st.tasks[self.task];
            if ok {
                t.attempt = 0;
                None
            } else {
                t.counters.cas_failures += 1;
                t.counters.retries += 1;
                let attempt = t.attempt;
                t.attempt = t.attempt.saturating_add(1);
                let r = st.next_random();
                st.avoider.as_ref().map(|a| a.delay(attempt, r))
            }
        };
        if let Some(d) = delay {
            {
                let mut st = self.core.st.borrow_mut();
                let st = &mut *st;
                st.tasks[self.task].counters.backoff_ns += d;
            }
            self.sleep(d).await;
        }
    }

    /// A lost race of a data-structure operation that the operation will
    /// retry — a lock found held, a stale or torn read, a CAS retried by
    /// hand: SMART's single backoff (§4.3, §5.1) for every retry loop, so
    /// the `conflict_avoid` switch governs them all. Counts a retry in the
    /// task's statistics and, inside a guarded operation ([`Ctx::op`]), in
    /// the worker's retry rate γ; then, with conflict avoidance on, sleeps
    /// equation (1)'s delay `min(t0·2^i, t_max) + rand(t0)` for the
    /// operation's `i`-th retry (the count [`Ctx::backoff_cas`] keeps too).
    /// With conflict avoidance off it returns at once: the operation
    /// retries immediately, as SMART's baselines do.
    pub async fn backoff(&self) {
        let delay = {
            let mut st = self.core.st.borrow_mut();
            let st = &mut *st;
            let t = &mut st.tasks[self.task];
            t.counters.retries += 1;
            let attempt = t.attempt;
            t.attempt = t.attempt.saturating_add(1);
            let guarded = t.guarded;
            let r = st.next_random();
            st.avoider.as_mut().map(|a| {
                if guarded {
                    a.record(false);
                }
                a.delay(attempt, r)
            })
        };
        if let Some(d) = delay {
            self.core.st.borrow_mut().tasks[self.task]
                .counters
                .backoff_ns += d;
            self.sleep(d).await;
        }
    }

    /// Whether conflict avoidance (backoff in `backoff_cas`) is on.
    pub fn conflict_avoidance(&self) -> bool {
        self.core.st.borrow().avoider.is_some()
    }

    /// Records a retry of a data-structure operation (e.g. a torn read).
    pub fn note_retry(&self) {
        let mut st = self.core.st.borrow_mut();
        let st = &mut *st;
        st.tasks[self.task].counters.retries += 1;
    }

    /// Retries this task has recorded so far (failed CASes of `backoff_cas`
    /// and [`Ctx::note_retry`]); the difference across an operation is its
    /// retry count.
    pub fn retries(&self) -> u64 {
        self.core.st.borrow().tasks[self.task].counters.retries
    }

    /// This task's counters so far (verbs, bytes, doorbells, round trips,
    /// retries): the difference across an operation is what it cost, so a
    /// benchmark can charge a measured window with exactly the operations
    /// it counted.
    pub fn counters(&self) -> Counters {
        self.core.st.borrow().tasks[self.task].counters
    }

    /// Retries all tasks of this worker have recorded so far.
    pub fn worker_retries(&self) -> u64 {
        let st = self.core.st.borrow();
        st.tasks.iter().map(|t| t.counters.retries).sum()
    }

    /// Sleeps `d` nanoseconds of the worker's clock (other tasks run).
    pub fn sleep(&self, d: Nanos) -> Sleep<'_> {
        Sleep {
            ctx: self,
            until: self.now().saturating_add(d),
            armed: false,
        }
    }

    /// Enters an operation scope named `name`: waits for one of the worker's
    /// `c_max` operation slots (coroutine throttling, when conflict avoidance
    /// is on) and attributes latency, verbs, bytes, round trips and retries
    /// to `name` until the returned guard drops.
    pub fn op(&self, name: &'static str) -> OpEnter<'_> {
        OpEnter {
            ctx: self,
            name,
            guarded: true,
        }
    }

    /// Enters an operation scope for an operation that never retries a
    /// failed CAS (a lookup or scan): statistics are attributed to `name`
    /// as with [`Ctx::op`], but the operation takes no `c_max` slot and is
    /// not counted in the retry rate γ. SMART guards only the operations
    /// that can conflict (its `BackoffGuard` wraps insert, update and
    /// delete, not search), so throttling a contended update never holds
    /// back the reads of a read-mostly workload.
    pub fn read_op(&self, name: &'static str) -> OpEnter<'_> {
        OpEnter {
            ctx: self,
            name,
            guarded: false,
        }
    }
}

/// Future of [`Ctx::sync`].
pub struct Sync<'a> {
    ctx: &'a Ctx,
    started: bool,
    waited: bool,
}

impl Future for Sync<'_> {
    type Output = Result<(), FabricError>;

    // Inlined into the awaiting task: returned by pointer, the 74-byte
    // `Poll<Result<(), FabricError>>` was copied after every sync, and the
    // copy stalled on store forwarding (perf: ~3 % of a READ loop).
    #[inline(always)]
    fn poll(mut self: Pin<&mut Self>, _cx: &mut Context<'_>) -> Poll<Self::Output> {
        let ctx = self.ctx;
        let mut st = ctx.core.st.borrow_mut();
        if !self.started {
            self.started = true;
            if st.has_pending(ctx.task) {
                st.post_task(ctx.task);
            }
        }
        let st = &mut *st;
        let t = &mut st.tasks[ctx.task];
        if t.inflight > 0 {
            t.waiting_sync = true;
            self.waited = true;
            return Poll::Pending;
        }
        t.waiting_sync = false;
        t.fresh = true;
        if self.waited {
            t.counters.round_trips += 1;
        }
        // Looked at before it is taken: `take` copies the whole error
        // out and back, also when there is none.
        if t.error.is_none() {
            return Poll::Ready(Ok(()));
        }
        Poll::Ready(t.error.take().map_or(Ok(()), Err))
    }
}

/// Future of [`Ctx::sleep`].
pub struct Sleep<'a> {
    ctx: &'a Ctx,
    until: Nanos,
    armed: bool,
}

impl Future for Sleep<'_> {
    type Output = ();

    fn poll(mut self: Pin<&mut Self>, _cx: &mut Context<'_>) -> Poll<()> {
        if self.ctx.now() >= self.until {
            return Poll::Ready(());
        }
        if !self.armed {
            self.armed = true;
            let (until, task) = (self.until, self.ctx.task);
            self.ctx.core.st.borrow_mut().add_timer(until, task);
        }
        Poll::Pending
    }
}

/// Future of [`Ctx::op`] and [`Ctx::read_op`].
pub struct OpEnter<'a> {
    ctx: &'a Ctx,
    name: &'static str,
    /// Takes a `c_max` slot and counts in γ.
    guarded: bool,
}

impl<'a> Future for OpEnter<'a> {
    type Output = OpGuard<'a>;

    fn poll(self: Pin<&mut Self>, _cx: &mut Context<'_>) -> Poll<OpGuard<'a>> {
        let ctx = self.ctx;
        let mut st = ctx.core.st.borrow_mut();
        let st = &mut *st;
        let limit = st.avoider.as_ref().map_or(u32::MAX, |a| a.c_max());
        let t = &mut st.tasks[ctx.task];
        let admitted = if !self.guarded {
            true
        } else if t.op_granted {
            t.op_granted = false;
            true
        } else if st.op_in_use < limit && !t.op_waiting {
            st.op_in_use += 1;
            true
        } else {
            if !t.op_waiting {
                t.op_waiting = true;
                st.op_waiters.push_back(ctx.task);
            }
            false
        };
        if !admitted {
            return Poll::Pending;
        }
        if self.guarded {
            if let Some(a) = &mut st.avoider {
                a.note_op();
            }
        }
        let t = &mut st.tasks[ctx.task];
        t.attempt = 0;
        if self.guarded {
            t.guarded = true;
        }
        Poll::Ready(OpGuard {
            ctx,
            name: self.name,
            guarded: self.guarded,
            start: if ctx.core.op_stats {
                ctx.core.clock.now()
            } else {
                0
            },
            before: t.counters,
        })
    }
}

/// An open operation scope; statistics are recorded when it drops.
pub struct OpGuard<'a> {
    ctx: &'a Ctx,
    name: &'static str,
    guarded: bool,
    start: Nanos,
    before: Counters,
}

impl Drop for OpGuard<'_> {
    fn drop(&mut self) {
        let core = &self.ctx.core;
        let now = core.op_stats.then(|| core.clock.now());
        let mut st = core.st.borrow_mut();
        let st = &mut *st;
        if let Some(now) = now {
            let delta = st.tasks[self.ctx.task].counters.since(&self.before);
            st.stats
                .op_mut(self.name)
                .record(now.saturating_sub(self.start), &delta);
        }
        if self.guarded {
            st.tasks[self.ctx.task].guarded = false;
            st.release_op();
        }
    }
}
