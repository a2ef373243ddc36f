//! `dmkit clover-mds`: Clover's metadata server in a process of its own
//! (dmkit-clover's `Mds`): it walks a store's chains on a memory node,
//! cuts their superseded prefixes and hands reclaimed versions back to
//! clients through the store's pool — all with one-sided verbs, so the
//! clients never talk to it. One runs per store (it claims the store's
//! `mds` root).

use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use clap::Args;
use dmkit_clover::{CloverConfig, CloverKv, MdsConfig};
use dmkit_fabric::shm::{ShmConfig, ShmFabric};
use dmkit_fabric::Fabric;
use dmkit_index::RemoteMap;
use dmkit_runtime::Worker;

use crate::args::targets;
use crate::Res;

#[derive(Args)]
pub(crate) struct CloverMdsArgs {
    /// The memory node's socket (a node run by `dmkit memnode --listen unix:PATH`).
    #[arg(long, value_name = "PATH")]
    connect: PathBuf,
    /// The token file (default: PATH.token).
    #[arg(long)]
    token_file: Option<PathBuf>,
    /// The store's name.
    #[arg(long)]
    name: String,
    /// Create the store first (with Clover's default limits) if it does
    /// not exist.
    #[arg(long)]
    create: bool,
    /// Time between rounds.
    #[arg(long, default_value = "2ms", value_parser = humantime::parse_duration)]
    period: Duration,
    /// Stop after this long (default: run until killed).
    #[arg(long, value_parser = humantime::parse_duration)]
    duration: Option<Duration>,
}

pub(crate) fn clover_mds(a: CloverMdsArgs) -> Res {
    let t = targets(std::slice::from_ref(&a.connect), &a.token_file)?;
    let fabric: Arc<dyn Fabric> = Arc::new(
        ShmFabric::open(ShmConfig::default(), &t)
            .map_err(|e| format!("connecting to {}: {e}", a.connect.display()))?,
    );
    let cfg = CloverConfig {
        gc: false,
        mds: MdsConfig {
            period: a.period.as_nanos() as u64,
            ..MdsConfig::default()
        },
        ..CloverConfig::default()
    };
    let kv = match CloverKv::open(fabric.clone(), &a.name, cfg.clone()) {
        Ok(kv) => kv,
        Err(dmkit_index::IndexError::NotFound { .. }) if a.create => {
            CloverKv::create(fabric.clone(), &a.name, cfg).map_err(|e| e.to_string())?
        }
        Err(e) => return Err(e.to_string()),
    };
    let mds = kv.mds();
    let mut w = Worker::builder(fabric.as_ref())
        .tasks(1)
        .local(mds.local_layout())
        .build()
        .map_err(|e| e.to_string())?;
    let stop = Arc::new(AtomicBool::new(false));
    mds.spawn(&mut w, stop.clone()).map_err(|e| e.to_string())?;
    if let Some(d) = a.duration {
        let s = stop.clone();
        std::thread::spawn(move || {
            std::thread::sleep(d);
            s.store(true, Ordering::Release);
        });
    }
    eprintln!("clover-mds: serving store {:?}", a.name);
    w.run();
    let m = kv.mds_stats();
    println!(
        "{{\"rounds\": {}, \"superseded\": {}, \"cut\": {}, \"freed\": {}, \"head_moves\": {}, \"resets\": {}}}",
        m.rounds, m.superseded, m.cut, m.freed, m.head_moves, m.resets
    );
    Ok(())
}
