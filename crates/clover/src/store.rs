//! The store's shared handle: configuration, creation, opening,
//! destruction, and the embedded metadata server's thread.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use dmkit_fabric::{Fabric, GlobalAddr, RemoteRef};
use dmkit_index::{Creation, Home, IndexConfig, IndexError, RemoteMap, RetryPolicy, Shape};
use dmkit_runtime::machine::PerMachine;
use dmkit_runtime::{LocalLayout, Nanos};
use zerocopy::{FromBytes, IntoBytes};

use crate::client::{ClientState, CloverClient, CloverCounters, Hints, Scratch};
use crate::hint::HintCache;
use crate::layout::*;
use crate::mds::{Mds, MdsConfig, MdsStats};
use crate::pool::Pool;

/// The structure's kind: its roots are `clover/NAME`.
pub const KIND: &str = "clover";

/// Directory entries a lookup reads at once (one READ of 128 bytes).
pub const PROBE_WINDOW: u64 = 8;

/// Configuration of a store (structure) and of its clients. With the
/// `cli` feature it is a set of command-line flags (`clap::Args`): the
/// switches and client settings are flags, the structural settings come
/// from the workload ([`IndexConfig::fit`]).
#[derive(Debug, Clone, PartialEq)]
#[cfg_attr(feature = "cli", derive(clap::Args))]
#[cfg_attr(
    feature = "cli",
    command(next_help_heading = "Clover (--index clover)")
)]
pub struct CloverConfig {
    /// Longest key in bytes (stored in the descriptor).
    #[cfg_attr(feature = "cli", arg(skip = CloverConfig::default().max_key))]
    pub max_key: usize,
    /// Longest value in bytes (stored in the descriptor).
    #[cfg_attr(feature = "cli", arg(skip = CloverConfig::default().max_value))]
    pub max_value: usize,
    /// Directory entries: the most keys the store can ever hold (a power
    /// of two; entries are never freed).
    #[cfg_attr(feature = "cli", arg(skip = CloverConfig::default().dir_slots))]
    pub dir_slots: u64,
    /// Slots of the free-block pool (a power of two).
    #[cfg_attr(feature = "cli", arg(skip = CloverConfig::default().pool_slots))]
    pub pool_slots: u64,
    /// Clover: hints cached per client (key → believed tail), a power of
    /// two; 0 caches none (every operation starts at the directory).
    #[cfg_attr(
        feature = "cli",
        arg(long = "clover-cache", value_name = "ENTRIES", default_value_t = CloverConfig::default().cache_entries)
    )]
    pub cache_entries: usize,
    /// How long a block the metadata server cut off a chain stays
    /// untouched before it is reused (ns of the clients' clocks); a client
    /// dereferences an address at most half of it after learning it.
    #[cfg_attr(feature = "cli", arg(skip = CloverConfig::default().grace))]
    pub grace: Nanos,
    /// Bytes a client takes from the memory node at a time for versions
    /// when the pool is empty.
    #[cfg_attr(feature = "cli", arg(skip = CloverConfig::default().chunk_bytes))]
    pub chunk_bytes: u64,
    /// Blocks a client claims from the pool at a time.
    #[cfg_attr(feature = "cli", arg(skip = CloverConfig::default().alloc_batch))]
    pub alloc_batch: u32,
    /// Clover: hops a reader chases along a chain before it jumps to the
    /// key's shortcut in the directory (Clover's chasing threshold; 0:
    /// never).
    #[cfg_attr(
        feature = "cli",
        arg(long = "chase-limit", default_value_t = CloverConfig::default().chase_limit)
    )]
    pub chase_limit: u32,
    /// Clover: writers record their new version as the key's shortcut
    /// (one 8-byte WRITE per write).
    #[cfg_attr(
        feature = "cli",
        arg(long = "shortcut", value_name = "on|off", default_value = "on", value_parser = dmkit_index::cli::parse_switch, action = clap::ArgAction::Set)
    )]
    pub shortcut: bool,
    /// Clover: the first READ of a chain walk (a reader's at its hint, a
    /// writer's after a lost CAS) goes with a READ of the key's shortcut,
    /// in the same round trip; if the version read is not the tail, the
    /// walk jumps to the shortcut's version (public Clover's pointer
    /// chasing: `mitsume_tool_pointer_chasing` reads the shortcut beside
    /// the entry on its first iteration). Off: the shortcut is read only
    /// after `chase_limit` hops. Needs `shortcut`.
    #[cfg_attr(
        feature = "cli",
        arg(long = "shortcut-first", value_name = "on|off", default_value = "on", value_parser = dmkit_index::cli::parse_switch, action = clap::ArgAction::Set)
    )]
    pub shortcut_first: bool,
    /// Clover: every worker of a compute machine (a process on shm) shares
    /// one hint cache, as public Clover's clients do (one table per client
    /// process, `MITSUME_TOOL_QUERY_HASHTABLE` in `mitsume_tool.cc`, read
    /// and updated by all its threads and coroutines: a tail one thread
    /// reached or appended is every thread's next start). Off: each worker
    /// keeps its own, whose hints of a hot key are as old as that worker's
    /// last touch of it.
    #[cfg_attr(
        feature = "cli",
        arg(long = "shared-hints", value_name = "on|off", default_value = "on", value_parser = dmkit_index::cli::parse_switch, action = clap::ArgAction::Set)
    )]
    pub shared_hints: bool,
    /// Clover: run the metadata server's garbage collection in a thread of
    /// the process that creates or opens the store (the embedded setup).
    /// Off on the simulator, which runs it as a virtual thread instead
    /// ([`crate::Mds::spawn`]), and when `dmkit clover-mds` runs it.
    #[cfg_attr(
        feature = "cli",
        arg(long = "gc", id = "clover_gc", value_name = "on|off", default_value = "on", value_parser = dmkit_index::cli::parse_switch, action = clap::ArgAction::Set)
    )]
    pub gc: bool,
    /// The metadata server's settings.
    #[cfg_attr(feature = "cli", arg(skip))]
    pub mds: MdsConfig,
    /// Hash seed (stored in the descriptor).
    #[cfg_attr(feature = "cli", arg(skip = CloverConfig::default().seed))]
    pub seed: u64,
    /// How long an operation keeps retrying before it gives up.
    #[cfg_attr(feature = "cli", arg(skip))]
    pub retry: RetryPolicy,
}

