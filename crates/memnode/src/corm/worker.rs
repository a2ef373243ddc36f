//! The store and its workers.
//!
//! Each [`Worker`] is one allocator (CoRM §3.1.4): it owns its blocks'
//! metadata outright and serves operations. Requests that need another
//! worker's metadata (free, pointer release, pointer correction by
//! messaging) and block collection travel as messages between workers'
//! inboxes; a worker never blocks on another. An operation is started with
//! [`Worker::start`]; it completes at once or parks until a peer's answer
//! (or a lock's release, or a compaction) lets it go on in a later
//! [`Worker::step`]. So a thread per worker runs the store ([`Worker::call`]
//! blocks its own thread, stepping), and one thread can play every worker
//! deterministically ([`super::Cluster`]).
//!
//! Reads and writes need no metadata: any worker serves them on memory,
//! with the same checks a one-sided reader makes ([`super::layout::decode`])
//! and the header's write lock taken by compare-and-swap.

use std::collections::{BTreeMap, BTreeSet, HashMap, VecDeque};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::mpsc::{channel, Receiver, Sender};
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::block::{Block, Obj};
use super::class::{ClassInfo, ClassPolicy, SizeClasses};
use super::compact::{Compaction, Trigger};
use super::config::{Correction, ObjError, Op, OpResult, Reply, StoreConfig};
use super::layout::{decode, encode, Expect, ObjHeader, ObjPtr, ReadFault, HOME_SHIFT, LOCK_WRITE};
use super::mem::Mem;
use super::rng::Rng;
use super::space::Space;
use super::stats::{Accounting, CormStats};
use crate::node::MemNode;

/// How long an operation may find its object locked before it answers
/// [`ObjError::Busy`].
pub(crate) const BUSY_TIMEOUT: Duration = Duration::from_secs(2);
/// Immediate re-reads of a torn object before the operation parks.
const TORN_RETRIES: u32 = 16;
/// Pointer corrections one operation may need (the object can move again
/// between a correction and the access).
const MAX_CORRECTIONS: u32 = 8;

/// What every worker shares: configuration, memory, the block allocator
/// and directory, accounting.
#[derive(Debug)]
pub(crate) struct Shared {
    pub cfg: StoreConfig,
    pub classes: SizeClasses,
    pub policies: Vec<ClassPolicy>,
    pub space: Space,
    pub mem: Mem,
    pub acct: Arc<Accounting>,
    pub node_id: u16,
    /// A compaction runs (one at a time).
    pub compacting: AtomicBool,
    /// Messages sent and not yet received (quiescence, for the checker).
    pub in_flight: AtomicU64,
    /// Per class: the threshold trigger re-arms when live objects drop
    /// to this (a block's worth below the count at its last compaction).
    pub rearm: Box<[AtomicU64]>,
    pub rounds: AtomicU64,
}

impl Shared {
    pub(crate) fn block_size(&self) -> u64 {
        self.space.block_size()
    }

    pub(crate) fn class(&self, c: u8) -> &ClassInfo {
        self.classes.get(c).expect("valid class")
    }

    /// Remote offset of slot `slot` of the block at virtual block `vb`.
    pub(crate) fn slot_offset(&self, vb: u64, class: u8, slot: u32) -> u64 {
        self.space.vb_offset(vb) + slot as u64 * self.class(class).slot_size as u64
    }

    /// The header's home field of virtual block `vb`.
    pub(crate) fn home_of(&self, vb: u64) -> u64 {
        self.space.vb_offset(vb) >> HOME_SHIFT
    }

    /// A pointer to object `id` of `class` homed at `vb`, at `slot`.
    pub(crate) fn pointer(&self, vb: u64, gen: u8, class: u8, id: u16, slot: u32) -> ObjPtr {
        ObjPtr::new(
            self.node_id,
            self.slot_offset(vb, class, slot),
            self.space.rkey,
            id,
            class,
            gen,
        )
    }

    /// Checks a pointer against the directory: `(home vb, slot at hint)`.
    pub(crate) fn validate(&self, p: &ObjPtr) -> Result<(u64, u32), ObjError> {
        let forged = |why: &str| Err(ObjError::Forged(why.into()));
        if p.node() != self.node_id {
            return forged("another memory node");
        }
        if p.rkey() != self.space.rkey {
            return forged("not the store's key");
        }
        let Some(vb) = self.space.vb_of(p.offset()) else {
            return forged("outside the store's range");
        };
        let Some(c) = self.classes.get(p.class()) else {
            return forged("no such size class");
        };
        let d = self.space.dir(vb);
        if !d.used || d.gen != p.gen() {
            return Err(ObjError::Stale);
        }
        if d.class != p.class() {
            return Err(ObjError::WrongClass {
                ptr: p.class(),
                block: d.class,
            });
        }
        let hint = p.offset_hint(self.block_size());
        let s = c.slot_size as u64;
        if !hint.is_multiple_of(s) || hint / s >= c.slots as u64 {
            return forged("offset is not a slot of its class");
        }
        Ok((vb, (hint / s) as u32))
    }
}

