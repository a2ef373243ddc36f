//! The policy on packets (`dmkit_switch::onwire`): Clover appends built
//! from a CAS and an atomic ACK that rxe sent (the codec's fixture), with
//! Clover's words in their operands.

use std::net::Ipv4Addr;

use dmkit_switch::onwire::OnWire;
use dmkit_switch::wire::{self, opcode, Ext, Frame, RocePacket};
use dmkit_switch::{clover, Steer, SwitchConfig};
use pcap_file::pcap::PcapReader;

fn fixture(op: u8) -> RocePacket {
    let f = std::fs::File::open(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/fixtures/rxe.pcap"
    ))
    .unwrap();
    let mut r = PcapReader::new(f).unwrap();
    while let Some(p) = r.next_packet() {
        let d = p.unwrap().data.into_owned();
        if let Ok(Frame::Roce(p, _)) = wire::parse(&d) {
            if p.bth.opcode == op {
                return p;
            }
        }
    }
    panic!("no {op:#04x}")
}

const DELTA: u64 = 0x7f12_3400_0000;
const RKEY: u32 = 0x1234;
const KEY: u64 = 42;

fn off(i: u64) -> u64 {
    0x10000 + i * 0x1000
}

fn link(i: u64) -> u64 {
    1 << 62 | off(i) >> 6
}

struct Rig {
    cas: RocePacket,
    ack: RocePacket,
    sw: OnWire,
    server: Ipv4Addr,
}

impl Rig {
    fn new() -> Rig {
        let cas = fixture(opcode::COMPARE_SWAP);
        let mut ack = fixture(opcode::ATOMIC_ACKNOWLEDGE);
        ack.ip.source = cas.ip.destination;
        ack.ip.destination = cas.ip.source;
        let server = Ipv4Addr::from(cas.ip.destination);
        let sw = OnWire::new(
            SwitchConfig {
                steer: Steer::Write,
                ..Default::default()
            },
            server,
        );
        Rig {
            cas,
            ack,
            sw,
            server,
        }
    }

    fn send(&mut self, p: &RocePacket) -> Vec<Vec<u8>> {
        let mut f = p.to_bytes();
        wire::seal(&mut f).unwrap();
        let Ok(Frame::Roce(q, raw)) = wire::parse(&f) else {
            unreachable!()
        };
        let mut out = Vec::new();
        self.sw.on_packet(q, raw, 0, &mut out);
        out
    }

    /// An append naming version `at` (its address on the wire), linking `new`.
    fn append(&mut self, psn: u32, at: u64, new: u64) -> Vec<Vec<u8>> {
        let mut p = self.cas.clone();
        p.bth.psn = psn;
        p.ext = Ext::Atomic {
            va: DELTA + off(at),
            rkey: RKEY,
            swap_add: link(new),
            compare: clover::empty_word(KEY, true),
        };
        self.send(&p)
    }

    fn acked(&mut self, psn: u32, ok: bool) -> Vec<Vec<u8>> {
        let mut p = self.ack.clone();
        p.bth.psn = psn;
        p.bth.dest_qp = 0x77;
        let Ext::AtomicAck { syndrome, msn, .. } = p.ext else {
            unreachable!()
        };
        let e = clover::empty_word(KEY, true);
        p.ext = Ext::AtomicAck {
            syndrome,
            msn,
            orig: if ok { e } else { link(99) },
        };
        self.send(&p)
    }
}

fn va_of(f: &[u8]) -> (u64, u32) {
    let Ok(Frame::Roce(p, raw)) = wire::parse(f) else {
        unreachable!()
    };
    assert_eq!(wire::icrc(raw), Some(p.icrc), "every frame out is sealed");
    match p.ext {
        Ext::Atomic { va, rkey, .. } => (va, rkey),
        e => panic!("{e:?}"),
    }
}

#[test]
fn appends_teach_the_translation_then_a_stale_append_is_steered_to_the_tail() {
    let mut r = Rig::new();
    assert_eq!(Ipv4Addr::from(r.cas.ip.destination), r.server);
    // A chain grows 0 → 1 → 2 → ...; each append names the tail and succeeds.
    let mut psn = 100;
    for i in 0..6 {
        let out = r.append(psn, i, i + 1);
        assert_eq!(out.len(), 1);
        assert_eq!(va_of(&out[0]), (DELTA + off(i), RKEY), "passes unmodified");
        assert_eq!(r.acked(psn, true).len(), 1, "its ACK passes");
        psn += 1;
    }
    let s = r.sw.stats();
    assert_eq!(s.regions_learned, 1, "{s:?}");
    assert!(s.untranslated >= 2 && s.untranslated < 6, "{s:?}");
    // A reader reads the tail (the switch sees version 6's address under
    // the rkey: its region reaches that far).
    let mut read = fixture(opcode::READ_REQUEST);
    read.ip.source = r.cas.ip.source;
    read.ip.destination = r.cas.ip.destination;
    read.bth.dest_qp = r.cas.bth.dest_qp;
    read.bth.psn = psn;
    read.ext = Ext::Reth {
        va: DELTA + off(6),
        rkey: RKEY,
        len: 64,
    };
    assert_eq!(r.send(&read).len(), 1);
    psn += 1;
    // A client with a stale hint names version 3; the tail is 6.
    let out = r.append(psn, 3, 50);
    assert_eq!(out.len(), 1);
    assert_eq!(
        va_of(&out[0]),
        (DELTA + off(6), RKEY),
        "steered to the tail, in wire addresses: {:?}",
        r.sw.stats()
    );
    let s = r.sw.stats();
    assert_eq!(
        (s.steered_cas, s.rewritten, s.outside_regions),
        (1, 1, 0),
        "{s:?}"
    );
}

#[test]
fn a_steer_beyond_the_regions_seen_is_not_applied_and_counted() {
    let mut r = Rig::new();
    let mut psn = 7;
    for i in 0..6 {
        r.append(psn, i, i + 1);
        r.acked(psn, true);
        psn += 1;
    }
    // Version 6 was never named on the wire: the switch cannot know its
    // rkey, so the stale append goes where its client sent it.
    let out = r.append(psn, 3, 50);
    assert_eq!(va_of(&out[0]), (DELTA + off(3), RKEY));
    let s = r.sw.stats();
    assert_eq!(
        (s.steered_cas, s.rewritten, s.outside_regions),
        (1, 0, 1),
        "{s:?}"
    );
}
