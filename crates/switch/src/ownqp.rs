//! The switch's own identity on the RoCE network and its own queue pair
//! on the memory node: step 1 of multiplexing (the crate's docs, "CAS→WRITE
//! and multiplexing on the wire"); [`crate::mux`] moves clients' requests
//! onto it (then the switch answers ARP only, [`OwnQp::arp_only`], and
//! sends no probes of its own).
//!
//! The switch answers ARP for an IPv4 address of its own (`dmkit switch
//! --switch-ip`) with a MAC of its own (locally administered, derived from
//! the address), and its control plane asks the memory node for a
//! node-side RC queue pair connected to an endpoint the switch makes up
//! (`Ctl::Connect`: the switch's IPv4-mapped GID, [`OWN_QPN`] and a start
//! PSN of its choosing). The node's `ibv_modify_qp` to RTR resolves the
//! switch's MAC by ARP then, which the switch answers. From then on the
//! switch sends a READ of 8 bytes of the node's first region on that QP
//! every [`PROBE_US`] and consumes the responses addressed to it: a READ
//! response at the expected PSN shows that the node's rxe took a request
//! from the switch's address to its QP (`check_addr`, `check_psn`), which
//! is what multiplexed requests would be.

use std::collections::HashMap;

use etherparse::{EtherType, Ethernet2Header, IpNumber, Ipv4Header, UdpHeader};
use serde::Serialize;

use crate::wire::{self, opcode, Bth, Ext, Frame, RocePacket, ROCEV2_PORT};

/// The QP number the switch gives its end of the connection.
pub const OWN_QPN: u32 = 0x00_5B0B;
/// How often the switch probes its queue pair (µs).
pub const PROBE_US: u64 = 1_000_000;

/// The node-side end of the switch's queue pair, and what to READ.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct OwnRemote {
    /// The node-side QP number.
    pub qpn: u32,
    /// The switch's first PSN (what it told the node).
    pub psn: u32,
    /// NIC virtual address to READ (a region's first byte).
    pub va: u64,
    /// Its NIC rkey.
    pub rkey: u32,
}

/// Counters of the switch's own identity and queue pair.
#[derive(Debug, Clone, Default, Serialize)]
pub struct OwnQpStats {
    /// ARP requests for the switch's address answered.
    pub arp_replies: u64,
    /// Whether the node-side queue pair exists (the control plane made it).
    pub connected: bool,
    /// The node-side QP number.
    pub node_qpn: u32,
    /// READs the switch sent on its queue pair.
    pub reads: u64,
    /// READ responses at the expected PSN.
    pub read_responses: u64,
    /// NAKs on it.
    pub naks: u64,
    /// Other frames to the switch's address (consumed).
    pub other: u64,
}

/// The switch's own identity and queue pair.
#[derive(Debug)]
pub struct OwnQp {
    ip: [u8; 4],
    mac: [u8; 6],
    server: [u8; 4],
    remote: Option<OwnRemote>,
    next_psn: u32,
    waiting: Option<(u32, u64)>,
    last_probe: Option<u64>,
    ip_macs: HashMap<[u8; 4], [u8; 6]>,
    stats: OwnQpStats,
    /// Probe the queue pair and consume what comes to the switch's
    /// address (off when [`crate::mux`] owns the queue pair).
    probes: bool,
}

/// What the switch does with a frame, as far as its own identity goes.
#[derive(Debug, PartialEq, Eq)]
pub enum Own {
    /// Not for the switch: forward as usual.
    Pass,
    /// Addressed to the switch: consumed.
    Consumed,
    /// An ARP request for the switch's address: this reply goes back out
    /// the port it came from (and the request is forwarded as usual).
    Reply(Vec<u8>),
}

impl OwnQp {
    /// The switch at `ip` (its MAC: 02:00 and the address), in front of
    /// the memory node at `server`.
    pub fn new(ip: std::net::Ipv4Addr, server: std::net::Ipv4Addr) -> Self {
        let o = ip.octets();
        OwnQp {
            ip: o,
            mac: [0x02, 0x00, o[0], o[1], o[2], o[3]],
            server: server.octets(),
            remote: None,
            next_psn: 0,
            waiting: None,
            last_probe: None,
            ip_macs: HashMap::new(),
            stats: OwnQpStats::default(),
            probes: true,
        }
    }

    /// Answers ARP only: no probes, and RoCE traffic to the switch's
    /// address passes on (to [`crate::mux`], whose queue pair it is).
    pub fn arp_only(mut self) -> Self {
        self.probes = false;
        self
    }

    /// The switch's MAC.
    pub fn mac(&self) -> [u8; 6] {
        self.mac
    }

    /// The control plane made the node-side queue pair.
    pub fn connected(&mut self, r: OwnRemote) {
        self.remote = Some(r);
        self.next_psn = r.psn;
        self.waiting = None;
        self.stats.connected = true;
        self.stats.node_qpn = r.qpn;
    }

