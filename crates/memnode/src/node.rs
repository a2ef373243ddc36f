//! The memory node: memory, protection table, translation table, chunk
//! allocator, named roots, sessions and statistics.
//!
//! The node owns two memfds. The *data* memfd holds the memory pages; the
//! *control* memfd holds the protection and translation tables
//! ([`crate::layout`]). Compute processes map both (control read-only) and run
//! one-sided verbs with their own CPUs; the node's CPU only serves the RPC
//! requests of [`crate::proto`], as a memory blade's weak CPU does (SMART §2.1).
//!
//! Remote address space: `remote_pages` pages of `2^page_shift` bytes. Page 0
//! is never handed out, so offset 0 can serve as a null pointer. Every remote
//! page is translated through the page table to one of `phys_pages` memory
//! pages; `phys_pages - remote_pages` spare pages let the node remap pages at
//! run time ([`MemNode::migrate_page`]), the way CoRM (§3.5) re-registers or
//! uses ODP on a NIC to move memory under a stable remote address.
//!
//! # Who owns memory
//!
//! Every chunk has one owner, and a chunk can be freed only by its owner
//! or by an admin request carrying the node's token ([`AdminOp`]); any
//! other `FreeChunk` is refused with [`RpcError::NotOwner`] and changes
//! nothing.
//!
//! - A **session chunk** (`AllocChunk { persistent: false }`) belongs to the
//!   session that took it and is freed when the session ends: a clean
//!   close, Ctrl-C, or a crash (the kernel closes the socket).
//! - A **group chunk** (`AllocGroupChunk`) belongs to a *chunk group*, a
//!   structure's memory on this node, named like its root (`race/orders`).
//!   A group is reference counted by sessions: `HoldGroup` (and opening the
//!   root with `OpenRoot`, and a first `AllocGroupChunk`) take a reference,
//!   `ReleaseGroup` drops one, and a session's end drops all of its. When
//!   the last reference goes the node frees the group's chunks and removes
//!   the roots attached to it (a root claimed by a holder of the group with
//!   its name or a name under it), so a structure whose every client died
//!   leaves nothing behind. Any holder may free a group chunk. A structure
//!   is *not* kept past its last holder: to keep one, keep a session
//!   holding it — except on a file-backed node ([`crate::file`]), where
//!   a session's end drops its references but frees no group: what it
//!   held stays, unheld, until a client releases it last (a structure's
//!   `destroy`) or an admin collects it.
//! - A **persistent chunk** (`AllocChunk { persistent: true }`) outlives
//!   its session; only that session may free it while it lives, and once
//!   it has ended only an admin request ([`AdminOp::Gc`] collects every
//!   such chunk whose session is gone).
//! - The node's own ranges ([`MemNode::reserve_internal`]) belong to no
//!   session and are never freed by a client, admin or not.

use std::collections::{BTreeMap, BTreeSet, HashSet};
use std::ffi::CString;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use crate::alloc::ExtentAllocator;
use crate::error::{NodeError, RpcError};
use crate::file::{self, Meta};
use crate::layout::{self, ControlHeader, PageEntry, RegionEntry, MAX_REGIONS, PAGE_VALID};
use crate::memory::{create_sealed_memfd, Mapping};
use crate::proto::{
    AdminOp, NodeLayout, NodeStats, RegionInfo, Request, Response, RootInfo, TOKEN_LEN,
};
use crate::rpc::{RpcHost, Service, ServiceId};

/// Most named roots a node keeps.
pub const MAX_ROOTS: usize = 1024;

/// Configuration of a memory node.
#[derive(Debug, Clone)]
pub struct NodeConfig {
    /// Memory node id: the high 16 bits of every `GlobalAddr` into this node.
    pub node_id: u16,
    /// Remote address space in bytes (rounded up to whole pages).
    pub size: u64,
    /// Translation page size: 4 KiB or 2 MiB.
    pub page_size: u64,
    /// Extra memory pages kept for remapping.
    pub spare_pages: u64,
    /// Worker threads serving RPC channels ([`crate::rpc`]); 0: none, and
    /// at most [`crate::layout::MAX_WORKER_BELLS`]. They start with the
    /// first channel.
    pub rpc_workers: usize,
    /// Fault in a chunk's memory when it is allocated (default), as
    /// registering memory with an RNIC pins it: no verb then pays the
    /// kernel's first-touch page fault (zeroing, page-cache insertion) on
    /// the data path. Off: pages are faulted in by their first access, so a
    /// large chunk that is mostly unused costs no memory.
    pub prefault_chunks: bool,
}

/// Default [`NodeConfig::rpc_workers`]: two, so a node and a client fit a
/// 2-core machine (idle workers sleep; see [`crate::rpc`]).
pub const DEFAULT_RPC_WORKERS: usize = 2;

impl Default for NodeConfig {
    fn default() -> Self {
        Self {
            node_id: 0,
            size: 1 << 30,
            page_size: 4096,
            spare_pages: 64,
            rpc_workers: DEFAULT_RPC_WORKERS,
            prefault_chunks: true,
        }
    }
}

/// Identifier of a client session (one per connection or embedded client).
pub type SessionId = u64;

/// Who owns a chunk (the module's "Who owns memory").
#[derive(Debug, Clone, PartialEq, Eq)]
enum Owner {
    /// Freed when the session ends.
    Session(SessionId),
    /// Outlives the session that took it; only it (or an admin) frees it.
    Persistent(SessionId),
    /// Belongs to a chunk group; freed with the group's last reference.
    Group(String),
    /// The node's own range (a service's); no client frees it.
    Internal,
}

#[derive(Debug, Clone)]
struct ChunkRec {
    len: u64,
    owner: Owner,
}

/// A chunk group: a structure's memory on this node, held by sessions.
#[derive(Debug, Default)]
struct Group {
    /// References per session (a session may hold a group several times:
    /// one per open handle).
    holders: BTreeMap<SessionId, u32>,
    /// Start offsets of the group's chunks.
    chunks: BTreeSet<u64>,
    bytes: u64,
}

impl Group {
    fn refs(&self) -> u32 {
        self.holders.values().sum()
    }
}

/// A named root: its value and the group it is attached to (removed with
/// the group).
#[derive(Debug, Clone)]
struct Root {
    value: u64,
    group: Option<String>,
}

#[derive(Debug)]
struct Inner {
    alloc: ExtentAllocator,
    chunks: BTreeMap<u64, ChunkRec>,
    roots: BTreeMap<String, Root>,
    groups: BTreeMap<String, Group>,
    /// Groups an admin collected while these sessions held them
    /// ([`AdminOp::GcRoot`]): their requests on the name are refused.
    revoked: HashSet<(SessionId, String)>,
    /// Address ranges of groups an admin collected while sessions held
    /// them: unmapped, their memory discarded, and kept out of the
    /// allocator until the last of those sessions ends (see
    /// [`MemNode::gc_root`]).
    fenced: Vec<Fence>,
    sessions: HashSet<SessionId>,
    next_session: SessionId,
    spare_free: Vec<u64>,
    regions: [Option<RegionInfo>; MAX_REGIONS],
}

/// A collected group's address range that revoked holders may still
/// address with one-sided verbs: fenced until `holders` have all ended.
#[derive(Debug)]
struct Fence {
    offset: u64,
    len: u64,
    holders: HashSet<SessionId>,
}

#[derive(Debug, Default)]
struct Counters {
    rpcs: AtomicU64,
    rpc_errors: AtomicU64,
    bad_frames: AtomicU64,
    auth_failures: AtomicU64,
    refused_connections: AtomicU64,
    sessions_total: AtomicU64,
    sessions_reaped: AtomicU64,
    chunks_reclaimed: AtomicU64,
    pages_remapped: AtomicU64,
}

/// [`MemNode::translate`] without the node: it holds the control mapping
/// (the page table lives there), not the node.
#[derive(Debug, Clone)]
pub(crate) struct Translator {
    control: Arc<Mapping>,
    remote_pages: u64,
}

impl Translator {
    /// Memory page currently backing `remote_page`.
    #[inline]
    pub(crate) fn translate(&self, remote_page: u64) -> Option<u64> {
        if remote_page >= self.remote_pages {
            return None;
        }
        // SAFETY: remote_page < remote_pages and the page table occupies
        // PAGE_TABLE_OFFSET + 8·remote_pages ≤ control_len bytes of the
        // mapping `self.control` keeps alive; entries are atomics.
        let e = unsafe {
            &*(self.control.as_ptr().add(layout::PAGE_TABLE_OFFSET) as *const PageEntry)
                .add(remote_page as usize)
        };
        e.get()
    }
}

/// Called with `(first remote page, count)` after the node's translation
/// of those pages changed by [`MemNode::remap_pages`] or
/// [`MemNode::unmap_pages`] (see [`MemNode::set_retranslate_hook`]).
pub type RetranslateHook = Arc<dyn Fn(u64, u64) + Send + Sync>;

struct HookSlot(Mutex<Option<RetranslateHook>>);

impl std::fmt::Debug for HookSlot {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let set = self.0.lock().map(|h| h.is_some()).unwrap_or(true);
        write!(f, "RetranslateHook({})", if set { "set" } else { "none" })
    }
}

/// The file behind a file-backed node's memory ([`crate::file`]).
#[derive(Debug)]
struct Backing {
    /// The data file.
    path: PathBuf,
    /// Its metadata file.
    meta: PathBuf,
    /// The metadata last written (an unchanged state is not rewritten).
    written: Mutex<String>,
    /// Set by the shutdown: what sessions ending then free stays in the
    /// file, as if the node had been killed.
    frozen: AtomicBool,
}

/// A memory node. Shared as `Arc<MemNode>` between the RPC server threads
/// and, in embedded mode, the compute threads of the same process.
#[derive(Debug)]
pub struct MemNode {
    layout: NodeLayout,
    data_fd: OwnedFd,
    control_fd: OwnedFd,
    data: Arc<Mapping>,
    control: Arc<Mapping>,
    heap: RegionInfo,
    inner: Mutex<Inner>,
    counters: Counters,
    shutdown: AtomicBool,
    /// Memory is registered with a NIC (pinned): freed pages are zeroed in
    /// place instead of punched out of the memfd, which would leave the
    /// NIC's pinned pages detached from the file.
    pinned: AtomicBool,
    /// [`NodeConfig::prefault_chunks`].
    prefault_chunks: bool,
    /// Services and RPC workers.
    rpc: RpcHost,
    /// The CoRM store's accounting, if a store runs on this node.
    corm: Mutex<Option<std::sync::Weak<crate::corm::Accounting>>>,
    /// Told of every run of pages [`MemNode::remap_pages`] and
    /// [`MemNode::unmap_pages`] changed ([`MemNode::set_retranslate_hook`]).
    retranslate: HookSlot,
    /// The token admin requests must carry ([`MemNode::set_admin_token`]);
    /// none: admin requests are refused.
    admin_token: Mutex<Option<[u8; TOKEN_LEN]>>,
    /// The file the memory lives in, if not a memfd.
    backing: Option<Backing>,
}

