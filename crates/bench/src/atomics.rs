//! The remote-atomics benchmark (RDMA memory-semantics study, §III-E,
//! Fig. 10): a spinlock (acquire, release) and a sequencer (fetch-and-add)
//! on one word, local (the CPU's atomics on process memory), remote (RDMA
//! CAS/FAA through the runtime) or RPC-based, with and without exponential
//! backoff, threads swept.
//!
//! - local: `compare_exchange` / `fetch_add` on an `AtomicU64` (the study's
//!   GCC `__sync` builtins);
//! - remote: CAS `0 → 1` until it succeeds, then a WRITE of 0 releases (the
//!   same queue pair orders it after the critical section); FAA for the
//!   sequencer;
//! - RPC: needs the RPC channel to memory-node workers, which this build
//!   does not have yet: [`AtomicsError::RpcNotBuilt`].
//!
//! Backoff: after a failed attempt, wait `min(t0 · 2^i, t_max)` (the
//! study's exponential backoff, after Anderson's spinlock study), `i`
//! failures so far; local waits spin, remote ones sleep on the runtime's
//! clock (other tasks run).

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use dmkit_fabric::{Fabric, FabricError, RemoteRef};
use dmkit_runtime::{Ctx, Local, Worker};
use serde::Serialize;

use crate::micro::{BenchError, Padded};
use crate::vector_io::raw_runtime;

/// The primitive.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Primitive {
    /// Acquire and release a spinlock.
    Lock,
    /// Take the next number.
    Sequencer,
}

impl std::str::FromStr for Primitive {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "lock" => Ok(Primitive::Lock),
            "sequencer" => Ok(Primitive::Sequencer),
            _ => Err(format!("{s:?}: expected lock or sequencer")),
        }
    }
}

/// Where the word lives and who changes it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Place {
    /// The CPU's atomics on this process's memory.
    Local,
    /// RDMA atomics on a memory node.
    Remote,
    /// A memory-node worker answering RPCs.
    Rpc,
}

impl std::str::FromStr for Place {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "local" => Ok(Place::Local),
            "remote" => Ok(Place::Remote),
            "rpc" => Ok(Place::Rpc),
            _ => Err(format!("{s:?}: expected local, remote or rpc")),
        }
    }
}

/// Why the benchmark could not run.
#[derive(Debug, thiserror::Error)]
pub enum AtomicsError {
    #[error(
        "the RPC-based {0:?} needs the RPC channel to memory-node workers, which this build does not have yet"
    )]
    /// The RPC-based series, whose channel is not in this build.
    RpcNotBuilt(Primitive),
    /// The run itself failed.
    #[error(transparent)]
    Bench(#[from] BenchError),
}

impl From<FabricError> for AtomicsError {
    fn from(e: FabricError) -> Self {
        AtomicsError::Bench(e.into())
    }
}

/// One point.
#[derive(Debug, Clone, PartialEq)]
pub struct AtomicsConfig {
    /// The primitive measured.
    pub primitive: Primitive,
    /// Where the primitive lives.
    pub place: Place,
    /// Whether failed attempts back off exponentially.
    pub backoff: bool,
    /// Threads, all machines together.
    pub threads: usize,
    /// Measured window (wall or virtual time).
    pub duration: Duration,
    /// First backoff delay (ns).
    pub backoff_min: u64,
    /// Longest backoff delay (ns).
    pub backoff_max: u64,
}

impl AtomicsConfig {
    /// A point with the default backoff (0.5 µs doubling up to 64 µs).
    pub fn new(primitive: Primitive, place: Place, backoff: bool, threads: usize) -> Self {
        Self {
            primitive,
            place,
            backoff,
            threads,
            duration: Duration::from_secs(1),
            backoff_min: 500,
            backoff_max: 64_000,
        }
    }

    fn delay(&self, failures: u32) -> u64 {
        (self.backoff_min << failures.min(20)).min(self.backoff_max)
    }
}

/// What a point measured.
#[derive(Debug, Clone, Default, Serialize)]
pub struct AtomicsResult {
    /// The backend it ran on ("shm", "sim", "verbs").
    pub backend: String,
    /// The primitive measured.
    pub primitive: String,
    /// Where the primitive lives.
    pub place: String,
    /// Whether failed attempts back off exponentially.
    pub backoff: bool,
    /// Threads, all machines together.
    pub threads: usize,
    /// Operations (lock: acquire + release; sequencer: numbers) in the window.
    pub ops: u64,
    /// Length of the measured window in seconds.
    pub seconds: f64,
    /// Million operations per second, all threads.
    pub mops: f64,
    /// Failed attempts per operation (lock), whole run.
    pub failures_per_op: f64,
    /// Mutual exclusion held / every number unique (whole run).
    pub verified: bool,
}

