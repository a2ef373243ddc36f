//! `responder.atomic_stalls_access`: a READ or WRITE of a word with
//! atomics queued on it waits until they have completed (SwordBox §3.2);
//! other words, even in the same cache line, do not wait; the switch off
//! keeps the original model, where the access overtakes the queue.

use std::cell::RefCell;
use std::rc::Rc;

use dmkit_sim::profile::AtomicOrder;
use dmkit_sim::{Profile, Sim, SimConfig};

mod common;
use common::{small, unthrottled};
use dmkit_fabric::RemoteRef;
use dmkit_runtime::Local;

fn config(stalls: bool) -> SimConfig {
    let mut profile = Profile::cx6();
    profile.responder.atomic_stalls_access = stalls;
    SimConfig {
        profile,
        memory_nodes: 1,
        seed: 1,
        ..small()
    }
}

/// FAAs queued on the hot word (one thread, one batch).
const QUEUED: u64 = 16;

/// What the second thread does while the FAAs queue.
#[derive(Clone, Copy, Debug)]
enum Access {
    /// READs the hot word.
    ReadHot,
    /// READs the next word (same cache line, no atomic on it).
    ReadCold,
    /// WRITEs 1000 to the hot word.
    WriteHot,
}

/// What the second thread saw.
#[derive(Debug)]
struct Seen {
    /// The word its READ returned (0 for a WRITE).
    value: u64,
    /// Virtual ns its access took.
    ns: u64,
    /// The hot word at the end.
    last: u64,
}

/// Thread 0 posts `QUEUED` FAAs on one word in one batch; thread 1, on its
/// own queue pair, makes `access` while they still queue.
fn run(stalls: bool, access: Access) -> Seen {
    let mut sim = Sim::new(config(stalls)).unwrap();
    let f = sim.dyn_fabric();
    let (a, _, k) = f.alloc_chunk(0, 1 << 16, true).unwrap();
    let wcfg = unthrottled();
    let seen: Rc<RefCell<Option<Seen>>> = Rc::default();
    let t0 = common::add_worker(&mut sim, 0, 0, 1, wcfg.clone());
    sim.worker_mut(t0).spawn(move |ctx| async move {
        for _ in 0..QUEUED {
            ctx.faa(RemoteRef::new(a, k), 1);
        }
        ctx.sync().await.unwrap();
    });
    let t1 = common::add_worker(&mut sim, 0, 1, 1, wcfg.clone());
    let out = seen.clone();
    sim.worker_mut(t1).spawn(move |ctx| async move {
        // Let the FAAs reach the responder first (they hold the word
        // `QUEUED` × `atomic_ns`, several µs).
        ctx.sleep(1_000).await;
        let s = ctx.now();
        match access {
            Access::ReadHot => ctx.read(RemoteRef::new(a, k), Local::at(0, 8)),
            Access::ReadCold => ctx.read(RemoteRef::new(a.add(8), k), Local::at(0, 8)),
            Access::WriteHot => {
                ctx.set_local_u64(Local::at(0, 8), 1000);
                ctx.write(RemoteRef::new(a, k), Local::at(0, 8))
            }
        };
        ctx.sync().await.unwrap();
        let value = match access {
            Access::WriteHot => 0,
            _ => ctx.local_u64(Local::at(0, 8)),
        };
        *out.borrow_mut() = Some(Seen {
            value,
            ns: ctx.now() - s,
            last: 0,
        });
    });
    let r = sim.run();
    assert_eq!(r.finished, 2);
    assert_eq!(sim.in_flight(), 0);
    let s = sim.stats();
    assert_eq!(s.executed, s.posted, "each request took effect once");
    let mut q = dmkit_fabric::SyncQp::new(f.as_ref(), 0, 64).unwrap();
    let last = u64::from_le_bytes(q.read(a, k, 8).unwrap().try_into().unwrap());
    let mut seen = seen.take().expect("thread 1 finished");
    seen.last = last;
    seen
}

#[test]
fn a_read_waits_for_the_atomics_queued_on_its_word() {
    let on = run(true, Access::ReadHot);
    let off = run(false, Access::ReadHot);
    assert_eq!(
        on.value, QUEUED,
        "the READ sees every FAA posted before it: {on:?}"
    );
    assert!(
        off.value < QUEUED,
        "without the stall the READ overtakes the queue: {off:?}"
    );
    assert!(on.ns > off.ns, "the stall costs time: {on:?} {off:?}");
    assert_eq!((on.last, off.last), (QUEUED, QUEUED));
}

#[test]
fn other_words_of_the_line_do_not_wait() {
    let on = run(true, Access::ReadCold);
    let off = run(false, Access::ReadCold);
    assert_eq!((on.value, off.value), (0, 0));
    assert_eq!(on.ns, off.ns, "no atomic on the word, no stall");
}

#[test]
fn a_write_lands_after_the_atomics_queued_on_its_word() {
    let on = run(true, Access::WriteHot);
    let off = run(false, Access::WriteHot);
    assert_eq!(
        on.last, 1000,
        "the WRITE lands after every queued FAA: {on:?}"
    );
    assert!(
        off.last > 1000 && off.last <= 1000 + QUEUED,
        "without the stall the WRITE overtakes queued FAAs: {off:?}"
    );
    assert!(on.ns > off.ns, "{on:?} {off:?}");
}

#[test]
fn the_stall_is_modelled_under_the_post_order_only() {
    for order in AtomicOrder::ALL {
        let mut c = config(true);
        c.profile.responder.atomic_order = order;
        let r = Sim::new(c);
        assert_eq!(
            r.is_ok(),
            order == AtomicOrder::Post,
            "{order:?}: {:?}",
            r.err()
        );
    }
}
