//! The RPC channel over verbs: two-sided SEND/RECV on an RC queue pair per
//! channel, the node's worker threads polling its completion queue.
//!
//! Both ends register one buffer of `2 × slots` message slots: SENDs go
//! out of the first half, RECVs land in the second. A message is a
//! [`SlotHeader`] (id, length, service, status; the shm rings' slot
//! layout) and its payload. The client posts `slots` RECVs for replies
//! before its first request and keeps at most `slots` requests unanswered;
//! the node posts `slots` RECVs before it answers the connection request
//! and re-posts a slot's RECV as soon as it read the request in it, before
//! the reply leaves, so neither side ever meets an empty receive queue.
//!
//! On the node a channel is a [`NodeChannel`] served by the node's worker
//! pool (`dmkit_memnode::rpc`), one worker per channel, which polls the
//! channel's own completion queue. Remote clients cannot ring a worker's
//! bell: an idle worker naps (16 µs doubling to 1 ms) between looks. A
//! channel whose client is gone (its queue pair in error) is dropped; every
//! channel of a session goes when its control connection closes.

use std::collections::VecDeque;
use std::sync::Arc;
use std::time::Duration;

use dmkit_fabric::rpc::ReplyClock;
use dmkit_fabric::{LocalMem, NodeId, RpcChannel, RpcFailure, RpcReply, RpcSendError, ServiceId};
use dmkit_memnode::rpc::ring::{SlotHeader, SLOT_HEADER_BYTES};
use dmkit_memnode::rpc::{Incoming, NodeChannel};
use dmkit_verbs_sys as sys;
use zerocopy::{FromBytes, IntoBytes};

use crate::device::{Device, Endpoint};
use crate::error::VerbsError;
use crate::fabric::NodeLink;
use crate::qp::{Cq, Mr, QpSizes, RawQp};

/// Work-request id bit of a SEND (a RECV's id is its slot).
const SEND: u64 = 1 << 63;

/// A registered buffer of message slots: `slots` to send from, then
/// `slots` to receive into.
struct Slots {
    /// Declared before `mem`: deregistered before the memory is freed.
    mr: Mr,
    mem: LocalMem,
    slots: usize,
    /// Bytes of one slot (header and `max`, in whole lines).
    bytes: usize,
    max: usize,
}

impl Slots {
    fn new(dev: &Arc<Device>, slots: usize, max: usize) -> Result<Self, VerbsError> {
        let bytes = (SLOT_HEADER_BYTES + max).next_multiple_of(64);
        let mem = LocalMem::new(2 * slots * bytes);
        use sys::ibv_access_flags as A;
        // SAFETY: `mem` lives in the same struct and is dropped after the
        // registration (field order).
        let mr =
            unsafe { Mr::register(dev, mem.as_mut_ptr(), mem.len(), A::IBV_ACCESS_LOCAL_WRITE) }?;
        Ok(Self {
            mr,
            mem,
            slots,
            bytes,
            max,
        })
    }

    fn send_at(&self, i: usize) -> usize {
        (i % self.slots) * self.bytes
    }

    fn recv_at(&self, i: usize) -> usize {
        (self.slots + i % self.slots) * self.bytes
    }

    /// Writes a message into send slot `i`; returns its length on the wire.
    fn write(&self, i: usize, head: SlotHeader, payload: &[u8]) -> usize {
        debug_assert!(payload.len() <= self.max && head.len as usize == payload.len());
        let at = self.send_at(i);
        self.mem.write(at, head.as_bytes());
        self.mem.write(at + SLOT_HEADER_BYTES, payload);
        SLOT_HEADER_BYTES + payload.len()
    }

    /// Reads the message that arrived in receive slot `i` (`byte_len` as
    /// the NIC reported it) into `out`: its header, or `Err` with what
    /// could be read of it if it is malformed.
    fn read(&self, i: usize, byte_len: u32, out: &mut Vec<u8>) -> Result<SlotHeader, SlotHeader> {
        let at = self.recv_at(i);
        let n = byte_len as usize;
        if n < SLOT_HEADER_BYTES || n > self.bytes {
            return Err(SlotHeader {
                len: byte_len,
                ..Default::default()
            });
        }
        let mut raw = [0u8; SLOT_HEADER_BYTES];
        self.mem.read(at, &mut raw);
        let head = SlotHeader::read_from_bytes(&raw).expect("16 bytes make a slot header");
        let len = head.len as usize;
        if len > self.max || SLOT_HEADER_BYTES + len != n {
            return Err(head);
        }
        out.clear();
        out.resize(len, 0);
        self.mem.read(at + SLOT_HEADER_BYTES, out);
        Ok(head)
    }

