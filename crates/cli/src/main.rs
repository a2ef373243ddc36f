//! `dmkit`: run memory nodes and benchmarks.
//!
//! ```text
//! dmkit memnode --size 4GiB --listen unix:/tmp/dm0.sock
//! dmkit bench micro --verb read --threads 2 --duration 5s [--connect unix:/tmp/dm0.sock]
//! dmkit bench ycsb --index race --workload c --keys 1000000 --threads 2 --coros 8
//! dmkit plot a.json b.json -o out.png
//! dmkit node stats --connect unix:/tmp/dm0.sock
//! ```
//!
//! One module per command (`memnode`, `bench`, `node`, `plot`, `sim`), so
//! a change to one command does not touch the others; `args` holds the
//! flags and helpers several commands share, `units` byte sizes. This file
//! is the command tree, the dispatch and the exit status.

mod app;
mod args;
mod bench;
mod clover_mds;
mod corm;
mod memnode;
mod node;
mod plot;
mod sim;
mod switch;
mod units;

use std::process::ExitCode;

use clap::{Parser, Subcommand};

use bench::BenchCmd;
use memnode::MemnodeArgs;
use node::NodeCmd;
use plot::PlotArgs;
use sim::SimCmd;

/// mimalloc instead of the system allocator: the simulator keeps the state
/// of thousands of tasks and connections in small allocations and walks
/// them in an order no cache predicts; mimalloc's size-segregated pages
/// pack them more densely. `dmkit sim speed` (6 machines × 96 threads × 8
/// tasks): 5.76 → 6.41 M simulated verbs per wall second, median of five
/// alternating runs; the single-machine run is unchanged.
#[global_allocator]
static ALLOC: mimalloc::MiMalloc = mimalloc::MiMalloc;

#[derive(Parser)]
#[command(
    name = "dmkit",
    version,
    about = "A toolkit for disaggregated memory over one-sided verbs"
)]
struct Cli {
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// Run a memory node process: shm clients on a Unix socket, or verbs
    /// clients (RDMA) on a TCP control channel.
    Memnode(MemnodeArgs),
    /// Benchmarks.
    #[command(subcommand)]
    Bench(Box<BenchCmd>),
    /// Control operations on a running memory node.
    #[command(subcommand)]
    Node(NodeCmd),
    /// Plot benchmark results (JSON files of `bench ycsb`): throughput vs threads.
    Plot(PlotArgs),
    /// The deterministic RNIC simulator: reproduce the papers' figures.
    #[command(subcommand)]
    Sim(SimCmd),
    /// The CoRM object store: replay allocation traces on its allocator.
    #[command(subcommand)]
    Corm(corm::CormCmd),
    /// The memory-semantics study's applications: shuffle, join, log, and
    /// the hash table's breakdown.
    #[command(subcommand)]
    App(app::AppCmd),
    /// Clover's metadata server for a store, in a process of its own.
    CloverMds(clover_mds::CloverMdsArgs),
    /// A software top-of-rack switch for RoCEv2 between QEMU guests (UDP
    /// ports on the host): learning, pcap capture, counters.
    Switch(switch::SwitchArgs),
}

/// A closed standard output (`dmkit … | head`) ends the program quietly
/// with the status of a process killed by SIGPIPE (128 + 13), as other Unix
/// tools do, instead of `println!`'s panic and backtrace. (Rust ignores
/// SIGPIPE, so the write fails with EPIPE and `println!` panics with this
/// message; restoring the signal's default would need `unsafe`.)
fn quiet_on_closed_stdout() {
    let default = std::panic::take_hook();
    std::panic::set_hook(Box::new(move |info| {
        let p = info.payload();
        let msg = p
            .downcast_ref::<String>()
            .map(String::as_str)
            .or_else(|| p.downcast_ref::<&str>().copied())
            .unwrap_or("");
        if msg.starts_with("failed printing to stdout") && msg.contains("Broken pipe") {
            std::process::exit(141);
        }
        default(info);
    }));
}

fn main() -> ExitCode {
    quiet_on_closed_stdout();
    let cli = Cli::parse();
    let r = match cli.cmd {
        Cmd::Memnode(a) => memnode::memnode(a),
        Cmd::Bench(b) => match *b {
            BenchCmd::Micro(a) => bench::micro::bench_micro(a),
            BenchCmd::Ycsb(a) => bench::ycsb::bench_ycsb(a),
            BenchCmd::Txn(a) => bench::txn::bench_txn(a),
            BenchCmd::Rpc(a) => bench::rpc::bench_rpc(a),
            BenchCmd::Corm(a) => bench::corm_bench::bench_corm(a),
            BenchCmd::VectorIo(a) => bench::vector_io::bench_vector_io(a),
            BenchCmd::IoConsolidation(a) => bench::consolidation::bench_consolidation(a),
            BenchCmd::Atomics(a) => bench::atomics::bench_atomics(a),
            BenchCmd::Lockcheck(a) => bench::lockcheck::bench_lockcheck(a),
        },
        Cmd::Plot(a) => plot::plot(a),
        Cmd::App(a) => app::app(a),
        Cmd::Sim(SimCmd::Reproduce(a)) => sim::sim_reproduce(a),
        Cmd::Sim(SimCmd::Speed(a)) => sim::sim_speed(a),
        Cmd::Sim(SimCmd::Check(a)) => sim::sim_check(a),
        Cmd::Node(NodeCmd::Stats(a)) => node::node_stats(a),
        Cmd::Node(NodeCmd::Roots(a)) => node::node_roots(a),
        Cmd::Node(NodeCmd::Gc(a)) => node::node_gc(a),
        Cmd::Node(NodeCmd::Shutdown(a)) => node::node_shutdown(a),
        Cmd::Corm(c) => corm::corm(c),
        Cmd::CloverMds(a) => clover_mds::clover_mds(a),
        Cmd::Switch(a) => switch::switch(a),
    };
    match r {
        // Ctrl-C ended a benchmark: its results were printed and written;
        // the status says it was cut short, as a shell expects of SIGINT.
        Ok(()) if dmkit_bench::harness::interrupted() => ExitCode::from(130),
        Ok(()) => ExitCode::SUCCESS,
        // Bad input (found before any work) exits 2, as clap's own flag
        // errors do; a run that failed exits 1.
        Err(e) if BAD_INPUT.load(std::sync::atomic::Ordering::Relaxed) => {
            eprintln!("dmkit: {e}");
            ExitCode::from(2)
        }
        Err(e) => {
            eprintln!("dmkit: {e}");
            ExitCode::FAILURE
        }
    }
}

/// What a command returns: `Err` is the message `main` prints before it
/// exits with failure (status 1, or 2 when [`bad_input`] made it).
type Res = Result<(), String>;

static BAD_INPUT: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// Marks `msg` as a bad-input error: the command refused its flags before
/// doing any work, and dmkit exits with status 2 (as for a flag clap
/// rejects). Validation steps wrap their errors with it
/// (`validate(..).map_err(bad_input)?`); errors of a run keep status 1.
pub(crate) fn bad_input(msg: impl Into<String>) -> String {
    BAD_INPUT.store(true, std::sync::atomic::Ordering::Relaxed);
    msg.into()
}
