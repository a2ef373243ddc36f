//! Read delegation and write combining (SMART OSDI'23 §4.2), per compute
//! machine.
//!
//! Concurrent operations on one key from the clients of one compute
//! machine (every task of every worker there) share a *window*: the first task to arrive (the leader) records
//! the key and runs the operation remotely; tasks that arrive while the
//! window is open join it instead of issuing their own verbs. Reads and
//! writes share the table and one window per key, as the paper requires
//! (a read never joins a write's window or vice versa — it runs on its
//! own, like the paper's hash-conflict case — so a read that follows a
//! write can never be answered by an older read).
//!
//! The table is the paper's hash-indexed array of local locks with a
//! "unique key" per lock: `SLOTS` slots, each behind its own mutex, each
//! holding at most one open window and the key it is for. A key whose slot
//! holds another key's window is the paper's "hash conflict": the task
//! runs alone. Tasks on different keys therefore share no lock (one table
//! mutex made every operation of every thread queue on one cache line). A
//! window is opened or joined under its slot's lock, and a window's own
//! mutex guards its value and outcome (a slot's lock is never taken while
//! holding a window's).
//!
//! ## When a window closes (linearizability)
//! - **Write combining**: joiners deposit their value in the window (the
//!   write-combining buffer; the latest wins) and wait. The leader takes
//!   the value and closes the window just before it posts the write-back,
//!   so every joiner's invocation precedes the WRITE that carries its value
//!   and the joiner returns after it completed: the combined updates
//!   linearize together at that WRITE, joiners first. If the leader finds
//!   the key absent, joiners run their update themselves (the leader's
//!   verdict may predate them).
//! - **Read delegation**: the window closes just before the leader posts
//!   the READ of the leaf. Joiners adopt only a found value — that READ
//!   executed after they joined. Absence (decided by an earlier read of an
//!   internal node) makes joiners search themselves. With a warm cache the
//!   leader posts its leaf READ without yielding, so the window only opens
//!   long enough to matter when the leader has to traverse remotely.
//!
//! Joiners wait by polling their window (a short sleep of their own
//! worker's clock between looks), so a joiner and its leader may run on
//! different threads: no cross-thread wake-ups are needed.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

/// What a window is for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Kind {
    Read,
    Write,
}

/// What joiners learn when the leader is done.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Outcome {
    /// The leader's search found this value in a READ after the joiners came.
    Found(Vec<u8>),
    /// The leader's write-back carried the joiners' (latest) value.
    Written,
    /// Joiners must run their operation themselves.
    Redo,
}

#[derive(Debug)]
pub(crate) struct Window {
    pub kind: Kind,
    pub open: bool,
    /// Write: the latest value deposited (the leader's own at first).
    pub value: Vec<u8>,
    pub joined: u32,
    pub outcome: Option<Outcome>,
}

/// A window, shared by its leader, its joiners and the table.
#[derive(Debug, Clone)]
pub(crate) struct Shared(Arc<Mutex<Window>>);

impl Shared {
    /// The window's state (a poisoned lock is taken over: a window holds
    /// plain data and every writer leaves it consistent).
    pub fn lock(&self) -> MutexGuard<'_, Window> {
        self.0.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// Slots of a machine's table. With at most a few hundred tasks per
/// machine (the simulator's 24 threads x 4 tasks) a different key sits in
/// one's slot a few percent of the time at most.
pub(crate) const SLOTS: usize = 4096;

/// One machine's windows, in [`SLOTS`] hash-indexed slots. A slot keeps
/// its last window for reuse, so the common case — nobody else on the
/// key — allocates nothing.
pub(crate) struct Table(Box<[Slot]>);

/// One lock of the table, on its own cache line.
#[derive(Default)]
#[repr(align(64))]
struct Slot {
    state: Mutex<SlotState>,
    /// Whether a window sits in the slot (a hint read without the lock:
    /// see [`Table::quiet`]).
    busy: AtomicBool,
}

#[derive(Default)]
struct SlotState {
    /// The open (or not yet left) window and its key.
    key: Vec<u8>,
    window: Option<Shared>,
    /// A window no one holds any more, for the next leader here.
    spare: Option<Shared>,
}

impl Default for Table {
    fn default() -> Self {
        Self((0..SLOTS).map(|_| Slot::default()).collect())
    }
}

fn key_hash(key: &[u8]) -> u64 {
    dmkit_runtime::hash::hash64(key, 0x5D0C_A7E5)
}

/// The role a task takes for its operation on a key.
pub(crate) enum Role {
    /// Run the operation and publish through this window.
    Lead(Shared),
    /// Wait on this window.
    Join(Shared),
    /// A window of the other kind, or closed: run on your own.
    Alone,
}

impl Table {
    /// The slot of `key` (a poisoned lock is taken over: every writer
    /// leaves a slot consistent).
    fn slot(&self, key: &[u8]) -> (MutexGuard<'_, SlotState>, &AtomicBool) {
        let s = self.slot_of(key);
        (s.state.lock().unwrap_or_else(|p| p.into_inner()), &s.busy)
    }

    fn slot_of(&self, key: &[u8]) -> &Slot {
        let h = key_hash(key);
        // The high bits: the hash's low bits also pick RACE's buckets.
        &self.0[(h >> 32) as usize % SLOTS]
    }

