//! RoCEv2 between softnic instances in separate processes over loopback.
//!
//! The test binary re-executes itself as the peer: `roce_peer` does nothing in a normal run,
//! and serves a scenario when `REDN_ROCE_PEER` names one. The peer prints its TCP port, runs
//! the connection exchange with the test, serves until the test says "done" (answering with
//! what it counted) or its stream closes, and exits. Faults to inject on what the peer sends
//! come in `REDN_ROCE_FAULTS` ("seed,drop,duplicate,reorder", per mille).

// Lengths and offsets here are constants below 16 MiB, indices below 2^20, and byte
// patterns narrow on purpose: no cast in this file can lose a bit that matters.
#![allow(clippy::cast_possible_truncation)]

mod common;
use common::*;
use redn_program::program::catalog::{self, HashVariant, BUCKET_STRIDE};
use redn_program::wqe::{CqeOpcode, Payload, Syndrome, WorkRequest, WqeFlags, WrOp};
use redn_sys::install::{self, RegionBinding};
use redn_sys::nic::{Completion, CqConfig, Nic, QpConfig};
use redn_sys::softnic::roce::{
    read_record, write_record, DropReason, Faults, QpRecord, RegionRecord, RoceConfig, RoceEndpoint,
};
use redn_sys::softnic::{Prefetch, SoftNic, SoftNicConfig};
use redn_sys::{Cqn, QpState, Qpn};
use std::collections::HashMap;
use std::io::{BufRead, BufReader, Write};
use std::net::{Ipv4Addr, SocketAddrV4, TcpListener, TcpStream};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

const PEER_ENV: &str = "REDN_ROCE_PEER";
const FAULTS_ENV: &str = "REDN_ROCE_FAULTS";
/// The peer's memory: receives land at RECV_AT (64 KiB each), its receive log at LOG_AT.
const MEM_LEN: usize = 8 << 20;
const RECV_AT: usize = 4 << 20;
const RECV_SLOT: usize = 64 << 10;
const RECVS: usize = 32;
const LOG_AT: usize = 7 << 20;

fn softnic(name: &str, pus: usize) -> SoftNic {
    softnic_driven(name, pus, false)
}

/// A softnic with PU threads, or host-driven (no PU threads: the test's calls run them).
fn softnic_driven(name: &str, pus: usize, host_driven: bool) -> SoftNic {
    let mut cfg = SoftNicConfig::new(name);
    cfg.pus = pus;
    cfg.prefetch = Prefetch::Depth(8);
    cfg.host_driven = host_driven;
    SoftNic::new(cfg).unwrap()
}

/// Names of this process's threads (`/proc/self/task/*/comm`).
fn thread_names() -> Vec<String> {
    std::fs::read_dir("/proc/self/task")
        .unwrap()
        .filter_map(|t| std::fs::read_to_string(t.ok()?.path().join("comm")).ok())
        .map(|n| n.trim().to_string())
        .collect()
}

fn endpoint_for(nic: &SoftNic, faults: Option<Faults>) -> RoceEndpoint {
    let mut cfg = RoceConfig::new(Ipv4Addr::LOCALHOST);
    cfg.bind.set_port(0);
    cfg.faults = faults;
    RoceEndpoint::start(nic, &cfg).unwrap()
}

/// A record with an ACK timeout of 67 ms and 7 retries: a dead peer is found in half a
/// second, and a peer descheduled on a busy machine for less is not taken for dead.
fn record(ep: &RoceEndpoint, qp: Qpn, psn: u32, mtu: u16) -> QpRecord {
    let mut r = ep.record(qp, psn);
    r.mtu = mtu;
    r.timeout = 14;
    r.retry_cnt = 7;
    r
}

fn region_record(name: &str, r: &Region) -> RegionRecord {
    RegionRecord {
        name: name.into(),
        addr: r.mr.addr.0,
        rkey: r.mr.lkey.0,
        len: r.mr.len,
        rights: 7,
    }
}

fn faults_from_env() -> Option<Faults> {
    let v = std::env::var(FAULTS_ENV).ok()?;
    let n: Vec<u64> = v.split(',').map(|x| x.parse().unwrap()).collect();
    let pm = |i: usize| u16::try_from(n[i]).unwrap();
    Some(Faults {
        seed: n[0],
        drop: pm(1),
        duplicate: pm(2),
        reorder: pm(3),
    })
}

/// The peer's entry: a no-op unless this process was started as a peer.
#[test]
fn roce_peer() {
    let Ok(scenario) = std::env::var(PEER_ENV) else {
        return;
    };
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    println!("REDN_PEER_PORT {}", listener.local_addr().unwrap().port());
    std::io::stdout().flush().unwrap();
    let (stream, _) = listener.accept().unwrap();
    stream.set_read_timeout(Some(patience(50))).unwrap();
    match scenario.as_str() {
        "memory" => memory_peer(stream),
        offload => offload_peer(stream, offload),
    }
}

/// Serve a memory region: READ, WRITE and atomics land in it; SENDs and WRITE_IMMs consume
/// receives, each logged (opcode, length, immediate) at LOG_AT for the test to READ.
fn memory_peer(mut stream: TcpStream) {
    let nic = softnic("peer", 1);
    let ep = endpoint_for(&nic, faults_from_env());
    let pd = nic.alloc_pd().unwrap();
    let mem = Region::new(&nic, pd, MEM_LEN, ALL);
    let cq = nic.create_cq(CqConfig::new(4096)).unwrap();
    let mut qc = QpConfig::new(pd, cq);
    qc.rq_slots = 64;
    let qp = nic.create_qp(qc).unwrap().qpn;
    for i in 0..RECVS {
        let sge = mem
            .mr
            .sge((RECV_AT + i * RECV_SLOT) as u64, RECV_SLOT as u32);
        nic.post_recv(qp, i as u64, &[sge]).unwrap();
    }
    let theirs = read_record(&mut stream).unwrap();
    let mut ours = record(&ep, qp, 0xff_fff0, 4096);
    ours.regions.push(region_record("mem", &mem));
    ep.connect(&ours, &theirs).unwrap();
    write_record(&mut stream, &ours).unwrap();
    let stop = Arc::new(AtomicBool::new(false));
    std::thread::scope(|s| {
        s.spawn(|| {
            let mut n = 0usize;
            let mut out = Vec::new();
            while !stop.load(Ordering::Acquire) {
                out.clear();
                nic.poll_cq(cq, 16, &mut out).unwrap();
                for c in &out {
                    let mut entry = [0u8; 16];
                    entry[0] = c.opcode as u8;
                    entry[1] = u8::from(c.is_ok());
                    entry[4..8].copy_from_slice(&c.byte_len.to_be_bytes());
                    entry[8..12].copy_from_slice(&c.imm.unwrap_or(0).to_be_bytes());
                    entry[12..16].copy_from_slice(&u32::try_from(c.wr_id).unwrap().to_be_bytes());
                    // The entry's first byte is written last: 0 means "not yet".
                    mem.write(LOG_AT + n * 16 + 1, &entry[1..]);
                    mem.write(LOG_AT + n * 16, &entry[..1]);
                    n += 1;
                }
                std::thread::yield_now();
            }
        });
        let mut line = String::new();
        let _ = BufReader::new(&stream).read_line(&mut line);
        stop.store(true, Ordering::Release);
    });
    let c = ep.counters();
    let _ = writeln!(
        stream,
        "sent {} received {} dropped {} state {}",
        c.sent,
        c.received,
        c.dropped,
        nic.qp_state(qp).unwrap()
    );
}

