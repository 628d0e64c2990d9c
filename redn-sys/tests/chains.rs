//! Ordering (RedN §3.1: WQ, completion and doorbell order), the prefetch hazard of
//! self-modifying chains, and a loop that re-arms itself with WAIT/ENABLE.

mod common;
use common::*;
use redn_program::wqe::{off, Opcode, Payload, WorkRequest, WqeFlags, WrOp, BB_SIZE};
use redn_sys::nic::{CqConfig, Nic, QpConfig};
use redn_sys::softnic::{Prefetch, SoftNic, SoftNicConfig};

const MODES: [Prefetch; 3] = [
    Prefetch::AtExecute,
    Prefetch::Depth(8),
    Prefetch::Adversarial,
];

fn write(local: redn_program::wqe::Sge, remote: redn_program::wqe::RemoteAddr) -> WrOp {
    WrOp::Write {
        remote,
        payload: Payload::Sgl(vec![local]),
        imm: None,
    }
}

#[test]
fn wq_order_later_wqes_see_earlier_effects() {
    for mode in MODES {
        let nic = nic(1, mode);
        let pd = nic.alloc_pd().unwrap();
        let m = Region::new(&nic, pd, 4096, ALL);
        let ep = endpoint(&nic, pd, |_| {});
        nic.connect(ep.qp.qpn, ep.qp.qpn).unwrap();
        m.write(0, b"A");
        m.write(1, b"B");
        // WRITE A to x, WRITE B to x, READ x to y: y must be B.
        nic.post_send(
            ep.qp.qpn,
            &[
                wr(1, WqeFlags::NONE, write(m.mr.sge(0, 1), m.mr.remote(100))),
                wr(2, WqeFlags::NONE, write(m.mr.sge(1, 1), m.mr.remote(100))),
                wr(
                    3,
                    SIG,
                    WrOp::Read {
                        remote: m.mr.remote(100),
                        sgl: vec![m.mr.sge(200, 1)],
                    },
                ),
            ],
        )
        .unwrap();
        let c = wait_cqes(&nic, ep.cq, 1);
        assert_eq!(c[0].wr_id, 3);
        assert_eq!(m.read(200, 1), b"B", "{mode:?}");
    }
}

#[test]
fn completion_order_wait_holds_a_queue_until_another_queue_completes() {
    let nic = nic(2, Prefetch::Adversarial);
    let pd = nic.alloc_pd().unwrap();
    let m = Region::new(&nic, pd, 4096, ALL);
    let producer = endpoint(&nic, pd, |c| c.pu = Some(0));
    let consumer = endpoint(&nic, pd, |c| c.pu = Some(1));
    for q in [producer.qp.qpn, consumer.qp.qpn] {
        nic.connect(q, q).unwrap();
    }
    m.write(0, b"data!");
    // Consumer: WAIT for the producer's first completion, then copy what it wrote.
    nic.post_send(
        consumer.qp.qpn,
        &[
            wr(
                1,
                WqeFlags::NONE,
                WrOp::Wait {
                    cq: producer.cq,
                    count: 0,
                },
            ),
            wr(
                2,
                SIG,
                WrOp::Read {
                    remote: m.mr.remote(100),
                    sgl: vec![m.mr.sge(200, 5)],
                },
            ),
        ],
    )
    .unwrap();
    wait_until("the consumer's WAIT stalls", || {
        nic.counters(consumer.qp.qpn).unwrap().wait_stalls == 1
    });
    expect_no_cqe(&nic, consumer.cq, 20);
    nic.post_send(
        producer.qp.qpn,
        &[wr(3, SIG, write(m.mr.sge(0, 5), m.mr.remote(100)))],
    )
    .unwrap();
    wait_cqes(&nic, consumer.cq, 1);
    assert_eq!(m.read(200, 5), b"data!");
}

