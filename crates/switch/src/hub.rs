//! `dmkit switch`'s data plane: an Ethernet learning switch whose ports are
//! UDP peers on the host (QEMU's `-netdev socket,udp=...` / `-netdev dgram`
//! send each guest frame as one datagram), with RoCEv2 packets parsed by
//! [`crate::wire`] and counted per rule.
//!
//! [`Core`] is the switch without I/O: a frame in from a port, the ports it
//! goes out on. [`Hub`] adds the socket, the pcap capture and the stats
//! file. Forwarding: the source MAC is learned on the port it came from;
//! a frame to a learned unicast MAC goes to that port only; broadcast,
//! multicast and unknown destinations are flooded to every other port (so
//! ARP passes). With a policy ([`Core::with_policy`], `dmkit switch
//! --steer`), RoCEv2 packets to and from the memory node go through
//! [`crate::onwire`], which may rewrite requests and hold responses.
//! Harness and scope: tools/softroce/MULTIHOST.md.

use std::cell::RefCell;
use std::collections::{BTreeMap, HashMap};
use std::fs::File;
use std::io::{BufWriter, Write};
use std::net::{SocketAddr, UdpSocket};
use std::path::PathBuf;
use std::rc::Rc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use pcap_file::pcap::{PcapHeader, PcapPacket, PcapWriter};
use pcap_file::DataLink;
use serde::Serialize;

use crate::wire::{self, Frame};

/// Where a frame goes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Out {
    /// To one port.
    Port(usize),
    /// To every port but the one it came from.
    Flood,
    /// Nowhere (its destination is the port it came from).
    Drop,
    /// To every port but this one (a frame the policy released later,
    /// which came from that port).
    FloodExcept(usize),
}

/// Counters of RoCEv2 traffic.
#[derive(Debug, Clone, Serialize)]
pub struct RoceStats {
    /// RoCEv2 packets seen.
    pub packets: u64,
    /// Per BTH opcode (JSON: by name).
    #[serde(serialize_with = "opcodes_by_name")]
    pub by_opcode: [u64; 256],
    /// Packets whose ICRC did not match their contents (forwarded anyway:
    /// the receiving NIC drops them, as it would behind a real switch).
    pub icrc_mismatch: u64,
    /// RoCEv2 packets the codec could not parse (forwarded by MAC).
    pub malformed: u64,
    /// Requests with a NAK or RNR NAK syndrome in their AETH.
    pub naks: u64,
}

impl Default for RoceStats {
    fn default() -> Self {
        RoceStats {
            packets: 0,
            by_opcode: [0; 256],
            icrc_mismatch: 0,
            malformed: 0,
            naks: 0,
        }
    }
}

fn opcodes_by_name<S: serde::Serializer>(c: &[u64; 256], s: S) -> Result<S::Ok, S::Error> {
    let m: BTreeMap<String, u64> = (0..256)
        .filter(|&i| c[i] > 0)
        .map(|i| {
            let n = match opcode_name(i as u8) {
                "OTHER" => format!("{i:#04x}"),
                n => n.to_string(),
            };
            (n, c[i])
        })
        .collect();
    m.serialize(s)
}

/// Counters of the switch, per rule.
#[derive(Debug, Clone, Default, Serialize)]
pub struct HubStats {
    /// Frames received.
    pub frames: u64,
    /// Bytes received.
    pub bytes: u64,
    /// Rule "unicast to a learned MAC": frames sent to one port.
    pub forwarded: u64,
    /// Rule "flood": broadcast, multicast or unknown destination.
    pub flooded: u64,
    /// Rule "same port": destination learned on the port the frame came
    /// from, dropped.
    pub dropped_same_port: u64,
    /// Datagrams from an address that is none of the ports, dropped.
    pub dropped_unknown_peer: u64,
    /// ARP frames (forwarded by the rules above).
    pub arp: u64,
    /// MACs learned (moves included).
    pub learned: u64,
    /// RoCEv2 traffic.
    pub roce: RoceStats,
    /// Frames received per port name.
    pub per_port_rx: BTreeMap<String, u64>,
    /// The policy on the wire (`--steer`), when it runs.
    pub policy: Option<crate::onwire::OnWireStats>,
    /// CAS→WRITE on the wire (`--cas-to-write`), when it runs.
    pub cas_to_write: Option<crate::caswrite::CasWriteStats>,
    /// The switch's own address and queue pair (`--switch-ip`).
    pub own_qp: Option<crate::ownqp::OwnQpStats>,
    /// Connection multiplexing (`--mux`).
    pub mux: Option<crate::mux::MuxStats>,
}

