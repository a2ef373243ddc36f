//! The switch's policy ([`crate::Switch`], the same code the simulator's
//! switch position runs) on RoCEv2 packets: requests to the memory node
//! are reduced to [`crate::Request`]s, the [`crate::Forward`] the policy
//! returns is written back into the packet (the AtomicETH or RETH) and the
//! packet resealed (IP checksum, ICRC); responses are reduced to
//! [`crate::Response`]s, and a response the policy holds (ordered
//! completion of steered appends) waits in the switch until a
//! [`crate::Delivery`] names it.
//!
//! What RoCEv2 does not carry and this adapter infers or is told:
//! - **Addresses.** A request carries the NIC's virtual address inside a
//!   registered region and the region's NIC rkey; the policy speaks the
//!   node's addresses. The memory node's region table
//!   ([`crate::regions::RegionTable`], read by the switch's control plane
//!   and installed with [`OnWire::install`]) translates both ways. A
//!   request under an rkey the table does not know is *parked* (with every
//!   later request of its connection, so their order holds) and the table
//!   read again ([`OnWire::wants_table`]); the new table releases them, or,
//!   after `park_us` without one, they pass untranslated.
//! - **Connections.** A request names only the destination QP; its
//!   connection is (client IP, server IP, server QP). A response names the
//!   client's QP; the adapter pairs the two on the first response by its
//!   PSN, which equals the request's (RC responses repeat the request PSN).
//! - **64-bit PSNs.** The 24-bit PSN is extended per connection, nearest
//!   to the last one seen.
//!
//! Not done here: CAS→WRITE (its own adapter, [`crate::caswrite`], on
//! each client's own connection; not together with steering yet) and
//! multiplexing (a packet's QPN, PSN and source address would change; see
//! the crate's docs for why rxe refuses that without a connection of the
//! switch's own), READ
//! responses of more than one packet (passed unheld), and the quiet period
//! after a restart (`not_before`; a restarted switch starts with every key
//! unknown, which is safe).

use std::collections::{HashMap, VecDeque};

use serde::Serialize;

use crate::regions::{access, RegionTable};
use crate::wire::{self, opcode, Ext, RocePacket};
use crate::{ConnId, Delivery, RespKind, Response, Switch, SwitchConfig};

/// Counters of the adapter, with the policy's own.
#[derive(Debug, Clone, Default, Serialize)]
pub struct OnWireStats {
    /// Requests shown to the policy.
    pub requests: u64,
    /// Responses shown to the policy.
    pub responses: u64,
    /// Requests rewritten (operands moved) and resealed.
    pub rewritten: u64,
    /// Forwards the packet could not take (another opcode's shape):
    /// forwarded unmodified.
    pub unrewritable: u64,
    /// Responses held for ordered completion, and released.
    pub held: u64,
    /// Held responses released.
    pub released: u64,
    /// Responses held right now.
    pub holding: u64,
    /// Responses whose connection the adapter could not pair (passed).
    pub unpaired: u64,
    /// Connections seen.
    pub conns: u64,
    /// Region tables installed (reads of the node's table).
    pub tables: u64,
    /// Regions in the table installed last.
    pub regions: u64,
    /// Requests parked until the region table was read again (an rkey it
    /// did not know, or their connection's earlier request parked).
    pub parked: u64,
    /// Parked requests that waited longer than `park_us` for a table and
    /// were released untranslated.
    pub park_timeouts: u64,
    /// Requests not shown to the policy: their rkey is in no region table
    /// the switch has (none read yet, or a key the node does not know).
    pub untranslated: u64,
    /// Requests not shown to the policy: their bytes lie outside the
    /// region of their rkey (the receiving NIC refuses them).
    pub outside_region: u64,
    /// Policy decisions not applied: the new address lies in no region
    /// granting the verb (forwarded unmodified).
    pub outside_regions: u64,
    /// The policy: CASes steered predicted to succeed.
    pub steered_cas: u64,
    /// The policy: CASes steered predicted to fail.
    pub steered_doomed: u64,
    /// The policy: READs steered.
    pub steered_reads: u64,
    /// The policy: keys' tails learned.
    pub learned: u64,
    /// The policy: predictions that failed.
    pub mispredictions: u64,
    /// The policy: retransmissions forwarded as their originals.
    pub retransmissions: u64,
    /// The policy: requests passed unmodified.
    pub passed: u64,
}

