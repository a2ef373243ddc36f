//! Memory accounting as users read it (issue 32 item 5): active memory,
//! live bytes, per-class fragmentation, compaction counters. Workers update
//! atomics; [`Accounting::snapshot`] is what `NodeStats::corm` reports.

use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

use serde::{Deserialize, Serialize};

use super::class::{ClassInfo, SizeClasses};

#[derive(Debug, Default)]
pub(crate) struct ClassCounters {
    pub blocks: AtomicU64,
    pub live_objects: AtomicU64,
    pub live_bytes: AtomicU64,
}

/// Counters of the store's events.
#[derive(Debug, Default)]
pub(crate) struct Events {
    pub allocs: AtomicU64,
    pub frees: AtomicU64,
    pub reads: AtomicU64,
    pub writes: AtomicU64,
    pub releases: AtomicU64,
    pub errors: AtomicU64,
    pub corrections_scan: AtomicU64,
    pub corrections_message: AtomicU64,
    pub compactions: AtomicU64,
    pub triggers_threshold: AtomicU64,
    pub triggers_alloc_failure: AtomicU64,
    pub triggers_manual: AtomicU64,
    pub blocks_collected: AtomicU64,
    pub blocks_compacted: AtomicU64,
    pub merge_failures: AtomicU64,
    pub objects_moved: AtomicU64,
    pub objects_kept: AtomicU64,
    pub vaddrs_released: AtomicU64,
    pub compaction_ns: AtomicU64,
    pub collection_ns: AtomicU64,
}

/// The store's live accounting (shared by its workers and the node).
#[derive(Debug)]
pub struct Accounting {
    pub(crate) block_size: u64,
    pub(crate) classes: Vec<ClassInfo>,
    pub(crate) strategy: String,
    pub(crate) workers: u64,
    pub(crate) virtual_bytes: u64,
    pub(crate) blocks: AtomicU64,
    pub(crate) vblocks_used: AtomicU64,
    pub(crate) live_objects: AtomicU64,
    pub(crate) live_bytes: AtomicU64,
    pub(crate) per_class: Box<[ClassCounters]>,
    pub(crate) ev: Events,
}

/// Statistics of one size class.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ClassStats {
    /// The class id.
    pub class: u8,
    /// Bytes per slot.
    pub slot_size: u32,
    /// Slots per block.
    pub slots: u32,
    /// Blocks of the class.
    pub blocks: u64,
    /// Live objects.
    pub live_objects: u64,
    /// Payload bytes of the live objects (as allocated).
    pub live_bytes: u64,
    /// Fragmentation ratio × 1000: memory the class's blocks hold over the
    /// slots its live objects fill (1000 = no fragmentation).
    pub fragmentation_permille: u64,
}

/// A snapshot of a CoRM store's accounting.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct CormStats {
    /// Block size in bytes.
    pub block_size: u64,
    /// The compaction strategy (`none`, `mesh`, `corm-16`, `hybrid-16`, …).
    pub strategy: String,
    /// Worker threads (allocators).
    pub workers: u64,
    /// Memory the store's blocks hold (blocks × block size): what the node
    /// keeps resident for it.
    pub active_bytes: u64,
    /// What an ideal compactor would hold: per class, the live objects
    /// packed into as few blocks as possible.
    pub ideal_bytes: u64,
    /// Payload bytes of live objects.
    pub live_bytes: u64,
    /// Live objects.
    pub live_objects: u64,
    /// Blocks.
    pub blocks: u64,
    /// The store's address space.
    pub virtual_bytes: u64,
    /// Address space in use (blocks and the addresses merged into them).
    pub virtual_used_bytes: u64,
    /// Per class, the classes with blocks.
    pub classes: Vec<ClassStats>,
    /// Allocations served.
    pub allocs: u64,
    /// Frees served.
    pub frees: u64,
    /// RPC reads served.
    pub reads: u64,
    /// RPC writes served.
    pub writes: u64,
    /// Pointer releases served.
    pub releases: u64,
    /// Operations answered with an error.
    pub errors: u64,
    /// Pointers corrected by scanning a block.
    pub corrections_scan: u64,
    /// Pointers corrected by asking the block's owner.
    pub corrections_message: u64,
    /// Compactions run.
    pub compactions: u64,
    /// Compactions the fragmentation threshold started.
    pub triggers_threshold: u64,
    /// Compactions an allocation failure started.
    pub triggers_alloc_failure: u64,
    /// Compactions asked for.
    pub triggers_manual: u64,
    /// Blocks collected by compaction leaders.
    pub blocks_collected: u64,
    /// Blocks merged away by compaction (their memory returned).
    pub blocks_compacted: u64,
    /// Source blocks no destination could take.
    pub merge_failures: u64,
    /// Objects moved to another offset.
    pub objects_moved: u64,
    /// Objects that kept their offset.
    pub objects_kept: u64,
    /// Virtual blocks released (§3.3).
    pub vaddrs_released: u64,
    /// Nanoseconds spent merging.
    pub compaction_ns: u64,
    /// Nanoseconds spent collecting blocks.
    pub collection_ns: u64,
}

