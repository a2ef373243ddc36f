//! `dmkit memnode --memory-file`: a bank on two file-backed memory node
//! processes survives their SIGKILL mid-run. Each round a client process
//! (this test binary, re-run as [`client_process`]) transfers money
//! between accounts on four coordinators and logs every transfer it is
//! about to commit and every commit it saw succeed; both nodes are then
//! killed with SIGKILL (the client with them), restarted on their files,
//! and a recovery pass rolls the half-done transactions back or forward
//! from their undo logs. After it: nothing locked or dirty, the replicas
//! byte-identical, the total balance exact, and every account equal to
//! the model — the start plus every logged commit, plus some subset of the
//! transfers that were in flight at the kill (each one whole or not at
//! all). Last, a clean shutdown and one more restart change nothing.

use std::collections::BTreeMap;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use dmkit_fabric::shm::{ShmConfig, ShmFabric, Target};
use dmkit_fabric::Fabric;
use dmkit_index::LeaseConfig;
use dmkit_runtime::rng::Rng;
use dmkit_runtime::Worker;
use dmkit_txn::{addr_cache, Database, TableSpec, TxnConfig, TxnError};

const DMKIT: &str = env!("CARGO_BIN_EXE_dmkit");
const ACCOUNTS: u64 = 48;
const START: u64 = 100;
const COORDS: u64 = 4;
const LEASE: LeaseConfig = LeaseConfig {
    lease: 100_000_000,
    skew: 10_000_000,
};
/// The client process's arguments: `SOCK0 SOCK1 LOG SEED`.
const CHILD_ENV: &str = "DMKIT_MEMORY_FILE_CLIENT";

fn config() -> TxnConfig {
    TxnConfig {
        max_coordinators: 256,
        lease: LEASE,
        ..TxnConfig::default()
    }
}

fn connect(socks: &[PathBuf]) -> Arc<dyn Fabric> {
    let targets: Vec<Target> = socks.iter().map(Target::new).collect();
    Arc::new(ShmFabric::open(ShmConfig::default(), &targets).expect("connect to the nodes"))
}

/// The client: transfers on `COORDS` coordinators until killed, logging
/// `I coord seq from to` before each commit and `D coord seq` (committed)
/// or `A coord seq` (aborted) after it.
#[test]
fn client_process() {
    let Ok(args) = std::env::var(CHILD_ENV) else {
        return; // Only a client when the parent test runs it.
    };
    let a: Vec<&str> = args.split(' ').collect();
    let socks = [PathBuf::from(a[0]), PathBuf::from(a[1])];
    let log = std::fs::OpenOptions::new()
        .append(true)
        .open(a[2])
        .expect("log");
    let log = std::rc::Rc::new(log);
    let seed: u64 = a[3].parse().expect("seed");
    let db = Database::open(connect(&socks), "bank", config()).expect("open the bank");
    let mut w = Worker::builder(db.fabric().as_ref())
        .tasks(COORDS as usize)
        .local(db.local_layout())
        .build()
        .expect("worker");
    let cache = addr_cache();
    for k in 0..COORDS {
        let mut coord = db.coordinator(&cache).expect("coordinator");
        let mut rng = Rng::new(seed * 10 + k);
        let log = log.clone();
        w.spawn(move |ctx| async move {
            let say = |line: String| (&*log).write_all(line.as_bytes()).expect("log write");
            for seq in 0u64.. {
                let a = rng.below(ACCOUNTS);
                let b = (a + 1 + rng.below(ACCOUNTS - 1)) % ACCOUNTS;
                let intent = std::cell::Cell::new(false);
                let r: Result<(), TxnError> = async {
                    let mut t = coord.begin(&ctx);
                    let (x, y) = (t.write(0, a)?, t.write(0, b)?);
                    t.exec().await?;
                    let (bx, by) = (t.word(x, 0), t.word(y, 0));
                    let moves = bx > 0;
                    if moves {
                        t.put(x, &(bx - 1).to_le_bytes())?;
                        t.put(y, &(by + 1).to_le_bytes())?;
                        say(format!("I {k} {seq} {a} {b}\n"));
                        intent.set(true);
                    }
                    t.commit().await
                }
                .await;
                match (r, intent.get()) {
                    (Ok(()), true) => say(format!("D {k} {seq}\n")),
                    (Err(e), true) if e.retryable() => say(format!("A {k} {seq}\n")),
                    (Ok(()), false) => {}
                    (Err(e), false) if e.retryable() => {}
                    (Err(e), _) => panic!("client: {e}"),
                }
            }
        });
    }
    w.run();
}

/// Two `dmkit memnode` processes on their memory files.
struct Nodes {
    dir: PathBuf,
    socks: Vec<PathBuf>,
    procs: Vec<Child>,
}