impl Default for CloverConfig {
    fn default() -> Self {
        Self {
            max_key: 64,
            max_value: 1024,
            dir_slots: 1 << 16,
            pool_slots: 1 << 14,
            cache_entries: 1 << 16,
            grace: 100_000_000,
            chunk_bytes: 1 << 20,
            alloc_batch: 64,
            chase_limit: 4,
            shortcut: true,
            shortcut_first: true,
            shared_hints: true,
            gc: true,
            mds: MdsConfig::default(),
            seed: 0xC10E_5EED,
            retry: RetryPolicy::default(),
        }
    }
}

impl IndexConfig for CloverConfig {
    /// Limits for the shape's keys and values, and a directory of twice
    /// the keys (at least 1,024 entries; linear probing stays short at
    /// half load).
    fn fit(&mut self, shape: &Shape) {
        self.max_key = shape.max_key.max(8);
        self.max_value = shape.max_value.max(8);
        self.dir_slots = (shape.keys * 2).max(1024).next_power_of_two();
    }

    fn key_limits(&self) -> (usize, usize) {
        (1, self.max_key)
    }

    fn max_value(&self) -> usize {
        self.max_value
    }

    /// Three versions per key (writes append; the metadata server
    /// reclaims behind), the directory and pool, two chunks per client and
    /// 64 MiB of slack.
    fn memory_estimate(&self, shape: &Shape) -> u64 {
        let block = block_bytes(shape.max_key.max(8), shape.max_value.max(8)) as u64;
        let dir = (shape.keys * 2).max(1024).next_power_of_two() * DIR_ENTRY;
        3 * shape.keys * block
            + dir
            + POOL_HEADER
            + 8 * self.pool_slots
            + shape.clients as u64 * 2 * self.chunk_bytes
            + (64 << 20)
    }
}

