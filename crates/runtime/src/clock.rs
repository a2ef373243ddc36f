//! Clocks. Every timer, epoch and backoff of the runtime reads time through
//! [`Clock`]; nothing reads the wall clock directly, so the simulator can
//! drive the same code in virtual time.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

/// Nanoseconds on some monotonic time line.
pub type Nanos = u64;

/// A monotonic time source.
pub trait Clock: Send + Sync {
    /// Current time in nanoseconds. Never decreases.
    fn now(&self) -> Nanos;
}

/// `CLOCK_MONOTONIC`: real time, shared by every process on the host (so
/// lease deadlines written by one process mean the same to another).
#[derive(Debug, Default, Clone, Copy)]
pub struct MonotonicClock;

impl Clock for MonotonicClock {
    #[inline]
    fn now(&self) -> Nanos {
        // CLOCK_MONOTONIC cannot fail on Linux for a valid clock id.
        let ts =
            nix::time::clock_gettime(nix::time::ClockId::CLOCK_MONOTONIC).expect("CLOCK_MONOTONIC");
        ts.tv_sec() as u64 * 1_000_000_000 + ts.tv_nsec() as u64
    }
}

/// Virtual time, advanced explicitly (by tests or the simulator).
#[derive(Debug, Default, Clone)]
pub struct VirtualClock(Arc<AtomicU64>);

impl VirtualClock {
    /// A clock at time 0.
    pub fn new() -> Self {
        Self::default()
    }

    /// Moves time forward by `d` nanoseconds.
    pub fn advance(&self, d: Nanos) {
        self.0.fetch_add(d, Ordering::AcqRel);
    }

    /// Sets time to `t` if that is later than now.
    pub fn advance_to(&self, t: Nanos) {
        self.0.fetch_max(t, Ordering::AcqRel);
    }
}

impl Clock for VirtualClock {
    fn now(&self) -> Nanos {
        self.0.load(Ordering::Acquire)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn clocks_are_monotonic() {
        let c = MonotonicClock;
        let a = c.now();
        let b = c.now();
        assert!(b >= a && a > 0);
        let v = VirtualClock::new();
        v.advance(5);
        v.advance_to(3);
        assert_eq!(v.now(), 5);
        v.advance_to(9);
        assert_eq!(v.now(), 9);
    }
}
