//! Configuration of the verbs backend (plain data, available with or
//! without the `rdma` feature so the CLI parses the same flags either way).

use std::path::PathBuf;
use std::time::Duration;

/// Which device, port and GID to use.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct DeviceSel {
    /// Device name (`mlx5_0`, `rxe0`); default: the first listed.
    pub device: Option<String>,
    /// Port number (1-based); default 1.
    pub port: Option<u8>,
    /// GID index; default on RoCE: the first RoCE v2 GID with an IPv4-mapped
    /// address (else the first non-zero GID); on InfiniBand: none (LID
    /// routing without a global route header).
    pub gid_index: Option<u8>,
}

/// One memory node to connect to.
#[derive(Debug, Clone)]
pub struct VerbsTarget {
    /// `HOST:PORT` of the node's control channel.
    pub addr: String,
    /// The node's token file (copied from the node's host).
    pub token_file: PathBuf,
}

/// Configuration of the compute side.
#[derive(Debug, Clone)]
pub struct VerbsConfig {
    /// Which device, port and GID index to open.
    pub device: DeviceSel,
    /// Most work requests per doorbell (batch).
    pub max_batch: usize,
    /// Send-queue depth of each queue pair (outstanding requests).
    pub sq_depth: u32,
    /// Inline data requested per queue pair (the provider may grant less).
    pub max_inline: u32,
    /// Timeout of control-channel calls.
    pub control_timeout: Duration,
    /// How long a queue pair waits with requests on the NIC and no
    /// completion at all before it fails them ([`dmkit_fabric::VerbError::NoCompletion`])
    /// and rebuilds itself. On a NIC that counts RC's 7 transport retries
    /// they end far sooner (about 0.5 s); Soft-RoCE takes 7 as unlimited
    /// and retransmits a request whose response is lost for ever, so there
    /// this is what ends the wait.
    pub completion_timeout: Duration,
    /// How long an RPC channel waits with requests unanswered and no
    /// reply at all before it fails them
    /// ([`dmkit_fabric::RpcFailure::NoReply`]) and closes: for the same
    /// reason as `completion_timeout` (a node that died behind rxe is
    /// retried for ever). Longer than the completion timeout, because a
    /// service may take its time: a deferred call that answers later
    /// than this fails so, and its channel with it.
    /// A channel that gave up stays closed: a runtime worker connects its
    /// channels once, so its later calls to that node fail too.
    pub rpc_reply_timeout: Duration,
    /// Requests an RPC channel may have unanswered (its message slots).
    pub rpc_slots: u32,
    /// Largest request or reply payload of an RPC channel.
    pub rpc_max_message: u32,
}

impl Default for VerbsConfig {
    fn default() -> Self {
        Self {
            device: DeviceSel::default(),
            max_batch: 64,
            sq_depth: 256,
            max_inline: 128,
            control_timeout: Duration::from_secs(10),
            completion_timeout: Duration::from_secs(10),
            rpc_reply_timeout: Duration::from_secs(30),
            rpc_slots: 64,
            rpc_max_message: 4096,
        }
    }
}

/// Default token file of a node listening on `addr` (`HOST:PORT`):
/// `$TMPDIR/dmkit-memnode-PORT.token`. Clients on other hosts need a copy.
pub fn default_token_path(addr: &str) -> PathBuf {
    let port = addr.rsplit(':').next().unwrap_or("0");
    std::env::temp_dir().join(format!("dmkit-memnode-{port}.token"))
}
