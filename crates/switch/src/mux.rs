//! Connection multiplexing on the wire (SwordBox, NSDI'24 §4.1 and §4.5;
//! steps 2–4 of the crate's docs): clients' connections to the memory
//! node move, each whole from one PSN on, onto the switch's own queue pair
//! on the node ([`crate::ownqp`]), and the node's responses come back to
//! each client in its own connection's terms.
//!
//! Requests of a moved connection leave the switch with the switch's MAC
//! and IPv4 address as source, the node-side QPN of the switch's queue
//! pair as destination and the next PSN of the switch's one sequence (a
//! READ takes as many PSNs as it has response packets, at the path MTU);
//! the rkey, virtual address, opcode and payload are the client's. The
//! switch logs each (switch PSN → connection, client PSN). A response on
//! the switch's queue pair is mapped back by its PSN: destination MAC, IP
//! and QPN the client's, PSN the client's, resealed; the node's MSN stays
//! (rxe's completer does not read it).
//!
//! What the receiving rxe checks, and how the switch meets it
//! (drivers/infiniband/sw/rxe, Linux 6.1 in the guests):
//! - `rxe_recv.c`, `check_addr`: a packet's source IP must be the
//!   address its QP is connected to: requests on the switch's queue pair
//!   carry the switch's IP, responses to a client the node's (unchanged).
//! - `rxe_resp.c`, `check_psn`: the switch's queue pair takes the
//!   switch's PSNs in order. A client's connection cannot give up single
//!   requests: its own node-side QP would NAK the gap (sequence error) at
//!   its next direct request. So a connection moves whole, at its first
//!   new request once the switch knows the client's QPN (only the node's
//!   responses name it) and every direct request is answered (the
//!   client's completer wants its responses in PSN order, and responses
//!   from two node QPs could pass each other: a later PSN answered first
//!   makes it retry a READ or an atomic, `rxe_comp.c`, `check_psn`); the
//!   requests meanwhile wait in the switch.
//! - `rxe_resp.c`, `check_op_seq`: after a WRITE FIRST or MIDDLE a QP
//!   takes only a WRITE MIDDLE or LAST, and a MIDDLE or LAST only after
//!   a FIRST or MIDDLE (anything else is a class C error, NAK invalid
//!   request, that breaks the QP). Two clients' multi-packet WRITEs must
//!   not interleave on the switch's one queue pair: while one is under way
//!   the other connections' requests wait in the switch. And a connection
//!   moves only at a message's first packet: rxe's requester asks for an
//!   ACK every 64 packets of a long WRITE, so the response that pairs a
//!   connection may come mid-message (a first run on the guests moved a
//!   WRITE MIDDLE that way, and the node NAKed it as an invalid request).
//! - SENDs are not moved (the switch's queue pair has no receive queue
//!   for them): a connection that sends a SEND before it moves stays on
//!   its own QP for good (dmkit's RPC QPs send nothing else); a moved
//!   connection's SEND is dropped and counted. The node's own requests
//!   (an RPC reply's SEND) and the clients' responses to them pass as
//!   they are.
//!
//! Retransmissions: a client's retransmission of a moved request is sent
//! again at its switch PSN if the node has not answered it (the node
//! answers a duplicate from its saved READ and atomic replies, or ACKs a
//! WRITE), and answered from the switch's log if it has (the saved replies
//! leave tagged with the node's port, as the originals did); the node's NAK
//! sequence error on the switch's queue pair makes the switch resend its
//! log from that PSN (go-back-N on behalf of the clients, whose own PSNs
//! were fine). A response covering a WRITE it does not name (a coalesced
//! ACK) becomes an ACK to that WRITE's client.
//!
//! CAS→WRITE on top ([`MuxConfig::cas_to_write`]): with every moved
//! request on one queue pair the node applies them in the switch's order,
//! so a CAS the switch knows will succeed goes as a WRITE of its swap
//! value with no holding of other clients (the per-connection variant in
//! [`crate::caswrite`] needs it), and its ACK returns as an atomic ACK
//! with the compare value. Requests still direct (a connection not yet
//! moved) break that order: one to a word waits while moved requests to
//! it are unanswered, makes its value unknown, and no value is learned or
//! converted while it is unanswered.
//!
//! A restart of the switch, or a new queue pair of its own, loses the
//! moved connections (their node-side QPs expect PSNs they will never
//! get): the paper's failure model (§4.5) resets remapped connections too.

use std::collections::{HashMap, HashSet, VecDeque};

use serde::Serialize;

use crate::caswrite::{touched_words, Word};
use crate::ownqp::OwnRemote;
use crate::wire::{self, opcode, Ext, RocePacket};

type Ip = [u8; 4];
/// A client connection as its requests name it: (client IP, node QPN).
pub type ConnKey = (Ip, u32);

const PSN_MASK: u32 = 0xFF_FFFF;
/// Answered entries the log keeps (for replaying them to a client's
/// retransmission) beyond the unanswered ones.
const LOG_KEEP: usize = 4096;

