//! The metadata server (Clover's MS), off the data path: it walks the
//! chains, cuts their superseded prefixes off (moving each key's `head`
//! forward), and after the grace period hands the cut versions back to
//! clients through the free-block pool ([`crate::pool`]).
//!
//! It is a client of the memory node like any other (one-sided verbs on a
//! runtime worker), so it runs wherever a worker runs: a thread of the
//! process that made the store (the embedded setup), its own process
//! (`dmkit clover-mds`), or a virtual thread of the simulator. One runs
//! per store: it claims the root `clover/NAME/mds` while it runs.
//!
//! ## A round
//! 1. read a share of the directory (`dir_per_round` entries);
//! 2. walk each key's chain from where the last round stopped (its
//!    *frontier*, or the head), up to `hops_per_round` versions, many keys
//!    in lockstep (one READ of a header per key per round trip). Every
//!    version found with a successor is *superseded*; the server notes
//!    when it first saw it so;
//! 3. *cut*: the versions superseded at least `keep` ago (a prefix of the
//!    chain) are cut off — the shortcut is moved past them first if it
//!    names one, then `head` is moved to the first version kept (CAS). A
//!    cut version is unreachable from the directory from then on;
//! 4. *free*: versions cut at least `grace` ago go into the pool.
//!
//! ## Why nobody can still reach a freed version
//! See the crate docs ("Reclamation"): every client dereferences an
//! address at most `grace/2` after it learnt it, and it learns addresses
//! only from the directory or from versions reachable when it read them.
//! A version cut at `T` was reachable from nothing a client can read after
//! `T`, so no client holds its address with a right to use it after
//! `T + grace/2` — and it is freed at `T + grace` (half the grace absorbs
//! clock disagreement). The shortcut, which writers WRITE without a CAS,
//! is the one entry point not covered by `head`: a writer writes it within
//! `grace/4` of linking its version, and only versions superseded at least
//! `keep` (≥ `grace/2`) ago are cut, so every shortcut WRITE naming a cut
//! version has landed before the cut — which moves it first.

use std::cell::RefCell;
use std::collections::{HashMap, VecDeque};
use std::rc::Rc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Weak};

use dmkit_fabric::GlobalAddr;
use dmkit_index::IndexError;
use dmkit_runtime::{Ctx, Local, LocalLayout, Nanos, Worker};
use zerocopy::FromBytes;

use crate::layout::{shortcut_word, DirEntry, Next, VersionHeader, DIR_ENTRY, DIR_SHORTCUT};
use crate::store::CloverKv;

/// The metadata server's settings.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MdsConfig {
    /// Time between rounds (ns).
    pub period: Nanos,
    /// How long a version stays superseded before it may be cut (ns; 0:
    /// half the store's grace period, the least that is safe).
    pub keep: Nanos,
    /// Versions of one chain walked per round.
    pub hops_per_round: u32,
    /// Directory entries read per round.
    pub dir_per_round: u64,
    /// Chains walked in lockstep (READs per round trip).
    pub walkers: usize,
}

impl Default for MdsConfig {
    fn default() -> Self {
        Self {
            period: 2_000_000,
            keep: 0,
            hops_per_round: 256,
            dir_per_round: 1 << 14,
            walkers: 64,
        }
    }
}

/// What the metadata server did (shared with the store's handle).
#[derive(Debug, Default)]
pub struct MdsStats {
    rounds: AtomicU64,
    superseded: AtomicU64,
    cut: AtomicU64,
    freed: AtomicU64,
    head_moves: AtomicU64,
    shortcut_moves: AtomicU64,
    resets: AtomicU64,
}

/// A snapshot of [`MdsStats`].
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct MdsCounters {
    /// Rounds run.
    pub rounds: u64,
    /// Versions seen superseded.
    pub superseded: u64,
    /// Versions cut off their chains.
    pub cut: u64,
    /// Versions handed back through the pool.
    pub freed: u64,
    /// Heads moved.
    pub head_moves: u64,
    /// Shortcuts moved past a cut.
    pub shortcut_moves: u64,
    /// Chains whose walk was started over (the server's view was stale).
    pub resets: u64,
}

impl MdsStats {
    /// The counters now.
    pub fn snapshot(&self) -> MdsCounters {
        let g = |a: &AtomicU64| a.load(Ordering::Relaxed);
        MdsCounters {
            rounds: g(&self.rounds),
            superseded: g(&self.superseded),
            cut: g(&self.cut),
            freed: g(&self.freed),
            head_moves: g(&self.head_moves),
            shortcut_moves: g(&self.shortcut_moves),
            resets: g(&self.resets),
        }
    }

    fn add(&self, a: &AtomicU64, n: u64) {
        a.fetch_add(n, Ordering::Relaxed);
    }
}

