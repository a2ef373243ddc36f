//! SwordBox's CAS→WRITE on the wire (NSDI'24 §4.4.1), on each client's
//! own connection: the switch caches a lock word's value, turns a CAS it
//! knows will succeed into an RDMA WRITE ONLY of the swap value (same QP,
//! same PSN, AckReq set) and turns the server's ACK for that PSN into the
//! ATOMIC ACKNOWLEDGE the client's NIC waits for, carrying the old value
//! (which the switch knows: the compare value).
//!
//! What rxe does with it (drivers/infiniband/sw/rxe, the guests' kernel):
//! - The server's responder accepts the WRITE on the client's QP: the
//!   packet's source IP, QPN and PSN are the CAS's; the QP grants remote
//!   write (dmkit's node QPs grant read, write and atomic) and the region
//!   under the rkey grants write (`check_rkey`: the 8-byte payload equals
//!   the RETH length, pad 0). It ACKs it because AckReq is set.
//! - The client's completer (`rxe_comp.c`) takes an ATOMIC ACKNOWLEDGE for
//!   a CAS WQE (`check_ack`, `COMPST_ATOMIC`) and copies its value into
//!   the CAS's result. A *plain* ACK at the CAS's PSN it would take too
//!   (`COMPST_WRITE_SEND`) and complete the CAS without writing a result,
//!   so no plain ACK for a converted PSN may reach the client: a response
//!   at a later PSN that covers a converted one (a coalesced or repeated
//!   ACK, a NAK, a READ response) is preceded by the atomic ACK synthesized
//!   for it (`check_psn` would otherwise retry the CAS).
//! - A retransmitted CAS (the client's timer) is sent as the same WRITE
//!   again: the server's responder answers a duplicate WRITE with an ACK of
//!   its latest PSN, which covers it; a CAS in its place would find no
//!   atomic reply saved for that PSN and be dropped.
//!
//! Which words: every CAS target (rkey, virtual address) becomes a cached
//! word; its value is learned from the atomic ACK of a CAS that passed
//! (success: the swap value; failure: the value returned) and follows the
//! switch's view of every request to it (a CAS converted or a WRITE of
//! the word: its value; an FAA or a WRITE covering part of it: unknown).
//! So every writer of a cached word must reach it through this switch:
//! the memory node's own CPU must not write it (a word untouched for
//! [`WORD_TTL_US`] is forgotten). The server's memory is taken to be
//! little-endian (x86, Arm): a WRITE stores the swap value's bytes in that
//! order, as the server's atomic would.
//!
//! Ordering without multiplexing: each client's requests reach the server
//! on its own QP, and rxe runs a task per QP, so two clients' requests to
//! one word may be applied in an order other than the switch's (a
//! converted WRITE taking the lock, then another client's CAS predicted to
//! fail, applied first, would succeed too). The switch restores its own
//! order by waiting: while a request to a word from one connection is
//! unanswered by the server, requests to that word from other
//! connections are held in the switch (in arrival order) and released,
//! decided afresh, when the server's response covers it. Ordering per
//! word costs a round trip between clients (the lock serializes them
//! anyway); requests of one connection are never held behind each other.
//! A CAS the switch knows will fail still goes to the server as a CAS (no
//! WRITE of the current value, which the paper sends on a multiplexed
//! connection).
//!
//! Restart: the cache, the conversion log and the holds are soft state. A
//! new switch forwards every CAS until it has learned the word again, but
//! a converted CAS of the old one still unanswered cannot be recognized:
//! its plain ACK would complete the client's CAS without a value. For
//! [`QUIET_US`] after it starts the switch drops plain ACKs at a PSN it
//! has not seen a request for (the client's timer retransmits; for an
//! ordinary request the server answers again, for a converted CAS the
//! retransmitted CAS finds no atomic reply at the server and the client's
//! QP fails after its retries): a restart may break a connection that had
//! a conversion in flight, never completes a CAS with a made-up value.

