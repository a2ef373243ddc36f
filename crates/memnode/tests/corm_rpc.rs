//! CoRM's operations over the shm backend's RPC channel, served by the
//! node's worker threads, while compactions run underneath.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;

use dmkit_corm::sync;
use dmkit_fabric::shm::{ShmConfig, ShmFabric};
use dmkit_fabric::{Fabric, RpcChannel, RpcFailure};
use dmkit_memnode::corm::class::Strategy;
use dmkit_memnode::corm::service::{
    decode_fault, CormAnswer, CormFault, CormRequest, CormService, CORM,
};
use dmkit_memnode::corm::{Correction, ObjError, ObjPtr, Op, Policy, Reply, StoreConfig};
use dmkit_memnode::NodeConfig;

fn setup(workers: usize, correction: Correction) -> ShmFabric {
    let f = ShmFabric::embedded(
        ShmConfig {
            rpc_max_message: 8192,
            ..Default::default()
        },
        &[NodeConfig {
            size: 64 << 20,
            rpc_workers: workers,
            ..Default::default()
        }],
    )
    .unwrap();
    let node = f.embedded_node(0).unwrap();
    CormService::register(
        &node,
        StoreConfig {
            block_size: 4096,
            strategy: Strategy::Corm(16),
            correction,
            policy: Policy {
                threshold: None,
                ..Policy::default()
            },
            virtual_bytes: 16 << 20,
            seed: Some(7),
            ..StoreConfig::default()
        },
    )
    .unwrap();
    f
}

fn call(ch: &mut dyn RpcChannel, r: CormRequest) -> Result<CormAnswer, CormFault> {
    sync::call(ch, &r).map_err(|e| e.fault().expect("a refusal, not a transport failure"))
}

fn op(ch: &mut dyn RpcChannel, o: Op) -> Result<Reply, CormFault> {
    sync::op(ch, o).map_err(|e| e.fault().expect("a refusal, not a transport failure"))
}

fn value(tag: u64, len: usize) -> Vec<u8> {
    (0..len)
        .map(|i| (tag as usize * 31 + i * 7) as u8)
        .collect()
}

fn read(ch: &mut dyn RpcChannel, p: ObjPtr, len: usize) -> Result<Vec<u8>, CormFault> {
    match op(ch, Op::Read(p))? {
        Reply::Read { data, .. } => Ok(data[..len].to_vec()),
        other => panic!("{other:?}"),
    }
}

/// Writes and reads through RPC see every object's latest value while
/// another client compacts the store again and again; pointers held from
/// before the compactions keep working (pointer correction on the node),
/// with both correction strategies.
#[test]
fn rpc_reads_and_writes_stay_exact_while_compaction_runs() {
    for correction in [Correction::Scan, Correction::Message] {
        let f = setup(2, correction);
        let mut ch = f.connect_rpc(0).unwrap();
        let len = 200usize;
        let mut live = Vec::new();
        for i in 0..600u64 {
            let Reply::Allocated(p) = op(&mut *ch, Op::Alloc(len as u32)).unwrap() else {
                panic!()
            };
            op(&mut *ch, Op::Write(p, value(i, len))).unwrap();
            live.push((p, i));
        }
        // Fragment: free four of five.
        let mut kept = Vec::new();
        for (k, (p, i)) in live.into_iter().enumerate() {
            if k % 5 == 0 {
                kept.push((p, i));
            } else {
                assert_eq!(op(&mut *ch, Op::Free(p)), Ok(Reply::Freed));
            }
        }
        let stop = Arc::new(AtomicBool::new(false));
        let rounds = Arc::new(AtomicU64::new(0));
        let moved = Arc::new(AtomicU64::new(0));
        std::thread::scope(|s| {
            let (f, stop2, rounds, moved) = (&f, stop.clone(), rounds.clone(), moved.clone());
            s.spawn(move || {
                let stop = stop2;
                let mut c = f.connect_rpc(0).unwrap();
                while !stop.load(Ordering::Relaxed) || rounds.load(Ordering::Relaxed) < 3 {
                    match op(&mut *c, Op::Compact(None)).unwrap() {
                        Reply::Compacted(r) => {
                            moved.fetch_add(r.objects_moved + r.blocks_freed, Ordering::Relaxed);
                        }
                        other => panic!("{other:?}"),
                    }
                    rounds.fetch_add(1, Ordering::Relaxed);
                }
            });
            for round in 0..4u64 {
                for (k, (p, tag)) in kept.iter_mut().enumerate() {
                    assert_eq!(
                        read(&mut *ch, *p, len).unwrap(),
                        value(*tag, len),
                        "{correction:?}: object {k} in round {round}"
                    );
                    *tag += 1000;
                    match op(&mut *ch, Op::Write(*p, value(*tag, len))).unwrap() {
                        Reply::Written(_) => {}
                        other => panic!("{other:?}"),
                    }
                }
            }
            stop.store(true, Ordering::Relaxed);
        });
        assert!(rounds.load(Ordering::Relaxed) >= 3);
        assert!(
            moved.load(Ordering::Relaxed) > 0,
            "{correction:?}: compaction freed blocks or moved objects"
        );
        for (p, tag) in &kept {
            assert_eq!(read(&mut *ch, *p, len).unwrap(), value(*tag, len));
        }
        let CormAnswer::Stats(st) = call(&mut *ch, CormRequest::Stats).unwrap() else {
            panic!()
        };
        assert_eq!(st.live_objects, kept.len() as u64, "{st:?}");
        let node = f.embedded_node(0).unwrap();
        assert!(node.stats().corm.is_some());
        node.handle(node.open_session(), dmkit_memnode::Request::Shutdown);
    }
}

