//! The memory node's Unix-socket server (the `shm` backend's control path).
//!
//! Handshake: the client sends [`Hello`] with the shared secret read from the
//! token file (mode 0600, readable only by its owner). On a match the node
//! opens a session and answers [`Welcome`] with two descriptors attached as
//! `SCM_RIGHTS`: the data memfd (read-write) and a read-only reopen of the
//! control memfd. After that the connection carries RPC frames only; the data
//! path never touches this socket.
//!
//! When the connection ends, cleanly or because the client died (the kernel
//! closes its socket), the session ends: its session chunks are freed and
//! its holds on chunk groups dropped ([`crate::node`]'s ownership rule).
//!
//! # Admission control
//!
//! One thread serves the listening socket and every connection that has
//! not logged in yet, with an event loop ([`mio`]: epoll and nothing else,
//! no runtime, no executor — the node's control path needs readiness
//! events for a few thousand idle sockets, not an async ecosystem). A
//! connection waiting for its login costs the node a table entry and a
//! 64-byte buffer, not a thread. The whole pre-login exchange has one
//! deadline ([`ServerConfig::login_deadline`], counted from the accept,
//! however slowly the bytes come); a connection that misses it is closed.
//! At most [`ServerConfig::max_connections`] connections, logged in or
//! not, are open at once; the next one is answered with
//! [`RpcError::TooManyConnections`](crate::RpcError::TooManyConnections)
//! (the client reports it) and closed. A logged-in session gets its own
//! thread (small stack) for its RPC loop: the cap bounds those threads too.
//!
//! Malformed frames get
//! [`RpcError::BadFrame`](crate::RpcError::BadFrame); oversized frames, a
//! failed handshake or I/O errors close the connection. Nothing a client
//! sends can stop the node except an authenticated `Shutdown`.

use std::collections::{HashMap, VecDeque};
use std::fs;
use std::io::{self, IoSlice, Read, Write};
use std::os::fd::{AsFd, AsRawFd, RawFd};
use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use mio::{Events, Interest, Poll, Token};
use nix::sys::socket::{sendmsg, ControlMessage, MsgFlags};

use crate::error::{NodeError, RpcError};
use crate::memory::reopen_read_only;
use crate::node::{fill_random, MemNode};
use crate::proto::{
    self, Hello, Request, Response, Welcome, PROTO_MAGIC, PROTO_VERSION, TOKEN_LEN,
};

/// Default token file next to a socket path: `PATH.token`.
pub fn default_token_path(socket: &Path) -> PathBuf {
    let mut p = socket.as_os_str().to_owned();
    p.push(".token");
    PathBuf::from(p)
}

/// Creates (or replaces) a token file with a fresh random secret, mode 0600.
pub fn create_token_file(path: &Path) -> Result<[u8; TOKEN_LEN], NodeError> {
    let mut token = [0u8; TOKEN_LEN];
    fill_random(&mut token);
    let _ = fs::remove_file(path);
    let mut f = fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(path)
        .map_err(|e| NodeError::Io {
            what: "create token file",
            source: e,
        })?;
    f.write_all(hex(&token).as_bytes())
        .and_then(|_| f.write_all(b"\n"))
        .map_err(|e| NodeError::Io {
            what: "write token file",
            source: e,
        })?;
    Ok(token)
}

/// Reads a token file, refusing one that others can read or that another
/// user owns.
pub fn read_token_file(path: &Path) -> Result<[u8; TOKEN_LEN], NodeError> {
    let io_err = |what| move |e| NodeError::Io { what, source: e };
    let meta = fs::metadata(path).map_err(|e| {
        NodeError::Config(format!(
            "token file {}: {e} (a memory node writes it when it starts: is it running, \
             and is this its socket?)",
            path.display()
        ))
    })?;
    if meta.mode() & 0o077 != 0 {
        return Err(NodeError::Config(format!(
            "token file {} has mode {:o}: it must be readable by its owner only (chmod 600)",
            path.display(),
            meta.mode() & 0o777
        )));
    }
    if meta.uid() != nix::unistd::getuid().as_raw() {
        return Err(NodeError::Config(format!(
            "token file {} belongs to uid {}, not to this user",
            path.display(),
            meta.uid()
        )));
    }
    let text = fs::read_to_string(path).map_err(io_err("read token file"))?;
    unhex(text.trim()).ok_or_else(|| {
        NodeError::Config(format!(
            "token file {} does not hold {} hex-encoded bytes",
            path.display(),
            TOKEN_LEN
        ))
    })
}

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

