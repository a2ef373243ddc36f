//! Connection multiplexing on packets (`dmkit_switch::mux`), built from
//! rxe's own packets (the codec's fixture): a connection moves whole onto
//! the switch's queue pair once paired and drained, its requests are
//! rewritten there (source, destination QPN, PSN), the node's responses
//! come back in the client's terms, and retransmissions, the node's
//! sequence NAKs, covering ACKs, interleaved multi-packet WRITEs and
//! CAS→WRITE on the moved connections do what the module says.

use std::net::Ipv4Addr;

use dmkit_switch::hub::{Core, Out};
use dmkit_switch::mux::{MuxConfig, MuxWire};
use dmkit_switch::ownqp::{OwnRemote, OWN_QPN};
use dmkit_switch::wire::{self, opcode, Ext, RocePacket};

mod common;
use common::{acknowledge, fixture, parse, sealed};

const SERVER: [u8; 4] = [10, 77, 0, 1];
const SWITCH: [u8; 4] = [10, 77, 0, 254];
const SWITCH_MAC: [u8; 6] = [2, 0, 10, 77, 0, 254];
const NODE_MAC: [u8; 6] = [0x52, 0x54, 0, 0x77, 0, 1];
const A: [u8; 4] = [10, 77, 0, 11];
const B: [u8; 4] = [10, 77, 0, 12];
/// Node-side QPNs of A's and B's connections, and the clients' QPNs.
const NQ_A: u32 = 0x100;
const NQ_B: u32 = 0x200;
const QP_A: u32 = 0x11;
const QP_B: u32 = 0x12;
/// The node-side QPN of the switch's queue pair, and its start PSN.
const NQ_SW: u32 = 0x77;
const S0: u32 = 0xFF_FFFE;
const RKEY: u32 = 0x4242;
const LOCK: u64 = 0x7f00_0000_1000;

fn mac(c: [u8; 4]) -> [u8; 6] {
    [0x52, 0x54, 0, 0x77, 0, c[3]]
}

struct Rig {
    cas: RocePacket,
    write: RocePacket,
    read: RocePacket,
    ack: RocePacket,
    rresp: RocePacket,
    /// The switch's core (ports: 0 the node, 1 client A, 2 client B), so
    /// every frame the multiplexer emits is also routed as `dmkit switch`
    /// routes it.
    sw: Core,
    /// Ports whose MAC the core has learned (they sent a frame).
    heard: [bool; 3],
}

/// The port an address sits behind.
fn port_of(ip: [u8; 4]) -> usize {
    match ip {
        SERVER => 0,
        A => 1,
        B => 2,
        other => panic!("no port for {other:?}"),
    }
}

impl Rig {
    fn new(cas_to_write: bool) -> Rig {
        let mut sw = MuxWire::new(MuxConfig {
            server: Ipv4Addr::from(SERVER),
            switch_ip: Ipv4Addr::from(SWITCH),
            mtu: 1024,
            cas_to_write,
        });
        sw.connected(OwnRemote {
            qpn: NQ_SW,
            psn: S0,
            va: 0,
            rkey: 0,
        });
        let sw = Core::new(vec!["mem".into(), "a".into(), "b".into()]).with_mux(sw);
        Rig {
            cas: fixture(opcode::COMPARE_SWAP),
            write: fixture(opcode::WRITE_ONLY),
            read: fixture(opcode::READ_REQUEST),
            ack: fixture(opcode::ACKNOWLEDGE),
            rresp: fixture(opcode::READ_RESPONSE_ONLY),
            sw,
            heard: [false; 3],
        }
    }

    fn mux(&self) -> &MuxWire {
        self.sw.mux().expect("the rig multiplexes")
    }

    fn feed(&mut self, mut p: RocePacket) -> Vec<RocePacket> {
        wire::relength(&mut p).unwrap();
        let mut f = p.to_bytes();
        wire::seal(&mut f).unwrap();
        let from = port_of(p.ip.source);
        let mut out = Vec::new();
        self.sw.process(from, &f, 0, &mut out);
        self.heard[from] = true;
        out.into_iter()
            .map(|(to, f)| {
                sealed(&f);
                let q = parse(&f);
                // Every frame leaves towards its destination: through the
                // destination's port once the core knows it, flooded
                // before; never dropped.
                let dest = port_of(q.ip.destination);
                if self.heard[dest] {
                    assert_eq!(to, Out::Port(dest), "{q:?}");
                } else {
                    assert!(matches!(to, Out::Flood | Out::FloodExcept(_)), "{to:?}");
                }
                q
            })
            .collect()
    }

