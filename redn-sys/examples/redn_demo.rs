//! RedN's `if` on the softnic: a hash-table GET answered by the server's NIC alone.
//!
//! Two softnic instances stand for two hosts. The server pre-posts, for each expected request,
//! a chain on a managed worker queue (RedN §3, hash lookup with one bucket):
//!
//! | worker WQE | does |
//! |---|---|
//! | WAIT(recv CQ, k) | until request k has arrived (its receive scattered into this chain) |
//! | SEND_EN(worker, 6k+8) | doorbell order: only now may the patched READ and CAS be fetched |
//! | READ bucket | key → response WQE's QPN field, value pointer → its data segment |
//! | CAS response ctrl | compare = NOP image carrying the requested key, swap = WRITE_IMM image |
//! | WAIT(worker CQ, k) | until the CAS completed |
//! | SEND_EN(client QP, k+1) | release the response WQE: a WRITE_IMM on a hit, a NOP on a miss |
//!
//! The client SENDs 11 bytes (24-bit key, big-endian bucket address); the answer arrives by
//! RDMA WRITE with immediate. After setup, the server host posts nothing.
//!
//! Run: `cargo run --release -p redn-sys --example redn_demo [-- --requests N]`

use redn_sys::mem::SharedBuffer;
use redn_sys::nic::{Completion, CqConfig, Nic, QpConfig};
use redn_sys::softnic::{Prefetch, SoftNic, SoftNicConfig};
use redn_sys::wqe::{off, Opcode, Payload, RemoteAddr, WorkRequest, WqeFlags, WrOp, BB_SIZE};
use redn_sys::{Access, Qpn};
use std::time::{Duration, Instant};

/// Value size served per hit.
pub const VALUE_LEN: u32 = 64;
/// Buckets in the table.
pub const BUCKETS: u64 = 16;
const BUCKET_STRIDE: u64 = 16;
const VALUES_AT: u64 = 4096;
/// How long the client waits for an answer before calling it a miss.
pub const MISS_TIMEOUT: Duration = Duration::from_millis(20);

/// One request's outcome.
#[derive(Debug, Clone, PartialEq)]
pub struct Answer {
    /// Key asked for.
    pub key: u32,
    /// Bucket probed.
    pub bucket: u64,
    /// The value, or `None` when nothing came back.
    pub value: Option<Vec<u8>>,
    /// Round-trip time.
    pub micros: f64,
}

/// What the server NIC did.
#[derive(Debug, Clone)]
pub struct ServerStats {
    /// WQEs executed on the server, by opcode name.
    pub by_opcode: Vec<(Opcode, u64)>,
    /// Host posts made on the server after setup (should be zero).
    pub host_posts_after_setup: u64,
}

/// The value stored for key `k`.
pub fn value_of(k: u32) -> Vec<u8> {
    let mut v = format!("value of key {k:#08x}: served by the NIC").into_bytes();
    v.resize(VALUE_LEN as usize, b'.');
    v
}

/// The key stored in bucket `b`.
pub fn key_of_bucket(b: u64) -> u32 {
    0x00ab_0000 | (b as u32 * 7 + 1)
}

