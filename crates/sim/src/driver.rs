//! [`Sim`]: builds the simulated cluster and runs virtual threads — one
//! runtime [`Worker`] each, the same code that runs on OS threads over shm —
//! in virtual time on the calling OS thread.
//!
//! The loop: take the virtual thread with the earliest wake-up instant,
//! apply every memory effect due by then, step its worker once (its tasks
//! post, poll and compute; each costs CPU time on the thread's own clock),
//! and schedule it again at the later of its CPU time and its next event:
//! a completion, a timer, or at once if a task is ready.

use std::cmp::Reverse;
use std::collections::BinaryHeap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use dmkit_fabric::shm::{ShmConfig, ShmFabric};
use dmkit_fabric::{Capabilities, Fabric, FabricError};
use dmkit_memnode::NodeConfig;
use dmkit_runtime::{Clock, Nanos, Worker, WorkerStats};

use crate::clock::{MachineClock, SkewedClock};
use crate::engine::{Core, SimStats, ThreadId, Time};
use crate::fabric::{Shared, SimFabric};
use crate::faults::Faults;
use crate::profile::Profile;
use crate::switch::{SwitchModel, SwitchSimStats, SwitchStage};

/// The simulated cluster.
#[derive(Debug, Clone)]
pub struct SimConfig {
    /// The device model of every machine (built-in `cx6-200g` by default).
    pub profile: Profile,
    /// Machines that run virtual threads.
    pub compute_machines: usize,
    /// Memory nodes (ids 0..n).
    pub memory_nodes: usize,
    /// Memory node `i` lives on compute machine `i` (Sherman's setup: every
    /// server is both); otherwise memory nodes are machines of their own.
    pub colocated: bool,
    /// Remote memory per node (bytes; real memory: it is allocated lazily).
    pub memory_bytes: u64,
    /// Translation page size of the memory nodes (4 KiB or 2 MiB).
    pub page_size: u64,
    /// Seed of the simulation's random generator (fault draws, the `random`
    /// atomic order); the same binary, configuration and seed give
    /// bit-identical runs.
    pub seed: u64,
    /// Faults to inject (none by default).
    pub faults: Faults,
    /// Whether the simulated device promises in-order placement inside one
    /// WRITE (data structures then rely on it; torn faults respect it).
    pub in_order_write: bool,
    /// RPC worker cores per memory node, instead of the profile's
    /// `rpc.cores` (0: no RPC channel).
    pub rpc_workers: Option<usize>,
    /// Sockets, NIC ports and their crossings (`crate::numa`); `None`: one
    /// socket per machine, nothing crosses (the default).
    pub numa: Option<crate::numa::NumaLayout>,
    /// A SwordBox switch between clients and memory nodes
    /// ([`crate::switch`]); `None`: the plain switch of the link model.
    pub switch: Option<SwitchModel>,
}

impl Default for SimConfig {
    fn default() -> Self {
        Self {
            profile: Profile::cx6(),
            compute_machines: 1,
            memory_nodes: 1,
            colocated: false,
            memory_bytes: 256 << 20,
            page_size: 2 << 20,
            seed: 1,
            faults: Faults::default(),
            in_order_write: true,
            rpc_workers: None,
            numa: None,
            switch: None,
        }
    }
}

/// Virtual time for the runtime: the current virtual thread's CPU clock.
/// (Under the clock-skew fault, workers read their machine's clock
/// instead: [`Sim::machine_clock`].)
#[derive(Debug, Clone)]
pub struct SimClock(Arc<AtomicU64>);

impl Clock for SimClock {
    fn now(&self) -> Nanos {
        self.0.load(Ordering::Acquire)
    }
}

struct VThread {
    worker: Worker,
    machine: usize,
    done: bool,
    /// Its live entry in `Sim::wake` (`Time::MAX`: none; other entries
    /// of the thread there are stale).
    scheduled: Time,
    /// Where its CPU time stands after its last step: it cannot run
    /// earlier than that.
    cursor: Time,
}

