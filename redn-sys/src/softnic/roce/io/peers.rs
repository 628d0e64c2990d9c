//! Receive queues of their own for connected peers.
//!
//! Every datagram to an endpoint's port used to wait in one socket's queue, so anyone who
//! could reach the port (a stranger, or one peer) could fill it: the kernel then dropped the
//! other peers' datagrams with the flood's, and they came back only after their sender's
//! ACK timeout. Now each remote address a QP is connected to gets a UDP socket bound to the
//! endpoint's own address and port and *connected* to the peer: Linux delivers a datagram
//! to the socket whose bound and connected addresses match it best (`compute_score` in
//! `net/ipv4/udp.c`; within a `SO_REUSEPORT` group that has connected members, the
//! connected one wins for its peer since Linux 5.4, commit acdcecc61285), so each peer's
//! datagrams queue apart from everyone else's and a flood fills only its sender's queue.
//! What no connected socket takes (strangers, peers past [`MAX_PEER_SOCKETS`], or past
//! [`MAX_PEER_SOCKETS_PER_IP`] of one IP address) stays on the endpoint's main socket.
//!
//! Sending stays on the main socket: on a connected socket Linux writes the socket's IP
//! identification counter into every datagram, which the ICRC covers and the receiver cannot
//! see (`docs/rocev2.md`, "I/O").
//!
//! The main socket binds without `SO_REUSEPORT` and sets it afterwards, so another process
//! that binds the port as usual still fails with "address in use" (a second endpoint
//! configured on the same port must not silently share its traffic); the peer sockets set it
//! before they bind, which the kernel allows only to the same effective uid.
//!
//! **Who is read first.** A poll visits the sockets in turn, from a cursor that moves past
//! each socket that yielded datagrams, and returns what the first one that has any yields:
//! one busy peer cannot keep the others waiting for more than its turn. The main socket,
//! which has only strangers' datagrams while every peer has its own socket, takes its turn
//! in the rotation on every [`MAIN_EVERY`]th poll only (on every poll while some peer
//! shares it). With more than
//! [`DIRECT_PEERS`] peer sockets an `epoll` set says which sockets have datagrams, one
//! system call for all, and every ready socket it names gives at most an equal share of
//! the batch, peers before the main socket (see `take_ready` for why every one is read).
//! The sockets are in the set only then (see `PeerSet::registered` for what it costs).
//! An error a peer's socket returns (an ICMP error about what was sent to the peer) is
//! nothing from that socket, not a failed poll.

use super::{benign, recv_at, setsockopt_int, sockaddr_len, sockaddr_of, RecvBatch, BATCH};
use crate::mem::read_mostly::ReadMostly;
use std::collections::hash_map::Entry;
use std::collections::HashMap;
use std::io;
use std::net::{Ipv4Addr, SocketAddrV4, UdpSocket};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// Peer sockets polled one after another; past this many an `epoll` set says which are
/// ready (a poll of an idle socket is a system call, ~0.5 µs on our VMs).
pub const DIRECT_PEERS: usize = 2;
/// Peer sockets an endpoint opens at most, or the endpoints sharing a [`PeerBudget`]
/// together (each is a file descriptor and, when full, up to a peer socket's 1 MiB receive
/// buffer of kernel memory); the peers past it share the main socket.
pub const MAX_PEER_SOCKETS: usize = 256;
/// Peer sockets for the addresses of one IP at most: every UDP port of a host is a peer
/// address, and one host that opened connections from a port each would otherwise take
/// every socket and leave later peers to share the main socket with strangers.
pub const MAX_PEER_SOCKETS_PER_IP: usize = 16;
/// While every peer has its own socket, the main socket is polled on every this many polls.
pub const MAIN_EVERY: usize = 8;
/// A peer socket's receive buffer: a window of full 4 KiB packets with the kernel's
/// per-datagram overhead.
const PEER_RCVBUF: i32 = 1 << 20;

