//! [`VerbsQp`]: one thread's RC queue pair to one memory node, behind the
//! fabric's [`QueuePair`] contract.
//!
//! - **Checks before the NIC.** Every request is checked against the
//!   client's copy of the node's region table with the same function the
//!   shm and sim backends use ([`dmkit_fabric::exec::check_remote`]), so a
//!   bad request fails with the same typed error everywhere and never
//!   reaches the wire. The valid prefix of a batch is posted; the bad
//!   request and the rest of its batch complete as failed / flushed after
//!   the prefix, in posting order, without effect.
//! - **One doorbell per batch.** A batch is one linked list of
//!   `ibv_send_wr` built in preallocated arrays and posted with one
//!   `ibv_post_send` (SMART-ART §4.1.3: doorbell batching). WRITEs marked
//!   inline go inline.
//! - **Selective signaling.** Requests the caller left unsignaled are
//!   posted unsignaled, except the last of each batch, which is always
//!   signaled so its completion retires the batch (and frees send-queue
//!   slots); its completion is swallowed if the caller did not ask for it.
//!   RC completes in order, so a completion of request `s` means every
//!   request before `s` is done.
//! - **Atomics' old values** land in a registered ring of 8-byte slots, one
//!   per send-queue slot, and become the completion's value.
//! - **Errors the NIC finds** (a region deregistered since the client
//!   fetched the table, a lost peer) move an RC pair to the error state. The
//!   failed request is reported with a typed error, the rest of its batch as
//!   flushed; then the pair is rebuilt — a new local QP, the node told over
//!   the control channel to replace its side — and requests of later
//!   batches, which the NIC flushed without effect, are posted again. The
//!   caller sees what the contract promises: the queue pair stays usable,
//!   and the memory node never restarts.
//! - **No wait without end.** The pair asks RC for 7 transport retries of
//!   ~67 ms each (`timeout` 14). A NIC that counts them fails a request to
//!   a silent peer after about half a second, but Soft-RoCE (`rxe_comp.c`,
//!   `COMPST_ERROR_RETRY`) takes a retry count of 7 as *unlimited*, as the
//!   specification does only for RNR retries: there a lost response is
//!   retransmitted for ever and its completion never comes. So the queue
//!   pair keeps its own clock: when requests have waited
//!   [`VerbsConfig::completion_timeout`] (default 10 s) with no completion
//!   at all, every request on the NIC fails with
//!   [`VerbError::NoCompletion`] — its effect unknown, so none is posted
//!   again — and the pair is rebuilt as after a NIC error. A caller never
//!   spins for ever on a lost completion.
//!
//! [`VerbsConfig::completion_timeout`]: crate::VerbsConfig::completion_timeout

use std::collections::VecDeque;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use dmkit_fabric::exec::{check_remote, sgl_entries};
use dmkit_fabric::{
    Batch, Capabilities, Completion, GlobalAddr, Lkey, LocalMem, LocalRef, NodeId, Op, PostError,
    QpStats, QueuePair, RequestError, VerbError, VerbKind, WorkRequest,
};
use dmkit_verbs_sys as sys;

use crate::ctl::NicRegion;
use crate::device::Device;
use crate::fabric::{connect_err, NodeLink};
use crate::qp::{Cq, Mr, QpSizes, RawQp};

/// Empty polls between two readings of the clock while requests wait.
const CLOCK_EVERY: u32 = 1024;

/// What the queue pair keeps of a completion entry.
#[derive(Debug, Clone, Copy)]
struct Wc {
    wr_id: u64,
    status: sys::ibv_wc_status,
}

/// A thread's completion queue, shared by its queue pairs. Completions of
/// other queue pairs met while polling are kept for them.
pub(crate) struct SharedCq {
    cq: Arc<Cq>,
    inner: Mutex<HashMap32>,
    /// Queue pairs the CQ is sized for, and how many use it.
    slots: usize,
    users: AtomicUsize,
}

type HashMap32 = std::collections::HashMap<u32, VecDeque<Wc>>;

impl SharedCq {
    pub(crate) fn new(cq: Arc<Cq>, slots: usize) -> Self {
        SharedCq {
            cq,
            inner: Mutex::new(HashMap32::new()),
            slots,
            users: AtomicUsize::new(0),
        }
    }

