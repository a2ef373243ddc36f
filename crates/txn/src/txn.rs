//! Coordinators and transactions: FORD's one-sided OCC (FORD, FAST'22
//! §4; SMART-DTX, SMART ASPLOS'24 §5.2 runs the same protocol on SMART's
//! runtime).
//!
//! A transaction names its records (`read` or `write`, by table and key),
//! `exec`s, looks at their values, sets new ones and `commit`s. Its
//! round trips, each one doorbell per memory node:
//!
//! 1. **probe** (only for keys whose slot the coordinator's address cache
//!    does not know): READ the key's bucket to find the key's slot. A
//!    record to read that the bucket shows absent (its would-be slot
//!    empty and clean) is done here: no fetch, validation checks the slot.
//!    With `TxnConfig::cache_absent` the cache remembers that slot, and
//!    the next read of the key READs only its lock and version in the
//!    fetch round (probing again if it was taken since: see `fetch`).
//! 2. **execute**: records to write are locked and read at once —
//!    *hitchhiked locking*: a CAS of the primary's lock word (`0 →` this
//!    coordinator's lease word) and a READ of the record behind it, one
//!    doorbell; records only read are READ from a backup (*backup reads*)
//!    or the primary — their lock and version first, then the record, and
//!    the two versions must agree (a seqlock read: see "Torn reads").
//! 3. **validate + log**: for every record only read, a READ of the
//!    primary's lock and version (lock first: see below); a transaction
//!    that reads but writes nothing stops here. A writing one also WRITEs
//!    its undo log (old images) to `replicas` log copies in the same
//!    doorbell (FORD's log, without its dedicated log QPs: SMART's FORD+).
//!    Without hitchhiking, records to write are locked first, in a round of
//!    their own (CAS + READ of their version), and validated after.
//! 4. **commit** (*coalescent*): for every written record and every
//!    replica, a WRITE marking its version dirty, then a WRITE of key and
//!    payload — all replicas in one round trip (off: backups, then
//!    primaries).
//! 5. **unlock**: per backup a CAS of the dirty new version to the clean
//!    one (a late one cannot overwrite a later commit's version); on the
//!    primary a WRITE of the clean version, then a WRITE freeing the lock. The log's lease word is
//!    cleared after (posted, not awaited).
//!
//! ## Why it is serializable
//!
//! Version numbers of a record only grow (commit: +1; a roll-back by
//! recovery: +2 over the old), and a record's version is clean-new only
//! after every commit write of its transaction, on every replica, is done.
//! A transaction that writes holds all its locks from before validation to
//! after its writes; validation reads each read record's *lock, then
//! version* (one READ with in-order placement, else two READs on one
//! queue pair) and requires the lock free and the version unchanged. If a
//! writer W of record r committed between our read and our validation, it
//! dirtied r's version before the version read (versions never come back)
//! or held r's lock during the lock read; if W locks r after our lock read,
//! W validates after we hold all our locks and sees them. So every pair of
//! conflicting transactions is ordered one way (the classic OCC argument
//! with locks, as FaRM's and FORD's). A read-only transaction checks the
//! locks too: a writer W holding the lock of a record R it read may have
//! validated already — W is then serialized before every transaction that
//! locked anything after that — so a read-only reader of R's old version
//! that also saw such a later commit elsewhere would close a cycle (found
//! by the serializability test: a read-only T saw x after W' wrote it and
//! y before W wrote it, while W had read x before W'). FORD validates a
//! record read from a backup *on that backup*, where no lock is ever
//! taken, which admits write skew between two read-write transactions; here
//! validation always reads the primary (versions are equal on every replica).
//!
//! A single-record read-only transaction skips validation on a fabric with
//! in-order placement (as FORD skips it): its one READ saw the payload
//! before the version behind it, and a version read clean proves no commit
//! had started writing that payload (the dirty mark lands first).
//!
//! Torn reads: a record read while a commit writes it shows new payload
//! words only after that commit's dirty mark landed, so its validation
//! sees the version changed. The other way round — an old payload beside
//! the clean version of a commit that landed entirely between the READ's
//! payload and version words (a reader preempted mid-copy on shm) — is
//! caught by the version READ posted before the record's: equal clean
//! versions before and after mean no commit started in between.
//!
//! That pre-read cannot go, not even for a read-only transaction whose
//! record READ brings lock and version along with the payload: the tail
//! is copied *after* the payload, so a clean, unlocked tail says only
//! that no commit was under way when the tail was copied — a whole commit
//! may have landed while the payload was being copied, leaving old (or
//! half-old) payload words beside the new clean version, which validation
//! then confirms (the seqlock bug found under preemption). One READ would
//! do only with a version word *ahead* of the payload too (a seqlock in
//! the record: front word copied first, tail last, on a fabric that
//! copies a READ's words in ascending order and places a WRITE's in
//! order), a layout change not made here. The pre-read is one more work
//! request in the same doorbell, not a round trip.
//!
//! ## Probe paths without holes
//!
//! A probe ends at its key's slot or at the first empty one, so no slot
//! before a key's on its probe path may ever be empty — else the key is
//! reported absent and a later insert duplicates it. Slots are filled
//! only at commit, so three cases need care (pinned by
//! `tests/insert_hole.rs`):
//!
//! - Two keys to write of one transaction would go to the same empty
//!   slot: the first takes it, the second passes over it to the next one
//!   (one slot locked twice would abort forever). If the transaction then
//!   writes the second but not the first, the first's slot is written
//!   anyway, with the first key's record deleted (absent): a claimed slot
//!   that another of our keys passed over is always written.
//! - A key read absent and a key to write would go to the same empty
//!   slot: the key to write takes it too (it cannot write the read key's
//!   slot, which it does not lock); the read key's validation accepts our
//!   own lock there (no other writer holds it, and an unchanged version
//!   says nothing was inserted since the read).
//! - A coordinator dies with an insert's dirty mark landed: another key's
//!   probe passes over that non-empty slot and inserts further on, so
//!   recovery rolls the insert back to its key deleted, not to an empty
//!   slot (`recovery`).
//!
//! FORD's layout allows this as it is: a deleted record keeps its key and
//! slot (keys never move), and a roll-back restores the old image under a
//! fresh version anyway; the undo log's image of an empty slot now
//! carries the key inserted (an empty slot's key word meant nothing).
//!
//! ## Locks, leases and recovery
//!
//! Lock words are `dmkit_index::lease` leases (owner = coordinator id), so
//! a dead coordinator's locks expire; the undo log's first copy carries
//! a lease word too, which a recoverer breaks to claim the log. Before
//! each step that publishes (undo log, commit writes, unlock) a
//! transaction renews whichever of its leases has too little time left
//! (`LeaseConfig::holds`) by CAS, old word to fresh — a long transaction
//! (a slow application between `exec` and `commit`, a descheduled
//! thread) keeps its locks instead of failing. A renewal CAS fails only if
//! another client broke that lease after it expired: before the log is
//! written the transaction just aborts (the breaker found the log idle
//! and freed the lock); after, the coordinator stops for good
//! ([`TxnError::LeaseLost`]) and recovery finishes its transaction.
//! A transaction that meets an expired lock or a dirty record under one
//! aborts and recovers that lock's owner (`recovery`) before it backs off.
//!
//! Aborts back off through the runtime (`Ctx::backoff`: SMART's conflict
//! avoidance when it is on).

