//! `dmkit bench txn`: SmallBank, TATP or TPC-C (NewOrder + Payment) on
//! `dmkit_txn` (FORD's one-sided OCC, "FORD: Fast One-sided RDMA-based
//! Distributed Transactions for Disaggregated Persistent Memory",
//! FAST'22; SMART-DTX, "Scaling Up Memory Disaggregated Applications with
//! SMART", ASPLOS'24 §5.2) on a real fabric (shm, verbs): load, run
//! `threads` workers × `coros` tasks for a wall-clock duration, each task
//! one coordinator retrying every drawn transaction until it commits or its
//! logic rolls it back; then check the workload's consistency conditions,
//! that every replica is byte-identical and that nothing stays locked.
//!
//! Measured: committed and attempted transactions per second (an attempt
//! is a run that committed, aborted on a conflict, or was rolled back by
//! its logic), the abort rate per type, the latency of a committed
//! transaction from its first attempt (p50, p99), and the runtime's round
//! trips and bytes per committed transaction. On a real fabric also the
//! attempts per CPU second of the worker threads (their CPU clocks), and
//! the local peer's likewise: on a machine shared with other work, the
//! wall-clock ratio of two runs made one after the other is as much the
//! other work's share of the processors as either side's speed.
//!
//! With `read_only` only the workload's read-only types are drawn; with
//! `local_peer` (TATP) the same read-only transactions also run, before
//! the remote run and for as long, on a local in-process peer: the loaded
//! records (the same bytes: key, payload, lock, version) copied into a
//! concurrent in-memory map, each transaction doing the same look-ups,
//! copies and checks.
//!
//! On the simulator ([`TxnPlatform::Sim`]) the same tasks run on virtual
//! threads (`threads` on each compute machine) in virtual time, with the
//! verbs counted over the measured window; this is what `dmkit sim
//! reproduce smart-fig10|smart-fig11` runs. The local peer is wall-clock
//! work and runs on shm only.

use std::cell::{Cell, RefCell};
use std::rc::Rc;
use std::sync::Arc;
use std::time::Duration;

use dmkit_fabric::Fabric;
use dmkit_runtime::rng::Rng;
use dmkit_runtime::stats::Counters;
use dmkit_runtime::{RuntimeConfig, Worker};
use dmkit_sim::{Sim, SimConfig};
use dmkit_txn::workload::smallbank::SmallBank;
use dmkit_txn::workload::tatp::Tatp;
use dmkit_txn::workload::tpcc::Tpcc;
use dmkit_txn::workload::Workload;
use dmkit_txn::{addr_cache, Coordinator, Database, TxnConfig, TxnError};
use hdrhistogram::Histogram;
use serde::Serialize;

use crate::harness::{self, Arrival, TaskWindow};

/// Which workload.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TxnWorkload {
    /// SmallBank (six types, 85 % read-write).
    SmallBank,
    /// TATP (seven types, 80 % read-only).
    Tatp,
    /// TPC-C NewOrder and Payment.
    Tpcc,
}

impl std::str::FromStr for TxnWorkload {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "smallbank" => Ok(Self::SmallBank),
            "tatp" => Ok(Self::Tatp),
            "tpcc" => Ok(Self::Tpcc),
            _ => Err(format!("{s:?}: expected smallbank, tatp or tpcc")),
        }
    }
}

/// What to run.
#[derive(Debug, Clone)]
pub struct TxnBenchConfig {
    /// The workload.
    pub workload: TxnWorkload,
    /// Its scale: SmallBank accounts, TATP subscribers, TPC-C warehouses
    /// (0: FORD's defaults — 100,000 accounts, 100,000 subscribers, one
    /// warehouse).
    pub scale: u64,
    /// Worker threads.
    pub threads: usize,
    /// Tasks (coordinators) per thread.
    pub coros: usize,
    /// Measured time (wall-clock; virtual on the simulator).
    pub duration: Duration,
    /// Time before the measured window opens (transactions ending in it
    /// are not counted).
    pub warmup: Duration,
    /// Time a task idles after each commit (SMART's artifact's
    /// `IDLE_USEC`, which lowers the offered load for Figure 11's
    /// throughput–latency curve); 0: none.
    pub idle: Duration,
    /// The database's configuration (FORD's switches, replicas).
    pub txn: TxnConfig,
    /// The runtime's (SMART's switches).
    pub runtime: RuntimeConfig,
    /// Seed of the drawn transactions and the population.
    pub seed: u64,
    /// Draw only the workload's read-only transaction types.
    pub read_only: bool,
    /// TATP: also run the local in-process peer (read-only types).
    pub local_peer: bool,
}

