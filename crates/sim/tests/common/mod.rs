//! Setup shared by the simulator's test binaries.

// Each test file is its own crate and uses a part of this module.
#![allow(dead_code)]

use dmkit_fabric::Fabric;
use dmkit_runtime::{RuntimeConfig, Worker};
use dmkit_sim::{Profile, Sim, SimConfig, ThreadId};

/// Two memory nodes of 64 MiB on the default profile.
pub fn small() -> SimConfig {
    SimConfig {
        memory_bytes: 64 << 20,
        memory_nodes: 2,
        ..SimConfig::default()
    }
}

/// Workers without per-op statistics, 4 KiB of task-local memory each.
/// Task-local bytes of the tests' workers.
pub const LOCAL_BYTES: usize = 4096;

pub fn rcfg() -> RuntimeConfig {
    RuntimeConfig {
        op_stats: false,
        ..RuntimeConfig::default()
    }
}

/// [`rcfg`] without work-request throttling: the timing tests post exactly
/// what they mean to.
pub fn unthrottled() -> RuntimeConfig {
    RuntimeConfig {
        throttle: false,
        ..rcfg()
    }
}

/// One memory node on `profile`, seed 1: the timing tests' simulator.
pub fn one_node(profile: Profile) -> Sim {
    Sim::new(SimConfig {
        profile,
        memory_nodes: 1,
        seed: 1,
        ..small()
    })
    .unwrap()
}

/// A worker thread on `machine` of `sim`: `tasks` tasks with `cfg`, id
/// `id`, [`LOCAL_BYTES`] of task-local memory each.
pub fn add_worker(
    sim: &mut Sim,
    machine: usize,
    id: usize,
    tasks: usize,
    cfg: RuntimeConfig,
) -> ThreadId {
    sim.add_worker(machine, |f: &dyn Fabric, clock| {
        Worker::builder(f)
            .clock(clock)
            .config(cfg)
            .id(id)
            .tasks(tasks)
            .local_bytes(LOCAL_BYTES)
            .build()
    })
    .expect("a worker")
}
