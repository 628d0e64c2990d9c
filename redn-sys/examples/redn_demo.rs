//! RedN's `if` on the softnic: the catalog's `hash-get` offload answers GETs with the server's
//! NIC alone.
//!
//! Two softnic instances stand for two hosts. The server installs `hash-get` (one bucket per
//! GET) over a small table. For each GET its worker queue runs, with no host CPU:
//!
//! | worker WQE | does |
//! |---|---|
//! | WAIT(client queue's CQ, k) | until GET k has arrived (its receive patched this chain) |
//! | SEND_EN(worker) | doorbell order: only now may the patched READ and CAS be fetched |
//! | READ bucket | key → the response WQE's operand bytes, value length and address → its data |
//! | CAS (the `if`) | response still NOP with the requested key → the real WRITE_IMM |
//! | masked CAS (`else`) | still a NOP → a zero-length WRITE_IMM: "not found" |
//! | WAIT, SEND_EN(client queue) | release the response |
//!
//! The client SENDs 14 bytes (48-bit key little-endian, bucket address big-endian) and gets
//! the value, or a zero-length answer, by RDMA WRITE with immediate.
//!
//! Run: `cargo run --release -p redn-sys --example redn_demo [-- --requests N]`

use redn_program::program::catalog::{self, HashVariant, BUCKET_STRIDE};
use redn_program::program::Program;
use redn_program::wqe::{Opcode, Payload, WorkRequest, WqeFlags, WrOp};
use redn_sys::conv::idx;
use redn_sys::install::{install, RegionBinding};
use redn_sys::mem::SharedBuffer;
use redn_sys::nic::{CqConfig, Nic, QpConfig};
use redn_sys::softnic::{Prefetch, SoftNic, SoftNicConfig};
use redn_sys::Access;
use std::collections::HashMap;
use std::time::{Duration, Instant};

/// Value size served per hit.
pub const VALUE_LEN: usize = 64;
/// Buckets in the table.
pub const BUCKETS: u64 = 16;
const VALUES_AT: usize = 4096;

/// One request's outcome.
#[derive(Debug, Clone, PartialEq)]
pub struct Answer {
    /// Key asked for.
    pub key: u64,
    /// Bucket probed.
    pub bucket: u64,
    /// The value, or `None` for a zero-length ("not found") answer.
    pub value: Option<Vec<u8>>,
    /// Round-trip time.
    pub micros: f64,
}

/// What the server NIC did.
#[derive(Debug, Clone)]
pub struct ServerStats {
    /// WQEs executed on the server, by opcode.
    pub by_opcode: Vec<(Opcode, u64)>,
    /// Host posts made on the server after setup (zero: the NIC serves alone).
    pub host_posts_after_setup: u64,
}

/// The value stored for key `k`.
pub fn value_of(k: u64) -> Vec<u8> {
    let mut v = format!("value of key {k:#014x}: served by the NIC").into_bytes();
    v.resize(VALUE_LEN, b'.');
    v
}

/// The key stored in bucket `b`.
pub fn key_of_bucket(b: u64) -> u64 {
    0xabcd_0000_0000 | (b * 7 + 1)
}

/// The offload the demo installs for `requests` GETs.
pub fn program(requests: u32) -> Program {
    catalog::hash_get(HashVariant::Single, requests).expect("catalog hash-get builds")
}

