//! Compaction (CoRM §3.1.2–§3.1.4, §3.5), led by one worker.
//!
//! 1. **Trigger** (§3.1.3): a class's fragmentation ratio over the policy's
//!    threshold (checked after frees), an allocation that found no memory
//!    (every class), or a request ([`super::Op::Compact`]). One compaction
//!    runs at a time.
//! 2. **Block collection** (§3.1.4): the leader asks every other worker for
//!    its not-full blocks of the classes (at most `collect_max_fill` full);
//!    each answers with the blocks themselves — the metadata moves in the
//!    message, so a block keeps exactly one owner — and forwards later
//!    requests for them to the leader. The leader takes ownership (updates
//!    the directory) when the blocks arrive.
//! 3. **Merging**, least-utilised source first: for the emptiest block `A`,
//!    the fullest block `B` with room for `A`'s objects and no id in common
//!    (offset-based classes: no offset in common) absorbs it (among the
//!    first `candidates_per_source` with room); a source no block can take
//!    is set aside. A merge:
//!    - marks `A`'s addresses *moving* in the directory (odd sequence);
//!    - locks each of `A`'s objects (header's compaction bit: one-sided
//!      readers retry, writers wait);
//!    - copies each object into `B` — at its own offset when that slot of
//!      `B` is free, else at a random free slot (its pointers become
//!      indirect) — still locked, and merges the id → slot metadata and the
//!      per-address home counts;
//!    - remaps every address of `A` onto `B`'s memory in the node's
//!      translation table (page by page, ascending; a reader mid-remap sees
//!      each page before or after, and either way finds the object locked
//!      or finds another object's id);
//!    - unlocks the copies, ends the moving mark, returns `A`'s memory to
//!      the OS, and releases `A`'s addresses no live object is homed at.
//!
//! The leader keeps the merged blocks (as CoRM's leader does). A policy's
//! `max_merges` ends the compaction once that many sources were merged
//! away (CoRM §4.3.2's "upper bound on the number of compacted blocks").

use std::collections::HashSet;
use std::sync::atomic::Ordering;
use std::time::Instant;

use super::block::{Block, Obj};
use super::config::{CompactionReport, ObjError, Reply};
use super::layout::{ObjHeader, LOCK_COMPACT, LOCK_WRITE};
use super::worker::{Job, Msg, Origin, Step, Worker};

/// What started a compaction.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Trigger {
    Threshold,
    AllocFailure,
    Manual,
}

/// A compaction this worker leads.
#[derive(Debug)]
pub(crate) struct Compaction {
    round: u64,
    classes: Vec<u8>,
    next_class: usize,
    failed: HashSet<u64>,
    /// Collection answers still expected.
    waiting: usize,
    report_to: Option<Origin>,
    report: CompactionReport,
    t0: Instant,
    merging: bool,
}

impl Worker {
    /// [`super::Op::Compact`]: starts a compaction this worker leads, which
    /// answers the operation when it ends; starts after the one running, if any.
    pub(crate) fn compact_op(&mut self, job: &mut Job, classes: Option<Vec<u8>>) -> Step {
        let n = self.sh.classes.len();
        let classes = classes.unwrap_or_else(|| (0..n as u8).collect());
        if let Some(&c) = classes.iter().find(|&&c| c as usize >= n) {
            return Step::Done(Err(ObjError::Forged(format!("no size class {c}"))));
        }
        if self.start_compaction(classes, Trigger::Manual, Some(job.origin())) {
            Step::Forwarded
        } else {
            Step::WaitCompaction
        }
    }

