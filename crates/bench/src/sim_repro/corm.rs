//! CoRM's evaluation on the simulator ("CoRM: Compactable Remote Memory
//! over RDMA", SIGMOD'21, §4), on its hardware (`--profile cx3-56g`,
//! ConnectX-3, FDR 56 Gb; the node's 8 worker threads are the profile's 8
//! RPC cores, calibrated on CoRM's RPC round trip and saturation). The
//! store is the real one (`dmkit_memnode::corm`) served by the node's
//! modelled cores; the clients are `dmkit-corm`'s.
//!
//! - `corm-fig12` — §4.2.2, Fig. 12: YCSB throughput of RPC reads vs
//!   DirectReads (writes always by RPC), read:write 50:50, 95:5 and 100:0,
//!   zipfian 0.99 and uniform, 1–32 clients (each one request at a time,
//!   spread over 11 client machines as the paper's 12-machine cluster),
//!   32-byte objects, 8 workers. The paper loads 8 M objects; the
//!   reproduction loads 100 K (quick: 5 K), so the node's translation
//!   cache holds the uniform working set that misses on the paper's NIC
//!   (its stated reason for zipf beating uniform): expect no such gap here.
//!   Published (§4.2.2's text): RPC stabilises at 0.7 Mops beyond 4
//!   clients; DirectReads reach 1.25 Mops at 50:50 and up to 1.75
//!   (uniform) and 2.2 (zipf) Mops read-dominant (put at 100:0, 32
//!   clients).
//! - `corm-fig9` — §4.1, Fig. 9: the median latency of every CoRM call
//!   with direct pointers, one client issuing one call at a time
//!   (`dmkit bench corm --latency --backend sim`): Alloc, Free, RPC Read
//!   and Write, DirectRead, and a raw one-sided READ of the same slot, per
//!   object size (x, bytes: 16, 64, 256, 1024; quick: 16, 256), 4 KiB
//!   blocks, 8 workers. Published (§4.1's text): a raw READ "as low as 1.7
//!   µs" (put at the smallest size); Alloc and Free "add about 0.5 µs to
//!   the base RPC call" (rows `… − RPC Read`, smallest size; the model's
//!   `ALLOC_FREE_NS` is that sentence, so this agreement is by
//!   construction); RPC Read and Write "have similar performance" (ratio
//!   1); a DirectRead of an object under 256 B has "approximately the same
//!   latency as a raw RDMA read" (ratio 1 below 256 B).
//! - `corm-fig10` — §4.1, Fig. 10: the same run's indirect pointers (kept
//!   objects a compaction moved to another offset): RPC Read and Write, a
//!   failed DirectRead corrected by ScanRead and by an RPC Read, and
//!   ReleasePtr of a moved and of an unmoved object. Published: indirect
//!   RPC calls show "no significant differences in latency" from direct
//!   ones (ratio 1), and ReleasePtr of an indirect pointer "costs about 0.3
//!   µs" (read as: over the RPC Read it replaces, smallest size). The text
//!   gives no number for the two corrections, only their order at 4 KiB
//!   blocks (RPC Read slower than ScanRead).
//!
//!   Off, and why: the raw READ predicts 3.3 µs for the text's 1.7 (this
//!   profile's network stages are not calibrated on a READ; see its
//!   header), and with READs that slow a ScanRead of the 4 KiB block costs
//!   more than the RPC Read correction, the reverse of the text's order
//!   (row `DirectRead + RPC Read / DirectRead + ScanRead` below 1). The
//!   model charges ReleasePtr no lookup of the moved object, so its 0.3 µs
//!   over an RPC is predicted as about 0.
//! - `corm-fig16` — §4.3.2, Fig. 16: one RPC client and one RDMA client
//!   read every object of a store sequentially, again and again; a
//!   compaction of everything starts after a while and runs without
//!   breaks (as the paper's, `merges_per_step = 0`). Objects: 32 bytes,
//!   75 % of them freed at random (the paper: 8 M loaded; here 40 K, quick
//!   8 K). (top) pointers corrected by thread messaging, the RDMA client
//!   corrects with ScanRead; (bottom) by block scanning, the RDMA client
//!   corrects with an RPC read. Rows: each client's throughput per time
//!   bucket, and per configuration and client: the throughput before,
//!   during and after the compaction, the longest time without a completed
//!   read ("unavailability"), and that per compacted block (the paper: 700
//!   ms for 5,794 blocks, 121 µs each, top RPC client). Compaction's CPU
//!   time is modelled from §4.3.1 (Fig. 15, ConnectX-3: 100 µs per
//!   one-page block); a merge takes effect at once in virtual time, so the
//!   22 % slowdown the paper's RPC client sees in the bottom run (objects
//!   unreadable while they move) is not predicted.

