//! `nic.wr_ns` and `nic.sge_ns`: the queue pair's own processing unit at
//! the requester NIC. A post's requests after the first each hold it for
//! `wr_ns` and a scatter/gather request `sge_ns` per piece beyond the
//! first, one request at a time, so doorbell batching does not amortise
//! them (memory-semantics study §III-A, Fig. 4); a single request pays
//! neither. With `nic.processing_units` ≥ 1 the NIC has that many units
//! and queue pairs on different units overlap; with 0 (the NIC-wide
//! booking) one queue pair's unit time holds back every other one.

use std::cell::Cell;
use std::rc::Rc;

use dmkit_fabric::RemoteRef;
use dmkit_runtime::Local;
use dmkit_sim::Profile;

mod common;
use common::{one_node, unthrottled};

/// What one thread posts, all in one doorbell.
#[derive(Clone, Copy)]
enum Post {
    /// `n` 32-byte WRITEs.
    Writes(usize),
    /// One WRITE gathered from `n` 32-byte pieces.
    Gather(usize),
}

impl Post {
    /// Bytes it writes.
    fn bytes(self) -> u64 {
        match self {
            Post::Writes(n) | Post::Gather(n) => 32 * n as u64,
        }
    }
}

/// cx3-40g with the unit's costs `wr_ns` and `sge_ns` (and `units`
/// processing units, if given), and no translation miss on a first
/// access (its delay would overlap with the unit's). The NIC-wide
/// message rate is set far above the unit's (the profile's 4 Mops would
/// add its own spacing to each request) and the payload fetch is off
/// (the NIC-wide booking does not model it; `payload_fetch.rs` tests it).
fn profile(wr_ns: f64, sge_ns: f64, units: Option<u32>) -> Profile {
    let mut profile = Profile::builtin("cx3-40g").unwrap();
    profile.nic.wr_ns = wr_ns;
    profile.nic.sge_ns = sge_ns;
    profile.nic.iops = 1000.0;
    profile.nic.payload_fetch_ns = 0.0;
    if let Some(u) = units {
        profile.nic.processing_units = u;
    }
    profile.responder.mtt_miss_ns = 0.0;
    profile
}

/// Virtual ns from the start until each thread (one worker, one queue
/// pair each, on one machine) has made its post in one doorbell and seen
/// it complete: thread `w` makes `posts[w]`, into its own range of one
/// chunk.
fn posts_ns(profile: Profile, posts: &[Post]) -> Vec<u64> {
    let mut sim = one_node(profile);
    let f = sim.dyn_fabric();
    let (a, _, k) = f.alloc_chunk(0, 1 << 16, true).unwrap();
    let took: Vec<Rc<Cell<u64>>> = posts.iter().map(|_| Rc::new(Cell::new(0))).collect();
    let mut base = a;
    for (w, (&post, out)) in posts.iter().zip(&took).enumerate() {
        let t = common::add_worker(&mut sim, 0, w, 1, unthrottled());
        let (out, at) = (out.clone(), base);
        base = base.add(post.bytes());
        sim.worker_mut(t).spawn(move |ctx| async move {
            let s = ctx.now();
            match post {
                Post::Writes(n) => {
                    for i in 0..n {
                        let dst = RemoteRef::new(at.add(32 * i as u64), k);
                        ctx.write(dst, Local::at(32 * i, 32));
                    }
                }
                Post::Gather(n) => {
                    let pieces: Vec<Local> = (0..n).map(|i| Local::at(32 * i, 32)).collect();
                    ctx.write_v(RemoteRef::new(at, k), &pieces);
                }
            }
            ctx.post();
            ctx.sync().await.unwrap();
            out.set(ctx.now() - s);
        });
    }
    let r = sim.run();
    assert_eq!(r.finished, posts.len());
    let s = sim.stats();
    assert_eq!(s.executed, s.posted, "each request took effect once");
    took.iter().map(|c| c.get()).collect()
}

/// Virtual ns from the post until its last completion, with the unit's
/// costs set to `wr_ns` and `sge_ns`.
fn post_ns(wr_ns: f64, sge_ns: f64, post: Post) -> u64 {
    posts_ns(profile(wr_ns, sge_ns, None), &[post])[0]
}