/// Per transaction type.
#[derive(Debug, Clone, Serialize)]
pub struct TypeResult {
    /// Its name.
    pub name: String,
    /// Attempts.
    pub attempted: u64,
    /// Commits.
    pub committed: u64,
    /// Conflict aborts over attempts.
    pub abort_rate: f64,
}

/// What a run measured (the JSON of `--json`).
#[derive(Debug, Clone, Serialize)]
pub struct TxnResult {
    /// The workload's name.
    pub workload: String,
    /// Where it ran: the fabric backend's name or `sim`.
    pub backend: String,
    /// Threads.
    pub threads: usize,
    /// Tasks per thread.
    pub coros: usize,
    /// Measured seconds.
    pub seconds: f64,
    /// Committed transactions.
    pub committed: u64,
    /// Attempts (commits, conflict aborts, logic roll-backs).
    pub attempted: u64,
    /// Committed per second.
    pub committed_per_s: f64,
    /// Attempted per second.
    pub attempted_per_s: f64,
    /// Conflict aborts over attempts.
    pub abort_rate: f64,
    /// Per type.
    pub types: Vec<TypeResult>,
    /// Median latency of a committed transaction from its first attempt (µs).
    pub p50_us: f64,
    /// Its 99th percentile (µs).
    pub p99_us: f64,
    /// Runtime round trips (`sync`s that waited) per committed transaction.
    pub round_trips_per_txn: f64,
    /// Bytes READ plus WRITTEN per committed transaction.
    pub bytes_per_txn: f64,
    /// The consistency conditions, replicas and locks checked after the run.
    pub invariants_ok: bool,
    /// What failed, if they did not hold.
    pub invariants_error: Option<String>,
    /// FORD's switches.
    pub hitchhike: bool,
    /// Reads served by backups.
    pub backup_reads: bool,
    /// Coalescent commit.
    pub coalescent_commit: bool,
    /// Absent keys' would-be slots in the address cache.
    pub cache_absent: bool,
    /// Copies of every record.
    pub replicas: usize,
    /// Only read-only types were drawn.
    pub read_only: bool,
    /// The local peer's attempted transactions per second (TATP,
    /// read-only types, same threads and duration), if it ran.
    pub local_attempted_per_s: Option<f64>,
    /// `attempted_per_s` over the local peer's.
    pub vs_local: Option<f64>,
    /// CPU seconds the worker threads ran, from the start barrier to
    /// their end (a real fabric only; warm-up included).
    pub cpu_seconds: Option<f64>,
    /// Attempts of the window per CPU second of the worker threads: the
    /// rate with the machine's other load taken out (as far as the cache
    /// it shares is not), for comparing runs on a busy machine.
    pub attempted_per_cpu_s: Option<f64>,
    /// The local peer's attempts per CPU second of its threads.
    pub local_attempted_per_cpu_s: Option<f64>,
    /// `attempted_per_cpu_s` over the local peer's.
    pub vs_local_cpu: Option<f64>,
    /// Each task's idle time after a commit (µs).
    pub idle_us: f64,
    /// Work requests the simulator executed in the whole run (0 off it).
    pub sim_verbs: u64,
    /// Ctrl-C ended the window early: `seconds` is the shortened window.
    pub interrupted: bool,
}

fn histogram() -> Histogram<u64> {
    Histogram::new_with_bounds(1, 100_000_000_000, 3).expect("valid bounds")
}

struct ThreadOut {
    attempted: Vec<u64>,
    committed: Vec<u64>,
    aborts: Vec<u64>,
    effect: i64,
    lat: Histogram<u64>,
    round_trips: u64,
    bytes: u64,
    failure: Option<String>,
    /// CPU time of the thread (ns; 0 on the simulator).
    cpu_ns: u64,
}