use std::cell::RefCell;
use std::rc::Rc;
use std::time::Duration;

use dmkit_corm::{CormClient, CormError};
use dmkit_fabric::Fabric;
use dmkit_memnode::corm::class::Strategy;
use dmkit_memnode::corm::service::CormService;
use dmkit_memnode::corm::{Correction, ObjPtr, Policy, StoreConfig};
use dmkit_runtime::{Ctx, Local, RuntimeConfig, Worker};
use dmkit_sim::{Profile, Sim, SimConfig};

use super::{Acc, Job, Outcome, ReproOptions};
use crate::corm_bench::{self, CormBenchConfig, ReadPath};
use crate::corm_latency::{self, LatencyConfig};
use crate::micro::BenchError;

/// Figures of this module.
pub(super) const FIGURES: [&str; 4] = ["corm-fig9", "corm-fig10", "corm-fig12", "corm-fig16"];

/// One pass over figure `name` of this module (`None`: not one of them).
pub(super) fn figure(
    name: &str,
    opts: &ReproOptions,
    acc: &mut Acc,
) -> Option<Result<String, BenchError>> {
    Some(match name {
        "corm-fig9" => fig9_10(opts, acc, false),
        "corm-fig10" => fig9_10(opts, acc, true),
        "corm-fig12" => fig12(opts, acc),
        "corm-fig16" => fig16(opts, acc),
        _ => return None,
    })
}

/// Asks for one run whose outcome is a list of values.
fn values(
    acc: &mut Acc,
    n: usize,
    run: impl FnOnce() -> Result<(Vec<f64>, u64), BenchError> + Send + 'static,
) -> Vec<f64> {
    match acc.ask(|| Job::Values(Box::new(run))) {
        Some(Outcome::Values(v, _)) => v,
        Some(_) => unreachable!("a values job answers values"),
        None => vec![0.0; n],
    }
}

/// The paper's cluster: one node machine, 11 client machines.
const CLIENT_MACHINES: usize = 11;
/// CoRM's worker threads (§4: "8 worker threads").
const WORKERS: usize = 8;
const BLOCK: usize = 4096;

fn fig12(opts: &ReproOptions, acc: &mut Acc) -> Result<String, BenchError> {
    let (objects, clients, ratios, dists, window): (usize, &[usize], &[u32], &[f64], u64) =
        if opts.quick {
            (5_000, &[1, 8], &[50, 100], &[0.99], 2)
        } else {
            (
                100_000,
                &[1, 2, 4, 8, 16, 32],
                &[50, 95, 100],
                &[0.99, 0.0],
                10,
            )
        };
    let top = *clients.last().expect("client counts");
    for &zipf in dists {
        for &reads in ratios {
            for read in [ReadPath::Rpc, ReadPath::Direct] {
                let series = format!(
                    "{} {reads}:{} {}",
                    if read == ReadPath::Rpc { "RPC" } else { "RDMA" },
                    100 - reads,
                    if zipf > 0.0 { "zipf" } else { "uniform" }
                );
                for &n in clients {
                    let cfg = CormBenchConfig {
                        read,
                        read_percent: reads,
                        objects,
                        size: 32,
                        zipf,
                        threads: n,
                        coros: 1,
                        workers: WORKERS,
                        duration: Duration::from_millis(window),
                        warmup: Duration::from_millis(1),
                        seed: opts.seed,
                        rtt: None,
                        pin: false,
                    };
                    let sim = SimConfig {
                        profile: opts.profile.clone(),
                        seed: opts.seed,
                        compute_machines: CLIENT_MACHINES,
                        ..SimConfig::default()
                    };
                    let v = values(acc, 1, move || {
                        let r = corm_bench::run_sim(sim, &cfg)?;
                        Ok((vec![r.mops], r.ops))
                    });
                    let published = match (read, reads, zipf > 0.0) {
                        (ReadPath::Rpc, _, _) if n > 4 => Some(0.7),
                        (ReadPath::Direct, 50, _) if n == top => Some(1.25),
                        (ReadPath::Direct, 100, true) if n == top => Some(2.2),
                        (ReadPath::Direct, 100, false) if n == top => Some(1.75),
                        _ => None,
                    };
                    acc.push(&series, n as f64, v[0], "Mops", published);
                }
            }
        }
    }
    Ok("x: clients (one request at a time each)".into())
}