    fn sge(&self, at: usize, len: usize) -> sys::ibv_sge {
        sys::ibv_sge {
            addr: self.mem.as_mut_ptr() as u64 + at as u64,
            length: len as u32,
            lkey: self.mr.lkey(),
        }
    }

    /// Posts a RECV into receive slot `i`.
    fn post_recv(&self, raw: &RawQp, i: usize) -> Result<(), VerbsError> {
        let mut sge = self.sge(self.recv_at(i), self.bytes);
        let mut wr = sys::ibv_recv_wr {
            wr_id: i as u64,
            next: std::ptr::null_mut(),
            sg_list: &mut sge,
            num_sge: 1,
        };
        // SAFETY: one well-formed request whose SGE lies inside the
        // registered buffer, which outlives the queue pair (field order of
        // the owners).
        unsafe { raw.post_recv(&mut wr) }
    }

    /// Posts a signaled SEND of `len` bytes of send slot `i`.
    fn post_send(&self, raw: &RawQp, i: usize, len: usize, wr_id: u64) -> Result<(), VerbsError> {
        let mut sge = self.sge(self.send_at(i), len);
        let mut wr = sys::ibv_send_wr {
            wr_id: SEND | wr_id,
            sg_list: &mut sge,
            num_sge: 1,
            opcode: sys::ibv_wr_opcode::IBV_WR_SEND,
            send_flags: sys::ibv_send_flags::IBV_SEND_SIGNALED.0,
            ..Default::default()
        };
        // SAFETY: as in `post_recv`.
        unsafe { raw.post(&mut wr) }
    }
}

/// An RC queue pair for messages, on its own completion queue, with
/// `slots` receive buffers posted.
fn message_qp(
    dev: &Arc<Device>,
    slots: usize,
    max: usize,
) -> Result<(RawQp, Arc<Cq>, Slots), VerbsError> {
    let cq = Arc::new(Cq::new(dev, 2 * slots as u32 + 2)?);
    let sizes = QpSizes {
        send_wr: slots as u32,
        sge: 1,
        inline: 0,
    };
    let raw = RawQp::create_with_recv(dev, &cq, sizes, slots as u32, false)?;
    let buf = Slots::new(dev, slots, max)?;
    for i in 0..slots {
        buf.post_recv(&raw, i)?;
    }
    Ok((raw, cq, buf))
}

/// One thread's RPC channel to a memory node over verbs.
pub struct VerbsRpcChannel {
    node: NodeId,
    // Field order is drop order: the queue pair before its buffers.
    raw: RawQp,
    cq: Arc<Cq>,
    buf: Slots,
    /// Requests sent, and SENDs completed.
    sent: u64,
    send_done: u64,
    /// Ids of the requests unanswered, in order.
    ids: VecDeque<u64>,
    /// Replies taken off the completion queue by `send` (waiting for a
    /// slot's SEND to complete), handed out by the next `poll`.
    early: Vec<RpcReply>,
    gone: Option<RpcFailure>,
    wcs: Vec<sys::ibv_wc>,
    /// See [`crate::VerbsConfig::rpc_reply_timeout`].
    clock: ReplyClock,
    _link: Arc<NodeLink>,
}

// SAFETY: the queue pair, completion queue and registration are used by the
// one thread that owns the channel (`&mut self`); the buffer is `LocalMem`.
unsafe impl Send for VerbsRpcChannel {}