impl CloverConfig {
    fn validate(&self) -> Result<(), IndexError> {
        let bad = |s: String| Err(IndexError::config(KIND, s));
        if self.max_key == 0 || self.max_key > u16::MAX as usize {
            return bad(format!("max_key {} must be in 1..=65535", self.max_key));
        }
        if self.max_value > 1 << 20 {
            return bad(format!("max_value {} exceeds 1 MiB", self.max_value));
        }
        if !self.dir_slots.is_power_of_two()
            || self.dir_slots < PROBE_WINDOW
            || self.dir_slots > MAX_KEY_ID
        {
            return bad(format!(
                "dir_slots {} must be a power of two in {PROBE_WINDOW}..=2^48",
                self.dir_slots
            ));
        }
        if !self.pool_slots.is_power_of_two() || self.pool_slots < 64 {
            return bad(format!(
                "pool_slots {} must be a power of two of at least 64",
                self.pool_slots
            ));
        }
        if self.grace < 1_000 {
            return bad(format!("grace {} ns is below 1 µs", self.grace));
        }
        if self.alloc_batch == 0 || self.alloc_batch > 1024 {
            return bad(format!(
                "alloc_batch {} must be in 1..=1024",
                self.alloc_batch
            ));
        }
        if (self.chunk_bytes as usize) < self.block_bytes() {
            return bad(format!(
                "chunk_bytes {} holds no version of {} B",
                self.chunk_bytes,
                self.block_bytes()
            ));
        }
        Ok(())
    }

    /// Bytes of a version block.
    pub fn block_bytes(&self) -> usize {
        block_bytes(self.max_key, self.max_value)
    }

    /// Bytes a reader fetches of a version (the length the switch
    /// recognises Clover's READs by).
    pub fn read_bytes(&self) -> usize {
        read_bytes(self.max_key, self.max_value)
    }
}

/// The embedded metadata server: a thread running [`Mds`] on a worker of
/// its own, stopped when the handle is destroyed or dropped.
struct MdsThread {
    stop: Arc<AtomicBool>,
    join: Option<std::thread::JoinHandle<()>>,
}

impl MdsThread {
    fn stop(&mut self) {
        self.stop.store(true, Ordering::Release);
        if let Some(j) = self.join.take() {
            // (The thread itself may drop the store's last handle: it
            // cannot wait for itself.)
            if j.thread().id() != std::thread::current().id() {
                let _ = j.join();
            }
        }
    }
}

impl Drop for MdsThread {
    fn drop(&mut self) {
        self.stop();
    }
}

/// A store: what every client of it shares. `Send + Sync`; make one
/// [`CloverClient`] per worker with [`RemoteMap::client`].
pub struct CloverKv {
    pub(crate) home: Home,
    pub(crate) cfg: CloverConfig,
    pub(crate) dir: GlobalAddr,
    pub(crate) pool_at: GlobalAddr,
    pub(crate) scratch: Scratch,
    layout: LocalLayout,
    mds_thread: Mutex<Option<MdsThread>>,
    /// The metadata server's counters (also when it runs elsewhere in
    /// this process: a virtual thread on the simulator).
    pub(crate) mds_stats: Arc<MdsStats>,
    /// Versions this process's clients linked (for the chain checker).
    pub(crate) linked: Arc<AtomicU64>,
    /// Each compute machine's shared hint cache (`shared_hints`).
    hints: PerMachine<Mutex<HintCache>>,
    /// Each live client's counters of its operations begun at or after
    /// `phases_from`, and the sum of those of the clients gone.
    windows: Mutex<(Vec<Arc<Mutex<CloverCounters>>>, CloverCounters)>,
    /// See [`CloverKv::count_phases_from`].
    pub(crate) phases_from: AtomicU64,
}

