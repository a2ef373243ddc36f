//! Remote addresses.

// Every remote layout of dmkit is little-endian words, encoded and decoded
// through `#[repr(C)]` types in the host's byte order: RDMA's hosts (x86-64,
// AArch64, POWER in LE mode) are little-endian.
#[cfg(not(target_endian = "little"))]
compile_error!("dmkit's remote layouts are little-endian; this target is not");

use std::fmt;

/// Identifier of a memory node.
pub type NodeId = u16;
/// A region's protection key (RDMA's rkey).
pub type Rkey = u32;

/// Largest byte offset a [`GlobalAddr`] can hold, plus one.
pub const OFFSET_LIMIT: u64 = 1 << 48;

/// A remote address: memory node id and byte offset inside that node's remote
/// address space, packed in 64 bits so it fits the 48-bit pointer fields of
/// RACE slots and radix-tree slots next to their tag bits.
///
/// ```text
///  63             48 47                                        0
/// +-----------------+-------------------------------------------+
/// |  node id (16)   |              byte offset (48)             |
/// +-----------------+-------------------------------------------+
/// ```
///
/// Offset 0 of every node is never allocated, so [`GlobalAddr::NULL`] and any
/// `(node, 0)` can serve as null pointers.
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
#[repr(transparent)]
pub struct GlobalAddr(u64);
const _: () = assert!(std::mem::size_of::<GlobalAddr>() == 8);

impl GlobalAddr {
    /// The null address (node 0, offset 0).
    pub const NULL: GlobalAddr = GlobalAddr(0);

    /// Packs `(node, offset)`.
    ///
    /// # Panics
    /// If `offset` does not fit 48 bits — a programmer error; use
    /// [`GlobalAddr::try_new`] for untrusted values.
    #[inline]
    pub const fn new(node: NodeId, offset: u64) -> Self {
        assert!(offset < OFFSET_LIMIT, "GlobalAddr offset exceeds 48 bits");
        GlobalAddr(((node as u64) << 48) | offset)
    }

    /// Packs `(node, offset)` or returns `None` if `offset` needs more than 48 bits.
    #[inline]
    pub const fn try_new(node: NodeId, offset: u64) -> Option<Self> {
        if offset < OFFSET_LIMIT {
            Some(GlobalAddr(((node as u64) << 48) | offset))
        } else {
            None
        }
    }

    /// Reinterprets a raw 64-bit value.
    #[inline]
    pub const fn from_raw(raw: u64) -> Self {
        GlobalAddr(raw)
    }

    /// The packed 64-bit value.
    #[inline]
    pub const fn raw(self) -> u64 {
        self.0
    }

    /// The memory node.
    #[inline]
    pub const fn node(self) -> NodeId {
        (self.0 >> 48) as NodeId
    }

    /// The byte offset inside the node.
    #[inline]
    pub const fn offset(self) -> u64 {
        self.0 & (OFFSET_LIMIT - 1)
    }

    /// Whether the offset is 0.
    #[inline]
    pub const fn is_null(self) -> bool {
        self.offset() == 0
    }

    /// This address advanced by `bytes`, or `None` if it leaves the 48-bit space.
    #[inline]
    pub const fn checked_add(self, bytes: u64) -> Option<Self> {
        match self.offset().checked_add(bytes) {
            Some(o) => GlobalAddr::try_new(self.node(), o),
            None => None,
        }
    }

    /// This address advanced by `bytes`.
    ///
    /// # Panics
    /// If the result leaves the 48-bit offset space (programmer error).
    #[inline]
    pub const fn add(self, bytes: u64) -> Self {
        match self.checked_add(bytes) {
            Some(a) => a,
            None => panic!("GlobalAddr offset overflow"),
        }
    }

    /// Packs a 64-byte-aligned address into the 48-bit pointer field that
    /// data-structure slots carry next to their tag bits (RACE slots,
    /// radix-tree slots); `None` if it does not fit.
    ///
    /// ```text
    ///  47        40 39                                   0
    /// +------------+--------------------------------------+
    /// |  node (8)  |      byte offset / 64 (40)           |
    /// +------------+--------------------------------------+
    /// ```
    /// 256 memory nodes of 64 TiB each.
    pub const fn to_ptr48(self) -> Option<u64> {
        let (node, off) = (self.node() as u64, self.offset());
        if node < 1 << PTR48_NODE_BITS && off % 64 == 0 && (off >> 6) < 1 << PTR48_UNIT_BITS {
            Some(node << PTR48_UNIT_BITS | off >> 6)
        } else {
            None
        }
    }

    /// Unpacks [`GlobalAddr::to_ptr48`] from the low 48 bits of `p` (the
    /// bits above are ignored).
    pub const fn from_ptr48(p: u64) -> Self {
        let p = p & ((1 << 48) - 1);
        GlobalAddr::new(
            (p >> PTR48_UNIT_BITS) as u16,
            (p & ((1 << PTR48_UNIT_BITS) - 1)) << 6,
        )
    }
}

const PTR48_NODE_BITS: u32 = 8;
const PTR48_UNIT_BITS: u32 = 40;

impl fmt::Debug for GlobalAddr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "n{}+{:#x}", self.node(), self.offset())
    }
}

impl fmt::Display for GlobalAddr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(self, f)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn packs_node_and_offset() {
        let a = GlobalAddr::new(0xBEEF, 0x0000_1234_5678_9ABC);
        assert_eq!(a.node(), 0xBEEF);
        assert_eq!(a.offset(), 0x1234_5678_9ABC);
        assert_eq!(a.raw(), 0xBEEF_1234_5678_9ABC);
        assert_eq!(GlobalAddr::from_raw(a.raw()), a);
        assert_eq!(format!("{a}"), "n48879+0x123456789abc");
        assert!(GlobalAddr::try_new(1, OFFSET_LIMIT).is_none());
        assert!(GlobalAddr::new(3, OFFSET_LIMIT - 1)
            .checked_add(1)
            .is_none());
        assert_eq!(GlobalAddr::new(3, 8).add(8), GlobalAddr::new(3, 16));
        assert!(GlobalAddr::new(7, 0).is_null());
    }
}

/// A remote memory reference: an address and the key of the region it
/// lies in — everything a one-sided verb needs to name remote memory
/// (rrddmma's `MrRemote`, a remote memory region's `{addr, rkey}`). Data
/// structures build one per remote object from their table of region keys,
/// so no verb is posted with an address and a key that were looked up apart.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct RemoteRef {
    /// Where.
    pub addr: GlobalAddr,
    /// The protection key of the region holding `addr`.
    pub rkey: Rkey,
}

impl RemoteRef {
    /// The reference to `addr` in the region keyed `rkey`.
    #[inline]
    pub const fn new(addr: GlobalAddr, rkey: Rkey) -> Self {
        RemoteRef { addr, rkey }
    }

    /// The reference `off` bytes further, in the same region.
    #[inline]
    pub const fn add(self, off: u64) -> Self {
        RemoteRef {
            addr: self.addr.add(off),
            rkey: self.rkey,
        }
    }

    /// The memory node.
    #[inline]
    pub const fn node(self) -> NodeId {
        self.addr.node()
    }
}

impl fmt::Debug for RemoteRef {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:?}#{:x}", self.addr, self.rkey)
    }
}

impl fmt::Display for RemoteRef {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} (rkey {:#x})", self.addr, self.rkey)
    }
}
