//! The table: creation, the per-worker client, and the four operations plus
//! the online subtable split. Protocols are described in the crate docs.

use std::cell::RefCell;
use std::collections::HashMap;
use std::rc::Rc;
use std::sync::Arc;

use dmkit_fabric::{Fabric, FabricError, GlobalAddr, NodeId, Rkey, SyncQp};
use dmkit_runtime::{Ctx, Nanos};

use crate::error::RaceError;
use crate::hot::{
    owner_of, HotArea, HotLocal, HotOp, HotOutcome, HotParams, HotTrace, MAX_HOT_BLOCK_LOG2,
    MAX_HOT_KEYS,
};
use crate::layout::*;
use dmkit_fabric::RemoteRef;
use dmkit_runtime::alloc::BlockAlloc;
use dmkit_runtime::machine::PerMachine;
use dmkit_runtime::Local;

/// Configuration of a table (structure) and of its clients (caching, memory).
#[derive(Debug, Clone, PartialEq)]
pub struct RaceConfig {
    /// Longest key in bytes (stored in the table; all clients share it).
    pub max_key: usize,
    /// Longest value in bytes (stored in the table).
    pub max_value: usize,
    /// Bucket groups per subtable (each holds 21 slots).
    pub groups: u64,
    /// Subtables at creation: 2^initial_depth.
    pub initial_depth: u32,
    /// Most splits a suffix can see: the directory has 2^max_depth entries.
    pub max_depth: u32,
    /// Client cache of key → slot, entries per client (rounded up to a power
    /// of two; 0 disables it; SMART-HT's cache).
    pub cache_entries: usize,
    /// How long a retired key-value block stays untouched before it is
    /// reused (ns of the worker's clock).
    pub grace: Nanos,
    /// Bytes a client asks the memory node for at a time for its blocks.
    pub chunk_bytes: u64,
    /// Hash seed (stored in the table).
    pub seed: u64,
    /// Keys of the hot area (memory-semantics §IV-B; [`crate::hot`]),
    /// fixed at creation and stored in the table; empty: no hot area.
    pub hot_keys: Vec<Vec<u8>>,
    /// Hot entries per block: 2^hot_block_log2 (stored in the table).
    pub hot_block_log2: u32,
    /// θ: buffered modifications of a hot block that force its write-back.
    pub hot_theta: u32,
    /// Longest a machine keeps a hot block however busy it is (ns).
    pub hot_hold: Nanos,
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
        }
    }
}

impl RaceConfig {
    fn validate(&self) -> Result<(), RaceError> {
        let bad = |s: String| Err(RaceError::Config(s));
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
        self.validate_hot()
    }

