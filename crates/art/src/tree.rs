//! The tree: creation, the per-worker client and its operations. The
//! protocols are described in the crate docs.

use std::cell::RefCell;
use std::collections::{HashMap, VecDeque};
use std::rc::Rc;
use std::sync::{Arc, Mutex};

use dmkit_fabric::{Fabric, GlobalAddr, NodeId, RemoteRef};
use dmkit_index::{
    ClientStats, Creation, Home, IndexConfig, IndexError, LeaseConfig, MapClient, RemoteMap, Retry,
    RetryPolicy, Shape,
};
use dmkit_runtime::alloc::{BlockAlloc, MAX_UNITS};
use dmkit_runtime::machine::{PerMachine, TicketGrant, TicketLocks};
use dmkit_runtime::{Ctx, Local, LocalLayout, Nanos};
use zerocopy::{FromBytes, IntoBytes};

#[cfg(feature = "cli")]
use clap::ArgAction::Set;
#[cfg(feature = "cli")]
use dmkit_index::cli::{parse_size as size, parse_switch as switch};

use crate::cache::{Cache, CacheIndex, NodeView, Reader};
use crate::layout::*;
use crate::rdwc::{self, Outcome, Role};

/// The structure's kind: its roots are `art/NAME`.
pub const KIND: &str = "art";

/// Configuration of a tree (structure) and of its clients (cache, rear
/// lock, chunk size, retries). With the `cli` feature it is a set of
/// command-line flags (`clap::Args`): the switches and the cache are flags,
/// the structural settings come from the workload ([`IndexConfig::fit`]).
#[derive(Debug, Clone, PartialEq)]
#[cfg_attr(feature = "cli", derive(clap::Args))]
#[cfg_attr(
    feature = "cli",
    command(next_help_heading = "Radix tree (--index art)")
)]
pub struct ArtConfig {
    /// Longest key in bytes (stored in the tree; 1..=254).
    #[cfg_attr(feature = "cli", arg(skip = ArtConfig::default().max_key))]
    pub max_key: usize,
    /// Longest value in bytes (stored in the tree).
    #[cfg_attr(feature = "cli", arg(skip = ArtConfig::default().max_value))]
    pub max_value: usize,
    /// Radix tree: in-place leaf updates under the leaf lock (off:
    /// out-of-place leaves swung by CAS).
    ///
    /// SMART's "update-in-place leaf node"; off, leaves are sized to their
    /// item and replaced by CAS on the parent slot (RCU) — the pure
    /// lock-free ART of §4.5, and the form variable-size values take.
    /// Stored in the tree.
    #[cfg_attr(
        feature = "cli",
        arg(long = "in-place-leaf", value_name = "on|off", value_parser = switch, default_value = "on", action = Set)
    )]
    pub in_place: bool,
    /// Radix tree: release the leaf lock with the write-back.
    ///
    /// SMART's "rear embedded lock"; off, a separate WRITE releases it
    /// after the write-back completed (one more round trip). In-place
    /// leaves only.
    #[cfg_attr(
        feature = "cli",
        arg(long = "rear-lock", value_name = "on|off", value_parser = switch, default_value = "on", action = Set)
    )]
    pub rear_lock: bool,
    /// Radix tree: bytes of internal nodes each compute machine caches,
    /// shared by its threads (0 disables).
    #[cfg_attr(
        feature = "cli",
        arg(long = "art-cache", id = "art_cache", value_name = "BYTES", value_parser = size, default_value = "64MiB")
    )]
    pub cache_bytes: usize,
    /// Radix tree: start a scan at the deepest cached node on its start
    /// key's path, read now, instead of at the root.
    ///
    /// As SMART's artifact starts a range query from its compute-side
    /// cache. The snapshots only name the nodes (whose key prefixes never
    /// change); every node a scan uses is read from remote memory, and the
    /// keys after the start node's subtree come from its ancestors, read
    /// when the scan gets there (see `ArtClient::scan_start`). Off, or with
    /// the cache off, every scan starts at the root. Client-side only.
    #[cfg_attr(
        feature = "cli",
        arg(long = "scan-from-cache", value_name = "on|off", value_parser = switch, default_value = "on", action = Set)
    )]
    pub scan_from_cache: bool,
    /// Radix tree: the node sizes internal nodes grow through.
    ///
    /// The radix-tree paper's "homogeneous adaptive internal node" (§4.1.1,
    /// the first factor of Figure 17) as its artifact switches it:
    /// homogeneous slots (partial key in the slot) in both, and with
    /// `homogeneous` the finer sizes they allow (NODE_4/8/16/32/64/128/256)
    /// instead of ART's four (NODE_4/16/48/256), so nodes are read and
    /// cached with fewer empty slots. Stored in the tree.
    #[cfg_attr(
        feature = "cli",
        arg(
            long = "art-node-layout",
            value_name = "LAYOUT",
            value_enum,
            default_value = "fixed-types"
        )
    )]
    pub node_layout: NodeLayout,
    /// Radix tree: how a compute machine's cache finds its snapshots.
    ///
    /// `art`: by the cached nodes' own slots from the root (the paper's
    /// ART-indexed cache, §4.3, the second factor of Figure 17); `hash`:
    /// through a hash table keyed by each node's key prefix, which every
    /// entry stores (and pays for in the budget) once more.
    #[cfg_attr(
        feature = "cli",
        arg(
            long = "art-cache-index",
            value_name = "INDEX",
            value_enum,
            default_value = "art"
        )
    )]
    pub cache_index: CacheIndex,
    /// Radix tree: lock-free internal nodes (off: every internal-node change
    /// under a remote node lock — Figure 15's baseline).
    ///
    /// SMART §4.1. Off, every change of an internal node (insert into it,
    /// split, type switch) first takes a lock on the node in a lock table
    /// on the memory node (CAS with backoff) and releases it after (a
    /// WRITE): two more round trips per change and serialised writers, as a
    /// lock-based ART on disaggregated memory pays.
    #[cfg_attr(
        feature = "cli",
        arg(long = "lock-free-internal", value_name = "on|off", value_parser = switch, default_value = "on", action = Set)
    )]
    pub lock_free_internal: bool,
    /// Radix tree: read delegation and write combining among a compute
    /// machine's tasks.
    ///
    /// Concurrent searches of one key on a machine share one remote search
    /// (§4.2; the rdwc module says when they may). The flag `--rdwc`
    /// switches write combining with it: fitting the configuration to a
    /// workload copies this switch to write_combining.
    #[cfg_attr(
        feature = "cli",
        arg(long = "rdwc", value_name = "on|off", value_parser = switch, default_value = "on", action = Set)
    )]
    pub read_delegation: bool,
    /// Radix tree: a compute machine's writers of a leaf queue on a local
    /// lock before they try its remote lock (without write combining).
    ///
    /// The local half of Sherman's hierarchical on-chip lock (HOCL), which
    /// the radix-tree paper gives its baselines (§5.1) and compares with
    /// RDWC in Figure 16. The local locks are hashed by the leaf's address
    /// (several leaves may share one). Off, every writer retries the remote
    /// lock itself. With write combining on, its windows order a machine's
    /// writers instead and this switch does nothing.
    #[cfg_attr(
        feature = "cli",
        arg(long = "leaf-hocl", value_name = "on|off", value_parser = switch, default_value = "on", action = Set)
    )]
    pub leaf_hocl: bool,
    /// Radix tree: times in a row a held leaf lock passes to the next local
    /// writer before it is released remotely (0: never; `--leaf-hocl` only).
    ///
    /// HOCL's hand-over (Sherman's bound is 8): the holder writes the leaf
    /// back without releasing its lock, and the next writer of the machine
    /// queued on the same leaf reads the leaf and writes it without a CAS.
    /// With `--rear-lock on` this is the radix-tree paper's E-HOCL, off its
    /// HOCL (Figure 16). A lock handed over keeps its lease word (renewed
    /// by the new holder when too little is left).
    #[cfg_attr(
        feature = "cli",
        arg(long = "leaf-handover", value_name = "N", default_value_t = ArtConfig::default().leaf_handover)
    )]
    pub leaf_handover: u32,
    /// Radix tree: a writer handed a leaf lock (`--leaf-handover`) reads
    /// the leaf again (on) or starts from the leaf its predecessor wrote
    /// back (off).
    ///
    /// While a machine holds a leaf's lock nobody else writes the leaf, so
    /// the image the predecessor wrote back is the leaf: the next writer
    /// holds the lock for its WRITE alone, one round trip. SMART's artifact
    /// goes further (its writer reads the leaf before it queues and never
    /// again under the lock, `Tree::in_place_update_leaf`); on, a handed
    /// lock is held for a READ and a WRITE, as every lock taken by CAS.
    #[cfg_attr(
        feature = "cli",
        arg(long = "leaf-handover-reread", value_name = "on|off", value_parser = switch, default_value = "off", action = Set)
    )]
    pub handover_reread: bool,
    /// Entries of a compute machine's local leaf-lock table (`leaf_hocl`),
    /// which leaves share by the hash of their lock's address: a lock
    /// handed over through a shared entry may be another leaf's, and is
    /// then released by the writer it reached.
    #[cfg_attr(feature = "cli", arg(skip = ArtConfig::default().leaf_lock_entries))]
    pub leaf_lock_entries: usize,
    /// Concurrent updates of one key on a machine share one write-back
    /// (§4.2). No flag of its own: `--rdwc` sets it through
    /// [`IndexConfig::fit`].
    #[cfg_attr(feature = "cli", arg(skip = ArtConfig::default().write_combining))]
    pub write_combining: bool,
    /// Bytes a client asks the memory node for at a time for its nodes.
    #[cfg_attr(feature = "cli", arg(skip = ArtConfig::default().chunk_bytes))]
    pub chunk_bytes: u64,
    /// How long an operation keeps retrying before it gives up.
    #[cfg_attr(feature = "cli", arg(skip))]
    pub retry: RetryPolicy,
    /// Leases of the tree's locks (leaf locks, and node locks when internal
    /// nodes are not lock-free): how long a client that died blocks one.
    #[cfg_attr(feature = "cli", arg(skip))]
    pub lease: LeaseConfig,
}

impl Default for ArtConfig {
    fn default() -> Self {
        Self {
            max_key: 32,
            max_value: 64,
            in_place: true,
            rear_lock: true,
            cache_bytes: 64 << 20,
            scan_from_cache: true,
            node_layout: NodeLayout::FixedTypes,
            cache_index: CacheIndex::Art,
            lock_free_internal: true,
            read_delegation: true,
            write_combining: true,
            leaf_hocl: true,
            leaf_handover: LEAF_LOCK_HANDOVER,
            handover_reread: false,
            leaf_lock_entries: LOCK_WORDS as usize,
            chunk_bytes: 4 << 20,
            retry: RetryPolicy::default(),
            lease: LeaseConfig::default(),
        }
    }
}

impl IndexConfig for ArtConfig {
    /// Limits for the shape's keys and values (values of at least 8
    /// bytes). The radix tree has no other structural setting a workload
    /// decides. Switches stay as they are, but for one rule: write
    /// combining follows read delegation (the command line's single
    /// `--rdwc`, as the radix-tree paper's Figure 15 switches the two
    /// together).
    fn fit(&mut self, shape: &Shape) {
        self.max_key = shape.max_key;
        self.max_value = shape.max_value.max(8);
        self.write_combining = self.read_delegation;
    }

    fn key_limits(&self) -> (usize, usize) {
        (1, self.max_key)
    }

    fn max_value(&self) -> usize {
        self.max_value
    }

    /// A leaf per key, twice (updates out of place, inserts of new keys),
    /// and internal nodes of 2 KiB each (room for NODE_256): about one per
    /// six keys of fixed length (random integers branch early), one and a
    /// half per key for variable-length keys, whose long shared prefixes
    /// split into chains; two node chunks per client and 64 MiB of slack.
    /// (A node's memory is touched only where it is used.)
    fn memory_estimate(&self, shape: &Shape) -> u64 {
        let leaf = leaf_bytes(shape.max_key, shape.max_value.max(8)).next_multiple_of(64) as u64;
        let node = NODE_BYTES.next_multiple_of(64) as u64;
        let nodes = if shape.fixed_keys {
            shape.keys.div_ceil(6)
        } else {
            shape.keys + shape.keys / 2
        };
        2 * shape.keys * leaf
            + nodes * node
            + shape.clients as u64 * 2 * self.chunk_bytes
            + (64 << 20)
    }
}

impl ArtConfig {
    fn validate(&self) -> Result<(), IndexError> {
        let bad = |s: String| Err(IndexError::config(KIND, s));
        if self.max_key == 0 || self.max_key > MAX_KEY_LIMIT {
            return bad(format!(
                "max_key {} must be in 1..={MAX_KEY_LIMIT}",
                self.max_key
            ));
        }
        if leaf_bytes(self.max_key, self.max_value) > MAX_UNITS as usize * 64 {
            return bad(format!(
                "a leaf of max_key {} + max_value {} exceeds {} B",
                self.max_key,
                self.max_value,
                MAX_UNITS * 64
            ));
        }
        if self.leaf_lock_entries == 0 {
            return bad("leaf_lock_entries must be positive".into());
        }
        if self.chunk_bytes < NODE_BYTES as u64 * 4 {
            return bad(format!("chunk_bytes {} is too small", self.chunk_bytes));
        }
        self.lease
            .validate()
            .map_err(|why| IndexError::config(KIND, why))
    }

    /// Room for the key in every leaf.
    fn kcap(&self) -> usize {
        self.max_key
    }
}

/// Counters of the tree's own making (beyond the runtime's).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct TreeCounters {
    /// Operations that reached their leaf through cached nodes only.
    pub cache_hits: u64,
    /// Searches that are not cache hits: they read an internal node from remote
    /// memory, restarted, or found no leaf for the key.
    pub cache_misses: u64,
    /// Leaf splits (SMART, OSDI'23 §4.1.2): an insert met a leaf of another key
    /// and linked new internal nodes holding both.
    pub leaf_splits: u64,
    /// Header splits (SMART, OSDI'23 §4.1.2): an insert's key left a node's
    /// in-header partial keys, so a new NODE_4 went above it.
    pub header_splits: u64,
    /// In-place node type switches (SMART, OSDI'23 §4.1.2) to a larger type,
    /// e.g. NODE_4 → NODE_16.
    pub type_switches: u64,
    /// Restarts after a stale cache entry or a concurrent change.
    pub restarts: u64,
    /// Failed attempts at a leaf's lock (each retried on the same leaf).
    pub lock_retries: u64,
    /// Leaf reads whose checksum failed (a write in progress); each is read
    /// again.
    pub torn_reads: u64,
    /// Searches answered by another task's search (read delegation).
    pub delegated_reads: u64,
    /// Updates carried by another task's write-back (write combining).
    pub combined_writes: u64,
    /// Expired leases this client broke (locks of clients that died
    /// holding them).
    pub leases_broken: u64,
    /// Expired "replaced" marks this client undid (out-of-place updates
    /// whose client died between marking the leaf and swinging its slot);
    /// also counted in `leases_broken`.
    pub marks_undone: u64,
    /// Bytes of new out-of-place leaves this client wrote and neither
    /// linked nor freed: what it left behind when it died mid-update, or
    /// handed to the client that undid its expired mark (counted there in
    /// `leaf_bytes_reclaimed`); 0 for a live client between operations
    /// otherwise.
    pub unlinked_leaf_bytes: u64,
    /// Bytes of other updaters' never-linked new leaves this client took
    /// into its allocator after undoing their expired marks (read from
    /// the marked leaf's intent word). Over all of a tree's clients,
    /// `Σ unlinked_leaf_bytes − Σ leaf_bytes_reclaimed` is what dead
    /// updaters leaked.
    pub leaf_bytes_reclaimed: u64,
    /// Leaf locks a local predecessor handed over to this client (HOCL,
    /// `leaf_handover`): taken without a CAS.
    pub lock_handovers: u64,
    /// Leaf locks handed over through a shared local entry that were
    /// another leaf's: this client released that one, then took its own.
    pub foreign_handovers: u64,
    /// Scans that started below the root, at a node named by the cache
    /// (`ArtConfig::scan_from_cache`).
    pub cached_scan_starts: u64,
}

