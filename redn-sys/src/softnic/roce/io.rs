//! Datagram I/O for the RoCEv2 endpoint: a UDP socket that sends and receives in batches
//! (`sendmmsg` / `recvmmsg`, one system call for many packets), and a wrapper that loses,
//! duplicates and reorders datagrams on purpose, for tests.

use std::io;
use std::net::{Ipv4Addr, SocketAddrV4, UdpSocket};
use std::os::fd::AsRawFd;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use super::packet::{MAX_MTU, MAX_OVERHEAD};

mod peers;
use peers::PeerTable;
pub use peers::{
    PeerBudget, PeerLease, DIRECT_PEERS, MAIN_EVERY, MAX_PEER_SOCKETS, MAX_PEER_SOCKETS_PER_IP,
};

/// Datagrams one system call moves at most.
pub const BATCH: usize = 64;
/// The batch a receive asks for after one that found a single datagram (see
/// [`RecvBatch::want`]'s growth).
const SMALL_BATCH: usize = 8;
/// [`BATCH`] as the system call takes it.
const BATCH_U32: u32 = 64;
const _: () = assert!(BATCH_U32 as usize == BATCH);
/// [`BATCH`] as `epoll_wait` takes it.
const BATCH_I32: i32 = 64;
const _: () = assert!(BATCH_I32 as usize == BATCH);
/// Bytes a receive buffer holds: the largest packet plus room to notice one larger.
const RECV_BUF: usize = MAX_MTU + MAX_OVERHEAD + 64;

/// Received datagrams: buffers, lengths and senders.
#[derive(Debug)]
pub struct RecvBatch {
    bufs: Vec<Box<[u8]>>,
    lens: Vec<usize>,
    from: Vec<SocketAddrV4>,
    /// Datagrams the next receive asks for (1..=BATCH): one after a receive that found
    /// none (a poller's common case: one plain `recvfrom`, no batch headers to build), eight
    /// times more after one that filled what it asked for.
    want: usize,
}

impl Default for RecvBatch {
    fn default() -> Self {
        RecvBatch {
            bufs: (0..BATCH)
                .map(|_| vec![0u8; RECV_BUF].into_boxed_slice())
                .collect(),
            lens: vec![0; BATCH],
            from: vec![SocketAddrV4::new(Ipv4Addr::UNSPECIFIED, 0); BATCH],
            want: 1,
        }
    }
}

impl RecvBatch {
    /// Datagram `i` of the last receive and its sender. A datagram longer than the buffer
    /// is cut to it (and then fails its length or ICRC check).
    #[must_use]
    pub fn get(&self, i: usize) -> (&[u8], SocketAddrV4) {
        (&self.bufs[i][..self.lens[i].min(RECV_BUF)], self.from[i])
    }

    /// How many datagrams the next receive asks for at most.
    #[must_use]
    pub fn want(&self) -> usize {
        self.want
    }

    /// After a receive that asked for `self.want` and got `n`: what the next asks for.
    fn adapt(&mut self, n: usize) {
        self.want = match n {
            0 => 1,
            n if n >= self.want => (self.want * SMALL_BATCH).min(BATCH),
            _ => self.want,
        };
    }

    /// Put a datagram in slot `i` (for wrappers and tests that make their own).
    pub fn set(&mut self, i: usize, data: &[u8], from: SocketAddrV4) {
        let n = data.len().min(RECV_BUF);
        self.bufs[i][..n].copy_from_slice(&data[..n]);
        self.lens[i] = n;
        self.from[i] = from;
    }
}

/// How an endpoint moves datagrams.
pub trait DatagramIo: Send + Sync {
    /// Send every datagram to its address (blocking while the socket's buffer is full).
    fn send(&self, batch: &[(SocketAddrV4, &[u8])]) -> io::Result<()>;
    /// Receive up to [`RecvBatch::want`] datagrams (at most [`BATCH`]); wait up to `wait`
    /// for the first (`None`: do not wait). Returns how many arrived.
    fn recv(&self, batch: &mut RecvBatch, wait: Option<Duration>) -> io::Result<usize>;
    /// The address datagrams are sent from and received at.
    fn local_addr(&self) -> SocketAddrV4;
    /// Datagrams from `remote` (a peer a QP is now connected to) queue apart from everyone
    /// else's for as long as the lease lives, if this I/O can do that (see
    /// `roce/io/peers.rs`); by default they share the one queue.
    fn peer_lease(&self, remote: SocketAddrV4) -> PeerLease {
        PeerLease::none(remote)
    }
    /// Datagrams thrown away unread since the last call: those still queued on a peer's
    /// socket when its last lease ended (for QPs that are gone). None by default.
    fn take_discarded(&self) -> u64 {
        0
    }
}