use std::collections::{HashMap, HashSet, VecDeque};

use serde::Serialize;

use crate::wire::{self, opcode, Ext, RocePacket};

/// A cached word untouched this long (µs) is forgotten.
pub const WORD_TTL_US: u64 = 1_000_000;
/// Requests held behind another connection's this long (µs) are released
/// and their word forgotten (the other client stopped answering).
pub const HOLD_US: u64 = 200_000;
/// After it starts, the switch drops plain ACKs it cannot place for this
/// long (µs; see the module's docs).
pub const QUIET_US: u64 = 500_000;

/// Counters of CAS→WRITE.
#[derive(Debug, Clone, Default, Serialize)]
pub struct CasWriteStats {
    /// CASes seen (to the server).
    pub cas: u64,
    /// CASes turned into WRITEs (first transmissions).
    pub converted: u64,
    /// Retransmitted CASes sent again as their WRITE.
    pub reconverted: u64,
    /// Retransmitted requests (a PSN at or before their connection's
    /// newest): forwarded as decided the first time.
    pub retransmissions: u64,
    /// CASes passed: the word's value unknown.
    pub passed_unknown: u64,
    /// CASes passed: the switch knew they would fail.
    pub passed_doomed: u64,
    /// ATOMIC ACKNOWLEDGEs synthesized for converted CASes.
    pub atomic_acks: u64,
    /// ...of which for a response at a later PSN that covered the CAS.
    pub covered: u64,
    /// Words whose value an atomic ACK taught.
    pub learned: u64,
    /// Passed CASes whose outcome the switch predicted wrongly.
    pub mispredictions: u64,
    /// Words forgotten: a WRITE of part of one, an FAA, a hold timeout.
    pub invalidated: u64,
    /// Requests held behind another connection's request to their word.
    pub held: u64,
    /// Held requests released after [`HOLD_US`] without an answer.
    pub hold_timeouts: u64,
    /// Words cached right now.
    pub words: u64,
    /// Plain ACKs dropped in the quiet period after a start.
    pub quiet_dropped: u64,
    /// Responses whose connection could not be paired (passed).
    pub unpaired: u64,
    /// Rewrites the codec refused (forwarded unmodified).
    pub unrewritable: u64,
}

type Ip = [u8; 4];
/// A connection as requests name it: (client IP, server QPN).
type ConnKey = (Ip, u32);
/// A connection as responses name it: (client IP, client QPN).
type RespKey = (Ip, u32);
/// A word: (rkey, virtual address).
pub(crate) type Word = (u32, u64);

const PSN_MASK: u32 = 0xFF_FFFF;

/// `a` at or before `b` in 24-bit PSN order.
fn psn_le(a: u32, b: u32) -> bool {
    (b.wrapping_sub(a) & PSN_MASK) < 1 << 23
}

#[derive(Debug, Default)]
struct WordState {
    value: Option<u64>,
    /// The connection with requests to the word the server has not
    /// answered, and the last of their PSNs.
    busy: Option<(ConnKey, u32)>,
    /// The last request that set `value` (or would: a passed CAS), whose
    /// atomic ACK may teach it.
    last: Option<(ConnKey, u32)>,
    touched: u64,
    /// Connections whose requests wait for `busy` to clear, in order.
    waiters: VecDeque<ConnKey>,
}

#[derive(Debug)]
struct Held {
    tag: usize,
    raw: Vec<u8>,
}

/// A connection's held requests: the first waits for a word, the rest
/// behind it (a connection's requests stay in order).
#[derive(Debug)]
struct HeldConn {
    since: u64,
    queue: VecDeque<Held>,
}

/// A converted CAS, by connection and PSN.
#[derive(Debug)]
struct Conv {
    psn: u32,
    orig: u64,
    write: Vec<u8>,
    answered: bool,
}

