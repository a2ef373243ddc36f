//! The YCSB harness: loads an index, then runs a workload for a duration
//! on T threads (× C tasks for remote indexes) and reports throughput,
//! latency and what each operation cost on the fabric.
//!
//! Indexes:
//! - `race`: [`dmkit_race`] over the runtime (SMART-HT; SMART §5.2, §6.2.1);
//! - `local-hash`: a concurrent in-memory map (`dashmap`) driven by the same
//!   generator in the same process — the side-by-side peer that says what a
//!   local index costs on this machine;
//! - `art`: [`dmkit_art`], the SMART radix tree over the runtime (OSDI'23);
//! - `local-art`: a concurrent in-memory ART (the `congee` crate, integer
//!   keys, 8-byte values held inline) — the radix tree's local peer;
//! - `btree`: [`dmkit_btree`], the Sherman-style B-link tree with HOCL and
//!   SMART-BT's speculative lookup (ASPLOS'24 §5.2, §6.2.3);
//! - `clover`: [`dmkit_clover`], Clover's store (ATC'20), on the simulator
//!   optionally behind SwordBox's switch steering its requests
//!   ([`CloverBench::steer`]; on shm there is no wire, hence no switch).
//!
//! Each thread owns one worker (remote indexes) and one index client whose
//! caches persist from the load phase into the run phase, as a long-lived
//! SMART-HT client's would.
//!
//! The remote indexes are driven through the index layer's map contract
//! alone ([`dmkit_index::RemoteMap`], [`dmkit_index::MapClient`]): each
//! index's configuration carries its switches, sizes itself for the
//! workload ([`dmkit_index::IndexConfig::fit`]) and estimates the memory it
//! needs; the harness knows none of their internals.

use std::cell::{Cell, RefCell};
use std::collections::BTreeMap;
use std::rc::Rc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{mpsc, Arc, Barrier, Mutex};
use std::time::{Duration, Instant};

use dashmap::DashMap;
use dmkit_art::{ArtConfig, ArtTree};
use dmkit_btree::{Btree, BtreeConfig};
use dmkit_clover::{CloverConfig, CloverKv};
use dmkit_fabric::Fabric;
use dmkit_index::{ClientStats, IndexConfig, IndexError, MapClient, RemoteMap, Shape};
use dmkit_race::{RaceConfig, RaceTable};
use dmkit_runtime::{Counters, Ctx, MonotonicClock, RuntimeConfig, Worker};
use dmkit_sim::{Sim, SimConfig, SwitchMode, SwitchModel};
use dmkit_switch::{Steer, SwitchConfig};
use hdrhistogram::Histogram;
use serde::Serialize;

use crate::harness::{self, Arrival, Latency, Window};
use crate::micro::{BenchError, Padded};
use crate::ycsb::{
    default_distribution, key_bytes, Chooser, Distribution, Generator, KeyType, Workload, YcsbOp,
};

/// Which index the harness drives.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum IndexKind {
    /// RACE extendible hashing on the fabric (`dmkit-race`).
    Race,
    /// An in-process concurrent hash map: the peer without a network.
    LocalHash,
    /// The SMART radix tree on the fabric (`dmkit-art`).
    Art,
    /// An in-process concurrent radix tree: the peer without a network.
    LocalArt,
    /// The Sherman-style B-link tree on the fabric (`dmkit-btree`).
    Btree,
    /// Clover's key-value store on passive memory (`dmkit-clover`).
    Clover,
}

impl IndexKind {
    /// Its name on the command line and in results.
    pub fn name(self) -> &'static str {
        match self {
            IndexKind::Race => "race",
            IndexKind::LocalHash => "local-hash",
            IndexKind::Art => "art",
            IndexKind::LocalArt => "local-art",
            IndexKind::Btree => "btree",
            IndexKind::Clover => "clover",
        }
    }

    /// Whether the index runs on the fabric (through the runtime).
    pub fn remote(self) -> bool {
        matches!(
            self,
            IndexKind::Race | IndexKind::Art | IndexKind::Btree | IndexKind::Clover
        )
    }

    /// Whether the index keeps keys in order (range scans, workload E).
    pub fn ordered(self) -> bool {
        matches!(
            self,
            IndexKind::Art | IndexKind::LocalArt | IndexKind::Btree
        )
    }
}

impl std::str::FromStr for IndexKind {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "race" => Ok(IndexKind::Race),
            "local-hash" => Ok(IndexKind::LocalHash),
            "art" => Ok(IndexKind::Art),
            "local-art" => Ok(IndexKind::LocalArt),
            "btree" => Ok(IndexKind::Btree),
            "clover" => Ok(IndexKind::Clover),
            _ => Err(format!("unknown index {s:?}; available: {INDEXES}")),
        }
    }
}

/// The indexes the harness runs.
pub const INDEXES: &str = "race, local-hash, art, local-art, btree, clover";

/// Clover's settings in a run, and the SwordBox switch in front of its
/// memory node on the simulator.
#[derive(Debug, Clone, Default)]
pub struct CloverBench {
    /// The store's switches and client settings; its structure is fitted
    /// to the workload.
    pub config: CloverConfig,
    /// SwordBox steering at a P4 switch (simulator only; `Off`: no switch,
    /// unless the simulation brings its own).
    pub steer: Steer,
    /// Partial steering: only the workload's hottest N keys (0: every key).
    pub steer_keys: usize,
    /// Slots of the switch's address → key table that read steering looks
    /// stale READs up in (SwordBox §4.4.2: "an array somewhat larger than
    /// the size of the key space", collisions replace); 0: four times the
    /// keys (at least 1,024), rounded up to a power of two.
    pub steer_table: usize,
    /// Before the warm-up, every client looks up every key once, unmeasured
    /// (simulator only): the hint caches of a run long enough that each
    /// client has met each key. A simulated run lasts milliseconds, so
    /// without it a client's first touch of a key — a directory lookup,
    /// two READs — is a large share of the bytes Clover moves (SwordBox's
    /// runs last seconds; its Fig. 12 compares steady states).
    pub warm_hints: bool,
    /// A store shared by several client processes (on a fabric): created
    /// by the first, opened by the others.
    pub share: Option<CloverShare>,
}

/// A Clover store several client processes (e.g. one per host) run one
/// YCSB workload on together: each creates store `name` or, if another
/// did, opens it; each loads the keys (a key another loaded already is
/// fine); none destroys it after its run. Instead each adds the versions
/// its clients linked to the node's root `NAME.linked` and counts itself
/// in `NAME.done`; the process that finishes last — every other one is
/// quiet then — runs the chain checker over the whole store with the sum
/// of all processes' linked versions (so a version any of them linked
/// and lost is found), then destroys the store. Needs the metadata
/// server off (`--gc off`): its cuts are counted in its own process only.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CloverShare {
    /// The store's name on the memory node.
    pub name: String,
    /// Processes that run on it (the last of them checks).
    pub clients: u32,
}

/// A YCSB run.
#[derive(Debug, Clone)]
pub struct YcsbConfig {
    /// The index to drive.
    pub index: IndexKind,
    /// The operation mix.
    pub workload: Workload,
    /// Keys loaded before the run phase.
    pub keys: u64,
    /// Threads (per compute machine on the simulator).
    pub threads: usize,
    /// Compute machines (simulator only; 1 otherwise).
    pub machines: usize,
    /// Tasks per thread (remote indexes).
    pub coros: usize,
    /// Zipfian skew θ (YCSB's default 0.99); unused by the uniform
    /// distribution.
    pub theta: f64,
    /// Key distribution; `None` = the workload's standard one.
    pub distribution: Option<Distribution>,
    /// Scrambled zipfian only: draw ranks over this many items (default:
    /// YCSB's 10¹⁰) — a small table with a bigger table's hot-key shares.
    pub zipf_items: Option<u64>,
    /// How key numbers become key bytes.
    pub key_type: KeyType,
    /// Bytes of every value.
    pub value_size: usize,
    /// Measured time of the run phase.
    pub duration: Duration,
    /// Run phase before the measured time: operations that end in it are
    /// not counted (lets contention, throttling and conflict avoidance
    /// reach their steady state).
    pub warmup: Duration,
    /// Think time: each client (task) pauses this long after every
    /// operation before it starts the next (0: a closed loop at full
    /// speed). It throttles the offered load from the clients' side, as
    /// SMART (ASPLOS'24) §6.2.1 throttles execution for its Figure 9; an
    /// operation's latency excludes the pause.
    pub think: Duration,
    /// Seed of the operation streams (each client derives its own).
    pub seed: u64,
    /// The runtime's switches and parameters (remote indexes).
    pub runtime: RuntimeConfig,
    /// The hash table's hot area: the run's likeliest keys put in it (0:
    /// no hot area; memory-semantics §IV-B).
    pub hot_keys: usize,
    /// The hash table's switches and client settings (race); its
    /// structure is fitted to the workload.
    pub race: RaceConfig,
    /// The radix tree's (art).
    pub art: ArtConfig,
    /// The B+tree's (btree).
    pub btree: BtreeConfig,
    /// Clover's (clover), and SwordBox's steering of it.
    pub clover: CloverBench,
}

impl YcsbConfig {
    /// Threads over all compute machines.
    pub fn total_threads(&self) -> usize {
        self.threads * self.machines
    }
}

