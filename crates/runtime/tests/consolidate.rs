//! IO consolidation (memory-semantics §III-C): a write-back buffer serves
//! reads of its own writes, writes back at θ and when its lease runs out;
//! shared regions pass between the threads of a machine and lose nothing.

use std::cell::RefCell;
use std::rc::Rc;
use std::sync::Arc;

use dmkit_fabric::shm::{ShmConfig, ShmFabric};
use dmkit_fabric::{ControlPlane, Fabric, RemoteRef, SyncQp};
use dmkit_runtime::consolidate::{
    ConsolidateError, ConsolidationConfig, SharedConfig, SharedRegion, SharedRegions, WriteBuffer,
    DATA_AT, FLUSHES_AT,
};
use dmkit_runtime::{Local, RuntimeConfig, VirtualClock, Worker};

fn fabric() -> ShmFabric {
    ShmFabric::one_node(ShmConfig::default(), 4 << 20).unwrap()
}

/// (remote bytes after a write, the write, whether it wrote back)
type Seen = Vec<(Vec<u8>, Vec<u8>, bool)>;

fn raw() -> RuntimeConfig {
    RuntimeConfig {
        throttle: false,
        conflict_avoid: false,
        ..Default::default()
    }
}

/// The remote bytes `[at, at + len)`, read directly.
fn remote(f: &ShmFabric, r: RemoteRef, len: usize) -> Vec<u8> {
    let mut q = SyncQp::new(f, r.addr.node(), 4096).unwrap();
    q.read(r.addr, r.rkey, len).unwrap()
}

#[test]
fn a_read_after_a_buffered_write_returns_it_and_theta_writes_back() {
    let f = fabric();
    let (addr, _, rkey) = f.alloc_chunk(0, 4096, false).unwrap();
    let region = RemoteRef::new(addr, rkey).add(1024);
    let cfg = ConsolidationConfig {
        theta: 4,
        lease: u64::MAX / 2,
    };
    let stats = Rc::new(std::cell::Cell::new(None));
    let mut w = Worker::builder(&f)
        .config(raw())
        .local_bytes(1024)
        .build()
        .unwrap();
    let seen: Rc<RefCell<Seen>> = Rc::default();
    let (stats2, seen2) = (stats.clone(), seen.clone());
    let f2 = Arc::new(fabric_handle(&f));
    w.spawn(move |ctx| async move {
        // The buffer is the task's local memory.
        let mut b = WriteBuffer::hint(region, Local::at(0, 1024), cfg).unwrap();
        for i in 0..4u8 {
            let data = [i + 1; 32];
            let at = 100 * i as usize;
            let flushed = b.write(&ctx, at, &data).await.unwrap();
            let mut back = [0u8; 32];
            b.read(&ctx, at, &mut back).await.unwrap();
            assert_eq!(back, data, "a read after a buffered write returns it");
            // What remote memory holds at that point.
            let rem = f2.read(region, 1024);
            seen2
                .borrow_mut()
                .push((rem[at..at + 32].to_vec(), data.to_vec(), flushed));
        }
        stats2.set(Some(b.stats()));
    });
    w.run();
    let seen = seen.borrow();
    for (i, (rem, data, flushed)) in seen.iter().enumerate() {
        if i < 3 {
            assert!(
                !flushed && rem.iter().all(|&b| b == 0),
                "write {i} buffered"
            );
        } else {
            assert!(*flushed && rem == data, "the θ-th write writes back");
        }
    }
    let after = remote(&f, region, 1024);
    for i in 0..4usize {
        assert!(after[100 * i..100 * i + 32]
            .iter()
            .all(|&b| b == i as u8 + 1));
    }
    let s = stats.get().expect("the task finished");
    assert_eq!((s.writes, s.reads, s.flushes, s.loads), (4, 4, 1, 1));
    // One span from the first to the last changed byte.
    assert_eq!(s.bytes_flushed, 332);
}

/// A thread-safe reader of remote bytes for checks from inside a task.
struct Peek(std::sync::Mutex<SyncQp>);

impl Peek {
    fn read(&self, r: RemoteRef, len: usize) -> Vec<u8> {
        self.0.lock().unwrap().read(r.addr, r.rkey, len).unwrap()
    }
}

fn fabric_handle(f: &ShmFabric) -> Peek {
    Peek(std::sync::Mutex::new(SyncQp::new(f, 0, 4096).unwrap()))
}

/// A 4 KiB region, θ = 16 with a 10 µs lease, and the virtual clock the
/// lease tests move by hand.
fn lease_setup(f: &ShmFabric) -> (RemoteRef, ConsolidationConfig, VirtualClock) {
    let (addr, _, rkey) = f.alloc_chunk(0, 4096, false).unwrap();
    let cfg = ConsolidationConfig {
        theta: 16,
        lease: 10_000,
    };
    (RemoteRef::new(addr, rkey), cfg, VirtualClock::new())
}

