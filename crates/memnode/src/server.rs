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
//! [`crate::admission`], shared with the verbs backend's TCP server: one
//! event loop serves every connection until it logs in (one deadline for
//! the whole login, [`ServerConfig::login_deadline`]); at most
//! [`ServerConfig::max_connections`] are open at once, and the next one is
//! answered with
//! [`RpcError::TooManyConnections`](crate::RpcError::TooManyConnections)
//! (the client reports it) and closed; a logged-in session gets a thread
//! of its own (small stack).
//!
//! Malformed frames get
//! [`RpcError::BadFrame`](crate::RpcError::BadFrame); oversized frames, a
//! failed handshake or I/O errors close the connection. Nothing a client
//! sends can stop the node except an authenticated `Shutdown`.

use std::fs;
use std::io::{IoSlice, Write};
use std::os::fd::{AsFd, AsRawFd, RawFd};
use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use nix::sys::socket::{sendmsg, ControlMessage, MsgFlags};

use crate::admission::{self, Gate};
pub use crate::admission::{ServerConfig, DEFAULT_LOGIN_DEADLINE, DEFAULT_MAX_CONNECTIONS};

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
        cfg.validate().map_err(NodeError::Config)?;
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
        let gate = Arc::new(UnixGate {
            node: self.node.clone(),
            token: self.token,
        });
        let served = admission::serve_unix(self.listener, self.cfg, gate, &|| false);
        let _ = fs::remove_file(&self.path);
        served.map_err(|source| NodeError::Io {
            what: "serve the unix socket",
            source,
        })
    }
}

/// The Unix socket's door: a [`Hello`] with the token logs in; a session
/// gets the node's memfds and serves RPC frames.
struct UnixGate {
    node: Arc<MemNode>,
    token: [u8; TOKEN_LEN],
}

impl Gate for UnixGate {
    type Stream = UnixStream;
    fn node(&self) -> &MemNode {
        &self.node
    }
    fn login(&self, hello: &[u8]) -> bool {
        proto::decode::<Hello>(hello).is_ok_and(|h| {
            h.magic == PROTO_MAGIC && h.version == PROTO_VERSION && token_eq(&h.token, &self.token)
        })
    }
    fn too_many(&self, max: usize) -> Vec<u8> {
        proto::encode(&Response::Error(RpcError::TooManyConnections(max)))
    }
    fn denied(&self) -> Option<Vec<u8>> {
        None
    }
    fn serve(&self, stream: UnixStream, _hello: &[u8]) {
        serve_session(&self.node, stream);
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
        memory_file: node.memory_file().is_some(),
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
