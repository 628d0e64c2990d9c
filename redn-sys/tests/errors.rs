//! Bad requests get clear errors, CQ overrun is reported, and ConnectX's "WQE checks" (off by
//! default, as RedN needs) refuse WQEs whose QPN or index do not match their slot.

mod common;
use common::*;
use redn_program::wqe::{Syndrome, WqeFlags, WrOp};
use redn_sys::mem::SharedBuffer;
use redn_sys::nic::{CqConfig, Nic, QpConfig};
use redn_sys::softnic::{Prefetch, SoftNic, SoftNicConfig};
use redn_sys::{Access, Error, Lkey, Pdn, Qpn};

fn nop() -> WrOp {
    WrOp::Nop {
        raw_segments: vec![],
    }
}

#[test]
fn configuration_and_object_errors_name_what_is_wrong() {
    let e = SoftNic::with_pus(0).unwrap_err();
    assert_eq!(
        e.to_string(),
        "invalid softnic processing units: 0 is outside 1..=64"
    );
    let nic = nic(1, Prefetch::Depth(8));
    let pd = nic.alloc_pd().unwrap();
    let cq = nic.create_cq(CqConfig::default()).unwrap();
    let mut cfg = QpConfig::new(pd, cq);
    cfg.sq_bbs = 100;
    assert_eq!(
        nic.create_qp(cfg).unwrap_err().to_string(),
        "invalid send queue size (BBs): 100 is not a power of two in 1..=65536"
    );
    assert!(matches!(
        nic.create_qp(QpConfig::new(Pdn(99), cq)),
        Err(Error::NoSuchPd(Pdn(99)))
    ));
    assert!(matches!(
        nic.post_send(Qpn(0x777), &[]),
        Err(Error::NoSuchQp(Qpn(0x777)))
    ));
    assert!(matches!(
        nic.dereg_mr(Lkey(0x1234)),
        Err(Error::NoSuchKey(_))
    ));
    let buf = SharedBuffer::new(64);
    assert!(matches!(
        nic.reg_mr(pd, &buf, 32, 64, Access::ALL),
        Err(Error::Register(_))
    ));

    // Objects in use cannot be destroyed.
    let ep = endpoint(&nic, pd, |_| {});
    assert!(matches!(nic.destroy_cq(ep.cq), Err(Error::Busy { .. })));
    assert!(matches!(nic.dealloc_pd(pd), Err(Error::Busy { .. })));
    nic.destroy_qp(ep.qp.qpn).unwrap();
    nic.destroy_cq(ep.cq).unwrap();
    nic.destroy_cq(cq).unwrap();
    nic.dealloc_pd(pd).unwrap();
}

#[test]
fn connecting_twice_and_overfilling_queues_are_refused() {
    let nic = nic(1, Prefetch::Depth(8));
    let pd = nic.alloc_pd().unwrap();
    let a = endpoint(&nic, pd, |c| {
        c.sq_bbs = 4;
        c.rq_slots = 2;
        c.managed_send = true;
    });
    let b = endpoint(&nic, pd, |_| {});
    nic.connect(a.qp.qpn, b.qp.qpn).unwrap();
    assert!(matches!(
        nic.connect(a.qp.qpn, b.qp.qpn),
        Err(Error::QpState { .. })
    ));
    // A managed queue nobody enables: the fifth BB does not fit a 4-BB ring.
    let four: Vec<_> = (0..4).map(|i| wr(i, WqeFlags::NONE, nop())).collect();
    nic.post_send(a.qp.qpn, &four).unwrap();
    let e = nic
        .post_send(a.qp.qpn, &[wr(9, WqeFlags::NONE, nop())])
        .unwrap_err();
    assert_eq!(
        e.to_string(),
        format!("send queue of QP {} is full (4 entries)", a.qp.qpn)
    );
    nic.post_recv(a.qp.qpn, 1, &[]).unwrap();
    nic.post_recv(a.qp.qpn, 2, &[]).unwrap();
    assert!(matches!(
        nic.post_recv(a.qp.qpn, 3, &[]),
        Err(Error::QueueFull {
            queue: "receive",
            ..
        })
    ));
    // A bad request posts nothing: the ring is unchanged and still full.
    assert!(matches!(
        nic.post_send(
            a.qp.qpn,
            &[wr(
                0,
                WqeFlags::NONE,
                WrOp::Wait {
                    cq: redn_sys::Cqn(1 << 24),
                    count: 0
                }
            )]
        ),
        Err(Error::Wqe(_))
    ));
}