/// Directory entries read with one READ.
const DIR_PIECE: u64 = 256;
/// Bytes of a header the walk reads (next, this, birth, key id).
const WALK_READ: usize = 32;

#[derive(Debug, Clone, Copy)]
struct MdsScratch {
    dir: Local,
    heads: Local,
    word: Local,
    slots: Local,
}

/// What the server knows of one chain.
#[derive(Debug, Default)]
struct KeyGc {
    /// The last version reached (NULL: start at the head).
    frontier: GlobalAddr,
    /// Versions found superseded, in chain order from the head, with when.
    superseded: VecDeque<(GlobalAddr, Nanos)>,
}

#[derive(Debug, Default)]
struct State {
    keys: HashMap<u64, KeyGc>,
    /// Cut versions and when they may be freed.
    quarantine: VecDeque<(Nanos, GlobalAddr)>,
    /// The pool's production count (the server is its only producer).
    prod: Option<u64>,
    /// The next directory entry to read.
    cursor: u64,
}

/// The metadata server of one store. Make it with [`CloverKv::mds`] and
/// run it on a worker with [`Mds::spawn`].
pub struct Mds {
    kv: Weak<CloverKv>,
    cfg: MdsConfig,
    stats: Arc<MdsStats>,
    sc: MdsScratch,
    layout: LocalLayout,
}

/// Distinguishes servers of one process in the `mds` root.
static MDS_TOKEN: AtomicU64 = AtomicU64::new(1);

/// Whether the server was told to stop.
fn stopped(stop: &AtomicBool) -> bool {
    stop.load(Ordering::Acquire)
}

impl Mds {
    pub(crate) fn new(kv: Arc<CloverKv>, cfg: MdsConfig, stats: Arc<MdsStats>) -> Self {
        let walkers = cfg.walkers.clamp(1, 1024);
        let mut l = LocalLayout::new();
        let sc = MdsScratch {
            dir: l.region("directory piece", (DIR_PIECE * DIR_ENTRY) as usize),
            heads: l.region("version headers", walkers * WALK_READ),
            word: l.region("pool word", 8),
            slots: l.region("pool slots", 8 * 1024),
        };
        Self {
            kv: Arc::downgrade(&kv),
            cfg: MdsConfig { walkers, ..cfg },
            stats,
            sc,
            layout: l,
        }
    }

    /// The task-local memory the server's task needs.
    pub fn local_layout(&self) -> &LocalLayout {
        &self.layout
    }

    /// Spawns the server's task on `w` (built with [`Mds::local_layout`]):
    /// it claims the store's `mds` root (one server per store), then runs
    /// a round every `period` until `stop` is set or the store's handles
    /// are all dropped, and releases the root. A failed verb ends the task
    /// (counted as a reset): garbage collection stops, the store does not.
    ///
    /// [`IndexError::AlreadyExists`] if another server holds the root.
    pub fn spawn(self, w: &mut Worker, stop: Arc<AtomicBool>) -> Result<(), IndexError> {
        let kv = self.kv.upgrade().ok_or_else(|| IndexError::NotFound {
            kind: crate::store::KIND,
            name: "(dropped store)".into(),
        })?;
        let root = format!(
            "{}/mds",
            dmkit_index::lifecycle::root_name(crate::store::KIND, kv.home.name())
        );
        let token = MDS_TOKEN.fetch_add(1, Ordering::Relaxed) | (std::process::id() as u64) << 32;
        let fabric = kv.home.fabric().clone();
        let home = kv.home.home();
        if !dmkit_fabric::claim_root(fabric.as_ref(), home, &root, token)? {
            return Err(IndexError::AlreadyExists {
                kind: crate::store::KIND,
                name: format!("{} (its metadata server runs elsewhere)", kv.home.name()),
            });
        }
        drop(kv);
        w.spawn(move |ctx| async move {
            let st = Rc::new(RefCell::new(State::default()));
            while !stopped(&stop) {
                let Some(kv) = self.kv.upgrade() else { break };
                if self.round(&ctx, &kv, &st).await.is_err() {
                    self.stats.add(&self.stats.resets, 1);
                    break;
                }
                drop(kv);
                // Sleep in short steps so a stop is seen soon.
                let until = ctx.now() + self.cfg.period;
                while ctx.now() < until && !stopped(&stop) {
                    ctx.sleep(self.cfg.period.min(1_000_000)).await;
                }
            }
            let _ = dmkit_fabric::release_root(fabric.as_ref(), home, &root, token);
        });
        Ok(())
    }

    fn keep(&self, kv: &CloverKv) -> Nanos {
        if self.cfg.keep == 0 {
            kv.cfg.grace / 2
        } else {
            self.cfg.keep.max(kv.cfg.grace / 2)
        }
    }