use std::cell::RefCell;
use std::rc::Rc;
use std::sync::Arc;

use dmkit_fabric::RemoteRef;
use dmkit_runtime::{Ctx, Local, Ticket};

use crate::cache::{Cached, SlotCache};
use crate::db::{Database, TableId, TableInfo, PROBE_ROUND};
use crate::error::{AbortReason, CrashPoint, TxnError};
use crate::layout::{self, EntryHead, LogHeader, LogState, RecordTail, Version};

/// A compute machine's (worker thread's) cache of record slots: (table,
/// key) → slot number (see [`crate::cache`]). Slots never move, so an
/// entry never goes stale.
pub type AddrCache = Rc<RefCell<SlotCache>>;

/// A new, empty address cache.
pub fn addr_cache() -> AddrCache {
    Rc::default()
}

/// What one committed transaction read and wrote (for the
/// serializability checker, `crate::check`).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct TxnRecord {
    /// Transaction id.
    pub id: u64,
    /// (table, slot, version number read); slots read empty have 0.
    pub reads: Vec<(TableId, u64, u64)>,
    /// (table, slot, version number written).
    pub writes: Vec<(TableId, u64, u64)>,
}

/// Counters of a coordinator.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct CoordStats {
    /// Committed transactions.
    pub committed: u64,
    /// Aborts by reason ([`AbortReason::ALL`] order).
    pub aborts: [u64; 5],
    /// Transactions of dead coordinators this one recovered.
    pub recovered: u64,
}

/// A transaction client: one task's coordinator, with its id (its lock
/// owner and undo log) and the worker's address cache.
pub struct Coordinator {
    pub(crate) db: Arc<Database>,
    pub(crate) id: u16,
    cache: AddrCache,
    seq: u64,
    /// Why this coordinator stopped for good (a crash or a lost lease).
    pub(crate) dead: Option<String>,
    crash: Option<(CrashPoint, u64)>,
    /// An expired lock met by the current transaction: its owner, the
    /// record's tail (lock, version) and the word seen.
    pending_recovery: Option<(u16, RemoteRef, u64)>,
    history: Option<Vec<TxnRecord>>,
    /// Fault injection: random preemption at the protocol's phase
    /// boundaries ([`Coordinator::preempt_at_random`]).
    preempt: Option<Preempt>,
    /// Its counters.
    pub stats: CoordStats,
    /// Restorations made by recoveries this coordinator ran (the checker
    /// needs them to follow versions across a roll-back).
    pub restored: Vec<crate::check::Restore>,
    /// The last transaction's item list, kept for the next one (no
    /// allocation per transaction).
    spare_items: Vec<Item>,
    /// Scratch list of item indices for a round (probe, fetch).
    scratch: Vec<usize>,
}

impl std::fmt::Debug for Coordinator {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Coordinator").field("id", &self.id).finish()
    }
}

impl Database {
    /// A coordinator with a fresh id, sharing `cache` (one per worker
    /// thread).
    pub fn coordinator(self: &Arc<Self>, cache: &AddrCache) -> Result<Coordinator, TxnError> {
        let id = self.take_coordinator_id()?;
        Ok(Coordinator {
            db: self.clone(),
            id,
            cache: cache.clone(),
            seq: 0,
            dead: None,
            crash: None,
            pending_recovery: None,
            history: None,
            preempt: None,
            stats: CoordStats::default(),
            restored: Vec::new(),
            spare_items: Vec::new(),
            scratch: Vec::new(),
        })
    }
}

impl Coordinator {
    /// Its id (lock owner, log slot).
    pub fn id(&self) -> u16 {
        self.id
    }

    /// The database.
    pub fn db(&self) -> &Arc<Database> {
        &self.db
    }

    /// Fault injection: the `nth` (1-based) transaction that reaches
    /// `point` stops there, as if its coordinator's machine died: nothing
    /// more is posted, its locks and log stay for recovery, and every
    /// later call fails.
    pub fn crash_at(&mut self, point: CrashPoint, nth: u64) {
        assert!(nth >= 1, "crash_at counts from 1");
        self.crash = Some((point, nth));
    }

    /// Fault injection for stress tests on real threads: at each phase
    /// boundary of a transaction (between exec's probe and fetch, before
    /// commit, between locking and validation, between validation and the
    /// commit writes, between the commit writes and the unlock, after the
    /// unlock), with probability `per_mille`/1000, this coordinator is
    /// preempted — its OS thread yields, or sleeps up to 50 µs, or its
    /// task sleeps up to 20 µs so the worker's other tasks run. Widens
    /// the windows the protocol must be safe in; drawn from `seed`.
    pub fn preempt_at_random(&mut self, seed: u64, per_mille: u64) {
        assert!(per_mille <= 1000, "a probability in per mille");
        self.preempt = Some(Preempt {
            rng: dmkit_runtime::rng::Rng::new(seed),
            per_mille,
        });
    }

    /// Records the read and write sets of committed transactions (see
    /// [`Coordinator::take_history`]).
    pub fn record_history(&mut self) {
        self.history.get_or_insert_with(Vec::new);
    }

    /// The recorded history so far.
    pub fn take_history(&mut self) -> Vec<TxnRecord> {
        self.history
            .as_mut()
            .map(std::mem::take)
            .unwrap_or_default()
    }

    /// The id of the transaction begun last (0 before the first).
    pub fn last_txn(&self) -> u64 {
        if self.seq == 0 {
            0
        } else {
            (self.id as u64) << 40 | self.seq
        }
    }

    /// Whether it stopped for good (crashed or lost a lease).
    pub fn is_dead(&self) -> bool {
        self.dead.is_some()
    }

    /// Begins a transaction on task `ctx`.
    pub fn begin<'a>(&'a mut self, ctx: &'a Ctx) -> Txn<'a> {
        self.seq += 1;
        let id = (self.id as u64) << 40 | self.seq;
        let mut items = std::mem::take(&mut self.spare_items);
        items.clear();
        Txn {
            c: self,
            ctx,
            id,
            items,
            logged: false,
            log_lease: 0,
            writing: false,
            done: false,
        }
    }

    fn crash_here(&mut self, p: CrashPoint) -> Result<(), TxnError> {
        if self.arm(p) {
            return Err(TxnError::Crashed(p));
        }
        Ok(())
    }

    /// Whether the transaction reaching `p` now crashes (counts it down).
    fn arm(&mut self, p: CrashPoint) -> bool {
        match &mut self.crash {
            Some((point, n)) if *point == p => {
                *n -= 1;
                if *n == 0 {
                    self.crash = None;
                    self.dead = Some(format!("crashed at {}", p.name()));
                    return true;
                }
                false
            }
            _ => false,
        }
    }

