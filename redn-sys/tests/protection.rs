//! Protection faults: every violation ends in an error completion with the right syndrome, the
//! queue pair in the error state, the WQEs behind it flushed, and no byte outside a granted
//! region read or written.

mod common;
use common::*;
use redn_program::wqe::{CqeOpcode, Payload, RemoteAddr, Sge, Syndrome, WqeFlags, WrOp};
use redn_sys::mem::SharedBuffer;
use redn_sys::nic::{Nic, QpCounters};
use redn_sys::softnic::{Prefetch, SoftNic};
use redn_sys::{Access, Lkey, QpState, Rkey, VirtAddr};
use std::sync::Arc;

const GUARD: u8 = 0xa5;

/// A 3-page buffer whose middle page is the region; the pages around it hold a guard pattern.
struct Guarded {
    buf: Arc<SharedBuffer>,
    mr: redn_sys::nic::MrInfo,
}

impl Guarded {
    fn new(nic: &SoftNic, pd: redn_sys::Pdn, access: Access) -> Guarded {
        let buf = SharedBuffer::new(3 * 4096);
        buf.write(0, &[GUARD; 3 * 4096]);
        let mr = nic.reg_mr(pd, &buf, 4096, 4096, access).unwrap();
        Guarded { buf, mr }
    }

    fn guards_intact(&self) -> bool {
        let mut v = vec![0u8; 4096];
        self.buf.read(0, &mut v);
        let low = v.iter().all(|&b| b == GUARD);
        self.buf.read(8192, &mut v);
        low && v.iter().all(|&b| b == GUARD)
    }

    fn region_bytes(&self) -> Vec<u8> {
        let mut v = vec![0u8; 4096];
        self.buf.read(4096, &mut v);
        v
    }
}

struct Case {
    nic: SoftNic,
    ep: Endpoint,
    local: Guarded,
    remote: Guarded,
}

fn case(remote_access: Access) -> Case {
    let nic = nic(1, Prefetch::Depth(8));
    let pd = nic.alloc_pd().unwrap();
    let local = Guarded::new(&nic, pd, Access::ALL);
    let remote = Guarded::new(&nic, pd, remote_access);
    let ep = endpoint(&nic, pd, |_| {});
    nic.connect(ep.qp.qpn, ep.qp.qpn).unwrap();
    Case {
        nic,
        ep,
        local,
        remote,
    }
}

/// Post the faulting WQE (unsignaled: errors complete anyway) and two more behind it; check
/// the error completion, the flushes, the state, and that nothing changed.
fn expect_fault(c: &Case, op: WrOp, syndrome: Syndrome) -> QpCounters {
    let before_local = c.local.region_bytes();
    let before_remote = c.remote.region_bytes();
    let behind = |id| {
        wr(
            id,
            WqeFlags::NONE,
            WrOp::Write {
                remote: c.remote.mr.remote(0),
                payload: Payload::Sgl(vec![c.local.mr.sge(0, 8)]),
                imm: None,
            },
        )
    };
    c.nic
        .post_send(
            c.ep.qp.qpn,
            &[wr(1, WqeFlags::NONE, op), behind(2), behind(3)],
        )
        .unwrap();
    let cqes = wait_cqes(&c.nic, c.ep.cq, 3);
    assert_eq!(cqes[0].wr_id, 1);
    assert_eq!(cqes[0].opcode, CqeOpcode::ReqErr);
    assert_eq!(cqes[0].status, Err(syndrome));
    for (i, f) in cqes[1..].iter().enumerate() {
        assert_eq!(f.wr_id, i as u64 + 2);
        assert_eq!(f.status, Err(Syndrome::WrFlush));
    }
    assert_eq!(c.nic.qp_state(c.ep.qp.qpn).unwrap(), QpState::Error);
    assert!(
        c.local.guards_intact() && c.remote.guards_intact(),
        "guard bytes changed"
    );
    assert_eq!(c.local.region_bytes(), before_local, "local region changed");
    assert_eq!(
        c.remote.region_bytes(),
        before_remote,
        "remote region changed"
    );
    // Later posts are flushed too.
    c.nic.post_send(c.ep.qp.qpn, &[behind(4)]).unwrap();
    assert_eq!(
        wait_cqes(&c.nic, c.ep.cq, 1)[0].status,
        Err(Syndrome::WrFlush)
    );
    let counters = c.nic.counters(c.ep.qp.qpn).unwrap();
    assert_eq!(counters.errors, 1);
    counters
}

