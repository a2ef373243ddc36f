//! The runtime over the shm backend: results, exactly-once completion, no
//! lost wake-ups, credit bounds, errors, statistics, virtual-time backoff.

use std::cell::Cell;
use std::rc::Rc;
use std::sync::Arc;

use dmkit_fabric::shm::{ShmConfig, ShmFabric};
use dmkit_fabric::{
    ControlPlane, Fabric, FabricError, GlobalAddr, RemoteRef, Rkey, SyncQp, VerbError,
};
use dmkit_memnode::NodeConfig;
use dmkit_runtime::{Clock, Local, MonotonicClock, RuntimeConfig, VirtualClock, Worker};

mod common;
use common::{worker, LOCAL_BYTES};

fn fabric() -> Arc<ShmFabric> {
    Arc::new(ShmFabric::one_node(ShmConfig::default(), 16 << 20).unwrap())
}

fn chunk(f: &ShmFabric, len: u64) -> (GlobalAddr, Rkey) {
    let (a, _, k) = f.alloc_chunk(0, len, true).unwrap();
    (a, k)
}

fn real() -> Arc<dyn Clock> {
    Arc::new(MonotonicClock)
}

#[test]
fn verbs_through_tasks_return_the_right_values() {
    let f = fabric();
    let (a, k) = chunk(&f, 4096);
    let mut w = worker(f.as_ref(), real(), RuntimeConfig::default(), 0, 4);
    let done = Rc::new(Cell::new(false));
    let d = done.clone();
    w.spawn(move |ctx| async move {
        ctx.put_local(
            Local::at(0, b"hello, far memory".len()),
            b"hello, far memory",
        );
        ctx.write_sync(RemoteRef::new(a.add(8), k), Local::at(0, 17))
            .await
            .unwrap();
        ctx.read_sync(RemoteRef::new(a.add(8), k), Local::at(100, 17))
            .await
            .unwrap();
        assert_eq!(ctx.local_vec(Local::at(100, 17)), b"hello, far memory");
        assert_eq!(ctx.faa_sync(RemoteRef::new(a, k), 5).await.unwrap(), 0);
        assert_eq!(ctx.cas_sync(RemoteRef::new(a, k), 5, 9).await.unwrap(), 5);
        assert_eq!(ctx.cas_sync(RemoteRef::new(a, k), 5, 1).await.unwrap(), 9);
        // Several requests, one post, one sync: tickets give each result.
        let t1 = ctx.faa(RemoteRef::new(a, k), 1);
        let t2 = ctx.faa(RemoteRef::new(a, k), 1);
        let t3 = ctx.read(RemoteRef::new(a, k), Local::at(200, 8));
        ctx.post();
        ctx.sync().await.unwrap();
        assert_eq!((ctx.value(t1), ctx.value(t2), ctx.value(t3)), (9, 10, 8));
        assert_eq!(ctx.local_u64(Local::at(200, 8)), 11);
        d.set(true);
    });
    w.run();
    assert!(done.get());
    let s = w.stats();
    assert_eq!(s.counters.round_trips, 6);
    assert_eq!(
        (
            s.counters.reads,
            s.counters.writes,
            s.counters.faa,
            s.counters.cas
        ),
        (2, 1, 3, 2)
    );
    assert_eq!(s.completed_wrs, 8);
}

