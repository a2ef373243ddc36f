//! The table: creation, the per-worker client, and the four operations plus
//! the online subtable split. Protocols are described in the crate docs.

use std::cell::RefCell;
use std::rc::Rc;
use std::sync::Arc;

use dmkit_fabric::{Fabric, GlobalAddr, NodeId, RemoteRef};
use dmkit_index::{
    ClientStats, Creation, Entries, Home, IndexConfig, IndexError, LeaseConfig, MapClient,
    RemoteMap, Retry, RetryPolicy, Shape,
};
use dmkit_runtime::alloc::BlockAlloc;
use dmkit_runtime::machine::PerMachine;
use dmkit_runtime::{Ctx, Local, LocalLayout, Nanos};
use zerocopy::{FromBytes, IntoBytes};

use crate::hot::{
    owner_of, HotArea, HotLocal, HotOp, HotOutcome, HotParams, HotTrace, MAX_HOT_BLOCK_LOG2,
    MAX_HOT_KEYS,
};
use crate::layout::*;

/// The structure's kind: its roots are `race/NAME`.
pub const KIND: &str = "race";

/// Configuration of a table (structure) and of its clients (caching,
/// memory, retries). With the `cli` feature it is a set of command-line
/// flags (`clap::Args`): the switches and client settings are flags, the
/// structural settings come from the workload ([`IndexConfig::fit`]).
#[derive(Debug, Clone, PartialEq)]
#[cfg_attr(feature = "cli", derive(clap::Args))]
#[cfg_attr(
    feature = "cli",
    command(next_help_heading = "Hash table (--index race)")
)]
pub struct RaceConfig {
    /// Longest key in bytes (stored in the table; all clients share it).
    #[cfg_attr(feature = "cli", arg(skip = RaceConfig::default().max_key))]
    pub max_key: usize,
    /// Longest value in bytes (stored in the table).
    #[cfg_attr(feature = "cli", arg(skip = RaceConfig::default().max_value))]
    pub max_value: usize,
    /// Bucket groups per subtable (each holds 21 slots).
    #[cfg_attr(feature = "cli", arg(skip = RaceConfig::default().groups))]
    pub groups: u64,
    /// Subtables at creation: 2^initial_depth.
    #[cfg_attr(feature = "cli", arg(skip))]
    pub initial_depth: u32,
    /// Most splits a suffix can see: the directory has 2^max_depth entries.
    #[cfg_attr(feature = "cli", arg(skip = RaceConfig::default().max_depth))]
    pub max_depth: u32,
    /// Hash table: client cache of key → slot, entries per thread (a power
    /// of two; 0 disables it; SMART-HT's cache).
    #[cfg_attr(
        feature = "cli",
        arg(long = "cache", id = "race_cache", value_name = "ENTRIES", default_value_t = RaceConfig::default().cache_entries)
    )]
    pub cache_entries: usize,
    /// How long a retired key-value block stays untouched before it is
    /// reused (ns of the worker's clock).
    #[cfg_attr(feature = "cli", arg(skip = RaceConfig::default().grace))]
    pub grace: Nanos,
    /// Bytes a client asks the memory node for at a time for its blocks.
    #[cfg_attr(feature = "cli", arg(skip = RaceConfig::default().chunk_bytes))]
    pub chunk_bytes: u64,
    /// Hash seed (stored in the table).
    #[cfg_attr(feature = "cli", arg(skip = RaceConfig::default().seed))]
    pub seed: u64,
    /// Keys of the hot area (memory-semantics §IV-B; [`crate::hot`]),
    /// fixed at creation and stored in the table; empty: no hot area.
    #[cfg_attr(feature = "cli", arg(skip))]
    pub hot_keys: Vec<Vec<u8>>,
    /// Hash table: hot entries per block, as a power of two.
    #[cfg_attr(
        feature = "cli",
        arg(long = "hot-block-log2", default_value_t = RaceConfig::default().hot_block_log2)
    )]
    pub hot_block_log2: u32,
    /// Hash table: buffered modifications that force a hot block's
    /// write-back (θ).
    #[cfg_attr(
        feature = "cli",
        arg(long = "hot-theta", default_value_t = RaceConfig::default().hot_theta)
    )]
    pub hot_theta: u32,
    /// Hash table: longest a compute machine keeps a hot block, however
    /// busy (in ns; the flag takes a duration, e.g. 50us).
    #[cfg_attr(
        feature = "cli",
        arg(long = "hot-hold", value_name = "DURATION", default_value = "50us", value_parser = dmkit_index::cli::parse_nanos)
    )]
    pub hot_hold: Nanos,
    /// Hash table: versions kept per cold entry (the memory-semantics
    /// study's multi-version entries, §IV-B: an update is one FAA for a
    /// version and one WRITE of its slot); 0: RACE's out-of-place blocks.
    /// Stored in the table.
    #[cfg_attr(
        feature = "cli",
        arg(long = "cold-versions", value_name = "K", default_value_t = RaceConfig::default().cold_versions)
    )]
    pub cold_versions: u32,
    /// How long an operation keeps retrying before it gives up.
    #[cfg_attr(feature = "cli", arg(skip))]
    pub retry: RetryPolicy,
    /// Leases of the table's locks (insert, split, directory and hot-block
    /// locks): how long a client that died blocks one.
    #[cfg_attr(feature = "cli", arg(skip))]
    pub lease: LeaseConfig,
}

impl Default for RaceConfig {
    fn default() -> Self {
        Self {
            max_key: 64,
            max_value: 1024,
            groups: 1024,
            initial_depth: 0,
            max_depth: 16,
            cache_entries: 1 << 16,
            grace: 100_000_000,
            chunk_bytes: 4 << 20,
            seed: 0x005E_ED0F_2ACE,
            hot_keys: Vec::new(),
            hot_block_log2: 3,
            hot_theta: 16,
            hot_hold: 50_000,
            cold_versions: 0,
            retry: RetryPolicy::default(),
            lease: LeaseConfig::default(),
        }
    }
}

/// Bucket groups per subtable when a table is sized for a workload.
const FIT_GROUPS: u64 = 4096;
/// Directory depth a table sized for a workload may reach.
const FIT_MAX_DEPTH: u32 = 18;

impl IndexConfig for RaceConfig {
    /// Limits for the shape's keys and values (at least 32-byte keys: a
    /// block is sized by its own key, so the limit only sizes buffers),
    /// 4,096 groups per subtable, and enough subtables at creation for the
    /// keys at about 50 % load (inserts beyond that split online).
    fn fit(&mut self, shape: &Shape) {
        self.max_key = shape.max_key.max(32);
        self.max_value = shape.max_value.max(8);
        self.groups = FIT_GROUPS;
        let slots = FIT_GROUPS * 21;
        let mut depth = 0;
        while (slots << depth) < shape.keys * 2 && depth < 12 {
            depth += 1;
        }
        self.initial_depth = depth;
        self.max_depth = FIT_MAX_DEPTH;
    }

    fn key_limits(&self) -> (usize, usize) {
        (1, self.max_key)
    }

    fn max_value(&self) -> usize {
        self.max_value
    }

    /// Two blocks per key (updates and inserts of new keys, blocks in
    /// quarantine), the subtables at twice their initial count (splits),
    /// two block chunks per client and 64 MiB of slack.
    fn memory_estimate(&self, shape: &Shape) -> u64 {
        let plain = (BLOCK_HEADER + shape.max_key + shape.max_value).next_multiple_of(64) as u64;
        let block = match self.mv_shape() {
            Some(mv) => (mv.block_bytes(shape.max_key) as u64).max(plain),
            None => plain,
        };
        let sub = Geometry {
            groups: self.groups,
        }
        .bytes();
        2 * shape.keys * block
            + (2 << self.initial_depth) * sub
            + shape.clients as u64 * 2 * self.chunk_bytes
            + (64 << 20)
    }
}

impl RaceConfig {
    /// The shape of the table's multi-version blocks (`None`: off).
    pub fn mv_shape(&self) -> Option<MvShape> {
        (self.cold_versions > 0).then_some(MvShape {
            versions: self.cold_versions,
            value_cap: self.max_value,
        })
    }

    /// The largest block the table's operations read or write.
    fn block_cap(&self) -> usize {
        let plain = block_bytes(self.max_key, self.max_value);
        self.mv_shape()
            .map_or(plain, |mv| mv.block_bytes(self.max_key).max(plain))
    }

    fn validate(&self) -> Result<(), IndexError> {
        let bad = |s: String| Err(IndexError::config(KIND, s));
        if self.cold_versions == 1 || self.cold_versions > MAX_VERSIONS {
            return bad(format!(
                "cold_versions {} must be 0 (off) or in 2..={MAX_VERSIONS}",
                self.cold_versions
            ));
        }
        if self.block_cap() > MAX_BLOCK {
            return bad(format!(
                "a multi-version block of {} versions of max_value {} (max_key {}) exceeds {MAX_BLOCK} B",
                self.cold_versions, self.max_value, self.max_key
            ));
        }
        if self.max_key == 0 || self.max_key > u16::MAX as usize {
            return bad(format!("max_key {} must be in 1..=65535", self.max_key));
        }
        if block_bytes(self.max_key, self.max_value) > MAX_BLOCK {
            return bad(format!(
                "a block of max_key {} + max_value {} + 16 B header exceeds {MAX_BLOCK} B",
                self.max_key, self.max_value
            ));
        }
        if self.groups == 0 || self.groups > 1 << 24 {
            return bad(format!("groups {} must be in 1..=2^24", self.groups));
        }
        if self.max_depth > MAX_DEPTH_LIMIT || self.initial_depth > self.max_depth {
            return bad(format!(
                "need initial_depth {} <= max_depth {} <= {MAX_DEPTH_LIMIT}",
                self.initial_depth, self.max_depth
            ));
        }
        self.lease
            .validate()
            .map_err(|why| IndexError::config(KIND, why))?;
        self.validate_hot()
    }

    fn validate_hot(&self) -> Result<(), IndexError> {
        let bad = |s: String| Err(IndexError::config(KIND, s));
        if self.hot_block_log2 > MAX_HOT_BLOCK_LOG2 {
            return bad(format!(
                "hot_block_log2 {} exceeds {MAX_HOT_BLOCK_LOG2}",
                self.hot_block_log2
            ));
        }
        let bytes = HotArea::entries_bytes(self.hot_block_log2, self.max_value);
        if bytes > SCRATCH {
            return bad(format!(
                "a hot block of 2^{} entries of max_value {} takes {bytes} B; at most {SCRATCH} B (lower hot_block_log2)",
                self.hot_block_log2, self.max_value
            ));
        }
        if self.hot_theta == 0 {
            return bad("hot_theta must be at least 1".into());
        }
        if self.hot_hold.saturating_mul(2) >= self.lease.lease {
            return bad(format!(
                "hot_hold {} ns must be under half the locks' lease ({} ns)",
                self.hot_hold, self.lease.lease
            ));
        }
        if self.hot_keys.len() > MAX_HOT_KEYS {
            return bad(format!(
                "{} hot keys; at most {MAX_HOT_KEYS}",
                self.hot_keys.len()
            ));
        }
        let mut seen = std::collections::HashSet::new();
        for k in &self.hot_keys {
            if k.is_empty() || k.len() > self.max_key {
                return bad(format!(
                    "hot key of {} bytes: keys must be 1..={} bytes",
                    k.len(),
                    self.max_key
                ));
            }
            if !seen.insert(k) {
                return bad(format!("hot key {k:02x?} given twice"));
            }
        }
        Ok(())
    }

    pub(crate) fn hot_params(&self) -> HotParams {
        HotParams {
            theta: self.hot_theta,
            hold: self.hot_hold,
            lease: self.lease.lease,
        }
    }
}