/// Where a run happens.
pub enum TxnPlatform {
    /// A real fabric (shm, verbs): `threads` OS threads, wall-clock time.
    Fabric(Arc<dyn Fabric>),
    /// The simulator: `threads` virtual threads on each of its compute
    /// machines, virtual time; the database lives on its memory nodes.
    Sim(Box<SimConfig>),
}

/// Creates the database on `fabric`, loads the workload, runs it and
/// checks it; destroys the database after.
pub fn run_txn(fabric: Arc<dyn Fabric>, cfg: &TxnBenchConfig) -> Result<TxnResult, String> {
    run_txn_on(TxnPlatform::Fabric(fabric), cfg)
}

/// [`run_txn`] on either platform.
pub fn run_txn_on(platform: TxnPlatform, cfg: &TxnBenchConfig) -> Result<TxnResult, String> {
    let s = cfg.scale;
    match cfg.workload {
        TxnWorkload::SmallBank => {
            let w = if s == 0 {
                SmallBank::default()
            } else {
                SmallBank {
                    accounts: s,
                    hot: (s / 25).max(1),
                }
            };
            run_with(platform, cfg, w)
        }
        TxnWorkload::Tatp => {
            let mut w = Tatp {
                seed: cfg.seed,
                ..Tatp::default()
            };
            if s != 0 {
                w.subscribers = s;
            }
            let peer = cfg.local_peer.then(|| {
                let w2 = w;
                Box::new(move |db: &Database| local_tatp(db, &w2, cfg)) as Peer<'_>
            });
            run_peer(platform, cfg, w, peer)
        }
        TxnWorkload::Tpcc => {
            let mut w = Tpcc {
                seed: cfg.seed,
                ..Tpcc::default()
            };
            if s != 0 {
                w.warehouses = s;
            }
            run_with(platform, cfg, w)
        }
    }
}

/// What the local peer measured: attempts per second and per CPU second.
struct PeerRun {
    per_s: f64,
    per_cpu_s: f64,
}

type Peer<'a> = Box<dyn FnOnce(&Database) -> Result<PeerRun, String> + 'a>;

fn run_with<W: Workload + 'static>(
    platform: TxnPlatform,
    cfg: &TxnBenchConfig,
    w: W,
) -> Result<TxnResult, String> {
    if cfg.local_peer {
        return Err("the local peer runs TATP only".into());
    }
    run_peer(platform, cfg, w, None)
}

