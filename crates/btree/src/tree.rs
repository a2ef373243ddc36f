//! The tree: creation, the per-worker client and its operations. The
//! protocols are described in the crate docs.

use std::cell::RefCell;
use std::rc::Rc;
use std::sync::Arc;

use dmkit_fabric::{Fabric, GlobalAddr, RemoteRef};
use dmkit_index::{
    ClientStats, Creation, Entries, Home, IndexConfig, IndexError, LeaseConfig, MapClient,
    RemoteMap, Retry, RetryPolicy, Shape,
};
use dmkit_runtime::hash::fmix64;
use dmkit_runtime::keys::{tree_key, untree_key};
use dmkit_runtime::machine::{PerMachine, TicketGrant, TicketLocks};
use dmkit_runtime::{Ctx, Local, LocalLayout};
use zerocopy::{FromBytes, IntoBytes};

use crate::alloc::NodeAlloc;
use crate::cache::{parent_of_leaf, InnerCache, Snapshot, SpecCache};
use crate::hocl::local_locks;
use crate::layout::*;

/// The structure's kind: its roots are `btree/NAME`.
pub const KIND: &str = "btree";

/// Configuration of a tree (structure) and of its clients. With the `cli`
/// feature it is a set of command-line flags (`clap::Args`): the switches
/// and client settings are flags, the key and value limits come from the
/// workload ([`IndexConfig::fit`]).
#[derive(Debug, Clone, PartialEq)]
#[cfg_attr(feature = "cli", derive(clap::Args))]
#[cfg_attr(feature = "cli", command(next_help_heading = "B+tree (--index btree)"))]
pub struct BtreeConfig {
    /// Longest key in bytes (stored in the tree; 1..=254).
    #[cfg_attr(feature = "cli", arg(skip = BtreeConfig::default().max_key))]
    pub max_key: usize,
    /// Every key is exactly `max_key` bytes (e.g. 8-byte integers; stored
    /// in the tree): tree keys need no length byte, so slots and fences are
    /// up to 8 bytes smaller and a leaf nearer Sherman's size. Keys of any
    /// other length are refused.
    #[cfg_attr(feature = "cli", arg(skip))]
    pub fixed_keys: bool,
    /// Longest value in bytes (stored in the tree).
    #[cfg_attr(feature = "cli", arg(skip = BtreeConfig::default().max_value))]
    pub max_value: usize,
    /// B+tree: node size (a multiple of 64 bytes; ignored with
    /// --btree-span).
    #[cfg_attr(
        feature = "cli",
        arg(long = "btree-node", id = "btree_node", value_name = "SIZE", default_value = "1KiB",
            value_parser = dmkit_index::cli::parse_size)
    )]
    pub node_bytes: usize,
    /// B+tree: leaf entries per node (Sherman's span); sets the node size
    /// to the smallest that holds them.
    #[cfg_attr(
        feature = "cli",
        arg(long = "btree-span", id = "btree_span", value_name = "N")
    )]
    pub span: Option<usize>,
    /// B+tree: bytes of internal nodes each compute machine caches, shared
    /// by its threads (0 disables).
    #[cfg_attr(
        feature = "cli",
        arg(long = "btree-cache", id = "btree_cache", value_name = "SIZE", default_value = "64MiB",
            value_parser = dmkit_index::cli::parse_size)
    )]
    pub cache_bytes: usize,
    /// B+tree: SMART-BT's speculative lookup (a search first reads only the
    /// slot a small cache remembers for the key).
    #[cfg_attr(
        feature = "cli",
        arg(long = "speculative", id = "btree_speculative", value_name = "on|off",
            default_value = "on", value_parser = dmkit_index::cli::parse_switch,
            action = clap::ArgAction::Set)
    )]
    pub speculative: bool,
    /// Entries of the speculative-lookup table of each compute machine
    /// (two-way set-associative, 16 bytes each).
    #[cfg_attr(feature = "cli", arg(skip = BtreeConfig::default().spec_entries))]
    pub spec_entries: usize,
    /// B+tree: Sherman's hierarchical locks (clients of a machine queue on
    /// a local lock table and hand remote locks over; off: every client
    /// retries the remote CAS itself).
    #[cfg_attr(
        feature = "cli",
        arg(long = "hocl", id = "btree_hocl", value_name = "on|off",
            default_value = "on", value_parser = dmkit_index::cli::parse_switch,
            action = clap::ArgAction::Set)
    )]
    pub hocl: bool,
    /// B+tree: HOCL hand-overs to local waiters before a remote release.
    #[cfg_attr(
        feature = "cli",
        arg(long = "max-handover", id = "btree_max_handover", value_name = "N",
            default_value_t = BtreeConfig::default().max_handover)
    )]
    pub max_handover: u32,
    /// B+tree: Sherman's command combination — lock CAS with the node READ,
    /// entry WRITE with the unlock, one round trip each (off: SMART's
    /// artifact B+tree, four round trips per write).
    #[cfg_attr(
        feature = "cli",
        arg(long = "combine", id = "btree_combine", value_name = "on|off",
            default_value = "on", value_parser = dmkit_index::cli::parse_switch,
            action = clap::ArgAction::Set)
    )]
    pub combine: bool,
    /// B+tree: lock tables in on-NIC device memory where the fabric has it.
    #[cfg_attr(
        feature = "cli",
        arg(long = "on-chip-locks", id = "btree_on_chip_locks", value_name = "on|off",
            default_value = "on", value_parser = dmkit_index::cli::parse_switch,
            action = clap::ArgAction::Set)
    )]
    pub on_chip_locks: bool,
    /// Bytes a client asks the memory node for at a time for its nodes.
    #[cfg_attr(feature = "cli", arg(skip = BtreeConfig::default().chunk_bytes))]
    pub chunk_bytes: u64,
    /// How long an operation keeps retrying before it gives up.
    #[cfg_attr(feature = "cli", arg(skip))]
    pub retry: RetryPolicy,
    /// Leases of the tree's node locks: how long a client that died holding
    /// one blocks it.
    #[cfg_attr(feature = "cli", arg(skip))]
    pub lease: LeaseConfig,
}

impl Default for BtreeConfig {
    fn default() -> Self {
        Self {
            max_key: 32,
            fixed_keys: false,
            max_value: 64,
            node_bytes: 1024,
            span: None,
            cache_bytes: 64 << 20,
            speculative: true,
            spec_entries: 1 << 20,
            hocl: true,
            max_handover: 4,
            combine: true,
            on_chip_locks: true,
            chunk_bytes: 4 << 20,
            retry: RetryPolicy::default(),
            lease: LeaseConfig::default(),
        }
    }
}

impl BtreeConfig {
    /// The node geometry this configuration gives.
    pub fn geometry(&self) -> Result<Geometry, IndexError> {
        let nb = match self.span {
            Some(s) => {
                Geometry::node_bytes_for_span(self.max_key, self.max_value, self.fixed_keys, s)
            }
            None => self.node_bytes,
        };
        let bad = |why: String| IndexError::config(KIND, why);
        let g = Geometry::new(self.max_key, self.max_value, self.fixed_keys, nb).map_err(bad)?;
        if self.chunk_bytes < nb as u64 * 4 {
            return Err(bad(format!(
                "chunk_bytes {} is too small for {nb}-byte nodes",
                self.chunk_bytes
            )));
        }
        self.lease.validate().map_err(bad)?;
        Ok(g)
    }
}

impl IndexConfig for BtreeConfig {
    /// The shape's key and value limits (values at least 8 bytes); keys
    /// all of one length (integers) are stored without a length byte, as
    /// Sherman stores 8-byte keys.
    fn fit(&mut self, shape: &Shape) {
        self.max_key = shape.max_key;
        self.fixed_keys = shape.fixed_keys;
        self.max_value = shape.max_value.max(8);
    }

