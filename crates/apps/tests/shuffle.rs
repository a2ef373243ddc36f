//! The shuffle's output is the input's exact partition, by every method,
//! on threads, in processes and on simulator seeds; a source killed
//! mid-stage fails the stage cleanly and the rerun completes.

use std::sync::Arc;
use std::time::Duration;

use dmkit_apps::platform::Platform;
use dmkit_apps::shuffle::{self, PushParams, ShuffleConfig, SourceMemory, Stage};
use dmkit_apps::{AppError, Method};
use dmkit_fabric::Fabric;
use dmkit_index::conformance;

fn cfg(method: Method, batch: usize) -> ShuffleConfig {
    ShuffleConfig {
        executors: 4,
        parts: 5,
        records: 3000,
        entry: 64,
        push: PushParams {
            method,
            batch,
            depth: 8,
            max_sge: 16,
            kill_after: None,
            source: SourceMemory::Registered,
        },
        seed: 11,
    }
}

#[test]
fn every_method_partitions_the_input_exactly_on_threads() {
    let f: Arc<dyn Fabric> = conformance::shm_fabric(2, 64 << 20);
    let mut p = Platform::Threads(f.clone());
    for source in [SourceMemory::Registered, SourceMemory::Staged] {
        for (m, b) in [
            (Method::None, 1),
            (Method::Doorbell, 8),
            (Method::Sp, 16),
            (Method::Sgl, 16),
            (Method::Sgl, 40),
        ] {
            let mut c = cfg(m, b);
            c.push.source = source;
            let (r, epoch) = shuffle::run(&mut p, &c, None, 0).unwrap();
            assert!(r.verified && epoch == 1, "{m:?} {source:?}: {r:?}");
            assert_eq!(r.records, 4 * 3000);
            assert!(r.bytes_per_record >= 64.0, "{r:?}");
        }
    }
    assert_eq!(f.node_stats(0).unwrap().chunk_bytes, 0, "stages freed");
}

/// More entries than the staged model's registered ring holds, over so
/// many partitions that a partition's batch does not fill within a ring's
/// worth of entries: slots are reused, short batches go out early, and the
/// output is still the input's exact partition. The same shape under the
/// registered model (every entry in registered memory, partitions' last
/// batches short) partitions exactly too, by every method, with a kill and
/// rerun in the middle.
#[test]
fn sources_larger_than_the_registered_ring_partition_exactly() {
    let f: Arc<dyn Fabric> = conformance::shm_fabric(1, 64 << 20);
    let mut p = Platform::Threads(f.clone());
    for source in [SourceMemory::Staged, SourceMemory::Registered] {
        for (m, b) in [
            (Method::None, 1),
            (Method::Sgl, 16),
            (Method::Doorbell, 8),
            (Method::Sp, 16),
        ] {
            let mut c = cfg(m, b);
            (c.executors, c.parts, c.records) = (2, 300, 20_000);
            c.push.source = source;
            let (r, epoch) = shuffle::run(&mut p, &c, None, 0).unwrap();
            assert!(r.verified && epoch == 1, "{m:?} {source:?}: {r:?}");
            assert_eq!(r.records, 2 * 20_000);
            let (r, epoch) = shuffle::run(&mut p, &c, Some((1, 9_000)), 1).unwrap();
            assert!(r.verified && epoch == 2, "{m:?} {source:?} killed: {r:?}");
            assert_eq!(r.records, 2 * 20_000);
        }
    }
    assert_eq!(f.node_stats(0).unwrap().chunk_bytes, 0, "stages freed");
}

#[test]
fn a_source_killed_mid_stage_fails_it_cleanly_and_the_rerun_completes() {
    let f: Arc<dyn Fabric> = conformance::shm_fabric(1, 64 << 20);
    let mut p = Platform::Threads(f.clone());
    for source in [SourceMemory::Registered, SourceMemory::Staged] {
        for m in [Method::Sgl, Method::Sp, Method::None] {
            let mut c = cfg(m, 16);
            c.push.source = source;
            let e = shuffle::run(&mut p, &c, Some((2, 700)), 0).unwrap_err();
            assert!(
                matches!(
                    e,
                    AppError::Incomplete {
                        done: 3,
                        expected: 4,
                        ..
                    }
                ),
                "{m:?} {source:?}: {e}"
            );
            let (r, epoch) = shuffle::run(&mut p, &c, Some((2, 700)), 1).unwrap();
            assert!(r.verified && epoch == 2, "{m:?} {source:?}: {r:?}");
        }
    }
}

