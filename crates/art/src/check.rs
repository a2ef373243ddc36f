//! The structural checker: walks a quiescent tree over its own queue pairs
//! and verifies every invariant the protocols promise once no operation is
//! in flight.
//!
//! Internal nodes: known type (not deleted), depth equal to the key
//! position the path reaches them at, reverse pointer naming the parent,
//! the parent slot's type no larger than the node's, no filled slot past the
//! visible ones (a type switch left unfinished), no two slots with one
//! partial key, and a type no larger than the highest filled slot needs
//! (except the root, a NODE_256 from the start). Leaves: checksum, key
//! matching every partial key on its path, reverse pointer naming its
//! parent, slot length matching the leaf, lock free. Keys come out in
//! order.

use dmkit_index::RemoteMap;
use std::collections::HashMap;

use dmkit_fabric::{GlobalAddr, NodeId, SyncQp};

use zerocopy::FromBytes;

use crate::layout::*;
use crate::tree::ArtTree;

/// What the checker saw.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct TreeReport {
    /// Internal nodes reachable from the root, the root included.
    pub internal_nodes: u64,
    /// Live (valid) leaves: the tree's entries.
    pub leaves: u64,
    /// Deleted leaves still linked (and replaced ones: in a quiescent tree
    /// a replaced leaf has left its slot, so only after a crash).
    pub dead_leaves: u64,
    /// Deepest leaf, in internal nodes above it.
    pub height: u64,
    /// Every live entry in key order.
    pub entries: Vec<(Vec<u8>, Vec<u8>)>,
    /// What clients that died left behind, allowed only by
    /// [`check_tree_after_crash`]: leaves whose reverse pointer still
    /// names the parent before a split, leaves still locked, and slots filled
    /// past a node's visible ones (an unfinished type switch).
    pub crash_leftovers: u64,
}

/// Checks `tree` (no operation may run meanwhile). The error names the
/// first broken invariant and where.
pub fn check_tree(tree: &ArtTree) -> Result<TreeReport, String> {
    check(tree, false)
}

/// [`check_tree`] for a tree some of whose clients died: a leaf whose
/// reverse pointer was not yet moved to its new parent (its splitter died
/// after publishing the split, before the WRITE that follows it; no
/// operation reads a leaf's reverse pointer) and a leaf still locked (its
/// holder died; the lease lets the next writer break it) and a leaf still
/// marked replaced in its slot (an out-of-place update died between its
/// mark and the swing; the next client that meets the expired mark undoes
/// it, so the leaf is counted as the live entry it is) and a slot
/// filled past a node's visible ones (a type switch whose inserter died
/// before raising the header; the next insert into the node finishes it,
/// and no search sees the slot until then) and an internal node below a
/// header split whose splitter died before cutting its header (the
/// partial keys that moved stay in it, matching the path: readers skip
/// them) or before moving its reverse pointer to the new node are counted in
/// [`TreeReport::crash_leftovers`] instead of failing the check.
pub fn check_tree_after_crash(tree: &ArtTree) -> Result<TreeReport, String> {
    check(tree, true)
}