    /// One round: read a share of the directory, walk, cut, free.
    async fn round(
        &self,
        ctx: &Ctx,
        kv: &CloverKv,
        st: &Rc<RefCell<State>>,
    ) -> Result<(), IndexError> {
        self.stats.add(&self.stats.rounds, 1);
        let heads = self.read_directory(ctx, kv, st).await?;
        self.walk(ctx, kv, st, &heads).await?;
        self.cut(ctx, kv, st).await?;
        self.free(ctx, kv, st).await
    }

    /// Reads `dir_per_round` entries from the cursor; returns the used
    /// ones: (key id, entry).
    async fn read_directory(
        &self,
        ctx: &Ctx,
        kv: &CloverKv,
        st: &Rc<RefCell<State>>,
    ) -> Result<Vec<(u64, DirEntry)>, IndexError> {
        let slots = kv.cfg.dir_slots;
        let mut out = Vec::new();
        let mut left = self.cfg.dir_per_round.min(slots);
        while left > 0 {
            let from = st.borrow().cursor;
            let n = left.min(DIR_PIECE).min(slots - from);
            ctx.read(
                kv.entry(from)?,
                self.sc.dir.prefix((n * DIR_ENTRY) as usize),
            );
            ctx.sync().await?;
            for i in 0..n {
                let e: DirEntry = ctx.get_as(
                    self.sc
                        .dir
                        .slice((i * DIR_ENTRY) as usize, DIR_ENTRY as usize),
                );
                if e.used() {
                    out.push((from + i, e));
                }
            }
            st.borrow_mut().cursor = (from + n) % slots;
            left -= n;
        }
        Ok(out)
    }

    /// Walks the chains of `heads` from their frontiers, many at a time.
    async fn walk(
        &self,
        ctx: &Ctx,
        kv: &CloverKv,
        st: &Rc<RefCell<State>>,
        heads: &[(u64, DirEntry)],
    ) -> Result<(), IndexError> {
        // (key id, where, hops this round)
        let mut todo: VecDeque<(u64, GlobalAddr, u32)> = heads
            .iter()
            .map(|(k, e)| {
                let f = st
                    .borrow()
                    .keys
                    .get(k)
                    .map_or(GlobalAddr::NULL, |g| g.frontier);
                (*k, if f.is_null() { e.head_addr() } else { f }, 0)
            })
            .collect();
        while !todo.is_empty() {
            let n = todo.len().min(self.cfg.walkers);
            let batch: Vec<_> = todo.drain(..n).collect();
            for (i, (_, at, _)) in batch.iter().enumerate() {
                ctx.read(
                    kv.remote(*at)?,
                    self.sc.heads.slice(i * WALK_READ, WALK_READ),
                );
            }
            ctx.sync().await?;
            let now = ctx.now();
            let mut st = st.borrow_mut();
            for (i, (key, at, hops)) in batch.into_iter().enumerate() {
                let mut h = [0u8; 48];
                ctx.get_local(
                    self.sc.heads.slice(i * WALK_READ, WALK_READ),
                    &mut h[..WALK_READ],
                );
                let (hdr, _) = VersionHeader::read_from_prefix(&h[..]).expect("48 bytes");
                let g = st.keys.entry(key).or_default();
                if hdr.key_id != key || GlobalAddr::from_raw(hdr.this) != at {
                    // Not this key's version: the view is stale (another
                    // server's cut); start over from the head next round.
                    *g = KeyGc::default();
                    self.stats.add(&self.stats.resets, 1);
                    continue;
                }
                match Next::decode(hdr.next) {
                    Next::Link { to, .. } => {
                        if g.superseded.back().is_none_or(|b| b.0 != at) {
                            g.superseded.push_back((at, now));
                            self.stats.add(&self.stats.superseded, 1);
                        }
                        g.frontier = to;
                        if hops + 1 < self.cfg.hops_per_round {
                            todo.push_back((key, to, hops + 1));
                        }
                    }
                    Next::Empty { .. } => g.frontier = at,
                    Next::Invalid => {
                        *g = KeyGc::default();
                        self.stats.add(&self.stats.resets, 1);
                    }
                }
            }
        }
        Ok(())
    }

