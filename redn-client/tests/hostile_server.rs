//! A hostile or broken server against the client library: a fake data plane on TCP that
//! answers the hello badly, a fake manager whose RoCE side attacks the client's memory, and
//! a fake varlink manager socket. What must hold: no panic, no hang past the client's
//! timeout, no allocation sized by the server, no access to client memory but writes into
//! the response region, and a named error for every bad answer.

// Lengths here are small constants: no cast in this file can lose a bit that matters.
#![allow(clippy::cast_possible_truncation)]

use redn_client::remote::{RemoteClient, RemoteOptions};
use redn_client::Error;
use redn_program::wqe::{Payload, RemoteAddr, WorkRequest, WqeFlags, WrOp};
use redn_proto::dataplane::{Accepted, Answer, Hello, HELLO_HEADER_LEN};
use redn_sys::mem::SharedBuffer;
use redn_sys::nic::{Completion, CqConfig, Nic, QpConfig};
use redn_sys::softnic::roce::{QpRecord, RegionRecord, RoceConfig, RoceEndpoint};
use redn_sys::softnic::{SoftNic, SoftNicConfig};
use redn_sys::{Access, Cqn, Pdn, Qpn, Rkey, VirtAddr};
use std::io::{Read, Write};
use std::net::{Ipv4Addr, SocketAddr, SocketAddrV4, TcpListener, TcpStream};
use std::sync::mpsc;
use std::sync::Arc;
use std::time::{Duration, Instant};

fn token() -> String {
    "ab".repeat(32)
}

fn opts(timeout: Duration) -> RemoteOptions {
    RemoteOptions {
        timeout,
        source: None,
    }
}

/// Run `f` on a thread; panic if it takes longer than `limit` (a hang), or panics.
fn within<T: Send + 'static>(limit: Duration, f: impl FnOnce() -> T + Send + 'static) -> T {
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(f());
    });
    match rx.recv_timeout(limit) {
        Ok(v) => v,
        Err(mpsc::RecvTimeoutError::Timeout) => panic!("still running after {limit:?}"),
        Err(mpsc::RecvTimeoutError::Disconnected) => panic!("the client panicked"),
    }
}

/// A listener on loopback whose every connection is handed to `serve` with its index, on
/// a thread of its own.
fn fake_dataplane(
    serve: impl Fn(usize, TcpStream) + Send + Sync + 'static,
) -> (SocketAddr, Arc<std::sync::atomic::AtomicUsize>) {
    let l = TcpListener::bind("127.0.0.1:0").expect("bind");
    let addr = l.local_addr().expect("addr");
    let count = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let seen = Arc::clone(&count);
    let serve = Arc::new(serve);
    std::thread::spawn(move || {
        for (i, s) in l.incoming().enumerate() {
            let Ok(s) = s else { continue };
            seen.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            let serve = Arc::clone(&serve);
            std::thread::spawn(move || serve(i, s));
        }
    });
    (addr, count)
}

/// Read a whole hello from `s`.
fn read_hello(s: &mut TcpStream) -> Option<Hello> {
    let mut b = vec![0u8; HELLO_HEADER_LEN];
    s.read_exact(&mut b).ok()?;
    let len = Hello::frame_len(&b).ok()??;
    b.resize(len, 0);
    s.read_exact(&mut b[HELLO_HEADER_LEN..]).ok()?;
    Hello::decode(&b).ok()
}

/// A plausible record of a manager at `ip` (nobody listens at its port).
fn manager_record(ip: Ipv4Addr) -> QpRecord {
    let mut r = QpRecord::new(0x42, 7, SocketAddrV4::new(ip, 9));
    r.regions.push(RegionRecord {
        name: "table".into(),
        addr: 0x5500_0000_0000,
        rkey: 0,
        len: 64 << 10,
        rights: 0,
    });
    r
}

fn accepted(offload: &str, trigger_len: u32, record: Vec<u8>) -> Vec<u8> {
    Answer::Accepted(Accepted {
        invocations: 0,
        trigger_len,
        offload: offload.into(),
        record,
    })
    .encode()
    .expect("answer")
}

