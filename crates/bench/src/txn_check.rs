//! `dmkit sim check --scenario txn`: transactions (`dmkit_txn`) on the
//! simulator under fault injection, with a coordinator crashed at a step
//! of commit.
//!
//! Each seed draws a workload (SmallBank, TATP or TPC-C, small and
//! contended), FORD's switches (hitchhiked locking, backup reads,
//! coalescent commit), whether the address cache keeps absent keys, one
//! or two replicas, threads and tasks on two compute machines, and a
//! crash: one coordinator stops at a commit step
//! (before its locks, after them, after its undo log, half-way through its
//! commit writes, or before unlocking) in its n-th transaction. The others
//! go on: they meet its locks, wait for the lease to end, and recover its
//! transaction from its log. After the run a recovery pass settles what is
//! left. Checks: the committed history is serializable (recovery's
//! roll-backs mapped to the versions they restore); the workload's
//! consistency conditions hold (SmallBank's total balance exact); every
//! replica of every shard is byte-identical; no record stays locked or
//! dirty; a transaction crashed before its unlock is never committed.
//!
//! The lease is 2 ms with a skew allowance of 200 µs; the machines'
//! clocks disagree by up to 100 µs ([`SKEW_BOUND`]).

use std::cell::{Cell, RefCell};
use std::rc::Rc;
use std::sync::Arc;

use dmkit_fabric::Fabric;
use dmkit_index::LeaseConfig;
use dmkit_runtime::{RuntimeConfig, Worker};
use dmkit_txn::workload::smallbank::SmallBank;
use dmkit_txn::workload::tatp::Tatp;
use dmkit_txn::workload::tpcc::Tpcc;
use dmkit_txn::workload::{drive, Workload};
use dmkit_txn::{addr_cache, check_serializable, CrashPoint, Database, TxnConfig, TxnError};

use crate::rng::Rng;
use crate::sim_check::{sim_for, Passed, MACHINES};

/// The lease of the scenario's locks.
const LEASE: LeaseConfig = LeaseConfig {
    lease: 2_000_000,
    skew: 200_000,
};

/// The largest clock offset the scenario is checked with: half the lease's
/// skew allowance (offsets within ±B disagree by up to 2B).
pub const SKEW_BOUND: u64 = 100_000;

/// Runs the scenario with `seed`.
pub fn txn(seed: u64) -> Result<Passed, String> {
    let mut r = Rng::new(seed ^ 0x7A11_5EED);
    match seed % 3 {
        0 => {
            let accounts = 20 + r.below(60);
            scenario(seed, &mut r, SmallBank { accounts, hot: 8 })
        }
        1 => {
            let subscribers = 30 + r.below(40);
            scenario(seed, &mut r, Tatp { subscribers, seed })
        }
        _ => scenario(
            seed,
            &mut r,
            Tpcc {
                warehouses: 1,
                customers: 10,
                items: 60,
                new_orders: 2_000,
                seed,
            },
        ),
    }
}

