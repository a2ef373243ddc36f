//! The shm backend against the fabric contract, embedded and over the socket,
//! plus protection, latency, remapping and hostile-input tests.

mod common;

use std::io::{Read, Write};
use std::os::unix::net::UnixStream;
use std::time::{Duration, Instant};

use common::Served;
use dmkit_fabric::shm::{ShmConfig, ShmFabric, WritePrefetch};
use dmkit_fabric::{
    conformance, Batch, ControlPlane, Fabric, FabricError, GlobalAddr, LocalMem, LocalRef,
    QueuePair, SyncQp, VerbError, WorkRequest,
};
use dmkit_memnode::layout::access;
use dmkit_memnode::proto::{self, Hello, Request, Response, PROTO_MAGIC, PROTO_VERSION};
use dmkit_memnode::{NodeConfig, RpcError};

fn embedded() -> ShmFabric {
    ShmFabric::one_node(ShmConfig::default(), 8 << 20).unwrap()
}

#[test]
fn conformance_embedded() {
    conformance::run_all(&embedded(), 0);
}

#[test]
fn conformance_over_unix_socket() {
    let s = Served::start(8 << 20);
    conformance::run_all(&s.client(), 0);
    let st = s.node.stats();
    assert_eq!(st.auth_failures, 0);
    assert_eq!(st.session_chunk_bytes, 0, "every check freed its chunks");
}

#[test]
fn conformance_with_two_mib_pages_and_two_nodes() {
    let f = ShmFabric::embedded(
        ShmConfig::default(),
        &[
            NodeConfig {
                node_id: 3,
                size: 16 << 20,
                page_size: 2 << 20,
                spare_pages: 2,
                rpc_workers: 1,
                prefault_chunks: true,
            },
            NodeConfig {
                node_id: 9,
                size: 4 << 20,
                ..Default::default()
            },
        ],
    )
    .unwrap();
    assert_eq!(f.nodes(), vec![3, 9]);
    conformance::run_all(&f, 3);
    conformance::run_all(&f, 9);
}

#[test]
fn duplicate_node_ids_are_refused() {
    let n = NodeConfig {
        size: 1 << 20,
        ..Default::default()
    };
    assert!(matches!(
        ShmFabric::embedded(ShmConfig::default(), &[n.clone(), n]),
        Err(FabricError::Connect { .. })
    ));
}

#[test]
fn access_rights_and_deregistration_are_enforced() {
    let f = embedded();
    let node = f.embedded_node(0).unwrap();
    let ro = node.register_region(4096 * 16, 4096, access::READ).unwrap();
    let a = GlobalAddr::new(0, 4096 * 16);
    let mut q = SyncQp::new(&f, 0, 64).unwrap();
    q.read(a, ro.rkey, 8).unwrap();
    let mem = LocalMem::new(64);
    let l8 = LocalRef::new(q.qp().register_local(&mem), 0, 8);
    let qp = q.qp();
    let mut b = Batch::new();
    for wr in [
        WorkRequest::write(a, ro.rkey, l8),
        WorkRequest::faa(a, ro.rkey, 1),
    ] {
        b.push(wr);
        match qp.execute(&mut b) {
            Err(FabricError::Request(e)) => {
                assert!(matches!(e.error, VerbError::AccessDenied { .. }), "{e}")
            }
            other => panic!("{other:?}"),
        }
    }
    node.deregister_region(ro.rkey).unwrap();
    b.push(WorkRequest::read(a, ro.rkey, l8));
    match qp.execute(&mut b) {
        Err(FabricError::Request(e)) => assert_eq!(e.error, VerbError::BadKey { rkey: ro.rkey }),
        other => panic!("{other:?}"),
    }
}

