//! The peer sockets against real sockets on loopback: who is read first, floods, caps,
//! closes, waits.

use super::super::{DatagramIo, UdpIo};
use super::*;
use std::net::Ipv4Addr;

fn endpoint() -> UdpIo {
    UdpIo::bind(SocketAddrV4::new(Ipv4Addr::LOCALHOST, 0)).unwrap()
}

/// An endpoint whose peer sockets count against `budget`.
fn sharing(budget: &Arc<PeerBudget>) -> UdpIo {
    UdpIo::bind_sharing(
        SocketAddrV4::new(Ipv4Addr::LOCALHOST, 0),
        Arc::clone(budget),
    )
    .unwrap()
}

/// Every datagram `io` has queued now, with its sender, over as many polls as it takes.
fn drain(io: &UdpIo) -> Vec<(SocketAddrV4, Vec<u8>)> {
    drain_with(io, &mut RecvBatch::default())
}

fn from(got: &[(SocketAddrV4, Vec<u8>)], who: SocketAddrV4) -> Vec<u32> {
    got.iter()
        .filter(|(a, _)| *a == who)
        .map(|(_, d)| u32::from_be_bytes(d[..4].try_into().unwrap()))
        .collect()
}

/// Where in `got` the last datagram from `who` is.
fn last_from(got: &[(SocketAddrV4, Vec<u8>)], who: SocketAddrV4) -> usize {
    got.iter().rposition(|(a, _)| *a == who).unwrap()
}

/// `busy` queues 600 datagrams at `server`, whose polls then ask for whole batches;
/// then `quiet` queues 5: everything `server` takes after that (all 5 of `quiet`'s
/// checked there, in order), and how many of `busy`'s it took meanwhile.
fn quiet_after_busy(
    server: &UdpIo,
    busy: &UdpIo,
    quiet: &UdpIo,
) -> (Vec<(SocketAddrV4, Vec<u8>)>, usize) {
    send_numbered(busy, server.local_addr(), 0..600, 64);
    // Polls that fill what they ask for ask for more, up to a whole batch: the busy
    // peer's socket always has one now.
    let mut rb = RecvBatch::default();
    while rb.want() < BATCH {
        assert!(server.recv(&mut rb, None).unwrap() > 0);
    }
    send_numbered(quiet, server.local_addr(), 0..5, 64);
    let got = drain_with(server, &mut rb);
    assert_eq!(from(&got, quiet.local_addr()), vec![0, 1, 2, 3, 4]);
    let busy_after = from(&got, busy.local_addr()).len();
    (got, busy_after)
}

fn send_numbered(io: &UdpIo, to: SocketAddrV4, range: std::ops::Range<u32>, len: usize) {
    for i in range {
        let mut d = vec![0u8; len];
        d[..4].copy_from_slice(&i.to_be_bytes());
        io.send(&[(to, &d[..])]).unwrap();
    }
}

#[test]
fn a_strangers_flood_that_fills_the_main_socket_costs_a_peer_none_of_its_datagrams() {
    let server = endpoint();
    let (peer, stranger) = (endpoint(), endpoint());
    let _lease = server.peer_lease(peer.local_addr());
    assert_eq!(server.peer_sockets(), (1, 0));
    // Far more than the main socket's 8 MiB holds: the kernel drops the rest.
    send_numbered(&stranger, server.local_addr(), 0..20_000, 1400);
    send_numbered(&peer, server.local_addr(), 0..300, 1400);
    let got = drain(&server);
    assert_eq!(
        from(&got, peer.local_addr()),
        (0..300).collect::<Vec<_>>(),
        "every one of the peer's datagrams, in order"
    );
    let strangers = from(&got, stranger.local_addr()).len();
    assert!(
        strangers > 0 && strangers < 20_000,
        "the stranger's flood was received in part ({strangers})"
    );
}

