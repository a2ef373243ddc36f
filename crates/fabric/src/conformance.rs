//! The fabric conformance suite: checks every backend must pass. The shm
//! tests run it on embedded and socket-connected nodes; later backends (tcp,
//! sim, verbs on Soft-RoCE) run the same functions.
//!
//! Each check allocates its own session chunk, panics (assert) on a contract
//! violation, and frees what it allocated.

use std::time::{Duration, Instant};

use crate::rpc::{RpcChannel, RpcFailure, RpcReply, RpcSendError, ECHO};
use crate::{
    Batch, Completion, Fabric, FabricError, GlobalAddr, LocalMem, LocalRef, NodeId, PostError,
    QueuePair, Rkey, SyncQp, VerbError, WorkRequest,
};

/// Runs every check against node `node` of `fabric`.
pub fn run_all(fabric: &dyn Fabric, node: NodeId) {
    verbs_round_trip(fabric, node);
    vector_io(fabric, node);
    bad_requests(fabric, node);
    flush_after_error(fabric, node);
    signaling(fabric, node);
    poll_drain(fabric, node);
    ordering_within_qp(fabric, node);
    ordering_seen_by_others(fabric, node);
    control_rpcs(fabric, node);
    rpc_all(fabric, node);
}

/// Runs the RPC channel's checks against node `node` (a backend without
/// RPC workers must refuse the channel with `Unsupported`).
pub fn rpc_all(fabric: &dyn Fabric, node: NodeId) {
    if fabric.caps().rpc_workers == 0 {
        assert!(
            matches!(
                fabric.connect_rpc(node),
                Err(FabricError::Unsupported { .. })
            ),
            "no RPC workers: connect_rpc is refused as unsupported"
        );
        return;
    }
    rpc_echo_sizes(fabric, node);
    rpc_fifo(fabric, node);
    rpc_typed_failures(fabric, node);
    rpc_full_ring(fabric, node);
    rpc_many_threads(fabric, node);
}

fn channel(fabric: &dyn Fabric, node: NodeId) -> Box<dyn RpcChannel> {
    let ch = fabric.connect_rpc(node).expect("RPC channel");
    assert_eq!(ch.node(), node);
    assert!(ch.capacity() >= 1 && ch.max_message() >= 64);
    assert_eq!(ch.pending(), 0);
    ch
}

/// Polls `ch` until `n` replies arrived (a generous deadline turns a lost
/// reply into a failure instead of a hang).
fn await_replies(ch: &mut dyn RpcChannel, n: usize) -> Vec<RpcReply> {
    let deadline = Instant::now() + Duration::from_secs(60);
    let mut out = Vec::with_capacity(n);
    while out.len() < n {
        if ch.poll(&mut out) == 0 {
            assert!(
                Instant::now() < deadline,
                "{} of {n} replies after 60 s",
                out.len()
            );
            std::hint::spin_loop();
        }
    }
    assert_eq!(out.len(), n, "no more replies than requests");
    out
}

/// Defers every call and drops the token: no reply, ever (what a client
/// sees of a node that died mid-call without closing its channels).
struct Silent;

impl dmkit_memnode::rpc::Service for Silent {
    type Worker = ();
    type Message = ();
    fn name(&self) -> &'static str {
        "silent"
    }
    fn start_worker(&self, _: dmkit_memnode::rpc::WorkerId, _: usize) {}
    fn handle(
        &self,
        cx: &mut dmkit_memnode::rpc::WorkerCtx<'_, Self>,
        _: &[u8],
        _: &mut Vec<u8>,
    ) -> Result<(), dmkit_memnode::rpc::ServiceError> {
        let _ = cx.defer();
        Ok(())
    }
}

/// The service id [`rpc_no_reply`] registers its silent service under.
pub const SILENT: crate::ServiceId = 0xfe51;