#[test]
fn latency_model_delays_completions_not_data() {
    let rtt = Duration::from_millis(20);
    let f = ShmFabric::one_node(
        ShmConfig {
            rtt: Some(rtt),
            ..Default::default()
        },
        1 << 20,
    )
    .unwrap();
    let (a, _, k) = f.alloc_chunk(0, 4096, false).unwrap();
    let mut qp = f.connect(0).unwrap();
    let mut b = Batch::new();
    b.push(WorkRequest::faa(a, k, 1));
    let t0 = Instant::now();
    qp.post(&mut b).unwrap();
    let mut out = Vec::new();
    assert_eq!(qp.poll(&mut out, 8), 0, "not visible before the round trip");
    assert_eq!(qp.pending(), 1);
    b.push(WorkRequest::faa(a, k, 1));
    let c = qp.execute(&mut b).unwrap();
    assert!(t0.elapsed() >= rtt);
    assert_eq!(
        c.iter()
            .map(|c| c.result.clone().unwrap())
            .collect::<Vec<_>>(),
        vec![0, 1]
    );
    let mut q2 = SyncQp::new(&f, 0, 64).unwrap();
    let t1 = Instant::now();
    assert_eq!(q2.read_u64(a, k).unwrap(), 2);
    assert!(
        t1.elapsed() >= rtt,
        "a synchronous read waits one round trip"
    );
}

#[test]
fn remapped_pages_keep_their_contents_for_connected_clients() {
    let s = Served::start(4 << 20);
    let f = s.client();
    let (a, _, k) = f.alloc_chunk(0, 3 * 4096, true).unwrap();
    let mut q = SyncQp::new(&f, 0, 64).unwrap();
    let data: Vec<u8> = (0..3 * 4096u32).map(|i| (i * 7) as u8).collect();
    q.write(a, k, &data).unwrap();
    let page = a.offset() / 4096 + 1;
    let before = s.node.translate(page).unwrap();
    let after = s.node.migrate_page(page).unwrap();
    assert_ne!(before, after);
    assert_eq!(q.read(a, k, 3 * 4096).unwrap(), data);
    // New writes land on the new memory page and stay visible.
    q.write(a.add(4096), k, &[0xEE; 64]).unwrap();
    s.node.migrate_page(page).unwrap();
    assert_eq!(q.read(a.add(4096), k, 64).unwrap(), vec![0xEE; 64]);
}

fn raw_connect(s: &Served, token: [u8; 32]) -> UnixStream {
    let mut st = UnixStream::connect(&s.socket).unwrap();
    st.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    let hello = Hello {
        magic: PROTO_MAGIC,
        version: PROTO_VERSION,
        token,
    };
    proto::write_frame(&mut st, &proto::encode(&hello)).unwrap();
    st
}

fn closed(st: &mut UnixStream) -> bool {
    let mut b = [0u8; 1];
    matches!(st.read(&mut b), Ok(0) | Err(_))
}

#[test]
fn hostile_frames_never_hurt_the_node() {
    let s = Served::start(4 << 20);
    let good = s.client();
    let token = dmkit_memnode::server::read_token_file(&s.target().token_file).unwrap();

    // 1. Wrong token: connection closed, counted.
    let mut st = raw_connect(&s, [0; 32]);
    assert!(closed(&mut st));
    // 2. Garbage instead of a hello.
    let mut st = UnixStream::connect(&s.socket).unwrap();
    st.write_all(&[7, 0, 0, 0, 1, 2, 3, 4, 5, 6, 7]).unwrap();
    assert!(closed(&mut st));
    // 3. A huge length prefix before the hello.
    let mut st = UnixStream::connect(&s.socket).unwrap();
    st.write_all(&u32::MAX.to_le_bytes()).unwrap();
    assert!(closed(&mut st));
    // 4. Authenticated, then frames that do not decode: answered with BadFrame.
    let c = ShmFabric::open(ShmConfig::default(), &[s.target()]).unwrap();
    drop(c);
    let mut st = raw_connect(&s, token);
    let mut buf = vec![0u8; 1 << 16];
    let _ = st.read(&mut buf).unwrap(); // the welcome (fds are dropped with the message)
    let mut garbage = vec![0xFFu8; 100];
    garbage[..4].copy_from_slice(&9u32.to_le_bytes());
    for frame in [
        vec![200, 0, 0, 0],
        vec![2, 0, 0, 0, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0x7F],
        garbage,
    ] {
        proto::write_frame(&mut st, &frame).unwrap();
        let resp: Response = proto::decode(&proto::read_frame(&mut st).unwrap().unwrap()).unwrap();
        assert!(
            matches!(resp, Response::Error(RpcError::BadFrame(_))),
            "{resp:?}"
        );
    }
    // A valid request on the same connection still works.
    proto::write_frame(&mut st, &proto::encode(&Request::Stats)).unwrap();
    let resp: Response = proto::decode(&proto::read_frame(&mut st).unwrap().unwrap()).unwrap();
    assert!(matches!(resp, Response::Stats(_)));
    // 5. An oversized frame closes the connection.
    st.write_all(&(proto::MAX_FRAME + 1).to_le_bytes()).unwrap();
    assert!(closed(&mut st));
    // 6. A truncated frame followed by a hang-up.
    let mut st = raw_connect(&s, token);
    let _ = st.read(&mut buf).unwrap();
    st.write_all(&[50, 0, 0, 0, 1, 2]).unwrap();
    drop(st);

    // The node serves the well-behaved client throughout.
    let (a, _, k) = good.alloc_chunk(0, 4096, false).unwrap();
    let mut qp = good.connect(0).unwrap();
    let mut b = Batch::new();
    b.faa(a, k, 41);
    b.faa(a, k, 1);
    let c = qp.execute(&mut b).unwrap();
    assert_eq!(c[1].result, Ok(41));
    let st = good.node_stats(0).unwrap();
    assert!(st.auth_failures >= 3, "{st:?}");
    assert!(st.bad_frames >= 4, "{st:?}");
}