/// A handle on a CoRM store: configuration, statistics, the checker.
/// The store lives as long as its handle or any of its workers.
#[derive(Debug, Clone)]
pub struct Store {
    pub(crate) sh: Arc<Shared>,
}

/// An operation's handle on the worker that started it.
pub type Ticket = u64;

impl Store {
    /// Builds a store on `node` and its `cfg.workers` workers. Registers
    /// its accounting with the node (one store per node).
    ///
    /// The store does not keep `node` alive (the node holds it when it is
    /// a service, [`super::service::CormService`]): the caller does, for as
    /// long as it uses the store.
    pub fn new(node: &Arc<MemNode>, cfg: StoreConfig) -> Result<(Store, Vec<Worker>), String> {
        if cfg.workers == 0 || cfg.workers > 255 {
            return Err(format!("{} workers: 1..=255", cfg.workers));
        }
        cfg.strategy.validate()?;
        if !(0.0..=1.0).contains(&cfg.policy.collect_max_fill) {
            return Err("collect_max_fill is a fill ratio in 0..=1".into());
        }
        if cfg.policy.threshold.is_some_and(|t| t.is_nan() || t < 1.0) {
            return Err("the fragmentation threshold is a ratio ≥ 1".into());
        }
        let space = Space::new(
            node,
            cfg.block_size,
            cfg.virtual_bytes,
            cfg.max_active_bytes,
        )?;
        let classes = SizeClasses::new(cfg.block_size);
        let policies = classes
            .iter()
            .map(|(_, c)| cfg.strategy.policy(c))
            .collect();
        let acct = Arc::new(Accounting::new(
            &classes,
            cfg.strategy.name(),
            cfg.workers as u64,
            space.nvb * cfg.block_size,
        ));
        node.attach_corm(acct.clone()).map_err(|e| e.to_string())?;
        let n = cfg.workers;
        let mut rng = cfg.seed.map_or_else(Rng::from_os, Rng::new);
        let sh = Arc::new(Shared {
            rearm: (0..classes.len())
                .map(|_| AtomicU64::new(u64::MAX))
                .collect(),
            node_id: node.layout().node_id,
            mem: Mem::new(node),
            classes,
            policies,
            space,
            acct,
            compacting: AtomicBool::new(false),
            in_flight: AtomicU64::new(0),
            rounds: AtomicU64::new(0),
            cfg,
        });
        let (txs, rxs): (Vec<_>, Vec<_>) = (0..n).map(|_| channel()).unzip();
        let workers = rxs
            .into_iter()
            .enumerate()
            .map(|(i, inbox)| Worker::new(i as u8, sh.clone(), inbox, txs.clone(), rng.next_u64()))
            .collect();
        Ok((Store { sh }, workers))
    }

    /// The configuration.
    pub fn config(&self) -> &StoreConfig {
        &self.sh.cfg
    }

    /// The size classes.
    pub fn classes(&self) -> &SizeClasses {
        &self.sh.classes
    }

    /// The key of the store's read-only region (one-sided reads use it).
    pub fn rkey(&self) -> u32 {
        self.sh.space.rkey
    }

    /// The store's accounting.
    pub fn accounting(&self) -> &Accounting {
        &self.sh.acct
    }

    /// A snapshot of the accounting.
    pub fn stats(&self) -> CormStats {
        self.sh.acct.snapshot()
    }

    /// Reads the raw bytes of `len` bytes at remote offset `off` through
    /// the node's translation, word by word ascending: what a one-sided
    /// READ returns (for tests and for clients in the node's process).
    pub fn read_raw(&self, off: u64, len: usize) -> Vec<u8> {
        let mut v = vec![0; len.next_multiple_of(8)];
        self.sh.mem.read(off & !7, &mut v);
        v.truncate(len);
        v
    }

    /// A pointer to every live object, found in memory as a one-sided
    /// scanner finds it (each used virtual block read through the node's
    /// translation; an object is listed at the address of its home block),
    /// not from any worker's metadata. Exact on a quiescent store; while
    /// compaction moves objects it may miss or repeat one.
    ///
    /// For a node's operator (and tests): an object whose Alloc reply its
    /// client never read is reachable only this way, and freed with the
    /// pointer returned here.
    pub fn live_pointers(&self) -> Vec<ObjPtr> {
        let sh = &self.sh;
        let bs = sh.block_size() as usize;
        let mut out = Vec::new();
        for vb in 0..sh.space.touched() {
            let d = sh.space.dir(vb);
            if !d.used {
                continue;
            }
            let home = sh.home_of(vb);
            let info = *sh.class(d.class);
            let s = info.slot_size as usize;
            let bytes = self.read_raw(sh.space.vb_offset(vb), bs);
            for k in 0..info.slots as usize {
                let h = ObjHeader(u64::from_ne_bytes(
                    bytes[k * s..k * s + 8].try_into().expect("8 bytes"),
                ));
                if h.used() && h.home() == home {
                    out.push(sh.pointer(vb, d.gen, d.class, h.id(), k as u32));
                }
            }
        }
        out
    }
}

