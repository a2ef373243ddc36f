//! The engine: simulated machines (CPU cost scaling, doorbell registers,
//! requester NIC, links, responder, atomic unit), connections, and the
//! queue of memory effects ordered by simulated instant.
//!
//! Timing is computed when a batch is posted, stage by stage, with every
//! shared resource a FIFO server that remembers when it is next free
//! (`*_free`, in fractional ns). The *effect* of each request on memory is
//! not applied then: it is queued for its execution instant and applied,
//! in instant order across all connections, before any virtual thread runs
//! at a later instant. So a READ sees memory as it is at its simulated
//! execution, and a completion becomes visible at its simulated delivery.

use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap, VecDeque};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use dmkit_fabric::{
    Batch, Completion, Executor, LocalRef, NodeId, Op, PostError, QpPolicy, RequestError,
    VerbError, VerbKind, WorkRequest,
};

use dmkit_fabric::hint::prefetch;
use dmkit_runtime::hash::IntMap;

use crate::faults::Faults;
use crate::numa::{NumaLayout, CROSS_LOCAL, CROSS_REMOTE};
use crate::profile::{AtomicOrder, Profile};
use crate::rng::SimRng;
use crate::switch::SwitchStage;

/// A virtual thread's index.
pub type ThreadId = u32;

/// Simulated nanoseconds.
pub type Time = u64;

/// Counters of a simulation run.
#[derive(Debug, Clone, Copy, Default, PartialEq, serde::Serialize)]
pub struct SimStats {
    /// Batches posted (one doorbell ring each).
    pub doorbells: u64,
    /// Requests that entered the simulated network (a torn one counts once).
    pub posted: u64,
    /// Requests whose every piece was applied at the responder, failed ones
    /// included.
    pub executed: u64,
    /// Completions delivered to the poller: every signaled request, plus the
    /// unsignaled ones that failed or were flushed.
    pub completed: u64,
    /// READs that executed without error, scatter/gather ones included.
    pub reads: u64,
    /// WRITEs that executed without error, scatter/gather and inline ones
    /// included.
    pub writes: u64,
    /// CAS, masked CAS and FAA that executed without error.
    pub atomics: u64,
    /// Payload bytes of the counted READs.
    pub bytes_read: u64,
    /// Payload bytes of the counted WRITEs.
    pub bytes_written: u64,
    /// Bytes on the wire (payload + headers), all links, one direction each.
    pub wire_bytes: u64,
    /// Bytes the requester NICs moved over PCIe (WQEs, CQEs, data, misses).
    pub pcie_bytes: f64,
    /// Requests whose WQE missed the NIC's cache (fractional: expected misses).
    pub wqe_misses: f64,
    /// Requests whose remote page missed the responder's translation (MTT)
    /// cache, each costing `responder.mtt_miss_ns` (Thinking More about RDMA
    /// Memory Semantics, CLUSTER'21 §III-B).
    pub mtt_misses: u64,
    /// Time threads spent spinning on doorbell or queue-pair locks (ns).
    pub lock_spin_ns: f64,
    /// Requests the `torn` fault split into pieces.
    pub torn: u64,
    /// Requests the `delay` fault held back.
    pub delayed: u64,
    /// Connections the `disconnect` fault cut (one per post it hit).
    pub disconnects: u64,
    /// Requests that failed, flushed ones not included (a check of the
    /// contract, or a lost connection).
    pub failed: u64,
    /// Memory effects applied (torn requests count once per piece).
    pub effects: u64,
}

/// A spinlock in simulated time (SMART §2.2, §3.1: every doorbell of the
/// mlx5 driver is guarded by one). Holding it for one post costs `lock_ns`,
/// plus `bounce_ns` when the previous holder was another thread (the lock's
/// cache line moves to this core), plus `handoff_ns` for each holder this
/// thread waited behind, up to `max_spinners` (every release invalidates
/// the line in each spinning core). Threads that merely *share* the lock
/// but are busy elsewhere cost nothing: with one queue pair to each of 8
/// memory nodes, 94 threads all share every doorbell, but only those
/// posting right now contend.
///
/// The lock is a calendar of holds, not a FIFO "free at" instant: a virtual
/// thread runs a whole executor step at once, so it may book several posts
/// ahead of the engine's clock; another thread arriving earlier than those
/// bookings takes the lock in the gaps between them (the spinlock's winner
/// is whoever asks first in *virtual* time, not in stepping order).
#[derive(Debug, Default)]
struct SimLock {
    /// Holds booked, sorted and disjoint, from `holds[first]` (the ones
    /// before it are forgotten: a plain vector with a start index, emptied
    /// whenever every hold is forgotten, costs less per post than a ring).
    holds: Vec<Hold>,
    first: usize,
    /// Holder of the last hold forgotten (the line's owner before `holds`).
    last: Option<Option<ThreadId>>,
    /// Distinct threads using it (`None` = the external caller): a bound on
    /// how many can spin at once.
    users: Vec<Option<ThreadId>>,
}

#[derive(Debug, Clone, Copy)]
struct Hold {
    grant: f64,
    release: f64,
    owner: Option<ThreadId>,
}

impl SimLock {
    fn join(&mut self, t: Option<ThreadId>) {
        if !self.users.contains(&t) {
            self.users.push(t);
        }
    }

    /// Forgets the holds released by `now`.
    #[inline(always)]
    fn forget(&mut self, now: f64) {
        while let Some(h) = self.holds.get(self.first) {
            if h.release > now {
                break;
            }
            self.last = Some(h.owner);
            self.first += 1;
        }
        if self.first == self.holds.len() {
            self.holds.clear();
            self.first = 0;
        } else if self.first >= 64 && 2 * self.first >= self.holds.len() {
            self.holds.drain(..self.first);
            self.first = 0;
        }
    }

    /// `owner` acquires at `t` for one post; returns (release instant, spin
    /// time). No later call asks before `now`, so holds released by then
    /// are forgotten.
    fn acquire(&mut self, owner: Option<ThreadId>, t: f64, now: f64, p: &Profile) -> (f64, f64) {
        self.forget(now);
        // Past every booked hold (a thread posting on its own doorbell,
        // or an idle lock): granted at once, after the last holder — the
        // walk of [`book`] with nobody ahead (its sum spelt the same, `× 0`
        // included, so the hold is the same to the bit).
        let back = self.holds.last();
        if back.is_none_or(|h| h.release <= t) {
            let prev = back.map_or(self.last, |h| Some(h.owner));
            let hold = p.doorbell.lock_ns + bounce(prev, owner, p) + p.doorbell.handoff_ns * 0.0;
            let release = t + hold;
            self.holds.push(Hold {
                grant: t,
                release,
                owner,
            });
            return (release, 0.0);
        }
        let (i, grant, hold) = book(
            &self.holds[self.first..],
            self.last,
            self.users.len(),
            owner,
            t,
            p,
        );
        let release = grant + hold;
        self.holds.insert(
            self.first + i,
            Hold {
                grant,
                release,
                owner,
            },
        );
        (release, grant - t)
    }
}

/// The cache-line bounce `owner` pays for a lock last held by `prev`
/// (`None`: never held): none when it held the lock itself.
#[inline(always)]
fn bounce(prev: Option<Option<ThreadId>>, owner: Option<ThreadId>, p: &Profile) -> f64 {
    match prev {
        Some(o) if o != owner => p.doorbell.bounce_ns,
        _ => 0.0,
    }
}

/// Where `owner`, asking at `t`, is granted a lock whose booked holds are
/// `live` (sorted, disjoint; `last` held it before them, `users` threads
/// share it): the first hold still running at `t`, then the gaps between
/// the next ones. Returns (index of the new hold in `live`, grant, hold).
fn book(
    live: &[Hold],
    last: Option<Option<ThreadId>>,
    users: usize,
    owner: Option<ThreadId>,
    t: f64,
    p: &Profile,
) -> (usize, f64, f64) {
    let bound = users
        .saturating_sub(1)
        .min(p.doorbell.max_spinners as usize);
    let mut i = live.partition_point(|h| h.release <= t);
    let mut grant = t;
    let mut behind = 0usize;
    loop {
        let prev = match i {
            0 => last,
            _ => Some(live[i - 1].owner),
        };
        let hold = p.doorbell.lock_ns
            + bounce(prev, owner, p)
            + p.doorbell.handoff_ns * behind.min(bound) as f64;
        match live.get(i) {
            Some(h) if h.grant < grant + hold => {
                grant = fmax(grant, h.release);
                behind += 1;
                i += 1;
            }
            _ => return (i, grant, hold),
        }
    }
}

/// A link direction's busy periods booked ahead (sorted, disjoint, adjacent
/// ones merged), for [`crate::profile::LinkModel::response_gaps`]: a
/// transfer takes the first gap at or after it is ready.
#[derive(Debug, Default)]
pub(crate) struct Calendar {
    busy: Vec<(f64, f64)>,
    first: usize,
}

impl Calendar {
    /// Books `len` ns from `ready` on, or the first gap after it that
    /// fits; returns the start. No later booking is ready before `now`.
    fn book(&mut self, ready: f64, len: f64, now: f64) -> f64 {
        while self.busy.get(self.first).is_some_and(|b| b.1 <= now) {
            self.first += 1;
        }
        if self.first == self.busy.len() {
            self.busy.clear();
            self.first = 0;
        } else if self.first >= 64 && 2 * self.first >= self.busy.len() {
            self.busy.drain(..self.first);
            self.first = 0;
        }
        let live = &self.busy[self.first..];
        let mut i = live.partition_point(|b| b.1 <= ready);
        let mut start = ready;
        while let Some(&(s, e)) = live.get(i) {
            if s >= start + len {
                break;
            }
            start = fmax(start, e);
            i += 1;
        }
        let end = start + len;
        let at = self.first + i;
        // Merge with the period before (ends at `start`) and after (starts
        // at `end`).
        let before = at > self.first && self.busy[at - 1].1 >= start;
        let after = self.busy.get(at).is_some_and(|b| b.0 <= end);
        match (before, after) {
            (true, true) => {
                self.busy[at - 1].1 = self.busy[at].1;
                self.busy.remove(at);
            }
            (true, false) => self.busy[at - 1].1 = end,
            (false, true) => self.busy[at].0 = start,
            (false, false) => self.busy.insert(at, (start, end)),
        }
        start
    }
}

/// One machine: CPUs, one RNIC (requester and responder), one switch port.
pub(crate) struct Machine {
    /// Busy virtual threads (for the SMT slowdown).
    active: u32,
    cpu_factor: f64,
    /// Doorbells of the shared device context: low-latency, then medium,
    /// then one per thread that asked for its own (thread-aware allocation).
    dbs: Vec<SimLock>,
    /// Queue pairs created under the default doorbell mapping.
    default_qps: u32,
    /// Doorbell owned by each thread under thread-aware allocation.
    own_db: HashMap<Option<ThreadId>, usize>,
    /// Shared / multiplexed queue pairs: (node, group size) → (qp, users).
    groups: HashMap<(NodeId, usize), Vec<(usize, usize)>>,
    /// Queue pairs created on it (which processing unit the next one gets).
    qp_count: u32,
    /// The machine as a requester (its own posts).
    pub(crate) tx: Tx,
    /// The machine as a responder (requests it serves).
    pub(crate) rx: Rx,
}

/// A machine's requester side: send-queue units, outstanding requests, and
/// the port's links in the directions its own requests use. Kept apart
/// from [`Rx`] so a post borrows its machine's requester and its target's
/// responder at once, also when they are the same machine (loopback).
pub(crate) struct Tx {
    pub(crate) req_free: f64,
    /// When each processing unit is next free (`nic.processing_units`
    /// entries; empty under the NIC-wide booking).
    pu_free: Vec<f64>,
    /// Queue pairs with requests waiting for the send-queue units, and
    /// when each stops waiting (lazily expired; stale entries skipped).
    backlogged: u32,
    backlog_ends: BinaryHeap<Reverse<(Time, u32)>>,
    /// Work requests posted and not yet polled (WQE cache pressure).
    outstanding: u64,
    /// The port's links, each a FIFO server per kind of traffic: requests
    /// and responses are reserved at different instants (a response when
    /// its request executes, later than requests posted meanwhile), so one
    /// "free at" per direction would make an early request wait behind a
    /// response reserved for the future — head-of-line blocking that does
    /// not exist on a wire. It only arises where one machine both sends
    /// requests and serves them (colocated memory nodes, Sherman's setup).
    /// Here: requests out, responses in.
    ///
    /// Requests are ready in posting order, so their FIFO is the wire's
    /// order. Responses are not: one is ready when its request executes,
    /// microseconds after later-posted ones for an atomic waiting at a
    /// hot address. So with `link.response_gaps` (the built-in profiles) a
    /// response takes the first idle gap of each link once ready
    /// ([`Calendar`]; a queue pair's responses still in its order, as an RC
    /// responder sends them), and the FIFOs `down_resp_free` and
    /// `up_resp_free` book responses only with it off, where that atomic's
    /// response holds back every later-posted response at the node, of any
    /// queue pair, on any address (a READ 1 µs after 16 FAAs queued on
    /// another word: 9.6 µs instead of 2.4, tests/response_gaps.rs) — a
    /// wait neither a wire nor RC ordering imposes, and which SwordBox
    /// (NSDI'24) §3.2 reports only for accesses that depend on the
    /// atomic's address (`responder.atomic_stalls_access`).
    up_free: f64,
    pub(crate) down_resp_free: f64,
    /// `down_resp_free` as a calendar (`response_gaps`).
    down_resp: Calendar,
}