/// The opcode names Wireshark uses (short form).
pub fn opcode_name(op: u8) -> &'static str {
    use wire::opcode::*;
    match op {
        SEND_FIRST => "SEND_FIRST",
        SEND_MIDDLE => "SEND_MIDDLE",
        SEND_LAST => "SEND_LAST",
        SEND_LAST_IMM => "SEND_LAST_IMM",
        SEND_ONLY => "SEND_ONLY",
        SEND_ONLY_IMM => "SEND_ONLY_IMM",
        WRITE_FIRST => "WRITE_FIRST",
        WRITE_MIDDLE => "WRITE_MIDDLE",
        WRITE_LAST => "WRITE_LAST",
        WRITE_LAST_IMM => "WRITE_LAST_IMM",
        WRITE_ONLY => "WRITE_ONLY",
        WRITE_ONLY_IMM => "WRITE_ONLY_IMM",
        READ_REQUEST => "READ_REQUEST",
        READ_RESPONSE_FIRST => "READ_RESPONSE_FIRST",
        READ_RESPONSE_MIDDLE => "READ_RESPONSE_MIDDLE",
        READ_RESPONSE_LAST => "READ_RESPONSE_LAST",
        READ_RESPONSE_ONLY => "READ_RESPONSE_ONLY",
        ACKNOWLEDGE => "ACKNOWLEDGE",
        ATOMIC_ACKNOWLEDGE => "ATOMIC_ACKNOWLEDGE",
        COMPARE_SWAP => "COMPARE_SWAP",
        FETCH_ADD => "FETCH_ADD",
        SEND_LAST_INV => "SEND_LAST_INV",
        SEND_ONLY_INV => "SEND_ONLY_INV",
        _ => "OTHER",
    }
}

/// The switch without I/O.
#[derive(Debug)]
pub struct Core {
    names: Vec<String>,
    macs: HashMap<[u8; 6], usize>,
    /// Check every RoCEv2 packet's ICRC (costs a CRC-32 over the packet).
    pub check_icrc: bool,
    stats: HubStats,
    policy: Option<crate::onwire::OnWire>,
    cas: Option<crate::caswrite::CasWrite>,
    own: Option<crate::ownqp::OwnQp>,
    mux: Option<crate::mux::MuxWire>,
}

impl Core {
    /// A switch with these ports (names for the stats).
    pub fn new(names: Vec<String>) -> Self {
        let stats = HubStats {
            per_port_rx: names.iter().map(|n| (n.clone(), 0)).collect(),
            ..Default::default()
        };
        Core {
            names,
            macs: HashMap::new(),
            check_icrc: true,
            stats,
            policy: None,
            cas: None,
            own: None,
            mux: None,
        }
    }

    /// Multiplexes clients' connections onto the switch's queue pair (see
    /// [`crate::mux`]); give it the address too ([`Core::with_own`], ARP
    /// only).
    pub fn with_mux(mut self, m: crate::mux::MuxWire) -> Self {
        self.mux = Some(m);
        self
    }

    /// Multiplexing's counters, when it runs.
    pub fn mux_stats(&self) -> Option<crate::mux::MuxStats> {
        self.mux.as_ref().map(|m| m.stats())
    }

    /// Multiplexing's state, when it runs (tests, the stats' reader).
    pub fn mux(&self) -> Option<&crate::mux::MuxWire> {
        self.mux.as_ref()
    }

    /// Gives the switch an address and a queue pair of its own (see
    /// [`crate::ownqp`]).
    pub fn with_own(mut self, o: crate::ownqp::OwnQp) -> Self {
        self.own = Some(o);
        self
    }

    /// The control plane made the switch's queue pair on the node.
    pub fn own_connected(&mut self, r: crate::ownqp::OwnRemote) {
        if let Some(o) = self.own.as_mut() {
            o.connected(r);
        }
        if let Some(m) = self.mux.as_mut() {
            m.connected(r);
        }
    }

