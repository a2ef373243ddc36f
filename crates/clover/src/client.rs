//! The per-worker client: the operations, each named by its round trips.

use std::cell::RefCell;
use std::rc::Rc;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};

use dmkit_fabric::GlobalAddr;
use dmkit_index::{ClientStats, Entries, IndexError, MapClient, Retry};
use dmkit_runtime::{Ctx, Local, LocalLayout, Nanos};

use crate::hint::{Hint, HintCache, KeyHash};
use crate::layout::*;
use crate::store::{CloverConfig, CloverKv, PROBE_WINDOW};

/// The task-local memory of the store's operations, declared once per
/// store.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Scratch {
    /// A version read (header and the longest key and value).
    ver: Local,
    /// The version being written.
    new: Local,
    /// A window of directory entries.
    dir: Local,
    /// A word (a directory entry's shortcut).
    word: Local,
    /// The shortcut a writer records (left alone until its WRITE lands).
    shortcut: Local,
    /// The pool's header and claimed slots.
    pool_head: Local,
    pool_slots: Local,
}

impl Scratch {
    pub(crate) fn declare(cfg: &CloverConfig) -> (Self, LocalLayout) {
        let mut l = LocalLayout::new();
        let s = Scratch {
            ver: l.region("version", cfg.read_bytes()),
            new: l.region("new version", cfg.block_bytes()),
            dir: l.region("directory window", (PROBE_WINDOW * DIR_ENTRY) as usize),
            word: l.region("word", 8),
            shortcut: l.region("shortcut", 8),
            pool_head: l.region("pool header", 16),
            pool_slots: l.region("pool slots", 8 * cfg.alloc_batch as usize),
        };
        (s, l)
    }
}

/// What a client counted (beyond the runtime's statistics).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct CloverCounters {
    /// Searches answered by their first READ (the hint, or the directory's
    /// start, was the tail).
    pub reads_first_try: u64,
    /// Searches.
    pub reads: u64,
    /// Writes (insert, update, delete) whose first CAS succeeded.
    pub writes_first_try: u64,
    /// Writes.
    pub writes: u64,
    /// Versions this client linked into a chain (a new key's first
    /// version included).
    pub appends: u64,
    /// Extra READs along a chain (a stale hint or a lost race).
    pub hops: u64,
    /// Jumps to a key's shortcut (read with a walk's first READ, or after
    /// `chase_limit` hops).
    pub shortcut_jumps: u64,
    /// Directory lookups (no fresh hint, or a walk that had to start over).
    pub lookups: u64,
    /// READs answered by a version other than the one asked for (the
    /// switch steered them).
    pub steered_reads: u64,
    /// Versions read that were not the key's (a stale address): the walk
    /// started over from the directory.
    pub restarts: u64,
    /// Blocks claimed from the metadata server's pool.
    pub pool_blocks: u64,
    /// Chunks taken from the memory node for versions.
    pub chunks: u64,
    /// CASes writes posted (on a chain's tail, or a directory entry).
    pub write_cas: u64,
    /// Of those, the ones that failed (another writer was first, or the
    /// key's state was not the operation's).
    pub write_cas_failed: u64,
    /// READs writes posted (directory lookups, walks, shortcuts).
    pub write_reads: u64,
    /// READs searches posted.
    pub search_reads: u64,
    /// Time in writes (ns of the client's clock; the breakdown below).
    pub write_ns: u64,
    /// Of it, waiting for the round trips that carried a CAS (WRITE ∥
    /// CAS, or a retried CAS).
    pub write_cas_ns: u64,
    /// Waiting for walks to the real tail after a lost CAS.
    pub write_walk_ns: u64,
    /// Looking the key up in the directory (no fresh hint, or a stale
    /// one).
    pub write_lookup_ns: u64,
    /// Claiming blocks (from the pool, or a chunk from the memory node).
    pub write_alloc_ns: u64,
    /// Time in searches.
    pub search_ns: u64,
}

/// `$f` for every field of [`CloverCounters`].
macro_rules! each_counter {
    ($m:ident) => {
        $m!(
            reads_first_try,
            reads,
            writes_first_try,
            writes,
            appends,
            hops,
            shortcut_jumps,
            lookups,
            steered_reads,
            restarts,
            pool_blocks,
            chunks,
            write_cas,
            write_cas_failed,
            write_reads,
            search_reads,
            write_ns,
            write_cas_ns,
            write_walk_ns,
            write_lookup_ns,
            write_alloc_ns,
            search_ns
        )
    };
}

