//! CAS→WRITE on packets (`dmkit_switch::caswrite`), built from the CAS,
//! WRITE, ACK and atomic ACK that rxe sent (the codec's fixture): the
//! rewrites byte for byte against rxe's own packets of the target opcode,
//! and the state machine (learning, converting, answering, holding other
//! connections, coalesced ACKs, retransmissions, the quiet period).

use std::net::Ipv4Addr;

use dmkit_switch::caswrite::{self, CasWrite};
use dmkit_switch::wire::{self, opcode, Ext, RocePacket};

mod common;
use common::{acknowledge, fixture, fixtures, parse, sealed, through};

#[test]
fn a_cas_becomes_the_write_rxe_would_send_for_it() {
    let cas = fixture(opcode::COMPARE_SWAP);
    let Ext::Atomic {
        va, rkey, swap_add, ..
    } = cas.ext
    else {
        unreachable!()
    };
    let f = caswrite::cas_as_write(&cas).expect("a CAS converts");
    sealed(&f);
    let w = parse(&f);
    assert_eq!(w.bth.opcode, opcode::WRITE_ONLY);
    assert_eq!((w.bth.dest_qp, w.bth.psn), (cas.bth.dest_qp, cas.bth.psn));
    assert_eq!(w.bth.ack_req & 0x80, 0x80, "AckReq");
    assert_eq!(w.ext, Ext::Reth { va, rkey, len: 8 });
    assert_eq!(w.payload, swap_add.to_le_bytes(), "the server's byte order");
    assert_eq!(
        (&w.eth, w.ip.source, w.ip.destination),
        (&cas.eth, cas.ip.source, cas.ip.destination)
    );
    assert_eq!(
        cas.to_bytes().len() - f.len(),
        4,
        "4 bytes shorter (SwordBox §4.3)"
    );
    // Byte for byte what rxe sends for an 8-byte WRITE ONLY of this QP's
    // sender: take one of rxe's and give it the CAS's fields.
    let mut real = fixtures()
        .into_iter()
        .find(|p| {
            p.bth.opcode == opcode::WRITE_ONLY
                && p.ip.source == cas.ip.source
                && p.payload.len() >= 8
        })
        .expect("an rxe WRITE ONLY from the client");
    real.bth = w.bth;
    real.bth.flags = cas.bth.flags & !0x30;
    real.ext = w.ext;
    real.payload = swap_add.to_le_bytes().to_vec();
    real.ip.identification = cas.ip.identification;
    real.ip.dont_fragment = cas.ip.dont_fragment;
    real.ip.time_to_live = cas.ip.time_to_live;
    real.eth = cas.eth.clone();
    real.udp.source_port = cas.udp.source_port;
    wire::relength(&mut real).unwrap();
    let mut expect = real.to_bytes();
    wire::seal(&mut expect).unwrap();
    assert_eq!(f, expect);
}

#[test]
fn an_ack_becomes_the_atomic_ack_rxe_would_send() {
    let ack = fixture(opcode::ACKNOWLEDGE);
    let Ext::Aeth { syndrome, msn } = ack.ext else {
        unreachable!()
    };
    let f = caswrite::atomic_ack(&ack, 0x12345, 0xdead_beef_0000_0001).unwrap();
    sealed(&f);
    let a = parse(&f);
    assert_eq!(a.bth.opcode, opcode::ATOMIC_ACKNOWLEDGE);
    assert_eq!((a.bth.dest_qp, a.bth.psn), (ack.bth.dest_qp, 0x12345));
    assert_eq!(
        a.ext,
        Ext::AtomicAck {
            syndrome,
            msn,
            orig: 0xdead_beef_0000_0001
        }
    );
    // The shape of rxe's own atomic ACKs: same length, and equal byte
    // for byte once given the same fields.
    let mut real = fixture(opcode::ATOMIC_ACKNOWLEDGE);
    assert_eq!(f.len(), real.to_bytes().len());
    real.eth = ack.eth.clone();
    real.ip.source = ack.ip.source;
    real.ip.destination = ack.ip.destination;
    real.ip.identification = ack.ip.identification;
    real.ip.dont_fragment = ack.ip.dont_fragment;
    real.ip.time_to_live = ack.ip.time_to_live;
    real.udp.source_port = ack.udp.source_port;
    real.bth = a.bth;
    real.ext = a.ext;
    let mut expect = real.to_bytes();
    wire::seal(&mut expect).unwrap();
    assert_eq!(f, expect);
}