    /// Cuts every chain's prefix superseded at least `keep` ago.
    async fn cut(
        &self,
        ctx: &Ctx,
        kv: &CloverKv,
        st: &Rc<RefCell<State>>,
    ) -> Result<(), IndexError> {
        let now = ctx.now();
        let keep = self.keep(kv);
        // (key id, versions to cut, the new head)
        let plans: Vec<(u64, usize, GlobalAddr)> = st
            .borrow()
            .keys
            .iter()
            .filter_map(|(&k, g)| {
                let n = g
                    .superseded
                    .iter()
                    .take_while(|(_, t)| t + keep <= now)
                    .count();
                (n > 0).then(|| {
                    let new_head = g.superseded.get(n).map_or(g.frontier, |s| s.0);
                    (k, n, new_head)
                })
            })
            .collect();
        for chunk in plans.chunks(self.cfg.walkers) {
            for (i, (k, _, _)) in chunk.iter().enumerate() {
                ctx.read(
                    kv.entry(*k)?,
                    self.sc.heads.slice(i * WALK_READ, DIR_ENTRY as usize),
                );
            }
            ctx.sync().await?;
            let entries: Vec<DirEntry> = (0..chunk.len())
                .map(|i| ctx.get_as(self.sc.heads.slice(i * WALK_READ, DIR_ENTRY as usize)))
                .collect();
            for ((k, n, new_head), e) in chunk.iter().zip(entries) {
                self.cut_one(ctx, kv, st, *k, *n, *new_head, e).await?;
            }
        }
        Ok(())
    }

    #[allow(clippy::too_many_arguments)]
    async fn cut_one(
        &self,
        ctx: &Ctx,
        kv: &CloverKv,
        st: &Rc<RefCell<State>>,
        key: u64,
        n: usize,
        new_head: GlobalAddr,
        e: DirEntry,
    ) -> Result<(), IndexError> {
        let cut: Option<Vec<GlobalAddr>> = {
            let st = st.borrow();
            let g = &st.keys[&key];
            (g.superseded.front().map(|s| s.0) == Some(e.head_addr()))
                .then(|| g.superseded.iter().take(n).map(|s| s.0).collect())
        };
        let Some(cut) = cut else {
            // The head is not where the walk began: start over.
            self.reset(st, key);
            return Ok(());
        };
        debug_assert!(!cut.contains(&new_head), "the new head is kept");
        let entry = kv.entry(key)?;
        let head = DirEntry::head_word(e.fp(), new_head).ok_or(IndexError::Corrupt {
            addr: new_head,
            what: "clover version (address beyond a 48-bit pointer)",
        })?;
        // 1. The shortcut is the one entry point besides the head: move it
        //    past the cut first (a writer that moves it meanwhile wins; the
        //    next round looks again).
        if let Some(s) = e.shortcut_addr(kv.home.home()) {
            if cut.contains(&s) {
                // The new head is linked now (it is on the chain).
                let w = shortcut_word(new_head, ctx.now()).unwrap_or(0);
                let old = ctx.cas_sync(entry.add(DIR_SHORTCUT), e.shortcut, w).await?;
                if old != e.shortcut {
                    return Ok(());
                }
                self.stats.add(&self.stats.shortcut_moves, 1);
            }
        }
        // 2. Move the head: from now on the cut versions are unreachable.
        let old = ctx.cas_sync(entry, e.head, head).await?;
        if old != e.head {
            self.reset(st, key);
            return Ok(());
        }
        let free_at = ctx.now() + kv.cfg.grace;
        let mut st = st.borrow_mut();
        let g = st.keys.get_mut(&key).expect("a planned key");
        g.superseded.drain(..n);
        st.quarantine.extend(cut.iter().map(|&a| (free_at, a)));
        self.stats.add(&self.stats.cut, n as u64);
        self.stats.add(&self.stats.head_moves, 1);
        Ok(())
    }

    /// Forgets what the server knew of chain `key` (it walks it again from
    /// the head).
    fn reset(&self, st: &Rc<RefCell<State>>, key: u64) {
        st.borrow_mut().keys.insert(key, KeyGc::default());
        self.stats.add(&self.stats.resets, 1);
    }

    /// Hands the versions whose grace has passed to the pool.
    async fn free(
        &self,
        ctx: &Ctx,
        kv: &CloverKv,
        st: &Rc<RefCell<State>>,
    ) -> Result<(), IndexError> {
        let now = ctx.now();
        let max = self.sc.slots.len() / 8;
        let ready: Vec<GlobalAddr> = st
            .borrow()
            .quarantine
            .iter()
            .take_while(|(t, _)| *t <= now)
            .take(max)
            .map(|(_, a)| *a)
            .collect();
        if ready.is_empty() {
            return Ok(());
        }
        let pool = kv.pool()?;
        let known = st.borrow().prod;
        let mut prod = match known {
            Some(p) => p,
            None => {
                ctx.read(pool.at, self.sc.word);
                ctx.sync().await?;
                ctx.local_u64(self.sc.word)
            }
        };
        let n = pool
            .produce(ctx, &mut prod, self.sc.word, self.sc.slots, &ready)
            .await?;
        let mut st = st.borrow_mut();
        st.prod = Some(prod);
        st.quarantine.drain(..n);
        self.stats.add(&self.stats.freed, n as u64);
        Ok(())
    }
}
