//! TPC-C's NewOrder and Payment (TPC Benchmark C, revision 5.11), in
//! their standard proportion (45 : 43), over the nine tables, scaled by
//! warehouses, customers per district and items. Departures from the
//! specification, all to keep records fixed-size words and the run
//! small: text columns are left out; a Payment's customer is chosen by
//! number in its own district (the spec picks 60 % by last name and 15 %
//! from a remote warehouse); a NewOrder's supply warehouse is remote 1 %
//! of the time when there are several; the initial population has one
//! order per customer, the last 30 % of them new.
//!
//! Consistency conditions of the spec's §3.3.2 checked after a run:
//! 1. a warehouse's W_YTD is the sum of its districts' D_YTD;
//! 2. a district's D_NEXT_O_ID − 1 is its largest O_ID and its largest
//!    NO_O_ID;
//! 3. a district's NEW-ORDER rows are NO_O_ID max − min + 1 in number;
//! 4. the sum of a district's O_OL_CNT is the number of its ORDER-LINE rows.

use std::collections::HashMap;

use dmkit_runtime::rng::Rng;
use dmkit_runtime::Ctx;

use super::{bytes, words, Workload};
use crate::db::{Database, TableId, TableSpec};
use crate::error::TxnError;
use crate::txn::Coordinator;

/// WAREHOUSE: w → w_tax (basis points), w_ytd (cents).
pub const WAREHOUSE: TableId = 0;
/// DISTRICT: (w, d) → d_tax, d_ytd, d_next_o_id.
pub const DISTRICT: TableId = 1;
/// CUSTOMER: (w, d, c) → discount, balance, ytd_payment, payment_cnt, delivery_cnt, credit.
pub const CUSTOMER: TableId = 2;
/// HISTORY: a unique id → amount, (w, d, c).
pub const HISTORY: TableId = 3;
/// NEW-ORDER: (w, d, o) → o.
pub const NEW_ORDER: TableId = 4;
/// ORDER: (w, d, o) → c, entry date, ol_cnt, all_local.
pub const ORDER: TableId = 5;
/// ORDER-LINE: (w, d, o, number) → item, supply warehouse, quantity, amount.
pub const ORDER_LINE: TableId = 6;
/// ITEM: i → price (cents), image id.
pub const ITEM: TableId = 7;
/// STOCK: (w, i) → quantity, ytd, order_cnt, remote_cnt.
pub const STOCK: TableId = 8;

/// Districts per warehouse.
pub const DISTRICTS: u64 = 10;

/// TPC-C's scale.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Tpcc {
    /// Warehouses.
    pub warehouses: u64,
    /// Customers per district (also the initial orders per district).
    pub customers: u64,
    /// Items.
    pub items: u64,
    /// Orders (NewOrders) the tables make room for beyond the initial
    /// ones, over all districts (their lines: 15 each).
    pub new_orders: u64,
    /// Seed of the population.
    pub seed: u64,
}

impl Default for Tpcc {
    fn default() -> Self {
        Self {
            warehouses: 1,
            customers: 3_000,
            items: 100_000,
            new_orders: 200_000,
            seed: 1,
        }
    }
}

/// A TPC-C transaction.
#[allow(missing_docs)]
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TpccTxn {
    /// Order lines: (item, supply warehouse, quantity); `rollback`: the
    /// last item is invalid (1 % of NewOrders), so the order rolls back.
    NewOrder {
        w: u64,
        d: u64,
        c: u64,
        lines: Vec<(u64, u64, u64)>,
        rollback: bool,
    },
    Payment {
        w: u64,
        d: u64,
        c: u64,
        amount: u64,
    },
}

const TYPES: [&str; 2] = ["new-order", "payment"];

/// District key.
pub fn dkey(w: u64, d: u64) -> u64 {
    w << 8 | d
}
/// Customer key.
pub fn ckey(w: u64, d: u64, c: u64) -> u64 {
    dkey(w, d) << 32 | c
}
/// Order and new-order key.
pub fn okey(w: u64, d: u64, o: u64) -> u64 {
    dkey(w, d) << 32 | o
}
/// Order-line key.
pub fn olkey(w: u64, d: u64, o: u64, n: u64) -> u64 {
    w << 48 | d << 40 | o << 8 | n
}
/// Stock key.
pub fn skey(w: u64, i: u64) -> u64 {
    w << 32 | i
}

