//! Device profiles: every number the model uses, with its unit and where it
//! comes from. Profiles are TOML files (`configs/sim/*.toml`); the three
//! shipped ones are compiled in and selectable by name.
//!
//! Units: times in nanoseconds, rates in millions of operations per second
//! (Mops), bandwidths in gigabytes per second (GB/s = bytes per ns), sizes
//! in bytes. Parameters marked *calibrated* were fitted so that
//! `dmkit sim reproduce smart-fig3a|smart-fig4a|smart-table1` land within
//! ±30 % of SMART's published numbers on the ConnectX-6 profile; the rest
//! are taken from the papers as cited.

use serde::{Deserialize, Serialize};

/// A simulated machine and its RNIC.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Profile {
    /// Human-readable name (reports).
    pub name: String,
    /// Compute-side CPU costs (cores, SMT, per-post and per-poll work).
    pub cpu: CpuModel,
    /// Doorbell registers and the locks that guard them (SMART, ASPLOS'24
    /// §3.1).
    pub doorbell: DoorbellModel,
    /// The requester RNIC: processing units, WQE cache, PCIe.
    pub nic: NicModel,
    /// Wire bandwidth and latency between machines.
    pub link: LinkModel,
    /// The responder RNIC on the memory blade: its execution rate, atomics unit
    /// and translation cache.
    pub responder: ResponderModel,
    /// The capabilities the device declares to the fabric.
    pub limits: Limits,
    /// The memory nodes' CPUs serving RPC channels (absent: the defaults
    /// of [`RpcModel`]; nothing but the RPC path reads it).
    #[serde(default)]
    pub rpc: RpcModel,
    /// Crossing the inter-socket link (used only with a NUMA layout,
    /// `crate::numa`; absent: Table II of the memory-semantics study).
    #[serde(default)]
    pub numa: crate::numa::NumaModel,
}

/// A memory node's CPU on the RPC path ([`crate::rpc`] has the model).
/// The defaults are round numbers for a server CPU, not calibrated; the
/// ConnectX-3 profile's are CoRM's (SIGMOD'21 §4).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct RpcModel {
    /// Worker cores per memory node (0: no RPC channel).
    pub cores: u32,
    /// A core's time per request besides its bytes: take it from the
    /// receive queue, dispatch, run the service, post the reply (ns).
    pub request_ns: f64,
    /// A core's time per byte of request and reply: the copies (ns/B).
    pub byte_ns: f64,
    /// The node's RPC queue shared by the workers: every request passes it
    /// one at a time, holding it this long (ns; 0: no such stage). It is
    /// what bounds a node's RPC rate when its cores are not the bottleneck.
    pub queue_ns: f64,
}

impl Default for RpcModel {
    fn default() -> Self {
        Self {
            cores: 4,
            request_ns: 500.0,
            byte_ns: 0.1,
            queue_ns: 0.0,
        }
    }
}

/// The compute blade's CPUs. Every CPU cost is charged to the virtual thread
/// that incurs it, multiplied by the SMT slowdown when both hardware threads
/// of its core are busy.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CpuModel {
    /// Physical cores per machine. SMART §6.1: two Xeon Gold 6240R, 2 × 24
    /// cores (96 hardware threads).
    pub cores: u32,
    /// Hardware threads per core (2 on that testbed).
    pub smt: u32,
    /// Cost multiplier of a hardware thread whose sibling is busy.
    /// *Calibrated*: SMART Fig. 4a's per-thread rate at 96 threads is about
    /// half the rate of 36 threads at the same depth.
    pub smt_slowdown: f64,
    /// One `ibv_post_send` call: WQE ring bookkeeping, the doorbell record,
    /// the MMIO doorbell write (ns). *Calibrated* (with the three below)
    /// so a READ loop at depth 1 reaches SMART Fig. 4a's 33 Mops at 96
    /// threads.
    pub post_ns: f64,
    /// Building one WQE of a post (ns).
    pub post_wr_ns: f64,
    /// One `ibv_poll_cq` call, empty or not (ns).
    pub poll_ns: f64,
    /// Reaping one CQE (ns).
    pub cqe_ns: f64,
    /// Resuming one task (coroutine) and running its code until it waits
    /// again (ns) — the application's own work per step.
    pub task_ns: f64,
    /// A control RPC to a memory node (chunk allocation, roots), end to end
    /// (ns; two-sided, the memory node's weak CPU answers).
    pub rpc_ns: f64,
}

