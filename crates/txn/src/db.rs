//! The database: tables of fixed-size records in remote memory, each with
//! a hash index, sharded over the memory nodes and replicated
//! primary-backup; its descriptor's lifecycle; loading; and the checks
//! tests and benchmarks run on a quiescent database.
//!
//! ## Placement
//!
//! A table is `buckets` buckets of `slots_per_bucket` record slots. Key
//! `k` hashes to bucket `h`; its record lives in the first slot of buckets
//! `h, h+1, …` (at most `max_probe` of them) that holds `k`, or else in the
//! first empty one (open addressing; keys never move and slots are never
//! emptied: a delete marks the record absent, and so does a roll-back of
//! an insert — see `txn`, "Probe paths without holes"). Bucket `b` belongs to shard
//! `b mod n` (n memory nodes); shard `s` has its primary on node `s` and
//! its backups on nodes `s+1, …, s+replicas−1` (mod n), each replica one
//! chunk with the same layout, so a record is at the same offset in every
//! replica. (FORD keeps a whole table on one primary; sharding spreads
//! every table's load over the nodes, as the placement of SMART's
//! evaluation with two memory blades needs.)
//!
//! The catalog (every table's shards and replicas, the logs' chunks) is
//! the descriptor's tail, so another process opens the database by name.

use std::sync::Arc;

use dmkit_fabric::{Fabric, GlobalAddr, NodeId, RemoteRef, SyncQp};
use dmkit_index::lifecycle::{self, Creation, Home, Magic};
use dmkit_index::LeaseConfig;
use dmkit_runtime::{Local, LocalLayout};
use zerocopy::{FromBytes, IntoBytes};

use crate::error::TxnError;
use crate::layout::{self, DbHeader, RecordTail, Version};

/// The descriptor kind (root `txn/NAME`).
pub const KIND: &str = "txn";
/// The descriptor's magic: kind tag and layout version.
pub const MAGIC: Magic = Magic::new(b"dmTXN1", 1);

/// A table's index in the database's schema.
pub type TableId = u16;

/// A table of the schema.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TableSpec {
    /// Name (reports).
    pub name: String,
    /// Payload bytes of a record (rounded up to a multiple of 8).
    pub payload: usize,
    /// Records the table must hold, inserts included.
    pub capacity: u64,
}

impl TableSpec {
    /// A table named `name` of `capacity` records of `payload` bytes.
    pub fn new(name: &str, payload: usize, capacity: u64) -> TableSpec {
        TableSpec {
            name: name.into(),
            payload,
            capacity,
        }
    }
}

/// The database's structure (fixed at creation) and its clients'
/// switches: FORD's techniques, each a switch (FORD, FAST'22 §4).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TxnConfig {
    /// Copies of every record: a primary and `replicas − 1` backups (at
    /// most the number of memory nodes). Structure.
    pub replicas: usize,
    /// Record slots per hash bucket. Structure.
    pub slots_per_bucket: usize,
    /// Buckets a key's slot is searched in. Structure.
    pub max_probe: usize,
    /// Coordinators (transaction clients) the database allows; each has
    /// an undo log. Structure.
    pub max_coordinators: u32,
    /// Bytes of a coordinator's undo log. Structure.
    pub log_bytes: usize,
    /// Records one transaction may touch. Structure.
    pub max_items: usize,
    /// Hitchhiked locking: the CAS locking a written record and the READ
    /// of the record go in one doorbell during execution. Off: records
    /// to write are read during execution and locked (with a READ of
    /// their version) during validation.
    pub hitchhike: bool,
    /// Read-only records are read from a backup replica (validation still
    /// reads the primary's lock and version).
    pub backup_reads: bool,
    /// Coalescent commit: the commit writes of the primary and every
    /// backup in one round trip. Off: backups first, then primaries.
    pub coalescent_commit: bool,
    /// The address cache also remembers keys a probe found absent, with
    /// the empty slot each would go to: reading such a key again READs
    /// only that slot's lock and version (16 bytes) instead of its bucket
    /// (`slots_per_bucket` records), and probes again if the slot was
    /// taken since. Not one of FORD's techniques (FORD's address cache
    /// holds found records only, as SMART-DTX's): off where the
    /// simulator reproduces them.
    pub cache_absent: bool,
    /// Leases of the record locks and logs.
    pub lease: LeaseConfig,
}

