//! The fabric conformance suite against a memory node on another host
//! (tools/softroce/multi.sh: a client guest and a memory-node guest joined
//! only by `dmkit switch`). Ignored by default; run with `--ignored` and
//! `DMKIT_REMOTE_NODE=HOST:PORT` (a `dmkit memnode --listen tcp:...`),
//! `DMKIT_REMOTE_TOKEN=FILE` (a copy of its token file), and the device
//! from `DMKIT_RDMA_DEVICE` / `DMKIT_GID_INDEX`.
#![cfg(feature = "rdma")]

use dmkit_fabric::{conformance, Fabric};
use dmkit_verbs::{DeviceSel, VerbsConfig, VerbsFabric, VerbsTarget};

#[test]
#[ignore = "needs an RDMA device and a memory node on another host (tools/softroce/multi.sh)"]
fn conformance_on_remote_node() {
    let addr = std::env::var("DMKIT_REMOTE_NODE").expect("DMKIT_REMOTE_NODE=HOST:PORT");
    let token = std::env::var("DMKIT_REMOTE_TOKEN").expect("DMKIT_REMOTE_TOKEN=FILE");
    let fabric = VerbsFabric::open(
        VerbsConfig {
            device: DeviceSel {
                device: std::env::var("DMKIT_RDMA_DEVICE").ok(),
                port: None,
                gid_index: std::env::var("DMKIT_GID_INDEX")
                    .ok()
                    .and_then(|v| v.parse().ok()),
            },
            ..Default::default()
        },
        &[VerbsTarget {
            addr,
            token_file: token.into(),
        }],
    )
    .expect("verbs fabric to the remote node");
    eprintln!("device {} caps {:?}", fabric.device().name(), fabric.caps());
    conformance::run_all(&fabric, 0);
}