fn psn_add(a: u32, n: u32) -> u32 {
    a.wrapping_add(n) & PSN_MASK
}

/// `a - b` in 24-bit PSN order (signed).
fn psn_diff(a: u32, b: u32) -> i32 {
    ((a.wrapping_sub(b) & PSN_MASK) << 8) as i32 >> 8
}

/// Multiplexing's configuration.
#[derive(Debug, Clone, Copy)]
pub struct MuxConfig {
    /// The memory node's IPv4 address.
    pub server: std::net::Ipv4Addr,
    /// The switch's own IPv4 address (its queue pair's).
    pub switch_ip: std::net::Ipv4Addr,
    /// The path MTU of the node's QPs in bytes (a READ of `len` bytes takes
    /// `ceil(len / mtu)` PSNs): rxe's active MTU over a 1500-byte
    /// Ethernet MTU is 1024.
    pub mtu: u32,
    /// CAS→WRITE on the moved connections.
    pub cas_to_write: bool,
}

/// Counters of multiplexing.
#[derive(Debug, Clone, Default, Serialize)]
pub struct MuxStats {
    /// Whether the switch's queue pair on the node exists.
    pub connected: bool,
    /// Client connections seen (requests to the node).
    pub connections: u64,
    /// ...moved onto the switch's queue pair.
    pub moved: u64,
    /// Requests sent on the switch's queue pair (first transmissions).
    pub mapped: u64,
    /// Requests held in the switch (a connection draining before its
    /// move, another's multi-packet WRITE, a direct request to a word).
    pub held: u64,
    /// Clients' retransmissions of moved requests sent again to the node.
    pub resent: u64,
    /// ...answered from the log (the node had answered them).
    pub replayed: u64,
    /// Requests resent after the node's NAK sequence error (go-back-N).
    pub gbn_resent: u64,
    /// NAK sequence errors on the switch's queue pair.
    pub seq_naks: u64,
    /// Responses on the switch's queue pair mapped back to a client.
    pub responses: u64,
    /// WRITE packets a later response covered without naming them (an
    /// ACK made for each that asked for one: a WRITE FIRST or MIDDLE
    /// does not).
    pub covering_acks: u64,
    /// Other NAKs passed back to the client whose request caused them.
    pub naks: u64,
    /// Responses on the switch's queue pair at a PSN the log lacks.
    pub unmatched: u64,
    /// Connections kept on their own QP: they sent a SEND before moving.
    pub pinned: u64,
    /// SENDs of moved connections (not movable): dropped.
    pub sends_dropped: u64,
    /// CASes on moved connections.
    pub cas: u64,
    /// ...sent as WRITEs (CAS→WRITE).
    pub converted: u64,
    /// Atomic ACKs made for them.
    pub atomic_acks: u64,
    /// Words whose value a CAS's atomic ACK taught.
    pub learned: u64,
    /// CASes passed that the switch knew would fail, and did not.
    pub mispredictions: u64,
    /// Rewrites the codec refused (the request or response dropped).
    pub unrewritable: u64,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    Write,
    Read,
    Atomic,
}

#[derive(Debug)]
struct Entry {
    s: u32,
    k: u32,
    conn: ConnKey,
    c: u32,
    kind: Kind,
    ack_req: bool,
    /// A CAS sent as a WRITE: its compare value (what its atomic ACK says).
    converted: Option<u64>,
    /// A CAS passed: (word, compare, swap, predicted to fail, word epoch).
    cas: Option<(Word, u64, u64, bool, u64)>,
    words: Vec<Word>,
    frame: Vec<u8>,
    /// The port the client's request arrived on: a resend (go-back-N after
    /// the node's sequence NAK) leaves from there again. Tagged with the
    /// node's port, where the NAK came from, the forwarding would drop it.
    from: usize,
    answered: bool,
    /// The frames sent to the client for it (replayed to a retransmission).
    replies: Vec<Vec<u8>>,
}

#[derive(Debug, PartialEq, Eq, Clone, Copy)]
enum Phase {
    /// Requests go on the client's own QP.
    Direct,
    /// Waiting for the direct requests' responses before the move.
    Draining,
    /// On the switch's queue pair from client PSN `from` on.
    Moved { from: u32 },
}

#[derive(Debug)]
struct Conn {
    mac: [u8; 6],
    qpn: Option<u32>,
    phase: Phase,
    /// Newest client PSN seen (last PSN of the request).
    newest: Option<u32>,
    /// Last PSN of the newest direct request, and whether it is answered.
    direct_last: Option<u32>,
    direct_done: bool,
    /// It sent a SEND before it moved: it never moves.
    pinned: bool,
    /// Requests waiting in the switch, in order (tag, frame).
    queue: VecDeque<(usize, Vec<u8>)>,
    /// Direct requests touching words, unanswered: (last PSN, word).
    direct_words: Vec<(u32, Word)>,
}

