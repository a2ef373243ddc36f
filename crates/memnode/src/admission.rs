//! Admission control, shared by the node's two control servers: the Unix
//! socket of the `shm` backend ([`crate::server`]) and the TCP control
//! channel of the `verbs` backend (`dmkit_verbs`' server).
//!
//! One thread serves the listening socket and every connection that has
//! not logged in yet, with an event loop ([`mio`]: epoll and nothing else,
//! no runtime, no executor — the control path needs readiness events for a
//! few thousand idle sockets, not an async ecosystem). A connection waiting
//! for its login costs a table entry and a 64-byte buffer, not a thread.
//! The whole pre-login exchange — one frame, a little-endian `u32` length
//! and at most [`LOGIN_MAX`] bytes of payload, both servers' framing — has
//! one deadline ([`ServerConfig::login_deadline`], counted from the accept,
//! however slowly the bytes come); a connection that misses it is closed.
//! At most [`ServerConfig::max_connections`] connections, logged in or
//! not, are open at once; the next one is answered with the server's
//! refusal ([`Gate::too_many`], which its client reports) and closed. A
//! logged-in session gets its own thread (small stack) for its requests:
//! the cap bounds those threads too.
//!
//! What differs between the servers — what a login frame must hold, what a
//! refusal says, how a session is served — is a [`Gate`].

use std::collections::{HashMap, VecDeque};
use std::io::{self, Read, Write};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use mio::{Events, Interest, Poll, Token};

use crate::node::MemNode;
use crate::proto;

/// Limits of a control server (see the module docs).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ServerConfig {
    /// Connections open at once, logged in or not; the next is refused.
    pub max_connections: usize,
    /// Time from accept to a complete login frame; a connection that
    /// misses it is closed.
    pub login_deadline: Duration,
}

/// Default [`ServerConfig::max_connections`].
pub const DEFAULT_MAX_CONNECTIONS: usize = 1024;
/// Default [`ServerConfig::login_deadline`].
pub const DEFAULT_LOGIN_DEADLINE: Duration = Duration::from_secs(5);

impl Default for ServerConfig {
    fn default() -> Self {
        Self {
            max_connections: DEFAULT_MAX_CONNECTIONS,
            login_deadline: DEFAULT_LOGIN_DEADLINE,
        }
    }
}

impl ServerConfig {
    /// Checks the limits: both positive.
    pub fn validate(&self) -> Result<(), String> {
        if self.max_connections == 0 || self.login_deadline.is_zero() {
            return Err("max connections and the login deadline must be positive".into());
        }
        Ok(())
    }
}

/// Largest login frame payload (the Unix socket's `Hello` is 44 bytes, the
/// TCP channel's 48).
pub const LOGIN_MAX: usize = 64;
/// Stack of a session's thread: it decodes small frames and calls the
/// node; no deep recursion.
pub const SESSION_STACK: usize = 256 * 1024;
/// Longest the event loop sleeps: how soon it sees a shutdown request.
const TICK: Duration = Duration::from_millis(50);
const LISTENER: Token = Token(0);

/// What a control server decides at its door.
pub trait Gate: Send + Sync + 'static {
    /// A logged-in connection, handed to [`Gate::serve`] (blocking).
    type Stream: Send + 'static;
    /// The node served (its counters and shutdown flag).
    fn node(&self) -> &MemNode;
    /// Whether the first frame's payload `hello` logs in.
    fn login(&self, hello: &[u8]) -> bool;
    /// The frame payload that tells a connection past the cap of `max` why
    /// it is closed.
    fn too_many(&self, max: usize) -> Vec<u8>;
    /// The frame payload answering a failed login (`None`: close it
    /// without a word).
    fn denied(&self) -> Option<Vec<u8>>;
    /// Serves a logged-in connection to its end, on a session thread.
    fn serve(&self, stream: Self::Stream, hello: &[u8]);
}

/// A listening socket the event loop accepts on.
pub trait Listener: mio::event::Source {
    /// A connection as the event loop reads it (non-blocking).
    type Conn: mio::event::Source + Read + Write;
    /// The same connection as a session serves it (blocking).
    type Std: Send + 'static;
    /// Accepts one connection.
    fn accept_conn(&self) -> io::Result<Self::Conn>;
    /// The blocking connection a session is served on.
    fn into_std(conn: Self::Conn) -> io::Result<Self::Std>;
}

