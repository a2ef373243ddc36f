//! The tree: creation, the per-worker client and its operations. The
//! protocols are described in the crate docs.

use std::cell::RefCell;
use std::rc::Rc;
use std::sync::{Arc, Mutex, MutexGuard};

use dmkit_fabric::{Fabric, FabricError, GlobalAddr, NodeId, Rkey, SyncQp};
use dmkit_runtime::alloc::BlockAlloc;
use dmkit_runtime::hash::fmix64;
use dmkit_runtime::keys::{tree_key, untree_key};
use dmkit_runtime::machine::PerMachine;
use dmkit_runtime::{Ctx, Nanos};

use crate::cache::{Cache, Snapshot, SpecCache};
use crate::error::BtreeError;
use crate::hocl::local_locks;
use crate::layout::*;
use dmkit_fabric::RemoteRef;
use dmkit_runtime::machine::{TicketGrant, TicketLocks};
use dmkit_runtime::Local;

/// Configuration of a tree (structure) and of its clients.
#[derive(Debug, Clone, PartialEq)]
pub struct BtreeConfig {
    /// Longest key in bytes (stored in the tree; 1..=254).
    pub max_key: usize,
    /// Every key is exactly `max_key` bytes (e.g. 8-byte integers; stored
    /// in the tree): tree keys need no length byte, so slots and fences are
    /// up to 8 bytes smaller and a leaf nearer Sherman's size. Keys of any
    /// other length are refused.
    pub fixed_keys: bool,
    /// Longest value in bytes (stored in the tree).
    pub max_value: usize,
    /// Bytes of a node (stored in the tree; a multiple of 64). Ignored when
    /// `span` is set.
    pub node_bytes: usize,
    /// Leaf entries per node (Sherman's span); sets the node size to the
    /// smallest that holds them.
    pub span: Option<usize>,
    /// Bytes of internal-node snapshots each compute machine caches, shared
    /// by its clients (0: none).
    pub cache_bytes: usize,
    /// SMART-BT's speculative lookup: searches first read only the slot a
    /// small cache remembers for the key.
    pub speculative: bool,
    /// Entries of the speculative-lookup table of each compute machine
    /// (two-way set-associative, 16 bytes each).
    pub spec_entries: usize,
    /// Sherman's hierarchical locks: clients of one machine queue on a
    /// local lock table and hand remote locks over. Off: every client
    /// retries the remote CAS itself.
    pub hocl: bool,
    /// Consecutive local hand-overs before a remote release (HOCL).
    pub max_handover: u32,
    /// Sherman's command combination: the lock CAS and the node READ go in
    /// one batch, and so do the entry WRITE and the unlock (one round trip
    /// each). Off: each is its own round trip, as in the B+tree of SMART's
    /// artifact (`btree/btree.cpp` of madsys-dev/smart: `HOCL_lock`, then
    /// `read_page`, `write_leaf_entry` and `HOCL_unlock`, each synchronous),
    /// the code behind ASPLOS'24 Figure 12.
    pub combine: bool,
    /// Keep the lock tables in on-NIC device memory when the fabric has it.
    pub on_chip_locks: bool,
    /// Bytes a client asks the memory node for at a time for its nodes.
    pub chunk_bytes: u64,
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
        }
    }
}

impl BtreeConfig {
    /// The node geometry this configuration gives.
    pub fn geometry(&self) -> Result<Geometry, BtreeError> {
        let nb = match self.span {
            Some(s) => {
                Geometry::node_bytes_for_span(self.max_key, self.max_value, self.fixed_keys, s)
            }
            None => self.node_bytes,
        };
        let g = Geometry::new(self.max_key, self.max_value, self.fixed_keys, nb)
            .map_err(BtreeError::Config)?;
        if nb > dmkit_runtime::alloc::MAX_UNITS as usize * 64 {
            return Err(BtreeError::Config(format!(
                "nodes of {nb} B exceed the allocator's largest block ({} B)",
                dmkit_runtime::alloc::MAX_UNITS * 64
            )));
        }
        if self.chunk_bytes < nb as u64 * 4 {
            return Err(BtreeError::Config(format!(
                "chunk_bytes {} is too small for {nb}-byte nodes",
                self.chunk_bytes
            )));
        }
        Ok(g)
    }
}

/// Counters of the tree's own making (beyond the runtime's).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct TreeCounters {
    /// Lookups that found their leaf through a cached level-1 node.
    pub cache_hits: u64,
    pub cache_misses: u64,
    /// Searches answered by the speculative read of one slot.
    pub spec_hits: u64,
    /// Speculative reads that did not validate (fell back).
    pub spec_misses: u64,
    pub leaf_splits: u64,
    pub inner_splits: u64,
    pub root_grows: u64,
    /// Moves right along sibling pointers (a split not yet in the parent,
    /// or a stale cached parent).
    pub sibling_hops: u64,
    /// Restarts from the root (a stale cache entry).
    pub restarts: u64,
    pub torn_reads: u64,
    /// Remote locks taken over from a local holder (HOCL) instead of CAS.
    pub handovers: u64,
    /// Failed remote lock CAS.
    pub lock_retries: u64,
}

