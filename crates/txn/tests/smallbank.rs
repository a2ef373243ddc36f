//! SmallBank on shm threads: every committed history is serializable, the
//! total balance is conserved exactly, replicas end byte-identical — under
//! each of FORD's switches.

mod common;

use std::sync::Arc;

use dmkit_index::conformance::shm_fabric;
use dmkit_runtime::RuntimeConfig;
use dmkit_txn::workload::smallbank::SmallBank;
use dmkit_txn::workload::Workload;
use dmkit_txn::{check_serializable, TxnConfig};

fn contended(cfg: TxnConfig, name: &str) {
    let f = shm_fabric(2, 64 << 20);
    // Few accounts: most transactions conflict.
    let w = Arc::new(SmallBank {
        accounts: 200,
        hot: 20,
    });
    let db = common::loaded(f, name, cfg, w.as_ref());
    let out = common::run_threads(&db, &w, 3, 4, 150, 7, RuntimeConfig::default());
    assert!(out.committed > 1000, "committed {}", out.committed);
    assert!(out.aborts > 0, "a contended run aborts some transactions");
    check_serializable(&out.history, &[]).unwrap();
    w.check(&db, out.effect).unwrap();
    db.check_replicas().unwrap();
    assert_eq!(db.stuck_records().unwrap(), 0);
    db.destroy().unwrap();
}

#[test]
fn contended_smallbank_is_serializable_and_conserves_money() {
    contended(common::config(), "sb-all-on");
}

#[test]
fn without_hitchhiking_backup_reads_or_coalescent_commit() {
    let cfg = TxnConfig {
        hitchhike: false,
        backup_reads: false,
        coalescent_commit: false,
        ..common::config()
    };
    contended(cfg, "sb-all-off");
}

#[test]
fn three_replicas_on_three_nodes() {
    let f = shm_fabric(3, 32 << 20);
    let w = Arc::new(SmallBank {
        accounts: 100,
        hot: 10,
    });
    let cfg = TxnConfig {
        replicas: 3,
        ..common::config()
    };
    let db = common::loaded(f, "sb-3", cfg, w.as_ref());
    let out = common::run_threads(&db, &w, 2, 4, 100, 3, RuntimeConfig::default());
    check_serializable(&out.history, &[]).unwrap();
    w.check(&db, out.effect).unwrap();
    db.check_replicas().unwrap();
}