impl Listener for mio::net::UnixListener {
    type Conn = mio::net::UnixStream;
    type Std = std::os::unix::net::UnixStream;
    fn accept_conn(&self) -> io::Result<Self::Conn> {
        self.accept().map(|(s, _)| s)
    }
    fn into_std(conn: Self::Conn) -> io::Result<Self::Std> {
        let s = Self::Std::from(conn);
        s.set_nonblocking(false)?;
        Ok(s)
    }
}

impl Listener for mio::net::TcpListener {
    type Conn = mio::net::TcpStream;
    type Std = std::net::TcpStream;
    fn accept_conn(&self) -> io::Result<Self::Conn> {
        self.accept().map(|(s, _)| s)
    }
    fn into_std(conn: Self::Conn) -> io::Result<Self::Std> {
        let s = Self::Std::from(conn);
        s.set_nonblocking(false)?;
        let _ = s.set_nodelay(true);
        Ok(s)
    }
}

/// Serves `gate` on TCP listener `listener` until the node shuts down or
/// `stop` says so (see the module docs).
pub fn serve_tcp<G: Gate<Stream = std::net::TcpStream>>(
    listener: std::net::TcpListener,
    cfg: ServerConfig,
    gate: Arc<G>,
    stop: &dyn Fn() -> bool,
) -> io::Result<()> {
    listener.set_nonblocking(true)?;
    serve(mio::net::TcpListener::from_std(listener), cfg, gate, stop)
}

/// Serves `gate` on Unix listener `listener` until the node shuts down or
/// `stop` says so (see the module docs).
pub fn serve_unix<G: Gate<Stream = std::os::unix::net::UnixStream>>(
    listener: std::os::unix::net::UnixListener,
    cfg: ServerConfig,
    gate: Arc<G>,
    stop: &dyn Fn() -> bool,
) -> io::Result<()> {
    listener.set_nonblocking(true)?;
    serve(mio::net::UnixListener::from_std(listener), cfg, gate, stop)
}

/// The event loop proper.
pub fn serve<L: Listener, G: Gate<Stream = L::Std>>(
    mut listener: L,
    cfg: ServerConfig,
    gate: Arc<G>,
    stop: &dyn Fn() -> bool,
) -> io::Result<()> {
    assert!(
        cfg.validate().is_ok(),
        "limits checked by the server: {cfg:?}"
    );
    let poll = Poll::new()?;
    poll.registry()
        .register(&mut listener, LISTENER, Interest::READABLE)?;
    let mut lp = Logins::<L, G> {
        gate,
        cfg,
        poll,
        pending: HashMap::new(),
        deadlines: VecDeque::new(),
        next: 1,
        sessions: Arc::new(AtomicUsize::new(0)),
    };
    let mut events = Events::with_capacity(256);
    while !stop() && !lp.gate.node().is_shutting_down() {
        let now = Instant::now();
        let wait = lp
            .deadlines
            .front()
            .map_or(TICK, |&(d, _)| d.saturating_duration_since(now).min(TICK));
        match lp.poll.poll(&mut events, Some(wait)) {
            Ok(()) => {}
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(e),
        }
        for ev in events.iter() {
            if ev.token() == LISTENER {
                lp.accept_all(&listener);
            } else {
                lp.read_login(ev.token().0);
            }
        }
        lp.expire(Instant::now());
    }
    Ok(())
}

/// Reads (and drops) what a refused connection already sent, without
/// blocking: TCP answers a close with unread bytes by a reset, which may
/// discard the refusal before its client reads it.
fn drain(stream: &mut impl Read) {
    let mut sink = [0u8; 256];
    for _ in 0..16 {
        match stream.read(&mut sink) {
            Ok(n) if n > 0 => {}
            _ => return,
        }
    }
}

/// A connection that has not logged in yet.
struct Pending<C> {
    stream: C,
    buf: [u8; 4 + LOGIN_MAX],
    got: usize,
}

/// The login event loop's state.
struct Logins<L: Listener, G> {
    gate: Arc<G>,
    cfg: ServerConfig,
    poll: Poll,
    pending: HashMap<usize, Pending<L::Conn>>,
    /// Login deadlines in accept order (all the same length, so sorted).
    deadlines: VecDeque<(Instant, usize)>,
    next: usize,
    /// Logged-in sessions still running.
    sessions: Arc<AtomicUsize>,
}