/// Many workers × many tasks increment shared counters with FAA and with
/// CAS retry loops; every increment must land exactly once, every task must
/// finish (a lost wake-up would hang `run`), and each worker's books balance.
#[test]
fn stress_exact_sums_and_no_lost_wakeups() {
    let f = fabric();
    let (a, k) = chunk(&f, 4096);
    let (workers, tasks, iters) = (3usize, 16usize, 300u64);
    let stats: Vec<_> = std::thread::scope(|s| {
        let hs: Vec<_> = (0..workers)
            .map(|wi| {
                let f = f.clone();
                s.spawn(move || {
                    let cfg = RuntimeConfig {
                        fixed_c_max: Some(6),
                        ..Default::default()
                    };
                    let mut w = worker(f.as_ref(), real(), cfg, wi, tasks);
                    for t in 0..tasks {
                        w.spawn(move |ctx| async move {
                            for i in 0..iters {
                                let _op = ctx.op("incr").await;
                                // Two FAA on different words in one post.
                                ctx.faa(RemoteRef::new(a, k), 1);
                                ctx.faa(RemoteRef::new(a.add(8 * (1 + (t as u64 % 4))), k), 1);
                                ctx.post();
                                ctx.sync().await.unwrap();
                                // A CAS increment with retries.
                                let mut cur = 0;
                                loop {
                                    let old = ctx
                                        .backoff_cas(RemoteRef::new(a.add(64), k), cur, cur + 1)
                                        .await
                                        .unwrap();
                                    if old == cur {
                                        break;
                                    }
                                    cur = old;
                                }
                                if i % 50 == 0 {
                                    ctx.sleep(1_000).await;
                                }
                            }
                        });
                    }
                    w.run();
                    assert_eq!(w.live_tasks(), 0);
                    let (c_max, avail) = w.credits();
                    assert_eq!((c_max, avail), (6, 6), "all credits refunded");
                    w.stats()
                })
            })
            .collect();
        hs.into_iter().map(|h| h.join().unwrap()).collect()
    });
    let total = workers as u64 * tasks as u64 * iters;
    let mut q = SyncQp::new(f.as_ref(), 0, 64).unwrap();
    assert_eq!(q.read_u64(a, k).unwrap(), total);
    let spread: u64 = (1..=4).map(|i| q.read_u64(a.add(8 * i), k).unwrap()).sum();
    assert_eq!(spread, total);
    assert_eq!(
        q.read_u64(a.add(64), k).unwrap(),
        total,
        "CAS increments exact"
    );
    let mut merged = dmkit_runtime::WorkerStats::default();
    for s in &stats {
        merged.merge(s);
    }
    let op = &merged.ops["incr"];
    assert_eq!(op.count, total);
    assert_eq!(merged.counters.faa, 2 * total);
    assert_eq!(merged.counters.cas, total + merged.counters.cas_failures);
    assert!(op.latency.len() == total);
    assert!(op.per_op(|c| c.round_trips) >= 2.0);
}

/// With a fixed C_max, the credits stay within [0, C_max] after every step
/// while tasks post batches of many sizes, and throttling really defers.
#[test]
fn credits_stay_within_bounds() {
    let f = fabric();
    let (a, k) = chunk(&f, 1 << 16);
    let cfg = RuntimeConfig {
        fixed_c_max: Some(8),
        ..Default::default()
    };
    let mut w = worker(f.as_ref(), real(), cfg, 0, 12);
    for t in 0..12u64 {
        w.spawn(move |ctx| async move {
            for i in 0..200u64 {
                let n = 1 + (i * 7 + t) % 8;
                for j in 0..n {
                    ctx.read(
                        RemoteRef::new(a.add(8 * ((t * 64 + j) % 8000)), k),
                        Local::at(8 * j as usize, 8),
                    );
                }
                ctx.post();
                ctx.sync().await.unwrap();
            }
        });
    }
    let mut steps = 0;
    while w.live_tasks() > 0 {
        w.step();
        let (c_max, avail) = w.credits();
        assert_eq!(c_max, 8);
        assert!((0..=8).contains(&avail), "credits {avail} out of [0, 8]");
        steps += 1;
    }
    assert!(steps > 0);
    assert_eq!(w.credits(), (8, 8));
    let s = w.stats();
    assert!(
        s.counters.throttled_posts > 0,
        "12 tasks × up to 8 requests must hit C_max = 8"
    );
}