/// A WAIT on another PU's CQ is released by every completion, whether the waiting PU is
/// spinning, yielding or parked when it comes (a lost wake-up would leave the WAIT stalled
/// and the test timed out). The producer's PU pushes the completions; the waiter registered
/// on the CQ once, at its first stall.
#[test]
fn a_wait_on_another_pus_cq_is_woken_by_every_completion() {
    let rounds: u64 = if cfg!(miri) { 6 } else { 200 };
    let nic = nic(2, Prefetch::Depth(8));
    let pd = nic.alloc_pd().unwrap();
    let producer = endpoint(&nic, pd, |c| c.pu = Some(0));
    let waiter = endpoint(&nic, pd, |c| {
        c.pu = Some(1);
        c.sq_bbs = 1024;
    });
    for q in [producer.qp.qpn, waiter.qp.qpn] {
        nic.connect(q, q).unwrap();
    }
    // The waiter's whole program up front: WAIT for the producer's k-th completion, then a
    // signaled NOP, `rounds` times.
    let program: Vec<WorkRequest> = (0..rounds)
        .flat_map(|k| {
            [
                wr(
                    0,
                    WqeFlags::NONE,
                    WrOp::Wait {
                        cq: producer.cq,
                        count: u32::try_from(k).unwrap(),
                    },
                ),
                wr(
                    k,
                    SIG,
                    WrOp::Nop {
                        raw_segments: vec![],
                    },
                ),
            ]
        })
        .collect();
    nic.post_send(waiter.qp.qpn, &program).unwrap();
    for k in 0..rounds {
        // Every third round, give the waiter's PU time to stop spinning and park (it parks
        // after 50 µs idle, 5 µs when the awake PUs outnumber the cores), so the completion
        // must wake it.
        if k % 3 == 2 {
            std::thread::sleep(std::time::Duration::from_micros(300));
        }
        assert_eq!(
            nic.counters(waiter.qp.qpn).unwrap().by_opcode(Opcode::Nop),
            k,
            "the waiter ran ahead of the producer"
        );
        nic.post_send(
            producer.qp.qpn,
            &[wr(
                k,
                SIG,
                WrOp::Nop {
                    raw_segments: vec![],
                },
            )],
        )
        .unwrap();
        wait_cqes(&nic, producer.cq, 1);
        let done = wait_cqes(&nic, waiter.cq, 1);
        assert_eq!(done[0].wr_id, k, "round {k}");
    }
    // The WAITs of the rounds with a pause certainly stalled (others may find their
    // completion already there).
    let stalls = nic.counters(waiter.qp.qpn).unwrap().wait_stalls;
    assert!(
        stalls >= rounds / 3,
        "{stalls} WAIT stalls in {rounds} rounds"
    );
}

/// A SEND_EN from one PU of a queue on another runs the enabled WQE whether the target PU
/// is busy-spinning, yielding, making its last scan before it parks, or parked (the target
/// is told only by reading its park flag: a lost hand-off would leave the enabled NOP
/// unrun and the test timed out). Pauses of several lengths put the target in each phase.
#[test]
fn a_send_enable_from_another_pu_runs_whatever_the_target_pu_is_doing() {
    let rounds: u64 = if cfg!(miri) { 6 } else { 120 };
    let nic = nic(2, Prefetch::Depth(8));
    let pd = nic.alloc_pd().unwrap();
    let target = endpoint(&nic, pd, |c| {
        c.pu = Some(1);
        c.managed_send = true;
        c.sq_bbs = 256;
    });
    let master = endpoint(&nic, pd, |c| c.pu = Some(0));
    for q in [target.qp.qpn, master.qp.qpn] {
        nic.connect(q, q).unwrap();
    }
    let pauses = [0u64, 2, 8, 30, 60, 300];
    for k in 0..rounds {
        nic.post_send(
            target.qp.qpn,
            &[wr(
                k,
                SIG,
                WrOp::Nop {
                    raw_segments: vec![],
                },
            )],
        )
        .unwrap();
        // Not run until enabled.
        assert_eq!(
            nic.counters(target.qp.qpn).unwrap().by_opcode(Opcode::Nop),
            k,
            "round {k}: the managed queue ran before its SEND_EN"
        );
        let pause = pauses[usize::try_from(k).unwrap() % pauses.len()];
        if pause > 0 {
            std::thread::sleep(std::time::Duration::from_micros(pause));
        }
        nic.post_send(
            master.qp.qpn,
            &[wr(
                k,
                WqeFlags::NONE,
                WrOp::SendEnable {
                    qp: target.qp.qpn,
                    pi: u32::try_from(k + 1).unwrap(),
                },
            )],
        )
        .unwrap();
        let done = wait_cqes(&nic, target.cq, 1);
        assert_eq!(done[0].wr_id, k, "round {k}");
    }
}

