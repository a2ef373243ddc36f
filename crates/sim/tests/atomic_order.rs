//! The responder's order among atomics waiting for one address
//! (`responder.atomic_order`): every order serialises the word and loses
//! nothing, the arbitrated ones replay bit for bit, and the order really
//! decides who is served.

use std::cell::RefCell;
use std::rc::Rc;

use dmkit_sim::profile::AtomicOrder;
use dmkit_sim::{Faults, Profile, Sim, SimConfig};

mod common;
use common::{rcfg, small};
use dmkit_fabric::RemoteRef;
use dmkit_runtime::Local;

fn config(order: AtomicOrder, seed: u64, faults: Faults) -> SimConfig {
    let mut profile = Profile::cx6();
    profile.responder.atomic_order = order;
    // The access stall is modelled under `post` only.
    profile.responder.atomic_stalls_access = order == AtomicOrder::Post;
    SimConfig {
        profile,
        seed,
        faults,
        ..small()
    }
}

/// What a hot-word run saw.
struct HotRun {
    /// Old values the FAAs on the hot word returned, in completion order.
    olds: Vec<u64>,
    /// Completed FAAs per thread.
    per_thread: Vec<u64>,
    /// The hot word at the end.
    word: u64,
    /// Everything observable, for replay comparisons.
    trace: String,
}

/// `threads` threads × `tasks` tasks add 1 to one word until `window` ns
/// of virtual time have passed; every fourth round a task also READs and
/// WRITEs a cold word of its own, on the same queue pair, so requests
/// queue behind waiting atomics.
fn hot_word(order: AtomicOrder, seed: u64, faults: Faults, threads: usize, tasks: usize) -> HotRun {
    let window = 150_000;
    let mut sim = Sim::new(config(order, seed, faults)).unwrap();
    let f = sim.dyn_fabric();
    let (a, _, k) = f.alloc_chunk(0, 1 << 16, true).unwrap();
    let olds: Rc<RefCell<Vec<u64>>> = Rc::default();
    let per_thread: Rc<RefCell<Vec<u64>>> = Rc::new(RefCell::new(vec![0; threads]));
    for t in 0..threads {
        let th = common::add_worker(&mut sim, 0, t, tasks, rcfg());
        for task in 0..tasks {
            let (olds, per_thread) = (olds.clone(), per_thread.clone());
            sim.worker_mut(th).spawn(move |ctx| async move {
                let cold = a.add(8 * (1 + t * tasks + task) as u64);
                let mut round = 0u64;
                while ctx.now() < window {
                    let before = ctx.now();
                    let old = ctx.faa_sync(RemoteRef::new(a, k), 1).await.unwrap();
                    assert!(ctx.now() > before, "a thread's clock never goes back");
                    olds.borrow_mut().push(old);
                    per_thread.borrow_mut()[t] += 1;
                    round += 1;
                    if round.is_multiple_of(4) {
                        ctx.set_local_u64(Local::at(0, 8), round);
                        ctx.write(RemoteRef::new(cold, k), Local::at(0, 8));
                        ctx.read(RemoteRef::new(cold, k), Local::at(8, 8));
                        ctx.sync().await.unwrap();
                        assert_eq!(
                            ctx.local_u64(Local::at(8, 8)),
                            round,
                            "a READ after a WRITE sees it"
                        );
                    }
                }
            });
        }
    }
    let out = sim.run();
    assert_eq!(out.blocked, 0, "{order:?}: nobody blocked");
    assert_eq!(out.finished, threads, "{order:?}: every thread finished");
    assert_eq!(sim.in_flight(), 0, "{order:?}: nothing left unpolled");
    let s = sim.stats();
    assert_eq!(
        s.executed, s.posted,
        "{order:?}: each request took effect once"
    );
    let mut q = dmkit_fabric::SyncQp::new(f.as_ref(), 0, 64).unwrap();
    let word = u64::from_le_bytes(q.read(a, k, 8).unwrap().try_into().unwrap());
    let olds = olds.take();
    let per_thread = per_thread.take();
    let trace = format!("{olds:?}|{per_thread:?}|{word}|{}|{s:?}", out.now);
    HotRun {
        olds,
        per_thread,
        word,
        trace,
    }
}