fn sgl(s: Sge) -> Payload {
    Payload::Sgl(vec![s])
}

#[test]
fn remote_address_past_the_region_end() {
    let c = case(Access::ALL);
    c.local.buf.write(4096, &[1; 64]);
    // Starts inside, ends 8 bytes past the end: nothing may be written, not even the inside part.
    let op = WrOp::Write {
        remote: c.remote.mr.remote(4096 - 8),
        payload: sgl(c.local.mr.sge(0, 16)),
        imm: None,
    };
    expect_fault(&c, op, Syndrome::RemoteAccess);
}

#[test]
fn remote_address_before_the_region_start() {
    let c = case(Access::ALL);
    let remote = RemoteAddr {
        addr: VirtAddr(c.remote.mr.addr.0 - 8),
        rkey: c.remote.mr.lkey.into(),
    };
    expect_fault(
        &c,
        WrOp::Read {
            remote,
            sgl: vec![c.local.mr.sge(0, 16)],
        },
        Syndrome::RemoteAccess,
    );
}

#[test]
fn wrong_remote_key() {
    let c = case(Access::ALL);
    let remote = RemoteAddr {
        addr: c.remote.mr.addr,
        rkey: Rkey(c.remote.mr.lkey.0 ^ 0x100),
    };
    expect_fault(
        &c,
        WrOp::FetchAdd {
            remote,
            add: 1,
            result: None,
        },
        Syndrome::RemoteAccess,
    );
}

#[test]
fn missing_remote_rights() {
    for (access, op) in [
        (Access::REMOTE_READ | Access::REMOTE_ATOMIC, "write"),
        (Access::REMOTE_WRITE | Access::REMOTE_ATOMIC, "read"),
        (Access::REMOTE_READ | Access::REMOTE_WRITE, "atomic"),
    ] {
        // Remote write and atomic rights come with local write (ibv_reg_mr(3)).
        let c = case(access | Access::LOCAL_WRITE);
        let w = match op {
            "write" => WrOp::Write {
                remote: c.remote.mr.remote(0),
                payload: sgl(c.local.mr.sge(0, 8)),
                imm: None,
            },
            "read" => WrOp::Read {
                remote: c.remote.mr.remote(0),
                sgl: vec![c.local.mr.sge(0, 8)],
            },
            _ => WrOp::CompareSwap {
                remote: c.remote.mr.remote(0),
                compare: 0,
                swap: 1,
                result: None,
            },
        };
        expect_fault(&c, w, Syndrome::RemoteAccess);
    }
}

#[test]
fn local_key_and_local_write_right() {
    let c = case(Access::ALL);
    let bad = Sge {
        addr: c.local.mr.addr,
        len: 8,
        lkey: Lkey(0x9999),
    };
    expect_fault(
        &c,
        WrOp::Write {
            remote: c.remote.mr.remote(0),
            payload: sgl(bad),
            imm: None,
        },
        Syndrome::LocalProtection,
    );

    // A READ may only land in memory registered with LOCAL_WRITE.
    let nic = nic(1, Prefetch::Depth(8));
    let pd = nic.alloc_pd().unwrap();
    let local = Guarded::new(&nic, pd, Access::REMOTE_READ);
    let remote = Guarded::new(&nic, pd, Access::ALL);
    let ep = endpoint(&nic, pd, |_| {});
    nic.connect(ep.qp.qpn, ep.qp.qpn).unwrap();
    let c = Case {
        nic,
        ep,
        local,
        remote,
    };
    c.remote.buf.write(4096, &[7; 8]);
    let op = WrOp::Read {
        remote: c.remote.mr.remote(0),
        sgl: vec![c.local.mr.sge(0, 8)],
    };
    expect_fault(&c, op, Syndrome::LocalProtection);
}

#[test]
fn foreign_protection_domain() {
    // A region of another PD: neither usable as a local key nor reachable remotely.
    let c = case(Access::ALL);
    let other_pd = c.nic.alloc_pd().unwrap();
    let foreign = Guarded::new(&c.nic, other_pd, Access::ALL);
    let op = WrOp::Write {
        remote: foreign.mr.remote(0),
        payload: sgl(c.local.mr.sge(0, 8)),
        imm: None,
    };
    expect_fault(&c, op, Syndrome::RemoteAccess);
    assert!(foreign.guards_intact());
    assert_eq!(foreign.region_bytes(), vec![GUARD; 4096]);

    let c = case(Access::ALL);
    let other_pd = c.nic.alloc_pd().unwrap();
    let foreign = Guarded::new(&c.nic, other_pd, Access::ALL);
    let op = WrOp::Write {
        remote: c.remote.mr.remote(0),
        payload: sgl(foreign.mr.sge(0, 8)),
        imm: None,
    };
    expect_fault(&c, op, Syndrome::LocalProtection);
}