/// Messages between workers.
#[derive(Debug)]
pub(crate) enum Msg {
    /// A request only the block's owner can serve.
    Owner {
        op: OwnerOp,
        reply_to: u8,
        token: u64,
        /// Forwards so far (a bound against stale forwarding entries).
        hops: u8,
    },
    /// The answer to an `Owner` request.
    Answer { token: u64, answer: Answer },
    /// Block collection (§3.1.4): send the leader your not-full blocks of
    /// these classes at most `max_fill` full.
    Collect {
        round: u64,
        leader: u8,
        classes: Vec<u8>,
        max_fill: f64,
    },
    /// The blocks, moving to the leader with their metadata.
    Collected { round: u64, blocks: Vec<Block> },
}

#[derive(Debug, Clone)]
pub(crate) enum OwnerOp {
    Free(ObjPtr),
    Release(ObjPtr),
    Locate(ObjPtr),
}

#[derive(Debug)]
pub(crate) enum Answer {
    Done(OpResult),
    /// Where the object is (its slot), or why not.
    Located(Result<u32, ObjError>),
}

#[derive(Debug, Clone, Copy)]
pub(crate) enum Origin {
    Local(Ticket),
    Peer { to: u8, token: u64 },
}

#[derive(Debug)]
enum Work {
    Alloc(u32),
    Free(ObjPtr),
    Read(ObjPtr),
    Write(ObjPtr, Vec<u8>),
    Release(ObjPtr),
    Compact(Option<Vec<u8>>),
    Locate(ObjPtr),
}

#[derive(Debug)]
pub(crate) struct Job {
    origin: Origin,
    work: Work,
    corrections: u32,
    /// An allocation that already waited for a compaction.
    compacted: bool,
    busy_since: Option<Instant>,
    /// Times a peer's request was forwarded before reaching this worker.
    hops: u8,
}

pub(crate) enum Step {
    Done(OpResult),
    /// Locate answered; how to continue.
    Located(Result<u32, ObjError>),
    /// Run again at once (the pointer was corrected).
    Again,
    /// Locked: run again at the next step.
    Retry,
    /// Waiting for a peer's answer.
    Wait(u64),
    /// Waiting for the running compaction.
    WaitCompaction,
    /// Handed on to another worker (which answers the origin).
    Forwarded,
}

/// Where a block's metadata is.
enum Route {
    Mine(u64),
    To(u8),
    Gone,
}

/// One worker: an allocator owning its blocks, serving operations.
#[derive(Debug)]
pub struct Worker {
    pub(crate) id: u8,
    pub(crate) sh: Arc<Shared>,
    pub(crate) blocks: BTreeMap<u64, Block>,
    /// Per class: (free slots, primary) of the blocks with a free slot.
    pub(crate) not_full: Vec<BTreeSet<(u32, u64)>>,
    /// Blocks given to a compaction leader: where to forward their requests.
    pub(crate) forward: HashMap<u64, u8>,
    inbox: Receiver<Msg>,
    peers: Vec<Sender<Msg>>,
    pub(crate) rng: Rng,
    next: u64,
    runnable: VecDeque<Job>,
    waiting: HashMap<u64, Job>,
    done: HashMap<Ticket, OpResult>,
    after_compaction: Vec<Job>,
    pub(crate) compaction: Option<Compaction>,
    /// Work done since the last [`Worker::take_work`].
    pub(crate) work: WorkDone,
}

/// What a worker did, for a transport that models the node's CPU time
/// (the simulator): counted by [`Worker::step`] and compaction, taken with
/// [`Worker::take_work`].
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct WorkDone {
    /// Messages from peers served.
    pub messages: u64,
    /// Blocks merged by compaction.
    pub merges: u64,
    /// Translation pages remapped by those merges.
    pub pages_remapped: u64,
    /// Object bytes copied by those merges.
    pub bytes_copied: u64,
}

impl Worker {
    fn new(
        id: u8,
        sh: Arc<Shared>,
        inbox: Receiver<Msg>,
        peers: Vec<Sender<Msg>>,
        seed: u64,
    ) -> Self {
        Worker {
            not_full: vec![BTreeSet::new(); sh.classes.len()],
            id,
            sh,
            blocks: BTreeMap::new(),
            forward: HashMap::new(),
            inbox,
            peers,
            rng: Rng::new(seed),
            next: 0,
            runnable: VecDeque::new(),
            waiting: HashMap::new(),
            done: HashMap::new(),
            after_compaction: Vec::new(),
            compaction: None,
            work: WorkDone::default(),
        }
    }