/// Two WQEs: the first patches the second's local address (bytes 40..48, its data segment)
/// from `old` to `new`. Returns what the second one wrote.
fn self_modifying_chain(mode: Prefetch, doorbell_ordered: bool) -> Vec<u8> {
    let nic = nic(1, mode);
    let pd = nic.alloc_pd().unwrap();
    let m = Region::new(&nic, pd, 4096, ALL);
    m.write(0, b"OLD");
    m.write(8, b"NEW");
    m.write(16, &(m.mr.addr.0 + 8).to_be_bytes()); // the patch: BE address of "NEW"

    let cq = nic.create_cq(CqConfig::default()).unwrap();
    let mut cfg = QpConfig::new(pd, cq);
    cfg.managed_send = doorbell_ordered;
    let target = nic.create_qp(cfg).unwrap();
    let ring = nic
        .reg_mr(pd, &target.sq.buffer, target.sq.offset, 64 * 256, ALL)
        .unwrap();
    nic.connect(target.qpn, target.qpn).unwrap();
    let second = wr(2, SIG, write(m.mr.sge(0, 3), m.mr.remote(100)));
    // Where the second WQE will sit in the ring: slot 1 when the patch shares the queue,
    // slot 0 of the managed queue otherwise.
    if !doorbell_ordered {
        let patch = wr(
            1,
            WqeFlags::NONE,
            write(m.mr.sge(16, 8), ring.remote(BB_SIZE as u64 + 40)),
        );
        nic.post_send(target.qpn, &[patch, second]).unwrap();
    } else {
        // Doorbell order: the second WQE sits on the managed queue; a master queue patches it,
        // waits for the patch's completion, then enables it.
        nic.post_send(target.qpn, &[second]).unwrap();
        let master = endpoint(&nic, pd, |_| {});
        nic.connect(master.qp.qpn, master.qp.qpn).unwrap();
        nic.post_send(
            master.qp.qpn,
            &[
                wr(1, SIG, write(m.mr.sge(16, 8), ring.remote(40))),
                wr(
                    3,
                    WqeFlags::NONE,
                    WrOp::Wait {
                        cq: master.cq,
                        count: 0,
                    },
                ),
                wr(
                    4,
                    WqeFlags::NONE,
                    WrOp::SendEnable {
                        qp: target.qpn,
                        pi: 1,
                    },
                ),
            ],
        )
        .unwrap();
    }
    let c = wait_cqes(&nic, cq, 1);
    assert!(c[0].is_ok(), "{c:?}");
    m.read(100, 3)
}

#[test]
fn self_modifying_chain_without_doorbell_ordering_runs_a_stale_wqe() {
    // The second WQE was prefetched before the first patched it: it writes OLD, as ConnectX
    // would, even though memory holds the patched WQE.
    assert_eq!(self_modifying_chain(Prefetch::Adversarial, false), b"OLD");
    assert_eq!(self_modifying_chain(Prefetch::Depth(8), false), b"OLD");
    // Only when the NIC happens not to prefetch does the unordered chain look right.
    assert_eq!(self_modifying_chain(Prefetch::AtExecute, false), b"NEW");
}

#[test]
fn self_modifying_chain_with_doorbell_ordering_is_correct_in_every_prefetch_mode() {
    for mode in MODES {
        assert_eq!(self_modifying_chain(mode, true), b"NEW", "{mode:?}");
    }
}

/// Offset in a WQE at which an 8-byte big-endian FETCH_ADD result must land so that its low
/// four bytes fill the 32-bit count of a WAIT/SEND_EN segment (bytes 20..24 are reserved).
const COUNT_RESULT: u64 = off::WAIT_PI as u64 - 4;