#[test]
fn errors_reach_the_failing_task_only() {
    let f = fabric();
    let (a, k) = chunk(&f, 4096);
    let mut w = worker(f.as_ref(), real(), RuntimeConfig::default(), 0, 2);
    let ok = Rc::new(Cell::new(0));
    let o = ok.clone();
    w.spawn(move |ctx| async move {
        ctx.faa(RemoteRef::new(a, k), 1);
        ctx.read(RemoteRef::new(a, k ^ 0x100), Local::at(0, 8));
        ctx.faa(RemoteRef::new(a, k), 1);
        match ctx.sync().await {
            Err(FabricError::Request(e)) => {
                assert_eq!(e.error, VerbError::BadKey { rkey: k ^ 0x100 });
                assert_eq!(e.index, 1, "the error names the request's batch position");
            }
            other => panic!("{other:?}"),
        }
        // The task continues normally afterwards.
        assert_eq!(
            ctx.faa_sync(RemoteRef::new(a.add(8), k), 1).await.unwrap(),
            0
        );
        let bad_node = GlobalAddr::new(42, 8);
        assert!(matches!(
            ctx.read_sync(RemoteRef::new(bad_node, k), Local::at(0, 8))
                .await,
            Err(FabricError::NoSuchNode(42))
        ));
        o.set(o.get() + 1);
    });
    let o = ok.clone();
    w.spawn(move |ctx| async move {
        for _ in 0..100 {
            ctx.faa_sync(RemoteRef::new(a.add(16), k), 1).await.unwrap();
        }
        o.set(o.get() + 1);
    });
    w.run();
    assert_eq!(ok.get(), 2);
    let mut q = SyncQp::new(f.as_ref(), 0, 64).unwrap();
    assert_eq!(
        q.read_u64(a, k).unwrap(),
        1,
        "the FAA after the failure was flushed"
    );
    assert_eq!(q.read_u64(a.add(16), k).unwrap(), 100);
    assert_eq!(
        w.credits().1,
        w.credits().0 as i64,
        "failed batches refund their credits"
    );
}

/// Backoff sleeps run on the worker's clock: in virtual time a task that
/// lost a CAS resumes only once the clock passes its delay, and the delay is
/// within equation (1)'s bounds for the first retry: [t0, 2·t0).
#[test]
fn backoff_sleeps_in_virtual_time() {
    let f = fabric();
    let (a, k) = chunk(&f, 4096);
    let clock = VirtualClock::new();
    let cfg = RuntimeConfig {
        throttle: false,
        ..Default::default()
    };
    let t0 = cfg.backoff.t0;
    let mut w = worker(f.as_ref(), Arc::new(clock.clone()), cfg, 0, 1);
    let done = Rc::new(Cell::new(None));
    let d = done.clone();
    w.spawn(move |ctx| async move {
        let _op = ctx.op("cas").await;
        let old = ctx.backoff_cas(RemoteRef::new(a, k), 7, 8).await.unwrap();
        d.set(Some((old, ctx.now())));
    });
    for _ in 0..20 {
        w.step();
    }
    assert!(
        done.get().is_none(),
        "still backing off: virtual time has not moved"
    );
    let wake = w.next_timer().expect("a backoff timer is armed");
    assert!(
        (t0..2 * t0).contains(&wake),
        "first retry delay {wake} outside [t0, 2t0)"
    );
    clock.advance_to(wake - 1);
    w.step();
    assert!(done.get().is_none());
    clock.advance_to(wake);
    w.run();
    assert_eq!(done.get(), Some((0, wake)));
    let s = w.stats();
    assert_eq!((s.counters.cas_failures, s.counters.retries), (1, 1));
    assert_eq!(s.counters.backoff_ns, wake);
}

