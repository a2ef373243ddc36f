//! The IO-consolidation benchmark (RDMA memory-semantics study, §III-C,
//! Fig. 8): `size`-byte writes at random `size`-aligned offsets of a
//! thread's hot, `region`-aligned remote regions (32 B into 1 KiB in the
//! study), either each its own WRITE (`theta: None`, the native path) or
//! through the runtime's write-back buffer
//! ([`dmkit_runtime::consolidate::WriteBuffer`]) that writes a region back
//! once per `θ` modifications. Each thread owns its regions (the buffer's
//! single-writer hint); throughput counts writes.
//!
//! The same task runs on OS threads over shm or verbs ([`run`]) and on
//! virtual threads of the simulator ([`run_sim`]). Every buffer is flushed
//! at the end and the remote image checked against a replay of the
//! thread's writes (its seed redrawn), so a run that lost or misplaced a
//! write fails; the timed loop keeps no copy.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use dmkit_fabric::{Fabric, FabricError, RemoteRef};
use dmkit_runtime::consolidate::{ConsolidationConfig, WriteBuffer};
use dmkit_runtime::{Ctx, Local, LocalLayout, Nanos, Worker};
use serde::Serialize;

use crate::harness;
use crate::micro::BenchError;
use crate::rng::Rng;
use crate::vector_io::{outcome, raw_runtime};

/// One measured point.
#[derive(Debug, Clone, PartialEq)]
pub struct ConsolidationPoint {
    /// θ (`None`: every write is its own WRITE).
    pub theta: Option<u32>,
    /// Bytes per write.
    pub size: usize,
    /// Bytes per hot region (aligned to it).
    pub region: usize,
    /// Hot regions per thread.
    pub regions: usize,
    /// Threads, all machines together.
    pub threads: usize,
    /// Measured window (wall or virtual time).
    pub duration: Duration,
    /// Longest a write stays buffered.
    pub lease: Duration,
    /// Seed of the addresses (and of the simulator).
    pub seed: u64,
}

impl ConsolidationPoint {
    /// Checks the shape.
    pub fn check(&self) -> Result<(), String> {
        if self.size == 0 || self.region == 0 || self.regions == 0 || self.threads == 0 {
            return Err("--size, --region, --regions and --threads must be at least 1".into());
        }
        if !self.region.is_multiple_of(self.size) || self.region > (1 << 20) {
            return Err(format!(
                "--region {} must be a multiple of --size {} and at most 1 MiB",
                self.region, self.size
            ));
        }
        if self.theta == Some(0) {
            return Err("θ must be at least 1".into());
        }
        Ok(())
    }

    fn area(&self) -> u64 {
        (self.region * self.regions) as u64
    }
}

/// What a point measured.
#[derive(Debug, Clone, Default, Serialize)]
pub struct ConsolidationResult {
    /// The backend it ran on ("shm", "sim", "verbs").
    pub backend: String,
    /// θ, or 0 for the native path.
    pub theta: u32,
    /// Bytes per write (entry).
    pub size: usize,
    /// Bytes per hot region.
    pub region: usize,
    /// Hot regions per thread.
    pub regions: usize,
    /// Threads, all machines together.
    pub threads: usize,
    /// Writes completed in the window.
    pub writes: u64,
    /// Length of the measured window in seconds.
    pub seconds: f64,
    /// Million writes per second, all threads.
    pub mops: f64,
    /// WRITE requests posted per application write (whole run).
    pub wrs_per_write: f64,
    /// Bytes written to remote memory per application write (whole run).
    pub bytes_per_write: f64,
    /// The remote image equalled each thread's own copy at the end.
    pub verified: bool,
    /// Ctrl-C ended the window early: the figures are of the shortened
    /// window.
    pub interrupted: bool,
    /// Set when more threads ran than the process has cores.
    pub oversubscribed: Option<String>,
}

/// What one thread did: its writes in the window, in the whole run, the
/// WRITEs and bytes it posted, and whether its image checked out.
#[derive(Debug, Default, Clone, Copy)]
struct Tally {
    total: u64,
    wrs: u64,
    bytes: u64,
    verified: bool,
}

