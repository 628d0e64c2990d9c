//! What a PU's round must do with a queue that another PU enabled for one signaled NOP (a
//! cross-PU doorbell-ordered chain's step, which `SqExec::run_lone_nop` in
//! `softnic/exec/handover.rs` runs lean): run it exactly as the ordinary visit would, and
//! leave to that visit whatever the lean run cannot do as it would (WQE checks, a queue in
//! error). Two queues on two PUs of one softnic; each case expects the completions and
//! counters the general executor gives, worked out by hand. Written for the mutation run
//! over `exec/handover.rs` (docs/testing.md, "Mutation testing"): the chains the other
//! suites run never send such a step through a queue in error or under WQE checks.

mod common;
use common::*;
use redn_program::wqe::{
    encode_wqe, off, wqe_index, CqeOpcode, Opcode, Syndrome, WorkRequest, WqeFlags, WrOp, BB_SIZE,
};
use redn_sys::nic::{Nic, QpInfo};
use redn_sys::softnic::{SoftNic, SoftNicConfig};

const NOP: WrOp = WrOp::Nop {
    raw_segments: Vec::new(),
};

/// One softnic of two PUs, configured further by `configure`, with a managed queue `q` on
/// PU 1 and its master `m` on PU 0 (each connected to itself), rings of 64 BBs.
fn cross_pair(configure: impl FnOnce(&mut SoftNicConfig)) -> (SoftNic, Endpoint, Endpoint) {
    let mut cfg = SoftNicConfig::new("cross-pu-semantics");
    cfg.pus = 2;
    configure(&mut cfg);
    let nic = SoftNic::new(cfg).unwrap();
    let pd = nic.alloc_pd().unwrap();
    let q = endpoint(&nic, pd, |c| {
        c.managed_send = true;
        c.sq_bbs = 64;
        c.pu = Some(1);
    });
    nic.connect(q.qp.qpn, q.qp.qpn).unwrap();
    let m = endpoint(&nic, pd, |c| {
        c.sq_bbs = 64;
        c.pu = Some(0);
    });
    nic.connect(m.qp.qpn, m.qp.qpn).unwrap();
    (nic, q, m)
}

/// Write `wrs` into `qp`'s ring from index 0 as the one-BB images `encode_wqe` makes (wr_ids
/// are the indices), each changed by `patch` (given its index), and note the first `noted`
/// of them posted, as a host's post does; the rest are in the ring but not posted.
fn write_ring(
    nic: &SoftNic,
    qp: &QpInfo,
    wrs: &[WorkRequest],
    noted: usize,
    patch: impl Fn(usize, &mut [u8]),
) {
    for (i, w) in wrs.iter().enumerate() {
        let pi = i as u64;
        let mut e = encode_wqe(w, qp.qpn, wqe_index(pi)).unwrap();
        assert_eq!(e.bbs(), 1);
        patch(i, e.bytes_mut());
        qp.sq
            .buffer
            .write(qp.sq.offset + i * BB_SIZE, &e.bytes()[..BB_SIZE]);
        if i < noted {
            nic.note_posted(qp.qpn, pi, pi + 1, pi).unwrap();
        }
    }
    nic.ring_doorbell(qp.qpn, noted as u64).unwrap();
}

/// The master's side of a chain of `steps` steps on `q`, then a signaled NOP (wr_id 7).
fn post_master(nic: &SoftNic, m: &Endpoint, q: &Endpoint, steps: u32) {
    let mut master = doorbell_master(q, steps);
    master.push(wr(
        0,
        WqeFlags::NONE,
        WrOp::Wait {
            cq: q.cq,
            count: steps - 1,
        },
    ));
    master.push(wr(7, SIG, NOP));
    nic.post_send(m.qp.qpn, &master).unwrap();
}

