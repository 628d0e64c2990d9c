//! Host-driven softnics (`SoftNicConfig::host_driven`): no PU thread; the app's calls run
//! the queues and take the datagrams, and the endpoint's receive thread serves the socket
//! while the app does not call in.

use super::offloads::{hash_gets, offload_rig_for};
use super::opcodes::{every_opcode, exact_under_faults};
use super::pairs::{connect_locals, writes_both_ways_until_b_receive_thread_serves};
use super::*;

#[test]
fn every_opcode_from_a_host_driven_client() {
    let local = Local::host_driven("hd-every", None);
    let mut peer = Peer::spawn("memory", None);
    every_opcode(&local, &mut peer, 1024);
    assert!(
        !thread_names().iter().any(|n| n.starts_with("hd-every-pu")),
        "a host-driven softnic starts no PU thread: {:?}",
        thread_names()
    );
    let report = peer.finish();
    assert!(report.ends_with("state ERR\n"), "{report}");
    assert_eq!(local.ep.drops().get(DropReason::BadIcrc), 0);
}

#[test]
fn loss_reordering_and_duplication_through_a_host_driven_client() {
    exact_under_faults(&Local::host_driven("hd-faults", Some(FAULTS)));
}

#[test]
fn hash_get_served_to_a_host_driven_client() {
    hash_gets(offload_rig_for(
        Local::host_driven("hd-hash", None),
        "offload:hash-get",
    ));
}

/// While the host-driven side's app waits on the other side (it makes no call), its
/// receive thread serves the socket once the app's lease on it runs out: the other side's
/// WRITEs are placed and ACKed (with the ACKs the app held for its next request), and the
/// app's own WRITEs, run in its calls, go on between. Nothing is lost or placed twice.
#[test]
fn a_host_driven_app_that_stops_calling_is_served_by_its_receive_thread() {
    let (a, b, ca, cb) = connect_locals(
        Local::new(None),
        Local::host_driven("hd-quiet", None),
        7,
        0,
        |_, _| {},
    );
    // `b` makes no call while `a` waits for its WRITE's completion.
    writes_both_ways_until_b_receive_thread_serves(&a, &b, &ca, &cb, 8);
    for (l, c) in [(&a, &ca), (&b, &cb)] {
        assert_eq!(l.nic.qp_state(c.qp).unwrap(), QpState::ReadyToSend);
    }
}

/// A host-driven queue runs only in its app's calls: a WAIT satisfied by a WRITE_IMM that
/// the receive thread placed releases its WRITE at the app's next call, not before.
#[test]
fn a_host_driven_queue_runs_only_when_its_app_calls_in() {
    let (a, b, ca, cb) = connect_locals(
        Local::new(None),
        Local::host_driven("hd-wait", None),
        7,
        64,
        |_, _| {},
    );
    b.buf.write(4096, b"released");
    let answer = WrOp::Write {
        remote: remote_at(&cb.remote, 256),
        payload: Payload::Sgl(vec![b.buf.mr.sge(4096, 8)]),
        imm: None,
    };
    let chain = [
        wr(
            0,
            redn_program::wqe::WqeFlags::NONE,
            WrOp::Wait {
                cq: cb.cq,
                count: 0,
            },
        ),
        wr(1, redn_program::wqe::WqeFlags::NONE, answer),
    ];
    b.nic.post_send(cb.qp, &chain).unwrap();
    // Placed and completed on `b` by its receive thread; `a`'s WRITE completes.
    a.write(&ca, 512, b"trigger!", Some(5));
    assert_eq!(b.buf.read(512, 8), b"trigger!");
    assert_eq!(
        b.nic.sq_consumed(cb.qp).unwrap(),
        0,
        "the WAIT has not passed: nobody has called into `b` since its CQE"
    );
    assert_eq!(
        a.buf.read(256, 8),
        [0; 8],
        "no answer before `b`'s app calls"
    );
    wait_until("the answer lands after `b`'s app calls in", || {
        b.nic.progress();
        a.buf.read(256, 8) == b"released"
    });
    let recv = wait_cqes(&b.nic, cb.cq, 1);
    assert_eq!((recv[0].imm, recv[0].byte_len), (Some(5), 8));
}
