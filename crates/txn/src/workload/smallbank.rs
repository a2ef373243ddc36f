//! SmallBank (Alomari et al., "The Cost of Serializability on Platforms
//! That Use Snapshot Isolation", ICDE'08), as FORD's repository runs it:
//! two tables (savings, checking) of one balance per account; six
//! transaction types, Amalgamate 15 %, Balance 15 % (read-only),
//! DepositChecking 15 %, SendPayment 25 %, TransactSavings 15 %,
//! WriteCheck 15 % (85 % read-write); 90 % of the transactions draw
//! their accounts from the first `hot` ones.
//!
//! Balances are integer cents (FORD's are floats), so the consistency
//! condition is exact: the total of all balances equals its initial value
//! plus the deposits and minus the checks of the committed transactions.

use dmkit_runtime::rng::Rng;
use dmkit_runtime::Ctx;

use super::Workload;
use crate::db::{Database, TableId, TableSpec};
use crate::error::TxnError;
use crate::txn::Coordinator;

/// The savings table.
pub const SAVINGS: TableId = 0;
/// The checking table.
pub const CHECKING: TableId = 1;
/// Each balance at load, in cents.
pub const INITIAL: i64 = 100_000;

/// SmallBank's size.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SmallBank {
    /// Accounts.
    pub accounts: u64,
    /// Hot accounts (90 % of transactions use them).
    pub hot: u64,
}

impl Default for SmallBank {
    /// FORD's configuration: 100,000 accounts, 4,000 hot.
    fn default() -> Self {
        Self {
            accounts: 100_000,
            hot: 4_000,
        }
    }
}

/// A SmallBank transaction (its fields are account numbers).
#[allow(missing_docs)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SbTxn {
    /// Moves all of `from`'s money into `to`'s checking.
    Amalgamate { from: u64, to: u64 },
    /// Reads both balances (read-only).
    Balance { acct: u64 },
    /// Adds $1.30 to checking.
    DepositChecking { acct: u64 },
    /// Sends $5 from `from`'s checking to `to`'s (rolled back if short).
    SendPayment { from: u64, to: u64 },
    /// Adds $20.20 to savings.
    TransactSavings { acct: u64 },
    /// Writes a $5 check against checking ($1 penalty if overdrawn).
    WriteCheck { acct: u64 },
}

const TYPES: [&str; 6] = [
    "amalgamate",
    "balance",
    "deposit-checking",
    "send-payment",
    "transact-savings",
    "write-check",
];

impl SmallBank {
    fn account(&self, rng: &mut Rng, hot: bool) -> u64 {
        if hot {
            rng.below(self.hot.min(self.accounts))
        } else {
            rng.below(self.accounts)
        }
    }

    fn two(&self, rng: &mut Rng) -> (u64, u64) {
        let hot = rng.below(100) < 90;
        let a = self.account(rng, hot);
        loop {
            let b = self.account(rng, hot);
            if b != a {
                return (a, b);
            }
        }
    }

    fn balance(v: u64) -> i64 {
        v as i64
    }

    fn put(t: &mut crate::Txn<'_>, i: crate::ItemId, v: i64) -> Result<(), TxnError> {
        t.put(i, &v.to_le_bytes())
    }

    async fn exec(&self, coord: &mut Coordinator, ctx: &Ctx, tx: &SbTxn) -> Result<i64, TxnError> {
        let mut t = coord.begin(ctx);
        let delta = match *tx {
            SbTxn::Amalgamate { from, to } => {
                let s0 = t.write(SAVINGS, from)?;
                let c0 = t.write(CHECKING, from)?;
                let c1 = t.write(CHECKING, to)?;
                t.exec().await?;
                let total = Self::balance(t.word(s0, 0)) + Self::balance(t.word(c0, 0));
                let c1v = Self::balance(t.word(c1, 0));
                Self::put(&mut t, c1, c1v + total)?;
                Self::put(&mut t, s0, 0)?;
                Self::put(&mut t, c0, 0)?;
                0
            }
            SbTxn::Balance { acct } => {
                t.read(SAVINGS, acct)?;
                t.read(CHECKING, acct)?;
                t.exec().await?;
                0
            }
            SbTxn::DepositChecking { acct } => {
                let c = t.write(CHECKING, acct)?;
                t.exec().await?;
                let v = Self::balance(t.word(c, 0));
                Self::put(&mut t, c, v + 130)?;
                130
            }
            SbTxn::SendPayment { from, to } => {
                let c0 = t.write(CHECKING, from)?;
                let c1 = t.write(CHECKING, to)?;
                t.exec().await?;
                let (v0, v1) = (Self::balance(t.word(c0, 0)), Self::balance(t.word(c1, 0)));
                if v0 < 500 {
                    t.abort().await?;
                    return Err(TxnError::UserAbort);
                }
                Self::put(&mut t, c0, v0 - 500)?;
                Self::put(&mut t, c1, v1 + 500)?;
                0
            }
            SbTxn::TransactSavings { acct } => {
                let s = t.write(SAVINGS, acct)?;
                t.exec().await?;
                let v = Self::balance(t.word(s, 0));
                Self::put(&mut t, s, v + 2020)?;
                2020
            }
            SbTxn::WriteCheck { acct } => {
                let s = t.read(SAVINGS, acct)?;
                let c = t.write(CHECKING, acct)?;
                t.exec().await?;
                let (sv, cv) = (Self::balance(t.word(s, 0)), Self::balance(t.word(c, 0)));
                let amount = if sv + cv < 500 { 501 } else { 500 };
                Self::put(&mut t, c, cv - amount)?;
                -amount
            }
        };
        t.commit().await?;
        Ok(delta)
    }
}