/// A UDP socket with batched system calls.
#[derive(Debug)]
pub struct UdpIo {
    socket: UdpSocket,
    local: SocketAddrV4,
    /// The connected peers' own sockets, polled beside `socket`.
    peers: Arc<PeerTable>,
}

fn setsockopt_int(fd: i32, level: i32, name: i32, value: i32) -> io::Result<()> {
    // SAFETY: `value` is a live i32 and the length passed is its size; the kernel copies it.
    let r = unsafe {
        libc::setsockopt(
            fd,
            level,
            name,
            std::ptr::from_ref(&value).cast(),
            // size_of::<i32>() is 4.
            4,
        )
    };
    if r == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

/// The size of a `sockaddr_in`, as the socket calls take it.
fn sockaddr_len() -> libc::socklen_t {
    libc::socklen_t::try_from(std::mem::size_of::<libc::sockaddr_in>()).unwrap_or(16)
}

/// The address a receive call wrote.
fn addr_from(a: &libc::sockaddr_in) -> SocketAddrV4 {
    SocketAddrV4::new(
        Ipv4Addr::from(u32::from_be(a.sin_addr.s_addr)),
        u16::from_be(a.sin_port),
    )
}

fn sockaddr_of(a: SocketAddrV4) -> libc::sockaddr_in {
    libc::sockaddr_in {
        sin_family: libc::sa_family_t::try_from(libc::AF_INET).unwrap_or(2),
        sin_port: a.port().to_be(),
        sin_addr: libc::in_addr {
            s_addr: u32::from(*a.ip()).to_be(),
        },
        sin_zero: [0; 8],
    }
}

/// The arrays one `sendmmsg` or `recvmmsg` call of up to `N` datagrams reads: a header per
/// datagram, pointing at its address and its one iovec.
struct MsgArrays<const N: usize> {
    msgs: [libc::mmsghdr; N],
    addrs: [libc::sockaddr_in; N],
    iovs: [libc::iovec; N],
}

impl<const N: usize> MsgArrays<N> {
    fn new() -> MsgArrays<N> {
        // SAFETY: all-zero is a valid mmsghdr, sockaddr_in and iovec (null pointers, zero
        // lengths); the pointers are set by `link` before any system call reads them.
        unsafe { std::mem::zeroed() }
    }

    /// Point the first `n` headers at their address and iovec; those headers.
    fn link(&mut self, n: usize) -> &mut [libc::mmsghdr] {
        let namelen = sockaddr_len();
        for i in 0..n {
            let h = &mut self.msgs[i].msg_hdr;
            h.msg_name = std::ptr::from_mut(&mut self.addrs[i]).cast();
            h.msg_namelen = namelen;
            h.msg_iov = std::ptr::from_mut(&mut self.iovs[i]);
            h.msg_iovlen = 1;
            self.msgs[i].msg_len = 0;
        }
        &mut self.msgs[..n]
    }
}

impl UdpIo {
    /// Bind a socket at `addr` (a specific IPv4 address: the ICRC covers both addresses, so
    /// the receiver must know which of its own a datagram came to). Datagrams go out with
    /// DF set, so the kernel writes IP identification 0, as the ICRC assumes.
    ///
    /// # Errors
    /// The socket's bind or option calls.
    pub fn bind(addr: SocketAddrV4) -> io::Result<UdpIo> {
        UdpIo::bind_sharing(addr, PeerBudget::new())
    }

    /// [`UdpIo::bind`], its peer sockets within `budget`, which other endpoints may share
    /// (see [`PeerBudget`]).
    ///
    /// # Errors
    /// The socket's bind or option calls.
    pub fn bind_sharing(addr: SocketAddrV4, budget: Arc<PeerBudget>) -> io::Result<UdpIo> {
        if addr.ip().is_unspecified() {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                "a RoCE endpoint binds a specific IPv4 address, not 0.0.0.0",
            ));
        }
        let socket = UdpSocket::bind(addr)?;
        let fd = socket.as_raw_fd();
        setsockopt_int(
            fd,
            libc::IPPROTO_IP,
            libc::IP_MTU_DISCOVER,
            libc::IP_PMTUDISC_DO,
        )?;
        // Room for a window of full packets on every connection; FORCE needs CAP_NET_ADMIN,
        // the plain option is capped by net.core.[rw]mem_max.
        for (force, plain) in [
            (libc::SO_RCVBUFFORCE, libc::SO_RCVBUF),
            (libc::SO_SNDBUFFORCE, libc::SO_SNDBUF),
        ] {
            if setsockopt_int(fd, libc::SOL_SOCKET, force, 8 << 20).is_err() {
                setsockopt_int(fd, libc::SOL_SOCKET, plain, 8 << 20)?;
            }
        }
        let local = match socket.local_addr()? {
            std::net::SocketAddr::V4(a) => a,
            std::net::SocketAddr::V6(_) => return Err(io::Error::other("bound an IPv6 address")),
        };
        // After the bind, so that another socket binding the port without it still fails
        // "address in use"; the peers' sockets join the port with it (`peers.rs`).
        setsockopt_int(fd, libc::SOL_SOCKET, libc::SO_REUSEPORT, 1)?;
        let peers = Arc::new(PeerTable::new(local, fd, budget)?);
        Ok(UdpIo {
            socket,
            local,
            peers,
        })
    }

    /// Peer sockets open now, and those that could not be made.
    #[must_use]
    pub fn peer_sockets(&self) -> (usize, usize) {
        (self.peers.sockets(), self.peers.failures())
    }
}