impl Accounting {
    pub(crate) fn new(
        classes: &SizeClasses,
        strategy: String,
        workers: u64,
        virtual_bytes: u64,
    ) -> Self {
        Accounting {
            block_size: classes.block_size(),
            classes: classes.iter().map(|(_, c)| *c).collect(),
            strategy,
            workers,
            virtual_bytes,
            blocks: AtomicU64::new(0),
            vblocks_used: AtomicU64::new(0),
            live_objects: AtomicU64::new(0),
            live_bytes: AtomicU64::new(0),
            per_class: (0..classes.len())
                .map(|_| ClassCounters::default())
                .collect(),
            ev: Events::default(),
        }
    }

    pub(crate) fn class(&self, c: u8) -> &ClassCounters {
        &self.per_class[c as usize]
    }

    pub(crate) fn object_added(&self, c: u8, len: u32) {
        self.live_objects.fetch_add(1, Relaxed);
        self.live_bytes.fetch_add(len as u64, Relaxed);
        let k = self.class(c);
        k.live_objects.fetch_add(1, Relaxed);
        k.live_bytes.fetch_add(len as u64, Relaxed);
    }

    pub(crate) fn object_removed(&self, c: u8, len: u32) {
        self.live_objects.fetch_sub(1, Relaxed);
        self.live_bytes.fetch_sub(len as u64, Relaxed);
        let k = self.class(c);
        k.live_objects.fetch_sub(1, Relaxed);
        k.live_bytes.fetch_sub(len as u64, Relaxed);
    }

    pub(crate) fn block_added(&self, c: u8) {
        self.blocks.fetch_add(1, Relaxed);
        self.class(c).blocks.fetch_add(1, Relaxed);
    }

    pub(crate) fn block_removed(&self, c: u8) {
        self.blocks.fetch_sub(1, Relaxed);
        self.class(c).blocks.fetch_sub(1, Relaxed);
    }

    /// Class `c`'s fragmentation ratio: block memory over the slots its
    /// live objects fill (1 when it holds nothing).
    pub fn fragmentation(&self, c: u8) -> f64 {
        let k = self.class(c);
        let live = k.live_objects.load(Relaxed);
        if live == 0 {
            return 1.0;
        }
        let held = k.blocks.load(Relaxed) * self.block_size;
        held as f64 / (live * self.classes[c as usize].slot_size as u64) as f64
    }

    /// Bytes an ideal compactor would hold now.
    pub fn ideal_bytes(&self) -> u64 {
        self.per_class
            .iter()
            .zip(&self.classes)
            .map(|(k, c)| k.live_objects.load(Relaxed).div_ceil(c.slots as u64) * self.block_size)
            .sum()
    }

    /// Memory the store's blocks hold.
    pub fn active_bytes(&self) -> u64 {
        self.blocks.load(Relaxed) * self.block_size
    }

    /// Payload bytes of live objects.
    pub fn live_bytes(&self) -> u64 {
        self.live_bytes.load(Relaxed)
    }

    /// A snapshot.
    pub fn snapshot(&self) -> CormStats {
        let e = &self.ev;
        let g = |a: &AtomicU64| a.load(Relaxed);
        let classes = self
            .per_class
            .iter()
            .zip(&self.classes)
            .enumerate()
            .filter(|(_, (k, _))| g(&k.blocks) > 0)
            .map(|(i, (k, c))| ClassStats {
                class: i as u8,
                slot_size: c.slot_size,
                slots: c.slots,
                blocks: g(&k.blocks),
                live_objects: g(&k.live_objects),
                live_bytes: g(&k.live_bytes),
                fragmentation_permille: (self.fragmentation(i as u8) * 1000.0).round() as u64,
            })
            .collect();
        CormStats {
            block_size: self.block_size,
            strategy: self.strategy.clone(),
            workers: self.workers,
            active_bytes: self.active_bytes(),
            ideal_bytes: self.ideal_bytes(),
            live_bytes: g(&self.live_bytes),
            live_objects: g(&self.live_objects),
            blocks: g(&self.blocks),
            virtual_bytes: self.virtual_bytes,
            virtual_used_bytes: g(&self.vblocks_used) * self.block_size,
            classes,
            allocs: g(&e.allocs),
            frees: g(&e.frees),
            reads: g(&e.reads),
            writes: g(&e.writes),
            releases: g(&e.releases),
            errors: g(&e.errors),
            corrections_scan: g(&e.corrections_scan),
            corrections_message: g(&e.corrections_message),
            compactions: g(&e.compactions),
            triggers_threshold: g(&e.triggers_threshold),
            triggers_alloc_failure: g(&e.triggers_alloc_failure),
            triggers_manual: g(&e.triggers_manual),
            blocks_collected: g(&e.blocks_collected),
            blocks_compacted: g(&e.blocks_compacted),
            merge_failures: g(&e.merge_failures),
            objects_moved: g(&e.objects_moved),
            objects_kept: g(&e.objects_kept),
            vaddrs_released: g(&e.vaddrs_released),
            compaction_ns: g(&e.compaction_ns),
            collection_ns: g(&e.collection_ns),
        }
    }
}