    /// Takes a place on this CQ if it is sized for one more queue pair.
    pub(crate) fn try_join(&self) -> bool {
        self.users
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |u| {
                (u < self.slots).then_some(u + 1)
            })
            .is_ok()
    }

    fn leave(&self, qpn: u32) {
        self.inner
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(&qpn);
        self.users.fetch_sub(1, Ordering::AcqRel);
    }

    /// Appends `qpn`'s completions to `out`, polling the CQ once.
    fn poll_for(&self, qpn: u32, out: &mut Vec<Wc>) -> Result<(), VerbError> {
        let mut map = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        let mut wcs = [sys::ibv_wc::default(); 32];
        let n = self
            .cq
            .poll(&mut wcs)
            .map_err(|_| VerbError::Nic("completion queue error"))?;
        for wc in &wcs[..n] {
            let w = Wc {
                wr_id: wc.wr_id,
                status: wc.status,
            };
            if wc.qp_num == qpn {
                if let Some(q) = map.get_mut(&qpn) {
                    out.extend(q.drain(..));
                }
                out.push(w);
            } else {
                map.entry(wc.qp_num).or_default().push_back(w);
            }
        }
        if let Some(q) = map.get_mut(&qpn) {
            out.extend(q.drain(..));
        }
        Ok(())
    }
}

#[derive(Debug, Clone)]
enum State {
    /// On the NIC; `seq` is its internal id.
    Posted { seq: u64 },
    /// Known outcome.
    Done(Result<u64, VerbError>),
    /// Checked, not yet posted.
    Queued,
    /// Flushed by the NIC behind another batch's error: post again.
    Replay,
}

#[derive(Debug, Clone)]
struct Entry {
    wr: WorkRequest,
    /// Scatter/gather pieces of a vector request.
    pieces: Vec<LocalRef>,
    /// Position in its batch.
    index: usize,
    batch: u64,
    /// Signaled on the NIC (the caller's wish, or last of its batch).
    nic_signaled: bool,
    state: State,
}

struct LocalSlot {
    /// `Err` if the NIC refused the registration (then every use fails).
    /// Declared before `mem`: deregistered before the memory is freed.
    mr: Result<Mr, String>,
    mem: LocalMem,
}

/// One thread's queue pair to one memory node.
pub struct VerbsQp {
    dev: Arc<Device>,
    link: Arc<NodeLink>,
    cq: Arc<SharedCq>,
    raw: RawQp,
    server_qpn: u32,
    own_doorbell: bool,
    caps: Capabilities,
    sizes: QpSizes,
    regions: Arc<Vec<NicRegion>>,
    locals: Vec<LocalSlot>,
    /// Old values of atomics: one 8-byte slot per send-queue slot (the
    /// registration is declared first so it goes before the memory).
    results_mr: Mr,
    results: LocalMem,
    ring: VecDeque<Entry>,
    next_seq: u64,
    next_batch: u64,
    /// Requests on the NIC not yet known done.
    in_flight: usize,
    /// Highest internal id a completion was seen for.
    max_seen: Option<u64>,
    ready: VecDeque<Completion>,
    /// Signaled requests in `ring` (completions the caller will get).
    owed: usize,
    disconnected: bool,
    /// How long requests may wait on the NIC with no completion at all.
    completion_timeout: Duration,
    /// When the requests now on the NIC last made progress (a post onto
    /// an idle pair, or a completion).
    progress_at: Instant,
    /// Empty polls since the last progress (the clock is read every
    /// `CLOCK_EVERY` of them, not on every spin).
    idle_polls: u32,
    /// Being dropped: a timeout then stops the pair instead of rebuilding.
    closing: bool,
    wrs: Vec<sys::ibv_send_wr>,
    sges: Vec<sys::ibv_sge>,
    wcs: Vec<Wc>,
    stats: QpStats,
}

// SAFETY: the raw pointers in the scratch arrays are rebuilt on every post
// and only point into memory the queue pair owns or keeps alive; the queue
// pair is used by one thread at a time (`&mut self`).
unsafe impl Send for VerbsQp {}

