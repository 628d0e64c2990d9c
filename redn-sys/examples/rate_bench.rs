//! How closely the softnic holds a queue's rate limit on real threads: a table, not a test.
//!
//! `cargo run --release -p redn-sys --example rate_bench [-- --quick]`
//!
//! For each configured rate, one queue runs NOPs (WQE rates) or 64 KiB WRITEs (byte rates)
//! for about half a second (a tenth with `--quick`) and the table shows the rate measured
//! from the post to the last completion. The limiter's burst is a millisecond of traffic, so
//! a PU woken late loses what it could not spend: on a loaded machine the measured rate
//! falls below the configured one (it never exceeds it by more than a burst, which
//! `tests/rate_limit.rs` checks). The bucket arithmetic itself is tested exactly, on a
//! manual clock, in `softnic::rate`.

use redn_program::wqe::{Payload, WorkRequest, WqeFlags, WrOp};
use redn_sys::conv::{idx, low32};
use redn_sys::mem::SharedBuffer;
use redn_sys::nic::{CqConfig, Nic, QpConfig, RateLimit};
use redn_sys::softnic::{Prefetch, SoftNic, SoftNicConfig};
use redn_sys::{Access, Cqn};
use std::time::{Duration, Instant};

const WRITE: u64 = 64 << 10;

fn main() {
    let mut secs = 0.5;
    for a in std::env::args().skip(1) {
        match a.as_str() {
            "--quick" => secs = 0.1,
            "--help" | "-h" => {
                println!("rate_bench [--quick]: configured vs measured softnic rate limits");
                return;
            }
            other => {
                eprintln!("rate_bench: unknown argument {other:?}");
                std::process::exit(2);
            }
        }
    }
    println!(
        "{:<8} {:>14} {:>14} {:>8} {:>8}",
        "limit", "configured/s", "measured/s", "error", "delays"
    );
    for rate in [1_000u64, 20_000, 100_000] {
        let (measured, delays) = run(
            RateLimit {
                wqes_per_sec: rate,
                bytes_per_sec: 0,
            },
            secs,
        );
        row("WQEs", rate, measured, delays);
    }
    for rate in [1u64 << 20, 20 << 20, 200 << 20] {
        let (measured, delays) = run(
            RateLimit {
                wqes_per_sec: 0,
                bytes_per_sec: rate,
            },
            secs,
        );
        row("bytes", rate, measured, delays);
    }
}

fn row(what: &str, rate: u64, measured: f64, delays: u64) {
    let err = (measured - rate as f64) / rate as f64 * 100.0;
    println!("{what:<8} {rate:>14} {measured:>14.0} {err:>7.1}% {delays:>8}");
}

/// Run `secs` seconds' worth of work at `limit` on a fresh softnic: the rate measured (units
/// after the first, which the initial burst passes, over the time to the last completion)
/// and the limiter's delays.
fn run(limit: RateLimit, secs: f64) -> (f64, u64) {
    let mut config = SoftNicConfig::new("rate_bench");
    config.prefetch = Prefetch::Depth(8);
    let nic = SoftNic::new(config).expect("softnic");
    let pd = nic.alloc_pd().expect("pd");
    let buf = SharedBuffer::new(idx(WRITE));
    let mr = nic
        .reg_mr(pd, &buf, 0, idx(WRITE), Access::ALL)
        .expect("mr");
    let cq = nic.create_cq(CqConfig::new(16)).expect("cq");
    let mut cfg = QpConfig::new(pd, cq);
    // A few seconds of work at a rate of at most millions a second: a whole count far
    // inside u64, which the saturating float-to-integer cast keeps exact after floor.
    #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
    let whole = |units: f64| units.floor() as u64;
    let (n, unit) = if limit.wqes_per_sec > 0 {
        (whole(limit.wqes_per_sec as f64 * secs), 1)
    } else {
        (
            whole(limit.bytes_per_sec as f64 * secs / WRITE as f64),
            WRITE,
        )
    };
    let n = n.max(2);
    cfg.sq_bbs = u32::try_from(n.next_power_of_two().max(64)).expect("ring size"); // one BB a WQE
    let qp = nic.create_qp(cfg).expect("qp").qpn;
    nic.connect(qp, qp).expect("connect");
    nic.set_rate_limit(qp, limit).expect("rate");
    let wrs: Vec<WorkRequest> = (0..n)
        .map(|i| {
            let op = if unit == 1 {
                WrOp::Nop {
                    raw_segments: vec![],
                }
            } else {
                WrOp::Write {
                    remote: mr.remote(0),
                    payload: Payload::Sgl(vec![mr.sge(0, low32(WRITE))]),
                    imm: None,
                }
            };
            let flags = if i + 1 == n {
                WqeFlags::SIGNALED
            } else {
                WqeFlags::NONE
            };
            WorkRequest {
                wr_id: i,
                flags,
                op,
            }
        })
        .collect();
    let start = Instant::now();
    nic.post_send(qp, &wrs).expect("post");
    wait_one(&nic, cq, Duration::from_secs_f64(secs * 100.0 + 10.0));
    let took = start.elapsed().as_secs_f64();
    let delays = nic.counters(qp).expect("counters").rate_limit_delays;
    (((n - 1) * unit) as f64 / took, delays)
}

/// Wait for one completion, sleeping between polls so that the paced PU has the CPU.
fn wait_one(nic: &dyn Nic, cq: Cqn, patience: Duration) {
    let deadline = Instant::now() + patience;
    let mut out = Vec::new();
    while out.is_empty() {
        assert!(Instant::now() < deadline, "no completion on {cq}");
        nic.poll_cq(cq, 1, &mut out).expect("poll");
        std::thread::sleep(Duration::from_micros(200));
    }
    assert!(out[0].is_ok(), "{:?}", out[0]);
}
