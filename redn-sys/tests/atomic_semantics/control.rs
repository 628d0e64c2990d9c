//! WAIT, SEND_EN and RECV_EN: counts compared modulo their index widths, exactly the enabled
//! WQEs and receives run, and the errors of a wrong CQ or an unmanaged queue.

use super::*;

/// A master queue whose WAITs watch a counted queue's CQ, and a queue managed for sends
/// and receives, on one path. Master and counted run on PU 0, managed on PU 1.
struct Control {
    nic: SoftNic,
    master: Endpoint,
    counted: Endpoint,
    managed: Endpoint,
    mem: Region,
}

fn control(path: Path) -> Control {
    let nic = softnic(path, 2);
    let pd = nic.alloc_pd().unwrap();
    let mem = Region::new(&nic, pd, 4096, ALL);
    let master = endpoint(&nic, pd, |c| c.pu = Some(0));
    let counted = endpoint(&nic, pd, |c| c.pu = Some(0));
    let managed = endpoint(&nic, pd, |c| {
        c.managed_send = true;
        c.managed_recv = true;
        c.pu = Some(1);
    });
    for q in [&master, &counted, &managed] {
        nic.connect(q.qp.qpn, q.qp.qpn).unwrap();
    }
    Control {
        nic,
        master,
        counted,
        managed,
        mem,
    }
}

impl Control {
    /// Give the counted queue's CQ one more completion.
    fn complete(&self) {
        self.nic.post_send(self.counted.qp.qpn, &nops(1)).unwrap();
        wait_cqes(&self.nic, self.counted.cq, 1);
    }

    /// WQEs the master and the managed queue ran so far.
    fn ran(&self) -> (u64, u64) {
        let count = |q: &Endpoint| self.nic.counters(q.qp.qpn).unwrap().total_wqes();
        (count(&self.master), count(&self.managed))
    }

    /// Wait until nothing more runs on the NIC.
    fn settle(&self) {
        settle(&self.nic, || {
            let (m, q) = self.ran();
            m + q
        });
    }

    /// Post `op` signaled on the master and return its completion.
    fn master_runs(&self, wr_id: u64, op: WrOp) -> Completion {
        self.nic
            .post_send(self.master.qp.qpn, &[wr(wr_id, SIG, op)])
            .unwrap();
        wait_cqes(&self.nic, self.master.cq, 1).remove(0)
    }
}

#[test]
fn a_wait_passes_once_its_cq_has_produced_more_than_its_count_modulo_2_pow_24() {
    for path in PATHS {
        let c = control(path);
        let cq = c.counted.cq;
        c.complete();
        c.complete();
        // Two completions (indices 0 and 1): a WAIT for index 1 passes, for index 1 read
        // modulo 2^24 too, and for index 2 does not, until the third.
        for count in [1, (1 << 24) | 1, 0xff00_0001] {
            let done = c.master_runs(count.into(), WrOp::Wait { cq, count });
            assert!(
                done.is_ok(),
                "{path:?}: WAIT({count:#x}) at 2 completions: {done:?}"
            );
        }
        let counters = || c.nic.counters(c.master.qp.qpn).unwrap();
        assert_eq!(
            counters().wait_stalls,
            0,
            "{path:?}: no WAIT so far was short"
        );
        // Index 2, then index 3 (read modulo 2^24): each blocks until one more completion.
        for (wr_id, count) in [(20, 2), (21, (1 << 24) | 3)] {
            let (stalls, waits) = (counters().wait_stalls, counters().by_opcode(Opcode::Wait));
            c.nic
                .post_send(c.master.qp.qpn, &[wr(wr_id, SIG, WrOp::Wait { cq, count })])
                .unwrap();
            wait_until("the WAIT stalls", || counters().wait_stalls > stalls);
            c.settle();
            let what = format!("{path:?}: WAIT({count:#x})");
            expect_no_cqe(&c.nic, c.master.cq, 1);
            assert_eq!(
                counters().by_opcode(Opcode::Wait),
                waits,
                "{what} has not run"
            );
            c.complete();
            let done = wait_cqes(&c.nic, c.master.cq, 1).remove(0);
            assert_eq!((done.wr_id, done.status), (wr_id, Ok(())), "{what}");
        }
        assert_eq!(
            counters().wait_stalls,
            2,
            "{path:?}: each blocked WAIT counted once"
        );
    }
}

#[test]
fn a_wait_on_an_unknown_cq_is_a_local_qp_operation_error() {
    for path in PATHS {
        let c = control(path);
        let done = c.master_runs(
            1,
            WrOp::Wait {
                cq: Cqn(0x00ab_cdef),
                count: 0,
            },
        );
        assert_eq!(done.status, Err(Syndrome::LocalQpOperation), "{path:?}");
    }
}

#[test]
fn send_en_runs_exactly_the_enabled_wqes_and_never_moves_back() {
    for path in PATHS {
        let c = control(path);
        c.mem.write(0, b"abc");
        let writes: Vec<WorkRequest> = (0..3u8)
            .map(|i| {
                let op = WrOp::Write {
                    remote: c.mem.mr.remote(100 + u64::from(i)),
                    payload: redn_program::wqe::Payload::Sgl(vec![c.mem.mr.sge(u64::from(i), 1)]),
                    imm: None,
                };
                wr(u64::from(i), SIG, op)
            })
            .collect();
        c.nic.post_send(c.managed.qp.qpn, &writes).unwrap();
        let q = c.managed.qp.qpn;
        c.settle();
        assert_eq!(
            c.ran().1,
            0,
            "{path:?}: posting runs nothing on a managed queue"
        );
        let en = |pi| WrOp::SendEnable { qp: q, pi };
        assert!(c.master_runs(1, en(2)).is_ok(), "{path:?}");
        let done = wait_cqes(&c.nic, c.managed.cq, 2);
        assert_eq!(
            done.iter().map(|d| d.wr_id).collect::<Vec<_>>(),
            [0, 1],
            "{path:?}"
        );
        // An enable behind the index succeeds and changes nothing.
        assert!(c.master_runs(2, en(1)).is_ok(), "{path:?}");
        c.settle();
        assert_eq!(c.ran().1, 2, "{path:?}: two WQEs enabled, two ran");
        assert_eq!(c.mem.read(100, 3), b"ab\0", "{path:?}");
        assert!(c.master_runs(3, en(3)).is_ok(), "{path:?}");
        assert_eq!(wait_cqes(&c.nic, c.managed.cq, 1)[0].wr_id, 2, "{path:?}");
        assert_eq!(c.mem.read(100, 3), b"abc", "{path:?}");
    }
}

