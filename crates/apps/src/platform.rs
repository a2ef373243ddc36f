//! Where an application's executors run: OS threads over a fabric (shm,
//! verbs), or virtual threads of the simulator. Each executor is one
//! runtime worker with one task; [`Platform::run`] starts them all, waits
//! for all, and returns their outputs and the time they took (wall time,
//! or virtual time on the simulator).

use std::future::Future;
use std::sync::{Arc, Mutex};

use dmkit_fabric::Fabric;
use dmkit_runtime::{Ctx, LocalLayout, RuntimeConfig, Worker};
use dmkit_sim::{Sim, SimConfig};

use crate::AppError;

/// The runtime configuration of the applications' executors: the study's
/// applications post verbs directly (no throttling, no conflict
/// avoidance).
pub fn raw_runtime(seed: u64) -> RuntimeConfig {
    RuntimeConfig {
        throttle: false,
        conflict_avoid: false,
        op_stats: false,
        seed,
        ..RuntimeConfig::default()
    }
}

/// Where executors run.
pub enum Platform {
    /// OS threads over a fabric.
    Threads(Arc<dyn Fabric>),
    /// Virtual threads of a simulation: executor `i` on compute machine
    /// `i % machines`, socket `(i / machines) % sockets`.
    Sim {
        /// The simulation.
        sim: Box<Sim>,
        /// Compute machines.
        machines: usize,
        /// Sockets per machine.
        sockets: u32,
    },
}

/// Bytes and verbs the executors of a run moved (their workers' counters).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Traffic {
    /// Bytes WRITTEN (payload).
    pub bytes_written: u64,
    /// Bytes READ.
    pub bytes_read: u64,
    /// WRITE requests.
    pub writes: u64,
    /// Atomic verbs (CAS, FAA).
    pub atomics: u64,
    /// Doorbells rung.
    pub doorbells: u64,
}

impl Platform {
    /// A simulation of `cfg` (its `compute_machines` run the executors).
    pub fn sim(cfg: SimConfig) -> Result<Self, AppError> {
        let machines = cfg.compute_machines;
        let sockets = cfg.numa.as_ref().map_or(1, |l| l.sockets);
        Ok(Platform::Sim {
            sim: Box::new(Sim::new(cfg)?),
            machines,
            sockets,
        })
    }

    /// The fabric (for the control plane: allocating, checking).
    pub fn fabric(&self) -> Arc<dyn Fabric> {
        match self {
            Platform::Threads(f) => f.clone(),
            Platform::Sim { sim, .. } => sim.dyn_fabric(),
        }
    }

    /// The backend's name.
    pub fn backend(&self) -> &'static str {
        match self {
            Platform::Threads(f) => f.backend(),
            Platform::Sim { .. } => "sim",
        }
    }

    /// Whether executors run in virtual time.
    pub fn is_sim(&self) -> bool {
        matches!(self, Platform::Sim { .. })
    }

    /// The socket executor `i` runs on (0 on threads, where pinning is the
    /// host's business).
    pub fn socket_of(&self, i: usize) -> u32 {
        match self {
            Platform::Threads(_) => 0,
            Platform::Sim {
                machines, sockets, ..
            } => ((i / machines) as u32) % sockets,
        }
    }

    /// Runs `n` executors: executor `i` is `body(ctx, i)` on a worker of its
    /// own with task memory `layout`. Returns the outputs in executor order,
    /// the seconds from start to the last one's end, and their traffic.
    pub fn run<T, F, Fut>(
        &mut self,
        n: usize,
        layout: &LocalLayout,
        cfg: &RuntimeConfig,
        body: F,
    ) -> Result<(Vec<T>, f64, Traffic), AppError>
    where
        T: Send + 'static,
        F: Fn(Ctx, usize) -> Fut + Sync,
        Fut: Future<Output = T> + 'static,
    {
        match self {
            Platform::Threads(f) => run_threads(f.as_ref(), n, layout, cfg, &body),
            Platform::Sim {
                sim,
                machines,
                sockets,
            } => run_sim(sim, *machines, *sockets, n, layout, cfg, &body),
        }
    }
}

fn traffic_of(s: &dmkit_runtime::WorkerStats) -> Traffic {
    let c = &s.counters;
    Traffic {
        bytes_written: c.bytes_written,
        bytes_read: c.bytes_read,
        writes: c.writes,
        atomics: c.cas + c.faa,
        doorbells: c.doorbells,
    }
}

