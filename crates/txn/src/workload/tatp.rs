//! TATP, the Telecom Application Transaction Processing benchmark (as
//! FORD's repository runs it): five tables, seven transaction types, 80 %
//! read-only — GetSubscriberData 35 %, GetNewDestination 10 %,
//! GetAccessData 35 %, UpdateSubscriberData 2 %, UpdateLocation 14 %,
//! InsertCallForwarding 2 %, DeleteCallForwarding 2 %. Subscribers are
//! drawn non-uniformly (TATP's NURand). A transaction whose row is not
//! there (the spec expects some) is rolled back by its logic.
//!
//! Records are fixed-size words (strings are packed into integers); keys
//! pack the composite keys: access info `s_id << 8 | ai_type`, special
//! facility `s_id << 8 | sf_type`, call forwarding `s_id << 16 | sf_type
//! << 8 | start_time`. The secondary index maps the subscriber number to
//! `s_id` (its own table, read by the transactions that look a subscriber
//! up by number).
//!
//! Consistency conditions checked after a run (TATP defines none; these
//! are what its transactions must keep): every subscriber's number maps
//! back to it; subscribers, access infos and special facilities are
//! exactly those loaded (no transaction inserts or deletes them); every
//! call forwarding present belongs to an existing special facility, starts
//! at 0, 8 or 16 and ends after it starts.

use dmkit_runtime::rng::Rng;
use dmkit_runtime::Ctx;

use super::{bytes, words, Workload};
use crate::db::{Database, TableId, TableSpec};
use crate::error::TxnError;
use crate::txn::Coordinator;

/// SUBSCRIBER: s_id → sub_nbr, bits, hex, bytes, msc_location, vlr_location.
pub const SUBSCRIBER: TableId = 0;
/// SECONDARY SUBSCRIBER (the index on sub_nbr): sub_nbr → s_id.
pub const SEC_SUBSCRIBER: TableId = 1;
/// ACCESS_INFO: (s_id, ai_type) → data1, data2.
pub const ACCESS_INFO: TableId = 2;
/// SPECIAL_FACILITY: (s_id, sf_type) → is_active, error_cntrl | data_a.
pub const SPECIAL_FACILITY: TableId = 3;
/// CALL_FORWARDING: (s_id, sf_type, start_time) → end_time, numberx.
pub const CALL_FORWARDING: TableId = 4;

/// TATP's size.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Tatp {
    /// Subscribers.
    pub subscribers: u64,
    /// Seed of the population.
    pub seed: u64,
}

impl Default for Tatp {
    /// FORD's configuration: 100,000 subscribers.
    fn default() -> Self {
        Self {
            subscribers: 100_000,
            seed: 1,
        }
    }
}

/// A TATP transaction (subscriber ids, types and times).
#[allow(missing_docs)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TatpTxn {
    GetSubscriberData {
        s: u64,
    },
    GetNewDestination {
        s: u64,
        sf: u64,
        start: u64,
        end: u64,
    },
    GetAccessData {
        s: u64,
        ai: u64,
    },
    UpdateSubscriberData {
        s: u64,
        sf: u64,
        bit: u64,
        data_a: u64,
    },
    UpdateLocation {
        nbr: u64,
        location: u64,
    },
    InsertCallForwarding {
        nbr: u64,
        sf: u64,
        start: u64,
        end: u64,
    },
    DeleteCallForwarding {
        nbr: u64,
        sf: u64,
        start: u64,
    },
}

const TYPES: [&str; 7] = [
    "get-subscriber-data",
    "get-new-destination",
    "get-access-data",
    "update-subscriber-data",
    "update-location",
    "insert-call-forwarding",
    "delete-call-forwarding",
];

/// The key of access info `ai` of subscriber `s`.
pub fn ai_key(s: u64, ai: u64) -> u64 {
    s << 8 | ai
}
/// The key of special facility `sf` of subscriber `s`.
pub fn sf_key(s: u64, sf: u64) -> u64 {
    s << 8 | sf
}
/// The key of call forwarding (`s`, `sf`, `start`).
pub fn cf_key(s: u64, sf: u64, start: u64) -> u64 {
    s << 16 | sf << 8 | start
}

/// The initial population.
pub struct Population {
    /// (table, key, payload words).
    pub rows: Vec<(TableId, u64, Vec<u64>)>,
}

impl Tatp {
    /// The initial population (deterministic in `seed`).
    pub fn population(&self) -> Population {
        let mut rng = Rng::new(self.seed ^ 0x7A7B);
        let mut rows = Vec::new();
        for s in 1..=self.subscribers {
            rows.push((
                SUBSCRIBER,
                s,
                vec![
                    s,
                    rng.next_u64() & 0x3FF,
                    rng.next_u64(),
                    rng.next_u64(),
                    rng.next_u64(),
                    rng.next_u64(),
                ],
            ));
            rows.push((SEC_SUBSCRIBER, s, vec![s]));
            for ai in pick_types(&mut rng) {
                rows.push((
                    ACCESS_INFO,
                    ai_key(s, ai),
                    vec![rng.next_u64(), rng.next_u64()],
                ));
            }
            for sf in pick_types(&mut rng) {
                let active = (rng.below(100) < 85) as u64;
                rows.push((
                    SPECIAL_FACILITY,
                    sf_key(s, sf),
                    vec![active, rng.next_u64()],
                ));
                for start in [0u64, 8, 16] {
                    if rng.below(4) == 0 {
                        continue;
                    }
                    rows.push((
                        CALL_FORWARDING,
                        cf_key(s, sf, start),
                        vec![start + 1 + rng.below(8), rng.next_u64()],
                    ));
                }
            }
        }
        Population { rows }
    }