    fn live(&self) -> Result<(), TxnError> {
        match &self.dead {
            None => Ok(()),
            Some(why) => Err(TxnError::LeaseLost(format!(
                "coordinator {} stopped: {why}",
                self.id
            ))),
        }
    }
}

/// Random preemption ([`Coordinator::preempt_at_random`]).
struct Preempt {
    rng: dmkit_runtime::rng::Rng,
    per_mille: u64,
}

/// How a preemption point stalls.
enum Stall {
    Yield,
    Thread(u64),
    Task(u64),
}

impl Preempt {
    fn draw(&mut self) -> Option<Stall> {
        if self.rng.below(1000) >= self.per_mille {
            return None;
        }
        Some(match self.rng.below(3) {
            0 => Stall::Yield,
            1 => Stall::Thread(self.rng.below(50_000)),
            _ => Stall::Task(self.rng.below(20_000)),
        })
    }
}

/// A record's role in a transaction.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Mode {
    Read,
    Write,
}

/// What a transaction writes to a record.
#[derive(Debug, Clone, PartialEq, Eq)]
enum NewImage {
    Put(Vec<u8>),
    Delete,
}

#[derive(Debug, Clone)]
struct Item {
    table: TableId,
    key: u64,
    mode: Mode,
    /// Its slot (known from the cache or a probe).
    slot: Option<u64>,
    /// The address cache holds its slot (it came from there, or a probe
    /// put it there): no insert after the fetch.
    cached: bool,
    /// The fetch round READ its lock and version before the record
    /// (the seqlock pre-read, compared after).
    pre_read: bool,
    /// Its slot came from the address cache's entry for an absent key
    /// (`TxnConfig::cache_absent`): the fetch READs only the slot's lock
    /// and version.
    hinted: bool,
    /// That slot was taken since: the address cache's absent entry is
    /// passed over and the key probed again.
    stale_hint: bool,
    /// Its probe passed over an empty slot another record of this
    /// transaction has: the empty slot it ends at is not where the key
    /// would go, so an absent key is not cached.
    passed_over: bool,
    /// A key to write of this transaction passed over this record's
    /// (empty) slot on its probe: the slot must not stay empty, or that
    /// key would be hidden behind it (see `scan_bucket`).
    passed: bool,
    /// Buckets probed so far.
    probed: u64,
    /// Its record was read.
    fetched: bool,
    /// The lock word it holds on the primary.
    locked: Option<u64>,
    /// Version word read.
    version: u64,
    /// Replica it was read from.
    replica: usize,
    new: Option<NewImage>,
}

impl Item {
    fn exists(&self) -> bool {
        self.fetched && self.slot.is_some() && Version(self.version).present()
    }
}

/// A record's handle in its transaction.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ItemId(usize);

/// A transaction in progress. Drop it only after `commit` or `abort`
/// returned: a dropped transaction's locks stay until their leases end
/// and recovery frees them.
pub struct Txn<'a> {
    c: &'a mut Coordinator,
    ctx: &'a Ctx,
    id: u64,
    items: Vec<Item>,
    logged: bool,
    /// The lease word of the undo log's first copy (recovery claims the
    /// log by breaking it), while `logged`.
    log_lease: u64,
    /// Commit writes began: from here on a failure leaves the
    /// transaction to recovery.
    writing: bool,
    done: bool,
}