    fn validate_hot(&self) -> Result<(), RaceError> {
        let bad = |s: String| Err(RaceError::Config(s));
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
        if self.hot_hold.saturating_mul(2) >= HOT_LEASE {
            return bad(format!(
                "hot_hold {} ns must be under half the hot lock's lease ({HOT_LEASE} ns)",
                self.hot_hold
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
            lease: HOT_LEASE,
        }
    }
}

/// Lease of a hot block's remote lock: how long a crashed holder blocks it.
const HOT_LEASE: Nanos = 100_000_000;

/// Operation counters of the table's own making (beyond the runtime's).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct TableCounters {
    pub splits: u64,
    pub cache_hits: u64,
    pub cache_misses: u64,
    pub stale_reads: u64,
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
}

/// A table: what every client of it shares. `Send + Sync`; make one
/// [`RaceClient`] per worker with [`RaceTable::client`].
pub struct RaceTable {
    fabric: Arc<dyn Fabric>,
    name: String,
    cfg: RaceConfig,
    dir: GlobalAddr,
    geo: Geometry,
    nodes: Vec<NodeId>,
    rkeys: Vec<Option<Rkey>>,
    /// Block chunks taken by this process's clients.
    chunks: Arc<std::sync::Mutex<Vec<GlobalAddr>>>,
    /// The hot area, if the table has one, and each machine's side of it.
    hot: Option<Arc<HotArea>>,
    hot_local: PerMachine<HotLocal>,
}

fn root_name(name: &str) -> String {
    format!("race/{name}")
}

fn hot_root_name(name: &str) -> String {
    format!("race/{name}/hot")
}

/// The bytes `[from, from+len)` of a fresh subtable's image.
fn subtable_image(geo: Geometry, depth: u32, suffix: u64, from: u64, len: usize) -> Vec<u8> {
    let mut out = vec![0u8; len];
    let put = |out: &mut [u8], at: u64, v: u64| {
        if at >= from && at + 8 <= from + len as u64 {
            let i = (at - from) as usize;
            out[i..i + 8].copy_from_slice(&v.to_le_bytes());
        }
    };
    put(&mut out, 0, SUBTABLE_MAGIC);
    put(&mut out, SUB_DEPTH, depth as u64);
    put(&mut out, SUB_DEPTH + 8, suffix);
    put(&mut out, SUB_SPLIT_LOCK + 8, geo.groups);
    let header = bucket_header(depth, suffix);
    let first = from.saturating_sub(geo.groups_at()) / BUCKET_BYTES;
    let mut b = first;
    loop {
        let at = geo.groups_at() + b * BUCKET_BYTES;
        if at >= from + len as u64 || b >= 3 * geo.groups {
            break;
        }
        put(&mut out, at, header);
        b += 1;
    }
    out
}

impl RaceTable {
    /// Creates table `name` on the fabric's memory nodes (directory on the
    /// lowest node id, subtables spread over all nodes) and registers it as
    /// a named root, so other processes can [`RaceTable::open`] it.
    pub fn create(
        fabric: Arc<dyn Fabric>,
        name: &str,
        cfg: RaceConfig,
    ) -> Result<Arc<Self>, RaceError> {
        cfg.validate()?;
        let (home, nodes) = dmkit_fabric::home_node(fabric.as_ref())
            .ok_or_else(|| RaceError::Config("fabric has no memory nodes".into()))?;
        let rkeys = dmkit_fabric::heap_rkeys(fabric.as_ref(), &nodes)?;
        let geo = Geometry { groups: cfg.groups };
        let entries = 1u64 << cfg.max_depth;
        let oom = |what| move |source| RaceError::OutOfMemory { what, source };
        let (dir, _, _) = fabric
            .alloc_chunk(home, DIR_ENTRIES + 8 * entries, true)
            .map_err(oom("allocating the directory"))?;
        let mut chunks = vec![dir];
        let result = (|| {
            let max_msg = fabric.caps().max_message.clamp(4096, 1 << 20);
            let mut qps: HashMap<NodeId, SyncQp> = HashMap::new();
            let mut entry_words = Vec::new();
            for i in 0..1u64 << cfg.initial_depth {
                let node = nodes[i as usize % nodes.len()];
                let (sub, _, _) = fabric
                    .alloc_chunk(node, geo.bytes(), true)
                    .map_err(oom("allocating a subtable"))?;
                chunks.push(sub);
                let qp = match qps.entry(node) {
                    std::collections::hash_map::Entry::Occupied(o) => o.into_mut(),
                    std::collections::hash_map::Entry::Vacant(v) => {
                        v.insert(SyncQp::new(fabric.as_ref(), node, max_msg)?)
                    }
                };
                let rk = rkeys[node as usize].expect("rkey of a listed node");
                let mut at = 0;
                while at < geo.bytes() {
                    let n = (geo.bytes() - at).min(max_msg as u64) as usize;
                    let img = subtable_image(geo, cfg.initial_depth, i, at, n);
                    qp.write(sub.add(at), rk, &img)?;
                    at += n as u64;
                }
                entry_words.push(dir_entry(cfg.initial_depth, sub).ok_or_else(|| {
                    RaceError::Config(format!(
                        "subtable address {sub} does not fit a 48-bit pointer"
                    ))
                })?);
            }
            let hq = match qps.entry(home) {
                std::collections::hash_map::Entry::Occupied(o) => o.into_mut(),
                std::collections::hash_map::Entry::Vacant(v) => {
                    v.insert(SyncQp::new(fabric.as_ref(), home, max_msg)?)
                }
            };
            let rk = rkeys[home as usize].expect("rkey of a listed node");
            let bytes: Vec<u8> = entry_words.iter().flat_map(|w| w.to_le_bytes()).collect();
            for (i, piece) in bytes.chunks(max_msg).enumerate() {
                hq.write(dir.add(DIR_ENTRIES + (i * max_msg) as u64), rk, piece)?;
            }
            let header = DirHeader {
                magic: DIR_MAGIC,
                global_depth: cfg.initial_depth as u64,
                lock: 0,
                max_depth: cfg.max_depth as u64,
                groups: cfg.groups,
                seed: cfg.seed,
                nodes: nodes.len() as u64,
                limits: cfg.max_key as u64 | (cfg.max_value as u64) << 32,
            };
            hq.write(dir, rk, &header.to_bytes())?;
            let hot = if cfg.hot_keys.is_empty() {
                None
            } else {
                let (area, taken) = HotArea::create(fabric.as_ref(), home, &nodes, &rkeys, &cfg)?;
                chunks.extend(taken);
                Some(area)
            };
            // A destroyed table leaves its root at 0: reuse the name.
            if !dmkit_fabric::claim_root(fabric.as_ref(), home, &root_name(name), dir.raw())? {
                return Err(RaceError::AlreadyExists(name.into()));
            }
            if let Some(h) = &hot {
                if !dmkit_fabric::claim_root(
                    fabric.as_ref(),
                    home,
                    &hot_root_name(name),
                    h.dir.raw(),
                )? {
                    let _ = dmkit_fabric::release_root(
                        fabric.as_ref(),
                        home,
                        &root_name(name),
                        dir.raw(),
                    );
                    return Err(RaceError::AlreadyExists(name.into()));
                }
            }
            Ok(hot)
        })();
        let hot = match result {
            Ok(hot) => hot,
            Err(e) => {
                for c in chunks {
                    let _ = fabric.free_chunk(c);
                }
                return Err(e);
            }
        };
        Ok(Arc::new(Self {
            fabric,
            name: name.into(),
            cfg,
            dir,
            geo,
            nodes,
            rkeys,
            chunks: Arc::default(),
            hot: hot.map(Arc::new),
            hot_local: PerMachine::default(),
        }))
    }

    /// Opens table `name`. Structural settings (geometry, limits, seed) come
    /// from the table; `cfg` supplies the client-side ones (cache, grace,
    /// chunk size).
    pub fn open(
        fabric: Arc<dyn Fabric>,
        name: &str,
        cfg: RaceConfig,
    ) -> Result<Arc<Self>, RaceError> {
        let (home, nodes) = dmkit_fabric::home_node(fabric.as_ref())
            .ok_or_else(|| RaceError::Config("fabric has no memory nodes".into()))?;
        let rkeys = dmkit_fabric::heap_rkeys(fabric.as_ref(), &nodes)?;
        let dir = dmkit_fabric::find_root(fabric.as_ref(), home, &root_name(name))?
            .ok_or_else(|| RaceError::NoSuchTable(name.into()))?;
        let mut qp = SyncQp::new(fabric.as_ref(), home, 64)?;
        let h =
            DirHeader::from_bytes(&qp.read(dir, rkeys[home as usize].expect("home rkey"), 64)?);
        if h.magic != DIR_MAGIC || h.max_depth > MAX_DEPTH_LIMIT as u64 || h.groups == 0 {
            return Err(RaceError::Corrupt {
                addr: dir,
                what: "directory header",
            });
        }
        let cfg = RaceConfig {
            max_key: (h.limits & 0xFFFF) as usize,
            max_value: (h.limits >> 32) as usize,
            groups: h.groups,
            max_depth: h.max_depth as u32,
            seed: h.seed,
            hot_keys: Vec::new(),
            ..cfg
        };
        cfg.validate()?;
        let hot = match dmkit_fabric::find_root(fabric.as_ref(), home, &hot_root_name(name))? {
            None => None,
            Some(hdir) => Some(Arc::new(HotArea::open(
                fabric.as_ref(),
                hdir,
                &rkeys,
                &nodes,
                cfg.max_key,
                cfg.max_value,
                cfg.hot_params(),
            )?)),
        };
        let cfg = RaceConfig {
            hot_keys: hot.as_ref().map(|h| h.keys()).unwrap_or_default(),
            hot_block_log2: hot.as_ref().map_or(cfg.hot_block_log2, |h| h.block_log2()),
            ..cfg
        };
        Ok(Arc::new(Self {
            fabric,
            name: name.into(),
            geo: Geometry { groups: cfg.groups },
            cfg,
            dir,
            nodes,
            rkeys,
            chunks: Arc::default(),
            hot,
            hot_local: PerMachine::default(),
        }))
    }

