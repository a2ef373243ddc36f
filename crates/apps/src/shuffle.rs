//! Distributed shuffle (RDMA memory-semantics study, §IV-C, Fig. 14–15):
//! `n` source executors push their entries to `m` partitions' remote
//! buffers with one-sided WRITEs; the shuffle rule sends an entry to
//! partition `hash(key) mod m` (push-based, as the study chose: inbound
//! WRITEs beat outbound READs).
//!
//! A stage, as each source runs it:
//! 1. **reserve**: count its entries per partition, then one FAA per
//!    partition on the partition's tail reserves exactly that many slots
//!    (all `m` FAAs in one doorbell, one round trip);
//! 2. **push**: walk its entries in input order, collecting each
//!    partition's next `batch` entries, and WRITE each full batch into the
//!    reserved slots — entry by entry with a doorbell each (`none`, the
//!    study's basic shuffle), entry by entry under one doorbell
//!    (`doorbell`), packed into one buffer by the CPU (`sp`), or as one
//!    scatter/gather WRITE straight from the entries (`sgl`; a batch longer
//!    than the device's `max_sge` is several requests); at most `depth`
//!    posts in flight;
//! 3. **hand off**: FAA the stage's `done` counter — the one-sided signal
//!    the next stage waits for ("the one-sided verbs cannot be perceived by
//!    the executors in the next stage").
//!
//! Where the entries sit when the stage starts is a switch,
//! [`SourceMemory`]: in registered memory (the study's model and the
//! default: SGL and the unbatched methods WRITE straight from the entries,
//! SP copies each into its packing slot), or in an unregistered heap
//! (`staged`: every method copies each entry once into registered memory
//! first).
//!
//! A stage runs under an epoch: every entry's tag carries it, and
//! [`Stage::begin`] resets the tails and the counter for a new one. If a
//! source dies (or fails) mid-stage it never hands off: the stage is
//! [`AppError::Incomplete`] and is rerun whole under the next epoch;
//! readers only look at `[0, tail)` of the new epoch, and [`Stage::check`]
//! refuses any entry of another epoch.
//!
//! ## Remote layout (home node)
//! ```text
//!  StageHead (64 B): magic | epoch | sources | parts | entry | capacity | done | 0
//!  tails[parts]   u64 each: slots reserved in partition j (FAA)
//!  bufs[parts]    u64 each: GlobalAddr of partition j's buffer (capacity × entry B,
//!                 on memory node j mod nodes)
//! ```

use std::sync::Arc;

use dmkit_fabric::{Fabric, GlobalAddr, NodeId, RemoteRef, SyncQp};
use dmkit_runtime::hash::fmix64;
use dmkit_runtime::{Ctx, Local, LocalLayout};
use zerocopy::{FromBytes, Immutable, IntoBytes, KnownLayout};

use crate::record::{self, Found};
use crate::{AppError, Method};

/// Magic of a stage head.
pub const STAGE_MAGIC: u64 = u64::from_le_bytes(*b"DMSHUFL1");

/// Head of a stage in remote memory.
#[repr(C)]
#[derive(
    Debug, Clone, Copy, Default, PartialEq, Eq, FromBytes, IntoBytes, KnownLayout, Immutable,
)]
pub struct StageHead {
    /// `STAGE_MAGIC`; an opener refuses a stage without it.
    pub magic: u64,
    /// The current epoch (one per run of the stage).
    pub epoch: u64,
    /// Sources (`n`).
    pub sources: u64,
    /// Partitions (`m`).
    pub parts: u64,
    /// Bytes per entry.
    pub entry: u64,
    /// Entries each partition's buffer holds.
    pub capacity: u64,
    /// Sources that handed the current epoch off.
    pub done: u64,
    /// Zero; pads the head to 64 bytes.
    pub _reserved: u64,
}
const _: () = assert!(std::mem::size_of::<StageHead>() == 64);
const DONE_AT: u64 = std::mem::offset_of!(StageHead, done) as u64;
const TAILS_AT: u64 = std::mem::size_of::<StageHead>() as u64;

fn root_name(name: &str) -> String {
    format!("shuffle/{name}")
}

/// The partition of `key` among `parts` (the shuffle rule).
#[inline]
pub fn part_of(key: u64, parts: usize) -> usize {
    let (h, p) = (fmix64(key ^ 0x005A_FF1E), parts as u64);
    // The same value as `h % p`; a mask when `p` is a power of two (a
    // 64-bit division is 10–40 cycles, and every entry pays one per pass).
    (if p.is_power_of_two() {
        h & (p - 1)
    } else {
        h % p
    }) as usize
}

/// A shuffle stage: where its head and partition buffers are.
#[derive(Debug, Clone)]
pub struct Stage {
    /// The stage's name (its root's name is `shuffle/NAME`).
    pub name: String,
    head: RemoteRef,
    bufs: Vec<RemoteRef>,
    /// Sources (`n`).
    pub sources: usize,
    /// Partitions (`m`).
    pub parts: usize,
    /// Bytes per entry.
    pub entry: usize,
    /// Entries per partition buffer.
    pub capacity: u64,
}

impl Stage {
    /// Allocates a stage: the head on the lowest memory node, partition
    /// `j`'s buffer on node `j mod nodes`.
    pub fn create(
        fabric: &dyn Fabric,
        name: &str,
        sources: usize,
        parts: usize,
        entry: usize,
        capacity: u64,
    ) -> Result<Self, AppError> {
        if sources == 0 || parts == 0 || entry < record::HEAD || !entry.is_multiple_of(8) {
            return Err(AppError::Config(format!(
                "a stage needs sources and partitions, and entries of at least {} B in whole words (got {entry})",
                record::HEAD
            )));
        }
        let (home, nodes) = dmkit_fabric::home_node(fabric)
            .ok_or_else(|| AppError::Config("the fabric has no memory node".into()))?;
        let head_len = TAILS_AT + 16 * parts as u64;
        let (h, _, hk) = fabric.alloc_chunk(home, head_len, false)?;
        let mut bufs = Vec::with_capacity(parts);
        for j in 0..parts {
            let n: NodeId = nodes[j % nodes.len()];
            match fabric.alloc_chunk(n, capacity.max(1) * entry as u64, false) {
                Ok((a, _, k)) => bufs.push(RemoteRef::new(a, k)),
                Err(e) => {
                    for b in &bufs {
                        let _ = fabric.free_chunk(b.addr);
                    }
                    let _ = fabric.free_chunk(h);
                    return Err(e.into());
                }
            }
        }
        let s = Stage {
            name: name.into(),
            head: RemoteRef::new(h, hk),
            bufs,
            sources,
            parts,
            entry,
            capacity,
        };
        let named = s.write_head(fabric, 0).and_then(|()| {
            if dmkit_fabric::claim_root(fabric, home, &root_name(name), h.raw())? {
                Ok(())
            } else {
                Err(AppError::Config(format!("a stage named {name:?} exists")))
            }
        });
        if let Err(e) = named {
            for b in &s.bufs {
                let _ = fabric.free_chunk(b.addr);
            }
            let _ = fabric.free_chunk(h);
            return Err(e);
        }
        Ok(s)
    }