#[test]
fn unmodified_fixture_packets_keep_rxe_s_icrc_through_the_rewrite_helpers() {
    // relength on a packet whose shape did not change changes nothing.
    for p in fixtures() {
        let before = p.to_bytes();
        let mut q = p.clone();
        wire::relength(&mut q).unwrap();
        if before.len() >= 60 {
            assert_eq!(q.to_bytes(), before, "opcode {:#04x}", p.bth.opcode);
        }
    }
}

/// Two client connections (A: the fixture CAS's, B: another client IP)
/// to the node, and the switch.
struct Rig {
    cas: RocePacket,
    ack: RocePacket,
    write: RocePacket,
    read: RocePacket,
    sw: CasWrite,
    now: u64,
}

const A: [u8; 4] = [10, 77, 0, 11];
const B: [u8; 4] = [10, 77, 0, 12];
const QP_A: u32 = 0x11;
const QP_B: u32 = 0x12;
const RKEY: u32 = 0x4242;
const LOCK: u64 = 0x7f00_0000_1000;

impl Rig {
    fn new(quiet_us: u64) -> Rig {
        let cas = fixture(opcode::COMPARE_SWAP);
        let mut ack = fixture(opcode::ACKNOWLEDGE);
        ack.ip.source = cas.ip.destination;
        let mut write = fixture(opcode::WRITE_ONLY);
        write.ip.destination = cas.ip.destination;
        let mut read = fixture(opcode::READ_REQUEST);
        read.ip.destination = cas.ip.destination;
        let server = Ipv4Addr::from(cas.ip.destination);
        Rig {
            cas,
            ack,
            write,
            read,
            sw: CasWrite::new(server).with_quiet(quiet_us),
            now: 1,
        }
    }

    fn feed(&mut self, p: RocePacket) -> Vec<RocePacket> {
        through(p, |q, f, tag, out| {
            self.sw.on_packet(q, f, self.now, tag, out)
        })
    }

    /// Client `c` sends CAS(compare → swap) on the lock at `psn`.
    fn cas(&mut self, c: [u8; 4], psn: u32, compare: u64, swap: u64) -> Vec<RocePacket> {
        let mut p = self.cas.clone();
        p.ip.source = c;
        p.bth.dest_qp = if c == A { 0x100 } else { 0x200 };
        p.bth.psn = psn;
        p.ext = Ext::Atomic {
            va: LOCK,
            rkey: RKEY,
            swap_add: swap,
            compare,
        };
        self.feed(p)
    }

    /// Client `c` READs 8 bytes elsewhere at `psn`.
    fn read(&mut self, c: [u8; 4], psn: u32) -> Vec<RocePacket> {
        let mut p = self.read.clone();
        p.ip.source = c;
        p.bth.dest_qp = if c == A { 0x100 } else { 0x200 };
        p.bth.psn = psn;
        p.ext = Ext::Reth {
            va: LOCK + 64,
            rkey: RKEY,
            len: 8,
        };
        self.feed(p)
    }

    /// Client `c` WRITEs `v` to the lock word at `psn`.
    fn write(&mut self, c: [u8; 4], psn: u32, v: u64) -> Vec<RocePacket> {
        let mut p = self.write.clone();
        p.ip.source = c;
        p.bth.dest_qp = if c == A { 0x100 } else { 0x200 };
        p.bth.psn = psn;
        p.bth.flags &= !0x30;
        p.ext = Ext::Reth {
            va: LOCK,
            rkey: RKEY,
            len: 8,
        };
        p.payload = v.to_le_bytes().to_vec();
        self.feed(p)
    }

    /// The server answers client `c` at `psn`: an ACK (syndrome 0x1F), a
    /// NAK sequence error (0x60) or, with `orig`, an atomic ACK.
    fn answer(&mut self, c: [u8; 4], psn: u32, syndrome: u8, orig: Option<u64>) -> Vec<RocePacket> {
        let mut p = self.ack.clone();
        p.ip.destination = c;
        p.bth.dest_qp = if c == A { QP_A } else { QP_B };
        p.bth.psn = psn;
        acknowledge(&mut p, syndrome, orig);
        self.feed(p)
    }

