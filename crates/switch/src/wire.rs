//! RoCEv2 on the wire: the packet codec `dmkit switch` runs on every
//! Ethernet frame (InfiniBand Architecture Specification, Annex A17
//! "RoCEv2"; as the Linux `rdma_rxe` driver sends it).
//!
//! ```text
//!  Ethernet II | IPv4 | UDP (dst 4791) | BTH (12) | ext. headers | payload+pad | ICRC (4)
//! ```
//!
//! Ethernet, IPv4 and UDP are parsed by `etherparse`; the InfiniBand
//! transport headers here: the BTH and the extended header of each
//! reliable-connection opcode (RETH for READ/WRITE requests, AtomicETH for
//! CAS/FAA, AETH for ACKs and READ responses, AtomicAckETH after the AETH of
//! an atomic ACK, ImmDt, IETH). [`RocePacket::to_bytes`] writes a parsed
//! packet back byte for byte; after a rewrite, [`seal`] recomputes the IP
//! header checksum and the invariant CRC (ICRC) so the receiving NIC
//! accepts the packet.
//!
//! The ICRC is the Ethernet CRC-32 over: 8 bytes of `0xFF` (RoCEv2's
//! stand-in for the InfiniBand LRH), the IPv4 header with TOS, TTL and
//! header checksum set to all ones, the UDP header with its checksum set
//! to all ones, the BTH with its reserved byte (before the destination QP)
//! set to all ones, and everything after the BTH up to the ICRC. It is
//! stored least significant byte first. Fields a router may change (TOS
//! for ECN, TTL, the checksums) are masked so that it stays invariant.

use std::net::Ipv4Addr;

use etherparse::{EtherType, Ethernet2Header, IpNumber, Ipv4Header, UdpHeader};

/// The UDP destination port of RoCEv2.
pub const ROCEV2_PORT: u16 = 4791;

/// Why a frame that looks like RoCEv2 could not be parsed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum WireError {
    /// Shorter than its headers say.
    #[error("truncated RoCEv2 packet: {0}")]
    Truncated(&'static str),
    /// An IPv4 or UDP header etherparse rejects.
    #[error("bad {layer} header: {msg}")]
    Header {
        /// Which header.
        layer: &'static str,
        /// etherparse's message.
        msg: String,
    },
    /// A BTH opcode outside the reliable-connection set this codec knows.
    #[error("unsupported BTH opcode {0:#04x}")]
    Opcode(u8),
}

/// RC opcodes (BTH byte 0; transport type RC = 0b000 in the top bits).
pub mod opcode {
    /// SEND First.
    pub const SEND_FIRST: u8 = 0x00;
    /// SEND Middle.
    pub const SEND_MIDDLE: u8 = 0x01;
    /// SEND Last.
    pub const SEND_LAST: u8 = 0x02;
    /// SEND Last with Immediate.
    pub const SEND_LAST_IMM: u8 = 0x03;
    /// SEND Only.
    pub const SEND_ONLY: u8 = 0x04;
    /// SEND Only with Immediate.
    pub const SEND_ONLY_IMM: u8 = 0x05;
    /// RDMA WRITE First.
    pub const WRITE_FIRST: u8 = 0x06;
    /// RDMA WRITE Middle.
    pub const WRITE_MIDDLE: u8 = 0x07;
    /// RDMA WRITE Last.
    pub const WRITE_LAST: u8 = 0x08;
    /// RDMA WRITE Last with Immediate.
    pub const WRITE_LAST_IMM: u8 = 0x09;
    /// RDMA WRITE Only.
    pub const WRITE_ONLY: u8 = 0x0A;
    /// RDMA WRITE Only with Immediate.
    pub const WRITE_ONLY_IMM: u8 = 0x0B;
    /// RDMA READ Request.
    pub const READ_REQUEST: u8 = 0x0C;
    /// RDMA READ Response First.
    pub const READ_RESPONSE_FIRST: u8 = 0x0D;
    /// RDMA READ Response Middle.
    pub const READ_RESPONSE_MIDDLE: u8 = 0x0E;
    /// RDMA READ Response Last.
    pub const READ_RESPONSE_LAST: u8 = 0x0F;
    /// RDMA READ Response Only.
    pub const READ_RESPONSE_ONLY: u8 = 0x10;
    /// Acknowledge.
    pub const ACKNOWLEDGE: u8 = 0x11;
    /// Atomic Acknowledge.
    pub const ATOMIC_ACKNOWLEDGE: u8 = 0x12;
    /// CmpSwap.
    pub const COMPARE_SWAP: u8 = 0x13;
    /// FetchAdd.
    pub const FETCH_ADD: u8 = 0x14;
    /// SEND Last with Invalidate.
    pub const SEND_LAST_INV: u8 = 0x16;
    /// SEND Only with Invalidate.
    pub const SEND_ONLY_INV: u8 = 0x17;
}

