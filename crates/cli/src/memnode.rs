//! `dmkit memnode`: run a memory node process serving shm clients on a
//! Unix socket or verbs clients on a TCP control channel.

use std::path::PathBuf;

use clap::Args;
use dmkit_memnode::corm::class::Strategy;
use dmkit_memnode::corm::service::CormService;
use dmkit_memnode::corm::{Correction, Policy, StoreConfig};
use dmkit_memnode::server::{default_token_path, Server, ServerConfig};
use dmkit_memnode::{MemNode, NodeConfig};

use crate::args::{parse_listen, Listen, RdmaArgs};
use crate::units::{format_size, parse_size};
use crate::Res;

#[derive(Args)]
pub(crate) struct MemnodeArgs {
    /// Remote memory size (e.g. 4GiB).
    #[arg(long, default_value = "1GiB", value_parser = parse_size)]
    size: u64,
    /// Where to listen: unix:PATH (shm clients) or tcp:HOST:PORT (verbs
    /// clients over an RDMA device; needs a build with --features dmkit/verbs).
    #[arg(long, value_parser = parse_listen)]
    listen: Listen,
    /// Token file to create (mode 0600); default PATH.token.
    #[arg(long)]
    token_file: Option<PathBuf>,
    /// Memory node id (the high 16 bits of its global addresses).
    #[arg(long, default_value_t = 0)]
    node_id: u16,
    /// Translation page size: 4KiB or 2MiB.
    #[arg(long, default_value = "4KiB", value_parser = parse_size)]
    page_size: u64,
    /// Spare memory pages for run-time remapping.
    #[arg(long, default_value_t = 64)]
    spare_pages: u64,
    /// Worker threads serving RPC channels (0: none; at most 32). They
    /// start with the first channel and sleep when idle.
    #[arg(long, default_value_t = dmkit_memnode::DEFAULT_RPC_WORKERS)]
    workers: usize,
    /// Fault in a chunk's memory when a client allocates it, as an RNIC's
    /// registration pins memory (so no verb pays a first-touch page fault);
    /// off: pages are faulted in by their first access.
    #[arg(long, value_enum, default_value_t = crate::args::OnOff::On)]
    prefault_chunks: crate::args::OnOff,
    /// Bind the node's memory to this socket — the NIC's (memory-semantics
    /// §III-D; needs a build with --features dmkit/hwloc). On a
    /// single-socket host the flag is refused: there is nothing to bind.
    #[arg(long)]
    numa_socket: Option<usize>,
    /// Connections open at once, logged in or not (unix socket and TCP
    /// control channel); the next is refused with an error its client
    /// reports.
    #[arg(long, default_value_t = dmkit_memnode::server::DEFAULT_MAX_CONNECTIONS)]
    max_connections: usize,
    /// Milliseconds from accept to a complete login (unix socket and TCP
    /// control channel); a connection that misses it is closed.
    #[arg(long, default_value_t = dmkit_memnode::server::DEFAULT_LOGIN_DEADLINE.as_millis() as u64)]
    login_timeout_ms: u64,
    /// Keep the node's memory in this file (made if absent), a
    /// persistent-memory stand-in: a node restarted on it finds its chunk
    /// groups and roots (metadata in PATH.meta). A killed node loses
    /// nothing that completed; only a clean shutdown also survives a power
    /// cut. No page remapping (so no --corm).
    #[arg(long, value_name = "PATH")]
    memory_file: Option<PathBuf>,
    #[command(flatten)]
    corm: CormNodeArgs,
    #[command(flatten)]
    rdma: RdmaArgs,
}