fn root_name(name: &str) -> String {
    format!("btree/{name}")
}

/// A tree: what every client of it shares. `Send + Sync`; make one
/// [`BtreeClient`] per worker with [`Btree::client`].
pub struct Btree {
    pub(crate) fabric: Arc<dyn Fabric>,
    name: String,
    cfg: BtreeConfig,
    pub(crate) g: Geometry,
    desc: GlobalAddr,
    pub(crate) root: GlobalAddr,
    nodes: Vec<NodeId>,
    rkeys: Vec<Option<Rkey>>,
    /// Each memory node's lock table, in `nodes` order.
    locks: Vec<GlobalAddr>,
    on_chip: bool,
    chunks: Arc<Mutex<Vec<GlobalAddr>>>,
    /// Local lock tables per compute machine (HOCL).
    local: PerMachine<TicketLocks>,
    /// Caches of internal nodes, one per compute machine.
    caches: PerMachine<Mutex<Cache>>,
    /// Speculative-lookup tables per compute machine.
    spec: PerMachine<SpecCache>,
}

impl Btree {
    /// Creates tree `name`: descriptor and root leaf on the lowest memory
    /// node, a lock table on every memory node (in device memory if the
    /// fabric has it and `on_chip_locks`), registered as a named root.
    pub fn create(
        fabric: Arc<dyn Fabric>,
        name: &str,
        cfg: BtreeConfig,
    ) -> Result<Arc<Self>, BtreeError> {
        let g = cfg.geometry()?;
        let (home, nodes) = dmkit_fabric::home_node(fabric.as_ref())
            .ok_or_else(|| BtreeError::Config("fabric has no memory nodes".into()))?;
        let rkeys = dmkit_fabric::heap_rkeys(fabric.as_ref(), &nodes)?;
        let oom = |what| move |source| BtreeError::OutOfMemory { what, source };
        let desc_len = (DESC_LOCKS + 8 * nodes.len()).next_multiple_of(64) as u64;
        let (desc, _, _) = fabric
            .alloc_chunk(home, desc_len + g.node_bytes as u64, true)
            .map_err(oom("allocating the root"))?;
        let root = desc.add(desc_len);
        let mut taken = vec![desc];
        let result = (|| {
            let mut locks = Vec::new();
            let mut on_chip = cfg.on_chip_locks;
            for &n in &nodes {
                let (l, _, _) = fabric
                    .alloc_chunk(n, LOCK_WORDS * 8, true)
                    .map_err(oom("allocating a lock table"))?;
                taken.push(l);
                if cfg.on_chip_locks {
                    on_chip &= fabric.place_in_device_memory(l, LOCK_WORDS * 8);
                }
                locks.push(l);
            }
            let rk = rkeys[home as usize].expect("rkey of a listed node");
            let mut qp = SyncQp::new(fabric.as_ref(), home, g.node_bytes.max(desc_len as usize))?;
            let mut img = Vec::new();
            build_node(
                &g,
                &root_head(1, 0, GlobalAddr::NULL),
                std::iter::empty(),
                &mut img,
            );
            qp.write(root, rk, &img)?;
            let mut d = Vec::new();
            for w in [
                DESC_MAGIC,
                root.raw(),
                cfg.max_key as u64 | if cfg.fixed_keys { FIXED_KEYS } else { 0 },
                cfg.max_value as u64,
                g.node_bytes as u64,
                nodes.len() as u64,
            ] {
                d.extend_from_slice(&w.to_le_bytes());
            }
            for l in &locks {
                d.extend_from_slice(&l.raw().to_le_bytes());
            }
            qp.write(desc, rk, &d)?;
            if !dmkit_fabric::claim_root(fabric.as_ref(), home, &root_name(name), desc.raw())? {
                return Err(BtreeError::AlreadyExists(name.into()));
            }
            Ok((locks, on_chip))
        })();
        let (locks, on_chip) = match result {
            Ok(v) => v,
            Err(e) => {
                for c in taken {
                    let _ = fabric.free_chunk(c);
                }
                return Err(e);
            }
        };
        let cfg = BtreeConfig {
            node_bytes: g.node_bytes,
            ..cfg
        };
        Ok(Arc::new(Self {
            fabric,
            name: name.into(),
            cfg,
            g,
            desc,
            root,
            nodes,
            rkeys,
            locks,
            on_chip,
            chunks: Arc::new(Mutex::new(taken[1..].to_vec())),
            local: PerMachine::default(),
            caches: PerMachine::default(),
            spec: PerMachine::default(),
        }))
    }