/// Operation counters of the table's own making (beyond the runtime's).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct TableCounters {
    /// Subtable splits this client made.
    pub splits: u64,
    /// Lookups the client cache answered.
    pub cache_hits: u64,
    /// Lookups that went to the buckets.
    pub cache_misses: u64,
    /// Bucket reads that saw a stale directory or a key on the move.
    pub stale_reads: u64,
    /// Blocks read torn (a checksum mismatch) and read again.
    pub torn_reads: u64,
    /// Lookups redone because reading slots and their blocks took longer
    /// than half the grace period.
    pub stalled_reads: u64,
    /// Hot-area operations (all kinds).
    pub hot_ops: u64,
    /// Hot searches answered by the one-round-trip lock-free read.
    pub hot_fast_reads: u64,
    /// Hot blocks taken by remote lock.
    pub hot_acquires: u64,
    /// Hot blocks handed over by a local holder (no remote lock or READ).
    pub hot_handovers: u64,
    /// Hot block write-backs.
    pub hot_flushes: u64,
    /// Expired leases this client broke (of clients that died holding an
    /// insert, split or directory lock).
    pub leases_broken: u64,
    /// Splits this client finished for a splitter that died.
    pub splits_resumed: u64,
    /// Updates of a multi-version table that took the FAA-and-WRITE path.
    pub mv_writes: u64,
    /// Updates of a multi-version table that went out of place instead
    /// (key not among the buckets read at first, a foreign fingerprint
    /// match, a slot whose previous version stayed in flight).
    pub mv_slow: u64,
    /// Re-reads of a slot's commit word while its previous version was
    /// still being written.
    pub mv_waits: u64,
    /// Of `mv_slow`: updates that gave up waiting for their slot's previous
    /// version (its writer slow, or dead after its FAA) or stalled.
    pub mv_gave_up: u64,
}

/// The task-local memory of the table's operations, declared once per
/// table (see [`dmkit_runtime::LocalLayout`]).
#[derive(Debug, Clone, Copy)]
struct Scratch {
    /// The key's two combined buckets, read in one batch.
    comb: [Local; 2],
    /// A directory word (global depth; a fetched entry's neighbour).
    word: Local,
    /// A slot word (the cached slot, re-read with its block).
    slot: Local,
    /// A zero word, the source of unlocking WRITEs.
    zero: Local,
    /// Words written by splits and directory updates.
    e1: Local,
    e2: Local,
    /// A split's record ([`SplitRecord`]).
    rec: Local,
    /// The subtable header, read after the buckets.
    hdr: Local,
    /// The block being inserted or written.
    new: Local,
    /// Candidate blocks fetched in one round trip (`CAND_MAX` of them).
    cand: Local,
    /// Bulk scratch: splits, directory doubling, scans, hot blocks.
    bulk: Local,
}

impl Scratch {
    fn declare(block_cap: usize) -> (Self, LocalLayout) {
        let mut l = LocalLayout::new();
        let s = Scratch {
            comb: [
                l.region("combined bucket 1", COMB_BYTES as usize),
                l.region("combined bucket 2", COMB_BYTES as usize),
            ],
            word: l.region("directory word", 8),
            slot: l.region("slot word", 8),
            zero: l.region("zero word", 8),
            e1: l.region("split word 1", 8),
            e2: l.region("split word 2", 8),
            rec: l.region("split record", 8),
            hdr: l.region("subtable header", std::mem::size_of::<SubtableHeader>()),
            new: l.region("new block", block_cap),
            cand: l.region("candidate blocks", CAND_MAX * block_cap),
            bulk: l.region("bulk", SCRATCH),
        };
        (s, l)
    }
}

/// A table: what every client of it shares. `Send + Sync`; make one
/// [`RaceClient`] per worker with [`RemoteMap::client`].
pub struct RaceTable {
    home: Home,
    cfg: RaceConfig,
    dir: GlobalAddr,
    geo: Geometry,
    scratch: Scratch,
    layout: LocalLayout,
    /// The hot area, if the table has one, and each machine's side of it.
    hot: Option<Arc<HotArea>>,
    hot_local: PerMachine<HotLocal>,
}

/// The root suffix of the hot area's directory (`race/NAME/hot`).
const HOT_ROOT: &str = "hot";

/// The bytes `[from, from+len)` of a fresh subtable's image: its header,
/// then every bucket's header word (insert locks and slots zero).
fn subtable_image(geo: Geometry, depth: u32, suffix: u64, from: u64, len: usize) -> Vec<u8> {
    let mut out = vec![0u8; len];
    let mut put = |at: u64, bytes: &[u8]| {
        let end = at + bytes.len() as u64;
        if at >= from && end <= from + len as u64 {
            let i = (at - from) as usize;
            out[i..i + bytes.len()].copy_from_slice(bytes);
        }
    };
    let head = SubtableHeader {
        magic: SUBTABLE_MAGIC,
        depth: depth as u64,
        suffix,
        split_lock: 0,
        groups: geo.groups,
        split: 0,
        _reserved: [0; 2],
    };
    if from < SUB_LOCKS {
        // The header lies in one piece (pieces are at least 4 KiB).
        put(0, head.as_bytes());
    }
    let header = bucket_header(depth, suffix);
    let first = from.saturating_sub(geo.groups_at()) / BUCKET_BYTES;
    let mut b = first;
    loop {
        let at = geo.groups_at() + b * BUCKET_BYTES;
        if at >= from + len as u64 || b >= 3 * geo.groups {
            break;
        }
        put(at, &header.to_le_bytes());
        b += 1;
    }
    out
}

impl RaceTable {
    fn assemble(home: Home, cfg: RaceConfig, dir: GlobalAddr, hot: Option<HotArea>) -> Self {
        let (scratch, layout) = Scratch::declare(cfg.block_cap());
        Self {
            home,
            geo: Geometry { groups: cfg.groups },
            cfg,
            dir,
            scratch,
            layout,
            hot: hot.map(Arc::new),
            hot_local: PerMachine::default(),
        }
    }

    /// The hot area, if the table has one.
    pub fn hot(&self) -> Option<&HotArea> {
        self.hot.as_deref()
    }

    /// The reference to `addr` (its node's heap key attached).
    #[inline]
    fn remote(&self, addr: GlobalAddr) -> Result<RemoteRef, IndexError> {
        self.home.remote(addr)
    }

    fn block_cap(&self) -> usize {
        self.cfg.block_cap()
    }
}

impl RemoteMap for RaceTable {
    const KIND: &'static str = KIND;
    const ORDERED: bool = false;
    type Config = RaceConfig;
    type Client = RaceClient;

    /// Creates table `name` on the fabric's memory nodes (directory on the
    /// lowest node id, subtables spread over all nodes) and registers it as
    /// a named root, so other processes can [`RemoteMap::open`] it. Nothing
    /// is left behind if it fails.
    fn create(
        fabric: Arc<dyn Fabric>,
        name: &str,
        cfg: RaceConfig,
    ) -> Result<Arc<Self>, IndexError> {
        cfg.validate()?;
        let mut c = Creation::begin(fabric, KIND, name, &[HOT_ROOT])?;
        let geo = Geometry { groups: cfg.groups };
        let entries = 1u64 << cfg.max_depth;
        let dir = c.alloc(
            c.home(),
            DIR_ENTRIES + 8 * entries,
            "allocating the directory",
        )?;
        let nodes = c.nodes().to_vec();
        let mut entry_words = Vec::new();
        for i in 0..1u64 << cfg.initial_depth {
            let node = nodes[i as usize % nodes.len()];
            let sub = c.alloc(node, geo.bytes(), "allocating a subtable")?;
            c.write_image(sub, geo.bytes(), |from, len| {
                subtable_image(geo, cfg.initial_depth, i, from, len)
            })?;
            entry_words.push(dir_entry(cfg.initial_depth, sub).ok_or_else(|| {
                IndexError::config(
                    KIND,
                    format!("subtable address {sub} does not fit a 48-bit pointer"),
                )
            })?);
        }
        c.write(dir.add(DIR_ENTRIES), entry_words.as_bytes())?;
        let header = DirHeader {
            magic: DIR_MAGIC.word(),
            global_depth: cfg.initial_depth as u64,
            lock: 0,
            max_depth: cfg.max_depth as u64,
            groups: cfg.groups,
            seed: cfg.seed,
            nodes: nodes.len() as u64,
            limits: cfg.max_key as u64
                | (cfg.cold_versions as u64) << 16
                | if cfg.cold_versions > 0 {
                    MV_LAYOUT << 24
                } else {
                    0
                }
                | (cfg.max_value as u64) << 32,
        };
        c.write(dir, header.as_bytes())?;
        let hot = if cfg.hot_keys.is_empty() {
            None
        } else {
            let area = HotArea::create(&mut c, &cfg)?;
            c.extra_root(HOT_ROOT, area.dir);
            Some(area)
        };
        let home = c.publish(dir)?;
        Ok(Arc::new(Self::assemble(home, cfg, dir, hot)))
    }
    /// Opens table `name`. Structural settings (geometry, limits, seed) come
    /// from the table; `cfg` supplies the client-side ones (cache, grace,
    /// chunk size, retries).
    fn open(fabric: Arc<dyn Fabric>, name: &str, cfg: RaceConfig) -> Result<Arc<Self>, IndexError> {
        let (home, desc) = dmkit_index::lifecycle::open(
            fabric,
            KIND,
            name,
            DIR_MAGIC,
            std::mem::size_of::<DirHeader>(),
        )?;
        let dir = home.desc();
        let (h, _) = DirHeader::read_from_prefix(&desc).map_err(|_| IndexError::Corrupt {
            addr: dir,
            what: "directory header",
        })?;
        if h.max_depth > MAX_DEPTH_LIMIT as u64 || h.groups == 0 {
            return Err(IndexError::Corrupt {
                addr: dir,
                what: "directory header",
            });
        }
        let mv_layout = (h.limits >> 24 & 0xFF).max(1);
        if h.limits >> 16 & 0xFF != 0 && mv_layout != MV_LAYOUT {
            return Err(IndexError::config(
                KIND,
                format!(
                    "table {name:?} has multi-version blocks of layout {mv_layout}; \
                     this build reads layout {MV_LAYOUT}"
                ),
            ));
        }
        let cfg = RaceConfig {
            max_key: (h.limits & 0xFFFF) as usize,
            cold_versions: (h.limits >> 16 & 0xFF) as u32,
            max_value: (h.limits >> 32) as usize,
            groups: h.groups,
            max_depth: h.max_depth as u32,
            seed: h.seed,
            hot_keys: Vec::new(),
            ..cfg
        };
        cfg.validate()?;
        let hot = match home.extra_root(HOT_ROOT)? {
            None => None,
            Some(hdir) => {
                let area =
                    HotArea::open(&home, hdir, cfg.max_key, cfg.max_value, cfg.hot_params())?;
                Some(area)
            }
        };
        let cfg = RaceConfig {
            hot_keys: hot.as_ref().map(|h| h.keys()).unwrap_or_default(),
            hot_block_log2: hot.as_ref().map_or(cfg.hot_block_log2, |h| h.block_log2()),
            ..cfg
        };
        Ok(Arc::new(Self::assemble(home, cfg, dir, hot)))
    }
    /// Drops this handle's hold on the table; the last holder's drop (or
    /// death) frees all of its memory, whichever process took it, and its
    /// name (see `dmkit_index::lifecycle`). No client of this handle may
    /// use the table afterwards.
    fn destroy(&self) -> Result<(), IndexError> {
        self.home.destroy()
    }
    /// A client for one worker on compute machine `machine` (its tasks
    /// share the client's caches and block allocator; the clients of one
    /// machine share its side of the hot area). `id` distinguishes lock
    /// holders; make it unique among the table's live clients (e.g.
    /// process id × workers + worker).
    fn client_on(self: &Arc<Self>, machine: usize, id: u64) -> RaceClient {
        RaceClient {
            t: self.clone(),
            hot: self.hot.as_ref().map(|area| HotClient {
                area: area.clone(),
                local: self.hot_local.get(machine, || area.local(u32::MAX)),
                owner: owner_of(machine),
            }),
            st: Rc::new(RefCell::new(ClientState {
                dir: vec![0; 1 << self.cfg.max_depth],
                global_depth: 0,
                buf: Vec::new(),
                cache: vec![
                    CacheEntry::default();
                    self.cfg
                        .cache_entries
                        .checked_next_power_of_two()
                        .unwrap_or(0)
                ],
                alloc: BlockAlloc::new(self.cfg.chunk_bytes, self.cfg.grace, self.home.group()),
                owner: dmkit_index::lease::owner_of(id),
                counters: TableCounters::default(),
            })),
        }
    }
    fn local_layout(&self) -> &LocalLayout {
        &self.layout
    }
    fn config(&self) -> &RaceConfig {
        &self.cfg
    }
    fn name(&self) -> &str {
        self.home.name()
    }
}

