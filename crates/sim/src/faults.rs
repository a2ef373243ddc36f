//! Fault injection switches (all off by default). Every choice is drawn from
//! the simulation's seeded generator, so a failing seed replays exactly.

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
}

impl Faults {
    /// Whether any fault is switched on.
    pub fn any(&self) -> bool {
        self.torn > 0.0 || self.delay > 0.0 || self.reorder_ns > 0 || self.disconnect > 0.0
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
        }
    }

    /// Checks probabilities are in [0, 1].
    pub fn validate(&self) -> Result<(), String> {
        for (n, p) in [
            ("torn", self.torn),
            ("delay", self.delay),
            ("disconnect", self.disconnect),
        ] {
            if !(0.0..=1.0).contains(&p) {
                return Err(format!("fault probability {n} = {p} is not in [0, 1]"));
            }
        }
        Ok(())
    }
}
