//! Queue pairs shared between threads — the baselines of SMART §3.1
//! (Figure 3a): *shared QP* (every thread posts to one QP) and *multiplexed
//! QP* (each QP serves a group of threads). dmkit's default is one QP per
//! thread per memory node; these exist to measure what sharing costs.
//!
//! [`SharedQp`] wraps any backend's queue pair behind a mutex: a post takes
//! the lock, renumbers the requests (remembering each one's poster and
//! original `wr_id`), and posts; a poll takes the lock, reaps the real
//! completion queue and routes every completion to its poster's queue. The
//! lock is the honest cost of sharing — the same serialisation a shared QP's
//! send-queue lock imposes on an RNIC driver.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex, MutexGuard};

use crate::local::{Lkey, LocalMem};
use crate::{Batch, Capabilities, Completion, NodeId, PostError, QpStats, QueuePair};

struct Posted {
    seq: u64,
    user: usize,
    wr_id: u64,
    signaled: bool,
}

struct UserQueue {
    /// Routed completions, each with whether its request was signaled.
    ready: VecDeque<(bool, Completion)>,
    /// Signaled requests posted and not yet delivered.
    signaled_outstanding: usize,
    /// Completions of unsignaled requests (failures, flushes) routed and not
    /// yet delivered.
    unsignaled_queued: usize,
}

struct Inner {
    qp: Box<dyn QueuePair>,
    next_seq: u64,
    /// Posted requests in posting order (completions arrive in this order).
    posted: VecDeque<Posted>,
    users: Vec<UserQueue>,
    scratch: Vec<Completion>,
}

/// One thread's handle on a shared queue pair.
pub struct SharedQp {
    inner: Arc<Mutex<Inner>>,
    user: usize,
    node: NodeId,
    caps: Capabilities,
}

impl SharedQp {
    /// Shares `qp` between `users` handles.
    pub fn share(qp: Box<dyn QueuePair>, users: usize) -> Vec<SharedQp> {
        let (node, caps) = (qp.node(), qp.caps());
        let inner = Arc::new(Mutex::new(Inner {
            qp,
            next_seq: 0,
            posted: VecDeque::new(),
            users: (0..users)
                .map(|_| UserQueue {
                    ready: VecDeque::new(),
                    signaled_outstanding: 0,
                    unsignaled_queued: 0,
                })
                .collect(),
            scratch: Vec::new(),
        }));
        (0..users)
            .map(|user| SharedQp {
                inner: inner.clone(),
                user,
                node,
                caps,
            })
            .collect()
    }

    fn lock(&self) -> MutexGuard<'_, Inner> {
        // A panic while holding the lock leaves the queues consistent at the
        // granularity of whole operations; keep going.
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }
}

impl Inner {
    fn reap(&mut self) {
        let mut comps = std::mem::take(&mut self.scratch);
        while self.qp.poll(&mut comps, 64) > 0 {
            for mut c in comps.drain(..) {
                // Every request posted before this one has completed (RC order).
                while self.posted.front().is_some_and(|p| p.seq < c.wr_id) {
                    self.posted.pop_front();
                }
                let Some(p) = self.posted.pop_front() else {
                    debug_assert!(false, "completion for an unknown request");
                    continue;
                };
                debug_assert_eq!(p.seq, c.wr_id);
                c.wr_id = p.wr_id;
                if let Err(e) = &mut c.result {
                    e.wr_id = p.wr_id;
                }
                let u = &mut self.users[p.user];
                if !p.signaled {
                    u.unsignaled_queued += 1;
                }
                u.ready.push_back((p.signaled, c));
            }
        }
        self.scratch = comps;
    }
}

impl QueuePair for SharedQp {
    fn node(&self) -> NodeId {
        self.node
    }

    fn caps(&self) -> Capabilities {
        self.caps
    }

    fn register_local(&mut self, mem: &LocalMem) -> Lkey {
        self.lock().qp.register_local(mem)
    }

    fn post(&mut self, batch: &mut Batch) -> Result<(), PostError> {
        let mut g = self.lock();
        let inner = &mut *g;
        let first = inner.next_seq;
        let mut signaled = 0;
        for (i, wr) in batch.requests_mut().iter_mut().enumerate() {
            let seq = first + i as u64;
            inner.posted.push_back(Posted {
                seq,
                user: self.user,
                wr_id: wr.wr_id,
                signaled: wr.signaled,
            });
            signaled += wr.signaled as usize;
            wr.wr_id = seq;
        }
        let n = batch.len();
        match inner.qp.post(batch) {
            Ok(()) => {
                inner.next_seq += n as u64;
                inner.users[self.user].signaled_outstanding += signaled;
                Ok(())
            }
            Err(e) => {
                // Nothing was posted: restore the batch and forget it.
                for _ in 0..n {
                    let p = inner.posted.pop_back().expect("just pushed");
                    batch.requests_mut()[(p.seq - first) as usize].wr_id = p.wr_id;
                }
                Err(e)
            }
        }
    }

    fn poll(&mut self, out: &mut Vec<Completion>, max: usize) -> usize {
        let mut g = self.lock();
        g.reap();
        let u = &mut g.users[self.user];
        let mut n = 0;
        while n < max {
            let Some((signaled, c)) = u.ready.pop_front() else {
                break;
            };
            if signaled {
                u.signaled_outstanding -= 1;
            } else {
                u.unsignaled_queued -= 1;
            }
            out.push(c);
            n += 1;
        }
        n
    }

    fn pending(&self) -> usize {
        let mut g = self.lock();
        g.reap();
        let u = &g.users[self.user];
        u.signaled_outstanding + u.unsignaled_queued
    }

    fn stats(&self) -> QpStats {
        self.lock().qp.stats()
    }
}
