//! Absent keys in the address cache (`TxnConfig::cache_absent`): a key a
//! probe found absent is cached with the empty slot it would go to; a
//! later read of it READs only that slot's lock and version, and probes
//! again when the slot was taken since — by the key itself (then it is
//! found) or by another key (then it is absent further on).

mod common;

use std::sync::Arc;

use dmkit_index::conformance::shm_fabric;
use dmkit_txn::{addr_cache, AddrCache, Cached, Database, TableSpec, TxnConfig};

/// Reads `keys` in one transaction: whether each exists, word 0 of each.
fn read_keys(db: &Arc<Database>, cache: &AddrCache, keys: Vec<u64>) -> (Vec<(bool, u64)>, u64) {
    common::with_txn(db, cache, async move |c, ctx| {
        let mut t = c.begin(ctx);
        let ids: Vec<_> = keys.iter().map(|&k| t.read(0, k).unwrap()).collect();
        t.exec().await.unwrap();
        let seen = ids.iter().map(|&i| (t.exists(i), t.word(i, 0))).collect();
        t.commit().await.unwrap();
        seen
    })
}

/// Inserts `key` with word 0 = `v`.
fn insert(db: &Arc<Database>, key: u64, v: u64) {
    // A cache of its own: the reader's cache does not learn of it.
    common::with_txn(db, &addr_cache(), async move |c, ctx| {
        let mut t = c.begin(ctx);
        let i = t.write(0, key).unwrap();
        t.exec().await.unwrap();
        assert!(!t.exists(i), "key {key} was there already");
        t.put(i, &[v.to_le_bytes(), [0; 8]].concat()).unwrap();
        t.commit().await.unwrap();
    });
}

fn db(name: &str, cache_absent: bool) -> Arc<Database> {
    let db = Database::create(
        shm_fabric(2, 16 << 20),
        name,
        TxnConfig {
            cache_absent,
            ..common::config()
        },
        &[TableSpec::new("t", 16, 256)],
    )
    .unwrap();
    db.load(
        0,
        (0..128u64).map(|k| (k, [(k + 7).to_le_bytes(), [0; 8]].concat())),
    )
    .unwrap();
    db
}

#[test]
fn an_absent_key_is_read_by_its_slot_and_probed_again_once_taken() {
    let db = db("absent-1", true);
    let cache = addr_cache();
    // One transaction per key: two keys of one transaction that would go
    // to the same empty slot do not both end there (see below).
    let absent: Vec<u64> = (1000..1060).collect();
    let mut probe_bytes = 0;
    for &k in &absent {
        let (seen, bytes) = read_keys(&db, &cache, vec![k]);
        assert_eq!(seen, vec![(false, 0)]);
        probe_bytes += bytes;
    }
    let slots: Vec<u64> = absent
        .iter()
        .map(|&k| match cache.borrow().lookup(0, k) {
            Some(Cached::Absent(s)) => s,
            other => panic!("key {k}: {other:?} cached, not its absent slot"),
        })
        .collect();
    // Again, in one transaction (those with distinct slots): one 16-byte
    // READ per key (lock and version) instead of a bucket of four 40-byte
    // records, plus validation's 16 bytes each.
    let mut distinct: Vec<u64> = Vec::new();
    for (k, s) in absent.iter().zip(&slots) {
        if !absent.iter().zip(&slots).any(|(o, t)| t == s && o < k) {
            distinct.push(*k);
        }
    }
    let n = distinct.len() as u64;
    assert!(n > 30, "{n}");
    let (seen, hint_bytes) = read_keys(&db, &cache, distinct);
    assert!(seen.iter().all(|&s| s == (false, 0)));
    assert_eq!(hint_bytes, n * (16 + 16));
    assert!(probe_bytes >= 60 * 4 * 40, "{probe_bytes}");

    // Two absent keys that would go to the same empty slot: insert one
    // (with another cache); the other's slot is now taken.
    let (i, j) = (0..slots.len())
        .flat_map(|i| (i + 1..slots.len()).map(move |j| (i, j)))
        .find(|&(i, j)| slots[i] == slots[j])
        .expect("two of 60 keys share a would-be slot (128 buckets)");
    let (mine, other) = (absent[i], absent[j]);
    insert(&db, mine, 42);
    let (seen, _) = read_keys(&db, &cache, vec![mine, other]);
    assert_eq!(seen, vec![(true, 42), (false, 0)]);
    assert_eq!(cache.borrow().lookup(0, mine), Some(Cached::Slot(slots[i])));
    // `other` was probed again (its cached slot is `mine`'s now) and is
    // cached absent further on.
    let fresh = match cache.borrow().lookup(0, other) {
        Some(Cached::Absent(s)) => s,
        c => panic!("{c:?}"),
    };
    assert_ne!(fresh, slots[j], "the taken slot is cached again");
    let (seen, bytes) = read_keys(&db, &cache, vec![other]);
    assert_eq!((seen, bytes), (vec![(false, 0)], 16));
    // The other one inserted too: found where its fresh probe said.
    insert(&db, other, 43);
    let (seen, _) = read_keys(&db, &cache, vec![other, mine]);
    assert_eq!(seen, vec![(true, 43), (true, 42)]);
    assert!(matches!(
        cache.borrow().lookup(0, other),
        Some(Cached::Slot(_))
    ));
    db.check_replicas().unwrap();
}

#[test]
fn without_the_switch_absent_keys_are_not_cached() {
    let db = db("absent-2", false);
    let cache = addr_cache();
    let (_, first) = read_keys(&db, &cache, vec![1000, 1001, 5]);
    assert_eq!(cache.borrow().lookup(0, 1000), None);
    assert!(matches!(cache.borrow().lookup(0, 5), Some(Cached::Slot(_))));
    let (seen, again) = read_keys(&db, &cache, vec![1000, 1001, 5]);
    assert_eq!(seen, vec![(false, 0), (false, 0), (true, 12)]);
    // Key 5 is fetched from its cached slot now, the absent ones probed
    // again.
    assert!(again < first && again > 2 * 4 * 40, "{again} of {first}");
}