    /// Starts a compaction of `classes` (the compactable ones) led by this
    /// worker; false if one already runs.
    pub(crate) fn start_compaction(
        &mut self,
        classes: Vec<u8>,
        why: Trigger,
        report_to: Option<Origin>,
    ) -> bool {
        let sh = self.sh.clone();
        if sh
            .compacting
            .compare_exchange(false, true, Ordering::AcqRel, Ordering::Acquire)
            .is_err()
        {
            return false;
        }
        let classes: Vec<u8> = classes
            .into_iter()
            .filter(|&c| sh.policies[c as usize].compact)
            .collect();
        let ev = &sh.acct.ev;
        ev.compactions.fetch_add(1, Ordering::Relaxed);
        match why {
            Trigger::Threshold => &ev.triggers_threshold,
            Trigger::AllocFailure => &ev.triggers_alloc_failure,
            Trigger::Manual => &ev.triggers_manual,
        }
        .fetch_add(1, Ordering::Relaxed);
        let round = sh.rounds.fetch_add(1, Ordering::Relaxed);
        let workers = sh.cfg.workers as u8;
        let mut waiting = 0;
        if !classes.is_empty() {
            for w in (0..workers).filter(|&w| w != self.id) {
                self.send(
                    w,
                    Msg::Collect {
                        round,
                        leader: self.id,
                        classes: classes.clone(),
                        max_fill: sh.cfg.policy.collect_max_fill,
                    },
                );
                waiting += 1;
            }
        }
        let own: u64 = classes
            .iter()
            .map(|&c| self.not_full[c as usize].len() as u64)
            .sum();
        self.compaction = Some(Compaction {
            round,
            classes,
            next_class: 0,
            failed: HashSet::new(),
            waiting,
            report_to,
            report: CompactionReport {
                blocks_collected: own,
                ..Default::default()
            },
            t0: Instant::now(),
            merging: false,
        });
        true
    }

    /// A leader's collection request: give it the not-full blocks asked for.
    pub(crate) fn give_blocks(&mut self, round: u64, leader: u8, classes: &[u8], max_fill: f64) {
        let mut out = Vec::new();
        for &c in classes {
            let listed: Vec<(u32, u64)> = self.not_full[c as usize].iter().copied().collect();
            for (free, p) in listed {
                if self.blocks[&p].fill() > max_fill {
                    continue;
                }
                self.not_full[c as usize].remove(&(free, p));
                out.push(self.blocks.remove(&p).expect("listed blocks exist"));
                self.forward.insert(p, leader);
            }
        }
        self.send(leader, Msg::Collected { round, blocks: out });
    }

    /// Blocks a worker sent this leader: take ownership.
    pub(crate) fn absorb(&mut self, round: u64, blocks: Vec<Block>) {
        let n = blocks.len() as u64;
        for b in blocks {
            self.adopt(b);
        }
        // Blocks are never dropped, even for a round that is over.
        if let Some(cj) = self.compaction.as_mut().filter(|cj| cj.round == round) {
            cj.waiting -= 1;
            cj.report.blocks_collected += n;
        }
    }

    fn adopt(&mut self, b: Block) {
        let sh = &self.sh;
        for &vb in b.vbs.keys() {
            let d = sh.space.dir(vb);
            sh.space.set_dir(
                vb,
                super::space::Dir {
                    owner: self.id,
                    ..d
                },
            );
        }
        self.forward.remove(&b.primary);
        if !b.is_full() {
            self.not_full[b.class as usize].insert((b.free_slots(), b.primary));
        }
        self.blocks.insert(b.primary, b);
    }

