//! The RPC channel in the simulator: the memory node's CPU, modelled.
//!
//! A request travels like a two-sided SEND of its size, and the node's
//! worker cores run the real service code (`dmkit_memnode::rpc`) at the
//! request's simulated start, on memory as it is at that instant:
//!
//! 1. **Client**: the posting thread's CPU (`cpu.post_ns + cpu.post_wr_ns`);
//!    the NIC fetches the WQE (`nic.fetch_ns`) unless the payload fits
//!    inline (`limits.max_inline`: BlueFlame, no fetch), then takes a slot
//!    of its send-queue units (`nic.iops`).
//! 2. **Links**: as a READ/WRITE request of the payload's size (the same
//!    FIFO link servers, `header_bytes` per packet of at most `mtu`).
//! 3. **Node NIC**: a slot of the responder's execution unit
//!    (`responder.iops`) and the DMA of the message into the receive
//!    buffer (`responder.dma_write_ns`).
//! 4. **The node's RPC queue** (`rpc.queue_ns`): requests enter the
//!    workers' shared queue one at a time (CoRM §2.2.2: an RPC queue shared
//!    by the worker threads); 0 means no such stage.
//! 5. **A worker core** (`rpc.cores` of them, or
//!    [`crate::SimConfig::rpc_workers`]): the request waits, first come
//!    first served, for a free core; the service runs there, and the core
//!    is busy for `rpc.request_ns + rpc.byte_ns × (request + reply bytes)`
//!    plus what the service charged (`WorkerCtx::charge_ns`). Messages
//!    between workers are jobs of their destination core (before the
//!    shared queue's), available when the sending job ends, and cost
//!    `rpc.request_ns` plus their charge.
//! 6. **Reply**: it leaves when its job ends (a deferred call: when the job
//!    that completes it ends) over the node's uplink and the client's
//!    downlink, and is written to host memory (`nic.deliver_ns`). Replies
//!    of one channel are delivered in request order; polling costs
//!    `cpu.poll_ns` and `cpu.cqe_ns` per reply.
//!
//! Calibration (the ConnectX-3 profile, CoRM's testbed): see
//! `configs/sim/cx3-56g.toml`. Not modelled: faults on the RPC path (the
//! disconnect fault applies to queue pairs only), the node NIC's receive
//! queue running out of posted buffers (a channel's capacity bounds what a
//! client has in flight).

use std::any::Any;
use std::cmp::Reverse;
use std::collections::{BinaryHeap, VecDeque};
use std::sync::Arc;

use dmkit_fabric::{NodeId, RpcFailure, RpcReply, RpcSendError, ServiceId};
use dmkit_memnode::rpc::{CallKey, CallOutcome, Outgoing, RpcWorker, WorkerId};
use dmkit_memnode::{MemNode, SessionId};

use crate::engine::{fmax, packets, request_link, to_time, Core, ThreadId, Time};

/// What a core runs.
enum Job {
    Call {
        chan: u32,
        seq: u64,
        service: ServiceId,
        payload: Vec<u8>,
    },
    Message {
        service: ServiceId,
        from: WorkerId,
        msg: Box<dyn Any + Send>,
    },
}

enum Kind {
    /// A request reached the node's memory.
    Arrive { node: usize, job: Job },
    /// A request left the node's RPC queue for the cores.
    Dispatch { node: usize, job: Job },
    /// A core finished its job.
    Done { node: usize, core: usize },
    /// A core may have a message to start.
    Kick { node: usize, core: usize },
}

struct Event {
    at: Time,
    seq: u64,
    kind: Kind,
}

impl PartialEq for Event {
    fn eq(&self, o: &Self) -> bool {
        (self.at, self.seq) == (o.at, o.seq)
    }
}
impl Eq for Event {}
impl PartialOrd for Event {
    fn partial_cmp(&self, o: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(o))
    }
}
impl Ord for Event {
    fn cmp(&self, o: &Self) -> std::cmp::Ordering {
        (self.at, self.seq).cmp(&(o.at, o.seq))
    }
}