fn unhex(s: &str) -> Option<[u8; TOKEN_LEN]> {
    if s.len() != TOKEN_LEN * 2 || !s.is_ascii() {
        return None;
    }
    let mut out = [0u8; TOKEN_LEN];
    for (i, o) in out.iter_mut().enumerate() {
        *o = u8::from_str_radix(&s[2 * i..2 * i + 2], 16).ok()?;
    }
    Some(out)
}

/// Compares two tokens in constant time (no early exit on the first differing
/// byte).
pub fn token_eq(a: &[u8; TOKEN_LEN], b: &[u8; TOKEN_LEN]) -> bool {
    // Constant time: no early exit on the first differing byte.
    a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

/// Limits of a [`Server`] (see the module's "Admission control").
#[derive(Debug, Clone, Copy)]
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

/// Largest login frame payload: a [`Hello`] is 44 bytes.
const LOGIN_MAX: usize = 64;
/// Stack of a session's RPC thread: it decodes small frames and calls the
/// node; no deep recursion.
const SESSION_STACK: usize = 256 * 1024;
/// Longest the event loop sleeps: how soon it sees a shutdown request.
const TICK: Duration = Duration::from_millis(50);
const LISTENER: Token = Token(0);

/// A bound memory node server.
pub struct Server {
    node: Arc<MemNode>,
    listener: UnixListener,
    token: [u8; TOKEN_LEN],
    path: PathBuf,
    cfg: ServerConfig,
}

impl Server {
    /// Binds `socket` and writes a fresh secret to `token_file`. A stale socket
    /// file is replaced; a live one (a node already answering) is an error.
    /// The secret also authorises admin requests ([`crate::proto::AdminOp`]).
    pub fn bind(node: Arc<MemNode>, socket: &Path, token_file: &Path) -> Result<Self, NodeError> {
        if socket.exists() {
            if UnixStream::connect(socket).is_ok() {
                return Err(NodeError::Config(format!(
                    "{} is already served by a running memory node",
                    socket.display()
                )));
            }
            let _ = fs::remove_file(socket);
        }
        let listener = UnixListener::bind(socket).map_err(|e| NodeError::Io {
            what: "bind unix socket",
            source: e,
        })?;
        let token = create_token_file(token_file)?;
        node.set_admin_token(token);
        Ok(Self {
            node,
            listener,
            token,
            path: socket.to_owned(),
            cfg: ServerConfig::default(),
        })
    }

    /// Sets the server's limits.
    pub fn with_config(mut self, cfg: ServerConfig) -> Result<Self, NodeError> {
        if cfg.max_connections == 0 || cfg.login_deadline.is_zero() {
            return Err(NodeError::Config(
                "max connections and the login deadline must be positive".into(),
            ));
        }
        self.cfg = cfg;
        Ok(self)
    }

    /// The socket path.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Serves on a thread of this process (a node embedded in a program that
    /// also lets other processes connect, and the multi-process tests). The
    /// returned handle shuts the node down and joins the thread when dropped.
    pub fn spawn(self) -> Result<Running, NodeError> {
        let node = self.node.clone();
        let path = self.path.clone();
        let thread = std::thread::Builder::new()
            .name("dmkit-memnode-server".into())
            .spawn(move || self.serve())
            .map_err(|e| NodeError::Io {
                what: "spawn server thread",
                source: e,
            })?;
        Ok(Running {
            node,
            path,
            thread: Some(thread),
        })
    }

    /// Accepts connections until the node shuts down (an authenticated
    /// `Shutdown`, a signal, [`Running::stop`]). Logins are served by this
    /// thread's event loop; each session then gets a thread of its own.
    pub fn serve(self) -> Result<(), NodeError> {
        let io = |what| move |source| NodeError::Io { what, source };
        self.listener
            .set_nonblocking(true)
            .map_err(io("set listener non-blocking"))?;
        let std_listener = self.listener.try_clone().map_err(io("clone listener"))?;
        let mut listener = mio::net::UnixListener::from_std(std_listener);
        let poll = Poll::new().map_err(io("create event loop"))?;
        poll.registry()
            .register(&mut listener, LISTENER, Interest::READABLE)
            .map_err(io("register listener"))?;
        let mut lp = Logins {
            node: self.node.clone(),
            token: self.token,
            cfg: self.cfg,
            poll,
            pending: HashMap::new(),
            deadlines: VecDeque::new(),
            next: 1,
            sessions: Arc::new(AtomicUsize::new(0)),
        };
        let mut events = Events::with_capacity(256);
        while !self.node.is_shutting_down() {
            let now = Instant::now();
            let wait = lp
                .deadlines
                .front()
                .map_or(TICK, |&(d, _)| d.saturating_duration_since(now).min(TICK));
            match lp.poll.poll(&mut events, Some(wait)) {
                Ok(()) => {}
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) => return Err(io("wait for events")(e)),
            }
            for ev in events.iter() {
                if ev.token() == LISTENER {
                    lp.accept_all(&mut listener);
                } else {
                    lp.read_login(ev.token().0);
                }
            }
            lp.expire(Instant::now());
        }
        let _ = fs::remove_file(&self.path);
        Ok(())
    }
}