#[test]
fn deregistered_key_stops_working_at_once() {
    let c = case(Access::ALL);
    c.nic.dereg_mr(c.remote.mr.lkey).unwrap();
    let op = WrOp::Write {
        remote: c.remote.mr.remote(0),
        payload: sgl(c.local.mr.sge(0, 8)),
        imm: None,
    };
    expect_fault(&c, op, Syndrome::RemoteAccess);
}

#[test]
fn the_peer_of_a_failed_queue_is_not_affected() {
    // Two client QPs talk to two server QPs; one client faults; the other keeps working.
    let server = nic(1, Prefetch::Depth(8));
    let client = nic(1, Prefetch::Depth(8));
    let spd = server.alloc_pd().unwrap();
    let cpd = client.alloc_pd().unwrap();
    let data = Guarded::new(&server, spd, Access::REMOTE_READ);
    let local = Guarded::new(&client, cpd, Access::ALL);
    let (s1, s2) = (
        endpoint(&server, spd, |_| {}),
        endpoint(&server, spd, |_| {}),
    );
    let (c1, c2) = (
        endpoint(&client, cpd, |_| {}),
        endpoint(&client, cpd, |_| {}),
    );
    SoftNic::connect_pair(&client, c1.qp.qpn, &server, s1.qp.qpn).unwrap();
    SoftNic::connect_pair(&client, c2.qp.qpn, &server, s2.qp.qpn).unwrap();
    client
        .post_send(
            c1.qp.qpn,
            &[wr(
                1,
                SIG,
                WrOp::Write {
                    remote: data.mr.remote(0),
                    payload: sgl(local.mr.sge(0, 8)),
                    imm: None,
                },
            )],
        )
        .unwrap();
    assert_eq!(
        wait_cqes(&client, c1.cq, 1)[0].status,
        Err(Syndrome::RemoteAccess)
    );
    data.buf.write(4096, b"fine");
    client
        .post_send(
            c2.qp.qpn,
            &[wr(
                2,
                SIG,
                WrOp::Read {
                    remote: data.mr.remote(0),
                    sgl: vec![local.mr.sge(0, 4)],
                },
            )],
        )
        .unwrap();
    assert!(wait_cqes(&client, c2.cq, 1)[0].is_ok());
    assert_eq!(local.region_bytes()[..4], *b"fine");
    assert_eq!(client.qp_state(c2.qp.qpn).unwrap(), QpState::ReadyToSend);
    assert_eq!(server.qp_state(s2.qp.qpn).unwrap(), QpState::ReadyToSend);
}

#[test]
fn host_moving_a_queue_to_error_flushes_sends_and_receives() {
    let c = case(Access::ALL);
    c.nic
        .post_recv(c.ep.qp.qpn, 50, &[c.local.mr.sge(0, 8)])
        .unwrap();
    let managed = endpoint(&c.nic, c.ep.pd, |q| q.managed_send = true);
    c.nic.connect(managed.qp.qpn, managed.qp.qpn).unwrap();
    c.nic
        .post_send(
            managed.qp.qpn,
            &[
                wr(
                    60,
                    SIG,
                    WrOp::Nop {
                        raw_segments: vec![],
                    },
                ),
                wr(
                    61,
                    WqeFlags::NONE,
                    WrOp::Nop {
                        raw_segments: vec![],
                    },
                ),
            ],
        )
        .unwrap();
    c.nic.set_qp_error(c.ep.qp.qpn).unwrap();
    let r = wait_cqes(&c.nic, c.ep.cq, 1).remove(0);
    assert_eq!(
        (r.wr_id, r.opcode, r.status),
        (50, CqeOpcode::RespErr, Err(Syndrome::WrFlush))
    );
    c.nic.set_qp_error(managed.qp.qpn).unwrap();
    let f = wait_cqes(&c.nic, managed.cq, 2);
    assert_eq!(f.iter().map(|x| x.wr_id).collect::<Vec<_>>(), [60, 61]);
    assert!(f.iter().all(|x| x.status == Err(Syndrome::WrFlush)));
    // A request to a queue in error gets no answer: transport retry exceeded.
    let d = endpoint(&c.nic, c.ep.pd, |_| {});
    let e = endpoint(&c.nic, c.ep.pd, |_| {});
    c.nic.connect(d.qp.qpn, e.qp.qpn).unwrap();
    c.nic.set_qp_error(e.qp.qpn).unwrap();
    c.nic
        .post_send(
            d.qp.qpn,
            &[wr(
                70,
                SIG,
                WrOp::Write {
                    remote: c.remote.mr.remote(0),
                    payload: sgl(c.local.mr.sge(0, 8)),
                    imm: None,
                },
            )],
        )
        .unwrap();
    assert_eq!(
        wait_cqes(&c.nic, d.cq, 1)[0].status,
        Err(Syndrome::TransportRetryExceeded)
    );
}