/// A CAS that passed, for learning from its atomic ACK.
#[derive(Debug, Clone, Copy)]
struct Passed {
    word: Word,
    compare: u64,
    swap: u64,
    predicted_fail: bool,
}

/// Conversions remembered per connection (answered ones beyond this are
/// dropped, oldest first).
const LOG_PER_CONN: usize = 256;

/// CAS→WRITE's state on the wire.
#[derive(Debug)]
pub struct CasWrite {
    server: Ip,
    words: HashMap<Word, WordState>,
    convs: HashMap<ConnKey, VecDeque<Conv>>,
    passed: HashMap<(ConnKey, u32), Passed>,
    /// Request PSNs of connections not paired with their responses' key.
    pending: HashMap<(Ip, u32), ConnKey>,
    resp_conns: HashMap<RespKey, ConnKey>,
    paired: HashSet<ConnKey>,
    held: HashMap<ConnKey, HeldConn>,
    /// Each connection's newest request PSN (older ones are retransmissions).
    newest: HashMap<ConnKey, u32>,
    /// Requests seen in the quiet period (client IP, PSN).
    seen: HashSet<(Ip, u32)>,
    started: Option<u64>,
    /// When words were last pruned (µs).
    pruned: u64,
    quiet_us: u64,
    stats: CasWriteStats,
    /// Copies of the frames made since [`CasWrite::take_made`] (for the
    /// capture), when asked to keep them.
    made: Option<Vec<Vec<u8>>>,
}

/// What `decide` did with a request.
enum Verdict {
    Forward,
    Send(Vec<u8>),
    Hold(Word),
}

impl CasWrite {
    /// CAS→WRITE in front of the memory node at `server`.
    pub fn new(server: std::net::Ipv4Addr) -> Self {
        CasWrite {
            server: server.octets(),
            words: HashMap::new(),
            convs: HashMap::new(),
            passed: HashMap::new(),
            pending: HashMap::new(),
            resp_conns: HashMap::new(),
            paired: HashSet::new(),
            held: HashMap::new(),
            newest: HashMap::new(),
            seen: HashSet::new(),
            started: None,
            pruned: 0,
            quiet_us: QUIET_US,
            stats: CasWriteStats::default(),
            made: None,
        }
    }

    /// Sets the quiet period after the start (µs; 0: none).
    pub fn with_quiet(mut self, us: u64) -> Self {
        self.quiet_us = us;
        self
    }

    /// Keeps a copy of every frame it makes (WRITEs, atomic ACKs) for
    /// [`CasWrite::take_made`].
    pub fn keep_made(mut self) -> Self {
        self.made = Some(Vec::new());
        self
    }

    /// The frames made since the last call (empty unless
    /// [`CasWrite::keep_made`]).
    pub fn take_made(&mut self) -> Vec<Vec<u8>> {
        self.made.as_mut().map(std::mem::take).unwrap_or_default()
    }

    fn made(&mut self, f: &[u8]) {
        if let Some(m) = &mut self.made {
            m.push(f.to_vec());
        }
    }

    /// The counters.
    pub fn stats(&self) -> CasWriteStats {
        CasWriteStats {
            words: self.words.len() as u64,
            ..self.stats.clone()
        }
    }

    fn quiet(&self, now: u64) -> bool {
        self.started
            .is_some_and(|s| now.saturating_sub(s) < self.quiet_us)
    }

    /// A RoCEv2 packet `p` (parsed from `raw`, from port `tag`) at `now`
    /// (µs): the frames to send with the port each came from, in order
    /// (none if it is held or dropped).
    pub fn on_packet(
        &mut self,
        p: RocePacket,
        raw: &[u8],
        now: u64,
        tag: usize,
        out: &mut Vec<(usize, Vec<u8>)>,
    ) {
        self.started.get_or_insert(now);
        if p.ip.destination == self.server {
            self.request(p, raw, now, tag, out)
        } else if p.ip.source == self.server {
            self.response(p, raw, now, tag, out)
        } else {
            out.push((tag, raw.to_vec()))
        }
    }

