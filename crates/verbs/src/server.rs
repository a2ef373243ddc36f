//! The memory node's side of the verbs backend: a TCP control channel in
//! front of a [`MemNode`], and the NIC registrations of its memory.
//!
//! The node's remote address space is mapped once into a *view*: remote
//! page `p` at `view + p·page_size`, backed by the memory page the node's
//! translation table names. Each registered region of the node is one
//! memory registration over its part of the view, made once. When the node
//! moves a page ([`VerbsServer::migrate_page`]; CoRM's compaction, through
//! the node's [`MemNode::set_retranslate_hook`]: aliased blocks, released
//! addresses), the view is remapped and the covering registrations
//! re-registered with `IBV_REREG_MR_CHANGE_TRANSLATION`, which keeps the
//! keys clients hold
//! (CoRM §3.5); on devices with on-demand paging no re-registration would
//! be needed, which the welcome reports (`DeviceCaps::odp`).
//!
//! After setup the node's CPU is off the data path: clients' READ, WRITE,
//! CAS and FAA are executed by the NIC against these registrations.

use std::collections::BTreeMap;
use std::io::Write;
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::os::fd::AsFd;
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;

use dmkit_memnode::layout::access;
use dmkit_memnode::memory::Mapping;
use dmkit_memnode::proto::TOKEN_LEN;
use dmkit_memnode::rpc::ring::ChannelGeometry;
use dmkit_memnode::server::{create_token_file, token_eq};
use dmkit_memnode::{MemNode, RegionInfo, Request, Response, SessionId};
use dmkit_verbs_sys as sys;

use crate::ctl::{self, Ctl, CtlReply, NicRegion, CTL_MAGIC, CTL_VERSION};
use crate::device::{Device, DeviceSel};
use crate::error::VerbsError;
use crate::qp::{Cq, Mr, QpSizes, RawQp};
use crate::rpc::NodeRpcChannel;

struct Registered {
    info: RegionInfo,
    mr: Mr,
}

struct Shared {
    node: Arc<MemNode>,
    dev: Arc<Device>,
    cq: Arc<Cq>,
    view: Mapping,
    /// The server's own session (to list regions through the node's RPC).
    session: SessionId,
    mrs: Mutex<BTreeMap<u32, Registered>>,
    token: [u8; TOKEN_LEN],
    stop: AtomicBool,
    /// Registrations whose NIC keys changed on a page move.
    rekeyed: std::sync::atomic::AtomicU64,
}

/// A memory node served over TCP to verbs clients.
pub struct VerbsServer {
    shared: Arc<Shared>,
    listener: TcpListener,
}

/// A server running on its own thread.
pub struct RunningServer {
    shared: Arc<Shared>,
    addr: SocketAddr,
    thread: Option<JoinHandle<()>>,
}

impl VerbsServer {
    /// Opens the device, maps and registers `node`'s memory, writes a fresh
    /// token to `token_file` (mode 0600) and binds `listen`.
    pub fn bind(
        node: Arc<MemNode>,
        sel: &DeviceSel,
        listen: &str,
        token_file: &Path,
    ) -> Result<Self, VerbsError> {
        let dev = Device::open(sel)?;
        let cq = Arc::new(Cq::new(&dev, 16)?);
        let layout = node.layout();
        let view = Mapping::map(node.data_fd(), layout.remote_len() as usize, true)
            .map_err(|e| VerbsError::Config(format!("mapping the node's memory: {e}")))?;
        // Registrations pin pages: freed chunks must be zeroed in place.
        node.pin_memory();
        let session = node.open_session();
        let token = create_token_file(token_file)
            .map_err(|e| VerbsError::Config(format!("token file {}: {e}", token_file.display())))?;
        let listener = TcpListener::bind(listen).map_err(|e| VerbsError::Control {
            peer: listen.into(),
            what: format!("bind: {e}"),
        })?;
        let shared = Arc::new(Shared {
            node,
            dev,
            cq,
            view,
            session,
            mrs: Mutex::new(BTreeMap::new()),
            token,
            stop: AtomicBool::new(false),
            rekeyed: Default::default(),
        });
        // Pages the node already moved: map them where the view expects them.
        for p in 0..layout.remote_pages {
            if shared.node.translate(p) != Some(p) {
                shared.remap(p)?;
            }
        }
        shared.sync_regions()?;
        // Pages a service inside the node moves (CoRM's compaction aliases
        // a source block onto its destination's memory, and unmaps
        // released addresses): remap the view and re-register, on the
        // moving thread, before the move is done.
        let weak = Arc::downgrade(&shared);
        shared
            .node
            .set_retranslate_hook(Some(Arc::new(move |first: u64, count: u64| {
                if let Some(sh) = weak.upgrade() {
                    if let Err(e) = sh.retranslate(first, count) {
                        let _ = writeln!(
                            std::io::stderr(),
                            "dmkit verbs server: remote pages {first}..{}: {e}",
                            first + count
                        );
                    }
                }
            })));
        Ok(VerbsServer { shared, listener })
    }

