//! The per-QP rate limiter holds its rate, and counters are readable while a queue runs.

mod common;
use common::*;
use redn_program::wqe::{Opcode, Payload, WqeFlags, WrOp};
use redn_sys::nic::{Nic, RateLimit};
use redn_sys::softnic::Prefetch;
use std::time::{Duration, Instant};

/// The tests here run one at a time, and the rate measurements wait for their completion
/// without spinning: on a 2-core machine other tests' threads would otherwise take the CPU the
/// paced PU needs to wake on time, and the measured rate would drop for reasons that are
/// not the limiter's.
static SERIAL: std::sync::Mutex<()> = std::sync::Mutex::new(());

fn wait_one(nic: &dyn Nic, cq: redn_sys::Cqn) -> redn_sys::nic::Completion {
    let deadline = Instant::now() + Duration::from_secs(10);
    let mut out = Vec::new();
    while out.is_empty() {
        assert!(Instant::now() < deadline, "no completion on {cq}");
        nic.poll_cq(cq, 1, &mut out).unwrap();
        std::thread::sleep(Duration::from_micros(200));
    }
    out.remove(0)
}

#[test]
fn wqe_rate_limit_holds_within_ten_percent() {
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let nic = nic(1, Prefetch::Depth(8));
    let pd = nic.alloc_pd().unwrap();
    let ep = endpoint(&nic, pd, |c| c.sq_bbs = 8192);
    nic.connect(ep.qp.qpn, ep.qp.qpn).unwrap();
    let rate = 20_000u64;
    nic.set_rate_limit(
        ep.qp.qpn,
        RateLimit {
            wqes_per_sec: rate,
            bytes_per_sec: 0,
        },
    )
    .unwrap();
    let n = 8000usize;
    let start = Instant::now();
    nic.post_send(ep.qp.qpn, &nops(n)).unwrap();
    // Counters are live while it runs.
    wait_until("the first NOPs are counted", || {
        nic.counters(ep.qp.qpn).unwrap().rate_limit_delays > 0
    });
    let mid = nic.counters(ep.qp.qpn).unwrap();
    assert!(mid.by_opcode(Opcode::Nop) > 0 && mid.by_opcode(Opcode::Nop) < n as u64);
    let c = wait_one(&nic, ep.cq);
    assert!(c.is_ok());
    let secs = start.elapsed().as_secs_f64();
    let measured = n as f64 / secs;
    let err = (measured - rate as f64).abs() / rate as f64;
    assert!(
        err < 0.10,
        "configured {rate} WQE/s, measured {measured:.0} ({:.1} %)",
        err * 100.0
    );
}

#[test]
fn byte_rate_limit_holds_within_ten_percent() {
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let nic = nic(1, Prefetch::Depth(8));
    let pd = nic.alloc_pd().unwrap();
    let buf = Region::new(&nic, pd, 64 << 10, ALL);
    let ep = endpoint(&nic, pd, |c| c.sq_bbs = 1024);
    nic.connect(ep.qp.qpn, ep.qp.qpn).unwrap();
    let rate = 20u64 << 20; // 20 MiB/s
    nic.set_rate_limit(
        ep.qp.qpn,
        RateLimit {
            wqes_per_sec: 0,
            bytes_per_sec: rate,
        },
    )
    .unwrap();
    let n = 160usize; // 160 × 64 KiB = 10 MiB: half a second
    let wrs: Vec<_> = (0..n)
        .map(|i| {
            let flags = if i + 1 == n { SIG } else { WqeFlags::NONE };
            wr(
                i as u64,
                flags,
                WrOp::Write {
                    remote: buf.mr.remote(0),
                    payload: Payload::Sgl(vec![buf.mr.sge(0, 64 << 10)]),
                    imm: None,
                },
            )
        })
        .collect();
    let start = Instant::now();
    nic.post_send(ep.qp.qpn, &wrs).unwrap();
    wait_one(&nic, ep.cq);
    let secs = start.elapsed().as_secs_f64();
    // The first message passes on the initial burst; the rest are paced.
    let measured = ((n - 1) as f64 * 65536.0) / secs;
    let err = (measured - rate as f64).abs() / rate as f64;
    assert!(
        err < 0.10,
        "configured {rate} B/s, measured {measured:.0} ({:.1} %)",
        err * 100.0
    );
    assert_eq!(nic.counters(ep.qp.qpn).unwrap().bytes, n as u64 * 65536);
}

