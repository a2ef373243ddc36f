//! Allocation traces replayed on the real allocator (CoRM §4.4, Fig. 17–19).
//!
//! A [`Trace`] is a sequence of allocations and frees of keyed objects.
//! [`replay`] runs it on a [`Cluster`] (one thread playing every worker;
//! each request goes to a worker chosen at random, as §4.4.3's allocator
//! threads serve RPCs) and reports active memory over time and at the
//! point of highest fragmentation, against no compaction and an ideal
//! compactor.
//!
//! ## Method
//!
//! 1. Replay the trace without compaction; the *point of highest
//!    fragmentation* is the operation after which the memory held beyond
//!    the ideal (`no-compaction − ideal` bytes) peaks (the largest waste;
//!    a ratio would pick the trace's first few objects).
//! 2. For a compacting strategy, replay it again (same seed: same workers,
//!    same frees) with the strategy's ids; at that point run a full
//!    compaction and record the active memory, then finish the trace.
//!
//! *Ideal* holds, per class, the live objects packed into ⌈live/slots⌉
//! blocks. Every strategy uses the same object layout (dmkit's header word
//! holds the version and lock bits one-sided reads need in every mode; the
//! id and home block fill bits that would otherwise be padding), so ids
//! cost no memory here and the comparison isolates compaction success —
//! unlike the paper's Fig. 17, which charges CoRM-n its id bits.
//!
//! ## The traces and every assumption in them
//!
//! - `synthetic` (Fig. 17): allocate `N` objects of one size, then free a
//!   uniformly random `free_fraction` of them (exactly ⌊N·f⌉ distinct
//!   objects). The paper's N is 8 M; `scale` multiplies it.
//! - Redis traces (§4.4.3, from the `memefficiency` unit test of Redis
//!   5.0.7). The paper extracted the allocator calls; these rebuild them
//!   from its description with this model of what Redis allocates per
//!   string key (jemalloc's rounding is replaced by our classes):
//!   - a dict entry: 24 B;
//!   - the key: an sds of type 5 (keys shorter than 32 B): length + 2 B;
//!   - the value: ≤ 44 B an embedded string, one allocation of
//!     16 (robj) + 3 (sds header) + length + 1 B; longer, a robj (16 B) and
//!     an sds of length + 4 B (< 256 B), + 6 B (< 64 KiB), + 10 B (larger);
//!   - the dict's bucket arrays are left out (few, large, long-lived: a
//!     1 M-bucket array is 8 MiB, beyond a block);
//!   - keys are 8 bytes, as the paper says; deleting or evicting a key
//!     frees its allocations; `scale` multiplies every count and the LRU
//!     capacity.
//!
//!   The traces:
//!   - `redis-t1`: 10,000 keys with values of uniform length in 1..=16384.
//!   - `redis-t2`: an LRU cache of 100 MiB (the test's `maxmemory 100mb`,
//!     `allkeys-lru`): 700,000 keys of 150 B, then 170,000 keys of 300 B;
//!     before the second batch and at the end, keys are evicted until the
//!     allocated bytes fit the capacity, as Redis evicts before each
//!     command. Eviction picks uniformly among the live keys of the oldest
//!     batch (Redis's sampled LRU has a 1 s clock; a batch is created
//!     within about one tick, so its keys tie in age).
//!   - `redis-t3`: 5 keys holding data structures of 160 KiB, each 10,000
//!     items of 16 B (the test's big hash/list/zset/set/stream have 10,000
//!     items each); then 50,000 keys with 150 B values; then every other
//!     key of that batch is deleted (25,000), as the test's `del` loop.

use std::sync::Arc;
use std::time::Instant;

use serde::{Deserialize, Serialize};

use super::class::{SizeClasses, Strategy};
use super::config::{ObjError, Op, Policy, Reply, StoreConfig};
use super::driver::Cluster;
use super::layout::ObjPtr;
use super::rng::Rng;
use crate::node::{MemNode, NodeConfig};

/// One event of a trace.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Event {
    /// Allocate object `key` of `len` payload bytes.
    Alloc {
        /// The object's name in the trace.
        key: u32,
        /// Payload bytes.
        len: u32,
    },
    /// Free object `key`.
    Free {
        /// The object's name in the trace.
        key: u32,
    },
}