/// Run `requests` as (key, bucket) pairs through the offload; return answers and server stats.
pub fn run(requests: &[(u32, u64)], prefetch: Prefetch) -> (Vec<Answer>, ServerStats) {
    let n = requests.len() as u64;
    let server = SoftNic::new(SoftNicConfig {
        name: "server".into(),
        pus: 2,
        prefetch,
        wqe_checks: false,
    })
    .expect("server softnic");
    let client = SoftNic::new(SoftNicConfig {
        name: "client".into(),
        pus: 1,
        prefetch,
        wqe_checks: false,
    })
    .expect("client softnic");

    // --- server: data region with the bucket table and the values --------------------------
    let spd = server.alloc_pd().unwrap();
    let data_buf = SharedBuffer::new((VALUES_AT + BUCKETS * u64::from(VALUE_LEN)) as usize);
    let data = server
        .reg_mr(spd, &data_buf, 0, data_buf.len(), Access::REMOTE_READ)
        .unwrap();
    for b in 0..BUCKETS {
        let key = key_of_bucket(b);
        let value_at = VALUES_AT + b * u64::from(VALUE_LEN);
        let bucket_at = (b * BUCKET_STRIDE) as usize;
        data_buf.write(bucket_at, &key.to_be_bytes()[1..]);
        data_buf.write(bucket_at + 3, &(data.addr.0 + value_at).to_be_bytes());
        data_buf.write(value_at as usize, &value_of(key));
    }

    // --- client side ------------------------------------------------------------------------
    let cpd = client.alloc_pd().unwrap();
    let cbuf = SharedBuffer::new(8192);
    let cmr = client.reg_mr(cpd, &cbuf, 0, 8192, Access::ALL).unwrap();
    let ccq = client
        .create_cq(CqConfig {
            depth: 1024,
            ignore_overrun: false,
        })
        .unwrap();
    let cqp = client.create_qp(QpConfig::new(cpd, ccq)).unwrap();

    // --- server queues ----------------------------------------------------------------------
    let recv_cq = server
        .create_cq(CqConfig {
            depth: 1024,
            ignore_overrun: true,
        })
        .unwrap();
    let work_cq = server
        .create_cq(CqConfig {
            depth: 1024,
            ignore_overrun: true,
        })
        .unwrap();
    let ring_bbs = (6 * n + 8).next_power_of_two() as u32;
    let mut scfg = QpConfig::new(spd, recv_cq);
    scfg.managed_send = true;
    scfg.sq_bbs = (n + 1).next_power_of_two() as u32;
    scfg.rq_slots = (n + 1).next_power_of_two() as u32;
    scfg.pu = Some(0);
    let sqp = server.create_qp(scfg).unwrap();
    let mut wcfg = QpConfig::new(spd, work_cq);
    wcfg.managed_send = true;
    wcfg.sq_bbs = ring_bbs;
    wcfg.pu = Some(1);
    let wqp = server.create_qp(wcfg).unwrap();
    let master = server.create_qp(QpConfig::new(spd, work_cq)).unwrap();
    let code = |q: &redn_sys::nic::QpInfo| {
        server
            .reg_mr(
                spd,
                &q.sq.buffer,
                q.sq.offset,
                (q.sq.entries * q.sq.stride) as usize,
                Access::ALL,
            )
            .unwrap()
    };
    let ring_s = code(&sqp);
    let ring_w = code(&wqp);
    SoftNic::connect_pair(&client, cqp.qpn, &server, sqp.qpn).unwrap();
    server.connect(wqp.qpn, wqp.qpn).unwrap();
    server.connect(master.qpn, master.qpn).unwrap();

    // --- server program, one iteration per expected request --------------------------------
    let resp_at = |k: u64| k * BB_SIZE as u64; // R_k: slot k of the client-facing queue
    let client_resp = RemoteAddr {
        addr: cmr.addr,
        rkey: cmr.lkey.into(),
    };
    let mut responses = Vec::new();
    let mut chain = Vec::new();
    for k in 0..n {
        // R_k: WRITE_IMM of the value (pointer patched by the READ), posted in NOP form.
        let r = WorkRequest {
            wr_id: 1000 + k,
            flags: WqeFlags::NONE,
            op: WrOp::Write {
                remote: client_resp,
                payload: Payload::Sgl(vec![data.sge(0, VALUE_LEN)]),
                imm: Some(k as u32),
            },
        };
        let swap_image = ctrl_image(k as u16, Opcode::RdmaWriteImm, sqp.qpn, 3);
        let nop_image = ctrl_image(k as u16, Opcode::Nop, Qpn(0), 3);
        responses.push((r, nop_image));
        let base = 6 * k;
        chain.extend([
            wr(
                WrOp::Wait {
                    cq: recv_cq,
                    count: k as u32,
                },
                WqeFlags::NONE,
            ),
            wr(
                WrOp::SendEnable {
                    qp: wqp.qpn,
                    pi: (base + 8) as u32,
                },
                WqeFlags::NONE,
            ),
            wr(
                WrOp::Read {
                    remote: data.remote(0), // raddr patched by the request
                    sgl: vec![
                        ring_s.sge(resp_at(k) + off::QPN as u64, 3),
                        ring_s.sge(resp_at(k) + 40, 8),
                    ],
                },
                WqeFlags::NONE,
            ),
            wr(
                WrOp::CompareSwap {
                    remote: ring_s.remote(resp_at(k)),
                    compare: u64::from_le_bytes(nop_image),
                    swap: u64::from_le_bytes(swap_image),
                    result: None,
                },
                WqeFlags::SIGNALED | WqeFlags::FENCE,
            ),
            wr(
                WrOp::Wait {
                    cq: work_cq,
                    count: k as u32,
                },
                WqeFlags::NONE,
            ),
            wr(
                WrOp::SendEnable {
                    qp: sqp.qpn,
                    pi: (k + 1) as u32,
                },
                WqeFlags::NONE,
            ),
        ]);
    }
    let resp_wrs: Vec<WorkRequest> = responses.iter().map(|(r, _)| r.clone()).collect();
    server.post_send(sqp.qpn, &resp_wrs).unwrap();
    for (k, (_, nop)) in responses.iter().enumerate() {
        // Turn each posted WRITE_IMM into its NOP form (opcode 0, QPN 0): the CAS decides.
        sqp.sq.buffer.write(sqp.sq.offset + k * BB_SIZE, nop);
    }
    server.post_send(wqp.qpn, &chain).unwrap();
    // Arm: each receive scatters the key into CAS_k's compare (bytes 41..43) and the bucket
    // address into READ_k's remote address (bytes 16..23).
    for k in 0..n {
        let base = 6 * k * BB_SIZE as u64;
        let cas = base + 3 * BB_SIZE as u64;
        let read = base + 2 * BB_SIZE as u64;
        server
            .post_recv(
                sqp.qpn,
                k,
                &[
                    ring_w.sge(cas + 41, 3),
                    ring_w.sge(read + off::RADDR as u64, 8),
                ],
            )
            .unwrap();
    }
    // Kick off: enable the first WAIT and SEND_EN of the worker.
    server
        .post_send(
            master.qpn,
            &[wr(WrOp::SendEnable { qp: wqp.qpn, pi: 2 }, WqeFlags::NONE)],
        )
        .unwrap();
    let server_qps = [sqp.qpn, wqp.qpn, master.qpn];
    let host_posts = |nic: &SoftNic| -> u64 {
        server_qps
            .iter()
            .map(|q| nic.counters(*q).unwrap().host_posts)
            .sum()
    };
    let posts_at_setup = host_posts(&server);

    // --- client: one request at a time -----------------------------------------------------
    let mut answers = Vec::new();
    let mut polled: Vec<Completion> = Vec::new();
    for (i, &(key, bucket)) in requests.iter().enumerate() {
        client.post_recv(cqp.qpn, i as u64, &[]).unwrap();
        let mut msg = [0u8; 11];
        msg[..3].copy_from_slice(&key.to_le_bytes()[..3]);
        msg[3..].copy_from_slice(&(data.addr.0 + bucket * BUCKET_STRIDE).to_be_bytes());
        cbuf.write(4096, &[0u8; VALUE_LEN as usize]);
        let start = Instant::now();
        client
            .post_send(
                cqp.qpn,
                &[wr(
                    WrOp::Send {
                        payload: Payload::Inline(msg.to_vec()),
                        imm: None,
                    },
                    WqeFlags::NONE,
                )],
            )
            .unwrap();
        let mut got = None;
        while start.elapsed() < MISS_TIMEOUT {
            polled.clear();
            client.poll_cq(ccq, 4, &mut polled).unwrap();
            if let Some(c) = polled.iter().find(|c| c.imm == Some(i as u32)) {
                assert!(c.is_ok(), "response failed: {c:?}");
                let mut v = vec![0u8; VALUE_LEN as usize];
                cbuf.read(0, &mut v);
                got = Some(v);
                break;
            }
            std::hint::spin_loop();
        }
        let micros = start.elapsed().as_secs_f64() * 1e6;
        answers.push(Answer {
            key,
            bucket,
            value: got,
            micros,
        });
    }
    let mut by_opcode = Vec::new();
    for q in [sqp.qpn, wqp.qpn] {
        let c = server.counters(q).unwrap();
        for op in Opcode::ALL {
            let v = c.by_opcode(op);
            if v > 0 {
                match by_opcode.iter_mut().find(|(o, _)| *o == op) {
                    Some((_, n)) => *n += v,
                    None => by_opcode.push((op, v)),
                }
            }
        }
    }
    (
        answers,
        ServerStats {
            by_opcode,
            host_posts_after_setup: host_posts(&server) - posts_at_setup,
        },
    )
}

