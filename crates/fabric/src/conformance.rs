//! The fabric conformance suite: checks every backend must pass. The shm
//! tests run it on embedded and socket-connected nodes; later backends (tcp,
//! sim, verbs on Soft-RoCE) run the same functions.
//!
//! Each check allocates its own session chunk, panics (assert) on a contract
//! violation, and frees what it allocated.

use crate::{
    Batch, Fabric, FabricError, GlobalAddr, NodeId, PostError, QueuePair, Rkey, VerbError,
    WorkRequest,
};

/// Runs every check against node `node` of `fabric`.
pub fn run_all(fabric: &dyn Fabric, node: NodeId) {
    verbs_round_trip(fabric, node);
    bad_requests(fabric, node);
    flush_after_error(fabric, node);
    signaling(fabric, node);
    ordering_within_qp(fabric, node);
    ordering_seen_by_others(fabric, node);
    control_rpcs(fabric, node);
}

fn chunk(fabric: &dyn Fabric, node: NodeId, len: u64) -> (GlobalAddr, u64, Rkey) {
    fabric.alloc_chunk(node, len, false).expect("alloc chunk")
}

fn one(qp: &mut dyn QueuePair, wr: WorkRequest) -> Result<crate::Completion, FabricError> {
    let mut b = Batch::new();
    b.push(wr);
    let mut c = qp.execute(&mut b)?;
    assert_eq!(c.len(), 1, "one signaled request, one completion");
    Ok(c.pop().expect("one completion"))
}

fn read(qp: &mut dyn QueuePair, a: GlobalAddr, k: Rkey, len: usize) -> Vec<u8> {
    one(qp, WorkRequest::read(a, k, vec![0; len]))
        .expect("read")
        .buf
}

fn write(qp: &mut dyn QueuePair, a: GlobalAddr, k: Rkey, data: &[u8]) {
    one(qp, WorkRequest::write(a, k, data.to_vec())).expect("write");
}

/// READ/WRITE of many sizes and alignments (page-crossing included), CAS,
/// FAA and masked CAS results.
pub fn verbs_round_trip(fabric: &dyn Fabric, node: NodeId) {
    let (base, len, k) = chunk(fabric, node, 3 * 4096);
    let mut qp = fabric.connect(node).expect("qp");
    let qp = qp.as_mut();
    assert!(
        read(qp, base, k, len as usize).iter().all(|&b| b == 0),
        "a new chunk reads as zeros"
    );
    for &(off, n) in &[
        (0u64, 8usize),
        (3, 5),
        (8, 64),
        (4090, 17),
        (4096 - 8, 16),
        (1, 8191),
        (0, len as usize),
    ] {
        let pattern: Vec<u8> = (0..n)
            .map(|i| (i as u8).wrapping_mul(31).wrapping_add(off as u8))
            .collect();
        write(qp, base.add(off), k, &pattern);
        assert_eq!(
            read(qp, base.add(off), k, n),
            pattern,
            "read back [{off}, +{n})"
        );
    }
    let w = base.add(64);
    write(qp, w, k, &10u64.to_ne_bytes());
    let c = one(qp, WorkRequest::cas(w, k, 10, 20)).unwrap();
    assert_eq!(c.result, Ok(10), "successful CAS returns the old value");
    let c = one(qp, WorkRequest::cas(w, k, 10, 30)).unwrap();
    assert_eq!(c.result, Ok(20), "failed CAS returns the current value");
    let c = one(qp, WorkRequest::faa(w, k, 5)).unwrap();
    assert_eq!(c.result, Ok(20));
    assert_eq!(read(qp, w, k, 8), 25u64.to_ne_bytes());
    let c = one(qp, WorkRequest::faa(w, k, u64::MAX)).unwrap();
    assert_eq!(c.result, Ok(25), "FAA wraps");
    assert_eq!(read(qp, w, k, 8), 24u64.to_ne_bytes());
    if fabric.caps().masked_cas {
        write(qp, w, k, &0xAAAA_0000_0000_1111u64.to_ne_bytes());
        // Compare only the low 16 bits, swap only the high 16 bits.
        let c = one(
            qp,
            WorkRequest::masked_cas(w, k, 0x1111, 0xFFFF, 0xBBBB << 48, 0xFFFF << 48),
        )
        .unwrap();
        assert_eq!(c.result, Ok(0xAAAA_0000_0000_1111));
        assert_eq!(read(qp, w, k, 8), 0xBBBB_0000_0000_1111u64.to_ne_bytes());
        let c = one(
            qp,
            WorkRequest::masked_cas(w, k, 0x2222, 0xFFFF, 0, u64::MAX),
        )
        .unwrap();
        assert_eq!(c.result, Ok(0xBBBB_0000_0000_1111), "masked compare fails");
        assert_eq!(read(qp, w, k, 8), 0xBBBB_0000_0000_1111u64.to_ne_bytes());
    }
    fabric.free_chunk(base).expect("free");
}

