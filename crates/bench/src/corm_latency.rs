//! `dmkit bench corm --latency`: the latency of every CoRM call, one client
//! issuing one call at a time (CoRM, SIGMOD'21, §4.1, Fig. 9 and Fig. 10),
//! per object size, with direct pointers and with indirect ones (objects a
//! compaction moved to another offset), beside a raw one-sided READ of the
//! same slot.
//!
//! Per size: the client allocates `4 × objects` objects (timing each
//! Alloc), keeps one in four and, on those, times RPC Write, RPC Read,
//! DirectRead and a raw READ of the slot; it frees the other three in four
//! (timing each Free) and asks for a compaction, which merges the now
//! quarter-full blocks: kept objects whose offset was taken in the
//! destination block move, and their pointers become indirect. On the
//! moved ones it times RPC Read and Write (the node corrects the pointer),
//! DirectRead corrected by ScanRead (READ of the home block) and by an RPC
//! Read, then ReleasePtr (on moved and unmoved objects), and frees them.
//! Each row is the median (and mean) over the objects it timed.
//!
//! What each backend can show: on the simulator ([`run_sim`], a ConnectX-3
//! profile by default) the figures are the model's — wire and NIC timing
//! from the device profile, the node's CPU per request from its modelled
//! cores (an Alloc or Free costs [`dmkit_memnode::corm::service::ALLOC_FREE_NS`]
//! more than a read) — and the same seed gives the same table. On shm
//! ([`run`], an embedded node) a "round trip" is a shared-memory ring polled
//! by the node's worker threads and a READ is a copy: the figures measure
//! this implementation's software path on this host (and its scheduler on a
//! loaded machine), not a network.

use std::cell::RefCell;
use std::rc::Rc;
use std::time::{Duration, Instant};

use dmkit_corm::{CormClient, CormError};
use dmkit_fabric::{Fabric, GlobalAddr, RemoteRef};
use dmkit_memnode::corm::{CompactionReport, CormStats, ObjPtr, Policy, Store, StoreConfig};
use dmkit_runtime::{Ctx, Local, RuntimeConfig, Worker};
use dmkit_sim::{Sim, SimConfig};
use serde::Serialize;

use crate::corm_bench::{self, BLOCK};
use crate::micro::BenchError;

/// What to run.
#[derive(Debug, Clone)]
pub struct LatencyConfig {
    /// Payload sizes, one pass each.
    pub sizes: Vec<u32>,
    /// Objects timed per call and size (`4 ×` are allocated).
    pub objects: usize,
    /// The node's RPC workers (the store's workers).
    pub workers: usize,
    /// Seed (the store's ids and slots).
    pub seed: u64,
    /// The shm latency model's round trip of every verb and RPC, or none.
    pub rtt: Option<Duration>,
}

/// One call's latency at one size.
#[derive(Debug, Clone, Serialize)]
pub struct LatencyRow {
    /// The call: `alloc`, `free`, `write`, `read` (RPC), `direct_read`,
    /// `raw_read` (a READ of the slot), `direct_read+scan_read`,
    /// `direct_read+read`, `release_ptr`.
    pub call: String,
    /// `direct`, `indirect` (the object moved), or `-` (no pointer).
    pub pointer: String,
    /// Payload bytes.
    pub size: u32,
    /// Calls timed.
    pub n: usize,
    /// Median latency (µs).
    pub p50_us: f64,
    /// Mean latency (µs).
    pub mean_us: f64,
}

/// What a run measured.
#[derive(Debug, Clone, Serialize)]
pub struct LatencyResult {
    /// `shm` or `sim`.
    pub backend: String,
    /// The simulator's device profile (`None` on shm).
    pub profile: Option<String>,
    /// The store's block size.
    pub block_size: u64,
    /// Objects timed per call and size.
    pub objects: usize,
    /// The node's RPC workers.
    pub workers: usize,
    /// Every call at every size.
    pub rows: Vec<LatencyRow>,
    /// Per size: the compaction's report (how many kept objects moved:
    /// `objects_moved`; the indirect rows time those).
    pub compactions: Vec<(u32, CompactionReport)>,
    /// The store's accounting at the end (every object freed).
    pub store: CormStats,
    /// Wall-clock seconds the run took.
    pub wall_seconds: f64,
}