#[test]
fn clearing_the_limit_releases_a_throttled_queue() {
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let nic = nic(1, Prefetch::Depth(8));
    let pd = nic.alloc_pd().unwrap();
    let ep = endpoint(&nic, pd, |c| c.sq_bbs = 4096);
    nic.connect(ep.qp.qpn, ep.qp.qpn).unwrap();
    nic.set_rate_limit(
        ep.qp.qpn,
        RateLimit {
            wqes_per_sec: 10,
            bytes_per_sec: 0,
        },
    )
    .unwrap();
    nic.post_send(ep.qp.qpn, &nops(1000)).unwrap();
    std::thread::sleep(Duration::from_millis(50));
    assert!(nic.counters(ep.qp.qpn).unwrap().total_wqes() < 10);
    nic.set_rate_limit(ep.qp.qpn, RateLimit::default()).unwrap();
    wait_cqes(&nic, ep.cq, 1);
    assert_eq!(nic.counters(ep.qp.qpn).unwrap().total_wqes(), 1000);
}

#[test]
fn a_throttled_queue_does_not_hold_up_its_pu() {
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let nic = nic(1, Prefetch::Depth(8));
    let pd = nic.alloc_pd().unwrap();
    let slow = endpoint(&nic, pd, |c| c.sq_bbs = 4096);
    let fast = endpoint(&nic, pd, |c| c.sq_bbs = 4096);
    for q in [slow.qp.qpn, fast.qp.qpn] {
        nic.connect(q, q).unwrap();
    }
    nic.set_rate_limit(
        slow.qp.qpn,
        RateLimit {
            wqes_per_sec: 10,
            bytes_per_sec: 0,
        },
    )
    .unwrap();
    nic.post_send(slow.qp.qpn, &nops(1000)).unwrap();
    let start = Instant::now();
    nic.post_send(fast.qp.qpn, &nops(2000)).unwrap();
    wait_cqes(&nic, fast.cq, 1);
    assert!(
        start.elapsed() < Duration::from_secs(2),
        "the fast queue waited for the slow one"
    );
    assert!(nic.counters(slow.qp.qpn).unwrap().total_wqes() < 50);
}

/// A rate set on a queue while a doorbell-ordered chain enables it step by step holds it
/// from the master queue's next visit on: the PU's hand-over loop looks at the enabled
/// queue's rate when it starts (not each step), and a visit runs at most 256 of the master's
/// WQEs, so at most 128 steps (a WAIT and a SEND_EN each) run unpaced after the rate is set.
#[test]
fn a_rate_set_while_a_doorbell_chain_runs_holds_its_enabled_queue() {
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    const STEPS: u32 = 4000;
    let rate = 20_000u64;
    let nop_count =
        |nic: &dyn Nic, q: redn_sys::Qpn| nic.counters(q).unwrap().by_opcode(Opcode::Nop);
    // A chain of 4000 steps runs in well under a millisecond: if this thread was away long
    // enough for most of it to run before the rate was set, the test says nothing, and the
    // chain is run again.
    for _attempt in 0..5 {
        let nic = nic(1, Prefetch::Depth(8));
        let pd = nic.alloc_pd().unwrap();
        let (q, m) = doorbell_pair(&nic, pd, 8192);
        let nops: Vec<_> = (0..STEPS)
            .map(|i| {
                let nop = WrOp::Nop {
                    raw_segments: vec![],
                };
                wr(u64::from(i), SIG, nop)
            })
            .collect();
        nic.post_send(q.qp.qpn, &nops).unwrap();
        nic.post_send(m.qp.qpn, &doorbell_master(&q, STEPS))
            .unwrap();
        wait_until("the chain runs", || nop_count(&nic, q.qp.qpn) > 0);
        nic.set_rate_limit(
            q.qp.qpn,
            RateLimit {
                wqes_per_sec: rate,
                bytes_per_sec: 0,
            },
        )
        .unwrap();
        let set = Instant::now();
        let before = nop_count(&nic, q.qp.qpn);
        if before > u64::from(STEPS) / 2 {
            continue;
        }
        std::thread::sleep(Duration::from_millis(50));
        let secs = set.elapsed().as_secs_f64();
        let ran = nop_count(&nic, q.qp.qpn) - before;
        // The rate, 10 % over it, its burst (a millisecond's worth) and one visit's steps.
        let allowed = (rate as f64 * secs * 1.1) as u64 + rate / 1000 + 1 + 128;
        assert!(
            ran <= allowed,
            "{ran} NOPs in {secs:.3} s after a rate of {rate}/s was set (at most {allowed})"
        );
        assert!(ran > 0, "the chain stopped once paced");
        return;
    }
    panic!("in five tries most of the chain ran before the rate could be set");
}
