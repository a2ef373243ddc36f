//! A recorded mixed workload on a small hot key set, for linearizability
//! tests of any remote map, on threads, processes or the simulator. Not a
//! benchmark: operations are timed with the worker's clock — host-wide
//! `CLOCK_MONOTONIC` on shm, so histories from several processes merge into
//! one, or virtual time on the simulator.

use std::cell::RefCell;
use std::collections::HashMap;
use std::rc::Rc;

use dmkit_fabric::Fabric;
use dmkit_lincheck::{MapOp, MapRet, Record};
use dmkit_runtime::{Ctx, LocalLayout, RuntimeConfig, Worker};

use crate::{IndexError, MapClient};

/// One recorded operation: keys and values are strings for readable reports.
pub type StressRecord = Record<String, String>;

/// `records`, timed with the clocks of the machines their clients ran on,
/// moved onto one time line by `at(client, reading)` (on the simulator:
/// the earliest virtual instant the client's machine could have read
/// `reading`). Each call moves to the earliest instant its reading could
/// have been taken at and each return to the latest, so every operation's
/// interval contains its true one and an order the checker infers from
/// them is a real one.
pub fn retimed(mut records: Vec<StressRecord>, at: impl Fn(u32, u64) -> u64) -> Vec<StressRecord> {
    for r in &mut records {
        r.invoked = at(r.client, r.invoked);
        if let Some((ret, _)) = &mut r.returned {
            *ret = at(r.client, *ret + 1) - 1;
        }
    }
    records
}

/// What a stress run does.
#[derive(Debug, Clone)]
pub struct StressConfig {
    /// Workers (threads, or virtual threads on the simulator).
    pub workers: usize,
    /// Tasks per worker.
    pub tasks: usize,
    /// Operations each task runs.
    pub ops_per_task: usize,
    /// Keys `hot-0 .. hot-{n-1}` receive the conflicting operations.
    pub hot_keys: u64,
    /// Percentage of operations that insert a fresh unique key (grows the
    /// table, so subtables split while the hot keys are in use).
    pub fill_percent: u32,
    /// Seed of every task's operation choices.
    pub seed: u64,
    /// Client ids are `client_base + worker * tasks + task`.
    pub client_base: u32,
}

/// Host-wide monotonic nanoseconds (comparable across processes).
pub fn host_now() -> u64 {
    let t = nix::time::clock_gettime(nix::time::ClockId::CLOCK_MONOTONIC)
        .expect("CLOCK_MONOTONIC is always available");
    t.tv_sec() as u64 * 1_000_000_000 + t.tv_nsec() as u64
}