impl VerbsQp {
    pub(crate) fn connect(
        dev: Arc<Device>,
        link: Arc<NodeLink>,
        cq: Arc<SharedCq>,
        caps: Capabilities,
        sizes: QpSizes,
        own_doorbell: bool,
        completion_timeout: Duration,
    ) -> Result<Self, dmkit_fabric::FabricError> {
        let target = link.peer.clone();
        // Everything that can fail, so the place on the CQ the fabric took
        // for this queue pair is given back on one path.
        let setup = || -> Result<_, dmkit_fabric::FabricError> {
            let raw = RawQp::create(&dev, &cq.cq, sizes, own_doorbell)
                .map_err(|e| connect_err(&target, e))?;
            let psn = crate::random_psn();
            let server = link.connect_qp(dev.endpoint(raw.qpn(), psn), None)?;
            raw.connect(&server, psn)
                .map_err(|e| connect_err(&target, e))?;
            let results = LocalMem::new(sizes.send_wr as usize * 8);
            use sys::ibv_access_flags as A;
            // SAFETY: `results` lives as long as the queue pair, which drops
            // the MR first (field order) and waits for in-flight requests.
            let results_mr = unsafe {
                Mr::register(
                    &dev,
                    results.as_mut_ptr(),
                    results.len(),
                    A::IBV_ACCESS_LOCAL_WRITE,
                )
            }
            .map_err(|e| connect_err(&target, e))?;
            Ok((raw, server, results, results_mr))
        };
        let (raw, server, results, results_mr) = setup().inspect_err(|_| {
            cq.users.fetch_sub(1, Ordering::AcqRel);
        })?;
        let depth = sizes.send_wr as usize;
        Ok(VerbsQp {
            regions: link.regions(),
            dev,
            link,
            cq,
            raw,
            server_qpn: server.qpn,
            own_doorbell,
            caps,
            sizes,
            locals: Vec::new(),
            results,
            results_mr,
            ring: VecDeque::with_capacity(depth * 2),
            next_seq: 0,
            next_batch: 0,
            in_flight: 0,
            max_seen: None,
            ready: VecDeque::new(),
            owed: 0,
            disconnected: false,
            completion_timeout,
            progress_at: Instant::now(),
            idle_polls: 0,
            closing: false,
            wrs: Vec::with_capacity(depth),
            sges: Vec::with_capacity(depth * 2),
            wcs: Vec::with_capacity(64),
            stats: QpStats::default(),
        })
    }

    fn region(&self, rkey: u32) -> Result<(u64, u64, u64), VerbError> {
        self.regions
            .iter()
            .find(|r| r.info.rkey == rkey)
            .map(|r| (r.info.access, r.info.base, r.info.base + r.info.len))
            .ok_or(VerbError::BadKey { rkey })
    }

    fn nic_region(&self, rkey: u32) -> Option<NicRegion> {
        self.regions.iter().find(|r| r.info.rkey == rkey).copied()
    }

    /// Resolves a local range to an SGE, checking key and bounds.
    fn local_sge(&self, l: LocalRef) -> Result<sys::ibv_sge, VerbError> {
        let slot = self
            .locals
            .get(l.lkey as usize)
            .ok_or(VerbError::BadLkey(l.lkey))?;
        let mr = slot.mr.as_ref().map_err(|_| VerbError::BadLkey(l.lkey))?;
        match l.offset.checked_add(u64::from(l.len)) {
            Some(end) if end <= slot.mem.len() as u64 => Ok(sys::ibv_sge {
                addr: slot.mem.as_mut_ptr() as u64 + l.offset,
                length: l.len,
                lkey: mr.lkey(),
            }),
            _ => Err(VerbError::LocalOutOfBounds {
                lkey: l.lkey,
                offset: l.offset,
                len: l.len,
            }),
        }
    }