impl DatagramIo for UdpIo {
    fn send(&self, batch: &[(SocketAddrV4, &[u8])]) -> io::Result<()> {
        let fd = self.socket.as_raw_fd();
        if let [(to, d)] = batch {
            // One datagram (a request or an answer of a request-answer exchange): a plain
            // `sendto`, without the batch's headers.
            return send_one(fd, *to, d);
        }
        // The headers live on the stack (6 KiB): three heap vectors a call were a visible
        // share of a busy PU's sends. (A lone datagram, above, and a poll of an idle socket
        // need none.)
        let mut arrays = MsgArrays::<BATCH>::new();
        for chunk in batch.chunks(BATCH) {
            for (i, (a, d)) in chunk.iter().enumerate() {
                arrays.addrs[i] = sockaddr_of(*a);
                arrays.iovs[i] = libc::iovec {
                    iov_base: d.as_ptr().cast_mut().cast(),
                    iov_len: d.len(),
                };
            }
            let msgs = arrays.link(chunk.len());
            let mut done = 0;
            while done < msgs.len() {
                let left = u32::try_from(msgs.len() - done).unwrap_or(u32::MAX);
                let first = msgs[done..].as_mut_ptr();
                // SAFETY: `first` points at msgs[done..], headers `link` initialised, whose
                // name and iovec pointers point into `arrays` and the caller's slices, all
                // alive for this call; `left` is the number of headers from `done` on.
                let n = unsafe { libc::sendmmsg(fd, first, left, 0) };
                if n < 0 {
                    match benign(io::Error::last_os_error())? {
                        Benign::Again => continue,
                        Benign::PeerGone => {
                            done += 1;
                            continue;
                        }
                    }
                }
                // n >= 0 checked above.
                done += n.unsigned_abs() as usize;
            }
        }
        Ok(())
    }

    fn recv(&self, batch: &mut RecvBatch, wait: Option<Duration>) -> io::Result<usize> {
        // A wait goes through the table whether or not there are peer sockets: it also
        // ends when one opens (see `peers.rs`, `PeerTable::wake`).
        let taken = match wait {
            Some(w) => Some(self.peers.wait(batch, w)),
            None => self.peers.poll(batch),
        };
        if let Some(r) = taken {
            let n = r?;
            batch.adapt(n);
            return Ok(n);
        }
        // A poll with no peer sockets: the main socket alone.
        let fd = self.socket.as_raw_fd();
        let n = recv_at(fd, batch, 0, batch.want.clamp(1, BATCH))?;
        batch.adapt(n);
        Ok(n)
    }

    fn local_addr(&self) -> SocketAddrV4 {
        self.local
    }

    fn peer_lease(&self, remote: SocketAddrV4) -> PeerLease {
        self.peers.lease(remote)
    }

    fn take_discarded(&self) -> u64 {
        self.peers.take_discarded()
    }
}