    /// Time passes: the frame the switch sends from its own address now
    /// (a probe of its queue pair), and where.
    pub fn own_tick(&mut self, now: u64) -> Option<(Out, Vec<u8>)> {
        let f = self.own.as_mut()?.tick(now)?;
        let o = self.route(usize::MAX, &f);
        Some((o, f))
    }

    /// The own address's and queue pair's counters.
    pub fn own_stats(&self) -> Option<crate::ownqp::OwnQpStats> {
        self.own.as_ref().map(|o| o.stats())
    }

    /// Runs CAS→WRITE on RoCEv2 packets (see [`crate::caswrite`]).
    pub fn with_cas_to_write(mut self, c: crate::caswrite::CasWrite) -> Self {
        self.cas = Some(c);
        self
    }

    /// The frames CAS→WRITE made since the last call (kept for the
    /// capture: [`crate::caswrite::CasWrite::keep_made`]).
    pub fn take_made(&mut self) -> Vec<Vec<u8>> {
        let mut v = self.cas.as_mut().map(|c| c.take_made()).unwrap_or_default();
        if let Some(m) = self.mux.as_mut() {
            v.extend(m.take_made());
        }
        v
    }

    /// Runs the policy on RoCEv2 packets (see [`crate::onwire`]).
    pub fn with_policy(mut self, p: crate::onwire::OnWire) -> Self {
        self.policy = Some(p);
        self
    }

    /// The counters so far.
    pub fn stats(&self) -> &HubStats {
        &self.stats
    }

    /// Forgets the MAC table (a restart: soft state only).
    pub fn forget(&mut self) {
        self.macs.clear();
    }

    /// A frame arrives on port `from`: learn, count, decide (pass-through).
    pub fn on_frame(&mut self, from: usize, frame: &[u8]) -> Out {
        if frame.len() < 14 {
            // Not an Ethernet frame: nothing to learn or forward by.
            return Out::Drop;
        }
        self.observe(from, frame);
        self.route(from, frame)
    }

    /// A frame arrives on port `from` at `now` (µs): with the policy on,
    /// the frames to send and where (the frame itself, rewritten, held
    /// back or parked, or with frames it releases).
    pub fn process(&mut self, from: usize, frame: &[u8], now: u64, out: &mut Vec<(Out, Vec<u8>)>) {
        if frame.len() < 14 {
            return;
        }
        if let Some(own) = self.own.as_mut() {
            match own.on_frame(frame) {
                crate::ownqp::Own::Pass => {}
                crate::ownqp::Own::Consumed => {
                    self.observe(from, frame);
                    return;
                }
                crate::ownqp::Own::Reply(r) => out.push((Out::Port(from), r)),
            }
        }
        let parsed = self.observe(from, frame);
        if let (Some(p), Some(mux)) = (&parsed, self.mux.as_mut()) {
            let mut frames = Vec::new();
            mux.on_packet(p.clone(), frame, now, from, &mut frames);
            return self.route_all(frames, out);
        }
        if let (Some(p), Some(cas)) = (&parsed, self.cas.as_mut()) {
            let mut frames = Vec::new();
            cas.on_packet(p.clone(), frame, now, from, &mut frames);
            return self.route_all(frames, out);
        }
        match (parsed, self.policy.as_mut()) {
            (Some(p), Some(pol)) => {
                let mut frames = Vec::new();
                pol.on_packet(p, frame, now, from, &mut frames);
                self.route_all(frames, out);
            }
            _ => {
                let o = self.route(from, frame);
                out.push((o, frame.to_vec()));
            }
        }
    }

    /// Installs the memory node's region table in the policy (its control
    /// plane read it) and routes the requests it releases.
    pub fn install_regions(
        &mut self,
        t: crate::regions::RegionTable,
        now: u64,
        out: &mut Vec<(Out, Vec<u8>)>,
    ) {
        let mut frames = Vec::new();
        if let Some(pol) = self.policy.as_mut() {
            pol.install(t, now, &mut frames);
        }
        self.route_all(frames, out);
    }