fn result_of(
    backend: &str,
    c: &AtomicsConfig,
    ops: u64,
    seconds: f64,
    failures: u64,
    total: u64,
    verified: bool,
) -> AtomicsResult {
    AtomicsResult {
        backend: backend.into(),
        primitive: format!("{:?}", c.primitive).to_lowercase(),
        place: format!("{:?}", c.place).to_lowercase(),
        backoff: c.backoff,
        threads: c.threads,
        ops,
        seconds,
        mops: ops as f64 / seconds.max(1e-12) / 1e6,
        failures_per_op: failures as f64 / total.max(1) as f64,
        verified,
    }
}

/// Runs one point on the host (`local`) or on `fabric` (`remote`).
pub fn run(fabric: &dyn Fabric, c: &AtomicsConfig) -> Result<AtomicsResult, AtomicsError> {
    if c.threads == 0 {
        return Err(BenchError::Config("--threads must be at least 1".into()).into());
    }
    match c.place {
        Place::Rpc => Err(AtomicsError::RpcNotBuilt(c.primitive)),
        Place::Local => Ok(run_local(c)),
        Place::Remote => run_remote(fabric, c),
    }
}

/// The measured window: `sum()` reads the threads' counters; the run
/// ends at `duration` or when `stop` is set.
fn window(
    sum: impl Fn() -> u64,
    stop: &AtomicBool,
    started: &AtomicU64,
    threads: usize,
    duration: Duration,
) -> (u64, f64) {
    while started.load(Ordering::Acquire) < threads as u64 && !stop.load(Ordering::Relaxed) {
        std::thread::yield_now();
    }
    let before = sum();
    let t0 = Instant::now();
    while !stop.load(Ordering::Relaxed) && t0.elapsed() < duration {
        std::thread::sleep(
            duration
                .saturating_sub(t0.elapsed())
                .min(Duration::from_millis(20)),
        );
    }
    let after = sum();
    let secs = t0.elapsed().as_secs_f64();
    stop.store(true, Ordering::Relaxed);
    (after.saturating_sub(before), secs)
}

fn spin_for(ns: u64) {
    let t = Instant::now();
    while (t.elapsed().as_nanos() as u64) < ns {
        std::hint::spin_loop();
    }
}

fn run_local(c: &AtomicsConfig) -> AtomicsResult {
    #[repr(align(128))]
    struct Word(AtomicU64);
    let word = Word(AtomicU64::new(0));
    let inside = AtomicU64::new(0);
    let broken = AtomicBool::new(false);
    let counters: Vec<Padded> = (0..c.threads).map(|_| Padded::default()).collect();
    let stop = AtomicBool::new(false);
    let started = AtomicU64::new(0);
    let (w, failures, total) = std::thread::scope(|s| {
        let hs: Vec<_> = (0..c.threads)
            .map(|t| {
                let (word, inside, broken, counter, stop, started) =
                    (&word, &inside, &broken, &counters[t], &stop, &started);
                s.spawn(move || {
                    started.fetch_add(1, Ordering::Release);
                    let (mut n, mut failed) = (0u64, 0u64);
                    while !stop.load(Ordering::Relaxed) {
                        match c.primitive {
                            Primitive::Sequencer => {
                                word.0.fetch_add(1, Ordering::AcqRel);
                            }
                            Primitive::Lock => {
                                let mut i = 0;
                                while word
                                    .0
                                    .compare_exchange(0, 1, Ordering::Acquire, Ordering::Relaxed)
                                    .is_err()
                                {
                                    failed += 1;
                                    if c.backoff {
                                        spin_for(c.delay(i));
                                        i += 1;
                                    }
                                }
                                if inside.fetch_add(1, Ordering::Relaxed) != 0 {
                                    broken.store(true, Ordering::Relaxed);
                                }
                                inside.fetch_sub(1, Ordering::Relaxed);
                                word.0.store(0, Ordering::Release);
                            }
                        }
                        n += 1;
                        counter.0.store(n, Ordering::Relaxed);
                    }
                    (n, failed)
                })
            })
            .collect();
        let w = window(
            || counters.iter().map(|c| c.0.load(Ordering::Relaxed)).sum(),
            &stop,
            &started,
            c.threads,
            c.duration,
        );
        let (mut total, mut failures) = (0, 0);
        for h in hs {
            let (n, f) = h.join().expect("atomics thread panicked");
            total += n;
            failures += f;
        }
        (w, failures, total)
    });
    let verified = match c.primitive {
        Primitive::Lock => !broken.load(Ordering::Relaxed),
        Primitive::Sequencer => word.0.load(Ordering::Relaxed) == total,
    };
    result_of("local", c, w.0, w.1, failures, total, verified)
}