fn splitmix(x: &mut u64) -> u64 {
    *x = x.wrapping_add(0x9E37_79B9_7F4A_7C15);
    let mut z = *x;
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// Spawns worker `wi`'s tasks of the workload on `w` (made with the map's
/// local layout): each appends its
/// records to `out`, or stores the first error in `failed` and stops.
/// Operations are timed with the worker's clock (host-wide
/// `CLOCK_MONOTONIC` on shm — comparable across processes — or virtual time
/// on the simulator).
pub fn spawn_tasks<C: MapClient>(
    w: &mut Worker,
    client: &C,
    sc: &StressConfig,
    wi: usize,
    out: &Rc<RefCell<Vec<StressRecord>>>,
    failed: &Rc<RefCell<Option<IndexError>>>,
) {
    for ti in 0..sc.tasks {
        let (client, out, failed, sc) = (client.clone(), out.clone(), failed.clone(), sc.clone());
        let id = sc.client_base + (wi * sc.tasks + ti) as u32;
        w.spawn(move |ctx| async move {
            let mut rng = sc.seed ^ (id as u64) << 32;
            for i in 0..sc.ops_per_task {
                let r = splitmix(&mut rng);
                let value = format!("v{id}.{i}");
                let (key, op) = if (r % 100) < sc.fill_percent as u64 {
                    (format!("fill-{id}-{i}"), MapOp::Insert(value))
                } else {
                    let key = format!("hot-{}", (r >> 8) % sc.hot_keys);
                    let op = match (r >> 20) % 100 {
                        0..35 => MapOp::Search,
                        35..60 => MapOp::Insert(value),
                        60..88 => MapOp::Update(value),
                        _ => MapOp::Delete,
                    };
                    (key, op)
                };
                let invoked = ctx.now();
                let k = key.as_bytes();
                // Recorded as pending when invoked: a task that dies with
                // its client (a crash test kills machines) leaves an
                // operation that may or may not have taken effect.
                let at = {
                    let mut out = out.borrow_mut();
                    out.push(Record {
                        client: id,
                        key: key.clone(),
                        op: op.clone(),
                        invoked,
                        returned: None,
                    });
                    out.len() - 1
                };
                let ret = match &op {
                    MapOp::Search => client.search(&ctx, k).await.map(|v| {
                        MapRet::Found(v.map(|v| String::from_utf8(v).expect("utf-8 values")))
                    }),
                    MapOp::Insert(v) => {
                        client.insert(&ctx, k, v.as_bytes()).await.map(MapRet::Done)
                    }
                    MapOp::Update(v) => {
                        client.update(&ctx, k, v.as_bytes()).await.map(MapRet::Done)
                    }
                    MapOp::Delete => client.delete(&ctx, k).await.map(MapRet::Done),
                    MapOp::Upsert(_) => unreachable!("not generated"),
                };
                let returned = ctx.now();
                match ret {
                    Ok(ret) => out.borrow_mut()[at].returned = Some((returned, ret)),
                    Err(e) => {
                        *failed.borrow_mut() = Some(e);
                        return;
                    }
                }
            }
        });
    }
}

/// The client id of worker `wi` of a run.
pub fn client_id(sc: &StressConfig, wi: usize) -> u64 {
    sc.client_base as u64 * 1000 + wi as u64
}

/// Runs the workload on OS threads (one worker each, its client made by
/// `client(id)` on the worker's thread); returns the history, or the first
/// operation error.
pub fn run<C: MapClient>(
    fabric: &dyn Fabric,
    layout: &LocalLayout,
    client: &(dyn Fn(u64) -> C + Sync),
    rcfg: &RuntimeConfig,
    sc: &StressConfig,
) -> Result<Vec<StressRecord>, IndexError> {
    std::thread::scope(|s| {
        let hs: Vec<_> = (0..sc.workers)
            .map(|wi| {
                let (rcfg, sc) = (rcfg.clone(), sc.clone());
                s.spawn(move || -> Result<Vec<StressRecord>, IndexError> {
                    let mut w = Worker::builder(fabric)
                        .config(rcfg)
                        .id(wi)
                        .tasks(sc.tasks)
                        .local(layout)
                        .build()?;
                    let client = client(client_id(&sc, wi));
                    let out: Rc<RefCell<Vec<StressRecord>>> = Rc::default();
                    let failed: Rc<RefCell<Option<IndexError>>> = Rc::default();
                    spawn_tasks(&mut w, &client, &sc, wi, &out, &failed);
                    w.run();
                    if let Some(e) = failed.borrow_mut().take() {
                        return Err(e);
                    }
                    let v = out.borrow().clone();
                    Ok(v)
                })
            })
            .collect();
        let mut all = Vec::new();
        for h in hs {
            all.extend(h.join().expect("stress worker panicked")?);
        }
        Ok(all)
    })
}

/// After a run, from a quiescent table: searches every hot key (recorded as
/// operations of client 9999, so the checker sees the final state) and
/// scans the whole table. Returns (those records, the scan).
pub async fn final_reads<C: MapClient>(
    ctx: &Ctx,
    client: &C,
    hot_keys: u64,
) -> Result<(Vec<StressRecord>, HashMap<String, String>), IndexError> {
    let mut finals = Vec::new();
    for k in 0..hot_keys {
        let key = format!("hot-{k}");
        let invoked = ctx.now();
        let v = client.search(ctx, key.as_bytes()).await?;
        finals.push(Record {
            client: 9999,
            key,
            op: MapOp::Search,
            invoked,
            returned: Some((
                ctx.now(),
                MapRet::Found(v.map(|v| String::from_utf8(v).expect("utf-8 values"))),
            )),
        });
    }
    let scan = client
        .entries(ctx)
        .await?
        .into_iter()
        .map(|(k, v)| {
            (
                String::from_utf8(k).expect("utf-8 keys"),
                String::from_utf8(v).expect("utf-8 values"),
            )
        })
        .collect();
    Ok((finals, scan))
}

/// Checks a run: the scan agrees with the final searches, every inserted
/// fill key is in the scan with its value and nothing else is, and the
/// whole history (with the final searches) is linearizable. The error says
/// what went wrong, with the operations around the earliest failing cut.
pub fn verify(
    mut h: Vec<StressRecord>,
    finals: Vec<StressRecord>,
    scan: &HashMap<String, String>,
) -> Result<(), String> {
    for f in &finals {
        let Some((_, MapRet::Found(v))) = &f.returned else {
            return Err(format!("final search of {} has no result", f.key));
        };
        if scan.get(&f.key) != v.as_ref() {
            return Err(format!(
                "scan has {:?} for {} but a search found {v:?}",
                scan.get(&f.key),
                f.key
            ));
        }
    }
    h.extend(finals);
    // Fill keys: every completed insert is in the scan with its value; an
    // insert left pending (its client died) may be there, with its value;
    // nothing else is.
    let mut done = std::collections::HashSet::new();
    let mut pending = HashMap::new();
    for r in &h {
        if let (MapOp::Insert(v), true) = (&r.op, r.key.starts_with("fill-")) {
            match &r.returned {
                Some((_, MapRet::Done(true))) => {
                    if scan.get(&r.key) != Some(v) {
                        return Err(format!(
                            "inserted {} = {v} but the scan has {:?}",
                            r.key,
                            scan.get(&r.key)
                        ));
                    }
                    done.insert(r.key.as_str());
                }
                None => {
                    pending.insert(r.key.as_str(), v);
                }
                Some(_) => {}
            }
        }
    }
    for (k, v) in scan.iter().filter(|(k, _)| !k.starts_with("hot-")) {
        if !done.contains(k.as_str()) && pending.get(k.as_str()) != Some(&v) {
            return Err(format!(
                "the scan has {k} = {v}, which no insert of the history wrote"
            ));
        }
    }
    check_linearizable(&h)
}

/// Whether a history is linearizable; the error shows the operations of
/// the offending key around the earliest failing cut.
pub fn check_linearizable(h: &[StressRecord]) -> Result<(), String> {
    if let Err(v) = dmkit_lincheck::check(h, |_| None) {
        // Where the execution first went wrong: the operations around the
        // earliest failing cut (more telling than a shrunk witness).
        let t = dmkit_lincheck::earliest_failing_cut(h, |_| None).unwrap_or(0);
        let mut near: Vec<&StressRecord> = h
            .iter()
            .filter(|r| r.key == v.key && r.invoked <= t)
            .filter(|r| {
                r.returned
                    .as_ref()
                    .is_some_and(|(rt, _)| rt + 2_000_000 >= t)
            })
            .collect();
        near.sort_by_key(|r| r.invoked);
        let near: Vec<String> = near
            .iter()
            .rev()
            .take(40)
            .rev()
            .map(|r| to_line(r))
            .collect();
        return Err(format!(
            "history of {} operations is not linearizable:\n{v}\nearliest failing cut at {t}; the key's operations up to it:\n{}",
            h.len(),
            near.join("\n")
        ));
    }
    Ok(())
}

/// One line per record: `client invoked returned key op ret` with `-` for
/// "none" (keys and values contain no spaces).
pub fn to_line(r: &StressRecord) -> String {
    let op = match &r.op {
        MapOp::Search => "S -".to_string(),
        MapOp::Insert(v) => format!("I {v}"),
        MapOp::Update(v) => format!("U {v}"),
        MapOp::Delete => "D -".to_string(),
        MapOp::Upsert(v) => format!("P {v}"),
    };
    let (t, ret) = r.returned.as_ref().expect("completed operation");
    let ret = match ret {
        MapRet::Found(Some(v)) => format!("F {v}"),
        MapRet::Found(None) => "F -".into(),
        MapRet::Done(b) => format!("B {b}"),
        MapRet::Unit => "U -".into(),
    };
    format!("{} {} {} {} {} {}", r.client, r.invoked, t, r.key, op, ret)
}

/// Parses [`to_line`].
pub fn from_line(l: &str) -> Option<StressRecord> {
    let f: Vec<&str> = l.split_whitespace().collect();
    if f.len() != 8 {
        return None;
    }
    let opt = |s: &str| (s != "-").then(|| s.to_string());
    let op = match f[4] {
        "S" => MapOp::Search,
        "I" => MapOp::Insert(f[5].into()),
        "U" => MapOp::Update(f[5].into()),
        "D" => MapOp::Delete,
        "P" => MapOp::Upsert(f[5].into()),
        _ => return None,
    };
    let ret = match f[6] {
        "F" => MapRet::Found(opt(f[7])),
        "B" => MapRet::Done(f[7].parse().ok()?),
        "U" => MapRet::Unit,
        _ => return None,
    };
    Some(Record {
        client: f[0].parse().ok()?,
        invoked: f[1].parse().ok()?,
        returned: Some((f[2].parse().ok()?, ret)),
        key: f[3].into(),
        op,
    })
}
