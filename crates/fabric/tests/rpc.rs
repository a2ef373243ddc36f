//! The shm backend's RPC channel beyond the conformance checks: clients in
//! other processes, a client killed mid-request, hostile ring contents,
//! services with per-worker state and messages, shutdown, and the idle
//! workers' sleep.

mod common;

use std::process::Command;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use common::{spawn_until_line, Served};
use dmkit_fabric::shm::{ShmConfig, ShmFabric};
use dmkit_fabric::{
    conformance, ControlPlane, Fabric, FabricError, RpcChannel, RpcFailure, RpcSendError,
};
use dmkit_memnode::rpc::ring::{SlotHeader, CHANNEL_BROKEN};
use dmkit_memnode::rpc::{Deferred, Service, ServiceError, WorkerCtx, WorkerId, ECHO};
use dmkit_memnode::{MemNode, NodeConfig};

const TESTKIT: &str = env!("CARGO_BIN_EXE_dmkit-shm-testkit");

fn embedded(workers: usize) -> ShmFabric {
    ShmFabric::embedded(
        ShmConfig {
            rpc_slots: 8,
            rpc_max_message: 256,
            ..Default::default()
        },
        &[NodeConfig {
            size: 4 << 20,
            rpc_workers: workers,
            ..Default::default()
        }],
    )
    .unwrap()
}

