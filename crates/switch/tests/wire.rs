//! The RoCEv2 codec against packets rdma_rxe sent: `fixtures/rxe.pcap`
//! holds the first packets of each opcode (and a few of the commonest)
//! captured by `dmkit switch --pcap` between two Soft-RoCE guests
//! (tools/softroce/multi.sh, a YCSB run of race and the conformance suite).

use dmkit_switch::hub::{Core, Out};
use dmkit_switch::wire::{self, opcode, Ext, Frame};

mod common;
use common::{frames, parse as roce};

#[test]
fn fixture_covers_the_verbs_dmkit_sends() {
    let ops: std::collections::BTreeSet<u8> = frames()
        .iter()
        .filter_map(|f| match wire::parse(f) {
            Ok(Frame::Roce(p, _)) => Some(p.bth.opcode),
            _ => None,
        })
        .collect();
    for op in [
        opcode::READ_REQUEST,
        opcode::READ_RESPONSE_ONLY,
        opcode::WRITE_ONLY,
        opcode::COMPARE_SWAP,
        opcode::FETCH_ADD,
        opcode::ATOMIC_ACKNOWLEDGE,
        opcode::ACKNOWLEDGE,
        opcode::SEND_ONLY,
    ] {
        assert!(ops.contains(&op), "no {op:#04x} in the fixture: {ops:02x?}");
    }
}

#[test]
fn parse_then_serialize_is_byte_exact() {
    let fs = frames();
    let mut n = 0;
    for f in &fs {
        if let Frame::Roce(p, raw) = wire::parse(f).unwrap() {
            assert_eq!(p.to_bytes(), raw, "round trip of {:#04x}", p.bth.opcode);
            n += 1;
        }
    }
    assert!(n >= 20, "only {n} RoCEv2 packets");
}

#[test]
fn icrc_recomputed_equals_what_rxe_sent() {
    for f in frames() {
        if let Frame::Roce(p, raw) = wire::parse(&f).unwrap() {
            assert_eq!(
                wire::icrc(raw),
                Some(p.icrc),
                "opcode {:#04x}",
                p.bth.opcode
            );
        }
    }
}

#[test]
fn ip_checksum_as_sent_and_seal_is_identity_on_unmodified_packets() {
    for f in frames() {
        if let Frame::Roce(p, _) = wire::parse(&f).unwrap() {
            assert_eq!(p.ip.header_checksum, p.ip.calc_header_checksum());
            let mut g = f.clone();
            wire::seal(&mut g).unwrap();
            assert_eq!(g, f);
        }
    }
}

#[test]
fn icrc_ignores_the_fields_a_router_changes_and_catches_the_rest() {
    let f = frames()
        .into_iter()
        .find(|f| roce(f).bth.opcode == opcode::COMPARE_SWAP)
        .unwrap();
    let p = roce(&f);
    // TTL, TOS (ECN) and the IP checksum are masked.
    let mut g = f.clone();
    g[14 + 8] = g[14 + 8].wrapping_sub(1);
    g[14 + 1] ^= 0x03;
    assert_eq!(wire::icrc(&g), Some(p.icrc));
    // The operands are not.
    let mut h = f.clone();
    let at = h.len() - 4 - 1;
    h[at] ^= 1;
    assert_ne!(wire::icrc(&h), Some(p.icrc));
}

