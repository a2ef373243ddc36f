//! Sockets in the device model (memory-semantics §III-D): off, nothing
//! changes; a request that crosses the inter-socket link pays for each
//! crossing, at the requester and at the responder.

use std::cell::Cell;
use std::rc::Rc;

use dmkit_fabric::{Fabric, RemoteRef};
use dmkit_runtime::{Local, RuntimeConfig, Worker};
use dmkit_sim::{NumaLayout, PortRule, Profile, Sim, SimConfig};

/// Latency of one 8-byte READ of memory node `node` by a thread on
/// `socket` (ns of virtual time).
fn read_latency(numa: Option<NumaLayout>, socket: u32, node: u16) -> u64 {
    let mut sim = Sim::new(SimConfig {
        profile: Profile::builtin("cx3-40g").unwrap(),
        memory_nodes: 4,
        numa,
        ..SimConfig::default()
    })
    .unwrap();
    let f = sim.dyn_fabric();
    let (addr, _, rkey) = f.alloc_chunk(node, 4096, true).unwrap();
    let lat = Rc::new(Cell::new(0));
    let th = sim
        .add_worker_on(0, socket, |f: &dyn Fabric, clock| {
            Worker::builder(f)
                .clock(clock)
                .config(RuntimeConfig {
                    throttle: false,
                    conflict_avoid: false,
                    ..Default::default()
                })
                .local_bytes(64)
                .build()
        })
        .unwrap();
    let l = lat.clone();
    sim.worker_mut(th).spawn(move |ctx| async move {
        // Warm the translation cache, then measure.
        ctx.read_sync(RemoteRef::new(addr, rkey), Local::at(0, 8))
            .await
            .unwrap();
        let t0 = ctx.now();
        ctx.read_sync(RemoteRef::new(addr, rkey), Local::at(0, 8))
            .await
            .unwrap();
        l.set(ctx.now() - t0);
    });
    sim.run();
    lat.get()
}

#[test]
fn crossings_cost_what_the_model_says_and_nothing_when_off() {
    let cross = Profile::builtin("cx3-40g").unwrap().numa.cross_ns as u64;
    let testbed = |rule| NumaLayout {
        sockets: 2,
        ports: vec![1, 1],
        rule,
    };
    let off = read_latency(None, 0, 1);
    // Everything on socket 1 (the NIC's): as without sockets.
    let best = read_latency(Some(testbed(PortRule::First)), 1, 1);
    assert_eq!(best, off, "no crossing, no cost");
    // The thread on the other socket: doorbell, WQE fetch and completion
    // cross (3 × cross_ns).
    let alt_core = read_latency(Some(testbed(PortRule::First)), 0, 1);
    assert!(
        alt_core >= off + 3 * cross - 2 && alt_core <= off + 3 * cross + 2,
        "{off} → {alt_core}"
    );
    // The memory on the other socket of the responder: its DMA crosses.
    let alt_mem = read_latency(Some(testbed(PortRule::First)), 1, 0);
    assert!(
        alt_mem >= off + cross - 2 && alt_mem <= off + cross + 2,
        "{off} → {alt_mem}"
    );
    let worst = read_latency(Some(testbed(PortRule::First)), 0, 0);
    assert!(worst > alt_core && worst > alt_mem);
    // Two NICs, matched ports: a thread reaches its own socket's memory
    // without crossing, the other socket's across the remote link.
    let two = NumaLayout {
        sockets: 2,
        ports: vec![0, 1],
        rule: PortRule::Matched,
    };
    assert_eq!(read_latency(Some(two.clone()), 0, 0), off);
    assert_eq!(read_latency(Some(two.clone()), 1, 3), off);
    assert_eq!(read_latency(Some(two), 0, 1), alt_mem);
}

#[test]
fn a_bad_layout_is_refused() {
    let e = Sim::new(SimConfig {
        numa: Some(NumaLayout {
            sockets: 1,
            ports: vec![1],
            rule: PortRule::First,
        }),
        ..SimConfig::default()
    })
    .err()
    .unwrap();
    assert!(e.to_string().contains("NUMA layout"), "{e}");
}