    /// The bound address.
    pub fn local_addr(&self) -> SocketAddr {
        self.listener.local_addr().expect("bound listener")
    }

    /// The device in use.
    pub fn device(&self) -> &Device {
        &self.shared.dev
    }

    /// Serves on a thread of its own.
    pub fn spawn(self) -> RunningServer {
        let shared = self.shared.clone();
        let addr = self.local_addr();
        let thread = std::thread::Builder::new()
            .name("dmkit-verbs-node".into())
            .spawn(move || self.serve())
            .expect("spawn server thread");
        RunningServer {
            shared,
            addr,
            thread: Some(thread),
        }
    }

    /// Accepts connections until the node shuts down.
    pub fn serve(self) {
        let _ = self.listener.set_nonblocking(true);
        while !self.shared.stop.load(Ordering::Acquire) && !self.shared.node.is_shutting_down() {
            match self.listener.accept() {
                Ok((stream, _)) => {
                    let s = self.shared.clone();
                    let spawned = std::thread::Builder::new()
                        .name("dmkit-verbs-conn".into())
                        .spawn(move || s.serve_connection(stream));
                    if spawned.is_err() {
                        self.shared.node.note_refused_connection();
                    }
                }
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                    std::thread::sleep(Duration::from_millis(20));
                }
                Err(_) => std::thread::sleep(Duration::from_millis(20)),
            }
        }
    }
}

impl RunningServer {
    /// The bound address.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// The memory node.
    pub fn node(&self) -> &Arc<MemNode> {
        &self.shared.node
    }

    /// Re-reads the node's region table and (de)registers accordingly;
    /// clients see the change on their next region refresh or NIC error.
    pub fn sync_regions(&self) -> Result<(), VerbsError> {
        self.shared.sync_regions()
    }

    /// Moves remote page `page` to another memory page under the same
    /// remote address and keys (see the module docs). Returns the new
    /// memory page.
    pub fn migrate_page(&self, page: u64) -> Result<u64, VerbsError> {
        self.shared.migrate_page(page)
    }

    /// Registrations re-made under a new NIC key because the provider could
    /// not re-register in place (0 where `ibv_rereg_mr` keeps keys).
    pub fn rekeyed_registrations(&self) -> u64 {
        self.shared.rekeyed.load(Ordering::Relaxed)
    }

    /// Stops accepting connections and waits for the accept loop.
    pub fn stop(mut self) {
        self.stop_inner();
    }

