//! The vector-IO benchmark (RDMA memory-semantics study, §III-A, Fig. 3–5,
//! and §III-B, Fig. 6): a batch of `batch` entries of `size` bytes moved
//! between scattered local buffers and one contiguous remote range, by one
//! of the study's three methods (its Algorithm 1):
//!
//! - **SP** (software packing): the CPU copies the entries into one
//!   registered buffer and posts one WRITE of it (a READ: one READ of the
//!   range, then the CPU copies the entries out);
//! - **doorbell**: one request per entry, all posted with one doorbell;
//! - **SGL**: one request whose scatter/gather list names the entries (the
//!   NIC gathers them). A batch longer than the backend's `max_sge` is
//!   ⌈batch / max_sge⌉ requests of one doorbell (`requests_per_batch`).
//!
//! Every method goes through the runtime's task API (`write_packed`,
//! `write`/`read` + `post`, `write_v`/`read_v`), so the same loop runs on
//! OS threads over shm or verbs ([`run`]) and on virtual threads of the
//! simulator ([`run_sim`]). Each thread is one worker with one task that
//! posts a batch and waits for it (the study's one-client, one-server
//! model); throughput counts entries.
//!
//! The remote range of each batch is the next one in the region
//! (`Pattern::Seq`) or at a uniformly random 64-byte-aligned offset
//! (`Pattern::Random`), in a region of `region_size` bytes (Fig. 6's
//! sweep). [`local_vectored`] is the local baseline the study sets beside
//! it: `pwritev`/`preadv` of the same entries into a memfd of the same
//! size with the same pattern, run in the same invocation.
//!
//! Not here: Fig. 6's local (source-side) random pattern — entries always
//! come from the same local buffers.

use std::io::{IoSlice, IoSliceMut};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use dmkit_fabric::{Fabric, FabricError, GlobalAddr, RemoteRef, SyncQp};
use dmkit_runtime::{Ctx, Local, LocalLayout, RuntimeConfig, Worker};
use serde::Serialize;

use crate::harness;
use crate::micro::BenchError;
use crate::rng::Rng;

/// How a batch of entries is moved (the study's Algorithm 1).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Method {
    /// Software packing: copy into one buffer, one request.
    Sp,
    /// One request per entry, one doorbell.
    Doorbell,
    /// One request with a scatter/gather list.
    Sgl,
}

impl Method {
    /// Every method, in the study's order.
    pub const ALL: [Method; 3] = [Method::Sp, Method::Doorbell, Method::Sgl];

    /// Its name on the command line and in reports.
    pub fn name(self) -> &'static str {
        match self {
            Method::Sp => "sp",
            Method::Doorbell => "doorbell",
            Method::Sgl => "sgl",
        }
    }
}

impl std::str::FromStr for Method {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        Method::ALL
            .into_iter()
            .find(|m| m.name() == s)
            .ok_or_else(|| format!("{s:?}: expected sp, doorbell or sgl"))
    }
}

/// Which way the entries move.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Direction {
    /// Local entries to remote memory (WRITE; `writev` locally).
    Write,
    /// Remote memory to local entries (READ; `readv` locally).
    Read,
}

impl std::str::FromStr for Direction {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "write" => Ok(Direction::Write),
            "read" => Ok(Direction::Read),
            _ => Err(format!("{s:?}: expected write or read")),
        }
    }
}

/// Where each batch's remote range lies.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Pattern {
    /// Right after the previous batch's (wrapping at the region's end).
    Seq,
    /// At a uniformly random 64-byte-aligned offset of the region.
    Random,
}

impl std::str::FromStr for Pattern {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "seq" | "sequential" => Ok(Pattern::Seq),
            "random" => Ok(Pattern::Random),
            _ => Err(format!("{s:?}: expected seq or random")),
        }
    }
}

