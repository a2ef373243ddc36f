//! The sequential specification: one key of a map.

use std::fmt::Debug;
use std::hash::Hash;

/// An operation on one key.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum MapOp<V> {
    /// Returns the value, if any.
    Search,
    /// Inserts if absent; returns whether it inserted.
    Insert(V),
    /// Replaces if present; returns whether it replaced.
    Update(V),
    /// Inserts or replaces; returns nothing.
    Upsert(V),
    /// Removes if present; returns whether it removed.
    Delete,
}

/// What an operation returned.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum MapRet<V> {
    /// What a [`MapOp::Search`] returned: the value, or `None` if absent.
    Found(Option<V>),
    /// What a [`MapOp::Insert`], [`MapOp::Update`] or [`MapOp::Delete`]
    /// returned: whether it took effect.
    Done(bool),
    /// What an [`MapOp::Upsert`] returned (nothing).
    Unit,
}

/// Applies `op` to `state`; returns `(result, new state)`.
pub(crate) fn step<V: Clone>(state: &Option<V>, op: &MapOp<V>) -> (MapRet<V>, Option<V>) {
    match op {
        MapOp::Search => (MapRet::Found(state.clone()), state.clone()),
        MapOp::Insert(v) => match state {
            None => (MapRet::Done(true), Some(v.clone())),
            Some(_) => (MapRet::Done(false), state.clone()),
        },
        MapOp::Update(v) => match state {
            Some(_) => (MapRet::Done(true), Some(v.clone())),
            None => (MapRet::Done(false), None),
        },
        MapOp::Upsert(v) => (MapRet::Unit, Some(v.clone())),
        MapOp::Delete => (MapRet::Done(state.is_some()), None),
    }
}

/// Bounds the value type needs.
pub trait Value: Clone + Eq + Hash + Debug {}
impl<T: Clone + Eq + Hash + Debug> Value for T {}
