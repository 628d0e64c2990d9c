//! Every opcode against a peer process, exact under loss, reordering and duplication;
//! messages in flight completing in order; a dead peer failing only its own QP.

use super::pairs::pair;
use super::*;

/// Every operation against a peer process, with messages of many packets; the peer's
/// receive log shows each SEND and WRITE-with-immediate delivered once, in order.
pub(super) fn every_opcode(local: &Local, peer: &mut Peer, mtu: u16) {
    let c = local.connect(peer, mtu, vec![]);
    // WRITE and READ, one packet and many (1 MiB + 123 bytes at the path MTU).
    local.write(&c, 100, b"hello over RoCE", None);
    assert_eq!(local.read(&c, 100, 15), b"hello over RoCE");
    let big = pattern((1 << 20) + 123, 7);
    local.write(&c, 4096, &big, None);
    assert_eq!(local.read(&c, 4096, big.len()), big);
    assert_eq!(local.read(&c, 4096 + 1000, 0), b"", "zero-length READ");
    // WRITE with immediate: the data lands and a receive completes with the immediate.
    let w = pattern(3 * usize::from(mtu) + 5, 9);
    local.write(&c, 2 << 20, &w, Some(0xdead_beef));
    assert_eq!(
        local.log_entry(&c, 0),
        (
            CqeOpcode::RespWriteImm as u8,
            true,
            w.len() as u32,
            0xdead_beef
        )
    );
    assert_eq!(local.read(&c, 2 << 20, w.len()), w);
    // SENDs: one packet, several, with immediate, empty.
    let s1 = pattern(40, 1);
    let s2 = pattern(5 * usize::from(mtu) + 1, 2);
    local.send(&c, &s1, None);
    local.send(&c, &s2, Some(77));
    local.send(&c, &[], None);
    assert_eq!(
        local.log_entry(&c, 1),
        (CqeOpcode::RespSend as u8, true, 40, 0)
    );
    assert_eq!(
        local.log_entry(&c, 2),
        (CqeOpcode::RespSendImm as u8, true, s2.len() as u32, 77)
    );
    assert_eq!(
        local.log_entry(&c, 3),
        (CqeOpcode::RespSend as u8, true, 0, 0)
    );
    assert_eq!(local.read(&c, (RECV_AT + RECV_SLOT) as u64, 40), s1);
    assert_eq!(
        local.read(&c, (RECV_AT + 2 * RECV_SLOT) as u64, s2.len()),
        s2
    );
    // Atomics: the target is a little-endian word; the old value comes back.
    local.write(&c, 3 << 20, &10u64.to_le_bytes(), None);
    assert_eq!(local.fetch_add(&c, 3 << 20, 5), 10);
    assert_eq!(local.cas(&c, 3 << 20, 15, 99), 15);
    assert_eq!(local.cas(&c, 3 << 20, 15, 1), 99, "no match, no swap");
    assert_eq!(local.read(&c, 3 << 20, 8), 99u64.to_le_bytes());
    // A key the peer never gave: remote access error, and this QP is in error.
    let r = local.post(
        &c,
        9,
        WrOp::Write {
            remote: redn_program::wqe::RemoteAddr {
                addr: redn_sys::VirtAddr(0x10),
                rkey: redn_sys::Rkey(0xdead00),
            },
            payload: Payload::Inline(vec![1; 8]),
            imm: None,
        },
    );
    assert_eq!(r.status, Err(Syndrome::RemoteAccess));
    assert_eq!(local.nic.qp_state(c.qp).unwrap(), QpState::Error);
}

#[test]
fn every_opcode_between_processes() {
    let local = Local::new(None);
    let mut peer = Peer::spawn("memory", None);
    every_opcode(&local, &mut peer, 1024);
    let report = peer.finish();
    assert!(
        report.ends_with("state ERR\n"),
        "the peer's QP went to error on the bad key: {report}"
    );
    assert_eq!(local.ep.drops().get(DropReason::BadIcrc), 0);
}

#[test]
fn loss_reordering_and_duplication_leave_results_exact() {
    exact_under_faults(&Local::new(Some(FAULTS)));
}