fn nurand(rng: &mut Rng, a: u64, x: u64, y: u64) -> u64 {
    ((rng.below(a + 1) | (x + rng.below(y - x + 1))) % (y - x + 1)) + x
}

impl Tpcc {
    fn initial_orders(&self) -> u64 {
        self.customers
    }

    /// First initial order that is still new.
    fn first_new(&self) -> u64 {
        self.initial_orders() * 7 / 10 + 1
    }

    fn ol_cnt(&self, w: u64, d: u64, o: u64) -> u64 {
        5 + dmkit_runtime::hash::fmix64(self.seed ^ okey(w, d, o)) % 11
    }

    async fn exec(
        &self,
        coord: &mut Coordinator,
        ctx: &Ctx,
        tx: &TpccTxn,
    ) -> Result<i64, TxnError> {
        let mut t = coord.begin(ctx);
        match tx {
            &TpccTxn::Payment { w, d, c, amount } => {
                let wh = t.write(WAREHOUSE, w)?;
                let di = t.write(DISTRICT, dkey(w, d))?;
                let cu = t.write(CUSTOMER, ckey(w, d, c))?;
                let h = t.write(HISTORY, t.id())?;
                t.exec().await?;
                if t.exists(h) {
                    t.abort().await?;
                    return Err(TxnError::Config("a history id was used twice".into()));
                }
                let mut x = words(&t.value(wh));
                x[1] += amount;
                t.put(wh, &bytes(&x))?;
                let mut x = words(&t.value(di));
                x[1] += amount;
                t.put(di, &bytes(&x))?;
                let mut x = words(&t.value(cu));
                x[1] = (x[1] as i64 - amount as i64) as u64;
                x[2] += amount;
                x[3] += 1;
                t.put(cu, &bytes(&x))?;
                t.put(h, &bytes(&[amount, ckey(w, d, c)]))?;
            }
            TpccTxn::NewOrder {
                w,
                d,
                c,
                lines,
                rollback,
            } => {
                let (w, d, c) = (*w, *d, *c);
                t.read(WAREHOUSE, w)?;
                let di = t.write(DISTRICT, dkey(w, d))?;
                t.read(CUSTOMER, ckey(w, d, c))?;
                let mut its = Vec::new();
                for (k, &(i, sw, _)) in lines.iter().enumerate() {
                    let item = if *rollback && k + 1 == lines.len() {
                        self.items + 1
                    } else {
                        i
                    };
                    its.push((t.read(ITEM, item)?, t.write(STOCK, skey(sw, i))?));
                }
                t.exec().await?;
                if its.iter().any(|&(it, _)| !t.exists(it)) {
                    t.abort().await?;
                    return Err(TxnError::UserAbort);
                }
                let mut dx = words(&t.value(di));
                let o = dx[2];
                dx[2] += 1;
                t.put(di, &bytes(&dx))?;
                let all_local = lines.iter().all(|l| l.1 == w) as u64;
                let order = t.write(ORDER, okey(w, d, o))?;
                let no = t.write(NEW_ORDER, okey(w, d, o))?;
                let ols: Vec<_> = (1..=lines.len() as u64)
                    .map(|n| t.write(ORDER_LINE, olkey(w, d, o, n)))
                    .collect::<Result<_, _>>()?;
                t.exec().await?;
                if t.exists(order) || t.exists(no) || ols.iter().any(|&l| t.exists(l)) {
                    // The district was read before a NewOrder that took
                    // `o` committed (without hitchhiked locking it is read
                    // unlocked): an inconsistent read OCC's validation
                    // would refuse. Abort and retry; a real duplicate
                    // shows in `check` (condition 2: d_next_o_id − 1 is
                    // the largest order id).
                    t.abort().await?;
                    ctx.backoff().await;
                    return Err(TxnError::Abort(crate::AbortReason::Validation));
                }
                for (k, &(i, sw, qty)) in lines.iter().enumerate() {
                    let (it, st) = its[k];
                    let price = t.word(it, 0);
                    let mut s = words(&t.value(st));
                    s[0] = if s[0] >= qty + 10 {
                        s[0] - qty
                    } else {
                        s[0] + 91 - qty
                    };
                    s[1] += qty;
                    s[2] += 1;
                    s[3] += (sw != w) as u64;
                    t.put(st, &bytes(&s))?;
                    t.put(ols[k], &bytes(&[i, sw, qty, qty * price]))?;
                }
                t.put(order, &bytes(&[c, o, lines.len() as u64, all_local]))?;
                t.put(no, &bytes(&[o]))?;
            }
        }
        t.commit().await?;
        Ok(0)
    }
}