/// No caller waits for ever (a backend with a reply clock): on node `id`
/// (`node`, where a service that never answers is registered here),
/// requests sent through `impatient` (a fabric whose RPC reply timeout is
/// `timeout`) to it, and an echo queued behind them, all fail with
/// `NoReply` once the timeout is over; the channel refuses the next
/// request so; a channel of `other` is still served.
pub fn rpc_no_reply(
    node: &dmkit_memnode::MemNode,
    impatient: &dyn Fabric,
    other: &dyn Fabric,
    id: NodeId,
    timeout: Duration,
) {
    assert!(node.register_service(SILENT, Silent), "id {SILENT} is free");
    let mut ch = channel(impatient, id);
    assert_eq!(ch.call(ECHO, b"up"), Ok(b"up".to_vec()));
    let t0 = Instant::now();
    ch.send(1, SILENT, b"never").unwrap();
    ch.send(2, ECHO, b"behind it").unwrap();
    let out = await_replies(&mut *ch, 2);
    assert!(t0.elapsed() >= timeout, "failed before the timeout");
    assert_eq!(out.iter().map(|r| r.id).collect::<Vec<_>>(), vec![1, 2]);
    for r in &out {
        match &r.result {
            Err(RpcFailure::NoReply { waited_ms }) => {
                assert!(*waited_ms >= timeout.as_millis() as u64, "{waited_ms} ms")
            }
            other => panic!("request {}: {other:?}", r.id),
        }
    }
    assert!(matches!(
        ch.send(3, ECHO, b"x"),
        Err(RpcSendError::Refused(RpcFailure::NoReply { .. }))
    ));
    let mut fresh = channel(other, id);
    assert_eq!(fresh.call(ECHO, b"still"), Ok(b"still".to_vec()));
}

/// A payload of `len` bytes that names `seed`.
fn pattern(len: usize, seed: u64) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u64).wrapping_mul(131).wrapping_add(seed) as u8)
        .collect()
}

/// Echo round trips of sizes from 0 to the channel's `max_message`.
pub fn rpc_echo_sizes(fabric: &dyn Fabric, node: NodeId) {
    let mut ch = channel(fabric, node);
    let max = ch.max_message();
    for (k, len) in [0, 1, 7, 8, 9, 63, 64, 65, 1000, max / 2, max - 1, max]
        .into_iter()
        .enumerate()
    {
        let p = pattern(len, k as u64);
        assert_eq!(ch.call(ECHO, &p), Ok(p), "echo of {len} B");
        assert_eq!(ch.pending(), 0);
    }
}

/// A channel's replies come back in request order, each with its id.
pub fn rpc_fifo(fabric: &dyn Fabric, node: NodeId) {
    let mut ch = channel(fabric, node);
    let n = ch.capacity().min(48);
    for round in 0..3u64 {
        for i in 0..n as u64 {
            let id = 1000 * round + i;
            let p = pattern((id as usize * 37) % 200, id);
            ch.send(id, ECHO, &p).expect("room for capacity() requests");
        }
        assert_eq!(ch.pending(), n);
        let got = await_replies(&mut *ch, n);
        for (i, r) in got.iter().enumerate() {
            let id = 1000 * round + i as u64;
            assert_eq!(r.id, id, "replies in request order");
            assert_eq!(
                r.result,
                Ok(pattern((id as usize * 37) % 200, id)),
                "reply {id}"
            );
        }
        assert_eq!(ch.pending(), 0);
    }
}

/// An unknown service and an oversized payload are typed failures; the
/// channel stays usable after each.
pub fn rpc_typed_failures(fabric: &dyn Fabric, node: NodeId) {
    let mut ch = channel(fabric, node);
    let max = ch.max_message();
    assert_eq!(
        ch.call(0xBEEF, b"anyone?"),
        Err(RpcFailure::NoSuchService(0xBEEF))
    );
    assert_eq!(
        ch.send(1, ECHO, &vec![0; max + 1]),
        Err(RpcSendError::Refused(RpcFailure::TooLarge {
            len: max + 1,
            max
        })),
        "an oversized request is refused before it is sent"
    );
    assert_eq!(ch.pending(), 0, "a refused request is not pending");
    // Mixed in one window: a failure does not disturb its neighbours.
    ch.send(1, ECHO, b"a").unwrap();
    ch.send(2, 0xBEEF, b"b").unwrap();
    ch.send(3, ECHO, b"c").unwrap();
    let got = await_replies(&mut *ch, 3);
    assert_eq!(
        got,
        vec![
            RpcReply {
                id: 1,
                result: Ok(b"a".to_vec())
            },
            RpcReply {
                id: 2,
                result: Err(RpcFailure::NoSuchService(0xBEEF))
            },
            RpcReply {
                id: 3,
                result: Ok(b"c".to_vec())
            },
        ]
    );
    assert_eq!(ch.call(ECHO, b"still here"), Ok(b"still here".to_vec()));
}