    /// Time passes: requests held longer than [`HOLD_US`] are released
    /// as they are, and the words they waited for forgotten.
    pub fn tick(&mut self, now: u64, out: &mut Vec<(usize, Vec<u8>)>) {
        let stale: Vec<ConnKey> = self
            .held
            .iter()
            .filter(|(_, h)| now.saturating_sub(h.since) >= HOLD_US)
            .map(|(c, _)| *c)
            .collect();
        for c in stale {
            let Some(h) = self.held.remove(&c) else {
                continue;
            };
            self.stats.hold_timeouts += h.queue.len() as u64;
            let before = self.words.len();
            self.words.retain(|_, s| !s.waiters.contains(&c));
            self.stats.invalidated += (before - self.words.len()) as u64;
            for x in h.queue {
                out.push((x.tag, x.raw));
            }
        }
        // Words untouched for WORD_TTL_US are forgotten (checked every
        // 100 ms), unless requests wait on them or theirs are unanswered.
        if now.saturating_sub(self.pruned) >= 100_000 {
            self.pruned = now;
            self.words.retain(|_, s| {
                now.saturating_sub(s.touched) < WORD_TTL_US
                    || !s.waiters.is_empty()
                    || s.busy.is_some()
            });
        }
    }

    /// Releases connection `c`'s held requests in order, until one must
    /// wait again.
    fn release(&mut self, c: ConnKey, now: u64, out: &mut Vec<(usize, Vec<u8>)>) {
        let Some(mut h) = self.held.remove(&c) else {
            return;
        };
        while let Some(x) = h.queue.pop_front() {
            let Ok(wire::Frame::Roce(p, _)) = wire::parse(&x.raw) else {
                out.push((x.tag, x.raw));
                continue;
            };
            match self.decide(&p, c, now) {
                Verdict::Forward => out.push((x.tag, x.raw)),
                Verdict::Send(f) => {
                    self.made(&f);
                    out.push((x.tag, f))
                }
                Verdict::Hold(w) => {
                    h.queue.push_front(x);
                    h.since = now;
                    self.held.insert(c, h);
                    self.wait_on(w, c);
                    return;
                }
            }
        }
    }

    fn wait_on(&mut self, w: Word, c: ConnKey) {
        let s = self.words.entry(w).or_default();
        if !s.waiters.contains(&c) {
            s.waiters.push_back(c);
        }
    }

    fn request(
        &mut self,
        p: RocePacket,
        raw: &[u8],
        now: u64,
        tag: usize,
        out: &mut Vec<(usize, Vec<u8>)>,
    ) {
        let conn: ConnKey = (p.ip.source, p.bth.dest_qp);
        if self.quiet(now) {
            self.seen.insert((p.ip.source, p.bth.psn));
        }
        if !self.paired.contains(&conn) {
            if self.pending.len() > 1 << 16 {
                self.pending.clear();
            }
            self.pending.insert((p.ip.source, p.bth.psn), conn);
        }
        // Behind its own connection's held requests.
        if let Some(h) = self.held.get_mut(&conn) {
            self.stats.held += 1;
            h.queue.push_back(Held {
                tag,
                raw: raw.to_vec(),
            });
            return;
        }
        match self.decide(&p, conn, now) {
            Verdict::Forward => out.push((tag, raw.to_vec())),
            Verdict::Send(f) => {
                self.made(&f);
                out.push((tag, f))
            }
            Verdict::Hold(w) => {
                self.stats.held += 1;
                self.held.insert(
                    conn,
                    HeldConn {
                        since: now,
                        queue: VecDeque::from([Held {
                            tag,
                            raw: raw.to_vec(),
                        }]),
                    },
                );
                self.wait_on(w, conn);
            }
        }
    }