    /// Every check, without effect. Returns the request's SGE pieces. A key
    /// the cached table does not know makes one refresh of the table (a
    /// region registered after this queue pair connected).
    fn check(&mut self, wr: &WorkRequest, sges: &[LocalRef]) -> Result<Vec<LocalRef>, VerbError> {
        if self.region(wr.rkey).is_err() && wr.remote.node() == self.link.id {
            if let Ok(r) = self.link.refresh_regions() {
                self.regions = r;
            }
        }
        check_remote(self.link.id, &self.caps, wr, |k| self.region(k))?;
        match wr.op {
            Op::Read { local } | Op::Write { local, .. } => {
                self.local_sge(local)?;
                Ok(Vec::new())
            }
            Op::ReadV { sgl } | Op::WriteV { sgl } => {
                let pieces = sgl_entries(sges, sgl, self.caps.max_sge)?;
                for p in pieces {
                    self.local_sge(*p)?;
                }
                Ok(pieces.to_vec())
            }
            _ => Ok(Vec::new()),
        }
    }

    /// Appends entries `from..` of the ring (all checked, not yet on the
    /// NIC) to the scratch arrays and posts them as one list.
    fn post_entries(&mut self, from: usize) -> Result<(), VerbError> {
        self.wrs.clear();
        self.sges.clear();
        let n = self
            .ring
            .range(from..)
            .filter(|e| matches!(e.state, State::Queued | State::Replay))
            .count();
        if n == 0 {
            return Ok(());
        }
        // Reserve first: the list points into these arrays.
        let pieces: usize = self.ring.range(from..).map(|e| e.pieces.len().max(1)).sum();
        self.sges.reserve(pieces);
        self.wrs.reserve(n);
        let depth = self.sizes.send_wr as u64;
        for i in from..self.ring.len() {
            if !matches!(self.ring[i].state, State::Queued | State::Replay) {
                continue;
            }
            let wr = self.ring[i].wr;
            // The table may have been re-fetched since the checks (after a
            // NIC error); a region gone by now fails here, without effect.
            let Some(region) = self.nic_region(wr.rkey) else {
                self.ring[i].state = State::Done(Err(VerbError::BadKey { rkey: wr.rkey }));
                continue;
            };
            let seq = self.next_seq;
            self.next_seq += 1;
            let e = &self.ring[i];
            let remote_addr = region.nic_addr + (wr.remote.offset() - region.info.base);
            let first_sge = self.sges.len();
            let mut w = sys::ibv_send_wr {
                wr_id: seq,
                ..Default::default()
            };
            let mut flags = 0u32;
            if e.nic_signaled {
                flags |= sys::ibv_send_flags::IBV_SEND_SIGNALED.0;
            }
            match wr.op {
                Op::Read { .. } | Op::Write { .. } | Op::ReadV { .. } | Op::WriteV { .. } => {
                    match wr.op {
                        Op::Read { local } | Op::Write { local, .. } => {
                            let s = self.local_sge(local).expect("checked");
                            self.sges.push(s);
                        }
                        _ => {
                            for p in &self.ring[i].pieces {
                                let s = self.local_sge(*p).expect("checked");
                                self.sges.push(s);
                            }
                        }
                    }
                    w.opcode = if wr.kind() == VerbKind::Read {
                        sys::ibv_wr_opcode::IBV_WR_RDMA_READ
                    } else {
                        sys::ibv_wr_opcode::IBV_WR_RDMA_WRITE
                    };
                    if let Op::Write { inline: true, .. } = wr.op {
                        flags |= sys::ibv_send_flags::IBV_SEND_INLINE.0;
                    }
                    w.wr.rdma = sys::ibv_send_wr__bindgen_ty_2__bindgen_ty_1 {
                        remote_addr,
                        rkey: region.nic_rkey,
                    };
                }
                Op::Cas { .. } | Op::Faa { .. } | Op::MaskedCas { .. } => {
                    let slot = (seq % depth) * 8;
                    self.sges.push(sys::ibv_sge {
                        addr: self.results.as_mut_ptr() as u64 + slot,
                        length: 8,
                        lkey: self.results_mr.lkey(),
                    });
                    let (opcode, compare_add, swap) = match wr.op {
                        Op::Cas { expected, desired } => (
                            sys::ibv_wr_opcode::IBV_WR_ATOMIC_CMP_AND_SWP,
                            expected,
                            desired,
                        ),
                        Op::Faa { add } => {
                            (sys::ibv_wr_opcode::IBV_WR_ATOMIC_FETCH_AND_ADD, add, 0)
                        }
                        _ => unreachable!(
                            "masked CAS is refused by the checks (caps.masked_cas = false)"
                        ),
                    };
                    w.opcode = opcode;
                    w.wr.atomic = sys::ibv_send_wr__bindgen_ty_2__bindgen_ty_2 {
                        remote_addr,
                        compare_add,
                        swap,
                        rkey: region.nic_rkey,
                    };
                }
            }
            w.send_flags = flags;
            w.num_sge = (self.sges.len() - first_sge) as i32;
            // Pointer filled below, once the array no longer moves.
            w.sg_list = first_sge as *mut sys::ibv_sge;
            self.wrs.push(w);
            self.ring[i].state = State::Posted { seq };
        }
        let nw = self.wrs.len();
        if nw == 0 {
            return Ok(());
        }
        // The list's last request is always signaled, so whatever was
        // posted is retired by a completion.
        self.wrs[nw - 1].send_flags |= sys::ibv_send_flags::IBV_SEND_SIGNALED.0;
        let base = self.sges.as_mut_ptr();
        let wrs = self.wrs.as_mut_ptr();
        for k in 0..nw {
            // SAFETY: k < nw entries of `wrs`; the stored index is < sges.len(),
            // and neither array is resized until the post returns.
            unsafe {
                let w = &mut *wrs.add(k);
                w.sg_list = base.add(w.sg_list as usize);
                w.next = if k + 1 < nw {
                    wrs.add(k + 1)
                } else {
                    std::ptr::null_mut()
                };
            }
        }
        // SAFETY: the list is well formed (above); every SGE points into a
        // LocalMem registered on this device and kept alive by `locals` or
        // `results` until the request completes (drop waits for that).
        match unsafe { self.raw.post(wrs) } {
            Ok(()) => {
                if self.in_flight == 0 {
                    // Nothing was waiting: the clock starts with this post.
                    self.progress_at = Instant::now();
                    self.idle_polls = 0;
                }
                self.in_flight += nw;
                Ok(())
            }
            Err(_) => {
                // The pair is unusable. The requests before the failing one
                // may be on the NIC: stop it (they flush), then fail every
                // request not done -- including this list's, already marked
                // posted but never counted in flight, which no completion
                // would ever retire.
                // (Not harvested here: `post` still indexes the ring.)
                let _ = self.raw.to_error();
                let lost = VerbError::ConnectionLost(self.link.id);
                self.fail_unfinished(lost.clone());
                Err(lost)
            }
        }
    }

