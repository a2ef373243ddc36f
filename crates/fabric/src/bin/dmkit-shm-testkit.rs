//! Child-process helper for dmkit's multi-process shm tests. Not a user tool.
//!
//! ```text
//! dmkit-shm-testkit faa  SOCKET ADDR RKEY COUNTERS THREADS ITERS
//! dmkit-shm-testkit lock SOCKET LOCK_ADDR COUNTER_ADDR RKEY THREADS ITERS
//! dmkit-shm-testkit hold SOCKET LEN
//! dmkit-shm-testkit rpc  SOCKET                 (the RPC conformance checks)
//! dmkit-shm-testkit rpc-flood SOCKET SERVICE    (pipelined calls until killed)
//! ```
//! Addresses are raw `GlobalAddr` values in hex. Exit status 0 on success.

use std::io::Write;
use std::process::ExitCode;

use dmkit_fabric::shm::{ShmConfig, ShmFabric, Target};
use dmkit_fabric::{ControlPlane, GlobalAddr, SyncQp};

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
    let fabric = match ShmFabric::open(ShmConfig::default(), &[Target::new(&args[1])]) {
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
                        let mut q = SyncQp::new(fabric, base.node(), 64).expect("qp");
                        for i in 0..iters {
                            let c = (i + t) % counters;
                            q.faa(base.add(8 * c), rkey, 1 + c).expect("faa");
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
                        let mut q = SyncQp::new(fabric, lock.node(), 64).expect("qp");
                        let scratch = dmkit_fabric::LocalMem::new(64);
                        let lk = q.qp().register_local(&scratch);
                        let mut b = dmkit_fabric::Batch::new();
                        for _ in 0..iters {
                            // Acquire: CAS 0 → owner until it succeeds.
                            while q.cas(lock, rkey, 0, owner).expect("cas") != 0 {
                                std::thread::yield_now();
                            }
                            // Critical section: a non-atomic read-modify-write.
                            let v = q.read_u64(counter, rkey).expect("read");
                            scratch.store_u64(0, v + 1);
                            // Update and release in one batch: posting order keeps
                            // the counter write before the unlock.
                            b.write(counter, rkey, dmkit_fabric::LocalRef::new(lk, 0, 8))
                                .set_unsignaled();
                            b.write(lock, rkey, dmkit_fabric::LocalRef::new(lk, 8, 8));
                            q.qp().execute(&mut b).expect("release");
                        }
                    });
                }
            });
        }
        "hold" => {
            let len = num(&args[2]);
            let (addr, _, rkey) = fabric.alloc_chunk(0, len, false).expect("alloc");
            let mut q = SyncQp::new(&fabric, 0, 64).expect("qp");
            println!("ready {:#x}", addr.raw());
            std::io::stdout().flush().expect("flush");
            loop {
                q.faa(addr, rkey, 1).expect("faa");
                std::thread::sleep(std::time::Duration::from_millis(1));
            }
        }
        "rpc" => dmkit_fabric::conformance::rpc_all(&fabric, 0),
        "rpc-flood" => {
            use dmkit_fabric::Fabric;
            let service = num(&args[2]) as u16;
            let mut ch = fabric.connect_rpc(0).expect("rpc channel");
            let mut out = Vec::new();
            let mut id = 0u64;
            // Keep the ring full, and say so once some calls went through.
            loop {
                while ch.send(id, service, &id.to_le_bytes()).is_ok() {
                    id += 1;
                }
                out.clear();
                ch.poll(&mut out);
                if out.iter().any(|r| r.id == 16) {
                    println!("ready");
                    std::io::stdout().flush().expect("flush");
                }
                std::hint::spin_loop();
            }
        }
        other => {
            eprintln!("unknown command {other}");
            return ExitCode::from(2);
        }
    }
    ExitCode::SUCCESS
}