/// A machine's responder side: execution unit, atomic unit, translation
/// cache, and the links its served requests use (requests in, responses
/// out).
pub(crate) struct Rx {
    down_free: f64,
    pub(crate) resp_free: f64,
    atomic_free: f64,
    pub(crate) up_resp_free: f64,
    /// `up_resp_free` as a calendar (`response_gaps`).
    up_resp: Calendar,
    /// Direct-mapped translation cache: remote page + 1 per entry (0 = empty).
    mtt: Vec<u64>,
}

impl Machine {
    fn new(p: &Profile) -> Self {
        let n = (p.doorbell.low_latency + p.doorbell.medium_latency) as usize;
        Self {
            active: 0,
            cpu_factor: 1.0,
            dbs: (0..n).map(|_| SimLock::default()).collect(),
            default_qps: 0,
            own_db: HashMap::new(),
            groups: HashMap::new(),
            qp_count: 0,
            tx: Tx {
                req_free: 0.0,
                pu_free: vec![0.0; p.nic.processing_units as usize],
                backlogged: 0,
                backlog_ends: BinaryHeap::new(),
                outstanding: 0,
                up_free: 0.0,
                down_resp_free: 0.0,
                down_resp: Calendar::default(),
            },
            rx: Rx {
                down_free: 0.0,
                resp_free: 0.0,
                atomic_free: 0.0,
                up_resp_free: 0.0,
                up_resp: Calendar::default(),
                mtt: vec![0; p.responder.mtt_entries.max(1) as usize],
            },
        }
    }

    fn set_active(&mut self, active: u32, p: &Profile) {
        self.active = active;
        let cores = p.cpu.cores;
        self.cpu_factor = if p.cpu.smt > 1 && active > cores {
            let doubled = (2 * (active - cores)).min(active) as f64;
            1.0 + (p.cpu.smt_slowdown - 1.0) * doubled / active as f64
        } else {
            1.0
        };
    }
}

/// A queue pair: its doorbell, its lock when shared, its ordering state.
struct Qp {
    machine: usize,
    target: usize,
    db: usize,
    lock: Option<SimLock>,
    /// When the send-queue units may next serve this queue pair (round-robin
    /// arbitration: one turn per backlogged queue pair).
    nic_free: f64,
    in_backlog: bool,
    last_exec: f64,
    last_cq: f64,
    /// With `response_gaps`: when its last response left the responder's
    /// uplink and the requester's downlink. A response takes the first gap
    /// of a link at or after both, so its responses cross each link in the
    /// order its requests executed (an RC responder answers in PSN order),
    /// also when a later, shorter one would fit a gap the earlier did not.
    resp_up: f64,
    resp_down: f64,
    next_batch: u64,
    /// Batch whose earlier request failed (the rest is flushed).
    failed_batch: u64,
    /// Instant the connection was lost.
    lost_at: Option<Time>,
    /// Which of its ends cross the inter-socket link (`crate::numa`; 0
    /// without a NUMA layout).
    cross: u8,
    /// Its processing unit at the requester NIC (`nic.processing_units`
    /// ≥ 1; `u32::MAX` until assigned).
    pu: u32,
    /// With processing units: when its last request left the NIC, its
    /// unit's time included (requests of a queue pair leave in order).
    sent: f64,
    /// With processing units: `sent` without payload fetches
    /// (`nic.payload_fetch_ns`): the unit takes the next request once the
    /// last has left it, while that one's payload may still be in flight
    /// (the DMA reads of a queue pair's payloads overlap). Equal to `sent`
    /// when no request fetches a payload.
    unit_sent: f64,
    /// With processing units: when its last request would execute with
    /// its unit's delay (`last_exec` is without it; see [`send_queue`]).
    phys_exec: f64,
}

impl Qp {
    /// A fresh queue pair of `machine` to memory machine `target`, on
    /// doorbell `db`, with nothing sent yet.
    fn new(machine: usize, target: usize, db: usize, lock: Option<SimLock>) -> Self {
        Qp {
            machine,
            target,
            db,
            lock,
            nic_free: 0.0,
            in_backlog: false,
            last_exec: 0.0,
            last_cq: 0.0,
            resp_up: 0.0,
            resp_down: 0.0,
            next_batch: 1,
            failed_batch: 0,
            lost_at: None,
            cross: 0,
            pu: u32::MAX,
            sent: 0.0,
            unit_sent: 0.0,
            phys_exec: 0.0,
        }
    }
}

/// A request whose execution instant is not known when it is posted: an
/// atomic under an arbitrated [`AtomicOrder`], or a request its queue pair
/// posted behind one (a queue pair executes in order). Its timing up to
/// the responder was computed at the post; the rest is computed when it
/// executes ([`Core::resolve`]).
#[derive(Debug, Clone, Copy)]
struct Pending {
    h: u32,
    /// Its entry's index on handle `h` (counted from the handle's first).
    idx: u64,
    /// An atomic: when it reaches its address (once it heads its queue
    /// pair: also after the queue pair's previous execution). Otherwise:
    /// its execution instant before queue-pair order.
    ready: f64,
    /// An atomic's address and how long it holds it.
    atomic: Option<(u64, f64)>,
    /// The atomic waits at its address (registered in `Core::waits`).
    waiting: bool,
    /// Torn pieces land over this long (0 if not torn).
    spread: f64,
    /// Serialisation of its response on a link.
    rser: f64,
    /// Its processing unit's delay, added to its completion (see
    /// [`send_queue`]).
    lag: f64,
}

/// One address's atomics under an arbitrated [`AtomicOrder`].
#[derive(Debug, Default)]
struct AddrWait {
    /// The address is busy until then.
    free: f64,
    /// Queue pairs whose first unexecuted request is an atomic waiting here.
    qps: Vec<u32>,
    /// The instant of its live arbitration event (stale events differ).
    event: Option<Time>,
    /// The queue pair served last (round robin).
    last: u32,
}

/// `Entry::at` and `Entry::cq_at` of a request whose execution waits for
/// an arbitration (see [`Pending`]).
const UNRESOLVED: Time = Time::MAX;

/// One request in flight on a handle.
#[repr(align(64))]
struct Entry {
    wr: WorkRequest,
    batch: u64,
    index: u32,
    cq_at: Time,
    /// When its (first) piece takes effect, and that piece's sequence
    /// number (piece `i`'s is `seq + i`; torn pieces' instants are in `cut`).
    at: Time,
    seq: u64,
    /// Torn requests: how they are cut (boxed: rare).
    cut: Option<Box<Cut>>,
    /// Pieces applied so far (all pieces applied = executed).
    applied: u8,
    /// The result word of a success (old value, or bytes moved).
    value: u64,
    /// The failure, if any (boxed: rare, and the entry stays two lines).
    error: Option<Box<VerbError>>,
}

// An entry is two cache lines, aligned (a post writes it, an effect and
// a poll read it: with hundreds of threads each is a miss per line).
const _: () = assert!(std::mem::size_of::<Entry>() == 128);

impl Entry {
    fn pieces(&self) -> u8 {
        self.cut.as_ref().map_or(1, |c| c.n as u8)
    }

    /// Its next piece to land, as the effect of handle `h`.
    fn next_effect(&self, h: u32) -> Effect {
        piece_effect(
            self.at,
            self.cut.as_deref(),
            self.seq,
            self.applied as usize,
            h,
        )
    }

    /// Whether its owner sees a completion for it (signaled, or failed).
    fn delivers(&self) -> bool {
        self.wr.signaled || self.error.is_some()
    }
}

/// Piece `piece` of a request of handle `h` that takes effect at `at`
/// (torn: at its cut's instants) with sequence numbers from `seq`.
#[inline(always)]
fn piece_effect(at: Time, cut: Option<&Cut>, seq: u64, piece: usize, h: u32) -> Effect {
    let at = match cut {
        Some(c) => c.at[piece],
        None => at,
    };
    Effect::new(at, seq + piece as u64, h)
}

/// One thread's handle on a queue pair (its own completion queue: a shared
/// queue pair routes each completion to its poster, as `SharedQp` does).
pub(crate) struct Handle {
    qp: usize,
    thread: Option<ThreadId>,
    node: NodeId,
    /// The node's translation page shift (MTT cache key).
    shift: u32,
    exec: Executor,
    entries: VecDeque<Entry>,
    head: u64,
    /// Completions that will be delivered (signaled, or failed).
    deliverable: usize,
    /// Scatter/gather entries of posted vector requests, by batch.
    sges: HashMap<u64, Vec<LocalRef>>,
    /// Index (from `head`) of the next entry to take effect.
    next_apply: u64,
    stats: dmkit_fabric::QpStats,
    /// The queue pair was dropped: in-flight requests still take effect,
    /// their entries are discarded as they do.
    dropped: bool,
}

/// A memory effect due at `at`, packed for the heap: `at:64 | seq:40 |
/// handle:24`. A handle's effects land in posting order (one queue pair's
/// requests execute in order, a torn request's pieces before the next
/// request), so the entry is the handle's next one to apply and the piece
/// its next piece: neither needs storing. For the same reason the heap
/// holds only each handle's *next* effect (the handle's effects are
/// sorted by `(at, seq)`, so the least of the heads is the least of all):
/// a quarter of the entries with 8 tasks per thread on two memory nodes,
/// and one sift per effect (the top is replaced in place).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
struct Effect(u128);

const HANDLE_BITS: u32 = 24;

impl Effect {
    fn new(at: Time, seq: u64, handle: u32) -> Self {
        debug_assert!(handle < 1 << HANDLE_BITS && seq < 1 << 40);
        Effect(((at as u128) << 64) | ((seq as u128) << HANDLE_BITS) | handle as u128)
    }

    fn at(self) -> Time {
        (self.0 >> 64) as Time
    }

    fn handle(self) -> u32 {
        (self.0 & ((1 << HANDLE_BITS) - 1)) as u32
    }
}

/// How a torn request is cut: piece `i` covers bytes `[cuts[i], cuts[i+1])`
/// of the request; the `s`-th effect to land applies piece `order[s]`.
#[derive(Debug, Clone, Copy)]
struct Cut {
    cuts: [usize; 5],
    order: [u8; 4],
    n: usize,
    /// When the `s`-th piece lands.
    at: [Time; 4],
}

impl Cut {
    /// Spreads its pieces' instants evenly over `[exec, exec + spread]`.
    #[inline(always)]
    fn land(&mut self, exec: f64, spread: f64) {
        let n = self.n;
        for slot in 0..n {
            self.at[slot] = to_time(exec + spread * slot as f64 / (n - 1) as f64);
        }
    }
}

/// The response of a request of queue pair `q` that executes at `exec`
/// (its pieces landing over `spread`): the uplink of the target (`tm`),
/// the downlink of the requester (`m`), then data and CQE written into
/// host memory, delivered in the queue pair's order. Returns when its
/// completion is delivered.
#[allow(clippy::too_many_arguments)]
#[inline(always)]
fn respond(
    p: &Profile,
    q: &mut Qp,
    m: &mut Tx,
    tm: &mut Rx,
    exec: f64,
    spread: f64,
    rser: f64,
    half_wire: f64,
    extra: f64,
    now: f64,
) -> f64 {
    q.last_exec = exec + spread;
    let d2 = if p.link.response_gaps {
        let u2 = tm.up_resp.book(fmax(exec + spread, q.resp_up), rser, now);
        q.resp_up = u2 + rser;
        let d2 = m
            .down_resp
            .book(fmax(u2 + rser + half_wire, q.resp_down), rser, now);
        q.resp_down = d2 + rser;
        d2
    } else {
        let u2 = fmax(exec + spread, tm.up_resp_free);
        tm.up_resp_free = u2 + rser;
        let d2 = fmax(u2 + rser + half_wire, m.down_resp_free);
        m.down_resp_free = d2 + rser;
        d2
    };
    // (`extra`: the completion's DMA crossing sockets, `crate::numa`; 0
    // otherwise, which adds exactly nothing.)
    let cq = fmax(d2 + rser + half_wire + p.nic.deliver_ns + extra, q.last_cq);
    q.last_cq = cq;
    cq
}