    fn key_limits(&self) -> (usize, usize) {
        (if self.fixed_keys { self.max_key } else { 1 }, self.max_key)
    }

    fn max_value(&self) -> usize {
        self.max_value
    }

    /// Leaves at the fill a split leaves (half) for every key, twice
    /// (inserts of new keys), internal nodes, two node chunks per client
    /// and 64 MiB of slack (the lock tables among it).
    fn memory_estimate(&self, shape: &Shape) -> u64 {
        let mut c = self.clone();
        c.fit(shape);
        let Ok(g) = c.geometry() else {
            return 64 << 20;
        };
        let leaves = (2 * shape.keys).div_ceil((g.leaf_span as u64 / 2).max(1));
        (leaves + leaves / (g.inner_span as u64 / 2).max(1) + 1) * g.node_bytes as u64
            + shape.clients as u64 * 2 * c.chunk_bytes
            + (64 << 20)
    }
}

/// Counters of the tree's own making (beyond the runtime's).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct TreeCounters {
    /// Lookups that found their leaf through a cached level-1 node.
    pub cache_hits: u64,
    /// Lookups that found no cached level-1 node covering their key and
    /// descended from the root (or the cache is off).
    pub cache_misses: u64,
    /// Searches answered by the speculative read of one slot.
    pub spec_hits: u64,
    /// Speculative reads that did not validate (fell back).
    pub spec_misses: u64,
    /// Leaf splits: a full leaf split into two, the new right half linked as
    /// its sibling.
    pub leaf_splits: u64,
    /// Internal node splits (an insert into a full parent).
    pub inner_splits: u64,
    /// New roots installed above a split root (the tree grew a level).
    pub root_grows: u64,
    /// Moves right along sibling pointers (a split not yet in the parent,
    /// or a stale cached parent).
    pub sibling_hops: u64,
    /// Restarts from the root (a stale cache entry).
    pub restarts: u64,
    /// Node reads refused as torn (header checksum, or a slot of another
    /// version or with a bad checksum); each is read again.
    pub torn_reads: u64,
    /// Remote locks taken over from a local holder (HOCL) instead of CAS.
    pub handovers: u64,
    /// Failed remote lock CAS.
    pub lock_retries: u64,
    /// Expired leases this client broke (node locks of clients that died
    /// holding them).
    pub leases_broken: u64,
    /// Leases this client lost while it held them (its worker stalled past
    /// the lease and another client broke the lock): nothing was written,
    /// and the step started over.
    pub leases_lost: u64,
}

/// The task-local memory of the tree's operations, declared once per tree
/// (see [`dmkit_runtime::LocalLayout`]).
#[derive(Debug, Clone, Copy)]
struct Scratch {
    /// A node image read (READs land here).
    node: Local,
    /// A node image written back under its lock.
    back: Local,
    /// A new node, written before the write that links it.
    fresh: Local,
    /// The root word read from the descriptor; the zero an unlock writes.
    word: Local,
    /// A leaf slot written, or read alone (speculative lookup).
    slot: Local,
}

impl Scratch {
    fn declare(g: &Geometry) -> (Self, LocalLayout) {
        let mut l = LocalLayout::new();
        let s = Scratch {
            node: l.region("node read", g.node_bytes),
            back: l.region("node written back", g.node_bytes),
            fresh: l.region("new node", g.node_bytes),
            word: l.region("root or lock word", 8),
            slot: l.region("leaf slot", g.leaf_slot),
        };
        (s, l)
    }
}

/// A tree: what every client of it shares. `Send + Sync`; make one
/// [`BtreeClient`] per worker with [`RemoteMap::client`].
pub struct Btree {
    /// What the tree keeps of its identity (fabric, nodes and keys,
    /// descriptor).
    pub(crate) home: Home,
    cfg: BtreeConfig,
    g: Geometry,
    /// The root when the handle was made (clients' first guess).
    root: GlobalAddr,
    /// Each memory node's lock table, in `home.nodes()` order.
    locks: Vec<GlobalAddr>,
    on_chip: bool,
    scratch: Scratch,
    layout: LocalLayout,
    /// Local lock tables per compute machine (HOCL).
    local: PerMachine<TicketLocks>,
    /// Caches of internal nodes, one per compute machine.
    caches: PerMachine<InnerCache>,
    /// Speculative-lookup tables per compute machine.
    spec: PerMachine<SpecCache>,
}

impl Btree {
    fn assemble(
        home: Home,
        cfg: BtreeConfig,
        g: Geometry,
        root: GlobalAddr,
        locks: Vec<GlobalAddr>,
        on_chip: bool,
    ) -> Self {
        let (scratch, layout) = Scratch::declare(&g);
        Self {
            home,
            cfg,
            g,
            root,
            locks,
            on_chip,
            scratch,
            layout,
            local: PerMachine::default(),
            caches: PerMachine::default(),
            spec: PerMachine::default(),
        }
    }

    /// The node geometry (sizes, spans).
    pub fn geometry(&self) -> &Geometry {
        &self.g
    }

    /// The lock tables, one per memory node: `[start, end)` of each (what a
    /// switch that turns lock CASes into WRITEs is told are lock words).
    pub fn lock_tables(&self) -> Vec<(GlobalAddr, GlobalAddr)> {
        self.locks
            .iter()
            .map(|&l| (l, l.add(LOCK_WORDS * 8)))
            .collect()
    }

    /// Whether the lock tables are in on-NIC device memory.
    pub fn locks_on_chip(&self) -> bool {
        self.on_chip
    }

    /// The lock word of tree node `addr` and its local-table index.
    fn lock_of(&self, addr: GlobalAddr) -> Result<(RemoteRef, usize), IndexError> {
        let p = self
            .home
            .nodes()
            .iter()
            .position(|&n| n == addr.node())
            .ok_or(dmkit_fabric::FabricError::NoSuchNode(addr.node()))?;
        let w = fmix64(addr.raw()) % LOCK_WORDS;
        Ok((
            self.home.remote(self.locks[p].add(8 * w))?,
            p * LOCK_WORDS as usize + w as usize,
        ))
    }
}

impl RemoteMap for Btree {
    const KIND: &'static str = KIND;
    const ORDERED: bool = true;
    type Config = BtreeConfig;
    type Client = BtreeClient;

    /// Creates tree `name`: descriptor and root leaf on the lowest memory
    /// node, a lock table on every memory node (in device memory if the
    /// fabric has it and `on_chip_locks`), registered as a named root.
    /// Nothing is left behind if it fails.
    fn create(
        fabric: Arc<dyn Fabric>,
        name: &str,
        cfg: BtreeConfig,
    ) -> Result<Arc<Self>, IndexError> {
        let g = cfg.geometry()?;
        let mut c = Creation::begin(fabric, KIND, name, &[])?;
        let nodes = c.nodes().to_vec();
        let desc_len = desc_bytes(nodes.len()).next_multiple_of(64) as u64;
        let desc = c.alloc(
            c.home(),
            desc_len + g.node_bytes as u64,
            "allocating the root",
        )?;
        let root = desc.add(desc_len);
        let mut locks = Vec::new();
        let mut on_chip = cfg.on_chip_locks;
        for &n in &nodes {
            let l = c.alloc(n, LOCK_WORDS * 8, "allocating a lock table")?;
            if cfg.on_chip_locks {
                on_chip &= c.fabric().place_in_device_memory(l, LOCK_WORDS * 8);
            }
            locks.push(l);
        }
        let mut img = Vec::new();
        build_node(
            &g,
            &root_head(1, 0, GlobalAddr::NULL),
            std::iter::empty(),
            &mut img,
        );
        c.write(root, &img)?;
        let head = DescHead {
            magic: DESC_MAGIC.word(),
            root: root.raw(),
            max_key: cfg.max_key as u64 | if cfg.fixed_keys { FIXED_KEYS } else { 0 },
            max_value: cfg.max_value as u64,
            node_bytes: g.node_bytes as u64,
            nlocks: nodes.len() as u64,
        };
        let lock_words: Vec<u64> = locks.iter().map(|l| l.raw()).collect();
        c.write(desc, &[head.as_bytes(), lock_words.as_bytes()].concat())?;
        let home = c.publish(desc)?;
        let cfg = BtreeConfig {
            node_bytes: g.node_bytes,
            ..cfg
        };
        Ok(Arc::new(Self::assemble(home, cfg, g, root, locks, on_chip)))
    }