/// A full channel refuses without losing anything: every request it took
/// is answered, and it takes requests again once replies are polled.
pub fn rpc_full_ring(fabric: &dyn Fabric, node: NodeId) {
    let mut ch = channel(fabric, node);
    let cap = ch.capacity();
    let mut sent = 0u64;
    loop {
        match ch.send(sent, ECHO, &sent.to_le_bytes()) {
            Ok(()) => sent += 1,
            Err(RpcSendError::Full) => break,
            Err(e) => panic!("send {sent}: {e}"),
        }
        assert!(sent as usize <= cap, "more than capacity() accepted");
    }
    assert_eq!(sent as usize, cap, "a channel takes capacity() requests");
    assert_eq!(ch.send(sent, ECHO, b"x"), Err(RpcSendError::Full));
    assert_eq!(ch.pending(), cap);
    let got = await_replies(&mut *ch, cap);
    for (i, r) in got.iter().enumerate() {
        assert_eq!(r.id, i as u64);
        assert_eq!(r.result, Ok((i as u64).to_le_bytes().to_vec()));
    }
    assert_eq!(ch.call(ECHO, b"again"), Ok(b"again".to_vec()));
}

/// Many channels from many threads at once, each pipelining its calls.
pub fn rpc_many_threads(fabric: &dyn Fabric, node: NodeId) {
    let threads = 4u64;
    std::thread::scope(|s| {
        for t in 0..threads {
            s.spawn(move || {
                let mut ch = channel(fabric, node);
                let window = ch.capacity().min(8);
                let calls = 300u64;
                let (mut sent, mut done) = (0u64, 0u64);
                let mut out = Vec::new();
                while done < calls {
                    while sent < calls && (sent - done) < window as u64 {
                        let id = (t << 32) | sent;
                        ch.send(id, ECHO, &pattern((sent as usize * 13) % 300, id))
                            .expect("room within the window");
                        sent += 1;
                    }
                    out.clear();
                    if ch.poll(&mut out) == 0 {
                        std::hint::spin_loop();
                    }
                    for r in &out {
                        let id = (t << 32) | done;
                        assert_eq!(r.id, id, "thread {t}: replies in order");
                        assert_eq!(
                            r.result,
                            Ok(pattern((done as usize * 13) % 300, id)),
                            "thread {t}, call {done}"
                        );
                        done += 1;
                    }
                }
            });
        }
    });
}

fn chunk(fabric: &dyn Fabric, node: NodeId, len: u64) -> (GlobalAddr, u64, Rkey) {
    fabric.alloc_chunk(node, len, false).expect("alloc chunk")
}

fn sync(fabric: &dyn Fabric, node: NodeId) -> SyncQp {
    SyncQp::new(fabric, node, 4096).expect("queue pair")
}

/// Drains every outstanding completion of `qp`.
fn drain(qp: &mut dyn QueuePair) -> Vec<Completion> {
    let mut out = Vec::new();
    while qp.pending() > 0 {
        if qp.poll(&mut out, 64) == 0 {
            std::hint::spin_loop();
        }
    }
    out
}

