//! IO consolidation (RDMA memory-semantics study, §III-C, Fig. 7–8; the
//! hash table's hot area, §IV-B): small writes to one aligned remote region
//! are buffered by the client and go to remote memory as one WRITE once
//! `θ` of them have accumulated or a lease has run out — the study's
//! "remote burst buffer". Reads of the region are served from the buffer
//! while it is fresh.
//!
//! The study offers it as a *hint*: the application says which regions are
//! hot ("we can provide a 'hint' interface that users can indicate the
//! frequency access data, and any modifications to these remote areas will
//! be consolidated"). Two forms, by who may write the region:
//!
//! - [`WriteBuffer`]: a region only this client writes (a thread's own
//!   log segment, its partition of a shuffle buffer, Fig. 8's benchmark).
//!   [`WriteBuffer::hint`] marks it; the first access READs it once, after
//!   which the buffer is the truth: reads never go remote, writes are
//!   applied to the buffer and the bytes they changed (one span, from the
//!   first to the last changed byte) are written back with one WRITE at
//!   the `θ`-th modification, at the owner's first [`WriteBuffer::tick`]
//!   after the oldest buffered one is `lease` old (the burst buffer's
//!   timer: an owner calls it between operations or when idle), or on
//!   [`WriteBuffer::flush`].
//! - [`SharedRegions`]: regions many clients write (the hash table's hot
//!   blocks). Each region carries a remote spinlock with a lease
//!   ([`crate::RemoteLock`], §III-E); a compute machine takes it, READs the
//!   region into its buffer, serves operations there, and hands lock and
//!   buffer from task to task (a local ticket lock per region,
//!   [`crate::machine::TicketLocks`]) while someone waits, fewer than `θ`
//!   modifications are buffered, the region was taken less than `hold`
//!   ago and more than half its lease is left; otherwise it WRITEs the
//!   region back and releases the lock in one batch. A machine never keeps
//!   an idle region (nothing would write it back). While no machine holds
//!   a region, [`SharedRegions::read_unheld`] reads it in one round trip.
//!
//! ## Remote layout of a shared region
//! ```text
//!  0        8          16
//!  +--------+----------+---------------------------------------+
//!  | lock   | flushes  | data (len bytes)                      |
//!  +--------+----------+---------------------------------------+
//!  lock: a RemoteLock word (owner 16 | lease deadline µs 48), 0 = free
//!  flushes: write-backs of the region so far
//! ```
//!
//! ## What it costs
//! Buffered writes live only in the client's memory until the write-back:
//! a client that dies loses up to `θ − 1` acknowledged modifications (the
//! study's burst buffer has the same window). A [`WriteBuffer`] assumes it
//! is the region's only writer; nothing checks that.

use std::sync::Mutex;

use dmkit_fabric::{FabricError, GlobalAddr, RemoteRef};
use zerocopy::{FromBytes, Immutable, IntoBytes, KnownLayout};

use crate::clock::Nanos;
use crate::ctx::Ctx;
use crate::local::Local;
use crate::lock::{LockConfig, LockError, LockGuard, RemoteLock};
use crate::machine::{TicketGrant, TicketLocks};

/// When buffered modifications go back.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ConsolidationConfig {
    /// θ: buffered modifications that force a write-back (1 = write
    /// through).
    pub theta: u32,
    /// Longest a modification stays buffered ([`WriteBuffer`]), or a
    /// machine keeps a shared region however busy ([`SharedRegions`]'s
    /// `hold`) (ns).
    pub lease: Nanos,
}

impl Default for ConsolidationConfig {
    fn default() -> Self {
        Self {
            theta: 16,
            lease: 50_000,
        }
    }
}

