//! The policy: [`Switch`] sees every request bound for the memory nodes
//! behind it in one total order ([`Switch::on_request`]) and every
//! response coming back ([`Switch::on_response`]), and keeps only soft
//! state.
//!
//! ## Rules (SwordBox §4; each one a switch in [`SwitchConfig`])
//! - **Connection tracking** (§4.1): every request leaves a map entry in a
//!   ring of its incoming connection; a request whose sequence number has
//!   an entry is a *retransmission* and is forwarded exactly as the
//!   original was (same outgoing connection, sequence number and rewrite).
//! - **Multiplexing** (`mux`, §4.1, §4.5): requests to lock words
//!   ([`Mux::Locks`], the paper's lock micro-benchmark) or every request
//!   to the node ([`Mux::Node`], what a structure that orders its lock
//!   with its other verbs on one connection needs) go out on one shared
//!   connection per memory node, with their own outgoing
//!   sequence numbers and a map entry in that connection's ring. A
//!   (coalesced, cumulative) ACK on it is demultiplexed into one ACK per
//!   client connection it covers; a go-back-N NAK is broadcast to every
//!   client with requests outstanding past it.
//! - **CAS → WRITE** (`cas_to_write`, §4.3, §4.4.1): the switch caches each
//!   lock word it has seen settle; a CAS on a cached word is replaced by an
//!   8-byte WRITE of its outcome (the swap value if the compare matches,
//!   the cached value if not: a doomed acquire still reaches the server,
//!   so client and server agree on the verbs exchanged), and its ACK is
//!   turned back into an atomic ACK carrying the prior value. A CAS on a
//!   word not cached passes unmodified and the cache learns from its
//!   response; an 8-byte WRITE to a lock word (a release) sets it.
//! - **Clover steering** (`steer`, §4.4.2): per key, the tail the switch
//!   predicts; every append CAS of a cached key goes to the predicted
//!   tail's next word (so none can land on an older version whose
//!   successor is still in flight); one that expects the key in the
//!   predicted tail's state is predicted to succeed and moves the
//!   prediction to its new version. An address → key table (hashed,
//!   collisions replace the old entry; a WRITE to an address removes it,
//!   for a reclaimed block written anew is another key's; each append
//!   puts its new version, as the paper's "address of each write", and
//!   the address its CAS named — what a client with the same stale hint
//!   READs: without it, read and write steering's bytes per operation
//!   rose from 251 to 316 on YCSB B with 392 clients, 2 ms, readers
//!   chasing four hops before the shortcut) recognises READs
//!   of a key's versions and steers them to the key's predicted tail
//!   (`ReadWrite`), their responses held until that version's append is
//!   released (its link may not have landed when the READ does). Misses pass unmodified. **Partial steering**: only the
//!   keys of `steer_keys`, when given.
//!
//! ## Learning, ordered completion, failures (§4.5)
//! A key starts unknown: its CASes pass unmodified and are tracked until
//! one's ACK says it linked version `B` while no tracked CAS names `B` —
//! then `B` is the tail and stays so until the switch forwards another
//! append. A steered append's response is held until the responses of the
//! appends it was predicted behind have passed ([`Forward::after`]): a
//! client never learns its version is linked before the chain up to it is.
//! A packet lost between switch and server is retransmitted by its client
//! and forwarded as before, which repairs the chain; if the client died,
//! the control plane re-sends the switch's outstanding appends
//! ([`Switch::stalled`], [`Switch::control_ack`]). A restart forgets
//! everything: keys become unknown, locks uncached, and appends wait out a
//! quiet period — performance drops for a while, nothing else. (A restart
//! while a lost append awaits its retransmission is the double failure
//! SwordBox defers, §4.5: the retransmission finds no record.) A predicted append that fails (no rule lets it
//! in this model; counted as `mispredictions`) makes its key unknown again.

use std::collections::{HashMap, HashSet, VecDeque};

use crate::clover;
use crate::packet::*;

/// Which Clover requests the switch steers.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Steer {
    /// None.
    #[default]
    Off,
    /// Append CASes (write steering).
    Write,
    /// Append CASes and version READs (read and write steering).
    ReadWrite,
}

