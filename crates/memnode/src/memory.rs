//! memfd-backed shared memory and its mappings.
//!
//! The data memfd is sized once and then sealed against shrinking and growing
//! (`F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL`), so no process that maps it
//! can ever be handed a `SIGBUS` because another party truncated the file.

use std::ffi::CStr;
use std::fs::File;
use std::num::NonZeroUsize;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd};
use std::ptr::NonNull;

use nix::fcntl::{fcntl, FcntlArg, OFlag, SealFlag};
use nix::sys::memfd::{memfd_create, MemFdCreateFlag};
use nix::sys::mman::{mmap, munmap, MapFlags, ProtFlags};

use crate::error::NodeError;

/// Creates a memfd of `len` bytes and seals its size.
pub fn create_sealed_memfd(name: &CStr, len: usize) -> Result<OwnedFd, NodeError> {
    let fd = memfd_create(
        name,
        MemFdCreateFlag::MFD_CLOEXEC | MemFdCreateFlag::MFD_ALLOW_SEALING,
    )
    .map_err(|e| NodeError::os("memfd_create", e))?;
    let file = File::from(fd);
    file.set_len(len as u64).map_err(|e| NodeError::Io {
        what: "ftruncate memfd",
        source: e,
    })?;
    let fd = OwnedFd::from(file);
    fcntl(
        fd.as_raw_fd(),
        FcntlArg::F_ADD_SEALS(
            SealFlag::F_SEAL_SHRINK | SealFlag::F_SEAL_GROW | SealFlag::F_SEAL_SEAL,
        ),
    )
    .map_err(|e| NodeError::os("F_ADD_SEALS", e))?;
    Ok(fd)
}

/// Checks that `fd` carries the shrink seal (clients verify what they map).
pub fn is_shrink_sealed(fd: BorrowedFd<'_>) -> bool {
    match fcntl(fd.as_raw_fd(), FcntlArg::F_GET_SEALS) {
        Ok(bits) => SealFlag::from_bits_truncate(bits).contains(SealFlag::F_SEAL_SHRINK),
        Err(_) => false,
    }
}

/// Reopens a memfd read-only through `/proc/self/fd`, so a receiver of the new
/// descriptor cannot map it writable.
pub fn reopen_read_only(fd: BorrowedFd<'_>) -> Result<OwnedFd, NodeError> {
    let path = format!("/proc/self/fd/{}", fd.as_raw_fd());
    let file = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags_cloexec()
        .open(&path)
        .map_err(|e| NodeError::Io {
            what: "reopen memfd read-only",
            source: e,
        })?;
    Ok(OwnedFd::from(file))
}

trait CloexecExt {
    fn custom_flags_cloexec(&mut self) -> &mut Self;
}
impl CloexecExt for std::fs::OpenOptions {
    fn custom_flags_cloexec(&mut self) -> &mut Self {
        use std::os::unix::fs::OpenOptionsExt;
        self.custom_flags(OFlag::O_CLOEXEC.bits())
    }
}

/// A shared mapping of (part of) a memfd. Unmapped on drop.
#[derive(Debug)]
pub struct Mapping {
    ptr: NonNull<u8>,
    len: usize,
    writable: bool,
}

// SAFETY: the mapping is plain shared memory; every access through it goes
// through atomics (see `fabric::shm` and `node.rs`), so sharing the pointer
// across threads is sound.
unsafe impl Send for Mapping {}
// SAFETY: as above: no `&mut` access to the mapped bytes is ever handed out.
unsafe impl Sync for Mapping {}

impl Mapping {
    /// Maps `len` bytes of `fd` from offset 0, `MAP_SHARED`.
    pub fn map(fd: BorrowedFd<'_>, len: usize, writable: bool) -> Result<Self, NodeError> {
        let nz = NonZeroUsize::new(len).ok_or(NodeError::Config("cannot map zero bytes".into()))?;
        let prot = if writable {
            ProtFlags::PROT_READ | ProtFlags::PROT_WRITE
        } else {
            ProtFlags::PROT_READ
        };
        // SAFETY: we map a fresh range chosen by the kernel (addr = None), so no
        // existing Rust object is aliased; the fd is a memfd whose size is at least
        // `len` (the caller checked it, or created it), and it is sealed against
        // shrinking so later accesses cannot fault with SIGBUS.
        let ptr = unsafe { mmap(None, nz, prot, MapFlags::MAP_SHARED, fd.as_fd(), 0) }
            .map_err(|e| NodeError::os("mmap", e))?;
        Ok(Self {
            ptr: ptr.cast(),
            len,
            writable,
        })
    }

    /// Base pointer of the mapping.
    #[inline]
    pub fn as_ptr(&self) -> *mut u8 {
        self.ptr.as_ptr()
    }

    /// Length in bytes.
    #[inline]
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether the mapping has zero length (never true: construction forbids it).
    #[inline]
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Whether the mapping was made writable.
    pub fn writable(&self) -> bool {
        self.writable
    }
}

impl Drop for Mapping {
    fn drop(&mut self) {
        // SAFETY: ptr/len describe exactly the range returned by mmap in `map`,
        // and nothing borrows from it past the Mapping's lifetime (users hold an
        // Arc to the mapping while they access it).
        let _ = unsafe { munmap(self.ptr.cast(), self.len) };
    }
}

/// Size of the file behind `fd` in bytes.
pub fn fd_len(fd: BorrowedFd<'_>) -> Result<u64, NodeError> {
    let st = nix::sys::stat::fstat(fd.as_raw_fd()).map_err(|e| NodeError::os("fstat", e))?;
    Ok(st.st_size as u64)
}

/// Makes the kernel map the page holding `w` for writing, leaving its value
/// as it is whoever else accesses it. An idempotent read-modify-write (an
/// OR of zero) would not do: compilers may lower it to a fenced load, and a
/// read fault maps the shared zero page (anonymous memory) or nothing new
/// (a memfd hole); the first real write then faults again on the data path.
/// A compare-exchange of the value just loaded stores it when it succeeds;
/// when it fails another thread has written the word, so its page is mapped.
pub fn touch(w: &std::sync::atomic::AtomicU64) {
    let v = w.load(std::sync::atomic::Ordering::Relaxed);
    let _ = w.compare_exchange(
        v,
        v,
        std::sync::atomic::Ordering::Relaxed,
        std::sync::atomic::Ordering::Relaxed,
    );
}
