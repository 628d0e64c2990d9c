//! A hostile or broken server against the client library: a fake data plane on TCP that
//! answers the hello badly, a fake manager whose RoCE side attacks the client's memory, and
//! a fake varlink manager socket. What must hold: no panic, no hang past the client's
//! timeout, no allocation sized by the server, no access to client memory but writes into
//! the response region, and a named error for every bad answer.

// Lengths here are small constants: no cast in this file can lose a bit that matters.
#![allow(clippy::cast_possible_truncation)]

use redn_client::baseline::{BaselineOptions, RpcClient};
use redn_client::remote::{RemoteClient, RemoteOptions};
use redn_client::{Error, ManagerInfo};
use redn_program::wqe::{Payload, RemoteAddr, Sge, WorkRequest, WqeFlags, WrOp};
use redn_proto::dataplane::{
    Accepted, Answer, Hello, Refusal, ANSWER_HEADER_LEN, HELLO_HEADER_LEN,
};
use redn_sys::mem::SharedBuffer;
use redn_sys::nic::{Completion, CqConfig, Nic, QpConfig};
use redn_sys::softnic::roce::{QpRecord, RegionRecord, RoceConfig, RoceEndpoint};
use redn_sys::softnic::{SoftNic, SoftNicConfig};
use redn_sys::{Access, Cqn, Pdn, Qpn, Rkey, VirtAddr};
use std::io::{Read, Write};
use std::net::{Ipv4Addr, SocketAddr, SocketAddrV4, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
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

/// `f()`, with how long it took.
fn clocked<T>(f: impl FnOnce() -> T) -> (T, Duration) {
    let t0 = Instant::now();
    let r = f();
    (r, t0.elapsed())
}

/// How long a call with a 600 ms timeout may take against a server that stalls it.
const PROMPT: Duration = Duration::from_secs(3);

/// `f` run [`within`] 30 s; panics unless it ended within [`PROMPT`].
fn promptly<T: std::fmt::Debug + Send + 'static>(f: impl FnOnce() -> T + Send + 'static) -> T {
    let (r, took) = clocked(|| within(Duration::from_secs(30), f));
    assert!(took < PROMPT, "{r:?} after {took:?}");
    r
}

/// Write `bytes` to `s` one at a time, 150 ms apart, until they end or the peer goes.
fn dribble(s: &mut impl Write, bytes: &[u8]) {
    for b in bytes {
        if s.write_all(&[*b]).is_err() {
            return;
        }
        std::thread::sleep(Duration::from_millis(150));
    }
}