/// One measured point.
#[derive(Debug, Clone, PartialEq)]
pub struct VectorIoConfig {
    /// How a batch is posted.
    pub method: Method,
    /// Whether batches are written or read.
    pub direction: Direction,
    /// Entries per batch.
    pub batch: usize,
    /// Bytes per entry.
    pub size: usize,
    /// Threads, each with its own queue pair and one task.
    pub threads: usize,
    /// Bytes of the remote region the batches land in.
    pub region_size: u64,
    /// Where in the region successive batches land.
    pub pattern: Pattern,
    /// Measured window (shm/verbs: wall time; simulator: virtual time).
    pub duration: Duration,
    /// Seed of the addresses (and of the simulator).
    pub seed: u64,
}

impl VectorIoConfig {
    /// Bytes one batch moves.
    pub fn extent(&self) -> u64 {
        (self.batch * self.size) as u64
    }

    /// Checks the configuration against a backend's limits.
    pub fn check(&self, max_message: usize) -> Result<(), String> {
        if self.batch == 0 || self.size == 0 || self.threads == 0 {
            return Err("--batch, --size and --threads must be at least 1".into());
        }
        if self.batch > MAX_BATCH {
            return Err(format!("--batch {} exceeds {MAX_BATCH}", self.batch));
        }
        if self.size > MAX_ENTRY {
            return Err(format!(
                "--size {} exceeds {MAX_ENTRY} B per entry",
                self.size
            ));
        }
        if self.extent() as usize > max_message {
            return Err(format!(
                "a batch of {} × {} B exceeds the backend's message limit of {max_message} B",
                self.batch, self.size
            ));
        }
        if self.region_size < self.extent().next_multiple_of(64) + 64 {
            return Err(format!(
                "--region-size {} is smaller than one batch ({} B)",
                self.region_size,
                self.extent()
            ));
        }
        Ok(())
    }
}

/// Most entries per batch.
pub const MAX_BATCH: usize = 1024;
/// Largest entry.
pub const MAX_ENTRY: usize = 64 << 10;

/// What a point measured.
#[derive(Debug, Clone, Default, Serialize)]
pub struct VectorIoResult {
    /// The backend it ran on ("shm", "sim", "verbs").
    pub backend: String,
    /// How a batch is posted.
    pub method: String,
    /// Whether batches are written or read.
    pub direction: String,
    /// Where in the region successive batches land.
    pub pattern: String,
    /// Entries per batch.
    pub batch: usize,
    /// Bytes per entry.
    pub size: usize,
    /// Threads, all machines together.
    pub threads: usize,
    /// Bytes of the remote region the batches land in.
    pub region_size: u64,
    /// Entries moved in the window.
    pub entries: u64,
    /// Length of the measured window in seconds.
    pub seconds: f64,
    /// Million entries per second, all threads.
    pub mops: f64,
    /// `mops / threads`.
    pub mops_per_thread: f64,
    /// Payload gigabytes per second.
    pub gbytes_per_s: f64,
    /// Work requests per batch (doorbell: the batch; SGL: ⌈batch / max_sge⌉; SP: 1).
    pub requests_per_batch: usize,
    /// Doorbells rung (whole run).
    pub doorbells: u64,
    /// The local `pwritev`/`preadv` baseline of the same point, if run.
    pub local: Option<LocalResult>,
    /// Ctrl-C ended the window early: the figures are of the shortened
    /// window.
    pub interrupted: bool,
    /// Set when more threads ran than the process has cores.
    pub oversubscribed: Option<String>,
}

/// The local vector-IO baseline of a point.
#[derive(Debug, Clone, Default, Serialize)]
pub struct LocalResult {
    /// Entries moved in the window.
    pub entries: u64,
    /// Length of the measured window in seconds.
    pub seconds: f64,
    /// Million entries per second, all threads.
    pub mops: f64,
    /// Payload gigabytes per second.
    pub gbytes_per_s: f64,
}

/// A task's memory for one point: the entries (each on its own cache
/// lines, as separate buffers would be) and the packing buffer.
#[derive(Debug, Clone, Copy)]
pub(crate) struct TaskMem {
    entries: Local,
    stride: usize,
    packed: Local,
}

