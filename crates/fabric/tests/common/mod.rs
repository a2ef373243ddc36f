#![allow(dead_code)]
use std::io::{BufRead, BufReader};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
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

/// Spawns `cmd` (a testkit child) with its stdout piped and returns it
/// with the first line it printed (what it says once it is ready).
pub fn spawn_until_line(cmd: &mut Command) -> (Child, String) {
    let mut child = cmd.stdout(Stdio::piped()).spawn().unwrap();
    let mut line = String::new();
    BufReader::new(child.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    (child, line)
}
