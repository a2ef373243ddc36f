//! Errors of the verbs backend: device selection, libibverbs calls, the
//! control channel. Each names what failed and, where it helps, what to do.

/// Why the verbs backend could not do something.
#[derive(Debug, thiserror::Error)]
pub enum VerbsError {
    #[error("no RDMA device: {reason}. Use --backend shm (shared memory) or --backend sim (the RNIC simulator) on this host")]
    NoDevice { reason: String },
    #[error("no RDMA device named {want:?} (devices: {have:?})")]
    NoSuchDevice { want: String, have: Vec<String> },
    #[error("{what} failed: {err}")]
    Call {
        what: &'static str,
        err: std::io::Error,
    },
    #[error("{0}")]
    Config(String),
    #[error("control channel to {peer}: {what}")]
    Control { peer: String, what: String },
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