/// Fill `n` buckets of the hash table at 0; bucket i holds key 0x5000 + i and value(i).
const VALUES_AT: usize = 512 << 10;

fn value(i: u64, len: usize) -> Vec<u8> {
    (0..len)
        .map(|b| (i as usize * 31 + b).to_le_bytes()[0])
        .collect()
}

/// Serve a catalog offload ("offload:hash-get", "offload:list-find", "offload:server-loop")
/// to the test's QP, over a table of 16 keys 0x5000.. (values of 48 bytes) or a list of 6.
fn offload_peer(mut stream: TcpStream, scenario: &str) {
    let nic = Arc::new(softnic("server", 2));
    let ep = endpoint_for(&nic, faults_from_env());
    let pd = nic.alloc_pd().unwrap();
    let data = Region::new(&nic, pd, 1 << 20, ALL);
    let base = data.mr.addr.0;
    let program = match scenario {
        "offload:hash-get" => catalog::hash_get(HashVariant::Single, 64).unwrap(),
        "offload:server-loop" => catalog::server_loop().unwrap(),
        "offload:list-find" => catalog::list_find(6, false, 8).unwrap(),
        other => panic!("unknown scenario {other}"),
    };
    if scenario == "offload:list-find" {
        for i in 0..6usize {
            data.write(VALUES_AT + i * 4096, &value(i as u64, 32));
            let next = base + 64 * (i as u64 + 1).min(5);
            let b = catalog::node_bytes(
                0x7000 + i as u64,
                32,
                base + (VALUES_AT + i * 4096) as u64,
                next,
            );
            data.write(64 * i, &b);
        }
    } else {
        for i in 0..16usize {
            data.write(VALUES_AT + i * 4096, &value(i as u64, 48));
            let b =
                catalog::bucket_bytes(0x5000 + i as u64, 48, base + (VALUES_AT + i * 4096) as u64);
            data.write(i * BUCKET_STRIDE as usize, &b);
        }
    }
    let client = read_record(&mut stream).unwrap();
    let resp = client.region("response").unwrap();
    let mut regions = HashMap::new();
    for name in ["table", "list", "values"] {
        regions.insert(
            name.to_string(),
            RegionBinding::Local {
                buffer: Arc::clone(&data.buf),
                offset: 0,
                len: 1 << 20,
                access: ALL,
            },
        );
    }
    regions.insert(
        "response".to_string(),
        RegionBinding::Remote {
            addr: redn_sys::VirtAddr(resp.addr),
            rkey: redn_sys::Rkey(resp.rkey),
            len: resp.len,
        },
    );
    let installed = install::install(&nic, &program, &regions, &mut |q| {
        let mut ours = record(&ep, q, 0x123, 4096);
        ours.regions.push(region_record("data", &data));
        ep.connect(&ours, &client)?;
        write_record(&mut stream, &ours)?;
        Ok(())
    })
    .unwrap();
    let posts = || -> u64 {
        installed
            .qps
            .iter()
            .map(|q| q.qpn)
            .chain([installed.master])
            .map(|q| nic.counters(q).unwrap().host_posts)
            .sum()
    };
    let before = posts();
    let mut line = String::new();
    let _ = BufReader::new(&stream).read_line(&mut line);
    let _ = writeln!(stream, "host_posts {}", posts() - before);
}

/// A peer process and the TCP stream to it.
struct Peer {
    child: Child,
    stream: TcpStream,
}

impl Drop for Peer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Peer {
    fn spawn(scenario: &str, faults: Option<&str>) -> Peer {
        let mut cmd = Command::new(std::env::current_exe().unwrap());
        cmd.args(["roce_peer", "--exact", "--nocapture", "--test-threads", "1"])
            .env(PEER_ENV, scenario)
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit());
        if let Some(f) = faults {
            cmd.env(FAULTS_ENV, f);
        }
        let mut child = cmd.spawn().unwrap();
        let out = child.stdout.take().unwrap();
        let mut lines = BufReader::new(out).lines();
        let port: u16 = loop {
            let line = lines.next().expect("the peer printed its port").unwrap();
            // libtest may have written "test roce_peer ... " on the same line.
            if let Some(at) = line.find("REDN_PEER_PORT ") {
                break line[at + 15..].trim().parse().unwrap();
            }
        };
        // Keep draining the peer's stdout so it never blocks on a full pipe.
        std::thread::spawn(move || for _ in lines {});
        let stream = TcpStream::connect(("127.0.0.1", port)).unwrap();
        stream.set_read_timeout(Some(patience(30))).unwrap();
        Peer { child, stream }
    }

    /// Tell the peer the test is done; its answer line.
    fn finish(&mut self) -> String {
        writeln!(self.stream, "done").unwrap();
        let mut line = String::new();
        BufReader::new(&self.stream).read_line(&mut line).unwrap();
        line
    }
}

/// This process's side: a softnic, its endpoint and QPs connected to peers.
struct Local {
    nic: SoftNic,
    ep: RoceEndpoint,
    pd: redn_sys::Pdn,
    buf: Region,
}

struct Conn {
    qp: Qpn,
    cq: Cqn,
    remote: QpRecord,
}

impl Local {
    fn new(faults: Option<Faults>) -> Local {
        Local::driven("client", faults, false)
    }

    /// A host-driven client (no PU thread: its calls run its queues).
    fn host_driven(name: &str, faults: Option<Faults>) -> Local {
        Local::driven(name, faults, true)
    }

    fn driven(name: &str, faults: Option<Faults>, host_driven: bool) -> Local {
        let nic = softnic_driven(name, 1, host_driven);
        let ep = endpoint_for(&nic, faults);
        let pd = nic.alloc_pd().unwrap();
        let buf = Region::new(&nic, pd, 4 << 20, ALL);
        Local { nic, ep, pd, buf }
    }

    fn connect(&self, peer: &mut Peer, mtu: u16, regions: Vec<RegionRecord>) -> Conn {
        let cq = self.nic.create_cq(CqConfig::new(4096)).unwrap();
        let mut qc = QpConfig::new(self.pd, cq);
        qc.rq_slots = 4096;
        let qp = self.nic.create_qp(qc).unwrap().qpn;
        let mut ours = record(&self.ep, qp, 0xff_ff00, mtu);
        ours.regions = regions;
        write_record(&mut peer.stream, &ours).unwrap();
        let remote = read_record(&mut peer.stream).unwrap();
        self.ep.connect(&ours, &remote).unwrap();
        Conn { qp, cq, remote }
    }

