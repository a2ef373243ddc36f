//! Setup shared by the simulator's test binaries.

// Each test file is its own crate and uses a part of this module.
#![allow(dead_code)]

use dmkit_runtime::RuntimeConfig;
use dmkit_sim::{Profile, Sim, SimConfig};

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