    /// Opens tree `name`. Structural settings (key and value limits, node
    /// size) come from the tree; `cfg` supplies the client-side ones.
    fn open(
        fabric: Arc<dyn Fabric>,
        name: &str,
        cfg: BtreeConfig,
    ) -> Result<Arc<Self>, IndexError> {
        let nodes = fabric.nodes().len();
        let (home, d) =
            dmkit_index::lifecycle::open(fabric, KIND, name, DESC_MAGIC, desc_bytes(nodes))?;
        let corrupt = IndexError::Corrupt {
            addr: home.desc(),
            what: "tree descriptor (or a fabric with other memory nodes)",
        };
        let Ok((h, rest)) = DescHead::read_from_prefix(&d) else {
            return Err(corrupt);
        };
        let mut locks = vec![0u64; nodes];
        match rest.get(..locks.as_bytes().len()) {
            Some(words) if h.nlocks as usize == nodes => {
                locks.as_mut_bytes().copy_from_slice(words)
            }
            _ => return Err(corrupt),
        }
        let cfg = BtreeConfig {
            max_key: (h.max_key & !FIXED_KEYS) as usize,
            fixed_keys: h.max_key & FIXED_KEYS != 0,
            max_value: h.max_value as usize,
            node_bytes: h.node_bytes as usize,
            span: None,
            ..cfg
        };
        let g = cfg.geometry()?;
        let locks = locks.iter().map(|&w| GlobalAddr::from_raw(w)).collect();
        let root = GlobalAddr::from_raw(h.root);
        Ok(Arc::new(Self::assemble(home, cfg, g, root, locks, false)))
    }

    /// Drops this handle's hold on the tree; the last holder's drop (or
    /// death) frees all of its memory, whichever process took it, and its
    /// name (see `dmkit_index::lifecycle`). No client of this handle may
    /// use the tree afterwards.
    fn destroy(&self) -> Result<(), IndexError> {
        self.home.destroy()
    }

    /// A client for one worker on compute machine `machine`: clients of one
    /// machine share its local lock table (HOCL) and its caches. `id` names
    /// lock holders; make it unique among the tree's live clients.
    fn client_on(self: &Arc<Self>, machine: usize, id: u64) -> BtreeClient {
        let locks = self.cfg.hocl.then(|| {
            self.local.get(machine, || {
                local_locks(self.home.nodes().len(), self.cfg.max_handover)
            })
        });
        let cache = self
            .caches
            .get(machine, || InnerCache::new(self.cfg.cache_bytes, None));
        let spec = self.spec.get(machine, || {
            SpecCache::new(if self.cfg.speculative {
                self.cfg.spec_entries
            } else {
                0
            })
        });
        BtreeClient {
            t: self.clone(),
            locks,
            cache,
            spec,
            st: Rc::new(RefCell::new(ClientState {
                alloc: NodeAlloc::new(self.g.node_bytes, self.cfg.chunk_bytes, self.home.group()),
                owner: dmkit_index::lease::owner_of(id),
                root: self.root,
                root_known: false,
                next_node: id as usize,
                counters: TreeCounters::default(),
            })),
        }
    }

    fn local_layout(&self) -> &LocalLayout {
        &self.layout
    }

    fn config(&self) -> &BtreeConfig {
        &self.cfg
    }

    fn name(&self) -> &str {
        self.home.name()
    }
}

fn root_head(version: u32, level: u8, leftmost: GlobalAddr) -> HeadFields {
    HeadFields {
        version,
        level,
        count: 0,
        sibling: GlobalAddr::NULL,
        leftmost,
        lo: Fence::NegInf,
        hi: Fence::PosInf,
    }
}

struct ClientState {
    alloc: NodeAlloc,
    /// Lock owner id (`dmkit_index::lease::owner_of` of the client id).
    owner: u16,
    /// The root as this client last knew it (a stale root is only slower:
    /// every level is reachable along sibling pointers).
    root: GlobalAddr,
    /// Whether `root` was read from the descriptor by this client.
    root_known: bool,
    /// The memory node this client puts new nodes on (if it has room).
    next_node: usize,
    counters: TreeCounters,
}

/// A worker's handle on a tree. Clone it into the worker's tasks; not
/// `Send` (one per worker).
#[derive(Clone)]
pub struct BtreeClient {
    t: Arc<Btree>,
    locks: Option<Arc<TicketLocks>>,
    /// The machine's cache of internal nodes (never locked across an
    /// await).
    cache: Arc<InnerCache>,
    spec: Arc<SpecCache>,
    st: Rc<RefCell<ClientState>>,
}

/// A held node lock.
struct Held {
    /// The node it locks.
    node: GlobalAddr,
    /// Its word in the memory node's lock table.
    lock: RemoteRef,
    /// What the lock word holds: our owner id and lease.
    word: u64,
    grant: Option<TicketGrant>,
}

/// A node image read by this operation.
struct Img {
    at: RemoteRef,
    b: Vec<u8>,
}

/// Write operations sharing one traversal loop.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum WriteMode {
    Insert,
    Update,
    Delete,
}

/// Attempts that may use the cache (later ones traverse from the root).
const CACHED_ATTEMPTS: u32 = 3;
/// Sibling hops a writer walks before it descends afresh instead.
const MAX_WALK: u32 = 2;
/// Deepest tree a traversal expects.
const MAX_LEVELS: usize = 32;

impl BtreeClient {
    /// The tree.
    pub fn tree(&self) -> &Arc<Btree> {
        &self.t
    }

    /// This client's counters.
    pub fn counters(&self) -> TreeCounters {
        self.st.borrow().counters
    }

    /// Snapshots the cache holds and their bytes; entries of the
    /// machine's speculative table.
    pub fn cache_usage(&self) -> (usize, usize, usize) {
        (self.cache.len(), self.cache.bytes(), self.spec.len())
    }

    fn sc(&self) -> &Scratch {
        &self.t.scratch
    }

    fn retry(&self, op: &'static str) -> Retry {
        Retry::new(op, self.t.cfg.retry)
    }

    /// Whether the task has the memory the tree declared.
    fn check_local(&self, ctx: &Ctx) -> Result<(), IndexError> {
        dmkit_index::check_local(ctx, &self.t.layout)
    }

    /// The tree key of `key`, or why it is refused.
    fn check_key(&self, ctx: &Ctx, key: &[u8]) -> Result<Vec<u8>, IndexError> {
        let g = &self.t.g;
        if key.is_empty() || key.len() > g.max_key || (g.fixed_keys && key.len() != g.max_key) {
            return Err(IndexError::KeyLength {
                len: key.len(),
                min: if g.fixed_keys { g.max_key } else { 1 },
                max: g.max_key,
            });
        }
        self.check_local(ctx)?;
        if g.fixed_keys {
            return Ok(key.to_vec());
        }
        let mut tk = Vec::with_capacity(g.tk);
        tree_key(key, g.max_key, &mut tk);
        Ok(tk)
    }

