//! Tests of the store: operations and their errors, compaction, pointer
//! correction and release, triggers, a randomised model check on the
//! single-threaded driver, and threads (workers, one-sided readers) racing
//! compaction. Every test ends with the structural checker.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use super::class::Strategy;
use super::layout::{decode, scan_block, ReadFault};
use super::*;
use crate::node::{MemNode, NodeConfig};

fn node(mib: u64) -> Arc<MemNode> {
    MemNode::new(NodeConfig {
        size: mib << 20,
        spare_pages: 4,
        ..Default::default()
    })
    .unwrap()
}

fn cfg(workers: usize, strategy: Strategy, correction: Correction) -> StoreConfig {
    StoreConfig {
        block_size: 4096,
        workers,
        strategy,
        correction,
        policy: Policy {
            threshold: None,
            ..Policy::default()
        },
        virtual_bytes: 16 << 20,
        max_active_bytes: None,
        seed: Some(42),
    }
}

fn alloc(c: &mut Cluster, w: usize, len: u32) -> ObjPtr {
    match c.call(w, Op::Alloc(len)) {
        Ok(Reply::Allocated(p)) => p,
        other => panic!("alloc: {other:?}"),
    }
}

fn read(c: &mut Cluster, w: usize, p: ObjPtr) -> Result<(ObjPtr, Vec<u8>), ObjError> {
    match c.call(w, Op::Read(p)) {
        Ok(Reply::Read { ptr, data }) => Ok((ptr, data)),
        Ok(other) => panic!("read answered {other:?}"),
        Err(e) => Err(e),
    }
}

fn write(c: &mut Cluster, w: usize, p: ObjPtr, v: &[u8]) -> Result<ObjPtr, ObjError> {
    match c.call(w, Op::Write(p, v.to_vec())) {
        Ok(Reply::Written(p)) => Ok(p),
        Ok(other) => panic!("write answered {other:?}"),
        Err(e) => Err(e),
    }
}

fn compact(c: &mut Cluster, w: usize) -> CompactionReport {
    match c.call(w, Op::Compact(None)) {
        Ok(Reply::Compacted(r)) => r,
        other => panic!("compact: {other:?}"),
    }
}

/// What a one-sided reader gets through `p`: decode at the hint, else scan
/// the block (ScanRead), as the client library will.
fn one_sided(store: &Store, p: ObjPtr) -> Result<Vec<u8>, ReadFault> {
    let bs = store.config().block_size;
    let slot = store.classes().get(p.class()).unwrap().slot_size as usize;
    let e = p.expect(bs);
    match decode(&store.read_raw(p.offset(), slot), e) {
        Err(ReadFault::WrongObject) => {
            let block = store.read_raw(p.home_block(bs), bs as usize);
            let off = scan_block(&block, slot, e).ok_or(ReadFault::WrongObject)?;
            decode(&block[off..off + slot], e)
        }
        r => r,
    }
}

fn pattern(tag: u64, len: usize) -> Vec<u8> {
    (0..len)
        .map(|i| (tag.wrapping_mul(31).wrapping_add(i as u64 * 7)) as u8)
        .collect()
}

#[test]
fn alloc_write_read_free_and_the_accounting() {
    let n = node(32);
    let mut c = Cluster::new(n.clone(), cfg(1, Strategy::Hybrid(16), Correction::Scan)).unwrap();
    let p = alloc(&mut c, 0, 100);
    let cap = c.store().classes().get(p.class()).unwrap().capacity as usize;
    let (q, data) = read(&mut c, 0, p).unwrap();
    assert_eq!((q, data), (p, vec![0; cap]), "new objects read as zeros");
    let v = pattern(1, 100);
    write(&mut c, 0, p, &v).unwrap();
    let (_, data) = read(&mut c, 0, p).unwrap();
    assert_eq!(&data[..100], &v[..]);
    assert_eq!(&one_sided(c.store(), p).unwrap()[..100], &v[..]);
    let st = c.store().stats();
    assert_eq!((st.live_objects, st.live_bytes, st.blocks), (1, 100, 1));
    assert_eq!(st.active_bytes, 4096);
    assert_eq!(
        n.stats().corm.unwrap().live_bytes,
        100,
        "NodeStats carries it"
    );
    c.check().unwrap();
    assert_eq!(c.call(0, Op::Free(p)), Ok(Reply::Freed));
    let st = c.store().stats();
    assert_eq!((st.live_objects, st.blocks, st.active_bytes), (0, 0, 0));
    c.check().unwrap();
}