/// Large WRITEs and READs, FETCH_ADDs and SENDs from `local` to a memory peer, both sides
/// injecting faults: every result exact, every atomic run once, every SEND delivered once.
pub(super) fn exact_under_faults(local: &Local) {
    let mut peer = Peer::spawn("memory", Some("11,30,30,30"));
    let c = local.connect(&mut peer, 1024, vec![]);
    for round in 0..3u8 {
        let big = pattern(300_000 + usize::from(round), round);
        local.write(&c, 8192, &big, None);
        assert_eq!(local.read(&c, 8192, big.len()), big, "round {round}");
    }
    // Each FETCH_ADD runs once however often its request or answer is lost or repeated.
    local.write(&c, 3 << 20, &0u64.to_le_bytes(), None);
    for i in 0..200u64 {
        assert_eq!(local.fetch_add(&c, 3 << 20, 1), i);
    }
    assert_eq!(local.read(&c, 3 << 20, 8), 200u64.to_le_bytes());
    // Each SEND is delivered once, in order.
    for i in 0..20u32 {
        local.send(&c, &pattern(2000, i as u8), Some(i));
    }
    for i in 0..20u32 {
        assert_eq!(
            local.log_entry(&c, i as usize),
            (CqeOpcode::RespSendImm as u8, true, 2000, i)
        );
    }
    assert_eq!(
        local.read(&c, (RECV_AT + 19 * RECV_SLOT) as u64, 2000),
        pattern(2000, 19)
    );
    burst_in_flight(local, &c, 20);
    let report = peer.finish();
    assert!(report.ends_with("state RTS\n"), "{report}");
    let d = local.ep.drops();
    assert!(
        d.get(DropReason::OutOfSequence) + d.get(DropReason::UnexpectedResponse) > 0,
        "the faults were felt: {:?}",
        d.snapshot()
    );
}

/// Where the burst's WRITE `i` goes (here and at the memory peer).
fn burst_at(i: usize) -> usize {
    (1 << 20) + i * (16 << 10)
}

/// 40 signaled WRITEs (1 B..9 KB) and SENDs with immediate (1,500 B; every fifth) posted
/// in one call, so that many are in flight at once on `c`: their completions come in
/// order, all good; every WRITE's bytes are at the memory peer and every SEND was
/// delivered once, in order, into the receives from `first_recv` on.
fn burst_in_flight(local: &Local, c: &Conn, first_recv: usize) {
    let n = 40;
    let is_send = |i: usize| i % 5 == 4;
    let len = |i: usize| if is_send(i) { 1500 } else { i * 997 % 9000 + 1 };
    let wrs: Vec<_> = (0..n)
        .map(|i| {
            let data = pattern(len(i), i as u8);
            local.buf.write(burst_at(i), &data);
            let payload = Payload::Sgl(vec![local.buf.mr.sge(burst_at(i) as u64, len(i) as u32)]);
            let op = if is_send(i) {
                WrOp::Send {
                    payload,
                    imm: Some(1000 + i as u32),
                }
            } else {
                WrOp::Write {
                    remote: remote_at(&c.remote, burst_at(i) as u64),
                    payload,
                    imm: None,
                }
            };
            wr(i as u64, SIG, op)
        })
        .collect();
    local.nic.post_send(c.qp, &wrs).unwrap();
    let got = wait_cqes(&local.nic, c.cq, n);
    let ids: Vec<u64> = got.iter().map(|c| c.wr_id).collect();
    assert_eq!(ids, (0..n as u64).collect::<Vec<_>>(), "in order");
    assert!(got.iter().all(|c| c.is_ok()), "{got:?}");
    let mut recv = first_recv;
    for i in 0..n {
        if is_send(i) {
            assert_eq!(
                local.log_entry(c, recv),
                (CqeOpcode::RespSendImm as u8, true, 1500, 1000 + i as u32),
                "SEND {i}"
            );
            let slot = (RECV_AT + recv * RECV_SLOT) as u64;
            assert_eq!(
                local.read(c, slot, 1500),
                pattern(1500, i as u8),
                "SEND {i}"
            );
            recv += 1;
        } else {
            let at = burst_at(i) as u64;
            assert_eq!(
                local.read(c, at, len(i)),
                pattern(len(i), i as u8),
                "WRITE {i}"
            );
        }
    }
}

#[test]
fn many_writes_and_sends_in_flight_complete_in_order() {
    let local = Local::new(None);
    let mut peer = Peer::spawn("memory", None);
    let c = local.connect(&mut peer, 1024, vec![]);
    burst_in_flight(&local, &c, 0);
    assert!(peer.finish().ends_with("state RTS\n"));
}