impl Default for TxnConfig {
    fn default() -> Self {
        Self {
            replicas: 2,
            slots_per_bucket: 4,
            max_probe: 16,
            max_coordinators: 4096,
            log_bytes: 8192,
            max_items: 64,
            hitchhike: true,
            backup_reads: true,
            coalescent_commit: true,
            cache_absent: true,
            lease: LeaseConfig::default(),
        }
    }
}

impl TxnConfig {
    fn validate(&self) -> Result<(), TxnError> {
        let bad = |s: &str| Err(TxnError::Config(s.into()));
        if self.replicas == 0 || self.slots_per_bucket == 0 || self.max_probe == 0 {
            return bad("replicas, slots_per_bucket and max_probe must be at least 1");
        }
        if self.max_coordinators == 0 || self.max_coordinators > 65_535 {
            return bad("max_coordinators must be in 1..=65535 (lock owners are 16-bit)");
        }
        if self.max_items == 0 || self.log_bytes < 32 || !self.log_bytes.is_multiple_of(8) {
            return bad("max_items ≥ 1; log_bytes ≥ 32 and a multiple of 8");
        }
        self.lease.validate().map_err(TxnError::Config)
    }
}

/// A table as the database lays it out.
#[derive(Debug, Clone)]
pub(crate) struct TableInfo {
    pub(crate) name: String,
    pub(crate) payload: usize,
    pub(crate) rec: usize,
    pub(crate) buckets: u64,
    pub(crate) capacity: u64,
    /// Chunk of shard `s`, replica `r`: `bases[s][r]` (replica 0 primary).
    pub(crate) bases: Vec<Vec<GlobalAddr>>,
}

impl TableInfo {
    pub(crate) fn shards(&self) -> u64 {
        self.bases.len() as u64
    }
    pub(crate) fn slots(&self, spb: usize) -> u64 {
        self.buckets * spb as u64
    }
    fn shard_bytes(&self, spb: usize) -> u64 {
        self.buckets / self.shards() * spb as u64 * self.rec as u64
    }
}

/// Task-local memory of a coordinator (declared once; see
/// [`Database::local_layout`]).
#[derive(Debug, Clone, Copy)]
pub(crate) struct TxnLocal {
    /// One record per item (max record size each).
    pub(crate) rec: Local,
    /// Bucket reads of one probe round.
    pub(crate) bkt: Local,
    /// Validation reads: lock and version per item.
    pub(crate) hdr: Local,
    /// The undo log image.
    pub(crate) log: Local,
    /// Dirty version words of the commit writes, one per item.
    pub(crate) ver: Local,
    /// Clean version words of the unlock writes, one per item.
    pub(crate) unl: Local,
    /// A zero word (unlocks, log clears).
    pub(crate) zero: Local,
}

/// Buckets read per probe round.
pub(crate) const PROBE_ROUND: usize = 8;

/// An open database.
pub struct Database {
    pub(crate) home: Home,
    pub(crate) cfg: TxnConfig,
    pub(crate) tables: Vec<TableInfo>,
    /// Memory nodes, sorted.
    pub(crate) nodes: Vec<NodeId>,
    /// Log chunk of each node (by index in `nodes`).
    pub(crate) log_bases: Vec<GlobalAddr>,
    /// Reads see words in ascending address order.
    pub(crate) in_order: bool,
    pub(crate) max_rec: usize,
    pub(crate) layout: LocalLayout,
    pub(crate) local: TxnLocal,
}

impl std::fmt::Debug for Database {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Database")
            .field("name", &self.home.name())
            .field("tables", &self.tables.len())
            .field("nodes", &self.nodes)
            .finish()
    }
}

/// A record of a quiescent table (the checks' view).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Row {
    /// Slot number in the table.
    pub slot: u64,
    /// Key.
    pub key: u64,
    /// Payload.
    pub payload: Vec<u8>,
    /// Version word.
    pub version: Version,
    /// Primary's lock word.
    pub lock: u64,
}

fn words_of(bytes: &[u8]) -> Vec<u64> {
    bytes
        .chunks_exact(8)
        .map(|c| u64::from_le_bytes(c.try_into().expect("8 bytes")))
        .collect()
}