struct ClientState {
    /// Cached directory entries (0 = not fetched).
    dir: Vec<u64>,
    global_depth: u32,
    /// key → (slot address, slot word) (SMART-HT's client cache).
    cache: Vec<CacheEntry>,
    /// Scratch for decoding blocks.
    buf: Vec<u8>,
    alloc: BlockAlloc,
    /// This client's owner id in lock words.
    owner: u16,
    counters: TableCounters,
}

/// One entry of the client cache: a key, by its two 64-bit hashes (a
/// 128-bit identity; a false match has probability ~n²/2¹²⁹), and the slot
/// that held it with the word it held. Direct-mapped by `h1`: one cache line
/// per lookup, no key copies, no eviction bookkeeping (profiles showed the
/// map-based cache at ~20 % of a YCSB-C run).
#[derive(Debug, Clone, Copy, Default)]
struct CacheEntry {
    h1: u64,
    h2: u64,
    slot: GlobalAddr,
    /// 0 = empty.
    word: u64,
}

/// Blocks fetched in one round trip.
const CAND_MAX: usize = 4;
/// Re-reads a multi-version writer makes of its slot while the slot's
/// previous version is in flight, before it updates out of place instead.
pub const MV_WAIT_POLLS: u32 = 8;
/// Scratch for splits and scans.
const SCRATCH: usize = 16 * 1024;

/// Candidate blocks' outcome.
enum Fetch {
    Absent,
    Torn,
    Found {
        slot_addr: GlobalAddr,
        slot: Slot,
        value: Vec<u8>,
    },
}

/// A short list in a fixed array (the hot paths allocate nothing).
#[derive(Clone, Copy)]
struct Few<T: Copy + Default, const N: usize> {
    items: [T; N],
    len: usize,
}

impl<T: Copy + Default, const N: usize> Few<T, N> {
    fn new() -> Self {
        Self {
            items: [T::default(); N],
            len: 0,
        }
    }
    fn push(&mut self, v: T) {
        self.items[self.len] = v;
        self.len += 1;
    }
    fn as_slice(&self) -> &[T] {
        &self.items[..self.len]
    }
}

/// Slots in two combined buckets.
const COMB_SLOTS: usize = 2 * SLOTS_PER_BUCKET;

/// One split's directory change: suffix·0 → `old_entry`, suffix·1 →
/// `new_entry`, for a subtable of local depth `depth` before the split.
#[derive(Clone, Copy)]
struct Publish {
    depth: u32,
    suffix: u64,
    old_entry: u64,
    new_entry: u64,
}

/// A lock this client holds under a lease (see [`RaceClient::keep`]).
struct Held {
    lock: RemoteRef,
    word: std::cell::Cell<u64>,
    what: &'static str,
}

/// What the two combined buckets showed.
struct Scan {
    /// Every bucket covers the key, at the depth the subtable header showed
    /// after the buckets were read.
    headers_ok: bool,
    /// The subtable's split lock was held (inserters back off).
    splitting: bool,
    /// The split lock's word as read (a lease; 0 = free).
    split_lock: u64,
    cands: Few<(GlobalAddr, Slot), { 2 * COMB_SLOTS }>,
    /// Empty slots per combined bucket, main bucket first.
    empties: [Few<GlobalAddr, COMB_SLOTS>; 2],
    occupied: [usize; 2],
}

impl Scan {
    /// RACE's choice: the less loaded combined bucket, main bucket first.
    fn pick_empty(&self) -> Option<GlobalAddr> {
        let first = if self.occupied[1] < self.occupied[0] {
            1
        } else {
            0
        };
        self.empties[first]
            .as_slice()
            .first()
            .or_else(|| self.empties[1 - first].as_slice().first())
            .copied()
    }
}

/// Located key.
enum Locate {
    /// Slot, its word, the value, and the time just before the slot was read.
    Found(GlobalAddr, Slot, Vec<u8>, Nanos),
    Absent,
}

/// A worker's handle on a table. Clone it into the worker's tasks; not
/// `Send` (one per worker).
#[derive(Clone)]
pub struct RaceClient {
    t: Arc<RaceTable>,
    /// The table's hot area, if it has one, with this machine's side.
    hot: Option<HotClient>,
    st: Rc<RefCell<ClientState>>,
}

/// A client's handle on the hot area: the area, its machine's local
/// blocks, and the machine's lock owner id.
#[derive(Clone)]
struct HotClient {
    area: Arc<HotArea>,
    local: Arc<HotLocal>,
    owner: u16,
}

impl RaceClient {
    /// The table.
    pub fn table(&self) -> &Arc<RaceTable> {
        &self.t
    }

    /// This client's counters.
    pub fn counters(&self) -> TableCounters {
        self.st.borrow().counters
    }

    /// The task-local memory of the table's operations.
    #[inline(always)]
    fn sc(&self) -> &Scratch {
        &self.t.scratch
    }

    fn check_key(&self, ctx: &Ctx, key: &[u8]) -> Result<(), IndexError> {
        if key.is_empty() || key.len() > self.t.cfg.max_key {
            return Err(IndexError::KeyLength {
                len: key.len(),
                min: 1,
                max: self.t.cfg.max_key,
            });
        }
        dmkit_index::check_local(ctx, &self.t.layout)
    }

    /// The hot area and `key`'s rank in it, when the table has a hot area
    /// holding the key.
    fn hot_rank(&self, key: &[u8]) -> Option<(&HotClient, u32)> {
        let h = self.hot.as_ref()?;
        Some((h, h.area.rank(key)?))
    }

    /// Runs `op` on hot rank `rank` and counts what it took.
    async fn hot_op(
        &self,
        ctx: &Ctx,
        h: &HotClient,
        rank: u32,
        op: HotOp<'_>,
    ) -> Result<HotOutcome, IndexError> {
        let mut tr = HotTrace::default();
        let r = h
            .area
            .run(
                ctx,
                &h.local,
                h.owner,
                &self.t.home,
                self.sc().bulk,
                rank,
                op,
                &mut tr,
            )
            .await;
        let mut st = self.st.borrow_mut();
        let c = &mut st.counters;
        c.hot_ops += 1;
        c.hot_fast_reads += tr.fast as u64;
        c.hot_acquires += tr.acquired as u64;
        c.hot_handovers += tr.handed_in as u64;
        c.hot_flushes += tr.flushed as u64;
        c.torn_reads += tr.retries as u64;
        r
    }

    fn check_value(&self, value: &[u8]) -> Result<(), IndexError> {
        if value.len() > self.t.cfg.max_value {
            return Err(IndexError::ValueTooLarge {
                len: value.len(),
                max: self.t.cfg.max_value,
            });
        }
        Ok(())
    }

    fn hash(&self, key: &[u8]) -> KeyHash {
        KeyHash::of(key, self.t.cfg.seed)
    }

    fn cache_get(&self, h: &KeyHash) -> Option<(GlobalAddr, u64)> {
        let st = self.st.borrow();
        if st.cache.is_empty() {
            return None;
        }
        let e = &st.cache[(h.h1 as usize) & (st.cache.len() - 1)];
        (e.h1 == h.h1 && e.h2 == h.h2 && e.word != 0).then_some((e.slot, e.word))
    }

    fn cache_put(&self, h: &KeyHash, slot: GlobalAddr, word: u64) {
        let mut st = self.st.borrow_mut();
        let n = st.cache.len();
        if n > 0 {
            st.cache[(h.h1 as usize) & (n - 1)] = CacheEntry {
                h1: h.h1,
                h2: h.h2,
                slot,
                word,
            };
        }
    }

    fn cache_drop(&self, h: &KeyHash) {
        let mut st = self.st.borrow_mut();
        let n = st.cache.len();
        if n > 0 {
            let e = &mut st.cache[(h.h1 as usize) & (n - 1)];
            if e.h1 == h.h1 && e.h2 == h.h2 {
                e.word = 0;
            }
        }
    }

    /// The subtable the cached directory names for `h`, fetching the entry
    /// when it is not cached.
    async fn subtable(&self, ctx: &Ctx, h: &KeyHash) -> Result<GlobalAddr, IndexError> {
        let cached = {
            let st = self.st.borrow();
            st.dir[(h.h1 & mask(st.global_depth)) as usize]
        };
        if cached != 0 {
            return Ok(unptr48(cached));
        }
        self.refresh(ctx, h).await
    }

    /// Re-reads the global depth and the directory entry for `h`.
    async fn refresh(&self, ctx: &Ctx, h: &KeyHash) -> Result<GlobalAddr, IndexError> {
        let dir = self.t.remote(self.t.dir)?;
        let sc = self.sc();
        let mut g = self.st.borrow().global_depth;
        loop {
            let idx = h.h1 & mask(g);
            ctx.read(dir.add(DIR_GLOBAL_DEPTH), sc.word);
            ctx.read(dir.add(DIR_ENTRIES + 8 * idx), sc.slot);
            ctx.sync().await?;
            let (now_g, e) = (ctx.local_u64(sc.word) as u32, ctx.local_u64(sc.slot));
            if now_g > self.t.cfg.max_depth {
                return Err(IndexError::Corrupt {
                    addr: self.t.dir,
                    what: "directory header",
                });
            }
            if now_g == g && e != 0 {
                let mut st = self.st.borrow_mut();
                st.global_depth = g;
                st.dir[idx as usize] = e;
                return Ok(unptr48(e));
            }
            if now_g == g {
                return Err(IndexError::Corrupt {
                    addr: self.t.dir,
                    what: "directory entry",
                });
            }
            g = now_g;
        }
    }

    /// Whether more than half the grace period passed since `t0`, the time
    /// just before slots were read. Blocks are reused no earlier than `grace`
    /// after their slot stopped naming them, so blocks fetched within
    /// `grace / 2` of reading their slot are the ones the slot named; a
    /// reader that was slower (descheduled, or a worker busy splitting)
    /// cannot trust what it fetched and starts over. (A soak test caught an
    /// insert that read a recycled block 3.5 ms after its slot, with a 1 ms
    /// grace, and inserted a duplicate key.)
    fn stalled(&self, ctx: &Ctx, t0: Nanos) -> bool {
        let late = ctx.now().saturating_sub(t0) >= self.t.cfg.grace / 2;
        if late {
            self.st.borrow_mut().counters.stalled_reads += 1;
            ctx.note_retry();
        }
        late
    }

    /// Decodes the block in task-local `src` through the client's reusable
    /// buffer.
    fn with_block<R>(
        &self,
        ctx: &Ctx,
        src: Local,
        f: impl FnOnce(Option<(&[u8], &[u8])>) -> R,
    ) -> R {
        let mut buf = std::mem::take(&mut self.st.borrow_mut().buf);
        buf.resize(src.len(), 0);
        ctx.get_local(src, &mut buf);
        let r = f(decode_block(&buf));
        self.st.borrow_mut().buf = buf;
        r
    }