/// A socket bound to `local` with `SO_REUSEPORT` set before the bind (so that it joins the
/// main socket's port), non-blocking reads by flag.
fn reuseport_socket(local: SocketAddrV4) -> io::Result<UdpSocket> {
    // SAFETY: plain system call with constant arguments; the result is checked below.
    let fd = unsafe {
        libc::socket(
            libc::AF_INET,
            libc::SOCK_DGRAM | libc::SOCK_CLOEXEC,
            libc::IPPROTO_UDP,
        )
    };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: `fd` was just returned by `socket` (checked non-negative) and nothing else
    // owns it: the OwnedFd closes it on every path from here.
    let owned = unsafe { OwnedFd::from_raw_fd(fd) };
    setsockopt_int(fd, libc::SOL_SOCKET, libc::SO_REUSEPORT, 1)?;
    let addr = sockaddr_of(local);
    // SAFETY: `addr` is a live sockaddr_in and the length passed is its size.
    let r = unsafe { libc::bind(fd, std::ptr::from_ref(&addr).cast(), sockaddr_len()) };
    if r != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(UdpSocket::from(owned))
}

/// A socket of the main socket's address and port, connected to `remote`: `remote`'s
/// datagrams to that port queue here.
fn peer_socket(local: SocketAddrV4, remote: SocketAddrV4) -> io::Result<UdpSocket> {
    let s = reuseport_socket(local)?;
    let fd = s.as_raw_fd();
    if setsockopt_int(fd, libc::SOL_SOCKET, libc::SO_RCVBUFFORCE, PEER_RCVBUF).is_err() {
        setsockopt_int(fd, libc::SOL_SOCKET, libc::SO_RCVBUF, PEER_RCVBUF)?;
    }
    s.connect(remote)?;
    Ok(s)
}

/// Datagrams from one remote address have their own socket for as long as this lives
/// ([`super::DatagramIo::peer_lease`]); every QP connected to that address holds one.
#[derive(Debug)]
pub struct PeerLease {
    table: Option<Arc<PeerTable>>,
    remote: SocketAddrV4,
}

impl PeerLease {
    /// A lease that gives nothing (an I/O without peer sockets).
    #[must_use]
    pub fn none(remote: SocketAddrV4) -> PeerLease {
        PeerLease {
            table: None,
            remote,
        }
    }
}

impl Drop for PeerLease {
    fn drop(&mut self) {
        if let Some(t) = self.table.take() {
            t.release(self.remote);
        }
    }
}

/// What the peer sockets of the endpoints that share it may take: at most
/// [`MAX_PEER_SOCKETS`] together, and at most [`MAX_PEER_SOCKETS_PER_IP`] for the addresses
/// of one IP over all of them. An endpoint has one of its own unless its
/// [`RoceConfig`](crate::softnic::roce::RoceConfig) gives it one to share: a process with
/// an endpoint on each of several local addresses (the manager's data plane listening on
/// all of them) shares one, so that its file descriptors for peer sockets stay within what
/// it keeps back for them, and one host cannot take a share at every endpoint (16 sockets
/// at each, before: 32 for a host with sessions at two endpoints).
#[derive(Debug, Default)]
pub struct PeerBudget {
    /// Peer sockets open, in all and by remote IP.
    open: Mutex<(usize, HashMap<Ipv4Addr, usize>)>,
}

impl PeerBudget {
    /// A budget for endpoints to share.
    #[must_use]
    pub fn new() -> Arc<PeerBudget> {
        Arc::default()
    }

    /// Peer sockets open now under this budget.
    #[must_use]
    pub fn open(&self) -> usize {
        self.open.lock().unwrap_or_else(|e| e.into_inner()).0
    }

    /// A socket for a peer at `ip`, if the caps leave room.
    fn take(&self, ip: Ipv4Addr) -> bool {
        let mut open = self.open.lock().unwrap_or_else(|e| e.into_inner());
        let (all, by_ip) = &mut *open;
        let of_ip = by_ip.entry(ip).or_default();
        if *all >= MAX_PEER_SOCKETS || *of_ip >= MAX_PEER_SOCKETS_PER_IP {
            if *of_ip == 0 {
                by_ip.remove(&ip);
            }
            return false;
        }
        *of_ip += 1;
        *all += 1;
        true
    }