#[test]
fn wrong_or_public_token_file_is_refused() {
    let s = Served::start(1 << 20);
    let bad = s.dir.path().join("bad.token");
    std::fs::write(&bad, "00".repeat(32)).unwrap();
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&bad, std::fs::Permissions::from_mode(0o600)).unwrap();
    let t = dmkit_fabric::shm::Target {
        socket: s.socket.clone(),
        token_file: bad.clone(),
    };
    assert!(matches!(
        ShmFabric::open(ShmConfig::default(), std::slice::from_ref(&t)),
        Err(FabricError::Connect { .. })
    ));
    std::fs::set_permissions(&bad, std::fs::Permissions::from_mode(0o644)).unwrap();
    match ShmFabric::open(ShmConfig::default(), &[t]) {
        Err(FabricError::Connect { reason, .. }) => {
            assert!(reason.contains("chmod 600"), "{reason}")
        }
        other => panic!("{:?}", other.err()),
    }
    assert!(s.client().node_stats(0).is_ok());
}

#[test]
fn shutdown_rpc_stops_the_server() {
    let mut s = Served::start(1 << 20);
    let c = s.client();
    let (a, _, k) = c.alloc_chunk(0, 4096, true).unwrap();
    let mut qp = c.connect(0).unwrap();
    let mut b = Batch::new();
    b.faa(a, k, 1);
    qp.execute(&mut b).unwrap();
    c.shutdown_node(0).unwrap();
    // Verbs against a node that has shut down fail with a typed error
    // instead of touching the orphaned memory.
    b.faa(a, k, 1);
    match qp.post(&mut b) {
        Err(dmkit_fabric::PostError::Disconnected(0)) => {}
        other => panic!("{other:?}"),
    }
    assert_eq!(b.len(), 1, "the refused batch is left intact");
    s.running.take().unwrap().join().unwrap();
    assert!(!s.socket.exists(), "socket file removed");
    assert!(matches!(
        c.node_stats(0),
        Err(FabricError::ConnectionLost(0))
    ));
}

#[test]
fn qp_stats_count_verbs_and_bytes() {
    let f = embedded();
    let (a, _, k) = f.alloc_chunk(0, 4096, false).unwrap();
    let mut qp = f.connect_qp(0).unwrap();
    let mem = LocalMem::new(4096);
    let lk = qp.register_local(&mem);
    let mut b = Batch::new();
    b.write(a, k, LocalRef::new(lk, 0, 100));
    b.read(a, k, LocalRef::new(lk, 100, 30));
    b.cas(a, k, 0, 1);
    b.faa(a.add(8), k, 1);
    qp.execute(&mut b).unwrap();
    let s = qp.stats();
    assert_eq!(
        (s.doorbells, s.reads, s.writes, s.cas, s.faa),
        (1, 1, 1, 1, 1)
    );
    assert_eq!((s.bytes_read, s.bytes_written, s.errors), (30, 100, 0));
}

