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
//! - RPC: the memory node's built-in atomics service
//!   ([`dmkit_runtime::rpc::Atomics`]) does the CPU atomic for the caller
//!   (the study's channel-semantic RPC lock and sequencer): a lock is
//!   `TryLock` calls until one answers 1, then an `Unlock` call; the
//!   sequencer one `FetchAdd` call. On shm it runs over the node's request
//!   rings, on verbs over SEND/RECV, on the simulator with the node's cores
//!   modelled.
//!
//! Verification: the sequencer's numbers (remote and RPC) must be exactly
//! the run's range, each once; the lock must be free at the end, and where
//! threads really run in parallel (local, shm) no two are ever inside it
//! together.
//!
//! Backoff: after a failed attempt, wait `min(t0 · 2^i, t_max)` (the
//! study's exponential backoff, after Anderson's spinlock study), `i`
//! failures so far; local waits spin, remote ones sleep on the runtime's
//! clock (other tasks run).

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use dmkit_fabric::{Fabric, FabricError, NodeId, RemoteRef};
use dmkit_runtime::rpc::{Atomics, AtomicsRequest, CallError};
use dmkit_runtime::{Ctx, Local, Worker};
use serde::Serialize;

use crate::harness;
use crate::micro::BenchError;
use crate::vector_io::{outcome, raw_runtime};

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
    /// The RPC-based series on a backend whose memory nodes run no RPC
    /// workers.
    #[error("the RPC-based {0:?} needs RPC workers on the memory node, and this backend has none")]
    NoRpcWorkers(Primitive),
    /// The run itself failed.
    #[error(transparent)]
    Bench(#[from] BenchError),
}

