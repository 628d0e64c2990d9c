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

#[path = "../common/mod.rs"]
mod common;
mod host_driven;
mod offloads;
mod opcodes;
mod pairs;

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
/// Faults both ways: 3 % of datagrams each dropped, duplicated and reordered.
const FAULTS: Faults = Faults {
    seed: 7,
    drop: 30,
    duplicate: 30,
    reorder: 30,
};
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

    /// Fail the test unless `r` succeeded, with what the endpoint dropped and the QP's
    /// transport state: a retry exceeded under injected faults (seen once in CI, under
    /// load) then says whether anything came back at all.
    fn expect_ok(&self, what: &str, r: &Completion) {
        assert!(
            r.is_ok(),
            "{what}: {r:?}\nendpoint drops {:?}, {:?}",
            self.ep.drops().snapshot(),
            self.ep.counters(),
        );
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
        self.expect_ok("write", &r);
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
        self.expect_ok("read", &r);
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
        self.expect_ok("fetch-add", &r);
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
        self.expect_ok("cas", &r);
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
        self.expect_ok("send", &r);
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
