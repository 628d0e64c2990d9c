//! What the doorbell hand-over (`softnic/exec/handover.rs`: a master's SEND_EN of a queue on
//! its own PU, then a WAIT on that queue's CQ, runs the queue at once) must leave to the
//! ordinary executor: a WAIT on some other CQ, a WQE with the wrong index under WQE checks, a
//! WQE with too few segments. Each case expects what the general executor does, worked out
//! by hand. Written for the mutation run over `exec/handover.rs` and `exec/fast.rs`
//! (docs/testing.md, "Mutation testing"): the chains the other suites run never break the
//! hand-over's pattern in these ways.

mod common;
use common::*;
use redn_program::wqe::{
    encode_wqe, off, wqe_index, Opcode, Payload, Syndrome, WorkRequest, WqeFlags, WrOp, BB_SIZE,
};
use redn_sys::nic::{Nic, QpInfo};
use redn_sys::softnic::{Prefetch, SoftNic, SoftNicConfig};
use redn_sys::Pdn;

const NOP: WrOp = WrOp::Nop {
    raw_segments: Vec::new(),
};

/// One softnic of one PU (so a master and the queue it enables are on the same PU).
fn softnic(wqe_checks: bool) -> SoftNic {
    let mut cfg = SoftNicConfig::new("handover-semantics");
    cfg.pus = 1;
    cfg.wqe_checks = wqe_checks;
    SoftNic::new(cfg).unwrap()
}

fn enable(q: &Endpoint, pi: u32) -> WrOp {
    WrOp::SendEnable { qp: q.qp.qpn, pi }
}

fn wait(cq: redn_sys::Cqn, count: u32) -> WrOp {
    WrOp::Wait { cq, count }
}

/// The master's doorbell step: SEND_EN(q, `pi`), a WAIT for q's first completion, then a
/// signaled NOP (wr_id 7).
fn post_step(nic: &SoftNic, m: &Endpoint, q: &Endpoint, pi: u32) {
    let step = [
        wr(0, WqeFlags::NONE, enable(q, pi)),
        wr(0, WqeFlags::NONE, wait(q.cq, 0)),
        wr(7, SIG, NOP),
    ];
    nic.post_send(m.qp.qpn, &step).unwrap();
}

/// Write `wrs` into `qp`'s ring from index 0 as the one-BB images `encode_wqe` makes, the
/// one at position `patched` changed by `patch`, and ring the doorbell (wr_ids are the
/// indices).
fn post_patched(
    nic: &SoftNic,
    qp: &QpInfo,
    wrs: &[WorkRequest],
    patched: usize,
    patch: impl Fn(&mut [u8]),
) {
    for (i, w) in wrs.iter().enumerate() {
        let pi = i as u64;
        let mut e = encode_wqe(w, qp.qpn, wqe_index(pi)).unwrap();
        assert_eq!(e.bbs(), 1);
        if i == patched {
            patch(e.bytes_mut());
        }
        qp.sq
            .buffer
            .write(qp.sq.offset + i * BB_SIZE, &e.bytes()[..BB_SIZE]);
        nic.note_posted(qp.qpn, pi, pi + 1, pi).unwrap();
    }
    nic.ring_doorbell(qp.qpn, wrs.len() as u64).unwrap();
}