#[test]
fn client_mistakes_are_typed_errors_and_harmless() {
    let mut c = Cluster::new(node(32), cfg(2, Strategy::Hybrid(16), Correction::Message)).unwrap();
    assert_eq!(c.call(0, Op::Alloc(0)), Err(ObjError::ZeroSize));
    assert!(matches!(
        c.call(0, Op::Alloc(1 << 20)),
        Err(ObjError::TooLarge { .. })
    ));
    let keep = alloc(&mut c, 0, 40);
    let p = alloc(&mut c, 0, 40);
    let bs = 4096;
    // Forged: another node, key, range, alignment, class.
    let forged = [
        ObjPtr::new(9, p.offset(), p.rkey(), p.id(), p.class(), p.gen()),
        ObjPtr::new(0, p.offset(), p.rkey() ^ 1, p.id(), p.class(), p.gen()),
        ObjPtr::new(0, 0, p.rkey(), p.id(), p.class(), p.gen()),
        p.with_offset_hint(bs, p.offset_hint(bs) + 8),
        ObjPtr::new(0, p.offset(), p.rkey(), p.id(), 250, p.gen()),
    ];
    for f in forged {
        for op in [
            Op::Read(f),
            Op::Free(f),
            Op::Write(f, vec![1]),
            Op::ReleasePtr(f),
        ] {
            assert!(matches!(c.call(1, op), Err(ObjError::Forged(_))), "{f:?}");
        }
    }
    let other_class = ObjPtr::new(0, p.offset(), p.rkey(), p.id(), p.class() + 1, p.gen());
    assert!(matches!(
        c.call(1, Op::Read(other_class)),
        Err(ObjError::WrongClass { .. })
    ));
    let wrong_gen = ObjPtr::new(0, p.offset(), p.rkey(), p.id(), p.class(), p.gen() + 1);
    assert_eq!(c.call(1, Op::Read(wrong_gen)), Err(ObjError::Stale));
    let cap = c.store().classes().get(p.class()).unwrap().capacity as usize;
    assert!(matches!(
        c.call(1, Op::Write(p, vec![0; cap + 1])),
        Err(ObjError::TooLarge { .. })
    ));
    // Free from another worker (messaging the owner), then every use fails.
    assert_eq!(c.call(1, Op::Free(p)), Ok(Reply::Freed));
    assert_eq!(c.call(1, Op::Free(p)), Err(ObjError::Freed), "double free");
    assert_eq!(c.call(0, Op::Free(p)), Err(ObjError::Freed));
    assert_eq!(read(&mut c, 1, p), Err(ObjError::Freed));
    assert_eq!(write(&mut c, 0, p, &[1]), Err(ObjError::Freed));
    assert_eq!(c.call(0, Op::ReleasePtr(p)), Err(ObjError::Freed));
    assert_eq!(one_sided(c.store(), p), Err(ReadFault::WrongObject));
    // A freed block's address is released: its pointers are stale.
    assert_eq!(c.call(0, Op::Free(keep)), Ok(Reply::Freed));
    assert_eq!(c.call(1, Op::Free(keep)), Err(ObjError::Stale));
    assert_eq!(read(&mut c, 0, keep), Err(ObjError::Stale));
    let st = c.store().stats();
    assert_eq!((st.live_objects, st.blocks), (0, 0));
    assert!(st.errors >= 20);
    c.check().unwrap();
}

/// Fills blocks of one class from every worker, frees most objects at
/// random, compacts; returns the surviving pointers and their values.
fn fragment(
    c: &mut Cluster,
    len: u32,
    count: usize,
    keep_one_in: usize,
    seed: u64,
) -> Vec<(ObjPtr, Vec<u8>)> {
    let mut rng = Rng::new(seed);
    let w = c.workers();
    let mut live = Vec::new();
    for i in 0..count {
        let wk = rng.below(w as u64) as usize;
        let p = alloc(c, wk, len);
        let v = pattern(i as u64, len as usize);
        write(c, wk, p, &v).unwrap();
        live.push((p, v));
    }
    let mut kept = Vec::new();
    for (p, v) in live {
        if rng.below(keep_one_in as u64) == 0 {
            kept.push((p, v));
        } else {
            let wk = rng.below(w as u64) as usize;
            assert_eq!(c.call(wk, Op::Free(p)), Ok(Reply::Freed));
        }
    }
    kept
}

fn all_readable(c: &mut Cluster, objs: &[(ObjPtr, Vec<u8>)]) {
    let w = c.workers();
    for (i, (p, v)) in objs.iter().enumerate() {
        let (_, data) = read(c, i % w, *p).unwrap();
        assert_eq!(&data[..v.len()], &v[..], "RPC read through {p:?}");
        let one = one_sided(c.store(), *p).unwrap();
        assert_eq!(&one[..v.len()], &v[..], "one-sided read through {p:?}");
    }
}