/// Per-request service times of the profile's rate limits (ns), divided
/// once (the same quotients the per-request code computed each time).
struct Slots {
    nic: f64,
    responder: f64,
    atomic: f64,
}

impl Slots {
    fn of(p: &Profile) -> Self {
        Self {
            nic: 1e3 / p.nic.iops,
            responder: 1e3 / p.responder.iops,
            atomic: 1e3 / p.responder.atomic_mops,
        }
    }
}

/// The whole simulation state.
pub(crate) struct Core {
    /// The device model; never changed after construction (`slots`
    /// caches quotients of it).
    pub p: Profile,
    slots: Slots,
    pub faults: Faults,
    pub in_order_write: bool,
    pub(crate) machines: Vec<Machine>,
    /// Memory node id → machine.
    node_machine: HashMap<NodeId, usize>,
    /// Memory node id → translation page shift.
    page_shift: HashMap<NodeId, u32>,
    qps: Vec<Qp>,
    pub handles: Vec<Handle>,
    effects: BinaryHeap<Reverse<Effect>>,
    /// The last request shape seen per kind (`VerbKind as usize`).
    shapes: [Shape; 5],
    seq: u64,
    /// Same-address atomic serialisation: address → free instant.
    /// (Looked up per simulated atomic: an integer hasher; never iterated,
    /// so the hasher cannot change a result.)
    addr_free: IntMap<u64, f64>,
    /// With `responder.atomic_stalls_access`: 64-byte line → the latest
    /// completion of an atomic booked on a word in it (a READ or WRITE
    /// checks the words of the lines it touches only when its line is
    /// busy).
    line_free: IntMap<u64, f64>,
    /// Device-memory range per node (atomics there are faster).
    device_mem: IntMap<NodeId, (u64, u64)>,
    /// Arbitrated atomic order (`p.responder.atomic_order` is not `post`).
    arbitrated: bool,
    /// Under an arbitrated order, by queue pair: the requests whose
    /// execution waits for an atomic of the queue pair (the atomic first),
    /// in posting order. (Kept out of [`Qp`], which the default order
    /// reads on every post.)
    pending: Vec<VecDeque<Pending>>,
    /// Addresses with atomics waiting, and when each next picks one.
    waits: IntMap<u64, AddrWait>,
    arbitrations: BinaryHeap<Reverse<(Time, u64)>>,
    /// Threads to wake: a request of theirs executed at an arbitration
    /// and completes at the instant given (drained by the driver).
    pub woken: Vec<(Time, ThreadId)>,
    /// Threads: machine of each.
    pub threads: Vec<usize>,
    /// Handles of each thread.
    thread_handles: Vec<Vec<u32>>,
    /// The thread being stepped ([`Core::set_current`]), and its CPU time
    /// position.
    pub(crate) current: Option<ThreadId>,
    /// The CPU cost multiplier of `current` (1 for the external caller),
    /// kept with it: looking it up through the thread's machine on every
    /// charge and post cost two dependent loads each time.
    factor: f64,
    pub cursor: Time,
    /// The latest instant the engine has reached.
    pub now: Time,
    pub clock: Arc<AtomicU64>,
    pub rng: SimRng,
    pub stats: SimStats,
    /// The RPC path ([`crate::rpc`]), made with the first channel (so runs
    /// without one take none of its branches).
    pub(crate) rpc: Option<Box<crate::rpc::RpcSim>>,
    /// Worker cores per memory node, and the channels' limits.
    pub(crate) rpc_cores: usize,
    pub(crate) rpc_max_message: usize,
    pub(crate) rpc_capacity: usize,
    /// Sockets (`crate::numa`), if modelled, and each thread's socket.
    numa: Option<NumaLayout>,
    thread_socket: Vec<u32>,
    /// The switch position (SwordBox), if the simulation has one
    /// ([`crate::switch`]); `None` takes none of its paths.
    pub(crate) switch: Option<Box<SwitchStage>>,
}

/// Forgets the queue pairs of requester `m` that stopped waiting for its
/// send-queue units by `until` (their backlog entries are due; an entry
/// whose queue pair was served again since is stale and skipped).
#[inline]
fn expire_backlog(m: &mut Tx, qps: &mut [Qp], until: f64) {
    while let Some(&Reverse((end, other))) = m.backlog_ends.peek() {
        if from_time(end) > until {
            break;
        }
        m.backlog_ends.pop();
        let o = &mut qps[other as usize];
        if o.in_backlog && o.nic_free <= from_time(end) + 1.0 {
            o.in_backlog = false;
            m.backlogged -= 1;
        }
    }
}

/// How a request is torn, or `None` if it is not (its pieces' instants
/// are filled in by the caller).
fn tear(faults: &Faults, rng: &mut SimRng, in_order_write: bool, wr: &WorkRequest) -> Option<Cut> {
    let len = wr.len();
    if !matches!(wr.op, Op::Read { .. } | Op::Write { .. })
        || faults.torn <= 0.0
        || len <= 8
        || !rng.chance(faults.torn)
    {
        return None;
    }
    // Cut at 8-byte boundaries of the remote address.
    let off = wr.remote.offset();
    let first = (off.next_multiple_of(8) - off) as usize;
    let mut bounds: Vec<usize> = (0..)
        .map(|i| first + 8 * i)
        .take_while(|&b| b < len)
        .filter(|&b| b > 0)
        .collect();
    if bounds.is_empty() {
        return None;
    }
    let pieces = 2 + rng.below(3) as usize; // 2..=4
    let mut chosen = Vec::with_capacity(pieces - 1);
    while chosen.len() < pieces - 1 && !bounds.is_empty() {
        let i = rng.below(bounds.len() as u64) as usize;
        chosen.push(bounds.swap_remove(i));
    }
    chosen.sort_unstable();
    let n = chosen.len() + 1;
    let mut cut = Cut {
        cuts: [0; 5],
        order: [0, 1, 2, 3],
        n,
        at: [0; 4],
    };
    cut.cuts[1..n].copy_from_slice(&chosen);
    cut.cuts[n] = len;
    // Landing order of the pieces: ascending with in-order placement,
    // shuffled without.
    if !in_order_write {
        for i in (1..n).rev() {
            let j = rng.below(i as u64 + 1) as usize;
            cut.order.swap(i, j);
        }
    }
    Some(cut)
}

fn kind_bytes(kind: VerbKind, len: usize) -> (f64, f64, f64) {
    // (request payload on the wire, response payload, PCIe payload at requester)
    let len = len as f64;
    match kind {
        VerbKind::Read => (0.0, len, len),
        VerbKind::Write => (len, 0.0, len),
        _ => (16.0, 8.0, 8.0),
    }
}

/// The terms of a request's timing that depend only on its kind and
/// length (and the fixed profile): computed by the same expressions as
/// before, once per kind and length instead of once per request (four
/// divisions each).
#[derive(Debug, Clone, Copy, Default)]
struct Shape {
    /// Length + 1 these terms are for (0: none yet).
    key: u64,
    /// WQE bytes + payload over PCIe at the requester (before misses).
    pcie_base: f64,
    /// Serialisation of the request and of the response on a link (ns).
    ser: f64,
    rser: f64,
    /// The responder's service time.
    rsvc: f64,
    /// Bytes on the wire, both directions.
    wire: u64,
}

impl Shape {
    fn of(p: &Profile, slots: &Slots, kind: VerbKind, len: usize) -> Self {
        let link_bpns = p.link.gbps / 8.0;
        let (req_payload, resp_payload, pcie_payload) = kind_bytes(kind, len);
        let pkts = packets(req_payload, p.link.mtu);
        let req_bytes = pkts * p.link.header_bytes + req_payload;
        let rpk = packets(resp_payload, p.link.mtu);
        let resp_bytes = rpk * p.link.header_bytes + resp_payload;
        Shape {
            key: len as u64 + 1,
            pcie_base: p.nic.wr_bytes + pcie_payload,
            ser: req_bytes / link_bpns,
            rser: resp_bytes / link_bpns,
            // The responder's DMA moves the payload once (host memory to
            // NIC for a READ or atomic, NIC to host memory for a WRITE).
            rsvc: fmax(slots.responder, pcie_payload / p.responder.pcie_gbs),
            wire: (req_bytes + resp_bytes) as u64,
        }
    }
}

/// A request [`defer`] queues: the post's results for it.
struct Deferred<'a> {
    h: u32,
    wr: &'a WorkRequest,
    batch: u64,
    index: u32,
    ready: f64,
    atomic: Option<(u64, f64)>,
    cut: Option<Cut>,
    spread: f64,
    shape: &'a Shape,
    /// Its processing unit's delay, added to its completion.
    lag: f64,
}

/// `from`, or when the atomics booked so far on the 8-byte words of
/// `[raw, raw + len)` have completed if that is later: a READ or WRITE
/// with a data dependency on an atomic's address stalls until the atomic
/// completes (SwordBox §3.2). `line_free` screens 64-byte lines so that
/// only the words of a line still busy after `from` are looked up. (Out
/// of line: the READ path that never meets an atomic stays small.)
#[inline(never)]
fn atomic_fence(
    addr_free: &IntMap<u64, f64>,
    line_free: &IntMap<u64, f64>,
    raw: u64,
    len: usize,
    from: f64,
) -> f64 {
    let end = raw + len as u64;
    let mut fence = from;
    for line in (raw >> 6)..=((end - 1) >> 6) {
        let Some(&busy) = line_free.get(&line) else {
            continue;
        };
        if busy <= fence {
            continue;
        }
        // Words of this line that the access overlaps (atomics are
        // 8-byte aligned).
        let lo = (line << 6).max(raw & !7);
        let hi = ((line + 1) << 6).min(end);
        let mut w = lo;
        while w < hi {
            if let Some(&t) = addr_free.get(&w) {
                fence = fmax(fence, t);
            }
            w += 8;
        }
    }
    fence
}

/// When the first of queue pairs `qps`' waiting atomics reaches its
/// address (`None` if none waits).
fn earliest(pending: &[VecDeque<Pending>], qps: &[u32]) -> Option<f64> {
    qps.iter()
        .map(|&q| pending[q as usize][0].ready)
        .reduce(fmin)
}

/// Queues request `d` of queue pair `q` (handle `hd`) to execute once
/// the atomic at the head of the queue pair has: its entry waits
/// unresolved, [`Core::resolve`] computes the rest. Kept out of the post
/// loop, which the default order never takes here.
#[cold]
#[inline(never)]
fn defer(
    stats: &mut SimStats,
    next_seq: &mut u64,
    pending: &mut VecDeque<Pending>,
    hd: &mut Handle,
    d: Deferred<'_>,
) {
    stats.wire_bytes += d.shape.wire;
    stats.posted += 1;
    let n = d.cut.as_ref().map_or(1, |c| c.n);
    if d.cut.is_some() {
        stats.torn += 1;
    }
    let seq = *next_seq + 1;
    *next_seq += n as u64;
    pending.push_back(Pending {
        h: d.h,
        idx: hd.head + hd.entries.len() as u64,
        ready: d.ready,
        atomic: d.atomic,
        waiting: false,
        spread: d.spread,
        rser: d.shape.rser,
        lag: d.lag,
    });
    hd.entries.push_back(Entry {
        wr: *d.wr,
        batch: d.batch,
        index: d.index,
        cq_at: UNRESOLVED,
        at: UNRESOLVED,
        seq,
        cut: d.cut.map(Box::new),
        applied: 0,
        value: 0,
        error: None,
    });
    if d.wr.signaled {
        hd.deliverable += 1;
    }
}

// The stages of a post, in the order a request meets them (the crate
// docs' numbering). Each is a function of the state it touches, inlined
// into [`Core::post`]: the arithmetic is the one the post always did,
// operation for operation, so results are the same to the bit.

/// Stages 1–2: the posting thread's CPU builds the post's `wrs` work
/// requests (from `caller`, its CPU time, × `cpu_factor`, its SMT
/// slowdown), then holds the queue pair's lock (a shared queue pair) and
/// the doorbell register's spinlock to ring it, spinning while another
/// thread holds either. Returns (when the doorbell has rung and the locks
/// are released, the time spent spinning). (The doorbell is looked up in
/// `machines` after the queue pair's lock, not passed in: a slice borrowed
/// before the lock's call stays live across it, which cost the post five
/// instructions, callgrind.)
#[allow(clippy::too_many_arguments)]
#[inline(always)]
fn ring_doorbell(
    p: &Profile,
    machines: &mut [Machine],
    machine: usize,
    qp: &mut Qp,
    thread: Option<ThreadId>,
    caller: f64,
    cpu_factor: f64,
    wrs: usize,
    now: f64,
) -> (f64, f64) {
    let mut at = caller + cpu_factor * (p.cpu.post_ns + wrs as f64 * p.cpu.post_wr_ns);
    let mut spin = 0.0;
    if let Some(lock) = qp.lock.as_mut() {
        let (release, waited) = lock.acquire(thread, at, now, p);
        at = release;
        spin += waited;
    }
    let (release, waited) = machines[machine].dbs[qp.db].acquire(thread, at, now, p);
    spin += waited;
    (release, spin)
}