/// The Base Transport Header (12 bytes).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Bth {
    /// Opcode.
    pub opcode: u8,
    /// Solicited event, MigReq, pad count (2 bits), transport version (4).
    pub flags: u8,
    /// Partition key.
    pub pkey: u16,
    /// The reserved byte before the destination QP (`resv8a`).
    pub resv8a: u8,
    /// Destination queue pair (24 bits).
    pub dest_qp: u32,
    /// AckReq bit and the 7 reserved bits after it.
    pub ack_req: u8,
    /// Packet sequence number (24 bits).
    pub psn: u32,
}

impl Bth {
    /// Its length on the wire.
    pub const LEN: usize = 12;

    fn parse(b: &[u8]) -> Bth {
        Bth {
            opcode: b[0],
            flags: b[1],
            pkey: u16::from_be_bytes([b[2], b[3]]),
            resv8a: b[4],
            dest_qp: u32::from_be_bytes([0, b[5], b[6], b[7]]),
            ack_req: b[8],
            psn: u32::from_be_bytes([0, b[9], b[10], b[11]]),
        }
    }

    fn write(&self, out: &mut Vec<u8>) {
        out.extend_from_slice(&[self.opcode, self.flags]);
        out.extend_from_slice(&self.pkey.to_be_bytes());
        out.push(self.resv8a);
        out.extend_from_slice(&self.dest_qp.to_be_bytes()[1..]);
        out.push(self.ack_req);
        out.extend_from_slice(&self.psn.to_be_bytes()[1..]);
    }

    /// The pad count: bytes appended to the payload to a 4-byte multiple.
    pub fn pad(&self) -> usize {
        ((self.flags >> 4) & 3) as usize
    }
}

/// The extended transport headers after the BTH, by opcode.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Ext {
    /// None (SEND/WRITE Middle and the like, READ Response Middle).
    None,
    /// RETH: READ requests, WRITE First/Only.
    Reth {
        /// Virtual address.
        va: u64,
        /// Remote key.
        rkey: u32,
        /// DMA length.
        len: u32,
    },
    /// RETH and ImmDt (WRITE Only with Immediate).
    RethImm {
        /// Virtual address.
        va: u64,
        /// Remote key.
        rkey: u32,
        /// DMA length.
        len: u32,
        /// Immediate data.
        imm: u32,
    },
    /// ImmDt (SEND/WRITE Last or Only with Immediate) or IETH (with
    /// Invalidate): one 4-byte word.
    Word(u32),
    /// AtomicETH: CmpSwap and FetchAdd.
    Atomic {
        /// Virtual address.
        va: u64,
        /// Remote key.
        rkey: u32,
        /// Swap (CmpSwap) or add (FetchAdd) operand.
        swap_add: u64,
        /// Compare operand (CmpSwap).
        compare: u64,
    },
    /// AETH: ACK/NAK syndrome and message sequence number.
    Aeth {
        /// Syndrome (ACK, RNR NAK, NAK).
        syndrome: u8,
        /// Message sequence number (24 bits).
        msn: u32,
    },
    /// AETH and AtomicAckETH (Atomic Acknowledge).
    AtomicAck {
        /// Syndrome.
        syndrome: u8,
        /// Message sequence number (24 bits).
        msn: u32,
        /// The word's value before the atomic.
        orig: u64,
    },
}

