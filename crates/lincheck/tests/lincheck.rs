//! The checker against histories with known answers, real concurrent maps
//! (one correct, one that serves stale reads), pending operations and size.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use dmkit_lincheck::{check, check_key, earliest_failing_cut, MapOp, MapRet, Record, Recorder};

fn rec(
    client: u32,
    op: MapOp<u64>,
    invoked: u64,
    ret: Option<(u64, MapRet<u64>)>,
) -> Record<u8, u64> {
    Record {
        client,
        key: 0,
        op,
        invoked,
        returned: ret,
    }
}

use MapOp::*;
use MapRet::*;

#[test]
fn sequential_and_overlapping_histories() {
    // insert(1) then search → 1: fine.
    let h = vec![
        rec(0, Insert(1), 1, Some((2, Done(true)))),
        rec(1, Search, 3, Some((4, Found(Some(1))))),
    ];
    assert!(check_key(&h, &None));
    // insert(1) completes, later search → None: stale read.
    let h = vec![
        rec(0, Insert(1), 1, Some((2, Done(true)))),
        rec(1, Search, 3, Some((4, Found(None)))),
    ];
    assert!(!check_key(&h, &None));
    // Overlapping: search may see either.
    for seen in [None, Some(1)] {
        let h = vec![
            rec(0, Insert(1), 1, Some((4, Done(true)))),
            rec(1, Search, 2, Some((3, Found(seen)))),
        ];
        assert!(check_key(&h, &None), "overlapping search may see {seen:?}");
    }
    // Two inserts of the same key cannot both succeed.
    let h = vec![
        rec(0, Insert(1), 1, Some((3, Done(true)))),
        rec(1, Insert(2), 2, Some((4, Done(true)))),
    ];
    assert!(!check_key(&h, &None));
    // Delete / update semantics.
    let h = vec![
        rec(0, Upsert(5), 1, Some((2, Unit))),
        rec(0, Update(6), 3, Some((4, Done(true)))),
        rec(1, Delete, 5, Some((6, Done(true)))),
        rec(1, Update(7), 7, Some((8, Done(false)))),
        rec(0, Search, 9, Some((10, Found(None)))),
    ];
    assert!(check_key(&h, &None));
    // A read must not see a value from the future.
    let h = vec![
        rec(1, Search, 1, Some((2, Found(Some(9))))),
        rec(0, Upsert(9), 3, Some((4, Unit))),
    ];
    assert!(!check_key(&h, &None));
    // ... but it may if the key started there.
    assert!(check_key(&h, &Some(9)));
}

#[test]
fn pending_operations_may_or_may_not_take_effect() {
    // A crashed insert: later reads may see it or not, but consistently.
    let base = vec![rec(0, Insert(3), 1, None)];
    let mut seen = base.clone();
    seen.push(rec(1, Search, 2, Some((3, Found(Some(3))))));
    seen.push(rec(1, Search, 4, Some((5, Found(Some(3))))));
    assert!(check_key(&seen, &None));
    let mut not_seen = base.clone();
    not_seen.push(rec(1, Search, 2, Some((3, Found(None)))));
    assert!(check_key(&not_seen, &None));
    // Seen, then gone without any delete: impossible.
    let mut flicker = base;
    flicker.push(rec(1, Search, 2, Some((3, Found(Some(3))))));
    flicker.push(rec(1, Search, 4, Some((5, Found(None)))));
    assert!(!check_key(&flicker, &None));
}

/// A map with a lock is linearizable; the recorded history must pass.
#[test]
fn a_correct_concurrent_map_passes() {
    let map: Arc<Mutex<HashMap<u8, u64>>> = Arc::default();
    let rec = Arc::new(Recorder::new());
    std::thread::scope(|s| {
        for c in 0..4u32 {
            let (map, rec) = (map.clone(), rec.clone());
            s.spawn(move || {
                let mut x = c as u64 * 7919 + 1;
                for i in 0..3000u64 {
                    x = x
                        .wrapping_mul(6364136223846793005)
                        .wrapping_add(1442695040888963407);
                    let key = ((x >> 33) % 6) as u8;
                    let v = i * 10 + c as u64;
                    let op = match (x >> 40) % 5 {
                        0 => Search,
                        1 => Insert(v),
                        2 => Update(v),
                        3 => Upsert(v),
                        _ => Delete,
                    };
                    let e = rec.invoke(c, key, op.clone());
                    let r = {
                        let mut m = map.lock().unwrap();
                        match op {
                            Search => Found(m.get(&key).copied()),
                            Insert(v) => Done(match m.entry(key) {
                                std::collections::hash_map::Entry::Occupied(_) => false,
                                std::collections::hash_map::Entry::Vacant(e) => {
                                    e.insert(v);
                                    true
                                }
                            }),
                            Update(v) => Done(m.get_mut(&key).map(|s| *s = v).is_some()),
                            Upsert(v) => {
                                m.insert(key, v);
                                Unit
                            }
                            Delete => Done(m.remove(&key).is_some()),
                        }
                    };
                    rec.ret(e, r);
                }
            });
        }
    });
    let h = rec.history();
    assert_eq!(h.len(), 12_000);
    check(&h, |_| None).unwrap();
}