impl CloverCounters {
    /// Adds `o` to these counters.
    pub fn add(&mut self, o: &CloverCounters) {
        macro_rules! add {
            ($($f:ident),*) => {{
                // (Destructured: a new field that is not listed fails to
                // compile.)
                let CloverCounters { $($f),* } = *o;
                $(self.$f += $f;)*
            }};
        }
        each_counter!(add)
    }

    /// What was counted since `before` (an earlier copy).
    pub fn since(&self, before: &CloverCounters) -> CloverCounters {
        macro_rules! sub {
            ($($f:ident),*) => {{
                let CloverCounters { $($f),* } = *self;
                CloverCounters { $($f: $f - before.$f),* }
            }};
        }
        each_counter!(sub)
    }
}

/// A client's hints: its own cache, or its compute machine's, shared by
/// the machine's workers (`CloverConfig::shared_hints`).
pub(crate) enum Hints {
    Own(HintCache),
    Machine(Arc<Mutex<HintCache>>),
}

impl Hints {
    fn with<R>(&mut self, f: impl FnOnce(&mut HintCache) -> R) -> R {
        match self {
            Hints::Own(c) => f(c),
            Hints::Machine(m) => f(&mut m.lock().unwrap_or_else(|p| p.into_inner())),
        }
    }
}

/// One worker's state: its hints, its blocks, its counters.
pub(crate) struct ClientState {
    hints: Hints,
    /// Blocks never linked, reusable at once.
    free: Vec<GlobalAddr>,
    /// Blocks claimed from the pool.
    claimed: Vec<GlobalAddr>,
    /// The current chunk's unused range: (next, end).
    bump: Option<(GlobalAddr, u64)>,
    /// writer id (24 bits) in place; counter below.
    birth: u64,
    counters: CloverCounters,
    /// Image buffer.
    buf: Vec<u8>,
    /// The counters of the operations that started at or after the store's
    /// `phases_from` and completed (the store sums every client's).
    window: Arc<Mutex<CloverCounters>>,
    /// READs posted by the operations (split into searches' and writes'
    /// by the operation).
    posted_reads: u64,
}

impl ClientState {
    pub(crate) fn new(
        _cfg: &CloverConfig,
        id: u64,
        hints: Hints,
        window: Arc<Mutex<CloverCounters>>,
    ) -> Self {
        let writer = dmkit_runtime::hash::fmix64(id ^ 0xB1_87) & 0xFF_FFFF;
        Self {
            hints,
            free: Vec::new(),
            claimed: Vec::new(),
            bump: None,
            birth: writer << 40,
            counters: CloverCounters::default(),
            buf: Vec::new(),
            window,
            posted_reads: 0,
        }
    }
}

/// Where a walk starts: a version of key `key_id` the client learnt of at
/// `learned`.
#[derive(Debug, Clone, Copy)]
struct Start {
    key_id: u64,
    at: GlobalAddr,
    learned: Nanos,
}

/// The tail a walk reached.
#[derive(Debug)]
struct Tail {
    start: Start,
    kind: Kind,
    value: Vec<u8>,
}

/// What a walk ended with.
enum Walk {
    Tail(Tail),
    /// The start was stale (too old to use, or not the key's version any
    /// more): look the key up in the directory.
    Restart,
}

/// What a directory lookup found.
enum Lookup {
    /// The key's chain, and the version the entry names (read to confirm
    /// the key, at the start's `learned`).
    Found(Start, Version),
    /// Absent; entry `slot` is the first free one on the key's probe path.
    Absent { slot: u64 },
}

/// What an attempt to create a key's chain did.
enum Create {
    Created,
    /// The entry was taken meanwhile (by this key or another).
    Taken,
}

/// A worker's handle on a store. Clone it into the worker's tasks; not
/// `Send` (one per worker).
#[derive(Clone)]
pub struct CloverClient {
    kv: Arc<CloverKv>,
    st: Rc<RefCell<ClientState>>,
}

impl CloverClient {
    pub(crate) fn new(kv: Arc<CloverKv>, st: ClientState) -> Self {
        Self {
            kv,
            st: Rc::new(RefCell::new(st)),
        }
    }

    /// The store.
    pub fn store(&self) -> &Arc<CloverKv> {
        &self.kv
    }

    /// This client's counters.
    pub fn counters(&self) -> CloverCounters {
        self.st.borrow().counters
    }

    /// Hints the client holds (at most its cache's capacity; its
    /// machine's with `shared_hints`).
    pub fn hints(&self) -> usize {
        self.st.borrow_mut().hints.with(|c| c.len())
    }

    fn cfg(&self) -> &CloverConfig {
        &self.kv.cfg
    }

    fn sc(&self) -> &Scratch {
        &self.kv.scratch
    }