    /// Learns the lock free: A's first CAS(0→1) passes, the server says 0;
    /// then A releases by CAS(1→0), converted. Leaves the lock free.
    fn learn_free(&mut self) {
        let out = self.cas(A, 10, 0, 1);
        assert_eq!(out[0].bth.opcode, opcode::COMPARE_SWAP, "unknown: passes");
        let out = self.answer(A, 10, 0x1F, Some(0));
        assert_eq!(out.len(), 1);
        let out = self.cas(A, 11, 1, 0);
        assert_eq!(out[0].bth.opcode, opcode::WRITE_ONLY);
        let out = self.answer(A, 11, 0x1F, None);
        assert_eq!(out.len(), 1);
        assert_eq!(out[0].bth.opcode, opcode::ATOMIC_ACKNOWLEDGE);
    }
}

fn orig(p: &RocePacket) -> u64 {
    match p.ext {
        Ext::AtomicAck { orig, .. } => orig,
        e => panic!("not an atomic ACK: {e:?}"),
    }
}

#[test]
fn a_cas_the_switch_knows_succeeds_reaches_the_server_as_a_write_and_returns_as_an_atomic_ack() {
    let mut r = Rig::new(0);
    // Unknown word: the CAS passes, its atomic ACK teaches the value.
    let out = r.cas(A, 10, 0, 1);
    assert_eq!((out.len(), out[0].bth.opcode), (1, opcode::COMPARE_SWAP));
    let out = r.answer(A, 10, 0x1F, Some(0));
    assert_eq!(orig(&out[0]), 0, "the real atomic ACK passes");
    // The lock is held by A now (1): A's release CAS(1→0) becomes a WRITE.
    let out = r.cas(A, 11, 1, 0);
    assert_eq!(out.len(), 1);
    let w = &out[0];
    assert_eq!(w.bth.opcode, opcode::WRITE_ONLY);
    assert_eq!(w.bth.psn, 11);
    assert_eq!(
        w.ext,
        Ext::Reth {
            va: LOCK,
            rkey: RKEY,
            len: 8
        }
    );
    assert_eq!(w.payload, 0u64.to_le_bytes());
    // The server's plain ACK is replaced by the atomic ACK: old value 1.
    let out = r.answer(A, 11, 0x1F, None);
    assert_eq!(out.len(), 1);
    assert_eq!(out[0].bth.opcode, opcode::ATOMIC_ACKNOWLEDGE);
    assert_eq!((out[0].bth.psn, orig(&out[0])), (11, 1));
    assert_eq!(out[0].bth.dest_qp, QP_A);
    // Acquire again: CAS(0→1) converts too.
    let out = r.cas(A, 12, 0, 1);
    assert_eq!(out[0].bth.opcode, opcode::WRITE_ONLY);
    assert_eq!(out[0].payload, 1u64.to_le_bytes());
    let s = r.sw.stats();
    assert_eq!(
        (s.cas, s.converted, s.passed_unknown, s.learned),
        (3, 2, 1, 1)
    );
}

#[test]
fn a_cas_the_switch_knows_fails_goes_to_the_server_as_a_cas() {
    let mut r = Rig::new(0);
    r.learn_free();
    let out = r.cas(A, 12, 0, 1); // A takes it: converted
    assert_eq!(out[0].bth.opcode, opcode::WRITE_ONLY);
    r.answer(A, 12, 0x1F, None);
    let out = r.cas(A, 13, 0, 1); // held by A: doomed, passes as a CAS
    assert_eq!(out[0].bth.opcode, opcode::COMPARE_SWAP);
    let out = r.answer(A, 13, 0x1F, Some(1));
    assert_eq!(orig(&out[0]), 1);
    let s = r.sw.stats();
    assert_eq!((s.passed_doomed, s.mispredictions), (1, 0));
}