impl std::str::FromStr for Steer {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "off" => Ok(Steer::Off),
            "write" => Ok(Steer::Write),
            "read-write" => Ok(Steer::ReadWrite),
            _ => Err(format!("{s:?}: expected off, write or read-write")),
        }
    }
}

impl std::fmt::Display for Steer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Steer::Off => "off",
            Steer::Write => "write",
            Steer::ReadWrite => "read-write",
        })
    }
}

/// Which requests the switch multiplexes onto one connection per memory
/// node (§4.1).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Mux {
    /// None: every request stays on its client's connection.
    #[default]
    Off,
    /// Requests to lock words (what the paper's CAS→WRITE micro-benchmark
    /// multiplexes). A client's other requests stay on its connection, so
    /// the node may execute them out of the client's order relative to its
    /// lock operations: a structure that relies on that order (a node's
    /// write-back before its unlock, Sherman's) is not safe with it.
    Locks,
    /// Every request to the node: one order for all of them, each client's
    /// order kept (the shared connection carries everything).
    Node,
}

/// The switch's techniques and tables.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SwitchConfig {
    /// Clover steering.
    pub steer: Steer,
    /// Partial steering: only these key ids (None: every key).
    pub steer_keys: Option<Vec<u64>>,
    /// Bytes a Clover READ of a version asks for (how the switch tells
    /// them from other READs; 0: no READ is Clover's).
    pub clover_read_len: u32,
    /// Entries of the address → key table.
    pub addr_slots: usize,
    /// Which requests go onto one shared connection per memory node.
    pub mux: Mux,
    /// Replace CASes on lock words by WRITEs (needs `mux`).
    pub cas_to_write: bool,
    /// Lock words: `[start, end)` address ranges.
    pub lock_ranges: Vec<(u64, u64)>,
    /// Map entries kept per connection (retransmissions older than that
    /// pass unmodified).
    pub ring: usize,
    /// After a restart, for this long (the unit of `now`), Clover appends
    /// are held back ([`Forward::not_before`]; a switch that cannot hold a
    /// packet drops it and forwards the client's retransmission as
    /// recorded): what the switch forwarded before it forgot everything
    /// lands first, so no append it lets through unmodified can take a
    /// tail that a forgotten prediction was sent to. At least the longest
    /// time a request spends between switch and execution.
    pub quiet: u64,
}

impl Default for SwitchConfig {
    fn default() -> Self {
        Self {
            steer: Steer::Off,
            steer_keys: None,
            clover_read_len: 0,
            addr_slots: 1 << 14,
            mux: Mux::Off,
            cas_to_write: false,
            lock_ranges: Vec::new(),
            ring: 1024,
            quiet: 0,
        }
    }
}

/// What the rules did, counted.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct SwitchStats {
    /// Requests seen.
    pub requests: u64,
    /// Forwarded unchanged.
    pub passed: u64,
    /// Moved onto a shared connection.
    pub muxed: u64,
    /// CASes replaced by WRITEs.
    pub cas_to_write: u64,
    /// Appends held back in the quiet period after a restart.
    pub quieted: u64,
    /// Append CASes predicted to succeed (at the predicted tail).
    pub predicted: u64,
    /// Of those, the ones moved (the client named another address).
    pub steered_cas: u64,
    /// Append CASes moved to the predicted tail, predicted to fail.
    pub steered_doomed: u64,
    /// READs moved to a key's last acknowledged version.
    pub steered_reads: u64,
    /// Retransmissions forwarded as their originals.
    pub retransmissions: u64,
    /// Keys whose tail the switch learnt.
    pub learned: u64,
    /// Predicted appends that failed.
    pub mispredictions: u64,
    /// Address-table entries replaced by a colliding address.
    pub table_replacements: u64,
    /// Responses held back for ordered completion.
    pub held: u64,
    /// NAKs broadcast to clients of a shared connection.
    pub naks: u64,
    /// Responses delivered to clients.
    pub deliveries: u64,
    /// Restarts.
    pub restarts: u64,
}

/// A version of a key: its address and whether it holds a value.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Ver {
    addr: u64,
    present: bool,
}