/// [`IndexError::Corrupt`]: the bytes at `addr` are not the `what` the
/// tree wrote there.
fn corrupt(addr: GlobalAddr, what: &'static str) -> IndexError {
    IndexError::Corrupt { addr, what }
}

/// Consecutive local hand-overs of a node lock (Sherman's HOCL bound).
const NODE_LOCK_HANDOVER: u32 = 8;
/// The default of [`ArtConfig::leaf_handover`]: Sherman's bound too
/// (`kMaxHandOverTime` in its artifact), as the radix-tree paper applies
/// Sherman's HOCL.
const LEAF_LOCK_HANDOVER: u32 = 8;

/// The task-local memory of the tree's operations, declared once per tree
/// (see [`dmkit_runtime::LocalLayout`]).
#[derive(Debug, Clone, Copy)]
struct Scratch {
    /// An internal node as a traversal reads it (up to all 256 slots).
    node: Local,
    /// One word: a released lock, a reverse pointer.
    word: Local,
    /// A leaf read under its lock, or the item a search reads.
    leaf: Local,
    /// The image of a new or rewritten leaf.
    new: Local,
    /// The nodes one split writes, one piece of [`Scratch::CHAIN_PIECE`]
    /// bytes each.
    chain: Local,
    /// The scan's window: one piece of `scan_item` bytes per node or leaf
    /// fetched in a round.
    scan: Local,
    /// Bytes of a scan piece: a whole node or a whole leaf.
    scan_item: usize,
}

impl Scratch {
    /// Bytes of a split's piece: a new node's image, padded.
    const CHAIN_PIECE: usize = NEW_NODE.next_multiple_of(64);

    /// The regions for leaves of `leaf_bytes` bytes. The scan's window
    /// takes what the other regions leave of [`SCAN_BUDGET`]: 2 to
    /// [`SCAN_WIDTH`] items.
    fn declare(leaf_bytes: usize) -> (Self, LocalLayout) {
        let leaf = leaf_bytes.next_multiple_of(64);
        let mut l = LocalLayout::new();
        let node = l.region("internal node", NODE_BYTES);
        let word = l.region("word", 8);
        let leaf_r = l.region("leaf", leaf);
        let new = l.region("new leaf", leaf);
        let chain = l.region("split chain", MAX_CHAIN * Self::CHAIN_PIECE);
        let scan_item = leaf.max(NODE_BYTES.next_multiple_of(64));
        let at = l.bytes().next_multiple_of(64);
        let width = (SCAN_BUDGET.saturating_sub(at) / scan_item).clamp(2, SCAN_WIDTH);
        let scan = l.region("scan window", width * scan_item);
        let s = Scratch {
            node,
            word,
            leaf: leaf_r,
            new,
            chain,
            scan,
            scan_item,
        };
        (s, l)
    }

    /// Items a scan fetches per round.
    fn scan_width(&self) -> usize {
        self.scan.len() / self.scan_item
    }
}

/// A tree: what every client of it shares. `Send + Sync`; make one
/// [`ArtClient`] per worker with [`ArtTree::client`].
pub struct ArtTree {
    /// The tree's identity: fabric, nodes and keys, root, client chunks.
    pub(crate) home: Home,
    pub(crate) cfg: ArtConfig,
    pub(crate) root: GlobalAddr,
    /// The node-lock table.
    locks: GlobalAddr,
    /// Task-local memory of the operations.
    scratch: Scratch,
    layout: LocalLayout,
    /// Whether one WRITE's words land in address order (rear lock).
    in_order: bool,
    /// Read-delegation and write-combining windows, one table per compute
    /// machine.
    rdwc: PerMachine<rdwc::Table>,
    /// Caches of internal nodes, one per compute machine.
    caches: PerMachine<Cache>,
    /// Local halves of the node locks (HOCL), one table per compute
    /// machine, used when internal nodes are not lock-free.
    node_locks: PerMachine<TicketLocks>,
    /// Local queues for leaf locks (HOCL: hashed by the lock's address,
    /// with hand-over), one table per compute machine, used when write
    /// combining (whose local locks order a machine's writers) is off and
    /// `leaf_hocl` on.
    leaf_locks: PerMachine<LeafLocks>,
}

/// A leaf lock kept for the next local writer: its word (lease), which
/// lock it is (its address), and the leaf as written back (an update's;
/// `None` after a delete, or when the next writer reads it again).
struct Kept {
    word: u64,
    tag: u64,
    image: Option<Vec<u8>>,
}

/// A compute machine's local leaf-lock table (HOCL's local half) and, per
/// entry, the leaf its holder wrote back before handing the remote lock
/// over: the next writer of that leaf starts from it instead of reading
/// the leaf again (`ArtConfig::handover_reread` off).
struct LeafLocks {
    q: TicketLocks,
    /// Entry → the leaf image (whole leaf, as written back) that went with
    /// the last hand-over through it. Present only while the entry's lock
    /// is handed over after an update; never used for another leaf's lock.
    images: Mutex<HashMap<usize, Vec<u8>>>,
}

/// Bytes of the descriptor's chunk before the node-lock table: the
/// descriptor, then the root node.
const ROOT_END: u64 = (DESC_BYTES + NODE_BYTES as u64).next_multiple_of(64);
/// The root node sits right after the descriptor.
const DESC_BYTES: u64 = std::mem::size_of::<TreeDesc>() as u64;

impl ArtTree {
    fn assemble(home: Home, cfg: ArtConfig, root: GlobalAddr, locks: GlobalAddr) -> Self {
        let in_order = home.fabric().caps().in_order_write;
        let (scratch, layout) = Scratch::declare(leaf_bytes(cfg.kcap(), cfg.max_value));
        Self {
            home,
            cfg,
            root,
            locks,
            scratch,
            layout,
            in_order,
            rdwc: PerMachine::default(),
            caches: PerMachine::default(),
            node_locks: PerMachine::default(),
            leaf_locks: PerMachine::default(),
        }
    }

    /// The root node's address.
    pub fn root(&self) -> GlobalAddr {
        self.root
    }

    /// The reference to `addr` (its node's heap key attached).
    #[inline]
    pub(crate) fn remote(&self, addr: GlobalAddr) -> Result<RemoteRef, IndexError> {
        self.home.remote(addr)
    }

    /// Bytes of a leaf at full capacity (in-place leaves).
    pub(crate) fn leaf_cap(&self) -> usize {
        leaf_bytes(self.cfg.kcap(), self.cfg.max_value)
    }
}

struct ClientState {
    /// Scratch for decoding leaves.
    buf: Vec<u8>,
    alloc: BlockAlloc,
    /// Lock owner id (`dmkit_index::lease::owner_of` of the client id).
    owner: u16,
    counters: TreeCounters,
}

/// A worker's handle on a tree. Clone it into the worker's tasks; not
/// `Send` (one per worker).
#[derive(Clone)]
pub struct ArtClient {
    t: Arc<ArtTree>,
    rdwc: Arc<rdwc::Table>,
    /// The machine's local node-lock table (baseline without lock-free
    /// internal nodes only).
    node_locks: Option<Arc<TicketLocks>>,
    /// The machine's local leaf-lock queues (without write combining).
    leaf_locks: Option<Arc<LeafLocks>>,
    /// The machine's cache of internal nodes (never locked across an
    /// await).
    cache: Arc<Cache>,
    st: Rc<RefCell<ClientState>>,
}

/// The slot that led to a node: its parent, the slot's address and the
/// word it held when read.
#[derive(Debug, Clone, Copy)]
struct Link {
    parent: GlobalAddr,
    slot_addr: GlobalAddr,
    slot: Slot,
}

/// Where a traversal ended.
enum Kind {
    /// The key leaves the node's partial keys at index `j`.
    Mismatch(usize),
    /// No slot for the key's byte at position `pos`.
    NoSlot { pos: usize },
    /// Slot `idx` holds the key's byte at `pos` and points at a leaf.
    Leaf { pos: usize, idx: usize, slot: Slot },
}

struct Pos {
    v: Arc<NodeView>,
    /// Read from remote memory by this operation (not a cached snapshot).
    fresh: bool,
    /// Key position at which the traversal arrived at `v`.
    e: usize,
    link: Option<Link>,
    kind: Kind,
}

/// Where a traversal starts.
#[derive(Clone, Copy)]
enum Start {
    /// The deepest cached node on the key's path (the root if the cache is
    /// off or cold).
    Top { use_cache: bool },
    /// `addr`, read now (type `ty` at least, arrived at key position `e`).
    Node {
        addr: GlobalAddr,
        ty: NodeType,
        e: usize,
        link: Option<Link>,
    },
}

/// A leaf as read.
struct LeafCopy {
    meta: u64,
    key: Vec<u8>,
    value: Vec<u8>,
}

impl LeafCopy {
    fn valid(&self) -> bool {
        self.meta & META_VALID != 0
    }
}

/// Node images written by one split (a chain of at most this many nodes).
const MAX_CHAIN: usize = MAX_KEY_LIMIT / (HEADER_PREFIX + 1) + 2;
/// Task-local bytes the scan's window is sized for, with the other
/// regions (see [`Scratch`]).
const SCAN_BUDGET: usize = 64 << 10;
/// Most items a scan fetches in one round trip.
const SCAN_WIDTH: usize = 32;
/// How often a joiner checks its window (ns).
const WAIT_NS: Nanos = 500;
/// Torn reads of one leaf in a row after which its checksum is taken to
/// never match (corrupt memory rather than a write-back in progress).
const TORN_LIMIT: u32 = 1000;
/// Attempts that may use the cache (later ones traverse from the root).
const CACHED_ATTEMPTS: u32 = 3;

/// What a leaf read found relative to the key.
enum LeafIs {
    /// Holds the key, valid.
    Live(LeafCopy),
    /// Holds the key, being replaced out of place: `mark` is its meta word
    /// (with the mark's lease deadline), `unmarked` the word that undoes
    /// it (retry, or undo an expired mark).
    Replaced { mark: u64, unmarked: u64 },
    /// Holds the key, deleted.
    Dead,
    /// Holds another key (`dead`: deleted).
    Other { key: Vec<u8>, dead: bool },
}

/// Write operations sharing one traversal loop.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum WriteMode {
    Insert,
    Update,
    Delete,
}

impl WriteMode {
    /// The operation's name (in a [`IndexError::Timeout`]).
    fn name(self) -> &'static str {
        match self {
            WriteMode::Insert => "insert",
            WriteMode::Update => "update",
            WriteMode::Delete => "delete",
        }
    }
}

impl ArtClient {
    /// The tree this client works on.
    pub fn tree(&self) -> &Arc<ArtTree> {
        &self.t
    }

    /// This client's counters.
    pub fn counters(&self) -> TreeCounters {
        self.st.borrow().counters
    }

    /// Snapshots the machine's cache holds, and their bytes.
    pub fn cache_usage(&self) -> (usize, usize) {
        let c = self.cache();
        (c.len(), c.bytes())
    }

    /// The machine's cache.
    fn cache(&self) -> &Cache {
        &self.cache
    }

    /// The task-local memory of the tree's operations.
    #[inline(always)]
    fn sc(&self) -> &Scratch {
        &self.t.scratch
    }

    /// Bytes of the largest leaf (in-place leaves: every leaf), in whole
    /// 64-byte units.
    fn leaf_room(&self) -> usize {
        self.sc().leaf.len()
    }

    /// Whether the task has the memory the tree declared.
    fn check_local(&self, ctx: &Ctx) -> Result<(), IndexError> {
        dmkit_index::check_local(ctx, &self.t.layout)
    }