#[test]
fn another_connection_waits_while_a_conversion_is_unanswered() {
    let mut r = Rig::new(0);
    r.learn_free();
    // B learns its response key on a READ first.
    assert_eq!(r.read(B, 500).len(), 1);
    assert_eq!(r.answer(B, 500, 0x1F, None).len(), 1);
    // A takes the lock (WRITE in flight); B's CAS must wait: rxe could
    // apply it before A's WRITE (another QP), see 0 and succeed.
    assert_eq!(r.cas(A, 12, 0, 1)[0].bth.opcode, opcode::WRITE_ONLY);
    assert!(r.cas(B, 501, 0, 2).is_empty(), "held");
    // ... with B's later requests behind it (B's order on its QP).
    assert!(r.read(B, 502).is_empty(), "held behind B's CAS");
    // The server ACKs A's WRITE: A gets its atomic ACK, then B's CAS is
    // decided against the new value (1: doomed, passes) and B's READ follows.
    let out = r.answer(A, 12, 0x1F, None);
    let ops: Vec<_> = out.iter().map(|p| (p.bth.opcode, p.bth.psn)).collect();
    assert_eq!(
        ops,
        [
            (opcode::ATOMIC_ACKNOWLEDGE, 12),
            (opcode::COMPARE_SWAP, 501),
            (opcode::READ_REQUEST, 502)
        ]
    );
    assert_eq!(r.sw.stats().held, 2);
}

#[test]
fn a_later_ack_covering_a_conversion_is_preceded_by_its_atomic_ack() {
    let mut r = Rig::new(0);
    r.learn_free();
    assert_eq!(r.cas(A, 12, 0, 1)[0].bth.opcode, opcode::WRITE_ONLY);
    assert_eq!(r.read(A, 13).len(), 1);
    assert_eq!(r.write(A, 14, 5).len(), 1, "a WRITE of the word passes");
    // The ACK of 12 is lost; the server's ACK of 14 covers it.
    let out = r.answer(A, 14, 0x1F, None);
    let ops: Vec<_> = out.iter().map(|p| (p.bth.opcode, p.bth.psn)).collect();
    assert_eq!(
        ops,
        [(opcode::ATOMIC_ACKNOWLEDGE, 12), (opcode::ACKNOWLEDGE, 14)]
    );
    assert_eq!(orig(&out[0]), 0);
    // The WRITE of 5 is what the switch knows now: CAS(5→0) converts.
    assert_eq!(r.cas(A, 15, 5, 0)[0].bth.opcode, opcode::WRITE_ONLY);
    assert_eq!(r.sw.stats().covered, 1);
}

#[test]
fn a_retransmitted_cas_is_sent_as_the_same_write_and_answered_again() {
    let mut r = Rig::new(0);
    r.learn_free();
    let first = r.cas(A, 12, 0, 1);
    assert_eq!(first[0].bth.opcode, opcode::WRITE_ONLY);
    assert_eq!(r.answer(A, 12, 0x1F, None).len(), 1);
    // The atomic ACK was lost: the client sends the CAS again; the switch
    // must not decide again (the word is 1 now: it would pass a CAS the
    // server has no atomic reply for).
    let again = r.cas(A, 12, 0, 1);
    assert_eq!(again[0].to_bytes(), first[0].to_bytes());
    // rxe answers a duplicate WRITE with an ACK of its latest PSN.
    let out = r.answer(A, 12, 0x1F, None);
    assert_eq!((out.len(), orig(&out[0])), (1, 0));
    assert_eq!(r.sw.stats().reconverted, 1);
}

#[test]
fn a_nak_for_a_conversion_passes_and_the_retransmission_is_answered() {
    let mut r = Rig::new(0);
    r.learn_free();
    assert_eq!(r.cas(A, 12, 0, 1)[0].bth.opcode, opcode::WRITE_ONLY);
    // PSN sequence error at 12: 12 was not executed; no atomic ACK.
    let out = r.answer(A, 12, 0x60, None);
    assert_eq!((out.len(), out[0].bth.opcode), (1, opcode::ACKNOWLEDGE));
    assert_eq!(r.cas(A, 12, 0, 1)[0].bth.opcode, opcode::WRITE_ONLY);
    let out = r.answer(A, 12, 0x1F, None);
    assert_eq!(
        (out[0].bth.opcode, orig(&out[0])),
        (opcode::ATOMIC_ACKNOWLEDGE, 0)
    );
}

#[test]
fn a_partial_write_of_the_word_makes_it_unknown() {
    let mut r = Rig::new(0);
    r.learn_free();
    let mut p = r.write.clone();
    p.ip.source = A;
    p.bth.dest_qp = 0x100;
    p.bth.psn = 12;
    p.bth.flags &= !0x30;
    p.ext = Ext::Reth {
        va: LOCK + 4,
        rkey: RKEY,
        len: 8,
    };
    p.payload = vec![1; 8];
    assert_eq!(r.feed(p).len(), 1);
    assert_eq!(r.cas(A, 13, 0, 1)[0].bth.opcode, opcode::COMPARE_SWAP);
    assert_eq!(r.sw.stats().invalidated, 1);
}

