//! The RoCE endpoint's per-peer receive sockets (`redn-sys`'s `roce/io/peers.rs`): each
//! remote address a QP of the manager's is connected to gets a UDP socket of its own, bound
//! to the endpoint's port and connected to that address, for as long as a QP is connected
//! to it; at most 16 for the addresses of one IP. A remote client opens and ends sessions
//! in every way it can (and lets the manager evict them), and one host opens sessions from
//! many ports: what must hold is that every peer socket closes with its last QP (the
//! manager's open files back to their count before), one IP takes no more than its share
//! of the sockets, a session past that share is still served (its datagrams come to the
//! endpoint's main socket), and nobody else can bind the endpoint's port.
//!
//! The sockets are read from `/proc/net/udp` (those at the endpoint's address and port with
//! a remote address) and the manager's open files from `/proc/<pid>/fd`.

use super::raw_peer::{reset, Door, Peer, Served, Session};
use super::*;
use nix::sys::socket::{setsockopt, sockopt};
use redn_proto::dataplane::Answer;
use redn_sys::softnic::roce::QpRecord;
use std::collections::BTreeMap;
use std::net::{Ipv4Addr, SocketAddrV4, UdpSocket};
use std::time::Duration;

/// Peer sockets one IP gets at most (`redn_sys::softnic::roce::io::MAX_PEER_SOCKETS_PER_IP`).
const PER_IP: usize = redn_sys::softnic::roce::io::MAX_PEER_SOCKETS_PER_IP;

/// The UDP sockets bound at `at` with a remote address (the endpoint's peer sockets), by
/// the remote address's IP, from `/proc/net/udp`.
fn peer_sockets(at: SocketAddrV4) -> BTreeMap<Ipv4Addr, usize> {
    // Addresses as the kernel prints them: the IPv4 address's bytes in memory order as a
    // native 32-bit word in hex, then the port in hex.
    let parse = |field: &str| -> SocketAddrV4 {
        let (ip, port) = field.split_once(':').unwrap();
        let ip = u32::from_str_radix(ip, 16).unwrap();
        SocketAddrV4::new(
            Ipv4Addr::from(ip.to_ne_bytes()),
            u16::from_str_radix(port, 16).unwrap(),
        )
    };
    let mut by_ip = BTreeMap::new();
    for line in std::fs::read_to_string("/proc/net/udp")
        .unwrap()
        .lines()
        .skip(1)
    {
        let fields: Vec<&str> = line.split_whitespace().collect();
        let (local, remote) = (parse(fields[1]), parse(fields[2]));
        if local == at && remote.port() != 0 {
            *by_ip.entry(*remote.ip()).or_default() += 1;
        }
    }
    by_ip
}

/// The manager's (process `pid`'s) UDP sockets connected somewhere: its peer sockets.
fn peer_sockets_anywhere(pid: u32) -> usize {
    let inodes: std::collections::BTreeSet<String> = std::fs::read_dir(format!("/proc/{pid}/fd"))
        .unwrap()
        .filter_map(|e| {
            let target = std::fs::read_link(e.ok()?.path()).ok()?;
            let t = target.to_str()?;
            Some(t.strip_prefix("socket:[")?.trim_end_matches(']').to_owned())
        })
        .collect();
    std::fs::read_to_string("/proc/net/udp")
        .unwrap()
        .lines()
        .skip(1)
        .filter(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            !f[2].ends_with(":0000") && inodes.contains(f[9])
        })
        .count()
}

/// The manager's open files.
fn open_fds(m: &Manager) -> usize {
    let pid = m.child.as_ref().unwrap().id();
    std::fs::read_dir(format!("/proc/{pid}/fd"))
        .unwrap()
        .count()
}

/// A raw remote client's UDP socket at `ip` (any free port).
fn peer_at(ip: Ipv4Addr) -> Peer {
    let sock = UdpSocket::bind(SocketAddrV4::new(ip, 0)).unwrap();
    let std::net::SocketAddr::V4(me) = sock.local_addr().unwrap() else {
        unreachable!("bound to an IPv4 address")
    };
    Peer { sock, me }
}

/// Say hello at `door` over TCP from `peer`'s IP for QP `qpn` at `peer`'s socket; refused,
/// the test fails.
fn hello_from(peer: &Peer, door: &Door, qpn: u32) -> Session {
    let record = peer.record(qpn);
    let mut tcp = connect_from(&peer.me.ip().to_string(), &door.endpoint);
    tcp.set_read_timeout(Some(DEADLINE)).unwrap();
    tcp.write_all(&door.hello_bytes(&record)).unwrap();
    match read_answer(&mut tcp) {
        Answer::Accepted(a) => Session {
            server: QpRecord::decode(&a.record).unwrap(),
            tcp,
            epsn: record.psn,
        },
        Answer::Refused(r, why) => panic!("hello from {} refused: {r}: {why}", peer.me),
    }
}

