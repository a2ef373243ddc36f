//! Sherman's hierarchical on-chip lock (HOCL; Wang et al., SIGMOD'22 §4.2,
//! summarised in OSDI'23 §2.2 and SwordBox §2.3): node locks live in a lock
//! table on each memory node (in on-NIC device memory when the fabric has
//! it — atomics there skip the host's PCIe, SwordBox §3.2 Fig. 4), and each
//! compute machine keeps a local lock table with one entry per remote lock
//! word, so the machine's clients queue locally instead of retrying CAS
//! over the network. When a holder releases a lock another local client is
//! waiting for, it hands the remote lock over without releasing it, at
//! most `max_handover` times in a row (fairness to other machines).
//!
//! The local table is a ticket lock per entry. Waiters sleep on the
//! runtime's clock (other tasks of the worker run meanwhile), so it works
//! for tasks on one worker, workers on several OS threads, and virtual
//! threads of the simulator alike.

use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};

use dmkit_runtime::{Ctx, Nanos};

use crate::layout::LOCK_WORDS;

/// How long a local waiter sleeps between looks at its entry, per waiter
/// ahead of it (ns), and at most.
const LOCAL_WAIT_NS: Nanos = 300;
const LOCAL_WAIT_MAX_NS: Nanos = 20_000;

#[derive(Default)]
struct Entry {
    next: AtomicU32,
    serving: AtomicU32,
    /// The remote lock is held for the machine (handed over).
    handed: AtomicBool,
    handovers: AtomicU32,
}

/// A compute machine's local lock table for one tree: one entry per remote
/// lock word of every memory node.
pub struct LocalLocks {
    entries: Vec<Entry>,
    max_handover: u32,
}

/// What acquiring a local entry gave.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LocalGrant {
    pub(crate) index: usize,
    /// The previous local holder handed the remote lock over: no CAS needed.
    pub handed: bool,
}

impl LocalLocks {
    /// A table for `nodes` memory nodes.
    pub fn new(nodes: usize, max_handover: u32) -> Self {
        let n = nodes * LOCK_WORDS as usize;
        Self {
            entries: (0..n).map(|_| Entry::default()).collect(),
            max_handover,
        }
    }

    /// Waits for local entry `index` (node position × LOCK_WORDS + word).
    pub async fn acquire(&self, ctx: &Ctx, index: usize) -> LocalGrant {
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
        LocalGrant {
            index,
            handed: e.handed.load(Ordering::Acquire),
        }
    }

    /// Decides, before the release, whether the remote lock goes to the
    /// next local waiter (`true`: do not release it remotely).
    pub fn hand_over(&self, g: LocalGrant) -> bool {
        let e = &self.entries[g.index];
        let waiting = e
            .next
            .load(Ordering::Acquire)
            .wrapping_sub(e.serving.load(Ordering::Acquire))
            > 1;
        let keep = waiting && e.handovers.load(Ordering::Relaxed) < self.max_handover;
        if keep {
            e.handovers.fetch_add(1, Ordering::Relaxed);
        } else {
            e.handovers.store(0, Ordering::Relaxed);
        }
        e.handed.store(keep, Ordering::Release);
        keep
    }

    /// Gives the local entry up without passing on a remote lock (the
    /// holder failed before it knew it held one): the next local waiter
    /// takes the remote lock itself.
    pub fn abandon(&self, g: LocalGrant) {
        let e = &self.entries[g.index];
        e.handovers.store(0, Ordering::Relaxed);
        e.handed.store(false, Ordering::Release);
        self.release(g);
    }

    /// Passes the local entry on (after the remote release, if any, is
    /// posted).
    pub fn release(&self, g: LocalGrant) {
        self.entries[g.index].serving.fetch_add(1, Ordering::AcqRel);
    }
}