    /// Opens the stage named `name` (made by another process).
    pub fn open(fabric: &dyn Fabric, name: &str) -> Result<Self, AppError> {
        let (home, _) = dmkit_fabric::home_node(fabric)
            .ok_or_else(|| AppError::Config("the fabric has no memory node".into()))?;
        let h = dmkit_fabric::find_root(fabric, home, &root_name(name))?
            .ok_or_else(|| AppError::Config(format!("no stage named {name:?}")))?;
        let rk = |n: NodeId| -> Result<_, AppError> { Ok(fabric.heap(n)?.rkey) };
        let mut q = SyncQp::new(fabric, home, 4096)?;
        let img = q.read(h, rk(home)?, 64)?;
        let (head, _) = StageHead::read_from_prefix(&img)
            .map_err(|_| AppError::Mismatch("stage head".into()))?;
        if head.magic != STAGE_MAGIC {
            return Err(AppError::Mismatch(format!("{name:?} is not a stage")));
        }
        let parts = head.parts as usize;
        let addrs = q.read(h.add(TAILS_AT + 8 * head.parts), rk(home)?, 8 * parts)?;
        let mut bufs = Vec::with_capacity(parts);
        for c in addrs.chunks_exact(8) {
            let a = GlobalAddr::from_raw(u64::from_le_bytes(c.try_into().expect("8 bytes")));
            bufs.push(RemoteRef::new(a, rk(a.node())?));
        }
        Ok(Stage {
            name: name.into(),
            head: RemoteRef::new(h, rk(home)?),
            bufs,
            sources: head.sources as usize,
            parts,
            entry: head.entry as usize,
            capacity: head.capacity,
        })
    }

    fn write_head(&self, fabric: &dyn Fabric, epoch: u64) -> Result<(), AppError> {
        let h = StageHead {
            magic: STAGE_MAGIC,
            epoch,
            sources: self.sources as u64,
            parts: self.parts as u64,
            entry: self.entry as u64,
            capacity: self.capacity,
            done: 0,
            _reserved: 0,
        };
        let mut img = h.as_bytes().to_vec();
        img.extend(std::iter::repeat_n(0u8, 8 * self.parts));
        for b in &self.bufs {
            img.extend_from_slice(&b.addr.raw().to_le_bytes());
        }
        let mut q = SyncQp::new(fabric, self.head.addr.node(), img.len().max(64))?;
        q.write(self.head.addr, self.head.rkey, &img)?;
        Ok(())
    }

    /// Starts epoch `epoch` (≥ 1): tails and the hand-off counter to zero.
    pub fn begin(&self, fabric: &dyn Fabric, epoch: u32) -> Result<(), AppError> {
        assert!(epoch > 0, "epoch 0 marks unwritten entries");
        self.write_head(fabric, epoch as u64)
    }

    /// Frees the stage's memory and its name.
    pub fn destroy(self, fabric: &dyn Fabric) -> Result<(), AppError> {
        let home = self.head.addr.node();
        dmkit_fabric::release_root(fabric, home, &root_name(&self.name), self.head.addr.raw())?;
        for b in &self.bufs {
            fabric.free_chunk(b.addr)?;
        }
        fabric.free_chunk(self.head.addr)?;
        Ok(())
    }

    /// Reads the head and the tails (host side).
    fn read_state(&self, fabric: &dyn Fabric) -> Result<(StageHead, Vec<u64>), AppError> {
        let mut q = SyncQp::new(fabric, self.head.addr.node(), 4096)?;
        let img = q.read(
            self.head.addr,
            self.head.rkey,
            TAILS_AT as usize + 8 * self.parts,
        )?;
        let (h, rest) = StageHead::read_from_prefix(&img)
            .map_err(|_| AppError::Mismatch("stage head".into()))?;
        let tails = rest
            .chunks_exact(8)
            .map(|c| u64::from_le_bytes(c.try_into().expect("8 bytes")))
            .collect();
        Ok((h, tails))
    }

    /// Slots reserved in all partitions so far (host side).
    pub fn reserved(&self, fabric: &dyn Fabric) -> Result<u64, AppError> {
        Ok(self.read_state(fabric)?.1.iter().sum())
    }

    /// Whether every source handed epoch `epoch` off; else the stage is
    /// [`AppError::Incomplete`] (the next stage's view, host side).
    pub fn complete(&self, fabric: &dyn Fabric, epoch: u32) -> Result<(), AppError> {
        let (h, _) = self.read_state(fabric)?;
        if h.magic != STAGE_MAGIC || h.epoch != epoch as u64 {
            return Err(AppError::Mismatch(format!(
                "stage {} is at epoch {}, not {epoch}",
                self.name, h.epoch
            )));
        }
        if h.done < self.sources as u64 {
            return Err(AppError::Incomplete {
                stage: self.name.clone(),
                epoch: epoch as u64,
                done: h.done,
                expected: self.sources as u64,
            });
        }
        Ok(())
    }

    /// Waits up to `deadline` for the hand-offs of epoch `epoch`.
    pub fn wait(
        &self,
        fabric: &dyn Fabric,
        epoch: u32,
        deadline: std::time::Duration,
    ) -> Result<(), AppError> {
        let t0 = std::time::Instant::now();
        loop {
            match self.complete(fabric, epoch) {
                Err(AppError::Incomplete { .. }) if t0.elapsed() < deadline => {
                    std::thread::sleep(std::time::Duration::from_millis(1));
                }
                r => return r,
            }
        }
    }