/// A machine clock, locked (poisoning cannot happen: it guards plain
/// arithmetic).
fn lock(c: &Mutex<MachineClock>) -> std::sync::MutexGuard<'_, MachineClock> {
    c.lock().unwrap_or_else(|p| p.into_inner())
}

/// [`Sim::virtual_at`] over the machines' clocks `clocks` (empty: no skew).
fn virtual_at(clocks: &[Arc<Mutex<MachineClock>>], machine: usize, reading: Nanos) -> Time {
    match clocks.get(machine) {
        None => reading,
        Some(c) => lock(c).earliest(reading),
    }
}

/// What [`Sim::run_until`] ended with.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RunOutcome {
    /// Virtual time reached.
    pub now: Time,
    /// Threads whose tasks all finished.
    pub finished: usize,
    /// Threads with live tasks but nothing that could wake them.
    pub blocked: usize,
}

/// A simulation: its fabric, clock and virtual threads.
pub struct Sim {
    /// Sockets per machine (1 without a NUMA layout).
    sockets: u32,
    core: Arc<Shared>,
    fabric: Arc<SimFabric>,
    clock: Arc<SimClock>,
    /// Each machine's own clock under the clock-skew fault (empty when it
    /// is off: every machine reads `clock`).
    machine_clocks: Vec<Arc<Mutex<MachineClock>>>,
    /// By thread id; `None` once cleared.
    threads: Vec<Option<VThread>>,
    wake: BinaryHeap<Reverse<(Time, ThreadId)>>,
    blocked: usize,
    finished: usize,
    steps: u64,
}

