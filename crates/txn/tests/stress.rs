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

use common::BankRun;
use dmkit_txn::workload::smallbank::SmallBank;
use dmkit_txn::TxnConfig;

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

fn stress() -> BankRun {
    BankRun {
        nodes: 2,
        node_bytes: 32 << 20,
        bank: SmallBank {
            accounts: 60,
            hot: 8,
        },
        threads: THREADS,
        tasks: 3,
        txns: 120,
        seed: seed(),
        preempt: PREEMPT,
        min_committed: 1501,
        expect_aborts: true,
    }
}

#[test]
fn preempted_coordinators_stay_serializable() {
    stress().check(common::config(), "stress-on");
}

#[test]
fn preempted_coordinators_stay_serializable_without_ford_switches() {
    let cfg = TxnConfig {
        hitchhike: false,
        backup_reads: false,
        coalescent_commit: false,
        ..common::config()
    };
    stress().check(cfg, "stress-off");
}
