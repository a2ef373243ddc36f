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
//!
//! With `--steer`, the switch's control plane reads the memory node's
//! region table (NIC rkey and address ↔ the node's offsets) over the
//! node's verbs control protocol (`--node-ctl`, authenticated by the
//! node's token like any client) on a thread of its own, and again
//! whenever a request names an rkey the table lacks.

use std::net::{Ipv4Addr, SocketAddr};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use clap::Args;
use dmkit_switch::hub::{ControlLink, Hub, HubConfig};
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
    /// Capture every frame received, and every frame the switch makes
    /// (--cas-to-write, --switch-ip) after the one it came from (pcap,
    /// Ethernet link type: Wireshark decodes RoCEv2 as InfiniBand).
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
    /// The memory node's verbs control server as the switch reaches it
    /// (its management network): the switch reads the node's region table
    /// there, to translate the wire's NIC addresses into the node's
    /// offsets. Needed by --steer.
    #[arg(long, value_name = "HOST:PORT")]
    node_ctl: Option<String>,
    /// The node's token file (the control server admits the switch with
    /// it, as any client); read when the switch connects, so it may
    /// appear after the switch starts.
    #[arg(long, value_name = "FILE")]
    node_token: Option<PathBuf>,
    /// How long a request under an rkey the switch does not know waits for
    /// the region table to be read again before it passes untranslated.
    #[arg(long, default_value = "100ms", value_parser = humantime::parse_duration)]
    park: Duration,
    /// SwordBox's CAS→WRITE on each client's own connection: a CAS the
    /// switch knows will succeed (it caches every CAS target's value)
    /// reaches the server as an RDMA WRITE, and the server's ACK returns
    /// to the client as an atomic ACK with the old value; requests to a
    /// word from other connections wait while one is unanswered
    /// (dmkit-switch's `caswrite`). Needs --server; not with --steer.
    #[arg(long)]
    cas_to_write: bool,
    /// With --cas-to-write: after it starts, the switch drops plain ACKs
    /// at PSNs it saw no request for this long (a restarted switch cannot
    /// tell an old conversion's ACK from another).
    #[arg(long, default_value = "500ms", value_parser = humantime::parse_duration)]
    quiet: Duration,
    /// An IPv4 address of the switch's own on the RoCE network: the switch
    /// answers ARP for it, its control plane asks the memory node for a
    /// queue pair connected to it (`--node-ctl`, `--node-token`), and the
    /// switch probes that queue pair with a READ every second (counters
    /// `own_qp`): the first step of multiplexing. Needs --server.
    #[arg(long, value_name = "IPV4")]
    switch_ip: Option<Ipv4Addr>,
    /// SwordBox's connection multiplexing on the wire: every client
    /// connection to --server moves, whole from one PSN on, onto the
    /// switch's own queue pair on the node (--switch-ip), and the node's
    /// responses return to each client in its connection's terms
    /// (dmkit-switch's `mux`). With --cas-to-write, CAS→WRITE runs on the
    /// moved connections. Needs --switch-ip; not with --steer.
    #[arg(long)]
    mux: bool,
    /// With --mux: the node's path MTU in bytes (a READ takes one PSN per
    /// MTU of its length): rxe over a 1500-byte Ethernet MTU uses 1024.
    #[arg(long, default_value_t = 1024)]
    mux_mtu: u32,
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
    let mux =
        match (a.mux, a.switch_ip, a.server, a.steer) {
            (false, ..) => None,
            (true, _, _, s) if s != Steer::Off => {
                return Err(crate::bad_input(
                    "--mux and --steer do not run together: steering rewrites requests in the \
                 node's terms, multiplexing moves them onto the switch's queue pair",
                ))
            }
            (true, Some(ip), Some(server), _) => {
                if !(256..=4096).contains(&a.mux_mtu) || !a.mux_mtu.is_power_of_two() {
                    return Err(crate::bad_input(
                        "--mux-mtu: one of 256, 512, 1024, 2048, 4096 (an InfiniBand path MTU)",
                    ));
                }
                Some(dmkit_switch::mux::MuxConfig {
                    server,
                    switch_ip: ip,
                    mtu: a.mux_mtu,
                    cas_to_write: a.cas_to_write,
                })
            }
            (true, ..) => return Err(crate::bad_input(
                "--mux needs --switch-ip IPV4 and --server IPV4 (and --node-ctl, --node-token): \
                 the clients' connections move onto the switch's own queue pair on the node",
            )),
        };
    let cas_to_write = match (a.cas_to_write, a.server, a.steer) {
        // With --mux, CAS→WRITE runs inside multiplexing.
        (true, Some(_), Steer::Off) if mux.is_some() => None,
        (false, _, _) => None,
        (true, None, _) => {
            return Err(crate::bad_input(
                "--cas-to-write needs --server IPV4 (the memory node)",
            ))
        }
        (true, Some(_), s) if s != Steer::Off => {
            return Err(crate::bad_input(
                "--cas-to-write and --steer do not run together yet: both rewrite the node's \
                 requests and would each need to see the other's rewrites",
            ))
        }
        (true, Some(ip), _) => Some((ip, a.quiet.as_micros() as u64)),
    };
    let policy = match (a.steer, a.server) {
        (Steer::Off, _) if cas_to_write.is_some() || mux.is_some() => None,
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
    let own = match (a.switch_ip, a.server, &a.node_ctl, &a.node_token) {
        (None, ..) => None,
        (Some(ip), Some(server), Some(ctl), Some(token)) => {
            Some((ip, server, ctl.clone(), token.clone()))
        }
        (Some(_), ..) => {
            return Err(crate::bad_input(
                "--switch-ip needs --server IPV4, --node-ctl HOST:PORT and --node-token FILE: \
                 the switch's control plane asks the node for its queue pair there",
            ))
        }
    };
    let control = match (&policy, a.node_ctl.clone(), a.node_token.clone()) {
        (None, None, None) => None,
        (None, Some(_), Some(_)) if own.is_some() => None,
        (None, _, _) => {
            return Err(crate::bad_input(
                "--node-ctl and --node-token serve the policy's address translation: give --server (and --steer)",
            ))
        }
        (Some(_), Some(addr), Some(token)) => Some((addr, token)),
        (Some(_), None, None) if a.steer == Steer::Off => None,
        (Some(_), _, _) => {
            return Err(crate::bad_input(
                "--steer needs --node-ctl HOST:PORT and --node-token FILE: the switch reads the \
                 memory node's region table there to translate the wire's addresses",
            ))
        }
    };
    let mut hub = Hub::bind(HubConfig {
        listen: a.listen,
        ports: a.ports.clone(),
        pcap: a.pcap,
        stats_json: a.stats_json,
        duration: a.duration,
        check_icrc: !a.no_icrc_check,
        policy,
        cas_to_write,
        own: own.as_ref().map(|(ip, server, _, _)| (*ip, *server)),
        mux,
    })
    .map_err(|e| e.to_string())?;
    if let Some((addr, token)) = control {
        let link = control::spawn(addr, token, stop.clone())?;
        hub = hub.with_control(ControlLink {
            park_us: a.park.as_micros() as u64,
            ..link
        });
    }
    if let Some((ip, _, addr, token)) = own {
        let rx = control::spawn_own(addr, token, ip, stop.clone())?;
        hub = hub.with_own_link(rx);
    }
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
    if let Some(o) = &s.own_qp {
        eprintln!(
            "dmkit switch: own queue pair: {} (node QP {}), {} ARP replies, {} READs sent, {} READ responses, {} NAKs, {} other frames to it",
            if o.connected { "connected" } else { "never connected" },
            o.node_qpn, o.arp_replies, o.reads, o.read_responses, o.naks, o.other
        );
    }
    if let Some(m) = &s.mux {
        eprintln!(
            "dmkit switch: mux: {} connections, {} moved, {} kept on their own QP (SENDs); {} requests on the switch's queue pair, {} responses mapped back ({} WRITE packets covered), {} held, {} resent, {} replayed, {} sequence NAKs ({} resent), {} NAKs passed, {} unmatched, {} SENDs dropped",
            m.connections, m.moved, m.pinned, m.mapped, m.responses, m.covering_acks, m.held, m.resent, m.replayed, m.seq_naks, m.gbn_resent, m.naks, m.unmatched, m.sends_dropped
        );
        if a.cas_to_write {
            eprintln!(
                "dmkit switch: mux cas-to-write: {} CASes, {} turned into WRITEs, {} atomic ACKs made, {} learned, {} mispredictions",
                m.cas, m.converted, m.atomic_acks, m.learned, m.mispredictions
            );
        }
    }
    if let Some(c) = &s.cas_to_write {
        eprintln!(
            "dmkit switch: cas-to-write: {} CASes, {} turned into WRITEs ({} resent), {} passed (value unknown), {} passed (doomed), {} atomic ACKs made ({} for a covering response), {} requests held, {} mispredictions, {} ACKs dropped while quiet",
            c.cas, c.converted, c.reconverted, c.passed_unknown, c.passed_doomed, c.atomic_acks, c.covered, c.held, c.mispredictions, c.quiet_dropped
        );
    }
    if let Some(p) = &s.policy {
        eprintln!(
            "dmkit switch: steer {}: {} requests, {} rewritten ({} CAS steered, {} doomed, {} READs), {} responses held, {} released",
            a.steer, p.requests, p.rewritten, p.steered_cas, p.steered_doomed, p.steered_reads, p.held, p.released
        );
        eprintln!(
            "dmkit switch: region tables read {} ({} regions), {} requests parked ({} timed out), {} untranslated, {} outside their region",
            p.tables, p.regions, p.parked, p.park_timeouts, p.untranslated, p.outside_region
        );
    }
    Ok(())
}