/// An unmodified append in flight (a key being learnt).
#[derive(Debug, Clone, Copy)]
struct Tracked {
    token: Token,
    target: u64,
    new: Ver,
}

/// A predicted append not yet released.
#[derive(Debug, Clone, Copy)]
struct Pending {
    token: Token,
    new: Ver,
    dest: Dest,
    verb: Verb,
    sent_at: u64,
    acked: bool,
}

#[derive(Debug)]
enum KeyState {
    Learning(Vec<Tracked>),
    Known {
        pred: Ver,
        visible: Ver,
        pending: VecDeque<Pending>,
    },
}

/// A map entry of a connection's ring.
#[derive(Debug, Clone, Copy)]
struct Entry {
    token: Token,
    fwd: Forward,
    /// The CAS it carried, for the lock cache (compare, swap).
    cas: Option<(u64, u64)>,
}

/// A lock word's cache.
#[derive(Debug, Clone, Copy, Default)]
struct Lock {
    value: Option<u64>,
    /// Unmodified CASes in flight on the shared connection.
    unmod: u32,
    /// Whether the last unmodified CAS's outcome sets the value (no WRITE
    /// came after it).
    learn: bool,
}

/// A shared outgoing connection to one memory node.
#[derive(Debug, Default)]
struct Shared {
    next: u64,
    acked: u64,
    /// Entries past `acked`, in order of outgoing sequence number.
    ring: VecDeque<Entry>,
}

/// The switch's soft state.
#[derive(Debug, Default)]
struct State {
    /// Map entries of incoming connections: a ring each, indexed by
    /// sequence number modulo its size (SwordBox §4.1).
    sent: HashMap<ConnId, Vec<Option<Entry>>>,
    keys: HashMap<u64, KeyState>,
    /// Clover appends in flight: token → key.
    appends: HashMap<Token, u64>,
    /// Predicted appends whose responses are not released yet.
    unreleased: HashSet<Token>,
    /// address → key, hashed (0 = empty).
    table: Vec<(u64, u64)>,
    locks: HashMap<u64, Lock>,
    mux: HashMap<Dest, Shared>,
    /// Responses held per client connection (in order), each with the
    /// append it waits for.
    held: HashMap<ConnId, VecDeque<(Delivery, Option<Token>)>>,
}

/// SwordBox's policy over the requests bound for a set of memory nodes.
#[derive(Debug)]
pub struct Switch {
    cfg: SwitchConfig,
    steer_keys: Option<HashSet<u64>>,
    st: State,
    stats: SwitchStats,
    /// Appends are held until then (after a restart).
    quiet_until: u64,
}

/// A compare operand no Clover next word equals (an empty word's tag is
/// not all ones, a link's top bit is clear).
pub const NEVER: u64 = u64::MAX;

/// The outgoing connection id of memory node `dest`'s shared connection
/// (ids from the top of the range; a feeder numbers its connections from
/// 0).
pub fn mux_conn(dest: Dest) -> ConnId {
    ConnId::MAX - dest as ConnId
}

