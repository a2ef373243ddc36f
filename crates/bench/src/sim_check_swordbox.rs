//! `dmkit sim check` scenarios of SwordBox (NSDI'24 submission) and
//! Clover (ATC'20), on the ConnectX-5 profile of SwordBox's testbed, one
//! memory node of its own behind the switch.
//!
//! - `clover` — Clover's store under the recorded stress workload (hot
//!   keys, fill inserts, deletes) with its metadata server reclaiming
//!   versions on a virtual thread (2 ms grace), under the consistency
//!   faults and skewed clocks. The seed's residue picks the switch: none
//!   or steering off (0 mod 3), write steering (1), read and write
//!   steering (2); the next digit its failure: none, packets lost between
//!   switch and server (retransmitted 30–100 µs later), or restarts every
//!   100–400 µs (never both: a restart while a lost append awaits its
//!   retransmission is the double failure SwordBox defers, §4.5). Checks:
//!   the history is linearizable and agrees with the final state; the
//!   chain checker passes with every linked version reachable or cut by
//!   the metadata server; no prediction of the switch failed.
//! - `swordbox-locks` — the B+tree (HOCL, cache, speculation, node size
//!   drawn from the seed) with its lock CASes turned into WRITEs by the
//!   DPDK switch, every request to the node multiplexed onto one
//!   connection per node (the order Sherman's write-back-then-unlock
//!   needs; [`dmkit_switch::Mux::Node`]), with losses (go-back-N on the
//!   shared connection) or restarts. Checks: linearizability, the tree's
//!   structural checker (mutual exclusion broken shows as a lost or torn
//!   update), and that every replaced CAS found the lock word the switch
//!   had cached.

use std::cell::RefCell;
use std::rc::Rc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use dmkit_btree::{Btree, BtreeConfig};
use dmkit_clover::{check_chains, CloverConfig, CloverKv, MdsConfig};
use dmkit_fabric::Fabric;
use dmkit_index::conformance::stress::{self, StressRecord};
use dmkit_index::{IndexError, RemoteMap};
use dmkit_lincheck::{MapOp, MapRet};
use dmkit_runtime::{RuntimeConfig, Worker};
use dmkit_sim::{Profile, Sim, SimConfig, SwitchMode, SwitchModel};
use dmkit_switch::{Mux, Steer, SwitchConfig};

use crate::rng::Rng;
use crate::sim_check::{clock_skew_of, in_virtual_time, stress_shape, Passed, MACHINES};

/// The grace period of the clover scenario's store (ns).
pub const CLOVER_GRACE: u64 = 2_000_000;

/// The failure a seed injects at the switch.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum SwitchFault {
    None,
    Loss,
    Restart,
}

fn switch_fault(seed: u64) -> SwitchFault {
    [SwitchFault::None, SwitchFault::Loss, SwitchFault::Restart][(seed / 3 % 3) as usize]
}

/// The switch of a seed: its mode and policy, and the failure drawn.
fn switch_model(mode: SwitchMode, policy: SwitchConfig, seed: u64, r: &mut Rng) -> SwitchModel {
    let mut m = SwitchModel::new(mode, policy);
    match switch_fault(seed) {
        SwitchFault::None => {}
        SwitchFault::Loss => {
            m.loss = 0.002 + r.below(20) as f64 / 1000.0;
            m.rto_ns = 30_000 + r.below(70_001);
        }
        SwitchFault::Restart => {
            m.restart_every_ns = 100_000 + r.below(300_001);
            // Longer than any request spends between switch and execution
            // (the delay fault's 20 µs, reordering's 13 µs, the links).
            m.policy.quiet = 50_000;
        }
    }
    m
}

fn sim_with(
    seed: u64,
    r: &mut Rng,
    bound: u64,
    switch: Option<SwitchModel>,
) -> Result<Sim, String> {
    Sim::new(SimConfig {
        profile: Profile::builtin("cx5-100g").map_err(|e| e.to_string())?,
        compute_machines: MACHINES,
        memory_nodes: 1,
        memory_bytes: 96 << 20,
        page_size: 4096,
        seed,
        faults: clock_skew_of(seed, bound),
        in_order_write: r.below(2) == 0,
        switch,
        ..SimConfig::default()
    })
    .map_err(|e| e.to_string())
}

/// Versions linked according to a history.
fn linked_in(h: &[StressRecord]) -> u64 {
    h.iter()
        .filter(|r| {
            !matches!(r.op, MapOp::Search) && matches!(r.returned, Some((_, MapRet::Done(true))))
        })
        .count() as u64
}