#[derive(Debug, Default)]
struct WordState {
    value: Option<u64>,
    /// Unanswered moved requests touching it.
    inflight: u32,
    /// Unanswered direct requests touching it.
    direct: u32,
    /// Bumped at every direct request touching it.
    epoch: u64,
    /// Switch PSN of the last moved request touching it.
    last: Option<u32>,
}

/// Multiplexing's state on the wire.
#[derive(Debug)]
pub struct MuxWire {
    cfg: MuxConfig,
    ip: Ip,
    mac: [u8; 6],
    server: Ip,
    remote: Option<OwnRemote>,
    next: u32,
    node_mac: Option<[u8; 6]>,
    /// The port the node's frames arrive on: a reply replayed from the log
    /// leaves as if the node had sent it again. Tagged with the client's
    /// own port instead, the switch's forwarding drops it (its destination
    /// is the port it "came from"), and a client whose response was lost
    /// retransmits for ever (rxe takes a retry count of 7 as unlimited).
    node_port: Option<usize>,
    conns: HashMap<ConnKey, Conn>,
    resp_conns: HashMap<(Ip, u32), ConnKey>,
    pending: HashMap<(Ip, u32), ConnKey>,
    log: VecDeque<Entry>,
    by_client: HashMap<(ConnKey, u32), u32>,
    /// A multi-packet WRITE under way on the switch's queue pair.
    multi: Option<ConnKey>,
    /// Connections whose queue waits for something other than their own
    /// drain (a multi-packet WRITE, a word).
    waiting: Vec<ConnKey>,
    words: HashMap<Word, WordState>,
    stats: MuxStats,
    made: Option<Vec<Vec<u8>>>,
}

impl MuxWire {
    /// Multiplexing with the switch's own address `cfg.switch_ip` (its MAC:
    /// 02:00 and the address, as [`crate::ownqp::OwnQp`] answers ARP).
    pub fn new(cfg: MuxConfig) -> Self {
        let o = cfg.switch_ip.octets();
        MuxWire {
            cfg,
            ip: o,
            mac: [0x02, 0x00, o[0], o[1], o[2], o[3]],
            server: cfg.server.octets(),
            remote: None,
            next: 0,
            node_mac: None,
            node_port: None,
            conns: HashMap::new(),
            resp_conns: HashMap::new(),
            pending: HashMap::new(),
            log: VecDeque::new(),
            by_client: HashMap::new(),
            multi: None,
            waiting: Vec::new(),
            words: HashMap::new(),
            stats: MuxStats::default(),
            made: None,
        }
    }

    /// Keeps a copy of every frame it makes, for the capture.
    pub fn keep_made(mut self) -> Self {
        self.made = Some(Vec::new());
        self
    }

    /// The frames made since the last call.
    pub fn take_made(&mut self) -> Vec<Vec<u8>> {
        self.made.as_mut().map(std::mem::take).unwrap_or_default()
    }

    /// The counters.
    pub fn stats(&self) -> MuxStats {
        self.stats.clone()
    }

    /// The control plane made the switch's queue pair on the node (again:
    /// the old one's moved connections are lost, see the module's docs).
    pub fn connected(&mut self, r: OwnRemote) {
        self.remote = Some(r);
        self.next = r.psn & PSN_MASK;
        self.log.clear();
        self.by_client.clear();
        self.multi = None;
        self.stats.connected = true;
    }

    fn push(&mut self, out: &mut Vec<(usize, Vec<u8>)>, tag: usize, f: Vec<u8>, made: bool) {
        if made {
            if let Some(m) = &mut self.made {
                m.push(f.clone());
            }
        }
        out.push((tag, f));
    }

    /// A RoCEv2 packet `p` (parsed from `raw`, from port `tag`): the frames
    /// to send, with the port each came from.
    pub fn on_packet(
        &mut self,
        p: RocePacket,
        raw: &[u8],
        _now: u64,
        tag: usize,
        out: &mut Vec<(usize, Vec<u8>)>,
    ) {
        let response = is_response(p.bth.opcode);
        if p.ip.source == self.server {
            self.node_mac = Some(p.eth.source);
            self.node_port = Some(tag);
            if p.ip.destination == self.ip {
                self.own_response(p, tag, out);
            } else if response {
                self.direct_response(p, raw, tag, out);
            } else {
                // The node's own request (an RPC reply's SEND): its QP's.
                out.push((tag, raw.to_vec()));
            }
        } else if p.ip.destination == self.server && !response {
            self.request(p, raw, tag, out);
        } else {
            // Not to the node, or a client's response to the node's request.
            out.push((tag, raw.to_vec()));
        }
    }