/// A READ behind posted WRITEs sees what they wrote, and a fenced WRITE behind the READ
/// sends what the READ brought back.
#[test]
fn a_fenced_wqe_after_a_read_sees_the_reads_data() {
    let (a, b, ca, _) = pair(7, 0);
    let x = pattern(64, 9);
    a.buf.write(0, &x);
    let wrs = [
        wr(
            1,
            WqeFlags::NONE,
            WrOp::Write {
                remote: remote_at(&ca.remote, 1000),
                payload: Payload::Sgl(vec![a.buf.mr.sge(0, 64)]),
                imm: None,
            },
        ),
        wr(
            2,
            WqeFlags::NONE,
            WrOp::Read {
                remote: remote_at(&ca.remote, 1000),
                sgl: vec![a.buf.mr.sge(8192, 64)],
            },
        ),
        wr(
            3,
            SIG | WqeFlags::FENCE,
            WrOp::Write {
                remote: remote_at(&ca.remote, 2000),
                payload: Payload::Sgl(vec![a.buf.mr.sge(8192, 64)]),
                imm: None,
            },
        ),
    ];
    a.nic.post_send(ca.qp, &wrs).unwrap();
    let got = wait_cqes(&a.nic, ca.cq, 1);
    assert!(got[0].is_ok() && got[0].wr_id == 3, "{got:?}");
    assert_eq!(a.buf.read(8192, 64), x, "the READ saw the WRITE before it");
    assert_eq!(
        b.buf.read(2000, 64),
        x,
        "the fenced WRITE sent the READ's data"
    );
}

/// Where [`behind_a_long_write`]'s WRITE lands at the peer, and how long it is: 256
/// packets, more than the window keeps on the wire, so the WQEs behind it run before its
/// last ACK can have come.
const LONG_AT: u64 = 4096;
const LONG_LEN: usize = 256 << 10;

/// On a fresh pair: a signaled WRITE of [`LONG_LEN`] bytes (from `a.buf` at 0 to
/// [`LONG_AT`]) and the signaled WQEs `behind` makes (ids from 2 on), posted in one call;
/// their completions come in WQE order. Returns the pair's `a`, `b` and `a`'s connection,
/// the WRITE's bytes and the completions.
fn behind_a_long_write(
    behind: impl FnOnce(&Local, &Conn) -> Vec<WrOp>,
) -> (Local, Local, Conn, Vec<u8>, Vec<Completion>) {
    let (a, b, ca, _) = pair(7, 0);
    let x = pattern(LONG_LEN, 3);
    a.buf.write(0, &x);
    let write = WrOp::Write {
        remote: remote_at(&ca.remote, LONG_AT),
        payload: Payload::Sgl(vec![a.buf.mr.sge(0, LONG_LEN as u32)]),
        imm: None,
    };
    let wrs: Vec<_> = std::iter::once(write)
        .chain(behind(&a, &ca))
        .enumerate()
        .map(|(i, op)| wr(i as u64 + 1, SIG, op))
        .collect();
    a.nic.post_send(ca.qp, &wrs).unwrap();
    let got = wait_cqes(&a.nic, ca.cq, wrs.len());
    let ids: Vec<u64> = got.iter().map(|c| c.wr_id).collect();
    let want: Vec<u64> = (1..=wrs.len() as u64).collect();
    assert_eq!(ids, want, "completions in WQE order: {got:?}");
    (a, b, ca, x, got)
}

/// A NOP and a READ behind a posted WRITE: each waits for the WRITE's acknowledgement, so
/// the WRITE completes first (whichever path runs the NOP) and the READ brings back what
/// the WRITE wrote.
#[test]
fn a_nop_and_a_read_behind_a_posted_write_complete_after_it() {
    let at = 1 << 20;
    let (a, b, _, x, got) = behind_a_long_write(|a, ca| {
        vec![
            WrOp::Nop {
                raw_segments: vec![],
            },
            WrOp::Read {
                remote: remote_at(&ca.remote, LONG_AT),
                sgl: vec![a.buf.mr.sge(at, LONG_LEN as u32)],
            },
        ]
    });
    assert!(got.iter().all(|c| c.is_ok()), "{got:?}");
    assert_eq!(
        b.buf.read(LONG_AT as usize, LONG_LEN),
        x,
        "the WRITE landed"
    );
    assert_eq!(
        a.buf.read(at as usize, LONG_LEN),
        x,
        "the READ saw the WRITE"
    );
}