fn wr(op: WrOp, flags: WqeFlags) -> WorkRequest {
    WorkRequest {
        wr_id: 0,
        flags,
        op,
    }
}

/// The first 8 bytes of a control segment, as the CAS sees them.
fn ctrl_image(idx: u16, opcode: Opcode, qpn: Qpn, ds: u8) -> [u8; 8] {
    let i = idx.to_be_bytes();
    let q = qpn.0.to_be_bytes();
    [0, i[0], i[1], opcode as u8, q[1], q[2], q[3], ds]
}

#[allow(dead_code)]
fn main() {
    let mut requests = 8usize;
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        match a.as_str() {
            "--requests" => {
                requests = args
                    .next()
                    .and_then(|v| v.parse().ok())
                    .filter(|&v| v > 0 && v <= 4096)
                    .unwrap_or_else(|| {
                        eprintln!("redn_demo: --requests takes a number in 1..=4096");
                        std::process::exit(2)
                    })
            }
            "-h" | "--help" => {
                println!(
                    "redn_demo: RedN's hash GET (a CAS-built `if`) answered by a softnic.\n\n\
                     Usage: redn_demo [--requests N]\n\n\
                     Every third request asks for a key its bucket does not hold: the CAS\n\
                     leaves the response a NOP and nothing comes back ({} ms timeout).",
                    MISS_TIMEOUT.as_millis()
                );
                return;
            }
            other => {
                eprintln!("redn_demo: unknown argument {other:?} (try --help)");
                std::process::exit(2);
            }
        }
    }
    let reqs: Vec<(u32, u64)> = (0..requests as u64)
        .map(|i| {
            let b = (i * 5) % BUCKETS;
            let key = if i % 3 == 2 {
                key_of_bucket(b) ^ 0x40
            } else {
                key_of_bucket(b)
            };
            (key, b)
        })
        .collect();
    println!("RedN hash GET on the softnic: {requests} requests, client and server on two softnic instances");
    println!("server chain per request: WAIT, SEND_EN, READ, CAS (the `if`), WAIT, SEND_EN, then the response WQE\n");
    let (answers, stats) = run(&reqs, Prefetch::Adversarial);
    println!(
        "{:>3}  {:>8}  {:>6}  {:>9}  answer",
        "#", "key", "bucket", "rtt (µs)"
    );
    let mut wrong = 0;
    for (i, a) in answers.iter().enumerate() {
        let expected = (key_of_bucket(a.bucket) == a.key).then(|| value_of(a.key));
        let shown = match &a.value {
            Some(v) => format!("hit: {}", String::from_utf8_lossy(v).trim_end_matches('.')),
            None => "miss: the CAS left the response a NOP".to_string(),
        };
        let ok = a.value == expected;
        if !ok {
            wrong += 1;
        }
        println!(
            "{i:>3}  {:#08x}  {:>6}  {:>9.1}  {shown}{}",
            a.key,
            a.bucket,
            a.micros,
            if ok { "" } else { "  <-- WRONG" }
        );
    }
    println!("\nserver NIC executed:");
    for (op, n) in &stats.by_opcode {
        println!("  {:<10} {n}", op.name());
    }
    println!(
        "server host posts after setup: {}",
        stats.host_posts_after_setup
    );
    if wrong > 0 {
        eprintln!("redn_demo: {wrong} wrong answers");
        std::process::exit(1);
    }
}
