//! SmallBank on coordinators in three processes at once over shared
//! memory (forks of this test; the embedded memory nodes are shared memfd
//! mappings), each process a worker of several coordinators preempted at
//! random (`Coordinator::preempt_at_random`). Each child sends its
//! committed history and its effect on the total balance back over a
//! socket; the parent checks the union for serializability, the total
//! balance exactly, the replicas and the locks. This file holds one test,
//! so the parent forks while its other threads (the harness's) wait idle.

mod common;

use std::io::{Read, Write};
use std::os::unix::net::UnixStream;
use std::sync::Arc;

use dmkit_index::conformance::shm_fabric;
use dmkit_runtime::RuntimeConfig;
use dmkit_txn::workload::smallbank::SmallBank;
use dmkit_txn::workload::Workload;
use dmkit_txn::{check_serializable, TxnRecord};
use nix::sys::wait::{waitpid, WaitStatus};
use nix::unistd::{fork, ForkResult};

const CHILDREN: usize = 3;

fn encode(out: &common::RunOut) -> Vec<u8> {
    let mut w = vec![out.effect as u64, out.history.len() as u64];
    for t in &out.history {
        w.push(t.id);
        for set in [&t.reads, &t.writes] {
            w.push(set.len() as u64);
            for &(tb, slot, v) in set {
                w.extend([tb as u64, slot, v]);
            }
        }
    }
    w.iter().flat_map(|x| x.to_le_bytes()).collect()
}

fn decode(bytes: &[u8]) -> (i64, Vec<TxnRecord>) {
    let mut w = bytes
        .chunks_exact(8)
        .map(|c| u64::from_le_bytes(c.try_into().unwrap()));
    let mut next = || w.next().expect("a whole history");
    let effect = next() as i64;
    let n = next();
    let mut h = Vec::new();
    for _ in 0..n {
        let mut t = TxnRecord {
            id: next(),
            ..Default::default()
        };
        for k in 0..2 {
            let m = next();
            for _ in 0..m {
                let e = (next() as u16, next(), next());
                if k == 0 {
                    t.reads.push(e);
                } else {
                    t.writes.push(e);
                }
            }
        }
        h.push(t);
    }
    (effect, h)
}

#[test]
fn coordinators_in_three_processes_stay_serializable() {
    let w = Arc::new(SmallBank {
        accounts: 60,
        hot: 8,
    });
    let db = common::loaded(
        shm_fabric(2, 32 << 20),
        "procs",
        common::config(),
        w.as_ref(),
    );
    let mut kids = Vec::new();
    for ci in 0..CHILDREN {
        let (mine, theirs) = UnixStream::pair().unwrap();
        // SAFETY: the child only runs this crate's code on its own fresh
        // worker over the shared mappings, writes to its socket and exits;
        // the parent's other threads are the test harness's, idle in a wait.
        match unsafe { fork() }.expect("fork") {
            ForkResult::Child => {
                drop(mine);
                let mut theirs = theirs;
                let out =
                    common::run_worker(&db, &w, ci, 3, 150, 11, RuntimeConfig::default(), 100);
                theirs.write_all(&encode(&out)).unwrap();
                std::process::exit(0);
            }
            ForkResult::Parent { child } => {
                drop(theirs);
                kids.push((child, mine));
            }
        }
    }
    // Readers only once every child is forked (a thread of ours inside
    // malloc at a fork would leave the child's allocator locked).
    let kids: Vec<_> = kids
        .into_iter()
        .map(|(pid, mut s)| {
            let reader = std::thread::spawn(move || {
                let mut b = Vec::new();
                s.read_to_end(&mut b).unwrap();
                b
            });
            (pid, reader)
        })
        .collect();
    let (mut effect, mut history) = (0, Vec::new());
    for (pid, reader) in kids {
        let bytes = reader.join().unwrap();
        let status = waitpid(pid, None).unwrap();
        assert!(
            matches!(status, WaitStatus::Exited(_, 0)),
            "child {pid}: {status:?}"
        );
        let (e, h) = decode(&bytes);
        effect += e;
        history.extend(h);
    }
    assert!(history.len() > 800, "committed {}", history.len());
    let ids: std::collections::HashSet<u64> = history.iter().map(|t| t.id).collect();
    assert_eq!(
        ids.len(),
        history.len(),
        "transaction ids are unique across processes"
    );
    check_serializable(&history, &[]).unwrap();
    w.check(&db, effect).unwrap();
    db.check_replicas().unwrap();
    assert_eq!(db.stuck_records().unwrap(), 0);
    db.destroy().unwrap();
}
