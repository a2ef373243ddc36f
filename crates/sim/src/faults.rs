//! Fault injection switches (all off by default). Every choice is drawn from
//! the simulation's seed, so a failing seed replays exactly. They are plain
//! serde fields: a `[faults]`-style TOML table with these keys configures
//! them (unknown keys are refused).

use serde::{Deserialize, Serialize};

/// What the simulator may do wrong, on purpose.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Faults {
    /// Probability that a READ or WRITE of more than one 8-byte word is
    /// *torn*: executed as 2–4 pieces at 8-byte boundaries, at instants
    /// spread over `torn_spread_ns`. With in-order placement declared the
    /// pieces land in ascending address order (what that capability
    /// promises and no more); without it, in random order. Concurrent
    /// requests see the half-done state in between.
    pub torn: f64,
    /// How far apart the first and last piece of a torn request land (ns).
    pub torn_spread_ns: u64,
    /// Probability that a request is delayed by up to `delay_ns` extra (a
    /// retransmission, a PCIe hiccup). Queue-pair order is kept.
    pub delay: f64,
    /// Longest extra delay of a delayed request (ns); each draws uniformly from
    /// 0..=`delay_ns`.
    pub delay_ns: u64,
    /// Every request's execution is shifted by a random 0..`reorder_ns`,
    /// so requests of *different* queue pairs take effect out of their
    /// issue order (SwordBox §3.1, Fig. 2); one queue pair's requests keep
    /// their order.
    pub reorder_ns: u64,
    /// Probability per post that the queue pair's connection is lost: the
    /// post and everything in flight on it complete with
    /// `ConnectionLost` (without effect), and later posts fail with
    /// `PostError::Disconnected`.
    pub disconnect: f64,
    /// Clock skew: bound `B` on each machine's clock offset from virtual
    /// time (ns). 0, the default, gives every machine virtual time itself;
    /// otherwise the workers of each machine read a clock of its own that
    /// drifts and jumps within `±B` and never goes backwards (see
    /// [`crate::clock`]).
    pub clock_skew_ns: u64,
    /// Largest drift rate of a skewed clock (ppm): each period's rate is
    /// drawn uniformly in `±clock_drift_ppm` (at most 100,000).
    pub clock_drift_ppm: f64,
    /// Probability that a skewed clock jumps at the start of a period, to
    /// an offset drawn anywhere in `±clock_skew_ns`.
    pub clock_jump: f64,
    /// Length of a period of a skewed clock (ns; at least 1 when the skew
    /// is on).
    pub clock_period_ns: u64,
}

impl Faults {
    /// Whether any fault is switched on.
    pub fn any(&self) -> bool {
        self.torn > 0.0
            || self.delay > 0.0
            || self.reorder_ns > 0
            || self.disconnect > 0.0
            || self.clock_skew_ns > 0
    }

    /// A mix that exercises consistency checks: torn transfers, delays and
    /// cross-queue-pair reordering (no lost connections).
    pub fn consistency() -> Self {
        Self {
            torn: 0.2,
            torn_spread_ns: 2_000,
            delay: 0.02,
            delay_ns: 20_000,
            reorder_ns: 1_000,
            disconnect: 0.0,
            ..Self::default()
        }
    }

    /// `self` with skewed clocks: offsets within `±bound_ns`, drifting up
    /// to `drift_ppm`, jumping with probability `jump` per period of
    /// `period_ns`.
    pub fn with_clock_skew(self, bound_ns: u64, drift_ppm: f64, jump: f64, period_ns: u64) -> Self {
        Self {
            clock_skew_ns: bound_ns,
            clock_drift_ppm: drift_ppm,
            clock_jump: jump,
            clock_period_ns: period_ns,
            ..self
        }
    }

    /// Checks probabilities are in [0, 1] and the clock skew's parameters
    /// make sense.
    pub fn validate(&self) -> Result<(), String> {
        for (n, p) in [
            ("torn", self.torn),
            ("delay", self.delay),
            ("disconnect", self.disconnect),
            ("clock_jump", self.clock_jump),
        ] {
            if !(0.0..=1.0).contains(&p) {
                return Err(format!("fault probability {n} = {p} is not in [0, 1]"));
            }
        }
        if self.clock_skew_ns > 0 {
            if self.clock_period_ns == 0 {
                return Err("clock_period_ns must be at least 1 when clock_skew_ns is set".into());
            }
            if self.clock_skew_ns >= 1 << 40 {
                return Err(format!(
                    "clock_skew_ns = {} is beyond any clock (at most 2^40 ns)",
                    self.clock_skew_ns
                ));
            }
            // A drift of a whole ns per ns would let a clock stop or run
            // backwards between periods' jumps.
            if !(0.0..=100_000.0).contains(&self.clock_drift_ppm) {
                return Err(format!(
                    "clock_drift_ppm = {} is not in [0, 100000]",
                    self.clock_drift_ppm
                ));
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_clock_skew_is_configured_from_toml_and_checked() {
        let f: Faults = toml::from_str(
            "clock_skew_ns = 200000\nclock_drift_ppm = 50.0\nclock_jump = 0.1\nclock_period_ns = 100000\n",
        )
        .expect("parses");
        assert_eq!(
            f,
            Faults::default().with_clock_skew(200_000, 50.0, 0.1, 100_000)
        );
        assert!(f.any() && f.validate().is_ok());
        assert!(!Faults::default().any(), "off by default");
        let no_period = Faults {
            clock_period_ns: 0,
            ..f.clone()
        };
        assert!(no_period.validate().is_err());
        let too_fast = Faults {
            clock_drift_ppm: 2e6,
            ..f
        };
        assert!(too_fast.validate().is_err());
        assert!(toml::from_str::<Faults>("clock_skew = 1").is_err());
    }
}