/// A WQE that fails before it sends anything (its gather entry runs past the region), behind
/// a posted WRITE: the WRITE completes first, as acknowledged, then the WQE's own error;
/// the WQE behind it is flushed and the QP is in error.
#[test]
fn a_local_fault_behind_a_posted_write_completes_after_it() {
    let (a, b, ca, x, got) = behind_a_long_write(|a, ca| {
        let past_end = (4 << 20) - 32;
        vec![
            WrOp::Write {
                remote: remote_at(&ca.remote, 0),
                payload: Payload::Sgl(vec![a.buf.mr.sge(past_end, 64)]),
                imm: None,
            },
            WrOp::Write {
                remote: remote_at(&ca.remote, 0),
                payload: Payload::Sgl(vec![a.buf.mr.sge(0, 64)]),
                imm: None,
            },
        ]
    });
    let status: Vec<_> = got.iter().map(|c| c.status).collect();
    assert_eq!(
        status,
        [
            Ok(()),
            Err(Syndrome::LocalProtection),
            Err(Syndrome::WrFlush)
        ]
    );
    assert_eq!(a.nic.qp_state(ca.qp).unwrap(), QpState::Error);
    assert_eq!(
        a.nic.sq_consumed(ca.qp).unwrap(),
        3,
        "every WQE's slot freed"
    );
    assert_eq!(
        b.buf.read(LONG_AT as usize, LONG_LEN),
        x,
        "the WRITE landed"
    );
}

/// A posted WRITE the peer refuses (past the end of its region), behind a posted WRITE and
/// with none or two posted after it: the first completes, the refused one fails with a
/// remote access error, those after it are flushed, the QP is in error, and every WQE's
/// ring slot is free again (each completion gave back its own).
#[test]
fn a_refused_posted_write_fails_and_flushes_those_posted_after_it() {
    for after in [0, 2] {
        let (a, _, ca, _, got) = behind_a_long_write(|a, ca| {
            let refused = WrOp::Write {
                remote: remote_at(&ca.remote, (4 << 20) - 32),
                payload: Payload::Sgl(vec![a.buf.mr.sge(0, 64)]),
                imm: None,
            };
            let fine = WrOp::Write {
                remote: remote_at(&ca.remote, 0),
                payload: Payload::Sgl(vec![a.buf.mr.sge(0, 64)]),
                imm: None,
            };
            std::iter::once(refused)
                .chain(std::iter::repeat_n(fine, after))
                .collect()
        });
        let status: Vec<_> = got.iter().map(|c| c.status).collect();
        let mut want = vec![Ok(()), Err(Syndrome::RemoteAccess)];
        want.extend(std::iter::repeat_n(Err(Syndrome::WrFlush), after));
        assert_eq!(status, want, "{after} after");
        assert_eq!(a.nic.qp_state(ca.qp).unwrap(), QpState::Error);
        assert_eq!(
            a.nic.sq_consumed(ca.qp).unwrap(),
            got.len() as u64,
            "every WQE's slot freed, {after} after"
        );
    }
}