    fn count(&self, f: impl FnOnce(&mut CloverCounters)) {
        f(&mut self.st.borrow_mut().counters)
    }

    fn posted_reads(&self, n: u64) {
        self.st.borrow_mut().posted_reads += n;
    }

    fn reads_so_far(&self) -> u64 {
        self.st.borrow().posted_reads
    }

    /// The start of an operation: its instant and the counters so far.
    fn op_start(&self, ctx: &Ctx) -> (Nanos, u64, CloverCounters) {
        let st = self.st.borrow();
        (ctx.now(), st.posted_reads, st.counters)
    }

    /// The end of an operation begun at `start`: what it counted joins the
    /// window's counters if it began in the window.
    fn op_end(&self, start: Nanos, before: &CloverCounters) {
        if start >= self.kv.phases_from.load(Ordering::Relaxed) {
            let st = self.st.borrow();
            let op = st.counters.since(before);
            st.window.lock().unwrap_or_else(|p| p.into_inner()).add(&op);
        }
    }

    /// Awaits `f`, adding the time it took to the counter `field` picks.
    async fn timed<T>(
        &self,
        ctx: &Ctx,
        field: impl FnOnce(&mut CloverCounters) -> &mut u64,
        f: impl std::future::Future<Output = T>,
    ) -> T {
        let t0 = ctx.now();
        let r = f.await;
        let ns = ctx.now() - t0;
        self.count(|c| *field(c) += ns);
        r
    }

    fn retry(&self, op: &'static str) -> Retry {
        Retry::new(op, self.cfg().retry)
    }

    fn hash(&self, key: &[u8]) -> KeyHash {
        KeyHash::of(key, self.cfg().seed)
    }

    fn check_key(&self, ctx: &Ctx, key: &[u8]) -> Result<(), IndexError> {
        if key.is_empty() || key.len() > self.cfg().max_key {
            return Err(IndexError::KeyLength {
                len: key.len(),
                min: 1,
                max: self.cfg().max_key,
            });
        }
        dmkit_index::check_local(ctx, self.kv.local_layout_ref())
    }

    fn check_value(&self, value: &[u8]) -> Result<(), IndexError> {
        if value.len() > self.cfg().max_value {
            return Err(IndexError::ValueTooLarge {
                len: value.len(),
                max: self.cfg().max_value,
            });
        }
        Ok(())
    }

    /// Whether an address learnt at `learned` may still be dereferenced:
    /// less than half the grace period ago (see "Reclamation").
    fn fresh(&self, ctx: &Ctx, learned: Nanos) -> bool {
        ctx.now().saturating_sub(learned) < self.cfg().grace / 2
    }

    /// The fresh hint for `h`, if any.
    fn hint(&self, ctx: &Ctx, h: &KeyHash) -> Option<Start> {
        let hint = self.st.borrow_mut().hints.with(|c| c.get(h))?;
        self.fresh(ctx, hint.learned).then_some(Start {
            key_id: hint.key_id,
            at: hint.at,
            learned: hint.learned,
        })
    }

    fn remember(&self, h: &KeyHash, s: Start, kind: Kind) {
        let hint = Hint {
            key_id: s.key_id,
            at: s.at,
            kind,
            learned: s.learned,
        };
        self.st.borrow_mut().hints.with(|c| c.put(h, hint));
    }

    fn forget(&self, h: &KeyHash) {
        self.st.borrow_mut().hints.with(|c| c.drop_hint(h));
    }

    /// The version in `ver`, decoded and checked.
    fn decode(&self, ctx: &Ctx) -> Option<Version> {
        let mut st = self.st.borrow_mut();
        let mut buf = std::mem::take(&mut st.buf);
        buf.resize(self.sc().ver.len(), 0);
        ctx.get_local(self.sc().ver, &mut buf);
        let v = Version::decode(&buf);
        st.buf = buf;
        v
    }