impl MemNode {
    /// Creates the node's memory (a sealed memfd) and tables.
    pub fn new(cfg: NodeConfig) -> Result<Arc<Self>, NodeError> {
        Self::build(cfg, None)
    }

    /// A node whose memory is file `path` (made if absent or empty), so
    /// its chunk groups and roots survive the node's restart: see
    /// [`crate::file`] for what it promises. An existing file is served
    /// only with the geometry and node id it was made with.
    pub fn with_memory_file(cfg: NodeConfig, path: &Path) -> Result<Arc<Self>, NodeError> {
        Self::build(cfg, Some(path))
    }

    fn build(cfg: NodeConfig, path: Option<&Path>) -> Result<Arc<Self>, NodeError> {
        let page_shift = match cfg.page_size {
            4096 => 12u8,
            0x20_0000 => 21u8,
            other => {
                return Err(NodeError::Config(format!(
                    "page size {other} B is not supported (4 KiB or 2 MiB)"
                )))
            }
        };
        let remote_pages = cfg.size.div_ceil(cfg.page_size);
        if remote_pages < 2 {
            return Err(NodeError::Config(format!(
                "node size {} B is too small: need at least two {} B pages",
                cfg.size, cfg.page_size
            )));
        }
        if remote_pages << page_shift >= 1 << 48 {
            return Err(NodeError::Config(
                "node size exceeds the 48-bit offset space".into(),
            ));
        }
        if cfg.rpc_workers > crate::layout::MAX_WORKER_BELLS {
            return Err(NodeError::Config(format!(
                "{} RPC workers: at most {}",
                cfg.rpc_workers,
                crate::layout::MAX_WORKER_BELLS
            )));
        }
        let phys_pages = remote_pages + cfg.spare_pages;
        if phys_pages > layout::PAGE_INDEX_MASK {
            return Err(NodeError::Config("too many memory pages".into()));
        }
        let control_len = layout::control_len(remote_pages);
        let layout = NodeLayout {
            node_id: cfg.node_id,
            page_shift,
            remote_pages,
            phys_pages,
            control_len: control_len as u64,
        };
        let geometry = [
            cfg.node_id as u64,
            page_shift as u64,
            remote_pages,
            phys_pages,
        ];
        let (data_fd, meta) = match path {
            None => {
                let name = CString::new(format!("dmkit-node{}-data", cfg.node_id)).expect("no NUL");
                (
                    create_sealed_memfd(&name, layout.data_len() as usize)?,
                    None,
                )
            }
            Some(p) => {
                let opened = file::open_data_file(p, layout.data_len())?;
                if let Some(m) = opened.meta.as_ref().filter(|m| m.geometry != geometry) {
                    return Err(NodeError::Config(format!(
                        "--memory-file {}: made for node id, page shift, remote and memory pages \
                         {:?}; this node has {geometry:?}",
                        p.display(),
                        m.geometry
                    )));
                }
                (OwnedFd::from(opened.file), opened.meta)
            }
        };
        let name = CString::new(format!("dmkit-node{}-control", cfg.node_id)).expect("no NUL");
        let control_fd = create_sealed_memfd(&name, control_len)?;
        let data = Arc::new(Mapping::map(
            data_fd.as_fd(),
            layout.data_len() as usize,
            true,
        )?);
        let control = Arc::new(Mapping::map(control_fd.as_fd(), control_len, true)?);

        let heap_base = layout.page_size();
        let mut node = MemNode {
            layout,
            data_fd,
            control_fd,
            data,
            control,
            heap: RegionInfo {
                rkey: 0,
                base: heap_base,
                len: layout.remote_len() - heap_base,
                access: layout::access::ALL,
            },
            inner: Mutex::new(Inner {
                alloc: ExtentAllocator::new(heap_base, layout.remote_len(), layout.page_size()),
                chunks: BTreeMap::new(),
                roots: BTreeMap::new(),
                groups: BTreeMap::new(),
                revoked: HashSet::new(),
                fenced: Vec::new(),
                sessions: HashSet::new(),
                next_session: 1,
                spare_free: (remote_pages..phys_pages).rev().collect(),
                regions: [None; MAX_REGIONS],
            }),
            counters: Counters::default(),
            shutdown: AtomicBool::new(false),
            pinned: AtomicBool::new(false),
            prefault_chunks: cfg.prefault_chunks,
            rpc: RpcHost::new(cfg.rpc_workers),
            corm: Mutex::new(None),
            retranslate: HookSlot(Mutex::new(None)),
            admin_token: Mutex::new(None),
            backing: path.map(|p| Backing {
                path: p.to_owned(),
                meta: file::meta_path(p),
                written: Mutex::new(String::new()),
                frozen: AtomicBool::new(false),
            }),
        };
        node.init_control();
        node.heap = node.register_region(heap_base, node.heap.len, layout::access::ALL)?;
        if let Some(m) = meta {
            node.restore(&m).map_err(|e| {
                NodeError::Config(format!(
                    "--memory-file {}: its metadata does not fit the node: {e}",
                    path.expect("a file-backed node").display()
                ))
            })?;
        }
        node.persist().map_err(|e| {
            NodeError::Config(format!("--memory-file: cannot write its metadata: {e}"))
        })?;
        Ok(Arc::new(node))
    }

    /// Re-takes what a file-backed node's metadata lists: its chunks (the
    /// groups' unheld), its roots; then zeroes every page no chunk holds,
    /// as a chunk starts zeroed.
    fn restore(&self, m: &Meta) -> Result<(), String> {
        let mut inner = self.lock();
        for (off, len, group) in &m.chunks {
            if !inner.alloc.take(*off, *len) {
                return Err(format!(
                    "chunk {off:#x}+{len:#x} overlaps another or leaves the heap"
                ));
            }
            let owner = match group {
                Some(g) => {
                    check_root_name(g).map_err(|e| e.to_string())?;
                    let gr = inner.groups.entry(g.clone()).or_default();
                    gr.chunks.insert(*off);
                    gr.bytes += len;
                    Owner::Group(g.clone())
                }
                // Session 0 is never opened: only an admin frees it.
                None => Owner::Persistent(0),
            };
            inner.chunks.insert(*off, ChunkRec { len: *len, owner });
        }
        for (name, value, group) in &m.roots {
            check_root_name(name).map_err(|e| e.to_string())?;
            if inner.roots.len() >= MAX_ROOTS || *value == 0 {
                return Err(format!("root {name:?}: too many roots, or value 0"));
            }
            let group = group.clone();
            inner.roots.insert(
                name.clone(),
                Root {
                    value: *value,
                    group,
                },
            );
        }
        for (off, len) in inner.alloc.free_ranges() {
            self.release_pages(off, len);
        }
        Ok(())
    }

    /// The metadata of a file-backed node's present state.
    fn meta(&self, inner: &Inner) -> Meta {
        let l = self.layout;
        Meta {
            geometry: [
                l.node_id as u64,
                l.page_shift as u64,
                l.remote_pages,
                l.phys_pages,
            ],
            chunks: inner
                .chunks
                .iter()
                .filter_map(|(&off, c)| match &c.owner {
                    Owner::Group(g) => Some((off, c.len, Some(g.clone()))),
                    Owner::Persistent(_) => Some((off, c.len, None)),
                    Owner::Session(_) | Owner::Internal => None,
                })
                .collect(),
            roots: inner
                .roots
                .iter()
                .map(|(n, r)| (n.clone(), r.value, r.group.clone()))
                .collect(),
        }
    }

    /// Writes a file-backed node's metadata if its state changed since the
    /// last write (under the node's lock, so the last write is the latest
    /// state). After the shutdown a changed state is refused instead.
    fn persist(&self) -> Result<(), RpcError> {
        let Some(b) = &self.backing else {
            return Ok(());
        };
        let inner = self.lock();
        let text = self.meta(&inner).encode();
        let mut last = b.written.lock().unwrap_or_else(|p| p.into_inner());
        if *last == text {
            return Ok(());
        }
        if b.frozen.load(Ordering::Acquire) {
            return Err(RpcError::ShuttingDown);
        }
        file::write_atomically(&b.meta, &text, false)
            .map_err(|e| RpcError::Io(format!("writing {}: {e}", b.meta.display())))?;
        *last = text;
        Ok(())
    }

    /// The file the node's memory lives in (`None`: a memfd).
    pub fn memory_file(&self) -> Option<&Path> {
        self.backing.as_ref().map(|b| b.path.as_path())
    }

    /// [`RpcError::Unsupported`] on a file-backed node: a remote page is
    /// only ever its own memory page, or unmapped (the page table is not
    /// part of the file, so a page moved elsewhere would come back to the
    /// wrong bytes after a restart). Unmapping and restoring the identity
    /// (`gc_root`'s fences) stay allowed.
    fn check_remappable(&self) -> Result<(), RpcError> {
        match &self.backing {
            None => Ok(()),
            Some(_) => Err(RpcError::Unsupported(
                "remapping pages of a file-backed node (its page table is not in the file)".into(),
            )),
        }
    }

    fn init_control(&mut self) {
        let l = self.layout;
        // SAFETY: the control mapping is at least PAGE_TABLE_OFFSET + 8·remote_pages
        // bytes (control_len), page aligned, and freshly created: nobody else maps it
        // yet, so plain writes to the header are unobserved until clients connect.
        unsafe {
            let h = self.control.as_ptr() as *mut ControlHeader;
            (*h).magic = layout::CONTROL_MAGIC;
            (*h).version = layout::LAYOUT_VERSION;
            (*h).node_id = l.node_id as u64;
            (*h).page_shift = l.page_shift as u64;
            (*h).remote_pages = l.remote_pages;
            (*h).phys_pages = l.phys_pages;
        }
        for p in 0..l.remote_pages {
            self.page_entry(p)
                .0
                .store(PAGE_VALID | p, Ordering::Release);
        }
    }

    fn header(&self) -> &ControlHeader {
        // SAFETY: the control mapping starts with a ControlHeader (init_control)
        // and lives as long as self; the header's mutable field is atomic.
        unsafe { &*(self.control.as_ptr() as *const ControlHeader) }
    }