/// Doorbell registers (UAR) of one device context (SMART §2.2, Fig. 2).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DoorbellModel {
    /// Low-latency doorbells, each bound to one queue pair (4 by default).
    pub low_latency: u32,
    /// Medium-latency doorbells shared round-robin by later queue pairs
    /// (12 by default; `MLX5_TOTAL_UUARS` = 16).
    pub medium_latency: u32,
    /// Holding a doorbell's spinlock for one post when no other thread uses
    /// it (the lock's cache line stays local): acquire, MMIO write, release
    /// (ns).
    pub lock_ns: f64,
    /// Extra hold time when the previous holder was another thread: the
    /// lock's cache line (and the doorbell's BlueFlame buffer) moves to this
    /// core (ns). *Calibrated* on SMART Fig. 3a: 2–3 threads interleaving
    /// on each medium-latency doorbell at 32 threads give ≈39 Mops with
    /// per-thread queue pairs, against ≈57 with a doorbell each.
    pub bounce_ns: f64,
    /// Extra hold time per thread the acquiring one waited behind: every
    /// release invalidates the line in each spinning core, so a lock with a
    /// queue is handed over slower (ns). *Calibrated* on SMART Fig. 3a:
    /// per-thread queue pairs fall to ≈19 Mops at 96 threads, where 74 % of
    /// the time is spent in `pthread_spin_lock` (§3.1). Threads that share
    /// the doorbell but are not posting cost nothing.
    pub handoff_ns: f64,
    /// Spinners past which a handover gets no slower: the coherence fabric
    /// serves the line's requests one at a time, so extra spinners queue
    /// instead of adding traffic. *Calibrated* on SMART Fig. 12: Sherman+
    /// (94 threads, a queue pair to each of 8 memory nodes, so every thread
    /// on every doorbell) reaches 53.9 Mops on YCSB-C; with no bound the
    /// handover cost grows with all 93 other threads and the run collapses
    /// below 10 Mops. Fig. 3a never queues more than 7 (96 threads over 12
    /// medium-latency doorbells), so it does not see this bound.
    pub max_spinners: u32,
}

