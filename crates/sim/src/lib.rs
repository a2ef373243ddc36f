//! # dmkit-sim — a deterministic RNIC simulator
//!
//! The `sim` backend: real memory, simulated timing. Data structures run
//! unchanged (they only see a [`dmkit_fabric::Fabric`]); runtime workers run
//! as *virtual threads* on simulated CPUs of simulated machines, stepped by
//! one OS thread in virtual nanoseconds ([`Sim`]). The same seed and inputs
//! give the same events and results, bit for bit: there is no wall-clock
//! input, every random choice comes from the seeded [`rng`], and every tie
//! is broken by a sequence number.
//!
//! Not here: the figures' workloads (`dmkit-bench`'s `sim_repro`), the
//! switch's policy (`dmkit-switch`; [`switch`] puts it in the network).
//!
//! ## The model (specification: SMART §2.2, §3, §6.1, §6.3; memory-semantics
//! §II-B; SwordBox §3)
//!
//! Parameters, units and sources are documented field by field in
//! [`profile`]; the shipped profiles are `configs/sim/*.toml`. A work
//! request travels through these stages, each a FIFO server that is busy
//! for the request's service time:
//!
//! 1. **CPU** of the posting virtual thread: `post_ns + k·post_wr_ns` for a
//!    post of `k` requests, `poll_ns` per poll, `cqe_ns` per completion,
//!    `task_ns` per task resumption; all × the SMT slowdown when the
//!    machine runs more threads than it has cores.
//! 2. **Locks**: a shared or multiplexed queue pair's lock, then the
//!    doorbell register's spinlock (SMART §2.2: every doorbell of the mlx5
//!    driver is guarded by one). Queue pairs get doorbells as the driver
//!    does — the first 4 a low-latency one each, later ones round-robin over
//!    the 12 medium-latency ones (Fig. 2b) — unless the thread owns one
//!    (thread-aware allocation, §4.1). A hold costs `lock_ns`, plus
//!    `bounce_ns` when the previous holder was another thread (the line
//!    moves), plus `handoff_ns` per thread queued ahead (up to
//!    `max_spinners`): sharing costs only while the sharers actually post.
//!    Holds are booked on a calendar, so a thread that asks earlier in
//!    virtual time wins even if it is stepped later. The time a thread
//!    waits is spent spinning, on its CPU.
//! 3. **Requester NIC**: WQE fetch (`fetch_ns`), then the queue pair's
//!    processing unit, one request at a time: `wr_ns` for each request of
//!    a post but the first and `sge_ns` per scatter/gather piece beyond the
//!    first (costs doorbell batching does not amortise; memory-semantics
//!    §III-A, Fig. 4). With `processing_units = N` the NIC has `N` units
//!    in parallel (a machine's queue pairs spread over them, each unit a
//!    FIFO); with 0 the unit's time is booked on the NIC-wide send units
//!    and one queue pair's holds back the others (the model before the
//!    switch; `engine`'s `send_queue` says how each is booked). A WRITE
//!    whose payload exceeds `max_inline` then waits `payload_fetch_ns` for
//!    the DMA read of its payload (latency only, with units; the
//!    memory-semantics study's Fig. 1: a 256-byte WRITE is 0.63 µs slower
//!    than a small one at the same throughput). Then the
//!    send-queue units, bounded by the message rate (`iops`) and by PCIe
//!    bytes (`wr_bytes` + payload + WQE-cache misses). Outstanding requests
//!    (posted, CQE not yet polled) beyond `wqe_cache` miss with probability
//!    `1 − wqe_cache/outstanding`, each miss costing `miss_bytes` of PCIe
//!    traffic (§3.2: cache thrashing, Fig. 4b's DRAM traffic per request).
//! 4. **Links**: the requester's uplink and the target's downlink through
//!    one switch, `header_bytes` per packet of at most `mtu`, `gbps` each
//!    way, `wire_ns` one way.
//! 5. **Responder**: its execution rate (`iops`, PCIe bytes), its
//!    translation cache (`mtt_entries` pages, a miss costs `mtt_miss_ns`),
//!    the DMA to host memory (`dma_read_ns`/`dma_write_ns`), and for atomics
//!    the atomic unit: an aggregate rate (`atomic_mops`) and per-address
//!    serialisation (`atomic_ns`, or `atomic_nic_ns` in device memory)
//!    (SwordBox §3.2: same-address CAS ceilings, Fig. 4); an atomic waiting
//!    for its address holds up other addresses' atomics only with
//!    `atomic_head_of_line`. Which of the atomics waiting for one address
//!    goes next is `atomic_order`: `post` books the address when the
//!    atomic is posted (posting order, and every request's timing is final
//!    at its post); the arbitrated orders decide when the address frees,
//!    among the queue pairs whose first unexecuted request is an atomic
//!    waiting there (`arrival`, `random`, `newest`, `round-robin`). Under
//!    an arbitrated order an atomic's execution, and that of everything its
//!    queue pair posted behind it, is computed at the arbitration; the
//!    driver runs every arbitration before any step that comes after it
//!    and wakes the threads whose completions it placed. The built-in
//!    profiles keep `post`; `configs/sim/cx6-200g.toml` compares the
//!    orders on SMART's figures 7 and 14. With `atomic_stalls_access`
//!    (post order only), a READ or WRITE of a word with atomics booked on
//!    it executes after they complete (SwordBox §3.2: accesses with a data
//!    dependency on an atomic's address stall until it completes), so a
//!    hot word's readers queue with its CASes.
//!    The request takes effect here — after the previous request of its
//!    queue pair.
//! 6. **Response**: back over the links; data and CQE are written to host
//!    memory (`deliver_ns`); completions of one queue pair are delivered in
//!    order.
//!
//! Known simplification: each link is a FIFO in the order requests are
//! processed (posting order), so a response whose request executes late
//! (an atomic queued on a hot address) holds back the responses of
//! requests processed after it at that node, even ones that executed
//! earlier. Responses leave in execution order on a real link.
//!
//! ## The RPC path ([`rpc`])
//! Two-sided calls to a memory node's worker threads (the fabric's RPC
//! channel) go through the same client CPU, NIC and links as a request
//! of their size, then the node's NIC, its RPC queue (`rpc.queue_ns`, one
//! request at a time) and its worker cores (`rpc.cores`, first come first
//! served, `rpc.request_ns + rpc.byte_ns × bytes` each plus what the
//! service charges). The real service code runs at the request's
//! simulated start; services' messages between workers are jobs of their
//! destination core; replies come back over the links, in order per
//! channel. The ConnectX-3 profile is calibrated on CoRM's RPC round trip
//! and saturation (`configs/sim/cx3-56g.toml`). Runs that open no channel
//! take none of these branches.
//!
//! ## Faults
//! [`Faults`]: torn READ/WRITE at 8-byte granularity (ascending when the
//! device declares in-order placement, any order otherwise), delays,
//! cross-queue-pair reordering, lost connections, and clock skew — each a
//! switch, all drawn from the seed.
//!
//! Clock skew ([`clock`]): with `clock_skew_ns = B`, each machine's workers
//! read a clock of their own, virtual time plus an offset that drifts
//! (`clock_drift_ppm`) and jumps (`clock_jump` per `clock_period_ns`)
//! within `±B`, clamped so it never goes backwards. Lock leases and RACE's
//! grace period assume such a bound; `dmkit sim check` draws one per seed
//! within what the code under test assumes. Workers' timers are set on
//! their machine's clock; [`Sim::virtual_at`] maps a reading back to
//! virtual time (a history checker's timestamps, say). Off, every machine
//! reads virtual time and nothing changes.

pub mod clock;
pub mod driver;
pub mod engine;
pub mod fabric;
pub mod faults;
pub mod numa;
pub mod profile;
pub mod rng;
pub mod rpc;
pub mod switch;

pub use clock::MachineClock;
pub use driver::{RunOutcome, Sim, SimClock, SimConfig};
pub use engine::{SimStats, ThreadId, Time};
pub use fabric::{SimFabric, SimQp, SimRpcChannel};
pub use faults::Faults;
pub use numa::{NumaLayout, NumaModel, PortRule};
pub use profile::Profile;
pub use rpc::RpcSimStats;
pub use switch::{SwitchMode, SwitchModel, SwitchSimStats};