impl VerbsRpcChannel {
    pub(crate) fn connect(
        dev: &Arc<Device>,
        link: Arc<NodeLink>,
        slots: u32,
        max: u32,
        reply_timeout: Duration,
    ) -> Result<Self, dmkit_fabric::FabricError> {
        let target = link.peer.clone();
        let fail = |e: VerbsError| crate::fabric::connect_err(&target, e);
        let (raw, cq, buf) = message_qp(dev, slots as usize, max as usize).map_err(fail)?;
        let psn = crate::random_psn();
        let server = link.connect_rpc(dev.endpoint(raw.qpn(), psn), slots, max)?;
        raw.connect(&server, psn).map_err(fail)?;
        Ok(Self {
            node: link.id,
            raw,
            cq,
            buf,
            sent: 0,
            send_done: 0,
            ids: VecDeque::with_capacity(slots as usize),
            early: Vec::new(),
            gone: None,
            wcs: vec![sys::ibv_wc::default(); 32],
            clock: ReplyClock::new(reply_timeout),
            _link: link,
        })
    }

    /// Polls the completion queue once: replies into `out`, SENDs retired.
    fn drive(&mut self, out: &mut Vec<RpcReply>) -> usize {
        let n = match self.cq.poll(&mut self.wcs) {
            Ok(n) => n,
            Err(_) => {
                self.gone = Some(RpcFailure::ConnectionLost);
                return 0;
            }
        };
        let mut got = 0;
        let mut payload = Vec::new();
        for k in 0..n {
            let wc = self.wcs[k];
            if wc.status != sys::ibv_wc_status::IBV_WC_SUCCESS {
                self.gone = Some(RpcFailure::ConnectionLost);
                continue;
            }
            if wc.wr_id & SEND != 0 {
                self.send_done += 1;
                continue;
            }
            let slot = wc.wr_id as usize;
            let Some(id) = self.ids.pop_front() else {
                continue; // a reply nobody asked for: ignore it
            };
            let result = match self.buf.read(slot, wc.byte_len, &mut payload) {
                Ok(head) => RpcFailure::decode(head.status, head.service, &payload)
                    .map(|()| std::mem::take(&mut payload)),
                Err(head) => Err(RpcFailure::Malformed(format!(
                    "reply of {} B in a channel of {} B messages",
                    head.len, self.buf.max
                ))),
            };
            if self.buf.post_recv(&self.raw, slot).is_err() {
                self.gone = Some(RpcFailure::ConnectionLost);
            }
            out.push(RpcReply { id, result });
            got += 1;
        }
        got
    }
}

impl RpcChannel for VerbsRpcChannel {
    fn node(&self) -> NodeId {
        self.node
    }

    fn max_message(&self) -> usize {
        self.buf.max
    }

    fn capacity(&self) -> usize {
        self.buf.slots
    }

    fn send(&mut self, id: u64, service: ServiceId, payload: &[u8]) -> Result<(), RpcSendError> {
        if let Some(f) = &self.gone {
            return Err(f.clone().into());
        }
        if payload.len() > self.buf.max {
            return Err(RpcFailure::TooLarge {
                len: payload.len(),
                max: self.buf.max,
            }
            .into());
        }
        if self.pending() >= self.buf.slots {
            return Err(RpcSendError::Full);
        }
        // The slot's previous SEND must be done before it is rewritten;
        // replies found meanwhile wait in `early` for the next poll.
        if self.sent - self.send_done >= self.buf.slots as u64 {
            let mut early = std::mem::take(&mut self.early);
            self.drive(&mut early);
            self.early = early;
            if self.sent - self.send_done >= self.buf.slots as u64 {
                return Err(RpcSendError::Full);
            }
        }
        let slot = self.sent as usize;
        let head = SlotHeader {
            id,
            len: payload.len() as u32,
            service,
            status: 0,
        };
        let len = self.buf.write(slot, head, payload);
        if self.buf.post_send(&self.raw, slot, len, self.sent).is_err() {
            self.gone = Some(RpcFailure::ConnectionLost);
            return Err(RpcFailure::ConnectionLost.into());
        }
        self.sent += 1;
        self.ids.push_back(id);
        Ok(())
    }

    fn poll(&mut self, out: &mut Vec<RpcReply>) -> usize {
        let mut n = self.early.len();
        out.append(&mut self.early);
        n += self.drive(out);
        if self.gone.is_none() {
            self.gone = self.clock.after_poll(n, !self.ids.is_empty());
        }
        if n == 0 && !self.ids.is_empty() {
            if let Some(f) = self.gone.clone() {
                for id in self.ids.drain(..) {
                    out.push(RpcReply {
                        id,
                        result: Err(f.clone()),
                    });
                    n += 1;
                }
            }
        }
        n
    }