    fn check_value(&self, value: &[u8]) -> Result<(), IndexError> {
        if value.len() > self.t.g.max_value {
            return Err(IndexError::ValueTooLarge {
                len: value.len(),
                max: self.t.g.max_value,
            });
        }
        Ok(())
    }

    fn count(&self, f: impl FnOnce(&mut TreeCounters)) {
        f(&mut self.st.borrow_mut().counters)
    }

    /// Caches the snapshot of an internal node (leaves are not cached).
    fn cache_put(&self, s: Arc<Snapshot>) {
        if s.level > 0 {
            self.cache.put(s);
        }
    }

    /// Reads the node at `addr` into local memory and validates it (every
    /// slot's checksum too), re-reading torn images.
    async fn read_node(&self, ctx: &Ctx, addr: GlobalAddr) -> Result<Img, IndexError> {
        let at = self.t.home.remote(addr)?;
        let node = self.sc().node;
        let mut retry = self.retry("node read");
        loop {
            ctx.read(at, node);
            ctx.sync().await?;
            let b = ctx.local_vec(node);
            if Node::new(&self.t.g, &b).check(true).is_ok() {
                return Ok(Img { at, b });
            }
            self.count(|c| c.torn_reads += 1);
            // A torn image is read again at once, then after backing off.
            if retry.attempts() > 2 {
                retry.backoff(ctx).await?;
            } else {
                retry.again(ctx)?;
            }
        }
    }

    /// Re-reads the root word of the descriptor.
    async fn refresh_root(&self, ctx: &Ctx) -> Result<GlobalAddr, IndexError> {
        let word = self.sc().word;
        ctx.read(self.t.home.remote(self.t.home.desc().add(DESC_ROOT))?, word);
        ctx.sync().await?;
        let r = GlobalAddr::from_raw(ctx.local_u64(word));
        let mut st = self.st.borrow_mut();
        st.root = r;
        st.root_known = true;
        Ok(r)
    }

    /// The snapshot of node `addr` (cached if allowed and present).
    async fn snapshot(
        &self,
        ctx: &Ctx,
        addr: GlobalAddr,
        use_cache: bool,
    ) -> Result<(Arc<Snapshot>, bool), IndexError> {
        if use_cache {
            if let Some(s) = self.cache.get_touch(addr) {
                return Ok((s, true));
            }
        }
        let img = self.read_node(ctx, addr).await?;
        let s = Arc::new(Snapshot::of(addr, &Node::new(&self.t.g, &img.b)));
        self.cache_put(s.clone());
        Ok((s, false))
    }

    /// Finds the node at `level` whose range should hold `tk`, by descent
    /// from the root; fills `path` (node per level above it). The node is
    /// found through its parent's child pointer, not read. `None`: the tree
    /// is not that tall.
    async fn descend(
        &self,
        ctx: &Ctx,
        tk: &[u8],
        level: u8,
        mut use_cache: bool,
        path: &mut [GlobalAddr; MAX_LEVELS],
    ) -> Result<Option<GlobalAddr>, IndexError> {
        let known = self.st.borrow().root_known;
        let mut addr = if known {
            self.st.borrow().root
        } else {
            self.refresh_root(ctx).await?
        };
        let mut retry = self.retry("descent");
        // The cached node that pointed here (dropped if it led astray).
        let mut from: Option<GlobalAddr> = None;
        // The level the node must have: a node's level never changes, so
        // a child or sibling pointer to another level is damage.
        let mut expect: Option<u8> = None;
        let mut hops = 0;
        loop {
            let (s, cached) = self.snapshot(ctx, addr, use_cache).await?;
            if expect.is_some_and(|l| l != s.level) {
                return Err(IndexError::Corrupt {
                    addr,
                    what: "node (its parent or left sibling names another level)",
                });
            }
            if !s.lo.le(tk) {
                // Only a stale cached path leads left of a key's node.
                self.cache.remove(addr);
                self.count(|c| c.restarts += 1);
                retry.lost(ctx)?;
                (use_cache, from, expect) = (false, None, None);
                addr = self.refresh_root(ctx).await?;
                continue;
            }
            if !s.hi.gt(tk) {
                let stale = [cached.then_some(addr), from.take()];
                self.cache.remove_all(stale.into_iter().flatten());
                self.count(|c| c.sibling_hops += 1);
                if s.sibling.is_null() {
                    return Err(IndexError::Corrupt {
                        addr,
                        what: "node with an upper fence and no sibling",
                    });
                }
                retry.lost(ctx)?;
                hops += 1;
                // A long walk right: the root this client knows is old (the
                // tree grew above it); start again from the current one.
                (addr, expect) = if hops == 4 {
                    (self.refresh_root(ctx).await?, None)
                } else {
                    (s.sibling, Some(s.level))
                };
                continue;
            }
            if s.level < level {
                return Ok(None);
            }
            if s.level == level {
                return Ok(Some(addr));
            }
            path[s.level as usize] = addr;
            let child = s.child_for(tk);
            if s.level == level + 1 {
                return Ok(Some(child));
            }
            (from, expect) = (cached.then_some(addr), Some(s.level - 1));
            addr = child;
        }
    }

    /// The leaf that should hold `tk`: through the cached level-1 node if
    /// allowed, else by descent. Also the level-1 node it came through.
    async fn locate_leaf(
        &self,
        ctx: &Ctx,
        tk: &[u8],
        use_cache: bool,
        path: &mut [GlobalAddr; MAX_LEVELS],
    ) -> Result<GlobalAddr, IndexError> {
        if use_cache {
            if let Some(s) = parent_of_leaf(&self.cache, tk) {
                self.count(|c| c.cache_hits += 1);
                path[1] = s.addr;
                return Ok(s.child_for(tk));
            }
        }
        self.count(|c| c.cache_misses += 1);
        match self.descend(ctx, tk, 0, use_cache, path).await? {
            Some(a) => Ok(a),
            None => unreachable!("every tree has level 0"),
        }
    }

    /// After a leaf showed the cached path to it was stale, forget the
    /// level-1 snapshot that led there.
    fn stale_parent(&self, path: &[GlobalAddr; MAX_LEVELS]) {
        if !path[1].is_null() {
            self.cache.remove(path[1]);
        }
    }

    /// SMART-BT's fast path: read the one slot the table remembers.
    async fn speculative(&self, ctx: &Ctx, tk: &[u8]) -> Result<Option<Vec<u8>>, IndexError> {
        let Some(at) = self.spec.get(tk) else {
            return Ok(None);
        };
        let slot = self.sc().slot;
        ctx.read(self.t.home.remote(at)?, slot);
        ctx.sync().await?;
        let b = ctx.local_vec(slot);
        if let Some((_, v)) = leaf_slot_entry(&self.t.g, &b).filter(|(k, _)| *k == tk) {
            self.count(|c| c.spec_hits += 1);
            return Ok(Some(v.to_vec()));
        }
        self.count(|c| c.spec_misses += 1);
        self.spec.remove(tk);
        Ok(None)
    }