/// The timing terms of a request of `kind` and `len` bytes, from the
/// per-kind cache `shapes` (recomputed when the length changes).
#[inline(always)]
fn shape_of(
    shapes: &mut [Shape; 5],
    p: &Profile,
    slots: &Slots,
    kind: VerbKind,
    len: usize,
) -> Shape {
    let cached = &mut shapes[kind as usize];
    if cached.key != len as u64 + 1 {
        *cached = Shape::of(p, slots, kind, len);
    }
    *cached
}

/// Stage 3, the requester NIC: the request's WQE, fetched by `fetched`,
/// waits for its queue pair's turn (round-robin arbitration between send
/// queues: while `n` queue pairs are backlogged, each is served at most
/// every `n` slots, so a deeper queue pair gets no larger share of a
/// saturated NIC), then for the send-queue units, which serve it at the
/// message rate or its PCIe bytes (WQE, CQE, data, and — beyond
/// `wqe_cache` outstanding requests — expected WQE-cache misses),
/// whichever is slower. The queue pair's processing unit also handles the
/// request for `unit` ns (`nic.wr_ns` plus `nic.sge_ns` per gathered piece
/// beyond the first, [`qp_unit_ns`]), one request of the queue pair at a
/// time. Returns (when it leaves the NIC as far as the shared stages after
/// it are concerned, the processing unit's further delay of its
/// completion, its queue pair).
///
/// Where the unit's time goes is `nic.processing_units`:
///
/// - `0`, the NIC-wide booking (the engine's model before the switch): the
///   unit's time is added before the send-queue units, and since a post's
///   requests are booked in one go and the units are a FIFO "free at"
///   server, the units stay booked up to the post's last request, so other
///   queue pairs' requests wait behind one queue pair's whole unit time:
///   together, the NIC passes at most 1 / `wr_ns` charged requests per
///   second (1.5 M/s on the ConnectX-3 profile), however many queue pairs
///   post.
/// - `N ≥ 1`: `N` processing units work in parallel, each a FIFO over the
///   requests of its queue pairs (the `i`-th queue pair of a machine is on
///   unit `i mod N`). The send-queue units, the links and the responder are
///   booked when the post is fetched, as without a unit cost, and the
///   request's departure is delayed by its unit: it leaves when both its
///   unit is done and the shared units have served it. The shared stages
///   after the NIC are FIFO servers booked in posting order too, so the
///   delay cannot be carried through them without the same NIC-wide hold
///   (a queue pair's late request would hold the uplink for every later
///   post); it is added to the completion instead (`lag`). Approximation:
///   the shared stages see the post's requests up to one post's unit time
///   early (their rates and totals are kept), and a request takes effect
///   at the responder that much early too (never after its completion, so
///   what a thread observes stays consistent). A queue pair alone on its
///   unit gets the same departures as under the NIC-wide booking.
#[allow(clippy::too_many_arguments)]
#[inline(always)]
fn send_queue<'q>(
    p: &Profile,
    slots: &Slots,
    tx: &mut Tx,
    qps: &'q mut [Qp],
    qi: usize,
    stats: &mut SimStats,
    shape: &Shape,
    fetched: f64,
    unit: f64,
    payload: f64,
) -> (f64, f64, &'q mut Qp) {
    tx.outstanding += 1;
    let outstanding = tx.outstanding as i64 as f64;
    let miss = if outstanding > p.nic.wqe_cache {
        (1.0 - p.nic.wqe_cache / outstanding).min(p.nic.max_miss)
    } else {
        0.0
    };
    let pcie = shape.pcie_base + miss * p.nic.miss_bytes;
    let service = fmax(slots.nic, pcie / p.nic.pcie_gbs);
    stats.pcie_bytes += pcie;
    stats.wqe_misses += miss;
    // Under the NIC-wide booking the unit's time comes before the shared
    // send-queue units. (`unit` is 0 on profiles without a per-queue-pair
    // cost: adding it changes no result.)
    let nic_wide = tx.pu_free.is_empty();
    let turn = fmax(fetched, qps[qi].nic_free) + if nic_wide { unit } else { 0.0 };
    expire_backlog(tx, qps, turn);
    let qp = &mut qps[qi];
    let turns = tx.backlogged + u32::from(!qp.in_backlog);
    let start = fmax(turn, tx.req_free);
    tx.req_free = start + service;
    let depart = start + service;
    qp.nic_free = fmax(turn + service * turns as f64, depart);
    if !qp.in_backlog {
        qp.in_backlog = true;
        tx.backlogged += 1;
    }
    if nic_wide {
        return (depart, 0.0, qp);
    }
    // The processing unit: after the queue pair's previous request has
    // left, and after the unit's earlier work (its FIFO).
    // A payload fetch (`payload`, 0 for inline payloads) follows the
    // unit's work and holds only this request and, as requests leave in
    // order, those behind it; the unit goes on with the next request
    // meanwhile (`unit_sent`). Without payloads `unit_sent` is `sent` and
    // this is the booking the engine had before the fetch.
    // (`fetch_from`: when the unit is done with it and its payload's read
    // may start.)
    let (unit_sent, fetch_from) = if unit > 0.0 {
        let pu = &mut tx.pu_free[qp.pu as usize];
        let done = fmax(fmax(fetched, qp.unit_sent), *pu) + unit;
        *pu = done;
        (fmax(done + service, depart), done)
    } else {
        (
            fmax(depart, qp.unit_sent + service),
            fmax(fetched, qp.unit_sent),
        )
    };
    let sent = if payload > 0.0 {
        fmax(
            fmax(unit_sent, fetch_from + payload + service),
            qp.sent + service,
        )
    } else {
        fmax(unit_sent, qp.sent + service)
    };
    debug_assert!(sent >= unit_sent);
    qp.unit_sent = unit_sent;
    qp.sent = sent;
    (depart, sent - depart, qp)
}

/// The time request `wr`, the `index`-th of its post, holds its queue
/// pair's processing unit at the requester NIC: `nic.wr_ns` unless it is
/// the post's first (whose WQE came with the doorbell's MMIO write, the
/// driver's BlueFlame path; the others are fetched by DMA one by one),
/// plus `nic.sge_ns` for each scatter/gather piece beyond the first (each
/// is one more DMA of the host's memory). Requests of one queue pair pass
/// the unit one at a time, so this cost does not shrink with doorbell
/// batching (Thinking More about RDMA Memory Semantics, CLUSTER'21,
/// §III-A, Fig. 4: a doorbell batch of 32 WRITEs is only 1.53× as fast as
/// single ones).
/// The DMA read of request `wr`'s payload before it can leave the
/// requester NIC (ns): `nic.payload_fetch_ns` for a WRITE, plain or
/// scatter/gather, of more than `limits.max_inline` bytes (a smaller one
/// travels in its WQE), 0 otherwise (Thinking More about RDMA Memory
/// Semantics, CLUSTER'21, §II-B1, Fig. 1: a WRITE's latency rises from
/// 1.16 µs to 1.79 µs at 256 B while its throughput stays put).
#[inline(always)]
fn payload_fetch_ns(p: &Profile, wr: &WorkRequest) -> f64 {
    match wr.op {
        Op::Write { .. } | Op::WriteV { .. } if wr.len() > p.limits.max_inline => {
            p.nic.payload_fetch_ns
        }
        _ => 0.0,
    }
}

#[inline(always)]
fn qp_unit_ns(p: &Profile, wr: &WorkRequest, index: usize) -> f64 {
    let extra = match wr.op {
        Op::ReadV { sgl } | Op::WriteV { sgl } => sgl.count.saturating_sub(1),
        _ => 0,
    };
    let fetch = if index == 0 { 0.0 } else { p.nic.wr_ns };
    fetch + extra as f64 * p.nic.sge_ns
}

/// Stage 4, the request's packets: the requester's uplink, the switch,
/// the target's downlink (`serialise` ns on each link, `half_wire` ns of
/// propagation on each side of the switch). Returns when the request has
/// arrived at the target's NIC.
#[inline(always)]
pub(crate) fn request_link(
    tx: &mut Tx,
    rx: &mut Rx,
    depart: f64,
    serialise: f64,
    half_wire: f64,
) -> f64 {
    let uplink = fmax(depart, tx.up_free);
    tx.up_free = uplink + serialise;
    let downlink = fmax(uplink + serialise + half_wire, rx.down_free);
    rx.down_free = downlink + serialise;
    downlink + serialise + half_wire
}

/// Stage 4 up to the switch: the requester's uplink, then half the wire.
/// Returns when the request reaches the switch (the switch position,
/// [`crate::switch`]).
#[inline(always)]
fn uplink(tx: &mut Tx, depart: f64, serialise: f64, half_wire: f64) -> f64 {
    let uplink = fmax(depart, tx.up_free);
    tx.up_free = uplink + serialise;
    uplink + serialise + half_wire
}

/// Stage 4 from the switch (left at `at`): the target's downlink, then
/// half the wire. Returns when the request has arrived at the target's NIC.
#[inline(always)]
fn downlink(rx: &mut Rx, at: f64, serialise: f64, half_wire: f64) -> f64 {
    let downlink = fmax(at, rx.down_free);
    rx.down_free = downlink + serialise;
    downlink + serialise + half_wire
}

/// Stage 5a, the responder's execution unit (its service time `service`)
/// and translation cache (the entry of `wr`'s remote page, pages of
/// `2^page_shift` bytes; a miss costs `mtt_miss_ns`). Returns when the
/// request, having arrived at `arrive`, may access memory.
#[inline(always)]
fn responder_admit(
    p: &Profile,
    rx: &mut Rx,
    stats: &mut SimStats,
    arrive: f64,
    service: f64,
    wr: &WorkRequest,
    page_shift: u32,
) -> f64 {
    let start = fmax(arrive, rx.resp_free);
    rx.resp_free = start + service;
    let page = wr.remote.offset() >> page_shift;
    // (A mask for the profiles' power-of-two caches: a division here sat
    // in every request's critical path.)
    let entries = rx.mtt.len();
    let slot = if entries.is_power_of_two() {
        (page as usize) & (entries - 1)
    } else {
        (page as usize) % entries
    };
    let mtt_miss = if rx.mtt[slot] != page + 1 {
        rx.mtt[slot] = page + 1;
        stats.mtt_misses += 1;
        p.responder.mtt_miss_ns
    } else {
        0.0
    };
    start + mtt_miss
}

/// Stage 5b for a READ or WRITE admitted at `admitted`: the DMA to host
/// memory, after the atomics booked on its words when accesses stall
/// behind them (`atomic_stalls_access`). Returns its execution instant.
#[inline(always)]
fn access_instant(
    p: &Profile,
    addr_free: &IntMap<u64, f64>,
    line_free: &IntMap<u64, f64>,
    kind: VerbKind,
    wr: &WorkRequest,
    len: usize,
    admitted: f64,
) -> f64 {
    let dma = if kind == VerbKind::Read {
        p.responder.dma_read_ns
    } else {
        p.responder.dma_write_ns
    };
    let mut at = admitted;
    if p.responder.atomic_stalls_access && len > 0 && !line_free.is_empty() {
        at = atomic_fence(addr_free, line_free, wr.remote.raw(), len, at);
    }
    at + dma
}