/// What a run measured. Per-operation figures are over the measured phase
/// (the load itself for `workload load`).
#[derive(Debug, Clone, Default, Serialize)]
pub struct YcsbResult {
    /// Where the index ran: the fabric backend's name, `sim`, or `local` for
    /// the in-process peers.
    pub backend: String,
    /// The index's name ([`IndexKind::name`]).
    pub index: String,
    /// The workload, lower case (`a` … `f`, `u`, `load`).
    pub workload: String,
    /// Threads per compute machine.
    pub threads: usize,
    /// Compute machines (the simulator; 1 otherwise).
    pub machines: usize,
    /// Tasks per thread (1 for the in-process peers).
    pub coros: usize,
    /// Keys loaded.
    pub keys: u64,
    /// `int` or `string`.
    pub key_type: String,
    /// Bytes per value.
    pub value_size: usize,
    /// The zipfian θ configured.
    pub zipf: f64,
    /// The key distribution used, lower case.
    pub distribution: String,
    /// Operations completed in the measured window, all threads.
    pub ops: u64,
    /// Length of the measured window in seconds (one global window on OS
    /// threads, see [`crate::harness`]; virtual time on the simulator).
    pub seconds: f64,
    /// Unmeasured run before it, seconds.
    pub warmup_s: f64,
    /// `ops / seconds` in millions of operations per second.
    pub mops: f64,
    /// Latency of every measured operation, start to completion, in µs
    /// (virtual time on the simulator): min, avg, p50, p95, p99, p99.9, max.
    #[serde(flatten)]
    pub latency: Latency,
    /// The same per operation type (read, update, insert, scan,
    /// read-modify-write; OS threads only — the simulator's runs keep
    /// one histogram).
    pub ops_by_type: BTreeMap<String, OpTypeStats>,
    /// Operations completed per interval of the measured window (OS
    /// threads only): YCSB's status lines as data.
    pub series: Vec<Sample>,
    /// Ctrl-C ended the run early: the figures are of what was measured
    /// (an interrupted load measured no run).
    pub interrupted: bool,
    /// Set when more polling threads ran than the process has cores.
    pub oversubscribed: Option<String>,
    /// The 99th percentile of reads (searches, scans) alone, in µs.
    pub p99_read_us: f64,
    /// The 99th percentile of writes (updates, inserts,
    /// read-modify-writes) alone, in µs.
    pub p99_write_us: f64,
    /// `sync` calls that waited for posted work, per operation: the operation's
    /// round trips.
    pub round_trips_per_op: f64,
    /// Verbs (READ, WRITE, CAS, FAA) queued per operation.
    pub verbs_per_op: f64,
    /// Payload bytes READ per operation.
    pub bytes_read_per_op: f64,
    /// Payload bytes written per operation.
    pub bytes_written_per_op: f64,
    /// Retries per operation (failed `backoff_cas` plus retries the index
    /// reported).
    pub retries_per_op: f64,
    /// CASes that lost their race, per operation.
    pub cas_failures_per_op: f64,
    /// Locks a local predecessor handed over (HOCL), per operation: taken
    /// without a CAS (the radix tree's leaf locks, the B+tree's node
    /// locks; 0 for other indexes).
    pub lock_handovers_per_op: f64,
    /// Of those, locks another leaf's, handed over through a local entry
    /// the two share by hashing (the radix tree), per operation.
    pub foreign_handovers_per_op: f64,
    /// Bytes each operation moved: READ and WRITE payloads, and 16 per
    /// atomic (its compare and swap operands).
    pub bytes_per_op: f64,
    /// SwordBox steering in front of the memory node (clover on the
    /// simulator): off, write or read-write; `null` without a switch.
    pub steer: Option<String>,
    /// Share of measured operations that retried 0, 1, …, 7 and 8 or more
    /// times; empty for the in-process peers.
    pub retry_histogram: Vec<f64>,
    /// The same buckets as SMART's artifact fills them with `CONFIG_STAT`
    /// (`RecordOps` in its `include/smart/thread.h`): per thread, the
    /// retries any of its tasks recorded between two consecutive
    /// completions, so one task's long spin is spread over the completions
    /// of its thread's other tasks. The mean is the same; the shape is what
    /// the artifact's `fig14bc.csv` can be compared with.
    pub retry_histogram_thread: Vec<f64>,
    /// Share of the tasks that completed no operation in the measured
    /// window (remote indexes; 0 for the in-process peers). Under a
    /// collapsed hot slot these are the clients stranded on it.
    pub idle_task_share: f64,
    /// Jain's fairness index of the threads' completed operations in the
    /// measured window, (Σx)² / (n·Σx²): 1 when every thread completed
    /// as many, 1/n when one thread completed them all.
    pub thread_fairness: f64,
    /// Operations that found nothing to read/update (should be 0 after a
    /// complete load).
    pub misses: u64,
    /// Wall-clock (or virtual) seconds of the load phase, the slowest thread's.
    pub load_seconds: f64,
    /// `keys / load_seconds` in millions of inserts per second.
    pub load_mops: f64,
    /// Runtime switches (remote indexes).
    pub thread_aware: bool,
    /// Adaptive work-request throttling (SMART, ASPLOS'24 §4.2) on or off.
    pub throttle: bool,
    /// Conflict avoidance (SMART, ASPLOS'24 §4.3) on or off.
    pub conflict_avoid: bool,
    /// Client cache hit rate of the measured phase (race).
    pub cache_hit_rate: Option<f64>,
    /// Subtable splits during load and run (race).
    pub splits: Option<u64>,
    /// Keys in the hash table's hot area (race; 0: none).
    pub hot_keys: usize,
    /// Work requests the simulator executed in the whole run — load,
    /// warm-up and measured window (0 off the simulator).
    pub sim_verbs: u64,
    /// Clover on the simulator: where its operations spent their time
    /// and verbs (absent otherwise).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub clover_phases: Option<CloverPhases>,
}

/// Where Clover's operations spent their time and verbs: every client's
/// counters of the operations that started in the measured window and
/// completed (the means are per operation of each kind).
#[derive(Debug, Clone, Copy, Default, Serialize)]
pub struct CloverPhases {
    /// Searches counted.
    pub searches: u64,
    /// Writes (inserts, updates, deletes) counted.
    pub writes: u64,
    /// Share of searches answered by their first READ.
    pub search_first_try: f64,
    /// Share of writes whose first CAS won.
    pub write_first_try: f64,
    /// READs per search.
    pub search_reads: f64,
    /// Time per search (µs).
    pub search_us: f64,
    /// CASes per write.
    pub write_cas: f64,
    /// Failed CASes per write.
    pub write_cas_failed: f64,
    /// READs per write.
    pub write_reads: f64,
    /// Time per write (µs).
    pub write_us: f64,
    /// Of it, in round trips that carried a CAS (µs).
    pub write_cas_us: f64,
    /// In walks to the real tail after a lost CAS (µs).
    pub write_walk_us: f64,
    /// In directory lookups (µs).
    pub write_lookup_us: f64,
    /// In claiming blocks (µs).
    pub write_alloc_us: f64,
}

impl CloverPhases {
    fn of(c: &dmkit_clover::CloverCounters) -> Self {
        let per = |v: u64, n: u64| if n == 0 { 0.0 } else { v as f64 / n as f64 };
        let us = |v: u64, n: u64| per(v, n) / 1e3;
        Self {
            searches: c.reads,
            writes: c.writes,
            search_first_try: per(c.reads_first_try, c.reads),
            write_first_try: per(c.writes_first_try, c.writes),
            search_reads: per(c.search_reads, c.reads),
            search_us: us(c.search_ns, c.reads),
            write_cas: per(c.write_cas, c.writes),
            write_cas_failed: per(c.write_cas_failed, c.writes),
            write_reads: per(c.write_reads, c.writes),
            write_us: us(c.write_ns, c.writes),
            write_cas_us: us(c.write_cas_ns, c.writes),
            write_walk_us: us(c.write_walk_ns, c.writes),
            write_lookup_us: us(c.write_lookup_ns, c.writes),
            write_alloc_us: us(c.write_alloc_ns, c.writes),
        }
    }
}

/// One operation type's measured figures.
#[derive(Debug, Clone, Default, Serialize, PartialEq)]
pub struct OpTypeStats {
    /// Operations of this type counted in the window.
    pub count: u64,
    /// Their latency, µs.
    #[serde(flatten)]
    pub latency: Latency,
}

/// One interval of a run's time series.
#[derive(Debug, Clone, Default, Serialize, PartialEq)]
pub struct Sample {
    /// End of the interval, seconds since the window opened.
    pub t_s: f64,
    /// Operations completed in the interval.
    pub ops: u64,
    /// Their rate, millions per second.
    pub mops: f64,
}

/// Where a run is: `phase` "load" (`done`/`total` keys) or "run"
/// (`done`/`total` milliseconds of warm-up and window); `ops` counted in
/// the window so far (OS threads).
#[derive(Debug, Clone, Copy)]
pub struct Update {
    /// `load` or `run`.
    pub phase: &'static str,
    /// Keys loaded, or milliseconds run.
    pub done: u64,
    /// Keys to load, or milliseconds of warm-up plus window.
    pub total: u64,
    /// Operations counted in the window so far (OS threads).
    pub ops: u64,
    /// Still in the warm-up.
    pub warming_up: bool,
}

/// Progress callback.
pub type Progress<'a> = &'a (dyn Fn(Update) + Sync);

fn update(phase: &'static str, done: u64, total: u64) -> Update {
    Update {
        phase,
        done,
        total,
        ops: 0,
        warming_up: false,
    }
}

/// Checks a configuration before anything is allocated (every limit the
/// run would otherwise hit later, or panic on); messages name the flag.
pub fn validate(cfg: &YcsbConfig) -> Result<(), BenchError> {
    let bad = |s: String| Err(BenchError::Config(s));
    if cfg.zipf_items == Some(0) {
        return bad("--zipf-items must be at least 1".into());
    }
    if cfg.hot_keys as u64 > cfg.keys {
        return bad(format!(
            "--hot-keys {} is more than the --keys {} loaded",
            cfg.hot_keys, cfg.keys
        ));
    }
    if cfg.duration.is_zero() && cfg.workload != Workload::Load {
        return bad("--duration must be longer than 0s".into());
    }
    if cfg.runtime.fixed_c_max == Some(0) {
        return bad("--c-max must be at least 1".into());
    }

    if cfg.keys == 0 || cfg.threads == 0 || cfg.coros == 0 || cfg.machines == 0 {
        return bad("--keys, --threads, --coros and --machines must be at least 1".into());
    }
    if cfg.workload == Workload::E && !cfg.index.ordered() {
        return bad(format!(
            "workload e needs range scans; index {} is a hash table (use art, local-art or btree)",
            cfg.index.name()
        ));
    }
    if cfg.index == IndexKind::LocalArt && cfg.key_type != KeyType::Int {
        return bad("local-art (congee) keys are 64-bit integers: use --key-type int".into());
    }
    if let KeyType::WideInt(n) = cfg.key_type {
        if !(KeyType::MIN_WIDE..=KeyType::MAX_WIDE).contains(&n) {
            return bad(format!(
                "wide integer keys of {n} B: the width must be in {}..={}",
                KeyType::MIN_WIDE,
                KeyType::MAX_WIDE
            ));
        }
    }
    if cfg.hot_keys > 0 && cfg.index != IndexKind::Race {
        return bad(format!(
            "--hot-keys is the hash table's hot area: use it with --index race, not {}",
            cfg.index.name()
        ));
    }
    // Skews of 1 and more: the exact zipfian over the keys (explicit
    // `--distribution zipfian`, a key count a table can hold).
    let exact = cfg.distribution == Some(Distribution::Zipfian) && cfg.keys <= 1 << 24;
    if !(cfg.theta > 0.0 && (cfg.theta < 1.0 || exact && cfg.theta <= 4.0)) {
        return bad(format!(
            "--zipf {} must be in (0, 1) (up to 4 with --distribution zipfian over at most 2^24 keys)",
            cfg.theta
        ));
    }
    if cfg.index == IndexKind::Clover && cfg.clover.steer_keys > 0 && cfg.clover.steer == Steer::Off
    {
        return bad("--steer-keys needs --steer write or read-write".into());
    }
    if cfg.index == IndexKind::Clover
        && cfg.clover.steer_table > 0
        && cfg.clover.steer != Steer::ReadWrite
    {
        return bad(
            "--steer-table sizes read steering's table: it needs --steer read-write".into(),
        );
    }
    if cfg.clover.warm_hints && cfg.index != IndexKind::Clover {
        return bad(format!(
            "--warm-hints warms Clover's hint caches: use it with --index clover, not {}",
            cfg.index.name()
        ));
    }
    if cfg.index != IndexKind::Clover && cfg.clover.share.is_some() {
        return bad("--clover-store is a Clover store: give --index clover".into());
    }
    if cfg.index.remote() && cfg.total_threads().saturating_mul(cfg.coros) > 65_535 {
        return bad(format!(
            "--threads {} x --coros {} is more than 65535 tasks",
            cfg.total_threads(),
            cfg.coros
        ));
    }
    if cfg.threads > 65_535 {
        return bad(format!(
            "--threads {} is more than 65535 threads",
            cfg.threads
        ));
    }
    Ok(())
}

