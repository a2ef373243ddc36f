//! CoRM objects read one-sidedly through the shm backend — the real
//! client path: READs checked against the store's read-only region and
//! translated through the node's page table — while the store compacts
//! underneath (pages remapped onto other blocks' memory, addresses
//! released and unmapped).

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use dmkit_corm::sync;
use dmkit_fabric::shm::{ShmConfig, ShmFabric};
use dmkit_fabric::{GlobalAddr, SyncQp};
use dmkit_memnode::corm::class::Strategy;
use dmkit_memnode::corm::{Cluster, Correction, ObjPtr, Op, Policy, Reply, Rng, StoreConfig};
use dmkit_memnode::{MemNode, NodeConfig};

const BS: u64 = 4096;

fn setup(workers: usize) -> (Arc<MemNode>, ShmFabric, Cluster) {
    let node = MemNode::new(NodeConfig {
        size: 64 << 20,
        ..Default::default()
    })
    .unwrap();
    let fabric = ShmFabric::with_nodes(ShmConfig::default(), vec![node.clone()]).unwrap();
    let c = Cluster::new(
        node.clone(),
        StoreConfig {
            block_size: BS,
            workers,
            strategy: Strategy::Corm(16),
            correction: Correction::Scan,
            policy: Policy {
                threshold: None,
                ..Policy::default()
            },
            virtual_bytes: 16 << 20,
            max_active_bytes: None,
            seed: Some(3),
        },
    )
    .unwrap();
    (node, fabric, c)
}

/// A client's read: READ the slot at the hint and decode it; on another
/// object, READ the home block and scan it (ScanRead). Torn or locked
/// reads, and scans that miss mid-merge, are tried again.
fn direct_read(q: &mut SyncQp, slot: usize, p: ObjPtr) -> Result<Vec<u8>, sync::SyncError> {
    sync::read_one_sided(q, p, slot, BS, 10_000)
}

fn value(tag: u64, len: usize) -> Vec<u8> {
    (0..len)
        .map(|i| (tag as usize * 13 + i * 7) as u8)
        .collect()
}

#[test]
fn objects_stay_readable_through_shm_verbs_across_compaction() {
    let (_node, fabric, mut c) = setup(2);
    let mut q = SyncQp::new(&fabric, 0, 8192).unwrap();
    let mut rng = Rng::new(1);
    let len = 300usize;
    let mut all = Vec::new();
    for i in 0..400u64 {
        let w = (i % 2) as usize;
        let Ok(Reply::Allocated(p)) = c.call(w, Op::Alloc(len as u32)) else {
            panic!()
        };
        c.call(w, Op::Write(p, value(i, len))).unwrap();
        all.push((p, i));
    }
    let mut objs = Vec::new();
    for (k, (p, i)) in all.into_iter().enumerate() {
        if rng.below(5) == 0 {
            objs.push((p, i));
        } else {
            assert_eq!(c.call(k % 2, Op::Free(p)), Ok(Reply::Freed));
        }
    }
    let slot = c
        .store()
        .classes()
        .get(objs[0].0.class())
        .unwrap()
        .slot_size as usize;
    let Ok(Reply::Compacted(r)) = c.call(0, Op::Compact(None)) else {
        panic!()
    };
    assert!(r.blocks_freed > 0 && r.objects_moved > 0, "{r:?}");
    for (p, i) in &objs {
        let v = direct_read(&mut q, slot, *p).unwrap();
        assert_eq!(&v[..len], &value(*i, len)[..]);
    }
    // The store's region is read-only: a one-sided WRITE is refused.
    let p = objs[0].0;
    assert!(q
        .write(GlobalAddr::new(0, p.offset()), p.rkey(), &[0; 8])
        .is_err());
    // Release every pointer: addresses nothing is homed at are unmapped,
    // and a READ there faults instead of reading another block.
    let mut gone = 0;
    for (p, i) in &objs {
        let Ok(Reply::Released(n)) = c.call(0, Op::ReleasePtr(*p)) else {
            panic!()
        };
        let v = direct_read(&mut q, slot, n).unwrap();
        assert_eq!(&v[..len], &value(*i, len)[..]);
        if n.home_block(BS) != p.home_block(BS) && c.store().stats().vaddrs_released > gone {
            gone = c.store().stats().vaddrs_released;
        }
    }
    assert!(gone > 0);
    let released_somewhere = objs
        .iter()
        .any(|(p, _)| q.read(GlobalAddr::new(0, p.offset()), p.rkey(), 8).is_err());
    assert!(released_somewhere, "a released address faults");
    c.check().unwrap();
}

#[test]
fn a_reader_thread_races_repeated_compaction() {
    let (_node, fabric, mut c) = setup(3);
    let len = 120usize;
    let stop = Arc::new(AtomicBool::new(false));
    let live: Arc<Mutex<Vec<(ObjPtr, u64)>>> = Default::default();
    let reads = Arc::new(AtomicU64::new(0));
    let slot = {
        let cl = c.store().classes();
        cl.get(cl.for_payload(len as u32).unwrap())
            .unwrap()
            .slot_size as usize
    };
    let reader = {
        let (stop, live, reads) = (stop.clone(), live.clone(), reads.clone());
        let mut q = SyncQp::new(&fabric, 0, 8192).unwrap();
        std::thread::spawn(move || {
            while !stop.load(Ordering::Acquire) {
                let snapshot = live.lock().unwrap().clone();
                for (p, tag) in snapshot {
                    // The object may be freed meanwhile (then it is
                    // missing or its address unmapped; its slot and id
                    // may even be reused, 2^-16 per new object of the
                    // block); if the read succeeds, it is one whole object
                    // as some write left it: bytes step by 7 from its tag.
                    if let Ok(v) = direct_read(&mut q, slot, p) {
                        let whole = v[..len].windows(2).all(|w| w[1].wrapping_sub(w[0]) == 7);
                        assert!(whole, "a torn object was accepted");
                        if v[..len] == value(tag, len)[..] {
                            reads.fetch_add(1, Ordering::Relaxed);
                        }
                    }
                }
            }
        })
    };
    let mut rng = Rng::new(9);
    let mut mine: Vec<(ObjPtr, u64)> = Vec::new();
    let mut round = 0u64;
    while round < 40 || (reads.load(Ordering::Relaxed) < 100 && round < 2000) {
        round += 1;
        for i in 0..60u64 {
            let w = rng.below(3) as usize;
            let tag = round * 1000 + i;
            let Ok(Reply::Allocated(p)) = c.call(w, Op::Alloc(len as u32)) else {
                panic!()
            };
            c.call(w, Op::Write(p, value(tag, len))).unwrap();
            mine.push((p, tag));
        }
        // Free most, publish the survivors *before* freeing the rest so
        // the reader races frees too, then compact.
        *live.lock().unwrap() = mine.clone();
        let mut keep = Vec::new();
        for (p, tag) in mine.drain(..) {
            if rng.below(3) == 0 {
                keep.push((p, tag));
            } else {
                let w = rng.below(3) as usize;
                assert_eq!(c.call(w, Op::Free(p)), Ok(Reply::Freed));
            }
        }
        *live.lock().unwrap() = keep.clone();
        mine = keep;
        let _ = c.call(round as usize % 3, Op::Compact(None));
    }
    stop.store(true, Ordering::Release);
    reader.join().unwrap();
    assert!(
        reads.load(Ordering::Relaxed) >= 100,
        "{} reads in {round} rounds",
        reads.load(Ordering::Relaxed)
    );
    let st = c.store().stats();
    assert!(st.blocks_compacted > 10 && st.objects_moved > 0, "{st:?}");
    c.check().unwrap();
}
