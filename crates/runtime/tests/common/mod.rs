//! What the runtime's integration tests share: their workers.

use std::sync::Arc;

use dmkit_fabric::Fabric;
use dmkit_runtime::{Clock, RuntimeConfig, Worker};

/// Task-local bytes of the tests' workers (they address it by hand).
pub const LOCAL_BYTES: usize = 64 * 1024;

/// The tests' worker `id` on `f`: `tasks` tasks of [`LOCAL_BYTES`] each.
pub fn worker(
    f: &dyn Fabric,
    clock: Arc<dyn Clock>,
    cfg: RuntimeConfig,
    id: usize,
    tasks: usize,
) -> Worker {
    Worker::builder(f)
        .clock(clock)
        .config(cfg)
        .id(id)
        .tasks(tasks)
        .local_bytes(LOCAL_BYTES)
        .build()
        .unwrap()
}