    /// A socket [`PeerBudget::take`] gave for a peer at `ip` is closed.
    fn give(&self, ip: Ipv4Addr) {
        let mut open = self.open.lock().unwrap_or_else(|e| e.into_inner());
        let (all, by_ip) = &mut *open;
        *all = all.saturating_sub(1);
        if let Entry::Occupied(mut e) = by_ip.entry(ip) {
            *e.get_mut() -= 1;
            if *e.get() == 0 {
                e.remove();
            }
        }
    }
}

/// One peer's socket.
#[derive(Debug)]
struct PeerSocket {
    remote: SocketAddrV4,
    socket: UdpSocket,
}

/// A remote address's leases.
#[derive(Debug)]
struct Leases {
    count: usize,
    /// It has a socket of its own (else its datagrams come to the main socket).
    own: bool,
}

/// The peer sockets, in polling order.
#[derive(Debug, Default)]
struct PeerSet {
    sockets: Vec<PeerSocket>,
    leases: HashMap<SocketAddrV4, Leases>,
    /// Remote addresses with leases and no socket of their own (the cap, or a failed
    /// socket call): their datagrams come to the main socket, polled at every poll.
    shared: usize,
    /// The epoll set holds the main socket and every peer socket: only while there are
    /// more than [`DIRECT_PEERS`] peer sockets. A socket in an epoll set costs each
    /// datagram queued on it the set's callback in the sender's softirq (0.2 µs a datagram
    /// measured, both ends of a round trip paying it), which direct polls do not need.
    registered: bool,
}

/// An endpoint's peer sockets, with the main socket's descriptor they are polled beside.
#[derive(Debug)]
pub(super) struct PeerTable {
    local: SocketAddrV4,
    main: RawFd,
    /// Every socket (the main one and each peer's), for polls with more than
    /// [`DIRECT_PEERS`] peers and for the receive thread's waits.
    epoll: OwnedFd,
    /// An eventfd the receive thread's wait also waits on (in the epoll set for good, and
    /// in the few `poll` watches otherwise): written when a peer socket opens or closes,
    /// so that a wait under way starts again with the sockets as they are now. Without it,
    /// a wait that began before a QP connected to a new peer did not watch the socket
    /// made for it, nor one that began in the epoll set when the set emptied (the peers
    /// down to [`DIRECT_PEERS`]): the peer's datagrams waited for the wait's end, up to
    /// the receive thread's nap (10 ms), the first trigger of every new session at an
    /// idle endpoint among them.
    wake: OwnedFd,
    set: ReadMostly<PeerSet>,
    /// Where the next direct poll starts (an index into `sockets`, taken modulo their count).
    cursor: AtomicUsize,
    /// Direct polls made, for the main socket's turn.
    polls: AtomicUsize,
    /// Peer sockets that could not be made (counted for tests and diagnosis).
    failures: AtomicUsize,
    /// How many peer sockets it may open, shared with other endpoints or its own.
    budget: Arc<PeerBudget>,
    /// Datagrams still queued on peer sockets when they closed, not yet taken by
    /// [`PeerTable::take_discarded`].
    discarded: AtomicU64,
}

/// Datagrams a closing peer socket drains at most (each a non-blocking receive of one byte
/// that says the datagram is there): its 1 MiB holds about a thousand.
const DRAIN_MAX: u64 = 4096;

/// Read and count what waits on `socket` (up to [`DRAIN_MAX`]), without waiting.
fn drain(socket: &UdpSocket) -> u64 {
    let mut byte = [0u8; 1];
    let mut n = 0;
    while n < DRAIN_MAX {
        // SAFETY: `byte` is valid for its one byte for this call; the descriptor is the
        // socket's own, open while `socket` is borrowed.
        let r = unsafe {
            libc::recv(
                socket.as_raw_fd(),
                byte.as_mut_ptr().cast(),
                byte.len(),
                libc::MSG_DONTWAIT | libc::MSG_TRUNC,
            )
        };
        if r < 0 {
            match io::Error::last_os_error().kind() {
                io::ErrorKind::Interrupted => continue,
                // Empty (WouldBlock), or an error queued by an ICMP message: done either way.
                _ => break,
            }
        }
        n += 1;
    }
    n
}