/// A queue pair shared by several threads passes the conformance checks per
/// handle and routes every completion to the thread that posted it.
#[test]
fn shared_queue_pair_routes_completions_to_their_posters() {
    use dmkit_fabric::SharedQp;
    let f = embedded();
    let (a, _, k) = f.alloc_chunk(0, 4096, false).unwrap();
    let handles = SharedQp::share(f.connect(0).unwrap(), 4);
    std::thread::scope(|s| {
        for (t, mut h) in handles.into_iter().enumerate() {
            s.spawn(move || {
                let mem = LocalMem::new(64);
                let lk = h.register_local(&mem);
                for i in 0..2000u64 {
                    let mut b = Batch::new();
                    b.faa(a.add(8 * t as u64), k, 1).set_id(i);
                    b.faa(a.add(32), k, 1).set_id(i).set_unsignaled();
                    b.read(a.add(8 * t as u64), k, LocalRef::new(lk, 0, 8))
                        .set_id(1_000_000 + i);
                    if i % 100 == 0 {
                        // A failing request: its error comes back to this thread.
                        b.cas(a.add(3), k, 0, 1)
                            .set_id(7_000_000 + i)
                            .set_unsignaled();
                    }
                    let r = h.execute(&mut b);
                    if i % 100 == 0 {
                        match r {
                            Err(FabricError::Request(e)) => {
                                assert_eq!(e.wr_id, 7_000_000 + i, "thread {t}")
                            }
                            other => panic!("thread {t}: {other:?}"),
                        }
                    } else {
                        let c = r.unwrap();
                        assert_eq!(
                            c.iter().map(|c| c.wr_id).collect::<Vec<_>>(),
                            vec![i, 1_000_000 + i],
                            "thread {t}"
                        );
                        assert_eq!(c[0].result, Ok(i), "thread {t}: its own counter");
                        assert_eq!(mem.load_u64(0), i + 1);
                    }
                    assert_eq!(h.pending(), 0);
                }
            });
        }
    });
    let mut q = SyncQp::new(&f, 0, 64).unwrap();
    for t in 0..4 {
        assert_eq!(q.read_u64(a.add(8 * t), k).unwrap(), 2000);
    }
    assert_eq!(q.read_u64(a.add(32), k).unwrap(), 4 * 2000);
}

/// An embedded 8 MiB node with `cfg`.
fn with_config(cfg: ShmConfig) -> ShmFabric {
    ShmFabric::one_node(cfg, 8 << 20).unwrap()
}

fn with_deferred_reads(on: bool) -> ShmFabric {
    with_config(ShmConfig {
        deferred_reads: on,
        ..Default::default()
    })
}

fn with_write_prefetch(mode: WritePrefetch) -> ShmFabric {
    with_config(ShmConfig {
        write_prefetch: mode,
        ..Default::default()
    })
}

#[test]
fn conformance_without_deferred_reads() {
    conformance::run_all(&with_deferred_reads(false), 0);
}

/// With deferred READs the copy happens between post and completion
/// (at the poll); without, at post. Either way the completion carries the
/// data and the counters count the READ once it took effect.
#[test]
fn deferred_reads_copy_by_the_completion() {
    for on in [true, false] {
        let f = with_deferred_reads(on);
        let (a, _, k) = f.alloc_chunk(0, 4096, false).unwrap();
        let mut q = SyncQp::new(&f, 0, 64).unwrap();
        q.write(a, k, &[0x11; 64]).unwrap();
        let mut qp = f.connect_qp(0).unwrap();
        assert_eq!(qp.deferred_reads(), on);
        let mem = LocalMem::new(128);
        let lk = qp.register_local(&mem);
        let mut b = Batch::new();
        b.read(a, k, LocalRef::new(lk, 0, 8)).set_unsignaled();
        b.read(a.add(8), k, LocalRef::new(lk, 8, 56)).set_id(2);
        qp.post(&mut b).unwrap();
        assert_eq!(qp.pending(), 1, "one signaled READ outstanding");
        let copied = mem.to_vec(0, 64) == vec![0x11; 64];
        assert_eq!(copied, !on, "copied at post iff not deferred");
        assert_eq!(qp.stats().reads, if on { 0 } else { 2 });
        let mut out = Vec::new();
        assert_eq!(qp.poll(&mut out, 8), 1);
        assert_eq!(out[0].wr_id, 2);
        assert_eq!(out[0].result, Ok(56));
        assert_eq!(mem.to_vec(0, 64), vec![0x11; 64]);
        assert_eq!(qp.stats().reads, 2);
        assert_eq!(qp.pending(), 0);
    }
}