/// The switch's control plane: a thread holding a control connection to
/// the memory node, reading its region table when asked.
#[cfg(feature = "verbs")]
mod control {
    use std::net::TcpStream;
    use std::path::PathBuf;
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::mpsc::{self, RecvTimeoutError, SyncSender};
    use std::sync::Arc;
    use std::time::Duration;

    use dmkit_memnode::server::read_token_file;
    use dmkit_switch::hub::ControlLink;
    use dmkit_switch::regions::{RegionTable, WireRegion};
    use dmkit_verbs::ctl::{self, Ctl, CtlReply, NicRegion, CTL_MAGIC, CTL_VERSION};

    fn table(node: u16, rs: &[NicRegion]) -> RegionTable {
        RegionTable::new(
            node,
            rs.iter()
                .map(|r| WireRegion {
                    rkey: r.nic_rkey,
                    addr: r.nic_addr,
                    base: r.info.base,
                    len: r.info.len,
                    access: r.info.access,
                })
                .collect(),
        )
    }

    /// Opens a control session with the node: connects, sets the read
    /// timeout and sends the hello with the token file's token. The error
    /// says which step failed.
    fn hello(addr: &str, token: &std::path::Path, timeout: Duration) -> Result<TcpStream, String> {
        let token =
            read_token_file(token).map_err(|e| format!("token file {}: {e}", token.display()))?;
        let mut s = TcpStream::connect(addr).map_err(|e| format!("connecting to {addr}: {e}"))?;
        let _ = s.set_nodelay(true);
        let _ = s.set_read_timeout(Some(timeout));
        let hello = Ctl::Hello {
            magic: CTL_MAGIC,
            version: CTL_VERSION,
            token,
        };
        ctl::send(&mut s, &hello).map_err(|e| format!("hello to {addr}: {e}"))?;
        Ok(s)
    }

