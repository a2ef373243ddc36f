//! Distributed join (RDMA memory-semantics study, §IV-D, Fig. 16–17): a
//! partitioned hash join of an inner relation R and an outer relation S.
//!
//! 1. **partition**: both relations go through the [`crate::shuffle`]
//!    (each executor pushes its chunk of R, then of S, to the `n`
//!    partitions; the study uses SGL), so partition `j` of R and of S
//!    hold exactly the tuples whose key maps to `j`;
//! 2. **build**: executor `j` READs its R partition from remote memory and
//!    builds a concurrent hash map of it (`dashmap`, standing in for the
//!    study's TBB `concurrent_hash_map`);
//! 3. **probe**: it READs its S partition and probes the map.
//!
//! S is a foreign-key relation of R (every S tuple's key is some R tuple's
//! key), so the result has `|S|` rows; the check compares the count and a
//! checksum of the joined payloads with a local join of the same inputs
//! ([`local_join`], also the study's single-machine baseline).
//!
//! On the simulator the build and probe phases move their partitions (the
//! READs are modelled); the hash-map work on the CPU is not, so their
//! times there are the data movement alone.

use std::sync::Arc;

use dmkit_runtime::hash::fmix64;
use dmkit_runtime::{Ctx, Local, LocalLayout};

use crate::platform::Platform;
use crate::record::{self, Found};
use crate::shuffle::{self, PushParams, SourceMem, Stage, StageRefs};
use crate::{AppError, AppResult, Method};

/// A join's shape.
#[derive(Debug, Clone, PartialEq)]
pub struct JoinConfig {
    /// Executors (and partitions).
    pub executors: usize,
    /// R tuples per executor.
    pub inner: u64,
    /// S tuples per executor.
    pub outer: u64,
    /// Bytes per tuple in remote memory (≥ 32).
    pub entry: usize,
    /// How the partition phase pushes.
    pub push: PushParams,
    /// Seed of the relations' keys.
    pub seed: u64,
}

/// Executor `i`'s chunk of R: unique keys, payload = the tuple's id.
pub fn inner_chunk(seed: u64, i: usize, n: u64) -> Vec<(u64, u64)> {
    (0..n)
        .map(|k| {
            let id = ((i as u64) << 40) | k;
            (fmix64(seed ^ id.wrapping_mul(0xA24B_AED4_963E_E407)), id)
        })
        .collect()
}

/// Executor `i`'s chunk of S: each tuple references an R tuple (of any
/// executor's chunk, drawn by a hash).
pub fn outer_chunk(seed: u64, i: usize, n: u64, executors: usize, inner: u64) -> Vec<(u64, u64)> {
    (0..n)
        .map(|k| {
            let h = fmix64(seed ^ 0x0005_0E7E ^ ((i as u64) << 40) ^ k);
            let (ri, rk) = ((h % executors as u64) as usize, (h >> 20) % inner);
            let rid = ((ri as u64) << 40) | rk;
            let key = fmix64(seed ^ rid.wrapping_mul(0xA24B_AED4_963E_E407));
            (key, ((i as u64) << 40) | k)
        })
        .collect()
}

/// What a join produced: rows and a checksum of the joined pairs.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct JoinOut {
    /// Joined rows.
    pub rows: u64,
    /// Order-independent checksum of the joined pairs.
    pub checksum: u64,
}

impl JoinOut {
    fn add(&mut self, r: u64, s: u64) {
        self.rows += 1;
        self.checksum = self.checksum.wrapping_add(fmix64(r ^ s.rotate_left(29)));
    }

    fn merge(&mut self, o: JoinOut) {
        self.rows += o.rows;
        self.checksum = self.checksum.wrapping_add(o.checksum);
    }
}

/// The same join on this machine, with one hash map: the reference the
/// distributed result must equal, and the study's single-machine baseline.
pub fn local_join(cfg: &JoinConfig) -> JoinOut {
    let mut map: std::collections::HashMap<u64, Vec<u64>> = Default::default();
    for i in 0..cfg.executors {
        for (k, v) in inner_chunk(cfg.seed, i, cfg.inner) {
            map.entry(k).or_default().push(v);
        }
    }
    let mut out = JoinOut::default();
    for i in 0..cfg.executors {
        for (k, s) in outer_chunk(cfg.seed, i, cfg.outer, cfg.executors, cfg.inner) {
            for &r in map.get(&k).into_iter().flatten() {
                out.add(r, s);
            }
        }
    }
    out
}

/// An executor's memory for reading a partition back.
#[derive(Debug, Clone, Copy)]
struct ReadMem {
    chunk: Local,
    word: Local,
}

const READ_CHUNK: usize = 64 << 10;

/// Partition `j` of a stage, READ by an executor: `(key, value)`s.
async fn read_partition(
    ctx: &Ctx,
    st: &StageRefs,
    j: usize,
    entry: usize,
    mem: &ReadMem,
) -> Result<Vec<(u64, u64)>, AppError> {
    let n = st.tail(ctx, mem.word, j).await?;
    let per = READ_CHUNK / entry;
    let mut out = Vec::with_capacity(n as usize);
    let mut at = 0u64;
    while at < n {
        let k = (n - at).min(per as u64) as usize;
        let dst = mem.chunk.prefix(k * entry);
        ctx.read_sync(st.buf(j).add(at * entry as u64), dst).await?;
        for e in ctx.local_vec(dst).chunks_exact(entry) {
            match record::decode(e) {
                Found::Entry { key, value, .. } => out.push((key, value)),
                other => {
                    return Err(AppError::Mismatch(format!(
                        "partition {j}: a slot below the tail is {other:?}"
                    )))
                }
            }
        }
        at += k as u64;
    }
    Ok(out)
}

