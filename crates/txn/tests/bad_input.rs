//! Bad input gives typed errors and leaves the database as it was: an
//! unknown table, a value over the record size, a transaction over the
//! undo log's capacity or the item limit, a table over the size limit; an
//! unknown key reads as absent.

mod common;

use std::cell::RefCell;
use std::rc::Rc;
use std::sync::Arc;

use dmkit_index::conformance::shm_fabric;
use dmkit_runtime::{Ctx, Worker};
use dmkit_txn::{addr_cache, Database, Row, TableSpec, TxnConfig, TxnError};

/// A row: slot, key, payload, version, lock.
type Image = (u64, u64, Vec<u8>, u64, u64);

/// Every table's rows.
fn image(db: &Database) -> Vec<Vec<Image>> {
    (0..db.table_count() as u16)
        .map(|t| {
            db.scan(t)
                .unwrap()
                .into_iter()
                .map(|r: Row| (r.slot, r.key, r.payload, r.version.0, r.lock))
                .collect()
        })
        .collect()
}

/// Runs `body` with a coordinator on a fresh worker; returns its result.
fn with_txn<T: 'static>(
    db: &Arc<Database>,
    body: impl for<'a> AsyncFnOnce(&'a mut dmkit_txn::Coordinator, &'a Ctx) -> T + 'static,
) -> T {
    let mut w = Worker::builder(db.fabric().as_ref())
        .local(db.local_layout())
        .build()
        .unwrap();
    let mut coord = db.coordinator(&addr_cache()).unwrap();
    let out = Rc::new(RefCell::new(None));
    let o = out.clone();
    w.spawn(move |ctx| async move {
        *o.borrow_mut() = Some(body(&mut coord, &ctx).await);
    });
    w.run();
    let r = out.borrow_mut().take().expect("the task finished");
    r
}

fn bank(cfg: TxnConfig, name: &str) -> Arc<Database> {
    let db = Database::create(
        shm_fabric(2, 16 << 20),
        name,
        cfg,
        &[TableSpec::new("accounts", 16, 64)],
    )
    .unwrap();
    db.load(
        0,
        (0..32u64).map(|k| (k, [k.to_le_bytes(), [0; 8]].concat())),
    )
    .unwrap();
    db
}

#[test]
fn unknown_table_and_oversized_value_are_typed_and_write_nothing() {
    let db = bank(common::config(), "bad-1");
    let before = image(&db);
    let r = with_txn(&db, async move |c, ctx| {
        let mut t = c.begin(ctx);
        let e = t.read(7, 1).unwrap_err();
        assert!(matches!(e, TxnError::UnknownTable(7)), "{e}");
        let a = t.write(0, 1).unwrap();
        let b = t.write(0, 2).unwrap();
        t.exec().await.unwrap();
        t.put(a, &[1; 16]).unwrap();
        let e = t.put(b, &[1; 17]).unwrap_err();
        assert!(
            matches!(
                e,
                TxnError::ValueTooLarge {
                    len: 17,
                    max: 16,
                    ..
                }
            ),
            "{e}"
        );
        // The application gives up: nothing of `a` lands.
        t.abort().await
    });
    r.unwrap();
    assert_eq!(image(&db), before);
    assert_eq!(db.stuck_records().unwrap(), 0);
}

#[test]
fn a_transaction_over_the_log_or_the_item_limit_writes_nothing() {
    // Room in the log for the header and two 16-byte records' entries.
    let entry = 32 + 8 + 16;
    let cfg = TxnConfig {
        log_bytes: 32 + 2 * entry,
        max_items: 4,
        ..common::config()
    };
    let db = bank(cfg, "bad-2");
    let before = image(&db);
    let r = with_txn(&db, async move |c, ctx| {
        let mut t = c.begin(ctx);
        let ids: Vec<_> = (0..3).map(|k| t.write(0, k).unwrap()).collect();
        t.exec().await.unwrap();
        for &i in &ids {
            t.put(i, &[9; 16]).unwrap();
        }
        let e = t.commit().await.unwrap_err();
        assert!(
            matches!(e, TxnError::LogFull { capacity, .. } if capacity == 32 + 2 * entry),
            "{e}"
        );
        let mut t = c.begin(ctx);
        for k in 0..4 {
            t.read(0, k).unwrap();
        }
        let e = t.read(0, 4).unwrap_err();
        assert!(matches!(e, TxnError::TooManyItems { max: 4 }), "{e}");
        t.abort().await.unwrap();
        // Two records fit: that commits.
        let mut t = c.begin(ctx);
        let a = t.write(0, 1).unwrap();
        t.exec().await.unwrap();
        t.put(a, &[5; 16]).unwrap();
        t.commit().await
    });
    r.unwrap();
    let after = image(&db);
    assert_eq!(db.stuck_records().unwrap(), 0);
    // Only key 1 changed.
    let changed: Vec<u64> = before[0]
        .iter()
        .zip(&after[0])
        .filter(|(x, y)| x != y)
        .map(|(x, _)| x.1)
        .collect();
    assert_eq!(changed, vec![1]);
    db.check_replicas().unwrap();
}

#[test]
fn an_unknown_key_reads_as_absent_and_bad_tables_are_refused() {
    let db = bank(common::config(), "bad-3");
    let r = with_txn(&db, async move |c, ctx| {
        let mut t = c.begin(ctx);
        let a = t.read(0, 1_000).unwrap();
        let b = t.read(0, 3).unwrap();
        t.exec().await.unwrap();
        let seen = (t.exists(a), t.exists(b), t.word(b, 0));
        t.commit().await.unwrap();
        seen
    });
    assert_eq!(r, (false, true, 3));
    for spec in [
        TableSpec::new("huge", (1 << 20) + 1, 4),
        TableSpec::new("empty", 8, 0),
    ] {
        let r = Database::create(
            shm_fabric(1, 16 << 20),
            "bad-4",
            TxnConfig::default(),
            &[spec],
        );
        let Err(e) = r else {
            panic!("a bad table spec was accepted");
        };
        assert!(matches!(e, TxnError::Config(_)), "{e}");
    }
}