/// A source whose declared registered memory is too small for its input
/// is refused before it pushes anything (not an out-of-range panic).
#[test]
fn registered_source_memory_too_small_is_a_config_error() {
    let f: Arc<dyn Fabric> = conformance::shm_fabric(1, 64 << 20);
    let c = cfg(Method::Sgl, 16);
    let stage = Stage::create(f.as_ref(), "small", 1, c.parts, c.entry, 4 * 3000).unwrap();
    stage.begin(f.as_ref(), 1).unwrap();
    let refs = stage.refs();
    let mut l = dmkit_runtime::LocalLayout::new();
    let mem = shuffle::SourceMem::declare(&mut l, 100, c.entry, c.parts, &c.push).unwrap();
    let mut p = Platform::Threads(f.clone());
    let (outs, _, _) = p
        .run(1, &l, &dmkit_apps::platform::raw_runtime(1), |ctx, i| {
            let refs = refs.clone();
            let input = shuffle::input(c.seed, i, 101);
            let push = c.push;
            async move { shuffle::push(&ctx, &refs, i, 1, &input, &mem, &push).await }
        })
        .unwrap();
    let e = outs.into_iter().next().unwrap().unwrap_err();
    assert!(matches!(e, AppError::Config(_)), "{e}");
    assert_eq!(stage.reserved(f.as_ref()).unwrap(), 0, "nothing reserved");
    stage.destroy(f.as_ref()).unwrap();
    // More than the 32-bit task memory holds: refused when declared.
    let mut l = dmkit_runtime::LocalLayout::new();
    let e = shuffle::SourceMem::declare(&mut l, 1 << 26, 64, c.parts, &c.push).unwrap_err();
    assert!(matches!(e, AppError::Config(_)), "{e}");
}

#[test]
fn simulator_seeds_partition_exactly_and_survive_a_kill() {
    for seed in 1..=4u64 {
        let sim = dmkit_sim::SimConfig {
            profile: dmkit_sim::Profile::builtin("cx3-40g").unwrap(),
            compute_machines: 2,
            memory_nodes: 2,
            memory_bytes: 32 << 20,
            seed,
            faults: dmkit_sim::Faults {
                torn: 0.2,
                delay: 0.1,
                delay_ns: 3_000,
                ..Default::default()
            },
            ..Default::default()
        };
        let mut c = cfg(
            if seed % 2 == 0 {
                Method::Sp
            } else {
                Method::Sgl
            },
            8,
        );
        c.seed = seed;
        // Both source-memory models, each with both methods.
        c.push.source = if seed <= 2 {
            SourceMemory::Registered
        } else {
            SourceMemory::Staged
        };
        let mut p = Platform::sim(sim.clone()).unwrap();
        let kill = (seed % 4 == 1).then_some((seed as usize % 4, 500));
        let (a, epoch) = shuffle::run(&mut p, &c, kill, 1).unwrap();
        assert!(a.verified, "seed {seed}");
        assert_eq!(epoch, if kill.is_some() { 2 } else { 1 });
        // Deterministic.
        let mut p = Platform::sim(sim).unwrap();
        let (b, _) = shuffle::run(&mut p, &c, kill, 1).unwrap();
        assert_eq!(
            (a.seconds, a.records),
            (b.seconds, b.records),
            "seed {seed}"
        );
    }
}

const CHILD: &str = "DMKIT_APPS_SHUFFLE_CHILD";