    fn decide(&mut self, p: &RocePacket, conn: ConnKey, now: u64) -> Verdict {
        let psn = p.bth.psn;
        // A retransmission (a PSN at or before the connection's latest):
        // decided when it was new. A conversion goes out as the same WRITE
        // again; anything else as it is, changing nothing the switch knows
        // (a CAS that failed, sent again when the word is free, must not
        // become a WRITE: the server answers a duplicate without executing
        // it).
        if self.newest.get(&conn).is_some_and(|&h| psn_le(psn, h)) {
            self.stats.retransmissions += 1;
            if let Some(c) = self
                .convs
                .get_mut(&conn)
                .and_then(|q| q.iter_mut().find(|c| c.psn == psn))
            {
                c.answered = false;
                self.stats.reconverted += 1;
                return Verdict::Send(c.write.clone());
            }
            return Verdict::Forward;
        }
        let v = self.decide_new(p, conn, now);
        if !matches!(v, Verdict::Hold(_)) {
            self.newest.insert(conn, psn);
        }
        v
    }

    fn decide_new(&mut self, p: &RocePacket, conn: ConnKey, now: u64) -> Verdict {
        let psn = p.bth.psn;
        // Requests that change what the switch knows of a word.
        let touched = touched_words(p, self.words.keys());
        if touched.is_empty() {
            return Verdict::Forward;
        }
        // Another connection's request to one of them is unanswered: wait.
        for w in &touched {
            if let Some(s) = self.words.get(w) {
                if s.busy.is_some_and(|(c, _)| c != conn) {
                    return Verdict::Hold(*w);
                }
            }
        }
        match (p.bth.opcode, p.ext) {
            (
                opcode::COMPARE_SWAP,
                Ext::Atomic {
                    va,
                    rkey,
                    swap_add: swap,
                    compare,
                },
            ) => {
                self.stats.cas += 1;
                let w = (rkey, va);
                let s = self.words.entry(w).or_default();
                s.touched = now;
                s.busy = Some((conn, psn));
                match s.value {
                    Some(v) if v == compare => {
                        let Some(f) = cas_as_write(p) else {
                            self.stats.unrewritable += 1;
                            s.value = None;
                            s.last = Some((conn, psn));
                            self.passed.insert(
                                (conn, psn),
                                Passed {
                                    word: w,
                                    compare,
                                    swap,
                                    predicted_fail: false,
                                },
                            );
                            return Verdict::Forward;
                        };
                        s.value = Some(swap);
                        s.last = Some((conn, psn));
                        self.stats.converted += 1;
                        let q = self.convs.entry(conn).or_default();
                        q.push_back(Conv {
                            psn,
                            orig: compare,
                            write: f.clone(),
                            answered: false,
                        });
                        while q.len() > LOG_PER_CONN && q.front().is_some_and(|c| c.answered) {
                            q.pop_front();
                        }
                        Verdict::Send(f)
                    }
                    known => {
                        let doomed = known.is_some();
                        if doomed {
                            self.stats.passed_doomed += 1;
                        } else {
                            self.stats.passed_unknown += 1;
                        }
                        s.last = Some((conn, psn));
                        if self.passed.len() > 1 << 16 {
                            self.passed.clear();
                        }
                        self.passed.insert(
                            (conn, psn),
                            Passed {
                                word: w,
                                compare,
                                swap,
                                predicted_fail: doomed,
                            },
                        );
                        Verdict::Forward
                    }
                }
            }
            (opcode::WRITE_ONLY, Ext::Reth { va, rkey, len })
                if len == 8 && p.payload.len() >= 8 && self.words.contains_key(&(rkey, va)) =>
            {
                let s = self.words.get_mut(&(rkey, va)).expect("checked");
                s.value = Some(u64::from_le_bytes(p.payload[..8].try_into().unwrap()));
                s.last = Some((conn, psn));
                s.busy = Some((conn, psn));
                s.touched = now;
                Verdict::Forward
            }
            _ => {
                // An FAA, or a WRITE of part of a word or of several: the
                // value is unknown until a CAS's atomic ACK teaches it.
                for w in touched {
                    let s = self.words.entry(w).or_default();
                    if s.value.is_some() {
                        self.stats.invalidated += 1;
                    }
                    s.value = None;
                    s.last = Some((conn, psn));
                    s.busy = Some((conn, psn));
                    s.touched = now;
                }
                Verdict::Forward
            }
        }
    }