#[test]
fn cq_overrun_is_reported_unless_ignored() {
    // A polled CQ that overruns goes to error (ibv_get_async_event(3): IBV_EVENT_CQ_ERR):
    // the poller learns of it once, the owner by an event, and no later completion is
    // written or counted. A CQ created to be only waited on keeps counting and wraps.
    let nic = nic(1, Prefetch::Depth(8));
    let pd = nic.alloc_pd().unwrap();
    for ignore in [false, true] {
        let cq = nic
            .create_cq(if ignore {
                CqConfig::counted(4)
            } else {
                CqConfig::new(4)
            })
            .unwrap();
        let mut cfg = QpConfig::new(pd, cq);
        cfg.sq_bbs = 16;
        let qp = nic.create_qp(cfg).unwrap().qpn;
        nic.connect(qp, qp).unwrap();
        let six: Vec<_> = (0..6).map(|i| wr(i, SIG, nop())).collect();
        nic.post_send(qp, &six).unwrap();
        let ran = |n: u64| {
            let deadline = std::time::Instant::now() + patience(5);
            while nic.sq_consumed(qp).unwrap() < n {
                assert!(std::time::Instant::now() < deadline, "only {n} ran");
                std::thread::yield_now();
            }
        };
        ran(6);
        let mut out = Vec::new();
        if ignore {
            assert_eq!(nic.cq_produced(cq).unwrap(), 6);
            // The ring wrapped: the 4 newest completions remain.
            nic.poll_cq(cq, 16, &mut out).unwrap();
            assert_eq!(
                out.iter().map(|c| c.wr_id).collect::<Vec<_>>(),
                [2, 3, 4, 5]
            );
            assert_eq!(nic.get_async_event(), None);
        } else {
            assert_eq!(nic.cq_produced(cq).unwrap(), 4, "the fifth overran");
            assert_eq!(
                nic.get_async_event(),
                Some(redn_sys::nic::AsyncEvent::CqError(cq))
            );
            assert!(matches!(
                nic.poll_cq(cq, 16, &mut out),
                Err(Error::CqOverrun(c)) if c == cq
            ));
            // Reported once; what fit is still there.
            nic.poll_cq(cq, 16, &mut out).unwrap();
            assert_eq!(
                out.iter().map(|c| c.wr_id).collect::<Vec<_>>(),
                [0, 1, 2, 3]
            );
        }
        // With room again, more completions: only the only-waited-on CQ takes them.
        out.clear();
        let two: Vec<_> = (6..8).map(|i| wr(i, SIG, nop())).collect();
        nic.post_send(qp, &two).unwrap();
        ran(8);
        nic.poll_cq(cq, 16, &mut out).unwrap();
        if ignore {
            assert_eq!(nic.cq_produced(cq).unwrap(), 8);
            assert_eq!(out.iter().map(|c| c.wr_id).collect::<Vec<_>>(), [6, 7]);
        } else {
            assert_eq!(nic.cq_produced(cq).unwrap(), 4, "in error: nothing counts");
            assert!(out.is_empty(), "in error: nothing is written: {out:?}");
            assert_eq!(nic.get_async_event(), None, "one event");
        }
    }
}

#[test]
fn completion_mode_3_writes_a_cqe_and_mode_1_does_not() {
    // The control segment's CE bits: 2 "CQE always", 3 "CQE and EQE" (the same CQE, and an
    // event), 0 and 1 a CQE only on error.
    let nic = nic(1, Prefetch::Depth(8));
    let pd = nic.alloc_pd().unwrap();
    let ep = endpoint(&nic, pd, |_| {});
    nic.connect(ep.qp.qpn, ep.qp.qpn).unwrap();
    let ce = |bits: u8| redn_program::wqe::WqeFlags(bits << 2);
    nic.post_send(
        ep.qp.qpn,
        &[
            wr(1, ce(1), nop()),
            wr(2, ce(3), nop()),
            wr(3, ce(0), nop()),
            wr(4, ce(2), nop()),
        ],
    )
    .unwrap();
    let got = wait_cqes(&nic, ep.cq, 2);
    assert_eq!(got.iter().map(|c| c.wr_id).collect::<Vec<_>>(), [2, 4]);
    assert_eq!(nic.cq_produced(ep.cq).unwrap(), 2);
}

