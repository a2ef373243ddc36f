//! Distributed log (RDMA memory-semantics study, §IV-E, Fig. 19): an
//! append-only, totally ordered log in remote memory that transaction
//! engines write one-sidedly.
//!
//! - **append**: a writer reserves consecutive slots with the FAA
//!   sequencer (`tail += k`, one round trip for a batch of `k` records),
//!   then WRITEs its records there — one WRITE per record (`none`), one
//!   packed WRITE of the batch (`sp`), one scatter/gather WRITE straight
//!   from its records (`sgl`, the "data table"), or one WRITE per record
//!   under one doorbell (`doorbell`); at most `depth` posts in flight.
//! - **read**: a reader follows the tail: it reads the tail word, then the
//!   slots below it, in order. A slot whose record has not landed yet is
//!   read again; one still empty `hole_timeout` after the reader first saw
//!   it is a *hole* — a writer died between its reservation and its WRITE
//!   — and the reader fills it: CAS of the slot's tag word from 0 to the
//!   hole tag, so every reader skips it the same way. A torn record
//!   (checksum) is read again (a WRITE in progress). Records come out in
//!   slot order, so each writer's records in the order it reserved them:
//!   nothing is reordered, and nothing torn is returned.
//! - **the writer's lease**: a writer posts a batch's WRITE within
//!   `lease` of its reservation or not at all (it counts the batch as
//!   abandoned), and readers wait `hole_timeout ≥ lease` before filling: a
//!   slot is never filled under a WRITE still coming.
//!
//! ## Remote layout (home node)
//! ```text
//!  LogHead (64 B): magic | capacity (slots) | entry (B per slot) | tail (FAA) | 0 ...
//!  slots: capacity × entry B, slot s at head + 64 + s × entry (a record::EntryHead
//!         and payload each; the tag word, at +8, is what a hole fill CASes)
//! ```

use std::sync::Arc;

use dmkit_fabric::{Fabric, RemoteRef, SyncQp};
use dmkit_runtime::{Ctx, Local, LocalLayout, Nanos};
use zerocopy::{FromBytes, Immutable, IntoBytes, KnownLayout};

use crate::record::{self, Found};
use crate::{AppError, Method};

/// Magic of a log head.
pub const LOG_MAGIC: u64 = u64::from_le_bytes(*b"DMLOG001");

/// Head of a log in remote memory.
#[repr(C)]
#[derive(
    Debug, Clone, Copy, Default, PartialEq, Eq, FromBytes, IntoBytes, KnownLayout, Immutable,
)]
pub struct LogHead {
    /// `LOG_MAGIC`; an opener refuses a log without it.
    pub magic: u64,
    /// Slots in the log.
    pub capacity: u64,
    /// Bytes per slot.
    pub entry: u64,
    /// Slots reserved so far (the sequencer).
    pub tail: u64,
    /// Zero; pads the head to 64 bytes.
    pub _reserved: [u64; 4],
}
const _: () = assert!(std::mem::size_of::<LogHead>() == 64);
const TAIL_AT: u64 = std::mem::offset_of!(LogHead, tail) as u64;
const SLOTS_AT: u64 = std::mem::size_of::<LogHead>() as u64;
/// Offset of the tag word in a slot.
const TAG_AT: u64 = std::mem::offset_of!(record::EntryHead, tag) as u64;

/// The tag of a filled hole.
pub fn hole_tag() -> u64 {
    record::tag(0, 0xFFFF, 0x7FFF)
}

/// A log: where it is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Log {
    head: RemoteRef,
    /// Slots in the log.
    pub capacity: u64,
    /// Bytes per slot.
    pub entry: usize,
}

