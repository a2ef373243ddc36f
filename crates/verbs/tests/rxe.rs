//! The verbs backend on a real RDMA device (Soft-RoCE `rxe0` in the
//! project's QEMU guest: `tools/softroce/run.sh`). Ignored by default —
//! hosts without RDMA have nothing to run them on; the guest runs them
//! with `--ignored`. Device and GID come from `DMKIT_RDMA_DEVICE` /
//! `DMKIT_GID_INDEX` when set (else the backend's own choice).
#![cfg(feature = "rdma")]

use std::sync::Arc;

use dmkit_fabric::rpc::ECHO;
use dmkit_fabric::{
    conformance, Batch, ControlPlane, Fabric, FabricError, LocalMem, LocalRef, SyncQp, VerbError,
};
use dmkit_memnode::layout::access;
use dmkit_memnode::{MemNode, NodeConfig};
use dmkit_verbs::{DeviceSel, RunningServer, VerbsConfig, VerbsFabric, VerbsServer, VerbsTarget};

fn sel() -> DeviceSel {
    DeviceSel {
        device: std::env::var("DMKIT_RDMA_DEVICE").ok(),
        port: None,
        gid_index: std::env::var("DMKIT_GID_INDEX")
            .ok()
            .and_then(|v| v.parse().ok()),
    }
}

struct Setup {
    server: RunningServer,
    fabric: VerbsFabric,
    _dir: tempfile::TempDir,
}

fn setup(size: u64) -> Setup {
    let node = MemNode::new(NodeConfig {
        size,
        ..Default::default()
    })
    .expect("memory node");
    let dir = tempfile::tempdir().unwrap();
    let token = dir.path().join("node.token");
    let server = VerbsServer::bind(node, &sel(), "127.0.0.1:0", &token)
        .expect("verbs server")
        .spawn();
    let fabric = VerbsFabric::open(
        VerbsConfig {
            device: sel(),
            ..Default::default()
        },
        &[VerbsTarget {
            addr: server.addr().to_string(),
            token_file: token,
        }],
    )
    .expect("verbs fabric");
    Setup {
        server,
        fabric,
        _dir: dir,
    }
}

#[test]
#[ignore = "needs an RDMA device (run in the Soft-RoCE guest)"]
fn conformance_on_rdma_device() {
    let s = setup(16 << 20);
    eprintln!(
        "device {} caps {:?}",
        s.fabric.device().name(),
        s.fabric.caps()
    );
    conformance::run_all(&s.fabric, 0);
    let st = s.server.node().stats();
    assert_eq!(st.session_chunk_bytes, 0, "every check freed its chunks");
}

/// A request the client's checks pass but the NIC refuses (its region was
/// deregistered on the node after the client fetched the table) fails with
/// the same typed error as on shm; the queue pair is rebuilt behind the
/// caller, later batches still execute, and the node keeps serving.
#[test]
#[ignore = "needs an RDMA device (run in the Soft-RoCE guest)"]
fn nic_error_is_typed_and_the_queue_pair_recovers() {
    let s = setup(16 << 20);
    let node = s.server.node().clone();
    let (heap_chunk, _, hk) = s.fabric.alloc_chunk(0, 4096, false).unwrap();
    // A second region over a page of its own.
    let ps = node.layout().page_size();
    let base = node.layout().remote_len() - 4 * ps;
    let r = node
        .register_region(base, ps, access::READ | access::WRITE | access::ATOMIC)
        .unwrap();
    s.server.sync_regions().unwrap();
    // The client learns regions at connect time.
    let mut q = SyncQp::new(&s.fabric, 0, 4096).unwrap();
    let ra = dmkit_fabric::GlobalAddr::new(0, base);
    q.write_u64(ra, r.rkey, 7)
        .expect("write into the extra region");
    assert_eq!(q.read_u64(ra, r.rkey).unwrap(), 7);
    // Node drops the region; the client still believes in it.
    node.deregister_region(r.rkey).unwrap();
    s.server.sync_regions().unwrap();

    let mem = LocalMem::new(64);
    let lk = q.qp().register_local(&mem);
    let mut b = Batch::new();
    b.write(heap_chunk, hk, LocalRef::new(lk, 0, 8)).set_id(1);
    b.read(ra, r.rkey, LocalRef::new(lk, 8, 8)).set_id(2);
    b.faa(heap_chunk.add(8), hk, 1).set_id(3);
    let qp = q.qp();
    qp.post(&mut b).unwrap();
    // A later batch posted before the error is seen: must still execute.
    let mut b2 = Batch::new();
    b2.faa(heap_chunk.add(16), hk, 5).set_id(4);
    qp.post(&mut b2).unwrap();
    let mut out = Vec::new();
    let t0 = std::time::Instant::now();
    while qp.pending() > 0 {
        qp.poll(&mut out, 16);
        assert!(t0.elapsed().as_secs() < 20, "completions arrive");
    }
    let got: Vec<_> = out
        .iter()
        .map(|c| (c.wr_id, c.verb_error().cloned()))
        .collect();
    assert_eq!(got.len(), 4, "{got:?}");
    assert_eq!(got[0], (1, None));
    assert!(
        matches!(got[1], (2, Some(VerbError::BadKey { rkey })) if rkey == r.rkey),
        "{got:?}"
    );
    assert_eq!(got[2], (3, Some(VerbError::Flushed)));
    assert_eq!(got[3], (4, None), "the later batch ran after the rebuild");
    assert_eq!(
        q.read_u64(heap_chunk.add(8), hk).unwrap(),
        0,
        "flushed FAA had no effect"
    );
    assert_eq!(q.read_u64(heap_chunk.add(16), hk).unwrap(), 5);
    // From now on the refreshed table makes the error local and precise.
    match q.read_u64(ra, r.rkey) {
        Err(FabricError::Request(e)) => assert!(matches!(e.error, VerbError::BadKey { .. })),
        other => panic!("{other:?}"),
    }
    // The node never restarted: same node, its RPCs still answer.
    assert!(s.fabric.node_stats(0).unwrap().sessions_active >= 1);
    s.fabric.free_chunk(heap_chunk).unwrap();
}

