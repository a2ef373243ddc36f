//! Conflict avoidance — SMART §4.3.
//!
//! - Truncated exponential backoff, equation (1): before retry `i` (0-based)
//!   a failed CAS waits `t = min(t0·2^i, t_max) + Rand(t0)`.
//! - Dynamic backoff limit: every `interval` (1 ms) the retry rate γ of the
//!   window is computed; γ > γ_H grows contention control, γ < γ_L relaxes it.
//! - Concurrency-depth throttling: at most `c_max` tasks of a worker may be
//!   inside an operation at once. `c_max` moves first; `t_max` moves only
//!   when `c_max` sits at its bound (1 when growing control, the worker's task
//!   count when relaxing), exactly as the paper orders them.
//!
//! γ is "the percentage of retries for all operations" (§4.3). As in
//! SMART's code (`sds::Backoff::update_credit`), it is retries over retries
//! plus operations, counting only *guarded* operations — [`Ctx::op`]
//! scopes, which data structures open for inserts, updates and deletes;
//! lookups open [`Ctx::read_op`] scopes, which are neither throttled by
//! `c_max` nor counted. So in a read-mostly workload (YCSB-B) γ measures
//! how contended the updates are, and throttling them leaves the reads
//! alone. A data structure that opens no guarded scopes falls back to
//! failed CAS over CAS issued. A window without either leaves everything
//! unchanged. (Two earlier choices here were wrong the other way: CAS
//! alone as the denominator throttled the reads together with the updates;
//! all operations as the denominator kept γ under γ_H in YCSB-B however
//! contended its updates were, so tasks piled onto the hottest key and
//! throughput decayed over a run.)
//!
//! [`Ctx::op`]: crate::Ctx::op
//! [`Ctx::read_op`]: crate::Ctx::read_op
//!
//! Choices where the paper is silent, written down:
//! - `c_max` shrinks and grows by one task per window ("we shrink or expand
//!   c_max"). Halving it instead (AIMD) throttled SMART-HT's update-only
//!   run on the simulator harder than SMART did: 0.56 retries per update
//!   against the paper's 1.1 (Fig. 14), ±1 gives 0.76;
//! - `t_max` doubles / halves within `[t0, t_M]`, `t_M = 2^10·t0`;
//! - `t0` is given in nanoseconds (the paper's 4096 cycles ≈ one RDMA round
//!   trip ≈ 2 µs at 2 GHz is the default).

use crate::clock::Nanos;

/// Parameters of conflict avoidance.
#[derive(Debug, Clone, serde::Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct BackoffConfig {
    /// Backoff unit `t0`, in ns.
    pub t0: Nanos,
    /// `t_M = t0 · max_factor` (paper: 2^10).
    pub max_factor: u64,
    /// High-water mark γ_H.
    pub gamma_high: f64,
    /// Low-water mark γ_L.
    pub gamma_low: f64,
    /// How often γ is evaluated, in ns (paper: 1 ms).
    pub interval: Nanos,
}

impl Default for BackoffConfig {
    fn default() -> Self {
        Self {
            t0: 2_000,
            max_factor: 1 << 10,
            gamma_high: 0.5,
            gamma_low: 0.1,
            interval: 1_000_000,
        }
    }
}

/// What an adjustment changed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Adjust {
    /// The coroutine limit `c_max` moved by one (down when γ > γ_H, up when
    /// γ < γ_L; SMART, ASPLOS'24 §4.3); the new limit, in tasks, in
    /// `1..=` the worker's task count.
    CMax(u32),
    /// The backoff ceiling `t_max` doubled or halved, which happens only once
    /// `c_max` sits at a bound; the new ceiling in ns, in
    /// `[t0, t0 · max_factor]`.
    TMax(Nanos),
}

/// Per-worker conflict-avoidance state.
#[derive(Debug, Clone)]
pub struct ConflictAvoider {
    cfg: BackoffConfig,
    t_max: Nanos,
    c_max: u32,
    c_bound: u32,
    attempts: u64,
    failures: u64,
    /// Operations started in the window.
    ops: u64,
    next_eval: Nanos,
    last_gamma: Option<f64>,
}

impl ConflictAvoider {
    /// State for a worker running `tasks` tasks, starting at `now`:
    /// `c_max = tasks`, `t_max = t0`.
    pub fn new(cfg: BackoffConfig, tasks: u32, now: Nanos) -> Self {
        assert!(cfg.t0 > 0 && cfg.max_factor >= 1 && cfg.interval > 0);
        let tasks = tasks.max(1);
        Self {
            t_max: cfg.t0,
            next_eval: now + cfg.interval,
            cfg,
            c_max: tasks,
            c_bound: tasks,
            attempts: 0,
            failures: 0,
            ops: 0,
            last_gamma: None,
        }
    }

    /// Longest backoff `t_M`.
    pub fn t_ceiling(&self) -> Nanos {
        self.cfg.t0 * self.cfg.max_factor
    }

    /// Current `t_max`.
    pub fn t_max(&self) -> Nanos {
        self.t_max
    }

    /// Current `c_max`.
    pub fn c_max(&self) -> u32 {
        self.c_max
    }

    /// γ of the last evaluated window.
    pub fn last_gamma(&self) -> Option<f64> {
        self.last_gamma
    }

    /// Equation (1): the delay before retry `attempt` (0 = first retry),
    /// with `rand` any random 64-bit value.
    pub fn delay(&self, attempt: u32, rand: u64) -> Nanos {
        let exp = self
            .cfg
            .t0
            .saturating_mul(1u64.checked_shl(attempt.min(63)).unwrap_or(u64::MAX));
        exp.min(self.t_max) + rand % self.cfg.t0
    }

