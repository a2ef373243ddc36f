//! [`ShmRpcChannel`]: the shm backend's RPC channel — a request ring and a
//! reply ring in a memfd shared with one worker thread of the node
//! (`dmkit_memnode::rpc::ring` has the layout). Sending is a copy into a
//! slot and a store of the tail counter; the only system call is a
//! `FUTEX_WAKE` when the worker announced it is going to sleep (see
//! `dmkit_memnode::rpc` for the idle policy). Polling reads the reply
//! ring; nothing blocks.
//!
//! Latency model ([`super::ShmConfig::rtt`]): an RPC is one network round
//! trip, as a one-sided verb is. A request reaches the ring half a round
//! trip after it was sent, and a reply becomes visible half a round trip
//! after the worker wrote it (both held on the client's side, moved by
//! [`RpcChannel::poll`]), so a call costs the round trip plus the worker's
//! queueing and service time, where a READ costs the round trip alone.

use std::collections::VecDeque;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use dmkit_memnode::rpc::ring::{futex_wake, RingView, CHANNEL_OPEN};

use super::view::NodeView;
use crate::addr::NodeId;
use crate::rpc::{ReplyClock, RpcChannel, RpcFailure, RpcReply, RpcSendError, ServiceId};

/// A channel from this thread to one shm memory node's RPC workers.
pub struct ShmRpcChannel {
    node: NodeId,
    ring: RingView,
    /// The node's tables (its state word and the workers' bells).
    view: Arc<NodeView>,
    slots: u64,
    max: usize,
    worker: usize,
    /// Requests posted (the private copy of `req_tail`).
    sent: u64,
    /// Replies consumed (the private copy of `rep_head`).
    polled: u64,
    /// Ids of the requests sent and not yet answered (on the ring or in
    /// `outbox`), in order.
    ids: VecDeque<u64>,
    /// Set once the node closed the channel: every later call fails so.
    gone: Option<RpcFailure>,
    /// The latency model's half round trip, or none.
    half_rtt: Option<Duration>,
    /// With the latency model: requests still on the wire (when they
    /// reach the ring, service, payload), in order.
    outbox: VecDeque<(Instant, ServiceId, Vec<u8>)>,
    /// With the latency model: replies read off the ring, still on the
    /// wire back (when they become visible), in order.
    inbox: VecDeque<(Instant, RpcReply)>,
    /// See [`super::ShmConfig::rpc_reply_timeout`].
    clock: ReplyClock,
}

impl ShmRpcChannel {
    pub(crate) fn new(
        node: NodeId,
        ring: RingView,
        view: Arc<NodeView>,
        rtt: Option<Duration>,
        reply_timeout: Duration,
    ) -> Self {
        let g = ring.geometry();
        Self {
            clock: ReplyClock::new(reply_timeout),
            half_rtt: rtt.map(|r| r / 2),
            outbox: VecDeque::new(),
            inbox: VecDeque::new(),
            node,
            slots: g.slots as u64,
            max: g.max_message as usize,
            worker: g.worker as usize,
            ring,
            view,
            sent: 0,
            polled: 0,
            ids: VecDeque::with_capacity(g.slots as usize),
            gone: None,
        }
    }

    /// The worker thread of the node that serves this channel.
    pub fn worker(&self) -> usize {
        self.worker
    }

    /// The ring itself (tests that play a hostile client write into it).
    #[doc(hidden)]
    pub fn ring(&self) -> &RingView {
        &self.ring
    }

    /// Why the channel is gone, if it is.
    fn check_gone(&mut self) -> Option<RpcFailure> {
        if self.gone.is_none() {
            let closed = self.ring.header().state.load(Ordering::Acquire) != CHANNEL_OPEN;
            if self.view.closed() {
                self.gone = Some(RpcFailure::ShuttingDown);
            } else if closed {
                self.gone = Some(RpcFailure::ConnectionLost);
            }
        }
        self.gone.clone()
    }

    /// Puts a request on the ring and wakes its worker if it sleeps.
    fn put(&mut self, id: u64, service: ServiceId, payload: &[u8]) {
        self.ring.write_request(self.sent, id, service, payload);
        self.sent += 1;
        let h = self.ring.header();
        // Sequentially consistent with the worker's `sleeping = 1`, then
        // its re-check of this counter: one of the two sees the other.
        h.req_tail.store(self.sent, Ordering::SeqCst);
        let bell = self.view.bell(self.worker);
        if bell.load(Ordering::SeqCst) != 0 {
            futex_wake(bell);
        }
    }