    /// Opens tree `name`. Structural settings (key and value limits, node
    /// size) come from the tree; `cfg` supplies the client-side ones.
    pub fn open(
        fabric: Arc<dyn Fabric>,
        name: &str,
        cfg: BtreeConfig,
    ) -> Result<Arc<Self>, BtreeError> {
        let (home, nodes) = dmkit_fabric::home_node(fabric.as_ref())
            .ok_or_else(|| BtreeError::Config("fabric has no memory nodes".into()))?;
        let rkeys = dmkit_fabric::heap_rkeys(fabric.as_ref(), &nodes)?;
        let desc = dmkit_fabric::find_root(fabric.as_ref(), home, &root_name(name))?
            .ok_or_else(|| BtreeError::NoSuchTree(name.into()))?;
        let rk = rkeys[home as usize].expect("home rkey");
        let desc_len = DESC_LOCKS + 8 * nodes.len();
        let mut qp = SyncQp::new(fabric.as_ref(), home, desc_len)?;
        let d = qp.read(desc, rk, desc_len)?;
        let w = |i: usize| u64::from_le_bytes(d[8 * i..8 * i + 8].try_into().expect("8 bytes"));
        if w(0) != DESC_MAGIC || w(5) as usize != nodes.len() {
            return Err(BtreeError::Corrupt {
                addr: desc,
                what: "tree descriptor (or a fabric with other memory nodes)",
            });
        }
        let cfg = BtreeConfig {
            max_key: (w(2) & !FIXED_KEYS) as usize,
            fixed_keys: w(2) & FIXED_KEYS != 0,
            max_value: w(3) as usize,
            node_bytes: w(4) as usize,
            span: None,
            ..cfg
        };
        let g = cfg.geometry()?;
        let locks = (0..nodes.len())
            .map(|i| GlobalAddr::from_raw(w(6 + i)))
            .collect();
        Ok(Arc::new(Self {
            fabric,
            name: name.into(),
            cfg,
            g,
            desc,
            root: GlobalAddr::from_raw(w(1)),
            nodes,
            rkeys,
            locks,
            on_chip: false,
            chunks: Arc::default(),
            local: PerMachine::default(),
            caches: PerMachine::default(),
            spec: PerMachine::default(),
        }))
    }

    /// Removes the tree: unregisters its name and frees the descriptor,
    /// lock tables and the chunks this process's clients took. No client
    /// may use the tree afterwards.
    pub fn destroy(&self) -> Result<(), BtreeError> {
        let home = self.desc.node();
        let name = root_name(&self.name);
        if !dmkit_fabric::release_root(self.fabric.as_ref(), home, &name, self.desc.raw())? {
            return Err(BtreeError::NoSuchTree(self.name.clone()));
        }
        self.fabric.free_chunk(self.desc)?;
        let chunks = std::mem::take(&mut *self.chunks.lock().unwrap_or_else(|p| p.into_inner()));
        for c in chunks {
            self.fabric.free_chunk(c)?;
        }
        Ok(())
    }

    pub fn name(&self) -> &str {
        &self.name
    }

    /// The effective configuration.
    pub fn config(&self) -> &BtreeConfig {
        &self.cfg
    }

    /// The node geometry (sizes, spans).
    pub fn geometry(&self) -> &Geometry {
        &self.g
    }

    /// Whether the lock tables are in on-NIC device memory.
    pub fn locks_on_chip(&self) -> bool {
        self.on_chip
    }

    /// A client for one worker of compute machine 0 (see
    /// [`Btree::client_on`]).
    pub fn client(self: &Arc<Self>, id: u64) -> BtreeClient {
        self.client_on(0, id)
    }

    /// A client for one worker on compute machine `machine`: clients of one
    /// machine share its local lock table (HOCL). `id` names lock holders;
    /// make it unique among the tree's live clients.
    pub fn client_on(self: &Arc<Self>, machine: usize, id: u64) -> BtreeClient {
        let locks = self.cfg.hocl.then(|| {
            self.local.get(machine, || {
                local_locks(self.nodes.len(), self.cfg.max_handover)
            })
        });
        let cache = self
            .caches
            .get(machine, || Mutex::new(Cache::new(self.cfg.cache_bytes)));
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
                alloc: BlockAlloc::new(self.cfg.chunk_bytes, Nanos::MAX / 4, self.chunks.clone()),
                owner: id.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1,
                root: self.root,
                root_known: false,
                next_node: id as usize,
                counters: TreeCounters::default(),
            })),
        }
    }

    pub(crate) fn rkey(&self, node: NodeId) -> Result<Rkey, BtreeError> {
        self.rkeys
            .get(node as usize)
            .copied()
            .flatten()
            .ok_or(BtreeError::Fabric(FabricError::NoSuchNode(node)))
    }

    /// The lock word of tree node `addr` and its local-table index.
    fn lock_of(&self, addr: GlobalAddr) -> Result<(GlobalAddr, usize), BtreeError> {
        let p = self
            .nodes
            .iter()
            .position(|&n| n == addr.node())
            .ok_or(BtreeError::Fabric(FabricError::NoSuchNode(addr.node())))?;
        let w = fmix64(addr.raw()) % LOCK_WORDS;
        Ok((
            self.locks[p].add(8 * w),
            p * LOCK_WORDS as usize + w as usize,
        ))
    }

    pub(crate) fn desc_addr(&self) -> GlobalAddr {
        self.desc
    }

    pub(crate) fn nodes(&self) -> &[NodeId] {
        &self.nodes
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
    alloc: BlockAlloc,
    owner: u64,
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
    cache: Arc<Mutex<Cache>>,
    spec: Arc<SpecCache>,
    st: Rc<RefCell<ClientState>>,
}

/// A held node lock.
struct Held {
    lock: GlobalAddr,
    rk: Rkey,
    grant: Option<TicketGrant>,
}

