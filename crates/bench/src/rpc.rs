//! The RPC micro-benchmark: echo round trips through a memory node's
//! worker threads, the RPC baseline's counterpart of [`crate::micro`].
//!
//! Each thread is a runtime worker with `coros` tasks; each task calls the
//! node's echo service ([`dmkit_fabric::rpc::ECHO`]) with `size` bytes,
//! awaits the reply, checks it, and calls again (a closed loop: at most
//! `threads × coros` calls in flight). Calls that end inside the measured
//! window (after a warm-up) count; their latencies, from the call to the
//! reply's arrival at the task, go into an HDR histogram.
//!
//! On shm the window is wall-clock time and the node runs `--workers`
//! threads (embedded, or a node process's own). On the simulator it is
//! virtual time and the node's cores are the profile's `rpc.cores`, or
//! `--workers`.

use std::cell::{Cell, RefCell};
use std::rc::Rc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use dmkit_fabric::rpc::ECHO;
use dmkit_fabric::{Fabric, NodeId};
use dmkit_runtime::{Ctx, RuntimeConfig, Worker};
use dmkit_sim::{Sim, SimConfig};
use hdrhistogram::Histogram;
use serde::Serialize;

use crate::harness::{self, TaskWindow};
use crate::micro::BenchError;

/// What to run.
#[derive(Debug, Clone)]
pub struct RpcConfig {
    /// Payload bytes of each request (the reply is as long).
    pub size: usize,
    /// Client threads (runtime workers).
    pub threads: usize,
    /// Tasks per thread, each with one call in flight.
    pub coros: usize,
    /// Measured window (wall time on shm, virtual time on the simulator).
    pub duration: Duration,
    /// Time before the window (caches, the node's workers waking up).
    pub warmup: Duration,
    /// Seed of the runtime's random numbers (and of the simulation).
    pub seed: u64,
}

impl RpcConfig {
    fn check(&self, fabric: &dyn Fabric, node: NodeId) -> Result<(), BenchError> {
        if self.threads == 0 || self.coros == 0 {
            return Err(BenchError::Config(
                "--threads and --coros must be at least 1".into(),
            ));
        }
        if fabric.caps().rpc_workers == 0 {
            return Err(BenchError::Config(format!(
                "the {} backend's memory nodes run no RPC workers (dmkit memnode --workers N)",
                fabric.backend()
            )));
        }
        let ch = fabric.connect_rpc(node)?;
        if self.size > ch.max_message() {
            return Err(BenchError::Config(format!(
                "--size {} exceeds the channel's {} B messages",
                self.size,
                ch.max_message()
            )));
        }
        Ok(())
    }
}

/// What a run measured.
#[derive(Debug, Clone, Serialize)]
pub struct RpcResult {
    /// `shm` or `sim`.
    pub backend: String,
    /// The simulator's device profile (`None` on shm).
    pub profile: Option<String>,
    /// Payload bytes per request and per reply.
    pub size: usize,
    /// Client threads.
    pub threads: usize,
    /// Tasks per thread.
    pub coros: usize,
    /// The node's RPC worker threads (cores on the simulator).
    pub workers: usize,
    /// Calls completed in the window.
    pub calls: u64,
    /// Length of the window.
    pub seconds: f64,
    /// Millions of round trips per second.
    pub mops: f64,
    /// Median latency of a call (µs).
    pub p50_us: f64,
    /// 99th-percentile latency (µs).
    pub p99_us: f64,
    /// Mean latency (µs).
    pub mean_us: f64,
    /// Latency percentiles of the counted calls (min, avg, p50, p95,
    /// p99, p99.9, max), microseconds.
    pub latency: harness::Latency,
    /// Calls that failed (any is an error of the run).
    pub failures: u64,
    /// Unmeasured time before the window.
    pub warmup_s: f64,
    /// Ctrl-C ended the window early (shm): the figures are of the
    /// shortened window.
    pub interrupted: bool,
    /// Set when more client threads ran than the process has cores (shm).
    pub oversubscribed: Option<String>,
    /// Wall-clock seconds the run took (the simulator's speed).
    pub wall_seconds: f64,
}

fn histogram() -> Histogram<u64> {
    Histogram::new_with_bounds(1, 100_000_000_000, 3).expect("valid bounds")
}

