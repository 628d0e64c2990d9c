//! The data plane: corrupt hellos and hostile RoCE datagrams.

use super::*;

/// The NIC objects the manager holds (protection domains, regions, CQs, QPs).
fn nic_objects(m: &Manager) -> [u64; 4] {
    let mut c = m.raw(&m.admin());
    let r: redn_proto::api::DeviceList = c.call("io.redn.Admin.ListDevices", &(), &[]).unwrap();
    let d = &r.devices[0];
    [d.pd, d.mr, d.cq, d.qp]
}

/// Wait (up to the deadline) until the manager holds `want` NIC objects again.
fn objects_return_to(m: &Manager, want: [u64; 4]) {
    wait_for(&format!("NIC objects never returned to {want:?}"), || {
        nic_objects(m) == want
    });
}

/// A hash-get offload installed by an app on a manager with a data plane, key 0x2a holding
/// "hello" (the app's connection and its table live as long as this).
struct ServedHashGet {
    _app: redn_client::Client,
    _table: redn_client::kv::TwoChoiceTable,
    installed: redn_client::Installed,
    endpoint: String,
    token: [u8; 32],
}

impl ServedHashGet {
    fn install(m: &Manager) -> ServedHashGet {
        let mut app = m.client();
        let mut table = redn_client::kv::TwoChoiceTable::create(64).unwrap();
        let (_, installed) = app.install_table("hash-get", &mut table).unwrap();
        table.set(0x2a, b"hello").unwrap();
        let endpoint = installed.endpoint.clone().unwrap();
        let token = redn_client::remote::parse_token(&installed.token).unwrap();
        ServedHashGet {
            _app: app,
            _table: table,
            installed,
            endpoint,
            token,
        }
    }

    /// A remote client of it, connected (its first instance open).
    fn remote_client(&self) -> redn_client::remote::RemoteClient {
        redn_client::remote::RemoteClient::connect(
            self.endpoint.parse().unwrap(),
            self.installed.handle,
            &self.installed.token,
            redn_client::remote::RemoteOptions {
                timeout: DEADLINE,
                ..Default::default()
            },
        )
        .unwrap()
    }
}

#[test]
fn a_storm_of_corrupt_hellos_leaks_nothing_and_logs_no_token() {
    use std::io::Read;
    let m = Manager::start_with_dataplane(&policy("", ""));
    let served = ServedHashGet::install(&m);
    let (installed, endpoint, token) = (&served.installed, &served.endpoint, served.token);
    let baseline = nic_objects(&m);
    let hello = redn_proto::dataplane::Hello {
        handle: installed.handle,
        token,
        record: client_record("127.0.0.1"),
    }
    .encode()
    .unwrap();
    // Every byte of a valid hello corrupted in turn (two ways), then cut short at every
    // length: each gets an answer or a close, never a hang or a crash.
    let mut variants: Vec<Vec<u8>> = Vec::new();
    for i in 0..hello.len() {
        for v in [0xff, 0x00] {
            let mut h = hello.clone();
            if h[i] != v {
                h[i] = v;
                variants.push(h);
            }
        }
    }
    for cut in [1, 4, 8, 47, 48, 49, hello.len() - 1] {
        variants.push(hello[..cut].to_vec());
    }
    let mut answered = 0;
    for v in &variants {
        let mut s = std::net::TcpStream::connect(endpoint).unwrap();
        s.set_read_timeout(Some(DEADLINE)).unwrap();
        std::io::Write::write_all(&mut s, v).unwrap();
        // Then the write side closed: a header announcing more than came is answered by
        // the close, not waited for.
        s.shutdown(std::net::Shutdown::Write).unwrap();
        let mut answer = Vec::new();
        match s.read_to_end(&mut answer) {
            Ok(_) => {}
            Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => {}
            Err(e) => panic!("no answer and no close for {v:02x?}: {e}"),
        }
        if answer.starts_with(b"RDNA") {
            answered += 1;
        }
    }
    assert!(answered >= 2 * 48, "only {answered} answers");
    // Still serving, and holding no more than before once the clients are gone.
    let mut client = served.remote_client();
    assert_eq!(client.get(0x2a).unwrap().as_deref(), Some(&b"hello"[..]));
    drop(client);
    objects_return_to(&m, baseline);
    assert!(!m.log().contains(&installed.token), "the token was logged");
}

/// Say a raw hello for offload `handle` (as a client at 127.0.0.1) and return the manager's
/// exchange record from its answer, with the TCP connection that holds the instance.
fn raw_hello(
    endpoint: &str,
    handle: u64,
    token: [u8; 32],
) -> (redn_sys::softnic::roce::QpRecord, std::net::TcpStream) {
    let s = std::net::TcpStream::connect(endpoint).unwrap();
    hello_on(s, handle, token)
}

/// [`raw_hello`] on a connection already made.
fn hello_on(
    mut s: std::net::TcpStream,
    handle: u64,
    token: [u8; 32],
) -> (redn_sys::softnic::roce::QpRecord, std::net::TcpStream) {
    use redn_proto::dataplane::{Answer, Hello};
    let hello = Hello {
        handle,
        token,
        record: client_record("127.0.0.1"),
    }
    .encode()
    .unwrap();
    s.set_read_timeout(Some(DEADLINE)).unwrap();
    s.write_all(&hello).unwrap();
    match read_answer(&mut s) {
        Answer::Accepted(a) => (
            redn_sys::softnic::roce::QpRecord::decode(&a.record).unwrap(),
            s,
        ),
        Answer::Refused(why, text) => panic!("hello refused: {why}: {text}"),
    }
}