struct SimCore {
    busy: bool,
    worker: RpcWorker,
    /// Messages for this core: (available from, sequence, job), sorted.
    private: VecDeque<(f64, u64, Job)>,
}

/// One memory node's CPU.
struct RpcNode {
    id: NodeId,
    node: Arc<MemNode>,
    machine: usize,
    cores: Vec<SimCore>,
    /// Requests waiting for a core, in arrival order.
    queue: VecDeque<Job>,
    /// When the shared RPC queue takes its next request.
    queue_free: f64,
}

/// A reply on its way.
struct Pending {
    id: u64,
    /// (visible at, outcome) once the node answered.
    ready: Option<(Time, Result<Vec<u8>, RpcFailure>)>,
}

/// One client channel.
struct SimChan {
    node: usize,
    thread: Option<ThreadId>,
    machine: usize,
    session: SessionId,
    /// Requests sent (the next one's sequence number).
    sent: u64,
    /// Sequence number of `pending[0]`.
    first: u64,
    pending: VecDeque<Pending>,
    last_deliver: f64,
    dropped: bool,
}

/// Counters of the simulated RPC path.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct RpcSimStats {
    /// Requests sent.
    pub requests: u64,
    /// Replies delivered.
    pub replies: u64,
    /// Jobs the cores ran (calls and messages).
    pub jobs: u64,
    /// Time the cores were busy, summed (ns).
    pub busy_ns: u64,
}

/// The simulated RPC path of a cluster: nodes' cores, channels, events.
pub(crate) struct RpcSim {
    cores_per_node: usize,
    max_message: usize,
    nodes: Vec<RpcNode>,
    chans: Vec<SimChan>,
    /// Channels of each thread, by thread id.
    thread_chans: Vec<Vec<u32>>,
    /// Calls each thread has pending over all its channels: most threads
    /// of most runs never call, and the driver asks about every thread at
    /// every step ([`RpcSim::next_reply`], [`RpcSim::awaits`]).
    thread_pending: Vec<u32>,
    events: BinaryHeap<Reverse<Event>>,
    seq: u64,
    stats: RpcSimStats,
}

impl RpcSim {
    pub(crate) fn new(cores_per_node: usize, max_message: usize) -> Self {
        Self {
            cores_per_node,
            max_message,
            nodes: Vec::new(),
            chans: Vec::new(),
            thread_chans: Vec::new(),
            thread_pending: Vec::new(),
            events: BinaryHeap::new(),
            seq: 0,
            stats: RpcSimStats::default(),
        }
    }

    fn push(&mut self, at: Time, kind: Kind) {
        self.seq += 1;
        self.events.push(Reverse(Event {
            at,
            seq: self.seq,
            kind,
        }));
    }

    pub(crate) fn next_event(&self) -> Option<Time> {
        self.events.peek().map(|e| e.0.at)
    }

    /// When thread `t`'s next reply becomes visible, if known.
    pub(crate) fn next_reply(&self, t: ThreadId) -> Option<Time> {
        if self.pending_of(t) == 0 {
            return None;
        }
        self.thread_chans
            .get(t as usize)?
            .iter()
            .filter_map(|&c| {
                let front = self.chans[c as usize].pending.front()?;
                front.ready.as_ref().map(|r| r.0)
            })
            .min()
    }

    /// Whether thread `t` waits for a reply whose instant is not known yet.
    pub(crate) fn awaits(&self, t: ThreadId) -> bool {
        if self.pending_of(t) == 0 {
            return false;
        }
        self.thread_chans.get(t as usize).is_some_and(|cs| {
            cs.iter().any(|&c| {
                self.chans[c as usize]
                    .pending
                    .iter()
                    .any(|p| p.ready.is_none())
            })
        })
    }

    pub(crate) fn stats(&self) -> RpcSimStats {
        self.stats
    }

    fn pending_of(&self, t: ThreadId) -> u32 {
        self.thread_pending.get(t as usize).copied().unwrap_or(0)
    }

