//! Child-process helper for dmkit-race's multi-process tests. Not a user tool.
//!
//! ```text
//! dmkit-race-testkit stress SOCKET TABLE WORKERS TASKS OPS HOT FILL% SEED CLIENT_BASE START_NS
//! ```
//! Opens table TABLE on the memory node at SOCKET, runs the recorded stress
//! workload (from host-monotonic time START_NS on, so the
//! processes overlap) and prints one history line per operation (`stress::to_line`).

use std::io::Write;
use std::process::ExitCode;
use std::sync::Arc;

use dmkit_fabric::shm::{ShmConfig, ShmFabric, Target};
use dmkit_lincheck::stress::{self, StressConfig};
use dmkit_race::{RaceConfig, RaceTable};
use dmkit_runtime::RuntimeConfig;

fn main() -> ExitCode {
    let a: Vec<String> = std::env::args().skip(1).collect();
    if a.len() != 11 || a[0] != "stress" {
        eprintln!("usage: dmkit-race-testkit stress SOCKET TABLE WORKERS TASKS OPS HOT FILL% SEED CLIENT_BASE START_NS");
        return ExitCode::from(2);
    }
    let n = |i: usize| a[i].parse::<u64>().expect("numeric argument");
    let fabric =
        Arc::new(ShmFabric::open(ShmConfig::default(), &[Target::new(&a[1])]).expect("connect"));
    let cfg = RaceConfig {
        grace: 2_000_000,
        ..Default::default()
    };
    let table = RaceTable::open(fabric.clone(), &a[2], cfg).expect("open table");
    let sc = StressConfig {
        workers: n(3) as usize,
        tasks: n(4) as usize,
        ops_per_task: n(5) as usize,
        hot_keys: n(6),
        fill_percent: n(7) as u32,
        seed: n(8),
        client_base: n(9) as u32,
    };
    let start = n(10);
    while stress::host_now() < start {
        std::thread::sleep(std::time::Duration::from_micros(200));
    }
    match stress::run(
        fabric.as_ref(),
        &|id| table.client(id),
        &RuntimeConfig::default(),
        &sc,
    ) {
        Ok(h) => {
            let mut out = std::io::stdout().lock();
            for r in &h {
                writeln!(out, "{}", stress::to_line(r)).expect("stdout");
            }
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("stress failed: {e}");
            ExitCode::from(1)
        }
    }
}
