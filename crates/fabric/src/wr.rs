//! Work requests, batches and completions.
//!
//! A work request names remote memory (`GlobalAddr` + rkey) and, for READ and
//! WRITE, local registered memory ([`LocalRef`]: lkey, offset, length) — the
//! shape of an RDMA work request with one scatter/gather entry. Requests are
//! small `Copy` values; [`Batch`] builds them in place.

use crate::addr::{GlobalAddr, Rkey};
use crate::local::Lkey;

/// The verb of a request.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum VerbKind {
    /// RDMA READ (one remote range into local memory).
    Read,
    /// RDMA WRITE (local memory into one remote range).
    Write,
    /// 8-byte compare-and-swap.
    Cas,
    /// 8-byte masked compare-and-swap (mlx5's extended atomics).
    MaskedCas,
    /// 8-byte fetch-and-add.
    Faa,
}

impl VerbKind {
    /// Lower-case name (CLI, JSON).
    pub fn name(self) -> &'static str {
        match self {
            VerbKind::Read => "read",
            VerbKind::Write => "write",
            VerbKind::Cas => "cas",
            VerbKind::MaskedCas => "masked-cas",
            VerbKind::Faa => "faa",
        }
    }

    /// Whether the verb is an 8-byte atomic.
    #[inline]
    pub fn is_atomic(self) -> bool {
        matches!(self, VerbKind::Cas | VerbKind::MaskedCas | VerbKind::Faa)
    }
}

/// A range of registered local memory: `len` bytes at `offset` of the local
/// region registered under `lkey` on the posting queue pair.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LocalRef {
    /// The local memory, as registered on the posting queue pair.
    pub lkey: Lkey,
    /// Bytes to move.
    pub len: u32,
    /// Start of the range, in bytes from the start of the local memory.
    pub offset: u64,
}

impl LocalRef {
    /// `len` bytes at `offset` of region `lkey`.
    #[inline]
    pub const fn new(lkey: Lkey, offset: u64, len: u32) -> Self {
        Self { lkey, len, offset }
    }
}

/// A scatter/gather list: `count` entries starting at `first` in the
/// batch's entry table ([`Batch::sges`]), `len` bytes in total.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Sgl {
    /// Index of the first entry in the batch's entry table.
    pub first: u32,
    /// Number of entries, 1 ..= [`crate::Capabilities::max_sge`].
    pub count: u32,
    /// Sum of the entries' lengths in bytes: the size of the remote range.
    pub len: u32,
}

/// What a request does.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Op {
    /// READ `local.len` remote bytes into `local`.
    Read {
        /// Where the bytes land; its length is the READ's.
        local: LocalRef,
    },
    /// WRITE `local` to remote memory. `inline` asks the backend to copy the
    /// payload into the work request at post time, so the local bytes may be
    /// reused at once (limited by [`crate::Capabilities::max_inline`]).
    Write {
        /// The bytes to write; its length is the WRITE's.
        local: LocalRef,
        /// Copy the payload at post time (at most `max_inline` bytes).
        inline: bool,
    },
    /// 8-byte compare-and-swap; completes with the old value.
    Cas {
        /// The value the word must hold for the swap to happen.
        expected: u64,
        /// The value stored if it does.
        desired: u64,
    },
    /// Masked compare-and-swap (mlx5 semantics): succeeds iff
    /// `old & compare_mask == compare & compare_mask`, then stores
    /// `(old & !swap_mask) | (swap & swap_mask)`; completes with the old value.
    MaskedCas {
        /// Expected value, compared on the bits of `compare_mask`.
        compare: u64,
        /// Bits that take part in the comparison.
        compare_mask: u64,
        /// New value, stored on the bits of `swap_mask`.
        swap: u64,
        /// Bits that the swap replaces.
        swap_mask: u64,
    },
    /// 8-byte fetch-and-add (wrapping); completes with the old value.
    Faa {
        /// Added to the word, modulo 2^64 (a two's-complement negative
        /// subtracts).
        add: u64,
    },
    /// Vector READ: one remote range scattered into several local pieces,
    /// in order (RDMA READ with a scatter/gather list; memory-semantics
    /// §III-A "SGL"). Built with [`Batch::read_v`].
    ReadV {
        /// The local pieces, in the batch's entry table.
        sgl: Sgl,
    },
    /// Vector WRITE: several local pieces gathered into one remote range.
    /// Built with [`Batch::write_v`].
    WriteV {
        /// The local pieces, in the batch's entry table.
        sgl: Sgl,
    },
}

/// One work request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct WorkRequest {
    /// Caller's identifier, echoed in the completion.
    pub wr_id: u64,
    /// Remote address: memory node id (16 bits) | byte offset (48 bits); 8-byte
    /// aligned for atomics.
    pub remote: GlobalAddr,
    /// Key of the remote region the address lies in.
    pub rkey: Rkey,
    /// Signaled requests produce a completion; unsignaled ones only do when
    /// they fail or are flushed (as on an RC queue pair). Their effects —
    /// including READ data in local memory — happen either way.
    pub signaled: bool,
    /// The verb and its operands.
    pub op: Op,
}