/// Waits until `cond` holds (or fails after 20 s).
fn eventually(what: &str, mut cond: impl FnMut() -> bool) {
    let t0 = Instant::now();
    while !cond() {
        assert!(t0.elapsed() < Duration::from_secs(20), "timed out: {what}");
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// Sleeps a millisecond per call: requests are in the middle of being
/// served when their client dies.
struct Slow;

impl Service for Slow {
    type Worker = ();
    type Message = ();
    fn name(&self) -> &'static str {
        "slow"
    }
    fn start_worker(&self, _: WorkerId, _: usize) {}
    fn handle(
        &self,
        _cx: &mut WorkerCtx<'_, Self>,
        request: &[u8],
        reply: &mut Vec<u8>,
    ) -> Result<(), ServiceError> {
        std::thread::sleep(Duration::from_millis(1));
        reply.extend_from_slice(request);
        Ok(())
    }
}

#[test]
fn conformance_from_other_processes() {
    let s = Served::start(4 << 20);
    let children: Vec<_> = (0..3)
        .map(|_| {
            Command::new(TESTKIT)
                .args(["rpc", s.socket.to_str().unwrap()])
                .spawn()
                .unwrap()
        })
        .collect();
    // And from this process at the same time.
    conformance::rpc_all(&s.client(), 0);
    for mut c in children {
        assert!(c.wait().unwrap().success());
    }
    let st = s.node.stats();
    assert_eq!(st.rpc_workers, 2);
    assert!(st.rpc_requests > 4 * 1000, "{st:?}");
    eventually("every channel reclaimed", || {
        s.node.stats().rpc_channels == 0
    });
}

#[test]
fn a_client_killed_mid_request_is_reclaimed_and_others_are_served() {
    let s = Served::start(4 << 20);
    assert!(s.node.register_service(7, Slow));
    let f = s.client();
    let mut mine = f.connect_rpc_channel(0).unwrap();
    assert_eq!(mine.call(ECHO, b"before"), Ok(b"before".to_vec()));
    let before = s.node.stats();
    let (mut child, line) = spawn_until_line(Command::new(TESTKIT).args([
        "rpc-flood",
        s.socket.to_str().unwrap(),
        "7",
    ]));
    assert_eq!(line.trim(), "ready");
    assert_eq!(s.node.stats().rpc_channels, before.rpc_channels + 1);
    // Killed with its ring full of slow requests, one of them being served.
    child.kill().unwrap();
    child.wait().unwrap();
    eventually("the dead client's channel reclaimed", || {
        let st = s.node.stats();
        st.rpc_channels == before.rpc_channels && st.sessions_reaped == before.sessions_reaped + 1
    });
    assert_eq!(
        s.node.stats().rpc_channels_reclaimed,
        before.rpc_channels_reclaimed + 1
    );
    // The node still serves: this client, and a new one.
    assert_eq!(mine.call(ECHO, b"after"), Ok(b"after".to_vec()));
    assert_eq!(mine.call(7, b"slow"), Ok(b"slow".to_vec()));
    let g = s.client();
    let mut other = g.connect_rpc_channel(0).unwrap();
    assert_eq!(other.call(ECHO, b"new"), Ok(b"new".to_vec()));
    // A channel belongs to its fabric's session: it ends with it.
    let open = s.node.stats().rpc_channels;
    drop(g);
    eventually("the session's channel reclaimed", || {
        s.node.stats().rpc_channels == open - 1
    });
    let mut out = Vec::new();
    other.send(1, ECHO, b"late").unwrap();
    eventually("the orphaned channel fails its call", || {
        other.poll(&mut out) > 0
    });
    assert_eq!(out[0].result, Err(RpcFailure::ConnectionLost));
}

/// Publishes requests written into the ring by hand, up to `tail` (the
/// worker finds them at the latest after its nap).
fn publish(ch: &dmkit_fabric::shm::ShmRpcChannel, tail: u64) {
    ch.ring().header().req_tail.store(tail, Ordering::SeqCst);
}

#[test]
fn hostile_ring_contents_never_crash_a_worker() {
    // One worker: every channel below is served by the same thread.
    let f = embedded(1);
    let node = f.embedded_node(0).unwrap();
    let mut good = f.connect_rpc_channel(0).unwrap();
    assert_eq!(good.call(ECHO, b"hi"), Ok(b"hi".to_vec()));

    // 1. Wrong lengths and garbage headers in the slots, written behind the
    // channel's back: each is answered, as malformed or unknown service.
    let evil = f.connect_rpc_channel(0).unwrap();
    let ring = evil.ring();
    let max = ring.geometry().max_message;
    ring.write_request(0, 1, ECHO, b"fine");
    ring.write_request(1, 2, 0xFFFF, b"nobody");
    // A slot claiming more bytes than the channel carries.
    ring.write_request(2, 3, ECHO, b"x");
    let p = ring.mapping().as_ptr();
    let slot2 = dmkit_memnode::rpc::ring::HEADER_BYTES + 2 * ring.geometry().slot_bytes();
    // SAFETY (test): slot 2's header lies inside the mapping; a hostile
    // client writes it with plain stores, which is what this emulates.
    unsafe {
        let h = p.add(slot2) as *mut SlotHeader;
        (*h).len = max + 1;
    }
    publish(&evil, 3);
    let mut out = Vec::new();
    let mut raw = Vec::new();
    eventually("three replies", || {
        ring.header().rep_tail.load(Ordering::Acquire) >= 3
    });
    for seq in 0..3 {
        let h = ring.read_reply(seq, &mut raw).unwrap();
        out.push((
            h.id,
            RpcFailure::decode(h.status, h.service, &raw).map(|()| raw.clone()),
        ));
    }
    assert_eq!(out[0], (1, Ok(b"fine".to_vec())));
    assert_eq!(out[1], (2, Err(RpcFailure::NoSuchService(0xFFFF))));
    assert!(
        matches!(&out[2], (3, Err(RpcFailure::Malformed(_)))),
        "{out:?}"
    );
    assert_eq!(node.stats().rpc_malformed, 1);

    // 2. A tail that claims more requests than the ring has: the channel
    // is dropped as broken, and only it.
    ring.header().rep_head.store(3, Ordering::SeqCst);
    publish(&evil, 3 + 1000);
    eventually("the channel dropped as broken", || {
        ring.header().state.load(Ordering::Acquire) == CHANNEL_BROKEN
    });
    assert_eq!(node.stats().rpc_channels_broken, 1);

    // 3. A reply counter that claims more than the ring: broken too.
    let mut evil2 = f.connect_rpc_channel(0).unwrap();
    evil2
        .ring()
        .header()
        .rep_head
        .store(u64::MAX / 2, Ordering::SeqCst);
    evil2.send(9, ECHO, b"?").unwrap();
    eventually("the second channel dropped", || {
        node.stats().rpc_channels_broken == 2
    });
    let mut got = Vec::new();
    eventually("its call fails as lost", || evil2.poll(&mut got) > 0);
    assert_eq!(got[0].result, Err(RpcFailure::ConnectionLost));
    assert!(matches!(
        evil2.send(10, ECHO, b"?"),
        Err(RpcSendError::Refused(RpcFailure::ConnectionLost))
    ));

    // 4. Random bytes everywhere in a channel's slots.
    let junk = f.connect_rpc_channel(0).unwrap();
    let r = junk.ring();
    let slots = r.geometry().slots as u64;
    let mut x = 0x9E37_79B9_7F4A_7C15u64;
    let rings = 2 * slots as usize * r.geometry().slot_bytes();
    for i in (0..rings).step_by(8) {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        // SAFETY (test): inside the mapping's rings, 8-byte aligned.
        unsafe {
            (*(p_of(&junk).add(dmkit_memnode::rpc::ring::HEADER_BYTES + i)
                as *const std::sync::atomic::AtomicU64))
                .store(x, Ordering::Relaxed)
        };
    }
    publish(&junk, slots);
    eventually("every junk request answered", || {
        r.header().rep_tail.load(Ordering::Acquire) == slots
    });

    // The worker is alive and the good channel never noticed.
    assert_eq!(good.call(ECHO, b"still"), Ok(b"still".to_vec()));
    let st = node.stats();
    assert!(
        st.rpc_malformed >= 1 && st.rpc_failures >= st.rpc_malformed,
        "{st:?}"
    );
}

fn p_of(ch: &dmkit_fabric::shm::ShmRpcChannel) -> *mut u8 {
    ch.ring().mapping().as_ptr()
}

/// Per-worker state and worker-to-worker messages over real threads: a
/// call to worker w's channel asks another worker for its count and
/// answers with both (a deferred reply).
struct Census;

impl Service for Census {
    type Worker = u64;
    type Message = (Deferred, Option<u64>);
    fn name(&self) -> &'static str {
        "census"
    }
    fn start_worker(&self, _: WorkerId, _: usize) -> u64 {
        0
    }
    fn handle(
        &self,
        cx: &mut WorkerCtx<'_, Self>,
        _request: &[u8],
        _reply: &mut Vec<u8>,
    ) -> Result<(), ServiceError> {
        *cx.state() += 1;
        let other = (cx.worker() + 1) % cx.workers();
        let t = cx.defer();
        cx.send(other, (t, None));
        Ok(())
    }
    fn message(&self, cx: &mut WorkerCtx<'_, Self>, from: WorkerId, msg: Self::Message) {
        match msg {
            (t, None) => {
                let mine = *cx.state();
                cx.send(from, (t, Some(mine)));
            }
            (t, Some(theirs)) => {
                let mut r = (cx.worker() as u64).to_le_bytes().to_vec();
                r.extend_from_slice(&cx.state().to_le_bytes());
                r.extend_from_slice(&theirs.to_le_bytes());
                cx.complete(t, Ok(r));
            }
        }
    }
}

