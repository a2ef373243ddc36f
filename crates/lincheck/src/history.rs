//! Recording histories from concurrent clients.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;

use crate::model::{MapOp, MapRet};

/// One operation of a history. Times are positions in one global order of
/// events that respects real time (an invocation recorded after a return
/// happened after it).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Record<K, V> {
    /// The client (thread or task) that issued the operation; shown in
    /// reports, the check itself orders by time only.
    pub client: u32,
    /// The key the operation touched; the check runs key by key (a map is
    /// linearizable iff each key is).
    pub key: K,
    /// The operation and its argument.
    pub op: MapOp<V>,
    /// Logical time of the invocation, from the recorder's global counter
    /// (starts at 1).
    pub invoked: u64,
    /// `None` for a pending operation (no return observed).
    pub returned: Option<(u64, MapRet<V>)>,
}

/// Handle of an invoked operation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Event(usize);

/// Records invocations and returns from many threads.
pub struct Recorder<K, V> {
    clock: AtomicU64,
    records: Mutex<Vec<Record<K, V>>>,
}

impl<K: Clone, V: Clone> Default for Recorder<K, V> {
    fn default() -> Self {
        Self::new()
    }
}

impl<K: Clone, V: Clone> Recorder<K, V> {
    /// An empty history.
    pub fn new() -> Self {
        Self {
            clock: AtomicU64::new(1),
            records: Mutex::new(Vec::new()),
        }
    }

    fn tick(&self) -> u64 {
        self.clock.fetch_add(1, Ordering::SeqCst)
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Vec<Record<K, V>>> {
        self.records.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Records an invocation; call just before issuing the operation.
    pub fn invoke(&self, client: u32, key: K, op: MapOp<V>) -> Event {
        let mut r = self.lock();
        let invoked = self.tick();
        r.push(Record {
            client,
            key,
            op,
            invoked,
            returned: None,
        });
        Event(r.len() - 1)
    }

    /// Records a return; call just after the operation completed.
    pub fn ret(&self, e: Event, result: MapRet<V>) {
        let t = self.tick();
        self.lock()[e.0].returned = Some((t, result));
    }

    /// The history so far.
    pub fn history(&self) -> Vec<Record<K, V>> {
        self.lock().clone()
    }
}