/// A data plane that reads the hello and writes `answer`, then holds the connection open
/// for a while.
fn answering(answer: Vec<u8>) -> SocketAddr {
    answering_then(answer, Duration::from_secs(30))
}

/// A data plane that reads the hello, writes `answer` and closes `hold` later.
fn answering_then(answer: Vec<u8>, hold: Duration) -> SocketAddr {
    fake_dataplane(move |_, mut s| {
        if read_hello(&mut s).is_some() {
            let _ = s.write_all(&answer);
            std::thread::sleep(hold);
        }
    })
    .0
}

/// `RemoteClient::connect` to `addr` within a generous deadline.
fn connect(addr: SocketAddr, timeout: Duration) -> Result<RemoteClient, Error> {
    within(timeout * 3 + Duration::from_secs(5), move || {
        RemoteClient::connect(addr, 1, &token(), opts(timeout))
    })
}

fn kind(r: &Result<RemoteClient, Error>) -> String {
    match r {
        Ok(_) => "connected".into(),
        Err(e) => redn_client::error_chain(e),
    }
}

#[test]
fn an_answer_dribbled_a_byte_at_a_time_times_out_on_the_clients_clock() {
    // Every byte comes within the timeout of the one before, the whole answer long after.
    let answer = accepted(
        "hash-get",
        14,
        manager_record(Ipv4Addr::LOCALHOST).encode().unwrap(),
    );
    let (addr, _) = fake_dataplane(move |_, mut s| {
        if read_hello(&mut s).is_none() {
            return;
        }
        for b in &answer {
            if s.write_all(&[*b]).is_err() {
                return;
            }
            std::thread::sleep(Duration::from_millis(150));
        }
    });
    let t0 = Instant::now();
    let r = connect(addr, Duration::from_millis(600));
    assert!(
        matches!(r, Err(Error::Timeout { .. })),
        "{} after {:?}",
        kind(&r),
        t0.elapsed()
    );
    assert!(t0.elapsed() < Duration::from_secs(3), "{:?}", t0.elapsed());
}

#[test]
fn an_absurd_trigger_length_is_refused_before_anything_is_sized_from_it() {
    // list-find sizes its trigger from the answer's trigger length: 2^32 - 1 would be a
    // 4 GiB trigger, and no trigger over a WQE's inline room (under 1 KiB) can be sent.
    for len in [u32::MAX, 1 << 20, 4096] {
        let addr = answering(accepted(
            "list-find",
            len,
            manager_record(Ipv4Addr::LOCALHOST).encode().unwrap(),
        ));
        let r = connect(addr, Duration::from_secs(2));
        assert!(
            matches!(&r, Err(Error::BadAnswer { detail, .. }) if detail.contains("trigger")),
            "trigger length {len}: {}",
            kind(&r)
        );
    }
}
#[test]
fn a_manager_record_naming_another_host_is_refused() {
    // The client would send its triggers (its keys) to whoever the record names: a third
    // host, the network's broadcast address.
    for ip in [
        Ipv4Addr::new(10, 1, 2, 3),
        Ipv4Addr::BROADCAST,
        Ipv4Addr::new(127, 0, 0, 2),
    ] {
        let addr = answering(accepted(
            "hash-get",
            14,
            manager_record(ip).encode().unwrap(),
        ));
        let r = connect(addr, Duration::from_secs(2));
        assert!(
            matches!(&r, Err(Error::BadAnswer { detail, .. }) if detail.contains(&ip.to_string())),
            "{ip}: {}",
            kind(&r)
        );
    }
}
#[test]
fn a_table_region_at_the_top_of_the_address_space_is_a_named_error() {
    // get() computes bucket addresses from the table region the manager names.
    for (at, len) in [
        (u64::MAX - 100, u64::MAX),
        (u64::MAX - 17, 18),
        (1 << 63, u64::MAX),
    ] {
        let mut rec = manager_record(Ipv4Addr::LOCALHOST);
        rec.regions[0].addr = at;
        rec.regions[0].len = len;
        let addr = answering(accepted("hash-get", 14, rec.encode().unwrap()));
        let mut c = connect(addr, Duration::from_millis(500)).expect("connect");
        let r = within(Duration::from_secs(10), move || {
            (1..=20u64).map(|k| c.get(k)).find(Result::is_err)
        });
        assert!(
            matches!(&r, Some(Err(Error::BadAnswer { .. }))),
            "table at {at:#x}, {len} bytes: {r:?}"
        );
    }
}