/// After a SEND_EN of a queue on its PU, a WAIT on another queue's CQ waits for that CQ,
/// however far the enabled queue's completions have got: as the first WAIT after the
/// enable, and as a WAIT inside a run of doorbell steps.
#[test]
fn a_wait_on_another_cq_after_a_hand_over_waits_for_that_cq() {
    for steps_before in [0u32, 1] {
        let nic = softnic(false);
        let pd = nic.alloc_pd().unwrap();
        let (q, m) = doorbell_pair(&nic, pd, 64);
        let x = endpoint(&nic, pd, |_| {});
        nic.connect(x.qp.qpn, x.qp.qpn).unwrap();
        nic.post_send(q.qp.qpn, &[wr(0, SIG, NOP), wr(1, SIG, NOP)])
            .unwrap();
        let mut master = vec![wr(0, WqeFlags::NONE, enable(&q, 1))];
        if steps_before == 1 {
            master.push(wr(0, WqeFlags::NONE, wait(q.cq, 0)));
            master.push(wr(0, WqeFlags::NONE, enable(&q, 2)));
        }
        // x's CQ has produced nothing: this WAIT must block (q's has produced one or two).
        master.push(wr(0, WqeFlags::NONE, wait(x.cq, 0)));
        master.push(wr(7, SIG, NOP));
        nic.post_send(m.qp.qpn, &master).unwrap();
        wait_until("the master stalls on the WAIT for x", || {
            nic.counters(m.qp.qpn).unwrap().wait_stalls == 1
        });
        let mut early = Vec::new();
        nic.poll_cq(m.cq, 4, &mut early).unwrap();
        assert!(
            early.is_empty(),
            "{steps_before}: ran past the WAIT: {early:?}"
        );
        nic.post_send(x.qp.qpn, &[wr(0, SIG, NOP)]).unwrap();
        let done = wait_cqes(&nic, m.cq, 1);
        assert_eq!(
            (done[0].wr_id, done[0].status),
            (7, Ok(())),
            "{steps_before}"
        );
        let q_done = wait_cqes(&nic, q.cq, 1 + steps_before as usize);
        assert!(q_done.iter().all(|c| c.is_ok()), "{q_done:?}");
    }
}

/// The enabled queue's one WQE, a signaled NOP changed by `patch`, run by a hand-over on a
/// softnic with WQE checks `checks`: it must fail as a local QP operation error (and the
/// master's WAIT for it then passes).
fn enabled_nop_is_refused(checks: bool, patch: impl Fn(&mut [u8])) {
    let nic = softnic(checks);
    let pd = nic.alloc_pd().unwrap();
    let (q, m) = doorbell_pair(&nic, pd, 64);
    post_patched(&nic, &q.qp, &[wr(0, SIG, NOP)], 0, patch);
    post_step(&nic, &m, &q, 1);
    let done = wait_cqes(&nic, q.cq, 1);
    assert_eq!(done[0].status, Err(Syndrome::LocalQpOperation), "{done:?}");
    assert!(wait_cqes(&nic, m.cq, 1)[0].is_ok());
}

/// A doorbell chain of two steps on a softnic with WQE checks `checks` whose second SEND_EN
/// (signaled, wr_id 2) is `second` (given the enabled queue) changed by `patch`: it must fail
/// as a local QP operation error, leaving the enabled queue's second NOP unrun.
fn second_send_en_is_refused(
    checks: bool,
    second: impl FnOnce(&Endpoint) -> WrOp,
    patch: impl Fn(&mut [u8]),
) {
    let nic = softnic(checks);
    let pd = nic.alloc_pd().unwrap();
    let (q, m) = doorbell_pair(&nic, pd, 64);
    nic.post_send(q.qp.qpn, &[wr(0, SIG, NOP), wr(1, SIG, NOP)])
        .unwrap();
    let master = [
        wr(0, WqeFlags::NONE, enable(&q, 1)),
        wr(1, WqeFlags::NONE, wait(q.cq, 0)),
        wr(2, SIG, second(&q)),
        wr(3, WqeFlags::NONE, wait(q.cq, 1)),
        wr(4, SIG, NOP),
    ];
    post_patched(&nic, &m.qp, &master, 2, patch);
    let done = wait_cqes(&nic, m.cq, 3);
    assert_eq!(
        (done[0].wr_id, done[0].status),
        (2, Err(Syndrome::LocalQpOperation)),
        "{done:?}"
    );
    let q_done = wait_cqes(&nic, q.cq, 1);
    assert!(q_done[0].is_ok() && q_done[0].wr_id == 0, "{q_done:?}");
    assert_eq!(
        nic.sq_consumed(q.qp.qpn).unwrap(),
        1,
        "only the first NOP ran"
    );
}