/// The RNIC's requester side and its PCIe link to the host.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NicModel {
    /// Message-rate ceiling of the send-queue processing units (Mops).
    /// SMART §6.1: "the hardware limit of the RNIC on our test platform is
    /// 110.0 MOP/s".
    pub iops: f64,
    /// From the doorbell write until the NIC has fetched the posted WQEs by
    /// DMA (ns): MMIO + one PCIe read round trip.
    pub fetch_ns: f64,
    /// Host memory bandwidth the NIC's DMA engine sustains over PCIe (GB/s).
    /// SMART §6.2.2 footnote: PCIe 3.0, 128 Gbps raw; Fig. 4b's 93 B per
    /// READ at 111 Mops puts the usable rate near 10 GB/s.
    pub pcie_gbs: f64,
    /// PCIe bytes per work request besides its payload: the WQE fetch and
    /// the CQE write (B). SMART Fig. 4b: 93 B per 8-byte READ with a warm
    /// WQE cache.
    pub wr_bytes: f64,
    /// Outstanding work requests (posted, CQE not yet polled) the WQE cache
    /// holds before it thrashes. *Calibrated* on SMART Fig. 4a/4b: no loss at
    /// 96 × 8 = 768, a loss at 96 × 16.
    pub wqe_cache: f64,
    /// Ceiling of the miss probability: once the cache thrashes, misses per
    /// request level off (the NIC refetches WQEs in groups). *Calibrated*:
    /// SMART Table 1's throughput without throttling (96 threads × 64
    /// outstanding) stays above Fig. 4a's depth-32 value.
    pub max_miss: f64,
    /// Extra PCIe bytes a WQE-cache miss costs (a refetch) (B).
    /// *Calibrated*: Fig. 4b's 180 B per READ at 96 × 32 outstanding.
    pub miss_bytes: f64,
    /// A DMA write of data and CQE into host memory until it is visible to
    /// a polling CPU (ns).
    pub deliver_ns: f64,
    /// Time each work request of a post but the first holds its queue
    /// pair's processing unit (ns): the NIC fetches those WQEs by DMA one
    /// by one (the first comes with the doorbell's MMIO write, the
    /// driver's BlueFlame path, in `fetch_ns`), and a queue pair's
    /// requests pass the unit one at a time, so this cost does not shrink
    /// with doorbell batching. Absent: 0 (the ConnectX-5 and -6
    /// profiles, whose figures do not show it). The ConnectX-3 profile's
    /// is fitted to the memory-semantics study's Fig. 4 (doorbell batch of
    /// 32 only 1.53× batch 1; configs/sim/cx3-40g.toml).
    #[serde(default)]
    pub wr_ns: f64,
    /// Extra time on the queue pair's unit per scatter/gather piece beyond
    /// the first (ns): one more DMA of host memory each. Absent: 0. The
    /// ConnectX-3 profile's is fitted to the memory-semantics study's
    /// Fig. 4 (SP over SGL 1.11–2.14×).
    #[serde(default)]
    pub sge_ns: f64,
    /// Where `wr_ns` and `sge_ns` are spent: the NIC's processing units,
    /// which work in parallel. `0` (absent; the engine's behaviour before
    /// this switch, kept so older runs can be repeated): the unit's time is
    /// booked on the NIC-wide send-queue units together with each request,
    /// one post at a time, so one queue pair's unit time holds back every
    /// other queue pair on the NIC (a NIC-wide ceiling of 1 / `wr_ns`
    /// charged requests per second). `N ≥ 1`: the NIC has `N` processing
    /// units, the machine's `i`-th queue pair is handled by unit `i mod N`,
    /// and units overlap; queue pairs on one unit take turns post by post
    /// (the unit is a FIFO). The NIC-wide send-queue units are then booked
    /// without the unit's time, at the post's fetch, and the unit's time
    /// delays the request's departure, and so its completion (see
    /// `crate::engine`'s `send_queue`). Only the ConnectX-3 profile sets it
    /// (configs/sim/cx3-40g.toml says on which figure).
    #[serde(default)]
    pub processing_units: u32,
    /// A WRITE (plain or scatter/gather) whose payload exceeds
    /// `limits.max_inline` cannot travel inside its WQE: the NIC reads the
    /// payload from host memory by DMA before the request can leave, one
    /// more PCIe read round trip (ns). Payloads up to `max_inline` are
    /// taken as posted inline (the driver copies them into the WQE, the
    /// BlueFlame path), so they pay nothing; READs and atomics carry no
    /// payload out. The fetch is latency, not occupancy: it holds neither
    /// the processing unit nor the NIC-wide units, only the request (and
    /// its queue pair's later requests, which leave in order); the
    /// fetches of a queue pair's requests overlap. It needs
    /// `processing_units` ≥ 1 (the per-request delay path). Absent: 0 (the
    /// ConnectX-5 and -6 profiles). The ConnectX-3 profile's is fitted to
    /// the memory-semantics study's Fig. 1 (a WRITE's latency rises from
    /// 1.16 µs for small payloads to 1.79 µs at 256 B while the
    /// throughput stays put; configs/sim/cx3-40g.toml).
    #[serde(default)]
    pub payload_fetch_ns: f64,
}

