//! The clock-skew fault: each machine's workers read a clock of their own
//! that drifts and jumps within a bound and never goes backwards; the same
//! seed gives the same clocks; and it has teeth — a lease whose skew
//! allowance is below the injected bound loses mutual exclusion.

use std::cell::{Cell, RefCell};
use std::rc::Rc;

use dmkit_fabric::RemoteRef;
use dmkit_runtime::lock::{unpack, LockConfig, RemoteLock};
use dmkit_runtime::{Local, Nanos};
use dmkit_sim::{Faults, Sim, SimConfig};

mod common;
use common::{rcfg, small};

/// Two compute machines whose clocks are off by up to `bound` ns.
fn skewed(seed: u64, bound: u64) -> SimConfig {
    SimConfig {
        compute_machines: 2,
        seed,
        faults: Faults::default().with_clock_skew(bound, 200.0, 0.1, 50_000),
        ..small()
    }
}

/// Per machine: (virtual instant, clock reading) of every sample.
type Samples = Vec<Vec<(u64, u64)>>;

/// Two workers per machine, two tasks each, sleeping a random few
/// microseconds between samples of their clock; each sample pairs the
/// reading with the virtual instant it was taken at.
fn sample_clocks(cfg: SimConfig) -> (Sim, Samples) {
    let mut sim = Sim::new(cfg).unwrap();
    let virtual_time = sim.clock();
    let samples: Rc<RefCell<Samples>> = Rc::new(RefCell::new(vec![Vec::new(); 2]));
    for w in 0..4 {
        let machine = w % 2;
        let th = common::add_worker(&mut sim, machine, w, 2, rcfg());
        for task in 0..2 {
            let (samples, virtual_time) = (samples.clone(), virtual_time.clone());
            let mut x = (w * 2 + task) as u64 + 1;
            sim.worker_mut(th).spawn(move |ctx| async move {
                for _ in 0..400 {
                    x = x
                        .wrapping_mul(6364136223846793005)
                        .wrapping_add(1442695040888963407);
                    let d: Nanos = 1_000 + (x >> 33) % 20_000;
                    let before = ctx.now();
                    ctx.sleep(d).await;
                    let reading = ctx.now();
                    assert!(
                        reading >= before + d,
                        "a timer on the machine's clock fired early"
                    );
                    samples.borrow_mut()[machine].push((virtual_time.now(), reading));
                }
            });
        }
    }
    let out = sim.run();
    assert_eq!(out.blocked, 0);
    assert_eq!(out.finished, 4, "every sleeping task woke up and finished");
    let s = samples.borrow().clone();
    (sim, s)
}

#[test]
fn each_machine_reads_its_own_bounded_monotonic_clock() {
    let bound = 100_000;
    let (sim, mut samples) = sample_clocks(skewed(5, bound));
    for (m, s) in samples.iter_mut().enumerate() {
        assert_eq!(s.len(), 1_600);
        s.sort_unstable();
        for &(t, r) in s.iter() {
            assert!(
                (r as i64 - t as i64).abs() <= bound as i64,
                "machine {m}: reading {r} at {t}"
            );
            assert_eq!(r, sim.clock_reading(m, t), "what its workers read");
            assert!(
                sim.virtual_at(m, r) <= t,
                "a reading maps back no later than taken"
            );
        }
        // Threads of one machine, merged in virtual order: never backwards.
        for w in s.windows(2) {
            assert!(w[1].1 >= w[0].1, "machine {m} went back: {w:?}");
        }
    }
    // The two machines really disagree, by more than half the bound at
    // some instant (the fault is not a no-op).
    let end = sim.now();
    let worst = (0..end)
        .step_by(1_000)
        .map(|t| (sim.clock_reading(0, t) as i64 - sim.clock_reading(1, t) as i64).abs())
        .max()
        .unwrap();
    assert!(worst > bound as i64 / 2, "machines agree within {worst} ns");
    assert!(worst <= 2 * bound as i64);
}

#[test]
fn the_same_seed_gives_the_same_clocks() {
    let (_, a) = sample_clocks(skewed(9, 50_000));
    let (_, b) = sample_clocks(skewed(9, 50_000));
    let (_, c) = sample_clocks(skewed(10, 50_000));
    assert_eq!(a, b, "same seed, same readings at the same instants");
    assert_ne!(a, c);
}