/// Spawns the closed-loop echo tasks of one thread. A call that ends at a
/// clock reading inside `[from, until)` counts (`measuring` says so on
/// shm, where the window is set from outside).
fn spawn_tasks(
    w: &mut Worker,
    cfg: &RpcConfig,
    window: TaskWindow,
    hist: Rc<RefCell<Histogram<u64>>>,
    calls: Rc<Cell<u64>>,
    failures: Rc<Cell<u64>>,
) {
    for t in 0..cfg.coros {
        let (hist, calls, failures, window) = (
            hist.clone(),
            calls.clone(),
            failures.clone(),
            window.clone(),
        );
        let payload: Vec<u8> = (0..cfg.size).map(|i| (i + t) as u8).collect();
        w.spawn(move |ctx: Ctx| async move {
            while !window.over(ctx.now()) {
                let t0 = ctx.now();
                let r = ctx.call(0, ECHO, payload.clone()).await;
                let t1 = ctx.now();
                if r.as_deref() != Ok(&payload[..]) {
                    failures.set(failures.get() + 1);
                    break;
                }
                if window.counts(t0, t1) {
                    calls.set(calls.get() + 1);
                    let _ = hist.borrow_mut().record((t1 - t0).max(1));
                }
            }
        });
    }
}

/// What the tasks counted: calls in the window, failures, latencies.
struct Tally<'a> {
    calls: u64,
    failures: u64,
    hist: &'a Histogram<u64>,
}

fn result(
    backend: &str,
    profile: Option<String>,
    cfg: &RpcConfig,
    workers: usize,
    t: Tally<'_>,
    (timed, wall): (harness::Timed, Instant),
) -> Result<RpcResult, BenchError> {
    let Tally {
        calls,
        failures,
        hist: h,
    } = t;
    if failures > 0 {
        return Err(BenchError::Config(format!(
            "{failures} echo calls failed or returned other bytes"
        )));
    }
    let seconds = timed.seconds;
    let us = |q: f64| h.value_at_quantile(q) as f64 / 1e3;
    Ok(RpcResult {
        backend: backend.into(),
        profile,
        size: cfg.size,
        threads: cfg.threads,
        coros: cfg.coros,
        workers,
        calls,
        seconds,
        mops: harness::rate(calls as f64, seconds) / 1e6,
        p50_us: us(0.5),
        p99_us: us(0.99),
        mean_us: h.mean() / 1e3,
        latency: harness::Latency::of(h),
        failures,
        warmup_s: cfg.warmup.as_secs_f64(),
        interrupted: timed.interrupted,
        oversubscribed: (backend != "sim")
            .then(|| harness::oversubscribed(cfg.threads))
            .flatten(),
        wall_seconds: wall.elapsed().as_secs_f64(),
    })
}

/// Runs the benchmark on a real fabric (shm, verbs) against node 0: one OS
/// thread per client thread. `progress` is called about every 100 ms with
/// the time into the window and the calls so far.
pub fn run(
    fabric: &dyn Fabric,
    cfg: &RpcConfig,
    mut progress: impl FnMut(Duration, u64),
) -> Result<RpcResult, BenchError> {
    cfg.check(fabric, 0)?;
    let wall = Instant::now();
    let total = AtomicU64::new(0);
    let rcfg = RuntimeConfig {
        seed: cfg.seed,
        op_stats: false,
        ..RuntimeConfig::default()
    };
    let (timed, outcomes) = harness::run_threads(
        cfg.threads,
        cfg.warmup,
        cfg.duration,
        |id, window, arrival| -> Result<_, BenchError> {
            let mut w = Worker::builder(fabric)
                .config(rcfg.clone())
                .id(id)
                .tasks(cfg.coros)
                .build()?;
            let hist = Rc::new(RefCell::new(histogram()));
            let (calls, failures) = (Rc::new(Cell::new(0)), Rc::new(Cell::new(0)));
            spawn_tasks(
                &mut w,
                cfg,
                TaskWindow::Wall(window.clone()),
                hist.clone(),
                calls.clone(),
                failures.clone(),
            );
            arrival.arrive();
            let mut reported = 0;
            while w.live_tasks() > 0 {
                if w.step() == 0 {
                    std::hint::spin_loop();
                }
                if calls.get() >= reported + 64 {
                    total.fetch_add(calls.get() - reported, Ordering::Relaxed);
                    reported = calls.get();
                }
            }
            total.fetch_add(calls.get() - reported, Ordering::Relaxed);
            let h = hist.borrow().clone();
            Ok((h, calls.get(), failures.get()))
        },
        |tick| progress(tick.measured, total.load(Ordering::Relaxed)),
    );
    let (mut h, mut calls, mut failures) = (histogram(), 0, 0);
    for o in outcomes {
        let (oh, oc, of) = o?;
        h.add(&oh).expect("same bounds");
        calls += oc;
        failures += of;
    }
    let workers = fabric.caps().rpc_workers;
    let tally = Tally {
        calls,
        failures,
        hist: &h,
    };
    result(fabric.backend(), None, cfg, workers, tally, (timed, wall))
}

