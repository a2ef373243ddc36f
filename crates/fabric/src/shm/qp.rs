//! The shm queue pair: executes verbs with the posting thread's own CPU,
//! straight on the mapped memory (truly one-sided: the node's CPU never sees
//! them), and queues completions — delayed by the latency model if set.
//!
//! Deferred READs ([`super::ShmConfig::deferred_reads`]): an RNIC executes
//! a request somewhere between its post and its completion, and one NIC
//! overlaps the memory accesses of many outstanding requests. A thread that
//! copies each READ at post instead takes its cache misses one after
//! another: with a worker's coroutines each waiting on its own READs, the
//! thread stalls on every record line in turn. With the switch on, a scalar
//! READ is checked at post (every check that needs no remote memory: key,
//! rights, bounds, local range — a bad one still fails at once) and the
//! line of its translation entry is prefetched; the copy waits in the queue
//! pair's pending list. The next poll (or the next post of anything but a
//! READ) translates every pending READ and prefetches its data lines, then
//! copies them in posting order and queues their completions: the misses
//! of all the coroutines' READs overlap, as on an RNIC. Order per queue
//! pair is kept: pending READs execute before any later WRITE, atomic or
//! vector request runs, so a WRITE never overtakes an earlier READ and a
//! READ always sees an earlier WRITE. A READ that fails at the copy (its
//! page unmapped meanwhile) reports its error at its completion and
//! flushes the rest of its batch, as at post.

use std::collections::VecDeque;
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::stream::StreamDetector;
use super::view::NodeView;
use super::WritePrefetch;
use crate::addr::{GlobalAddr, NodeId};
use crate::caps::Capabilities;
use crate::error::{PostError, RequestError, VerbError};
use crate::exec::Executor;
use crate::local::{Lkey, LocalMem};
use crate::wr::{Batch, Completion, Op, VerbKind};
use crate::{QpStats, QueuePair};

/// A checked READ waiting for its copy.
struct PendingRead {
    off: u64,
    dst: *mut u8,
    len: usize,
    wr_id: u64,
    remote: GlobalAddr,
    /// Its post (batch) number, for flushing the rest of a failed batch.
    post: u64,
    /// Its position in its batch.
    index: u32,
    signaled: bool,
}

/// A queue pair of the shm backend.
pub struct ShmQp {
    exec: Executor,
    rtt: Option<Duration>,
    /// Completions not yet polled, in posting order.
    cq: Vec<Completion>,
    /// With the latency model: (instant visible, completions of that post).
    ready: VecDeque<(Instant, usize)>,
    /// Whether scalar READs are copied at the next poll instead of at post.
    deferred_reads: bool,
    /// Which WRITEs hint the lines after them for writing
    /// ([`super::ShmConfig::write_prefetch`]).
    write_prefetch: WritePrefetch,
    /// Where recent WRITEs ended ([`WritePrefetch::Stream`]).
    streams: StreamDetector,
    /// READs checked but not copied yet, in posting order.
    pending: Vec<PendingRead>,
    /// Signaled requests in `pending`.
    pending_signaled: usize,
    /// Posts so far (numbers each batch).
    posts: u64,
    /// The post whose batch failed at a deferred copy: its later requests
    /// are flushed.
    failed_post: Option<u64>,
}

// SAFETY: the only non-Send fields are `PendingRead::dst` pointers into
// local memory the executor keeps alive (registered `LocalMem`s are never
// dropped before the queue pair); they are dereferenced only by the thread
// that owns the queue pair, through `&mut self`.
unsafe impl Send for ShmQp {}

impl ShmQp {
    pub(crate) fn new(
        node: NodeId,
        view: Arc<NodeView>,
        caps: Capabilities,
        rtt: Option<Duration>,
        deferred_reads: bool,
        write_prefetch: WritePrefetch,
    ) -> Self {
        Self {
            exec: Executor::new(node, view, caps),
            rtt,
            cq: Vec::with_capacity(caps.max_batch),
            ready: VecDeque::new(),
            // The latency model times completions from their post: it
            // keeps copying at post.
            deferred_reads: deferred_reads && rtt.is_none(),
            write_prefetch,
            streams: StreamDetector::default(),
            pending: Vec::new(),
            pending_signaled: 0,
            posts: 0,
            failed_post: None,
        }
    }

    /// Whether this queue pair defers READ copies to the next poll
    /// ([`super::ShmConfig::deferred_reads`]; always off with the latency
    /// model).
    pub fn deferred_reads(&self) -> bool {
        self.deferred_reads
    }

