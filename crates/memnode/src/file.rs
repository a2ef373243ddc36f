//! A memory node whose memory is a file: a persistent-memory stand-in
//! ([`crate::MemNode::with_memory_file`], `dmkit memnode --memory-file`).
//!
//! Two files make the node's state:
//!
//! - `PATH`, the data: the node's memory pages, mapped `MAP_SHARED` by
//!   the node and by its shm clients (instead of a sealed memfd). A
//!   one-sided WRITE lands in the kernel's page cache of the file.
//! - `PATH.meta`, what the node's own process held (text, [`Meta`]): the
//!   geometry, every chunk that outlives a session (group chunks and
//!   persistent chunks) and the named roots. It is rewritten whole —
//!   written to `PATH.meta.tmp`, then renamed over — after every request
//!   that changed it and before the request is answered, so a node killed
//!   at any instant leaves either the state before a request or the one
//!   after it, and a client never holds a chunk or root the file forgot.
//!
//! ## What it promises
//!
//! - **A killed process** (the node, its clients, SIGKILL included) loses
//!   nothing that completed: a WRITE that completed is in the page cache,
//!   which belongs to the kernel, and the metadata's rename is atomic. A
//!   node restarted on the same files finds every chunk group and root;
//!   the groups wait, held by no session, until clients open them again
//!   (`OpenRoot`, `HoldGroup`), and `dmkit node gc` (admin) collects the
//!   ones nobody wants. For the same reason a running file-backed node
//!   frees no group when its last holder's session ends: a structure
//!   outlives its clients, as one in persistent memory does, and goes
//!   only by an explicit last release (its `destroy`) or `dmkit node gc`. Session chunks and the node's internal ranges die
//!   with the node (their pages are zeroed on restart: chunks start
//!   zeroed).
//! - **A kernel crash or power cut** loses what the kernel had not
//!   written back. A clean shutdown (`dmkit node shutdown`, SIGINT,
//!   SIGTERM) writes the data back (`fdatasync`) and syncs the metadata,
//!   so a clean stop survives one; a running node promises no more than
//!   the page cache. This is the limit of the shm backend: FORD's
//!   selective remote flush (a READ behind a WRITE, so the NIC has pushed
//!   the WRITE into persistent memory) has nothing to push here — a WRITE
//!   that completed is already as durable as the backend makes it.
//! - A remote page is only ever its own page of the file (or unmapped,
//!   as `node gc --root` fences a held group): moving it to another
//!   memory page (CoRM's compaction, `migrate_page`) is refused, because
//!   the page table lives in the control memfd, not in the file.
//! - The file is locked (`flock`, exclusive) while a node serves it, and
//!   the lock lasts while any process maps it: a second node on the same
//!   file is refused, and so is a restart while a client of the old node
//!   still maps its memory (and could write to it behind the new node).
//!   On shm a client outlives its node's death with its mapping: its
//!   one-sided verbs still reach the file (only its next RPC fails), as
//!   no NIC stops them. Stop or kill the clients, then restart the node. A memfd's seals cannot be
//!   put on a file: whoever truncates the file under a running node
//!   crashes its clients with `SIGBUS`.

use std::fmt::Write as _;
use std::fs::{File, OpenOptions};
use std::io::Write as _;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};

use crate::error::NodeError;

/// First line of a metadata file.
const HEADER: &str = "dmkit-memory-file 1";

/// The metadata a file-backed node keeps beside its data file.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct Meta {
    /// `node_id page_shift remote_pages phys_pages`: a file is only ever
    /// served with the geometry it was made with (its global addresses
    /// carry the node id).
    pub geometry: [u64; 4],
    /// Chunks that outlive their session: offset, length, and the group
    /// (`None`: a persistent chunk, whose session is gone after a restart).
    pub chunks: Vec<(u64, u64, Option<String>)>,
    /// Named roots: name, value, the group they are attached to.
    pub roots: Vec<(String, u64, Option<String>)>,
}

impl Meta {
    /// The text form (see the module docs).
    pub(crate) fn encode(&self) -> String {
        let mut s = String::new();
        let [id, shift, remote, phys] = self.geometry;
        let _ = writeln!(s, "{HEADER}\ngeometry {id} {shift} {remote} {phys}");
        for (off, len, group) in &self.chunks {
            match group {
                Some(g) => {
                    let _ = writeln!(s, "chunk {off} {len} group {g}");
                }
                None => {
                    let _ = writeln!(s, "chunk {off} {len} persistent");
                }
            }
        }
        for (name, value, group) in &self.roots {
            let _ = writeln!(s, "root {name} {value} {}", group.as_deref().unwrap_or("-"));
        }
        s
    }

