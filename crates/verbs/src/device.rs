//! An opened RDMA device: context, protection domain, port and address
//! (GID for RoCE, LID for InfiniBand), shared by every queue pair of a
//! process — SMART §4.1: one device context, PD and MR set per process;
//! queue pairs, completion queues and doorbells per thread.
//!
//! Device, port and GID are chosen by flag or config ([`DeviceSel`]); with
//! none given, the first device, port 1 and (on Ethernet) the first RoCE v2
//! GID with an IPv4-mapped address. Nothing is hard-coded: the anchor
//! systems' issue trackers are full of setups broken by a fixed device
//! index or GID index.

use std::ffi::CStr;
use std::path::Path;
use std::ptr;

use dmkit_verbs_sys as sys;
use serde::{Deserialize, Serialize};

pub use crate::config::DeviceSel;
use crate::error::{errno, VerbsError};

/// How a peer's queue pair is addressed (exchanged over the control
/// channel when a connection is made).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Endpoint {
    /// Queue pair number.
    pub qpn: u32,
    /// Initial packet sequence number (24 bits, random per connection).
    pub psn: u32,
    /// The port's local identifier (InfiniBand routing; 0 on RoCE).
    pub lid: u16,
    /// The port's GID at the selected index (RoCE v2: an IPv4-mapped address);
    /// all zero without one.
    pub gid: [u8; 16],
    /// Route with a global route header (always on RoCE; on InfiniBand when
    /// a GID index is selected).
    pub global: bool,
    /// The port's active MTU (ibv_mtu value).
    pub mtu: u32,
}

/// Device limits and features that become fabric capabilities.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct DeviceCaps {
    /// Most outstanding work requests per queue pair
    /// (`ibv_device_attr::max_qp_wr`); caps the send-queue depth.
    pub max_qp_wr: u32,
    /// Most scatter/gather entries per work request (`max_sge`).
    pub max_sge: u32,
    /// Most READs and atomics a queue pair accepts in flight as responder
    /// (`max_qp_rd_atom`).
    pub max_qp_rd_atom: u32,
    /// Most READs and atomics a queue pair keeps in flight as requester
    /// (`max_qp_init_rd_atom`).
    pub max_qp_init_rd_atom: u32,
    /// Largest message of the port in bytes (`ibv_port_attr::max_msg_sz`).
    pub max_msg: u32,
    /// Atomics are executed with a global ordering guarantee
    /// (IBV_ATOMIC_HCA or better).
    pub atomics: bool,
    /// On-demand paging (the memory node may remap without re-registering).
    pub odp: bool,
}

/// One opened device port.
pub struct Device {
    pub(crate) ctx: *mut sys::ibv_context,
    pub(crate) pd: *mut sys::ibv_pd,
    name: String,
    port: u8,
    gid_index: Option<u8>,
    gid: [u8; 16],
    lid: u16,
    mtu: u32,
    ethernet: bool,
    caps: DeviceCaps,
}

// SAFETY: libibverbs contexts and protection domains are thread-safe (the
// library serialises what needs it); `Device` only hands out the pointers
// to calls that libibverbs documents as safe from any thread.
unsafe impl Send for Device {}
// SAFETY: as above.
unsafe impl Sync for Device {}

impl Drop for Device {
    fn drop(&mut self) {
        // SAFETY: pd and ctx were created by this device and every QP, CQ
        // and MR that used them holds an `Arc<Device>`, so none is alive.
        unsafe {
            sys::ibv_dealloc_pd(self.pd);
            sys::ibv_close_device(self.ctx);
        }
    }
}

/// Names of the RDMA devices libibverbs lists, or why there are none.
pub fn list_devices() -> Result<Vec<String>, VerbsError> {
    let mut n = 0;
    // SAFETY: ibv_get_device_list writes the count and returns an owned
    // NULL-terminated array (or NULL with errno set).
    let list = unsafe { sys::ibv_get_device_list(&mut n) };
    if list.is_null() {
        return Err(no_devices(errno()));
    }
    let mut names = Vec::with_capacity(n as usize);
    for i in 0..n.max(0) as usize {
        // SAFETY: i < n entries of the array; each has a valid name.
        names.push(unsafe { device_name(*list.add(i)) });
    }
    // SAFETY: the list came from ibv_get_device_list.
    unsafe { sys::ibv_free_device_list(list) };
    Ok(names)
}