/// Receive up to `want` datagrams (1..=BATCH - at) from `fd` into the batch's slots from
/// `at` on, not waiting: a plain `recvfrom` for one, a `recvmmsg` for more.
fn recv_at(fd: i32, batch: &mut RecvBatch, at: usize, want: usize) -> io::Result<usize> {
    match want.min(BATCH - at.min(BATCH)) {
        0 => Ok(0),
        1 => recv_one(fd, batch, at),
        w @ 2..=SMALL_BATCH => recv_many::<SMALL_BATCH>(fd, batch, at, w),
        w => recv_many::<BATCH>(fd, batch, at, w),
    }
}

/// A send or receive error that is not the socket's fault.
enum Benign {
    /// The call was interrupted, or would have blocked (nothing to receive; a full buffer):
    /// a sender calls again, a receiver has nothing.
    Again,
    /// A peer's port with nobody bound (the ICMP error an earlier datagram brought back): a
    /// sender's datagram is lost, like any other, and it goes on with the next.
    PeerGone,
}

/// What the error `e` of a send or receive call means; Err for one the caller gets.
fn benign(e: io::Error) -> io::Result<Benign> {
    match e.kind() {
        io::ErrorKind::WouldBlock | io::ErrorKind::Interrupted => Ok(Benign::Again),
        io::ErrorKind::ConnectionRefused => Ok(Benign::PeerGone),
        _ => Err(e),
    }
}

/// Send one datagram to `to` (blocking while the socket's buffer is full).
fn send_one(fd: i32, to: SocketAddrV4, d: &[u8]) -> io::Result<()> {
    let addr = sockaddr_of(to);
    let len = sockaddr_len();
    loop {
        // SAFETY: `d` is valid for `d.len()` bytes and `addr` for `len`, for this call.
        let r = unsafe {
            libc::sendto(
                fd,
                d.as_ptr().cast(),
                d.len(),
                0,
                std::ptr::from_ref(&addr).cast(),
                len,
            )
        };
        if r >= 0 {
            return Ok(());
        }
        if let Benign::PeerGone = benign(io::Error::last_os_error())? {
            return Ok(());
        }
    }
}

/// Receive one datagram into slot 0, not waiting: 1, or 0 if none is there.
fn recv_one(fd: i32, batch: &mut RecvBatch, at: usize) -> io::Result<usize> {
    let mut addr = sockaddr_of(SocketAddrV4::new(Ipv4Addr::UNSPECIFIED, 0));
    let mut len = sockaddr_len();
    let buf = &mut batch.bufs[at];
    // SAFETY: `buf` is valid for `buf.len()` bytes and `addr` for `len`, for this call.
    let r = unsafe {
        libc::recvfrom(
            fd,
            buf.as_mut_ptr().cast(),
            buf.len(),
            libc::MSG_DONTWAIT,
            std::ptr::from_mut(&mut addr).cast(),
            &mut len,
        )
    };
    if r < 0 {
        return benign(io::Error::last_os_error()).map(|_| 0);
    }
    // 0 <= r <= buf.len().
    batch.lens[at] = r.unsigned_abs();
    batch.from[at] = addr_from(&addr);
    Ok(1)
}

/// Receive up to `want` datagrams (2..=N, N <= BATCH) in one `recvmmsg` into the slots from
/// `at` on (`want` is cut to the slots left), not waiting. `N` sizes the headers zeroed for
/// the call: 6 KiB for a full batch, which a poll right after one datagram arrived (want 8,
/// request-answer traffic's common case) need not pay.
fn recv_many<const N: usize>(
    fd: i32,
    batch: &mut RecvBatch,
    at: usize,
    want: usize,
) -> io::Result<usize> {
    let want = want.min(N).min(BATCH.saturating_sub(at));
    let mut arrays = MsgArrays::<N>::new();
    for (iov, b) in arrays
        .iovs
        .iter_mut()
        .zip(batch.bufs[at..].iter_mut())
        .take(want)
    {
        *iov = libc::iovec {
            iov_base: b.as_mut_ptr().cast(),
            iov_len: b.len(),
        };
    }
    let msgs = arrays.link(want);
    // SAFETY: `msgs` is the first `want` of `arrays`' N headers (`want` clamped to N and to
    // the BATCH - `at` slots left above; `link` would panic past N), each pointing at its
    // address and iovec in `arrays` and the iovec at one of the batch's buffers from `at` on
    // with that buffer's length, so the kernel writes nothing outside them; `arrays` and
    // `batch` outlive the call, and nothing else touches them during it.
    let n = unsafe {
        libc::recvmmsg(
            fd,
            msgs.as_mut_ptr(),
            u32::try_from(want).unwrap_or(BATCH_U32),
            libc::MSG_DONTWAIT,
            std::ptr::null_mut(),
        )
    };
    if n < 0 {
        return benign(io::Error::last_os_error()).map(|_| 0);
    }
    // 0 <= n <= want.
    let n = n.unsigned_abs() as usize;
    for i in 0..n {
        batch.lens[at + i] = arrays.msgs[i].msg_len as usize;
        batch.from[at + i] = addr_from(&arrays.addrs[i]);
    }
    Ok(n)
}