impl Sim {
    /// Builds the cluster: memory nodes (real memory), machines, links.
    pub fn new(cfg: SimConfig) -> Result<Self, FabricError> {
        cfg.faults.validate().map_err(|e| FabricError::Connect {
            target: "sim".into(),
            reason: e,
        })?;
        cfg.profile.validate().map_err(|e| FabricError::Connect {
            target: "sim".into(),
            reason: format!("profile {}: {e}", cfg.profile.name),
        })?;
        if let Some(sw) = &cfg.switch {
            let refuse = |reason: String| FabricError::Connect {
                target: "sim".into(),
                reason,
            };
            sw.validate().map_err(refuse)?;
            if cfg.profile.responder.atomic_order != crate::profile::AtomicOrder::Post {
                return Err(refuse(
                    "the switch position needs the `post` atomic order".into(),
                ));
            }
            if cfg.colocated {
                return Err(refuse(
                    "the switch position needs memory nodes of their own (not colocated)".into(),
                ));
            }
        }
        if cfg.compute_machines == 0 || cfg.memory_nodes == 0 {
            return Err(FabricError::Connect {
                target: "sim".into(),
                reason: "a simulation needs at least one compute machine and one memory node"
                    .into(),
            });
        }
        if cfg.colocated && cfg.memory_nodes > cfg.compute_machines {
            return Err(FabricError::Connect {
                target: "sim".into(),
                reason: format!(
                    "{} colocated memory nodes need as many compute machines (have {})",
                    cfg.memory_nodes, cfg.compute_machines
                ),
            });
        }
        let p = &cfg.profile;
        let shm = ShmConfig {
            rtt: None,
            max_batch: p.limits.max_batch,
            max_inline: p.limits.max_inline,
            ..ShmConfig::default()
        };
        let nodes: Vec<NodeConfig> = (0..cfg.memory_nodes)
            .map(|i| NodeConfig {
                node_id: i as u16,
                size: cfg.memory_bytes,
                page_size: cfg.page_size,
                ..NodeConfig::default()
            })
            .collect();
        let inner = ShmFabric::embedded(shm, &nodes)?;
        let caps = Capabilities {
            in_order_write: cfg.in_order_write,
            masked_cas: p.limits.masked_cas,
            max_batch: p.limits.max_batch,
            max_inline: p.limits.max_inline,
            max_message: p.limits.max_message,
            max_sge: p.limits.max_sge,
            on_nic_memory: p.limits.device_memory > 0,
            explicit_doorbells: true,
            rpc_workers: cfg.rpc_workers.unwrap_or(p.rpc.cores as usize),
        };
        // With sockets, a memory machine holds one node per socket.
        let per_machine = cfg.numa.as_ref().map_or(1, |l| l.sockets as usize);
        if let Some(l) = &cfg.numa {
            let bad = |reason: String| FabricError::Connect {
                target: "sim".into(),
                reason,
            };
            l.validate().map_err(|e| bad(format!("NUMA layout: {e}")))?;
            if cfg.colocated {
                return Err(bad(
                    "a NUMA layout needs memory machines of their own".into()
                ));
            }
        }
        let machines = if cfg.colocated {
            cfg.compute_machines
        } else {
            cfg.compute_machines + cfg.memory_nodes.div_ceil(per_machine)
        };
        let tick = Arc::new(AtomicU64::new(0));
        let mut core = Core::new(
            cfg.profile.clone(),
            cfg.faults.clone(),
            cfg.in_order_write,
            machines,
            cfg.seed,
            tick.clone(),
        );
        core.rpc_cores = caps.rpc_workers;
        core.rpc_max_message = shm.rpc_max_message as usize;
        core.rpc_capacity = shm.rpc_slots as usize;
        if let Some(sw) = cfg.switch.clone() {
            let half_wire = cfg.profile.link.wire_ns / 2.0;
            core.switch = Some(Box::new(SwitchStage::new(sw, cfg.seed, half_wire)));
        }
        let shift = cfg.page_size.trailing_zeros();
        for i in 0..cfg.memory_nodes {
            let m = if cfg.colocated {
                i
            } else {
                cfg.compute_machines + i / per_machine
            };
            core.place_node(i as u16, m, shift);
        }
        if let Some(l) = &cfg.numa {
            core.set_numa(l.clone());
        }
        let machine_clocks = (0..machines)
            .filter_map(|m| MachineClock::new(&cfg.faults, cfg.seed, m))
            .map(|c| Arc::new(Mutex::new(c)))
            .collect();
        let core = Arc::new(Shared::new(core));
        Ok(Self {
            sockets: per_machine as u32,
            machine_clocks,
            fabric: Arc::new(SimFabric {
                core: core.clone(),
                inner,
                caps,
            }),
            core,
            clock: Arc::new(SimClock(tick)),
            threads: Vec::new(),
            wake: BinaryHeap::new(),
            blocked: 0,
            finished: 0,
            steps: 0,
        })
    }

    /// Sockets per machine (1 unless a NUMA layout gives more).
    pub fn sockets(&self) -> u32 {
        self.sockets
    }

    /// The fabric (give it to data structures and workers).
    pub fn fabric(&self) -> Arc<SimFabric> {
        self.fabric.clone()
    }

    /// The fabric as a trait object.
    pub fn dyn_fabric(&self) -> Arc<dyn Fabric> {
        self.fabric.clone()
    }

    /// The virtual clock: virtual time itself, as the current virtual
    /// thread sees it. Workers get their machine's clock
    /// ([`Sim::machine_clock`]), which is this one unless the clock-skew
    /// fault is on.
    pub fn clock(&self) -> Arc<dyn Clock> {
        self.clock.clone()
    }

    /// The clock the workers of `machine` read: virtual time, or under the
    /// clock-skew fault ([`Faults::clock_skew_ns`]) the machine's own
    /// drifting clock ([`crate::clock`]).
    pub fn machine_clock(&self, machine: usize) -> Arc<dyn Clock> {
        match self.machine_clocks.get(machine) {
            None => self.clock.clone(),
            Some(c) => Arc::new(SkewedClock {
                tick: self.clock.0.clone(),
                clock: c.clone(),
            }),
        }
    }