/// A deferred READ whose page is unmapped between post and poll fails at
/// its completion with the typed error, and flushes the rest of its batch
/// (requests of other batches are unaffected); a READ refused by a check
/// that needs no remote memory fails at once, after the READs before it.
#[test]
fn deferred_read_errors_reach_the_completion() {
    let f = with_deferred_reads(true);
    let node = f.embedded_node(0).unwrap();
    let (a, _, k) = f.alloc_chunk(0, 3 * 4096, false).unwrap();
    let mut q = SyncQp::new(&f, 0, 64).unwrap();
    q.write(a, k, &[0x22; 8]).unwrap();
    let mut qp = f.connect_qp(0).unwrap();
    let mem = LocalMem::new(256);
    let lk = qp.register_local(&mem);
    let l = |i: u64| LocalRef::new(lk, 8 * i, 8);
    let mut b = Batch::new();
    b.read(a, k, l(0)).set_id(1);
    b.read(a.add(4096), k, l(1)).set_id(2).set_unsignaled();
    b.read(a, k, l(2)).set_id(3);
    qp.post(&mut b).unwrap();
    b.read(a, k, l(3)).set_id(4);
    qp.post(&mut b).unwrap();
    node.unmap_pages(a.offset() / 4096 + 1, 1).unwrap();
    let mut out = Vec::new();
    assert_eq!(qp.poll(&mut out, 8), 4);
    let ids: Vec<u64> = out.iter().map(|c| c.wr_id).collect();
    assert_eq!(ids, vec![1, 2, 3, 4]);
    assert_eq!(out[0].result, Ok(8));
    let e = out[1].error().expect("unmapped page");
    assert_eq!(
        (e.index, e.error.clone()),
        (
            1,
            VerbError::PageNotMapped {
                page: a.offset() / 4096 + 1
            }
        )
    );
    assert_eq!(out[2].error().unwrap().error, VerbError::Flushed);
    assert_eq!(out[3].result, Ok(8), "the next batch runs");
    assert_eq!(mem.load_u64(0), 0x2222_2222_2222_2222);
    assert_eq!(mem.load_u64(16), 0, "a flushed READ moves nothing");
    assert_eq!(mem.load_u64(24), 0x2222_2222_2222_2222);
    assert_eq!(qp.stats().errors, 1);

    // Refused at post (local range out of bounds): the READ before it
    // still completes first, the one after is flushed.
    out.clear();
    b.read(a, k, l(4)).set_id(5);
    b.read(a, k, LocalRef::new(lk, 250, 8)).set_id(6);
    b.read(a, k, l(5)).set_id(7);
    qp.post(&mut b).unwrap();
    assert_eq!(qp.poll(&mut out, 8), 3);
    assert_eq!(out[0].result, Ok(8));
    assert!(matches!(
        out[1].error().unwrap().error,
        VerbError::LocalOutOfBounds { .. }
    ));
    assert_eq!(out[2].error().unwrap().error, VerbError::Flushed);
    assert_eq!(mem.load_u64(40), 0);
}

#[test]
fn conformance_without_write_prefetch() {
    conformance::run_all(&with_write_prefetch(WritePrefetch::Off), 0);
}

#[test]
fn conformance_with_write_prefetch_always() {
    conformance::run_all(&with_write_prefetch(WritePrefetch::Always), 0);
}

/// The write prefetch is a hint: a stream of scalar and gather WRITEs up to
/// the very end of the node's memory (where the lines after the last
/// WRITE are not mapped) lands the same bytes in every mode.
#[test]
fn write_prefetch_is_only_a_hint() {
    for mode in [
        WritePrefetch::Off,
        WritePrefetch::Stream,
        WritePrefetch::Always,
    ] {
        let f = with_write_prefetch(mode);
        let heap = f.heap(0).unwrap();
        let len = 16 * 1024u64;
        let mut q = SyncQp::new(&f, 0, 64).unwrap();
        // The whole heap as one chunk; the stream fills its last 16 KiB.
        let (whole, got, k) = f.alloc_chunk(0, heap.len, false).unwrap();
        assert_eq!(got, heap.len);
        let a = whole.add(heap.len - len);
        let mut qp = f.connect_qp(0).unwrap();
        let mem = LocalMem::new(len as usize);
        let lk = qp.register_local(&mem);
        let data: Vec<u8> = (0..len).map(|i| (i * 7 + 3) as u8).collect();
        mem.write(0, &data);
        let mut b = Batch::new();
        let mut at = 0u64;
        while at < len {
            if (at / 1024).is_multiple_of(2) {
                b.write(a.add(at), k, LocalRef::new(lk, at, 1024));
            } else {
                let pieces: Vec<LocalRef> = (0..16)
                    .map(|p| LocalRef::new(lk, at + 64 * p, 64))
                    .collect();
                b.write_v(a.add(at), k, &pieces);
            }
            qp.post(&mut b).unwrap();
            at += 1024;
        }
        let mut out = Vec::new();
        while qp.pending() > 0 {
            qp.poll(&mut out, 64);
        }
        assert!(out.iter().all(|c| c.result.is_ok()), "{out:?}");
        assert_eq!(
            q.read(a, k, len as usize).unwrap(),
            data,
            "prefetch {mode:?}"
        );
    }
}

