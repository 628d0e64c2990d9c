//! The per-QP rate limiter on real PU threads: a queue never runs ahead of its rate, a
//! throttled queue holds exactly where its bucket says, clearing the rate releases it, and a
//! rate set while a doorbell chain runs holds the chain's queue from the master's next visit.
//!
//! The bucket arithmetic is tested exactly, on a manual clock, in `softnic::rate`; how close
//! to its rate the softnic actually runs is measured by `examples/rate_bench.rs`. The bounds
//! here hold whatever the scheduler does: "no more than the rate allows since before it was
//! set, plus a burst" (time measured around what it bounds, so a late reader only widens
//! it), or a bucket so deep in debt that nothing can pass while the test looks.

mod common;
use common::*;
use redn_program::wqe::{Opcode, Payload, WqeFlags, WrOp};
use redn_sys::conv::{idx, low32};
use redn_sys::nic::{Nic, RateLimit};
use redn_sys::softnic::{Prefetch, SoftNic};
use redn_sys::Qpn;
use std::time::{Duration, Instant};

fn wqes_per_sec(rate: u64) -> RateLimit {
    RateLimit {
        wqes_per_sec: rate,
        bytes_per_sec: 0,
    }
}

fn bytes_per_sec(rate: u64) -> RateLimit {
    RateLimit {
        wqes_per_sec: 0,
        bytes_per_sec: rate,
    }
}

/// The most a fresh limiter of `rate` units a second lets through in `secs` seconds of units
/// costing `cost` each: its burst (a millisecond's worth, at least one unit), one operation
/// into debt, and the rate (rounded up).
fn allowed(rate: u64, cost: u64, secs: f64) -> f64 {
    (rate as f64 / 1000.0).max(1.0) + cost as f64 + (rate as f64 * secs).ceil()
}

/// Sample `what` (units run) every 200 µs until it reaches `total` (10 s at most), and check
/// each sample against `limit`, the most the limiter allows in the seconds since `t0`, a time
/// before the rate was set. The time is read after the sample, so a sample the scheduler
/// delays is held to a looser bound, never a tighter one. (Sleeping, not spinning: on two
/// cores a spinning reader takes the CPU the paced PU needs.)
fn never_ahead(t0: Instant, total: u64, what: impl Fn() -> u64, limit: impl Fn(f64) -> f64) {
    let deadline = Instant::now() + patience(10);
    let mut last = 0;
    loop {
        let ran = what();
        let secs = t0.elapsed().as_secs_f64();
        assert!(ran >= last, "a counter went back: {last} then {ran}");
        assert!(
            ran as f64 <= limit(secs),
            "{ran} run {secs:.4} s after the rate was set: at most {:.0} allowed",
            limit(secs)
        );
        if ran == total {
            return;
        }
        last = ran;
        assert!(Instant::now() < deadline, "stuck at {ran} of {total}");
        std::thread::sleep(Duration::from_micros(200));
    }
}

#[test]
fn a_wqe_rate_limit_never_runs_ahead_of_its_rate() {
    let nic = nic(1, Prefetch::Depth(8));
    let pd = nic.alloc_pd().unwrap();
    let ep = endpoint(&nic, pd, |c| c.sq_bbs = 4096);
    nic.connect(ep.qp.qpn, ep.qp.qpn).unwrap();
    let rate = 20_000u64;
    let n = 2000u64; // a tenth of a second at the rate
    let t0 = Instant::now();
    nic.set_rate_limit(ep.qp.qpn, wqes_per_sec(rate)).unwrap();
    nic.post_send(ep.qp.qpn, &nops(idx(n))).unwrap();
    never_ahead(
        t0,
        n,
        || nic.sq_consumed(ep.qp.qpn).unwrap(),
        |secs| allowed(rate, 1, secs),
    );
    let c = wait_cqes(&nic, ep.cq, 1);
    assert!(c[0].is_ok(), "{c:?}");
    let counters = nic.counters(ep.qp.qpn).unwrap();
    assert_eq!(counters.by_opcode(Opcode::Nop), n);
    assert!(counters.rate_limit_delays > 0, "never held back");
}