    /// What `machine`'s clock reads at virtual instant `t` (`t` itself
    /// without the clock-skew fault).
    pub fn clock_reading(&self, machine: usize, t: Time) -> Nanos {
        match self.machine_clocks.get(machine) {
            None => t,
            Some(c) => lock(c).read(t),
        }
    }

    /// The first virtual instant at which `machine`'s clock reads at least
    /// `reading` (`reading` itself without the clock-skew fault): when a
    /// timer set on that clock fires, or — for a reading taken there — the
    /// earliest instant it can have been taken at.
    pub fn virtual_at(&self, machine: usize, reading: Nanos) -> Time {
        virtual_at(&self.machine_clocks, machine, reading)
    }

    /// Current virtual time.
    pub fn now(&self) -> Time {
        self.core.with(|c| c.now)
    }

    /// Adds a virtual thread on compute machine `machine` whose worker
    /// `make` builds (its queue pairs are made on that thread's behalf);
    /// the thread first runs at the current virtual time.
    pub fn add_worker<E>(
        &mut self,
        machine: usize,
        make: impl FnOnce(&dyn Fabric, Arc<dyn Clock>) -> Result<Worker, E>,
    ) -> Result<ThreadId, E> {
        self.add_worker_on(machine, 0, make)
    }

    /// [`Sim::add_worker`] for a thread on `socket` of its machine (what
    /// its queue pairs cross depends on it: [`crate::numa`]; without a
    /// NUMA layout the socket changes nothing).
    pub fn add_worker_on<E>(
        &mut self,
        machine: usize,
        socket: u32,
        make: impl FnOnce(&dyn Fabric, Arc<dyn Clock>) -> Result<Worker, E>,
    ) -> Result<ThreadId, E> {
        let (th, now) = self.core.with(|c| {
            assert!(
                machine < c.machine_count(),
                "machine {machine} does not exist"
            );
            let th = c.add_thread(machine);
            c.set_thread_socket(th, socket);
            c.set_current(Some(th));
            c.cursor = c.now;
            (th, c.now)
        });
        self.clock.0.store(now, Ordering::Release);
        let made = make(self.fabric.as_ref(), self.machine_clock(machine));
        let now = self.core.with(|c| {
            c.set_current(None);
            c.now
        });
        self.clock.0.store(now, Ordering::Release);
        let worker = made?;
        debug_assert_eq!(self.threads.len(), th as usize);
        self.threads.push(Some(VThread {
            worker,
            machine,
            done: false,
            scheduled: now,
            cursor: now,
        }));
        self.wake.push(Reverse((now, th)));
        Ok(th)
    }

    /// The worker of thread `th` (to spawn more tasks, read statistics).
    ///
    /// # Panics
    /// If the thread does not exist or was cleared (programmer error).
    pub fn worker_mut(&mut self, th: ThreadId) -> &mut Worker {
        &mut self.thread(th).worker
    }

    fn thread(&mut self, th: ThreadId) -> &mut VThread {
        self.threads[th as usize]
            .as_mut()
            .expect("a live virtual thread")
    }

    /// Machine of thread `th`.
    pub fn machine_of(&self, th: ThreadId) -> usize {
        self.threads[th as usize]
            .as_ref()
            .expect("a live virtual thread")
            .machine
    }

    /// Declares how many threads of `machine` are busy (the SMT slowdown
    /// applies beyond its physical cores). By default: every thread added.
    pub fn set_active_threads(&mut self, machine: usize, n: u32) {
        self.core.with(|c| c.set_active(machine, n));
    }

    /// Makes a thread whose worker finished or blocked runnable again (after
    /// spawning new tasks on it).
    pub fn wake(&mut self, th: ThreadId) {
        let now = self.now();
        let t = self.thread(th);
        let was_done = std::mem::replace(&mut t.done, false);
        t.scheduled = now;
        if was_done {
            self.finished -= 1;
        }
        self.wake.push(Reverse((now, th)));
    }