/// `Ctx::backoff`, the one backoff of every data structure's retry loop:
/// with conflict avoidance on it sleeps equation (1)'s delay, growing with
/// the operation's retries; off, it returns at once. Either way it counts
/// a retry, and only a guarded operation's retries feed γ.
#[test]
fn retry_backoff_follows_the_conflict_avoidance_switch() {
    for avoid in [true, false] {
        let f = fabric();
        let clock = VirtualClock::new();
        let cfg = RuntimeConfig {
            throttle: false,
            conflict_avoid: avoid,
            backoff: dmkit_runtime::backoff::BackoffConfig {
                // t_max at its ceiling from the start would need γ; a large
                // interval keeps it at t0, so delays are in [t0, 2·t0).
                interval: 1 << 40,
                ..Default::default()
            },
            ..Default::default()
        };
        let t0 = cfg.backoff.t0;
        let mut w = worker(f.as_ref(), Arc::new(clock.clone()), cfg, 0, 1);
        let done = Rc::new(Cell::new(None));
        let d = done.clone();
        w.spawn(move |ctx| async move {
            let _op = ctx.read_op("search").await;
            let start = ctx.now();
            for _ in 0..3 {
                ctx.backoff().await;
            }
            d.set(Some(ctx.now() - start));
        });
        let mut sleeps = 0;
        while w.live_tasks() > 0 {
            w.step();
            if let Some(t) = w.next_timer() {
                sleeps += 1;
                clock.advance_to(t);
            }
        }
        let s = w.stats();
        assert_eq!(s.counters.retries, 3, "every backoff counts a retry");
        let slept = done.get().expect("the task finished");
        if avoid {
            assert_eq!(sleeps, 3);
            assert!(
                (3 * t0..6 * t0).contains(&slept),
                "three delays in [t0, 2t0): {slept}"
            );
            assert_eq!(s.counters.backoff_ns, slept);
        } else {
            assert_eq!((sleeps, slept, s.counters.backoff_ns), (0, 0, 0));
        }
    }
    // γ: retries of a guarded operation count, a lookup's do not.
    let (_, _, clock, mut w) = contended_worker();
    for guarded in [false, true] {
        w.spawn(move |ctx| async move {
            for _ in 0..20 {
                let _op = if guarded {
                    ctx.op("update").await
                } else {
                    ctx.read_op("search").await
                };
                ctx.backoff().await;
                ctx.backoff().await;
            }
        });
        while w.live_tasks() > 0 {
            w.step();
            clock.advance(500);
        }
        let limit = w.stats().task_limit[0];
        if guarded {
            assert!(
                limit < 8,
                "γ = 2/3 over guarded updates shrinks c_max: {limit}"
            );
        } else {
            assert_eq!(limit, 8, "a lookup's retries leave c_max alone");
        }
    }
}

/// A worker of 8 tasks with conflict avoidance evaluated every µs of a
/// virtual clock, and a word for its CAS to fail on.
fn contended_worker() -> (GlobalAddr, Rkey, VirtualClock, Worker) {
    let f = fabric();
    let (a, k) = chunk(&f, 4096);
    let clock = VirtualClock::new();
    let cfg = RuntimeConfig {
        throttle: false,
        backoff: dmkit_runtime::backoff::BackoffConfig {
            interval: 1_000,
            ..Default::default()
        },
        ..Default::default()
    };
    let w = worker(f.as_ref(), Arc::new(clock.clone()), cfg, 0, 8);
    (a, k, clock, w)
}

#[test]
fn op_scopes_limit_concurrency_to_c_max() {
    let (a, k, clock, mut w) = contended_worker();
    let inside = Rc::new(Cell::new(0u32));
    let peak = Rc::new(Cell::new(0u32));
    for _ in 0..8 {
        let (inside, peak) = (inside.clone(), peak.clone());
        w.spawn(move |ctx| async move {
            for _ in 0..40 {
                let _op = ctx.op("contended").await;
                inside.set(inside.get() + 1);
                peak.set(peak.get().max(inside.get()));
                // Every CAS expects a stale value: two retries per
                // operation, γ = 2 / (2 + 1) > γ_H, so c_max must shrink.
                ctx.backoff_cas(RemoteRef::new(a, k), 1, 2).await.unwrap();
                ctx.backoff_cas(RemoteRef::new(a, k), 1, 2).await.unwrap();
                inside.set(inside.get() - 1);
            }
        });
    }
    // Tasks already inside an operation finish it when c_max shrinks; the
    // invariant is on admissions: the count inside only grows within the limit.
    let mut limits = vec![8u32];
    let mut prev_inside = 0;
    while w.live_tasks() > 0 {
        w.step();
        clock.advance(500);
        let l = w.stats().task_limit[0];
        let prev_l = *limits.last().unwrap();
        if inside.get() > prev_inside {
            assert!(
                inside.get() <= prev_l.max(l),
                "{} inside after admissions, limit {prev_l}→{l}",
                inside.get()
            );
        }
        prev_inside = inside.get();
        limits.push(l);
    }
    assert_eq!(
        peak.get(),
        8,
        "all 8 tasks ran concurrently before γ was measured"
    );
    assert_eq!(
        *limits.iter().min().unwrap(),
        1,
        "c_max shrank to 1 under γ = 2/3"
    );
    let s = w.stats();
    assert!(
        s.t_max[0] > RuntimeConfig::default().backoff.t0,
        "t_max grew once c_max hit 1"
    );
    assert_eq!(s.ops["contended"].count, 320);
}