#[test]
fn compaction_returns_memory_and_keeps_every_object_reachable() {
    for strategy in [
        Strategy::Corm(16),
        Strategy::Corm(8),
        Strategy::Mesh,
        Strategy::Hybrid(12),
    ] {
        for correction in [Correction::Scan, Correction::Message] {
            let mut c = Cluster::new(node(64), cfg(3, strategy, correction)).unwrap();
            let objs = fragment(&mut c, 200, 600, 6, 7);
            c.check().unwrap();
            let before = c.store().stats();
            let r = compact(&mut c, 1);
            c.check().unwrap();
            let after = c.store().stats();
            assert!(r.blocks_freed > 0, "{}: {r:?}", strategy.name());
            assert_eq!(after.blocks, before.blocks - r.blocks_freed);
            assert_eq!(after.active_bytes, after.blocks * 4096);
            assert_eq!(after.live_bytes, before.live_bytes);
            if strategy == Strategy::Mesh {
                assert_eq!(r.objects_moved, 0, "offsets never move");
            }
            all_readable(&mut c, &objs);
            // Reads through indirect pointers were corrected.
            if r.objects_moved > 0 {
                let corrections = c.store().stats();
                assert!(corrections.corrections_scan + corrections.corrections_message > 0);
            }
            c.check().unwrap();
        }
    }
}

/// `max_merges` bounds one compaction's merges; the next compaction
/// continues where it stopped, and every object stays reachable.
#[test]
fn a_bounded_compaction_merges_at_most_its_bound_and_the_next_continues() {
    let mut unbounded =
        Cluster::new(node(64), cfg(2, Strategy::Corm(16), Correction::Scan)).unwrap();
    fragment(&mut unbounded, 200, 600, 6, 7);
    let all = compact(&mut unbounded, 1).blocks_freed;
    assert!(
        all > 4,
        "the fragmented store has several merges to do: {all}"
    );
    let mut bounded = cfg(2, Strategy::Corm(16), Correction::Scan);
    bounded.policy.max_merges = 2;
    let mut c = Cluster::new(node(64), bounded).unwrap();
    let objs = fragment(&mut c, 200, 600, 6, 7);
    for _ in 0..2 {
        let r = compact(&mut c, 1);
        assert_eq!(r.blocks_freed, 2, "{r:?}");
        c.check().unwrap();
    }
    all_readable(&mut c, &objs);
    c.check().unwrap();
}

/// `live_pointers` lists each live object once, from memory alone (also
/// after compaction moved objects and aliased addresses), and its pointers
/// work: an object whose pointer was lost is found and freed.
#[test]
fn live_pointers_find_every_object_once_even_after_compaction() {
    for strategy in [Strategy::Corm(16), Strategy::Mesh] {
        let mut c = Cluster::new(node(64), cfg(2, strategy, Correction::Scan)).unwrap();
        let objs = fragment(&mut c, 200, 400, 5, 11);
        let key = |p: &ObjPtr| (p.home_block(4096), p.id());
        let want = |objs: &[(ObjPtr, Vec<u8>)]| {
            let mut v: Vec<_> = objs.iter().map(|(p, _)| key(p)).collect();
            v.sort_unstable();
            v
        };
        let listed = |c: &Cluster| {
            let mut v: Vec<_> = c.store().live_pointers().iter().map(key).collect();
            v.sort_unstable();
            v
        };
        assert_eq!(listed(&c), want(&objs), "{}", strategy.name());
        let r = compact(&mut c, 0);
        assert!(r.blocks_freed > 0, "{}: {r:?}", strategy.name());
        assert_eq!(
            listed(&c),
            want(&objs),
            "{} after compaction",
            strategy.name()
        );
        // "Lose" every pointer: the listed ones read the same values, and
        // free every object.
        let by_key: HashMap<_, _> = objs.iter().map(|(p, v)| (key(p), v.clone())).collect();
        for p in c.store().live_pointers() {
            let (_, data) = read(&mut c, 1, p).unwrap();
            assert_eq!(&data[..200], &by_key[&key(&p)][..]);
            assert_eq!(c.call(0, Op::Free(p)), Ok(Reply::Freed));
        }
        assert!(c.store().live_pointers().is_empty());
        assert_eq!(c.store().stats().live_objects, 0);
        c.check().unwrap();
    }
}