/// CoRM's compacting object store, served by the node's RPC workers.
#[derive(Args)]
struct CormNodeArgs {
    /// Host a CoRM object store ("CoRM: Compactable Remote Memory over
    /// RDMA", SIGMOD'21), served by the node's --workers (one allocator
    /// each); clients use `dmkit-corm` over shm or verbs.
    #[arg(long, help_heading = "CoRM store (--corm)")]
    corm: bool,
    /// Block size: a power of two, 4KiB to 1MiB (2MiB with 2MiB pages).
    #[arg(long, default_value = "4KiB", value_parser = parse_size, help_heading = "CoRM store (--corm)")]
    corm_block_size: u64,
    /// Bits of the random object ids: 8, 12 or 16; 0 = offset-based (Mesh).
    #[arg(long, default_value_t = 16, help_heading = "CoRM store (--corm)")]
    corm_ids: u8,
    /// Hybrid ids: offset-based for classes whose blocks hold more objects
    /// than the id space (CoRM §4.4.1); otherwise such classes never compact.
    #[arg(long, help_heading = "CoRM store (--corm)")]
    corm_hybrid: bool,
    /// Pointer correction on the RPC path (§3.2.1): scan the block, or
    /// message the block's owning worker.
    #[arg(
        long,
        value_enum,
        default_value = "scan",
        help_heading = "CoRM store (--corm)"
    )]
    corm_correction: CorrectionArg,
    /// Compact a size class when its fragmentation ratio exceeds this
    /// (0: only on allocation failure and by request).
    #[arg(long, default_value_t = 1.5, help_heading = "CoRM store (--corm)")]
    corm_threshold: f64,
    /// Remote address space the store takes (default: half of --size).
    #[arg(long, value_parser = parse_size, help_heading = "CoRM store (--corm)")]
    corm_space: Option<u64>,
    /// Most memory the store's blocks may hold (default: its space).
    #[arg(long, value_parser = parse_size, help_heading = "CoRM store (--corm)")]
    corm_max_active: Option<u64>,
}

#[derive(Clone, Copy, clap::ValueEnum)]
enum CorrectionArg {
    Scan,
    Message,
}

impl CormNodeArgs {
    /// The store these flags describe, on a node of `size` bytes.
    fn store_config(&self, size: u64) -> Result<Option<StoreConfig>, String> {
        if !self.corm {
            return Ok(None);
        }
        let strategy = match (self.corm_ids, self.corm_hybrid) {
            (0, _) => Strategy::Mesh,
            (b, false) => Strategy::Corm(b),
            (b, true) => Strategy::Hybrid(b),
        };
        strategy
            .validate()
            .map_err(|e| format!("--corm-ids {}: {e}", self.corm_ids))?;
        if !(self.corm_threshold == 0.0 || self.corm_threshold >= 1.0) {
            return Err(format!(
                "--corm-threshold {}: a fragmentation ratio ≥ 1 (0: off)",
                self.corm_threshold
            ));
        }
        let space = self.corm_space.unwrap_or(size / 2);
        Ok(Some(StoreConfig {
            block_size: self.corm_block_size,
            strategy,
            correction: match self.corm_correction {
                CorrectionArg::Scan => Correction::Scan,
                CorrectionArg::Message => Correction::Message,
            },
            policy: Policy {
                threshold: (self.corm_threshold > 0.0).then_some(self.corm_threshold),
                ..Policy::default()
            },
            virtual_bytes: space - space % self.corm_block_size.max(1),
            max_active_bytes: self.corm_max_active,
            ..StoreConfig::default()
        }))
    }
}