    fn cas(&mut self, c: [u8; 4], psn: u32, compare: u64, swap: u64) -> Vec<RocePacket> {
        let mut p = client_req(self.cas.clone(), c, psn);
        p.ext = Ext::Atomic {
            va: LOCK,
            rkey: RKEY,
            swap_add: swap,
            compare,
        };
        self.feed(p)
    }

    fn read(&mut self, c: [u8; 4], psn: u32, len: u32) -> Vec<RocePacket> {
        let mut p = client_req(self.read.clone(), c, psn);
        p.ext = Ext::Reth {
            va: LOCK + 64,
            rkey: RKEY,
            len,
        };
        self.feed(p)
    }

    fn write_op(&mut self, c: [u8; 4], psn: u32, op: u8, va: u64, v: u64) -> Vec<RocePacket> {
        let mut p = client_req(self.write.clone(), c, psn);
        p.bth.opcode = op;
        p.bth.flags &= !0x30;
        p.ext = match op {
            opcode::WRITE_ONLY | opcode::WRITE_FIRST => Ext::Reth {
                va,
                rkey: RKEY,
                len: 8,
            },
            _ => Ext::None,
        };
        p.payload = v.to_le_bytes().to_vec();
        self.feed(p)
    }

    fn write(&mut self, c: [u8; 4], psn: u32, v: u64) -> Vec<RocePacket> {
        self.write_op(c, psn, opcode::WRITE_ONLY, LOCK + 128, v)
    }

    /// The node's response to `to` (a client: its QPN; or the switch) at
    /// `psn`: an ACK with `syndrome`, or an atomic ACK with `orig`.
    fn answer(
        &mut self,
        to: [u8; 4],
        psn: u32,
        syndrome: u8,
        orig: Option<u64>,
    ) -> Vec<RocePacket> {
        let mut p = self.ack.clone();
        p.eth.source = NODE_MAC;
        p.eth.destination = if to == SWITCH { SWITCH_MAC } else { mac(to) };
        p.ip.source = SERVER;
        p.ip.destination = to;
        p.bth.dest_qp = match to {
            A => QP_A,
            B => QP_B,
            _ => OWN_QPN,
        };
        p.bth.psn = psn;
        acknowledge(&mut p, syndrome, orig);
        self.feed(p)
    }

    fn read_response(&mut self, psn: u32, op: u8, data: u64) -> Vec<RocePacket> {
        let mut p = self.rresp.clone();
        p.eth.source = NODE_MAC;
        p.eth.destination = SWITCH_MAC;
        p.ip.source = SERVER;
        p.ip.destination = SWITCH;
        p.bth.dest_qp = OWN_QPN;
        p.bth.psn = psn;
        p.bth.opcode = op;
        p.bth.flags &= !0x30;
        p.ext = match op {
            opcode::READ_RESPONSE_MIDDLE => Ext::None,
            _ => Ext::Aeth {
                syndrome: 0x1F,
                msn: 3,
            },
        };
        p.payload = data.to_le_bytes().to_vec();
        self.feed(p)
    }

    /// Client `c` sends a WRITE at `psn` on its own connection, the node
    /// ACKs it: the switch learns the client's QPN. The next request moves.
    fn pair(&mut self, c: [u8; 4], psn: u32) {
        let out = self.write(c, psn, 1);
        assert_eq!(out.len(), 1);
        assert_eq!(out[0].bth.dest_qp, if c == A { NQ_A } else { NQ_B });
        assert_eq!(out[0].ip.source, c, "not moved before it is paired");
        let out = self.answer(c, psn, 0x1F, None);
        assert_eq!(out.len(), 1, "the direct ACK passes");
    }
}