    /// Removes the table: unregisters its name, frees its directory and
    /// subtables, and the block chunks this process's clients took (other
    /// processes free theirs by calling this too, or lose them with the node).
    /// No client may use the table afterwards.
    pub fn destroy(&self) -> Result<(), RaceError> {
        let home = self.dir.node();
        let rk = self.rkey(home)?;
        let name = root_name(&self.name);
        if !dmkit_fabric::release_root(self.fabric.as_ref(), home, &name, self.dir.raw())? {
            return Err(RaceError::NoSuchTable(self.name.clone()));
        }
        let mut qp = SyncQp::new(self.fabric.as_ref(), home, 64)?;
        let g = qp.read_u64(self.dir.add(DIR_GLOBAL_DEPTH), rk)?;
        let mut subs = std::collections::BTreeSet::new();
        for i in 0..1u64 << g.min(self.cfg.max_depth as u64) {
            subs.insert(unptr48(qp.read_u64(self.dir.add(DIR_ENTRIES + 8 * i), rk)?).raw());
        }
        for s in subs {
            self.fabric.free_chunk(GlobalAddr::from_raw(s))?;
        }
        self.fabric.free_chunk(self.dir)?;
        if let Some(h) = &self.hot {
            dmkit_fabric::release_root(
                self.fabric.as_ref(),
                home,
                &hot_root_name(&self.name),
                h.dir.raw(),
            )?;
            for c in h.chunks() {
                self.fabric.free_chunk(c)?;
            }
        }
        let chunks = std::mem::take(&mut *self.chunks.lock().unwrap_or_else(|p| p.into_inner()));
        for c in chunks {
            self.fabric.free_chunk(c)?;
        }
        Ok(())
    }

    /// The table's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The effective configuration.
    pub fn config(&self) -> &RaceConfig {
        &self.cfg
    }

    /// The hot area, if the table has one.
    pub fn hot(&self) -> Option<&HotArea> {
        self.hot.as_deref()
    }

    /// A client for one worker of compute machine 0 (see
    /// [`RaceTable::client_on`]).
    pub fn client(self: &Arc<Self>, id: u64) -> RaceClient {
        self.client_on(0, id)
    }