impl CloverKv {
    fn assemble(home: Home, cfg: CloverConfig, dir: GlobalAddr, pool_at: GlobalAddr) -> Self {
        let (scratch, layout) = Scratch::declare(&cfg);
        Self {
            home,
            cfg,
            dir,
            pool_at,
            scratch,
            layout,
            mds_thread: Mutex::new(None),
            mds_stats: Arc::default(),
            linked: Arc::default(),
            hints: PerMachine::default(),
            windows: Mutex::default(),
            phases_from: AtomicU64::new(0),
        }
    }

    /// The reference to `addr` (its node's key attached).
    #[inline]
    pub(crate) fn remote(&self, addr: GlobalAddr) -> Result<RemoteRef, IndexError> {
        self.home.remote(addr)
    }

    /// Directory entry `slot`.
    pub(crate) fn entry(&self, slot: u64) -> Result<RemoteRef, IndexError> {
        self.remote(self.dir.add(DIR_ENTRY * slot))
    }

    /// The free-block pool.
    pub(crate) fn pool(&self) -> Result<Pool, IndexError> {
        Ok(Pool {
            at: self.remote(self.pool_at)?,
            slots: self.cfg.pool_slots,
        })
    }

    /// The store's home (fabric, nodes, keys).
    pub fn home(&self) -> &Home {
        &self.home
    }

    /// The directory's address (the chain checker and the switch's
    /// control plane read it).
    pub fn directory(&self) -> GlobalAddr {
        self.dir
    }

    /// The metadata server of this store, to run on a worker of the
    /// caller's choosing (a virtual thread on the simulator; `dmkit
    /// clover-mds`). Only one may run per store.
    pub fn mds(self: &Arc<Self>) -> Mds {
        Mds::new(self.clone(), self.cfg.mds, self.mds_stats.clone())
    }

    /// The metadata server's counters in this process.
    pub fn mds_stats(&self) -> crate::mds::MdsCounters {
        self.mds_stats.snapshot()
    }

    /// The counters of every client this handle made, summed: the time and
    /// verbs of Clover's operations by phase, for a run's breakdown. Only
    /// operations that completed and began at or after
    /// [`CloverKv::count_phases_from`]'s instant count.
    pub fn phase_counters(&self) -> CloverCounters {
        let windows = self.windows.lock().unwrap_or_else(|p| p.into_inner());
        let mut sum = windows.1;
        for w in &windows.0 {
            sum.add(&w.lock().unwrap_or_else(|p| p.into_inner()));
        }
        sum
    }

    /// From now on [`CloverKv::phase_counters`] counts only operations
    /// that begin at or after `at` (ns of the clients' clocks: a
    /// benchmark's measured window).
    /// Forgets what was counted so far.
    pub fn count_phases_from(&self, at: Nanos) {
        self.phases_from.store(at, Ordering::Relaxed);
        let mut windows = self.windows.lock().unwrap_or_else(|p| p.into_inner());
        windows.1 = CloverCounters::default();
        for w in &windows.0 {
            *w.lock().unwrap_or_else(|p| p.into_inner()) = CloverCounters::default();
        }
    }

    /// Versions this process's clients linked into chains (a chain's first
    /// version included).
    pub fn linked_versions(&self) -> u64 {
        self.linked.load(Ordering::Relaxed)
    }