/// No caller waits for ever on a completion: a queue pair whose completion
/// timeout is shorter than its requests take (8 READs of 8 MiB, rxe's
/// message limit, against a zero timeout) fails them with `NoCompletion`,
/// their effect unknown, and returns; the node keeps serving other
/// clients, which read what was written before.
#[test]
#[ignore = "needs an RDMA device (run in the Soft-RoCE guest)"]
fn a_completion_that_does_not_come_in_time_fails_typed() {
    let s = setup(64 << 20);
    let len = 8u64 << 20;
    let (chunk, _, key) = s.fabric.alloc_chunk(0, len, false).unwrap();
    let mut q = SyncQp::new(&s.fabric, 0, 64).unwrap();
    q.write_u64(chunk.add(len - 8), key, 0x5eed).unwrap();

    let token = s._dir.path().join("node.token");
    let impatient = connect_with(
        &s.server,
        token,
        VerbsConfig {
            completion_timeout: std::time::Duration::ZERO,
            ..Default::default()
        },
    );
    let mut qp = impatient.connect(0).unwrap();
    let reads = 8u64;
    let mem = LocalMem::new((reads * len) as usize);
    let lk = qp.register_local(&mem);
    let mut b = Batch::new();
    for i in 0..reads {
        b.read(chunk, key, LocalRef::new(lk, i * len, len as u32))
            .set_id(i);
    }
    let t0 = std::time::Instant::now();
    let got = qp.execute(&mut b);
    assert!(t0.elapsed().as_secs() < 30, "the call returned");
    match got {
        Err(FabricError::Request(e)) => assert!(
            matches!(e.error, VerbError::NoCompletion { node: 0, .. }),
            "{e}"
        ),
        other => panic!("64 MiB of READs completed within a zero timeout: {other:?}"),
    }
    drop(qp);
    drop(impatient);

    assert_eq!(q.read_u64(chunk.add(len - 8), key).unwrap(), 0x5eed);
    assert!(s.fabric.node_stats(0).unwrap().sessions_active >= 1);
    s.fabric.free_chunk(chunk).unwrap();
}

/// CoRM §3.5: the node moves a page under a live registration; clients
/// keep address and key and read the same bytes.
#[test]
#[ignore = "needs an RDMA device (run in the Soft-RoCE guest)"]
fn page_migration_keeps_address_and_key() {
    let s = setup(16 << 20);
    let (c, _, k) = s.fabric.alloc_chunk(0, 8192, false).unwrap();
    let mut q = SyncQp::new(&s.fabric, 0, 8192).unwrap();
    let data: Vec<u8> = (0..8192u32).map(|i| (i * 13 % 251) as u8).collect();
    q.write(c, k, &data).unwrap();
    let page = c.offset() / s.server.node().layout().page_size();
    match s.server.migrate_page(page) {
        Ok(new) => {
            eprintln!(
                "page {page} moved to memory page {new}; registrations re-keyed: {}",
                s.server.rekeyed_registrations()
            );
            assert_eq!(
                q.read(c, k, 8192).unwrap(),
                data,
                "same bytes after the move"
            );
            q.write_u64(c, k, 42).unwrap();
            assert_eq!(q.read_u64(c, k).unwrap(), 42);
        }
        Err(e) => panic!("the device cannot re-register under the same key: {e}"),
    }
}

