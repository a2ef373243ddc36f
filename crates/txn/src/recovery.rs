//! Recovery of a dead coordinator's transaction from its undo log.
//!
//! A coordinator that dies (or stalls past its leases) leaves its record
//! locks, perhaps dirty records, and its undo log (`layout`). Whoever
//! meets one of its expired locks recovers it before going on — the rule
//! of `dmkit_index::lease`: who breaks an expired lease repairs what the
//! holder left half-done — and [`Database::recover_all`] does it for every
//! coordinator at once (after a crash, before checks).
//!
//! 1. **Claim** the log: CAS its lease word, expired, to the recoverer's
//!    own (a live owner's log is never taken; two recoverers: one wins,
//!    the other backs off). The claim is the recoverer's authority over
//!    every record the log names whose lock still holds the dead owner's
//!    word: no one else touches those without recovering the log first.
//! 2. **Decide** (state `logged`): the transaction is *visible* iff some
//!    replica of some logged record holds a clean version at least the
//!    new one — it began unlocking, which it does only after every commit
//!    write on every replica was done. Visible: roll forward; otherwise
//!    roll back (it may have been half written; no one read it: dirty
//!    records are never read). The decision is written to the log before
//!    anything is changed, so a recoverer that dies is followed by one
//!    that does the same.
//! 3. **Apply**, for each record still locked by the dead owner: forward
//!    cleans the dirty version on every replica (and, for a record already
//!    unlocked, a backup the unlock had not reached yet, by CAS); back writes the old key
//!    and payload and then a *new* version (old + 2: versions never
//!    return to a value a reader may have validated against) on every
//!    replica touched or not, so the replicas end byte-identical. An
//!    insert into an empty slot goes back to its key, deleted — not to an
//!    empty slot: while it was dirty, another key's probe may have passed
//!    over it and that key been inserted further on, which an empty slot
//!    would hide from every later probe (the log's image of an empty slot
//!    carries the inserted key for this). Then the primary's lock is
//!    freed.
//! 4. **Clear** the log.
//!
//! A dead owner's locks that its log does not name (it died before
//! logging) guard records it never wrote: once its log is settled they
//! are simply broken (CAS of the seen word back to 0).

use std::sync::Arc;

use dmkit_fabric::RemoteRef;
use dmkit_runtime::{Ctx, Worker};

use crate::check::Restore;
use crate::db::{Database, TableId};
use crate::error::TxnError;
use crate::layout::{self, EntryHead, LogHeader, LogState, RecordTail, Version};
use crate::txn::Coordinator;

/// What a recovery of one coordinator's log found and did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Recovered {
    /// Its log held nothing to recover.
    Nothing,
    /// Its owner's lease has not ended, or another client is recovering it.
    Busy,
    /// Its transaction was rolled back.
    RolledBack {
        /// The transaction.
        txn: u64,
    },
    /// Its transaction was rolled forward (it had become visible).
    RolledForward {
        /// The transaction.
        txn: u64,
    },
}

struct Entry {
    head: EntryHead,
    /// Offset of its old key and payload in the log image.
    image: usize,
}