    /// Every entry of partition `j` of epoch `epoch` (host side): `(key,
    /// writer, value)`, in slot order. An unwritten, torn or foreign slot
    /// below the tail is a [`AppError::Mismatch`].
    pub fn partition(
        &self,
        fabric: &dyn Fabric,
        epoch: u32,
        j: usize,
    ) -> Result<Vec<(u64, u16, u64)>, AppError> {
        let (_, tails) = self.read_state(fabric)?;
        let n = tails[j];
        if n > self.capacity {
            return Err(AppError::Full {
                need: n,
                capacity: self.capacity,
            });
        }
        let b = self.bufs[j];
        let chunk = (1 << 20) / self.entry * self.entry;
        let mut q = SyncQp::new(fabric, b.addr.node(), chunk)?;
        let total = n as usize * self.entry;
        let mut img = Vec::with_capacity(total);
        while img.len() < total {
            let k = (total - img.len()).min(chunk);
            img.extend(q.read(b.addr.add(img.len() as u64), b.rkey, k)?);
        }
        let mut out = Vec::with_capacity(n as usize);
        for (s, e) in img.chunks_exact(self.entry).enumerate() {
            match record::decode(e) {
                Found::Entry { key, tag, value } => {
                    let (ep, w, _) = record::untag(tag);
                    if ep != epoch || part_of(key, self.parts) != j {
                        return Err(AppError::Mismatch(format!(
                            "partition {j} slot {s}: entry of epoch {ep} for partition {}",
                            part_of(key, self.parts)
                        )));
                    }
                    out.push((key, w, value));
                }
                other => {
                    return Err(AppError::Mismatch(format!(
                        "partition {j} slot {s} below the tail is {other:?}"
                    )))
                }
            }
        }
        Ok(out)
    }

    /// The shared, read-only part of a stage a source task needs.
    pub fn refs(&self) -> StageRefs {
        StageRefs {
            head: self.head,
            bufs: self.bufs.clone().into(),
            parts: self.parts,
            entry: self.entry,
            capacity: self.capacity,
        }
    }

    /// Checks epoch `epoch`'s output against the sources' inputs: every
    /// partition holds exactly the entries whose key maps to it (as a
    /// multiset of `(key, source, value)`), nothing else.
    pub fn check(
        &self,
        fabric: &dyn Fabric,
        epoch: u32,
        inputs: &[Vec<(u64, u64)>],
    ) -> Result<u64, AppError> {
        self.complete(fabric, epoch)?;
        let mut want: Vec<Vec<(u64, u16, u64)>> = vec![Vec::new(); self.parts];
        for (i, input) in inputs.iter().enumerate() {
            for &(k, v) in input {
                want[part_of(k, self.parts)].push((k, i as u16, v));
            }
        }
        let mut total = 0;
        for (j, mut w) in want.into_iter().enumerate() {
            let mut got = self.partition(fabric, epoch, j)?;
            got.sort_unstable();
            w.sort_unstable();
            if got != w {
                return Err(AppError::Mismatch(format!(
                    "partition {j}: {} entries, {} expected",
                    got.len(),
                    w.len()
                )));
            }
            total += got.len() as u64;
        }
        Ok(total)
    }
}

/// What a source task needs of a stage (cheap to clone into tasks).
#[derive(Debug, Clone)]
pub struct StageRefs {
    head: RemoteRef,
    bufs: Arc<[RemoteRef]>,
    parts: usize,
    entry: usize,
    capacity: u64,
}

impl StageRefs {
    /// Partition `j`'s buffer.
    pub fn buf(&self, j: usize) -> RemoteRef {
        self.bufs[j]
    }

    /// Entries reserved in partition `j` so far (one READ, awaited).
    pub async fn tail(&self, ctx: &Ctx, word: Local, j: usize) -> Result<u64, AppError> {
        ctx.read_sync(self.head.add(TAILS_AT + 8 * j as u64), word.prefix(8))
            .await?;
        Ok(ctx.local_u64(word))
    }
}

/// How a source pushes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PushParams {
    /// How a batch of entries is written.
    pub method: Method,
    /// Entries per batch (1 with [`Method::None`]).
    pub batch: usize,
    /// Posts in flight before the source waits for them.
    pub depth: usize,
    /// The device's scatter/gather limit.
    pub max_sge: usize,
    /// Stop (without handing off) after pushing this many entries: a source
    /// killed mid-stage (tests).
    pub kill_after: Option<u64>,
    /// Where the source's entries sit when the stage starts (a switch; the
    /// study's model by default).
    pub source: SourceMemory,
}

/// Where a source's encoded entries sit when its stage starts: the
/// source-memory model of the batch schedule.
///
/// The study (“Thinking More about RDMA Memory Semantics”, IEEE Cluster
/// 2021, §IV-C, *Batch Schedule*) has them in RDMA-enabled memory already:
/// SP “buffer[s] these same-destination entries in an RDMA-enabled buffer
/// and write to remote memory at once when reaching a threshold … However,
/// it will incur extra memory copying. The SGL method … can reduce both
/// memory copy overhead and CPU involvement. … the local address of these
/// entries that have the same destination will be organized as a WR.” That
/// is [`SourceMemory::Registered`], the default: SGL's pieces and the
/// unbatched WRITEs point at the entries where they are, SP copies each
/// one into its packing slot.
///
/// [`SourceMemory::Staged`] is the other reading: the entries sit in
/// ordinary (unregistered) memory, and every method first copies each
/// entry once into registered memory (SGL and the unbatched methods into a
/// ring of registered slots, SP into its packing slots).
///
/// On shm (2 M entries of 64 B, 4 executors, 7 alternating runs on a
/// shared 2-core host) the registered model moved the ratios to unbatched
/// the way the study says: SGL's median rose from 2.55× (staged) to 3.46×,
/// SP's fell from 3.26× to 2.87× (its extra copy); by the executors' CPU
/// seconds, 2.46× → 3.16× and 3.54× → 2.73×. SP's copy then went through
/// a buffer; packing local to local ([`Ctx::copy_local`]) cut SP's
/// executor CPU from a median 0.409 s to 0.303 s (5 alternating runs on a
/// quiet host), its CPU ratio to 3.18×.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum SourceMemory {
    /// The entries are encoded in registered task memory before the stage
    /// (the study's model): `records × entry` bytes of registered memory per
    /// source (128 MiB for 2 M entries of 64 B), faulted in before the
    /// timed window; no registration copy.
    #[default]
    Registered,
    /// The entries sit in an unregistered heap; each is copied once into
    /// registered memory on its way out (a 256 KiB ring for SGL and the
    /// unbatched methods, SP's packing slots).
    Staged,
}

impl SourceMemory {
    /// Its name on the command line.
    pub fn name(self) -> &'static str {
        match self {
            SourceMemory::Registered => "registered",
            SourceMemory::Staged => "staged",
        }
    }
}

impl std::str::FromStr for SourceMemory {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        [SourceMemory::Registered, SourceMemory::Staged]
            .into_iter()
            .find(|m| m.name() == s)
            .ok_or_else(|| format!("{s:?}: expected registered or staged"))
    }
}