    /// The counters.
    pub fn stats(&self) -> OwnQpStats {
        self.stats.clone()
    }

    /// A frame arrives (from any port).
    pub fn on_frame(&mut self, f: &[u8]) -> Own {
        if f.len() < 14 {
            return Own::Pass;
        }
        let src: [u8; 6] = f[6..12].try_into().unwrap();
        match [f[12], f[13]] {
            [0x08, 0x06] if f.len() >= 42 => {
                let sender_ip: [u8; 4] = f[28..32].try_into().unwrap();
                self.ip_macs
                    .insert(sender_ip, f[22..28].try_into().unwrap());
                // An Ethernet/IPv4 request for the switch's address.
                if f[14..22] == [0, 1, 8, 0, 6, 4, 0, 1] && f[38..42] == self.ip {
                    self.stats.arp_replies += 1;
                    let mut r = Vec::with_capacity(60);
                    r.extend_from_slice(&f[22..28]);
                    r.extend_from_slice(&self.mac);
                    r.extend_from_slice(&[0x08, 0x06, 0, 1, 8, 0, 6, 4, 0, 2]);
                    r.extend_from_slice(&self.mac);
                    r.extend_from_slice(&self.ip);
                    r.extend_from_slice(&f[22..32]);
                    r.resize(60, 0);
                    return Own::Reply(r);
                }
                if f[0..6] == self.mac {
                    return Own::Consumed;
                }
                Own::Pass
            }
            [0x08, 0x00] if f.len() >= 34 => {
                let ip_src: [u8; 4] = f[26..30].try_into().unwrap();
                self.ip_macs.insert(ip_src, src);
                if !self.probes || (f[0..6] != self.mac && f[30..34] != self.ip) {
                    return Own::Pass;
                }
                match wire::parse(f) {
                    Ok(Frame::Roce(p, _)) => self.response(&p),
                    _ => self.stats.other += 1,
                }
                Own::Consumed
            }
            _ if f[0..6] == self.mac => Own::Consumed,
            _ => Own::Pass,
        }
    }

    fn response(&mut self, p: &RocePacket) {
        let nak = matches!(p.ext, Ext::Aeth { syndrome, .. } if syndrome >> 5 == 3);
        if nak {
            self.stats.naks += 1;
            // A sequence error names the PSN the node expects.
            self.next_psn = p.bth.psn;
            self.waiting = None;
            return;
        }
        match (p.bth.opcode, self.waiting) {
            (opcode::READ_RESPONSE_ONLY, Some((psn, _))) if psn == p.bth.psn => {
                self.stats.read_responses += 1;
                self.waiting = None;
            }
            _ => self.stats.other += 1,
        }
    }

    /// Time passes (`now`, µs): a READ request to send to the node, when a
    /// probe is due (one at a time; a lost one is sent again at the same
    /// PSN, as a requester retransmits).
    pub fn tick(&mut self, now: u64) -> Option<Vec<u8>> {
        if !self.probes {
            return None;
        }
        let r = self.remote?;
        if self
            .last_probe
            .is_some_and(|t| now.saturating_sub(t) < PROBE_US)
        {
            return None;
        }
        let dst_mac = *self.ip_macs.get(&self.server)?;
        let psn = match self.waiting {
            Some((psn, _)) => psn,
            None => {
                let psn = self.next_psn;
                self.next_psn = (psn + 1) & 0xFF_FFFF;
                psn
            }
        };
        self.waiting = Some((psn, now));
        self.last_probe = Some(now);
        self.stats.reads += 1;
        Some(read_request(
            self.mac,
            dst_mac,
            self.ip,
            self.server,
            r,
            psn,
        ))
    }
}

