//! A remote structure's life: create (with rollback), open (with magic and
//! version checks), destroy — written once for every structure.
//!
//! A structure lives in chunks of memory-node memory and is found by a
//! *descriptor*: a block whose address is registered under the named root
//! `KIND/NAME` on the lowest memory node (its *home*). The descriptor's
//! first word is the structure's [`Magic`]: a kind tag and a layout
//! version, so `open` tells a foreign or corrupted root ([`IndexError::Corrupt`])
//! from a structure written by another dmkit ([`IndexError::Version`]).
//!
//! # Who owns a structure's memory
//!
//! Every chunk of a structure — its descriptor, its initial image, and
//! every chunk its clients' allocators take later, in any process — belongs
//! to the structure's *chunk group* on its node, named like its root
//! (`KIND/NAME`; see `dmkit_memnode::node`). Each handle ([`Home`]) holds
//! one reference on the group on every memory node: [`Creation`] takes it
//! (with its first chunk on a node, or at publish), [`open`] takes it, and
//! [`Home::destroy`] drops it. **The last reference frees the structure**:
//! its chunks on every node and its roots. A process that dies — exits,
//! Ctrl-C, SIGKILL — drops its references with its session, so a killed
//! benchmark leaves nothing behind unless a live process still holds the
//! structure; a structure is never kept past its last holder.
//! `destroy()` on one of several handles therefore detaches that handle
//! (and succeeds); the structure goes with the last one.
//!
//! - [`Creation`] allocates the structure's chunks and writes its initial
//!   image; [`Creation::publish`] claims the root. Until then every chunk
//!   is freed if anything fails (or the creation is dropped): a failed
//!   `create` leaves nothing behind on any node.
//! - [`open`] finds the root (taking a reference), reads the descriptor
//!   and checks its magic.
//! - [`Home`] is what an open structure keeps of its identity: the fabric,
//!   its nodes and their region keys, and its group; [`Home::destroy`]
//!   drops its references.
//!
//! ```text
//!  home node root table            home node memory
//!  "race/orders" ─────────────────▶ +-------------------+
//!                                   | magic: tag | ver  |  descriptor (the structure's own layout)
//!                                   | ...               |
//!                                   +-------------------+
//! ```

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use dmkit_fabric::{Fabric, FabricError, GlobalAddr, NodeId, RemoteRef, Rkey, SyncQp};

use crate::error::IndexError;

/// The first word of a structure's descriptor: a six-byte kind tag and a
/// 16-bit layout version.
///
/// ```text
///  63        48 47                                        0
///  +-----------+------------------------------------------+
///  |  version  |  tag (6 ASCII bytes, first byte lowest)  |
///  +-----------+------------------------------------------+
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Magic {
    tag: [u8; 6],
    version: u16,
}

impl Magic {
    /// The magic of kind `tag` at layout `version`.
    pub const fn new(tag: &[u8; 6], version: u16) -> Magic {
        Magic { tag: *tag, version }
    }

    /// The descriptor word.
    pub const fn word(self) -> u64 {
        let t = &self.tag;
        (t[0] as u64)
            | (t[1] as u64) << 8
            | (t[2] as u64) << 16
            | (t[3] as u64) << 24
            | (t[4] as u64) << 32
            | (t[5] as u64) << 40
            | (self.version as u64) << 48
    }

    /// The layout version this magic names.
    pub const fn version(self) -> u16 {
        self.version
    }

    /// Checks a descriptor word read at `addr` for structure `kind`/`name`.
    pub fn check(
        self,
        word: u64,
        kind: &'static str,
        name: &str,
        addr: GlobalAddr,
    ) -> Result<(), IndexError> {
        const TAG: u64 = (1 << 48) - 1;
        if word & TAG != self.word() & TAG {
            return Err(IndexError::Corrupt {
                addr,
                what: "structure descriptor (its magic names another kind)",
            });
        }
        let found = (word >> 48) as u16;
        if found != self.version {
            return Err(IndexError::Version {
                kind,
                name: name.into(),
                found,
                supported: self.version,
            });
        }
        Ok(())
    }
}

/// The root a structure of `kind` named `name` is registered under.
pub fn root_name(kind: &str, name: &str) -> String {
    format!("{kind}/{name}")
}

/// Longest root name a memory node keeps.
const ROOT_NAME_MAX: usize = 64;

