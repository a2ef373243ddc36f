//! End to end through the `dmkit` binary: a memory node process, a benchmark
//! connected to it, statistics, shutdown; and flag errors.

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

const DMKIT: &str = env!("CARGO_BIN_EXE_dmkit");

/// Runs `dmkit ARGS` and asserts it succeeded.
fn dmkit_ok(args: &[&str], extra: Option<&Path>) -> std::process::Output {
    let mut c = Command::new(DMKIT);
    c.args(args);
    if let Some(p) = extra {
        c.arg(p);
    }
    succeeded(&mut c)
}

/// Runs `cmd` and asserts it succeeded (its stderr in the message).
fn succeeded(cmd: &mut Command) -> std::process::Output {
    let out = cmd.output().unwrap();
    assert!(
        out.status.success(),
        "{cmd:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

/// Reads a JSON file a run wrote.
fn read_json(path: &Path) -> serde_json::Value {
    let text = std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    serde_json::from_str(&text).unwrap_or_else(|e| panic!("{}: {e}: {text}", path.display()))
}

/// Every result file starts with the run's provenance (issue 39, Deliver 1).
fn assert_provenance(v: &serde_json::Value, what: &str) {
    for k in [
        "version",
        "commit",
        "command",
        "host",
        "seed",
        "duration_s",
        "warmup_s",
        "quick",
        "repeat",
    ] {
        assert!(
            v["provenance"].get(k).is_some(),
            "{what}: provenance lacks {k}: {v}"
        );
    }
    assert!(
        v["provenance"]["host"]["cores"].as_u64().unwrap() >= 1,
        "{what}: {v}"
    );
    assert_eq!(v["provenance"]["command"][1], "bench", "{what}");
}

fn wait_for(path: &Path) {
    let t0 = Instant::now();
    while !path.exists() {
        assert!(
            t0.elapsed() < Duration::from_secs(10),
            "{} never appeared",
            path.display()
        );
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// A `dmkit memnode` process listening on a socket in a directory of its
/// own, returned once its socket and token file exist; killed (if still
/// running) when dropped, so a failing test leaves no node behind.
struct Node {
    /// The process (`None` once a test took it to wait for its output).
    child: Option<std::process::Child>,
    sock: std::path::PathBuf,
    /// `unix:SOCK`, what `--connect` takes.
    target: String,
    _dir: tempfile::TempDir,
}

impl Node {
    /// `dmkit memnode --size SIZE` with its stderr sent to `stderr`.
    fn start(size: &str, stderr: Stdio) -> Node {
        Node::start_with(&["--size", size], stderr)
    }

    /// `dmkit memnode ARGS` (listening on its own socket).
    fn start_with(args: &[&str], stderr: Stdio) -> Node {
        let dir = tempfile::tempdir().unwrap();
        let sock = dir.path().join("n.sock");
        let target = format!("unix:{}", sock.display());
        let child = Command::new(DMKIT)
            .arg("memnode")
            .args(args)
            .args(["--listen", &target])
            .stderr(stderr)
            .spawn()
            .unwrap();
        wait_for(&sock);
        wait_for(&dmkit_memnode_token(&sock));
        Node {
            child: Some(child),
            sock,
            target,
            _dir: dir,
        }
    }

    fn child(&mut self) -> &mut std::process::Child {
        self.child.as_mut().expect("the node process")
    }

    fn token(&self) -> std::path::PathBuf {
        dmkit_memnode_token(&self.sock)
    }
}

impl Drop for Node {
    fn drop(&mut self) {
        if let Some(c) = &mut self.child {
            if let Ok(None) = c.try_wait() {
                let _ = c.kill();
                let _ = c.wait();
            }
        }
    }
}

/// Runs `dmkit ARGS`, asserts it failed, and returns its stderr.
fn dmkit_fails(args: &[&str]) -> (Option<i32>, String) {
    let out = Command::new(DMKIT).args(args).output().unwrap();
    assert!(!out.status.success(), "{args:?} should fail");
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// `bench corm --connect` against a `dmkit memnode --corm` process: the
/// result reports the node's workers and store (its objects live at the
/// window's end), and the run frees them, so the node's store is empty
/// afterwards. Flags that belong to an embedded node are refused.
#[test]
fn bench_corm_runs_against_a_corm_memnode_and_leaves_its_store_empty() {
    let node = Node::start_with(
        &["--size", "128MiB", "--corm", "--workers", "2"],
        Stdio::null(),
    );
    let dir = tempfile::tempdir().unwrap();
    let json = dir.path().join("corm.json");
    let out = succeeded(
        Command::new(DMKIT)
            .args(["bench", "corm", "--connect", &node.target])
            .args([
                "--objects",
                "1000",
                "--duration",
                "200ms",
                "--warmup",
                "50ms",
            ])
            .arg("--json")
            .arg(&json),
    );
    let r = read_json(&json);
    assert_provenance(&r, "bench corm --connect");
    assert_eq!(r["backend"], "shm");
    assert_eq!(r["workers"], 2, "the node's workers: {r}");
    assert!(r["ops"].as_u64().unwrap() > 0, "{r}");
    let st = &r["store"];
    assert_eq!(st["workers"], 2);
    assert_eq!(st["strategy"], "corm-16");
    assert_eq!(st["live_objects"], 1000, "{st}");
    assert_eq!(st["live_bytes"], 1000 * 32);
    assert!(st["active_bytes"].as_u64().unwrap() >= st["ideal_bytes"].as_u64().unwrap());
    let table = String::from_utf8_lossy(&out.stdout);
    assert!(table.contains("active KiB"), "{table}");
    // The node's own accounting: the run's objects are gone.
    let stats = Command::new(DMKIT)
        .args(["node", "stats", "--connect", &node.target])
        .output()
        .unwrap();
    assert!(stats.status.success());
    let ns: serde_json::Value = serde_json::from_slice(&stats.stdout).unwrap();
    assert_eq!(ns["corm"]["live_objects"], 0, "{ns}");
    assert_eq!(ns["corm"]["allocs"], 1000);
    assert_eq!(ns["corm"]["frees"], 1000);
    // An embedded node's flags, and a node process without --connect.
    for (args, flag) in [
        (vec!["--workers", "2"], "--workers"),
        (vec!["--timeline"], "--timeline"),
        (vec!["--backend", "sim"], "simulator"),
        (vec!["--backend", "verbs"], "unix:PATH"),
        (vec!["--pin"], "--pin"),
    ] {
        let mut all = vec!["bench", "corm", "--connect", &node.target];
        all.extend(args);
        let (code, err) = dmkit_fails(&all);
        assert_eq!(code, Some(2), "{all:?}: {err}");
        assert!(err.contains(flag), "{all:?}: {err}");
    }
    let (code, err) = dmkit_fails(&["bench", "corm", "--backend", "verbs"]);
    assert_eq!(code, Some(2));
    assert!(err.contains("--connect tcp:HOST:PORT"), "{err}");
    // The shm latency model is refused where the network is another's.
    for mode in [&[][..], &["--latency"]] {
        let mut all = vec!["bench", "corm", "--backend", "sim", "--rtt", "2us"];
        all.extend(mode);
        let (code, err) = dmkit_fails(&all);
        assert_eq!(code, Some(2), "{all:?}: {err}");
        assert!(err.contains("--rtt"), "{all:?}: {err}");
    }
    // Thread placement is for the shm throughput modes.
    for mode in [&["--backend", "sim"][..], &["--latency"]] {
        let mut all = vec!["bench", "corm", "--pin"];
        all.extend(mode);
        let (code, err) = dmkit_fails(&all);
        assert_eq!(code, Some(2), "{all:?}: {err}");
        assert!(err.contains("--pin"), "{all:?}: {err}");
    }
}

/// `bench corm --latency` (Fig. 9/10) on the simulator: a table row per
/// call, JSON rows per call and size, indirect rows timed on objects the
/// compaction moved; the same seed gives the same rows.
#[test]
fn bench_corm_latency_on_the_simulator_is_deterministic() {
    let dir = tempfile::tempdir().unwrap();
    let run = |name: &str| {
        let json = dir.path().join(name);
        let out = succeeded(
            Command::new(DMKIT)
                .args(["bench", "corm", "--latency", "--backend", "sim"])
                .args(["--sizes", "32,512", "--latency-objects", "32", "--json"])
                .arg(&json),
        );
        (
            String::from_utf8_lossy(&out.stdout).into_owned(),
            read_json(&json),
        )
    };
    let (table, a) = run("a.json");
    let (_, b) = run("b.json");
    assert!(table.contains("direct_read+scan_read"), "{table}");
    assert_eq!(a["rows"], b["rows"]);
    assert_eq!(a["backend"], "sim");
    let rows = a["rows"].as_array().unwrap();
    for size in [32, 512] {
        for (call, pointer) in [
            ("alloc", "-"),
            ("direct_read", "direct"),
            ("read", "indirect"),
        ] {
            let r = rows
                .iter()
                .find(|r| r["call"] == call && r["pointer"] == pointer && r["size"] == size)
                .unwrap_or_else(|| panic!("{call} {pointer} {size}: {a}"));
            assert!(r["p50_us"].as_f64().unwrap() > 0.0, "{r}");
        }
    }
    assert_eq!(a["store"]["live_objects"], 0);
    let (code, err) = dmkit_fails(&[
        "bench",
        "corm",
        "--latency",
        "--connect",
        "unix:/nonexistent.sock",
    ]);
    assert_eq!(code, Some(2));
    assert!(err.contains("--connect"), "{err}");
}

#[test]
fn memnode_process_serves_a_benchmark_then_shuts_down() {
    let mut node = Node::start("64MiB", Stdio::piped());
    let (sock, target) = (node.sock.clone(), node.target.clone());
    let dir = tempfile::tempdir().unwrap();
    let mut banner = String::new();
    let mut node_log = BufReader::new(node.child().stderr.take().unwrap());
    node_log.read_line(&mut banner).unwrap();
    assert!(banner.contains("serving 64MiB"), "{banner}");
    let token = node.token();
    use std::os::unix::fs::PermissionsExt;
    assert_eq!(
        std::fs::metadata(&token).unwrap().permissions().mode() & 0o777,
        0o600
    );

    let json = dir.path().join("r.json");
    let out = dmkit_ok(
        &[
            "bench",
            "micro",
            "--connect",
            &target,
            "--verb",
            "faa",
            "--region-size",
            "1MiB",
            "--threads",
            "2",
            "--batch",
            "4",
            "--duration",
            "300ms",
            "--json",
        ],
        Some(&json),
    );
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(stdout.lines().next().unwrap().contains("Gb/s"), "{stdout}");
    let r: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
    for key in [
        "backend", "verb", "size", "threads", "batch", "ops", "seconds", "mops",
    ] {
        assert!(r.get(key).is_some(), "JSON lacks {key}: {r}");
    }
    assert_eq!(
        (
            r["backend"].as_str(),
            r["verb"].as_str(),
            r["threads"].as_u64()
        ),
        (Some("shm"), Some("faa"), Some(2))
    );
    assert!(r["ops"].as_u64().unwrap() > 0);

    let stats = Command::new(DMKIT)
        .args(["node", "stats", "--connect", &target])
        .output()
        .unwrap();
    assert!(stats.status.success());
    let st: serde_json::Value = serde_json::from_slice(&stats.stdout).unwrap();
    assert_eq!(st["remote_bytes"].as_u64(), Some(64 << 20));
    assert_eq!(
        st["chunk_bytes"].as_u64(),
        Some(0),
        "the benchmark freed its region: {st}"
    );
    assert!(st["sessions_total"].as_u64().unwrap() >= 2);

    let down = Command::new(DMKIT)
        .args(["node", "shutdown", "--connect", &target])
        .output()
        .unwrap();
    assert!(down.status.success());
    let t0 = Instant::now();
    loop {
        if let Some(status) = node.child().try_wait().unwrap() {
            assert!(status.success());
            break;
        }
        assert!(
            t0.elapsed() < Duration::from_secs(10),
            "memnode did not exit"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    assert!(!sock.exists());
    let mut rest = String::new();
    node_log.read_line(&mut rest).unwrap();
    assert!(rest.contains("shut down"), "{rest}");
}

fn dmkit_memnode_token(sock: &Path) -> std::path::PathBuf {
    let mut p = sock.as_os_str().to_owned();
    p.push(".token");
    p.into()
}

#[test]
fn embedded_benchmark_with_latency_model() {
    let out = dmkit_ok(
        &[
            "bench",
            "micro",
            "--verb",
            "read",
            "--region-size",
            "64KiB",
            "--rtt",
            "1ms",
            "--duration",
            "300ms",
        ],
        None,
    );
    let line = String::from_utf8_lossy(&out.stdout)
        .lines()
        .nth(1)
        .unwrap()
        .to_string();
    let ops: u64 = line.split_whitespace().nth(8).unwrap().parse().unwrap();
    // One outstanding read per 1 ms round trip: at most ~300 in 300 ms
    // (the window is exactly 300 ms; on a loaded machine the thread may
    // get far less of it, so the floor only says that reads completed).
    assert!((5..=301).contains(&ops), "{line}");
}

#[test]
fn ycsb_on_race_and_local_hash_then_plot() {
    let dir = tempfile::tempdir().unwrap();
    let mut files = Vec::new();
    for (index, threads) in [("race", "1"), ("race", "2"), ("local-hash", "2")] {
        let json = dir.path().join(format!("{index}-{threads}.json"));
        let png = dir.path().join(format!("{index}-{threads}.png"));
        let out = dmkit_ok(
            &[
                "bench",
                "ycsb",
                "--index",
                index,
                "--workload",
                "a",
                "--keys",
                "5000",
                "--threads",
                threads,
                "--coros",
                "4",
                "--duration",
                "200ms",
                "--key-type",
                "string",
                "--value-size",
                "32",
                "--json",
                json.to_str().unwrap(),
                "--plot",
                png.to_str().unwrap(),
            ],
            None,
        );
        let table = String::from_utf8_lossy(&out.stdout);
        assert!(table.contains("Mops") && table.contains(index), "{table}");
        let v: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
        for k in [
            "backend",
            "index",
            "workload",
            "threads",
            "coros",
            "keys",
            "mops",
            "p50_us",
            "p99_us",
            "round_trips_per_op",
            "verbs_per_op",
            "bytes_read_per_op",
            "bytes_written_per_op",
            "retries_per_op",
        ] {
            assert!(v.get(k).is_some(), "JSON lacks {k}: {v}");
        }
        assert!(v["mops"].as_f64().unwrap() > 0.0);
        assert!(std::fs::read(&png).unwrap().starts_with(b"\x89PNG"));
        files.push(json);
    }
    let combined = dir.path().join("all.png");
    let mut args = vec!["plot"];
    args.extend(files.iter().map(|f| f.to_str().unwrap()));
    args.extend(["-o", combined.to_str().unwrap()]);
    dmkit_ok(&args, None);
    let png = std::fs::read(&combined).unwrap();
    assert!(png.starts_with(b"\x89PNG") && png.len() > 100_000);
}

#[test]
fn bad_flags_are_clear_errors() {
    let cases: &[(&[&str], &str)] = &[
        (
            &[
                "bench",
                "micro",
                "--verb",
                "cas",
                "--size",
                "16",
                "--duration",
                "10ms",
            ],
            "atomics move 8 bytes",
        ),
        (
            &["bench", "micro", "--region-size", "4"],
            "smaller than one request",
        ),
        (
            &[
                "bench",
                "micro",
                "--batch",
                "100000",
                "--region-size",
                "4KiB",
            ],
            "--batch",
        ),
        (
            &["bench", "micro", "--region-size", "1.5GiB"],
            "fractional sizes are not supported",
        ),
        (&["bench", "micro", "--region-size", "lots"], "not a size"),
        (&["bench", "micro", "--backend", "rdma"], "invalid value"),
        (
            &["bench", "micro", "--backend", "verbs"],
            "--connect tcp:HOST:PORT",
        ),
        (
            &["bench", "micro", "--connect", "tcp:127.0.0.1:9"],
            "use --backend verbs",
        ),
        (
            &[
                "bench",
                "micro",
                "--backend",
                "verbs",
                "--connect",
                "tcp:nohost",
            ],
            "expected tcp:HOST:PORT",
        ),
        (
            &[
                "bench",
                "ycsb",
                "--backend",
                "verbs",
                "--connect",
                "tcp:127.0.0.1:9",
            ],
            if cfg!(feature = "verbs") {
                "no RDMA device"
            } else {
                "built without RDMA support"
            },
        ),
        (
            &["memnode", "--listen", "tcp:127.0.0.1:0", "--size", "8MiB"],
            if cfg!(feature = "verbs") {
                "no RDMA device"
            } else {
                "built without RDMA support"
            },
        ),
        (
            &["bench", "ycsb", "--backend", "sim", "--connect", "unix:/x"],
            "shm options",
        ),
        (&["bench", "micro", "--backend", "sim"], "dmkit sim speed"),
        (&["bench", "ycsb", "--machines", "2"], "simulator"),
        (&["sim", "reproduce", "smart-fig99"], "smart-fig3a"),
        (
            &["sim", "reproduce", "smart-fig4a", "--profile", "cx9"],
            "built-in profiles",
        ),
        (
            &["sim", "reproduce", "smart-fig14", "--atomic-order", "fifo"],
            "expected one of post, arrival",
        ),
        (
            &[
                "sim",
                "reproduce",
                "smart-fig14",
                "--atomic-order",
                "random",
                "--atomic-stalls-access",
                "on",
            ],
            "atomic_stalls_access is modelled under atomic_order = \"post\" only",
        ),
        (
            &["sim", "check", "--scenario", "nope"],
            "scenarios: counters",
        ),
        (
            &["bench", "ycsb", "--workload", "e", "--keys", "10"],
            "range scans",
        ),
        (&["bench", "ycsb", "--index", "bptree"], "unknown index"),
        (&["bench", "ycsb", "--workload", "g"], "expected load"),
        (
            &["plot", "/nonexistent.json", "-o", "/tmp/x.png"],
            "reading",
        ),
        (
            &["plot", "/nonexistent.json", "-o", "/tmp/x.bmp"],
            "unknown figure format",
        ),
        (
            &["sim", "reproduce", "smart-fig4a", "--plot", "/tmp/x.gif"],
            "unknown figure format",
        ),
        (&["sim", "reproduce", "--all"], "--report"),
        (
            &["bench", "micro", "--connect", "tcp://host:1"],
            "unix:PATH",
        ),
        (
            &[
                "bench",
                "micro",
                "--connect",
                "unix:/nonexistent/dmkit.sock",
            ],
            "token file",
        ),
        (
            &[
                "memnode",
                "--listen",
                "unix:/tmp/x.sock",
                "--page-size",
                "8KiB",
            ],
            "page size",
        ),
    ];
    for (args, want) in cases {
        let (_, err) = dmkit_fails(args);
        assert!(err.contains(want), "{args:?}: expected {want:?} in {err}");
    }
}

#[test]
fn the_simulator_commands_run_and_write_json() {
    let dir = tempfile::tempdir().unwrap();
    let j = dir.path().join("fig.json");
    let png = dir.path().join("fig.png");
    succeeded(
        Command::new(DMKIT)
            .args([
                "sim",
                "reproduce",
                "smart-fig4a",
                "--quick",
                "--quiet",
                "--json",
            ])
            .arg(&j)
            .arg("--plot")
            .arg(&png),
    );
    let v: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&j).unwrap()).unwrap();
    assert_eq!(v["figure"], "smart-fig4a");
    let rows = v["rows"].as_array().unwrap();
    assert!(rows.iter().all(|r| r["series"].is_string()
        && r["x"].is_number()
        && r["value"].is_number()
        && r["unit"].is_string()
        && (r["published"].is_number() || r["published"].is_null())));
    assert!(std::fs::read(&png).unwrap().starts_with(b"\x89PNG"));

    let out = succeeded(Command::new(DMKIT).args([
        "sim",
        "check",
        "--scenario",
        "counters",
        "--seeds",
        "3",
    ]));
    assert!(String::from_utf8_lossy(&out.stdout).contains("seeds 1..3 passed"));

    let y = dir.path().join("ycsb.json");
    succeeded(
        Command::new(DMKIT)
            .args([
                "bench",
                "ycsb",
                "--backend",
                "sim",
                "--memory-nodes",
                "2",
                "--keys",
                "2000",
            ])
            .args([
                "--threads",
                "2",
                "--coros",
                "2",
                "--duration",
                "1ms",
                "--quiet",
                "--json",
            ])
            .arg(&y),
    );
    let v: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&y).unwrap()).unwrap();
    assert_eq!(v["backend"], "sim");
    assert!(v["mops"].as_f64().unwrap() > 0.0);
}

#[test]
fn ycsb_on_the_radix_tree_with_its_switches() {
    let dir = tempfile::tempdir().unwrap();
    for (wl, extra) in [
        ("e", vec![]),
        (
            "a",
            vec![
                "--in-place-leaf",
                "off",
                "--art-cache",
                "0",
                "--lock-free-internal",
                "off",
            ],
        ),
        ("a", vec!["--rear-lock", "off", "--rdwc", "off"]),
    ] {
        let json = dir.path().join("art.json");
        let mut args = vec![
            "bench",
            "ycsb",
            "--index",
            "art",
            "--workload",
            wl,
            "--keys",
            "5000",
            "--threads",
            "2",
            "--coros",
            "4",
            "--duration",
            "200ms",
            "--json",
        ];
        args.push(json.to_str().unwrap());
        args.extend(extra.iter().copied());
        dmkit_ok(&args, None);
        let v: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
        assert_eq!(v["index"], "art");
        assert!(v["mops"].as_f64().unwrap() > 0.0, "{wl} {extra:?}: {v}");
        assert!(v["round_trips_per_op"].as_f64().unwrap() >= 1.0, "{v}");
    }
    let out = Command::new(DMKIT)
        .args([
            "bench",
            "ycsb",
            "--index",
            "local-art",
            "--key-type",
            "string",
        ])
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("int"));
}

#[test]
fn a_closed_stdout_ends_quietly() {
    // The reading end is gone before dmkit starts, so its first line of
    // output fails with EPIPE.
    let (reader, writer) = std::io::pipe().unwrap();
    drop(reader);
    let out = Command::new(DMKIT)
        .args(["sim", "check", "--scenario", "counters", "--seeds", "1"])
        .stdout(writer)
        .stderr(Stdio::piped())
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(141), "{err}");
    assert!(!err.contains("panicked"), "{err}");
}

/// Ctrl-C ends a benchmark like its clock: the partial result is printed
/// and written (marked interrupted, over the shortened window), and the
/// status is 130.
#[test]
fn ctrl_c_ends_a_benchmark_with_its_partial_result() {
    let dir = tempfile::tempdir().unwrap();
    for bench in ["micro", "ycsb", "txn"] {
        let json = dir.path().join(format!("{bench}.json"));
        let mut args = vec!["bench", bench, "--duration", "60s"];
        match bench {
            "micro" => args.extend(["--quiet", "--region-size", "1MiB"]),
            "ycsb" => args.extend([
                "--quiet",
                "--keys",
                "2000",
                "--threads",
                "1",
                "--coros",
                "2",
            ]),
            _ => args.extend(["--threads", "1", "--coros", "2"]),
        }
        let child = Command::new(DMKIT)
            .args(&args)
            .arg("--json")
            .arg(&json)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        std::thread::sleep(Duration::from_millis(1500));
        let t0 = Instant::now();
        let kill = Command::new("kill")
            .args(["-INT", &child.id().to_string()])
            .status()
            .unwrap();
        assert!(kill.success());
        let out = child.wait_with_output().unwrap();
        assert!(
            t0.elapsed() < Duration::from_secs(30),
            "{bench}: slow to stop"
        );
        assert_eq!(out.status.code(), Some(130), "{bench}: {out:?}");
        let table = String::from_utf8_lossy(&out.stdout);
        let unit = if bench == "txn" { "commit/s" } else { "Mops" };
        assert!(table.contains(unit), "{bench}: {table}");
        let v: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
        assert_eq!(v["interrupted"], true, "{bench}: {v}");
        let s = v["seconds"].as_f64().unwrap();
        assert!(s < 60.0, "{bench}: {s}");
        assert_eq!(v["provenance"]["command"][1], "bench");
    }
}

/// Provenance in every JSON; a thread sweep measures each point on one
/// loaded index; many threads on few cores are warned about and counted
/// in one window (not the sum of staggered ones).
#[test]
fn results_carry_provenance_and_sweeps_share_one_load() {
    let dir = tempfile::tempdir().unwrap();
    let json = dir.path().join("sweep.json");
    let out = dmkit_ok(
        &[
            "bench",
            "ycsb",
            "--keys",
            "3000",
            "--threads",
            "1,2",
            "--coros",
            "2",
            "--duration",
            "200ms",
            "--quiet",
            "--json",
        ],
        Some(&json),
    );
    let v: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
    let runs = v["runs"].as_array().unwrap();
    assert_eq!(runs.len(), 2, "{v}");
    assert_eq!(
        (runs[0]["threads"].clone(), runs[1]["threads"].clone()),
        (1.into(), 2.into())
    );
    // One load: both points report the same load time.
    assert_eq!(runs[0]["load_seconds"], runs[1]["load_seconds"]);
    assert_provenance(&v, "ycsb");
    assert!(String::from_utf8_lossy(&out.stdout).contains("p999_us"));

    let cores = std::thread::available_parallelism().unwrap().get();
    let threads = (8 * cores).to_string();
    let json = dir.path().join("many.json");
    let out = dmkit_ok(
        &[
            "bench",
            "micro",
            "--threads",
            &threads,
            "--duration",
            "300ms",
            "--region-size",
            "1MiB",
            "--quiet",
            "--json",
        ],
        Some(&json),
    );
    assert!(String::from_utf8_lossy(&out.stderr).contains("polling threads on"));
    let v: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
    assert!((v["seconds"].as_f64().unwrap() - 0.3).abs() < 1e-6, "{v}");
    assert!(v["oversubscribed"].is_string());
    let per_thread: u64 = v["per_thread_ops"]
        .as_array()
        .unwrap()
        .iter()
        .map(|x| x.as_u64().unwrap())
        .sum();
    assert_eq!(per_thread, v["ops"].as_u64().unwrap());
}

/// Bad values are refused before any work: exit status 2 and one line
/// naming the flag (issue 39: panics, hangs, sizes past the machine's
/// memory, degenerate values, unwritable outputs).
#[test]
fn bad_values_exit_2_with_one_line_naming_the_flag() {
    let huge = "64TiB";
    let cases: &[(&[&str], &str)] = &[
        (&["bench", "ycsb", "--zipf-items", "0"], "--zipf-items"),
        (&["bench", "micro", "--coros", "65537"], "--coros"),
        (&["bench", "micro", "--threads", "100000"], "--threads"),
        (
            &["bench", "ycsb", "--threads", "100000", "--coros", "1"],
            "--threads",
        ),
        (&["bench", "ycsb", "--mem-size", huge], "--mem-size"),
        (
            &["bench", "micro", "--region-size", "1TiB"],
            "embedded memory node",
        ),
        (
            &["bench", "ycsb", "--keys", "100000000000"],
            "embedded memory node",
        ),
        (
            &[
                "memnode",
                "--size",
                huge,
                "--listen",
                "unix:/tmp/dmkit-never.sock",
            ],
            "--size",
        ),
        (&["bench", "micro", "--duration", "0s"], "--duration"),
        (&["bench", "ycsb", "--duration", "0s"], "--duration"),
        (&["bench", "micro", "--iters", "0"], "--iters"),
        (&["bench", "micro", "--repeat", "0"], "--repeat"),
        (
            &["bench", "ycsb", "--hot-keys", "2000", "--keys", "1000"],
            "--hot-keys",
        ),
        (&["bench", "ycsb", "--c-max", "0"], "--c-max"),
        (
            &["bench", "micro", "--c-max", "0", "--coros", "2"],
            "--c-max",
        ),
        (&["bench", "ycsb", "--zipf", "1.5"], "--zipf"),
        (
            &["bench", "ycsb", "--json", "/nonexistent/x.json"],
            "--json",
        ),
        (
            &["bench", "micro", "--json", "/nonexistent/x.json"],
            "--json",
        ),
        (
            &[
                "sim",
                "reproduce",
                "smart-fig3a",
                "--json",
                "/nonexistent/x.json",
            ],
            "--json",
        ),
        (&["bench", "ycsb", "--plot", "/nonexistent/x.png"], "--plot"),
        (&["bench", "ycsb", "--plot", "/tmp/x.bmp"], "--plot"),
        (&["bench", "vector-io", "--plot", "/tmp/x.bmp"], "--plot"),
        (
            &["bench", "io-consolidation", "--json", "/nonexistent/x.json"],
            "--json",
        ),
        (
            &["bench", "atomics", "--json", "/nonexistent/x.json"],
            "--json",
        ),
        (&["bench", "txn", "--json", "/nonexistent/x.json"], "--json"),
        (
            &["bench", "corm", "--json", "/nonexistent/x.json"],
            "--json",
        ),
        (&["bench", "rpc", "--json", "/nonexistent/x.json"], "--json"),
        // bench micro's size sweep and CSV (perftest's -a).
        (&["bench", "micro", "-a", "--sizes", "64"], "--all-sizes"),
        (
            &["bench", "micro", "--sizes", "64,128", "--size", "8"],
            "--size",
        ),
        (&["bench", "micro", "--verb", "faa", "-a"], "--verb faa"),
        (
            &["bench", "micro", "-a", "--region-size", "1MiB"],
            "--region-size",
        ),
        (&["bench", "micro", "--sizes", "64,0"], "--size"),
        (&["bench", "micro", "--csv", "/nonexistent/x.csv"], "--csv"),
        // The other benches' window and repeats.
        (&["bench", "rpc", "--duration", "0s"], "--duration"),
        (&["bench", "rpc", "--threads", "0"], "--threads"),
        (&["bench", "rpc", "--repeat", "0"], "--repeat"),
        (&["bench", "corm", "--repeat", "0"], "--repeat"),
        (&["bench", "corm", "--duration", "0s"], "--duration"),
        (&["bench", "vector-io", "--duration", "0s"], "--duration"),
        (
            &["bench", "io-consolidation", "--duration", "0s"],
            "--duration",
        ),
        (&["bench", "atomics", "--duration", "0s"], "--duration"),
        (&["bench", "atomics", "--threads", "1,0"], "--threads"),
        (&["bench", "vector-io", "--repeat", "0"], "--repeat"),
        (&["bench", "io-consolidation", "--repeat", "0"], "--repeat"),
        (&["bench", "atomics", "--repeat", "0"], "--repeat"),
        (&["bench", "txn", "--repeat", "0"], "--repeat"),
        (&["bench", "txn", "--duration", "0s"], "--duration"),
        (&["bench", "txn", "--threads", "0"], "--threads"),
        // The simulator is deterministic: a repeat would say nothing.
        (
            &["bench", "vector-io", "--backend", "sim", "--repeat", "2"],
            "--repeat",
        ),
        (
            &[
                "bench",
                "io-consolidation",
                "--backend",
                "sim",
                "--repeat",
                "2",
            ],
            "--repeat",
        ),
        (
            &["bench", "atomics", "--backend", "sim", "--repeat", "2"],
            "--repeat",
        ),
    ];
    for (args, flag) in cases {
        let t0 = Instant::now();
        let (code, err) = dmkit_fails(args);
        assert_eq!(code, Some(2), "{args:?}: {err}");
        assert_eq!(err.trim_end().lines().count(), 1, "{args:?}: {err}");
        assert!(err.contains(flag), "{args:?}: expected {flag:?} in {err}");
        assert!(!err.contains("panicked"), "{args:?}: {err}");
        // Refused before the work: no multi-gigabyte node, no run.
        assert!(
            t0.elapsed() < Duration::from_secs(5),
            "{args:?}: slow refusal"
        );
    }
}

/// `dmkit app shuffle|join|log … --json F` writes the keys the issue's
/// checks read, one object per method, each verified.
#[test]
fn the_applications_write_the_json_the_checks_read() {
    let dir = tempfile::tempdir().unwrap();
    for (app, backend) in [("shuffle", "shm"), ("join", "sim"), ("log", "shm")] {
        let j = dir.path().join(format!("{app}.json"));
        let mut args = vec![
            "app",
            app,
            "--backend",
            backend,
            "--method",
            "none,sgl",
            "--batch",
            "8",
            "--executors",
            "2",
            "--mem-size",
            "64MiB",
        ];
        args.extend(match app {
            "join" => ["--inner", "2000", "--outer", "2000"].as_slice(),
            _ => ["--records", "2000"].as_slice(),
        });
        args.push("--json");
        dmkit_ok(&args, Some(&j));
        let v: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(&j).unwrap()).unwrap();
        let runs = v.as_array().expect("two methods: an array");
        assert_eq!(runs.len(), 2);
        for (r, method) in runs.iter().zip(["none", "sgl"]) {
            assert_eq!(r["app"], app);
            assert_eq!(r["method"], method);
            assert_eq!(r["verified"], true, "{app} {method}: {r}");
            assert_eq!(r["executors"], 2);
            assert!(r["records"].as_u64().unwrap() >= 4000, "{r}");
            for k in ["batch", "seconds", "records_per_s", "bytes_per_record"] {
                assert!(r[k].is_number(), "{app}: {k} in {r}");
            }
            // shm runs each method 5 times interleaved and reports the
            // median round; the simulator runs once.
            let rounds: Vec<f64> = r["round_seconds"]
                .as_array()
                .unwrap()
                .iter()
                .map(|x| x.as_f64().unwrap())
                .collect();
            if backend == "shm" {
                assert_eq!(rounds.len(), 5, "{r}");
                let secs = r["seconds"].as_f64().unwrap();
                let below = rounds.iter().filter(|&&x| x < secs).count();
                let above = rounds.iter().filter(|&&x| x > secs).count();
                assert!(rounds.contains(&secs) && below <= 2 && above <= 2, "{r}");
            } else {
                assert!(rounds.is_empty(), "{r}");
            }
        }
    }
    // Rounds: at least one, and one only on the simulator.
    for (backend, rounds) in [("shm", "0"), ("sim", "2")] {
        let out = Command::new(DMKIT)
            .args([
                "app",
                "log",
                "--backend",
                backend,
                "--records",
                "100",
                "--rounds",
                rounds,
            ])
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success() && err.contains("--rounds"), "{err}");
    }
}

