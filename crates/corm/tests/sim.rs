//! The client and the CoRM service on the simulator, where the node's
//! modelled cores run the service's background work (peers' messages,
//! deferred replies, compaction steps): reads and writes from many tasks
//! while compactions run underneath, checked for linearizability against a
//! register per object, and replayed from the seed bit for bit.

use std::cell::RefCell;
use std::rc::Rc;

use dmkit_corm::{CormClient, CormError};
use dmkit_fabric::Fabric;
use dmkit_lincheck::{check, MapOp, MapRet, Recorder};
use dmkit_memnode::corm::class::Strategy;
use dmkit_memnode::corm::service::CormService;
use dmkit_memnode::corm::{Correction, ObjPtr, Policy, StoreConfig};
use dmkit_runtime::{Ctx, Local, RuntimeConfig, Worker};
use dmkit_sim::{Profile, Sim, SimConfig};

const BS: usize = 4096;
const LEN: usize = 40;
const OBJECTS: u64 = 96;
const THREADS: usize = 3;
const TASKS: usize = 2;
const OPS: usize = 150;

/// An object's payload for value `v`: `v` in every 8-byte word, so a torn
/// read cannot pass for a value.
fn payload(v: u64) -> Vec<u8> {
    (0..LEN / 8).flat_map(|_| v.to_le_bytes()).collect()
}

fn value_of(bytes: &[u8]) -> u64 {
    let words: Vec<u64> = bytes[..LEN]
        .chunks_exact(8)
        .map(|w| u64::from_le_bytes(w.try_into().unwrap()))
        .collect();
    assert!(
        words.iter().all(|&w| w == words[0]),
        "a torn object was returned: {words:?}"
    );
    words[0]
}