fn run_peer<W: Workload + 'static>(
    platform: TxnPlatform,
    cfg: &TxnBenchConfig,
    w: W,
    peer: Option<Peer<'_>>,
) -> Result<TxnResult, String> {
    let e = |e: TxnError| e.to_string();
    let (fabric, mut sim) = match platform {
        TxnPlatform::Fabric(f) => (f, None),
        TxnPlatform::Sim(sc) => {
            if peer.is_some() {
                return Err("the local peer runs on shm only (it is wall-clock work)".into());
            }
            let machines = sc.compute_machines;
            let sim = Sim::new(*sc).map_err(|e| format!("simulator: {e}"))?;
            (sim.dyn_fabric(), Some((sim, machines)))
        }
    };
    let db = Database::create(fabric, "bench-txn", cfg.txn.clone(), &w.tables()).map_err(e)?;
    let out = (|| {
        w.load(&db).map_err(e)?;
        let local = peer.map(|p| p(&db)).transpose()?;
        let w = Arc::new(w);
        let (outs, timed, sim_verbs) = match sim.as_mut() {
            // The harness's discipline: a start barrier once every thread
            // has built its worker and coordinators, one global window
            // after the warm-up, transactions counted where they end.
            None => {
                let (timed, outs) = harness::run_threads(
                    cfg.threads,
                    cfg.warmup,
                    cfg.duration,
                    |ti, window, arrival| {
                        thread(&db, &w, ti, cfg, TaskWindow::Wall(window.clone()), arrival)
                    },
                    |_| {},
                );
                (outs, timed, 0)
            }
            Some((sim, machines)) => on_sim(sim, *machines, &db, &w, cfg)?,
        };
        let secs = timed.seconds;
        let kinds = w.types().len();
        let mut lat = histogram();
        let (mut att, mut com, mut abo) = (vec![0; kinds], vec![0; kinds], vec![0; kinds]);
        let (mut effect, mut rts, mut bytes, mut cpu_ns) = (0i64, 0u64, 0u64, 0u64);
        for o in outs {
            let o = o?;
            if let Some(f) = o.failure {
                return Err(f);
            }
            for k in 0..kinds {
                att[k] += o.attempted[k];
                com[k] += o.committed[k];
                abo[k] += o.aborts[k];
            }
            effect += o.effect;
            rts += o.round_trips;
            bytes += o.bytes;
            cpu_ns += o.cpu_ns;
            lat.add(&o.lat).expect("same bounds");
        }
        let check = w
            .check(&db, effect)
            .and_then(|()| db.check_replicas())
            .and_then(|()| match db.stuck_records().map_err(|e| e.to_string())? {
                0 => Ok(()),
                n => Err(format!("{n} records left locked or dirty")),
            });
        let (committed, attempted): (u64, u64) = (com.iter().sum(), att.iter().sum());
        let per = |x: u64| x as f64 / committed.max(1) as f64;
        let cpu = (sim.is_none() && cpu_ns > 0).then(|| cpu_ns as f64 / 1e9);
        let per_cpu = cpu.map(|c| attempted as f64 / c);
        Ok(TxnResult {
            workload: w.name().into(),
            backend: if sim.is_some() {
                "sim"
            } else {
                db.fabric().backend()
            }
            .into(),
            threads: cfg.threads,
            coros: cfg.coros,
            seconds: secs,
            committed,
            attempted,
            committed_per_s: harness::rate(committed as f64, secs),
            attempted_per_s: harness::rate(attempted as f64, secs),
            abort_rate: abo.iter().sum::<u64>() as f64 / attempted.max(1) as f64,
            types: (0..kinds)
                .map(|k| TypeResult {
                    name: w.types()[k].into(),
                    attempted: att[k],
                    committed: com[k],
                    abort_rate: abo[k] as f64 / att[k].max(1) as f64,
                })
                .collect(),
            p50_us: lat.value_at_quantile(0.5) as f64 / 1000.0,
            p99_us: lat.value_at_quantile(0.99) as f64 / 1000.0,
            round_trips_per_txn: per(rts),
            bytes_per_txn: per(bytes),
            invariants_ok: check.is_ok(),
            invariants_error: check.err(),
            hitchhike: cfg.txn.hitchhike,
            backup_reads: cfg.txn.backup_reads,
            coalescent_commit: cfg.txn.coalescent_commit,
            cache_absent: cfg.txn.cache_absent,
            replicas: cfg.txn.replicas,
            read_only: cfg.read_only,
            idle_us: cfg.idle.as_nanos() as f64 / 1000.0,
            local_attempted_per_s: local.as_ref().map(|l| l.per_s),
            vs_local: local
                .as_ref()
                .map(|l| harness::rate(attempted as f64, secs) / l.per_s),
            cpu_seconds: cpu,
            attempted_per_cpu_s: per_cpu,
            local_attempted_per_cpu_s: local.as_ref().map(|l| l.per_cpu_s),
            vs_local_cpu: local.as_ref().zip(per_cpu).map(|(l, r)| r / l.per_cpu_s),
            sim_verbs,
            interrupted: timed.interrupted,
        })
    })();
    db.destroy().map_err(e)?;
    out
}

/// The threads' tallies, the window as measured and the work requests
/// the simulator executed (0 off it).
type Measured = (Vec<Result<ThreadOut, String>>, harness::Timed, u64);

/// A thread's tallies, shared by its tasks.
#[derive(Clone)]
struct Tally {
    attempted: Rc<RefCell<Vec<u64>>>,
    committed: Rc<RefCell<Vec<u64>>>,
    aborts: Rc<RefCell<Vec<u64>>>,
    effect: Rc<Cell<i64>>,
    lat: Rc<RefCell<Histogram<u64>>>,
    failure: Rc<RefCell<Option<String>>>,
}