/// READ/WRITE of many sizes and alignments (page-crossing included), CAS,
/// FAA and masked CAS results.
pub fn verbs_round_trip(fabric: &dyn Fabric, node: NodeId) {
    let (base, len, k) = chunk(fabric, node, 3 * 4096);
    let mut q = sync(fabric, node);
    assert!(
        q.read(base, k, len as usize)
            .unwrap()
            .iter()
            .all(|&b| b == 0),
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
        q.write(base.add(off), k, &pattern).unwrap();
        assert_eq!(
            q.read(base.add(off), k, n).unwrap(),
            pattern,
            "read back [{off}, +{n})"
        );
    }
    // Local and remote ranges with different alignments.
    let mem = LocalMem::new(256);
    let lk = q.qp().register_local(&mem);
    assert_eq!(
        q.qp().register_local(&mem),
        lk,
        "registering again returns the same key"
    );
    let data: Vec<u8> = (0..100u8).collect();
    mem.write(5, &data);
    let mut b = Batch::new();
    b.write(base.add(17), k, LocalRef::new(lk, 5, 100));
    b.read(base.add(17), k, LocalRef::new(lk, 128, 100));
    q.qp().execute(&mut b).unwrap();
    assert_eq!(mem.to_vec(128, 100), data);

    let w = base.add(64);
    q.write_u64(w, k, 10).unwrap();
    assert_eq!(
        q.cas(w, k, 10, 20).unwrap(),
        10,
        "successful CAS returns the old value"
    );
    assert_eq!(
        q.cas(w, k, 10, 30).unwrap(),
        20,
        "failed CAS returns the current value"
    );
    assert_eq!(q.read_u64(w, k).unwrap(), 20, "failed CAS changed nothing");
    assert_eq!(q.faa(w, k, 5).unwrap(), 20);
    assert_eq!(q.read_u64(w, k).unwrap(), 25);
    assert_eq!(q.faa(w, k, u64::MAX).unwrap(), 25, "FAA wraps");
    assert_eq!(q.read_u64(w, k).unwrap(), 24);
    if fabric.caps().masked_cas {
        q.write_u64(w, k, 0xAAAA_0000_0000_1111).unwrap();
        // Compare only the low 16 bits, swap only the high 16 bits.
        let old = q
            .masked_cas(w, k, 0x1111, 0xFFFF, 0xBBBB << 48, 0xFFFF << 48)
            .unwrap();
        assert_eq!(old, 0xAAAA_0000_0000_1111);
        assert_eq!(q.read_u64(w, k).unwrap(), 0xBBBB_0000_0000_1111);
        let old = q.masked_cas(w, k, 0x2222, 0xFFFF, 0, u64::MAX).unwrap();
        assert_eq!(old, 0xBBBB_0000_0000_1111, "masked compare fails");
        assert_eq!(q.read_u64(w, k).unwrap(), 0xBBBB_0000_0000_1111);
    }
    fabric.free_chunk(base).expect("free");
}