/// Runs `w`'s tasks to their end, moving `clock` on by 500 ns whenever
/// no task could go on (they all sleep).
fn run_in_virtual_time(w: &mut Worker, clock: &VirtualClock) {
    let mut guard = 0;
    while w.live_tasks() > 0 {
        if w.step() == 0 {
            clock.advance(500);
        }
        guard += 1;
        assert!(guard < 1_000_000, "no progress");
    }
}

#[test]
fn a_lease_expiry_writes_back() {
    let f = fabric();
    let (region, cfg, clock) = lease_setup(&f);
    let mut w = Worker::builder(&f)
        .clock(Arc::new(clock.clone()))
        .config(raw())
        .local_bytes(256)
        .build()
        .unwrap();
    let peek = Arc::new(fabric_handle(&f));
    let log: Rc<RefCell<Vec<String>>> = Rc::default();
    let log2 = log.clone();
    w.spawn(move |ctx| async move {
        let mut wb = WriteBuffer::hint(region, Local::at(0, 256), cfg).unwrap();
        // Nothing is buffered before the region was loaded once.
        assert_eq!(wb.try_write(&ctx, 0, b"x"), None);
        assert!(!wb.write(&ctx, 8, b"buffered").await.unwrap());
        assert_eq!(&peek.read(region, 16)[8..16], &[0; 8]);
        // Not yet: the lease has 10 µs.
        ctx.sleep(5_000).await;
        assert!(!wb.tick(&ctx).await.unwrap());
        ctx.sleep(6_000).await;
        assert!(wb.expired(ctx.now()));
        assert!(wb.tick(&ctx).await.unwrap(), "the lease ran out");
        assert_eq!(&peek.read(region, 16)[8..16], b"buffered");
        // Writes after the lease ran out stay buffered until the next tick.
        assert!(!wb.write(&ctx, 0, b"first---").await.unwrap());
        ctx.sleep(20_000).await;
        assert!(!wb.write(&ctx, 16, b"late----").await.unwrap());
        assert_eq!(
            &peek.read(region, 24)[..],
            b"\0\0\0\0\0\0\0\0buffered\0\0\0\0\0\0\0\0"
        );
        assert!(wb.tick(&ctx).await.unwrap());
        assert_eq!(&peek.read(region, 24)[..], b"first---bufferedlate----");
        // Loaded: a write is a copy.
        assert_eq!(wb.try_write(&ctx, 0, b"F"), Some(false));
        let mut back = [0u8; 8];
        wb.read(&ctx, 0, &mut back).await.unwrap();
        assert_eq!(&back, b"First---");
        assert!(wb.flush(&ctx).await.unwrap());
        let s = wb.stats();
        assert_eq!((s.flushes, s.lease_flushes, s.loads), (3, 2, 1), "{s:?}");
        log2.borrow_mut().push("done".into());
    });
    run_in_virtual_time(&mut w, &clock);
    assert_eq!(log.borrow().as_slice(), ["done"]);
}

/// `try_write_at`: the lease of a write into a clean buffer counts from
/// the caller's (earlier) clock reading, so the write-back comes no later
/// than a lease after that reading; an empty write changes no byte.
#[test]
fn a_lease_counts_from_the_callers_reading() {
    let f = fabric();
    let (region, cfg, clock) = lease_setup(&f);
    let mut w = Worker::builder(&f)
        .clock(Arc::new(clock.clone()))
        .config(raw())
        .local_bytes(64)
        .build()
        .unwrap();
    let peek = Arc::new(fabric_handle(&f));
    let done = Rc::new(std::cell::Cell::new(false));
    let done2 = done.clone();
    w.spawn(move |ctx| async move {
        let mut wb = WriteBuffer::hint(region, Local::at(0, 64), cfg).unwrap();
        // Load, then start clean.
        assert!(!wb.write(&ctx, 0, b"loaded--").await.unwrap());
        assert!(wb.flush(&ctx).await.unwrap());
        // An empty write is a modification that changes nothing.
        assert_eq!(wb.try_write(&ctx, 3, b""), Some(false));
        assert_eq!(wb.pending(), 1);
        assert!(!wb.flush(&ctx).await.unwrap());
        assert_eq!(wb.pending(), 0);
        // The caller read the clock 6 µs before its write.
        let reading = ctx.now();
        ctx.sleep(6_000).await;
        assert_eq!(wb.try_write_at(&ctx, reading, 8, b"stale-at"), Some(false));
        ctx.sleep(4_000).await;
        // 10 µs after the reading, 4 µs after the write: expired.
        assert!(wb.expired(ctx.now()));
        assert!(wb.tick(&ctx).await.unwrap());
        assert_eq!(&peek.read(region, 16)[..], b"loaded--stale-at");
        // A reading of now starts the lease now.
        let now = ctx.now();
        assert_eq!(wb.try_write_at(&ctx, now, 0, b"L"), Some(false));
        ctx.sleep(6_000).await;
        assert!(!wb.tick(&ctx).await.unwrap(), "6 µs of a 10 µs lease");
        let s = wb.stats();
        assert_eq!((s.writes, s.flushes, s.lease_flushes), (4, 2, 1), "{s:?}");
        done2.set(true);
    });
    run_in_virtual_time(&mut w, &clock);
    assert!(done.get(), "the task finished");
}

