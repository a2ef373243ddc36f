//! The chain checker: reads a quiescent store and checks every key's chain
//! — that it is acyclic, made of the key's valid versions, ends at a tail
//! whose empty word names the key, that the directory's head and shortcut
//! are on it, that no key has two chains — and, given how many versions
//! clients linked, that none was lost.

use std::collections::{HashMap, HashSet};

use dmkit_fabric::{GlobalAddr, NodeId, SyncQp};

use crate::hint::KeyHash;
use crate::layout::*;
use crate::store::CloverKv;

/// What the checker saw.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ChainReport {
    /// Keys with a chain.
    pub keys: u64,
    /// Versions reachable from the heads.
    pub versions: u64,
    /// Keys whose tail is a value.
    pub present: u64,
    /// The longest chain.
    pub longest: u64,
}

/// Checks every chain of `kv`, which nobody may change meanwhile. With
/// `linked = Some(n)`: `n` versions were linked in all (each successful
/// insert, update and delete links one), and the versions reachable plus
/// those the metadata server cut must make `n` — a version linked behind
/// one that never was would be missing.
///
/// The error says which key and version broke which rule.
pub fn check_chains(kv: &CloverKv, linked: Option<u64>) -> Result<ChainReport, String> {
    let fabric = kv.home().fabric().clone();
    let mut qps: HashMap<NodeId, SyncQp> = HashMap::new();
    let cfg = &kv.cfg;
    let read_len = cfg.read_bytes();
    let mut read = |at: GlobalAddr, len: usize| -> Result<Vec<u8>, String> {
        let rk = kv.home().rkey(at.node()).map_err(|e| e.to_string())?;
        if let std::collections::hash_map::Entry::Vacant(v) = qps.entry(at.node()) {
            v.insert(SyncQp::new(fabric.as_ref(), at.node(), 1 << 16).map_err(|e| e.to_string())?);
        }
        let qp = qps.get_mut(&at.node()).expect("inserted above");
        qp.read(at, rk, len)
            .map_err(|e| format!("READ at {at}: {e}"))
    };
    let mut report = ChainReport::default();
    let mut seen_keys: HashSet<Vec<u8>> = HashSet::new();
    let slots = cfg.dir_slots;
    let piece = 256u64;
    let mut from = 0;
    while from < slots {
        let n = piece.min(slots - from);
        let bytes = read(
            kv.directory().add(DIR_ENTRY * from),
            (n * DIR_ENTRY) as usize,
        )?;
        for i in 0..n {
            let off = (i * DIR_ENTRY) as usize;
            let e = DirEntry {
                head: u64::from_le_bytes(bytes[off..off + 8].try_into().expect("8 bytes")),
                shortcut: u64::from_le_bytes(bytes[off + 8..off + 16].try_into().expect("8 bytes")),
            };
            if !e.used() {
                continue;
            }
            let slot = from + i;
            let (len, present, key) =
                check_chain(&mut read, slot, &e, read_len, cfg.seed, kv.home().home())?;
            if !seen_keys.insert(key.clone()) {
                return Err(format!(
                    "key {key:02x?} has two chains (the second at entry {slot})"
                ));
            }
            report.keys += 1;
            report.versions += len;
            report.present += present as u64;
            report.longest = report.longest.max(len);
        }
        from += n;
    }
    if let Some(n) = linked {
        let cut = kv.mds_stats().cut;
        if report.versions + cut != n {
            return Err(format!(
                "{} versions are on the chains and the metadata server cut {cut}, but clients linked {n}: {}",
                report.versions,
                if report.versions + cut < n {
                    "versions were lost"
                } else {
                    "versions appeared that nobody linked"
                }
            ));
        }
    }
    Ok(report)
}

/// Checks the chain of entry `slot`; returns (its length, whether its tail
/// is a value, its key).
fn check_chain(
    read: &mut impl FnMut(GlobalAddr, usize) -> Result<Vec<u8>, String>,
    slot: u64,
    e: &DirEntry,
    read_len: usize,
    seed: u64,
    home: NodeId,
) -> Result<(u64, bool, Vec<u8>), String> {
    let shortcut = e.shortcut_addr(home);
    let mut at = e.head_addr();
    let mut visited: HashSet<GlobalAddr> = HashSet::new();
    let mut key: Option<Vec<u8>> = None;
    let mut link_kind: Option<Kind> = None;
    let mut shortcut_seen = shortcut.is_none();
    loop {
        if !visited.insert(at) {
            return Err(format!("entry {slot}: the chain loops back to {at}"));
        }
        // In two pieces: a READ of a whole version is what a switch that
        // steers Clover's READs recognises (and would move).
        let mut b = read(at, HEADER)?;
        b.extend(read(at.add(HEADER as u64), read_len - HEADER)?);
        let v = Version::decode(&b).ok_or_else(|| {
            format!(
                "entry {slot}: {at} (version {} of the chain) is not a valid version",
                visited.len()
            )
        })?;
        if v.this != at || v.key_id != slot {
            return Err(format!(
                "entry {slot}: the version at {at} says it is at {} of key id {}",
                v.this, v.key_id
            ));
        }
        match &key {
            None => {
                if KeyHash::of(&v.key, seed).fp() != e.fp() {
                    return Err(format!("entry {slot}: the fingerprint is not its key's"));
                }
                key = Some(v.key.clone());
            }
            Some(k) if *k != v.key => {
                return Err(format!("entry {slot}: version {at} holds another key"));
            }
            _ => {}
        }
        if let Some(k) = link_kind {
            if k != v.kind {
                return Err(format!(
                    "entry {slot}: the link to {at} names the wrong kind"
                ));
            }
        }
        shortcut_seen |= shortcut == Some(at);
        match v.next {
            Next::Empty { key: k, kind } => {
                if k != slot || kind != v.kind {
                    return Err(format!("entry {slot}: the tail's empty word names key {k}"));
                }
                if !shortcut_seen {
                    return Err(format!(
                        "entry {slot}: the shortcut {shortcut:?} is not on the chain"
                    ));
                }
                return Ok((
                    visited.len() as u64,
                    v.kind == Kind::Present,
                    key.expect("set at the head"),
                ));
            }
            Next::Link { to, kind } => {
                link_kind = Some(kind);
                at = to;
            }
            Next::Invalid => unreachable!("decode refuses invalid next words"),
        }
    }
}
