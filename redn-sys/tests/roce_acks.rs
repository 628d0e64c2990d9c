//! A RoCE queue's posted messages while its PU has other work: the queue never waits for
//! its peer's ACKs (the peer decides when they come, and a hostile one never sends them),
//! so its PU stays free for the other queues whatever the RoCE queue holds: a signaled WQE
//! at rest, a WQE that must follow its posted messages' outcomes, a full window, a fault.
//!
//! Each test connects two softnics of this process over loopback UDP; the responder's
//! endpoint loses everything it sends (every ACK), so the requester's messages stay
//! outstanding until its retries run out, seconds later (`ACK_TIMEOUT`). On the
//! requester's one PU, a second queue, connected to itself, runs a NOP meanwhile: its
//! completion must come while the RoCE queue is still ready to send, not after the retries
//! ran out (which is when a PU held by the RoCE queue's wait would get to it).

mod common;
use common::*;
use redn_program::wqe::{Payload, WorkRequest, WqeFlags, WrOp};
use redn_sys::nic::{CqConfig, Nic, QpConfig};
use redn_sys::softnic::roce::{Faults, QpRecord, RegionRecord, RoceConfig, RoceEndpoint};
use redn_sys::softnic::{Prefetch, SoftNic, SoftNicConfig};
use redn_sys::{Cqn, QpState, Qpn};
use std::net::Ipv4Addr;
use std::time::Instant;

/// The ACK timeout's exponent: 4.096 µs × 2^17, about 0.54 s; with `RETRIES` the
/// requester gives up after about 4.3 s, far longer than a NOP takes on a busy machine.
const ACK_TIMEOUT: u8 = 17;
const RETRIES: u8 = 7;
const MEM_LEN: usize = 1 << 20;

/// One softnic (one PU) with its RoCE endpoint and a registered region.
struct Side {
    nic: SoftNic,
    ep: RoceEndpoint,
    pd: redn_sys::Pdn,
    mem: Region,
}

impl Side {
    fn new(name: &str, faults: Option<Faults>) -> Side {
        let mut cfg = SoftNicConfig::new(name);
        cfg.pus = 1;
        cfg.prefetch = Prefetch::Depth(8);
        let nic = SoftNic::new(cfg).unwrap();
        let mut rc = RoceConfig::new(Ipv4Addr::LOCALHOST);
        rc.bind.set_port(0);
        rc.faults = faults;
        let ep = RoceEndpoint::start(&nic, &rc).unwrap();
        let pd = nic.alloc_pd().unwrap();
        let mem = Region::new(&nic, pd, MEM_LEN, ALL);
        Side { nic, ep, pd, mem }
    }

    /// A QP with its own CQ, and the record that describes it (and the region) to a peer.
    fn qp(&self, psn: u32) -> (Qpn, Cqn, QpRecord) {
        let cq = self.nic.create_cq(CqConfig::new(256)).unwrap();
        let qp = self.nic.create_qp(QpConfig::new(self.pd, cq)).unwrap().qpn;
        let mut r = self.ep.record(qp, psn);
        r.mtu = 1024;
        r.timeout = ACK_TIMEOUT;
        r.retry_cnt = RETRIES;
        r.regions.push(RegionRecord {
            name: "mem".into(),
            addr: self.mem.mr.addr.0,
            rkey: self.mem.mr.lkey.0,
            len: self.mem.mr.len,
            rights: 7,
        });
        (qp, cq, r)
    }
}

/// The requester `a` (its RoCE QP, the record of the responder's QP) and `b`, whose
/// endpoint drops every datagram it sends: its ACKs never reach `a`.
fn deaf_pair() -> (Side, Side, Qpn, QpRecord) {
    let a = Side::new("requester", None);
    let lose_all = Faults {
        seed: 1,
        drop: 1000,
        duplicate: 0,
        reorder: 0,
    };
    let b = Side::new("responder", Some(lose_all));
    let (qa, _, ra) = a.qp(10);
    let (_, _, rb) = b.qp(20);
    a.ep.connect(&ra, &rb).unwrap();
    b.ep.connect(&rb, &ra).unwrap();
    (a, b, qa, rb)
}

/// A 100 B WRITE from `a`'s region at 0 to the responder's at 0.
fn write(a: &Side, remote: &QpRecord, flags: WqeFlags, wr_id: u64) -> WorkRequest {
    a.mem.write(0, &[0x5a; 100]);
    let region = remote.region("mem").unwrap();
    wr(
        wr_id,
        flags,
        WrOp::Write {
            remote: redn_program::wqe::RemoteAddr {
                addr: redn_sys::VirtAddr(region.addr),
                rkey: redn_sys::Rkey(region.rkey),
            },
            payload: Payload::Sgl(vec![a.mem.mr.sge(0, 100)]),
            imm: None,
        },
    )
}

/// A queue on `a`'s PU connected to itself, for a NOP to run beside the RoCE queue.
fn loopback(a: &Side) -> (Qpn, Cqn) {
    let (q, cq, _) = a.qp(0);
    a.nic.connect(q, q).unwrap();
    (q, cq)
}

