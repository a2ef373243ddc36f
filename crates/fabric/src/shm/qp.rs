//! The shm queue pair: executes verbs with the posting thread's own CPU,
//! straight on the mapped memory (truly one-sided: the node's CPU never sees
//! them), and queues completions — delayed by the latency model if set.

use std::collections::VecDeque;
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::view::NodeView;
use crate::addr::NodeId;
use crate::caps::Capabilities;
use crate::error::{PostError, RequestError, VerbError};
use crate::exec::Executor;
use crate::local::{Lkey, LocalMem};
use crate::wr::{Batch, Completion};
use crate::{QpStats, QueuePair};

/// A queue pair of the shm backend.
pub struct ShmQp {
    exec: Executor,
    rtt: Option<Duration>,
    /// Completions not yet polled, in posting order.
    cq: Vec<Completion>,
    /// With the latency model: (instant visible, completions of that post).
    ready: VecDeque<(Instant, usize)>,
}

impl ShmQp {
    pub(crate) fn new(
        node: NodeId,
        view: Arc<NodeView>,
        caps: Capabilities,
        rtt: Option<Duration>,
    ) -> Self {
        Self {
            exec: Executor::new(node, view, caps),
            rtt,
            cq: Vec::with_capacity(caps.max_batch),
            ready: VecDeque::new(),
        }
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
        let before = self.cq.len();
        let mut failed = false;
        for (index, wr) in batch.wrs.iter().enumerate() {
            let result = if failed {
                Err(VerbError::Flushed)
            } else {
                let r = self.exec.execute(wr, &batch.sges);
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
        self.exec.stats()
    }
}