#[test]
fn loop_re_arms_itself_with_wait_and_enable_and_runs_without_host_posts() {
    // Two managed queues, A and B, of 4 BBs each, hand control to each other forever. Each
    // round, A counts one iteration (a signaled FETCH_ADD), then advances B's WAIT count and
    // B's enable of A; B waits for A's completion and advances A's enable of B. Every index
    // field is patched by the *other* queue while its own round is not yet enabled (doorbell
    // order), so the loop is correct under every prefetch mode. The patches are FETCH_ADDs on
    // host-order counters whose old value lands big-endian in the WQE field: the queues ask
    // for MLNX_OFED's big-endian atomic replies (`QpConfig::atomic_be_reply`); the catalog's
    // loops, which must run on upstream Linux, use byte-reversing READs instead.
    for mode in MODES {
        let nic = nic(2, mode);
        let pd = nic.alloc_pd().unwrap();
        let data = Region::new(&nic, pd, 4096, ALL);
        let cq_a = nic.create_cq(CqConfig::counted(64)).unwrap();
        let cq_b = nic.create_cq(CqConfig::default()).unwrap();
        let mk = |cq, pu| {
            let mut c = QpConfig::new(pd, cq);
            c.sq_bbs = 4;
            c.managed_send = true;
            c.pu = Some(pu);
            c.atomic_be_reply = true;
            nic.create_qp(c).unwrap()
        };
        let a = mk(cq_a, 0);
        let b = mk(cq_b, 1);
        let ring_a = nic.reg_mr(pd, &a.sq.buffer, a.sq.offset, 256, ALL).unwrap();
        let ring_b = nic.reg_mr(pd, &b.sq.buffer, b.sq.offset, 256, ALL).unwrap();
        for q in [a.qpn, b.qpn] {
            nic.connect(q, q).unwrap();
        }
        // Counters (host order): iterations @0, next B-enables-A @8, next WAIT count @16,
        // next A-enables-B @24.
        data.write(8, &8u64.to_le_bytes());
        data.write(16, &0u64.to_le_bytes());
        data.write(24, &8u64.to_le_bytes());
        let faa = |at: u64, add: u64, result: redn_program::wqe::Sge, flags| {
            wr(
                0,
                flags,
                WrOp::FetchAdd {
                    remote: data.mr.remote(at),
                    add,
                    result: Some(result),
                },
            )
        };
        let scratch = data.mr.sge(512, 8);
        let slot = |ring: &redn_sys::nic::MrInfo, i: u64| ring.sge(i * 64 + COUNT_RESULT, 8);
        let a_wqes: Vec<WorkRequest> = vec![
            faa(0, 1, scratch, SIG),                      // A0: the loop body
            faa(8, 4, slot(&ring_b, 3), WqeFlags::NONE),  // A1: B3's enable of A
            faa(16, 1, slot(&ring_b, 0), WqeFlags::NONE), // A2: B0's WAIT count
            // Fenced: A1's and A2's replies may land late (adversarial), and B must not be
            // enabled before its counts have.
            wr(0, WqeFlags::FENCE, WrOp::SendEnable { qp: b.qpn, pi: 4 }), // A3
        ];
        let b_wqes: Vec<WorkRequest> = vec![
            wr(0, WqeFlags::NONE, WrOp::Wait { cq: cq_a, count: 0 }), // B0
            faa(24, 4, slot(&ring_a, 3), WqeFlags::NONE),             // B1: A3's enable of B
            wr(
                0,
                WqeFlags::NONE,
                WrOp::Nop {
                    raw_segments: vec![],
                },
            ), // B2
            wr(0, WqeFlags::FENCE, WrOp::SendEnable { qp: a.qpn, pi: 8 }), // B3 (fenced: B1)
        ];
        nic.post_send(a.qpn, &a_wqes).unwrap();
        nic.post_send(b.qpn, &b_wqes).unwrap();
        // The one host action: a master enables A's first round.
        let master = endpoint(&nic, pd, |_| {});
        nic.connect(master.qp.qpn, master.qp.qpn).unwrap();
        nic.post_send(
            master.qp.qpn,
            &[wr(9, SIG, WrOp::SendEnable { qp: a.qpn, pi: 4 })],
        )
        .unwrap();
        wait_cqes(&nic, master.cq, 1);

        let iterations = |d: &Region| u64::from_le_bytes(d.read(0, 8).try_into().unwrap());
        // Fewer rounds under Miri (a round takes it tens of milliseconds); either way far
        // past the 4-BB rings' capacity. (Each round hands over between the two PUs: beside
        // two CPU hogs, 1000 rounds took 6 s of the 10 s this wait allows.)
        let rounds = if cfg!(miri) { 16 } else { 200 };
        let deadline = std::time::Instant::now() + patience(10);
        while iterations(&data) < rounds {
            assert!(
                std::time::Instant::now() < deadline,
                "{mode:?}: stuck at {}",
                iterations(&data)
            );
            std::thread::yield_now();
        }
        // It keeps going with nobody posting: far past any ring's capacity (4 BBs).
        let before = iterations(&data);
        wait_until("the loop goes on", || {
            iterations(&data) > before + rounds / 10
        });
        // The counters are read while the loop runs, so through the consumer index: the
        // iteration count above is a plain memory word that orders nothing, but a WQE seen
        // consumed is seen counted.
        wait_until("A's consumer index passes the rounds", || {
            nic.sq_consumed(a.qpn).unwrap() > 4 * rounds
        });
        let ca = nic.counters(a.qpn).unwrap();
        assert!(ca.by_opcode(Opcode::SendEn) >= rounds);
        assert_eq!(ca.errors, 0);
        assert_eq!(nic.counters(b.qpn).unwrap().errors, 0);
        drop(nic);
    }
}

#[test]
fn dropping_a_running_softnic_stops_its_threads() {
    let nic: SoftNic = nic(2, Prefetch::Depth(8));
    let pd = nic.alloc_pd().unwrap();
    let ep = endpoint(&nic, pd, |_| {});
    nic.connect(ep.qp.qpn, ep.qp.qpn).unwrap();
    nic.post_send(
        ep.qp.qpn,
        &[wr(
            1,
            SIG,
            WrOp::Nop {
                raw_segments: vec![],
            },
        )],
    )
    .unwrap();
    drop(nic); // joins the PUs; hanging here would fail the test by timeout
}