#[test]
fn a_busy_peer_does_not_keep_a_quiet_one_waiting_past_its_turn() {
    let server = endpoint();
    let (busy, quiet) = (endpoint(), endpoint());
    let _leases = (
        server.peer_lease(busy.local_addr()),
        server.peer_lease(quiet.local_addr()),
    );
    send_numbered(&busy, server.local_addr(), 0..500, 64);
    send_numbered(&quiet, server.local_addr(), 0..5, 64);
    let got = drain(&server);
    assert_eq!(from(&got, busy.local_addr()).len(), 500);
    let last_quiet = last_from(&got, quiet.local_addr());
    assert_eq!(from(&got, quiet.local_addr()), vec![0, 1, 2, 3, 4]);
    assert!(
        last_quiet < 100,
        "the quiet peer's 5 datagrams came within the first 100 taken, not after the \
         busy one's 500 (the last at {last_quiet})"
    );
}

#[test]
fn past_two_peers_an_epoll_set_finds_every_sockets_datagrams_and_a_wait_wakes_for_them() {
    let server = endpoint();
    let peers: Vec<UdpIo> = (0..DIRECT_PEERS + 2).map(|_| endpoint()).collect();
    let stranger = endpoint();
    let leases: Vec<PeerLease> = peers
        .iter()
        .map(|p| server.peer_lease(p.local_addr()))
        .collect();
    assert_eq!(server.peer_sockets(), (peers.len(), 0));
    for p in &peers {
        send_numbered(p, server.local_addr(), 0..20, 100);
    }
    send_numbered(&stranger, server.local_addr(), 0..20, 100);
    let got = drain(&server);
    for p in peers.iter().chain([&stranger]) {
        assert_eq!(from(&got, p.local_addr()), (0..20).collect::<Vec<_>>());
    }
    // The receive thread's wait wakes for a peer's datagram and for a stranger's.
    let mut rb = RecvBatch::default();
    for who in [&peers[1], &stranger] {
        send_numbered(who, server.local_addr(), 7..8, 100);
        let n = server.recv(&mut rb, Some(Duration::from_secs(10))).unwrap();
        assert_eq!((n, rb.get(0).1), (1, who.local_addr()));
    }
    // A lease's end closes its socket: that address's datagrams come to the main socket.
    drop(leases);
    assert_eq!(server.peer_sockets(), (0, 0));
    send_numbered(&peers[0], server.local_addr(), 9..10, 100);
    let n = server.recv(&mut rb, Some(Duration::from_secs(10))).unwrap();
    assert_eq!((n, rb.get(0).1), (1, peers[0].local_addr()));
}

#[test]
fn leases_share_a_socket_and_peers_past_the_cap_share_the_main_socket() {
    let server = endpoint();
    let base = 20_000u16;
    // Each on an address of its own in 127/8 (one IP's ports share a smaller cap).
    let fake = |i: usize| {
        let i = u16::try_from(i).unwrap();
        let [hi, lo] = i.to_be_bytes();
        SocketAddrV4::new(Ipv4Addr::new(127, 1, hi, lo), base + i)
    };
    let mut leases: Vec<PeerLease> = (0..MAX_PEER_SOCKETS)
        .map(|i| server.peer_lease(fake(i)))
        .collect();
    let again = server.peer_lease(fake(0));
    assert_eq!(
        server.peer_sockets(),
        (MAX_PEER_SOCKETS, 0),
        "a second lease shares"
    );
    drop(again);
    assert_eq!(
        server.peer_sockets().0,
        MAX_PEER_SOCKETS,
        "the first still holds it"
    );
    // A real peer past the cap: its datagrams come to the main socket, polled every time.
    let late = endpoint();
    leases.push(server.peer_lease(late.local_addr()));
    assert_eq!(server.peer_sockets().0, MAX_PEER_SOCKETS);
    send_numbered(&late, server.local_addr(), 0..3, 64);
    let mut rb = RecvBatch::default();
    let mut got = 0;
    for _ in 0..3 {
        got += server.recv(&mut rb, None).unwrap();
    }
    assert_eq!(
        got, 3,
        "the main socket is polled on every poll while a peer shares it"
    );
    drop(leases);
    assert_eq!(server.peer_sockets(), (0, 0));
}