    /// Takes the lock of node `addr` (HOCL: local entry first, then the
    /// remote word unless handed over) and reads the node in the same batch
    /// as the lock CAS.
    async fn lock_and_read(&self, ctx: &Ctx, addr: GlobalAddr) -> Result<(Held, Img), IndexError> {
        let (lock, local) = self.t.lock_of(addr)?;
        let at = self.t.home.remote(addr)?;
        let grant = match &self.locks {
            Some(l) => Some(l.acquire(ctx, local).await),
            None => None,
        };
        let mut held = Held {
            node: addr,
            lock,
            word: grant.map_or(0, |g| g.word),
            grant,
        };
        let remote = !grant.is_some_and(|g| g.handed);
        if !remote {
            self.count(|c| c.handovers += 1);
        }
        let owner = self.st.borrow().owner;
        let node = self.sc().node;
        let lease = self.t.cfg.lease;
        let mut retry = self.retry("node lock");
        let mut mine = held.word;
        let r = async {
            loop {
                // The lock word is a lease (`dmkit_index::lease`): a dead
                // holder's word is broken by CAS once its lease ran out.
                // Nothing needs repair: a holder writes the node back with
                // one WRITE that lands whole or not at all (the node is the
                // old or the new one), and a split's new sibling is
                // published by that WRITE; a split whose parent entry never
                // came stays reachable along the sibling pointer (B-link),
                // as in a live split before its parent is updated.
                if remote {
                    mine = lease.word(ctx, owner);
                }
                let t = remote.then(|| ctx.cas(lock, 0, mine));
                // Combined (or no CAS): the READ rides with the CAS. Apart:
                // the CAS alone, the READ once the lock is ours.
                let mut read_now = self.t.cfg.combine || t.is_none();
                if read_now {
                    ctx.read(at, node);
                }
                ctx.sync().await?;
                if let Some(t) = t {
                    let seen = ctx.value(t);
                    let mut got = seen == 0;
                    if !got {
                        got = lease.break_expired(ctx, lock, seen, mine).await?;
                        if got {
                            self.count(|c| c.leases_broken += 1);
                            // Read the node again, after the lock is ours.
                            read_now = false;
                        }
                    }
                    ctx.cas_outcome(got).await;
                    if !got {
                        self.count(|c| c.lock_retries += 1);
                        retry.lost(ctx)?;
                        continue;
                    }
                }
                if !read_now {
                    ctx.read(at, node);
                    ctx.sync().await?;
                }
                let b = ctx.local_vec(node);
                return match Node::new(&self.t.g, &b).check(true) {
                    Ok(()) => Ok(Img { at, b }),
                    // Nobody writes a locked node: a torn image is damage.
                    Err(_) => Err(IndexError::Corrupt {
                        addr,
                        what: "node (checksum mismatch under its lock)",
                    }),
                };
            }
        }
        .await;
        held.word = mine;
        if let (Some(l), Some(g), true) = (&self.locks, held.grant, r.is_ok()) {
            l.set_word(g.index, mine);
        }
        match r {
            Ok(img) => {
                // Handed over with too little of its lease left: renew.
                self.keep(ctx, &mut held).await?;
                Ok((held, img))
            }
            // We hold the remote lock (the CAS succeeded): release it.
            Err(e @ IndexError::Corrupt { .. }) => {
                self.unlock(ctx, held).await?;
                Err(e)
            }
            // We may not hold it: never hand it to a local waiter.
            Err(e) => {
                if let (Some(l), Some(g)) = (&self.locks, held.grant) {
                    l.abandon(g);
                }
                Err(e)
            }
        }
    }

    /// Keeps the lease of `held` before a write under it: free while
    /// enough of it is left (no round trip), renewed by CAS when not;
    /// [`IndexError::LeaseLost`] when another client broke it (this worker
    /// stalled past its lease), with the lock let go locally and nothing
    /// written.
    async fn keep(&self, ctx: &Ctx, held: &mut Held) -> Result<(), IndexError> {
        let owner = self.st.borrow().owner;
        if let Some(fresh) = self
            .t
            .cfg
            .lease
            .renew(ctx, held.lock, held.word, owner)
            .await?
        {
            if fresh == held.word {
                return Ok(());
            }
            held.word = fresh;
            if let (Some(l), Some(g)) = (&self.locks, held.grant) {
                l.set_word(g.index, fresh);
            }
            return Ok(());
        }
        if let (Some(l), Some(g)) = (&self.locks, held.grant.take()) {
            l.abandon(g);
        }
        Err(IndexError::LeaseLost(format!(
            "node lock {} broken by another client",
            held.lock.addr
        )))
    }

    /// [`Self::keep`], with a lost lease as a lost race: `Ok(false)` when
    /// another client broke the lock (nothing was written under it; the
    /// caller starts its step over, as the lease design has a holder that
    /// ran out of lease back out and try again), counted in
    /// [`TreeCounters::leases_lost`].
    async fn keep_or_lost(&self, ctx: &Ctx, held: &mut Held) -> Result<bool, IndexError> {
        match self.keep(ctx, held).await {
            Ok(()) => Ok(true),
            Err(IndexError::LeaseLost(_)) => {
                self.count(|c| c.leases_lost += 1);
                Ok(false)
            }
            Err(e) => Err(e),
        }
    }

    /// Queues the WRITE of `src` to `dst`, which must lie inside the node
    /// whose lock is `held` (the unlock that follows goes after it in
    /// queue-pair order).
    fn write_back(&self, ctx: &Ctx, held: &Held, dst: RemoteRef, src: Local) {
        let (node, end) = (held.node, held.node.add(self.t.g.node_bytes as u64));
        assert!(
            dst.addr.node() == node.node()
                && dst.addr.offset() >= node.offset()
                && dst.addr.offset() + src.len() as u64 <= end.offset(),
            "a write-back of {src:?} to {} lands outside the locked node {node}",
            dst.addr
        );
        ctx.write(dst, src);
    }

    /// Queues the remote release (unless HOCL hands the lock over), posts
    /// everything queued, waits, and passes the local entry on.
    async fn unlock(&self, ctx: &Ctx, held: Held) -> Result<(), IndexError> {
        let keep = match (&self.locks, held.grant) {
            (Some(l), Some(g)) => l.hand_over(g),
            _ => false,
        };
        let r = async {
            if !keep {
                if !self.t.cfg.combine {
                    // The node's write-back completes first, on its own.
                    ctx.sync().await?;
                }
                return self
                    .t
                    .cfg
                    .lease
                    .release(ctx, held.lock, held.word, self.sc().word)
                    .await;
            }
            ctx.sync().await
        }
        .await;
        if let (Some(l), Some(g)) = (&self.locks, held.grant) {
            l.release(g);
        }
        Ok(r?)
    }