    /// Directory lookup: READ the key's probe window, then the version
    /// each matching fingerprint names — two round trips (more only past a
    /// full window).
    async fn find(&self, ctx: &Ctx, key: &[u8], h: &KeyHash) -> Result<Lookup, IndexError> {
        self.count(|c| c.lookups += 1);
        let slots = self.cfg().dir_slots;
        let first = h.h1 & (slots - 1);
        let mut probed = 0;
        while probed < slots {
            let from = (first + probed) & (slots - 1);
            let n = PROBE_WINDOW.min(slots - from);
            // (Addresses read from the window are learnt now.)
            let t = ctx.now();
            ctx.read(
                self.kv.entry(from)?,
                self.sc().dir.prefix((n * DIR_ENTRY) as usize),
            );
            self.posted_reads(1);
            ctx.sync().await?;
            let entries: Vec<DirEntry> = (0..n)
                .map(|i| {
                    ctx.get_as(
                        self.sc()
                            .dir
                            .slice((i * DIR_ENTRY) as usize, DIR_ENTRY as usize),
                    )
                })
                .collect();
            for (i, e) in entries.iter().enumerate() {
                let slot = from + i as u64;
                if !e.used() {
                    return Ok(Lookup::Absent { slot });
                }
                if e.fp() != h.fp() {
                    continue;
                }
                // Confirm the key with the version the entry names.
                let (at, t) = self.entry_start(ctx, e, t);
                ctx.read(self.kv.remote(at)?, self.sc().ver);
                self.posted_reads(1);
                ctx.sync().await?;
                if !self.fresh(ctx, t) {
                    // Descheduled too long: the lookup starts over.
                    return Box::pin(self.find(ctx, key, h)).await;
                }
                if let Some(v) = self.decode(ctx) {
                    if v.key_id == slot && v.key == key {
                        let s = Start {
                            key_id: slot,
                            at,
                            learned: t,
                        };
                        return Ok(Lookup::Found(s, v));
                    }
                }
            }
            probed += n;
        }
        Err(IndexError::Full {
            kind: crate::store::KIND,
            why: format!("all {slots} directory entries are taken"),
        })
    }

    /// Where a reader starts in directory entry `e` read at `t`: the
    /// shortcut while its stamp is fresh (learnt at the stamp), else the
    /// head (learnt at `t`).
    fn entry_start(&self, ctx: &Ctx, e: &DirEntry, t: Nanos) -> (GlobalAddr, Nanos) {
        match decode_shortcut(e.shortcut, self.kv.home.home(), ctx.now()) {
            Some((at, stamp)) if self.fresh(ctx, stamp) => (at, stamp),
            _ => (e.head_addr(), t),
        }
    }

    /// Reads key `key_id`'s shortcut (one round trip): the version it
    /// names and its stamp, if it is set and fresh.
    async fn shortcut(
        &self,
        ctx: &Ctx,
        key_id: u64,
    ) -> Result<Option<(GlobalAddr, Nanos)>, IndexError> {
        ctx.read(self.kv.entry(key_id)?.add(DIR_SHORTCUT), self.sc().word);
        self.posted_reads(1);
        ctx.sync().await?;
        let w = ctx.local_u64(self.sc().word);
        Ok(decode_shortcut(w, self.kv.home.home(), ctx.now()).filter(|&(_, t)| self.fresh(ctx, t)))
    }

    /// Walks key `key` from `s` to its tail: one READ per version (after
    /// `chase_limit` hops, a jump to the key's shortcut).
    /// `read` is the start's version if the caller already read it (at
    /// `s.learned`).
    async fn walk(
        &self,
        ctx: &Ctx,
        key: &[u8],
        mut s: Start,
        retry: &mut Retry,
        mut read: Option<Version>,
    ) -> Result<Walk, IndexError> {
        let mut hops = 0u32;
        // The shortcut read beside the walk's first READ (if it is the
        // walk's to make).
        let mut with_shortcut = read.is_none() && self.cfg().shortcut && self.cfg().shortcut_first;
        let mut jump = None;
        loop {
            if !self.fresh(ctx, s.learned) {
                return Ok(Walk::Restart);
            }
            let (t, v) = match read.take() {
                Some(v) => (s.learned, Some(v)),
                None => {
                    let t = ctx.now();
                    ctx.read(self.kv.remote(s.at)?, self.sc().ver);
                    self.posted_reads(1);
                    if with_shortcut {
                        ctx.read(self.kv.entry(s.key_id)?.add(DIR_SHORTCUT), self.sc().word);
                        self.posted_reads(1);
                    }
                    ctx.sync().await?;
                    // Checked again once read: a task descheduled between
                    // the check and its READ may have read a reused block.
                    if !self.fresh(ctx, s.learned) {
                        return Ok(Walk::Restart);
                    }
                    if std::mem::take(&mut with_shortcut) {
                        let w = ctx.local_u64(self.sc().word);
                        jump = decode_shortcut(w, self.kv.home.home(), ctx.now())
                            .filter(|&(at, l)| at != s.at && self.fresh(ctx, l));
                    }
                    (t, self.decode(ctx))
                }
            };
            let Some(v) = v.filter(|v| v.key_id == s.key_id && v.key == key) else {
                self.count(|c| c.restarts += 1);
                return Ok(Walk::Restart);
            };
            if v.this != s.at {
                // The switch steered the READ to a later version of the key.
                self.count(|c| c.steered_reads += 1);
                s.at = v.this;
            }
            s.learned = t;
            match v.next {
                Next::Empty { .. } => {
                    return Ok(Walk::Tail(Tail {
                        start: s,
                        kind: v.kind,
                        value: v.value,
                    }))
                }
                Next::Link { to, .. } => {
                    hops += 1;
                    self.count(|c| c.hops += 1);
                    retry.again(ctx)?;
                    s.at = to;
                    if let Some((at, learned)) = jump.take() {
                        // Not the tail: on from the shortcut read with it.
                        if at != to {
                            self.count(|c| c.shortcut_jumps += 1);
                            s = Start {
                                key_id: s.key_id,
                                at,
                                learned,
                            };
                        }
                        continue;
                    }
                    let limit = self.cfg().chase_limit;
                    if limit > 0 && hops.is_multiple_of(limit) {
                        if let Some((at, learned)) = self.shortcut(ctx, s.key_id).await? {
                            self.count(|c| c.shortcut_jumps += 1);
                            s = Start {
                                key_id: s.key_id,
                                at,
                                learned,
                            };
                        }
                    }
                }
                Next::Invalid => unreachable!("decode refuses invalid next words"),
            }
        }
    }