/// Vector READ/WRITE (scatter/gather lists), when the backend offers them.
pub fn vector_io(fabric: &dyn Fabric, node: NodeId) {
    let max = fabric.caps().max_sge;
    if max < 2 {
        return;
    }
    let (base, _, k) = chunk(fabric, node, 3 * 4096);
    let mut q = sync(fabric, node);
    let mem = LocalMem::new(8192);
    let lk = q.qp().register_local(&mem);
    let a: Vec<u8> = (0..13).collect();
    let b: Vec<u8> = (100..164).collect();
    let c: Vec<u8> = (200..203).collect();
    mem.write(0, &a);
    mem.write(1000, &b);
    mem.write(4000, &c);
    // Gather three pieces into one remote range that crosses a page.
    let remote = base.add(4096 - 30);
    let mut batch = Batch::new();
    batch.write_v(
        remote,
        k,
        &[
            LocalRef::new(lk, 0, 13),
            LocalRef::new(lk, 1000, 64),
            LocalRef::new(lk, 4000, 3),
        ],
    );
    q.qp().execute(&mut batch).expect("vector write");
    let whole = [a.clone(), b.clone(), c.clone()].concat();
    assert_eq!(q.read(remote, k, 80).unwrap(), whole, "gathered in order");
    // Scatter it back into three other pieces.
    batch.read_v(
        remote,
        k,
        &[
            LocalRef::new(lk, 5000, 40),
            LocalRef::new(lk, 6001, 37),
            LocalRef::new(lk, 7000, 3),
        ],
    );
    let c1 = q.qp().execute(&mut batch).expect("vector read");
    assert_eq!(c1[0].result, Ok(80), "completes with the total length");
    assert_eq!(
        [
            mem.to_vec(5000, 40),
            mem.to_vec(6001, 37),
            mem.to_vec(7000, 3)
        ]
        .concat(),
        whole
    );
    // Too many entries, an empty list and a bad key inside the list all fail
    // the request without moving a byte.
    let many: Vec<LocalRef> = (0..=max as u64)
        .map(|i| LocalRef::new(lk, 8 * i, 8))
        .collect();
    for (pieces, what) in [
        (&many[..], "over max_sge"),
        (&[][..], "empty"),
        (
            &[LocalRef::new(lk, 0, 8), LocalRef::new(lk + 9, 0, 8)][..],
            "bad lkey",
        ),
    ] {
        batch.write_v(base, k, pieces).set_id(5);
        match q.qp().execute(&mut batch) {
            Err(FabricError::Request(e)) => {
                assert!(
                    matches!(
                        e.error,
                        VerbError::BadSgl { .. } | VerbError::BadLkey(_) | VerbError::ZeroLength
                    ),
                    "{what}: {e}"
                )
            }
            other => panic!("{what}: {other:?}"),
        }
    }
    assert_eq!(
        q.read(base, k, 16).unwrap(),
        vec![0; 16],
        "failed vector writes moved nothing"
    );
    fabric.free_chunk(base).expect("free");
}

fn expect_err(
    qp: &mut dyn QueuePair,
    wr: WorkRequest,
    want: impl Fn(&VerbError) -> bool,
    what: &str,
) {
    let id = 0xE7;
    let mut b = Batch::new();
    b.push(wr.id(id));
    match qp.execute(&mut b) {
        Err(FabricError::Request(e)) => {
            assert_eq!(
                (e.index, e.wr_id, e.remote),
                (0, id, wr.remote),
                "{what}: the error names the request"
            );
            assert!(want(&e.error), "{what}: got {e}");
        }
        other => panic!("{what}: expected a request error, got {other:?}"),
    }
}