/// A doorbell-ordered chain stepping a managed RoCE queue: the master (on the same PU)
/// enables 64 WRITEs and a NOP, waits for the first completion, enables a second NOP and
/// waits for its completion. The 64 WRITEs are the hand-over's whole budget, so its visit
/// ends in front of the first NOP with WRITEs still posted, and the next step finds the NOPs
/// next. They must complete after the WRITEs (a queue whose peer posts does not run its
/// NOPs on the steps' own plain loop, which completes them at once).
#[test]
fn a_chain_step_runs_nops_behind_posted_writes_in_order() {
    let (a, b) = (Local::new(None), Local::new(None));
    let q_cq = a.nic.create_cq(CqConfig::new(256)).unwrap();
    let mut qc = QpConfig::new(a.pd, q_cq);
    qc.managed_send = true;
    let q = a.nic.create_qp(qc).unwrap().qpn;
    let b_cq = b.nic.create_cq(CqConfig::new(256)).unwrap();
    let qb = b.nic.create_qp(QpConfig::new(b.pd, b_cq)).unwrap().qpn;
    let mut rq = record(&a.ep, q, 10, 1024);
    rq.regions.push(region_record("mem", &a.buf));
    let mut rb = record(&b.ep, qb, 20, 1024);
    rb.regions.push(region_record("mem", &b.buf));
    a.ep.connect(&rq, &rb).unwrap();
    b.ep.connect(&rb, &rq).unwrap();
    let m_cq = a.nic.create_cq(CqConfig::new(256)).unwrap();
    let m = a.nic.create_qp(QpConfig::new(a.pd, m_cq)).unwrap().qpn;
    a.nic.connect(m, m).unwrap();

    let writes = 64u32;
    let len = 4096u32;
    let x = pattern((writes * len) as usize, 5);
    a.buf.write(0, &x);
    let mut wrs: Vec<_> = (0..writes)
        .map(|i| {
            let at = u64::from(i * len);
            let op = WrOp::Write {
                remote: remote_at(&rb, at),
                payload: Payload::Sgl(vec![a.buf.mr.sge(at, len)]),
                imm: None,
            };
            wr(u64::from(i), SIG, op)
        })
        .collect();
    for i in [writes, writes + 1] {
        let nop = WrOp::Nop {
            raw_segments: vec![],
        };
        wrs.push(wr(u64::from(i), SIG, nop));
    }
    a.nic.post_send(q, &wrs).unwrap();
    let all = writes + 2;
    let enable = |pi| WrOp::SendEnable { qp: q, pi };
    let chain = [
        wr(100, WqeFlags::NONE, enable(all - 1)),
        wr(101, WqeFlags::NONE, WrOp::Wait { cq: q_cq, count: 0 }),
        wr(102, WqeFlags::NONE, enable(all)),
        wr(
            103,
            SIG,
            WrOp::Wait {
                cq: q_cq,
                count: all - 1,
            },
        ),
    ];
    a.nic.post_send(m, &chain).unwrap();
    let got = wait_cqes(&a.nic, q_cq, all as usize);
    let ids: Vec<u64> = got.iter().map(|c| c.wr_id).collect();
    assert_eq!(ids, (0..u64::from(all)).collect::<Vec<_>>(), "in WQE order");
    assert!(got.iter().all(|c| c.is_ok()), "{got:?}");
    assert_eq!(wait_cqes(&a.nic, m_cq, 1)[0].wr_id, 103);
    assert_eq!(b.buf.read(0, x.len()), x, "every WRITE landed");
}

#[test]
fn a_dead_peer_fails_its_qp_with_retry_exceeded_and_others_go_on() {
    let local = Local::new(None);
    let mut doomed = Peer::spawn("memory", None);
    let mut alive = Peer::spawn("memory", None);
    let c_doomed = local.connect(&mut doomed, 4096, vec![]);
    let c_alive = local.connect(&mut alive, 4096, vec![]);
    local.write(&c_doomed, 0, b"before", None);
    // A stream of WRITEs; the peer dies under it.
    let n = 64u64;
    let data = pattern(64 << 10, 3);
    local.buf.write(0, &data);
    for i in 0..n {
        local
            .nic
            .post_send(
                c_doomed.qp,
                &[wr(
                    i,
                    SIG,
                    WrOp::Write {
                        remote: remote_at(&c_doomed.remote, 0),
                        payload: Payload::Sgl(vec![local.buf.mr.sge(0, data.len() as u32)]),
                        imm: None,
                    },
                )],
            )
            .unwrap();
        if i == 8 {
            doomed.child.kill().unwrap();
            doomed.child.wait().unwrap();
        }
    }
    let all = wait_cqes(&local.nic, c_doomed.cq, n as usize);
    let first_bad = all
        .iter()
        .position(|c| !c.is_ok())
        .expect("some WRITE failed");
    assert_eq!(
        all[first_bad].status,
        Err(Syndrome::TransportRetryExceeded),
        "{:?}",
        all[first_bad]
    );
    assert!(all[first_bad + 1..]
        .iter()
        .all(|c| c.status == Err(Syndrome::WrFlush)));
    assert_eq!(local.nic.qp_state(c_doomed.qp).unwrap(), QpState::Error);
    // The same softnic and endpoint go on serving the other peer.
    local.write(&c_alive, 64, b"still here", None);
    assert_eq!(local.read(&c_alive, 64, 10), b"still here");
    assert!(alive.finish().ends_with("state RTS\n"));
}
