//! TATP and TPC-C (NewOrder + Payment) on shm threads: serializable
//! histories, the workloads' consistency conditions, identical replicas.

mod common;

use std::sync::Arc;

use dmkit_index::conformance::shm_fabric;
use dmkit_runtime::RuntimeConfig;
use dmkit_txn::check_serializable;
use dmkit_txn::workload::tatp::Tatp;
use dmkit_txn::workload::tpcc::Tpcc;
use dmkit_txn::workload::Workload;

#[test]
fn tatp_keeps_its_conditions() {
    let f = shm_fabric(2, 64 << 20);
    let w = Arc::new(Tatp {
        subscribers: 200,
        seed: 3,
    });
    let db = common::loaded(f, "tatp", common::config(), w.as_ref());
    w.check(&db, 0).unwrap();
    let out = common::run_threads(&db, &w, 2, 4, 300, 5, RuntimeConfig::default());
    assert!(
        out.committed > 1000 && out.user_aborts > 0,
        "{} committed, {} rolled back",
        out.committed,
        out.user_aborts
    );
    check_serializable(&out.history, &[]).unwrap();
    w.check(&db, 0).unwrap();
    db.check_replicas().unwrap();
    db.destroy().unwrap();
}

#[test]
fn tpcc_keeps_conditions_one_to_four() {
    let f = shm_fabric(2, 128 << 20);
    let w = Arc::new(Tpcc {
        warehouses: 2,
        customers: 30,
        items: 500,
        new_orders: 4000,
        seed: 2,
    });
    let db = common::loaded(f, "tpcc", common::config(), w.as_ref());
    w.check(&db, 0).unwrap();
    let out = common::run_threads(&db, &w, 2, 4, 60, 9, RuntimeConfig::default());
    assert!(out.committed > 300, "{} committed", out.committed);
    check_serializable(&out.history, &[]).unwrap();
    w.check(&db, 0).unwrap();
    db.check_replicas().unwrap();
    db.destroy().unwrap();
}
