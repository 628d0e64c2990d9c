//! Completion channels: an armed CQ reports its next completion once, so a thread can sleep
//! until there is something to poll.

mod common;
use common::*;
use redn_program::wqe::{Payload, WqeFlags, WrOp};
use redn_sys::nic::{CompChannel, Nic};
use redn_sys::softnic::Prefetch;
use std::time::Duration;

const SHORT: Duration = Duration::from_millis(30);
const LONG: Duration = Duration::from_secs(5);

fn nop(wr_id: u64) -> redn_program::wqe::WorkRequest {
    wr(
        wr_id,
        SIG,
        WrOp::Nop {
            raw_segments: vec![],
        },
    )
}

#[test]
fn an_armed_cq_reports_its_next_completion_once() {
    let nic = nic(1, Prefetch::Depth(8));
    let pd = nic.alloc_pd().unwrap();
    let ep = endpoint(&nic, pd, |_| {});
    nic.connect(ep.qp.qpn, ep.qp.qpn).unwrap();
    let ch = CompChannel::new();

    // Not armed: a completion leaves the channel empty.
    nic.post_send(ep.qp.qpn, &[nop(1)]).unwrap();
    wait_cqes(&nic, ep.cq, 1);
    assert_eq!(ch.get_event(SHORT), None, "an unarmed CQ signalled");

    // Armed: exactly one event for two completions.
    nic.req_notify_cq(ep.cq, &ch).unwrap();
    assert_eq!(ch.try_event(), None, "arming alone signalled");
    nic.post_send(ep.qp.qpn, &[nop(2), nop(3)]).unwrap();
    assert_eq!(ch.get_event(LONG), Some(ep.cq));
    wait_cqes(&nic, ep.cq, 2);
    assert_eq!(ch.get_event(SHORT), None, "one arming signalled twice");

    // Armed again: signals again.
    nic.req_notify_cq(ep.cq, &ch).unwrap();
    nic.post_send(ep.qp.qpn, &[nop(4)]).unwrap();
    assert_eq!(ch.get_event(LONG), Some(ep.cq));
    assert_eq!(wait_cqes(&nic, ep.cq, 1)[0].wr_id, 4);

    // A wait with no end (`Duration::MAX`, past what the clock counts) takes the event.
    nic.req_notify_cq(ep.cq, &ch).unwrap();
    nic.post_send(ep.qp.qpn, &[nop(5)]).unwrap();
    assert_eq!(ch.get_event(Duration::MAX), Some(ep.cq));
    assert_eq!(wait_cqes(&nic, ep.cq, 1)[0].wr_id, 5);
}

#[test]
fn completion_mode_3_signals_only_an_armed_cq_and_once_per_arming() {
    // Mode 3, "CQE and EQE" (`MLX5_WQE_CTRL_CQ_UPDATE_AND_EQE`), asks for an event with the
    // CQE, but an mlx5 CQ only raises one while armed: rdma-core's `mlx5_arm_cq` writes the
    // arm sequence number and consumer index to the CQ's arm doorbell, and each event taken
    // advances that sequence number (`mlx5_cq_event`), so an arming yields one event.
    let nic = nic(1, Prefetch::Depth(8));
    let pd = nic.alloc_pd().unwrap();
    let ep = endpoint(&nic, pd, |_| {});
    nic.connect(ep.qp.qpn, ep.qp.qpn).unwrap();
    let ch = CompChannel::new();
    let mode_3 = |wr_id| {
        wr(
            wr_id,
            WqeFlags(3 << 2),
            WrOp::Nop {
                raw_segments: vec![],
            },
        )
    };

    // Not armed: the CQEs are written, no event.
    nic.post_send(ep.qp.qpn, &[mode_3(1), mode_3(2)]).unwrap();
    let got = wait_cqes(&nic, ep.cq, 2);
    assert_eq!(got.iter().map(|c| c.wr_id).collect::<Vec<_>>(), [1, 2]);
    assert_eq!(ch.get_event(SHORT), None, "mode 3 signalled an unarmed CQ");

    // Armed: one event for three mode-3 completions.
    nic.req_notify_cq(ep.cq, &ch).unwrap();
    nic.post_send(ep.qp.qpn, &[mode_3(3), mode_3(4), mode_3(5)])
        .unwrap();
    assert_eq!(ch.get_event(LONG), Some(ep.cq));
    assert_eq!(wait_cqes(&nic, ep.cq, 3).len(), 3);
    assert_eq!(ch.get_event(SHORT), None, "one arming signalled twice");
}

#[test]
fn a_sleeping_thread_is_woken_by_a_completion_from_a_pu_and_errors_count() {
    let nic = nic(2, Prefetch::Depth(8));
    let pd = nic.alloc_pd().unwrap();
    let m = Region::new(&nic, pd, 4096, ALL);
    let ep = endpoint(&nic, pd, |c| c.pu = Some(1));
    nic.connect(ep.qp.qpn, ep.qp.qpn).unwrap();
    let ch = CompChannel::new();
    nic.req_notify_cq(ep.cq, &ch).unwrap();
    let sleeper = {
        let ch = ch.clone();
        std::thread::spawn(move || ch.get_event(LONG))
    };
    std::thread::sleep(SHORT);
    // A WRITE outside the region: the error completion is a completion too.
    nic.post_send(
        ep.qp.qpn,
        &[wr(
            9,
            WqeFlags::NONE,
            WrOp::Write {
                remote: m.mr.remote(4090),
                payload: Payload::Sgl(vec![m.mr.sge(0, 64)]),
                imm: None,
            },
        )],
    )
    .unwrap();
    assert_eq!(sleeper.join().unwrap(), Some(ep.cq));
    let c = wait_cqes(&nic, ep.cq, 1);
    assert!(!c[0].is_ok(), "{c:?}");
}

#[test]
fn one_channel_serves_several_cqs_in_the_order_they_completed() {
    let nic = nic(1, Prefetch::Depth(8));
    let pd = nic.alloc_pd().unwrap();
    let a = endpoint(&nic, pd, |_| {});
    let b = endpoint(&nic, pd, |_| {});
    for q in [a.qp.qpn, b.qp.qpn] {
        nic.connect(q, q).unwrap();
    }
    let ch = CompChannel::new();
    nic.req_notify_cq(a.cq, &ch).unwrap();
    nic.req_notify_cq(b.cq, &ch).unwrap();
    nic.post_send(b.qp.qpn, &[nop(1)]).unwrap();
    assert_eq!(ch.get_event(LONG), Some(b.cq));
    nic.post_send(a.qp.qpn, &[nop(2)]).unwrap();
    assert_eq!(ch.get_event(LONG), Some(a.cq));
    assert_eq!(ch.try_event(), None);
    // Completions that came before arming do not signal; polling after arming finds them.
    nic.post_send(a.qp.qpn, &[nop(3)]).unwrap();
    wait_until("the third NOP completes", || {
        nic.cq_produced(a.cq).unwrap() == 2
    });
    nic.req_notify_cq(a.cq, &ch).unwrap();
    assert_eq!(ch.get_event(SHORT), None);
    assert_eq!(wait_cqes(&nic, a.cq, 2).len(), 2);
}

#[test]
fn arming_an_unknown_cq_is_an_error() {
    let nic = nic(1, Prefetch::Depth(8));
    let err = nic
        .req_notify_cq(redn_sys::Cqn(999), &CompChannel::new())
        .unwrap_err();
    assert!(
        matches!(err, redn_sys::Error::NoSuchCq(redn_sys::Cqn(999))),
        "{err}"
    );
}