/// A manager serving hash-get to remote clients with `policy_edit` applied to the test
/// policy, and the address of its RoCE endpoint (learnt from a first session, closed).
struct Setup {
    m: Manager,
    _app: redn_client::Client,
    served: Served,
    roce: SocketAddrV4,
}

impl Setup {
    fn start(policy_edit: impl Fn(String) -> String) -> Setup {
        let m = Manager::start_with_dataplane(&policy_edit(policy("", "")));
        let mut app = m.client();
        let served = Served::install(&mut app, "hash-get");
        let peer = Peer::new();
        let first = peer.hello(&served.door, 0x42);
        let roce = first.server.addr;
        assert_eq!(
            peer_sockets(roce).get(peer.me.ip()),
            Some(&1),
            "a connected QP's peer has a socket of its own"
        );
        drop(first);
        let s = Setup {
            m,
            _app: app,
            served,
            roce,
        };
        s.wait_no_peer_sockets();
        s
    }

    fn door(&self) -> &Door {
        &self.served.door
    }

    fn wait_no_peer_sockets(&self) {
        let mut left = BTreeMap::new();
        let done = (0..3000).any(|_| {
            left = peer_sockets(self.roce);
            left.is_empty() || {
                std::thread::sleep(Duration::from_millis(10));
                false
            }
        });
        assert!(
            done,
            "peer sockets left open after every session ended: {left:?}"
        );
    }
}

/// Sessions opened and ended every way a remote client can, and evicted by the manager;
/// afterwards no peer socket is open and the manager holds as many files as before.
#[test]
fn every_peer_socket_closes_with_the_last_session_of_its_peer_however_it_ends() {
    // Idle sessions are evicted after 50 ms when a newcomer needs the slot.
    let s = Setup::start(|p| {
        p.replace(
            "on_violation = \"terminate\"",
            "on_violation = \"terminate\"\nevict_idle_after = \"50ms\"",
        )
    });
    let baseline = open_fds(&s.m);
    let door = s.door().clone();
    // The library's client: hello, GET, gone.
    for _ in 0..5 {
        let mut c = door.good_client();
        assert_eq!(c.get(0x2a).unwrap().as_deref(), Some(&b"hello"[..]));
        drop(c);
        // Each session's socket closed before the next (and its slot free: four at most).
        s.wait_no_peer_sockets();
    }
    // Raw clients closing with a FIN, a reset, a half-close; two QPs of one peer address
    // (one socket, two leases) ending one after the other.
    let mut peak = 0;
    for round in 0..30 {
        let peer = Peer::new();
        let a = peer.hello(&door, 0x42);
        let b = peer.hello(&door, 0x43);
        peak = peak.max(peer_sockets(s.roce).get(peer.me.ip()).copied().unwrap_or(0));
        match round % 3 {
            0 => drop(a),
            1 => reset(a.tcp),
            _ => a.tcp.shutdown(std::net::Shutdown::Write).unwrap(),
        }
        drop(b);
        s.wait_no_peer_sockets();
    }
    assert_eq!(peak, 1, "two QPs of one peer address share one socket");
    // Clients that die mid-session: the offload's answer unacknowledged, their UDP port
    // closed (its retransmissions bring ICMP port-unreachable errors to the peer socket),
    // then the connection.
    for _ in 0..10 {
        let peer = Peer::new();
        let mut session = peer.hello(&door, 0x42);
        peer.trigger_answered(&mut session);
        drop(peer);
        std::thread::sleep(Duration::from_millis(20));
        drop(session);
        s.wait_no_peer_sockets();
    }
    // Sessions whose QP the client put in error.
    for _ in 0..10 {
        let peer = Peer::new();
        let session = peer.hello(&door, 0x42);
        peer.write_to_a_bad_key(&session);
        peer.next_syndrome();
        drop(session);
        s.wait_no_peer_sockets();
    }
    // Evicted: four idle sessions hold every slot; four newcomers take them.
    let holders: Vec<(Peer, Session)> = (0..4)
        .map(|_| {
            let p = Peer::new();
            let session = p.hello(&door, 0x42);
            (p, session)
        })
        .collect();
    std::thread::sleep(Duration::from_millis(100));
    let newcomers: Vec<(Peer, Session)> = (0..4)
        .map(|_| {
            let p = Peer::new();
            let session = p.hello(&door, 0x42);
            (p, session)
        })
        .collect();
    let mut closed = 0;
    for (_, mut session) in holders {
        session
            .tcp
            .set_read_timeout(Some(Duration::from_secs(5)))
            .unwrap();
        let mut byte = [0u8; 1];
        if matches!(
            std::io::Read::read(&mut session.tcp, &mut byte),
            Ok(0) | Err(_)
        ) {
            closed += 1;
        }
    }
    assert_eq!(closed, 4, "every idle holder was evicted");
    let mut open = 0;
    let four = (0..3000).any(|_| {
        open = peer_sockets(s.roce).values().sum::<usize>();
        open == 4 || {
            std::thread::sleep(Duration::from_millis(10));
            false
        }
    });
    assert!(
        four,
        "{open} peer sockets: the newcomers' 4, and the evicted ones' closed"
    );
    drop(newcomers);
    s.wait_no_peer_sockets();
    let mut now = 0;
    let settled = (0..3000).any(|_| {
        now = open_fds(&s.m);
        now == baseline || {
            std::thread::sleep(Duration::from_millis(10));
            false
        }
    });
    assert!(
        settled,
        "the manager holds {now} files after the sessions, {baseline} before"
    );
}

