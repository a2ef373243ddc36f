//! Setup shared by the simulator's test binaries.

use dmkit_runtime::RuntimeConfig;
use dmkit_sim::SimConfig;

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