#[test]
fn recv_en_lets_exactly_the_enabled_receives_be_taken() {
    for path in PATHS {
        let c = control(path);
        let q = c.managed.qp.qpn;
        for slot in 0..2u64 {
            c.nic
                .post_recv(q, 10 + slot, &[c.mem.mr.sge(200 + 8 * slot, 8)])
                .unwrap();
        }
        // The managed queue SENDs to itself; its receives are not enabled yet.
        let send = |text: &[u8]| WrOp::Send {
            payload: redn_program::wqe::Payload::Inline(text.to_vec()),
            imm: None,
        };
        c.nic
            .post_send(q, &[wr(1, SIG, send(b"one")), wr(2, SIG, send(b"two"))])
            .unwrap();
        assert!(
            c.master_runs(1, WrOp::SendEnable { qp: q, pi: 2 }).is_ok(),
            "{path:?}"
        );
        wait_until("the first SEND finds no enabled receive", || {
            c.nic.counters(q).unwrap().rnr_waits > 0
        });
        assert_eq!(c.mem.read(200, 16), [0; 16], "{path:?}: nothing placed");
        assert!(
            c.master_runs(2, WrOp::RecvEnable { qp: q, pi: 1 }).is_ok(),
            "{path:?}"
        );
        // One receive enabled: the first SEND lands, the second waits for the next.
        let done = wait_cqes(&c.nic, c.managed.cq, 2);
        let ids: Vec<u64> = done.iter().map(|d| d.wr_id).collect();
        assert!(ids.contains(&1) && ids.contains(&10), "{path:?}: {done:?}");
        assert_eq!(c.mem.read(200, 3), b"one", "{path:?}");
        c.settle();
        let sends = c.nic.counters(q).unwrap().by_opcode(Opcode::Send);
        assert_eq!(sends, 1, "{path:?}: the second SEND has not run");
        assert_eq!(c.mem.read(208, 3), [0; 3], "{path:?}");
        assert!(
            c.master_runs(3, WrOp::RecvEnable { qp: q, pi: 2 }).is_ok(),
            "{path:?}"
        );
        wait_cqes(&c.nic, c.managed.cq, 2);
        assert_eq!(c.mem.read(208, 3), b"two", "{path:?}");
    }
}

#[test]
fn an_enable_of_a_queue_not_managed_for_it_is_a_local_qp_operation_error() {
    for path in PATHS {
        let nic = softnic(path, 1);
        let pd = nic.alloc_pd().unwrap();
        let master = endpoint(&nic, pd, |_| {});
        let plain = endpoint(&nic, pd, |_| {});
        let sends = endpoint(&nic, pd, |c| c.managed_send = true);
        let recvs = endpoint(&nic, pd, |c| c.managed_recv = true);
        for q in [&master, &plain, &sends, &recvs] {
            nic.connect(q.qp.qpn, q.qp.qpn).unwrap();
        }
        let unknown = redn_sys::Qpn(0x00ab_cdef);
        let cases = [
            (
                "SEND_EN of an unmanaged queue",
                WrOp::SendEnable {
                    qp: plain.qp.qpn,
                    pi: 1,
                },
            ),
            (
                "RECV_EN of an unmanaged queue",
                WrOp::RecvEnable {
                    qp: plain.qp.qpn,
                    pi: 1,
                },
            ),
            (
                "SEND_EN of a queue managed for receives",
                WrOp::SendEnable {
                    qp: recvs.qp.qpn,
                    pi: 1,
                },
            ),
            (
                "RECV_EN of a queue managed for sends",
                WrOp::RecvEnable {
                    qp: sends.qp.qpn,
                    pi: 1,
                },
            ),
            (
                "SEND_EN of no queue",
                WrOp::SendEnable { qp: unknown, pi: 1 },
            ),
            (
                "RECV_EN of no queue",
                WrOp::RecvEnable { qp: unknown, pi: 1 },
            ),
        ];
        for (what, op) in cases {
            // Each error moves the master to error: a new master per case.
            let m = endpoint(&nic, pd, |_| {});
            nic.connect(m.qp.qpn, m.qp.qpn).unwrap();
            nic.post_send(m.qp.qpn, &[wr(1, SIG, op)]).unwrap();
            let done = wait_cqes(&nic, m.cq, 1).remove(0);
            assert_eq!(
                done.status,
                Err(Syndrome::LocalQpOperation),
                "{path:?}: {what}"
            );
        }
        // The queues managed for the other direction take their own enable.
        for op in [
            WrOp::SendEnable {
                qp: sends.qp.qpn,
                pi: 0,
            },
            WrOp::RecvEnable {
                qp: recvs.qp.qpn,
                pi: 0,
            },
        ] {
            nic.post_send(master.qp.qpn, &[wr(2, SIG, op)]).unwrap();
            assert!(wait_cqes(&nic, master.cq, 1)[0].is_ok(), "{path:?}");
        }
    }
}