    /// Records the outcome of one CAS issued through `backoff_cas`.
    pub fn record(&mut self, succeeded: bool) {
        self.attempts += 1;
        if !succeeded {
            self.failures += 1;
        }
    }

    /// Records that an operation started (an op scope was entered).
    pub fn note_op(&mut self) {
        self.ops += 1;
    }

    /// Evaluates γ when an interval has passed; returns what changed.
    pub fn tick(&mut self, now: Nanos) -> Option<Adjust> {
        if now < self.next_eval {
            return None;
        }
        self.next_eval = now + self.cfg.interval;
        let per = if self.ops > 0 {
            self.ops + self.failures
        } else {
            self.attempts
        };
        if per == 0 {
            return None;
        }
        let gamma = self.failures as f64 / per as f64;
        self.attempts = 0;
        self.failures = 0;
        self.ops = 0;
        self.last_gamma = Some(gamma);
        if gamma > self.cfg.gamma_high {
            if self.c_max > 1 {
                self.c_max -= 1;
                Some(Adjust::CMax(self.c_max))
            } else if self.t_max < self.t_ceiling() {
                self.t_max = (self.t_max * 2).min(self.t_ceiling());
                Some(Adjust::TMax(self.t_max))
            } else {
                None
            }
        } else if gamma < self.cfg.gamma_low {
            if self.c_max < self.c_bound {
                self.c_max += 1;
                Some(Adjust::CMax(self.c_max))
            } else if self.t_max > self.cfg.t0 {
                self.t_max = (self.t_max / 2).max(self.cfg.t0);
                Some(Adjust::TMax(self.t_max))
            } else {
                None
            }
        } else {
            None
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn delays_stay_within_equation_1_bounds() {
        let cfg = BackoffConfig::default();
        let t0 = cfg.t0;
        let mut a = ConflictAvoider::new(cfg, 8, 0);
        let mut seed = 0x1234_5678u64;
        for attempt in 0..80 {
            seed = seed
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            let d = a.delay(attempt, seed);
            let base = (t0 << attempt.min(20)).min(a.t_max());
            assert!(d >= base && d < base + t0, "attempt {attempt}: {d}");
        }
        // With t_max at its ceiling the delay is capped at t_M + t0.
        for _ in 0..100 {
            for _ in 0..4 {
                a.record(false);
            }
            a.tick(u64::MAX / 2);
            a.next_eval = 0;
        }
        assert_eq!(a.c_max(), 1);
        assert_eq!(a.t_max(), a.t_ceiling());
        assert!(a.delay(63, u64::MAX) < a.t_ceiling() + t0);
        assert!(a.delay(5, 0) == (t0 << 5));
    }

    #[test]
    fn c_max_moves_first_then_t_max_as_gamma_crosses_the_marks() {
        let cfg = BackoffConfig::default();
        let ms = cfg.interval;
        let mut a = ConflictAvoider::new(cfg, 8, 0);
        let mut now = 0;
        let mut window = |a: &mut ConflictAvoider, fail_pct: u64| {
            for i in 0..100 {
                a.record(i >= fail_pct);
            }
            now += ms;
            a.tick(now)
        };
        // Heavy contention: c_max shrinks a task a window down to 1, then
        // t_max doubles.
        for c in (1..8).rev() {
            assert_eq!(window(&mut a, 80), Some(Adjust::CMax(c)));
        }
        assert_eq!(window(&mut a, 80), Some(Adjust::TMax(4_000)));
        assert_eq!(window(&mut a, 80), Some(Adjust::TMax(8_000)));
        // Between the marks nothing moves.
        assert_eq!(window(&mut a, 30), None);
        assert_eq!(a.last_gamma(), Some(0.3));
        // Calm: c_max grows back first, one step a window, then t_max halves.
        for c in 2..=8 {
            assert_eq!(window(&mut a, 0), Some(Adjust::CMax(c)));
        }
        assert_eq!(window(&mut a, 5), Some(Adjust::TMax(4_000)));
        assert_eq!(window(&mut a, 5), Some(Adjust::TMax(2_000)));
        assert_eq!(window(&mut a, 5), None, "t_max floors at t0");
        // No evaluation before the interval has passed, none on an empty window.
        a.record(false);
        assert_eq!(a.tick(now + ms / 2), None);
        now += 10 * ms;
        assert_eq!(
            a.tick(now),
            Some(Adjust::CMax(7)),
            "one failed CAS alone is γ = 1"
        );
        assert_eq!(
            a.tick(now + 10 * ms),
            None,
            "an empty window changes nothing"
        );
    }

    #[test]
    fn gamma_counts_retries_over_retries_plus_guarded_operations() {
        let cfg = BackoffConfig::default();
        let iv = cfg.interval;
        let mut a = ConflictAvoider::new(cfg, 8, 0);
        // 18 guarded operations, 3 CAS of which 2 failed: 2 / (2 + 18).
        for _ in 0..18 {
            a.note_op();
        }
        a.record(false);
        a.record(false);
        a.record(true);
        assert_eq!(a.tick(iv), None, "γ = 0.1 sits between the marks");
        assert_eq!(a.last_gamma(), Some(0.1));
        assert_eq!(a.c_max(), 8);
        // Few updates, each retried several times, is contention: 6 / (6 + 2).
        for _ in 0..2 {
            a.note_op();
        }
        for _ in 0..6 {
            a.record(false);
        }
        a.record(true);
        a.record(true);
        assert_eq!(a.tick(2 * iv), Some(Adjust::CMax(7)));
        assert_eq!(a.last_gamma(), Some(0.75));
    }
}