    /// Runs until every worker's tasks have finished (or nothing can run).
    pub fn run(&mut self) -> RunOutcome {
        self.run_until(Time::MAX)
    }

    /// Runs until virtual time `end` (threads due later stay scheduled).
    pub fn run_until(&mut self, end: Time) -> RunOutcome {
        let core = self.core.clone();
        let _active = core.activate();
        // Arbitrated atomics: an arbitration decides when requests complete,
        // so it runs before any step that comes after it.
        let mut arbitration = self.core.with(|c| c.next_event());
        loop {
            let next = self.wake.peek().map(|w| w.0 .0);
            if let Some(a) = arbitration {
                if a <= end && next.is_none_or(|t| a <= t) {
                    let woken = self.core.with(|c| {
                        c.apply_until(a);
                        arbitration = c.next_event();
                        std::mem::take(&mut c.woken)
                    });
                    self.wake_all(woken);
                    continue;
                }
            }
            let Some(t) = next else { break };
            if t > end {
                break;
            }
            let th = self.wake.pop().expect("peeked").0 .1;
            let Some(vt) = self.threads[th as usize].as_mut() else {
                continue;
            };
            if vt.done || vt.scheduled != t {
                continue;
            }
            vt.scheduled = Time::MAX;
            // Cache hints for the threads likely to step next (their state
            // is scattered over megabytes; no effect on results). The
            // heap's top: its worker's shared state now, its tasks after
            // this step. The top's children, one of which steps after it:
            // their own lines.
            let ahead = self.wake.peek().map(|w| w.0 .1);
            for (i, w) in self.wake.as_slice().iter().take(3).enumerate() {
                if let Some(Some(v)) = self.threads.get(w.0 .1 as usize) {
                    if i == 0 {
                        v.worker.prefetch_core();
                    } else {
                        dmkit_fabric::hint::prefetch(v);
                    }
                }
            }
            let vt = self.threads[th as usize].as_mut().expect("checked above");
            self.core.with(|c| {
                c.apply_until(t);
                c.set_current(Some(th));
                c.cursor = t;
            });
            self.clock.0.store(t, Ordering::Release);
            let polled = vt.worker.step();
            self.steps += 1;
            let (cursor, next_completion, woke) = self.core.with(|c| {
                let task_ns = c.p.cpu.task_ns * polled as f64;
                c.charge(task_ns);
                // Every step costs at least a nanosecond: a spinning task
                // cannot stop virtual time.
                if c.cursor <= t {
                    c.cursor = t + 1;
                }
                c.set_current(None);
                let now = c.now;
                self.clock.0.store(now, Ordering::Release);
                arbitration = c.next_event();
                (c.cursor, c.next_completion(th), !c.woken.is_empty())
            });
            vt.cursor = cursor;
            if let Some(a) = ahead {
                if let Some(Some(v)) = self.threads.get(a as usize) {
                    v.worker.prefetch_tasks();
                }
                self.core.with(|c| c.prefetch_thread(a));
            }
            let vt = self.threads[th as usize].as_mut().expect("checked above");
            if vt.worker.live_tasks() == 0 {
                vt.done = true;
                self.finished += 1;
                continue;
            }
            let next = if vt.worker.has_ready() {
                Some(cursor)
            } else {
                // (A timer is set on the machine's clock.)
                let timer = vt
                    .worker
                    .next_timer()
                    .map(|r| virtual_at(&self.machine_clocks, vt.machine, r));
                match (next_completion, timer) {
                    (Some(a), Some(b)) => Some(a.min(b)),
                    (a, b) => a.or(b),
                }
            };
            match next {
                Some(n) => {
                    let n = n.max(cursor);
                    vt.scheduled = n;
                    self.wake.push(Reverse((n, th)));
                }
                // Waiting for an arbitration is not blocked: it announces
                // the completion (`wake_all`).
                None => {
                    if !self.core.with(|c| c.awaits_arbitration(th)) {
                        self.blocked += 1;
                    }
                }
            }
            if woke {
                let woken = self.core.with(|c| std::mem::take(&mut c.woken));
                self.wake_all(woken);
            }
        }
        if end != Time::MAX {
            let woken = self.core.with(|c| {
                c.apply_until(end);
                std::mem::take(&mut c.woken)
            });
            self.wake_all(woken);
            let now = self.now();
            self.clock.0.store(now, Ordering::Release);
        }
        RunOutcome {
            now: self.now(),
            finished: self.finished,
            blocked: self.blocked,
        }
    }