    /// Time passes: requests parked too long for a region table go on
    /// untranslated.
    pub fn tick(&mut self, now: u64, out: &mut Vec<(Out, Vec<u8>)>) {
        let mut frames = Vec::new();
        if let Some(pol) = self.policy.as_mut() {
            pol.tick(now, &mut frames);
        }
        if let Some(cas) = self.cas.as_mut() {
            cas.tick(now, &mut frames);
        }
        self.route_all(frames, out);
    }

    /// Whether the policy needs the node's region table read (once per
    /// need).
    pub fn wants_regions(&mut self) -> bool {
        self.policy.as_mut().is_some_and(|p| p.wants_table())
    }

    fn route_all(&mut self, frames: Vec<(usize, Vec<u8>)>, out: &mut Vec<(Out, Vec<u8>)>) {
        for (from, f) in frames {
            let o = match self.route(from, &f) {
                Out::Flood => Out::FloodExcept(from),
                o => o,
            };
            out.push((o, f));
        }
    }

    /// The policy's counters, when it runs.
    pub fn policy_stats(&self) -> Option<crate::onwire::OnWireStats> {
        self.policy.as_ref().map(|p| p.stats())
    }

    /// CAS→WRITE's counters, when it runs.
    pub fn cas_stats(&self) -> Option<crate::caswrite::CasWriteStats> {
        self.cas.as_ref().map(|c| c.stats())
    }

    fn observe(&mut self, from: usize, frame: &[u8]) -> Option<wire::RocePacket> {
        let s = &mut self.stats;
        s.frames += 1;
        s.bytes += frame.len() as u64;
        if let Some(c) = s.per_port_rx.get_mut(&self.names[from]) {
            *c += 1;
        }
        let src: [u8; 6] = frame[6..12].try_into().unwrap();
        if src[0] & 1 == 0 && self.macs.insert(src, from) != Some(from) {
            s.learned += 1;
        }
        if frame[12..14] == [0x08, 0x06] {
            s.arp += 1;
        }
        match wire::parse(frame) {
            Ok(Frame::Other) => None,
            Ok(Frame::Roce(p, raw)) => {
                s.roce.packets += 1;
                s.roce.by_opcode[p.bth.opcode as usize] += 1;
                if let wire::Ext::Aeth { syndrome, .. } = p.ext {
                    if syndrome >> 5 != 0 {
                        s.roce.naks += 1;
                    }
                }
                if self.check_icrc && wire::icrc(raw) != Some(p.icrc) {
                    s.roce.icrc_mismatch += 1;
                }
                Some(p)
            }
            Err(_) => {
                s.roce.malformed += 1;
                None
            }
        }
    }

    fn route(&mut self, from: usize, frame: &[u8]) -> Out {
        let s = &mut self.stats;
        let dst: [u8; 6] = frame[0..6].try_into().unwrap();
        if dst[0] & 1 == 1 {
            s.flooded += 1;
            return Out::Flood;
        }
        match self.macs.get(&dst) {
            Some(&p) if p == from => {
                s.dropped_same_port += 1;
                Out::Drop
            }
            Some(&p) => {
                s.forwarded += 1;
                Out::Port(p)
            }
            None => {
                s.flooded += 1;
                Out::Flood
            }
        }
    }
}

/// `dmkit switch`'s configuration.
#[derive(Debug, Clone)]
pub struct HubConfig {
    /// The switch's own UDP address (every port sends here).
    pub listen: SocketAddr,
    /// The ports: name and the UDP address its peer sends from.
    pub ports: Vec<(String, SocketAddr)>,
    /// Capture every frame received into this pcap file (Ethernet), and
    /// every frame CAS→WRITE or the own queue pair makes.
    pub pcap: Option<PathBuf>,
    /// Write the counters here (JSON) every second and at the end.
    pub stats_json: Option<PathBuf>,
    /// Stop after this long (None: until stopped).
    pub duration: Option<Duration>,
    /// Check every RoCEv2 packet's ICRC.
    pub check_icrc: bool,
    /// Run the policy on the packets to and from the memory node at this
    /// address.
    pub policy: Option<(crate::SwitchConfig, std::net::Ipv4Addr)>,
    /// Run CAS→WRITE on the packets to and from the memory node at this
    /// address (not with `policy`), with this quiet period after the
    /// start (µs).
    pub cas_to_write: Option<(std::net::Ipv4Addr, u64)>,
    /// An address of the switch's own and the memory node's: the switch
    /// answers ARP for it and probes its queue pair on the node.
    pub own: Option<(std::net::Ipv4Addr, std::net::Ipv4Addr)>,
    /// Multiplex clients' connections onto the switch's queue pair (with
    /// `own`; not with `policy` or `cas_to_write`).
    pub mux: Option<crate::mux::MuxConfig>,
}