    /// Polls the CQ once and applies this queue pair's completions.
    fn drive(&mut self) {
        if self.in_flight == 0 {
            return;
        }
        let mut wcs = std::mem::take(&mut self.wcs);
        wcs.clear();
        if self.cq.poll_for(self.raw.qpn(), &mut wcs).is_err() {
            self.fail_all(VerbError::Nic("completion queue overrun"));
            return;
        }
        if let Some(m) = wcs.iter().map(|w| w.wr_id).max() {
            self.max_seen = self.max_seen.max(Some(m));
        }
        if wcs.is_empty() {
            self.idle_polls = self.idle_polls.wrapping_add(1);
            if self.idle_polls.is_multiple_of(CLOCK_EVERY)
                && self.progress_at.elapsed() >= self.completion_timeout
            {
                self.wcs = wcs;
                self.timed_out();
                return;
            }
        } else {
            self.progress_at = Instant::now();
            self.idle_polls = 0;
        }
        for wc in &wcs {
            self.apply(*wc);
        }
        self.wcs = wcs;
        self.harvest();
    }

    /// No completion came for `completion_timeout`: every request on the
    /// NIC fails with its effect unknown (none is posted again: a CAS the
    /// node did execute must not run twice), then the pair is rebuilt so
    /// later batches have a working connection.
    fn timed_out(&mut self) {
        let error = VerbError::NoCompletion {
            node: self.link.id,
            waited_ms: self.progress_at.elapsed().as_millis() as u64,
        };
        if self.closing {
            // No new pair for a queue pair on its way out: stop this one.
            let _ = self.raw.to_error();
            self.fail_all(error);
            return;
        }
        for e in self.ring.iter_mut() {
            if let State::Posted { .. } = e.state {
                self.in_flight -= 1;
                e.state = State::Done(Err(error.clone()));
            }
        }
        self.stats.errors += 1;
        // The rebuild drains whatever the old pair still reports (bounded)
        // and ignores it: those requests are accounted for above.
        // Nothing is in flight now; a later post onto the new pair starts
        // the clock again (`post_entries`).
        if let Err(e) = self.rebuild() {
            self.fail_all(e);
        }
        self.harvest();
    }

