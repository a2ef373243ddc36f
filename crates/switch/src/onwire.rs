//! The switch's policy ([`crate::Switch`], the same code the simulator's
//! switch position runs) on RoCEv2 packets: requests to the memory node
//! are reduced to [`crate::Request`]s, the [`crate::Forward`] the policy
//! returns is written back into the packet (the AtomicETH or RETH) and the
//! packet resealed (IP checksum, ICRC); responses are reduced to
//! [`crate::Response`]s, and a response the policy holds (ordered
//! completion of steered appends) waits in the switch until a
//! [`crate::Delivery`] names it.
//!
//! What RoCEv2 does not carry and this adapter infers:
//! - **Connections.** A request names only the destination QP; its
//!   connection is (client IP, server IP, server QP). A response names the
//!   client's QP; the adapter pairs the two on the first response by its
//!   PSN, which equals the request's (RC responses repeat the request PSN).
//! - **64-bit PSNs.** The 24-bit PSN is extended per connection, nearest
//!   to the last one seen.
//!
//! Not done on the wire: CAS→WRITE and multiplexing (a packet's shape, its
//! QPN, PSN and source address would change; see the crate's docs for why
//! rxe refuses that without a connection of the switch's own), READ
//! responses of more than one packet (passed unheld), and the quiet period
//! after a restart (`not_before`; a restarted switch starts with every key
//! unknown, which is safe).

use std::collections::HashMap;

use serde::Serialize;

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
    /// Regions (rkeys) whose address translation is learned.
    pub regions_learned: u64,
    /// Requests not shown to the policy: their rkey's translation is not
    /// learned yet.
    pub untranslated: u64,
    /// Policy decisions not applied: the new address lies in no region
    /// seen (forwarded unmodified).
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

/// The policy and the state it needs on the wire.
#[derive(Debug)]
pub struct OnWire {
    sw: Switch,
    server: Ip,
    conns: HashMap<(Ip, Ip, u32), ConnId>,
    last_psn: HashMap<ConnId, u64>,
    pending: HashMap<(Ip, u32), ConnId>,
    resp_conns: HashMap<(Ip, u32), ConnId>,
    held: HashMap<(ConnId, u64), Vec<u8>>,
    xl: Xlate,
    stats: OnWireStats,
}

/// Address translation between the wire and the policy. A packet carries
/// the NIC's virtual address of a registered region (`nic_addr + offset -
/// base`) and its rkey; the policy (like Clover's link words) speaks the
/// node's offsets. The switch learns each rkey's difference from Clover's
/// own traffic: an append CAS that links version `V` (its swap word names
/// `V`'s offset) and succeeds makes `V` its key's tail, and the next
/// append to that key that names `V` (compare: the key's empty word) is at
/// `V`'s address on the wire — three such pairs agreeing fix the rkey's
/// difference. The offsets seen under each rkey bound its region: a
/// steered address is written back only under an rkey whose seen range
/// holds it.
#[derive(Debug, Default)]
struct Xlate {
    votes: HashMap<(u32, u64), u32>,
    delta: HashMap<u32, u64>,
    range: HashMap<u32, (u64, u64)>,
    linked: HashMap<u64, u64>,
    links: HashMap<(ConnId, u64), (u64, u64, u64)>,
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

impl OnWire {
    /// The policy `cfg` in front of the memory node at `server`.
    pub fn new(cfg: SwitchConfig, server: std::net::Ipv4Addr) -> Self {
        OnWire {
            sw: Switch::new(cfg),
            server: server.octets(),
            conns: HashMap::new(),
            last_psn: HashMap::new(),
            pending: HashMap::new(),
            resp_conns: HashMap::new(),
            held: HashMap::new(),
            xl: Xlate::default(),
            stats: OnWireStats::default(),
        }
    }

