//! The checker: per-key Wing–Gong search (Lowe's formulation) and
//! minimisation of a violating sub-history.

use std::collections::{BTreeMap, HashSet};
use std::fmt;

use crate::history::Record;
use crate::model::{step, Value};

/// A key whose sub-history is not linearizable, with a 1-minimal violating
/// sub-history of it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Violation<K, V> {
    /// The key whose operations admit no sequential order that respects real time.
    pub key: K,
    /// Operations of the minimal violating sub-history, by invocation time.
    pub ops: Vec<Record<K, V>>,
    /// Operations of this key in the whole history.
    pub key_ops: usize,
}

impl<K: fmt::Debug, V: fmt::Debug> fmt::Display for Violation<K, V> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(
            f,
            "key {:?} is not linearizable; {} of its {} operations suffice to show it:",
            self.key,
            self.ops.len(),
            self.key_ops
        )?;
        for r in &self.ops {
            match &r.returned {
                Some((t, ret)) => writeln!(
                    f,
                    "  [{:>6} .. {:>6}] client {:>3}: {:?} -> {:?}",
                    r.invoked, t, r.client, r.op, ret
                )?,
                None => writeln!(
                    f,
                    "  [{:>6} ..    ...] client {:>3}: {:?} -> (pending)",
                    r.invoked, r.client, r.op
                )?,
            }
        }
        Ok(())
    }
}

/// Checks a whole history; `initial` gives each key's value before it.
/// Returns the first violating key (in key order) with a minimal sub-history.
pub fn check<K, V>(
    history: &[Record<K, V>],
    initial: impl Fn(&K) -> Option<V>,
) -> Result<(), Violation<K, V>>
where
    K: Clone + Ord + fmt::Debug,
    V: Value,
{
    let mut by_key: BTreeMap<&K, Vec<&Record<K, V>>> = BTreeMap::new();
    for r in history {
        by_key.entry(&r.key).or_default().push(r);
    }
    for (key, recs) in by_key {
        let ops: Vec<Record<K, V>> = recs.into_iter().cloned().collect();
        let init = initial(key);
        if !check_key(&ops, &init) {
            let key_ops = ops.len();
            return Err(Violation {
                key: key.clone(),
                ops: minimise(ops, &init),
                key_ops,
            });
        }
    }
    Ok(())
}

/// The earliest time `t` at which the history, cut at `t`, is already not
/// linearizable: operations invoked after `t` are dropped and those still
/// running at `t` become pending. `None` if the whole history is
/// linearizable. Every cut is a genuine prefix of the execution, so the
/// operations around `t` are where the bug showed first — often a better
/// starting point for debugging than the minimised witness, which can
/// shrink to an operation that only looks wrong once its context is gone.
pub fn earliest_failing_cut<K, V>(
    history: &[Record<K, V>],
    initial: impl Fn(&K) -> Option<V> + Copy,
) -> Option<u64>
where
    K: Clone + Ord + fmt::Debug,
    V: Value,
{
    let cut = |t: u64| -> Vec<Record<K, V>> {
        history
            .iter()
            .filter(|r| r.invoked <= t)
            .map(|r| {
                let mut r = r.clone();
                if r.returned.as_ref().is_some_and(|(rt, _)| *rt > t) {
                    r.returned = None;
                }
                r
            })
            .collect()
    };
    let mut times: Vec<u64> = history
        .iter()
        .flat_map(|r| std::iter::once(r.invoked).chain(r.returned.as_ref().map(|(t, _)| *t)))
        .collect();
    times.sort_unstable();
    times.dedup();
    let last = *times.last()?;
    check(&cut(last), initial).err()?;
    let (mut lo, mut hi) = (0, times.len() - 1);
    while lo < hi {
        let mid = (lo + hi) / 2;
        if check(&cut(times[mid]), initial).is_err() {
            hi = mid;
        } else {
            lo = mid + 1;
        }
    }
    Some(times[lo])
}

