//! What the transaction tests share: a fabric, a database loaded with a
//! workload, and a contended run on threads whose committed history comes
//! back for the checks.

#![allow(dead_code)]

use std::cell::{Cell, RefCell};
use std::rc::Rc;
use std::sync::Arc;

use dmkit_fabric::Fabric;
use dmkit_index::conformance::shm_fabric;
use dmkit_index::LeaseConfig;
use dmkit_runtime::rng::Rng;
use dmkit_runtime::{Ctx, RuntimeConfig, Worker};
use dmkit_txn::workload::smallbank::SmallBank;
use dmkit_txn::workload::{drive, Workload};
use dmkit_txn::TxnRecord;
use dmkit_txn::{addr_cache, check_serializable, AddrCache, Coordinator, Database, TxnConfig};

/// A lease long enough that a descheduled thread on a loaded two-core
/// machine never loses one (a live holder that does stops, by design).
pub fn long_lease() -> LeaseConfig {
    LeaseConfig {
        lease: 5_000_000_000,
        ..LeaseConfig::default()
    }
}

pub fn config() -> TxnConfig {
    TxnConfig {
        max_coordinators: 256,
        lease: long_lease(),
        ..TxnConfig::default()
    }
}

/// Creates and loads `w`'s database on `fabric`.
pub fn loaded<W: Workload>(
    fabric: Arc<dyn Fabric>,
    name: &str,
    cfg: TxnConfig,
    w: &W,
) -> Arc<Database> {
    let db = Database::create(fabric, name, cfg, &w.tables()).expect("create");
    w.load(&db).expect("load");
    db
}

/// Runs `body` with a coordinator using `cache` on a fresh worker of one
/// task; returns its result and the bytes the worker READ.
pub fn with_txn<T: 'static>(
    db: &Arc<Database>,
    cache: &AddrCache,
    body: impl for<'a> AsyncFnOnce(&'a mut Coordinator, &'a Ctx) -> T + 'static,
) -> (T, u64) {
    let mut w = Worker::builder(db.fabric().as_ref())
        .local(db.local_layout())
        .build()
        .expect("worker");
    let mut coord = db.coordinator(cache).expect("coordinator");
    let out = Rc::new(RefCell::new(None));
    let o = out.clone();
    w.spawn(move |ctx| async move {
        *o.borrow_mut() = Some(body(&mut coord, &ctx).await);
    });
    w.run();
    let r = out.borrow_mut().take().expect("the task finished");
    (r, w.stats().counters.bytes_read)
}

/// What a run returns.
#[derive(Default)]
pub struct RunOut {
    pub history: Vec<TxnRecord>,
    pub effect: i64,
    pub committed: u64,
    pub aborts: u64,
    pub user_aborts: u64,
}

/// `threads` threads × `tasks` tasks, each running `txns` transactions
/// of `w` (each retried until it commits or its logic rolls it back).
pub fn run_threads<W: Workload + 'static>(
    db: &Arc<Database>,
    w: &Arc<W>,
    threads: usize,
    tasks: usize,
    txns: usize,
    seed: u64,
    runtime: RuntimeConfig,
) -> RunOut {
    run_threads_preempted(db, w, threads, tasks, txns, seed, runtime, 0)
}

/// [`run_threads`] with every coordinator preempted at random at its
/// phase boundaries with probability `per_mille`/1000
/// (`Coordinator::preempt_at_random`).
#[allow(clippy::too_many_arguments)]
pub fn run_threads_preempted<W: Workload + 'static>(
    db: &Arc<Database>,
    w: &Arc<W>,
    threads: usize,
    tasks: usize,
    txns: usize,
    seed: u64,
    runtime: RuntimeConfig,
    per_mille: u64,
) -> RunOut {
    let outs: Vec<RunOut> = std::thread::scope(|s| {
        let hs: Vec<_> = (0..threads)
            .map(|ti| {
                let (db, w, runtime) = (db.clone(), w.clone(), runtime.clone());
                s.spawn(move || run_worker(&db, &w, ti, tasks, txns, seed, runtime, per_mille))
            })
            .collect();
        hs.into_iter().map(|h| h.join().expect("thread")).collect()
    });
    let mut all = RunOut::default();
    for o in outs {
        all.history.extend(o.history);
        all.effect += o.effect;
        all.committed += o.committed;
        all.aborts += o.aborts;
        all.user_aborts += o.user_aborts;
    }
    all
}