impl Database {
    /// Creates database `name` with tables `tables` on `fabric`'s memory
    /// nodes (empty: load them with [`Database::load`]).
    pub fn create(
        fabric: Arc<dyn Fabric>,
        name: &str,
        cfg: TxnConfig,
        tables: &[TableSpec],
    ) -> Result<Arc<Database>, TxnError> {
        cfg.validate()?;
        if tables.is_empty() || tables.len() > u16::MAX as usize {
            return Err(TxnError::Config("a database has 1..=65535 tables".into()));
        }
        let mut c = Creation::begin(fabric, KIND, name, &[])?;
        let nodes = c.nodes().to_vec();
        let n = nodes.len();
        if cfg.replicas > n {
            return Err(TxnError::Config(format!(
                "{} replicas need as many memory nodes; the fabric has {n}",
                cfg.replicas
            )));
        }
        let spb = cfg.slots_per_bucket as u64;
        let mut infos = Vec::new();
        for t in tables {
            if t.capacity == 0 || t.payload == 0 || t.payload > 1 << 20 {
                return Err(TxnError::Config(format!(
                    "table {}: capacity ≥ 1 and payload in 1..=1 MiB",
                    t.name
                )));
            }
            let payload = t.payload.next_multiple_of(8);
            // Half full at capacity, at least a bucket per shard.
            let buckets = (t.capacity * 2)
                .div_ceil(spb)
                .max(n as u64)
                .next_multiple_of(n as u64);
            let mut info = TableInfo {
                name: t.name.clone(),
                payload,
                rec: layout::record_bytes(payload),
                buckets,
                capacity: t.capacity,
                bases: Vec::new(),
            };
            let bytes = buckets / n as u64 * spb * info.rec as u64;
            for s in 0..n {
                let mut reps = Vec::new();
                for r in 0..cfg.replicas {
                    reps.push(c.alloc(nodes[(s + r) % n], bytes, "a table shard")?);
                }
                info.bases.push(reps);
            }
            infos.push(info);
        }
        let log_bytes = cfg.max_coordinators as u64 * cfg.log_bytes as u64;
        let mut log_bases = Vec::new();
        for &node in &nodes {
            log_bases.push(c.alloc(node, log_bytes, "the undo logs")?);
        }
        let catalog = encode_catalog(&cfg, &nodes, &log_bases, &infos);
        let header = DbHeader {
            magic: MAGIC.word(),
            next_coordinator: 1,
            catalog_words: catalog.len() as u64,
        };
        let desc_len = 24 + 8 * catalog.len() as u64;
        let desc = c.alloc(c.home(), desc_len, "the database descriptor")?;
        let mut bytes = header.as_bytes().to_vec();
        bytes.extend(catalog.iter().flat_map(|w| w.to_le_bytes()));
        c.write(desc, &bytes)?;
        let home = c.publish(desc)?;
        Ok(Arc::new(Database::make(
            home, cfg, nodes, log_bases, infos,
        )?))
    }

    /// Opens database `name`; its structure comes from the descriptor,
    /// the client switches (hitchhiking, backup reads, coalescent commit,
    /// absent keys in the address cache, lease) from `cfg`.
    pub fn open(
        fabric: Arc<dyn Fabric>,
        name: &str,
        cfg: TxnConfig,
    ) -> Result<Arc<Database>, TxnError> {
        let (home, head) = lifecycle::open(fabric, KIND, name, MAGIC, 24)?;
        let header = DbHeader::read_from_bytes(&head[..24]).expect("24 bytes");
        let words = header.catalog_words as usize;
        let mut qp = home.sync_qp(home.home(), 24 + 8 * words)?;
        let rk = home.rkey(home.home())?;
        let bytes = qp.read(home.desc().add(24), rk, 8 * words)?;
        let (structure, nodes, log_bases, infos) =
            decode_catalog(&words_of(&bytes)).ok_or(TxnError::Corrupt {
                addr: home.desc(),
                what: "database catalog",
            })?;
        if nodes != home.nodes() {
            return Err(TxnError::Config(format!(
                "the database lives on memory nodes {nodes:?}; this fabric has {:?}",
                home.nodes()
            )));
        }
        let cfg = TxnConfig {
            replicas: structure.replicas,
            slots_per_bucket: structure.slots_per_bucket,
            max_probe: structure.max_probe,
            max_coordinators: structure.max_coordinators,
            log_bytes: structure.log_bytes,
            max_items: structure.max_items,
            ..cfg
        };
        cfg.validate()?;
        Ok(Arc::new(Database::make(
            home, cfg, nodes, log_bases, infos,
        )?))
    }