impl WorkRequest {
    #[inline]
    const fn new(remote: GlobalAddr, rkey: Rkey, op: Op) -> Self {
        Self {
            wr_id: 0,
            remote,
            rkey,
            signaled: true,
            op,
        }
    }

    /// READ into `local`.
    #[inline]
    pub const fn read(remote: GlobalAddr, rkey: Rkey, local: LocalRef) -> Self {
        Self::new(remote, rkey, Op::Read { local })
    }

    /// WRITE from `local`.
    #[inline]
    pub const fn write(remote: GlobalAddr, rkey: Rkey, local: LocalRef) -> Self {
        Self::new(
            remote,
            rkey,
            Op::Write {
                local,
                inline: false,
            },
        )
    }

    /// CAS.
    #[inline]
    pub const fn cas(remote: GlobalAddr, rkey: Rkey, expected: u64, desired: u64) -> Self {
        Self::new(remote, rkey, Op::Cas { expected, desired })
    }

    /// Masked CAS (see [`Op::MaskedCas`]).
    #[inline]
    pub const fn masked_cas(
        remote: GlobalAddr,
        rkey: Rkey,
        compare: u64,
        compare_mask: u64,
        swap: u64,
        swap_mask: u64,
    ) -> Self {
        Self::new(
            remote,
            rkey,
            Op::MaskedCas {
                compare,
                compare_mask,
                swap,
                swap_mask,
            },
        )
    }

    /// FAA.
    #[inline]
    pub const fn faa(remote: GlobalAddr, rkey: Rkey, add: u64) -> Self {
        Self::new(remote, rkey, Op::Faa { add })
    }

    /// With the caller's id.
    #[inline]
    pub const fn id(mut self, wr_id: u64) -> Self {
        self.wr_id = wr_id;
        self
    }

    /// Unsignaled.
    #[inline]
    pub const fn unsignaled(mut self) -> Self {
        self.signaled = false;
        self
    }

    /// Inline (WRITE only; no effect on other verbs).
    #[inline]
    pub const fn inline(mut self) -> Self {
        if let Op::Write { local, .. } = self.op {
            self.op = Op::Write {
                local,
                inline: true,
            };
        }
        self
    }

    /// Sets the caller's id in place.
    #[inline]
    pub fn set_id(&mut self, wr_id: u64) -> &mut Self {
        self.wr_id = wr_id;
        self
    }

    /// Makes the request unsignaled, in place.
    #[inline]
    pub fn set_unsignaled(&mut self) -> &mut Self {
        self.signaled = false;
        self
    }

    /// The verb.
    #[inline]
    pub fn kind(&self) -> VerbKind {
        match self.op {
            Op::Read { .. } => VerbKind::Read,
            Op::Write { .. } => VerbKind::Write,
            Op::Cas { .. } => VerbKind::Cas,
            Op::MaskedCas { .. } => VerbKind::MaskedCas,
            Op::Faa { .. } => VerbKind::Faa,
            Op::ReadV { .. } => VerbKind::Read,
            Op::WriteV { .. } => VerbKind::Write,
        }
    }

    /// Bytes moved on the remote side.
    #[inline]
    pub fn len(&self) -> usize {
        match self.op {
            Op::Read { local } | Op::Write { local, .. } => local.len as usize,
            Op::ReadV { sgl } | Op::WriteV { sgl } => sgl.len as usize,
            _ => 8,
        }
    }

    /// Whether the request moves no bytes (always an error when posted).
    #[inline]
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// Requests gathered to be posted with one doorbell, and the
/// scatter/gather entries their vector requests refer to.
#[derive(Debug, Default, Clone)]
pub struct Batch {
    pub(crate) wrs: Vec<WorkRequest>,
    pub(crate) sges: Vec<LocalRef>,
}

impl Batch {
    /// An empty batch.
    pub fn new() -> Self {
        Self::default()
    }

    /// An empty batch with room for `n` requests.
    pub fn with_capacity(n: usize) -> Self {
        Self {
            wrs: Vec::with_capacity(n),
            sges: Vec::new(),
        }
    }

    /// Appends a request and returns it for `set_id`, `set_unsignaled`.
    ///
    /// Room is reserved before the request is stored, so the compiler builds
    /// it directly in its slot: a stack temporary copied after the capacity
    /// check cost a store-forwarding stall per request on the hot path.
    #[inline(always)]
    pub fn push(&mut self, wr: WorkRequest) -> &mut WorkRequest {
        self.wrs.reserve(1);
        let at = self.wrs.len();
        self.wrs.spare_capacity_mut()[0].write(wr);
        // SAFETY: `reserve(1)` guaranteed room for one more element and the
        // slot at index `at` was just initialised.
        unsafe { self.wrs.set_len(at + 1) };
        &mut self.wrs[at]
    }