    /// This worker's index.
    pub fn id(&self) -> u8 {
        self.id
    }

    /// The store this worker serves.
    pub fn store(&self) -> Store {
        Store {
            sh: self.sh.clone(),
        }
    }

    /// Blocks this worker owns.
    pub fn blocks(&self) -> usize {
        self.blocks.len()
    }

    /// Starts an operation; its result is ready now or after later steps
    /// ([`Worker::take`]).
    pub fn start(&mut self, op: Op) -> Ticket {
        let t = self.token();
        let work = match op {
            Op::Alloc(n) => Work::Alloc(n),
            Op::Free(p) => Work::Free(p),
            Op::Read(p) => Work::Read(p),
            Op::Write(p, d) => Work::Write(p, d),
            Op::ReleasePtr(p) => Work::Release(p),
            Op::Compact(c) => Work::Compact(c),
        };
        self.run_job(Job {
            origin: Origin::Local(t),
            work,
            corrections: 0,
            compacted: false,
            busy_since: None,
            hops: 0,
        });
        t
    }

    /// The result of operation `t`, once it finished.
    pub fn take(&mut self, t: Ticket) -> Option<OpResult> {
        self.done.remove(&t)
    }

    /// Serves peers' messages, advances a compaction this worker leads and
    /// re-runs parked operations. Never blocks. Returns whether anything
    /// happened (a message, a merge, an operation finished).
    pub fn step(&mut self) -> bool {
        let mut progress = false;
        while let Ok(m) = self.inbox.try_recv() {
            self.sh.in_flight.fetch_sub(1, Ordering::AcqRel);
            self.work.messages += 1;
            self.handle(m);
            progress = true;
        }
        if self.compaction.is_some() {
            progress |= self.compaction_step();
        }
        if !self.after_compaction.is_empty() && !self.sh.compacting.load(Ordering::Acquire) {
            self.runnable.extend(self.after_compaction.drain(..));
        }
        let before = self.done.len();
        for _ in 0..self.runnable.len() {
            let job = self.runnable.pop_front().expect("counted");
            self.run_job(job);
        }
        progress || self.done.len() != before
    }

    /// What this worker did since the last call (messages served,
    /// compaction's merges, remaps and copies), for a transport that models
    /// the node's CPU time.
    pub fn take_work(&mut self) -> WorkDone {
        std::mem::take(&mut self.work)
    }

    /// Runs `op` to completion on this thread, stepping this worker while
    /// it waits (other workers must be stepped by their own threads).
    pub fn call(&mut self, op: Op) -> OpResult {
        let t = self.start(op);
        loop {
            if let Some(r) = self.take(t) {
                return r;
            }
            if !self.step() {
                std::thread::yield_now();
            }
        }
    }

    /// Whether this worker has nothing in progress: no parked operation and
    /// no compaction it leads.
    pub fn idle(&self) -> bool {
        self.runnable.is_empty()
            && self.waiting.is_empty()
            && self.after_compaction.is_empty()
            && self.compaction.is_none()
    }

    fn token(&mut self) -> u64 {
        self.next += 1;
        self.next
    }

    pub(crate) fn send(&self, to: u8, m: Msg) {
        self.sh.in_flight.fetch_add(1, Ordering::AcqRel);
        // A worker that is gone (dropped) cannot answer: the store is being
        // torn down, and its operations with it.
        if self.peers[to as usize].send(m).is_err() {
            self.sh.in_flight.fetch_sub(1, Ordering::AcqRel);
        }
    }

    fn handle(&mut self, m: Msg) {
        match m {
            Msg::Owner {
                op,
                reply_to,
                token,
                hops,
            } => {
                let work = match op {
                    OwnerOp::Free(p) => Work::Free(p),
                    OwnerOp::Release(p) => Work::Release(p),
                    OwnerOp::Locate(p) => Work::Locate(p),
                };
                self.run_job(Job {
                    origin: Origin::Peer {
                        to: reply_to,
                        token,
                    },
                    work,
                    corrections: 0,
                    compacted: false,
                    busy_since: None,
                    hops,
                });
            }
            Msg::Answer { token, answer } => {
                let Some(mut job) = self.waiting.remove(&token) else {
                    return;
                };
                match answer {
                    Answer::Done(r) => self.complete(job.origin, r),
                    Answer::Located(Ok(slot)) => {
                        job.relocate(&self.sh, slot);
                        self.run_job(job);
                    }
                    Answer::Located(Err(e)) => self.complete(job.origin, Err(e)),
                }
            }
            Msg::Collect {
                round,
                leader,
                classes,
                max_fill,
            } => self.give_blocks(round, leader, &classes, max_fill),
            Msg::Collected { round, blocks } => self.absorb(round, blocks),
        }
    }