/// Take `fd` out of the epoll set `epoll`.
///
/// Closing a descriptor does not do it when another descriptor refers to the same socket (a
/// child forked meanwhile holds a copy until it execs or exits): the set would go on naming
/// the socket by its old number, which the next file opened may take, and a poll would
/// read from that file (an app's connection, a varlink client's).
fn epoll_del(epoll: RawFd, fd: RawFd) {
    // SAFETY: plain system call on descriptors the table owns (the event argument may be
    // null for EPOLL_CTL_DEL); a failure leaves nothing to undo.
    unsafe { libc::epoll_ctl(epoll, libc::EPOLL_CTL_DEL, fd, std::ptr::null_mut()) };
}

/// Receive from a peer's socket: an error is none now. A connected socket is given the
/// ICMP errors that come back about what was sent to its peer (port, host or network
/// unreachable, a firewall's "administratively prohibited", "fragmentation needed", as
/// the peer's host or anyone on the way sends them), each returned once by its next
/// receive instead of a datagram: not the endpoint's fault, and no reason to give up the
/// other sockets' datagrams or to pause the poller.
fn recv_peer(fd: RawFd, batch: &mut RecvBatch, at: usize, want: usize) -> usize {
    recv_at(fd, batch, at, want).unwrap_or(0)
}