/// Removes operations while the rest still violates. An operation is dropped
/// only if the history stays non-linearizable with that operation made
/// *pending* (free to take effect or not): that relaxation only adds
/// linearizations, so the violation provably does not depend on it.
fn minimise<K: Clone, V: Value>(mut ops: Vec<Record<K, V>>, init: &Option<V>) -> Vec<Record<K, V>> {
    let mut i = ops.len();
    while i > 0 {
        i -= 1;
        let mut relaxed = ops.clone();
        relaxed[i].returned = None;
        if !check_key(&relaxed, init) {
            ops.remove(i);
        }
    }
    ops.sort_by_key(|r| r.invoked);
    ops
}

const NIL: usize = usize::MAX;

/// Whether one key's operations are linearizable from `init`.
pub fn check_key<K, V: Value>(ops: &[Record<K, V>], init: &Option<V>) -> bool {
    let n = ops.len();
    // Events: (time, is_return, op). Pending returns go last (time = MAX).
    let mut events: Vec<(u64, bool, usize)> = Vec::with_capacity(2 * n);
    for (i, r) in ops.iter().enumerate() {
        events.push((r.invoked, false, i));
        events.push((r.returned.as_ref().map_or(u64::MAX, |(t, _)| *t), true, i));
    }
    // At equal times returns come first (they happened before the call that
    // was recorded at the same instant cannot exist: times are unique, except
    // pending returns, whose order among themselves does not matter).
    events.sort_by_key(|&(t, ret, i)| (t, !ret, i));

    // Doubly linked list over events, node 0 a head sentinel.
    let len = events.len() + 1;
    let mut next = vec![NIL; len];
    let mut prev = vec![NIL; len];
    let mut ret_node = vec![NIL; n];
    for (k, &(_, is_ret, i)) in events.iter().enumerate() {
        let node = k + 1;
        prev[node] = k;
        next[k] = node;
        if is_ret {
            ret_node[i] = node;
        }
    }
    let op_of = |node: usize| events[node - 1].2;
    let is_ret = |node: usize| events[node - 1].1;

    let completed = ops.iter().filter(|r| r.returned.is_some()).count();
    let words = n.div_ceil(64).max(1);
    let mut linearized = vec![0u64; words];
    let mut lin_completed = 0usize;
    let mut state = init.clone();
    let mut stack: Vec<(usize, Option<V>)> = Vec::new();
    let mut cache: HashSet<(Vec<u64>, Option<V>)> = HashSet::new();

    let unlink = |x: usize, next: &mut Vec<usize>, prev: &mut Vec<usize>| {
        let (p, q) = (prev[x], next[x]);
        next[p] = q;
        if q != NIL {
            prev[q] = p;
        }
    };
    let relink = |x: usize, next: &mut Vec<usize>, prev: &mut Vec<usize>| {
        let (p, q) = (prev[x], next[x]);
        next[p] = x;
        if q != NIL {
            prev[q] = x;
        }
    };

    let mut entry = next[0];
    loop {
        if lin_completed == completed {
            return true;
        }
        if entry == NIL || is_ret(entry) {
            // Reached the return of an operation not yet linearized (or only
            // pending operations are left): every order that gets here is
            // wrong, so undo the last choice and try the next candidate.
            let Some((call, s)) = stack.pop() else {
                return false;
            };
            let op = op_of(call);
            linearized[op / 64] &= !(1 << (op % 64));
            if ops[op].returned.is_some() {
                lin_completed -= 1;
            }
            state = s;
            relink(ret_node[op], &mut next, &mut prev);
            relink(call, &mut next, &mut prev);
            entry = next[call];
            continue;
        }
        let op = op_of(entry);
        let (res, new_state) = step(&state, &ops[op].op);
        if ops[op].returned.as_ref().is_none_or(|(_, r)| *r == res) {
            linearized[op / 64] |= 1 << (op % 64);
            if cache.insert((linearized.clone(), new_state.clone())) {
                stack.push((entry, std::mem::replace(&mut state, new_state)));
                if ops[op].returned.is_some() {
                    lin_completed += 1;
                }
                unlink(entry, &mut next, &mut prev);
                unlink(ret_node[op], &mut next, &mut prev);
                entry = next[0];
                continue;
            }
            // Seen before: this choice leads nowhere new.
            linearized[op / 64] &= !(1 << (op % 64));
        }
        entry = next[entry];
    }
}