    /// The key ids (directory entries) of `keys`, `None` for a key without
    /// a chain, read synchronously from a store nobody changes meanwhile
    /// (what a switch's control plane installs for partial steering).
    pub fn key_ids(&self, keys: &[Vec<u8>]) -> Result<Vec<Option<u64>>, IndexError> {
        let home = self.home.home();
        let rk = self.home.rkey(home)?;
        let mut qp = self.home.sync_qp(home, 1 << 12)?;
        let slots = self.cfg.dir_slots;
        let mut out = Vec::with_capacity(keys.len());
        for key in keys {
            let h = crate::hint::KeyHash::of(key, self.cfg.seed);
            let mut found = None;
            let mut probed = 0;
            'probe: while probed < slots {
                let from = (h.h1 + probed) & (slots - 1);
                let n = PROBE_WINDOW.min(slots - from);
                let w = qp.read(self.dir.add(DIR_ENTRY * from), rk, (n * DIR_ENTRY) as usize)?;
                for i in 0..n as usize {
                    let (e, _) =
                        DirEntry::read_from_prefix(&w[i * DIR_ENTRY as usize..]).map_err(|_| {
                            IndexError::Corrupt {
                                addr: self.dir,
                                what: "clover directory entry",
                            }
                        })?;
                    if !e.used() {
                        break 'probe;
                    }
                    if e.fp() != h.fp() {
                        continue;
                    }
                    // In two pieces: a whole version's READ is what a
                    // steering switch would move.
                    let at = e.head_addr();
                    let mut b = qp.read(at, rk, HEADER)?;
                    b.extend(qp.read(at.add(HEADER as u64), rk, self.cfg.read_bytes() - HEADER)?);
                    if Version::decode(&b).is_some_and(|v| v.key == *key) {
                        found = Some(from + i as u64);
                        break 'probe;
                    }
                }
                probed += n;
            }
            out.push(found);
        }
        Ok(out)
    }

    /// Starts the embedded metadata server thread (once).
    fn start_mds_thread(self: &Arc<Self>) -> Result<(), IndexError> {
        let mut slot = self.mds_thread.lock().unwrap_or_else(|p| p.into_inner());
        if slot.is_some() {
            return Ok(());
        }
        let stop = Arc::new(AtomicBool::new(false));
        let mds = self.mds();
        let (s, fabric) = (stop.clone(), self.home.fabric().clone());
        let layout = mds.local_layout().clone();
        let join = std::thread::Builder::new()
            .name("clover-mds".into())
            .spawn(move || {
                let Ok(mut w) = dmkit_runtime::Worker::builder(fabric.as_ref())
                    .tasks(1)
                    .local(&layout)
                    .build()
                else {
                    return;
                };
                // Another server runs this store: nothing to do here.
                if mds.spawn(&mut w, s).is_ok() {
                    w.run();
                }
            })
            .map_err(|e| IndexError::config(KIND, format!("starting the metadata server: {e}")))?;
        *slot = Some(MdsThread {
            stop,
            join: Some(join),
        });
        Ok(())
    }

    /// Stops the embedded metadata server thread, if it runs.
    pub fn stop_mds(&self) {
        if let Some(mut t) = self
            .mds_thread
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .take()
        {
            t.stop();
        }
    }
}

impl Drop for CloverKv {
    fn drop(&mut self) {
        self.stop_mds();
    }
}

impl RemoteMap for CloverKv {
    const KIND: &'static str = KIND;
    const ORDERED: bool = false;
    type Config = CloverConfig;
    type Client = CloverClient;

    /// Creates store `name`: descriptor, directory and pool on the lowest
    /// memory node, registered as a named root; starts the metadata server
    /// thread if `cfg.gc`. Nothing is left behind if it fails.
    fn create(
        fabric: Arc<dyn Fabric>,
        name: &str,
        cfg: CloverConfig,
    ) -> Result<Arc<Self>, IndexError> {
        cfg.validate()?;
        let mut c = Creation::begin(fabric, KIND, name, &["mds"])?;
        let home = c.home();
        let desc = c.alloc(home, 64, "allocating the descriptor")?;
        let dir = c.alloc(home, cfg.dir_slots * DIR_ENTRY, "allocating the directory")?;
        let pool = c.alloc(
            home,
            POOL_HEADER + 8 * cfg.pool_slots,
            "allocating the pool",
        )?;
        // Fresh chunks are zero: an empty directory and an empty pool.
        c.write(pool, crate::pool::empty_header().as_bytes())?;
        let d = Descriptor {
            magic: DESC_MAGIC.word(),
            limits: Descriptor::pack_limits(cfg.max_key, cfg.max_value),
            dir: dir.raw(),
            dir_slots: cfg.dir_slots,
            pool: pool.raw(),
            pool_slots: cfg.pool_slots,
            grace: cfg.grace,
            seed: cfg.seed,
        };
        c.write(desc, d.as_bytes())?;
        let home = c.publish(desc)?;
        let gc = cfg.gc;
        let kv = Arc::new(Self::assemble(home, cfg, dir, pool));
        if gc {
            kv.start_mds_thread()?;
        }
        Ok(kv)
    }

