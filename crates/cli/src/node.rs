//! `dmkit node`: control operations on a running memory node (`stats`,
//! `roots`, `gc`, `shutdown`).

use std::path::PathBuf;

use clap::{Args, Subcommand};
use dmkit_fabric::shm::{parse_unix_target, ShmConfig, ShmFabric};
use dmkit_fabric::Fabric;

use dmkit_memnode::server::read_token_file;
use dmkit_memnode::{AdminOp, Response};

use crate::args::targets;
use crate::Res;
use dmkit_fabric::ControlPlane;

#[derive(Subcommand)]
pub(crate) enum NodeCmd {
    /// Print a node's statistics as JSON.
    Stats(ConnectArgs),
    /// List the node's roots and chunk groups: name, holding sessions
    /// and their references, chunks and bytes (a table, or JSON).
    Roots(RootsArgs),
    /// Free what dead sessions left (persistent chunks whose session has
    /// ended, groups nobody holds) — or, with --root, one index's root and
    /// chunk group now, held or not: an admin request, authorised by the
    /// node's token file.
    Gc(GcArgs),
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

#[derive(Args)]
pub(crate) struct GcArgs {
    #[command(flatten)]
    connect: ConnectArgs,
    /// Collect this root and its chunk group (e.g. `art/t`) even while
    /// sessions hold it: its memory is freed and the name removed; each
    /// holder's later requests on it fail with a "collected by an admin"
    /// error. Its addresses are fenced until the holders' sessions end:
    /// unmapped (a holder's one-sided verbs fail with "page not mapped" on
    /// shm; through the verbs server they reach only the discarded memory)
    /// and given to nobody else. For an index whose clients are stuck or
    /// gone; a live one loses its data.
    #[arg(long)]
    root: Option<String>,
}

#[derive(Args)]
pub(crate) struct RootsArgs {
    #[command(flatten)]
    connect: ConnectArgs,
    /// Print JSON instead of a table.
    #[arg(long)]
    json: bool,
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

pub(crate) fn node_roots(a: RootsArgs) -> Res {
    let f = control(&a.connect)?;
    let roots = f.list_roots(f.nodes()[0]).map_err(|e| e.to_string())?;
    if a.json {
        let rows: Vec<serde_json::Value> = roots
            .iter()
            .map(|r| {
                serde_json::json!({
                    "name": r.name,
                    "value": r.value,
                    "group": r.group,
                    "holders": r.holders.iter().map(|&(s, n)| serde_json::json!({"session": s, "refs": n})).collect::<Vec<_>>(),
                    "refs": r.refs,
                    "chunks": r.chunks,
                    "bytes": r.bytes,
                })
            })
            .collect();
        println!(
            "{}",
            serde_json::to_string_pretty(&rows).expect("roots serialise")
        );
        return Ok(());
    }
    println!(
        "{:<40} {:>6} {:>8} {:>12}  owners (session×refs)",
        "name", "refs", "chunks", "bytes"
    );
    for r in &roots {
        let owners: Vec<String> = r.holders.iter().map(|(s, n)| format!("{s}×{n}")).collect();
        let name = match (&r.group, r.value) {
            (Some(g), _) if *g != r.name => format!("{} (of {g})", r.name),
            (_, None) => format!("{} (chunks only)", r.name),
            _ => r.name.clone(),
        };
        println!(
            "{:<40} {:>6} {:>8} {:>12}  {}",
            name,
            r.refs,
            r.chunks,
            r.bytes,
            if owners.is_empty() {
                "-".into()
            } else {
                owners.join(" ")
            }
        );
    }
    Ok(())
}

pub(crate) fn node_gc(a: GcArgs) -> Res {
    let c = &a.connect;
    let t = &targets(std::slice::from_ref(&c.connect), &c.token_file)?[0];
    let token = read_token_file(&t.token_file).map_err(|e| e.to_string())?;
    let f = control(c)?;
    let op = match &a.root {
        Some(name) => AdminOp::GcRoot { name: name.clone() },
        None => AdminOp::Gc,
    };
    match f
        .admin(f.nodes()[0], token, op)
        .map_err(|e| e.to_string())?
    {
        Response::Collected { chunks, bytes } => {
            match &a.root {
                Some(name) => println!("collected {name}: freed {chunks} chunks, {bytes} B"),
                None => println!("freed {chunks} chunks, {bytes} B"),
            }
            Ok(())
        }
        other => Err(format!("unexpected answer to gc: {other:?}")),
    }
}
