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
//! packets; [`regions`]: the memory node's region table, which the
//! switch's control plane reads to translate the wire's NIC addresses into
//! the node's). Both reduce what they see to a [`Request`] and write the
//! [`Forward`] back. Not here: timing, the control plane's own connection
//! (`dmkit switch --node-ctl`).
//!
//! ## CAS→WRITE and multiplexing on the wire
//!
//! On the simulator the policy rewrites a lock CAS into a WRITE and moves
//! clients' requests onto its own connections ([`Mux`]). Between real
//! RNICs both change a packet's *connection*, and the receiving NIC checks
//! it: `rdma_rxe` accepts an RC request only on a QP that exists, whose
//! address vector names the packet's source IP (its address check), that
//! is the packet's destination QPN, and whose next expected PSN is the
//! packet's (its PSN check: an older PSN is a duplicate, a newer one is
//! NAKed as out of sequence). A CAS turned into a WRITE also needs a plain
//! ACK turned back into an atomic ACK carrying the value the client's
//! CAS expects (the switch knows it: the lock word was free, or it would
//! not have converted). What that takes:
//!
//! 1. **A queue pair of the switch's own on the server.** The switch's
//!    control plane asks the node for a node-side QP connected to an
//!    endpoint the switch makes up: its own IP's IPv4-mapped GID, a QPN
//!    and a start PSN of its choosing. The verbs control protocol has the
//!    request already (`Ctl::Connect { client }`: a node-side RC QP
//!    connected to any endpoint); the node's QP lives as long as the
//!    switch's control session. The server's NIC must resolve the
//!    switch's IP to a MAC, so the switch answers ARP for it.
//! 2. **Rewriting onto it.** Each client request the policy multiplexes
//!    leaves the switch with source IP and MAC = the switch's, destination
//!    QPN = the switch's QP on the server, PSN = that connection's next
//!    PSN (one sequence for all clients), resealed; the switch records
//!    (switch PSN → client connection, client PSN, original opcode).
//! 3. **Demultiplexing.** The server answers the switch: each ACK, atomic
//!    ACK or READ response is mapped back by its PSN (an ACK's MSN and
//!    coalescing cover several PSNs: one ACK becomes one per client
//!    connection, each with the client's own PSN and MSN), readdressed to
//!    the client (IP, MAC, client QPN) and resealed; a NAK sequence error
//!    on the switch's connection means the switch itself retransmits from
//!    its log (go-back-N, [`Mux`]'s rule), since the clients' PSNs did not
//!    go wrong.
//! 4. **Client retransmissions** of a multiplexed request must be answered
//!    from the switch's log, not forwarded again (the server would see a
//!    PSN it never got on that connection).
//!
//! Built: the policy (all four rules, on the simulator), the codec that
//! rewrites and reseals any header field, and CAS→WRITE on each client's
//! *own* connection ([`caswrite`], `dmkit switch --cas-to-write`): the
//! WRITE keeps the CAS's source IP, QPN and PSN, so the receiving rxe's
//! checks pass unchanged, and the switch restores its own order across
//! connections by holding a word's requests from other connections while
//! one is unanswered (rxe runs a task per QP and would otherwise apply two
//! clients' requests in either order). Step 1 is built too ([`ownqp`],
//! `dmkit switch --switch-ip`): the switch answers ARP for an address of
//! its own, its control plane asks the node for a QP connected to it.
//! Steps 2–4 are [`mux`] (`dmkit switch --mux`, with `--cas-to-write`
//! for CAS→WRITE on the moved connections). Which rxe checks a
//! multiplexed request must pass (drivers/infiniband/sw/rxe):
//! `rxe_recv.c`'s `hdr_check` finds the QP by the BTH's destination QPN,
//! then `check_addr` drops a packet whose IPv4 source is not the QP's
//! destination GID's address (and whose destination is not its source
//! GID's), `check_keys` one whose P_Key is not the QP's; the responder
//! (`rxe_resp.c`, `check_psn`) NAKs a PSN past the next expected one
//! (sequence error) and treats an earlier one as a duplicate, and
//! `check_op_seq` breaks the QP on a WRITE FIRST not followed by its
//! MIDDLE or LAST. So a request on the switch's QP carries the switch's
//! source IP, that QP's number and the switch's PSN; a client connection
//! moves whole from one PSN on (its own node-side QP would NAK a gap),
//! only once its QPN is known (from the node's first response to it) and
//! its direct requests are answered; and multi-packet WRITEs of two
//! clients never interleave. The [`mux`] module's docs say the rest.
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

pub mod caswrite;
pub mod clover;
pub mod hub;
pub mod mux;
pub mod onwire;
pub mod ownqp;
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