#[test]
fn pointer_correction_returns_direct_pointers_and_release_frees_addresses() {
    for correction in [Correction::Scan, Correction::Message] {
        let mut c = Cluster::new(node(64), cfg(2, Strategy::Corm(16), correction)).unwrap();
        let objs = fragment(&mut c, 500, 200, 4, 11);
        compact(&mut c, 0);
        c.check().unwrap();
        let bs = 4096;
        let mut fixed = Vec::new();
        for (p, v) in &objs {
            let (q, data) = read(&mut c, 1, *p).unwrap();
            assert_eq!(&data[..v.len()], &v[..]);
            assert_eq!(
                q.home_block(bs),
                p.home_block(bs),
                "correction keeps the home"
            );
            // The corrected pointer is direct: decode at its hint works.
            let slot = c.store().classes().get(q.class()).unwrap().slot_size as usize;
            decode(&c.store().read_raw(q.offset(), slot), q.expect(bs)).unwrap();
            fixed.push((q, v.clone()));
        }
        let used_before = c.store().stats().virtual_used_bytes;
        // Release every pointer: the object stays, its new home is its block.
        let mut released = Vec::new();
        for (q, v) in &fixed {
            let r = match c.call(0, Op::ReleasePtr(*q)) {
                Ok(Reply::Released(r)) => r,
                other => panic!("release: {other:?}"),
            };
            assert_eq!(&read(&mut c, 1, r).unwrap().1[..v.len()], &v[..]);
            released.push((*q, r, v.clone()));
        }
        c.check().unwrap();
        let st = c.store().stats();
        assert_eq!(
            st.virtual_used_bytes,
            st.blocks * bs,
            "every merged address was released ({used_before} B before)"
        );
        assert!(st.vaddrs_released > 0);
        for (old, new, v) in &released {
            if old.home_block(bs) != new.home_block(bs) {
                // Its address is gone, or reused under a new generation.
                let e = read(&mut c, 0, *old).unwrap_err();
                assert!(matches!(e, ObjError::Stale | ObjError::Released), "{e:?}");
                assert!(c.call(1, Op::Free(*old)).is_err());
            }
            assert_eq!(&one_sided(c.store(), *new).unwrap()[..v.len()], &v[..]);
        }
        c.check().unwrap();
    }
}

#[test]
fn a_released_pointer_used_again_is_refused_while_its_address_lives() {
    let mut c = Cluster::new(node(32), cfg(1, Strategy::Corm(16), Correction::Scan)).unwrap();
    let classes = c.store().classes().clone();
    assert_eq!(
        classes
            .get(classes.for_payload(900).unwrap())
            .unwrap()
            .slots,
        4
    );
    // Two blocks of four, half freed: one merges into the other, its two
    // survivors both homed at the source's address.
    let x: Vec<ObjPtr> = (0..4).map(|_| alloc(&mut c, 0, 900)).collect();
    let y: Vec<ObjPtr> = (0..4).map(|_| alloc(&mut c, 0, 900)).collect();
    for p in [x[2], x[3], y[2], y[3]] {
        assert_eq!(c.call(0, Op::Free(p)), Ok(Reply::Freed));
    }
    assert_eq!(compact(&mut c, 0).blocks_freed, 1);
    let bs = 4096;
    let release = |c: &mut Cluster, p: ObjPtr| match c.call(0, Op::ReleasePtr(p)) {
        Ok(Reply::Released(q)) => q,
        other => panic!("{other:?}"),
    };
    // Releasing a pointer of the destination changes nothing.
    let q = release(&mut c, x[0]);
    let (src, dst) = if q.home_block(bs) == x[0].home_block(bs) {
        (y, x)
    } else {
        (x, y)
    };
    assert_eq!(
        release(&mut c, dst[1]).home_block(bs),
        dst[1].home_block(bs)
    );
    let moved = release(&mut c, src[0]);
    assert_eq!(moved.home_block(bs), dst[0].home_block(bs));
    // The source address still homes src[1]: the old pointer is "released".
    assert_eq!(read(&mut c, 0, src[0]), Err(ObjError::Released));
    assert_eq!(c.call(0, Op::Free(src[0])), Err(ObjError::Released));
    assert_eq!(c.call(0, Op::ReleasePtr(src[0])), Err(ObjError::Released));
    assert!(read(&mut c, 0, src[1]).is_ok());
    assert!(read(&mut c, 0, moved).is_ok());
    c.check().unwrap();
    // Releasing the last one releases the address: now the pointers are stale.
    let before = c.store().stats().vaddrs_released;
    release(&mut c, src[1]);
    assert_eq!(c.store().stats().vaddrs_released, before + 1);
    assert_eq!(read(&mut c, 0, src[0]), Err(ObjError::Stale));
    assert_eq!(read(&mut c, 0, src[1]), Err(ObjError::Stale));
    c.check().unwrap();
}