    /// Whether `key`'s slot holds no window, read without its lock. A
    /// search that needs no remote traversal (its cached path reaches the
    /// leaf slot) has nothing to share — it posts its leaf READ before any
    /// joiner could arrive — so when its slot is quiet it runs alone and
    /// leaves the table untouched: the machine's threads then share no
    /// line per search. A stale answer is harmless: running alone is
    /// always allowed (the hash-conflict case), and a busy slot only sends
    /// the search through [`Table::enter`].
    pub fn quiet(&self, key: &[u8]) -> bool {
        !self.slot_of(key).busy.load(Ordering::Relaxed)
    }

    /// Opens a window for `key` or joins the open one of the same kind.
    pub fn enter(&self, key: &[u8], kind: Kind, value: &[u8]) -> Role {
        let (mut t, busy) = self.slot(key);
        if let Some(w) = &t.window {
            let mut b = w.lock();
            if t.key == key && b.kind == kind && b.open {
                b.joined += 1;
                if kind == Kind::Write {
                    b.value.clear();
                    b.value.extend_from_slice(value);
                }
                drop(b);
                return Role::Join(w.clone());
            }
            return Role::Alone;
        }
        let w = t.spare.take().unwrap_or_else(|| {
            Shared(Arc::new(Mutex::new(Window {
                kind,
                open: true,
                value: Vec::new(),
                joined: 0,
                outcome: None,
            })))
        });
        {
            let mut b = w.lock();
            b.kind = kind;
            b.open = true;
            b.value.clear();
            b.value.extend_from_slice(value);
            b.joined = 0;
            b.outcome = None;
        }
        t.key.clear();
        t.key.extend_from_slice(key);
        t.window = Some(w.clone());
        busy.store(true, Ordering::Relaxed);
        Role::Lead(w)
    }

    /// The leader is done: publish `outcome` and drop the window (kept for
    /// reuse once no joiner holds it). `outcome` is only built when someone
    /// joined (a closed window admits no one, so nobody else will look).
    pub fn leave(&self, key: &[u8], w: &Shared, outcome: impl FnOnce() -> Outcome) {
        {
            let mut b = w.lock();
            b.open = false;
            b.outcome = (b.joined > 0).then(outcome);
        }
        let (mut t, busy) = self.slot(key);
        if t.window.as_ref().is_some_and(|m| Arc::ptr_eq(&m.0, &w.0)) {
            let m = t.window.take().expect("present");
            busy.store(false, Ordering::Relaxed);
            // The caller's handle and this one: nobody else waits on it.
            if Arc::strong_count(&m.0) == 2 {
                t.spare = Some(m);
            }
        }
    }
}

/// Closes `w` (if given) and returns the value to write: the latest one
/// deposited, or `own`.
pub(crate) fn close_take(w: Option<&Shared>, own: &[u8]) -> Vec<u8> {
    match w {
        Some(w) => {
            let mut b = w.lock();
            b.open = false;
            b.value.clone()
        }
        None => own.to_vec(),
    }
}

/// Closes `w` (if given) without taking anything.
pub(crate) fn close(w: Option<&Shared>) {
    if let Some(w) = w {
        w.lock().open = false;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn windows_admit_their_own_kind_while_open() {
        let t = Table::default();
        let Role::Lead(w) = t.enter(b"k", Kind::Write, b"1") else {
            panic!("first task leads")
        };
        assert!(matches!(t.enter(b"k", Kind::Write, b"2"), Role::Join(_)));
        assert!(matches!(t.enter(b"k", Kind::Read, b""), Role::Alone));
        assert!(matches!(t.enter(b"j", Kind::Read, b""), Role::Lead(_)));
        assert_eq!(
            close_take(Some(&w), b"1"),
            b"2".to_vec(),
            "the latest value wins"
        );
        assert!(
            matches!(t.enter(b"k", Kind::Write, b"3"), Role::Alone),
            "closed"
        );
        assert!(!t.quiet(b"k"), "a window sits in the slot");
        t.leave(b"k", &w, || Outcome::Written);
        assert!(t.quiet(b"k"), "left");
        assert_eq!(w.lock().outcome, Some(Outcome::Written));
        assert!(matches!(t.enter(b"k", Kind::Write, b"4"), Role::Lead(_)));
    }

    #[test]
    fn a_key_whose_slot_holds_another_keys_window_runs_alone() {
        let slot = |k: &[u8]| (key_hash(k) >> 32) as usize % SLOTS;
        let a = 0u64.to_be_bytes();
        let b = (1u64..)
            .map(u64::to_be_bytes)
            .find(|b| slot(b) == slot(&a))
            .expect("a colliding key");
        let t = Table::default();
        let Role::Lead(w) = t.enter(&a, Kind::Read, b"") else {
            panic!("first task leads")
        };
        assert!(matches!(t.enter(&b, Kind::Read, b""), Role::Alone));
        assert!(matches!(t.enter(&a, Kind::Read, b""), Role::Join(_)));
        t.leave(&a, &w, || Outcome::Redo);
        // The window is still held by the joiner: not recycled, and the
        // slot is free for the other key.
        assert!(matches!(t.enter(&b, Kind::Read, b""), Role::Lead(_)));
    }
}
