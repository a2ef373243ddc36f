#![allow(dead_code)]
use std::path::PathBuf;
use std::sync::Arc;

use dmkit_fabric::shm::{ShmConfig, ShmFabric, Target};
use dmkit_memnode::server::Server;
use dmkit_memnode::{MemNode, NodeConfig};

/// A memory node served on a Unix socket by a thread of this process.
pub struct Served {
    pub dir: tempfile::TempDir,
    pub socket: PathBuf,
    pub node: Arc<MemNode>,
    pub thread: Option<std::thread::JoinHandle<()>>,
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
        let server = Server::bind(
            node.clone(),
            &socket,
            &dmkit_memnode::server::default_token_path(&socket),
        )
        .unwrap();
        let thread = std::thread::spawn(move || server.serve().unwrap());
        Self {
            dir,
            socket,
            node,
            thread: Some(thread),
        }
    }

    pub fn target(&self) -> Target {
        Target::new(&self.socket)
    }

    pub fn client(&self) -> ShmFabric {
        ShmFabric::open(ShmConfig::default(), &[self.target()]).unwrap()
    }
}

impl Drop for Served {
    fn drop(&mut self) {
        self.node.request_shutdown();
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}
