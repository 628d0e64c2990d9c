//! Two softnics of this process over loopback UDP: ACKs for unsignaled writes, every
//! failure's completion status, RNR waits, and who serves the socket.

use super::*;

/// Two softnics of this process connected over loopback UDP (no peer process): for the
/// failure statuses, which need the responder set up just so.
pub(super) fn pair(rnr_retry: u8, recv_room: u32) -> (Local, Local, Conn, Conn) {
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
pub(super) fn connect_locals(
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
pub(super) fn writes_both_ways_until_b_receive_thread_serves(
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