/// Fig. 9 (direct pointers) or Fig. 10 (`indirect`): one latency run on
/// the node's modelled cores, its medians as rows (x: object size, bytes).
fn fig9_10(opts: &ReproOptions, acc: &mut Acc, indirect: bool) -> Result<String, BenchError> {
    let (sizes, objects): (&[u32], usize) = if opts.quick {
        (&[16, 256], 100)
    } else {
        (&[16, 64, 256, 1024], 1000)
    };
    // (call, pointer, series) of the bench's rows, in the figure's order.
    let calls: &[(&str, &str, &str)] = if indirect {
        &[
            ("read", "indirect", "RPC Read, indirect"),
            ("write", "indirect", "RPC Write, indirect"),
            ("direct_read+scan_read", "indirect", "DirectRead + ScanRead"),
            ("direct_read+read", "indirect", "DirectRead + RPC Read"),
            ("release_ptr", "indirect", "ReleasePtr, indirect"),
            ("release_ptr", "direct", "ReleasePtr, direct"),
            ("read", "direct", "RPC Read, direct"),
            ("write", "direct", "RPC Write, direct"),
        ]
    } else {
        &[
            ("alloc", "-", "Alloc"),
            ("free", "-", "Free"),
            ("read", "direct", "RPC Read"),
            ("write", "direct", "RPC Write"),
            ("direct_read", "direct", "DirectRead"),
            ("raw_read", "-", "raw RDMA read"),
        ]
    };
    let cfg = LatencyConfig {
        sizes: sizes.to_vec(),
        objects,
        workers: WORKERS,
        seed: opts.seed,
        rtt: None,
    };
    let sim = SimConfig {
        profile: opts.profile.clone(),
        seed: opts.seed,
        ..SimConfig::default()
    };
    let keys: Vec<(String, String)> = calls
        .iter()
        .map(|&(c, p, _)| (c.to_string(), p.to_string()))
        .collect();
    let n = calls.len() * sizes.len();
    let v = values(acc, n, move || {
        let r = corm_latency::run_sim(sim, &cfg)?;
        let mut v = Vec::with_capacity(n);
        let mut work = 0;
        for (c, p) in &keys {
            for &s in &cfg.sizes {
                let row = r.row(c, p, s).ok_or_else(|| err("no latency row", c))?;
                v.push(row.p50_us);
                work += row.n as u64;
            }
        }
        Ok((v, work))
    });
    let at = |call: usize, size: usize| v[call * sizes.len() + size];
    let smallest = 0;
    for (i, &(_, _, series)) in calls.iter().enumerate() {
        for (j, &s) in sizes.iter().enumerate() {
            let published =
                (!indirect && series == "raw RDMA read" && j == smallest).then_some(1.7);
            acc.push(series, f64::from(s), at(i, j), "us", published);
        }
    }
    let ratio = |a: f64, b: f64| if b > 0.0 { a / b } else { 0.0 };
    for (j, &s) in sizes.iter().enumerate() {
        let x = f64::from(s);
        if indirect {
            acc.push(
                "RPC Read: indirect / direct",
                x,
                ratio(at(0, j), at(6, j)),
                "x",
                Some(1.0),
            );
            acc.push(
                "RPC Write: indirect / direct",
                x,
                ratio(at(1, j), at(7, j)),
                "x",
                Some(1.0),
            );
            acc.push(
                "DirectRead + RPC Read / DirectRead + ScanRead",
                x,
                ratio(at(3, j), at(2, j)),
                "x",
                None,
            );
            acc.push(
                "ReleasePtr, indirect − RPC Read, direct",
                x,
                at(4, j) - at(6, j),
                "us",
                (j == smallest).then_some(0.3),
            );
        } else {
            for (k, name) in [(0, "Alloc − RPC Read"), (1, "Free − RPC Read")] {
                acc.push(
                    name,
                    x,
                    at(k, j) - at(2, j),
                    "us",
                    (j == smallest).then_some(0.5),
                );
            }
            acc.push(
                "RPC Write / RPC Read",
                x,
                ratio(at(3, j), at(2, j)),
                "x",
                Some(1.0),
            );
            acc.push(
                "DirectRead / raw RDMA read",
                x,
                ratio(at(4, j), at(5, j)),
                "x",
                (s < 256).then_some(1.0),
            );
        }
    }
    Ok("x: object size (bytes); one call at a time, median µs".into())
}