/// Why one operation failed.
#[derive(Debug, thiserror::Error)]
enum OpError {
    #[error(transparent)]
    Fabric(#[from] FabricError),
    #[error("RPC atomics: {0}")]
    Call(#[from] CallError),
}

impl From<OpError> for AtomicsError {
    fn from(e: OpError) -> Self {
        match e {
            OpError::Fabric(e) => e.into(),
            OpError::Call(e) => AtomicsError::Bench(BenchError::Run(format!("RPC atomics: {e}"))),
        }
    }
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
    /// Ctrl-C ended the window early: the figures are of the shortened
    /// window.
    pub interrupted: bool,
    /// Set when more threads ran than the process has cores (shm, verbs).
    pub oversubscribed: Option<String>,
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
        mops: harness::rate(ops as f64, seconds) / 1e6,
        failures_per_op: failures as f64 / total.max(1) as f64,
        verified,
        interrupted: false,
        oversubscribed: None,
    }
}

/// Runs one point on the host (`local`) or on `fabric` (`remote`).
/// Both measure in one global window opened `warmup` after the start
/// barrier ([`crate::harness`]).
pub fn run(
    fabric: &dyn Fabric,
    c: &AtomicsConfig,
    warmup: Duration,
) -> Result<AtomicsResult, AtomicsError> {
    if c.threads == 0 {
        return Err(BenchError::Config("--threads must be at least 1".into()).into());
    }
    match c.place {
        Place::Rpc if fabric.caps().rpc_workers == 0 => {
            Err(AtomicsError::NoRpcWorkers(c.primitive))
        }
        Place::Local => Ok(run_local(c, warmup)),
        Place::Remote | Place::Rpc => run_remote(fabric, c, warmup),
    }
}

fn spin_for(ns: u64) {
    let t = Instant::now();
    while (t.elapsed().as_nanos() as u64) < ns {
        std::hint::spin_loop();
    }
}

/// Local operations read the clock once per this many (a clock reading
/// costs as much as an uncontended atomic): the window's edges blur by at
/// most this many operations per thread.
const LOCAL_CLOCK_EVERY: u64 = 64;

fn run_local(c: &AtomicsConfig, warmup: Duration) -> AtomicsResult {
    #[repr(align(128))]
    struct Word(AtomicU64);
    let word = Word(AtomicU64::new(0));
    let inside = AtomicU64::new(0);
    let broken = AtomicBool::new(false);
    let (timed, outcomes) = harness::run_threads(
        c.threads,
        warmup,
        c.duration,
        |_, window, arrival| -> Result<(u64, u64, u64), std::convert::Infallible> {
            let (mut n, mut counted, mut failed) = (0u64, 0u64, 0u64);
            arrival.arrive();
            loop {
                if n % LOCAL_CLOCK_EVERY == 0 {
                    let t = harness::now();
                    if window.done(t) {
                        break;
                    }
                    if n > 0 && window.counts(t) {
                        counted += LOCAL_CLOCK_EVERY;
                    }
                }
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
            }
            Ok((counted, n, failed))
        },
        |_| {},
    );
    let (mut ops, mut total, mut failures) = (0, 0, 0);
    for o in outcomes {
        let Ok((k, n, f)) = o;
        ops += k;
        total += n;
        failures += f;
    }
    let verified = match c.primitive {
        Primitive::Lock => !broken.load(Ordering::Relaxed),
        Primitive::Sequencer => word.0.load(Ordering::Relaxed) == total,
    };
    let mut r = result_of("local", c, ops, timed.seconds, failures, total, verified);
    r.interrupted = timed.interrupted;
    r.oversubscribed = harness::oversubscribed(c.threads);
    r
}

/// The lock word and counter slot the RPC variant uses.
const RPC_SLOT: u32 = 0;

/// Where a remote or RPC operation goes.
#[derive(Debug, Clone, Copy)]
struct Target {
    node: NodeId,
    word: RemoteRef,
}

/// What one operation did: its failed attempts, and the number it drew
/// (sequencer).
#[derive(Debug, Clone, Copy, Default)]
struct Done {
    failures: u64,
    number: Option<u64>,
}

/// One operation of the remote or RPC variant. `inside` counts the tasks
/// in the critical section (a second one there breaks mutual exclusion).
async fn remote_op(
    ctx: &Ctx,
    c: &AtomicsConfig,
    t: Target,
    zero: Local,
    inside: &AtomicU64,
    broken: &AtomicBool,
) -> Result<Done, OpError> {
    let rpc = c.place == Place::Rpc;
    match c.primitive {
        Primitive::Sequencer => {
            let n = if rpc {
                let req = AtomicsRequest::FetchAdd {
                    slot: RPC_SLOT,
                    delta: 1,
                };
                ctx.call_typed::<Atomics>(t.node, &req).await?
            } else {
                ctx.faa_sync(t.word, 1).await?
            };
            Ok(Done {
                failures: 0,
                number: Some(n),
            })
        }
        Primitive::Lock => {
            let mut failures = 0;
            loop {
                let got = if rpc {
                    let req = AtomicsRequest::TryLock { slot: RPC_SLOT };
                    ctx.call_typed::<Atomics>(t.node, &req).await? == 1
                } else {
                    ctx.cas_sync(t.word, 0, 1).await? == 0
                };
                if got {
                    break;
                }
                if c.backoff {
                    ctx.sleep(c.delay(failures as u32)).await;
                }
                failures += 1;
            }
            // The critical section is empty but for the exclusion check.
            if inside.fetch_add(1, Ordering::Relaxed) != 0 {
                broken.store(true, Ordering::Relaxed);
            }
            inside.fetch_sub(1, Ordering::Relaxed);
            if rpc {
                let req = AtomicsRequest::Unlock { slot: RPC_SLOT };
                ctx.call_typed::<Atomics>(t.node, &req).await?;
            } else {
                // The release is one WRITE, ordered after the critical
                // section by the queue pair.
                ctx.write_sync(t.word, zero).await?;
            }
            Ok(Done {
                failures,
                number: None,
            })
        }
    }
}

/// Whether the sequencer's numbers are a range of consecutive integers,
/// each drawn once (`numbers` is sorted here).
fn numbers_exact(numbers: &mut [u64]) -> bool {
    numbers.sort_unstable();
    numbers.windows(2).all(|w| w[1] == w[0] + 1)
}

/// A remote thread's operations in the window and in the whole run, failed
/// attempts and drawn numbers, or its error.
type Outcome = Result<(u64, u64, u64, Vec<u64>), OpError>;

/// The final value of the RPC variant's lock word (`lock`) or counter,
/// read with one call from a worker of its own.
fn rpc_read(fabric: &dyn Fabric, node: NodeId, lock: bool, id: usize) -> Result<u64, AtomicsError> {
    let mut wk = Worker::builder(fabric)
        .config(raw_runtime(1))
        .id(id)
        .local_bytes(64)
        .build()?;
    let out: Arc<std::sync::Mutex<Option<Result<u64, CallError>>>> = Arc::default();
    let out2 = out.clone();
    wk.spawn(move |ctx| async move {
        let req = AtomicsRequest::Read {
            slot: RPC_SLOT,
            lock,
        };
        let r = ctx.call_typed::<Atomics>(node, &req).await;
        *out2.lock().unwrap_or_else(|p| p.into_inner()) = Some(r);
    });
    wk.run();
    outcome(&out).map_err(|e| OpError::Call(e).into())
}

fn run_remote(
    fabric: &dyn Fabric,
    c: &AtomicsConfig,
    warmup: Duration,
) -> Result<AtomicsResult, AtomicsError> {
    let node = *fabric
        .nodes()
        .first()
        .expect("a fabric has at least one node");
    let rpc = c.place == Place::Rpc;
    // The remote variant's word; the RPC one uses the service's slot.
    let (addr, _, rkey) = fabric.alloc_chunk(node, 4096, false)?;
    let target = Target {
        node,
        word: RemoteRef::new(addr, rkey),
    };
    let inside = Arc::new(AtomicU64::new(0));
    let broken = Arc::new(AtomicBool::new(false));
    let (timed, outcomes) = harness::run_threads(
        c.threads,
        warmup,
        c.duration,
        |t, window, arrival| -> Outcome {
            let mut wk = Worker::builder(fabric)
                .config(raw_runtime(1))
                .id(t)
                .local_bytes(64)
                .build()?;
            let out: Arc<std::sync::Mutex<Option<Outcome>>> = Arc::default();
            let (out2, c2, window) = (out.clone(), c.clone(), window.clone());
            let (inside, broken) = (inside.clone(), broken.clone());
            wk.spawn(move |ctx| async move {
                let zero = Local::at(0, 8);
                ctx.set_local_u64(zero, 0);
                let (mut n, mut counted, mut failed, mut numbers) = (0u64, 0u64, 0u64, Vec::new());
                let r = loop {
                    if window.done(ctx.now()) {
                        break Ok((counted, n, failed, numbers));
                    }
                    match remote_op(&ctx, &c2, target, zero, &inside, &broken).await {
                        Ok(d) => {
                            failed += d.failures;
                            numbers.extend(d.number);
                        }
                        Err(e) => break Err(e),
                    }
                    n += 1;
                    if window.counts(ctx.now()) {
                        counted += 1;
                    }
                };
                *out2.lock().unwrap_or_else(|p| p.into_inner()) = Some(r);
            });
            arrival.arrive();
            wk.run();
            outcome(&out)
        },
        |_| {},
    );
    // The lock is free again (0), and the numbers drawn are exact.
    let fin = if rpc {
        rpc_read(fabric, node, true, c.threads)
    } else {
        let mut q = dmkit_fabric::SyncQp::new(fabric, node, 64)?;
        Ok(u64::from_le_bytes(
            q.read(addr, rkey, 8)?
                .try_into()
                .expect("an 8-byte READ returns 8 bytes"),
        ))
    };
    fabric.free_chunk(addr)?;
    let fin = fin?;
    let (mut ops, mut total, mut failures, mut numbers) = (0, 0, 0, Vec::new());
    for o in outcomes {
        let (k, n, f, mut nums) = o?;
        ops += k;
        total += n;
        failures += f;
        numbers.append(&mut nums);
    }
    let verified = !broken.load(Ordering::Relaxed)
        && match c.primitive {
            Primitive::Lock => fin == 0,
            Primitive::Sequencer => numbers.len() as u64 == total && numbers_exact(&mut numbers),
        };
    let mut r = result_of(
        fabric.backend(),
        c,
        ops,
        timed.seconds,
        failures,
        total,
        verified,
    );
    r.interrupted = timed.interrupted;
    r.oversubscribed = harness::oversubscribed(c.threads);
    Ok(r)
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
    use std::cell::{Cell, RefCell};
    use std::rc::Rc;
    if c.place == Place::Local {
        return Err(BenchError::Config(
            "the simulator models RDMA atomics, not the CPU's: local atomics run on the host"
                .into(),
        )
        .into());
    }
    let rpc = c.place == Place::Rpc;
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
    if rpc && f.caps().rpc_workers == 0 {
        return Err(AtomicsError::NoRpcWorkers(c.primitive));
    }
    let (addr, _, rkey) = f.alloc_chunk(0, 4096, true)?;
    let target = Target {
        node: 0,
        word: RemoteRef::new(addr, rkey),
    };
    let warm = warmup.as_nanos() as u64;
    let end = warm + c.duration.as_nanos() as u64;
    let ops = Rc::new(Cell::new(0u64));
    let totals = Rc::new(Cell::new((0u64, 0u64)));
    let numbers: Rc<RefCell<Vec<u64>>> = Rc::default();
    let failed: Rc<RefCell<Option<OpError>>> = Rc::default();
    let finished = Rc::new(Cell::new(0usize));
    // Every task shares these (one host thread runs the simulation).
    let inside = Arc::new(AtomicU64::new(0));
    let broken = Arc::new(AtomicBool::new(false));
    let fin = Rc::new(Cell::new(None::<u64>));
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
        let (numbers, finished, inside, broken) = (
            numbers.clone(),
            finished.clone(),
            inside.clone(),
            broken.clone(),
        );
        let (fin, threads) = (fin.clone(), c.threads);
        sim.worker_mut(th).spawn(move |ctx| async move {
            let zero = Local::at(0, 8);
            ctx.set_local_u64(zero, 0);
            while ctx.now() < end {
                match remote_op(&ctx, &c2, target, zero, &inside, &broken).await {
                    Ok(d) => {
                        let (n, f) = totals.get();
                        totals.set((n + 1, f + d.failures));
                        numbers.borrow_mut().extend(d.number);
                    }
                    Err(e) => {
                        *failed.borrow_mut() = Some(e);
                        return;
                    }
                }
                let now = ctx.now();
                if now >= warm && now < end {
                    ops.set(ops.get() + 1);
                }
            }
            finished.set(finished.get() + 1);
            // The last task to stop reads the lock's final state (the RPC
            // variant's word lives in the service, not in node memory).
            if rpc && finished.get() == threads {
                let req = AtomicsRequest::Read {
                    slot: RPC_SLOT,
                    lock: true,
                };
                match ctx.call_typed::<Atomics>(0, &req).await {
                    Ok(v) => fin.set(Some(v)),
                    Err(e) => *failed.borrow_mut() = Some(e.into()),
                }
            }
        });
    }
    sim.run();
    if let Some(e) = failed.borrow_mut().take() {
        return Err(e.into());
    }
    let fin = if rpc {
        fin.get()
            .ok_or_else(|| BenchError::Run("the final read of the RPC lock never ran".into()))?
    } else {
        let mut q = dmkit_fabric::SyncQp::new(f.as_ref(), 0, 64)?;
        u64::from_le_bytes(q.read(addr, rkey, 8)?.try_into().expect("8 bytes"))
    };
    let (total, failures) = totals.get();
    let mut numbers = numbers.take();
    let verified = !broken.load(Ordering::Relaxed)
        && match c.primitive {
            Primitive::Lock => fin == 0,
            Primitive::Sequencer => numbers.len() as u64 == total && numbers_exact(&mut numbers),
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

    #[test]
    fn every_place_and_primitive_verifies() {
        let f = ShmFabric::one_node(ShmConfig::default(), 1 << 20).unwrap();
        for p in [Primitive::Lock, Primitive::Sequencer] {
            for place in [Place::Local, Place::Remote, Place::Rpc] {
                for backoff in [false, true] {
                    // (Long enough that three spinning threads on a loaded
                    // two-core host all get scheduled within the window.)
                    let c = AtomicsConfig {
                        duration: Duration::from_millis(200),
                        ..AtomicsConfig::new(p, place, backoff, 3)
                    };
                    let r = run(&f, &c, Duration::from_millis(5)).unwrap();
                    assert!(r.verified && r.ops > 0, "{r:?}");
                }
            }
        }
    }

    #[test]
    fn the_simulated_lock_and_sequencer_verify() {
        let prof = dmkit_sim::Profile::builtin("cx3-40g").unwrap();
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