/// The `clover` scenario.
pub fn clover(seed: u64) -> Result<Passed, String> {
    let mut r = Rng::new(seed);
    let cfg = CloverConfig {
        max_key: 32,
        max_value: 32,
        dir_slots: 1 << 12,
        pool_slots: 1 << 10,
        cache_entries: [0, 64, 4096][r.below(3) as usize],
        grace: CLOVER_GRACE,
        chunk_bytes: 64 << 10,
        alloc_batch: 8,
        chase_limit: r.below(4) as u32,
        shortcut: r.below(4) != 0,
        // From the seed (the generator's draws stay as they were): half
        // the seeds of each steering mode read the shortcut with a walk's
        // first READ.
        shortcut_first: (seed / 3).is_multiple_of(2),
        gc: false,
        mds: MdsConfig {
            period: 100_000 + r.below(400_000),
            ..MdsConfig::default()
        },
        seed,
        ..CloverConfig::default()
    };
    let steer = [Steer::Off, Steer::Write, Steer::ReadWrite][(seed % 3) as usize];
    let switch = (steer != Steer::Off || r.below(2) == 0).then(|| {
        let policy = SwitchConfig {
            steer,
            clover_read_len: cfg.read_bytes() as u32,
            addr_slots: 64 << r.below(6),
            ..SwitchConfig::default()
        };
        switch_model(SwitchMode::P4, policy, seed, &mut r)
    });
    let with_switch = switch.clone();
    // A quarter of the seeds run without reclamation.
    let gc = r.below(4) != 0;
    let note = format!(
        "switch {}, gc {gc}, cache {}, chase limit {}, shortcut {} (first {})",
        match &with_switch {
            None => "none".to_string(),
            Some(s) => format!("{} ({:?})", s.policy.steer, switch_fault(seed)),
        },
        cfg.cache_entries,
        cfg.chase_limit,
        cfg.shortcut,
        cfg.shortcut_first
    );
    clover_run(seed, &mut r, cfg, with_switch, gc).map_err(|e| {
        format!(
            "{e}
({note})"
        )
    })
}

fn clover_run(
    seed: u64,
    r: &mut Rng,
    cfg: CloverConfig,
    switch: Option<SwitchModel>,
    gc: bool,
) -> Result<Passed, String> {
    let with_switch = switch.clone();
    let mut sim = sim_with(seed, r, crate::sim_check::skew_bound("clover"), switch)?;
    let f = sim.dyn_fabric();
    let kv = CloverKv::create(f.clone(), "check", cfg.clone()).map_err(|e| e.to_string())?;
    let sc = stress_shape(r, seed);
    // The metadata server, on a virtual thread of machine 0.
    let stop = Arc::new(AtomicBool::new(false));
    let mds = kv.mds();
    let layout = mds.local_layout().clone();
    let th = sim
        .add_worker(0, |f: &dyn Fabric, clock| {
            Worker::builder(f)
                .clock(clock)
                .id(777)
                .tasks(1)
                .local(&layout)
                .build()
        })
        .map_err(|e| e.to_string())?;
    if gc {
        mds.spawn(sim.worker_mut(th), stop.clone())
            .map_err(|e| e.to_string())?;
    }
    // The workload.
    let out: Rc<RefCell<Vec<StressRecord>>> = Rc::default();
    let failed: Rc<RefCell<Option<IndexError>>> = Rc::default();
    let rcfg = RuntimeConfig {
        op_stats: false,
        ..RuntimeConfig::default()
    };
    let mut workers = Vec::new();
    for wi in 0..sc.workers {
        let th = sim
            .add_worker(wi % MACHINES, |f: &dyn Fabric, clock| {
                Worker::builder(f)
                    .clock(clock)
                    .config(rcfg.clone())
                    .id(wi)
                    .tasks(sc.tasks)
                    .local(kv.local_layout())
                    .build()
            })
            .map_err(|e| e.to_string())?;
        let c = kv.client_on(wi % MACHINES, stress::client_id(&sc, wi));
        stress::spawn_tasks(sim.worker_mut(th), &c, &sc, wi, &out, &failed);
        workers.push(th);
    }
    let mut rounds = 0;
    while workers.iter().any(|&w| sim.worker_mut(w).live_tasks() > 0) {
        let o = sim.run_until(sim.now() + 200_000);
        rounds += 1;
        if rounds > 50_000 || (o.blocked > 0 && o.finished + o.blocked == sim.thread_count()) {
            return Err("the workload did not finish".into());
        }
    }
    let end = sim.now();
    stop.store(true, Ordering::Release);
    sim.run();
    if let Some(e) = failed.borrow_mut().take() {
        return Err(format!("an operation failed: {e}"));
    }
    // The final state, read by a fresh client.
    type Finals =
        Result<(Vec<StressRecord>, std::collections::HashMap<String, String>), IndexError>;
    let finals: Rc<RefCell<Option<Finals>>> = Rc::default();
    let th = sim
        .add_worker(0, |f: &dyn Fabric, clock| {
            Worker::builder(f)
                .clock(clock)
                .config(rcfg.clone())
                .id(999)
                .tasks(1)
                .local(kv.local_layout())
                .build()
        })
        .map_err(|e| e.to_string())?;
    let (c, fin, hot) = (kv.client(99_999), finals.clone(), sc.hot_keys);
    sim.worker_mut(th).spawn(move |ctx| async move {
        *fin.borrow_mut() = Some(stress::final_reads(&ctx, &c, hot).await);
    });
    sim.run();
    let (fin, scan) = finals
        .borrow_mut()
        .take()
        .ok_or("the final reads did not finish")?
        .map_err(|e| e.to_string())?;
    let worker_machine =
        |client: u32| (client as usize - sc.client_base as usize) / sc.tasks % MACHINES;
    let h = in_virtual_time(&sim, out.borrow().clone(), worker_machine);
    let linked = linked_in(&h);
    let ops = h.len() as u64;
    let fin = in_virtual_time(&sim, fin, |_| 0);
    stress::verify(h, fin, &scan)?;
    let rep = check_chains(&kv, Some(linked)).map_err(|e| format!("chains: {e}"))?;
    let sw = sim.switch_stats();
    if let Some(s) = sw {
        if s.policy.mispredictions > 0 {
            return Err(format!(
                "{} predicted appends failed",
                s.policy.mispredictions
            ));
        }
    }
    let m = kv.mds_stats();
    let st = sim.stats();
    Ok(Passed {
        ops,
        virtual_ns: end,
        torn: st.torn,
        delayed: st.delayed,
        shape: format!(
            "{} threads × {} tasks × {} ops, {} hot keys, {} % fills; switch {}; {} keys, {} versions on chains, {} cut, {} freed{}",
            sc.workers,
            sc.tasks,
            sc.ops_per_task,
            sc.hot_keys,
            sc.fill_percent,
            match &with_switch {
                None => "none".to_string(),
                Some(s) => format!("{} ({:?})", s.policy.steer, switch_fault(seed)),
            },
            rep.keys,
            rep.versions,
            m.cut,
            m.freed,
            sw.map(|s| format!(
                "; {} predicted, {} reads steered, {} learnt, {} lost, {} restarts",
                s.policy.predicted, s.policy.steered_reads, s.policy.learned, s.lost, s.policy.restarts
            ))
            .unwrap_or_default()
        ),
    })
}

