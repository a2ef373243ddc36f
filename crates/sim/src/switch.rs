//! The switch position (SwordBox §3.1, §5, §6): with a [`SwitchModel`] in
//! the simulation, every request bound for a memory node passes one switch
//! pipeline, in one total order (the order the engine meets requests, each
//! at the instant it reaches the switch), where `dmkit-switch`'s policy
//! may rewrite it; then it crosses to the node, where the RNIC may execute
//! it out of the switch's order (Fig. 2). Off (the default), the engine
//! takes none of these paths and runs exactly as without this module.
//!
//! ## The model
//! - **Where**: between the requester's uplink and the target's downlink.
//!   A request reaches the switch at the end of its uplink serialisation
//!   plus half the wire, leaves after the switch's processing, and takes
//!   the downlink from there.
//! - **Processing** ([`SwitchMode`]): `P4`, a pipeline at line rate that
//!   only steers (the paper's P4 prototype): `pipeline_ns` of latency, no
//!   queueing. `Dpdk`, the paper's middlebox: every packet is handled by
//!   one core, busy `core_ns` per packet (1/2.8 Mops: the paper's per-core
//!   cap, Fig. 10), and all traffic to one outgoing queue pair goes
//!   through the same core — a multiplexed connection's requests queue on
//!   one core, other requests on their own client connection's core (the
//!   paper gives each client thread a core of its own); `detour_ns` of
//!   latency each way (the hop through the middlebox server).
//! - **After the switch** (Fig. 2, "97 % of requests retain their order
//!   ... reorderings of up to 13 requests"): a request's execution is
//!   delayed by a uniform `0..reorder_ns` with probability `reorder`, so
//!   requests of *different* connections may execute out of the switch's
//!   order. One connection's requests keep their order (RC), and no
//!   request overtakes an earlier WRITE to its 64-byte line (the NIC
//!   orders a read of a line after a posted write to it): a CAS steered to
//!   a new version never overtakes the WRITE that made it. READs and
//!   atomics of other connections are free to pass each other.
//! - **Losses** between switch and server: with probability `loss` a
//!   request is lost; its client's NIC retransmits it `rto_ns` later
//!   through the switch (which forwards it as the original) and it
//!   executes then. Later requests of its connection wait (RC order), and
//!   on a multiplexed connection every later request waits (go-back-N).
//! - **Restarts**: every `restart_every_ns` the policy loses its state;
//!   Clover appends that reach it in the quiet period after a restart
//!   leave when the period ends (a P4 switch would drop them and forward
//!   their retransmissions).
//! - **Responses**: the policy sees each request's response (its outcome,
//!   from the memory effect) when the response passes the switch; a
//!   response the policy holds back (ordered completion of steered
//!   appends) delays its completion until the response it waits for.
//!
//! Known simplifications: the policy's decisions for a request use the
//! responses that passed the switch by the time the engine *applied* the
//! memory effects before the posting thread's step — up to a doorbell and
//! NIC traversal earlier than the request's own arrival (a stale view
//! delays what the switch learns; it never makes it wrong). An atomic the
//! switch replaced by a WRITE executes as a CAS of the cached value to the
//! outcome (the same effect when the cache is right, which the policy's
//! rules guarantee; a wrong cache shows as `cas_to_write_mismatches`) with
//! a WRITE's timing.

use std::collections::{HashMap, VecDeque};

use dmkit_fabric::{Executor, GlobalAddr, Op, VerbKind, WorkRequest};
use dmkit_runtime::hash::IntMap;
use dmkit_switch::{
    Action, Forward, Mux, Request, RespKind, Response, Switch, SwitchConfig, Token, Verb,
};

use crate::rng::SimRng;

/// Which switch the simulation puts between clients and memory nodes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SwitchMode {
    /// A programmable switch at line rate (steering).
    P4,
    /// A DPDK middlebox: one core per outgoing queue pair (multiplexing,
    /// CAS → WRITE, steering).
    Dpdk,
}