/// Stage 5b for an atomic admitted at `admitted`: it reads its word (a
/// DMA), then takes a slot of the atomic unit (its aggregate rate) and its
/// turn at its address (`atomic_ns`, or `atomic_nic_ns` in device memory
/// `on_nic`). Under the `post` order both are booked now and the result is
/// (its execution instant, `None`); under an arbitrated order only the
/// unit's slot is, and the result is (when it reaches its address,
/// `Some((address, hold))`) for [`Core::arbitrate`] to settle.
#[allow(clippy::too_many_arguments)]
#[inline(always)]
fn atomic_instant(
    p: &Profile,
    slots: &Slots,
    rx: &mut Rx,
    addr_free: &mut IntMap<u64, f64>,
    line_free: &mut IntMap<u64, f64>,
    arbitrated: bool,
    on_nic: Option<(u64, u64)>,
    wr: &WorkRequest,
    admitted: f64,
) -> (f64, Option<(u64, f64)>) {
    let ready = admitted + p.responder.dma_read_ns;
    let addr = wr.remote.raw();
    let in_device_memory = on_nic.is_some_and(|(a, b)| (a..b).contains(&wr.remote.offset()));
    let hold = if in_device_memory {
        p.responder.atomic_nic_ns
    } else {
        p.responder.atomic_ns
    };
    if arbitrated {
        // Which waiting atomic goes next is decided when the address
        // frees (`Core::arbitrate`); the unit's aggregate rate still
        // paces arrivals.
        let slot = ready.max(rx.atomic_free);
        rx.atomic_free = slot + slots.atomic;
        return (slot, Some((addr, hold)));
    }
    let start = ready
        .max(rx.atomic_free)
        .max(addr_free.get(&addr).copied().unwrap_or(0.0));
    // The unit's next slot: after this atomic's execution (one FIFO unit)
    // or after its arrival (only its address waits).
    let slot = if p.responder.atomic_head_of_line {
        start
    } else {
        ready.max(rx.atomic_free)
    };
    rx.atomic_free = slot + slots.atomic;
    addr_free.insert(addr, start + hold);
    if p.responder.atomic_stalls_access {
        let line = line_free.entry(addr >> 6).or_insert(0.0);
        *line = fmax(*line, start + hold);
    }
    (start + hold, None)
}

/// The faults that move a request's execution instant `exec`: the
/// cross-queue-pair reordering shift and a random delay.
#[inline(always)]
fn fault_shift(faults: &Faults, rng: &mut SimRng, stats: &mut SimStats, exec: f64) -> f64 {
    let mut exec = exec;
    if faults.reorder_ns > 0 {
        exec += rng.below(faults.reorder_ns + 1) as f64;
    }
    if faults.delay > 0.0 && rng.chance(faults.delay) {
        exec += rng.below(faults.delay_ns + 1) as f64;
        stats.delayed += 1;
    }
    exec
}

/// A request whose post settled its execution and completion: what
/// [`enqueue`] records of it.
struct Settled<'a> {
    h: u32,
    wr: &'a WorkRequest,
    batch: u64,
    index: u32,
    exec: f64,
    cq: f64,
    cut: Option<Cut>,
    spread: f64,
    wire: u64,
}

/// The end of a post for request `s` of handle `handle` (stage 6's
/// instants already computed): its pieces' instants and sequence numbers,
/// its memory effect queued (on the heap when nothing of the handle waits
/// to land before it), and its entry with its completion instant.
#[inline(always)]
fn enqueue(
    stats: &mut SimStats,
    next_seq: &mut u64,
    effects: &mut BinaryHeap<Reverse<Effect>>,
    handle: &mut Handle,
    s: Settled<'_>,
) {
    stats.wire_bytes += s.wire;
    stats.posted += 1;
    let mut cut = s.cut;
    let pieces = cut.as_ref().map_or(1, |c| c.n);
    if let Some(c) = &mut cut {
        stats.torn += 1;
        c.land(s.exec, s.spread);
    }
    let seq = *next_seq + 1;
    *next_seq += pieces as u64;
    let at = to_time(s.exec);
    if handle.next_apply == handle.head + handle.entries.len() as u64 {
        effects.push(Reverse(piece_effect(at, cut.as_ref(), seq, 0, s.h)));
    }
    handle.entries.push_back(Entry {
        wr: *s.wr,
        batch: s.batch,
        index: s.index,
        cq_at: to_time(s.cq),
        at,
        seq,
        cut: cut.map(Box::new),
        applied: 0,
        value: 0,
        error: None,
    });
    if s.wr.signaled {
        handle.deliverable += 1;
    }
}

impl Core {
    pub fn new(
        p: Profile,
        faults: Faults,
        in_order_write: bool,
        machines: usize,
        seed: u64,
        clock: Arc<AtomicU64>,
    ) -> Self {
        let arbitrated = p.responder.atomic_order != AtomicOrder::Post;
        Self {
            machines: (0..machines).map(|_| Machine::new(&p)).collect(),
            slots: Slots::of(&p),
            p,
            faults,
            in_order_write,
            node_machine: HashMap::new(),
            page_shift: HashMap::new(),
            qps: Vec::new(),
            handles: Vec::new(),
            effects: BinaryHeap::new(),
            shapes: [Shape::default(); 5],
            seq: 0,
            addr_free: IntMap::default(),
            line_free: IntMap::default(),
            device_mem: IntMap::default(),
            arbitrated,
            pending: Vec::new(),
            waits: IntMap::default(),
            arbitrations: BinaryHeap::new(),
            woken: Vec::new(),
            threads: Vec::new(),
            thread_handles: Vec::new(),
            current: None,
            factor: 1.0,
            cursor: 0,
            now: 0,
            clock,
            rng: SimRng::new(seed),
            stats: SimStats::default(),
            rpc: None,
            rpc_cores: 0,
            rpc_max_message: 4096,
            rpc_capacity: 64,
            numa: None,
            thread_socket: Vec::new(),
            switch: None,
        }
    }

    /// Models sockets with `layout` (before any thread connects).
    pub fn set_numa(&mut self, layout: NumaLayout) {
        self.numa = Some(layout);
    }

    /// Puts thread `t` on `socket` (before it connects).
    pub fn set_thread_socket(&mut self, t: ThreadId, socket: u32) {
        self.thread_socket[t as usize] = socket;
    }

    pub fn place_node(&mut self, node: NodeId, machine: usize, page_shift: u32) {
        self.node_machine.insert(node, machine);
        self.page_shift.insert(node, page_shift);
    }

    pub fn set_device_memory(&mut self, node: NodeId, start: u64, len: u64) {
        self.device_mem.insert(node, (start, start + len));
    }

    pub fn machine_count(&self) -> usize {
        self.machines.len()
    }

    pub fn machine_of(&self, node: NodeId) -> Option<usize> {
        self.node_machine.get(&node).copied()
    }

    pub fn add_thread(&mut self, machine: usize) -> ThreadId {
        let id = self.threads.len() as ThreadId;
        self.threads.push(machine);
        self.thread_socket.push(0);
        self.thread_handles.push(Vec::new());
        let m = &mut self.machines[machine];
        let active = m.active + 1;
        m.set_active(active, &self.p);
        id
    }

    pub fn set_active(&mut self, machine: usize, active: u32) {
        let p = &self.p;
        self.machines[machine].set_active(active, p);
        self.set_current(self.current);
    }

    /// Makes thread `t` the caller (`None`: the external caller, outside
    /// any step).
    pub fn set_current(&mut self, t: Option<ThreadId>) {
        self.current = t;
        self.factor = match t {
            Some(t) => self.machines[self.threads[t as usize]].cpu_factor,
            None => 1.0,
        };
    }

    /// The CPU cost multiplier of the caller (1 for the external caller).
    #[inline(always)]
    fn cpu_factor(&self) -> f64 {
        self.factor
    }

    /// Where the caller is in time.
    pub fn caller_time(&self) -> Time {
        if self.current.is_some() {
            self.cursor
        } else {
            self.now
        }
    }

    /// Charges CPU time to the current thread.
    pub fn charge(&mut self, ns: f64) {
        if self.current.is_some() {
            self.cursor += round_ns(ns * self.cpu_factor());
            self.clock.store(self.cursor, Ordering::Release);
        }
    }

    /// Creates a connection for the caller from `machine` to `node`.
    pub fn connect(
        &mut self,
        node: NodeId,
        policy: QpPolicy,
        exec: Executor,
    ) -> Result<u32, String> {
        let target = self
            .machine_of(node)
            .ok_or_else(|| format!("no memory node {node}"))?;
        let thread = self.current;
        let machine = match thread {
            Some(t) => self.threads[t as usize],
            None => 0,
        };
        let m = &mut self.machines[machine];
        let new_qp = |db: usize, lock: Option<SimLock>| Qp::new(machine, target, db, lock);
        let default_db = |m: &mut Machine, p: &Profile| {
            let low = p.doorbell.low_latency;
            let med = p.doorbell.medium_latency.max(1);
            let c = m.default_qps;
            m.default_qps += 1;
            if c < low {
                c as usize
            } else if p.doorbell.medium_latency == 0 {
                (c % low) as usize
            } else {
                (low + (c - low) % med) as usize
            }
        };
        let qp = match policy {
            QpPolicy::PerThreadDoorbell => {
                let db = match m.own_db.get(&thread) {
                    Some(&d) => d,
                    None => {
                        m.dbs.push(SimLock::default());
                        let d = m.dbs.len() - 1;
                        m.own_db.insert(thread, d);
                        d
                    }
                };
                m.dbs[db].join(thread);
                self.qps.push(new_qp(db, None));
                self.qps.len() - 1
            }
            QpPolicy::PerThreadQp => {
                let db = default_db(m, &self.p);
                m.dbs[db].join(thread);
                self.qps.push(new_qp(db, None));
                self.qps.len() - 1
            }
            QpPolicy::Shared | QpPolicy::Multiplexed(_) => {
                let size = match policy {
                    QpPolicy::Multiplexed(n) => n.max(1),
                    _ => usize::MAX,
                };
                let groups = m.groups.entry((node, size)).or_default();
                let found = groups.iter_mut().find(|(_, users)| *users < size);
                let qi = match found {
                    Some((qi, users)) => {
                        *users += 1;
                        *qi
                    }
                    None => {
                        let db = default_db(m, &self.p);
                        self.qps.push(new_qp(db, Some(SimLock::default())));
                        let qi = self.qps.len() - 1;
                        m.groups
                            .get_mut(&(node, size))
                            .expect("just made")
                            .push((qi, 1));
                        qi
                    }
                };
                let db = self.qps[qi].db;
                self.machines[machine].dbs[db].join(thread);
                self.qps[qi]
                    .lock
                    .as_mut()
                    .expect("shared queue pairs have a lock")
                    .join(thread);
                qi
            }
        };
        if self.qps[qp].pu == u32::MAX {
            let m = &mut self.machines[machine];
            self.qps[qp].pu = m.qp_count % self.p.nic.processing_units.max(1);
            m.qp_count += 1;
        }
        if let Some(layout) = &self.numa {
            let socket = thread.map_or(0, |t| self.thread_socket[t as usize]);
            if self.qps[qp].cross == 0 {
                self.qps[qp].cross = layout.crossings(socket, node);
            }
        }
        let shift = self.page_shift.get(&node).copied().unwrap_or(21);
        self.handles.push(Handle {
            qp,
            thread,
            node,
            shift,
            exec,
            entries: VecDeque::new(),
            head: 0,
            deliverable: 0,
            sges: HashMap::new(),
            next_apply: 0,
            stats: Default::default(),
            dropped: false,
        });
        let h = (self.handles.len() - 1) as u32;
        if let Some(t) = thread {
            self.thread_handles[t as usize].push(h);
        }
        Ok(h)
    }

    pub fn handle_exec(&mut self, h: u32) -> &mut Executor {
        &mut self.handles[h as usize].exec
    }

    pub fn handle_stats(&self, h: u32) -> dmkit_fabric::QpStats {
        self.handles[h as usize].stats
    }

    pub fn pending(&self, h: u32) -> usize {
        self.handles[h as usize].deliverable
    }

    /// The next effect of handle `hi` still to land, if any.
    fn next_effect(&self, hi: usize) -> Option<Effect> {
        let hd = &self.handles[hi];
        let e = hd.entries.get((hd.next_apply - hd.head) as usize)?;
        // An entry waiting for an arbitration joins the heap when resolved.
        if e.at == UNRESOLVED {
            return None;
        }
        Some(e.next_effect(hi as u32))
    }