#[test]
fn a_hold_longer_than_its_limit_is_released_and_the_word_forgotten() {
    let mut r = Rig::new(0);
    r.learn_free();
    assert_eq!(r.cas(A, 12, 0, 1)[0].bth.opcode, opcode::WRITE_ONLY);
    assert!(r.cas(B, 700, 0, 2).is_empty());
    let mut out = Vec::new();
    r.sw.tick(r.now + caswrite::HOLD_US - 1, &mut out);
    assert!(out.is_empty());
    r.sw.tick(r.now + caswrite::HOLD_US, &mut out);
    assert_eq!(out.len(), 1);
    assert_eq!(parse(&out[0].1).bth.opcode, opcode::COMPARE_SWAP);
    let s = r.sw.stats();
    assert_eq!((s.hold_timeouts, s.words), (1, 0));
}

#[test]
fn after_a_start_plain_acks_at_unseen_psns_are_dropped_for_the_quiet_period() {
    let mut r = Rig::new(1000);
    // A plain ACK for a request this switch never saw (a conversion of a
    // switch before a restart, maybe): dropped, the client retransmits.
    assert!(r.read(B, 40).len() == 1);
    assert!(r.answer(A, 77, 0x1F, None).is_empty());
    assert_eq!(r.answer(B, 40, 0x1F, None).len(), 1, "seen: passes");
    r.now += 1000;
    assert_eq!(
        r.answer(A, 78, 0x1F, None).len(),
        1,
        "after the quiet period"
    );
    assert_eq!(r.sw.stats().quiet_dropped, 1);
}

#[test]
fn a_retransmitted_cas_that_passed_is_never_converted_later() {
    let mut r = Rig::new(0);
    r.learn_free();
    // B learns its response key, then A takes the lock (converted).
    assert_eq!(r.read(B, 500).len(), 1);
    assert_eq!(r.answer(B, 500, 0x1F, None).len(), 1);
    assert_eq!(r.cas(A, 12, 0, 1)[0].bth.opcode, opcode::WRITE_ONLY);
    assert_eq!(r.answer(A, 12, 0x1F, None).len(), 1);
    // B's CAS(0→2) is doomed and passes; the server fails it (orig 1), but
    // the atomic ACK to B is lost.
    assert_eq!(r.cas(B, 501, 0, 2)[0].bth.opcode, opcode::COMPARE_SWAP);
    assert_eq!(r.answer(B, 501, 0x1F, Some(1)).len(), 1);
    // A releases (converted): the switch knows the lock is free.
    assert_eq!(r.cas(A, 13, 1, 0)[0].bth.opcode, opcode::WRITE_ONLY);
    assert_eq!(r.answer(A, 13, 0x1F, None).len(), 1);
    // B's timer sends CAS 501 again. Converting it now would make B believe
    // it took the lock: the server answers a duplicate WRITE without
    // executing it, and the word stays 0. It must pass as the CAS it was.
    let out = r.cas(B, 501, 0, 2);
    assert_eq!(out[0].bth.opcode, opcode::COMPARE_SWAP);
    assert_eq!(
        r.answer(B, 501, 0x1F, Some(1)).len(),
        1,
        "the server replays orig 1"
    );
    // The switch still knows the lock is free: B's next CAS converts.
    assert_eq!(r.cas(B, 502, 0, 2)[0].bth.opcode, opcode::WRITE_ONLY);
    let s = r.sw.stats();
    assert_eq!(
        (s.retransmissions, s.reconverted, s.mispredictions),
        (1, 0, 0)
    );
}

#[test]
fn a_word_untouched_for_its_lifetime_is_forgotten() {
    let mut r = Rig::new(0);
    r.learn_free();
    let mut out = Vec::new();
    r.sw.tick(r.now + caswrite::WORD_TTL_US / 2, &mut out);
    assert_eq!(r.sw.stats().words, 1);
    r.sw.tick(r.now + caswrite::WORD_TTL_US + 100_000, &mut out);
    assert!(out.is_empty());
    assert_eq!(r.sw.stats().words, 0);
    // Unknown again: the next CAS passes and teaches it.
    assert_eq!(r.cas(A, 12, 0, 1)[0].bth.opcode, opcode::COMPARE_SWAP);
}