impl Workload for SmallBank {
    type Txn = SbTxn;

    fn name(&self) -> &'static str {
        "smallbank"
    }

    fn tables(&self) -> Vec<TableSpec> {
        vec![
            TableSpec::new("savings", 8, self.accounts),
            TableSpec::new("checking", 8, self.accounts),
        ]
    }

    fn load(&self, db: &Database) -> Result<(), TxnError> {
        for t in [SAVINGS, CHECKING] {
            db.load(
                t,
                (0..self.accounts).map(|a| (a, INITIAL.to_le_bytes().to_vec())),
            )?;
        }
        Ok(())
    }

    fn types(&self) -> &'static [&'static str] {
        &TYPES
    }

    fn draw(&self, rng: &mut Rng) -> SbTxn {
        let p = rng.below(100);
        let one = |rng: &mut Rng| {
            let hot = rng.below(100) < 90;
            self.account(rng, hot)
        };
        match p {
            0..15 => {
                let (from, to) = self.two(rng);
                SbTxn::Amalgamate { from, to }
            }
            15..30 => SbTxn::Balance { acct: one(rng) },
            30..45 => SbTxn::DepositChecking { acct: one(rng) },
            45..70 => {
                let (from, to) = self.two(rng);
                SbTxn::SendPayment { from, to }
            }
            70..85 => SbTxn::TransactSavings { acct: one(rng) },
            _ => SbTxn::WriteCheck { acct: one(rng) },
        }
    }

    fn kind(&self, t: &SbTxn) -> usize {
        match t {
            SbTxn::Amalgamate { .. } => 0,
            SbTxn::Balance { .. } => 1,
            SbTxn::DepositChecking { .. } => 2,
            SbTxn::SendPayment { .. } => 3,
            SbTxn::TransactSavings { .. } => 4,
            SbTxn::WriteCheck { .. } => 5,
        }
    }

    fn read_only(&self, t: &SbTxn) -> bool {
        matches!(t, SbTxn::Balance { .. })
    }

    fn run<'a>(
        &'a self,
        coord: &'a mut Coordinator,
        ctx: &'a Ctx,
        t: &'a SbTxn,
    ) -> impl std::future::Future<Output = Result<i64, TxnError>> + 'a {
        self.exec(coord, ctx, t)
    }

    fn check(&self, db: &Database, effect: i64) -> Result<(), String> {
        let mut total: i64 = 0;
        for t in [SAVINGS, CHECKING] {
            let rows = db.scan(t).map_err(|e| e.to_string())?;
            if rows.len() as u64 != self.accounts {
                return Err(format!(
                    "table {t}: {} accounts, loaded {}",
                    rows.len(),
                    self.accounts
                ));
            }
            for r in rows {
                if !r.version.present() || r.version.dirty() || r.lock != 0 {
                    return Err(format!("table {t}: account {} left {:?}", r.key, r));
                }
                total += i64::from_le_bytes(r.payload[..8].try_into().expect("8 bytes"));
            }
        }
        let expect = 2 * self.accounts as i64 * INITIAL + effect;
        if total != expect {
            return Err(format!(
                "total balance {total} ≠ initial {} + committed changes {effect} = {expect}",
                2 * self.accounts as i64 * INITIAL
            ));
        }
        Ok(())
    }
}
