//! Leases of a long transaction: one that outlives its lease between
//! `exec` and `commit` renews its locks and commits, unless another
//! client broke an expired lock meanwhile — then it aborts (nothing was
//! logged or written) and commits on its retry, after the breaker's.

use std::cell::{Cell, RefCell};
use std::rc::Rc;
use std::sync::Arc;

use dmkit_index::conformance::shm_fabric;
use dmkit_index::LeaseConfig;
use dmkit_runtime::{Ctx, Worker};
use dmkit_txn::{addr_cache, AbortReason, Coordinator, Database, TableSpec, TxnConfig, TxnError};

/// 20 ms leases; the long transaction sleeps 60 ms holding its lock (or,
/// in the second test, until another client broke it and committed).
const LEASE: LeaseConfig = LeaseConfig {
    lease: 20_000_000,
    skew: 1_000_000,
};
const LONG: u64 = 60_000_000;

fn db(name: &str) -> Arc<Database> {
    let cfg = TxnConfig {
        lease: LEASE,
        max_coordinators: 8,
        ..TxnConfig::default()
    };
    let db = Database::create(
        shm_fabric(2, 8 << 20),
        name,
        cfg,
        &[TableSpec::new("t", 8, 16)],
    )
    .unwrap();
    db.load(0, (0..16u64).map(|k| (k, 100u64.to_le_bytes().to_vec())))
        .unwrap();
    db
}

/// What the application does between its transaction's read and commit.
enum Think {
    Nothing,
    /// Sleeps this many ns.
    Sleep(u64),
    /// Sleeps until the flag is set (and at least the lease).
    Until(Rc<Cell<bool>>),
}

/// Adds `d` to record `key`, thinking between its read and its commit (a
/// slow application).
async fn add(
    c: &mut Coordinator,
    ctx: &Ctx,
    key: u64,
    d: u64,
    think: Think,
) -> Result<(), TxnError> {
    let mut t = c.begin(ctx);
    let i = t.write(0, key)?;
    t.exec().await?;
    let v = t.word(i, 0);
    match think {
        Think::Nothing => {}
        Think::Sleep(ns) => ctx.sleep(ns).await,
        Think::Until(flag) => {
            ctx.sleep(LEASE.lease).await;
            while !flag.get() {
                ctx.sleep(1_000_000).await;
            }
        }
    }
    t.put(i, &(v + d).to_le_bytes())?;
    t.commit().await
}

async fn value(c: &mut Coordinator, ctx: &Ctx, key: u64) -> u64 {
    let mut t = c.begin(ctx);
    let i = t.read(0, key).unwrap();
    t.exec().await.unwrap();
    let v = t.word(i, 0);
    t.commit().await.unwrap();
    v
}

fn worker(db: &Arc<Database>, tasks: usize) -> Worker {
    Worker::builder(db.fabric().as_ref())
        .tasks(tasks)
        .local(db.local_layout())
        .build()
        .unwrap()
}

#[test]
fn a_transaction_longer_than_its_lease_renews_and_commits() {
    let db = db("lease-renew");
    let mut wk = worker(&db, 1);
    let mut c = db.coordinator(&addr_cache()).unwrap();
    let out = Rc::new(RefCell::new(None));
    let o = out.clone();
    wk.spawn(move |ctx| async move {
        let r = add(&mut c, &ctx, 3, 5, Think::Sleep(LONG)).await;
        let alive = !c.is_dead();
        let v = value(&mut c, &ctx, 3).await;
        *o.borrow_mut() = Some((r, alive, v));
    });
    wk.run();
    let (r, alive, v) = out.borrow_mut().take().unwrap();
    r.unwrap();
    assert!(alive);
    assert_eq!(v, 105);
    db.check_replicas().unwrap();
    assert_eq!(db.stuck_records().unwrap(), 0);
    db.destroy().unwrap();
}

#[test]
fn a_lease_broken_while_thinking_aborts_and_the_retry_commits() {
    let db = db("lease-broken");
    let mut wk = worker(&db, 2);
    let cache = addr_cache();
    let (mut slow, mut fast) = (
        db.coordinator(&cache).unwrap(),
        db.coordinator(&cache).unwrap(),
    );
    let out = Rc::new(RefCell::new(None));
    let o = out.clone();
    // The slow one thinks until the fast one committed (however the
    // threads are scheduled).
    let done = Rc::new(Cell::new(false));
    let flag = done.clone();
    wk.spawn(move |ctx| async move {
        let first = add(&mut slow, &ctx, 3, 5, Think::Until(flag)).await;
        let alive = !slow.is_dead();
        let retry = add(&mut slow, &ctx, 3, 5, Think::Nothing).await;
        let v = value(&mut slow, &ctx, 3).await;
        *o.borrow_mut() = Some((first, alive, retry, v));
    });
    let fast_out = Rc::new(RefCell::new(None));
    let fo = fast_out.clone();
    wk.spawn(move |ctx| async move {
        // Past the slow one's lease (and skew), while it still thinks.
        ctx.sleep(LEASE.lease + 5 * LEASE.skew).await;
        let mut tries = 0;
        let r = loop {
            tries += 1;
            match add(&mut fast, &ctx, 3, 1000, Think::Nothing).await {
                Err(e) if e.retryable() && tries < 1000 => continue,
                r => break r,
            }
        };
        done.set(true);
        *fo.borrow_mut() = Some((r, tries, ctx.now()));
    });
    wk.run();
    let (first, alive, retry, v) = out.borrow_mut().take().unwrap();
    let (fast_r, tries, _) = fast_out.borrow_mut().take().unwrap();
    fast_r.unwrap();
    assert!(tries >= 2, "the fast one first met the slow one's lock");
    assert!(
        matches!(first, Err(TxnError::Abort(AbortReason::LockHeld))),
        "{first:?}"
    );
    assert!(alive, "a lease lost before logging is a plain abort");
    retry.unwrap();
    assert_eq!(v, 1105, "the breaker's commit, then the retry's");
    db.check_replicas().unwrap();
    assert_eq!(db.stuck_records().unwrap(), 0);
    db.destroy().unwrap();
}