/// Jain's fairness index of the per-thread counts.
fn jain(xs: &[u64]) -> f64 {
    let s: f64 = xs.iter().map(|&x| x as f64).sum();
    let q: f64 = xs.iter().map(|&x| (x as f64).powi(2)).sum();
    s * s / (xs.len() as f64 * q)
}

#[test]
fn every_order_serialises_a_hot_word_and_loses_nothing() {
    for order in AtomicOrder::ALL {
        let r = hot_word(order, 1, Faults::default(), 8, 2);
        let n = r.olds.len() as u64;
        assert!(n > 100, "{order:?}: {n} FAAs");
        let mut sorted = r.olds.clone();
        sorted.sort_unstable();
        assert_eq!(
            sorted,
            (0..n).collect::<Vec<_>>(),
            "{order:?}: each FAA saw a distinct count, none lost"
        );
        assert_eq!(r.word, n, "{order:?}: the word counts every FAA");
    }
}

#[test]
fn arbitrated_orders_replay_bit_for_bit() {
    let faults = Faults {
        disconnect: 0.0,
        ..Faults::consistency()
    };
    for order in [AtomicOrder::Random, AtomicOrder::RoundRobin] {
        let a = hot_word(order, 5, faults.clone(), 6, 3).trace;
        let b = hot_word(order, 5, faults.clone(), 6, 3).trace;
        assert_eq!(a, b, "{order:?}: same seed, same run");
    }
    let a = hot_word(AtomicOrder::Random, 5, Faults::default(), 6, 3).trace;
    let c = hot_word(AtomicOrder::Random, 6, Faults::default(), 6, 3).trace;
    assert_ne!(a, c, "the seed drives the random order");
}

#[test]
fn the_order_decides_who_is_served() {
    // One task per thread: each queue pair has one atomic at a time, so a
    // thread's share is the share of arbitrations its queue pair wins. 32
    // of them keep a queue at the word (32 holds outlast a round trip).
    let share = |order| {
        let r = hot_word(order, 1, Faults::default(), 32, 1);
        (jain(&r.per_thread), r.per_thread)
    };
    for order in [
        AtomicOrder::Post,
        AtomicOrder::Arrival,
        AtomicOrder::RoundRobin,
    ] {
        let (j, counts) = share(order);
        assert!(
            j > 0.95,
            "{order:?} serves everyone in turn: {j} {counts:?}"
        );
    }
    // The newest arrival wins: the queue pair just served comes back
    // first and the others starve.
    let (j, counts) = share(AtomicOrder::Newest);
    assert!(j < 0.5, "newest-first starves waiters: {j} {counts:?}");
    // A random pick serves everyone, unevenly.
    let (j, counts) = share(AtomicOrder::Random);
    assert!(
        counts.iter().all(|&c| c > 0),
        "random serves everyone: {counts:?}"
    );
    assert!(j < 0.99, "random is not round robin: {j} {counts:?}");
}

#[test]
fn a_thread_never_runs_before_its_last_step_ended() {
    // One thread, many tasks, each on its own word: a step posts an atomic
    // early and keeps running the other tasks for longer than the atomic
    // takes, so its completion comes due before the step's end. The
    // thread must resume after that end, not at the completion.
    let mut sim = Sim::new(config(AtomicOrder::Random, 1, Faults::default())).unwrap();
    let f = sim.dyn_fabric();
    let (a, _, k) = f.alloc_chunk(0, 1 << 16, true).unwrap();
    let tasks = 48;
    let th = common::add_worker(&mut sim, 0, 0, tasks, rcfg());
    let backwards = Rc::new(RefCell::new(0u64));
    for task in 0..tasks {
        let backwards = backwards.clone();
        sim.worker_mut(th).spawn(move |ctx| async move {
            let word = a.add(8 * task as u64);
            for _ in 0..50 {
                let before = ctx.now();
                ctx.faa_sync(RemoteRef::new(word, k), 1).await.unwrap();
                if ctx.now() <= before {
                    *backwards.borrow_mut() += 1;
                }
            }
        });
    }
    let out = sim.run();
    assert_eq!((out.finished, out.blocked), (1, 0));
    assert_eq!(
        *backwards.borrow(),
        0,
        "completions seen before their posts"
    );
}
