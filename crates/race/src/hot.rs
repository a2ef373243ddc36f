//! The hot area: skewed keys served in blocks, with IO consolidation
//! (RDMA memory-semantics study, §IV-B "IO consolidation" and "Atomic
//! operation"; its remote spinlock with exponential backoff, §III-E).
//!
//! Real key-value workloads are skewed, so the study splits the table into
//! a *hot* and a *cold* area. Hot keys, chosen at creation (the study warms
//! its table up "by selecting frequent access keys into the hot memory
//! area"), are sorted by key and laid out in *blocks* of `2^t` entries;
//! a front end takes a block's remote spinlock, keeps the block in a local
//! buffer, serves its operations there, and writes the whole block back
//! when `θ` modifications have accumulated or its lease has run out. Cold
//! keys stay in the RACE table. dmkit's hot area follows that design with
//! one choice of its own, explained under "When a block goes back".
//!
//! ## Remote layout
//! ```text
//!  hot directory (home node; named root "race/<name>/hot")
//!  0        8       16          24           32             40      48      64
//!  +--------+-------+-----------+------------+--------------+-------+-------+
//!  | magic  | keys  | block_log2| key_stride | entry_stride | nodes | (0,0) |  HotDirHeader
//!  +--------+-------+-----------+------------+--------------+-------+-------+
//!  | area[0] | area[1] | ... | area[nodes-1] |     base of each node's blocks, 8 B each
//!  | key record 0 | key record 1 | ...       |     key_stride B each, sorted by key
//!
//!  key record:  | len (8) | key bytes, zero padded to 8 |
//!
//!  block b (on node b % nodes, at area[b % nodes] + (b / nodes) * block_stride)
//!  0        8          16
//!  +--------+----------+------------+------------+-----+------------------+
//!  | lock   | flushes  | entry 0    | entry 1    | ... | entry 2^t - 1    |
//!  +--------+----------+------------+------------+-----+------------------+
//!  lock: a RemoteLock word (owner 16 | lease deadline µs 48), 0 = free
//!  flushes: write-backs of the block so far
//!
//!  entry (entry_stride B):
//!  0                 8          16
//!  +---+------+------+----------+----------------------------------+
//!  | V |  0   | len  | checksum | value bytes, zero padded to 8    |
//!  +---+------+------+----------+----------------------------------+
//!  V (bit 63): the key is present; len: value bytes (low 32 bits).
//!  An absent entry is all zero; a present one's checksum covers meta and value.
//! ```
//! Hot key `i` (its rank in the sorted list) lives in block `i >> t`,
//! entry `i & (2^t - 1)`.
//!
//! ## Operations
//! - **search, fast path**: READ the block's lock word and the key's entry
//!   in one batch (queue-pair order reads the lock first). If the lock was
//!   free, the remote block was the whole truth at that instant (writes
//!   reach it only at a write-back, under the lock) and the entry read after
//!   it reflects some instant inside the search; the checksum rejects an
//!   entry torn by a write-back that started in between. One round trip, no
//!   atomics. If the lock is held, the search takes the slow path.
//! - **slow path** (every insert, update, delete; searches of a held
//!   block): queue on the machine's local ticket lock for the block; unless
//!   the previous local holder handed the block over, take the remote lock
//!   (`backoff_cas`, so conflict avoidance applies; a dead holder's lease
//!   can be broken) and READ the block's entries; apply the operation to the
//!   local copy.
//!
//! ## When a block goes back
//! The holder hands the block (lock and buffered copy) to the next local
//! waiter while all of these hold: someone waits, fewer than `θ`
//! modifications are buffered, the block was taken less than `hold` ago,
//! and the lease has more than half left. Otherwise it WRITEs the entries
//! back (when any changed) and releases the lock in the same batch. So a
//! block is never kept by an idle machine: the study lets a front end keep
//! a block until its lease expires, but nothing in a passive client would
//! then write it back, and breaking such a lease would lose acknowledged
//! writes. Under load — many tasks of a machine on few hot blocks, the case
//! the area is for — blocks pass from task to task and their writes are
//! consolidated into one WRITE per `θ` modifications.
//!
//! ## What it costs
//! Writes acknowledged from a held block live only in that machine's
//! buffer until the write-back: a compute machine that dies holding a block
//! loses up to `θ` acknowledged modifications of it (the study's burst
//! buffer has the same window). The area is off unless hot keys are given.