    fn check_key(&self, ctx: &Ctx, key: &[u8]) -> Result<(), IndexError> {
        if key.is_empty() || key.len() > self.t.cfg.max_key {
            return Err(IndexError::KeyLength {
                len: key.len(),
                min: 1,
                max: self.t.cfg.max_key,
            });
        }
        self.check_local(ctx)
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

    fn tree_key(&self, key: &[u8]) -> Vec<u8> {
        let mut tk = Vec::with_capacity(self.t.cfg.max_key + 1);
        tree_key(key, self.t.cfg.max_key, &mut tk);
        tk
    }

    fn count(&self, f: impl FnOnce(&mut TreeCounters)) {
        f(&mut self.st.borrow_mut().counters)
    }

    /// A lost race of an operation that starts over: counts it in `retry`
    /// (which gives up once the tree's [`RetryPolicy`] is spent) and backs
    /// off through the runtime.
    async fn pause(&self, ctx: &Ctx, retry: &mut Retry) -> Result<(), IndexError> {
        retry.backoff(ctx).await?;
        self.count(|c| c.restarts += 1);
        Ok(())
    }

    /// Where to start over after the races `retry` counted.
    fn top(retry: &Retry) -> Start {
        Start::Top {
            use_cache: retry.attempts() < CACHED_ATTEMPTS,
        }
    }

    // ---- reading -------------------------------------------------------

    /// Reads node `addr` (at least `ty`'s slots; the rest too if its header
    /// says it grew) arriving at key position `e`. `None` if the node is not
    /// where the caller thinks: deleted, its header moved past `e` (a
    /// header split finished after the parent was read), or — when
    /// `expect_rev` is given — its reverse pointer names another parent.
    /// `tk` is the key the traversal follows (a hash-indexed cache files
    /// the snapshot under its bytes before `e`).
    #[allow(clippy::too_many_arguments)]
    async fn read_node(
        &self,
        ctx: &Ctx,
        addr: GlobalAddr,
        ty: NodeType,
        e: usize,
        expect_rev: Option<GlobalAddr>,
        tk: &[u8],
    ) -> Result<Option<Arc<NodeView>>, IndexError> {
        let node = self.t.remote(addr)?;
        let ty = ty.max(NodeType::N4);
        let buf = self.sc().node;
        ctx.read(node, buf.prefix(ty.read_bytes()));
        ctx.sync().await?;
        let head: NodeHead = ctx.get_as(buf.prefix(NODE_HEAD));
        let header = Header(head.header);
        let Some(hty) = header.ty() else {
            return Err(corrupt(addr, "internal node header"));
        };
        if hty > ty {
            ctx.read(
                node.add(ty.read_bytes() as u64),
                buf.slice(ty.read_bytes(), hty.read_bytes() - ty.read_bytes()),
            );
            ctx.sync().await?;
        }
        let rev = GlobalAddr::from_raw(head.rev);
        let d = header.depth();
        if hty == NodeType::Deleted
            || d > e
            || e - d > header.prefix_len()
            || expect_rev.is_some_and(|r| r != rev)
        {
            self.cache().remove(addr);
            return Ok(None);
        }
        let mut slots = vec![0u64; hty.slots()];
        ctx.get_local(buf.skip(NODE_SLOTS as usize), slots.as_mut_bytes());
        let v =
            Arc::new(NodeView::new(addr, header, rev, slots).with_prefix(self.prefix_of(tk, e)));
        self.cache().put(v.clone());
        Ok(Some(v))
    }

    /// What a snapshot of the node arrived at position `e` of `tk` is filed
    /// under: its key prefix with a hash-indexed cache, nothing otherwise.
    fn prefix_of(&self, tk: &[u8], e: usize) -> Option<Box<[u8]>> {
        (self.t.cfg.cache_index == CacheIndex::Hash).then(|| tk[..e].into())
    }

    /// Reads the leaf of `slot` and classifies it against `key`; re-reads
    /// a torn leaf (a write-back in progress).
    async fn read_leaf(&self, ctx: &Ctx, slot: Slot, key: &[u8]) -> Result<LeafIs, IndexError> {
        let addr = slot.ptr();
        let leaf = self.t.remote(addr)?;
        // The item only: meta word, key and value (not the reverse pointer
        // before it nor the lock word after it; see `layout`).
        let len = item_len(self.leaf_len(slot)?);
        let mut retry = Retry::new("leaf read", self.t.cfg.retry);
        loop {
            let item = self.sc().leaf.prefix(len);
            ctx.read(leaf.add(LEAF_META), item);
            ctx.sync().await?;
            if let Some(is) = self.with_item(ctx, item, |l| l.map(|l| classify(&l, key))) {
                return Ok(is);
            }
            self.count(|c| c.torn_reads += 1);
            if retry.attempts() >= TORN_LIMIT {
                return Err(corrupt(addr, "leaf (checksum never matches)"));
            }
            retry.backoff(ctx).await?;
        }
    }

    /// Bytes to read for the leaf of `slot`.
    fn leaf_len(&self, slot: Slot) -> Result<usize, IndexError> {
        if self.t.cfg.in_place {
            return Ok(self.t.leaf_cap());
        }
        let n = slot.units() as usize * 64;
        if n == 0 || n > self.leaf_room() {
            return Err(corrupt(slot.ptr(), "leaf slot length"));
        }
        Ok(n)
    }

    /// Decodes the item of a whole leaf read into task-local `leaf`
    /// (reverse pointer to lock word).
    fn decode(&self, ctx: &Ctx, leaf: Local) -> Option<LeafCopy> {
        let item = leaf.slice(LEAF_META as usize, item_len(leaf.len()));
        self.with_item(ctx, item, |l| {
            l.map(|l| LeafCopy {
                meta: l.meta,
                key: l.key.to_vec(),
                value: l.value.to_vec(),
            })
        })
    }

    /// Decodes the leaf item (meta word on) read into task-local `item`
    /// through the client's reusable buffer (no allocation on the search
    /// path).
    fn with_item<R>(
        &self,
        ctx: &Ctx,
        item: Local,
        f: impl FnOnce(Option<crate::layout::Item<'_>>) -> R,
    ) -> R {
        let mut buf = std::mem::take(&mut self.st.borrow_mut().buf);
        buf.resize(item.len(), 0);
        ctx.get_local(item, &mut buf);
        let r = f(decode_item(&buf, self.t.cfg.kcap()));
        self.st.borrow_mut().buf = buf;
        r
    }

    /// Walks the cached snapshots from the root along `tk`: the deepest
    /// cached node, the key position it was reached at and its link.
    fn cache_walk(&self, tk: &[u8]) -> Option<(Arc<NodeView>, usize, Option<Link>)> {
        self.walk_cached(tk, |v, e, link| (v.clone(), e, link))
    }

    /// The leaf slot of `tk` if the cached snapshots lead to one (nothing
    /// is read remotely; the slot still has to be checked against the leaf).
    fn cached_leaf_slot(&self, tk: &[u8]) -> Option<Slot> {
        self.walk_cached(tk, |v, e, _| {
            let pos = v.match_prefix(e, tk).ok().filter(|&p| p < tk.len())?;
            let (_, s) = v.find(tk[pos])?;
            s.is_leaf().then_some(s)
        })
        .flatten()
    }

    /// Walks the cached snapshots from the root along `tk` and hands the
    /// deepest one reached (with the key position it was arrived at and
    /// the slot that led there) to `f`, under the cache's read lock.
    fn walk_cached<R>(
        &self,
        tk: &[u8],
        f: impl FnOnce(&Arc<NodeView>, usize, Option<Link>) -> R,
    ) -> Option<R> {
        let cache: Reader<'_> = self.cache().reader();
        let mut v = cache.get(self.t.root)?;
        let (mut e, mut link) = (0, None);
        loop {
            let Ok(pos) = v.match_prefix(e, tk) else {
                return Some(f(v, e, link));
            };
            let Some((idx, s)) = v.find(tk[pos]) else {
                return Some(f(v, e, link));
            };
            if s.is_leaf() {
                return Some(f(v, e, link));
            }
            let child = match self.t.cfg.cache_index {
                CacheIndex::Art => cache.get_touch(s.ptr()),
                // By the key's bytes up to the child, then marked used.
                CacheIndex::Hash => cache
                    .side()
                    .get(&tk[..pos + 1])
                    .filter(|c| c.addr == s.ptr())
                    .and_then(|c| cache.get_touch(c.addr)),
            };
            match child {
                Some(c) if c.header.depth() <= pos + 1 && c.rev == v.addr => {
                    link = Some(Link {
                        parent: v.addr,
                        slot_addr: v.slot_addr(idx),
                        slot: s,
                    });
                    v = c;
                    e = pos + 1;
                }
                _ => return Some(f(v, e, link)),
            }
        }
    }

    /// Traverses to where `tk` ends: a prefix mismatch, a missing slot, or
    /// the leaf slot of the key's byte. Mismatches and missing slots are
    /// only reported from nodes read now; a leaf slot may come from a
    /// cached snapshot (`Pos::fresh` false). `None`: start over.
    ///
    /// With `proves_absence` (a search, update or delete, which answers
    /// "absent" on a mismatch), a mismatch at a node reached by a link this
    /// traversal did not read is reported only once the link's slot still
    /// names the node (see the crate doc's header split). An insert needs
    /// no check: the header split it starts CASes that slot.
    async fn descend(
        &self,
        ctx: &Ctx,
        tk: &[u8],
        from: Start,
        proves_absence: bool,
    ) -> Result<Option<Pos>, IndexError> {
        let (mut v, mut e, mut link, mut fresh) = match from {
            Start::Top { use_cache } => match use_cache.then(|| self.cache_walk(tk)).flatten() {
                Some((v, e, link)) => (v, e, link, false),
                None => match self
                    .read_node(ctx, self.t.root, NodeType::N256, 0, None, tk)
                    .await?
                {
                    Some(v) => (v, 0, None, true),
                    None => return Err(corrupt(self.t.root, "root node")),
                },
            },
            Start::Node { addr, ty, e, link } => {
                match self.read_node(ctx, addr, ty, e, None, tk).await? {
                    Some(v) => (v, e, link, true),
                    None => return Ok(None),
                }
            }
        };
        // Whether `v`'s parent was read by this traversal, so that it named
        // `v` after the operation began (the root has no parent). A link
        // from a snapshot, or carried over from an earlier traversal, may
        // be stale: a header split can have put a new node above `v`.
        let mut linked = link.is_none();
        loop {
            let step = match v.match_prefix(e, tk) {
                Err(j) => Err(Kind::Mismatch(j)),
                Ok(pos) if pos >= tk.len() => {
                    return Err(corrupt(v.addr, "internal node deeper than the key"))
                }
                Ok(pos) => match v.find(tk[pos]) {
                    None => Err(Kind::NoSlot { pos }),
                    Some((idx, slot)) if slot.is_leaf() => {
                        return Ok(Some(Pos {
                            v,
                            fresh,
                            e,
                            link,
                            kind: Kind::Leaf { pos, idx, slot },
                        }))
                    }
                    Some((idx, slot)) => Ok((pos, idx, slot)),
                },
            };
            match step {
                Err(kind) if fresh => {
                    if let (Kind::Mismatch(_), true, false, Some(l)) =
                        (&kind, proves_absence, linked, link)
                    {
                        // A key that leaves the header of a node reached by
                        // a stale link may sit under a new node above it
                        // (see `header_split`): only absent if the link
                        // still names the node.
                        if !self.still_linked(ctx, &l, v.addr).await? {
                            self.cache().remove_all([l.parent, v.addr]);
                            return Ok(None);
                        }
                    }
                    return Ok(Some(Pos {
                        v,
                        fresh,
                        e,
                        link,
                        kind,
                    }));
                }
                Err(_) => {
                    // A cached snapshot cannot prove absence: read it now.
                    let ty = v.ty();
                    match self.read_node(ctx, v.addr, ty, e, None, tk).await? {
                        Some(n) => {
                            v = n;
                            fresh = true;
                        }
                        None => return Ok(None),
                    }
                }
                Ok((pos, idx, slot)) => {
                    let ty = slot.child_type().unwrap_or(NodeType::N4);
                    let expect_rev = (!fresh).then_some(v.addr);
                    match self
                        .read_node(ctx, slot.ptr(), ty, pos + 1, expect_rev, tk)
                        .await?
                    {
                        Some(c) => {
                            link = Some(Link {
                                parent: v.addr,
                                slot_addr: v.slot_addr(idx),
                                slot,
                            });
                            linked = fresh;
                            v = c;
                            e = pos + 1;
                            fresh = true;
                        }
                        None => {
                            if !fresh {
                                self.cache().remove(v.addr);
                            }
                            return Ok(None);
                        }
                    }
                }
            }
        }
    }

    /// Whether the slot of link `l` still points at `node` (read now). A
    /// node slot only ever moves to a new node a header split put above
    /// its node, never back: if it names `node` now, it did when `node`
    /// was read.
    async fn still_linked(
        &self,
        ctx: &Ctx,
        l: &Link,
        node: GlobalAddr,
    ) -> Result<bool, IndexError> {
        let word = self.sc().word;
        ctx.read(self.t.remote(l.slot_addr)?, word);
        ctx.sync().await?;
        let s = Slot(ctx.local_u64(word));
        Ok(!s.is_empty() && !s.is_leaf() && s.ptr() == node)
    }

    /// `Start` that re-reads `p`'s node.
    fn again(p: &Pos) -> Start {
        Start::Node {
            addr: p.v.addr,
            ty: p.v.ty(),
            e: p.e,
            link: p.link,
        }
    }

    // ---- operations ----------------------------------------------------

    /// Waits for the leader of window `w` to publish its outcome.
    async fn wait(&self, ctx: &Ctx, w: &rdwc::Shared) -> Outcome {
        loop {
            if let Some(o) = w.lock().outcome.clone() {
                return o;
            }
            ctx.sleep(WAIT_NS).await;
        }
    }

    /// Search proper; `w` is the read-delegation window to close before the
    /// leaf READ.
    async fn search_in(
        &self,
        ctx: &Ctx,
        key: &[u8],
        w: Option<&rdwc::Shared>,
    ) -> Result<Option<Vec<u8>>, IndexError> {
        let tk = self.tree_key(key);
        let mut retry = Retry::new("search", self.t.cfg.retry);
        let mut from = Start::Top { use_cache: true };
        let mut cached_only = true;
        loop {
            let Some(p) = self.descend(ctx, &tk, from, true).await? else {
                self.pause(ctx, &mut retry).await?;
                from = Self::top(&retry);
                cached_only = false;
                continue;
            };
            cached_only &= !p.fresh;
            let Kind::Leaf { slot, idx, .. } = p.kind else {
                self.note_cache(false);
                return Ok(None);
            };
            rdwc::close(w);
            match self.read_leaf(ctx, slot, key).await? {
                LeafIs::Live(l) => {
                    self.note_cache(cached_only);
                    return Ok(Some(l.value));
                }
                LeafIs::Replaced { mark, unmarked } => {
                    let at = p.v.slot_addr(idx);
                    if !self
                        .undo_expired_mark(ctx, at, slot, mark, unmarked)
                        .await?
                    {
                        self.pause(ctx, &mut retry).await?;
                    }
                    from = Start::Top { use_cache: false };
                    cached_only = false;
                }
                LeafIs::Dead | LeafIs::Other { .. } if p.fresh => {
                    self.note_cache(false);
                    return Ok(None);
                }
                LeafIs::Dead | LeafIs::Other { .. } => {
                    // The snapshot may be stale (a split moved the key
                    // below a new node): decide on the node as it is now.
                    from = Self::again(&p);
                    cached_only = false;
                }
            }
        }
    }

    fn note_cache(&self, hit: bool) {
        self.count(|c| {
            if hit {
                c.cache_hits += 1
            } else {
                c.cache_misses += 1
            }
        });
    }

    /// Insert, update or delete; an update takes its value from the
    /// write-combining window `wcb` when it has one.
    async fn write(
        &self,
        ctx: &Ctx,
        key: &[u8],
        value: &[u8],
        mode: WriteMode,
        wcb: Option<&rdwc::Shared>,
    ) -> Result<bool, IndexError> {
        let tk = self.tree_key(key);
        let mut retry = Retry::new(mode.name(), self.t.cfg.retry);
        let mut from = Start::Top { use_cache: true };
        loop {
            let absent_matters = mode != WriteMode::Insert;
            let Some(p) = self.descend(ctx, &tk, from, absent_matters).await? else {
                self.pause(ctx, &mut retry).await?;
                from = Self::top(&retry);
                continue;
            };
            if mode != WriteMode::Insert {
                let Kind::Leaf { slot, idx, .. } = p.kind else {
                    return Ok(false);
                };
                let r = match (mode, self.t.cfg.in_place) {
                    (WriteMode::Update, true) => {
                        self.locked_leaf(ctx, slot, key, Some((value, wcb))).await?
                    }
                    (WriteMode::Update, false) => {
                        self.rcu_update(ctx, &p, idx, slot, key, value, wcb).await?
                    }
                    (_, true) => self.locked_leaf(ctx, slot, key, None).await?,
                    (_, false) => self.rcu_delete(ctx, &p, idx, slot, key).await?,
                };
                match r {
                    Locked::Done => return Ok(true),
                    Locked::Absent if p.fresh => return Ok(false),
                    Locked::Absent => from = Self::again(&p),
                    Locked::Retry => {
                        self.pause(ctx, &mut retry).await?;
                        from = Start::Top { use_cache: false };
                    }
                }
                continue;
            }
            // Insert.
            if !p.fresh {
                if let Kind::Leaf { slot, .. } = p.kind {
                    // A live leaf with the key decides without a fresh node
                    // (a replaced one may be long unlinked: in RCU mode
                    // replaced leaves stay replaced).
                    if let LeafIs::Live(_) = self.read_leaf(ctx, slot, key).await? {
                        return Ok(false);
                    }
                }
                from = Self::again(&p);
                continue;
            }
            let next = match p.kind {
                Kind::Mismatch(j) => {
                    let at = p.link.map_or(p.v.addr, |l| l.parent);
                    self.node_locked(ctx, at, self.header_split(ctx, &p, j))
                        .await?
                }
                Kind::NoSlot { pos } => {
                    self.node_locked(
                        ctx,
                        p.v.addr,
                        self.normal_insert(ctx, &p, tk[pos], key, value),
                    )
                    .await?
                }
                Kind::Leaf { pos, idx, slot } => match self.read_leaf(ctx, slot, key).await? {
                    LeafIs::Live(_) | LeafIs::Replaced { .. } => return Ok(false),
                    LeafIs::Dead | LeafIs::Other { dead: true, .. } => {
                        let f = self.replace_dead(ctx, &p, idx, slot, tk[pos], key, value);
                        self.node_locked(ctx, p.v.addr, f).await?
                    }
                    LeafIs::Other {
                        key: k1,
                        dead: false,
                    } => {
                        let f = self.leaf_split(ctx, &p, pos, idx, slot, &tk, &k1, key, value);
                        self.node_locked(ctx, p.v.addr, f).await?
                    }
                },
            };
            match next {
                Next::Done => return Ok(true),
                Next::Continue(s) => from = s,
                Next::Conflict(s) => {
                    self.pause(ctx, &mut retry).await?;
                    from = s;
                }
            }
        }
    }

    /// Runs `f` (a change of internal node `node`) under the node's lock
    /// when internal nodes are not lock-free; directly otherwise.
    async fn node_locked<T>(
        &self,
        ctx: &Ctx,
        node: GlobalAddr,
        f: impl std::future::Future<Output = Result<T, IndexError>>,
    ) -> Result<T, IndexError> {
        if self.t.cfg.lock_free_internal {
            return f.await;
        }
        let i = dmkit_runtime::hash::hash64(&node.raw().to_le_bytes(), 0x10C4) & (LOCK_WORDS - 1);
        let lock = self.t.locks.add(8 * i);
        let lock = self.t.remote(lock)?;
        let owner = self.st.borrow().owner;
        // HOCL, as the paper applies it to its baselines (§5.1): queue on
        // the machine's local lock first; a local predecessor may hand the
        // remote lock over.
        let local = self
            .node_locks
            .as_ref()
            .expect("clients of a tree with node locks have a local table");
        let g = local.acquire(ctx, i as usize).await;
        // The lock word is a lease (`dmkit_index::lease`); a dead holder's
        // is broken. The change under it is lock-free-safe on its own (the
        // node is switched by one slot CAS, as in the lock-free mode), so
        // a holder that died mid-change left nothing to repair.
        let lease = self.t.cfg.lease;
        let taken = if g.handed {
            // Handed over with its lease: renewed if too little is left.
            match lease.renew(ctx, lock, g.word, owner).await {
                Ok(Some(w)) => Ok(w),
                Ok(None) => Err(IndexError::LeaseLost(format!(
                    "node lock {} handed over after its lease ran out",
                    lock.addr
                ))),
                Err(e) => Err(IndexError::from(e)),
            }
        } else {
            // `backoff_cas` backs off itself: the budget only counts.
            let mut retry = Retry::new("node lock", self.t.cfg.retry);
            loop {
                let mine = lease.word(ctx, owner);
                match ctx.backoff_cas(lock, 0, mine).await {
                    Ok(0) => break Ok(mine),
                    Ok(seen) => match lease.break_expired(ctx, lock, seen, mine).await {
                        Ok(true) => {
                            self.count(|c| c.leases_broken += 1);
                            break Ok(mine);
                        }
                        Ok(false) => {}
                        Err(e) => break Err(IndexError::from(e)),
                    },
                    Err(e) => break Err(IndexError::from(e)),
                }
                if let Err(e) = retry.lost(ctx) {
                    break Err(e);
                }
            }
        };
        let mine = match taken {
            Ok(w) => w,
            Err(e) => {
                local.abandon(g);
                return Err(e);
            }
        };
        local.set_word(i as usize, mine);
        // The change runs with the node's lock ours: taken here (CAS from
        // free, or from a dead holder) or handed over by a local
        // predecessor.
        let r = f.await;
        let released = if local.hand_over(g) {
            Ok(())
        } else {
            lease.release(ctx, lock, mine, self.sc().word).await
        };
        local.release(g);
        released?;
        r
    }

    /// The memory node for a new node or leaf hanging at partial key `b`
    /// below `parent`. The root's children are spread over the memory
    /// nodes by their partial key; everything else lives with its parent.
    /// So each subtree below the root sits on one memory node (an insert
    /// publishes a leaf or a split chain on the node of the slot it CASes,
    /// without a cross-node wait), and the subtrees, and with them the
    /// READs of a large tree, divide evenly between the nodes — where
    /// everything used to inherit the root's node and a second memory
    /// node served nothing (the radix-tree paper runs on two; §5.2 counts
    /// both nodes' IOPS).
    fn home_of(&self, parent: GlobalAddr, b: u8) -> NodeId {
        let nodes = self.t.home.nodes();
        if parent == self.t.root && nodes.len() > 1 {
            nodes[b as usize % nodes.len()]
        } else {
            parent.node()
        }
    }

    /// Allocates a block of `bytes` near `prefer`.
    fn alloc(
        &self,
        ctx: &Ctx,
        bytes: usize,
        prefer: NodeId,
        what: &'static str,
    ) -> Result<GlobalAddr, IndexError> {
        let units = bytes.div_ceil(64) as u64;
        let mut st = self.st.borrow_mut();
        st.alloc
            .alloc(
                self.t.home.fabric().as_ref(),
                self.t.home.nodes(),
                prefer,
                units,
                ctx.now(),
            )
            .map_err(|source| IndexError::OutOfMemory { what, source })
    }

    fn free_unpublished(&self, addr: GlobalAddr, bytes: usize) {
        self.st
            .borrow_mut()
            .alloc
            .free_now(addr, bytes.div_ceil(64) as u64);
    }

    /// Writes a new leaf for `key` (reverse pointer `parent`) from the
    /// task's new-leaf buffer; returns its address and slot length.
    fn new_leaf(
        &self,
        ctx: &Ctx,
        parent: GlobalAddr,
        key: &[u8],
        value: &[u8],
    ) -> Result<(GlobalAddr, u64, usize), IndexError> {
        self.new_leaf_slot(ctx, parent, parent.node(), 0, key, value)
            .map(|(a, s, len)| (a, s.units(), len))
    }

    /// [`Self::new_leaf`], with the slot word (partial key `b`) that will
    /// point at it.
    fn new_leaf_slot(
        &self,
        ctx: &Ctx,
        parent: GlobalAddr,
        prefer: NodeId,
        b: u8,
        key: &[u8],
        value: &[u8],
    ) -> Result<(GlobalAddr, Slot, usize), IndexError> {
        let (kcap, vcap) = if self.t.cfg.in_place {
            (self.t.cfg.kcap(), self.t.cfg.max_value)
        } else {
            (self.t.cfg.kcap(), value.len())
        };
        let mut img = Vec::new();
        encode_leaf(parent, key, value, kcap, vcap, &mut img);
        assert!(
            img.len() <= self.leaf_room(),
            "a leaf image fits its buffer"
        );
        let addr = self.alloc(ctx, img.len(), prefer, "allocating a leaf")?;
        ctx.put_local(self.sc().new, &img);
        let slot = Slot::leaf(b, img.len().div_ceil(64) as u64, addr)
            .ok_or(corrupt(addr, "leaf address beyond 48 bits"))?;
        assert!(slot.is_leaf() && slot.ptr() == addr && slot.pkey() == b);
        Ok((addr, slot, img.len()))
    }

    /// Queues the WRITE of the new leaf; if it lives on another node than
    /// the CAS that will publish it, waits for it (queue-pair order only
    /// holds per node).
    async fn put_leaf(
        &self,
        ctx: &Ctx,
        leaf: GlobalAddr,
        len: usize,
        cas_at: GlobalAddr,
    ) -> Result<(), IndexError> {
        ctx.write(self.t.remote(leaf)?, self.sc().new.prefix(len));
        // The leaf is written before the CAS that publishes it: queued
        // ahead of it on the CAS's queue pair, or completed.
        if leaf.node() != cas_at.node() {
            ctx.sync().await?;
        }
        Ok(())
    }

    /// Normal insert (Figure 7b): CAS the first empty slot to the new leaf;
    /// past the visible slots, the in-place type switch (Figure 7e).
    async fn normal_insert(
        &self,
        ctx: &Ctx,
        p: &Pos,
        b: u8,
        key: &[u8],
        value: &[u8],
    ) -> Result<Next, IndexError> {
        let v = &p.v;
        assert!(
            p.fresh && v.find(b).is_none(),
            "a normal insert goes where the node as read has no slot for its byte"
        );
        let home = self.home_of(v.addr, b);
        let (leaf, slot, len) = self.new_leaf_slot(ctx, v.addr, home, b, key, value)?;
        let slots = v.slots();
        let mut i = slots.iter().position(|&s| s == 0).unwrap_or(slots.len());
        let mut written = false;
        while i < MAX_SLOTS {
            if !written {
                self.put_leaf(ctx, leaf, len, v.addr).await?;
                written = true;
            }
            assert!(i >= slots.len() || slots[i] == 0, "a CAS from empty");
            let t = ctx.cas(self.t.remote(v.slot_addr(i))?, 0, slot.0);
            ctx.sync().await?;
            let old = Slot(ctx.value(t));
            if old.is_empty() {
                if i >= slots.len() {
                    self.grow(ctx, v, i, p.link).await?;
                }
                return Ok(Next::Done);
            }
            if old.pkey() == b {
                // Another insert put this byte here first: follow it.
                self.free_unpublished(leaf, len);
                if i >= slots.len() {
                    self.grow(ctx, v, i, p.link).await?;
                }
                return Ok(Next::Conflict(Self::again(p)));
            }
            i += 1;
            while i < slots.len() && slots[i] != 0 {
                i += 1;
            }
        }
        self.free_unpublished(leaf, len);
        Err(corrupt(
            v.addr,
            "internal node with 256 slots and none for a byte",
        ))
    }

    /// Makes slot `idx` of `v` visible: raises the header's type, then the
    /// parent slot's (in this order, so a reader never sees the parent's
    /// bigger type with the header's smaller one).
    async fn grow(
        &self,
        ctx: &Ctx,
        v: &NodeView,
        idx: usize,
        link: Option<Link>,
    ) -> Result<(), IndexError> {
        let want = self.t.cfg.node_layout.fitting(idx);
        assert!(
            idx < MAX_SLOTS && want > v.ty(),
            "only a slot past the visible ones is made visible"
        );
        let header = self.t.remote(v.addr.add(NODE_HEADER))?;
        let mut h = v.header;
        let mut switched = false;
        while h.ty().is_some_and(|t| t < want) {
            let old = ctx.cas_sync(header, h.0, h.with_type(want).0).await?;
            if old == h.0 {
                switched = true;
                break;
            }
            h = Header(old);
        }
        if let Some(l) = link {
            let parent_slot = self.t.remote(l.slot_addr)?;
            let mut s = l.slot;
            while !s.is_leaf() && s.ptr() == v.addr && s.child_type().is_some_and(|t| t < want) {
                let old = ctx
                    .cas_sync(parent_slot, s.0, s.with_child_type(want).0)
                    .await?;
                if old == s.0 {
                    break;
                }
                s = Slot(old);
            }
            self.cache().remove(l.parent);
        }
        self.cache().remove(v.addr);
        if switched {
            self.count(|c| c.type_switches += 1);
        }
        Ok(())
    }

    /// Replaces a slot's dead leaf (deleted, any key with this byte) by a
    /// new leaf.
    #[allow(clippy::too_many_arguments)]
    async fn replace_dead(
        &self,
        ctx: &Ctx,
        p: &Pos,
        idx: usize,
        old: Slot,
        b: u8,
        key: &[u8],
        value: &[u8],
    ) -> Result<Next, IndexError> {
        let v = &p.v;
        assert!(
            old.is_leaf() && old.pkey() == b,
            "a dead leaf is replaced in its slot, whose partial key never changes"
        );
        let home = self.home_of(v.addr, b);
        let (leaf, slot, len) = self.new_leaf_slot(ctx, v.addr, home, b, key, value)?;
        self.put_leaf(ctx, leaf, len, v.addr).await?;
        let t = ctx.cas(self.t.remote(v.slot_addr(idx))?, old.0, slot.0);
        ctx.sync().await?;
        if ctx.value(t) == old.0 {
            self.cache().remove(v.addr);
            return Ok(Next::Done);
        }
        self.free_unpublished(leaf, len);
        Ok(Next::Conflict(Self::again(p)))
    }

    /// Leaf split (Figure 7c): nodes holding the rest of the common prefix
    /// of the two keys, the last one pointing at both leaves, published by
    /// one CAS of the slot.
    #[allow(clippy::too_many_arguments)]
    async fn leaf_split(
        &self,
        ctx: &Ctx,
        p: &Pos,
        pos: usize,
        idx: usize,
        old: Slot,
        tk: &[u8],
        other: &[u8],
        key: &[u8],
        value: &[u8],
    ) -> Result<Next, IndexError> {
        let v = &p.v;
        let tk1 = self.tree_key(other);
        let Some(q) = (pos + 1..tk.len()).find(|&i| tk[i] != tk1[i]) else {
            return Err(corrupt(old.ptr(), "two leaves for one key"));
        };
        // Plan the chain: each node takes up to 6 partial keys; a node that
        // cannot reach position q branches on the next common byte.
        let mut plan: Vec<(usize, usize)> = Vec::new(); // (depth, prefix len)
        let mut d = pos + 1;
        while q - d > HEADER_PREFIX {
            plan.push((d, HEADER_PREFIX));
            d += HEADER_PREFIX + 1;
        }
        plan.push((d, q - d));
        assert!(
            plan[0].0 == pos + 1
                && plan.windows(2).all(|w| w[1].0 == w[0].0 + w[0].1 + 1)
                && plan.iter().all(|&(_, n)| n <= HEADER_PREFIX),
            "the chain holds the keys' common bytes from the slot's on, six a node"
        );
        if plan.len() > MAX_CHAIN {
            return Err(corrupt(v.addr, "split chain longer than the key"));
        }
        let free_nodes = |addrs: &[GlobalAddr]| {
            for &a in addrs {
                self.free_unpublished(a, NODE_BYTES);
            }
        };
        let mut addrs = Vec::with_capacity(plan.len());
        let home = self.home_of(v.addr, tk[pos]);
        for _ in &plan {
            match self.alloc(ctx, NODE_BYTES, home, "allocating an internal node") {
                Ok(a) => addrs.push(a),
                Err(e) => {
                    free_nodes(&addrs);
                    return Err(e);
                }
            }
        }
        let last = *addrs.last().expect("at least one node");
        let (leaf, units, len) = match self.new_leaf(ctx, last, key, value) {
            Ok(x) => x,
            Err(e) => {
                free_nodes(&addrs);
                return Err(e);
            }
        };
        let ptr_err = |addr| corrupt(addr, "address beyond 48 bits");
        let mut views = Vec::with_capacity(plan.len());
        for (i, &(d, plen)) in plan.iter().enumerate() {
            let rev = if i == 0 { v.addr } else { addrs[i - 1] };
            let header = Header::new(d, NodeType::N4, &tk[d..d + plen]);
            let mut img = NewNode {
                head: NodeHead {
                    rev: rev.raw(),
                    header: header.0,
                },
                slots: [0; 4],
            };
            if i + 1 < plan.len() {
                img.slots[0] = Slot::node(tk[d + plen], NodeType::N4, addrs[i + 1])
                    .ok_or(ptr_err(addrs[i + 1]))?
                    .0;
            } else {
                img.slots[0] = Slot::leaf(tk1[q], old.units(), old.ptr())
                    .ok_or(ptr_err(old.ptr()))?
                    .0;
                img.slots[1] = Slot::leaf(tk[q], units, leaf).ok_or(ptr_err(leaf))?.0;
            }
            views.push(
                NodeView::new(addrs[i], header, rev, img.slots.to_vec())
                    .with_prefix(self.prefix_of(tk, d)),
            );
            let piece = self.sc().chain.piece(i, Scratch::CHAIN_PIECE);
            ctx.put_as(piece, &img);
            ctx.write(self.t.remote(addrs[i])?, piece.prefix(NEW_NODE));
        }
        ctx.write(self.t.remote(leaf)?, self.sc().new.prefix(len));
        if addrs
            .iter()
            .chain([&leaf])
            .any(|a| a.node() != v.addr.node())
        {
            ctx.sync().await?;
        }
        let new = Slot::node(tk[pos], NodeType::N4, addrs[0]).ok_or(ptr_err(addrs[0]))?;
        // The chain and the leaf are written (queued ahead on the slot's
        // queue pair, or completed) before the CAS that publishes them,
        // and the slot keeps its partial key.
        assert_eq!(new.pkey(), old.pkey(), "a slot's partial key never changes");
        let t = ctx.cas(self.t.remote(v.slot_addr(idx))?, old.0, new.0);
        ctx.sync().await?;
        if ctx.value(t) != old.0 {
            free_nodes(&addrs);
            self.free_unpublished(leaf, len);
            return Ok(Next::Conflict(Self::again(p)));
        }
        // The old leaf's reverse pointer now names its new parent.
        let word = self.sc().word;
        ctx.set_local_u64(word, last.raw());
        ctx.write(self.t.remote(old.ptr())?, word);
        ctx.sync().await?;
        self.cache().remove(v.addr);
        // The new nodes as published: a warm start for the cache
        // (validated like any snapshot when used).
        self.cache().put_all(views.into_iter().map(Arc::new));
        self.st.borrow_mut().counters.leaf_splits += 1;
        Ok(Next::Done)
    }

    /// Header split (Figure 7d), in three steps: a new NODE_4 takes the
    /// matched partial keys and points at the node (CAS of the parent
    /// slot); the node's header drops them (CAS); the insert then goes on
    /// from the new node. Until the header CAS, readers that arrive through
    /// the new node skip the redundant partial keys (the header's depth is
    /// behind theirs). Other clients can insert below the new node before
    /// the cut (its slot is published), so the old path is no longer
    /// complete: a key that leaves the node's old header may sit below the
    /// new node. A reader that read the parent before the split may still
    /// answer "absent" (it read the parent before that insert); one that
    /// came by a stale link (a cached parent) checks the link before it
    /// says a key leaving the header is absent (`descend`).
    async fn header_split(&self, ctx: &Ctx, p: &Pos, j: usize) -> Result<Next, IndexError> {
        let v = &p.v;
        let d = v.header.depth();
        let Some(link) = p.link else {
            return Err(corrupt(v.addr, "root node with partial keys"));
        };
        if p.e != d {
            // Another header split of this node is between its two CASes:
            // we came through its new node, which took the partial keys
            // before position `p.e` (and its slot's). Help it cut them, so
            // a splitter that died between its CASes blocks no insert (its
            // cut CAS then finds the cut done), then start over.
            let n = p.e - d - 1;
            if p.fresh && n < v.header.prefix_len() {
                let node = self.t.remote(v.addr)?;
                let cut = v.header.cut(n);
                let old = ctx
                    .cas_sync(node.add(NODE_HEADER), v.header.0, cut.0)
                    .await?;
                if old == v.header.0 {
                    let word = self.sc().word;
                    ctx.set_local_u64(word, link.parent.raw());
                    ctx.write(node, word);
                    ctx.sync().await?;
                }
                self.cache().remove(v.addr);
            }
            return Ok(Next::Conflict(Start::Top { use_cache: false }));
        }
        assert!(
            p.fresh && j < v.header.prefix_len(),
            "a header splits at a partial key it holds, as read now"
        );
        let m = self.alloc(
            ctx,
            NODE_BYTES,
            self.home_of(link.parent, link.slot.pkey()),
            "allocating an internal node",
        )?;
        let prefix: Vec<u8> = (0..j).map(|i| v.header.prefix(i)).collect();
        let ptr_err = |addr| corrupt(addr, "address beyond 48 bits");
        let mut img = NewNode {
            head: NodeHead {
                rev: link.parent.raw(),
                header: Header::new(d, NodeType::N4, &prefix).0,
            },
            slots: [0; 4],
        };
        img.slots[0] = Slot::node(v.header.prefix(j), v.ty(), v.addr)
            .ok_or(ptr_err(v.addr))?
            .0;
        let piece = self.sc().chain.piece(0, Scratch::CHAIN_PIECE);
        ctx.put_as(piece, &img);
        ctx.write(self.t.remote(m)?, piece.prefix(NEW_NODE));
        // The new node is written before the CAS that publishes it.
        if m.node() != link.slot_addr.node() {
            ctx.sync().await?;
        }
        let new = Slot::node(link.slot.pkey(), NodeType::N4, m).ok_or(ptr_err(m))?;
        assert_eq!(
            new.pkey(),
            link.slot.pkey(),
            "a slot's partial key never changes"
        );
        let t = ctx.cas(self.t.remote(link.slot_addr)?, link.slot.0, new.0);
        ctx.sync().await?;
        if ctx.value(t) != link.slot.0 {
            self.free_unpublished(m, NODE_BYTES);
            self.cache().remove(link.parent);
            return Ok(Next::Conflict(Start::Top { use_cache: false }));
        }
        let node = self.t.remote(v.addr)?;
        // The node now hangs below the new one at position d + j: its
        // header starts after the partial keys that moved and its slot's.
        assert_eq!(v.header.cut(j).depth(), d + j + 1);
        let mut h = v.header;
        loop {
            let old = ctx.cas_sync(node.add(NODE_HEADER), h.0, h.cut(j).0).await?;
            if old == h.0 {
                break;
            }
            // Only the type can have changed (a concurrent type switch),
            // or another client came through the new node and cut the
            // header for us.
            h = Header(old);
            if h.depth() == d + j + 1 && h.prefix_len() + j + 1 == v.header.prefix_len() {
                break;
            }
            if h.depth() != d || h.prefix_len() != v.header.prefix_len() {
                return Err(corrupt(v.addr, "header changed under a header split"));
            }
        }
        let word = self.sc().word;
        ctx.set_local_u64(word, m.raw());
        ctx.write(node, word);
        ctx.sync().await?;
        self.cache().remove_all([v.addr, link.parent]);
        self.st.borrow_mut().counters.header_splits += 1;
        Ok(Next::Continue(Start::Node {
            addr: m,
            ty: NodeType::N4,
            e: d,
            link: Some(Link {
                parent: link.parent,
                slot_addr: link.slot_addr,
                slot: new,
            }),
        }))
    }

    /// In-place mode: locks the leaf (CAS of its rear lock, with a READ of
    /// the leaf behind it in the same batch), then writes the new value
    /// (`Some`) or the deleted state (`None`) and releases the lock —
    /// with one WRITE when the fabric places a WRITE's words in order and
    /// the rear lock is on, else a second WRITE in the same batch (or, with
    /// the rear lock off, after the first completed).
    ///
    /// Without write combining, a machine's writers first queue on a local
    /// entry for the leaf (`leaf_hocl`: HOCL's local half, which the paper
    /// gives every baseline), so one of them at a time tries the remote
    /// lock; and a holder with a local waiter behind it hands the remote
    /// lock over (`leaf_handover` times in a row at most): it writes the
    /// leaf back without releasing the lock, and the waiter reads the leaf
    /// and writes it without a CAS. The entries are hashed by the lock's
    /// address, so the lock handed over may be another leaf's: the waiter
    /// then releases that one and takes its own.
    async fn locked_leaf(
        &self,
        ctx: &Ctx,
        slot: Slot,
        key: &[u8],
        value: Option<(&[u8], Option<&rdwc::Shared>)>,
    ) -> Result<Locked, IndexError> {
        let Some(ll) = &self.leaf_locks else {
            return Ok(self
                .locked_leaf_remote(ctx, slot, key, value, None, None)
                .await?
                .0);
        };
        let q = &ll.q;
        let h = dmkit_runtime::hash::hash64(&slot.ptr().raw().to_le_bytes(), 0x1EAF);
        let g = q
            .acquire(ctx, (h % self.t.cfg.leaf_lock_entries as u64) as usize)
            .await;
        let images = || ll.images.lock().unwrap_or_else(|p| p.into_inner());
        // Handed a lock: the leaf its holder wrote back, if it left one.
        let image = if g.handed && !self.t.cfg.handover_reread {
            images().remove(&g.index)
        } else {
            None
        };
        match self
            .locked_leaf_remote(ctx, slot, key, value, Some((q, g)), image)
            .await
        {
            Ok((locked, Some(kept))) => {
                // Kept for the next local writer: it learns the word (its
                // lease), which lock it is and what the leaf now holds
                // before the entry passes on.
                q.set_word(g.index, kept.word);
                q.set_tag(g.index, kept.tag);
                match kept.image {
                    Some(i) => images().insert(g.index, i),
                    None => images().remove(&g.index),
                };
                q.release(g);
                Ok(locked)
            }
            Ok((locked, None)) => {
                q.abandon(g);
                Ok(locked)
            }
            Err(e) => {
                // A lock kept for hand-over before the error is not passed
                // on: its lease runs out and a writer breaks it.
                q.abandon(g);
                Err(e)
            }
        }
    }

    /// [`ArtClient::locked_leaf`]'s remote part. With `local` (the
    /// machine's entry, held), a lock handed over through it is used or,
    /// when another leaf's, released; the second result is `Some((word,
    /// tag))` when the lock was kept for the next local writer (the entry's
    /// holder records both and passes the entry on). Every other path
    /// leaves the leaf's lock released (or never taken). `image`: the leaf
    /// as a local predecessor that handed its lock over wrote it back,
    /// used instead of a READ when the lock handed over is this leaf's and
    /// still ours.
    async fn locked_leaf_remote(
        &self,
        ctx: &Ctx,
        slot: Slot,
        key: &[u8],
        value: Option<(&[u8], Option<&rdwc::Shared>)>,
        local: Option<(&TicketLocks, TicketGrant)>,
        image: Option<Vec<u8>>,
    ) -> Result<(Locked, Option<Kept>), IndexError> {
        let addr = slot.ptr();
        let leaf = self.t.remote(addr)?;
        let len = self.t.leaf_cap();
        let lock = leaf.add(lock_offset(len) as u64);
        let tag = lock.addr.raw();
        let buf = self.sc().leaf.prefix(len);
        let owner = self.st.borrow().owner;
        let lease = self.t.cfg.lease;
        // A lock handed over by a local predecessor (HOCL): ours with its
        // lease word, renewed by CAS when too little of it is left (broken
        // meanwhile by another machine's writer after it ran out: not ours,
        // taken below like any other). Another leaf's lock, handed over
        // through the shared entry, is released first: the machine held it
        // for nobody else (its other writers of that leaf queue behind us).
        let mut handed = None;
        if let Some((_, g)) = local.filter(|(_, g)| g.handed) {
            if g.tag == tag {
                handed = lease.renew(ctx, lock, g.word, owner).await?;
            } else {
                let other = self.t.remote(GlobalAddr::from_raw(g.tag))?;
                lease.release(ctx, other, g.word, self.sc().word).await?;
                self.count(|c| c.foreign_handovers += 1);
            }
        }
        let mut mine;
        if let Some(w) = handed {
            self.count(|c| c.lock_handovers += 1);
            mine = w;
            // The machine held the lock since its holder wrote the leaf
            // back: that image is the leaf (nobody else writes it).
            match image.filter(|i| i.len() == len) {
                Some(i) => ctx.put_local(buf, &i),
                None => {
                    ctx.read(leaf, buf);
                    ctx.sync().await?;
                }
            }
        } else {
            // A writer that finds the lock taken spins on the same lock
            // (the radix-tree paper's "busy waiting", §3 Challenge 1; its
            // artifact re-CASes the leaf's lock after yielding): the leaf
            // is updated in place, so its address stays good, and what it
            // holds is checked below once the lock is ours. The first
            // attempt reads the leaf in the same batch, so an uncontended
            // lock is held for one round trip. Conflict avoidance, when on,
            // backs off inside `cas_outcome`.
            //
            // Only the first attempt carries the READ: a failed attempt's
            // READ is wasted, and under contention (the hot leaves of a
            // zipfian update stream, one writer per compute machine after
            // write combining) those READs were a fifth of a memory node's
            // verbs. A contended acquisition pays one more round trip for
            // its READ.
            //
            // `cas_outcome` backs off: the budget only counts.
            //
            // The lock word is a lease (`dmkit_index::lease`): a word whose
            // lease ran out belongs to a client that died holding it, and
            // is broken by CAS. Nothing needs repair: the holder's only
            // write under the lock is the leaf's write-back, one WRITE that
            // lands whole or not at all (the leaf is then the old or the
            // new one, and its checksum says which bytes are one leaf);
            // with the rear lock off, or the lock kept for a hand-over, the
            // release that never came is the broken word itself.
            let mut retry = Retry::new("leaf lock", self.t.cfg.retry);
            loop {
                mine = lease.word(ctx, owner);
                let t = ctx.cas(lock, 0, mine);
                if retry.attempts() == 0 {
                    ctx.read(leaf, buf);
                }
                ctx.sync().await?;
                let seen = ctx.value(t);
                let mut got = seen == 0;
                let mut read_again = retry.attempts() > 0;
                if !got {
                    got = lease.break_expired(ctx, lock, seen, mine).await?;
                    if got {
                        self.count(|c| c.leases_broken += 1);
                        read_again = true;
                    }
                }
                ctx.cas_outcome(got).await;
                if got {
                    if read_again {
                        ctx.read(leaf, buf);
                        ctx.sync().await?;
                    }
                    break;
                }
                retry.lost(ctx)?;
                self.count(|c| c.lock_retries += 1);
            }
        }
        // The lock is ours (our CAS took it from free, or from a dead
        // holder, or a local predecessor handed it over) and `buf` holds
        // the leaf as read after that (queue-pair order, or the
        // predecessor's completed write-back): every path below releases
        // the lock exactly once, or keeps it for the next local writer.
        let Some(l) = self.decode(ctx, buf) else {
            lease.release(ctx, lock, mine, self.sc().word).await?;
            return Err(corrupt(addr, "leaf (checksum mismatch under its lock)"));
        };
        if !l.valid() || l.key != key {
            lease.release(ctx, lock, mine, self.sc().word).await?;
            return Ok((Locked::Absent, None));
        }
        // Publish only with enough of the lease left: renewed by CAS when
        // this worker stalled; broken meanwhile, the breaker owns the leaf
        // and this update starts over.
        match lease.renew(ctx, lock, mine, owner).await? {
            Some(w) => mine = w,
            None => return Ok((Locked::Retry, None)),
        }
        // Decided before the write-back is posted: kept, the write-back
        // leaves the lock word as it is (ours).
        let keep = local.is_some_and(|(q, g)| q.hand_over(g));
        let new = self.sc().new.prefix(len);
        let mut written = None;
        match value {
            Some((own, wcb)) => {
                // The last moment to combine: joiners after this run alone.
                let value = rdwc::close_take(wcb, own);
                let mut img = Vec::new();
                encode_leaf(
                    GlobalAddr::NULL,
                    key,
                    &value,
                    self.t.cfg.kcap(),
                    self.t.cfg.max_value,
                    &mut img,
                );
                assert!(
                    img.len() == len && img[lock_offset(len)..] == [0; LEAF_LOCK],
                    "the write-back covers the whole leaf and ends with a free lock"
                );
                ctx.put_local(new, &img);
                let item = new.slice(LEAF_META as usize, item_len(len));
                if keep {
                    ctx.write(leaf.add(LEAF_META), item);
                } else if self.t.cfg.rear_lock && self.t.in_order {
                    ctx.write(leaf.add(LEAF_META), new.skip(LEAF_META as usize));
                } else {
                    ctx.write(leaf.add(LEAF_META), item);
                    if !self.t.cfg.rear_lock {
                        ctx.sync().await?;
                    }
                    ctx.write(lock, new.word(lock_offset(len)));
                }
                if keep && !self.t.cfg.handover_reread {
                    written = Some(img);
                }
            }
            None => {
                // The meta word, then a free lock, staged in the buffer.
                let (meta, free) = (new.word(0), new.word(8));
                ctx.set_local_u64(meta, l.meta & !(META_VALID | META_REPLACED));
                ctx.set_local_u64(free, 0);
                ctx.write(leaf.add(LEAF_META), meta);
                if !keep {
                    if !self.t.cfg.rear_lock {
                        ctx.sync().await?;
                    }
                    ctx.write(lock, free);
                }
            }
        }
        ctx.sync().await?;
        Ok((
            Locked::Done,
            keep.then_some(Kept {
                word: mine,
                tag,
                image: written,
            }),
        ))
    }

    /// Out-of-place mode: the leaf of `slot` (at slot `idx` of `p`) that
    /// an update or delete of `key` acts on, if it is live; otherwise what
    /// the operation does instead — [`Locked::Retry`] after meeting a
    /// "replaced" mark (undone first if its lease ran out, see
    /// [`Self::undo_expired_mark`]), [`Locked::Absent`] for a deleted leaf
    /// or another key's.
    async fn rcu_live_leaf(
        &self,
        ctx: &Ctx,
        p: &Pos,
        idx: usize,
        slot: Slot,
        key: &[u8],
    ) -> Result<Result<LeafCopy, Locked>, IndexError> {
        Ok(match self.read_leaf(ctx, slot, key).await? {
            LeafIs::Live(l) => Ok(l),
            LeafIs::Replaced { mark, unmarked } => {
                let at = p.v.slot_addr(idx);
                self.undo_expired_mark(ctx, at, slot, mark, unmarked)
                    .await?;
                Err(Locked::Retry)
            }
            LeafIs::Dead | LeafIs::Other { .. } => Err(Locked::Absent),
        })
    }

    /// Out-of-place mode: marks the leaf replaced (CAS of its meta word),
    /// then swings the slot to a new leaf; readers that meet the replaced
    /// leaf retry until the slot moved.
    ///
    /// The mark is a lease (`dmkit_index::lease`): its word carries the
    /// lease's deadline in place of the checksum (see `layout`), the
    /// update swings the slot only while [`LeaseConfig::short_holds`], and
    /// a client that finds the mark expired with the leaf still in its
    /// slot *rolls it back* ([`Self::undo_expired_mark`]): the old leaf is
    /// whole and never changed, so undoing needs nothing but it, while
    /// rolling forward would need the new leaf's address, for which the
    /// mark word has no room next to its deadline (and a second word
    /// written beside it could not be told from a losing updater's). The
    /// dead client's update never returned, so either outcome is allowed.
    ///
    /// **The dead updater's new leaf is reclaimed** through the old leaf's
    /// *intent* word (`layout::intent_offset`: the rear word, which
    /// out-of-place leaves do not lock). In the batch of its mark CAS —
    /// so no round trip more, and a client that dies waiting for the
    /// mark's outcome has named its leaf all the same — the updater CASes
    /// the intent word from 0 to its new leaf. The mark alone is the lock;
    /// the intent is a hint with one ownership rule: **a block named in an
    /// intent word belongs to whoever CASes the word from it to 0.** So:
    /// - a client that undoes an expired mark reads the intent in the
    ///   batch of its undo CAS (one leaf, one queue pair: the read lands
    ///   first, while the mark still stands) and, if its undo won, claims
    ///   the block named there (a dead updater's, or a losing updater's
    ///   not yet taken back) and quarantines it in its own allocator for
    ///   a lease before reuse — the block lies in the tree's chunk group,
    ///   which every client allocates from, so it does not matter that the
    ///   dead client's chunk also holds the leaves and nodes it linked;
    /// - an updater whose mark lost, or that gives up past its deadline,
    ///   takes its block back the same way when its intent CAS had won
    ///   (and frees it only if that CAS wins too: else another client has
    ///   it), and simply frees it when its intent CAS had lost (nobody
    ///   else ever saw its address);
    /// - an update that swung the slot leaves its intent in the old leaf,
    ///   which is never undone again (no slot names it), so never claimed.
    ///
    /// What stays unreclaimed until the tree is destroyed: the new leaf of
    /// an updater that won the mark but lost the intent CAS (two
    /// updaters' batches crossed, or a claimer died between its undo and
    /// its claim) and then died; the new leaf of one that died before its
    /// batch was posted; the free blocks and unused chunk tail of a dead
    /// client's allocator. [`TreeCounters::unlinked_leaf_bytes`] and
    /// [`TreeCounters::leaf_bytes_reclaimed`] count both sides.
    #[allow(clippy::too_many_arguments)]
    async fn rcu_update(
        &self,
        ctx: &Ctx,
        p: &Pos,
        idx: usize,
        slot: Slot,
        key: &[u8],
        own: &[u8],
        wcb: Option<&rdwc::Shared>,
    ) -> Result<Locked, IndexError> {
        let l = match self.rcu_live_leaf(ctx, p, idx, slot, key).await? {
            Ok(l) => l,
            Err(instead) => return Ok(instead),
        };
        assert!(
            l.valid() && l.meta & META_REPLACED == 0,
            "only a live leaf is replaced"
        );
        let parent = p.v.addr;
        let value = rdwc::close_take(wcb, own);
        let (leaf, units, len) = self.new_leaf(ctx, parent, key, &value)?;
        self.count(|c| c.unlinked_leaf_bytes += units * 64);
        let old_addr = slot.ptr();
        let old_meta = self.t.remote(old_addr.add(LEAF_META))?;
        let intent_at = self
            .t
            .remote(old_addr.add(intent_offset(l.meta, self.t.cfg.kcap())))?;
        let intent =
            intent_word(leaf, units).ok_or(corrupt(leaf, "leaf address beyond 48 bits"))?;
        let lease = self.t.cfg.lease;
        let deadline = lease.short_deadline(ctx);
        let mark = replaced_mark(l.meta, deadline);
        // One batch: the new leaf, the intent naming it, the mark.
        ctx.write(self.t.remote(leaf)?, self.sc().new.prefix(len));
        let ti = ctx.cas(intent_at, 0, intent);
        let t = ctx.cas(old_meta, l.meta, mark);
        ctx.sync().await?;
        let named = ctx.value(ti) == 0;
        let got = ctx.value(t) == l.meta;
        ctx.cas_outcome(got).await;
        if !got {
            self.take_back(ctx, intent_at, intent, named).await?;
            return Ok(Locked::Retry);
        }
        // The new leaf is written (its WRITE completed with the CAS's
        // batch) before a slot names it. The old leaf may have moved down
        // by a leaf split meanwhile (to a slot with another partial key):
        // find it.
        let (mut at, mut cur, mut owner) = (p.v.slot_addr(idx), slot, parent);
        let tk = self.tree_key(key);
        let mut retry = Retry::new("update", self.t.cfg.retry);
        loop {
            if !lease.short_holds(ctx, deadline) {
                // Too late to publish (this worker stalled): undo the mark
                // unless another client did (then it may be re-marked by
                // now, with another deadline: the CAS leaves that alone),
                // and start over. The new leaf was never linked.
                ctx.cas_sync(old_meta, mark, l.meta).await?;
                self.take_back(ctx, intent_at, intent, named).await?;
                return Ok(Locked::Retry);
            }
            let new = Slot::leaf(cur.pkey(), units, leaf)
                .ok_or(corrupt(leaf, "leaf address beyond 48 bits"))?;
            assert!(
                cur.ptr() == old_addr && new.pkey() == cur.pkey(),
                "the slot swings from the replaced leaf, keeping its partial key"
            );
            let old = ctx.cas_sync(self.t.remote(at)?, cur.0, new.0).await?;
            if old == cur.0 {
                self.count(|c| c.unlinked_leaf_bytes -= units * 64);
                if owner != parent {
                    let word = self.sc().word;
                    ctx.set_local_u64(word, owner.raw());
                    ctx.write_sync(self.t.remote(leaf)?, word).await?;
                }
                self.cache().remove(owner);
                return Ok(Locked::Done);
            }
            self.pause(ctx, &mut retry).await?;
            let Some(q) = self
                .descend(ctx, &tk, Start::Top { use_cache: false }, false)
                .await?
            else {
                continue;
            };
            match q.kind {
                Kind::Leaf { idx, slot, .. } if slot.ptr() == old_addr => {
                    at = q.v.slot_addr(idx);
                    cur = slot;
                    owner = q.v.addr;
                }
                // Only a mark undone after its lease ran out lets another
                // update swing the slot: the check at the loop's top says
                // so and starts over.
                _ if !lease.short_holds(ctx, deadline) => {}
                _ => return Err(corrupt(old_addr, "replaced leaf lost its slot")),
            }
        }
    }

    /// Out-of-place mode: an update that will not link its new leaf
    /// (intent word `intent`) takes it back (see [`Self::rcu_update`]):
    /// if its intent CAS had won (`named`), by CAS of the intent word at
    /// `intent_at` to 0 — a lost CAS means a client that undid the mark
    /// took the block; a won one quarantines it for a lease — else at
    /// once (nobody else saw it).
    async fn take_back(
        &self,
        ctx: &Ctx,
        intent_at: RemoteRef,
        intent: u64,
        named: bool,
    ) -> Result<(), IndexError> {
        let (leaf, units) = intent_leaf(intent).expect("an update's own intent word");
        if !named {
            self.free_unpublished(leaf, units as usize * 64);
        } else if ctx.cas_sync(intent_at, intent, 0).await? == intent {
            // Quarantined like a claimed block: an undoer's claim of it
            // may still be in flight.
            let now = ctx.now();
            self.st.borrow_mut().alloc.retire(leaf, units, now);
        } else {
            return Ok(());
        }
        self.count(|c| c.unlinked_leaf_bytes -= units * 64);
        Ok(())
    }

    /// Out-of-place mode: undoes the mark on the leaf of `slot` (read at
    /// slot address `at`) if its lease ran out — the client that marked
    /// it died, or stalled past its lease, before swinging the slot; the
    /// leaf is then live again, with its old value. `Ok(true)`: the mark
    /// is undone (here or by another client); `Ok(false)`: it still runs,
    /// or its leaf left the slot (an update that finished: the leaf stays
    /// marked for good, as stale cached paths may still lead to it).
    /// The slot is read after the deadline passed, when the holder may no
    /// longer swing it, so a slot that still names the leaf is final.
    /// The leaf's intent word is read in the undo CAS's batch; if this
    /// client's undo wins, it claims the dead updater's new leaf named
    /// there ([`Self::claim_intent`]; see [`Self::rcu_update`]).
    async fn undo_expired_mark(
        &self,
        ctx: &Ctx,
        at: GlobalAddr,
        slot: Slot,
        mark: u64,
        unmarked: u64,
    ) -> Result<bool, IndexError> {
        if !self.t.cfg.lease.short_expired(ctx, mark_deadline(mark)) {
            return Ok(false);
        }
        let word = self.sc().word;
        ctx.read(self.t.remote(at)?, word);
        ctx.sync().await?;
        if ctx.local_u64(word) != slot.0 {
            return Ok(false);
        }
        debug_assert!(unmarked & META_REPLACED == 0 && unmarked & META_VALID != 0);
        let meta = self.t.remote(slot.ptr().add(LEAF_META))?;
        let intent_at = self
            .t
            .remote(slot.ptr().add(intent_offset(mark, self.t.cfg.kcap())))?;
        ctx.read(intent_at, word);
        let t = ctx.cas(meta, mark, unmarked);
        ctx.sync().await?;
        if ctx.value(t) == mark {
            self.count(|c| {
                c.leases_broken += 1;
                c.marks_undone += 1;
            });
            let found = ctx.local_u64(word);
            self.claim_intent(ctx, intent_at, found).await?;
        }
        Ok(true)
    }

    /// Out-of-place mode, after this client won the undo of a mark: takes
    /// the never-linked new leaf the intent word at `intent_at` named
    /// (`found`, read before the undo; 0: none) by CAS of the word to 0,
    /// and puts it in this client's allocator. A lost CAS means another
    /// client took it (its writer, or another undoer).
    async fn claim_intent(
        &self,
        ctx: &Ctx,
        intent_at: RemoteRef,
        found: u64,
    ) -> Result<(), IndexError> {
        if found == 0 {
            return Ok(());
        }
        let (leaf, units) =
            intent_leaf(found).ok_or(corrupt(intent_at.addr, "leaf intent word"))?;
        if ctx.cas_sync(intent_at, found, 0).await? == found {
            // Quarantined for a lease: a CAS of the word from this block
            // that was in flight (its writer taking it back) cannot then
            // meet the block named again after reuse.
            let now = ctx.now();
            let mut st = self.st.borrow_mut();
            st.alloc.retire(leaf, units, now);
            st.counters.leaf_bytes_reclaimed += units * 64;
        }
        Ok(())
    }

    /// Out-of-place mode: clears the leaf's valid bit by CAS.
    async fn rcu_delete(
        &self,
        ctx: &Ctx,
        p: &Pos,
        idx: usize,
        slot: Slot,
        key: &[u8],
    ) -> Result<Locked, IndexError> {
        let l = match self.rcu_live_leaf(ctx, p, idx, slot, key).await? {
            Ok(l) => l,
            Err(instead) => return Ok(instead),
        };
        assert!(l.valid(), "only a live leaf is deleted");
        let addr = slot.ptr();
        let t = ctx.cas(
            self.t.remote(addr.add(LEAF_META))?,
            l.meta,
            l.meta & !META_VALID,
        );
        ctx.sync().await?;
        let got = ctx.value(t) == l.meta;
        ctx.cas_outcome(got).await;
        Ok(if got { Locked::Done } else { Locked::Retry })
    }

    // ---- scans ---------------------------------------------------------

    /// Every entry with `lo <= key <= hi`, in key order (same guarantees
    /// as [`ArtClient::scan`]).
    pub async fn range(
        &self,
        ctx: &Ctx,
        lo: &[u8],
        hi: &[u8],
    ) -> Result<Vec<(Vec<u8>, Vec<u8>)>, IndexError> {
        self.check_key(ctx, lo)?;
        self.check_key(ctx, hi)?;
        let _op = ctx.read_op("scan").await;
        let (lo, hi) = (self.tree_key(lo), self.tree_key(hi));
        self.scan_tk(ctx, &lo, Some(&hi), usize::MAX).await
    }

    /// The ordered walk: a list of pending items in key order, whose first
    /// unread ones are fetched in parallel each round (one READ per node
    /// or leaf, one doorbell per memory node); nodes expand into their
    /// children in place, and finished entries leave from the front. The
    /// list starts at the root, or at the cached node `lo` leads to and
    /// its ancestors' continuations ([`ArtClient::scan_start`]).
    async fn scan_tk(
        &self,
        ctx: &Ctx,
        lo: &[u8],
        hi: Option<&[u8]>,
        count: usize,
    ) -> Result<Vec<(Vec<u8>, Vec<u8>)>, IndexError> {
        let sc = *self.sc();
        let width = sc.scan_width();
        let mut retry = Retry::new("scan", self.t.cfg.retry);
        'scan: loop {
            let mut out: Vec<(Vec<u8>, Vec<u8>)> = Vec::new();
            let mut items = self.scan_start(lo, hi, retry.attempts() < CACHED_ATTEMPTS);
            while out.len() < count {
                while let Some(Item::Ready(_, _)) = items.front() {
                    if let Some(Item::Ready(k, v)) = items.pop_front() {
                        out.push((k, v));
                        if out.len() >= count {
                            break;
                        }
                    }
                }
                if out.len() >= count || items.is_empty() {
                    break;
                }
                // Fetch the first items, no more than `width` and no more
                // than the entries still wanted can need: a node counts as
                // the keys its type guarantees at least (past the first
                // one, NODE_16 holds ≥ 5, NODE_48 ≥ 17, NODE_256 ≥ 49), so
                // a short scan does not read whole subtrees it will not use;
                // an ancestor's continuation as its snapshot's estimate.
                let want = count.saturating_sub(out.len());
                let (mut n, mut covers) = (0, 0usize);
                for it in items.iter().take(width) {
                    if covers >= want {
                        break;
                    }
                    n += 1;
                    covers = covers.saturating_add(match it {
                        Item::Node {
                            covers: Some(c), ..
                        } => *c,
                        Item::Node { ty, .. } => ty.min_children(),
                        _ => 1,
                    });
                }
                let n = n.max(1);
                for (i, it) in items.iter().take(n).enumerate() {
                    let piece = sc.scan.piece(i, sc.scan_item);
                    match it {
                        Item::Node { addr, ty, .. } => {
                            ctx.read(self.t.remote(*addr)?, piece.prefix(ty.read_bytes()));
                        }
                        Item::Leaf { slot, .. } => {
                            let a = slot.ptr();
                            ctx.read(self.t.remote(a)?, piece.prefix(self.leaf_len(*slot)?));
                        }
                        Item::Ready(..) => {}
                    }
                }
                ctx.sync().await?;
                let mut expanded: Vec<Item> = Vec::new();
                for i in 0..n {
                    let it = items.pop_front().expect("n items");
                    let piece = sc.scan.piece(i, sc.scan_item);
                    match it {
                        Item::Ready(..) => expanded.push(it),
                        Item::Leaf { slot, bound } => {
                            let len = self.leaf_len(slot)?;
                            match self.decode(ctx, piece.prefix(len)) {
                                None => {
                                    self.count(|c| c.torn_reads += 1);
                                    expanded.push(Item::Leaf { slot, bound });
                                }
                                Some(l) if l.valid() => {
                                    let tk = self.tree_key(&l.key);
                                    let tk = tk.as_slice();
                                    if tk >= lo
                                        && bound.as_ref().is_none_or(|b| tk >= b.lo.as_slice())
                                        && hi.is_none_or(|h| tk <= h)
                                    {
                                        expanded.push(Item::Ready(l.key, l.value));
                                    }
                                }
                                Some(_) => {}
                            }
                        }
                        Item::Node {
                            addr,
                            ty,
                            e,
                            path,
                            bound,
                            covers,
                        } => {
                            let head: NodeHead = ctx.get_as(piece.prefix(NODE_HEAD));
                            let header = Header(head.header);
                            let Some(hty) = header.ty() else {
                                return Err(corrupt(addr, "internal node header"));
                            };
                            let d = header.depth();
                            if hty == NodeType::Deleted || d > e || e - d > header.prefix_len() {
                                // Not where the path says (a header split
                                // finished since the parent, or the cached
                                // snapshot that named it, was read): the
                                // next start must not take it again.
                                if self.t.cfg.scan_from_cache {
                                    self.cache().remove(addr);
                                }
                                self.pause(ctx, &mut retry).await?;
                                continue 'scan;
                            }
                            if hty > ty {
                                expanded.push(Item::Node {
                                    addr,
                                    ty: hty,
                                    e,
                                    path,
                                    bound,
                                    covers,
                                });
                                continue;
                            }
                            // A continuation's keys start at its bound
                            // (past the subtree the scan started in).
                            let lo = bound.as_ref().map_or(lo, |b| b.lo.as_slice());
                            let mut full = path.bytes();
                            full.extend((e - d..header.prefix_len()).map(|i| header.prefix(i)));
                            let pos = full.len();
                            // Subtrees wholly below lo or above hi are cut.
                            let n = pos.min(lo.len());
                            let lo_cmp = full[..n].cmp(&lo[..n]);
                            let hi_cmp =
                                hi.map(|h| full[..pos.min(h.len())].cmp(&h[..pos.min(h.len())]));
                            if lo_cmp == std::cmp::Ordering::Less
                                || hi_cmp == Some(std::cmp::Ordering::Greater)
                            {
                                continue;
                            }
                            let mut words = vec![0u64; hty.slots()];
                            ctx.get_local(piece.skip(NODE_SLOTS as usize), words.as_mut_bytes());
                            if self.t.cfg.scan_from_cache {
                                // The node as read now, for the next scans'
                                // starts (and searches), as SMART's range
                                // query fills its cache — unless the cache
                                // holds it as it is (no allocation then).
                                let rev = GlobalAddr::from_raw(head.rev);
                                if !self.cached_as(addr, header, rev, &words) {
                                    let view = NodeView::new(addr, header, rev, words.clone());
                                    self.cache().put(Arc::new(view));
                                }
                            }
                            let mut kids: Vec<Slot> = words
                                .into_iter()
                                .map(Slot)
                                .filter(|s| !s.is_empty())
                                .filter(|s| {
                                    (lo_cmp == std::cmp::Ordering::Greater
                                        || pos >= lo.len()
                                        || s.pkey() >= lo[pos])
                                        && (hi_cmp != Some(std::cmp::Ordering::Equal)
                                            || hi.is_none_or(|h| {
                                                pos >= h.len() || s.pkey() <= h[pos]
                                            }))
                                        && bound
                                            .as_ref()
                                            .is_none_or(|b| s.is_leaf() || s.ptr() != b.skip)
                                })
                                .collect();
                            kids.sort_by_key(|s| s.pkey());
                            let full = Rc::new(full);
                            for s in kids {
                                if s.is_leaf() {
                                    expanded.push(Item::Leaf {
                                        slot: s,
                                        bound: bound.clone(),
                                    });
                                } else {
                                    let p = Path {
                                        parent: full.clone(),
                                        last: Some(s.pkey()),
                                    };
                                    expanded.push(Item::Node {
                                        addr: s.ptr(),
                                        ty: s
                                            .child_type()
                                            .unwrap_or(NodeType::N4)
                                            .max(NodeType::N4),
                                        e: pos + 1,
                                        path: p,
                                        bound: bound.clone(),
                                        covers: None,
                                    });
                                }
                            }
                        }
                    }
                }
                for it in expanded.into_iter().rev() {
                    items.push_front(it);
                }
            }
            out.truncate(count);
            return Ok(out);
        }
    }

    /// Whether the cache holds node `addr` with this header, reverse
    /// pointer and visible slots.
    fn cached_as(&self, addr: GlobalAddr, header: Header, rev: GlobalAddr, words: &[u64]) -> bool {
        let cache: Reader<'_> = self.cache().reader();
        let Some(v) = cache.get(addr) else {
            return false;
        };
        v.header == header
            && v.rev == rev
            && words.iter().enumerate().all(|(i, &w)| {
                let s = Slot(w);
                s.is_empty() || v.find(s.pkey()) == Some((i, s))
            })
    }

    /// A scan's first items: the root (the cache off or cold,
    /// `scan_from_cache` off, or `use_cache` false after restarts), or the
    /// deepest node of `lo`'s path through the cached snapshots followed by
    /// its ancestors' continuations.
    ///
    /// The cached walk from the root along `lo` (each child's snapshot
    /// naming its parent and arrived at no deeper than its header, as a
    /// search's) gives a chain A0 = root, …, Ak of nodes whose full key
    /// prefixes F(Ai) — the key bytes up to each one's branching byte —
    /// are prefixes of `lo`. The items, in key order: Ak, with the scan's
    /// own bounds; then for i = k−1 down to 0, Ai's *continuation*: Ai with
    /// the lower bound succ(F(Ai+1)) (the least string above every key
    /// starting with F(Ai+1)) and the child Ai+1 skipped wherever it
    /// shows up. Every one of them is read from remote memory when the scan
    /// reaches it; the snapshots only name them. Why no key present
    /// throughout the scan is missed and none is returned twice: see
    /// "Scans" in the crate docs.
    fn scan_start(&self, lo: &[u8], hi: Option<&[u8]>, use_cache: bool) -> VecDeque<Item> {
        let root = || {
            VecDeque::from([Item::Node {
                addr: self.t.root,
                ty: NodeType::N256,
                e: 0,
                path: Path::default(),
                bound: None,
                covers: None,
            }])
        };
        if !use_cache || !self.t.cfg.scan_from_cache {
            return root();
        }
        let cache: Reader<'_> = self.cache().reader();
        let Some(mut v) = cache.get(self.t.root) else {
            return root();
        };
        // (node, key position it is arrived at, its branching position)
        let mut chain: Vec<(&Arc<NodeView>, usize, usize)> = Vec::new();
        let mut e = 0;
        while let Ok(pos) = v.match_prefix(e, lo) {
            if pos >= lo.len() {
                break;
            }
            chain.push((v, e, pos));
            let Some((_, s)) = v.find(lo[pos]) else {
                break;
            };
            if s.is_leaf() {
                break;
            }
            match cache.get_touch(s.ptr()) {
                Some(c) if c.header.depth() <= pos + 1 && c.rev == v.addr => {
                    v = c;
                    e = pos + 1;
                }
                _ => break,
            }
        }
        let Some(&(start, e, _)) = chain.last() else {
            return root();
        };
        if chain.len() == 1 {
            return root();
        }
        let path = |e: usize| Path {
            parent: Rc::new(lo[..e].to_vec()),
            last: None,
        };
        let mut items = VecDeque::with_capacity(chain.len());
        items.push_back(Item::Node {
            addr: start.addr,
            ty: start.ty(),
            e,
            path: path(e),
            bound: None,
            covers: None,
        });
        for w in chain.windows(2).rev() {
            let ((a, e, pos), (child, _, child_pos)) = (w[0], w[1]);
            assert!(
                pos < child_pos && child_pos <= lo.len(),
                "a child's branching byte lies below its parent's"
            );
            // Past every key of the child's subtree; nothing of `a` is
            // left if the successor leaves a's own prefix.
            let Some(after) = successor(&lo[..child_pos]).filter(|s| s.len() > pos) else {
                continue;
            };
            if hi.is_some_and(|h| after.as_slice() > h) {
                break;
            }
            // The snapshot's slots past the child: a lower estimate of
            // what is there now (slots never empty again); a node holds
            // two keys at least.
            let covers = a
                .slots()
                .iter()
                .map(|&w| Slot(w))
                .filter(|s| !s.is_empty() && s.pkey() > lo[pos])
                .map(|s| if s.is_leaf() { 1 } else { 2 })
                .sum();
            items.push_back(Item::Node {
                addr: a.addr,
                ty: a.ty(),
                e,
                path: path(e),
                bound: Some(Rc::new(Bound {
                    lo: after,
                    skip: child.addr,
                })),
                covers: Some(covers),
            });
        }
        drop(cache);
        self.count(|c| c.cached_scan_starts += 1);
        items
    }
}

/// The least byte string above every string that starts with `p`: `p`
/// up to its last byte below 0xFF, that byte raised by one (`None` if
/// every byte is 0xFF).
fn successor(p: &[u8]) -> Option<Vec<u8>> {
    let i = p.iter().rposition(|&b| b != 0xFF)?;
    let mut s = p[..=i].to_vec();
    s[i] += 1;
    Some(s)
}

/// A scan item's path: its parent's (shared by the siblings) and its own
/// partial key — one allocation per node read, not per child queued.
#[derive(Default)]
struct Path {
    parent: Rc<Vec<u8>>,
    last: Option<u8>,
}

impl Path {
    fn bytes(&self) -> Vec<u8> {
        let mut v = Vec::with_capacity(self.parent.len() + 8);
        v.extend_from_slice(&self.parent);
        v.extend(self.last);
        v
    }
}

/// The bound of an ancestor's continuation in a scan started from a
/// cached node (shared by every item below it).
struct Bound {
    /// The continuation's keys are at least this (a prefix bound: the
    /// successor of the full prefix of the subtree the scan started in).
    lo: Vec<u8>,
    /// The node the scan started in (or the ancestor's child on its way):
    /// its keys are all below `lo`, so it is never read again.
    skip: GlobalAddr,
}

/// A pending item of a scan.
enum Item {
    Node {
        addr: GlobalAddr,
        ty: NodeType,
        e: usize,
        /// Tree-key bytes before position `e`.
        path: Path,
        /// A continuation's bound (its own and its descendants').
        bound: Option<Rc<Bound>>,
        /// Keys it is expected to yield at least (`None`: as its type
        /// guarantees).
        covers: Option<usize>,
    },
    Leaf {
        slot: Slot,
        bound: Option<Rc<Bound>>,
    },
    Ready(Vec<u8>, Vec<u8>),
}

/// Outcome of a leaf-level write step.
enum Locked {
    Done,
    /// The leaf does not hold the key (or holds it deleted).
    Absent,
    /// Lost a race (lock held, leaf being replaced): start over.
    Retry,
}

/// What an insert step leads to.
enum Next {
    Done,
    /// Go on from here (no race lost).
    Continue(Start),
    /// Lost a race: back off, then go on from here.
    Conflict(Start),
}

fn classify(l: &crate::layout::Item<'_>, key: &[u8]) -> LeafIs {
    if l.key != key {
        return LeafIs::Other {
            key: l.key.to_vec(),
            dead: !l.valid(),
        };
    }
    if l.replaced() {
        LeafIs::Replaced {
            mark: l.meta,
            unmarked: l.unmarked(),
        }
    } else if l.valid() {
        LeafIs::Live(LeafCopy {
            meta: l.meta,
            key: Vec::new(),
            value: l.value.to_vec(),
        })
    } else {
        LeafIs::Dead
    }
}

impl RemoteMap for ArtTree {
    const KIND: &'static str = KIND;
    const ORDERED: bool = true;
    type Config = ArtConfig;
    type Client = ArtClient;