/// A map that sometimes answers a search from a stale per-client cache is
/// not linearizable; the checker finds it and reports a tiny witness.
#[test]
fn a_map_with_stale_reads_is_caught_with_a_small_witness() {
    let map: Arc<Mutex<HashMap<u8, u64>>> = Arc::default();
    let rec = Arc::new(Recorder::new());
    std::thread::scope(|s| {
        for c in 0..3u32 {
            let (map, rec) = (map.clone(), rec.clone());
            s.spawn(move || {
                let mut cache: HashMap<u8, Option<u64>> = HashMap::new();
                for i in 0..2000u64 {
                    let key = (i % 3) as u8;
                    if (i / 3 + c as u64).is_multiple_of(2) {
                        let e = rec.invoke(c, key, Upsert(i * 10 + c as u64));
                        map.lock().unwrap().insert(key, i * 10 + c as u64);
                        rec.ret(e, Unit);
                    } else {
                        let e = rec.invoke(c, key, Search);
                        // Bug: every 7th read is served from the client's cache.
                        let v = match cache.get(&key) {
                            Some(old) if i % 7 == 0 => *old,
                            _ => map.lock().unwrap().get(&key).copied(),
                        };
                        cache.insert(key, v);
                        rec.ret(e, Found(v));
                    }
                }
            });
        }
    });
    let v = check(&rec.history(), |_| None).unwrap_err();
    assert!(
        v.ops.len() <= 4,
        "witness should be tiny, got {} ops:\n{v}",
        v.ops.len()
    );
    assert!(v.key_ops > 100);
    // The witness itself is a violation, and it contains the stale read.
    assert!(!check_key(&v.ops, &None), "{v}");
    assert!(v.ops.iter().any(|r| r.op == Search), "{v}");
    assert!(v.to_string().contains("is not linearizable"));
    // The cut lands on a completed operation's return (a read that came back
    // stale), and a linearizable history has no failing cut.
    let h = rec.history();
    let t = earliest_failing_cut(&h, |_| None).expect("a violation");
    assert!(h
        .iter()
        .any(|r| r.op == Search && r.returned.as_ref().is_some_and(|(rt, _)| *rt == t)));
    let fine: Vec<_> = h.iter().filter(|r| r.op != Search).cloned().collect();
    assert_eq!(earliest_failing_cut(&fine, |_| None), None);
}

#[test]
fn long_histories_stay_cheap_thanks_to_per_key_checking() {
    // 200 000 operations over 2 000 keys, 4 clients interleaved.
    let mut h = Vec::new();
    let mut t = 1u64;
    let mut state: HashMap<u32, u64> = HashMap::new();
    for i in 0..50_000u64 {
        for c in 0..4u32 {
            // Clients 0 and 1 (and 2 and 3) share a key each round.
            let key = (((i * 4 + c as u64) / 2) * 2654435761 % 2000) as u32;
            let op = if c % 2 == 0 {
                MapOp::Upsert(i)
            } else {
                MapOp::Search
            };
            let ret = match op {
                MapOp::Upsert(v) => {
                    state.insert(key, v);
                    MapRet::Unit
                }
                _ => MapRet::Found(state.get(&key).copied()),
            };
            h.push(Record {
                client: c,
                key,
                op,
                invoked: t,
                returned: Some((t + 1, ret)),
            });
            t += 2;
        }
    }
    check(&h, |_| None).unwrap();
    // A stale read planted in the middle of one key is found among them all.
    let idx = h
        .iter()
        .rposition(|r| {
            r.op == MapOp::Search && matches!(r.returned, Some((_, MapRet::Found(Some(_)))))
        })
        .unwrap();
    let (key, t_read) = (h[idx].key, h[idx].invoked);
    h.push(Record {
        client: 9,
        key,
        op: MapOp::Search,
        invoked: t_read + 2 * 4 * 10_000,
        returned: Some((t_read + 2 * 4 * 10_000 + 1, MapRet::Found(None))),
    });
    let v = check(&h, |_| None).unwrap_err();
    assert_eq!(v.key, key);
}