fn expect_err(
    qp: &mut dyn QueuePair,
    wr: WorkRequest,
    want: impl Fn(&VerbError) -> bool,
    what: &str,
) {
    let id = 0xE7;
    match one(qp, wr.id(id)) {
        Err(FabricError::Request(e)) => {
            assert_eq!(
                (e.index, e.wr_id),
                (0, id),
                "{what}: the error names the request"
            );
            assert!(want(&e.error), "{what}: got {e}");
            assert!(!e.to_string().is_empty());
        }
        other => panic!("{what}: expected a request error, got {other:?}"),
    }
}

/// Bad requests fail with a typed error naming them and change nothing.
pub fn bad_requests(fabric: &dyn Fabric, node: NodeId) {
    let heap = fabric.heap(node).expect("heap");
    let (base, len, k) = chunk(fabric, node, 4096);
    let mut qpb = fabric.connect(node).expect("qp");
    let qp = qpb.as_mut();
    write(qp, base, k, &[0x5A; 16]);
    let end = GlobalAddr::new(node, heap.base + heap.len);
    use VerbError as E;
    expect_err(
        qp,
        WorkRequest::write(GlobalAddr::new(node, 0), k, vec![1; 8]),
        |e| matches!(e, E::OutOfBounds { .. }),
        "below region",
    );
    expect_err(
        qp,
        WorkRequest::read(end, k, vec![0; 8]),
        |e| matches!(e, E::OutOfBounds { .. }),
        "past region",
    );
    expect_err(
        qp,
        WorkRequest::read(end.add(1 << 40), k, vec![0; 8]),
        |e| matches!(e, E::OutOfBounds { .. }),
        "far past region",
    );
    expect_err(
        qp,
        WorkRequest::write(
            GlobalAddr::new(node, heap.base + heap.len - 4),
            k,
            vec![1; 8],
        ),
        |e| matches!(e, E::CrossesRegionEnd { .. }),
        "crossing the end",
    );
    expect_err(
        qp,
        WorkRequest::write(base, k ^ 0x100, vec![1; 8]),
        |e| matches!(e, E::BadKey { .. }),
        "wrong key",
    );
    expect_err(
        qp,
        WorkRequest::read(base, k ^ 0x3F, vec![0; 8]),
        |e| matches!(e, E::BadKey { .. }),
        "wrong slot",
    );
    expect_err(
        qp,
        WorkRequest::cas(base.add(4), k, 0, 1),
        |e| matches!(e, E::Unaligned { .. }),
        "unaligned CAS",
    );
    expect_err(
        qp,
        WorkRequest::faa(base.add(1), k, 1),
        |e| matches!(e, E::Unaligned { .. }),
        "unaligned FAA",
    );
    expect_err(
        qp,
        WorkRequest::read(base, k, Vec::new()),
        |e| *e == E::ZeroLength,
        "zero-length read",
    );
    expect_err(
        qp,
        WorkRequest::write(base, k, Vec::new()),
        |e| *e == E::ZeroLength,
        "zero-length write",
    );
    let big = fabric.caps().max_inline + 1;
    expect_err(
        qp,
        WorkRequest::write(base, k, vec![1; big]).inline(),
        |e| matches!(e, E::InlineTooLarge { .. }),
        "inline too large",
    );
    let other = node.wrapping_add(1);
    expect_err(
        qp,
        WorkRequest::read(GlobalAddr::new(other, base.offset()), k, vec![0; 8]),
        |e| matches!(e, E::WrongNode { .. }),
        "wrong node",
    );

    // A batch over the limit is refused whole.
    let max = fabric.caps().max_batch;
    let mut b = Batch::new();
    for _ in 0..=max {
        b.push(WorkRequest::write(base, k, vec![0xFF; 8]));
    }
    match qp.post(&mut b) {
        Err(PostError::BatchTooLarge { len, max: m }) => assert_eq!((len, m), (max + 1, max)),
        other => panic!("batch over the limit: {other:?}"),
    }
    assert_eq!(b.len(), max + 1, "a refused batch is left intact");
    assert_eq!(qp.pending(), 0);
    // Nothing above changed memory; the queue pair still works.
    assert_eq!(read(qp, base, k, 16), vec![0x5A; 16]);
    assert!(len >= 4096);
    fabric.free_chunk(base).expect("free");
}