/// The `swordbox-locks` scenario.
pub fn locks(seed: u64) -> Result<Passed, String> {
    let mut r = Rng::new(seed);
    let cfg = BtreeConfig {
        max_key: 32,
        max_value: 32,
        node_bytes: [384, 512, 1024][r.below(3) as usize],
        cache_bytes: if r.below(3) == 0 { 0 } else { 1 << 20 },
        speculative: r.below(3) != 0,
        hocl: r.below(3) != 0,
        max_handover: r.below(5) as u32,
        on_chip_locks: r.below(2) == 0,
        combine: r.below(2) == 0,
        chunk_bytes: 256 << 10,
        ..BtreeConfig::default()
    };
    let policy = SwitchConfig {
        mux: Mux::Node,
        cas_to_write: true,
        ..SwitchConfig::default()
    };
    let model = switch_model(SwitchMode::Dpdk, policy, seed, &mut r);
    let fault = switch_fault(seed);
    let mut sim = sim_with(
        seed,
        &mut r,
        crate::sim_check::skew_bound("swordbox-locks"),
        Some(model),
    )?;
    let f = sim.dyn_fabric();
    let sc = stress_shape(&mut r, seed);
    let tree = Btree::create(f.clone(), "check", cfg.clone()).map_err(|e| e.to_string())?;
    let ranges: Vec<(u64, u64)> = tree
        .lock_tables()
        .into_iter()
        .map(|(a, b)| (a.raw(), b.raw()))
        .collect();
    sim.with_switch(|s| s.set_lock_ranges(ranges));
    let run = crate::sim_check::stress_on_sim(
        &mut sim,
        tree.local_layout(),
        &|id| tree.client_on((id % 2) as usize, id),
        &sc,
        None,
    );
    let rep = dmkit_btree::check_tree(&tree).map_err(|e| format!("structure: {e}"))?;
    let run = run.map_err(|e| format!("{e}\n(config {cfg:?}, switch fault {fault:?})"))?;
    let (ops, now) = (run.ops, run.now);
    let sw = sim.switch_stats().expect("the scenario has a switch");
    if sw.cas_to_write_mismatches > 0 {
        return Err(format!(
            "{} CASes were replaced by WRITEs of a lock word the switch had wrong",
            sw.cas_to_write_mismatches
        ));
    }
    if sw.policy.cas_to_write == 0 {
        return Err("no lock CAS went through the switch as a WRITE".into());
    }
    let s = sim.stats();
    Ok(Passed {
        ops,
        virtual_ns: now,
        torn: s.torn,
        delayed: s.delayed,
        shape: format!(
            "{} threads × {} tasks × {} ops, {} hot keys, nodes {} B, hocl {}, combine {}, {} entries; switch {fault:?}: {} CAS→WRITE, {} lost, {} restarts",
            sc.workers,
            sc.tasks,
            sc.ops_per_task,
            sc.hot_keys,
            cfg.node_bytes,
            cfg.hocl,
            cfg.combine,
            rep.entries,
            sw.policy.cas_to_write,
            sw.lost,
            sw.policy.restarts
        ),
    })
}
