//! The policy on packets (`dmkit_switch::onwire`): Clover appends built
//! from a CAS and an atomic ACK that rxe sent (the codec's fixture), with
//! Clover's words in their operands.

use std::net::Ipv4Addr;

use dmkit_switch::onwire::OnWire;
use dmkit_switch::regions::{access, RegionTable, WireRegion};
use dmkit_switch::wire::{self, opcode, Ext, Frame, RocePacket};
use dmkit_switch::{clover, Steer, SwitchConfig};

mod common;
use common::fixture;

/// The node's heap region as its NIC registered it: offset `o` is NIC
/// address `NIC + o - BASE` under `RKEY`.
const NIC: u64 = 0x7f12_3400_0000;
const BASE: u64 = 0x1000;
const RKEY: u32 = 0x1234;
const KEY: u64 = 42;

fn table() -> RegionTable {
    RegionTable::new(
        0,
        vec![WireRegion {
            rkey: RKEY,
            addr: NIC,
            base: BASE,
            len: 1 << 20,
            access: access::READ | access::WRITE | access::ATOMIC,
        }],
    )
}

fn off(i: u64) -> u64 {
    0x10000 + i * 0x1000
}

fn wire_addr(i: u64) -> u64 {
    NIC + off(i) - BASE
}

fn link(i: u64) -> u64 {
    1 << 62 | off(i) >> 6
}

struct Rig {
    cas: RocePacket,
    ack: RocePacket,
    sw: OnWire,
    server: Ipv4Addr,
    now: u64,
}

impl Rig {
    /// A switch with a control plane (requests under unknown keys park);
    /// `table`: whether the node's table is installed already.
    fn new(table_now: bool) -> Rig {
        let cas = fixture(opcode::COMPARE_SWAP);
        let mut ack = fixture(opcode::ATOMIC_ACKNOWLEDGE);
        ack.ip.source = cas.ip.destination;
        ack.ip.destination = cas.ip.source;
        let server = Ipv4Addr::from(cas.ip.destination);
        let mut sw = OnWire::new(
            SwitchConfig {
                steer: Steer::Write,
                ..Default::default()
            },
            server,
        )
        .with_control(1000);
        if table_now {
            let mut out = Vec::new();
            sw.install(table(), 0, &mut out);
            assert!(out.is_empty());
        }
        Rig {
            cas,
            ack,
            sw,
            server,
            now: 0,
        }
    }

    fn send(&mut self, p: &RocePacket) -> Vec<Vec<u8>> {
        let mut f = p.to_bytes();
        wire::seal(&mut f).unwrap();
        let Ok(Frame::Roce(q, raw)) = wire::parse(&f) else {
            unreachable!()
        };
        let mut out = Vec::new();
        self.sw.on_packet(q, raw, self.now, 3, &mut out);
        assert!(
            out.iter().all(|(tag, _)| *tag == 3),
            "frames keep their port"
        );
        out.into_iter().map(|(_, f)| f).collect()
    }

    /// An append naming version `at`, linking `new`, under `rkey`.
    fn append_under(&mut self, psn: u32, at: u64, new: u64, rkey: u32) -> Vec<Vec<u8>> {
        let mut p = self.cas.clone();
        p.bth.psn = psn;
        p.ext = Ext::Atomic {
            va: wire_addr(at),
            rkey,
            swap_add: link(new),
            compare: clover::empty_word(KEY, true),
        };
        self.send(&p)
    }