/// The switch position's model and policy.
#[derive(Debug, Clone, PartialEq)]
pub struct SwitchModel {
    /// P4 pipeline or DPDK middlebox.
    pub mode: SwitchMode,
    /// The policy's rules and tables.
    pub policy: SwitchConfig,
    /// P4: latency the pipeline adds (ns). The baseline model's links
    /// already cross one store-and-forward switch; SwordBox runs in its
    /// ingress pipeline (§5.1: 8 of 16 stages), so it adds nothing by
    /// default.
    pub pipeline_ns: f64,
    /// DPDK: a core's time per packet (ns). 357: the paper's 2.8 Mops per
    /// core (§6.3).
    pub core_ns: f64,
    /// DPDK: latency of the detour through the middlebox, each way (ns):
    /// one more link traversal and its NIC, about a wire crossing.
    pub detour_ns: f64,
    /// Probability that a request is delayed after the switch.
    pub reorder: f64,
    /// Longest such delay (ns).
    pub reorder_ns: u64,
    /// Whether requests the switch multiplexed onto a shared connection
    /// are delayed too. Fig. 2's reordering is *across* connections (32 in
    /// its experiment; the NIC keeps one connection's order), and
    /// multiplexing is how SwordBox obtains one order (§4.1); but one
    /// connection's requests execute in order, so one delayed request
    /// holds back every later request of the connection — on a
    /// multiplexed connection, every later request of every client to that
    /// node. On (the default): the delay applies to every request.
    pub reorder_shared: bool,
    /// Probability that a request is lost between switch and server.
    pub loss: f64,
    /// When its client retransmits it (ns after the loss).
    pub rto_ns: u64,
    /// The switch restarts this often (ns; 0: never).
    pub restart_every_ns: u64,
}

impl SwitchModel {
    /// A switch of `mode` with `policy` and the paper's figures:
    /// reordering calibrated on Fig. 2 (3 % of requests delayed, by up to
    /// 13 µs: at its 1 Mops, 13 requests), no losses, no restarts.
    pub fn new(mode: SwitchMode, policy: SwitchConfig) -> Self {
        Self {
            mode,
            policy,
            pipeline_ns: 0.0,
            core_ns: 1e3 / 2.8,
            detour_ns: 500.0,
            reorder: 0.03,
            reorder_ns: 13_000,
            reorder_shared: true,
            loss: 0.0,
            rto_ns: 100_000,
            restart_every_ns: 0,
        }
    }

    /// Checks the settings.
    pub fn validate(&self) -> Result<(), String> {
        let p = |x: f64| (0.0..=1.0).contains(&x);
        if !p(self.reorder) || !p(self.loss) {
            return Err("switch: reorder and loss are probabilities".into());
        }
        if self.loss > 0.0 && self.rto_ns == 0 {
            return Err("switch: losses need a retransmission timeout".into());
        }
        if self.policy.cas_to_write && self.policy.mux == Mux::Off {
            return Err("switch: CAS→WRITE needs multiplexing (the paper's DPDK switch)".into());
        }
        if self.policy.mux != Mux::Off && self.mode == SwitchMode::P4 {
            return Err("switch: the P4 switch does not multiplex connections (§5.2)".into());
        }
        if !(self.core_ns >= 0.0 && self.pipeline_ns >= 0.0 && self.detour_ns >= 0.0) {
            return Err("switch: latencies are non-negative".into());
        }
        Ok(())
    }
}

/// What the switch position counted (its own, beside the policy's).
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct SwitchSimStats {
    /// The policy's counters.
    pub policy: dmkit_switch::SwitchStats,
    /// Requests delayed after the switch (reordering).
    pub reordered: u64,
    /// Requests lost between switch and server (and retransmitted).
    pub lost: u64,
    /// CASes replaced by WRITEs whose cached value was not the word's.
    pub cas_to_write_mismatches: u64,
    /// Time requests waited for a DPDK core (ns, summed).
    pub core_wait_ns: f64,
}

/// A request the policy handled, until its effect is applied.
#[derive(Debug, Clone, Copy)]
struct Track {
    fwd: Forward,
}

/// What the engine takes from the switch for one request.
pub(crate) struct Passed {
    /// When it leaves the switch.
    pub depart: f64,
    /// The request to execute (rewritten or not).
    pub wr: WorkRequest,
    /// The verb whose timing it takes at the responder.
    pub timing: VerbKind,
    /// Its length for that timing.
    pub len: usize,
    token: Token,
    fwd: Forward,
    /// It goes on its client's connection, or on a shared one that carries
    /// all of that client's requests: it executes in the client's order.
    qp_order: bool,
}

impl Passed {
    /// Whether it executes in its client connection's order (not a lock
    /// request moved alone onto a shared connection, [`Mux::Locks`]).
    pub fn keeps_qp_order(&self) -> bool {
        self.qp_order
    }
}