/// Checks a structure name before anything is allocated: the node's root
/// table takes 1..=64 bytes of `[A-Za-z0-9_./-]`, `KIND/` and suffixes
/// included.
fn check_name(kind: &'static str, name: &str, longest_suffix: usize) -> Result<(), IndexError> {
    let full = kind.len() + 1 + name.len() + longest_suffix;
    let ok_char = |c: char| c.is_ascii_alphanumeric() || "_./-".contains(c);
    if name.is_empty() || full > ROOT_NAME_MAX || !name.chars().all(ok_char) {
        return Err(IndexError::config(
            kind,
            format!(
                "name {name:?}: 1..={} bytes of [A-Za-z0-9_./-]",
                ROOT_NAME_MAX.saturating_sub(kind.len() + 1 + longest_suffix)
            ),
        ));
    }
    Ok(())
}

/// The memory nodes of a fabric (sorted) and the home, the lowest.
fn nodes_of(fabric: &dyn Fabric, kind: &'static str) -> Result<(NodeId, Vec<NodeId>), IndexError> {
    dmkit_fabric::home_node(fabric)
        .ok_or_else(|| IndexError::config(kind, "the fabric has no memory nodes"))
}

/// What an open structure keeps of its identity, shared by its clients.
pub struct Home {
    fabric: Arc<dyn Fabric>,
    kind: &'static str,
    name: String,
    desc: GlobalAddr,
    nodes: Vec<NodeId>,
    rkeys: Vec<Option<Rkey>>,
    /// The chunk group (the main root's name) this handle holds a
    /// reference on, on every node.
    group: Arc<str>,
    /// The references were dropped ([`Home::destroy`] ran).
    released: AtomicBool,
}

impl Home {
    fn new(
        fabric: Arc<dyn Fabric>,
        kind: &'static str,
        name: &str,
        desc: GlobalAddr,
        nodes: Vec<NodeId>,
        rkeys: Vec<Option<Rkey>>,
    ) -> Self {
        Home {
            fabric,
            kind,
            name: name.into(),
            desc,
            nodes,
            rkeys,
            group: root_name(kind, name).into(),
            released: AtomicBool::new(false),
        }
    }

    /// The fabric.
    pub fn fabric(&self) -> &Arc<dyn Fabric> {
        &self.fabric
    }

    /// The structure's kind.
    pub fn kind(&self) -> &'static str {
        self.kind
    }

    /// The structure's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The descriptor.
    pub fn desc(&self) -> GlobalAddr {
        self.desc
    }

    /// The home node (where the descriptor lives).
    pub fn home(&self) -> NodeId {
        self.desc.node()
    }

    /// Every memory node, sorted.
    pub fn nodes(&self) -> &[NodeId] {
        &self.nodes
    }

    /// The heap key of memory node `node`.
    #[inline]
    pub fn rkey(&self, node: NodeId) -> Result<Rkey, IndexError> {
        match self.rkeys.get(node as usize) {
            Some(Some(k)) => Ok(*k),
            _ => Err(FabricError::NoSuchNode(node).into()),
        }
    }

    /// The reference to `addr` (its node's heap key attached).
    #[inline]
    pub fn remote(&self, addr: GlobalAddr) -> Result<RemoteRef, IndexError> {
        Ok(RemoteRef::new(addr, self.rkey(addr.node())?))
    }

    /// The chunk group client allocators allocate in
    /// ([`dmkit_fabric::ControlPlane::alloc_group_chunk`]): their chunks
    /// live as long as the structure, whichever process took them.
    pub fn group(&self) -> Arc<str> {
        self.group.clone()
    }

    /// The value of the extra root `KIND/NAME/suffix`, if registered.
    pub fn extra_root(&self, suffix: &str) -> Result<Option<GlobalAddr>, IndexError> {
        let name = format!("{}/{suffix}", root_name(self.kind, &self.name));
        Ok(dmkit_fabric::find_root(
            self.fabric.as_ref(),
            self.home(),
            &name,
        )?)
    }

    /// A synchronous queue pair to `node` with `scratch` bytes (control
    /// paths: creation, destruction, checkers).
    pub fn sync_qp(&self, node: NodeId, scratch: usize) -> Result<SyncQp, IndexError> {
        Ok(SyncQp::new(self.fabric.as_ref(), node, scratch)?)
    }

    /// Drops this handle's references on the structure (one per memory
    /// node). The last reference of all handles, in every process, frees
    /// the structure: its chunks on every node, whichever client took them,
    /// and its roots (so the name can be claimed again). With other holders
    /// left the structure stays theirs and this handle is detached. Every
    /// node is tried even if one fails; the first failure is returned.
    /// [`IndexError::NotFound`] if this handle was destroyed already.
    /// No client of this handle may use the structure afterwards.
    pub fn destroy(&self) -> Result<(), IndexError> {
        if self.released.swap(true, Ordering::AcqRel) {
            return Err(IndexError::NotFound {
                kind: self.kind,
                name: self.name.clone(),
            });
        }
        release_everywhere(self.fabric.as_ref(), &self.nodes, &self.group)
    }
}