impl Ext {
    fn len_of(op: u8) -> Result<usize, WireError> {
        use opcode::*;
        Ok(match op {
            SEND_FIRST | SEND_MIDDLE | SEND_LAST | SEND_ONLY | WRITE_MIDDLE | WRITE_LAST
            | READ_RESPONSE_MIDDLE => 0,
            SEND_LAST_IMM | SEND_ONLY_IMM | WRITE_LAST_IMM | SEND_LAST_INV | SEND_ONLY_INV => 4,
            WRITE_FIRST | WRITE_ONLY | READ_REQUEST => 16,
            WRITE_ONLY_IMM => 20,
            READ_RESPONSE_FIRST | READ_RESPONSE_LAST | READ_RESPONSE_ONLY | ACKNOWLEDGE => 4,
            ATOMIC_ACKNOWLEDGE => 12,
            COMPARE_SWAP | FETCH_ADD => 28,
            other => return Err(WireError::Opcode(other)),
        })
    }

    fn parse(op: u8, b: &[u8]) -> Ext {
        use opcode::*;
        let u32_at = |i: usize| u32::from_be_bytes(b[i..i + 4].try_into().unwrap());
        let u64_at = |i: usize| u64::from_be_bytes(b[i..i + 8].try_into().unwrap());
        let aeth = || (b[0], u32::from_be_bytes([0, b[1], b[2], b[3]]));
        match op {
            WRITE_FIRST | WRITE_ONLY | READ_REQUEST => Ext::Reth {
                va: u64_at(0),
                rkey: u32_at(8),
                len: u32_at(12),
            },
            WRITE_ONLY_IMM => Ext::RethImm {
                va: u64_at(0),
                rkey: u32_at(8),
                len: u32_at(12),
                imm: u32_at(16),
            },
            SEND_LAST_IMM | SEND_ONLY_IMM | WRITE_LAST_IMM | SEND_LAST_INV | SEND_ONLY_INV => {
                Ext::Word(u32_at(0))
            }
            COMPARE_SWAP | FETCH_ADD => Ext::Atomic {
                va: u64_at(0),
                rkey: u32_at(8),
                swap_add: u64_at(12),
                compare: u64_at(20),
            },
            READ_RESPONSE_FIRST | READ_RESPONSE_LAST | READ_RESPONSE_ONLY | ACKNOWLEDGE => {
                let (syndrome, msn) = aeth();
                Ext::Aeth { syndrome, msn }
            }
            ATOMIC_ACKNOWLEDGE => {
                let (syndrome, msn) = aeth();
                Ext::AtomicAck {
                    syndrome,
                    msn,
                    orig: u64_at(4),
                }
            }
            _ => Ext::None,
        }
    }

    fn write(&self, out: &mut Vec<u8>) {
        let aeth = |out: &mut Vec<u8>, syndrome: u8, msn: u32| {
            out.push(syndrome);
            out.extend_from_slice(&msn.to_be_bytes()[1..]);
        };
        match *self {
            Ext::None => {}
            Ext::Reth { va, rkey, len } => {
                out.extend_from_slice(&va.to_be_bytes());
                out.extend_from_slice(&rkey.to_be_bytes());
                out.extend_from_slice(&len.to_be_bytes());
            }
            Ext::RethImm { va, rkey, len, imm } => {
                out.extend_from_slice(&va.to_be_bytes());
                out.extend_from_slice(&rkey.to_be_bytes());
                out.extend_from_slice(&len.to_be_bytes());
                out.extend_from_slice(&imm.to_be_bytes());
            }
            Ext::Word(w) => out.extend_from_slice(&w.to_be_bytes()),
            Ext::Atomic {
                va,
                rkey,
                swap_add,
                compare,
            } => {
                out.extend_from_slice(&va.to_be_bytes());
                out.extend_from_slice(&rkey.to_be_bytes());
                out.extend_from_slice(&swap_add.to_be_bytes());
                out.extend_from_slice(&compare.to_be_bytes());
            }
            Ext::Aeth { syndrome, msn } => aeth(out, syndrome, msn),
            Ext::AtomicAck {
                syndrome,
                msn,
                orig,
            } => {
                aeth(out, syndrome, msn);
                out.extend_from_slice(&orig.to_be_bytes());
            }
        }
    }
}

