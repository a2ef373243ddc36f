//! The serializability checker: a direct serialization graph (Adya's
//! DSG) built from the committed transactions' read and write sets, and a
//! cycle search over it.
//!
//! Every record's committed versions are totally ordered by their version
//! numbers (they only grow; see `txn`). From the history:
//!
//! - **wr**: the writer of version `v` of record `x` → every transaction
//!   that read `v`;
//! - **ww**: the writer of `v` → the writer of the next committed version;
//! - **rw** (anti-dependency): a reader of `v` → the writer of the next
//!   committed version after `v` (unless it is the reader itself).
//!
//! The history is conflict-serializable iff this graph is acyclic. Beside
//! the cycle search the checker refuses a read of a version no committed
//! transaction wrote (nor the load: version 1 of a loaded record, 0 of an
//! empty slot), i.e. a read of uncommitted or aborted data, and two
//! committed writers of one version.
//!
//! Recovery's roll-backs give a record a fresh version with the old
//! contents ([`Restore`]); the checker treats it as the version it
//! restores.

use std::collections::HashMap;

use crate::db::TableId;
use crate::txn::TxnRecord;

/// A roll-back by recovery: `version` of (`table`, `slot`) holds what
/// version `same_as` held.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Restore {
    /// The table.
    pub table: TableId,
    /// The record's slot.
    pub slot: u64,
    /// The version the roll-back wrote.
    pub version: u64,
    /// The version whose contents it restored.
    pub same_as: u64,
}

/// Checks `history` (committed transactions, any order) for
/// conflict-serializability. `Err` names the violation: a dirty read, a
/// duplicate writer, or a cycle (its transactions in order).
pub fn check_serializable(history: &[TxnRecord], restored: &[Restore]) -> Result<(), String> {
    type Rec = (TableId, u64);
    let alias: HashMap<(Rec, u64), u64> = restored
        .iter()
        .map(|r| (((r.table, r.slot), r.version), r.same_as))
        .collect();
    let resolve = |rec: Rec, mut v: u64| {
        // Chains of roll-backs resolve to the committed version.
        let mut n = 0;
        while let Some(&s) = alias.get(&(rec, v)).filter(|&&s| s != v) {
            v = s;
            n += 1;
            assert!(n < 1_000_000, "a cycle of restorations");
        }
        v
    };
    // Committed versions of each record: version → writer index.
    let mut writers: HashMap<Rec, Vec<(u64, usize)>> = HashMap::new();
    for (ti, t) in history.iter().enumerate() {
        for &(tb, slot, v) in &t.writes {
            writers.entry((tb, slot)).or_default().push((v, ti));
        }
    }
    for (rec, ws) in &mut writers {
        ws.sort_unstable();
        if let Some(w) = ws.windows(2).find(|w| w[0].0 == w[1].0) {
            return Err(format!(
                "transactions {:#x} and {:#x} both committed version {} of record {rec:?}",
                history[w[0].1].id, history[w[1].1].id, w[0].0
            ));
        }
    }
    let n = history.len();
    let mut edges: Vec<Vec<usize>> = vec![Vec::new(); n];
    for ws in writers.values() {
        for w in ws.windows(2) {
            edges[w[0].1].push(w[1].1);
        }
    }
    for (ti, t) in history.iter().enumerate() {
        for &(tb, slot, v) in &t.reads {
            let rec = (tb, slot);
            let v = resolve(rec, v);
            let ws = writers.get(&rec).map(Vec::as_slice).unwrap_or(&[]);
            let at = ws.partition_point(|&(wv, _)| wv < v);
            match ws.get(at) {
                Some(&(wv, w)) if wv == v => {
                    if w != ti {
                        edges[w].push(ti);
                    }
                }
                _ if v <= 1 => {} // the load's version, or an empty slot
                _ => {
                    return Err(format!(
                        "transaction {:#x} read version {v} of record {rec:?}, which no committed \
                         transaction wrote (a dirty or aborted read)",
                        t.id
                    ))
                }
            }
            // The next committed version after v.
            let next = ws.partition_point(|&(wv, _)| wv <= v);
            if let Some(&(_, w)) = ws.get(next) {
                if w != ti {
                    edges[ti].push(w);
                }
            }
        }
    }
    match find_cycle(&edges) {
        None => Ok(()),
        Some(c) => {
            let ids: Vec<String> = c.iter().map(|&i| format!("{:#x}", history[i].id)).collect();
            let sets: Vec<String> = c
                .iter()
                .map(|&i| {
                    let t = &history[i];
                    format!("{:#x}: reads {:?} writes {:?}", t.id, t.reads, t.writes)
                })
                .collect();
            Err(format!(
                "not serializable: dependency cycle {} ({})",
                ids.join(" → "),
                sets.join("; ")
            ))
        }
    }
}

