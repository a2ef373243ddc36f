//! `dmkit memnode`: run a memory node process serving shm clients on a
//! Unix socket or verbs clients on a TCP control channel.

use std::path::PathBuf;

use clap::Args;
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
    #[command(flatten)]
    rdma: RdmaArgs,
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
    let node = MemNode::new(NodeConfig {
        node_id: a.node_id,
        size: a.size,
        page_size: a.page_size,
        spare_pages: a.spare_pages,
        rpc_workers: a.workers,
    })
    .map_err(|e| e.to_string())?;
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