/// What the run will put in its index.
pub fn shape(cfg: &YcsbConfig) -> Shape {
    Shape {
        keys: cfg.keys,
        max_key: cfg.key_type.bytes(),
        // Integer keys of a run are all one length (a B+tree then stores
        // them without a length byte, as Sherman stores its keys).
        fixed_keys: cfg.key_type.is_int(),
        max_value: cfg.value_size,
        clients: cfg.total_threads(),
    }
}

/// `cfg` fitted to the run's workload.
fn fitted<C: IndexConfig>(c: &C, run: &YcsbConfig) -> C {
    let mut c = c.clone();
    c.fit(&shape(run));
    c
}

/// The hash table's configuration for the run: fitted, seeded with the
/// run's seed (hot keys are picked when the table is made).
fn race_config(cfg: &YcsbConfig) -> RaceConfig {
    RaceConfig {
        seed: cfg.seed,
        ..fitted(&cfg.race, cfg)
    }
}

/// Bytes of remote memory a run of `cfg.index` needs (for sizing an
/// embedded or simulated node; the in-process peers need none beyond the
/// hash table's estimate, which sizes their node too).
pub fn memory_estimate(cfg: &YcsbConfig) -> u64 {
    let s = shape(cfg);
    match cfg.index {
        IndexKind::Art => fitted(&cfg.art, cfg).memory_estimate(&s),
        IndexKind::Btree => fitted(&cfg.btree, cfg).memory_estimate(&s),
        IndexKind::Clover => fitted(&cfg.clover.config, cfg).memory_estimate(&s),
        _ => race_config(cfg).memory_estimate(&s),
    }
}

/// Per-thread measurement.
#[derive(Default, Clone)]
struct ThreadOut {
    ops: u64,
    misses: u64,
    seconds: f64,
    load_seconds: f64,
    counters: Counters,
    hist: Option<Histogram<u64>>,
    /// Latencies of reads and of writes alone.
    kinds: Option<(Histogram<u64>, Histogram<u64>)>,
    retry_hist: RetryHist,
    thread_hist: RetryHist,
    /// Operations each task completed in the measured window.
    task_ops: Vec<u64>,
    cache: (u64, u64),
    splits: u64,
    /// Locks handed over locally, and of those another lock's, in the
    /// measured window.
    handovers: (u64, u64),
    /// Per operation type (OS threads).
    by_type: Option<Box<ByType>>,
}

/// Operations by retry count: 0..=7, and 8 or more in the last bucket.
type RetryHist = [u64; RETRY_BUCKETS];
const RETRY_BUCKETS: usize = 9;

/// Each bucket's share of the total; empty when nothing was measured (the
/// in-process peers).
fn shares(h: &RetryHist) -> Vec<f64> {
    let n: u64 = h.iter().sum();
    h.iter()
        .filter(|_| n > 0)
        .map(|&c| c as f64 / n as f64)
        .collect()
}

fn histogram() -> Histogram<u64> {
    Histogram::new_with_bounds(1, 100_000_000_000, 2).expect("valid bounds")
}

fn value_for(size: usize, k: u64, version: u64) -> Vec<u8> {
    let mut v = vec![0u8; size];
    let pat = (k ^ version.rotate_left(32)).to_le_bytes();
    for (i, b) in v.iter_mut().enumerate() {
        *b = pat[i % 8];
    }
    v
}

/// Where a YCSB run happens.
pub enum Platform {
    /// OS threads over a real fabric (shm): one worker per thread.
    Fabric(Arc<dyn Fabric>),
    /// Virtual threads on the simulator: `threads` per compute machine of
    /// the configuration; the duration is virtual time.
    Sim(Box<SimConfig>),
}

fn unique_name() -> String {
    static RUNS: AtomicU64 = AtomicU64::new(0);
    format!(
        "ycsb-{}-{}",
        std::process::id(),
        RUNS.fetch_add(1, Ordering::Relaxed)
    )
}

/// Creates the run's index with configuration `c` on `fabric`.
fn create<M: RemoteMap>(fabric: Arc<dyn Fabric>, c: M::Config) -> Result<Arc<M>, BenchError> {
    M::create(fabric, &unique_name(), c).map_err(|e| BenchError::Run(format!("{}: {e}", M::KIND)))
}

/// The hash table's configuration with its hot area: the run's likeliest
/// keys (the memory estimate's two blocks per key already cover a hot
/// entry and its key record).
fn race_with_hot_area(cfg: &YcsbConfig) -> RaceConfig {
    RaceConfig {
        hot_keys: chooser(cfg)
            .hottest(cfg.keys, cfg.hot_keys)
            .into_iter()
            .map(|k| key_bytes(cfg.key_type, k, cfg.seed))
            .collect(),
        ..race_config(cfg)
    }
}

/// Creates the run's remote index of type `M` with configuration `c` on
/// the platform, loads and runs it, and removes it.
fn run_remote<M: RemoteMap>(
    platform: Platform,
    c: M::Config,
    cfg: &YcsbConfig,
    points: &[Point],
    progress: Progress<'_>,
) -> Result<Vec<YcsbResult>, BenchError> {
    run_remote_with::<M>(platform, c, cfg, points, progress, &|_, _, _| Ok(()))
}

/// When a simulated run calls its [`AfterLoad`] hook.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Stage {
    /// After the load, before the run phase (and before Clover's hints
    /// are warmed).
    Loaded,
    /// The run phase starts now; its measured window at this virtual
    /// instant (ns).
    Window(u64),
}

/// What a simulated run does between its load and its run phase (e.g.
/// install the keys a switch steers), and as the run phase starts.
type AfterLoad<'a, M> = &'a dyn Fn(&Sim, &Arc<M>, Stage) -> Result<(), BenchError>;

/// [`run_remote`] with `after_load` run on the simulator after the load.
fn run_remote_with<M: RemoteMap>(
    platform: Platform,
    c: M::Config,
    cfg: &YcsbConfig,
    points: &[Point],
    progress: Progress<'_>,
    after_load: AfterLoad<'_, M>,
) -> Result<Vec<YcsbResult>, BenchError> {
    match platform {
        Platform::Fabric(f) => {
            let map = create::<M>(f.clone(), c)?;
            on_threads(f.clone(), &map, cfg, points, progress, false)
        }
        Platform::Sim(sc) => {
            let sim = Sim::new(*sc)?;
            let map = create::<M>(sim.dyn_fabric(), c)?;
            let (outs, posted) = on_sim(sim, &map, cfg, progress, after_load)?;
            let mut r = summarize("sim".into(), cfg, &outs);
            r.sim_verbs = posted;
            Ok(vec![r])
        }
    }
}

/// Clover's run: on the simulator, a P4 switch steering its requests when
/// `steer` asks for one (the simulation's own switch otherwise), the
/// hottest keys installed after the load for partial steering, and the
/// metadata server off (its grace period outlasts a simulated run: it
/// would free nothing); on a fabric, no switch — there is no wire.
fn run_clover(
    platform: Platform,
    cfg: &YcsbConfig,
    lcfg: &YcsbConfig,
    points: &[Point],
    progress: Progress<'_>,
) -> Result<Vec<YcsbResult>, BenchError> {
    let mut c = fitted(&cfg.clover.config, lcfg);
    let steer = cfg.clover.steer;
    let (mut rs, tag) = match platform {
        Platform::Fabric(f) => {
            if steer != Steer::Off {
                return Err(BenchError::Config(format!(
                    "--steer {steer}: SwordBox's switch sits on the wire between clients and \
                     memory nodes; {} has no wire (use --backend sim)",
                    f.backend()
                )));
            }
            if cfg.clover.warm_hints {
                return Err(BenchError::Config(format!(
                    "--warm-hints: a simulated run's warm-up of every client's hints; a run on {} \
                     lasts long enough to warm them itself (use --backend sim)",
                    f.backend()
                )));
            }
            let rs = match &cfg.clover.share {
                Some(share) => run_shared_clover(f, c, cfg, points, progress, share)?,
                None => run_remote::<CloverKv>(Platform::Fabric(f), c, cfg, points, progress)?,
            };
            (rs, None)
        }
        Platform::Sim(mut sc) => {
            c.gc = false;
            if steer != Steer::Off && sc.switch.is_none() {
                sc.switch = Some(SwitchModel::new(
                    SwitchMode::P4,
                    SwitchConfig {
                        steer,
                        clover_read_len: c.read_bytes() as u32,
                        addr_slots: match cfg.clover.steer_table {
                            0 => (4 * cfg.keys as usize).next_power_of_two().max(1 << 10),
                            n => n,
                        },
                        ..SwitchConfig::default()
                    },
                ));
            }
            let tag = sc.switch.as_ref().map(|s| s.policy.steer.to_string());
            let hottest: Vec<Vec<u8>> = chooser(cfg)
                .hottest(cfg.keys, cfg.clover.steer_keys)
                .into_iter()
                .map(|k| key_bytes(cfg.key_type, k, cfg.seed))
                .collect();
            let store: std::cell::RefCell<Option<Arc<CloverKv>>> = Default::default();
            let install = |sim: &Sim, kv: &Arc<CloverKv>, stage| -> Result<(), BenchError> {
                if let Stage::Window(from) = stage {
                    // The phase breakdown: operations of the measured window.
                    kv.count_phases_from(from);
                    *store.borrow_mut() = Some(kv.clone());
                    return Ok(());
                }
                if hottest.is_empty() {
                    return Ok(());
                }
                let ids: Vec<u64> = kv
                    .key_ids(&hottest)
                    .map_err(|e| BenchError::Config(format!("clover: {e}")))?
                    .into_iter()
                    .flatten()
                    .collect();
                sim.with_switch(|s| s.steer_only(Some(ids)));
                Ok(())
            };
            let mut rs =
                run_remote_with::<CloverKv>(Platform::Sim(sc), c, cfg, points, progress, &install)?;
            if let Some(kv) = store.take() {
                let phases = CloverPhases::of(&kv.phase_counters());
                for r in &mut rs {
                    r.clover_phases = Some(phases);
                }
            }
            (rs, tag)
        }
    };
    for r in &mut rs {
        r.steer = tag.clone();
    }
    Ok(rs)
}