    /// Channel `c`'s pending calls changed by `delta` (its thread's count).
    fn note_pending(&mut self, c: u32, delta: i64) {
        if let Some(t) = self.chans[c as usize].thread {
            let n = &mut self.thread_pending[t as usize];
            *n = (*n as i64 + delta) as u32;
        }
    }
}

impl Core {
    fn rpc_mut(&mut self) -> &mut RpcSim {
        self.rpc.as_mut().expect("a channel exists")
    }

    /// Opens a channel from the caller to memory node `id` (whose
    /// embedded node is `node`, on machine `machine`).
    pub(crate) fn rpc_connect(&mut self, id: NodeId, node: Arc<MemNode>) -> Result<u32, String> {
        let machine = self
            .machine_of(id)
            .ok_or_else(|| format!("no memory node {id}"))?;
        let thread = self.current;
        let client = match thread {
            Some(t) => self.threads[t as usize],
            None => 0,
        };
        let rpc = self
            .rpc
            .get_or_insert_with(|| Box::new(RpcSim::new(self.rpc_cores, self.rpc_max_message)));
        if rpc.cores_per_node == 0 {
            return Err("the simulated memory nodes run no RPC workers".into());
        }
        let ni = match rpc.nodes.iter().position(|n| n.id == id) {
            Some(i) => i,
            None => {
                let cores = rpc.cores_per_node;
                rpc.nodes.push(RpcNode {
                    id,
                    cores: (0..cores)
                        .map(|c| SimCore {
                            busy: false,
                            worker: RpcWorker::new(&node, c, cores),
                            private: VecDeque::new(),
                        })
                        .collect(),
                    node: node.clone(),
                    machine,
                    queue: VecDeque::new(),
                    queue_free: 0.0,
                });
                rpc.nodes.len() - 1
            }
        };
        let session = node.open_session();
        let c = rpc.chans.len() as u32;
        rpc.chans.push(SimChan {
            node: ni,
            thread,
            machine: client,
            session,
            sent: 0,
            first: 0,
            pending: VecDeque::new(),
            last_deliver: 0.0,
            dropped: false,
        });
        if let Some(t) = thread {
            let t = t as usize;
            if rpc.thread_chans.len() <= t {
                rpc.thread_chans.resize_with(t + 1, Vec::new);
                rpc.thread_pending.resize(t + 1, 0);
            }
            rpc.thread_chans[t].push(c);
        }
        Ok(c)
    }

    /// (max message, capacity) of channels.
    pub(crate) fn rpc_limits(&self) -> (usize, usize) {
        (self.rpc_max_message, self.rpc_capacity)
    }

    /// Requests of channel `c` not yet polled.
    pub(crate) fn rpc_pending(&self, c: u32) -> usize {
        self.rpc
            .as_ref()
            .map_or(0, |r| r.chans[c as usize].pending.len())
    }