impl Log {
    /// Allocates a log of `capacity` slots of `entry` bytes on the lowest
    /// memory node.
    pub fn create(fabric: &dyn Fabric, capacity: u64, entry: usize) -> Result<Self, AppError> {
        if entry < record::HEAD || !entry.is_multiple_of(8) || capacity == 0 {
            return Err(AppError::Config(format!(
                "log slots hold at least {} B in whole words (got {entry}), and a log at least one",
                record::HEAD
            )));
        }
        let (home, _) = dmkit_fabric::home_node(fabric)
            .ok_or_else(|| AppError::Config("the fabric has no memory node".into()))?;
        let (a, _, k) = fabric.alloc_chunk(home, SLOTS_AT + capacity * entry as u64, false)?;
        let log = Log {
            head: RemoteRef::new(a, k),
            capacity,
            entry,
        };
        let h = LogHead {
            magic: LOG_MAGIC,
            capacity,
            entry: entry as u64,
            tail: 0,
            _reserved: [0; 4],
        };
        let mut q = SyncQp::new(fabric, home, 64)?;
        q.write(a, k, h.as_bytes())?;
        Ok(log)
    }

    /// The raw address of the log's head (to open it from elsewhere).
    pub fn head_raw(&self) -> u64 {
        self.head.addr.raw()
    }

    /// Opens the log whose head is at `raw` (made by another process).
    pub fn open(fabric: &dyn Fabric, raw: u64) -> Result<Self, AppError> {
        let a = dmkit_fabric::GlobalAddr::from_raw(raw);
        let rkey = fabric.heap(a.node())?.rkey;
        let mut q = SyncQp::new(fabric, a.node(), 64)?;
        let img = q.read(a, rkey, 64)?;
        let (h, _) =
            LogHead::read_from_prefix(&img).map_err(|_| AppError::Mismatch("log head".into()))?;
        if h.magic != LOG_MAGIC {
            return Err(AppError::Mismatch(format!("{a} is not a log")));
        }
        Ok(Log {
            head: RemoteRef::new(a, rkey),
            capacity: h.capacity,
            entry: h.entry as usize,
        })
    }

    /// Frees the log.
    pub fn destroy(self, fabric: &dyn Fabric) -> Result<(), AppError> {
        fabric.free_chunk(self.head.addr)?;
        Ok(())
    }

    fn slot(&self, s: u64) -> RemoteRef {
        self.head.add(SLOTS_AT + s * self.entry as u64)
    }

    /// Slots reserved so far (host side).
    pub fn tail(&self, fabric: &dyn Fabric) -> Result<u64, AppError> {
        let mut q = SyncQp::new(fabric, self.head.addr.node(), 64)?;
        let w = q.read(self.head.addr.add(TAIL_AT), self.head.rkey, 8)?;
        Ok(u64::from_le_bytes(w.try_into().expect("8 bytes")))
    }

    /// The whole log as it is now (host side), slot by slot.
    pub fn snapshot(&self, fabric: &dyn Fabric) -> Result<Vec<Found>, AppError> {
        let tail = self.tail(fabric)?.min(self.capacity);
        let chunk = ((1 << 20) / self.entry).max(1) * self.entry;
        let mut q = SyncQp::new(fabric, self.head.addr.node(), chunk)?;
        let total = tail as usize * self.entry;
        let mut img = Vec::with_capacity(total);
        while img.len() < total {
            let k = (total - img.len()).min(chunk);
            img.extend(q.read(self.slot(0).addr.add(img.len() as u64), self.head.rkey, k)?);
        }
        Ok(img.chunks_exact(self.entry).map(record::decode).collect())
    }
}

/// How writers append.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AppendParams {
    /// How a batch of records is written.
    pub method: Method,
    /// Records per reservation (1 with [`Method::None`]).
    pub batch: usize,
    /// Posts in flight before the writer waits.
    pub depth: usize,
    /// The device's scatter/gather limit.
    pub max_sge: usize,
    /// How long after its reservation a batch may still be written.
    pub lease: Nanos,
    /// Stop after reserving this many records without writing the last
    /// batch: a writer that dies between reservation and WRITE (tests).
    pub die_after: Option<u64>,
}