    fn request(&mut self, p: RocePacket, raw: &[u8], tag: usize, out: &mut Vec<(usize, Vec<u8>)>) {
        let key: ConnKey = (p.ip.source, p.bth.dest_qp);
        let psn = p.bth.psn;
        if !self.conns.contains_key(&key) {
            self.stats.connections += 1;
            self.conns.insert(
                key,
                Conn {
                    mac: p.eth.source,
                    qpn: None,
                    phase: Phase::Direct,
                    newest: None,
                    direct_last: None,
                    direct_done: true,
                    pinned: false,
                    queue: VecDeque::new(),
                    direct_words: Vec::new(),
                },
            );
        }
        let k = self.psns(&p);
        let last = psn_add(psn, k - 1);
        let c = self.conns.get_mut(&key).expect("inserted");
        c.mac = p.eth.source;
        let retrans = c.newest.is_some_and(|n| psn_diff(psn, n) <= 0);
        if c.qpn.is_none() {
            if self.pending.len() > 1 << 16 {
                self.pending.clear();
            }
            self.pending.insert((p.ip.source, last), key);
        }
        if retrans {
            return self.retransmission(key, p, raw, tag, out);
        }
        c.newest = Some(last);
        // A connection that sends SENDs stays on its own QP (the switch's
        // has no receive queue for them); one already moved cannot.
        if is_send(p.bth.opcode) && !matches!(c.phase, Phase::Moved { .. }) {
            let first = !c.pinned;
            c.pinned = true;
            if c.phase == Phase::Draining {
                c.phase = Phase::Direct;
            }
            let queued = !c.queue.is_empty();
            if queued {
                c.queue.push_back((tag, raw.to_vec()));
            }
            self.stats.pinned += u64::from(first);
            if queued {
                return self.flush(key, out);
            }
        }
        let c = self.conns.get_mut(&key).expect("known");
        // Behind its own waiting requests.
        if !c.queue.is_empty() {
            c.queue.push_back((tag, raw.to_vec()));
            self.stats.held += 1;
            return;
        }
        // Only at a message's first packet: rxe ACKs every 64th packet of a
        // long WRITE (AckReq), which may pair the connection mid-message,
        // and a WRITE MIDDLE on the switch's QP is a class C error there
        // (`check_op_seq`, NAK invalid request; seen on the guests).
        if c.phase == Phase::Direct
            && starts_message(p.bth.opcode)
            && !c.pinned
            && c.qpn.is_some()
            && self.remote.is_some()
            && self.node_mac.is_some()
        {
            c.phase = Phase::Draining;
        }
        match c.phase {
            Phase::Direct => self.direct(key, p, raw, tag, out),
            Phase::Draining => {
                if c.direct_done {
                    c.phase = Phase::Moved { from: psn };
                    self.stats.moved += 1;
                    self.send_moved(key, p, raw, tag, out);
                } else {
                    c.queue.push_back((tag, raw.to_vec()));
                    self.stats.held += 1;
                }
            }
            Phase::Moved { .. } => self.send_moved(key, p, raw, tag, out),
        }
    }

    /// PSNs a request takes.
    fn psns(&self, p: &RocePacket) -> u32 {
        match (p.bth.opcode, p.ext) {
            (opcode::READ_REQUEST, Ext::Reth { len, .. }) => {
                len.div_ceil(self.cfg.mtu.max(256)).max(1)
            }
            _ => 1,
        }
    }

    /// The words a request touches (CAS→WRITE's view).
    fn touched(&self, p: &RocePacket) -> Vec<Word> {
        if !self.cfg.cas_to_write {
            return Vec::new();
        }
        touched_words(p, self.words.keys())
    }

    /// A request on the client's own connection.
    fn direct(
        &mut self,
        key: ConnKey,
        p: RocePacket,
        raw: &[u8],
        tag: usize,
        out: &mut Vec<(usize, Vec<u8>)>,
    ) {
        let words = self.touched(&p);
        if self.in_flight(&words) {
            self.hold(key, tag, raw);
            return;
        }
        let last = psn_add(p.bth.psn, self.psns(&p) - 1);
        for w in words {
            let s = self.words.entry(w).or_default();
            s.value = None;
            s.direct += 1;
            s.epoch += 1;
            self.conns
                .get_mut(&key)
                .expect("known")
                .direct_words
                .push((last, w));
        }
        let c = self.conns.get_mut(&key).expect("known");
        c.direct_last = Some(last);
        c.direct_done = false;
        out.push((tag, raw.to_vec()));
    }

    /// Another connection's multi-packet WRITE is under way on the
    /// switch's queue pair (`check_op_seq`): `key`'s requests wait.
    fn behind_multi(&self, key: ConnKey) -> bool {
        self.multi.is_some_and(|m| m != key)
    }

    /// One of `words` has moved requests in flight: a request touching it
    /// that is still on its client's own connection waits for them.
    fn in_flight(&self, words: &[Word]) -> bool {
        words
            .iter()
            .any(|w| self.words.get(w).is_some_and(|s| s.inflight > 0))
    }

    /// Whether `key`'s request `p` must wait, for its connection's phase.
    fn must_wait(&self, key: ConnKey, phase: Phase, p: &RocePacket) -> bool {
        match phase {
            Phase::Moved { .. } => self.behind_multi(key),
            _ => self.in_flight(&self.touched(p)),
        }
    }