    async fn write_op(
        &self,
        ctx: &Ctx,
        tk: &[u8],
        mode: WriteMode,
        value: &[u8],
    ) -> Result<bool, IndexError> {
        let g = self.t.g;
        let mut retry = self.retry(match mode {
            WriteMode::Insert => "insert",
            WriteMode::Update => "update",
            WriteMode::Delete => "delete",
        });
        let mut attempt = 0u32;
        loop {
            let mut path = [GlobalAddr::NULL; MAX_LEVELS];
            let cached = attempt < CACHED_ATTEMPTS;
            let mut addr = self.locate_leaf(ctx, tk, cached, &mut path).await?;
            loop {
                let (mut held, img) = self.lock_and_read(ctx, addr).await?;
                let n = Node::new(&g, &img.b);
                if !n.above_lo(tk) || n.level() != 0 {
                    self.unlock(ctx, held).await?;
                    self.stale_parent(&path);
                    self.count(|c| c.restarts += 1);
                    break;
                }
                if !n.below_hi(tk) {
                    let next = n.sibling();
                    self.unlock(ctx, held).await?;
                    self.stale_parent(&path);
                    self.count(|c| c.sibling_hops += 1);
                    retry.lost(ctx)?;
                    // Find the node that holds the key now by plain reads
                    // (a few hops, else a fresh descent: the node may have
                    // split many times while this task waited for its
                    // lock), and lock that one.
                    addr = match self.move_right(ctx, next, tk, MAX_WALK, &mut retry).await? {
                        Some(a) => a,
                        None => {
                            let a = self.locate_leaf(ctx, tk, false, &mut path).await?;
                            self.move_right(ctx, a, tk, u32::MAX, &mut retry)
                                .await?
                                .expect("an unbounded walk ends")
                        }
                    };
                    continue;
                }
                let found = n.find(tk);
                let version = n.version();
                let mut slot = Vec::new();
                let target = match (mode, found) {
                    (WriteMode::Insert, Some(_))
                    | (WriteMode::Update, None)
                    | (WriteMode::Delete, None) => {
                        self.unlock(ctx, held).await?;
                        return Ok(false);
                    }
                    (WriteMode::Update, Some(i)) => {
                        build_slot(&g, true, true, version, tk, value, &mut slot);
                        i
                    }
                    (WriteMode::Delete, Some(i)) => {
                        build_slot(&g, true, false, version, tk, n.slot_value(i), &mut slot);
                        i
                    }
                    (WriteMode::Insert, None) => {
                        match (0..g.leaf_span).find(|&i| !n.slot_valid(i)) {
                            Some(i) => {
                                build_slot(&g, true, true, version, tk, value, &mut slot);
                                i
                            }
                            None => {
                                if self
                                    .split_leaf(ctx, img, held, tk, value, &mut path)
                                    .await?
                                {
                                    return Ok(true);
                                }
                                // Lease lost before the split was published.
                                break;
                            }
                        }
                    }
                };
                let at = img.at.add(g.slot_off(true, target) as u64);
                let src = self.sc().slot;
                ctx.put_local(src, &slot);
                if !self.keep_or_lost(ctx, &mut held).await? {
                    break;
                }
                self.write_back(ctx, &held, at, src);
                self.unlock(ctx, held).await?;
                if mode == WriteMode::Delete {
                    self.spec.remove(tk);
                } else {
                    self.spec.put(tk, at.addr);
                }
                return Ok(true);
            }
            retry.lost(ctx)?;
            attempt = attempt.saturating_add(1);
        }
    }

    /// From `addr`, follows sibling pointers with unlocked reads to the
    /// node whose upper fence lies above `tk` (a writer that finds its
    /// node split locks only the node it ends at); each hop is a race the
    /// operation lost. `None`: not found within `max` hops.
    async fn move_right(
        &self,
        ctx: &Ctx,
        mut addr: GlobalAddr,
        tk: &[u8],
        max: u32,
        retry: &mut Retry,
    ) -> Result<Option<GlobalAddr>, IndexError> {
        for _ in 0..max {
            let img = self.read_node(ctx, addr).await?;
            let n = Node::new(&self.t.g, &img.b);
            if n.below_hi(tk) || n.sibling().is_null() {
                return Ok(Some(addr));
            }
            self.count(|c| c.sibling_hops += 1);
            retry.lost(ctx)?;
            addr = n.sibling();
        }
        Ok(None)
    }

    /// A new node's block, on this client's memory node if it has room.
    fn alloc_node(&self, ctx: &Ctx) -> Result<GlobalAddr, IndexError> {
        let mut st = self.st.borrow_mut();
        let st = &mut *st;
        let nodes = self.t.home.nodes();
        // Each client fills chunks on one memory node (clients spread over
        // the nodes by id), so a client holds one partly used chunk.
        let prefer = nodes[st.next_node % nodes.len()];
        st.alloc
            .alloc(self.t.home.fabric().as_ref(), nodes, prefer, ctx.now())
            .map_err(IndexError::oom("allocating a node"))
    }

    /// Writes the new node image in `fresh` to `at`; waits for it unless
    /// the write that links it goes to the same memory node as `next`
    /// (queue-pair order then puts it first).
    async fn write_new(
        &self,
        ctx: &Ctx,
        at: GlobalAddr,
        next: GlobalAddr,
    ) -> Result<(), IndexError> {
        ctx.write(self.t.home.remote(at)?, self.sc().fresh);
        if at.node() != next.node() {
            ctx.sync().await?;
        }
        Ok(())
    }

    /// Splits a full leaf (locked, `img`) while inserting `tk`: the upper
    /// half goes to a new right sibling, written first; then the leaf is
    /// rewritten with a new version, the lower fence of the sibling as its
    /// upper fence and the moved slots empty, and unlocked in the same
    /// batch; then the separator goes up. `Ok(false)`: the lease ran out
    /// before the leaf was written (nothing published; start over).
    async fn split_leaf(
        &self,
        ctx: &Ctx,
        img: Img,
        mut held: Held,
        tk: &[u8],
        value: &[u8],
        path: &mut [GlobalAddr; MAX_LEVELS],
    ) -> Result<bool, IndexError> {
        let g = self.t.g;
        let sc = *self.sc();
        let n = Node::new(&g, &img.b);
        let mut all: Vec<(Vec<u8>, Vec<u8>)> = n.leaf_entries();
        all.push((tk.to_vec(), value.to_vec()));
        all.sort_unstable_by(|a, b| a.0.cmp(&b.0));
        let mid = all.len() / 2;
        let sep = all[mid].0.clone();
        assert!(
            n.above_lo(&all[0].0) && all[0].0 < sep && n.below_hi(&sep),
            "a leaf's separator lies strictly inside its fences"
        );
        let right = match self.alloc_node(ctx) {
            Ok(a) => a,
            Err(e) => {
                self.unlock(ctx, held).await?;
                return Err(e);
            }
        };
        let v = n.version().wrapping_add(1);
        let mut out = Vec::new();
        build_node(
            &g,
            &HeadFields {
                version: 1,
                level: 0,
                count: 0,
                sibling: n.sibling(),
                leftmost: GlobalAddr::NULL,
                lo: Fence::Key(sep.clone()),
                hi: n.hi(),
            },
            all[mid..].iter().map(|(k, v)| (k.as_slice(), v.as_slice())),
            &mut out,
        );
        ctx.put_local(sc.fresh, &out);
        if let Err(e) = self.write_new(ctx, right, img.at.addr).await {
            self.unlock(ctx, held).await?;
            return Err(e);
        }
        // The left half keeps its slots in place (no entry moves inside it).
        let mut left = img.b.clone();
        put_head(
            &g,
            &mut left,
            &HeadFields {
                version: v,
                level: 0,
                count: 0,
                sibling: right,
                leftmost: GlobalAddr::NULL,
                lo: n.lo(),
                hi: Fence::Key(sep.clone()),
            },
        );
        let mut slot = Vec::new();
        let mut placed = tk >= sep.as_slice();
        let mut new_at = None;
        for i in 0..g.leaf_span {
            let o = g.slot_off(true, i);
            let keep = n.slot_valid(i) && n.slot_key(i) < sep.as_slice();
            if keep {
                reseal_slot(&g, &mut left, true, i, v);
            } else if !placed {
                build_slot(&g, true, true, v, tk, value, &mut slot);
                left[o..o + slot.len()].copy_from_slice(&slot);
                placed = true;
                new_at = Some(slot_addr(&g, img.at.addr, true, i));
            } else {
                build_slot(&g, true, false, v, &[], &[], &mut slot);
                left[o..o + slot.len()].copy_from_slice(&slot);
            }
        }
        assert!(placed, "the new key has a slot in one half");
        ctx.put_local(sc.back, &left);
        if !self.keep_or_lost(ctx, &mut held).await? {
            // Nothing published: the new sibling stays unlinked (like a
            // dead splitter's) and the insert starts over.
            return Ok(false);
        }
        self.write_back(ctx, &held, img.at, sc.back);
        self.unlock(ctx, held).await?;
        self.count(|c| c.leaf_splits += 1);
        // The moved entries' new slots (the speculative table would
        // otherwise send their next searches to the emptied old ones).
        for (i, (k, _)) in all[mid..].iter().enumerate() {
            self.spec.put(k, slot_addr(&g, right, true, i));
        }
        if let Some(at) = new_at {
            self.spec.put(tk, at);
        }
        self.insert_parent(ctx, 1, sep, right, path).await?;
        Ok(true)
    }