    /// The key's tail: from a fresh hint, else from the directory; `None`
    /// if the key has no chain.
    async fn tail(
        &self,
        ctx: &Ctx,
        key: &[u8],
        h: &KeyHash,
        retry: &mut Retry,
    ) -> Result<Result<Tail, u64>, IndexError> {
        let mut hinted = true;
        loop {
            let (start, read) = match hinted.then(|| self.hint(ctx, h)).flatten() {
                Some(s) => (s, None),
                None => match self.find(ctx, key, h).await? {
                    Lookup::Found(s, v) => (s, Some(v)),
                    Lookup::Absent { slot } => return Ok(Err(slot)),
                },
            };
            match self.walk(ctx, key, start, retry, read).await? {
                Walk::Tail(t) => {
                    self.remember(h, t.start, t.kind);
                    return Ok(Ok(t));
                }
                Walk::Restart => {
                    self.forget(h);
                    hinted = false;
                    retry.again(ctx)?;
                }
            }
        }
    }

    /// A block for a new version: one never linked, one claimed from the
    /// pool, or the current chunk's next (a new chunk when it is used up,
    /// after asking the pool).
    async fn alloc(&self, ctx: &Ctx) -> Result<GlobalAddr, IndexError> {
        let bytes = self.cfg().block_bytes() as u64;
        {
            let mut st = self.st.borrow_mut();
            if let Some(a) = st.free.pop().or_else(|| st.claimed.pop()) {
                return Ok(a);
            }
            if let Some((next, end)) = st.bump {
                if next.offset() + bytes <= end {
                    st.bump = Some((next.add(bytes), end));
                    return Ok(next);
                }
            }
        }
        // The chunk is used up: reclaimed blocks first.
        let pool = self.kv.pool()?;
        let got = pool
            .claim(
                ctx,
                self.sc().pool_head,
                self.sc().pool_slots,
                self.cfg().alloc_batch as u64,
            )
            .await?;
        let mut st = self.st.borrow_mut();
        if !got.is_empty() {
            st.counters.pool_blocks += got.len() as u64;
            st.claimed = got;
            return Ok(st.claimed.pop().expect("claimed at least one"));
        }
        let home = self.kv.home.home();
        let chunk = self
            .kv
            .home
            .fabric()
            .alloc_group_chunk(home, self.cfg().chunk_bytes, &self.kv.home.group())
            .map_err(IndexError::oom("allocating a chunk of versions"))?;
        let (addr, len) = (chunk.addr, chunk.len);
        st.counters.chunks += 1;
        // Chunks are 64-byte aligned: blocks stay aligned.
        st.bump = Some((addr.add(bytes), addr.offset() + len));
        Ok(addr)
    }

    /// Puts the image of a version at `b` into the task's `new` region.
    fn image(&self, ctx: &Ctx, b: GlobalAddr, key_id: u64, kind: Kind, key: &[u8], value: &[u8]) {
        let mut st = self.st.borrow_mut();
        st.birth += 1;
        let birth = st.birth;
        let mut buf = std::mem::take(&mut st.buf);
        NewVersion {
            at: b,
            birth,
            key_id,
            kind,
            key,
            value,
        }
        .encode(&mut buf);
        ctx.put_local(self.sc().new, &buf);
        st.buf = buf;
    }

