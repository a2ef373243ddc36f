//! The switch position's reordering (Fig. 2 of SwordBox: a few requests
//! delayed after the switch) delays those requests and the ones that must
//! wait for them, never everyone else: a late response must not hold the
//! memory node's uplink for the responses met after it — including the
//! response of a request that waited for a late one (the second READ of a
//! doorbell batch whose first was delayed).

use std::cell::Cell;
use std::rc::Rc;

use dmkit_fabric::RemoteRef;
use dmkit_runtime::Local;
use dmkit_sim::{Profile, Sim, SimConfig, SwitchMode, SwitchModel};
use dmkit_switch::SwitchConfig;

mod common;
use common::{small, unthrottled};

/// Batches of two READs (a 128-byte one and an 8-byte one, one doorbell)
/// completed in 200 µs of virtual time by 64 closed-loop clients on two
/// machines, with a steering-off P4 switch in front of the node (delaying
/// `reorder` of the requests by up to 13 µs) or none.
fn batches(switch: Option<f64>) -> u64 {
    let switch = switch.map(|reorder| SwitchModel {
        reorder,
        ..SwitchModel::new(SwitchMode::P4, SwitchConfig::default())
    });
    let mut sim = Sim::new(SimConfig {
        profile: Profile::builtin("cx5-100g").unwrap(),
        compute_machines: 2,
        memory_nodes: 1,
        seed: 7,
        switch,
        ..small()
    })
    .unwrap();
    let f = sim.dyn_fabric();
    let (a, _, k) = f.alloc_chunk(0, 1 << 20, true).unwrap();
    let wcfg = unthrottled();
    let done = Rc::new(Cell::new(0u64));
    let (warm, end) = (50_000u64, 250_000u64);
    for t in 0..64usize {
        let wcfg = wcfg.clone();
        let th = common::add_worker(&mut sim, t % 2, t, 1, wcfg);
        let done = done.clone();
        sim.worker_mut(th).spawn(move |ctx| async move {
            let mut i = t as u64;
            while ctx.now() < end {
                let at = a.add((i % 4096) * 192);
                ctx.read(RemoteRef::new(at, k), Local::at(0, 128));
                ctx.read(RemoteRef::new(at.add(128), k), Local::at(128, 8));
                ctx.sync().await.unwrap();
                i += 64;
                if (warm..end).contains(&ctx.now()) {
                    done.set(done.get() + 1);
                }
            }
        });
    }
    sim.run();
    done.get()
}

#[test]
fn a_late_request_delays_only_itself_and_those_waiting_for_it() {
    let none = batches(None);
    let ordered = batches(Some(0.0));
    let reordered = batches(Some(0.03));
    assert!(none > 1000, "{none} batches");
    // A switch that delays nothing changes nothing measurable.
    assert!(
        ordered as f64 > 0.98 * none as f64,
        "no reordering: {ordered} batches, without a switch {none}"
    );
    // 3 % of requests delayed, about 6 % of the batches: their clients
    // lose time, nobody else does.
    assert!(
        reordered as f64 > 0.8 * none as f64,
        "3 % reordered: {reordered} batches, without a switch {none}"
    );
}