    fn region_entry(&self, slot: usize) -> &RegionEntry {
        assert!(slot < MAX_REGIONS);
        // SAFETY: slot < MAX_REGIONS and the region table lies inside the control
        // mapping (compile-time assertion in layout.rs); entries are atomics.
        unsafe {
            &*(self.control.as_ptr().add(layout::REGION_TABLE_OFFSET) as *const RegionEntry)
                .add(slot)
        }
    }

    fn page_entry(&self, remote_page: u64) -> &PageEntry {
        assert!(remote_page < self.layout.remote_pages);
        // SAFETY: remote_page < remote_pages and the page table occupies
        // PAGE_TABLE_OFFSET + 8·remote_pages ≤ control_len bytes; entries are atomics.
        unsafe {
            &*(self.control.as_ptr().add(layout::PAGE_TABLE_OFFSET) as *const PageEntry)
                .add(remote_page as usize)
        }
    }

    fn lock(&self) -> MutexGuard<'_, Inner> {
        // A panic while holding the lock would be a node bug; the state is still
        // structurally valid, so keep serving rather than cascade the panic.
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The node's geometry.
    pub fn layout(&self) -> NodeLayout {
        self.layout
    }

    /// The region that covers all allocatable memory.
    pub fn heap_region(&self) -> RegionInfo {
        self.heap
    }