    fn link_word(&self, b: GlobalAddr, kind: Kind) -> Result<u64, IndexError> {
        Next::link(b, kind).ok_or(IndexError::Corrupt {
            addr: b,
            what: "clover block (address beyond a 48-bit pointer)",
        })
    }

    /// Records version `b`, known linked at `linked_at`, as key `key_id`'s
    /// shortcut, stamped with that time (Clover's writers do; fire and
    /// forget — a late WRITE carries its old stamp, see "Reclamation").
    fn set_shortcut(
        &self,
        ctx: &Ctx,
        key_id: u64,
        b: GlobalAddr,
        linked_at: Nanos,
    ) -> Result<(), IndexError> {
        if !self.cfg().shortcut || b.node() != self.kv.home.home() {
            return Ok(());
        }
        let Some(w) = shortcut_word(b, linked_at) else {
            return Ok(());
        };
        ctx.set_local_u64(self.sc().shortcut, w);
        ctx.write(self.kv.entry(key_id)?.add(DIR_SHORTCUT), self.sc().shortcut);
        ctx.post();
        Ok(())
    }

    fn linked(&self) {
        self.count(|c| c.appends += 1);
        self.kv.linked.fetch_add(1, Ordering::Relaxed);
    }

    /// Creates key `key`'s chain in free directory entry `slot`: WRITE its
    /// first version ∥ CAS the entry's head — one round trip.
    #[allow(clippy::too_many_arguments)]
    async fn create(
        &self,
        ctx: &Ctx,
        key: &[u8],
        value: &[u8],
        h: &KeyHash,
        slot: u64,
        block: &mut Option<(GlobalAddr, Option<u64>)>,
    ) -> Result<Create, IndexError> {
        let b = match block {
            Some((b, _)) => *b,
            None => {
                let b = self
                    .timed(ctx, |c| &mut c.write_alloc_ns, self.alloc(ctx))
                    .await?;
                *block = Some((b, None));
                b
            }
        };
        self.image(ctx, b, slot, Kind::Present, key, value);
        *block = Some((b, Some(slot)));
        let head = DirEntry::head_word(h.fp(), b).ok_or(IndexError::Corrupt {
            addr: b,
            what: "clover block (address beyond a 48-bit pointer)",
        })?;
        let t = ctx.now();
        ctx.write(
            self.kv.remote(b)?,
            self.sc().new.prefix(HEADER + key.len() + value.len()),
        );
        let tk = ctx.cas(self.kv.entry(slot)?, 0, head);
        ctx.sync().await?;
        let (ns, failed) = (ctx.now() - t, ctx.value(tk) != 0);
        self.count(|c| {
            c.write_cas += 1;
            c.write_cas_failed += failed as u64;
            c.write_cas_ns += ns;
        });
        if failed {
            return Ok(Create::Taken);
        }
        self.linked();
        self.remember(
            h,
            Start {
                key_id: slot,
                at: b,
                learned: t,
            },
            Kind::Present,
        );
        Ok(Create::Created)
    }

    /// Appends a version of kind `kind` if the key's state is `pre`
    /// (insert: absent → present; update: present → present; delete:
    /// present → absent). Clover's write: WRITE the version ∥ CAS the
    /// believed tail's next word — one round trip; after a lost race, walk
    /// to the real tail and CAS again.
    async fn append(
        &self,
        ctx: &Ctx,
        op: &'static str,
        key: &[u8],
        value: &[u8],
        pre: Kind,
        kind: Kind,
    ) -> Result<bool, IndexError> {
        let h = self.hash(key);
        let mut retry = self.retry(op);
        // The block and the key id its image was written for.
        let mut block: Option<(GlobalAddr, Option<u64>)> = None;
        let (t0, r0, before) = self.op_start(ctx);
        let r = self
            .append_loop(ctx, key, value, pre, kind, &h, &mut retry, &mut block)
            .await;
        let (ns, reads) = (ctx.now() - t0, self.reads_so_far() - r0);
        self.count(|c| {
            c.writes += 1;
            c.write_ns += ns;
            c.write_reads += reads;
        });
        self.op_end(t0, &before);
        if !matches!(r, Ok(true)) {
            if let Some((b, _)) = block {
                // Never linked: nobody else can have seen it.
                self.st.borrow_mut().free.push(b);
            }
        }
        r
    }