    fn run_job(&mut self, mut job: Job) {
        loop {
            let w = std::mem::replace(&mut job.work, Work::Alloc(0));
            let (step, w) = self.run(&mut job, w);
            job.work = w;
            match step {
                Step::Again => continue,
                Step::Done(r) => return self.complete(job.origin, r),
                Step::Located(r) => return self.answer(job.origin, Answer::Located(r)),
                Step::Retry => {
                    let since = *job.busy_since.get_or_insert_with(Instant::now);
                    if since.elapsed() > BUSY_TIMEOUT {
                        return self.complete(job.origin, Err(ObjError::Busy));
                    }
                    return self.runnable.push_back(job);
                }
                Step::Wait(token) => {
                    self.waiting.insert(token, job);
                    return;
                }
                Step::WaitCompaction => return self.after_compaction.push(job),
                Step::Forwarded => return,
            }
        }
    }

    pub(crate) fn complete(&mut self, origin: Origin, r: OpResult) {
        if r.is_err() {
            self.sh.acct.ev.errors.fetch_add(1, Ordering::Relaxed);
        }
        match origin {
            Origin::Local(t) => {
                self.done.insert(t, r);
            }
            Origin::Peer { .. } => self.answer(origin, Answer::Done(r)),
        }
    }

    fn answer(&mut self, origin: Origin, a: Answer) {
        match origin {
            Origin::Peer { to, token } => self.send(to, Msg::Answer { token, answer: a }),
            Origin::Local(t) => {
                // Locate is only ever a peer's request.
                let r = match a {
                    Answer::Done(r) => r,
                    Answer::Located(_) => Err(ObjError::Forged("internal request".into())),
                };
                self.done.insert(t, r);
            }
        }
    }

    /// One attempt at a job's work; returns the outcome and the work
    /// (possibly with a corrected pointer).
    fn run(&mut self, job: &mut Job, w: Work) -> (Step, Work) {
        match w {
            Work::Alloc(n) => (self.alloc(n, job), w),
            Work::Read(p) => {
                let (s, p) = self.access(job, p, None);
                (s, Work::Read(p))
            }
            Work::Write(p, d) => {
                let (s, p) = self.access(job, p, Some(&d));
                (s, Work::Write(p, d))
            }
            Work::Free(p) => (self.owner_op(job, OwnerOp::Free(p)), w),
            Work::Release(p) => (self.owner_op(job, OwnerOp::Release(p)), w),
            Work::Locate(p) => (self.owner_op(job, OwnerOp::Locate(p)), w),
            Work::Compact(c) => (self.compact_op(job, c.clone()), Work::Compact(c)),
        }
    }

    // ---------------------------------------------------------------- alloc

    fn alloc(&mut self, len: u32, job: &mut Job) -> Step {
        let sh = self.sh.clone();
        if len == 0 {
            return Step::Done(Err(ObjError::ZeroSize));
        }
        let Some(c) = sh.classes.for_payload(len) else {
            return Step::Done(Err(ObjError::TooLarge {
                len: len as u64,
                max: sh.classes.max_payload() as u64,
            }));
        };
        // The fullest block with room (CoRM allocates there first).
        let primary = match self.not_full[c as usize].first() {
            Some(&(_, p)) => p,
            None => match self.new_block(c) {
                Ok(p) => p,
                Err(ObjError::OutOfMemory { .. })
                    if sh.cfg.policy.on_alloc_failure && !job.compacted =>
                {
                    job.compacted = true;
                    let all: Vec<u8> = (0..sh.classes.len() as u8).collect();
                    self.start_compaction(all, Trigger::AllocFailure, None);
                    return Step::WaitCompaction;
                }
                Err(e) => return Step::Done(Err(e)),
            },
        };
        let b = self.blocks.get_mut(&primary).expect("listed blocks exist");
        self.not_full[c as usize].remove(&(b.free_slots(), primary));
        let (id, slot) = b.alloc(&mut self.rng, len);
        if !b.is_full() {
            self.not_full[c as usize].insert((b.free_slots(), primary));
        }
        let off = sh.slot_offset(primary, c, slot);
        let old = ObjHeader(sh.mem.load(off).unwrap_or(0));
        let h = ObjHeader::new(
            super::layout::next_version(old.version()),
            id,
            sh.home_of(primary),
        );
        let mut img = vec![0u8; sh.class(c).slot_size as usize];
        encode(&mut img, h, &[]);
        sh.mem.write_body_descending(off, &img);
        sh.mem.store(off, h.0);
        sh.acct.object_added(c, len);
        sh.acct.ev.allocs.fetch_add(1, Ordering::Relaxed);
        let gen = sh.space.dir(primary).gen;
        Step::Done(Ok(Reply::Allocated(sh.pointer(primary, gen, c, id, slot))))
    }

