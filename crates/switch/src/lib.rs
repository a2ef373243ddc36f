//! # dmkit-switch — SwordBox's policy at the top-of-rack switch
//!
//! SwordBox (NSDI'24 submission) observes that in a rack the top-of-rack
//! switch already puts every request bound for a memory node in one total
//! order, and uses that order to resolve races of one-sided RDMA in
//! flight. This crate is its policy, written once as plain code with no
//! I/O: it sees requests and responses ([`packet`]) and decides how each
//! is forwarded ([`Switch`]): connection tracking and multiplexing with
//! ACK demultiplexing and go-back-N (§4.1, §4.5), CAS→WRITE for lock words
//! (§4.3, §4.4.1), steering of Clover's appends and reads with partial
//! steering (§4.4.2), and failure handling (§4.5). Every technique is a
//! switch of [`SwitchConfig`].
//!
//! Who feeds it: the simulator's switch position (`dmkit-sim`, with a
//! per-packet cost and the memory node's reordering after the switch) and
//! `dmkit switch` on RoCEv2 packets between Soft-RoCE guests ([`wire`]:
//! the codec; [`hub`]: the learning switch; [`onwire`]: the policy on
//! packets). Both reduce what they
//! see to a [`Request`] and write the [`Forward`] back. Not here: packets,
//! timing, the control plane's own connection.
//!
//! ```
//! use dmkit_switch::{clover, Request, Steer, Switch, SwitchConfig, Verb};
//!
//! let mut sw = Switch::new(SwitchConfig { steer: Steer::Write, ..Default::default() });
//! // Appends to Clover key 7 (compare: the tail's empty word; swap: a link).
//! let cas = |psn, at: u64, new: u64| Request {
//!     conn: 1,
//!     psn,
//!     dest: 0,
//!     verb: Verb::Cas {
//!         addr: at,
//!         compare: clover::empty_word(7, true),
//!         swap: new >> 6 | 1 << 62,
//!     },
//! };
//! // Unknown key: the first append passes unmodified.
//! let f = sw.on_request(&cas(1, 64, 128), 0);
//! assert_eq!(f.verb.addr(), 64);
//! ```

#![warn(missing_docs)]

pub mod clover;
pub mod hub;
pub mod onwire;
pub mod packet;
pub mod policy;
pub mod regions;
pub mod wire;

pub use packet::{
    Action, ConnId, Delivery, Dest, Forward, Request, RespKind, Response, Token, Verb,
};
pub use policy::{mux_conn, Mux, Steer, Switch, SwitchConfig, SwitchStats};

#[cfg(test)]
mod tests;