fn client_req(mut p: RocePacket, c: [u8; 4], psn: u32) -> RocePacket {
    p.eth.source = mac(c);
    p.eth.destination = NODE_MAC;
    p.ip.source = c;
    p.ip.destination = SERVER;
    p.bth.dest_qp = if c == A { NQ_A } else { NQ_B };
    p.bth.psn = psn;
    p
}

fn psn(x: u32) -> u32 {
    x & 0xFF_FFFF
}

/// A request on the switch's queue pair at switch PSN `s`.
fn on_switch_qp(p: &RocePacket, s: u32) {
    assert_eq!(p.eth.source, SWITCH_MAC);
    assert_eq!(p.eth.destination, NODE_MAC);
    assert_eq!((p.ip.source, p.ip.destination), (SWITCH, SERVER));
    assert_eq!((p.bth.dest_qp, p.bth.psn), (NQ_SW, psn(s)));
}

/// A response to client `c`'s connection at client PSN `q`.
fn to_client(p: &RocePacket, c: [u8; 4], q: u32) {
    assert_eq!(p.eth.destination, mac(c));
    assert_eq!((p.ip.source, p.ip.destination), (SERVER, c));
    assert_eq!(
        (p.bth.dest_qp, p.bth.psn),
        (if c == A { QP_A } else { QP_B }, q)
    );
}

#[test]
fn a_paired_connection_moves_onto_the_switch_queue_pair_and_responses_map_back() {
    let mut r = Rig::new(false);
    r.pair(A, 100);
    let out = r.cas(A, 101, 0, 1);
    assert_eq!(out.len(), 1);
    on_switch_qp(&out[0], S0);
    assert_eq!(out[0].bth.opcode, opcode::COMPARE_SWAP);
    assert_eq!(
        out[0].ext,
        Ext::Atomic {
            va: LOCK,
            rkey: RKEY,
            swap_add: 1,
            compare: 0
        },
        "the node's rkey and address unchanged"
    );
    let out = r.read(A, 102, 8);
    on_switch_qp(&out[0], S0 + 1);
    // The switch's PSNs wrap at 24 bits: S0 + 2 is 0.
    let out = r.write(A, 103, 5);
    on_switch_qp(&out[0], 0);
    // The node answers the switch; each response goes to A in its terms.
    let out = r.answer(SWITCH, S0, 0x1F, Some(0));
    assert_eq!(out.len(), 1);
    to_client(&out[0], A, 101);
    assert_eq!(out[0].bth.opcode, opcode::ATOMIC_ACKNOWLEDGE);
    let out = r.read_response(psn(S0 + 1), opcode::READ_RESPONSE_ONLY, 77);
    to_client(&out[0], A, 102);
    assert_eq!(out[0].payload, 77u64.to_le_bytes());
    let out = r.answer(SWITCH, 0, 0x1F, None);
    to_client(&out[0], A, 103);
    assert_eq!(out[0].bth.opcode, opcode::ACKNOWLEDGE);
    let s = r.mux().stats();
    assert_eq!(
        (s.connections, s.moved, s.mapped, s.responses),
        (1, 1, 3, 3)
    );
    assert_eq!(r.mux().moved(), vec![((A, NQ_A), 101)]);
}

#[test]
fn a_connection_moves_only_after_its_direct_requests_are_answered() {
    let mut r = Rig::new(false);
    r.pair(A, 100);
    // Pipelined: 101 direct... no: the first new request after pairing
    // starts the drain; 101 and 102 wait while 100's answer is pending.
    let out = r.write(A, 101, 1);
    on_switch_qp(&out[0], S0);
    // B: paired, then a direct request unanswered when the next comes.
    let out = r.write(B, 50, 1);
    assert_eq!(out[0].bth.dest_qp, NQ_B);
    let out = r.answer(B, 50, 0x1F, None);
    assert_eq!(out.len(), 1);
    // B's 51 moves at once (50 answered).
    let out = r.write(B, 51, 1);
    on_switch_qp(&out[0], S0 + 1);
    let mut r = Rig::new(false);
    // C (= B here) sends 50 and 51 before any answer: 51 is direct too
    // (unpaired); then 52 comes after the answer to 50 only.
    r.write(B, 50, 1);
    r.write(B, 51, 1);
    r.answer(B, 50, 0x1F, None);
    let out = r.write(B, 52, 1);
    assert!(out.is_empty(), "held: 51 unanswered on B's own QP");
    let out = r.read(B, 53, 8);
    assert!(out.is_empty(), "behind 52");
    // 51's ACK passes, and the held requests follow on the switch's QP.
    let out = r.answer(B, 51, 0x1F, None);
    assert_eq!(out.len(), 3);
    to_client(&out[0], B, 51);
    on_switch_qp(&out[1], S0);
    on_switch_qp(&out[2], S0 + 1);
    assert_eq!(out[2].bth.opcode, opcode::READ_REQUEST);
    assert_eq!(r.mux().moved(), vec![((B, NQ_B), 52)]);
    assert_eq!(r.mux().stats().held, 2);
}