    /// One control session: hello, then the table on every refresh
    /// request (and every few seconds). Returns why it ended.
    fn session(
        addr: &str,
        token: &std::path::Path,
        tables: &mpsc::Sender<RegionTable>,
        refresh: &mpsc::Receiver<()>,
        stop: &AtomicBool,
    ) -> String {
        let mut s = match hello(addr, token, Duration::from_secs(10)) {
            Ok(s) => s,
            Err(e) => return e,
        };
        let node = match ctl::recv::<CtlReply>(&mut s) {
            Ok(Some(CtlReply::Welcome {
                layout, regions, ..
            })) => {
                let _ = tables.send(table(layout.node_id, &regions));
                eprintln!(
                    "dmkit switch: control plane: node {} at {addr}, {} regions",
                    layout.node_id,
                    regions.len()
                );
                layout.node_id
            }
            Ok(Some(CtlReply::Refused(why))) => return format!("{addr} refused: {why}"),
            Ok(_) => return format!("{addr}: no welcome"),
            Err(e) => return format!("welcome from {addr}: {e}"),
        };
        while !stop.load(Ordering::Relaxed) {
            match refresh.recv_timeout(Duration::from_secs(5)) {
                Ok(()) | Err(RecvTimeoutError::Timeout) => {}
                Err(RecvTimeoutError::Disconnected) => return STOPPED.into(),
            }
            if let Err(e) = ctl::send(&mut s, &Ctl::Regions) {
                return format!("asking {addr} for regions: {e}");
            }
            match ctl::recv::<CtlReply>(&mut s) {
                Ok(Some(CtlReply::Regions(rs))) => {
                    if tables.send(table(node, &rs)).is_err() {
                        return STOPPED.into();
                    }
                }
                Ok(Some(CtlReply::Refused(why))) => {
                    return format!("{addr} refused regions: {why}")
                }
                Ok(_) => return format!("{addr} closed the control connection"),
                Err(e) => return format!("regions from {addr}: {e}"),
            }
        }
        STOPPED.into()
    }

