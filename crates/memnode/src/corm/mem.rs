//! The store's access to the node's memory: by *remote* offset, translated
//! through the node's page table for every word, exactly as a one-sided
//! client's verbs are — so what a worker reads is what a client reads,
//! mid-remap included. All access is by aligned 8-byte atomics (clients
//! touch the same memory concurrently). The only `unsafe` of the store.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use crate::memory::Mapping;
use crate::node::{MemNode, Translator};

/// Word access to the node's data through its translation table. Holds
/// the node's mappings, not the node: the node holds the store (as a
/// service), so a strong reference here would keep it alive forever.
#[derive(Debug)]
pub(crate) struct Mem {
    table: Translator,
    data: Arc<Mapping>,
    page_shift: u32,
    phys_pages: u64,
}

impl Mem {
    pub(crate) fn new(node: &MemNode) -> Self {
        let l = node.layout();
        Mem {
            data: node.data_mapping(),
            page_shift: l.page_shift as u32,
            phys_pages: l.phys_pages,
            table: node.translator(),
        }
    }

    /// The word at remote offset `off` (8-aligned), or `None` if its page
    /// is not mapped.
    #[inline]
    pub(crate) fn word(&self, off: u64) -> Option<&AtomicU64> {
        debug_assert_eq!(off % 8, 0);
        let phys = self.table.translate(off >> self.page_shift)?;
        if phys >= self.phys_pages {
            return None;
        }
        let at = (phys << self.page_shift) | (off & ((1 << self.page_shift) - 1));
        // SAFETY: phys < phys_pages, so the page lies inside the data
        // mapping (phys_pages pages long), which `self.data` keeps alive;
        // `at` is 8-aligned (off is, pages are) so the word is an aligned
        // u64 inside one page; all access to shared memory is atomic.
        Some(unsafe { &*(self.data.as_ptr().add(at as usize) as *const AtomicU64) })
    }

    /// Loads the word at `off`.
    #[inline]
    pub(crate) fn load(&self, off: u64) -> Option<u64> {
        self.word(off).map(|w| w.load(Ordering::Acquire))
    }

    /// Stores `v` at `off`; false if unmapped.
    #[inline]
    pub(crate) fn store(&self, off: u64, v: u64) -> bool {
        self.word(off)
            .map(|w| w.store(v, Ordering::Release))
            .is_some()
    }

    /// Compare-and-swap at `off`: `Ok(old)` on success, `Err(current)` on
    /// a mismatch, `Err(0)` if unmapped (0 never equals a locked-able header).
    pub(crate) fn cas(&self, off: u64, old: u64, new: u64) -> Result<u64, u64> {
        match self.word(off) {
            Some(w) => w.compare_exchange(old, new, Ordering::AcqRel, Ordering::Acquire),
            None => Err(0),
        }
    }

    /// Clears `bits` in the word at `off`.
    pub(crate) fn clear_bits(&self, off: u64, bits: u64) {
        if let Some(w) = self.word(off) {
            w.fetch_and(!bits, Ordering::AcqRel);
        }
    }

    /// Copies `out.len()` bytes (a multiple of 8) from remote `off`, word by
    /// word in ascending order (as the shm backend's READ does). Unmapped
    /// words read as zero.
    pub(crate) fn read(&self, off: u64, out: &mut [u8]) {
        debug_assert_eq!(out.len() % 8, 0);
        for (i, chunk) in out.chunks_exact_mut(8).enumerate() {
            let v = self.load(off + 8 * i as u64).unwrap_or(0);
            chunk.copy_from_slice(&v.to_ne_bytes());
        }
    }

    /// Stores `img` (a multiple of 8 bytes) at remote `off` word by word in
    /// *descending* order, skipping the first word (the header, which the
    /// caller publishes last): see the layout's torn-read argument.
    pub(crate) fn write_body_descending(&self, off: u64, img: &[u8]) {
        debug_assert_eq!(img.len() % 8, 0);
        for i in (1..img.len() / 8).rev() {
            let v = u64::from_ne_bytes(img[8 * i..8 * i + 8].try_into().expect("8 bytes"));
            self.store(off + 8 * i as u64, v);
        }
    }
}