/// A parsed RoCEv2 packet in an Ethernet frame. The payload (with its
/// pad) and whatever trails the IP packet in the frame are kept as bytes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RocePacket {
    /// Ethernet II header.
    pub eth: Ethernet2Header,
    /// IPv4 header (with options, if any).
    pub ip: Ipv4Header,
    /// UDP header.
    pub udp: UdpHeader,
    /// Base transport header.
    pub bth: Bth,
    /// Extended transport headers.
    pub ext: Ext,
    /// Payload and pad.
    pub payload: Vec<u8>,
    /// The ICRC as sent (host order of the stored little-endian word).
    pub icrc: u32,
    /// Bytes after the IP packet in the frame (Ethernet padding).
    pub trailer: Vec<u8>,
}

/// What a frame is, as far as the switch cares.
// Returned by value and consumed at once on the per-packet path: boxing the
// packet would add an allocation per frame to save a move of ~200 bytes.
#[allow(clippy::large_enum_variant)]
#[derive(Debug)]
pub enum Frame<'a> {
    /// Not IPv4/UDP to port 4791 (ARP, TCP, IPv6 ...): forwarded by MAC only.
    Other,
    /// A RoCEv2 packet and the frame it came in.
    Roce(RocePacket, &'a [u8]),
}

/// Parses an Ethernet frame (no FCS). `Ok(Frame::Other)` for anything that
/// is not RoCEv2 over IPv4; an error for RoCEv2 that is malformed.
pub fn parse(frame: &[u8]) -> Result<Frame<'_>, WireError> {
    let Ok((eth, rest)) = Ethernet2Header::from_slice(frame) else {
        return Ok(Frame::Other);
    };
    if eth.ether_type != EtherType::IPV4 {
        return Ok(Frame::Other);
    }
    let Ok((ip, _)) = Ipv4Header::from_slice(rest) else {
        return Ok(Frame::Other);
    };
    if ip.protocol != IpNumber::UDP || ip.is_fragmenting_payload() {
        return Ok(Frame::Other);
    }
    let ip_total = ip.total_len as usize;
    if rest.len() < ip_total || ip_total < ip.header_len() + UdpHeader::LEN {
        return Ok(Frame::Other);
    }
    let after_ip = &rest[ip.header_len()..ip_total];
    let (udp, l4) = UdpHeader::from_slice(after_ip).map_err(|e| WireError::Header {
        layer: "UDP",
        msg: e.to_string(),
    })?;
    if udp.destination_port != ROCEV2_PORT {
        return Ok(Frame::Other);
    }
    if (udp.length as usize) != after_ip.len() {
        return Err(WireError::Truncated(
            "UDP length disagrees with the IP length",
        ));
    }
    if l4.len() < Bth::LEN + 4 {
        return Err(WireError::Truncated("shorter than BTH and ICRC"));
    }
    let bth = Bth::parse(&l4[..Bth::LEN]);
    let ext_len = Ext::len_of(bth.opcode)?;
    let body = &l4[Bth::LEN..l4.len() - 4];
    if body.len() < ext_len {
        return Err(WireError::Truncated("extended header"));
    }
    let ext = Ext::parse(bth.opcode, &body[..ext_len]);
    let icrc = u32::from_le_bytes(l4[l4.len() - 4..].try_into().unwrap());
    Ok(Frame::Roce(
        RocePacket {
            eth,
            ip,
            udp,
            bth,
            ext,
            payload: body[ext_len..].to_vec(),
            icrc,
            trailer: rest[ip_total..].to_vec(),
        },
        frame,
    ))
}