    /// Appends a READ into `local`.
    #[inline(always)]
    pub fn read(&mut self, remote: GlobalAddr, rkey: Rkey, local: LocalRef) -> &mut WorkRequest {
        self.push(WorkRequest::read(remote, rkey, local))
    }

    /// Appends a WRITE from `local`.
    #[inline(always)]
    pub fn write(&mut self, remote: GlobalAddr, rkey: Rkey, local: LocalRef) -> &mut WorkRequest {
        self.push(WorkRequest::write(remote, rkey, local))
    }

    /// Appends a CAS.
    #[inline(always)]
    pub fn cas(
        &mut self,
        remote: GlobalAddr,
        rkey: Rkey,
        expected: u64,
        desired: u64,
    ) -> &mut WorkRequest {
        self.push(WorkRequest::cas(remote, rkey, expected, desired))
    }

    /// Appends a FAA.
    #[inline(always)]
    pub fn faa(&mut self, remote: GlobalAddr, rkey: Rkey, add: u64) -> &mut WorkRequest {
        self.push(WorkRequest::faa(remote, rkey, add))
    }

    fn sgl(&mut self, pieces: &[LocalRef]) -> Sgl {
        let first = u32::try_from(self.sges.len()).expect("fewer than 2^32 entries");
        let len = pieces.iter().map(|p| p.len as u64).sum::<u64>();
        self.sges.extend_from_slice(pieces);
        Sgl {
            first,
            count: pieces.len() as u32,
            len: u32::try_from(len).unwrap_or(u32::MAX),
        }
    }

    /// Appends a vector READ: `remote[0..Σlen)` scattered into `pieces` in order.
    pub fn read_v(
        &mut self,
        remote: GlobalAddr,
        rkey: Rkey,
        pieces: &[LocalRef],
    ) -> &mut WorkRequest {
        let sgl = self.sgl(pieces);
        self.push(WorkRequest::new(remote, rkey, Op::ReadV { sgl }))
    }

    /// Appends a vector WRITE: `pieces` gathered, in order, into `remote[0..Σlen)`.
    pub fn write_v(
        &mut self,
        remote: GlobalAddr,
        rkey: Rkey,
        pieces: &[LocalRef],
    ) -> &mut WorkRequest {
        let sgl = self.sgl(pieces);
        self.push(WorkRequest::new(remote, rkey, Op::WriteV { sgl }))
    }

    /// The scatter/gather entries of this batch's vector requests.
    pub fn sges(&self) -> &[LocalRef] {
        &self.sges
    }

    /// Appends a copy of `wr` taken from batch `from`, bringing the
    /// scatter/gather entries of a vector request along.
    pub fn push_from(&mut self, from: &Batch, wr: &WorkRequest) -> &mut WorkRequest {
        let mut wr = *wr;
        if let Op::ReadV { sgl } | Op::WriteV { sgl } = &mut wr.op {
            let (a, n) = (sgl.first as usize, sgl.count as usize);
            let first = self.sges.len() as u32;
            self.sges.extend_from_slice(&from.sges[a..a + n]);
            sgl.first = first;
        }
        self.push(wr)
    }

    /// Number of requests.
    #[inline]
    pub fn len(&self) -> usize {
        self.wrs.len()
    }

    /// Whether the batch is empty.
    #[inline]
    pub fn is_empty(&self) -> bool {
        self.wrs.is_empty()
    }

    /// The requests.
    pub fn requests(&self) -> &[WorkRequest] {
        &self.wrs
    }

    /// The requests, mutable (e.g. to make all but the last unsignaled).
    pub fn requests_mut(&mut self) -> &mut [WorkRequest] {
        &mut self.wrs
    }

    /// Drops all requests.
    #[inline]
    pub fn clear(&mut self) {
        self.wrs.clear();
        self.sges.clear();
    }
}

/// The completion of one request (24 bytes: completions cross queues on the
/// hot path; the details of a failure, which is rare, live behind the box).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Completion {
    /// The [`WorkRequest::wr_id`] of the request this completes.
    pub wr_id: u64,
    /// Old value for atomics, bytes moved for READ/WRITE; or the failed
    /// request, named by its batch position, id, verb and address.
    pub result: Result<u64, Box<crate::RequestError>>,
}
const _: () = assert!(std::mem::size_of::<Completion>() == 24);

impl Completion {
    /// The failure, if any.
    #[inline]
    pub fn error(&self) -> Option<&crate::RequestError> {
        self.result.as_ref().err().map(|e| &**e)
    }

    /// Why it failed, if it did.
    #[inline]
    pub fn verb_error(&self) -> Option<&crate::VerbError> {
        self.error().map(|e| &e.error)
    }
}