    /// Posts `batch` on handle `h`: computes every request's timing, queues
    /// its effect, and records its completion. The stages a request goes
    /// through (the crate docs' numbering) are the functions it calls:
    /// [`ring_doorbell`] (CPU and locks), the WQE fetch, [`send_queue`]
    /// (requester NIC), [`request_link`], [`responder_admit`] then
    /// [`access_instant`] or [`atomic_instant`] (responder), the faults
    /// ([`fault_shift`], [`tear`]), then either [`defer`] (an arbitrated
    /// atomic, or a request behind one) or [`respond`] and [`enqueue`].
    ///
    /// The state a request touches (its queue pair, its machine's
    /// requester, its target's responder, its handle) is borrowed once
    /// rather than indexed at each use: every `self.x[i]` after a store
    /// reloads the vector and checks the bound again. That took this
    /// function from 700 to 604 instructions per READ (callgrind, `dmkit
    /// sim speed --machines 1 --duration 5ms`). The arithmetic is the same,
    /// operation for operation, so results are the same to the bit.
    pub fn post(&mut self, h: u32, batch: &mut Batch) -> Result<(), PostError> {
        let hi = h as usize;
        if batch.is_empty() {
            return Ok(());
        }
        let cpu_factor = self.cpu_factor();
        let caller = from_time(self.caller_time());
        let now = from_time(self.now);
        let Core {
            p,
            slots,
            faults,
            in_order_write,
            machines,
            qps,
            handles,
            effects,
            shapes,
            seq: next_seq,
            addr_free,
            line_free,
            device_mem,
            arbitrated,
            pending,
            current,
            cursor,
            clock,
            rng,
            stats,
            switch,
            ..
        } = self;
        let handle = &mut handles[hi];
        let qi = handle.qp;
        let qp = &mut qps[qi];
        if qp.lost_at.is_some() {
            return Err(PostError::Disconnected(handle.node));
        }
        handle.exec.begin_post(batch.len())?;
        handle.stats.doorbells += 1;
        stats.doorbells += 1;
        let wrs = batch.len();
        let thread = handle.thread;
        let (machine, target) = (qp.machine, qp.target);
        let (rung, spin) = ring_doorbell(
            p, machines, machine, qp, thread, caller, cpu_factor, wrs, now,
        );
        stats.lock_spin_ns += spin;
        if current.is_some() {
            *cursor = to_time(rung) + 1;
            clock.store(*cursor, Ordering::Release);
        }
        // Disconnect fault: this post and everything in flight fail.
        if faults.disconnect > 0.0 && rng.chance(faults.disconnect) {
            qp.lost_at = Some(to_time(rung));
            stats.disconnects += 1;
        }
        // The NIC fetches the post's WQEs once the doorbell has rung.
        let mut fetched = rung + p.nic.fetch_ns;
        // Across sockets (`crate::numa`): the doorbell's MMIO write and the
        // WQE's DMA read each cross the link; the completion's DMA too.
        let cross = qp.cross;
        let cross_local = if cross & CROSS_LOCAL != 0 {
            fetched += 2.0 * p.numa.cross_ns;
            p.numa.cross_ns
        } else {
            0.0
        };
        let batch_id = qp.next_batch;
        qp.next_batch += 1;
        if !batch.sges().is_empty() {
            handle.sges.insert(batch_id, batch.sges().to_vec());
        }
        let loopback = target == machine;
        let half_wire = if loopback { 0.0 } else { p.link.wire_ns / 2.0 };
        let node = handle.node;
        let page_shift = handle.shift;
        // The requester side of this machine and the responder side of
        // the target: disjoint halves, also when the two are one machine.
        let (tx, rx) = if loopback {
            let both = &mut machines[machine];
            (&mut both.tx, &mut both.rx)
        } else {
            let [requester, responder] = machines
                .get_disjoint_mut([machine, target])
                .expect("a queue pair's machines exist");
            (&mut requester.tx, &mut responder.rx)
        };
        // (Most runs place nothing in device memory: skip the lookup.)
        let on_nic = if device_mem.is_empty() {
            None
        } else {
            device_mem.get(&node).copied()
        };
        for (index, wr) in batch.requests().iter().enumerate() {
            let kind = wr.kind();
            let len = wr.len();
            let shape = shape_of(shapes, p, slots, kind, len);
            let unit = qp_unit_ns(p, wr, index);
            let payload = payload_fetch_ns(p, wr);
            let (depart, lag, qp) =
                send_queue(p, slots, tx, qps, qi, stats, &shape, fetched, unit, payload);
            // --- The switch position (crate::switch); off: `passed` is None
            // and the request goes its usual way.
            let passed = switch.as_deref_mut().map(|s| {
                s.pass(
                    qi,
                    uplink(tx, depart, shape.ser, half_wire),
                    wr,
                    &handle.exec,
                )
            });
            let (arrive, wr, kind, len, shape) = match &passed {
                None => (
                    request_link(tx, rx, depart, shape.ser, half_wire),
                    wr,
                    kind,
                    len,
                    shape,
                ),
                Some(ps) => {
                    let timing = shape_of(shapes, p, slots, ps.timing, ps.len);
                    let shape = Shape {
                        rsvc: timing.rsvc,
                        ..shape
                    };
                    let arrive = downlink(rx, ps.depart, shape.ser, half_wire);
                    (arrive, &ps.wr, ps.timing, ps.len, shape)
                }
            };
            // --- (end of the switch position)
            let rsvc = if cross & CROSS_REMOTE != 0 {
                // The responder's DMA crosses to the other socket's memory.
                let (_, _, payload) = kind_bytes(kind, len);
                fmax(
                    slots.responder,
                    payload / (p.responder.pcie_gbs * p.numa.cross_bw),
                )
            } else {
                shape.rsvc
            };
            // With processing units: how long the request queued on the
            // links and at the responder (behind its own post's earlier
            // requests, booked without the unit's spacing, or others').
            let queued = if lag > 0.0 && passed.is_none() {
                fmax(arrive - depart - 2.0 * (shape.ser + half_wire), 0.0)
                    + fmax(rx.resp_free - arrive, 0.0)
            } else {
                0.0
            };
            let admitted = responder_admit(p, rx, stats, arrive, rsvc, wr, page_shift);
            let admitted = if cross & CROSS_REMOTE != 0 {
                admitted + p.numa.cross_ns
            } else {
                admitted
            };
            let (exec, held) = match kind {
                VerbKind::Read | VerbKind::Write => (
                    access_instant(p, addr_free, line_free, kind, wr, len, admitted),
                    None,
                ),
                _ => atomic_instant(
                    p,
                    slots,
                    rx,
                    addr_free,
                    line_free,
                    *arbitrated,
                    on_nic,
                    wr,
                    admitted,
                ),
            };
            let exec = fault_shift(faults, rng, stats, exec);
            let (exec, late) = match (&passed, switch.as_deref_mut()) {
                (Some(ps), Some(s)) => s.execute_at(ps, exec, qp.last_exec),
                _ => (exec, false),
            };
            let cut = tear(faults, rng, *in_order_write, wr);
            let spread = match &cut {
                Some(_) => faults.torn_spread_ns.max(1) as f64,
                None => 0.0,
            };
            if *arbitrated && (held.is_some() || pending.get(qi).is_some_and(|p| !p.is_empty())) {
                if pending.len() <= qi {
                    pending.resize_with(qi + 1, VecDeque::new);
                }
                defer(
                    stats,
                    next_seq,
                    &mut pending[qi],
                    handle,
                    Deferred {
                        h,
                        wr,
                        batch: batch_id,
                        index: index as u32,
                        ready: exec,
                        atomic: held,
                        cut,
                        spread,
                        shape: &shape,
                        lag,
                    },
                );
                continue;
            }
            // One queue pair's requests take effect in posting order (not a
            // lock request the switch moved alone to a shared connection).
            let nominal = exec;
            let exec = match &passed {
                Some(ps) if !ps.keeps_qp_order() => exec,
                _ => fmax(exec, qp.last_exec + 1.0),
            };
            // With processing units, the completion's delay is what the
            // unit adds beyond the wait queue-pair order already imposed
            // (a translation miss of an earlier request and the unit's
            // time overlap: they are not added).
            let lag = if tx.pu_free.is_empty() {
                lag
            } else {
                // Spaced by its unit, the request would not have queued
                // behind its own post: the queueing (at most the unit's
                // delay) overlaps the delay.
                let phys = fmax(nominal + lag - queued.min(lag), qp.phys_exec + 1.0);
                qp.phys_exec = phys + spread;
                fmax(phys - exec, 0.0)
            };
            let last_exec = qp.last_exec;
            let last_resp = (qp.resp_up, qp.resp_down);
            let links = (tx.down_resp_free, rx.up_resp_free);
            let cq = respond(
                p,
                qp,
                tx,
                rx,
                exec,
                spread,
                shape.rser,
                half_wire,
                cross_local + lag,
                now,
            );
            let cq = match (&passed, switch.as_deref_mut()) {
                (Some(ps), Some(s)) => {
                    if !ps.keeps_qp_order() {
                        qp.last_exec = last_exec;
                        (qp.resp_up, qp.resp_down) = last_resp;
                    }
                    if late {
                        // (See `SwitchStage::execute_at`.)
                        (tx.down_resp_free, rx.up_resp_free) = links;
                    }
                    // `enqueue` numbers the effect `*next_seq + 1`.
                    let cq = s.complete(ps, *next_seq + 1, exec, spread, cq, late);
                    qp.last_cq = cq;
                    cq
                }
                _ => cq,
            };
            enqueue(
                stats,
                next_seq,
                effects,
                handle,
                Settled {
                    h,
                    wr,
                    batch: batch_id,
                    index: index as u32,
                    exec,
                    cq,
                    cut,
                    spread,
                    wire: shape.wire,
                },
            );
        }
        let qp = &qps[qi];
        if qp.in_backlog {
            tx.backlog_ends
                .push(Reverse((to_time(qp.nic_free), qi as u32)));
        }
        batch.clear();
        if self.arbitrated
            && self
                .pending
                .get(qi)
                .and_then(VecDeque::front)
                .is_some_and(|f| !f.waiting)
        {
            self.advance(qi);
        }
        Ok(())
    }
    /// Executes what can execute at the head of queue pair `qi`'s pending
    /// requests: requests behind no atomic run at once; an atomic at the
    /// head starts waiting at its address.
    fn advance(&mut self, qi: usize) {
        while let Some(&front) = self.pending[qi].front() {
            let q = &mut self.qps[qi];
            match front.atomic {
                None => {
                    self.pending[qi].pop_front();
                    let exec = fmax(front.ready, q.last_exec + 1.0);
                    self.resolve(qi, front, exec);
                }
                Some((addr, _)) => {
                    if front.waiting {
                        return;
                    }
                    // It cannot reach its address before the queue pair's
                    // previous request has executed.
                    let ready = fmax(front.ready, q.last_exec + 1.0);
                    let f = self.pending[qi].front_mut().expect("front exists");
                    f.ready = ready;
                    f.waiting = true;
                    let w = self.waits.entry(addr).or_default();
                    w.qps.push(qi as u32);
                    let at = to_time(fmax(ready, w.free));
                    if w.event.is_none_or(|e| at < e) {
                        w.event = Some(at);
                        self.arbitrations.push(Reverse((at, addr)));
                    }
                    return;
                }
            }
        }
    }

    /// The arbitration of address `addr` due at `at`: if it is still live,
    /// the chosen atomic executes, and whatever its queue pair posted
    /// behind it follows.
    fn arbitrate(&mut self, at: Time, addr: u64) {
        let Some(w) = self.waits.get_mut(&addr) else {
            return;
        };
        if w.event != Some(at) {
            return;
        }
        w.event = None;
        let ready = |qi: u32| self.pending[qi as usize][0].ready;
        let Some(first) = earliest(&self.pending, &w.qps) else {
            return;
        };
        // The decision instant, and who has arrived by then.
        let decide = fmax(w.free, first);
        let order = self.p.responder.atomic_order;
        let pick = {
            let arrived = w
                .qps
                .iter()
                .enumerate()
                .filter(|&(_, &q)| ready(q) <= decide);
            match order {
                AtomicOrder::Post | AtomicOrder::Arrival => arrived
                    .min_by(|a, b| ready(*a.1).total_cmp(&ready(*b.1)).then(a.0.cmp(&b.0)))
                    .map(|(i, _)| i),
                AtomicOrder::Newest => arrived
                    .max_by(|a, b| ready(*a.1).total_cmp(&ready(*b.1)).then(b.0.cmp(&a.0)))
                    .map(|(i, _)| i),
                AtomicOrder::RoundRobin => {
                    let n = self.qps.len() as u32;
                    let last = w.last;
                    arrived
                        .min_by_key(|&(_, &q)| (q + n - last - 1) % n)
                        .map(|(i, _)| i)
                }
                AtomicOrder::Random => {
                    let n = arrived.clone().count() as u64;
                    let k = self.rng.below(n) as usize;
                    arrived.clone().nth(k).map(|(i, _)| i)
                }
            }
        }
        .expect("the earliest arrival has arrived by the decision instant");
        let qi = w.qps.swap_remove(pick);
        let front = self.pending[qi as usize]
            .pop_front()
            .expect("a waiting queue pair has its atomic at the head");
        let (_, hold) = front.atomic.expect("waiting requests are atomics");
        let start = fmax(decide, front.ready);
        let w = self.waits.get_mut(&addr).expect("looked up above");
        w.free = start + hold;
        w.last = qi;
        if let Some(next) = earliest(&self.pending, &w.qps) {
            let t = to_time(fmax(next, w.free));
            w.event = Some(t);
            self.arbitrations.push(Reverse((t, addr)));
        }
        self.resolve(qi as usize, front, start + hold);
        self.advance(qi as usize);
    }

