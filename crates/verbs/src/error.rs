//! Errors of the verbs backend: device selection, libibverbs calls, the
//! control channel. Each names what failed and, where it helps, what to do.

/// Why the verbs backend could not do something.
#[derive(Debug, thiserror::Error)]
pub enum VerbsError {
    /// libibverbs lists no RDMA device, or cannot list them (a kernel
    /// without an RNIC driver or Soft-RoCE).
    #[error("no RDMA device: {reason}. Use --backend shm (shared memory) or --backend sim (the RNIC simulator) on this host")]
    NoDevice {
        /// Why, as libibverbs reported it.
        reason: String,
    },
    /// The device asked for by name is not on this host.
    #[error("no RDMA device named {want:?} (devices: {have:?})")]
    NoSuchDevice {
        /// The name asked for.
        want: String,
        /// The devices the host has.
        have: Vec<String>,
    },
    /// A libibverbs call failed.
    #[error("{what} failed: {err}")]
    Call {
        /// The call, e.g. `"ibv_reg_mr"`.
        what: &'static str,
        /// Its errno (ENOMEM from `ibv_reg_mr` with a hint about
        /// `ulimit -l`).
        err: std::io::Error,
    },
    /// A setup the backend cannot run (no memory node given, two targets
    /// with one node id, a GID index the port lacks or that is empty, a
    /// token file or memory mapping that fails).
    #[error("{0}")]
    Config(String),
    /// The TCP control channel to a memory node failed (connect,
    /// authentication, an unexpected or refused answer).
    #[error("control channel to {peer}: {what}")]
    Control {
        /// The node's `HOST:PORT` (or the listening address on the node).
        peer: String,
        /// What went wrong.
        what: String,
    },
    /// This binary was built without the `rdma` feature.
    #[error("built without RDMA support: rebuild with `cargo build --release --features dmkit/verbs` (needs libibverbs-dev)")]
    NotBuilt,
}

impl VerbsError {
    /// A failed libibverbs call with its errno.
    pub fn call(what: &'static str, errno: i32) -> Self {
        let mut err = std::io::Error::from_raw_os_error(errno);
        if errno == 12 {
            // ENOMEM from ibv_reg_mr is nearly always the locked-memory limit.
            err = std::io::Error::new(
                err.kind(),
                format!("{err} (for ibv_reg_mr: raise the locked-memory limit, `ulimit -l`)"),
            );
        }
        VerbsError::Call { what, err }
    }
}

/// The calling thread's errno.
#[cfg(feature = "rdma")]
pub(crate) fn errno() -> i32 {
    std::io::Error::last_os_error().raw_os_error().unwrap_or(0)
}