use std::collections::HashMap;

use dmkit_fabric::GlobalAddr;
use dmkit_index::{Creation, Home, IndexError};
use dmkit_runtime::consolidate::{
    ConsolidateError, ConsolidationConfig, RegionHead, SharedConfig, SharedRegion, SharedRegions,
    DATA_AT, FLUSHES_AT,
};
use dmkit_runtime::hash::hash64;
use dmkit_runtime::{Ctx, Local, Nanos};
use zerocopy::{FromBytes, Immutable, IntoBytes, KnownLayout};

/// Magic of the hot directory.
pub const HOT_MAGIC: u64 = u64::from_le_bytes(*b"RACEHOT1");
/// Most hot keys a table can have.
pub const MAX_HOT_KEYS: usize = 1 << 24;
/// Largest `block_log2`.
pub const MAX_HOT_BLOCK_LOG2: u32 = 10;

/// Header of the hot directory.
#[repr(C)]
#[derive(
    Debug, Clone, Copy, Default, PartialEq, Eq, FromBytes, IntoBytes, KnownLayout, Immutable,
)]
pub struct HotDirHeader {
    /// [`HOT_MAGIC`] ("RACEHOT1"); a client refuses a hot directory without it.
    pub magic: u64,
    /// Hot keys.
    pub keys: u64,
    /// Entries per block: 2^block_log2.
    pub block_log2: u64,
    /// Bytes per key record.
    pub key_stride: u64,
    /// Bytes per entry.
    pub entry_stride: u64,
    /// Memory nodes the blocks are spread over.
    pub nodes: u64,
    /// Zero; pads the header to 64 bytes.
    pub _reserved: [u64; 2],
}
const _: () = assert!(std::mem::size_of::<HotDirHeader>() == 64);

/// Head of a block: the runtime's shared hot region head (lock word and
/// flush counter; `dmkit_runtime::consolidate`).
pub type HotBlockHead = RegionHead;
/// Entries start after the block head.
pub const HOT_ENTRIES_AT: u64 = DATA_AT;
/// Offset of the flush counter.
pub const HOT_FLUSHES: u64 = FLUSHES_AT;
const _: () = assert!(HOT_ENTRIES_AT == 16 && HOT_FLUSHES == 8);

/// Head of an entry.
#[repr(C)]
#[derive(
    Debug, Clone, Copy, Default, PartialEq, Eq, FromBytes, IntoBytes, KnownLayout, Immutable,
)]
pub struct HotEntryHead {
    /// Bit 63: present; low 32 bits: value length.
    pub meta: u64,
    /// [`entry_checksum`] of meta and value (0 for an absent entry).
    pub checksum: u64,
}
const _: () = assert!(std::mem::size_of::<HotEntryHead>() == 16);
const PRESENT: u64 = 1 << 63;

/// Checksum of a present entry.
pub fn entry_checksum(meta: u64, value: &[u8]) -> u64 {
    hash64(value, meta ^ 0x4807_5EED) | 1
}

/// Decodes an entry image: `Ok(None)` absent, `Ok(Some(value))` present,
/// `Err(())` torn (checksum or length mismatch).
#[allow(clippy::result_unit_err)]
pub fn decode_entry(e: &[u8]) -> Result<Option<&[u8]>, ()> {
    let (head, body) = HotEntryHead::read_from_prefix(e).map_err(|_| ())?;
    if head.meta == 0 {
        return if head.checksum == 0 {
            Ok(None)
        } else {
            Err(())
        };
    }
    let len = (head.meta & 0xFFFF_FFFF) as usize;
    if head.meta & !PRESENT & !0xFFFF_FFFF != 0 || head.meta & PRESENT == 0 || len > body.len() {
        return Err(());
    }
    let v = &body[..len];
    if entry_checksum(head.meta, v) != head.checksum {
        return Err(());
    }
    Ok(Some(v))
}