impl Coordinator {
    /// Recovers coordinator `owner`'s logged transaction, if its lease
    /// ended (see the module docs).
    pub async fn recover_owner(&mut self, ctx: &Ctx, owner: u16) -> Result<Recovered, TxnError> {
        let db = self.db.clone();
        if owner == 0 || owner as u32 > db.cfg.max_coordinators || owner == self.id {
            return Ok(Recovered::Nothing);
        }
        let l = db.local;
        let log0 = db.remote(db.log_addr(owner, 0))?;
        ctx.read(log0, l.log.prefix(32));
        ctx.sync().await?;
        let head: LogHeader = ctx.get_as(l.log.prefix(32));
        if head.lease == 0 {
            return Ok(Recovered::Nothing);
        }
        // The log's lease word is broken as every index lock is
        // (`LeaseConfig::break_expired`: only once it ran out, one CAS,
        // one breaker wins).
        let mine = db.cfg.lease.word(ctx, self.id);
        if !db
            .cfg
            .lease
            .break_expired(ctx, log0, head.lease, mine)
            .await?
        {
            return Ok(Recovered::Busy);
        }
        // The log is ours: read all of it.
        ctx.read(log0, l.log);
        ctx.sync().await?;
        let head: LogHeader = ctx.get_as(l.log.prefix(32));
        let entries = self.parse_log(ctx, &head, log0)?;
        let dead = [owner, dmkit_index::lease::owner_in(head.lease)];
        let state = LogState::from_word(head.state).ok_or(TxnError::Corrupt {
            addr: log0.addr,
            what: "undo log state",
        })?;
        let decision = match state {
            LogState::Idle => None,
            LogState::Logged => {
                let visible = self.read_states(ctx, &entries).await?.1;
                let d = if visible {
                    LogState::RollForward
                } else {
                    LogState::RollBack
                };
                ctx.set_local_u64(l.unl, d as u64);
                for k in 0..db.replicas() {
                    ctx.write(db.remote(db.log_addr(owner, k))?.add(16), l.unl.prefix(8));
                }
                ctx.sync().await?;
                Some(d)
            }
            d => Some(d),
        };
        if let Some(d) = decision {
            self.apply(ctx, &entries, d, &dead).await?;
        }
        // Clear the log (every copy).
        let cleared = LogHeader {
            txn: head.txn,
            ..Default::default()
        };
        ctx.put_as(l.log.prefix(32), &cleared);
        for k in 0..db.replicas() {
            ctx.write(db.remote(db.log_addr(owner, k))?, l.log.prefix(32));
        }
        ctx.sync().await?;
        self.stats.recovered += 1;
        Ok(match decision {
            None => Recovered::Nothing,
            Some(LogState::RollForward) => Recovered::RolledForward { txn: head.txn },
            Some(_) => Recovered::RolledBack { txn: head.txn },
        })
    }

    /// Recovers `owner` (met through an expired lock `word` on the record
    /// whose tail is `tail`), then breaks that lock if it still guards a
    /// clean record.
    pub(crate) async fn recover_lock(
        &mut self,
        ctx: &Ctx,
        owner: u16,
        tail: RemoteRef,
        word: u64,
    ) -> Result<(), TxnError> {
        if self.recover_owner(ctx, owner).await? == Recovered::Busy {
            return Ok(());
        }
        let hdr = self.db.local.hdr.prefix(16);
        ctx.read(tail, hdr);
        ctx.sync().await?;
        let t: RecordTail = ctx.get_as(hdr);
        if t.lock == word && !Version(t.version).dirty() {
            // Its owner is recovered: the expired lock is broken straight
            // to free (nothing is left to repair under it).
            self.db.cfg.lease.break_expired(ctx, tail, word, 0).await?;
        }
        Ok(())
    }

    fn parse_log(
        &self,
        ctx: &Ctx,
        head: &LogHeader,
        at: RemoteRef,
    ) -> Result<Vec<Entry>, TxnError> {
        let db = &self.db;
        let corrupt = TxnError::Corrupt {
            addr: at.addr,
            what: "undo log",
        };
        if head.entries as usize > db.cfg.max_items {
            return Err(corrupt);
        }
        let mut out = Vec::new();
        let mut off = 32;
        for _ in 0..head.entries {
            if off + 32 > db.cfg.log_bytes {
                return Err(corrupt);
            }
            let e: EntryHead = ctx.get_as(db.local.log.slice(off, 32));
            let t = db
                .tables
                .get(e.table_id() as usize)
                .ok_or(TxnError::Corrupt {
                    addr: at.addr,
                    what: "undo log entry (unknown table)",
                })?;
            if e.payload() != t.payload
                || e.slot >= t.slots(db.cfg.slots_per_bucket)
                || off + EntryHead::bytes(t.payload) > db.cfg.log_bytes
            {
                return Err(corrupt);
            }
            out.push(Entry {
                head: e,
                image: off + 32,
            });
            off += EntryHead::bytes(t.payload);
        }
        Ok(out)
    }

    fn tail_ref(&self, e: &EntryHead, r: usize) -> Result<RemoteRef, TxnError> {
        let t = &self.db.tables[e.table_id() as usize];
        self.db.remote(
            self.db
                .slot_addr(t, e.slot, r)
                .add(layout::lock_offset(t.payload) as u64),
        )
    }

