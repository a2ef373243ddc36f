//! Capabilities a backend declares. Data structures adapt to these, never to
//! a backend's name (STYLE.md: "ask a capability").

/// What a fabric backend offers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Capabilities {
    /// Inside one WRITE, aligned 8-byte words become visible in ascending
    /// address order (the radix tree's rear lock relies on this; without it,
    /// it releases the lock with a second WRITE of the same batch).
    pub in_order_write: bool,
    /// Masked compare-and-swap (mlx5's extended atomics).
    pub masked_cas: bool,
    /// Most work requests in one batch (one doorbell).
    pub max_batch: usize,
    /// Largest WRITE that may be posted inline.
    pub max_inline: usize,
    /// Largest READ or WRITE in bytes.
    pub max_message: usize,
    /// Most scatter/gather entries in one vector request.
    pub max_sge: usize,
    /// Device memory on the NIC for locks (Sherman's on-chip lock table).
    pub on_nic_memory: bool,
    /// Doorbell registers a queue pair can be bound to explicitly (SMART
    /// §4.1's per-thread doorbell). Backends without doorbells (shm) cannot
    /// express that policy.
    pub explicit_doorbells: bool,
    /// Worker threads of the memory nodes serving RPC channels (the
    /// fewest of any node; 0: [`crate::Fabric::connect_rpc`] is refused).
    pub rpc_workers: usize,
}
