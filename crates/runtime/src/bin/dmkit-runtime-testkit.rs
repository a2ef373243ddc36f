//! Child-process helper for dmkit-runtime's multi-process tests. Not a user tool.
//!
//! ```text
//! dmkit-runtime-testkit lock SOCKET LOCK DATA RKEY WORKERS TASKS ITERS LEASE_MS
//! dmkit-runtime-testkit hold SOCKET LOCK RKEY LEASE_MS
//! ```
//! `lock`: every task takes the lock ITERS times; inside, it checks and sets an
//! "occupied" word (DATA+8), increments a plain counter (DATA) with READ and
//! WRITE, clears "occupied" and unlocks. Exit 3 on an overlap.
//! `hold`: acquires the lock, prints `held DEADLINE_US`, then sleeps forever.

use std::io::Write;
use std::process::ExitCode;

use dmkit_fabric::shm::{ShmConfig, ShmFabric, Target};
use dmkit_fabric::{GlobalAddr, RemoteRef};
use dmkit_runtime::{LocalLayout, LockConfig, RemoteLock, Worker};

fn num(s: &str) -> u64 {
    s.parse().expect("numeric argument")
}

fn hex(s: &str) -> u64 {
    u64::from_str_radix(s.trim_start_matches("0x"), 16).expect("hex argument")
}

fn main() -> ExitCode {
    let a: Vec<String> = std::env::args().skip(1).collect();
    let fabric = ShmFabric::open(ShmConfig::default(), &[Target::new(&a[1])]).expect("connect");
    let lock_addr = GlobalAddr::from_raw(hex(&a[2]));
    match a[0].as_str() {
        "lock" => {
            let (data, rkey) = (GlobalAddr::from_raw(hex(&a[3])), num(&a[4]) as u32);
            let (workers, tasks, iters, lease_ms) =
                (num(&a[5]), num(&a[6]) as usize, num(&a[7]), num(&a[8]));
            let cfg = LockConfig {
                lease: lease_ms * 1_000_000,
                ..Default::default()
            };
            let overlaps: u64 = std::thread::scope(|s| {
                let hs: Vec<_> = (0..workers)
                    .map(|wi| {
                        let fabric = &fabric;
                        s.spawn(move || {
                            // What each task reads (count, occupied) and
                            // what it writes back.
                            let mut l = LocalLayout::new();
                            let (read, count, occupied, clear) = (
                                l.region("count and occupied", 16),
                                l.region("new count", 8),
                                l.region("occupied", 8),
                                l.region("free", 8),
                            );
                            let mut w = Worker::builder(fabric)
                                .id(wi as usize)
                                .tasks(tasks)
                                .local(&l)
                                .build()
                                .unwrap();
                            let bad = std::rc::Rc::new(std::cell::Cell::new(0u64));
                            for t in 0..tasks {
                                let bad = bad.clone();
                                let owner = ((std::process::id() as u64 * 131 + wi * 17 + t as u64)
                                    % 65_535
                                    + 1) as u16;
                                w.spawn(move |ctx| async move {
                                    let lock =
                                        RemoteLock::new(RemoteRef::new(lock_addr, rkey), cfg);
                                    let data = RemoteRef::new(data, rkey);
                                    for _ in 0..iters {
                                        let g = lock.lock(&ctx, owner).await.unwrap();
                                        assert!(
                                            g.check(&ctx, 10_000_000),
                                            "lease too short for the test"
                                        );
                                        ctx.read_sync(data, read).await.unwrap();
                                        let (n, busy) =
                                            (ctx.local_u64(read), ctx.local_u64(read.word(8)));
                                        if busy != 0 {
                                            bad.set(bad.get() + 1);
                                        }
                                        ctx.set_local_u64(count, n + 1);
                                        ctx.set_local_u64(occupied, 1);
                                        ctx.write_sync(data.add(8), occupied).await.unwrap();
                                        // Yield inside the critical section so others try.
                                        ctx.sleep(2_000).await;
                                        ctx.set_local_u64(clear, 0);
                                        ctx.write(data, count);
                                        ctx.write(data.add(8), clear);
                                        ctx.post();
                                        ctx.sync().await.unwrap();
                                        g.unlock(&ctx).await.unwrap();
                                    }
                                });
                            }
                            w.run();
                            bad.get()
                        })
                    })
                    .collect();
                hs.into_iter().map(|h| h.join().unwrap()).sum()
            });
            if overlaps > 0 {
                eprintln!("{overlaps} overlapping critical sections");
                return ExitCode::from(3);
            }
        }
        "hold" => {
            let (rkey, lease_ms) = (num(&a[3]) as u32, num(&a[4]));
            let cfg = LockConfig {
                lease: lease_ms * 1_000_000,
                ..Default::default()
            };
            let mut w = Worker::builder(&fabric).build().unwrap();
            w.spawn(move |ctx| async move {
                let lock = RemoteLock::new(RemoteRef::new(lock_addr, rkey), cfg);
                let g = lock.lock(&ctx, 0x7777).await.unwrap();
                println!("held {}", (ctx.now() + g.remaining(&ctx)) / 1000);
                std::io::stdout().flush().unwrap();
                let _held = g; // never unlocked: the test kills this process
                loop {
                    ctx.sleep(1_000_000_000).await;
                }
            });
            w.run();
        }
        other => {
            eprintln!("unknown command {other}");
            return ExitCode::from(2);
        }
    }
    ExitCode::SUCCESS
}
