//! Raw RC queue pairs and completion queues: creation and the
//! RESET → INIT → RTR → RTS transitions, shared by the memory node's side
//! and the compute side.

use std::sync::Arc;

use dmkit_verbs_sys as sys;

use crate::device::{Device, Endpoint};
use crate::error::{errno, VerbsError};

/// A completion queue.
pub struct Cq {
    pub(crate) cq: *mut sys::ibv_cq,
    _dev: Arc<Device>,
}

// SAFETY: a CQ may be polled from any thread; callers serialise polls of
// one CQ (the compute side behind a mutex, the node side never polls).
unsafe impl Send for Cq {}
// SAFETY: as above.
unsafe impl Sync for Cq {}

impl Cq {
    pub fn new(dev: &Arc<Device>, depth: u32) -> Result<Self, VerbsError> {
        // SAFETY: ctx is open; no channel, vector 0.
        let cq = unsafe {
            sys::ibv_create_cq(
                dev.ctx,
                depth as i32,
                std::ptr::null_mut(),
                std::ptr::null_mut(),
                0,
            )
        };
        if cq.is_null() {
            return Err(VerbsError::call("ibv_create_cq", errno()));
        }
        Ok(Cq {
            cq,
            _dev: dev.clone(),
        })
    }

    /// Polls up to `out.len()` completions; returns how many.
    pub fn poll(&self, out: &mut [sys::ibv_wc]) -> Result<usize, VerbsError> {
        // SAFETY: cq is live; out has room for out.len() entries.
        let n = unsafe { sys::dmkit_ibv_poll_cq(self.cq, out.len() as i32, out.as_mut_ptr()) };
        if n < 0 {
            return Err(VerbsError::call("ibv_poll_cq", -n));
        }
        Ok(n as usize)
    }
}

impl Drop for Cq {
    fn drop(&mut self) {
        // SAFETY: every QP using this CQ holds an Arc<Cq>, so none is alive.
        unsafe { sys::ibv_destroy_cq(self.cq) };
    }
}

/// Sizes of a queue pair.
#[derive(Debug, Clone, Copy)]
pub struct QpSizes {
    pub send_wr: u32,
    pub sge: u32,
    pub inline: u32,
}

/// One RC queue pair.
pub struct RawQp {
    pub(crate) qp: *mut sys::ibv_qp,
    /// Kept so the CQ outlives the QP.
    _cq: Arc<Cq>,
    pub(crate) dev: Arc<Device>,
    /// The parent domain (thread domain) the QP was created in, if any.
    td: Option<(*mut sys::ibv_td, *mut sys::ibv_pd)>,
    /// What the provider granted.
    pub(crate) granted: QpSizes,
}

// SAFETY: a QP is used by one owner at a time (the compute side's queue
// pair is `Send`, not shared; the node side only modifies state under its
// connection's lock).
unsafe impl Send for RawQp {}

impl RawQp {
    /// Creates a QP in RESET. With `own_doorbell`, in a parent domain over a
    /// fresh thread domain, so it gets a doorbell register of its own
    /// (SMART §4.1); fails where the provider has no thread domains.
    pub fn create(
        dev: &Arc<Device>,
        cq: &Arc<Cq>,
        sizes: QpSizes,
        own_doorbell: bool,
    ) -> Result<Self, VerbsError> {
        Self::create_with_recv(dev, cq, sizes, 1, own_doorbell)
    }

    /// As [`RawQp::create`], with a receive queue of `recv_wr` requests
    /// (two-sided messages: the RPC channel).
    pub fn create_with_recv(
        dev: &Arc<Device>,
        cq: &Arc<Cq>,
        sizes: QpSizes,
        recv_wr: u32,
        own_doorbell: bool,
    ) -> Result<Self, VerbsError> {
        let mut td = None;
        let mut pd = dev.pd;
        if own_doorbell {
            // SAFETY: ctx open.
            let t = unsafe { sys::dmkit_ibv_alloc_td(dev.ctx) };
            if t.is_null() {
                return Err(VerbsError::call(
                    "ibv_alloc_td (per-thread doorbell)",
                    errno(),
                ));
            }
            // SAFETY: ctx, pd and td are live.
            let parent = unsafe { sys::dmkit_ibv_alloc_parent_domain(dev.ctx, dev.pd, t) };
            if parent.is_null() {
                let e = errno();
                // SAFETY: t was allocated above and is unused.
                unsafe { sys::dmkit_ibv_dealloc_td(t) };
                return Err(VerbsError::call("ibv_alloc_parent_domain", e));
            }
            pd = parent;
            td = Some((t, parent));
        }
        let mut attr = sys::ibv_qp_init_attr {
            send_cq: cq.cq,
            recv_cq: cq.cq,
            qp_type: sys::ibv_qp_type::IBV_QPT_RC,
            sq_sig_all: 0,
            cap: sys::ibv_qp_cap {
                max_send_wr: sizes.send_wr,
                max_recv_wr: recv_wr.max(1),
                max_send_sge: sizes.sge,
                max_recv_sge: 1,
                max_inline_data: sizes.inline,
            },
            ..Default::default()
        };
        // SAFETY: pd and cq are live; attr is valid for the call.
        let qp = unsafe { sys::ibv_create_qp(pd, &mut attr) };
        if qp.is_null() {
            let e = errno();
            if let Some((t, p)) = td {
                // SAFETY: allocated above, unused.
                unsafe {
                    sys::ibv_dealloc_pd(p);
                    sys::dmkit_ibv_dealloc_td(t);
                }
            }
            return Err(VerbsError::call("ibv_create_qp", e));
        }
        let granted = QpSizes {
            send_wr: attr.cap.max_send_wr,
            sge: attr.cap.max_send_sge,
            inline: attr.cap.max_inline_data,
        };
        let raw = RawQp {
            qp,
            _cq: cq.clone(),
            dev: dev.clone(),
            td,
            granted,
        };
        raw.to_init()?;
        Ok(raw)
    }