/// One operation of the remote variant; returns the failed attempts.
async fn remote_op(
    ctx: &Ctx,
    c: &AtomicsConfig,
    word: RemoteRef,
    zero: Local,
) -> Result<u64, FabricError> {
    match c.primitive {
        Primitive::Sequencer => {
            ctx.faa_sync(word, 1).await?;
            Ok(0)
        }
        Primitive::Lock => {
            let mut failures = 0;
            while ctx.cas_sync(word, 0, 1).await? != 0 {
                if c.backoff {
                    ctx.sleep(c.delay(failures as u32)).await;
                }
                failures += 1;
            }
            // The critical section is empty; the release is one WRITE,
            // ordered after it by the queue pair.
            ctx.write_sync(word, zero).await?;
            Ok(failures)
        }
    }
}

/// A remote thread's operations and failed attempts, or its error.
type Outcome = Result<(u64, u64), FabricError>;

fn run_remote(fabric: &dyn Fabric, c: &AtomicsConfig) -> Result<AtomicsResult, AtomicsError> {
    let node = *fabric
        .nodes()
        .first()
        .expect("a fabric has at least one node");
    let (addr, _, rkey) = fabric.alloc_chunk(node, 4096, false)?;
    let word = RemoteRef::new(addr, rkey);
    let counters: Vec<Arc<Padded>> = (0..c.threads).map(|_| Arc::default()).collect();
    let stop = Arc::new(AtomicBool::new(false));
    let started = AtomicU64::new(0);
    let (w, outcomes) = std::thread::scope(|s| {
        let hs: Vec<_> = (0..c.threads)
            .map(|t| {
                let (counter, stop, started) = (counters[t].clone(), stop.clone(), &started);
                s.spawn(move || -> Result<(u64, u64), FabricError> {
                    let mut wk = Worker::builder(fabric)
                        .config(raw_runtime(1))
                        .id(t)
                        .local_bytes(64)
                        .build()?;
                    let out: Arc<std::sync::Mutex<Option<Outcome>>> = Arc::default();
                    let (out2, c2, stop2) = (out.clone(), c.clone(), stop.clone());
                    wk.spawn(move |ctx| async move {
                        let zero = Local::at(0, 8);
                        ctx.set_local_u64(zero, 0);
                        let (mut n, mut failed) = (0u64, 0u64);
                        let r = loop {
                            if stop2.load(Ordering::Relaxed) {
                                break Ok((n, failed));
                            }
                            match remote_op(&ctx, &c2, word, zero).await {
                                Ok(f) => failed += f,
                                Err(e) => break Err(e),
                            }
                            n += 1;
                            counter.0.store(n, Ordering::Relaxed);
                        };
                        *out2.lock().unwrap_or_else(|p| p.into_inner()) = Some(r);
                    });
                    started.fetch_add(1, Ordering::Release);
                    wk.run();
                    let r = out
                        .lock()
                        .unwrap_or_else(|p| p.into_inner())
                        .take()
                        .expect("the task finished");
                    if r.is_err() {
                        stop.store(true, Ordering::Relaxed);
                    }
                    r
                })
            })
            .collect();
        let w = window(
            || counters.iter().map(|c| c.0.load(Ordering::Relaxed)).sum(),
            &stop,
            &started,
            c.threads,
            c.duration,
        );
        let outcomes: Vec<_> = hs
            .into_iter()
            .map(|h| h.join().expect("atomics worker panicked"))
            .collect();
        (w, outcomes)
    });
    // The word is 0 again (every lock released), or counts every number.
    let mut q = dmkit_fabric::SyncQp::new(fabric, node, 64)?;
    let fin = u64::from_le_bytes(
        q.read(addr, rkey, 8)?
            .try_into()
            .expect("an 8-byte READ returns 8 bytes"),
    );
    fabric.free_chunk(addr)?;
    let (mut total, mut failures) = (0, 0);
    for o in outcomes {
        let (n, f) = o?;
        total += n;
        failures += f;
    }
    let verified = match c.primitive {
        Primitive::Lock => fin == 0,
        Primitive::Sequencer => fin == total,
    };
    Ok(result_of(
        fabric.backend(),
        c,
        w.0,
        w.1,
        failures,
        total,
        verified,
    ))
}