    /// Creates tree `name` (descriptor, root node and node-lock table in
    /// one chunk on the lowest memory node; other nodes spread over the
    /// fabric by the clients' allocators) and registers it as a named
    /// root. Nothing is left behind if it fails.
    fn create(
        fabric: Arc<dyn Fabric>,
        name: &str,
        cfg: ArtConfig,
    ) -> Result<Arc<Self>, IndexError> {
        cfg.validate()?;
        let mut c = Creation::begin(fabric, KIND, name, &[])?;
        let desc = c.alloc(c.home(), ROOT_END + 8 * LOCK_WORDS, "allocating the root")?;
        let root = desc.add(DESC_BYTES);
        let locks = desc.add(ROOT_END);
        let header = Header::new(0, NodeType::N256, &[]);
        c.write(root.add(NODE_HEADER), header.0.as_bytes())?;
        let d = TreeDesc {
            magic: DESC_MAGIC.word(),
            root: root.raw(),
            max_key: cfg.max_key as u64,
            max_value: cfg.max_value as u64,
            flags: if cfg.in_place { FLAG_IN_PLACE } else { 0 }
                | match cfg.node_layout {
                    NodeLayout::FixedTypes => 0,
                    NodeLayout::Homogeneous => FLAG_FINE_NODES,
                },
            locks: locks.raw(),
            reserved: [0; 2],
        };
        c.write(desc, d.as_bytes())?;
        let home = c.publish(desc)?;
        Ok(Arc::new(Self::assemble(home, cfg, root, locks)))
    }
    /// Opens tree `name`. Structural settings come from the tree; `cfg`
    /// supplies the client-side ones (cache, rear lock, chunk size,
    /// retries).
    fn open(fabric: Arc<dyn Fabric>, name: &str, cfg: ArtConfig) -> Result<Arc<Self>, IndexError> {
        let (home, desc) =
            dmkit_index::lifecycle::open(fabric, KIND, name, DESC_MAGIC, DESC_BYTES as usize)?;
        let (d, _) = TreeDesc::read_from_prefix(&desc)
            .map_err(|_| corrupt(home.desc(), "tree descriptor"))?;
        let cfg = ArtConfig {
            max_key: d.max_key as usize,
            max_value: d.max_value as usize,
            in_place: d.flags & FLAG_IN_PLACE != 0,
            node_layout: if d.flags & FLAG_FINE_NODES != 0 {
                NodeLayout::Homogeneous
            } else {
                NodeLayout::FixedTypes
            },
            ..cfg
        };
        cfg.validate()?;
        let (root, locks) = (GlobalAddr::from_raw(d.root), GlobalAddr::from_raw(d.locks));
        Ok(Arc::new(Self::assemble(home, cfg, root, locks)))
    }
    /// Drops this handle's hold on the tree; the last holder's drop (or
    /// death) frees all of its memory, whichever process took it, and its
    /// name (see `dmkit_index::lifecycle`). No client of this handle may
    /// use the tree afterwards.
    fn destroy(&self) -> Result<(), IndexError> {
        self.home.destroy()
    }
    /// A client for one worker on compute machine `machine` (its tasks
    /// share the client's allocator; every client of the machine shares the
    /// cache of internal nodes and the read-delegation and write-combining
    /// windows). `id` names lock holders; make it unique among the tree's
    /// live clients.
    fn client_on(self: &Arc<Self>, machine: usize, id: u64) -> ArtClient {
        ArtClient {
            t: self.clone(),
            rdwc: self.rdwc.get(machine, rdwc::Table::default),
            node_locks: (!self.cfg.lock_free_internal).then(|| {
                self.node_locks.get(machine, || {
                    TicketLocks::new(LOCK_WORDS as usize, NODE_LOCK_HANDOVER)
                })
            }),
            leaf_locks: (!self.cfg.write_combining && self.cfg.leaf_hocl).then(|| {
                self.leaf_locks.get(machine, || LeafLocks {
                    q: TicketLocks::new(self.cfg.leaf_lock_entries, self.cfg.leaf_handover),
                    images: Mutex::default(),
                })
            }),
            cache: self.caches.get(machine, || {
                Cache::new(self.cfg.cache_bytes, Some(self.root))
            }),
            st: Rc::new(RefCell::new(ClientState {
                buf: Vec::new(),
                // Only unlinked leaves reclaimed from an intent word are
                // retired (see `rcu_update`): a lease and its skew.
                alloc: BlockAlloc::new(
                    self.cfg.chunk_bytes,
                    self.cfg.lease.lease + 2 * self.cfg.lease.skew,
                    self.home.group(),
                ),
                owner: dmkit_index::lease::owner_of(id),
                counters: TreeCounters::default(),
            })),
        }
    }
    fn local_layout(&self) -> &LocalLayout {
        &self.layout
    }
    fn config(&self) -> &ArtConfig {
        &self.cfg
    }
    fn name(&self) -> &str {
        self.home.name()
    }
}

impl MapClient for ArtClient {
    /// The value of `key`, if present.
    async fn search(&self, ctx: &Ctx, key: &[u8]) -> Result<Option<Vec<u8>>, IndexError> {
        self.check_key(ctx, key)?;
        let _op = ctx.read_op("search").await;
        if !self.t.cfg.read_delegation {
            return self.search_in(ctx, key, None).await;
        }
        // A warm search has nothing to delegate (see `rdwc::Table::quiet`):
        // its leaf READ alone, as `search_in` would post it. Anything but
        // the live key there takes the full path below.
        if self.rdwc.quiet(key) {
            if let Some(slot) = self.cached_leaf_slot(&self.tree_key(key)) {
                if let LeafIs::Live(l) = self.read_leaf(ctx, slot, key).await? {
                    self.note_cache(true);
                    return Ok(Some(l.value));
                }
            }
        }
        let role = self.rdwc.enter(key, rdwc::Kind::Read, &[]);
        match role {
            Role::Lead(w) => {
                let r = self.search_in(ctx, key, Some(&w)).await;
                self.rdwc.leave(key, &w, || match &r {
                    Ok(Some(v)) => Outcome::Found(v.clone()),
                    _ => Outcome::Redo,
                });
                r
            }
            Role::Join(w) => {
                if let Outcome::Found(v) = self.wait(ctx, &w).await {
                    self.count(|c| c.delegated_reads += 1);
                    return Ok(Some(v));
                }
                self.search_in(ctx, key, None).await
            }
            Role::Alone => self.search_in(ctx, key, None).await,
        }
    }
    /// Inserts `key` if absent; `false` (and no change) if present.
    async fn insert(&self, ctx: &Ctx, key: &[u8], value: &[u8]) -> Result<bool, IndexError> {
        self.check_key(ctx, key)?;
        self.check_value(value)?;
        let _op = ctx.op("insert").await;
        self.write(ctx, key, value, WriteMode::Insert, None).await
    }
    /// Replaces the value of `key` if present; `false` if absent.
    async fn update(&self, ctx: &Ctx, key: &[u8], value: &[u8]) -> Result<bool, IndexError> {
        self.check_key(ctx, key)?;
        self.check_value(value)?;
        let _op = ctx.op("update").await;
        if !self.t.cfg.write_combining {
            return self.write(ctx, key, value, WriteMode::Update, None).await;
        }
        let role = self.rdwc.enter(key, rdwc::Kind::Write, value);
        match role {
            Role::Lead(w) => {
                let r = self
                    .write(ctx, key, value, WriteMode::Update, Some(&w))
                    .await;
                self.rdwc.leave(key, &w, || match r {
                    Ok(true) => Outcome::Written,
                    _ => Outcome::Redo,
                });
                r
            }
            Role::Join(w) => {
                if let Outcome::Written = self.wait(ctx, &w).await {
                    self.count(|c| c.combined_writes += 1);
                    return Ok(true);
                }
                self.write(ctx, key, value, WriteMode::Update, None).await
            }
            Role::Alone => self.write(ctx, key, value, WriteMode::Update, None).await,
        }
    }
    /// Removes `key` if present: its leaf is marked deleted (the slot keeps
    /// pointing at it until an insert with that byte reuses the slot).
    async fn delete(&self, ctx: &Ctx, key: &[u8]) -> Result<bool, IndexError> {
        self.check_key(ctx, key)?;
        let _op = ctx.op("delete").await;
        self.write(ctx, key, &[], WriteMode::Delete, None).await
    }
    /// Up to `count` entries with keys ≥ `from`, in key order. Not atomic
    /// with concurrent writes (as in the paper, §4.4): a range that nobody
    /// writes during the scan is returned exactly; keys outside the range
    /// never are.
    async fn scan(
        &self,
        ctx: &Ctx,
        from: &[u8],
        count: usize,
    ) -> Result<Vec<(Vec<u8>, Vec<u8>)>, IndexError> {
        self.check_key(ctx, from)?;
        let _op = ctx.read_op("scan").await;
        let lo = self.tree_key(from);
        self.scan_tk(ctx, &lo, None, count).await
    }
    /// Every entry, in key order (for tests and tools; quiescent trees).
    async fn entries(&self, ctx: &Ctx) -> Result<Vec<(Vec<u8>, Vec<u8>)>, IndexError> {
        self.check_local(ctx)?;
        let lo = vec![0u8; self.t.cfg.max_key + 1];
        self.scan_tk(ctx, &lo, None, usize::MAX).await
    }
    /// Cache hits and misses as the tree counts them (operations that
    /// reached their leaf through cached nodes only, and the others);
    /// splits of leaves and of headers.
    fn stats(&self) -> ClientStats {
        let c = self.counters();
        ClientStats {
            cache_hits: c.cache_hits,
            cache_misses: c.cache_misses,
            splits: c.leaf_splits + c.header_splits,
            lock_handovers: c.lock_handovers,
            foreign_handovers: c.foreign_handovers,
        }
    }
    fn local_layout(&self) -> &LocalLayout {
        &self.t.layout
    }
}

#[allow(dead_code)]
fn _assert_send_sync() {
    fn is<T: Send + Sync>() {}
    is::<ArtTree>();
}

#[cfg(all(test, feature = "cli"))]
mod cli_tests {
    use clap::{Args, FromArgMatches};