    /// Queues READs of the two combined buckets of `h` in `sub`, then (with
    /// `header`) of the subtable header. Queue-pair order makes the header
    /// READ happen after the bucket READs: if its depth still equals the
    /// buckets' depth, no split had finished flipping this subtable's
    /// headers when the slots were read, so no frozen slot had been cleared
    /// (or reused) yet. Only a conclusion of *absence* needs that; a key
    /// found in a slot that is not frozen was there (see [`Self::locate`]).
    fn queue_combs(&self, ctx: &Ctx, sub: RemoteRef, h: &KeyHash, header: bool) {
        let (c1, c2) = h.combs(self.t.geo);
        let sc = self.sc();
        ctx.read(sub.add(self.t.geo.comb_at(c1)), sc.comb[0]);
        ctx.read(sub.add(self.t.geo.comb_at(c2)), sc.comb[1]);
        if header {
            ctx.read(sub, sc.hdr);
        }
    }

    /// Parses the combined buckets read by [`Self::queue_combs`]. Without
    /// the subtable `header`, the bucket headers go unchecked
    /// (`headers_ok`, `splitting` say nothing).
    fn scan(&self, ctx: &Ctx, sub: GlobalAddr, h: &KeyHash, header: bool) -> Scan {
        let (c1, c2) = h.combs(self.t.geo);
        let fp = h.fp();
        let sc = self.sc();
        let head: SubtableHeader = ctx.get_as(sc.hdr);
        let mut s = Scan {
            headers_ok: !header || head.magic == SUBTABLE_MAGIC,
            splitting: header && head.split_lock != 0,
            split_lock: if header { head.split_lock } else { 0 },
            cands: Few::new(),
            empties: [Few::new(), Few::new()],
            occupied: [0, 0],
        };
        for (i, c) in [c1, c2].into_iter().enumerate() {
            let comb: CombinedBucket = ctx.get_as(sc.comb[i]);
            let base = sub.add(self.t.geo.comb_at(c));
            // Main bucket first: combined bucket 2g starts with main bucket
            // 0, 2g+1 ends with main bucket 1.
            let order = if c % 2 == 0 { [0, 1] } else { [1, 0] };
            for k in order {
                let bucket = &comb[k];
                if header
                    && (!header_covers(bucket.header, h.h1) || bucket.header >> 56 != head.depth)
                {
                    s.headers_ok = false;
                }
                for (j, &w) in bucket.slots.iter().enumerate() {
                    let w = Slot(w);
                    let at = k * BUCKET_BYTES as usize + BUCKET_SLOTS + 8 * j;
                    let addr = base.add(at as u64);
                    if w.is_empty() {
                        s.empties[i].push(addr);
                    } else {
                        s.occupied[i] += 1;
                        if w.fp() == fp {
                            s.cands.push((addr, w));
                        }
                    }
                }
            }
        }
        s
    }

    /// Swaps lock word `held` at `lock` for `to` (0: free it) by CAS —
    /// breaking an expired lease, or letting go of one's own lock that may
    /// have been broken; returns whether it swapped.
    async fn break_lock(
        &self,
        ctx: &Ctx,
        lock: RemoteRef,
        held: u64,
        to: u64,
    ) -> Result<bool, IndexError> {
        let swapped = ctx.cas_sync(lock, held, to).await? == held;
        if swapped && dmkit_index::lease::owner_in(held) != self.st.borrow().owner {
            self.st.borrow_mut().counters.leases_broken += 1;
        }
        Ok(swapped)
    }

    /// Keeps the lease of `held` before a step that writes under it: free
    /// while enough of it is left (no round trip), renewed by CAS when not;
    /// [`IndexError::LeaseLost`] when another client broke it (this worker
    /// stalled past its lease: whoever broke it finishes the work).
    async fn keep(&self, ctx: &Ctx, held: &Held) -> Result<(), IndexError> {
        let owner = self.st.borrow().owner;
        match self
            .t
            .cfg
            .lease
            .renew(ctx, held.lock, held.word.get(), owner)
            .await?
        {
            Some(w) => {
                held.word.set(w);
                Ok(())
            }
            None => Err(IndexError::LeaseLost(format!(
                "{} at {} broken by another client",
                held.what, held.lock.addr
            ))),
        }
    }

    /// Where candidate block `i` of a round lands: the block `slot` names,
    /// if its size is within the table's limits.
    fn cand(&self, i: usize, slot: Slot) -> Result<Local, IndexError> {
        let cap = self.t.block_cap();
        if slot.block_bytes() > cap {
            return Err(IndexError::Corrupt {
                addr: slot.block(),
                what: "key-value block (larger than the table's limits)",
            });
        }
        Ok(self.sc().cand.piece(i, cap).prefix(slot.block_bytes()))
    }

    /// Reads the candidates' blocks (≤ CAND_MAX per round trip) and finds `key`.
    async fn fetch(
        &self,
        ctx: &Ctx,
        key: &[u8],
        cands: &[(GlobalAddr, Slot)],
    ) -> Result<Fetch, IndexError> {
        for round in cands.chunks(CAND_MAX) {
            for (i, &(_, slot)) in round.iter().enumerate() {
                ctx.read(self.t.remote(slot.block())?, self.cand(i, slot)?);
            }
            ctx.sync().await?;
            for (i, &(slot_addr, slot)) in round.iter().enumerate() {
                let found = self.with_block(ctx, self.cand(i, slot)?, |b| {
                    b.map(|(k, v)| (k == key).then(|| v.to_vec()))
                });
                match found {
                    None => return Ok(Fetch::Torn),
                    Some(Some(value)) => {
                        return Ok(Fetch::Found {
                            slot_addr,
                            slot,
                            value,
                        })
                    }
                    Some(None) => {}
                }
            }
        }
        Ok(Fetch::Absent)
    }

    /// The full lookup: combined buckets, then candidate blocks. Loops over
    /// stale directories, torn blocks and frozen (moving) slots.
    ///
    /// `optimistic` (searches): the first try reads the two combined buckets
    /// without the subtable header — three READs for a hit, as RACE and
    /// SMART-HT make, instead of four. A key found there, in a slot that is
    /// not frozen, with its block's key and checksum, is the key's value at
    /// the instant that slot was read: a split freezes a slot before it
    /// moves the key, and frozen slots are only cleared after that. Only
    /// *absence* needs the header (a cleared slot must not pass for it), so
    /// a miss or a torn block is retried with it.
    async fn locate(
        &self,
        ctx: &Ctx,
        key: &[u8],
        h: &KeyHash,
        optimistic: bool,
    ) -> Result<Locate, IndexError> {
        let mut retry = Retry::new("lookup", self.t.cfg.retry);
        let mut header = !optimistic;
        let mut stuck = None;
        loop {
            let sub = self.subtable(ctx, h).await?;
            let t0 = ctx.now();
            self.queue_combs(ctx, self.t.remote(sub)?, h, header);
            ctx.sync().await?;
            let scan = self.scan(ctx, sub, h, header);
            if !scan.headers_ok {
                // A stale directory: refreshed, then read again at once;
                // the next stale read backs off.
                self.st.borrow_mut().counters.stale_reads += 1;
                self.unstick(ctx, sub, &mut stuck).await?;
                self.refresh(ctx, h).await?;
                if retry.attempts() > 0 {
                    retry.backoff(ctx).await?;
                } else {
                    retry.again(ctx)?;
                }
                continue;
            }
            let found = self.fetch(ctx, key, scan.cands.as_slice()).await?;
            if self.stalled(ctx, t0) {
                retry.lost(ctx)?;
                continue;
            }
            match found {
                Fetch::Absent | Fetch::Torn if !header => {
                    // Not found without the header: look again with it.
                    header = true;
                    continue;
                }
                Fetch::Absent => return Ok(Locate::Absent),
                Fetch::Torn => {
                    self.st.borrow_mut().counters.torn_reads += 1;
                    retry.again(ctx)?;
                }
                Fetch::Found { slot, .. } if slot.moved() => {
                    // A split is moving the key: wait for the directory.
                    self.st.borrow_mut().counters.stale_reads += 1;
                    retry.backoff(ctx).await?;
                    self.unstick(ctx, sub, &mut stuck).await?;
                    self.refresh(ctx, h).await?;
                }
                Fetch::Found {
                    slot_addr,
                    slot,
                    value,
                } => return Ok(Locate::Found(slot_addr, slot, value, t0)),
            }
        }
    }

    /// A lookup that keeps finding `sub` mid-split (stale headers, frozen
    /// slots) for longer than a lease checks the split lock, and finishes
    /// the split of a splitter whose lease ran out. `since`: when the
    /// lookup first found it so. Nothing is read before a lease has passed,
    /// so lookups that meet a live split cost what they did.
    async fn unstick(
        &self,
        ctx: &Ctx,
        sub: GlobalAddr,
        since: &mut Option<Nanos>,
    ) -> Result<(), IndexError> {
        let lease = self.t.cfg.lease;
        let now = ctx.now();
        let first = *since.get_or_insert(now);
        if now.saturating_sub(first) <= lease.lease {
            return Ok(());
        }
        *since = Some(now);
        let word = self.sc().word;
        ctx.read_sync(self.t.remote(sub)?.add(SUB_SPLIT_LOCK), word)
            .await?;
        let held = ctx.local_u64(word);
        if lease.expired(ctx, held) {
            self.split(ctx, sub).await?;
        }
        Ok(())
    }

    /// Allocates and fills (locally, in the `new` region) the block for
    /// `key`/`value`.
    fn new_block(
        &self,
        ctx: &Ctx,
        key: &[u8],
        value: &[u8],
        prefer: NodeId,
    ) -> Result<(GlobalAddr, u64), IndexError> {
        let mut img = Vec::new();
        match self.t.cfg.mv_shape() {
            Some(mv) => encode_mv_block(mv, key, value, &mut img),
            None => encode_block(key, value, &mut img),
        }
        let units = (img.len() / 64) as u64;
        let addr = {
            let mut st = self.st.borrow_mut();
            st.alloc
                .alloc(
                    self.t.home.fabric().as_ref(),
                    self.t.home.nodes(),
                    prefer,
                    units,
                    ctx.now(),
                )
                .map_err(IndexError::oom("allocating a key-value block"))?
        };
        ctx.put_local(self.sc().new, &img);
        Ok((addr, units))
    }