    fn post(&self, c: &Conn, wr_id: u64, op: WrOp) -> Completion {
        self.nic.post_send(c.qp, &[wr(wr_id, SIG, op)]).unwrap();
        let got = wait_cqes(&self.nic, c.cq, 1).remove(0);
        assert_eq!(got.wr_id, wr_id);
        got
    }

    fn write(&self, c: &Conn, off: u64, data: &[u8], imm: Option<u32>) {
        self.buf.write(0, data);
        let r = self.post(
            c,
            1,
            WrOp::Write {
                remote: remote_at(&c.remote, off),
                payload: Payload::Sgl(vec![self.buf.mr.sge(0, data.len() as u32)]),
                imm,
            },
        );
        assert!(r.is_ok(), "write: {r:?}");
    }

    fn read(&self, c: &Conn, off: u64, len: usize) -> Vec<u8> {
        let at = 2 << 20;
        let r = self.post(
            c,
            2,
            WrOp::Read {
                remote: remote_at(&c.remote, off),
                sgl: vec![self.buf.mr.sge(at, len as u32)],
            },
        );
        assert!(r.is_ok(), "read: {r:?}");
        self.buf.read(at as usize, len)
    }

    fn fetch_add(&self, c: &Conn, off: u64, add: u64) -> u64 {
        let r = self.post(
            c,
            3,
            WrOp::FetchAdd {
                remote: remote_at(&c.remote, off),
                add,
                result: Some(self.buf.mr.sge(3 << 20, 8)),
            },
        );
        assert!(r.is_ok(), "fetch-add: {r:?}");
        // The old value lands in host order, as upstream Linux sets ConnectX's replies.
        u64::from_le_bytes(self.buf.read(3 << 20, 8).try_into().unwrap())
    }

    fn cas(&self, c: &Conn, off: u64, compare: u64, swap: u64) -> u64 {
        let r = self.post(
            c,
            4,
            WrOp::CompareSwap {
                remote: remote_at(&c.remote, off),
                compare,
                swap,
                result: Some(self.buf.mr.sge(3 << 20, 8)),
            },
        );
        assert!(r.is_ok(), "cas: {r:?}");
        u64::from_le_bytes(self.buf.read(3 << 20, 8).try_into().unwrap())
    }

    fn send(&self, c: &Conn, data: &[u8], imm: Option<u32>) {
        self.buf.write(0, data);
        let r = self.post(
            c,
            5,
            WrOp::Send {
                payload: Payload::Sgl(vec![self.buf.mr.sge(0, data.len() as u32)]),
                imm,
            },
        );
        assert!(r.is_ok(), "send: {r:?}");
    }

    /// The memory peer's log entry `n` (opcode, ok, length, immediate), once it is written.
    fn log_entry(&self, c: &Conn, n: usize) -> (u8, bool, u32, u32) {
        let deadline = Instant::now() + patience(10);
        loop {
            let e = self.read(c, (LOG_AT + n * 16) as u64, 16);
            if e[0] != 0 {
                let be = |at: usize| u32::from_be_bytes(e[at..at + 4].try_into().unwrap());
                return (e[0], e[1] == 1, be(4), be(8));
            }
            assert!(Instant::now() < deadline, "the peer logged no receive {n}");
        }
    }
}

fn remote_at(r: &QpRecord, off: u64) -> redn_program::wqe::RemoteAddr {
    let m = r.region("mem").or_else(|| r.region("data")).unwrap();
    redn_program::wqe::RemoteAddr {
        addr: redn_sys::VirtAddr(m.addr + off),
        rkey: redn_sys::Rkey(m.rkey),
    }
}

fn pattern(len: usize, seed: u8) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed))
        .collect()
}

/// Every operation against a peer process, with messages of many packets; the peer's
/// receive log shows each SEND and WRITE-with-immediate delivered once, in order.
fn every_opcode(local: &Local, peer: &mut Peer, mtu: u16) {
    let c = local.connect(peer, mtu, vec![]);
    // WRITE and READ, one packet and many (1 MiB + 123 bytes at the path MTU).
    local.write(&c, 100, b"hello over RoCE", None);
    assert_eq!(local.read(&c, 100, 15), b"hello over RoCE");
    let big = pattern((1 << 20) + 123, 7);
    local.write(&c, 4096, &big, None);
    assert_eq!(local.read(&c, 4096, big.len()), big);
    assert_eq!(local.read(&c, 4096 + 1000, 0), b"", "zero-length READ");
    // WRITE with immediate: the data lands and a receive completes with the immediate.
    let w = pattern(3 * usize::from(mtu) + 5, 9);
    local.write(&c, 2 << 20, &w, Some(0xdead_beef));
    assert_eq!(
        local.log_entry(&c, 0),
        (
            CqeOpcode::RespWriteImm as u8,
            true,
            w.len() as u32,
            0xdead_beef
        )
    );
    assert_eq!(local.read(&c, 2 << 20, w.len()), w);
    // SENDs: one packet, several, with immediate, empty.
    let s1 = pattern(40, 1);
    let s2 = pattern(5 * usize::from(mtu) + 1, 2);
    local.send(&c, &s1, None);
    local.send(&c, &s2, Some(77));
    local.send(&c, &[], None);
    assert_eq!(
        local.log_entry(&c, 1),
        (CqeOpcode::RespSend as u8, true, 40, 0)
    );
    assert_eq!(
        local.log_entry(&c, 2),
        (CqeOpcode::RespSendImm as u8, true, s2.len() as u32, 77)
    );
    assert_eq!(
        local.log_entry(&c, 3),
        (CqeOpcode::RespSend as u8, true, 0, 0)
    );
    assert_eq!(local.read(&c, (RECV_AT + RECV_SLOT) as u64, 40), s1);
    assert_eq!(
        local.read(&c, (RECV_AT + 2 * RECV_SLOT) as u64, s2.len()),
        s2
    );
    // Atomics: the target is a little-endian word; the old value comes back.
    local.write(&c, 3 << 20, &10u64.to_le_bytes(), None);
    assert_eq!(local.fetch_add(&c, 3 << 20, 5), 10);
    assert_eq!(local.cas(&c, 3 << 20, 15, 99), 15);
    assert_eq!(local.cas(&c, 3 << 20, 15, 1), 99, "no match, no swap");
    assert_eq!(local.read(&c, 3 << 20, 8), 99u64.to_le_bytes());
    // A key the peer never gave: remote access error, and this QP is in error.
    let r = local.post(
        &c,
        9,
        WrOp::Write {
            remote: redn_program::wqe::RemoteAddr {
                addr: redn_sys::VirtAddr(0x10),
                rkey: redn_sys::Rkey(0xdead00),
            },
            payload: Payload::Inline(vec![1; 8]),
            imm: None,
        },
    );
    assert_eq!(r.status, Err(Syndrome::RemoteAccess));
    assert_eq!(local.nic.qp_state(c.qp).unwrap(), QpState::Error);
}