    #[allow(clippy::too_many_arguments)]
    async fn append_loop(
        &self,
        ctx: &Ctx,
        key: &[u8],
        value: &[u8],
        pre: Kind,
        kind: Kind,
        h: &KeyHash,
        retry: &mut Retry,
        block: &mut Option<(GlobalAddr, Option<u64>)>,
    ) -> Result<bool, IndexError> {
        let mut first = true;
        let mut hinted = true;
        'lookup: loop {
            // Where to append: the hint, else the directory's start.
            let mut s = match hinted.then(|| self.hint(ctx, h)).flatten() {
                Some(s) => s,
                None => match self
                    .timed(ctx, |c| &mut c.write_lookup_ns, self.find(ctx, key, h))
                    .await?
                {
                    // (Writes CAS at once: the version read is not needed.)
                    Lookup::Found(s, _) => s,
                    Lookup::Absent { slot } => {
                        if pre != Kind::Absent {
                            return Ok(false);
                        }
                        match self.create(ctx, key, value, h, slot, block).await? {
                            Create::Created => {
                                if first {
                                    self.count(|c| c.writes_first_try += 1);
                                }
                                return Ok(true);
                            }
                            Create::Taken => {
                                first = false;
                                retry.again(ctx)?;
                                hinted = false;
                                continue 'lookup;
                            }
                        }
                    }
                },
            };
            loop {
                if !self.fresh(ctx, s.learned) {
                    hinted = false;
                    continue 'lookup;
                }
                let b = match *block {
                    Some((b, _)) => b,
                    None => {
                        let b = self
                            .timed(ctx, |c| &mut c.write_alloc_ns, self.alloc(ctx))
                            .await?;
                        *block = Some((b, None));
                        b
                    }
                };
                if block.is_some_and(|(_, k)| k != Some(s.key_id)) {
                    self.image(ctx, b, s.key_id, kind, key, value);
                    *block = Some((b, Some(s.key_id)));
                    let len = HEADER + key.len() + value.len();
                    ctx.write(self.kv.remote(b)?, self.sc().new.prefix(len));
                }
                let expect = Next::empty(s.key_id, pre);
                let t = ctx.now();
                let tk = ctx.cas(self.kv.remote(s.at)?, expect, self.link_word(b, kind)?);
                ctx.sync().await?;
                let old = ctx.value(tk);
                let ns = ctx.now() - t;
                self.count(|c| {
                    c.write_cas += 1;
                    c.write_cas_failed += (old != expect) as u64;
                    c.write_cas_ns += ns;
                });
                if old == expect {
                    ctx.cas_outcome(true).await;
                    if first {
                        self.count(|c| c.writes_first_try += 1);
                    }
                    self.linked();
                    let mine = Start {
                        key_id: s.key_id,
                        at: b,
                        learned: t,
                    };
                    self.remember(h, mine, kind);
                    self.set_shortcut(ctx, s.key_id, b, t)?;
                    return Ok(true);
                }
                first = false;
                match Next::decode(old) {
                    // `s` is the tail, in the other state: the operation's
                    // precondition is false at the CAS.
                    Next::Empty { key: k, kind: now } if k == s.key_id => {
                        debug_assert_ne!(now, pre, "a CAS expecting this word succeeded");
                        self.remember(h, Start { learned: t, ..s }, now);
                        return Ok(false);
                    }
                    // Another writer appended first: to the real tail.
                    Next::Link { to, .. } => {
                        ctx.cas_outcome(false).await;
                        retry.lost(ctx)?;
                        let next = Start {
                            key_id: s.key_id,
                            at: to,
                            learned: t,
                        };
                        let walk = self.walk(ctx, key, next, retry, None);
                        match self.timed(ctx, |c| &mut c.write_walk_ns, walk).await? {
                            Walk::Tail(tail) => {
                                self.remember(h, tail.start, tail.kind);
                                if tail.kind != pre {
                                    return Ok(false);
                                }
                                s = tail.start;
                            }
                            Walk::Restart => {
                                self.forget(h);
                                hinted = false;
                                continue 'lookup;
                            }
                        }
                    }
                    // Not this key's version any more: a stale address.
                    _ => {
                        self.count(|c| c.restarts += 1);
                        self.forget(h);
                        retry.again(ctx)?;
                        hinted = false;
                        continue 'lookup;
                    }
                }
            }
        }
    }

    /// Every key and value, read chain by chain from the directory (for a
    /// quiescent store: checkers, tools): each used entry's key from the
    /// version it names, then the key's tail as a search finds it.
    async fn scan_all(&self, ctx: &Ctx) -> Result<Entries, IndexError> {
        let mut out = Vec::new();
        let slots = self.cfg().dir_slots;
        let mut retry = self.retry("entries");
        let mut from = 0;
        while from < slots {
            let n = PROBE_WINDOW.min(slots - from);
            ctx.read(
                self.kv.entry(from)?,
                self.sc().dir.prefix((n * DIR_ENTRY) as usize),
            );
            ctx.sync().await?;
            let entries: Vec<DirEntry> = (0..n)
                .map(|i| {
                    ctx.get_as(
                        self.sc()
                            .dir
                            .slice((i * DIR_ENTRY) as usize, DIR_ENTRY as usize),
                    )
                })
                .collect();
            for e in entries.iter().filter(|e| e.used()) {
                // The head is never freed while the store is quiescent.
                ctx.read(self.kv.remote(e.head_addr())?, self.sc().ver);
                ctx.sync().await?;
                let v = self.decode(ctx).ok_or(IndexError::Corrupt {
                    addr: e.head_addr(),
                    what: "clover version (a directory head names it)",
                })?;
                let h = self.hash(&v.key);
                if let Ok(t) = self.tail(ctx, &v.key, &h, &mut retry).await? {
                    if t.kind == Kind::Present {
                        out.push((v.key, t.value));
                    }
                }
            }
            from += n;
        }
        Ok(out)
    }

    /// The key id (directory entry) of `key`, if it has a chain: what the
    /// switch's control plane installs to steer a key (partial steering).
    pub async fn key_id(&self, ctx: &Ctx, key: &[u8]) -> Result<Option<u64>, IndexError> {
        self.check_key(ctx, key)?;
        let h = self.hash(key);
        Ok(match self.find(ctx, key, &h).await? {
            Lookup::Found(s, _) => Some(s.key_id),
            Lookup::Absent { .. } => None,
        })
    }
}