/// `--source-memory registered|staged` on `app shuffle` and `app join`:
/// both models verify on shm, the shuffle reports its executors' CPU time,
/// and an unknown model is refused.
#[test]
fn the_shuffle_and_join_take_either_source_memory_model() {
    let dir = tempfile::tempdir().unwrap();
    for model in ["registered", "staged"] {
        for app in ["shuffle", "join"] {
            let j = dir.path().join(format!("{app}-{model}.json"));
            let mut args = vec![
                "app",
                app,
                "--method",
                "none,sp,sgl",
                "--executors",
                "2",
                "--mem-size",
                "64MiB",
                "--source-memory",
                model,
                "--rounds",
                "1",
            ];
            args.extend(match app {
                "join" => ["--inner", "2000", "--outer", "2000"].as_slice(),
                _ => ["--records", "3000"].as_slice(),
            });
            args.push("--json");
            dmkit_ok(&args, Some(&j));
            let v: serde_json::Value =
                serde_json::from_str(&std::fs::read_to_string(&j).unwrap()).unwrap();
            for r in v.as_array().expect("three methods: an array") {
                assert_eq!(r["verified"], true, "{app} {model}: {r}");
                if app == "shuffle" {
                    let phases = r["phases"].as_array().unwrap();
                    assert!(
                        phases.iter().any(|p| p[0] == "executor CPU seconds"
                            && p[1].as_f64().unwrap() > 0.0),
                        "{r}"
                    );
                }
            }
        }
    }
    let out = Command::new(DMKIT)
        .args([
            "app",
            "shuffle",
            "--records",
            "100",
            "--source-memory",
            "pinned",
        ])
        .output()
        .unwrap();
    assert!(!out.status.success());
}

