//! Client side of the memory node's Unix-socket handshake: authenticate,
//! receive the memfds by `SCM_RIGHTS`, verify and map them.

use std::io::{IoSliceMut, Read};
use std::os::fd::{AsFd, AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::sync::Arc;

use dmkit_memnode::memory::{fd_len, is_shrink_sealed, Mapping};
use dmkit_memnode::proto::{self, Hello, Welcome, MAX_FRAME, PROTO_MAGIC, PROTO_VERSION};
use dmkit_memnode::rpc::ring::RingView;
use dmkit_memnode::server::read_token_file;
use dmkit_memnode::{Request, Response};
use nix::sys::socket::{recvmsg, ControlMessageOwned, MsgFlags};

use super::view::NodeView;
use crate::addr::NodeId;
use crate::error::FabricError;

/// Result of a successful handshake.
pub(crate) struct Connected {
    pub stream: UnixStream,
    pub welcome: Welcome,
    pub view: NodeView,
}

pub(crate) fn connect(socket: &Path, token_file: &Path) -> Result<Connected, FabricError> {
    let target = socket.display().to_string();
    let fail = |reason: String| FabricError::Connect {
        target: target.clone(),
        reason,
    };
    let token = read_token_file(token_file).map_err(|e| fail(e.to_string()))?;
    let mut stream = UnixStream::connect(socket).map_err(|e| fail(format!("connect: {e}")))?;
    let hello = Hello {
        magic: PROTO_MAGIC,
        version: PROTO_VERSION,
        token,
    };
    // A node over its connection cap answers with a refusal before it
    // reads anything and closes: the hello may then fail to send, but the
    // refusal still waits to be read, and says more.
    let sent = proto::write_frame(&mut stream, &proto::encode(&hello));

    // The welcome frame carries two descriptors on its first byte.
    let (payload, fds) = match (recv_frame_with_fds(&mut stream), sent) {
        (Ok(got), _) => got,
        (Err(_), Err(e)) => return Err(fail(format!("send hello: {e}"))),
        (Err(e), Ok(())) => return Err(fail(e)),
    };
    let welcome: Welcome = match proto::decode(&payload) {
        Ok(w) => w,
        Err(e) => {
            return Err(fail(match proto::decode::<Response>(&payload) {
                Ok(Response::Error(refusal)) => refusal.to_string(),
                _ => e.to_string(),
            }))
        }
    };
    let [data_fd, control_fd]: [OwnedFd; 2] = fds
        .try_into()
        .map_err(|v: Vec<OwnedFd>| fail(format!("expected 2 descriptors, got {}", v.len())))?;

    let l = welcome.layout;
    let l_file = welcome.memory_file;
    for (fd, need, what) in [
        (&data_fd, l.data_len(), "data"),
        (&control_fd, l.control_len, "control"),
    ] {
        let have = fd_len(fd.as_fd()).map_err(|e| fail(e.to_string()))?;
        if have < need {
            return Err(fail(format!(
                "{what} memfd is {have} B, layout needs {need} B"
            )));
        }
        // A file-backed node's data is its file, which cannot be sealed
        // (`dmkit_memnode::file`); the control memfd always is.
        let file = what == "data" && l_file;
        if !file && !is_shrink_sealed(fd.as_fd()) {
            return Err(fail(format!(
                "{what} memfd is not sealed against shrinking"
            )));
        }
    }
    let data = Mapping::map(data_fd.as_fd(), l.data_len() as usize, true)
        .map_err(|e| fail(e.to_string()))?;
    let control = Mapping::map(control_fd.as_fd(), l.control_len as usize, false)
        .map_err(|e| fail(e.to_string()))?;
    let view = NodeView::new(l, Arc::new(data), Arc::new(control)).map_err(fail)?;
    Ok(Connected {
        stream,
        welcome,
        view,
    })
}

/// Reads one frame whose first byte may carry descriptors (`SCM_RIGHTS`,
/// at most two).
fn recv_frame_with_fds(stream: &mut UnixStream) -> Result<(Vec<u8>, Vec<OwnedFd>), String> {
    let mut head = [0u8; 4];
    let mut cmsg = nix::cmsg_space!([RawFd; 2]);
    let (got, fds) = {
        let mut iov = [IoSliceMut::new(&mut head)];
        let msg = recvmsg::<()>(
            stream.as_raw_fd(),
            &mut iov,
            Some(&mut cmsg),
            MsgFlags::MSG_CMSG_CLOEXEC,
        )
        .map_err(|e| format!("recvmsg: {e}"))?;
        let mut fds: Vec<OwnedFd> = Vec::new();
        for c in msg.cmsgs().map_err(|e| format!("control message: {e}"))? {
            if let ControlMessageOwned::ScmRights(raw) = c {
                // SAFETY: the kernel just installed these descriptors in our table
                // for this message; nothing else owns them.
                fds.extend(
                    raw.into_iter()
                        .map(|fd| unsafe { OwnedFd::from_raw_fd(fd) }),
                );
            }
        }
        (msg.bytes, fds)
    };
    if got == 0 {
        return Err("the node closed the connection: wrong token or node shutting down".into());
    }
    stream
        .read_exact(&mut head[got..])
        .map_err(|e| format!("read frame: {e}"))?;
    let len = u32::from_le_bytes(head);
    if len > MAX_FRAME {
        return Err(format!("frame of {len} B is too large"));
    }
    let mut payload = vec![0u8; len as usize];
    stream
        .read_exact(&mut payload)
        .map_err(|e| format!("read frame: {e}"))?;
    Ok((payload, fds))
}

/// Asks the node at the other end of `stream` for an RPC channel and maps
/// the memfd that comes with the answer.
pub(crate) fn open_channel(
    stream: &mut UnixStream,
    node: NodeId,
    slots: u32,
    max_message: u32,
) -> Result<RingView, FabricError> {
    let lost = |_| FabricError::ConnectionLost(node);
    let req = Request::OpenRpcChannel { slots, max_message };
    proto::write_frame(stream, &proto::encode(&req)).map_err(lost)?;
    let (payload, fds) =
        recv_frame_with_fds(stream).map_err(|what| FabricError::Protocol { node, what })?;
    let protocol = |what: String| FabricError::Protocol { node, what };
    match proto::decode::<Response>(&payload).map_err(|e| protocol(e.to_string()))? {
        Response::RpcChannel(geo) => {
            let [fd]: [OwnedFd; 1] = fds.try_into().map_err(|v: Vec<OwnedFd>| {
                protocol(format!("expected 1 descriptor, got {}", v.len()))
            })?;
            let have = fd_len(fd.as_fd()).map_err(|e| protocol(e.to_string()))?;
            if have < geo.len() as u64 || !is_shrink_sealed(fd.as_fd()) {
                return Err(protocol(format!(
                    "channel memfd of {have} B (needs {} B, sealed against shrinking)",
                    geo.len()
                )));
            }
            let map =
                Mapping::map(fd.as_fd(), geo.len(), true).map_err(|e| protocol(e.to_string()))?;
            RingView::open(Arc::new(map), geo).map_err(protocol)
        }
        Response::Error(error) => Err(FabricError::Refused {
            node,
            error: error.into(),
        }),
        other => Err(protocol(format!("{other:?}"))),
    }
}