#[test]
fn threshold_and_allocation_failure_trigger_compaction() {
    // Threshold: freeing most objects of a class compacts it.
    let mut cf = cfg(2, Strategy::Corm(16), Correction::Scan);
    cf.policy.threshold = Some(1.5);
    let mut c = Cluster::new(node(64), cf).unwrap();
    let objs = fragment(&mut c, 300, 400, 8, 3);
    c.settle();
    let st = c.store().stats();
    assert!(st.triggers_threshold >= 1, "{st:?}");
    assert!(st.blocks_compacted > 0);
    all_readable(&mut c, &objs);
    c.check().unwrap();

    // Allocation failure: a memory limit reached, compaction makes room.
    let mut cf = cfg(2, Strategy::Corm(16), Correction::Scan);
    cf.max_active_bytes = Some(40 * 4096);
    let mut c = Cluster::new(node(64), cf).unwrap();
    let objs = fragment(&mut c, 1000, 120, 4, 5);
    let blocks = c.store().stats().blocks;
    let mut more = Vec::new();
    let mut i = 0;
    loop {
        match c.call(0, Op::Alloc(1000)) {
            Ok(Reply::Allocated(p)) => more.push(p),
            Err(ObjError::OutOfMemory { .. }) => break,
            other => panic!("{other:?}"),
        }
        i += 1;
        assert!(i < 1000);
    }
    let st = c.store().stats();
    assert!(st.triggers_alloc_failure >= 1, "{st:?}");
    assert!(
        st.blocks_compacted > 0,
        "compaction made room ({blocks} blocks before)"
    );
    assert_eq!(st.active_bytes, 40 * 4096);
    all_readable(&mut c, &objs);
    c.check().unwrap();
}

/// Many rounds of random allocs, frees, writes, reads, releases and
/// compactions on several workers, against a model (pointer → value):
/// every live object readable through every pointer to it, freed and
/// released pointers refused, the checker after every round.
#[test]
fn randomised_against_a_model() {
    let cases = [
        (Strategy::Corm(16), Correction::Scan, 3, 4096),
        (Strategy::Corm(8), Correction::Message, 4, 4096),
        (Strategy::Hybrid(12), Correction::Message, 2, 16384),
        (Strategy::Mesh, Correction::Scan, 3, 8192),
        (Strategy::None, Correction::Scan, 2, 4096),
    ];
    for (k, (strategy, correction, workers, bs)) in cases.into_iter().enumerate() {
        let mut cf = cfg(workers, strategy, correction);
        cf.block_size = bs;
        cf.seed = Some(100 + k as u64);
        cf.policy.threshold = Some(1.3);
        cf.policy.merges_per_step = 3;
        let mut c = Cluster::new(node(64), cf).unwrap();
        let mut rng = Rng::new(k as u64);
        // Each object: every pointer to it, and its value.
        let mut live: Vec<(Vec<ObjPtr>, Vec<u8>)> = Vec::new();
        let mut dead: Vec<ObjPtr> = Vec::new();
        let mut released: Vec<ObjPtr> = Vec::new();
        let sizes = [8u32, 30, 100, 250, 700, 1800];
        for round in 0..30 {
            for _ in 0..60 {
                let w = rng.below(workers as u64) as usize;
                match rng.below(10) {
                    0..=3 => {
                        let len = sizes[rng.below(sizes.len() as u64) as usize];
                        let p = alloc(&mut c, w, len);
                        let v = pattern(rng.next_u64(), len as usize);
                        write(&mut c, w, p, &v).unwrap();
                        live.push((vec![p], v));
                    }
                    4..=5 if !live.is_empty() => {
                        let i = rng.below(live.len() as u64) as usize;
                        let (ps, _) = live.swap_remove(i);
                        let p = ps[rng.below(ps.len() as u64) as usize];
                        assert_eq!(c.call(w, Op::Free(p)), Ok(Reply::Freed));
                        dead.extend(ps);
                    }
                    6 if !live.is_empty() => {
                        let i = rng.below(live.len() as u64) as usize;
                        let p = live[i].0[0];
                        let v = pattern(rng.next_u64(), live[i].1.len());
                        let q = write(&mut c, w, p, &v).unwrap();
                        live[i].0.push(q);
                        live[i].1 = v;
                    }
                    7 if !live.is_empty() => {
                        let i = rng.below(live.len() as u64) as usize;
                        let p = live[i].0[0];
                        match c.call(w, Op::ReleasePtr(p)) {
                            Ok(Reply::Released(q)) => {
                                if q.home_block(bs) != p.home_block(bs) {
                                    // Every pointer naming the old home is dead now.
                                    let (old, keep): (Vec<_>, Vec<_>) = live[i]
                                        .0
                                        .iter()
                                        .partition(|x| x.home_block(bs) == p.home_block(bs));
                                    released.extend(old);
                                    live[i].0 = keep;
                                }
                                live[i].0.push(q);
                            }
                            other => panic!("release: {other:?}"),
                        }
                    }
                    8 => {
                        let _ = c.call(w, Op::Compact(None));
                    }
                    _ if !live.is_empty() => {
                        let i = rng.below(live.len() as u64) as usize;
                        let p = live[i].0[rng.below(live[i].0.len() as u64) as usize];
                        let (q, data) = read(&mut c, w, p).unwrap();
                        assert_eq!(&data[..live[i].1.len()], &live[i].1[..]);
                        live[i].0.push(q);
                    }
                    _ => {}
                }
            }
            c.check()
                .unwrap_or_else(|e| panic!("case {k} round {round}: {e}"));
            for (ps, v) in &live {
                for p in ps {
                    let (_, data) = read(&mut c, 0, *p).unwrap_or_else(|e| panic!("{p:?}: {e}"));
                    assert_eq!(&data[..v.len()], &v[..]);
                    let one = one_sided(c.store(), *p).unwrap();
                    assert_eq!(&one[..v.len()], &v[..]);
                }
            }
            // Freed and released pointers are refused (until their slot and
            // id or their address are reused, which a test cannot rule out
            // for offset names; random 16-bit ids make it rare).
            for p in dead.iter().chain(&released) {
                if let Ok(Reply::Read { .. }) = c.call(0, Op::Read(*p)) {
                    let reused = live.iter().any(|(ps, _)| {
                        ps.iter()
                            .any(|q| q.home_block(bs) == p.home_block(bs) && q.id() == p.id())
                    });
                    assert!(reused, "a dead pointer {p:?} read an object nobody holds");
                }
            }
            dead.retain(|_| rng.below(4) != 0);
            released.retain(|_| rng.below(4) != 0);
            for (ps, _) in &mut live {
                ps.sort_unstable_by_key(|p| (p.addr, p.meta));
                ps.dedup();
                if ps.len() > 4 {
                    ps.drain(..ps.len() - 4);
                }
            }
        }
        let st = c.store().stats();
        assert!(st.compactions > 0, "{}", strategy.name());
        if strategy != Strategy::None {
            assert!(st.blocks_compacted > 0, "{}: {st:?}", strategy.name());
        }
        c.check().unwrap();
    }
}