/// One host (127.0.0.1) holds 20 sessions from 20 UDP ports: 16 get a socket of their
/// own, the other 4 share the endpoint's main socket and are served all the same; two
/// other hosts each get theirs.
#[test]
fn one_host_takes_at_most_its_share_of_the_peer_sockets_and_the_rest_are_served() {
    let s = Setup::start(|p| p.replace("max_remote_clients = 4", "max_remote_clients = 24"));
    let door = s.door().clone();
    let mut one_host: Vec<(Peer, Session)> = (0..PER_IP + 4)
        .map(|_| {
            let p = Peer::new();
            let session = p.hello(&door, 0x42);
            (p, session)
        })
        .collect();
    let mut others: Vec<(Peer, Session)> = [2, 3]
        .iter()
        .map(|&h| {
            let p = peer_at(Ipv4Addr::new(127, 0, 0, h));
            let session = hello_from(&p, &door, 0x42);
            (p, session)
        })
        .collect();
    let sockets = peer_sockets(s.roce);
    assert_eq!(
        sockets,
        BTreeMap::from([
            (Ipv4Addr::new(127, 0, 0, 1), PER_IP),
            (Ipv4Addr::new(127, 0, 0, 2), 1),
            (Ipv4Addr::new(127, 0, 0, 3), 1),
        ]),
        "at most {PER_IP} sockets for one IP; other hosts still get theirs"
    );
    // Every session is served: the first and the last four of 127.0.0.1 (those past its
    // share, on the main socket), and the other hosts'.
    let served: Vec<usize> = [0, PER_IP, PER_IP + 1, PER_IP + 2, PER_IP + 3].to_vec();
    for i in served {
        let (p, session) = &mut one_host[i];
        let h = p.trigger_answered(session);
        assert_eq!(h.dest_qp, 0x42, "session {i} answered");
    }
    for (p, session) in &mut others {
        p.trigger_answered(session);
    }
    drop(one_host);
    drop(others);
    s.wait_no_peer_sockets();
}

/// Another user binds the endpoint's address and port, plainly and with `SO_REUSEPORT`
/// (which would let it join the port's group and take a share of its strangers'
/// datagrams): refused "address in use" both ways.
#[test]
fn another_user_cannot_bind_the_endpoints_port_even_with_so_reuseport() {
    let s = Setup::start(|p| p);
    // A session connected, so that the port has a peer socket in its SO_REUSEPORT group.
    let peer = Peer::new();
    let _session = peer.hello(s.door(), 0x42);
    let mut attacker = Attacker::start("bind-udp", &s.m.api());
    let stdin = attacker.child.stdin.as_mut().unwrap();
    writeln!(stdin, "{}", s.roce).unwrap();
    stdin.flush().unwrap();
    assert_eq!(
        attacker.line(),
        "plain=EADDRINUSE reuseport=EADDRINUSE",
        "another user bound the endpoint's port"
    );
    attacker.finish();
}

/// The attacker's side of [`another_user_cannot_bind_the_endpoints_port_even_with_so_reuseport`]
/// (role `bind-udp`): bind the address read from stdin, plainly and with `SO_REUSEPORT`
/// set first, and report how each went.
pub fn hostile_bind() {
    use nix::sys::socket::{bind, socket, AddressFamily, SockFlag, SockType, SockaddrIn};
    use std::os::fd::AsRawFd;
    let mut line = String::new();
    std::io::stdin().read_line(&mut line).unwrap();
    let at: SocketAddrV4 = line.trim().parse().unwrap();
    let attempt = |reuseport: bool| {
        let fd = socket(
            AddressFamily::Inet,
            SockType::Datagram,
            SockFlag::SOCK_CLOEXEC,
            None,
        )
        .unwrap();
        if reuseport {
            setsockopt(&fd, sockopt::ReusePort, &true).unwrap();
        }
        match bind(fd.as_raw_fd(), &SockaddrIn::from(at)) {
            Ok(()) => "bound".to_owned(),
            Err(e) => format!("{e:?}"),
        }
    };
    let (plain, reuseport) = (attempt(false), attempt(true));
    report_and_hold(&format!("plain={plain} reuseport={reuseport}"));
}