impl CloverKv {
    pub(crate) fn local_layout_ref(&self) -> &LocalLayout {
        dmkit_index::RemoteMap::local_layout(self)
    }
}

impl MapClient for CloverClient {
    /// Clover's read: READ the hinted tail (one round trip when the hint is
    /// fresh and current); follow `next` to the tail otherwise.
    async fn search(&self, ctx: &Ctx, key: &[u8]) -> Result<Option<Vec<u8>>, IndexError> {
        self.check_key(ctx, key)?;
        let _op = ctx.read_op("search").await;
        let h = self.hash(key);
        let mut retry = self.retry("search");
        let (t0, r0, before) = self.op_start(ctx);
        let r = self.tail(ctx, key, &h, &mut retry).await?;
        let first = retry.attempts() == 0;
        let (ns, reads) = (ctx.now() - t0, self.reads_so_far() - r0);
        self.count(|c| {
            c.reads += 1;
            c.reads_first_try += first as u64;
            c.search_ns += ns;
            c.search_reads += reads;
        });
        self.op_end(t0, &before);
        Ok(match r {
            Ok(t) if t.kind == Kind::Present => Some(t.value),
            _ => None,
        })
    }

    /// Inserts `key` if absent: a new chain (WRITE ∥ CAS of a directory
    /// entry), or a version appended after a tombstone.
    async fn insert(&self, ctx: &Ctx, key: &[u8], value: &[u8]) -> Result<bool, IndexError> {
        self.check_key(ctx, key)?;
        self.check_value(value)?;
        let _op = ctx.op("insert").await;
        self.append(ctx, "insert", key, value, Kind::Absent, Kind::Present)
            .await
    }

    /// Replaces the value of a present key: a version appended.
    async fn update(&self, ctx: &Ctx, key: &[u8], value: &[u8]) -> Result<bool, IndexError> {
        self.check_key(ctx, key)?;
        self.check_value(value)?;
        let _op = ctx.op("update").await;
        self.append(ctx, "update", key, value, Kind::Present, Kind::Present)
            .await
    }

    /// Removes a present key: a tombstone appended.
    async fn delete(&self, ctx: &Ctx, key: &[u8]) -> Result<bool, IndexError> {
        self.check_key(ctx, key)?;
        let _op = ctx.op("delete").await;
        self.append(ctx, "delete", key, &[], Kind::Present, Kind::Absent)
            .await
    }

    async fn scan(&self, _ctx: &Ctx, _from: &[u8], _count: usize) -> Result<Entries, IndexError> {
        Err(IndexError::Unsupported {
            kind: crate::store::KIND,
            what: "range scans",
        })
    }

    async fn entries(&self, ctx: &Ctx) -> Result<Entries, IndexError> {
        dmkit_index::check_local(ctx, self.kv.local_layout_ref())?;
        self.scan_all(ctx).await
    }

    fn stats(&self) -> ClientStats {
        let c = self.st.borrow().counters;
        ClientStats {
            cache_hits: c.reads_first_try + c.writes_first_try,
            cache_misses: c.lookups,
            splits: 0,
            ..Default::default()
        }
    }

    fn local_layout(&self) -> &LocalLayout {
        self.kv.local_layout_ref()
    }
}