/// Runs the join on `platform`: partition (R, then S, through the
/// shuffle), then build and probe; checks the result against
/// [`local_join`]. Phases: partition, build+probe, and the local join's
/// time (on threads; the baseline of the study's "5.3× over
/// single-machine").
pub fn run(platform: &mut Platform, cfg: &JoinConfig) -> Result<AppResult, AppError> {
    let fabric = platform.fabric();
    let n = cfg.executors;
    let cap = |per: u64| {
        let total = per * n as u64;
        let p = total.div_ceil(n as u64);
        p + p / 4 + 64
    };
    let sr = Stage::create(fabric.as_ref(), "join-r", n, n, cfg.entry, cap(cfg.inner))?;
    let ss = match Stage::create(fabric.as_ref(), "join-s", n, n, cfg.entry, cap(cfg.outer)) {
        Ok(s) => s,
        Err(e) => {
            let _ = sr.destroy(fabric.as_ref());
            return Err(e);
        }
    };
    let r = run_on(platform, cfg, &sr, &ss);
    let a = sr.destroy(fabric.as_ref());
    let b = ss.destroy(fabric.as_ref());
    let r = r?;
    a?;
    b?;
    Ok(r)
}

fn run_on(
    platform: &mut Platform,
    cfg: &JoinConfig,
    sr: &Stage,
    ss: &Stage,
) -> Result<AppResult, AppError> {
    let fabric = platform.fabric();
    let n = cfg.executors;
    let rt = crate::platform::raw_runtime(cfg.seed);
    sr.begin(fabric.as_ref(), 1)?;
    ss.begin(fabric.as_ref(), 1)?;
    // Partition: each executor pushes its R chunk, then its S chunk.
    let mut l = LocalLayout::new();
    let most = cfg.inner.max(cfg.outer) as usize;
    let smem = SourceMem::declare(&mut l, most, cfg.entry, n, &cfg.push)?;
    let (rr, rs) = (sr.refs(), ss.refs());
    let seed = cfg.seed;
    let c = cfg.clone();
    let (outs, t_part, t1) = platform.run(n, &l, &rt, |ctx, i| {
        let (rr, rs, c) = (rr.clone(), rs.clone(), c.clone());
        async move {
            let r = inner_chunk(c.seed, i, c.inner);
            shuffle::push(&ctx, &rr, i, 1, &r, &smem, &c.push).await?;
            let s = outer_chunk(c.seed, i, c.outer, c.executors, c.inner);
            shuffle::push(&ctx, &rs, i, 1, &s, &smem, &c.push).await
        }
    })?;
    for o in outs {
        o?;
    }
    sr.complete(fabric.as_ref(), 1)?;
    ss.complete(fabric.as_ref(), 1)?;
    // Build and probe: executor j joins partition j.
    let mut l = LocalLayout::new();
    let rmem = ReadMem {
        chunk: l.region("join read chunk", READ_CHUNK),
        word: l.region("join word", 8),
    };
    let entry = cfg.entry;
    let (outs, t_bp, t2) = platform.run(n, &l, &rt, |ctx, j| {
        let (rr, rs) = (rr.clone(), rs.clone());
        async move {
            let r = read_partition(&ctx, &rr, j, entry, &rmem).await?;
            let map: dashmap::DashMap<u64, Vec<u64>> = dashmap::DashMap::with_capacity(r.len());
            for (k, v) in r {
                map.entry(k).or_default().push(v);
            }
            let s = read_partition(&ctx, &rs, j, entry, &rmem).await?;
            let mut out = JoinOut::default();
            for (k, sv) in s {
                if let Some(rs) = map.get(&k) {
                    for &rv in rs.iter() {
                        out.add(rv, sv);
                    }
                }
            }
            Ok::<_, AppError>(out)
        }
    })?;
    let mut got = JoinOut::default();
    for o in outs {
        got.merge(o?);
    }
    let t0 = std::time::Instant::now();
    let want = local_join(cfg);
    let t_local = t0.elapsed().as_secs_f64();
    if got != want {
        return Err(AppError::Mismatch(format!(
            "join: {got:?}, the local join gives {want:?}"
        )));
    }
    let secs = t_part + t_bp;
    let records = (cfg.inner + cfg.outer) * n as u64;
    let _ = seed;
    Ok(AppResult {
        app: "join".into(),
        backend: platform.backend().into(),
        method: cfg.push.method.name().into(),
        batch: if cfg.push.method == Method::None {
            1
        } else {
            cfg.push.batch
        },
        executors: n,
        records,
        seconds: secs,
        records_per_s: records as f64 / secs.max(1e-12),
        bytes_per_record: (t1.bytes_written + t2.bytes_written) as f64 / records.max(1) as f64,
        verified: true,
        phases: vec![
            ("partition".into(), t_part),
            ("build+probe".into(), t_bp),
            ("local join (host)".into(), t_local),
            ("rows".into(), got.rows as f64),
        ],
        numa: false,
        round_seconds: Vec::new(),
    })
}

/// A join's inputs shared by tasks.
pub type Inputs = Arc<Vec<Vec<(u64, u64)>>>;