/// A node image read by this operation.
struct Img {
    addr: GlobalAddr,
    b: Vec<u8>,
}

/// Write operations sharing one traversal loop.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum WriteMode {
    Insert,
    Update,
    Delete,
}

/// Attempts before an operation reports a livelock.
const MAX_ATTEMPTS: u32 = 100_000;
/// Attempts that may use the cache (later ones traverse from the root).
const CACHED_ATTEMPTS: u32 = 3;
/// Sibling hops a writer walks before it descends afresh instead.
const MAX_WALK: u32 = 2;
/// Deepest tree a traversal expects.
const MAX_LEVELS: usize = 32;

impl BtreeClient {
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
        let c = self.cache();
        (c.len(), c.bytes(), self.spec.len())
    }

    /// The machine's cache (a poisoned lock is taken over: every cache
    /// operation leaves it consistent).
    fn cache(&self) -> MutexGuard<'_, Cache> {
        self.cache.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn nb(&self) -> usize {
        self.t.g.node_bytes
    }
    fn l_img(&self) -> usize {
        self.nb()
    }
    fn l_img2(&self) -> usize {
        2 * self.nb()
    }
    fn l_word(&self) -> usize {
        3 * self.nb()
    }
    fn l_slot(&self) -> usize {
        self.l_word() + 64
    }

    /// Task-local bytes the tree needs.
    pub fn local_bytes_needed(&self) -> usize {
        self.l_slot() + self.t.g.leaf_slot.next_multiple_of(64)
    }

    fn check_key(&self, ctx: &Ctx, key: &[u8]) -> Result<Vec<u8>, BtreeError> {
        let g = &self.t.g;
        if key.is_empty() || key.len() > g.max_key || (g.fixed_keys && key.len() != g.max_key) {
            return Err(BtreeError::KeyLength {
                len: key.len(),
                min: if g.fixed_keys { g.max_key } else { 1 },
                max: g.max_key,
            });
        }
        let need = self.local_bytes_needed();
        if ctx.local_len() < need {
            return Err(BtreeError::LocalMemory {
                have: ctx.local_len(),
                need,
            });
        }
        if g.fixed_keys {
            return Ok(key.to_vec());
        }
        let mut tk = Vec::with_capacity(g.tk);
        tree_key(key, g.max_key, &mut tk);
        Ok(tk)
    }

    fn check_value(&self, value: &[u8]) -> Result<(), BtreeError> {
        if value.len() > self.t.g.max_value {
            return Err(BtreeError::ValueTooLarge {
                len: value.len(),
                max: self.t.g.max_value,
            });
        }
        Ok(())
    }

    fn count(&self, f: impl FnOnce(&mut TreeCounters)) {
        f(&mut self.st.borrow_mut().counters)
    }

    /// Reads the node at `addr` into local memory and validates it
    /// (`slots`: every slot's checksum too), re-reading torn images.
    async fn read_node(&self, ctx: &Ctx, addr: GlobalAddr) -> Result<Img, BtreeError> {
        let rk = self.t.rkey(addr.node())?;
        for attempt in 0..MAX_ATTEMPTS {
            ctx.read(RemoteRef::new(addr, rk), Local::at(0, self.nb()));
            ctx.sync().await?;
            let b = ctx.local_vec(Local::at(0, self.nb()));
            let n = Node::new(&self.t.g, &b);
            if n.check(true).is_ok() {
                return Ok(Img { addr, b });
            }
            self.count(|c| c.torn_reads += 1);
            if attempt > 2 {
                ctx.backoff().await;
            } else {
                ctx.note_retry();
            }
        }
        Err(BtreeError::TooManyRetries(MAX_ATTEMPTS))
    }

    /// Re-reads the root word of the descriptor.
    async fn refresh_root(&self, ctx: &Ctx) -> Result<GlobalAddr, BtreeError> {
        let d = self.t.desc;
        ctx.read(
            RemoteRef::new(d.add(DESC_ROOT), self.t.rkey(d.node())?),
            Local::at(self.l_word(), 8),
        );
        ctx.sync().await?;
        let r = GlobalAddr::from_raw(ctx.local_u64(Local::at(self.l_word(), 8)));
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
    ) -> Result<(Arc<Snapshot>, bool), BtreeError> {
        if use_cache {
            if let Some(s) = self.cache().get(addr) {
                return Ok((s, true));
            }
        }
        let img = self.read_node(ctx, addr).await?;
        let s = Arc::new(Snapshot::of(addr, &Node::new(&self.t.g, &img.b)));
        self.cache().put(s.clone());
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
    ) -> Result<Option<GlobalAddr>, BtreeError> {
        let known = self.st.borrow().root_known;
        let mut addr = if known {
            self.st.borrow().root
        } else {
            self.refresh_root(ctx).await?
        };
        // The cached node that pointed here (dropped if it led astray).
        let mut from: Option<GlobalAddr> = None;
        let mut hops = 0;
        for _ in 0..MAX_ATTEMPTS {
            let (s, cached) = self.snapshot(ctx, addr, use_cache).await?;
            if !s.lo.le(tk) {
                // Only a stale cached path leads left of a key's node.
                self.cache().remove(addr);
                self.count(|c| c.restarts += 1);
                use_cache = false;
                from = None;
                addr = self.refresh_root(ctx).await?;
                continue;
            }
            if !s.hi.gt(tk) {
                {
                    let mut cache = self.cache();
                    if cached {
                        cache.remove(addr);
                    }
                    if let Some(p) = from.take() {
                        cache.remove(p);
                    }
                }
                self.st.borrow_mut().counters.sibling_hops += 1;
                if s.sibling.is_null() {
                    return Err(BtreeError::Corrupt {
                        addr,
                        what: "node with an upper fence and no sibling",
                    });
                }
                hops += 1;
                // A long walk right: the root this client knows is old (the
                // tree grew above it); start again from the current one.
                addr = if hops == 4 {
                    self.refresh_root(ctx).await?
                } else {
                    s.sibling
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
            from = cached.then_some(addr);
            addr = child;
        }
        Err(BtreeError::TooManyRetries(MAX_ATTEMPTS))
    }

    /// The leaf that should hold `tk`: through the cached level-1 node if
    /// allowed, else by descent. Also the level-1 node it came through.
    async fn locate_leaf(
        &self,
        ctx: &Ctx,
        tk: &[u8],
        use_cache: bool,
        path: &mut [GlobalAddr; MAX_LEVELS],
    ) -> Result<GlobalAddr, BtreeError> {
        if use_cache {
            let hit = self.cache().parent_of_leaf(tk);
            if let Some(s) = hit {
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
            self.cache().remove(path[1]);
        }
    }

    /// Searches `key`.
    pub async fn search(&self, ctx: &Ctx, key: &[u8]) -> Result<Option<Vec<u8>>, BtreeError> {
        let tk = self.check_key(ctx, key)?;
        let _op = ctx.read_op("search").await;
        if let Some(v) = self.speculative(ctx, &tk).await? {
            return Ok(Some(v));
        }
        let mut hops = 0;
        for attempt in 0..MAX_ATTEMPTS {
            let mut path = [GlobalAddr::NULL; MAX_LEVELS];
            let mut addr = self
                .locate_leaf(
                    ctx,
                    &tk,
                    attempt < CACHED_ATTEMPTS && hops <= MAX_WALK,
                    &mut path,
                )
                .await?;
            hops = 0;
            loop {
                let rk = self.t.rkey(addr.node())?;
                ctx.read(RemoteRef::new(addr, rk), Local::at(0, self.nb()));
                ctx.sync().await?;
                let b = ctx.local_vec(Local::at(0, self.nb()));
                let n = Node::new(&self.t.g, &b);
                let hit = match n.check(false) {
                    Ok(()) => n.find(&tk).filter(|&i| n.check_slot(i)),
                    Err(_) => None,
                };
                if hit.is_none() && n.check(true).is_err() {
                    self.count(|c| c.torn_reads += 1);
                    ctx.note_retry();
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
        }
        Err(BtreeError::TooManyRetries(MAX_ATTEMPTS))
    }

    /// SMART-BT's fast path: read the one slot the table remembers.
    async fn speculative(&self, ctx: &Ctx, tk: &[u8]) -> Result<Option<Vec<u8>>, BtreeError> {
        let Some(at) = self.spec.get(tk) else {
            return Ok(None);
        };
        let g = &self.t.g;
        ctx.read(
            RemoteRef::new(at, self.t.rkey(at.node())?),
            Local::at(self.l_slot(), g.leaf_slot),
        );
        ctx.sync().await?;
        let slot = ctx.local_vec(Local::at(self.l_slot(), g.leaf_slot));
        if let Some((_, v)) = leaf_slot_entry(g, &slot).filter(|(k, _)| *k == tk) {
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
    async fn lock_and_read(&self, ctx: &Ctx, addr: GlobalAddr) -> Result<(Held, Img), BtreeError> {
        let (lock, local) = self.t.lock_of(addr)?;
        let rk = self.t.rkey(addr.node())?;
        let grant = match &self.locks {
            Some(l) => Some(l.acquire(ctx, local).await),
            None => None,
        };
        let held = Held { lock, rk, grant };
        let remote = !grant.is_some_and(|g| g.handed);
        if !remote {
            self.count(|c| c.handovers += 1);
        }
        let owner = self.st.borrow().owner;
        let r = async {
            for _ in 0..MAX_ATTEMPTS {
                let t = remote.then(|| ctx.cas(RemoteRef::new(lock, rk), 0, owner));
                // Combined (or no CAS): the READ rides with the CAS. Apart:
                // the CAS alone, the READ once the lock is ours.
                let read_now = self.t.cfg.combine || t.is_none();
                if read_now {
                    ctx.read(RemoteRef::new(addr, rk), Local::at(0, self.nb()));
                }
                ctx.sync().await?;
                if let Some(t) = t {
                    let got = ctx.value(t) == 0;
                    ctx.cas_outcome(got).await;
                    if !got {
                        self.count(|c| c.lock_retries += 1);
                        continue;
                    }
                }
                if !read_now {
                    ctx.read(RemoteRef::new(addr, rk), Local::at(0, self.nb()));
                    ctx.sync().await?;
                }
                let b = ctx.local_vec(Local::at(0, self.nb()));
                return match Node::new(&self.t.g, &b).check(true) {
                    Ok(()) => Ok(Img { addr, b }),
                    // Nobody writes a locked node: a torn image is damage.
                    Err(_) => Err(BtreeError::Corrupt {
                        addr,
                        what: "node (checksum mismatch under its lock)",
                    }),
                };
            }
            Err(BtreeError::TooManyRetries(MAX_ATTEMPTS))
        }
        .await;
        match r {
            Ok(img) => Ok((held, img)),
            // We hold the remote lock (the CAS succeeded): release it.
            Err(e @ BtreeError::Corrupt { .. }) => {
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

    /// Queues the remote release (unless HOCL hands the lock over), posts
    /// everything queued, waits, and passes the local entry on.
    async fn unlock(&self, ctx: &Ctx, held: Held) -> Result<(), BtreeError> {
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
                ctx.set_local_u64(Local::at(self.l_word(), 8), 0);
                ctx.write(
                    RemoteRef::new(held.lock, held.rk),
                    Local::at(self.l_word(), 8),
                );
            }
            ctx.sync().await
        }
        .await;
        if let (Some(l), Some(g)) = (&self.locks, held.grant) {
            l.release(g);
        }
        Ok(r?)
    }

    /// Inserts `key` if absent; `false` if present.
    pub async fn insert(&self, ctx: &Ctx, key: &[u8], value: &[u8]) -> Result<bool, BtreeError> {
        let tk = self.check_key(ctx, key)?;
        self.check_value(value)?;
        let _op = ctx.op("insert").await;
        self.write_op(ctx, &tk, WriteMode::Insert, value).await
    }

    /// Replaces the value of `key` if present; `false` if absent.
    pub async fn update(&self, ctx: &Ctx, key: &[u8], value: &[u8]) -> Result<bool, BtreeError> {
        let tk = self.check_key(ctx, key)?;
        self.check_value(value)?;
        let _op = ctx.op("update").await;
        self.write_op(ctx, &tk, WriteMode::Update, value).await
    }

    /// Removes `key` if present; `false` if absent.
    pub async fn delete(&self, ctx: &Ctx, key: &[u8]) -> Result<bool, BtreeError> {
        let tk = self.check_key(ctx, key)?;
        let _op = ctx.op("delete").await;
        self.write_op(ctx, &tk, WriteMode::Delete, &[]).await
    }

    async fn write_op(
        &self,
        ctx: &Ctx,
        tk: &[u8],
        mode: WriteMode,
        value: &[u8],
    ) -> Result<bool, BtreeError> {
        let g = self.t.g;
        for attempt in 0..MAX_ATTEMPTS {
            let mut path = [GlobalAddr::NULL; MAX_LEVELS];
            let mut addr = self
                .locate_leaf(ctx, tk, attempt < CACHED_ATTEMPTS, &mut path)
                .await?;
            loop {
                let (held, img) = self.lock_and_read(ctx, addr).await?;
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
                    // Find the node that holds the key now by plain reads
                    // (a few hops, else a fresh descent: the node may have
                    // split many times while this task waited for its
                    // lock), and lock that one.
                    addr = match self.move_right(ctx, next, tk, MAX_WALK).await? {
                        Some(a) => a,
                        None => {
                            let a = self.locate_leaf(ctx, tk, false, &mut path).await?;
                            self.move_right(ctx, a, tk, u32::MAX)
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
                                self.split_leaf(ctx, img, held, tk, value, &mut path)
                                    .await?;
                                return Ok(true);
                            }
                        }
                    }
                };
                let at = slot_addr(&g, addr, true, target);
                ctx.put_local(Local::at(self.l_slot(), slot.len()), &slot);
                ctx.write(
                    RemoteRef::new(at, held.rk),
                    Local::at(self.l_slot(), slot.len()),
                );
                self.unlock(ctx, held).await?;
                if mode == WriteMode::Delete {
                    self.spec.remove(tk);
                } else {
                    self.spec.put(tk, at);
                }
                return Ok(true);
            }
        }
        Err(BtreeError::TooManyRetries(MAX_ATTEMPTS))
    }

    /// From `addr`, follows sibling pointers with unlocked reads to the
    /// node whose upper fence lies above `tk` (a writer that finds its
    /// node split locks only the node it ends at).
    /// `None`: not found within `max` hops.
    async fn move_right(
        &self,
        ctx: &Ctx,
        mut addr: GlobalAddr,
        tk: &[u8],
        max: u32,
    ) -> Result<Option<GlobalAddr>, BtreeError> {
        for _ in 0..max.min(MAX_ATTEMPTS) {
            let img = self.read_node(ctx, addr).await?;
            let n = Node::new(&self.t.g, &img.b);
            if n.below_hi(tk) || n.sibling().is_null() {
                return Ok(Some(addr));
            }
            self.count(|c| c.sibling_hops += 1);
            addr = n.sibling();
        }
        if max >= MAX_ATTEMPTS {
            return Err(BtreeError::TooManyRetries(MAX_ATTEMPTS));
        }
        Ok(None)
    }

    /// A new node's block, on this client's memory node if it has room.
    fn alloc_node(&self, ctx: &Ctx) -> Result<GlobalAddr, BtreeError> {
        let mut st = self.st.borrow_mut();
        let st = &mut *st;
        let nodes = self.t.nodes();
        // Each client fills chunks on one memory node (clients spread over
        // the nodes by id), so a client holds one partly used chunk.
        let prefer = nodes[st.next_node % nodes.len()];
        st.alloc
            .alloc(
                self.t.fabric.as_ref(),
                nodes,
                prefer,
                (self.nb() / 64) as u64,
                ctx.now(),
            )
            .map_err(|source| BtreeError::OutOfMemory {
                what: "allocating a node",
                source,
            })
    }

    /// Writes a new node image (`l_img2`) to `at`; waits for it unless the
    /// next write goes to the same memory node (queue-pair order).
    async fn write_new(
        &self,
        ctx: &Ctx,
        at: GlobalAddr,
        next: GlobalAddr,
    ) -> Result<(), BtreeError> {
        ctx.write(
            RemoteRef::new(at, self.t.rkey(at.node())?),
            Local::at(self.l_img2(), self.nb()),
        );
        if at.node() != next.node() {
            ctx.sync().await?;
        }
        Ok(())
    }

    /// Splits a full leaf (locked, `img`) while inserting `tk`: the upper
    /// half goes to a new right sibling, written first; then the leaf is
    /// rewritten with a new version, the lower fence of the sibling as its
    /// upper fence and the moved slots empty, and unlocked in the same
    /// batch; then the separator goes up.
    async fn split_leaf(
        &self,
        ctx: &Ctx,
        img: Img,
        held: Held,
        tk: &[u8],
        value: &[u8],
        path: &mut [GlobalAddr; MAX_LEVELS],
    ) -> Result<(), BtreeError> {
        let g = self.t.g;
        let n = Node::new(&g, &img.b);
        let mut all: Vec<(Vec<u8>, Vec<u8>)> = n.leaf_entries();
        all.push((tk.to_vec(), value.to_vec()));
        all.sort_unstable_by(|a, b| a.0.cmp(&b.0));
        let mid = all.len() / 2;
        let sep = all[mid].0.clone();
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
        ctx.put_local(Local::at(self.l_img2(), out.len()), &out);
        let r = self.write_new(ctx, right, img.addr).await;
        if let Err(e) = r {
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
                new_at = Some(slot_addr(&g, img.addr, true, i));
            } else {
                build_slot(&g, true, false, v, &[], &[], &mut slot);
                left[o..o + slot.len()].copy_from_slice(&slot);
            }
        }
        debug_assert!(placed);
        ctx.put_local(Local::at(self.l_img(), left.len()), &left);
        ctx.write(
            RemoteRef::new(img.addr, held.rk),
            Local::at(self.l_img(), self.nb()),
        );
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
        self.insert_parent(ctx, 1, sep, right, path).await
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
    ) -> Result<(), BtreeError> {
        let g = self.t.g;
        let mut hint = path[level as usize];
        for _ in 0..MAX_ATTEMPTS {
            if level as usize >= MAX_LEVELS - 1 {
                return Err(BtreeError::Corrupt {
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
                        continue;
                    }
                }
            } else {
                hint
            };
            let (held, img) = self.lock_and_read(ctx, target).await?;
            let n = Node::new(&g, &img.b);
            if n.level() != level || !n.above_lo(&sep) {
                self.unlock(ctx, held).await?;
                hint = GlobalAddr::NULL;
                continue;
            }
            if !n.below_hi(&sep) {
                self.unlock(ctx, held).await?;
                self.count(|c| c.sibling_hops += 1);
                hint = n.sibling();
                continue;
            }
            let mut es = n.inner_entries();
            let at = es.partition_point(|e| e.0 < sep);
            if es.get(at).is_some_and(|e| e.0 == sep) {
                // Already there (cannot happen: one split, one separator).
                self.unlock(ctx, held).await?;
                return Err(BtreeError::Corrupt {
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
                ctx.put_local(Local::at(self.l_img(), out.len()), &out);
                ctx.write(
                    RemoteRef::new(target, held.rk),
                    Local::at(self.l_img(), self.nb()),
                );
                self.unlock(ctx, held).await?;
                self.cache()
                    .put(Arc::new(Snapshot::of(target, &Node::new(&g, &out))));
                return Ok(());
            }
            // Split: the middle key goes up, its child becomes the new
            // node's leftmost.
            let mid = es.len() / 2;
            let (up_key, up_child) = es[mid].clone();
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
            ctx.put_local(Local::at(self.l_img2(), out.len()), &out);
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
            ctx.put_local(Local::at(self.l_img(), out.len()), &out);
            ctx.write(
                RemoteRef::new(target, held.rk),
                Local::at(self.l_img(), self.nb()),
            );
            self.unlock(ctx, held).await?;
            {
                let mut cache = self.cache();
                cache.put(Arc::new(Snapshot::of(target, &Node::new(&g, &out))));
                cache.put(Arc::new(right_snap));
            }
            self.st.borrow_mut().counters.inner_splits += 1;
            level += 1;
            sep = up_key;
            child = right;
            hint = path[level as usize];
        }
        Err(BtreeError::TooManyRetries(MAX_ATTEMPTS))
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
    ) -> Result<bool, BtreeError> {
        let g = self.t.g;
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
        ctx.put_local(Local::at(self.l_img2(), out.len()), &out);
        ctx.write(
            RemoteRef::new(at, self.t.rkey(at.node())?),
            Local::at(self.l_img2(), self.nb()),
        );
        ctx.sync().await?;
        let d = self.t.desc;
        let prev = ctx
            .cas_sync(
                RemoteRef::new(d.add(DESC_ROOT), self.t.rkey(d.node())?),
                old.raw(),
                at.raw(),
            )
            .await?;
        let mut st = self.st.borrow_mut();
        if prev == old.raw() {
            st.root = at;
            st.counters.root_grows += 1;
            self.cache()
                .put(Arc::new(Snapshot::of(at, &Node::new(&g, &out))));
            Ok(true)
        } else {
            st.alloc.free_now(at, (self.nb() / 64) as u64);
            st.root = GlobalAddr::from_raw(prev);
            Ok(false)
        }
    }

    /// Up to `count` entries with keys ≥ `from`, in key order (each leaf is
    /// read consistently; the scan as a whole is not atomic).
    pub async fn scan(
        &self,
        ctx: &Ctx,
        from: &[u8],
        count: usize,
    ) -> Result<Vec<(Vec<u8>, Vec<u8>)>, BtreeError> {
        let tk = self.check_key(ctx, from)?;
        let _op = ctx.read_op("scan").await;
        self.walk(ctx, &tk, |_| true, count).await
    }

    /// Every entry with `lo ≤ key ≤ hi`, in key order.
    pub async fn range(
        &self,
        ctx: &Ctx,
        lo: &[u8],
        hi: &[u8],
    ) -> Result<Vec<(Vec<u8>, Vec<u8>)>, BtreeError> {
        let tlo = self.check_key(ctx, lo)?;
        let thi = self.check_key(ctx, hi)?;
        if tlo > thi {
            return Ok(Vec::new());
        }
        let _op = ctx.read_op("range").await;
        self.walk(ctx, &tlo, |k| k <= thi.as_slice(), usize::MAX)
            .await
    }

    /// Every entry (for checks on a quiescent tree).
    pub async fn entries(&self, ctx: &Ctx) -> Result<Vec<(Vec<u8>, Vec<u8>)>, BtreeError> {
        let need = self.local_bytes_needed();
        if ctx.local_len() < need {
            return Err(BtreeError::LocalMemory {
                have: ctx.local_len(),
                need,
            });
        }
        let min = vec![0u8; self.t.g.tk];
        self.walk(ctx, &min, |_| true, usize::MAX).await
    }

    /// Walks leaves from the one holding `from` along sibling pointers,
    /// collecting entries ≥ `from` while `keep` holds, up to `count`.
    async fn walk(
        &self,
        ctx: &Ctx,
        from: &[u8],
        keep: impl Fn(&[u8]) -> bool,
        count: usize,
    ) -> Result<Vec<(Vec<u8>, Vec<u8>)>, BtreeError> {
        let mut path = [GlobalAddr::NULL; MAX_LEVELS];
        let mut addr = self.locate_leaf(ctx, from, true, &mut path).await?;
        let mut out = Vec::new();
        let mut first = true;
        loop {
            let img = self.read_node(ctx, addr).await?;
            let n = Node::new(&self.t.g, &img.b);
            if first && (!n.above_lo(from) || n.level() != 0) {
                self.stale_parent(&path);
                self.count(|c| c.restarts += 1);
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
    let kids: Vec<[u8; 8]> = es.iter().map(|e| e.1.raw().to_le_bytes()).collect();
    let h = HeadFields {
        count: es.len() as u16,
        ..h.clone()
    };
    build_node(
        g,
        &h,
        es.iter()
            .zip(&kids)
            .map(|(e, c)| (e.0.as_slice(), c.as_slice())),
        out,
    );
}

impl dmkit_lincheck::stress::StressClient for BtreeClient {
    type Error = BtreeError;
    async fn search(&self, ctx: &Ctx, key: &[u8]) -> Result<Option<Vec<u8>>, BtreeError> {
        BtreeClient::search(self, ctx, key).await
    }
    async fn insert(&self, ctx: &Ctx, key: &[u8], value: &[u8]) -> Result<bool, BtreeError> {
        BtreeClient::insert(self, ctx, key, value).await
    }
    async fn update(&self, ctx: &Ctx, key: &[u8], value: &[u8]) -> Result<bool, BtreeError> {
        BtreeClient::update(self, ctx, key, value).await
    }
    async fn delete(&self, ctx: &Ctx, key: &[u8]) -> Result<bool, BtreeError> {
        BtreeClient::delete(self, ctx, key).await
    }
    async fn entries(&self, ctx: &Ctx) -> Result<Vec<(Vec<u8>, Vec<u8>)>, BtreeError> {
        BtreeClient::entries(self, ctx).await
    }
}