#[test]
fn a_long_read_takes_one_switch_psn_per_mtu() {
    let mut r = Rig::new(false);
    r.pair(A, 10);
    let out = r.read(A, 11, 3000);
    on_switch_qp(&out[0], S0);
    let out = r.write(A, 14, 1);
    on_switch_qp(&out[0], psn(S0 + 3));
    // FIRST, MIDDLE, LAST map to 11, 12, 13.
    let f = r.read_response(S0, opcode::READ_RESPONSE_FIRST, 1);
    to_client(&f[0], A, 11);
    let m = r.read_response(psn(S0 + 1), opcode::READ_RESPONSE_MIDDLE, 2);
    to_client(&m[0], A, 12);
    let l = r.read_response(psn(S0 + 2), opcode::READ_RESPONSE_LAST, 3);
    to_client(&l[0], A, 13);
    // A retransmits the READ: answered from the log, all three again.
    let again = r.read(A, 11, 3000);
    assert_eq!(again.len(), 3);
    assert_eq!(
        again.iter().map(|p| p.bth.psn).collect::<Vec<_>>(),
        vec![11, 12, 13]
    );
    assert_eq!(r.mux().stats().replayed, 1);
}

/// The lost-response case that hung CI's multiplexed lockcheck: the node
/// answered a moved CAS, the answer never reached the client, and every
/// retransmission was answered from the log *tagged with the client's own
/// port*, so the forwarding dropped each replay (9 580 of them) while the
/// client, whose rxe takes a retry count of 7 as unlimited, retransmitted
/// for ever. The replay now leaves as the node's frame, towards the client.
#[test]
fn a_retransmitted_cas_answered_before_is_replayed_to_its_client() {
    for cas_to_write in [false, true] {
        let mut r = Rig::new(cas_to_write);
        r.pair(A, 10);
        let out = r.cas(A, 11, 0, 5);
        assert_eq!(out.len(), 1);
        on_switch_qp(&out[0], S0);
        assert_eq!(
            out[0].bth.opcode,
            opcode::COMPARE_SWAP,
            "a CAS the switch cannot predict passes"
        );
        let ack = r.answer(SWITCH, S0, 0x1F, Some(0));
        assert_eq!(ack.len(), 1);
        to_client(&ack[0], A, 11);
        // That answer is lost; A's timer retransmits the CAS, twice.
        for n in 1..=2 {
            let again = r.cas(A, 11, 0, 5);
            assert_eq!(
                again.len(),
                1,
                "answered from the log, not sent to the node"
            );
            to_client(&again[0], A, 11);
            assert!(
                matches!(again[0].ext, Ext::AtomicAck { orig: 0, .. }),
                "{:?}",
                again[0].ext
            );
            assert_eq!(r.mux().stats().replayed, n);
        }
    }
}

#[test]
fn an_unanswered_retransmission_is_sent_again_at_its_switch_psn() {
    let mut r = Rig::new(false);
    r.pair(A, 10);
    let first = r.cas(A, 11, 0, 1);
    r.write(A, 12, 3);
    let again = r.cas(A, 11, 0, 1);
    assert_eq!(again, first, "the same frame at the same switch PSN");
    let again = r.write(A, 12, 3);
    on_switch_qp(&again[0], psn(S0 + 1));
    // A direct retransmission (before the move) stays on A's own QP.
    let out = r.write(A, 10, 1);
    assert_eq!((out[0].ip.source, out[0].bth.dest_qp), (A, NQ_A));
    assert_eq!(r.mux().stats().resent, 2);
}