/// The switch position: the policy, its cores, and what is in flight.
pub(crate) struct SwitchStage {
    m: SwitchModel,
    policy: Switch,
    rng: SimRng,
    /// Per client queue pair: the last sequence number used.
    psn: Vec<u64>,
    /// DPDK cores: busy until (by outgoing connection).
    cores: HashMap<u32, f64>,
    /// Multiplexed connections: their last execution, and whether it was
    /// late.
    mux_exec: HashMap<u32, (f64, bool)>,
    /// Per 64-byte line: its last WRITE's execution (line order), and
    /// whether it was late.
    line_exec: IntMap<u64, (f64, bool)>,
    /// Per client queue pair: whether its last request executed late.
    qp_late: Vec<bool>,
    /// Requests the policy tracks, by their effect's sequence number.
    tracked: IntMap<u64, Track>,
    /// Completions of requests by token (ordered completion), kept until
    /// the switch's time passes them (a later request's completion cannot
    /// come before one that has).
    cq: HashMap<Token, f64>,
    cq_expiry: std::collections::BinaryHeap<std::cmp::Reverse<(u64, Token)>>,
    /// Responses that passed the switch, in order, not yet shown to the
    /// policy: (when, response).
    responses: VecDeque<(f64, Response)>,
    next_restart: f64,
    half_wire: f64,
    stats: SwitchSimStats,
}

/// The 64-byte lines request `wr` touches.
fn lines(wr: &WorkRequest) -> std::ops::RangeInclusive<u64> {
    let raw = wr.remote.raw();
    let len = wr.len().max(1) as u64;
    (raw >> 6)..=((raw + len - 1) >> 6)
}

/// The operands of a request as the switch reads them.
fn verb_of(wr: &WorkRequest, exec: &Executor) -> Option<Verb> {
    let addr = wr.remote.raw();
    let len = wr.len() as u32;
    Some(match wr.op {
        Op::Read { .. } | Op::ReadV { .. } => Verb::Read { addr, len },
        Op::Write { local, .. } => Verb::Write {
            addr,
            len,
            word: (len == 8).then(|| exec.local_word(local)).flatten(),
        },
        Op::WriteV { .. } => Verb::Write {
            addr,
            len,
            word: None,
        },
        Op::Cas { expected, desired } => Verb::Cas {
            addr,
            compare: expected,
            swap: desired,
        },
        Op::Faa { add } => Verb::Faa { addr, add },
        Op::MaskedCas { .. } => return None,
    })
}

impl SwitchStage {
    pub(crate) fn new(m: SwitchModel, seed: u64, half_wire: f64) -> Self {
        let policy = Switch::new(m.policy.clone());
        let next_restart = if m.restart_every_ns == 0 {
            f64::INFINITY
        } else {
            m.restart_every_ns as f64
        };
        Self {
            policy,
            rng: SimRng::new(seed ^ 0x050D_B0C5),
            psn: Vec::new(),
            cores: HashMap::new(),
            mux_exec: HashMap::new(),
            line_exec: IntMap::default(),
            qp_late: Vec::new(),
            tracked: IntMap::default(),
            cq: HashMap::new(),
            cq_expiry: std::collections::BinaryHeap::new(),
            responses: VecDeque::new(),
            next_restart,
            half_wire,
            stats: SwitchSimStats::default(),
            m,
        }
    }

    /// The policy (to install the keys to steer, say).
    pub(crate) fn policy_mut(&mut self) -> &mut Switch {
        &mut self.policy
    }

    pub(crate) fn stats(&self) -> SwitchSimStats {
        SwitchSimStats {
            policy: self.policy.stats(),
            ..self.stats
        }
    }

    /// Shows the policy the responses that passed the switch by `t`, and
    /// restarts it if one is due; forgets completions before `t`.
    fn catch_up(&mut self, t: f64) {
        while let Some(std::cmp::Reverse((at, tok))) = self.cq_expiry.peek().copied() {
            if at as f64 >= t {
                break;
            }
            self.cq_expiry.pop();
            if self.cq.get(&tok).is_some_and(|c| c.ceil() as u64 == at) {
                self.cq.remove(&tok);
            }
        }
        while self.responses.front().is_some_and(|(at, _)| *at <= t) {
            let (_, r) = self.responses.pop_front().expect("front exists");
            let _ = self.policy.on_response(&r);
        }
        while t >= self.next_restart {
            self.policy.restart(self.next_restart as u64);
            self.next_restart += self.m.restart_every_ns as f64;
        }
    }