impl LatencyResult {
    /// The row of `call` with `pointer` at `size`.
    pub fn row(&self, call: &str, pointer: &str, size: u32) -> Option<&LatencyRow> {
        self.rows
            .iter()
            .find(|r| r.call == call && r.pointer == pointer && r.size == size)
    }
}

fn check(cfg: &LatencyConfig) -> Result<(), BenchError> {
    if cfg.sizes.is_empty() || cfg.sizes.contains(&0) {
        return Err(BenchError::Config(
            "--sizes: at least one payload size, each at least 1 byte".into(),
        ));
    }
    if cfg.objects == 0 || cfg.workers == 0 {
        return Err(BenchError::Config(
            "--objects and --workers must be at least 1".into(),
        ));
    }
    Ok(())
}

/// Bytes of the store's address space for `cfg` (every object of the
/// largest size allocated at once).
fn space(cfg: &LatencyConfig) -> u64 {
    let big = *cfg.sizes.iter().max().unwrap_or(&1);
    corm_bench::store_space(4 * cfg.objects as u64, big)
}

/// A store compacting only when asked (the run asks once per size).
fn store_config(cfg: &LatencyConfig) -> StoreConfig {
    let base = corm_bench::store_config(space(cfg), cfg.seed);
    StoreConfig {
        policy: Policy {
            on_alloc_failure: false,
            ..base.policy
        },
        ..base
    }
}

type Outcome = Rc<RefCell<Option<Result<Measured, CormError>>>>;

#[derive(Default)]
struct Measured {
    rows: Vec<LatencyRow>,
    compactions: Vec<(u32, CompactionReport)>,
}

fn row(call: &str, pointer: &str, size: u32, mut ns: Vec<u64>) -> LatencyRow {
    ns.sort_unstable();
    let n = ns.len();
    let us = |x: f64| x / 1e3;
    LatencyRow {
        call: call.into(),
        pointer: pointer.into(),
        size,
        n,
        p50_us: if n == 0 { 0.0 } else { us(ns[n / 2] as f64) },
        mean_us: if n == 0 {
            0.0
        } else {
            us(ns.iter().sum::<u64>() as f64 / n as f64)
        },
    }
}