/// Writes between two looks at the clock on OS threads. The harness's
/// discipline is to read the clock when an operation completes; here an
/// operation (a buffered write: a 32-byte copy and a few counters) costs
/// less than a CLOCK_MONOTONIC read (60–80 ns on a KVM guest, where even
/// `rdtsc` takes 35 ns), and reading it twice per write — once to count
/// it, once to decide whether to go on — was 70 % of a θ = 16 run on shm
/// (perf) and half of a native one: it measured the clock, not the
/// writes. So a thread reads it once per `WALL_STRIDE` writes and counts
/// them at that instant, the same discipline at a coarser grain: the
/// window's edges move by at most 32 writes (microseconds) in a
/// window of a second, and both paths, native and consolidated, pay the
/// same per write. The simulator keeps a stride of 1 (its clock is free
/// and its figures stay bit-identical).
const WALL_STRIDE: u64 = 32;

/// Write number `stamp`'s contents: every byte its low byte, then its
/// first (up to) 8 bytes the whole number, little-endian.
#[inline(always)]
fn stamp_into(data: &mut [u8], stamp: u64) {
    data.fill(stamp as u8);
    let n = data.len().min(8);
    data[..n].copy_from_slice(&stamp.to_le_bytes()[..n]);
}

/// Where the writes go: a region and a `size`-aligned byte offset in it,
/// the next two draws of the thread's generator. The writer and the check
/// ([`expected_image`]) both draw through this, so the check replays
/// exactly the stream the writer wrote.
#[derive(Debug, Clone, Copy)]
struct Targets {
    regions: u64,
    /// Write-sized slots per region (divided once, not per write).
    slots: u64,
    size: usize,
}

impl Targets {
    fn of(p: &ConsolidationPoint) -> Self {
        Self {
            regions: p.regions as u64,
            slots: (p.region / p.size) as u64,
            size: p.size,
        }
    }

    #[inline(always)]
    fn next(&self, rng: &mut Rng) -> (usize, usize) {
        let r = rng.below(self.regions) as usize;
        let at = rng.below(self.slots) as usize * self.size;
        (r, at)
    }
}

/// What a thread's regions must hold after its first `writes` writes from
/// `seed`: the writes replayed in order, each slot ending with the last
/// write that went to it (zero if none did). Built after the run, so the
/// timed loop keeps no copy of its own (native and consolidated alike); a
/// write lost or put in the wrong place still makes the remote image
/// differ. The replay notes only each slot's last write number (a table
/// of `regions × region / size` words) and lays the bytes out once.
fn expected_image(p: &ConsolidationPoint, seed: u64, writes: u64) -> Vec<u8> {
    let mut rng = Rng::new(seed);
    let targets = Targets::of(p);
    let slots = targets.slots as usize;
    let mut last = vec![0u64; p.regions * slots];
    for stamp in 1..=writes {
        let (r, at) = targets.next(&mut rng);
        last[r * slots + at / p.size] = stamp;
    }
    let mut image = vec![0u8; p.area() as usize];
    for (slot, &stamp) in image.chunks_exact_mut(p.size).zip(&last) {
        if stamp > 0 {
            stamp_into(slot, stamp);
        }
    }
    image
}

/// The task: random writes into its regions, `tick` called before the
/// first write and after every `stride`-th with a clock reading and the
/// writes done since the last call (it counts them, and returns whether to
/// go on), then a flush of every buffer and a check of the remote image.
async fn writer(
    ctx: Ctx,
    p: ConsolidationPoint,
    area: RemoteRef,
    mem: Mem,
    seed: u64,
    stride: u64,
    tick: impl FnMut(Nanos, u64) -> bool,
) -> Result<Tally, FabricError> {
    let scratch = mem.scratch;
    let cfg = ConsolidationConfig {
        theta: p.theta.unwrap_or(1),
        lease: p.lease.as_nanos() as u64,
    };
    // The native path has no buffers (and no local memory for them).
    let buffered = if p.theta.is_some() { p.regions } else { 0 };
    let mut bufs: Vec<WriteBuffer> = (0..buffered)
        .map(|i| {
            let buf = mem.buffers.piece(i, p.region);
            WriteBuffer::hint(area.add((i * p.region) as u64), buf, cfg)
                .expect("regions are aligned to their size")
        })
        .collect();
    let mut t = if p.size == 32 {
        let data = [0u8; 32];
        write_loop(&ctx, &p, area, scratch, &mut bufs, seed, stride, tick, data).await?
    } else {
        let data = vec![0u8; p.size];
        write_loop(&ctx, &p, area, scratch, &mut bufs, seed, stride, tick, data).await?
    };
    for b in &mut bufs {
        b.flush(&ctx).await?;
        let s = b.stats();
        t.wrs += s.flushes;
        t.bytes += s.bytes_flushed;
    }
    t.verified = check_image(&ctx, &p, area, scratch, seed, t.total).await?;
    Ok(t)
}