    fn new_block(&mut self, c: u8) -> Result<u64, ObjError> {
        let (vb, _gen) = self.sh.space.new_block(c, self.id)?;
        let info = *self.sh.class(c);
        let b = Block::new(vb, c, self.sh.policies[c as usize].id, info.slots);
        self.not_full[c as usize].insert((b.free_slots(), vb));
        self.blocks.insert(vb, b);
        self.sh.acct.block_added(c);
        self.sh.acct.vblocks_used.fetch_add(1, Ordering::Relaxed);
        Ok(vb)
    }

    // ------------------------------------------------------- read and write

    /// Reads (`data = None`) or writes the object `p` names, correcting the
    /// pointer if it is indirect.
    fn access(&mut self, job: &mut Job, p: ObjPtr, data: Option<&[u8]>) -> (Step, ObjPtr) {
        let sh = self.sh.clone();
        let (vb, slot) = match sh.validate(&p) {
            Ok(x) => x,
            Err(e) => return (Step::Done(Err(e)), p),
        };
        let c = p.class();
        let info = *sh.class(c);
        if let Some(d) = data {
            if d.len() > info.capacity as usize {
                return (
                    Step::Done(Err(ObjError::TooLarge {
                        len: d.len() as u64,
                        max: info.capacity as u64,
                    })),
                    p,
                );
            }
        }
        let off = sh.slot_offset(vb, c, slot);
        let e = p.expect(sh.block_size());
        let got = match data {
            None => self.read_at(off, info.slot_size as usize, e).map(|data| {
                sh.acct.ev.reads.fetch_add(1, Ordering::Relaxed);
                Reply::Read { ptr: p, data }
            }),
            Some(d) => self.write_at(off, info.slot_size as usize, e, d).map(|()| {
                sh.acct.ev.writes.fetch_add(1, Ordering::Relaxed);
                Reply::Written(p)
            }),
        };
        match got {
            Ok(r) => (Step::Done(Ok(r)), p),
            Err(ReadFault::Locked) | Err(ReadFault::Torn) => (Step::Retry, p),
            Err(ReadFault::WrongObject) => {
                if job.corrections >= MAX_CORRECTIONS {
                    return (Step::Done(Err(ObjError::Busy)), p);
                }
                job.corrections += 1;
                self.correct(p, vb)
            }
        }
    }

    /// Reads the slot at `off` and checks it as a one-sided reader does.
    fn read_at(&self, off: u64, slot: usize, e: Expect) -> Result<Vec<u8>, ReadFault> {
        let mut buf = vec![0u8; slot];
        let mut fault = ReadFault::Torn;
        for _ in 0..TORN_RETRIES {
            self.sh.mem.read(off, &mut buf);
            match decode(&buf, e) {
                Ok(d) => return Ok(d),
                Err(ReadFault::Torn) => fault = ReadFault::Torn,
                Err(f) => return Err(f),
            }
        }
        Err(fault)
    }

    /// Locks the object at `off` for writing, writes `data` with the next
    /// version in every segment (descending), unlocks.
    fn write_at(&self, off: u64, slot: usize, e: Expect, data: &[u8]) -> Result<(), ReadFault> {
        let mem = &self.sh.mem;
        let h = ObjHeader(mem.load(off).unwrap_or(0));
        if !h.is(e) {
            return Err(ReadFault::WrongObject);
        }
        if h.locked() {
            return Err(ReadFault::Locked);
        }
        if mem.cas(off, h.0, h.with_lock(LOCK_WRITE).0).is_err() {
            return Err(ReadFault::Locked);
        }
        let new = h.bumped();
        let mut img = vec![0u8; slot];
        encode(&mut img, new, data);
        mem.write_body_descending(off, &img);
        mem.store(off, new.0);
        Ok(())
    }

    /// Finds the object an indirect pointer names (§3.2.1): by scanning its
    /// block, or by asking the block's owner.
    fn correct(&mut self, p: ObjPtr, vb: u64) -> (Step, ObjPtr) {
        let sh = self.sh.clone();
        match sh.cfg.correction {
            Correction::Scan => {
                sh.acct.ev.corrections_scan.fetch_add(1, Ordering::Relaxed);
                match self.scan(&p, vb) {
                    Scan::Found(slot) => (Step::Again, relocated(&sh, p, slot)),
                    Scan::Moving => (Step::Retry, p),
                    Scan::Released => (Step::Done(Err(ObjError::Released)), p),
                    Scan::Absent => (Step::Done(Err(ObjError::Freed)), p),
                }
            }
            Correction::Message => {
                sh.acct
                    .ev
                    .corrections_message
                    .fetch_add(1, Ordering::Relaxed);
                match self.route(vb) {
                    Route::Mine(b) => match self.locate(b, &p, vb) {
                        Ok(slot) => (Step::Again, relocated(&sh, p, slot)),
                        Err(e) => (Step::Done(Err(e)), p),
                    },
                    Route::To(w) => {
                        let token = self.token();
                        self.send(
                            w,
                            Msg::Owner {
                                op: OwnerOp::Locate(p),
                                reply_to: self.id,
                                token,
                                hops: 0,
                            },
                        );
                        (Step::Wait(token), p)
                    }
                    Route::Gone => (Step::Done(Err(ObjError::Stale)), p),
                }
            }
        }
    }