    /// Request `wr` of client queue pair `qi` reaches the switch at `at`:
    /// the policy's decision, the core it waits for, and the request to
    /// execute.
    pub(crate) fn pass(&mut self, qi: usize, at: f64, wr: &WorkRequest, exec: &Executor) -> Passed {
        self.catch_up(at);
        if self.psn.len() <= qi {
            self.psn.resize(qi + 1, 0);
        }
        self.psn[qi] += 1;
        let conn = qi as u32;
        let token = Token {
            conn,
            psn: self.psn[qi],
        };
        let pass = Forward {
            conn,
            psn: token.psn,
            verb: Verb::Read { addr: 0, len: 0 },
            action: Action::Pass,
            after: None,
            not_before: None,
        };
        let fwd = match verb_of(wr, exec) {
            Some(verb) => {
                let req = Request {
                    conn,
                    psn: token.psn,
                    dest: wr.remote.node(),
                    verb,
                };
                self.policy.on_request(&req, at as u64)
            }
            None => pass,
        };
        let depart = match self.m.mode {
            SwitchMode::P4 => at + self.m.pipeline_ns,
            SwitchMode::Dpdk => {
                let core = self.cores.entry(fwd.conn).or_insert(0.0);
                let start = at.max(*core);
                self.stats.core_wait_ns += start - at;
                *core = start + self.m.core_ns;
                start + self.m.core_ns + self.m.detour_ns
            }
        };
        // Held back (the quiet period after a restart).
        let depart = fwd.not_before.map_or(depart, |t| depart.max(t as f64));
        let (wr, timing, len) = self.rewrite(wr, &fwd);
        let qp_order = fwd.conn == conn || self.m.policy.mux == Mux::Node;
        Passed {
            depart,
            wr,
            timing,
            len,
            token,
            fwd,
            qp_order,
        }
    }

    /// The work request to execute for `fwd`, and the verb and length its
    /// timing at the responder is that of.
    fn rewrite(&self, wr: &WorkRequest, fwd: &Forward) -> (WorkRequest, VerbKind, usize) {
        let mut out = *wr;
        let at = |addr: u64| {
            let a = GlobalAddr::from_raw(addr);
            // Steering stays on the node the client named.
            if a.node() == wr.remote.node() {
                a
            } else {
                wr.remote
            }
        };
        match (fwd.action, fwd.verb) {
            (Action::Pass | Action::Muxed, _) => {}
            (
                Action::CasToWrite { prior },
                Verb::Write {
                    addr,
                    word: Some(w),
                    ..
                },
            ) => {
                out.remote = at(addr);
                out.op = Op::Cas {
                    expected: prior,
                    desired: w,
                };
                return (out, VerbKind::Write, 8);
            }
            (
                _,
                Verb::Cas {
                    addr,
                    compare,
                    swap,
                },
            ) => {
                out.remote = at(addr);
                out.op = Op::Cas {
                    expected: compare,
                    desired: swap,
                };
            }
            (_, Verb::Read { addr, .. }) => out.remote = at(addr),
            _ => {}
        }
        (out, out.kind(), out.len())
    }