/// A fault behind WQEs that ran on the executor's fast path (NOPs, one-segment WRITEs and
/// READs posted with one doorbell): those keep their effects, counts and completions, the bad
/// one fails with its own index and syndrome, and the rest is flushed.
#[test]
fn a_fault_behind_fast_path_wqes() {
    for prefetch in [
        Prefetch::AtExecute,
        Prefetch::Depth(8),
        Prefetch::Adversarial,
    ] {
        let nic = nic(1, prefetch);
        let pd = nic.alloc_pd().unwrap();
        let local = Guarded::new(&nic, pd, Access::ALL);
        let remote = Guarded::new(&nic, pd, Access::ALL);
        let ep = endpoint(&nic, pd, |_| {});
        nic.connect(ep.qp.qpn, ep.qp.qpn).unwrap();
        local.buf.write(4096, &[7u8; 64]);
        remote.buf.write(4096 + 1024, &[9u8; 64]);
        let write = |id, flags, off: u64| {
            wr(
                id,
                flags,
                WrOp::Write {
                    remote: remote.mr.remote(off),
                    payload: sgl(local.mr.sge(0, 64)),
                    imm: None,
                },
            )
        };
        let read = |id, flags| {
            wr(
                id,
                flags,
                WrOp::Read {
                    remote: remote.mr.remote(1024),
                    sgl: vec![local.mr.sge(512, 64)],
                },
            )
        };
        let nop = |id| {
            wr(
                id,
                WqeFlags::NONE,
                WrOp::Nop {
                    raw_segments: Vec::new(),
                },
            )
        };
        let wrs = [
            nop(1),
            write(2, WqeFlags::NONE, 0),
            read(3, WqeFlags::SIGNALED),
            write(4, WqeFlags::SIGNALED, 64),
            nop(5),
            // One byte past the remote region's end.
            write(6, WqeFlags::NONE, 4096 - 63),
            write(7, WqeFlags::NONE, 128),
        ];
        nic.post_send(ep.qp.qpn, &wrs).unwrap();
        let cqes = wait_cqes(&nic, ep.cq, 4);
        let got: Vec<_> = cqes.iter().map(|c| (c.wr_id, c.status)).collect();
        assert_eq!(
            got,
            [
                (3, Ok(())),
                (4, Ok(())),
                (6, Err(Syndrome::RemoteAccess)),
                (7, Err(Syndrome::WrFlush))
            ],
            "{prefetch:?}"
        );
        assert_eq!(cqes[0].byte_len, 64, "READ byte count");
        assert_eq!(cqes[2].cqe.wqe_counter, 5, "the failed WQE's index");
        let r = remote.region_bytes();
        assert_eq!(&r[..128], &[7u8; 128][..], "the two WRITEs landed");
        assert!(
            r[128..1024].iter().all(|&b| b == GUARD),
            "nothing else written"
        );
        assert_eq!(local.region_bytes()[512..576], [9u8; 64], "the READ landed");
        assert!(local.guards_intact() && remote.guards_intact());
        let c = nic.counters(ep.qp.qpn).unwrap();
        assert_eq!(c.by_opcode(redn_program::wqe::Opcode::Nop), 2);
        assert_eq!(c.by_opcode(redn_program::wqe::Opcode::RdmaWrite), 2);
        assert_eq!(c.by_opcode(redn_program::wqe::Opcode::RdmaRead), 1);
        assert_eq!((c.bytes, c.errors), (192, 1));
        assert_eq!(nic.qp_state(ep.qp.qpn).unwrap(), QpState::Error);
    }
}
