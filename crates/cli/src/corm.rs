//! `dmkit corm`: the CoRM object store's offline tools.
//!
//! `dmkit corm trace` replays an allocation trace (CoRM, SIGMOD'21, §4.4:
//! Fig. 17's synthetic traces, the Redis-like t1–t3) on the real allocator
//! — one thread playing `--workers` allocators, each request to a random
//! one — and reports active memory at the point of highest fragmentation
//! and over time, against no compaction and an ideal compactor. The
//! traces and their assumptions are documented in
//! `dmkit_memnode::corm::trace`.

use std::path::PathBuf;

use clap::{Args, Subcommand, ValueEnum};
use dmkit_memnode::corm::class::Strategy;
use dmkit_memnode::corm::trace::{self, Mode, ReplayConfig, ReplayResult, Trace, SYNTHETIC_N};

use crate::units::{format_size, parse_size};
use crate::Res;

#[derive(Subcommand)]
pub(crate) enum CormCmd {
    /// Replay an allocation trace: active memory under a compaction
    /// strategy vs no compaction and an ideal compactor (Fig. 17–19).
    Trace(TraceArgs),
    /// Compaction latency against the blocks compacted and the block size
    /// (CoRM Fig. 15), on the real store in this process: merge, copy and
    /// the node's page-table remap — not an RNIC's re-registration, which
    /// dominates the paper's figure (the simulator models that).
    Compaction(CompactionArgs),
}

#[derive(Args)]
pub(crate) struct CompactionArgs {
    /// Block sizes to sweep (comma-separated).
    #[arg(long, value_delimiter = ',', value_parser = parse_size, default_value = "4KiB,64KiB,1MiB")]
    block_size: Vec<u64>,
    /// Blocks to fill and then leave a quarter full (three of four
    /// objects freed) before the compaction, to sweep (comma-separated).
    #[arg(long, value_delimiter = ',', default_value = "4,64,1024")]
    blocks: Vec<u64>,
    /// Payload bytes of each object.
    #[arg(long, value_parser = parse_size, default_value = "1000")]
    object_size: u64,
    /// Seed of ids and slots.
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// Write the results (an array) as JSON here.
    #[arg(long)]
    json: Option<PathBuf>,
}

/// One point of `dmkit corm compaction`.
#[derive(serde::Serialize)]
struct CompactionPoint {
    block_size: u64,
    blocks: u64,
    objects: u64,
    blocks_freed: u64,
    objects_moved: u64,
    compaction_ms: f64,
    collection_ms: f64,
    us_per_block: f64,
    cpu: String,
}

fn compaction_point(bs: u64, blocks: u64, a: &CompactionArgs) -> Result<CompactionPoint, String> {
    use dmkit_memnode::corm::{Cluster, Correction, Op, Policy, Reply, StoreConfig};
    let size = u32::try_from(a.object_size).map_err(|_| "--object-size is too large")?;
    let loaded = blocks;
    let virtual_bytes = (2 * loaded + 8) * bs;
    let node = dmkit_memnode::MemNode::new(dmkit_memnode::NodeConfig {
        size: (virtual_bytes + 2 * bs + (4 << 20)).next_multiple_of(1 << 20),
        ..Default::default()
    })
    .map_err(|e| e.to_string())?;
    let mut c = Cluster::new(
        node,
        StoreConfig {
            block_size: bs,
            strategy: Strategy::Hybrid(16),
            correction: Correction::Scan,
            policy: Policy {
                threshold: None,
                on_alloc_failure: false,
                merges_per_step: 0,
                ..Policy::default()
            },
            virtual_bytes,
            seed: Some(a.seed),
            ..StoreConfig::default()
        },
    )?;
    // Whole blocks of the object's class.
    let classes = c.store().classes();
    let class = classes
        .for_payload(size)
        .ok_or_else(|| format!("--object-size {size} B: larger than a block's largest class"))?;
    let per_block = u64::from(classes.get(class).expect("a class for_payload gave").slots);
    let objects = loaded * per_block;
    let mut ptrs = Vec::with_capacity(objects as usize);
    for _ in 0..objects {
        match c.call(0, Op::Alloc(size)) {
            Ok(Reply::Allocated(p)) => ptrs.push(p),
            other => return Err(format!("alloc: {other:?}")),
        }
    }
    for (i, p) in ptrs.into_iter().enumerate() {
        if i % 4 != 0 {
            c.call(0, Op::Free(p)).map_err(|e| format!("free: {e}"))?;
        }
    }
    let r = match c.call(0, Op::Compact(None)) {
        Ok(Reply::Compacted(r)) => r,
        other => return Err(format!("compact: {other:?}")),
    };
    c.check()?;
    Ok(CompactionPoint {
        block_size: bs,
        blocks,
        objects: objects / 4,
        blocks_freed: r.blocks_freed,
        objects_moved: r.objects_moved,
        compaction_ms: r.compaction_ns as f64 / 1e6,
        collection_ms: r.collection_ns as f64 / 1e6,
        us_per_block: r.compaction_ns as f64 / 1e3 / r.blocks_freed.max(1) as f64,
        cpu: cpu_model(),
    })
}