/// A writer's task memory: its records (the data table; SGL and the
/// unbatched methods WRITE from it) and SP's packing ring.
#[derive(Debug, Clone, Copy)]
pub struct WriterMem {
    table: Local,
    staging: Local,
}

impl WriterMem {
    /// Declares the memory for `batch` records of `entry` bytes.
    pub fn declare(l: &mut LocalLayout, entry: usize, p: &AppendParams) -> Self {
        WriterMem {
            table: l.region("log data table", p.depth * p.batch.max(1) * entry),
            staging: l.region("log SP staging", p.depth * p.batch.max(1) * entry),
        }
    }
}

/// What a writer did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct AppendStats {
    /// Records written.
    pub records: u64,
    /// Records reserved and never written (a dead writer's, or past the
    /// lease).
    pub abandoned: u64,
}

/// Writer `w` appends `records` records (its sequence numbers 0..).
///
/// Whatever the method, the writer makes its records a block of `batch`
/// at a time, before it reserves their slots (a record does not depend on
/// where it lands): the methods differ only in how the block is appended —
/// one reservation and one WRITE per record, or one reservation and one
/// SP/SGL WRITE per batch.
pub async fn append(
    ctx: &Ctx,
    log: Log,
    w: u16,
    records: u64,
    mem: &WriterMem,
    p: &AppendParams,
) -> Result<AppendStats, AppError> {
    let e = log.entry;
    let block = p.batch.max(1) as u64;
    let batch = if p.method == Method::None { 1 } else { block };
    let depth = p.depth.max(1);
    let mut stats = AppendStats::default();
    let mut seq = 0u64;
    let mut inflight = 0usize;
    let mut ring = 0usize;
    let mut img = vec![0u8; block as usize * e];
    // A time no later than the next reservation: the clock is read once
    // per reservation, for its lease check, and that reading stands for
    // the next reservation's time too (an earlier reservation time only
    // makes the lease stricter).
    let mut clock = ctx.now();
    while seq < records {
        let kb = block.min(records - seq);
        let img = &mut img[..kb as usize * e];
        for (x, r) in img.chunks_exact_mut(e).enumerate() {
            let s = seq + x as u64;
            let tag = record::tag(1, w, (s & 0x7FFF) as u16);
            record::encode(r, ((w as u64) << 48) | s, tag, s);
        }
        for part in img.chunks(batch as usize * e) {
            let k = (part.len() / e) as u64;
            let reserved_at = clock;
            // Reserve k consecutive slots.
            let first = ctx.faa_sync(log.head.add(TAIL_AT), k).await?;
            if first + k > log.capacity {
                return Err(AppError::Full {
                    need: first + k,
                    capacity: log.capacity,
                });
            }
            if p.die_after.is_some_and(|d| seq + k > d) {
                // Dies holding k reserved, unwritten slots.
                return Err(AppError::Killed(w as usize));
            }
            clock = ctx.now();
            if clock.saturating_sub(reserved_at) >= p.lease {
                // Too late: readers may be filling these slots as holes.
                stats.abandoned += k;
                seq += k;
                continue;
            }
            let slot = ring % depth;
            ring += 1;
            let dst = log.slot(first);
            let n = part.len();
            match p.method {
                Method::Sp => {
                    let pieces: Vec<&[u8]> = part.chunks_exact(e).collect();
                    let staging = mem.staging.slice(slot * batch as usize * e, n);
                    ctx.write_packed(dst, staging, &pieces);
                }
                Method::Sgl | Method::Doorbell | Method::None => {
                    // The records sit in the data table (registered memory).
                    let table = mem.table.slice(slot * batch as usize * e, n);
                    ctx.put_local(table, part);
                    let pieces: Vec<Local> =
                        (0..k as usize).map(|x| table.slice(x * e, e)).collect();
                    if p.method == Method::Sgl {
                        for (c, chunk) in pieces.chunks(p.max_sge.max(1)).enumerate() {
                            ctx.write_v(dst.add((c * p.max_sge.max(1) * e) as u64), chunk);
                        }
                    } else {
                        for (x, piece) in pieces.iter().enumerate() {
                            ctx.write(dst.add((x * e) as u64), *piece);
                        }
                    }
                }
            }
            ctx.post();
            stats.records += k;
            seq += k;
            inflight += 1;
            if inflight >= depth {
                ctx.sync().await?;
                inflight = 0;
            }
        }
    }
    ctx.sync().await?;
    Ok(stats)
}