#[test]
fn reg_mr_refuses_remote_write_or_atomic_without_local_write() {
    // ibv_reg_mr(3): "If IBV_ACCESS_REMOTE_WRITE or IBV_ACCESS_REMOTE_ATOMIC is set, then
    // IBV_ACCESS_LOCAL_WRITE must be set too."
    let nic = nic(1, Prefetch::Depth(8));
    let pd = nic.alloc_pd().unwrap();
    let buf = SharedBuffer::new(4096);
    for remote in [Access::REMOTE_WRITE, Access::REMOTE_ATOMIC] {
        let e = nic.reg_mr(pd, &buf, 0, 64, remote).unwrap_err();
        assert!(
            matches!(
                e,
                Error::Register(redn_sys::mem::RegisterError::RemoteWithoutLocalWrite { .. })
            ),
            "{remote}: {e:?}"
        );
        nic.reg_mr(pd, &buf, 0, 64, remote | Access::LOCAL_WRITE)
            .unwrap();
    }
    nic.reg_mr(pd, &buf, 0, 64, Access::REMOTE_READ).unwrap();
}

#[test]
fn wqe_checks_refuse_a_foreign_qpn_that_redn_mode_runs() {
    // RedN keeps operands in the QPN field; ConnectX's WQE checks must be off for that.
    for checks in [false, true] {
        let mut cfg = SoftNicConfig::new("checks");
        cfg.wqe_checks = checks;
        let nic = SoftNic::new(cfg).unwrap();
        let pd = nic.alloc_pd().unwrap();
        let ep = endpoint(&nic, pd, |_| {});
        nic.connect(ep.qp.qpn, ep.qp.qpn).unwrap();
        nic.post_send(ep.qp.qpn, &[wr(1, SIG, nop())]).unwrap();
        // A NOP whose QPN bytes hold data (what a failed `if` leaves behind).
        let mut e = redn_program::wqe::encode_wqe(&wr(2, SIG, nop()), ep.qp.qpn, 1).unwrap();
        e.bytes_mut()[4..7].copy_from_slice(&[0xab, 0xcd, 0xef]);
        ep.qp.sq.buffer.write(ep.qp.sq.offset + 64, e.bytes());
        nic.note_posted(ep.qp.qpn, 1, 2, 2).unwrap();
        nic.ring_doorbell(ep.qp.qpn, 2).unwrap();
        let c = wait_cqes(&nic, ep.cq, 2);
        assert!(c[0].is_ok());
        if checks {
            assert_eq!(c[1].status, Err(Syndrome::LocalQpOperation));
        } else {
            assert!(c[1].is_ok(), "{c:?}");
        }
    }
}

/// A client and a server softnic, one RC connection; the server has `recvs` receives posted
/// and a region with only REMOTE_READ. Returns what the test drives.
fn responder_rig(recvs: u64) -> (SoftNic, SoftNic, Endpoint, Endpoint, Region, Region) {
    let server = nic(1, Prefetch::Depth(8));
    let client = nic(1, Prefetch::Depth(8));
    let spd = server.alloc_pd().unwrap();
    let cpd = client.alloc_pd().unwrap();
    let data = Region::new(
        &server,
        spd,
        4096,
        Access::REMOTE_READ | Access::LOCAL_WRITE,
    );
    let local = Region::new(&client, cpd, 4096, Access::ALL);
    let s = endpoint(&server, spd, |_| {});
    let c = endpoint(&client, cpd, |_| {});
    SoftNic::connect_pair(&client, c.qp.qpn, &server, s.qp.qpn).unwrap();
    for i in 0..recvs {
        server
            .post_recv(s.qp.qpn, 100 + i, &[data.mr.sge(i * 8, 8)])
            .unwrap();
    }
    (server, client, s, c, data, local)
}