/// Why a consolidated access failed.
#[derive(Debug, thiserror::Error)]
pub enum ConsolidateError {
    /// A verb on the region or its lock failed.
    #[error(transparent)]
    Fabric(#[from] FabricError),
    /// The region's remote lock could not be taken or released.
    #[error(transparent)]
    Lock(#[from] LockError),
    /// The region cannot be consolidated (misaligned, too large, empty).
    #[error("hot region at {addr} of {len} B: {why}")]
    Region {
        /// The region's first byte.
        addr: GlobalAddr,
        /// Its length in bytes.
        len: usize,
        /// What is wrong with it.
        why: &'static str,
    },
    /// A flush or release of a region this worker does not hold.
    #[error("hot region at {addr} held locally without its remote lock")]
    NotHeld {
        /// The region's first byte.
        addr: GlobalAddr,
    },
}

/// Largest hot region.
pub const MAX_REGION: usize = 1 << 20;

/// What a [`WriteBuffer`] did so far.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct WriteBufferStats {
    /// Writes applied to the buffer.
    pub writes: u64,
    /// Reads served from the buffer.
    pub reads: u64,
    /// Write-backs (one WRITE each).
    pub flushes: u64,
    /// Of which because the lease ran out.
    pub lease_flushes: u64,
    /// Bytes written back.
    pub bytes_flushed: u64,
    /// READs of the whole region (the first access).
    pub loads: u64,
}

/// A hot region only this client writes, with its write-back buffer (see
/// the module docs). The buffer is a range of the owner task's registered
/// local memory (a [`Local`] the caller declares, as long as the region):
/// the first access READs the region straight into it and a write-back is
/// one WRITE straight from it, with no staging copy. Not shared: the task
/// whose memory holds the buffer owns it (another task's [`Ctx`] would name
/// its own memory).
#[derive(Debug)]
pub struct WriteBuffer {
    region: RemoteRef,
    cfg: ConsolidationConfig,
    buf: Local,
    loaded: bool,
    mods: u32,
    /// When the oldest buffered modification was made.
    since: Nanos,
    /// Changed bytes not yet written back: `[lo, hi)`, empty (`lo >= hi`)
    /// when clean.
    lo: usize,
    hi: usize,
    stats: WriteBufferStats,
}

impl WriteBuffer {
    /// The hint: `[region, region + buf.len())` is hot and this client is
    /// its only writer; `buf` is the owner task's local memory that buffers
    /// it. The length is at most [`MAX_REGION`]; the region is aligned to
    /// its length rounded up to a power of two (at most 4 KiB), as the
    /// study's "aligned memory region (S bytes)".
    pub fn hint(
        region: RemoteRef,
        buf: Local,
        cfg: ConsolidationConfig,
    ) -> Result<Self, ConsolidateError> {
        let len = buf.len();
        let bad = |why| ConsolidateError::Region {
            addr: region.addr,
            len,
            why,
        };
        if len == 0 || len > MAX_REGION {
            return Err(bad("length must be 1..=1 MiB"));
        }
        let align = len.next_power_of_two().min(4096) as u64;
        if !region.addr.offset().is_multiple_of(align) {
            return Err(bad("not aligned to its size"));
        }
        if cfg.theta == 0 {
            return Err(bad("θ must be at least 1"));
        }
        Ok(Self {
            region,
            cfg,
            buf,
            loaded: false,
            mods: 0,
            since: 0,
            lo: usize::MAX,
            hi: 0,
            stats: WriteBufferStats::default(),
        })
    }

    /// The region.
    pub fn region(&self) -> RemoteRef {
        self.region
    }

    /// The local memory that buffers it.
    pub fn buffer(&self) -> Local {
        self.buf
    }

    /// Its length.
    pub fn len(&self) -> usize {
        self.buf.len()
    }

    /// Whether the region is empty (never: `hint` refuses it).
    pub fn is_empty(&self) -> bool {
        self.buf.is_empty()
    }

    /// Modifications buffered and not yet written back.
    pub fn pending(&self) -> u32 {
        self.mods
    }

    /// What it did so far.
    pub fn stats(&self) -> WriteBufferStats {
        self.stats
    }

    /// READs the region into the buffer once (the buffer is the truth
    /// afterwards).
    async fn load(&mut self, ctx: &Ctx) -> Result<(), FabricError> {
        if self.loaded {
            return Ok(());
        }
        ctx.read_sync(self.region, self.buf).await?;
        self.loaded = true;
        self.stats.loads += 1;
        Ok(())
    }

    /// Applies a write of `data` at byte `at` of the region to the buffer;
    /// writes the changed span back (one WRITE, awaited) if that makes `θ`
    /// modifications. Returns whether it wrote back. (A modification older
    /// than the lease goes back at the owner's next [`WriteBuffer::tick`].)
    ///
    /// # Panics
    /// If the write does not lie inside the region (programmer error).
    pub async fn write(&mut self, ctx: &Ctx, at: usize, data: &[u8]) -> Result<bool, FabricError> {
        if !self.loaded {
            self.load(ctx).await?;
        }
        if self.apply(ctx, None, at, data) {
            return self.flush(ctx).await;
        }
        Ok(false)
    }