#[test]
fn thread_aware_off_needs_caller_made_queue_pairs() {
    let f = fabric();
    let cfg = RuntimeConfig {
        thread_aware: false,
        ..Default::default()
    };
    match Worker::builder(f.as_ref())
        .clock(real())
        .config(cfg)
        .id(0)
        .tasks(1)
        .local_bytes(LOCAL_BYTES)
        .build()
    {
        Err(FabricError::Connect { reason, .. }) => assert!(reason.contains("Worker::builder_on")),
        other => panic!("{:?}", other.err()),
    }
}

/// Vector IO forms (memory-semantics §III-A): doorbell batching, SGL
/// scatter/gather, software packing; and a post larger than the backend's
/// batch limit, split with vector requests keeping their entries.
#[test]
fn vector_io_forms() {
    let f = fabric();
    let (a, k) = chunk(&f, 1 << 16);
    let mut w = worker(f.as_ref(), real(), RuntimeConfig::default(), 0, 1);
    let done = Rc::new(Cell::new(false));
    let d = done.clone();
    w.spawn(move |ctx| async move {
        ctx.put_local(Local::at(0, b"alpha".len()), b"alpha");
        ctx.put_local(Local::at(100, b"-beta-".len()), b"-beta-");
        ctx.put_local(Local::at(300, b"gamma".len()), b"gamma");
        // SGL gather: three local pieces, one remote range, one round trip.
        ctx.write_v(
            RemoteRef::new(a, k),
            &[Local::at(0, 5), Local::at(100, 6), Local::at(300, 5)],
        );
        ctx.sync().await.unwrap();
        ctx.read_sync(RemoteRef::new(a, k), Local::at(1000, 16))
            .await
            .unwrap();
        assert_eq!(ctx.local_vec(Local::at(1000, 16)), b"alpha-beta-gamma");
        // SGL scatter.
        let t = ctx.read_v(
            RemoteRef::new(a, k),
            &[Local::at(2000, 6), Local::at(3000, 10)],
        );
        ctx.sync().await.unwrap();
        assert_eq!(ctx.value(t), 16);
        assert_eq!(
            (
                ctx.local_vec(Local::at(2000, 6)),
                ctx.local_vec(Local::at(3000, 10))
            ),
            (b"alpha-".to_vec(), b"beta-gamma".to_vec())
        );
        // Software packing.
        ctx.write_packed(
            RemoteRef::new(a.add(64), k),
            Local::at(4000, 7),
            &[b"one", b"+", b"two"],
        );
        ctx.sync().await.unwrap();
        ctx.read_sync(RemoteRef::new(a.add(64), k), Local::at(5000, 7))
            .await
            .unwrap();
        assert_eq!(ctx.local_vec(Local::at(5000, 7)), b"one+two");
        // One post of 300 requests (limit 256) mixing vector writes.
        for i in 0..300u64 {
            if i % 50 == 0 {
                ctx.write_v(
                    RemoteRef::new(a.add(4096 + 8 * i), k),
                    &[Local::at(0, 4), Local::at(300, 4)],
                );
            } else {
                ctx.faa(RemoteRef::new(a.add(4096 + 8 * i), k), i);
            }
        }
        ctx.post();
        ctx.sync().await.unwrap();
        ctx.read_sync(RemoteRef::new(a.add(4096), k), Local::at(8000, 2400))
            .await
            .unwrap();
        for i in 0..300usize {
            let got = ctx.local_vec(Local::at(8000 + 8 * i, 8));
            if i % 50 == 0 {
                assert_eq!(
                    got, b"alphgamm",
                    "vector write {i} kept its entries across the split"
                );
            } else {
                assert_eq!(u64::from_ne_bytes(got.try_into().unwrap()), i as u64);
            }
        }
        d.set(true);
    });
    w.run();
    assert!(done.get());
    assert!(
        w.stats().counters.doorbells >= 2 + 5,
        "the 300-request post took two doorbells"
    );
}