/// Clover's metadata server in a process of its own, on a memory node
/// process: it creates the store when asked, serves rounds until its
/// duration is up and reports them; an unknown store is refused.
#[test]
fn clover_mds_runs_in_its_own_process() {
    let node = Node::start("64MiB", Stdio::null());
    let s = node.sock.to_str().unwrap();
    let out = dmkit_ok(
        &[
            "clover-mds",
            "--connect",
            s,
            "--name",
            "kv",
            "--create",
            "--duration",
            "300ms",
        ],
        None,
    );
    let r: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert!(r["rounds"].as_u64().unwrap() > 0, "{r}");
    let out = Command::new(DMKIT)
        .args([
            "clover-mds",
            "--connect",
            s,
            "--name",
            "other",
            "--duration",
            "100ms",
        ])
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("no clover named"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    drop(node);
}

/// `bench ycsb --index clover`: no switch on shm (no wire: steering is
/// refused), the switch on the simulator, and the fields SwordBox's checks
/// read.
#[test]
fn ycsb_on_clover_with_and_without_the_switch() {
    let out = Command::new(DMKIT)
        .args([
            "bench",
            "ycsb",
            "--index",
            "clover",
            "--steer",
            "write",
            "--keys",
            "100",
            "--duration",
            "50ms",
        ])
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("no wire"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let dir = tempfile::tempdir().unwrap();
    let json = dir.path().join("c.json");
    dmkit_ok(
        &[
            "bench",
            "ycsb",
            "--backend",
            "sim",
            "--index",
            "clover",
            "--workload",
            "a",
            "--keys",
            "256",
            "--threads",
            "8",
            "--coros",
            "1",
            "--duration",
            "1ms",
            "--steer",
            "read-write",
            "--steer-keys",
            "16",
            "--quiet",
            "--json",
        ],
        Some(&json),
    );
    let r: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
    assert_eq!(r["steer"], "read-write", "{r}");
    assert!(r["bytes_per_op"].as_f64().unwrap() > 0.0, "{r}");
    assert!(r["cas_failures_per_op"].as_f64().is_some(), "{r}");
}

/// `bench ycsb --clover-store`: two processes on one memory node run on
/// one Clover store (the first creates it, the other opens it); the last
/// to finish checks the chains with both processes' linked versions.
#[test]
fn two_processes_share_one_clover_store_and_the_last_checks_it() {
    let dir = tempfile::tempdir().unwrap();
    let sock = dir.path().join("n.sock");
    let target = format!("unix:{}", sock.display());
    let mut node = Command::new(DMKIT)
        .args(["memnode", "--size", "128MiB", "--listen", &target])
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    wait_for(&sock);
    let args = |extra: &[&str]| -> Vec<String> {
        [
            "bench",
            "ycsb",
            "--connect",
            &target,
            "--index",
            "clover",
            "--workload",
            "a",
            "--keys",
            "300",
            "--threads",
            "1",
            "--coros",
            "2",
            "--duration",
            "300ms",
            "--quiet",
        ]
        .iter()
        .chain(extra)
        .map(|s| s.to_string())
        .collect()
    };
    let shared = [
        "--gc",
        "off",
        "--clover-store",
        "kv",
        "--clover-clients",
        "2",
    ];
    // Without --gc off the sum would be inexact: refused before the run.
    let out = Command::new(DMKIT)
        .args(args(&["--clover-store", "kv", "--clover-clients", "2"]))
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("--gc off"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let runs: Vec<_> = (0..2)
        .map(|_| {
            Command::new(DMKIT)
                .args(args(&shared))
                .stdout(Stdio::null())
                .stderr(Stdio::piped())
                .spawn()
                .unwrap()
        })
        .collect();
    let logs: Vec<String> = runs
        .into_iter()
        .map(|c| {
            let out = c.wait_with_output().unwrap();
            let log = String::from_utf8_lossy(&out.stderr).to_string();
            assert!(out.status.success(), "{log}");
            log
        })
        .collect();
    let checked: Vec<&String> = logs
        .iter()
        .filter(|l| l.contains("chains intact after 2 clients"))
        .collect();
    assert_eq!(checked.len(), 1, "exactly the last checks: {logs:?}");
    assert!(
        logs.iter().any(|l| l.contains("1 of 2 clients done")),
        "{logs:?}"
    );
    // Both loaded the same 300 keys: the store has them once.
    assert!(checked[0].contains("(300 keys,"), "{}", checked[0]);
    // The store was removed: a third run creates it afresh and, alone of
    // one, checks it itself.
    let out = Command::new(DMKIT)
        .args(args(&[
            "--gc",
            "off",
            "--clover-store",
            "kv",
            "--clover-clients",
            "1",
        ]))
        .output()
        .unwrap();
    let log = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success() && log.contains("chains intact after 1 clients (300 keys"),
        "{log}"
    );
    node.kill().unwrap();
    node.wait().unwrap();
}

/// `dmkit memnode` ends cleanly on SIGTERM and on SIGINT: exit status 0,
/// its socket and token file removed, a last log line (issue: memnode's
/// lifecycle).
#[test]
fn memnode_shuts_down_cleanly_on_a_signal() {
    for sig in ["-TERM", "-INT"] {
        let mut node = Node::start("16MiB", Stdio::piped());
        let (sock, token) = (node.sock.clone(), node.token());
        let killed = Command::new("kill")
            .args([sig, &node.child().id().to_string()])
            .status()
            .unwrap();
        assert!(killed.success());
        let out = node.child.take().unwrap().wait_with_output().unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(out.status.success(), "{sig}: {:?} {err}", out.status);
        assert!(err.contains("shut down"), "{sig}: {err}");
        assert!(!sock.exists(), "{sig}: the socket outlived the node");
        assert!(!token.exists(), "{sig}: the token outlived the node");
    }
}

/// `sim reproduce NAME --report DIR` writes the report of one figure (the
/// page's content is checked by `dmkit_bench::report`'s own test), and
/// `dmkit plot` draws the figure's JSON as SVG and PDF.
#[test]
fn the_report_and_plot_formats_from_the_command_line() {
    let dir = tempfile::tempdir().unwrap();
    let rep = dir.path().join("rep");
    succeeded(
        Command::new(DMKIT)
            .args([
                "sim",
                "reproduce",
                "smart-fig3a",
                "--quick",
                "--quiet",
                "--report",
            ])
            .arg(&rep),
    );
    let html = std::fs::read_to_string(rep.join("index.html")).unwrap();
    assert!(html.contains("<section id=\"smart-fig3a\">") && html.contains("<svg"));
    assert!(html.contains("dmkit sim reproduce smart-fig3a --seed 1 --quick"));
    let json = rep.join("json/smart-fig3a.json");
    for (ext, magic) in [("svg", &b"<svg"[..]), ("pdf", b"%PDF")] {
        let f = dir.path().join(format!("fig.{ext}"));
        dmkit_ok(
            &["plot", json.to_str().unwrap(), "-o", f.to_str().unwrap()],
            None,
        );
        assert!(std::fs::read(&f).unwrap().starts_with(magic), "{ext}");
    }
}

/// `dmkit node stats --connect TARGET` as JSON.
fn node_stats(target: &str) -> serde_json::Value {
    let out = dmkit_ok(&["node", "stats", "--connect", target], None);
    serde_json::from_slice(&out.stdout).unwrap()
}

/// A remote `bench ycsb` killed with SIGKILL mid-run leaves nothing on the
/// node (issue 36, Found 2): its session ends with its socket, the index it
/// alone held is freed — chunks and root — and `node roots` lists nothing;
/// `node gc` finds nothing left to collect.
#[test]
fn a_killed_remote_benchmark_leaves_nothing_behind() {
    let mut node = Node::start("128MiB", Stdio::null());
    let target = node.target.clone();
    let mut bench = Command::new(DMKIT)
        .args([
            "bench",
            "ycsb",
            "--connect",
            &target,
            "--index",
            "race",
            "--workload",
            "a",
            "--keys",
            "20000",
            "--threads",
            "1",
            "--duration",
            "30s",
        ])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    // Wait until the benchmark's index holds memory on the node.
    let t0 = Instant::now();
    let held = loop {
        let st = node_stats(&target);
        let b = st["persistent_chunk_bytes"].as_u64().unwrap();
        if b > 0 && st["roots"].as_u64().unwrap() > 0 {
            break b;
        }
        assert!(
            t0.elapsed() < Duration::from_secs(20),
            "the benchmark never built its index: {st}"
        );
        std::thread::sleep(Duration::from_millis(50));
    };
    let roots = dmkit_ok(&["node", "roots", "--connect", &target, "--json"], None);
    let roots: serde_json::Value = serde_json::from_slice(&roots.stdout).unwrap();
    assert!(
        roots
            .as_array()
            .unwrap()
            .iter()
            .any(|r| r["name"].as_str().unwrap().starts_with("race/")
                && r["refs"].as_u64() == Some(1)),
        "{roots}"
    );
    std::thread::sleep(Duration::from_millis(300));
    bench.kill().unwrap(); // SIGKILL
    bench.wait().unwrap();
    let t0 = Instant::now();
    let st = loop {
        let st = node_stats(&target);
        // Only this query's own session is left.
        if st["sessions_active"].as_u64() == Some(1) {
            break st;
        }
        assert!(t0.elapsed() < Duration::from_secs(5), "{st}");
        std::thread::sleep(Duration::from_millis(20));
    };
    assert_eq!(st["chunk_bytes"].as_u64(), Some(0), "{st}");
    assert_eq!(st["roots"].as_u64(), Some(0), "{st}");
    assert!(st["chunks_reclaimed"].as_u64().unwrap() > 0, "{st}");
    assert_eq!(
        st["heap_free_bytes"].as_u64(),
        st["heap_bytes"].as_u64(),
        "every byte of the {held} B index is back: {st}"
    );
    let roots = dmkit_ok(&["node", "roots", "--connect", &target, "--json"], None);
    assert_eq!(
        serde_json::from_slice::<serde_json::Value>(&roots.stdout).unwrap(),
        serde_json::json!([])
    );
    let gc = dmkit_ok(&["node", "gc", "--connect", &target], None);
    assert_eq!(
        String::from_utf8_lossy(&gc.stdout).trim(),
        "freed 0 chunks, 0 B"
    );
    dmkit_ok(&["node", "shutdown", "--connect", &target], None);
    node.child().wait().unwrap();
}

/// `bench micro` as perftest users run it: `-a` sweeps 2 B to 8 MiB, `-n`
/// runs a fixed number of requests, `--csv` writes one line per run
/// beside the JSON, and `--repeat` gives each size its spread.
#[test]
fn micro_sweeps_sizes_with_iterations_and_csv() {
    let dir = tempfile::tempdir().unwrap();
    let (csv, json) = (dir.path().join("a.csv"), dir.path().join("a.json"));
    let out = dmkit_ok(
        &[
            "bench",
            "micro",
            "-a",
            "-n",
            "16",
            "--region-size",
            "16MiB",
            "--quiet",
            "--csv",
            csv.to_str().unwrap(),
            "--json",
        ],
        Some(&json),
    );
    let sizes: Vec<u64> = (1..=23).map(|i| 1u64 << i).collect();
    let text = std::fs::read_to_string(&csv).unwrap();
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(lines.len(), 1 + sizes.len(), "{text}");
    let header: Vec<&str> = lines[0].split(',').collect();
    let col = |name: &str| header.iter().position(|h| *h == name).unwrap();
    for (line, size) in lines[1..].iter().zip(&sizes) {
        let f: Vec<&str> = line.split(',').collect();
        assert_eq!(f.len(), header.len(), "{line}");
        assert_eq!(f[col("size")], size.to_string(), "{line}");
        assert_eq!(f[col("ops")], "16", "{line}");
        let (p50, p99): (f64, f64) = (
            f[col("p50_us")].parse().unwrap(),
            f[col("p99_us")].parse().unwrap(),
        );
        assert!(p50 > 0.0 && p99 >= p50, "{line}");
        // Gb/s is the payload of the counted requests over the window.
        let (mops, gbps): (f64, f64) = (
            f[col("mops")].parse().unwrap(),
            f[col("gbps")].parse().unwrap(),
        );
        assert!(
            (gbps - mops * *size as f64 * 8.0 / 1e3).abs() <= 1e-3 * gbps.max(1.0),
            "{line}"
        );
    }
    assert_eq!(
        String::from_utf8_lossy(&out.stdout).lines().count(),
        1 + sizes.len()
    );
    let v = read_json(&json);
    assert_provenance(&v, "micro -a");
    assert_eq!(v["sizes"].as_array().unwrap().len(), sizes.len());
    assert_eq!(v["runs"].as_array().unwrap().len(), sizes.len());
    assert_eq!(v["points"][22]["size"], 8 << 20);

    let json = dir.path().join("r.json");
    dmkit_ok(
        &[
            "bench",
            "micro",
            "--sizes",
            "64,4KiB",
            "--repeat",
            "2",
            "-n",
            "50",
            "--region-size",
            "1MiB",
            "--quiet",
            "--json",
        ],
        Some(&json),
    );
    let v = read_json(&json);
    let runs = v["runs"].as_array().unwrap();
    assert_eq!(runs.len(), 4);
    assert_eq!(
        (runs[1]["size"].clone(), runs[2]["size"].clone()),
        (64.into(), 4096.into())
    );
    assert_eq!(v["points"][1]["mops"]["n"], 2);
    assert_eq!(v["provenance"]["repeat"], 2);
}

/// Every other benchmark measures under the harness too: its JSON starts
/// with the provenance, and its window is the one asked for (`seconds` is
/// `--duration` exactly: one global window after the start barrier, not
/// the threads' own staggered ones).
#[test]
fn every_bench_writes_provenance_and_measures_one_window() {
    let dir = tempfile::tempdir().unwrap();
    let window = |r: &serde_json::Value, secs: f64, what: &str| {
        let s = r["seconds"]
            .as_f64()
            .unwrap_or_else(|| panic!("{what}: {r}"));
        assert!(
            (s - secs).abs() < 1e-6,
            "{what}: seconds {s}, not {secs}: {r}"
        );
        assert_eq!(r["interrupted"], false, "{what}");
    };
    let cases: &[(&str, &[&str], f64)] = &[
        ("rpc", &["--duration", "200ms", "--warmup", "50ms"], 0.2),
        (
            "corm",
            &[
                "--objects",
                "2000",
                "--duration",
                "200ms",
                "--warmup",
                "50ms",
            ],
            0.2,
        ),
        (
            "vector-io",
            &[
                "--method",
                "sp,sgl",
                "--batch",
                "4",
                "--region-size",
                "1MiB",
                "--local",
                "off",
                "--duration",
                "100ms",
            ],
            0.1,
        ),
        (
            "io-consolidation",
            &["--theta", "4", "--duration", "100ms"],
            0.1,
        ),
        (
            "atomics",
            &[
                "--primitive",
                "sequencer",
                "--place",
                "local,remote",
                "--backoff",
                "off",
                "--threads",
                "1,2",
                "--duration",
                "100ms",
            ],
            0.1,
        ),
    ];
    for (bench, args, secs) in cases {
        let json = dir.path().join(format!("{bench}.json"));
        let mut all = vec!["bench", bench];
        all.extend_from_slice(args);
        all.push("--json");
        let out = dmkit_ok(&all, Some(&json));
        assert!(
            String::from_utf8_lossy(&out.stdout).contains("Mops"),
            "{bench}"
        );
        let v = read_json(&json);
        assert_provenance(&v, bench);
        match v["runs"].as_array() {
            Some(points) => {
                assert!(!points.is_empty(), "{bench}: {v}");
                for p in points {
                    window(p, *secs, bench);
                }
            }
            None => window(&v, *secs, bench),
        }
    }
    // --repeat on the sweeps: every run, each point's runs in a row, and
    // each point's spread (keyed by its swept fields).
    let sweeps: &[(&str, &[&str], &str)] = &[
        (
            "vector-io",
            &[
                "--method",
                "sp",
                "--batch",
                "1,4",
                "--region-size",
                "1MiB",
                "--local",
                "off",
            ],
            "batch",
        ),
        (
            "io-consolidation",
            &["--theta", "2,4", "--native", "off"],
            "theta",
        ),
        (
            "atomics",
            &[
                "--primitive",
                "sequencer",
                "--place",
                "local",
                "--backoff",
                "off",
                "--threads",
                "1,2",
            ],
            "threads",
        ),
    ];
    for (bench, args, swept) in sweeps {
        let json = dir.path().join(format!("{bench}-repeat.json"));
        let mut all = vec!["bench", bench, "--duration", "50ms", "--repeat", "3"];
        all.extend_from_slice(args);
        all.push("--json");
        let out = dmkit_ok(&all, Some(&json));
        assert!(
            String::from_utf8_lossy(&out.stdout).contains("3 runs,"),
            "{bench}: {}",
            String::from_utf8_lossy(&out.stdout)
        );
        let v = read_json(&json);
        assert_eq!(v["provenance"]["repeat"], 3, "{bench}");
        let runs = v["runs"].as_array().unwrap();
        let points = v["points"].as_array().unwrap();
        assert_eq!((runs.len(), points.len()), (6, 2), "{bench}: {v}");
        for (i, p) in points.iter().enumerate() {
            assert_eq!(p["mops"]["n"], 3, "{bench}: {p}");
            let mine = &runs[3 * i..3 * i + 3];
            assert!(mine.iter().all(|r| r[swept] == p[swept]), "{bench}: {v}");
            let mean = mine
                .iter()
                .map(|r| r["mops"].as_f64().unwrap())
                .sum::<f64>()
                / 3.0;
            assert!(
                (p["mops"]["mean"].as_f64().unwrap() - mean).abs() < 1e-9,
                "{bench}: {p}"
            );
        }
        assert_ne!(points[0][swept], points[1][swept], "{bench}: {v}");
    }
    // --repeat: every run and the spread of their throughput.
    let json = dir.path().join("rpc2.json");
    dmkit_ok(
        &[
            "bench",
            "rpc",
            "--duration",
            "100ms",
            "--warmup",
            "10ms",
            "--repeat",
            "2",
            "--json",
        ],
        Some(&json),
    );
    let v = read_json(&json);
    assert_eq!(v["runs"].as_array().unwrap().len(), 2, "{v}");
    assert_eq!(v["mops"]["n"], 2, "{v}");
    // The transaction benchmark: its window opens at a start barrier, it
    // writes the same provenance, and --repeat gives the spread.
    let json = dir.path().join("txn.json");
    dmkit_ok(
        &[
            "bench",
            "txn",
            "--scale",
            "1000",
            "--threads",
            "1",
            "--coros",
            "2",
            "--duration",
            "200ms",
            "--repeat",
            "2",
            "--json",
        ],
        Some(&json),
    );
    let v = read_json(&json);
    assert_provenance(&v, "txn");
    assert_eq!(v["runs"].as_array().unwrap().len(), 2, "{v}");
    assert_eq!(v["mops"]["n"], 2, "{v}");
    for r in v["runs"].as_array().unwrap() {
        // Seconds are the window's, not the run's.
        assert!((r["seconds"].as_f64().unwrap() - 0.2).abs() < 1e-6, "{r}");
    }
}

/// A default `dmkit memnode` (1 GiB) and a default `bench micro --connect`
/// fit together: with --connect the region defaults to 512 MiB (a 1 GiB
/// region would not fit beside the node's own first page).
#[test]
fn a_default_node_holds_a_default_micro_run() {
    let node = Node::start("1GiB", Stdio::null());
    let dir = tempfile::tempdir().unwrap();
    let json = dir.path().join("m.json");
    dmkit_ok(
        &[
            "bench",
            "micro",
            "--connect",
            &node.target,
            "-n",
            "2000",
            "--json",
        ],
        Some(&json),
    );
    let r = read_json(&json);
    assert_eq!(r["region_size"].as_u64(), Some(512 << 20), "{r}");
}

/// `bench lockcheck`: threads on one lock word, the counter it guards
/// checked at the end (on shm: the check itself; on the guests it is the
/// test of `dmkit switch --cas-to-write`).
#[test]
fn lockcheck_holds_mutual_exclusion_on_shm() {
    let out = dmkit_ok(
        &[
            "bench",
            "lockcheck",
            "--backend",
            "shm",
            "--threads",
            "3",
            "--duration",
            "300ms",
        ],
        None,
    );
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("mutual exclusion held: counter"), "{text}");
}

/// `--completion-timeout` bounds a verbs queue pair's wait for a lost
/// completion; shm and the simulator lose none, so there it is refused
/// rather than silently ignored.
#[test]
fn completion_timeout_is_refused_off_the_verbs_backend() {
    for backend in [
        &["bench", "lockcheck", "--backend", "shm"][..],
        &["bench", "ycsb", "--backend", "sim"][..],
    ] {
        let mut all = backend.to_vec();
        all.extend(["--completion-timeout", "1s"]);
        let (code, err) = dmkit_fails(&all);
        assert_eq!(code, Some(2), "{all:?}: {err}");
        assert!(
            err.contains("--completion-timeout is a verbs option"),
            "{all:?}: {err}"
        );
    }
}

/// `dmkit switch`: CAS→WRITE needs the memory node's address and does not
/// run with steering yet; multiplexing needs the switch's own address and
/// the node's, a path MTU InfiniBand has, and no steering.
#[test]
fn switch_refuses_what_cas_to_write_and_mux_cannot_do() {
    let base = [
        "switch",
        "--listen",
        "127.0.0.1:0",
        "--port",
        "a=127.0.0.1:9",
    ];
    let with = |extra: &[&'static str]| -> Vec<&'static str> {
        base.iter().chain(extra).copied().collect()
    };
    let (_, e) = dmkit_fails(&with(&["--cas-to-write"]));
    assert!(e.contains("--cas-to-write needs --server"), "{e}");
    let (_, e) = dmkit_fails(&with(&[
        "--cas-to-write",
        "--server",
        "10.0.0.1",
        "--steer",
        "write",
    ]));
    assert!(e.contains("do not run together"), "{e}");
    let (_, e) = dmkit_fails(&with(&["--mux"]));
    assert!(e.contains("--mux needs --switch-ip"), "{e}");
    let (_, e) = dmkit_fails(&with(&["--mux", "--server", "10.0.0.1"]));
    assert!(e.contains("--mux needs --switch-ip"), "{e}");
    let mux = [
        "--mux",
        "--server",
        "10.0.0.1",
        "--switch-ip",
        "10.0.0.254",
        "--node-ctl",
        "127.0.0.1:9",
        "--node-token",
        "/nonexistent",
    ];
    let (_, e) = dmkit_fails(&with(&[&mux[..], &["--steer", "write"]].concat()));
    assert!(e.contains("--mux and --steer do not run together"), "{e}");
    let (_, e) = dmkit_fails(&with(&[&mux[..], &["--mux-mtu", "1000"]].concat()));
    assert!(e.contains("--mux-mtu"), "{e}");
    // Every check passed: what stops it now is the verbs control protocol
    // this build lacks (the guests' build has it: tools/softroce/multi.sh).
    let (_, e) = dmkit_fails(&with(
        &[&mux[..], &["--cas-to-write", "--mux-mtu", "4096"]].concat(),
    ));
    assert!(
        e.contains("--switch-ip") && e.contains("dmkit/verbs"),
        "{e}"
    );
    let (_, e) = dmkit_fails(&with(&["--switch-ip", "10.0.0.254"]));
    assert!(e.contains("--switch-ip needs --server"), "{e}");
}