/// An RDMA READ request of 8 bytes at `r.va` under `r.rkey` from the
/// switch's QP to the node's, at `psn`, sealed.
fn read_request(
    src_mac: [u8; 6],
    dst_mac: [u8; 6],
    src: [u8; 4],
    dst: [u8; 4],
    r: OwnRemote,
    psn: u32,
) -> Vec<u8> {
    let body = Bth::LEN + 16 + 4;
    let mut ip = Ipv4Header::new(0, 64, IpNumber::UDP, src, dst).expect("a fixed IPv4 header");
    ip.dont_fragment = true;
    let mut p = RocePacket {
        eth: Ethernet2Header {
            source: src_mac,
            destination: dst_mac,
            ether_type: EtherType::IPV4,
        },
        ip,
        udp: UdpHeader {
            // rxe picks the source port from the QP number; any is fine.
            source_port: 0xC000 | (OWN_QPN & 0x3FFF) as u16,
            destination_port: ROCEV2_PORT,
            length: (UdpHeader::LEN + body) as u16,
            checksum: 0,
        },
        bth: Bth {
            opcode: opcode::READ_REQUEST,
            flags: 0,
            pkey: 0xFFFF,
            resv8a: 0,
            dest_qp: r.qpn,
            ack_req: 0x80,
            psn,
        },
        ext: Ext::Reth {
            va: r.va,
            rkey: r.rkey,
            len: 8,
        },
        payload: Vec::new(),
        icrc: 0,
        trailer: Vec::new(),
    };
    wire::relength(&mut p).expect("a READ request's length");
    let mut f = p.to_bytes();
    wire::seal(&mut f).expect("a READ request seals");
    f
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn it_answers_arp_for_its_address_only() {
        let mut o = OwnQp::new([10, 77, 0, 254].into(), [10, 77, 0, 1].into());
        let mut req = vec![0xff; 6];
        req.extend_from_slice(&[
            0x52, 0x54, 0, 0x77, 0, 1, 0x08, 0x06, 0, 1, 8, 0, 6, 4, 0, 1,
        ]);
        req.extend_from_slice(&[0x52, 0x54, 0, 0x77, 0, 1, 10, 77, 0, 1]);
        req.extend_from_slice(&[0; 6]);
        req.extend_from_slice(&[10, 77, 0, 254]);
        let Own::Reply(r) = o.on_frame(&req) else {
            panic!("no reply")
        };
        assert_eq!(r.len(), 60);
        assert_eq!(&r[0..6], &[0x52, 0x54, 0, 0x77, 0, 1]);
        assert_eq!(&r[20..22], &[0, 2], "an ARP reply");
        assert_eq!(&r[22..28], &o.mac());
        assert_eq!(&r[28..32], &[10, 77, 0, 254]);
        assert_eq!(&r[38..42], &[10, 77, 0, 1]);
        req[41] = 253;
        assert_eq!(o.on_frame(&req), Own::Pass);
    }

    #[test]
    fn its_read_probe_is_a_sealed_read_request_to_the_node() {
        let mut o = OwnQp::new([10, 77, 0, 254].into(), [10, 77, 0, 1].into());
        let r = OwnRemote {
            qpn: 17,
            psn: 0xFF_FFFF,
            va: 0x7f00_0000_0000,
            rkey: 0x99,
        };
        o.connected(r);
        assert!(o.tick(0).is_none(), "the node's MAC is not known yet");
        let mut arp = vec![0xff; 6];
        arp.extend_from_slice(&[
            0x52, 0x54, 0, 0x77, 0, 1, 0x08, 0x06, 0, 1, 8, 0, 6, 4, 0, 1,
        ]);
        arp.extend_from_slice(&[0x52, 0x54, 0, 0x77, 0, 1, 10, 77, 0, 1]);
        arp.extend_from_slice(&[0; 6]);
        arp.extend_from_slice(&[10, 77, 0, 9]);
        assert_eq!(o.on_frame(&arp), Own::Pass);
        let f = o.tick(0).expect("a probe");
        let Ok(Frame::Roce(p, raw)) = wire::parse(&f) else {
            panic!("not RoCEv2")
        };
        assert_eq!(wire::icrc(raw), Some(p.icrc));
        assert_eq!(
            (p.bth.opcode, p.bth.dest_qp, p.bth.psn),
            (opcode::READ_REQUEST, 17, 0xFF_FFFF)
        );
        assert_eq!(
            p.ext,
            Ext::Reth {
                va: r.va,
                rkey: 0x99,
                len: 8
            }
        );
        assert_eq!(
            (p.ip.source, p.ip.destination),
            ([10, 77, 0, 254], [10, 77, 0, 1])
        );
        assert!(o.tick(PROBE_US - 1).is_none());
        // Unanswered: sent again at the same PSN.
        let again = o.tick(PROBE_US).unwrap();
        assert_eq!(again, f);
        // The node answers: the next probe takes the next PSN (wrapping).
        let mut resp = p.clone();
        resp.eth.destination = o.mac();
        resp.ip.source = [10, 77, 0, 1];
        resp.ip.destination = [10, 77, 0, 254];
        resp.bth.opcode = opcode::READ_RESPONSE_ONLY;
        resp.ext = Ext::Aeth {
            syndrome: 0x1F,
            msn: 1,
        };
        resp.payload = vec![0; 8];
        wire::relength(&mut resp).unwrap();
        let mut rf = resp.to_bytes();
        wire::seal(&mut rf).unwrap();
        assert_eq!(o.on_frame(&rf), Own::Consumed);
        let next = o.tick(2 * PROBE_US).unwrap();
        let Ok(Frame::Roce(n, _)) = wire::parse(&next) else {
            unreachable!()
        };
        assert_eq!(n.bth.psn, 0);
        let s = o.stats();
        assert_eq!((s.reads, s.read_responses), (3, 1));
    }
}