#[test]
fn every_opcode_between_processes() {
    let local = Local::new(None);
    let mut peer = Peer::spawn("memory", None);
    every_opcode(&local, &mut peer, 1024);
    let report = peer.finish();
    assert!(
        report.ends_with("state ERR\n"),
        "the peer's QP went to error on the bad key: {report}"
    );
    assert_eq!(local.ep.drops().get(DropReason::BadIcrc), 0);
}

/// Faults both ways: 3 % of datagrams each dropped, duplicated and reordered.
const FAULTS: Faults = Faults {
    seed: 7,
    drop: 30,
    duplicate: 30,
    reorder: 30,
};

#[test]
fn loss_reordering_and_duplication_leave_results_exact() {
    exact_under_faults(&Local::new(Some(FAULTS)));
}

/// Large WRITEs and READs, FETCH_ADDs and SENDs from `local` to a memory peer, both sides
/// injecting faults: every result exact, every atomic run once, every SEND delivered once.
fn exact_under_faults(local: &Local) {
    let mut peer = Peer::spawn("memory", Some("11,30,30,30"));
    let c = local.connect(&mut peer, 1024, vec![]);
    for round in 0..3u8 {
        let big = pattern(300_000 + usize::from(round), round);
        local.write(&c, 8192, &big, None);
        assert_eq!(local.read(&c, 8192, big.len()), big, "round {round}");
    }
    // Each FETCH_ADD runs once however often its request or answer is lost or repeated.
    local.write(&c, 3 << 20, &0u64.to_le_bytes(), None);
    for i in 0..200u64 {
        assert_eq!(local.fetch_add(&c, 3 << 20, 1), i);
    }
    assert_eq!(local.read(&c, 3 << 20, 8), 200u64.to_le_bytes());
    // Each SEND is delivered once, in order.
    for i in 0..20u32 {
        local.send(&c, &pattern(2000, i as u8), Some(i));
    }
    for i in 0..20u32 {
        assert_eq!(
            local.log_entry(&c, i as usize),
            (CqeOpcode::RespSendImm as u8, true, 2000, i)
        );
    }
    assert_eq!(
        local.read(&c, (RECV_AT + 19 * RECV_SLOT) as u64, 2000),
        pattern(2000, 19)
    );
    burst_in_flight(local, &c, 20);
    let report = peer.finish();
    assert!(report.ends_with("state RTS\n"), "{report}");
    let d = local.ep.drops();
    assert!(
        d.get(DropReason::OutOfSequence) + d.get(DropReason::UnexpectedResponse) > 0,
        "the faults were felt: {:?}",
        d.snapshot()
    );
}

/// Where the burst's WRITE `i` goes (here and at the memory peer).
fn burst_at(i: usize) -> usize {
    (1 << 20) + i * (16 << 10)
}

/// 40 signaled WRITEs (1 B..9 KB) and SENDs with immediate (1,500 B; every fifth) posted
/// in one call, so that many are in flight at once on `c`: their completions come in
/// order, all good; every WRITE's bytes are at the memory peer and every SEND was
/// delivered once, in order, into the receives from `first_recv` on.
fn burst_in_flight(local: &Local, c: &Conn, first_recv: usize) {
    let n = 40;
    let is_send = |i: usize| i % 5 == 4;
    let len = |i: usize| if is_send(i) { 1500 } else { i * 997 % 9000 + 1 };
    let wrs: Vec<_> = (0..n)
        .map(|i| {
            let data = pattern(len(i), i as u8);
            local.buf.write(burst_at(i), &data);
            let payload = Payload::Sgl(vec![local.buf.mr.sge(burst_at(i) as u64, len(i) as u32)]);
            let op = if is_send(i) {
                WrOp::Send {
                    payload,
                    imm: Some(1000 + i as u32),
                }
            } else {
                WrOp::Write {
                    remote: remote_at(&c.remote, burst_at(i) as u64),
                    payload,
                    imm: None,
                }
            };
            wr(i as u64, SIG, op)
        })
        .collect();
    local.nic.post_send(c.qp, &wrs).unwrap();
    let got = wait_cqes(&local.nic, c.cq, n);
    let ids: Vec<u64> = got.iter().map(|c| c.wr_id).collect();
    assert_eq!(ids, (0..n as u64).collect::<Vec<_>>(), "in order");
    assert!(got.iter().all(|c| c.is_ok()), "{got:?}");
    let mut recv = first_recv;
    for i in 0..n {
        if is_send(i) {
            assert_eq!(
                local.log_entry(c, recv),
                (CqeOpcode::RespSendImm as u8, true, 1500, 1000 + i as u32),
                "SEND {i}"
            );
            let slot = (RECV_AT + recv * RECV_SLOT) as u64;
            assert_eq!(
                local.read(c, slot, 1500),
                pattern(1500, i as u8),
                "SEND {i}"
            );
            recv += 1;
        } else {
            let at = burst_at(i) as u64;
            assert_eq!(
                local.read(c, at, len(i)),
                pattern(len(i), i as u8),
                "WRITE {i}"
            );
        }
    }
}

#[test]
fn many_writes_and_sends_in_flight_complete_in_order() {
    let local = Local::new(None);
    let mut peer = Peer::spawn("memory", None);
    let c = local.connect(&mut peer, 1024, vec![]);
    burst_in_flight(&local, &c, 0);
    assert!(peer.finish().ends_with("state RTS\n"));
}

/// A READ behind posted WRITEs sees what they wrote, and a fenced WRITE behind the READ
/// sends what the READ brought back.
#[test]
fn a_fenced_wqe_after_a_read_sees_the_reads_data() {
    let (a, b, ca, _) = pair(7, 0);
    let x = pattern(64, 9);
    a.buf.write(0, &x);
    let wrs = [
        wr(
            1,
            WqeFlags::NONE,
            WrOp::Write {
                remote: remote_at(&ca.remote, 1000),
                payload: Payload::Sgl(vec![a.buf.mr.sge(0, 64)]),
                imm: None,
            },
        ),
        wr(
            2,
            WqeFlags::NONE,
            WrOp::Read {
                remote: remote_at(&ca.remote, 1000),
                sgl: vec![a.buf.mr.sge(8192, 64)],
            },
        ),
        wr(
            3,
            SIG | WqeFlags::FENCE,
            WrOp::Write {
                remote: remote_at(&ca.remote, 2000),
                payload: Payload::Sgl(vec![a.buf.mr.sge(8192, 64)]),
                imm: None,
            },
        ),
    ];
    a.nic.post_send(ca.qp, &wrs).unwrap();
    let got = wait_cqes(&a.nic, ca.cq, 1);
    assert!(got[0].is_ok() && got[0].wr_id == 3, "{got:?}");
    assert_eq!(a.buf.read(8192, 64), x, "the READ saw the WRITE before it");
    assert_eq!(
        b.buf.read(2000, 64),
        x,
        "the fenced WRITE sent the READ's data"
    );
}