#[test]
fn multi_block_wqes_wrap_around_the_ring_end() {
    // A 4-BB ring: three NOPs, then a 2-BB READ (3 scatter entries) in slots 3 and 0, then an
    // inline WRITE of 40 bytes (2 BBs) in slots 1 and 2; repeated so indices pass 2^4 twice.
    for mode in MODES {
        let nic = nic(1, mode);
        let pd = nic.alloc_pd().unwrap();
        let m = Region::new(&nic, pd, 4096, ALL);
        let ep = endpoint(&nic, pd, |c| c.sq_bbs = 4);
        nic.connect(ep.qp.qpn, ep.qp.qpn).unwrap();
        m.write(0, b"abcdefghijklmnopqrst");
        for round in 0..3u64 {
            let nops: Vec<_> = (0..3)
                .map(|i| {
                    wr(
                        i,
                        WqeFlags::NONE,
                        WrOp::Nop {
                            raw_segments: vec![],
                        },
                    )
                })
                .collect();
            nic.post_send(ep.qp.qpn, &nops).unwrap();
            wait_until("the NOPs are consumed", || {
                nic.sq_consumed(ep.qp.qpn).unwrap() >= 3 + 7 * round
            });
            let read = WrOp::Read {
                remote: m.mr.remote(0),
                sgl: vec![m.mr.sge(100, 5), m.mr.sge(200, 5), m.mr.sge(300, 10)],
            };
            nic.post_send(ep.qp.qpn, &[wr(10 + round, SIG, read)])
                .unwrap();
            let c = wait_cqes(&nic, ep.cq, 1);
            assert_eq!((c[0].wr_id, c[0].status), (10 + round, Ok(())), "{mode:?}");
            assert_eq!(m.read(100, 5), b"abcde");
            assert_eq!(m.read(200, 5), b"fghij");
            assert_eq!(m.read(300, 10), b"klmnopqrst");
            let text = format!("inline payload of forty bytes, round {round:02}.");
            let write = WrOp::Write {
                remote: m.mr.remote(1000),
                payload: Payload::Inline(text.as_bytes().to_vec()),
                imm: None,
            };
            nic.post_send(ep.qp.qpn, &[wr(20 + round, SIG, write)])
                .unwrap();
            let c = wait_cqes(&nic, ep.cq, 1);
            assert_eq!(c[0].wr_id, 20 + round);
            assert_eq!(m.read(1000, text.len()), text.as_bytes(), "{mode:?}");
            for a in [100, 200, 300, 1000] {
                m.write(a, &[0u8; 40]);
            }
        }
    }
}

/// A queue found blocked on a WAIT more than once parks on it: later visits only check the
/// CQ's count. It must still resume when the count is reached, flush when the host moves it
/// to error, and fault when the CQ it waits on is destroyed (as an unparked queue would).
#[test]
fn a_queue_parked_on_a_wait_resumes_flushes_and_faults() {
    let nic = nic(1, Prefetch::Depth(8));
    let pd = nic.alloc_pd().unwrap();
    for case in ["resume", "error", "destroyed CQ"] {
        let producer = endpoint(&nic, pd, |_| {});
        nic.connect(producer.qp.qpn, producer.qp.qpn).unwrap();
        let lonely = nic.create_cq(CqConfig::default()).unwrap();
        let waited = if case == "destroyed CQ" {
            lonely
        } else {
            producer.cq
        };
        let waiter = endpoint(&nic, pd, |_| {});
        nic.connect(waiter.qp.qpn, waiter.qp.qpn).unwrap();
        let nop = WrOp::Nop {
            raw_segments: vec![],
        };
        nic.post_send(
            waiter.qp.qpn,
            &[
                wr(
                    6,
                    WqeFlags::NONE,
                    WrOp::Wait {
                        cq: waited,
                        count: 0,
                    },
                ),
                wr(7, SIG, nop.clone()),
            ],
        )
        .unwrap();
        wait_until("the WAIT stalls", || {
            nic.counters(waiter.qp.qpn).unwrap().wait_stalls == 1
        });
        // Make sure the PU visits the queue again, blocked: that parks it. (A doorbell at the
        // same index changes nothing but wakes the PU.)
        for _ in 0..3 {
            nic.ring_doorbell(waiter.qp.qpn, 2).unwrap();
            std::thread::sleep(std::time::Duration::from_millis(2));
        }
        expect_no_cqe(&nic, waiter.cq, 1);
        match case {
            "resume" => {
                nic.post_send(producer.qp.qpn, &[wr(1, SIG, nop.clone())])
                    .unwrap();
                let done = wait_cqes(&nic, waiter.cq, 1);
                assert!(done[0].is_ok() && done[0].wr_id == 7, "{case}: {done:?}");
            }
            "error" => {
                nic.set_qp_error(waiter.qp.qpn).unwrap();
                let done = wait_cqes(&nic, waiter.cq, 2);
                assert!(done.iter().all(|c| !c.is_ok()), "{case}: {done:?}");
                assert_eq!(
                    done.iter().map(|c| c.wr_id).collect::<Vec<_>>(),
                    vec![6, 7],
                    "{case}"
                );
            }
            _ => {
                nic.destroy_cq(lonely).unwrap();
                let done = wait_cqes(&nic, waiter.cq, 2);
                assert_eq!(done[0].wr_id, 6, "{case}: {done:?}");
                assert!(!done[0].is_ok(), "{case}: the WAIT fails: {done:?}");
            }
        }
        assert_eq!(
            nic.counters(waiter.qp.qpn).unwrap().wait_stalls,
            1,
            "{case}: one stall however often the queue was visited"
        );
    }
}

