//! The RPC channel: typed request/response messages from one client thread
//! to a memory node's worker threads — the node's CPU on the path, for
//! what one-sided verbs cannot do in one round trip (CoRM's
//! Alloc/Free/Read/Write/ReleasePtr, CoRM SIGMOD'21 §2.2.2; Clover's
//! metadata server; the RPC baselines of the memory-semantics study).
//!
//! A channel is like a [`crate::QueuePair`]: one per client thread and
//! node, not shared, polled. [`Fabric::connect_rpc`](crate::Fabric::connect_rpc)
//! makes one where [`Capabilities::rpc_workers`](crate::Capabilities::rpc_workers)
//! is non-zero; elsewhere it is refused with
//! [`FabricError::Unsupported`](crate::FabricError::Unsupported). The node
//! side is `dmkit_memnode::rpc`: services registered under a
//! [`ServiceId`], run by the node's workers; [`ECHO`] is always there.
//!
//! ## The contract (the conformance suite's `rpc_*` checks)
//! - [`RpcChannel::send`] never blocks: it refuses with
//!   [`RpcSendError::Full`] when [`RpcChannel::capacity`] requests are
//!   unanswered (replied but not yet polled counts as unanswered), and
//!   with a [`RpcFailure::TooLarge`] when the payload exceeds
//!   [`RpcChannel::max_message`]. A refused request was not sent; nothing
//!   sent before it is lost.
//! - Every sent request gets exactly one reply ([`RpcReply`], its `id` the
//!   caller's), a success or a typed [`RpcFailure`].
//! - Order: a channel's requests are handled in the order they were sent,
//!   and their replies are polled in that order (FIFO per channel). Nothing
//!   is promised between channels.
//! - After an unknown service, a too-large message or a service's own
//!   error the channel stays usable; after [`RpcFailure::ShuttingDown`],
//!   [`RpcFailure::ConnectionLost`] or [`RpcFailure::NoReply`] (the
//!   verbs and shm channels' [`ReplyClock`]) every pending request fails
//!   so, and the channel refuses later requests the same way (a runtime
//!   worker does not reconnect it: see `rpc_reply_timeout` in the
//!   backends' configs).

use std::time::{Duration, Instant};

use crate::addr::NodeId;

pub use dmkit_memnode::rpc::atomics;
pub use dmkit_memnode::rpc::{RpcFailure, ServiceId, ECHO};

/// The reply to one request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RpcReply {
    /// The id the caller gave [`RpcChannel::send`].
    pub id: u64,
    /// The reply's bytes, or why there is none.
    pub result: Result<Vec<u8>, RpcFailure>,
}

/// Why [`RpcChannel::send`] did not send a request.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RpcSendError {
    /// [`RpcChannel::capacity`] requests are unanswered: poll, then retry.
    #[error("the channel is full: poll replies first")]
    Full,
    /// The request cannot be sent (too large, or the channel is gone).
    #[error(transparent)]
    Refused(#[from] RpcFailure),
}

/// A channel from one thread to one memory node's RPC workers.
pub trait RpcChannel: Send {
    /// The memory node it reaches.
    fn node(&self) -> NodeId;

    /// Largest request or reply payload in bytes.
    fn max_message(&self) -> usize;

    /// Most requests that may be unanswered at once.
    fn capacity(&self) -> usize;

    /// Sends request `id` (the caller's; echoed in its reply) to `service`
    /// without blocking (see the module docs for the refusals).
    fn send(&mut self, id: u64, service: ServiceId, payload: &[u8]) -> Result<(), RpcSendError>;

    /// Moves the replies that arrived into `out`, in request order;
    /// returns how many.
    fn poll(&mut self, out: &mut Vec<RpcReply>) -> usize;

    /// Requests sent whose reply has not been polled.
    fn pending(&self) -> usize;