/// Where [`behind_a_long_write`]'s WRITE lands at the peer, and how long it is: 256
/// packets, more than the window keeps on the wire, so the WQEs behind it run before its
/// last ACK can have come.
const LONG_AT: u64 = 4096;
const LONG_LEN: usize = 256 << 10;

/// On a fresh pair: a signaled WRITE of [`LONG_LEN`] bytes (from `a.buf` at 0 to
/// [`LONG_AT`]) and the signaled WQEs `behind` makes (ids from 2 on), posted in one call;
/// their completions come in WQE order. Returns the pair's `a`, `b` and `a`'s connection,
/// the WRITE's bytes and the completions.
fn behind_a_long_write(
    behind: impl FnOnce(&Local, &Conn) -> Vec<WrOp>,
) -> (Local, Local, Conn, Vec<u8>, Vec<Completion>) {
    let (a, b, ca, _) = pair(7, 0);
    let x = pattern(LONG_LEN, 3);
    a.buf.write(0, &x);
    let write = WrOp::Write {
        remote: remote_at(&ca.remote, LONG_AT),
        payload: Payload::Sgl(vec![a.buf.mr.sge(0, LONG_LEN as u32)]),
        imm: None,
    };
    let wrs: Vec<_> = std::iter::once(write)
        .chain(behind(&a, &ca))
        .enumerate()
        .map(|(i, op)| wr(i as u64 + 1, SIG, op))
        .collect();
    a.nic.post_send(ca.qp, &wrs).unwrap();
    let got = wait_cqes(&a.nic, ca.cq, wrs.len());
    let ids: Vec<u64> = got.iter().map(|c| c.wr_id).collect();
    let want: Vec<u64> = (1..=wrs.len() as u64).collect();
    assert_eq!(ids, want, "completions in WQE order: {got:?}");
    (a, b, ca, x, got)
}

/// A NOP and a READ behind a posted WRITE: each waits for the WRITE's acknowledgement, so
/// the WRITE completes first (whichever path runs the NOP) and the READ brings back what
/// the WRITE wrote.
#[test]
fn a_nop_and_a_read_behind_a_posted_write_complete_after_it() {
    let at = 1 << 20;
    let (a, b, _, x, got) = behind_a_long_write(|a, ca| {
        vec![
            WrOp::Nop {
                raw_segments: vec![],
            },
            WrOp::Read {
                remote: remote_at(&ca.remote, LONG_AT),
                sgl: vec![a.buf.mr.sge(at, LONG_LEN as u32)],
            },
        ]
    });
    assert!(got.iter().all(|c| c.is_ok()), "{got:?}");
    assert_eq!(
        b.buf.read(LONG_AT as usize, LONG_LEN),
        x,
        "the WRITE landed"
    );
    assert_eq!(
        a.buf.read(at as usize, LONG_LEN),
        x,
        "the READ saw the WRITE"
    );
}

/// A WQE that fails before it sends anything (its gather entry runs past the region), behind
/// a posted WRITE: the WRITE completes first, as acknowledged, then the WQE's own error;
/// the WQE behind it is flushed and the QP is in error.
#[test]
fn a_local_fault_behind_a_posted_write_completes_after_it() {
    let (a, b, ca, x, got) = behind_a_long_write(|a, ca| {
        let past_end = (4 << 20) - 32;
        vec![
            WrOp::Write {
                remote: remote_at(&ca.remote, 0),
                payload: Payload::Sgl(vec![a.buf.mr.sge(past_end, 64)]),
                imm: None,
            },
            WrOp::Write {
                remote: remote_at(&ca.remote, 0),
                payload: Payload::Sgl(vec![a.buf.mr.sge(0, 64)]),
                imm: None,
            },
        ]
    });
    let status: Vec<_> = got.iter().map(|c| c.status).collect();
    assert_eq!(
        status,
        [
            Ok(()),
            Err(Syndrome::LocalProtection),
            Err(Syndrome::WrFlush)
        ]
    );
    assert_eq!(a.nic.qp_state(ca.qp).unwrap(), QpState::Error);
    assert_eq!(
        a.nic.sq_consumed(ca.qp).unwrap(),
        3,
        "every WQE's slot freed"
    );
    assert_eq!(
        b.buf.read(LONG_AT as usize, LONG_LEN),
        x,
        "the WRITE landed"
    );
}

/// A posted WRITE the peer refuses (past the end of its region), behind a posted WRITE and
/// with none or two posted after it: the first completes, the refused one fails with a
/// remote access error, those after it are flushed, the QP is in error, and every WQE's
/// ring slot is free again (each completion gave back its own).
#[test]
fn a_refused_posted_write_fails_and_flushes_those_posted_after_it() {
    for after in [0, 2] {
        let (a, _, ca, _, got) = behind_a_long_write(|a, ca| {
            let refused = WrOp::Write {
                remote: remote_at(&ca.remote, (4 << 20) - 32),
                payload: Payload::Sgl(vec![a.buf.mr.sge(0, 64)]),
                imm: None,
            };
            let fine = WrOp::Write {
                remote: remote_at(&ca.remote, 0),
                payload: Payload::Sgl(vec![a.buf.mr.sge(0, 64)]),
                imm: None,
            };
            std::iter::once(refused)
                .chain(std::iter::repeat_n(fine, after))
                .collect()
        });
        let status: Vec<_> = got.iter().map(|c| c.status).collect();
        let mut want = vec![Ok(()), Err(Syndrome::RemoteAccess)];
        want.extend(std::iter::repeat_n(Err(Syndrome::WrFlush), after));
        assert_eq!(status, want, "{after} after");
        assert_eq!(a.nic.qp_state(ca.qp).unwrap(), QpState::Error);
        assert_eq!(
            a.nic.sq_consumed(ca.qp).unwrap(),
            got.len() as u64,
            "every WQE's slot freed, {after} after"
        );
    }
}