#[test]
fn a_rewritten_cas_is_resealed_so_a_receiver_would_accept_it() {
    let f = frames()
        .into_iter()
        .find(|f| roce(f).bth.opcode == opcode::COMPARE_SWAP)
        .unwrap();
    let mut p = roce(&f);
    let Some(dmkit_switch::Verb::Cas {
        addr,
        compare,
        swap,
    }) = wire::verb_of(&p)
    else {
        panic!("a CAS")
    };
    let moved = dmkit_switch::Verb::Cas {
        addr: addr + 64,
        compare,
        swap: swap ^ 1,
    };
    assert!(wire::set_verb(&mut p, &moved));
    let mut g = p.to_bytes();
    wire::seal(&mut g).unwrap();
    let q = roce(&g);
    assert_eq!(wire::verb_of(&q), Some(moved));
    assert_eq!(wire::icrc(&g), Some(q.icrc), "sealed ICRC is the packet's");
    assert_ne!(q.icrc, roce(&f).icrc);
    assert_eq!(q.ip.header_checksum, q.ip.calc_header_checksum());
    // Only the AtomicETH and the ICRC changed.
    let diff: Vec<usize> = (0..f.len()).filter(|&i| f[i] != g[i]).collect();
    let ext_at = 14 + 20 + 8 + 12;
    assert!(
        diff.iter()
            .all(|&i| (ext_at..ext_at + 28).contains(&i) || i >= f.len() - 4),
        "{diff:?}"
    );
    // A READ can not take a CAS's shape in place.
    assert!(!wire::set_verb(
        &mut p,
        &dmkit_switch::Verb::Read { addr: 0, len: 8 }
    ));
}

#[test]
fn atomic_ack_carries_the_old_value_after_the_aeth() {
    let f = frames()
        .into_iter()
        .find(|f| roce(f).bth.opcode == opcode::ATOMIC_ACKNOWLEDGE)
        .unwrap();
    let p = roce(&f);
    let Ext::AtomicAck { syndrome, orig, .. } = p.ext else {
        panic!("{:?}", p.ext)
    };
    assert_eq!(syndrome >> 5, 0, "an ACK, not a NAK");
    let at = 14 + 20 + 8 + 12 + 4;
    assert_eq!(orig.to_be_bytes(), f[at..at + 8]);
    assert!(p.payload.is_empty());
}

#[test]
fn truncated_rocev2_is_an_error_not_a_panic() {
    let f = frames()
        .into_iter()
        .find(|f| roce(f).bth.opcode == opcode::COMPARE_SWAP)
        .unwrap();
    for cut in 14 + 20 + 8..f.len() {
        // Shorten the IP and UDP lengths with the frame, so the cut is
        // seen by the transport parser.
        let mut g = f[..cut].to_vec();
        let ip_len = (cut - 14) as u16;
        g[16..18].copy_from_slice(&ip_len.to_be_bytes());
        g[14 + 20 + 4..14 + 20 + 6].copy_from_slice(&(ip_len - 20).to_be_bytes());
        let r = wire::parse(&g);
        assert!(
            r.is_err() || matches!(r, Ok(Frame::Roce(..))),
            "{cut}: {r:?}"
        );
        if cut < 14 + 20 + 8 + 12 + 28 + 4 {
            assert!(r.is_err(), "{cut}");
        }
    }
}

#[test]
fn learning_switch_floods_unknown_then_forwards_by_mac() {
    let fs = frames();
    let a = roce(&fs[0]);
    let mut core = Core::new(vec!["a".into(), "b".into(), "c".into()]);
    // The first frame from a's MAC: its destination is unknown, flooded.
    assert_eq!(core.on_frame(0, &fs[0]), Out::Flood);
    // A frame back to a's MAC from port 1 goes to port 0 only.
    let mut back = fs[0].clone();
    back[0..6].copy_from_slice(&a.eth.source);
    back[6..12].copy_from_slice(&a.eth.destination);
    assert_eq!(core.on_frame(1, &back), Out::Port(0));
    // Now both are learned.
    assert_eq!(core.on_frame(0, &fs[0]), Out::Port(1));
    // Broadcast floods.
    let mut bc = fs[0].clone();
    bc[0..6].copy_from_slice(&[0xff; 6]);
    assert_eq!(core.on_frame(0, &bc), Out::Flood);
    // A restart forgets the table: flooding again, nothing lost.
    core.forget();
    assert_eq!(core.on_frame(0, &fs[0]), Out::Flood);
    let s = core.stats();
    assert_eq!(s.frames, 5);
    assert_eq!(s.roce.packets, 5);
    // The MACs are outside the ICRC: the rewritten copies still check.
    assert_eq!(s.roce.icrc_mismatch, 0);
}