    /// Schedules the threads whose requests an arbitration resolved, at
    /// their completion unless they are due earlier.
    fn wake_all(&mut self, woken: Vec<(Time, ThreadId)>) {
        for (at, th) in woken {
            let Some(vt) = self.threads[th as usize].as_mut() else {
                continue;
            };
            // (A thread's clock never goes back: its last step may have
            // run past the completion.)
            let at = at.max(vt.cursor);
            if vt.done || at >= vt.scheduled {
                continue;
            }
            vt.scheduled = at;
            self.wake.push(Reverse((at, th)));
        }
    }

    /// Worker steps taken so far.
    pub fn steps(&self) -> u64 {
        self.steps
    }

    /// Counters of the RPC path (zero without a channel).
    pub fn rpc_stats(&self) -> crate::RpcSimStats {
        self.core
            .with(|c| c.rpc.as_ref().map(|r| r.stats()).unwrap_or_default())
    }

    /// The switch position's counters (`None` without a switch).
    pub fn switch_stats(&self) -> Option<SwitchSimStats> {
        self.core.with(|c| c.switch.as_ref().map(|s| s.stats()))
    }

    /// Runs `f` on the switch's policy (e.g. to install the keys to steer
    /// once they are known); `None` without a switch.
    pub fn with_switch<R>(&self, f: impl FnOnce(&mut dmkit_switch::Switch) -> R) -> Option<R> {
        self.core
            .with(|c| c.switch.as_deref_mut().map(|s| f(s.policy_mut())))
    }

    /// Engine counters.
    pub fn stats(&self) -> SimStats {
        self.core.with(|c| c.stats)
    }

    /// Requests posted and not yet reaped by their queue pair's owner.
    pub fn in_flight(&self) -> usize {
        self.core.with(|c| c.in_flight())
    }

    /// Every worker's statistics, merged.
    pub fn worker_stats(&self) -> WorkerStats {
        let mut s = WorkerStats::default();
        for t in self.threads.iter().flatten() {
            s.merge(&t.worker.stats());
        }
        s
    }

    /// Statistics of one worker.
    pub fn thread_stats(&self, th: ThreadId) -> WorkerStats {
        self.threads[th as usize]
            .as_ref()
            .expect("a live virtual thread")
            .worker
            .stats()
    }

    /// Number of live virtual threads.
    pub fn thread_count(&self) -> usize {
        self.threads.iter().flatten().count()
    }

    /// Kills compute machine `machine` now, as a crash would: its threads
    /// stop for good — their tasks are dropped where they stand, with
    /// whatever remote locks they held — and the requests they had posted
    /// still execute (they are on the wire) but complete to no one.
    /// Requests a task had only queued are lost. Returns how many threads
    /// died.
    pub fn kill_machine(&mut self, machine: usize) -> usize {
        let mut n = 0;
        for t in &mut self.threads {
            if t.as_ref().is_some_and(|v| v.machine == machine) {
                let v = t.take().expect("checked above");
                if v.done {
                    self.finished -= 1;
                }
                drop(v);
                n += 1;
            }
        }
        n
    }

    /// Drops every worker (and its queue pairs) — e.g. before reading the
    /// final memory with fresh clients. Thread ids are not reused.
    pub fn clear_workers(&mut self) {
        for t in &mut self.threads {
            *t = None;
        }
        self.wake.clear();
        self.finished = 0;
        self.blocked = 0;
    }
}