/// The data plane's end of the switch's control plane: region tables of
/// the memory node come in on `tables`; a message on `refresh` asks for
/// the table to be read again (a request under an rkey the switch does
/// not know). Whoever holds the other ends talks to the node
/// (`dmkit switch --node-ctl`: the node's verbs control protocol).
#[derive(Debug)]
pub struct ControlLink {
    /// Tables read from the node, newest last.
    pub tables: std::sync::mpsc::Receiver<crate::regions::RegionTable>,
    /// Requests to read the table again (a full channel: one is pending).
    pub refresh: std::sync::mpsc::SyncSender<()>,
    /// How long a request under an unknown rkey waits for the table (µs).
    pub park_us: u64,
}

/// Why the switch could not run.
#[derive(Debug, thiserror::Error)]
pub enum HubError {
    /// Socket trouble.
    #[error("{what}: {source}")]
    Io {
        /// What was being done.
        what: String,
        /// The error.
        source: std::io::Error,
    },
    /// The capture file.
    #[error("pcap {path}: {msg}")]
    Pcap {
        /// The file.
        path: PathBuf,
        /// pcap-file's message.
        msg: String,
    },
}

fn io(what: impl Into<String>) -> impl FnOnce(std::io::Error) -> HubError {
    let what = what.into();
    move |source| HubError::Io { what, source }
}

/// The switch with its socket.
pub struct Hub {
    cfg: HubConfig,
    sock: UdpSocket,
    peers: HashMap<SocketAddr, usize>,
    core: Core,
    pcap: Option<(PcapWriter<Spool>, Spool)>,
    control: Option<ControlLink>,
    own_link: Option<std::sync::mpsc::Receiver<crate::ownqp::OwnRemote>>,
}

impl Hub {
    /// Binds the socket and opens the capture.
    pub fn bind(cfg: HubConfig) -> Result<Hub, HubError> {
        let sock = UdpSocket::bind(cfg.listen).map_err(io(format!("binding {}", cfg.listen)))?;
        // Short: parked requests wait at most `park_us` plus this.
        sock.set_read_timeout(Some(Duration::from_millis(10)))
            .map_err(io("socket timeout"))?;
        let peers = cfg
            .ports
            .iter()
            .enumerate()
            .map(|(i, (_, a))| (*a, i))
            .collect();
        let pcap = match &cfg.pcap {
            None => None,
            Some(path) => {
                let f = File::create(path).map_err(io(format!("creating {}", path.display())))?;
                let header = PcapHeader {
                    datalink: DataLink::ETHERNET,
                    ..Default::default()
                };
                let spool = Spool(Rc::new(RefCell::new(BufWriter::new(f))));
                let w =
                    PcapWriter::with_header(spool.clone(), header).map_err(|e| HubError::Pcap {
                        path: path.clone(),
                        msg: e.to_string(),
                    })?;
                Some((w, spool))
            }
        };
        let mut core = Core::new(cfg.ports.iter().map(|(n, _)| n.clone()).collect());
        core.check_icrc = cfg.check_icrc;
        if let Some((pc, server)) = &cfg.policy {
            core = core.with_policy(crate::onwire::OnWire::new(pc.clone(), *server));
        }
        if let Some((server, quiet)) = cfg.cas_to_write {
            let mut c = crate::caswrite::CasWrite::new(server).with_quiet(quiet);
            if cfg.pcap.is_some() {
                c = c.keep_made();
            }
            core = core.with_cas_to_write(c);
        }
        if let Some((ip, server)) = cfg.own {
            let mut o = crate::ownqp::OwnQp::new(ip, server);
            if let Some(m) = cfg.mux {
                o = o.arp_only();
                let mut mw = crate::mux::MuxWire::new(m);
                if cfg.pcap.is_some() {
                    mw = mw.keep_made();
                }
                core = core.with_mux(mw);
            }
            core = core.with_own(o);
        }
        Ok(Hub {
            cfg,
            sock,
            peers,
            core,
            pcap,
            control: None,
            own_link: None,
        })
    }