impl TaskMem {
    pub(crate) fn declare(batch: usize, size: usize) -> (LocalLayout, TaskMem) {
        let stride = size.next_multiple_of(64);
        let mut l = LocalLayout::new();
        let entries = l.region("vector-io entries", stride * batch);
        let packed = l.region("vector-io packing buffer", size * batch);
        (
            l,
            TaskMem {
                entries,
                stride,
                packed,
            },
        )
    }

    fn entry(&self, i: usize, size: usize) -> Local {
        self.entries.slice(i * self.stride, size)
    }
}

/// What every task of a point shares.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Plan {
    method: Method,
    direction: Direction,
    batch: usize,
    size: usize,
    pattern: Pattern,
    region: RemoteRef,
    region_size: u64,
    max_sge: usize,
}

impl Plan {
    pub(crate) fn new(cfg: &VectorIoConfig, region: RemoteRef, max_sge: usize) -> Self {
        Self {
            method: cfg.method,
            direction: cfg.direction,
            batch: cfg.batch,
            size: cfg.size,
            pattern: cfg.pattern,
            region,
            region_size: cfg.region_size,
            max_sge: max_sge.max(1),
        }
    }

    /// Work requests one batch takes.
    pub(crate) fn requests_per_batch(&self) -> usize {
        match self.method {
            Method::Sp => 1,
            Method::Doorbell => self.batch,
            Method::Sgl => self.batch.div_ceil(self.max_sge),
        }
    }
}

/// The remote offsets of one task's batches.
pub(crate) struct Cursor {
    rng: Rng,
    next: u64,
    span: u64,
    extent: u64,
    pattern: Pattern,
}

impl Cursor {
    pub(crate) fn new(plan: &Plan, seed: u64, start: u64) -> Self {
        let extent = (plan.batch * plan.size) as u64;
        // Offsets at which a whole batch fits, 64-byte aligned.
        let span = (plan.region_size - extent) / 64 + 1;
        Self {
            rng: Rng::new(seed),
            next: start % span,
            span,
            extent,
            pattern: plan.pattern,
        }
    }

    fn offset(&mut self) -> u64 {
        match self.pattern {
            Pattern::Random => 64 * self.rng.below(self.span),
            Pattern::Seq => {
                let at = self.next;
                self.next += self.extent.div_ceil(64);
                if self.next >= self.span {
                    self.next = 0;
                }
                64 * at
            }
        }
    }
}

/// One batch: queues it by `plan.method`, posts it with one doorbell and
/// waits for it. `heap` holds the entries an SP batch copies from (or to).
pub(crate) async fn one_batch(
    ctx: &Ctx,
    plan: &Plan,
    mem: &TaskMem,
    heap: &mut [Vec<u8>],
    cursor: &mut Cursor,
) -> Result<(), FabricError> {
    let dst = plan.region.add(cursor.offset());
    let (n, size) = (plan.batch, plan.size);
    match (plan.method, plan.direction) {
        (Method::Sp, Direction::Write) => {
            let pieces: Vec<&[u8]> = heap.iter().map(Vec::as_slice).collect();
            ctx.write_packed(dst, mem.packed, &pieces);
        }
        (Method::Sp, Direction::Read) => {
            ctx.read(dst, mem.packed);
        }
        (Method::Doorbell, dir) => {
            for i in 0..n {
                let at = dst.add((i * size) as u64);
                match dir {
                    Direction::Write => ctx.write(at, mem.entry(i, size)),
                    Direction::Read => ctx.read(at, mem.entry(i, size)),
                };
            }
        }
        (Method::Sgl, dir) => {
            let mut i = 0;
            while i < n {
                let k = plan.max_sge.min(n - i);
                let pieces: Vec<Local> = (i..i + k).map(|j| mem.entry(j, size)).collect();
                let at = dst.add((i * size) as u64);
                match dir {
                    Direction::Write => ctx.write_v(at, &pieces),
                    Direction::Read => ctx.read_v(at, &pieces),
                };
                i += k;
            }
        }
    }
    ctx.post();
    ctx.sync().await?;
    if let (Method::Sp, Direction::Read) = (plan.method, plan.direction) {
        // The CPU scatters the packed range into the entries.
        for (i, e) in heap.iter_mut().enumerate() {
            ctx.get_local(mem.packed.slice(i * size, size), e);
        }
    }
    Ok(())
}