    /// What a session returns when the switch stops.
    const STOPPED: &str = "the switch stopped";

    /// One session for the switch's own queue pair: hello, then
    /// `Ctl::Connect` for an endpoint of the switch's (its IPv4-mapped GID,
    /// its QP number, a fresh PSN); the node's QP lives as long as the
    /// session, which is kept busy with a region read every few seconds.
    fn own_session(
        addr: &str,
        token: &std::path::Path,
        ip: std::net::Ipv4Addr,
        tx: &mpsc::Sender<dmkit_switch::ownqp::OwnRemote>,
        stop: &AtomicBool,
    ) -> String {
        let mut s = match hello(addr, token, Duration::from_secs(30)) {
            Ok(s) => s,
            Err(e) => return e,
        };
        let region = match ctl::recv::<CtlReply>(&mut s) {
            Ok(Some(CtlReply::Welcome { regions, .. })) => match regions.first() {
                Some(r) => *r,
                None => return format!("{addr}: the node has no region to probe"),
            },
            Ok(Some(CtlReply::Refused(why))) => return format!("{addr} refused: {why}"),
            Ok(_) => return format!("{addr}: no welcome"),
            Err(e) => return format!("welcome from {addr}: {e}"),
        };
        let psn = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(1, |d| d.subsec_nanos())
            & 0xFF_FFFF;
        let mut gid = [0u8; 16];
        gid[10] = 0xff;
        gid[11] = 0xff;
        gid[12..].copy_from_slice(&ip.octets());
        let client = dmkit_verbs::device::Endpoint {
            qpn: dmkit_switch::ownqp::OWN_QPN,
            psn,
            lid: 0,
            gid,
            global: true,
            mtu: 5,
        };
        if let Err(e) = ctl::send(&mut s, &Ctl::Connect { client }) {
            return format!("asking {addr} for a queue pair: {e}");
        }
        match ctl::recv::<CtlReply>(&mut s) {
            Ok(Some(CtlReply::Connected { server })) => {
                eprintln!(
                    "dmkit switch: own queue pair: node QP {} connected to {ip} QP {} (start PSN {psn})",
                    server.qpn,
                    dmkit_switch::ownqp::OWN_QPN
                );
                let r = dmkit_switch::ownqp::OwnRemote {
                    qpn: server.qpn,
                    psn,
                    va: region.nic_addr,
                    rkey: region.nic_rkey,
                };
                if tx.send(r).is_err() {
                    return STOPPED.into();
                }
            }
            Ok(Some(CtlReply::Refused(why))) => {
                return format!("{addr} refused a queue pair: {why}")
            }
            Ok(_) => return format!("{addr}: no answer to Connect"),
            Err(e) => return format!("Connect at {addr}: {e}"),
        }
        loop {
            for _ in 0..50 {
                if stop.load(Ordering::Relaxed) {
                    return STOPPED.into();
                }
                std::thread::sleep(Duration::from_millis(100));
            }
            if let Err(e) = ctl::send(&mut s, &Ctl::Regions) {
                return format!("keeping {addr}'s session: {e}");
            }
            match ctl::recv::<CtlReply>(&mut s) {
                Ok(Some(CtlReply::Regions(_))) => {}
                Ok(_) => return format!("{addr} closed the session of the switch's queue pair"),
                Err(e) => return format!("session of the switch's queue pair at {addr}: {e}"),
            }
        }
    }