/// A connection that has not logged in yet.
struct Pending {
    stream: mio::net::UnixStream,
    buf: [u8; 4 + LOGIN_MAX],
    got: usize,
}

/// The login event loop's state.
struct Logins {
    node: Arc<MemNode>,
    token: [u8; TOKEN_LEN],
    cfg: ServerConfig,
    poll: Poll,
    pending: HashMap<usize, Pending>,
    /// Login deadlines in accept order (all the same length, so sorted).
    deadlines: VecDeque<(Instant, usize)>,
    next: usize,
    /// Logged-in sessions still running.
    sessions: Arc<AtomicUsize>,
}

impl Logins {
    fn open(&self) -> usize {
        self.pending.len() + self.sessions.load(Ordering::Acquire)
    }

    fn accept_all(&mut self, listener: &mut mio::net::UnixListener) {
        loop {
            match listener.accept() {
                Ok((mut stream, _)) => {
                    if self.open() >= self.cfg.max_connections {
                        self.refuse(&mut stream);
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
                        self.node.note_refused_connection();
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

    /// Tells a connection over the cap why it is closed, as far as its
    /// socket buffer takes it without blocking, and closes it.
    fn refuse(&self, stream: &mut mio::net::UnixStream) {
        self.node.note_refused_connection();
        let resp = Response::Error(RpcError::TooManyConnections(self.cfg.max_connections));
        let _ = proto::write_frame(stream, &proto::encode(&resp));
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
                    break Err(());
                }
                4 + len
            };
            if p.got == want {
                break Ok(());
            }
            match p.stream.read(&mut p.buf[p.got..want]) {
                Ok(0) => break Err(()),
                Ok(n) => p.got += n,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(_) => break Err(()),
            }
        };
        let mut p = self.pending.remove(&t).expect("looked up above");
        let _ = self.poll.registry().deregister(&mut p.stream);
        let hello = done
            .ok()
            .and_then(|()| proto::decode::<Hello>(&p.buf[4..p.got]).ok());
        let ok = hello.is_some_and(|h| {
            h.magic == PROTO_MAGIC && h.version == PROTO_VERSION && token_eq(&h.token, &self.token)
        });
        if !ok {
            self.node.note_auth_failure();
            return;
        }
        self.start_session(p.stream.into());
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
                self.node.note_auth_failure();
            }
        }
    }

    fn start_session(&self, stream: UnixStream) {
        if stream.set_nonblocking(false).is_err() {
            return;
        }
        let node = self.node.clone();
        let sessions = self.sessions.clone();
        sessions.fetch_add(1, Ordering::AcqRel);
        let spawned = std::thread::Builder::new()
            .name("dmkit-memnode-session".into())
            .stack_size(SESSION_STACK)
            .spawn(move || {
                serve_session(&node, stream);
                sessions.fetch_sub(1, Ordering::AcqRel);
            });
        // No thread to be had: refuse this client, not the node (the
        // stream was dropped with the failed closure).
        if spawned.is_err() {
            self.sessions.fetch_sub(1, Ordering::AcqRel);
            self.node.note_refused_connection();
        }
    }
}

/// Serves a logged-in connection to its end. Never panics on client input.
fn serve_session(node: &Arc<MemNode>, mut stream: UnixStream) {
    let session = node.open_session();
    if send_welcome(node, &stream, session).is_ok() {
        rpc_loop(node, &mut stream, session);
    }
    node.close_session(session);
}

/// A server running on a thread of this process ([`Server::spawn`]).
pub struct Running {
    node: Arc<MemNode>,
    path: PathBuf,
    thread: Option<std::thread::JoinHandle<Result<(), NodeError>>>,
}