    /// TATP's non-uniform subscriber id (NURand with A = 65535, or 1023
    /// for fewer than a million subscribers as the spec's smaller A).
    fn subscriber(&self, rng: &mut Rng) -> u64 {
        let a = if self.subscribers >= 1_000_000 {
            65_535
        } else {
            1_023
        };
        ((rng.below(a + 1) | (1 + rng.below(self.subscribers))) % self.subscribers) + 1
    }

    async fn exec(
        &self,
        coord: &mut Coordinator,
        ctx: &Ctx,
        tx: &TatpTxn,
    ) -> Result<i64, TxnError> {
        let mut t = coord.begin(ctx);
        match *tx {
            TatpTxn::GetSubscriberData { s } => {
                t.read(SUBSCRIBER, s)?;
                t.exec().await?;
            }
            TatpTxn::GetNewDestination { s, sf, start, end } => {
                let f = t.read(SPECIAL_FACILITY, sf_key(s, sf))?;
                let cfs: Vec<_> = [0u64, 8, 16]
                    .into_iter()
                    .filter(|&st| st <= start)
                    .map(|st| t.read(CALL_FORWARDING, cf_key(s, sf, st)))
                    .collect::<Result<_, _>>()?;
                t.exec().await?;
                let found = t.exists(f)
                    && t.word(f, 0) == 1
                    && cfs.iter().any(|&c| t.exists(c) && end < t.word(c, 0));
                if !found {
                    t.abort().await?;
                    return Err(TxnError::UserAbort);
                }
            }
            TatpTxn::GetAccessData { s, ai } => {
                let a = t.read(ACCESS_INFO, ai_key(s, ai))?;
                t.exec().await?;
                if !t.exists(a) {
                    t.abort().await?;
                    return Err(TxnError::UserAbort);
                }
            }
            TatpTxn::UpdateSubscriberData { s, sf, bit, data_a } => {
                let sub = t.write(SUBSCRIBER, s)?;
                let f = t.write(SPECIAL_FACILITY, sf_key(s, sf))?;
                t.exec().await?;
                if !t.exists(f) || !t.exists(sub) {
                    t.abort().await?;
                    return Err(TxnError::UserAbort);
                }
                let mut w = words(&t.value(sub));
                w[1] = (w[1] & !1) | (bit & 1);
                t.put(sub, &bytes(&w))?;
                let mut w = words(&t.value(f));
                w[1] = (w[1] & !0xFF) | (data_a & 0xFF);
                t.put(f, &bytes(&w))?;
            }
            TatpTxn::UpdateLocation { nbr, location } => {
                let sec = t.read(SEC_SUBSCRIBER, nbr)?;
                t.exec().await?;
                if !t.exists(sec) {
                    t.abort().await?;
                    return Err(TxnError::UserAbort);
                }
                let s = t.word(sec, 0);
                let sub = t.write(SUBSCRIBER, s)?;
                t.exec().await?;
                let mut w = words(&t.value(sub));
                w[5] = location;
                t.put(sub, &bytes(&w))?;
            }
            TatpTxn::InsertCallForwarding {
                nbr,
                sf,
                start,
                end,
            } => {
                let sec = t.read(SEC_SUBSCRIBER, nbr)?;
                t.exec().await?;
                let s = t.word(sec, 0);
                let f = t.read(SPECIAL_FACILITY, sf_key(s, sf))?;
                let c = t.write(CALL_FORWARDING, cf_key(s, sf, start))?;
                t.exec().await?;
                if !t.exists(sec) || !t.exists(f) || t.exists(c) {
                    t.abort().await?;
                    return Err(TxnError::UserAbort);
                }
                t.put(c, &bytes(&[end, nbr]))?;
            }
            TatpTxn::DeleteCallForwarding { nbr, sf, start } => {
                let sec = t.read(SEC_SUBSCRIBER, nbr)?;
                t.exec().await?;
                let s = t.word(sec, 0);
                let c = t.write(CALL_FORWARDING, cf_key(s, sf, start))?;
                t.exec().await?;
                if !t.exists(sec) || !t.exists(c) {
                    t.abort().await?;
                    return Err(TxnError::UserAbort);
                }
                t.delete(c);
            }
        }
        t.commit().await?;
        Ok(0)
    }
}

/// 1–4 distinct types among 1..=4.
fn pick_types(rng: &mut Rng) -> Vec<u64> {
    let n = 1 + rng.below(4);
    let mut all = vec![1u64, 2, 3, 4];
    for i in (1..4).rev() {
        let j = rng.below(i as u64 + 1) as usize;
        all.swap(i, j);
    }
    all.truncate(n as usize);
    all
}