/// The most bytes of entries a source holds in registered memory under
/// [`SourceMemory::Registered`] (task memory is addressed with 32-bit
/// offsets): 2 GiB, 32 M entries of 64 B.
pub const MAX_REGISTERED_SOURCE: usize = 1 << 31;

/// A source's task memory: its entries in registered memory (under
/// [`SourceMemory::Registered`], all of them, put there by [`load_input`];
/// under [`SourceMemory::Staged`], the registered slots they pass through,
/// a ring of `REGISTER_RING` at most), which SGL and the unbatched methods
/// WRITE from, and the packing slots of SP.
#[derive(Debug, Clone, Copy)]
pub struct SourceMem {
    entries: Local,
    staging: Local,
    word: Local,
}

impl SourceMem {
    /// Declares the memory for up to `records` entries of `entry` bytes
    /// pushed to up to `parts` partitions. SP packs each partition's next
    /// batch in a slot of its own and has up to `depth` more in flight:
    /// `parts + depth` slots of `batch` entries. Under
    /// [`SourceMemory::Registered`] more than [`MAX_REGISTERED_SOURCE`]
    /// bytes of entries is a [`AppError::Config`].
    pub fn declare(
        l: &mut LocalLayout,
        records: usize,
        entry: usize,
        parts: usize,
        p: &PushParams,
    ) -> Result<Self, AppError> {
        let slots = if p.method == Method::Sp {
            parts + p.depth.max(1)
        } else {
            0
        };
        let entries = match p.source {
            SourceMemory::Registered => {
                let bytes = records.max(1).saturating_mul(entry);
                if bytes > MAX_REGISTERED_SOURCE {
                    return Err(AppError::Config(format!(
                        "{records} entries of {entry} B are {bytes} B of registered source memory; at most {MAX_REGISTERED_SOURCE} (or use the staged source memory)"
                    )));
                }
                l.region("shuffle source entries", bytes)
            }
            SourceMemory::Staged => {
                l.region("shuffle entries", records.clamp(1, REGISTER_RING) * entry)
            }
        };
        Ok(SourceMem {
            entries,
            staging: l.region("shuffle SP staging", slots * p.batch.max(1) * entry),
            word: l.region("shuffle word", 8),
        })
    }

    /// One word of scratch.
    pub fn word(&self) -> Local {
        self.word
    }
}

/// What a source did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct PushStats {
    /// Entries pushed.
    pub entries: u64,
    /// Work requests posted.
    pub requests: u64,
    /// Posts (doorbells) made.
    pub posts: u64,
}

/// Entries copied into registered memory at a time (128 KiB of 64-byte
/// entries: well inside a core's L2).
const REGISTER_CHUNK: usize = 2048;

/// Registered slots a source's entries cycle through, a chunk at a time:
/// two chunks (256 KiB of 64-byte entries), so the chunk the walk reads and
/// the one before it (whose entries may still wait for their batch) stay
/// in cache. Registered memory for every entry (128 MiB for 2 M) had the
/// registration copy write, and later write back, lines that were in no
/// cache: twice the source's bytes of DRAM traffic SP's staging slots
/// never make.
const REGISTER_RING: usize = 2 * REGISTER_CHUNK;

/// Runs source `i`'s part of a stage under `epoch`: reserve, push, hand
/// off (see the module docs). `input` is its `(key, value)` entries,
/// encoded first where `p.source` says (into registered memory with
/// [`load_input`], or into a heap with [`encode_input`]).
pub async fn push(
    ctx: &Ctx,
    st: &StageRefs,
    i: usize,
    epoch: u32,
    input: &[(u64, u64)],
    mem: &SourceMem,
    p: &PushParams,
) -> Result<PushStats, AppError> {
    match p.source {
        SourceMemory::Registered => {
            load_input(ctx, mem, st.entry, i, epoch, input)?;
            push_encoded(ctx, st, i, input, &[], mem, p).await
        }
        SourceMemory::Staged => {
            let heap = encode_input(st.entry, i, epoch, input);
            push_encoded(ctx, st, i, input, &heap, mem, p).await
        }
    }
}

/// Source `i`'s entries for `epoch`, encoded as [`encode_input`] does but
/// straight into its registered memory (`mem`, declared under
/// [`SourceMemory::Registered`] for at least `input.len()` entries): the
/// application's data as it sits in RDMA-enabled memory before a stage.
/// Writing them also faults the memory in; a timed stage calls this
/// before its window.
pub fn load_input(
    ctx: &Ctx,
    mem: &SourceMem,
    entry: usize,
    i: usize,
    epoch: u32,
    input: &[(u64, u64)],
) -> Result<(), AppError> {
    if mem.entries.len() < input.len() * entry {
        return Err(AppError::Config(format!(
            "the registered source memory holds {} B; {} entries of {entry} B need more",
            mem.entries.len(),
            input.len()
        )));
    }
    let t = record::tag(epoch, i as u16, 0);
    // A chunk at a time through a small buffer (64 KiB of entries).
    let per = (65_536 / entry).max(1);
    let mut buf = vec![0u8; per * entry];
    for (c, part) in input.chunks(per).enumerate() {
        let b = &mut buf[..part.len() * entry];
        for (x, &(key, val)) in b.chunks_exact_mut(entry).zip(part) {
            record::encode(x, key, t, val);
        }
        ctx.put_local(mem.entries.slice(c * per * entry, b.len()), b);
    }
    Ok(())
}

/// A source's partition scratch: one byte per entry, the partition phase 1
/// found for it, which phase 2 reads instead of hashing the key again
/// (and instead of waiting for the entry's line before it knows where the
/// entry goes). Allocated and faulted in before a stage, as its registered
/// memory is; used when the stage has at most 256 partitions.
#[derive(Debug, Default)]
pub struct PartScratch(Vec<u8>);

impl PartScratch {
    /// Scratch for up to `records` entries, every page faulted in.
    pub fn new(records: usize) -> Self {
        // Written, not only allocated: a zeroed allocation is mapped lazily
        // and its first-touch faults would land inside the stage.
        let mut v = Vec::with_capacity(records);
        v.resize(records, 0xFF);
        PartScratch(v)
    }
}

/// Source `i`'s entries for `epoch`, encoded back to back (`entry` bytes
/// each): the application's data as it sits in memory before a stage.
pub fn encode_input(entry: usize, i: usize, epoch: u32, input: &[(u64, u64)]) -> Vec<u8> {
    let t = record::tag(epoch, i as u16, 0);
    let mut heap = vec![0u8; input.len() * entry];
    for (k, &(key, val)) in input.iter().enumerate() {
        record::encode(&mut heap[k * entry..(k + 1) * entry], key, t, val);
    }
    heap
}