/// With WQE checks on, a hand-over checks the enabled queue's WQEs and the master's SEND_ENs
/// inside a run of steps as anywhere else: a NOP, or a SEND_EN, whose control segment
/// carries another index is a local QP operation error.
#[test]
fn with_wqe_checks_a_hand_over_refuses_a_wqe_with_another_index() {
    enabled_nop_is_refused(true, |b| b[off::WQE_INDEX + 1] = 5);
    second_send_en_is_refused(true, |q| enable(q, 2), |b| b[off::WQE_INDEX + 1] = 9);
}

/// Inside a run of doorbell steps, a SEND_EN is a step only if it names the enabled queue:
/// one naming a queue that does not exist (its number differs from the enabled queue's in
/// every one of its 24 bits) is the executor's to refuse.
#[test]
fn a_send_en_of_another_queue_ends_the_hand_over() {
    let mirror = |q: &Endpoint| WrOp::SendEnable {
        qp: redn_sys::Qpn(q.qp.qpn.0 ^ 0x00ff_ffff),
        pi: 2,
    };
    second_send_en_is_refused(false, mirror, |_| {});
}

/// A hand-over leaves a WQE with too few segments to the executor, which refuses it: the
/// enabled queue's NOP of ds 0, and the master's SEND_EN of ds 1 inside a run of steps.
#[test]
fn a_hand_over_refuses_a_wqe_with_too_few_segments() {
    enabled_nop_is_refused(false, |b| b[off::DS] = 0);
    second_send_en_is_refused(false, |q| enable(q, 2), |b| b[off::DS] = 1);
}

/// One softnic of one PU fetching as `prefetch` says, with a doorbell pair on it.
fn pair_with(prefetch: Prefetch) -> (SoftNic, Pdn, Endpoint, Endpoint) {
    pair_configured(|c| c.prefetch = prefetch)
}

/// One softnic of one PU, configured further by `configure`, with a doorbell pair on it.
fn pair_configured(
    configure: impl FnOnce(&mut SoftNicConfig),
) -> (SoftNic, Pdn, Endpoint, Endpoint) {
    let mut cfg = SoftNicConfig::new("handover-pair");
    cfg.pus = 1;
    configure(&mut cfg);
    let nic = SoftNic::new(cfg).unwrap();
    let pd = nic.alloc_pd().unwrap();
    let (q, m) = doorbell_pair(&nic, pd, 64);
    (nic, pd, q, m)
}

/// A hand-over that finds the enabled queue enabled for two WQEs runs both (the second as
/// prefetched behind the first) before the master goes on: a WRITE of the master's right
/// after its WAIT, over the ring slot of the enabled queue's second WQE, comes too late to
/// change what that WQE does.
#[test]
fn a_hand_over_runs_every_enabled_wqe_before_the_master_goes_on() {
    let (nic, pd, q, m) = pair_with(Prefetch::Depth(8));
    let ring = nic
        .reg_mr(pd, &q.qp.sq.buffer, q.qp.sq.offset, 64 * BB_SIZE, ALL)
        .unwrap();
    let mem = Region::new(&nic, pd, 256, ALL);
    mem.write(0, &[0x5a; 8]);
    // What the master writes over q's slot 1: a signaled WRITE of mem[0..8] to mem[128..].
    let marker = WrOp::Write {
        remote: mem.mr.remote(128),
        payload: Payload::Sgl(vec![mem.mr.sge(0, 8)]),
        imm: None,
    };
    let image = encode_wqe(&wr(1, SIG, marker), q.qp.qpn, wqe_index(1)).unwrap();
    mem.write(64, &image.bytes()[..BB_SIZE]);
    nic.post_send(q.qp.qpn, &[wr(0, SIG, NOP), wr(1, SIG, NOP)])
        .unwrap();
    let patch = WrOp::Write {
        remote: ring.remote(BB_SIZE as u64),
        payload: Payload::Sgl(vec![mem.mr.sge(64, u32::try_from(BB_SIZE).unwrap())]),
        imm: None,
    };
    nic.post_send(
        m.qp.qpn,
        &[
            wr(0, WqeFlags::NONE, enable(&q, 2)),
            wr(0, WqeFlags::NONE, wait(q.cq, 0)),
            wr(0, WqeFlags::NONE, patch),
            wr(9, SIG, NOP),
        ],
    )
    .unwrap();
    assert!(wait_cqes(&nic, m.cq, 1)[0].is_ok());
    let done = wait_cqes(&nic, q.cq, 2);
    assert!(done.iter().all(|c| c.is_ok()), "{done:?}");
    assert_eq!(
        mem.read(128, 8),
        [0; 8],
        "q's second WQE ran as the master patched it"
    );
    assert_eq!(nic.counters(q.qp.qpn).unwrap().by_opcode(Opcode::Nop), 2);
}