    /// Opens store `name`. Structural settings (limits, directory, pool,
    /// grace, seed) come from the store; `cfg` supplies the client-side
    /// ones. Starts a metadata server thread if `cfg.gc` (only one may run
    /// per store: open with `gc` off while another process runs it).
    fn open(
        fabric: Arc<dyn Fabric>,
        name: &str,
        cfg: CloverConfig,
    ) -> Result<Arc<Self>, IndexError> {
        let (home, bytes) = dmkit_index::lifecycle::open(
            fabric,
            KIND,
            name,
            DESC_MAGIC,
            std::mem::size_of::<Descriptor>(),
        )?;
        let at = home.desc();
        let corrupt = || IndexError::Corrupt {
            addr: at,
            what: "clover descriptor",
        };
        let (d, _) = Descriptor::read_from_prefix(&bytes).map_err(|_| corrupt())?;
        let (max_key, max_value) = Descriptor::unpack_limits(d.limits);
        let cfg = CloverConfig {
            max_key,
            max_value,
            dir_slots: d.dir_slots,
            pool_slots: d.pool_slots,
            grace: d.grace,
            seed: d.seed,
            ..cfg
        };
        cfg.validate().map_err(|_| corrupt())?;
        let gc = cfg.gc;
        let kv = Arc::new(Self::assemble(
            home,
            cfg,
            GlobalAddr::from_raw(d.dir),
            GlobalAddr::from_raw(d.pool),
        ));
        if gc {
            kv.start_mds_thread()?;
        }
        Ok(kv)
    }

    /// Drops this handle's hold on the store; the last holder's drop (or
    /// death) frees all of its memory, whichever process took it, and its
    /// name (see `dmkit_index::lifecycle`). No client of this handle may
    /// use the store afterwards.
    /// This process's metadata server thread stops first.
    fn destroy(&self) -> Result<(), IndexError> {
        self.stop_mds();
        self.home.destroy()
    }

    /// A client for one worker on compute machine `machine` (its tasks
    /// share the client's blocks, and its hint cache, which is the
    /// machine's with `shared_hints`). `id` distinguishes writers in
    /// version birth ids.
    fn client_on(self: &Arc<Self>, machine: usize, id: u64) -> CloverClient {
        let hints = if self.cfg.shared_hints {
            Hints::Machine(self.hints.get(machine, || {
                Mutex::new(HintCache::new(self.cfg.cache_entries))
            }))
        } else {
            Hints::Own(HintCache::new(self.cfg.cache_entries))
        };
        let window = Arc::<Mutex<CloverCounters>>::default();
        {
            let mut windows = self.windows.lock().unwrap_or_else(|p| p.into_inner());
            let (live, gone) = &mut *windows;
            // (The windows of clients gone fold into one sum.)
            live.retain(|w| {
                let keep = Arc::strong_count(w) > 1;
                if !keep {
                    gone.add(&w.lock().unwrap_or_else(|p| p.into_inner()));
                }
                keep
            });
            live.push(window.clone());
        }
        CloverClient::new(self.clone(), ClientState::new(&self.cfg, id, hints, window))
    }

    fn local_layout(&self) -> &LocalLayout {
        &self.layout
    }

    fn config(&self) -> &CloverConfig {
        &self.cfg
    }

    fn name(&self) -> &str {
        self.home.name()
    }
}