    /// Inserts separator `sep` → `child` into the node at `level` whose
    /// range holds it, splitting upwards as needed and growing the root.
    async fn insert_parent(
        &self,
        ctx: &Ctx,
        mut level: u8,
        mut sep: Vec<u8>,
        mut child: GlobalAddr,
        path: &mut [GlobalAddr; MAX_LEVELS],
    ) -> Result<(), IndexError> {
        let g = self.t.g;
        let sc = *self.sc();
        let mut retry = self.retry("separator insert");
        let mut hint = path[level as usize];
        loop {
            if level as usize >= MAX_LEVELS - 1 {
                return Err(IndexError::Corrupt {
                    addr: child,
                    what: "tree deeper than 31 levels",
                });
            }
            let target = if hint.is_null() {
                let mut p = [GlobalAddr::NULL; MAX_LEVELS];
                let found = self.descend(ctx, &sep, level, false, &mut p).await?;
                path[level as usize + 1..].copy_from_slice(&p[level as usize + 1..]);
                match found {
                    Some(a) => a,
                    None => {
                        if self.grow_root(ctx, level, &sep, child).await? {
                            return Ok(());
                        }
                        retry.lost(ctx)?;
                        continue;
                    }
                }
            } else {
                hint
            };
            let (mut held, img) = self.lock_and_read(ctx, target).await?;
            let n = Node::new(&g, &img.b);
            if n.level() != level || !n.above_lo(&sep) {
                self.unlock(ctx, held).await?;
                hint = GlobalAddr::NULL;
                retry.lost(ctx)?;
                continue;
            }
            if !n.below_hi(&sep) {
                self.unlock(ctx, held).await?;
                self.count(|c| c.sibling_hops += 1);
                hint = n.sibling();
                retry.lost(ctx)?;
                continue;
            }
            let mut es = n.inner_entries();
            let at = es.partition_point(|e| e.0 < sep);
            if es.get(at).is_some_and(|e| e.0 == sep) {
                // Already there (cannot happen: one split, one separator).
                self.unlock(ctx, held).await?;
                return Err(IndexError::Corrupt {
                    addr: target,
                    what: "internal node holding a separator twice",
                });
            }
            es.insert(at, (sep.clone(), child));
            let v = n.version().wrapping_add(1);
            let mut out = Vec::new();
            if es.len() <= g.inner_span {
                let h = HeadFields {
                    version: v,
                    level,
                    count: es.len() as u16,
                    sibling: n.sibling(),
                    leftmost: n.leftmost(),
                    lo: n.lo(),
                    hi: n.hi(),
                };
                build_inner(&g, &h, &es, &mut out);
                ctx.put_local(sc.back, &out);
                if !self.keep_or_lost(ctx, &mut held).await? {
                    retry.lost(ctx)?;
                    continue;
                }
                self.write_back(ctx, &held, img.at, sc.back);
                self.unlock(ctx, held).await?;
                self.cache_put(Arc::new(Snapshot::of(target, &Node::new(&g, &out))));
                return Ok(());
            }
            // Split: the middle key goes up, its child becomes the new
            // node's leftmost.
            let mid = es.len() / 2;
            let (up_key, up_child) = es[mid].clone();
            assert!(
                n.above_lo(&es[0].0) && es[0].0 < up_key && n.below_hi(&up_key),
                "an internal node's separator lies strictly inside its fences"
            );
            let right = match self.alloc_node(ctx) {
                Ok(a) => a,
                Err(e) => {
                    self.unlock(ctx, held).await?;
                    return Err(e);
                }
            };
            let rh = HeadFields {
                version: 1,
                level,
                count: (es.len() - mid - 1) as u16,
                sibling: n.sibling(),
                leftmost: up_child,
                lo: Fence::Key(up_key.clone()),
                hi: n.hi(),
            };
            build_inner(&g, &rh, &es[mid + 1..], &mut out);
            ctx.put_local(sc.fresh, &out);
            let right_snap = Snapshot::of(right, &Node::new(&g, &out));
            if let Err(e) = self.write_new(ctx, right, target).await {
                self.unlock(ctx, held).await?;
                return Err(e);
            }
            let lh = HeadFields {
                version: v,
                level,
                count: mid as u16,
                sibling: right,
                leftmost: n.leftmost(),
                lo: n.lo(),
                hi: Fence::Key(up_key.clone()),
            };
            build_inner(&g, &lh, &es[..mid], &mut out);
            ctx.put_local(sc.back, &out);
            if !self.keep_or_lost(ctx, &mut held).await? {
                // The new right node stays unlinked; this level again.
                retry.lost(ctx)?;
                continue;
            }
            self.write_back(ctx, &held, img.at, sc.back);
            self.unlock(ctx, held).await?;
            self.cache.put_all([
                Arc::new(Snapshot::of(target, &Node::new(&g, &out))),
                Arc::new(right_snap),
            ]);
            self.count(|c| c.inner_splits += 1);
            level += 1;
            sep = up_key;
            child = right;
            hint = path[level as usize];
        }
    }

    /// The tree is no taller than `level - 1`: make a new root at `level`
    /// with the current root as leftmost child and `sep → child`, swung in
    /// by CAS on the descriptor. `false`: another client grew it first.
    async fn grow_root(
        &self,
        ctx: &Ctx,
        level: u8,
        sep: &[u8],
        child: GlobalAddr,
    ) -> Result<bool, IndexError> {
        let g = self.t.g;
        let fresh = self.sc().fresh;
        let old = self.refresh_root(ctx).await?;
        let (s, _) = self.snapshot(ctx, old, false).await?;
        if s.level + 1 != level {
            // The root moved on since the descent.
            return Ok(false);
        }
        let at = self.alloc_node(ctx)?;
        let mut out = Vec::new();
        let h = HeadFields {
            count: 1,
            ..root_head(1, level, old)
        };
        build_inner(&g, &h, &[(sep.to_vec(), child)], &mut out);
        assert!(
            s.lo == Fence::NegInf && Node::new(&g, &out).check(true).is_ok(),
            "a new root is a sealed node whose leftmost child is the old root"
        );
        ctx.put_local(fresh, &out);
        ctx.write(self.t.home.remote(at)?, fresh);
        // The new root is in place before the CAS that publishes it.
        ctx.sync().await?;
        let root_word = self.t.home.remote(self.t.home.desc().add(DESC_ROOT))?;
        let prev = ctx.cas_sync(root_word, old.raw(), at.raw()).await?;
        let mut st = self.st.borrow_mut();
        if prev == old.raw() {
            st.root = at;
            st.counters.root_grows += 1;
            self.cache_put(Arc::new(Snapshot::of(at, &Node::new(&g, &out))));
            Ok(true)
        } else {
            st.alloc.free_now(at);
            st.root = GlobalAddr::from_raw(prev);
            Ok(false)
        }
    }

    /// Every entry with `lo ≤ key ≤ hi`, in key order.
    pub async fn range(&self, ctx: &Ctx, lo: &[u8], hi: &[u8]) -> Result<Entries, IndexError> {
        let tlo = self.check_key(ctx, lo)?;
        let thi = self.check_key(ctx, hi)?;
        if tlo > thi {
            return Ok(Vec::new());
        }
        let _op = ctx.read_op("range").await;
        self.walk(ctx, &tlo, |k| k <= thi.as_slice(), usize::MAX)
            .await
    }