/// What a reader saw, in log order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Read {
    /// A record: its writer and sequence number.
    /// Which writer wrote it, and its sequence number there.
    Record {
        /// The writer.
        writer: u16,
        /// Its sequence number at that writer.
        seq: u64,
    },
    /// A hole (filled by this reader or another).
    Hole,
}

/// A reader's task memory: one chunk of slots and a word.
#[derive(Debug, Clone, Copy)]
pub struct ReaderMem {
    chunk: Local,
    word: Local,
    slots: usize,
}

impl ReaderMem {
    /// Declares a reader's memory: `slots` slots of `entry` bytes per READ.
    pub fn declare(l: &mut LocalLayout, entry: usize, slots: usize) -> Self {
        ReaderMem {
            chunk: l.region("log reader chunk", entry * slots),
            word: l.region("log reader word", 8),
            slots,
        }
    }
}

/// Follows the log from slot 0 until `until` slots have been read,
/// filling holes older than `hole_timeout`; returns what it read, in
/// order. `poll` is how long it waits before reading a slot again.
pub async fn follow(
    ctx: &Ctx,
    log: Log,
    mem: &ReaderMem,
    until: u64,
    hole_timeout: Nanos,
    poll: Nanos,
) -> Result<Vec<Read>, AppError> {
    let e = log.entry;
    let mut out = Vec::with_capacity(until as usize);
    let mut at = 0u64;
    let mut waiting_since: Option<Nanos> = None;
    while at < until {
        ctx.read_sync(log.head.add(TAIL_AT), mem.word).await?;
        let tail = ctx.local_u64(mem.word).min(log.capacity);
        if tail <= at {
            ctx.sleep(poll).await;
            continue;
        }
        let n = (tail - at).min(mem.slots as u64).min(until - at);
        ctx.read_sync(log.slot(at), mem.chunk.prefix(n as usize * e))
            .await?;
        let img = ctx.local_vec(mem.chunk.prefix(n as usize * e));
        let mut stalled = false;
        for s in img.chunks_exact(e) {
            match record::decode(s) {
                Found::Entry { tag, .. } if tag == hole_tag() => out.push(Read::Hole),
                Found::Entry { key, .. } => out.push(Read::Record {
                    writer: (key >> 48) as u16,
                    seq: key & ((1 << 48) - 1),
                }),
                Found::Empty => {
                    let since = *waiting_since.get_or_insert(ctx.now());
                    if ctx.now().saturating_sub(since) >= hole_timeout {
                        // A hole: fill it (or find it written meanwhile).
                        let old = ctx
                            .cas_sync(log.slot(at).add(TAG_AT), 0, hole_tag())
                            .await?;
                        if old == 0 {
                            let mut filler = vec![0u8; e];
                            record::encode(&mut filler, 0, hole_tag(), 0);
                            // The rest of the slot, so every reader decodes a hole.
                            ctx.put_local(mem.chunk.prefix(e), &filler);
                            ctx.write_sync(log.slot(at), mem.chunk.prefix(e)).await?;
                            out.push(Read::Hole);
                            waiting_since = None;
                            at += 1;
                            continue;
                        }
                    }
                    stalled = true;
                    break;
                }
                Found::Torn => {
                    stalled = true;
                    break;
                }
            }
            waiting_since = None;
            at += 1;
        }
        if stalled {
            ctx.sleep(poll).await;
        }
    }
    Ok(out)
}

