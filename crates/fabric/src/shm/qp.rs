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
use crate::error::{PostError, VerbError};
use crate::wr::{Batch, Completion, Op, WorkRequest};
use crate::{QpStats, QueuePair};

/// A queue pair of the shm backend.
pub struct ShmQp {
    node: NodeId,
    view: Arc<NodeView>,
    caps: Capabilities,
    rtt: Option<Duration>,
    /// Completions with the instant they become visible (latency model).
    cq: VecDeque<(Option<Instant>, Completion)>,
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
            cq: VecDeque::with_capacity(caps.max_batch),
            stats: QpStats::default(),
        }
    }

    /// Checks a request against node, length, region key, access, bounds and
    /// alignment, then executes it. Returns the old value (atomics) or bytes moved.
    #[inline]
    fn execute_one(&mut self, wr: &mut WorkRequest) -> Result<u64, VerbError> {
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
        let (rights, base, end) = self.view.region(wr.rkey)?;
        let (needed, name) = match wr.op {
            Op::Read { .. } => (access::READ, "READ"),
            Op::Write { .. } => (access::WRITE, "WRITE"),
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
        match &mut wr.op {
            Op::Read { buf } => {
                self.view.read(off, buf)?;
                s.reads += 1;
                s.bytes_read += len as u64;
                Ok(len as u64)
            }
            Op::Write { buf, .. } => {
                self.view.write(off, buf)?;
                s.writes += 1;
                s.bytes_written += len as u64;
                Ok(len as u64)
            }
            op => {
                if off % 8 != 0 {
                    return Err(VerbError::Unaligned { offset: off });
                }
                let w = self.view.word(off)?;
                let old = match *op {
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
                    Op::Read { .. } | Op::Write { .. } => unreachable!("handled above"),
                };
                Ok(old)
            }
        }
    }
}

impl QueuePair for ShmQp {
    fn node(&self) -> NodeId {
        self.node
    }

    fn caps(&self) -> Capabilities {
        self.caps
    }

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
        self.stats.doorbells += 1;
        let ready = self.rtt.map(|rtt| Instant::now() + rtt);
        let mut failed = false;
        for (index, mut wr) in batch.drain().enumerate() {
            let result = if failed {
                Err(VerbError::Flushed)
            } else {
                let r = self.execute_one(&mut wr);
                if r.is_err() {
                    failed = true;
                    self.stats.errors += 1;
                }
                r
            };
            if wr.signaled || result.is_err() {
                let c = Completion {
                    wr_id: wr.wr_id,
                    index,
                    kind: wr.kind(),
                    remote: wr.remote,
                    buf: wr.take_buf(),
                    result,
                };
                self.cq.push_back((ready, c));
            }
        }
        Ok(())
    }

    fn poll(&mut self, out: &mut Vec<Completion>, max: usize) -> usize {
        let now = match self.cq.front() {
            None => return 0,
            Some((Some(_), _)) => Some(Instant::now()),
            Some((None, _)) => None,
        };
        let mut n = 0;
        while n < max {
            match self.cq.front() {
                Some((Some(t), _)) if now.is_some_and(|now| *t > now) => break,
                Some(_) => {
                    let (_, c) = self.cq.pop_front().expect("front exists");
                    out.push(c);
                    n += 1;
                }
                None => break,
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