/// Drops one reference on `group` on each of `nodes`; the first failure.
fn release_everywhere(
    fabric: &dyn Fabric,
    nodes: &[NodeId],
    group: &str,
) -> Result<(), IndexError> {
    let mut first: Option<IndexError> = None;
    for &n in nodes {
        if let Err(e) = fabric.release_group(n, group) {
            first.get_or_insert(e.into());
        }
    }
    first.map_or(Ok(()), Err)
}

/// A structure being made: allocations and writes that are undone unless
/// [`Creation::publish`] registers the result.
pub struct Creation {
    fabric: Arc<dyn Fabric>,
    kind: &'static str,
    name: String,
    nodes: Vec<NodeId>,
    rkeys: Vec<Option<Rkey>>,
    /// Chunks allocated so far (freed on failure).
    taken: Vec<GlobalAddr>,
    /// The nodes where this creation took a reference on the group (with
    /// its first chunk there; dropped on failure).
    held: Vec<NodeId>,
    /// One synchronous queue pair per node written to.
    qps: Vec<(NodeId, SyncQp)>,
    /// Extra roots to claim with the main one: (suffix, value).
    extra: Vec<(String, u64)>,
    max_message: usize,
}

impl Creation {
    /// Starts making structure `kind`/`name` on `fabric`'s memory nodes.
    /// `suffixes` lists the extra roots it may claim (`KIND/NAME/suffix`),
    /// so the name is checked against the node's limit up front.
    pub fn begin(
        fabric: Arc<dyn Fabric>,
        kind: &'static str,
        name: &str,
        suffixes: &[&str],
    ) -> Result<Self, IndexError> {
        let longest = suffixes.iter().map(|s| s.len() + 1).max().unwrap_or(0);
        check_name(kind, name, longest)?;
        let (_, nodes) = nodes_of(fabric.as_ref(), kind)?;
        let rkeys = dmkit_fabric::heap_rkeys(fabric.as_ref(), &nodes)?;
        let max_message = fabric.caps().max_message.clamp(4096, 1 << 20);
        Ok(Creation {
            fabric,
            kind,
            name: name.into(),
            nodes,
            rkeys,
            taken: Vec::new(),
            held: Vec::new(),
            qps: Vec::new(),
            extra: Vec::new(),
            max_message,
        })
    }

    /// The fabric.
    pub fn fabric(&self) -> &Arc<dyn Fabric> {
        &self.fabric
    }

    /// The home node: the lowest id, where the descriptor goes.
    pub fn home(&self) -> NodeId {
        self.nodes[0]
    }

    /// Every memory node, sorted.
    pub fn nodes(&self) -> &[NodeId] {
        &self.nodes
    }

    /// The heap key of memory node `node`.
    pub fn rkey(&self, node: NodeId) -> Result<Rkey, IndexError> {
        match self.rkeys.get(node as usize) {
            Some(Some(k)) => Ok(*k),
            _ => Err(FabricError::NoSuchNode(node).into()),
        }
    }

    /// Allocates a chunk of `len` bytes on `node` in the structure's
    /// group (`what` names it in an out-of-memory error).
    pub fn alloc(
        &mut self,
        node: NodeId,
        len: u64,
        what: &'static str,
    ) -> Result<GlobalAddr, IndexError> {
        let group = root_name(self.kind, &self.name);
        let got = self
            .fabric
            .alloc_group_chunk(node, len, &group)
            .map_err(IndexError::oom(what))?;
        // The first chunk on a node takes this session's reference there,
        // unless the session held the group already (another handle of
        // the same name in this process): then there is none to drop on
        // failure, and publish takes one of its own.
        if got.took_ref {
            self.held.push(node);
        }
        self.taken.push(got.addr);
        Ok(got.addr)
    }

