//! `dmkit node`: control operations on a running memory node (`stats`,
//! `shutdown`).

use std::path::PathBuf;

use clap::{Args, Subcommand};
use dmkit_fabric::shm::{parse_unix_target, ShmConfig, ShmFabric};
use dmkit_fabric::Fabric;

use crate::args::targets;
use crate::Res;
use dmkit_fabric::ControlPlane;

#[derive(Subcommand)]
pub(crate) enum NodeCmd {
    /// Print a node's statistics as JSON.
    Stats(ConnectArgs),
    /// Ask a node to shut down.
    Shutdown(ConnectArgs),
}

#[derive(Args)]
pub(crate) struct ConnectArgs {
    /// The node: unix:PATH.
    #[arg(long, value_parser = parse_unix_target)]
    connect: PathBuf,
    /// Token file (default PATH.token).
    #[arg(long)]
    token_file: Option<PathBuf>,
}

fn control(a: &ConnectArgs) -> Result<ShmFabric, String> {
    ShmFabric::open(
        ShmConfig::default(),
        &targets(std::slice::from_ref(&a.connect), &a.token_file)?,
    )
    .map_err(|e| e.to_string())
}

pub(crate) fn node_stats(a: ConnectArgs) -> Res {
    let f = control(&a)?;
    let node = f.nodes()[0];
    let st = f.node_stats(node).map_err(|e| e.to_string())?;
    println!(
        "{}",
        serde_json::to_string_pretty(&st).expect("stats serialise")
    );
    Ok(())
}

pub(crate) fn node_shutdown(a: ConnectArgs) -> Res {
    let f = control(&a)?;
    f.shutdown_node(f.nodes()[0]).map_err(|e| e.to_string())
}