    /// The data memfd (sent to clients).
    pub fn data_fd(&self) -> BorrowedFd<'_> {
        self.data_fd.as_fd()
    }

    /// The control memfd (clients receive a read-only reopen of it).
    pub fn control_fd(&self) -> BorrowedFd<'_> {
        self.control_fd.as_fd()
    }

    /// The node's own mapping of the data memfd (embedded clients share it).
    pub fn data_mapping(&self) -> Arc<Mapping> {
        self.data.clone()
    }

    /// The node's own mapping of the control memfd (embedded clients share it).
    pub fn control_mapping(&self) -> Arc<Mapping> {
        self.control.clone()
    }

    /// The node's page translation as a handle that does not keep the node
    /// alive (services the node holds, such as the CoRM store, translate
    /// through it without a reference cycle).
    pub(crate) fn translator(&self) -> Translator {
        Translator {
            control: self.control.clone(),
            remote_pages: self.layout.remote_pages,
        }
    }

    /// Registers `[base, base+len)` of the remote space with `access` rights
    /// and returns it with a fresh random key.
    pub fn register_region(
        &self,
        base: u64,
        len: u64,
        access: u64,
    ) -> Result<RegionInfo, RpcError> {
        let ps = self.layout.page_size();
        let end = base.checked_add(len);
        if len == 0 || !base.is_multiple_of(ps) || end.is_none_or(|e| e > self.layout.remote_len())
        {
            return Err(RpcError::BadRegion { base, len });
        }
        let mut inner = self.lock();
        let slot = inner
            .regions
            .iter()
            .position(Option::is_none)
            .ok_or(RpcError::RegionTableFull(MAX_REGIONS))?;
        let mut rnd = [0u8; 4];
        fill_random(&mut rnd);
        let rkey = (u32::from_le_bytes(rnd) & 0xFFFF_FF00) | slot as u32;
        let info = RegionInfo {
            rkey,
            base,
            len,
            access: access & layout::access::ALL,
        };
        let e = self.region_entry(slot);
        e.key_word.store(0, Ordering::Release);
        e.base.store(base, Ordering::Release);
        e.len.store(len, Ordering::Release);
        e.key_word
            .store(RegionEntry::pack(rkey, info.access), Ordering::Release);
        self.header().generation.fetch_add(1, Ordering::AcqRel);
        inner.regions[slot] = Some(info);
        Ok(info)
    }

    /// Invalidates a region: every later request carrying its key fails.
    pub fn deregister_region(&self, rkey: u32) -> Result<(), RpcError> {
        let mut inner = self.lock();
        let slot = (rkey & 0xFF) as usize;
        match inner.regions.get(slot).copied().flatten() {
            Some(r) if r.rkey == rkey => {
                self.region_entry(slot).key_word.store(0, Ordering::Release);
                self.header().generation.fetch_add(1, Ordering::AcqRel);
                inner.regions[slot] = None;
                Ok(())
            }
            _ => Err(RpcError::NoSuchRegion(rkey)),
        }
    }

    /// Moves remote page `remote_page` to a spare memory page: copies its
    /// words, publishes the new translation, and recycles the old memory page.
    /// Returns the new memory page index.
    ///
    /// Like a NIC re-registration, this does not stop concurrent one-sided
    /// writers: a WRITE that lands on the old page during the copy is lost.
    /// Callers (CoRM compaction) must quiesce or version the page first.
    pub fn migrate_page(&self, remote_page: u64) -> Result<u64, RpcError> {
        self.check_remappable()?;
        if remote_page >= self.layout.remote_pages {
            return Err(RpcError::BadPage(remote_page));
        }
        let mut inner = self.lock();
        // Pages of an internal range (the CoRM store) move only by their
        // owner's remapping: their memory pages are not spare pages.
        let offset = remote_page << self.layout.page_shift;
        let internal = inner
            .chunks
            .range(..=offset)
            .next_back()
            .is_some_and(|(&o, c)| c.owner == Owner::Internal && offset < o + c.len);
        let entry = self.page_entry(remote_page);
        let Some(old) = entry.get().filter(|_| !internal) else {
            return Err(RpcError::BadPage(remote_page));
        };
        let new = inner.spare_free.pop().ok_or(RpcError::NoSparePage)?;
        let ps = self.layout.page_size() as usize;
        let words = ps / 8;
        // SAFETY: old and new are memory page indices < phys_pages, so both page
        // ranges lie inside the data mapping; we access them only through
        // AtomicU64 (aligned: pages are page aligned within a page-aligned mapping),
        // which is sound even while clients access the same memory.
        unsafe {
            let src = self.data.as_ptr().add(old as usize * ps) as *const AtomicU64;
            let dst = self.data.as_ptr().add(new as usize * ps) as *const AtomicU64;
            for i in 0..words {
                (*dst.add(i)).store((*src.add(i)).load(Ordering::Acquire), Ordering::Release);
            }
        }
        entry.0.store(PAGE_VALID | new, Ordering::Release);
        self.header().generation.fetch_add(1, Ordering::AcqRel);
        inner.spare_free.insert(0, old);
        self.counters.pages_remapped.fetch_add(1, Ordering::Relaxed);
        Ok(new)
    }

    /// Returns the memory behind `[offset, offset+len)` of the remote space to
    /// the OS by punching holes in the data memfd (every mapping then reads
    /// zeros there), so a chunk always starts zeroed and freed memory is not
    /// kept resident. Runs of contiguous memory pages share one syscall.
    fn release_pages(&self, offset: u64, len: u64) {
        let shift = self.layout.page_shift;
        let first = offset >> shift;
        let end = (offset + len) >> shift;
        let mut run: Option<(u64, u64)> = None; // (first memory page, count)
        for page in first..end {
            // Every page of a chunk is mapped; a page some internal user
            // (the CoRM store) left unmapped has no memory to release.
            let Some(phys) = self.page_entry(page).get() else {
                continue;
            };
            run = match run {
                Some((p, n)) if p + n == phys => Some((p, n + 1)),
                Some((p, n)) => {
                    self.discard_run(p, n);
                    Some((phys, 1))
                }
                None => Some((phys, 1)),
            };
        }
        if let Some((p, n)) = run {
            self.discard_run(p, n);
        }
    }

    /// Returns memory pages `[first, first+count)` to the OS (hole punch),
    /// or zeroes them in place when the memory is pinned by a NIC.
    fn discard_run(&self, first: u64, count: u64) {
        if self.pinned.load(Ordering::Acquire) {
            self.zero_pages(first, count);
            return;
        }
        let shift = self.layout.page_shift;
        // Failure (e.g. an old kernel without hole punching on memfds) only
        // costs residency and zeroing; fall back to zeroing by hand.
        let r = nix::fcntl::fallocate(
            self.data_fd.as_raw_fd(),
            nix::fcntl::FallocateFlags::FALLOC_FL_PUNCH_HOLE
                | nix::fcntl::FallocateFlags::FALLOC_FL_KEEP_SIZE,
            (first << shift) as i64,
            (count << shift) as i64,
        );
        if r.is_err() {
            self.zero_pages(first, count);
        }
    }

    fn zero_pages(&self, first: u64, count: u64) {
        let words = ((count << self.layout.page_shift) / 8) as usize;
        // SAFETY: pages [first, first+count) are < phys_pages, inside the data
        // mapping, 8-byte aligned; written through atomics only.
        unsafe {
            let p = self
                .data
                .as_ptr()
                .add((first << self.layout.page_shift) as usize)
                as *const AtomicU64;
            for i in 0..words {
                (*p.add(i)).store(0, Ordering::Release);
            }
        }
    }

    /// Declares the node's memory registered with a NIC: from now on freed
    /// memory is zeroed in place, never returned to the OS. A registration
    /// pins the pages it covers; punching a hole would give the file fresh
    /// pages while the NIC keeps reading and writing the pinned old ones.
    pub fn pin_memory(&self) {
        self.pinned.store(true, Ordering::Release);
    }

    /// Memory page currently backing `remote_page`.
    pub fn translate(&self, remote_page: u64) -> Option<u64> {
        (remote_page < self.layout.remote_pages)
            .then(|| self.page_entry(remote_page).get())
            .flatten()
    }

    /// Registers `service` under `id` (any time; workers pick it up on
    /// their next call). `false` if the id is taken ([`crate::rpc::ECHO`]
    /// is, from the start).
    pub fn register_service<S: Service>(&self, id: ServiceId, service: S) -> bool {
        self.rpc.register(id, service)
    }

    /// The registered services, by id.
    pub fn services(&self) -> Vec<(ServiceId, &'static str)> {
        self.rpc.services()
    }

    /// How many RPC worker threads the node runs (0: no RPC channel).
    pub fn rpc_workers(&self) -> usize {
        self.rpc.workers()
    }

    pub(crate) fn rpc_host(&self) -> &RpcHost {
        &self.rpc
    }

    /// Opens an RPC channel for `session`: a memfd with a request ring and
    /// a reply ring of `slots` slots of `max_message` bytes, served by one
    /// of the node's worker threads ([`crate::rpc::ring`]). The first
    /// channel starts the workers.
    pub fn open_rpc_channel(
        self: &Arc<Self>,
        session: SessionId,
        slots: u32,
        max_message: u32,
    ) -> Result<crate::rpc::RpcChannelGrant, RpcError> {
        self.rpc.pool.open(self, session, slots, max_message)
    }

    /// Hands a channel of another transport (the verbs backend's queue
    /// pairs) to the node's workers: `make(channel id, worker)` builds it
    /// once the worker is chosen (a transport that polls a completion
    /// queue makes it the worker's). The channel belongs to `session` and
    /// carries messages of at most `max_message` bytes. Returns the
    /// channel's id and its worker.
    pub fn attach_rpc_channel(
        self: &Arc<Self>,
        session: SessionId,
        max_message: usize,
        make: impl FnOnce(
            u64,
            crate::rpc::WorkerId,
        ) -> Result<Box<dyn crate::rpc::NodeChannel>, RpcError>,
    ) -> Result<(u64, crate::rpc::WorkerId), RpcError> {
        self.rpc.pool.attach(self, session, max_message, make)
    }

    /// Reserves `len` bytes (rounded up to whole pages) of the remote space
    /// for a service inside the node (the CoRM store, [`crate::corm`]):
    /// a chunk no client session owns, so no client can free it
    /// ([`RpcError::NotOwner`]); [`MemNode::release_internal`] returns it.
    pub fn reserve_internal(&self, len: u64) -> Result<(u64, u64), RpcError> {
        if len == 0 || len > self.heap.len {
            return Err(RpcError::BadLength(len));
        }
        let mut inner = self.lock();
        let Some((offset, len)) = inner.alloc.alloc(len) else {
            return Err(RpcError::OutOfMemory {
                requested: len,
                largest_free: inner.alloc.largest_free(),
            });
        };
        let owner = Owner::Internal;
        inner.chunks.insert(offset, ChunkRec { len, owner });
        Ok((offset, len))
    }

    /// Frees a range [`MemNode::reserve_internal`] returned. The caller
    /// restores the identity translation of its pages first
    /// ([`MemNode::remap_pages`]), as every chunk starts with it.
    pub fn release_internal(&self, offset: u64) -> Result<u64, RpcError> {
        let mut inner = self.lock();
        match inner.chunks.get(&offset) {
            None => Err(RpcError::NotAllocated { offset }),
            Some(c) if c.owner != Owner::Internal => Err(RpcError::NotOwner { offset }),
            Some(_) => Ok(self.free_locked(&mut inner, offset)),
        }
    }

    /// Points remote pages `[remote_first, +count)` at memory pages
    /// `[data_first, +count)`. Several remote pages may share one memory
    /// page (CoRM §3.1.2: after compaction the source block's addresses
    /// reach the destination block's memory). Each entry changes with one
    /// atomic store, in ascending page order; a reader translates each page
    /// when it touches it, so it sees every page either before or after
    /// its change (what readers do mid-remap is the caller's protocol:
    /// `corm::compact` locks the objects first).
    pub fn remap_pages(
        &self,
        remote_first: u64,
        data_first: u64,
        count: u64,
    ) -> Result<(), RpcError> {
        if data_first != remote_first {
            self.check_remappable()?;
        }
        let l = self.layout;
        if remote_first
            .checked_add(count)
            .is_none_or(|e| e > l.remote_pages)
        {
            return Err(RpcError::BadPage(remote_first));
        }
        if data_first
            .checked_add(count)
            .is_none_or(|e| e > l.phys_pages)
        {
            return Err(RpcError::BadPage(data_first));
        }
        for i in 0..count {
            self.page_entry(remote_first + i)
                .0
                .store(PAGE_VALID | (data_first + i), Ordering::Release);
        }
        self.header().generation.fetch_add(1, Ordering::AcqRel);
        self.counters
            .pages_remapped
            .fetch_add(count, Ordering::Relaxed);
        self.retranslated(remote_first, count);
        Ok(())
    }

    /// Invalidates the translation of remote pages `[remote_first, +count)`:
    /// a verb touching them fails with "page not mapped" (the shm analogue
    /// of an RNIC translation fault). CoRM uses it for released addresses.
    pub fn unmap_pages(&self, remote_first: u64, count: u64) -> Result<(), RpcError> {
        if remote_first
            .checked_add(count)
            .is_none_or(|e| e > self.layout.remote_pages)
        {
            return Err(RpcError::BadPage(remote_first));
        }
        for i in 0..count {
            self.page_entry(remote_first + i)
                .0
                .store(0, Ordering::Release);
        }
        self.header().generation.fetch_add(1, Ordering::AcqRel);
        self.retranslated(remote_first, count);
        Ok(())
    }

    /// Installs (or with `None` removes) the hook told of every change
    /// [`MemNode::remap_pages`] and [`MemNode::unmap_pages`] make, on the
    /// changing thread, after the table changed and before the call
    /// returns. A server whose NIC reads the node's memory through its own
    /// mapping (verbs) remaps it and re-registers there, so a caller's
    /// protocol (CoRM: objects locked while their block moves) covers the
    /// NIC too. The hook must not call back into remapping.
    pub fn set_retranslate_hook(&self, hook: Option<RetranslateHook>) {
        *self.retranslate.0.lock().unwrap_or_else(|p| p.into_inner()) = hook;
    }

    fn retranslated(&self, first: u64, count: u64) {
        let hook = self
            .retranslate
            .0
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone();
        if let Some(h) = hook {
            h(first, count);
        }
    }

    /// Returns memory pages `[data_first, +count)` to the OS (hole punch;
    /// zeroed in place when pinned): every mapping reads zeros there and
    /// they stop being resident. The caller guarantees no remote page it
    /// still hands out maps them.
    pub fn discard_data_pages(&self, data_first: u64, count: u64) -> Result<(), RpcError> {
        if data_first
            .checked_add(count)
            .is_none_or(|e| e > self.layout.phys_pages)
        {
            return Err(RpcError::BadPage(data_first));
        }
        self.discard_run(data_first, count);
        Ok(())
    }

    /// Attaches the accounting of the node's CoRM store, reported in
    /// [`NodeStats::corm`]. One store per node: a second attach is refused.
    pub fn attach_corm(&self, acct: Arc<crate::corm::Accounting>) -> Result<(), RpcError> {
        let mut slot = self.corm.lock().unwrap_or_else(|p| p.into_inner());
        match &*slot {
            Some(a) if a.strong_count() > 0 => Err(RpcError::BadFrame(
                "a CoRM store is already attached to this node".into(),
            )),
            _ => {
                *slot = Some(Arc::downgrade(&acct));
                Ok(())
            }
        }
    }

    /// Starts a client session.
    pub fn open_session(&self) -> SessionId {
        let mut inner = self.lock();
        let id = inner.next_session;
        inner.next_session += 1;
        inner.sessions.insert(id);
        self.counters.sessions_total.fetch_add(1, Ordering::Relaxed);
        id
    }

    /// Ends a session (clean close or detected death): frees its session
    /// chunks and drops its references on chunk groups, freeing the groups
    /// it held last (and their roots). Returns the bytes reclaimed.
    pub fn close_session(&self, session: SessionId) -> u64 {
        let mut inner = self.lock();
        if !inner.sessions.remove(&session) {
            return 0;
        }
        inner.revoked.retain(|(s, _)| *s != session);
        self.unfence(&mut inner, session);
        let owned: Vec<u64> = inner
            .chunks
            .iter()
            .filter(|(_, c)| c.owner == Owner::Session(session))
            .map(|(&o, _)| o)
            .collect();
        let mut bytes = 0;
        for off in owned {
            bytes += self.free_locked(&mut inner, off);
            self.counters
                .chunks_reclaimed
                .fetch_add(1, Ordering::Relaxed);
        }
        let held: Vec<String> = inner
            .groups
            .iter()
            .filter(|(_, g)| g.holders.contains_key(&session))
            .map(|(n, _)| n.clone())
            .collect();
        for name in held {
            let g = inner.groups.get_mut(&name).expect("listed above");
            g.holders.remove(&session);
            // A file-backed node keeps what a dead client held (a
            // persistent-memory structure outlives its clients): only an
            // explicit last release or an admin frees it.
            if g.holders.is_empty() && self.backing.is_none() {
                let (n, b) = self.free_group(&mut inner, &name);
                self.counters
                    .chunks_reclaimed
                    .fetch_add(n, Ordering::Relaxed);
                bytes += b;
            }
        }
        self.counters
            .sessions_reaped
            .fetch_add(1, Ordering::Relaxed);
        drop(inner);
        // A failed write is healed by the next one (each writes the whole
        // state); nobody waits for this one's answer.
        let _ = self.persist();
        // Its RPC channels go too, and services hear of it.
        self.rpc.pool.session_closed(session);
        bytes
    }

    /// Frees chunk `offset` (which must be allocated) whoever owns it and
    /// takes it out of its group. Returns its length.
    fn free_locked(&self, inner: &mut Inner, offset: u64) -> u64 {
        let rec = inner.chunks.remove(&offset).expect("chunk is allocated");
        if let Owner::Group(name) = &rec.owner {
            if let Some(g) = inner.groups.get_mut(name) {
                g.chunks.remove(&offset);
                g.bytes -= rec.len;
            }
        }
        self.release_pages(offset, rec.len);
        inner.alloc.free(offset, rec.len);
        rec.len
    }

    /// Frees group `name`'s chunks, removes the roots attached to it and
    /// the group. Returns (chunks, bytes) freed.
    fn free_group(&self, inner: &mut Inner, name: &str) -> (u64, u64) {
        let Some(g) = inner.groups.remove(name) else {
            return (0, 0);
        };
        debug_assert!(g.holders.is_empty(), "a held group is not freed");
        let (mut n, mut bytes) = (0, 0);
        for off in g.chunks {
            let rec = inner
                .chunks
                .remove(&off)
                .expect("a group's chunk is allocated");
            debug_assert_eq!(rec.owner, Owner::Group(name.into()));
            self.release_pages(off, rec.len);
            inner.alloc.free(off, rec.len);
            n += 1;
            bytes += rec.len;
        }
        inner.roots.retain(|_, r| r.group.as_deref() != Some(name));
        (n, bytes)
    }

    /// Sets the token admin requests must carry (the server's, written to
    /// its token file).
    pub fn set_admin_token(&self, token: [u8; TOKEN_LEN]) {
        *self.admin_token.lock().unwrap_or_else(|p| p.into_inner()) = Some(token);
    }

    /// Frees what dead sessions left: persistent chunks whose session has
    /// ended and groups nobody holds. Returns (chunks, bytes) freed.
    pub fn gc(&self) -> (u64, u64) {
        let mut inner = self.lock();
        let orphans: Vec<u64> = inner
            .chunks
            .iter()
            .filter(
                |(_, c)| matches!(c.owner, Owner::Persistent(s) if !inner.sessions.contains(&s)),
            )
            .map(|(&o, _)| o)
            .collect();
        let (mut n, mut bytes) = (0, 0);
        for off in orphans {
            bytes += self.free_locked(&mut inner, off);
            n += 1;
        }
        let unheld: Vec<String> = inner
            .groups
            .iter()
            .filter(|(_, g)| g.holders.is_empty())
            .map(|(k, _)| k.clone())
            .collect();
        for name in unheld {
            let (c, b) = self.free_group(&mut inner, &name);
            n += c;
            bytes += b;
        }
        self.counters
            .chunks_reclaimed
            .fetch_add(n, Ordering::Relaxed);
        drop(inner);
        let _ = self.persist();
        (n, bytes)
    }

    /// Collects root `name` and its chunk group now, held or not
    /// ([`AdminOp::GcRoot`]): frees the group's chunks, removes the root
    /// (and any root attached to the group), and remembers the holders, whose
    /// later requests on the name get [`RpcError::Revoked`]. Returns
    /// (chunks, bytes) freed.
    ///
    /// **Fencing.** A holder still running may go on with one-sided verbs
    /// on the group's addresses, which no control request sees. So a held
    /// group's memory is discarded at once (the bytes count as freed) but
    /// its address range is *fenced*: its pages are unmapped in the
    /// translation table and the range stays out of the allocator until
    /// every revoked holder's session has ended. On shm a fenced address
    /// fails the holder's verb with "page not mapped" (a typed error, as
    /// an RNIC's translation fault); through the verbs server's view (the
    /// retranslate hook) an unmapped page shows its own discarded memory
    /// page, so a holder's WRITEs land there and its READs see zeros or
    /// its own stray writes — not a typed error (an RNIC would need a
    /// memory window or registration per group to refuse them, which the
    /// node does not make), but never another client's memory, as the
    /// range is handed out again only once its holders are gone (zeroed
    /// again first). A holder that closes its session and keeps using the
    /// addresses is beyond any fence a session can give.
    pub fn gc_root(&self, name: &str) -> Result<(u64, u64), RpcError> {
        check_root_name(name)?;
        let mut inner = self.lock();
        if !inner.roots.contains_key(name) && !inner.groups.contains_key(name) {
            return Err(RpcError::NoSuchRoot(name.into()));
        }
        let holders: Vec<SessionId> = inner
            .groups
            .get_mut(name)
            .map(|g| std::mem::take(&mut g.holders).into_keys().collect())
            .unwrap_or_default();
        for s in &holders {
            inner.revoked.insert((*s, name.to_owned()));
        }
        let (n, bytes) = if holders.is_empty() {
            self.free_group(&mut inner, name)
        } else {
            self.fence_group(&mut inner, name, holders.into_iter().collect())
        };
        inner.roots.remove(name);
        self.counters
            .chunks_reclaimed
            .fetch_add(n, Ordering::Relaxed);
        drop(inner);
        self.persist()?;
        Ok((n, bytes))
    }

    /// Like [`Self::free_group`], for a group `holders` still hold: each
    /// chunk's memory is discarded and its pages unmapped, and its range
    /// fenced until the holders' sessions end ([`Self::unfence`]).
    fn fence_group(
        &self,
        inner: &mut Inner,
        name: &str,
        holders: HashSet<SessionId>,
    ) -> (u64, u64) {
        let Some(g) = inner.groups.remove(name) else {
            return (0, 0);
        };
        let shift = self.layout.page_shift;
        let (mut n, mut bytes) = (0, 0);
        for off in g.chunks {
            let rec = inner
                .chunks
                .remove(&off)
                .expect("a group's chunk is allocated");
            debug_assert_eq!(rec.owner, Owner::Group(name.into()));
            debug_assert!(
                off.is_multiple_of(self.layout.page_size())
                    && rec.len.is_multiple_of(self.layout.page_size())
            );
            self.release_pages(off, rec.len);
            self.unmap_pages(off >> shift, rec.len >> shift)
                .expect("an allocated chunk lies in the page table");
            inner.fenced.push(Fence {
                offset: off,
                len: rec.len,
                holders: holders.clone(),
            });
            n += 1;
            bytes += rec.len;
        }
        inner.roots.retain(|_, r| r.group.as_deref() != Some(name));
        (n, bytes)
    }

    /// Session `session` ended: ranges fenced for it alone get their
    /// identity translation back, are zeroed (a revoked holder may have
    /// written there) and return to the allocator.
    fn unfence(&self, inner: &mut Inner, session: SessionId) {
        let shift = self.layout.page_shift;
        let mut i = 0;
        while i < inner.fenced.len() {
            let f = &mut inner.fenced[i];
            f.holders.remove(&session);
            if !f.holders.is_empty() {
                i += 1;
                continue;
            }
            let f = inner.fenced.swap_remove(i);
            let (first, count) = (f.offset >> shift, f.len >> shift);
            self.remap_pages(first, first, count)
                .expect("a fenced range lies in the page table");
            self.release_pages(f.offset, f.len);
            inner.alloc.free(f.offset, f.len);
        }
    }

    /// Bytes of address space fenced after [`Self::gc_root`] (held by
    /// revoked sessions still open).
    pub fn fenced_bytes(&self) -> u64 {
        self.lock().fenced.iter().map(|f| f.len).sum()
    }

    /// [`RpcError::Revoked`] if an admin collected group `name` while
    /// `session` held it.
    fn check_revoked(&self, session: SessionId, name: &str) -> Result<(), RpcError> {
        if self.lock().revoked.contains(&(session, name.to_owned())) {
            return Err(RpcError::Revoked(name.into()));
        }
        Ok(())
    }

    /// The roots and chunk groups, by name.
    pub fn list_roots(&self) -> Vec<RootInfo> {
        let inner = self.lock();
        let names: BTreeSet<&String> = inner.roots.keys().chain(inner.groups.keys()).collect();
        names
            .into_iter()
            .map(|name| {
                let root = inner.roots.get(name);
                let g = inner.groups.get(name);
                RootInfo {
                    name: name.clone(),
                    value: root.map(|r| r.value),
                    group: root.and_then(|r| r.group.clone()),
                    holders: g.map_or_else(Vec::new, |g| {
                        g.holders.iter().map(|(&s, &n)| (s, n)).collect()
                    }),
                    refs: g.map_or(0, Group::refs),
                    chunks: g.map_or(0, |g| g.chunks.len() as u64),
                    bytes: g.map_or(0, |g| g.bytes),
                }
            })
            .collect()
    }

    /// Records a frame that could not be decoded or authenticated.
    pub fn note_bad_frame(&self) {
        self.counters.bad_frames.fetch_add(1, Ordering::Relaxed);
    }

    /// Records a connection refused for lack of resources (no thread).
    pub fn note_refused_connection(&self) {
        self.counters
            .refused_connections
            .fetch_add(1, Ordering::Relaxed);
    }

    /// Records a failed authentication.
    pub fn note_auth_failure(&self) {
        self.counters.auth_failures.fetch_add(1, Ordering::Relaxed);
    }

    /// Whether a shutdown was requested.
    pub fn is_shutting_down(&self) -> bool {
        self.shutdown.load(Ordering::Acquire)
    }

    /// Requests shutdown (the server stops accepting and returns) and marks
    /// the node closed in the control header, so clients' verbs fail.
    pub fn request_shutdown(&self) {
        if let Some(b) = &self.backing {
            // Freeze the metadata first (sessions ending now keep what they
            // held in the file), then write the data and metadata back.
            let inner = self.lock();
            if !b.frozen.swap(true, Ordering::AcqRel) {
                let text = self.meta(&inner).encode();
                let _ = file::write_atomically(&b.meta, &text, true);
                *b.written.lock().unwrap_or_else(|p| p.into_inner()) = text;
                let _ = nix::unistd::fdatasync(self.data_fd.as_raw_fd());
            }
        }
        self.shutdown.store(true, Ordering::Release);
        self.header()
            .state
            .store(layout::NODE_CLOSED, Ordering::Release);
        self.rpc.pool.wake_all();
    }

    /// Serves one RPC request of `session`. Never panics on client input.
    pub fn handle(&self, session: SessionId, req: Request) -> Response {
        self.counters.rpcs.fetch_add(1, Ordering::Relaxed);
        // Requests that may change what a file-backed node keeps: their
        // answer waits for the metadata's write.
        let keeps = matches!(
            req,
            Request::AllocChunk { .. }
                | Request::AllocGroupChunk { .. }
                | Request::FreeChunk { .. }
                | Request::SetRoot { .. }
                | Request::ReleaseGroup { .. }
                | Request::Admin { .. }
        );
        let res = match req {
            Request::AllocChunk { len, persistent } => {
                let owner = if persistent {
                    Owner::Persistent(session)
                } else {
                    Owner::Session(session)
                };
                self.alloc_chunk(session, len, owner)
            }
            Request::AllocGroupChunk { len, group } => check_root_name(&group)
                .and_then(|()| self.check_revoked(session, &group))
                .and_then(|()| self.alloc_chunk(session, len, Owner::Group(group))),
            Request::FreeChunk { offset } => self.free_chunk(session, offset),
            Request::GetRoot { name } => self.get_root(&name),
            Request::OpenRoot { name } => self.open_root(session, name),
            Request::SetRoot {
                name,
                value,
                expected,
            } => self
                .check_revoked(session, &name)
                .and_then(|()| self.set_root(session, name, value, expected)),
            Request::HoldGroup { group } => self
                .check_revoked(session, &group)
                .and_then(|()| self.hold_group(session, group)),
            Request::ReleaseGroup { group } => self
                .check_revoked(session, &group)
                .and_then(|()| self.release_group(session, &group)),
            Request::ListRoots => Ok(Response::Roots(self.list_roots())),
            Request::Admin { token, op } => self.admin(&token, op),
            Request::ListRegions => Ok(Response::Regions(
                self.lock().regions.iter().flatten().copied().collect(),
            )),
            Request::Stats => Ok(Response::Stats(self.stats())),
            Request::Shutdown => {
                self.request_shutdown();
                Ok(Response::ShuttingDown)
            }
            // A channel's memfd travels beside the answer: only transports
            // that pass descriptors serve this (the Unix-socket server).
            Request::OpenRpcChannel { .. } => Err(RpcError::Unsupported(
                "RPC channels are opened over the node's Unix socket or in process".into(),
            )),
        };
        let res = res.and_then(|r| {
            if keeps {
                self.persist()?;
            }
            Ok(r)
        });
        res.unwrap_or_else(|e| {
            self.counters.rpc_errors.fetch_add(1, Ordering::Relaxed);
            Response::Error(e)
        })
    }

    fn alloc_chunk(
        &self,
        session: SessionId,
        len: u64,
        owner: Owner,
    ) -> Result<Response, RpcError> {
        if self.is_shutting_down() {
            return Err(RpcError::ShuttingDown);
        }
        if len == 0 || len > self.heap.len {
            return Err(RpcError::BadLength(len));
        }
        let mut inner = self.lock();
        let Some((offset, len)) = inner.alloc.alloc(len) else {
            return Err(RpcError::OutOfMemory {
                requested: len,
                largest_free: inner.alloc.largest_free(),
            });
        };
        let rkey = self.heap.rkey;
        let resp = if let Owner::Group(name) = &owner {
            // A first chunk makes the session a holder: a group's memory
            // is never held by nobody while it has chunks.
            let g = inner.groups.entry(name.clone()).or_default();
            let took_ref = !g.holders.contains_key(&session);
            g.holders.entry(session).or_insert(1);
            g.chunks.insert(offset);
            g.bytes += len;
            Response::GroupChunk {
                offset,
                len,
                rkey,
                took_ref,
            }
        } else {
            Response::Chunk { offset, len, rkey }
        };
        inner.chunks.insert(offset, ChunkRec { len, owner });
        drop(inner);
        if self.prefault_chunks {
            // The chunk is the caller's alone until this reply reaches it.
            self.prefault(offset, len);
        }
        Ok(resp)
    }

    /// Faults in the memory pages behind remote `[offset, offset+len)`
    /// ([`NodeConfig::prefault_chunks`]), contents unchanged.
    fn prefault(&self, offset: u64, len: u64) {
        let shift = self.layout.page_shift;
        let first = offset >> shift;
        let end = (offset + len)
            .div_ceil(1 << shift)
            .min(self.layout.remote_pages);
        for page in first..end {
            let Some(phys) = self.page_entry(page).get() else {
                continue;
            };
            if phys >= self.layout.phys_pages {
                continue;
            }
            let base = (phys << shift) as usize;
            for off in (0..1usize << shift).step_by(4096) {
                // SAFETY: phys < phys_pages, so [base, base + page size) lies
                // in the data mapping; the address is 8-byte aligned.
                let w = unsafe { &*(self.data.as_ptr().add(base + off) as *const AtomicU64) };
                crate::memory::touch(w);
            }
        }
    }

    fn free_chunk(&self, session: SessionId, offset: u64) -> Result<Response, RpcError> {
        let mut inner = self.lock();
        let rec = inner
            .chunks
            .get(&offset)
            .ok_or(RpcError::NotAllocated { offset })?;
        let owns = match &rec.owner {
            Owner::Session(s) | Owner::Persistent(s) => *s == session,
            Owner::Group(g) => inner
                .groups
                .get(g)
                .is_some_and(|g| g.holders.contains_key(&session)),
            Owner::Internal => false,
        };
        if !owns {
            return Err(RpcError::NotOwner { offset });
        }
        let len = self.free_locked(&mut inner, offset);
        Ok(Response::Freed { len })
    }

    fn admin(&self, token: &[u8; TOKEN_LEN], op: AdminOp) -> Result<Response, RpcError> {
        let ok = self
            .admin_token
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .is_some_and(|t| crate::server::token_eq(&t, token));
        if !ok {
            self.counters.auth_failures.fetch_add(1, Ordering::Relaxed);
            return Err(RpcError::NotAdmin(
                "the token does not match the node's (or the node has none)".into(),
            ));
        }
        match op {
            AdminOp::Gc => {
                let (chunks, bytes) = self.gc();
                Ok(Response::Collected { chunks, bytes })
            }
            AdminOp::GcRoot { name } => {
                let (chunks, bytes) = self.gc_root(&name)?;
                Ok(Response::Collected { chunks, bytes })
            }
            AdminOp::FreeChunk { offset } => {
                let mut inner = self.lock();
                match inner.chunks.get(&offset) {
                    None => Err(RpcError::NotAllocated { offset }),
                    Some(c) if c.owner == Owner::Internal => Err(RpcError::NotOwner { offset }),
                    Some(_) => Ok(Response::Freed {
                        len: self.free_locked(&mut inner, offset),
                    }),
                }
            }
        }
    }

    fn get_root(&self, name: &str) -> Result<Response, RpcError> {
        check_root_name(name)?;
        Ok(Response::Root(self.lock().roots.get(name).map(|r| r.value)))
    }

    /// Reads root `name` and, if set, takes a reference on its group.
    fn open_root(&self, session: SessionId, name: String) -> Result<Response, RpcError> {
        check_root_name(&name)?;
        let mut inner = self.lock();
        let value = inner.roots.get(&name).map(|r| r.value);
        if value.is_some() {
            *inner
                .groups
                .entry(name)
                .or_default()
                .holders
                .entry(session)
                .or_insert(0) += 1;
        }
        Ok(Response::Root(value))
    }

    fn hold_group(&self, session: SessionId, group: String) -> Result<Response, RpcError> {
        check_root_name(&group)?;
        let mut inner = self.lock();
        let g = inner.groups.entry(group).or_default();
        *g.holders.entry(session).or_insert(0) += 1;
        Ok(Response::Held { refs: g.refs() })
    }

    fn release_group(&self, session: SessionId, group: &str) -> Result<Response, RpcError> {
        check_root_name(group)?;
        let mut inner = self.lock();
        let not_holder = || RpcError::NotHolder(group.into());
        let g = inner.groups.get_mut(group).ok_or_else(not_holder)?;
        let mine = g.holders.get_mut(&session).ok_or_else(not_holder)?;
        *mine -= 1;
        if *mine == 0 {
            g.holders.remove(&session);
        }
        let refs = g.refs();
        let freed_bytes = if refs == 0 {
            self.free_group(&mut inner, group).1
        } else {
            0
        };
        Ok(Response::Released { refs, freed_bytes })
    }

    fn set_root(
        &self,
        session: SessionId,
        name: String,
        value: u64,
        expected: Option<Option<u64>>,
    ) -> Result<Response, RpcError> {
        check_root_name(&name)?;
        let mut inner = self.lock();
        let current = inner.roots.get(&name).map(|r| r.value);
        if let Some(exp) = expected {
            if exp != current {
                return Err(RpcError::RootMismatch {
                    name,
                    expected: exp,
                    current,
                });
            }
        }
        // 0 releases the name: it leaves the table (so released names never
        // fill it), and reads as never set.
        if value == 0 {
            inner.roots.remove(&name);
            return Ok(Response::RootSet { previous: current });
        }
        if current.is_none() && inner.roots.len() >= MAX_ROOTS {
            return Err(RpcError::RootTableFull(MAX_ROOTS));
        }
        // A root claimed by a holder of the group of its name, or of a
        // name above it (`race/t` for `race/t/hot`), goes with that group.
        let group = match inner.roots.get(&name) {
            Some(r) => r.group.clone(),
            None => group_of(&inner, session, &name),
        };
        inner.roots.insert(name, Root { value, group });
        Ok(Response::RootSet { previous: current })
    }

    /// A snapshot of the node's statistics.
    pub fn stats(&self) -> NodeStats {
        let inner = self.lock();
        let c = &self.counters;
        let [rpc_requests, rpc_failures, rpc_malformed, rpc_messages] = self.rpc.totals();
        let [rpc_channels, rpc_channels_total, rpc_channels_reclaimed, rpc_channels_broken] =
            self.rpc.pool.channel_counts();
        let (mut session_b, mut persistent_b) = (0, 0);
        for ch in inner.chunks.values() {
            match ch.owner {
                Owner::Session(_) | Owner::Internal => session_b += ch.len,
                Owner::Persistent(_) | Owner::Group(_) => persistent_b += ch.len,
            }
        }
        NodeStats {
            node_id: self.layout.node_id,
            page_size: self.layout.page_size(),
            remote_bytes: self.layout.remote_len(),
            heap_bytes: inner.alloc.capacity(),
            heap_free_bytes: inner.alloc.free_bytes(),
            heap_largest_free: inner.alloc.largest_free(),
            chunks: inner.chunks.len() as u64,
            chunk_bytes: session_b + persistent_b,
            session_chunk_bytes: session_b,
            persistent_chunk_bytes: persistent_b,
            regions: inner.regions.iter().flatten().count() as u64,
            roots: inner.roots.len() as u64,
            sessions_active: inner.sessions.len() as u64,
            sessions_total: c.sessions_total.load(Ordering::Relaxed),
            sessions_reaped: c.sessions_reaped.load(Ordering::Relaxed),
            chunks_reclaimed: c.chunks_reclaimed.load(Ordering::Relaxed),
            rpcs: c.rpcs.load(Ordering::Relaxed),
            rpc_errors: c.rpc_errors.load(Ordering::Relaxed),
            bad_frames: c.bad_frames.load(Ordering::Relaxed),
            auth_failures: c.auth_failures.load(Ordering::Relaxed),
            refused_connections: c.refused_connections.load(Ordering::Relaxed),
            pages_remapped: c.pages_remapped.load(Ordering::Relaxed),
            spare_pages_free: inner.spare_free.len() as u64,
            rpc_workers: self.rpc.workers() as u64,
            rpc_channels,
            rpc_channels_total,
            rpc_channels_reclaimed,
            rpc_channels_broken,
            rpc_requests,
            rpc_failures,
            rpc_malformed,
            rpc_messages,
            corm: self
                .corm
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .as_ref()
                .and_then(std::sync::Weak::upgrade)
                .map(|a| Box::new(a.snapshot())),
        }
    }
}