#[test]
fn a_single_write_pays_neither_cost() {
    let base = post_ns(0.0, 0.0, Post::Writes(1));
    assert_eq!(post_ns(5_000.0, 5_000.0, Post::Writes(1)), base);
}

#[test]
fn each_request_after_the_first_holds_the_unit() {
    let n = 8;
    let one = post_ns(0.0, 0.0, Post::Writes(1));
    let base = post_ns(0.0, 0.0, Post::Writes(n));
    let slow = post_ns(1_000.0, 0.0, Post::Writes(n));
    // Without the cost, the requests pipeline: the post takes little more
    // than one round trip. With it, the last leaves the unit (n − 1) × 1 µs
    // after the first, whose round trip (plus building the longer post)
    // follows.
    assert!(base < one + 1_000, "{n} WRITEs: {base} ns, one: {one} ns");
    let floor = one + (n as u64 - 1) * 1_000;
    assert!(
        (floor..=floor + 1_000).contains(&slow),
        "{n} WRITEs in one post: {slow} ns with wr_ns = 1000, one WRITE {one} ns"
    );
}

#[test]
fn each_gathered_piece_after_the_first_holds_the_unit() {
    let base = post_ns(0.0, 0.0, Post::Gather(4));
    let slow = post_ns(0.0, 500.0, Post::Gather(4));
    let extra = slow - base;
    assert!(
        (1_500..=1_550).contains(&extra),
        "a 4-piece gather: {base} ns, {slow} ns with sge_ns = 500"
    );
    // A request's pieces are not requests: wr_ns does not apply to them.
    assert_eq!(post_ns(5_000.0, 0.0, Post::Gather(4)), base);
}

/// Virtual ns until each of `threads` threads has posted `n` 32-byte
/// WRITEs in one doorbell and seen them complete ([`posts_ns`]), with
/// `wr_ns` = 1000 and `processing_units` = `units`.
fn threads_ns(units: u32, threads: usize, n: usize) -> Vec<u64> {
    posts_ns(
        profile(1_000.0, 0.0, Some(units)),
        &vec![Post::Writes(n); threads],
    )
}

#[test]
fn queue_pairs_on_separate_units_overlap() {
    let n = 8;
    let alone = threads_ns(4, 1, n)[0];
    // One queue pair alone: the same as under the NIC-wide booking.
    assert_eq!(threads_ns(0, 1, n)[0], alone);
    // Four queue pairs on four units: each post takes (about) as long as
    // alone, not four times as long.
    for (t, ns) in threads_ns(4, 4, n).into_iter().enumerate() {
        assert!(
            ns < alone + 1_000,
            "thread {t}: {ns} ns with 4 units, alone {alone} ns"
        );
    }
}

#[test]
fn queue_pairs_on_one_unit_take_turns() {
    let n = 8;
    let alone = threads_ns(1, 1, n)[0];
    let mut both = threads_ns(1, 2, n);
    both.sort_unstable();
    // The second post waits for the first's unit time, (n − 1) µs.
    assert!(
        both[0] < alone + 1_000,
        "first: {} ns, alone {alone}",
        both[0]
    );
    let floor = alone + (n as u64 - 1) * 1_000;
    assert!(
        (floor - 500..=floor + 1_000).contains(&both[1]),
        "second: {} ns, alone {alone} ns",
        both[1]
    );
    // Three queue pairs on two units: two share one.
    let mut three = threads_ns(2, 3, n);
    three.sort_unstable();
    assert!(three[1] < alone + 1_000, "{three:?}, alone {alone}");
    assert!(three[2] >= floor - 500, "{three:?}, alone {alone}");
}

#[test]
fn the_nic_wide_booking_holds_back_other_queue_pairs() {
    let n = 8;
    let alone = threads_ns(0, 1, n)[0];
    let mut four = threads_ns(0, 4, n);
    four.sort_unstable();
    // The last post waits for the three others' whole unit time.
    let floor = alone + 3 * (n as u64 - 1) * 1_000;
    assert!(
        four[3] >= floor - 500,
        "{four:?} with the NIC-wide booking, alone {alone} ns"
    );
}
