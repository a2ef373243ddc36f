#![allow(dead_code)]
use std::path::PathBuf;
use std::sync::Arc;

use dmkit_fabric::shm::{ShmConfig, ShmFabric, Target};
use dmkit_memnode::server::{default_token_path, Running, Server};
use dmkit_memnode::{MemNode, NodeConfig};

/// A memory node served on a Unix socket by a thread of this process.
pub struct Served {
    pub dir: tempfile::TempDir,
    pub socket: PathBuf,
    pub node: Arc<MemNode>,
    pub running: Option<Running>,
}

impl Served {
    pub fn start(size: u64) -> Self {
        let dir = tempfile::tempdir().unwrap();
        let socket = dir.path().join("node.sock");
        let node = MemNode::new(NodeConfig {
            size,
            ..Default::default()
        })
        .unwrap();
        let running = Server::bind(node.clone(), &socket, &default_token_path(&socket))
            .unwrap()
            .spawn()
            .unwrap();
        Self {
            dir,
            socket,
            node,
            running: Some(running),
        }
    }

    pub fn target(&self) -> Target {
        Target::new(&self.socket)
    }

    pub fn client(&self) -> ShmFabric {
        ShmFabric::open(ShmConfig::default(), &[self.target()]).unwrap()
    }
}