    /// Sends request `id` on channel `c`: the client's CPU and NIC, the
    /// links and the node's NIC now; its arrival is an event.
    pub(crate) fn rpc_send(
        &mut self,
        c: u32,
        id: u64,
        service: ServiceId,
        payload: &[u8],
    ) -> Result<(), RpcSendError> {
        let (max, cap) = self.rpc_limits();
        let ch = &self.rpc_mut().chans[c as usize];
        if payload.len() > max {
            return Err(RpcFailure::TooLarge {
                len: payload.len(),
                max,
            }
            .into());
        }
        if ch.pending.len() >= cap {
            return Err(RpcSendError::Full);
        }
        let (ni, client) = (ch.node, ch.machine);
        self.charge(self.p.cpu.post_ns + self.p.cpu.post_wr_ns);
        let t = self.caller_time() as f64;
        let p = &self.p;
        let fetched = if payload.len() <= p.limits.max_inline {
            t
        } else {
            t + p.nic.fetch_ns
        };
        let link_bpns = p.link.gbps / 8.0;
        let bytes = payload.len() as f64;
        let ser = (packets(bytes, p.link.mtu) * p.link.header_bytes + bytes) / link_bpns;
        let (nic_slot, resp_slot) = (1e3 / p.nic.iops, 1e3 / p.responder.iops);
        let (dma, wire) = (p.responder.dma_write_ns, p.link.wire_ns);
        let target = self.rpc.as_ref().expect("exists").nodes[ni].machine;
        let half_wire = if target == client { 0.0 } else { wire / 2.0 };
        let (tx, rx) = if target == client {
            let m = &mut self.machines[client];
            (&mut m.tx, &mut m.rx)
        } else {
            let [a, b] = self
                .machines
                .get_disjoint_mut([client, target])
                .expect("both machines exist");
            (&mut a.tx, &mut b.rx)
        };
        let start = fmax(fetched, tx.req_free);
        tx.req_free = start + nic_slot;
        let arrive = request_link(tx, rx, start + nic_slot, ser, half_wire);
        let admit = fmax(arrive, rx.resp_free);
        rx.resp_free = admit + resp_slot;
        let at = to_time(admit + dma);
        let rpc = self.rpc_mut();
        let ch = &mut rpc.chans[c as usize];
        let seq = ch.sent;
        ch.sent += 1;
        ch.pending.push_back(Pending { id, ready: None });
        rpc.note_pending(c, 1);
        rpc.stats.requests += 1;
        rpc.push(
            at,
            Kind::Arrive {
                node: ni,
                job: Job::Call {
                    chan: c,
                    seq,
                    service,
                    payload: payload.to_vec(),
                },
            },
        );
        Ok(())
    }

    /// Moves channel `c`'s replies visible to the caller into `out`. The
    /// external caller (outside any step) runs the simulation until one
    /// is.
    pub(crate) fn rpc_poll(&mut self, c: u32, out: &mut Vec<RpcReply>) -> usize {
        let external = self.current.is_none();
        self.charge(self.p.cpu.poll_ns);
        loop {
            let now = self.caller_time();
            let ch = &mut self.rpc_mut().chans[c as usize];
            let mut n = 0;
            while ch
                .pending
                .front()
                .is_some_and(|p| p.ready.as_ref().is_some_and(|r| r.0 <= now))
            {
                let p = ch.pending.pop_front().expect("front exists");
                ch.first += 1;
                let (_, result) = p.ready.expect("checked");
                out.push(RpcReply { id: p.id, result });
                n += 1;
            }
            if n > 0 {
                self.rpc_mut().note_pending(c, -(n as i64));
                self.rpc_mut().stats.replies += n as u64;
                self.charge(self.p.cpu.cqe_ns * n as f64);
                return n;
            }
            if !external || ch.pending.is_empty() {
                return 0;
            }
            // The external caller waits: to this channel's next reply, or
            // to the next thing that happens on the RPC path.
            let next = match ch.pending.front().and_then(|p| p.ready.as_ref()) {
                Some((at, _)) => Some(*at),
                None => self.next_event(),
            };
            match next {
                Some(t) => self.apply_until(t.max(self.now)),
                None => return 0,
            }
        }
    }

    /// Blocks the caller until channel `c` has a reply: its CPU time jumps
    /// there (the runtime never blocks; tools and tests may).
    pub(crate) fn rpc_block(&mut self, c: u32) {
        let front = self.rpc.as_ref().and_then(|r| {
            let p = r.chans[c as usize].pending.front()?;
            Some(p.ready.as_ref().map(|r| r.0))
        });
        let t = match front {
            None => return,
            Some(Some(at)) => Some(at),
            Some(None) => self.next_event(),
        };
        if let Some(t) = t {
            self.apply_until(t);
            if self.current.is_some() && t > self.cursor {
                self.cursor = t;
                self.clock.store(t, std::sync::atomic::Ordering::Release);
            }
        }
    }