    /// The chunks allocated so far.
    pub fn taken(&self) -> &[GlobalAddr] {
        &self.taken
    }

    fn qp(&mut self, node: NodeId) -> Result<&mut SyncQp, IndexError> {
        let i = match self.qps.iter().position(|(n, _)| *n == node) {
            Some(i) => i,
            None => {
                let qp = SyncQp::new(self.fabric.as_ref(), node, self.max_message)?;
                self.qps.push((node, qp));
                self.qps.len() - 1
            }
        };
        Ok(&mut self.qps[i].1)
    }

    /// Writes `bytes` at `at` (in pieces the backend takes).
    pub fn write(&mut self, at: GlobalAddr, bytes: &[u8]) -> Result<(), IndexError> {
        let rk = self.rkey(at.node())?;
        let max = self.max_message;
        let qp = self.qp(at.node())?;
        for (i, piece) in bytes.chunks(max).enumerate() {
            qp.write(at.add((i * max) as u64), rk, piece)?;
        }
        Ok(())
    }

    /// Writes `len` bytes at `at`, made piece by piece by `image(from,
    /// len)` (for images too large to hold at once).
    pub fn write_image(
        &mut self,
        at: GlobalAddr,
        len: u64,
        image: impl Fn(u64, usize) -> Vec<u8>,
    ) -> Result<(), IndexError> {
        let rk = self.rkey(at.node())?;
        let max = self.max_message as u64;
        let qp = self.qp(at.node())?;
        let mut from = 0;
        while from < len {
            let n = (len - from).min(max) as usize;
            qp.write(at.add(from), rk, &image(from, n))?;
            from += n as u64;
        }
        Ok(())
    }

    /// Registers root `KIND/NAME/suffix` = `value` with the main one.
    pub fn extra_root(&mut self, suffix: &str, value: GlobalAddr) {
        self.extra.push((suffix.into(), value.raw()));
    }

    /// Claims the structure's root (and the extra ones) for descriptor
    /// `desc`, and holds the structure's group on every node (the roots
    /// are attached to it, so they go with its last reference).
    /// [`IndexError::AlreadyExists`] if another structure holds the name;
    /// on any failure every chunk is freed, no root stays claimed and no
    /// reference stays held.
    pub fn publish(mut self, desc: GlobalAddr) -> Result<Home, IndexError> {
        let f = self.fabric.clone();
        let home = self.home();
        let main = root_name(self.kind, &self.name);
        // The roots are attached to the group its holders claim: hold it
        // on the home node before claiming, if no chunk did.
        self.hold(home)?;
        let extra = self.extra.iter().map(|(s, v)| (format!("{main}/{s}"), *v));
        let roots: Vec<(String, u64)> = std::iter::once((main.clone(), desc.raw()))
            .chain(extra)
            .collect();
        for (i, (root, value)) in roots.iter().enumerate() {
            let claimed = dmkit_fabric::claim_root(f.as_ref(), home, root, *value);
            if !matches!(claimed, Ok(true)) {
                for (r, v) in &roots[..i] {
                    let _ = dmkit_fabric::release_root(f.as_ref(), home, r, *v);
                }
                return Err(match claimed {
                    Err(e) => e.into(),
                    _ => IndexError::AlreadyExists {
                        kind: self.kind,
                        name: self.name.clone(),
                    },
                });
            }
        }
        // A reference on every node: chunks other processes' clients take
        // there must not go with their session while this handle lives.
        for n in self.nodes.clone() {
            if let Err(e) = self.hold(n) {
                for (r, v) in &roots {
                    let _ = dmkit_fabric::release_root(f.as_ref(), home, r, *v);
                }
                return Err(e);
            }
        }
        self.taken.clear();
        self.held.clear();
        let nodes = std::mem::take(&mut self.nodes);
        let rkeys = std::mem::take(&mut self.rkeys);
        Ok(Home::new(f, self.kind, &self.name, desc, nodes, rkeys))
    }