#[test]
fn another_socket_binding_the_port_as_usual_is_refused() {
    let server = endpoint();
    let _lease = server.peer_lease(endpoint().local_addr());
    let e = std::net::UdpSocket::bind(server.local_addr()).unwrap_err();
    assert_eq!(e.kind(), io::ErrorKind::AddrInUse);
}

/// Every datagram `io` has queued now, taken with `rb` (whose batch size carries over
/// from earlier polls), over as many polls as it takes.
fn drain_with(io: &UdpIo, rb: &mut RecvBatch) -> Vec<(SocketAddrV4, Vec<u8>)> {
    let (mut got, mut idle) = (Vec::new(), 0);
    // Idle polls in a row before the queues count as empty: the main socket is looked at
    // on every MAIN_EVERY-th poll only.
    while idle < 2 * MAIN_EVERY {
        let n = io.recv(rb, None).unwrap();
        idle = if n == 0 { idle + 1 } else { 0 };
        for i in 0..n {
            let (d, from) = rb.get(i);
            got.push((from, d.to_vec()));
        }
    }
    got
}

#[test]
fn past_two_peers_a_busy_peer_does_not_keep_a_quiet_one_waiting_past_its_turn() {
    let server = endpoint();
    let peers: Vec<UdpIo> = (0..=DIRECT_PEERS).map(|_| endpoint()).collect();
    let _leases: Vec<PeerLease> = peers
        .iter()
        .map(|p| server.peer_lease(p.local_addr()))
        .collect();
    let (busy, quiet) = (&peers[0], &peers[1]);
    let (got, busy_after) = quiet_after_busy(&server, busy, quiet);
    let last_quiet = last_from(&got, quiet.local_addr());
    assert!(
        last_quiet < BATCH,
        "the quiet peer's 5 datagrams came within the first batch taken after they \
         were sent, not after the busy peer's {busy_after} (the last at {last_quiet})"
    );
}

/// An ICMP "destination unreachable" of `code` about a datagram `server` sent `peer`, as
/// `peer`'s host (or a firewall on the way) would send it back; false where this
/// process may not open a raw socket.
fn icmp_unreachable(server: SocketAddrV4, peer: SocketAddrV4, code: u8) -> bool {
    fn checksum(b: &[u8]) -> u16 {
        let mut sum: u32 = b
            .chunks(2)
            .map(|c| u32::from(u16::from_be_bytes([c[0], *c.get(1).unwrap_or(&0)])))
            .sum();
        while sum > 0xffff {
            sum = (sum & 0xffff) + (sum >> 16);
        }
        !u16::try_from(sum).unwrap()
    }
    // The quoted datagram: its IPv4 header and its UDP header's 8 bytes.
    let mut ip = vec![0x45, 0, 0, 36, 0, 0, 0x40, 0, 64, 17, 0, 0];
    ip.extend_from_slice(&server.ip().octets());
    ip.extend_from_slice(&peer.ip().octets());
    let sum = checksum(&ip);
    ip[10..12].copy_from_slice(&sum.to_be_bytes());
    ip.extend_from_slice(&server.port().to_be_bytes());
    ip.extend_from_slice(&peer.port().to_be_bytes());
    ip.extend_from_slice(&[0, 16, 0, 0]);
    let mut icmp = vec![3, code, 0, 0, 0, 0, 0, 0];
    icmp.extend_from_slice(&ip);
    let sum = checksum(&icmp);
    icmp[2..4].copy_from_slice(&sum.to_be_bytes());
    // SAFETY: plain system call; the result is checked.
    let fd = unsafe { libc::socket(libc::AF_INET, libc::SOCK_RAW, libc::IPPROTO_ICMP) };
    if fd < 0 {
        return false;
    }
    // SAFETY: `fd` was just opened (checked) and nothing else owns it.
    let _owned = unsafe { OwnedFd::from_raw_fd(fd) };
    let to = sockaddr_of(SocketAddrV4::new(*server.ip(), 0));
    // SAFETY: `icmp` and `to` are valid for their lengths for this call.
    let r = unsafe {
        libc::sendto(
            fd,
            icmp.as_ptr().cast(),
            icmp.len(),
            0,
            std::ptr::from_ref(&to).cast(),
            sockaddr_len(),
        )
    };
    assert_eq!(
        r,
        isize::try_from(icmp.len()).unwrap(),
        "{}",
        io::Error::last_os_error()
    );
    true
}

