//! Argument types and helpers shared by several commands: on/off
//! switches, where a memory node listens or is reached, RDMA device
//! selection, token files, and simulator device profiles.

use std::path::PathBuf;

use clap::{Args, ValueEnum};
use dmkit_fabric::shm::{parse_unix_target, Target};
use dmkit_memnode::server::default_token_path;

/// RDMA device selection (tcp: listeners and --backend verbs). Nothing is
/// hard-coded: default device = the first listed, port 1, GID = the first
/// RoCE v2 IPv4-mapped GID (RoCE) or LID routing (InfiniBand).
#[derive(Args, Clone)]
pub(crate) struct RdmaArgs {
    /// RDMA device name (e.g. mlx5_0, rxe0).
    #[arg(long, help_heading = "RDMA devices (--backend verbs, tcp: listeners)")]
    rdma_device: Option<String>,
    /// Device port (1-based).
    #[arg(long, help_heading = "RDMA devices (--backend verbs, tcp: listeners)")]
    rdma_port: Option<u8>,
    /// GID index (RoCE; on InfiniBand selects routing with a global header).
    #[arg(long, help_heading = "RDMA devices (--backend verbs, tcp: listeners)")]
    gid_index: Option<u8>,
}

impl RdmaArgs {
    pub(crate) fn sel(&self) -> dmkit_verbs::DeviceSel {
        dmkit_verbs::DeviceSel {
            device: self.rdma_device.clone(),
            port: self.rdma_port,
            gid_index: self.gid_index,
        }
    }
}

/// Where a memory node listens / is reached.
#[derive(Clone, Debug)]
pub(crate) enum Listen {
    Unix(PathBuf),
    Tcp(String),
}

pub(crate) fn parse_listen(s: &str) -> Result<Listen, String> {
    match s.strip_prefix("tcp:") {
        Some(a)
            if a.rsplit_once(':')
                .is_some_and(|(h, p)| !h.is_empty() && p.parse::<u16>().is_ok()) =>
        {
            Ok(Listen::Tcp(a.to_string()))
        }
        Some(_) => Err(format!("{s:?}: expected tcp:HOST:PORT")),
        None => parse_unix_target(s)
            .map(Listen::Unix)
            .map_err(|_| format!("{s:?}: expected unix:PATH or tcp:HOST:PORT")),
    }
}

#[derive(Clone, Copy, PartialEq, Eq, ValueEnum)]
pub(crate) enum OnOff {
    On,
    Off,
}

/// `--shm-write-prefetch`: which WRITEs hint the lines after them for
/// writing (`ShmConfig::write_prefetch`).
#[derive(Clone, Copy, PartialEq, Eq, ValueEnum)]
pub(crate) enum WritePrefetchArg {
    /// The default mode (`stream`).
    On,
    Off,
    /// Only a WRITE that starts where one of the queue pair's last 8
    /// WRITEs ended.
    Stream,
    /// Every WRITE.
    Always,
}

impl From<WritePrefetchArg> for dmkit_fabric::shm::WritePrefetch {
    fn from(a: WritePrefetchArg) -> Self {
        match a {
            WritePrefetchArg::On => Self::default(),
            WritePrefetchArg::Off => Self::Off,
            WritePrefetchArg::Stream => Self::Stream,
            WritePrefetchArg::Always => Self::Always,
        }
    }
}

pub(crate) fn targets(
    paths: &[PathBuf],
    token_file: &Option<PathBuf>,
) -> Result<Vec<Target>, String> {
    if token_file.is_some() && paths.len() > 1 {
        return Err("--token-file names one file; with several --connect use each node's default PATH.token".into());
    }
    Ok(paths
        .iter()
        .map(|p| Target {
            socket: p.clone(),
            token_file: token_file.clone().unwrap_or_else(|| default_token_path(p)),
        })
        .collect())
}

/// A device profile by name or path, its atomic order and access stall
/// overridden if asked.
pub(crate) fn load_profile(
    name: &str,
    order: Option<dmkit_sim::profile::AtomicOrder>,
    stalls: Option<OnOff>,
) -> Result<dmkit_sim::Profile, String> {
    let mut p = dmkit_sim::Profile::load(name)?;
    // Reports name the profile: say what was changed.
    if let Some(o) = order {
        if o != p.responder.atomic_order {
            p.name = format!("{}, atomic order {}", p.name, o.name());
        }
        p.responder.atomic_order = o;
    }
    // The access stall is modelled under `post` only: another order turns
    // it off unless it was asked for.
    let stalls = match stalls {
        Some(s) => Some(s == OnOff::On),
        None if p.responder.atomic_order != dmkit_sim::profile::AtomicOrder::Post => Some(false),
        None => None,
    };
    if let Some(on) = stalls {
        if on != p.responder.atomic_stalls_access {
            let what = if on { "on" } else { "off" };
            p.name = format!("{}, atomic access stall {what}", p.name);
        }
        p.responder.atomic_stalls_access = on;
    }
    p.validate()?;
    Ok(p)
}

pub(crate) fn parse_atomic_order(s: &str) -> Result<dmkit_sim::profile::AtomicOrder, String> {
    use dmkit_sim::profile::AtomicOrder;
    AtomicOrder::ALL
        .into_iter()
        .find(|o| o.name() == s)
        .ok_or_else(|| {
            let names: Vec<_> = AtomicOrder::ALL.iter().map(|o| o.name()).collect();
            format!("{s:?}: expected one of {}", names.join(", "))
        })
}

/// Ctrl-C ends a benchmark as its clock would: the first one asks the
/// running measurement to stop ([`dmkit_bench::harness::interrupt`]); the
/// command then prints and writes what was measured and removes its index
/// through its normal path. A second Ctrl-C exits at once (status 130).
/// The `ctrlc` crate runs the handler on a thread of its own, so it may
/// print and take locks, which a raw signal handler may not.
pub(crate) fn stop_on_ctrl_c() {
    let _ = ctrlc::set_handler(|| {
        if dmkit_bench::harness::interrupted() {
            eprintln!("dmkit: interrupted again: exiting now");
            std::process::exit(130);
        }
        eprintln!("\ndmkit: interrupted: ending the measurement (Ctrl-C again to quit at once)");
        dmkit_bench::harness::interrupt();
    });
}