    /// An append naming version `at` (its address on the wire), linking `new`.
    fn append(&mut self, psn: u32, at: u64, new: u64) -> Vec<Vec<u8>> {
        self.append_under(psn, at, new, RKEY)
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

    /// A chain 0 → 1 → ... → n, each append naming the tail and succeeding.
    fn grow(&mut self, psn: &mut u32, n: u64) {
        for i in 0..n {
            let out = self.append(*psn, i, i + 1);
            assert_eq!(out.len(), 1);
            assert_eq!(va_of(&out[0]), (wire_addr(i), RKEY), "passes unmodified");
            assert_eq!(self.acked(*psn, true).len(), 1, "its ACK passes");
            *psn += 1;
        }
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
fn with_the_node_region_table_a_stale_append_is_steered_to_the_tail() {
    let mut r = Rig::new(true);
    assert_eq!(Ipv4Addr::from(r.cas.ip.destination), r.server);
    let mut psn = 100;
    r.grow(&mut psn, 6);
    // A client with a stale hint names version 3; the tail is 6.
    let out = r.append(psn, 3, 50);
    assert_eq!(out.len(), 1);
    assert_eq!(
        va_of(&out[0]),
        (wire_addr(6), RKEY),
        "steered to the tail, in wire addresses: {:?}",
        r.sw.stats()
    );
    let s = r.sw.stats();
    assert_eq!(
        (
            s.steered_cas,
            s.rewritten,
            s.untranslated,
            s.parked,
            s.tables,
            s.regions
        ),
        (1, 1, 0, 0, 1, 1),
        "{s:?}"
    );
    assert_eq!(s.requests, 7, "every request translated: {s:?}");
}

#[test]
fn requests_before_the_table_park_in_order_and_the_table_releases_them() {
    let mut r = Rig::new(false);
    // No table yet: the first request parks (and asks for the table);
    // later requests of its connection park behind it, whatever their key.
    assert!(r.append(10, 0, 1).is_empty());
    assert!(r.sw.wants_table());
    assert!(!r.sw.wants_table(), "asked once");
    assert!(r.append(11, 1, 2).is_empty());
    assert_eq!(r.sw.parked_now(), 2);
    let mut out = Vec::new();
    r.sw.install(table(), 50, &mut out);
    let vas: Vec<_> = out.iter().map(|(_, f)| va_of(f)).collect();
    assert_eq!(
        vas,
        vec![(wire_addr(0), RKEY), (wire_addr(1), RKEY)],
        "in order"
    );
    let s = r.sw.stats();
    assert_eq!((s.parked, s.untranslated, s.requests), (2, 0, 2), "{s:?}");
}

#[test]
fn an_rkey_the_node_does_not_know_parks_once_then_passes_untranslated() {
    let mut r = Rig::new(true);
    // A new NIC key (a region registered since, or re-registered after a
    // page moved): parked, the table read again.
    assert!(r.append_under(5, 0, 1, 0xBAD).is_empty());
    assert!(r.sw.wants_table());
    // The node's table does not have it either: released untranslated,
    // and the key passes without parking for a while.
    let mut out = Vec::new();
    r.sw.install(table(), 10, &mut out);
    assert_eq!(out.len(), 1);
    assert_eq!(va_of(&out[0].1), (wire_addr(0), 0xBAD));
    r.now = 20;
    assert_eq!(r.append_under(6, 0, 1, 0xBAD).len(), 1);
    assert!(!r.sw.wants_table());
    // With no answer at all, a parked request goes on after park_us.
    r.now = 5000;
    assert!(r.append_under(7, 0, 1, 0xBAD2).is_empty());
    let mut out = Vec::new();
    r.sw.tick(5500, &mut out);
    assert!(out.is_empty(), "not yet");
    r.sw.tick(6000, &mut out);
    assert_eq!(out.len(), 1);
    let s = r.sw.stats();
    assert_eq!(
        (s.parked, s.park_timeouts, s.untranslated),
        (2, 1, 3),
        "{s:?}"
    );
}

#[test]
fn a_steer_outside_every_region_is_not_applied_and_counted() {
    let mut r = Rig::new(false);
    let small = RegionTable::new(
        0,
        vec![WireRegion {
            rkey: RKEY,
            addr: NIC,
            base: BASE,
            len: off(5) - BASE,
            access: access::READ | access::WRITE | access::ATOMIC,
        }],
    );
    let mut out = Vec::new();
    r.sw.install(small, 0, &mut out);
    let mut psn = 7;
    // Version 5 lies beyond the region: its append passes untranslated
    // (its bytes are outside its key's region), and version 6 never
    // becomes a known tail; a stale append is steered to 5 -- outside.
    for i in 0..5 {
        r.append(psn, i, i + 1);
        r.acked(psn, true);
        psn += 1;
    }
    let out = r.append(psn, 3, 50);
    assert_eq!(va_of(&out[0]), (wire_addr(3), RKEY));
    let s = r.sw.stats();
    assert_eq!(
        (s.steered_cas, s.rewritten, s.outside_regions),
        (1, 0, 1),
        "{s:?}"
    );
}

#[test]
fn the_switch_core_parks_until_its_control_plane_installs_the_table() {
    use dmkit_switch::hub::{Core, Out};
    let r = Rig::new(false);
    let server = r.server;
    let mut core = Core::new(vec!["client".into(), "mem".into()]).with_policy(
        OnWire::new(
            SwitchConfig {
                steer: Steer::Write,
                ..Default::default()
            },
            server,
        )
        .with_control(1000),
    );
    let mut p = r.cas.clone();
    p.ext = Ext::Atomic {
        va: wire_addr(0),
        rkey: RKEY,
        swap_add: link(1),
        compare: clover::empty_word(KEY, true),
    };
    let mut f = p.to_bytes();
    wire::seal(&mut f).unwrap();
    let mut out = Vec::new();
    core.process(0, &f, 0, &mut out);
    assert!(out.is_empty(), "parked: no table yet");
    assert!(core.wants_regions());
    core.tick(10, &mut out);
    assert!(out.is_empty());
    core.install_regions(table(), 20, &mut out);
    // The server's MAC is not learned yet: flooded, but not back to the
    // port the request came from.
    assert_eq!(out.len(), 1);
    assert_eq!(out[0].0, Out::FloodExcept(0));
    assert_eq!(out[0].1, f, "unmodified: nothing to steer yet");
    let s = core.policy_stats().unwrap();
    assert_eq!(
        (s.parked, s.requests, s.untranslated, s.tables),
        (1, 1, 0, 1),
        "{s:?}"
    );
}
