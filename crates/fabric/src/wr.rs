//! Work requests, batches and completions.
//!
//! Buffers are *owned* by a request while it is in flight and handed back in
//! its [`Completion`] (the io_uring / tokio-uring model). That keeps the
//! contract sound for every backend: a NIC may DMA into a READ buffer after
//! `post` returns, a simulator may apply a WRITE at a later virtual time, and
//! no borrow can dangle meanwhile. Callers recycle the returned `Vec`s, so the
//! steady state allocates nothing.

use crate::addr::{GlobalAddr, Rkey};

/// The verb of a request.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum VerbKind {
    Read,
    Write,
    Cas,
    MaskedCas,
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
    pub fn is_atomic(self) -> bool {
        matches!(self, VerbKind::Cas | VerbKind::MaskedCas | VerbKind::Faa)
    }
}

/// What a request does.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Op {
    /// READ `buf.len()` bytes into `buf`.
    Read { buf: Vec<u8> },
    /// WRITE `buf`. `inline` asks the backend to copy the payload into the
    /// work request at post time (limited by [`crate::Capabilities::max_inline`]).
    Write { buf: Vec<u8>, inline: bool },
    /// 8-byte compare-and-swap; completes with the old value.
    Cas { expected: u64, desired: u64 },
    /// Masked compare-and-swap (mlx5 semantics): succeeds iff
    /// `old & compare_mask == compare & compare_mask`, then stores
    /// `(old & !swap_mask) | (swap & swap_mask)`; completes with the old value.
    MaskedCas {
        compare: u64,
        compare_mask: u64,
        swap: u64,
        swap_mask: u64,
    },
    /// 8-byte fetch-and-add (wrapping); completes with the old value.
    Faa { add: u64 },
}

/// One work request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WorkRequest {
    /// Caller's identifier, echoed in the completion.
    pub wr_id: u64,
    pub remote: GlobalAddr,
    pub rkey: Rkey,
    /// Signaled requests produce a completion; unsignaled ones only do when
    /// they fail (as on an RC queue pair).
    pub signaled: bool,
    pub op: Op,
}

impl WorkRequest {
    fn new(remote: GlobalAddr, rkey: Rkey, op: Op) -> Self {
        Self {
            wr_id: 0,
            remote,
            rkey,
            signaled: true,
            op,
        }
    }

    /// READ into `buf` (its length is the read length).
    pub fn read(remote: GlobalAddr, rkey: Rkey, buf: Vec<u8>) -> Self {
        Self::new(remote, rkey, Op::Read { buf })
    }

    /// WRITE of `buf`.
    pub fn write(remote: GlobalAddr, rkey: Rkey, buf: Vec<u8>) -> Self {
        Self::new(remote, rkey, Op::Write { buf, inline: false })
    }

    /// CAS.
    pub fn cas(remote: GlobalAddr, rkey: Rkey, expected: u64, desired: u64) -> Self {
        Self::new(remote, rkey, Op::Cas { expected, desired })
    }

    /// Masked CAS (see [`Op::MaskedCas`]).
    pub fn masked_cas(
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
    pub fn faa(remote: GlobalAddr, rkey: Rkey, add: u64) -> Self {
        Self::new(remote, rkey, Op::Faa { add })
    }

    /// Sets the caller's id.
    pub fn id(mut self, wr_id: u64) -> Self {
        self.wr_id = wr_id;
        self
    }

    /// Makes the request unsignaled.
    pub fn unsignaled(mut self) -> Self {
        self.signaled = false;
        self
    }

    /// Marks a WRITE inline (no effect on other verbs).
    pub fn inline(mut self) -> Self {
        if let Op::Write { inline, .. } = &mut self.op {
            *inline = true;
        }
        self
    }

    /// The verb.
    pub fn kind(&self) -> VerbKind {
        match self.op {
            Op::Read { .. } => VerbKind::Read,
            Op::Write { .. } => VerbKind::Write,
            Op::Cas { .. } => VerbKind::Cas,
            Op::MaskedCas { .. } => VerbKind::MaskedCas,
            Op::Faa { .. } => VerbKind::Faa,
        }
    }

    /// Bytes moved on the remote side.
    pub fn len(&self) -> usize {
        match &self.op {
            Op::Read { buf } | Op::Write { buf, .. } => buf.len(),
            _ => 8,
        }
    }

    /// Whether the request moves no bytes (always an error when posted).
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Takes the request's buffer (empty for atomics).
    pub fn take_buf(&mut self) -> Vec<u8> {
        match &mut self.op {
            Op::Read { buf } | Op::Write { buf, .. } => std::mem::take(buf),
            _ => Vec::new(),
        }
    }
}

/// Requests gathered to be posted with one doorbell.
#[derive(Debug, Default)]
pub struct Batch {
    pub(crate) wrs: Vec<WorkRequest>,
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
        }
    }

    /// Appends a request.
    pub fn push(&mut self, wr: WorkRequest) -> &mut Self {
        self.wrs.push(wr);
        self
    }

    /// Number of requests.
    pub fn len(&self) -> usize {
        self.wrs.len()
    }

    /// Whether the batch is empty.
    pub fn is_empty(&self) -> bool {
        self.wrs.is_empty()
    }

    /// The requests.
    pub fn requests(&self) -> &[WorkRequest] {
        &self.wrs
    }

    /// Drops all requests.
    pub fn clear(&mut self) {
        self.wrs.clear();
    }

    /// Moves the requests out, leaving the batch empty (its capacity kept).
    pub fn drain(&mut self) -> std::vec::Drain<'_, WorkRequest> {
        self.wrs.drain(..)
    }
}

/// The completion of one request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Completion {
    pub wr_id: u64,
    /// Position of the request in the batch it was posted with.
    pub index: usize,
    pub kind: VerbKind,
    pub remote: GlobalAddr,
    /// The request's buffer, handed back (READ data is in it). Empty for atomics.
    pub buf: Vec<u8>,
    /// Old value for atomics, bytes moved for READ/WRITE; or why it failed.
    pub result: Result<u64, crate::VerbError>,
}

impl Completion {
    /// The failure as a [`crate::RequestError`] naming the request, if any.
    pub fn error(&self) -> Option<crate::RequestError> {
        self.result.as_ref().err().map(|e| crate::RequestError {
            index: self.index,
            wr_id: self.wr_id,
            kind: self.kind,
            remote: self.remote,
            error: e.clone(),
        })
    }
}
