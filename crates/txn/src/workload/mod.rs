//! The OLTP workloads of FORD's and SMART's evaluations, over
//! [`crate::Database`]: SmallBank ([`smallbank`]), TATP ([`tatp`]) and
//! TPC-C's NewOrder and Payment ([`tpcc`]). Each names its tables, loads
//! them, draws transactions and runs them, and checks its consistency
//! conditions on a quiescent database.

pub mod smallbank;
pub mod tatp;
pub mod tpcc;

use std::future::Future;

use dmkit_runtime::rng::Rng;
use dmkit_runtime::Ctx;

use crate::db::{Database, TableSpec};
use crate::error::TxnError;
use crate::txn::Coordinator;

/// A workload: its schema, its loader, its transactions and its
/// consistency conditions.
pub trait Workload: Send + Sync {
    /// A drawn transaction (its type and parameters).
    type Txn: Clone + std::fmt::Debug + 'static;

    /// Its name (`smallbank`, `tatp`, `tpcc`).
    fn name(&self) -> &'static str;

    /// Its tables, in [`crate::TableId`] order.
    fn tables(&self) -> Vec<TableSpec>;

    /// Loads the initial population.
    fn load(&self, db: &Database) -> Result<(), TxnError>;

    /// The names of its transaction types (reports).
    fn types(&self) -> &'static [&'static str];

    /// Draws a transaction.
    fn draw(&self, rng: &mut Rng) -> Self::Txn;

    /// Its type (index in [`Workload::types`]).
    fn kind(&self, t: &Self::Txn) -> usize;

    /// Whether it only reads.
    fn read_only(&self, t: &Self::Txn) -> bool;

    /// Runs it once on `coord`: `Ok(effect)` if it committed (the
    /// effect's meaning is the workload's: SmallBank's change of the total
    /// balance), [`TxnError::UserAbort`] if its logic rolled it back, an
    /// abort to retry, or a failure.
    fn run<'a>(
        &'a self,
        coord: &'a mut Coordinator,
        ctx: &'a Ctx,
        t: &'a Self::Txn,
    ) -> impl Future<Output = Result<i64, TxnError>> + 'a;

    /// Checks the consistency conditions on a quiescent database; `effect`
    /// is the sum of the committed transactions' effects.
    fn check(&self, db: &Database, effect: i64) -> Result<(), String>;
}

/// Little-endian words of a payload.
pub fn words(payload: &[u8]) -> Vec<u64> {
    payload
        .chunks(8)
        .map(|c| {
            let mut b = [0u8; 8];
            b[..c.len()].copy_from_slice(c);
            u64::from_le_bytes(b)
        })
        .collect()
}

/// A payload from words.
pub fn bytes(words: &[u64]) -> Vec<u8> {
    words.iter().flat_map(|w| w.to_le_bytes()).collect()
}

/// What [`drive`] did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Driven {
    /// The sum of the committed transactions' effects.
    pub effect: i64,
    /// Transactions committed.
    pub committed: u64,
    /// Conflict aborts (each retried).
    pub aborts: u64,
    /// Transactions their logic rolled back.
    pub user_aborts: u64,
    /// The transaction the coordinator's injected crash stopped
    /// ([`Coordinator::crash_at`]), if it was reached.
    pub crashed: Option<u64>,
    /// The first other error, with the transaction it stopped.
    pub failure: Option<String>,
}

/// Runs `txns` transactions of `w` drawn with `rng` on `coord`, each
/// retried until it commits or its logic rolls it back; stops early at
/// the coordinator's injected crash or at any other failure. The driver of
/// the crash tests (shm threads and `dmkit sim check --scenario txn`).
pub async fn drive<W: Workload>(
    w: &W,
    coord: &mut Coordinator,
    ctx: &Ctx,
    rng: &mut Rng,
    txns: u64,
) -> Driven {
    let mut d = Driven::default();
    for _ in 0..txns {
        let tx = w.draw(rng);
        let _op = ctx.op("txn").await;
        loop {
            match w.run(coord, ctx, &tx).await {
                Ok(e) => {
                    d.effect += e;
                    d.committed += 1;
                    break;
                }
                Err(TxnError::UserAbort) => {
                    d.user_aborts += 1;
                    break;
                }
                Err(e) if e.retryable() => d.aborts += 1,
                Err(TxnError::Crashed(_)) => {
                    d.crashed = Some(coord.last_txn());
                    return d;
                }
                Err(e) => {
                    d.failure = Some(format!("{tx:?}: {e}"));
                    return d;
                }
            }
        }
    }
    d
}