fn no_devices(err: i32) -> VerbsError {
    let reason = if err == libc_enosys() {
        "libibverbs answers ENOSYS: this kernel has no RDMA support (no RNIC driver, no Soft-RoCE)"
            .to_string()
    } else {
        format!(
            "ibv_get_device_list failed: {}",
            std::io::Error::from_raw_os_error(err)
        )
    };
    VerbsError::NoDevice { reason }
}

const fn libc_enosys() -> i32 {
    38
}

/// # Safety
/// `dev` must be a device of a live device list.
unsafe fn device_name(dev: *mut sys::ibv_device) -> String {
    // SAFETY: (caller) dev is valid; the name is a NUL-terminated string.
    unsafe { CStr::from_ptr(sys::ibv_get_device_name(dev)) }
        .to_string_lossy()
        .into_owned()
}

impl Device {
    /// Opens the selected device and port and allocates the process's
    /// protection domain.
    pub fn open(sel: &DeviceSel) -> Result<std::sync::Arc<Device>, VerbsError> {
        let mut n = 0;
        // SAFETY: see list_devices.
        let list = unsafe { sys::ibv_get_device_list(&mut n) };
        if list.is_null() {
            return Err(no_devices(errno()));
        }
        let mut names = Vec::new();
        let mut chosen: *mut sys::ibv_device = ptr::null_mut();
        for i in 0..n.max(0) as usize {
            // SAFETY: i < n.
            let dev = unsafe { *list.add(i) };
            // SAFETY: dev belongs to the live list.
            let name = unsafe { device_name(dev) };
            if chosen.is_null() && sel.device.as_deref().is_none_or(|want| want == name) {
                chosen = dev;
            }
            names.push(name);
        }
        if chosen.is_null() {
            // SAFETY: list came from ibv_get_device_list.
            unsafe { sys::ibv_free_device_list(list) };
            return Err(match &sel.device {
                None => VerbsError::NoDevice {
                    reason: "libibverbs lists no RDMA devices".into(),
                },
                Some(want) => VerbsError::NoSuchDevice {
                    want: want.clone(),
                    have: names,
                },
            });
        }
        // SAFETY: chosen is a device of the live list; the context does not
        // borrow the list, so the list may be freed after opening.
        let ctx = unsafe { sys::ibv_open_device(chosen) };
        // SAFETY: chosen is still valid until the list is freed below.
        let name = unsafe { device_name(chosen) };
        // SAFETY: list came from ibv_get_device_list.
        unsafe { sys::ibv_free_device_list(list) };
        if ctx.is_null() {
            return Err(VerbsError::call("ibv_open_device", errno()));
        }
        let close = |e: VerbsError| {
            // SAFETY: ctx was opened above and nothing else uses it yet.
            unsafe { sys::ibv_close_device(ctx) };
            e
        };
        let mut dattr = sys::ibv_device_attr::default();
        // SAFETY: ctx is open; dattr is a valid out-parameter.
        if unsafe { sys::ibv_query_device(ctx, &mut dattr) } != 0 {
            return Err(close(VerbsError::call("ibv_query_device", errno())));
        }
        let port = sel.port.unwrap_or(1);
        if port == 0 || port > dattr.phys_port_cnt {
            return Err(close(VerbsError::Config(format!(
                "{name} has ports 1..={}, not {port}",
                dattr.phys_port_cnt
            ))));
        }
        let mut pattr = sys::ibv_port_attr::default();
        // SAFETY: ctx is open, port is in range.
        if unsafe { sys::dmkit_ibv_query_port(ctx, port, &mut pattr) } != 0 {
            return Err(close(VerbsError::call("ibv_query_port", errno())));
        }
        if pattr.state != sys::ibv_port_state::IBV_PORT_ACTIVE {
            return Err(close(VerbsError::Config(format!(
                "{name} port {port} is not active (state {:?}); check the link",
                pattr.state
            ))));
        }
        let ethernet = pattr.link_layer == sys::IBV_LINK_LAYER_ETHERNET as u8;
        let gid_index = match sel.gid_index {
            Some(i) => {
                if i32::from(i) >= pattr.gid_tbl_len {
                    return Err(close(VerbsError::Config(format!(
                        "{name} port {port} has {} GIDs; --gid-index {i} is out of range",
                        pattr.gid_tbl_len
                    ))));
                }
                Some(i)
            }
            None if ethernet => {
                Some(pick_gid(ctx, &name, port, pattr.gid_tbl_len).map_err(&close)?)
            }
            None => None,
        };
        let mut gid = [0u8; 16];
        if let Some(i) = gid_index {
            let mut g = sys::ibv_gid::default();
            // SAFETY: ctx open, index checked against the table length.
            if unsafe { sys::ibv_query_gid(ctx, port, i32::from(i), &mut g) } != 0 {
                return Err(close(VerbsError::call("ibv_query_gid", errno())));
            }
            // SAFETY: ibv_gid is a union of 16 raw bytes and two u64s.
            gid = unsafe { g.raw };
            if gid == [0; 16] {
                return Err(close(VerbsError::Config(format!(
                    "{name} port {port} GID {i} is empty (no address on the interface?)"
                ))));
            }
        }
        // SAFETY: ctx is open.
        let pd = unsafe { sys::ibv_alloc_pd(ctx) };
        if pd.is_null() {
            return Err(close(VerbsError::call("ibv_alloc_pd", errno())));
        }
        let mut xattr = sys::ibv_device_attr_ex::default();
        // SAFETY: ctx open; xattr valid. Failure only means no extended attrs.
        let odp = unsafe { sys::dmkit_ibv_query_device_ex(ctx, &mut xattr) } == 0
            && xattr.odp_caps.general_caps & 1 != 0
            && xattr.odp_caps.per_transport_caps.rc_odp_caps != 0;
        Ok(std::sync::Arc::new(Device {
            ctx,
            pd,
            name,
            port,
            gid_index,
            gid,
            lid: pattr.lid,
            mtu: pattr.active_mtu as u32,
            ethernet,
            caps: DeviceCaps {
                max_qp_wr: dattr.max_qp_wr.max(0) as u32,
                max_sge: dattr.max_sge.max(0) as u32,
                max_qp_rd_atom: dattr.max_qp_rd_atom.max(0) as u32,
                max_qp_init_rd_atom: dattr.max_qp_init_rd_atom.max(0) as u32,
                max_msg: pattr.max_msg_sz,
                atomics: dattr.atomic_cap != sys::IBV_ATOMIC_NONE,
                odp,
            },
        }))
    }