    /// [`WriteBuffer::write`] without awaiting, for a loop where a write is
    /// a copy: applies the write to the buffer if the region is loaded and
    /// returns whether it made `θ` modifications (then the caller
    /// [`WriteBuffer::flush`]es); `None` if the region was never loaded
    /// (then the caller uses `write`). An async call returns a
    /// `Result<bool, FabricError>` through memory, and moving it stalled
    /// the store buffer on every buffered write (perf: 16 % of a θ = 16
    /// run on shm).
    ///
    /// # Panics
    /// If the write does not lie inside the region (programmer error).
    #[inline]
    pub fn try_write(&mut self, ctx: &Ctx, at: usize, data: &[u8]) -> Option<bool> {
        if !self.loaded {
            return None;
        }
        Some(self.apply(ctx, None, at, data))
    }

    /// [`WriteBuffer::try_write`] for a caller that reads the clock anyway
    /// (say once per batch of writes): `now` is a reading taken no later
    /// than this write. The lease of a write into a clean buffer counts
    /// from `now` instead of a clock read of its own, so an older reading
    /// only brings the write-back forward, never past the lease. (On shm a
    /// clock read costs about three buffered writes; perf: 12 % of a
    /// θ = 16 run went to the one per write-back cycle.)
    ///
    /// # Panics
    /// If the write does not lie inside the region (programmer error).
    #[inline(always)]
    pub fn try_write_at(&mut self, ctx: &Ctx, now: Nanos, at: usize, data: &[u8]) -> Option<bool> {
        if !self.loaded {
            return None;
        }
        Some(self.apply(ctx, Some(now), at, data))
    }

    /// The buffered part of a write (no await: the common case costs a
    /// copy and a few counters); whether it makes `θ` modifications. The
    /// lease of a write into a clean buffer starts at `now`, or at a clock
    /// read if the caller has none.
    #[inline(always)]
    fn apply(&mut self, ctx: &Ctx, now: Option<Nanos>, at: usize, data: &[u8]) -> bool {
        // `slice` panics if the write leaves the region.
        ctx.put_local(self.buf.slice(at, data.len()), data);
        let end = at + data.len();
        self.lo = self.lo.min(at);
        self.hi = self.hi.max(end);
        // The clock is read once per write-back cycle, not per write: on
        // shm a clock read costs more than the buffered write itself
        // (perf: 40 % of a θ = 16 run). The lease is checked by `tick`.
        if self.mods == 0 {
            self.since = now.unwrap_or_else(|| ctx.now());
        }
        self.mods += 1;
        self.stats.writes += 1;
        self.mods >= self.cfg.theta
    }

    /// Copies `out.len()` bytes at byte `at` of the region from the buffer
    /// (loading it first if this is the first access).
    ///
    /// # Panics
    /// If the range does not lie inside the region (programmer error).
    pub async fn read(&mut self, ctx: &Ctx, at: usize, out: &mut [u8]) -> Result<(), FabricError> {
        let from = self.buf.slice(at, out.len());
        self.load(ctx).await?;
        ctx.get_local(from, out);
        self.stats.reads += 1;
        Ok(())
    }

    /// Whether buffered modifications have waited `lease` or longer.
    pub fn expired(&self, now: Nanos) -> bool {
        self.mods > 0 && now.saturating_sub(self.since) >= self.cfg.lease
    }

    /// Writes back if the lease ran out (an owner that goes idle calls
    /// this now and then). Returns whether it wrote back.
    pub async fn tick(&mut self, ctx: &Ctx) -> Result<bool, FabricError> {
        if !self.expired(ctx.now()) {
            return Ok(false);
        }
        self.stats.lease_flushes += 1;
        self.flush(ctx).await
    }

