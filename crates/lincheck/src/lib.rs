//! # dmkit-lincheck — linearizability checking for key-value histories
//!
//! Clients record each operation's invocation and return ([`Recorder`]);
//! [`check`] decides whether the history is linearizable with respect to a
//! sequential map. Linearizability is compositional (Herlihy & Wing's
//! locality; "P-compositionality"): a map history is linearizable iff each
//! key's sub-history is, so each key is checked on its own and long
//! histories stay cheap. Each key is searched with the Wing–Gong algorithm in
//! Lowe's formulation (a linked list of call/return events, backtracking,
//! and a cache of visited `(linearized set, state)` pairs).
//!
//! Operations whose client never saw a return (a crash, a lost connection)
//! are *pending*: they may or may not have taken effect, at any point after
//! their invocation.
//!
//! A violation is reported as the smallest sub-history of its key that is
//! still not linearizable: operations are removed one at a time while the
//! rest stays a violation (a 1-minimal history). Such a witness can shrink
//! to an operation that is only wrong once its context is gone;
//! [`earliest_failing_cut`] finds when the execution first went wrong.
//!
//! Used by every data structure's concurrency tests (RACE, the radix tree,
//! the B+tree), on shm with real threads and processes and on the simulator:
//! the recorded workload that feeds it is the index layer's conformance
//! suite (`dmkit_index::conformance::stress`). This crate is the checker
//! alone and depends on nothing of dmkit.

mod check;
mod history;
mod model;

pub use check::{check, check_key, earliest_failing_cut, Violation};
pub use history::{Event, Record, Recorder};
pub use model::{MapOp, MapRet};