/// A log run's shape.
#[derive(Debug, Clone, PartialEq)]
pub struct LogConfig {
    /// Writers (transaction engines).
    pub executors: usize,
    /// Records per writer.
    pub records: u64,
    /// Bytes per record (slot).
    pub entry: usize,
    /// How writers append.
    pub append: AppendParams,
    /// Seed of the records' payloads.
    pub seed: u64,
}

/// Checks a quiescent log: every slot below the tail is a record or a
/// hole; each writer's records appear in sequence order, each once;
/// `expect(w)` records of writer `w` are there. Returns (records, holes).
pub fn check(
    fabric: &dyn Fabric,
    log: &Log,
    writers: usize,
    expect: impl Fn(usize) -> u64,
) -> Result<(u64, u64), AppError> {
    let mut next = vec![0u64; writers];
    let (mut records, mut holes) = (0, 0);
    for (s, f) in log.snapshot(fabric)?.into_iter().enumerate() {
        match f {
            Found::Entry { tag, .. } if tag == hole_tag() => holes += 1,
            Found::Entry { key, value, .. } => {
                let (w, seq) = ((key >> 48) as usize, key & ((1 << 48) - 1));
                if w >= writers || seq != next[w] || value != seq {
                    return Err(AppError::Mismatch(format!(
                        "slot {s}: writer {w} record {seq}, expected its {}",
                        next.get(w).copied().unwrap_or(0)
                    )));
                }
                next[w] += 1;
                records += 1;
            }
            other => {
                return Err(AppError::Mismatch(format!(
                    "slot {s} below the tail is {other:?} (an unfilled hole or a torn record)"
                )))
            }
        }
    }
    for (w, &n) in next.iter().enumerate() {
        if n != expect(w) {
            return Err(AppError::Mismatch(format!(
                "writer {w}: {n} records, {} expected",
                expect(w)
            )));
        }
    }
    Ok((records, holes))
}

/// Runs `cfg.executors` writers on `platform` and checks the log.
pub fn run(
    platform: &mut crate::platform::Platform,
    cfg: &LogConfig,
) -> Result<crate::AppResult, AppError> {
    let fabric = platform.fabric();
    let log = Log::create(
        fabric.as_ref(),
        cfg.executors as u64 * cfg.records + 16,
        cfg.entry,
    )?;
    let r = run_on(platform, &log, cfg);
    let freed = log.destroy(fabric.as_ref());
    let r = r?;
    freed?;
    Ok(r)
}

fn run_on(
    platform: &mut crate::platform::Platform,
    log: &Log,
    cfg: &LogConfig,
) -> Result<crate::AppResult, AppError> {
    let fabric = platform.fabric();
    let mut l = LocalLayout::new();
    let mem = WriterMem::declare(&mut l, cfg.entry, &cfg.append);
    let rt = crate::platform::raw_runtime(cfg.seed);
    let log2 = *log;
    let (outs, secs, traffic) = platform.run(cfg.executors, &l, &rt, |ctx, i| {
        let p = cfg.append;
        let records = cfg.records;
        async move { append(&ctx, log2, i as u16, records, &mem, &p).await }
    })?;
    let mut total = 0;
    for o in outs {
        total += o?.records;
    }
    let (records, holes) = check(fabric.as_ref(), log, cfg.executors, |_| cfg.records)?;
    if holes != 0 || records != total {
        return Err(AppError::Mismatch(format!(
            "{records} records and {holes} holes for {total} appended"
        )));
    }
    Ok(crate::AppResult {
        app: "log".into(),
        backend: platform.backend().into(),
        method: cfg.append.method.name().into(),
        batch: if cfg.append.method == Method::None {
            1
        } else {
            cfg.append.batch
        },
        executors: cfg.executors,
        records,
        seconds: secs,
        records_per_s: records as f64 / secs.max(1e-12),
        bytes_per_record: traffic.bytes_written as f64 / records.max(1) as f64,
        verified: true,
        phases: vec![("append".into(), secs)],
        numa: false,
        round_seconds: Vec::new(),
    })
}

/// A log shared with tasks (cheap to clone).
pub type SharedLog = Arc<Log>;