#[test]
fn a_sequence_nak_on_the_switch_queue_pair_resends_from_its_psn() {
    let mut r = Rig::new(false);
    r.pair(A, 10);
    r.pair(B, 20);
    r.write(A, 11, 1); // S0
    r.write(B, 21, 1); // S0+1
    r.read(A, 12, 8); // 0
                      // The node got S0 but not S0+1: it NAKs a sequence error at S0+1.
    let out = r.answer(SWITCH, S0, 0x1F, None);
    to_client(&out[0], A, 11);
    let out = r.answer(SWITCH, psn(S0 + 1), 0x60, None);
    assert_eq!(out.len(), 2, "S0+1 and 0 again; nothing to the clients");
    on_switch_qp(&out[0], psn(S0 + 1));
    on_switch_qp(&out[1], 0);
    assert_eq!(out[0].ip.source, SWITCH);
    let s = r.mux().stats();
    assert_eq!((s.seq_naks, s.gbn_resent), (1, 2));
}

#[test]
fn a_plain_ack_naming_a_read_never_reaches_its_client_but_covers_earlier_writes() {
    let mut r = Rig::new(false);
    r.pair(A, 10);
    r.pair(B, 20);
    r.write(A, 11, 1); // S0, WRITE
    r.read(B, 21, 8); // S0+1, READ
                      // The node ACKs S0+1 (as it does for a duplicate WRITE: its latest
                      // PSN), A's ACK having been lost: A gets an ACK at 11, B nothing.
    let out = r.answer(SWITCH, psn(S0 + 1), 0x1F, None);
    assert_eq!(out.len(), 1);
    to_client(&out[0], A, 11);
    assert_eq!(out[0].bth.opcode, opcode::ACKNOWLEDGE);
    // B's READ response still comes through.
    let out = r.read_response(psn(S0 + 1), opcode::READ_RESPONSE_ONLY, 9);
    assert_eq!(out.len(), 1);
    to_client(&out[0], B, 21);
    assert_eq!(r.mux().stats().covering_acks, 1);
}

#[test]
fn another_connection_waits_while_a_multi_packet_write_is_under_way() {
    let mut r = Rig::new(false);
    r.pair(A, 10);
    r.pair(B, 20);
    let out = r.write_op(A, 11, opcode::WRITE_FIRST, LOCK + 256, 1);
    on_switch_qp(&out[0], S0);
    // rxe's check_op_seq would break the switch's QP on a WRITE ONLY
    // after a WRITE FIRST: B waits.
    let out = r.write(B, 21, 2);
    assert!(out.is_empty());
    let out = r.write_op(A, 12, opcode::WRITE_MIDDLE, 0, 1);
    on_switch_qp(&out[0], psn(S0 + 1));
    let out = r.write_op(A, 13, opcode::WRITE_LAST, 0, 1);
    assert_eq!(out.len(), 2, "A's LAST, then B's WRITE");
    on_switch_qp(&out[0], 0);
    assert_eq!(out[0].bth.opcode, opcode::WRITE_LAST);
    on_switch_qp(&out[1], 1);
    assert_eq!(out[1].ip.source, SWITCH);
    assert_eq!(out[1].bth.opcode, opcode::WRITE_ONLY);
}

#[test]
fn a_nak_other_than_sequence_goes_to_the_client_whose_request_caused_it() {
    let mut r = Rig::new(false);
    r.pair(A, 10);
    r.pair(B, 20);
    r.write(A, 11, 1);
    r.write(B, 21, 1);
    // Remote access error at S0+1: A's S0 is implicitly done.
    let out = r.answer(SWITCH, psn(S0 + 1), 0x62, None);
    assert_eq!(out.len(), 2);
    to_client(&out[0], A, 11);
    to_client(&out[1], B, 21);
    assert_eq!(
        out[1].ext,
        Ext::Aeth {
            syndrome: 0x62,
            msn: 9
        }
    );
}