type Ip = [u8; 4];
/// A connection as requests name it: (client IP, server IP, server QPN).
type ConnKey = (Ip, Ip, u32);

/// A request waiting for the region table.
#[derive(Debug)]
struct Parked {
    tag: usize,
    raw: Vec<u8>,
    at: u64,
}

/// The policy and the state it needs on the wire.
#[derive(Debug)]
pub struct OnWire {
    sw: Switch,
    server: Ip,
    conns: HashMap<ConnKey, ConnId>,
    last_psn: HashMap<ConnId, u64>,
    pending: HashMap<(Ip, u32), ConnId>,
    resp_conns: HashMap<(Ip, u32), ConnId>,
    held: HashMap<(ConnId, u64), (usize, Vec<u8>)>,
    table: Option<RegionTable>,
    /// Whether a control plane answers [`OnWire::wants_table`] (else
    /// nothing is parked).
    control: bool,
    park_us: u64,
    parked: VecDeque<Parked>,
    parked_conns: std::collections::HashSet<ConnKey>,
    want_table: bool,
    /// Keys the last table read did not know, and when: requests under
    /// them pass until `park_us` later (no re-read per packet).
    unknown: HashMap<u32, u64>,
    stats: OnWireStats,
}

fn with_addr(v: crate::Verb, a: u64) -> crate::Verb {
    use crate::Verb::*;
    match v {
        Read { len, .. } => Read { addr: a, len },
        Write { len, word, .. } => Write { addr: a, len, word },
        Cas { compare, swap, .. } => Cas {
            addr: a,
            compare,
            swap,
        },
        Faa { add, .. } => Faa { addr: a, add },
    }
}

/// Bytes a verb touches, and the access it needs.
fn extent(v: &crate::Verb) -> (u64, u64) {
    use crate::Verb::*;
    match *v {
        Read { len, .. } => (len as u64, access::READ),
        Write { len, .. } => (len as u64, access::WRITE),
        Cas { .. } | Faa { .. } => (8, access::ATOMIC),
    }
}

fn extend(last: u64, p24: u32) -> u64 {
    let base = last & !0xFF_FFFF;
    let c = base | p24 as u64;
    let half = 1u64 << 23;
    if c + half < last {
        c + (1 << 24)
    } else if c > last + half && c >= 1 << 24 {
        c - (1 << 24)
    } else {
        c
    }
}

/// How long a request waits for the region table by default (µs): under
/// two of the client's ~67 ms RC retransmission timeouts (dmkit's QPs ask
/// for 7 retries, which rxe even takes as unlimited).
pub const PARK_US: u64 = 100_000;

impl OnWire {
    /// The policy `cfg` in front of the memory node at `server`, with no
    /// region table and no control plane: every request passes
    /// untranslated until [`OnWire::install`] gives it one.
    pub fn new(cfg: SwitchConfig, server: std::net::Ipv4Addr) -> Self {
        OnWire {
            sw: Switch::new(cfg),
            server: server.octets(),
            conns: HashMap::new(),
            last_psn: HashMap::new(),
            pending: HashMap::new(),
            resp_conns: HashMap::new(),
            held: HashMap::new(),
            table: None,
            control: false,
            park_us: PARK_US,
            parked: VecDeque::new(),
            parked_conns: Default::default(),
            want_table: false,
            unknown: HashMap::new(),
            stats: OnWireStats::default(),
        }
    }

    /// A control plane answers [`OnWire::wants_table`] by calling
    /// [`OnWire::install`]: requests under unknown rkeys wait for it up to
    /// `park_us` µs.
    pub fn with_control(mut self, park_us: u64) -> Self {
        self.control = true;
        self.park_us = park_us;
        self
    }

    /// The counters, the policy's included.
    pub fn stats(&self) -> OnWireStats {
        let p = self.sw.stats();
        OnWireStats {
            holding: self.held.len() as u64,
            conns: self.conns.len() as u64,
            regions: self.table.as_ref().map_or(0, |t| t.regions().len() as u64),
            steered_cas: p.steered_cas,
            steered_doomed: p.steered_doomed,
            steered_reads: p.steered_reads,
            learned: p.learned,
            mispredictions: p.mispredictions,
            retransmissions: p.retransmissions,
            passed: p.passed,
            ..self.stats.clone()
        }
    }

    /// Whether the switch needs the node's region table (read) now; true
    /// once per need.
    pub fn wants_table(&mut self) -> bool {
        std::mem::take(&mut self.want_table)
    }