    /// Reads every entry's primary lock and every replica's version
    /// (entry `i`, replica `r`: word `r` of record buffer `i`; the lock
    /// in validation buffer `i`). Returns them and whether the
    /// transaction is visible.
    async fn read_states(
        &self,
        ctx: &Ctx,
        entries: &[Entry],
    ) -> Result<(Vec<(u64, Vec<Version>)>, bool), TxnError> {
        let db = &self.db;
        let reps = db.replicas();
        assert!(
            reps * 8 <= db.max_rec,
            "replica versions fit a record buffer"
        );
        for (i, e) in entries.iter().enumerate() {
            for r in 0..reps {
                let tail = self.tail_ref(&e.head, r)?;
                if r == 0 {
                    ctx.read(tail, db.local.hdr.piece(i, 16).prefix(8));
                }
                ctx.read(
                    tail.add(8),
                    db.local.rec.piece(i, db.max_rec).slice(8 * r, 8),
                );
            }
        }
        ctx.sync().await?;
        let mut visible = false;
        let mut out = Vec::new();
        for (i, e) in entries.iter().enumerate() {
            let lock = ctx.local_u64(db.local.hdr.piece(i, 16));
            let vs: Vec<Version> = (0..reps)
                .map(|r| Version(ctx.local_u64(db.local.rec.piece(i, db.max_rec).slice(8 * r, 8))))
                .collect();
            let new = Version(e.head.new).number();
            visible |= vs.iter().any(|v| !v.dirty() && v.number() >= new);
            out.push((lock, vs));
        }
        Ok((out, visible))
    }

    /// Rolls every record still locked by a dead owner forward or back,
    /// then frees their locks.
    async fn apply(
        &mut self,
        ctx: &Ctx,
        entries: &[Entry],
        d: LogState,
        dead: &[u16; 2],
    ) -> Result<(), TxnError> {
        let db = self.db.clone();
        let (states, _) = self.read_states(ctx, entries).await?;
        let mut held = Vec::new();
        for (i, (e, (lock, vs))) in entries.iter().zip(&states).enumerate() {
            if *lock == 0 || !dead.contains(&dmkit_index::lease::owner_in(*lock)) {
                // Settled already (released, or restored and freed) — but
                // an unlock writes backups and the primary on different
                // queue pairs, which complete in any order: the primary
                // may be clean and free while a backup is still dirty.
                // Clean such a backup by CAS, so a later writer's version
                // there is never overwritten.
                if d == LogState::RollForward {
                    let new = Version(e.head.new);
                    for (r, v) in vs.iter().enumerate().skip(1) {
                        if *v == new.dirtied() {
                            ctx.cas(self.tail_ref(&e.head, r)?.add(8), v.0, new.0);
                        }
                    }
                }
                continue;
            }
            held.push(i);
            let t = &db.tables[e.head.table_id() as usize];
            let new = Version(e.head.new);
            let src = db.local.ver.piece(i, 8);
            if d == LogState::RollForward {
                ctx.set_local_u64(src, new.0);
                for (r, v) in vs.iter().enumerate() {
                    if *v == new.dirtied() {
                        ctx.write(self.tail_ref(&e.head, r)?.add(8), src);
                    }
                }
                continue;
            }
            let old = Version(e.head.old);
            if vs.iter().all(|v| *v == old) {
                continue; // never written
            }
            // An insert into an empty slot is rolled back to its key,
            // deleted (the log's image carries the key): a probe of
            // another key may have passed over the slot while it was
            // dirty and put that key further on, so it must not become
            // empty again.
            let restored = Version::make(new.number() + 1, old.absent() || old.empty());
            ctx.set_local_u64(src, restored.0);
            let image = db.local.log.slice(e.image, 8 + t.payload);
            for r in 0..db.replicas() {
                let rec = db.remote(db.slot_addr(t, e.head.slot, r))?;
                ctx.write(rec, image);
                ctx.write(self.tail_ref(&e.head, r)?.add(8), src);
            }
            self.restored.push(Restore {
                table: e.head.table_id() as TableId,
                slot: e.head.slot,
                version: restored.number(),
                same_as: old.number(),
            });
        }
        ctx.sync().await?;
        let zero = db.local.zero;
        ctx.set_local_u64(zero, 0);
        for i in held {
            ctx.write(self.tail_ref(&entries[i].head, 0)?, zero);
        }
        ctx.sync().await?;
        Ok(())
    }
}

