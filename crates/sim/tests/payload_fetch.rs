//! `nic.payload_fetch_ns`: a WRITE whose payload exceeds
//! `limits.max_inline` waits for one DMA read of its payload before it
//! leaves the requester NIC (memory-semantics study §II-B1, Fig. 1: a
//! WRITE's latency rises from 1.16 µs to 1.79 µs at 256 B). A payload that
//! fits the WQE, a READ, and an atomic pay nothing; the fetch is latency,
//! so two queue pairs' fetches overlap.

use std::cell::Cell;
use std::rc::Rc;

use dmkit_fabric::RemoteRef;
use dmkit_runtime::Local;
use dmkit_sim::Profile;

mod common;
use common::{one_node, unthrottled};

/// What one thread posts and waits for.
#[derive(Clone, Copy)]
enum Op {
    /// One WRITE of this many bytes.
    Write(usize),
    /// Four WRITEs of this many bytes in one post (doorbell batching).
    Writes4(usize),
    /// One WRITE gathered from this many 32-byte pieces.
    Gather(usize),
    /// One READ of this many bytes.
    Read(usize),
}

/// cx3-40g with the fetch set to `fetch_ns`, no translation miss on a
/// first access, and no per-piece cost (so a gather's time is its bytes').
fn profile(fetch_ns: f64) -> Profile {
    let mut p = Profile::builtin("cx3-40g").unwrap();
    p.nic.payload_fetch_ns = fetch_ns;
    p.nic.sge_ns = 0.0;
    p.responder.mtt_miss_ns = 0.0;
    p
}

/// Virtual ns until each thread (a queue pair each) has done its `ops[w]`.
fn ops_ns(profile: Profile, ops: &[Op]) -> Vec<u64> {
    let mut sim = one_node(profile);
    let f = sim.dyn_fabric();
    let (a, _, k) = f.alloc_chunk(0, 1 << 16, true).unwrap();
    let took: Vec<Rc<Cell<u64>>> = ops.iter().map(|_| Rc::new(Cell::new(0))).collect();
    for (w, (&op, out)) in ops.iter().zip(&took).enumerate() {
        let t = common::add_worker(&mut sim, 0, w, 1, unthrottled());
        let (out, at) = (out.clone(), RemoteRef::new(a.add(4096 * w as u64), k));
        sim.worker_mut(t).spawn(move |ctx| async move {
            let s = ctx.now();
            match op {
                Op::Write(n) => {
                    ctx.write(at, Local::at(0, n));
                }
                Op::Writes4(n) => {
                    for i in 0..4 {
                        ctx.write(at.add((n * i) as u64), Local::at(n * i, n));
                    }
                }
                Op::Gather(n) => {
                    let pieces: Vec<Local> = (0..n).map(|i| Local::at(32 * i, 32)).collect();
                    ctx.write_v(at, &pieces);
                }
                Op::Read(n) => {
                    ctx.read(at, Local::at(0, n));
                }
            }
            ctx.post();
            ctx.sync().await.unwrap();
            out.set(ctx.now() - s);
        });
    }
    let r = sim.run();
    assert_eq!(r.finished, ops.len());
    took.iter().map(|c| c.get()).collect()
}

fn op_ns(fetch_ns: f64, op: Op) -> u64 {
    ops_ns(profile(fetch_ns), &[op])[0]
}

#[test]
fn a_write_past_the_inline_limit_waits_for_its_payload() {
    let inline = Profile::builtin("cx3-40g").unwrap().limits.max_inline;
    let big = inline + 56;
    let extra = op_ns(1_000.0, Op::Write(big)) - op_ns(0.0, Op::Write(big));
    assert_eq!(extra, 1_000, "a {big}-byte WRITE");
    // A gather of the same bytes waits the same; one that fits does not.
    let pieces = big.div_ceil(32);
    let extra = op_ns(1_000.0, Op::Gather(pieces)) - op_ns(0.0, Op::Gather(pieces));
    assert_eq!(extra, 1_000, "a {pieces}-piece gather");
    assert_eq!(op_ns(1_000.0, Op::Gather(2)), op_ns(0.0, Op::Gather(2)));
}

#[test]
fn a_posts_fetches_overlap_each_other() {
    // Four 1 KiB WRITEs in one doorbell: the unit takes each request while
    // the previous one's payload is read, so the post waits for one fetch,
    // not four.
    let base = op_ns(0.0, Op::Writes4(1024));
    let slow = op_ns(2_000.0, Op::Writes4(1024));
    assert!(
        (2_000..=2_200).contains(&(slow - base)),
        "four fetching WRITEs: {slow} ns, without the fetch {base} ns"
    );
}

#[test]
fn inline_writes_and_reads_pay_nothing() {
    let inline = Profile::builtin("cx3-40g").unwrap().limits.max_inline;
    assert_eq!(
        op_ns(1_000.0, Op::Write(inline)),
        op_ns(0.0, Op::Write(inline))
    );
    assert_eq!(op_ns(1_000.0, Op::Write(32)), op_ns(0.0, Op::Write(32)));
    assert_eq!(op_ns(1_000.0, Op::Read(1024)), op_ns(0.0, Op::Read(1024)));
}

#[test]
fn fetches_of_two_queue_pairs_overlap() {
    // Two threads, one large WRITE each, posted at once: each waits for
    // its own fetch, not for the other's (the fetch holds no shared unit).
    let alone = op_ns(2_000.0, Op::Write(1024));
    let both = ops_ns(profile(2_000.0), &[Op::Write(1024), Op::Write(1024)]);
    for t in both {
        assert!(
            t < alone + 1_000,
            "{t} ns beside another fetch, {alone} ns alone"
        );
    }
}

#[test]
fn a_fetch_needs_processing_units() {
    let mut p = Profile::builtin("cx3-40g").unwrap();
    p.nic.processing_units = 0;
    p.nic.payload_fetch_ns = 0.0;
    assert!(p.validate().is_ok(), "no fetch: fine without units");
    p.nic.payload_fetch_ns = 100.0;
    assert!(p.validate().unwrap_err().contains("nic.payload_fetch_ns"));
}