/// What a worker's task left in its slot once the worker ran it to the
/// end (a task that did not finish is a bug of the benchmark).
pub(crate) fn outcome<T>(slot: &std::sync::Mutex<Option<T>>) -> T {
    slot.lock()
        .unwrap_or_else(|p| p.into_inner())
        .take()
        .expect("the task finished")
}

/// The runtime configuration of the benchmark's workers: no throttling,
/// no conflict avoidance, no per-operation statistics — the study's
/// benchmark posts verbs directly.
pub(crate) fn raw_runtime(seed: u64) -> RuntimeConfig {
    RuntimeConfig {
        throttle: false,
        conflict_avoid: false,
        op_stats: false,
        seed,
        ..RuntimeConfig::default()
    }
}

fn entry_heap(batch: usize, size: usize) -> Vec<Vec<u8>> {
    (0..batch).map(|i| vec![(i as u8) ^ 0x5A; size]).collect()
}

/// Runs one point on `fabric` (shm or verbs): `cfg.threads` OS threads,
/// each a worker with one task, in one window of `cfg.duration` opened
/// `warmup` after the start barrier ([`crate::harness`]); with `local`, the
/// `pwritev`/`preadv` baseline right after, as long.
pub fn run(
    fabric: &dyn Fabric,
    cfg: &VectorIoConfig,
    local: bool,
    warmup: Duration,
) -> Result<VectorIoResult, BenchError> {
    let caps = fabric.caps();
    cfg.check(caps.max_message).map_err(BenchError::Config)?;
    let node = *fabric
        .nodes()
        .first()
        .expect("a fabric has at least one node");
    let (base, _, rkey) = fabric.alloc_chunk(node, cfg.region_size, false)?;
    let result = measure(
        fabric,
        cfg,
        RemoteRef::new(base, rkey),
        caps.max_sge,
        warmup,
    );
    let freed = fabric.free_chunk(base);
    let mut r = result?;
    freed?;
    if local {
        r.local = Some(local_vectored(cfg).map_err(BenchError::Config)?);
    }
    Ok(r)
}

fn measure(
    fabric: &dyn Fabric,
    cfg: &VectorIoConfig,
    region: RemoteRef,
    max_sge: usize,
    warmup: Duration,
) -> Result<VectorIoResult, BenchError> {
    prefault(fabric, region.addr, region.rkey, cfg.region_size)?;
    let plan = Plan::new(cfg, region, max_sge);
    let (layout, mem) = TaskMem::declare(cfg.batch, cfg.size);
    // One global window (crate::harness): every thread sets up, meets the
    // others at the start barrier, and counts the batches that complete
    // inside the window opened `warmup` after it.
    let (timed, outcomes) = harness::run_threads(
        cfg.threads,
        warmup,
        cfg.duration,
        |t, window, arrival| -> Result<(u64, u64), BenchError> {
            let mut w = Worker::builder(fabric)
                .config(raw_runtime(cfg.seed))
                .id(t)
                .tasks(1)
                .local(&layout)
                .build()?;
            let failure: Arc<std::sync::Mutex<Option<FabricError>>> = Arc::default();
            let counted = Arc::new(AtomicU64::new(0));
            let (window, counted2, failure2) = (window.clone(), counted.clone(), failure.clone());
            let seed = cfg.seed ^ (t as u64 + 1).wrapping_mul(0x9E37_79B9_7F4A_7C15);
            let batch = cfg.batch as u64;
            w.spawn(move |ctx| async move {
                let mut heap = entry_heap(plan.batch, plan.size);
                let span = plan.region_size / 64;
                let mut cursor = Cursor::new(&plan, seed, t as u64 * span / 8);
                while !window.done(ctx.now()) {
                    if let Err(e) = one_batch(&ctx, &plan, &mem, &mut heap, &mut cursor).await {
                        *failure2.lock().unwrap_or_else(|p| p.into_inner()) = Some(e);
                        window.abort();
                        return;
                    }
                    if window.counts(ctx.now()) {
                        counted2.fetch_add(batch, Ordering::Relaxed);
                    }
                }
            });
            arrival.arrive();
            w.run();
            if let Some(e) = failure.lock().unwrap_or_else(|p| p.into_inner()).take() {
                return Err(e.into());
            }
            Ok((
                counted.load(Ordering::Relaxed),
                w.stats().counters.doorbells,
            ))
        },
        |_| {},
    );
    let (mut entries, mut doorbells) = (0, 0);
    for o in outcomes {
        let (e, d) = o?;
        entries += e;
        doorbells += d;
    }
    let mut r = result_of(
        fabric.backend(),
        cfg,
        &plan,
        entries,
        timed.seconds,
        doorbells,
    );
    r.interrupted = timed.interrupted;
    r.oversubscribed = harness::oversubscribed(cfg.threads);
    Ok(r)
}