    /// Request `pd` of queue pair `qi` executes at `exec`: its response,
    /// its completion, and its memory effect are scheduled.
    fn resolve(&mut self, qi: usize, pd: Pending, exec: f64) {
        let now = from_time(self.now);
        let p = &self.p;
        let q = &mut self.qps[qi];
        let (machine, target) = (q.machine, q.target);
        let loopback = machine == target;
        let half_wire = if loopback { 0.0 } else { p.link.wire_ns / 2.0 };
        let spread = pd.spread;
        let (m, tm) = if loopback {
            let mm = &mut self.machines[machine];
            (&mut mm.tx, &mut mm.rx)
        } else {
            let [a, b] = self
                .machines
                .get_disjoint_mut([machine, target])
                .expect("a queue pair's machines exist");
            (&mut a.tx, &mut b.rx)
        };
        let extra = if q.cross & CROSS_LOCAL != 0 {
            p.numa.cross_ns
        } else {
            0.0
        };
        let cq = respond(
            p,
            q,
            m,
            tm,
            exec,
            spread,
            pd.rser,
            half_wire,
            extra + pd.lag,
            now,
        );
        let hi = pd.h as usize;
        let hd = &mut self.handles[hi];
        let pos = (pd.idx - hd.head) as usize;
        let e = &mut hd.entries[pos];
        e.at = to_time(exec);
        e.cq_at = to_time(cq);
        if let Some(c) = &mut e.cut {
            c.land(exec, spread);
        }
        if e.wr.signaled {
            if let Some(t) = hd.thread {
                self.woken.push((e.cq_at, t));
            }
        }
        if hd.next_apply == pd.idx {
            let ev = e.next_effect(pd.h);
            self.effects.push(Reverse(ev));
        }
    }

    /// Whether a completion of thread `t` waits for an arbitration, or
    /// one of its RPC replies for the node's cores.
    pub fn awaits_arbitration(&self, t: ThreadId) -> bool {
        if self.rpc.as_ref().is_some_and(|r| r.awaits(t)) {
            return true;
        }
        self.arbitrated
            && self.thread_handles[t as usize].iter().any(|&h| {
                self.handles[h as usize]
                    .entries
                    .iter()
                    .any(|e| e.delivers() && e.cq_at == UNRESOLVED)
            })
    }

    /// When the next arbitration is due, if any.
    pub fn next_arbitration(&self) -> Option<Time> {
        self.arbitrations.peek().map(|r| r.0 .0)
    }

    /// When the next event that may decide a completion is due: an
    /// arbitration, or an event of the RPC path (the driver runs them
    /// before any step that comes after them).
    pub fn next_event(&self) -> Option<Time> {
        let a = self.next_arbitration();
        match self.rpc.as_ref().and_then(|r| r.next_event()) {
            Some(r) => Some(a.map_or(r, |a| a.min(r))),
            None => a,
        }
    }

    /// Applies every memory effect due at or before `t`, running the RPC
    /// path's events in time order with them (an event after the effects
    /// of its instant), and moves the engine's time there.
    pub fn apply_until(&mut self, t: Time) {
        if self.rpc.is_some() {
            while let Some(at) = self
                .rpc
                .as_ref()
                .and_then(|r| r.next_event())
                .filter(|&at| at <= t)
            {
                self.apply_effects_and_arbitrations(at);
                self.run_rpc_event();
            }
        }
        self.apply_effects_and_arbitrations(t);
    }

    /// Applies every memory effect due at or before `t` and moves the
    /// engine's time there (never backwards).
    fn apply_effects_and_arbitrations(&mut self, t: Time) {
        // Arbitrations first when one is due before the next effect (an
        // arbitration only schedules effects after its own instant).
        while let Some(&Reverse((at, addr))) = self.arbitrations.peek() {
            if at > t {
                break;
            }
            if self.effects.peek().is_some_and(|e| e.0.at() < at) {
                self.apply_effects_until(at - 1);
                continue;
            }
            self.arbitrations.pop();
            self.arbitrate(at, addr);
        }
        self.apply_effects_until(t);
        if t > self.now {
            self.now = t;
        }
        if self.current.is_none() {
            self.clock.store(self.now, Ordering::Release);
        }
    }

    /// Applies every memory effect due at or before `t`.
    #[inline]
    fn apply_effects_until(&mut self, t: Time) {
        while let Some(&Reverse(ev)) = self.effects.peek() {
            if ev.at() > t {
                break;
            }
            self.apply(ev);
            // `apply` leaves the heap alone: `ev` is still its top.
            match self.next_effect(ev.handle() as usize) {
                Some(next) => *self.effects.peek_mut().expect("ev is the top") = Reverse(next),
                None => {
                    self.effects.pop();
                }
            }
        }
    }

    /// Applies one memory effect (one request, or one piece of a torn one).
    fn apply(&mut self, ev: Effect) {
        let hi = ev.handle() as usize;
        let at = ev.at();
        let qi = self.handles[hi].qp;
        self.stats.effects += 1;
        let hd = &mut self.handles[hi];
        let idx = (hd.next_apply - hd.head) as usize;
        // The handle's next request is the next thing read after this one
        // lands (its instant joins the heap): start loading it now, while
        // this one executes (both are cold: posted long ago).
        if let Some(next) = hd.entries.get(idx + 1) {
            prefetch(next);
        }
        let e = &mut hd.entries[idx];
        let slot = e.applied as usize;
        let q = &mut self.qps[qi];
        if e.applied == 0 {
            let outcome = if q.lost_at.is_some_and(|l| l <= at) {
                Err(VerbError::ConnectionLost(hd.node))
            } else if q.failed_batch == e.batch {
                Err(VerbError::Flushed)
            } else {
                let sges = if hd.sges.is_empty() {
                    &[][..]
                } else {
                    hd.sges.get(&e.batch).map(Vec::as_slice).unwrap_or(&[])
                };
                match &e.cut {
                    None => hd.exec.execute(&e.wr, sges),
                    Some(c) => {
                        let c = **c;
                        hd.exec.check(&e.wr, sges).and_then(|()| {
                            let i = c.order[slot] as usize;
                            hd.exec
                                .execute(&piece(&e.wr, c.cuts[i], c.cuts[i + 1]), &[])
                                .map(|_| e.wr.len() as u64)
                        })
                    }
                }
            };
            if let Err(err) = &outcome {
                if !matches!(err, VerbError::Flushed) {
                    self.stats.failed += 1;
                    hd.exec.note_error();
                    hd.stats.errors += 1;
                }
                q.failed_batch = e.batch;
                if !e.wr.signaled {
                    hd.deliverable += 1;
                }
            } else {
                let st = &mut hd.stats;
                let len = e.wr.len() as u64;
                match e.wr.kind() {
                    VerbKind::Read => {
                        st.reads += 1;
                        st.bytes_read += len;
                        self.stats.reads += 1;
                        self.stats.bytes_read += len;
                    }
                    VerbKind::Write => {
                        st.writes += 1;
                        st.bytes_written += len;
                        self.stats.writes += 1;
                        self.stats.bytes_written += len;
                    }
                    VerbKind::Cas => {
                        st.cas += 1;
                        self.stats.atomics += 1;
                    }
                    VerbKind::MaskedCas => {
                        st.masked_cas += 1;
                        self.stats.atomics += 1;
                    }
                    VerbKind::Faa => {
                        st.faa += 1;
                        self.stats.atomics += 1;
                    }
                }
            }
            match outcome {
                Ok(v) => e.value = v,
                Err(err) => e.error = Some(Box::new(err)),
            }
            if let Some(s) = self.switch.as_deref_mut() {
                s.executed(e.seq, at, e.error.is_none().then_some(e.value));
            }
        } else if e.error.is_none() {
            let c = **e
                .cut
                .as_ref()
                .expect("only torn requests have later pieces");
            let i = c.order[slot] as usize;
            // Checked as a whole when the first piece landed; a later piece
            // can only fail if the node remapped meanwhile.
            if let Err(err) = hd
                .exec
                .execute(&piece(&e.wr, c.cuts[i], c.cuts[i + 1]), &[])
            {
                e.error = Some(Box::new(err));
                if !e.wr.signaled {
                    hd.deliverable += 1;
                }
            }
        }
        e.applied += 1;
        if e.applied == e.pieces() {
            self.stats.executed += 1;
            hd.next_apply += 1;
        }
        if hd.dropped {
            self.discard_executed(hi);
        }
    }

    fn discard_executed(&mut self, hi: usize) {
        let hd = &mut self.handles[hi];
        let m = self.qps[hd.qp].machine;
        while hd.entries.front().is_some_and(|e| e.applied == e.pieces()) {
            hd.entries.pop_front();
            hd.head += 1;
            self.machines[m].tx.outstanding -= 1;
        }
        hd.deliverable = 0;
    }

    /// Marks handle `h` dropped.
    pub fn drop_handle(&mut self, h: u32) {
        let hi = h as usize;
        self.handles[hi].dropped = true;
        if let Some(t) = self.handles[hi].thread {
            self.thread_handles[t as usize].retain(|&x| x != h);
        }
        self.discard_executed(hi);
    }

    /// Moves up to `max` completions of handle `h` that are visible to the
    /// caller into `out`. Inside a step, visible means delivered by the
    /// caller's CPU time and executed; the external caller (setup code,
    /// tests) instead advances the simulation until something completes.
    pub fn poll(&mut self, h: u32, out: &mut Vec<Completion>, max: usize) -> usize {
        let hi = h as usize;
        let external = self.current.is_none();
        self.charge(self.p.cpu.poll_ns);
        loop {
            let limit = self.caller_time();
            let m = self.qps[self.handles[hi].qp].machine;
            let hd = &mut self.handles[hi];
            let mut n = 0;
            while n < max {
                let Some(e) = hd.entries.front() else { break };
                if e.cq_at > limit || e.applied < e.pieces() {
                    break;
                }
                let e = hd.entries.pop_front().expect("front exists");
                hd.head += 1;
                self.machines[m].tx.outstanding -= 1;
                if !hd.sges.is_empty() && hd.entries.front().is_none_or(|f| f.batch != e.batch) {
                    hd.sges.remove(&e.batch);
                }
                if e.delivers() {
                    hd.deliverable -= 1;
                    self.stats.completed += 1;
                    let result = match e.error {
                        None => Ok(e.value),
                        Some(error) => Err(Box::new(RequestError {
                            index: e.index as usize,
                            wr_id: e.wr.wr_id,
                            kind: e.wr.kind(),
                            remote: e.wr.remote,
                            error: *error,
                        })),
                    };
                    out.push(Completion {
                        wr_id: e.wr.wr_id,
                        result,
                    });
                    n += 1;
                }
            }
            if n > 0 {
                self.charge(self.p.cpu.cqe_ns * n as f64);
            }
            if n > 0 || !external || self.handles[hi].deliverable == 0 {
                return n;
            }
            // The external caller waits: run the simulation to the next
            // completion of this handle.
            match self.next_completion_at(hi) {
                Some(t) => {
                    let t = t.max(self.now);
                    // Effects due by then, including this handle's own.
                    self.apply_until(t);
                }
                None => return 0,
            }
        }
    }

    /// When handle `hi`'s next completion becomes visible: its first
    /// signaled or failed request, else its first outstanding one.
    fn next_completion_at(&self, hi: usize) -> Option<Time> {
        let hd = &self.handles[hi];
        let at = hd
            .entries
            .iter()
            .find(|e| e.delivers())
            .or(hd.entries.front())
            .map(|e| e.cq_at)?;
        if at != UNRESOLVED {
            return Some(at);
        }
        // Not known before an arbitration: the next thing that happens.
        let effect = self.effects.peek().map(|e| e.0.at());
        let arbitration = self.next_event();
        match (effect, arbitration) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }

    /// Blocks the caller until handle `h` has a completion: the thread's
    /// CPU time jumps to it and effects due by then are applied.
    pub fn block_on(&mut self, h: u32) {
        if let Some(t) = self.next_completion_at(h as usize) {
            self.apply_until(t);
            if self.current.is_some() && t > self.cursor {
                self.cursor = t;
                self.clock.store(t, Ordering::Release);
            }
        }
    }

    /// Requests posted and not yet polled (or discarded), all handles.
    pub fn in_flight(&self) -> usize {
        self.handles.iter().map(|h| h.entries.len()).sum()
    }

    /// Hints the CPU to load the first two lines of each of thread `t`'s
    /// connections and of their oldest requests (the driver calls it for
    /// the thread it will step next).
    pub fn prefetch_thread(&self, t: ThreadId) {
        for &h in &self.thread_handles[t as usize] {
            let hd = &self.handles[h as usize];
            prefetch(hd);
            if let Some(e) = hd.entries.front() {
                prefetch(e);
            }
        }
    }