    /// Marks every posted request up to `wc.wr_id` done (RC order).
    fn apply(&mut self, wc: Wc) {
        let ok = wc.status == sys::ibv_wc_status::IBV_WC_SUCCESS;
        let mut error_at = None;
        for (i, e) in self.ring.iter_mut().enumerate() {
            let State::Posted { seq } = e.state else {
                continue;
            };
            if seq > wc.wr_id {
                break;
            }
            self.in_flight -= 1;
            if seq < wc.wr_id || ok {
                let v = match e.wr.op {
                    Op::Cas { .. } | Op::Faa { .. } | Op::MaskedCas { .. } => self
                        .results
                        .load_u64(((seq % u64::from(self.sizes.send_wr)) * 8) as usize),
                    _ => e.wr.len() as u64,
                };
                e.state = State::Done(Ok(v));
            } else {
                error_at = Some(i);
            }
        }
        if let Some(i) = error_at {
            self.nic_error(i, wc.status);
        }
    }

    /// The NIC failed ring entry `i`: report it, flush the rest of its
    /// batch, rebuild the pair, post later batches again.
    fn nic_error(&mut self, i: usize, status: sys::ibv_wc_status) {
        use sys::ibv_wc_status as S;
        let node = self.link.id;
        let e = &self.ring[i];
        let error = match status {
            S::IBV_WC_REM_ACCESS_ERR => VerbError::BadKey { rkey: e.wr.rkey },
            S::IBV_WC_RETRY_EXC_ERR | S::IBV_WC_RNR_RETRY_EXC_ERR | S::IBV_WC_WR_FLUSH_ERR => {
                VerbError::ConnectionLost(node)
            }
            S::IBV_WC_REM_INV_REQ_ERR => VerbError::Nic("remote invalid request"),
            S::IBV_WC_REM_OP_ERR => VerbError::Nic("remote operation error"),
            S::IBV_WC_LOC_PROT_ERR => VerbError::Nic("local protection error"),
            S::IBV_WC_LOC_LEN_ERR => VerbError::Nic("local length error"),
            _ => VerbError::Nic("a work-request error"),
        };
        let (batch, rkey) = (e.batch, e.wr.rkey);
        let used_nic_key = self.nic_region(rkey).map(|r| r.nic_rkey);
        // The region table may have changed under us: fetch it again so the
        // checks give precise errors from now on.
        if let Ok(r) = self.link.refresh_regions() {
            self.regions = r;
        }
        // The node re-registered the region under a new NIC key (a page
        // move on a provider without in-place re-registration): nothing
        // failed from the caller's view — post the request again.
        let rekeyed = matches!(error, VerbError::BadKey { .. })
            && self
                .regions
                .iter()
                .any(|r| r.info.rkey == rkey && Some(r.nic_rkey) != used_nic_key);
        if rekeyed {
            self.ring[i].state = State::Replay;
        } else {
            self.ring[i].state = State::Done(Err(error));
            self.stats.errors += 1;
        }
        for e in self.ring.iter_mut().skip(i + 1) {
            if let State::Posted { .. } = e.state {
                self.in_flight -= 1;
                e.state = if e.batch == batch && !rekeyed {
                    State::Done(Err(VerbError::Flushed))
                } else {
                    State::Replay
                };
            }
        }
        if let Err(e) = self.rebuild() {
            self.fail_all(e);
        }
    }

