//! Per-worker statistics, merged on demand (no global mutable counters).
//!
//! Verbs and bytes are counted when a task queues a request; a round trip is
//! one `sync` that waited for at least one posted batch. An operation scope
//! ([`crate::Ctx::op`]) attributes what happens inside it to a named
//! high-level operation (search, insert, …) with an HDR latency histogram.

use std::collections::BTreeMap;

use hdrhistogram::Histogram;

use crate::clock::Nanos;

/// Counters of verbs and their effects.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Counters {
    /// READ requests queued, one per request (a scatter/gather READ counts
    /// once).
    pub reads: u64,
    /// WRITE requests queued, one per request (a scatter/gather WRITE counts
    /// once).
    pub writes: u64,
    /// CAS requests queued, masked CAS included; each is signaled.
    pub cas: u64,
    /// FAA requests queued; each is signaled.
    pub faa: u64,
    /// Bytes the queued READs fetch from remote memory (payload only, no
    /// headers).
    pub bytes_read: u64,
    /// Bytes the queued WRITEs store to remote memory (payload only, no
    /// headers).
    pub bytes_written: u64,
    /// Batches handed to a queue pair (one doorbell each).
    pub doorbells: u64,
    /// `sync` calls that waited for posted work.
    pub round_trips: u64,
    /// CAS issued through `backoff_cas` that did not succeed.
    pub cas_failures: u64,
    /// Retries reported by data structures (`Ctx::note_retry`) plus failed
    /// `backoff_cas`.
    pub retries: u64,
    /// Nanoseconds spent in backoff sleeps.
    pub backoff_ns: u64,
    /// Posts deferred because credits were short.
    pub throttled_posts: u64,
    /// RPCs started ([`crate::Ctx::call`]; each one round trip through a
    /// memory node's CPU, counted apart from the verbs' `round_trips`).
    pub rpc_calls: u64,
    /// Request bytes the RPCs sent.
    pub rpc_bytes_sent: u64,
    /// Reply bytes the RPCs received.
    pub rpc_bytes_received: u64,
    /// RPCs that ended in a failure.
    pub rpc_failures: u64,
    /// RPCs that waited in the worker for room in their channel.
    pub rpc_throttled: u64,
}

impl Counters {
    /// Verbs of all kinds.
    pub fn verbs(&self) -> u64 {
        self.reads + self.writes + self.cas + self.faa
    }

    /// Adds `o` into `self`.
    pub fn merge(&mut self, o: &Counters) {
        self.reads += o.reads;
        self.writes += o.writes;
        self.cas += o.cas;
        self.faa += o.faa;
        self.bytes_read += o.bytes_read;
        self.bytes_written += o.bytes_written;
        self.doorbells += o.doorbells;
        self.round_trips += o.round_trips;
        self.cas_failures += o.cas_failures;
        self.retries += o.retries;
        self.backoff_ns += o.backoff_ns;
        self.throttled_posts += o.throttled_posts;
        self.rpc_calls += o.rpc_calls;
        self.rpc_bytes_sent += o.rpc_bytes_sent;
        self.rpc_bytes_received += o.rpc_bytes_received;
        self.rpc_failures += o.rpc_failures;
        self.rpc_throttled += o.rpc_throttled;
    }

    /// `self − earlier`, field by field.
    pub fn since(&self, e: &Counters) -> Counters {
        Counters {
            reads: self.reads - e.reads,
            writes: self.writes - e.writes,
            cas: self.cas - e.cas,
            faa: self.faa - e.faa,
            bytes_read: self.bytes_read - e.bytes_read,
            bytes_written: self.bytes_written - e.bytes_written,
            doorbells: self.doorbells - e.doorbells,
            round_trips: self.round_trips - e.round_trips,
            cas_failures: self.cas_failures - e.cas_failures,
            retries: self.retries - e.retries,
            backoff_ns: self.backoff_ns - e.backoff_ns,
            throttled_posts: self.throttled_posts - e.throttled_posts,
            rpc_calls: self.rpc_calls - e.rpc_calls,
            rpc_bytes_sent: self.rpc_bytes_sent - e.rpc_bytes_sent,
            rpc_bytes_received: self.rpc_bytes_received - e.rpc_bytes_received,
            rpc_failures: self.rpc_failures - e.rpc_failures,
            rpc_throttled: self.rpc_throttled - e.rpc_throttled,
        }
    }
}