#[test]
fn a_hint_must_name_an_aligned_region() {
    let f = fabric();
    let (addr, _, rkey) = f.alloc_chunk(0, 4096, false).unwrap();
    let r = RemoteRef::new(addr, rkey);
    let cfg = ConsolidationConfig::default();
    let buf = |len| Local::at(0, len);
    let e = WriteBuffer::hint(r.add(32), buf(1024), cfg).unwrap_err();
    assert!(matches!(e, ConsolidateError::Region { .. }), "{e}");
    assert!(e.to_string().contains("aligned"));
    assert!(WriteBuffer::hint(r, buf(0), cfg).is_err());
    assert!(WriteBuffer::hint(r, buf(64), ConsolidationConfig { theta: 0, ..cfg }).is_err());
    assert!(WriteBuffer::hint(r.add(64), buf(48), cfg).is_ok());
}

/// Threads of one machine increment counters in two shared regions; every
/// increment is in remote memory at the end, in fewer write-backs than
/// increments.
#[test]
fn shared_regions_pass_between_threads_and_lose_nothing() {
    const THREADS: usize = 3;
    const TASKS: usize = 4;
    const OPS: u64 = 200;
    let f = Arc::new(fabric());
    let (addr, _, rkey) = f.alloc_chunk(0, 4096, false).unwrap();
    let base = RemoteRef::new(addr, rkey);
    let regions: Vec<SharedRegion> = (0..2)
        .map(|i| SharedRegion {
            head: base.add(i * 512),
            len: 64,
        })
        .collect();
    let table = Arc::new(SharedRegions::new(
        2,
        u32::MAX,
        SharedConfig {
            consolidation: ConsolidationConfig {
                theta: 8,
                lease: 1_000_000,
            },
            lock_lease: 100_000_000,
        },
    ));
    std::thread::scope(|s| {
        for t in 0..THREADS {
            let (f, table, regions) = (f.clone(), table.clone(), regions.clone());
            s.spawn(move || {
                let mut w = Worker::builder(f.as_ref() as &dyn Fabric)
                    .config(raw())
                    .id(t)
                    .tasks(TASKS)
                    .local_bytes(64)
                    .build()
                    .unwrap();
                for k in 0..TASKS {
                    let (table, regions) = (table.clone(), regions.clone());
                    w.spawn(move |ctx| async move {
                        for i in 0..OPS {
                            let r = ((i as usize) + k) % 2;
                            let h = table
                                .acquire(&ctx, r, regions[r], 1 + t as u16, Local::at(0, 64))
                                .await
                                .unwrap();
                            let slot = 8 * ((t * TASKS + k) % 8);
                            let ((), d) = table.update(&ctx, &h, |data| {
                                let v =
                                    u64::from_le_bytes(data[slot..slot + 8].try_into().unwrap());
                                data[slot..slot + 8].copy_from_slice(&(v + 1).to_le_bytes());
                                ((), 1)
                            });
                            table.finish(&ctx, h, d, Local::at(0, 64)).await.unwrap();
                        }
                    });
                }
                w.run();
            });
        }
    });
    let mut total = 0;
    let mut flushes = 0;
    for r in &regions {
        let img = remote(&f, r.head, (DATA_AT as usize) + 64);
        assert_eq!(&img[..8], &[0; 8], "the lock is free at the end");
        flushes += u64::from_le_bytes(img[FLUSHES_AT as usize..16].try_into().unwrap());
        total += img[16..]
            .chunks(8)
            .map(|c| u64::from_le_bytes(c.try_into().unwrap()))
            .sum::<u64>();
    }
    let ops = (THREADS * TASKS) as u64 * OPS;
    assert_eq!(total, ops, "every increment reached remote memory");
    assert!(
        flushes > 0 && flushes < ops,
        "{flushes} write-backs for {ops} increments"
    );
}