    /// A client for one worker on compute machine `machine` (its tasks
    /// share the client's caches and block allocator; the clients of one
    /// machine share its side of the hot area). `id` distinguishes lock
    /// holders; make it unique among the table's live clients (e.g.
    /// process id × workers + worker).
    pub fn client_on(self: &Arc<Self>, machine: usize, id: u64) -> RaceClient {
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
                alloc: BlockAlloc::new(self.cfg.chunk_bytes, self.cfg.grace, self.chunks.clone()),
                owner: id.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1,
                counters: TableCounters::default(),
            })),
        }
    }

    fn rkey(&self, node: NodeId) -> Result<Rkey, RaceError> {
        self.rkeys
            .get(node as usize)
            .copied()
            .flatten()
            .ok_or(RaceError::Fabric(FabricError::NoSuchNode(node)))
    }

    fn block_cap(&self) -> usize {
        block_bytes(self.cfg.max_key, self.cfg.max_value)
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
    owner: u64,
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

// Task-local memory layout.
const L_COMB1: usize = 0;
const L_COMB2: usize = 128;
const L_WORD: usize = 256;
const L_SLOT: usize = 264;
const L_ZERO: usize = 272;
const L_E1: usize = 288;
const L_E2: usize = 296;
/// The subtable header, read after the buckets.
const L_HDR: usize = 320;
const L_NEW: usize = 512;
/// Blocks fetched in one round trip.
const CAND_MAX: usize = 4;
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

/// What the two combined buckets showed.
struct Scan {
    /// Every bucket covers the key, at the depth the subtable header showed
    /// after the buckets were read.
    headers_ok: bool,
    /// The subtable's split lock was held (inserters back off).
    splitting: bool,
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

    fn l_cand(&self) -> usize {
        L_NEW + self.t.block_cap()
    }

    fn l_scratch(&self) -> usize {
        (self.l_cand() + CAND_MAX * self.t.block_cap()).next_multiple_of(64)
    }

    /// Task-local bytes the table needs.
    pub fn local_bytes_needed(&self) -> usize {
        self.l_scratch() + SCRATCH
    }

    fn check_key(&self, ctx: &Ctx, key: &[u8]) -> Result<(), RaceError> {
        if key.is_empty() || key.len() > self.t.cfg.max_key {
            return Err(RaceError::KeyLength {
                len: key.len(),
                max: self.t.cfg.max_key,
            });
        }
        let need = self.local_bytes_needed();
        if ctx.local_len() < need {
            return Err(RaceError::LocalMemory {
                have: ctx.local_len(),
                need,
            });
        }
        Ok(())
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
    ) -> Result<HotOutcome, RaceError> {
        let mut tr = HotTrace::default();
        let r = h
            .area
            .run(
                ctx,
                &h.local,
                h.owner,
                |n| self.t.rkey(n),
                self.l_scratch(),
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

    fn check_value(&self, value: &[u8]) -> Result<(), RaceError> {
        if value.len() > self.t.cfg.max_value {
            return Err(RaceError::ValueTooLarge {
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
    async fn subtable(&self, ctx: &Ctx, h: &KeyHash) -> Result<GlobalAddr, RaceError> {
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
    async fn refresh(&self, ctx: &Ctx, h: &KeyHash) -> Result<GlobalAddr, RaceError> {
        let home = self.t.dir.node();
        let rk = self.t.rkey(home)?;
        let mut g = self.st.borrow().global_depth;
        loop {
            let idx = h.h1 & mask(g);
            ctx.read(
                RemoteRef::new(self.t.dir.add(DIR_GLOBAL_DEPTH), rk),
                Local::at(L_WORD, 8),
            );
            ctx.read(
                RemoteRef::new(self.t.dir.add(DIR_ENTRIES + 8 * idx), rk),
                Local::at(L_SLOT, 8),
            );
            ctx.sync().await?;
            let (now_g, e) = (
                ctx.local_u64(Local::at(L_WORD, 8)) as u32,
                ctx.local_u64(Local::at(L_SLOT, 8)),
            );
            if now_g > self.t.cfg.max_depth {
                return Err(RaceError::Corrupt {
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
                return Err(RaceError::Corrupt {
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

    /// Decodes the block at task-local `off` (`len` bytes) through the
    /// client's reusable buffer.
    fn with_block<R>(
        &self,
        ctx: &Ctx,
        off: usize,
        len: usize,
        f: impl FnOnce(Option<(&[u8], &[u8])>) -> R,
    ) -> R {
        let mut buf = std::mem::take(&mut self.st.borrow_mut().buf);
        buf.resize(len, 0);
        ctx.get_local(Local::at(off, buf.len()), &mut buf);
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
    fn queue_combs(&self, ctx: &Ctx, sub: GlobalAddr, rk: Rkey, h: &KeyHash, header: bool) {
        let (c1, c2) = h.combs(self.t.geo);
        ctx.read(
            RemoteRef::new(sub.add(self.t.geo.comb_at(c1)), rk),
            Local::at(L_COMB1, COMB_BYTES as usize),
        );
        ctx.read(
            RemoteRef::new(sub.add(self.t.geo.comb_at(c2)), rk),
            Local::at(L_COMB2, COMB_BYTES as usize),
        );
        if header {
            ctx.read(RemoteRef::new(sub, rk), Local::at(L_HDR, 64));
        }
    }

    /// Parses the combined buckets read by [`Self::queue_combs`]. Without
    /// the subtable `header`, the bucket headers go unchecked
    /// (`headers_ok`, `splitting` say nothing).
    fn scan(&self, ctx: &Ctx, sub: GlobalAddr, h: &KeyHash, header: bool) -> Scan {
        let (c1, c2) = h.combs(self.t.geo);
        let fp = h.fp();
        let depth = ctx.local_u64(Local::at(L_HDR + SUB_DEPTH as usize, 8));
        let mut s = Scan {
            headers_ok: !header || ctx.local_u64(Local::at(L_HDR, 8)) == SUBTABLE_MAGIC,
            splitting: header && ctx.local_u64(Local::at(L_HDR + SUB_SPLIT_LOCK as usize, 8)) != 0,
            cands: Few::new(),
            empties: [Few::new(), Few::new()],
            occupied: [0, 0],
        };
        let mut buf = [0u8; COMB_BYTES as usize];
        for (i, (c, off)) in [(c1, L_COMB1), (c2, L_COMB2)].into_iter().enumerate() {
            ctx.get_local(Local::at(off, buf.len()), &mut buf);
            let base = sub.add(self.t.geo.comb_at(c));
            // Main bucket first: combined bucket 2g starts with main bucket
            // 0, 2g+1 ends with main bucket 1.
            let order = if c % 2 == 0 { [0, 1] } else { [1, 0] };
            for k in order {
                let b = k * BUCKET_BYTES as usize;
                let bucket_header = word(&buf, b);
                if header && (!header_covers(bucket_header, h.h1) || bucket_header >> 56 != depth) {
                    s.headers_ok = false;
                }
                for j in 0..SLOTS_PER_BUCKET {
                    let at = b + 8 + 8 * j;
                    let w = Slot(word(&buf, at));
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

    /// Reads the candidates' blocks (≤ CAND_MAX per round trip) and finds `key`.
    async fn fetch(
        &self,
        ctx: &Ctx,
        key: &[u8],
        cands: &[(GlobalAddr, Slot)],
    ) -> Result<Fetch, RaceError> {
        let cap = self.t.block_cap();
        let base = self.l_cand();
        for round in cands.chunks(CAND_MAX) {
            for (i, (_, slot)) in round.iter().enumerate() {
                let n = slot.block_bytes();
                if n > cap {
                    return Err(RaceError::Corrupt {
                        addr: slot.block(),
                        what: "key-value block (larger than the table's limits)",
                    });
                }
                ctx.read(
                    RemoteRef::new(slot.block(), self.t.rkey(slot.block().node())?),
                    Local::at(base + i * cap, n),
                );
            }
            ctx.sync().await?;
            for (i, &(slot_addr, slot)) in round.iter().enumerate() {
                let found = self.with_block(ctx, base + i * cap, slot.block_bytes(), |b| {
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
    ) -> Result<Locate, RaceError> {
        let mut attempt = 0;
        let mut header = !optimistic;
        loop {
            let sub = self.subtable(ctx, h).await?;
            let rk = self.t.rkey(sub.node())?;
            let t0 = ctx.now();
            self.queue_combs(ctx, sub, rk, h, header);
            ctx.sync().await?;
            let scan = self.scan(ctx, sub, h, header);
            if !scan.headers_ok {
                self.st.borrow_mut().counters.stale_reads += 1;
                self.refresh(ctx, h).await?;
                if attempt > 0 {
                    ctx.backoff().await;
                } else {
                    ctx.note_retry();
                }
                attempt += 1;
                continue;
            }
            let found = self.fetch(ctx, key, scan.cands.as_slice()).await?;
            if self.stalled(ctx, t0) {
                attempt += 1;
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
                    ctx.note_retry();
                }
                Fetch::Found { slot, .. } if slot.moved() => {
                    // A split is moving the key: wait for the directory.
                    self.st.borrow_mut().counters.stale_reads += 1;
                    ctx.backoff().await;
                    self.refresh(ctx, h).await?;
                }
                Fetch::Found {
                    slot_addr,
                    slot,
                    value,
                } => return Ok(Locate::Found(slot_addr, slot, value, t0)),
            }
            attempt += 1;
        }
    }

    /// Looks `key` up: one round trip on a cache hit, two otherwise.
    pub async fn search(&self, ctx: &Ctx, key: &[u8]) -> Result<Option<Vec<u8>>, RaceError> {
        self.check_key(ctx, key)?;
        let _op = ctx.read_op("search").await;
        if let Some((h, rank)) = self.hot_rank(key) {
            return Ok(self.hot_op(ctx, h, rank, HotOp::Search).await?.before);
        }
        let h = self.hash(key);
        if let Some((slot_addr, w)) = self.cache_get(&h) {
            let slot = Slot(w);
            let cand = self.l_cand();
            let t0 = ctx.now();
            ctx.read(
                RemoteRef::new(slot_addr, self.t.rkey(slot_addr.node())?),
                Local::at(L_SLOT, 8),
            );
            ctx.read(
                RemoteRef::new(slot.block(), self.t.rkey(slot.block().node())?),
                Local::at(cand, slot.block_bytes()),
            );
            ctx.sync().await?;
            if ctx.local_u64(Local::at(L_SLOT, 8)) == w && !self.stalled(ctx, t0) {
                let hit = self.with_block(ctx, cand, slot.block_bytes(), |b| {
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

    /// Allocates and fills (locally, at `L_NEW`) the block for `key`/`value`.
    fn new_block(
        &self,
        ctx: &Ctx,
        key: &[u8],
        value: &[u8],
        prefer: NodeId,
    ) -> Result<(GlobalAddr, u64), RaceError> {
        let mut img = Vec::new();
        encode_block(key, value, &mut img);
        let units = (img.len() / 64) as u64;
        let addr = {
            let mut st = self.st.borrow_mut();
            st.alloc
                .alloc(
                    self.t.fabric.as_ref(),
                    &self.t.nodes,
                    prefer,
                    units,
                    ctx.now(),
                )
                .map_err(|source| RaceError::OutOfMemory {
                    what: "allocating a key-value block",
                    source,
                })?
        };
        ctx.put_local(Local::at(L_NEW, img.len()), &img);
        Ok((addr, units))
    }

    /// Inserts `key` if absent; `Ok(false)` if it was present (unchanged).
    pub async fn insert(&self, ctx: &Ctx, key: &[u8], value: &[u8]) -> Result<bool, RaceError> {
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

    async fn insert_block(
        &self,
        ctx: &Ctx,
        key: &[u8],
        h: &KeyHash,
        block: GlobalAddr,
        units: u64,
    ) -> Result<bool, RaceError> {
        let new = Slot::new(h.fp(), units, block).ok_or_else(|| {
            RaceError::Config(format!(
                "block address {block} does not fit a 48-bit pointer"
            ))
        })?;
        let owner = self.st.borrow().owner;
        let mut written = false;
        loop {
            let sub = self.subtable(ctx, h).await?;
            let rk = self.t.rkey(sub.node())?;
            let (c1, _) = h.combs(self.t.geo);
            let lock = sub.add(self.t.geo.lock_at(c1));
            if !written {
                ctx.write(
                    RemoteRef::new(block, self.t.rkey(block.node())?),
                    Local::at(L_NEW, units as usize * 64),
                );
                if block.node() != sub.node() {
                    // Different queue pairs: make the block durable first.
                    ctx.sync().await?;
                }
                written = true;
            }
            let t0 = ctx.now();
            let lt = ctx.cas(RemoteRef::new(lock, rk), 0, owner);
            self.queue_combs(ctx, sub, rk, h, true);
            ctx.sync().await?;
            if ctx.value(lt) != 0 {
                ctx.backoff().await;
                continue;
            }
            let scan = self.scan(ctx, sub, h, true);
            let splitting = scan.splitting;
            let unlock = |ctx: &Ctx| {
                ctx.set_local_u64(Local::at(L_ZERO, 8), 0);
                ctx.write(RemoteRef::new(lock, rk), Local::at(L_ZERO, 8));
            };
            if splitting || !scan.headers_ok {
                unlock(ctx);
                ctx.sync().await?;
                if !scan.headers_ok {
                    self.st.borrow_mut().counters.stale_reads += 1;
                    self.refresh(ctx, h).await?;
                }
                ctx.backoff().await;
                continue;
            }
            let found = match self.fetch(ctx, key, scan.cands.as_slice()).await {
                Ok(_) if self.stalled(ctx, t0) => {
                    unlock(ctx);
                    ctx.sync().await?;
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
                    ctx.note_retry();
                    continue;
                }
            }
            let Some(slot_addr) = scan.pick_empty() else {
                unlock(ctx);
                ctx.sync().await?;
                self.split(ctx, sub).await?;
                continue;
            };
            // The slot CAS and the unlock travel in one batch to one node,
            // so the unlock takes effect after the CAS.
            let t = ctx.cas(RemoteRef::new(slot_addr, rk), 0, new.0);
            unlock(ctx);
            ctx.sync().await?;
            if ctx.value(t) == 0 {
                self.cache_put(h, slot_addr, new.0);
                return Ok(true);
            }
            // Another key took the slot (it shares the bucket, not our lock).
            ctx.note_retry();
        }
    }

    /// Replaces the value of `key` if present; `Ok(false)` if absent.
    pub async fn update(&self, ctx: &Ctx, key: &[u8], value: &[u8]) -> Result<bool, RaceError> {
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
        let prefer = match self.cache_get(&h) {
            Some((a, _)) => a.node(),
            None => self.subtable(ctx, &h).await?.node(),
        };
        let (block, units) = self.new_block(ctx, key, value, prefer)?;
        let new = Slot::new(h.fp(), units, block).ok_or_else(|| {
            RaceError::Config(format!(
                "block address {block} does not fit a 48-bit pointer"
            ))
        })?;
        let r = self.replace(ctx, key, &h, Some((block, new))).await;
        if !matches!(r, Ok(true)) {
            self.st.borrow_mut().alloc.free_now(block, units);
        }
        r
    }

    /// Removes `key`; `Ok(false)` if it was absent.
    pub async fn delete(&self, ctx: &Ctx, key: &[u8]) -> Result<bool, RaceError> {
        self.check_key(ctx, key)?;
        let _op = ctx.op("delete").await;
        if let Some((h, rank)) = self.hot_rank(key) {
            return Ok(self.hot_op(ctx, h, rank, HotOp::Delete).await?.applied);
        }
        let h = self.hash(key);
        self.replace(ctx, key, &h, None).await
    }

    /// CASes the key's slot to `new` (a fresh block) or to empty.
    async fn replace(
        &self,
        ctx: &Ctx,
        key: &[u8],
        h: &KeyHash,
        new: Option<(GlobalAddr, Slot)>,
    ) -> Result<bool, RaceError> {
        let mut written = false;
        loop {
            // The slot and the word it held when read, and when that was.
            // A cached word is re-read with its block first: a slot word can
            // recur for another key (same fingerprint and length, recycled
            // block), and a CAS on a stale word would then hit that key.
            let cached = match self.cache_get(h) {
                Some((a, w)) => {
                    let t0 = ctx.now();
                    let (slot, cand) = (Slot(w), self.l_cand());
                    ctx.read(
                        RemoteRef::new(a, self.t.rkey(a.node())?),
                        Local::at(L_SLOT, 8),
                    );
                    ctx.read(
                        RemoteRef::new(slot.block(), self.t.rkey(slot.block().node())?),
                        Local::at(cand, slot.block_bytes()),
                    );
                    ctx.sync().await?;
                    let same = ctx.local_u64(Local::at(L_SLOT, 8)) == w
                        && self.with_block(ctx, cand, slot.block_bytes(), |b| {
                            b.is_some_and(|(k, _)| k == key)
                        });
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
                ctx.write(
                    RemoteRef::new(block, self.t.rkey(block.node())?),
                    Local::at(L_NEW, s.block_bytes()),
                );
                if block.node() != slot_addr.node() {
                    ctx.sync().await?;
                }
                written = true;
            }
            // The word must still be the key's when the CAS lands: within the
            // stall bound of reading it (see `stalled`).
            if self.stalled(ctx, t0) {
                continue;
            }
            let rk = self.t.rkey(slot_addr.node())?;
            // The block WRITE (same node) goes out in the CAS's batch, ahead of it.
            let old = ctx
                .backoff_cas(RemoteRef::new(slot_addr, rk), expected, desired)
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
            self.cache_drop(h);
        }
    }

    /// Splits subtable `sub` (when no other client is splitting it):
    /// freeze the keys that move, copy them to the new subtable, flip the
    /// old buckets' headers, publish in the directory, release.
    async fn split(&self, ctx: &Ctx, sub: GlobalAddr) -> Result<(), RaceError> {
        let rk = self.t.rkey(sub.node())?;
        let owner = self.st.borrow().owner;
        let lock = sub.add(SUB_SPLIT_LOCK);
        if ctx.cas_sync(RemoteRef::new(lock, rk), 0, owner).await? != 0 {
            // Someone else splits it; let them finish.
            ctx.backoff().await;
            return Ok(());
        }
        let r = self.split_locked(ctx, sub, rk).await;
        ctx.set_local_u64(Local::at(L_ZERO, 8), 0);
        ctx.write(RemoteRef::new(lock, rk), Local::at(L_ZERO, 8));
        let unlocked = ctx.sync().await;
        r?;
        unlocked?;
        self.st.borrow_mut().counters.splits += 1;
        Ok(())
    }

    async fn split_locked(&self, ctx: &Ctx, sub: GlobalAddr, rk: Rkey) -> Result<(), RaceError> {
        let geo = self.t.geo;
        let sc = self.l_scratch();
        ctx.read_sync(RemoteRef::new(sub, rk), Local::at(sc, 64))
            .await?;
        let hdr = ctx.local_vec(Local::at(sc, 64));
        let (depth, suffix) = (
            word(&hdr, SUB_DEPTH as usize) as u32,
            word(&hdr, SUB_DEPTH as usize + 8),
        );
        if word(&hdr, 0) != SUBTABLE_MAGIC || depth > MAX_DEPTH_LIMIT {
            return Err(RaceError::Corrupt {
                addr: sub,
                what: "subtable header",
            });
        }
        if depth >= self.t.cfg.max_depth {
            return Err(RaceError::TableFull {
                suffix,
                max_depth: self.t.cfg.max_depth,
            });
        }
        let suffix2 = suffix | 1 << depth;
        // 1. The new subtable, fully initialised before anyone can see it.
        let nodes = &self.t.nodes;
        let first = (suffix2 as usize) % nodes.len();
        let mut new = None;
        let mut err = None;
        for i in 0..nodes.len() {
            match self
                .t
                .fabric
                .alloc_chunk(nodes[(first + i) % nodes.len()], geo.bytes(), true)
            {
                Ok((a, _, _)) => {
                    new = Some(a);
                    break;
                }
                Err(e) => err = Some(e),
            }
        }
        let Some(new) = new else {
            return Err(RaceError::OutOfMemory {
                what: "splitting a subtable",
                source: err.expect("a node was tried"),
            });
        };
        let nrk = self.t.rkey(new.node())?;
        let Some(new_entry) = dir_entry(depth + 1, new) else {
            let _ = self.t.fabric.free_chunk(new);
            return Err(RaceError::Config(format!(
                "subtable address {new} does not fit a 48-bit pointer"
            )));
        };
        let mut at = 0;
        while at < geo.bytes() {
            let n = (geo.bytes() - at).min(SCRATCH as u64) as usize;
            ctx.put_local(
                Local::at(sc, subtable_image(geo, depth + 1, suffix2, at, n).len()),
                &subtable_image(geo, depth + 1, suffix2, at, n),
            );
            ctx.write_sync(RemoteRef::new(new.add(at), nrk), Local::at(sc, n))
                .await?;
            at += n as u64;
        }
        // 2. Wait out inserters that took a lock before the split lock was set;
        //    later ones see the split lock and back off without writing.
        let combs = geo.combs() as usize;
        let mut clear = vec![false; combs];
        let per = SCRATCH / 8;
        while clear.iter().any(|c| !c) {
            for start in (0..combs).step_by(per) {
                let n = per.min(combs - start);
                if clear[start..start + n].iter().all(|&c| c) {
                    continue;
                }
                ctx.read_sync(
                    RemoteRef::new(sub.add(geo.lock_at(start as u64)), rk),
                    Local::at(sc, n * 8),
                )
                .await?;
                for i in 0..n {
                    if ctx.local_u64(Local::at(sc + 8 * i, 8)) == 0 {
                        clear[start + i] = true;
                    }
                }
            }
            if clear.iter().any(|c| !c) {
                ctx.backoff().await;
            }
        }
        // 3. Freeze the slots whose keys move, group by group.
        let prefix = (BLOCK_HEADER + self.t.cfg.max_key).next_multiple_of(8);
        let half = SCRATCH / 2;
        let per_piece = (half as u64 / GROUP_BYTES).max(1);
        let mut moved: Vec<(u64, u64)> = Vec::new();
        let mut g0 = 0;
        while g0 < geo.groups {
            let ng = per_piece.min(geo.groups - g0);
            let piece_at = geo.groups_at() + g0 * GROUP_BYTES;
            ctx.read_sync(
                RemoteRef::new(sub.add(piece_at), rk),
                Local::at(sc, (ng * GROUP_BYTES) as usize),
            )
            .await?;
            let mut live: Vec<(u64, Slot)> = Vec::new();
            for b in 0..ng * 3 {
                for j in 0..SLOTS_PER_BUCKET as u64 {
                    let off = b * BUCKET_BYTES + 8 + 8 * j;
                    let s = Slot(ctx.local_u64(Local::at(sc + off as usize, 8)));
                    if !s.is_empty() && !s.moved() {
                        live.push((piece_at + off, s));
                    }
                }
            }
            let per_round = (half / prefix).clamp(1, 64);
            for round in live.chunks(per_round) {
                for (i, (_, s)) in round.iter().enumerate() {
                    let n = prefix.min(s.block_bytes());
                    ctx.read(
                        RemoteRef::new(s.block(), self.t.rkey(s.block().node())?),
                        Local::at(sc + half + i * prefix, n),
                    );
                }
                ctx.sync().await?;
                let mut to_freeze = Vec::new();
                for (i, &(off, s)) in round.iter().enumerate() {
                    let b = ctx.local_vec(Local::at(
                        sc + half + i * prefix,
                        prefix.min(s.block_bytes()),
                    ));
                    let key = block_key(&b).ok_or(RaceError::Corrupt {
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
                        .map(|&(off, s)| {
                            ctx.cas(RemoteRef::new(sub.add(off), rk), s.0, s.frozen().0)
                        })
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
        // 4. Copy the frozen keys to the same positions in the new subtable.
        for piece in moved.chunks(SCRATCH / 8) {
            for (i, &(off, w)) in piece.iter().enumerate() {
                ctx.set_local_u64(Local::at(sc + 8 * i, 8), w);
                ctx.write(RemoteRef::new(new.add(off), nrk), Local::at(sc + 8 * i, 8));
            }
            ctx.sync().await?;
        }
        // 5. Old buckets now cover one more suffix bit.
        ctx.set_local_u64(Local::at(L_E1, 8), bucket_header(depth + 1, suffix));
        ctx.set_local_u64(Local::at(L_E2, 8), (depth + 1) as u64);
        ctx.write(RemoteRef::new(sub.add(SUB_DEPTH), rk), Local::at(L_E2, 8));
        for b in 0..3 * geo.groups {
            ctx.write(
                RemoteRef::new(sub.add(geo.groups_at() + b * BUCKET_BYTES), rk),
                Local::at(L_E1, 8),
            );
            if b % 128 == 127 {
                ctx.sync().await?;
            }
        }
        ctx.sync().await?;
        // 6. Publish.
        let old_entry = dir_entry(depth + 1, sub).expect("an existing subtable's address fits");
        self.publish(ctx, depth, suffix, old_entry, new_entry)
            .await?;
        // 7. Clear the frozen originals. Readers that read them before the
        //    flip fail their header check (see `queue_combs`) and retry.
        ctx.set_local_u64(Local::at(L_ZERO, 8), 0);
        for piece in moved.chunks(128) {
            for &(off, _) in piece {
                ctx.write(RemoteRef::new(sub.add(off), rk), Local::at(L_ZERO, 8));
            }
            ctx.sync().await?;
        }
        Ok(())
    }

    /// Points the directory's entries of suffix·0 at the old subtable and
    /// suffix·1 at the new one, doubling the directory when needed.
    async fn publish(
        &self,
        ctx: &Ctx,
        depth: u32,
        suffix: u64,
        old_entry: u64,
        new_entry: u64,
    ) -> Result<(), RaceError> {
        let dir = self.t.dir;
        let rk = self.t.rkey(dir.node())?;
        let owner = self.st.borrow().owner;
        while ctx
            .cas_sync(RemoteRef::new(dir.add(DIR_LOCK), rk), 0, owner)
            .await?
            != 0
        {
            ctx.backoff().await;
        }
        let r = self
            .publish_locked(ctx, depth, suffix, old_entry, new_entry)
            .await;
        ctx.set_local_u64(Local::at(L_ZERO, 8), 0);
        ctx.write(RemoteRef::new(dir.add(DIR_LOCK), rk), Local::at(L_ZERO, 8));
        let unlocked = ctx.sync().await;
        r?;
        Ok(unlocked?)
    }

    async fn publish_locked(
        &self,
        ctx: &Ctx,
        depth: u32,
        suffix: u64,
        old_entry: u64,
        new_entry: u64,
    ) -> Result<(), RaceError> {
        let dir = self.t.dir;
        let rk = self.t.rkey(dir.node())?;
        let sc = self.l_scratch();
        ctx.read_sync(
            RemoteRef::new(dir.add(DIR_GLOBAL_DEPTH), rk),
            Local::at(L_WORD, 8),
        )
        .await?;
        let mut g = ctx.local_u64(Local::at(L_WORD, 8)) as u32;
        if depth > g || g > self.t.cfg.max_depth {
            return Err(RaceError::Corrupt {
                addr: dir,
                what: "directory (depth above global depth)",
            });
        }
        if depth == g {
            // Double: the upper half copies the lower, then the depth grows.
            let n = 1usize << g;
            let per = SCRATCH / 8;
            for start in (0..n).step_by(per) {
                let k = per.min(n - start);
                ctx.read_sync(
                    RemoteRef::new(dir.add(DIR_ENTRIES + 8 * start as u64), rk),
                    Local::at(sc, 8 * k),
                )
                .await?;
                ctx.write_sync(
                    RemoteRef::new(dir.add(DIR_ENTRIES + 8 * (n + start) as u64), rk),
                    Local::at(sc, 8 * k),
                )
                .await?;
            }
            g += 1;
            ctx.set_local_u64(Local::at(L_WORD, 8), g as u64);
            ctx.write_sync(
                RemoteRef::new(dir.add(DIR_GLOBAL_DEPTH), rk),
                Local::at(L_WORD, 8),
            )
            .await?;
        }
        ctx.set_local_u64(Local::at(L_E1, 8), old_entry);
        ctx.set_local_u64(Local::at(L_E2, 8), new_entry);
        let step = 1u64 << (depth + 1);
        let suffix2 = suffix | 1 << depth;
        let mut queued = 0;
        let mut st_updates = Vec::new();
        for (first, src, e) in [(suffix, L_E1, old_entry), (suffix2, L_E2, new_entry)] {
            let mut i = first;
            while i < 1 << g {
                ctx.write(
                    RemoteRef::new(dir.add(DIR_ENTRIES + 8 * i), rk),
                    Local::at(src, 8),
                );
                st_updates.push((i as usize, e));
                queued += 1;
                if queued % 128 == 0 {
                    ctx.sync().await?;
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

    /// Every live key-value pair, read subtable by subtable, with structural
    /// checks (magic, bucket headers, no duplicate keys). Meant for a
    /// quiescent table (tests, tools); concurrent writers make it a fuzzy
    /// snapshot.
    pub async fn entries(&self, ctx: &Ctx) -> Result<Vec<(Vec<u8>, Vec<u8>)>, RaceError> {
        let dir = self.t.dir;
        let rk = self.t.rkey(dir.node())?;
        let sc = self.l_scratch();
        let geo = self.t.geo;
        ctx.read_sync(
            RemoteRef::new(dir.add(DIR_GLOBAL_DEPTH), rk),
            Local::at(L_WORD, 8),
        )
        .await?;
        let g = ctx.local_u64(Local::at(L_WORD, 8)) as u32;
        let n = 1usize << g;
        let mut subs = std::collections::BTreeSet::new();
        let per = SCRATCH / 8;
        for start in (0..n).step_by(per) {
            let k = per.min(n - start);
            ctx.read_sync(
                RemoteRef::new(dir.add(DIR_ENTRIES + 8 * start as u64), rk),
                Local::at(sc, 8 * k),
            )
            .await?;
            for i in 0..k {
                subs.insert(unptr48(ctx.local_u64(Local::at(sc + 8 * i, 8))).raw());
            }
        }
        let mut out = Vec::new();
        let mut seen = std::collections::HashSet::new();
        for sub in subs.into_iter().map(GlobalAddr::from_raw) {
            let srk = self.t.rkey(sub.node())?;
            ctx.read_sync(RemoteRef::new(sub, srk), Local::at(sc, 64))
                .await?;
            let hdr = ctx.local_vec(Local::at(sc, 64));
            if word(&hdr, 0) != SUBTABLE_MAGIC {
                return Err(RaceError::Corrupt {
                    addr: sub,
                    what: "subtable header",
                });
            }
            let (depth, suffix) = (
                word(&hdr, SUB_DEPTH as usize) as u32,
                word(&hdr, SUB_DEPTH as usize + 8),
            );
            let expect_header = bucket_header(depth, suffix);
            for gi in 0..geo.groups {
                ctx.read_sync(
                    RemoteRef::new(sub.add(geo.groups_at() + gi * GROUP_BYTES), srk),
                    Local::at(sc, GROUP_BYTES as usize),
                )
                .await?;
                let grp = ctx.local_vec(Local::at(sc, GROUP_BYTES as usize));
                for b in 0..3 {
                    if word(&grp, b * 64) != expect_header {
                        return Err(RaceError::Corrupt {
                            addr: sub,
                            what: "bucket header (does not match its subtable)",
                        });
                    }
                    for j in 0..SLOTS_PER_BUCKET {
                        let s = Slot(word(&grp, b * 64 + 8 + 8 * j));
                        if s.is_empty() || s.moved() {
                            continue;
                        }
                        ctx.read_sync(
                            RemoteRef::new(s.block(), self.t.rkey(s.block().node())?),
                            Local::at(sc + 256, s.block_bytes()),
                        )
                        .await?;
                        let blk = ctx.local_vec(Local::at(sc + 256, s.block_bytes()));
                        let (k, v) = decode_block(&blk).ok_or(RaceError::Corrupt {
                            addr: s.block(),
                            what: "key-value block (checksum)",
                        })?;
                        let h = self.hash(k);
                        if h.h1 & mask(depth) != suffix || h.fp() != s.fp() {
                            return Err(RaceError::Corrupt {
                                addr: s.block(),
                                what: "key in the wrong subtable or with a wrong fingerprint",
                            });
                        }
                        if !seen.insert(k.to_vec()) {
                            return Err(RaceError::Corrupt {
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
                .entries(ctx, &h.local, h.owner, |n| self.t.rkey(n), sc)
                .await?
            {
                if !seen.insert(k.clone()) {
                    return Err(RaceError::Corrupt {
                        addr: h.area.dir,
                        what: "hot key also present in the table",
                    });
                }
                out.push((k, v));
            }
        }
        Ok(out)
    }
}