/// Runs the benchmark on the simulator: `sim` describes the cluster (its
/// first compute machine hosts the threads; node 0 answers).
pub fn run_sim(sim_cfg: SimConfig, cfg: &RpcConfig) -> Result<RpcResult, BenchError> {
    let wall = Instant::now();
    let profile = sim_cfg.profile.name.clone();
    let mut sim = Sim::new(sim_cfg)?;
    cfg.check(sim.dyn_fabric().as_ref(), 0)?;
    let from = cfg.warmup.as_nanos() as u64;
    let until = from + cfg.duration.as_nanos() as u64;
    let hist = Rc::new(RefCell::new(histogram()));
    let (calls, failures) = (Rc::new(Cell::new(0)), Rc::new(Cell::new(0)));
    let rcfg = RuntimeConfig {
        seed: cfg.seed,
        op_stats: false,
        ..RuntimeConfig::default()
    };
    for id in 0..cfg.threads {
        let th = sim.add_worker(0, |f: &dyn Fabric, clock| {
            Worker::builder(f)
                .clock(clock)
                .config(rcfg.clone())
                .id(id)
                .tasks(cfg.coros)
                .build()
        })?;
        spawn_tasks(
            sim.worker_mut(th),
            cfg,
            TaskWindow::Virtual { from, until },
            hist.clone(),
            calls.clone(),
            failures.clone(),
        );
    }
    sim.run_until(until);
    let workers = sim.fabric().caps().rpc_workers;
    let h = hist.borrow();
    let tally = Tally {
        calls: calls.get(),
        failures: failures.get(),
        hist: &h,
    };
    let timed = harness::Timed {
        seconds: cfg.duration.as_secs_f64(),
        interrupted: false,
    };
    result("sim", Some(profile), cfg, workers, tally, (timed, wall))
}

#[cfg(test)]
mod tests {
    use super::*;
    use dmkit_fabric::shm::{ShmConfig, ShmFabric};
    use dmkit_memnode::NodeConfig;

    /// Many more client threads than cores: the window is the one asked
    /// for (the harness's, opened after every thread is ready), calls are
    /// counted in it only, and the run says it was oversubscribed.
    #[test]
    fn oversubscribed_clients_count_one_window() {
        let f = ShmFabric::embedded(
            ShmConfig::default(),
            &[NodeConfig {
                size: 4 << 20,
                rpc_workers: 1,
                ..Default::default()
            }],
        )
        .unwrap();
        let cfg = RpcConfig {
            size: 16,
            threads: 4 * harness::cores(),
            coros: 2,
            duration: Duration::from_millis(200),
            warmup: Duration::from_millis(20),
            seed: 1,
        };
        let t0 = Instant::now();
        let mut seen = 0;
        let r = run(&f, &cfg, |_, calls| seen = seen.max(calls)).unwrap();
        assert!((r.seconds - 0.2).abs() < 1e-9, "{r:?}");
        assert!(t0.elapsed().as_secs_f64() >= r.seconds + r.warmup_s);
        assert!(r.calls > 0 && r.failures == 0, "{r:?}");
        assert!(seen <= r.calls, "progress saw {seen} of {}", r.calls);
        assert!(r.oversubscribed.is_some() && !r.interrupted);
        assert!((r.mops - r.calls as f64 / 0.2 / 1e6).abs() < 1e-9, "{r:?}");
        assert!(r.latency.p50_us > 0.0 && r.latency.max_us >= r.latency.p99_us);
    }
}