/// [`push`] of entries already encoded (so a timed stage measures the
/// push, not the encoding of its input): by [`encode_input`] into `heap`
/// under [`SourceMemory::Staged`]; by [`load_input`] into `mem` under
/// [`SourceMemory::Registered`], and then `heap` is not read (pass `&[]`).
pub async fn push_encoded(
    ctx: &Ctx,
    st: &StageRefs,
    i: usize,
    input: &[(u64, u64)],
    heap: &[u8],
    mem: &SourceMem,
    p: &PushParams,
) -> Result<PushStats, AppError> {
    push_encoded_with(ctx, st, i, input, heap, mem, p, &mut PartScratch::default()).await
}

/// [`push_encoded`] with a [`PartScratch`] of at least `input.len()`
/// entries (a smaller one, or a stage of more than 256 partitions, hashes
/// each key again in phase 2). Same WRITEs, same order.
#[allow(clippy::too_many_arguments)]
pub async fn push_encoded_with(
    ctx: &Ctx,
    st: &StageRefs,
    i: usize,
    input: &[(u64, u64)],
    heap: &[u8],
    mem: &SourceMem,
    p: &PushParams,
    scratch: &mut PartScratch,
) -> Result<PushStats, AppError> {
    let e = st.entry;
    let registered = p.source == SourceMemory::Registered;
    if registered {
        if mem.entries.len() < input.len() * e {
            return Err(AppError::Config(format!(
                "the registered source memory holds {} B; {} entries of {e} B need more",
                mem.entries.len(),
                input.len()
            )));
        }
    } else {
        debug_assert_eq!(heap.len(), input.len() * e);
    }
    let batch = if p.method == Method::None {
        1
    } else {
        p.batch.max(1)
    };
    // Phase 1: reserve. The partition of an entry is recomputed in phase
    // 2 rather than kept: a multiply-shift hash is cheaper than writing
    // and reading back a word per entry (16 MiB, freshly faulted in, for
    // 2 M entries).
    let mut counts = vec![0u64; st.parts];
    let pids: &[u8] = if st.parts <= 256 && scratch.0.len() >= input.len() {
        let pids = &mut scratch.0[..input.len()];
        for (x, &(k, _)) in pids.iter_mut().zip(input) {
            let j = part_of(k, st.parts);
            counts[j] += 1;
            *x = j as u8;
        }
        pids
    } else {
        for &(k, _) in input {
            counts[part_of(k, st.parts)] += 1;
        }
        &[]
    };
    // Phase 2's partition of entry `k` (whose bytes are `src` when the
    // walk reads them anyway).
    let part = |k: usize, src: Option<&[u8]>| -> usize {
        match (pids.get(k), src) {
            (Some(&j), _) => j as usize,
            (None, Some(src)) => part_of(key_of(src, input, k), st.parts),
            (None, None) => part_of(input[k].0, st.parts),
        }
    };
    let tickets: Vec<_> = (0..st.parts)
        .map(|j| (counts[j] > 0).then(|| ctx.faa(st.head.add(TAILS_AT + 8 * j as u64), counts[j])))
        .collect();
    ctx.post();
    ctx.sync().await?;
    let mut next = vec![0u64; st.parts];
    for j in 0..st.parts {
        if let Some(t) = tickets[j] {
            next[j] = ctx.value(t);
            if next[j] + counts[j] > st.capacity {
                return Err(AppError::Full {
                    need: next[j] + counts[j],
                    capacity: st.capacity,
                });
            }
        }
    }
    // Phase 2: push.
    if p.method == Method::Sp {
        let src = if registered {
            Source::Registered(input.len())
        } else {
            Source::Heap(heap)
        };
        return push_packed(ctx, st, i, src, mem, p, batch, &mut next, part).await;
    }
    if registered {
        return push_in_place(ctx, st, i, input.len(), mem, p, batch, &mut next, part).await;
    }
    let mut stats = PushStats::default();
    // Each partition's next batch, as the registered entries its WRITE(s)
    // gather: partition `j`'s `fill[j]` so far at `pending[j * batch..]`,
    // already the list `write_v` takes (no per-batch list to build, no
    // vector of vectors to grow).
    let mut pending = vec![Local::default(); st.parts * batch];
    let mut fill = vec![0usize; st.parts];
    // Where partition `j`'s oldest pending entry is in the input.
    let mut oldest = vec![0usize; st.parts];
    let mut inflight = 0usize;
    // The oldest entry a WRITE in flight reads (`usize::MAX`: none).
    let mut flying_from = usize::MAX;
    // The entries go into registered memory (which SGL and the unbatched
    // methods WRITE from; SP packs from `heap` instead) a chunk at a time,
    // just ahead of the walk, into a ring of chunks that stays in cache
    // (see `REGISTER_RING`): each entry is copied once, as copying all of
    // them first would, but neither the copy nor the WRITEs that read it
    // wait for DRAM. Before a chunk reuses a slot, the entries still
    // pending in it go out (a partition whose batch has not filled in a
    // whole ring's worth of entries sends it short) and the WRITEs in
    // flight complete (they may still be reading it).
    let ring = mem.entries.len() / e;
    let (chunk, span) = if ring >= input.len() {
        // Room for every entry: no slot is reused.
        (REGISTER_CHUNK, ring.max(1))
    } else {
        let c = REGISTER_CHUNK.min(ring / 2).max(1);
        (c, ring / c * c)
    };
    if ring == 0 && !input.is_empty() {
        return Err(AppError::Config(format!(
            "the source memory holds {ring} entries of {e} B; it needs at least one"
        )));
    }
    // The chunk registered last: its first entry and its first slot.
    let (mut chunk_at, mut chunk_slot) = (0usize, 0usize);
    let mut registered = 0usize;
    for (k, src) in heap.chunks_exact(e).enumerate() {
        if k == registered {
            let n = chunk.min(input.len() - k);
            let slot = k % span;
            if k >= span {
                // Slots `slot..slot + n` held entries `k - span ..`.
                let reused = k - span + n;
                for j in 0..st.parts {
                    if fill[j] > 0 && oldest[j] < reused {
                        let f = std::mem::take(&mut fill[j]);
                        let b = &pending[j * batch..j * batch + f];
                        emit(ctx, st, j, b, &mut next[j], p, &mut stats);
                        flying_from = flying_from.min(oldest[j]);
                        inflight += 1;
                        if inflight >= p.depth.max(1) {
                            ctx.sync().await?;
                            (inflight, flying_from) = (0, usize::MAX);
                        }
                    }
                }
                if flying_from < reused {
                    ctx.sync().await?;
                    (inflight, flying_from) = (0, usize::MAX);
                }
            }
            ctx.put_local(
                mem.entries.slice(slot * e, n * e),
                &heap[k * e..(k + n) * e],
            );
            (chunk_at, chunk_slot) = (k, slot);
            registered += n;
        }
        let j = part(k, Some(src));
        let f = fill[j];
        if f == 0 {
            oldest[j] = k;
        }
        pending[j * batch + f] = mem.entries.slice((chunk_slot + k - chunk_at) * e, e);
        fill[j] = f + 1;
        if f + 1 >= batch {
            fill[j] = 0;
            emit(
                ctx,
                st,
                j,
                &pending[j * batch..(j + 1) * batch],
                &mut next[j],
                p,
                &mut stats,
            );
            flying_from = flying_from.min(oldest[j]);
            inflight += 1;
            if inflight >= p.depth.max(1) {
                ctx.sync().await?;
                (inflight, flying_from) = (0, usize::MAX);
            }
        }
        if p.kill_after.is_some_and(|kill| stats.entries >= kill) {
            return Err(AppError::Killed(i));
        }
    }
    for j in 0..st.parts {
        if fill[j] > 0 {
            let f = std::mem::take(&mut fill[j]);
            emit(
                ctx,
                st,
                j,
                &pending[j * batch..j * batch + f],
                &mut next[j],
                p,
                &mut stats,
            );
            inflight += 1;
            if inflight >= p.depth.max(1) {
                ctx.sync().await?;
                inflight = 0;
            }
        }
    }
    ctx.sync().await?;
    // Phase 3: hand off (after every WRITE completed).
    ctx.faa_sync(st.head.add(DONE_AT), 1).await?;
    Ok(stats)
}