/// Writes entry image `e` (entry_stride bytes) for `value` (None: absent).
pub fn encode_entry(e: &mut [u8], value: Option<&[u8]>) {
    e.fill(0);
    if let Some(v) = value {
        let meta = PRESENT | v.len() as u64;
        let head = HotEntryHead {
            meta,
            checksum: entry_checksum(meta, v),
        };
        let (h, body) = e.split_at_mut(std::mem::size_of::<HotEntryHead>());
        h.copy_from_slice(head.as_bytes());
        body[..v.len()].copy_from_slice(v);
    }
}

/// How the hot area behaves (client side).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HotParams {
    /// θ: buffered modifications that force a write-back.
    pub theta: u32,
    /// Longest a machine keeps a block, however busy (ns).
    pub hold: Nanos,
    /// The remote lock's lease (crash recovery; must exceed `2 × hold`).
    pub lease: Nanos,
}

/// Where a table's hot area is and what it holds. Shared by all clients.
pub struct HotArea {
    pub(crate) dir: GlobalAddr,
    block_log2: u32,
    entry_stride: usize,
    areas: Vec<GlobalAddr>,
    index: HashMap<Vec<u8>, u32>,
    params: HotParams,
}

fn key_stride(max_key: usize) -> usize {
    8 + max_key.next_multiple_of(8)
}

fn entry_stride(max_value: usize) -> usize {
    std::mem::size_of::<HotEntryHead>() + max_value.next_multiple_of(8)
}

/// Bytes from one block to the next on a node: head and entries.
fn block_stride(entry_stride: usize, block_log2: u32) -> u64 {
    HOT_ENTRIES_AT + (entry_stride << block_log2) as u64
}

impl HotArea {
    /// Bytes a block's entries take with these limits.
    pub fn entries_bytes(block_log2: u32, max_value: usize) -> usize {
        entry_stride(max_value) << block_log2
    }

    /// Creates the area for the configuration's hot keys (validated by
    /// the caller) as part of table creation `c`.
    pub(crate) fn create(c: &mut Creation, cfg: &crate::RaceConfig) -> Result<Self, IndexError> {
        let (max_key, max_value, block_log2) = (cfg.max_key, cfg.max_value, cfg.hot_block_log2);
        let mut sorted = cfg.hot_keys.clone();
        sorted.sort();
        let ks = key_stride(max_key);
        let es = entry_stride(max_value);
        let nodes = c.nodes().to_vec();
        let blocks = sorted.len().div_ceil(1 << block_log2);
        let block_stride = block_stride(es, block_log2);
        let head_len = std::mem::size_of::<HotDirHeader>() as u64;
        let dir_len = head_len + 8 * nodes.len() as u64 + (ks * sorted.len()) as u64;
        let dir = c.alloc(c.home(), dir_len, "allocating the hot directory")?;
        let mut areas = Vec::new();
        for (i, &n) in nodes.iter().enumerate() {
            let on_node = (blocks + nodes.len() - 1 - i) / nodes.len();
            let len = (on_node as u64 * block_stride).max(64);
            areas.push(c.alloc(n, len, "allocating hot blocks")?);
        }
        let h = HotDirHeader {
            magic: HOT_MAGIC,
            keys: sorted.len() as u64,
            block_log2: block_log2 as u64,
            key_stride: ks as u64,
            entry_stride: es as u64,
            nodes: nodes.len() as u64,
            _reserved: [0; 2],
        };
        let mut img = Vec::with_capacity(dir_len as usize);
        img.extend_from_slice(h.as_bytes());
        for a in &areas {
            img.extend_from_slice(a.raw().as_bytes());
        }
        for k in &sorted {
            let at = img.len();
            img.extend_from_slice((k.len() as u64).as_bytes());
            img.extend_from_slice(k);
            img.resize(at + ks, 0);
        }
        c.write(dir, &img)?;
        Ok(Self::assemble(
            dir,
            block_log2,
            es,
            areas,
            sorted,
            cfg.hot_params(),
        ))
    }