/// With the data plane listening on every address (`0.0.0.0`), each local address a hello
/// comes in on has a RoCE endpoint of its own: one host holds 20 sessions at 127.0.0.1 and
/// 20 at 127.0.0.2 (from 40 UDP ports). Its share of the peer sockets, and the manager's
/// 256 (which its fd budget keeps back), are over all the endpoints, not each.
#[test]
fn one_hosts_share_of_the_peer_sockets_is_over_every_endpoint() {
    let (_m, _app, served, port) = listening_everywhere(
        &policy("", "").replace("max_remote_clients = 4", "max_remote_clients = 48"),
    );
    let mut sessions = Vec::new();
    let mut endpoints = Vec::new();
    for local in [1, 2] {
        let mut door = served.door.clone();
        door.endpoint = format!("127.0.0.{local}:{port}");
        for _ in 0..PER_IP + 4 {
            let p = Peer::new();
            let session = hello_from(&p, &door, 0x42);
            endpoints.push(session.server.addr);
            sessions.push((p, session));
        }
    }
    endpoints.sort();
    endpoints.dedup();
    assert_eq!(endpoints.len(), 2, "an endpoint for each local address");
    let held: usize = endpoints
        .iter()
        .map(|e| peer_sockets(*e).values().sum::<usize>())
        .sum();
    assert_eq!(
        held, PER_IP,
        "127.0.0.1's peer sockets over both endpoints ({endpoints:?})"
    );
    // All served, past the share too.
    for i in [0, PER_IP + 3, PER_IP + 4, 2 * PER_IP + 7] {
        let (p, session) = &mut sessions[i];
        p.trigger_answered(session);
    }
    drop(sessions);
    for e in endpoints {
        wait_for("peer sockets left open", || peer_sockets(e).is_empty());
    }
}

/// A manager whose data plane listens on every address (`0.0.0.0`), an app serving
/// hash-get on it, and the data plane's port.
fn listening_everywhere(policy_text: &str) -> (Manager, redn_client::Client, Served, u16) {
    let m = Manager::configure(policy_text);
    let port = std::net::TcpListener::bind("0.0.0.0:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let mut config = std::fs::read_to_string(m.config()).unwrap();
    config.push_str(&format!("[dataplane]\nlisten = \"0.0.0.0:{port}\"\n"));
    std::fs::write(m.config(), config).unwrap();
    let m = m.launch(&[], &[]);
    let mut app = m.client();
    let served = Served::install(&mut app, "hash-get");
    (m, app, served, port)
}

/// Listening on every address, the data plane has a RoCE endpoint (a socket, an epoll
/// set, an eventfd, a receive thread) for each local address a hello comes in on: a
/// client says hello at 40 addresses of 127/8, one after another, each session closed. At
/// most four idle endpoints are kept: the manager's files and threads come back to within
/// four endpoints' of what it had (what one costs measured from the first), and a client
/// is served after.
#[test]
fn hellos_at_many_local_addresses_leave_no_endpoint_behind() {
    let (m, _app, served, port) = listening_everywhere(&policy("", ""));
    let pid = m.child.as_ref().unwrap().id();
    let threads = || {
        std::fs::read_dir(format!("/proc/{pid}/task"))
            .unwrap()
            .count()
    };
    let (fds, tasks) = (open_fds(&m), threads());
    let hello = |n: usize| {
        let mut door = served.door.clone();
        door.endpoint = format!("127.0.0.{n}:{port}");
        let p = Peer::new();
        drop(hello_from(&p, &door, 0x42));
    };
    hello(2);
    let mut one = (0, 0);
    wait_for("the first endpoint's session never ended", || {
        one = (open_fds(&m) - fds, threads() - tasks);
        peer_sockets_anywhere(pid) == 0
    });
    assert!(one.0 > 0 && one.1 > 0, "an endpoint costs {one:?}");
    for n in 3..42 {
        hello(n);
    }
    let mut now = (0, 0);
    let bounded = (0..3000).any(|_| {
        now = (open_fds(&m), threads());
        now.0 <= fds + 4 * one.0 && now.1 <= tasks + 4 * one.1 || {
            std::thread::sleep(Duration::from_millis(10));
            false
        }
    });
    assert!(
        bounded,
        "after hellos at 40 addresses: {} files and {} threads, {fds} and {tasks} before \
         (an endpoint: {one:?})",
        now.0, now.1
    );
    let mut door = served.door.clone();
    door.endpoint = format!("127.0.0.1:{port}");
    let p = Peer::new();
    let mut session = hello_from(&p, &door, 0x42);
    p.trigger_answered(&mut session);
}