/// A cross-PU chain of signaled NOPs completes each once, in order, with its own wr_id, and
/// counts each once; with the fast paths on (the lean run) and off (every WQE through the
/// general executor), which must agree.
#[test]
fn a_cross_pu_chain_of_signaled_nops_completes_each_once_in_order() {
    const STEPS: u32 = 24;
    for fast_paths in [true, false] {
        let (nic, q, m) = cross_pair(|c| c.fast_paths = fast_paths);
        let wrs: Vec<_> = (0..u64::from(STEPS)).map(|i| wr(i, SIG, NOP)).collect();
        nic.post_send(q.qp.qpn, &wrs).unwrap();
        post_master(&nic, &m, &q, STEPS);
        let done = wait_cqes(&nic, m.cq, 1);
        assert_eq!((done[0].wr_id, done[0].status), (7, Ok(())), "{fast_paths}");
        let q_done = wait_cqes(&nic, q.cq, STEPS as usize);
        let got: Vec<_> = q_done
            .iter()
            .map(|c| (c.wr_id, c.opcode, c.status))
            .collect();
        let want: Vec<_> = (0..u64::from(STEPS))
            .map(|i| (i, CqeOpcode::Req, Ok(())))
            .collect();
        assert_eq!(got, want, "fast paths {fast_paths}");
        let counters = nic.counters(q.qp.qpn).unwrap();
        assert_eq!(
            counters.by_opcode(Opcode::Nop),
            u64::from(STEPS),
            "{fast_paths}"
        );
        let mut extra = Vec::new();
        nic.poll_cq(q.cq, 4, &mut extra).unwrap();
        assert!(extra.is_empty(), "{fast_paths}: {extra:?}");
    }
}

/// With WQE checks on, the NOP another PU enables is checked as any WQE: one whose control
/// segment carries another index is a local QP operation error, not a completed NOP.
#[test]
fn with_wqe_checks_a_cross_pu_step_refuses_a_nop_with_another_index() {
    let (nic, q, m) = cross_pair(|c| c.wqe_checks = true);
    write_ring(
        &nic,
        &q.qp,
        &[wr(0, SIG, NOP), wr(1, SIG, NOP)],
        2,
        |i, b| {
            if i == 1 {
                b[off::WQE_INDEX + 1] = 5;
            }
        },
    );
    post_master(&nic, &m, &q, 2);
    let done = wait_cqes(&nic, q.cq, 2);
    assert_eq!(done[0].status, Ok(()), "{done:?}");
    assert_eq!(done[1].status, Err(Syndrome::LocalQpOperation), "{done:?}");
    assert_eq!(wait_cqes(&nic, m.cq, 1)[0].status, Ok(()));
    assert_eq!(nic.counters(q.qp.qpn).unwrap().errors, 1);
}

/// A queue in error completes the NOP another PU then enables with a flush error: the
/// first WQE (a NOP of ds 0) fails; the second, a signaled NOP written to the ring but not
/// posted (its wr_id is 0), is enabled by the master's second step after the failure.
#[test]
fn a_queue_in_error_flushes_the_nop_another_pu_enables() {
    let (nic, q, m) = cross_pair(|_| {});
    write_ring(
        &nic,
        &q.qp,
        &[wr(0, SIG, NOP), wr(1, SIG, NOP)],
        1,
        |i, b| {
            if i == 0 {
                b[off::DS] = 0;
            }
        },
    );
    // Step one: the failing NOP; its error completion is what the master's WAIT counts.
    let first = [wr(
        0,
        WqeFlags::NONE,
        WrOp::SendEnable {
            qp: q.qp.qpn,
            pi: 1,
        },
    )];
    nic.post_send(m.qp.qpn, &first).unwrap();
    let failed = wait_cqes(&nic, q.cq, 1);
    assert_eq!(
        failed[0].status,
        Err(Syndrome::LocalQpOperation),
        "{failed:?}"
    );
    // The NOP is in the ring but never posted (as a WQE a chain writes into a managed
    // queue is not): no flush reaches it before the enable does, whenever PU 1 looks.
    let second = [
        wr(
            0,
            WqeFlags::NONE,
            WrOp::SendEnable {
                qp: q.qp.qpn,
                pi: 2,
            },
        ),
        wr(0, WqeFlags::NONE, WrOp::Wait { cq: q.cq, count: 1 }),
        wr(7, SIG, NOP),
    ];
    nic.post_send(m.qp.qpn, &second).unwrap();
    assert_eq!(wait_cqes(&nic, m.cq, 1)[0].status, Ok(()));
    let flushed = wait_cqes(&nic, q.cq, 1);
    assert_eq!(
        (flushed[0].wr_id, flushed[0].status),
        (0, Err(Syndrome::WrFlush)),
        "{flushed:?}"
    );
    assert_eq!(nic.counters(q.qp.qpn).unwrap().by_opcode(Opcode::Nop), 0);
}