    fn assemble(
        dir: GlobalAddr,
        block_log2: u32,
        entry_stride: usize,
        areas: Vec<GlobalAddr>,
        sorted: Vec<Vec<u8>>,
        params: HotParams,
    ) -> Self {
        Self {
            dir,
            block_log2,
            entry_stride,
            areas,
            index: sorted
                .into_iter()
                .enumerate()
                .map(|(i, k)| (k, i as u32))
                .collect(),
            params,
        }
    }

    /// Reads the area of an existing table from its directory at `dir`.
    pub(crate) fn open(
        home: &Home,
        dir: GlobalAddr,
        max_key: usize,
        max_value: usize,
        params: HotParams,
    ) -> Result<Self, IndexError> {
        let corrupt = |what| IndexError::Corrupt { addr: dir, what };
        let max_msg = home.fabric().caps().max_message.clamp(4096, 1 << 20);
        let rk = home.rkey(dir.node())?;
        let mut qp = home.sync_qp(dir.node(), max_msg)?;
        let head_len = std::mem::size_of::<HotDirHeader>();
        let (h, _) = HotDirHeader::read_from_prefix(&qp.read(dir, rk, head_len)?)
            .map_err(|_| corrupt("hot directory header"))?;
        let (keys, log2, ks, es, n) = (
            h.keys as usize,
            h.block_log2 as u32,
            h.key_stride as usize,
            h.entry_stride as usize,
            h.nodes as usize,
        );
        if h.magic != HOT_MAGIC
            || keys > MAX_HOT_KEYS
            || log2 > MAX_HOT_BLOCK_LOG2
            || ks != key_stride(max_key)
            || es != entry_stride(max_value)
            || n != home.nodes().len()
        {
            return Err(corrupt("hot directory header"));
        }
        let len = 8 * n + ks * keys;
        let mut body = Vec::with_capacity(len);
        while body.len() < len {
            let k = (len - body.len()).min(max_msg);
            body.extend(qp.read(dir.add((head_len + body.len()) as u64), rk, k)?);
        }
        let (areas, records) = <[u64]>::ref_from_prefix_with_elems(&body, n)
            .map_err(|_| corrupt("hot directory areas"))?;
        let areas = areas.iter().map(|&a| GlobalAddr::from_raw(a)).collect();
        let mut sorted = Vec::with_capacity(keys);
        for r in records.chunks_exact(ks) {
            let (l, key) = u64::read_from_prefix(r).map_err(|_| corrupt("hot key record"))?;
            let l = l as usize;
            if l == 0 || l > max_key || l > key.len() {
                return Err(corrupt("hot key record"));
            }
            sorted.push(key[..l].to_vec());
        }
        Ok(Self::assemble(dir, log2, es, areas, sorted, params))
    }

    /// Entries per block, as a power of two.
    pub fn block_log2(&self) -> u32 {
        self.block_log2
    }

    /// Hot keys.
    pub fn len(&self) -> usize {
        self.index.len()
    }

    /// Whether the area has no keys.
    pub fn is_empty(&self) -> bool {
        self.index.is_empty()
    }

    /// Blocks in the area.
    pub fn blocks(&self) -> usize {
        self.len().div_ceil(1 << self.block_log2)
    }

    /// The hot rank of `key`, if it is hot.
    pub fn rank(&self, key: &[u8]) -> Option<u32> {
        self.index.get(key).copied()
    }

    /// The hot keys, by rank.
    pub fn keys(&self) -> Vec<Vec<u8>> {
        let mut v: Vec<(u32, Vec<u8>)> = self.index.iter().map(|(k, &i)| (i, k.clone())).collect();
        v.sort();
        v.into_iter().map(|(_, k)| k).collect()
    }

    fn block_addr(&self, b: usize) -> GlobalAddr {
        let n = self.areas.len();
        self.areas[b % n].add((b / n) as u64 * block_stride(self.entry_stride, self.block_log2))
    }