/// The client's whole run, one call at a time.
async fn client(ctx: &Ctx, cfg: &LatencyConfig) -> Result<Measured, CormError> {
    let c = CormClient::connect(ctx, 0).await?;
    let rkey = c.info().rkey;
    let buf = Local::at(0, BLOCK as usize);
    let mut out = Measured::default();
    for &size in &cfg.sizes {
        let payload: Vec<u8> = (0..size as usize).map(|i| i as u8).collect();
        let mut t = |call: &str, pointer: &str, ns: Vec<u64>| {
            out.rows.push(row(call, pointer, size, ns));
        };
        // Direct pointers.
        let mut all = Vec::with_capacity(4 * cfg.objects);
        let mut ns = Vec::with_capacity(4 * cfg.objects);
        for _ in 0..4 * cfg.objects {
            let t0 = ctx.now();
            all.push(c.alloc(ctx, size).await?);
            ns.push(ctx.now() - t0);
        }
        t("alloc", "-", ns);
        let mut kept: Vec<ObjPtr> = Vec::with_capacity(cfg.objects);
        let mut others: Vec<ObjPtr> = Vec::with_capacity(3 * cfg.objects);
        for (i, p) in all.into_iter().enumerate() {
            if i % 4 == 0 {
                kept.push(p)
            } else {
                others.push(p)
            }
        }
        let mut ns = Vec::new();
        for p in &mut kept {
            let t0 = ctx.now();
            c.write(ctx, p, &payload).await?;
            ns.push(ctx.now() - t0);
        }
        t("write", "direct", ns);
        let mut ns = Vec::new();
        for p in &mut kept {
            let t0 = ctx.now();
            c.read(ctx, p).await?;
            ns.push(ctx.now() - t0);
        }
        t("read", "direct", ns);
        let mut ns = Vec::new();
        for p in &kept {
            let t0 = ctx.now();
            c.direct_read(ctx, *p, buf).await?;
            ns.push(ctx.now() - t0);
        }
        t("direct_read", "direct", ns);
        let mut ns = Vec::new();
        for p in &kept {
            let slot = Local::at(0, c.slot_size(*p)?);
            let t0 = ctx.now();
            ctx.read_sync(RemoteRef::new(GlobalAddr::new(0, p.offset()), rkey), slot)
                .await?;
            ns.push(ctx.now() - t0);
        }
        t("raw_read", "-", ns);
        let mut free_ns = Vec::new();
        for p in others {
            let t0 = ctx.now();
            c.free(ctx, p).await?;
            free_ns.push(ctx.now() - t0);
        }
        // Quarter-full blocks merge; kept objects on taken offsets move.
        let report = c.compact(ctx, None).await?;
        out.compactions.push((size, report));
        let mut moved = Vec::new();
        let mut unmoved = Vec::new();
        for p in kept {
            match c.direct_read(ctx, p, buf).await {
                Err(CormError::Moved) => moved.push(p),
                Ok(_) => unmoved.push(p),
                Err(e) => return Err(e),
            }
        }
        // Indirect pointers: each call on a fresh copy of the stale one.
        let mut t = |call: &str, pointer: &str, ns: Vec<u64>| {
            out.rows.push(row(call, pointer, size, ns));
        };
        let mut ns = Vec::new();
        for p in &moved {
            let mut q = *p;
            let t0 = ctx.now();
            c.read(ctx, &mut q).await?;
            ns.push(ctx.now() - t0);
        }
        t("read", "indirect", ns);
        let mut ns = Vec::new();
        for p in &moved {
            let mut q = *p;
            let t0 = ctx.now();
            c.write(ctx, &mut q, &payload).await?;
            ns.push(ctx.now() - t0);
        }
        t("write", "indirect", ns);
        let mut ns = Vec::new();
        for p in &moved {
            let mut q = *p;
            let t0 = ctx.now();
            c.scan_read(ctx, &mut q, buf).await?;
            ns.push(ctx.now() - t0);
        }
        t("direct_read+scan_read", "indirect", ns);
        let mut ns = Vec::new();
        for p in &moved {
            let mut q = *p;
            let t0 = ctx.now();
            match c.direct_read(ctx, q, buf).await {
                Err(CormError::Moved) => {
                    c.read(ctx, &mut q).await?;
                }
                other => {
                    other?;
                }
            }
            ns.push(ctx.now() - t0);
        }
        t("direct_read+read", "indirect", ns);
        let mut left = Vec::with_capacity(moved.len() + unmoved.len());
        for (set, pointer) in [(&moved, "indirect"), (&unmoved, "direct")] {
            let mut ns = Vec::new();
            for p in set {
                let t0 = ctx.now();
                left.push(c.release_ptr(ctx, *p).await?);
                ns.push(ctx.now() - t0);
            }
            t("release_ptr", pointer, ns);
        }
        for p in left {
            let t0 = ctx.now();
            c.free(ctx, p).await?;
            free_ns.push(ctx.now() - t0);
        }
        t("free", "-", free_ns);
    }
    Ok(out)
}

fn spawn(w: &mut Worker, cfg: &LatencyConfig, out: Outcome) {
    let cfg = cfg.clone();
    w.spawn(move |ctx: Ctx| async move {
        let r = client(&ctx, &cfg).await;
        *out.borrow_mut() = Some(r);
    });
}

fn taken(out: &Outcome) -> Result<Measured, BenchError> {
    match out.borrow_mut().take() {
        Some(Ok(m)) => Ok(m),
        Some(Err(e)) => Err(BenchError::Config(format!("a CoRM call failed: {e}"))),
        None => Err(BenchError::Config("the client did not finish".into())),
    }
}

fn runtime_config(cfg: &LatencyConfig) -> RuntimeConfig {
    RuntimeConfig {
        seed: cfg.seed,
        op_stats: false,
        ..RuntimeConfig::default()
    }
}

fn result(
    cfg: &LatencyConfig,
    backend: &str,
    profile: Option<String>,
    m: Measured,
    store: &Store,
    wall: Instant,
) -> LatencyResult {
    LatencyResult {
        backend: backend.into(),
        profile,
        block_size: BLOCK,
        objects: cfg.objects,
        workers: cfg.workers,
        rows: m.rows,
        compactions: m.compactions,
        store: store.stats(),
        wall_seconds: wall.elapsed().as_secs_f64(),
    }
}

