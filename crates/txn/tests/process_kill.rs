//! Coordinators in a child process killed with SIGKILL at whatever point
//! of a transaction they were (no fault-injection switch: the kernel picks
//! the instant), over shared memory. After each kill and a recovery pass
//! (its locks expire by lease; its undo log rolls its transaction back or
//! forward): nothing locked or dirty, replicas byte-identical, and the
//! bank's total — every transaction a transfer — exact.
//!
//! The child is a `fork` of this test process: the embedded memory nodes
//! are shared memfd mappings, so both see the same remote memory. This
//! file holds one test, so the parent forks while its other threads (the
//! harness's) wait idle.

use std::sync::Arc;
use std::time::Duration;

use dmkit_index::conformance::shm_fabric;
use dmkit_index::LeaseConfig;
use dmkit_runtime::rng::Rng;
use dmkit_runtime::Worker;
use dmkit_txn::{addr_cache, Database, TableSpec, TxnConfig, TxnError};
use nix::sys::signal::{kill, Signal};
use nix::sys::wait::waitpid;
use nix::unistd::{fork, ForkResult};

const ACCOUNTS: u64 = 32;
const LEASE: LeaseConfig = LeaseConfig {
    lease: 100_000_000,
    skew: 10_000_000,
};

/// Runs transfers on 4 coordinators until killed.
fn child(db: &Arc<Database>, seed: u64) -> ! {
    let mut w = Worker::builder(db.fabric().as_ref())
        .tasks(4)
        .local(db.local_layout())
        .build()
        .expect("worker");
    let cache = addr_cache();
    for k in 0..4 {
        let mut coord = db.coordinator(&cache).expect("coordinator");
        let mut rng = Rng::new(seed * 10 + k);
        w.spawn(move |ctx| async move {
            loop {
                let a = rng.below(ACCOUNTS);
                let b = (a + 1 + rng.below(ACCOUNTS - 1)) % ACCOUNTS;
                let r: Result<(), TxnError> = async {
                    let mut t = coord.begin(&ctx);
                    let (x, y) = (t.write(0, a)?, t.write(0, b)?);
                    t.exec().await?;
                    let (bx, by) = (t.word(x, 0), t.word(y, 0));
                    if bx > 0 {
                        t.put(x, &(bx - 1).to_le_bytes())?;
                        t.put(y, &(by + 1).to_le_bytes())?;
                    }
                    t.commit().await
                }
                .await;
                match r {
                    Ok(()) => {}
                    Err(e) if e.retryable() => {}
                    Err(e) => panic!("child: {e}"),
                }
            }
        });
    }
    w.run();
    unreachable!("the transfers never end");
}

fn total(db: &Database) -> u64 {
    db.scan(0)
        .unwrap()
        .iter()
        .map(|r| u64::from_le_bytes(r.payload[..8].try_into().unwrap()))
        .sum()
}

#[test]
fn sigkilled_coordinators_are_recovered() {
    let db = Database::create(
        shm_fabric(2, 16 << 20),
        "kill",
        TxnConfig {
            max_coordinators: 256,
            lease: LEASE,
            ..TxnConfig::default()
        },
        &[TableSpec::new("accounts", 8, ACCOUNTS)],
    )
    .unwrap();
    db.load(0, (0..ACCOUNTS).map(|k| (k, 100u64.to_le_bytes().to_vec())))
        .unwrap();
    let mut rolled = 0;
    for round in 0..6u64 {
        // SAFETY: the child only runs this crate's code on its own fresh
        // worker over the shared mappings and never returns; the parent's
        // other threads are the test harness's, idle in a wait.
        match unsafe { fork() }.expect("fork") {
            ForkResult::Child => child(&db, round),
            ForkResult::Parent { child } => {
                std::thread::sleep(Duration::from_millis(40 + 17 * round));
                kill(child, Signal::SIGKILL).unwrap();
                waitpid(child, None).unwrap();
            }
        }
        std::thread::sleep(Duration::from_nanos(LEASE.lease + 3 * LEASE.skew));
        let rep = db.recover_all().unwrap();
        rolled += rep.rolled_back.len() + rep.rolled_forward.len();
        assert_eq!(db.stuck_records().unwrap(), 0, "round {round}: {rep:?}");
        db.check_replicas()
            .unwrap_or_else(|e| panic!("round {round}: {e}; {rep:?}"));
        assert_eq!(total(&db), 100 * ACCOUNTS, "round {round}: {rep:?}");
    }
    // The kills land mid-transaction often enough that something was
    // recovered (a transfer is a few µs; the child runs tens of ms).
    eprintln!("transactions recovered over 6 kills: {rolled}");
    let changed = db
        .scan(0)
        .unwrap()
        .iter()
        .any(|r| r.payload[..8] != 100u64.to_le_bytes());
    assert!(changed, "the children committed transfers");
}