    /// Installs the node's region table at `now` (µs) and releases the
    /// requests parked for it into `out`, in order.
    pub fn install(&mut self, t: RegionTable, now: u64, out: &mut Vec<(usize, Vec<u8>)>) {
        self.stats.tables += 1;
        self.table = Some(t);
        self.unknown.clear();
        self.release(now, out);
    }

    /// Time passes (`now`, µs): requests parked longer than `park_us` are
    /// released (untranslated) into `out`.
    pub fn tick(&mut self, now: u64, out: &mut Vec<(usize, Vec<u8>)>) {
        if self
            .parked
            .front()
            .is_some_and(|p| now.saturating_sub(p.at) >= self.park_us)
        {
            self.stats.park_timeouts += self.parked.len() as u64;
            self.release(now, out);
        }
    }

    /// Requests parked right now.
    pub fn parked_now(&self) -> usize {
        self.parked.len()
    }

    fn release(&mut self, now: u64, out: &mut Vec<(usize, Vec<u8>)>) {
        self.parked_conns.clear();
        let parked = std::mem::take(&mut self.parked);
        for q in parked {
            let Ok(wire::Frame::Roce(p, raw)) = wire::parse(&q.raw) else {
                out.push((q.tag, q.raw));
                continue;
            };
            // Keys still unknown pass for a while without another read.
            if let Ext::Reth { rkey, .. } | Ext::Atomic { rkey, .. } = p.ext {
                if !self.table.as_ref().is_some_and(|t| t.knows(rkey)) {
                    self.unknown.insert(rkey, now);
                }
            }
            self.packet(p, raw, now, q.tag, false, out);
        }
    }

    /// A RoCEv2 packet `p` (parsed from `raw`, which came from port `tag`)
    /// at `now` (µs): the frames to send with the port each came from, in
    /// order (none if it is held or parked; more than one if it releases
    /// held responses).
    pub fn on_packet(
        &mut self,
        p: RocePacket,
        raw: &[u8],
        now: u64,
        tag: usize,
        out: &mut Vec<(usize, Vec<u8>)>,
    ) {
        self.packet(p, raw, now, tag, true, out)
    }

    fn packet(
        &mut self,
        p: RocePacket,
        raw: &[u8],
        now: u64,
        tag: usize,
        may_park: bool,
        out: &mut Vec<(usize, Vec<u8>)>,
    ) {
        if p.ip.destination == self.server {
            let ck = (p.ip.source, p.ip.destination, p.bth.dest_qp);
            if may_park && self.parked_conns.contains(&ck) {
                return self.park(ck, tag, raw, now);
            }
            if let Some(v) = wire::verb_of(&p) {
                return self.request(p, raw, v, now, tag, may_park, out);
            }
        } else if p.ip.source == self.server {
            return self.response(p, raw, tag, out);
        }
        out.push((tag, raw.to_vec()));
    }

    fn park(&mut self, conn: ConnKey, tag: usize, raw: &[u8], now: u64) {
        if self.parked.is_empty() {
            self.want_table = true;
        }
        self.stats.parked += 1;
        self.parked_conns.insert(conn);
        self.parked.push_back(Parked {
            tag,
            raw: raw.to_vec(),
            at: now,
        });
    }