/// What [`Database::recover_all`] did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RecoveryReport {
    /// Transactions rolled back.
    pub rolled_back: Vec<u64>,
    /// Transactions rolled forward.
    pub rolled_forward: Vec<u64>,
    /// Locks of dead owners that guarded unwritten records, broken.
    pub locks_broken: u64,
    /// Version restorations (for the serializability checker).
    pub restored: Vec<Restore>,
    /// Logs whose owner's lease had not ended (skipped).
    pub busy: Vec<u16>,
}

impl Database {
    /// The recovery pass on a real fabric (shm, verbs): recovers every
    /// coordinator's log whose lease ended ([`recover_logs`], on a worker
    /// of its own on the calling thread, as a coordinator with a fresh
    /// id), then breaks the expired locks left on clean records
    /// ([`Database::break_stale_locks`]). Call it when the coordinators
    /// that might hold locks are dead and their leases (plus the skew)
    /// have passed.
    pub fn recover_all(self: &Arc<Self>) -> Result<RecoveryReport, TxnError> {
        let cache = crate::txn::addr_cache();
        let mut coord = self.coordinator(&cache)?;
        let mut w = Worker::builder(self.fabric().as_ref())
            .local(self.local_layout())
            .build()?;
        let out = std::rc::Rc::new(std::cell::RefCell::new(None));
        let o = out.clone();
        let owners = self.coordinators_taken()?;
        w.spawn(move |ctx| async move {
            let r = recover_logs(&mut coord, &ctx, owners).await;
            *o.borrow_mut() = Some(r);
        });
        w.run();
        let r = out.borrow_mut().take().expect("the recovery task finished");
        let mut rep = r?;
        let now = dmkit_runtime::Clock::now(&dmkit_runtime::MonotonicClock);
        rep.locks_broken = self.break_stale_locks(now, &rep.busy)?;
        Ok(rep)
    }

    /// Breaks every lock whose lease ended more than the skew before
    /// `now` (the clients' clock) on a clean record, unless its owner is
    /// in `busy` (its log not settled): such a lock guards nothing
    /// written. Control path, for a quiescent database after
    /// [`recover_logs`].
    pub fn break_stale_locks(
        &self,
        now: dmkit_runtime::Nanos,
        busy: &[u16],
    ) -> Result<u64, TxnError> {
        let mut n = 0;
        let skew_us = self.cfg.lease.skew / 1000;
        for t in 0..self.tables.len() {
            let info = &self.tables[t];
            for row in self.scan(t as TableId)? {
                let (owner, deadline_us) = dmkit_runtime::lock::unpack(row.lock);
                if row.lock == 0
                    || row.version.dirty()
                    || now / 1000 <= deadline_us + skew_us
                    || busy.contains(&owner)
                {
                    continue;
                }
                let at = self
                    .slot_addr(info, row.slot, 0)
                    .add(layout::lock_offset(info.payload) as u64);
                let mut qp = self.home.sync_qp(at.node(), 64)?;
                if qp.cas(at, self.home.rkey(at.node())?, row.lock, 0)? == row.lock {
                    n += 1;
                }
            }
        }
        Ok(n)
    }
}

/// Recovers the logs of coordinators `1..=owners`
/// ([`Database::coordinators_taken`]) whose lease ended, as `coord` on
/// task `ctx` (any backend; on the simulator, spawn it on a virtual
/// thread). The report's `locks_broken` is left 0: break the stale locks
/// after with [`Database::break_stale_locks`].
pub async fn recover_logs(
    coord: &mut Coordinator,
    ctx: &Ctx,
    owners: u16,
) -> Result<RecoveryReport, TxnError> {
    let mut rep = RecoveryReport::default();
    for owner in 1..=owners {
        match coord.recover_owner(ctx, owner).await? {
            Recovered::RolledBack { txn } => rep.rolled_back.push(txn),
            Recovered::RolledForward { txn } => rep.rolled_forward.push(txn),
            Recovered::Busy => rep.busy.push(owner),
            Recovered::Nothing => {}
        }
    }
    rep.restored = std::mem::take(&mut coord.restored);
    Ok(rep)
}