impl Tally {
    fn new(kinds: usize) -> Self {
        Tally {
            attempted: Rc::new(RefCell::new(vec![0; kinds])),
            committed: Rc::new(RefCell::new(vec![0; kinds])),
            aborts: Rc::new(RefCell::new(vec![0; kinds])),
            effect: Rc::default(),
            lat: Rc::new(RefCell::new(histogram())),
            failure: Rc::default(),
        }
    }

    fn out(&self, counters: &Counters) -> ThreadOut {
        ThreadOut {
            attempted: self.attempted.borrow().clone(),
            committed: self.committed.borrow().clone(),
            aborts: self.aborts.borrow().clone(),
            effect: self.effect.get(),
            lat: self.lat.borrow().clone(),
            round_trips: counters.round_trips,
            bytes: counters.bytes_read + counters.bytes_written,
            failure: self.failure.borrow_mut().take(),
            cpu_ns: 0,
        }
    }
}

/// Spawns thread `ti`'s `cfg.coros` tasks on `wk`: each a coordinator
/// running drawn transactions (each retried until it commits or its logic
/// rolls it back) until `window` is over, idling `cfg.idle` after each
/// commit. Attempts, commits and latencies count when the transaction
/// ends inside `window` (`TaskWindow::Wall` or `VirtualEnd`); the effects
/// on the data (SmallBank's balance) count always.
fn spawn_tasks<W: Workload + 'static>(
    wk: &mut Worker,
    coords: Vec<Coordinator>,
    w: &Arc<W>,
    ti: usize,
    cfg: &TxnBenchConfig,
    window: &TaskWindow,
) -> Tally {
    let tally = Tally::new(w.types().len());
    let read_only = cfg.read_only;
    let idle = cfg.idle.as_nanos() as u64;
    for (k, mut coord) in coords.into_iter().enumerate() {
        let (w, t, window) = (w.clone(), tally.clone(), window.clone());
        let mut rng = Rng::new(cfg.seed.wrapping_mul(1_000_003) + (ti * 1000 + k) as u64 + 1);
        wk.spawn(move |ctx| async move {
            // One clock reading per transaction (on shm it costs as much
            // as a small verb): where one ends, the next begins — drawing
            // it is in its latency (nothing on the simulator, whose clock
            // stands still while a task runs).
            let mut now = ctx.now();
            while !window.over(now) {
                let mut tx = w.draw(&mut rng);
                while read_only && !w.read_only(&tx) {
                    tx = w.draw(&mut rng);
                }
                let kind = w.kind(&tx);
                let t0 = now;
                let (mut attempts, mut aborts) = (0u64, 0u64);
                let committed = loop {
                    attempts += 1;
                    match w.run(&mut coord, &ctx, &tx).await {
                        Ok(d) => {
                            t.effect.set(t.effect.get() + d);
                            break true;
                        }
                        Err(TxnError::UserAbort) => break false,
                        Err(e) if e.retryable() => aborts += 1,
                        Err(e) => {
                            t.failure.borrow_mut().get_or_insert(format!("{tx:?}: {e}"));
                            return;
                        }
                    }
                };
                now = ctx.now();
                if window.counts(t0, now) {
                    t.attempted.borrow_mut()[kind] += attempts;
                    t.aborts.borrow_mut()[kind] += aborts;
                    if committed {
                        t.committed.borrow_mut()[kind] += 1;
                        let _ = t.lat.borrow_mut().record((now - t0).max(1));
                    }
                }
                if committed && idle > 0 {
                    ctx.sleep(idle).await;
                    now = ctx.now();
                }
            }
        });
    }
    tally
}

/// A thread's `cfg.coros` coordinators, sharing one address cache.
fn coordinators(db: &Arc<Database>, cfg: &TxnBenchConfig) -> Result<Vec<Coordinator>, String> {
    let cache = addr_cache();
    (0..cfg.coros)
        .map(|_| db.coordinator(&cache).map_err(|e| e.to_string()))
        .collect()
}