    /// The QP number.
    pub fn qpn(&self) -> u32 {
        // SAFETY: qp is live.
        unsafe { (*self.qp).qp_num }
    }

    fn modify(
        &self,
        attr: &mut sys::ibv_qp_attr,
        mask: sys::ibv_qp_attr_mask,
        what: &'static str,
    ) -> Result<(), VerbsError> {
        // SAFETY: qp is live; attr is valid for the call.
        let rc = unsafe { sys::ibv_modify_qp(self.qp, attr, mask.0 as i32) };
        if rc != 0 {
            return Err(VerbsError::call(what, rc));
        }
        Ok(())
    }

    fn to_init(&self) -> Result<(), VerbsError> {
        use sys::ibv_access_flags as A;
        use sys::ibv_qp_attr_mask as M;
        let mut a = sys::ibv_qp_attr {
            qp_state: sys::ibv_qp_state::IBV_QPS_INIT,
            pkey_index: 0,
            port_num: self.dev.port(),
            qp_access_flags: (A::IBV_ACCESS_REMOTE_READ
                | A::IBV_ACCESS_REMOTE_WRITE
                | A::IBV_ACCESS_REMOTE_ATOMIC)
                .0,
            ..Default::default()
        };
        self.modify(
            &mut a,
            M::IBV_QP_STATE | M::IBV_QP_PKEY_INDEX | M::IBV_QP_PORT | M::IBV_QP_ACCESS_FLAGS,
            "ibv_modify_qp(INIT)",
        )
    }

    /// Connects to `remote` (RTR then RTS); `local_psn` is this side's
    /// starting packet sequence number.
    pub fn connect(&self, remote: &Endpoint, local_psn: u32) -> Result<(), VerbsError> {
        use sys::ibv_qp_attr_mask as M;
        let caps = self.dev.caps();
        let mut ah = sys::ibv_ah_attr {
            port_num: self.dev.port(),
            dlid: remote.lid,
            ..Default::default()
        };
        if remote.global || self.dev.is_ethernet() {
            ah.is_global = 1;
            ah.grh.dgid = sys::ibv_gid { raw: remote.gid };
            ah.grh.sgid_index = self.dev.gid_index().unwrap_or(0);
            ah.grh.hop_limit = 64;
        }
        let mtu = remote.mtu.min(self.dev.endpoint(0, 0).mtu);
        let mut a = sys::ibv_qp_attr {
            qp_state: sys::ibv_qp_state::IBV_QPS_RTR,
            path_mtu: mtu_enum(mtu),
            dest_qp_num: remote.qpn,
            rq_psn: remote.psn,
            max_dest_rd_atomic: caps.max_qp_rd_atom.clamp(1, 255) as u8,
            min_rnr_timer: 12,
            ah_attr: ah,
            ..Default::default()
        };
        self.modify(
            &mut a,
            M::IBV_QP_STATE
                | M::IBV_QP_AV
                | M::IBV_QP_PATH_MTU
                | M::IBV_QP_DEST_QPN
                | M::IBV_QP_RQ_PSN
                | M::IBV_QP_MAX_DEST_RD_ATOMIC
                | M::IBV_QP_MIN_RNR_TIMER,
            "ibv_modify_qp(RTR)",
        )?;
        let mut a = sys::ibv_qp_attr {
            qp_state: sys::ibv_qp_state::IBV_QPS_RTS,
            timeout: 14,
            retry_cnt: 7,
            rnr_retry: 7,
            sq_psn: local_psn,
            max_rd_atomic: caps.max_qp_init_rd_atom.clamp(1, 255) as u8,
            ..Default::default()
        };
        self.modify(
            &mut a,
            M::IBV_QP_STATE
                | M::IBV_QP_TIMEOUT
                | M::IBV_QP_RETRY_CNT
                | M::IBV_QP_RNR_RETRY
                | M::IBV_QP_SQ_PSN
                | M::IBV_QP_MAX_QP_RD_ATOMIC,
            "ibv_modify_qp(RTS)",
        )
    }