/// Statistics of one named operation.
#[derive(Debug, Clone)]
pub struct OpStats {
    /// Operations of this name that finished (their scope ended).
    pub count: u64,
    /// What the operations did, summed.
    pub counters: Counters,
    /// Latency in nanoseconds.
    pub latency: Histogram<u64>,
}

impl OpStats {
    pub(crate) fn new() -> Self {
        Self {
            count: 0,
            counters: Counters::default(),
            // 1 ns .. 100 s at 2 significant digits (1 % resolution).
            latency: Histogram::new_with_bounds(1, 100_000_000_000, 2)
                .expect("valid histogram bounds"),
        }
    }

    /// Records one finished operation.
    pub fn record(&mut self, latency: Nanos, c: &Counters) {
        self.count += 1;
        self.counters.merge(c);
        let _ = self.latency.record(latency.clamp(1, 100_000_000_000));
    }

    /// Adds `o` into `self`.
    pub fn merge(&mut self, o: &OpStats) {
        self.count += o.count;
        self.counters.merge(&o.counters);
        // Same bounds on both sides: cannot fail.
        self.latency
            .add(&o.latency)
            .expect("histograms share bounds");
    }

    /// A per-operation average of a counter.
    pub fn per_op(&self, f: impl Fn(&Counters) -> u64) -> f64 {
        if self.count == 0 {
            0.0
        } else {
            f(&self.counters) as f64 / self.count as f64
        }
    }
}

/// Statistics of one worker (or several, merged).
#[derive(Debug, Clone, Default)]
pub struct WorkerStats {
    /// How many workers' snapshots were merged into this one (1 for a single
    /// worker).
    pub workers: u64,
    /// Sum of every task's counters, operation scopes or not.
    pub counters: Counters,
    /// Statistics per operation name given to [`crate::Ctx::op`] (search, insert, …).
    pub ops: BTreeMap<&'static str, OpStats>,
    /// Work requests completed (what the tuner measures).
    pub completed_wrs: u64,
    /// Last `C_max` of the throttle (`u32::MAX` = unlimited), per worker.
    pub c_max: Vec<u32>,
    /// Last coroutine limit `c_max` of conflict avoidance, per worker.
    pub task_limit: Vec<u32>,
    /// Last backoff limit `t_max` in ns, per worker.
    pub t_max: Vec<u64>,
    /// RPCs by service: count, failures, reply bytes and latency from the
    /// call to the reply's arrival (see [`crate::rpc`]).
    pub rpc: BTreeMap<dmkit_fabric::ServiceId, OpStats>,
}

impl WorkerStats {
    /// Adds `o` into `self`.
    pub fn merge(&mut self, o: &WorkerStats) {
        self.workers += o.workers;
        self.counters.merge(&o.counters);
        for (k, v) in &o.ops {
            self.ops.entry(k).or_insert_with(OpStats::new).merge(v);
        }
        self.completed_wrs += o.completed_wrs;
        self.c_max.extend_from_slice(&o.c_max);
        self.task_limit.extend_from_slice(&o.task_limit);
        self.t_max.extend_from_slice(&o.t_max);
        for (k, v) in &o.rpc {
            self.rpc.entry(*k).or_insert_with(OpStats::new).merge(v);
        }
    }

    pub(crate) fn op_mut(&mut self, name: &'static str) -> &mut OpStats {
        self.ops.entry(name).or_insert_with(OpStats::new)
    }
}