#[test]
fn cas_to_write_on_moved_connections_needs_no_holding() {
    let mut r = Rig::new(true);
    r.pair(A, 10);
    r.pair(B, 20);
    // Unknown word: A's CAS passes; its atomic ACK teaches "was 0, now 1".
    let out = r.cas(A, 11, 0, 1);
    assert_eq!(out[0].bth.opcode, opcode::COMPARE_SWAP);
    r.answer(SWITCH, S0, 0x1F, Some(0));
    // B's CAS(0 → 2) is doomed: goes as a CAS (no wait for A).
    let out = r.cas(B, 21, 0, 2);
    on_switch_qp(&out[0], psn(S0 + 1));
    assert_eq!(out[0].bth.opcode, opcode::COMPARE_SWAP);
    // A releases with CAS(1 → 0): known to succeed, a WRITE of 0.
    let out = r.cas(A, 12, 1, 0);
    on_switch_qp(&out[0], 0);
    assert_eq!(out[0].bth.opcode, opcode::WRITE_ONLY);
    assert_eq!(
        out[0].ext,
        Ext::Reth {
            va: LOCK,
            rkey: RKEY,
            len: 8
        }
    );
    assert_eq!(out[0].payload, 0u64.to_le_bytes());
    // B's next CAS(0 → 2) is sent before any answer: the node applies the
    // switch's order on its one QP, so it converts right away.
    let out = r.cas(B, 22, 0, 2);
    on_switch_qp(&out[0], 1);
    assert_eq!(out[0].bth.opcode, opcode::WRITE_ONLY);
    // Answers: B's doomed CAS (value 1), A's WRITE's ACK → atomic ACK 1.
    let out = r.answer(SWITCH, psn(S0 + 1), 0x1F, Some(1));
    to_client(&out[0], B, 21);
    let out = r.answer(SWITCH, 0, 0x1F, None);
    assert_eq!(out.len(), 1);
    to_client(&out[0], A, 12);
    assert_eq!(out[0].bth.opcode, opcode::ATOMIC_ACKNOWLEDGE);
    assert_eq!(
        out[0].ext,
        Ext::AtomicAck {
            syndrome: 0x1F,
            msn: 9,
            orig: 1
        }
    );
    // One ACK at 1 covers nothing else; B gets its atomic ACK with 0.
    let out = r.answer(SWITCH, 1, 0x1F, None);
    to_client(&out[0], B, 22);
    assert_eq!(
        out[0].ext,
        Ext::AtomicAck {
            syndrome: 0x1F,
            msn: 9,
            orig: 0
        }
    );
    let s = r.mux().stats();
    assert_eq!((s.cas, s.converted, s.atomic_acks, s.learned), (4, 2, 2, 1));
    assert_eq!(s.mispredictions, 0);
}

#[test]
fn a_coalesced_ack_answers_each_converted_cas_with_its_atomic_ack_in_order() {
    let mut r = Rig::new(true);
    r.pair(A, 10);
    r.cas(A, 11, 0, 1);
    r.answer(SWITCH, S0, 0x1F, Some(0));
    r.cas(A, 12, 1, 0); // S0+1, WRITE
    r.cas(A, 13, 0, 1); // 0, WRITE
    let out = r.answer(SWITCH, 0, 0x1F, None);
    assert_eq!(out.len(), 2);
    to_client(&out[0], A, 12);
    to_client(&out[1], A, 13);
    assert!(out
        .iter()
        .all(|p| p.bth.opcode == opcode::ATOMIC_ACKNOWLEDGE));
    assert_eq!(
        out.iter()
            .map(|p| match p.ext {
                Ext::AtomicAck { orig, .. } => orig,
                _ => unreachable!(),
            })
            .collect::<Vec<_>>(),
        vec![1, 0]
    );
}