/// A doorbell-ordered chain stepping a managed RoCE queue: the master (on the same PU)
/// enables 64 WRITEs and a NOP, waits for the first completion, enables a second NOP and
/// waits for its completion. The 64 WRITEs are the hand-over's whole budget, so its visit
/// ends in front of the first NOP with WRITEs still posted, and the next step finds the NOPs
/// next. They must complete after the WRITEs (a queue whose peer posts does not run its
/// NOPs on the steps' own plain loop, which completes them at once).
#[test]
fn a_chain_step_runs_nops_behind_posted_writes_in_order() {
    let (a, b) = (Local::new(None), Local::new(None));
    let q_cq = a.nic.create_cq(CqConfig::new(256)).unwrap();
    let mut qc = QpConfig::new(a.pd, q_cq);
    qc.managed_send = true;
    let q = a.nic.create_qp(qc).unwrap().qpn;
    let b_cq = b.nic.create_cq(CqConfig::new(256)).unwrap();
    let qb = b.nic.create_qp(QpConfig::new(b.pd, b_cq)).unwrap().qpn;
    let mut rq = record(&a.ep, q, 10, 1024);
    rq.regions.push(region_record("mem", &a.buf));
    let mut rb = record(&b.ep, qb, 20, 1024);
    rb.regions.push(region_record("mem", &b.buf));
    a.ep.connect(&rq, &rb).unwrap();
    b.ep.connect(&rb, &rq).unwrap();
    let m_cq = a.nic.create_cq(CqConfig::new(256)).unwrap();
    let m = a.nic.create_qp(QpConfig::new(a.pd, m_cq)).unwrap().qpn;
    a.nic.connect(m, m).unwrap();

    let writes = 64u32;
    let len = 4096u32;
    let x = pattern((writes * len) as usize, 5);
    a.buf.write(0, &x);
    let mut wrs: Vec<_> = (0..writes)
        .map(|i| {
            let at = u64::from(i * len);
            let op = WrOp::Write {
                remote: remote_at(&rb, at),
                payload: Payload::Sgl(vec![a.buf.mr.sge(at, len)]),
                imm: None,
            };
            wr(u64::from(i), SIG, op)
        })
        .collect();
    for i in [writes, writes + 1] {
        let nop = WrOp::Nop {
            raw_segments: vec![],
        };
        wrs.push(wr(u64::from(i), SIG, nop));
    }
    a.nic.post_send(q, &wrs).unwrap();
    let all = writes + 2;
    let enable = |pi| WrOp::SendEnable { qp: q, pi };
    let chain = [
        wr(100, WqeFlags::NONE, enable(all - 1)),
        wr(101, WqeFlags::NONE, WrOp::Wait { cq: q_cq, count: 0 }),
        wr(102, WqeFlags::NONE, enable(all)),
        wr(
            103,
            SIG,
            WrOp::Wait {
                cq: q_cq,
                count: all - 1,
            },
        ),
    ];
    a.nic.post_send(m, &chain).unwrap();
    let got = wait_cqes(&a.nic, q_cq, all as usize);
    let ids: Vec<u64> = got.iter().map(|c| c.wr_id).collect();
    assert_eq!(ids, (0..u64::from(all)).collect::<Vec<_>>(), "in WQE order");
    assert!(got.iter().all(|c| c.is_ok()), "{got:?}");
    assert_eq!(wait_cqes(&a.nic, m_cq, 1)[0].wr_id, 103);
    assert_eq!(b.buf.read(0, x.len()), x, "every WRITE landed");
}

#[test]
fn a_dead_peer_fails_its_qp_with_retry_exceeded_and_others_go_on() {
    let local = Local::new(None);
    let mut doomed = Peer::spawn("memory", None);
    let mut alive = Peer::spawn("memory", None);
    let c_doomed = local.connect(&mut doomed, 4096, vec![]);
    let c_alive = local.connect(&mut alive, 4096, vec![]);
    local.write(&c_doomed, 0, b"before", None);
    // A stream of WRITEs; the peer dies under it.
    let n = 64u64;
    let data = pattern(64 << 10, 3);
    local.buf.write(0, &data);
    for i in 0..n {
        local
            .nic
            .post_send(
                c_doomed.qp,
                &[wr(
                    i,
                    SIG,
                    WrOp::Write {
                        remote: remote_at(&c_doomed.remote, 0),
                        payload: Payload::Sgl(vec![local.buf.mr.sge(0, data.len() as u32)]),
                        imm: None,
                    },
                )],
            )
            .unwrap();
        if i == 8 {
            doomed.child.kill().unwrap();
            doomed.child.wait().unwrap();
        }
    }
    let all = wait_cqes(&local.nic, c_doomed.cq, n as usize);
    let first_bad = all
        .iter()
        .position(|c| !c.is_ok())
        .expect("some WRITE failed");
    assert_eq!(
        all[first_bad].status,
        Err(Syndrome::TransportRetryExceeded),
        "{:?}",
        all[first_bad]
    );
    assert!(all[first_bad + 1..]
        .iter()
        .all(|c| c.status == Err(Syndrome::WrFlush)));
    assert_eq!(local.nic.qp_state(c_doomed.qp).unwrap(), QpState::Error);
    // The same softnic and endpoint go on serving the other peer.
    local.write(&c_alive, 64, b"still here", None);
    assert_eq!(local.read(&c_alive, 64, 10), b"still here");
    assert!(alive.finish().ends_with("state RTS\n"));
}

/// The client side of an offload: triggers go out as SENDs; each response is a WRITE with
/// immediate into `resp`.
fn offload_rig(scenario: &str) -> (Local, Peer, Conn) {
    offload_rig_for(Local::new(None), scenario)
}