/// Whether the thread's remote regions hold exactly what its first
/// `writes` writes from `seed` leave there ([`expected_image`]), read back
/// region by region through `scratch`.
async fn check_image(
    ctx: &Ctx,
    p: &ConsolidationPoint,
    area: RemoteRef,
    scratch: Local,
    seed: u64,
    writes: u64,
) -> Result<bool, FabricError> {
    let expected = expected_image(p, seed, writes);
    let mut ok = true;
    for (i, chunk) in expected.chunks(p.region).enumerate() {
        let s = scratch.prefix(p.region);
        ctx.read_sync(area.add((i * p.region) as u64), s).await?;
        ok &= ctx.local_vec(s) == chunk;
    }
    Ok(ok)
}

/// The timed loop of [`writer`], over one payload type: the contents of a
/// write, stamped with its number (distinct per write, what the final
/// check compares). A `[u8; 32]` keeps the study's 32-byte writes in an
/// array, so building one and copying it into a buffer are fixed-size
/// moves rather than calls to `memset` and `memmove` with a run-time
/// length (perf: a third of a θ = 16 run on shm was those calls); a
/// `Vec<u8>` serves every other `--size`. The loop reads
/// the clock only for `tick`, and hands that reading to the buffers as
/// the start of a new lease ([`WriteBuffer::try_write_at`]).
#[allow(clippy::too_many_arguments)]
async fn write_loop<P: AsRef<[u8]> + AsMut<[u8]>>(
    ctx: &Ctx,
    p: &ConsolidationPoint,
    area: RemoteRef,
    scratch: Local,
    bufs: &mut [WriteBuffer],
    seed: u64,
    stride: u64,
    mut tick: impl FnMut(Nanos, u64) -> bool,
    mut data: P,
) -> Result<Tally, FabricError> {
    let mut rng = Rng::new(seed);
    let targets = Targets::of(p);
    let mut t = Tally::default();
    let stride = stride.max(1);
    let mut since = 0;
    let mut now = ctx.now();
    let mut go = tick(now, 0);
    while go {
        let (r, at) = targets.next(&mut rng);
        stamp_into(data.as_mut(), t.total + 1);
        let data = data.as_ref();
        match p.theta {
            None => {
                ctx.put_local(scratch, data);
                ctx.write_sync(area.add((r * p.region + at) as u64), scratch.prefix(p.size))
                    .await?;
                t.wrs += 1;
                t.bytes += p.size as u64;
            }
            Some(_) => match bufs[r].try_write_at(ctx, now, at, data) {
                Some(false) => {}
                Some(true) => {
                    bufs[r].flush(ctx).await?;
                }
                None => {
                    bufs[r].write(ctx, at, data).await?;
                }
            },
        }
        t.total += 1;
        since += 1;
        if since == stride {
            now = ctx.now();
            go = tick(now, since);
            since = 0;
        }
    }
    Ok(t)
}

/// A writer's task-local memory.
#[derive(Debug, Clone, Copy)]
struct Mem {
    /// A native write's source and the final check's landing zone.
    scratch: Local,
    /// The write-back buffers, one region's length each (consolidated
    /// runs only; empty for the native path).
    buffers: Local,
}

fn layout(p: &ConsolidationPoint) -> (LocalLayout, Mem) {
    let mut l = LocalLayout::new();
    let scratch = l.region("consolidation scratch", p.region.max(p.size));
    let buffers = match p.theta {
        Some(_) => l.region("write-back buffers", p.area() as usize),
        None => Local::default(),
    };
    (l, Mem { scratch, buffers })
}