/// The first client id of this process's threads: ids must differ among
/// a map's live clients (Clover's writer ids in version birth ids). Two
/// processes on one shared map may have the same pid (identical guests
/// booted alike): their ids take the clock's nanoseconds too.
fn client_base(shared: bool) -> u64 {
    let pid = std::process::id() as u64;
    let salt = if shared {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos() as u64)
            << 22
    } else {
        0
    };
    (salt ^ pid).wrapping_mul(4096)
}

/// Clover on a store shared with other client processes (see
/// [`CloverShare`]).
fn run_shared_clover(
    f: Arc<dyn Fabric>,
    c: CloverConfig,
    cfg: &YcsbConfig,
    points: &[Point],
    progress: Progress<'_>,
    share: &CloverShare,
) -> Result<Vec<YcsbResult>, BenchError> {
    if c.gc {
        return Err(BenchError::Config(
            "a shared Clover store is checked with every process's linked versions; the \
             metadata server's cuts are known only in its own process: give --gc off"
                .into(),
        ));
    }
    if share.clients == 0 {
        return Err(BenchError::Config(
            "a shared store needs at least one client".into(),
        ));
    }
    let run = |e: IndexError| BenchError::Run(format!("clover store {}: {e}", share.name));
    // Create, or open what another process created (it may be publishing
    // it right now: a store not there yet is retried for a while).
    let t0 = Instant::now();
    let kv = loop {
        match CloverKv::create(f.clone(), &share.name, c.clone()) {
            Ok(kv) => break kv,
            Err(dmkit_index::IndexError::AlreadyExists { .. }) => {}
            Err(e) => return Err(run(e)),
        }
        match CloverKv::open(f.clone(), &share.name, c.clone()) {
            Ok(kv) => break kv,
            Err(e) if t0.elapsed() > Duration::from_secs(30) => return Err(run(e)),
            Err(_) => std::thread::sleep(Duration::from_millis(50)),
        }
    };
    let rs = on_threads(f.clone(), &kv, cfg, points, progress, true)?;
    // Count this process in: its linked versions, then itself.
    let node = kv.home().home();
    let add = |root: &str, n: u64| -> Result<u64, BenchError> {
        loop {
            let old = f
                .get_root(node, root)
                .map_err(|e| BenchError::Run(format!("root {root}: {e}")))?;
            let new = old.unwrap_or(0) + n;
            match f.set_root(node, root, new, Some(old)) {
                Ok(_) => return Ok(new),
                Err(dmkit_fabric::FabricError::Refused {
                    error: dmkit_fabric::ControlError::RootMismatch { .. },
                    ..
                }) => continue,
                Err(e) => return Err(BenchError::Run(format!("root {root}: {e}"))),
            }
        }
    };
    let (linked_root, done_root) = (
        format!("{}.linked", share.name),
        format!("{}.done", share.name),
    );
    let mine = kv.linked_versions();
    add(&linked_root, mine)?;
    let done = add(&done_root, 1)?;
    if done < share.clients as u64 {
        eprintln!(
            "clover: shared store {}: {mine} versions linked here; {done} of {} clients done (the last checks the chains)",
            share.name, share.clients
        );
        return Ok(rs);
    }
    let total = f
        .get_root(node, &linked_root)
        .map_err(|e| BenchError::Run(format!("root {linked_root}: {e}")))?
        .unwrap_or(0);
    let rep = dmkit_clover::check_chains(&kv, Some(total)).map_err(|e| {
        BenchError::Run(format!(
            "clover: shared store {}: the chain checker failed after {} clients: {e}",
            share.name, share.clients
        ))
    })?;
    eprintln!(
        "clover: shared store {}: chains intact after {} clients ({} keys, {} versions = {} linked by all, {mine} here, longest chain {})",
        share.name, share.clients, rep.keys, rep.versions, total, rep.longest
    );
    kv.destroy().map_err(run)?;
    for r in [&linked_root, &done_root] {
        let _ = f.set_root(node, r, 0, None);
    }
    Ok(rs)
}

/// Runs the benchmark.
pub fn run(
    platform: Platform,
    cfg: &YcsbConfig,
    progress: Progress<'_>,
) -> Result<YcsbResult, BenchError> {
    let mut rs = run_points(platform, cfg, &[cfg.point()], progress)?;
    Ok(rs.remove(0))
}

/// The configuration a sweep loads with and sizes its index for: the
/// most threads and tasks any of its points uses.
pub fn sweep_config(cfg: &YcsbConfig, points: &[Point]) -> YcsbConfig {
    load_config(cfg, points)
}

/// Loads the index once and measures each point on it, in order (OS
/// threads; the simulator measures one point per run). A workload that
/// inserts keys is refused with several points: each point would insert
/// the previous one's keys again. Returns one result per measured point;
/// after Ctrl-C, the points measured so far (the last one marked
/// `interrupted`), or the load alone.
pub fn run_points(
    platform: Platform,
    cfg: &YcsbConfig,
    points: &[Point],
    progress: Progress<'_>,
) -> Result<Vec<YcsbResult>, BenchError> {
    if points.is_empty() {
        return Err(BenchError::Config("a run needs at least one point".into()));
    }
    for p in points {
        validate(&cfg.at(p))?;
    }
    if points.len() > 1 && inserts(cfg.workload) {
        return Err(BenchError::Config(format!(
            "workload {} inserts keys, so its points cannot share one loaded index; run each point on its own",
            format!("{:?}", cfg.workload).to_lowercase()
        )));
    }
    let lcfg = load_config(cfg, points);
    match &platform {
        Platform::Fabric(_) if cfg.machines != 1 => {
            return Err(BenchError::Config(
                "several compute machines exist only on the simulator".into(),
            ))
        }
        Platform::Sim(_) if points.len() != 1 || points[0] != cfg.point() => {
            return Err(BenchError::Config(
                "the simulator measures one point per run: run each point on its own".into(),
            ))
        }
        _ => {}
    }
    match cfg.index {
        IndexKind::LocalHash => run_local(&LocalHash::new(&lcfg), cfg, points, progress),
        IndexKind::LocalArt => run_local(&LocalArt::default(), cfg, points, progress),
        IndexKind::Race => {
            run_remote::<RaceTable>(platform, race_with_hot_area(&lcfg), cfg, points, progress)
        }
        IndexKind::Art => {
            run_remote::<ArtTree>(platform, fitted(&cfg.art, &lcfg), cfg, points, progress)
        }
        IndexKind::Btree => {
            // A switch that turns lock CASes into WRITEs learns where the
            // tree's lock words are (after the load: nothing is lost, its
            // cache starts empty and learns from the CASes' responses).
            let locks = |sim: &Sim, tree: &Arc<Btree>, stage| -> Result<(), BenchError> {
                if stage != Stage::Loaded {
                    return Ok(());
                }
                let ranges: Vec<(u64, u64)> = tree
                    .lock_tables()
                    .into_iter()
                    .map(|(a, b)| (a.raw(), b.raw()))
                    .collect();
                sim.with_switch(|s| s.set_lock_ranges(ranges));
                Ok(())
            };
            let c = fitted(&cfg.btree, &lcfg);
            run_remote_with::<Btree>(platform, c, cfg, points, progress, &locks)
        }
        IndexKind::Clover => run_clover(platform, cfg, &lcfg, points, progress),
    }
}

fn summarize(backend: String, cfg: &YcsbConfig, outs: &[ThreadOut]) -> YcsbResult {
    let mut hist = histogram();
    let (mut rhist, mut whist) = (histogram(), histogram());
    let mut counters = Counters::default();
    let mut retry_hist = RetryHist::default();
    let mut thread_hist = RetryHist::default();
    let (mut tasks, mut idle_tasks, mut sum_sq) = (0usize, 0usize, 0f64);
    let (mut ops, mut misses, mut seconds, mut load_seconds) = (0, 0, 0f64, 0f64);
    let (mut hits, mut lookups, mut splits) = (0, 0, 0);
    let (mut handovers, mut foreign) = (0, 0);
    let mut types: Option<ByType> = None;
    for o in outs {
        if let Some(b) = &o.by_type {
            let t = types.get_or_insert_with(by_type);
            for ((n, h), (m, g)) in t.iter_mut().zip(b.iter()) {
                *n += m;
                h.add(g).expect("same bounds");
            }
        }
        ops += o.ops;
        misses += o.misses;
        seconds = seconds.max(o.seconds);
        load_seconds = load_seconds.max(o.load_seconds);
        counters.merge(&o.counters);
        if let Some(h) = &o.hist {
            hist.add(h).expect("same bounds");
        }
        if let Some((r, w)) = &o.kinds {
            rhist.add(r).expect("same bounds");
            whist.add(w).expect("same bounds");
        }
        for (a, b) in retry_hist.iter_mut().zip(o.retry_hist) {
            *a += b;
        }
        for (a, b) in thread_hist.iter_mut().zip(o.thread_hist) {
            *a += b;
        }
        tasks += o.task_ops.len();
        idle_tasks += o.task_ops.iter().filter(|&&n| n == 0).count();
        sum_sq += (o.ops as f64).powi(2);
        hits += o.cache.0;
        lookups += o.cache.0 + o.cache.1;
        splits += o.splits;
        handovers += o.handovers.0;
        foreign += o.handovers.1;
    }
    let per = |v: u64| if ops == 0 { 0.0 } else { v as f64 / ops as f64 };
    let remote = cfg.index.remote();
    YcsbResult {
        backend,
        index: cfg.index.name().into(),
        workload: format!("{:?}", cfg.workload).to_lowercase(),
        threads: cfg.threads,
        machines: if remote { cfg.machines } else { 1 },
        coros: if remote { cfg.coros } else { 1 },
        keys: cfg.keys,
        key_type: format!("{:?}", cfg.key_type).to_lowercase(),
        value_size: cfg.value_size,
        zipf: cfg.theta,
        distribution: format!(
            "{:?}",
            cfg.distribution
                .unwrap_or(default_distribution(cfg.workload))
        )
        .to_lowercase(),
        ops,
        seconds,
        mops: if seconds > 0.0 {
            ops as f64 / seconds / 1e6
        } else {
            0.0
        },
        warmup_s: cfg.warmup.as_secs_f64(),
        latency: Latency::of(&hist),
        ops_by_type: types.as_ref().map(op_type_stats).unwrap_or_default(),
        series: Vec::new(),
        interrupted: false,
        oversubscribed: None,
        p99_read_us: rhist.value_at_quantile(0.99) as f64 / 1e3,
        p99_write_us: whist.value_at_quantile(0.99) as f64 / 1e3,
        round_trips_per_op: per(counters.round_trips),
        verbs_per_op: per(counters.verbs()),
        bytes_read_per_op: per(counters.bytes_read),
        bytes_written_per_op: per(counters.bytes_written),
        retries_per_op: per(counters.retries),
        cas_failures_per_op: per(counters.cas_failures),
        lock_handovers_per_op: per(handovers),
        foreign_handovers_per_op: per(foreign),
        bytes_per_op: per(counters.bytes_read
            + counters.bytes_written
            + 16 * (counters.cas + counters.faa)),
        // Set by `run_clover`.
        steer: None,
        retry_histogram: shares(&retry_hist),
        retry_histogram_thread: shares(&thread_hist),
        idle_task_share: if tasks == 0 {
            0.0
        } else {
            idle_tasks as f64 / tasks as f64
        },
        thread_fairness: if sum_sq > 0.0 {
            (ops as f64).powi(2) / (outs.len() as f64 * sum_sq)
        } else {
            1.0
        },
        misses,
        load_seconds,
        load_mops: if load_seconds > 0.0 {
            cfg.keys as f64 / load_seconds / 1e6
        } else {
            0.0
        },
        thread_aware: remote && cfg.runtime.thread_aware,
        throttle: remote && cfg.runtime.throttle,
        conflict_avoid: remote && cfg.runtime.conflict_avoid,
        cache_hit_rate: (remote && lookups > 0).then(|| hits as f64 / lookups as f64),
        splits: remote.then_some(splits),
        hot_keys: if cfg.index == IndexKind::Race {
            cfg.hot_keys
        } else {
            0
        },
        // Set by `run` for simulator runs.
        sim_verbs: 0,
        // Set by `run_clover`.
        clover_phases: None,
    }
}