/// [`offload_rig`] with the client `local`.
fn offload_rig_for(local: Local, scenario: &str) -> (Local, Peer, Conn) {
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
fn hash_gets((local, mut peer, c): (Local, Peer, Conn)) {
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

/// Two softnics of this process connected over loopback UDP (no peer process): for the
/// failure statuses, which need the responder set up just so.
fn pair(rnr_retry: u8, recv_room: u32) -> (Local, Local, Conn, Conn) {
    pair_with(rnr_retry, recv_room, |_, _| {})
}

/// [`pair`], with `adjust` changing the two records before they connect.
fn pair_with(
    rnr_retry: u8,
    recv_room: u32,
    adjust: impl Fn(&mut QpRecord, &mut QpRecord),
) -> (Local, Local, Conn, Conn) {
    connect_locals(
        Local::new(None),
        Local::new(None),
        rnr_retry,
        recv_room,
        adjust,
    )
}

/// [`pair_with`] for the two softnics `a` and `b`.
fn connect_locals(
    a: Local,
    b: Local,
    rnr_retry: u8,
    recv_room: u32,
    adjust: impl Fn(&mut QpRecord, &mut QpRecord),
) -> (Local, Local, Conn, Conn) {
    let mk = |l: &Local| {
        let cq = l.nic.create_cq(CqConfig::new(256)).unwrap();
        let mut qc = QpConfig::new(l.pd, cq);
        qc.rq_slots = 16;
        (l.nic.create_qp(qc).unwrap().qpn, cq)
    };
    let (qa, cqa) = mk(&a);
    let (qb, cqb) = mk(&b);
    let mut ra = record(&a.ep, qa, 10, 1024);
    ra.rnr_retry = rnr_retry;
    ra.regions.push(region_record("mem", &a.buf));
    let mut rb = record(&b.ep, qb, 20, 1024);
    rb.regions.push(region_record("mem", &b.buf));
    adjust(&mut ra, &mut rb);
    a.ep.connect(&ra, &rb).unwrap();
    b.ep.connect(&rb, &ra).unwrap();
    if recv_room > 0 {
        b.nic
            .post_recv(qb, 1, &[b.buf.mr.sge(0, recv_room)])
            .unwrap();
    }
    (
        a,
        b,
        Conn {
            qp: qa,
            cq: cqa,
            remote: rb,
        },
        Conn {
            qp: qb,
            cq: cqb,
            remote: ra,
        },
    )
}

/// `n` unsignaled 100 B WRITEs from `a` to `b` (message i at `i * 128`, bytes i), posted
/// and left: the queue has nothing more to run and nobody waits for their outcomes.
fn unsignaled_writes(a: &Local, ca: &Conn, n: usize) -> Vec<WorkRequest> {
    (0..n)
        .map(|i| {
            let at = (i * 128) as u64;
            a.buf.write(at as usize, &[i as u8; 100]);
            wr(
                i as u64,
                WqeFlags::NONE,
                WrOp::Write {
                    remote: remote_at(&ca.remote, at),
                    payload: Payload::Sgl(vec![a.buf.mr.sge(at, 100)]),
                    imm: None,
                },
            )
        })
        .collect()
}

/// Wait until `b` holds every WRITE of [`unsignaled_writes`].
fn await_unsignaled_writes(b: &Local, n: usize) {
    let deadline = Instant::now() + patience(10);
    for i in 0..n {
        while b.buf.read(i * 128, 100) != [i as u8; 100] {
            assert!(Instant::now() < deadline, "WRITE {i} never landed");
            std::thread::sleep(Duration::from_millis(1));
        }
    }
}

/// Unsignaled WRITEs ask for no ACK (but every 16th PSN), so their queue at rest leaves
/// them outstanding; their requester then asks for the ACK, by sending the newest packet
/// again with AckReq, and the responder's ACK covers them all: no retransmission. A
/// signaled WQE behind them completes after them.
#[test]
fn unsignaled_writes_at_rest_are_acknowledged_by_one_asked_for_ack() {
    let (a, b, ca, _) = pair(7, 0);
    // PSNs 10..=14: none is 15 mod 16, so none asks.
    a.nic
        .post_send(ca.qp, &unsignaled_writes(&a, &ca, 5))
        .unwrap();
    await_unsignaled_writes(&b, 5);
    // The ask goes 1 ms after the last send (a quarter of the 67 ms ACK timeout is more),
    // and its ACK comes back long before the ACK timeout could resend anything.
    let deadline = Instant::now() + patience(10);
    while b.ep.counters().sent == 0 {
        assert!(Instant::now() < deadline, "no ACK was asked for");
        std::thread::yield_now();
    }
    // A signaled NOP completes once every WRITE before it is acknowledged: they are.
    let r = a.post(
        &ca,
        9,
        WrOp::Nop {
            raw_segments: vec![],
        },
    );
    assert!(r.is_ok(), "{r:?}");
    assert_eq!(a.nic.qp_state(ca.qp).unwrap(), QpState::ReadyToSend);
    // Every datagram past the five WRITEs was an ask, answered by one ACK: nothing was
    // resent for want of an ACK. One ask on a quiet machine; a requester descheduled for
    // over 1 ms between two WRITEs asks once more.
    let (sent, acks) = (a.ep.counters().sent, b.ep.counters().sent);
    assert_eq!(
        sent,
        5 + acks,
        "five WRITEs and one ask per ACK: {sent} sent, {acks} ACKs"
    );
    assert!((1..=5).contains(&acks), "{acks} ACKs");
}

/// Unsignaled WRITEs left at rest on a lossy link still all land: their queue, with
/// nothing to run, is visited by its requester's timers, which ask for ACKs and resend
/// what was lost.
#[test]
fn unsignaled_writes_at_rest_survive_loss_reordering_and_duplication() {
    let (a, b, ca, _) = connect_locals(
        Local::new(Some(FAULTS)),
        Local::new(Some(FAULTS)),
        7,
        0,
        |_, _| {},
    );
    let n = 200;
    let wrs = unsignaled_writes(&a, &ca, n);
    for part in wrs.chunks(20) {
        a.nic.post_send(ca.qp, part).unwrap();
    }
    await_unsignaled_writes(&b, n);
    assert!(
        a.ep.counters().dropped + b.ep.counters().dropped > 0,
        "the faults were felt: {:?} {:?}",
        a.ep.drops().snapshot(),
        b.ep.drops().snapshot()
    );
    assert_eq!(a.nic.qp_state(ca.qp).unwrap(), QpState::ReadyToSend);
}

#[test]
fn failures_end_in_their_completion_status_with_the_qp_in_error() {
    // No receive and rnr_retry 1: RNR NAKs until the count runs out.
    let (a, _b, ca, _) = pair(1, 0);
    let r = a.post(
        &ca,
        1,
        WrOp::Send {
            payload: Payload::Inline(vec![1; 8]),
            imm: None,
        },
    );
    assert_eq!(r.status, Err(Syndrome::RnrRetryExceeded));
    assert_eq!(a.nic.qp_state(ca.qp).unwrap(), QpState::Error);

    // A SEND longer than the receive: invalid request, and the responder's QP in error too.
    let (a, b, ca, cb) = pair(7, 16);
    let r = a.post(
        &ca,
        2,
        WrOp::Send {
            payload: Payload::Inline(vec![1; 64]),
            imm: None,
        },
    );
    assert_eq!(r.status, Err(Syndrome::RemoteInvalidRequest));
    assert_eq!(a.nic.qp_state(ca.qp).unwrap(), QpState::Error);
    wait_until("the responder's QP is in error", || {
        b.nic.qp_state(cb.qp).unwrap() == QpState::Error
    });

    // A receive whose own key is bad: the responder cannot place the SEND (remote
    // operational error), and its QP goes to error with an error completion.
    let (a, b, ca, cb) = pair(7, 0);
    let bad = redn_program::wqe::Sge {
        addr: redn_sys::VirtAddr(0x10),
        len: 64,
        lkey: redn_sys::Lkey(0xbad00),
    };
    b.nic.post_recv(cb.qp, 4, &[bad]).unwrap();
    let r = a.post(
        &ca,
        4,
        WrOp::Send {
            payload: Payload::Inline(vec![1; 8]),
            imm: None,
        },
    );
    assert_eq!(r.status, Err(Syndrome::RemoteOperation));
    let recv = wait_cqes(&b.nic, cb.cq, 1);
    assert!(!recv[0].is_ok(), "{recv:?}");

    // A peer that keeps no READ state (max_dest_rd_atomic 0): READs are not sent.
    let (a, _b, ca, _) = pair_with(7, 0, |_, rb| rb.max_dest_rd_atomic = 0);
    let r = a.post(
        &ca,
        5,
        WrOp::Read {
            remote: remote_at(&ca.remote, 0),
            sgl: vec![a.buf.mr.sge(0, 8)],
        },
    );
    assert_eq!(r.status, Err(Syndrome::RemoteInvalidRequest));

    // A masked atomic has no RC opcode: refused before anything is sent.
    let (a, _b, ca, _) = pair(7, 0);
    let r = a.post(
        &ca,
        3,
        WrOp::MaskedCompareSwap {
            remote: remote_at(&ca.remote, 0),
            compare: 0,
            compare_mask: 0,
            swap: 1,
            swap_mask: 1,
            result: Some(a.buf.mr.sge(64, 8)),
        },
    );
    assert_eq!(r.status, Err(Syndrome::RemoteInvalidRequest));
}

#[test]
fn a_send_waits_out_rnr_naks_until_a_receive_is_posted() {
    let (a, b, ca, cb) = pair(7, 0);
    a.buf.write(0, b"late receive");
    a.nic
        .post_send(
            ca.qp,
            &[wr(
                5,
                SIG,
                WrOp::Send {
                    payload: Payload::Sgl(vec![a.buf.mr.sge(0, 12)]),
                    imm: Some(3),
                },
            )],
        )
        .unwrap();
    // The SEND is refused (RNR) until the receive is there; then it lands once. Its
    // completion waits for its ACK.
    wait_until("an RNR NAK came back", || a.ep.counters().received > 0);
    assert_eq!(a.nic.cq_produced(ca.cq).unwrap(), 0, "not completed");
    b.nic
        .post_recv(cb.qp, 9, &[b.buf.mr.sge(4096, 64)])
        .unwrap();
    let got = wait_cqes(&a.nic, ca.cq, 1);
    assert!(got[0].is_ok(), "{got:?}");
    let recv = wait_cqes(&b.nic, cb.cq, 1);
    assert_eq!(
        (recv[0].wr_id, recv[0].byte_len, recv[0].imm),
        (9, 12, Some(3))
    );
    assert_eq!(b.buf.read(4096, 12), b"late receive");
}

/// WRITEs from `a` to `b` and back, each checked placed, until `b`'s receive thread has
/// taken a datagram and at least `rounds` have gone each way.
fn writes_both_ways_until_b_receive_thread_serves(
    a: &Local,
    b: &Local,
    ca: &Conn,
    cb: &Conn,
    rounds: u64,
) {
    let mut i = 0u64;
    wait_until("b's receive thread took a request", || {
        i += 1;
        let data = i.to_le_bytes();
        let off = 64 * (i % 64);
        a.write(ca, off, &data, None);
        assert_eq!(b.buf.read(off as usize, 8), data, "WRITE {i} placed");
        // And the other way, so that each side holds replies while it polls.
        b.write(cb, 8192 + off, &data, None);
        assert_eq!(a.buf.read(8192 + off as usize, 8), data, "WRITE {i} back");
        b.ep.counters().by_receive_thread > 0 && i >= rounds
    });
}

/// The socket is served whoever takes its datagrams off: the responder's PU while it is
/// awake, its receive thread once the PU has parked (a WRITE gives the PU no work, so it
/// parks and stays parked). WRITEs keep completing, each placed exactly, until the
/// receive thread has taken some; the requester's PU, which held the ACKs it owed while it
/// polled, sends them all (every WRITE of the other direction completes too).
#[test]
fn the_socket_is_served_whether_a_pu_or_the_receive_thread_polls_it() {
    let (a, b, ca, cb) = pair(7, 0);
    writes_both_ways_until_b_receive_thread_serves(&a, &b, &ca, &cb, 1);
    let kb = b.ep.counters();
    assert!(kb.by_receive_thread <= kb.received, "{kb:?}");
}

// Host-driven softnics (`SoftNicConfig::host_driven`): no PU thread; the app's calls run
// the queues and take the datagrams, and the endpoint's receive thread serves the socket
// while the app does not call in.

#[test]
fn every_opcode_from_a_host_driven_client() {
    let local = Local::host_driven("hd-every", None);
    let mut peer = Peer::spawn("memory", None);
    every_opcode(&local, &mut peer, 1024);
    assert!(
        !thread_names().iter().any(|n| n.starts_with("hd-every-pu")),
        "a host-driven softnic starts no PU thread: {:?}",
        thread_names()
    );
    let report = peer.finish();
    assert!(report.ends_with("state ERR\n"), "{report}");
    assert_eq!(local.ep.drops().get(DropReason::BadIcrc), 0);
}

#[test]
fn loss_reordering_and_duplication_through_a_host_driven_client() {
    exact_under_faults(&Local::host_driven("hd-faults", Some(FAULTS)));
}

#[test]
fn hash_get_served_to_a_host_driven_client() {
    hash_gets(offload_rig_for(
        Local::host_driven("hd-hash", None),
        "offload:hash-get",
    ));
}

/// While the host-driven side's app waits on the other side (it makes no call), its
/// receive thread serves the socket once the app's lease on it runs out: the other side's
/// WRITEs are placed and ACKed (with the ACKs the app held for its next request), and the
/// app's own WRITEs, run in its calls, go on between. Nothing is lost or placed twice.
#[test]
fn a_host_driven_app_that_stops_calling_is_served_by_its_receive_thread() {
    let (a, b, ca, cb) = connect_locals(
        Local::new(None),
        Local::host_driven("hd-quiet", None),
        7,
        0,
        |_, _| {},
    );
    // `b` makes no call while `a` waits for its WRITE's completion.
    writes_both_ways_until_b_receive_thread_serves(&a, &b, &ca, &cb, 8);
    for (l, c) in [(&a, &ca), (&b, &cb)] {
        assert_eq!(l.nic.qp_state(c.qp).unwrap(), QpState::ReadyToSend);
    }
}

/// A host-driven queue runs only in its app's calls: a WAIT satisfied by a WRITE_IMM that
/// the receive thread placed releases its WRITE at the app's next call, not before.
#[test]
fn a_host_driven_queue_runs_only_when_its_app_calls_in() {
    let (a, b, ca, cb) = connect_locals(
        Local::new(None),
        Local::host_driven("hd-wait", None),
        7,
        64,
        |_, _| {},
    );
    b.buf.write(4096, b"released");
    let answer = WrOp::Write {
        remote: remote_at(&cb.remote, 256),
        payload: Payload::Sgl(vec![b.buf.mr.sge(4096, 8)]),
        imm: None,
    };
    let chain = [
        wr(
            0,
            redn_program::wqe::WqeFlags::NONE,
            WrOp::Wait {
                cq: cb.cq,
                count: 0,
            },
        ),
        wr(1, redn_program::wqe::WqeFlags::NONE, answer),
    ];
    b.nic.post_send(cb.qp, &chain).unwrap();
    // Placed and completed on `b` by its receive thread; `a`'s WRITE completes.
    a.write(&ca, 512, b"trigger!", Some(5));
    assert_eq!(b.buf.read(512, 8), b"trigger!");
    assert_eq!(
        b.nic.sq_consumed(cb.qp).unwrap(),
        0,
        "the WAIT has not passed: nobody has called into `b` since its CQE"
    );
    assert_eq!(
        a.buf.read(256, 8),
        [0; 8],
        "no answer before `b`'s app calls"
    );
    wait_until("the answer lands after `b`'s app calls in", || {
        b.nic.progress();
        a.buf.read(256, 8) == b"released"
    });
    let recv = wait_cqes(&b.nic, cb.cq, 1);
    assert_eq!((recv[0].imm, recv[0].byte_len), (Some(5), 8));
}