fn seed_of(p: &ConsolidationPoint, t: usize) -> u64 {
    p.seed ^ (t as u64 + 1).wrapping_mul(0x9E37_79B9_7F4A_7C15)
}

fn result_of(
    backend: &str,
    p: &ConsolidationPoint,
    writes: u64,
    seconds: f64,
    tallies: &[Tally],
) -> ConsolidationResult {
    let total: u64 = tallies.iter().map(|t| t.total).sum::<u64>().max(1);
    let mops = harness::rate(writes as f64, seconds) / 1e6;
    ConsolidationResult {
        backend: backend.into(),
        theta: p.theta.unwrap_or(0),
        size: p.size,
        region: p.region,
        regions: p.regions,
        threads: p.threads,
        writes,
        seconds,
        mops,
        wrs_per_write: tallies.iter().map(|t| t.wrs).sum::<u64>() as f64 / total as f64,
        bytes_per_write: tallies.iter().map(|t| t.bytes).sum::<u64>() as f64 / total as f64,
        verified: !tallies.is_empty() && tallies.iter().all(|t| t.verified),
        interrupted: false,
        oversubscribed: None,
    }
}

/// Runs one point on `fabric` (shm or verbs): one OS thread per
/// `p.threads`, each a worker with one task writing into its own regions.
pub fn run(
    fabric: &dyn Fabric,
    p: &ConsolidationPoint,
    warmup: Duration,
) -> Result<ConsolidationResult, BenchError> {
    p.check().map_err(BenchError::Config)?;
    let node = *fabric
        .nodes()
        .first()
        .expect("a fabric has at least one node");
    let per = p.area();
    let (base, _, rkey) = fabric.alloc_chunk(node, per * p.threads as u64 + 4096, false)?;
    // Regions aligned to their size.
    let align = (p.region.next_power_of_two().min(4096)) as u64;
    let start = base.offset().next_multiple_of(align) - base.offset();
    let area0 = RemoteRef::new(base, rkey).add(start);
    let r = measure(fabric, p, area0, warmup);
    let freed = fabric.free_chunk(base);
    let r = r?;
    freed?;
    Ok(r)
}

fn measure(
    fabric: &dyn Fabric,
    p: &ConsolidationPoint,
    area0: RemoteRef,
    warmup: Duration,
) -> Result<ConsolidationResult, BenchError> {
    let (l, mem) = layout(p);
    // One global window (crate::harness): every thread sets up, meets the
    // others at the start barrier, and counts the writes that complete
    // inside the window opened `warmup` after it.
    let (timed, outcomes) = harness::run_threads(
        p.threads,
        warmup,
        p.duration,
        |t, window, arrival| -> Result<(u64, Tally), BenchError> {
            let mut w = Worker::builder(fabric)
                .config(raw_runtime(p.seed))
                .id(t)
                .local(&l)
                .build()?;
            let out: Arc<std::sync::Mutex<Option<Result<Tally, FabricError>>>> = Arc::default();
            let counted = Arc::new(AtomicU64::new(0));
            let (out2, counted2) = (out.clone(), counted.clone());
            let area = area0.add(t as u64 * p.area());
            let (pp, seed) = (p.clone(), seed_of(p, t));
            let window = window.clone();
            w.spawn(move |ctx| async move {
                let r = writer(ctx, pp, area, mem, seed, WALL_STRIDE, move |now, n| {
                    if n > 0 && window.counts(now) {
                        counted2.fetch_add(n, Ordering::Relaxed);
                    }
                    !window.done(now)
                })
                .await;
                *out2.lock().unwrap_or_else(|e| e.into_inner()) = Some(r);
            });
            arrival.arrive();
            w.run();
            Ok((counted.load(Ordering::Relaxed), outcome(&out)?))
        },
        |_| {},
    );
    let (mut writes, mut tallies) = (0, Vec::with_capacity(p.threads));
    for o in outcomes {
        let (n, t) = o?;
        writes += n;
        tallies.push(t);
    }
    let mut r = result_of(fabric.backend(), p, writes, timed.seconds, &tallies);
    r.interrupted = timed.interrupted;
    r.oversubscribed = harness::oversubscribed(p.threads);
    Ok(r)
}

