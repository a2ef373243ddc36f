//! # dmkit-verbs — the fabric on real RNICs (rdma-core verbs)
//!
//! The `verbs` backend of DESIGN.md's fabric layer: the same contract as
//! the shm and sim backends (checked one-sided READ/WRITE/CAS/FAA, batches
//! with one doorbell, selective signaling, typed errors, in-order execution
//! per queue pair), executed by an RNIC over RC queue pairs. Built only
//! with the `rdma` feature (`cargo build --release --features dmkit/verbs`,
//! needs `libibverbs-dev` and libclang); without it every entry point
//! answers [`VerbsError::NotBuilt`], so the default build needs no RDMA
//! libraries.
//!
//! Specification: SMART framework (ASPLOS'24) §2.2 (doorbells, QPs), §4.1
//! (thread-aware allocation: per-thread QPs, CQ and doorbell; one device
//! context, PD and MR per process; the QP → doorbell round-robin rule) and
//! §5.1; SMART-ART (OSDI'23) §4.1.3 (inline, unsignaled, doorbell-batched
//! requests); CoRM (SIGMOD'21) §3.5 (re-registration that keeps keys, ODP).
//!
//! - `device`: device/port/GID selection, no hard-coded indices.
//! - `ctl`: the memory node's TCP control channel (no memcached).
//! - `server`: the memory node side — registrations over the node's memory,
//!   queue-pair setup, page remapping with re-registration.
//! - `fabric`, `vqp`: the compute side.
//!
//! Hardware numbers need hardware: on Soft-RoCE (rxe) in an emulated guest
//! — the project's test harness, `tools/softroce/` — this backend is a
//! functional check, and its throughput says nothing about an RNIC.

pub mod config;
pub mod error;

pub use config::{default_token_path, DeviceSel, VerbsConfig, VerbsTarget};
pub use error::VerbsError;

#[cfg(feature = "rdma")]
pub mod ctl;
#[cfg(feature = "rdma")]
pub mod device;
#[cfg(feature = "rdma")]
mod fabric;
#[cfg(feature = "rdma")]
mod qp;
#[cfg(feature = "rdma")]
mod rpc;
#[cfg(feature = "rdma")]
mod server;
#[cfg(feature = "rdma")]
mod vqp;

#[cfg(feature = "rdma")]
pub use fabric::VerbsFabric;
#[cfg(feature = "rdma")]
pub use server::{RunningServer, VerbsServer};
#[cfg(feature = "rdma")]
pub use vqp::VerbsQp;

use std::path::Path;
use std::sync::Arc;

use dmkit_fabric::Fabric;
use dmkit_memnode::MemNode;

/// Whether this build has the verbs backend.
pub const AVAILABLE: bool = cfg!(feature = "rdma");

/// Names of the RDMA devices on this host, or why there are none.
pub fn devices() -> Result<Vec<String>, VerbsError> {
    #[cfg(feature = "rdma")]
    return device::list_devices();
    #[cfg(not(feature = "rdma"))]
    Err(VerbsError::NotBuilt)
}

/// Opens the verbs fabric to `targets`.
pub fn open_fabric(
    cfg: VerbsConfig,
    targets: &[VerbsTarget],
) -> Result<Arc<dyn Fabric>, VerbsError> {
    #[cfg(feature = "rdma")]
    return Ok(Arc::new(VerbsFabric::open(cfg, targets)?));
    #[cfg(not(feature = "rdma"))]
    {
        let _ = (cfg, targets);
        Err(VerbsError::NotBuilt)
    }
}

/// Serves `node` to verbs clients on `listen` (`HOST:PORT`) until the node
/// shuts down; writes the token to `token_file`; admits connections
/// within `limits`. Calls `ready` with the
/// bound address and device name once clients can connect.
pub fn serve_node(
    node: Arc<MemNode>,
    sel: &DeviceSel,
    listen: &str,
    token_file: &Path,
    limits: dmkit_memnode::admission::ServerConfig,
    ready: impl FnOnce(std::net::SocketAddr, &str),
) -> Result<(), VerbsError> {
    #[cfg(feature = "rdma")]
    {
        let s = VerbsServer::bind(node, sel, listen, token_file)?.with_config(limits)?;
        ready(s.local_addr(), s.device().name());
        s.serve()
    }
    #[cfg(not(feature = "rdma"))]
    {
        let _ = (node, sel, listen, token_file, limits, ready);
        Err(VerbsError::NotBuilt)
    }
}

/// A random 24-bit packet sequence number.
#[cfg(feature = "rdma")]
pub(crate) fn random_psn() -> u32 {
    let mut b = [0u8; 4];
    let _ = getrandom::fill(&mut b);
    u32::from_le_bytes(b) & 0x00FF_FFFF
}

#[cfg(test)]
mod tests {
    use super::*;

    /// On a host without RDMA the answer names the cause and the way out;
    /// on one with devices, they are listed.
    #[test]
    fn no_device_is_said_plainly() {
        let have_rdma = std::path::Path::new("/sys/class/infiniband").exists();
        match devices() {
            // Only a build without the backend may answer NotBuilt.
            Err(VerbsError::NotBuilt) if !AVAILABLE => {}
            Err(e @ VerbsError::NoDevice { .. }) => {
                assert!(!have_rdma, "a host with /sys/class/infiniband: {e}");
                let msg = e.to_string();
                assert!(
                    msg.contains("--backend shm") && msg.contains("--backend sim"),
                    "{msg}"
                );
            }
            Ok(names) => assert!(have_rdma, "devices listed without sysfs: {names:?}"),
            Err(e) => panic!("unexpected: {e}"),
        }
        if !AVAILABLE {
            let e = open_fabric(VerbsConfig::default(), &[])
                .err()
                .expect("not built");
            assert!(e.to_string().contains("--features dmkit/verbs"));
        }
    }
}
