//! The switch's test fixture, shared by its test files: the packets
//! rdma_rxe sent (`fixtures/rxe.pcap`, captured by `dmkit switch --pcap`
//! between two Soft-RoCE guests) and the checks a rewritten frame must pass.

// Each test file is its own crate and uses a part of this module.
#![allow(dead_code)]

use dmkit_switch::wire::{self, opcode, Ext, Frame, RocePacket};
use etherparse::Ipv4Header;
use pcap_file::pcap::PcapReader;

/// Every frame of the fixture, in capture order.
pub fn frames() -> Vec<Vec<u8>> {
    let f = std::fs::File::open(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/fixtures/rxe.pcap"
    ))
    .expect("fixture");
    let mut r = PcapReader::new(f).expect("pcap header");
    let mut out = Vec::new();
    while let Some(p) = r.next_packet() {
        out.push(p.expect("packet").data.into_owned());
    }
    out
}

/// The fixture's RoCEv2 packets, in capture order.
pub fn fixtures() -> Vec<RocePacket> {
    frames()
        .iter()
        .filter_map(|d| match wire::parse(d) {
            Ok(Frame::Roce(p, _)) => Some(p),
            _ => None,
        })
        .collect()
}

/// The fixture's first packet of opcode `op`.
pub fn fixture(op: u8) -> RocePacket {
    fixtures()
        .into_iter()
        .find(|p| p.bth.opcode == op)
        .unwrap_or_else(|| panic!("no {op:#04x}"))
}

/// `frame` parsed as a RoCEv2 packet.
pub fn parse(frame: &[u8]) -> RocePacket {
    match wire::parse(frame).expect("parses") {
        Frame::Roce(p, _) => p,
        Frame::Other => panic!("not RoCEv2: {frame:02x?}"),
    }
}

/// The frame is one a receiving NIC accepts: its IPv4 header checksum and
/// its ICRC are right.
pub fn sealed(f: &[u8]) {
    let (ip, _) = Ipv4Header::from_slice(&f[14..]).unwrap();
    assert_eq!(ip.header_checksum, ip.calc_header_checksum(), "IP checksum");
    assert_eq!(wire::icrc(f), Some(parse(f).icrc), "ICRC");
}

/// Sends `p` (lengths fixed, sealed) through a switch's packet path
/// `on_packet(packet, frame, tag, out)` on port 7, and returns what it
/// emitted, parsed: every frame sealed and on the port it came from.
pub fn through(
    mut p: RocePacket,
    on_packet: impl FnOnce(RocePacket, &[u8], usize, &mut Vec<(usize, Vec<u8>)>),
) -> Vec<RocePacket> {
    wire::relength(&mut p).unwrap();
    let mut f = p.to_bytes();
    wire::seal(&mut f).unwrap();
    let q = parse(&f);
    let mut out = Vec::new();
    on_packet(q, &f, 7, &mut out);
    out.into_iter()
        .map(|(tag, f)| {
            assert_eq!(tag, 7, "frames keep their port");
            sealed(&f);
            parse(&f)
        })
        .collect()
}

/// Makes `p` (an ACK) the node's answer: an ACK with `syndrome`, or
/// with `orig` an atomic ACK carrying it (MSN 9 either way).
pub fn acknowledge(p: &mut RocePacket, syndrome: u8, orig: Option<u64>) {
    match orig {
        None => p.ext = Ext::Aeth { syndrome, msn: 9 },
        Some(orig) => {
            p.bth.opcode = opcode::ATOMIC_ACKNOWLEDGE;
            p.ext = Ext::AtomicAck {
                syndrome,
                msn: 9,
                orig,
            }
        }
    }
}