fn result_of(
    backend: &str,
    cfg: &VectorIoConfig,
    plan: &Plan,
    entries: u64,
    seconds: f64,
    doorbells: u64,
) -> VectorIoResult {
    let mops = harness::rate(entries as f64, seconds) / 1e6;
    VectorIoResult {
        backend: backend.into(),
        method: cfg.method.name().into(),
        direction: match cfg.direction {
            Direction::Write => "write",
            Direction::Read => "read",
        }
        .into(),
        pattern: match cfg.pattern {
            Pattern::Seq => "seq",
            Pattern::Random => "random",
        }
        .into(),
        batch: cfg.batch,
        size: cfg.size,
        threads: cfg.threads,
        region_size: cfg.region_size,
        entries,
        seconds,
        mops,
        mops_per_thread: mops / cfg.threads as f64,
        gbytes_per_s: mops * 1e6 * cfg.size as f64 / 1e9,
        requests_per_batch: plan.requests_per_batch(),
        doorbells,
        local: None,
        interrupted: false,
        oversubscribed: None,
    }
}

/// Writes the region once so every page is resident (a registered region
/// is pinned).
fn prefault(
    fabric: &dyn Fabric,
    base: GlobalAddr,
    rkey: dmkit_fabric::Rkey,
    len: u64,
) -> Result<(), FabricError> {
    let step = (1u64 << 20).min(len);
    let mut q = SyncQp::new(fabric, base.node(), step as usize)?;
    let zeros = vec![0u8; step as usize];
    let mut off = 0;
    while off < len {
        let n = step.min(len - off) as usize;
        q.write(base.add(off), rkey, &zeros[..n])?;
        off += n as u64;
    }
    Ok(())
}