    /// A new request that must wait: queued behind the connection's others.
    fn hold(&mut self, key: ConnKey, tag: usize, raw: &[u8]) {
        let c = self.conns.get_mut(&key).expect("known");
        c.queue.push_back((tag, raw.to_vec()));
        self.stats.held += 1;
        self.mark_waiting(key);
    }

    /// `key` has requests waiting; [`MuxWire::release_waiting`] retries them.
    fn mark_waiting(&mut self, key: ConnKey) {
        if !self.waiting.contains(&key) {
            self.waiting.push(key);
        }
    }

    /// A new request of a moved connection: onto the switch's queue pair.
    fn send_moved(
        &mut self,
        key: ConnKey,
        p: RocePacket,
        raw: &[u8],
        tag: usize,
        out: &mut Vec<(usize, Vec<u8>)>,
    ) {
        if self.behind_multi(key) {
            self.hold(key, tag, raw);
            return;
        }
        let (Some(r), Some(node_mac)) = (self.remote, self.node_mac) else {
            // Moved only once both are known.
            self.stats.unrewritable += 1;
            return;
        };
        let kind = match p.bth.opcode {
            opcode::READ_REQUEST => Kind::Read,
            opcode::COMPARE_SWAP | opcode::FETCH_ADD => Kind::Atomic,
            opcode::WRITE_FIRST
            | opcode::WRITE_MIDDLE
            | opcode::WRITE_LAST
            | opcode::WRITE_ONLY
            | opcode::WRITE_LAST_IMM
            | opcode::WRITE_ONLY_IMM => Kind::Write,
            _ => {
                self.stats.sends_dropped += 1;
                return;
            }
        };
        let k = self.psns(&p);
        let s = self.next;
        let c_psn = p.bth.psn;
        let words = self.touched(&p);
        let mut q = p.clone();
        let mut converted = None;
        let mut cas = None;
        let mut kind = kind;
        if let (
            opcode::COMPARE_SWAP,
            Ext::Atomic {
                va,
                rkey,
                swap_add,
                compare,
            },
        ) = (p.bth.opcode, p.ext)
        {
            if self.cfg.cas_to_write {
                self.stats.cas += 1;
                let w = (rkey, va);
                let st = self.words.entry(w).or_default();
                match st.value {
                    Some(v) if v == compare && st.direct == 0 => {
                        q.bth.opcode = opcode::WRITE_ONLY;
                        q.bth.flags &= !0x30;
                        q.bth.ack_req |= 0x80;
                        q.ext = Ext::Reth { va, rkey, len: 8 };
                        q.payload = swap_add.to_le_bytes().to_vec();
                        st.value = Some(swap_add);
                        converted = Some(compare);
                        kind = Kind::Write;
                        self.stats.converted += 1;
                    }
                    // Passed as a CAS: a doomed one leaves the value as it
                    // is; an unknown one is learned from its atomic ACK.
                    known => cas = Some((w, compare, swap_add, known.is_some(), st.epoch)),
                }
            }
        } else if self.cfg.cas_to_write {
            for w in &words {
                let st = self.words.entry(*w).or_default();
                st.value = match (p.bth.opcode, p.ext) {
                    (opcode::WRITE_ONLY, Ext::Reth { va, len: 8, .. })
                        if va == w.1 && p.payload.len() >= 8 =>
                    {
                        Some(u64::from_le_bytes(p.payload[..8].try_into().unwrap()))
                    }
                    _ => None,
                };
            }
        }
        for w in &words {
            let st = self.words.entry(*w).or_default();
            st.inflight += 1;
            st.last = Some(s);
        }
        q.eth.source = self.mac;
        q.eth.destination = node_mac;
        q.ip.source = self.ip;
        q.bth.dest_qp = r.qpn;
        q.bth.psn = s;
        let frame = match wire::reseal(&mut q) {
            Ok(f) => f,
            Err(_) => {
                self.stats.unrewritable += 1;
                return;
            }
        };
        match p.bth.opcode {
            opcode::WRITE_FIRST => self.multi = Some(key),
            opcode::WRITE_LAST | opcode::WRITE_LAST_IMM => self.multi = None,
            _ => {}
        }
        self.next = psn_add(s, k);
        self.stats.mapped += 1;
        self.by_client.insert((key, c_psn), s);
        self.log.push_back(Entry {
            s,
            k,
            conn: key,
            c: c_psn,
            kind,
            ack_req: q.bth.ack_req & 0x80 != 0,
            converted,
            cas,
            words,
            frame: frame.clone(),
            from: tag,
            answered: false,
            replies: Vec::new(),
        });
        self.prune();
        self.push(out, tag, frame, true);
        if self.multi.is_none() {
            self.release_waiting(out);
        }
    }

    fn prune(&mut self) {
        while self.log.len() > LOG_KEEP && self.log.front().is_some_and(|e| e.answered) {
            let e = self.log.pop_front().expect("non-empty");
            self.by_client.remove(&(e.conn, e.c));
        }
    }