/// A cycle of `edges`, if any (iterative depth-first search).
fn find_cycle(edges: &[Vec<usize>]) -> Option<Vec<usize>> {
    #[derive(Clone, Copy, PartialEq)]
    enum Mark {
        New,
        Open,
        Done,
    }
    let n = edges.len();
    let mut mark = vec![Mark::New; n];
    let mut parent = vec![usize::MAX; n];
    for root in 0..n {
        if mark[root] != Mark::New {
            continue;
        }
        let mut stack = vec![(root, 0usize)];
        mark[root] = Mark::Open;
        while let Some(&mut (v, ref mut k)) = stack.last_mut() {
            if *k < edges[v].len() {
                let u = edges[v][*k];
                *k += 1;
                match mark[u] {
                    Mark::New => {
                        mark[u] = Mark::Open;
                        parent[u] = v;
                        stack.push((u, 0));
                    }
                    Mark::Open => {
                        let mut c = vec![u];
                        let mut x = v;
                        while x != u {
                            c.push(x);
                            x = parent[x];
                        }
                        c.reverse();
                        return Some(c);
                    }
                    Mark::Done => {}
                }
            } else {
                mark[v] = Mark::Done;
                stack.pop();
            }
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    fn t(id: u64, reads: &[(u64, u64)], writes: &[(u64, u64)]) -> TxnRecord {
        TxnRecord {
            id,
            reads: reads.iter().map(|&(s, v)| (0, s, v)).collect(),
            writes: writes.iter().map(|&(s, v)| (0, s, v)).collect(),
        }
    }

    #[test]
    fn serial_histories_pass() {
        // T1 reads x@1, writes x@2; T2 reads x@2, writes y@2.
        let h = [
            t(1, &[(0, 1)], &[(0, 2)]),
            t(2, &[(0, 2), (1, 1)], &[(1, 2)]),
        ];
        check_serializable(&h, &[]).unwrap();
    }

    #[test]
    fn write_skew_is_a_cycle() {
        // T1 reads x@1 y@1 writes y@2; T2 reads x@1 y@1 writes x@2.
        let h = [
            t(1, &[(0, 1), (1, 1)], &[(1, 2)]),
            t(2, &[(0, 1), (1, 1)], &[(0, 2)]),
        ];
        let e = check_serializable(&h, &[]).unwrap_err();
        assert!(e.contains("cycle"), "{e}");
    }

    #[test]
    fn lost_updates_and_dirty_reads_are_caught() {
        // Both read x@1 and write x@2: a duplicate version.
        let h = [t(1, &[(0, 1)], &[(0, 2)]), t(2, &[(0, 1)], &[(0, 2)])];
        assert!(check_serializable(&h, &[]).is_err());
        // A read of version 5 nobody wrote.
        let h = [t(1, &[(0, 5)], &[])];
        assert!(check_serializable(&h, &[]).unwrap_err().contains("dirty"));
        // ... unless a roll-back restored version 1 as version 5.
        let r = Restore {
            table: 0,
            slot: 0,
            version: 5,
            same_as: 1,
        };
        check_serializable(&h, &[r]).unwrap();
    }

    #[test]
    fn a_stale_read_after_a_later_write_is_a_cycle() {
        // T1 writes x@2; T2 reads y@2 (written by T3) and x@1 (stale);
        // T3 reads x@2 and writes y@2: T2 →rw T1 →wr T3 →wr T2.
        let h = [
            t(1, &[(0, 1)], &[(0, 2)]),
            t(2, &[(0, 1), (1, 2)], &[]),
            t(3, &[(0, 2), (1, 1)], &[(1, 2)]),
        ];
        assert!(check_serializable(&h, &[]).unwrap_err().contains("cycle"));
    }
}
