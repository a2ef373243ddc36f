//! `link.response_gaps`: a response takes the first idle gap of its links
//! once its request has executed. Under the FIFO rule (off) the responses
//! of atomics queued at a hot word, booked microseconds ahead in posting
//! order, hold back the response of a READ another queue pair posted after
//! them on another word, though the READ executed long before; with gaps
//! the READ's response leaves when it is ready.

use std::cell::RefCell;
use std::rc::Rc;

use dmkit_fabric::RemoteRef;
use dmkit_runtime::Local;
use dmkit_sim::Profile;

mod common;
use common::{one_node, unthrottled};

/// FAAs queued on the hot word (one thread, one batch).
const QUEUED: u64 = 16;

/// Virtual ns thread 1's READ of a cold word takes, 1 µs after thread 0
/// (its own queue pair) posted `faas` FAAs on a hot word in one batch.
fn read_ns(gaps: bool, faas: u64) -> u64 {
    let mut profile = Profile::cx6();
    profile.link.response_gaps = gaps;
    profile.responder.atomic_stalls_access = false;
    let mut sim = one_node(profile);
    let f = sim.dyn_fabric();
    let (a, _, k) = f.alloc_chunk(0, 1 << 16, true).unwrap();
    let t0 = common::add_worker(&mut sim, 0, 0, 1, unthrottled());
    sim.worker_mut(t0).spawn(move |ctx| async move {
        for _ in 0..faas {
            ctx.faa(RemoteRef::new(a, k), 1);
        }
        ctx.sync().await.unwrap();
    });
    let t1 = common::add_worker(&mut sim, 0, 1, 1, unthrottled());
    let took: Rc<RefCell<Option<u64>>> = Rc::default();
    let out = took.clone();
    sim.worker_mut(t1).spawn(move |ctx| async move {
        ctx.sleep(1_000).await;
        let s = ctx.now();
        ctx.read(RemoteRef::new(a.add(4096), k), Local::at(0, 8));
        ctx.sync().await.unwrap();
        *out.borrow_mut() = Some(ctx.now() - s);
    });
    let r = sim.run();
    assert_eq!(r.finished, 2);
    let s = sim.stats();
    assert_eq!(s.executed, s.posted);
    took.take().expect("thread 1 finished")
}

#[test]
fn a_read_is_not_held_back_by_another_queue_pairs_queued_atomics() {
    // One FAA does not queue: its response has left before the READ's is
    // ready, under either rule (and it warms the translation cache as
    // the queued ones do).
    let alone = read_ns(false, 1);
    assert_eq!(read_ns(true, 1), alone, "no queue: both rules agree");
    let fifo = read_ns(false, QUEUED);
    let gaps = read_ns(true, QUEUED);
    // The FAAs hold the word `QUEUED` × `atomic_ns` (7.2 µs on cx6): under
    // the FIFO the READ's response waits behind theirs.
    assert!(fifo > alone + 3_000, "FIFO: {fifo} ns, alone {alone} ns");
    // With gaps it shares the links only with the FAAs' responses that
    // leave meanwhile (a 64-byte response at most to wait for).
    assert!(gaps < alone + 50, "gaps: {gaps} ns, alone {alone} ns");
}
