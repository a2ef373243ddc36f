//! Sockets (RDMA memory-semantics study, §II-B4 and §III-D, Tables II and
//! III, Fig. 9): which socket each virtual thread, each memory node's
//! memory and each NIC port sits on, and what crossing the inter-socket
//! link costs. Off by default ([`crate::SimConfig::numa`] is `None`): then
//! every machine has one socket and no request crosses anything, and the
//! engine's arithmetic is exactly what it was without this module.
//!
//! The model. A queue pair uses one NIC port at each end. A request
//! crosses the link
//! - at the requester when the posting thread's socket is not its port's:
//!   the doorbell's MMIO write and the NIC's DMA read of the WQE go to the
//!   other socket, and so does the DMA write of the completion (and of a
//!   READ's data) — `cross_ns` each (the study's `T_RNIC→Socket`);
//! - at the responder when the memory node's socket is not the port's: the
//!   DMA to host memory takes `cross_ns` longer and moves the payload at
//!   `cross_bw` of the responder's PCIe rate (`T_Socket→Memory`).
//!
//! `cross_ns` and `cross_bw` default to Table II's local-vs-remote socket
//! figures (92 vs 162 ns, 3.70 vs 2.27 GB/s); profiles may override them
//! (`[numa]`).
//!
//! Memory nodes: with a layout, each memory machine holds one memory node
//! per socket — node `i` is on memory machine `i / sockets`, socket
//! `i % sockets` (the study's machines "equally allocate" memory to both
//! sockets; a socket's memory is its own node, so data is placed on a
//! socket by choosing the node). Compute threads get their socket when
//! they are added ([`crate::Sim::add_worker_on`]).

use serde::{Deserialize, Serialize};

/// The cost of crossing the inter-socket link (profile section `[numa]`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NumaModel {
    /// One DMA or MMIO access that crosses to the other socket, extra
    /// latency (ns). Table II: 162 − 92 = 70 ns.
    pub cross_ns: f64,
    /// Bandwidth of a crossing DMA, as a share of the local one. Table II:
    /// 2.27 / 3.70 = 0.61.
    pub cross_bw: f64,
}

impl Default for NumaModel {
    fn default() -> Self {
        Self {
            cross_ns: 70.0,
            cross_bw: 2.27 / 3.70,
        }
    }
}

/// How queue pairs pick their ports.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum PortRule {
    /// Port 0 at both ends, whatever the sockets (a NUMA-unaware program
    /// opens the first device port).
    First,
    /// The port on the posting thread's socket, at both ends (port `i`
    /// talks to port `i`): the study's NUMA-aware connections, "each local
    /// socket only establishes a connection with the matched remote
    /// socket". Memory on the other socket of the remote machine is then
    /// reached across its link, or through a proxy thread on the local
    /// socket that matches it (`dmkit_runtime::numa`).
    Matched,
}

/// The machines' sockets (off unless given).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct NumaLayout {
    /// Sockets per machine (at least 1).
    pub sockets: u32,
    /// Socket of each NIC port (every machine's NIC alike; at least one).
    /// The study's testbed: one dual-port ConnectX-3 on socket 1's PCIe,
    /// `[1, 1]`; the dual-NIC setting of its Fig. 9: `[0, 1]`.
    pub ports: Vec<u32>,
    /// Which port a thread's connections go through.
    pub rule: PortRule,
}

impl NumaLayout {
    /// Checks the layout.
    pub fn validate(&self) -> Result<(), String> {
        if self.sockets == 0 || self.ports.is_empty() {
            return Err("a NUMA layout needs at least one socket and one port".into());
        }
        if let Some(p) = self.ports.iter().find(|&&p| p >= self.sockets) {
            return Err(format!(
                "a port on socket {p}, but machines have {} sockets",
                self.sockets
            ));
        }
        Ok(())
    }

    /// Socket of memory node `node`.
    pub fn node_socket(&self, node: u16) -> u32 {
        node as u32 % self.sockets
    }

    /// The port (index) a queue pair from a thread on `socket` uses, at
    /// both ends.
    fn port_for(&self, socket: u32) -> usize {
        match self.rule {
            PortRule::First => 0,
            PortRule::Matched => self.ports.iter().position(|&p| p == socket).unwrap_or(0),
        }
    }

    /// Which ends of a queue pair from a thread on `thread_socket` to memory
    /// node `node` cross the link: [`CROSS_LOCAL`] | [`CROSS_REMOTE`].
    pub fn crossings(&self, thread_socket: u32, node: u16) -> u8 {
        let ns = self.node_socket(node);
        let port = self.ports[self.port_for(thread_socket)];
        let (lp, rp) = (port, port);
        let mut c = 0;
        if lp != thread_socket {
            c |= CROSS_LOCAL;
        }
        if rp != ns {
            c |= CROSS_REMOTE;
        }
        c
    }
}

/// The requester's CPU and memory are on another socket than its port.
pub const CROSS_LOCAL: u8 = 1;
/// The responder's memory is on another socket than its port.
pub const CROSS_REMOTE: u8 = 2;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn crossings_follow_the_sockets_and_the_rule() {
        // The study's testbed: both ports on socket 1.
        let cx3 = NumaLayout {
            sockets: 2,
            ports: vec![1, 1],
            rule: PortRule::First,
        };
        assert_eq!(cx3.crossings(1, 1), 0, "best case: all on socket 1");
        assert_eq!(cx3.crossings(0, 1), CROSS_LOCAL);
        assert_eq!(cx3.crossings(1, 0), CROSS_REMOTE);
        assert_eq!(
            cx3.crossings(0, 2),
            CROSS_LOCAL | CROSS_REMOTE,
            "worst case"
        );
        // Two NICs, one per socket.
        let mut two = NumaLayout {
            sockets: 2,
            ports: vec![0, 1],
            rule: PortRule::First,
        };
        assert_eq!(two.crossings(1, 1), CROSS_LOCAL | CROSS_REMOTE);
        two.rule = PortRule::Matched;
        for t in 0..2 {
            for n in 0..4 {
                // Matched sockets never cross; the other socket's memory
                // is reached across the remote link (or by a proxy).
                let want = if n % 2 == t as u16 { 0 } else { CROSS_REMOTE };
                assert_eq!(two.crossings(t, n), want, "thread {t}, node {n}");
            }
        }
        assert!(NumaLayout {
            sockets: 1,
            ports: vec![1],
            rule: PortRule::First
        }
        .validate()
        .is_err());
    }
}