/// A fake manager's RoCE side: a softnic of its own whose QP is connected to the client's,
/// with memory to land triggers in.
struct Rogue {
    nic: SoftNic,
    _ep: RoceEndpoint,
    cq: Cqn,
    qp: Qpn,
    mr: redn_sys::nic::MrInfo,
    _mem: Arc<SharedBuffer>,
    /// The client's record.
    client: QpRecord,
    stream: TcpStream,
}

const ROGUE_MEM: usize = 1 << 20;

impl Rogue {
    /// Read the hello on `s`, connect a QP to the client's and answer as `offload`.
    fn answer(mut stream: TcpStream, offload: &str, trigger_len: u32) -> Option<Rogue> {
        let hello = read_hello(&mut stream)?;
        let client = QpRecord::decode(&hello.record).ok()?;
        let nic = SoftNic::new(SoftNicConfig::new("rogue")).ok()?;
        let mut cfg = RoceConfig::new(Ipv4Addr::LOCALHOST);
        cfg.bind.set_port(0);
        let ep = RoceEndpoint::start(&nic, &cfg).ok()?;
        let pd: Pdn = nic.alloc_pd().ok()?;
        let cq = nic.create_cq(CqConfig::new(1024)).ok()?;
        let qp = nic.create_qp(QpConfig::new(pd, cq)).ok()?.qpn;
        let mem = SharedBuffer::new(ROGUE_MEM);
        let mr = nic
            .reg_mr(pd, &mem, 0, ROGUE_MEM, Access::LOCAL_WRITE)
            .ok()?;
        for i in 0..32u64 {
            nic.post_recv(qp, 1000 + i, &[mr.sge(i * 4096, 4096)])
                .ok()?;
        }
        let mut ours = ep.record(qp, 99);
        for name in ["table", "list"] {
            ours.regions.push(RegionRecord {
                name: name.into(),
                addr: 0x5500_0000_0000,
                rkey: 0,
                len: 64 << 10,
                rights: 0,
            });
        }
        ep.connect(&ours, &client).ok()?;
        stream
            .write_all(&accepted(offload, trigger_len, ours.encode().ok()?))
            .ok()?;
        Some(Rogue {
            nic,
            _ep: ep,
            cq,
            qp,
            mr,
            _mem: mem,
            client,
            stream,
        })
    }

    fn response(&self) -> RegionRecord {
        self.client
            .region("response")
            .cloned()
            .expect("a response region")
    }

    /// Where the response region's byte `off` is, with its key.
    fn at(&self, off: i64) -> RemoteAddr {
        let r = self.response();
        RemoteAddr {
            addr: VirtAddr(r.addr.wrapping_add_signed(off)),
            rkey: Rkey(r.rkey),
        }
    }

    /// The next completion `pick` takes, within 10 s.
    fn wait(&self, mut pick: impl FnMut(&Completion) -> bool) -> Option<Completion> {
        let end = Instant::now() + Duration::from_secs(10);
        let mut out = Vec::new();
        while Instant::now() < end {
            out.clear();
            self.nic.poll_cq(self.cq, 16, &mut out).ok()?;
            if let Some(c) = out.iter().find(|c| pick(c)) {
                return Some(*c);
            }
            std::thread::sleep(Duration::from_micros(200));
        }
        None
    }

    /// Wait for the client's trigger.
    fn trigger(&self) -> bool {
        self.wait(|c| c.wr_id >= 1000 && c.is_ok()).is_some()
    }
}

type Outcome = (usize, Option<Result<(), redn_program::wqe::Syndrome>>);