    /// Walks leaves from the one holding `from` along sibling pointers,
    /// collecting entries ≥ `from` while `keep` holds, up to `count`.
    async fn walk(
        &self,
        ctx: &Ctx,
        from: &[u8],
        keep: impl Fn(&[u8]) -> bool,
        count: usize,
    ) -> Result<Entries, IndexError> {
        let mut path = [GlobalAddr::NULL; MAX_LEVELS];
        let mut addr = self.locate_leaf(ctx, from, true, &mut path).await?;
        let mut retry = self.retry("scan");
        let mut out = Vec::new();
        let mut first = true;
        loop {
            let img = self.read_node(ctx, addr).await?;
            let n = Node::new(&self.t.g, &img.b);
            if first && (!n.above_lo(from) || n.level() != 0) {
                self.stale_parent(&path);
                self.count(|c| c.restarts += 1);
                retry.lost(ctx)?;
                addr = self.locate_leaf(ctx, from, false, &mut path).await?;
                continue;
            }
            first = false;
            let mut es = n.leaf_entries();
            es.retain(|e| e.0.as_slice() >= from);
            es.sort_unstable_by(|a, b| a.0.cmp(&b.0));
            for (k, v) in es {
                if !keep(&k) || out.len() >= count {
                    return Ok(out);
                }
                let key = if self.t.g.fixed_keys {
                    k
                } else {
                    untree_key(&k).to_vec()
                };
                out.push((key, v));
            }
            let done = match n.hi() {
                Fence::PosInf => true,
                Fence::Key(h) => !keep(&h),
                Fence::NegInf => true,
            };
            if done || out.len() >= count {
                return Ok(out);
            }
            addr = n.sibling();
        }
    }
}

/// Builds an internal node image from sorted entries.
fn build_inner(g: &Geometry, h: &HeadFields, es: &[(Vec<u8>, GlobalAddr)], out: &mut Vec<u8>) {
    let kids: Vec<u64> = es.iter().map(|e| e.1.raw()).collect();
    let h = HeadFields {
        count: es.len() as u16,
        ..h.clone()
    };
    build_node(
        g,
        &h,
        es.iter()
            .zip(&kids)
            .map(|(e, c)| (e.0.as_slice(), c.as_bytes())),
        out,
    );
}

impl MapClient for BtreeClient {
    /// Searches `key`.
    async fn search(&self, ctx: &Ctx, key: &[u8]) -> Result<Option<Vec<u8>>, IndexError> {
        let tk = self.check_key(ctx, key)?;
        let _op = ctx.read_op("search").await;
        if let Some(v) = self.speculative(ctx, &tk).await? {
            return Ok(Some(v));
        }
        let node = self.sc().node;
        let mut retry = self.retry("search");
        let (mut attempt, mut hops) = (0u32, 0);
        loop {
            let mut path = [GlobalAddr::NULL; MAX_LEVELS];
            let cached = attempt < CACHED_ATTEMPTS && hops <= MAX_WALK;
            let mut addr = self.locate_leaf(ctx, &tk, cached, &mut path).await?;
            hops = 0;
            loop {
                ctx.read(self.t.home.remote(addr)?, node);
                ctx.sync().await?;
                let b = ctx.local_vec(node);
                let n = Node::new(&self.t.g, &b);
                let hit = match n.check(false) {
                    Ok(()) => n.find(&tk).filter(|&i| n.check_slot(i)),
                    Err(_) => None,
                };
                if hit.is_none() && n.check(true).is_err() {
                    self.count(|c| c.torn_reads += 1);
                    retry.again(ctx)?;
                    continue;
                }
                if !n.above_lo(&tk) || n.level() != 0 {
                    self.stale_parent(&path);
                    self.count(|c| c.restarts += 1);
                    break;
                }
                if !n.below_hi(&tk) {
                    self.stale_parent(&path);
                    self.count(|c| c.sibling_hops += 1);
                    hops += 1;
                    if hops > MAX_WALK {
                        // Far from the key's node: descend afresh.
                        break;
                    }
                    addr = n.sibling();
                    continue;
                }
                return Ok(hit.map(|i| {
                    self.spec.put(&tk, slot_addr(&self.t.g, addr, true, i));
                    n.slot_value(i).to_vec()
                }));
            }
            retry.lost(ctx)?;
            attempt = attempt.saturating_add(1);
        }
    }

    /// Inserts `key` if absent; `false` if present.
    async fn insert(&self, ctx: &Ctx, key: &[u8], value: &[u8]) -> Result<bool, IndexError> {
        let tk = self.check_key(ctx, key)?;
        self.check_value(value)?;
        let _op = ctx.op("insert").await;
        self.write_op(ctx, &tk, WriteMode::Insert, value).await
    }

    /// Replaces the value of `key` if present; `false` if absent.
    async fn update(&self, ctx: &Ctx, key: &[u8], value: &[u8]) -> Result<bool, IndexError> {
        let tk = self.check_key(ctx, key)?;
        self.check_value(value)?;
        let _op = ctx.op("update").await;
        self.write_op(ctx, &tk, WriteMode::Update, value).await
    }

    /// Removes `key` if present; `false` if absent.
    async fn delete(&self, ctx: &Ctx, key: &[u8]) -> Result<bool, IndexError> {
        let tk = self.check_key(ctx, key)?;
        let _op = ctx.op("delete").await;
        self.write_op(ctx, &tk, WriteMode::Delete, &[]).await
    }

    /// Up to `count` entries with keys ≥ `from`, in key order (each leaf is
    /// read consistently; the scan as a whole is not atomic).
    async fn scan(&self, ctx: &Ctx, from: &[u8], count: usize) -> Result<Entries, IndexError> {
        let tk = self.check_key(ctx, from)?;
        let _op = ctx.read_op("scan").await;
        self.walk(ctx, &tk, |_| true, count).await
    }

    /// Every entry, in key order (for checks on a quiescent tree).
    async fn entries(&self, ctx: &Ctx) -> Result<Entries, IndexError> {
        self.check_local(ctx)?;
        let min = vec![0u8; self.t.g.tk];
        self.walk(ctx, &min, |_| true, usize::MAX).await
    }

    fn stats(&self) -> ClientStats {
        let c = self.counters();
        ClientStats {
            cache_hits: c.cache_hits + c.spec_hits,
            cache_misses: c.cache_misses,
            splits: c.leaf_splits + c.inner_splits,
            lock_handovers: c.handovers,
            ..Default::default()
        }
    }

    fn local_layout(&self) -> &LocalLayout {
        &self.t.layout
    }
}

/// The flags keep the names and defaults `bench ycsb` has always had.
#[cfg(all(test, feature = "cli"))]
#[test]
fn flags_keep_the_benchmarks_names_and_defaults() {
    use clap::{Args, FromArgMatches};
    let parse = |args: &str| {
        let cmd = BtreeConfig::augment_args(clap::Command::new("t"));
        let m = cmd.try_get_matches_from(std::iter::once("t").chain(args.split_whitespace()))?;
        BtreeConfig::from_arg_matches(&m)
    };
    assert_eq!(parse("").unwrap(), BtreeConfig::default());
    let flags = "--btree-cache 1MiB --speculative off --hocl off --on-chip-locks off \
                 --combine off --max-handover 7 --btree-node 2KiB --btree-span 32";
    let want = BtreeConfig {
        cache_bytes: 1 << 20,
        speculative: false,
        hocl: false,
        on_chip_locks: false,
        combine: false,
        max_handover: 7,
        node_bytes: 2048,
        span: Some(32),
        ..Default::default()
    };
    assert_eq!(parse(flags).unwrap(), want);
    assert!(parse("--hocl maybe").is_err());
}
