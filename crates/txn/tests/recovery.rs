//! Recovery on shm threads: a coordinator stops at each step of commit
//! (before locks, after locks, after its undo log, half-way through its
//! commit writes, before unlocking) while others go on — they meet its
//! locks, wait out the lease and recover its transaction — then a
//! recovery pass settles what is left. After it: no record locked or
//! dirty, replicas byte-identical, the history serializable, SmallBank's
//! total balance exact, and the crashed transaction never committed.
//! (The simulator runs the same over many seeds: `dmkit sim check
//! --scenario txn`.)

mod common;

use std::cell::{Cell, RefCell};
use std::rc::Rc;
use std::sync::Arc;
use std::time::Duration;

use dmkit_index::conformance::shm_fabric;
use dmkit_index::LeaseConfig;
use dmkit_runtime::rng::Rng;
use dmkit_runtime::Worker;
use dmkit_txn::workload::smallbank::SmallBank;
use dmkit_txn::workload::{drive, Workload};
use dmkit_txn::{addr_cache, check_serializable, CrashPoint, Database, TxnConfig};
use dmkit_txn::{Restore, TxnRecord};

/// Short enough that the survivors recover during the run, long enough
/// that a live holder on a loaded machine keeps its leases.
const LEASE: LeaseConfig = LeaseConfig {
    lease: 150_000_000,
    skew: 10_000_000,
};

struct Out {
    history: Vec<TxnRecord>,
    restored: Vec<Restore>,
    effect: i64,
    crashed: Option<u64>,
}

fn worker(
    db: &Arc<Database>,
    w: &Arc<SmallBank>,
    ti: usize,
    tasks: usize,
    txns: usize,
    crash: Option<CrashPoint>,
) -> Out {
    let mut wk = Worker::builder(db.fabric().as_ref())
        .id(ti)
        .tasks(tasks)
        .local(db.local_layout())
        .build()
        .unwrap();
    let cache = addr_cache();
    let history = Rc::new(RefCell::new(Vec::new()));
    let restored = Rc::new(RefCell::new(Vec::new()));
    let effect = Rc::new(Cell::new(0i64));
    let crashed: Rc<Cell<Option<u64>>> = Rc::default();
    let failed: Rc<RefCell<Option<String>>> = Rc::default();
    for k in 0..tasks {
        let mut coord = db.coordinator(&cache).unwrap();
        coord.record_history();
        let victim = k == 0 && crash.is_some();
        if let Some(p) = crash.filter(|_| victim) {
            coord.crash_at(p, 2);
        }
        let (w, history, restored, effect, crashed, failed) = (
            w.clone(),
            history.clone(),
            restored.clone(),
            effect.clone(),
            crashed.clone(),
            failed.clone(),
        );
        let mut rng = Rng::new((ti * 100 + k) as u64 + 1);
        wk.spawn(move |ctx| async move {
            let d = drive(w.as_ref(), &mut coord, &ctx, &mut rng, txns as u64).await;
            effect.set(effect.get() + d.effect);
            if d.crashed.is_some() {
                assert!(victim, "only the victim crashes");
                crashed.set(d.crashed);
            }
            if let Some(f) = d.failure {
                failed.borrow_mut().get_or_insert(f);
            }
            history.borrow_mut().extend(coord.take_history());
            restored
                .borrow_mut()
                .extend(std::mem::take(&mut coord.restored));
        });
    }
    wk.run();
    if let Some(e) = failed.borrow_mut().take() {
        panic!("worker {ti}: {e}");
    }
    let out = Out {
        history: history.borrow_mut().drain(..).collect(),
        restored: restored.borrow_mut().drain(..).collect(),
        effect: effect.get(),
        crashed: crashed.get(),
    };
    out
}

fn crash_and_recover(point: CrashPoint, hitchhike: bool) {
    let f = shm_fabric(2, 16 << 20);
    let w = Arc::new(SmallBank {
        accounts: 40,
        hot: 8,
    });
    let cfg = TxnConfig {
        max_coordinators: 64,
        lease: LEASE,
        hitchhike,
        ..TxnConfig::default()
    };
    let db = common::loaded(
        f,
        &format!("rec-{}-{hitchhike}", point.name()),
        cfg,
        w.as_ref(),
    );
    let outs: Vec<Out> = std::thread::scope(|s| {
        let hs: Vec<_> = (0..2)
            .map(|ti| {
                let (db, w) = (db.clone(), w.clone());
                let crash = (ti == 0).then_some(point);
                s.spawn(move || worker(&db, &w, ti, 3, 60, crash))
            })
            .collect();
        hs.into_iter().map(|h| h.join().unwrap()).collect()
    });
    std::thread::sleep(Duration::from_nanos(LEASE.lease + 3 * LEASE.skew));
    let report = db.recover_all().unwrap();
    let crashed = outs[0].crashed.expect("the victim reached its crash point");
    let mut history = Vec::new();
    let mut restored = report.restored.clone();
    let mut effect = 0;
    for o in outs {
        history.extend(o.history);
        restored.extend(o.restored);
        effect += o.effect;
    }
    let ctx = format!("{} (hitchhike {hitchhike}): {report:?}", point.name());
    assert!(
        history.iter().all(|t| t.id != crashed),
        "{ctx}: the crashed transaction committed"
    );
    assert_eq!(db.stuck_records().unwrap(), 0, "{ctx}");
    db.check_replicas().unwrap_or_else(|e| panic!("{ctx}: {e}"));
    check_serializable(&history, &restored).unwrap_or_else(|e| panic!("{ctx}: {e}"));
    w.check(&db, effect)
        .unwrap_or_else(|e| panic!("{ctx}: {e}"));
    db.destroy().unwrap();
}

#[test]
fn every_crash_point_is_recovered_with_hitchhiking() {
    for p in CrashPoint::ALL {
        crash_and_recover(p, true);
    }
}

#[test]
fn every_crash_point_is_recovered_without_hitchhiking() {
    for p in CrashPoint::ALL {
        crash_and_recover(p, false);
    }
}