/// Bad requests fail with a typed error naming them and change nothing.
pub fn bad_requests(fabric: &dyn Fabric, node: NodeId) {
    let heap = fabric.heap(node).expect("heap");
    let (base, len, k) = chunk(fabric, node, 4096);
    let mut q = sync(fabric, node);
    q.write(base, k, &[0x5A; 16]).unwrap();
    let mem = LocalMem::new(4096);
    let qp = q.qp();
    let lk = qp.register_local(&mem);
    let l8 = LocalRef::new(lk, 0, 8);
    let end = GlobalAddr::new(node, heap.base + heap.len);
    use VerbError as E;
    expect_err(
        qp,
        WorkRequest::write(GlobalAddr::new(node, 0), k, l8),
        |e| matches!(e, E::OutOfBounds { .. }),
        "below region",
    );
    expect_err(
        qp,
        WorkRequest::read(end, k, l8),
        |e| matches!(e, E::OutOfBounds { .. }),
        "past region",
    );
    expect_err(
        qp,
        WorkRequest::read(end.add(1 << 40), k, l8),
        |e| matches!(e, E::OutOfBounds { .. }),
        "far past region",
    );
    expect_err(
        qp,
        WorkRequest::write(GlobalAddr::new(node, heap.base + heap.len - 4), k, l8),
        |e| matches!(e, E::CrossesRegionEnd { .. }),
        "crossing the end",
    );
    expect_err(
        qp,
        WorkRequest::write(base, k ^ 0x100, l8),
        |e| matches!(e, E::BadKey { .. }),
        "wrong key",
    );
    expect_err(
        qp,
        WorkRequest::read(base, k ^ 0x3F, l8),
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
        WorkRequest::read(base, k, LocalRef::new(lk, 0, 0)),
        |e| *e == E::ZeroLength,
        "zero-length read",
    );
    expect_err(
        qp,
        WorkRequest::write(base, k, LocalRef::new(lk, 0, 0)),
        |e| *e == E::ZeroLength,
        "zero-length write",
    );
    expect_err(
        qp,
        WorkRequest::read(base, k, LocalRef::new(lk + 7, 0, 8)),
        |e| *e == E::BadLkey(lk + 7),
        "unregistered lkey",
    );
    expect_err(
        qp,
        WorkRequest::read(base, k, LocalRef::new(lk, 4090, 8)),
        |e| matches!(e, E::LocalOutOfBounds { .. }),
        "local range too long",
    );
    let big = fabric.caps().max_inline + 1;
    expect_err(
        qp,
        WorkRequest::write(base, k, LocalRef::new(lk, 0, big as u32)).inline(),
        |e| matches!(e, E::InlineTooLarge { .. }),
        "inline too large",
    );
    let other = node.wrapping_add(1);
    expect_err(
        qp,
        WorkRequest::read(GlobalAddr::new(other, base.offset()), k, l8),
        |e| matches!(e, E::WrongNode { .. }),
        "wrong node",
    );

    // A batch over the limit is refused whole.
    let max = fabric.caps().max_batch;
    let mut b = Batch::new();
    for _ in 0..=max {
        b.faa(base, k, 1);
    }
    match qp.post(&mut b) {
        Err(PostError::BatchTooLarge { len, max: m }) => assert_eq!((len, m), (max + 1, max)),
        other => panic!("batch over the limit: {other:?}"),
    }
    assert_eq!(b.len(), max + 1, "a refused batch is left intact");
    assert_eq!(qp.pending(), 0);
    // Nothing above changed memory; the queue pair still works.
    assert_eq!(q.read(base, k, 16).unwrap(), vec![0x5A; 16]);
    assert!(len >= 4096);
    fabric.free_chunk(base).expect("free");
}

/// After a failed request the rest of its batch is flushed, without effect.
pub fn flush_after_error(fabric: &dyn Fabric, node: NodeId) {
    let (base, _, k) = chunk(fabric, node, 4096);
    let mut q = sync(fabric, node);
    let mem = LocalMem::new(64);
    mem.write(0, &[1; 8]);
    mem.write(8, &[3; 8]);
    let qp = q.qp();
    let lk = qp.register_local(&mem);
    let mut b = Batch::new();
    b.write(base, k, LocalRef::new(lk, 0, 8)).set_id(1);
    b.cas(base.add(3), k, 0, 1).set_id(2);
    b.write(base.add(8), k, LocalRef::new(lk, 8, 8))
        .set_id(3)
        .set_unsignaled();
    qp.post(&mut b).expect("post");
    let out = drain(qp);
    let got: Vec<_> = out
        .iter()
        .map(|c| (c.wr_id, c.error().map(|e| (e.index, e.error.clone()))))
        .collect();
    assert_eq!(got[0], (1, None));
    assert!(matches!(
        got[1],
        (2, Some((1, VerbError::Unaligned { .. })))
    ));
    assert_eq!(
        got[2],
        (3, Some((2, VerbError::Flushed))),
        "flushed even though unsignaled"
    );
    assert_eq!(out.len(), 3);
    assert_eq!(
        q.read(base, k, 16).unwrap(),
        [vec![1; 8], vec![0; 8]].concat(),
        "flushed write had no effect"
    );
    fabric.free_chunk(base).expect("free");
}

