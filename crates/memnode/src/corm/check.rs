//! The store's structural checker: metadata, memory, the directory, the
//! node's translation table and the accounting must all tell the same
//! story. Run on a quiescent store (no message in flight, no operation or
//! compaction in progress) with every worker.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::Ordering::Relaxed;

use super::class::IdKind;
use super::layout::{decode, Expect, ObjHeader};
use super::worker::{Store, Worker};

impl Store {
    /// Checks every invariant; the first violation found is the error.
    ///
    /// - each block is owned by exactly one worker, each virtual block
    ///   belongs to at most one block, and the directory says so (used,
    ///   block, owner, class, even move sequence);
    /// - every address of a block translates to the block's memory;
    ///   released addresses are unmapped and queued for reuse;
    /// - every live object is reachable exactly once: its metadata names a
    ///   used slot whose header is the object's (id, home, unlocked,
    ///   untorn), and no other slot's header claims to hold an object;
    /// - ids are unique per block (offset-based classes: id = slot);
    /// - home counts match the objects and no address is kept without one;
    /// - the not-full lists match the blocks;
    /// - the accounting equals what the blocks hold.
    pub fn check(&self, workers: &[&Worker]) -> Result<(), String> {
        let sh = &self.sh;
        if sh.in_flight.load(Relaxed) != 0 {
            return Err("messages in flight: the store is not quiescent".into());
        }
        if workers.len() != sh.cfg.workers {
            return Err(format!(
                "{} of {} workers given",
                workers.len(),
                sh.cfg.workers
            ));
        }
        let space = &sh.space;
        let bs = sh.block_size();
        let mut owner_of: BTreeMap<u64, u8> = BTreeMap::new();
        let mut vb_of_block: BTreeMap<u64, u64> = BTreeMap::new();
        let mut per_class = vec![(0u64, 0u64, 0u64); sh.classes.len()];
        let mut vbs_used = 0u64;
        for w in workers {
            if !w.idle() {
                return Err(format!("worker {} is busy", w.id));
            }
            for (&p, b) in &w.blocks {
                let at = |m: String| format!("worker {} block {p}: {m}", w.id);
                if let Some(o) = owner_of.insert(p, w.id) {
                    return Err(at(format!("also owned by worker {o}")));
                }
                if b.primary != p {
                    return Err(at(format!(
                        "filed under {p} but its primary is {}",
                        b.primary
                    )));
                }
                let c = b.class;
                let info = sh.classes.get(c).ok_or_else(|| at(format!("class {c}")))?;
                if b.slots != info.slots || b.id_kind != sh.policies[c as usize].id {
                    return Err(at("slots or id kind differ from its class".into()));
                }
                if b.count() as usize != b.objects.len() {
                    return Err(at("count differs from its objects".into()));
                }
                // Addresses: each in one block, directory and translation agree.
                let frame = space.frame_pages(p);
                let mut homes: BTreeMap<u64, u32> = BTreeMap::new();
                for (&vb, &n) in &b.vbs {
                    if let Some(other) = vb_of_block.insert(vb, p) {
                        return Err(at(format!("address {vb} also belongs to block {other}")));
                    }
                    let d = space.dir(vb);
                    if !d.used
                        || d.block != p
                        || d.owner != w.id
                        || d.class != c
                        || !d.seq.is_multiple_of(2)
                    {
                        return Err(at(format!("directory of address {vb} is {d:?}")));
                    }
                    if space.translation(vb) != frame {
                        return Err(at(format!("address {vb} does not translate to its memory")));
                    }
                    if n == 0 && vb != p {
                        return Err(at(format!("address {vb} homes no object but is kept")));
                    }
                    homes.insert(vb, 0);
                }
                if !b.vbs.contains_key(&p) {
                    return Err(at("its primary is not among its addresses".into()));
                }
                vbs_used += b.vbs.len() as u64;
                // Objects: metadata → memory.
                let size = info.slot_size as usize;
                let mut bytes = vec![0u8; bs as usize];
                sh.mem.read(space.vb_offset(p), &mut bytes);
                let mut claimed = BTreeSet::new();
                let mut live_bytes = 0u64;
                for (&id, o) in &b.objects {
                    if !b.slot_used(o.slot) || !claimed.insert(o.slot) {
                        return Err(at(format!("object {id}: slot {} unused or shared", o.slot)));
                    }
                    if b.id_kind == IdKind::Offset && id as u32 != o.slot {
                        return Err(at(format!("offset-named object {id} at slot {}", o.slot)));
                    }
                    *homes
                        .get_mut(&o.home)
                        .ok_or_else(|| at(format!("object {id} homed at foreign {}", o.home)))? +=
                        1;
                    let e = Expect {
                        id,
                        home: sh.home_of(o.home),
                    };
                    let off = o.slot as usize * size;
                    if let Err(f) = decode(&bytes[off..off + size], e) {
                        return Err(at(format!("object {id} at slot {}: {f}", o.slot)));
                    }
                    live_bytes += o.len as u64;
                }
                if claimed.len() != b.count() as usize {
                    return Err(at("bitmap and objects disagree".into()));
                }
                // Memory → metadata: no other slot holds an object.
                for k in 0..info.slots {
                    let h = ObjHeader(u64::from_ne_bytes(
                        bytes[k as usize * size..k as usize * size + 8]
                            .try_into()
                            .expect("8 bytes"),
                    ));
                    if h.used() != claimed.contains(&k) || h.locked() {
                        return Err(at(format!(
                            "slot {k}: header {h:?} disagrees with the metadata"
                        )));
                    }
                    if b.slot_used(k) != claimed.contains(&k) {
                        return Err(at(format!("slot {k}: bitmap disagrees")));
                    }
                }
                if homes != b.vbs {
                    return Err(at(format!(
                        "home counts {:?}, objects say {homes:?}",
                        b.vbs
                    )));
                }
                let k = &mut per_class[c as usize];
                k.0 += 1;
                k.1 += b.count() as u64;
                k.2 += live_bytes;
            }
            // The not-full lists.
            for (c, set) in w.not_full.iter().enumerate() {
                let want: BTreeSet<(u32, u64)> = w
                    .blocks
                    .iter()
                    .filter(|(_, b)| b.class as usize == c && !b.is_full())
                    .map(|(&p, b)| (b.free_slots(), p))
                    .collect();
                if *set != want {
                    return Err(format!(
                        "worker {}: not-full list of class {c} is stale",
                        w.id
                    ));
                }
            }
        }
        // The directory and the released addresses.
        let released: BTreeSet<u64> = space.released().into_iter().collect();
        for vb in 0..space.nvb {
            let d = space.dir(vb);
            let fresh = vb >= space.touched();
            match (vb_of_block.contains_key(&vb), d.used) {
                (true, true) => {}
                (false, false) if fresh => {
                    if d.gen != 0 || released.contains(&vb) {
                        return Err(format!("fresh address {vb} has a history"));
                    }
                }
                (false, false) => {
                    if !released.contains(&vb) {
                        return Err(format!("address {vb} is neither used nor released"));
                    }
                    if space.translation(vb).iter().any(Option::is_some) {
                        return Err(format!("released address {vb} is still mapped"));
                    }
                }
                (held, used) => {
                    return Err(format!(
                        "address {vb}: in a block {held}, directory used {used}"
                    ))
                }
            }
        }
        // Accounting.
        let a = &sh.acct;
        let blocks = owner_of.len() as u64;
        if a.blocks.load(Relaxed) != blocks || space.frames() != blocks {
            return Err(format!(
                "{blocks} blocks, accounting says {} and the block allocator {}",
                a.blocks.load(Relaxed),
                space.frames()
            ));
        }
        if a.vblocks_used.load(Relaxed) != vbs_used {
            return Err(format!(
                "{vbs_used} addresses in use, accounting says {}",
                a.vblocks_used.load(Relaxed)
            ));
        }
        let (mut objs, mut bytes) = (0, 0);
        for (c, &(blocks, n, b)) in per_class.iter().enumerate() {
            let k = a.class(c as u8);
            let got = (
                k.blocks.load(Relaxed),
                k.live_objects.load(Relaxed),
                k.live_bytes.load(Relaxed),
            );
            if got != (blocks, n, b) {
                return Err(format!(
                    "class {c}: accounting {got:?}, blocks hold {:?}",
                    (blocks, n, b)
                ));
            }
            objs += n;
            bytes += b;
        }
        if (a.live_objects.load(Relaxed), a.live_bytes.load(Relaxed)) != (objs, bytes) {
            return Err("live totals differ from the classes' sums".into());
        }
        Ok(())
    }
}