impl Drop for MemNode {
    fn drop(&mut self) {
        // The RPC workers hold the node weakly: stop them (all but the
        // calling thread, if a worker dropped the last reference).
        self.rpc.pool.stop();
    }
}

/// The longest group `session` holds whose name is `name` or a prefix of
/// it ending at a `/`.
fn group_of(inner: &Inner, session: SessionId, name: &str) -> Option<String> {
    let mut cut = name.len();
    loop {
        let candidate = &name[..cut];
        if inner
            .groups
            .get(candidate)
            .is_some_and(|g| g.holders.contains_key(&session))
        {
            return Some(candidate.to_owned());
        }
        cut = candidate.rfind('/')?;
    }
}

fn check_root_name(name: &str) -> Result<(), RpcError> {
    let ok = !name.is_empty()
        && name.len() <= 64
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"_./-".contains(&b));
    if ok {
        Ok(())
    } else {
        Err(RpcError::BadRootName(name.chars().take(80).collect()))
    }
}

/// Fills `buf` from the OS random source.
pub fn fill_random(buf: &mut [u8]) {
    // The kernel's random source failing is not recoverable and not caused by
    // a client; treat it as a fatal environment error.
    getrandom::fill(buf).expect("OS random source available");
}

#[cfg(test)]
mod tests {
    use super::*;

