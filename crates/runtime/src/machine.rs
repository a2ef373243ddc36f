//! State shared by the clients of one compute machine.
//!
//! Some techniques coordinate every thread of a compute node, not only the
//! tasks of one worker: Sherman's hierarchical lock table (HOCL), SMART-BT's
//! speculative-lookup cache, the radix tree's read-delegation and
//! write-combining windows (OSDI'23 §4.2), and both trees' caches of
//! internal nodes. A data structure keeps one table
//! per machine in a [`PerMachine`] and hands it to each client made for
//! that machine. On shm every client of a process is machine 0; the
//! simulator numbers its compute machines.
//!
//! [`TicketLocks`] is the local half of a hierarchical lock: a machine's
//! clients queue on a local ticket lock per remote lock word, and a holder
//! can hand the remote lock to the next local waiter without releasing it
//! (Sherman's HOCL; the hash table's hot area, memory-semantics §IV-B).

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use crate::clock::Nanos;
use crate::ctx::Ctx;

/// One `T` per compute machine, made on first use.
pub struct PerMachine<T>(Mutex<HashMap<usize, Arc<T>>>);

impl<T> Default for PerMachine<T> {
    fn default() -> Self {
        Self(Mutex::default())
    }
}

impl<T> PerMachine<T> {
    /// Machine `machine`'s table, made by `make` if it has none yet.
    pub fn get(&self, machine: usize, make: impl FnOnce() -> T) -> Arc<T> {
        self.0
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .entry(machine)
            .or_insert_with(|| Arc::new(make()))
            .clone()
    }
}

/// How long a local waiter sleeps between looks at its entry, per waiter
/// ahead of it (ns), and at most.
const LOCAL_WAIT_NS: Nanos = 300;
const LOCAL_WAIT_MAX_NS: Nanos = 20_000;

#[derive(Default)]
struct Ticket {
    next: AtomicU32,
    serving: AtomicU32,
    /// The remote lock is held for the machine (handed over).
    handed: AtomicBool,
    handovers: AtomicU32,
    /// The remote lock word as its holder last wrote it (its lease), for
    /// the local waiter it is handed to.
    word: AtomicU64,
    /// Which remote lock the handed-over word holds, when one entry stands
    /// for several remote locks (a hashed table; 0 when unused).
    tag: AtomicU64,
}

/// A compute machine's local lock table: one ticket lock per remote lock
/// word. Waiters sleep on the runtime's clock (other tasks of the worker
/// run meanwhile), so it works for tasks on one worker, workers on several
/// OS threads, and virtual threads of the simulator alike.
pub struct TicketLocks {
    entries: Vec<Ticket>,
    max_handover: u32,
}

/// What acquiring a local entry gave.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TicketGrant {
    /// The entry.
    pub index: usize,
    /// The previous local holder handed the remote lock over: no CAS needed.
    pub handed: bool,
    /// With `handed`: the remote lock word as the previous holder left it
    /// ([`TicketLocks::set_word`]; its lease, which the new holder renews
    /// when too little of it is left). 0 otherwise.
    pub word: u64,
    /// With `handed`: the tag of the remote lock handed over
    /// ([`TicketLocks::set_tag`]). An entry that stands for several remote
    /// locks (hashed) may be handed a lock other than the one the new
    /// holder came for: it must then release that one itself. 0 otherwise.
    pub tag: u64,
}

impl TicketLocks {
    /// A table of `n` entries; a remote lock passes between local holders
    /// at most `max_handover` times in a row.
    pub fn new(n: usize, max_handover: u32) -> Self {
        Self {
            entries: (0..n).map(|_| Ticket::default()).collect(),
            max_handover,
        }
    }

    /// Waits for local entry `index`.
    pub async fn acquire(&self, ctx: &Ctx, index: usize) -> TicketGrant {
        let e = &self.entries[index];
        let t = e.next.fetch_add(1, Ordering::AcqRel);
        loop {
            let ahead = t.wrapping_sub(e.serving.load(Ordering::Acquire));
            if ahead == 0 {
                break;
            }
            // Waiters further back look less often (each holder keeps
            // the lock for about a round trip).
            ctx.sleep((LOCAL_WAIT_NS * ahead as Nanos).min(LOCAL_WAIT_MAX_NS))
                .await;
        }
        let handed = e.handed.load(Ordering::Acquire);
        let held = |v: &AtomicU64| if handed { v.load(Ordering::Acquire) } else { 0 };
        TicketGrant {
            index,
            handed,
            word: held(&e.word),
            tag: held(&e.tag),
        }
    }

    /// Decides, before the release, whether the remote lock goes to the
    /// next local waiter (`true`: do not release it remotely).
    pub fn hand_over(&self, g: TicketGrant) -> bool {
        self.hand_over_if(g, true)
    }

    /// [`TicketLocks::hand_over`], with the holder's own condition `allow`
    /// (e.g. "my write-back buffer is not full"): the lock is handed over
    /// only if `allow`, someone waits, and the hand-over budget is not spent.
    pub fn hand_over_if(&self, g: TicketGrant, allow: bool) -> bool {
        let e = &self.entries[g.index];
        let keep = allow
            && self.contended(g.index)
            && e.handovers.load(Ordering::Relaxed) < self.max_handover;
        if keep {
            e.handovers.fetch_add(1, Ordering::Relaxed);
        } else {
            e.handovers.store(0, Ordering::Relaxed);
        }
        e.handed.store(keep, Ordering::Release);
        keep
    }

    /// Gives the local entry up without passing on a remote lock (the
    /// holder failed before it knew it held one, or released it): the next
    /// local waiter takes the remote lock itself.
    pub fn abandon(&self, g: TicketGrant) {
        let e = &self.entries[g.index];
        e.handovers.store(0, Ordering::Relaxed);
        e.handed.store(false, Ordering::Release);
        self.release(g);
    }

    /// Passes the local entry on (after the remote release, if any, is
    /// posted).
    pub fn release(&self, g: TicketGrant) {
        self.entries[g.index].serving.fetch_add(1, Ordering::AcqRel);
    }

    /// Records the remote lock word the holder of entry `index` holds (taken
    /// or renewed), so a local waiter it is handed to knows its lease.
    pub fn set_word(&self, index: usize, word: u64) {
        self.entries[index].word.store(word, Ordering::Release);
    }

    /// Records which remote lock the holder of entry `index` holds (e.g. its
    /// address), for a table whose entries each stand for several remote
    /// locks: the local waiter it is handed to checks it is the one it came
    /// for ([`TicketGrant::tag`]).
    pub fn set_tag(&self, index: usize, tag: u64) {
        self.entries[index].tag.store(tag, Ordering::Release);
    }

    /// Whether another local client waits behind the holder of `index`.
    pub fn contended(&self, index: usize) -> bool {
        let e = &self.entries[index];
        e.next
            .load(Ordering::Acquire)
            .wrapping_sub(e.serving.load(Ordering::Acquire))
            > 1
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_table_per_machine() {
        let p = PerMachine::<u32>::default();
        let a = p.get(0, || 1);
        let b = p.get(0, || 2);
        let c = p.get(1, || 3);
        assert!(Arc::ptr_eq(&a, &b));
        assert_eq!((*a, *c), (1, 3));
    }
}