/// A Fig. 16 run's shape.
#[derive(Debug, Clone)]
struct TimelinePoint {
    profile: Profile,
    seed: u64,
    /// Objects allocated; 75 % are freed.
    objects: u64,
    correction: Correction,
    /// When the compaction is asked for (after loading; ns).
    compact_at: u64,
    /// The run's length (after loading; ns).
    total: u64,
    /// Bucket width (ns).
    bucket: u64,
}

/// Per client (RPC, RDMA): reads completed per bucket; then the
/// compaction's start and end (ns after loading) and blocks compacted.
struct Timeline {
    rpc: Vec<u64>,
    rdma: Vec<u64>,
    started: u64,
    ended: u64,
    blocks: u64,
}

fn sim_worker(
    f: &dyn Fabric,
    clock: std::sync::Arc<dyn dmkit_runtime::Clock>,
    id: usize,
    seed: u64,
) -> Result<Worker, dmkit_fabric::FabricError> {
    Worker::builder(f)
        .clock(clock)
        .config(RuntimeConfig {
            seed: seed ^ id as u64,
            op_stats: false,
            ..RuntimeConfig::default()
        })
        .id(id)
        .tasks(1)
        .local_bytes(BLOCK)
        .build()
}

fn mix(mut x: u64) -> u64 {
    x = (x ^ (x >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    x ^ (x >> 31)
}

fn err(what: &str, e: impl std::fmt::Display) -> BenchError {
    BenchError::Config(format!("{what}: {e}"))
}

/// Runs one Fig. 16 configuration: load, free 75 %, then the two clients
/// and, at `compact_at`, a compaction of everything.
fn timeline(p: &TimelinePoint) -> Result<Timeline, BenchError> {
    let mut sim = Sim::new(SimConfig {
        profile: p.profile.clone(),
        seed: p.seed,
        compute_machines: 3,
        memory_bytes: (p.objects * 64 * 4).max(64 << 20),
        page_size: BLOCK as u64,
        rpc_workers: Some(WORKERS),
        ..SimConfig::default()
    })?;
    let node = sim
        .fabric()
        .memory()
        .embedded_node(0)
        .ok_or_else(|| BenchError::Config("no memory node 0".into()))?;
    CormService::register(
        &node,
        StoreConfig {
            block_size: BLOCK as u64,
            strategy: Strategy::Corm(16),
            correction: p.correction,
            policy: Policy {
                threshold: None,
                merges_per_step: 0,
                ..Policy::default()
            },
            virtual_bytes: (p.objects * 64 * 2).next_multiple_of(BLOCK as u64),
            seed: Some(p.seed),
            ..StoreConfig::default()
        },
    )
    .map_err(BenchError::Config)?;
    // Load, then free 75 % at random.
    let kept: Rc<RefCell<Result<Vec<ObjPtr>, String>>> = Rc::new(RefCell::new(Ok(Vec::new())));
    let th = sim.add_worker(0, |f: &dyn Fabric, c| sim_worker(f, c, 100, p.seed))?;
    let (k, n, seed) = (kept.clone(), p.objects, p.seed);
    sim.worker_mut(th).spawn(move |ctx: Ctx| async move {
        let r = async {
            let c = CormClient::connect(&ctx, 0).await?;
            let mut keep = Vec::new();
            let mut all = Vec::new();
            for i in 0..n {
                let mut q = c.alloc(&ctx, 32).await?;
                c.write(&ctx, &mut q, &[i as u8; 32]).await?;
                all.push(q);
            }
            for (i, q) in all.into_iter().enumerate() {
                if mix(seed ^ i as u64).is_multiple_of(4) {
                    keep.push(q);
                } else {
                    c.free(&ctx, q).await?;
                }
            }
            Ok::<_, CormError>(keep)
        }
        .await;
        *k.borrow_mut() = r.map_err(|e| e.to_string());
    });
    sim.run();
    sim.clear_workers();
    let kept = std::mem::replace(&mut *kept.borrow_mut(), Ok(Vec::new()))
        .map_err(|e| err("loading the store", e))?;
    if kept.is_empty() {
        return Err(BenchError::Config("no object kept".into()));
    }
    let t0 = sim.now();
    let buckets = p.total.div_ceil(p.bucket) as usize;
    let until = t0 + p.total;
    let failure: Rc<RefCell<Option<String>>> = Rc::default();
    let counts = [
        Rc::new(RefCell::new(vec![0u64; buckets])),
        Rc::new(RefCell::new(vec![0u64; buckets])),
    ];
    for (i, rdma) in [false, true].into_iter().enumerate() {
        let th = sim.add_worker(1 + i, |f: &dyn Fabric, c| sim_worker(f, c, i, p.seed))?;
        let (mut mine, count, failure) = (kept.clone(), counts[i].clone(), failure.clone());
        let (bucket, correction) = (p.bucket, p.correction);
        sim.worker_mut(th).spawn(move |ctx: Ctx| async move {
            let r = async {
                let c = CormClient::connect(&ctx, 0).await?;
                let buf = Local::at(0, BLOCK);
                'run: loop {
                    for q in mine.iter_mut() {
                        if ctx.now() >= until {
                            break 'run;
                        }
                        if rdma {
                            match c.direct_read(&ctx, *q, buf).await {
                                Ok(_) => {}
                                Err(CormError::Moved) if correction == Correction::Message => {
                                    c.scan_moved(&ctx, q, buf).await?;
                                }
                                Err(CormError::Moved) => {
                                    c.read(&ctx, q).await?;
                                }
                                Err(e) => return Err(e),
                            }
                        } else {
                            c.read(&ctx, q).await?;
                        }
                        let at = ctx.now();
                        if at < until {
                            count.borrow_mut()[((at - t0) / bucket) as usize] += 1;
                        }
                    }
                }
                Ok::<(), CormError>(())
            }
            .await;
            if let Err(e) = r {
                failure.borrow_mut().get_or_insert(e.to_string());
            }
        });
    }
    // The compaction: asked for at `compact_at`, answered when it ends.
    let span: Rc<RefCell<Option<(u64, u64, u64)>>> = Rc::default();
    let th = sim.add_worker(0, |f: &dyn Fabric, c| sim_worker(f, c, 101, p.seed))?;
    let (s, failure2, at) = (span.clone(), failure.clone(), t0 + p.compact_at);
    sim.worker_mut(th).spawn(move |ctx: Ctx| async move {
        let c = match CormClient::connect(&ctx, 0).await {
            Ok(c) => c,
            Err(e) => return *failure2.borrow_mut() = Some(e.to_string()),
        };
        ctx.sleep(at.saturating_sub(ctx.now())).await;
        let started = ctx.now();
        match c.compact(&ctx, None).await {
            Ok(r) => *s.borrow_mut() = Some((started - t0, ctx.now() - t0, r.blocks_freed)),
            Err(e) => *failure2.borrow_mut() = Some(e.to_string()),
        }
    });
    sim.run_until(until);
    if let Some(e) = failure.borrow_mut().take() {
        return Err(err("a Fig. 16 client failed", e));
    }
    let (started, ended, blocks) = span
        .borrow_mut()
        .take()
        .ok_or_else(|| BenchError::Config("the compaction did not end in the run".into()))?;
    let [rpc, rdma] = counts.map(|c| c.borrow().clone());
    Ok(Timeline {
        rpc,
        rdma,
        started,
        ended,
        blocks,
    })
}

/// Mops over buckets `[a, b)`.
fn rate(v: &[u64], a: usize, b: usize, bucket: u64) -> f64 {
    let (a, b) = (a.min(v.len()), b.min(v.len()));
    if b <= a {
        return 0.0;
    }
    v[a..b].iter().sum::<u64>() as f64 / ((b - a) as f64 * bucket as f64) * 1e3
}

/// The longest run of empty buckets (ms).
fn longest_gap(v: &[u64], bucket: u64) -> f64 {
    let (mut best, mut cur) = (0u64, 0u64);
    for &c in v {
        cur = if c == 0 { cur + 1 } else { 0 };
        best = best.max(cur);
    }
    (best * bucket) as f64 / 1e6
}

fn fig16(opts: &ReproOptions, acc: &mut Acc) -> Result<String, BenchError> {
    let ms = 1_000_000u64;
    let (objects, compact_at, total, bucket) = if opts.quick {
        (8_000, 2 * ms, 30 * ms, ms / 2)
    } else {
        (40_000, 5 * ms, 150 * ms, ms)
    };
    for (name, correction) in [
        ("top (messaging)", Correction::Message),
        ("bottom (scan)", Correction::Scan),
    ] {
        let point = TimelinePoint {
            profile: opts.profile.clone(),
            seed: opts.seed,
            objects,
            correction,
            compact_at,
            total,
            bucket,
        };
        let n = total.div_ceil(bucket) as usize;
        let v = values(acc, 2 * n + 3, move || {
            let t = timeline(&point)?;
            let work = t.rpc.iter().chain(&t.rdma).sum::<u64>();
            let mut v: Vec<f64> = t.rpc.iter().chain(&t.rdma).map(|&c| c as f64).collect();
            v.extend([t.started as f64, t.ended as f64, t.blocks as f64]);
            Ok((v, work))
        });
        let (rpc, rdma) = (&v[..n], &v[n..2 * n]);
        let (started, ended, blocks) = (v[2 * n], v[2 * n + 1], v[2 * n + 2]);
        for (client, series) in [("RPC", rpc), ("RDMA", rdma)] {
            let s = format!("{name} {client}");
            for (i, &c) in series.iter().enumerate() {
                let mops = c / bucket as f64 * 1e3;
                acc.push(&s, (i as u64 * bucket) as f64 / 1e6, mops, "Mops", None);
            }
            let counts: Vec<u64> = series.iter().map(|&c| c as u64).collect();
            let a = (started as u64 / bucket) as usize;
            let b = (ended as u64).div_ceil(bucket) as usize;
            let before = rate(&counts, 0, a, bucket);
            let during = rate(&counts, a, b, bucket);
            let after = rate(&counts, b, n, bucket);
            acc.push(&format!("{s}: before"), -1.0, before, "Mops", None);
            acc.push(&format!("{s}: during"), -1.0, during, "Mops", None);
            acc.push(&format!("{s}: after"), -1.0, after, "Mops", None);
            // §4.3.2: bottom, the RPC client loses 22 % during the
            // compaction; top, both lose 5 % while correcting pointers
            // (after it).
            let during_published =
                (correction == Correction::Scan && client == "RPC").then_some(0.78);
            acc.push(
                &format!("{s}: during / before"),
                -1.0,
                if before > 0.0 { during / before } else { 0.0 },
                "x",
                during_published,
            );
            acc.push(
                &format!("{s}: after / before"),
                -1.0,
                if before > 0.0 { after / before } else { 0.0 },
                "x",
                (correction == Correction::Message).then_some(0.95),
            );
            let gap = longest_gap(&counts, bucket);
            acc.push(&format!("{s}: unavailability"), -1.0, gap, "ms", None);
            acc.push(
                &format!("{s}: unavailability per compacted block"),
                -1.0,
                if blocks > 0.0 {
                    gap * 1e3 / blocks
                } else {
                    0.0
                },
                "us",
                (correction == Correction::Message && client == "RPC").then_some(700e3 / 5794.0),
            );
        }
        // §4.3.2, bottom: "DirectReads provides 1.6x faster performance
        // than RPC reads even in the presence of indirect pointers and when
        // CoRM performs compaction" (the whole run).
        let (all_rpc, all_rdma): (f64, f64) = (rpc.iter().sum(), rdma.iter().sum());
        acc.push(
            &format!("{name}: RDMA / RPC"),
            -1.0,
            if all_rpc > 0.0 {
                all_rdma / all_rpc
            } else {
                0.0
            },
            "x",
            (correction == Correction::Scan).then_some(1.6),
        );
        acc.push(
            &format!("{name}: compaction"),
            -1.0,
            (ended - started) / 1e6,
            "ms",
            None,
        );
        acc.push(
            &format!("{name}: blocks compacted"),
            -1.0,
            blocks,
            "blocks",
            None,
        );
    }
    Ok("x: ms since the store was loaded (summary rows: x = -1)".into())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn gaps_and_rates() {
        assert_eq!(longest_gap(&[3, 0, 0, 1, 0], 1_000_000), 2.0);
        assert_eq!(longest_gap(&[1, 1], 1_000_000), 0.0);
        assert!((rate(&[10, 20, 30], 1, 3, 1_000) - 25.0 / 1_000.0 * 1e3).abs() < 1e-9);
        assert_eq!(rate(&[1], 2, 3, 1_000), 0.0);
    }
}