/// The child half of the process test: pushes sources 0 and 1 of the stage
/// whose head the parent names, slowly, until it is killed.
#[test]
#[ignore = "run by shuffle_across_processes_survives_a_killed_child"]
fn shuffle_child() {
    let Ok(spec) = std::env::var(CHILD) else {
        return;
    };
    let a: Vec<&str> = spec.split(' ').collect();
    let f: Arc<dyn Fabric> = Arc::new(
        dmkit_fabric::shm::ShmFabric::open(
            dmkit_fabric::shm::ShmConfig {
                rtt: Some(Duration::from_millis(2)),
                ..Default::default()
            },
            &[dmkit_fabric::shm::Target::new(a[0])],
        )
        .unwrap(),
    );
    let stage = Stage::open(f.as_ref(), a[1]).unwrap();
    let mut c = cfg(Method::None, 1);
    c.push.depth = 1;
    let refs = stage.refs();
    let mut l = dmkit_runtime::LocalLayout::new();
    let mem =
        shuffle::SourceMem::declare(&mut l, c.records as usize, c.entry, c.parts, &c.push).unwrap();
    let mut p = Platform::Threads(f);
    let _ = p.run(2, &l, &dmkit_apps::platform::raw_runtime(1), |ctx, i| {
        let refs = refs.clone();
        let input = shuffle::input(c.seed, i, c.records);
        let push = c.push;
        async move { shuffle::push(&ctx, &refs, i, 1, &input, &mem, &push).await }
    });
}

/// Sources 0 and 1 run in a child process that is killed mid-stage
/// (SIGKILL); sources 2 and 3 finish here. The stage is incomplete; the
/// rerun (every source, next epoch) partitions the input exactly.
#[test]
fn shuffle_across_processes_survives_a_killed_child() {
    let node = conformance::serve_node(64 << 20);
    let f: Arc<dyn Fabric> = node.fabric.clone();
    let c = cfg(Method::None, 1);
    let stage = Stage::create(f.as_ref(), "proc", 4, c.parts, c.entry, 4 * 3000).unwrap();
    stage.begin(f.as_ref(), 1).unwrap();
    let mut child = std::process::Command::new(std::env::current_exe().unwrap())
        .args([
            "shuffle_child",
            "--exact",
            "--ignored",
            "--nocapture",
            "--test-threads=1",
        ])
        .env(CHILD, format!("{} proc", node.socket.display()))
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    // Once it has reserved its slots (and pushes, a WRITE per 2 ms), kill it.
    let t0 = std::time::Instant::now();
    while stage.reserved(f.as_ref()).unwrap() < 2 * 3000 && t0.elapsed() < Duration::from_secs(20) {
        std::thread::sleep(Duration::from_millis(5));
    }
    std::thread::sleep(Duration::from_millis(50));
    child.kill().unwrap();
    child.wait().unwrap();
    let refs = stage.refs();
    let mut l = dmkit_runtime::LocalLayout::new();
    let mem =
        shuffle::SourceMem::declare(&mut l, c.records as usize, c.entry, c.parts, &c.push).unwrap();
    let rt = dmkit_apps::platform::raw_runtime(1);
    let mut p = Platform::Threads(f.clone());
    let push_all = |p: &mut Platform, epoch: u32, first: usize, n: usize| {
        let (outs, _, _) = p
            .run(n, &l, &rt, |ctx, k| {
                let i = first + k;
                let refs = refs.clone();
                let input = shuffle::input(c.seed, i, c.records);
                let push = c.push;
                async move { shuffle::push(&ctx, &refs, i, epoch, &input, &mem, &push).await }
            })
            .unwrap();
        outs.into_iter().for_each(|o| {
            o.unwrap();
        });
    };
    push_all(&mut p, 1, 2, 2);
    let e = stage
        .wait(f.as_ref(), 1, Duration::from_millis(200))
        .unwrap_err();
    assert!(matches!(e, AppError::Incomplete { done: 2, .. }), "{e}");
    stage.begin(f.as_ref(), 2).unwrap();
    push_all(&mut p, 2, 0, 4);
    let inputs: Vec<_> = (0..4)
        .map(|i| shuffle::input(c.seed, i, c.records))
        .collect();
    assert_eq!(stage.check(f.as_ref(), 2, &inputs).unwrap(), 4 * 3000);
    stage.destroy(f.as_ref()).unwrap();
}