/// Client mistakes are typed errors and leave the store serving.
#[test]
fn client_mistakes_are_typed_errors() {
    let f = setup(2, Correction::Scan);
    let mut ch = f.connect_rpc(0).unwrap();
    let Reply::Allocated(p) = op(&mut *ch, Op::Alloc(100)).unwrap() else {
        panic!()
    };
    let Reply::Allocated(q) = op(&mut *ch, Op::Alloc(100)).unwrap() else {
        panic!()
    };
    assert_eq!(op(&mut *ch, Op::Free(p)), Ok(Reply::Freed));
    // Double free and use after free.
    assert!(matches!(
        op(&mut *ch, Op::Free(p)),
        Err(CormFault::Obj(ObjError::Freed | ObjError::Stale))
    ));
    assert!(matches!(
        op(&mut *ch, Op::Read(p)),
        Err(CormFault::Obj(ObjError::Freed | ObjError::Stale))
    ));
    // A pointer of another size class.
    let wrong = ObjPtr::new(
        q.node(),
        q.offset(),
        q.rkey(),
        q.id(),
        q.class() + 1,
        q.gen(),
    );
    assert!(matches!(
        op(&mut *ch, Op::Read(wrong)),
        Err(CormFault::Obj(
            ObjError::WrongClass { .. } | ObjError::Forged(_)
        ))
    ));
    // Garbage bytes.
    match ch.call(CORM, b"\xff\xff\xff") {
        Err(RpcFailure::Service(e)) => {
            assert!(matches!(decode_fault(&e), Ok(CormFault::BadRequest(_))))
        }
        other => panic!("{other:?}"),
    }
    assert!(matches!(
        op(&mut *ch, Op::Alloc(0)),
        Err(CormFault::Obj(ObjError::ZeroSize))
    ));
    // Still serving.
    op(&mut *ch, Op::Write(q, value(1, 100))).unwrap();
    assert_eq!(read(&mut *ch, q, 100).unwrap(), value(1, 100));
    let CormAnswer::Info(info) = call(&mut *ch, CormRequest::Info).unwrap() else {
        panic!()
    };
    assert_eq!(info.block_size, 4096);
    assert_eq!(info.rkey, q.rkey());
    let node = f.embedded_node(0).unwrap();
    node.handle(node.open_session(), dmkit_memnode::Request::Shutdown);
}

/// The node holds the CoRM service, the store holds its node weakly: once
/// the fabric (the last outside handle) is gone, the node is dropped —
/// its workers stopped, its memory unmapped — store and all.
#[test]
fn a_node_serving_corm_is_dropped_with_its_last_handle() {
    let f = setup(2, Correction::Scan);
    let node = Arc::downgrade(&f.embedded_node(0).unwrap());
    let mut ch = f.connect_rpc(0).unwrap();
    let Reply::Allocated(p) = op(&mut *ch, Op::Alloc(64)).unwrap() else {
        panic!()
    };
    op(&mut *ch, Op::Write(p, value(1, 64))).unwrap();
    assert_eq!(read(&mut *ch, p, 64).unwrap(), value(1, 64));
    assert!(node.upgrade().is_some_and(|n| n.stats().corm.is_some()));
    drop(ch);
    drop(f);
    // The workers drop their state on their own threads: give them a
    // moment to notice.
    let t0 = std::time::Instant::now();
    while node.strong_count() > 0 {
        assert!(
            t0.elapsed() < std::time::Duration::from_secs(10),
            "the node outlived its last handle ({} strong references)",
            node.strong_count()
        );
        std::thread::sleep(std::time::Duration::from_millis(5));
    }
}