/// Several threads, each with its own queue pair (per-thread CQ), hammer
/// one counter with FAA; the sum is exact.
#[test]
#[ignore = "needs an RDMA device (run in the Soft-RoCE guest)"]
fn threads_with_own_queue_pairs_count_exactly() {
    let s = setup(16 << 20);
    let f = Arc::new(s.fabric);
    let (c, _, k) = f.alloc_chunk(0, 4096, false).unwrap();
    let threads: Vec<_> = (0..4)
        .map(|_| {
            let f = f.clone();
            std::thread::spawn(move || {
                let mut q = SyncQp::new(&*f, 0, 64).unwrap();
                for _ in 0..500 {
                    q.faa(c, k, 1).unwrap();
                }
            })
        })
        .collect();
    for t in threads {
        t.join().unwrap();
    }
    let mut q = SyncQp::new(&*f, 0, 64).unwrap();
    assert_eq!(q.read_u64(c, k).unwrap(), 2000);
}

fn connect(server: &RunningServer, token: std::path::PathBuf) -> VerbsFabric {
    connect_with(server, token, VerbsConfig::default())
}

/// A second fabric on `server` with `cfg` (its device: the tests' own).
fn connect_with(
    server: &RunningServer,
    token: std::path::PathBuf,
    cfg: VerbsConfig,
) -> VerbsFabric {
    VerbsFabric::open(
        VerbsConfig {
            device: sel(),
            ..cfg
        },
        &[VerbsTarget {
            addr: server.addr().to_string(),
            token_file: token,
        }],
    )
    .expect("verbs fabric")
}

/// No RPC caller waits for ever either: over verbs too, requests whose
/// reply does not come within the channel's reply timeout fail with
/// `NoReply` (`conformance::rpc_no_reply`).
#[test]
#[ignore = "needs an RDMA device (run in the Soft-RoCE guest)"]
fn an_rpc_reply_that_does_not_come_in_time_fails_typed() {
    let s = setup(16 << 20);
    let timeout = std::time::Duration::from_millis(300);
    let impatient = connect_with(
        &s.server,
        s._dir.path().join("node.token"),
        VerbsConfig {
            rpc_reply_timeout: timeout,
            ..Default::default()
        },
    );
    conformance::rpc_no_reply(s.server.node(), &impatient, &s.fabric, 0, timeout);
}

/// The RPC channel's conformance section over two-sided SEND/RECV: the
/// node announces its workers, so the section runs in full (not the
/// "unsupported" branch).
#[test]
#[ignore = "needs an RDMA device (run in the Soft-RoCE guest)"]
fn rpc_conformance_on_rdma_device() {
    let s = setup(16 << 20);
    let workers = s.server.node().rpc_workers();
    assert!(workers > 0, "the test node runs RPC workers");
    assert_eq!(s.fabric.caps().rpc_workers, workers);
    conformance::rpc_all(&s.fabric, 0);
    let st = s.server.node().stats();
    assert!(st.rpc_requests > 0 && st.rpc_channels > 0, "{st:?}");
    assert_eq!(st.rpc_channels_broken, 0);
}

/// A client whose control connection closes (a process that exits or
/// dies) loses its channels on the node; another client's channel keeps
/// being served.
#[test]
#[ignore = "needs an RDMA device (run in the Soft-RoCE guest)"]
fn rpc_channels_go_with_their_session() {
    let s = setup(16 << 20);
    let token = s._dir.path().join("node.token");
    let mut stays = s.fabric.connect_rpc(0).expect("channel");
    assert_eq!(stays.call(ECHO, b"one"), Ok(b"one".to_vec()));
    let other = connect(&s.server, token);
    let mut goes = other.connect_rpc(0).expect("channel");
    assert_eq!(goes.call(ECHO, b"two"), Ok(b"two".to_vec()));
    let before = s.server.node().stats();
    assert_eq!(before.rpc_channels, 2);
    drop(goes);
    drop(other);
    let t0 = std::time::Instant::now();
    while s.server.node().stats().rpc_channels_reclaimed <= before.rpc_channels_reclaimed {
        assert!(t0.elapsed().as_secs() < 20, "the channel is reclaimed");
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
    assert_eq!(s.server.node().stats().rpc_channels, 1);
    assert_eq!(stays.call(ECHO, b"three"), Ok(b"three".to_vec()));
}
