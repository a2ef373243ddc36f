//! Per-machine clocks that drift and jump: the clock-skew fault.
//!
//! Without it every virtual thread reads virtual time itself. With
//! [`Faults::clock_skew_ns`](crate::Faults::clock_skew_ns) = `B > 0`, the
//! workers of each machine read that machine's own clock instead:
//!
//! ```text
//! clock_m(t) = ⌊ max over 0 ≤ s ≤ t of ( max(s + offset_m(s), 0) + (t − s)/8 ) ⌋
//! |offset_m(s)| ≤ B
//! ```
//!
//! - **Offset.** Virtual time is cut into periods of
//!   `clock_period_ns`. A machine's offset starts anywhere in `[-B, B]`;
//!   within a period it drifts at a rate drawn for that period, uniform in
//!   ±`clock_drift_ppm`, and stops at the bound rather than crossing it; at
//!   the start of a period it *jumps* with probability `clock_jump`, to a
//!   value drawn anywhere in `[-B, B]` (a step of NTP, a migrated VM).
//! - **Monotonic, by clamping.** A jump backwards would make the clock run
//!   backwards; a real clock source (`CLOCK_MONOTONIC`) never does, so the
//!   reading is clamped to what it already read: after a backward jump
//!   (and at the start, under a negative offset) the clock *creeps* at an
//!   eighth of its rate until `t + offset` catches up, rather than standing
//!   still — so it never stops either, and a reading names the virtual
//!   instant it was taken at to within 8 ns ([`MachineClock::earliest`]),
//!   which a history checker needs. A clamped reading is still within `B`
//!   of virtual time: it is `s + offset(s) ≤ s + B` from an earlier `s`
//!   plus less than the time since. As a function of virtual time each
//!   machine's clock never decreases, so every thread, whose own time only
//!   moves forward, reads a clock that never goes backwards.
//! - **Deterministic.** A machine's periods are drawn in order from a
//!   generator seeded by the simulation's seed and the machine's index, and
//!   a reading is a function of virtual time alone — not of the order in
//!   which threads are stepped — so a seed replays its clocks exactly.
//!
//! Timers of a worker are set on its machine's clock; the driver wakes the
//! thread at [`MachineClock::earliest`], the first virtual instant at which
//! that clock reaches the deadline.
//!
//! What it tests: every clock-based rule across machines — the lease of
//! [`dmkit_runtime::lock::RemoteLock`] (its `skew` allowance must be at
//! least `B`: clocks then disagree by at most `2B`) and RACE's grace period
//! (the clients' clocks measure the grace and the reader's deadline).

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use dmkit_runtime::{Clock, Nanos};

use crate::engine::Time;
use crate::faults::Faults;
use crate::rng::SimRng;

/// One machine's clock: its offset's course, drawn period by period.
#[derive(Debug, Clone)]
pub struct MachineClock {
    /// The bound on the offset (ns).
    bound: f64,
    /// The largest drift rate (ns per ns).
    drift: f64,
    jump: f64,
    period: Time,
    rng: SimRng,
    /// Periods drawn so far (period `k` covers `[k·period, (k+1)·period)`).
    periods: Vec<Period>,
    /// The last (virtual instant, reading) read: where
    /// [`MachineClock::earliest`] starts looking.
    last: (Time, Time),
}

#[derive(Debug, Clone, Copy)]
struct Period {
    /// The offset at the period's start (ns).
    offset: f64,
    /// Its drift rate during the period (ns per ns).
    rate: f64,
    /// The clamp: what the clock read just before the period (ns,
    /// unrounded); during the period it reads at least this plus
    /// [`CREEP`] × the time since the period's start.
    carry: f64,
}

/// How fast a clamped clock runs (its rate after a backward jump, until
/// `t + offset` catches up).
const CREEP: f64 = 1.0 / 8.0;

/// How many periods ahead of those drawn [`MachineClock::earliest`] draws
/// to answer exactly (further: a lower bound).
const LOOKAHEAD: usize = 1 << 20;