    /// Parses [`Meta::encode`]'s text. Names are not checked here (the
    /// node checks them as it rebuilds its tables).
    pub(crate) fn decode(text: &str) -> Result<Meta, String> {
        let mut lines = text.lines().enumerate();
        match lines.next() {
            Some((_, HEADER)) => {}
            other => {
                return Err(format!(
                    "first line is {:?}, not {HEADER:?}",
                    other.map(|l| l.1)
                ))
            }
        }
        let num = |w: Option<&str>, n: usize| -> Result<u64, String> {
            w.and_then(|w| w.parse().ok())
                .ok_or_else(|| format!("line {}: a number expected", n + 1))
        };
        let mut m = Meta::default();
        let mut geometry = false;
        for (n, line) in lines {
            let mut w = line.split(' ');
            match w.next() {
                Some("geometry") => {
                    for g in &mut m.geometry {
                        *g = num(w.next(), n)?;
                    }
                    geometry = true;
                }
                Some("chunk") => {
                    let (off, len) = (num(w.next(), n)?, num(w.next(), n)?);
                    let owner = match (w.next(), w.next()) {
                        (Some("group"), Some(g)) => Some(g.to_owned()),
                        (Some("persistent"), None) => None,
                        _ => return Err(format!("line {}: bad chunk owner", n + 1)),
                    };
                    m.chunks.push((off, len, owner));
                }
                Some("root") => {
                    let name = w
                        .next()
                        .ok_or_else(|| format!("line {}: root without a name", n + 1))?;
                    let value = num(w.next(), n)?;
                    let group = match w.next() {
                        Some("-") => None,
                        Some(g) => Some(g.to_owned()),
                        None => return Err(format!("line {}: root without a group", n + 1)),
                    };
                    m.roots.push((name.to_owned(), value, group));
                }
                _ => return Err(format!("line {}: unknown record {line:?}", n + 1)),
            }
            if w.next().is_some() {
                return Err(format!("line {}: trailing words", n + 1));
            }
        }
        if !geometry {
            return Err("no geometry line".into());
        }
        Ok(m)
    }
}

/// The metadata file of data file `path`.
pub(crate) fn meta_path(path: &Path) -> PathBuf {
    let mut p = path.as_os_str().to_owned();
    p.push(".meta");
    PathBuf::from(p)
}

/// Writes `text` to `path` atomically: a temporary file renamed over it
/// (and, with `sync`, both synced to the disk).
pub(crate) fn write_atomically(path: &Path, text: &str, sync: bool) -> std::io::Result<()> {
    let mut tmp = path.as_os_str().to_owned();
    tmp.push(".tmp");
    let tmp = PathBuf::from(tmp);
    let mut f = OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .open(&tmp)?;
    f.write_all(text.as_bytes())?;
    if sync {
        f.sync_all()?;
    }
    drop(f);
    std::fs::rename(&tmp, path)?;
    if sync {
        if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
            File::open(dir)?.sync_all()?;
        }
    }
    Ok(())
}

/// What [`open_data_file`] found.
pub(crate) struct Opened {
    /// The data file, open read-write and locked.
    pub file: File,
    /// The metadata of an existing file; `None`: the file was made now.
    pub meta: Option<Meta>,
}

/// Opens (or makes) data file `path` of `len` bytes, locks it, and reads
/// its metadata. An existing file must have its metadata and be `len`
/// bytes; a file another node serves is refused.
pub(crate) fn open_data_file(path: &Path, len: u64) -> Result<Opened, NodeError> {
    let cfg = |s: String| NodeError::Config(format!("--memory-file {}: {s}", path.display()));
    let file = OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .mode(0o600)
        .open(path)
        .map_err(|e| cfg(format!("cannot open it: {e}")))?;
    match file.try_lock() {
        Ok(()) => {}
        Err(std::fs::TryLockError::WouldBlock) => {
            return Err(cfg(
                "another memory node (or a client of one) has it open".into()
            ))
        }
        Err(std::fs::TryLockError::Error(e)) => return Err(cfg(format!("cannot lock it: {e}"))),
    }
    let have = file
        .metadata()
        .map_err(|e| cfg(format!("cannot stat it: {e}")))?
        .len();
    let meta_file = meta_path(path);
    if have == 0 {
        file.set_len(len)
            .map_err(|e| cfg(format!("cannot size it to {len} B: {e}")))?;
        return Ok(Opened { file, meta: None });
    }
    let text = std::fs::read_to_string(&meta_file).map_err(|e| {
        cfg(format!(
            "it is {have} B but its metadata {} cannot be read ({e}): not a memory node's file, \
             or its metadata was lost; remove the file to start empty",
            meta_file.display()
        ))
    })?;
    let meta = Meta::decode(&text).map_err(|e| cfg(format!("{}: {e}", meta_file.display())))?;
    if have != len {
        return Err(cfg(format!(
            "it is {have} B; this geometry needs {len} B (start the node with the --size, \
             --page-size and --spare-pages it was made with)"
        )));
    }
    Ok(Opened {
        file,
        meta: Some(meta),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn metadata_round_trips_and_refuses_garbage() {
        let m = Meta {
            geometry: [3, 12, 256, 320],
            chunks: vec![(4096, 8192, Some("txn/bank".into())), (16384, 4096, None)],
            roots: vec![
                ("txn/bank".into(), 77, Some("txn/bank".into())),
                ("free".into(), 5, None),
            ],
        };
        assert_eq!(Meta::decode(&m.encode()), Ok(m.clone()));
        assert!(Meta::decode("").is_err());
        assert!(
            Meta::decode("dmkit-memory-file 1\n").is_err(),
            "no geometry"
        );
        let bad = m.encode().replace("persistent", "someone");
        assert!(Meta::decode(&bad).is_err());
        let trailing = m.encode().replace("root free 5 -", "root free 5 - x");
        assert!(Meta::decode(&trailing).is_err());
    }
}