    fn response(
        &mut self,
        p: RocePacket,
        raw: &[u8],
        now: u64,
        tag: usize,
        out: &mut Vec<(usize, Vec<u8>)>,
    ) {
        let rk: RespKey = (p.ip.destination, p.bth.dest_qp);
        let q = p.bth.psn;
        let conn = match self.resp_conns.get(&rk) {
            Some(&c) => Some(c),
            None => match self.pending.remove(&(p.ip.destination, q)) {
                Some(c) => {
                    self.resp_conns.insert(rk, c);
                    self.paired.insert(c);
                    self.pending.retain(|_, v| *v != c);
                    Some(c)
                }
                None => None,
            },
        };
        let plain_ack = p.bth.opcode == opcode::ACKNOWLEDGE
            && matches!(p.ext, Ext::Aeth { syndrome, .. } if syndrome >> 5 == 0);
        if plain_ack && self.quiet(now) && !self.seen.contains(&(p.ip.destination, q)) {
            self.stats.quiet_dropped += 1;
            return;
        }
        let Some(conn) = conn else {
            self.stats.unpaired += 1;
            return out.push((tag, raw.to_vec()));
        };
        // What the response says the server has executed: PSNs up to q
        // (a NAK: before q).
        let nak = matches!(p.ext, Ext::Aeth { syndrome, .. } if syndrome >> 5 != 0);
        let done = |x: u32| {
            if nak {
                x != q && psn_le(x, q)
            } else {
                psn_le(x, q)
            }
        };
        // Atomic ACKs for converted CASes it covers, oldest first.
        let mut replaced = false;
        let mut acks = Vec::new();
        if let Some(convs) = self.convs.get_mut(&conn) {
            for c in convs.iter_mut().filter(|c| !c.answered && done(c.psn)) {
                c.answered = true;
                match atomic_ack(&p, c.psn, c.orig) {
                    Some(f) => {
                        self.stats.atomic_acks += 1;
                        if c.psn == q && plain_ack {
                            replaced = true;
                        } else {
                            self.stats.covered += 1;
                        }
                        acks.push(f);
                    }
                    None => self.stats.unrewritable += 1,
                }
            }
        }
        for f in acks {
            self.made(&f);
            out.push((tag, f));
        }
        // A plain ACK at a converted PSN already answered: the client has
        // its atomic ACK (or gets it again above); never the plain one.
        if plain_ack
            && !replaced
            && self
                .convs
                .get(&conn)
                .is_some_and(|cs| cs.iter().any(|c| c.psn == q))
        {
            replaced = true;
        }
        // Learn from an atomic ACK of a CAS that passed.
        if let (opcode::ATOMIC_ACKNOWLEDGE, Ext::AtomicAck { orig, .. }) = (p.bth.opcode, p.ext) {
            if let Some(pc) = self.passed.remove(&(conn, q)) {
                if let Some(s) = self.words.get_mut(&pc.word) {
                    if s.last == Some((conn, q)) {
                        let ok = orig == pc.compare;
                        if ok && pc.predicted_fail {
                            self.stats.mispredictions += 1;
                        }
                        s.value = Some(if ok { pc.swap } else { orig });
                        self.stats.learned += 1;
                    }
                }
            }
        }
        if !replaced {
            out.push((tag, raw.to_vec()));
        }
        // Words this connection no longer holds: release their waiters.
        let freed: Vec<Word> = self
            .words
            .iter_mut()
            .filter_map(|(w, s)| match s.busy {
                Some((c, last)) if c == conn && done(last) => {
                    s.busy = None;
                    Some(*w)
                }
                _ => None,
            })
            .collect();
        for w in freed {
            let waiters = match self.words.get_mut(&w) {
                Some(s) => std::mem::take(&mut s.waiters),
                None => continue,
            };
            for c in waiters {
                self.release(c, now, out);
            }
        }
    }
}