    /// Channel `c`'s owner dropped it: later replies are discarded, and
    /// its session ends.
    pub(crate) fn rpc_drop(&mut self, c: u32) {
        let Some(rpc) = self.rpc.as_mut() else { return };
        let ch = &mut rpc.chans[c as usize];
        ch.dropped = true;
        let n = ch.pending.len() as i64;
        ch.pending.clear();
        let (ni, session, thread) = (ch.node, ch.session, ch.thread);
        rpc.note_pending(c, -n);
        if let Some(v) = thread.and_then(|t| rpc.thread_chans.get_mut(t as usize)) {
            v.retain(|&x| x != c);
        }
        let n = &mut rpc.nodes[ni];
        n.node.close_session(session);
        let node = n.node.clone();
        for core in &mut n.cores {
            core.worker.session_closed(&node, session);
        }
    }

    /// Runs the earliest RPC event (the caller applied everything due
    /// before it).
    pub(crate) fn run_rpc_event(&mut self) {
        let Some(Reverse(ev)) = self.rpc.as_mut().and_then(|r| r.events.pop()) else {
            return;
        };
        let at = ev.at as f64;
        match ev.kind {
            Kind::Arrive { node, job } => {
                let q = self.p.rpc.queue_ns;
                let n = &mut self.rpc_mut().nodes[node];
                let leave = fmax(at, n.queue_free) + q;
                n.queue_free = leave;
                if q > 0.0 {
                    self.rpc_mut()
                        .push(to_time(leave), Kind::Dispatch { node, job });
                } else {
                    self.rpc_dispatch(node, job, at);
                }
            }
            Kind::Dispatch { node, job } => self.rpc_dispatch(node, job, at),
            Kind::Done { node, core } => {
                self.rpc_mut().nodes[node].cores[core].busy = false;
                self.rpc_next(node, core, at);
            }
            Kind::Kick { node, core } => {
                if !self.rpc_mut().nodes[node].cores[core].busy {
                    self.rpc_next(node, core, at);
                }
            }
        }
    }

    /// A request reaches the cores at `at`: the first idle one runs it, or
    /// it waits its turn.
    fn rpc_dispatch(&mut self, node: usize, job: Job, at: f64) {
        let n = &mut self.rpc_mut().nodes[node];
        match n.cores.iter().position(|c| !c.busy) {
            Some(core) if n.queue.is_empty() => self.rpc_start(node, core, job, at),
            _ => n.queue.push_back(job),
        }
    }

    /// Core `core` is free at `at`: its next message, else the next queued
    /// request, else it idles (woken for a message due later).
    fn rpc_next(&mut self, node: usize, core: usize, at: f64) {
        let n = &mut self.rpc_mut().nodes[node];
        let c = &mut n.cores[core];
        if c.private.front().is_some_and(|m| m.0 <= at) {
            let (_, _, job) = c.private.pop_front().expect("front exists");
            return self.rpc_start(node, core, job, at);
        }
        if let Some(job) = n.queue.pop_front() {
            return self.rpc_start(node, core, job, at);
        }
        if let Some(&(due, _, _)) = n.cores[core].private.front() {
            self.rpc_mut().push(to_time(due), Kind::Kick { node, core });
        }
    }