/// Workers sharing one queue pair per node (thread-aware allocation off)
/// still complete every request exactly once.
#[test]
fn workers_on_a_shared_queue_pair() {
    let f = fabric();
    let (a, k) = chunk(&f, 4096);
    let workers = 3;
    let handles = dmkit_fabric::SharedQp::share(f.connect(0).unwrap(), workers);
    std::thread::scope(|s| {
        for (wi, h) in handles.into_iter().enumerate() {
            s.spawn(move || {
                let cfg = RuntimeConfig {
                    thread_aware: false,
                    ..Default::default()
                };
                let mut w = Worker::builder_on(vec![Box::new(h)])
                    .clock(real())
                    .config(cfg)
                    .id(wi)
                    .tasks(4)
                    .local_bytes(LOCAL_BYTES)
                    .build()
                    .unwrap();
                for _ in 0..4 {
                    w.spawn(move |ctx| async move {
                        for _ in 0..500 {
                            ctx.faa(RemoteRef::new(a, k), 1);
                            ctx.read(RemoteRef::new(a.add(8), k), Local::at(0, 8));
                            ctx.post();
                            ctx.sync().await.unwrap();
                        }
                    });
                }
                w.run();
                assert_eq!(w.stats().counters.round_trips, 4 * 500);
            });
        }
    });
    let mut q = SyncQp::new(f.as_ref(), 0, 64).unwrap();
    assert_eq!(q.read_u64(a, k).unwrap(), workers as u64 * 4 * 500);
}

/// Batches are recycled, not accumulated: the pool stays bounded however
/// many rounds the tasks post (it once grew by one batch per post).
#[test]
fn batch_pool_stays_bounded() {
    let f = fabric();
    let (a, k) = chunk(&f, 4096);
    let mut w = worker(f.as_ref(), real(), RuntimeConfig::default(), 0, 4);
    for _ in 0..4 {
        w.spawn(move |ctx| async move {
            for i in 0..5_000u64 {
                ctx.read(RemoteRef::new(a, k), Local::at(0, 8));
                let t = ctx.faa(RemoteRef::new(a.add(8), k), 1);
                ctx.write(RemoteRef::new(a.add(16), k), Local::at(0, 8));
                ctx.post();
                ctx.sync().await.unwrap();
                assert!(ctx.value(t) >= i, "FAA results still reach their tickets");
            }
        });
    }
    w.run();
    assert!(
        w.pooled_batches() <= 8,
        "{} batches pooled after 20 000 posts",
        w.pooled_batches()
    );
    assert_eq!(w.stats().counters.doorbells, 20_000);
}

#[test]
fn read_op_scopes_are_not_throttled_or_counted() {
    let (a, k, clock, mut w) = contended_worker();
    let readers = Rc::new(Cell::new(0u32));
    for _ in 0..8 {
        let readers = readers.clone();
        w.spawn(move |ctx| async move {
            for _ in 0..40 {
                {
                    // A contended update: γ = 2/3, so c_max shrinks to 1.
                    let _op = ctx.op("update").await;
                    ctx.backoff_cas(RemoteRef::new(a, k), 1, 2).await.unwrap();
                    ctx.backoff_cas(RemoteRef::new(a, k), 1, 2).await.unwrap();
                }
                let _op = ctx.read_op("search").await;
                readers.set(readers.get() + 1);
                ctx.read_sync(RemoteRef::new(a, k), Local::at(0, 8))
                    .await
                    .unwrap();
                readers.set(readers.get() - 1);
            }
        });
    }
    let mut readers_past_limit = 0;
    while w.live_tasks() > 0 {
        w.step();
        clock.advance(500);
        if w.stats().task_limit[0] == 1 && readers.get() > 1 {
            readers_past_limit = readers_past_limit.max(readers.get());
        }
    }
    assert!(
        readers_past_limit > 1,
        "lookups must not wait for the single update slot"
    );
    let s = w.stats();
    assert_eq!(s.task_limit[0], 1, "the updates alone drove c_max to 1");
    assert_eq!(s.ops["search"].count, 320);
    assert_eq!(s.ops["update"].count, 320);
}