impl RocePacket {
    /// The frame, byte for byte as parsed (with the fields as they are
    /// now: after a rewrite, [`seal`] it).
    pub fn to_bytes(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(
            14 + self.ip.header_len() + 8 + 40 + self.payload.len() + self.trailer.len(),
        );
        out.extend_from_slice(&self.eth.to_bytes());
        out.extend_from_slice(&self.ip.to_bytes());
        out.extend_from_slice(&self.udp.to_bytes());
        self.bth.write(&mut out);
        self.ext.write(&mut out);
        out.extend_from_slice(&self.payload);
        out.extend_from_slice(&self.icrc.to_le_bytes());
        out.extend_from_slice(&self.trailer);
        out
    }

    /// Source IPv4 address.
    pub fn src_ip(&self) -> Ipv4Addr {
        Ipv4Addr::from(self.ip.source)
    }

    /// Destination IPv4 address.
    pub fn dst_ip(&self) -> Ipv4Addr {
        Ipv4Addr::from(self.ip.destination)
    }
}

/// The ICRC of a frame holding one RoCEv2 packet over IPv4 (no VLAN tag),
/// as the sender computes it: over the masked headers and everything after
/// the BTH up to the ICRC itself. `None` if the frame is not such a packet.
pub fn icrc(frame: &[u8]) -> Option<u32> {
    let ip = frame.get(14..)?;
    let ihl = ((*ip.first()? & 0x0F) as usize) * 4;
    let total = u16::from_be_bytes([*ip.get(2)?, *ip.get(3)?]) as usize;
    if ip.len() < total || total < ihl + 8 + Bth::LEN + 4 {
        return None;
    }
    let mut h = crc32fast::Hasher::new();
    h.update(&[0xFF; 8]);
    let mut hdr = [0u8; 60 + 8 + Bth::LEN];
    let n = ihl + 8 + Bth::LEN;
    hdr[..n].copy_from_slice(&ip[..n]);
    hdr[1] = 0xFF; // TOS
    hdr[8] = 0xFF; // TTL
    hdr[10] = 0xFF; // header checksum
    hdr[11] = 0xFF;
    hdr[ihl + 6] = 0xFF; // UDP checksum
    hdr[ihl + 7] = 0xFF;
    hdr[ihl + 8 + 4] = 0xFF; // BTH resv8a
    h.update(&hdr[..n]);
    h.update(&ip[n..total - 4]);
    Some(h.finalize())
}

/// After a rewrite of a serialized packet: recompute the IPv4 header
/// checksum and the ICRC in place (the UDP checksum stays zero, as rxe
/// sends it; a nonzero one is recomputed too).
pub fn seal(frame: &mut [u8]) -> Result<(), WireError> {
    let (mut ip, _) = Ipv4Header::from_slice(&frame[14..]).map_err(|e| WireError::Header {
        layer: "IPv4",
        msg: e.to_string(),
    })?;
    ip.header_checksum = ip.calc_header_checksum();
    frame[24..26].copy_from_slice(&ip.header_checksum.to_be_bytes());
    let ihl = ip.header_len();
    let total = ip.total_len as usize;
    let udp_at = 14 + ihl;
    if frame[udp_at + 6..udp_at + 8] != [0, 0] {
        let (udp, payload) =
            UdpHeader::from_slice(&frame[udp_at..14 + total]).map_err(|e| WireError::Header {
                layer: "UDP",
                msg: e.to_string(),
            })?;
        let sum = udp
            .calc_checksum_ipv4(&ip, payload)
            .map_err(|e| WireError::Header {
                layer: "UDP",
                msg: e.to_string(),
            })?;
        frame[udp_at + 6..udp_at + 8].copy_from_slice(&sum.to_be_bytes());
    }
    let c = icrc(frame).ok_or(WireError::Truncated("frame"))?;
    frame[14 + total - 4..14 + total].copy_from_slice(&c.to_le_bytes());
    Ok(())
}