    use super::*;

    fn parse(args: &str) -> ArtConfig {
        let cmd = ArtConfig::augment_args(clap::Command::new("t").no_binary_name(true));
        cmd.clone().debug_assert();
        let m = cmd
            .try_get_matches_from(args.split_whitespace())
            .expect("flags parse");
        ArtConfig::from_arg_matches(&m).expect("a config")
    }

    #[test]
    fn flags_keep_their_names_and_defaults() {
        assert_eq!(parse(""), ArtConfig::default());
        let mut c = parse(
            "--art-cache 1MiB --in-place-leaf off --rear-lock off --rdwc off \
             --lock-free-internal off",
        );
        assert_eq!(
            (c.cache_bytes, c.in_place, c.rear_lock, c.read_delegation),
            (1 << 20, false, false, false)
        );
        assert!(!c.lock_free_internal);
        let h = parse("--leaf-hocl off --leaf-handover 3");
        assert_eq!((h.leaf_hocl, h.leaf_handover), (false, 3));
        assert_eq!(
            (c.leaf_hocl, c.leaf_handover),
            (true, 8),
            "HOCL's queue and Sherman's hand-over bound by default"
        );
        assert!(
            !c.handover_reread,
            "a handed lock carries the leaf by default"
        );
        assert!(parse("--leaf-handover-reread on").handover_reread);
        assert!(c.scan_from_cache, "scans start from the cache by default");
        assert!(!parse("--scan-from-cache off").scan_from_cache);
        c.fit(&Shape {
            keys: 1000,
            max_key: 8,
            fixed_keys: true,
            max_value: 4,
            clients: 2,
        });
        assert_eq!(
            (c.write_combining, c.max_key, c.max_value),
            (false, 8, 8),
            "--rdwc switches write combining too"
        );
    }
}

#[cfg(test)]
mod config_tests {
    use super::*;