/// A machine's ticket locks: holders are exclusive and served in ticket
/// order, a hand-over reaches the next waiter only while someone waits, the
/// holder allows it and the budget lasts.
#[test]
fn ticket_locks_are_exclusive_fifo_and_bound_hand_overs() {
    use dmkit_runtime::machine::TicketLocks;
    let (_a, _k, clock, mut w) = contended_worker();
    let locks = Arc::new(TicketLocks::new(2, 2));
    let inside = Rc::new(Cell::new(0u32));
    let order = Rc::new(std::cell::RefCell::new(Vec::new()));
    let handed = Rc::new(std::cell::RefCell::new(Vec::new()));
    for task in 0..6usize {
        let (locks, inside, order, handed) =
            (locks.clone(), inside.clone(), order.clone(), handed.clone());
        w.spawn(move |ctx| async move {
            // Stagger the arrivals so ticket order is task order.
            ctx.sleep(10 * task as u64).await;
            let g = locks.acquire(&ctx, 1).await;
            inside.set(inside.get() + 1);
            assert_eq!(inside.get(), 1, "two holders of one entry");
            order.borrow_mut().push(task);
            handed.borrow_mut().push(g.handed);
            ctx.sleep(1_000).await;
            inside.set(inside.get() - 1);
            // Task 3 refuses to hand over (its buffer is "full").
            locks.hand_over_if(g, task != 3);
            locks.release(g);
        });
    }
    while w.live_tasks() > 0 {
        w.step();
        clock.advance(100);
    }
    assert_eq!(*order.borrow(), vec![0, 1, 2, 3, 4, 5]);
    // 0 takes the remote lock, hands to 1 and 2 (budget 2), 2 must release,
    // 3 takes it afresh and refuses, 4 takes it afresh and hands to 5.
    assert_eq!(
        *handed.borrow(),
        vec![false, true, true, false, false, true]
    );
    assert!(!locks.contended(1));
}

/// A task's queued requests to many memory nodes all go out with its
/// sync, past the 63rd queue pair too (queue pairs from 63 up share one
/// bit of the task's "queued to" mask): atomics, READs and vector WRITEs.
#[test]
fn one_sync_posts_to_seventy_memory_nodes() {
    let nodes: Vec<NodeConfig> = (0..70u16)
        .map(|n| NodeConfig {
            node_id: n,
            size: 1 << 20,
            ..Default::default()
        })
        .collect();
    let f = Arc::new(ShmFabric::embedded(ShmConfig::default(), &nodes).unwrap());
    let chunks: Vec<(GlobalAddr, Rkey)> = (0..70u16)
        .map(|n| {
            let (a, _, k) = f.alloc_chunk(n, 4096, true).unwrap();
            (a, k)
        })
        .collect();
    let mut w = worker(f.as_ref(), real(), RuntimeConfig::default(), 0, 1);
    let done = Rc::new(Cell::new(false));
    let d = done.clone();
    let c = chunks.clone();
    w.spawn(move |ctx| async move {
        let targets = [69usize, 0, 64, 63, 62, 1, 66];
        let tickets: Vec<_> = targets
            .iter()
            .map(|&n| ctx.faa(RemoteRef::new(c[n].0, c[n].1), n as u64 + 1))
            .collect();
        ctx.put_local(Local::at(0, 8), &7u64.to_le_bytes());
        ctx.put_local(Local::at(8, 8), &9u64.to_le_bytes());
        let wv = ctx.write_v(
            RemoteRef::new(c[67].0, c[67].1),
            &[Local::at(0, 8), Local::at(8, 8)],
        );
        ctx.sync().await.unwrap();
        assert!(tickets.iter().all(|&t| ctx.value(t) == 0));
        assert_eq!(ctx.value(wv), 16);
        // Second round: READs of what the first wrote.
        ctx.read(RemoteRef::new(c[69].0, c[69].1), Local::at(16, 8));
        ctx.read(RemoteRef::new(c[67].0.add(8), c[67].1), Local::at(24, 8));
        ctx.read(RemoteRef::new(c[63].0, c[63].1), Local::at(32, 8));
        ctx.sync().await.unwrap();
        assert_eq!(ctx.local_u64(Local::at(16, 8)), 70);
        assert_eq!(ctx.local_u64(Local::at(24, 8)), 9);
        assert_eq!(ctx.local_u64(Local::at(32, 8)), 64);
        d.set(true);
    });
    w.run();
    assert!(done.get(), "the task finished");
    for (n, &(a, k)) in chunks.iter().enumerate() {
        let mut q = SyncQp::new(f.as_ref(), n as u16, 64).unwrap();
        let want = match n {
            69 | 0 | 64 | 63 | 62 | 1 | 66 => n as u64 + 1,
            67 => 7,
            _ => 0,
        };
        let got = u64::from_le_bytes(q.read(a, k, 8).unwrap().try_into().unwrap());
        assert_eq!(got, want, "node {n}");
    }
    assert_eq!(w.stats().counters.round_trips, 2);
}