/// An allocation trace.
#[derive(Debug, Clone)]
pub struct Trace {
    /// Its name (`synthetic`, `redis-t1`, …).
    pub name: String,
    /// The events, in order.
    pub events: Vec<Event>,
    /// Number of distinct keys.
    pub keys: u32,
}

/// The paper's synthetic object count (Fig. 17).
pub const SYNTHETIC_N: u64 = 8_000_000;

struct Builder {
    events: Vec<Event>,
    next: u32,
}

impl Builder {
    fn new() -> Self {
        Builder {
            events: Vec::new(),
            next: 0,
        }
    }

    fn alloc(&mut self, len: u32) -> u32 {
        let key = self.next;
        self.next += 1;
        self.events.push(Event::Alloc { key, len });
        key
    }

    fn free(&mut self, key: u32) {
        self.events.push(Event::Free { key });
    }

    fn done(self, name: &str) -> Trace {
        Trace {
            name: name.into(),
            events: self.events,
            keys: self.next,
        }
    }
}

/// Fig. 17: `n` objects of `size` bytes, then a random `free_fraction` freed.
pub fn synthetic(n: u64, size: u32, free_fraction: f64, seed: u64) -> Trace {
    let mut b = Builder::new();
    let keys: Vec<u32> = (0..n).map(|_| b.alloc(size)).collect();
    let mut rng = Rng::new(seed);
    let mut order = keys;
    let frees = ((n as f64) * free_fraction.clamp(0.0, 1.0)).round() as usize;
    for i in 0..frees {
        let j = i + rng.below((order.len() - i) as u64) as usize;
        order.swap(i, j);
        b.free(order[i]);
    }
    b.done("synthetic")
}

/// A Redis string key's allocations (see the module docs).
fn redis_key(b: &mut Builder, key_len: u32, value_len: u32) -> Vec<u32> {
    let mut v = vec![b.alloc(24), b.alloc(key_len + 2)];
    if value_len <= 44 {
        v.push(b.alloc(16 + 3 + value_len + 1));
    } else {
        let hdr = match value_len {
            0..=255 => 4,
            256..=65535 => 6,
            _ => 10,
        };
        v.push(b.alloc(16));
        v.push(b.alloc(value_len + hdr));
    }
    v
}

fn scaled(n: u64, scale: f64) -> u64 {
    ((n as f64 * scale).round() as u64).max(1)
}

/// `redis-mem-t1`.
pub fn redis_t1(scale: f64, seed: u64) -> Trace {
    let mut b = Builder::new();
    let mut rng = Rng::new(seed);
    for _ in 0..scaled(10_000, scale) {
        let len = 1 + rng.below(16384) as u32;
        redis_key(&mut b, 8, len);
    }
    b.done("redis-t1")
}

/// `redis-mem-t2`.
pub fn redis_t2(scale: f64, seed: u64) -> Trace {
    let mut b = Builder::new();
    let mut rng = Rng::new(seed);
    let capacity = (100u64 << 20) as f64 * scale;
    let mut used = 0u64;
    let mut batches: Vec<Vec<(Vec<u32>, u64)>> = Vec::new();
    let evict = |b: &mut Builder,
                 rng: &mut Rng,
                 used: &mut u64,
                 batches: &mut Vec<Vec<(Vec<u32>, u64)>>| {
        while *used as f64 > capacity {
            let Some(batch) = batches.iter_mut().find(|x| !x.is_empty()) else {
                break;
            };
            let i = rng.below(batch.len() as u64) as usize;
            let (allocs, bytes) = batch.swap_remove(i);
            for k in allocs {
                b.free(k);
            }
            *used -= bytes;
        }
    };
    for (count, value) in [(700_000u64, 150u32), (170_000, 300)] {
        evict(&mut b, &mut rng, &mut used, &mut batches);
        let mut batch = Vec::new();
        for _ in 0..scaled(count, scale) {
            let first = b.events.len();
            let keys = redis_key(&mut b, 8, value);
            let bytes: u64 = b.events[first..]
                .iter()
                .map(|e| match e {
                    Event::Alloc { len, .. } => *len as u64,
                    Event::Free { .. } => 0,
                })
                .sum();
            used += bytes;
            batch.push((keys, bytes));
        }
        batches.push(batch);
    }
    evict(&mut b, &mut rng, &mut used, &mut batches);
    b.done("redis-t2")
}