    /// Feeds the policy the memory node's region table through `link`
    /// (no effect without a policy).
    pub fn with_control(mut self, link: ControlLink) -> Self {
        if let Some(p) = self.core.policy.take() {
            self.core.policy = Some(p.with_control(link.park_us));
        }
        self.control = Some(link);
        self
    }

    /// The node-side ends of the switch's queue pair come in on `rx`
    /// (its control plane made them).
    pub fn with_own_link(mut self, rx: std::sync::mpsc::Receiver<crate::ownqp::OwnRemote>) -> Self {
        self.own_link = Some(rx);
        self
    }

    /// The address it listens on.
    pub fn local_addr(&self) -> Result<SocketAddr, HubError> {
        self.sock.local_addr().map_err(io("local address"))
    }

    /// The counters so far.
    pub fn stats(&self) -> HubStats {
        HubStats {
            policy: self.core.policy_stats(),
            cas_to_write: self.core.cas_stats(),
            own_qp: self.core.own_stats(),
            mux: self.core.mux_stats(),
            ..self.core.stats().clone()
        }
    }

    fn write_stats(&self) -> Result<(), HubError> {
        let Some(path) = &self.cfg.stats_json else {
            return Ok(());
        };
        let tmp = path.with_extension("json.tmp");
        let text = serde_json::to_string_pretty(&self.stats()).expect("stats serialize");
        std::fs::write(&tmp, text + "\n").map_err(io(format!("writing {}", tmp.display())))?;
        std::fs::rename(&tmp, path).map_err(io(format!("renaming to {}", path.display())))
    }

    /// Installs region tables the control plane read, asks for a read
    /// when the policy needs one, releases requests parked too long.
    fn control_step(&mut self, now: u64, outs: &mut Vec<(Out, Vec<u8>)>) {
        let Some(c) = &self.control else { return };
        let tables: Vec<_> = c.tables.try_iter().collect();
        for t in tables {
            self.core.install_regions(t, now, outs);
        }
        if self.core.wants_regions() {
            if let Some(c) = &self.control {
                // Full: a read is already pending, which will do.
                let _ = c.refresh.try_send(());
            }
        }
        self.core.tick(now, outs);
    }

    fn send(&self, to: usize, f: &[u8]) -> Result<(), HubError> {
        let addr = self.cfg.ports[to].1;
        match self.sock.send_to(f, addr) {
            Ok(_) => Ok(()),
            // A guest not (yet, or no longer) listening: the frame is lost,
            // as on a link that is down.
            Err(e) if e.kind() == std::io::ErrorKind::ConnectionRefused => Ok(()),
            Err(e) => Err(io(format!("sending to {addr}"))(e)),
        }
    }

    /// Sends frame `f`, received on port `from`, where `o` says.
    fn emit(&self, from: usize, o: &Out, f: &[u8]) -> Result<(), HubError> {
        let nports = self.cfg.ports.len();
        match *o {
            Out::Port(p) => self.send(p, f),
            Out::Flood => (0..nports)
                .filter(|&p| p != from)
                .try_for_each(|p| self.send(p, f)),
            Out::FloodExcept(x) => (0..nports)
                .filter(|&p| p != x)
                .try_for_each(|p| self.send(p, f)),
            Out::Drop => Ok(()),
        }
    }