/// Faults to inject on the datagrams an endpoint sends, each in parts per thousand, from a
/// seeded generator (so a test's run is repeatable in what it decides, if not in timing).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Faults {
    /// Seed of the generator.
    pub seed: u64,
    /// Datagrams dropped.
    pub drop: u16,
    /// Datagrams sent twice.
    pub duplicate: u16,
    /// Datagrams held back and sent after the next one.
    pub reorder: u16,
}

/// A datagram and where it goes.
type Held = (SocketAddrV4, Vec<u8>);

/// A [`DatagramIo`] that loses, duplicates and reorders what it sends.
#[derive(Debug)]
pub struct LossyIo<I> {
    inner: I,
    faults: Faults,
    /// The generator and the datagram held back to go after the next one.
    state: Mutex<(u64, Option<Held>)>,
}

impl<I: DatagramIo> LossyIo<I> {
    /// Wrap `inner`.
    pub fn new(inner: I, faults: Faults) -> LossyIo<I> {
        LossyIo {
            inner,
            faults,
            state: Mutex::new((faults.seed | 1, None)),
        }
    }
}

fn per_mille(rng: &mut u64) -> u16 {
    // xorshift64: small, seeded, good enough to pick which packets suffer.
    *rng ^= *rng << 13;
    *rng ^= *rng >> 7;
    *rng ^= *rng << 17;
    u16::try_from(*rng % 1000).unwrap_or(0)
}

impl<I: DatagramIo> DatagramIo for LossyIo<I> {
    fn send(&self, batch: &[(SocketAddrV4, &[u8])]) -> io::Result<()> {
        let mut out: Vec<(SocketAddrV4, Vec<u8>)> = Vec::with_capacity(batch.len() + 2);
        {
            let mut st = self.state.lock().unwrap_or_else(|e| e.into_inner());
            let (rng, held) = &mut *st;
            for (a, d) in batch {
                if per_mille(rng) < self.faults.drop {
                    continue;
                }
                if held.is_none() && per_mille(rng) < self.faults.reorder {
                    *held = Some((*a, d.to_vec()));
                    continue;
                }
                out.push((*a, d.to_vec()));
                if let Some(h) = held.take() {
                    out.push(h);
                }
                if per_mille(rng) < self.faults.duplicate {
                    out.push((*a, d.to_vec()));
                }
            }
        }
        let refs: Vec<(SocketAddrV4, &[u8])> = out.iter().map(|(a, d)| (*a, &d[..])).collect();
        self.inner.send(&refs)
    }

    fn recv(&self, batch: &mut RecvBatch, wait: Option<Duration>) -> io::Result<usize> {
        self.inner.recv(batch, wait)
    }

    fn local_addr(&self) -> SocketAddrV4 {
        self.inner.local_addr()
    }

    fn peer_lease(&self, remote: SocketAddrV4) -> PeerLease {
        self.inner.peer_lease(remote)
    }