    /// Publishes the fresh block (`units` × 64 B at `block`, its image in
    /// the `new` region) in an empty slot of `key`'s buckets, unless the
    /// key is present. Round trips: (1) WRITE the block ∥ CAS the insert
    /// lock + READ both combined buckets and the subtable header; (2) READ
    /// the candidate blocks (the duplicate check; rarely needed); (3) CAS
    /// the empty slot ∥ release the lock.
    async fn insert_block(
        &self,
        ctx: &Ctx,
        key: &[u8],
        h: &KeyHash,
        block: GlobalAddr,
        units: u64,
    ) -> Result<bool, IndexError> {
        let new = Slot::new(h.fp(), units, block).ok_or_else(|| {
            IndexError::config(
                KIND,
                format!("block address {block} does not fit a 48-bit pointer"),
            )
        })?;
        assert!(new.block() == block && new.fp() == h.fp());
        let owner = self.st.borrow().owner;
        let sc = *self.sc();
        let mut retry = Retry::new("insert", self.t.cfg.retry);
        let mut written = false;
        loop {
            let sub = self.subtable(ctx, h).await?;
            let sub_r = self.t.remote(sub)?;
            let (c1, _) = h.combs(self.t.geo);
            let lock = sub_r.add(self.t.geo.lock_at(c1));
            // (1) The block, then the lock and what it guards.
            if !written {
                ctx.write(self.t.remote(block)?, sc.new.prefix(units as usize * 64));
                if block.node() != sub.node() {
                    // Different queue pairs: make the block durable first.
                    ctx.sync().await?;
                }
                written = true;
            }
            let t0 = ctx.now();
            let lease = self.t.cfg.lease;
            let mine = lease.word_at(t0, owner);
            let lt = ctx.cas(lock, 0, mine);
            self.queue_combs(ctx, sub_r, h, true);
            ctx.sync().await?;
            let held = ctx.value(lt);
            if held != 0 {
                // Another insert into these buckets holds it. One that died
                // is broken free: an insert lock guards nothing that can be
                // left half-done (the slot CAS is the insert itself).
                if lease.expired(ctx, held) {
                    self.break_lock(ctx, lock, held, 0).await?;
                }
                retry.backoff(ctx).await?;
                continue;
            }
            // The key's insert lock is ours: no other insert of this key
            // can pass this point until we release it.
            let scan = self.scan(ctx, sub, h, true);
            let unlock = |ctx: &Ctx| {
                ctx.set_local_u64(sc.zero, 0);
                ctx.write(lock, sc.zero);
            };
            if scan.splitting || !scan.headers_ok {
                unlock(ctx);
                ctx.sync().await?;
                if !scan.headers_ok {
                    self.st.borrow_mut().counters.stale_reads += 1;
                    self.refresh(ctx, h).await?;
                }
                if scan.splitting && lease.expired(ctx, scan.split_lock) {
                    // The splitter died: finish its split.
                    self.split(ctx, sub).await?;
                }
                retry.backoff(ctx).await?;
                continue;
            }
            // (2) The duplicate check.
            let found = match self.fetch(ctx, key, scan.cands.as_slice()).await {
                Ok(_) if self.stalled(ctx, t0) => {
                    unlock(ctx);
                    ctx.sync().await?;
                    retry.lost(ctx)?;
                    continue;
                }
                Ok(f) => f,
                Err(e) => {
                    unlock(ctx);
                    let _ = ctx.sync().await;
                    return Err(e);
                }
            };
            match found {
                Fetch::Absent => {}
                Fetch::Found { slot, .. } if !slot.moved() => {
                    unlock(ctx);
                    ctx.sync().await?;
                    return Ok(false);
                }
                // A frozen copy of our key under a header that covers it
                // cannot exist; treat it (and torn blocks) as a retry.
                Fetch::Found { .. } | Fetch::Torn => {
                    unlock(ctx);
                    ctx.sync().await?;
                    retry.again(ctx)?;
                    continue;
                }
            }
            let Some(slot_addr) = scan.pick_empty() else {
                unlock(ctx);
                ctx.sync().await?;
                self.split(ctx, sub).await?;
                retry.lost(ctx)?;
                continue;
            };
            if !lease.holds(ctx, mine) {
                // Too little of the lease is left to publish (this worker
                // stalled): let go — by CAS, the lock may be someone
                // else's by now — and start over.
                self.break_lock(ctx, lock, mine, 0).await?;
                retry.lost(ctx)?;
                continue;
            }
            // (3) The slot CAS and the unlock travel in one batch to one
            // node, so the unlock takes effect after the CAS.
            assert!(written, "a slot may name only a block already written");
            assert_eq!(
                slot_addr.node(),
                sub.node(),
                "the slot lies in the key's subtable"
            );
            let t = ctx.cas(self.t.remote(slot_addr)?, 0, new.0);
            unlock(ctx);
            ctx.sync().await?;
            if ctx.value(t) == 0 {
                self.cache_put(h, slot_addr, new.0);
                return Ok(true);
            }
            // Another key took the slot (it shares the bucket, not our lock).
            retry.again(ctx)?;
        }
    }

    /// The FAA-and-WRITE update of a multi-version table (see "Multi-version
    /// cold entries" in the crate doc). Round trips: (1) READ both combined
    /// buckets (or, from the cache, nothing); (2) FAA the counter of the
    /// block the first fitting fingerprint match names ∥ READ that block's
    /// prefix — header, key and commit words — (and the cached slot word);
    /// (3) WRITE slot `version mod K` ∥ WRITE its commit word. Between (2)
    /// and (3) the writer waits, re-reading the slot's commit word, while
    /// the slot's previous version (`version − K`) is still being written.
    /// `Ok(None)`: this path does not apply, and nothing a reader sees has
    /// changed — the key was not among the buckets read (absence needs the
    /// subtable header), a fingerprint match was another key's, the
    /// previous version stayed in flight for [`MV_WAIT_POLLS`] re-reads, or
    /// the writer stalled; the caller updates out of place.
    async fn mv_update(
        &self,
        ctx: &Ctx,
        key: &[u8],
        h: &KeyHash,
        value: &[u8],
        mv: MvShape,
    ) -> Result<Option<bool>, IndexError> {
        let sc = *self.sc();
        let want = mv.block_bytes(key.len());
        let mut retry = Retry::new("update", self.t.cfg.retry);
        let k = mv.versions as u64;
        loop {
            // (1) Which block: the cached slot (checked in round 2), else the
            // first fingerprint match of the right size in the buckets.
            let t0 = ctx.now();
            let cached = self.cache_get(h);
            let (slot_addr, slot) = match cached {
                Some((a, w)) => (a, Slot(w)),
                None => {
                    let sub = self.subtable(ctx, h).await?;
                    self.queue_combs(ctx, self.t.remote(sub)?, h, false);
                    ctx.sync().await?;
                    let scan = self.scan(ctx, sub, h, false);
                    let first = scan
                        .cands
                        .as_slice()
                        .iter()
                        .find(|(_, s)| s.block_bytes() == want)
                        .copied();
                    // Without the subtable header, only a slot that is not
                    // frozen shows the key present (see `locate`): a frozen
                    // one may be a split's leftover of a key since deleted
                    // from its new subtable.
                    let first = first.filter(|(_, s)| !s.moved());
                    match first {
                        Some(c) if scan.headers_ok => c,
                        _ => return Ok(None),
                    }
                }
            };
            if slot.block_bytes() != want || slot.moved() {
                self.cache_drop(h);
                return Ok(None);
            }
            // (2) A version, then the block's prefix as it is after that FAA
            // (queue-pair order).
            let block = self.t.remote(slot.block())?;
            let prefix = self.cand(0, slot)?.prefix(mv.prefix_bytes(key.len()));
            if cached.is_some() {
                ctx.read(self.t.remote(slot_addr)?, sc.slot);
            }
            let faa = ctx.faa(block.add(MV_COUNTER), 1);
            // One round trip, two posts: see the slot's commit word below.
            ctx.post();
            ctx.read(block, prefix);
            ctx.sync().await?;
            let v = ctx.value(faa);
            let stale = cached.is_some() && ctx.local_u64(sc.slot) != slot.0;
            let s = (v % k) as u32;
            // The commit word of our slot, if the block is the key's. The
            // prefix read is sized for our key: a block whose lengths word
            // differs from ours (another key's — a fingerprint match — or
            // garbage) is not ours, whatever the rest of it says.
            let ours = self.with_raw(ctx, prefix, |b| {
                let (head, _) = MvBlockHeader::read_from_prefix(b).ok()?;
                if head.lens != mv.lens(key.len()) {
                    return Some(None);
                }
                mv_block_head(b).map(|(_, k)| (k == key).then(|| mv_commit(b, mv, key.len(), s)))
            });
            let mut commit = match ours {
                Some(Some(c)) if !stale => c,
                // Another key's block (a fingerprint match, or a cached slot
                // since reused): version `v` of that block stays unwritten,
                // so its next writer of that slot goes out of place.
                Some(_) => {
                    self.cache_drop(h);
                    return Ok(None);
                }
                // A header that fails its checksum: the block was recycled.
                None => {
                    self.cache_drop(h);
                    self.st.borrow_mut().counters.torn_reads += 1;
                    retry.again(ctx)?;
                    continue;
                }
            };
            // Wait for the slot's previous version, `v - K`, to have landed
            // (its commit word): slots are written in version order, one
            // writer at a time.
            let commit_at = mv.commit_at(key.len(), s) as u64;
            let mut polls = 0;
            loop {
                if commit + k == v {
                    break;
                }
                if commit + k > v {
                    // A version at or past ours committed in our slot: the
                    // block is not the one our FAA counted on (recycled).
                    self.cache_drop(h);
                    return Ok(None);
                }
                polls += 1;
                if polls > MV_WAIT_POLLS || self.stalled(ctx, t0) {
                    self.st.borrow_mut().counters.mv_gave_up += 1;
                    return Ok(None);
                }
                self.st.borrow_mut().counters.mv_waits += 1;
                ctx.backoff().await;
                ctx.read(block.add(commit_at), sc.word);
                ctx.sync().await?;
                commit = ctx.local_u64(sc.word);
            }
            // (3) The slot, then its commit word, within the stall bound of
            // reading the slot word (the block cannot have been reused yet;
            // see `stalled`). Queue-pair order lands the commit word after
            // every word of the slot (whatever the backend's placement
            // inside one WRITE).
            if self.stalled(ctx, t0) {
                self.st.borrow_mut().counters.mv_gave_up += 1;
                return Ok(None);
            }
            let mut img = std::mem::take(&mut self.st.borrow_mut().buf);
            encode_mv_slot(mv, v, value, &mut img);
            let len = img.len();
            img.extend_from_slice(&v.to_le_bytes());
            ctx.put_local(sc.new, &img);
            self.st.borrow_mut().buf = img;
            let at = mv.slot_at(key.len(), s) as u64;
            ctx.write(block.add(at), sc.new.prefix(len));
            // Its own post (doorbell): a post's first request comes with the
            // doorbell's MMIO write, the others are fetched by DMA one by one
            // at a per-request cost that batching does not shrink (CLUSTER'21
            // §III-A, Fig. 4); a second post costs the CPU less.
            ctx.post();
            ctx.write(block.add(commit_at), sc.new.slice(len, MV_COMMIT));
            ctx.sync().await?;
            if cached.is_none() {
                self.cache_put(h, slot_addr, slot.0);
            }
            self.st.borrow_mut().counters.mv_writes += 1;
            return Ok(Some(true));
        }
    }

    /// Versions taken so far on `key`'s multi-version block (its FAA
    /// counter; `K` for a block no update has touched). `None` if the key
    /// is absent, in the hot area, or its block is not multi-version. For
    /// tests and tools: it shows which path updates took.
    pub async fn versions_taken(&self, ctx: &Ctx, key: &[u8]) -> Result<Option<u64>, IndexError> {
        self.check_key(ctx, key)?;
        let h = self.hash(key);
        let Locate::Found(_, slot, _, _) = self.locate(ctx, key, &h, false).await? else {
            return Ok(None);
        };
        let cand = self.cand(0, slot)?;
        ctx.read(self.t.remote(slot.block())?, cand);
        ctx.sync().await?;
        Ok(self.with_raw(ctx, cand, |b| {
            mv_block_head(b)?;
            MvBlockHeader::read_from_prefix(b)
                .ok()
                .map(|(h, _)| h.counter)
        }))
    }

    /// Copies task-local `src` through the client's reusable buffer and
    /// hands the bytes to `f`.
    fn with_raw<R>(&self, ctx: &Ctx, src: Local, f: impl FnOnce(&[u8]) -> R) -> R {
        let mut buf = std::mem::take(&mut self.st.borrow_mut().buf);
        buf.resize(src.len(), 0);
        ctx.get_local(src, &mut buf);
        let r = f(&buf);
        self.st.borrow_mut().buf = buf;
        r
    }