    /// A client's request at a PSN it sent before.
    fn retransmission(
        &mut self,
        key: ConnKey,
        p: RocePacket,
        raw: &[u8],
        tag: usize,
        out: &mut Vec<(usize, Vec<u8>)>,
    ) {
        let c = self.conns.get(&key).expect("known");
        let moved_from = match c.phase {
            Phase::Moved { from } => Some(from),
            _ => None,
        };
        let queued = c.queue.iter().any(|(_, f)| {
            matches!(wire::parse(f), Ok(wire::Frame::Roce(q, _)) if q.bth.psn == p.bth.psn)
        });
        if queued {
            return; // Sent when its turn comes.
        }
        match moved_from {
            Some(from) if psn_diff(p.bth.psn, from) >= 0 => {
                let Some(&s) = self.by_client.get(&(key, p.bth.psn)) else {
                    self.stats.unmatched += 1;
                    return;
                };
                let Some(e) = self.log.iter().find(|e| e.s == s) else {
                    return;
                };
                if e.answered {
                    let replies = e.replies.clone();
                    self.stats.replayed += 1;
                    // From the node's port: the replies came from there.
                    let from = self.node_port.unwrap_or(tag);
                    for f in replies {
                        self.push(out, from, f, true);
                    }
                } else {
                    let f = e.frame.clone();
                    self.stats.resent += 1;
                    self.push(out, tag, f, true);
                }
            }
            // Sent on its own connection: again there.
            _ => out.push((tag, raw.to_vec())),
        }
    }

    /// A response on a client's own connection: pairs the connection
    /// (the client's QPN), and ends its drain.
    fn direct_response(
        &mut self,
        p: RocePacket,
        raw: &[u8],
        tag: usize,
        out: &mut Vec<(usize, Vec<u8>)>,
    ) {
        let rk = (p.ip.destination, p.bth.dest_qp);
        let q = p.bth.psn;
        let key = match self.resp_conns.get(&rk) {
            Some(&k) => Some(k),
            None => match self.pending.remove(&(p.ip.destination, q)) {
                Some(k) => {
                    self.resp_conns.insert(rk, k);
                    self.pending.retain(|_, v| *v != k);
                    if let Some(c) = self.conns.get_mut(&k) {
                        c.qpn = Some(p.bth.dest_qp);
                    }
                    Some(k)
                }
                None => None,
            },
        };
        out.push((tag, raw.to_vec()));
        let Some(key) = key else { return };
        let nak = matches!(p.ext, Ext::Aeth { syndrome, .. } if syndrome >> 5 != 0);
        let done_to = if nak { psn_add(q, PSN_MASK) } else { q };
        let Some(c) = self.conns.get_mut(&key) else {
            return;
        };
        // Only a response ending a message counts (READ FIRST/MIDDLE do not).
        let ends = !matches!(
            p.bth.opcode,
            opcode::READ_RESPONSE_FIRST | opcode::READ_RESPONSE_MIDDLE
        );
        if ends && c.direct_last.is_some_and(|l| psn_diff(l, done_to) <= 0) {
            c.direct_done = true;
        }
        let mut freed = Vec::new();
        c.direct_words.retain(|&(l, w)| {
            if ends && psn_diff(l, done_to) <= 0 {
                freed.push(w);
                false
            } else {
                true
            }
        });
        for w in freed {
            if let Some(s) = self.words.get_mut(&w) {
                s.direct = s.direct.saturating_sub(1);
            }
        }
        let c = self.conns.get(&key).expect("known");
        if c.phase == Phase::Draining && c.direct_done {
            self.drain(key, out);
        }
        self.release_waiting(out);
    }

    /// A connection's drain ended: it moves, its queue goes out in order.
    fn drain(&mut self, key: ConnKey, out: &mut Vec<(usize, Vec<u8>)>) {
        let Some(c) = self.conns.get_mut(&key) else {
            return;
        };
        let Some((_, first)) = c.queue.front() else {
            return;
        };
        let Ok(wire::Frame::Roce(p, _)) = wire::parse(first) else {
            return;
        };
        c.phase = Phase::Moved { from: p.bth.psn };
        self.stats.moved += 1;
        self.flush(key, out);
    }

    /// Sends a connection's queued requests while none must wait.
    fn flush(&mut self, key: ConnKey, out: &mut Vec<(usize, Vec<u8>)>) {
        loop {
            let Some(c) = self.conns.get_mut(&key) else {
                return;
            };
            let Some((tag, f)) = c.queue.pop_front() else {
                return;
            };
            let phase = c.phase;
            let Ok(wire::Frame::Roce(p, _)) = wire::parse(&f) else {
                continue;
            };
            if self.must_wait(key, phase, &p) {
                // Back at the head: the connection's order is kept.
                self.conns
                    .get_mut(&key)
                    .expect("known")
                    .queue
                    .push_front((tag, f));
                self.mark_waiting(key);
                return;
            }
            match phase {
                Phase::Moved { .. } => self.send_moved(key, p, &f, tag, out),
                _ => self.direct(key, p, &f, tag, out),
            }
        }
    }