fn mix(mut x: u64) -> u64 {
    x = (x ^ (x >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    x ^ (x >> 31)
}

/// What one run observed: the history's digest, the virtual end, the
/// store's counters and the moved objects the readers found.
#[derive(Debug, PartialEq, Eq)]
struct Outcome {
    digest: u64,
    end: u64,
    compactions: u64,
    blocks_compacted: u64,
    objects_moved: u64,
    moved_seen: u64,
    polls: u64,
}

fn worker(
    f: &dyn Fabric,
    clock: std::sync::Arc<dyn dmkit_runtime::Clock>,
    id: usize,
    seed: u64,
) -> Result<Worker, dmkit_fabric::FabricError> {
    Worker::builder(f)
        .clock(clock)
        .config(RuntimeConfig {
            seed: seed ^ id as u64,
            ..RuntimeConfig::default()
        })
        .id(id)
        .tasks(TASKS + 1)
        .local_bytes(BS)
        .build()
}

/// Loads `OBJECTS` kept objects among three times as many (the rest
/// freed: fragmented blocks), then runs reads (direct, corrected by a scan
/// read, or RPC) and writes from `THREADS × TASKS` tasks while one task
/// compacts the store again and again.
fn run(seed: u64, correction: Correction) -> Outcome {
    let mut sim = Sim::new(SimConfig {
        profile: Profile::builtin("cx3-56g").unwrap(),
        seed,
        memory_bytes: 64 << 20,
        page_size: 4096,
        rpc_workers: Some(4),
        ..SimConfig::default()
    })
    .unwrap();
    let node = sim.fabric().memory().embedded_node(0).unwrap();
    CormService::register(
        &node,
        StoreConfig {
            block_size: BS as u64,
            strategy: Strategy::Corm(16),
            correction,
            policy: Policy {
                threshold: None,
                merges_per_step: 4,
                ..Policy::default()
            },
            virtual_bytes: 16 << 20,
            seed: Some(seed),
            ..StoreConfig::default()
        },
    )
    .unwrap();
    // Load: allocate, write, free two objects of three.
    let ptrs: Rc<RefCell<Vec<ObjPtr>>> = Rc::default();
    let th = sim
        .add_worker(0, |f: &dyn Fabric, clock| worker(f, clock, 99, seed))
        .unwrap();
    let p = ptrs.clone();
    sim.worker_mut(th).spawn(move |ctx: Ctx| async move {
        let c = CormClient::connect(&ctx, 0).await.unwrap();
        let mut all = Vec::new();
        for i in 0..3 * OBJECTS {
            let mut q = c.alloc(&ctx, LEN as u32).await.unwrap();
            c.write(&ctx, &mut q, &payload(i / 3)).await.unwrap();
            all.push(q);
        }
        // Every third object stays: blocks a third full.
        for (i, q) in all.into_iter().enumerate() {
            if i % 3 == 0 {
                p.borrow_mut().push(q);
            } else {
                c.free(&ctx, q).await.unwrap();
            }
        }
    });
    sim.run();
    sim.clear_workers();
    assert_eq!(ptrs.borrow().len(), OBJECTS as usize);
    // Clients and the compactor.
    let rec: Rc<Recorder<u64, u64>> = Rc::new(Recorder::new());
    let moved = Rc::new(RefCell::new(0u64));
    let running = Rc::new(RefCell::new(THREADS * TASKS));
    for id in 0..THREADS {
        let th = sim
            .add_worker(0, |f: &dyn Fabric, clock| worker(f, clock, id, seed))
            .unwrap();
        for t in 0..TASKS {
            let (rec, moved, running) = (rec.clone(), moved.clone(), running.clone());
            let mut mine = ptrs.borrow().clone();
            let client = (id * TASKS + t) as u32;
            sim.worker_mut(th).spawn(move |ctx: Ctx| async move {
                let c = CormClient::connect(&ctx, 0).await.unwrap();
                let buf = Local::at(0, BS);
                let mut s = mix(seed ^ u64::from(client) << 20);
                for n in 0..OPS {
                    s = mix(s.wrapping_add(0x9e37_79b9_7f4a_7c15));
                    let k = (s % OBJECTS) as usize;
                    match (s >> 32) % 4 {
                        0 => {
                            // Unique per write: the history tells writes apart.
                            let v = (u64::from(client) + 1) << 32 | n as u64;
                            let e = rec.invoke(client, k as u64, MapOp::Upsert(v));
                            c.write(&ctx, &mut mine[k], &payload(v)).await.unwrap();
                            rec.ret(e, MapRet::Unit);
                        }
                        kind => {
                            let e = rec.invoke(client, k as u64, MapOp::Search);
                            let got = match kind {
                                1 => c.read(&ctx, &mut mine[k]).await.unwrap(),
                                _ => match c.direct_read(&ctx, mine[k], buf).await {
                                    Ok(v) => v,
                                    Err(CormError::Moved) => {
                                        *moved.borrow_mut() += 1;
                                        c.scan_moved(&ctx, &mut mine[k], buf).await.unwrap()
                                    }
                                    Err(e) => panic!("direct read: {e}"),
                                },
                            };
                            rec.ret(e, MapRet::Found(Some(value_of(&got))));
                        }
                    }
                }
                *running.borrow_mut() -= 1;
            });
        }
        if id == 0 {
            let running = running.clone();
            sim.worker_mut(th).spawn(move |ctx: Ctx| async move {
                let c = CormClient::connect(&ctx, 0).await.unwrap();
                while *running.borrow() > 0 {
                    c.compact(&ctx, None).await.unwrap();
                    ctx.sleep(20_000).await;
                }
            });
        }
    }
    sim.run();
    let history = rec.history();
    assert_eq!(history.len(), THREADS * TASKS * OPS);
    if let Err(v) = check(&history, |&k| Some(k)) {
        panic!("not linearizable: {v:?}");
    }
    // After the compactions, every object is readable through every
    // task's pointer to it (the loader's, never corrected, included).
    sim.clear_workers();
    let th = sim
        .add_worker(0, |f: &dyn Fabric, clock| worker(f, clock, 98, seed))
        .unwrap();
    let stats = Rc::new(RefCell::new(None));
    let (p, st) = (ptrs.clone(), stats.clone());
    sim.worker_mut(th).spawn(move |ctx: Ctx| async move {
        let c = CormClient::connect(&ctx, 0).await.unwrap();
        let buf = Local::at(0, BS);
        let all = p.borrow().clone();
        for q in &all {
            let mut a = *q;
            let mut b = *q;
            let x = value_of(&c.read(&ctx, &mut a).await.unwrap());
            let y = value_of(&c.scan_read(&ctx, &mut b, buf).await.unwrap());
            assert_eq!(x, y);
        }
        *st.borrow_mut() = Some(c.stats(&ctx).await.unwrap());
    });
    sim.run();
    let st = stats.borrow_mut().take().expect("stats read");
    assert_eq!(st.live_objects, OBJECTS);
    let digest = history.iter().fold(0u64, |h, r| {
        let ret = match &r.returned {
            Some((t, MapRet::Found(v))) => t ^ v.unwrap_or(0),
            Some((t, _)) => *t,
            None => 0,
        };
        mix(h ^ r.invoked ^ ret.rotate_left(17) ^ r.key << 40)
    });
    let moved_seen = *moved.borrow();
    Outcome {
        digest,
        end: sim.now(),
        compactions: st.compactions,
        blocks_compacted: st.blocks_compacted,
        objects_moved: st.objects_moved,
        moved_seen,
        polls: sim.rpc_stats().polls,
    }
}

#[test]
fn compaction_under_reads_and_writes_is_linearizable_and_replays() {
    for correction in [Correction::Message, Correction::Scan] {
        let a = run(7, correction);
        eprintln!("{correction:?}: {a:?}");
        assert!(a.compactions >= 2, "{a:?}");
        assert!(a.blocks_compacted > 0, "{a:?}");
        assert!(
            a.objects_moved > 0,
            "objects moved, pointers indirect: {a:?}"
        );
        assert!(a.moved_seen > 0, "direct reads found moved objects: {a:?}");
        assert!(a.polls > 0);
        assert_eq!(a, run(7, correction), "the same seed replays");
    }
}