    /// The counters, the policy's included.
    pub fn stats(&self) -> OnWireStats {
        let p = self.sw.stats();
        OnWireStats {
            holding: self.held.len() as u64,
            conns: self.conns.len() as u64,
            regions_learned: self.xl.delta.len() as u64,
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

    /// A RoCEv2 packet `p` (parsed from `raw`) at `now` (µs): the frames
    /// to send, in order (none if it is held; more than one if it releases
    /// held responses).
    pub fn on_packet(&mut self, p: RocePacket, raw: &[u8], now: u64, out: &mut Vec<Vec<u8>>) {
        if p.ip.destination == self.server {
            if let Some(v) = wire::verb_of(&p) {
                return self.request(p, raw, v, now, out);
            }
        } else if p.ip.source == self.server {
            return self.response(p, raw, out);
        }
        out.push(raw.to_vec());
    }

    fn request(
        &mut self,
        mut p: RocePacket,
        raw: &[u8],
        v: crate::Verb,
        now: u64,
        out: &mut Vec<Vec<u8>>,
    ) {
        self.stats.requests += 1;
        let next = self.conns.len() as ConnId + 1;
        let conn = *self
            .conns
            .entry((p.ip.source, p.ip.destination, p.bth.dest_qp))
            .or_insert(next);
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
        let (va, rkey) = match p.ext {
            Ext::Reth { va, rkey, .. } | Ext::Atomic { va, rkey, .. } => (va, rkey),
            _ => return out.push(raw.to_vec()),
        };
        // Learning the translation from Clover's appends.
        if let crate::Verb::Cas { compare, swap, .. } = v {
            if let (Some((key, _)), Some((new, _))) =
                (crate::clover::empty(compare), crate::clover::link(swap))
            {
                if let Some(&off) = self.xl.linked.get(&key) {
                    let d = va.wrapping_sub(off);
                    let n = self.xl.votes.entry((rkey, d)).or_default();
                    *n += 1;
                    if *n >= 3 {
                        self.xl.delta.entry(rkey).or_insert(d);
                    }
                }
                if self.xl.links.len() > 1 << 16 {
                    self.xl.links.clear();
                }
                self.xl.links.insert((conn, psn), (key, new, compare));
            }
        }
        let Some(&delta) = self.xl.delta.get(&rkey) else {
            self.stats.untranslated += 1;
            return out.push(raw.to_vec());
        };
        let off = va.wrapping_sub(delta);
        let r = self.xl.range.entry(rkey).or_insert((off, off));
        *r = (r.0.min(off), r.1.max(off));
        let vg = with_addr(v, off);
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
            return out.push(raw.to_vec());
        }
        let to = fwd.verb.addr();
        let in_range = |k: &u32| {
            self.xl
                .range
                .get(k)
                .is_some_and(|&(a, b)| (a..=b).contains(&to))
        };
        let Some(rk) = std::iter::once(rkey)
            .chain(self.xl.delta.keys().copied())
            .find(in_range)
        else {
            self.stats.outside_regions += 1;
            return out.push(raw.to_vec());
        };
        let wire_verb = with_addr(fwd.verb, to.wrapping_add(self.xl.delta[&rk]));
        if !wire::set_verb(&mut p, &wire_verb) {
            self.stats.unrewritable += 1;
            return out.push(raw.to_vec());
        }
        if let Ext::Reth { rkey, .. } | Ext::Atomic { rkey, .. } = &mut p.ext {
            *rkey = rk;
        }
        let mut f = p.to_bytes();
        match wire::seal(&mut f) {
            Ok(()) => {
                self.stats.rewritten += 1;
                out.push(f)
            }
            Err(_) => {
                self.stats.unrewritable += 1;
                out.push(raw.to_vec())
            }
        }
    }

    fn response(&mut self, p: RocePacket, raw: &[u8], out: &mut Vec<Vec<u8>>) {
        let kind = match (p.bth.opcode, p.ext) {
            (opcode::ACKNOWLEDGE, Ext::Aeth { syndrome, .. }) => match syndrome >> 5 {
                0 => RespKind::Ack,
                3 => RespKind::Nak,
                _ => return out.push(raw.to_vec()), // RNR NAK: not the policy's
            },
            (opcode::ATOMIC_ACKNOWLEDGE, Ext::AtomicAck { orig, .. }) => {
                RespKind::Atomic { old: orig }
            }
            (opcode::READ_RESPONSE_ONLY, _) => RespKind::Read,
            _ => return out.push(raw.to_vec()),
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
                    return out.push(raw.to_vec());
                }
            },
        };
        self.stats.responses += 1;
        let last = self.last_psn.get(&conn).copied().unwrap_or(1 << 24);
        let psn = extend(last, p.bth.psn);
        if let RespKind::Atomic { old } = kind {
            if let Some((key, new, compare)) = self.xl.links.remove(&(conn, psn)) {
                if old == compare {
                    self.xl.linked.insert(key, new);
                }
            }
        }
        let ds: Vec<Delivery> = self.sw.on_response(&Response { conn, psn, kind });
        let mut mine = false;
        for d in ds {
            if d.conn == conn && d.psn == psn && !mine {
                mine = true;
                out.push(raw.to_vec());
            } else if let Some(f) = self.held.remove(&(d.conn, d.psn)) {
                self.stats.released += 1;
                out.push(f);
            }
        }
        if !mine {
            self.stats.held += 1;
            self.held.insert((conn, psn), raw.to_vec());
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