/// The key chooser of a run: the workload's standard one unless overridden.
fn chooser(cfg: &YcsbConfig) -> Chooser {
    let d = cfg
        .distribution
        .unwrap_or(default_distribution(cfg.workload));
    match (d, cfg.zipf_items) {
        (Distribution::Scrambled, Some(items)) => Chooser::scrambled_over(items, cfg.theta),
        _ => Chooser::new(d, cfg.keys, cfg.theta),
    }
}

/// Key numbers a loader (one of `loaders`) inserts.
fn load_share(keys: u64, loader: u64, loaders: u64) -> impl Iterator<Item = u64> {
    (loader..keys).step_by(loaders as usize)
}

/// Latencies of reads and of writes alone.
type KindHists = Option<(Histogram<u64>, Histogram<u64>)>;

/// One thread's running tallies, shared by its tasks (single-threaded).
#[derive(Clone, Default)]
struct Tally {
    failed: Rc<RefCell<Option<String>>>,
    done: Rc<Cell<u64>>,
    misses: Rc<Cell<u64>>,
    hist: Rc<RefCell<Option<Histogram<u64>>>>,
    /// Reads' and writes' latencies.
    kinds: Rc<RefCell<KindHists>>,
    retry_hist: Rc<RefCell<RetryHist>>,
    /// The same by SMART's artifact's definition: retries the thread
    /// recorded since its previous completion.
    thread_hist: Rc<RefCell<RetryHist>>,
    thread_mark: Rc<Cell<u64>>,
    /// Measured operations per task of the thread.
    task_ops: Rc<RefCell<Vec<u64>>>,
    /// When the last operation ended (the worker's clock).
    last: Rc<Cell<u64>>,
    /// Operations ending before this are not counted (the simulator).
    from: u64,
    /// OS threads: the global window that decides what counts, the
    /// thread's live count for the coordinator, and per-type histograms.
    window: Option<Arc<Window>>,
    live: Option<Arc<Padded>>,
    by_type: Option<Rc<RefCell<ByType>>>,
    /// OS threads: the runtime counters of the counted operations only
    /// (each operation's difference of its task's counters), so the
    /// per-operation figures describe exactly the operations the window
    /// counted.
    counted: Option<Rc<RefCell<Counters>>>,
}

/// Operation types, in [`op_type`]'s order.
const OP_TYPES: [&str; 5] = ["read", "update", "insert", "scan", "read-modify-write"];
type ByType = [(u64, Histogram<u64>); 5];

fn op_type(op: &YcsbOp) -> usize {
    match op {
        YcsbOp::Read(_) => 0,
        YcsbOp::Update(_) => 1,
        YcsbOp::Insert(_) => 2,
        YcsbOp::Scan(..) => 3,
        YcsbOp::ReadModifyWrite(_) => 4,
    }
}

fn by_type() -> ByType {
    std::array::from_fn(|_| (0, histogram()))
}

fn op_type_stats(b: &ByType) -> BTreeMap<String, OpTypeStats> {
    OP_TYPES
        .iter()
        .zip(b)
        .filter(|(_, (n, _))| *n > 0)
        .map(|(name, (n, h))| {
            (
                name.to_string(),
                OpTypeStats {
                    count: *n,
                    latency: Latency::of(h),
                },
            )
        })
        .collect()
}

impl Tally {
    fn new() -> Self {
        Self::from(0)
    }

    /// Counting operations that end at or after `from`.
    fn from(from: u64) -> Self {
        let t = Self {
            from,
            ..Self::default()
        };
        *t.hist.borrow_mut() = Some(histogram());
        *t.kinds.borrow_mut() = Some((histogram(), histogram()));
        t
    }

    /// Counting operations that end inside `window` (OS threads).
    fn window(window: Arc<Window>, live: Arc<Padded>) -> Self {
        Self {
            window: Some(window),
            live: Some(live),
            by_type: Some(Rc::new(RefCell::new(by_type()))),
            counted: Some(Rc::default()),
            ..Self::from(0)
        }
    }

    /// Records an operation; whether it was counted.
    fn record(&self, start: u64, end: u64) -> bool {
        self.last.set(self.last.get().max(end));
        let counted = match &self.window {
            Some(w) => w.counts(end),
            None => end >= self.from,
        };
        if !counted {
            return false;
        }
        if let Some(h) = self.hist.borrow_mut().as_mut() {
            let _ = h.record(end.saturating_sub(start).max(1));
        }
        self.done.set(self.done.get() + 1);
        if let Some(l) = &self.live {
            l.0.store(self.done.get(), Ordering::Relaxed);
        }
        true
    }

    /// [`Tally::record`] of task `task`'s operation of type `kind` that
    /// retried `retries` times, when the thread's tasks together have
    /// retried `thread_total` times.
    /// `cost` is what the operation added to its task's counters (window
    /// mode only). Reads (searches, scans) and writes also go to their
    /// own histograms (`kinds`), on every platform.
    #[allow(clippy::too_many_arguments)]
    fn record_retried(
        &self,
        (task, kind): (usize, usize),
        start: u64,
        end: u64,
        retries: u64,
        thread_total: u64,
        hit: bool,
        cost: Option<Counters>,
    ) {
        let since = thread_total - self.thread_mark.replace(thread_total);
        if self.record(start, end) {
            if !hit {
                self.misses.set(self.misses.get() + 1);
            }
            if let (Some(c), Some(cost)) = (&self.counted, cost) {
                c.borrow_mut().merge(&cost);
            }
            if let Some((r, w)) = self.kinds.borrow_mut().as_mut() {
                let read = matches!(OP_TYPES[kind], "read" | "scan");
                let h = if read { r } else { w };
                let _ = h.record(end.saturating_sub(start).max(1));
            }
            let bucket = |n: u64| (n as usize).min(RETRY_BUCKETS - 1);
            self.retry_hist.borrow_mut()[bucket(retries)] += 1;
            self.thread_hist.borrow_mut()[bucket(since)] += 1;
            self.task_ops.borrow_mut()[task] += 1;
            if let Some(b) = &self.by_type {
                let (n, h) = &mut b.borrow_mut()[kind];
                *n += 1;
                let _ = h.record(end.saturating_sub(start).max(1));
            }
        }
    }

    /// Whether a run task stops at `t`: the window closed (OS threads) or
    /// the deadline passed (the simulator).
    fn over(&self, t: u64, deadline: u64) -> bool {
        match &self.window {
            Some(w) => w.done(t),
            None => t >= deadline,
        }
    }

    fn fail(&self, why: String) {
        self.failed.borrow_mut().get_or_insert(why);
        if let Some(w) = &self.window {
            w.abort();
        }
    }
}

/// The load phase of thread `ti`: its tasks insert their share of keys.
fn spawn_load<C: MapClient>(
    w: &mut Worker,
    client: &C,
    cfg: &YcsbConfig,
    ti: usize,
    loaded: &Arc<AtomicU64>,
    tally: &Tally,
    shared: bool,
) {
    let clients = (cfg.total_threads() * cfg.coros) as u64;
    for ci in 0..cfg.coros {
        let (client, tally, loaded) = (client.clone(), tally.clone(), loaded.clone());
        let loader = (ti * cfg.coros + ci) as u64;
        let (kt, seed, vs, keys) = (cfg.key_type, cfg.seed, cfg.value_size, cfg.keys);
        w.spawn(move |ctx| async move {
            let mut n = 0;
            for k in load_share(keys, loader, clients) {
                if harness::interrupted() {
                    break;
                }
                let key = key_bytes(kt, k, seed);
                let t = ctx.now();
                match client.insert(&ctx, &key, &value_for(vs, k, 0)).await {
                    Ok(true) => {}
                    // Another process sharing the store loaded it.
                    Ok(false) if shared => {}
                    Ok(false) => {
                        return tally.fail(format!(
                            "load: key number {k} was already present (two key numbers with equal key bytes)"
                        ))
                    }
                    Err(e) => return tally.fail(format!("load: {e}")),
                }
                tally.record(t, ctx.now());
                n += 1;
                if n % 256 == 0 {
                    loaded.fetch_add(256, Ordering::Relaxed);
                }
            }
            loaded.fetch_add(n % 256, Ordering::Relaxed);
        });
    }
}

/// Runs `sim` in 1 ms slices, calling `each` after every slice, until all
/// `threads` virtual threads have finished or blocked.
fn run_settled(sim: &mut Sim, threads: usize, mut each: impl FnMut(&Sim)) {
    loop {
        let out = sim.run_until(sim.now() + 1_000_000);
        each(sim);
        if out.finished + out.blocked == threads {
            break;
        }
    }
}