fn mix(x: u64) -> u64 {
    let mut z = x.wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

impl Switch {
    /// A switch with empty tables.
    pub fn new(cfg: SwitchConfig) -> Self {
        let steer_keys = cfg.steer_keys.as_ref().map(|k| k.iter().copied().collect());
        let mut s = Self {
            cfg,
            steer_keys,
            st: State::default(),
            stats: SwitchStats::default(),
            quiet_until: 0,
        };
        s.st.table = vec![(0, 0); s.cfg.addr_slots.max(1)];
        s
    }

    /// The configuration.
    pub fn config(&self) -> &SwitchConfig {
        &self.cfg
    }

    /// The counters.
    pub fn stats(&self) -> SwitchStats {
        self.stats
    }

    /// Installs the keys to steer (partial steering; `None`: every key).
    pub fn steer_only(&mut self, keys: Option<Vec<u64>>) {
        self.steer_keys = keys.as_ref().map(|k| k.iter().copied().collect());
        self.cfg.steer_keys = keys;
        // Keys no longer steered are forgotten (their appends pass).
        if let Some(set) = &self.steer_keys {
            self.st.keys.retain(|k, _| set.contains(k));
            self.st.appends.retain(|_, k| set.contains(k));
        }
    }

    /// Installs the lock words' ranges (known once the structure that
    /// owns them exists).
    pub fn set_lock_ranges(&mut self, ranges: Vec<(u64, u64)>) {
        self.cfg.lock_ranges = ranges;
    }

    /// The switch restarts at `now`: every table is lost (its configuration
    /// stays), and appends are held for the quiet period.
    pub fn restart(&mut self, now: u64) {
        self.quiet_until = now.saturating_add(self.cfg.quiet);
        self.st = State::default();
        self.st.table = vec![(0, 0); self.cfg.addr_slots.max(1)];
        self.stats.restarts += 1;
    }

    fn is_lock(&self, addr: u64) -> bool {
        self.cfg
            .lock_ranges
            .iter()
            .any(|&(a, b)| (a..b).contains(&addr))
    }

    fn steers(&self, key: u64) -> bool {
        self.steer_keys.as_ref().is_none_or(|k| k.contains(&key))
    }

    fn table_put(&mut self, addr: u64, key: u64) {
        let n = self.st.table.len();
        let slot = &mut self.st.table[(mix(addr) % n as u64) as usize];
        if slot.0 != 0 && slot.0 != addr {
            self.stats.table_replacements += 1;
        }
        *slot = (addr, key);
    }

    fn table_forget(&mut self, addr: u64) {
        let n = self.st.table.len();
        let slot = &mut self.st.table[(mix(addr) % n as u64) as usize];
        if slot.0 == addr {
            *slot = (0, 0);
        }
    }

    fn table_get(&self, addr: u64) -> Option<u64> {
        let n = self.st.table.len();
        let (a, k) = self.st.table[(mix(addr) % n as u64) as usize];
        (a == addr && a != 0).then_some(k)
    }

    /// A request reaching the switch at `now` (any unit; only the control
    /// plane's timeout compares it): where and how to forward it.
    pub fn on_request(&mut self, req: &Request, now: u64) -> Forward {
        self.stats.requests += 1;
        let tok = req.token();
        if let Some(fwd) = self.sent(tok).map(|e| e.fwd) {
            self.stats.retransmissions += 1;
            return Forward {
                action: Action::Retransmission,
                ..fwd
            };
        }
        let pass = Forward {
            conn: req.conn,
            psn: req.psn,
            verb: req.verb,
            action: Action::Pass,
            after: None,
            not_before: None,
        };
        let addr = req.verb.addr();
        let lock = self.cfg.mux != Mux::Off && self.is_lock(addr);
        let mut fwd = if lock {
            self.lock_request(req)
        } else {
            match req.verb {
                Verb::Cas {
                    addr,
                    compare,
                    swap,
                } if self.cfg.steer != Steer::Off => {
                    match (clover::empty(compare), clover::link(swap)) {
                        (Some((key, pre)), Some((new, present))) if self.steers(key) => {
                            self.append(req, now, key, pre, Ver { addr: new, present }, addr, pass)
                        }
                        _ => pass,
                    }
                }
                Verb::Read { addr, len }
                    if self.cfg.steer == Steer::ReadWrite
                        && len == self.cfg.clover_read_len
                        && len > 0 =>
                {
                    self.read(addr, pass)
                }
                Verb::Write { addr, .. } if self.cfg.steer == Steer::ReadWrite => {
                    // A block written anew (a reclaimed version reused) is no
                    // longer the key's the table says: forget it until an
                    // append names it again.
                    self.table_forget(addr);
                    pass
                }
                _ => pass,
            }
        };
        if now < self.quiet_until {
            if let Verb::Cas { compare, .. } = req.verb {
                if clover::empty(compare).is_some() {
                    // After a restart: not before the quiet period ends.
                    fwd.not_before = Some(self.quiet_until);
                    self.stats.quieted += 1;
                }
            }
        }
        if self.cfg.mux == Mux::Node && !lock {
            // Onto the shared connection, rewritten as decided.
            fwd.conn = mux_conn(req.dest);
            fwd.psn = self.mux_seq(req.dest);
            if fwd.action == Action::Pass {
                fwd.action = Action::Muxed;
            }
        }
        match fwd.action {
            Action::Pass => self.stats.passed += 1,
            Action::Muxed => self.stats.muxed += 1,
            Action::CasToWrite { .. } => self.stats.cas_to_write += 1,
            Action::SteeredCas { .. } => {
                self.stats.predicted += 1;
                if fwd.verb.addr() != addr {
                    self.stats.steered_cas += 1;
                }
            }
            Action::SteeredDoomedCas { .. } => self.stats.steered_doomed += 1,
            Action::SteeredRead { .. } => self.stats.steered_reads += 1,
            _ => {}
        }
        let cas = match req.verb {
            Verb::Cas { compare, swap, .. } => Some((compare, swap)),
            _ => None,
        };
        let ring = self.cfg.ring.max(1);
        let sent = self
            .st
            .sent
            .entry(req.conn)
            .or_insert_with(|| vec![None; ring]);
        sent[(req.psn % ring as u64) as usize] = Some(Entry {
            token: tok,
            fwd,
            cas,
        });
        if fwd.conn == mux_conn(req.dest) {
            self.st
                .mux
                .entry(req.dest)
                .or_default()
                .ring
                .push_back(Entry {
                    token: tok,
                    fwd,
                    cas,
                });
        }
        fwd
    }

    /// A request to a lock word: onto the node's shared connection; a CAS
    /// on a cached word becomes a WRITE of its outcome.
    fn lock_request(&mut self, req: &Request) -> Forward {
        let psn = self.mux_seq(req.dest);
        let lock = self.st.locks.entry(req.verb.addr()).or_default();
        let mut fwd = Forward {
            conn: mux_conn(req.dest),
            psn,
            verb: req.verb,
            action: Action::Muxed,
            after: None,
            not_before: None,
        };
        match req.verb {
            Verb::Cas {
                addr,
                compare,
                swap,
            } => match lock.value {
                Some(v) if self.cfg.cas_to_write && lock.unmod == 0 => {
                    let outcome = if v == compare { swap } else { v };
                    lock.value = Some(outcome);
                    fwd.verb = Verb::Write {
                        addr,
                        len: 8,
                        word: Some(outcome),
                    };
                    fwd.action = Action::CasToWrite { prior: v };
                }
                _ => {
                    lock.unmod += 1;
                    lock.learn = true;
                }
            },
            Verb::Write { len: 8, word, .. } => {
                lock.value = word;
                lock.learn = false;
            }
            Verb::Write { .. } | Verb::Faa { .. } => {
                lock.value = None;
                lock.learn = false;
            }
            Verb::Read { .. } => {}
        }
        fwd
    }

    /// The next sequence number of `dest`'s shared connection.
    fn mux_seq(&mut self, dest: Dest) -> u64 {
        let m = self.st.mux.entry(dest).or_default();
        m.next += 1;
        m.next
    }

    /// The map entry of request `tok`, if its connection's ring still has it.
    fn sent(&self, tok: Token) -> Option<&Entry> {
        let ring = self.st.sent.get(&tok.conn)?;
        ring[(tok.psn % ring.len() as u64) as usize]
            .as_ref()
            .filter(|e| e.token == tok)
    }

    /// A Clover append of a steered key.
    #[allow(clippy::too_many_arguments)]
    fn append(
        &mut self,
        req: &Request,
        now: u64,
        key: u64,
        pre: bool,
        new: Ver,
        target: u64,
        pass: Forward,
    ) -> Forward {
        self.table_put(new.addr, key);
        self.table_put(target, key);
        let tok = req.token();
        self.st.appends.insert(tok, key);
        let st = self
            .st
            .keys
            .entry(key)
            .or_insert_with(|| KeyState::Learning(Vec::new()));
        match st {
            KeyState::Learning(tracked) => {
                tracked.push(Tracked {
                    token: tok,
                    target,
                    new,
                });
                pass
            }
            KeyState::Known { pred, pending, .. } => {
                let Verb::Cas { compare, swap, .. } = req.verb else {
                    unreachable!("appends are CASes")
                };
                let verb = Verb::Cas {
                    addr: pred.addr,
                    compare,
                    swap,
                };
                if pred.present != pre {
                    // The key is not in the state the operation expects:
                    // it fails at the predicted tail, changing nothing —
                    // and its response, which tells the client the state
                    // of a version that may not be linked yet, waits for
                    // that version's append.
                    self.st.appends.remove(&tok);
                    return Forward {
                        verb,
                        action: Action::SteeredDoomedCas { from: target },
                        after: pending.back().map(|p| p.token),
                        ..pass
                    };
                }
                let after = pending.back().map(|p| p.token);
                self.st.unreleased.insert(tok);
                pending.push_back(Pending {
                    token: tok,
                    new,
                    dest: req.dest,
                    verb,
                    sent_at: now,
                    acked: false,
                });
                *pred = new;
                Forward {
                    verb,
                    action: Action::SteeredCas { from: target },
                    after,
                    ..pass
                }
            }
        }
    }

    /// A Clover READ: to the key's last acknowledged version.
    fn read(&mut self, addr: u64, pass: Forward) -> Forward {
        let Some(key) = self.table_get(addr) else {
            return pass;
        };
        if !self.steers(key) {
            return pass;
        }
        match self.st.keys.get(&key) {
            Some(KeyState::Known { pred, pending, .. }) if pred.addr != addr => {
                let Verb::Read { len, .. } = pass.verb else {
                    unreachable!("a read")
                };
                // To the predicted tail, its response held until that
                // version's append is released (before it, the version may
                // not be linked yet).
                Forward {
                    verb: Verb::Read {
                        addr: pred.addr,
                        len,
                    },
                    action: Action::SteeredRead { from: addr },
                    after: pending.back().map(|p| p.token),
                    ..pass
                }
            }
            _ => pass,
        }
    }

    /// The response of append `tok`: learn, release, or notice a failed
    /// prediction. Returns the appends released (in order).
    fn append_done(&mut self, tok: Token, ok: bool) -> Vec<Token> {
        let Some(key) = self.st.appends.remove(&tok) else {
            return Vec::new();
        };
        let Some(st) = self.st.keys.get_mut(&key) else {
            return Vec::new();
        };
        let mut released = Vec::new();
        match st {
            KeyState::Learning(tracked) => {
                let Some(i) = tracked.iter().position(|t| t.token == tok) else {
                    return released;
                };
                let t = tracked.swap_remove(i);
                if ok && !tracked.iter().any(|o| o.target == t.new.addr) {
                    for o in tracked.drain(..) {
                        self.st.appends.remove(&o.token);
                    }
                    *st = KeyState::Known {
                        pred: t.new,
                        visible: t.new,
                        pending: VecDeque::new(),
                    };
                    self.stats.learned += 1;
                }
            }
            KeyState::Known {
                visible, pending, ..
            } => match pending.iter_mut().find(|p| p.token == tok) {
                Some(p) if ok => {
                    p.acked = true;
                    while pending.front().is_some_and(|p| p.acked) {
                        let p = pending.pop_front().expect("front exists");
                        *visible = p.new;
                        self.st.unreleased.remove(&p.token);
                        released.push(p.token);
                    }
                }
                _ => {
                    // A predicted append failed, or an append the switch
                    // did not predict succeeded: the prediction is wrong.
                    self.stats.mispredictions += 1;
                    if let KeyState::Known { pending, .. } = st {
                        for p in pending.drain(..) {
                            self.st.appends.remove(&p.token);
                            self.st.unreleased.remove(&p.token);
                            released.push(p.token);
                        }
                    }
                    *st = KeyState::Learning(Vec::new());
                }
            },
        }
        released
    }

    /// Predicted appends forwarded before `before` and not acknowledged:
    /// the control plane re-sends them (their client may be gone) on a
    /// connection of its own, and reports each response with
    /// [`Switch::control_ack`]. (Each is a CAS at the address the switch
    /// forwarded it to; a duplicate of one that did land fails harmlessly.)
    pub fn stalled(&self, before: u64) -> Vec<(Token, Dest, Verb)> {
        let mut out: Vec<(Token, Dest, Verb)> = self
            .st
            .keys
            .values()
            .filter_map(|s| match s {
                KeyState::Known { pending, .. } => Some(pending),
                KeyState::Learning(_) => None,
            })
            .flatten()
            .filter(|p| !p.acked && p.sent_at < before)
            .map(|p| (p.token, p.dest, p.verb))
            .collect();
        out.sort_by_key(|(t, _, _)| *t);
        out
    }

    /// The response to the control plane's re-send of append `tok`: the
    /// old value of the word it CASed. A success counts as the append's
    /// acknowledgement (the client's own response, if it ever comes, is
    /// delivered as usual). Returns the client responses it releases.
    pub fn control_ack(&mut self, tok: Token, old: u64) -> Vec<Delivery> {
        let ok = match self.sent(tok).and_then(|e| e.cas) {
            Some((compare, _)) => old == compare,
            None => return Vec::new(),
        };
        let released = self.append_done(tok, ok);
        self.release(&released)
    }

    /// Unblocks held responses waiting for `released` appends; returns
    /// those that may go now.
    fn release(&mut self, released: &[Token]) -> Vec<Delivery> {
        let mut out = Vec::new();
        if released.is_empty() {
            return out;
        }
        let done: HashSet<Token> = released.iter().copied().collect();
        for q in self.st.held.values_mut() {
            for (_, wait) in q.iter_mut() {
                if wait.is_some_and(|t| done.contains(&t)) {
                    *wait = None;
                }
            }
        }
        let conns: Vec<ConnId> = self.st.held.keys().copied().collect();
        for c in conns {
            let q = self.st.held.get_mut(&c).expect("listed");
            while q.front().is_some_and(|(_, w)| w.is_none()) {
                out.push(q.pop_front().expect("front exists").0);
            }
            if q.is_empty() {
                self.st.held.remove(&c);
            }
        }
        out
    }

    /// What a response to append `tok` waits for before its client may see
    /// it: the append it was predicted behind, if that is still pending.
    fn waits_for(&self, tok: Token) -> Option<Token> {
        let key = self.st.appends.get(&tok)?;
        match self.st.keys.get(key)? {
            KeyState::Known { pending, .. } => {
                let i = pending.iter().position(|p| p.token == tok)?;
                (i > 0).then(|| pending[i - 1].token)
            }
            KeyState::Learning(_) => None,
        }
    }

    /// The predicted append request `tok` was forwarded behind, if its
    /// response is not released yet.
    fn after_of(&self, tok: Token) -> Option<Token> {
        self.sent(tok)
            .and_then(|e| e.fwd.after)
            .filter(|t| self.st.unreleased.contains(t))
    }

    /// Queues `d` behind the responses held on its connection (or behind
    /// `wait`), or returns it at once.
    fn deliver(&mut self, d: Delivery, wait: Option<Token>, out: &mut Vec<Delivery>) {
        let q = self.st.held.entry(d.conn).or_default();
        if wait.is_none() && q.is_empty() {
            self.st.held.remove(&d.conn);
            out.push(d);
        } else {
            self.stats.held += 1;
            q.push_back((d, wait));
        }
    }

    /// A response reaching the switch: the responses to send to clients.
    pub fn on_response(&mut self, resp: &Response) -> Vec<Delivery> {
        let mut out = Vec::new();
        if let Some(dest) = self
            .st
            .mux
            .keys()
            .copied()
            .find(|&d| mux_conn(d) == resp.conn)
        {
            self.mux_response(dest, resp, &mut out);
        } else {
            self.own_response(resp, &mut out);
        }
        self.stats.deliveries += out.len() as u64;
        out
    }

    /// A response on a client's own connection: passes, after the appends
    /// it waits for; an append's response teaches the switch.
    fn own_response(&mut self, resp: &Response, out: &mut Vec<Delivery>) {
        let tok = Token {
            conn: resp.conn,
            psn: resp.psn,
        };
        // The server's replay of a response the switch still holds (the
        // client retransmitted meanwhile): the held one will go.
        if self
            .st
            .held
            .get(&resp.conn)
            .is_some_and(|q| q.iter().any(|(d, _)| d.psn == resp.psn))
        {
            return;
        }
        let d = Delivery {
            conn: resp.conn,
            psn: resp.psn,
            kind: resp.kind,
        };
        if let RespKind::Atomic { old } = resp.kind {
            let cas = self.sent(tok).and_then(|e| e.cas);
            if let Some((compare, _)) = cas {
                let wait = self.waits_for(tok).or_else(|| self.after_of(tok));
                let released = self.append_done(tok, old == compare);
                self.deliver(d, wait, out);
                out.extend(self.release(&released));
                return;
            }
        }
        // A READ steered to a predicted version waits for its append.
        let wait = self.after_of(tok);
        self.deliver(d, wait, out);
    }

    /// A response on a shared connection: demultiplexed to every client
    /// it covers (one per connection, an atomic ACK per replaced CAS), or
    /// a NAK broadcast to every client with requests outstanding past it.
    fn mux_response(&mut self, dest: Dest, resp: &Response, out: &mut Vec<Delivery>) {
        let m = self.st.mux.get_mut(&dest).expect("found above");
        if resp.kind == RespKind::Nak {
            let mut first: HashMap<ConnId, u64> = HashMap::new();
            for e in m.ring.iter().filter(|e| e.fwd.psn >= resp.psn) {
                let f = first.entry(e.token.conn).or_insert(e.token.psn);
                *f = (*f).min(e.token.psn);
            }
            let mut naks: Vec<_> = first.into_iter().collect();
            naks.sort();
            for (conn, psn) in naks {
                self.stats.naks += 1;
                out.push(Delivery {
                    conn,
                    psn,
                    kind: RespKind::Nak,
                });
            }
            return;
        }
        if resp.psn <= m.acked {
            return; // a duplicate: everything it covers was delivered
        }
        m.acked = resp.psn;
        let covered: Vec<Entry> = {
            let n = m.ring.iter().take_while(|e| e.fwd.psn <= resp.psn).count();
            m.ring.drain(..n).collect()
        };
        // Per client connection: the last plainly acknowledged request.
        let mut acks: Vec<(ConnId, u64)> = Vec::new();
        for e in covered {
            let last = e.fwd.psn == resp.psn;
            let kind = match (e.fwd.action, e.fwd.verb, resp.kind) {
                (Action::CasToWrite { prior }, _, _) => Some(RespKind::Atomic { old: prior }),
                (_, Verb::Cas { .. }, RespKind::Atomic { old })
                    if last && self.st.appends.contains_key(&e.token) =>
                {
                    // A Clover append on the shared connection.
                    let compare = e.cas.map_or(NEVER, |c| c.0);
                    let wait = self.waits_for(e.token);
                    let released = self.append_done(e.token, old == compare);
                    let d = Delivery {
                        conn: e.token.conn,
                        psn: e.token.psn,
                        kind: RespKind::Atomic { old },
                    };
                    self.deliver(d, wait, out);
                    out.extend(self.release(&released));
                    continue;
                }
                (_, Verb::Cas { .. }, RespKind::Atomic { old }) if last => {
                    self.lock_settled(&e, old);
                    Some(RespKind::Atomic { old })
                }
                (_, Verb::Read { .. }, RespKind::Read) if last => Some(RespKind::Read),
                _ => None,
            };
            match kind {
                Some(k) => out.push(Delivery {
                    conn: e.token.conn,
                    psn: e.token.psn,
                    kind: k,
                }),
                None => match acks.iter_mut().find(|(c, _)| *c == e.token.conn) {
                    Some(a) => a.1 = a.1.max(e.token.psn),
                    None => acks.push((e.token.conn, e.token.psn)),
                },
            }
        }
        for (conn, psn) in acks {
            out.push(Delivery {
                conn,
                psn,
                kind: RespKind::Ack,
            });
        }
    }

    /// An unmodified CAS on a lock word settled with `old`: the cache
    /// learns the word once the last such CAS has.
    fn lock_settled(&mut self, e: &Entry, old: u64) {
        let Some((compare, swap)) = e.cas else { return };
        let lock = self.st.locks.entry(e.fwd.verb.addr()).or_default();
        lock.unmod = lock.unmod.saturating_sub(1);
        if lock.unmod == 0 && lock.learn {
            lock.value = Some(if old == compare { swap } else { old });
        }
    }
}