fn corm_compaction(a: CompactionArgs) -> Res {
    if a.blocks.iter().any(|&b| !(2..=1 << 16).contains(&b)) || a.object_size == 0 {
        return Err(crate::bad_input(
            "--blocks are 2..=65536 and --object-size above zero",
        ));
    }
    println!(
        "{:>10} {:>7} {:>8} {:>7} {:>8} {:>14} {:>13} {:>10}",
        "block", "blocks", "objects", "freed", "moved", "compaction ms", "collect ms", "µs/block"
    );
    let mut out = Vec::new();
    for &bs in &a.block_size {
        for &n in &a.blocks {
            let p = compaction_point(bs, n, &a)?;
            println!(
                "{:>10} {:>7} {:>8} {:>7} {:>8} {:>14.3} {:>13.3} {:>10.1}",
                format_size(bs),
                n,
                p.objects,
                p.blocks_freed,
                p.objects_moved,
                p.compaction_ms,
                p.collection_ms,
                p.us_per_block
            );
            out.push(p);
        }
    }
    if let Some(path) = &a.json {
        let text = serde_json::to_string_pretty(&out).expect("json");
        std::fs::write(path, text + "\n")
            .map_err(|e| format!("writing {}: {e}", path.display()))?;
    }
    Ok(())
}

#[derive(Clone, Copy, PartialEq, Eq, ValueEnum)]
enum TraceName {
    /// Allocate N objects of --object-size, free --free-fraction of them.
    Synthetic,
    /// Redis: 10,000 keys, values of 1..16 KiB.
    #[value(name = "redis-t1")]
    RedisT1,
    /// Redis as a 100 MiB LRU cache: 700,000 150 B values, then 170,000 of 300 B.
    #[value(name = "redis-t2")]
    RedisT2,
    /// Redis: 5 big keys of 160 KiB, 50,000 150 B values, every other deleted.
    #[value(name = "redis-t3")]
    RedisT3,
}

#[derive(Clone, Copy, PartialEq, Eq, ValueEnum)]
enum ModeArg {
    /// CoRM with --ids bit random ids; classes whose blocks hold more
    /// objects than 2^ids are not compacted.
    Corm,
    /// Offset-based compaction (Mesh, CoRM-0).
    Mesh,
    /// CoRM with --ids bits where they cover a block, offset-based elsewhere.
    Hybrid,
    /// No compaction.
    None,
    /// The ideal compactor.
    Ideal,
    /// Every mode: none, ideal, mesh, corm-8/12/16, hybrid-<ids>.
    All,
}

#[derive(Args)]
pub(crate) struct TraceArgs {
    /// The trace.
    #[arg(long, value_enum, default_value = "synthetic")]
    trace: TraceName,
    /// Object size of the synthetic trace.
    #[arg(long, value_parser = parse_size, default_value = "2KiB")]
    object_size: u64,
    /// Fraction of the synthetic trace's objects freed.
    #[arg(long, default_value_t = 0.5)]
    free_fraction: f64,
    /// Bits of CoRM's random object ids (0 = offset-based, as --mode mesh).
    #[arg(long, default_value_t = 16)]
    ids: u8,
    /// Compaction strategy to report.
    #[arg(long, value_enum, default_value = "corm")]
    mode: ModeArg,
    /// Allocator threads (each request goes to a random one).
    #[arg(long, default_value_t = 1)]
    workers: usize,
    /// Block size (the paper's traces use 1 MiB, FaRM's block).
    #[arg(long, value_parser = parse_size, default_value = "1MiB")]
    block_size: u64,
    /// Scale of the trace's counts: synthetic N = 8 M × scale (default
    /// 1/64), Redis traces × scale (default 1).
    #[arg(long)]
    scale: Option<f64>,
    /// Also compact during the replay when a class's fragmentation ratio
    /// exceeds this (default: only at the point of highest fragmentation).
    #[arg(long)]
    threshold: Option<f64>,
    /// Seed of the trace, the worker choices, ids and slots.
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// Points of the timeline in the JSON.
    #[arg(long, default_value_t = 100)]
    samples: usize,
    /// Write the result as JSON here (an array with --mode all).
    #[arg(long)]
    json: Option<PathBuf>,
}

pub(crate) fn corm(cmd: CormCmd) -> Res {
    match cmd {
        CormCmd::Trace(a) => corm_trace(a),
        CormCmd::Compaction(a) => corm_compaction(a),
    }
}

