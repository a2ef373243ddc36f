//! A single-threaded driver playing every worker of a store, in a fixed
//! order: the deterministic way to run the store (tests, trace replays).

use std::sync::atomic::Ordering;
use std::sync::Arc;

use super::config::{Op, OpResult, StoreConfig};
use super::worker::{Store, Worker};
use crate::node::MemNode;

/// A store and all its workers, stepped by one thread.
#[derive(Debug)]
pub struct Cluster {
    /// The store does not keep its node alive; the driver does.
    node: Arc<MemNode>,
    store: Store,
    workers: Vec<Worker>,
}

impl Cluster {
    /// A store on `node` with `cfg.workers` workers.
    pub fn new(node: Arc<MemNode>, cfg: StoreConfig) -> Result<Self, String> {
        let (store, workers) = Store::new(&node, cfg)?;
        Ok(Cluster {
            node,
            store,
            workers,
        })
    }

    /// The store.
    pub fn store(&self) -> &Store {
        &self.store
    }

    /// Number of workers.
    pub fn workers(&self) -> usize {
        self.workers.len()
    }

    /// Worker `w` (to inspect it).
    pub fn worker(&self, w: usize) -> &Worker {
        &self.workers[w]
    }

    /// Serves `op` on worker `w`, stepping every worker (in index order)
    /// until it finished. Work it started (a compaction it triggered) may
    /// still be running: [`Cluster::settle`] finishes it.
    pub fn call(&mut self, w: usize, op: Op) -> OpResult {
        let t = self.workers[w].start(op);
        loop {
            if let Some(r) = self.workers[w].take(t) {
                return r;
            }
            self.step();
        }
    }

    /// Steps every worker once; whether anything happened.
    pub fn step(&mut self) -> bool {
        let mut progress = false;
        for wk in &mut self.workers {
            progress |= wk.step();
        }
        progress
    }

    /// Steps until no message is in flight and every worker is idle.
    pub fn settle(&mut self) {
        loop {
            let progress = self.step();
            let quiet = self.store.sh.in_flight.load(Ordering::Acquire) == 0
                && self.workers.iter().all(Worker::idle);
            if quiet && !progress {
                return;
            }
        }
    }

    /// Settles, then runs the structural checker.
    pub fn check(&mut self) -> Result<(), String> {
        self.settle();
        let ws: Vec<&Worker> = self.workers.iter().collect();
        self.store.check(&ws)
    }

    /// The node the store lives on.
    pub fn node(&self) -> &Arc<MemNode> {
        &self.node
    }

    /// The workers, to run them on threads (each with [`Worker::call`] and
    /// [`Worker::step`]); the caller keeps the node alive while it uses
    /// them.
    pub fn into_parts(self) -> (Arc<MemNode>, Store, Vec<Worker>) {
        (self.node, self.store, self.workers)
    }
}