    fn make(
        home: Home,
        cfg: TxnConfig,
        nodes: Vec<NodeId>,
        log_bases: Vec<GlobalAddr>,
        tables: Vec<TableInfo>,
    ) -> Result<Database, TxnError> {
        let max_rec = tables.iter().map(|t| t.rec).max().unwrap_or(32);
        let mut layout = LocalLayout::new();
        let local = TxnLocal {
            rec: layout.region("txn records", cfg.max_items * max_rec),
            bkt: layout.region("txn buckets", PROBE_ROUND * cfg.slots_per_bucket * max_rec),
            hdr: layout.region("txn validation", cfg.max_items * 16),
            log: layout.region("txn undo log", cfg.log_bytes),
            ver: layout.region("txn dirty versions", cfg.max_items * 8),
            unl: layout.region("txn clean versions", cfg.max_items * 8),
            zero: layout.region("txn zero", 8),
        };
        let in_order = home.fabric().caps().in_order_write;
        Ok(Database {
            home,
            cfg,
            tables,
            nodes,
            log_bases,
            in_order,
            max_rec,
            layout,
            local,
        })
    }

    /// Drops this handle's hold on the database; the last holder's drop
    /// (or death) frees its root, tables, logs and descriptor (see
    /// `dmkit_index::lifecycle`).
    pub fn destroy(&self) -> Result<(), TxnError> {
        Ok(self.home.destroy()?)
    }

    /// The task-local memory a coordinator needs (give it to
    /// `WorkerBuilder::local`).
    pub fn local_layout(&self) -> &LocalLayout {
        &self.layout
    }

    /// The configuration (structure from the descriptor).
    pub fn config(&self) -> &TxnConfig {
        &self.cfg
    }

    /// The fabric.
    pub fn fabric(&self) -> &Arc<dyn Fabric> {
        self.home.fabric()
    }

    /// Number of tables.
    pub fn table_count(&self) -> usize {
        self.tables.len()
    }

    /// A table's name.
    pub fn table_name(&self, t: TableId) -> Result<&str, TxnError> {
        Ok(&self.table(t)?.name)
    }

    /// A table's payload bytes.
    pub fn payload_bytes(&self, t: TableId) -> Result<usize, TxnError> {
        Ok(self.table(t)?.payload)
    }

    pub(crate) fn table(&self, t: TableId) -> Result<&TableInfo, TxnError> {
        self.tables.get(t as usize).ok_or(TxnError::UnknownTable(t))
    }

    /// Bucket of `key` in table `t`.
    pub(crate) fn home_bucket(&self, t: &TableInfo, id: TableId, key: u64) -> u64 {
        let h = dmkit_runtime::hash::fmix64(key ^ (id as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15));
        h % t.buckets
    }

    /// Shard of bucket `b`.
    fn shard_of(&self, t: &TableInfo, b: u64) -> usize {
        (b % t.shards()) as usize
    }

    /// The address of byte `at` of bucket `b`'s first slot in replica `r`.
    pub(crate) fn bucket_addr(&self, t: &TableInfo, b: u64, r: usize) -> GlobalAddr {
        let spb = self.cfg.slots_per_bucket as u64;
        let s = self.shard_of(t, b);
        let local = b / t.shards();
        t.bases[s][r].add(local * spb * t.rec as u64)
    }

    /// The address of slot `slot` in replica `r`.
    pub(crate) fn slot_addr(&self, t: &TableInfo, slot: u64, r: usize) -> GlobalAddr {
        let spb = self.cfg.slots_per_bucket as u64;
        self.bucket_addr(t, slot / spb, r)
            .add((slot % spb) * t.rec as u64)
    }