/// The local baseline (the study's Fig. 4 "local writev/readv"): each of
/// `cfg.threads` threads moves batches of `cfg.batch` entries of
/// `cfg.size` bytes between its own buffers and a memfd of
/// `cfg.region_size` bytes with `pwritev`/`preadv`, at offsets drawn as the
/// remote benchmark draws them, for `cfg.duration`.
pub fn local_vectored(cfg: &VectorIoConfig) -> Result<LocalResult, String> {
    use nix::sys::memfd::{memfd_create, MemFdCreateFlag};
    cfg.check(usize::MAX)?;
    let fd = memfd_create(c"dmkit-vector-io", MemFdCreateFlag::MFD_CLOEXEC)
        .map_err(|e| format!("memfd_create: {e}"))?;
    let len = i64::try_from(cfg.region_size).map_err(|_| "--region-size too large")?;
    nix::unistd::ftruncate(&fd, len).map_err(|e| format!("ftruncate: {e}"))?;
    // Resident before timing, as the remote region is.
    let zeros = vec![0u8; 1 << 20];
    let mut off = 0u64;
    while off < cfg.region_size {
        let n = (cfg.region_size - off).min(zeros.len() as u64) as usize;
        nix::sys::uio::pwrite(&fd, &zeros[..n], off as i64).map_err(|e| format!("pwrite: {e}"))?;
        off += n as u64;
    }
    let plan = Plan::new(cfg, RemoteRef::new(GlobalAddr::new(0, 0), 0), usize::MAX);
    // The remote run's discipline (crate::harness), without a warm-up.
    let (timed, outcomes) = harness::run_threads(
        cfg.threads,
        Duration::ZERO,
        cfg.duration,
        |t, window, arrival| -> Result<u64, String> {
            let mut heap = entry_heap(cfg.batch, cfg.size);
            let seed = cfg.seed ^ (t as u64 + 1).wrapping_mul(0x9E37_79B9_7F4A_7C15);
            let mut cursor = Cursor::new(&plan, seed, t as u64 * (cfg.region_size / 64) / 8);
            let mut counted = 0u64;
            arrival.arrive();
            while !window.done(harness::now()) {
                let at = cursor.offset() as i64;
                let r = match cfg.direction {
                    Direction::Write => {
                        let iov: Vec<IoSlice<'_>> = heap.iter().map(|e| IoSlice::new(e)).collect();
                        nix::sys::uio::pwritev(&fd, &iov, at)
                    }
                    Direction::Read => {
                        let mut iov: Vec<IoSliceMut<'_>> =
                            heap.iter_mut().map(|e| IoSliceMut::new(e)).collect();
                        nix::sys::uio::preadv(&fd, &mut iov, at)
                    }
                };
                match r {
                    Ok(n) if n == cfg.batch * cfg.size => {}
                    Ok(n) => {
                        return Err(format!(
                            "vectored IO moved {n} of {} B",
                            cfg.batch * cfg.size
                        ))
                    }
                    Err(e) => return Err(format!("pwritev/preadv: {e}")),
                }
                if window.counts(harness::now()) {
                    counted += cfg.batch as u64;
                }
            }
            Ok(counted)
        },
        |_| {},
    );
    let entries = outcomes.into_iter().sum::<Result<u64, String>>()?;
    let seconds = timed.seconds;
    let mops = harness::rate(entries as f64, seconds) / 1e6;
    Ok(LocalResult {
        entries,
        seconds,
        mops,
        gbytes_per_s: mops * 1e6 * cfg.size as f64 / 1e9,
    })
}

/// The simulated cluster of [`run_sim`].
#[derive(Debug, Clone)]
pub struct SimShape {
    /// The device profile.
    pub profile: dmkit_sim::Profile,
    /// Translation page size of the memory node (the study's region is
    /// 4 KiB-paged `posix_memalign` memory; Fig. 6's translation-cache
    /// effect needs it).
    pub page_size: u64,
    /// Unmeasured virtual time before the window.
    pub warmup: Duration,
}

