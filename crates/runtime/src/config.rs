//! Runtime configuration: every SMART technique is a named switch (§6.3's
//! factor analysis reruns from flags, never by editing constants).

use crate::backoff::BackoffConfig;
use crate::throttle::{TunerConfig, UNLIMITED};

/// Switches and parameters of the runtime. Loadable from TOML (every field
/// optional; see `configs/runtime.toml`).
#[derive(Debug, Clone, serde::Deserialize)]
#[serde(default, deny_unknown_fields)]
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
    /// Seed of the worker's random numbers (backoff jitter).
    pub seed: u64,
    /// Per-operation statistics of `Ctx::op` scopes (latency histogram and
    /// counters per operation name). Costs two clock reads and a map lookup
    /// per operation; harnesses that time operations themselves turn it off.
    /// Coroutine throttling (`c_max`) applies either way.
    pub op_stats: bool,
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
            seed: 1,
            op_stats: true,
        }
    }
}

impl RuntimeConfig {
    /// Parses a TOML document (a `[runtime]` table, or the fields at top level).
    pub fn from_toml(text: &str) -> Result<Self, String> {
        #[derive(serde::Deserialize)]
        #[serde(deny_unknown_fields)]
        struct File {
            runtime: RuntimeConfig,
        }
        match toml::from_str::<File>(text) {
            Ok(f) => Ok(f.runtime),
            Err(outer) => toml::from_str::<RuntimeConfig>(text).map_err(|inner| {
                if text.contains("[runtime]") {
                    outer.to_string()
                } else {
                    inner.to_string()
                }
            }),
        }
    }

    /// The initial `C_max` when throttling is off.
    pub(crate) fn unthrottled() -> u32 {
        UNLIMITED
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_shipped_config_file_parses_to_the_defaults() {
        let text = include_str!("../../../configs/runtime.toml");
        let c = RuntimeConfig::from_toml(text).unwrap();
        let d = RuntimeConfig::default();
        assert_eq!(
            (c.thread_aware, c.throttle, c.conflict_avoid, c.fixed_c_max),
            (d.thread_aware, d.throttle, d.conflict_avoid, d.fixed_c_max)
        );
        assert_eq!(c.tuner.candidates, d.tuner.candidates);
        assert_eq!(
            (c.tuner.delta, c.tuner.stable_factor),
            (d.tuner.delta, d.tuner.stable_factor)
        );
        assert_eq!(
            (c.backoff.t0, c.backoff.max_factor, c.backoff.interval),
            (d.backoff.t0, d.backoff.max_factor, d.backoff.interval)
        );
        assert_eq!(c.op_stats, d.op_stats);
    }

    #[test]
    fn partial_and_bad_files() {
        let c = RuntimeConfig::from_toml("throttle = false\n[backoff]\nt0 = 500\n").unwrap();
        assert!(!c.throttle && c.conflict_avoid);
        assert_eq!(c.backoff.t0, 500);
        assert_eq!(c.backoff.max_factor, 1024);
        let e = RuntimeConfig::from_toml("[runtime]\nthrotle = false\n").unwrap_err();
        assert!(e.contains("throtle"), "{e}");
        assert!(RuntimeConfig::from_toml("[runtime]\nthrottle = 3\n").is_err());
    }
}