/// Phase 2 and 3 of [`push_encoded`] for SGL and the unbatched methods
/// under [`SourceMemory::Registered`]: the `n` entries already sit in
/// registered memory, so each batch's WRITE(s) point at them where they
/// are (“the local address of these entries that have the same
/// destination will be organized as a WR”): no copy, no slot reused. The
/// WRITEs, their order and their contents are the staged model's, less
/// its early short batches.
#[allow(clippy::too_many_arguments)]
async fn push_in_place(
    ctx: &Ctx,
    st: &StageRefs,
    i: usize,
    n: usize,
    mem: &SourceMem,
    p: &PushParams,
    batch: usize,
    next: &mut [u64],
    part: impl Fn(usize, Option<&[u8]>) -> usize,
) -> Result<PushStats, AppError> {
    let e = st.entry;
    let depth = p.depth.max(1);
    let mut stats = PushStats::default();
    // Partition `j`'s next batch: `fill[j]` entries at `pending[j * batch..]`.
    let mut pending = vec![Local::default(); st.parts * batch];
    let mut fill = vec![0usize; st.parts];
    let mut inflight = 0usize;
    for k in 0..n {
        touch_ahead(ctx, mem, k, n, e);
        let j = part(k, None);
        let f = fill[j];
        pending[j * batch + f] = mem.entries.slice(k * e, e);
        if f + 1 >= batch {
            fill[j] = 0;
            let b = &pending[j * batch..(j + 1) * batch];
            emit(ctx, st, j, b, &mut next[j], p, &mut stats);
            inflight += 1;
            if inflight >= depth {
                ctx.sync().await?;
                inflight = 0;
            }
        } else {
            fill[j] = f + 1;
        }
        if p.kill_after.is_some_and(|kill| stats.entries >= kill) {
            return Err(AppError::Killed(i));
        }
    }
    for j in 0..st.parts {
        let f = std::mem::take(&mut fill[j]);
        if f > 0 {
            let b = &pending[j * batch..j * batch + f];
            emit(ctx, st, j, b, &mut next[j], p, &mut stats);
            inflight += 1;
            if inflight >= depth {
                ctx.sync().await?;
                inflight = 0;
            }
        }
    }
    ctx.sync().await?;
    ctx.faa_sync(st.head.add(DONE_AT), 1).await?;
    Ok(stats)
}

/// Prefetches the first line of registered entry `k + SOURCE_AHEAD` (of
/// `n`), so the walk pulls the source in a line at a time, in order, ahead
/// of the WRITEs that read it. On shm the poster's CPU executes a WRITE's
/// gather, and 16 pieces on lines no one has touched since the input was
/// encoded each waited for DRAM (`execute_vector` took twice the CPU of the
/// staged model's gather, which reads a ring in L2); an RNIC's DMA engine
/// overlaps those reads instead. This function's first form loaded the
/// word ahead (0.36 → 0.22 executor CPU seconds for SGL at 2 M entries of
/// 64 B, 4 executors), which stalled the walk at retirement until the line
/// came; the prefetch instruction retires at once (5 interleaved rounds,
/// median SGL× 3.04 → 3.25 at the default 200 000 entries, 8 runs each).
#[inline(always)]
fn touch_ahead(ctx: &Ctx, mem: &SourceMem, k: usize, n: usize, e: usize) {
    if k + SOURCE_AHEAD < n {
        ctx.prefetch_local(mem.entries.slice((k + SOURCE_AHEAD) * e, 8));
    }
}

/// Where SP packs from: the staged heap, or the first `n` entries of the
/// registered source memory.
#[derive(Clone, Copy)]
enum Source<'a> {
    Heap(&'a [u8]),
    Registered(usize),
}

/// The key of encoded entry `src` (the `k`-th of `input`). Phase 2 reads
/// it from the entry, whose line it touches anyway, rather than from
/// `input` (16 B per entry more from DRAM).
#[inline]
fn key_of(src: &[u8], input: &[(u64, u64)], k: usize) -> u64 {
    let key = u64::from_ne_bytes(src[..8].try_into().expect("an entry starts with its key"));
    debug_assert_eq!(key, input[k].0, "heap is encode_input(input)");
    key
}