    /// CASes the key's slot to `new` (a fresh block) or to empty.
    async fn replace(
        &self,
        ctx: &Ctx,
        key: &[u8],
        h: &KeyHash,
        new: Option<(GlobalAddr, Slot)>,
    ) -> Result<bool, IndexError> {
        let sc = *self.sc();
        let mut retry = Retry::new(
            if new.is_some() { "update" } else { "delete" },
            self.t.cfg.retry,
        );
        let mut written = false;
        loop {
            // The slot and the word it held when read, and when that was.
            // A cached word is re-read with its block first: a slot word can
            // recur for another key (same fingerprint and length, recycled
            // block), and a CAS on a stale word would then hit that key.
            let cached = match self.cache_get(h) {
                Some((a, w)) => {
                    let t0 = ctx.now();
                    let slot = Slot(w);
                    let cand = self.cand(0, slot)?;
                    ctx.read(self.t.remote(a)?, sc.slot);
                    ctx.read(self.t.remote(slot.block())?, cand);
                    ctx.sync().await?;
                    let same = ctx.local_u64(sc.slot) == w
                        && self.with_block(ctx, cand, |b| b.is_some_and(|(k, _)| k == key));
                    if same {
                        self.st.borrow_mut().counters.cache_hits += 1;
                        Some((a, w, t0))
                    } else {
                        self.cache_drop(h);
                        None
                    }
                }
                None => None,
            };
            let (slot_addr, expected, t0) = match cached {
                Some(c) => c,
                None => {
                    self.st.borrow_mut().counters.cache_misses += 1;
                    match self.locate(ctx, key, h, false).await? {
                        Locate::Absent => return Ok(false),
                        Locate::Found(a, s, _, t0) => (a, s.0, t0),
                    }
                }
            };
            let desired = new.map_or(0, |(_, s)| s.0);
            if let (Some((block, s)), false) = (new, written) {
                ctx.write(self.t.remote(block)?, sc.new.prefix(s.block_bytes()));
                if block.node() != slot_addr.node() {
                    ctx.sync().await?;
                }
                written = true;
            }
            // The word must still be the key's when the CAS lands: within the
            // stall bound of reading it (see `stalled`).
            if self.stalled(ctx, t0) {
                retry.lost(ctx)?;
                continue;
            }
            assert!(
                written || new.is_none(),
                "a slot may name only a written block"
            );
            // The block WRITE (same node) goes out in the CAS's batch, ahead of it.
            let old = ctx
                .backoff_cas(self.t.remote(slot_addr)?, expected, desired)
                .await?;
            if old == expected {
                let s = Slot(old);
                {
                    let mut st = self.st.borrow_mut();
                    let now = ctx.now();
                    st.alloc.retire(s.block(), s.units(), now);
                }
                if desired == 0 {
                    self.cache_drop(h);
                } else {
                    self.cache_put(h, slot_addr, desired);
                }
                return Ok(true);
            }
            // Lost the race (backoff_cas has backed off): look again.
            self.cache_drop(h);
            retry.lost(ctx)?;
        }
    }

    /// Splits subtable `sub` (when no other client is splitting it):
    /// freeze the keys that move, copy them to the new subtable, flip the
    /// old buckets' headers, publish in the directory, release. A split
    /// lock whose lease expired is broken, and the dead splitter's split
    /// finished (its record in the subtable's header says how far it got).
    async fn split(&self, ctx: &Ctx, sub: GlobalAddr) -> Result<(), IndexError> {
        let sub_r = self.t.remote(sub)?;
        let (owner, lease) = (self.st.borrow().owner, self.t.cfg.lease);
        let lock = sub_r.add(SUB_SPLIT_LOCK);
        let mine = lease.word(ctx, owner);
        let held = ctx.cas_sync(lock, 0, mine).await?;
        if held != 0
            && !(lease.expired(ctx, held) && self.break_lock(ctx, lock, held, mine).await?)
        {
            // Someone else splits it; let them finish.
            ctx.backoff().await;
            return Ok(());
        }
        let held = Held {
            lock,
            word: mine.into(),
            what: "a subtable's split lock",
        };
        let r = self.split_locked(ctx, sub_r, &held).await;
        if let Err(IndexError::LeaseLost(_)) = r {
            // The lock is another client's now, and so is the split.
            return Ok(());
        }
        let zero = self.sc().zero;
        ctx.set_local_u64(zero, 0);
        ctx.write(lock, zero);
        let unlocked = ctx.sync().await;
        r?;
        unlocked?;
        self.st.borrow_mut().counters.splits += 1;
        Ok(())
    }

    /// The split proper, under the subtable's split lock (steps 1–7 of the
    /// crate docs): a fresh split, or the rest of one whose splitter died.
    async fn split_locked(
        &self,
        ctx: &Ctx,
        sub_r: RemoteRef,
        held: &Held,
    ) -> Result<(), IndexError> {
        let sc = *self.sc();
        let sub = sub_r.addr;
        ctx.read_sync(sub_r, sc.hdr).await?;
        let head: SubtableHeader = ctx.get_as(sc.hdr);
        let corrupt = || IndexError::Corrupt {
            addr: sub,
            what: "subtable header",
        };
        if head.magic != SUBTABLE_MAGIC || head.depth > MAX_DEPTH_LIMIT as u64 {
            return Err(corrupt());
        }
        if head.split != 0 {
            let rec = SplitRecord(head.split);
            let phase = rec.phase().ok_or_else(corrupt)?;
            self.st.borrow_mut().counters.splits_resumed += 1;
            return self
                .resume_split(ctx, sub_r, head.suffix, rec, phase, held)
                .await;
        }
        let (depth, suffix) = (head.depth as u32, head.suffix);
        if depth >= self.t.cfg.max_depth {
            return Err(IndexError::Full {
                kind: KIND,
                why: format!(
                    "subtable with suffix {suffix:#x} is at the maximum depth {} and its buckets for this key are full",
                    self.t.cfg.max_depth
                ),
            });
        }
        let suffix2 = suffix | 1 << depth;
        // 1. The new subtable, fully initialised before anyone can see it.
        let new = self.alloc_subtable(suffix2)?;
        let Some(new_entry) = dir_entry(depth + 1, new) else {
            let _ = self.t.home.fabric().free_chunk(new);
            return Err(IndexError::config(
                KIND,
                format!("subtable address {new} does not fit a 48-bit pointer"),
            ));
        };
        let new_r = self.t.remote(new)?;
        let geo = self.t.geo;
        let mut at = 0;
        while at < geo.bytes() {
            let n = (geo.bytes() - at).min(SCRATCH as u64) as usize;
            ctx.put_local(sc.bulk, &subtable_image(geo, depth + 1, suffix2, at, n));
            ctx.write_sync(new_r.add(at), sc.bulk.prefix(n)).await?;
            at += n as u64;
        }
        // The record goes out ahead of step 2's first READ (queue-pair
        // order): whoever finds this split's splitter dead finishes it.
        self.queue_record(ctx, sub_r, SplitRecord::new(new_entry, SplitPhase::Copying));
        self.copy_and_publish(ctx, sub_r, (suffix, depth), new_entry, false, held)
            .await
    }

    /// Queues a WRITE of the split record `rec` into `sub`'s header.
    fn queue_record(&self, ctx: &Ctx, sub_r: RemoteRef, rec: SplitRecord) {
        let w = self.sc().rec;
        ctx.set_local_u64(w, rec.0);
        ctx.write(sub_r.add(SUB_SPLIT), w);
    }

    /// Split steps 2–7 into the initialised, unpublished subtable of
    /// `new_entry` (`resumed`: some of them may have been done by a
    /// splitter that died — all of them may be redone, as nobody can reach
    /// the new subtable before step 6).
    async fn copy_and_publish(
        &self,
        ctx: &Ctx,
        sub_r: RemoteRef,
        (suffix, depth): (u64, u32),
        new_entry: u64,
        resumed: bool,
        held: &Held,
    ) -> Result<(), IndexError> {
        let (geo, sc) = (self.t.geo, *self.sc());
        let new_r = self.t.remote(unptr48(new_entry))?;
        // 2. Wait out inserters that took a lock before the split lock was set;
        //    later ones see the split lock and back off without writing.
        self.drain_insert_locks(ctx, sub_r).await?;
        // 3. Freeze the slots whose keys move, group by group.
        let moved = self.freeze_movers(ctx, sub_r, depth, resumed).await?;
        // 4. Copy the frozen keys to the same positions in the new subtable.
        for piece in moved.chunks(SCRATCH / 8) {
            for (i, &(off, w)) in piece.iter().enumerate() {
                // The new subtable gets the key's word as it was frozen,
                // without the M bit.
                assert!(!Slot(w).is_empty() && !Slot(w).moved());
                let word = sc.bulk.word(8 * i);
                ctx.set_local_u64(word, w);
                ctx.write(new_r.add(off), word);
            }
            ctx.sync().await?;
        }
        // 5. Old buckets now cover one more suffix bit; the record says the
        //    copy is done (same queue pair: it lands after the copies' sync
        //    and the flips).
        ctx.set_local_u64(sc.e1, bucket_header(depth + 1, suffix));
        ctx.set_local_u64(sc.e2, (depth + 1) as u64);
        ctx.write(sub_r.add(SUB_DEPTH), sc.e2);
        for b in 0..3 * geo.groups {
            ctx.write(sub_r.add(geo.groups_at() + b * BUCKET_BYTES), sc.e1);
            if b % 128 == 127 {
                ctx.sync().await?;
            }
        }
        self.queue_record(
            ctx,
            sub_r,
            SplitRecord::new(new_entry, SplitPhase::Publishing),
        );
        ctx.sync().await?;
        // 6. Publish.
        let old_entry =
            dir_entry(depth + 1, sub_r.addr).expect("an existing subtable's address fits");
        let p = Publish {
            depth,
            suffix,
            old_entry,
            new_entry,
        };
        self.publish(ctx, p, Some(held), false).await?;
        // 7. Clear the frozen originals.
        self.clear_frozen(ctx, sub_r, new_entry, &moved, held).await
    }

    /// The rest of a split whose splitter died, from the phase its record
    /// names (see [`SplitPhase`] for what each may redo).
    async fn resume_split(
        &self,
        ctx: &Ctx,
        sub_r: RemoteRef,
        suffix: u64,
        rec: SplitRecord,
        phase: SplitPhase,
        held: &Held,
    ) -> Result<(), IndexError> {
        let (depth, new_entry) = (rec.depth(), rec.new_entry());
        if phase == SplitPhase::Copying {
            return self
                .copy_and_publish(ctx, sub_r, (suffix, depth), new_entry, true, held)
                .await;
        }
        let moved = self.frozen_slots(ctx, sub_r).await?;
        if phase == SplitPhase::Publishing {
            // Some entries may name the new subtable already, and it may
            // have changed (even split) since: only entries that still name
            // the old subtable are set.
            let old_entry =
                dir_entry(depth + 1, sub_r.addr).expect("an existing subtable's address fits");
            let p = Publish {
                depth,
                suffix,
                old_entry,
                new_entry,
            };
            self.publish(ctx, p, Some(held), true).await?;
        }
        self.clear_frozen(ctx, sub_r, new_entry, &moved, held).await
    }

    /// Split step 7: clears the frozen originals (`moved`) of the split
    /// into `new_entry`, then queues the clearing of the record (the
    /// caller's unlock posts it). Readers that read the originals before
    /// the flip fail their header check (see `queue_combs`) and retry.
    async fn clear_frozen(
        &self,
        ctx: &Ctx,
        sub_r: RemoteRef,
        new_entry: u64,
        moved: &[(u64, u64)],
        held: &Held,
    ) -> Result<(), IndexError> {
        let zero = self.sc().zero;
        ctx.set_local_u64(zero, 0);
        self.queue_record(
            ctx,
            sub_r,
            SplitRecord::new(new_entry, SplitPhase::Clearing),
        );
        for piece in moved.chunks(128) {
            // A slot cleared after the split lock passed on could be a
            // fresh insert's.
            self.keep(ctx, held).await?;
            for &(off, _) in piece {
                ctx.write(sub_r.add(off), zero);
            }
            ctx.sync().await?;
        }
        // The record's clearing rides in the unlock's batch (see `split`).
        ctx.write(sub_r.add(SUB_SPLIT), zero);
        Ok(())
    }