/// [`CloverBench::warm_hints`]: every client looks up every key once (its
/// thread's tasks share the keys out), unmeasured; returns when all are done.
fn warm<'a, C: MapClient + 'a>(
    sim: &mut Sim,
    threads: impl Iterator<Item = (dmkit_sim::ThreadId, &'a C)> + Clone,
    cfg: &YcsbConfig,
) -> Result<(), BenchError> {
    let failed: Rc<RefCell<Option<String>>> = Rc::default();
    let n = threads.clone().count();
    for (th, client) in threads.clone() {
        let w = sim.worker_mut(th);
        for ci in 0..cfg.coros {
            let (client, failed) = (client.clone(), failed.clone());
            let (kt, seed, keys, coros) = (cfg.key_type, cfg.seed, cfg.keys, cfg.coros as u64);
            w.spawn(move |ctx| async move {
                for k in (ci as u64..keys).step_by(coros as usize) {
                    let key = key_bytes(kt, k, seed);
                    match client.search(&ctx, &key).await {
                        Ok(Some(_)) => {}
                        Ok(None) => {
                            *failed.borrow_mut() =
                                Some(format!("warming hints: key number {k} is missing"));
                            return;
                        }
                        Err(e) => {
                            *failed.borrow_mut() = Some(format!("warming hints: {e}"));
                            return;
                        }
                    }
                }
            });
        }
        sim.wake(th);
    }
    run_settled(sim, n, |_| {});
    if let Some(e) = failed.borrow_mut().take() {
        return Err(BenchError::Run(e));
    }
    if threads
        .into_iter()
        .any(|(th, _)| sim.worker_mut(th).live_tasks() > 0)
    {
        return Err(BenchError::Config(
            "warming hints: a virtual thread blocked forever".into(),
        ));
    }
    Ok(())
}

/// The run phase of thread `ti`: its tasks run the workload until `deadline`
/// (of the worker's clock).
fn spawn_run<C: MapClient>(
    w: &mut Worker,
    client: &C,
    cfg: &YcsbConfig,
    ti: usize,
    deadline: u64,
    chooser: &Chooser,
    tally: &Tally,
) {
    let clients = (cfg.total_threads() * cfg.coros) as u64;
    tally.task_ops.borrow_mut().resize(cfg.coros, 0);
    for ci in 0..cfg.coros {
        let (client, tally) = (client.clone(), tally.clone());
        let id = (ti * cfg.coros + ci) as u64;
        let mut gen = Generator::new(
            cfg.workload,
            chooser.clone(),
            cfg.keys,
            id,
            clients,
            cfg.seed,
        );
        let (kt, seed, vs) = (cfg.key_type, cfg.seed, cfg.value_size);
        let think = cfg.think.as_nanos() as u64;
        w.spawn(move |ctx| async move {
            let mut version = 1u64;
            // One clock read per operation: its end is the next one's start.
            let mut t = ctx.now();
            // Window mode charges each counted operation its own cost.
            let costed = tally.counted.is_some();
            let mut before = if costed {
                ctx.counters()
            } else {
                Counters::default()
            };
            while !tally.over(t, deadline) {
                let op = gen.next_op();
                version += 1;
                let retried = ctx.retries();
                let hit = match index_op(&client, &ctx, op, kt, seed, vs, version).await {
                    Ok(hit) => hit,
                    Err(e) => return tally.fail(format!("{op:?}: {e}")),
                };
                let end = ctx.now();
                let cost = costed.then(|| {
                    let after = ctx.counters();
                    after.since(&std::mem::replace(&mut before, after))
                });
                tally.record_retried(
                    (ci, op_type(&op)),
                    t,
                    end,
                    ctx.retries() - retried,
                    ctx.worker_retries(),
                    hit,
                    cost,
                );
                t = end;
                if think > 0 {
                    ctx.sleep(think).await;
                    t = ctx.now();
                }
            }
        });
    }
}

/// One YCSB operation; `Ok(false)` when the key was missing.
async fn index_op<C: MapClient>(
    c: &C,
    ctx: &Ctx,
    op: YcsbOp,
    kt: KeyType,
    seed: u64,
    vs: usize,
    version: u64,
) -> Result<bool, IndexError> {
    match op {
        YcsbOp::Read(k) => Ok(c.search(ctx, &key_bytes(kt, k, seed)).await?.is_some()),
        YcsbOp::Update(k) => {
            c.update(ctx, &key_bytes(kt, k, seed), &value_for(vs, k, version))
                .await
        }
        YcsbOp::Insert(k) => {
            c.insert(ctx, &key_bytes(kt, k, seed), &value_for(vs, k, version))
                .await
        }
        YcsbOp::ReadModifyWrite(k) => {
            let key = key_bytes(kt, k, seed);
            if c.search(ctx, &key).await?.is_none() {
                return Ok(false);
            }
            c.update(ctx, &key, &value_for(vs, k, version)).await
        }
        YcsbOp::Scan(k, n) => Ok(!c
            .scan(ctx, &key_bytes(kt, k, seed), n as usize)
            .await?
            .is_empty()),
    }
}

/// A thread's figures for a phase: counters and client counters since the
/// snapshots taken at its start.
fn phase_out<C: MapClient>(
    w: &Worker,
    client: &C,
    tally: &Tally,
    before: (&Counters, ClientStats),
) -> ThreadOut {
    between(tally, before, (&w.stats().counters, client.stats()))
}

/// A thread's figures between two snapshots of its worker's and client's
/// counters.
fn between(
    tally: &Tally,
    before: (&Counters, ClientStats),
    after: (&Counters, ClientStats),
) -> ThreadOut {
    let ClientStats {
        cache_hits: h,
        cache_misses: m,
        splits: s,
        lock_handovers: lh,
        foreign_handovers: fh,
    } = after.1;
    ThreadOut {
        ops: tally.done.get(),
        misses: tally.misses.get(),
        by_type: tally.by_type.as_ref().map(|b| Box::new(b.borrow().clone())),
        counters: match &tally.counted {
            Some(c) => *c.borrow(),
            None => after.0.since(before.0),
        },
        hist: tally.hist.borrow().clone(),
        kinds: tally.kinds.borrow().clone(),
        retry_hist: *tally.retry_hist.borrow(),
        thread_hist: *tally.thread_hist.borrow(),
        task_ops: tally.task_ops.borrow().clone(),
        cache: (h - before.1.cache_hits, m - before.1.cache_misses),
        splits: s,
        handovers: (
            lh - before.1.lock_handovers,
            fh - before.1.foreign_handovers,
        ),
        ..Default::default()
    }
}

/// One point of a sweep: what may change between measurements on one
/// loaded index (the workload's key space and values stay).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Point {
    /// Threads measured (the first of the loaded ones).
    pub threads: usize,
    /// Tasks per thread.
    pub coros: usize,
    /// Zipfian θ.
    pub theta: f64,
}

impl YcsbConfig {
    /// This configuration's own point.
    pub fn point(&self) -> Point {
        Point {
            threads: self.threads,
            coros: self.coros,
            theta: self.theta,
        }
    }

    /// This configuration at point `p`.
    pub fn at(&self, p: &Point) -> YcsbConfig {
        YcsbConfig {
            threads: p.threads,
            coros: p.coros,
            theta: p.theta,
            ..self.clone()
        }
    }
}

/// Whether the workload inserts keys: its points cannot share a loaded
/// index (a second point would insert the first one's keys again).
pub fn inserts(w: Workload) -> bool {
    matches!(w, Workload::Load | Workload::D | Workload::E)
}

/// What a thread reports: phase (0 = load, k + 1 = point k), thread,
/// outcome.
type Report = (usize, usize, Result<ThreadOut, BenchError>);

/// The protocol between a run's OS threads and its coordinator (the
/// calling thread). Every thread starts the load at one barrier, reports
/// its load, then takes part in the points: before each point every
/// thread and the coordinator meet at `barrier`, and the coordinator has
/// put the point's [`Window`] in `window` (`None`: the run is over). The
/// threads a point uses (the first `threads`) measure it in that window
/// ([`crate::harness`]) and report; the others wait for the next point.
struct Phases {
    start: Barrier,
    barrier: Barrier,
    window: Mutex<Option<Arc<Window>>>,
    /// Each thread's operations counted in the current window.
    live: Vec<Arc<Padded>>,
    tx: mpsc::Sender<Report>,
}

impl Phases {
    fn new(threads: usize, tx: mpsc::Sender<Report>) -> Self {
        Self {
            start: Barrier::new(threads),
            barrier: Barrier::new(threads + 1),
            window: Mutex::new(None),
            live: (0..threads).map(|_| Arc::new(Padded::default())).collect(),
            tx,
        }
    }