    /// Starts the thread holding the switch's own queue pair on the node
    /// (it reconnects, with a new queue pair, until `stop`).
    pub(super) fn spawn_own(
        addr: String,
        token: PathBuf,
        ip: std::net::Ipv4Addr,
        stop: Arc<AtomicBool>,
    ) -> Result<mpsc::Receiver<dmkit_switch::ownqp::OwnRemote>, String> {
        let (tx, rx) = mpsc::channel();
        std::thread::Builder::new()
            .name("switch-own-qp".into())
            .spawn(move || {
                let mut last = String::new();
                while !stop.load(Ordering::Relaxed) {
                    let why = own_session(&addr, &token, ip, &tx, &stop);
                    if why == STOPPED || stop.load(Ordering::Relaxed) {
                        break;
                    }
                    if why != last {
                        eprintln!("dmkit switch: own queue pair: {why}; retrying");
                        last = why;
                    }
                    std::thread::sleep(Duration::from_millis(500));
                }
            })
            .map_err(|e| format!("starting the switch's own queue pair: {e}"))?;
        Ok(rx)
    }

    /// Starts the control plane's thread; it reconnects until `stop`.
    pub(super) fn spawn(
        addr: String,
        token: PathBuf,
        stop: Arc<AtomicBool>,
    ) -> Result<ControlLink, String> {
        let (ttx, trx) = mpsc::channel();
        let (rtx, rrx): (SyncSender<()>, _) = mpsc::sync_channel(1);
        std::thread::Builder::new()
            .name("switch-control".into())
            .spawn(move || {
                let mut last = String::new();
                while !stop.load(Ordering::Relaxed) {
                    let why = session(&addr, &token, &ttx, &rrx, &stop);
                    if why == STOPPED || stop.load(Ordering::Relaxed) {
                        break;
                    }
                    // Say each new reason once (the node boots after the switch).
                    if why != last {
                        eprintln!("dmkit switch: control plane: {why}; retrying");
                        last = why;
                    }
                    std::thread::sleep(Duration::from_millis(250));
                }
            })
            .map_err(|e| format!("starting the switch's control plane: {e}"))?;
        Ok(ControlLink {
            tables: trx,
            refresh: rtx,
            park_us: dmkit_switch::onwire::PARK_US,
        })
    }
}

/// The switch's control plane needs the verbs control protocol.
#[cfg(not(feature = "verbs"))]
mod control {
    use std::path::PathBuf;
    use std::sync::atomic::AtomicBool;
    use std::sync::Arc;

    use dmkit_switch::hub::ControlLink;

    pub(super) fn spawn(
        _addr: String,
        _token: PathBuf,
        _stop: Arc<AtomicBool>,
    ) -> Result<ControlLink, String> {
        Err(format!(
            "--node-ctl: {}; build with --features dmkit/verbs",
            dmkit_verbs::VerbsError::NotBuilt
        ))
    }

    pub(super) fn spawn_own(
        _addr: String,
        _token: PathBuf,
        _ip: std::net::Ipv4Addr,
        _stop: Arc<AtomicBool>,
    ) -> Result<std::sync::mpsc::Receiver<dmkit_switch::ownqp::OwnRemote>, String> {
        Err(format!(
            "--switch-ip: {}; build with --features dmkit/verbs",
            dmkit_verbs::VerbsError::NotBuilt
        ))
    }
}