    #[allow(clippy::too_many_arguments)]
    fn request(
        &mut self,
        mut p: RocePacket,
        raw: &[u8],
        v: crate::Verb,
        now: u64,
        tag: usize,
        may_park: bool,
        out: &mut Vec<(usize, Vec<u8>)>,
    ) {
        let ck = (p.ip.source, p.ip.destination, p.bth.dest_qp);
        let (va, rkey) = match p.ext {
            Ext::Reth { va, rkey, .. } | Ext::Atomic { va, rkey, .. } => (va, rkey),
            _ => return out.push((tag, raw.to_vec())),
        };
        let known = self.table.as_ref().is_some_and(|t| t.knows(rkey));
        if !known {
            let recently_unknown = self
                .unknown
                .get(&rkey)
                .is_some_and(|&at| now.saturating_sub(at) < self.park_us);
            if may_park && self.control && !recently_unknown {
                return self.park(ck, tag, raw, now);
            }
            self.stats.untranslated += 1;
            return out.push((tag, raw.to_vec()));
        }
        let (len, _) = extent(&v);
        let table = self.table.as_ref().expect("known key: a table");
        let Some(addr) = table.to_node(rkey, va, len) else {
            self.stats.outside_region += 1;
            return out.push((tag, raw.to_vec()));
        };
        self.stats.requests += 1;
        let next = self.conns.len() as ConnId + 1;
        let conn = *self.conns.entry(ck).or_insert(next);
        let last = self
            .last_psn
            .entry(conn)
            .or_insert(1 << 24 | p.bth.psn as u64);
        let psn = extend(*last, p.bth.psn);
        *last = (*last).max(psn);
        if !self.resp_conns.values().any(|&c| c == conn) {
            if self.pending.len() > 1 << 16 {
                self.pending.clear();
            }
            self.pending.insert((p.ip.source, p.bth.psn), conn);
        }
        let vg = with_addr(v, addr);
        let fwd = self.sw.on_request(
            &crate::Request {
                conn,
                psn,
                dest: 0,
                verb: vg,
            },
            now,
        );
        if fwd.verb == vg {
            return out.push((tag, raw.to_vec()));
        }
        let (flen, need) = extent(&fwd.verb);
        let Some((rk, to)) = table.to_wire(fwd.verb.addr(), flen, rkey, need) else {
            self.stats.outside_regions += 1;
            return out.push((tag, raw.to_vec()));
        };
        let wire_verb = with_addr(fwd.verb, to);
        if !wire::set_verb(&mut p, &wire_verb) {
            self.stats.unrewritable += 1;
            return out.push((tag, raw.to_vec()));
        }
        if let Ext::Reth { rkey, .. } | Ext::Atomic { rkey, .. } = &mut p.ext {
            *rkey = rk;
        }
        let mut f = p.to_bytes();
        match wire::seal(&mut f) {
            Ok(()) => {
                self.stats.rewritten += 1;
                out.push((tag, f))
            }
            Err(_) => {
                self.stats.unrewritable += 1;
                out.push((tag, raw.to_vec()))
            }
        }
    }

    fn response(&mut self, p: RocePacket, raw: &[u8], tag: usize, out: &mut Vec<(usize, Vec<u8>)>) {
        let kind = match (p.bth.opcode, p.ext) {
            (opcode::ACKNOWLEDGE, Ext::Aeth { syndrome, .. }) => match syndrome >> 5 {
                0 => RespKind::Ack,
                3 => RespKind::Nak,
                _ => return out.push((tag, raw.to_vec())), // RNR NAK: not the policy's
            },
            (opcode::ATOMIC_ACKNOWLEDGE, Ext::AtomicAck { orig, .. }) => {
                RespKind::Atomic { old: orig }
            }
            (opcode::READ_RESPONSE_ONLY, _) => RespKind::Read,
            _ => return out.push((tag, raw.to_vec())),
        };
        let client = p.ip.destination;
        let key = (client, p.bth.dest_qp);
        let conn = match self.resp_conns.get(&key) {
            Some(&c) => c,
            None => match self.pending.remove(&(client, p.bth.psn)) {
                Some(c) => {
                    self.resp_conns.insert(key, c);
                    self.pending.retain(|_, v| *v != c);
                    c
                }
                None => {
                    self.stats.unpaired += 1;
                    return out.push((tag, raw.to_vec()));
                }
            },
        };
        self.stats.responses += 1;
        let last = self.last_psn.get(&conn).copied().unwrap_or(1 << 24);
        let psn = extend(last, p.bth.psn);
        let ds: Vec<Delivery> = self.sw.on_response(&Response { conn, psn, kind });
        let mut mine = false;
        for d in ds {
            if d.conn == conn && d.psn == psn && !mine {
                mine = true;
                out.push((tag, raw.to_vec()));
            } else if let Some(f) = self.held.remove(&(d.conn, d.psn)) {
                self.stats.released += 1;
                out.push(f);
            }
        }
        if !mine {
            self.stats.held += 1;
            self.held.insert((conn, psn), (tag, raw.to_vec()));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::extend;

    #[test]
    fn psns_extend_across_the_24_bit_wrap() {
        let l = 1 << 24 | 0xFF_FFF0;
        assert_eq!(extend(l, 0xFF_FFF5), 1 << 24 | 0xFF_FFF5);
        assert_eq!(extend(l, 0x000003), 2 << 24 | 3);
        assert_eq!(extend(2 << 24 | 3, 0xFF_FFF0), 1 << 24 | 0xFF_FFF0);
        assert_eq!(extend(1 << 24 | 5, 4), 1 << 24 | 4);
    }
}