/// Thread `ti` on a real fabric: builds its worker and coordinators,
/// waits at the start barrier, runs its tasks until the window closes.
fn thread<W: Workload + 'static>(
    db: &Arc<Database>,
    w: &Arc<W>,
    ti: usize,
    cfg: &TxnBenchConfig,
    window: TaskWindow,
    arrival: &mut Arrival<'_>,
) -> Result<ThreadOut, String> {
    let built = Worker::builder(db.fabric().as_ref())
        .config(RuntimeConfig {
            seed: cfg.seed + ti as u64,
            ..cfg.runtime.clone()
        })
        .id(ti)
        .tasks(cfg.coros)
        .local(db.local_layout())
        .build()
        .map_err(|e| e.to_string());
    // A thread that fails here leaves through its `Arrival`, which
    // arrives for it and closes the window, so nobody waits for ever.
    let mut wk = built?;
    let coords = coordinators(db, cfg)?;
    let tally = spawn_tasks(&mut wk, coords, w, ti, cfg, &window);
    arrival.arrive();
    let cpu0 = thread_cpu_ns();
    wk.run();
    let cpu_ns = thread_cpu_ns().saturating_sub(cpu0);
    // Statistics of the whole run (warm-up included) per committed
    // transaction of the window: equal shares when warm-up is 0.
    Ok(ThreadOut {
        cpu_ns,
        ..tally.out(&wk.stats().counters)
    })
}

/// The run on the simulator: `cfg.threads` virtual threads on each
/// compute machine, their verbs counted over the window. Returns the
/// threads' tallies, the window's seconds and the work requests the
/// simulator executed.
fn on_sim<W: Workload + 'static>(
    sim: &mut Sim,
    machines: usize,
    db: &Arc<Database>,
    w: &Arc<W>,
    cfg: &TxnBenchConfig,
) -> Result<Measured, String> {
    let mut threads = Vec::new();
    for ti in 0..cfg.threads * machines {
        let th = sim
            .add_worker(ti / cfg.threads, |f: &dyn Fabric, clock| {
                Worker::builder(f)
                    .clock(clock)
                    .config(RuntimeConfig {
                        seed: cfg.seed + ti as u64,
                        op_stats: false,
                        ..cfg.runtime.clone()
                    })
                    .id(ti)
                    .tasks(cfg.coros)
                    .local(db.local_layout())
                    .build()
            })
            .map_err(|e| e.to_string())?;
        threads.push((th, coordinators(db, cfg)?));
    }
    // The set-up (queue pairs, coordinator ids: control RPCs to the memory
    // nodes' CPUs, charged in virtual time) is over before the clock
    // starts.
    sim.run();
    let from = sim.now() + cfg.warmup.as_nanos() as u64;
    let until = from + cfg.duration.as_nanos() as u64;
    let window = TaskWindow::VirtualEnd { from, until };
    let threads = threads
        .into_iter()
        .enumerate()
        .map(|(ti, (th, coords))| {
            let tally = spawn_tasks(sim.worker_mut(th), coords, w, ti, cfg, &window);
            sim.wake(th);
            (th, tally)
        })
        .collect::<Vec<_>>();
    sim.run_until(from);
    let before: Vec<Counters> = threads
        .iter()
        .map(|(th, _)| sim.thread_stats(*th).counters)
        .collect();
    sim.run_until(until);
    let after: Vec<Counters> = threads
        .iter()
        .map(|(th, _)| sim.thread_stats(*th).counters)
        .collect();
    // The transactions under way finish (their locks released), so the
    // checks see a quiescent database.
    sim.run();
    let outs = threads
        .iter()
        .zip(before.iter().zip(&after))
        .map(|((th, t), (b, a))| {
            if sim.worker_mut(*th).live_tasks() > 0 {
                return Err("a virtual thread blocked forever".to_string());
            }
            Ok(t.out(&a.since(b)))
        })
        .collect();
    let timed = harness::Timed {
        seconds: cfg.duration.as_secs_f64(),
        interrupted: false,
    };
    Ok((outs, timed, sim.stats().posted))
}