    /// Device name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Port in use.
    pub fn port(&self) -> u8 {
        self.port
    }

    /// GID index in use (None: LID routing).
    pub fn gid_index(&self) -> Option<u8> {
        self.gid_index
    }

    /// RoCE (true) or InfiniBand.
    pub fn is_ethernet(&self) -> bool {
        self.ethernet
    }

    /// Limits and features.
    pub fn caps(&self) -> DeviceCaps {
        self.caps
    }

    /// This port's address for a queue pair `qpn` starting at `psn`.
    pub fn endpoint(&self, qpn: u32, psn: u32) -> Endpoint {
        Endpoint {
            qpn,
            psn,
            lid: self.lid,
            gid: self.gid,
            global: self.gid_index.is_some(),
            mtu: self.mtu,
        }
    }

    /// Whether thread domains work here (a dedicated doorbell register per
    /// thread: SMART §4.1). Probed once by allocating and freeing one.
    pub fn thread_domains(&self) -> bool {
        // SAFETY: ctx is open; a returned td is freed at once.
        unsafe {
            let td = sys::dmkit_ibv_alloc_td(self.ctx);
            if td.is_null() {
                return false;
            }
            sys::dmkit_ibv_dealloc_td(td);
            true
        }
    }
}

/// The first RoCE v2 GID with an IPv4-mapped address (from sysfs), else the
/// first non-zero GID.
fn pick_gid(ctx: *mut sys::ibv_context, name: &str, port: u8, len: i32) -> Result<u8, VerbsError> {
    let dir = Path::new("/sys/class/infiniband")
        .join(name)
        .join("ports")
        .join(port.to_string());
    let mut first_nonzero = None;
    for i in 0..len.clamp(0, 256) {
        let mut g = sys::ibv_gid::default();
        // SAFETY: ctx open, i < table length.
        if unsafe { sys::ibv_query_gid(ctx, port, i, &mut g) } != 0 {
            continue;
        }
        // SAFETY: union of raw bytes.
        let raw = unsafe { g.raw };
        if raw == [0; 16] {
            continue;
        }
        first_nonzero.get_or_insert(i as u8);
        let v4_mapped = raw[..10] == [0; 10] && raw[10] == 0xff && raw[11] == 0xff;
        let ty = std::fs::read_to_string(dir.join("gid_attrs/types").join(i.to_string()))
            .unwrap_or_default();
        if v4_mapped && ty.trim().eq_ignore_ascii_case("RoCE v2") {
            return Ok(i as u8);
        }
    }
    first_nonzero.ok_or_else(|| {
        VerbsError::Config(format!(
            "{name} port {port} has no usable GID: give the interface an address, or pass --gid-index"
        ))
    })
}