    fn release_waiting(&mut self, out: &mut Vec<(usize, Vec<u8>)>) {
        let ws = std::mem::take(&mut self.waiting);
        for k in ws {
            let draining = self
                .conns
                .get(&k)
                .is_some_and(|c| c.phase == Phase::Draining && !c.direct_done);
            if !draining {
                self.flush(k, out);
            } else {
                self.mark_waiting(k);
            }
        }
    }

    /// Builds the client's version of a response on the switch's queue
    /// pair: readdressed to the client's connection at client PSN `c`.
    fn to_client(&self, mut r: RocePacket, conn: ConnKey, c: u32) -> Option<Vec<u8>> {
        let cs = self.conns.get(&conn)?;
        r.eth.destination = cs.mac;
        r.ip.destination = conn.0;
        r.bth.dest_qp = cs.qpn?;
        r.bth.psn = c & PSN_MASK;
        wire::reseal(&mut r).ok()
    }

    fn own_response(&mut self, p: RocePacket, tag: usize, out: &mut Vec<(usize, Vec<u8>)>) {
        let x = p.bth.psn;
        let syn = match p.ext {
            Ext::Aeth { syndrome, .. } | Ext::AtomicAck { syndrome, .. } => Some(syndrome),
            _ => None,
        };
        let nak = syn.is_some_and(|s| s >> 5 == 3);
        let rnr = syn.is_some_and(|s| s >> 5 == 1);
        if syn == Some(0x60) {
            // Sequence error: the node expects x. Resend from there.
            self.stats.seq_naks += 1;
            let again: Vec<(usize, Vec<u8>)> = self
                .log
                .iter()
                .filter(|e| !e.answered && psn_diff(e.s, x) >= 0)
                .map(|e| (e.from, e.frame.clone()))
                .collect();
            self.stats.gbn_resent += again.len() as u64;
            for (from, f) in again {
                self.push(out, from, f, true);
            }
            return;
        }
        // A plain ACK answers only WRITEs: every one up to its PSN (it may
        // name a READ's or an atomic's PSN when the node ACKs a duplicate
        // WRITE with its latest PSN; passed on, it would complete that
        // READ or atomic without its data, `rxe_comp.c`'s
        // COMPST_WRITE_SEND). Any other response covers the WRITEs before
        // its PSN; a NAK or RNR NAK too.
        let plain_ack = p.bth.opcode == opcode::ACKNOWLEDGE && !nak && !rnr;
        let dup = self
            .log
            .iter()
            .find(|e| e.s == x && e.kind == Kind::Write && e.answered)
            .and_then(|e| e.replies.first().cloned());
        let cover_to = if plain_ack { x } else { psn_add(x, PSN_MASK) };
        let covered: Vec<usize> = self
            .log
            .iter()
            .enumerate()
            .take_while(|(_, e)| psn_diff(e.s, cover_to) <= 0)
            .filter(|(_, e)| !e.answered && e.kind == Kind::Write)
            .map(|(i, _)| i)
            .collect();
        for i in covered {
            let (conn, c, converted, ack_req) = {
                let e = &self.log[i];
                (e.conn, e.c, e.converted, e.ack_req)
            };
            let named = self.log[i].s == x;
            let f = if named && converted.is_none() {
                self.to_client(p.clone(), conn, c)
            } else {
                self.ack_for(&p, conn, c, converted)
            };
            if named {
                self.stats.responses += 1;
            } else {
                self.stats.covering_acks += 1;
            }
            self.answer(
                i,
                if ack_req || converted.is_some() {
                    f
                } else {
                    None
                },
                tag,
                out,
            );
        }
        if plain_ack {
            // Named a WRITE (answered above, or again: a duplicate) or
            // only covered the WRITEs before it.
            if let Some(f) = dup {
                self.push(out, tag, f, true);
            }
            return;
        }
        let Some(i) = self
            .log
            .iter()
            .position(|e| psn_diff(x, e.s) >= 0 && psn_diff(x, psn_add(e.s, e.k - 1)) <= 0)
        else {
            self.stats.unmatched += 1;
            return;
        };
        let (conn, c, s, k, kind, cas) = {
            let e = &self.log[i];
            (e.conn, e.c, e.s, e.k, e.kind, e.cas)
        };
        let fits = nak
            || rnr
            || match p.bth.opcode {
                opcode::READ_RESPONSE_FIRST
                | opcode::READ_RESPONSE_MIDDLE
                | opcode::READ_RESPONSE_LAST
                | opcode::READ_RESPONSE_ONLY => kind == Kind::Read,
                opcode::ATOMIC_ACKNOWLEDGE => kind == Kind::Atomic,
                _ => false,
            };
        if !fits {
            self.stats.unmatched += 1;
            return;
        }
        self.stats.responses += 1;
        if nak {
            self.stats.naks += 1;
        }
        let cpsn = psn_add(c, psn_diff(x, s) as u32);
        let f = self.to_client(p.clone(), conn, cpsn);
        if f.is_none() {
            self.stats.unrewritable += 1;
        }
        // Learn a word's value from a passed CAS's atomic ACK.
        if let (Ext::AtomicAck { orig, .. }, Some((w, compare, swap, doomed, epoch))) = (p.ext, cas)
        {
            if let Some(st) = self.words.get_mut(&w) {
                if st.last == Some(s) && st.direct == 0 && st.epoch == epoch {
                    let ok = orig == compare;
                    if ok && doomed {
                        self.stats.mispredictions += 1;
                    }
                    st.value = Some(if ok { swap } else { orig });
                    self.stats.learned += 1;
                }
            }
        }
        let ends = nak
            || matches!(
                p.bth.opcode,
                opcode::ATOMIC_ACKNOWLEDGE
                    | opcode::READ_RESPONSE_LAST
                    | opcode::READ_RESPONSE_ONLY
            ) && psn_diff(x, psn_add(s, k - 1)) == 0;
        if ends {
            self.answer(i, f, tag, out);
        } else if let Some(f) = f {
            if !self.log[i].answered {
                self.log[i].replies.push(f.clone());
            }
            self.push(out, tag, f, true);
        }
    }

