//! Child-process helper for dmkit's multi-process shm tests. Not a user tool.
//!
//! ```text
//! dmkit-shm-testkit faa  SOCKET ADDR RKEY COUNTERS THREADS ITERS
//! dmkit-shm-testkit lock SOCKET LOCK_ADDR COUNTER_ADDR RKEY THREADS ITERS
//! dmkit-shm-testkit hold SOCKET LEN
//! ```
//! Addresses are raw `GlobalAddr` values in hex. Exit status 0 on success.

use std::io::Write;
use std::process::ExitCode;

use dmkit_fabric::shm::{ShmConfig, ShmFabric, Target};
use dmkit_fabric::{Batch, Fabric, GlobalAddr, WorkRequest};

fn hex(s: &str) -> u64 {
    u64::from_str_radix(s.trim_start_matches("0x"), 16).expect("hex argument")
}

fn num(s: &str) -> u64 {
    s.parse().expect("numeric argument")
}

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let Some(cmd) = args.first() else {
        eprintln!("usage: see the source");
        return ExitCode::from(2);
    };
    let fabric = match ShmFabric::connect(ShmConfig::default(), &[Target::new(&args[1])]) {
        Ok(f) => f,
        Err(e) => {
            eprintln!("connect: {e}");
            return ExitCode::from(1);
        }
    };
    match cmd.as_str() {
        "faa" => {
            let (base, rkey, counters, threads, iters) = (
                GlobalAddr::from_raw(hex(&args[2])),
                num(&args[3]) as u32,
                num(&args[4]),
                num(&args[5]),
                num(&args[6]),
            );
            std::thread::scope(|s| {
                for t in 0..threads {
                    let fabric = &fabric;
                    s.spawn(move || {
                        let mut qp = fabric.connect(base.node()).expect("qp");
                        let mut b = Batch::new();
                        for i in 0..iters {
                            let c = (i + t) % counters;
                            b.push(WorkRequest::faa(base.add(8 * c), rkey, 1 + c));
                            qp.execute(&mut b).expect("faa");
                        }
                    });
                }
            });
        }
        "lock" => {
            let (lock, counter, rkey, threads, iters) = (
                GlobalAddr::from_raw(hex(&args[2])),
                GlobalAddr::from_raw(hex(&args[3])),
                num(&args[4]) as u32,
                num(&args[5]),
                num(&args[6]),
            );
            let me = std::process::id() as u64;
            std::thread::scope(|s| {
                for t in 0..threads {
                    let fabric = &fabric;
                    s.spawn(move || {
                        let owner = (me << 16) | (t + 1);
                        let mut qp = fabric.connect(lock.node()).expect("qp");
                        let mut b = Batch::new();
                        for _ in 0..iters {
                            // Acquire: CAS 0 → owner until it succeeds.
                            loop {
                                b.push(WorkRequest::cas(lock, rkey, 0, owner));
                                let c = qp.execute(&mut b).expect("cas");
                                if c[0].result == Ok(0) {
                                    break;
                                }
                                std::thread::yield_now();
                            }
                            // Critical section: a non-atomic read-modify-write.
                            b.push(WorkRequest::read(counter, rkey, vec![0; 8]));
                            let c = qp.execute(&mut b).expect("read");
                            let v = u64::from_ne_bytes(c[0].buf[..8].try_into().unwrap());
                            // Update and release in one batch: posting order keeps
                            // the counter write before the unlock.
                            b.push(
                                WorkRequest::write(counter, rkey, (v + 1).to_ne_bytes().to_vec())
                                    .unsignaled(),
                            )
                            .push(WorkRequest::write(
                                lock,
                                rkey,
                                0u64.to_ne_bytes().to_vec(),
                            ));
                            qp.execute(&mut b).expect("release");
                        }
                    });
                }
            });
        }
        "hold" => {
            let len = num(&args[2]);
            let (addr, _, rkey) = fabric.alloc_chunk(0, len, false).expect("alloc");
            let mut qp = fabric.connect(0).expect("qp");
            println!("ready {:#x}", addr.raw());
            std::io::stdout().flush().expect("flush");
            let mut b = Batch::new();
            loop {
                b.push(WorkRequest::faa(addr, rkey, 1));
                qp.execute(&mut b).expect("faa");
                std::thread::sleep(std::time::Duration::from_millis(1));
            }
        }
        other => {
            eprintln!("unknown command {other}");
            return ExitCode::from(2);
        }
    }
    ExitCode::SUCCESS
}