/// Workers on threads: each runs random operations on its own objects
/// while compactions run; one-sided readers race them and must never see a
/// torn or wrong object. Ends with the checker.
#[test]
fn threads_race_compaction_without_torn_or_stale_reads() {
    let workers = 3;
    let mut cf = cfg(workers, Strategy::Corm(16), Correction::Message);
    cf.policy.threshold = Some(1.4);
    cf.policy.merges_per_step = 2;
    let n = node(64);
    let (store, ws) = Store::new(&n, cf).unwrap();
    let stop = Arc::new(AtomicBool::new(false));
    let done = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let shared: Arc<std::sync::Mutex<HashMap<u64, (ObjPtr, u64)>>> = Default::default();
    let len = 180usize;
    let mut handles = Vec::new();
    for (i, mut w) in ws.into_iter().enumerate() {
        let (done, shared) = (done.clone(), shared.clone());
        handles.push(std::thread::spawn(move || {
            let mut rng = Rng::new(i as u64 + 1);
            let mut mine: Vec<(ObjPtr, u64)> = Vec::new();
            for step in 0..1500u64 {
                match rng.below(8) {
                    0..=2 => {
                        let p = match w.call(Op::Alloc(len as u32)) {
                            Ok(Reply::Allocated(p)) => p,
                            other => panic!("{other:?}"),
                        };
                        let tag = (i as u64) << 32 | step;
                        w.call(Op::Write(p, pattern(tag, len))).unwrap();
                        mine.push((p, tag));
                    }
                    3..=4 if !mine.is_empty() => {
                        let (p, _) = mine.swap_remove(rng.below(mine.len() as u64) as usize);
                        assert_eq!(w.call(Op::Free(p)), Ok(Reply::Freed));
                    }
                    5 if !mine.is_empty() => {
                        let k = rng.below(mine.len() as u64) as usize;
                        let tag = (i as u64) << 32 | step;
                        match w.call(Op::Write(mine[k].0, pattern(tag, len))) {
                            Ok(Reply::Written(q)) => mine[k] = (q, tag),
                            other => panic!("{other:?}"),
                        }
                    }
                    6 if step % 100 == 0 => {
                        let _ = w.call(Op::Compact(None));
                    }
                    _ if !mine.is_empty() => {
                        let k = rng.below(mine.len() as u64) as usize;
                        match w.call(Op::Read(mine[k].0)) {
                            Ok(Reply::Read { ptr, data }) => {
                                assert_eq!(&data[..len], &pattern(mine[k].1, len)[..]);
                                mine[k].0 = ptr;
                            }
                            other => panic!("{other:?}"),
                        }
                    }
                    _ => {}
                }
                if step % 50 == 0 {
                    let mut s = shared.lock().unwrap();
                    s.retain(|k, _| *k >> 32 != i as u64);
                    for (p, tag) in mine.iter().take(20) {
                        s.insert((i as u64) << 32 | (p.offset() & 0xFFFF_FFFF), (*p, *tag));
                    }
                }
            }
            done.fetch_add(1, Ordering::AcqRel);
            // Keep serving peers until the whole store is quiet for a while.
            let sh = w.store().sh.clone();
            let mut quiet_since: Option<std::time::Instant> = None;
            loop {
                let busy = w.step()
                    || done.load(Ordering::Acquire) < workers
                    || sh.compacting.load(Ordering::Acquire)
                    || sh.in_flight.load(Ordering::Acquire) > 0
                    || !w.idle();
                if busy {
                    quiet_since = None;
                    std::thread::yield_now();
                } else if quiet_since
                    .get_or_insert_with(std::time::Instant::now)
                    .elapsed()
                    > std::time::Duration::from_millis(50)
                {
                    break;
                }
            }
            w
        }));
    }
    // A one-sided reader: whatever it accepts is a whole object some
    // writer wrote (the pattern is consistent), never a torn mix.
    let reader = {
        let (store, stop, shared) = (store.clone(), stop.clone(), shared.clone());
        std::thread::spawn(move || {
            let mut accepted = 0u64;
            while !stop.load(Ordering::Acquire) {
                let snapshot: Vec<(ObjPtr, u64)> =
                    shared.lock().unwrap().values().copied().collect();
                for (p, _) in snapshot {
                    if let Ok(data) = one_sided(&store, p) {
                        // Every write's bytes step by 7; a mix of two writes
                        // would break the step where they meet.
                        let ok = data[..len].windows(2).all(|w| w[1].wrapping_sub(w[0]) == 7);
                        assert!(ok, "a one-sided read accepted a torn object");
                        accepted += 1;
                    }
                }
            }
            accepted
        })
    };
    let ws: Vec<Worker> = handles.into_iter().map(|h| h.join().unwrap()).collect();
    stop.store(true, Ordering::Release);
    let accepted = reader.join().unwrap();
    assert!(accepted > 0);
    let refs: Vec<&Worker> = ws.iter().collect();
    store.check(&refs).unwrap();
    let st = store.stats();
    assert!(st.compactions > 0 && st.blocks_compacted > 0, "{st:?}");
}