    /// Latency model: puts the requests whose half round trip is over on
    /// the ring.
    fn deliver(&mut self, now: Instant) {
        while self.outbox.front().is_some_and(|r| r.0 <= now) {
            let (_, service, payload) = self.outbox.pop_front().expect("front exists");
            // The ids of the outbox are the last `outbox.len()` of `ids`.
            let id = self.ids[self.ids.len() - self.outbox.len() - 1];
            self.put(id, service, &payload);
        }
    }
}

impl RpcChannel for ShmRpcChannel {
    fn node(&self) -> NodeId {
        self.node
    }

    fn max_message(&self) -> usize {
        self.max
    }

    fn capacity(&self) -> usize {
        self.slots as usize
    }

    fn send(&mut self, id: u64, service: ServiceId, payload: &[u8]) -> Result<(), RpcSendError> {
        if let Some(f) = &self.gone {
            return Err(f.clone().into());
        }
        if payload.len() > self.max {
            return Err(RpcFailure::TooLarge {
                len: payload.len(),
                max: self.max,
            }
            .into());
        }
        // Unanswered: on the ring, on the wire either way (the latency
        // model's outbox and inbox).
        if (self.ids.len() + self.inbox.len()) as u64 >= self.slots {
            return Err(RpcSendError::Full);
        }
        debug_assert_eq!(
            self.ids.len() - self.outbox.len(),
            (self.sent - self.polled) as usize
        );
        self.ids.push_back(id);
        match self.half_rtt {
            None => self.put(id, service, payload),
            Some(half) => {
                let now = Instant::now();
                self.outbox
                    .push_back((now + half, service, payload.to_vec()));
                self.deliver(now);
            }
        }
        Ok(())
    }

    fn poll(&mut self, out: &mut Vec<RpcReply>) -> usize {
        let now = self.half_rtt.map(|_| Instant::now());
        if let Some(now) = now {
            self.deliver(now);
        }
        let h = self.ring.header();
        let tail = h.rep_tail.load(Ordering::Acquire);
        let ready = tail.wrapping_sub(self.polled).min(self.sent - self.polled);
        let mut n = 0;
        let mut buf = Vec::new();
        // Without the latency model replies go straight to `out`; with it,
        // to `inbox` until their half round trip is over.
        let mut arrived = Vec::new();
        let dest = if now.is_some() {
            &mut arrived
        } else {
            &mut *out
        };
        for _ in 0..ready {
            let id = self
                .ids
                .pop_front()
                .expect("a reply answers a sent request");
            let result = match self.ring.read_reply(self.polled, &mut buf) {
                Ok(head) => RpcFailure::decode(head.status, head.service, &buf)
                    .map(|()| std::mem::take(&mut buf)),
                Err(head) => Err(RpcFailure::Malformed(format!(
                    "reply of {} B in a channel of {} B messages",
                    head.len, self.max
                ))),
            };
            self.polled += 1;
            dest.push(RpcReply { id, result });
            n += 1;
        }
        if n > 0 {
            h.rep_head.store(self.polled, Ordering::Release);
        }
        if let (Some(now), Some(half)) = (now, self.half_rtt) {
            self.inbox
                .extend(arrived.into_iter().map(|r| (now + half, r)));
            n = 0;
            while self.inbox.front().is_some_and(|r| r.0 <= now) {
                out.push(self.inbox.pop_front().expect("front exists").1);
                n += 1;
            }
        }
        let progressed = n > 0 || ready > 0;
        if self.gone.is_none() {
            self.gone = self
                .clock
                .after_poll(usize::from(progressed), !self.ids.is_empty());
        }
        if progressed {
            return n;
        }
        // Nothing came: if the node closed the channel (or the reply clock
        // gave up on it), nothing will.
        if !self.ids.is_empty() {
            if let Some(f) = self.check_gone() {
                // Replies that came before the close first, in order.
                for (_, r) in self.inbox.drain(..) {
                    out.push(r);
                    n += 1;
                }
                self.outbox.clear();
                for id in self.ids.drain(..) {
                    out.push(RpcReply {
                        id,
                        result: Err(f.clone()),
                    });
                    n += 1;
                }
                self.polled = self.sent;
            }
        }
        n
    }

    fn pending(&self) -> usize {
        self.ids.len() + self.inbox.len()
    }
}

impl Drop for ShmRpcChannel {
    fn drop(&mut self) {
        // The worker reclaims the channel when it sees this.
        self.ring.header().client_closed.store(1, Ordering::SeqCst);
        let bell = self.view.bell(self.worker);
        if bell.load(Ordering::SeqCst) != 0 {
            futex_wake(bell);
        }
    }
}
