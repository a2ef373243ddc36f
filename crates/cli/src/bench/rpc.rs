//! `dmkit bench rpc`: echo round trips through a memory node's RPC
//! workers (the RPC baseline; `dmkit_bench::rpc`).

use std::io::IsTerminal;
use std::path::PathBuf;
use std::time::Duration;

use clap::{Args, ValueEnum};
use dmkit_bench::rpc::{self, RpcConfig};
use dmkit_fabric::shm::{ShmConfig, ShmFabric};
use dmkit_memnode::NodeConfig;
use indicatif::{ProgressBar, ProgressStyle};

use crate::args::{load_profile, parse_listen, targets, Listen};
use crate::units::parse_size;
use crate::Res;

#[derive(Clone, Copy, ValueEnum)]
enum RpcBackend {
    /// Shared memory: an embedded node, or a node process via --connect.
    Shm,
    /// The simulator (virtual time).
    Sim,
}

#[derive(Args)]
pub(crate) struct RpcArgs {
    /// Fabric backend.
    #[arg(long, value_enum, default_value = "shm")]
    backend: RpcBackend,
    /// A memory node process (unix:PATH); default: an embedded node.
    #[arg(long, value_parser = parse_listen)]
    connect: Option<Listen>,
    /// Token file for --connect (default PATH.token).
    #[arg(long)]
    token_file: Option<PathBuf>,
    /// Payload bytes of each request (and reply).
    #[arg(long, default_value = "8", value_parser = parse_size)]
    size: u64,
    /// Client threads (runtime workers).
    #[arg(long, default_value_t = 1)]
    threads: usize,
    /// Tasks per client thread, each with one call in flight.
    #[arg(long, default_value_t = 1)]
    coros: usize,
    /// The node's RPC worker threads (shm: the embedded node's; sim: its
    /// cores, default the profile's `rpc.cores`).
    #[arg(long)]
    workers: Option<usize>,
    /// How long to measure (virtual time on the simulator).
    #[arg(long, default_value = "3s", value_parser = humantime::parse_duration)]
    duration: Duration,
    /// Time before measuring (default 500ms on shm, 1ms on the simulator).
    #[arg(long, value_parser = humantime::parse_duration)]
    warmup: Option<Duration>,
    /// Simulator: device profile (cx6-200g, cx5-100g, cx3-56g, cx3-40g, or a TOML file).
    #[arg(long, default_value = "cx3-56g")]
    profile: String,
    /// Seed.
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// Measure this many times; prints each run and the mean and spread of
    /// their throughput.
    #[arg(long, default_value_t = 1)]
    repeat: usize,
    /// Write the result as JSON to this file.
    #[arg(long)]
    json: Option<PathBuf>,
    /// No progress bar.
    #[arg(long)]
    quiet: bool,
}

pub(crate) fn bench_rpc(a: RpcArgs) -> Res {
    super::check_outputs(a.json.as_deref(), None)?;
    let sim = matches!(a.backend, RpcBackend::Sim);
    let cfg = RpcConfig {
        size: usize::try_from(a.size).map_err(|_| crate::bad_input("--size too large"))?,
        threads: a.threads,
        coros: a.coros,
        duration: a.duration,
        warmup: a.warmup.unwrap_or(if sim {
            Duration::from_millis(1)
        } else {
            Duration::from_millis(500)
        }),
        seed: a.seed,
    };
    if cfg.duration.is_zero() {
        return Err(crate::bad_input("--duration must be longer than 0s"));
    }
    if cfg.threads == 0 || cfg.coros == 0 {
        return Err(crate::bad_input("--threads and --coros must be at least 1"));
    }
    if sim && a.connect.is_some() {
        return Err(crate::bad_input(
            "--connect is an shm option: the simulator has its own nodes",
        ));
    }
    let fabric = match a.backend {
        RpcBackend::Sim => None,
        RpcBackend::Shm => Some(shm_fabric(&a, &cfg)?),
    };
    super::Measure {
        threads: cfg.threads,
        sim,
        seed: a.seed,
        duration: cfg.duration,
        warmup: cfg.warmup,
        repeat: a.repeat,
        json: a.json.as_deref(),
    }
    .runs(|| run_once(&a, &cfg, fabric.as_ref()))
}