#[test]
fn a_responder_error_moves_the_responder_to_error_flushes_its_receives_and_raises_an_event() {
    use redn_program::wqe::Payload;
    use redn_sys::nic::AsyncEvent;
    use redn_sys::QpState;
    // (request, the requester's status, the responder's event)
    type Request = fn(&Region, &Region) -> WrOp;
    type Event = fn(Qpn) -> AsyncEvent;
    let cases: [(&str, Request, Syndrome, Event); 3] = [
        (
            "WRITE without REMOTE_WRITE",
            |data, local| WrOp::Write {
                remote: data.mr.remote(0),
                payload: Payload::Sgl(vec![local.mr.sge(0, 8)]),
                imm: None,
            },
            Syndrome::RemoteAccess,
            AsyncEvent::QpAccessError,
        ),
        (
            "misaligned atomic",
            |data, local| WrOp::FetchAdd {
                remote: data.mr.remote(4),
                add: 1,
                result: Some(local.mr.sge(0, 8)),
            },
            Syndrome::RemoteInvalidRequest,
            AsyncEvent::QpRequestError,
        ),
        (
            "SEND longer than the receive",
            |_, local| WrOp::Send {
                payload: Payload::Sgl(vec![local.mr.sge(0, 64)]),
                imm: None,
            },
            Syndrome::RemoteInvalidRequest,
            AsyncEvent::QpRequestError,
        ),
    ];
    for (what, op, status, event) in cases {
        let (server, client, s, c, data, local) = responder_rig(3);
        client
            .post_send(c.qp.qpn, &[wr(1, SIG, op(&data, &local))])
            .unwrap();
        assert_eq!(wait_cqes(&client, c.cq, 1)[0].status, Err(status), "{what}");
        assert_eq!(server.qp_state(s.qp.qpn).unwrap(), QpState::Error, "{what}");
        assert_eq!(server.get_async_event(), Some(event(s.qp.qpn)), "{what}");
        assert_eq!(server.get_async_event(), None, "{what}: one event");
        // Every receive completes: flushed, or (the SEND) the one it was too long for.
        let done = wait_cqes(&server, s.cq, 3);
        let flushed = done
            .iter()
            .filter(|c| c.status == Err(Syndrome::WrFlush))
            .count();
        let consumed = usize::from(what.starts_with("SEND"));
        assert_eq!(flushed, 3 - consumed, "{what}: {done:?}");
        // In posting order, each with its own wr_id.
        let ids: Vec<u64> = done.iter().map(|c| c.wr_id).collect();
        assert_eq!(ids, [100, 101, 102], "{what}");
        // The receive the SEND failed is the responder's error, in its QP's count.
        assert_eq!(
            server.counters(s.qp.qpn).unwrap().errors,
            u64::try_from(consumed).unwrap(),
            "{what}"
        );
        // The requester's queue is in error too (its WQE failed), and nothing reaches the
        // responder any more.
        assert_eq!(client.qp_state(c.qp.qpn).unwrap(), QpState::Error, "{what}");
    }
}

#[test]
fn a_quiet_managed_queue_moved_to_error_flushes_what_was_posted_but_never_enabled() {
    // A managed queue holds WQEs nobody enabled; its visits find nothing to run, so the PU
    // checks it cheaply (the quiet check). Moved to error, it must still flush every posted
    // WQE (ibv_modify_qp(3): outstanding work requests complete with IBV_WC_WR_FLUSH_ERR).
    let nic = nic(1, Prefetch::Depth(8));
    let pd = nic.alloc_pd().unwrap();
    let a = endpoint(&nic, pd, |c| c.managed_send = true);
    let b = endpoint(&nic, pd, |_| {});
    nic.connect(a.qp.qpn, b.qp.qpn).unwrap();
    let three: Vec<_> = (0..3).map(|i| wr(i, SIG, nop())).collect();
    nic.post_send(a.qp.qpn, &three).unwrap();
    // The PU visits every queue it owns each round: two rounds that ran one of b's WQEs
    // each have visited a and found it idle.
    for id in [10, 11] {
        nic.post_send(b.qp.qpn, &[wr(id, SIG, nop())]).unwrap();
        assert_eq!(wait_cqes(&nic, b.cq, 1)[0].wr_id, id);
    }
    expect_no_cqe(&nic, a.cq, 20);
    nic.set_qp_error(a.qp.qpn).unwrap();
    let flushed = wait_cqes(&nic, a.cq, 3);
    for (i, c) in flushed.iter().enumerate() {
        assert_eq!(c.wr_id, i as u64);
        assert_eq!(c.status, Err(Syndrome::WrFlush));
    }
}