    /// Writes the changed span back now: one WRITE straight from the
    /// buffer, awaited. Returns whether there was anything to write (empty
    /// writes change nothing).
    pub async fn flush(&mut self, ctx: &Ctx) -> Result<bool, FabricError> {
        let (lo, hi) = (self.lo, self.hi);
        if self.mods == 0 {
            debug_assert!(lo >= hi, "changed bytes without a modification");
            return Ok(false);
        }
        // Empty writes count as modifications but change no byte.
        if lo >= hi {
            self.mods = 0;
            return Ok(false);
        }
        ctx.write_sync(self.region.add(lo as u64), self.buf.slice(lo, hi - lo))
            .await?;
        (self.lo, self.hi) = (usize::MAX, 0);
        self.mods = 0;
        self.stats.flushes += 1;
        self.stats.bytes_flushed += (hi - lo) as u64;
        Ok(true)
    }
}

/// Head of a shared hot region in remote memory (see the module docs).
#[repr(C)]
#[derive(
    Debug, Clone, Copy, Default, PartialEq, Eq, FromBytes, IntoBytes, KnownLayout, Immutable,
)]
pub struct RegionHead {
    /// [`RemoteLock`] word.
    pub lock: u64,
    /// Write-backs so far.
    pub flushes: u64,
}
const _: () = assert!(std::mem::size_of::<RegionHead>() == 16);
/// The data of a shared region starts after its head.
pub const DATA_AT: u64 = std::mem::size_of::<RegionHead>() as u64;
/// Offset of the flush counter.
pub const FLUSHES_AT: u64 = std::mem::offset_of!(RegionHead, flushes) as u64;

/// How a [`SharedRegions`] table behaves.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SharedConfig {
    /// θ and the longest a machine keeps a region (`lease` = `hold`).
    pub consolidation: ConsolidationConfig,
    /// The remote lock's lease (crash recovery; must exceed twice the
    /// hold).
    pub lock_lease: Nanos,
}

/// One shared hot region: where it is (its head) and its data length.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SharedRegion {
    /// The region's head (its lock word).
    pub head: RemoteRef,
    /// Bytes of data after the head.
    pub len: usize,
}

impl SharedRegion {
    /// Its data.
    pub fn data(&self) -> RemoteRef {
        self.head.add(DATA_AT)
    }
}

/// A region as one machine holds it.
#[derive(Default)]
struct Held {
    guard: Option<LockGuard>,
    data: Vec<u8>,
    mods: u32,
    since: Nanos,
}

/// One compute machine's side of a table of shared hot regions: a local
/// ticket lock and a buffer per region (see the module docs). Made once per
/// machine and shared by its clients.
pub struct SharedRegions {
    tickets: TicketLocks,
    held: Vec<Mutex<Held>>,
    cfg: SharedConfig,
}

/// A region this machine's client holds (locally, and the machine holds
/// its remote lock): its buffer is the truth until it is given back.
#[must_use = "a held region is passed on with SharedRegions::finish or give_back"]
pub struct Holding {
    grant: TicketGrant,
    region: SharedRegion,
    /// The previous local holder handed the region over (no remote lock
    /// taken, no READ).
    pub handed_in: bool,
}

impl SharedRegions {
    /// A table of `regions` regions; a region passes from local holder to
    /// local holder at most `max_handover` times in a row.
    pub fn new(regions: usize, max_handover: u32, cfg: SharedConfig) -> Self {
        Self {
            tickets: TicketLocks::new(regions, max_handover),
            held: (0..regions).map(|_| Mutex::default()).collect(),
            cfg,
        }
    }

    /// Regions in the table.
    pub fn len(&self) -> usize {
        self.held.len()
    }

    /// Whether the table has no regions.
    pub fn is_empty(&self) -> bool {
        self.held.is_empty()
    }

    fn lock_of(&self, region: &SharedRegion) -> RemoteLock {
        RemoteLock::new(
            region.head,
            LockConfig {
                lease: self.cfg.lock_lease,
                ..LockConfig::default()
            },
        )
    }

    /// One round trip while no machine holds the region: READs its lock
    /// word into `word` and its data bytes `[at, at + dst.len())` into
    /// `dst`, in one batch (queue-pair order reads the lock first). `Ok(true)`:
    /// the lock was free, so the region's remote bytes were the whole truth
    /// at that instant and `dst` reflects an instant inside the call (a
    /// write-back that started in between may have torn it: the caller
    /// checks, e.g. by checksum). `Ok(false)`: someone holds it.
    pub async fn read_unheld(
        &self,
        ctx: &Ctx,
        region: &SharedRegion,
        word: Local,
        at: usize,
        dst: Local,
    ) -> Result<bool, FabricError> {
        ctx.read(region.head, word);
        ctx.read(region.data().add(at as u64), dst);
        ctx.sync().await?;
        Ok(ctx.local_u64(word) == 0)
    }