#[test]
fn without_the_fault_every_machine_reads_virtual_time() {
    let cfg = SimConfig {
        compute_machines: 2,
        ..small()
    };
    let (_, samples) = sample_clocks(cfg);
    for s in samples {
        assert!(s.iter().all(|&(t, r)| t == r));
    }
}

/// What two lock users saw.
#[derive(Debug, Default)]
struct LockRun {
    /// Critical sections entered, and how many broke a lease to enter.
    sections: u64,
    breaks: u64,
    /// Times a holder whose `check` said it still held the lock read the
    /// lock word and found another owner there.
    violations: u64,
}

/// One task on each of two machines takes a [`RemoteLock`] (lease 400 µs,
/// skew allowance `allowance`) and keeps it for as long as its guard says
/// it may — checking, with a 20 µs margin for the READ that follows,
/// reading the lock word, and pausing 5 µs — then releases it; every
/// fifth time it first stalls for longer than the lease, so the other
/// breaks it. A READ that finds another owner while the holder still
/// believed it held the lock is a loss of mutual exclusion.
fn lock_run(cfg: SimConfig, allowance: Nanos) -> LockRun {
    let mut sim = Sim::new(cfg).unwrap();
    let f = sim.dyn_fabric();
    let (word, _, rk) = f.alloc_chunk(0, 4096, true).unwrap();
    let word = RemoteRef::new(word, rk);
    let lock = RemoteLock::new(
        word,
        LockConfig {
            lease: 400_000,
            skew: allowance,
            backoff_min: 1_000,
            backoff_max: 4_000,
        },
    );
    let run = Rc::new(RefCell::new(LockRun::default()));
    let done = Rc::new(Cell::new(0));
    for machine in 0..2 {
        let th = common::add_worker(&mut sim, machine, machine, 1, rcfg());
        let (run, done) = (run.clone(), done.clone());
        let owner = machine as u16 + 1;
        sim.worker_mut(th).spawn(move |ctx| async move {
            for round in 0..40 {
                let g = lock.lock(&ctx, owner).await.expect("lock");
                run.borrow_mut().sections += 1;
                if g.broke_lease {
                    run.borrow_mut().breaks += 1;
                }
                if round % 5 == 4 {
                    // Stalled past its lease: the other breaks it, and
                    // this holder must not act as one any more.
                    ctx.sleep(600_000).await;
                }
                while g.check(&ctx, 20_000) {
                    ctx.read_sync(word, Local::at(0, 8)).await.expect("READ");
                    if unpack(ctx.local_u64(Local::at(0, 8))).0 != owner {
                        run.borrow_mut().violations += 1;
                    }
                    ctx.sleep(5_000).await;
                }
                // Lost when it was broken: counted as a violation above.
                let _ = g.unlock(&ctx).await;
            }
            done.set(done.get() + 1);
        });
    }
    let out = sim.run();
    assert_eq!((done.get(), out.blocked), (2, 0));
    Rc::try_unwrap(run).unwrap().into_inner()
}

#[test]
fn a_lease_allowance_below_the_skew_loses_mutual_exclusion() {
    const BOUND: u64 = 100_000;
    for seed in 1..=6 {
        // One clock: an allowance of 0 is enough.
        let calm = lock_run(
            SimConfig {
                compute_machines: 2,
                seed,
                ..small()
            },
            0,
        );
        assert_eq!(calm.violations, 0, "seed {seed}, no skew: {calm:?}");
        assert_eq!(calm.sections, 80);
        assert!(calm.breaks > 0, "the stalled holders' leases were broken");
        // Skewed clocks and an allowance covering the bound: still safe.
        let covered = lock_run(skewed(seed, BOUND), BOUND);
        assert_eq!(
            covered.violations, 0,
            "seed {seed}, allowance = bound: {covered:?}"
        );
        assert_eq!(covered.sections, 80);
        assert!(covered.breaks > 0, "seed {seed}: {covered:?}");
        // The same clocks, no allowance: a waiter whose clock runs ahead
        // breaks the lease while the holder, whose clock runs behind,
        // still believes it holds the lock.
        let short = lock_run(skewed(seed, BOUND), 0);
        assert!(short.breaks > 0, "seed {seed}: {short:?}");
        assert!(short.violations > 0, "seed {seed}: {short:?}");
    }
}