/// A fake data plane whose `i`-th connection gets a rogue that runs `script(i, rogue)`, sends
/// its outcome and then holds the connection open.
fn rogue_dataplane(
    offload: &'static str,
    trigger_len: u32,
    script: impl Fn(usize, &Rogue) -> Option<Result<(), redn_program::wqe::Syndrome>>
        + Send
        + Sync
        + 'static,
) -> (SocketAddr, mpsc::Receiver<Outcome>) {
    let (tx, rx) = mpsc::channel();
    let tx = std::sync::Mutex::new(tx);
    let (addr, _) = fake_dataplane(move |i, s| {
        let Some(r) = Rogue::answer(s, offload, trigger_len) else {
            return;
        };
        let out = script(i, &r);
        let _ = tx.lock().unwrap().send((i, out));
        std::thread::sleep(Duration::from_secs(20));
        drop(r.stream);
    });
    (addr, rx)
}

#[test]
fn responses_streamed_to_one_trigger_are_bounded() {
    // list-find's answer ends with an empty response; this server never sends it, and
    // streams 2 KiB answers for as long as the client takes them.
    let (addr, rx) = rogue_dataplane("list-find", 56, |_, r| {
        if !r.trigger() {
            return None;
        }
        let end = Instant::now() + Duration::from_secs(8);
        let mut sent = 0u64;
        while Instant::now() < end {
            let burst: Vec<WorkRequest> = (0..8)
                .map(|i| WorkRequest {
                    wr_id: 100 + i,
                    flags: if i == 7 {
                        WqeFlags::SIGNALED
                    } else {
                        WqeFlags::NONE
                    },
                    op: WrOp::Write {
                        remote: r.at(0),
                        payload: Payload::Sgl(vec![r.mr.sge(0, 2048)]),
                        imm: Some(1),
                    },
                })
                .collect();
            if r.nic.post_send(r.qp, &burst).is_err() {
                break;
            }
            match r.wait(|c| c.wr_id == 107) {
                Some(c) if c.is_ok() => sent += 8,
                _ => break,
            }
        }
        eprintln!("the rogue wrote {sent} responses");
        Some(Ok(()))
    });
    let timeout = Duration::from_secs(4);
    let mut c = connect(addr, timeout).expect("connect");
    let t0 = Instant::now();
    let r = within(Duration::from_secs(30), move || c.find(5));
    eprintln!("find: {r:?} after {:?}", t0.elapsed());
    let _ = rx.recv_timeout(Duration::from_secs(20));
    assert!(
        matches!(&r, Err(Error::BadAnswer { detail, .. }) if detail.contains("responses")),
        "{r:?}"
    );
}

/// A fake manager socket whose first connection gets `serve` (after the call it reads).
fn fake_manager(
    serve: impl FnOnce(std::os::unix::net::UnixStream) + Send + 'static,
) -> std::path::PathBuf {
    use std::sync::atomic::{AtomicUsize, Ordering};
    static N: AtomicUsize = AtomicUsize::new(0);
    let path = std::env::temp_dir().join(format!(
        "redn-hostile-{}-{}.sock",
        std::process::id(),
        N.fetch_add(1, Ordering::SeqCst)
    ));
    let _ = std::fs::remove_file(&path);
    let l = std::os::unix::net::UnixListener::bind(&path).expect("bind");
    std::thread::spawn(move || {
        if let Ok((s, _)) = l.accept() {
            serve(s);
        }
    });
    path
}

/// Read one call (up to its NUL) from `s`.
fn read_call(s: &mut std::os::unix::net::UnixStream) -> Option<Vec<u8>> {
    let mut call = Vec::new();
    let mut b = [0u8; 1];
    loop {
        s.read_exact(&mut b).ok()?;
        if b[0] == 0 {
            return Some(call);
        }
        call.push(b[0]);
    }
}