fn scenario<W: Workload + 'static>(seed: u64, r: &mut Rng, w: W) -> Result<Passed, String> {
    let threads = 2 + r.below(3) as usize;
    let tasks = 1 + r.below(3) as usize;
    let txns = 15 + r.below(30);
    let cfg = TxnConfig {
        replicas: 1 + r.below(2) as usize,
        hitchhike: r.below(2) == 0,
        backup_reads: r.below(2) == 0,
        coalescent_commit: r.below(2) == 0,
        // Drawn apart, so the other draws stay those of the seed.
        cache_absent: Rng::new(seed ^ 0x00AB_5E17).below(2) == 0,
        max_coordinators: 64,
        lease: LEASE,
        ..TxnConfig::default()
    };
    let point = CrashPoint::ALL[r.below(5) as usize];
    let nth = 1 + r.below(4);
    let mut sim = sim_for(seed, r, SKEW_BOUND)?;
    let f = sim.dyn_fabric();
    let e = |e: TxnError| e.to_string();
    let db = Database::create(f, "check", cfg.clone(), &w.tables()).map_err(e)?;
    w.load(&db).map_err(e)?;
    let w = Arc::new(w);
    let failure: Rc<RefCell<Option<String>>> = Rc::default();
    let history = Rc::new(RefCell::new(Vec::new()));
    let restored = Rc::new(RefCell::new(Vec::new()));
    let effect = Rc::new(Cell::new(0i64));
    let committed = Rc::new(Cell::new(0u64));
    let crashed: Rc<Cell<Option<u64>>> = Rc::default();
    for t in 0..threads {
        let machine = t % MACHINES;
        let th = sim
            .add_worker(machine, |f: &dyn Fabric, clock| {
                Worker::builder(f)
                    .clock(clock)
                    .config(RuntimeConfig {
                        seed: seed + t as u64,
                        ..RuntimeConfig::default()
                    })
                    .id(t)
                    .tasks(tasks)
                    .local(db.local_layout())
                    .build()
            })
            .map_err(|e| e.to_string())?;
        let cache = addr_cache();
        for k in 0..tasks {
            let mut coord = db.coordinator(&cache).map_err(e)?;
            coord.record_history();
            let victim = t == 0 && k == 0;
            if victim {
                coord.crash_at(point, nth);
            }
            let (w, failure, history, restored, effect, committed, crashed) = (
                w.clone(),
                failure.clone(),
                history.clone(),
                restored.clone(),
                effect.clone(),
                committed.clone(),
                crashed.clone(),
            );
            let mut rng = Rng::new(seed.wrapping_mul(31) + (t * 100 + k) as u64);
            sim.worker_mut(th).spawn(move |ctx| async move {
                let d = drive(w.as_ref(), &mut coord, &ctx, &mut rng, txns).await;
                effect.set(effect.get() + d.effect);
                committed.set(committed.get() + d.committed);
                if d.crashed.is_some() {
                    crashed.set(d.crashed);
                }
                if let Some(f) = d.failure {
                    failure.borrow_mut().get_or_insert(f);
                }
                history.borrow_mut().extend(coord.take_history());
                restored
                    .borrow_mut()
                    .extend(std::mem::take(&mut coord.restored));
            });
        }
    }
    sim.run();
    if let Some(f) = failure.borrow_mut().take() {
        return Err(f);
    }
    // The recovery pass, once every lease has ended.
    let owners = db.coordinators_taken().map_err(e)?;
    let mut rec = db.coordinator(&addr_cache()).map_err(e)?;
    let report: Rc<RefCell<Option<Result<dmkit_txn::RecoveryReport, TxnError>>>> = Rc::default();
    let th = sim
        .add_worker(0, |f: &dyn Fabric, clock| {
            Worker::builder(f)
                .clock(clock)
                .local(db.local_layout())
                .build()
        })
        .map_err(|e| e.to_string())?;
    let rep = report.clone();
    sim.worker_mut(th).spawn(move |ctx| async move {
        ctx.sleep(LEASE.lease + 4 * LEASE.skew).await;
        *rep.borrow_mut() = Some(dmkit_txn::recover_logs(&mut rec, &ctx, owners).await);
    });
    sim.run();
    let report = report
        .borrow_mut()
        .take()
        .ok_or("the recovery task did not finish")?
        .map_err(e)?;
    db.break_stale_locks(sim.now() + 2 * SKEW_BOUND, &report.busy)
        .map_err(e)?;
    restored
        .borrow_mut()
        .extend(report.restored.iter().copied());
    let history = history.borrow();
    if let Some(id) = crashed.get() {
        if history.iter().any(|t| t.id == id) {
            return Err(format!(
                "transaction {id:#x}, crashed at {}, was committed",
                point.name()
            ));
        }
    }
    let stuck = db.stuck_records().map_err(e)?;
    if stuck > 0 {
        return Err(format!(
            "{stuck} records left locked or dirty after recovery"
        ));
    }
    db.check_replicas()?;
    check_serializable(&history, &restored.borrow())?;
    w.check(&db, effect.get())?;
    let stats = sim.stats();
    Ok(Passed {
        ops: committed.get(),
        virtual_ns: sim.now(),
        torn: stats.torn,
        delayed: stats.delayed,
        shape: format!(
            "{}: {threads} threads × {tasks} tasks × {txns} txns, {} replicas, hitchhike {}, \
             backup reads {}, coalescent {}, cache absent {}; crash at {} in txn {nth}{}",
            w.name(),
            cfg.replicas,
            cfg.hitchhike,
            cfg.backup_reads,
            cfg.coalescent_commit,
            cfg.cache_absent,
            point.name(),
            if crashed.get().is_some() {
                " (crashed)"
            } else {
                " (not reached)"
            }
        ),
    })
}