/// Runs one point on the simulator: `p.threads` virtual threads on one
/// compute machine against one memory node, `p.duration` of virtual time
/// measured after `warmup`.
pub fn run_sim(
    p: &ConsolidationPoint,
    profile: &dmkit_sim::Profile,
    warmup: Duration,
) -> Result<ConsolidationResult, BenchError> {
    use dmkit_sim::{Sim, SimConfig};
    use std::cell::{Cell, RefCell};
    use std::rc::Rc;
    p.check().map_err(BenchError::Config)?;
    let area_bytes = p.area() * p.threads as u64 + 4096;
    let mut sim = Sim::new(SimConfig {
        profile: profile.clone(),
        compute_machines: 1,
        memory_nodes: 1,
        memory_bytes: area_bytes + (8 << 20),
        page_size: 4096,
        seed: p.seed,
        ..SimConfig::default()
    })?;
    let fabric = sim.dyn_fabric();
    let (base, _, rkey) = fabric.alloc_chunk(0, area_bytes, true)?;
    let align = (p.region.next_power_of_two().min(4096)) as u64;
    let start = base.offset().next_multiple_of(align) - base.offset();
    let area0 = RemoteRef::new(base, rkey).add(start);
    let (l, mem) = layout(p);
    let warm = warmup.as_nanos() as u64;
    let end = warm + p.duration.as_nanos() as u64;
    let window = Rc::new(Cell::new(0u64));
    let tallies: Rc<RefCell<Vec<Result<Tally, FabricError>>>> = Rc::default();
    for t in 0..p.threads {
        let th = sim.add_worker(0, |f: &dyn Fabric, clock| -> Result<Worker, BenchError> {
            Ok(Worker::builder(f)
                .clock(clock)
                .config(raw_runtime(p.seed))
                .id(t)
                .local(&l)
                .build()?)
        })?;
        let (window, tallies) = (window.clone(), tallies.clone());
        let (pp, seed, area) = (p.clone(), seed_of(p, t), area0.add(t as u64 * p.area()));
        sim.worker_mut(th).spawn(move |ctx| async move {
            // Stride 1: each write counted at its own completion, as before.
            let r = writer(ctx, pp, area, mem, seed, 1, move |now, n| {
                if n > 0 && now >= warm && now < end {
                    window.set(window.get() + n);
                }
                now < end
            })
            .await;
            tallies.borrow_mut().push(r);
        });
    }
    sim.run();
    let tallies = std::mem::take(&mut *tallies.borrow_mut())
        .into_iter()
        .collect::<Result<Vec<_>, _>>()?;
    if tallies.len() != p.threads {
        return Err(BenchError::Config(
            "a simulated writer did not finish".into(),
        ));
    }
    Ok(result_of(
        "sim",
        p,
        window.get(),
        p.duration.as_secs_f64(),
        &tallies,
    ))
}

#[cfg(test)]
mod tests {
    use super::*;
    use dmkit_fabric::shm::{ShmConfig, ShmFabric};
    use dmkit_fabric::ControlPlane;
    use std::cell::RefCell;
    use std::rc::Rc;

    fn point(theta: Option<u32>) -> ConsolidationPoint {
        ConsolidationPoint {
            theta,
            size: 32,
            region: 1024,
            regions: 4,
            threads: 2,
            duration: Duration::from_millis(60),
            lease: Duration::from_millis(100),
            seed: 7,
        }
    }

    /// An embedded 4 MiB shm node.
    fn fabric() -> ShmFabric {
        ShmFabric::one_node(ShmConfig::default(), 4 << 20).unwrap()
    }

    #[test]
    fn native_and_consolidated_runs_verify_and_consolidate() {
        let f = fabric();
        // A 300 ms window: under a loaded CI run a 60 ms one once counted
        // no consolidated write at all (both threads' clock looks, every
        // `WALL_STRIDE` writes, fell outside it; not reproduced since).
        let point = |theta| ConsolidationPoint {
            duration: Duration::from_millis(300),
            ..point(theta)
        };
        let native = run(&f, &point(None), Duration::from_millis(5)).unwrap();
        assert!(native.verified && native.writes > 0, "{native:?}");
        assert!((native.wrs_per_write - 1.0).abs() < 1e-9, "{native:?}");
        let c = run(&f, &point(Some(16)), Duration::from_millis(5)).unwrap();
        assert!(c.verified && c.writes > 0, "{c:?}");
        assert!(
            c.wrs_per_write < 0.1,
            "θ = 16: about one WRITE per 16 writes: {c:?}"
        );
    }