/// Unsignaled successes produce no completion but take effect (READ data
/// included); signaled ones complete exactly once.
pub fn signaling(fabric: &dyn Fabric, node: NodeId) {
    let (base, _, k) = chunk(fabric, node, 4096);
    let mut q = sync(fabric, node);
    let mem = LocalMem::new(4096);
    let qp = q.qp();
    let lk = qp.register_local(&mem);
    let mut b = Batch::new();
    for i in 0..10u64 {
        let wr = b.faa(base, k, 1).set_id(i);
        if i % 3 != 0 {
            wr.set_unsignaled();
        }
    }
    // Several unsignaled READs, then one signaled: all data is there.
    for i in 0..4u64 {
        b.read(base, k, LocalRef::new(lk, 8 * i, 8))
            .set_unsignaled();
    }
    b.read(base, k, LocalRef::new(lk, 64, 8)).set_id(99);
    let c = qp.execute(&mut b).expect("execute");
    let ids: Vec<u64> = c.iter().map(|c| c.wr_id).collect();
    assert_eq!(ids, vec![0, 3, 6, 9, 99]);
    let olds: Vec<u64> = c[..4].iter().map(|c| *c.result.as_ref().unwrap()).collect();
    assert_eq!(
        olds,
        vec![0, 3, 6, 9],
        "unsignaled FAAs took effect in order"
    );
    for off in [0, 8, 16, 24, 64] {
        assert_eq!(
            mem.load_u64(off),
            10,
            "unsignaled READ at local {off} delivered its data"
        );
    }
    assert_eq!(qp.stats().faa, 10);
    assert_eq!(qp.stats().doorbells, 1, "one batch, one doorbell");
    fabric.free_chunk(base).expect("free");
}

/// `poll_drain` moves every completion a loop of `poll`s would, in order,
/// past its `max` per poll, and reports how many.
pub fn poll_drain(fabric: &dyn Fabric, node: NodeId) {
    let (base, _, k) = chunk(fabric, node, 4096);
    let mut q = sync(fabric, node);
    let qp = q.qp();
    let mut b = Batch::new();
    for i in 0..10u64 {
        b.faa(base, k, 1).set_id(i);
    }
    qp.post(&mut b).expect("post");
    let mut out = Vec::new();
    let mut calls = 0;
    while out.len() < 10 {
        let before = out.len();
        let n = qp.poll_drain(&mut out, 3);
        assert_eq!(n, out.len() - before, "the count is what was moved");
        calls += 1;
        assert!(calls < 10_000_000, "10 completions never arrived");
    }
    let ids: Vec<u64> = out.iter().map(|c| c.wr_id).collect();
    assert_eq!(ids, (0..10).collect::<Vec<_>>(), "in posting order");
    let olds: Vec<u64> = out.iter().map(|c| *c.result.as_ref().unwrap()).collect();
    assert_eq!(olds, (0..10).collect::<Vec<_>>());
    assert_eq!(qp.pending(), 0);
    assert_eq!(qp.poll_drain(&mut out, 3), 0, "nothing left");
    fabric.free_chunk(base).expect("free");
}