impl Nodes {
    fn start(dir: &Path) -> Nodes {
        let mut n = Nodes {
            dir: dir.to_owned(),
            socks: (0..2).map(|i| dir.join(format!("n{i}.sock"))).collect(),
            procs: Vec::new(),
        };
        n.restart();
        n
    }

    fn token(sock: &Path) -> PathBuf {
        dmkit_memnode::server::default_token_path(sock)
    }

    /// (Re)starts both nodes on their files and waits until they serve.
    fn restart(&mut self) {
        assert!(self.procs.is_empty());
        for (i, sock) in self.socks.iter().enumerate() {
            // A killed node leaves its socket and token behind.
            let _ = std::fs::remove_file(sock);
            let _ = std::fs::remove_file(Self::token(sock));
            let file = self.dir.join(format!("m{i}.dat"));
            let child = Command::new(DMKIT)
                .args(["memnode", "--size", "32MiB", "--workers", "0"])
                .args(["--node-id", &i.to_string()])
                .arg("--memory-file")
                .arg(&file)
                .arg("--listen")
                .arg(format!("unix:{}", sock.display()))
                .stderr(Stdio::null())
                .spawn()
                .expect("dmkit memnode");
            self.procs.push(child);
        }
        for sock in &self.socks {
            let t0 = Instant::now();
            // The token file is made, then written: wait for its line.
            let written = |p: PathBuf| std::fs::read(p).is_ok_and(|t| t.ends_with(b"\n"));
            while !(sock.exists() && written(Self::token(sock))) {
                assert!(t0.elapsed() < Duration::from_secs(20), "node never served");
                std::thread::sleep(Duration::from_millis(10));
            }
        }
    }

    fn kill(&mut self) {
        for mut p in self.procs.drain(..) {
            p.kill().expect("SIGKILL the node");
            p.wait().expect("reap the node");
        }
    }

    /// Clean shutdown (SIGTERM): status 0.
    fn stop(&mut self) {
        for mut p in self.procs.drain(..) {
            let ok = Command::new("kill")
                .args(["-TERM", &p.id().to_string()])
                .status()
                .expect("kill -TERM");
            assert!(ok.success());
            let st = p.wait().expect("reap the node");
            assert!(st.success(), "a node stopped with {st}");
        }
    }
}

impl Drop for Nodes {
    fn drop(&mut self) {
        for p in &mut self.procs {
            let _ = p.kill();
            let _ = p.wait();
        }
    }
}

/// A transfer in flight when its client died.
type Pending = (u64, u64);

/// Applies the log of a killed client to `model`; returns the transfers
/// it had begun committing and never saw end (at most one per
/// coordinator).
fn apply_log(log: &str, model: &mut [u64]) -> (u64, Vec<Pending>) {
    let mut open: BTreeMap<u64, (u64, Pending)> = BTreeMap::new();
    let mut done = 0;
    for line in log.lines() {
        let w: Vec<u64> = line[2..].split(' ').map(|x| x.parse().unwrap()).collect();
        match &line[..1] {
            "I" => {
                let prev = open.insert(w[0], (w[1], (w[2], w[3])));
                assert!(prev.is_none(), "coordinator {} began two commits", w[0]);
            }
            "D" | "A" => {
                let (seq, (a, b)) = open.remove(&w[0]).expect("an intent before");
                assert_eq!(seq, w[1]);
                if &line[..1] == "D" {
                    model[a as usize] -= 1;
                    model[b as usize] += 1;
                    done += 1;
                }
            }
            _ => panic!("bad log line {line:?}"),
        }
    }
    (done, open.into_values().map(|(_, t)| t).collect())
}

fn balances(db: &Database) -> Vec<u64> {
    let mut rows = db.scan(0).unwrap();
    rows.sort_by_key(|r| r.key);
    assert_eq!(rows.len() as u64, ACCOUNTS);
    rows.iter()
        .map(|r| u64::from_le_bytes(r.payload[..8].try_into().unwrap()))
        .collect()
}