#[test]
fn block_sizes_and_configurations_are_checked() {
    let bad = [
        StoreConfig {
            block_size: 3000,
            ..StoreConfig::default()
        },
        StoreConfig {
            block_size: 2 << 20,
            ..StoreConfig::default()
        },
        StoreConfig {
            workers: 0,
            ..StoreConfig::default()
        },
        StoreConfig {
            strategy: Strategy::Corm(20),
            ..StoreConfig::default()
        },
    ];
    for cf in bad {
        assert!(Store::new(&node(128), cf).is_err());
    }
    let n = node(128);
    let (s, _w) = Store::new(&n, StoreConfig::default()).unwrap();
    assert!(
        Store::new(&n, StoreConfig::default()).is_err(),
        "one store per node"
    );
    drop((s, _w));
    let (_s, _w) = Store::new(&n, StoreConfig::default()).unwrap();
}

#[test]
fn a_client_cannot_free_the_stores_range_and_pages_come_back() {
    let n = node(32);
    let heap_free = n.stats().heap_free_bytes;
    {
        let mut c = Cluster::new(n.clone(), cfg(1, Strategy::Corm(16), Correction::Scan)).unwrap();
        let objs = fragment(&mut c, 100, 300, 5, 9);
        compact(&mut c, 0);
        // The store's chunk (the first, at 4096) is no session's.
        let s = n.open_session();
        for off in [4096, objs[0].0.home_block(4096)] {
            let r = n.handle(s, crate::Request::FreeChunk { offset: off });
            assert!(matches!(r, crate::Response::Error(_)), "{r:?}");
        }
        assert!(n.stats().pages_remapped > 0);
        c.check().unwrap();
    }
    // Dropped: the range is back, mapped 1:1.
    assert_eq!(n.stats().heap_free_bytes, heap_free);
    for p in 1..n.layout().remote_pages {
        assert_eq!(n.translate(p), Some(p));
    }
    assert!(n.stats().corm.is_none());
}

#[test]
fn two_mib_pages_take_two_mib_blocks() {
    let n = MemNode::new(NodeConfig {
        size: 64 << 20,
        page_size: 2 << 20,
        spare_pages: 0,
        ..Default::default()
    })
    .unwrap();
    let mut cf = cfg(2, Strategy::Hybrid(16), Correction::Scan);
    cf.virtual_bytes = 32 << 20;
    cf.block_size = 1 << 20;
    assert!(
        Cluster::new(n.clone(), cf.clone()).is_err(),
        "blocks are whole pages"
    );
    cf.block_size = 2 << 20;
    let mut c = Cluster::new(n, cf).unwrap();
    assert_eq!(
        c.store().classes().get(0).unwrap().slot_size,
        32,
        "at most 2^16 slots"
    );
    let objs = fragment(&mut c, 3000, 2000, 5, 21);
    let r = compact(&mut c, 0);
    assert!(r.blocks_freed > 0, "{r:?}");
    all_readable(&mut c, &objs);
    c.check().unwrap();
}