    /// Runs `job` on core `core` from `at`: the service code now, the core
    /// busy for its cost, the reply and messages sent when it ends.
    fn rpc_start(&mut self, node: usize, core: usize, job: Job, at: f64) {
        let (request_ns, byte_ns) = (self.p.rpc.request_ns, self.p.rpc.byte_ns);
        let rpc: &mut RpcSim = self.rpc.as_deref_mut().expect("exists");
        let max = rpc.max_message;
        let n = &mut rpc.nodes[node];
        let mn = n.node.clone();
        let c = &mut n.cores[core];
        c.busy = true;
        let mut reply = Vec::new();
        let (cost, answer) = match job {
            Job::Call {
                chan,
                seq,
                service,
                payload,
            } => {
                let session = rpc.chans[chan as usize].session;
                let key = CallKey {
                    channel: chan as u64,
                    seq,
                };
                let outcome = c
                    .worker
                    .call(&mn, session, key, service, &payload, &mut reply);
                let bytes = (payload.len() + reply.len()) as f64;
                let cost = request_ns + byte_ns * bytes;
                let answer = match outcome {
                    CallOutcome::Deferred => None,
                    CallOutcome::Replied(Ok(())) if reply.len() <= max => {
                        Some((chan, seq, Ok(std::mem::take(&mut reply))))
                    }
                    CallOutcome::Replied(Ok(())) => Some((
                        chan,
                        seq,
                        Err(RpcFailure::TooLarge {
                            len: reply.len(),
                            max,
                        }),
                    )),
                    CallOutcome::Replied(Err(f)) => Some((chan, seq, Err(f))),
                };
                (cost, answer)
            }
            Job::Message { service, from, msg } => {
                c.worker.message(&mn, service, from, msg);
                (request_ns, None)
            }
        };
        let cost = cost + c.worker.take_charged();
        let out = c.worker.take_outgoing();
        let done = at + cost;
        rpc.stats.jobs += 1;
        rpc.stats.busy_ns += cost as u64;
        rpc.push(to_time(done), Kind::Done { node, core });
        if let Some((chan, seq, result)) = answer {
            self.rpc_reply(chan, seq, result, done);
        }
        for o in out {
            match o {
                Outgoing::Message {
                    to,
                    service,
                    from,
                    msg,
                } => {
                    // Available from the (integer) instant its job ends,
                    // the instant a kick for it runs at.
                    let due = to_time(done);
                    let avail = due as f64;
                    let rpc = self.rpc_mut();
                    rpc.seq += 1;
                    let s = rpc.seq;
                    let target = &mut rpc.nodes[node].cores[to];
                    let at = target.private.partition_point(|m| (m.0, m.1) <= (avail, s));
                    target
                        .private
                        .insert(at, (avail, s, Job::Message { service, from, msg }));
                    if !target.busy {
                        rpc.push(due, Kind::Kick { node, core: to });
                    }
                }
                Outgoing::Complete { token, result } => {
                    let CallKey { channel, seq } = token.call();
                    self.rpc_reply(channel as u32, seq, result, done);
                }
            }
        }
    }

    /// The reply to call `seq` of channel `chan` leaves the node at
    /// `depart`: the node's uplink, the client's downlink, host memory.
    fn rpc_reply(&mut self, chan: u32, seq: u64, result: Result<Vec<u8>, RpcFailure>, depart: f64) {
        let p = &self.p;
        let bytes = match &result {
            Ok(b) => b.len() as f64,
            Err(f) => f.encode(usize::MAX).1.len() as f64,
        };
        let link_bpns = p.link.gbps / 8.0;
        let ser = (packets(bytes, p.link.mtu) * p.link.header_bytes + bytes) / link_bpns;
        let (wire, deliver_ns) = (p.link.wire_ns, p.nic.deliver_ns);
        let rpc: &mut RpcSim = self.rpc.as_deref_mut().expect("exists");
        let ch = &rpc.chans[chan as usize];
        if ch.dropped || seq < ch.first {
            return;
        }
        let (target, client) = (rpc.nodes[ch.node].machine, ch.machine);
        let half_wire = if target == client { 0.0 } else { wire / 2.0 };
        let (tx, rx) = if target == client {
            let m = &mut self.machines[client];
            (&mut m.tx, &mut m.rx)
        } else {
            let [a, b] = self
                .machines
                .get_disjoint_mut([client, target])
                .expect("both machines exist");
            (&mut a.tx, &mut b.rx)
        };
        let up = fmax(depart, rx.up_resp_free);
        rx.up_resp_free = up + ser;
        let down = fmax(up + ser + half_wire, tx.down_resp_free);
        tx.down_resp_free = down + ser;
        let ch = &mut rpc.chans[chan as usize];
        let deliver = fmax(down + ser + half_wire + deliver_ns, ch.last_deliver);
        ch.last_deliver = deliver;
        let at = to_time(deliver);
        let Some(p) = ch.pending.get_mut((seq - ch.first) as usize) else {
            return;
        };
        if p.ready.is_some() {
            return; // answered twice: the first answer stands
        }
        p.ready = Some((at, result));
        if let Some(t) = ch.thread {
            self.woken.push((at, t));
        }
    }
}
