//! Runtime configuration: every SMART technique is a named switch (§6.3's
//! factor analysis reruns from flags, never by editing constants).

use crate::backoff::BackoffConfig;
use crate::throttle::{TunerConfig, UNLIMITED};

/// Switches and parameters of the runtime.
#[derive(Debug, Clone)]
pub struct RuntimeConfig {
    /// Thread-aware resource allocation (§4.1): every worker owns its queue
    /// pairs, completion queue and doorbell. With `false`, `Worker::new`
    /// refuses to run: the caller shares queue pairs between workers
    /// (`SharedQp::share`) and builds them with `Worker::with_qps`.
    pub thread_aware: bool,
    /// Adaptive work-request throttling (§4.2). Off: credits are unlimited.
    pub throttle: bool,
    /// Conflict avoidance (§4.3): backoff in `backoff_cas` and `c_max`
    /// coroutine throttling. Off: failed CAS retry at once, no `c_max`.
    pub conflict_avoid: bool,
    /// The `C_max` tuner (used when `throttle`).
    pub tuner: TunerConfig,
    /// A fixed `C_max` instead of the tuner (when `throttle`), e.g. for the
    /// depth sweeps of Figure 4.
    pub fixed_c_max: Option<u32>,
    /// Backoff parameters (used when `conflict_avoid`).
    pub backoff: BackoffConfig,
    /// Bytes of registered local memory each task gets.
    pub task_local_bytes: usize,
    /// Seed of the worker's random numbers (backoff jitter).
    pub seed: u64,
}

impl Default for RuntimeConfig {
    fn default() -> Self {
        Self {
            thread_aware: true,
            throttle: true,
            conflict_avoid: true,
            tuner: TunerConfig::default(),
            fixed_c_max: None,
            backoff: BackoffConfig::default(),
            task_local_bytes: 64 * 1024,
            seed: 1,
        }
    }
}

impl RuntimeConfig {
    /// The initial `C_max` when throttling is off.
    pub(crate) fn unthrottled() -> u32 {
        UNLIMITED
    }
}