    /// The sizing the YCSB harness used before the index layer
    /// (`art_config`/`art_memory_estimate` in dmkit-bench): the simulated
    /// figures depend on it bit for bit.
    #[test]
    fn fit_and_memory_estimate_are_the_harness_formulas() {
        for (fixed, max_key, value, keys, clients) in
            [(true, 8, 8, 1_000_000, 16), (false, 32, 100, 12_345, 3)]
        {
            let shape = Shape {
                keys,
                max_key,
                fixed_keys: fixed,
                max_value: value,
                clients,
            };
            let mut c = ArtConfig::default();
            c.fit(&shape);
            assert_eq!((c.max_key, c.max_value), (max_key, value.max(8)));
            let leaf = leaf_bytes(max_key, value.max(8)).next_multiple_of(64) as u64;
            let nodes = if fixed {
                keys.div_ceil(6)
            } else {
                keys + keys / 2
            };
            let want = 2 * keys * leaf + nodes * 2112 + clients as u64 * 2 * (4 << 20) + (64 << 20);
            assert_eq!(c.memory_estimate(&shape), want);
            assert_eq!(
                (c.key_limits(), c.max_value()),
                ((1, max_key), value.max(8))
            );
        }
    }
}

/// The window of a header split between its two CASes, built step by step:
/// the split of node N is published (the parent names the new node M) and
/// another key is inserted under M while N's header is not cut yet.
#[cfg(test)]
mod split_window_tests {
    use dmkit_fabric::SyncQp;
    use dmkit_index::conformance::{on_worker, shm_fabric};
    use dmkit_index::{MapClient, RemoteMap};