    /// Forwards frames until `stop` is set or the duration ends.
    pub fn run(&mut self, stop: Arc<AtomicBool>) -> Result<(), HubError> {
        let start = Instant::now();
        let mut last_stats = Instant::now();
        let mut buf = vec![0u8; 65536];
        let mut outs = Vec::new();
        while !stop.load(Ordering::Relaxed) {
            if self.cfg.duration.is_some_and(|d| start.elapsed() >= d) {
                break;
            }
            if last_stats.elapsed() >= Duration::from_secs(1) {
                self.write_stats()?;
                if let Some((_, spool)) = &mut self.pcap {
                    spool.flush().map_err(io("flushing the pcap"))?;
                }
                last_stats = Instant::now();
            }
            if self.control.is_some() {
                let now = start.elapsed().as_micros() as u64;
                outs.clear();
                self.control_step(now, &mut outs);
                for (o, f) in &outs {
                    self.emit(usize::MAX, o, f)?;
                }
            }
            if let Some(rx) = &self.own_link {
                let now = start.elapsed().as_micros() as u64;
                let rs: Vec<_> = rx.try_iter().collect();
                for r in rs {
                    self.core.own_connected(r);
                }
                if let Some((o, f)) = self.core.own_tick(now) {
                    self.emit(usize::MAX, &o, &f)?;
                    if let Some((w, _)) = &mut self.pcap {
                        let ts = SystemTime::now()
                            .duration_since(UNIX_EPOCH)
                            .unwrap_or_default();
                        w.write_packet(&PcapPacket::new(ts, f.len() as u32, &f))
                            .map_err(|e| HubError::Pcap {
                                path: self.cfg.pcap.clone().unwrap_or_default(),
                                msg: e.to_string(),
                            })?;
                    }
                }
            }
            if self.control.is_none() && self.cfg.cas_to_write.is_some() {
                let now = start.elapsed().as_micros() as u64;
                outs.clear();
                self.core.tick(now, &mut outs);
                for (o, f) in &outs {
                    self.emit(usize::MAX, o, f)?;
                }
            }
            let (n, from) = match self.sock.recv_from(&mut buf) {
                Ok(x) => x,
                Err(e)
                    if matches!(
                        e.kind(),
                        std::io::ErrorKind::WouldBlock
                            | std::io::ErrorKind::TimedOut
                            | std::io::ErrorKind::Interrupted
                    ) =>
                {
                    continue
                }
                Err(e) => return Err(io("receiving")(e)),
            };
            let Some(&port) = self.peers.get(&from) else {
                self.core.stats.dropped_unknown_peer += 1;
                continue;
            };
            let frame = &buf[..n];
            if let Some((w, _)) = &mut self.pcap {
                let ts = SystemTime::now()
                    .duration_since(UNIX_EPOCH)
                    .unwrap_or_default();
                w.write_packet(&PcapPacket::new(ts, n as u32, frame))
                    .map_err(|e| HubError::Pcap {
                        path: self.cfg.pcap.clone().unwrap_or_default(),
                        msg: e.to_string(),
                    })?;
            }
            if self.cfg.policy.is_some()
                || self.cfg.cas_to_write.is_some()
                || self.cfg.own.is_some()
            {
                let now = start.elapsed().as_micros() as u64;
                outs.clear();
                self.core.process(port, frame, now, &mut outs);
                for (o, f) in &outs {
                    self.emit(port, o, f)?;
                }
                // The capture shows what the switch made, too (after the
                // frame it came from: a WRITE for a CAS, an atomic ACK).
                let made = self.core.take_made();
                if let Some((w, _)) = &mut self.pcap {
                    let ts = SystemTime::now()
                        .duration_since(UNIX_EPOCH)
                        .unwrap_or_default();
                    for f in made {
                        w.write_packet(&PcapPacket::new(ts, f.len() as u32, &f))
                            .map_err(|e| HubError::Pcap {
                                path: self.cfg.pcap.clone().unwrap_or_default(),
                                msg: e.to_string(),
                            })?;
                    }
                }
            } else {
                let o = self.core.on_frame(port, frame);
                self.emit(port, &o, frame)?;
            }
        }
        if let Some((_, spool)) = &mut self.pcap {
            spool.flush().map_err(io("flushing the pcap"))?;
        }
        self.write_stats()
    }
}

/// The capture file, shared between the pcap writer and the loop that
/// flushes it every second (pcap-file's writer lends no access to it).
#[derive(Clone)]
struct Spool(Rc<RefCell<BufWriter<File>>>);

impl Write for Spool {
    fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
        self.0.borrow_mut().write(b)
    }
    fn flush(&mut self) -> std::io::Result<()> {
        self.0.borrow_mut().flush()
    }
}