    /// Advances the compaction this worker leads; true if it did anything.
    pub(crate) fn compaction_step(&mut self) -> bool {
        let sh = self.sh.clone();
        let Some(cj) = self.compaction.as_mut() else {
            return false;
        };
        if cj.waiting > 0 {
            return false;
        }
        if !cj.merging {
            cj.merging = true;
            cj.report.collection_ns = cj.t0.elapsed().as_nanos() as u64;
        }
        let t = Instant::now();
        let limit = match sh.cfg.policy.merges_per_step {
            0 => usize::MAX,
            n => n,
        };
        let mut done = 0;
        let bound = match sh.cfg.policy.max_merges {
            0 => u64::MAX,
            n => n as u64,
        };
        while done < limit {
            let cj = self.compaction.as_mut().expect("running");
            // Every class done, or the policy's bound on merges reached.
            let next = cj
                .classes
                .get(cj.next_class)
                .filter(|_| cj.report.blocks_freed < bound);
            let Some(&c) = next else {
                let ns = t.elapsed().as_nanos() as u64;
                self.compaction
                    .as_mut()
                    .expect("running")
                    .report
                    .compaction_ns += ns;
                self.finish_compaction();
                return true;
            };
            // The least utilised block not set aside…
            let a = self.not_full[c as usize]
                .iter()
                .rev()
                .map(|&(_, p)| p)
                .find(|p| !cj.failed.contains(p));
            let Some(a) = a else {
                self.class_done(c);
                continue;
            };
            // …into the fullest one that can take it.
            let need = self.blocks[&a].count();
            let src = &self.blocks[&a];
            let tries = match sh.cfg.policy.candidates_per_source {
                0 => usize::MAX,
                n => n,
            };
            let b = self.not_full[c as usize]
                .range((need, 0)..)
                .map(|&(_, p)| p)
                .filter(|&p| p != a && !cj.failed.contains(&p))
                .take(tries)
                .find(|&p| self.blocks[&p].can_absorb(src));
            match b {
                Some(b) => {
                    if !self.merge(a, b) {
                        // An object of `a` stayed write-locked: set it aside.
                        let cj = self.compaction.as_mut().expect("running");
                        cj.failed.insert(a);
                        cj.report.merge_failures += 1;
                    }
                }
                None => {
                    let cj = self.compaction.as_mut().expect("running");
                    cj.failed.insert(a);
                    cj.report.merge_failures += 1;
                }
            }
            done += 1;
        }
        let ns = t.elapsed().as_nanos() as u64;
        self.compaction
            .as_mut()
            .expect("running")
            .report
            .compaction_ns += ns;
        true
    }

    fn class_done(&mut self, c: u8) {
        let sh = &self.sh;
        let live = sh.acct.class(c).live_objects.load(Ordering::Relaxed);
        let slots = sh.class(c).slots as u64;
        sh.rearm[c as usize].store(live.saturating_sub(slots), Ordering::Relaxed);
        let cj = self.compaction.as_mut().expect("running");
        cj.next_class += 1;
        cj.failed.clear();
    }

    fn finish_compaction(&mut self) {
        let cj = self.compaction.take().expect("running");
        let ev = &self.sh.acct.ev;
        let r = &cj.report;
        ev.blocks_collected
            .fetch_add(r.blocks_collected, Ordering::Relaxed);
        ev.blocks_compacted
            .fetch_add(r.blocks_freed, Ordering::Relaxed);
        ev.merge_failures
            .fetch_add(r.merge_failures, Ordering::Relaxed);
        ev.objects_moved
            .fetch_add(r.objects_moved, Ordering::Relaxed);
        ev.objects_kept.fetch_add(r.objects_kept, Ordering::Relaxed);
        ev.compaction_ns
            .fetch_add(r.compaction_ns, Ordering::Relaxed);
        ev.collection_ns
            .fetch_add(r.collection_ns, Ordering::Relaxed);
        self.sh.compacting.store(false, Ordering::Release);
        if let Some(o) = cj.report_to {
            self.complete(o, Ok(Reply::Compacted(cj.report)));
        }
    }