/// Fetching at execute, a WQE the enabled queue has fetched already (a WAIT it is blocked
/// on) runs as it was fetched when a later hand-over comes to it, though its ring slot was
/// rewritten since (into a signaled NOP, which the hand-over would run at once).
#[test]
fn a_hand_over_runs_a_fetched_wqe_as_it_was_fetched() {
    let (nic, pd, q, m) = pair_with(Prefetch::AtExecute);
    let x = endpoint(&nic, pd, |_| {});
    nic.connect(x.qp.qpn, x.qp.qpn).unwrap();
    nic.post_send(q.qp.qpn, &[wr(0, SIG, wait(x.cq, 0)), wr(1, SIG, NOP)])
        .unwrap();
    nic.post_send(m.qp.qpn, &[wr(0, WqeFlags::NONE, enable(&q, 1))])
        .unwrap();
    wait_until("q blocks on its WAIT", || {
        nic.counters(q.qp.qpn).unwrap().wait_stalls == 1
    });
    let nop = encode_wqe(&wr(0, SIG, NOP), q.qp.qpn, wqe_index(0)).unwrap();
    q.qp.sq
        .buffer
        .write(q.qp.sq.offset, &nop.bytes()[..BB_SIZE]);
    post_step(&nic, &m, &q, 2);
    wait_until("the master stalls on q's WAIT", || {
        nic.counters(m.qp.qpn).unwrap().wait_stalls == 1
    });
    let mut early = Vec::new();
    nic.poll_cq(q.cq, 4, &mut early).unwrap();
    assert!(early.is_empty(), "q ran past its WAIT: {early:?}");
    nic.post_send(x.qp.qpn, &[wr(0, SIG, NOP)]).unwrap();
    let done = wait_cqes(&nic, m.cq, 1);
    assert_eq!((done[0].wr_id, done[0].status), (7, Ok(())));
    assert!(wait_cqes(&nic, q.cq, 2).iter().all(|c| c.is_ok()));
    let counts = nic.counters(q.qp.qpn).unwrap();
    assert_eq!(
        [Opcode::Wait, Opcode::Nop].map(|o| counts.by_opcode(o)),
        [1, 1],
        "slot 0 ran as the WAIT it was fetched as"
    );
}

/// Fetching at execute, a hand-over to a queue enabled for an unsignaled NOP and a signaled
/// one runs each once (the second fetched by its first 16 bytes only, as a doorbell step's
/// NOP is), counts two NOPs and completes the second, and nothing else.
#[test]
fn a_hand_over_runs_an_unsignaled_and_a_signaled_nop_once_each() {
    let (nic, _, q, m) = pair_with(Prefetch::AtExecute);
    nic.post_send(q.qp.qpn, &[wr(0, WqeFlags::NONE, NOP), wr(1, SIG, NOP)])
        .unwrap();
    post_step(&nic, &m, &q, 2);
    assert_eq!(wait_cqes(&nic, m.cq, 1)[0].wr_id, 7);
    let done = wait_cqes(&nic, q.cq, 1);
    assert_eq!((done[0].wr_id, done[0].status), (1, Ok(())));
    // All of q ran inside the master's visit, before its NOP: nothing more comes.
    let mut more = Vec::new();
    nic.poll_cq(q.cq, 4, &mut more).unwrap();
    assert!(more.is_empty(), "{more:?}");
    assert_eq!(nic.counters(q.qp.qpn).unwrap().by_opcode(Opcode::Nop), 2);
    assert_eq!(
        nic.qp_state(q.qp.qpn).unwrap(),
        redn_sys::QpState::ReadyToSend
    );
}