/// Post a signaled NOP on `q` and wait for its completion; the RoCE queue `roce` must still
/// be ready to send when it comes (its retries, seconds long, not spent).
fn nop_completes_while_ready(a: &Side, q: Qpn, cq: Cqn, roce: Qpn) {
    let nop = WrOp::Nop {
        raw_segments: vec![],
    };
    a.nic.post_send(q, &[wr(7, SIG, nop)]).unwrap();
    let mut got = Vec::new();
    let deadline = Instant::now() + patience(30);
    while got.is_empty() {
        assert!(Instant::now() < deadline, "the NOP never completed");
        a.nic.poll_cq(cq, 1, &mut got).unwrap();
        std::thread::yield_now();
    }
    assert!(got[0].is_ok(), "{got:?}");
    assert_eq!(
        a.nic.qp_state(roce).unwrap(),
        QpState::ReadyToSend,
        "the NOP ran only after the RoCE queue's retries ran out: its PU waited for ACKs"
    );
}

/// An unsignaled WRITE left at rest (nobody waits for its outcome) whose ACK never comes:
/// the PU goes on to other queues and comes back by the requester's timers, rather than
/// waiting for the outcome.
#[test]
fn an_unsignaled_write_at_rest_does_not_hold_its_pu() {
    let (a, _b, qa, rb) = deaf_pair();
    let (q, cq) = loopback(&a);
    a.nic
        .post_send(qa, &[write(&a, &rb, WqeFlags::NONE, 1)])
        .unwrap();
    nop_completes_while_ready(&a, q, cq, qa);
}

/// A signaled WRITE posted, then an unsignaled WAIT that blocks (on the loopback queue's
/// CQ): the visit ends with more to run, and takes only the outcomes that came, so the PU
/// runs the NOP the WAIT waits for (a queue at rest would wait for the signaled WRITE).
#[test]
fn a_signaled_write_before_a_blocked_wait_does_not_hold_its_pu() {
    let (a, _b, qa, rb) = deaf_pair();
    let (q, cq) = loopback(&a);
    let wait = WrOp::Wait { cq, count: 0 };
    a.nic
        .post_send(qa, &[write(&a, &rb, SIG, 1), wr(2, WqeFlags::NONE, wait)])
        .unwrap();
    // The WAIT is reached (and blocks) before the NOP is posted.
    let deadline = Instant::now() + patience(30);
    while a.nic.counters(qa).unwrap().wait_stalls == 0 {
        assert!(Instant::now() < deadline, "the WAIT never blocked");
        std::thread::yield_now();
    }
    nop_completes_while_ready(&a, q, cq, qa);
}

/// A signaled WRITE at rest: the host waits for its completion, but the PU does not wait
/// for the ACK that makes it (a peer that never acknowledged held a manager's only PU for
/// the ~0.5 s of its retries, per message).
#[test]
fn a_signaled_write_at_rest_does_not_hold_its_pu() {
    let (a, _b, qa, rb) = deaf_pair();
    let (q, cq) = loopback(&a);
    a.nic.post_send(qa, &[write(&a, &rb, SIG, 1)]).unwrap();
    nop_completes_while_ready(&a, q, cq, qa);
}

/// A signaled NOP behind a posted WRITE must complete after it (completions come in
/// order), so it runs only once the WRITE's outcome is in: until then the queue's visits
/// end, and the PU runs its other queues.
#[test]
fn a_wqe_that_follows_posted_outcomes_does_not_hold_its_pu() {
    let (a, _b, qa, rb) = deaf_pair();
    let (q, cq) = loopback(&a);
    let nop = WrOp::Nop {
        raw_segments: vec![],
    };
    a.nic
        .post_send(qa, &[write(&a, &rb, WqeFlags::NONE, 1), wr(2, SIG, nop)])
        .unwrap();
    nop_completes_while_ready(&a, q, cq, qa);
}

/// More unsignaled WRITEs than the requester keeps in flight (32 messages): the one that
/// finds the window full waits on a later visit for room, not in the PU.
#[test]
fn a_full_window_does_not_hold_its_pu() {
    let (a, _b, qa, rb) = deaf_pair();
    let (q, cq) = loopback(&a);
    let writes: Vec<WorkRequest> = (0..40).map(|i| write(&a, &rb, WqeFlags::NONE, i)).collect();
    a.nic.post_send(qa, &writes).unwrap();
    let deadline = Instant::now() + patience(30);
    while a.nic.counters(qa).unwrap().total_wqes() < 32 {
        assert!(Instant::now() < deadline, "the window never filled");
        std::thread::yield_now();
    }
    nop_completes_while_ready(&a, q, cq, qa);
    assert_eq!(
        a.nic.counters(qa).unwrap().total_wqes(),
        32,
        "no WRITE past the window's 32 messages ran"
    );
}

/// A WQE that faults behind a posted WRITE reports its error after the WRITE's outcome,
/// which the queue does not wait for: the fault waits for a later visit, the PU goes on.
#[test]
fn a_fault_behind_posted_messages_does_not_hold_its_pu() {
    let (a, _b, qa, rb) = deaf_pair();
    let (q, cq) = loopback(&a);
    let mut bad = write(&a, &rb, SIG, 2);
    if let WrOp::Write { payload, .. } = &mut bad.op {
        // A local key nothing registered: a local protection fault.
        *payload = Payload::Sgl(vec![redn_program::wqe::Sge {
            addr: a.mem.mr.addr,
            len: 8,
            lkey: redn_sys::Lkey(0x00ab_cd00),
        }]);
    }
    a.nic
        .post_send(qa, &[write(&a, &rb, WqeFlags::NONE, 1), bad])
        .unwrap();
    nop_completes_while_ready(&a, q, cq, qa);
}