    /// A reference to `addr` with its node's key.
    pub(crate) fn remote(&self, addr: GlobalAddr) -> Result<RemoteRef, TxnError> {
        Ok(self.home.remote(addr)?)
    }

    /// The lock word of slot `slot` (on its primary, the only copy that
    /// is ever locked).
    pub(crate) fn lock_ref(&self, t: &TableInfo, slot: u64) -> Result<RemoteRef, TxnError> {
        self.remote(
            self.slot_addr(t, slot, 0)
                .add(crate::layout::lock_offset(t.payload) as u64),
        )
    }

    /// The node holding replica `r` of slot `slot`.
    pub(crate) fn replicas(&self) -> usize {
        self.cfg.replicas
    }

    /// Where copy `k` of coordinator `id`'s log lives.
    pub(crate) fn log_addr(&self, id: u16, k: usize) -> GlobalAddr {
        let n = self.nodes.len();
        let i = (id as usize + k) % n;
        self.log_bases[i].add((id as u64 - 1) * self.cfg.log_bytes as u64)
    }

    /// Takes a fresh coordinator id (FAA on the descriptor; ids are
    /// never reused: a dead coordinator's log keeps its id).
    pub fn take_coordinator_id(&self) -> Result<u16, TxnError> {
        let mut qp = self.home.sync_qp(self.home.home(), 64)?;
        let rk = self.home.rkey(self.home.home())?;
        let id = qp.faa(self.home.desc().add(8), rk, 1)?;
        if id == 0 || id > self.cfg.max_coordinators as u64 {
            return Err(TxnError::NoCoordinator(self.cfg.max_coordinators));
        }
        Ok(id as u16)
    }

    /// Coordinator ids handed out so far (the recovery pass looks at
    /// their logs).
    pub fn coordinators_taken(&self) -> Result<u16, TxnError> {
        let mut qp = self.home.sync_qp(self.home.home(), 64)?;
        let rk = self.home.rkey(self.home.home())?;
        let next = qp.read_u64(self.home.desc().add(8), rk)?;
        Ok((next.saturating_sub(1)).min(self.cfg.max_coordinators as u64) as u16)
    }

    fn sync_qps(&self) -> Result<Vec<SyncQp>, TxnError> {
        let max = self.fabric().caps().max_message.clamp(4096, 1 << 20);
        self.nodes
            .iter()
            .map(|&n| self.home.sync_qp(n, max).map_err(TxnError::from))
            .collect()
    }

    fn qp_index(&self, node: NodeId) -> usize {
        self.nodes
            .iter()
            .position(|&n| n == node)
            .expect("a node of the database")
    }

    /// Reads `len` bytes at `at` in pieces the backend takes.
    fn read_big(&self, qps: &mut [SyncQp], at: GlobalAddr, len: u64) -> Result<Vec<u8>, TxnError> {
        let max = self.fabric().caps().max_message.clamp(4096, 1 << 20) as u64;
        let rk = self.home.rkey(at.node())?;
        let qp = &mut qps[self.qp_index(at.node())];
        let mut out = Vec::with_capacity(len as usize);
        let mut from = 0;
        while from < len {
            let n = (len - from).min(max);
            out.extend(qp.read(at.add(from), rk, n as usize)?);
            from += n;
        }
        Ok(out)
    }

    fn write_big(&self, qps: &mut [SyncQp], at: GlobalAddr, bytes: &[u8]) -> Result<(), TxnError> {
        let max = self.fabric().caps().max_message.clamp(4096, 1 << 20);
        let rk = self.home.rkey(at.node())?;
        let qp = &mut qps[self.qp_index(at.node())];
        for (i, piece) in bytes.chunks(max).enumerate() {
            qp.write(at.add((i * max) as u64), rk, piece)?;
        }
        Ok(())
    }

