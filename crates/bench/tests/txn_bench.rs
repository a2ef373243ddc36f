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

/// On the simulator: the same harness in virtual time commits, keeps the
/// invariants, counts verbs, and a seed gives the same figures twice.
#[test]
fn on_the_simulator_it_commits_and_is_deterministic() {
    use dmkit_bench::txn_bench::{run_txn_on, TxnPlatform};
    let run = |workload| {
        let cfg = TxnBenchConfig {
            workload,
            scale: 2_000,
            threads: 4,
            coros: 4,
            duration: Duration::from_micros(300),
            warmup: Duration::from_micros(100),
            idle: Duration::from_micros(5),
            txn: TxnConfig::default(),
            runtime: RuntimeConfig::default(),
            seed: 5,
            read_only: false,
            local_peer: false,
        };
        let sim = dmkit_sim::SimConfig {
            memory_nodes: 2,
            memory_bytes: 64 << 20,
            ..Default::default()
        };
        run_txn_on(TxnPlatform::Sim(Box::new(sim)), &cfg).unwrap()
    };
    for w in [TxnWorkload::SmallBank, TxnWorkload::Tatp] {
        let (a, b) = (run(w), run(w));
        assert!(a.invariants_ok, "{w:?}: {:?}", a.invariants_error);
        assert!(a.committed > 0 && a.sim_verbs > 0, "{w:?}: {a:?}");
        assert_eq!(a.backend, "sim");
        assert!((a.seconds - 300e-6).abs() < 1e-12);
        assert_eq!(
            (a.committed, a.attempted, a.sim_verbs, a.p50_us.to_bits()),
            (b.committed, b.attempted, b.sim_verbs, b.p50_us.to_bits()),
            "{w:?}: the simulator is deterministic"
        );
    }
}