pub(crate) fn memnode(a: MemnodeArgs) -> Res {
    dmkit_bench::harness::check_memory("--size", a.size).map_err(crate::bad_input)?;
    if let Some(socket) = a.numa_socket {
        // Before the node touches its memory: its pages follow the policy.
        let topo = dmkit_runtime::numa::Topology::detect();
        if let Some(why) = topo.proxy_reason() {
            return Err(format!("--numa-socket {socket}: {why}"));
        }
        dmkit_runtime::numa::bind_memory_to(socket).map_err(|e| format!("--numa-socket: {e}"))?;
    }
    let corm = a.corm.store_config(a.size).map_err(crate::bad_input)?;
    if corm.is_some() && a.workers == 0 {
        return Err(crate::bad_input(
            "--corm needs --workers of at least 1: they serve the store",
        ));
    }
    if corm.is_some() && a.memory_file.is_some() {
        return Err(crate::bad_input(
            "--memory-file with --corm: the CoRM store remaps pages, a file-backed node keeps the identity translation",
        ));
    }
    let cfg = NodeConfig {
        node_id: a.node_id,
        size: a.size,
        page_size: a.page_size,
        spare_pages: a.spare_pages,
        rpc_workers: a.workers,
        prefault_chunks: a.prefault_chunks == crate::args::OnOff::On,
    };
    let node = match &a.memory_file {
        None => MemNode::new(cfg),
        Some(path) => MemNode::with_memory_file(cfg, path),
    }
    .map_err(|e| e.to_string())?;
    if let Some(path) = &a.memory_file {
        let roots = node.list_roots();
        log(format_args!(
            "dmkit memnode: memory file {}: {} roots and chunk groups kept",
            path.display(),
            roots.len()
        ));
    }
    if let Some(cfg) = corm {
        // Before serving: the verbs server registers the store's region
        // with the NIC when it starts, and hooks its page moves.
        let store = CormService::register(&node, cfg).map_err(|e| format!("--corm: {e}"))?;
        let c = store.config();
        log(format_args!(
            "dmkit memnode: CoRM store: {} blocks, {} ids, {:?} correction, {} of address space, {} workers",
            format_size(c.block_size),
            c.strategy.name(),
            c.correction,
            format_size(c.virtual_bytes),
            c.workers
        ));
    }
    // SIGINT and SIGTERM (and SIGHUP) shut the node down as `node
    // shutdown` does: the serving loop ends, the socket and the token file
    // are removed, and the last log line says so.
    {
        let node = node.clone();
        ctrlc::set_handler(move || {
            log(format_args!(
                "dmkit memnode: signal received, shutting down"
            ));
            node.request_shutdown();
        })
        .map_err(|e| format!("installing the signal handler: {e}"))?;
    }
    let token_file = match &a.listen {
        Listen::Unix(path) => a
            .token_file
            .clone()
            .unwrap_or_else(|| default_token_path(path)),
        Listen::Tcp(addr) => a
            .token_file
            .clone()
            .unwrap_or_else(|| dmkit_verbs::default_token_path(addr)),
    };
    let served = serve(&a, node, &token_file);
    // The token dies with the node, however it ended.
    let _ = std::fs::remove_file(&token_file);
    served?;
    log(format_args!("dmkit memnode: shut down"));
    Ok(())
}

/// The admission limits of the flags (both servers).
fn limits(a: &MemnodeArgs) -> ServerConfig {
    ServerConfig {
        max_connections: a.max_connections,
        login_deadline: std::time::Duration::from_millis(a.login_timeout_ms),
    }
}

/// Serves `node` on `a.listen` until it is shut down.
fn serve(
    a: &MemnodeArgs,
    node: std::sync::Arc<MemNode>,
    token: &std::path::Path,
) -> Result<(), String> {
    let token = token.to_path_buf();
    match &a.listen {
        Listen::Unix(path) => {
            let server = Server::bind(node, path, &token)
                .and_then(|s| s.with_config(limits(a)))
                .map_err(|e| e.to_string())?;
            log(format_args!(
                "dmkit memnode: node {} serving {} (pages {}, {} RPC workers) on unix:{}; token file {}",
                a.node_id,
                format_size(a.size),
                format_size(a.page_size),
                a.workers,
                path.display(),
                token.display()
            ));
            server.serve().map_err(|e| e.to_string())?;
        }
        Listen::Tcp(addr) => {
            dmkit_verbs::serve_node(node, &a.rdma.sel(), addr, &token, limits(a), |bound, dev| {
                log(format_args!(
                    "dmkit memnode: node {} serving {} (pages {}) to verbs clients on tcp:{bound} via {dev}; token file {}",
                    a.node_id,
                    format_size(a.size),
                    format_size(a.page_size),
                    token.display()
                ))
            })
            .map_err(|e| e.to_string())?;
        }
    }
    Ok(())
}

/// Writes a log line to stderr, ignoring failure: a memory node must keep
/// serving (and exit cleanly) even when nobody reads its stderr any more.
fn log(args: std::fmt::Arguments<'_>) {
    use std::io::Write;
    let _ = writeln!(std::io::stderr(), "{args}");
}
