//! `dmkit bench lockcheck`: a spinlock on one remote word shared by client
//! processes (one per host), with a mutual-exclusion check — the test of
//! `dmkit switch --cas-to-write` between Soft-RoCE guests.
//!
//! Each thread (a queue pair of its own) takes the lock with CAS(0 → its
//! id), checks that the holder word is empty and writes its id there,
//! increments a counter with a READ and a WRITE (not atomic: only the lock
//! makes it exact), checks the holder word still holds its id, clears it,
//! and releases with CAS(id → 0), which must return its id. The first
//! process creates the words (a chunk under root NAME), the others open
//! it; each adds its acquisitions to root NAME.count and counts itself in
//! NAME.done; the last checks that the counter equals every process's
//! acquisitions. Any check failing fails the run.

use std::time::{Duration, Instant};

use clap::Args;
use dmkit_fabric::{Fabric, FabricError, GlobalAddr, Rkey, SyncQp};

use super::{open_fabric, FabricArgs};
use crate::Res;

#[derive(Args)]
pub(crate) struct LockcheckArgs {
    #[command(flatten)]
    fabric: FabricArgs,
    /// The shared lock's root name (the first process creates it).
    #[arg(long, default_value = "lockcheck")]
    name: String,
    /// Client processes sharing it (the last one checks the counter).
    #[arg(long, default_value_t = 1)]
    clients: u32,
    /// Threads in this process, each on its own queue pair.
    #[arg(long, default_value_t = 1)]
    threads: usize,
    /// How long each thread takes and releases the lock.
    #[arg(long, default_value = "3s", value_parser = humantime::parse_duration)]
    duration: Duration,
}

const LOCK: u64 = 0;
const COUNTER: u64 = 8;
const HOLDER: u64 = 16;
/// How long after the run's end a thread may still wait for the lock.
const STUCK: Duration = Duration::from_secs(20);

fn e(what: &str) -> impl Fn(FabricError) -> String + '_ {
    move |err| format!("lockcheck: {what}: {err}")
}

/// Adds `n` to root `root` (a CAS loop on the node's root table).
fn add_root(f: &dyn Fabric, node: u16, root: &str, n: u64) -> Result<u64, String> {
    loop {
        let old = f.get_root(node, root).map_err(e(root))?;
        let new = old.unwrap_or(0) + n;
        match f.set_root(node, root, new, Some(old)) {
            Ok(_) => return Ok(new),
            Err(FabricError::Refused {
                error: dmkit_fabric::ControlError::RootMismatch { .. },
                ..
            }) => continue,
            Err(err) => return Err(e(root)(err)),
        }
    }
}

/// The shared words: created, or opened (another process may be creating
/// them right now).
fn words(f: &dyn Fabric, node: u16, name: &str) -> Result<(GlobalAddr, Rkey, bool), String> {
    let rkey_root = format!("{name}.rkey");
    let t0 = Instant::now();
    loop {
        if let Some(at) = dmkit_fabric::find_root(f, node, name).map_err(e(name))? {
            let rk = f
                .get_root(node, &rkey_root)
                .map_err(e(&rkey_root))?
                .ok_or_else(|| format!("lockcheck: {name} has no {rkey_root}"))?;
            return Ok((at, rk as Rkey, false));
        }
        let (at, _, rk) = f.alloc_chunk(node, 4096, true).map_err(e("allocating"))?;
        let mut q = SyncQp::new(f, node, 64).map_err(e("connecting"))?;
        q.write(at, rk, &[0; 24]).map_err(e("clearing"))?;
        f.set_root(node, &rkey_root, rk as u64, None)
            .map_err(e(&rkey_root))?;
        if dmkit_fabric::claim_root(f, node, name, at.raw()).map_err(e(name))? {
            return Ok((at, rk, true));
        }
        let _ = f.free_chunk(at);
        if t0.elapsed() > Duration::from_secs(30) {
            return Err(format!(
                "lockcheck: {name}: neither created nor found in 30 s"
            ));
        }
    }
}

/// One thread's run: (acquisitions, failed CASes).
fn spin(
    f: &dyn Fabric,
    at: GlobalAddr,
    rk: Rkey,
    me: u64,
    until: Instant,
    give_up: Instant,
) -> Result<(u64, u64), String> {
    let mut q = SyncQp::new(f, at.node(), 64).map_err(e("connecting"))?;
    let (lock, counter, holder) = (at.add(LOCK), at.add(COUNTER), at.add(HOLDER));
    let (mut n, mut failed) = (0u64, 0u64);
    // A lock nobody releases (a holder that died, a CAS answered wrongly)
    // fails the run at `give_up` with the word's value instead of spinning
    // for ever.
    while Instant::now() < until {
        loop {
            let old = q.cas(lock, rk, 0, me).map_err(e("acquire"))?;
            if old == 0 {
                break;
            }
            failed += 1;
            if Instant::now() > give_up {
                return Err(format!(
                    "lockcheck: {me:#x} could not take the lock: it still held {old:#x} {:.1} s after the run's end \
                     (a holder never released it, or a CAS was answered wrongly)",
                    give_up.saturating_duration_since(until).as_secs_f64()
                ));
            }
        }
        let h = q.read_u64(holder, rk).map_err(e("holder"))?;
        if h != 0 {
            return Err(format!(
                "lockcheck: mutual exclusion broken: {me:#x} took the lock while {h:#x} held it"
            ));
        }
        q.write_u64(holder, rk, me).map_err(e("holder"))?;
        let c = q.read_u64(counter, rk).map_err(e("counter"))?;
        q.write_u64(counter, rk, c + 1).map_err(e("counter"))?;
        let h = q.read_u64(holder, rk).map_err(e("holder"))?;
        if h != me {
            return Err(format!(
                "lockcheck: mutual exclusion broken: {h:#x} wrote the holder while {me:#x} held the lock"
            ));
        }
        q.write_u64(holder, rk, 0).map_err(e("holder"))?;
        let old = q.cas(lock, rk, me, 0).map_err(e("release"))?;
        if old != me {
            return Err(format!(
                "lockcheck: mutual exclusion broken: {me:#x} released a lock holding {old:#x}"
            ));
        }
        n += 1;
    }
    Ok((n, failed))
}