impl Txn<'_> {
    /// The transaction's id.
    pub fn id(&self) -> u64 {
        self.id
    }

    fn add(&mut self, table: TableId, key: u64, mode: Mode) -> Result<ItemId, TxnError> {
        self.c.db.table(table)?;
        if self.items.len() >= self.c.db.cfg.max_items {
            return Err(TxnError::TooManyItems {
                max: self.c.db.cfg.max_items,
            });
        }
        if let Some(i) = self
            .items
            .iter()
            .position(|it| it.table == table && it.key == key)
        {
            if mode == Mode::Write && self.items[i].mode == Mode::Read {
                assert!(
                    !self.items[i].fetched,
                    "a record already read cannot become one to write"
                );
                self.items[i].mode = Mode::Write;
            }
            return Ok(ItemId(i));
        }
        // Its slot is looked up in `exec`: start loading that line now,
        // so the look-ups of a transaction's records overlap.
        self.c.cache.borrow().prefetch(table, key);
        self.items.push(Item {
            table,
            key,
            mode,
            slot: None,
            cached: false,
            pre_read: false,
            hinted: false,
            stale_hint: false,
            passed_over: false,
            passed: false,
            probed: 0,
            fetched: false,
            locked: None,
            version: 0,
            replica: 0,
            new: None,
        });
        Ok(ItemId(self.items.len() - 1))
    }

    /// Adds record `key` of `table` to read (validated at commit).
    pub fn read(&mut self, table: TableId, key: u64) -> Result<ItemId, TxnError> {
        self.add(table, key, Mode::Read)
    }

    /// Adds record `key` of `table` to write (update, insert or delete):
    /// it is locked and read.
    pub fn write(&mut self, table: TableId, key: u64) -> Result<ItemId, TxnError> {
        self.add(table, key, Mode::Write)
    }

    /// Whether the record exists (after `exec`).
    pub fn exists(&self, i: ItemId) -> bool {
        self.items[i.0].exists()
    }

    fn rec_local(&self, i: usize) -> Local {
        self.c.db.local.rec.piece(i, self.c.db.max_rec)
    }

    /// The record's payload as read (after `exec`; zeros if it does not
    /// exist).
    ///
    /// # Panics
    /// If the record was not read yet (programmer error).
    pub fn value(&self, i: ItemId) -> Vec<u8> {
        let it = &self.items[i.0];
        assert!(it.fetched, "value of a record before exec");
        let p = self.c.db.tables[it.table as usize].payload;
        if !it.exists() {
            return vec![0; p];
        }
        self.ctx.local_vec(self.rec_local(i.0).slice(8, p))
    }

    /// Word `k` of the record's payload as read.
    pub fn word(&self, i: ItemId, k: usize) -> u64 {
        let it = &self.items[i.0];
        assert!(it.fetched, "value of a record before exec");
        if !it.exists() {
            return 0;
        }
        self.ctx.local_u64(self.rec_local(i.0).slice(8 + 8 * k, 8))
    }

    /// Sets the record's new payload (created if it did not exist).
    ///
    /// # Panics
    /// If the record is not one to write (programmer error).
    pub fn put(&mut self, i: ItemId, payload: &[u8]) -> Result<(), TxnError> {
        let it = &mut self.items[i.0];
        assert_eq!(it.mode, Mode::Write, "put on a record added to read");
        let max = self.c.db.tables[it.table as usize].payload;
        if payload.len() > max {
            return Err(TxnError::ValueTooLarge {
                table: it.table,
                len: payload.len(),
                max,
            });
        }
        it.new = Some(NewImage::Put(payload.to_vec()));
        Ok(())
    }

    /// Deletes the record (its slot keeps the key, marked absent).
    pub fn delete(&mut self, i: ItemId) {
        let it = &mut self.items[i.0];
        assert_eq!(it.mode, Mode::Write, "delete of a record added to read");
        it.new = Some(NewImage::Delete);
    }

    /// A preemption point (fault injection; nothing when off).
    async fn pause(&mut self) {
        let Some(p) = self.c.preempt.as_mut() else {
            return;
        };
        match p.draw() {
            None => {}
            Some(Stall::Yield) => std::thread::yield_now(),
            Some(Stall::Thread(ns)) => std::thread::sleep(std::time::Duration::from_nanos(ns)),
            Some(Stall::Task(ns)) => self.ctx.sleep(ns).await,
        }
    }

    fn lease_word(&self) -> u64 {
        self.c.db.cfg.lease.word(self.ctx, self.c.id)
    }

    fn remote(&self, t: &TableInfo, slot: u64, r: usize, at: usize) -> Result<RemoteRef, TxnError> {
        self.c
            .db
            .remote(self.c.db.slot_addr(t, slot, r).add(at as u64))
    }

    /// Runs the rounds that read every record added since the last
    /// `exec` (probes where the slot is unknown, then locks and reads).
    /// On a conflict it releases everything, backs off and returns
    /// [`TxnError::Abort`].
    pub async fn exec(&mut self) -> Result<(), TxnError> {
        self.c.live()?;
        let r = async {
            loop {
                self.probe().await?;
                self.pause().await;
                if !self.fetch().await? {
                    return Ok(());
                }
                // An absent key's cached slot was taken: probe it again.
            }
        }
        .await;
        self.settle(r).await
    }

    /// After a failed step: releases what the transaction holds (unless its
    /// coordinator died), recovers a dead lock owner met, backs off.
    async fn settle(&mut self, r: Result<(), TxnError>) -> Result<(), TxnError> {
        let Err(e) = r else { return Ok(()) };
        if self.writing && self.c.dead.is_none() {
            self.c.dead = Some(format!("failed while writing its commit: {e}"));
        }
        if matches!(e, TxnError::Crashed(_) | TxnError::LeaseLost(_)) || self.c.dead.is_some() {
            self.done = true;
            return Err(e);
        }
        self.release().await?;
        if let TxnError::Abort(reason) = e {
            let k = AbortReason::ALL
                .iter()
                .position(|&x| x == reason)
                .unwrap_or(0);
            self.c.stats.aborts[k] += 1;
            if let Some((mut owner, tail, mut word)) = self.c.pending_recovery.take() {
                if owner == 0 {
                    // Seen dirty on a backup: the primary's lock tells.
                    let hdr = self.c.db.local.hdr.prefix(8);
                    self.ctx.read(tail, hdr);
                    self.ctx.sync().await?;
                    word = self.ctx.local_u64(hdr);
                    owner = dmkit_index::lease::owner_in(word);
                    if word == 0
                        || owner == self.c.id
                        || !self.c.db.cfg.lease.expired(self.ctx, word)
                    {
                        owner = 0;
                    }
                }
                if owner != 0 {
                    self.c.recover_lock(self.ctx, owner, tail, word).await?;
                }
            }
            self.ctx.backoff().await;
        }
        Err(e)
    }

    /// Releases locks and the log (nothing was written).
    async fn release(&mut self) -> Result<(), TxnError> {
        self.done = true;
        let db = self.c.db.clone();
        let zero = db.local.zero;
        self.ctx.set_local_u64(zero, 0);
        let mut any = false;
        for it in &mut self.items {
            if it.locked.take().is_some() {
                let t = &db.tables[it.table as usize];
                let slot = it.slot.expect("a locked record has a slot");
                let at = db.lock_ref(t, slot)?;
                self.ctx.write(at, zero);
                any = true;
            }
        }
        if self.logged {
            for k in 0..db.replicas() {
                self.ctx.write(db.remote(db.log_addr(self.c.id, k))?, zero);
            }
            self.logged = false;
            any = true;
        }
        if any {
            self.ctx.sync().await?;
        }
        Ok(())
    }

    /// Notes lock word `word` met on item `i`'s record: if its lease
    /// ended, its owner is recovered when this transaction aborts.
    fn note_lock(&mut self, i: usize, word: u64) {
        if word == 0 && self.items[i].replica != 0 {
            // A dirty record seen on a backup, which carries no lock: look
            // at the primary's lock when aborting (owner 0: unknown).
            let it = &self.items[i];
            let t = &self.c.db.tables[it.table as usize];
            if let Some(slot) = it.slot {
                if let Ok(tail) = self.remote(t, slot, 0, layout::lock_offset(t.payload)) {
                    self.c.pending_recovery = Some((0, tail, 0));
                }
            }
            return;
        }
        if word != 0 && self.c.db.cfg.lease.expired(self.ctx, word) {
            let owner = dmkit_index::lease::owner_in(word);
            let it = &self.items[i];
            let t = &self.c.db.tables[it.table as usize];
            if owner != self.c.id {
                if let Some(slot) = it.slot {
                    if let Ok(tail) = self.remote(t, slot, 0, layout::lock_offset(t.payload)) {
                        self.c.pending_recovery = Some((owner, tail, word));
                    }
                }
            }
        }
    }

    /// Round 1: bucket READs for records whose slot is unknown.
    async fn probe(&mut self) -> Result<(), TxnError> {
        let db = self.c.db.clone();
        let spb = db.cfg.slots_per_bucket;
        for i in 0..self.items.len() {
            let it = &self.items[i];
            if it.fetched || it.slot.is_some() {
                continue;
            }
            let hit = self.c.cache.borrow().lookup(it.table, it.key);
            match hit {
                Some(Cached::Slot(s)) => {
                    let it = &mut self.items[i];
                    it.slot = Some(s);
                    it.cached = true;
                }
                // A key to read that was absent, where it would go: the
                // fetch READs that slot's lock and version. Not a slot
                // another record of this transaction has (see
                // `scan_bucket`): that one probes.
                Some(Cached::Absent(s))
                    if db.cfg.cache_absent
                        && it.mode == Mode::Read
                        && !it.stale_hint
                        && !self.slot_taken_here(i, s) =>
                {
                    let it = &mut self.items[i];
                    it.slot = Some(s);
                    it.cached = true;
                    it.hinted = true;
                }
                _ => {}
            }
        }
        let mut todo = std::mem::take(&mut self.c.scratch);
        loop {
            todo.clear();
            todo.extend(
                (0..self.items.len())
                    .filter(|&i| !self.items[i].fetched && self.items[i].slot.is_none())
                    .take(PROBE_ROUND),
            );
            if todo.is_empty() {
                self.c.scratch = todo;
                return Ok(());
            }
            for (j, &i) in todo.iter().enumerate() {
                let it = &mut self.items[i];
                let t = &db.tables[it.table as usize];
                it.replica = Self::replica_for(&db.cfg, it.mode);
                let b = (db.home_bucket(t, it.table, it.key) + it.probed) % t.buckets;
                let at = db.remote(db.bucket_addr(t, b, it.replica))?;
                let dst = db.local.bkt.piece(j, spb * db.max_rec).prefix(spb * t.rec);
                self.ctx.read(at, dst);
            }
            self.ctx.sync().await?;
            for (j, &i) in todo.iter().enumerate() {
                self.scan_bucket(i, j)?;
            }
        }
    }

    /// The replica a record of `mode` is read from.
    fn replica_for(cfg: &crate::db::TxnConfig, mode: Mode) -> usize {
        if mode == Mode::Read && cfg.backup_reads && cfg.replicas > 1 {
            1
        } else {
            0
        }
    }

    /// Looks for item `i`'s key in bucket copy `j`.
    fn scan_bucket(&mut self, i: usize, j: usize) -> Result<(), TxnError> {
        let db = self.c.db.clone();
        let spb = db.cfg.slots_per_bucket;
        let it = &self.items[i];
        let t = &db.tables[it.table as usize];
        let bucket = (db.home_bucket(t, it.table, it.key) + it.probed) % t.buckets;
        let want = it.key;
        let copy = db.local.bkt.piece(j, spb * db.max_rec);
        for s in 0..spb {
            let rec = copy.slice(s * t.rec, t.rec);
            let key = self.ctx.local_u64(rec);
            let tail: RecordTail = self
                .ctx
                .get_as(rec.slice(layout::lock_offset(t.payload), 16));
            let v = Version(tail.version);
            let slot = bucket * spb as u64 + s as u64;
            let found = !v.empty() && key == want;
            if !v.empty() && !found {
                continue;
            }
            if !found && self.pass_over(i, slot) {
                continue;
            }
            // The key's slot, or the first empty one (where it would go).
            let it = &mut self.items[i];
            it.slot = Some(slot);
            if found {
                self.c.cache.borrow_mut().insert(it.table, it.key, slot);
                it.cached = true;
            }
            // (A record to read is not taken from the bucket's copy: one
            // READ cannot tell an old payload under a new version — the
            // fetch round reads it version first; see `fetch`.)
            if it.mode == Mode::Read && v.dirty() {
                self.note_lock(i, tail.lock);
                return Err(TxnError::Abort(AbortReason::Dirty));
            }
            if it.mode == Mode::Read && !found && tail.version == 0 {
                // Absent: the slot it would go to was empty and clean
                // when its version word was copied, and an empty slot has
                // no payload to tear — the key was absent at that instant,
                // as a fetch would show. No fetch round; validation
                // re-reads this slot's lock and version (an insert makes
                // it non-zero for good).
                it.fetched = true;
                it.version = 0;
                if db.cfg.cache_absent && !it.passed_over {
                    // The first empty slot on the key's path. Slots are
                    // never emptied and keys never move: while this slot
                    // stays empty, a probe of the key ends here with the
                    // same answer (see `fetch`).
                    self.c
                        .cache
                        .borrow_mut()
                        .insert_absent(it.table, it.key, slot);
                    it.cached = true;
                }
            }
            return Ok(());
        }
        let it = &mut self.items[i];
        it.probed += 1;
        if it.probed >= db.cfg.max_probe as u64 {
            if it.mode == Mode::Write {
                return Err(TxnError::Full {
                    table: it.table,
                    key: it.key,
                    probe: db.cfg.max_probe,
                });
            }
            // Absent, and no insert can place it here either.
            it.fetched = true;
            it.version = 0;
        }
        Ok(())
    }

    /// Whether item `i`'s probe passes over empty slot `slot` because
    /// another record of this transaction has it: two keys to write in one
    /// slot would lock it twice (and abort forever), and a key to read
    /// there would see the other key's insert. A key to write passes over
    /// only the slots of other keys to write, and marks them `passed`: a
    /// slot before its own on its probe path must not stay empty, so such
    /// a slot is written even if its key is not (a deleted-key record:
    /// `commit_rounds`). A key to write shares a slot that only keys read
    /// (absent) have: the slot is then ours to insert into, under our
    /// lock, which their validation accepts (`validate_round`) — passing
    /// over it would leave it empty before the inserted key.
    fn pass_over(&mut self, i: usize, slot: u64) -> bool {
        if !self.slot_taken_here(i, slot) {
            return false;
        }
        self.items[i].passed_over = true;
        let me = &self.items[i];
        if me.mode == Mode::Read {
            return true;
        }
        let (table, mut any) = (me.table, false);
        for (k, o) in self.items.iter_mut().enumerate() {
            if k != i && o.table == table && o.slot == Some(slot) && o.mode == Mode::Write {
                o.passed = true;
                any = true;
            }
        }
        if !any {
            // Only keys read absent have it: we take it (not passed over).
            self.items[i].passed_over = false;
        }
        any
    }

    /// Whether lock word `word` on `slot` of `table` is one this
    /// transaction holds.
    fn holds_lock(&self, table: TableId, slot: u64, word: u64) -> bool {
        self.items
            .iter()
            .any(|o| o.table == table && o.slot == Some(slot) && o.locked == Some(word))
    }

    /// Whether another record of this transaction, in item `i`'s table,
    /// has slot `slot` (see [`Txn::pass_over`]).
    fn slot_taken_here(&self, i: usize, slot: u64) -> bool {
        let table = self.items[i].table;
        self.items
            .iter()
            .enumerate()
            .any(|(k, o)| k != i && o.table == table && o.slot == Some(slot))
    }

    /// Round 2: lock (hitchhiked) and read every record with a known slot
    /// that was not read yet. Returns whether an absent key's cached slot
    /// was found taken (that key is to be probed again).
    ///
    /// An absent key's cached slot (`hinted`) is READ lock and version
    /// only: version 0 there says the key is absent now, exactly as a
    /// probe would — the slots before it on the key's probe path were
    /// taken by other keys when it was cached, and slots are never emptied
    /// and keys never move, so a probe would end at this empty slot too
    /// (and an empty slot has no payload to tear). Any other version: the
    /// slot was taken since (by this key or another), and the key is
    /// probed again, passing over the cached entry. Validation re-reads
    /// the slot's lock and version as for any absent key.
    async fn fetch(&mut self) -> Result<bool, TxnError> {
        let db = self.c.db.clone();
        let mut todo = std::mem::take(&mut self.c.scratch);
        todo.clear();
        todo.extend(
            (0..self.items.len())
                .filter(|&i| !self.items[i].fetched && self.items[i].slot.is_some()),
        );
        if todo.is_empty() {
            self.c.scratch = todo;
            return Ok(false);
        }
        let hitchhike = db.cfg.hitchhike;
        let locks = hitchhike && todo.iter().any(|&i| self.items[i].mode == Mode::Write);
        if locks {
            self.c.crash_here(CrashPoint::BeforeLocks)?;
        }
        // The clock is read only for a lock to take (a read costs as much
        // as a small verb on shm).
        let word = if locks { self.lease_word() } else { 0 };
        let mut cas: Vec<(usize, Ticket)> = Vec::new();
        // Records read without our lock: their lock and version are READ
        // first, then the record (one queue pair keeps the order), and the
        // two versions must agree. A version read only behind the payload
        // would let a whole commit slip in between (dirty mark, payload,
        // clean version) and pair the old payload with the new version,
        // which validation then confirms. With the version read before
        // too, equal clean versions mean no commit wrote the payload
        // meanwhile (versions only grow) — a seqlock read.
        for &i in &todo {
            let it = &mut self.items[i];
            let t = &db.tables[it.table as usize];
            let slot = it.slot.expect("filtered");
            if it.mode == Mode::Read {
                it.replica = Self::replica_for(&db.cfg, Mode::Read);
            } else {
                it.replica = 0;
                if hitchhike {
                    let lock = db.lock_ref(t, slot)?;
                    cas.push((i, self.ctx.cas(lock, 0, word)));
                }
            }
            let it = &self.items[i];
            let src = db.remote(db.slot_addr(t, slot, it.replica))?;
            if it.hinted {
                let tail = src.add(layout::lock_offset(t.payload) as u64);
                self.ctx.read(tail, db.local.hdr.piece(i, 16));
                continue;
            }
            let pre_read = !(hitchhike && it.mode == Mode::Write);
            if pre_read {
                let tail = src.add(layout::lock_offset(t.payload) as u64);
                self.ctx.read(tail, db.local.hdr.piece(i, 16));
            }
            self.ctx.read(src, self.rec_local(i).prefix(t.rec));
            self.items[i].pre_read = pre_read;
        }
        self.ctx.sync().await?;
        let mut failed = None;
        for (i, tk) in cas {
            let old = self.ctx.value(tk);
            if old == 0 {
                self.items[i].locked = Some(word);
            } else {
                self.note_lock(i, old);
                failed = Some(AbortReason::LockHeld);
            }
        }
        let mut again = false;
        for &i in &todo {
            if self.items[i].hinted {
                let tail: RecordTail = self.ctx.get_as(db.local.hdr.piece(i, 16));
                let it = &mut self.items[i];
                if tail.version == 0 {
                    it.fetched = true;
                    it.version = 0;
                } else {
                    it.slot = None;
                    it.cached = false;
                    it.hinted = false;
                    it.stale_hint = true;
                    again = true;
                }
                continue;
            }
            let t = &db.tables[self.items[i].table as usize];
            let rec = self.rec_local(i);
            let key = self.ctx.local_u64(rec);
            let tail: RecordTail = self
                .ctx
                .get_as(rec.slice(layout::lock_offset(t.payload), 16));
            let v = Version(tail.version);
            let torn = self.items[i].pre_read && {
                let first: RecordTail = self.ctx.get_as(db.local.hdr.piece(i, 16));
                first.version != tail.version
            };
            let it = &mut self.items[i];
            it.fetched = true;
            it.version = v.0;
            if torn {
                failed.get_or_insert(AbortReason::Validation);
                continue;
            }
            if v.dirty() {
                failed.get_or_insert(AbortReason::Dirty);
                self.note_lock(i, tail.lock);
                continue;
            }
            if !v.empty() && key != it.key {
                // The empty slot a probe chose was taken by another key.
                failed.get_or_insert(AbortReason::SlotTaken);
                continue;
            }
            if !v.empty() && !it.cached {
                self.c
                    .cache
                    .borrow_mut()
                    .insert(it.table, it.key, it.slot.expect("fetched"));
                it.cached = true;
            }
        }
        self.c.scratch = todo;
        match failed {
            Some(r) => Err(TxnError::Abort(r)),
            None => Ok(again),
        }
    }

    /// Aborts on the application's request: releases every lock.
    pub async fn abort(mut self) -> Result<(), TxnError> {
        if self.c.dead.is_none() {
            self.release().await?;
        }
        Ok(())
    }

    /// Validates, logs, commits and unlocks (see the module docs). On a
    /// conflict everything is released and [`TxnError::Abort`] returned.
    pub async fn commit(mut self) -> Result<(), TxnError> {
        self.c.live()?;
        if self.items.iter().any(|it| !it.fetched) {
            self.exec().await?;
        }
        self.pause().await;
        let r = self.commit_rounds().await;
        if r.is_ok() {
            self.done = true;
            self.c.stats.committed += 1;
            return Ok(());
        }
        self.settle(r).await
    }

    async fn commit_rounds(&mut self) -> Result<(), TxnError> {
        let db = self.c.db.clone();
        for it in &mut self.items {
            if it.passed && it.new.is_none() && Version(it.version).empty() {
                // Another key to write of ours passed over this empty
                // slot (`pass_over`): it must not stay empty behind that
                // key, so it gets this key's record, deleted.
                debug_assert!(it.mode == Mode::Write);
                it.new = Some(NewImage::Delete);
            }
        }
        let writes: Vec<usize> = (0..self.items.len())
            .filter(|&i| self.items[i].new.is_some())
            .collect();
        let lock_items = self.items.iter().any(|it| it.mode == Mode::Write);
        if !lock_items {
            // Read-only: validation only (none for one record on an
            // in-order fabric: see the module docs).
            if !(self.items.len() == 1 && db.in_order) {
                self.validate_round(false, &[]).await?;
            }
            self.record(&[]);
            return Ok(());
        }
        let need = 32
            + writes
                .iter()
                .map(|&i| EntryHead::bytes(db.tables[self.items[i].table as usize].payload))
                .sum::<usize>();
        if need > db.cfg.log_bytes {
            self.release().await?;
            return Err(TxnError::LogFull {
                need,
                capacity: db.cfg.log_bytes,
            });
        }
        if db.cfg.hitchhike {
            self.c.crash_here(CrashPoint::AfterLocks)?;
        } else {
            self.c.crash_here(CrashPoint::BeforeLocks)?;
        }
        self.renew_leases("validation").await?;
        self.validate_round(true, &writes).await?;
        if !db.cfg.hitchhike {
            self.c.crash_here(CrashPoint::AfterLocks)?;
        }
        if !writes.is_empty() {
            self.c.crash_here(CrashPoint::AfterLog)?;
        }
        self.pause().await;
        self.renew_leases("commit writes").await?;
        let new = self.commit_writes(&writes).await?;
        self.c.crash_here(CrashPoint::BeforeUnlock)?;
        self.pause().await;
        self.renew_leases("unlock").await?;
        self.unlock_round(&writes, &new).await?;
        self.pause().await;
        self.record(&new);
        Ok(())
    }

    /// Keeps every lease the transaction holds — its record locks' and
    /// its undo log's — long enough to publish under
    /// (`LeaseConfig::holds`): those with too little left are renewed by
    /// CAS, old word to a fresh one, all in one round (no verb when every
    /// lease holds, the common case). A CAS that fails means another
    /// client broke that lease: before the undo log is written that is a
    /// lock conflict (the breaker found the log idle and freed the lock;
    /// the transaction releases the rest and aborts); after, the breaker
    /// recovers (or recovered) the transaction from its log, so the
    /// coordinator stops for good ([`TxnError::LeaseLost`]) and writes
    /// nothing more.
    async fn renew_leases(&mut self, step: &str) -> Result<(), TxnError> {
        let db = self.c.db.clone();
        let lease = db.cfg.lease;
        let stale: Vec<usize> = (0..self.items.len())
            .filter(|&i| {
                self.items[i]
                    .locked
                    .is_some_and(|w| !lease.holds(self.ctx, w))
            })
            .collect();
        let log_stale = self.logged && !lease.holds(self.ctx, self.log_lease);
        if stale.is_empty() && !log_stale {
            return Ok(());
        }
        let fresh = self.lease_word();
        let mut cas = Vec::new();
        for &i in &stale {
            let it = &self.items[i];
            let t = &db.tables[it.table as usize];
            let lock = db.lock_ref(t, it.slot.expect("a locked record has a slot"))?;
            let old = it.locked.expect("filtered");
            cas.push((Some(i), old, self.ctx.cas(lock, old, fresh)));
        }
        if log_stale {
            let log0 = db.remote(db.log_addr(self.c.id, 0))?;
            cas.push((
                None,
                self.log_lease,
                self.ctx.cas(log0, self.log_lease, fresh),
            ));
        }
        self.ctx.sync().await?;
        let mut lost = 0;
        for (i, old, tk) in cas {
            let ok = self.ctx.value(tk) == old;
            lost += !ok as usize;
            match i {
                Some(i) if ok => self.items[i].locked = Some(fresh),
                // Not ours any more: never to be released by us.
                Some(i) => self.items[i].locked = None,
                None if ok => self.log_lease = fresh,
                None => {}
            }
        }
        if lost > 0 && !self.logged && !self.writing {
            // Nothing logged or written yet: whoever broke the lock found
            // our log idle and just freed the lock; we release the rest
            // and abort as on any lock conflict.
            return Err(TxnError::Abort(AbortReason::LockHeld));
        }
        if lost > 0 {
            let why = format!("{lost} leases broken by another client before {step}");
            self.c.dead = Some(why.clone());
            return Err(TxnError::LeaseLost(why));
        }
        Ok(())
    }

    /// Round 3: validation reads (and, without hitchhiking, the locks of
    /// records to write) plus, for a writing transaction, the undo log.
    async fn validate_round(&mut self, rw: bool, writes: &[usize]) -> Result<(), TxnError> {
        // Without hitchhiking the records to write are locked first, in a
        // round of their own: validation must read the others only once
        // every lock of ours is held (module docs, "Why it is
        // serializable"). In one doorbell, a validation READ on one node
        // could run before our CAS on another (or on the same queue pair,
        // when posted before it) — two transactions each reading what the
        // other writes would both validate (write skew; caught by the
        // serializability test under load).
        if rw {
            if let Some(r) = self.lock_round().await? {
                return Err(TxnError::Abort(r));
            }
            self.pause().await;
        }
        let db = self.c.db.clone();
        let mut checked = 0;
        for i in 0..self.items.len() {
            let it = &self.items[i];
            // Records to write are locked by now (hitchhiked, or by
            // `lock_round`; a read-only transaction has none): their
            // versions were read under the lock.
            let (Some(slot), Mode::Read) = (it.slot, it.mode) else {
                continue;
            };
            let t = &db.tables[it.table as usize];
            let hdr = db.local.hdr.piece(i, 16);
            let tail = db.lock_ref(t, slot)?;
            if db.in_order {
                self.ctx.read(tail, hdr);
            } else {
                // Lock, then version: one queue pair keeps their order.
                self.ctx.read(tail, hdr.slice(0, 8));
                self.ctx.read(tail.add(8), hdr.slice(8, 8));
            }
            checked += 1;
        }
        if rw && !writes.is_empty() {
            // (The clock only for a log to write.)
            let word = self.lease_word();
            let image = self.log_image(writes, word)?;
            for k in 0..db.replicas() {
                self.ctx.write(db.remote(db.log_addr(self.c.id, k))?, image);
            }
            self.logged = true;
            self.log_lease = word;
        }
        if checked == 0 && !self.logged {
            return Ok(());
        }
        self.ctx.sync().await?;
        let mut failed = None;
        // The records checked: the same filter as above (items do not
        // change in between).
        for i in 0..self.items.len() {
            let it = &self.items[i];
            let (Some(slot), Mode::Read) = (it.slot, it.mode) else {
                continue;
            };
            let tail: RecordTail = self.ctx.get_as(db.local.hdr.piece(i, 16));
            // A record only read must be unlocked even in a read-only
            // transaction: a writer holding its lock may already have
            // validated (serialized) before a commit we saw elsewhere —
            // unless the lock is ours: a key to write sharing the empty
            // slot of a key read absent (`pass_over`). No other writer
            // holds it then, and the version unchanged says nothing was
            // inserted there since the read.
            let foreign = tail.lock != 0 && !self.holds_lock(it.table, slot, tail.lock);
            if tail.version != it.version || foreign {
                if foreign && it.locked != Some(tail.lock) {
                    self.note_lock(i, tail.lock);
                }
                failed.get_or_insert(AbortReason::Validation);
            }
        }
        match failed {
            Some(r) => Err(TxnError::Abort(r)),
            None => Ok(()),
        }
    }

    /// Without hitchhiking: a CAS on the lock of every record to write not
    /// locked yet, each with a READ of its lock and version behind it (one
    /// queue pair keeps their order); returns why to abort if a lock was
    /// held or a version changed (the locks taken are released with the
    /// transaction).
    async fn lock_round(&mut self) -> Result<Option<AbortReason>, TxnError> {
        let db = self.c.db.clone();
        let word = self.lease_word();
        let mut cas: Vec<(usize, Ticket)> = Vec::new();
        for i in 0..self.items.len() {
            let it = &self.items[i];
            let (Some(slot), Mode::Write, None) = (it.slot, it.mode, it.locked) else {
                continue;
            };
            let t = &db.tables[it.table as usize];
            let tail = db.lock_ref(t, slot)?;
            cas.push((i, self.ctx.cas(tail, 0, word)));
            self.ctx
                .read(tail.add(8), db.local.hdr.piece(i, 16).slice(8, 8));
        }
        if cas.is_empty() {
            return Ok(None);
        }
        self.ctx.sync().await?;
        let mut failed = None;
        for (i, tk) in cas {
            let old = self.ctx.value(tk);
            if old == 0 {
                self.items[i].locked = Some(word);
                let v = self.ctx.local_u64(db.local.hdr.piece(i, 16).slice(8, 8));
                if v != self.items[i].version {
                    failed.get_or_insert(AbortReason::Validation);
                }
            } else {
                self.note_lock(i, old);
                failed = Some(AbortReason::LockHeld);
            }
        }
        Ok(failed)
    }

    /// Writes the undo log's image to the task's log region.
    fn log_image(&self, writes: &[usize], word: u64) -> Result<Local, TxnError> {
        let db = &self.c.db;
        let log = db.local.log;
        let head = LogHeader {
            lease: word,
            txn: self.id,
            state: LogState::Logged as u64,
            entries: writes.len() as u64,
        };
        self.ctx.put_as(log, &head);
        let mut at = 32;
        for &i in writes {
            let it = &self.items[i];
            let t = &db.tables[it.table as usize];
            let e = EntryHead::new(
                it.table,
                t.payload,
                it.slot.expect("a written record has a slot"),
                it.version,
                self.new_version(i).0,
            );
            self.ctx.put_as(log.slice(at, 32), &e);
            let mut old = self.ctx.local_vec(self.rec_local(i).prefix(8 + t.payload));
            // The key word: the record's key, also for an empty slot
            // (whose key word means nothing), so that a roll-back of an
            // insert leaves the key deleted there, not the slot empty
            // (`recovery`).
            old[..8].copy_from_slice(&it.key.to_le_bytes());
            self.ctx.put_local(log.slice(at + 32, old.len()), &old);
            at += EntryHead::bytes(t.payload);
        }
        Ok(log.prefix(at))
    }

    /// The clean version word item `i` commits.
    fn new_version(&self, i: usize) -> Version {
        let it = &self.items[i];
        let old = Version(it.version);
        let absent = matches!(it.new, Some(NewImage::Delete));
        Version::make(old.number() + 1, absent)
    }

    /// Round 4: per written record and replica, the dirty mark then the
    /// new key and payload. Returns the new version words.
    async fn commit_writes(&mut self, writes: &[usize]) -> Result<Vec<Version>, TxnError> {
        let db = self.c.db.clone();
        let mut new = Vec::new();
        let mut posts: Vec<(usize, usize)> = Vec::new();
        for (w, &i) in writes.iter().enumerate() {
            let v = self.new_version(i);
            new.push(v);
            let it = &self.items[i];
            let t = &db.tables[it.table as usize];
            self.ctx
                .set_local_u64(db.local.ver.piece(w, 8), v.dirtied().0);
            let rec = self.rec_local(i);
            self.ctx.set_local_u64(rec, it.key);
            if let Some(NewImage::Put(p)) = &it.new {
                let mut img = p.clone();
                img.resize(t.payload, 0);
                self.ctx.put_local(rec.slice(8, t.payload), &img);
            }
            for r in 0..db.replicas() {
                posts.push((w, r));
            }
        }
        // Backups first, then primaries, unless coalescent.
        posts.sort_by_key(|&(_, r)| {
            if db.cfg.coalescent_commit {
                0
            } else {
                (r == 0) as usize
            }
        });
        self.writing = true;
        let mid = self.c.arm(CrashPoint::MidCommit);
        let cut = if mid {
            // Half, rounded down: with one write, none lands (a cut
            // after the last would not crash at all).
            posts.len() / 2
        } else {
            usize::MAX
        };
        let mut last_backup = !db.cfg.coalescent_commit;
        for (k, &(w, r)) in posts.iter().enumerate() {
            if k == cut {
                self.ctx.post();
                self.ctx.sync().await?;
                return Err(TxnError::Crashed(CrashPoint::MidCommit));
            }
            if last_backup && r == 0 {
                // The backups' writes are done before any primary's.
                self.ctx.sync().await?;
                last_backup = false;
            }
            let i = writes[w];
            let it = &self.items[i];
            let t = &db.tables[it.table as usize];
            let slot = it.slot.expect("written");
            self.ctx.write(
                self.remote(t, slot, r, layout::version_offset(t.payload))?,
                db.local.ver.piece(w, 8),
            );
            self.ctx.write(
                self.remote(t, slot, r, 0)?,
                self.rec_local(i).prefix(8 + t.payload),
            );
        }
        self.ctx.sync().await?;
        Ok(new)
    }

    /// Round 5: clean versions on every replica, then free the primary's
    /// lock; the log's lease word is cleared behind (not awaited).
    async fn unlock_round(&mut self, writes: &[usize], new: &[Version]) -> Result<(), TxnError> {
        let db = self.c.db.clone();
        let zero = db.local.zero;
        self.ctx.set_local_u64(zero, 0);
        for (w, &i) in writes.iter().enumerate() {
            let it = &self.items[i];
            let t = &db.tables[it.table as usize];
            let slot = it.slot.expect("written");
            let src = db.local.unl.piece(w, 8);
            self.ctx.set_local_u64(src, new[w].0);
            for r in (1..db.replicas()).rev() {
                // A backup's clean version by CAS from this commit's dirty
                // word: the primary's lock below may be free before this
                // lands (another queue pair, another node), and a late
                // plain WRITE would then overwrite the next commit's
                // version (a backup left one version behind its primary,
                // with the newer payload — seen under load).
                let _ = self.ctx.cas(
                    self.remote(t, slot, r, layout::version_offset(t.payload))?,
                    new[w].dirtied().0,
                    new[w].0,
                );
            }
            // The primary's, then its lock (one queue pair keeps the order).
            self.ctx.write(
                self.remote(t, slot, 0, layout::version_offset(t.payload))?,
                src,
            );
        }
        for it in &mut self.items {
            if it.locked.take().is_some() {
                let t = &db.tables[it.table as usize];
                let slot = it.slot.expect("locked");
                self.ctx.write(db.lock_ref(t, slot)?, zero);
            }
        }
        self.ctx.sync().await?;
        if self.logged {
            for k in 0..db.replicas() {
                self.ctx.write(db.remote(db.log_addr(self.c.id, k))?, zero);
            }
            self.ctx.post();
            self.logged = false;
        }
        Ok(())
    }

    /// Adds the committed transaction to the history, if recorded.
    fn record(&mut self, new: &[Version]) {
        let Some(h) = &mut self.c.history else { return };
        let mut rec = TxnRecord {
            id: self.id,
            ..Default::default()
        };
        let mut w = 0;
        for it in &self.items {
            let Some(slot) = it.slot else { continue };
            rec.reads
                .push((it.table, slot, Version(it.version).number()));
            if it.new.is_some() {
                rec.writes.push((it.table, slot, new[w].number()));
                w += 1;
            }
        }
        h.push(rec);
    }
}

impl Drop for Txn<'_> {
    fn drop(&mut self) {
        debug_assert!(
            self.done
                || self.items.iter().all(|it| it.locked.is_none())
                || std::thread::panicking(),
            "a transaction holding locks was dropped without commit or abort"
        );
        // Its item list goes back to the coordinator for the next one.
        self.c.spare_items = std::mem::take(&mut self.items);
    }
}