    /// Scans the memory behind `vb` for the object `p` names; the block's
    /// move sequence must be even and unchanged around the scan.
    fn scan(&self, p: &ObjPtr, vb: u64) -> Scan {
        let sh = &self.sh;
        let d1 = sh.space.dir(vb);
        if !d1.seq.is_multiple_of(2) {
            return Scan::Moving;
        }
        let bs = sh.block_size();
        let mut bytes = vec![0u8; bs as usize];
        sh.mem.read(sh.space.vb_offset(vb), &mut bytes);
        let d2 = sh.space.dir(vb);
        if d2.seq != d1.seq || !d2.used {
            return Scan::Moving;
        }
        let s = sh.class(p.class()).slot_size as usize;
        let e = p.expect(bs);
        let mut released = false;
        for k in 0..bytes.len() / s {
            let h = ObjHeader(u64::from_ne_bytes(
                bytes[k * s..k * s + 8].try_into().expect("8 bytes"),
            ));
            if h.used() && h.id() == e.id {
                if h.home() == e.home {
                    return Scan::Found(k as u32);
                }
                released = true;
            }
        }
        if released {
            Scan::Released
        } else {
            Scan::Absent
        }
    }

    /// Where the owner's metadata puts object `p` (homed at `vb`) of
    /// block `b`.
    fn locate(&self, b: u64, p: &ObjPtr, vb: u64) -> Result<u32, ObjError> {
        let blk = &self.blocks[&b];
        match blk.objects.get(&p.id()) {
            Some(o) if o.home == vb => Ok(o.slot),
            Some(_) => Err(ObjError::Released),
            None => Err(ObjError::Freed),
        }
    }

    // --------------------------------------------- operations of the owner

    fn route(&self, vb: u64) -> Route {
        let d = self.sh.space.dir(vb);
        if d.used && self.blocks.contains_key(&d.block) {
            return Route::Mine(d.block);
        }
        if let Some(&w) = self.forward.get(&d.block) {
            return Route::To(w);
        }
        if d.used && d.owner != self.id {
            return Route::To(d.owner);
        }
        Route::Gone
    }

    /// Free, release and locate: served by the block's owner, forwarded to
    /// it otherwise.
    fn owner_op(&mut self, job: &mut Job, op: OwnerOp) -> Step {
        let (OwnerOp::Free(p) | OwnerOp::Release(p) | OwnerOp::Locate(p)) = &op;
        let p = *p;
        let vb = match self.sh.validate(&p) {
            Ok((vb, _)) => vb,
            Err(e) if matches!(op, OwnerOp::Locate(_)) => return Step::Located(Err(e)),
            Err(e) => return Step::Done(Err(e)),
        };
        match self.route(vb) {
            Route::Mine(b) => match op {
                OwnerOp::Free(_) => self.free_local(b, &p, vb),
                OwnerOp::Release(_) => self.release_local(b, &p, vb),
                OwnerOp::Locate(_) => Step::Located(self.locate(b, &p, vb)),
            },
            Route::Gone if matches!(op, OwnerOp::Locate(_)) => Step::Located(Err(ObjError::Stale)),
            Route::Gone => Step::Done(Err(ObjError::Stale)),
            Route::To(w) => match job.origin {
                // A peer's request: hand it on, the new owner answers.
                Origin::Peer { to, token } => {
                    // Stale forwarding entries could bounce a request
                    // between workers; the block is gone by then.
                    if job.hops as usize > (2 * self.peers.len() + 2).min(250) {
                        return match op {
                            OwnerOp::Locate(_) => Step::Located(Err(ObjError::Stale)),
                            _ => Step::Done(Err(ObjError::Stale)),
                        };
                    }
                    self.send(
                        w,
                        Msg::Owner {
                            op,
                            reply_to: to,
                            token,
                            hops: job.hops.saturating_add(1),
                        },
                    );
                    Step::Forwarded
                }
                Origin::Local(_) => {
                    let token = self.token();
                    self.send(
                        w,
                        Msg::Owner {
                            op,
                            reply_to: self.id,
                            token,
                            hops: 0,
                        },
                    );
                    Step::Wait(token)
                }
            },
        }
    }

    /// The owner's object `p` in block `b`: its metadata and header
    /// offset (through the block's primary), or why not.
    fn owned_object(&self, b: u64, p: &ObjPtr, vb: u64) -> Result<(Obj, u64), ObjError> {
        let blk = &self.blocks[&b];
        let o = *blk.objects.get(&p.id()).ok_or(ObjError::Freed)?;
        if o.home != vb {
            return Err(ObjError::Released);
        }
        Ok((o, self.sh.slot_offset(b, blk.class, o.slot)))
    }