/// Runs one point on the simulator: `cfg.threads` virtual threads on one
/// compute machine against one memory node, `cfg.duration` of virtual
/// time measured after `shape.warmup`. The result's `seconds` is virtual.
pub fn run_sim(cfg: &VectorIoConfig, shape: &SimShape) -> Result<VectorIoResult, BenchError> {
    use dmkit_sim::{Sim, SimConfig};
    use std::cell::Cell;
    use std::rc::Rc;
    let limits = &shape.profile.limits;
    cfg.check(limits.max_message).map_err(BenchError::Config)?;
    let mut sim = Sim::new(SimConfig {
        profile: shape.profile.clone(),
        compute_machines: 1,
        memory_nodes: 1,
        memory_bytes: cfg.region_size + (8 << 20),
        page_size: shape.page_size,
        seed: cfg.seed,
        ..SimConfig::default()
    })?;
    let fabric = sim.dyn_fabric();
    let (base, _, rkey) = fabric.alloc_chunk(0, cfg.region_size, true)?;
    let plan = Plan::new(cfg, RemoteRef::new(base, rkey), fabric.caps().max_sge);
    let (layout, mem) = TaskMem::declare(cfg.batch, cfg.size);
    let warm = shape.warmup.as_nanos() as u64;
    let end = warm + cfg.duration.as_nanos() as u64;
    let entries = Rc::new(Cell::new(0u64));
    let failed: Rc<Cell<bool>> = Rc::default();
    let mut threads = Vec::new();
    for t in 0..cfg.threads {
        let th = sim.add_worker(0, |f: &dyn Fabric, clock| -> Result<Worker, BenchError> {
            Ok(Worker::builder(f)
                .clock(clock)
                .config(raw_runtime(cfg.seed))
                .id(t)
                .tasks(1)
                .local(&layout)
                .build()?)
        })?;
        threads.push(th);
        let (entries, failed) = (entries.clone(), failed.clone());
        let seed = cfg.seed ^ (t as u64 + 1).wrapping_mul(0x9E37_79B9_7F4A_7C15);
        let span = cfg.region_size / 64;
        sim.worker_mut(th).spawn(move |ctx| async move {
            let mut heap = entry_heap(plan.batch, plan.size);
            // Threads start an eighth of the region apart, plus one 4 KiB
            // page each: an eighth of a power-of-two region is a multiple
            // of the device's direct-mapped translation cache, and without
            // the page every thread's sequential stream would evict the
            // others' entry from the same slot.
            let mut cursor = Cursor::new(&plan, seed, t as u64 * (span / 8 + 64));
            while ctx.now() < end {
                if one_batch(&ctx, &plan, &mem, &mut heap, &mut cursor)
                    .await
                    .is_err()
                {
                    failed.set(true);
                    return;
                }
                let now = ctx.now();
                if now >= warm && now < end {
                    entries.set(entries.get() + plan.batch as u64);
                }
            }
        });
    }
    sim.run_until(end);
    if failed.get() {
        return Err(BenchError::Config(
            "a request failed in the simulation".into(),
        ));
    }
    let doorbells = threads
        .iter()
        .map(|&t| sim.thread_stats(t).counters.doorbells)
        .sum();
    Ok(result_of(
        "sim",
        cfg,
        &plan,
        entries.get(),
        cfg.duration.as_secs_f64(),
        doorbells,
    ))
}

#[cfg(test)]
mod tests {
    use super::*;
    use dmkit_fabric::shm::{ShmConfig, ShmFabric};
    use dmkit_fabric::ControlPlane;

    fn fabric() -> ShmFabric {
        ShmFabric::one_node(ShmConfig::default(), 8 << 20).unwrap()
    }

    fn point(method: Method, direction: Direction, batch: usize) -> VectorIoConfig {
        VectorIoConfig {
            method,
            direction,
            batch,
            size: 24,
            threads: 2,
            region_size: 1 << 20,
            pattern: Pattern::Random,
            // Long enough that both threads get a core inside the window on
            // a loaded machine.
            duration: Duration::from_millis(150),
            seed: 3,
        }
    }