fn check(tree: &ArtTree, after_crash: bool) -> Result<TreeReport, String> {
    let f = tree.home.fabric().as_ref();
    let scratch = NODE_BYTES.max(tree.leaf_cap()).next_multiple_of(64);
    let mut qps: HashMap<NodeId, SyncQp> = HashMap::new();
    let mut read = |a: GlobalAddr, len: usize| -> Result<Vec<u8>, String> {
        let qp = match qps.entry(a.node()) {
            std::collections::hash_map::Entry::Occupied(o) => o.into_mut(),
            std::collections::hash_map::Entry::Vacant(v) => {
                v.insert(SyncQp::new(f, a.node(), scratch).map_err(|e| e.to_string())?)
            }
        };
        let rk = tree.home.rkey(a.node()).map_err(|e| e.to_string())?;
        qp.read(a, rk, len).map_err(|e| format!("reading {a}: {e}"))
    };
    let cfg = tree.config();
    let mut rep = TreeReport::default();
    // Depth-first in key order: (slot or the root, parent, arrival
    // position, path, height).
    type Visit = (Option<Slot>, GlobalAddr, usize, Vec<u8>, u64);
    let mut stack: Vec<Visit> = vec![(None, GlobalAddr::NULL, 0, Vec::new(), 0)];
    let mut last_key: Option<Vec<u8>> = None;
    while let Some((slot, parent, e, path, height)) = stack.pop() {
        if let Some(s) = slot.filter(|s| s.is_leaf()) {
            let (addr, p) = (parent, path);
            let at = |what: String| format!("node {addr} (path {p:02x?}): {what}");
            let len = if cfg.in_place {
                tree.leaf_cap()
            } else {
                s.units() as usize * 64
            };
            if len.div_ceil(64) as u64 != s.units() {
                return Err(at(format!(
                    "leaf slot of {} units for a {len}-byte leaf",
                    s.units()
                )));
            }
            let lb = read(s.ptr(), len)?;
            let l = decode_leaf(&lb, cfg.max_key)
                .ok_or_else(|| at(format!("leaf {} fails its checksum", s.ptr())))?;
            let mut tk = Vec::new();
            tree_key(l.item.key, cfg.max_key, &mut tk);
            if !tk.starts_with(&p) {
                return Err(at(format!(
                    "leaf {} key {:02x?} off its path {p:02x?}",
                    s.ptr(),
                    l.item.key
                )));
            }
            if l.rev != addr {
                if !after_crash {
                    return Err(at(format!("leaf {} reverse pointer {}", s.ptr(), l.rev)));
                }
                rep.crash_leftovers += 1;
            }
            if cfg.in_place && l.lock != 0 && after_crash {
                rep.crash_leftovers += 1;
            } else if cfg.in_place && l.lock != 0 {
                return Err(at(format!(
                    "leaf {} still locked by {:#x}",
                    s.ptr(),
                    l.lock
                )));
            }
            if l.item.replaced() {
                if !after_crash {
                    return Err(at(format!(
                        "leaf {} still marked replaced in its slot",
                        s.ptr()
                    )));
                }
                // A dead updater's mark: the leaf is live with its value
                // until the next client undoes the expired mark.
                rep.crash_leftovers += 1;
            }
            if l.item.valid() {
                if last_key.as_ref().is_some_and(|k| k >= &tk) {
                    return Err(at(format!("key {:02x?} out of order", l.item.key)));
                }
                last_key = Some(tk);
                rep.leaves += 1;
                rep.height = rep.height.max(height);
                rep.entries
                    .push((l.item.key.to_vec(), l.item.value.to_vec()));
            } else {
                rep.dead_leaves += 1;
            }
            continue;
        }
        let addr = slot.map_or(tree.root(), |s| s.ptr());
        let slot_ty = slot.and_then(|s| s.child_type());
        let b = read(addr, NODE_BYTES)?;
        let node =
            InternalNode::read_from_bytes(&b).map_err(|_| format!("node {addr}: short read"))?;
        let h = Header(node.head.header);
        let at = |what: String| format!("node {addr} (path {path:02x?}): {what}");
        let ty = h
            .ty()
            .ok_or_else(|| at(format!("bad type bits in header {:#x}", h.0)))?;
        if ty == NodeType::Deleted {
            return Err(at("deleted node still linked".into()));
        }
        let mut h = h;
        let mut split_left = false;
        if h.depth() != e {
            // A header split whose splitter died after publishing the new
            // node above this one, before cutting the partial keys that
            // moved there (and the slot's) from this header: readers skip
            // them as redundant (they match the path).
            let behind = e
                .checked_sub(h.depth())
                .filter(|&k| after_crash && (1..=h.prefix_len()).contains(&k));
            match behind {
                Some(k) if (0..k).all(|i| path.get(h.depth() + i) == Some(&h.prefix(i))) => {
                    rep.crash_leftovers += 1;
                    split_left = true;
                    h = h.cut(k - 1);
                }
                _ => {
                    return Err(at(format!(
                        "depth {} but reached at key position {e}",
                        h.depth()
                    )))
                }
            }
        }
        let rev = GlobalAddr::from_raw(node.head.rev);
        if rev != parent {
            // The same splitter, dead before the WRITE of this node's
            // reverse pointer that follows the cut.
            if !after_crash {
                return Err(at(format!("reverse pointer {rev} but parent {parent}")));
            }
            if !split_left {
                rep.crash_leftovers += 1;
            }
        }
        // A parent slot may lag its child's type (a type switch racing a
        // header split raised the node but not the new parent's slot);
        // readers then fetch the rest. It must never lead.
        if slot_ty.is_some_and(|t| t > ty) {
            return Err(at(format!(
                "type {ty:?} but the parent slot says {slot_ty:?}"
            )));
        }
        rep.internal_nodes += 1;
        let mut full = path.clone();
        full.extend((0..h.prefix_len()).map(|i| h.prefix(i)));
        let pos = full.len();
        let mut seen = [false; 256];
        let mut kids = Vec::new();
        let mut highest = None;
        for (i, &w) in node.slots.iter().enumerate() {
            let s = Slot(w);
            if s.is_empty() {
                continue;
            }
            if i >= ty.slots() {
                if after_crash {
                    // A type switch whose inserter died between its slot
                    // CAS and raising the header: the next insert into the
                    // node finds the slot taken and finishes the switch.
                    rep.crash_leftovers += 1;
                    continue;
                }
                return Err(at(format!(
                    "slot {i} filled past the visible {}",
                    ty.slots()
                )));
            }
            if std::mem::replace(&mut seen[s.pkey() as usize], true) {
                return Err(at(format!("two slots for partial key {:#04x}", s.pkey())));
            }
            highest = Some(i);
            kids.push(s);
        }
        if addr != tree.root() {
            if let Some(i) = highest {
                if cfg.node_layout.fitting(i) != ty {
                    return Err(at(format!("type {ty:?} for highest filled slot {i}")));
                }
            }
        }
        kids.sort_by_key(|s| std::cmp::Reverse(s.pkey()));
        for s in kids {
            let mut p = full.clone();
            p.push(s.pkey());
            stack.push((Some(s), addr, pos + 1, p, height + 1));
        }
    }
    Ok(rep)
}