    /// Moves the QP to the error state: every outstanding request is
    /// flushed with a completion.
    pub fn to_error(&self) -> Result<(), VerbsError> {
        let mut a = sys::ibv_qp_attr {
            qp_state: sys::ibv_qp_state::IBV_QPS_ERR,
            ..Default::default()
        };
        self.modify(
            &mut a,
            sys::ibv_qp_attr_mask::IBV_QP_STATE,
            "ibv_modify_qp(ERR)",
        )
    }

    /// Posts a linked list of work requests with one doorbell.
    ///
    /// # Safety
    /// `wr` must head a valid linked list whose scatter/gather entries
    /// point into registered memory that stays alive until completion.
    pub unsafe fn post(&self, wr: *mut sys::ibv_send_wr) -> Result<(), VerbsError> {
        let mut bad = std::ptr::null_mut();
        // SAFETY: (caller) the list is valid; qp is live.
        let rc = unsafe { sys::dmkit_ibv_post_send(self.qp, wr, &mut bad) };
        if rc != 0 {
            return Err(VerbsError::call("ibv_post_send", rc));
        }
        Ok(())
    }
}

impl RawQp {
    /// Posts one receive request.
    ///
    /// # Safety
    /// `wr` must be a valid receive request (a list of one) whose
    /// scatter/gather entries point into registered memory that stays alive
    /// until its completion.
    pub unsafe fn post_recv(&self, wr: *mut sys::ibv_recv_wr) -> Result<(), VerbsError> {
        let mut bad = std::ptr::null_mut();
        // SAFETY: (caller) the request is valid; qp is live.
        let rc = unsafe { sys::dmkit_ibv_post_recv(self.qp, wr, &mut bad) };
        if rc != 0 {
            return Err(VerbsError::call("ibv_post_recv", rc));
        }
        Ok(())
    }
}

impl Drop for RawQp {
    fn drop(&mut self) {
        // SAFETY: the QP is ours; destroying it before its domains.
        unsafe {
            sys::ibv_destroy_qp(self.qp);
            if let Some((t, p)) = self.td {
                sys::ibv_dealloc_pd(p);
                sys::dmkit_ibv_dealloc_td(t);
            }
        }
    }
}

fn mtu_enum(v: u32) -> sys::ibv_mtu {
    use sys::ibv_mtu::*;
    match v {
        1 => IBV_MTU_256,
        2 => IBV_MTU_512,
        3 => IBV_MTU_1024,
        4 => IBV_MTU_2048,
        _ => IBV_MTU_4096,
    }
}

/// A memory registration.
pub struct Mr {
    pub(crate) mr: *mut sys::ibv_mr,
    _dev: Arc<Device>,
}

// SAFETY: an MR handle is immutable after registration except through
// rereg, which its owner calls with exclusive access.
unsafe impl Send for Mr {}
// SAFETY: as above.
unsafe impl Sync for Mr {}

impl Mr {
    /// Registers `[addr, addr + len)` with `access` flags.
    ///
    /// # Safety
    /// The range must stay mapped until the MR is dropped.
    pub unsafe fn register(
        dev: &Arc<Device>,
        addr: *mut u8,
        len: usize,
        access: sys::ibv_access_flags,
    ) -> Result<Self, VerbsError> {
        // SAFETY: (caller) the range stays mapped; pd is live.
        let mr = unsafe { sys::dmkit_ibv_reg_mr(dev.pd, addr.cast(), len, access.0 as i32) };
        if mr.is_null() {
            return Err(VerbsError::call("ibv_reg_mr", errno()));
        }
        Ok(Mr {
            mr,
            _dev: dev.clone(),
        })
    }

    pub fn lkey(&self) -> u32 {
        // SAFETY: mr is live.
        unsafe { (*self.mr).lkey }
    }

    pub fn rkey(&self) -> u32 {
        // SAFETY: mr is live.
        unsafe { (*self.mr).rkey }
    }

    /// Re-registers the same range so the NIC picks up new page
    /// translations (CoRM §3.5), keeping the MR object. Returns whether the
    /// keys stayed the same.
    ///
    /// # Safety
    /// The range must stay mapped until the MR is dropped.
    pub unsafe fn rereg_translation(
        &mut self,
        addr: *mut u8,
        len: usize,
    ) -> Result<bool, VerbsError> {
        let (lk, rk) = (self.lkey(), self.rkey());
        // SAFETY: (caller) the range stays mapped; mr is live.
        let rc = unsafe {
            sys::ibv_rereg_mr(
                self.mr,
                sys::ibv_rereg_mr_flags::IBV_REREG_MR_CHANGE_TRANSLATION.0 as i32,
                std::ptr::null_mut(),
                addr.cast(),
                len,
                0,
            )
        };
        if rc != 0 {
            return Err(VerbsError::call("ibv_rereg_mr", errno()));
        }
        Ok(self.lkey() == lk && self.rkey() == rk)
    }
}

impl Drop for Mr {
    fn drop(&mut self) {
        // SAFETY: the MR is ours.
        unsafe { sys::ibv_dereg_mr(self.mr) };
    }
}