/// Tasks call the node's echo service: raw and typed, many at once (more
/// than the channel holds, so some wait in the worker), with verbs in the
/// same task; RPCs are counted apart from verbs.
#[test]
fn tasks_call_services_and_rpcs_are_counted_apart() {
    let f = Arc::new(
        ShmFabric::embedded(
            ShmConfig {
                rpc_slots: 4,
                ..Default::default()
            },
            &[NodeConfig {
                size: 16 << 20,
                rpc_workers: 1,
                ..Default::default()
            }],
        )
        .unwrap(),
    );
    let (a, k) = chunk(&f, 4096);
    let mut w = Worker::builder(f.as_ref())
        .clock(real())
        .tasks(16)
        .local_bytes(LOCAL_BYTES)
        .build()
        .unwrap();
    let ok = Rc::new(Cell::new(0));
    for t in 0..16u64 {
        let ok = ok.clone();
        w.spawn(move |ctx| async move {
            let _op = ctx.op("mixed").await;
            for i in 0..20u64 {
                let msg = format!("task {t} call {i}").into_bytes();
                assert_eq!(
                    ctx.call(0, dmkit_runtime::rpc::ECHO, msg.clone()).await,
                    Ok(msg)
                );
                let typed = vec![t as u8; i as usize];
                assert_eq!(
                    ctx.call_typed::<dmkit_runtime::Echo>(0, &typed).await,
                    Ok(typed)
                );
                ctx.faa_sync(RemoteRef::new(a, k), 1).await.unwrap();
            }
            // Failures are typed; the channel goes on.
            assert_eq!(
                ctx.call(0, 999, b"x".to_vec()).await,
                Err(dmkit_runtime::CallError::Failed(
                    dmkit_fabric::RpcFailure::NoSuchService(999)
                ))
            );
            assert!(matches!(
                ctx.call(7, 0, b"x".to_vec()).await,
                Err(dmkit_runtime::CallError::NoChannel { node: 7, .. })
            ));
            ok.set(ok.get() + 1);
        });
    }
    w.run();
    assert_eq!(ok.get(), 16);
    let st = w.stats();
    let c = st.counters;
    assert_eq!(
        c.rpc_calls,
        16 * 41,
        "the call to a missing node never started"
    );
    assert_eq!(c.rpc_failures, 16);
    assert_eq!(c.faa, 16 * 20);
    assert_eq!(c.round_trips, 16 * 20, "RPCs are not verb round trips");
    assert!(c.rpc_throttled > 0, "16 tasks on a 4-slot channel wait");
    let echo = st.rpc_service(0).unwrap();
    assert_eq!(echo.count, 16 * 40);
    assert!(echo.latency.value_at_quantile(0.5) > 0);
    assert_eq!(st.rpc_service(999).unwrap().counters.rpc_failures, 16);
    // The operation scope saw its RPCs.
    assert_eq!(st.ops["mixed"].counters.rpc_calls, 16 * 41);
    assert_eq!(f.node_stats(0).unwrap().rpc_requests, 16 * 41);
}

#[test]
fn a_call_without_rpc_workers_is_a_typed_error() {
    let f = ShmFabric::embedded(
        ShmConfig::default(),
        &[NodeConfig {
            size: 4 << 20,
            rpc_workers: 0,
            ..Default::default()
        }],
    )
    .unwrap();
    let mut w = Worker::builder(&f).clock(real()).build().unwrap();
    let got = Rc::new(Cell::new(false));
    let g = got.clone();
    w.spawn(move |ctx| async move {
        assert!(!ctx.has_rpc(0));
        match ctx.call(0, 0, Vec::new()).await {
            Err(dmkit_runtime::CallError::NoChannel { node: 0, reason }) => {
                assert!(reason.contains("no RPC workers"), "{reason}")
            }
            other => panic!("{other:?}"),
        }
        g.set(true);
    });
    w.run();
    assert!(got.get());
}