fn epoll_add(epoll: RawFd, fd: RawFd) -> io::Result<()> {
    let mut ev = libc::epoll_event {
        events: libc::EPOLLIN as u32,
        // The descriptor, to tell the ready sockets apart.
        u64: u64::try_from(fd).unwrap_or(0),
    };
    // SAFETY: `ev` is a live epoll_event for this call; both descriptors are open (the
    // table owns `epoll`, its caller `fd`).
    let r = unsafe { libc::epoll_ctl(epoll, libc::EPOLL_CTL_ADD, fd, &mut ev) };
    if r == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

impl PeerTable {
    /// A table for the main socket `main` (bound at `local`, `SO_REUSEPORT` already set),
    /// its peer sockets within `budget`.
    pub(super) fn new(
        local: SocketAddrV4,
        main: RawFd,
        budget: Arc<PeerBudget>,
    ) -> io::Result<PeerTable> {
        // SAFETY: plain system call; the result is checked below.
        let ep = unsafe { libc::epoll_create1(libc::EPOLL_CLOEXEC) };
        if ep < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: `ep` was just returned by `epoll_create1` (checked) and nothing else owns it.
        let epoll = unsafe { OwnedFd::from_raw_fd(ep) };
        // SAFETY: plain system call; the result is checked below.
        let wfd = unsafe { libc::eventfd(0, libc::EFD_CLOEXEC | libc::EFD_NONBLOCK) };
        if wfd < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: `wfd` was just returned by `eventfd` (checked) and nothing else owns it.
        let wake = unsafe { OwnedFd::from_raw_fd(wfd) };
        epoll_add(ep, wfd)?;
        Ok(PeerTable {
            local,
            main,
            epoll,
            set: ReadMostly::default(),
            cursor: AtomicUsize::new(0),
            polls: AtomicUsize::new(0),
            failures: AtomicUsize::new(0),
            discarded: AtomicU64::new(0),
            budget,
            wake,
        })
    }

    /// A lease on `remote`'s socket, made at its first lease.
    pub(super) fn lease(self: &Arc<Self>, remote: SocketAddrV4) -> PeerLease {
        let mut set = self.set.write();
        if let Some(l) = set.leases.get_mut(&remote) {
            l.count += 1;
        } else {
            let own = self.budget.take(*remote.ip())
                && match peer_socket(self.local, remote).and_then(|s| {
                    if set.registered {
                        epoll_add(self.epoll.as_raw_fd(), s.as_raw_fd())?;
                    }
                    Ok(s)
                }) {
                    Ok(socket) => {
                        set.sockets.push(PeerSocket { remote, socket });
                        self.sync_epoll(&mut set);
                        self.wake();
                        true
                    }
                    Err(_) => {
                        self.failures.fetch_add(1, Ordering::Relaxed);
                        self.budget.give(*remote.ip());
                        false
                    }
                };
            if !own {
                set.shared += 1;
            }
            set.leases.insert(remote, Leases { count: 1, own });
        }
        PeerLease {
            table: Some(Arc::clone(self)),
            remote,
        }
    }

    /// One lease on `remote` ended; its socket closes with its last (the datagrams still
    /// queued on it were for QPs that are gone).
    fn release(&self, remote: SocketAddrV4) {
        let mut set = self.set.write();
        let Some(l) = set.leases.get_mut(&remote) else {
            return;
        };
        l.count -= 1;
        if l.count > 0 {
            return;
        }
        let own = l.own;
        set.leases.remove(&remote);
        if own {
            // What still waits there was for QPs that are gone: counted, then thrown away
            // with the socket, taken out of the epoll set first (see `epoll_del`).
            if let Some(i) = set.sockets.iter().position(|p| p.remote == remote) {
                let closing = set.sockets.remove(i);
                epoll_del(self.epoll.as_raw_fd(), closing.socket.as_raw_fd());
                self.discarded
                    .fetch_add(drain(&closing.socket), Ordering::Relaxed);
                drop(closing);
                self.budget.give(*remote.ip());
                self.sync_epoll(&mut set);
                self.wake();
            }
        } else {
            set.shared -= 1;
        }
    }

    /// Fill the epoll set when the peer sockets grew past [`DIRECT_PEERS`], empty it when
    /// they fell back to it. A socket the set cannot take is polled only on the way out:
    /// the set stays empty and the polls direct (counted as a failure).
    fn sync_epoll(&self, set: &mut PeerSet) {
        let ep = self.epoll.as_raw_fd();
        let fds =
            || std::iter::once(self.main).chain(set.sockets.iter().map(|p| p.socket.as_raw_fd()));
        let wanted = set.sockets.len() > DIRECT_PEERS;
        if wanted && !set.registered {
            let added: Vec<RawFd> = fds().take_while(|&fd| epoll_add(ep, fd).is_ok()).collect();
            if added.len() == set.sockets.len() + 1 {
                set.registered = true;
            } else {
                self.failures.fetch_add(1, Ordering::Relaxed);
                for fd in added {
                    epoll_del(ep, fd);
                }
            }
        } else if !wanted && set.registered {
            for fd in fds() {
                epoll_del(ep, fd);
            }
            set.registered = false;
        }
    }

    /// Sockets in the epoll set now, as the kernel lists them (`/proc/self/fdinfo`).
    #[cfg(test)]
    fn epoll_entries(&self) -> usize {
        let info = std::fs::read_to_string(format!("/proc/self/fdinfo/{}", self.epoll.as_raw_fd()))
            .unwrap_or_default();
        info.lines().filter(|l| l.starts_with("tfd:")).count()
    }

    /// End the receive thread's wait under way (see `wake`).
    fn wake(&self) {
        let one = 1u64.to_ne_bytes();
        // SAFETY: `one` is valid for its 8 bytes for this call; the descriptor is the
        // table's own eventfd. A full counter (EAGAIN) is already a wake.
        unsafe { libc::write(self.wake.as_raw_fd(), one.as_ptr().cast(), one.len()) };
    }

    /// Reset the eventfd a wake wrote (the waiter woke).
    fn woken(&self) {
        let mut count = [0u8; 8];
        // SAFETY: `count` is valid for its 8 bytes for this call; the descriptor is the
        // table's own eventfd, non-blocking (EAGAIN when nothing was written).
        unsafe {
            libc::read(
                self.wake.as_raw_fd(),
                count.as_mut_ptr().cast(),
                count.len(),
            )
        };
    }

    /// Peer sockets open now.
    pub(super) fn sockets(&self) -> usize {
        self.set.read().sockets.len()
    }

    /// Datagrams thrown away with closing peer sockets since the last call.
    pub(super) fn take_discarded(&self) -> u64 {
        if self.discarded.load(Ordering::Relaxed) == 0 {
            return 0;
        }
        self.discarded.swap(0, Ordering::Relaxed)
    }

    /// Peer sockets that could not be made.
    pub(super) fn failures(&self) -> usize {
        self.failures.load(Ordering::Relaxed)
    }

    /// Take datagrams without waiting, `Some(n)`, or `None` when there are no peer sockets
    /// (the caller polls the main socket alone, as before).
    pub(super) fn poll(&self, batch: &mut RecvBatch) -> Option<io::Result<usize>> {
        let set = self.set.read();
        let peers = set.sockets.len();
        if peers == 0 {
            return None;
        }
        let want = batch.want.clamp(1, BATCH);
        if set.registered {
            return Some(self.take_ready(&set, batch, want, 0));
        }
        let polls = self.polls.load(Ordering::Relaxed);
        // A plain load and store: a lost step between PUs only moves the main socket's turn.
        self.polls.store(polls.wrapping_add(1), Ordering::Relaxed);
        let start = self.cursor.load(Ordering::Relaxed);
        // The main socket, when its turn is due (a peer shares it, or every MAIN_EVERY-th
        // poll), is one more in the rotation, after the peers'. Only after them all, a
        // peer whose socket always had datagrams kept it from ever being read: a peer
        // sharing it (past the caps) waited for as long as the other sent (its 5
        // datagrams after all 591 of the busy peer's, tested).
        let main_due = set.shared > 0 || polls % MAIN_EVERY == 0;
        let slots = peers + usize::from(main_due);
        for k in 0..slots {
            let i = (start + k) % slots;
            let n = if i == peers {
                match recv_at(self.main, batch, 0, want) {
                    Ok(n) => n,
                    Err(e) => return Some(Err(e)),
                }
            } else {
                recv_peer(set.sockets[i].socket.as_raw_fd(), batch, 0, want)
            };
            if n > 0 {
                self.cursor.store(i + 1, Ordering::Relaxed);
                return Some(Ok(n));
            }
        }
        Some(Ok(0))
    }

    /// Wait up to `wait` for a datagram on any socket, then take what is ready (the receive
    /// thread's wait). A peer socket opened or closed meanwhile ends the wait (`wake`).
    ///
    /// The wait holds no lock (a connect or a QP's end would otherwise wait for it, up to
    /// the receive thread's nap): it only says that something is ready, and the take asks
    /// the epoll set again under the read lock, so that every descriptor it reads from is
    /// one of the table's sockets (a descriptor closed during the wait may have been
    /// reused by any file).
    pub(super) fn wait(&self, batch: &mut RecvBatch, wait: Duration) -> io::Result<usize> {
        let ms = i32::try_from(wait.as_millis().max(1)).unwrap_or(i32::MAX);
        let few: Vec<RawFd> = {
            let set = self.set.read();
            if set.registered {
                Vec::new()
            } else {
                std::iter::once(self.main)
                    .chain(set.sockets.iter().map(|p| p.socket.as_raw_fd()))
                    .collect()
            }
        };
        if !few.is_empty() {
            return self.wait_few(&few, batch, ms);
        }
        // SAFETY: all-zero is a valid epoll_event.
        let mut ev: libc::epoll_event = unsafe { std::mem::zeroed() };
        // SAFETY: one live epoll_event, count 1; the epoll descriptor is the table's own.
        let n = unsafe { libc::epoll_wait(self.epoll.as_raw_fd(), &mut ev, 1, ms) };
        if n < 0 {
            return benign(io::Error::last_os_error()).map(|_| 0);
        }
        if n == 0 {
            return Ok(0);
        }
        let set = self.set.read();
        let want = batch.want.clamp(1, BATCH);
        if !set.registered {
            // The set emptied meanwhile (peers fell to DIRECT_PEERS), which woke it: the
            // next wait polls.
            self.woken();
            return Ok(0);
        }
        self.take_ready(&set, batch, want, 0)
    }

    /// The receive thread's wait while the epoll set is empty: `poll` on the main socket
    /// and the few peer sockets, `fds`, copied out of the table, without its lock, and on
    /// the wake eventfd. A descriptor closed meanwhile and reused by another file can only
    /// end the wait early: the take, under the read lock, reads only from descriptors that
    /// are the table's.
    fn wait_few(&self, fds: &[RawFd], batch: &mut RecvBatch, ms: i32) -> io::Result<usize> {
        let mut polled: Vec<libc::pollfd> = fds
            .iter()
            .chain([&self.wake.as_raw_fd()])
            .map(|&fd| libc::pollfd {
                fd,
                events: libc::POLLIN,
                revents: 0,
            })
            .collect();
        // At most 2 + DIRECT_PEERS entries.
        let count = libc::nfds_t::try_from(polled.len()).unwrap_or(0);
        // SAFETY: `polled` holds `count` live pollfd entries for this call.
        let r = unsafe { libc::poll(polled.as_mut_ptr(), count, ms) };
        if r < 0 {
            return benign(io::Error::last_os_error()).map(|_| 0);
        }
        let set = self.set.read();
        let want = batch.want.clamp(1, BATCH);
        let wake = self.wake.as_raw_fd();
        let ready = polled
            .iter()
            .filter(|p| p.revents != 0 && p.fd != wake)
            .count();
        let share = want.min(BATCH / ready.max(1));
        let mut filled = 0;
        for p in polled.iter().filter(|p| p.revents != 0) {
            if p.fd == wake {
                self.woken();
            } else if p.fd == self.main {
                filled += recv_at(self.main, batch, filled, share).unwrap_or(0);
            } else if set.sockets.iter().any(|s| s.socket.as_raw_fd() == p.fd) {
                filled += recv_peer(p.fd, batch, filled, share);
            }
        }
        Ok(filled)
    }

    /// Ask the epoll set which sockets are ready (waiting up to `ms`), then take up to
    /// `want` datagrams from each, and no more than an equal share of the batch, peers
    /// first. `_set` is the read guard's value: while it is held no socket of the table
    /// closes, and a closing one leaves the set first, so every descriptor the epoll set
    /// names is open and the table's.
    ///
    /// Every socket the set names is read: epoll puts each socket it names at the back of
    /// its ready list, behind those it did not get to, so one named and left unread (the
    /// batch full) came again behind the busy socket that filled the batch, every time.
    /// A peer that always had a batch waiting so kept every socket named after it waiting
    /// for as long as it sent (tested: a quiet peer's 5 datagrams came after the busy
    /// one's 591).
    fn take_ready(
        &self,
        _set: &PeerSet,
        batch: &mut RecvBatch,
        want: usize,
        ms: i32,
    ) -> io::Result<usize> {
        // SAFETY: all-zero is a valid epoll_event array.
        let mut events: [libc::epoll_event; BATCH] = unsafe { std::mem::zeroed() };
        // SAFETY: `events` holds BATCH entries, the count passed; the epoll descriptor is
        // the table's own and open.
        let n = unsafe {
            libc::epoll_wait(
                self.epoll.as_raw_fd(),
                events.as_mut_ptr(),
                super::BATCH_I32,
                ms,
            )
        };
        if n < 0 {
            return benign(io::Error::last_os_error()).map(|_| 0);
        }
        // 0 <= n <= BATCH.
        let ready = &events[..n.unsigned_abs() as usize];
        // At least 1, and the shares together at most BATCH.
        let share = want.min(BATCH / ready.len().max(1));
        let mut filled = 0;
        let mut main_ready = false;
        for ev in ready {
            let Ok(fd) = RawFd::try_from(ev.u64) else {
                continue;
            };
            if fd == self.wake.as_raw_fd() {
                // A wait under way woke for a socket opened or closed: nothing to read.
                self.woken();
                continue;
            }
            if fd == self.main {
                main_ready = true;
                continue;
            }
            filled += recv_peer(fd, batch, filled, share);
        }
        if main_ready {
            match recv_at(self.main, batch, filled, share) {
                Ok(k) => filled += k,
                // Not at the cost of what the peers' sockets gave.
                Err(e) if filled == 0 => return Err(e),
                Err(_) => {}
            }
        }
        Ok(filled)
    }
}

#[cfg(test)]
mod tests;