/// In doorbell order on one PU, a SEND_EN hands the PU over to the queue it enables at once,
/// so the master's next WAIT finds that queue's completion already there: a 100-step chain
/// runs with no WAIT stall (without the hand-over every step's WAIT blocks once), with WQE
/// checks off (RedN's setting) and on.
#[test]
fn a_doorbell_chain_on_one_pu_hands_over_at_each_enable() {
    for wqe_checks in [false, true] {
        let mut cfg = SoftNicConfig::new("test");
        cfg.wqe_checks = wqe_checks;
        let nic = SoftNic::new(cfg).unwrap();
        // Fewer under Miri, which runs a step in milliseconds.
        let steps: u32 = if cfg!(miri) { 12 } else { 100 };
        let pd = nic.alloc_pd().unwrap();
        let (q, m) = doorbell_pair(&nic, pd, 256);
        let nop = WrOp::Nop {
            raw_segments: vec![],
        };
        let nops: Vec<_> = (0..steps)
            .map(|i| wr(u64::from(i), SIG, nop.clone()))
            .collect();
        run_doorbell_chain(&nic, &q, &m, &nops, &format!("checks {wqe_checks}"));
        let stalls = nic.counters(m.qp.qpn).unwrap().wait_stalls;
        assert_eq!(
            stalls, 0,
            "checks {wqe_checks}: the master's WAITs stalled {stalls} times"
        );
    }
}

/// Post `ops` (signaled, wr_ids 0, 1, ...) on managed queue `q` and a doorbell-ordered
/// master for them on `m`, and assert that each completes, without error, in order
/// (`what` names the case in failures).
fn run_doorbell_chain(nic: &SoftNic, q: &Endpoint, m: &Endpoint, ops: &[WorkRequest], what: &str) {
    let steps = u32::try_from(ops.len()).unwrap();
    nic.post_send(q.qp.qpn, ops).unwrap();
    nic.post_send(m.qp.qpn, &doorbell_master(q, steps)).unwrap();
    let done = wait_cqes(nic, q.cq, ops.len());
    assert!(done.iter().all(|c| c.is_ok()), "{what}: {done:?}");
    assert_eq!(
        done.iter().map(|c| c.wr_id).collect::<Vec<_>>(),
        (0..u64::from(steps)).collect::<Vec<_>>(),
        "{what}"
    );
}

/// A WAIT right after a hand-over compares the count the handed-over queue left behind, and
/// passes only if that count is reached: here the enabled queue runs an unsignaled NOP, so
/// the master's WAIT for its first completion blocks (one stall, nothing after it runs) until
/// a third queue enables the signaled NOP behind it.
#[test]
fn a_wait_after_a_hand_over_blocks_until_its_count_is_reached() {
    let nic = nic(1, Prefetch::Depth(8));
    let pd = nic.alloc_pd().unwrap();
    let q = endpoint(&nic, pd, |c| c.managed_send = true);
    nic.connect(q.qp.qpn, q.qp.qpn).unwrap();
    let m = endpoint(&nic, pd, |_| {});
    nic.connect(m.qp.qpn, m.qp.qpn).unwrap();
    let x = endpoint(&nic, pd, |_| {});
    nic.connect(x.qp.qpn, x.qp.qpn).unwrap();
    let nop = || WrOp::Nop {
        raw_segments: vec![],
    };
    nic.post_send(q.qp.qpn, &[wr(0, WqeFlags::NONE, nop()), wr(1, SIG, nop())])
        .unwrap();
    let enable = |pi| wr(0, WqeFlags::NONE, WrOp::SendEnable { qp: q.qp.qpn, pi });
    nic.post_send(
        m.qp.qpn,
        &[
            enable(1),
            // Needs one completion on q's CQ; the hand-over before it runs the unsignaled NOP.
            wr(0, WqeFlags::NONE, WrOp::Wait { cq: q.cq, count: 0 }),
            wr(7, SIG, nop()),
        ],
    )
    .unwrap();
    wait_until("the master stalls on its WAIT", || {
        nic.counters(m.qp.qpn).unwrap().wait_stalls == 1
    });
    expect_no_cqe(&nic, m.cq, 20);
    assert_eq!(
        nic.counters(q.qp.qpn).unwrap().wqes[Opcode::Nop as usize],
        1
    );
    nic.post_send(x.qp.qpn, &[enable(2)]).unwrap();
    let done = wait_cqes(&nic, m.cq, 1);
    assert_eq!((done[0].wr_id, done[0].status), (7, Ok(())));
    assert_eq!(wait_cqes(&nic, q.cq, 1)[0].wr_id, 1);
    assert_eq!(nic.counters(m.qp.qpn).unwrap().wait_stalls, 1);
}

/// A doorbell chain whose enabled queue holds WRITEs and fetch-adds (not only the NOPs and
/// control WQEs of the hand-over's lean pass): each step's hand-over still runs them at once
/// (no WAIT stall), with the same effects and completions as anywhere else, in every prefetch
/// mode.
#[test]
fn a_handed_over_queue_runs_moves_and_atomics_at_once() {
    for mode in MODES {
        handed_over_moves_and_atomics(mode);
    }
}