    /// After the switch: reordering, loss, and the orders that hold
    /// (the outgoing connection's, the WRITEs' lines). Returns the
    /// execution instant and whether the request executes late (reordered,
    /// or lost and retransmitted): its response then must not hold back
    /// those of requests that executed before it — without
    /// `link.response_gaps` the engine's links are FIFOs in the order it
    /// meets requests, and a late response would block the node's uplink
    /// for everything met after it, which a reordering NIC does not do
    /// (with it, a late response takes a later gap and holds back none). A request that waits for a late one (the
    /// next of its queue pair, of its shared connection, or on a line a
    /// late WRITE holds) executes late too: its response is as far from
    /// the links' order (the second READ of a doorbell batch whose first
    /// was delayed, the CAS after its version's delayed WRITE).
    ///
    /// `qp_last` is the client queue pair's last execution: a request that
    /// keeps its client's order follows it before it takes its place on a
    /// shared connection (else the shared connection's order would not be
    /// the order of its execution).
    pub(crate) fn execute_at(&mut self, p: &Passed, exec: f64, qp_last: f64) -> (f64, bool) {
        let mut exec = exec;
        let mut late = false;
        let shared = p.fwd.conn != p.token.conn;
        if self.m.reorder > 0.0
            && (self.m.reorder_shared || !shared)
            && self.rng.chance(self.m.reorder)
        {
            exec += self.rng.below(self.m.reorder_ns + 1) as f64;
            self.stats.reordered += 1;
            late = true;
        }
        if self.m.loss > 0.0 && self.rng.chance(self.m.loss) {
            late = true;
            // Lost; the retransmission passes the switch again (forwarded as
            // the original) and executes a timeout later.
            exec += self.m.rto_ns as f64;
            self.stats.lost += 1;
            let again = Request {
                conn: p.token.conn,
                psn: p.token.psn,
                dest: p.wr.remote.node(),
                verb: p.fwd.verb,
            };
            let f = self.policy.on_request(&again, exec as u64);
            debug_assert!(
                f.action == Action::Retransmission || f.action == Action::Pass,
                "a retransmission is forwarded as its original"
            );
        }
        let qi = p.token.conn as usize;
        if self.qp_late.len() <= qi {
            self.qp_late.resize(qi + 1, false);
        }
        if p.qp_order && qp_last + 1.0 > exec {
            exec = qp_last + 1.0;
            late |= self.qp_late[qi];
        }
        if p.fwd.conn != p.token.conn {
            let (last, was_late) = self.mux_exec.entry(p.fwd.conn).or_insert((0.0, false));
            if *last + 1.0 > exec {
                exec = *last + 1.0;
                late |= *was_late;
            }
            *last = exec;
            *was_late = late;
        }
        for line in lines(&p.wr) {
            if let Some(&(l, was_late)) = self.line_exec.get(&line) {
                if l + 1.0 > exec {
                    exec = l + 1.0;
                    late |= was_late;
                }
            }
        }
        if p.qp_order {
            self.qp_late[qi] = late;
        }
        (exec, late)
    }

    /// The request's completion `cq` (as the engine computed it), held
    /// until the response it waits for; the request is tracked until its
    /// effect (sequence number `seq`) is applied.
    pub(crate) fn complete(
        &mut self,
        p: &Passed,
        seq: u64,
        exec: f64,
        spread: f64,
        cq: f64,
        late: bool,
    ) -> f64 {
        // A WRITE's lines: nothing later may execute there before its last
        // piece has landed.
        if p.wr.kind() == VerbKind::Write {
            for line in lines(&p.wr) {
                let l = self.line_exec.entry(line).or_insert((0.0, false));
                if exec + spread >= l.0 {
                    *l = (exec + spread, late);
                }
            }
        }
        let mut cq = cq;
        if self.m.mode == SwitchMode::Dpdk {
            cq += self.m.detour_ns;
        }
        if let Some(before) = p.fwd.after.and_then(|t| self.cq.get(&t)) {
            cq = cq.max(*before + 1.0);
        }
        let tracked = matches!(p.fwd.verb, Verb::Cas { .. }) || p.fwd.conn != p.token.conn;
        if tracked {
            self.cq.insert(p.token, cq);
            self.cq_expiry
                .push(std::cmp::Reverse((cq.ceil() as u64, p.token)));
            self.tracked.insert(seq, Track { fwd: p.fwd });
        }
        cq
    }

    /// The effect with sequence number `seq` was applied at `at` with
    /// result `value` (the old word of an atomic): its response goes back
    /// through the switch.
    pub(crate) fn executed(&mut self, seq: u64, at: u64, value: Option<u64>) {
        let Some(t) = self.tracked.remove(&seq) else {
            return;
        };
        let kind = match (t.fwd.action, t.fwd.verb, value) {
            (Action::CasToWrite { prior }, _, Some(old)) => {
                if old != prior {
                    self.stats.cas_to_write_mismatches += 1;
                }
                RespKind::Ack
            }
            (_, Verb::Cas { .. }, Some(old)) => RespKind::Atomic { old },
            (_, Verb::Read { .. }, _) => RespKind::Read,
            _ => RespKind::Ack,
        };
        let resp = Response {
            conn: t.fwd.conn,
            psn: t.fwd.psn,
            kind,
        };
        // (Effects are applied in time order: the queue stays sorted.)
        self.responses.push_back((at as f64 + self.half_wire, resp));
    }
}