#[test]
fn services_keep_per_worker_state_and_message_each_other() {
    let f = embedded(2);
    assert!(f.embedded_node(0).unwrap().register_service(5, Census));
    let mut a = f.connect_rpc_channel(0).unwrap();
    let mut b = f.connect_rpc_channel(0).unwrap();
    assert_ne!(a.worker(), b.worker(), "channels spread over the workers");
    let decode = |v: Vec<u8>| -> [u64; 3] {
        std::array::from_fn(|i| u64::from_le_bytes(v[8 * i..8 * i + 8].try_into().unwrap()))
    };
    let wa = a.worker() as u64;
    for k in 1..=3u64 {
        assert_eq!(decode(a.call(5, b"").unwrap()), [wa, k, 0]);
    }
    // b's worker has its own count, and sees a's.
    assert_eq!(decode(b.call(5, b"").unwrap()), [1 - wa, 1, 3]);
    // Deferred replies keep the channel's order behind immediate ones.
    for i in 0..6u64 {
        let svc = if i % 2 == 0 { 5 } else { ECHO };
        a.send(i, svc, &i.to_le_bytes()).unwrap();
    }
    let mut out = Vec::new();
    eventually("six replies", || {
        a.poll(&mut out);
        out.len() == 6
    });
    assert_eq!(
        out.iter().map(|r| r.id).collect::<Vec<_>>(),
        [0, 1, 2, 3, 4, 5]
    );
    assert_eq!(out[1].result, Ok(1u64.to_le_bytes().to_vec()));
    assert_eq!(decode(out[4].result.clone().unwrap()), [wa, 6, 1]);
    assert!(f.embedded_node(0).unwrap().stats().rpc_messages >= 2 * 7);
}

#[test]
fn shutdown_fails_pending_calls_and_refuses_new_channels() {
    let f = embedded(1);
    let node = f.embedded_node(0).unwrap();
    assert!(node.register_service(7, Slow));
    let mut ch = f.connect_rpc_channel(0).unwrap();
    for i in 0..8 {
        ch.send(i, 7, b"z").unwrap();
    }
    node.request_shutdown();
    let mut out = Vec::new();
    eventually("every call answered", || {
        ch.poll(&mut out);
        out.len() == 8
    });
    assert!(out
        .iter()
        .any(|r| r.result == Err(RpcFailure::ShuttingDown)));
    assert!(matches!(f.connect_rpc(0), Err(FabricError::Refused { .. })));
}