fn handed_over_moves_and_atomics(mode: Prefetch) {
    // Fewer under Miri, whose speed the completion wait's 5 s would not allow for 40.
    let steps: u32 = if cfg!(miri) { 10 } else { 40 };
    let nic = nic(1, mode);
    let pd = nic.alloc_pd().unwrap();
    let (q, m) = doorbell_pair(&nic, pd, 128);
    let src = Region::new(&nic, pd, 64 * steps as usize, ALL);
    let dst = Region::new(&nic, pd, 64 * steps as usize + 8, ALL);
    for i in 0..steps as usize {
        src.write(64 * i, &[u8::try_from(i + 1).unwrap(); 64]);
    }
    let sum_at = 64 * steps as usize;
    let ops: Vec<_> = (0..steps as usize)
        .map(|i| {
            let op = if i % 2 == 0 {
                write(src.mr.sge(64 * i as u64, 64), dst.mr.remote(64 * i as u64))
            } else {
                WrOp::FetchAdd {
                    remote: dst.mr.remote(sum_at as u64),
                    add: i as u64,
                    result: None,
                }
            };
            wr(i as u64, SIG, op)
        })
        .collect();
    run_doorbell_chain(&nic, &q, &m, &ops, &format!("{mode:?}"));
    for i in (0..steps as usize).step_by(2) {
        assert_eq!(
            dst.read(64 * i, 64),
            vec![u8::try_from(i + 1).unwrap(); 64],
            "{mode:?}: WRITE {i}"
        );
    }
    let sum: u64 = (1..steps as u64).step_by(2).sum();
    assert_eq!(dst.read(sum_at, 8), sum.to_le_bytes());
    let c = nic.counters(q.qp.qpn).unwrap();
    assert_eq!(c.by_opcode(Opcode::RdmaWrite), u64::from(steps / 2));
    assert_eq!(c.by_opcode(Opcode::AtomicFa), u64::from(steps / 2));
    let stalls = nic.counters(m.qp.qpn).unwrap().wait_stalls;
    assert_eq!(
        stalls, 0,
        "{mode:?}: the master's WAITs stalled {stalls} times"
    );
}

/// A doorbell chain that leaves the pattern its steps repeat (WAIT, SEND_EN of the same
/// queue, WAIT on its CQ) at every turn: signaled WAITs and SEND_ENs, two SEND_ENs in a
/// row, a SEND_EN that does not move the index, a NOP of the master's between steps, and an
/// enabled queue of signaled and unsignaled NOPs and a WRITE. Every WQE runs once, in order,
/// with its completion, counts and effect, the WAITs never stall, in every prefetch mode.
#[test]
fn a_doorbell_chain_that_breaks_its_pattern_runs_every_wqe_in_order() {
    for mode in MODES {
        let nic = nic(1, mode);
        let pd = nic.alloc_pd().unwrap();
        let (q, m) = doorbell_pair(&nic, pd, 64);
        let src = Region::new(&nic, pd, 64, ALL);
        let dst = Region::new(&nic, pd, 64, ALL);
        src.write(0, &[0x5a; 64]);
        let nop = || WrOp::Nop {
            raw_segments: vec![],
        };
        let none = WqeFlags::NONE;
        nic.post_send(
            q.qp.qpn,
            &[
                wr(0, SIG, nop()),
                wr(1, none, nop()),
                wr(2, SIG, write(src.mr.sge(0, 64), dst.mr.remote(0))),
                wr(3, SIG, nop()),
            ],
        )
        .unwrap();
        let enable = |id, flags, pi| wr(id, flags, WrOp::SendEnable { qp: q.qp.qpn, pi });
        let wait = |id, flags, count| wr(id, flags, WrOp::Wait { cq: q.cq, count });
        nic.post_send(
            m.qp.qpn,
            &[
                enable(0, none, 1),
                wait(10, SIG, 0),
                enable(11, SIG, 2),
                // Another SEND_EN where the steps expect a WAIT.
                enable(0, none, 3),
                // Its hand-over runs the unsignaled NOP and the WRITE.
                wait(0, none, 1),
                wr(12, SIG, nop()),
                // Does not move the index (it is at 3 already).
                enable(0, none, 3),
                enable(0, none, 4),
                wait(0, none, 2),
                wr(13, SIG, nop()),
            ],
        )
        .unwrap();
        let ids = |cqes: Vec<redn_sys::nic::Completion>| {
            assert!(cqes.iter().all(|c| c.is_ok()), "{mode:?}: {cqes:?}");
            cqes.iter().map(|c| c.wr_id).collect::<Vec<_>>()
        };
        assert_eq!(ids(wait_cqes(&nic, m.cq, 4)), [10, 11, 12, 13], "{mode:?}");
        assert_eq!(ids(wait_cqes(&nic, q.cq, 3)), [0, 2, 3], "{mode:?}");
        assert_eq!(dst.read(0, 64), vec![0x5a; 64], "{mode:?}");
        let (mc, qc) = (
            nic.counters(m.qp.qpn).unwrap(),
            nic.counters(q.qp.qpn).unwrap(),
        );
        assert_eq!(
            [Opcode::Wait, Opcode::SendEn, Opcode::Nop].map(|o| mc.by_opcode(o)),
            [3, 5, 2],
            "{mode:?}: the master's WQEs"
        );
        assert_eq!(
            [Opcode::Nop, Opcode::RdmaWrite].map(|o| qc.by_opcode(o)),
            [3, 1],
            "{mode:?}: the enabled queue's WQEs"
        );
        assert_eq!(mc.wait_stalls, 0, "{mode:?}: a WAIT stalled");
    }
}