impl Workload for Tpcc {
    type Txn = TpccTxn;

    fn name(&self) -> &'static str {
        "tpcc"
    }

    fn tables(&self) -> Vec<TableSpec> {
        let dists = self.warehouses * DISTRICTS;
        let orders = dists * self.initial_orders() + self.new_orders;
        vec![
            TableSpec::new("warehouse", 16, self.warehouses),
            TableSpec::new("district", 24, dists),
            TableSpec::new("customer", 48, dists * self.customers),
            TableSpec::new("history", 16, self.new_orders),
            TableSpec::new("new_order", 8, orders),
            TableSpec::new("order", 32, orders),
            TableSpec::new("order_line", 32, orders * 15),
            TableSpec::new("item", 16, self.items),
            TableSpec::new("stock", 32, self.warehouses * self.items),
        ]
    }

    fn load(&self, db: &Database) -> Result<(), TxnError> {
        let mut rng = Rng::new(self.seed ^ 0x7CC);
        let ws = 1..=self.warehouses;
        db.load(
            WAREHOUSE,
            ws.clone()
                .map(|w| (w, bytes(&[rng.below(2000), 30_000_000]))),
        )?;
        let next = self.initial_orders() + 1;
        let dists: Vec<(u64, u64)> = ws
            .clone()
            .flat_map(|w| (1..=DISTRICTS).map(move |d| (w, d)))
            .collect();
        db.load(
            DISTRICT,
            dists
                .iter()
                .map(|&(w, d)| (dkey(w, d), bytes(&[rng.below(2000), 3_000_000, next]))),
        )?;
        let mut cust = Vec::new();
        let (mut orders, mut news, mut lines) = (Vec::new(), Vec::new(), Vec::new());
        for &(w, d) in &dists {
            for c in 1..=self.customers {
                let credit = (rng.below(10) == 0) as u64;
                cust.push((
                    ckey(w, d, c),
                    bytes(&[rng.below(5000), (-1000i64) as u64, 1_000, 1, 0, credit]),
                ));
            }
            for o in 1..=self.initial_orders() {
                let n = self.ol_cnt(w, d, o);
                orders.push((okey(w, d, o), bytes(&[o, o, n, 1])));
                if o >= self.first_new() {
                    news.push((okey(w, d, o), bytes(&[o])));
                }
                for k in 1..=n {
                    lines.push((
                        olkey(w, d, o, k),
                        bytes(&[1 + rng.below(self.items), w, 5, 0]),
                    ));
                }
            }
        }
        db.load(CUSTOMER, cust)?;
        db.load(ORDER, orders)?;
        db.load(NEW_ORDER, news)?;
        db.load(ORDER_LINE, lines)?;
        db.load(HISTORY, std::iter::empty())?;
        db.load(
            ITEM,
            (1..=self.items).map(|i| (i, bytes(&[100 + rng.below(9_900), rng.below(10_000)]))),
        )?;
        db.load(
            STOCK,
            ws.flat_map(|w| {
                (1..=self.items).map(move |i| (skey(w, i), bytes(&[10 + (i * 7919) % 91, 0, 0, 0])))
            }),
        )?;
        Ok(())
    }

    fn types(&self) -> &'static [&'static str] {
        &TYPES
    }

    fn draw(&self, rng: &mut Rng) -> TpccTxn {
        let w = 1 + rng.below(self.warehouses);
        let d = 1 + rng.below(DISTRICTS);
        let c = nurand(rng, 1023.min(self.customers - 1), 1, self.customers);
        if rng.below(88) < 45 {
            let n = 5 + rng.below(11);
            let mut lines: Vec<(u64, u64, u64)> = Vec::new();
            while (lines.len() as u64) < n.min(self.items) {
                let i = nurand(rng, 8191.min(self.items - 1), 1, self.items);
                if lines.iter().any(|l| l.0 == i) {
                    continue;
                }
                let sw = if self.warehouses > 1 && rng.below(100) == 0 {
                    1 + rng.below(self.warehouses)
                } else {
                    w
                };
                lines.push((i, sw, 1 + rng.below(10)));
            }
            TpccTxn::NewOrder {
                w,
                d,
                c,
                lines,
                rollback: rng.below(100) == 0,
            }
        } else {
            TpccTxn::Payment {
                w,
                d,
                c,
                amount: 100 + rng.below(500_000),
            }
        }
    }

    fn kind(&self, t: &TpccTxn) -> usize {
        match t {
            TpccTxn::NewOrder { .. } => 0,
            TpccTxn::Payment { .. } => 1,
        }
    }

    fn read_only(&self, _: &TpccTxn) -> bool {
        false
    }

    fn run<'a>(
        &'a self,
        coord: &'a mut Coordinator,
        ctx: &'a Ctx,
        t: &'a TpccTxn,
    ) -> impl std::future::Future<Output = Result<i64, TxnError>> + 'a {
        self.exec(coord, ctx, t)
    }

    fn check(&self, db: &Database, _effect: i64) -> Result<(), String> {
        let scan = |t: TableId| -> Result<Vec<crate::Row>, String> {
            let rows = db.scan(t).map_err(|e| e.to_string())?;
            if let Some(r) = rows.iter().find(|r| r.lock != 0 || r.version.dirty()) {
                return Err(format!(
                    "table {t}: record {:#x} left locked or dirty",
                    r.key
                ));
            }
            Ok(rows.into_iter().filter(|r| r.version.present()).collect())
        };
        let mut w_ytd: HashMap<u64, u64> = HashMap::new();
        for r in scan(WAREHOUSE)? {
            w_ytd.insert(r.key, words(&r.payload)[1]);
        }
        let mut next: HashMap<u64, u64> = HashMap::new();
        let mut d_sum: HashMap<u64, u64> = HashMap::new();
        for r in scan(DISTRICT)? {
            let x = words(&r.payload);
            *d_sum.entry(r.key >> 8).or_default() += x[1];
            next.insert(r.key, x[2]);
        }
        for (w, y) in &w_ytd {
            if d_sum.get(w) != Some(y) {
                return Err(format!(
                    "condition 1: W_YTD of warehouse {w} is {y}, its districts' D_YTD sum {:?}",
                    d_sum.get(w)
                ));
            }
        }
        let (mut max_o, mut ol_sum) = (HashMap::<u64, u64>::new(), HashMap::<u64, u64>::new());
        for r in scan(ORDER)? {
            let dk = r.key >> 32;
            let m = max_o.entry(dk).or_default();
            *m = (*m).max(r.key & 0xFFFF_FFFF);
            *ol_sum.entry(dk).or_default() += words(&r.payload)[2];
        }
        let mut no: HashMap<u64, (u64, u64, u64)> = HashMap::new();
        for r in scan(NEW_ORDER)? {
            let o = r.key & 0xFFFF_FFFF;
            let e = no.entry(r.key >> 32).or_insert((u64::MAX, 0, 0));
            *e = (e.0.min(o), e.1.max(o), e.2 + 1);
        }
        let mut ol_count: HashMap<u64, u64> = HashMap::new();
        for r in scan(ORDER_LINE)? {
            *ol_count
                .entry(dkey(r.key >> 48, (r.key >> 40) & 0xFF))
                .or_default() += 1;
        }
        for (dk, n) in &next {
            let (lo, hi, cnt) = no.get(dk).copied().unwrap_or((0, 0, 0));
            if max_o.get(dk) != Some(&(n - 1)) || hi != n - 1 {
                return Err(format!("condition 2: district {dk:#x}: D_NEXT_O_ID {n}, max O_ID {:?}, max NO_O_ID {hi}", max_o.get(dk)));
            }
            if cnt != hi - lo + 1 {
                return Err(format!(
                    "condition 3: district {dk:#x}: {cnt} new orders, NO_O_ID {lo}..={hi}"
                ));
            }
            if ol_sum.get(dk) != ol_count.get(dk) {
                return Err(format!(
                    "condition 4: district {dk:#x}: Σ O_OL_CNT {:?}, order lines {:?}",
                    ol_sum.get(dk),
                    ol_count.get(dk)
                ));
            }
        }
        Ok(())
    }
}