/// A vector request inside one page (translated once, copied piece after
/// piece) and one across a page boundary both gather in order from
/// pieces of two registered buffers, and scatter back; both fail on an
/// unmapped page with the typed error before any byte moves, the one
/// across pages included on its mapped first page. A request that ends
/// exactly at a page's end stays in that page; one byte further crosses.
#[test]
fn vector_requests_in_and_across_pages_check_every_page_first() {
    let f = embedded();
    let node = f.embedded_node(0).unwrap();
    let (a, _, k) = f.alloc_chunk(0, 3 * 4096, false).unwrap();
    let mut q = SyncQp::new(&f, 0, 64).unwrap();
    let mut qp = f.connect_qp(0).unwrap();
    let (m1, m2) = (LocalMem::new(256), LocalMem::new(256));
    let (l1, l2) = (qp.register_local(&m1), qp.register_local(&m2));
    let x: Vec<u8> = (1..=24).collect();
    let y: Vec<u8> = (101..=140).collect();
    m1.write(8, &x);
    m2.write(3, &y);
    let pieces = [
        LocalRef::new(l1, 8, 24),
        LocalRef::new(l2, 3, 40),
        LocalRef::new(l1, 8, 16),
    ];
    let whole = [&x[..], &y[..], &x[..16]].concat();
    assert_eq!(whole.len(), 80);
    let mut write_v = |remote: GlobalAddr| {
        let mut b = Batch::new();
        b.write_v(remote, k, &pieces);
        qp.execute(&mut b).map(|_| ())
    };
    for (remote, what) in [
        (a.add(64), "in one page"),
        (a.add(4096 - 20), "across pages"),
    ] {
        write_v(remote).expect(what);
        assert_eq!(q.read(remote, k, 80).unwrap(), whole, "{what}");
    }
    let page = a.offset() / 4096 + 1;
    node.unmap_pages(page, 1).unwrap();
    let unmapped = |r: Result<(), FabricError>, what: &str| match r {
        Err(FabricError::Request(e)) => {
            assert_eq!(e.error, VerbError::PageNotMapped { page }, "{what}")
        }
        other => panic!("{what}: {other:?}"),
    };
    unmapped(write_v(a.add(4096 + 64)), "in the unmapped page");
    unmapped(write_v(a.add(4096 - 40)), "across into it");
    assert_eq!(
        q.read(a.add(4096 - 40), k, 40).unwrap(),
        [&[0u8; 20][..], &whole[..20]].concat(),
        "the failed WRITE across pages left its mapped first page alone"
    );
    write_v(a.add(4096 - 80)).expect("ends exactly at the page's end");
    assert_eq!(q.read(a.add(4096 - 80), k, 80).unwrap(), whole);
    unmapped(write_v(a.add(4096 - 79)), "one byte over the page's end");
    assert_eq!(
        q.read(a.add(4096 - 80), k, 80).unwrap(),
        whole,
        "the WRITE one byte over moved nothing"
    );
    // Scatter the in-page bytes back, into other places of both buffers.
    let back = [LocalRef::new(l2, 100, 30), LocalRef::new(l1, 200, 50)];
    let mut b = Batch::new();
    b.read_v(a.add(64), k, &back);
    qp.execute(&mut b).expect("scatter in one page");
    assert_eq!([m2.to_vec(100, 30), m1.to_vec(200, 50)].concat(), whole);
}