/// After a failed request the rest of its batch is flushed, without effect.
pub fn flush_after_error(fabric: &dyn Fabric, node: NodeId) {
    let (base, _, k) = chunk(fabric, node, 4096);
    let mut qpb = fabric.connect(node).expect("qp");
    let qp = qpb.as_mut();
    let mut b = Batch::new();
    b.push(WorkRequest::write(base, k, vec![1; 8]).id(1))
        .push(WorkRequest::cas(base.add(3), k, 0, 1).id(2))
        .push(
            WorkRequest::write(base.add(8), k, vec![3; 8])
                .id(3)
                .unsignaled(),
        );
    qp.post(&mut b).expect("post");
    let mut out = Vec::new();
    while qp.pending() > 0 {
        qp.poll(&mut out, 16);
    }
    let got: Vec<_> = out
        .iter()
        .map(|c| (c.wr_id, c.index, c.result.clone()))
        .collect();
    assert_eq!(got[0], (1, 0, Ok(8)));
    assert!(matches!(got[1], (2, 1, Err(VerbError::Unaligned { .. }))));
    assert_eq!(
        got[2],
        (3, 2, Err(VerbError::Flushed)),
        "flushed even though unsignaled"
    );
    assert_eq!(out[0].buf, vec![1; 8], "buffers come back");
    assert_eq!(
        read(qp, base, k, 16),
        [vec![1; 8], vec![0; 8]].concat(),
        "flushed write had no effect"
    );
    fabric.free_chunk(base).expect("free");
}

/// Unsignaled successes produce no completion; signaled ones exactly one.
pub fn signaling(fabric: &dyn Fabric, node: NodeId) {
    let (base, _, k) = chunk(fabric, node, 4096);
    let mut qpb = fabric.connect(node).expect("qp");
    let qp = qpb.as_mut();
    let mut b = Batch::new();
    for i in 0..10u64 {
        let wr = WorkRequest::faa(base, k, 1).id(i);
        b.push(if i % 3 == 0 { wr } else { wr.unsignaled() });
    }
    let c = qp.execute(&mut b).expect("execute");
    let ids: Vec<u64> = c.iter().map(|c| c.wr_id).collect();
    assert_eq!(ids, vec![0, 3, 6, 9]);
    let olds: Vec<u64> = c.iter().map(|c| *c.result.as_ref().unwrap()).collect();
    assert_eq!(
        olds,
        vec![0, 3, 6, 9],
        "unsignaled FAAs took effect in order"
    );
    assert_eq!(qp.stats().faa, 10);
    assert_eq!(qp.stats().doorbells, 1, "one batch, one doorbell");
    fabric.free_chunk(base).expect("free");
}