/// SEND_EN targets advanced per rearm pair: each pair enables this many more runs of the
/// clock queue's one NOP (DPDK's `MLX5_TXPP_REARM`, 2^16 / 4).
const REARM: u64 = 1 << 14;

#[test]
#[cfg_attr(
    debug_assertions,
    ignore = "2^24 completions take about a second optimised, minutes in a debug build: \
              scripts/test runs it (release)"
)]
fn a_rearm_ring_runs_past_2_16_enables_and_2_24_completions_with_its_counts_unchanged() {
    // DPDK's packet-pacing rearm queue (mlx5_txpp.c): an unmanaged ring of SEND_EN / WAIT
    // pairs, written once, whose counts wrap (SEND_EN at 16 bits, WAIT at 24): pair p
    // enables a managed one-slot "clock" queue up to (p + 1) * 2^14 and waits for that many
    // completions of its one signaled NOP. 1024 pairs advance both by 2^24, which is 0 modulo
    // either width, so the ring re-runs unchanged; doorbelled one lap and four pairs on, the
    // clock queue runs 2^24 + 2^16 NOPs and every count has wrapped. Compared 32 bits wide,
    // the fourth pair's SEND_EN (target 0) would already be behind and the ring would stall.
    if cfg!(miri) {
        return; // 2^24 completions take too long interpreted.
    }
    const PAIRS: u64 = (1 << 24) / REARM;
    for clock_pu in [0, 1] {
        let nic = nic(2, Prefetch::Depth(8));
        let pd = nic.alloc_pd().unwrap();
        let clock_cq = nic.create_cq(CqConfig::counted(64)).unwrap();
        let mut c = QpConfig::new(pd, clock_cq);
        c.sq_bbs = 1;
        c.managed_send = true;
        c.pu = Some(clock_pu);
        let clock = nic.create_qp(c).unwrap().qpn;
        nic.connect(clock, clock).unwrap();
        let nop = WrOp::Nop {
            raw_segments: vec![],
        };
        nic.post_send(clock, &[wr(0, SIG, nop)]).unwrap();
        let rearm_cq = nic.create_cq(CqConfig::counted(64)).unwrap();
        let mut c = QpConfig::new(pd, rearm_cq);
        c.sq_bbs = u32::try_from(2 * PAIRS).unwrap();
        c.pu = Some(0);
        let rearm = nic.create_qp(c).unwrap().qpn;
        nic.connect(rearm, rearm).unwrap();
        let mut ring = Vec::new();
        for p in 0..PAIRS {
            let enabled = (p + 1) * REARM;
            let en = WrOp::SendEnable {
                qp: clock,
                pi: u32::try_from(enabled % (1 << 16)).unwrap(),
            };
            let wait = WrOp::Wait {
                cq: clock_cq,
                count: u32::try_from((enabled - 1) % (1 << 24)).unwrap(),
            };
            ring.push(wr(0, WqeFlags::NONE, en));
            ring.push(wr(0, WqeFlags::NONE, wait));
        }
        nic.post_send(rearm, &ring).unwrap();
        // One lap and four pairs: the ring's first pairs run again, unchanged.
        let end = 2 * PAIRS + 8;
        nic.ring_doorbell(rearm, end).unwrap();
        let deadline = std::time::Instant::now() + patience(40);
        while nic.sq_consumed(rearm).unwrap() < end {
            assert!(
                std::time::Instant::now() < deadline,
                "clock on PU {clock_pu}: stalled at WQE {} of {end}, {} completions",
                nic.sq_consumed(rearm).unwrap(),
                nic.cq_produced(clock_cq).unwrap()
            );
            std::thread::sleep(std::time::Duration::from_millis(1));
        }
        assert_eq!(
            nic.cq_produced(clock_cq).unwrap(),
            (PAIRS + 4) * REARM,
            "clock on PU {clock_pu}"
        );
        assert_eq!(nic.counters(rearm).unwrap().errors, 0);
        assert_eq!(nic.counters(clock).unwrap().errors, 0);
    }
}