    /// Replaces the errored pair: drain its flushes, new local QP, node
    /// replaces its side, post the flushed later batches again.
    fn rebuild(&mut self) -> Result<(), VerbError> {
        let node = self.link.id;
        let _ = self.raw.to_error();
        // Drain what the old pair still reports (flushes); they were all
        // accounted for above, so only wait until the NIC is done with it.
        let deadline = Instant::now() + Duration::from_secs(2);
        let qpn = self.raw.qpn();
        let last = self.next_seq.saturating_sub(1);
        let mut seen_last = self.max_seen >= Some(last);
        let mut wcs = Vec::new();
        while !seen_last && Instant::now() < deadline {
            wcs.clear();
            if self.cq.poll_for(qpn, &mut wcs).is_err() {
                break;
            }
            seen_last = wcs.iter().any(|w| w.wr_id == last);
        }
        let raw = RawQp::create(&self.dev, &self.cq.cq, self.sizes, self.own_doorbell)
            .map_err(|_| VerbError::ConnectionLost(node))?;
        let psn = crate::random_psn();
        let server = self
            .link
            .connect_qp(self.dev.endpoint(raw.qpn(), psn), Some(self.server_qpn))
            .map_err(|_| VerbError::ConnectionLost(node))?;
        raw.connect(&server, psn)
            .map_err(|_| VerbError::ConnectionLost(node))?;
        self.cq
            .inner
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(&qpn);
        self.raw = raw;
        self.server_qpn = server.qpn;
        self.stats.doorbells += 1;
        // Post the flushed later batches again, in order, as one list.
        if let Some(from) = self
            .ring
            .iter()
            .position(|e| matches!(e.state, State::Replay))
        {
            self.post_entries(from)?;
        }
        Ok(())
    }

    /// The pair is gone: every request not done fails.
    fn fail_all(&mut self, error: VerbError) {
        self.fail_unfinished(error);
        self.harvest();
    }

    /// [`Self::fail_all`] without moving the failed entries to `ready`.
    fn fail_unfinished(&mut self, error: VerbError) {
        self.disconnected = true;
        for e in self.ring.iter_mut() {
            if !matches!(e.state, State::Done(_)) {
                e.state = State::Done(Err(error.clone()));
            }
        }
        self.in_flight = 0;
    }

    /// Moves finished entries at the ring's front to `ready`.
    fn harvest(&mut self) {
        while let Some(e) = self.ring.front() {
            if !matches!(e.state, State::Done(_)) {
                break;
            }
            let e = self.ring.pop_front().expect("front exists");
            let State::Done(result) = e.state else {
                unreachable!("checked above")
            };
            if e.wr.signaled {
                self.owed -= 1;
            }
            match result {
                Ok(v) if e.wr.signaled => self.ready.push_back(Completion {
                    wr_id: e.wr.wr_id,
                    result: Ok(v),
                }),
                Ok(_) => {}
                Err(error) => self.ready.push_back(Completion {
                    wr_id: e.wr.wr_id,
                    result: Err(Box::new(RequestError {
                        index: e.index,
                        wr_id: e.wr.wr_id,
                        kind: e.wr.kind(),
                        remote: e.wr.remote,
                        error,
                    })),
                }),
            }
        }
    }

    fn count(&mut self, wr: &WorkRequest) {
        let s = &mut self.stats;
        let len = wr.len() as u64;
        match wr.kind() {
            VerbKind::Read => {
                s.reads += 1;
                s.bytes_read += len;
            }
            VerbKind::Write => {
                s.writes += 1;
                s.bytes_written += len;
            }
            VerbKind::Cas => s.cas += 1,
            VerbKind::MaskedCas => s.masked_cas += 1,
            VerbKind::Faa => s.faa += 1,
        }
    }
}

impl QueuePair for VerbsQp {
    fn node(&self) -> NodeId {
        self.link.id
    }

    fn caps(&self) -> Capabilities {
        self.caps
    }