/// Requests of one queue pair take effect in posting order.
pub fn ordering_within_qp(fabric: &dyn Fabric, node: NodeId) {
    let (base, _, k) = chunk(fabric, node, 4096);
    let mut qpb = fabric.connect(node).expect("qp");
    let qp = qpb.as_mut();
    let mut b = Batch::new();
    for i in 1..=8u64 {
        b.push(WorkRequest::write(base, k, i.to_ne_bytes().to_vec()).unsignaled());
        b.push(WorkRequest::read(base, k, vec![0; 8]).id(i));
        b.push(WorkRequest::faa(base, k, 100).id(100 + i));
    }
    let c = qp.execute(&mut b).expect("execute");
    for i in 1..=8u64 {
        let r = c.iter().find(|c| c.wr_id == i).unwrap();
        assert_eq!(
            r.buf,
            i.to_ne_bytes(),
            "read sees the write posted just before"
        );
        let f = c.iter().find(|c| c.wr_id == 100 + i).unwrap();
        assert_eq!(f.result, Ok(i), "FAA sees the write before it");
    }
    // Across batches too.
    b.push(WorkRequest::write(base.add(8), k, vec![9; 8]));
    qp.post(&mut b).expect("post");
    b.push(WorkRequest::read(base.add(8), k, vec![0; 8]));
    qp.post(&mut b).expect("post");
    let mut out = Vec::new();
    while qp.pending() > 0 {
        qp.poll(&mut out, 8);
    }
    assert_eq!(out[1].buf, vec![9; 8]);
    fabric.free_chunk(base).expect("free");
}

/// A reader on another queue pair that sees a flag written after data (in
/// posting order) also sees the data.
pub fn ordering_seen_by_others(fabric: &dyn Fabric, node: NodeId) {
    let (base, _, k) = chunk(fabric, node, 4096);
    let data = base.add(64);
    let flag = base;
    const ROUNDS: u64 = 2000;
    std::thread::scope(|s| {
        s.spawn(|| {
            let mut qp = fabric.connect(node).expect("qp");
            for i in 1..=ROUNDS {
                let mut b = Batch::new();
                b.push(WorkRequest::write(data, k, i.to_ne_bytes().repeat(32)).unsignaled())
                    .push(WorkRequest::write(flag, k, i.to_ne_bytes().to_vec()));
                qp.execute(&mut b).expect("write");
            }
        });
        s.spawn(|| {
            let mut qp = fabric.connect(node).expect("qp");
            let mut seen = 0;
            while seen < ROUNDS {
                let mut b = Batch::new();
                b.push(WorkRequest::read(flag, k, vec![0; 8]))
                    .push(WorkRequest::read(data, k, vec![0; 256]));
                let c = qp.execute(&mut b).expect("read");
                let f = u64::from_ne_bytes(c[0].buf[..8].try_into().unwrap());
                let d = &c[1].buf;
                let first = u64::from_ne_bytes(d[..8].try_into().unwrap());
                assert!(first >= f, "data {first} older than flag {f}");
                for w in d.chunks(8) {
                    let v = u64::from_ne_bytes(w.try_into().unwrap());
                    assert!(v >= f, "word {v} older than flag {f}");
                }
                seen = f;
            }
        });
    });
    fabric.free_chunk(base).expect("free");
}

/// Roots and statistics through the control service.
pub fn control_rpcs(fabric: &dyn Fabric, node: NodeId) {
    let name = format!("conformance/{}", std::process::id());
    assert_eq!(fabric.get_root(node, &name).unwrap(), None);
    assert_eq!(fabric.set_root(node, &name, 7, Some(None)).unwrap(), None);
    assert!(matches!(
        fabric.set_root(node, &name, 8, Some(None)),
        Err(FabricError::Rpc { .. })
    ));
    assert_eq!(fabric.get_root(node, &name).unwrap(), Some(7));
    assert!(matches!(
        fabric.get_root(node, "no spaces"),
        Err(FabricError::Rpc { .. })
    ));
    let before = fabric.node_stats(node).unwrap();
    let (a, len, _) = fabric.alloc_chunk(node, 5000, false).unwrap();
    assert!(
        len >= 5000 && len % before.page_size == 0,
        "rounded to pages: {len}"
    );
    let mid = fabric.node_stats(node).unwrap();
    assert_eq!(mid.chunk_bytes, before.chunk_bytes + len);
    assert_eq!(fabric.free_chunk(a).unwrap(), len);
    assert!(
        matches!(fabric.free_chunk(a), Err(FabricError::Rpc { .. })),
        "double free is refused"
    );
    assert!(matches!(
        fabric.alloc_chunk(node, 0, false),
        Err(FabricError::Rpc { .. })
    ));
    assert!(matches!(
        fabric.rpc(node.wrapping_add(77), dmkit_memnode::Request::Stats),
        Err(FabricError::NoSuchNode(_))
    ));
}