fn build(a: &TraceArgs) -> Result<(Trace, f64), String> {
    match a.trace {
        TraceName::Synthetic => {
            let scale = a.scale.unwrap_or(1.0 / 64.0);
            let n = ((SYNTHETIC_N as f64 * scale).round() as u64).max(1);
            let size = u32::try_from(a.object_size).map_err(|_| "--object-size is too large")?;
            if size == 0 || !(0.0..=1.0).contains(&a.free_fraction) {
                return Err("--object-size > 0 and --free-fraction in 0..=1".into());
            }
            Ok((trace::synthetic(n, size, a.free_fraction, a.seed), scale))
        }
        t => {
            let scale = a.scale.unwrap_or(1.0);
            let tr = match t {
                TraceName::RedisT1 => trace::redis_t1(scale, a.seed),
                TraceName::RedisT2 => trace::redis_t2(scale, a.seed),
                _ => trace::redis_t3(scale, a.seed),
            };
            Ok((tr, scale))
        }
    }
    .and_then(|(t, s)| {
        if s > 0.0 && s.is_finite() {
            Ok((t, s))
        } else {
            Err("--scale must be positive".into())
        }
    })
}

fn modes(a: &TraceArgs) -> Result<Vec<Mode>, String> {
    let store = |s: Strategy| s.validate().map(|()| Mode::Store(s));
    Ok(match a.mode {
        ModeArg::None => vec![Mode::None],
        ModeArg::Ideal => vec![Mode::Ideal],
        ModeArg::Mesh => vec![Mode::Store(Strategy::Mesh)],
        ModeArg::Corm if a.ids == 0 => vec![Mode::Store(Strategy::Mesh)],
        ModeArg::Corm => vec![store(Strategy::Corm(a.ids))?],
        ModeArg::Hybrid if a.ids == 0 => vec![Mode::Store(Strategy::Mesh)],
        ModeArg::Hybrid => vec![store(Strategy::Hybrid(a.ids))?],
        ModeArg::All => {
            let mut v = vec![
                Mode::None,
                Mode::Ideal,
                Mode::Store(Strategy::Mesh),
                Mode::Store(Strategy::Corm(8)),
                Mode::Store(Strategy::Corm(12)),
                Mode::Store(Strategy::Corm(16)),
            ];
            if a.ids > 0 {
                v.push(store(Strategy::Hybrid(a.ids))?);
            }
            v
        }
    })
}

fn cpu_model() -> String {
    std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("model name"))
                .and_then(|l| l.split_once(':'))
                .map(|(_, m)| m.trim().to_string())
        })
        .unwrap_or_default()
}

fn json_of(r: &ReplayResult, a: &TraceArgs, scale: f64) -> serde_json::Value {
    let mut v = serde_json::to_value(r).expect("result serialises");
    let o = v.as_object_mut().expect("an object");
    o.insert("scale".into(), scale.into());
    o.insert("seed".into(), a.seed.into());
    o.insert("threshold".into(), a.threshold.into());
    if a.trace == TraceName::Synthetic {
        o.insert("object_size".into(), a.object_size.into());
        o.insert("free_fraction".into(), a.free_fraction.into());
    }
    let argv: Vec<String> = std::env::args().collect();
    o.insert("command".into(), argv.join(" ").into());
    o.insert("cpu".into(), cpu_model().into());
    v
}

fn corm_trace(a: TraceArgs) -> Res {
    let (tr, scale) = build(&a)?;
    let modes = modes(&a)?;
    let cfg = ReplayConfig {
        mode: modes[0],
        workers: a.workers,
        block_size: a.block_size,
        threshold: a.threshold,
        seed: a.seed,
        samples: a.samples,
    };
    let results = trace::replay_modes(&tr, &cfg, &modes)?;
    let mib = |b: u64| b as f64 / (1 << 20) as f64;
    println!(
        "trace {} ({} events, scale {scale}), {} workers, {} blocks; point of highest fragmentation: event {}",
        tr.name,
        tr.events.len(),
        a.workers,
        format_size(a.block_size),
        results[0].point
    );
    println!(
        "{:<10} {:>12} {:>12} {:>14} {:>11} {:>9} {:>9} {:>9}",
        "mode",
        "active MiB",
        "ideal MiB",
        "no-compact MiB",
        "live MiB",
        "/ideal",
        "saved",
        "seconds"
    );
    for r in &results {
        println!(
            "{:<10} {:>12.2} {:>12.2} {:>14.2} {:>11.2} {:>9.3} {:>8.2}x {:>9.2}",
            r.mode,
            mib(r.active_bytes),
            mib(r.ideal_bytes),
            mib(r.no_compaction_bytes),
            mib(r.live_bytes),
            r.active_bytes as f64 / r.ideal_bytes.max(1) as f64,
            r.no_compaction_bytes as f64 / r.active_bytes.max(1) as f64,
            r.seconds
        );
    }
    if let Some(path) = &a.json {
        let v = if a.mode == ModeArg::All {
            serde_json::Value::Array(results.iter().map(|r| json_of(r, &a, scale)).collect())
        } else {
            json_of(&results[0], &a, scale)
        };
        let text = serde_json::to_string_pretty(&v).expect("json");
        std::fs::write(path, text + "\n")
            .map_err(|e| format!("writing {}: {e}", path.display()))?;
    }
    Ok(())
}