/// One worker of `tasks` tasks (see [`run_threads_preempted`]).
#[allow(clippy::too_many_arguments)]
pub fn run_worker<W: Workload + 'static>(
    db: &Arc<Database>,
    w: &Arc<W>,
    ti: usize,
    tasks: usize,
    txns: usize,
    seed: u64,
    runtime: RuntimeConfig,
    per_mille: u64,
) -> RunOut {
    let mut wk = Worker::builder(db.fabric().as_ref())
        .config(RuntimeConfig {
            seed: seed + ti as u64,
            ..runtime
        })
        .id(ti)
        .tasks(tasks)
        .local(db.local_layout())
        .build()
        .expect("worker");
    let cache = addr_cache();
    let history = Rc::new(RefCell::new(Vec::new()));
    let (effect, committed, aborts, user) = (
        Rc::new(Cell::new(0i64)),
        Rc::new(Cell::new(0u64)),
        Rc::new(Cell::new(0u64)),
        Rc::new(Cell::new(0u64)),
    );
    let failed: Rc<RefCell<Option<String>>> = Rc::default();
    for k in 0..tasks {
        let mut coord = db.coordinator(&cache).expect("coordinator");
        coord.record_history();
        if per_mille > 0 {
            coord.preempt_at_random(seed ^ (ti * 1000 + k) as u64, per_mille);
        }
        let (w, history, effect, committed, aborts, user, failed) = (
            w.clone(),
            history.clone(),
            effect.clone(),
            committed.clone(),
            aborts.clone(),
            user.clone(),
            failed.clone(),
        );
        let mut rng = Rng::new(seed * 1_000_003 + (ti * 1000 + k) as u64 + 1);
        wk.spawn(move |ctx| async move {
            let d = drive(w.as_ref(), &mut coord, &ctx, &mut rng, txns as u64).await;
            effect.set(effect.get() + d.effect);
            committed.set(committed.get() + d.committed);
            aborts.set(aborts.get() + d.aborts);
            user.set(user.get() + d.user_aborts);
            if let Some(f) = d
                .failure
                .or(d.crashed.map(|t| format!("txn {t:#x} crashed")))
            {
                failed.borrow_mut().get_or_insert(f);
            }
            history.borrow_mut().extend(coord.take_history());
        });
    }
    wk.run();
    if let Some(e) = failed.borrow_mut().take() {
        panic!("worker {ti}: {e}");
    }
    let h = history.borrow_mut().drain(..).collect();
    RunOut {
        history: h,
        effect: effect.get(),
        committed: committed.get(),
        aborts: aborts.get(),
        user_aborts: user.get(),
    }
}

/// A contended SmallBank run on shm threads and every check a quiescent
/// bank must pass: the committed history serializable, the total balance
/// exact, replicas byte-identical, nothing left locked.
pub struct BankRun {
    /// Memory nodes (each replica on its own).
    pub nodes: u16,
    /// Bytes per memory node.
    pub node_bytes: u64,
    /// The bank.
    pub bank: SmallBank,
    pub threads: usize,
    pub tasks: usize,
    pub txns: usize,
    pub seed: u64,
    /// Random preemption at phase boundaries, per mille (0: none).
    pub preempt: u64,
    /// Fewest committed transactions the run must reach (0: no floor).
    pub min_committed: u64,
    /// Whether the run must see aborts (a contended run does).
    pub expect_aborts: bool,
}

impl BankRun {
    /// Runs it on a fresh database `name` with `cfg` and checks it.
    pub fn check(&self, cfg: TxnConfig, name: &str) {
        let f = shm_fabric(self.nodes, self.node_bytes);
        let w = Arc::new(self.bank);
        let db = loaded(f, name, cfg, w.as_ref());
        let out = run_threads_preempted(
            &db,
            &w,
            self.threads,
            self.tasks,
            self.txns,
            self.seed,
            RuntimeConfig::default(),
            self.preempt,
        );
        assert!(
            out.committed >= self.min_committed,
            "committed {} < {}",
            out.committed,
            self.min_committed
        );
        if self.expect_aborts {
            assert!(out.aborts > 0, "a contended run aborts some transactions");
        }
        check_serializable(&out.history, &[]).unwrap();
        w.check(&db, out.effect).unwrap();
        db.check_replicas().unwrap();
        assert_eq!(db.stuck_records().unwrap(), 0);
        db.destroy().unwrap();
    }
}