#[test]
fn hostile_roce_datagrams_are_dropped_unanswered_counted_and_serving_goes_on() {
    use redn_sys::softnic::roce::packet::{self, opcode, Header, Route};
    let m = Manager::start_with_dataplane(&policy("", ""));
    let served = ServedHashGet::install(&m);
    let (installed, endpoint, token) = (&served.installed, &served.endpoint, served.token);
    let mut client = served.remote_client();
    assert_eq!(client.get(0x2a).unwrap().as_deref(), Some(&b"hello"[..]));
    // A connected QP of the manager's (its peer is 127.0.0.1:4791, which this test is not),
    // and where it listens.
    let (server, _held) = raw_hello(endpoint, installed.handle, token);
    let attacker = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
    let std::net::SocketAddr::V4(from) = attacker.local_addr().unwrap() else {
        unreachable!("bound to an IPv4 address")
    };
    let route = Route {
        src: from,
        dst: server.addr,
    };
    let well_formed = |qpn: u32, psn: u32| {
        let mut d = Vec::new();
        packet::encode(
            &mut d,
            &route,
            &Header::new(opcode::SEND_ONLY, qpn, psn),
            &[0x41; 64],
        );
        d
    };
    let dropped = |m: &Manager| {
        let list: redn_proto::api::DeviceList =
            m.admin_call("io.redn.Admin.ListDevices", serde_json::json!({}));
        list.devices[0].clone()
    };
    // In bursts the socket buffer holds, each counted before the next (on a loaded
    // machine the kernel would drop what a slow receiver has no room for, uncounted).
    let rounds = 200u32;
    for burst in 0..rounds / 20 {
        for i in burst * 20..(burst + 1) * 20 {
            // Every PSN of the connected QP, from a sender that is not its peer.
            attacker
                .send_to(
                    &well_formed(server.qpn, server.psn.wrapping_add(i) & 0xff_ffff),
                    server.addr,
                )
                .unwrap();
            // QPs that do not exist.
            attacker
                .send_to(&well_formed(0x80_0000 | i, i), server.addr)
                .unwrap();
            // A good packet with one bit of its ICRC flipped, and one cut short.
            let mut bad = well_formed(server.qpn, i);
            let last = bad.len() - 1;
            bad[last] ^= 1;
            attacker.send_to(&bad, server.addr).unwrap();
            attacker.send_to(&bad[..7], server.addr).unwrap();
        }
        let want = u64::from(4 * 20 * (burst + 1));
        wait_for("the manager never counted the hostile datagrams", || {
            dropped(&m).packets_dropped >= want
        });
    }
    let dev = dropped(&m);
    for (reason, at_least) in [
        ("wrong_source", rounds),
        ("unknown_qp", rounds),
        ("bad_icrc", rounds),
        ("truncated", rounds),
    ] {
        let n = dev.packet_drops.get(reason).copied().unwrap_or(0);
        assert!(
            n >= u64::from(at_least),
            "{reason}: {n} drops, {:?}",
            dev.packet_drops
        );
    }
    assert_eq!(dev.packets_dropped, dev.packet_drops.values().sum::<u64>());
    // Nothing came back: no NAK, no ACK, nothing that says which QPs exist.
    attacker.set_nonblocking(true).unwrap();
    let mut buf = [0u8; 2048];
    match attacker.recv_from(&mut buf) {
        Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
        other => panic!("the manager answered a hostile datagram: {other:?}"),
    }
    // The client is served as before, and the flood is in the counters an operator reads.
    assert_eq!(client.get(0x2a).unwrap().as_deref(), Some(&b"hello"[..]));
    let admin = m.admin().display().to_string();
    let out = stdout_of(
        Command::new(env!("CARGO_BIN_EXE_redn")).args(["-s", &admin, "-j", "-d", "dev", "show"]),
    );
    let rows: serde_json::Value = serde_json::from_str(&out).unwrap();
    let drops = rows[0]["packet_drops"].as_str().unwrap_or_default();
    assert!(
        drops.contains("wrong_source=") && drops.contains("unknown_qp="),
        "{out}"
    );
}

#[test]
fn a_remote_client_left_in_the_backlog_by_a_failed_accept_is_taken_once_fds_free_up() {
    // As for the varlink sockets: the data plane's listener is edge-triggered too.
    let m = Manager::start_with_dataplane(&policy("", ""));
    let served = ServedHashGet::install(&m);
    let (starved, waiting) = FdStarvation::connect_while_starved(&m, "AcceptFailed", || {
        std::net::TcpStream::connect(&served.endpoint).unwrap()
    });
    starved.end();
    // Nothing else connects: the waiting connection alone must be taken and served.
    let (record, _held) = hello_on(waiting, served.installed.handle, served.token);
    assert_ne!(record.qpn, 0);
    assert_eq!(m.log().matches("AcceptFailed").count(), 1, "{}", m.log());
    let mut client = served.remote_client();
    assert_eq!(client.get(0x2a).unwrap().as_deref(), Some(&b"hello"[..]));
}