/// Write 100 MiB of `byte` to `s` (no frame, no NUL in it), until the peer goes.
fn flood(s: &mut impl Write, byte: u8) {
    let chunk = vec![byte; 1 << 20];
    for _ in 0..100 {
        if s.write_all(&chunk).is_err() {
            return;
        }
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

/// The client's own record, from the hello it sends on `s`.
fn client_record(s: &mut TcpStream) -> Option<QpRecord> {
    QpRecord::decode(&read_hello(s)?.record).ok()
}

/// A plausible manager region of 64 KiB named `name`.
fn region(name: &str) -> RegionRecord {
    RegionRecord {
        name: name.into(),
        addr: 0x5500_0000_0000,
        rkey: 0,
        len: 64 << 10,
        rights: 0,
    }
}

/// A plausible record of a manager at `ip` (nobody listens at its port).
fn manager_record(ip: Ipv4Addr) -> QpRecord {
    let mut r = QpRecord::new(0x42, 7, SocketAddrV4::new(ip, 9));
    r.regions.push(region("table"));
    r
}

/// The bytes of a plausible manager record on this host.
fn local_record() -> Vec<u8> {
    manager_record(Ipv4Addr::LOCALHOST).encode().unwrap()
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

/// An accepted hash-get answer (14-byte triggers) carrying `record`.
fn hash_get(record: &QpRecord) -> Vec<u8> {
    accepted("hash-get", 14, record.encode().unwrap())
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

/// A data plane that answers each hello as hash-get with the record `ours` makes of the
/// client's, then holds the connection open for a while.
fn answering_with(ours: impl Fn(QpRecord) -> QpRecord + Send + Sync + 'static) -> SocketAddr {
    fake_dataplane(move |_, mut s| {
        let Some(client) = client_record(&mut s) else {
            return;
        };
        let _ = s.write_all(&hash_get(&ours(client)));
        std::thread::sleep(Duration::from_secs(30));
    })
    .0
}

/// Read a baseline client's hello and record from `s`; whether both came whole.
fn read_baseline_hello(s: &mut TcpStream) -> bool {
    let mut hello = [0u8; 8];
    s.read_exact(&mut hello).is_ok() && redn_sys::softnic::roce::read_record(s).is_ok()
}

/// `RpcClient::connect` to `addr` with a client timeout of `timeout`.
fn baseline_connect(addr: SocketAddr, timeout: Duration) -> Result<(), Error> {
    let options = BaselineOptions {
        timeout,
        ..BaselineOptions::default()
    };
    RpcClient::connect(addr, options).map(|_| ())
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
    let answer = hash_get(&manager_record(Ipv4Addr::LOCALHOST));
    let (addr, _) = fake_dataplane(move |_, mut s| {
        if read_hello(&mut s).is_some() {
            dribble(&mut s, &answer);
        }
    });
    let (r, took) = clocked(|| connect(addr, Duration::from_millis(600)));
    assert!(
        matches!(r, Err(Error::Timeout { .. })),
        "{} after {took:?}",
        kind(&r)
    );
    assert!(took < PROMPT, "{took:?}");
}

#[test]
fn an_absurd_trigger_length_is_refused_before_anything_is_sized_from_it() {
    // list-find sizes its trigger from the answer's trigger length: 2^32 - 1 would be a
    // 4 GiB trigger, and no trigger over a WQE's inline room (under 1 KiB) can be sent.
    for len in [u32::MAX, 1 << 20, 4096] {
        let addr = answering(accepted("list-find", len, local_record()));
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
        let addr = answering(hash_get(&manager_record(ip)));
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
        let addr = answering(hash_get(&rec));
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
        let client = client_record(&mut stream)?;
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
        ours.regions.extend(["table", "list"].map(region));
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

    /// Post `op` signaled; its completion's status, or `None` if none came in 10 s.
    fn run(&self, op: WrOp) -> Option<Result<(), redn_program::wqe::Syndrome>> {
        let wr = WorkRequest {
            wr_id: 7,
            flags: WqeFlags::SIGNALED,
            op,
        };
        if self.nic.post_send(self.qp, &[wr]).is_err() {
            return Some(Err(redn_program::wqe::Syndrome::WrFlush));
        }
        self.wait(|c| c.wr_id == 7).map(|c| c.status)
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

    /// Answer as the offload would: a WRITE with immediate of `data` at the region's start.
    fn respond(&self, data: &[u8]) -> Option<Result<(), redn_program::wqe::Syndrome>> {
        self.run(WrOp::Write {
            remote: self.at(0),
            payload: Payload::Inline(data.to_vec()),
            imm: Some(1),
        })
    }

    /// The response region's start, under its key with the bits `f` makes of them.
    fn rekeyed(&self, f: impl Fn(u32) -> u32) -> RemoteAddr {
        let mut at = self.at(0);
        at.rkey = Rkey(f(at.rkey.0));
        at
    }

    /// A gather entry of `len` bytes of the rogue's memory.
    fn local(&self, len: u32) -> Sge {
        self.mr.sge(ROGUE_MEM as u64 / 2, len)
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
fn fake_manager(serve: impl FnOnce(std::os::unix::net::UnixStream) + Send + 'static) -> PathBuf {
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

/// A fake manager socket that reads the call, writes `reply` and closes `hold` later.
fn replying(reply: Vec<u8>, hold: Duration) -> PathBuf {
    fake_manager(move |mut s| {
        let _ = read_call(&mut s);
        let _ = s.write_all(&reply);
        std::thread::sleep(hold);
    })
}

/// `Client::connect` to `path` and one `info()` call, within 30 s, with how long it took.
fn info_from(path: PathBuf) -> (Result<ManagerInfo, Error>, Duration) {
    clocked(|| {
        within(Duration::from_secs(30), move || {
            redn_client::Client::connect(&path).expect("connect").info()
        })
    })
}

/// A raw varlink connection to `path` whose calls time out after `timeout`.
fn varlink(path: &Path, timeout: Duration) -> redn_proto::client::Connection {
    redn_proto::client::Connection::connect(path, timeout).expect("connect")
}

#[test]
fn a_reply_dribbled_a_byte_at_a_time_times_out_on_the_callers_clock() {
    let path = fake_manager(|mut s| {
        if read_call(&mut s).is_some() {
            dribble(
                &mut s,
                b"{\"parameters\":{\"padding\":\"..........................\"}}\0",
            );
        }
    });
    let r = promptly(move || {
        varlink(&path, Duration::from_millis(600))
            .call_raw("io.redn.Manager.GetInfo", Default::default(), &[])
            .map(|_| ())
    });
    assert!(
        matches!(&r, Err(redn_proto::Error::Io { source, .. }) if source.kind() == std::io::ErrorKind::TimedOut),
        "{r:?}"
    );
}

#[test]
fn a_manager_that_never_reads_cannot_hold_a_large_call_for_ever() {
    let path = fake_manager(|s| {
        std::thread::sleep(Duration::from_secs(30));
        drop(s);
    });
    let r = promptly(move || {
        let p = std::collections::HashMap::from([("offload", "x".repeat(8 << 20))]);
        varlink(&path, Duration::from_millis(600))
            .call::<_, std::collections::HashMap<String, String>>(
                "io.redn.Manager.InstallOffload",
                &p,
                &[],
            )
            .map(|_| ())
    });
    assert!(
        matches!(&r, Err(redn_proto::Error::Io { source, .. }) if matches!(source.kind(), std::io::ErrorKind::TimedOut | std::io::ErrorKind::WouldBlock)),
        "{r:?}"
    );
}

#[test]
fn replies_no_call_asked_for_are_refused_not_taken_for_the_next_calls() {
    let path = fake_manager(|mut s| {
        let replies: [&[u8]; 3] = [
            // Two replies to the first call; the second call's own reply after it.
            b"{\"parameters\":{\"n\":1}}\0{\"parameters\":{\"n\":2}}\0",
            b"{\"parameters\":{\"n\":3}}\0",
            // A reply that says more follow, to a call that did not ask for more.
            b"{\"parameters\":{\"n\":4},\"continues\":true}\0{\"parameters\":{\"n\":5}}\0",
        ];
        for reply in replies {
            if read_call(&mut s).is_none() {
                return;
            }
            let _ = s.write_all(reply);
        }
        std::thread::sleep(Duration::from_secs(5));
    });
    let calls = within(Duration::from_secs(20), move || {
        let mut c = varlink(&path, Duration::from_secs(2));
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

#[test]
fn a_hostile_manager_socket_gets_named_errors_and_its_fds_are_closed() {
    use std::os::fd::AsFd;
    let info =
        b"{\"parameters\":{\"version\":\"1\",\"backend\":\"softnic\",\"app\":\"a\",\"uid\":1,\
        \"pid\":1,\"max_regions\":1,\"max_pinned\":1,\"regions\":0,\"pinned\":0,\"offloads\":0}}\0";
    // fds the reply brings unasked: 253 copies of a pipe's write end (the most one message
    // may carry), then 3 more on a reply in the middle of another message's bytes.
    let (mut read_end, write_end) = std::os::unix::net::UnixStream::pair().expect("pair");
    let path = fake_manager(move |mut s| {
        if read_call(&mut s).is_none() {
            return;
        }
        let copies: Vec<std::os::fd::OwnedFd> = (0..253)
            .map(|_| write_end.as_fd().try_clone_to_owned().expect("dup"))
            .collect();
        let fds: Vec<_> = copies.iter().map(AsFd::as_fd).collect();
        redn_proto::fds::send_with_fds(s.as_fd(), &info[..10], &fds).expect("send");
        s.write_all(&info[10..]).expect("rest");
        if read_call(&mut s).is_none() {
            return;
        }
        let three = &fds[..3];
        s.write_all(&info[..5]).expect("start");
        let _ = redn_proto::fds::send_with_fds(s.as_fd(), &info[5..], three);
        drop(copies);
        drop(write_end);
        std::thread::sleep(Duration::from_secs(5));
    });
    let r = within(Duration::from_secs(20), move || {
        let mut c = redn_client::Client::connect(&path).expect("connect");
        (c.info().map(|i| i.app), c.info().map(|i| i.app))
    });
    assert_eq!(r.0.as_ref().ok().map(String::as_str), Some("a"), "{r:?}");
    assert!(r.1.is_ok(), "{r:?}");
    // Every copy was closed in the client: the pipe's other end reads the end of file.
    read_end
        .set_read_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    let mut b = [0u8; 1];
    assert_eq!(read_end.read(&mut b).expect("EOF, not a timeout"), 0);

    // Replies that are not replies: each a named error, none a hang.
    let huge_path = fake_manager(|mut s| {
        let _ = read_call(&mut s);
        flood(&mut s, b' ');
    });
    let (r, took) = info_from(huge_path);
    assert!(
        matches!(
            &r,
            Err(Error::Protocol(redn_proto::Error::Protocol {
                limit: "message-size",
                ..
            }))
        ),
        "100 MB with no NUL: {r:?} after {took:?}"
    );
    let deep = [vec![b'['; 100_000], vec![b']'; 100_000], vec![0]].concat();
    let cases: Vec<(&str, Vec<u8>)> = vec![
        ("not JSON", b"\xff\xfe garbage\0".to_vec()),
        ("an array", b"[1,2,3]\0".to_vec()),
        ("100,000 arrays deep", deep),
        (
            "parameters of another shape",
            b"{\"parameters\":{\"version\":7}}\0".to_vec(),
        ),
        (
            "an error nobody defined",
            b"{\"error\":\"org.example.Nope\",\"parameters\":{}}\0".to_vec(),
        ),
        (
            "a known error with parameters of another shape",
            b"{\"error\":\"io.redn.Manager.QuotaExceeded\",\"parameters\":{\"limit\":[1]}}\0"
                .to_vec(),
        ),
        ("an error that is not a string", b"{\"error\":5}\0".to_vec()),
        ("the close", Vec::new()),
    ];
    for (what, reply) in cases {
        let (r, _) = info_from(replying(reply, Duration::ZERO));
        assert!(
            matches!(&r, Err(Error::Protocol(_) | Error::Refused(_))),
            "{what}: {r:?}"
        );
    }
}

/// What a bad answer must come back as.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Want {
    Malformed,
    Exchange,
    Refused,
    Dataplane,
    Timeout,
}

fn want_of(r: &Result<RemoteClient, Error>) -> Option<Want> {
    match r {
        Err(Error::Malformed(_)) => Some(Want::Malformed),
        Err(Error::Exchange(_)) => Some(Want::Exchange),
        Err(Error::RemoteRefused { .. }) => Some(Want::Refused),
        Err(Error::Dataplane { .. }) => Some(Want::Dataplane),
        Err(Error::Timeout { .. }) => Some(Want::Timeout),
        _ => None,
    }
}

/// A good record's bytes with `patch` applied.
fn record_bytes(patch: impl Fn(&mut Vec<u8>)) -> Vec<u8> {
    let mut b = local_record();
    patch(&mut b);
    b
}

/// A change to a good record's bytes.
type Patch = Box<dyn Fn(&mut Vec<u8>)>;

/// An answer's header: magic, version 1, `status` and a body length of `len`.
fn answer_header(status: u8, len: u16) -> Vec<u8> {
    let mut b = b"RDNA\x01".to_vec();
    b.push(status);
    b.extend_from_slice(&len.to_be_bytes());
    b
}

/// An accepted answer carrying `record` as it is (the encoder would refuse some).
fn accepted_raw(record: &[u8]) -> Vec<u8> {
    let mut body = Vec::new();
    body.extend_from_slice(&0u32.to_be_bytes());
    body.extend_from_slice(&14u32.to_be_bytes());
    body.push(8);
    body.extend_from_slice(b"hash-get");
    body.extend_from_slice(record);
    let mut b = answer_header(0, body.len() as u16);
    b.extend_from_slice(&body);
    b
}

#[test]
fn wrong_answers_to_the_hello_get_named_errors_within_the_timeout() {
    let timeout = Duration::from_millis(800);
    let be32 = |at: usize, v: u32| -> Patch {
        Box::new(move |b: &mut Vec<u8>| b[at..at + 4].copy_from_slice(&v.to_be_bytes()))
    };
    let be16 = |at: usize, v: u16| -> Patch {
        Box::new(move |b: &mut Vec<u8>| b[at..at + 2].copy_from_slice(&v.to_be_bytes()))
    };
    let mut refusal = answer_header(Refusal::AccessDenied.code(), 4096);
    refusal.extend(std::iter::repeat(0xff).take(4096));
    let mut short_body = answer_header(0, 100);
    short_body.extend_from_slice(&[0; 10]);
    let mut bad_name = accepted_raw(&local_record());
    bad_name[ANSWER_HEADER_LEN + 9] = 0xff;
    let mut long_name = accepted_raw(&local_record());
    long_name[ANSWER_HEADER_LEN + 8] = 200;
    let mut cases: Vec<(&str, Vec<u8>, Want)> = vec![
        (
            "an HTTP error page",
            b"HTTP/1.0 400 Bad Request\r\n\r\n".to_vec(),
            Want::Malformed,
        ),
        (
            "three bytes, then the close",
            b"RDN".to_vec(),
            Want::Dataplane,
        ),
        (
            "a body cut short, then the close",
            short_body,
            Want::Dataplane,
        ),
        (
            "a body of 65535 bytes",
            answer_header(0, u16::MAX),
            Want::Malformed,
        ),
        ("an unknown status", answer_header(200, 0), Want::Malformed),
        (
            "version 2",
            b"RDNA\x02\x00\x00\x00".to_vec(),
            Want::Malformed,
        ),
        (
            "an accepted answer with no body",
            answer_header(0, 0),
            Want::Malformed,
        ),
        (
            "a refusal of 4 KiB that is not UTF-8",
            refusal,
            Want::Refused,
        ),
        (
            "an offload name that is not UTF-8",
            bad_name,
            Want::Malformed,
        ),
        (
            "an offload name longer than the body",
            long_name,
            Want::Malformed,
        ),
    ];
    // Records the exchange must refuse, each in an otherwise good answer.
    let records: Vec<(&str, Patch)> = vec![
        ("a record cut to its header", Box::new(|b| b.truncate(32))),
        ("QPN 0", be32(8, 0)),
        ("QPN 1", be32(8, 1)),
        ("QPN 2^24", be32(8, 1 << 24)),
        ("PSN 2^24", be32(12, 1 << 24)),
        ("address 0.0.0.0", be32(16, 0)),
        ("port 0", be16(20, 0)),
        ("MTU 0", be16(22, 0)),
        ("MTU 65535", be16(22, u16::MAX)),
        ("MTU 4097", be16(22, 4097)),
        ("retry count 255", Box::new(|b| b[27] = 255)),
        ("65 regions", be16(6, 65)),
        ("a region count past the bytes", be16(6, 2)),
        (
            "a region name with bytes after its NUL",
            Box::new(|b| b[32 + 15] = b'x'),
        ),
        ("a record's magic", Box::new(|b| b[0] = b'X')),
    ];
    cases.extend(
        records
            .into_iter()
            .map(|(what, patch)| (what, accepted_raw(&record_bytes(patch)), Want::Exchange)),
    );
    let check = |what: &str, addr: SocketAddr, want: Want| {
        let (r, took) = clocked(|| connect(addr, timeout));
        assert_eq!(want_of(&r), Some(want), "{what}: {}", kind(&r));
        assert!(took < timeout + Duration::from_secs(2), "{what}: {took:?}");
    };
    for (what, answer, want) in cases {
        let addr = if what.ends_with("the close") {
            answering_then(answer, Duration::ZERO)
        } else {
            answering(answer)
        };
        check(what, addr, want);
    }

    // Silence, 100 MB of garbage, an accept and a close: a timeout, a refusal after eight
    // bytes, a named error.
    let (silent, _) = fake_dataplane(|_, mut s| {
        let _ = read_hello(&mut s);
        std::thread::sleep(Duration::from_secs(10));
    });
    let (flooding, _) = fake_dataplane(|_, mut s| flood(&mut s, b'A'));
    let (closing, _) = fake_dataplane(|_, s| drop(s));
    for (what, addr, want) in [
        ("no answer", silent, Want::Timeout),
        ("100 MB of garbage", flooding, Want::Malformed),
        ("a close at once", closing, Want::Dataplane),
    ] {
        check(what, addr, want);
    }
}

#[test]
fn a_server_that_closes_every_connection_costs_one_attempt_a_call() {
    // The first connection is served and then closed; every later one is closed at accept.
    let answer = hash_get(&manager_record(Ipv4Addr::LOCALHOST));
    let (addr, count) = fake_dataplane(move |i, mut s| {
        if i == 0 && read_hello(&mut s).is_some() {
            let _ = s.write_all(&answer);
        }
    });
    let mut c = connect(addr, Duration::from_secs(1)).expect("the first session");
    std::thread::sleep(Duration::from_millis(200));
    let (c, errors) = within(Duration::from_secs(30), move || {
        let errors: Vec<String> = (0..10)
            .map(|_| match c.get(5) {
                Ok(v) => format!("answered {v:?}"),
                Err(e) => redn_client::error_chain(&e),
            })
            .collect();
        (c, errors)
    });
    for e in &errors {
        assert!(
            e.contains("failed") && !e.contains("answered"),
            "each call fails with a named error: {errors:?}"
        );
    }
    // The closed session was noticed (stale), and each call made one attempt, no loop.
    let made = count.load(std::sync::atomic::Ordering::SeqCst);
    assert_eq!(
        made, 11,
        "connections for 1 session and 10 calls: {errors:?}"
    );
    assert!(c.session().is_none());
}

/// What a rogue posts against the client.
type Attack = Box<dyn Fn(&Rogue) -> WrOp + Send + Sync>;

/// A WRITE of 8 bytes at `remote`, without an immediate.
fn poke(remote: RemoteAddr) -> WrOp {
    WrOp::Write {
        remote,
        payload: Payload::Inline(vec![0xee; 8]),
        imm: None,
    }
}

#[test]
fn the_server_may_only_write_into_the_response_region() {
    let len = 64 << 10;
    // What each session's rogue does before the client's trigger (the first and last
    // sessions answer the trigger properly).
    let attacks: Vec<(&str, Attack)> = vec![
        (
            "READ of the response region",
            Box::new(|r: &Rogue| WrOp::Read {
                remote: r.at(0),
                sgl: vec![r.local(64)],
            }),
        ),
        (
            "WRITE just past its end",
            Box::new(move |r: &Rogue| poke(r.at(len))),
        ),
        (
            "WRITE over its end",
            Box::new(move |r: &Rogue| WrOp::Write {
                remote: r.at(len - 8),
                payload: Payload::Inline(vec![0xee; 16]),
                imm: Some(1),
            }),
        ),
        (
            "WRITE just before its start",
            Box::new(|r: &Rogue| poke(r.at(-8))),
        ),
        (
            "WRITE_IMM of 64 KiB + 1 from its start",
            Box::new(|r: &Rogue| WrOp::Write {
                remote: r.at(0),
                payload: Payload::Sgl(vec![r.mr.sge(0, 64 << 10), r.mr.sge(0, 1)]),
                imm: Some(1),
            }),
        ),
        (
            "compare and swap on it",
            Box::new(|r: &Rogue| WrOp::CompareSwap {
                remote: r.at(0),
                compare: 0,
                swap: u64::MAX,
                result: Some(r.local(8)),
            }),
        ),
        (
            "fetch and add on it",
            Box::new(|r: &Rogue| WrOp::FetchAdd {
                remote: r.at(64),
                add: 1,
                result: Some(r.local(8)),
            }),
        ),
        (
            "WRITE with the next key index",
            Box::new(|r: &Rogue| poke(r.rekeyed(|k| k.wrapping_add(0x100)))),
        ),
        (
            "WRITE with another tag",
            Box::new(|r: &Rogue| poke(r.rekeyed(|k| k ^ 0x5a))),
        ),
        (
            "READ with the previous key index",
            Box::new(|r: &Rogue| WrOp::Read {
                remote: r.rekeyed(|k| k.wrapping_sub(0x100)),
                sgl: vec![r.local(64)],
            }),
        ),
        (
            "WRITE at address 0, key 0",
            Box::new(|_: &Rogue| {
                poke(RemoteAddr {
                    addr: VirtAddr(0),
                    rkey: Rkey(0),
                })
            }),
        ),
        (
            "a SEND with a payload into a receive with no buffer",
            Box::new(|_: &Rogue| WrOp::Send {
                payload: Payload::Inline(vec![0xee; 8]),
                imm: None,
            }),
        ),
    ];
    // Each new session's rogue takes the next job: an attack's index, or `None` to answer
    // the trigger properly.
    let jobs = Arc::new(std::sync::Mutex::new(std::collections::VecDeque::from([
        None,
    ])));
    let attacks = Arc::new(attacks);
    let (script_jobs, script_attacks) = (Arc::clone(&jobs), Arc::clone(&attacks));
    let (addr, rx) = rogue_dataplane("hash-get", 14, move |_, r| {
        let job = script_jobs.lock().unwrap().pop_front()?;
        match job {
            None if r.trigger() => r.respond(b"hello"),
            None => None,
            Some(k) => script_attacks
                .get(k)
                .and_then(|(_, op): &(&str, Attack)| r.run(op(r))),
        }
    });
    let c = connect(addr, Duration::from_millis(700)).expect("connect");
    let outcome = |rx: &mpsc::Receiver<Outcome>| {
        rx.recv_timeout(Duration::from_secs(20))
            .expect("the rogue's outcome")
            .1
    };
    let (mut c, r) = trigger_within(c, Duration::from_secs(10));
    assert_eq!(outcome(&rx), Some(Ok(())));
    assert_eq!(r.expect("a proper answer")[0].data, b"hello");
    for (k, (what, _)) in attacks.iter().enumerate() {
        jobs.lock().unwrap().push_back(Some(k));
        c.reconnect().expect("a new session");
        let out = outcome(&rx);
        assert!(
            matches!(out, Some(Err(_))),
            "{what}: the rogue's request completed {out:?}"
        );
        // The client's session died of it; its next trigger goes out on a new one (at
        // once, or after failing on the dead one with a named error), answered properly.
        jobs.lock().unwrap().push_back(None);
        let (back, mut r) = trigger_within(c, Duration::from_secs(10));
        c = back;
        eprintln!("{what}: the rogue saw {out:?}, the client {r:?}");
        if let Err(e) = &r {
            assert!(
                matches!(e, Error::ResponseFailed { .. } | Error::Timeout { .. }),
                "{what}: the client's trigger got {e:?}"
            );
            let (back, again) = trigger_within(c, Duration::from_secs(10));
            (c, r) = (back, again);
        }
        assert_eq!(outcome(&rx), Some(Ok(())), "{what}: the proper answer");
        assert_eq!(
            r.expect("a proper answer after the attack")[0].data,
            b"hello"
        );
    }
}

type Answered = Result<Vec<redn_client::remote::Response>, Error>;

/// One hash-get-sized trigger from `c`, on a thread, within `limit`.
fn trigger_within(mut c: RemoteClient, limit: Duration) -> (RemoteClient, Answered) {
    within(limit, move || {
        let r = c.trigger(&[1; 14], 1);
        (c, r)
    })
}

#[test]
fn a_storm_of_naks_and_answers_to_nothing_leaves_the_client_answerable() {
    use redn_sys::softnic::roce::packet::{self, opcode, Aeth, AtomicEth, Header, Reth, Route};
    // The "manager" is a bare UDP socket of the test's: every datagram is made by hand.
    let udp = std::net::UdpSocket::bind("127.0.0.1:0").expect("udp");
    let SocketAddr::V4(rogue) = udp.local_addr().unwrap() else {
        unreachable!()
    };
    let (tx, rx) = mpsc::channel();
    let tx = std::sync::Mutex::new(tx);
    let addr = answering_with(move |client| {
        let _ = tx.lock().unwrap().send(client);
        QpRecord::new(0x42, 7, rogue)
    });
    let c = connect(addr, Duration::from_secs(5)).expect("connect");
    let client = rx
        .recv_timeout(Duration::from_secs(10))
        .expect("the client's record");
    let response = client.region("response").cloned().expect("response region");
    let to_client = Route {
        src: rogue,
        dst: client.addr,
    };
    let from_client = Route {
        src: client.addr,
        dst: rogue,
    };
    let send = |h: Header, payload: &[u8]| {
        let mut b = Vec::new();
        packet::encode(&mut b, &to_client, &h, payload);
        let _ = udp.send_to(&b, client.addr);
    };
    let waiting = std::thread::spawn(move || trigger_within(c, Duration::from_secs(30)));
    // The trigger.
    udp.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let mut buf = vec![0u8; 9000];
    let psn = loop {
        let (n, _) = udp.recv_from(&mut buf).expect("the client's trigger");
        if let Ok(p) = packet::decode(&from_client, &buf[..n]) {
            if p.header.opcode == opcode::SEND_ONLY {
                break p.header.psn;
            }
        }
    };
    let aeth = |syndrome| Some(Aeth { syndrome, msn: 1 });
    let reth = |len| {
        Some(Reth {
            va: response.addr,
            rkey: response.rkey,
            len,
        })
    };
    let mut h = Header::new(opcode::ACKNOWLEDGE, client.qpn, psn);
    for round in 0..300u32 {
        // NAKs of every kind (the requester resends or waits; none ends the session here
        // but the fatal ones), ACKs of PSNs never sent, responses to READs and atomics
        // never made, requests outside the response region, and bytes that are no packet.
        let far = psn.wrapping_add(1000 + round) & 0xff_ffff;
        for (op, at, syndrome) in [
            (opcode::ACKNOWLEDGE, far, 0x1f),
            (opcode::ACKNOWLEDGE, psn, 0x20 | 31),
            (opcode::ACKNOWLEDGE, psn.wrapping_sub(5) & 0xff_ffff, 0x60),
            (opcode::READ_RESPONSE_ONLY, psn, 0x1f),
            (opcode::READ_RESPONSE_FIRST, far, 0x1f),
            (opcode::ATOMIC_ACKNOWLEDGE, psn, 0x1f),
        ] {
            h.opcode = op;
            h.psn = at;
            h.aeth = aeth(syndrome);
            h.atomic_ack = Some(u64::MAX);
            send(h, &[0xee; 64]);
        }
        let mut w = Header::new(opcode::WRITE_ONLY, client.qpn, far);
        w.reth = reth(8);
        send(w, &[0xee; 8]);
        let mut a = Header::new(opcode::COMPARE_SWAP, client.qpn, far);
        a.atomic = Some(AtomicEth {
            va: response.addr,
            rkey: response.rkey,
            swap_add: 1,
            compare: 0,
        });
        send(a, &[]);
        let _ = udp.send_to(&[0xff; 40], client.addr);
        let _ = udp.send_to(&[0x00; 7], client.addr);
    }
    // Then the answer, as the manager's offload would send it: the ACK of the trigger and
    // a WRITE with immediate into the response region at the rogue's first PSN.
    h.opcode = opcode::ACKNOWLEDGE;
    h.psn = psn;
    h.aeth = aeth(0x1f);
    send(h, &[]);
    let mut w = Header::new(opcode::WRITE_ONLY_IMM, client.qpn, 7);
    w.reth = reth(5);
    w.imm = Some(1);
    w.ack_req = true;
    send(w, b"hello");
    let (c, r) = waiting.join().expect("the client");
    eprintln!("after the storm: {r:?}");
    match &r {
        Ok(got) => assert_eq!(got[0].data, b"hello"),
        Err(Error::ResponseFailed { .. } | Error::Timeout { .. }) => {}
        Err(e) => panic!("not a named failure of the session: {e:?}"),
    }
    drop(c);
}

#[test]
fn a_record_dribbled_a_byte_at_a_time_times_out_on_the_exchanges_clock() {
    use redn_sys::softnic::roce::{exchange_client, ExchangeError};
    let record = local_record();
    let (addr, _) = fake_dataplane(move |_, mut s| {
        let mut theirs = [0u8; 32];
        if s.read_exact(&mut theirs).is_ok() {
            dribble(&mut s, &record);
        }
    });
    let r = promptly(move || {
        let mut s = TcpStream::connect(addr).expect("connect");
        let ours = QpRecord::new(0x43, 1, SocketAddrV4::new(Ipv4Addr::LOCALHOST, 4791));
        exchange_client(&mut s, &ours, Duration::from_millis(600)).map(|_| ())
    });
    assert!(
        matches!(&r, Err(ExchangeError::Io(e)) if matches!(e.kind(), std::io::ErrorKind::TimedOut | std::io::ErrorKind::WouldBlock)),
        "{r:?}"
    );
}

#[test]
fn a_baseline_server_dribbling_its_header_times_out_on_the_clients_clock() {
    let (addr, _) = fake_dataplane(|_, mut s| {
        if read_baseline_hello(&mut s) {
            dribble(&mut s, &[0; 64]);
        }
    });
    let r = promptly(move || baseline_connect(addr, Duration::from_millis(600)));
    assert!(matches!(&r, Err(Error::Timeout { .. })), "{r:?}");
}

#[test]
fn a_baseline_server_record_naming_another_host_is_refused() {
    let (addr, _) = fake_dataplane(|_, mut s| {
        if !read_baseline_hello(&mut s) {
            return;
        }
        // An RPC server's header: 1 bucket at base 0, values up to 64 bytes.
        let mut h = [0u8; 32];
        h[..4].copy_from_slice(b"RDNB");
        h[4] = 1;
        h[5] = 2;
        h[8..16].copy_from_slice(&1u64.to_be_bytes());
        h[24..28].copy_from_slice(&64u32.to_be_bytes());
        let rec = QpRecord::new(0x42, 7, SocketAddrV4::new(Ipv4Addr::new(10, 1, 2, 3), 4791));
        let _ = s.write_all(&h);
        let _ = s.write_all(&rec.encode().unwrap());
        std::thread::sleep(Duration::from_secs(10));
    });
    let r = within(Duration::from_secs(30), move || {
        baseline_connect(addr, Duration::from_secs(2))
    });
    assert!(
        matches!(&r, Err(Error::BadAnswer { detail, .. }) if detail.contains("10.1.2.3")),
        "{r:?}"
    );
}

#[test]
fn a_manager_socket_that_never_accepts_cannot_hold_the_connect() {
    use nix::sys::socket::{
        bind, listen, socket, AddressFamily, Backlog, SockFlag, SockType, UnixAddr,
    };
    let path =
        std::env::temp_dir().join(format!("redn-hostile-{}-backlog.sock", std::process::id()));
    let _ = std::fs::remove_file(&path);
    let l = socket(
        AddressFamily::Unix,
        SockType::Stream,
        SockFlag::SOCK_CLOEXEC,
        None,
    )
    .expect("socket");
    bind(
        std::os::fd::AsRawFd::as_raw_fd(&l),
        &UnixAddr::new(&path).expect("path"),
    )
    .expect("bind");
    listen(&l, Backlog::new(0).expect("backlog")).expect("listen");
    // The one connection a backlog of 0 takes; nobody ever accepts.
    let _held = std::os::unix::net::UnixStream::connect(&path).expect("the backlog's one");
    let p = path.clone();
    let r = promptly(move || {
        redn_proto::client::Connection::connect(&p, Duration::from_millis(600)).map(|_| ())
    });
    assert!(r.is_err(), "connected to a listener that never accepts");
    drop(l);
    let _ = std::fs::remove_file(&path);
}

/// Characters a terminal acts on, or that reorder what it shows.
fn reaches_the_terminal(s: &str) -> bool {
    s.chars().any(|c| {
        c.is_control()
            || matches!(c, '\u{061c}' | '\u{200e}' | '\u{200f}' | '\u{202a}'..='\u{202e}' | '\u{2066}'..='\u{2069}')
    })
}

#[test]
fn a_servers_words_cannot_reach_the_users_terminal_through_an_error() {
    // A terminal title, a forged line, a right-to-left override: in a refusal's reason on
    // the data plane and in a varlink error's name.
    let evil = "\u{1b}]0;owned\u{7}\r\nkvclient: all good\u{202e}\u{9b}2J";
    let mut refusal = answer_header(Refusal::AccessDenied.code(), evil.len() as u16);
    refusal.extend_from_slice(evil.as_bytes());
    let r = connect(answering(refusal), Duration::from_secs(2));
    assert!(
        matches!(r, Err(Error::RemoteRefused { .. })),
        "{}",
        kind(&r)
    );
    let shown = kind(&r);
    assert!(!reaches_the_terminal(&shown), "{shown:?}");
    assert!(
        shown.contains("owned"),
        "the reason is still shown: {shown:?}"
    );

    let name = serde_json::to_string(&format!("io.evil.{evil}")).unwrap();
    let reply = format!("{{\"error\":{name},\"parameters\":{{}}}}\0");
    let (r, _) = info_from(replying(reply.into_bytes(), Duration::from_secs(2)));
    let shown = match &r {
        Err(e) => redn_client::error_chain(e),
        Ok(i) => panic!("{i:?}"),
    };
    assert!(!reaches_the_terminal(&shown), "{shown:?}");
    assert!(
        shown.contains("owned"),
        "the name is still shown: {shown:?}"
    );
}

#[test]
fn a_record_naming_the_clients_own_queue_pair_ends_in_a_named_error() {
    // On one host the manager's address is the client's: a record may name the client's
    // own UDP port and QP, so that its trigger comes back to itself.
    let addr = answering_with(|mut theirs| {
        theirs.regions.clear();
        theirs
    });
    let mut c = connect(addr, Duration::from_millis(800)).expect("connect");
    for attempt in ["the trigger", "the next trigger"] {
        let (back, r) = trigger_within(c, Duration::from_secs(20));
        c = back;
        eprintln!("{attempt}: {r:?}");
        assert!(
            matches!(r, Err(Error::ResponseFailed { .. } | Error::Timeout { .. })),
            "{attempt}: {r:?}"
        );
    }
}

#[test]
fn a_response_to_no_trigger_is_not_taken_for_the_next_triggers() {
    // Responses before any trigger (a server answering nothing, or an honest one's extra
    // response to an earlier trigger the client had stopped waiting for).
    let (addr, rx) = rogue_dataplane("hash-get", 14, |_, r| {
        for _ in 0..3 {
            if !matches!(r.respond(b"stale"), Some(Ok(()))) {
                return None;
            }
        }
        if !r.trigger() {
            return None;
        }
        r.respond(b"fresh")
    });
    let c = connect(addr, Duration::from_secs(5)).expect("connect");
    // The stale responses are in before the trigger goes out.
    std::thread::sleep(Duration::from_millis(300));
    let (_c, r) = trigger_within(c, Duration::from_secs(20));
    let _ = rx.recv_timeout(Duration::from_secs(20));
    let r = r.expect("an answer");
    assert_eq!(
        r[0].data,
        b"fresh",
        "the trigger was answered with {:?}",
        String::from_utf8_lossy(&r[0].data)
    );
}

/// Set in a child of [`a_huge_reply_is_not_blown_up_while_parsed`]: the socket to call.
const REPLY_CHILD_ENV: &str = "REDN_HOSTILE_REPLY_CHILD";

/// This process's peak resident memory, in KiB.
fn peak_kib() -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            let line = s.lines().find(|l| l.starts_with("VmHWM:"))?.to_owned();
            line.split_whitespace().nth(1)?.parse().ok()
        })
        .unwrap_or(0)
}

/// The child's part: call the socket the parent named, report the peak memory.
#[test]
fn huge_reply_child() {
    let Some(path) = std::env::var_os(REPLY_CHILD_ENV) else {
        return;
    };
    let r = redn_client::Client::connect(std::path::Path::new(&path))
        .expect("connect")
        .info();
    println!("PEAK {} {}", peak_kib(), r.is_ok());
}

#[test]
fn a_huge_reply_is_not_blown_up_while_parsed() {
    // A reply just under the 16 MiB cap made of tiny values, which the client's type
    // does not even have: what the client holds should be about the bytes, not a tree of
    // four million values. Measured in a child process of its own.
    let mut m = b"{\"parameters\":{\"version\":\"1\",\"backend\":\"b\",\"app\":\"a\",\"uid\":1,\
            \"pid\":1,\"max_regions\":1,\"max_pinned\":1,\"regions\":0,\"pinned\":0,\
            \"offloads\":0,\"padding\":["
        .to_vec();
    while m.len() < (16 << 20) - 64 {
        m.extend_from_slice(b"0,");
    }
    m.extend_from_slice(b"0]}}\0");
    let path = replying(m, Duration::from_secs(20));
    let out = std::process::Command::new(std::env::current_exe().expect("exe"))
        .args([
            "--exact",
            "huge_reply_child",
            "--nocapture",
            "--test-threads=1",
        ])
        .env(REPLY_CHILD_ENV, &path)
        .output()
        .expect("the child");
    let text = String::from_utf8_lossy(&out.stdout);
    // The harness prints the test's name on the same line.
    let line = text
        .lines()
        .find_map(|l| l.split_once("PEAK ").map(|(_, r)| r))
        .unwrap_or_else(|| panic!("no report: {text} {}", String::from_utf8_lossy(&out.stderr)));
    let mut words = line.split_whitespace();
    let peak: u64 = words.next().and_then(|w| w.parse().ok()).expect("a number");
    assert_eq!(
        words.next(),
        Some("true"),
        "the reply is a good one: {line}"
    );
    eprintln!("a 16 MiB reply: peak {} MiB", peak >> 10);
    assert!(
        peak < 120 << 10,
        "a 16 MiB reply took the client to {} MiB",
        peak >> 10
    );
}
