//! File descriptors passed with `SCM_RIGHTS`, the way systemd's sd-varlink passes them.
//!
//! A sender puts the fds on the `sendmsg` that carries its message's first byte; parameters
//! name them by index from 0. A receiver ties fds to the message their chunk of bytes
//! begins: fds that arrive while part of an earlier message is still buffered are refused
//! (sd-varlink answers `-EPROTO`), because the kernel may merge an fd-less message and the
//! next one into one read, and then it is unclear whose fds they are. So a client must not
//! send an fd-carrying call while an earlier call awaits its reply.
//!
//! The receive buffer has room for [`SCM_MAX_FD`] fds, the most one `sendmsg` can carry, and
//! the credentials. The kernel still truncates the control data (`MSG_CTRUNC`) when the
//! receiver cannot take every fd (at its `RLIMIT_NOFILE`, or an LSM refuses one): it installs
//! those before the first it could not, and lists them. nix's `cmsgs()` refuses to iterate
//! then, so [`recv_with_fds`] reads that list itself, closes them and refuses the receive:
//! otherwise each such receive would leak fds, bringing the limit closer for good.

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
    let Ok(cmsgs) = msg.cmsgs() else {
        for fd in rights_in(&space) {
            // SAFETY: as below: the kernel installed `fd` for this message (its SCM_RIGHTS
            // list, which `rights_in` reads as the kernel wrote it), and nothing else has
            // seen the number; the OwnedFd closes it, once, here.
            #[allow(unsafe_code)]
            drop(unsafe { OwnedFd::from_raw_fd(fd) });
        }
        return Err(Error::protocol(
            "fds",
            "the control data was truncated (too many fds at once)",
        ));
    };
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

/// The fds of every `SCM_RIGHTS` message in `control`, control data as the kernel wrote it
/// (cmsg(3): `struct cmsghdr`s of a `size_t` length and two `int`s, each message starting
/// `CMSG_ALIGN`ed; the zeroed rest of the buffer ends the list). For a receive nix will not
/// iterate (`MSG_CTRUNC`), whose fds must still be closed.
fn rights_in(control: &[u8]) -> Vec<RawFd> {
    const W: usize = std::mem::size_of::<usize>();
    let align = |n: usize| n.div_ceil(W) * W;
    let header = align(W + 8);
    let int_at = |b: &[u8], at: usize| {
        let mut v = [0u8; 4];
        v.copy_from_slice(&b[at..at + 4]);
        i32::from_ne_bytes(v)
    };
    let mut fds = Vec::new();
    let mut off: usize = 0;
    while let Some(h) = off
        .checked_add(header)
        .and_then(|end| control.get(off..end))
    {
        let mut l = [0u8; W];
        l.copy_from_slice(&h[..W]);
        let cmsg_len = usize::from_ne_bytes(l);
        let data = (cmsg_len >= header)
            .then(|| off.checked_add(cmsg_len))
            .flatten()
            .and_then(|end| control.get(off + header..end));
        let Some(data) = data else {
            break;
        };
        if int_at(h, W) == nix::libc::SOL_SOCKET && int_at(h, W + 4) == nix::libc::SCM_RIGHTS {
            fds.extend(data.chunks_exact(4).map(|b| int_at(b, 0)));
        }
        off += align(cmsg_len);
    }
    fds
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

    /// `rights_in` reads cmsg(3)'s layout: credentials skipped, the rights' fds in order, the
    /// zeroed rest (or a length that overruns the buffer) ending the list.
    #[test]
    fn rights_are_read_from_control_data_as_the_kernel_lays_it_out() {
        const W: usize = std::mem::size_of::<usize>();
        let header = (W + 8).div_ceil(W) * W;
        let cmsg = |kind: i32, data: &[u8]| {
            let mut m = (header + data.len()).to_ne_bytes().to_vec();
            m.extend(nix::libc::SOL_SOCKET.to_ne_bytes());
            m.extend(kind.to_ne_bytes());
            m.resize(header, 0);
            m.extend(data);
            m.resize(m.len().div_ceil(W) * W, 0);
            m
        };
        let mut control = cmsg(nix::libc::SCM_CREDENTIALS, &[9; 12]);
        let fds: Vec<u8> = [5i32, 7, 11].iter().flat_map(|f| f.to_ne_bytes()).collect();
        control.extend(cmsg(nix::libc::SCM_RIGHTS, &fds));
        control.extend([0u8; 64]);
        assert_eq!(rights_in(&control), [5, 7, 11]);
        let mut overrun = cmsg(nix::libc::SCM_RIGHTS, &fds);
        overrun[..W].copy_from_slice(&4096usize.to_ne_bytes());
        assert_eq!(rights_in(&overrun), Vec::<RawFd>::new());
        assert_eq!(rights_in(&[]), Vec::<RawFd>::new());
    }

    /// The child of [`fds_installed_before_a_truncation_are_closed`], under a limit of 64
    /// fds; does nothing in a run of its own.
    #[test]
    fn truncation_child() {
        if std::env::var_os("REDN_FDS_TRUNCATION_CHILD").is_none() {
            return;
        }
        let (a, b) = UnixStream::pair().unwrap();
        let (_pr, pw) = UnixStream::pair().unwrap();
        // Fill every fd up to 60 (a dup takes the lowest free one): 61, 62 and 63 stay free.
        let mut fill = Vec::new();
        loop {
            let f = a.try_clone().unwrap();
            let n = f.as_raw_fd();
            fill.push(f);
            if n >= 60 {
                break;
            }
        }
        let open = |fd: i32| std::fs::metadata(format!("/proc/self/fd/{fd}")).is_ok();
        assert!(!open(61) && !open(62) && !open(63));
        let ten = [pw.as_fd(); 10];
        send_with_fds(a.as_fd(), b"x", &ten).unwrap();
        let mut buf = [0u8; 8];
        // Three fit: the kernel installs them, then sets MSG_CTRUNC for the other seven.
        let got = recv_with_fds(b.as_fd(), &mut buf);
        assert!(
            matches!(got, Err(Error::Protocol { .. })),
            "{:?}",
            got.map(|r| r.fds.len())
        );
        let leaked: Vec<i32> = [61, 62, 63].into_iter().filter(|&fd| open(fd)).collect();
        assert!(
            leaked.is_empty(),
            "fds {leaked:?} were installed and never closed"
        );
    }

    /// A receive the kernel truncates (the receiver ran out of fds part way through the
    /// message's) is refused, and the fds it did install are closed, not leaked.
    #[test]
    fn fds_installed_before_a_truncation_are_closed() {
        let Ok(exe) = std::env::current_exe() else {
            return;
        };
        let out = std::process::Command::new("prlimit")
            .arg("--nofile=64:64")
            .arg(exe)
            .args(["--exact", "fds::tests::truncation_child", "--nocapture"])
            .args(["--test-threads", "1"])
            .env("REDN_FDS_TRUNCATION_CHILD", "1")
            .output();
        let Ok(out) = out else {
            eprintln!("SKIPPED: prlimit not found (Debian package util-linux)");
            return;
        };
        assert!(
            out.status.success(),
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        assert!(String::from_utf8_lossy(&out.stdout).contains("1 passed"));
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