/// Links and the switch between machines (one top-of-rack switch).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LinkModel {
    /// Link bandwidth per direction (Gbps).
    pub gbps: f64,
    /// Header and framing bytes per packet (IB LRH+BTH+RETH/AETH+ICRC+VCRC).
    pub header_bytes: f64,
    /// One way, NIC to NIC through the switch: propagation plus switching (ns).
    pub wire_ns: f64,
    /// Largest payload of one packet (MTU, B); longer messages are several packets.
    pub mtu: f64,
    /// Responses take the first idle gap of their link at or after they
    /// are ready (a calendar of the link's busy periods), one queue pair's
    /// responses in its order, instead of a FIFO booked in the order
    /// requests are posted. Responses are ready when their requests
    /// execute, which is not the posting order when atomics wait at a
    /// contended address: under the FIFO such a response, booked for
    /// microseconds ahead, holds back every response of a request posted
    /// after it at that node — even one of another queue pair that
    /// executed long before — which a wire, sending whatever is ready, does
    /// not do (an RC responder orders only each queue pair's responses).
    /// Absent means `false` (the FIFO, the engine's original model); the
    /// built-in profiles set `true` (configs/sim/cx6-200g.toml says what
    /// it moved).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub response_gaps: bool,
}

/// The RNIC's responder side on a memory blade.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ResponderModel {
    /// Incoming requests the responder executes per second (Mops).
    pub iops: f64,
    /// Host-memory bandwidth of the responder's DMA (GB/s).
    pub pcie_gbs: f64,
    /// DMA read of host memory for a READ or an atomic (ns).
    pub dma_read_ns: f64,
    /// DMA write of a WRITE's payload until it is placed (ns).
    pub dma_write_ns: f64,
    /// Same-address atomics in host memory are serialised, each holding the
    /// address this long (ns). SwordBox §3.2 Fig. 4: ≈3 Mops for serialised
    /// CAS in host memory (≈330 ns each; the ConnectX-5 profile). The
    /// ConnectX-6 profile's 450 ns is calibrated to SMART's artifact (RACE
    /// YCSB A at one compute node, Fig. 7; configs/sim/cx6-200g.toml).
    pub atomic_ns: f64,
    /// The same in on-NIC device memory (ns). SwordBox Fig. 4: ≈9 Mops.
    pub atomic_nic_ns: f64,
    /// Aggregate atomic-unit ceiling over all addresses (Mops). SwordBox
    /// Fig. 3: ≈55 Mops of CAS on independent addresses (ConnectX-5).
    pub atomic_mops: f64,
    /// Whether an atomic that waits for its address holds the atomic unit
    /// meanwhile (head-of-line blocking across addresses). `true`: one FIFO
    /// unit, an atomic takes the unit's next slot when it executes, so a
    /// queue on one hot address delays every later atomic at the node.
    /// `false` (the built-in profiles, and the default): the unit's
    /// aggregate rate is paced in arrival order and only atomics on the same
    /// address wait for each other. Neither SwordBox's nor SMART's
    /// measurements isolate the two; the published figures fit `false`
    /// better (configs/sim/cx6-200g.toml says by how much).
    #[serde(default)]
    pub atomic_head_of_line: bool,
    /// Whether a READ or WRITE that touches a word with atomics booked on
    /// it waits until they have completed. SwordBox §3.2: atomics "require
    /// mutual exclusion across all RDMA queue pairs—concurrent read and
    /// write operations with a data dependency on the atomic address must
    /// stall until the atomic completes". The access waits for the atomics
    /// posted before it (so it sees their results) and does not hold the
    /// address itself. Only with `atomic_order = "post"` (an arbitrated
    /// order decides an atomic's execution after later accesses are
    /// posted). Absent means `false` (the engine's original model); the
    /// built-in profiles set `true` (configs/sim/cx6-200g.toml compares
    /// the two on SMART's and the radix tree's figures).
    #[serde(default)]
    pub atomic_stalls_access: bool,
    /// Which of the atomics waiting for one busy address executes next
    /// (see [`AtomicOrder`]). Default `post`.
    #[serde(default)]
    pub atomic_order: AtomicOrder,
    /// Entries of the translation (MTT) cache, one per page (the SMART
    /// testbed uses 2 MB pages: a 1 GB region is 512 entries).
    pub mtt_entries: u64,
    /// A translation-cache miss: one more PCIe read (ns).
    /// Memory-semantics §II-B2 and §III-B: random access misses the RNIC's
    /// translation cache.
    pub mtt_miss_ns: f64,
}