    fn pending(&self) -> usize {
        self.ids.len() + self.early.len()
    }
}

/// The node's end of a channel: a [`NodeChannel`] for its worker pool.
pub(crate) struct NodeRpcChannel {
    // Field order is drop order: the queue pair before its buffers.
    raw: RawQp,
    cq: Arc<Cq>,
    buf: Slots,
    /// Receive slots holding a request, in arrival order, and their lengths.
    arrived: VecDeque<(usize, u32)>,
    /// Replies posted, and their SENDs completed.
    rep_sent: u64,
    rep_done: u64,
    broken: bool,
    wcs: Vec<sys::ibv_wc>,
}

// SAFETY: used by one worker thread at a time (the pool hands it over
// once); see `VerbsRpcChannel`.
unsafe impl Send for NodeRpcChannel {}

impl NodeRpcChannel {
    /// A channel of `slots` slots of `max` bytes to the client at `client`;
    /// returns it with the node's endpoint for the client.
    pub(crate) fn new(
        dev: &Arc<Device>,
        client: &Endpoint,
        slots: usize,
        max: usize,
    ) -> Result<(Self, Endpoint), VerbsError> {
        let (raw, cq, buf) = message_qp(dev, slots, max)?;
        let psn = crate::random_psn();
        raw.connect(client, psn)?;
        let server = dev.endpoint(raw.qpn(), psn);
        Ok((
            Self {
                raw,
                cq,
                buf,
                arrived: VecDeque::with_capacity(slots),
                rep_sent: 0,
                rep_done: 0,
                broken: false,
                wcs: vec![sys::ibv_wc::default(); 32],
            },
            server,
        ))
    }

    /// Polls the completion queue once.
    fn drive(&mut self) {
        let Ok(n) = self.cq.poll(&mut self.wcs) else {
            self.broken = true;
            return;
        };
        for k in 0..n {
            let wc = self.wcs[k];
            if wc.status != sys::ibv_wc_status::IBV_WC_SUCCESS {
                self.broken = true;
            } else if wc.wr_id & SEND != 0 {
                self.rep_done += 1;
            } else {
                self.arrived.push_back((wc.wr_id as usize, wc.byte_len));
            }
        }
    }
}

impl NodeChannel for NodeRpcChannel {
    fn next(&mut self, payload: &mut Vec<u8>) -> Incoming {
        if self.arrived.is_empty() {
            self.drive();
        }
        if self.broken {
            return Incoming::Broken;
        }
        let Some((slot, len)) = self.arrived.pop_front() else {
            return Incoming::None;
        };
        let read = self.buf.read(slot, len, payload);
        // Room for the client's next request before this one's reply.
        if self.buf.post_recv(&self.raw, slot).is_err() {
            self.broken = true;
        }
        match read {
            Ok(head) => Incoming::Request {
                id: head.id,
                service: head.service,
            },
            Err(head) => Incoming::Malformed {
                id: head.id,
                service: head.service,
                len: head.len as usize,
            },
        }
    }

    fn reply_room(&mut self) -> Option<usize> {
        self.drive();
        if self.broken {
            return None;
        }
        Some(self.buf.slots - (self.rep_sent - self.rep_done) as usize)
    }

    fn put_reply(&mut self, id: u64, service: ServiceId, status: u16, payload: &[u8]) {
        let head = SlotHeader {
            id,
            len: payload.len() as u32,
            service,
            status,
        };
        let slot = self.rep_sent as usize;
        let len = self.buf.write(slot, head, payload);
        if self
            .buf
            .post_send(&self.raw, slot, len, self.rep_sent)
            .is_err()
        {
            self.broken = true;
        }
        self.rep_sent += 1;
    }

    fn publish(&mut self) {}

    fn close(&mut self, _broken: bool) {
        // The client's requests in flight fail; the queue pair goes with
        // the channel.
        let _ = self.raw.to_error();
    }

    fn has_work(&mut self) -> bool {
        self.drive();
        self.broken || !self.arrived.is_empty()
    }

    fn rings_bell(&self) -> bool {
        false
    }
}