    /// Pushes a completion (built in place: a stack temporary would cost a
    /// stall per request).
    #[inline(always)]
    fn push_completion(
        cq: &mut Vec<Completion>,
        wr_id: u64,
        result: Result<u64, Box<RequestError>>,
    ) {
        cq.reserve(1);
        let at = cq.len();
        cq.spare_capacity_mut()[0].write(Completion { wr_id, result });
        // SAFETY: reserve(1) made room and the slot at `at` was just written.
        unsafe { cq.set_len(at + 1) };
    }

    /// Copies every pending READ in posting order and queues their
    /// completions: first translates each and prefetches its data lines,
    /// so the misses overlap, then copies.
    #[inline(never)]
    fn run_pending(&mut self) {
        let Self {
            exec,
            cq,
            pending,
            pending_signaled,
            failed_post,
            ..
        } = self;
        for p in pending.iter() {
            exec.prefetch_data(p.off, p.len);
        }
        for p in pending.drain(..) {
            let result = if *failed_post == Some(p.post) {
                Err(VerbError::Flushed)
            } else {
                // SAFETY: off/dst/len come from prepare_read on this executor.
                let r = unsafe { exec.finish_read(p.off, p.dst, p.len) };
                if r.is_err() {
                    exec.note_error();
                    *failed_post = Some(p.post);
                }
                r
            };
            if p.signaled || result.is_err() {
                let result = result.map_err(|error| {
                    Box::new(RequestError {
                        index: p.index as usize,
                        wr_id: p.wr_id,
                        kind: VerbKind::Read,
                        remote: p.remote,
                        error,
                    })
                });
                Self::push_completion(cq, p.wr_id, result);
            }
        }
        *pending_signaled = 0;
    }
}

impl QueuePair for ShmQp {
    fn node(&self) -> NodeId {
        self.exec.node()
    }

    fn caps(&self) -> Capabilities {
        self.exec.caps()
    }

    fn register_local(&mut self, mem: &LocalMem) -> Lkey {
        // Registration pins the buffer on an RNIC; fault it in likewise.
        mem.populate();
        self.exec.register_local(mem)
    }

    #[inline]
    fn post(&mut self, batch: &mut Batch) -> Result<(), PostError> {
        if batch.is_empty() {
            return Ok(());
        }
        self.exec.begin_post(batch.len())?;
        self.posts += 1;
        let post = self.posts;
        let before = self.cq.len();
        let mut failed = false;
        for (index, wr) in batch.wrs.iter().enumerate() {
            let mut refused = None;
            if self.deferred_reads && !failed && matches!(wr.op, Op::Read { .. }) {
                match self.exec.prepare_read(wr) {
                    Ok((off, dst, len)) => {
                        self.exec.prefetch_translation(off);
                        self.pending.push(PendingRead {
                            off,
                            dst,
                            len,
                            wr_id: wr.wr_id,
                            remote: wr.remote,
                            post,
                            index: index as u32,
                            signaled: wr.signaled,
                        });
                        self.pending_signaled += usize::from(wr.signaled);
                        continue;
                    }
                    Err(e) => refused = Some(e),
                }
            }
            // Anything else runs now, after the READs posted before it.
            if !self.pending.is_empty() {
                self.run_pending();
                if self.failed_post == Some(post) {
                    failed = true;
                }
            }
            let result = if failed {
                Err(VerbError::Flushed)
            } else {
                let r = match refused {
                    Some(e) => Err(e),
                    None => self.exec.execute(wr, &batch.sges),
                };
                if self.write_prefetch != WritePrefetch::Off
                    && r.is_ok()
                    && wr.kind() == VerbKind::Write
                {
                    // The next WRITE of a stream (a partition buffer, a
                    // log) lands right after this one.
                    let (off, len) = (wr.remote.offset(), wr.len());
                    if self.write_prefetch == WritePrefetch::Always
                        || self.streams.continues(off, len as u64)
                    {
                        self.exec.prefetch_write(off + len as u64, len);
                    }
                }
                if r.is_err() {
                    failed = true;
                    self.exec.note_error();
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
                Self::push_completion(&mut self.cq, wr.wr_id, result);
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
        if !self.pending.is_empty() {
            self.run_pending();
        }
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
        // (A pending unsignaled READ that fails at its copy adds one more.)
        self.cq.len() + self.pending_signaled
    }

    fn stats(&self) -> QpStats {
        self.exec.stats()
    }
}