    /// Takes region `index` for this client: its local ticket, then — unless
    /// the previous local holder handed it over — its remote lock for
    /// `owner` (with backoff; an expired lease is broken) and a READ of its
    /// data into the buffer (through `scratch`, at least `len` bytes).
    pub async fn acquire(
        &self,
        ctx: &Ctx,
        index: usize,
        region: SharedRegion,
        owner: u16,
        scratch: Local,
    ) -> Result<Holding, ConsolidateError> {
        let grant = self.tickets.acquire(ctx, index).await;
        if grant.handed {
            return Ok(Holding {
                grant,
                region,
                handed_in: true,
            });
        }
        let guard = match self.lock_of(&region).lock(ctx, owner).await {
            Ok(guard) => guard,
            Err(e) => {
                self.tickets.abandon(grant);
                return Err(e.into());
            }
        };
        let n = region.len;
        if let Err(e) = ctx.read_sync(region.data(), scratch.prefix(n)).await {
            // The lock is ours; give it back if the fabric lets us.
            let _ = guard.unlock(ctx).await;
            self.tickets.abandon(grant);
            return Err(e.into());
        }
        let mut h = self.held[index].lock().unwrap_or_else(|p| p.into_inner());
        h.data.resize(n, 0);
        ctx.get_local(scratch, &mut h.data);
        h.guard = Some(guard);
        h.mods = 0;
        h.since = ctx.now();
        Ok(Holding {
            grant,
            region,
            handed_in: false,
        })
    }

    /// Runs `f` on the held region's buffer; `f` returns its result and how
    /// many modifications it made. Then decides whether the region stays
    /// with this machine for the next local waiter: someone waits, fewer
    /// than `θ` modifications are buffered, it was taken less than `hold`
    /// ago and more than half its lock's lease is left. Returns `f`'s
    /// result and the decision ([`Decision`]).
    pub fn update<R>(
        &self,
        ctx: &Ctx,
        h: &Holding,
        f: impl FnOnce(&mut [u8]) -> (R, u32),
    ) -> (R, Decision) {
        let index = h.grant.index;
        let mut held = self.held[index].lock().unwrap_or_else(|p| p.into_inner());
        let (r, mods) = f(&mut held.data);
        held.mods += mods;
        let c = &self.cfg.consolidation;
        let fresh = ctx.now().saturating_sub(held.since) < c.lease
            && held
                .guard
                .as_ref()
                .is_some_and(|lock| lock.check(ctx, self.cfg.lock_lease / 2));
        let allow = held.mods < c.theta && fresh;
        let keep = self.tickets.hand_over_if(h.grant, allow);
        (
            r,
            Decision {
                keep,
                flush: held.mods > 0,
            },
        )
    }

    /// Passes the region on as `d` says: to the next local waiter (lock and
    /// buffer stay with the machine), or back to remote memory. Returns
    /// whether it wrote the region back.
    pub async fn finish(
        &self,
        ctx: &Ctx,
        h: Holding,
        d: Decision,
        scratch: Local,
    ) -> Result<bool, ConsolidateError> {
        if d.keep {
            self.tickets.release(h.grant);
            return Ok(false);
        }
        self.give_back(ctx, h, scratch, d.flush).await?;
        Ok(d.flush)
    }

    /// WRITEs the region back (when `flush`) and releases its remote lock in
    /// one batch, then passes the local ticket on.
    pub async fn give_back(
        &self,
        ctx: &Ctx,
        h: Holding,
        scratch: Local,
        flush: bool,
    ) -> Result<(), ConsolidateError> {
        let index = h.grant.index;
        let guard = {
            let mut held = self.held[index].lock().unwrap_or_else(|p| p.into_inner());
            if flush {
                ctx.put_local(scratch, &held.data);
                held.mods = 0;
            }
            held.guard.take()
        };
        if flush {
            ctx.write(h.region.data(), scratch.prefix(h.region.len));
            ctx.faa(h.region.head.add(FLUSHES_AT), 1);
        }
        let r = match guard {
            Some(guard) => guard.unlock(ctx).await.map_err(ConsolidateError::from),
            None => Err(ConsolidateError::NotHeld {
                addr: h.region.head.addr,
            }),
        };
        self.tickets.abandon(h.grant);
        r
    }
}

/// What [`SharedRegions::update`] decided.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Decision {
    /// The region goes to the next local waiter.
    pub keep: bool,
    /// Modifications are buffered (a give-back writes the region).
    pub flush: bool,
}