/// Runs one remote point on the simulator: `c.threads` virtual threads,
/// one per compute machine (the study sweeps client machines), against
/// one memory node, `c.duration` of virtual time after `warmup`.
pub fn run_sim(
    c: &AtomicsConfig,
    profile: &dmkit_sim::Profile,
    warmup: Duration,
    seed: u64,
) -> Result<AtomicsResult, AtomicsError> {
    use dmkit_sim::{Sim, SimConfig};
    use std::cell::Cell;
    use std::rc::Rc;
    match c.place {
        Place::Rpc => return Err(AtomicsError::RpcNotBuilt(c.primitive)),
        Place::Local => {
            return Err(BenchError::Config(
                "the simulator models RDMA atomics, not the CPU's: local atomics run on the host"
                    .into(),
            )
            .into())
        }
        Place::Remote => {}
    }
    let mut sim = Sim::new(SimConfig {
        profile: profile.clone(),
        compute_machines: c.threads,
        memory_nodes: 1,
        memory_bytes: 16 << 20,
        seed,
        ..SimConfig::default()
    })
    .map_err(BenchError::from)?;
    let f = sim.dyn_fabric();
    let (addr, _, rkey) = f.alloc_chunk(0, 4096, true)?;
    let word = RemoteRef::new(addr, rkey);
    let warm = warmup.as_nanos() as u64;
    let end = warm + c.duration.as_nanos() as u64;
    let ops = Rc::new(Cell::new(0u64));
    let totals = Rc::new(Cell::new((0u64, 0u64)));
    let failed = Rc::new(Cell::new(false));
    for t in 0..c.threads {
        let th = sim.add_worker(t, |f: &dyn Fabric, clock| -> Result<Worker, FabricError> {
            Worker::builder(f)
                .clock(clock)
                .config(raw_runtime(seed))
                .id(t)
                .local_bytes(64)
                .build()
        })?;
        let (ops, totals, failed, c2) = (ops.clone(), totals.clone(), failed.clone(), c.clone());
        sim.worker_mut(th).spawn(move |ctx| async move {
            let zero = Local::at(0, 8);
            ctx.set_local_u64(zero, 0);
            while ctx.now() < end {
                match remote_op(&ctx, &c2, word, zero).await {
                    Ok(fails) => {
                        let (n, f) = totals.get();
                        totals.set((n + 1, f + fails));
                    }
                    Err(_) => {
                        failed.set(true);
                        return;
                    }
                }
                let now = ctx.now();
                if now >= warm && now < end {
                    ops.set(ops.get() + 1);
                }
            }
        });
    }
    sim.run();
    if failed.get() {
        return Err(BenchError::Config("an atomic failed in the simulation".into()).into());
    }
    let mut q = dmkit_fabric::SyncQp::new(f.as_ref(), 0, 64)?;
    let fin = u64::from_le_bytes(q.read(addr, rkey, 8)?.try_into().expect("8 bytes"));
    let (total, failures) = totals.get();
    let verified = match c.primitive {
        Primitive::Lock => fin == 0,
        Primitive::Sequencer => fin == total,
    };
    Ok(result_of(
        "sim",
        c,
        ops.get(),
        c.duration.as_secs_f64(),
        failures,
        total,
        verified,
    ))
}

#[cfg(test)]
mod tests {
    use super::*;
    use dmkit_fabric::shm::{ShmConfig, ShmFabric};
    use dmkit_memnode::NodeConfig;

    #[test]
    fn every_place_and_primitive_verifies_and_rpc_says_it_is_not_built() {
        let f = ShmFabric::embedded(
            ShmConfig::default(),
            &[NodeConfig {
                size: 1 << 20,
                ..Default::default()
            }],
        )
        .unwrap();
        for p in [Primitive::Lock, Primitive::Sequencer] {
            for place in [Place::Local, Place::Remote] {
                for backoff in [false, true] {
                    // (Long enough that three spinning threads on a loaded
                    // two-core host all get scheduled within the window.)
                    let c = AtomicsConfig {
                        duration: Duration::from_millis(200),
                        ..AtomicsConfig::new(p, place, backoff, 3)
                    };
                    let r = run(&f, &c).unwrap();
                    assert!(r.verified && r.ops > 0, "{r:?}");
                }
            }
            let e = run(&f, &AtomicsConfig::new(p, Place::Rpc, false, 1)).unwrap_err();
            assert!(matches!(e, AtomicsError::RpcNotBuilt(_)), "{e}");
        }
    }

    #[test]
    fn the_simulated_lock_and_sequencer_verify() {
        let prof = dmkit_sim::Profile::builtin("cx3-56g").unwrap();
        for p in [Primitive::Lock, Primitive::Sequencer] {
            let c = AtomicsConfig {
                duration: Duration::from_micros(300),
                ..AtomicsConfig::new(p, Place::Remote, true, 4)
            };
            let r = run_sim(&c, &prof, Duration::from_micros(50), 1).unwrap();
            assert!(r.verified && r.ops > 0, "{r:?}");
        }
    }
}
