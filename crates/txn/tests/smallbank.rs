//! SmallBank on shm threads: every committed history is serializable, the
//! total balance is conserved exactly, replicas end byte-identical — under
//! each of FORD's switches.

mod common;

use common::BankRun;
use dmkit_txn::workload::smallbank::SmallBank;
use dmkit_txn::TxnConfig;

/// Few accounts: most transactions conflict.
fn contended() -> BankRun {
    BankRun {
        nodes: 2,
        node_bytes: 64 << 20,
        bank: SmallBank {
            accounts: 200,
            hot: 20,
        },
        threads: 3,
        tasks: 4,
        txns: 150,
        seed: 7,
        preempt: 0,
        min_committed: 1001,
        expect_aborts: true,
    }
}

#[test]
fn contended_smallbank_is_serializable_and_conserves_money() {
    contended().check(common::config(), "sb-all-on");
}

#[test]
fn without_hitchhiking_backup_reads_or_coalescent_commit() {
    let cfg = TxnConfig {
        hitchhike: false,
        backup_reads: false,
        coalescent_commit: false,
        ..common::config()
    };
    contended().check(cfg, "sb-all-off");
}

#[test]
fn three_replicas_on_three_nodes() {
    let run = BankRun {
        nodes: 3,
        node_bytes: 32 << 20,
        bank: SmallBank {
            accounts: 100,
            hot: 10,
        },
        threads: 2,
        tasks: 4,
        txns: 100,
        seed: 3,
        min_committed: 0,
        expect_aborts: false,
        ..contended()
    };
    let cfg = TxnConfig {
        replicas: 3,
        ..common::config()
    };
    run.check(cfg, "sb-3");
}