/// Run `requests` as (key, bucket) pairs through the offload; return answers and server stats.
pub fn run(requests: &[(u64, u64)], prefetch: Prefetch) -> (Vec<Answer>, ServerStats) {
    let cfg = |name: &str, pus| {
        let mut c = SoftNicConfig::new(name);
        c.pus = pus;
        c.prefetch = prefetch;
        c
    };
    let server = std::sync::Arc::new(SoftNic::new(cfg("server", 2)).expect("server softnic"));
    let client = SoftNic::new(cfg("client", 1)).expect("client softnic");

    // Server: one buffer holding the bucket table and the values. The install registers it
    // in the offload's own protection domains, with narrow keys.
    let data_len = VALUES_AT + idx(BUCKETS) * VALUE_LEN;
    let data = SharedBuffer::new(data_len);
    for b in 0..BUCKETS {
        let key = key_of_bucket(b);
        let at = VALUES_AT + idx(b) * VALUE_LEN;
        data.write(at, &value_of(key));
        let len = u32::try_from(VALUE_LEN).unwrap();
        let bucket = catalog::bucket_bytes(key, len, data.addr().0 + at as u64);
        data.write(idx(b * BUCKET_STRIDE), &bucket);
    }

    // Client: a response buffer and a queue pair.
    let cpd = client.alloc_pd().unwrap();
    let cbuf = SharedBuffer::new(4096);
    let cmr = client.reg_mr(cpd, &cbuf, 0, 4096, Access::ALL).unwrap();
    let ccq = client.create_cq(CqConfig::new(1024)).unwrap();
    let mut qcfg = QpConfig::new(cpd, ccq);
    qcfg.rq_slots = 1024;
    let cqp = client.create_qp(qcfg).unwrap().qpn;

    // Install the offload for this client: the table and values on the server, the
    // response buffer on the client.
    let n = u32::try_from(requests.len().max(1)).expect("at most 2^32 - 1 requests");
    let program = program(n);
    let mut regions = HashMap::new();
    let local = |len| RegionBinding::Local {
        buffer: std::sync::Arc::clone(&data),
        offset: 0,
        len,
        access: Access::REMOTE_READ,
    };
    regions.insert("table".to_string(), local(idx(BUCKETS * BUCKET_STRIDE)));
    regions.insert("values".to_string(), local(data_len));
    regions.insert(
        "response".to_string(),
        RegionBinding::Remote {
            addr: cmr.addr,
            rkey: cmr.lkey.into(),
            len: 4096,
        },
    );
    let installed = install(&server, &program, &regions, &mut |q| {
        SoftNic::connect_pair(&client, cqp, &server, q)
    })
    .expect("install hash-get");
    let server_qps: Vec<_> = installed
        .qps
        .iter()
        .map(|q| q.qpn)
        .chain([installed.master])
        .collect();
    let host_posts = || -> u64 {
        server_qps
            .iter()
            .map(|q| server.counters(*q).unwrap().host_posts)
            .sum()
    };
    let posts_at_setup = host_posts();

    // One GET at a time.
    let mut answers = Vec::new();
    let mut polled = Vec::new();
    // Numbered as the offload numbers its invocations (its immediates); n fits a u32.
    for (i, &(key, bucket)) in (0u32..).zip(requests) {
        client.post_recv(cqp, u64::from(i), &[]).unwrap();
        let mut msg = catalog::trigger_key(key).to_vec();
        msg.extend((data.addr().0 + bucket * BUCKET_STRIDE).to_be_bytes());
        let start = Instant::now();
        client
            .post_send(
                cqp,
                &[WorkRequest {
                    wr_id: u64::from(i),
                    flags: WqeFlags::NONE,
                    op: WrOp::Send {
                        payload: Payload::Inline(msg),
                        imm: None,
                    },
                }],
            )
            .unwrap();
        let deadline = start + Duration::from_secs(30);
        let answer = loop {
            polled.clear();
            client.poll_cq(ccq, 4, &mut polled).unwrap();
            if let Some(c) = polled.iter().find(|c| c.imm == Some(i)) {
                assert!(c.is_ok(), "response failed: {c:?}");
                let mut v = vec![0u8; c.byte_len as usize];
                cbuf.read(0, &mut v);
                break (c.byte_len > 0).then_some(v);
            }
            assert!(Instant::now() < deadline, "GET {i} got no answer");
            std::thread::yield_now();
        };
        let micros = start.elapsed().as_secs_f64() * 1e6;
        answers.push(Answer {
            key,
            bucket,
            value: answer,
            micros,
        });
    }
    // The client has every answer; wait until the server's client-facing queue has published
    // them as consumed too, so its counters are complete (one BB per answer).
    let client_queue = installed.qps[0].qpn;
    let deadline = Instant::now() + Duration::from_secs(30);
    while server.sq_consumed(client_queue).unwrap() < requests.len() as u64 {
        assert!(
            Instant::now() < deadline,
            "the server never retired its answers"
        );
        std::thread::yield_now();
    }
    let mut by_opcode: Vec<(Opcode, u64)> = Vec::new();
    for q in &installed.qps {
        let c = server.counters(q.qpn).unwrap();
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
            host_posts_after_setup: host_posts() - posts_at_setup,
        },
    )
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
                    .filter(|&v| v > 0 && v <= 1024)
                    .unwrap_or_else(|| {
                        eprintln!("redn_demo: --requests takes a number in 1..=1024");
                        std::process::exit(2)
                    })
            }
            "-h" | "--help" => {
                println!(
                    "redn_demo: RedN's hash GET (a CAS-built `if`) answered by a softnic.\n\n\
                     Usage: redn_demo [--requests N]\n\n\
                     Installs the catalog's hash-get offload on a server softnic and sends N GETs\n\
                     from a client softnic; every third asks for a key its bucket does not hold,\n\
                     which the NIC answers with a zero-length \"not found\"."
                );
                return;
            }
            other => {
                eprintln!("redn_demo: unknown argument {other:?} (try --help)");
                std::process::exit(2);
            }
        }
    }
    let reqs: Vec<(u64, u64)> = (0..requests as u64)
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
    println!(
        "RedN hash GET on the softnic: {requests} GETs from a client softnic to the catalog's \
         hash-get offload on a server softnic\n"
    );
    let listing = program(1).listing();
    println!("the server's worker chain for one GET (from `Program::listing`):");
    let mut in_worker = false;
    for line in listing.lines() {
        if line.starts_with("queue ") || line.starts_with("response:") {
            in_worker = line.starts_with("queue worker0");
        }
        if in_worker && !line.trim_start().starts_with("recv") {
            println!("  {line}");
        }
    }
    println!();
    let (answers, stats) = run(&reqs, Prefetch::Adversarial);
    println!(
        "{:>3}  {:>14}  {:>6}  {:>9}  answer",
        "#", "key", "bucket", "rtt (µs)"
    );
    let mut wrong = 0;
    for (i, a) in answers.iter().enumerate() {
        let expected = (key_of_bucket(a.bucket) == a.key).then(|| value_of(a.key));
        let shown = match &a.value {
            Some(v) => format!("hit: {}", String::from_utf8_lossy(v).trim_end_matches('.')),
            None => "not found (zero-length answer from the `else`)".to_string(),
        };
        let ok = a.value == expected;
        if !ok {
            wrong += 1;
        }
        println!(
            "{i:>3}  {:#014x}  {:>6}  {:>9.1}  {shown}{}",
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
