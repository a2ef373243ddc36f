//! Several compute processes on one memory node: exact FAA sums, a CAS
//! spinlock guarding a non-atomic counter, and a client killed mid-run.

mod common;

use std::process::Command;
use std::time::{Duration, Instant};

use common::{spawn_until_line, Served};
use dmkit_fabric::{ControlPlane, SyncQp};

const TESTKIT: &str = env!("CARGO_BIN_EXE_dmkit-shm-testkit");

#[test]
fn faa_from_processes_and_threads_sums_exactly() {
    let s = Served::start(4 << 20);
    let f = s.client();
    let (base, _, k) = f.alloc_chunk(0, 4096, true).unwrap();
    let (procs, threads, iters, counters) = (3u64, 2u64, 5000u64, 4u64);
    let children: Vec<_> = (0..procs)
        .map(|_| {
            Command::new(TESTKIT)
                .args([
                    "faa",
                    s.socket.to_str().unwrap(),
                    &format!("{:x}", base.raw()),
                    &k.to_string(),
                ])
                .args([counters, threads, iters].map(|v| v.to_string()))
                .spawn()
                .unwrap()
        })
        .collect();
    // This process adds concurrently too.
    let mut q = SyncQp::new(&f, 0, 64).unwrap();
    for _ in 0..iters {
        q.faa(base.add(32), k, 1).unwrap();
    }
    for mut c in children {
        assert!(c.wait().unwrap().success());
    }
    // Worker t of every process adds (1 + c) to counter c = (i + t) % counters.
    let mut expect = vec![0u64; counters as usize + 1];
    for _ in 0..procs {
        for t in 0..threads {
            for i in 0..iters {
                let c = (i + t) % counters;
                expect[c as usize] += 1 + c;
            }
        }
    }
    expect[4] += iters;
    for (c, want) in expect.iter().enumerate() {
        assert_eq!(
            q.read_u64(base.add(8 * c as u64), k).unwrap(),
            *want,
            "counter {c}"
        );
    }
}

#[test]
fn cas_spinlock_across_processes_protects_a_plain_counter() {
    let s = Served::start(4 << 20);
    let f = s.client();
    let (base, _, k) = f.alloc_chunk(0, 4096, true).unwrap();
    let (lock, counter) = (base, base.add(64));
    let (procs, threads, iters) = (3u64, 2u64, 1500u64);
    let children: Vec<_> = (0..procs)
        .map(|_| {
            Command::new(TESTKIT)
                .args(["lock", s.socket.to_str().unwrap()])
                .args([lock.raw(), counter.raw()].map(|v| format!("{v:x}")))
                .args([k as u64, threads, iters].map(|v| v.to_string()))
                .spawn()
                .unwrap()
        })
        .collect();
    for mut c in children {
        assert!(c.wait().unwrap().success());
    }
    let mut q = SyncQp::new(&f, 0, 64).unwrap();
    assert_eq!(q.read_u64(counter, k).unwrap(), procs * threads * iters);
    assert_eq!(q.read_u64(lock, k).unwrap(), 0, "lock released");
}

#[test]
fn killed_client_is_reaped_and_others_keep_working() {
    let s = Served::start(16 << 20);
    let f = s.client();
    let (mine, _, k) = f.alloc_chunk(0, 4096, false).unwrap();
    let before = f.node_stats(0).unwrap();
    let hold_len = 1u64 << 20;
    let (mut child, line) = spawn_until_line(Command::new(TESTKIT).args([
        "hold",
        s.socket.to_str().unwrap(),
        &hold_len.to_string(),
    ]));
    assert!(line.starts_with("ready"), "{line:?}");
    let during = f.node_stats(0).unwrap();
    assert_eq!(
        during.session_chunk_bytes,
        before.session_chunk_bytes + hold_len
    );
    assert_eq!(during.sessions_active, before.sessions_active + 1);

    // Another client works while the child runs, and after it is killed
    // mid-run (its mapping of the memfd still live at that moment).
    let mut q = SyncQp::new(&f, 0, 64).unwrap();
    q.faa(mine, k, 1).unwrap();
    child.kill().unwrap();
    child.wait().unwrap();

    let t0 = Instant::now();
    loop {
        let st = f.node_stats(0).unwrap();
        if st.sessions_reaped > before.sessions_reaped {
            assert_eq!(
                st.session_chunk_bytes, before.session_chunk_bytes,
                "dead client's chunk freed"
            );
            assert_eq!(st.chunks_reclaimed, before.chunks_reclaimed + 1);
            assert_eq!(st.sessions_active, before.sessions_active);
            break;
        }
        assert!(
            t0.elapsed() < Duration::from_secs(10),
            "session not reaped: {st:?}"
        );
        std::thread::sleep(Duration::from_millis(10));
    }
    assert_eq!(q.faa(mine, k, 1).unwrap(), 1);
    // Its memory can be allocated again.
    let (again, len, _) = f.alloc_chunk(0, hold_len, false).unwrap();
    assert_eq!(len, hold_len);
    f.free_chunk(again).unwrap();
}