/// A signaled NOP of ds 61 takes 16 BBs: a hand-over to a queue enabled for it runs it as
/// one WQE (one completion, the queue 16 BBs on), not as a one-BB NOP and its padding.
#[test]
fn a_hand_over_runs_a_nop_of_sixteen_bbs_as_one_wqe() {
    // Fetching at execute: with nothing prefetched behind it, the step reads the NOP's first
    // 16 bytes only (`fetch_signaled_nop`), whose ds must say one BB.
    let (nic, _, q, m) = pair_with(Prefetch::AtExecute);
    let nops: Vec<WorkRequest> = (0..16).map(|i| wr(i, SIG, NOP)).collect();
    post_patched(&nic, &q.qp, &nops, 0, |b| b[off::DS] = 61);
    post_step(&nic, &m, &q, 16);
    assert_eq!(wait_cqes(&nic, m.cq, 1)[0].wr_id, 7);
    wait_until("q runs its 16 BBs", || {
        nic.sq_consumed(q.qp.qpn).unwrap() == 16
    });
    let done = wait_cqes(&nic, q.cq, 1);
    assert_eq!((done[0].wr_id, done[0].status), (0, Ok(())));
    assert_eq!(nic.counters(q.qp.qpn).unwrap().by_opcode(Opcode::Nop), 1);
    let mut more = Vec::new();
    nic.poll_cq(q.cq, 16, &mut more).unwrap();
    assert!(more.is_empty(), "{more:?}");
}

/// A NOP of two segments whose second one holds, where a WAIT's or an enable's object and
/// count sit, the enabled queue's number or its CQ's: inside a run of doorbell steps it is
/// a NOP (it ends the run), not a SEND_EN of that queue or a WAIT on that CQ.
#[test]
fn a_nop_with_a_queue_or_cq_number_in_its_segment_ends_the_hand_over() {
    for as_wait in [false, true] {
        let (nic, _, q, m) = pair_with(Prefetch::Depth(8));
        nic.post_send(q.qp.qpn, &[wr(0, SIG, NOP), wr(1, SIG, NOP)])
            .unwrap();
        // Bytes 24..32 of the WQE: a count and an object (a WAIT on q's CQ for a count it
        // has passed, or an enable of q one further).
        let (count, obj) = if as_wait {
            (0u32, q.cq.0)
        } else {
            (2, q.qp.qpn.0)
        };
        let mut seg = [0u8; 16];
        seg[8..12].copy_from_slice(&count.to_be_bytes());
        seg[12..16].copy_from_slice(&obj.to_be_bytes());
        let decoy = WrOp::Nop {
            raw_segments: vec![seg],
        };
        let mut master = vec![
            wr(0, WqeFlags::NONE, enable(&q, 1)),
            wr(0, WqeFlags::NONE, wait(q.cq, 0)),
        ];
        if as_wait {
            master.push(wr(0, WqeFlags::NONE, enable(&q, 2)));
        }
        master.push(wr(0, WqeFlags::NONE, decoy));
        master.push(wr(7, SIG, NOP));
        nic.post_send(m.qp.qpn, &master).unwrap();
        assert_eq!(wait_cqes(&nic, m.cq, 1)[0].wr_id, 7, "{as_wait}");
        let want_q = if as_wait { 2 } else { 1 };
        wait_until("q runs what it was enabled for", || {
            nic.sq_consumed(q.qp.qpn).unwrap() == want_q
        });
        let mc = nic.counters(m.qp.qpn).unwrap();
        assert_eq!(
            [Opcode::Nop, Opcode::Wait, Opcode::SendEn].map(|o| mc.by_opcode(o)),
            [2, 1, 1 + u64::from(as_wait)],
            "{as_wait}: the master's WQEs"
        );
        assert_eq!(
            nic.counters(q.qp.qpn).unwrap().by_opcode(Opcode::Nop),
            want_q,
            "{as_wait}: q ran only what it was enabled for"
        );
    }
}

