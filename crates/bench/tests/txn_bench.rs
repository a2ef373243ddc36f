//! `dmkit bench txn`'s harness: a short run of each workload on embedded
//! shm commits transactions, keeps its invariants and reports the JSON
//! fields the checks read.

use std::time::Duration;

use dmkit_bench::txn_bench::{run_txn, TxnBenchConfig, TxnWorkload};
use dmkit_index::conformance::shm_fabric;
use dmkit_runtime::RuntimeConfig;
use dmkit_txn::TxnConfig;

#[test]
fn each_workload_runs_keeps_its_invariants_and_reports_the_fields() {
    for (workload, scale) in [
        (TxnWorkload::SmallBank, 1_000),
        (TxnWorkload::Tatp, 1_000),
        (TxnWorkload::Tpcc, 1),
    ] {
        let cfg = TxnBenchConfig {
            workload,
            scale,
            threads: 2,
            coros: 2,
            duration: Duration::from_millis(300),
            txn: TxnConfig::default(),
            runtime: RuntimeConfig::default(),
            seed: 3,
            read_only: false,
            local_peer: false,
            warmup: Duration::ZERO,
            idle: Duration::ZERO,
        };
        let r = run_txn(shm_fabric(2, 512 << 20), &cfg).unwrap();
        assert!(r.invariants_ok, "{workload:?}: {:?}", r.invariants_error);
        assert!(r.committed > 0 && r.attempted >= r.committed);
        assert!(r.p99_us >= r.p50_us && r.p50_us > 0.0);
        assert!(r.round_trips_per_txn >= 1.0);
        let v = serde_json::to_value(&r).unwrap();
        for k in [
            "workload",
            "threads",
            "coros",
            "committed_per_s",
            "attempted_per_s",
            "abort_rate",
            "p50_us",
            "p99_us",
            "round_trips_per_txn",
            "invariants_ok",
        ] {
            assert!(v.get(k).is_some(), "{workload:?}: no {k}");
        }
    }
    assert!("nosuch"
        .parse::<TxnWorkload>()
        .unwrap_err()
        .contains("tatp"));
}
