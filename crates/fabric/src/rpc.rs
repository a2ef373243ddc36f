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
//!   [`RpcFailure::ConnectionLost`] or [`RpcFailure::NoReply`] (a
//!   transport's own reply clock, the verbs backend's) every pending
//!   request fails so.

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