/// The master's doorbell steps with the WQE at `patched` (its second SEND_EN at 2, its
/// second WAIT at 3) patched to ds 60 (a WQE of 15 BBs, whose body holds more steps'
/// images), on a softnic with the fast paths on or off: the master's first completion, and
/// how far q and the master got once it came.
fn steps_past_a_long_control(patched: usize, fast_paths: bool) -> ((u64, bool), u64, u64) {
    let (nic, _, q, m) = pair_configured(|c| c.fast_paths = fast_paths);
    let nops: Vec<WorkRequest> = (0..16).map(|i| wr(i, SIG, NOP)).collect();
    nic.post_send(q.qp.qpn, &nops).unwrap();
    let mut master = doorbell_master(&q, 9);
    master.extend((master.len()..18).map(|_| wr(0, WqeFlags::NONE, NOP)));
    master.push(wr(7, SIG, NOP));
    post_patched(&nic, &m.qp, &master, patched, |b| b[off::DS] = 60);
    let first = wait_cqes(&nic, m.cq, 1)[0];
    let consumed = |qp: &QpInfo| nic.sq_consumed(qp.qpn).unwrap();
    wait_until("the master stops", || {
        consumed(&m.qp) >= 19 || first.status.is_err()
    });
    (
        (first.wr_id, first.status.is_ok()),
        consumed(&q.qp),
        consumed(&m.qp),
    )
}

/// A WAIT, or a SEND_EN, of ds 60 inside a run of doorbell steps is one WQE of 15 BBs (what
/// its body holds is not run), as the general executor runs it, not a one-BB step of the
/// hand-over loop.
#[test]
fn a_wait_or_send_en_of_fifteen_bbs_in_a_run_of_steps_runs_as_the_general_executor_runs_it() {
    for patched in [3, 2] {
        let reference = steps_past_a_long_control(patched, false);
        // Worked out by hand: the master's NOP at 18 completes; q ran the two NOPs enabled
        // before the long WQE's body (the long SEND_EN itself enables the second); the
        // master consumed its 19 BBs.
        assert_eq!(reference, ((18, true), 2, 19), "ds 60 at {patched}");
        assert_eq!(
            steps_past_a_long_control(patched, true),
            reference,
            "ds 60 at {patched}"
        );
    }
}

/// A run of doorbell steps that starts one ring slot in (a NOP first, so that the master's
/// SEND_ENs sit in the slots its WAITs sit in otherwise) runs every step from the WQE it
/// fetched at each index: q runs exactly the four NOPs it is enabled for, and the master's
/// own NOP after the chain completes.
#[test]
fn a_run_of_steps_one_slot_into_the_ring_runs_each_steps_own_wqes() {
    let (nic, _, q, m) = pair_with(Prefetch::Depth(0));
    let nops: Vec<WorkRequest> = (0..6).map(|i| wr(i, SIG, NOP)).collect();
    nic.post_send(q.qp.qpn, &nops).unwrap();
    let mut master = vec![wr(0, WqeFlags::NONE, NOP)];
    master.extend(doorbell_master(&q, 4));
    master.push(wr(0, WqeFlags::NONE, wait(q.cq, 3)));
    master.push(wr(7, SIG, NOP));
    nic.post_send(m.qp.qpn, &master).unwrap();
    let done = wait_cqes(&nic, m.cq, 1);
    assert!(done[0].is_ok() && done[0].wr_id == 7, "{done:?}");
    let q_done = wait_cqes(&nic, q.cq, 4);
    let ids: Vec<u64> = q_done.iter().map(|c| c.wr_id).collect();
    assert_eq!(ids, [0, 1, 2, 3]);
    assert_eq!(
        nic.sq_consumed(q.qp.qpn).unwrap(),
        4,
        "q ran only what was enabled"
    );
    let mc = nic.counters(m.qp.qpn).unwrap();
    assert_eq!(
        [Opcode::Nop, Opcode::Wait, Opcode::SendEn].map(|o| mc.by_opcode(o)),
        [2, 4, 4]
    );
}