#[test]
fn a_byte_rate_limit_never_runs_ahead_of_its_rate() {
    let nic = nic(1, Prefetch::Depth(8));
    let pd = nic.alloc_pd().unwrap();
    let buf = Region::new(&nic, pd, 64 << 10, ALL);
    let ep = endpoint(&nic, pd, |c| c.sq_bbs = 1024);
    nic.connect(ep.qp.qpn, ep.qp.qpn).unwrap();
    let rate = 20u64 << 20; // 20 MiB/s
    let (n, size) = (32usize, 64u64 << 10); // 2 MiB: a tenth of a second at the rate
    let wrs: Vec<_> = (0..n)
        .map(|i| {
            let flags = if i + 1 == n { SIG } else { WqeFlags::NONE };
            let write = WrOp::Write {
                remote: buf.mr.remote(0),
                payload: Payload::Sgl(vec![buf.mr.sge(0, low32(size))]),
                imm: None,
            };
            wr(i as u64, flags, write)
        })
        .collect();
    let t0 = Instant::now();
    nic.set_rate_limit(ep.qp.qpn, bytes_per_sec(rate)).unwrap();
    nic.post_send(ep.qp.qpn, &wrs).unwrap();
    let total = n as u64 * size;
    never_ahead(
        t0,
        total,
        || nic.counters(ep.qp.qpn).unwrap().bytes,
        |secs| allowed(rate, size, secs),
    );
    let c = wait_cqes(&nic, ep.cq, 1);
    assert!(c[0].is_ok(), "{c:?}");
    assert!(nic.counters(ep.qp.qpn).unwrap().rate_limit_delays > 0);
}

/// A queue at 1 byte a second whose first WQE, a 64 KiB WRITE, takes its byte bucket 18
/// hours into debt, with `nops` NOPs behind it: once the limiter has held it, it stays
/// exactly there for the rest of any test.
fn held_in_debt(nic: &SoftNic, nops: usize) -> (Endpoint, Region) {
    let pd = nic.alloc_pd().unwrap();
    let buf = Region::new(nic, pd, 64 << 10, ALL);
    let ep = endpoint(nic, pd, |c| c.sq_bbs = 4096);
    nic.connect(ep.qp.qpn, ep.qp.qpn).unwrap();
    nic.set_rate_limit(ep.qp.qpn, bytes_per_sec(1)).unwrap();
    let write = WrOp::Write {
        remote: buf.mr.remote(0),
        payload: Payload::Sgl(vec![buf.mr.sge(0, 64 << 10)]),
        imm: None,
    };
    let mut wrs = vec![wr(0, WqeFlags::NONE, write)];
    wrs.extend(common::nops(nops));
    nic.post_send(ep.qp.qpn, &wrs).unwrap();
    wait_until("the limiter holds the queue", || {
        nic.sq_consumed(ep.qp.qpn).unwrap() == 1
            && nic.counters(ep.qp.qpn).unwrap().rate_limit_delays == 1
    });
    (ep, buf)
}

#[test]
fn a_throttled_queue_holds_where_its_bucket_says_and_clearing_releases_it() {
    let nic = nic(1, Prefetch::Depth(8));
    let (ep, _buf) = held_in_debt(&nic, 999);
    // Counters are live while the queue waits: exactly the WRITE ran, and one delay is
    // counted however often the PU asks again.
    std::thread::sleep(Duration::from_millis(5));
    let held = nic.counters(ep.qp.qpn).unwrap();
    assert_eq!(held.total_wqes(), 1, "{held:?}");
    assert_eq!(held.by_opcode(Opcode::RdmaWrite), 1);
    assert_eq!(held.bytes, 64 << 10);
    assert_eq!(held.rate_limit_delays, 1);
    assert_eq!(nic.sq_consumed(ep.qp.qpn).unwrap(), 1);
    nic.set_rate_limit(ep.qp.qpn, RateLimit::default()).unwrap();
    let c = wait_cqes(&nic, ep.cq, 1);
    assert!(c[0].is_ok(), "{c:?}");
    assert_eq!(nic.counters(ep.qp.qpn).unwrap().total_wqes(), 1000);
}