    /// Bytes of one block's entries.
    pub(crate) fn entries_len(&self) -> usize {
        self.entry_stride << self.block_log2
    }

    /// A machine's local state for this area.
    pub(crate) fn local(&self, max_handover: u32) -> HotLocal {
        let p = self.params;
        HotLocal {
            regions: SharedRegions::new(
                self.blocks(),
                max_handover,
                SharedConfig {
                    consolidation: ConsolidationConfig {
                        theta: p.theta,
                        lease: p.hold,
                    },
                    lock_lease: p.lease,
                },
            ),
        }
    }
}

/// One compute machine's side of the hot area: the runtime's shared hot
/// regions (a local ticket lock and a buffer per block).
pub struct HotLocal {
    regions: SharedRegions,
}

/// What a hot operation does to its entry.
#[derive(Debug, Clone, Copy)]
pub(crate) enum HotOp<'a> {
    Search,
    Insert(&'a [u8]),
    Update(&'a [u8]),
    Delete,
}

/// What a hot operation found and did: the entry's value before it, and
/// whether a modification applied (insert of an absent key, update or
/// delete of a present one).
#[derive(Debug)]
pub(crate) struct HotOutcome {
    pub before: Option<Vec<u8>>,
    pub applied: bool,
}

/// What happened in a hot operation, for the table's counters.
#[derive(Debug, Default, Clone, Copy)]
pub(crate) struct HotTrace {
    pub fast: bool,
    pub acquired: bool,
    pub handed_in: bool,
    pub flushed: bool,
    pub retries: u32,
}

/// Fast-path attempts of a search before it queues for the block.
const FAST_TRIES: u32 = 4;

/// Owner id of a machine's remote block locks (nonzero, differs between
/// processes and machines).
pub(crate) fn owner_of(machine: usize) -> u16 {
    let x = dmkit_runtime::hash::fmix64(((std::process::id() as u64) << 20) ^ machine as u64);
    (x as u16).max(1)
}

impl HotArea {
    /// Block `b` as a shared hot region of the runtime.
    fn region(&self, home: &Home, b: usize) -> Result<SharedRegion, IndexError> {
        Ok(SharedRegion {
            head: home.remote(self.block_addr(b))?,
            len: self.entries_len(),
        })
    }

    /// Runs `op` on hot rank `rank`. `scratch` is task-local memory of at
    /// least `entries_len() + 8` bytes; `home` names the table's nodes and
    /// their keys.
    #[allow(clippy::too_many_arguments)]
    pub(crate) async fn run(
        &self,
        ctx: &Ctx,
        local: &HotLocal,
        owner: u16,
        home: &Home,
        scratch: Local,
        rank: u32,
        op: HotOp<'_>,
        trace: &mut HotTrace,
    ) -> Result<HotOutcome, IndexError> {
        let b = (rank >> self.block_log2) as usize;
        let e = (rank as usize) & ((1 << self.block_log2) - 1);
        let region = self.region(home, b)?;
        let regions = &local.regions;
        if let HotOp::Search = op {
            let (lock_word, entry) = (scratch.word(0), scratch.slice(8, self.entry_stride));
            for _ in 0..FAST_TRIES {
                let at = e * self.entry_stride;
                if !regions
                    .read_unheld(ctx, &region, lock_word, at, entry)
                    .await?
                {
                    break;
                }
                let img = ctx.local_vec(entry);
                match decode_entry(&img) {
                    Ok(v) => {
                        trace.fast = true;
                        return Ok(HotOutcome {
                            before: v.map(<[u8]>::to_vec),
                            applied: false,
                        });
                    }
                    Err(()) => {
                        trace.retries += 1;
                        ctx.note_retry();
                    }
                }
            }
        }
        let held = regions
            .acquire(ctx, b, region, owner, scratch)
            .await
            .map_err(|e| consolidate_error(e, region.head.addr))?;
        if held.handed_in {
            trace.handed_in = true;
        } else {
            trace.acquired = true;
        }
        // Apply the operation to the buffered block (None: the entry is
        // damaged — nobody writes a block we hold).
        let es = self.entry_stride;
        let (outcome, decision) = regions.update(ctx, &held, |data| {
            let img = &mut data[e * es..(e + 1) * es];
            match decode_entry(img).map(|v| v.map(<[u8]>::to_vec)) {
                Err(()) => (None, 0),
                Ok(before) => {
                    // The entry's new state, if the operation changes it.
                    let new: Option<Option<&[u8]>> = match (op, &before) {
                        (HotOp::Insert(v), None) | (HotOp::Update(v), Some(_)) => Some(Some(v)),
                        (HotOp::Delete, Some(_)) => Some(None),
                        _ => None,
                    };
                    let applied = new.is_some();
                    if let Some(v) = new {
                        encode_entry(img, v);
                    }
                    (Some(HotOutcome { before, applied }), u32::from(applied))
                }
            }
        });
        let Some(result) = outcome else {
            regions
                .give_back(ctx, held, scratch, false)
                .await
                .map_err(|e| consolidate_error(e, region.head.addr))?;
            return Err(IndexError::Corrupt {
                addr: region.head.addr,
                what: "hot entry (checksum mismatch under its lock)",
            });
        };
        trace.flushed = regions
            .finish(ctx, held, decision, scratch)
            .await
            .map_err(|e| consolidate_error(e, region.head.addr))?;
        Ok(result)
    }

    /// Every present hot key and its value, each block read under its lock
    /// (consistent with concurrent operations).
    pub(crate) async fn entries(
        &self,
        ctx: &Ctx,
        local: &HotLocal,
        owner: u16,
        home: &Home,
        scratch: Local,
    ) -> Result<Vec<(Vec<u8>, Vec<u8>)>, IndexError> {
        let keys = self.keys();
        let mut out = Vec::new();
        let mut trace = HotTrace::default();
        for (i, k) in keys.into_iter().enumerate() {
            let r = self
                .run(
                    ctx,
                    local,
                    owner,
                    home,
                    scratch,
                    i as u32,
                    HotOp::Search,
                    &mut trace,
                )
                .await?;
            if let Some(v) = r.before {
                out.push((k, v));
            }
        }
        Ok(out)
    }
}

/// A failure of the runtime's consolidation as the index reports it.
fn consolidate_error(e: ConsolidateError, block: GlobalAddr) -> IndexError {
    match e {
        ConsolidateError::Fabric(f) => IndexError::Fabric(f),
        ConsolidateError::Lock(l) => lock_error(l),
        ConsolidateError::NotHeld { .. } => IndexError::Corrupt {
            addr: block,
            what: "hot block held locally without its remote lock",
        },
        ConsolidateError::Region { .. } => IndexError::Corrupt {
            addr: block,
            what: "hot block (not a valid hot region)",
        },
    }
}

fn lock_error(e: dmkit_runtime::lock::LockError) -> IndexError {
    match e {
        dmkit_runtime::lock::LockError::Fabric(f) => IndexError::Fabric(f),
        lost @ dmkit_runtime::lock::LockError::Lost { .. } => {
            IndexError::LeaseLost(lost.to_string())
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn entries_round_trip_and_tears_are_caught() {
        let mut e = vec![0u8; entry_stride(24)];
        assert_eq!(decode_entry(&e), Ok(None));
        encode_entry(&mut e, Some(b"hello, hot world"));
        assert_eq!(decode_entry(&e), Ok(Some(&b"hello, hot world"[..])));
        let mut torn = e.clone();
        torn[20] ^= 1;
        assert_eq!(decode_entry(&torn), Err(()));
        // New meta with an old (absent) checksum.
        let mut half = vec![0u8; e.len()];
        half[..8].copy_from_slice(&e[..8]);
        assert_eq!(decode_entry(&half), Err(()));
        encode_entry(&mut e, None);
        assert!(e.iter().all(|&b| b == 0));
        assert_eq!(key_stride(1), 16);
        assert_eq!(entry_stride(64), 80);
    }
}
