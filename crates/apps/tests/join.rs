//! The distributed join equals a local join (count and checksum), by the
//! study's methods, on threads and simulator seeds; a partition source that
//! dies fails its stage cleanly (the shuffle's tests cover the rerun).

use std::sync::Arc;

use dmkit_apps::join::{self, JoinConfig};
use dmkit_apps::platform::Platform;
use dmkit_apps::shuffle::{PushParams, SourceMemory};
use dmkit_apps::Method;
use dmkit_fabric::Fabric;
use dmkit_index::conformance;

fn cfg(method: Method, batch: usize) -> JoinConfig {
    JoinConfig {
        executors: 4,
        inner: 2000,
        outer: 3000,
        entry: 32,
        push: PushParams {
            method,
            batch,
            depth: 8,
            max_sge: 16,
            kill_after: None,
            source: SourceMemory::Registered,
        },
        seed: 5,
    }
}

#[test]
fn the_distributed_join_equals_the_local_join_on_threads() {
    let f: Arc<dyn Fabric> = conformance::shm_fabric(2, 64 << 20);
    let mut p = Platform::Threads(f.clone());
    for source in [SourceMemory::Registered, SourceMemory::Staged] {
        for (m, b) in [(Method::None, 1), (Method::Sgl, 16), (Method::Sp, 16)] {
            let mut c = cfg(m, b);
            c.push.source = source;
            let r = join::run(&mut p, &c).unwrap();
            assert!(r.verified, "{m:?} {source:?}");
            let rows = r.phases.iter().find(|p| p.0 == "rows").unwrap().1;
            assert_eq!(rows as u64, 4 * 3000, "every S tuple joins one R tuple");
        }
    }
    assert_eq!(f.node_stats(0).unwrap().chunk_bytes, 0);
}

#[test]
fn the_distributed_join_equals_the_local_join_on_simulator_seeds() {
    for seed in 1..=3u64 {
        let sim = dmkit_sim::SimConfig {
            profile: dmkit_sim::Profile::builtin("cx3-40g").unwrap(),
            compute_machines: 2,
            memory_nodes: 2,
            memory_bytes: 32 << 20,
            seed,
            faults: dmkit_sim::Faults {
                torn: 0.2,
                ..Default::default()
            },
            ..Default::default()
        };
        let mut c = cfg(Method::Sgl, 16);
        c.seed = seed;
        let a = join::run(&mut Platform::sim(sim.clone()).unwrap(), &c).unwrap();
        let b = join::run(&mut Platform::sim(sim).unwrap(), &c).unwrap();
        assert!(a.verified);
        assert_eq!(a.seconds, b.seconds, "deterministic");
    }
}

#[test]
fn a_partition_source_killed_mid_stage_fails_the_join_cleanly() {
    let f: Arc<dyn Fabric> = conformance::shm_fabric(1, 64 << 20);
    let mut p = Platform::Threads(f.clone());
    let mut c = cfg(Method::Sgl, 16);
    c.push.kill_after = Some(500);
    let e = join::run(&mut p, &c).unwrap_err();
    assert!(matches!(e, dmkit_apps::AppError::Killed(_)), "{e}");
    // Nothing leaked, and the rerun joins.
    assert_eq!(f.node_stats(0).unwrap().chunk_bytes, 0);
    c.push.kill_after = None;
    assert!(join::run(&mut p, &c).unwrap().verified);
}