impl MachineClock {
    /// Machine `machine`'s clock under `faults` in a simulation seeded
    /// with `seed`, or `None` when the clock-skew fault is off.
    pub fn new(faults: &Faults, seed: u64, machine: usize) -> Option<Self> {
        if faults.clock_skew_ns == 0 {
            return None;
        }
        // A stream of its own per machine, apart from the engine's
        // generator (which draws in stepping order).
        let salt = (machine as u64 + 1).wrapping_mul(0xA076_1D64_78BD_642F);
        let mut clock = Self {
            bound: faults.clock_skew_ns as f64,
            drift: faults.clock_drift_ppm * 1e-6,
            jump: faults.clock_jump,
            period: faults.clock_period_ns.max(1),
            rng: SimRng::new(seed ^ salt ^ 0xC10C_C10C_C10C_C10C),
            periods: Vec::new(),
            last: (0, 0),
        };
        let offset = clock.anywhere();
        let rate = clock.rate();
        clock.periods.push(Period {
            offset,
            rate,
            carry: 0.0,
        });
        Some(clock)
    }

    /// An offset drawn uniformly in `[-bound, bound]` (whole ns).
    fn anywhere(&mut self) -> f64 {
        let b = self.bound as u64;
        self.rng.below(2 * b + 1) as f64 - self.bound
    }

    /// A drift rate drawn uniformly in `[-drift, drift]`.
    fn rate(&mut self) -> f64 {
        let u = (self.rng.next_u64() >> 11) as f64 * (1.0 / (1u64 << 53) as f64);
        (2.0 * u - 1.0) * self.drift
    }

    /// The offset `into` ns into period `p` (before rounding).
    fn drifted(&self, p: &Period, into: Time) -> f64 {
        (p.offset + p.rate * into as f64).clamp(-self.bound, self.bound)
    }

    /// The clock `into` ns into period `p` (unrounded): `t + offset(t)`,
    /// clamped. Both terms grow with `into` (a drift is far below 1 ns
    /// per ns, the creep above 0), so the clock does.
    fn at(&self, p: &Period, start: Time, into: Time) -> f64 {
        let raw = (start + into) as f64 + self.drifted(p, into);
        raw.max(p.carry + CREEP * into as f64)
    }

    /// Draws periods up to period `k`.
    fn extend(&mut self, k: usize) {
        while self.periods.len() <= k {
            let i = self.periods.len();
            let last = self.periods[i - 1];
            let start = (i - 1) as Time * self.period;
            let carry = self.at(&last, start, self.period);
            let offset = if self.jump > 0.0 && self.rng.chance(self.jump) {
                self.anywhere()
            } else {
                self.drifted(&last, self.period)
            };
            let rate = self.rate();
            self.periods.push(Period {
                offset,
                rate,
                carry,
            });
        }
    }

    /// The reading at virtual instant `t` (whole ns, rounded down).
    pub fn read(&mut self, t: Time) -> Time {
        let k = (t / self.period) as usize;
        self.extend(k);
        let start = k as Time * self.period;
        let r = self.at(&self.periods[k], start, t - start) as Time;
        self.last = (t, r);
        r
    }

    /// The first virtual instant at which the clock reads at least
    /// `reading` (it does by `reading + bound`: the offset is at least
    /// `-bound`, and before `reading - bound` it reads less: at most
    /// `+bound`). A reading further ahead than a million periods beyond
    /// those drawn gets `reading - bound`, a lower bound, instead (a timer
    /// that far out wakes its thread early, which sets it again).
    pub fn earliest(&mut self, reading: Time) -> Time {
        let b = self.bound as Time;
        let mut lo = reading.saturating_sub(b + 1);
        let mut hi = reading.saturating_add(b);
        if hi / self.period > (self.periods.len() + LOOKAHEAD) as Time {
            return reading - b;
        }
        // Invariant: read(hi) ≥ reading; read(t) < reading for t ≤ lo
        // (read(lo) ≤ lo + bound < reading), unless lo = 0 and read(0)
        // already reaches it.
        if lo == 0 && self.read(0) >= reading {
            return 0;
        }
        // The clock mostly runs at virtual time's rate: guess from the
        // offset of the last reading, step by the distance still to go
        // (two reads usually settle it), and halve the bracket once that
        // stops closing it (a creep, a jump).
        let (t0, r0) = self.last;
        let mut guess = (reading as i64 - (r0 as i64 - t0 as i64)).max(0) as Time;
        let mut step = 0;
        while hi - lo > 1 {
            let t = if step < 4 {
                guess.clamp(lo + 1, hi - 1)
            } else {
                lo + (hi - lo) / 2
            };
            step += 1;
            let r = self.read(t);
            if r >= reading {
                hi = t;
                guess = t - (r - reading).min(t);
            } else {
                lo = t;
                guess = t + (reading - r);
            }
        }
        hi
    }