/// The switch's view of a request or response: what [`crate::Request`] and
/// [`crate::Response`] are built from, with the packet's verb decoded.
/// `None` for packets the policy does not look at (SEND, multi-packet
/// WRITE middles, READ response data past the first packet).
pub fn verb_of(p: &RocePacket) -> Option<crate::Verb> {
    use opcode::*;
    match (p.bth.opcode, p.ext) {
        (READ_REQUEST, Ext::Reth { va, len, .. }) => Some(crate::Verb::Read { addr: va, len }),
        (WRITE_ONLY, Ext::Reth { va, len, .. }) => Some(crate::Verb::Write {
            addr: va,
            len,
            word: (len == 8 && p.payload.len() >= 8)
                .then(|| u64::from_be_bytes(p.payload[..8].try_into().unwrap())),
        }),
        (WRITE_FIRST, Ext::Reth { va, len, .. }) => Some(crate::Verb::Write {
            addr: va,
            len,
            word: None,
        }),
        (
            COMPARE_SWAP,
            Ext::Atomic {
                va,
                swap_add,
                compare,
                ..
            },
        ) => Some(crate::Verb::Cas {
            addr: va,
            compare,
            swap: swap_add,
        }),
        (FETCH_ADD, Ext::Atomic { va, swap_add, .. }) => Some(crate::Verb::Faa {
            addr: va,
            add: swap_add,
        }),
        _ => None,
    }
}

/// Writes a (possibly rewritten) verb back into a request packet's
/// extended header; false if the verb does not fit the packet (another
/// opcode: CAS→WRITE changes the packet's shape, which this codec does not
/// do in place).
pub fn set_verb(p: &mut RocePacket, v: &crate::Verb) -> bool {
    match (&mut p.ext, *v) {
        (Ext::Reth { va, len, .. }, crate::Verb::Read { addr, len: l })
            if p.bth.opcode == opcode::READ_REQUEST =>
        {
            *va = addr;
            *len = l;
            true
        }
        (
            Ext::Atomic {
                va,
                swap_add,
                compare,
                ..
            },
            crate::Verb::Cas {
                addr,
                compare: c,
                swap,
            },
        ) if p.bth.opcode == opcode::COMPARE_SWAP => {
            *va = addr;
            *swap_add = swap;
            *compare = c;
            true
        }
        (Ext::Atomic { va, swap_add, .. }, crate::Verb::Faa { addr, add })
            if p.bth.opcode == opcode::FETCH_ADD =>
        {
            *va = addr;
            *swap_add = add;
            true
        }
        _ => false,
    }
}

/// A rewritten packet as a frame to send: [`relength`]ed, serialized and
/// [`seal`]ed. Fails for an opcode this codec does not know.
pub fn reseal(p: &mut RocePacket) -> Result<Vec<u8>, WireError> {
    relength(p)?;
    let mut f = p.to_bytes();
    seal(&mut f)?;
    Ok(f)
}

/// After a rewrite that changed a packet's shape (its opcode, extended
/// header or payload): the IPv4 total length and the UDP length for the
/// headers and payload it has now, and the Ethernet padding to the
/// 60-byte minimum frame. [`RocePacket::to_bytes`] and [`seal`] it then.
/// Fails for an opcode this codec does not know.
pub fn relength(p: &mut RocePacket) -> Result<(), WireError> {
    let udp_len = UdpHeader::LEN + Bth::LEN + Ext::len_of(p.bth.opcode)? + p.payload.len() + 4;
    let ip_len = p.ip.header_len() + udp_len;
    p.udp.length = u16::try_from(udp_len).map_err(|_| WireError::Truncated("UDP length"))?;
    p.ip.set_payload_len(udp_len)
        .map_err(|e| WireError::Header {
            layer: "IPv4",
            msg: e.to_string(),
        })?;
    debug_assert_eq!(p.ip.total_len as usize, ip_len);
    let frame = 14 + ip_len;
    p.trailer = vec![0; 60usize.saturating_sub(frame)];
    Ok(())
}