pub(crate) fn bench_lockcheck(a: LockcheckArgs) -> Res {
    if a.clients == 0 || a.threads == 0 {
        return Err(crate::bad_input(
            "--clients and --threads must be at least 1",
        ));
    }
    let f = open_fabric(&a.fabric, 1 << 20)?;
    let node = *f
        .nodes()
        .first()
        .ok_or_else(|| "lockcheck: no memory node".to_string())?;
    let (at, rk, created) = words(f.as_ref(), node, &a.name)?;
    // Ids unique across processes: the process id, the clock, the thread.
    let salt = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.subsec_nanos() as u64);
    let base = ((std::process::id() as u64) << 40 | salt << 8) | 1 << 63;
    let until = Instant::now() + a.duration;
    let t0 = Instant::now();
    let results: Vec<Result<(u64, u64), String>> = std::thread::scope(|s| {
        let hs: Vec<_> = (0..a.threads)
            .map(|t| {
                let f = f.as_ref();
                s.spawn(move || spin(f, at, rk, base | t as u64, until, until + STUCK))
            })
            .collect();
        hs.into_iter()
            .map(|h| {
                h.join()
                    .unwrap_or_else(|_| Err("lockcheck: a thread panicked".into()))
            })
            .collect()
    });
    let secs = t0.elapsed().as_secs_f64();
    let (mut n, mut failed) = (0, 0);
    for r in results {
        let (k, x) = r?;
        n += k;
        failed += x;
    }
    println!(
        "lockcheck: {n} acquisitions in {secs:.1} s ({:.0}/s), {failed} failed CASes ({:.2} per acquisition), {} threads{}",
        n as f64 / secs,
        failed as f64 / n.max(1) as f64,
        a.threads,
        if created { ", created the lock" } else { "" }
    );
    let (count_root, done_root) = (format!("{}.count", a.name), format!("{}.done", a.name));
    let total = add_root(f.as_ref(), node, &count_root, n)?;
    let done = add_root(f.as_ref(), node, &done_root, 1)?;
    if done < a.clients as u64 {
        println!(
            "lockcheck: {done} of {} clients done (the last checks the counter)",
            a.clients
        );
        return Ok(());
    }
    let total = f
        .get_root(node, &count_root)
        .map_err(e(&count_root))?
        .unwrap_or(total);
    let mut q = SyncQp::new(f.as_ref(), node, 64).map_err(e("connecting"))?;
    let c = q.read_u64(at.add(COUNTER), rk).map_err(e("counter"))?;
    let lock = q.read_u64(at.add(LOCK), rk).map_err(e("lock"))?;
    for r in [
        &a.name,
        &count_root,
        &done_root,
        &format!("{}.rkey", a.name),
    ] {
        let _ = f.set_root(node, r, 0, None);
    }
    // Only its creator's session may free the chunk: otherwise it stays.
    let _ = f.free_chunk(at);
    if c != total || lock != 0 {
        return Err(format!(
            "lockcheck: mutual exclusion broken: counter {c} after {total} acquisitions by {} clients (lock word {lock:#x})",
            a.clients
        ));
    }
    println!(
        "lockcheck: mutual exclusion held: counter {c} = {total} acquisitions by {} clients, lock free",
        a.clients
    );
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use dmkit_fabric::shm::{ShmConfig, ShmFabric};
    use dmkit_memnode::NodeConfig;

    /// A lock word some other client holds for ever: the thread gives up at
    /// its deadline with the word's value, instead of spinning.
    #[test]
    fn a_lock_never_released_fails_the_run_instead_of_hanging() {
        let f = ShmFabric::embedded(
            ShmConfig::default(),
            &[NodeConfig {
                size: 4 << 20,
                ..Default::default()
            }],
        )
        .unwrap();
        let node = f.nodes()[0];
        let (at, rk, created) = words(&f, node, "stuck").unwrap();
        assert!(created);
        let mut q = SyncQp::new(&f, node, 8).unwrap();
        assert_eq!(q.cas(at.add(LOCK), rk, 0, 0xdead).unwrap(), 0);
        // A 10 ms run that gives up `after` its start.
        let run = |after: Duration| {
            let now = Instant::now();
            spin(&f, at, rk, 7, now + Duration::from_millis(10), now + after)
        };
        let err = run(Duration::from_millis(50)).unwrap_err();
        assert!(err.contains("still held 0xdead"), "{err}");
        // Released, the same call takes it and runs to its end.
        assert_eq!(q.cas(at.add(LOCK), rk, 0xdead, 0).unwrap(), 0xdead);
        let (n, _) = run(Duration::from_secs(10)).unwrap();
        assert!(n > 0);
    }
}