impl Workload for Tatp {
    type Txn = TatpTxn;

    fn name(&self) -> &'static str {
        "tatp"
    }

    fn tables(&self) -> Vec<TableSpec> {
        let n = self.subscribers;
        vec![
            TableSpec::new("subscriber", 48, n),
            TableSpec::new("sec_subscriber", 8, n),
            TableSpec::new("access_info", 16, 4 * n),
            TableSpec::new("special_facility", 16, 4 * n),
            TableSpec::new("call_forwarding", 16, 12 * n),
        ]
    }

    fn load(&self, db: &Database) -> Result<(), TxnError> {
        let pop = self.population();
        for t in 0..5 {
            db.load(
                t,
                pop.rows
                    .iter()
                    .filter(|r| r.0 == t)
                    .map(|r| (r.1, bytes(&r.2))),
            )?;
        }
        Ok(())
    }

    fn types(&self) -> &'static [&'static str] {
        &TYPES
    }

    fn draw(&self, rng: &mut Rng) -> TatpTxn {
        let s = self.subscriber(rng);
        let p = rng.below(100);
        let sf = 1 + rng.below(4);
        let start = 8 * rng.below(3);
        match p {
            0..35 => TatpTxn::GetSubscriberData { s },
            35..45 => TatpTxn::GetNewDestination {
                s,
                sf,
                start,
                end: 1 + rng.below(24),
            },
            45..80 => TatpTxn::GetAccessData {
                s,
                ai: 1 + rng.below(4),
            },
            80..82 => TatpTxn::UpdateSubscriberData {
                s,
                sf,
                bit: rng.below(2),
                data_a: rng.below(256),
            },
            82..96 => TatpTxn::UpdateLocation {
                nbr: s,
                location: rng.next_u64(),
            },
            96..98 => TatpTxn::InsertCallForwarding {
                nbr: s,
                sf,
                start,
                end: start + 1 + rng.below(8),
            },
            _ => TatpTxn::DeleteCallForwarding { nbr: s, sf, start },
        }
    }

    fn kind(&self, t: &TatpTxn) -> usize {
        match t {
            TatpTxn::GetSubscriberData { .. } => 0,
            TatpTxn::GetNewDestination { .. } => 1,
            TatpTxn::GetAccessData { .. } => 2,
            TatpTxn::UpdateSubscriberData { .. } => 3,
            TatpTxn::UpdateLocation { .. } => 4,
            TatpTxn::InsertCallForwarding { .. } => 5,
            TatpTxn::DeleteCallForwarding { .. } => 6,
        }
    }

    fn read_only(&self, t: &TatpTxn) -> bool {
        self.kind(t) < 3
    }

    fn run<'a>(
        &'a self,
        coord: &'a mut Coordinator,
        ctx: &'a Ctx,
        t: &'a TatpTxn,
    ) -> impl std::future::Future<Output = Result<i64, TxnError>> + 'a {
        self.exec(coord, ctx, t)
    }

    fn check(&self, db: &Database, _effect: i64) -> Result<(), String> {
        let e = |e: TxnError| e.to_string();
        let pop = self.population();
        let loaded = |t: TableId| pop.rows.iter().filter(|r| r.0 == t).count();
        let present = |t: TableId| -> Result<Vec<crate::Row>, String> {
            let rows = db.scan(t).map_err(e)?;
            if let Some(r) = rows.iter().find(|r| r.lock != 0 || r.version.dirty()) {
                return Err(format!("table {t}: record {} left locked or dirty", r.key));
            }
            Ok(rows.into_iter().filter(|r| r.version.present()).collect())
        };
        let subs = present(SUBSCRIBER)?;
        let secs = present(SEC_SUBSCRIBER)?;
        for t in [SUBSCRIBER, SEC_SUBSCRIBER, ACCESS_INFO, SPECIAL_FACILITY] {
            let n = present(t)?.len();
            if n != loaded(t) {
                return Err(format!("table {t}: {n} rows, {} loaded", loaded(t)));
            }
        }
        let sub_nbr: std::collections::HashMap<u64, u64> =
            subs.iter().map(|r| (r.key, words(&r.payload)[0])).collect();
        for r in &secs {
            let s = words(&r.payload)[0];
            if sub_nbr.get(&s) != Some(&r.key) {
                return Err(format!(
                    "sub_nbr {} maps to subscriber {s}, whose number differs",
                    r.key
                ));
            }
        }
        let sfs: std::collections::HashSet<u64> = present(SPECIAL_FACILITY)?
            .into_iter()
            .map(|r| r.key)
            .collect();
        for r in present(CALL_FORWARDING)? {
            let (s, sf, start) = (r.key >> 16, (r.key >> 8) & 0xFF, r.key & 0xFF);
            let end = words(&r.payload)[0];
            if !sfs.contains(&sf_key(s, sf)) || ![0, 8, 16].contains(&start) || end <= start {
                return Err(format!(
                    "call forwarding {s}/{sf}/{start} (end {end}) is inconsistent"
                ));
            }
        }
        Ok(())
    }
}
