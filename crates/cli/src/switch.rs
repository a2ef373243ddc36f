//! `dmkit switch`: a software top-of-rack switch for RoCEv2 between QEMU
//! guests (tools/softroce/multi.sh). Each port is a UDP peer on the host
//! (a guest's `-netdev socket,udp=...`: one Ethernet frame per datagram);
//! the switch learns MACs, floods the unknown, parses RoCEv2 and counts
//! per rule, and captures to pcap (dmkit-switch's `hub` and `wire`).
//!
//! ```text
//! dmkit switch --listen 127.0.0.1:47900 --port mem=127.0.0.1:47901 \
//!     --port c1=127.0.0.1:47902 --pcap run.pcap --stats-json sw.json
//! ```

use std::net::{Ipv4Addr, SocketAddr};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use clap::Args;
use dmkit_switch::hub::{Hub, HubConfig};
use dmkit_switch::{Steer, SwitchConfig};

use crate::Res;

#[derive(Args)]
pub(crate) struct SwitchArgs {
    /// The switch's UDP address: every port's peer sends its frames here.
    #[arg(long, value_name = "HOST:PORT")]
    listen: SocketAddr,
    /// A port: a name and the UDP address its peer sends from (and the
    /// switch sends to). Repeat for each port.
    #[arg(long = "port", value_name = "NAME=HOST:PORT", required = true, value_parser = parse_port)]
    ports: Vec<(String, SocketAddr)>,
    /// Capture every frame received (pcap, Ethernet link type: Wireshark
    /// decodes RoCEv2 as InfiniBand).
    #[arg(long, value_name = "FILE")]
    pcap: Option<PathBuf>,
    /// Write the counters (JSON) every second and at the end.
    #[arg(long, value_name = "FILE")]
    stats_json: Option<PathBuf>,
    /// Stop after this long (default: until SIGINT/SIGTERM).
    #[arg(long, value_parser = humantime::parse_duration)]
    duration: Option<Duration>,
    /// Skip the per-packet ICRC check (counted as `icrc_mismatch`).
    #[arg(long)]
    no_icrc_check: bool,
    /// SwordBox's steering of Clover's requests (the simulator's policy
    /// code, on the packets): off, write or read-write. Needs --server.
    #[arg(long, default_value = "off")]
    steer: Steer,
    /// The memory node's IP address: requests to it and responses from it
    /// go through the policy.
    #[arg(long, value_name = "IPV4")]
    server: Option<Ipv4Addr>,
    /// Clover's READ length of a version (read-write steering steers
    /// READs of exactly this many bytes; `bench ycsb` prints nothing of
    /// it: it is the store's block size).
    #[arg(long, default_value_t = 0)]
    clover_read_len: u32,
    /// Entries of the policy's address → key table.
    #[arg(long, default_value_t = 1 << 16)]
    addr_slots: usize,
}

fn parse_port(s: &str) -> Result<(String, SocketAddr), String> {
    let (name, addr) = s
        .split_once('=')
        .ok_or_else(|| format!("{s}: expected NAME=HOST:PORT"))?;
    let addr = addr
        .parse()
        .map_err(|e| format!("{addr}: not a HOST:PORT address: {e}"))?;
    Ok((name.to_string(), addr))
}

pub(crate) fn switch(a: SwitchArgs) -> Res {
    let policy = match (a.steer, a.server) {
        (Steer::Off, None) => None,
        (_, None) => {
            return Err(crate::bad_input(
                "--steer needs --server IPV4 (the memory node)",
            ))
        }
        (steer, Some(ip)) => Some((
            SwitchConfig {
                steer,
                clover_read_len: a.clover_read_len,
                addr_slots: a.addr_slots,
                ..SwitchConfig::default()
            },
            ip,
        )),
    };
    let stop = Arc::new(AtomicBool::new(false));
    {
        let stop = stop.clone();
        ctrlc::set_handler(move || stop.store(true, Ordering::Relaxed))
            .map_err(|e| format!("installing the signal handler: {e}"))?;
    }
    let mut hub = Hub::bind(HubConfig {
        listen: a.listen,
        ports: a.ports.clone(),
        pcap: a.pcap,
        stats_json: a.stats_json,
        duration: a.duration,
        check_icrc: !a.no_icrc_check,
        policy,
    })
    .map_err(|e| e.to_string())?;
    eprintln!(
        "dmkit switch: listening on udp:{} with {} ports ({})",
        hub.local_addr().map_err(|e| e.to_string())?,
        a.ports.len(),
        a.ports
            .iter()
            .map(|(n, p)| format!("{n}={p}"))
            .collect::<Vec<_>>()
            .join(" ")
    );
    hub.run(stop).map_err(|e| e.to_string())?;
    let s = hub.stats();
    eprintln!(
        "dmkit switch: {} frames ({} forwarded, {} flooded), {} RoCEv2 packets ({} ICRC mismatches, {} malformed)",
        s.frames, s.forwarded, s.flooded, s.roce.packets, s.roce.icrc_mismatch, s.roce.malformed
    );
    if let Some(p) = &s.policy {
        eprintln!(
            "dmkit switch: steer {}: {} requests, {} rewritten ({} CAS steered, {} doomed, {} READs), {} responses held, {} released",
            a.steer, p.requests, p.rewritten, p.steered_cas, p.steered_doomed, p.steered_reads, p.held, p.released
        );
    }
    Ok(())
}
