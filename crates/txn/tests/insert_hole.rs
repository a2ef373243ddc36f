//! Holes in a key's probe path: open addressing finds a key by probing
//! until its slot or the first empty one, so a slot before a key's slot on
//! its path must never be (or become) empty. Three ways a transaction
//! could leave one, each pinned here with keys chosen to share a would-be
//! slot:
//!
//! - two keys of one transaction going to the same empty slot: the first
//!   takes it, the second the next one; the transaction writes only the
//!   second (the first was a key to write it decided not to insert, or a
//!   key it only read absent);
//! - a coordinator killed half-way through its commit writes, after the
//!   dirty mark of its insert landed: another transaction's probe passes
//!   over that (non-empty) slot and inserts its key further on, and the
//!   roll-back must not empty the slot again.
//!
//! After each, the later key must be found by a probe (a fresh address
//! cache) and an insert of it must find it rather than duplicate it.

mod common;

use std::sync::Arc;
use std::time::Duration;

use dmkit_index::conformance::shm_fabric;
use dmkit_index::LeaseConfig;
use dmkit_runtime::Ctx;
use dmkit_txn::{addr_cache, AddrCache, Cached, CrashPoint, Database, TableSpec, TxnConfig};
use dmkit_txn::{Coordinator, TxnError};

/// [`common::with_txn`]'s result.
fn with_txn<T: 'static>(
    db: &Arc<Database>,
    cache: &AddrCache,
    body: impl for<'a> AsyncFnOnce(&'a mut Coordinator, &'a Ctx) -> T + 'static,
) -> T {
    common::with_txn(db, cache, body).0
}

/// Short enough to wait out in a test; nothing else contends for the
/// locks, so a live holder whose lease runs short just renews it.
const LEASE: LeaseConfig = LeaseConfig {
    lease: 30_000_000,
    skew: 2_000_000,
};

fn db(name: &str, hitchhike: bool) -> Arc<Database> {
    let db = Database::create(
        shm_fabric(2, 16 << 20),
        &format!("{name}-{hitchhike}"),
        TxnConfig {
            lease: LEASE,
            hitchhike,
            ..common::config()
        },
        // A few buckets: keys share home buckets.
        &[TableSpec::new("t", 8, 4)],
    )
    .unwrap();
    db.load(0, (0..0u64).map(|k| (k, vec![0; 8]))).unwrap();
    db
}

/// Two absent keys whose probes end at the same empty slot (found by
/// probing them, in transactions of their own, into an absent-key cache).
fn two_keys_one_slot(db: &Arc<Database>) -> (u64, u64) {
    let cache = addr_cache();
    let mut seen: Vec<(u64, u64)> = Vec::new();
    for k in 100..200u64 {
        with_txn(db, &cache, async move |c, ctx| {
            let mut t = c.begin(ctx);
            let i = t.read(0, k).unwrap();
            t.exec().await.unwrap();
            assert!(!t.exists(i));
            t.commit().await.unwrap();
        });
        let Some(Cached::Absent(s)) = cache.borrow().lookup(0, k) else {
            panic!("key {k} not cached absent");
        };
        if let Some(&(a, _)) = seen.iter().find(|&&(_, t)| t == s) {
            return (a, k);
        }
        seen.push((k, s));
    }
    panic!("no two keys share a slot");
}

/// Key `k` as a fresh probe sees it: its word 0, or None if absent.
fn lookup(db: &Arc<Database>, k: u64) -> Option<u64> {
    with_txn(db, &addr_cache(), async move |c, ctx| {
        let mut t = c.begin(ctx);
        let i = t.read(0, k).unwrap();
        t.exec().await.unwrap();
        let v = t.exists(i).then(|| t.word(i, 0));
        t.commit().await.unwrap();
        v
    })
}

/// Writes `v` to key `k` (insert or update) from a fresh cache; returns
/// whether the key existed.
fn upsert(db: &Arc<Database>, k: u64, v: u64) -> bool {
    with_txn(db, &addr_cache(), async move |c, ctx| {
        let mut t = c.begin(ctx);
        let i = t.write(0, k).unwrap();
        t.exec().await.unwrap();
        let existed = t.exists(i);
        t.put(i, &v.to_le_bytes()).unwrap();
        t.commit().await.unwrap();
        existed
    })
}