    /// Merges block `a` into block `b` (both this worker's, same class).
    /// Returns false, with both blocks as they were, when an object of `a`
    /// stays write-locked past [`super::worker::BUSY_TIMEOUT`]: a writer
    /// descheduled that long still holds it, and taking the object anyway
    /// would copy a torn image, keep the write bit set in the copy for good,
    /// or let the late writer's bytes land in whatever reuses the old slot.
    fn merge(&mut self, a: u64, b: u64) -> bool {
        let sh = self.sh.clone();
        let space = &sh.space;
        let mut src = self.blocks.remove(&a).expect("owned");
        let mut dst = self.blocks.remove(&b).expect("owned");
        let c = src.class;
        debug_assert!(dst.can_absorb(&src));
        self.not_full[c as usize].remove(&(src.free_slots(), a));
        self.not_full[c as usize].remove(&(dst.free_slots(), b));
        let vbs: Vec<u64> = src.vbs.keys().copied().collect();
        // Moving: scanners of these addresses scan again.
        for &vb in &vbs {
            space.bump_seq(vb);
        }
        let mut objs: Vec<(u16, Obj)> = src.objects.iter().map(|(&i, &o)| (i, o)).collect();
        objs.sort_unstable_by_key(|(_, o)| o.slot);
        for (k, (_, o)) in objs.iter().enumerate() {
            if !self.lock_for_compaction(sh.slot_offset(a, c, o.slot)) {
                for (_, o) in &objs[..k] {
                    sh.mem
                        .clear_bits(sh.slot_offset(a, c, o.slot), LOCK_COMPACT);
                }
                // Nothing moved: close the move the sequence announced.
                for &vb in &vbs {
                    space.bump_seq(vb);
                }
                for (blk, at) in [(&src, a), (&dst, b)] {
                    if !blk.is_full() {
                        self.not_full[c as usize].insert((blk.free_slots(), at));
                    }
                }
                self.blocks.insert(a, src);
                self.blocks.insert(b, dst);
                return false;
            }
        }
        for &vb in &vbs {
            dst.vbs.entry(vb).or_insert(0);
        }
        let size = sh.class(c).slot_size as usize;
        let mut img = vec![0u8; size];
        let mut copies = Vec::with_capacity(objs.len());
        let cj = self.compaction.as_mut().expect("running");
        for (id, o) in objs {
            let slot = if dst.slot_used(o.slot) {
                cj.report.objects_moved += 1;
                dst.random_free_slot(&mut self.rng)
            } else {
                cj.report.objects_kept += 1;
                o.slot
            };
            let to = sh.slot_offset(b, c, slot);
            sh.mem.read(sh.slot_offset(a, c, o.slot), &mut img);
            sh.mem.write_body_descending(to, &img);
            let h = ObjHeader(u64::from_ne_bytes(img[..8].try_into().expect("8 bytes")));
            sh.mem.store(to, h.with_lock(LOCK_COMPACT).0);
            src.remove(id);
            dst.insert(id, Obj { slot, ..o });
            copies.push(to);
        }
        cj.report.blocks_freed += 1;
        self.work.merges += 1;
        self.work.pages_remapped += vbs.len() as u64 * space.pages();
        self.work.bytes_copied += copies.len() as u64 * size as u64;
        for &vb in &vbs {
            space.alias(vb, b);
            let d = space.dir(vb);
            space.set_dir(
                vb,
                super::space::Dir {
                    block: b,
                    owner: self.id,
                    ..d
                },
            );
        }
        for to in copies {
            sh.mem.clear_bits(to, LOCK_COMPACT);
        }
        for &vb in &vbs {
            space.bump_seq(vb);
        }
        space.free_frame(a);
        sh.acct.block_removed(c);
        let empty: Vec<u64> = vbs.iter().copied().filter(|vb| dst.vbs[vb] == 0).collect();
        if !dst.is_full() {
            self.not_full[c as usize].insert((dst.free_slots(), b));
        }
        self.blocks.insert(b, dst);
        for vb in empty {
            self.release_vb(b, vb);
        }
        true
    }

    /// The threshold trigger (§3.1.3), checked after a free of class `c`.
    pub(crate) fn maybe_trigger(&mut self, c: u8) {
        let sh = self.sh.clone();
        let Some(threshold) = sh.cfg.policy.threshold else {
            return;
        };
        if !sh.policies[c as usize].compact || sh.compacting.load(Ordering::Acquire) {
            return;
        }
        let k = sh.acct.class(c);
        if k.blocks.load(Ordering::Relaxed) < 2
            || k.live_objects.load(Ordering::Relaxed) > sh.rearm[c as usize].load(Ordering::Relaxed)
            || sh.acct.fragmentation(c) <= threshold
        {
            return;
        }
        self.start_compaction(vec![c], Trigger::Threshold, None);
    }

    /// Sets the compaction bit of the header at `off`, waiting out a write
    /// in progress on another worker; false if the write lock is still
    /// held after [`super::worker::BUSY_TIMEOUT`].
    fn lock_for_compaction(&self, off: u64) -> bool {
        let mem = &self.sh.mem;
        let t = Instant::now();
        loop {
            let h = mem.load(off).unwrap_or(0);
            if h & LOCK_WRITE != 0 {
                if t.elapsed() >= super::worker::BUSY_TIMEOUT {
                    return false;
                }
                std::hint::spin_loop();
                continue;
            }
            if mem.cas(off, h, h | LOCK_COMPACT).is_ok() {
                return true;
            }
        }
    }
}