    fn stop_inner(&mut self) {
        self.shared.stop.store(true, Ordering::Release);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

impl Drop for RunningServer {
    fn drop(&mut self) {
        self.stop_inner();
    }
}

fn nic_access(bits: u64) -> sys::ibv_access_flags {
    use sys::ibv_access_flags as A;
    let mut a = A(0);
    if bits & access::READ != 0 {
        a |= A::IBV_ACCESS_REMOTE_READ;
    }
    if bits & access::WRITE != 0 {
        a |= A::IBV_ACCESS_REMOTE_WRITE | A::IBV_ACCESS_LOCAL_WRITE;
    }
    if bits & access::ATOMIC != 0 {
        a |= A::IBV_ACCESS_REMOTE_ATOMIC | A::IBV_ACCESS_LOCAL_WRITE;
    }
    a
}

impl Shared {
    fn regions(&self) -> Vec<RegionInfo> {
        match self.node.handle(self.session, Request::ListRegions) {
            Response::Regions(r) => r,
            _ => Vec::new(),
        }
    }

    fn view_ptr(&self, offset: u64) -> *mut u8 {
        assert!(offset <= self.view.len() as u64, "offset inside the view");
        // SAFETY: offset ≤ view length (asserted), so the pointer stays
        // inside (or one past) the mapping.
        unsafe { self.view.as_ptr().add(offset as usize) }
    }

    /// Registers regions the node added, drops those it removed.
    fn sync_regions(&self) -> Result<(), VerbsError> {
        let now = self.regions();
        let mut mrs = self.mrs.lock().unwrap_or_else(|e| e.into_inner());
        mrs.retain(|k, r| now.iter().any(|n| n.rkey == *k && *n == r.info));
        for info in now {
            if mrs.contains_key(&info.rkey) {
                continue;
            }
            if info.base + info.len > self.view.len() as u64 || info.len == 0 {
                continue;
            }
            // SAFETY: the range lies inside the view, which lives as long as
            // `Shared` and therefore longer than every MR it holds.
            let mr = unsafe {
                Mr::register(
                    &self.dev,
                    self.view_ptr(info.base),
                    info.len as usize,
                    nic_access(info.access),
                )
            }?;
            mrs.insert(info.rkey, Registered { info, mr });
        }
        Ok(())
    }

    fn nic_regions(&self) -> Vec<NicRegion> {
        let mrs = self.mrs.lock().unwrap_or_else(|e| e.into_inner());
        mrs.values()
            .map(|r| NicRegion {
                info: r.info,
                nic_rkey: r.mr.rkey(),
                nic_addr: self.view_ptr(r.info.base) as u64,
            })
            .collect()
    }

    /// Maps remote page `p` of the view onto the memory page the node's
    /// table names (its own, if unmapped).
    fn remap(&self, p: u64) -> Result<(), VerbsError> {
        let ps = self.node.layout().page_size();
        // An unmapped page (an address CoRM released) shows its own memory
        // page, whose contents the node discarded: clients' checks on what
        // they read (CoRM's object ids) fail, as a translation fault would.
        let phys = self.node.translate(p).unwrap_or(p);
        let at = self.view_ptr(p * ps);
        // SAFETY: [at, at + ps) is one page inside the view we own; MAP_FIXED
        // replaces exactly that page with the node's memory page `phys` of
        // the same memfd, which stays open as long as the node.
        let r = unsafe {
            nix::sys::mman::mmap(
                Some(std::num::NonZeroUsize::new(at as usize).expect("view is non-null")),
                std::num::NonZeroUsize::new(ps as usize).expect("page size > 0"),
                nix::sys::mman::ProtFlags::PROT_READ | nix::sys::mman::ProtFlags::PROT_WRITE,
                nix::sys::mman::MapFlags::MAP_SHARED | nix::sys::mman::MapFlags::MAP_FIXED,
                self.node.data_fd().as_fd(),
                (phys * ps) as i64,
            )
        };
        r.map(|_| ()).map_err(|e| VerbsError::Call {
            what: "mmap(MAP_FIXED) of a moved page",
            err: e.into(),
        })
    }

    fn migrate_page(&self, page: u64) -> Result<u64, VerbsError> {
        let new = self
            .node
            .migrate_page(page)
            .map_err(|e| VerbsError::Config(format!("migrating page {page}: {e}")))?;
        self.retranslate(page, 1)?;
        Ok(new)
    }

    /// Remote pages `[first, +count)` changed translation: remaps them in
    /// the view, then re-registers every registration covering them once.
    fn retranslate(&self, first: u64, count: u64) -> Result<(), VerbsError> {
        for p in first..first + count {
            self.remap(p)?;
        }
        let ps = self.node.layout().page_size();
        let (lo, hi) = (first * ps, (first + count) * ps);
        let mut mrs = self.mrs.lock().unwrap_or_else(|e| e.into_inner());
        for r in mrs.values_mut() {
            let (b, e) = (r.info.base, r.info.base + r.info.len);
            if lo < e && hi > b {
                let at = self.view_ptr(b);
                // SAFETY: the same view range the MR was registered over.
                let kept = match unsafe { r.mr.rereg_translation(at, r.info.len as usize) } {
                    Ok(kept) => kept,
                    // Providers without re-registration (rxe): register anew.
                    // The NIC key changes; dmkit's key does not, and clients
                    // map it to the new NIC key when their next request to the
                    // region fails and they re-fetch the table (vqp.rs).
                    Err(_) => {
                        // SAFETY: as above; the old MR is dropped after the
                        // new one exists, so the range is never unregistered.
                        r.mr = unsafe {
                            Mr::register(
                                &self.dev,
                                at,
                                r.info.len as usize,
                                nic_access(r.info.access),
                            )
                        }?;
                        false
                    }
                };
                if !kept {
                    self.rekeyed.fetch_add(1, Ordering::Relaxed);
                }
            }
        }
        Ok(())
    }

    fn welcome(&self, session: SessionId) -> CtlReply {
        CtlReply::Welcome {
            session,
            layout: self.node.layout(),
            heap: self.node.heap_region(),
            regions: self.nic_regions(),
            device: self.dev.caps(),
            rpc_workers: self.node.rpc_workers() as u32,
        }
    }

    /// The node's end of an RPC channel of `session` connected to
    /// `client`, handed to the node's worker pool (which drops it with the
    /// session).
    fn new_rpc_channel(
        &self,
        session: SessionId,
        client: &crate::device::Endpoint,
        slots: u32,
        max_message: u32,
    ) -> CtlReply {
        if let Err(why) = ChannelGeometry::check(slots, max_message) {
            return CtlReply::Refused(format!("RPC channel geometry: {why}"));
        }
        let depth = self.dev.caps().max_qp_wr;
        if depth != 0 && slots > depth {
            return CtlReply::Refused(format!(
                "RPC channel of {slots} slots: the device's queue pairs hold {depth} requests"
            ));
        }
        let (chan, server) =
            match NodeRpcChannel::new(&self.dev, client, slots as usize, max_message as usize) {
                Ok(c) => c,
                Err(e) => return CtlReply::Refused(e.to_string()),
            };
        match self
            .node
            .attach_rpc_channel(session, max_message as usize, |_, _| Ok(Box::new(chan)))
        {
            Ok(_) => CtlReply::Connected { server },
            Err(e) => CtlReply::Refused(e.to_string()),
        }
    }

    fn new_qp(&self, client: &crate::device::Endpoint) -> Result<(RawQp, CtlReply), VerbsError> {
        let qp = RawQp::create(
            &self.dev,
            &self.cq,
            QpSizes {
                send_wr: 1,
                sge: 1,
                inline: 0,
            },
            false,
        )?;
        let psn = crate::random_psn();
        qp.connect(client, psn)?;
        let server = self.dev.endpoint(qp.qpn(), psn);
        Ok((qp, CtlReply::Connected { server }))
    }

    /// Serves one control connection to its end. Never panics on client input.
    fn serve_connection(self: Arc<Self>, mut stream: TcpStream) {
        let _ = stream.set_nodelay(true);
        let _ = stream.set_read_timeout(Some(Duration::from_secs(10)));
        let ok = matches!(
            ctl::recv::<Ctl>(&mut stream),
            Ok(Some(Ctl::Hello { magic, version, token }))
                if magic == CTL_MAGIC && version == CTL_VERSION && token_eq(&token, &self.token)
        );
        if !ok {
            self.node.note_auth_failure();
            let _ = ctl::send(
                &mut stream,
                &CtlReply::Refused("authentication failed".into()),
            );
            return;
        }
        let session = self.node.open_session();
        let _ = self.sync_regions();
        if ctl::send(&mut stream, &self.welcome(session)).is_err() {
            self.node.close_session(session);
            return;
        }
        let _ = stream.set_read_timeout(None);
        let mut qps: Vec<RawQp> = Vec::new();
        loop {
            let msg = match ctl::recv::<Ctl>(&mut stream) {
                Ok(Some(m)) => m,
                Ok(None) => break,
                Err(_) => {
                    self.node.note_bad_frame();
                    break;
                }
            };
            // A replaced pair goes before its successor is made.
            if let Ctl::Reconnect { server_qpn, .. } = &msg {
                qps.retain(|q| q.qpn() != *server_qpn);
            }
            let reply = match msg {
                Ctl::Hello { .. } => CtlReply::Refused("already authenticated".into()),
                Ctl::Rpc(req) => CtlReply::Rpc(self.node.handle(session, req)),
                Ctl::Regions => match self.sync_regions() {
                    Ok(()) => CtlReply::Regions(self.nic_regions()),
                    Err(e) => CtlReply::Refused(e.to_string()),
                },
                Ctl::ConnectRpc {
                    client,
                    slots,
                    max_message,
                } => self.new_rpc_channel(session, &client, slots, max_message),
                Ctl::Connect { client } | Ctl::Reconnect { client, .. } => {
                    match self.new_qp(&client) {
                        Ok((qp, r)) => {
                            qps.push(qp);
                            r
                        }
                        Err(e) => CtlReply::Refused(e.to_string()),
                    }
                }
            };
            let shutdown = matches!(reply, CtlReply::Rpc(Response::ShuttingDown));
            if ctl::send(&mut stream, &reply).is_err() || stream.flush().is_err() || shutdown {
                break;
            }
        }
        drop(qps);
        self.node.close_session(session);
    }
}