/// `redis-mem-t3`.
pub fn redis_t3(scale: f64, _seed: u64) -> Trace {
    let mut b = Builder::new();
    for _ in 0..5 {
        redis_key(&mut b, 8, 16);
        for _ in 0..scaled(10_000, scale) {
            b.alloc(16);
        }
    }
    let keys: Vec<Vec<u32>> = (0..scaled(50_000, scale))
        .map(|_| redis_key(&mut b, 8, 150))
        .collect();
    for k in keys.iter().step_by(2) {
        for &a in k {
            b.free(a);
        }
    }
    b.done("redis-t3")
}

/// Which memory a replay reports as "active".
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum Mode {
    /// No compaction.
    None,
    /// The ideal compactor.
    Ideal,
    /// A compacting strategy of the store.
    Store(Strategy),
}

impl Mode {
    /// Its name in reports.
    pub fn name(self) -> String {
        match self {
            Mode::None => "none".into(),
            Mode::Ideal => "ideal".into(),
            Mode::Store(s) => s.name(),
        }
    }
}

/// How to replay.
#[derive(Debug, Clone, PartialEq)]
pub struct ReplayConfig {
    /// What to report as active memory.
    pub mode: Mode,
    /// Worker threads (allocators), 1..=255.
    pub workers: usize,
    /// Block size.
    pub block_size: u64,
    /// The threshold trigger during the compacting replay (`None`: only
    /// the full compaction at the point of highest fragmentation).
    pub threshold: Option<f64>,
    /// Seed of the workers' choices, ids and slots.
    pub seed: u64,
    /// Points of the timeline.
    pub samples: usize,
}

/// One point of the timeline.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Sample {
    /// Events replayed so far.
    pub op: u64,
    /// Payload bytes of live objects.
    pub live_bytes: u64,
    /// What an ideal compactor would hold.
    pub ideal_bytes: u64,
    /// What the store holds without compaction.
    pub no_compaction_bytes: u64,
    /// What the store holds in this replay's mode.
    pub active_bytes: u64,
}

/// What a replay found.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct ReplayResult {
    /// The trace.
    pub trace: String,
    /// The mode (`none`, `ideal`, `mesh`, `corm-16`, `hybrid-16`, …).
    pub mode: String,
    /// Bits of random ids (0: offset-based or no ids).
    pub ids: u8,
    /// Workers.
    pub workers: usize,
    /// Block size.
    pub block_size: u64,
    /// Wall time of the replay (the pass without compaction and this
    /// mode's pass).
    pub seconds: f64,
    /// Events in the trace.
    pub ops: u64,
    /// The point of highest fragmentation (events replayed).
    pub point: u64,
    /// Active memory at that point (after compaction, for a compacting mode).
    pub active_bytes: u64,
    /// The ideal compactor's memory there.
    pub ideal_bytes: u64,
    /// The memory without compaction there.
    pub no_compaction_bytes: u64,
    /// Payload bytes live there.
    pub live_bytes: u64,
    /// Compactions in the compacting replay (threshold and the final one).
    pub compactions: u64,
    /// Blocks merged away in it.
    pub blocks_compacted: u64,
    /// Seconds of collection and merging in it.
    pub compaction_seconds: f64,
    /// Active memory over time.
    pub timeline: Vec<Sample>,
}

struct Pass {
    /// Per sample point: (live, ideal, active).
    samples: Vec<(u64, u64, u64)>,
    /// Waste peak: (events replayed, live, ideal, active).
    peak: (u64, u64, u64, u64),
    /// Active memory right after the compaction at the peak.
    at_point: u64,
    compactions: u64,
    blocks_compacted: u64,
    compaction_ns: u64,
}

/// Replays `trace`.
pub fn replay(trace: &Trace, cfg: &ReplayConfig) -> Result<ReplayResult, String> {
    let mut r = replay_modes(trace, cfg, &[cfg.mode])?;
    Ok(r.pop().expect("one mode"))
}