/// Phase 2 and 3 of [`push_encoded`] for SP: each partition packs its next
/// batch straight into a registered staging slot of its own as its entries
/// come (one copy from the source's memory, no list of pending entries),
/// and a full slot goes out as one WRITE; at most `depth` slots are in
/// flight, so `parts + depth` slots suffice. The WRITEs, their order and
/// their contents are the ones of packing each batch when it fills.
#[allow(clippy::too_many_arguments)]
async fn push_packed(
    ctx: &Ctx,
    st: &StageRefs,
    i: usize,
    source: Source<'_>,
    mem: &SourceMem,
    p: &PushParams,
    batch: usize,
    next: &mut [u64],
    part: impl Fn(usize, Option<&[u8]>) -> usize,
) -> Result<PushStats, AppError> {
    let e = st.entry;
    let depth = p.depth.max(1);
    let slot_bytes = batch * e;
    let n_slots = st.parts + depth;
    if mem.staging.len() < n_slots * slot_bytes {
        return Err(AppError::Config(format!(
            "SP needs {n_slots} staging slots of {slot_bytes} B; the source memory was declared for fewer partitions"
        )));
    }
    let mut slots = Slots {
        open: (0..st.parts).collect(),
        fill: vec![0; st.parts],
        free: (st.parts..n_slots).rev().collect(),
        flying: Vec::with_capacity(depth),
        slot_bytes,
    };
    let mut stats = PushStats::default();
    match source {
        Source::Heap(heap) => {
            for (k, src) in heap.chunks_exact(e).enumerate() {
                // The walk packs straight from the source, a line or more
                // per entry: start loading the entries `SOURCE_AHEAD`
                // ahead, so its loads do not wait for memory one line at a
                // time. (The other methods read the source in their
                // registration copy, a chunk at a time, which the hardware
                // prefetcher follows.)
                if let Some(ahead) = heap.get((k + SOURCE_AHEAD) * e) {
                    dmkit_fabric::hint::prefetch(ahead);
                }
                let j = part(k, Some(src));
                let at = slots.open[j] * slot_bytes + slots.fill[j] * e;
                ctx.put_local(mem.staging.slice(at, e), src);
                slots.fill[j] += 1;
                if slots.fill[j] >= batch && slots.send(ctx, st, mem, j, next, &mut stats) >= depth
                {
                    ctx.sync().await?;
                    slots.land();
                }
                if p.kill_after.is_some_and(|kill| stats.entries >= kill) {
                    return Err(AppError::Killed(i));
                }
            }
        }
        Source::Registered(n) => {
            // The entries already sit in registered memory; SP still
            // copies each into its packing slot (the study's “extra memory
            // copying”), local to local.
            // (No `touch_ahead`: this walk reads every entry in order
            // itself, which the hardware prefetcher follows; a load ahead
            // of it measured slower, 0.32 against 0.28 executor CPU
            // seconds at 2 M entries, and a prefetch ahead no faster.)
            for k in 0..n {
                let j = part(k, None);
                let at = slots.open[j] * slot_bytes + slots.fill[j] * e;
                ctx.copy_local(mem.staging.slice(at, e), mem.entries.slice(k * e, e));
                slots.fill[j] += 1;
                if slots.fill[j] >= batch && slots.send(ctx, st, mem, j, next, &mut stats) >= depth
                {
                    ctx.sync().await?;
                    slots.land();
                }
                if p.kill_after.is_some_and(|kill| stats.entries >= kill) {
                    return Err(AppError::Killed(i));
                }
            }
        }
    }
    for j in 0..st.parts {
        if slots.fill[j] > 0 && slots.send(ctx, st, mem, j, next, &mut stats) >= depth {
            ctx.sync().await?;
            slots.land();
        }
    }
    ctx.sync().await?;
    ctx.faa_sync(st.head.add(DONE_AT), 1).await?;
    Ok(stats)
}

/// SP's staging slots: partition `j` packs into slot `open[j]`, `fill[j]`
/// entries so far; a sent slot flies until the next sync lands it.
struct Slots {
    open: Vec<usize>,
    fill: Vec<usize>,
    free: Vec<usize>,
    flying: Vec<usize>,
    slot_bytes: usize,
}

impl Slots {
    /// Posts partition `j`'s slot as one WRITE and gives the partition a
    /// fresh one; returns the slots now in flight.
    fn send(
        &mut self,
        ctx: &Ctx,
        st: &StageRefs,
        mem: &SourceMem,
        j: usize,
        next: &mut [u64],
        stats: &mut PushStats,
    ) -> usize {
        let (e, n) = (st.entry, self.fill[j]);
        let dst = st.bufs[j].add(next[j] * e as u64);
        ctx.write(
            dst,
            mem.staging.slice(self.open[j] * self.slot_bytes, n * e),
        );
        ctx.post();
        stats.requests += 1;
        stats.posts += 1;
        stats.entries += n as u64;
        next[j] += n as u64;
        self.flying.push(self.open[j]);
        self.open[j] = self.free.pop().expect("parts + depth slots: one is free");
        self.fill[j] = 0;
        self.flying.len()
    }

    /// After a sync: every slot in flight is free again.
    fn land(&mut self) {
        self.free.append(&mut self.flying);
    }
}

/// Entries SP's walk prefetches its source ahead of the entry it packs
/// (1 KiB of 64-byte entries: a few hundred nanoseconds of walk, about a
/// memory latency).
const SOURCE_AHEAD: usize = 16;

/// Queues and posts one batch of partition `j`: the registered entries
/// `batch`, in order, to its next slots (see the module docs).
fn emit(
    ctx: &Ctx,
    st: &StageRefs,
    j: usize,
    batch: &[Local],
    next: &mut u64,
    p: &PushParams,
    stats: &mut PushStats,
) {
    let e = st.entry;
    let dst = st.bufs[j].add(*next * e as u64);
    match p.method {
        Method::None | Method::Doorbell => {
            for (x, &entry) in batch.iter().enumerate() {
                ctx.write(dst.add((x * e) as u64), entry);
                if p.method == Method::None {
                    ctx.post();
                    stats.posts += 1;
                }
            }
            stats.requests += batch.len() as u64;
        }
        Method::Sgl => {
            let sge = p.max_sge.max(1);
            for (c, pieces) in batch.chunks(sge).enumerate() {
                ctx.write_v(dst.add((c * sge * e) as u64), pieces);
                stats.requests += 1;
            }
        }
        Method::Sp => unreachable!("SP pushes through push_packed"),
    }
    if p.method != Method::None {
        ctx.post();
        stats.posts += 1;
    }
    stats.entries += batch.len() as u64;
    *next += batch.len() as u64;
}

/// Source `i`'s input: `records` entries with keys spread by a hash.
pub fn input(seed: u64, i: usize, records: u64) -> Vec<(u64, u64)> {
    (0..records)
        .map(|k| {
            let key = fmix64(seed ^ ((i as u64) << 40) ^ k.wrapping_mul(0x9E37_79B9));
            (key, k | ((i as u64) << 48))
        })
        .collect()
}

/// A shuffle run's shape.
#[derive(Debug, Clone, PartialEq)]
pub struct ShuffleConfig {
    /// Source executors (`n`).
    pub executors: usize,
    /// Partitions (`m`; the next stage's executors).
    pub parts: usize,
    /// Entries per source.
    pub records: u64,
    /// Bytes per entry.
    pub entry: usize,
    /// How sources push.
    pub push: PushParams,
    /// Seed of the entries' keys.
    pub seed: u64,
}

