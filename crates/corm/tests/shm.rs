//! The client over the shm backend: RPC calls and one-sided reads from a
//! runtime task while another client compacts the store underneath.

use std::cell::RefCell;
use std::rc::Rc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;

use dmkit_corm::{CormClient, CormError};
use dmkit_fabric::shm::{ShmConfig, ShmFabric};
use dmkit_fabric::Fabric;
use dmkit_memnode::corm::class::Strategy;
use dmkit_memnode::corm::service::{encode_request, CormRequest, CormService, CORM};
use dmkit_memnode::corm::{Correction, ObjError, Op, Policy, StoreConfig};
use dmkit_memnode::NodeConfig;
use dmkit_runtime::{Local, MonotonicClock, Worker};

const BS: usize = 4096;

fn setup() -> Arc<ShmFabric> {
    let f = ShmFabric::embedded(
        ShmConfig {
            rpc_max_message: 8192,
            ..Default::default()
        },
        &[NodeConfig {
            size: 64 << 20,
            rpc_workers: 2,
            ..Default::default()
        }],
    )
    .unwrap();
    CormService::register(
        &f.embedded_node(0).unwrap(),
        StoreConfig {
            block_size: BS as u64,
            strategy: Strategy::Corm(16),
            correction: Correction::Scan,
            policy: Policy {
                threshold: None,
                ..Policy::default()
            },
            virtual_bytes: 16 << 20,
            seed: Some(11),
            ..StoreConfig::default()
        },
    )
    .unwrap();
    Arc::new(f)
}

fn value(tag: u64, len: usize) -> Vec<u8> {
    (0..len)
        .map(|i| (tag as usize * 29 + i * 5) as u8)
        .collect()
}

fn worker(f: &ShmFabric) -> Worker {
    Worker::builder(f)
        .clock(Arc::new(MonotonicClock))
        .tasks(1)
        .local_bytes(2 * BS)
        .build()
        .unwrap()
}

/// Direct reads return the latest value or say the object moved; scan
/// reads always return it and correct the pointer, after which direct
/// reads succeed again — with compactions running the whole time.
#[test]
fn one_sided_reads_across_repeated_compaction() {
    let f = setup();
    let stop = Arc::new(AtomicBool::new(false));
    let rounds = Arc::new(AtomicU64::new(0));
    let compactor = {
        let (f, stop, rounds) = (f.clone(), stop.clone(), rounds.clone());
        std::thread::spawn(move || {
            let mut ch = f.connect_rpc(0).unwrap();
            while !stop.load(Ordering::Relaxed) {
                ch.call(CORM, &encode_request(&CormRequest::Op(Op::Compact(None))))
                    .unwrap();
                rounds.fetch_add(1, Ordering::Relaxed);
            }
        })
    };
    let moved_seen = Rc::new(RefCell::new(0u64));
    let mut w = worker(&f);
    let m = moved_seen.clone();
    let r = rounds.clone();
    w.spawn(move |ctx| async move {
        let c = CormClient::connect(&ctx, 0).await.unwrap();
        let len = 120usize;
        let mut objs = Vec::new();
        for i in 0..800u64 {
            let mut p = c.alloc(&ctx, len as u32).await.unwrap();
            c.write(&ctx, &mut p, &value(i, len)).await.unwrap();
            objs.push((p, i));
        }
        let mut kept = Vec::new();
        for (k, (p, i)) in objs.into_iter().enumerate() {
            if k % 4 == 0 {
                kept.push((p, i));
            } else {
                c.free(&ctx, p).await.unwrap();
            }
        }
        let buf = Local::at(0, BS);
        let start = r.load(Ordering::Relaxed);
        let mut pass = 0u64;
        while pass < 3 || r.load(Ordering::Relaxed) < start + 3 {
            for (p, tag) in kept.iter_mut() {
                match c.direct_read(&ctx, *p, buf).await {
                    Ok(v) => assert_eq!(&v[..len], &value(*tag, len)[..]),
                    Err(CormError::Moved) => *m.borrow_mut() += 1,
                    Err(e) => panic!("direct read: {e}"),
                }
                let v = c.scan_read(&ctx, p, buf).await.unwrap();
                assert_eq!(&v[..len], &value(*tag, len)[..]);
                *tag += 1;
                c.write(&ctx, p, &value(*tag, len)).await.unwrap();
            }
            pass += 1;
        }
        let st = c.stats(&ctx).await.unwrap();
        assert_eq!(st.live_objects, kept.len() as u64);
    });
    w.run();
    stop.store(true, Ordering::Relaxed);
    compactor.join().unwrap();
    assert!(rounds.load(Ordering::Relaxed) >= 3);
    eprintln!(
        "direct reads that found a moved object: {}",
        moved_seen.borrow()
    );
}