    /// Loads table `t` with `rows` (key, payload), replacing what it held
    /// (control path: the table must not be in use). Each record gets
    /// version 1. Payloads shorter than the record are zero-padded.
    pub fn load(
        &self,
        t: TableId,
        rows: impl IntoIterator<Item = (u64, Vec<u8>)>,
    ) -> Result<u64, TxnError> {
        let info = self.table(t)?.clone();
        let spb = self.cfg.slots_per_bucket as u64;
        let shard_bytes = info.shard_bytes(self.cfg.slots_per_bucket) as usize;
        let mut images = vec![vec![0u8; shard_bytes]; info.bases.len()];
        let mut n = 0u64;
        for (key, payload) in rows {
            if payload.len() > info.payload {
                return Err(TxnError::ValueTooLarge {
                    table: t,
                    len: payload.len(),
                    max: info.payload,
                });
            }
            let h = self.home_bucket(&info, t, key);
            let mut placed = false;
            'probe: for p in 0..self.cfg.max_probe as u64 {
                let b = (h + p) % info.buckets;
                let s = self.shard_of(&info, b);
                let base = ((b / info.shards()) * spb) as usize * info.rec;
                for j in 0..spb as usize {
                    let at = base + j * info.rec;
                    let img = &mut images[s][at..at + info.rec];
                    let v = u64::from_le_bytes(
                        img[layout::version_offset(info.payload)..][..8]
                            .try_into()
                            .expect("8 bytes"),
                    );
                    let k = u64::from_le_bytes(img[..8].try_into().expect("8 bytes"));
                    if v != 0 && k == key {
                        return Err(TxnError::Config(format!(
                            "table {}: key {key} loaded twice",
                            info.name
                        )));
                    }
                    if v == 0 {
                        img[..8].copy_from_slice(&key.to_le_bytes());
                        img[8..8 + payload.len()].copy_from_slice(&payload);
                        let tail = RecordTail {
                            lock: 0,
                            version: Version::make(1, false).0,
                        };
                        img[layout::lock_offset(info.payload)..].copy_from_slice(tail.as_bytes());
                        placed = true;
                        break 'probe;
                    }
                }
            }
            if !placed {
                return Err(TxnError::Full {
                    table: t,
                    key,
                    probe: self.cfg.max_probe,
                });
            }
            n += 1;
        }
        let mut qps = self.sync_qps()?;
        for (s, img) in images.iter().enumerate() {
            for &base in &info.bases[s] {
                self.write_big(&mut qps, base, img)?;
            }
        }
        Ok(n)
    }

    /// Every non-empty record of table `t` as its primary holds it
    /// (control path, for checks on a quiescent database).
    pub fn scan(&self, t: TableId) -> Result<Vec<Row>, TxnError> {
        let info = self.table(t)?;
        let spb = self.cfg.slots_per_bucket as u64;
        let mut qps = self.sync_qps()?;
        let mut rows = Vec::new();
        for s in 0..info.bases.len() {
            let img = self.read_big(
                &mut qps,
                info.bases[s][0],
                info.shard_bytes(self.cfg.slots_per_bucket),
            )?;
            for (i, rec) in img.chunks_exact(info.rec).enumerate() {
                let tail = RecordTail::read_from_bytes(&rec[layout::lock_offset(info.payload)..])
                    .expect("16 bytes");
                let version = Version(tail.version);
                if version.empty() && tail.lock == 0 {
                    continue;
                }
                let local_bucket = i as u64 / spb;
                let bucket = local_bucket * info.shards() + s as u64;
                rows.push(Row {
                    slot: bucket * spb + i as u64 % spb,
                    key: u64::from_le_bytes(rec[..8].try_into().expect("8 bytes")),
                    payload: rec[8..8 + info.payload].to_vec(),
                    version,
                    lock: tail.lock,
                });
            }
        }
        rows.sort_by_key(|r| r.slot);
        Ok(rows)
    }

    /// Checks every shard's replicas are byte-identical (on a quiescent
    /// database: no lock held, no commit half done). The first difference
    /// is the error.
    pub fn check_replicas(&self) -> Result<(), String> {
        let mut qps = self.sync_qps().map_err(|e| e.to_string())?;
        for info in &self.tables {
            let bytes = info.shard_bytes(self.cfg.slots_per_bucket);
            for (s, reps) in info.bases.iter().enumerate() {
                let primary = self
                    .read_big(&mut qps, reps[0], bytes)
                    .map_err(|e| e.to_string())?;
                for (r, &base) in reps.iter().enumerate().skip(1) {
                    let backup = self
                        .read_big(&mut qps, base, bytes)
                        .map_err(|e| e.to_string())?;
                    if let Some(at) = primary.iter().zip(&backup).position(|(a, b)| a != b) {
                        let slot = at / info.rec;
                        let rec = |b: &[u8]| words_of(&b[slot * info.rec..(slot + 1) * info.rec]);
                        return Err(format!(
                            "table {} shard {s}: replica {r} differs from the primary at byte {at} \
                             (record {slot} of the shard, byte {} of it): words {:x?} vs {:x?}",
                            info.name,
                            at % info.rec,
                            rec(&primary),
                            rec(&backup)
                        ));
                    }
                }
            }
        }
        Ok(())
    }

    /// Records of every table whose primary lock word is not free, or
    /// whose version is dirty (0 on a quiescent, recovered database).
    pub fn stuck_records(&self) -> Result<usize, TxnError> {
        let mut n = 0;
        for t in 0..self.tables.len() {
            n += self
                .scan(t as TableId)?
                .iter()
                .filter(|r| r.lock != 0 || r.version.dirty())
                .count();
        }
        Ok(n)
    }
}