    /// Takes this creation's reference on the group on `node` if it has none.
    fn hold(&mut self, node: NodeId) -> Result<(), IndexError> {
        if !self.held.contains(&node) {
            self.fabric
                .hold_group(node, &root_name(self.kind, &self.name))?;
            self.held.push(node);
        }
        Ok(())
    }
}

impl Drop for Creation {
    fn drop(&mut self) {
        // Not published: nothing may outlive a failed create — not its
        // chunks, not its references (which would keep a group, and so
        // another structure of the same name, alive past its holders).
        for c in self.taken.drain(..) {
            let _ = self.fabric.free_chunk(c);
        }
        let group = root_name(self.kind, &self.name);
        for n in self.held.drain(..) {
            let _ = self.fabric.release_group(n, &group);
        }
    }
}

/// Opens structure `kind`/`name`: finds its root on the home node, reads
/// `desc_len` bytes of its descriptor and checks the descriptor's magic
/// against `magic`. The handle holds a reference on the structure on every
/// node (see the module's ownership rule). Returns the structure's
/// [`Home`] and the descriptor's bytes (decode them through the
/// structure's descriptor type).
pub fn open(
    fabric: Arc<dyn Fabric>,
    kind: &'static str,
    name: &str,
    magic: Magic,
    desc_len: usize,
) -> Result<(Home, Vec<u8>), IndexError> {
    check_name(kind, name, 0)?;
    let (home, nodes) = nodes_of(fabric.as_ref(), kind)?;
    let rkeys = dmkit_fabric::heap_rkeys(fabric.as_ref(), &nodes)?;
    let root = root_name(kind, name);
    let not_found = || IndexError::NotFound {
        kind,
        name: name.into(),
    };
    // A set root comes with a reference on the home node's group.
    let desc = match fabric.open_root(home, &root)? {
        None => return Err(not_found()),
        Some(0) => {
            let _ = fabric.release_group(home, &root);
            return Err(not_found());
        }
        Some(v) => GlobalAddr::from_raw(v),
    };
    let mut held = vec![home];
    let checked = (|| {
        for &n in nodes.iter().filter(|&&n| n != home) {
            fabric.hold_group(n, &root)?;
            held.push(n);
        }
        let rk = rkeys[home as usize].ok_or(FabricError::NoSuchNode(home))?;
        let bytes =
            SyncQp::new(fabric.as_ref(), home, desc_len)?.read(desc, rk, desc_len.max(8))?;
        let word = u64::from_le_bytes(bytes[..8].try_into().expect("8 bytes"));
        magic.check(word, kind, name, desc)?;
        Ok::<_, IndexError>(bytes)
    })();
    match checked {
        Ok(bytes) => Ok((Home::new(fabric, kind, name, desc, nodes, rkeys), bytes)),
        Err(e) => {
            let _ = release_everywhere(fabric.as_ref(), &held, &root);
            Err(e)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn magic_words_tell_kind_from_version() {
        let m = Magic::new(b"dmTEST", 3);
        let a = GlobalAddr::new(0, 64);
        assert_eq!(m.word() & 0xFF, b'd' as u64);
        assert_eq!(m.word() >> 48, 3);
        assert!(m.check(m.word(), "test", "t", a).is_ok());
        assert!(matches!(
            m.check(Magic::new(b"dmTEST", 2).word(), "test", "t", a),
            Err(IndexError::Version {
                found: 2,
                supported: 3,
                ..
            })
        ));
        assert!(matches!(
            m.check(Magic::new(b"dmOTHR", 3).word(), "test", "t", a),
            Err(IndexError::Corrupt { .. })
        ));
        assert!(matches!(
            m.check(0, "test", "t", a),
            Err(IndexError::Corrupt { .. })
        ));
    }

    #[test]
    fn names_are_checked_against_the_root_table() {
        assert!(check_name("race", "orders-2026.v1", 4).is_ok());
        for bad in ["", "has space", "ünï", &"x".repeat(60)] {
            assert!(
                matches!(check_name("race", bad, 0), Err(IndexError::Config { .. })),
                "{bad:?}"
            );
        }
        // The extra roots' suffix counts against the limit.
        let name = "y".repeat(64 - "race/".len());
        assert!(check_name("race", &name, 0).is_ok());
        assert!(check_name("race", &name, 4).is_err());
    }
}