/// Requests of one queue pair take effect in posting order.
pub fn ordering_within_qp(fabric: &dyn Fabric, node: NodeId) {
    let (base, _, k) = chunk(fabric, node, 4096);
    let mut q = sync(fabric, node);
    let mem = LocalMem::new(4096);
    let qp = q.qp();
    let lk = qp.register_local(&mem);
    let mut b = Batch::new();
    for i in 1..=8u64 {
        mem.store_u64(8 * i as usize, i);
        b.write(base, k, LocalRef::new(lk, 8 * i, 8))
            .set_unsignaled();
        b.read(base, k, LocalRef::new(lk, 512 + 8 * i, 8)).set_id(i);
        b.faa(base, k, 100).set_id(100 + i);
    }
    let c = qp.execute(&mut b).expect("execute");
    for i in 1..=8u64 {
        assert_eq!(
            mem.load_u64(512 + 8 * i as usize),
            i,
            "READ sees the WRITE posted just before"
        );
        let f = c.iter().find(|c| c.wr_id == 100 + i).unwrap();
        assert_eq!(f.result, Ok(i), "FAA sees the WRITE before it");
    }
    // Across batches too.
    mem.write(1024, &[9; 8]);
    b.write(base.add(8), k, LocalRef::new(lk, 1024, 8));
    qp.post(&mut b).expect("post");
    b.read(base.add(8), k, LocalRef::new(lk, 2048, 8));
    qp.post(&mut b).expect("post");
    drain(qp);
    assert_eq!(mem.to_vec(2048, 8), vec![9; 8]);
    // A WRITE or an atomic posted after a READ does not overtake it (an
    // RNIC's responder executes a queue pair's requests in order), in one
    // batch and across batches.
    let w = base.add(16);
    mem.store_u64(3000, 0xAB);
    b.read(w, k, LocalRef::new(lk, 3008, 8)).set_unsignaled();
    b.write(w, k, LocalRef::new(lk, 3000, 8)).set_unsignaled();
    b.read(w, k, LocalRef::new(lk, 3016, 8)).set_unsignaled();
    b.faa(w, k, 1).set_id(7);
    b.read(w, k, LocalRef::new(lk, 3024, 8));
    let c = qp.execute(&mut b).expect("execute");
    assert_eq!(mem.load_u64(3008), 0, "READ before the WRITE");
    assert_eq!(mem.load_u64(3016), 0xAB, "READ between WRITE and FAA");
    assert_eq!(c.iter().find(|c| c.wr_id == 7).unwrap().result, Ok(0xAB));
    assert_eq!(mem.load_u64(3024), 0xAC, "READ after the FAA");
    b.read(w.add(8), k, LocalRef::new(lk, 3032, 8));
    qp.post(&mut b).expect("post");
    b.write(w.add(8), k, LocalRef::new(lk, 3000, 8));
    qp.post(&mut b).expect("post");
    b.cas(w.add(8), k, 0xAB, 5);
    qp.post(&mut b).expect("post");
    b.read(w.add(8), k, LocalRef::new(lk, 3040, 8));
    qp.post(&mut b).expect("post");
    let c = drain(qp);
    assert_eq!(c.len(), 4);
    assert_eq!(mem.load_u64(3032), 0, "READ posted before the WRITE");
    assert_eq!(c[2].result, Ok(0xAB), "CAS after the WRITE");
    assert_eq!(mem.load_u64(3040), 5, "READ after the CAS");
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
            let mem = LocalMem::new(512);
            let lk = qp.register_local(&mem);
            let mut b = Batch::new();
            for i in 1..=ROUNDS {
                for w in 0..33 {
                    mem.store_u64(8 * w, i);
                }
                b.write(data, k, LocalRef::new(lk, 8, 256)).set_unsignaled();
                b.write(flag, k, LocalRef::new(lk, 0, 8));
                qp.execute(&mut b).expect("write");
            }
        });
        s.spawn(|| {
            let mut qp = fabric.connect(node).expect("qp");
            let mem = LocalMem::new(512);
            let lk = qp.register_local(&mem);
            let mut b = Batch::new();
            let mut seen = 0;
            while seen < ROUNDS {
                b.read(flag, k, LocalRef::new(lk, 0, 8));
                b.read(data, k, LocalRef::new(lk, 8, 256));
                qp.execute(&mut b).expect("read");
                let f = mem.load_u64(0);
                for w in 1..33 {
                    let v = mem.load_u64(8 * w);
                    assert!(v >= f, "word {w} = {v} older than flag {f}");
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
        Err(FabricError::Refused { .. })
    ));
    assert_eq!(fabric.get_root(node, &name).unwrap(), Some(7));
    assert!(matches!(
        fabric.get_root(node, "no spaces"),
        Err(FabricError::Refused { .. })
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
        matches!(fabric.free_chunk(a), Err(FabricError::Refused { .. })),
        "double free is refused"
    );
    assert!(matches!(
        fabric.alloc_chunk(node, 0, false),
        Err(FabricError::Refused { .. })
    ));
    assert!(matches!(
        fabric.node_stats(node.wrapping_add(77)),
        Err(FabricError::NoSuchNode(_))
    ));
    // Refusals are typed: a root that holds another value is a mismatch.
    assert!(matches!(
        fabric.set_root(node, &name, 9, Some(Some(1))),
        Err(FabricError::Refused {
            error: crate::ControlError::RootMismatch {
                current: Some(7),
                ..
            },
            ..
        })
    ));
}