#[test]
fn an_icmp_error_on_a_peers_socket_costs_no_socket_its_datagrams() {
    // The direct polls, then the epoll set's.
    for n in [DIRECT_PEERS, DIRECT_PEERS + 1] {
        let server = endpoint();
        let peers: Vec<UdpIo> = (0..n).map(|_| endpoint()).collect();
        let _leases: Vec<PeerLease> = peers
            .iter()
            .map(|p| server.peer_lease(p.local_addr()))
            .collect();
        send_numbered(&peers[0], server.local_addr(), 0..5, 64);
        // "Administratively prohibited" (a firewall's REJECT): a hard error, which Linux
        // queues on the connected socket for its next receive.
        if !icmp_unreachable(server.local_addr(), peers[1].local_addr(), 13) {
            println!("skipped: no raw socket (needs CAP_NET_RAW)");
            return;
        }
        for p in &peers[1..] {
            send_numbered(p, server.local_addr(), 0..5, 64);
        }
        let mut rb = RecvBatch::default();
        let mut got = Vec::new();
        for _ in 0..4 * MAIN_EVERY {
            let k = server
                .recv(&mut rb, None)
                .unwrap_or_else(|e| panic!("{n} peers: a receive failed: {e}"));
            for i in 0..k {
                let (d, from) = rb.get(i);
                got.push((from, d.to_vec()));
            }
        }
        for p in &peers {
            assert_eq!(
                from(&got, p.local_addr()),
                (0..5).collect::<Vec<_>>(),
                "{n} peers"
            );
        }
    }
}

#[test]
fn a_peer_socket_closed_while_another_holder_keeps_it_open_is_not_read_by_number() {
    let server = endpoint();
    let peers: Vec<UdpIo> = (0..=DIRECT_PEERS + 1).map(|_| endpoint()).collect();
    let mut leases: Vec<PeerLease> = peers
        .iter()
        .map(|p| server.peer_lease(p.local_addr()))
        .collect();
    // What a child forked meanwhile holds until it execs or exits: a copy of the first
    // peer's socket, which keeps it open (and its datagrams coming) after the table
    // closed its own descriptor.
    let copy = server
        .peers
        .set
        .read()
        .sockets
        .iter()
        .find(|p| p.remote == peers[0].local_addr())
        .unwrap()
        .socket
        .try_clone()
        .unwrap();
    drop(leases.remove(0));
    send_numbered(&peers[0], server.local_addr(), 0..3, 64);
    send_numbered(&peers[1], server.local_addr(), 0..3, 64);
    let mut rb = RecvBatch::default();
    let mut got = Vec::new();
    for _ in 0..4 * MAIN_EVERY {
        let k = server.recv(&mut rb, None).unwrap_or_else(|e| {
            panic!("a receive failed (it read a descriptor the table closed?): {e}")
        });
        for i in 0..k {
            let (d, from) = rb.get(i);
            got.push((from, d.to_vec()));
        }
    }
    assert_eq!(from(&got, peers[1].local_addr()), vec![0, 1, 2]);
    assert!(
        from(&got, peers[0].local_addr()).is_empty(),
        "what queued on the copy stays there"
    );
    drop(copy);
}