    fn register_local(&mut self, mem: &LocalMem) -> Lkey {
        if let Some(i) = self.locals.iter().position(|s| s.mem.same(mem)) {
            return i as Lkey;
        }
        use sys::ibv_access_flags as A;
        // SAFETY: the slot keeps `mem` alive as long as the MR.
        let mr = unsafe {
            Mr::register(
                &self.dev,
                mem.as_mut_ptr(),
                mem.len().max(1),
                A::IBV_ACCESS_LOCAL_WRITE,
            )
        }
        .map_err(|e| {
            eprintln!(
                "dmkit verbs: registering {} B of local memory failed: {e}",
                mem.len()
            );
            e.to_string()
        });
        self.locals.push(LocalSlot {
            mem: mem.clone(),
            mr,
        });
        (self.locals.len() - 1) as Lkey
    }

    fn post(&mut self, batch: &mut Batch) -> Result<(), PostError> {
        let len = batch.len();
        if len > self.caps.max_batch {
            return Err(PostError::BatchTooLarge {
                len,
                max: self.caps.max_batch,
            });
        }
        if self.disconnected {
            return Err(PostError::Disconnected(self.link.id));
        }
        if len == 0 {
            return Ok(());
        }
        // Checks first: the valid prefix goes to the NIC.
        let mut checked = Vec::with_capacity(len);
        let mut first_bad = None;
        for (i, wr) in batch.requests().iter().enumerate() {
            match self.check(wr, batch.sges()) {
                Ok(p) => checked.push(p),
                Err(e) => {
                    first_bad = Some((i, e));
                    break;
                }
            }
        }
        let good = checked.len();
        // Room on the send queue for the prefix.
        while self.in_flight + good > self.sizes.send_wr as usize {
            self.drive();
            if self.disconnected {
                return Err(PostError::Disconnected(self.link.id));
            }
        }
        self.stats.doorbells += 1;
        let b = self.next_batch;
        self.next_batch += 1;
        let from = self.ring.len();
        for (i, (wr, pieces)) in batch.requests().iter().zip(checked).enumerate() {
            self.count(wr);
            self.ring.push_back(Entry {
                wr: *wr,
                pieces,
                index: i,
                batch: b,
                nic_signaled: wr.signaled || i + 1 == good,
                state: State::Queued,
            });
            if wr.signaled {
                self.owed += 1;
            }
        }
        if let Err(e) = self.post_entries(from) {
            // Nothing reached the NIC: report every request as failed.
            for en in self.ring.range_mut(from..) {
                if matches!(en.state, State::Queued) {
                    en.state = State::Done(Err(e.clone()));
                }
            }
        }
        if let Some((i, error)) = first_bad {
            self.stats.errors += 1;
            for (k, wr) in batch.requests().iter().enumerate().skip(i) {
                if wr.signaled {
                    self.owed += 1;
                }
                self.ring.push_back(Entry {
                    wr: *wr,
                    pieces: Vec::new(),
                    index: k,
                    batch: b,
                    nic_signaled: false,
                    state: State::Done(Err(if k == i {
                        error.clone()
                    } else {
                        VerbError::Flushed
                    })),
                });
            }
        }
        self.harvest();
        batch.clear();
        Ok(())
    }

    fn poll(&mut self, out: &mut Vec<Completion>, max: usize) -> usize {
        if self.ready.len() < max {
            self.drive();
        }
        let n = self.ready.len().min(max);
        out.extend(self.ready.drain(..n));
        n
    }

    fn pending(&self) -> usize {
        self.ready.len()
            + self.owed
            + self
                .ring
                .iter()
                .filter(|e| !e.wr.signaled && matches!(e.state, State::Done(Err(_))))
                .count()
    }

    fn stats(&self) -> QpStats {
        self.stats
    }
}

impl Drop for VerbsQp {
    fn drop(&mut self) {
        // The NIC may still write into local memory for requests in flight:
        // wait for them (bounded) before the registrations go.
        self.closing = true;
        let deadline = Instant::now() + Duration::from_secs(5);
        while self.in_flight > 0 && !self.disconnected && Instant::now() < deadline {
            self.drive();
        }
        if self.in_flight > 0 {
            let _ = self.raw.to_error();
        }
        self.cq.leave(self.raw.qpn());
    }
}

#[allow(dead_code)]
fn _assert_send() {
    fn is_send<T: Send>() {}
    is_send::<VerbsQp>();
    let _ = GlobalAddr::new(0, 0);
}