    use super::*;

    fn node(qp: &mut SyncQp, tree: &ArtTree, addr: GlobalAddr) -> InternalNode {
        let rk = tree.home.rkey(addr.node()).unwrap();
        let b = qp.read(addr, rk, NODE_BYTES).unwrap();
        InternalNode::read_from_bytes(&b).unwrap()
    }

    /// A search or update of a key under M must find it from a machine
    /// whose cache still shows the old path (parent → N): N, read now,
    /// still has its old header, which the key leaves.
    #[test]
    fn a_key_under_a_split_node_is_found_through_a_stale_path() {
        let f = shm_fabric(1, 64 << 20);
        let cfg = ArtConfig {
            max_key: 8,
            max_value: 8,
            cache_bytes: 1 << 20,
            chunk_bytes: 1 << 20,
            ..Default::default()
        };
        let tree = ArtTree::create(f.clone(), "window", cfg).unwrap();
        let (k1, k2, k3) = (b"abcdefgh", b"abcdefgX", b"abcZZZZZ");
        let writer = tree.client_on(0, 1);
        // Machine 1 caches the root and N; machine 2 only the root.
        let (stale_n, stale_root) = (tree.client_on(1, 2), tree.client_on(2, 3));
        on_worker(f.as_ref(), &writer, move |ctx, c| async move {
            assert!(c.insert(&ctx, k1, b"v1").await.unwrap());
            assert!(c.insert(&ctx, k2, b"v2").await.unwrap());
        });
        on_worker(f.as_ref(), &stale_n, move |ctx, c| async move {
            assert_eq!(c.search(&ctx, k1).await.unwrap(), Some(b"v1".to_vec()));
        });
        on_worker(f.as_ref(), &stale_root, move |ctx, c| async move {
            assert_eq!(c.search(&ctx, b"q").await.unwrap(), None);
        });
        assert!(stale_n.cache().reader().get(tree.root).is_some());
        assert!(stale_root.cache().reader().get(tree.root).is_some());
        // N: the node below the root's slot `a`, with partial keys "bcdefg".
        let mut qp = SyncQp::new(f.as_ref(), tree.root.node(), NODE_BYTES).unwrap();
        let find = |n: &InternalNode, b: u8| {
            n.slots
                .iter()
                .map(|&w| Slot(w))
                .find(|s| !s.is_empty() && s.pkey() == b)
                .unwrap()
        };
        let root = node(&mut qp, &tree, tree.root);
        let n = find(&root, b'a').ptr();
        let old = node(&mut qp, &tree, n).head;
        assert_eq!(Header(old.header).depth(), 1);
        assert_eq!(Header(old.header).prefix_len(), 6);
        assert!(stale_n.cache().reader().get(n).is_some());
        assert!(stale_root.cache().reader().get(n).is_none());
        // The header split of N at "bc" (M above N), then k3 below M.
        on_worker(f.as_ref(), &writer, move |ctx, c| async move {
            assert!(c.insert(&ctx, k3, b"v3").await.unwrap());
        });
        assert_eq!(writer.counters().header_splits, 1);
        let m = find(&node(&mut qp, &tree, tree.root), b'a').ptr();
        assert_ne!(m, n);
        assert_eq!(find(&node(&mut qp, &tree, m), b'd').ptr(), n);
        // Back into the window: N as it was before the cut (its old header
        // and reverse pointer), as if the splitter had not cut it yet
        // while another client's insert of k3 under M had returned.
        let cut = node(&mut qp, &tree, n).head;
        assert_ne!(cut, old);
        let at = n.add(std::mem::offset_of!(InternalNode, head) as u64);
        let rk = tree.home.rkey(n.node()).unwrap();
        qp.write(at, rk, old.as_bytes()).unwrap();
        let runs = [
            (&stale_n, b"v3", b"v4", b"abcYYYYY"),
            (&stale_root, b"v4", b"v5", b"abcWWWWW"),
        ];
        for (c, was, now, k4) in runs {
            on_worker(f.as_ref(), c, move |ctx, c| async move {
                assert_eq!(c.search(&ctx, k3).await.unwrap(), Some(was.to_vec()));
                assert!(c.update(&ctx, k3, now).await.unwrap());
                // An insert that leaves N's old header at the bytes M took
                // goes below M (its header split of N by the stale link
                // fails its CAS).
                assert!(c.insert(&ctx, k4, b"v").await.unwrap());
                assert_eq!(c.search(&ctx, k4).await.unwrap(), Some(b"v".to_vec()));
                assert_eq!(c.search(&ctx, k1).await.unwrap(), Some(b"v1".to_vec()));
            });
        }
        // The splitter cuts the header: the tree is whole.
        qp.write(at, rk, cut.as_bytes()).unwrap();
        check_tree_ok(&tree, 5);
    }