    /// Thread side: the next point's window, `None` when the run is over.
    fn next(&self) -> Option<Arc<Window>> {
        self.barrier.wait();
        self.window
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    fn report(&self, phase: usize, ti: usize, r: Result<ThreadOut, BenchError>) {
        // The coordinator outlives the threads (scoped); a send cannot fail.
        let _ = self.tx.send((phase, ti, r));
    }

    /// Coordinator side: opens the next point (`None`: ends the run).
    fn open(&self, w: Option<Arc<Window>>) {
        for l in &self.live {
            l.0.store(0, Ordering::Relaxed);
        }
        *self.window.lock().unwrap_or_else(|p| p.into_inner()) = w;
        self.barrier.wait();
    }

    fn counted(&self) -> u64 {
        self.live.iter().map(|l| l.0.load(Ordering::Relaxed)).sum()
    }
}

/// One measured point: its window and its threads' figures.
struct Measured {
    timed: harness::Timed,
    outs: Vec<ThreadOut>,
    series: Vec<Sample>,
}

/// The coordinator of a run on OS threads: shows the load's progress
/// until every thread has reported it, then measures each point in a
/// window of its own, with status samples. Ends the threads on every way
/// out. Returns the load's figures and the measured points (fewer than
/// asked when Ctrl-C ended the run).
fn coordinate_points(
    phases: &Phases,
    rx: mpsc::Receiver<Report>,
    cfg: &YcsbConfig,
    points: &[Point],
    loaded: &AtomicU64,
    progress: Progress<'_>,
) -> Result<(Vec<ThreadOut>, Vec<Measured>), BenchError> {
    let threads = phases.live.len();
    let mut load: Vec<Option<ThreadOut>> = vec![None; threads];
    let mut failed = None;
    let mut got = 0;
    while got < threads {
        match rx.recv_timeout(Duration::from_millis(100)) {
            Ok((_, ti, r)) => {
                got += 1;
                match r {
                    Ok(o) => load[ti] = Some(o),
                    Err(e) => {
                        failed.get_or_insert(e);
                    }
                }
            }
            Err(mpsc::RecvTimeoutError::Timeout) => progress(update(
                "load",
                loaded.load(Ordering::Relaxed).min(cfg.keys),
                cfg.keys,
            )),
            Err(mpsc::RecvTimeoutError::Disconnected) => break,
        }
    }
    if let Some(e) = failed {
        phases.open(None);
        return Err(e);
    }
    progress(update(
        "load",
        loaded.load(Ordering::Relaxed).min(cfg.keys),
        cfg.keys,
    ));
    let load = load.into_iter().flatten().collect();
    let mut measured = Vec::new();
    if cfg.workload == Workload::Load {
        // The load is the measurement (as on the simulator): no timed run
        // of further inserts, which would only grow the index (and fill a
        // store sized to the keys, as Clover's directory is).
        phases.open(None);
        return Ok((load, measured));
    }
    let total_ms = (cfg.warmup + cfg.duration).as_millis() as u64;
    let interval = (cfg.duration / 10).clamp(Duration::from_millis(100), Duration::from_secs(1));
    for (k, p) in points.iter().enumerate() {
        if harness::interrupted() {
            break;
        }
        let window = Arc::new(Window::new(p.threads));
        phases.open(Some(window.clone()));
        let mut series = Vec::new();
        let (mut last_t, mut last_ops) = (Duration::ZERO, 0u64);
        let timed = harness::coordinate(&window, cfg.warmup, Some(cfg.duration), |tick| {
            let ops = phases.counted();
            if tick.measured >= last_t + interval {
                let dt = (tick.measured - last_t).as_secs_f64();
                series.push(Sample {
                    t_s: tick.measured.as_secs_f64(),
                    ops: ops - last_ops,
                    mops: (ops - last_ops) as f64 / dt / 1e6,
                });
                (last_t, last_ops) = (tick.measured, ops);
            }
            progress(Update {
                phase: "run",
                done: tick.elapsed.as_millis() as u64,
                total: total_ms,
                ops,
                warming_up: tick.warming_up,
            });
        });
        let mut outs: Vec<Option<ThreadOut>> = vec![None; p.threads];
        let mut failed = None;
        for _ in 0..p.threads {
            let Ok((phase, ti, r)) = rx.recv() else { break };
            debug_assert_eq!(phase, k + 1, "reports arrive per point");
            match r {
                Ok(o) => outs[ti] = Some(o),
                Err(e) => {
                    failed.get_or_insert(e);
                }
            }
        }
        if let Some(e) = failed {
            phases.open(None);
            return Err(e);
        }
        let ops = phases.counted();
        let end = Duration::from_secs_f64(timed.seconds);
        if ops > last_ops && end > last_t {
            let dt = (end - last_t).as_secs_f64();
            series.push(Sample {
                t_s: timed.seconds,
                ops: ops - last_ops,
                mops: (ops - last_ops) as f64 / dt / 1e6,
            });
        }
        measured.push(Measured {
            timed,
            outs: outs.into_iter().flatten().collect(),
            series,
        });
        if timed.interrupted {
            break;
        }
    }
    phases.open(None);
    Ok((load, measured))
}

/// The points' results of a run on OS threads.
fn results(
    backend: &str,
    cfg: &YcsbConfig,
    points: &[Point],
    load: Vec<ThreadOut>,
    measured: Vec<Measured>,
) -> Vec<YcsbResult> {
    let load_seconds = load.iter().map(|o| o.load_seconds).fold(0.0, f64::max);
    let load_ops: u64 = load.iter().map(|o| o.ops).sum();
    let interrupted_load = load_ops < cfg.keys;
    if cfg.workload == Workload::Load || measured.is_empty() {
        let mut r = summarize(backend.into(), cfg, &load);
        r.interrupted =
            harness::interrupted() && (interrupted_load || cfg.workload != Workload::Load);
        if cfg.workload != Workload::Load {
            // Interrupted before the run: no run was measured.
            r.ops = 0;
            r.mops = 0.0;
            r.seconds = 0.0;
            r.latency = Latency::default();
        }
        if interrupted_load {
            r.load_mops = if load_seconds > 0.0 {
                load_ops as f64 / load_seconds / 1e6
            } else {
                0.0
            };
        }
        r.oversubscribed = harness::oversubscribed(cfg.threads);
        return vec![r];
    }
    points
        .iter()
        .zip(measured)
        .map(|(p, m)| {
            let pc = cfg.at(p);
            let mut outs = m.outs;
            for o in &mut outs {
                o.seconds = m.timed.seconds;
                o.load_seconds = load_seconds;
            }
            let mut r = summarize(backend.into(), &pc, &outs);
            r.load_seconds = load_seconds;
            r.load_mops = if load_seconds > 0.0 {
                cfg.keys as f64 / load_seconds / 1e6
            } else {
                0.0
            };
            r.series = m.series;
            r.interrupted = m.timed.interrupted;
            r.oversubscribed = harness::oversubscribed(p.threads);
            r
        })
        .collect()
}

/// The load's configuration of a sweep: the most threads and tasks any
/// point uses (every thread loads; each keeps its client for the points).
fn load_config(cfg: &YcsbConfig, points: &[Point]) -> YcsbConfig {
    YcsbConfig {
        threads: points
            .iter()
            .map(|p| p.threads)
            .max()
            .unwrap_or(cfg.threads),
        coros: points.iter().map(|p| p.coros).max().unwrap_or(cfg.coros),
        ..cfg.clone()
    }
}

/// Loads and runs on OS threads, one worker each, each point of `points`
/// in its own window on the loaded index, then removes the index.
fn on_threads<M: RemoteMap>(
    fabric: Arc<dyn Fabric>,
    index: &Arc<M>,
    cfg: &YcsbConfig,
    points: &[Point],
    progress: Progress<'_>,
    shared: bool,
) -> Result<Vec<YcsbResult>, BenchError> {
    let lcfg = load_config(cfg, points);
    let threads = lcfg.threads;
    let loaded = Arc::new(AtomicU64::new(0));
    let (tx, rx) = mpsc::channel();
    let phases = Phases::new(threads, tx);
    let outcome = std::thread::scope(|s| {
        for ti in 0..threads {
            let (fabric, loaded, phases, lcfg) = (&fabric, &loaded, &phases, &lcfg);
            s.spawn(move || {
                let clock = Arc::new(MonotonicClock);
                let rcfg = RuntimeConfig {
                    op_stats: false,
                    ..cfg.runtime.clone()
                };
                let made = Worker::builder(fabric.as_ref())
                    .clock(clock)
                    .config(rcfg)
                    .id(ti)
                    .tasks(lcfg.coros)
                    .local(index.local_layout())
                    .build();
                phases.start.wait();
                let mut w = match made {
                    Ok(w) => w,
                    Err(e) => {
                        phases.report(0, ti, Err(e.into()));
                        while phases.next().is_some() {}
                        return;
                    }
                };
                let client = index.client(client_base(shared) + ti as u64);
                // Load.
                let t0 = Instant::now();
                let tally = Tally::new();
                let c0 = (w.stats().counters, client.stats());
                spawn_load(&mut w, &client, lcfg, ti, loaded, &tally, shared);
                w.run();
                let mut out = phase_out(&w, &client, &tally, (&c0.0, c0.1));
                out.load_seconds = t0.elapsed().as_secs_f64();
                out.seconds = out.load_seconds;
                let failed = tally.failed.borrow_mut().take();
                phases.report(
                    0,
                    ti,
                    match failed {
                        Some(e) => Err(BenchError::Run(e)),
                        None => Ok(out),
                    },
                );
                // The points.
                let mut k = 0;
                while let Some(window) = phases.next() {
                    let p = points[k];
                    k += 1;
                    if ti >= p.threads {
                        continue;
                    }
                    let pc = cfg.at(&p);
                    let tally = Tally::window(window.clone(), phases.live[ti].clone());
                    let mut arrival = Arrival::new(&window);
                    spawn_run(&mut w, &client, &pc, ti, u64::MAX, &chooser(&pc), &tally);
                    arrival.arrive();
                    // Counters when the window opens and closes.
                    let snap = |w: &Worker| (w.stats().counters, client.stats());
                    let (mut at_open, mut at_close) = (None, None);
                    while w.live_tasks() > 0 {
                        if w.step() == 0 {
                            std::hint::spin_loop();
                        }
                        if at_close.is_none() {
                            let t = harness::now();
                            let (open, close) = window.bounds();
                            if at_open.is_none() && t >= open {
                                at_open = Some(snap(&w));
                            }
                            if t >= close {
                                at_close = Some(snap(&w));
                            }
                        }
                    }
                    let end = snap(&w);
                    let open = at_open.unwrap_or(end);
                    let close = at_close.unwrap_or(end);
                    let out = between(&tally, (&open.0, open.1), (&close.0, close.1));
                    let failed = tally.failed.borrow_mut().take();
                    phases.report(
                        k,
                        ti,
                        match failed {
                            Some(e) => Err(BenchError::Run(e)),
                            None => Ok(out),
                        },
                    );
                }
            });
        }
        coordinate_points(&phases, rx, &lcfg, points, &loaded, progress)
    });
    // Leave nothing behind on a memory node that outlives this run (a
    // shared index: its last user does).
    let destroyed = if shared {
        Ok(())
    } else {
        index
            .destroy()
            .map_err(|e| BenchError::Run(format!("{}: {e}", M::KIND)))
    };
    let (load, measured) = outcome?;
    destroyed?;
    Ok(results(fabric.backend(), &lcfg, points, load, measured))
}

/// Loads and runs on the simulator's virtual threads: `cfg.threads` on each
/// compute machine, one worker each. Times are virtual.
fn on_sim<M: RemoteMap>(
    mut sim: Sim,
    index: &Arc<M>,
    cfg: &YcsbConfig,
    progress: Progress<'_>,
    after_load: AfterLoad<'_, M>,
) -> Result<(Vec<ThreadOut>, u64), BenchError> {
    let rcfg = RuntimeConfig {
        op_stats: false,
        ..cfg.runtime.clone()
    };
    let loaded = Arc::new(AtomicU64::new(0));
    let mut threads = Vec::new();
    for ti in 0..cfg.total_threads() {
        let machine = ti / cfg.threads;
        // With sockets, a machine's threads alternate between them (the
        // study's front ends use both); without, every thread is on 0.
        let socket = (ti % cfg.threads) as u32 % sim.sockets();
        let th = sim.add_worker_on(machine, socket, |f: &dyn Fabric, clock| {
            Worker::builder(f)
                .clock(clock)
                .config(rcfg.clone())
                .id(ti)
                .tasks(cfg.coros)
                .local(index.local_layout())
                .build()
        })?;
        let client = index.client_on(machine, ti as u64);
        let tally = Tally::new();
        let before = (sim.thread_stats(th).counters, client.stats());
        spawn_load(sim.worker_mut(th), &client, cfg, ti, &loaded, &tally, false);
        threads.push((th, client, tally, before));
    }
    // Load, in slices so the progress bar moves.
    let t0 = sim.now();
    run_settled(&mut sim, threads.len(), |_| {
        progress(update(
            "load",
            loaded.load(Ordering::Relaxed).min(cfg.keys),
            cfg.keys,
        ))
    });
    let last = threads.iter().map(|t| t.2.last.get()).max().unwrap_or(t0);
    let load_seconds = last.saturating_sub(t0) as f64 / 1e9;
    let mut outs = Vec::new();
    for (th, client, tally, before) in &threads {
        if let Some(e) = tally.failed.borrow_mut().take() {
            return Err(BenchError::Run(e));
        }
        let w = sim.worker_mut(*th);
        if w.live_tasks() > 0 {
            return Err(BenchError::Config(
                "load: a virtual thread blocked forever".into(),
            ));
        }
        let mut o = phase_out(w, client, tally, (&before.0, before.1));
        o.load_seconds = load_seconds;
        o.seconds = load_seconds;
        outs.push(o);
    }
    if cfg.workload == Workload::Load {
        return Ok((outs, sim.stats().posted));
    }
    after_load(&sim, index, Stage::Loaded)?;
    if cfg.clover.warm_hints {
        warm(&mut sim, threads.iter().map(|t| (t.0, &t.1)), cfg)?;
    }
    let chooser = chooser(cfg);
    let start = sim.now();
    let from = start + cfg.warmup.as_nanos() as u64;
    let deadline = from + cfg.duration.as_nanos() as u64;
    after_load(&sim, index, Stage::Window(from))?;
    let mut tallies = Vec::new();
    for (ti, (th, client, _, _)) in threads.iter().enumerate() {
        let tally = Tally::from(from);
        spawn_run(
            sim.worker_mut(*th),
            client,
            cfg,
            ti,
            deadline,
            &chooser,
            &tally,
        );
        sim.wake(*th);
        tallies.push(tally);
    }
    let total_ms = (cfg.warmup + cfg.duration).as_millis().max(1) as u64;
    let slices = |sim: &mut Sim, until: u64| {
        while sim.now() < until {
            let slice = (sim.now() + 1_000_000).min(until);
            sim.run_until(slice);
            progress(update("run", (sim.now() - start) / 1_000_000, total_ms));
        }
    };
    // Counters from the end of the warm-up.
    slices(&mut sim, from);
    let run: Vec<_> = threads
        .iter()
        .zip(tallies)
        .map(|((th, client, _, _), tally)| {
            let before = (sim.thread_stats(*th).counters, client.stats());
            (tally, before)
        })
        .collect();
    slices(&mut sim, deadline);
    let mut outs = Vec::new();
    for ((th, client, _, _), (tally, before)) in threads.iter().zip(&run) {
        if let Some(e) = tally.failed.borrow_mut().take() {
            return Err(BenchError::Run(e));
        }
        let mut o = phase_out(sim.worker_mut(*th), client, tally, (&before.0, before.1));
        o.seconds = cfg.duration.as_secs_f64();
        o.load_seconds = load_seconds;
        outs.push(o);
    }
    Ok((outs, sim.stats().posted))
}

/// An in-process index for the local peers.
trait LocalIndex: Sync {
    /// Inserts or replaces; whether the key was new.
    fn put(&self, key: &[u8], value: &[u8]) -> bool;
    fn get(&self, key: &[u8]) -> bool;
    /// Replaces if present.
    fn replace(&self, key: &[u8], value: &[u8]) -> bool;
    /// Keys found scanning `n` from `key` (`None`: a hash map cannot).
    fn scan(&self, key: &[u8], n: usize) -> Option<usize>;
}

/// `local-hash`: dashmap.
struct LocalHash(DashMap<Box<[u8]>, Box<[u8]>>);

impl LocalHash {
    fn new(cfg: &YcsbConfig) -> Self {
        LocalHash(DashMap::with_capacity(cfg.keys as usize))
    }
}

impl LocalIndex for LocalHash {
    fn put(&self, key: &[u8], value: &[u8]) -> bool {
        self.0.insert(key.into(), value.into()).is_none()
    }
    fn get(&self, key: &[u8]) -> bool {
        self.0.get(key).map(|v| v.to_vec()).is_some()
    }
    fn replace(&self, key: &[u8], value: &[u8]) -> bool {
        match self.0.get_mut(key) {
            Some(mut v) => {
                *v = value.into();
                true
            }
            None => false,
        }
    }
    fn scan(&self, _: &[u8], _: usize) -> Option<usize> {
        None
    }
}

/// `local-art`: congee, keyed by the 8-byte big-endian integer key; values
/// are their first 8 bytes, held inline.
#[derive(Default)]
struct LocalArt(congee::Congee<usize, usize>);

fn int_key(key: &[u8]) -> usize {
    let mut b = [0u8; 8];
    b.copy_from_slice(&key[..8]);
    u64::from_be_bytes(b) as usize
}

fn inline_value(value: &[u8]) -> usize {
    let mut b = [0u8; 8];
    let n = value.len().min(8);
    b[..n].copy_from_slice(&value[..n]);
    u64::from_le_bytes(b) as usize
}

impl LocalIndex for LocalArt {
    fn put(&self, key: &[u8], value: &[u8]) -> bool {
        let g = self.0.pin();
        matches!(
            self.0.insert(int_key(key), inline_value(value), &g),
            Ok(None)
        )
    }
    fn get(&self, key: &[u8]) -> bool {
        let g = self.0.pin();
        self.0.get(&int_key(key), &g).is_some()
    }
    fn replace(&self, key: &[u8], value: &[u8]) -> bool {
        let g = self.0.pin();
        let v = inline_value(value);
        self.0
            .compute_if_present(&int_key(key), |_| Some(v), &g)
            .is_some()
    }
    fn scan(&self, key: &[u8], n: usize) -> Option<usize> {
        let g = self.0.pin();
        let mut out = vec![(0usize, 0usize); n];
        Some(self.0.range(&int_key(key), &usize::MAX, &mut out, &g))
    }
}

/// The in-process peers on OS threads: load, then each point in its own
/// window (the same protocol as [`on_threads`]).
fn run_local<M: LocalIndex>(
    map: &M,
    cfg: &YcsbConfig,
    points: &[Point],
    progress: Progress<'_>,
) -> Result<Vec<YcsbResult>, BenchError> {
    let lcfg = load_config(cfg, points);
    let threads = lcfg.threads;
    let loaded = AtomicU64::new(0);
    let (tx, rx) = mpsc::channel();
    let phases = Phases::new(threads, tx);
    let outcome = std::thread::scope(|s| {
        for ti in 0..threads {
            let (loaded, phases) = (&loaded, &phases);
            s.spawn(move || {
                let mut out = ThreadOut::default();
                let mut hist = histogram();
                phases.start.wait();
                let t0 = Instant::now();
                let mut n = 0;
                for k in load_share(cfg.keys, ti as u64, threads as u64) {
                    if n % 4096 == 0 && harness::interrupted() {
                        break;
                    }
                    let key = key_bytes(cfg.key_type, k, cfg.seed);
                    let t = Instant::now();
                    map.put(&key, &value_for(cfg.value_size, k, 0));
                    let _ = hist.record((t.elapsed().as_nanos() as u64).max(1));
                    n += 1;
                    if n % 4096 == 0 {
                        loaded.fetch_add(4096, Ordering::Relaxed);
                    }
                }
                loaded.fetch_add(n % 4096, Ordering::Relaxed);
                out.load_seconds = t0.elapsed().as_secs_f64();
                out.seconds = out.load_seconds;
                out.ops = n;
                out.hist = Some(hist);
                phases.report(0, ti, Ok(out));
                let mut k = 0;
                while let Some(window) = phases.next() {
                    let p = points[k];
                    k += 1;
                    if ti >= p.threads {
                        continue;
                    }
                    let pc = cfg.at(&p);
                    let out = local_point(map, &pc, ti, &window, &phases.live[ti]);
                    phases.report(k, ti, Ok(out));
                }
            });
        }
        coordinate_points(&phases, rx, &lcfg, points, &loaded, progress)
    });
    let (load, measured) = outcome?;
    Ok(results("local", &lcfg, points, load, measured))
}

/// Thread `ti` of an in-process peer measures one point in `window`.
fn local_point<M: LocalIndex>(
    map: &M,
    cfg: &YcsbConfig,
    ti: usize,
    window: &Window,
    live: &Padded,
) -> ThreadOut {
    let mut gen = Generator::new(
        cfg.workload,
        chooser(cfg),
        cfg.keys,
        ti as u64,
        cfg.threads as u64,
        cfg.seed,
    );
    let mut hist = histogram();
    let mut types = by_type();
    let mut version = 1u64;
    let (mut ops, mut misses) = (0u64, 0u64);
    let mut arrival = Arrival::new(window);
    arrival.arrive();
    // One clock read per operation: its end is the next one's start.
    let mut t = harness::now();
    while !window.done(t) {
        let op = gen.next_op();
        version += 1;
        let hit = match op {
            YcsbOp::Read(k) => map.get(&key_bytes(cfg.key_type, k, cfg.seed)),
            YcsbOp::Update(k) => map.replace(
                &key_bytes(cfg.key_type, k, cfg.seed),
                &value_for(cfg.value_size, k, version),
            ),
            YcsbOp::Insert(k) => map.put(
                &key_bytes(cfg.key_type, k, cfg.seed),
                &value_for(cfg.value_size, k, version),
            ),
            YcsbOp::ReadModifyWrite(k) => {
                let key = key_bytes(cfg.key_type, k, cfg.seed);
                map.get(&key) && map.replace(&key, &value_for(cfg.value_size, k, version))
            }
            YcsbOp::Scan(k, n) => {
                map.scan(&key_bytes(cfg.key_type, k, cfg.seed), n as usize)
                    .expect("workload e is refused for hash maps by validate")
                    > 0
            }
        };
        let end = harness::now();
        if window.counts(end) {
            let lat = end.saturating_sub(t).max(1);
            let _ = hist.record(lat);
            let (n, h) = &mut types[op_type(&op)];
            *n += 1;
            let _ = h.record(lat);
            ops += 1;
            misses += (!hit) as u64;
            live.0.store(ops, Ordering::Relaxed);
        }
        t = end;
    }
    ThreadOut {
        ops,
        misses,
        hist: Some(hist),
        by_type: Some(Box::new(types)),
        ..Default::default()
    }
}