/// A CAS request rebuilt as an RDMA WRITE ONLY of its swap value (the
/// server's byte order: little-endian) at its address under its rkey:
/// same addresses, QPN and PSN, AckReq set, resealed. `None` if `p` is no
/// CAS or the codec cannot write it.
pub fn cas_as_write(p: &RocePacket) -> Option<Vec<u8>> {
    let Ext::Atomic {
        va, rkey, swap_add, ..
    } = p.ext
    else {
        return None;
    };
    if p.bth.opcode != opcode::COMPARE_SWAP {
        return None;
    }
    let mut w = p.clone();
    w.bth.opcode = opcode::WRITE_ONLY;
    w.bth.flags &= !0x30; // pad count 0: 8 bytes
    w.bth.ack_req |= 0x80;
    w.ext = Ext::Reth { va, rkey, len: 8 };
    w.payload = swap_add.to_le_bytes().to_vec();
    wire::reseal(&mut w).ok()
}

/// An ATOMIC ACKNOWLEDGE at `psn` carrying `orig`, built from the server's
/// response `r` on the same connection (its addresses, QPN and MSN; the
/// syndrome of an ACK: `r`'s if it is one, else ACK with unlimited
/// credit), resealed.
pub fn atomic_ack(r: &RocePacket, psn: u32, orig: u64) -> Option<Vec<u8>> {
    let (syndrome, msn) = match r.ext {
        Ext::Aeth { syndrome, msn } | Ext::AtomicAck { syndrome, msn, .. }
            if syndrome >> 5 == 0 =>
        {
            (syndrome, msn)
        }
        Ext::Aeth { msn, .. } => (0x1F, msn),
        _ => (0x1F, 0),
    };
    let mut a = r.clone();
    a.bth.opcode = opcode::ATOMIC_ACKNOWLEDGE;
    a.bth.flags &= !0x30;
    a.bth.ack_req = 0;
    a.bth.psn = psn & PSN_MASK;
    a.ext = Ext::AtomicAck {
        syndrome,
        msn,
        orig,
    };
    a.payload.clear();
    wire::reseal(&mut a).ok()
}

/// The words a request changes, of the `known` ones: a CAS's or
/// FETCH_ADD's target, or every known word a WRITE's range overlaps
/// (what the switch knows of them is stale once it lands).
pub(crate) fn touched_words<'a>(
    p: &RocePacket,
    known: impl Iterator<Item = &'a Word>,
) -> Vec<Word> {
    match (p.bth.opcode, p.ext) {
        (opcode::COMPARE_SWAP | opcode::FETCH_ADD, Ext::Atomic { va, rkey, .. }) => {
            vec![(rkey, va)]
        }
        (opcode::WRITE_ONLY | opcode::WRITE_FIRST, Ext::Reth { va, rkey, len }) => known
            .filter(|&&(k, a)| k == rkey && a < va + len as u64 && va < a + 8)
            .copied()
            .collect(),
        _ => Vec::new(),
    }
}

#[cfg(test)]
mod tests {
    use super::psn_le;

    #[test]
    fn psn_order_wraps_at_24_bits() {
        assert!(psn_le(5, 5));
        assert!(psn_le(5, 6));
        assert!(!psn_le(6, 5));
        assert!(psn_le(0xFF_FFFE, 1));
        assert!(!psn_le(1, 0xFF_FFFE));
    }
}