    fn take_discarded(&self) -> u64 {
        self.inner.take_discarded()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn batches_cross_a_loopback_socket() {
        let a = UdpIo::bind(SocketAddrV4::new(Ipv4Addr::LOCALHOST, 0)).unwrap();
        let b = UdpIo::bind(SocketAddrV4::new(Ipv4Addr::LOCALHOST, 0)).unwrap();
        let msgs: Vec<Vec<u8>> = (0..100u8).map(|i| vec![i; usize::from(i) + 1]).collect();
        let batch: Vec<_> = msgs.iter().map(|m| (b.local_addr(), &m[..])).collect();
        a.send(&batch).unwrap();
        let mut got = Vec::new();
        let mut rb = RecvBatch::default();
        while got.len() < 100 {
            let n = b.recv(&mut rb, Some(Duration::from_secs(10))).unwrap();
            assert!(n > 0, "datagrams arrive within the deadline");
            for i in 0..n {
                let (d, from) = rb.get(i);
                assert_eq!(from, a.local_addr());
                got.push(d.to_vec());
            }
        }
        assert_eq!(got, msgs);
        assert!(UdpIo::bind(SocketAddrV4::new(Ipv4Addr::UNSPECIFIED, 0)).is_err());
    }

    /// A poller that found nothing asks for one datagram (a plain `recvfrom`); one that
    /// filled what it asked for asks for eight times more, up to a batch; a single datagram
    /// goes out with a plain `sendto`. Every datagram arrives whole, in order, with its
    /// sender, whichever call carried it.
    #[test]
    fn receives_ask_for_more_as_datagrams_queue_and_one_after_none() {
        let a = UdpIo::bind(SocketAddrV4::new(Ipv4Addr::LOCALHOST, 0)).unwrap();
        let b = UdpIo::bind(SocketAddrV4::new(Ipv4Addr::LOCALHOST, 0)).unwrap();
        let mut rb = RecvBatch::default();
        assert_eq!(rb.want(), 1);
        assert_eq!(b.recv(&mut rb, None).unwrap(), 0);
        assert_eq!(rb.want(), 1, "none found: one next");
        // One datagram alone (sendto), then 80 in one call (sendmmsg).
        a.send(&[(b.local_addr(), &[7u8; 33][..])]).unwrap();
        let msgs: Vec<Vec<u8>> = (0..80u8).map(|i| vec![i; usize::from(i) + 1]).collect();
        let batch: Vec<_> = msgs.iter().map(|m| (b.local_addr(), &m[..])).collect();
        a.send(&batch).unwrap();
        let mut got = Vec::new();
        let (mut asked, mut took) = (Vec::new(), Vec::new());
        while got.len() < 81 {
            let want = rb.want();
            let n = b.recv(&mut rb, Some(Duration::from_secs(10))).unwrap();
            assert!(n > 0 && n <= want, "{n} of {want}");
            asked.push(want);
            took.push(n);
            for i in 0..n {
                let (d, from) = rb.get(i);
                assert_eq!(from, a.local_addr());
                got.push(d.to_vec());
            }
        }
        assert_eq!(got[0], [7u8; 33]);
        assert_eq!(got[1..], msgs[..]);
        // 1, 8, then whole batches (the rest of 81 fits in 1 + 8 + 64 + 8).
        assert_eq!(asked[..3], [1, 8, BATCH]);
        // All queued already, so each call fills what it asked for (a whole batch too).
        assert_eq!(took[..3], [1, 8, BATCH]);
        assert_eq!(b.recv(&mut rb, None).unwrap(), 0);
        assert_eq!(rb.want(), 1, "none found again: one next");
    }

    /// Records what it is asked to send.
    struct Sink(Mutex<Vec<Vec<u8>>>);
    impl DatagramIo for Sink {
        fn send(&self, batch: &[(SocketAddrV4, &[u8])]) -> io::Result<()> {
            self.0
                .lock()
                .unwrap()
                .extend(batch.iter().map(|(_, d)| d.to_vec()));
            Ok(())
        }
        fn recv(&self, _: &mut RecvBatch, _: Option<Duration>) -> io::Result<usize> {
            Ok(0)
        }
        fn local_addr(&self) -> SocketAddrV4 {
            SocketAddrV4::new(Ipv4Addr::LOCALHOST, 1)
        }
    }

    #[test]
    fn the_lossy_wrapper_drops_duplicates_and_reorders() {
        let to = SocketAddrV4::new(Ipv4Addr::LOCALHOST, 2);
        let l = LossyIo::new(
            Sink(Mutex::new(vec![])),
            Faults {
                seed: 42,
                drop: 100,
                duplicate: 100,
                reorder: 100,
            },
        );
        for i in 0..1000u32 {
            l.send(&[(to, &i.to_be_bytes()[..])]).unwrap();
        }
        let got: Vec<u32> = l
            .inner
            .0
            .lock()
            .unwrap()
            .iter()
            .map(|d| u32::from_be_bytes(d[..4].try_into().unwrap()))
            .collect();
        let distinct: std::collections::BTreeSet<_> = got.iter().collect();
        assert!(
            distinct.len() < 1000 && distinct.len() > 800,
            "about a tenth dropped"
        );
        assert!(got.len() > distinct.len(), "some sent twice");
        assert!(got.windows(2).any(|w| w[1] < w[0]), "some out of order");
    }
}