    /// A splitter that dies between its two CASes leaves N's header uncut
    /// for good. An insert that arrives at N through M and leaves N's
    /// remaining partial keys finds N "between the two CASes" of a split
    /// (`header_split`: arrival past the header's depth); were it only to
    /// start over, it would until its retries ran out (a `Timeout` after
    /// 10001 attempts). It helps instead, as inserts help a type switch:
    /// it cuts N's header by the bytes its arrival says M took and writes
    /// N's reverse pointer (a live splitter accepts a cut it finds done).
    #[test]
    fn an_insert_below_a_dead_splitters_node_completes() {
        let f = shm_fabric(1, 64 << 20);
        let cfg = ArtConfig {
            max_key: 8,
            max_value: 8,
            cache_bytes: 1 << 20,
            chunk_bytes: 1 << 20,
            ..Default::default()
        };
        let tree = ArtTree::create(f.clone(), "dead-split", cfg).unwrap();
        let c = tree.client_on(0, 1);
        on_worker(f.as_ref(), &c, move |ctx, c| async move {
            assert!(c.insert(&ctx, b"abcdefgh", b"v1").await.unwrap());
            assert!(c.insert(&ctx, b"abcdefgX", b"v2").await.unwrap());
        });
        let mut qp = SyncQp::new(f.as_ref(), tree.root.node(), NODE_BYTES).unwrap();
        let root = node(&mut qp, &tree, tree.root);
        let n = root
            .slots
            .iter()
            .map(|&w| Slot(w))
            .find(|s| !s.is_empty() && s.pkey() == b'a')
            .unwrap()
            .ptr();
        let old = node(&mut qp, &tree, n).head;
        on_worker(f.as_ref(), &c, move |ctx, c| async move {
            assert!(c.insert(&ctx, b"abcZZZZZ", b"v3").await.unwrap());
        });
        // The splitter died before its cut: N's old head back.
        let at = n.add(std::mem::offset_of!(InternalNode, head) as u64);
        let rk = tree.home.rkey(n.node()).unwrap();
        qp.write(at, rk, old.as_bytes()).unwrap();
        let other = tree.client_on(1, 2);
        on_worker(f.as_ref(), &other, move |ctx, c| async move {
            // Leaves N's old header after the bytes M took ("bc", then N's
            // byte 'd'): at 'e'.
            assert!(c.insert(&ctx, b"abcdQQQQ", b"v4").await.unwrap());
            for (k, v) in [
                (b"abcdefgh", b"v1"),
                (b"abcZZZZZ", b"v3"),
                (b"abcdQQQQ", b"v4"),
            ] {
                assert_eq!(c.search(&ctx, k).await.unwrap(), Some(v.to_vec()));
            }
        });
        let head = node(&mut qp, &tree, n).head;
        // Cut for M (depth 4), then split again for the new key at 'e'.
        assert_eq!(Header(head.header).depth(), 5, "N's header is cut");
        check_tree_ok(&tree, 4);
    }

    fn check_tree_ok(tree: &ArtTree, leaves: u64) {
        let rep = crate::check_tree(tree).unwrap();
        assert_eq!(rep.leaves, leaves, "{rep:?}");
    }
}