    /// A new subtable's chunk, on the node the suffix names if it has room.
    fn alloc_subtable(&self, suffix: u64) -> Result<GlobalAddr, IndexError> {
        let nodes = self.t.home.nodes();
        let first = (suffix as usize) % nodes.len();
        let mut err = None;
        for i in 0..nodes.len() {
            let node = nodes[(first + i) % nodes.len()];
            match self.t.home.fabric().alloc_group_chunk(
                node,
                self.t.geo.bytes(),
                &self.t.home.group(),
            ) {
                Ok(c) => return Ok(c.addr),
                Err(e) => err = Some(e),
            }
        }
        Err(IndexError::OutOfMemory {
            what: "splitting a subtable",
            source: err.expect("a node was tried"),
        })
    }

    /// Split step 2: reads the subtable's insert locks until each was seen
    /// free once.
    async fn drain_insert_locks(&self, ctx: &Ctx, sub_r: RemoteRef) -> Result<(), IndexError> {
        let (geo, bulk) = (self.t.geo, self.sc().bulk);
        let combs = geo.combs() as usize;
        let mut clear = vec![false; combs];
        let per = SCRATCH / 8;
        let mut retry = Retry::new("split", self.t.cfg.retry);
        while clear.iter().any(|c| !c) {
            for start in (0..combs).step_by(per) {
                let n = per.min(combs - start);
                if clear[start..start + n].iter().all(|&c| c) {
                    continue;
                }
                ctx.read_sync(sub_r.add(geo.lock_at(start as u64)), bulk.prefix(n * 8))
                    .await?;
                let mut dead = Vec::new();
                for i in 0..n {
                    let w = ctx.local_u64(bulk.word(8 * i));
                    if w == 0 {
                        clear[start + i] = true;
                    } else if self.t.cfg.lease.expired(ctx, w) {
                        dead.push((start + i, w));
                    }
                }
                // Inserters that died holding their lock: broken free (an
                // insert lock guards nothing left half-done).
                for (c, w) in dead {
                    let lock = sub_r.add(geo.lock_at(c as u64));
                    if self.break_lock(ctx, lock, w, 0).await? {
                        clear[c] = true;
                    }
                }
            }
            if clear.iter().any(|c| !c) {
                retry.backoff(ctx).await?;
            }
        }
        Ok(())
    }

    /// Split step 3: freezes every slot whose key has bit `depth` of its
    /// hash set; returns their offsets in the subtable and their words as
    /// they were when frozen (without the M bit). `resumed`: a splitter
    /// that died froze some already (only a split freezes slots, so every
    /// frozen slot is one of this split's movers).
    async fn freeze_movers(
        &self,
        ctx: &Ctx,
        sub_r: RemoteRef,
        depth: u32,
        resumed: bool,
    ) -> Result<Vec<(u64, u64)>, IndexError> {
        let (geo, bulk) = (self.t.geo, self.sc().bulk);
        let head = if self.t.cfg.cold_versions > 0 {
            MV_HEADER
        } else {
            BLOCK_HEADER
        };
        let prefix = (head + self.t.cfg.max_key).next_multiple_of(8);
        let half = SCRATCH / 2;
        let (groups_at, keys_at) = (bulk.prefix(half), bulk.skip(half));
        let per_piece = (half as u64 / GROUP_BYTES).max(1);
        let mut moved: Vec<(u64, u64)> = Vec::new();
        let mut g0 = 0;
        while g0 < geo.groups {
            let ng = per_piece.min(geo.groups - g0);
            let piece_at = geo.groups_at() + g0 * GROUP_BYTES;
            let piece = groups_at.prefix((ng * GROUP_BYTES) as usize);
            ctx.read_sync(sub_r.add(piece_at), piece).await?;
            let mut live: Vec<(u64, Slot)> = Vec::new();
            for b in 0..ng * 3 {
                let bucket: Bucket = ctx.get_as(piece.piece(b as usize, BUCKET_BYTES as usize));
                for (j, &w) in bucket.slots.iter().enumerate() {
                    let s = Slot(w);
                    let off = piece_at + b * BUCKET_BYTES + BUCKET_SLOTS as u64 + 8 * j as u64;
                    if !s.is_empty() && !s.moved() {
                        live.push((off, s));
                    } else if resumed && s.moved() {
                        moved.push((off, s.thawed().0));
                    }
                }
            }
            let per_round = (half / prefix).clamp(1, 64);
            for round in live.chunks(per_round) {
                let key_of = |i: usize, s: Slot| {
                    keys_at.piece(i, prefix).prefix(prefix.min(s.block_bytes()))
                };
                for (i, &(_, s)) in round.iter().enumerate() {
                    ctx.read(self.t.remote(s.block())?, key_of(i, s));
                }
                ctx.sync().await?;
                let mut to_freeze = Vec::new();
                for (i, &(off, s)) in round.iter().enumerate() {
                    let b = ctx.local_vec(key_of(i, s));
                    let key = block_key(&b).ok_or(IndexError::Corrupt {
                        addr: s.block(),
                        what: "key-value block",
                    })?;
                    if self.hash(key).h1 & (1 << depth) != 0 {
                        to_freeze.push((off, s));
                    }
                }
                // Freeze; a slot that changed meanwhile was updated (same
                // key: freeze its new value) or deleted (nothing to move).
                while !to_freeze.is_empty() {
                    let ts: Vec<_> = to_freeze
                        .iter()
                        .map(|&(off, s)| ctx.cas(sub_r.add(off), s.0, s.frozen().0))
                        .collect();
                    ctx.sync().await?;
                    let mut again = Vec::new();
                    for (&(off, s), t) in to_freeze.iter().zip(ts) {
                        let old = Slot(ctx.value(t));
                        if old == s {
                            moved.push((off, s.0));
                        } else if !old.is_empty() && !old.moved() {
                            again.push((off, old));
                        }
                    }
                    to_freeze = again;
                }
            }
            g0 += ng;
        }
        Ok(moved)
    }

    /// The frozen slots of `sub` (offset, word without the M bit): the
    /// movers of a split whose splitter died after freezing them.
    async fn frozen_slots(
        &self,
        ctx: &Ctx,
        sub_r: RemoteRef,
    ) -> Result<Vec<(u64, u64)>, IndexError> {
        let (geo, bulk) = (self.t.geo, self.sc().bulk);
        let per_piece = (SCRATCH as u64 / GROUP_BYTES).max(1);
        let mut moved = Vec::new();
        let mut g0 = 0;
        while g0 < geo.groups {
            let ng = per_piece.min(geo.groups - g0);
            let piece_at = geo.groups_at() + g0 * GROUP_BYTES;
            let piece = bulk.prefix((ng * GROUP_BYTES) as usize);
            ctx.read_sync(sub_r.add(piece_at), piece).await?;
            for b in 0..ng * 3 {
                let bucket: Bucket = ctx.get_as(piece.piece(b as usize, BUCKET_BYTES as usize));
                for (j, &w) in bucket.slots.iter().enumerate() {
                    if Slot(w).moved() {
                        let off = piece_at + b * BUCKET_BYTES + BUCKET_SLOTS as u64 + 8 * j as u64;
                        moved.push((off, Slot(w).thawed().0));
                    }
                }
            }
            g0 += ng;
        }
        Ok(moved)
    }

    /// Points the directory's entries of suffix·0 at the old subtable and
    /// suffix·1 at the new one, doubling the directory when needed, under
    /// the directory lock (a lease: a dead holder's lock is broken, and
    /// what it left is whole — entries are single WRITEs, the doubling
    /// copies before it raises the depth, so redoing either is safe).
    ///
    /// `careful` (resuming a dead splitter's publish): only entries that
    /// still name the old subtable are set — others may name the new one
    /// already, or a subtable split from it since.
    async fn publish(
        &self,
        ctx: &Ctx,
        p: Publish,
        split: Option<&Held>,
        careful: bool,
    ) -> Result<(), IndexError> {
        let dir = self.t.remote(self.t.dir)?;
        let lock = dir.add(DIR_LOCK);
        let (owner, lease) = (self.st.borrow().owner, self.t.cfg.lease);
        let mut retry = Retry::new("split", self.t.cfg.retry);
        let mine = loop {
            let mine = lease.word(ctx, owner);
            let held = ctx.cas_sync(lock, 0, mine).await?;
            if held == 0
                || (lease.expired(ctx, held) && self.break_lock(ctx, lock, held, mine).await?)
            {
                break mine;
            }
            retry.backoff(ctx).await?;
        };
        let dir_held = Held {
            lock,
            word: mine.into(),
            what: "the directory lock",
        };
        let r = self
            .publish_locked(ctx, p, [split, Some(&dir_held)], careful)
            .await;
        if let Err(IndexError::LeaseLost(_)) = r {
            if dir_held.word.get() != mine || ctx.cas_sync(lock, mine, 0).await? != mine {
                // Not ours to release any more (or released by CAS now).
            }
            return r;
        }
        let zero = self.sc().zero;
        ctx.set_local_u64(zero, 0);
        ctx.write(lock, zero);
        let unlocked = ctx.sync().await;
        r?;
        Ok(unlocked?)
    }

    async fn publish_locked(
        &self,
        ctx: &Ctx,
        p: Publish,
        held: [Option<&Held>; 2],
        careful: bool,
    ) -> Result<(), IndexError> {
        let Publish {
            depth,
            suffix,
            old_entry,
            new_entry,
        } = p;
        let dir = self.t.remote(self.t.dir)?;
        let sc = *self.sc();
        let keep = async |ctx| {
            for h in held.into_iter().flatten() {
                self.keep(ctx, h).await?;
            }
            Ok::<(), IndexError>(())
        };
        keep(ctx).await?;
        ctx.read_sync(dir.add(DIR_GLOBAL_DEPTH), sc.word).await?;
        let mut g = ctx.local_u64(sc.word) as u32;
        if depth > g || g > self.t.cfg.max_depth {
            return Err(IndexError::Corrupt {
                addr: dir.addr,
                what: "directory (depth above global depth)",
            });
        }
        if depth == g {
            // Double: the upper half copies the lower, then the depth grows.
            let n = 1usize << g;
            let per = SCRATCH / 8;
            for start in (0..n).step_by(per) {
                let k = per.min(n - start);
                let entries = sc.bulk.prefix(8 * k);
                ctx.read_sync(dir.add(DIR_ENTRIES + 8 * start as u64), entries)
                    .await?;
                keep(ctx).await?;
                ctx.write_sync(dir.add(DIR_ENTRIES + 8 * (n + start) as u64), entries)
                    .await?;
            }
            g += 1;
            keep(ctx).await?;
            ctx.set_local_u64(sc.word, g as u64);
            ctx.write_sync(dir.add(DIR_GLOBAL_DEPTH), sc.word).await?;
        }
        assert!(depth < g, "the split's suffix bit is within the directory");
        let step = 1u64 << (depth + 1);
        let suffix2 = suffix | 1 << depth;
        // Careful: which entries still name the old subtable.
        let stale = if careful {
            let old_sub = unptr48(old_entry);
            let n = 1usize << g;
            let per = SCRATCH / 8;
            let mut stale = std::collections::HashSet::new();
            for start in (0..n).step_by(per) {
                let k = per.min(n - start);
                ctx.read_sync(
                    dir.add(DIR_ENTRIES + 8 * start as u64),
                    sc.bulk.prefix(8 * k),
                )
                .await?;
                for j in 0..k {
                    if unptr48(ctx.local_u64(sc.bulk.word(8 * j))) == old_sub {
                        stale.insert((start + j) as u64);
                    }
                }
            }
            Some(stale)
        } else {
            None
        };
        keep(ctx).await?;
        ctx.set_local_u64(sc.e1, old_entry);
        ctx.set_local_u64(sc.e2, new_entry);
        let mut queued = 0;
        let mut st_updates = Vec::new();
        for (first, src, e) in [(suffix, sc.e1, old_entry), (suffix2, sc.e2, new_entry)] {
            let mut i = first;
            while i < 1 << g {
                if stale.as_ref().is_none_or(|s| s.contains(&i)) {
                    ctx.write(dir.add(DIR_ENTRIES + 8 * i), src);
                    st_updates.push((i as usize, e));
                    queued += 1;
                    if queued % 128 == 0 {
                        ctx.sync().await?;
                        keep(ctx).await?;
                    }
                }
                i += step;
            }
        }
        ctx.sync().await?;
        let mut st = self.st.borrow_mut();
        if g > st.global_depth {
            // Entries cached at the old depth stay valid for their index;
            // the new upper half is unknown until fetched.
            st.global_depth = g;
        }
        for (i, e) in st_updates {
            st.dir[i] = e;
        }
        Ok(())
    }
}