/// Records of key `k` in the table (present or deleted).
fn copies(db: &Arc<Database>, k: u64) -> usize {
    db.scan(0).unwrap().iter().filter(|r| r.key == k).count()
}

/// The checks after each scenario: `b` (word 0 = 7) is found by a fresh
/// probe and updated in place, `a` is absent, nothing is left locked.
fn b_is_found(db: &Arc<Database>, a: u64, b: u64) {
    assert_eq!(
        lookup(db, b),
        Some(7),
        "key {b} hidden behind an empty slot"
    );
    assert!(upsert(db, b, 8), "an insert of {b} did not find it");
    assert_eq!(copies(db, b), 1, "key {b} duplicated");
    assert_eq!(lookup(db, b), Some(8));
    assert_eq!(lookup(db, a), None);
    assert_eq!(db.stuck_records().unwrap(), 0);
    db.check_replicas().unwrap();
}

#[test]
fn a_key_to_write_left_unwritten_does_not_hide_the_next() {
    for hitchhike in [true, false] {
        let (db, a, b) = insert_beside("hole-ww", hitchhike, true);
        // The first key is insertable still, and both stay found.
        assert!(!upsert(&db, a, 9));
        assert_eq!((lookup(&db, a), lookup(&db, b)), (Some(9), Some(8)));
        assert_eq!(copies(&db, a), 1);
    }
}

#[test]
fn a_key_read_absent_does_not_hide_a_key_inserted_beside_it() {
    for hitchhike in [true, false] {
        insert_beside("hole-rw", hitchhike, false);
    }
}

/// One transaction adds two absent keys `a` and `b` that share a
/// would-be slot — `a` to write (`a_to_write`) or to read, `b` to write —
/// and inserts only `b`; then `b` must be found.
fn insert_beside(name: &str, hitchhike: bool, a_to_write: bool) -> (Arc<Database>, u64, u64) {
    let db = db(name, hitchhike);
    let (a, b) = two_keys_one_slot(&db);
    with_txn(&db, &addr_cache(), async move |c, ctx| {
        let mut t = c.begin(ctx);
        let ia = if a_to_write {
            t.write(0, a)
        } else {
            t.read(0, a)
        }
        .unwrap();
        let ib = t.write(0, b).unwrap();
        t.exec().await.unwrap();
        assert!(!t.exists(ia) && !t.exists(ib));
        t.put(ib, &7u64.to_le_bytes()).unwrap();
        t.commit().await.unwrap();
    });
    b_is_found(&db, a, b);
    (db, a, b)
}

#[test]
fn a_rolled_back_insert_does_not_hide_a_key_inserted_past_it() {
    let db = db("hole-crash", true);
    let (a, b) = two_keys_one_slot(&db);
    // The victim: inserts `a` and dies half-way through its commit writes
    // (the primary's dirty mark and record landed, the backup's not).
    let err = with_txn(&db, &addr_cache(), async move |c, ctx| {
        c.crash_at(CrashPoint::MidCommit, 1);
        let mut t = c.begin(ctx);
        let ia = t.write(0, a).unwrap();
        t.exec().await.unwrap();
        t.put(ia, &5u64.to_le_bytes()).unwrap();
        t.commit().await.unwrap_err()
    });
    assert!(
        matches!(err, TxnError::Crashed(CrashPoint::MidCommit)),
        "{err}"
    );
    // `b`'s probe passes over `a`'s dirty slot (another key) and inserts
    // `b` in the next one, without meeting the dead coordinator's lock.
    assert!(!upsert(&db, b, 7));
    std::thread::sleep(Duration::from_nanos(LEASE.lease + 3 * LEASE.skew));
    let rep = db.recover_all().unwrap();
    assert_eq!(rep.rolled_back.len(), 1, "{rep:?}");
    b_is_found(&db, a, b);
    // `a` can be inserted again, once.
    assert!(!upsert(&db, a, 9));
    assert_eq!((lookup(&db, a), copies(&db, a)), (Some(9), 1));
}