/// How the responder orders atomics that wait for the same address.
///
/// Same-address atomics are serialised (SwordBox §3.2), but in which order
/// the waiting ones are served is not documented for any ConnectX device,
/// and nothing in the three papers measures it. `post`, the default, is the
/// engine's original model: each atomic books the address when it is
/// posted, so waiting atomics are served in posting order and a request's
/// timing is final when it is posted. The others decide when the address
/// frees, among the atomics that have reached the address by then and
/// that head their queue pair (a queue pair executes in order, so only its
/// first unexecuted request can be waiting); whatever the queue pair posted
/// behind such an atomic waits with it. `arrival` serves the earliest
/// arrival (first come, first served at the responder), `random` a
/// uniformly random one (the simulation's seeded generator), `newest` the
/// latest arrival, `round-robin` the next queue pair in a fixed cyclic
/// order after the last one served.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum AtomicOrder {
    /// Served in posting order, booked when posted (the default).
    #[default]
    Post,
    /// The earliest arrival first.
    Arrival,
    /// A uniformly random waiting one (from the seeded generator).
    Random,
    /// The latest arrival first.
    Newest,
    /// The next queue pair in a fixed cyclic order after the last one served.
    RoundRobin,
}

impl AtomicOrder {
    /// Every order, as named in profiles.
    pub const ALL: [AtomicOrder; 5] = [
        AtomicOrder::Post,
        AtomicOrder::Arrival,
        AtomicOrder::Random,
        AtomicOrder::Newest,
        AtomicOrder::RoundRobin,
    ];

    /// Its name in profiles (`round-robin`, …).
    pub fn name(self) -> &'static str {
        match self {
            AtomicOrder::Post => "post",
            AtomicOrder::Arrival => "arrival",
            AtomicOrder::Random => "random",
            AtomicOrder::Newest => "newest",
            AtomicOrder::RoundRobin => "round-robin",
        }
    }
}

/// What the device accepts (the fabric capabilities it declares).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Limits {
    /// Most requests per post ([`dmkit_fabric::Capabilities::max_batch`]).
    pub max_batch: usize,
    /// Largest inline WRITE in bytes (220 on the ConnectX-6 profile).
    pub max_inline: usize,
    /// Largest message in bytes (1 GiB on the shipped profiles).
    pub max_message: usize,
    /// Most scatter/gather entries per request.
    pub max_sge: usize,
    /// Whether masked CAS is offered (mlx5 extended atomics: ConnectX-5 and
    /// later, not ConnectX-3).
    pub masked_cas: bool,
    /// Bytes of on-NIC device memory (Sherman puts its locks there).
    pub device_memory: u64,
}

const CX6: &str = include_str!("../../../configs/sim/cx6-200g.toml");
const CX5: &str = include_str!("../../../configs/sim/cx5-100g.toml");
const CX3: &str = include_str!("../../../configs/sim/cx3-56g.toml");
const CX3_40: &str = include_str!("../../../configs/sim/cx3-40g.toml");

/// Names of the built-in profiles.
pub const BUILTIN: [&str; 4] = ["cx6-200g", "cx5-100g", "cx3-56g", "cx3-40g"];

impl Profile {
    /// Parses a TOML profile.
    pub fn from_toml(text: &str) -> Result<Self, String> {
        let p: Profile = toml::from_str(text).map_err(|e| e.to_string())?;
        p.validate()?;
        Ok(p)
    }

    /// A built-in profile by name (`cx6-200g`, `cx5-100g`, `cx3-56g`, `cx3-40g`).
    pub fn builtin(name: &str) -> Result<Self, String> {
        let text = match name {
            "cx6-200g" => CX6,
            "cx5-100g" => CX5,
            "cx3-56g" => CX3,
            "cx3-40g" => CX3_40,
            _ => {
                return Err(format!(
                    "no built-in profile {name:?}; built in: {}",
                    BUILTIN.join(", ")
                ))
            }
        };
        Self::from_toml(text).map_err(|e| format!("built-in profile {name}: {e}"))
    }