/// Runs on an embedded shm node (wall-clock latencies).
pub fn run(cfg: &LatencyConfig) -> Result<LatencyResult, BenchError> {
    check(cfg)?;
    let wall = Instant::now();
    let big = *cfg.sizes.iter().max().expect("checked");
    let (fabric, store) =
        corm_bench::embedded_store(space(cfg), big, cfg.workers, cfg.rtt, store_config(cfg))?;
    let mut w = Worker::builder(&fabric)
        .config(runtime_config(cfg))
        .tasks(1)
        .local_bytes(BLOCK as usize)
        .build()?;
    let out: Outcome = Rc::default();
    spawn(&mut w, cfg, out.clone());
    w.run();
    let m = taken(&out)?;
    Ok(result(cfg, "shm", None, m, &store, wall))
}

/// Runs on the simulator (virtual-time latencies; node 0's modelled cores,
/// `cfg.workers` of them, serve the store). The same configuration and
/// seed give the same result.
pub fn run_sim(sim_cfg: SimConfig, cfg: &LatencyConfig) -> Result<LatencyResult, BenchError> {
    check(cfg)?;
    let wall = Instant::now();
    corm_bench::refuse_rtt_on_sim(cfg.rtt)?;
    let profile = sim_cfg.profile.name.clone();
    let mut sim = Sim::new(corm_bench::sim_for_store(sim_cfg, space(cfg), cfg.workers))?;
    let store = corm_bench::sim_store(&sim, store_config(cfg))?;
    let rcfg = runtime_config(cfg);
    let th = sim.add_worker(0, |f: &dyn Fabric, clock| {
        Worker::builder(f)
            .clock(clock)
            .config(rcfg.clone())
            .tasks(1)
            .local_bytes(BLOCK as usize)
            .build()
    })?;
    let out: Outcome = Rc::default();
    spawn(sim.worker_mut(th), cfg, out.clone());
    sim.run();
    let m = taken(&out)?;
    Ok(result(cfg, "sim", Some(profile), m, &store, wall))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cfg() -> LatencyConfig {
        LatencyConfig {
            sizes: vec![32, 1000],
            objects: 64,
            workers: 2,
            seed: 3,
            rtt: None,
        }
    }

    /// On the simulator: every call timed at every size, objects moved by
    /// the compaction timed as indirect, the store empty at the end, the
    /// same table for the same seed, and the model's shape of Fig. 9/10:
    /// a DirectRead costs no more than an RPC read, a failed DirectRead
    /// corrected by a scan costs more than a DirectRead, an Alloc more
    /// than a raw READ.
    #[test]
    fn sim_times_every_call_and_is_deterministic() {
        let sim = || SimConfig {
            profile: dmkit_sim::Profile::load("cx3-56g").unwrap(),
            seed: 3,
            ..SimConfig::default()
        };
        let a = run_sim(sim(), &cfg()).unwrap();
        let b = run_sim(sim(), &cfg()).unwrap();
        assert_eq!(
            serde_json::to_string(&a.rows).unwrap(),
            serde_json::to_string(&b.rows).unwrap()
        );
        assert_eq!(a.store.live_objects, 0, "{:?}", a.store);
        for &size in &cfg().sizes {
            let moved = &a.compactions.iter().find(|(s, _)| *s == size).unwrap().1;
            assert!(moved.objects_moved > 0, "{size}: {moved:?}");
            for (call, pointer) in [
                ("alloc", "-"),
                ("free", "-"),
                ("write", "direct"),
                ("read", "direct"),
                ("direct_read", "direct"),
                ("raw_read", "-"),
                ("read", "indirect"),
                ("write", "indirect"),
                ("direct_read+scan_read", "indirect"),
                ("direct_read+read", "indirect"),
                ("release_ptr", "indirect"),
            ] {
                let r = a.row(call, pointer, size).unwrap();
                assert!(r.n > 0 && r.p50_us > 0.0, "{call} {pointer} {size}: {r:?}");
            }
            let p = |c: &str, k: &str| a.row(c, k, size).unwrap().p50_us;
            assert!(p("direct_read", "direct") <= p("read", "direct"), "{size}");
            assert!(
                p("direct_read+scan_read", "indirect") > p("direct_read", "direct"),
                "{size}"
            );
            assert!(p("alloc", "-") > p("raw_read", "-"), "{size}");
        }
    }

    #[test]
    fn shm_times_every_call() {
        let r = run(&LatencyConfig {
            objects: 16,
            ..cfg()
        })
        .unwrap();
        assert_eq!(r.store.live_objects, 0);
        assert!(r.row("direct_read", "direct", 32).unwrap().n == 16);
        assert!(r.row("alloc", "-", 1000).unwrap().n == 64);
    }
}