/// Runs one shuffle stage on `platform` (epoch 1; on an incomplete stage,
/// reruns under the next epoch up to `reruns` times) and checks its
/// output. Returns the result and the epoch that completed.
pub fn run(
    platform: &mut crate::platform::Platform,
    cfg: &ShuffleConfig,
    kill: Option<(usize, u64)>,
    reruns: u32,
) -> Result<(crate::AppResult, u32), AppError> {
    let fabric = platform.fabric();
    let per_part = (cfg.executors as u64 * cfg.records).div_ceil(cfg.parts as u64);
    let capacity = per_part + per_part / 4 + 64;
    let stage = Stage::create(
        fabric.as_ref(),
        "shuffle",
        cfg.executors,
        cfg.parts,
        cfg.entry,
        capacity,
    )?;
    let r = run_on(platform, &stage, cfg, kill, reruns);
    let freed = stage.destroy(fabric.as_ref());
    let r = r?;
    freed?;
    Ok(r)
}

fn run_on(
    platform: &mut crate::platform::Platform,
    stage: &Stage,
    cfg: &ShuffleConfig,
    mut kill: Option<(usize, u64)>,
    reruns: u32,
) -> Result<(crate::AppResult, u32), AppError> {
    let fabric = platform.fabric();
    let inputs: Arc<Vec<Vec<(u64, u64)>>> = Arc::new(
        (0..cfg.executors)
            .map(|i| input(cfg.seed, i, cfg.records))
            .collect(),
    );
    let mut l = LocalLayout::new();
    let mem = SourceMem::declare(
        &mut l,
        cfg.records as usize,
        cfg.entry,
        cfg.parts,
        &cfg.push,
    )?;
    let refs = stage.refs();
    let rt = crate::platform::raw_runtime(cfg.seed);
    let scratches: Arc<Vec<std::sync::Mutex<PartScratch>>> = Arc::new(
        (0..cfg.executors)
            .map(|_| std::sync::Mutex::new(PartScratch::new(cfg.records as usize)))
            .collect(),
    );
    let mut epoch = 1;
    loop {
        stage.begin(fabric.as_ref(), epoch)?;
        // The input as it sits in memory before the stage (not timed):
        // staged, in a heap per source, encoded here; registered, in each
        // source's registered memory, encoded by the executor before the
        // window opens (the platform calls the body before its start).
        let registered = cfg.push.source == SourceMemory::Registered;
        let heaps: Arc<Vec<Vec<u8>>> = Arc::new(
            inputs
                .iter()
                .enumerate()
                .map(|(i, input)| {
                    if registered {
                        Vec::new()
                    } else {
                        encode_input(cfg.entry, i, epoch, input)
                    }
                })
                .collect(),
        );
        let (outs, secs, traffic) = platform.run(cfg.executors, &l, &rt, |ctx, i| {
            let (refs, inputs, heaps) = (refs.clone(), inputs.clone(), heaps.clone());
            let mut p = cfg.push;
            p.kill_after = kill.and_then(|(who, after)| (who == i).then_some(after));
            let scratch = scratches.clone();
            let loaded = if registered {
                load_input(&ctx, &mem, cfg.entry, i, epoch, &inputs[i])
            } else {
                Ok(())
            };
            async move {
                let cpu0 = thread_cpu_ns();
                loaded?;
                let take =
                    || std::mem::take(&mut *scratch[i].lock().unwrap_or_else(|e| e.into_inner()));
                let mut s = take();
                let r = push_encoded_with(&ctx, &refs, i, &inputs[i], &heaps[i], &mem, &p, &mut s)
                    .await;
                // Back for a rerun of the stage.
                *scratch[i].lock().unwrap_or_else(|e| e.into_inner()) = s;
                let cpu = cpu0.zip(thread_cpu_ns()).map(|(a, b)| b.saturating_sub(a));
                r.map(|st| (st, cpu))
            }
        })?;
        // The executors' CPU time in the window (threads only: a simulated
        // executor's time is virtual): unlike `secs`, other processes on
        // the host barely move it.
        let cpu: Option<u64> = (!platform.is_sim())
            .then(|| {
                outs.iter()
                    .map(|o| o.as_ref().ok().and_then(|x| x.1))
                    .sum::<Option<u64>>()
            })
            .flatten();
        let outs: Vec<_> = outs.into_iter().map(|o| o.map(|x| x.0)).collect();
        let killed = outs.iter().any(|o| matches!(o, Err(AppError::Killed(_))));
        if let Some(e) = outs
            .into_iter()
            .find_map(|o| o.err().filter(|e| !matches!(e, AppError::Killed(_))))
        {
            return Err(e);
        }
        match stage.complete(fabric.as_ref(), epoch) {
            Err(AppError::Incomplete { .. }) if killed && epoch <= reruns => {
                // The stage failed cleanly: rerun it whole.
                kill = None;
                epoch += 1;
                continue;
            }
            Err(e) => return Err(e),
            Ok(()) => {}
        }
        let records = stage.check(fabric.as_ref(), epoch, &inputs)?;
        return Ok((
            crate::AppResult {
                app: "shuffle".into(),
                backend: platform.backend().into(),
                method: cfg.push.method.name().into(),
                batch: if cfg.push.method == Method::None {
                    1
                } else {
                    cfg.push.batch
                },
                executors: cfg.executors,
                records,
                seconds: secs,
                records_per_s: records as f64 / secs.max(1e-12),
                bytes_per_record: traffic.bytes_written as f64 / records.max(1) as f64,
                verified: true,
                phases: std::iter::once(("shuffle".into(), secs))
                    .chain(cpu.map(|ns| ("executor CPU seconds".into(), ns as f64 / 1e9)))
                    .collect(),
                numa: false,
                round_seconds: Vec::new(),
            },
            epoch,
        ));
    }
}

/// The CPU time the calling thread has run, in nanoseconds
/// (`CLOCK_THREAD_CPUTIME_ID`; `None` if the clock is unavailable).
fn thread_cpu_ns() -> Option<u64> {
    let t = nix::time::clock_gettime(nix::time::ClockId::CLOCK_THREAD_CPUTIME_ID).ok()?;
    Some(t.tv_sec() as u64 * 1_000_000_000 + t.tv_nsec() as u64)
}

/// The address of partition `j`'s buffer (for readers of a stage).
pub fn buffer_addr(st: &StageRefs, j: usize) -> GlobalAddr {
    st.bufs[j].addr
}
