//! File descriptors passed with `SCM_RIGHTS`, the way systemd's sd-varlink passes them.
//!
//! A sender puts the fds on the `sendmsg` that carries its message's first byte; parameters
//! name them by index from 0. A receiver ties fds to the message their chunk of bytes
//! begins: fds that arrive while part of an earlier message is still buffered are refused
//! (sd-varlink answers `-EPROTO`), because the kernel may merge an fd-less message and the
//! next one into one read, and then it is unclear whose fds they are. So a client must not
//! send an fd-carrying call while an earlier call awaits its reply.
//!
//! The receive buffer has room for [`SCM_MAX_FD`] fds, the most one `sendmsg` can carry,
//! so the kernel never truncates the control data: a truncated receive would install fds
//! that could not be found to close (nix's `cmsgs()` refuses to iterate then).

use crate::{Error, Result};
use nix::sys::socket::{recvmsg, sendmsg, ControlMessage, ControlMessageOwned, MsgFlags, UnixAddr};
use std::io::{IoSlice, IoSliceMut};
use std::os::fd::{AsRawFd, BorrowedFd, FromRawFd, OwnedFd, RawFd};

/// The most fds one `sendmsg` may carry on Linux (`SCM_MAX_FD`, unix(7)).
pub const SCM_MAX_FD: usize = 253;

/// What one `recvmsg` brought.
#[derive(Debug)]
pub struct Received {
    /// Bytes read into the buffer; 0 means the peer closed its end.
    pub len: usize,
    /// The fds that came with them, already owned (closed on drop) and close-on-exec.
    pub fds: Vec<OwnedFd>,
    /// The process that wrote them, when the socket passes credentials (`SO_PASSCRED`,
    /// inherited from a listener that has it: the kernel then stamps every write with its
    /// writer, and one read never spans two writers).
    pub sender_pid: Option<i32>,
}

/// Receive bytes and any fds from a stream socket, without blocking if the socket is
/// non-blocking.
///
/// # Errors
/// [`Error::Io`] (`recvmsg`), including `WouldBlock`; [`Error::Protocol`] (`fds`) if the
/// kernel truncated the control data (the connection must be closed then).
pub fn recv_with_fds(socket: BorrowedFd<'_>, buf: &mut [u8]) -> Result<Received> {
    let mut space = nix::cmsg_space!([RawFd; SCM_MAX_FD], nix::sys::socket::UnixCredentials);
    let mut iov = [IoSliceMut::new(buf)];
    let msg = recvmsg::<UnixAddr>(
        socket.as_raw_fd(),
        &mut iov,
        Some(&mut space),
        MsgFlags::MSG_CMSG_CLOEXEC | MsgFlags::MSG_DONTWAIT,
    )
    .map_err(|e| Error::Io {
        call: "recvmsg",
        source: e.into(),
    })?;
    let len = msg.bytes;
    let cmsgs = msg.cmsgs().map_err(|_| {
        Error::protocol(
            "fds",
            "the control data was truncated (too many fds at once)",
        )
    })?;
    let mut fds = Vec::new();
    let mut sender_pid = None;
    for c in cmsgs {
        match c {
            ControlMessageOwned::ScmRights(raw) => {
                for fd in raw {
                    // SAFETY: the kernel installed `fd` in this process for this message
                    // just now (SCM_RIGHTS), and nothing else has seen the number: wrapping
                    // it makes this the one owner, which closes it.
                    #[allow(unsafe_code)]
                    fds.push(unsafe { OwnedFd::from_raw_fd(fd) });
                }
            }
            ControlMessageOwned::ScmCredentials(cred) => sender_pid = Some(cred.pid()),
            _ => {}
        }
    }
    Ok(Received {
        len,
        fds,
        sender_pid,
    })
}

/// Send `bytes` with `fds` on the first byte (the rest, if the socket takes only part, is
/// the caller's to send plainly). Returns the bytes sent.
///
/// # Errors
/// [`Error::Io`] (`sendmsg`); [`Error::Protocol`] (`fds`) for more than [`SCM_MAX_FD`] fds.
pub fn send_with_fds(
    socket: BorrowedFd<'_>,
    bytes: &[u8],
    fds: &[BorrowedFd<'_>],
) -> Result<usize> {
    if fds.len() > SCM_MAX_FD {
        return Err(Error::protocol(
            "fds",
            format!("{} fds in one message, at most {SCM_MAX_FD}", fds.len()),
        ));
    }
    let raw: Vec<RawFd> = fds.iter().map(AsRawFd::as_raw_fd).collect();
    let cmsg = [ControlMessage::ScmRights(&raw)];
    let cmsgs: &[ControlMessage<'_>] = if raw.is_empty() { &[] } else { &cmsg };
    sendmsg::<UnixAddr>(
        socket.as_raw_fd(),
        &[IoSlice::new(bytes)],
        cmsgs,
        MsgFlags::MSG_NOSIGNAL,
        None,
    )
    .map_err(|e| Error::Io {
        call: "sendmsg",
        source: e.into(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::{Read, Write};
    use std::os::fd::AsFd;
    use std::os::unix::net::UnixStream;

    #[test]
    fn fds_arrive_with_the_bytes_they_were_sent_with() {
        let (a, b) = UnixStream::pair().unwrap();
        let (mut pr, pw) = std::os::unix::net::UnixStream::pair().unwrap();
        assert_eq!(
            send_with_fds(a.as_fd(), b"hello\0", &[pw.as_fd()]).unwrap(),
            6
        );
        drop(pw);
        let mut buf = [0u8; 64];
        let got = recv_with_fds(b.as_fd(), &mut buf).unwrap();
        assert_eq!(&buf[..got.len], b"hello\0");
        assert_eq!(got.fds.len(), 1);
        // The received fd is the same socket: writing to it reaches `pr`.
        let mut passed = UnixStream::from(got.fds.into_iter().next().unwrap());
        passed.write_all(b"x").unwrap();
        let mut one = [0u8; 1];
        pr.read_exact(&mut one).unwrap();
        assert_eq!(&one, b"x");
    }

    #[test]
    fn a_plain_send_brings_no_fds_and_a_closed_peer_reads_zero() {
        let (a, b) = UnixStream::pair().unwrap();
        send_with_fds(a.as_fd(), b"{}\0", &[]).unwrap();
        let mut buf = [0u8; 8];
        let got = recv_with_fds(b.as_fd(), &mut buf).unwrap();
        assert_eq!((got.len, got.fds.len()), (3, 0));
        drop(a);
        assert_eq!(recv_with_fds(b.as_fd(), &mut buf).unwrap().len, 0);
    }
}