impl MapClient for RaceClient {
    /// Looks `key` up: one round trip on a cache hit, two otherwise.
    async fn search(&self, ctx: &Ctx, key: &[u8]) -> Result<Option<Vec<u8>>, IndexError> {
        self.check_key(ctx, key)?;
        let _op = ctx.read_op("search").await;
        if let Some((h, rank)) = self.hot_rank(key) {
            return Ok(self.hot_op(ctx, h, rank, HotOp::Search).await?.before);
        }
        let h = self.hash(key);
        if let Some((slot_addr, w)) = self.cache_get(&h) {
            let slot = Slot(w);
            let cand = self.cand(0, slot)?;
            let t0 = ctx.now();
            ctx.read(self.t.remote(slot_addr)?, self.sc().slot);
            ctx.read(self.t.remote(slot.block())?, cand);
            ctx.sync().await?;
            if ctx.local_u64(self.sc().slot) == w && !self.stalled(ctx, t0) {
                let hit = self.with_block(ctx, cand, |b| {
                    b.and_then(|(k, v)| (k == key).then(|| v.to_vec()))
                });
                if let Some(v) = hit {
                    self.st.borrow_mut().counters.cache_hits += 1;
                    return Ok(Some(v));
                }
            }
            self.cache_drop(&h);
        }
        self.st.borrow_mut().counters.cache_misses += 1;
        match self.locate(ctx, key, &h, true).await? {
            Locate::Found(slot_addr, slot, value, _) => {
                self.cache_put(&h, slot_addr, slot.0);
                Ok(Some(value))
            }
            Locate::Absent => Ok(None),
        }
    }
    /// Inserts `key` if absent; `Ok(false)` if it was present (unchanged).
    async fn insert(&self, ctx: &Ctx, key: &[u8], value: &[u8]) -> Result<bool, IndexError> {
        self.check_key(ctx, key)?;
        self.check_value(value)?;
        let _op = ctx.op("insert").await;
        if let Some((h, rank)) = self.hot_rank(key) {
            return Ok(self
                .hot_op(ctx, h, rank, HotOp::Insert(value))
                .await?
                .applied);
        }
        let h = self.hash(key);
        let sub = self.subtable(ctx, &h).await?;
        let (block, units) = self.new_block(ctx, key, value, sub.node())?;
        let r = self.insert_block(ctx, key, &h, block, units).await;
        if !matches!(r, Ok(true)) {
            // Never published: reusable at once.
            self.st.borrow_mut().alloc.free_now(block, units);
        }
        r
    }
    /// Replaces the value of `key` if present; `Ok(false)` if absent.
    async fn update(&self, ctx: &Ctx, key: &[u8], value: &[u8]) -> Result<bool, IndexError> {
        self.check_key(ctx, key)?;
        self.check_value(value)?;
        let _op = ctx.op("update").await;
        if let Some((h, rank)) = self.hot_rank(key) {
            return Ok(self
                .hot_op(ctx, h, rank, HotOp::Update(value))
                .await?
                .applied);
        }
        let h = self.hash(key);
        if let Some(mv) = self.t.cfg.mv_shape() {
            if let Some(done) = self.mv_update(ctx, key, &h, value, mv).await? {
                return Ok(done);
            }
            self.st.borrow_mut().counters.mv_slow += 1;
        }
        let prefer = match self.cache_get(&h) {
            Some((a, _)) => a.node(),
            None => self.subtable(ctx, &h).await?.node(),
        };
        let (block, units) = self.new_block(ctx, key, value, prefer)?;
        let new = Slot::new(h.fp(), units, block).ok_or_else(|| {
            IndexError::config(
                KIND,
                format!("block address {block} does not fit a 48-bit pointer"),
            )
        })?;
        let r = self.replace(ctx, key, &h, Some((block, new))).await;
        if !matches!(r, Ok(true)) {
            self.st.borrow_mut().alloc.free_now(block, units);
        }
        r
    }
    /// Removes `key`; `Ok(false)` if it was absent.
    async fn delete(&self, ctx: &Ctx, key: &[u8]) -> Result<bool, IndexError> {
        self.check_key(ctx, key)?;
        let _op = ctx.op("delete").await;
        if let Some((h, rank)) = self.hot_rank(key) {
            return Ok(self.hot_op(ctx, h, rank, HotOp::Delete).await?.applied);
        }
        let h = self.hash(key);
        self.replace(ctx, key, &h, None).await
    }
    async fn scan(&self, _: &Ctx, _: &[u8], _: usize) -> Result<Entries, IndexError> {
        Err(IndexError::Unsupported {
            kind: KIND,
            what: "range scans (a hash table keeps no key order)",
        })
    }
    /// Every live key-value pair, read subtable by subtable, with structural
    /// checks (magic, bucket headers, no duplicate keys). Meant for a
    /// quiescent table (tests, tools); concurrent writers make it a fuzzy
    /// snapshot.
    async fn entries(&self, ctx: &Ctx) -> Result<Entries, IndexError> {
        let dir = self.t.remote(self.t.dir)?;
        let sc = *self.sc();
        let geo = self.t.geo;
        ctx.read_sync(dir.add(DIR_GLOBAL_DEPTH), sc.word).await?;
        let g = ctx.local_u64(sc.word) as u32;
        let n = 1usize << g;
        let mut subs = std::collections::BTreeSet::new();
        let per = SCRATCH / 8;
        for start in (0..n).step_by(per) {
            let k = per.min(n - start);
            ctx.read_sync(
                dir.add(DIR_ENTRIES + 8 * start as u64),
                sc.bulk.prefix(8 * k),
            )
            .await?;
            for i in 0..k {
                subs.insert(unptr48(ctx.local_u64(sc.bulk.word(8 * i))).raw());
            }
        }
        let (group_at, block_at) = (sc.bulk.prefix(GROUP_BYTES as usize), sc.bulk.skip(256));
        let mut out = Vec::new();
        let mut seen = std::collections::HashSet::new();
        for sub in subs.into_iter().map(GlobalAddr::from_raw) {
            let sub_r = self.t.remote(sub)?;
            ctx.read_sync(sub_r, sc.hdr).await?;
            let head: SubtableHeader = ctx.get_as(sc.hdr);
            if head.magic != SUBTABLE_MAGIC {
                return Err(IndexError::Corrupt {
                    addr: sub,
                    what: "subtable header",
                });
            }
            let (depth, suffix) = (head.depth as u32, head.suffix);
            let expect_header = bucket_header(depth, suffix);
            for gi in 0..geo.groups {
                ctx.read_sync(sub_r.add(geo.groups_at() + gi * GROUP_BYTES), group_at)
                    .await?;
                let grp: BucketGroup = ctx.get_as(group_at);
                for bucket in &grp.buckets {
                    if bucket.header != expect_header {
                        return Err(IndexError::Corrupt {
                            addr: sub,
                            what: "bucket header (does not match its subtable)",
                        });
                    }
                    for &w in &bucket.slots {
                        let s = Slot(w);
                        if s.is_empty() || s.moved() {
                            continue;
                        }
                        let blk_at = block_at.prefix(s.block_bytes());
                        ctx.read_sync(self.t.remote(s.block())?, blk_at).await?;
                        let blk = ctx.local_vec(blk_at);
                        let (k, v) = decode_block(&blk).ok_or(IndexError::Corrupt {
                            addr: s.block(),
                            what: "key-value block (checksum)",
                        })?;
                        let h = self.hash(k);
                        if h.h1 & mask(depth) != suffix || h.fp() != s.fp() {
                            return Err(IndexError::Corrupt {
                                addr: s.block(),
                                what: "key in the wrong subtable or with a wrong fingerprint",
                            });
                        }
                        if !seen.insert(k.to_vec()) {
                            return Err(IndexError::Corrupt {
                                addr: s.block(),
                                what: "duplicate key",
                            });
                        }
                        out.push((k.to_vec(), v.to_vec()));
                    }
                }
            }
        }
        if let Some(h) = &self.hot {
            for (k, v) in h
                .area
                .entries(ctx, &h.local, h.owner, &self.t.home, sc.bulk)
                .await?
            {
                if !seen.insert(k.clone()) {
                    return Err(IndexError::Corrupt {
                        addr: h.area.dir,
                        what: "hot key also present in the table",
                    });
                }
                out.push((k, v));
            }
        }
        Ok(out)
    }
    fn stats(&self) -> ClientStats {
        let c = self.counters();
        ClientStats {
            cache_hits: c.cache_hits,
            cache_misses: c.cache_misses,
            splits: c.splits,
            ..Default::default()
        }
    }
    fn local_layout(&self) -> &LocalLayout {
        &self.t.layout
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use dmkit_fabric::sync::SyncQp;

    /// A multi-version table whose directory records no layout (made
    /// before commit words: 24-byte slot heads) is refused on open, not
    /// misread; plain tables open as before.
    #[test]
    fn a_table_of_the_older_multi_version_layout_is_refused() {
        let f: Arc<dyn Fabric> = dmkit_index::conformance::shm_fabric(1, 16 << 20);
        let cfg = RaceConfig {
            groups: 2,
            max_key: 16,
            max_value: 64,
            ..Default::default()
        };
        for k in [0u32, 4] {
            let name = format!("old-{k}");
            let t = RaceTable::create(
                f.clone(),
                &name,
                RaceConfig {
                    cold_versions: k,
                    ..cfg.clone()
                },
            )
            .unwrap();
            let limits = t
                .remote(t.dir)
                .unwrap()
                .add(std::mem::offset_of!(DirHeader, limits) as u64);
            let mut qp = SyncQp::new(f.as_ref(), limits.addr.node(), 8).unwrap();
            let now = qp.read_u64(limits.addr, limits.rkey).unwrap();
            assert_eq!(now >> 24 & 0xFF, if k > 0 { MV_LAYOUT } else { 0 });
            assert!(RaceTable::open(f.clone(), &name, cfg.clone()).is_ok());
            qp.write_u64(limits.addr, limits.rkey, now & !(0xFF << 24))
                .unwrap();
            let r = RaceTable::open(f.clone(), &name, cfg.clone());
            if k == 0 {
                assert!(r.is_ok());
            } else {
                let e = r.err().expect("refused");
                assert!(
                    matches!(&e, IndexError::Config { .. }) && e.to_string().contains("layout 1"),
                    "{e}"
                );
            }
            t.destroy().unwrap();
        }
    }
}