    /// Each method moves the same bytes to the same place: one batch of
    /// each, written from distinct entries, reads back identical.
    #[test]
    fn every_method_moves_the_entries_where_the_others_do() {
        let f = fabric();
        let (base, _, rkey) = f.alloc_chunk(0, 1 << 16, false).unwrap();
        let region = RemoteRef::new(base, rkey);
        let mut images = Vec::new();
        for method in Method::ALL {
            let cfg = VectorIoConfig {
                region_size: 1 << 16,
                batch: 20,
                ..point(method, Direction::Write, 20)
            };
            // max_sge 16: the SGL batch of 20 is two requests.
            let plan = Plan::new(&cfg, region, 16);
            assert_eq!(plan.requests_per_batch(), [1, 20, 2][images.len()]);
            let (layout, mem) = TaskMem::declare(cfg.batch, cfg.size);
            let mut w = Worker::builder(&f)
                .config(raw_runtime(1))
                .local(&layout)
                .build()
                .unwrap();
            let img = Arc::new(std::sync::Mutex::new(Vec::new()));
            let out = img.clone();
            w.spawn(move |ctx| async move {
                let mut heap: Vec<Vec<u8>> = (0..20).map(|i| vec![i as u8 + 1; 24]).collect();
                for (i, e) in heap.iter().enumerate() {
                    ctx.put_local(mem.entry(i, 24), e);
                }
                let mut cursor = Cursor::new(&plan, 1, 0);
                one_batch(&ctx, &plan, &mem, &mut heap, &mut cursor)
                    .await
                    .unwrap();
                // Read it back with SP's read path: the entries come out
                // as they went in.
                let back = Plan {
                    method: Method::Sp,
                    direction: Direction::Read,
                    ..plan
                };
                let mut got: Vec<Vec<u8>> = vec![vec![0; 24]; 20];
                one_batch(&ctx, &back, &mem, &mut got, &mut Cursor::new(&plan, 1, 0))
                    .await
                    .unwrap();
                *out.lock().unwrap() = got.concat();
            });
            w.run();
            let got = img.lock().unwrap().clone();
            let want: Vec<u8> = (0..20u8).flat_map(|i| vec![i + 1; 24]).collect();
            assert_eq!(got, want, "{method:?}");
            images.push(got);
        }
        f.free_chunk(base).unwrap();
    }

    #[test]
    fn runs_each_method_and_direction_with_the_local_baseline() {
        let f = fabric();
        for method in Method::ALL {
            for dir in [Direction::Write, Direction::Read] {
                let cfg = point(method, dir, 4);
                let r = run(&f, &cfg, method == Method::Sp, Duration::from_millis(5)).unwrap();
                assert!(r.entries > 0 && r.entries.is_multiple_of(4), "{r:?}");
                assert_eq!(
                    r.requests_per_batch,
                    if method == Method::Doorbell { 4 } else { 1 }
                );
                assert!(
                    r.doorbells * 4 >= r.entries,
                    "one doorbell per batch: {r:?}"
                );
                assert_eq!(r.local.is_some(), method == Method::Sp);
                if let Some(l) = &r.local {
                    assert!(l.entries > 0 && l.entries.is_multiple_of(4), "{l:?}");
                }
            }
        }
        let bad = VectorIoConfig {
            region_size: 64,
            ..point(Method::Sgl, Direction::Write, 4)
        };
        assert!(run(&f, &bad, false, Duration::ZERO)
            .unwrap_err()
            .to_string()
            .contains("--region-size"));
    }

    #[test]
    fn sequential_offsets_advance_and_wrap() {
        let cfg = VectorIoConfig {
            region_size: 1024,
            pattern: Pattern::Seq,
            ..point(Method::Sp, Direction::Write, 4)
        };
        let plan = Plan::new(&cfg, RemoteRef::new(GlobalAddr::new(0, 0), 0), 16);
        let mut c = Cursor::new(&plan, 1, 0);
        let offs: Vec<u64> = (0..12).map(|_| c.offset()).collect();
        // 96-byte batches advance two lines; 15 offsets fit.
        assert_eq!(&offs[..3], &[0, 128, 256]);
        assert!(offs.iter().all(|&o| o + 96 <= 1024), "{offs:?}");
        assert_eq!(offs[8], 0, "wraps: {offs:?}");
    }

    #[test]
    fn the_simulator_runs_a_point_deterministically() {
        let shape = SimShape {
            profile: dmkit_sim::Profile::builtin("cx3-40g").unwrap(),
            page_size: 4096,
            warmup: Duration::from_micros(50),
        };
        let cfg = VectorIoConfig {
            duration: Duration::from_micros(300),
            ..point(Method::Sgl, Direction::Write, 8)
        };
        let a = run_sim(&cfg, &shape).unwrap();
        let b = run_sim(&cfg, &shape).unwrap();
        assert!(a.entries > 0);
        assert_eq!((a.entries, a.doorbells), (b.entries, b.doorbells));
    }
}