fn add(a: &mut Traffic, b: Traffic) {
    a.bytes_written += b.bytes_written;
    a.bytes_read += b.bytes_read;
    a.writes += b.writes;
    a.atomics += b.atomics;
    a.doorbells += b.doorbells;
}

type Slot<T> = Arc<Mutex<Option<T>>>;

fn run_threads<T, F, Fut>(
    fabric: &dyn Fabric,
    n: usize,
    layout: &LocalLayout,
    cfg: &RuntimeConfig,
    body: &F,
) -> Result<(Vec<T>, f64, Traffic), AppError>
where
    T: Send + 'static,
    F: Fn(Ctx, usize) -> Fut + Sync,
    Fut: Future<Output = T> + 'static,
{
    let barrier = std::sync::Barrier::new(n + 1);
    let (outs, secs) = std::thread::scope(|s| {
        let hs: Vec<_> = (0..n)
            .map(|i| {
                let barrier = &barrier;
                s.spawn(move || -> Result<(T, Traffic), AppError> {
                    // The worker and its task are made before the start
                    // (the task's first allocation on a new thread faulted
                    // in fresh allocator pages inside the timed window);
                    // the task runs from `w.run()` on.
                    let slot: Slot<T> = Arc::default();
                    let built = Worker::builder(fabric)
                        .config(cfg.clone())
                        .id(i)
                        .local(layout)
                        .build()
                        .map(|mut w| {
                            let out = slot.clone();
                            w.spawn(move |ctx| {
                                let fut = body(ctx, i);
                                async move {
                                    let v = fut.await;
                                    *out.lock().unwrap_or_else(|p| p.into_inner()) = Some(v);
                                }
                            });
                            w
                        });
                    barrier.wait();
                    let mut w = built?;
                    w.run();
                    let v = slot
                        .lock()
                        .unwrap_or_else(|p| p.into_inner())
                        .take()
                        .expect("the executor finished");
                    Ok((v, traffic_of(&w.stats())))
                })
            })
            .collect();
        barrier.wait();
        let t0 = std::time::Instant::now();
        let outs: Vec<_> = hs
            .into_iter()
            .map(|h| h.join().expect("an executor thread panicked"))
            .collect();
        (outs, t0.elapsed().as_secs_f64())
    });
    let mut traffic = Traffic::default();
    let mut vs = Vec::with_capacity(n);
    for o in outs {
        let (v, t) = o?;
        add(&mut traffic, t);
        vs.push(v);
    }
    Ok((vs, secs, traffic))
}

#[allow(clippy::too_many_arguments)]
fn run_sim<T, F, Fut>(
    sim: &mut Sim,
    machines: usize,
    sockets: u32,
    n: usize,
    layout: &LocalLayout,
    cfg: &RuntimeConfig,
    body: &F,
) -> Result<(Vec<T>, f64, Traffic), AppError>
where
    T: 'static,
    F: Fn(Ctx, usize) -> Fut,
    Fut: Future<Output = T> + 'static,
{
    let start = sim.now();
    let mut slots = Vec::with_capacity(n);
    let mut threads = Vec::with_capacity(n);
    for i in 0..n {
        let (m, socket) = (i % machines, ((i / machines) as u32) % sockets);
        let th = sim.add_worker_on(m, socket, |f: &dyn Fabric, clock| {
            Worker::builder(f)
                .clock(clock)
                .config(cfg.clone())
                .id(i)
                .local(layout)
                .build()
        })?;
        let slot: std::rc::Rc<std::cell::RefCell<Option<T>>> = Default::default();
        let out = slot.clone();
        sim.worker_mut(th).spawn(move |ctx| {
            let fut = body(ctx, i);
            async move {
                let v = fut.await;
                *out.borrow_mut() = Some(v);
            }
        });
        slots.push(slot);
        threads.push(th);
    }
    sim.run();
    let secs = (sim.now() - start) as f64 / 1e9;
    let mut traffic = Traffic::default();
    for &th in &threads {
        add(&mut traffic, traffic_of(&sim.thread_stats(th)));
    }
    let vs = slots
        .into_iter()
        .map(|s| {
            s.borrow_mut().take().ok_or_else(|| {
                AppError::Config("a simulated executor did not finish (blocked)".into())
            })
        })
        .collect::<Result<Vec<_>, _>>()?;
    Ok((vs, secs, traffic))
}
