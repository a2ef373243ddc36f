//! `nic.wr_ns` and `nic.sge_ns`: the queue pair's own processing unit at
//! the requester NIC. A post's requests after the first each hold it for
//! `wr_ns` and a scatter/gather request `sge_ns` per piece beyond the
//! first, one request at a time, so doorbell batching does not amortise
//! them (memory-semantics study §III-A, Fig. 4); a single request pays
//! neither.

use std::cell::Cell;
use std::rc::Rc;

use dmkit_fabric::{Fabric, RemoteRef};
use dmkit_runtime::{Local, RuntimeConfig, Worker};
use dmkit_sim::{Profile, Sim, SimConfig};

mod common;
use common::{rcfg, small, LOCAL_BYTES};

/// What one thread posts, all in one doorbell.
#[derive(Clone, Copy)]
enum Post {
    /// `n` 32-byte WRITEs.
    Writes(usize),
    /// One WRITE gathered from `n` 32-byte pieces.
    Gather(usize),
}

/// Virtual ns from the post until its last completion, with the unit's
/// costs set to `wr_ns` and `sge_ns`.
fn post_ns(wr_ns: f64, sge_ns: f64, post: Post) -> u64 {
    let mut profile = Profile::builtin("cx3-56g").unwrap();
    profile.nic.wr_ns = wr_ns;
    profile.nic.sge_ns = sge_ns;
    // (No translation miss on the first access: its delay would overlap
    // with the unit's.)
    profile.responder.mtt_miss_ns = 0.0;
    let mut sim = Sim::new(SimConfig {
        profile,
        memory_nodes: 1,
        seed: 1,
        ..small()
    })
    .unwrap();
    let f = sim.dyn_fabric();
    let (a, _, k) = f.alloc_chunk(0, 1 << 16, true).unwrap();
    let wcfg = RuntimeConfig {
        throttle: false,
        ..rcfg()
    };
    let t = sim
        .add_worker(0, |f: &dyn Fabric, clock| {
            Worker::builder(f)
                .clock(clock)
                .config(wcfg.clone())
                .id(0)
                .tasks(1)
                .local_bytes(LOCAL_BYTES)
                .build()
        })
        .unwrap();
    let took = Rc::new(Cell::new(0));
    let out = took.clone();
    sim.worker_mut(t).spawn(move |ctx| async move {
        let s = ctx.now();
        match post {
            Post::Writes(n) => {
                for i in 0..n {
                    let dst = RemoteRef::new(a.add(32 * i as u64), k);
                    ctx.write(dst, Local::at(32 * i, 32));
                }
            }
            Post::Gather(n) => {
                let pieces: Vec<Local> = (0..n).map(|i| Local::at(32 * i, 32)).collect();
                ctx.write_v(RemoteRef::new(a, k), &pieces);
            }
        }
        ctx.post();
        ctx.sync().await.unwrap();
        out.set(ctx.now() - s);
    });
    let r = sim.run();
    assert_eq!(r.finished, 1);
    let s = sim.stats();
    assert_eq!(s.executed, s.posted, "each request took effect once");
    took.get()
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
