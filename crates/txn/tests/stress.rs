//! Stress on shm threads: more coordinators than cores, each preempted at
//! random at its protocol's phase boundaries (its OS thread yields or
//! sleeps, or its task sleeps so the worker's other tasks run), on a small
//! hot set — the conditions that exposed the four serializability holes
//! fixed before (read-only transactions not checking locks, backups
//! cleaned by a late WRITE, validation before every lock was held, a
//! record read without a version before it). Every committed history is
//! checked for serializability; SmallBank's balance must be exact, the
//! replicas byte-identical, nothing left locked.
//!
//! One run takes about a second on a loaded 2-core machine. The seed of
//! the drawn transactions and preemptions is `DMKIT_TXN_STRESS_SEED`
//! (default 1); the threads' interleaving is the OS's, so repeated runs
//! explore different ones.

mod common;

use std::sync::Arc;

use dmkit_index::conformance::shm_fabric;
use dmkit_runtime::RuntimeConfig;
use dmkit_txn::workload::smallbank::SmallBank;
use dmkit_txn::workload::Workload;
use dmkit_txn::{check_serializable, TxnConfig};

/// Threads: three times the two cores CI has.
const THREADS: usize = 6;
/// Preemption probability per phase boundary, per mille.
const PREEMPT: u64 = 150;

fn seed() -> u64 {
    std::env::var("DMKIT_TXN_STRESS_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(1)
}

fn stress(cfg: TxnConfig, name: &str) {
    let f = shm_fabric(2, 32 << 20);
    let w = Arc::new(SmallBank {
        accounts: 60,
        hot: 8,
    });
    let db = common::loaded(f, name, cfg, w.as_ref());
    let out = common::run_threads_preempted(
        &db,
        &w,
        THREADS,
        3,
        120,
        seed(),
        RuntimeConfig::default(),
        PREEMPT,
    );
    assert!(out.committed > 1500, "committed {}", out.committed);
    assert!(out.aborts > 0, "a contended run aborts some transactions");
    check_serializable(&out.history, &[]).unwrap();
    w.check(&db, out.effect).unwrap();
    db.check_replicas().unwrap();
    assert_eq!(db.stuck_records().unwrap(), 0);
    db.destroy().unwrap();
}

#[test]
fn preempted_coordinators_stay_serializable() {
    stress(common::config(), "stress-on");
}

#[test]
fn preempted_coordinators_stay_serializable_without_ford_switches() {
    let cfg = TxnConfig {
        hitchhike: false,
        backup_reads: false,
        coalescent_commit: false,
        ..common::config()
    };
    stress(cfg, "stress-off");
}