    /// Sends one request and waits for its reply (setup code and tools; a
    /// runtime task uses `Ctx::call`).
    ///
    /// # Panics
    /// If other requests are pending on the channel (their replies would
    /// be consumed here): programmer error.
    fn call(&mut self, service: ServiceId, payload: &[u8]) -> Result<Vec<u8>, RpcFailure> {
        assert_eq!(self.pending(), 0, "call() needs an idle channel");
        self.send(0, service, payload).map_err(|e| match e {
            RpcSendError::Full => unreachable!("an idle channel has room"),
            RpcSendError::Refused(f) => f,
        })?;
        let mut out = Vec::with_capacity(1);
        loop {
            if self.poll(&mut out) > 0 {
                return out.pop().expect("polled one").result;
            }
            std::hint::spin_loop();
        }
    }
}

/// A channel's reply clock, so no caller waits for ever on a node that
/// died or a reply that was lost: after every poll the channel tells it
/// how many replies came and whether requests are still unanswered; once
/// requests have waited `timeout` with no reply at all it answers
/// [`RpcFailure::NoReply`], and the channel closes with it (every pending
/// request fails so). Replies come in request order, so any reply means
/// the oldest request was answered and the wait starts again. The clock
/// is read once every [`ReplyClock::READ_EVERY`] empty polls (a poll of an
/// idle channel costs about as much as a reading): the wait starts at the
/// first reading after the last reply, so it fires between `timeout` and
/// `timeout` plus about 2 × `READ_EVERY` polls after that reply, and the
/// `waited_ms` it reports counts from that first reading.
#[derive(Debug, Clone)]
pub struct ReplyClock {
    timeout: Duration,
    empty_polls: u32,
    /// The first reading since the last reply, with requests unanswered.
    waiting_since: Option<Instant>,
}

impl ReplyClock {
    /// Empty polls between two readings of the clock.
    pub const READ_EVERY: u32 = 1024;

    /// A clock that gives up after `timeout` without a reply.
    pub fn new(timeout: Duration) -> Self {
        Self {
            timeout,
            empty_polls: 0,
            waiting_since: None,
        }
    }

    /// After a poll that found `replies` replies, with requests still
    /// unanswered or not: `Some(NoReply)` once they have waited too long.
    pub fn after_poll(&mut self, replies: usize, unanswered: bool) -> Option<RpcFailure> {
        if replies > 0 || !unanswered {
            self.empty_polls = 0;
            self.waiting_since = None;
            return None;
        }
        self.empty_polls += 1;
        if self.empty_polls < Self::READ_EVERY {
            return None;
        }
        self.empty_polls = 0;
        let now = Instant::now();
        match self.waiting_since {
            None => {
                self.waiting_since = Some(now);
                None
            }
            Some(t) => (now - t >= self.timeout).then(|| RpcFailure::NoReply {
                waited_ms: (now - t).as_millis() as u64,
            }),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn empty_polls(c: &mut ReplyClock, n: u32) -> Option<RpcFailure> {
        (0..n).find_map(|_| c.after_poll(0, true))
    }

    #[test]
    fn the_reply_clock_fires_after_its_timeout_and_a_reply_restarts_it() {
        let mut c = ReplyClock::new(Duration::from_millis(200));
        // Idle (nothing unanswered) never fires, however long.
        for _ in 0..3 * ReplyClock::READ_EVERY {
            assert_eq!(c.after_poll(0, false), None);
        }
        // The first reading starts the wait; within the timeout, nothing.
        assert_eq!(empty_polls(&mut c, ReplyClock::READ_EVERY), None);
        assert_eq!(empty_polls(&mut c, ReplyClock::READ_EVERY), None);
        std::thread::sleep(Duration::from_millis(250));
        // A reply restarts it: a reading after the sleep is a new start.
        assert_eq!(c.after_poll(1, true), None);
        assert_eq!(empty_polls(&mut c, ReplyClock::READ_EVERY), None);
        std::thread::sleep(Duration::from_millis(250));
        match empty_polls(&mut c, ReplyClock::READ_EVERY) {
            Some(RpcFailure::NoReply { waited_ms }) => assert!(waited_ms >= 200, "{waited_ms}"),
            other => panic!("no reply for 250 ms against a 200 ms clock: {other:?}"),
        }
    }
}