#[test]
fn a_throttled_queue_does_not_hold_up_its_pu() {
    let nic = nic(1, Prefetch::Depth(8));
    let (slow, _buf) = held_in_debt(&nic, 999);
    let pd = nic.alloc_pd().unwrap();
    let fast = endpoint(&nic, pd, |c| c.sq_bbs = 4096);
    nic.connect(fast.qp.qpn, fast.qp.qpn).unwrap();
    // The PU has a retry time an hour away for the slow queue; the fast one runs now.
    nic.post_send(fast.qp.qpn, &nops(2000)).unwrap();
    wait_cqes(&nic, fast.cq, 1);
    assert_eq!(nic.counters(fast.qp.qpn).unwrap().total_wqes(), 2000);
    assert_eq!(nic.sq_consumed(slow.qp.qpn).unwrap(), 1);
    assert_eq!(nic.counters(slow.qp.qpn).unwrap().total_wqes(), 1);
}

/// A rate set on a queue while a doorbell-ordered chain enables it step by step holds it
/// from the master queue's next visit on: the PU's hand-over loop looks at the enabled
/// queue's rate when it starts (not each step), and a visit runs at most 256 of the master's
/// WQEs, so at most 128 steps (a WAIT and a SEND_EN each) run unpaced after the rate is set.
///
/// The chain stops halfway at a gate, a WAIT on a CQ the test completes into, so that
/// whenever this thread gets to set the rate, half the chain is still to run: the rate lands
/// either in the first half while it runs or at the gate, and in both cases no more than the
/// rest of one master visit, the rate and a burst may run after it. (Without the gate, a
/// thread descheduled for the chain's millisecond found it done, and after five tries the
/// test failed.)
#[test]
fn a_rate_set_while_a_doorbell_chain_runs_holds_its_enabled_queue() {
    const STEPS: u32 = 4000;
    const GATE: u32 = 2000;
    let rate = 20u64;
    let nic = nic(1, Prefetch::Depth(8));
    let pd = nic.alloc_pd().unwrap();
    let (q, m) = doorbell_pair(&nic, pd, 8192);
    let gate = endpoint(&nic, pd, |_| {});
    nic.connect(gate.qp.qpn, gate.qp.qpn).unwrap();
    let nops: Vec<_> = (0..STEPS)
        .map(|i| {
            let nop = WrOp::Nop {
                raw_segments: vec![],
            };
            wr(u64::from(i), SIG, nop)
        })
        .collect();
    nic.post_send(q.qp.qpn, &nops).unwrap();
    let mut master = doorbell_master(&q, STEPS);
    // Step GATE's WAIT is at 2 * GATE - 1 (the first step has none): the gate goes before it.
    let wait_gate = WrOp::Wait {
        cq: gate.cq,
        count: 0,
    };
    master.insert(2 * GATE as usize - 1, wr(0, WqeFlags::NONE, wait_gate));
    nic.post_send(m.qp.qpn, &master).unwrap();

    let nop_count = |q: Qpn| nic.counters(q).unwrap().by_opcode(Opcode::Nop);
    let delays = |q: Qpn| nic.counters(q).unwrap().rate_limit_delays;
    wait_until("the chain runs", || nop_count(q.qp.qpn) > 0);
    let t0 = Instant::now();
    nic.set_rate_limit(q.qp.qpn, wqes_per_sec(rate)).unwrap();
    let before = nop_count(q.qp.qpn);
    assert!(before <= u64::from(GATE), "{before} NOPs ran past the gate");
    nic.post_send(
        gate.qp.qpn,
        &[wr(
            0,
            SIG,
            WrOp::Nop {
                raw_segments: vec![],
            },
        )],
    )
    .unwrap();
    wait_until("the limiter holds the queue, or the chain ends", || {
        delays(q.qp.qpn) > 0 || nop_count(q.qp.qpn) == u64::from(STEPS)
    });
    let paced_at = nop_count(q.qp.qpn);
    let secs = t0.elapsed().as_secs_f64();
    let ran = paced_at - before;
    // The rest of the master's visit, then the limiter.
    // A bound of a few thousand: the saturating cast keeps it exact after ceil.
    #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
    let most = 128 + allowed(rate, 1, secs).ceil() as u64;
    assert!(
        ran <= most,
        "{ran} NOPs in {secs:.3} s after a rate of {rate}/s was set (at most {most})"
    );
    wait_until("the chain goes on once paced", || {
        nop_count(q.qp.qpn) > paced_at
    });
}