#[test]
fn a_node_without_workers_refuses_channels_and_idle_workers_sleep() {
    let f = embedded(0);
    assert_eq!(f.caps().rpc_workers, 0);
    conformance::rpc_all(&f, 0);

    let f = embedded(1);
    let node = f.embedded_node(0).unwrap();
    let mut ch = f.connect_rpc_channel(0).unwrap();
    assert_eq!(ch.call(ECHO, b"wake"), Ok(b"wake".to_vec()));
    // Idle past its spinning window, the worker sleeps on its bell...
    let bell = || {
        // SAFETY (test): the bells lie inside the control mapping.
        unsafe {
            (*(node
                .control_mapping()
                .as_ptr()
                .add(dmkit_memnode::layout::WORKER_BELLS_OFFSET)
                as *const dmkit_memnode::layout::WorkerBell))
                .sleeping
                .load(Ordering::SeqCst)
        }
    };
    eventually("the worker sleeps", || bell() == 1);
    // ...and a request wakes it at once, not after its nap.
    let t0 = Instant::now();
    assert_eq!(ch.call(ECHO, b"again"), Ok(b"again".to_vec()));
    assert!(
        t0.elapsed() < dmkit_memnode::rpc::NAP / 2,
        "{:?}",
        t0.elapsed()
    );
    // A channel its client drops is reclaimed.
    assert_eq!(node.stats().rpc_channels, 1);
    drop(ch);
    eventually("a closed channel reclaimed", || {
        node.stats().rpc_channels == 0
    });
    // The node (and its workers, which hold it weakly) go with the last
    // reference.
    let weak: std::sync::Weak<MemNode> = std::sync::Arc::downgrade(&node);
    drop(node);
    drop(f);
    eventually("the node dropped", || weak.upgrade().is_none());
}

#[test]
fn control_plane_still_counts_sessions() {
    let s = Served::start(4 << 20);
    let f = s.client();
    let mut ch = f.connect_rpc_channel(0).unwrap();
    assert_eq!(ch.call(ECHO, b"x"), Ok(b"x".to_vec()));
    let st = f.node_stats(0).unwrap();
    assert_eq!((st.rpc_channels, st.rpc_workers), (1, 2));
}

/// A service whose calls are finished by the *other* worker's background
/// work ([`Service::poll`]) through the service's own queues, not the
/// node's messages: the worker that took the call must wake its sleeping
/// peer ([`Service::wake_peers`]), or the answer waits for the peer's
/// timed wake-up ([`dmkit_memnode::rpc::NAP`]).
/// Calls handed to a worker: their tokens and requests.
type Handed = std::sync::Mutex<Vec<(Deferred, Vec<u8>)>>;

#[derive(Default)]
struct Handoff {
    queues: [Handed; 2],
    pending: std::sync::atomic::AtomicU64,
}

impl Service for Handoff {
    type Worker = WorkerId;
    type Message = ();
    fn name(&self) -> &'static str {
        "handoff"
    }
    fn start_worker(&self, w: WorkerId, _: usize) -> WorkerId {
        w
    }
    fn handle(
        &self,
        cx: &mut WorkerCtx<'_, Self>,
        request: &[u8],
        _reply: &mut Vec<u8>,
    ) -> Result<(), ServiceError> {
        let t = cx.defer();
        let other = 1 - *cx.state();
        self.pending.fetch_add(1, Ordering::SeqCst);
        self.queues[other]
            .lock()
            .unwrap()
            .push((t, request.to_vec()));
        Ok(())
    }
    fn poll(&self, cx: &mut WorkerCtx<'_, Self>) -> bool {
        let me = *cx.state();
        let got = std::mem::take(&mut *self.queues[me].lock().unwrap());
        for (t, mut bytes) in got.iter().cloned() {
            bytes.push(me as u8);
            cx.complete(t, Ok(bytes));
            self.pending.fetch_sub(1, Ordering::SeqCst);
        }
        !got.is_empty()
    }
    fn wake_peers(&self, _: &WorkerId) -> bool {
        self.pending.load(Ordering::SeqCst) > 0
    }
}