/// This thread's CPU time (ns; 0 if the clock cannot be read).
fn thread_cpu_ns() -> u64 {
    nix::time::clock_gettime(nix::time::ClockId::CLOCK_THREAD_CPUTIME_ID)
        .map(|t| t.tv_sec() as u64 * 1_000_000_000 + t.tv_nsec() as u64)
        .unwrap_or(0)
}

/// The local peer: TATP's read-only transactions on the loaded records
/// copied into a concurrent map (table, key) → record bytes; `threads`
/// threads for `duration`. Returns attempted transactions per second and
/// per CPU second of its threads.
fn local_tatp(db: &Database, w: &Tatp, cfg: &TxnBenchConfig) -> Result<PeerRun, String> {
    use dmkit_txn::workload::tatp::{
        cf_key, sf_key, TatpTxn, ACCESS_INFO, CALL_FORWARDING, SPECIAL_FACILITY, SUBSCRIBER,
    };
    let map: dashmap::DashMap<(u16, u64), Vec<u8>> = dashmap::DashMap::new();
    for t in 0..db.table_count() as u16 {
        for r in db.scan(t).map_err(|e| e.to_string())? {
            if r.version.present() {
                // The record's bytes as the remote layout holds them.
                let mut rec = r.key.to_le_bytes().to_vec();
                rec.extend_from_slice(&r.payload);
                rec.extend_from_slice(&r.lock.to_le_bytes());
                rec.extend_from_slice(&r.version.0.to_le_bytes());
                map.insert((t, r.key), rec);
            }
        }
    }
    let word = |rec: &[u8], k: usize| {
        u64::from_le_bytes(rec[8 + 8 * k..16 + 8 * k].try_into().expect("8 bytes"))
    };
    // A look-up copies the record out, as a READ does.
    let get = |t: u16, k: u64| map.get(&(t, k)).map(|r| r.value().clone());
    // The same discipline as the remote run: a start barrier, one window
    // after the warm-up, transactions counted where they end.
    let (timed, outs) = harness::run_threads(
        cfg.threads,
        cfg.warmup,
        cfg.duration,
        |ti, window, arrival| -> Result<(u64, u64), String> {
            let mut rng = Rng::new(cfg.seed.wrapping_mul(7_000_001) + ti as u64 + 1);
            let mut n = 0u64;
            let mut found = 0u64;
            arrival.arrive();
            let cpu0 = thread_cpu_ns();
            let mut t = harness::now();
            while !window.done(t) {
                let mut tx = w.draw(&mut rng);
                while !w.read_only(&tx) {
                    tx = w.draw(&mut rng);
                }
                let ok = match tx {
                    TatpTxn::GetSubscriberData { s } => get(SUBSCRIBER, s).is_some(),
                    TatpTxn::GetNewDestination { s, sf, start, end } => {
                        let f = get(SPECIAL_FACILITY, sf_key(s, sf));
                        let cfs: Vec<_> = [0u64, 8, 16]
                            .into_iter()
                            .filter(|&st| st <= start)
                            .map(|st| get(CALL_FORWARDING, cf_key(s, sf, st)))
                            .collect();
                        f.is_some_and(|f| word(&f, 0) == 1)
                            && cfs.iter().flatten().any(|c| end < word(c, 0))
                    }
                    TatpTxn::GetAccessData { s, ai } => {
                        get(ACCESS_INFO, dmkit_txn::workload::tatp::ai_key(s, ai)).is_some()
                    }
                    _ => unreachable!("read-only types only"),
                };
                found += ok as u64;
                t = harness::now();
                n += window.counts(t) as u64;
            }
            std::hint::black_box(found);
            Ok((n, thread_cpu_ns().saturating_sub(cpu0)))
        },
        |_| {},
    );
    let (mut total, mut cpu_ns) = (0u64, 0u64);
    for o in outs {
        let (n, c) = o?;
        total += n;
        cpu_ns += c;
    }
    Ok(PeerRun {
        per_s: harness::rate(total as f64, timed.seconds),
        per_cpu_s: total as f64 / (cpu_ns.max(1) as f64 / 1e9),
    })
}