    /// A built-in profile by name, or a TOML file by path.
    pub fn load(name_or_path: &str) -> Result<Self, String> {
        if BUILTIN.contains(&name_or_path) {
            return Self::builtin(name_or_path);
        }
        let text = std::fs::read_to_string(name_or_path).map_err(|e| {
            format!(
                "{name_or_path}: {e} (built-in profiles: {})",
                BUILTIN.join(", ")
            )
        })?;
        Self::from_toml(&text).map_err(|e| format!("{name_or_path}: {e}"))
    }

    /// ConnectX-6 200 Gb, calibrated against SMART's figures.
    pub fn cx6() -> Self {
        Self::builtin("cx6-200g").expect("built-in profile parses")
    }

    /// The same device with its link at `gbps` (e.g. the 100 Gb testbed of
    /// the SMART radix-tree paper).
    pub fn with_link_gbps(mut self, gbps: f64) -> Self {
        self.link.gbps = gbps;
        self.name = format!("{} @ {gbps} Gb", self.name);
        self
    }

    /// Checks every number and combination (`from_toml` does; a profile
    /// changed in code is checked again when a simulation starts).
    pub fn validate(&self) -> Result<(), String> {
        let pos = [
            ("cpu.smt_slowdown", self.cpu.smt_slowdown),
            ("nic.iops", self.nic.iops),
            ("nic.pcie_gbs", self.nic.pcie_gbs),
            ("nic.wqe_cache", self.nic.wqe_cache),
            ("link.gbps", self.link.gbps),
            ("link.mtu", self.link.mtu),
            ("responder.iops", self.responder.iops),
            ("responder.pcie_gbs", self.responder.pcie_gbs),
            ("responder.atomic_mops", self.responder.atomic_mops),
        ];
        for (name, v) in pos {
            if !(v.is_finite() && v > 0.0) {
                return Err(format!("{name} must be a positive number, got {v}"));
            }
        }
        let nonneg = [
            ("cpu.post_ns", self.cpu.post_ns),
            ("cpu.post_wr_ns", self.cpu.post_wr_ns),
            ("cpu.poll_ns", self.cpu.poll_ns),
            ("cpu.cqe_ns", self.cpu.cqe_ns),
            ("cpu.task_ns", self.cpu.task_ns),
            ("cpu.rpc_ns", self.cpu.rpc_ns),
            ("doorbell.lock_ns", self.doorbell.lock_ns),
            ("doorbell.bounce_ns", self.doorbell.bounce_ns),
            ("doorbell.handoff_ns", self.doorbell.handoff_ns),
            ("nic.fetch_ns", self.nic.fetch_ns),
            ("nic.wr_bytes", self.nic.wr_bytes),
            ("nic.max_miss", self.nic.max_miss),
            ("nic.miss_bytes", self.nic.miss_bytes),
            ("nic.deliver_ns", self.nic.deliver_ns),
            ("nic.wr_ns", self.nic.wr_ns),
            ("nic.sge_ns", self.nic.sge_ns),
            ("nic.payload_fetch_ns", self.nic.payload_fetch_ns),
            ("link.header_bytes", self.link.header_bytes),
            ("link.wire_ns", self.link.wire_ns),
            ("responder.dma_read_ns", self.responder.dma_read_ns),
            ("responder.dma_write_ns", self.responder.dma_write_ns),
            ("responder.atomic_ns", self.responder.atomic_ns),
            ("responder.atomic_nic_ns", self.responder.atomic_nic_ns),
            ("responder.mtt_miss_ns", self.responder.mtt_miss_ns),
            ("rpc.request_ns", self.rpc.request_ns),
            ("rpc.byte_ns", self.rpc.byte_ns),
            ("rpc.queue_ns", self.rpc.queue_ns),
        ];
        for (name, v) in nonneg {
            if !(v.is_finite() && v >= 0.0) {
                return Err(format!("{name} must be ≥ 0, got {v}"));
            }
        }
        if !(self.numa.cross_ns.is_finite() && self.numa.cross_ns >= 0.0) {
            return Err(format!(
                "numa.cross_ns must be ≥ 0, got {}",
                self.numa.cross_ns
            ));
        }
        if !(self.numa.cross_bw > 0.0 && self.numa.cross_bw <= 1.0) {
            return Err(format!(
                "numa.cross_bw must be in (0, 1], got {}",
                self.numa.cross_bw
            ));
        }
        if self.nic.max_miss > 1.0 {
            return Err(format!("nic.max_miss {} must be ≤ 1", self.nic.max_miss));
        }
        if self.rpc.cores > 1024 {
            return Err(format!("rpc.cores {} must be at most 1024", self.rpc.cores));
        }
        if self.cpu.cores == 0 || self.cpu.smt == 0 {
            return Err("cpu.cores and cpu.smt must be at least 1".into());
        }
        if self.doorbell.low_latency + self.doorbell.medium_latency == 0 {
            return Err("a device needs at least one doorbell register".into());
        }
        if self.limits.max_batch == 0 || self.limits.max_message == 0 {
            return Err("limits.max_batch and limits.max_message must be at least 1".into());
        }
        if self.nic.payload_fetch_ns > 0.0 && self.nic.processing_units == 0 {
            return Err(format!(
                "nic.payload_fetch_ns ({}) is modelled with processing units only: \
                 set nic.processing_units ≥ 1",
                self.nic.payload_fetch_ns
            ));
        }
        if self.responder.atomic_stalls_access && self.responder.atomic_order != AtomicOrder::Post {
            return Err(format!(
                "responder.atomic_stalls_access is modelled under atomic_order = \"post\" only, \
                 not {:?}",
                self.responder.atomic_order.name()
            ));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn builtin_profiles_parse_and_bad_ones_are_refused() {
        for n in BUILTIN {
            let p = Profile::builtin(n).unwrap();
            assert!(!p.name.is_empty());
        }
        assert!(Profile::builtin("cx9").unwrap_err().contains("built in"));
        let mut text = CX6.replace("iops = 110.0", "iops = -1.0");
        assert!(Profile::from_toml(&text).unwrap_err().contains("nic.iops"));
        text = format!("{CX6}\nbogus = 1\n");
        assert!(Profile::from_toml(&text).is_err());
        // The atomic order: named values only; absent means `post`.
        // (The built-in profiles stall accesses behind atomics, which only
        // `post` models: an arbitrated order needs the stall off.)
        for p in BUILTIN {
            assert!(Profile::builtin(p).unwrap().responder.atomic_stalls_access);
        }
        // Responses take the links' gaps in every built-in profile; absent
        // means the FIFO.
        for p in BUILTIN {
            assert!(Profile::builtin(p).unwrap().link.response_gaps, "{p}");
        }
        let fifo = Profile::from_toml(&CX6.replace("response_gaps = true", "")).unwrap();
        assert!(!fifo.link.response_gaps);
        let stall_off = CX6.replace("atomic_stalls_access = true", "");
        assert!(Profile::from_toml(
            &CX6.replace("atomic_order = \"post\"", "atomic_order = \"random\"")
        )
        .unwrap_err()
        .contains("atomic_stalls_access"));
        let order = |v: &str| {
            Profile::from_toml(&stall_off.replace("atomic_order = \"post\"", v))
                .map(|p| p.responder.atomic_order)
        };
        assert_eq!(
            order("atomic_order = \"round-robin\""),
            Ok(AtomicOrder::RoundRobin)
        );
        assert_eq!(order(""), Ok(AtomicOrder::Post));
        assert!(order("atomic_order = \"fifo\"")
            .unwrap_err()
            .contains("unknown variant"));
        assert!(Profile::load("/nonexistent/profile.toml")
            .unwrap_err()
            .contains("built-in profiles"));
    }
}