/// A mirror of the translation kept only by the node's retranslate hook
/// (what the verbs server keeps: its view of the memory and the NIC's
/// registrations) agrees with the node's table after compactions and
/// address releases: every page the store moved or unmapped was told.
#[test]
fn the_retranslate_hook_hears_of_every_page_the_store_moves() {
    let n = node(64);
    let mirror: Arc<std::sync::Mutex<HashMap<u64, Option<u64>>>> = Default::default();
    let calls = Arc::new(std::sync::atomic::AtomicU64::new(0));
    {
        let (m, weak, calls) = (mirror.clone(), Arc::downgrade(&n), calls.clone());
        n.set_retranslate_hook(Some(Arc::new(move |first, count| {
            calls.fetch_add(1, Ordering::Relaxed);
            let node = weak.upgrade().expect("the node calls its hook");
            let mut m = m.lock().unwrap();
            for p in first..first + count {
                m.insert(p, node.translate(p));
            }
        })));
    }
    let mut c = Cluster::new(n.clone(), cfg(2, Strategy::Corm(16), Correction::Scan)).unwrap();
    let objs = fragment(&mut c, 500, 300, 4, 5);
    let r = compact(&mut c, 0);
    assert!(r.blocks_freed > 0, "{r:?}");
    // Release every pointer: merged addresses are unmapped.
    for (p, _) in &objs {
        let q = match c.call(1, Op::Read(*p)) {
            Ok(Reply::Read { ptr, .. }) => ptr,
            other => panic!("{other:?}"),
        };
        assert!(matches!(
            c.call(0, Op::ReleasePtr(q)),
            Ok(Reply::Released(_))
        ));
    }
    c.check().unwrap();
    assert!(c.store().stats().vaddrs_released > 0);
    assert!(calls.load(Ordering::Relaxed) > 0);
    let m = mirror.lock().unwrap();
    let mut moved = 0;
    for p in 1..n.layout().remote_pages {
        let now = n.translate(p);
        if now != Some(p) {
            moved += 1;
            assert_eq!(m.get(&p), Some(&now), "page {p} changed untold");
        } else if let Some(seen) = m.get(&p) {
            assert_eq!(*seen, now, "page {p}: the mirror is stale");
        }
    }
    assert!(moved > 0, "the store moved no page");
    drop(m);
    n.set_retranslate_hook(None);
}

/// A compaction never takes an object whose write lock outlives its wait
/// (a writer descheduled for seconds): it leaves that block where it is,
/// whole, and merges it once the writer is done.
#[test]
fn a_merge_leaves_a_block_whose_object_stays_write_locked() {
    use super::layout::{LOCK_COMPACT, LOCK_WRITE};
    let mut c = Cluster::new(node(64), cfg(1, Strategy::Corm(16), Correction::Scan)).unwrap();
    let objs = fragment(&mut c, 200, 40, 4, 3);
    let before = c.store().stats();
    assert!(before.blocks >= 2, "{before:?}");
    // Every kept object's header write-locked, as by a stalled writer.
    let sh = c.store().sh.clone();
    let locked: Vec<u64> = objs
        .iter()
        .map(|(p, _)| {
            let h = sh.mem.load(p.offset()).unwrap();
            sh.mem.cas(p.offset(), h, h | LOCK_WRITE).unwrap();
            h | LOCK_WRITE
        })
        .collect();
    let t = std::time::Instant::now();
    let r = compact(&mut c, 0);
    assert!(t.elapsed() >= super::worker::BUSY_TIMEOUT, "a merge waited");
    assert_eq!(r.blocks_freed, 0, "{r:?}");
    assert!(r.merge_failures > 0, "{r:?}");
    assert_eq!(c.store().stats().blocks, before.blocks);
    for ((p, v), h) in objs.iter().zip(&locked) {
        assert_eq!(sh.mem.load(p.offset()).unwrap(), *h, "untouched");
        assert_eq!(h & LOCK_COMPACT, 0);
        sh.mem.clear_bits(p.offset(), LOCK_WRITE);
        assert_eq!(&one_sided(c.store(), *p).unwrap()[..v.len()], &v[..]);
    }
    c.check().unwrap();
    // The writer is done: the same blocks merge now.
    let r = compact(&mut c, 0);
    assert!(r.blocks_freed > 0, "{r:?}");
    all_readable(&mut c, &objs);
    c.check().unwrap();
}