impl Running {
    /// The served node.
    pub fn node(&self) -> &Arc<MemNode> {
        &self.node
    }

    /// The socket path.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Asks the node to shut down and waits for the accept loop to end.
    pub fn stop(mut self) -> Result<(), NodeError> {
        self.stop_inner()
    }

    /// Waits for the accept loop to end (after a client's `Shutdown`).
    pub fn join(mut self) -> Result<(), NodeError> {
        match self.thread.take() {
            Some(t) => t
                .join()
                .unwrap_or_else(|_| Err(NodeError::Protocol("server thread panicked".into()))),
            None => Ok(()),
        }
    }

    fn stop_inner(&mut self) -> Result<(), NodeError> {
        self.node.request_shutdown();
        match self.thread.take() {
            Some(t) => t
                .join()
                .unwrap_or_else(|_| Err(NodeError::Protocol("server thread panicked".into()))),
            None => Ok(()),
        }
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        let _ = self.stop_inner();
    }
}

fn send_welcome(node: &MemNode, stream: &UnixStream, session: u64) -> Result<(), NodeError> {
    let control_ro = reopen_read_only(node.control_fd())?;
    let welcome = Welcome {
        session,
        layout: node.layout(),
        heap: node.heap_region(),
        rpc_workers: node.rpc_workers() as u32,
    };
    send_with_fds(
        stream,
        &proto::encode(&welcome),
        &[node.data_fd().as_raw_fd(), control_ro.as_fd().as_raw_fd()],
    )
}

/// Sends one frame with `fds` attached to its first byte (`SCM_RIGHTS`).
fn send_with_fds(stream: &UnixStream, payload: &[u8], fds: &[RawFd]) -> Result<(), NodeError> {
    let mut frame = (payload.len() as u32).to_le_bytes().to_vec();
    frame.extend_from_slice(payload);
    let cmsg = [ControlMessage::ScmRights(fds)];
    let mut sent = sendmsg::<()>(
        stream.as_raw_fd(),
        &[IoSlice::new(&frame)],
        &cmsg,
        MsgFlags::empty(),
        None,
    )
    .map_err(|e| NodeError::Os {
        what: "sendmsg(SCM_RIGHTS)",
        source: e,
    })?;
    // The descriptors travel with the first byte; finish a short send plainly.
    let mut w = stream;
    while sent < frame.len() {
        let n = w.write(&frame[sent..]).map_err(|e| NodeError::Io {
            what: "send frame",
            source: e,
        })?;
        sent += n;
    }
    Ok(())
}

fn rpc_loop(node: &Arc<MemNode>, stream: &mut UnixStream, session: u64) {
    loop {
        let payload = match proto::read_frame(stream) {
            Ok(Some(p)) => p,
            Ok(None) => return,
            Err(_) => {
                node.note_bad_frame();
                return;
            }
        };
        let resp = match proto::decode::<Request>(&payload) {
            // A channel's memfd goes with its answer.
            Ok(Request::OpenRpcChannel { slots, max_message }) => {
                match node.open_rpc_channel(session, slots, max_message) {
                    Ok(grant) => {
                        let resp = proto::encode(&Response::RpcChannel(grant.geometry));
                        if send_with_fds(stream, &resp, &[grant.fd.as_raw_fd()]).is_err() {
                            return;
                        }
                        continue;
                    }
                    Err(e) => Response::Error(e),
                }
            }
            Ok(req) => node.handle(session, req),
            Err(e) => {
                node.note_bad_frame();
                Response::Error(e)
            }
        };
        let shutdown = matches!(resp, Response::ShuttingDown);
        if proto::write_frame(stream, &proto::encode(&resp)).is_err() || shutdown {
            return;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn token_files_are_private_and_checked() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("t.token");
        let t = create_token_file(&p).unwrap();
        assert_eq!(read_token_file(&p).unwrap(), t);
        use std::os::unix::fs::PermissionsExt;
        fs::set_permissions(&p, fs::Permissions::from_mode(0o644)).unwrap();
        assert!(matches!(read_token_file(&p), Err(NodeError::Config(_))));
        fs::set_permissions(&p, fs::Permissions::from_mode(0o600)).unwrap();
        fs::write(&p, "nothex").unwrap();
        assert!(matches!(read_token_file(&p), Err(NodeError::Config(_))));
        assert!(token_eq(&t, &t));
        let mut u = t;
        u[31] ^= 1;
        assert!(!token_eq(&t, &u));
    }
}
