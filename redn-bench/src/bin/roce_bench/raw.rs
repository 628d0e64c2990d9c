//! The raw UDP baselines measured beside the softnic: ping-pongs and a stream.

use super::Control;
use redn_bench::report::us;
use redn_bench::stats::{ns, stats};
use redn_sys::softnic::roce::io::{DatagramIo, UdpIo};
use std::net::{Ipv4Addr, SocketAddrV4, UdpSocket};
use std::time::Instant;

pub(crate) fn udp_socket() -> (UdpSocket, SocketAddrV4) {
    let s = UdpSocket::bind("127.0.0.1:0").expect("bind UDP");
    let a = match s.local_addr().expect("addr") {
        std::net::SocketAddr::V4(a) => a,
        std::net::SocketAddr::V6(_) => unreachable!("bound IPv4"),
    };
    (s, a)
}

/// Raw UDP ping-pong of 64 B: both ends busy-polling ("spin") or blocking; prints a row and
/// returns the p50 in ns.
pub(crate) fn udp_ping(c: &mut Control, mode: &str, n: usize) -> f64 {
    let st = stats(&udp_ping_samples(c, mode, n));
    let name = if mode == "spin" {
        "raw UDP ping-pong, both ends busy-polling"
    } else {
        "raw UDP ping-pong, both ends blocking"
    };
    println!("   {:<44} {:>9} {:>9}", name, us(st.median), us(st.p99));
    st.median
}

/// The round trips (ns) of a raw UDP ping-pong of 64 B, after a tenth more as warm-up.
pub(crate) fn udp_ping_samples(c: &mut Control, mode: &str, n: usize) -> Vec<f64> {
    c.say(&format!("echo {mode}"));
    let port: u16 = c
        .hear()
        .strip_prefix("port ")
        .and_then(|p| p.parse().ok())
        .expect("echo port");
    let (s, _) = udp_socket();
    s.connect(("127.0.0.1", port)).expect("connect UDP");
    s.set_nonblocking(mode == "spin").expect("mode");
    let mut buf = [0u8; 64];
    let mut v = Vec::with_capacity(n);
    for i in 0..n + n / 10 {
        buf[..8].copy_from_slice(&(i as u64).to_le_bytes());
        let t = Instant::now();
        s.send(&buf).expect("send");
        loop {
            match s.recv(&mut buf) {
                Ok(_) => break,
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => std::hint::spin_loop(),
                Err(e) => panic!("recv: {e}"),
            }
        }
        if i >= n / 10 {
            v.push(ns(t.elapsed()));
        }
    }
    s.send(&[0]).expect("end");
    assert_eq!(c.hear(), "ok");
    v
}

/// A raw UDP stream of `total` bytes in datagrams of min(size, 4 KiB), sent in batches as
/// the softnic sends; bytes per second the peer received.
pub(crate) fn udp_stream(c: &mut Control, size: usize, total: usize) -> f64 {
    c.say("sink");
    let port: u16 = c
        .hear()
        .strip_prefix("port ")
        .and_then(|p| p.parse().ok())
        .expect("sink port");
    let io = UdpIo::bind(SocketAddrV4::new(Ipv4Addr::LOCALHOST, 0)).expect("bind");
    let to = SocketAddrV4::new(Ipv4Addr::LOCALHOST, port);
    let dg = size.min(4096);
    let data = vec![7u8; dg];
    let batch: Vec<(SocketAddrV4, &[u8])> = (0..64).map(|_| (to, &data[..])).collect();
    let t = Instant::now();
    let mut sent = 0;
    while sent < total {
        io.send(&batch).expect("send");
        sent += 64 * dg;
    }
    for _ in 0..3 {
        io.send(&[(to, &[0u8][..])]).expect("end");
    }
    let got: f64 = c
        .hear()
        .strip_prefix("bytes ")
        .and_then(|b| b.parse().ok())
        .expect("sink bytes");
    let secs: f64 = c
        .hear()
        .strip_prefix("secs ")
        .and_then(|b| b.parse().ok())
        .expect("sink time");
    let _ = t;
    got / secs
}