    /// Swaps the object's header at `off` from `h` (unlocked, as the
    /// metadata says) to `new`. `Err(Retry)` while it is locked.
    fn swap_header(&self, off: u64, new: impl Fn(ObjHeader) -> ObjHeader) -> Result<(), Step> {
        // The metadata is the truth; memory that disagrees was overwritten
        // behind the store's back (the checker reports it) and is replaced.
        let h = ObjHeader(self.sh.mem.load(off).unwrap_or(0));
        if h.locked() {
            return Err(Step::Retry);
        }
        self.sh
            .mem
            .cas(off, h.0, new(h).0)
            .map(|_| ())
            .map_err(|_| Step::Retry)
    }

    fn free_local(&mut self, b: u64, p: &ObjPtr, vb: u64) -> Step {
        let (_, off) = match self.owned_object(b, p, vb) {
            Ok(x) => x,
            Err(e) => return Step::Done(Err(e)),
        };
        if let Err(s) = self.swap_header(off, |h| ObjHeader::free(h.version())) {
            return s;
        }
        let blk = self.blocks.get_mut(&b).expect("owned");
        let c = blk.class;
        let free_before = blk.free_slots();
        let (o, left) = blk.remove(p.id()).expect("looked up");
        let empty = blk.count() == 0;
        self.not_full[c as usize].remove(&(free_before, b));
        if empty {
            self.drop_block(b);
        } else {
            self.not_full[c as usize].insert((free_before + 1, b));
            if left == 0 && o.home != b {
                self.release_vb(b, o.home);
            }
        }
        self.sh.acct.object_removed(c, o.len);
        self.sh.acct.ev.frees.fetch_add(1, Ordering::Relaxed);
        self.maybe_trigger(c);
        Step::Done(Ok(Reply::Freed))
    }

    fn release_local(&mut self, b: u64, p: &ObjPtr, vb: u64) -> Step {
        let sh = self.sh.clone();
        let (o, off) = match self.owned_object(b, p, vb) {
            Ok(x) => x,
            Err(e) => return Step::Done(Err(e)),
        };
        let c = p.class();
        if vb != b {
            let home = sh.home_of(b);
            if let Err(s) = self.swap_header(off, |h| h.with_home(home)) {
                return s;
            }
            let left = self.blocks.get_mut(&b).expect("owned").rehome(p.id());
            if left == 0 {
                self.release_vb(b, vb);
            }
        }
        sh.acct.ev.releases.fetch_add(1, Ordering::Relaxed);
        let gen = sh.space.dir(b).gen;
        Step::Done(Ok(Reply::Released(sh.pointer(b, gen, c, p.id(), o.slot))))
    }

    /// Releases virtual block `vb`, merged into block `b` and no longer
    /// home to any object (§3.3).
    pub(crate) fn release_vb(&mut self, b: u64, vb: u64) {
        debug_assert_ne!(b, vb, "a block's primary goes with the block");
        let blk = self.blocks.get_mut(&b).expect("owned");
        let n = blk.vbs.remove(&vb);
        debug_assert_eq!(n, Some(0));
        self.sh.space.release(vb);
        self.sh.acct.vblocks_used.fetch_sub(1, Ordering::Relaxed);
        self.sh
            .acct
            .ev
            .vaddrs_released
            .fetch_add(1, Ordering::Relaxed);
    }

    /// Frees an empty block: its addresses (unmapped first), then its memory.
    fn drop_block(&mut self, b: u64) {
        let blk = self.blocks.remove(&b).expect("owned");
        debug_assert_eq!(blk.count(), 0);
        self.not_full[blk.class as usize].remove(&(blk.free_slots(), b));
        for &vb in blk.vbs.keys() {
            self.sh.space.release(vb);
            self.sh.acct.vblocks_used.fetch_sub(1, Ordering::Relaxed);
            if vb != b {
                self.sh
                    .acct
                    .ev
                    .vaddrs_released
                    .fetch_add(1, Ordering::Relaxed);
            }
        }
        self.sh.space.free_frame(b);
        self.sh.acct.block_removed(blk.class);
    }
}

enum Scan {
    Found(u32),
    Moving,
    Released,
    Absent,
}

fn relocated(sh: &Shared, p: ObjPtr, slot: u32) -> ObjPtr {
    let s = sh.class(p.class()).slot_size as u64;
    p.with_offset_hint(sh.block_size(), slot as u64 * s)
}

impl Job {
    /// Who waits for this job's result.
    pub(crate) fn origin(&self) -> Origin {
        self.origin
    }

    /// Applies a located slot to a read or write job's pointer.
    fn relocate(&mut self, sh: &Shared, slot: u32) {
        match &mut self.work {
            Work::Read(p) | Work::Write(p, _) => *p = relocated(sh, *p, slot),
            _ => {}
        }
    }
}