/// Freed, double-freed, wrong-class and released pointers are typed
/// errors; the store keeps serving.
#[test]
fn pointer_mistakes_are_typed_errors() {
    let f = setup();
    let mut w = worker(&f);
    w.spawn(move |ctx| async move {
        let c = CormClient::connect(&ctx, 0).await.unwrap();
        let p = c.alloc(&ctx, 64).await.unwrap();
        let mut q = c.alloc(&ctx, 64).await.unwrap();
        c.free(&ctx, p).await.unwrap();
        assert!(matches!(
            c.free(&ctx, p).await,
            Err(CormError::Store(ObjError::Freed | ObjError::Stale))
        ));
        let mut pp = p;
        assert!(matches!(
            c.read(&ctx, &mut pp).await,
            Err(CormError::Store(ObjError::Freed | ObjError::Stale))
        ));
        // A one-sided read of the freed object finds no such object there.
        assert!(matches!(
            c.direct_read(&ctx, p, Local::at(0, BS)).await,
            Err(CormError::Moved)
        ));
        let wrong = dmkit_memnode::corm::ObjPtr::new(
            q.node(),
            q.offset(),
            q.rkey(),
            q.id(),
            q.class() + 1,
            q.gen(),
        );
        let mut wr = wrong;
        assert!(matches!(
            c.read(&ctx, &mut wr).await,
            Err(CormError::Store(
                ObjError::WrongClass { .. } | ObjError::Forged(_)
            ))
        ));
        c.write(&ctx, &mut q, b"kept").await.unwrap();
        let r = c.release_ptr(&ctx, q).await.unwrap();
        let mut old = q;
        match c.read(&ctx, &mut old).await {
            // A pointer that never moved stays valid after release; one
            // that moved is refused.
            Ok(v) => assert_eq!(&v[..4], b"kept"),
            Err(e) => assert!(matches!(e, CormError::Store(ObjError::Released)), "{e}"),
        }
        let mut r2 = r;
        assert_eq!(&c.read(&ctx, &mut r2).await.unwrap()[..4], b"kept");
        assert!(matches!(
            c.alloc(&ctx, 0).await,
            Err(CormError::Store(ObjError::ZeroSize))
        ));
    });
    w.run();
}

/// A one-sided reader waits out a lock held far longer than a thousand
/// back-to-back READs take (a node thread descheduled on a loaded host, a
/// compaction remapping pages), and says `Busy` only after its patience.
#[test]
fn a_reader_waits_out_a_long_lock_and_then_gives_up_typed() {
    use dmkit_fabric::{GlobalAddr, RemoteRef};
    use dmkit_memnode::corm::layout::LOCK_WRITE;
    use dmkit_memnode::layout::access;
    use std::time::{Duration, Instant};

    let f = setup();
    let mut w = Worker::builder(&*f)
        .clock(Arc::new(MonotonicClock))
        .tasks(2)
        .local_bytes(2 * BS)
        .build()
        .unwrap();
    // 0 nothing yet; 1 locked for 50 ms; 2 the reader got it; 3 locked for good.
    let stage = Rc::new(RefCell::new((0u32, None)));
    let st = stage.clone();
    let node = f.embedded_node(0).unwrap();
    w.spawn(move |ctx| async move {
        let c = CormClient::connect(&ctx, 0).await.unwrap();
        let mut p = c.alloc(&ctx, 64).await.unwrap();
        c.write(&ctx, &mut p, &value(7, 64)).await.unwrap();
        // The store's key allows READs only; the test holds the lock as a
        // node thread would, through a key of its own for that page.
        let page = node.layout().page_size();
        let base = p.offset() / page * page;
        let key = node.register_region(base, page, access::ALL).unwrap().rkey;
        let hdr = RemoteRef::new(GlobalAddr::new(p.node(), p.offset()), key);
        let buf = Local::at(0, 8);
        ctx.read_sync(hdr, buf).await.unwrap();
        let h = ctx.local_u64(buf);
        assert_eq!(h & LOCK_WRITE, 0);
        assert_eq!(ctx.cas_sync(hdr, h, h | LOCK_WRITE).await.unwrap(), h);
        *st.borrow_mut() = (1, Some(p));
        // Held 50 ms: far beyond a thousand READs on shm.
        ctx.sleep(50_000_000).await;
        assert_eq!(
            ctx.cas_sync(hdr, h | LOCK_WRITE, h).await.unwrap(),
            h | LOCK_WRITE
        );
        while st.borrow().0 != 2 {
            ctx.sleep(1_000_000).await;
        }
        assert_eq!(ctx.cas_sync(hdr, h, h | LOCK_WRITE).await.unwrap(), h);
        st.borrow_mut().0 = 3;
    });
    w.spawn(move |ctx| async move {
        let c = CormClient::connect(&ctx, 0).await.unwrap();
        while stage.borrow().0 != 1 {
            ctx.sleep(1_000_000).await;
        }
        let p = stage.borrow().1.expect("allocated");
        let t = Instant::now();
        let v = c.direct_read(&ctx, p, Local::at(BS, BS)).await.unwrap();
        assert_eq!(&v[..64], &value(7, 64)[..]);
        assert!(
            t.elapsed() >= Duration::from_millis(20),
            "{:?}",
            t.elapsed()
        );
        stage.borrow_mut().0 = 2;
        while stage.borrow().0 != 3 {
            ctx.sleep(1_000_000).await;
        }
        // Locked for good: a typed Busy after the patience, not a hang.
        let t = Instant::now();
        match c.direct_read(&ctx, p, Local::at(BS, BS)).await {
            Err(CormError::Busy(n)) => assert!(n > dmkit_corm::MAX_READ_RETRIES, "{n}"),
            other => panic!("expected Busy, got {other:?}"),
        }
        assert!(t.elapsed() >= Duration::from_secs(2), "{:?}", t.elapsed());
    });
    w.run();
}