    fn small() -> Arc<MemNode> {
        MemNode::new(NodeConfig {
            size: 1 << 20,
            spare_pages: 4,
            ..Default::default()
        })
        .unwrap()
    }

    #[test]
    fn session_chunks_are_reclaimed_persistent_ones_kept() {
        let n = small();
        let s = n.open_session();
        let Response::Chunk { offset: a, .. } = n.handle(
            s,
            Request::AllocChunk {
                len: 5000,
                persistent: false,
            },
        ) else {
            panic!()
        };
        let Response::Chunk { offset: b, len, .. } = n.handle(
            s,
            Request::AllocChunk {
                len: 4096,
                persistent: true,
            },
        ) else {
            panic!()
        };
        assert_eq!(a, 4096, "page 0 is reserved");
        assert_eq!(len, 4096);
        assert_eq!(n.stats().chunk_bytes, 8192 + 4096);
        assert_eq!(n.close_session(s), 8192);
        let st = n.stats();
        assert_eq!(st.chunk_bytes, 4096);
        assert_eq!(st.chunks_reclaimed, 1);
        // The persistent chunk is not another session's to free; once its
        // session is gone, only an admin request (gc) frees it.
        let t = n.open_session();
        assert_eq!(
            n.handle(t, Request::FreeChunk { offset: b }),
            Response::Error(RpcError::NotOwner { offset: b })
        );
        assert_eq!(
            n.stats().chunk_bytes,
            4096,
            "a refused free changes nothing"
        );
        assert_eq!(n.gc(), (1, 4096));
        assert_eq!(n.stats().heap_free_bytes, n.stats().heap_bytes);
    }