fn shm_fabric(a: &RpcArgs, cfg: &RpcConfig) -> Result<ShmFabric, String> {
    let shm = ShmConfig {
        rpc_max_message: (cfg.size as u32).max(4096),
        ..Default::default()
    };
    match &a.connect {
        None => ShmFabric::embedded(
            shm,
            &[NodeConfig {
                size: 16 << 20,
                rpc_workers: a.workers.unwrap_or(dmkit_memnode::DEFAULT_RPC_WORKERS),
                ..Default::default()
            }],
        ),
        Some(Listen::Unix(p)) => {
            if a.workers.is_some() {
                return Err(crate::bad_input("--workers sets the embedded node's; a node process has its own (dmkit memnode --workers N)"));
            }
            ShmFabric::open(shm, &targets(std::slice::from_ref(p), &a.token_file)?)
        }
        Some(Listen::Tcp(_)) => {
            return Err(crate::bad_input("bench rpc runs on shm and sim; tcp:HOST:PORT nodes serve the verbs backend"))
        }
    }
    .map_err(|e| e.to_string())
}

fn run_once(
    a: &RpcArgs,
    cfg: &RpcConfig,
    fabric: Option<&ShmFabric>,
) -> Result<rpc::RpcResult, String> {
    Ok(match fabric {
        None => {
            let profile = load_profile(&a.profile, None, None)?;
            rpc::run_sim(
                dmkit_sim::SimConfig {
                    profile,
                    seed: a.seed,
                    memory_bytes: 64 << 20,
                    rpc_workers: a.workers,
                    ..Default::default()
                },
                cfg,
            )
            .map_err(|e| e.to_string())?
        }
        Some(fabric) => {
            let bar = (!a.quiet && std::io::stderr().is_terminal()).then(|| {
                let b = ProgressBar::new(cfg.duration.as_millis() as u64);
                b.set_style(
                    ProgressStyle::with_template("{spinner} {bar:40} {msg}")
                        .expect("valid template"),
                );
                b
            });
            let r = rpc::run(fabric, cfg, |el, calls| {
                if let Some(b) = &bar {
                    b.set_position(el.as_millis() as u64);
                    b.set_message(format!(
                        "{:.1}/{:.1} s  {:.3} Mops",
                        el.as_secs_f64(),
                        cfg.duration.as_secs_f64(),
                        calls as f64 / el.as_secs_f64().max(1e-9) / 1e6
                    ));
                }
            })
            .map_err(|e| e.to_string())?;
            if let Some(b) = bar {
                b.finish_and_clear();
            }
            r
        }
    })
}

impl super::Run for rpc::RpcResult {
    fn mops(&self) -> f64 {
        self.mops
    }

    fn interrupted(&self) -> bool {
        self.interrupted
    }

    fn print_row(&self, header: bool) {
        print_row(self, header)
    }
}

fn print_row(r: &rpc::RpcResult, header: bool) {
    if header {
        println!(
            "{:<8} {:>6} {:>7} {:>5} {:>7} {:>10} {:>8} {:>9} {:>8} {:>8} {:>8}",
            "backend",
            "size",
            "threads",
            "coros",
            "workers",
            "calls",
            "seconds",
            "Mops",
            "p50_us",
            "p99_us",
            "p999_us"
        );
    }
    println!(
        "{:<8} {:>6} {:>7} {:>5} {:>7} {:>10} {:>8.2} {:>9.4} {:>8.2} {:>8.2} {:>8.2}",
        r.backend,
        r.size,
        r.threads,
        r.coros,
        r.workers,
        r.calls,
        r.seconds,
        r.mops,
        r.p50_us,
        r.p99_us,
        r.latency.p999_us
    );
}
