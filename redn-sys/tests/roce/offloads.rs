//! The catalog's offloads served to a client in another process with no server host post,
//! and strangers' datagrams left unanswered.

use super::*;

/// The client side of an offload: triggers go out as SENDs; each response is a WRITE with
/// immediate into `resp`.
fn offload_rig(scenario: &str) -> (Local, Peer, Conn) {
    offload_rig_for(Local::new(None), scenario)
}

/// [`offload_rig`] with the client `local`.
pub(super) fn offload_rig_for(local: Local, scenario: &str) -> (Local, Peer, Conn) {
    let mut peer = Peer::spawn(scenario, None);
    let resp = RegionRecord {
        name: "response".into(),
        addr: local.buf.mr.addr.0,
        rkey: local.buf.mr.lkey.0,
        len: 128 << 10,
        rights: 7,
    };
    let c = local.connect(&mut peer, 4096, vec![resp]);
    (local, peer, c)
}

fn trigger(local: &Local, c: &Conn, msg: &[u8], responses: usize) -> Vec<(u32, Vec<u8>)> {
    for i in 0..responses {
        local.nic.post_recv(c.qp, i as u64, &[]).unwrap();
    }
    local
        .nic
        .post_send(
            c.qp,
            &[wr(
                0,
                redn_program::wqe::WqeFlags::NONE,
                WrOp::Send {
                    payload: Payload::Inline(msg.to_vec()),
                    imm: None,
                },
            )],
        )
        .unwrap();
    wait_cqes(&local.nic, c.cq, responses)
        .iter()
        .map(|r| {
            assert!(r.is_ok(), "response failed: {r:?}");
            (
                r.imm.unwrap_or(u32::MAX),
                local.buf.read(0, r.byte_len as usize),
            )
        })
        .collect()
}

fn bucket(c: &Conn, i: u64) -> [u8; 8] {
    (c.remote.region("data").unwrap().addr + i * BUCKET_STRIDE).to_be_bytes()
}

fn host_posts(report: &str) -> u64 {
    report
        .trim()
        .strip_prefix("host_posts ")
        .unwrap()
        .parse()
        .unwrap()
}

#[test]
fn hash_get_served_to_another_process_with_no_server_posts() {
    hash_gets(offload_rig("offload:hash-get"));
}

/// Three GETs (two hits, a miss) of the hash-get peer's offload, with no server host post.
pub(super) fn hash_gets((local, mut peer, c): (Local, Peer, Conn)) {
    for (n, (key, b)) in [(0x5003u64, 3u64), (0x42, 3), (0x500a, 10)]
        .into_iter()
        .enumerate()
    {
        let msg = [&catalog::trigger_key(key)[..], &bucket(&c, b)].concat();
        let expect = if key == 0x42 { vec![] } else { value(b, 48) };
        assert_eq!(
            trigger(&local, &c, &msg, 1),
            vec![(n as u32, expect)],
            "GET {key:#x}"
        );
    }
    assert_eq!(host_posts(&peer.finish()), 0);
}

#[test]
fn server_loop_served_to_another_process_with_no_server_posts() {
    let (local, mut peer, c) = offload_rig("offload:server-loop");
    for i in 0..40u64 {
        let b = i % 17;
        let key = if b < 16 { 0x5000 + b } else { 0x1 };
        let msg = [&catalog::trigger_key(key)[..], &bucket(&c, b % 16)].concat();
        let expect = if b < 16 { value(b, 48) } else { vec![] };
        assert_eq!(trigger(&local, &c, &msg, 1), vec![(0, expect)], "GET {i}");
    }
    assert_eq!(host_posts(&peer.finish()), 0);
}

#[test]
fn list_find_served_to_another_process_with_no_server_posts() {
    let (local, mut peer, c) = offload_rig("offload:list-find");
    let head = c.remote.region("data").unwrap().addr;
    let msg = |key: u64| {
        let mut m = head.to_be_bytes().to_vec();
        for _ in 0..6 {
            m.extend(catalog::trigger_key(key));
        }
        m
    };
    // Found at position 2: the value, then the end-of-walk answer; not found: only that.
    let got = trigger(&local, &c, &msg(0x7002), 2);
    assert_eq!(got, vec![(0, value(2, 32)), (0, vec![])]);
    let got = trigger(&local, &c, &msg(0xdead), 1);
    assert_eq!(got, vec![(1, vec![])]);
    assert_eq!(host_posts(&peer.finish()), 0);
}

/// Unknown QPs and forged sources get no answer, whatever they send.
#[test]
fn strangers_get_no_reply() {
    let local = Local::new(None);
    let mut peer = Peer::spawn("memory", None);
    let c = local.connect(&mut peer, 1024, vec![]);
    let sock = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
    sock.set_read_timeout(Some(Duration::from_millis(50)))
        .unwrap();
    let from = match sock.local_addr().unwrap() {
        std::net::SocketAddr::V4(a) => a,
        std::net::SocketAddr::V6(_) => unreachable!(),
    };
    let to = local.ep.local_addr();
    let route = redn_sys::softnic::roce::packet::Route { src: from, dst: to };
    let mut h = redn_sys::softnic::roce::packet::Header::new(
        redn_sys::softnic::roce::packet::opcode::SEND_ONLY,
        c.qp.0 + 100,
        0,
    );
    h.ack_req = true;
    let mut d = Vec::new();
    redn_sys::softnic::roce::packet::encode(&mut d, &route, &h, b"hi");
    sock.send_to(&d, to).unwrap();
    h.dest_qp = c.qp.0;
    d.clear();
    redn_sys::softnic::roce::packet::encode(&mut d, &route, &h, b"hi");
    sock.send_to(&d, to).unwrap();
    let deadline = Instant::now() + patience(10);
    while local.ep.drops().get(DropReason::WrongSource) == 0
        || local.ep.drops().get(DropReason::UnknownQp) == 0
    {
        assert!(
            Instant::now() < deadline,
            "{:?}",
            local.ep.drops().snapshot()
        );
        std::thread::yield_now();
    }
    let mut buf = [0u8; 64];
    assert!(sock.recv(&mut buf).is_err(), "no reply to a stranger");
    // The real peer is still served.
    local.write(&c, 0, b"ok", None);
    peer.finish();
    let _ = SocketAddrV4::new(Ipv4Addr::LOCALHOST, 0);
}