#[test]
fn a_busy_peer_does_not_keep_a_peer_sharing_the_main_socket_waiting() {
    // Another endpoint sharing the budget holds all but one of 127.0.0.1's sockets: the
    // busy peer gets the last, the quiet one (127.0.0.1 too) shares the main socket.
    let budget = PeerBudget::new();
    let bind = || sharing(&budget);
    let (other, server) = (bind(), bind());
    let _held: Vec<PeerLease> = (0..MAX_PEER_SOCKETS_PER_IP - 1)
        .map(|i| {
            other.peer_lease(SocketAddrV4::new(
                Ipv4Addr::LOCALHOST,
                40_000 + u16::try_from(i).unwrap(),
            ))
        })
        .collect();
    let (busy, quiet) = (endpoint(), endpoint());
    let _leases = (
        server.peer_lease(busy.local_addr()),
        server.peer_lease(quiet.local_addr()),
    );
    assert_eq!(server.peer_sockets(), (1, 0), "the quiet peer shares");
    let (got, busy_after) = quiet_after_busy(&server, &busy, &quiet);
    let last_quiet = last_from(&got, quiet.local_addr());
    assert!(
        last_quiet < 2 * BATCH,
        "the quiet peer's 5 datagrams came within two batches, not after the busy \
         peer's {busy_after} (the last at {last_quiet})"
    );
}

/// The receive thread's waits (of 3 s in all) until one takes a datagram: how many it
/// took and from whom (0 when none came). A wait may end with none (a socket opened
/// or closed), as the receive thread's do; it waits again, as they do.
fn wait_for_one(io: &UdpIo) -> (usize, SocketAddrV4) {
    let mut rb = RecvBatch::default();
    let end = std::time::Instant::now() + Duration::from_secs(3);
    loop {
        let left = end.saturating_duration_since(std::time::Instant::now());
        if left.is_zero() {
            return (0, SocketAddrV4::new(Ipv4Addr::UNSPECIFIED, 0));
        }
        let n = io.recv(&mut rb, Some(left)).unwrap();
        if n > 0 {
            return (n, rb.get(0).1);
        }
    }
}

/// The receive thread's wait is under way when a QP connects to a new peer, whose
/// first datagram then comes to the socket made for it: the wait returns it, with no
/// peer socket before, with one, and with two (the third opens the epoll set), and
/// with three when the fourth's lease ends (the set closes again).
#[test]
fn a_wait_under_way_wakes_for_a_peer_whose_socket_opened_during_it() {
    for before in 0..=DIRECT_PEERS {
        let server = endpoint();
        let old: Vec<UdpIo> = (0..before).map(|_| endpoint()).collect();
        let _old: Vec<PeerLease> = old
            .iter()
            .map(|p| server.peer_lease(p.local_addr()))
            .collect();
        let new = endpoint();
        let got = std::thread::scope(|s| {
            let waiter = s.spawn(|| wait_for_one(&server));
            // Into its wait first, most likely (if not, it finds the socket anyway).
            std::thread::sleep(Duration::from_millis(100));
            let lease = server.peer_lease(new.local_addr());
            send_numbered(&new, server.local_addr(), 0..1, 64);
            let got = waiter.join().unwrap();
            drop(lease);
            got
        });
        assert_eq!(got, (1, new.local_addr()), "{before} peer sockets before");
    }
    // The set closing under a wait: four peers, the fourth's lease ends mid-wait, and
    // then the first sends.
    let server = endpoint();
    let peers: Vec<UdpIo> = (0..=DIRECT_PEERS + 1).map(|_| endpoint()).collect();
    let mut leases: Vec<PeerLease> = peers
        .iter()
        .map(|p| server.peer_lease(p.local_addr()))
        .collect();
    let got = std::thread::scope(|s| {
        let waiter = s.spawn(|| wait_for_one(&server));
        std::thread::sleep(Duration::from_millis(100));
        drop(leases.pop());
        send_numbered(&peers[0], server.local_addr(), 0..1, 64);
        waiter.join().unwrap()
    });
    assert_eq!(got, (1, peers[0].local_addr()), "the set closed mid-wait");
}