    /// The bound on the offset (ns).
    pub fn bound(&self) -> Time {
        self.bound as Time
    }
}

/// What the workers of a skewed machine read: its [`MachineClock`] at the
/// current virtual thread's instant.
#[derive(Debug, Clone)]
pub(crate) struct SkewedClock {
    pub tick: Arc<AtomicU64>,
    pub clock: Arc<Mutex<MachineClock>>,
}

impl Clock for SkewedClock {
    fn now(&self) -> Nanos {
        let t = self.tick.load(Ordering::Acquire);
        // Poisoning cannot happen: the lock guards plain arithmetic.
        self.clock.lock().unwrap_or_else(|p| p.into_inner()).read(t)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn faults(bound: u64, ppm: f64, jump: f64, period: u64) -> Faults {
        Faults {
            clock_skew_ns: bound,
            clock_drift_ppm: ppm,
            clock_jump: jump,
            clock_period_ns: period,
            ..Faults::default()
        }
    }

    #[test]
    fn off_by_default() {
        assert!(MachineClock::new(&Faults::default(), 1, 0).is_none());
    }

    /// Over ten virtual seconds of fast drift and frequent jumps, every
    /// reading stays within the bound of virtual time and never goes
    /// backwards nor stops, and the clamp is really used (a jump back
    /// happened, and the clock crept).
    #[test]
    fn readings_stay_within_the_bound_and_never_go_back() {
        let bound = 50_000;
        let f = faults(bound, 2_000.0, 0.3, 20_000);
        for machine in 0..3 {
            let mut c = MachineClock::new(&f, 7, machine).expect("on");
            let (mut last, mut crept, mut max_off) = (0, 0u64, 0i64);
            let step = 997;
            let mut t = 0;
            while t < 10_000_000_000 {
                let r = c.read(t);
                let off = r as i64 - t as i64;
                assert!(off.abs() <= bound as i64, "offset {off} at {t}");
                assert!(
                    r > last || t == 0,
                    "clock stopped or went back at {t}: {r} ≤ {last}"
                );
                if t > 0 && r - last < step / 4 {
                    crept += 1;
                }
                max_off = max_off.max(off.abs());
                last = r;
                t += step;
            }
            assert!(crept > 0, "no backward jump was clamped");
            assert!(max_off > bound as i64 / 2, "offsets stayed small");
        }
    }

    #[test]
    fn the_same_seed_gives_the_same_clock() {
        let f = faults(100_000, 100.0, 0.05, 100_000);
        let sample = |seed, m| {
            let mut c = MachineClock::new(&f, seed, m).expect("on");
            (0..2_000)
                .map(|i| c.read(i * 1_234_567))
                .collect::<Vec<_>>()
        };
        assert_eq!(sample(3, 1), sample(3, 1));
        assert_ne!(sample(3, 1), sample(4, 1));
        assert_ne!(sample(3, 0), sample(3, 1), "machines differ");
        // Reading out of order gives the same readings.
        let mut c = MachineClock::new(&f, 3, 1).expect("on");
        let late = c.read(1_999 * 1_234_567);
        assert_eq!(late, *sample(3, 1).last().expect("samples"));
    }

    #[test]
    fn earliest_inverts_the_reading() {
        let f = faults(30_000, 1_000.0, 0.2, 10_000);
        let mut c = MachineClock::new(&f, 11, 0).expect("on");
        for reading in (0..5_000_000).step_by(3_331) {
            let t = c.earliest(reading);
            assert!(c.read(t) >= reading);
            assert!(t == 0 || c.read(t - 1) < reading, "{reading}: {t}");
            // A reading names its instant to within 8 ns (the creep; a
            // jump forward skips readings).
            let next = c.earliest(reading + 1);
            assert!(next >= t && next - t <= 8, "{reading}: {t}..{next}");
        }
        // Far beyond what is drawn: a lower bound, without drawing it.
        assert_eq!(c.earliest(u64::MAX / 2), u64::MAX / 2 - 30_000);
    }
}