#[test]
fn background_work_of_a_service_wakes_its_sleeping_peer() {
    let f = embedded(2);
    let node = f.embedded_node(0).unwrap();
    assert!(node.register_service(6, Handoff::default()));
    let mut ch = f.connect_rpc_channel(0).unwrap();
    let (mine, other) = (ch.worker() as u8, 1 - ch.worker() as u8);
    // The first call makes both workers' states (the peer's on its poll
    // only once it has served something: give it a channel of its own).
    let mut peer = f.connect_rpc_channel(0).unwrap();
    assert_eq!(peer.worker() as u8, other);
    assert_eq!(peer.call(6, b"p"), Ok(vec![b'p', mine]));
    let mut fast = 0;
    for round in 0..5u8 {
        // Both workers fall asleep (blocked for up to NAP).
        std::thread::sleep(dmkit_memnode::rpc::SPIN * 20 + Duration::from_millis(5));
        let t0 = Instant::now();
        assert_eq!(ch.call(6, &[round]), Ok(vec![round, other]));
        if t0.elapsed() < dmkit_memnode::rpc::NAP / 2 {
            fast += 1;
        }
    }
    assert!(fast >= 4, "{fast} of 5 calls answered well within a nap");
}

/// The latency model covers RPCs: with `rtt` set the channel still keeps
/// every promise of the conformance suite, a reply is not seen before a
/// round trip, and requests sent together share one round trip (the model
/// delays, it does not serialise).
#[test]
fn the_latency_model_delays_rpc_replies_by_a_round_trip() {
    let with = |rtt: Duration| {
        ShmFabric::embedded(
            ShmConfig {
                rtt: Some(rtt),
                rpc_slots: 8,
                ..Default::default()
            },
            &[NodeConfig {
                size: 4 << 20,
                rpc_workers: 2,
                ..Default::default()
            }],
        )
        .unwrap()
    };
    conformance::rpc_all(&with(Duration::from_micros(20)), 0);
    let rtt = Duration::from_millis(20);
    let f = with(rtt);
    let mut ch = f.connect_rpc_channel(0).unwrap();
    let t0 = Instant::now();
    assert_eq!(ch.call(ECHO, b"one"), Ok(b"one".to_vec()));
    assert!(t0.elapsed() >= rtt, "{:?}", t0.elapsed());
    let t0 = Instant::now();
    for i in 0..4u64 {
        ch.send(i, ECHO, &i.to_le_bytes()).unwrap();
    }
    assert_eq!(ch.pending(), 4);
    let mut out = Vec::new();
    assert_eq!(ch.poll(&mut out), 0, "no reply before the round trip");
    while out.len() < 4 {
        ch.poll(&mut out);
        assert!(t0.elapsed() < Duration::from_secs(20), "replies lost");
    }
    assert!(t0.elapsed() >= rtt);
    let ids: Vec<u64> = out.iter().map(|r| r.id).collect();
    assert_eq!(ids, [0, 1, 2, 3], "in request order");
    for r in &out {
        assert_eq!(r.result.as_deref(), Ok(&r.id.to_le_bytes()[..]));
    }
    assert_eq!(ch.pending(), 0);
}

/// Sleeps 150 ms per call, then echoes.
struct Sleepy;

impl Service for Sleepy {
    type Worker = ();
    type Message = ();
    fn name(&self) -> &'static str {
        "sleepy"
    }
    fn start_worker(&self, _: WorkerId, _: usize) {}
    fn handle(
        &self,
        _cx: &mut WorkerCtx<'_, Self>,
        request: &[u8],
        reply: &mut Vec<u8>,
    ) -> Result<(), ServiceError> {
        std::thread::sleep(Duration::from_millis(150));
        reply.extend_from_slice(request);
        Ok(())
    }
}

/// No caller waits for ever: requests unanswered for the channel's reply
/// timeout fail with `NoReply` (`conformance::rpc_no_reply`). A slow
/// service is no failure: four calls of 150 ms one after the other take
/// longer than the timeout, each within it. (Calls queued together are
/// another matter: a worker publishes the replies of up to 32 requests of
/// a channel together, so their first reply comes when the last is done;
/// see `ShmConfig::rpc_reply_timeout`.)
#[test]
fn a_reply_that_does_not_come_in_time_fails_every_pending_request() {
    let timeout = Duration::from_millis(500);
    let f = ShmFabric::embedded(
        ShmConfig {
            rpc_reply_timeout: timeout,
            ..Default::default()
        },
        &[NodeConfig {
            size: 4 << 20,
            rpc_workers: 1,
            ..Default::default()
        }],
    )
    .unwrap();
    let node = f.embedded_node(0).unwrap();
    assert!(node.register_service(7, Sleepy));
    let mut ch = f.connect_rpc_channel(0).unwrap();
    let t0 = Instant::now();
    for _ in 0..4 {
        assert_eq!(ch.call(7, b"slow"), Ok(b"slow".to_vec()));
    }
    assert!(
        t0.elapsed() >= timeout,
        "four slow calls outlast one timeout"
    );
    conformance::rpc_no_reply(&node, &f, &f, 0, timeout);
}