#[test]
fn a_reply_dribbled_a_byte_at_a_time_times_out_on_the_callers_clock() {
    let path = fake_manager(|mut s| {
        if read_call(&mut s).is_none() {
            return;
        }
        for b in b"{\"parameters\":{\"padding\":\"..........................\"}}\0" {
            if s.write_all(&[*b]).is_err() {
                return;
            }
            std::thread::sleep(Duration::from_millis(150));
        }
    });
    let t0 = Instant::now();
    let r = within(Duration::from_secs(30), move || {
        let mut c = redn_proto::client::Connection::connect(&path, Duration::from_millis(600))
            .expect("connect");
        c.call_raw("io.redn.Manager.GetInfo", Default::default(), &[])
            .map(|_| ())
    });
    assert!(
        matches!(&r, Err(redn_proto::Error::Io { source, .. }) if source.kind() == std::io::ErrorKind::TimedOut),
        "{r:?} after {:?}",
        t0.elapsed()
    );
    assert!(t0.elapsed() < Duration::from_secs(3), "{:?}", t0.elapsed());
}

#[test]
fn a_manager_that_never_reads_cannot_hold_a_large_call_for_ever() {
    let path = fake_manager(|s| {
        std::thread::sleep(Duration::from_secs(30));
        drop(s);
    });
    let t0 = Instant::now();
    let r = within(Duration::from_secs(30), move || {
        let mut c = redn_proto::client::Connection::connect(&path, Duration::from_millis(600))
            .expect("connect");
        let p = std::collections::HashMap::from([("offload", "x".repeat(8 << 20))]);
        c.call::<_, std::collections::HashMap<String, String>>(
            "io.redn.Manager.InstallOffload",
            &p,
            &[],
        )
        .map(|_| ())
    });
    assert!(
        matches!(&r, Err(redn_proto::Error::Io { source, .. }) if matches!(source.kind(), std::io::ErrorKind::TimedOut | std::io::ErrorKind::WouldBlock)),
        "{r:?} after {:?}",
        t0.elapsed()
    );
    assert!(t0.elapsed() < Duration::from_secs(3), "{:?}", t0.elapsed());
}

#[test]
fn replies_no_call_asked_for_are_refused_not_taken_for_the_next_calls() {
    let path = fake_manager(|mut s| {
        // Two replies to the first call; the second call's own reply after it.
        if read_call(&mut s).is_none() {
            return;
        }
        let _ = s.write_all(b"{\"parameters\":{\"n\":1}}\0{\"parameters\":{\"n\":2}}\0");
        if read_call(&mut s).is_none() {
            return;
        }
        let _ = s.write_all(b"{\"parameters\":{\"n\":3}}\0");
        // A reply that says more follow, to a call that did not ask for more.
        if read_call(&mut s).is_none() {
            return;
        }
        let _ = s.write_all(
            b"{\"parameters\":{\"n\":4},\"continues\":true}\0{\"parameters\":{\"n\":5}}\0",
        );
        std::thread::sleep(Duration::from_secs(5));
    });
    let calls = within(Duration::from_secs(20), move || {
        let mut c = redn_proto::client::Connection::connect(&path, Duration::from_secs(2))
            .expect("connect");
        let mut n = || {
            c.call_raw("io.redn.Manager.GetInfo", Default::default(), &[])
                .map(|p| p.get("n").and_then(serde_json_value_u64))
        };
        let first = n();
        std::thread::sleep(Duration::from_millis(200));
        (first, n(), n(), n())
    });
    let (first, second, third, fourth) = calls;
    assert_eq!(first.as_ref().ok(), Some(&Some(1)), "{first:?}");
    assert!(
        matches!(&second, Err(redn_proto::Error::Protocol { .. })),
        "the second call took the first call's second reply: {second:?}"
    );
    // The stray reply is dropped; the next call is sent and gets its own.
    assert_eq!(third.as_ref().ok(), Some(&Some(3)), "{third:?}");
    assert!(
        matches!(&fourth, Err(redn_proto::Error::Protocol { .. })),
        "a reply that continues, to a call without more: {fourth:?}"
    );
}

/// A JSON number as a u64 (serde_json is not a dependency of these tests).
fn serde_json_value_u64<V: std::fmt::Display>(v: V) -> Option<u64> {
    v.to_string().parse().ok()
}
