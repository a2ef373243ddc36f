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
//! trips and bytes per committed transaction.
//!
//! Not here: the simulator (its workers run on virtual threads; see
//! `dmkit sim check --scenario txn`), and a local in-process peer.

use std::cell::{Cell, RefCell};
use std::rc::Rc;
use std::sync::Arc;
use std::time::{Duration, Instant};

use dmkit_fabric::Fabric;
use dmkit_runtime::rng::Rng;
use dmkit_runtime::{RuntimeConfig, Worker};
use dmkit_txn::workload::smallbank::SmallBank;
use dmkit_txn::workload::tatp::Tatp;
use dmkit_txn::workload::tpcc::Tpcc;
use dmkit_txn::workload::Workload;
use dmkit_txn::{addr_cache, Database, TxnConfig, TxnError};
use hdrhistogram::Histogram;
use serde::Serialize;

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
    /// Measured wall-clock time.
    pub duration: Duration,
    /// The database's configuration (FORD's switches, replicas).
    pub txn: TxnConfig,
    /// The runtime's (SMART's switches).
    pub runtime: RuntimeConfig,
    /// Seed of the drawn transactions and the population.
    pub seed: u64,
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
    /// Copies of every record.
    pub replicas: usize,
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
}

/// Creates the database on `fabric`, loads the workload, runs it and
/// checks it; destroys the database after.
pub fn run_txn(fabric: Arc<dyn Fabric>, cfg: &TxnBenchConfig) -> Result<TxnResult, String> {
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
            run_with(fabric, cfg, w)
        }
        TxnWorkload::Tatp => {
            let mut w = Tatp {
                seed: cfg.seed,
                ..Tatp::default()
            };
            if s != 0 {
                w.subscribers = s;
            }
            run_with(fabric, cfg, w)
        }
        TxnWorkload::Tpcc => {
            let mut w = Tpcc {
                seed: cfg.seed,
                ..Tpcc::default()
            };
            if s != 0 {
                w.warehouses = s;
            }
            run_with(fabric, cfg, w)
        }
    }
}

fn run_with<W: Workload + 'static>(
    fabric: Arc<dyn Fabric>,
    cfg: &TxnBenchConfig,
    w: W,
) -> Result<TxnResult, String> {
    let e = |e: TxnError| e.to_string();
    let db = Database::create(fabric, "bench-txn", cfg.txn.clone(), &w.tables()).map_err(e)?;
    let out = (|| {
        w.load(&db).map_err(e)?;
        let w = Arc::new(w);
        let start = Instant::now();
        let end = start + cfg.duration;
        let outs: Vec<Result<ThreadOut, String>> = std::thread::scope(|s| {
            let hs: Vec<_> = (0..cfg.threads)
                .map(|ti| {
                    let (db, w) = (db.clone(), w.clone());
                    s.spawn(move || thread(&db, &w, ti, cfg, end))
                })
                .collect();
            hs.into_iter()
                .map(|h| {
                    h.join()
                        .map_err(|_| "a worker thread panicked".to_string())?
                })
                .collect()
        });
        let secs = start.elapsed().as_secs_f64();
        let kinds = w.types().len();
        let mut lat = histogram();
        let (mut att, mut com, mut abo) = (vec![0; kinds], vec![0; kinds], vec![0; kinds]);
        let (mut effect, mut rts, mut bytes) = (0i64, 0u64, 0u64);
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
        Ok(TxnResult {
            workload: w.name().into(),
            threads: cfg.threads,
            coros: cfg.coros,
            seconds: secs,
            committed,
            attempted,
            committed_per_s: committed as f64 / secs,
            attempted_per_s: attempted as f64 / secs,
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
            replicas: cfg.txn.replicas,
        })
    })();
    db.destroy().map_err(e)?;
    out
}

fn thread<W: Workload + 'static>(
    db: &Arc<Database>,
    w: &Arc<W>,
    ti: usize,
    cfg: &TxnBenchConfig,
    end: Instant,
) -> Result<ThreadOut, String> {
    let mut wk = Worker::builder(db.fabric().as_ref())
        .config(RuntimeConfig {
            seed: cfg.seed + ti as u64,
            ..cfg.runtime.clone()
        })
        .id(ti)
        .tasks(cfg.coros)
        .local(db.local_layout())
        .build()
        .map_err(|e| e.to_string())?;
    let kinds = w.types().len();
    let cache = addr_cache();
    let attempted = Rc::new(RefCell::new(vec![0u64; kinds]));
    let committed = Rc::new(RefCell::new(vec![0u64; kinds]));
    let aborts = Rc::new(RefCell::new(vec![0u64; kinds]));
    let effect = Rc::new(Cell::new(0i64));
    let lat = Rc::new(RefCell::new(histogram()));
    let failure: Rc<RefCell<Option<String>>> = Rc::default();
    for k in 0..cfg.coros {
        let mut coord = db.coordinator(&cache).map_err(|e| e.to_string())?;
        let (w, attempted, committed, aborts, effect, lat, failure) = (
            w.clone(),
            attempted.clone(),
            committed.clone(),
            aborts.clone(),
            effect.clone(),
            lat.clone(),
            failure.clone(),
        );
        let mut rng = Rng::new(cfg.seed.wrapping_mul(1_000_003) + (ti * 1000 + k) as u64 + 1);
        wk.spawn(move |ctx| async move {
            while Instant::now() < end {
                let tx = w.draw(&mut rng);
                let kind = w.kind(&tx);
                let t0 = Instant::now();
                loop {
                    attempted.borrow_mut()[kind] += 1;
                    match w.run(&mut coord, &ctx, &tx).await {
                        Ok(d) => {
                            effect.set(effect.get() + d);
                            committed.borrow_mut()[kind] += 1;
                            let ns = t0.elapsed().as_nanos() as u64;
                            let _ = lat.borrow_mut().record(ns.max(1));
                            break;
                        }
                        Err(TxnError::UserAbort) => break,
                        Err(e) if e.retryable() => aborts.borrow_mut()[kind] += 1,
                        Err(e) => {
                            failure.borrow_mut().get_or_insert(format!("{tx:?}: {e}"));
                            return;
                        }
                    }
                }
            }
        });
    }
    wk.run();
    let st = wk.stats();
    let out = ThreadOut {
        attempted: attempted.borrow().clone(),
        committed: committed.borrow().clone(),
        aborts: aborts.borrow().clone(),
        effect: effect.get(),
        lat: lat.borrow().clone(),
        round_trips: st.counters.round_trips,
        bytes: st.counters.bytes_read + st.counters.bytes_written,
        failure: failure.borrow_mut().take(),
    };
    Ok(out)
}