impl<L: Listener, G: Gate<Stream = L::Std>> Logins<L, G> {
    fn open(&self) -> usize {
        self.pending.len() + self.sessions.load(Ordering::Acquire)
    }

    fn accept_all(&mut self, listener: &L) {
        loop {
            match listener.accept_conn() {
                Ok(mut stream) => {
                    if self.open() >= self.cfg.max_connections {
                        self.gate.node().note_refused_connection();
                        let why = self.gate.too_many(self.cfg.max_connections);
                        // As far as the socket buffer takes it without
                        // blocking; then closed.
                        let _ = proto::write_frame(&mut stream, &why);
                        drain(&mut stream);
                        continue;
                    }
                    let t = self.next;
                    self.next += 1;
                    if self
                        .poll
                        .registry()
                        .register(&mut stream, Token(t), Interest::READABLE)
                        .is_err()
                    {
                        self.gate.node().note_refused_connection();
                        continue;
                    }
                    self.pending.insert(
                        t,
                        Pending {
                            stream,
                            buf: [0; 4 + LOGIN_MAX],
                            got: 0,
                        },
                    );
                    self.deadlines
                        .push_back((Instant::now() + self.cfg.login_deadline, t));
                    // Bytes may have arrived before the registration.
                    self.read_login(t);
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                // Out of descriptors (EMFILE) and the like: the
                // connection waits in the backlog; the next tick retries.
                Err(_) => return,
            }
        }
    }

    /// Reads what a pending connection sent; logs it in once its frame is
    /// complete, drops it on end of stream, error or an oversized frame.
    fn read_login(&mut self, t: usize) {
        let Some(p) = self.pending.get_mut(&t) else {
            return;
        };
        let done = loop {
            let want = if p.got < 4 {
                4
            } else {
                let len = u32::from_le_bytes(p.buf[..4].try_into().expect("4 bytes")) as usize;
                if len > LOGIN_MAX {
                    break false;
                }
                4 + len
            };
            if p.got == want {
                break true;
            }
            match p.stream.read(&mut p.buf[p.got..want]) {
                Ok(0) => break false,
                Ok(n) => p.got += n,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(_) => break false,
            }
        };
        let mut p = self.pending.remove(&t).expect("looked up above");
        let _ = self.poll.registry().deregister(&mut p.stream);
        let hello = &p.buf[4..p.got.max(4)];
        if !(done && self.gate.login(hello)) {
            self.gate.node().note_auth_failure();
            if let Some(why) = self.gate.denied() {
                let _ = proto::write_frame(&mut p.stream, &why);
                drain(&mut p.stream);
            }
            return;
        }
        let hello = hello.to_vec();
        match L::into_std(p.stream) {
            Ok(s) => self.start_session(s, hello),
            Err(_) => self.gate.node().note_refused_connection(),
        }
    }

    /// Closes the pending connections whose login deadline has passed.
    fn expire(&mut self, now: Instant) {
        while let Some(&(d, t)) = self.deadlines.front() {
            if d > now {
                break;
            }
            self.deadlines.pop_front();
            if let Some(mut p) = self.pending.remove(&t) {
                let _ = self.poll.registry().deregister(&mut p.stream);
                self.gate.node().note_auth_failure();
            }
        }
    }

    fn start_session(&self, stream: L::Std, hello: Vec<u8>) {
        let gate = self.gate.clone();
        let sessions = self.sessions.clone();
        sessions.fetch_add(1, Ordering::AcqRel);
        let spawned = std::thread::Builder::new()
            .name("dmkit-memnode-session".into())
            .stack_size(SESSION_STACK)
            .spawn(move || {
                // Counted out however the session ends (a panic included).
                struct Out(Arc<AtomicUsize>);
                impl Drop for Out {
                    fn drop(&mut self) {
                        self.0.fetch_sub(1, Ordering::AcqRel);
                    }
                }
                let _out = Out(sessions);
                gate.serve(stream, &hello);
            });
        // No thread to be had: refuse this client, not the node (the
        // stream was dropped with the failed closure).
        if spawned.is_err() {
            self.sessions.fetch_sub(1, Ordering::AcqRel);
            self.gate.node().note_refused_connection();
        }
    }
}
