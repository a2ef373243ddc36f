//! The proxy-socket path (memory-semantics §III-D): requests handed to a
//! proxy task on another thread come back with the verbs' results.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use dmkit_fabric::shm::{ShmConfig, ShmFabric};
use dmkit_fabric::{ControlPlane, Fabric, RemoteRef};
use dmkit_runtime::numa::{ProxyOp, ProxyQueue, ProxyReply, Topology};
use dmkit_runtime::{Local, RuntimeConfig, Worker};

#[test]
fn a_proxy_serves_reads_writes_and_atomics_for_another_thread() {
    let f = Arc::new(ShmFabric::one_node(ShmConfig::default(), 4 << 20).unwrap());
    let (addr, _, rkey) = f.alloc_chunk(0, 4096, false).unwrap();
    let r = RemoteRef::new(addr, rkey);
    let q = ProxyQueue::new(0, 200);
    let stop = Arc::new(AtomicBool::new(false));
    let cfg = RuntimeConfig {
        throttle: false,
        conflict_avoid: false,
        ..Default::default()
    };
    std::thread::scope(|s| {
        let (f2, q2, stop2, cfg2) = (f.clone(), q.clone(), stop.clone(), cfg.clone());
        let proxy = s.spawn(move || {
            let mut w = Worker::builder(f2.as_ref() as &dyn Fabric)
                .config(cfg2)
                .local_bytes(4096)
                .build()
                .unwrap();
            let served = Arc::new(std::sync::atomic::AtomicU64::new(0));
            let sv = served.clone();
            w.spawn(move |ctx| async move {
                let n = q2
                    .serve(&ctx, Local::at(0, 4096), || stop2.load(Ordering::Relaxed))
                    .await;
                sv.store(n, Ordering::Relaxed);
            });
            w.run();
            served.load(Ordering::Relaxed)
        });
        let mut w = Worker::builder(f.as_ref() as &dyn Fabric)
            .config(cfg)
            .tasks(4)
            .build()
            .unwrap();
        for k in 0..4u64 {
            let q = q.clone();
            w.spawn(move |ctx| async move {
                let at = r.add(64 * k);
                let data = vec![k as u8 + 1; 24];
                let w = q
                    .call(
                        &ctx,
                        ProxyOp::Write {
                            dst: at,
                            data: data.clone(),
                        },
                    )
                    .await
                    .unwrap();
                assert_eq!(w, ProxyReply::Done);
                let back = q
                    .call(&ctx, ProxyOp::Read { src: at, len: 24 })
                    .await
                    .unwrap();
                assert_eq!(back, ProxyReply::Data(data));
                for _ in 0..10 {
                    q.call(
                        &ctx,
                        ProxyOp::Faa {
                            at: r.add(1024),
                            add: 1,
                        },
                    )
                    .await
                    .unwrap();
                }
                let old = q
                    .call(
                        &ctx,
                        ProxyOp::Cas {
                            at: r.add(2048 + 8 * k),
                            expected: 0,
                            desired: 7,
                        },
                    )
                    .await
                    .unwrap();
                assert_eq!(old, ProxyReply::Value(0));
            });
        }
        w.run();
        stop.store(true, Ordering::Relaxed);
        assert_eq!(proxy.join().unwrap(), 4 * (2 + 10 + 1));
    });
    let mut qp = dmkit_fabric::SyncQp::new(f.as_ref(), 0, 4096).unwrap();
    let c = qp.read(r.add(1024).addr, rkey, 8).unwrap();
    assert_eq!(
        u64::from_le_bytes(c.try_into().unwrap()),
        40,
        "every FAA went through"
    );
    assert!(q.is_empty());
}

#[test]
fn this_host_says_whether_the_proxy_is_on() {
    let t = Topology::detect();
    match t.proxy_reason() {
        Some(why) => assert!(t.single_socket() && why.contains("single-socket host")),
        None => assert!(t.sockets.len() > 1),
    }
}