/// The structure fields of the catalog.
fn encode_catalog(
    cfg: &TxnConfig,
    nodes: &[NodeId],
    log_bases: &[GlobalAddr],
    infos: &[TableInfo],
) -> Vec<u64> {
    let mut w = vec![
        nodes.len() as u64,
        cfg.replicas as u64,
        cfg.slots_per_bucket as u64,
        cfg.max_probe as u64,
        cfg.max_coordinators as u64,
        cfg.log_bytes as u64,
        cfg.max_items as u64,
        infos.len() as u64,
    ];
    w.extend(nodes.iter().map(|&n| n as u64));
    w.extend(log_bases.iter().map(|a| a.raw()));
    for t in infos {
        let mut name = [0u8; 32];
        let n = t.name.len().min(32);
        name[..n].copy_from_slice(&t.name.as_bytes()[..n]);
        w.extend(words_of(&name));
        w.extend([t.payload as u64, t.capacity, t.buckets]);
        for reps in &t.bases {
            w.extend(reps.iter().map(|a| a.raw()));
        }
    }
    w
}

type Catalog = (TxnConfig, Vec<NodeId>, Vec<GlobalAddr>, Vec<TableInfo>);

fn decode_catalog(w: &[u64]) -> Option<Catalog> {
    let mut it = w.iter().copied();
    let mut next = || it.next();
    let n = next()? as usize;
    let cfg = TxnConfig {
        replicas: next()? as usize,
        slots_per_bucket: next()? as usize,
        max_probe: next()? as usize,
        max_coordinators: next()? as u32,
        log_bytes: next()? as usize,
        max_items: next()? as usize,
        ..Default::default()
    };
    let tables = next()? as usize;
    if n == 0 || n > 4096 || cfg.replicas == 0 || cfg.replicas > n || tables > 65_535 {
        return None;
    }
    let nodes: Vec<NodeId> = (0..n)
        .map(|_| next().map(|v| v as NodeId))
        .collect::<Option<_>>()?;
    let logs: Vec<GlobalAddr> = (0..n)
        .map(|_| next().map(GlobalAddr::from_raw))
        .collect::<Option<_>>()?;
    let mut infos = Vec::new();
    for _ in 0..tables {
        let name: Vec<u8> = (0..4)
            .map(|_| next().map(u64::to_le_bytes))
            .collect::<Option<Vec<_>>>()?
            .concat();
        let name = String::from_utf8_lossy(&name)
            .trim_end_matches('\0')
            .to_string();
        let payload = next()? as usize;
        let capacity = next()?;
        let buckets = next()?;
        if payload == 0
            || !payload.is_multiple_of(8)
            || buckets == 0
            || !buckets.is_multiple_of(n as u64)
        {
            return None;
        }
        let mut bases = Vec::new();
        for _ in 0..n {
            bases.push(
                (0..cfg.replicas)
                    .map(|_| next().map(GlobalAddr::from_raw))
                    .collect::<Option<Vec<_>>>()?,
            );
        }
        infos.push(TableInfo {
            name,
            payload,
            rec: layout::record_bytes(payload),
            buckets,
            capacity,
            bases,
        });
    }
    Some((cfg, nodes, logs, infos))
}