    /// The check replays the writer's stream: it passes on what the
    /// writer left, and fails when one write is lost (its slot reverted),
    /// misplaced (its bytes also in a slot it never went to), or when it
    /// replays one write too few — for the native and the consolidated
    /// path.
    #[test]
    fn the_replayed_check_catches_a_lost_or_misplaced_write() {
        let f = fabric();
        for theta in [None, Some(16)] {
            let p = ConsolidationPoint {
                threads: 1,
                ..point(theta)
            };
            let (base, _, rkey) = f.alloc_chunk(0, p.area() + 4096, false).unwrap();
            let start = base.offset().next_multiple_of(1024) - base.offset();
            let area = RemoteRef::new(base, rkey).add(start);
            let (l, mem) = layout(&p);
            let mut w = Worker::builder(&f)
                .config(raw_runtime(p.seed))
                .local(&l)
                .build()
                .unwrap();
            let seen: Rc<RefCell<Vec<bool>>> = Rc::default();
            let seen2 = seen.clone();
            w.spawn(move |ctx| async move {
                // 1000 writes (stride 1: the hook sees each one).
                let mut n = 0;
                let t = writer(ctx.clone(), p.clone(), area, mem, 3, 1, |_, k| {
                    n += k;
                    n < 1000
                })
                .await
                .unwrap();
                let (s, seed) = (mem.scratch, 3);
                let check = |writes| check_image(&ctx, &p, area, s, seed, writes);
                let mut out = vec![t.total == 1000, t.verified, check(1000).await.unwrap()];
                out.push(check(999).await.unwrap());
                // Lose the last write: its slot as the first 999 left it.
                let before = expected_image(&p, seed, 999);
                let mut rng = Rng::new(seed);
                let targets = Targets::of(&p);
                let last = (0..1000).map(|_| targets.next(&mut rng)).last().unwrap();
                let at = last.0 * p.region + last.1;
                let slot = area.add(at as u64);
                ctx.put_local(s, &before[at..at + p.size]);
                ctx.write_sync(slot, s.prefix(p.size)).await.unwrap();
                out.push(check(1000).await.unwrap());
                // Misplace it: right slot, and also the next one over.
                let after = expected_image(&p, seed, 1000);
                ctx.put_local(s, &after[at..at + p.size]);
                ctx.write_sync(slot, s.prefix(p.size)).await.unwrap();
                out.push(check(1000).await.unwrap());
                let other = (at + p.size) % p.area() as usize;
                ctx.write_sync(area.add(other as u64), s.prefix(p.size))
                    .await
                    .unwrap();
                out.push(check(1000).await.unwrap());
                *seen2.borrow_mut() = out;
            });
            w.run();
            assert_eq!(
                *seen.borrow(),
                [true, true, true, false, false, true, false],
                "θ = {theta:?}: (1000 writes, verified, check, check of 999, \
                 lost, restored, misplaced)"
            );
            drop(w);
            f.free_chunk(base).unwrap();
        }
    }

    #[test]
    fn the_simulated_point_verifies_and_is_deterministic() {
        let prof = dmkit_sim::Profile::builtin("cx3-40g").unwrap();
        let p = ConsolidationPoint {
            duration: Duration::from_micros(400),
            ..point(Some(8))
        };
        let a = run_sim(&p, &prof, Duration::from_micros(50)).unwrap();
        let b = run_sim(&p, &prof, Duration::from_micros(50)).unwrap();
        assert!(a.verified && a.writes > 0, "{a:?}");
        assert_eq!(a.writes, b.writes);
        let n = run_sim(
            &ConsolidationPoint { theta: None, ..p },
            &prof,
            Duration::from_micros(50),
        )
        .unwrap();
        assert!(
            n.verified && a.mops > n.mops,
            "consolidated {a:?} vs native {n:?}"
        );
    }
}
