//! The switch's control plane for address translation: the memory node's
//! region table as its NIC sees it.
//!
//! The policy ([`crate::Switch`]) speaks the node's addresses — a
//! [`GlobalAddr`] of node id and byte offset, which is what Clover's link
//! words hold — while a request on the wire carries the NIC's virtual
//! address inside a registered region and that region's NIC rkey. The
//! node knows both sides of every registration (dmkit's verbs server:
//! region base offset and length, NIC rkey, NIC address of the region's
//! first byte); `dmkit switch --node-ctl` reads that table over the node's
//! control protocol and installs it here ([`RegionTable`]). A request
//! under an rkey the table does not know makes the switch read the table
//! again (a region registered since, or re-registered under a new NIC
//! key after a page moved).
//!
//! Translation is exact: offset `o` of a region `r` is NIC address
//! `r.addr + (o - r.base)` under `r.rkey`, and back; a request that does
//! not lie wholly inside one region is not translated.

use dmkit_fabric::GlobalAddr;

/// Access rights of a region (the memory node's bits:
/// `dmkit_memnode::layout::access`).
pub mod access {
    /// Remote READ.
    pub const READ: u64 = 1;
    /// Remote WRITE.
    pub const WRITE: u64 = 2;
    /// Remote atomics (CAS, FAA).
    pub const ATOMIC: u64 = 4;
}

/// One registered region of the memory node.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct WireRegion {
    /// The NIC's rkey of the registration (what requests carry).
    pub rkey: u32,
    /// The NIC's virtual address of the region's first byte.
    pub addr: u64,
    /// The region's first byte in the node's remote address space.
    pub base: u64,
    /// The region's length in bytes.
    pub len: u64,
    /// [`access`] bits.
    pub access: u64,
}

impl WireRegion {
    fn holds_wire(&self, va: u64, len: u64) -> bool {
        va >= self.addr
            && va
                .checked_add(len)
                .is_some_and(|e| e <= self.addr.saturating_add(self.len))
    }

    fn holds_offset(&self, off: u64, len: u64) -> bool {
        off >= self.base
            && off
                .checked_add(len)
                .is_some_and(|e| e <= self.base.saturating_add(self.len))
    }
}

/// The region table of one memory node: wire (rkey, address) ↔ the
/// node's addresses.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RegionTable {
    node: u16,
    regions: Vec<WireRegion>,
}

impl RegionTable {
    /// The table of memory node `node` (its id in the clients' fabric:
    /// the high 16 bits of the addresses the policy sees).
    pub fn new(node: u16, regions: Vec<WireRegion>) -> Self {
        RegionTable { node, regions }
    }

    /// The regions.
    pub fn regions(&self) -> &[WireRegion] {
        &self.regions
    }

    /// Whether some region is registered under NIC key `rkey`.
    pub fn knows(&self, rkey: u32) -> bool {
        self.regions.iter().any(|r| r.rkey == rkey)
    }

    /// The node address ([`GlobalAddr::raw`]) of `len` bytes at NIC
    /// address `va` under `rkey`; `None` if they lie in no region of that
    /// key.
    pub fn to_node(&self, rkey: u32, va: u64, len: u64) -> Option<u64> {
        let r = self
            .regions
            .iter()
            .find(|r| r.rkey == rkey && r.holds_wire(va, len))?;
        GlobalAddr::try_new(self.node, r.base + (va - r.addr)).map(GlobalAddr::raw)
    }

    /// The NIC (rkey, address) of `len` bytes at node address `addr`,
    /// in a region granting `need` ([`access`] bits): the region of
    /// `prefer` (the key the client used) if it holds them, else the
    /// first that does. `None` if `addr` is another node's or no region
    /// holds it with those rights.
    pub fn to_wire(&self, addr: u64, len: u64, prefer: u32, need: u64) -> Option<(u32, u64)> {
        let a = GlobalAddr::from_raw(addr);
        if a.node() != self.node {
            return None;
        }
        let off = a.offset();
        let fits = |r: &&WireRegion| r.access & need == need && r.holds_offset(off, len);
        let r = self
            .regions
            .iter()
            .filter(|r| r.rkey == prefer)
            .find(fits)
            .or_else(|| self.regions.iter().find(fits))?;
        Some((r.rkey, r.addr + (off - r.base)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn table() -> RegionTable {
        RegionTable::new(
            0,
            vec![
                WireRegion {
                    rkey: 0x111,
                    addr: 0x7f00_0000_1000,
                    base: 0x1000,
                    len: 0x10_0000,
                    access: access::READ | access::WRITE | access::ATOMIC,
                },
                WireRegion {
                    rkey: 0x222,
                    addr: 0x7e00_0000_0000,
                    base: 0x8000,
                    len: 0x1000,
                    access: access::READ,
                },
            ],
        )
    }

    #[test]
    fn wire_and_node_addresses_translate_both_ways() {
        let t = table();
        assert_eq!(t.to_node(0x111, 0x7f00_0000_1000, 8), Some(0x1000));
        assert_eq!(t.to_node(0x111, 0x7f00_0000_9040, 64), Some(0x9040));
        assert_eq!(t.to_node(0x222, 0x7e00_0000_0010, 8), Some(0x8010));
        assert_eq!(
            t.to_wire(0x9040, 8, 0x111, access::ATOMIC),
            Some((0x111, 0x7f00_0000_9040))
        );
        // The read-only region overlaps the heap: a READ the client sent
        // under it stays under it; an atomic needs the heap's key.
        assert_eq!(
            t.to_wire(0x8010, 8, 0x222, access::READ),
            Some((0x222, 0x7e00_0000_0010))
        );
        assert_eq!(
            t.to_wire(0x8010, 8, 0x222, access::ATOMIC),
            Some((0x111, 0x7f00_0000_8010))
        );
        for off in [0x1000u64, 0x2345, 0x10_0ff8] {
            let (k, va) = t.to_wire(off, 8, 0, access::ATOMIC).unwrap();
            assert_eq!(t.to_node(k, va, 8), Some(off));
        }
    }

    #[test]
    fn requests_outside_a_region_or_under_unknown_keys_do_not_translate() {
        let t = table();
        assert!(t.knows(0x222) && !t.knows(0x333));
        assert_eq!(t.to_node(0x333, 0x7f00_0000_1000, 8), None, "unknown key");
        assert_eq!(
            t.to_node(0x111, 0x7f00_0000_0ff8, 8),
            None,
            "before the region"
        );
        assert_eq!(
            t.to_node(0x111, 0x7f00_0010_0ffc, 8),
            None,
            "straddles the end"
        );
        assert_eq!(t.to_node(0x111, u64::MAX - 4, 8), None, "wraps");
        assert_eq!(
            t.to_wire(0x200_000, 8, 0x111, access::READ),
            None,
            "no region holds it"
        );
        assert_eq!(t.to_wire(0x800, 8, 0x111, access::READ), None);
        assert_eq!(
            t.to_wire(GlobalAddr::new(1, 0x2000).raw(), 8, 0x111, access::READ),
            None,
            "another node's address"
        );
        let n1 = RegionTable::new(1, t.regions().to_vec());
        assert_eq!(
            n1.to_node(0x111, 0x7f00_0000_2000, 8),
            Some(GlobalAddr::new(1, 0x2000).raw())
        );
    }
}