/// Replays `trace` once per mode of `modes` (the rest of `cfg` shared),
/// sharing the pass without compaction.
pub fn replay_modes(
    trace: &Trace,
    cfg: &ReplayConfig,
    modes: &[Mode],
) -> Result<Vec<ReplayResult>, String> {
    if cfg.workers == 0 || cfg.workers > 255 {
        return Err(format!("{} workers: 1..=255", cfg.workers));
    }
    for m in modes {
        if let Mode::Store(s) = m {
            s.validate()?;
        }
    }
    let t0 = Instant::now();
    let ops = trace.events.len() as u64;
    let every = (ops / cfg.samples.max(1) as u64).max(1);
    let points: Vec<u64> = (1..=ops).filter(|i| i % every == 0 || *i == ops).collect();
    let base = run(trace, cfg, Strategy::None, None, None, &points)?;
    let base_seconds = t0.elapsed().as_secs_f64();
    let (point, live, ideal, nocomp) = base.peak;
    let mut out = Vec::new();
    for &mode in modes {
        let t1 = Instant::now();
        let (active, comp) = match mode {
            Mode::None => (nocomp, None),
            Mode::Ideal => (ideal, None),
            Mode::Store(s) => {
                let p = run(trace, cfg, s, cfg.threshold, Some(point), &points)?;
                (p.at_point, Some(p))
            }
        };
        let timeline = points
            .iter()
            .enumerate()
            .map(|(i, &op)| {
                let (l, id, nc) = base.samples[i];
                Sample {
                    op,
                    live_bytes: l,
                    ideal_bytes: id,
                    no_compaction_bytes: nc,
                    active_bytes: match (&comp, mode) {
                        (Some(p), _) => p.samples[i].2,
                        (None, Mode::Ideal) => id,
                        (None, _) => nc,
                    },
                }
            })
            .collect();
        out.push(ReplayResult {
            trace: trace.name.clone(),
            mode: mode.name(),
            ids: match mode {
                Mode::Store(s) => s.id_bits(),
                _ => 0,
            },
            workers: cfg.workers,
            block_size: cfg.block_size,
            seconds: base_seconds + t1.elapsed().as_secs_f64(),
            ops,
            point,
            active_bytes: active,
            ideal_bytes: ideal,
            no_compaction_bytes: nocomp,
            live_bytes: live,
            compactions: comp.as_ref().map_or(0, |p| p.compactions),
            blocks_compacted: comp.as_ref().map_or(0, |p| p.blocks_compacted),
            compaction_seconds: comp.as_ref().map_or(0.0, |p| p.compaction_ns as f64 * 1e-9),
            timeline,
        });
    }
    Ok(out)
}

/// One pass, with more address space each time the store runs out of it.
fn run(
    trace: &Trace,
    cfg: &ReplayConfig,
    strategy: Strategy,
    threshold: Option<f64>,
    compact_at: Option<u64>,
    points: &[u64],
) -> Result<Pass, String> {
    let classes = SizeClasses::new(cfg.block_size);
    // A first guess at the blocks the store will need: the peak of the
    // ideal, plus a partly filled block per worker and class in use.
    let mut ideal = vec![0u64; classes.len()];
    let mut used = vec![false; classes.len()];
    let mut lens = vec![0u32; trace.keys as usize];
    let (mut blocks, mut peak) = (0u64, 0u64);
    for e in &trace.events {
        let (c, d) = match *e {
            Event::Alloc { key, len } => {
                lens[key as usize] = len;
                (classes.for_payload(len), 1i64)
            }
            Event::Free { key } => (classes.for_payload(lens[key as usize]), -1),
        };
        let Some(c) = c else {
            return Err(format!(
                "{}: an object of more than {} B",
                trace.name,
                classes.max_payload()
            ));
        };
        let slots = classes.get(c).expect("class").slots as u64;
        blocks -= ideal[c as usize].div_ceil(slots);
        ideal[c as usize] = (ideal[c as usize] as i64 + d) as u64;
        blocks += ideal[c as usize].div_ceil(slots);
        used[c as usize] = true;
        peak = peak.max(blocks);
    }
    let classes_used = used.iter().filter(|&&u| u).count() as u64;
    let mut vblocks = 2 * peak + 2 * cfg.workers as u64 * classes_used + 16;
    loop {
        match pass(trace, cfg, strategy, threshold, compact_at, points, vblocks) {
            Err(PassError::AddressSpace) => vblocks *= 2,
            Err(PassError::Other(e)) => return Err(e),
            Ok(p) => return Ok(p),
        }
    }
}