#[test]
fn endpoints_sharing_a_budget_share_its_caps() {
    let budget = PeerBudget::new();
    let bind = || sharing(&budget);
    let (a, b) = (bind(), bind());
    let port = |i: usize| {
        SocketAddrV4::new(
            Ipv4Addr::new(127, 0, 0, 9),
            30_000 + u16::try_from(i).unwrap(),
        )
    };
    // One IP at both endpoints: its share over the two.
    let mut leases: Vec<PeerLease> = (0..MAX_PEER_SOCKETS_PER_IP)
        .flat_map(|i| [a.peer_lease(port(i)), b.peer_lease(port(100 + i))])
        .collect();
    assert_eq!(
        a.peer_sockets().0 + b.peer_sockets().0,
        MAX_PEER_SOCKETS_PER_IP
    );
    // Every IP at both: the cap over the two.
    let fake = |i: usize| {
        let [hi, lo] = u16::try_from(i).unwrap().to_be_bytes();
        SocketAddrV4::new(Ipv4Addr::new(127, 2, hi, lo), 20_000)
    };
    leases.extend((0..MAX_PEER_SOCKETS).map(|i| {
        if i % 2 == 0 {
            a.peer_lease(fake(i))
        } else {
            b.peer_lease(fake(i))
        }
    }));
    assert_eq!(a.peer_sockets().0 + b.peer_sockets().0, MAX_PEER_SOCKETS);
    assert_eq!(budget.open(), MAX_PEER_SOCKETS);
    drop(leases);
    assert_eq!(budget.open(), 0, "every socket given back");
    let _again = b.peer_lease(port(0));
    assert_eq!(b.peer_sockets().0, 1);
}

#[test]
fn one_ip_gets_at_most_its_share_of_the_peer_sockets() {
    let server = endpoint();
    let port = |i: usize| {
        SocketAddrV4::new(
            Ipv4Addr::new(127, 0, 0, 9),
            30_000 + u16::try_from(i).unwrap(),
        )
    };
    let leases: Vec<PeerLease> = (0..MAX_PEER_SOCKETS_PER_IP + 5)
        .map(|i| server.peer_lease(port(i)))
        .collect();
    assert_eq!(server.peer_sockets().0, MAX_PEER_SOCKETS_PER_IP);
    // Another host still gets a socket of its own.
    let _other = server.peer_lease(SocketAddrV4::new(Ipv4Addr::new(127, 0, 0, 10), 30_000));
    assert_eq!(server.peer_sockets().0, MAX_PEER_SOCKETS_PER_IP + 1);
    drop(leases);
    assert_eq!(server.peer_sockets().0, 1);
}

#[test]
fn datagrams_left_on_a_closing_peer_socket_are_counted_as_thrown_away() {
    let server = endpoint();
    let peer = endpoint();
    let lease = server.peer_lease(peer.local_addr());
    send_numbered(&peer, server.local_addr(), 0..25, 64);
    // Queued on the peer's socket (loopback delivers within the send).
    assert_eq!(server.take_discarded(), 0);
    drop(lease);
    assert_eq!(server.take_discarded(), 25);
    assert_eq!(server.take_discarded(), 0, "taken once");
}

#[test]
fn the_epoll_set_holds_the_sockets_only_past_two_peers_and_a_wait_wakes_either_way() {
    let server = endpoint();
    let peers: Vec<UdpIo> = (0..=DIRECT_PEERS).map(|_| endpoint()).collect();
    let mut rb = RecvBatch::default();
    let mut leases = Vec::new();
    for (k, p) in peers.iter().enumerate() {
        leases.push(server.peer_lease(p.local_addr()));
        // The wake eventfd always; the main socket and every peer's once past
        // DIRECT_PEERS.
        let expected = if k < DIRECT_PEERS { 1 } else { k + 3 };
        assert_eq!(server.peers.epoll_entries(), expected, "{} peers", k + 1);
        send_numbered(p, server.local_addr(), 0..1, 64);
        let n = server.recv(&mut rb, Some(Duration::from_secs(10))).unwrap();
        assert_eq!((n, rb.get(0).1), (1, p.local_addr()), "{} peers", k + 1);
    }
    leases.pop();
    assert_eq!(server.peers.epoll_entries(), 1, "back to direct polls");
    // A wait still wakes for a stranger (the main socket) and for a peer.
    let stranger = endpoint();
    for who in [&stranger, &peers[0]] {
        send_numbered(who, server.local_addr(), 5..6, 64);
        let n = server.recv(&mut rb, Some(Duration::from_secs(10))).unwrap();
        assert_eq!((n, rb.get(0).1), (1, who.local_addr()));
    }
}