    /// Bytes of the node's memory file the kernel has allocated pages for.
    fn resident(n: &MemNode) -> u64 {
        let st = nix::sys::stat::fstat(n.data_fd.as_raw_fd()).unwrap();
        st.st_blocks as u64 * 512
    }

    /// A chunk's pages are faulted in when it is allocated (as a NIC's
    /// registration pins them); with the switch off they are not; either
    /// way a free returns them.
    #[test]
    fn chunks_are_prefaulted_on_allocation_unless_switched_off() {
        for prefault in [true, false] {
            let n = MemNode::new(NodeConfig {
                size: 8 << 20,
                prefault_chunks: prefault,
                ..Default::default()
            })
            .unwrap();
            let s = n.open_session();
            let before = resident(&n);
            let Response::Chunk { offset, len, .. } = n.handle(
                s,
                Request::AllocChunk {
                    len: 2 << 20,
                    persistent: false,
                },
            ) else {
                panic!()
            };
            let grown = resident(&n) - before;
            if prefault {
                assert!(grown >= len, "{grown} B resident for a {len} B chunk");
            } else {
                assert!(grown < len / 4, "{grown} B resident without prefault");
            }
            assert_eq!(
                n.handle(s, Request::FreeChunk { offset }),
                Response::Freed { len }
            );
            assert!(resident(&n) < before + len, "a free returns the pages");
        }
    }

    fn group_chunk(n: &MemNode, s: SessionId, len: u64, group: &str) -> u64 {
        match n.handle(
            s,
            Request::AllocGroupChunk {
                len,
                group: group.into(),
            },
        ) {
            Response::GroupChunk { offset, .. } => offset,
            other => panic!("{other:?}"),
        }
    }

    fn set(n: &MemNode, s: SessionId, name: &str, value: u64) -> Response {
        n.handle(
            s,
            Request::SetRoot {
                name: name.into(),
                value,
                expected: Some(None),
            },
        )
    }

    /// A structure's memory lives while a session holds it: the creator's
    /// death does not free what an opener still holds, the last holder's
    /// death frees the chunks and removes the roots, and a holder that
    /// released its reference cannot release again.
    #[test]
    fn groups_live_while_held_and_die_with_their_last_holder() {
        let n = small();
        let (a, b) = (n.open_session(), n.open_session());
        group_chunk(&n, a, 8192, "race/t");
        let desc = group_chunk(&n, a, 4096, "race/t");
        assert_eq!(
            set(&n, a, "race/t", desc),
            Response::RootSet { previous: None }
        );
        assert_eq!(
            set(&n, a, "race/t/hot", 9),
            Response::RootSet { previous: None }
        );
        // Another structure whose name extends this one's is not attached.
        assert_eq!(
            set(&n, b, "race/t2", 5),
            Response::RootSet { previous: None }
        );
        assert_eq!(
            n.handle(
                b,
                Request::OpenRoot {
                    name: "race/t".into()
                }
            ),
            Response::Root(Some(desc))
        );
        let b_chunk = group_chunk(&n, b, 4096, "race/t");
        let info = n.list_roots();
        let t = info.iter().find(|r| r.name == "race/t").unwrap();
        assert_eq!((t.refs, t.chunks, t.bytes), (2, 3, 16384));
        assert_eq!(t.holders, vec![(a, 1), (b, 1)]);
        let hot = info.iter().find(|r| r.name == "race/t/hot").unwrap();
        assert_eq!(hot.group.as_deref(), Some("race/t"));
        assert_eq!(
            info.iter().find(|r| r.name == "race/t2").unwrap().group,
            None
        );
        // The creator dies: nothing is freed, b still uses the structure.
        assert_eq!(n.close_session(a), 0);
        assert_eq!(n.stats().persistent_chunk_bytes, 16384);
        // Any holder may free a group chunk; a non-holder may not.
        let c = n.open_session();
        assert_eq!(
            n.handle(c, Request::FreeChunk { offset: b_chunk }),
            Response::Error(RpcError::NotOwner { offset: b_chunk })
        );
        assert_eq!(
            n.handle(
                c,
                Request::ReleaseGroup {
                    group: "race/t".into()
                }
            ),
            Response::Error(RpcError::NotHolder("race/t".into()))
        );
        // The last holder dies: chunks freed, its roots gone, others kept.
        let reclaimed_before = n.stats().chunks_reclaimed;
        assert_eq!(n.close_session(b), 16384);
        let st = n.stats();
        assert_eq!(st.chunk_bytes, 0);
        assert_eq!(st.chunks_reclaimed - reclaimed_before, 3);
        assert_eq!(
            n.handle(
                c,
                Request::GetRoot {
                    name: "race/t".into()
                }
            ),
            Response::Root(None)
        );
        assert_eq!(
            n.handle(
                c,
                Request::GetRoot {
                    name: "race/t/hot".into()
                }
            ),
            Response::Root(None)
        );
        assert_eq!(
            n.handle(
                c,
                Request::GetRoot {
                    name: "race/t2".into()
                }
            ),
            Response::Root(Some(5))
        );
        assert_eq!(st.heap_free_bytes, st.heap_bytes);
    }

    /// Two handles in one session hold two references: the first release
    /// detaches, the second frees; a third is refused.
    #[test]
    fn releases_count_down_references() {
        let n = small();
        let s = n.open_session();
        let d = group_chunk(&n, s, 4096, "art/x");
        set(&n, s, "art/x", d);
        assert_eq!(
            n.handle(
                s,
                Request::OpenRoot {
                    name: "art/x".into()
                }
            ),
            Response::Root(Some(d))
        );
        let rel = || {
            n.handle(
                s,
                Request::ReleaseGroup {
                    group: "art/x".into(),
                },
            )
        };
        assert_eq!(
            rel(),
            Response::Released {
                refs: 1,
                freed_bytes: 0
            }
        );
        assert_eq!(
            rel(),
            Response::Released {
                refs: 0,
                freed_bytes: 4096
            }
        );
        assert_eq!(rel(), Response::Error(RpcError::NotHolder("art/x".into())));
        assert_eq!(n.stats().roots, 0);
        assert_eq!(n.stats().chunks, 0);
    }

    /// Admin requests need the node's token; with it, any chunk but the
    /// node's own can be freed.
    #[test]
    fn admin_requests_need_the_token() {
        let n = small();
        let s = n.open_session();
        let Response::Chunk { offset, .. } = n.handle(
            s,
            Request::AllocChunk {
                len: 4096,
                persistent: false,
            },
        ) else {
            panic!()
        };
        let t = n.open_session();
        let free = |token| {
            n.handle(
                t,
                Request::Admin {
                    token,
                    op: AdminOp::FreeChunk { offset },
                },
            )
        };
        assert!(matches!(
            free([0; TOKEN_LEN]),
            Response::Error(RpcError::NotAdmin(_))
        ));
        n.set_admin_token([7; TOKEN_LEN]);
        assert!(matches!(
            free([0; TOKEN_LEN]),
            Response::Error(RpcError::NotAdmin(_))
        ));
        assert_eq!(n.stats().chunks, 1);
        assert_eq!(free([7; TOKEN_LEN]), Response::Freed { len: 4096 });
        let (internal, _) = n.reserve_internal(4096).unwrap();
        assert_eq!(
            n.handle(
                t,
                Request::Admin {
                    token: [7; TOKEN_LEN],
                    op: AdminOp::FreeChunk { offset: internal },
                },
            ),
            Response::Error(RpcError::NotOwner { offset: internal })
        );
    }

    #[test]
    fn foreign_and_unknown_frees_are_refused() {
        let n = small();
        let (s, t) = (n.open_session(), n.open_session());
        let Response::Chunk { offset, .. } = n.handle(
            s,
            Request::AllocChunk {
                len: 1,
                persistent: false,
            },
        ) else {
            panic!()
        };
        assert_eq!(
            n.handle(t, Request::FreeChunk { offset }),
            Response::Error(RpcError::NotOwner { offset })
        );
        assert_eq!(
            n.handle(t, Request::FreeChunk { offset: 12345 }),
            Response::Error(RpcError::NotAllocated { offset: 12345 })
        );
        assert!(matches!(
            n.handle(
                t,
                Request::AllocChunk {
                    len: 1 << 40,
                    persistent: true
                }
            ),
            Response::Error(RpcError::BadLength(_))
        ));
        assert!(matches!(
            n.handle(
                t,
                Request::AllocChunk {
                    len: (1 << 20) - 4096,
                    persistent: true
                }
            ),
            Response::Error(RpcError::OutOfMemory { .. })
        ));
        assert_eq!(n.stats().rpc_errors, 4);
    }