#[derive(Debug)]
enum PassError {
    AddressSpace,
    Other(String),
}

#[allow(clippy::too_many_arguments)]
fn pass(
    trace: &Trace,
    cfg: &ReplayConfig,
    strategy: Strategy,
    threshold: Option<f64>,
    compact_at: Option<u64>,
    points: &[u64],
    vblocks: u64,
) -> Result<Pass, PassError> {
    let bs = cfg.block_size;
    let other = PassError::Other;
    let node = MemNode::new(NodeConfig {
        node_id: 0,
        size: (vblocks + 2) * bs + 4096,
        page_size: 4096,
        spare_pages: 0,
        // The replay drives the store's workers itself.
        rpc_workers: 0,
        // The store takes its blocks by `reserve_internal`, never as chunks.
        prefault_chunks: false,
    })
    .map_err(|e| other(e.to_string()))?;
    let store_cfg = StoreConfig {
        block_size: bs,
        workers: cfg.workers,
        strategy,
        correction: super::config::Correction::Scan,
        policy: Policy {
            threshold,
            on_alloc_failure: false,
            collect_max_fill: 1.0,
            merges_per_step: 0,
            candidates_per_source: Policy::default().candidates_per_source,
        },
        virtual_bytes: vblocks * bs,
        max_active_bytes: None,
        seed: Some(cfg.seed ^ 0xC0DE),
    };
    let mut c = Cluster::new(Arc::clone(&node), store_cfg).map_err(other)?;
    let acct_classes = c.store().classes().clone();
    let mut rng = Rng::new(cfg.seed);
    let mut ptrs: Vec<Option<(ObjPtr, u32)>> = vec![None; trace.keys as usize];
    let mut live_objs = vec![0u64; acct_classes.len()];
    let (mut ideal_blocks, mut live) = (0u64, 0u64);
    let mut out = Pass {
        samples: Vec::with_capacity(points.len()),
        peak: (0, 0, 0, 0),
        at_point: 0,
        compactions: 0,
        blocks_compacted: 0,
        compaction_ns: 0,
    };
    let mut waste_peak = None::<u64>;
    let mut next_point = 0;
    for (i, e) in trace.events.iter().enumerate() {
        let w = rng.below(cfg.workers as u64) as usize;
        let (len, d) = match *e {
            Event::Alloc { key, len } => {
                let p = match c.call(w, Op::Alloc(len)) {
                    Ok(Reply::Allocated(p)) => p,
                    // Without a memory limit, memory runs out with addresses.
                    Err(ObjError::OutOfAddressSpace | ObjError::OutOfMemory { .. }) => {
                        return Err(PassError::AddressSpace)
                    }
                    other_r => return Err(other(format!("event {i}: alloc answered {other_r:?}"))),
                };
                ptrs[key as usize] = Some((p, len));
                (len, 1i64)
            }
            Event::Free { key } => {
                let Some((p, len)) = ptrs[key as usize].take() else {
                    return Err(other(format!("event {i}: key {key} freed twice")));
                };
                match c.call(w, Op::Free(p)) {
                    Ok(Reply::Freed) => {}
                    other_r => return Err(other(format!("event {i}: free answered {other_r:?}"))),
                }
                (len, -1)
            }
        };
        let cl = acct_classes.for_payload(len).expect("checked") as usize;
        let slots = acct_classes.get(cl as u8).expect("class").slots as u64;
        ideal_blocks -= live_objs[cl].div_ceil(slots);
        live_objs[cl] = (live_objs[cl] as i64 + d) as u64;
        ideal_blocks += live_objs[cl].div_ceil(slots);
        live = (live as i64 + d * len as i64) as u64;
        let op = i as u64 + 1;
        let ideal = ideal_blocks * bs;
        if compact_at == Some(op) {
            c.settle();
            match c.call(0, Op::Compact(None)) {
                Ok(Reply::Compacted(_)) => {}
                other_r => return Err(other(format!("compaction answered {other_r:?}"))),
            }
            out.at_point = c.store().accounting().active_bytes();
        }
        let active = c.store().accounting().active_bytes();
        if compact_at.is_none() {
            let waste = active.saturating_sub(ideal);
            if waste_peak.is_none_or(|p| waste >= p) {
                waste_peak = Some(waste);
                out.peak = (op, live, ideal, active);
            }
        }
        if points.get(next_point) == Some(&op) {
            out.samples.push((live, ideal, active));
            next_point += 1;
        }
    }
    c.settle();
    if cfg!(debug_assertions) {
        c.check().map_err(other)?;
    }
    let st = c.store().stats();
    out.compactions = st.compactions;
    out.blocks_compacted = st.blocks_compacted;
    out.compaction_ns = st.compaction_ns + st.collection_ns;
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cfg(mode: Mode, workers: usize) -> ReplayConfig {
        ReplayConfig {
            mode,
            workers,
            block_size: 1 << 16,
            threshold: None,
            seed: 1,
            samples: 10,
        }
    }

    #[test]
    fn traces_are_well_formed() {
        for t in [
            synthetic(1000, 100, 0.5, 1),
            redis_t1(0.05, 1),
            redis_t2(0.01, 1),
            redis_t3(0.02, 1),
        ] {
            let mut live = vec![false; t.keys as usize];
            for e in &t.events {
                match *e {
                    Event::Alloc { key, len } => {
                        assert!(!live[key as usize] && len > 0);
                        live[key as usize] = true;
                    }
                    Event::Free { key } => {
                        assert!(live[key as usize], "{}: free of a dead key", t.name);
                        live[key as usize] = false;
                    }
                }
            }
        }
        let s = synthetic(1000, 100, 0.25, 1);
        assert_eq!(s.events.len(), 1250);
        let t3 = redis_t3(0.02, 1);
        let frees = t3
            .events
            .iter()
            .filter(|e| matches!(e, Event::Free { .. }))
            .count();
        assert_eq!(frees, 500 * 4, "every other 150 B key: 4 allocations each");
    }

    #[test]
    fn the_lru_trace_fits_its_capacity() {
        let t = redis_t2(0.01, 7);
        let mut lens = vec![0u64; t.keys as usize];
        let mut used = 0u64;
        for e in &t.events {
            match *e {
                Event::Alloc { key, len } => {
                    lens[key as usize] = len as u64;
                    used += len as u64;
                }
                Event::Free { key } => used -= lens[key as usize],
            }
        }
        assert!(used as f64 <= (100u64 << 20) as f64 * 0.01);
        assert!(t.events.iter().any(|e| matches!(e, Event::Free { .. })));
    }

    #[test]
    fn compaction_lands_between_ideal_and_none_and_is_deterministic() {
        let t = synthetic(4000, 200, 0.7, 3);
        let r = replay(&t, &cfg(Mode::Store(Strategy::Corm(16)), 4)).unwrap();
        assert!(r.point > 4000, "peak waste among the frees, at {}", r.point);
        assert!(
            r.ideal_bytes <= r.active_bytes && r.active_bytes < r.no_compaction_bytes,
            "{r:?}"
        );
        assert!(r.blocks_compacted > 0);
        let again = replay(&t, &cfg(Mode::Store(Strategy::Corm(16)), 4)).unwrap();
        assert_eq!(
            (again.active_bytes, &again.timeline),
            (r.active_bytes, &r.timeline),
            "a seed replays exactly"
        );
        let none = replay(&t, &cfg(Mode::None, 4)).unwrap();
        assert_eq!(none.active_bytes, r.no_compaction_bytes);
        let ideal = replay(&t, &cfg(Mode::Ideal, 4)).unwrap();
        assert_eq!(ideal.active_bytes, r.ideal_bytes);
        assert_eq!(r.timeline.len(), 10);
        assert_eq!(r.timeline.last().unwrap().op, t.events.len() as u64);
    }

    #[test]
    fn running_out_of_address_space_grows_it() {
        let t = synthetic(3000, 500, 0.8, 5);
        let mut c = cfg(Mode::Store(Strategy::Hybrid(16)), 8);
        c.threshold = Some(1.2);
        let s = Strategy::Hybrid(16);
        let tiny = pass(&t, &c, s, c.threshold, None, &[], 4);
        assert!(
            matches!(tiny, Err(PassError::AddressSpace)),
            "{:?}",
            tiny.err()
        );
        let r = replay(&t, &c).unwrap();
        assert!(r.compactions > 1 && r.active_bytes <= r.no_compaction_bytes);
    }
}