/// After a restart: recovers the bank and checks it against `model`
/// extended by a subset of `pending`, which it then adopts.
fn recover_and_check(socks: &[PathBuf], model: &mut [u64], pending: &[Pending], what: &str) {
    let db = Database::open(connect(socks), "bank", config()).expect("the bank survived");
    std::thread::sleep(Duration::from_nanos(LEASE.lease + 3 * LEASE.skew));
    let rep = db.recover_all().unwrap();
    assert!(rep.busy.is_empty(), "{what}: {rep:?}");
    assert_eq!(db.stuck_records().unwrap(), 0, "{what}: {rep:?}");
    db.check_replicas()
        .unwrap_or_else(|e| panic!("{what}: {e}; {rep:?}"));
    let got = balances(&db);
    assert_eq!(got.iter().sum::<u64>(), START * ACCOUNTS, "{what}: {rep:?}");
    // Which of the in-flight transfers took effect (each whole or not).
    let fits = (0..1u32 << pending.len()).any(|mask| {
        let mut m: Vec<i64> = model.iter().map(|&x| x as i64).collect();
        for (i, &(a, b)) in pending.iter().enumerate() {
            if mask & (1 << i) != 0 {
                m[a as usize] -= 1;
                m[b as usize] += 1;
            }
        }
        m.iter().zip(&got).all(|(&x, &y)| x == y as i64)
    });
    assert!(
        fits,
        "{what}: the bank is no prefix of the committed history: model {model:?}, \
         in flight {pending:?}, found {got:?}; recovery {rep:?}"
    );
    model.copy_from_slice(&got);
    eprintln!(
        "{what}: recovered (rolled back {:?}, forward {:?}, {} locks broken); {} in flight",
        rep.rolled_back,
        rep.rolled_forward,
        rep.locks_broken,
        pending.len()
    );
    // Dropped: a file-backed node keeps what no client holds, and this
    // process must not map the files when the nodes restart.
    drop(db);
}

#[test]
fn a_bank_survives_sigkilled_file_backed_nodes() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    let mut nodes = Nodes::start(dir);
    let mut model = vec![START; ACCOUNTS as usize];
    {
        let db = Database::create(
            connect(&nodes.socks),
            "bank",
            config(),
            &[TableSpec::new("accounts", 8, ACCOUNTS)],
        )
        .unwrap();
        db.load(0, (0..ACCOUNTS).map(|k| (k, START.to_le_bytes().to_vec())))
            .unwrap();
    }
    let mut total_done = 0;
    for round in 0..3u64 {
        let log = dir.join(format!("log{round}"));
        std::fs::write(&log, "").unwrap();
        let mut client = Command::new(std::env::current_exe().unwrap())
            .args([
                "--exact",
                "client_process",
                "--nocapture",
                "--test-threads",
                "1",
            ])
            .env(
                CHILD_ENV,
                format!(
                    "{} {} {} {round}",
                    nodes.socks[0].display(),
                    nodes.socks[1].display(),
                    log.display()
                ),
            )
            .stdout(Stdio::null())
            .spawn()
            .unwrap();
        // Let it commit a few hundred transfers (or give up waiting).
        let t0 = Instant::now();
        while std::fs::read_to_string(&log).unwrap().matches('D').count() < 300
            && t0.elapsed() < Duration::from_secs(20)
        {
            assert!(client.try_wait().unwrap().is_none(), "the client died");
            std::thread::sleep(Duration::from_millis(5 + 7 * round));
        }
        // The nodes first, mid-run; the client (whose shm mapping of the
        // files would outlive them) right after.
        nodes.kill();
        client.kill().unwrap();
        client.wait().unwrap();
        let (done, pending) = apply_log(&std::fs::read_to_string(&log).unwrap(), &mut model);
        assert!(done > 0, "round {round}: the client committed nothing");
        total_done += done;
        nodes.restart();
        recover_and_check(
            &nodes.socks,
            &mut model,
            &pending,
            &format!("round {round}"),
        );
    }
    eprintln!("{total_done} committed transfers over 3 kills");
    assert_ne!(model, vec![START; ACCOUNTS as usize]);
    // A clean stop keeps the bank as it is.
    nodes.stop();
    nodes.restart();
    recover_and_check(&nodes.socks, &mut model, &[], "after a clean stop");
    let db = Database::open(connect(&nodes.socks), "bank", config()).unwrap();
    assert_eq!(balances(&db), model);
    db.destroy().unwrap();
    nodes.stop();
    drop(db); // its mappings would keep the files locked
              // A file is served only with the geometry it was made with, and never
              // with the CoRM store (which remaps pages).
    let file = dir.join("m0.dat");
    let sock = format!("unix:{}", dir.join("x.sock").display());
    for (extra, status, says) in [
        (&["--size", "64MiB"][..], 1, "this geometry needs"),
        (&["--size", "32MiB", "--node-id", "1"][..], 1, "made for"),
        (
            &["--size", "32MiB", "--corm"][..],
            2,
            "--memory-file with --corm",
        ),
    ] {
        let out = Command::new(DMKIT)
            .arg("memnode")
            .args(extra)
            .arg("--memory-file")
            .arg(&file)
            .args(["--listen", &sock])
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(status), "{extra:?}: {err}");
        assert!(err.contains(says), "{extra:?}: {err}");
    }
}