    /// A released root (set to 0) leaves the table: 2,000 claims and
    /// releases of distinct names (twice the table) all succeed, and a
    /// released name is free to claim again.
    #[test]
    fn released_roots_leave_the_table() {
        let n = small();
        let s = n.open_session();
        let set = |name: &str, v, e| {
            n.handle(
                s,
                Request::SetRoot {
                    name: name.into(),
                    value: v,
                    expected: e,
                },
            )
        };
        for i in 0..2 * MAX_ROOTS + 48 {
            let name = format!("ht/t{i}");
            assert_eq!(
                set(&name, 7, Some(None)),
                Response::RootSet { previous: None }
            );
            assert_eq!(
                set(&name, 0, Some(Some(7))),
                Response::RootSet { previous: Some(7) }
            );
            assert_eq!(
                n.handle(s, Request::GetRoot { name: name.clone() }),
                Response::Root(None)
            );
        }
        assert_eq!(n.stats().roots, 0);
        assert_eq!(
            set("ht/t0", 9, Some(None)),
            Response::RootSet { previous: None }
        );
    }

    #[test]
    fn roots_compare_and_set() {
        let n = small();
        let s = n.open_session();
        let set = |v, e| {
            n.handle(
                s,
                Request::SetRoot {
                    name: "ht/dir".into(),
                    value: v,
                    expected: e,
                },
            )
        };
        assert_eq!(set(1, Some(None)), Response::RootSet { previous: None });
        assert!(matches!(
            set(2, Some(None)),
            Response::Error(RpcError::RootMismatch { .. })
        ));
        assert_eq!(
            set(3, Some(Some(1))),
            Response::RootSet { previous: Some(1) }
        );
        assert_eq!(
            n.handle(
                s,
                Request::GetRoot {
                    name: "ht/dir".into()
                }
            ),
            Response::Root(Some(3))
        );
        assert!(matches!(
            n.handle(
                s,
                Request::GetRoot {
                    name: "bad name!".into()
                }
            ),
            Response::Error(RpcError::BadRootName(_))
        ));
    }

    #[test]
    fn migrate_keeps_contents_and_changes_translation() {
        let n = small();
        let ps = 4096usize;
        let before = n.translate(3).unwrap();
        // SAFETY (test): page 3 is inside the data mapping; atomic access.
        let word = |phys: u64| unsafe {
            &*(n.data_mapping().as_ptr().add(phys as usize * ps + 8) as *const AtomicU64)
        };
        word(before).store(0xfeed, Ordering::SeqCst);
        let after = n.migrate_page(3).unwrap();
        assert_ne!(before, after);
        assert_eq!(n.translate(3), Some(after));
        assert_eq!(word(after).load(Ordering::SeqCst), 0xfeed);
        assert_eq!(n.stats().pages_remapped, 1);
        assert_eq!(n.migrate_page(1 << 30), Err(RpcError::BadPage(1 << 30)));
    }

    /// `node gc --root` on a group a live session holds: its memory is
    /// discarded and its pages unmapped at once (a holder's verbs fault),
    /// but its addresses go to nobody else until the holder's session
    /// ends; then they are mapped, zero and allocatable again.
    #[test]
    fn a_collected_groups_addresses_stay_fenced_until_its_holders_end() {
        let n = small();
        let (s, other) = (n.open_session(), n.open_session());
        let Response::GroupChunk { offset, len, .. } = n.handle(
            s,
            Request::AllocGroupChunk {
                len: 64 << 10,
                group: "art/t".into(),
            },
        ) else {
            panic!("a group chunk")
        };
        let (first, pages) = (offset / 4096, len / 4096);
        // The holder writes through its mapping (what a verb does).
        // SAFETY (test): the page is mapped (identity) inside the data
        // mapping; atomic access.
        let word = |phys: u64| unsafe {
            &*(n.data_mapping().as_ptr().add(phys as usize * 4096 + 8) as *const AtomicU64)
        };
        word(first).store(0xdead, Ordering::SeqCst);
        assert_eq!(n.gc_root("art/t"), Ok((1, len)));
        assert!((first..first + pages).all(|p| n.translate(p).is_none()));
        assert_eq!(n.fenced_bytes(), len);
        // Nobody else gets the fenced addresses while the holder lives.
        let mut got = Vec::new();
        while let Response::Chunk {
            offset: o, len: l, ..
        } = n.handle(
            other,
            Request::AllocChunk {
                len: 64 << 10,
                persistent: false,
            },
        ) {
            assert!(
                o + l <= offset || o >= offset + len,
                "fenced range handed out"
            );
            got.push(o);
        }
        assert!(!got.is_empty());
        n.close_session(other);
        // A stray write of the holder after the collection.
        word(first).store(0xbeef, Ordering::SeqCst);
        n.close_session(s);
        assert_eq!(n.fenced_bytes(), 0);
        assert!((first..first + pages).all(|p| n.translate(p) == Some(p)));
        assert_eq!(word(first).load(Ordering::SeqCst), 0, "zeroed before reuse");
        let t = n.open_session();
        let mut reused = false;
        while let Response::Chunk { offset: o, .. } = n.handle(
            t,
            Request::AllocChunk {
                len: 64 << 10,
                persistent: false,
            },
        ) {
            reused |= o == offset;
        }
        assert!(reused, "the range is allocatable again");
    }

    #[test]
    fn regions_register_and_deregister() {
        let n = small();
        let r = n.register_region(8192, 4096, layout::access::READ).unwrap();
        assert_eq!(r.rkey & 0xFF, 1, "slot 0 is the heap");
        assert!(n.register_region(100, 4096, 1).is_err());
        assert!(n.register_region(0, 1 << 30, 1).is_err());
        n.deregister_region(r.rkey).unwrap();
        assert_eq!(
            n.deregister_region(r.rkey),
            Err(RpcError::NoSuchRegion(r.rkey))
        );
    }

    #[test]
    fn bad_configs_are_errors() {
        for cfg in [
            NodeConfig {
                page_size: 8192,
                ..Default::default()
            },
            NodeConfig {
                size: 4096,
                ..Default::default()
            },
        ] {
            assert!(matches!(MemNode::new(cfg), Err(NodeError::Config(_))));
        }
    }

    /// A file-backed node restarted on its file keeps its groups, their
    /// bytes and its roots, unheld; session chunks die with the node and
    /// their pages read zero; a second node on a served file, another
    /// geometry and page remapping are refused.
    #[test]
    fn a_memory_file_keeps_groups_and_roots_across_a_restart() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("mem");
        let cfg = NodeConfig {
            size: 1 << 20,
            spare_pages: 4,
            node_id: 2,
            ..Default::default()
        };
        let write = |n: &MemNode, off: u64, v: u64| {
            // SAFETY: off is inside a chunk of the node's data mapping, 8-byte
            // aligned, written through an atomic (identity translation).
            unsafe { &*(n.data.as_ptr().add(off as usize) as *const AtomicU64) }
                .store(v, Ordering::Release)
        };
        let read = |n: &MemNode, off: u64| {
            // SAFETY: as in `write`.
            unsafe { &*(n.data.as_ptr().add(off as usize) as *const AtomicU64) }
                .load(Ordering::Acquire)
        };
        let (g, t) = {
            let n = MemNode::with_memory_file(cfg.clone(), &path).unwrap();
            assert!(matches!(
                MemNode::with_memory_file(cfg.clone(), &path),
                Err(NodeError::Config(e)) if e.contains("has it open")
            ));
            let s = n.open_session();
            let Response::GroupChunk { offset: g, .. } = n.handle(
                s,
                Request::AllocGroupChunk {
                    len: 8192,
                    group: "txn/bank".into(),
                },
            ) else {
                panic!()
            };
            let Response::Chunk { offset: t, .. } = n.handle(
                s,
                Request::AllocChunk {
                    len: 4096,
                    persistent: false,
                },
            ) else {
                panic!()
            };
            let set = Request::SetRoot {
                name: "txn/bank".into(),
                value: g,
                expected: None,
            };
            assert!(matches!(n.handle(s, set), Response::RootSet { .. }));
            write(&n, g + 8, 77);
            write(&n, t, 99);
            assert!(matches!(
                n.remap_pages(g >> 12, (g >> 12) + 1, 1),
                Err(RpcError::Unsupported(_))
            ));
            assert!(n.migrate_page(g >> 12).is_err());
            // The node dies without closing its sessions (as a SIGKILL).
            (g, t)
        };
        let other = NodeConfig {
            node_id: 3,
            ..cfg.clone()
        };
        assert!(matches!(
            MemNode::with_memory_file(other, &path),
            Err(NodeError::Config(e)) if e.contains("made for")
        ));
        let n = MemNode::with_memory_file(cfg.clone(), &path).unwrap();
        let roots = n.list_roots();
        assert_eq!(roots.len(), 1, "{roots:?}");
        assert_eq!(roots[0].value, Some(g));
        assert_eq!(roots[0].refs, 0, "kept, held by nobody");
        assert_eq!(roots[0].bytes, 8192);
        assert_eq!(read(&n, g + 8), 77, "the group's bytes");
        assert_eq!(read(&n, t), 0, "a session chunk died with the node");
        // A session's end frees nothing on a file-backed node; a last
        // explicit release does.
        let s = n.open_session();
        assert_eq!(
            n.handle(
                s,
                Request::OpenRoot {
                    name: "txn/bank".into()
                }
            ),
            Response::Root(Some(g))
        );
        n.close_session(s);
        assert_eq!(n.list_roots()[0].bytes, 8192);
        let s = n.open_session();
        n.handle(
            s,
            Request::HoldGroup {
                group: "txn/bank".into(),
            },
        );
        let r = n.handle(
            s,
            Request::ReleaseGroup {
                group: "txn/bank".into(),
            },
        );
        assert_eq!(
            r,
            Response::Released {
                refs: 0,
                freed_bytes: 8192
            }
        );
        // An admin collecting a held group fences it (unmapped, then the
        // identity again when its holder ends), which a file allows.
        let Response::GroupChunk { offset: h, .. } = n.handle(
            s,
            Request::AllocGroupChunk {
                len: 4096,
                group: "art/t".into(),
            },
        ) else {
            panic!()
        };
        assert_eq!(n.gc_root("art/t"), Ok((1, 4096)));
        assert_eq!(n.translate(h >> 12), None);
        n.close_session(s);
        assert_eq!(n.translate(h >> 12), Some(h >> 12));
        drop(n);
        let n = MemNode::with_memory_file(cfg, &path).unwrap();
        assert!(n.list_roots().is_empty(), "the release was kept too");
    }
}