    /// When thread `t` next has a completion (or an RPC reply) to reap.
    pub fn next_completion(&self, t: ThreadId) -> Option<Time> {
        let mut best: Option<Time> = self.rpc.as_ref().and_then(|r| r.next_reply(t));
        for &h in &self.thread_handles[t as usize] {
            let hd = &self.handles[h as usize];
            if hd.deliverable == 0 {
                continue;
            }
            // (A completion that waits for an arbitration is announced
            // in `woken` when its instant is known.)
            if let Some(e) = hd
                .entries
                .iter()
                .find(|e| e.delivers() && e.cq_at != UNRESOLVED)
            {
                best = Some(best.map_or(e.cq_at, |b| b.min(e.cq_at)));
            }
        }
        best
    }
}

/// The larger of two model times (never NaN; cheaper than `f64::max`,
/// which must handle NaN — 15 % of a post in a profile).
#[inline(always)]
pub(crate) fn fmax(a: f64, b: f64) -> f64 {
    if a > b {
        a
    } else {
        b
    }
}

/// The smaller of two model times (never NaN).
#[inline(always)]
fn fmin(a: f64, b: f64) -> f64 {
    if a < b {
        a
    } else {
        b
    }
}

/// `x.round() as Time` for the non-negative costs the engine charges,
/// without `f64::round`, which is a libm call on baseline x86-64 (2.5 % of
/// the simulator's time). Exact: for `0 ≤ x < 2^52`, `x - trunc(x)` is
/// representable, so the comparison with one half decides as `round` does
/// (ties away from zero); below zero both give 0. The conversions go
/// through `i64`, one instruction each way (`u64`'s are several).
#[inline(always)]
fn round_ns(x: f64) -> Time {
    let t = (x as i64).max(0);
    if x - t as f64 >= 0.5 {
        t as Time + 1
    } else {
        t as Time
    }
}

/// `t as f64` through `i64` (exact and the same below 2^53; one
/// instruction instead of `u64`'s several).
#[inline(always)]
fn from_time(t: Time) -> f64 {
    t as i64 as f64
}

/// `x as Time` (truncation; 0 below zero) through `i64`: the same for
/// every instant below 2^63 ns, one instruction instead of `u64`'s
/// compare-and-adjust sequence.
#[inline(always)]
pub(crate) fn to_time(x: f64) -> Time {
    (x as i64).max(0) as Time
}

/// Packets of a message of `payload` bytes (at least one).
#[inline]
pub(crate) fn packets(payload: f64, mtu: f64) -> f64 {
    if payload <= mtu {
        1.0
    } else {
        (payload / mtu).ceil()
    }
}

/// Bytes `[a, b)` of a READ or WRITE as a request of their own.
fn piece(wr: &WorkRequest, a: usize, b: usize) -> WorkRequest {
    let mut w = *wr;
    w.remote = wr.remote.add(a as u64);
    match &mut w.op {
        Op::Read { local } | Op::Write { local, .. } => {
            local.offset += a as u64;
            local.len = (b - a) as u32;
        }
        _ => unreachable!("only READ and WRITE are torn"),
    }
    w
}

#[cfg(test)]
mod lock_tests {
    use super::*;

    fn profile() -> Profile {
        Profile::builtin("cx6-200g").unwrap()
    }

    fn shared_by(n: u32) -> SimLock {
        let mut l = SimLock::default();
        for t in 0..n {
            l.join(Some(t));
        }
        l
    }

    #[test]
    fn sharers_that_do_not_post_together_cost_nothing() {
        let p = profile();
        let d = &p.doorbell;
        // 94 sharers, but one thread posts alone, well spaced: the line
        // stays in its core.
        let mut l = shared_by(94);
        for i in 0..5 {
            let t = 10_000.0 * i as f64;
            let (rel, spin) = l.acquire(Some(3), t, t, &p);
            assert_eq!((rel - t, spin), (d.lock_ns, 0.0));
        }
        // Another thread next: the line moves once, nobody waits.
        let (rel, spin) = l.acquire(Some(4), 60_000.0, 60_000.0, &p);
        assert_eq!((rel - 60_000.0, spin), (d.lock_ns + d.bounce_ns, 0.0));
    }

    #[test]
    fn a_queue_slows_every_handover_up_to_max_spinners() {
        let p = profile();
        let d = &p.doorbell;
        let mut l = shared_by(94);
        // 20 threads ask at the same instant.
        let mut prev = 0.0;
        for th in 0..20u32 {
            let (rel, spin) = l.acquire(Some(th), 0.0, 0.0, &p);
            let queued = th.min(d.max_spinners) as f64;
            let bounce = if th == 0 { 0.0 } else { d.bounce_ns };
            assert_eq!(spin, prev, "thread {th} waits for the one before");
            assert_eq!(rel - prev, d.lock_ns + bounce + d.handoff_ns * queued);
            prev = rel;
        }
    }

    #[test]
    fn an_earlier_asker_stepped_later_takes_the_gap() {
        let p = profile();
        let d = &p.doorbell;
        let mut l = shared_by(2);
        // Thread 0 ran ahead and booked two posts 2 µs apart.
        l.acquire(Some(0), 0.0, 0.0, &p);
        l.acquire(Some(0), 2_000.0, 0.0, &p);
        // Thread 1 asks at 500 ns: the gap between them is free.
        let (rel, spin) = l.acquire(Some(1), 500.0, 0.0, &p);
        assert_eq!(spin, 0.0);
        assert_eq!(rel, 500.0 + d.lock_ns + d.bounce_ns);
        // Thread 1 again at 1,900 ns: its own line, and room before thread
        // 0's hold at 2,000 ns.
        let (rel, spin) = l.acquire(Some(1), 1_900.0, 0.0, &p);
        assert_eq!((spin, rel), (0.0, 1_900.0 + d.lock_ns));
        // At 1,990 ns the hold would overlap thread 0's: it waits behind it
        // (one spinner) and the line moves.
        let (rel, spin) = l.acquire(Some(1), 1_990.0, 0.0, &p);
        let t0_release = 2_000.0 + d.lock_ns;
        assert_eq!(spin, t0_release - 1_990.0);
        assert_eq!(rel, t0_release + d.lock_ns + d.bounce_ns + d.handoff_ns);
    }

    /// The calendar as a ring of live holds (the representation before the
    /// vector with a start index), for comparison: the same walk, other
    /// bookkeeping.
    struct RingLock {
        holds: VecDeque<Hold>,
        last: Option<Option<ThreadId>>,
        users: usize,
    }

    impl RingLock {
        fn acquire(
            &mut self,
            owner: Option<ThreadId>,
            t: f64,
            now: f64,
            p: &Profile,
        ) -> (f64, f64) {
            while self.holds.front().is_some_and(|h| h.release <= now) {
                self.last = self.holds.pop_front().map(|h| h.owner);
            }
            // Always the walk (the calendar takes a shortcut past its last
            // hold, which must agree with it to the bit).
            let (i, grant, hold) = book(
                self.holds.make_contiguous(),
                self.last,
                self.users,
                owner,
                t,
                p,
            );
            let release = grant + hold;
            self.holds.insert(
                i,
                Hold {
                    grant,
                    release,
                    owner,
                },
            );
            (release, grant - t)
        }
    }

    #[test]
    fn the_calendar_matches_a_ring_of_holds() {
        let p = profile();
        let mut rng = SimRng::new(7);
        let mut compacted = false;
        for round in 0..18 {
            let threads = 1 + round % 6;
            let mut lock = shared_by(threads);
            let mut ring = RingLock {
                holds: VecDeque::new(),
                last: None,
                users: threads as usize,
            };
            let mut now = 0.0;
            // Threads run ahead of the engine's clock by up to `ahead` ns,
            // the clock moves by up to `step` per call: a long lead with a
            // fast clock keeps hundreds of holds booked while the oldest
            // are forgotten (the vector compacts without emptying).
            let ahead = [50, 2_000, 200_000][round as usize % 3];
            let step = [40, 400, 1_500][round as usize / 3 % 3];
            for _ in 0..5_000 {
                let first_before = lock.first;
                now += rng.below(step) as f64;
                let t = now + rng.below(ahead) as f64;
                let owner = Some(rng.below(threads as u64) as ThreadId);
                let a = lock.acquire(owner, t, now, &p);
                let b = ring.acquire(owner, t, now, &p);
                assert_eq!(a.0.to_bits(), b.0.to_bits(), "release, round {round}");
                assert_eq!(a.1.to_bits(), b.1.to_bits(), "spin, round {round}");
                // Compacted, not emptied: an emptied vector holds only
                // the new hold.
                compacted |= first_before >= 64 && lock.first == 0 && lock.holds.len() > 1;
            }
            assert_eq!(lock.holds.len() - lock.first, ring.holds.len());
        }
        assert!(
            compacted,
            "no round compacted the vector without emptying it"
        );
    }
}

#[cfg(test)]
mod round_tests {
    use super::{round_ns, Calendar};

    #[test]
    fn a_response_takes_the_first_gap_of_its_link_once_ready() {
        let mut c = Calendar::default();
        // A response ready far ahead (an atomic that waits at its address)
        // does not hold back one ready now.
        assert_eq!(c.book(5_000.0, 20.0, 0.0), 5_000.0);
        assert_eq!(c.book(100.0, 20.0, 0.0), 100.0);
        // Back to back from 100: merged into one busy period.
        assert_eq!(c.book(100.0, 20.0, 0.0), 120.0);
        assert_eq!(c.busy, vec![(100.0, 140.0), (5_000.0, 5_020.0)]);
        // A gap too short is skipped: 4_990 + 20 overlaps the period at 5_000.
        assert_eq!(c.book(4_990.0, 20.0, 0.0), 5_020.0);
        assert_eq!(c.busy, vec![(100.0, 140.0), (5_000.0, 5_040.0)]);
        // Periods over by `now` are forgotten.
        assert_eq!(c.book(6_000.0, 20.0, 5_500.0), 6_000.0);
        assert_eq!(&c.busy[c.first..], &[(6_000.0, 6_020.0)]);
    }

    #[test]
    fn round_ns_equals_f64_round_on_costs() {
        let mut x = 0.0f64;
        let mut cases = vec![
            0.0,
            0.5,
            1.5,
            2.5,
            0.49999999999999994,
            1e15 + 0.5,
            4503599627370495.5,
        ];
        for i in 0..200_000u64 {
            x += 0.013 * (i % 97) as f64;
            cases.push(x);
            cases.push(x.floor() + 0.5);
            cases.push(f64::from_bits((x.floor() + 0.5).to_bits() - 1));
        }
        for &c in &cases {
            assert_eq!(round_ns(c), c.round() as u64, "{c:e}");
        }
    }
}

#[cfg(test)]
mod response_tests {
    use super::*;

    fn qp() -> Qp {
        Qp::new(0, 1, 0, None)
    }

    /// `respond` with no wire, no spread, no extra delay, at instant 0.
    fn answer(p: &Profile, q: &mut Qp, m: &mut Machine, t: &mut Machine, exec: f64, len: f64) {
        respond(p, q, &mut m.tx, &mut t.rx, exec, 0.0, len, 0.0, 0.0, 0.0);
    }

    #[test]
    fn under_gaps_a_queue_pairs_responses_keep_their_order() {
        let mut p = Profile::builtin("cx6-200g").unwrap();
        p.link.response_gaps = true;
        let (mut m, mut t) = (Machine::new(&p), Machine::new(&p));
        // Another queue pair's response holds the target's uplink over
        // [100, 200), then the requester's downlink over [200, 300).
        let mut other = qp();
        answer(&p, &mut other, &mut m, &mut t, 100.0, 100.0);
        assert_eq!((other.resp_up, other.resp_down), (200.0, 300.0));
        // A long response ready at 30 does not fit before 100: it goes at
        // 200 (uplink) and 300 (downlink).
        let mut q = qp();
        answer(&p, &mut q, &mut m, &mut t, 30.0, 80.0);
        assert_eq!((q.resp_up, q.resp_down), (280.0, 380.0));
        // The same queue pair's next, short response ready at 40 would fit
        // the gap at 40: it follows its predecessor on both links instead.
        let c1 = q.last_cq;
        answer(&p, &mut q, &mut m, &mut t, 40.0, 20.0);
        assert_eq!((q.resp_up, q.resp_down), (300.0, 400.0));
        assert!(q.last_cq > c1);
        // Another queue pair's short response takes that gap.
        let mut third = qp();
        answer(&p, &mut third, &mut m, &mut t, 40.0, 20.0);
        assert_eq!((third.resp_up, third.resp_down), (60.0, 80.0));
    }
}