#[test]
fn a_direct_request_to_a_word_waits_while_moved_ones_are_unanswered() {
    let mut r = Rig::new(true);
    r.pair(A, 10);
    r.cas(A, 11, 0, 1);
    r.answer(SWITCH, S0, 0x1F, Some(0));
    let out = r.cas(A, 12, 1, 0);
    assert_eq!(out[0].bth.opcode, opcode::WRITE_ONLY, "converted");
    // B is new (unpaired: direct); its CAS to the word waits for A's WRITE.
    let out = r.cas(B, 30, 0, 2);
    assert!(out.is_empty(), "held");
    let out = r.answer(SWITCH, psn(S0 + 1), 0x1F, None);
    assert_eq!(out.len(), 2);
    to_client(&out[0], A, 12);
    assert_eq!((out[1].ip.source, out[1].bth.dest_qp), (B, NQ_B));
    assert_eq!(
        out[1].bth.opcode,
        opcode::COMPARE_SWAP,
        "direct: a real CAS"
    );
    // While B's direct CAS is unanswered, A's CAS is not converted.
    let out = r.cas(A, 13, 0, 1);
    assert_eq!(out[0].bth.opcode, opcode::COMPARE_SWAP);
}

#[test]
fn a_connection_that_sends_sends_stays_on_its_own_qp() {
    let mut r = Rig::new(false);
    let mut send = client_req(r.write.clone(), A, 40);
    send.bth.opcode = opcode::SEND_ONLY;
    send.ext = Ext::None;
    let out = r.feed(send.clone());
    assert_eq!((out[0].ip.source, out[0].bth.dest_qp), (A, NQ_A));
    r.answer(A, 40, 0x1F, None);
    // Paired now, but it sent a SEND: its next requests stay direct.
    let out = r.write(A, 41, 1);
    assert_eq!(
        (out[0].ip.source, out[0].bth.dest_qp, out[0].bth.psn),
        (A, NQ_A, 41)
    );
    send.bth.psn = 42;
    let out = r.feed(send);
    assert_eq!((out[0].ip.source, out[0].bth.dest_qp), (A, NQ_A));
    // The node's own SEND to A (an RPC reply) and A's ACK of it pass as
    // they are, and do not pair or drain anything.
    let mut reply = r.ack.clone();
    reply.eth.source = NODE_MAC;
    reply.eth.destination = mac(A);
    reply.ip.source = SERVER;
    reply.ip.destination = A;
    reply.bth.opcode = opcode::SEND_ONLY;
    reply.bth.dest_qp = QP_A;
    reply.bth.psn = 900;
    reply.ext = Ext::None;
    let out = r.feed(reply.clone());
    assert_eq!(out.len(), 1);
    assert_eq!(
        (out[0].bth.opcode, out[0].bth.psn),
        (opcode::SEND_ONLY, 900)
    );
    let mut ack = client_req(r.ack.clone(), A, 900);
    ack.ext = Ext::Aeth {
        syndrome: 0x1F,
        msn: 1,
    };
    let out = r.feed(ack);
    assert_eq!(
        (out[0].bth.opcode, out[0].ip.source),
        (opcode::ACKNOWLEDGE, A)
    );
    let s = r.mux().stats();
    assert_eq!((s.moved, s.mapped, s.pinned, s.sends_dropped), (0, 0, 1, 0));
    assert!(r.mux().moved().is_empty());
}

#[test]
fn a_connection_paired_in_the_middle_of_a_write_moves_at_the_next_message() {
    let mut r = Rig::new(false);
    let out = r.write_op(A, 10, opcode::WRITE_FIRST, LOCK + 256, 1);
    assert_eq!(out[0].bth.dest_qp, NQ_A);
    r.write_op(A, 11, opcode::WRITE_MIDDLE, 0, 1);
    // rxe's requester asks for an ACK mid-message (every 64 packets): it
    // pairs the connection, but the rest of the WRITE stays direct.
    r.answer(A, 11, 0x1F, None);
    let out = r.write_op(A, 12, opcode::WRITE_MIDDLE, 0, 1);
    assert_eq!((out[0].ip.source, out[0].bth.dest_qp), (A, NQ_A));
    let out = r.write_op(A, 13, opcode::WRITE_LAST, 0, 1);
    assert_eq!((out[0].ip.source, out[0].bth.dest_qp), (A, NQ_A));
    // The next message waits for 13's ACK, then moves.
    let out = r.write(A, 14, 2);
    assert!(out.is_empty(), "draining");
    let out = r.answer(A, 13, 0x1F, None);
    assert_eq!(out.len(), 2);
    to_client(&out[0], A, 13);
    on_switch_qp(&out[1], S0);
    assert_eq!(r.mux().moved(), vec![((A, NQ_A), 14)]);
}