    /// The ACK a client gets for its WRITE at `c` (an atomic ACK with the
    /// compare value for a CAS sent as a WRITE), from the node's response.
    fn ack_for(
        &mut self,
        r: &RocePacket,
        conn: ConnKey,
        c: u32,
        converted: Option<u64>,
    ) -> Option<Vec<u8>> {
        let msn = match r.ext {
            Ext::Aeth { msn, .. } | Ext::AtomicAck { msn, .. } => msn,
            _ => 0,
        };
        let mut a = r.clone();
        a.bth.flags &= !0x30;
        a.bth.ack_req = 0;
        a.payload.clear();
        match converted {
            Some(orig) => {
                a.bth.opcode = opcode::ATOMIC_ACKNOWLEDGE;
                a.ext = Ext::AtomicAck {
                    syndrome: 0x1F,
                    msn,
                    orig,
                };
                self.stats.atomic_acks += 1;
            }
            None => {
                a.bth.opcode = opcode::ACKNOWLEDGE;
                a.ext = Ext::Aeth {
                    syndrome: 0x1F,
                    msn,
                };
            }
        }
        wire::relength(&mut a).ok()?;
        self.to_client(a, conn, c)
    }

    /// Entry `i` is answered with `f` (sent to the client and kept for a
    /// retransmission): its words are no longer in flight.
    fn answer(
        &mut self,
        i: usize,
        f: Option<Vec<u8>>,
        tag: usize,
        out: &mut Vec<(usize, Vec<u8>)>,
    ) {
        let e = &mut self.log[i];
        let first = !e.answered;
        e.answered = true;
        if let (true, Some(f)) = (first, &f) {
            e.replies.push(f.clone());
        }
        let words = if first { e.words.clone() } else { Vec::new() };
        for w in words {
            if let Some(s) = self.words.get_mut(&w) {
                s.inflight = s.inflight.saturating_sub(1);
            }
        }
        if let Some(f) = f {
            self.push(out, tag, f, true);
        }
        if first {
            self.release_waiting(out);
        }
    }

    /// Connections moved so far, and the PSN each moved at (for tests and
    /// the stats' reader).
    pub fn moved(&self) -> Vec<(ConnKey, u32)> {
        self.conns
            .iter()
            .filter_map(|(k, c)| match c.phase {
                Phase::Moved { from } => Some((*k, from)),
                _ => None,
            })
            .collect()
    }

    /// Connections known to be paired with their client QPN.
    pub fn paired(&self) -> HashSet<ConnKey> {
        self.conns
            .iter()
            .filter(|(_, c)| c.qpn.is_some())
            .map(|(k, _)| *k)
            .collect()
    }
}

/// A responder's opcode (READ responses, ACK, atomic ACK).
fn is_response(op: u8) -> bool {
    (opcode::READ_RESPONSE_FIRST..=opcode::ATOMIC_ACKNOWLEDGE).contains(&op)
}

/// A request opcode that begins a message (not a MIDDLE or LAST).
fn starts_message(op: u8) -> bool {
    !matches!(
        op,
        opcode::SEND_MIDDLE
            | opcode::SEND_LAST
            | opcode::SEND_LAST_IMM
            | opcode::SEND_LAST_INV
            | opcode::WRITE_MIDDLE
            | opcode::WRITE_LAST
            | opcode::WRITE_LAST_IMM
    )
}

/// A SEND of any kind.
fn is_send(op: u8) -> bool {
    matches!(
        op,
        opcode::SEND_FIRST..=opcode::SEND_ONLY_IMM | opcode::SEND_LAST_INV | opcode::SEND_ONLY_INV
    )
}
