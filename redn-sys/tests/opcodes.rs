//! Each opcode's effect on memory, receives and completions, on loopback and between two
//! softnic instances.

mod common;
use common::*;
use redn_program::wqe::{CqeOpcode, Opcode, Payload, WqeFlags, WrOp};
use redn_sys::nic::Nic;
use redn_sys::softnic::{Prefetch, SoftNic};
use redn_sys::Cqn;

struct Loop {
    nic: SoftNic,
    ep: Endpoint,
    a: Region,
    b: Region,
}

fn setup() -> Loop {
    let nic = nic(2, Prefetch::Depth(8));
    let pd = nic.alloc_pd().unwrap();
    let a = Region::new(&nic, pd, 8192, ALL);
    let b = Region::new(&nic, pd, 8192, ALL);
    let ep = endpoint(&nic, pd, |_| {});
    nic.connect(ep.qp.qpn, ep.qp.qpn).unwrap();
    Loop { nic, ep, a, b }
}

fn run(l: &Loop, op: WrOp) -> redn_sys::nic::Completion {
    l.nic.post_send(l.ep.qp.qpn, &[wr(1, SIG, op)]).unwrap();
    let c = wait_cqes(&l.nic, l.ep.cq, 1).remove(0);
    assert!(c.is_ok(), "{c:?}");
    c
}

#[test]
fn write_gathers_and_inline() {
    let l = setup();
    l.a.write(0, b"abc");
    l.a.write(100, b"defgh");
    let sgl = vec![l.a.mr.sge(0, 3), l.a.mr.sge(100, 5)];
    run(
        &l,
        WrOp::Write {
            remote: l.b.mr.remote(7),
            payload: Payload::Sgl(sgl),
            imm: None,
        },
    );
    assert_eq!(l.b.read(6, 10), b"\0abcdefgh\0");
    run(
        &l,
        WrOp::Write {
            remote: l.b.mr.remote(1000),
            payload: Payload::Inline(b"inline!".to_vec()),
            imm: None,
        },
    );
    assert_eq!(l.b.read(1000, 7), b"inline!");
    let c = l.nic.counters(l.ep.qp.qpn).unwrap();
    assert_eq!(c.by_opcode(Opcode::RdmaWrite), 2);
    assert_eq!(c.bytes, 15);
}

#[test]
fn read_scatters_at_any_alignment() {
    let l = setup();
    l.b.write(0, b"0123456789ABCDEFGHIJ");
    let sgl = vec![l.a.mr.sge(3, 3), l.a.mr.sge(41, 8), l.a.mr.sge(13, 9)];
    let c = run(
        &l,
        WrOp::Read {
            remote: l.b.mr.remote(1),
            sgl,
        },
    );
    assert_eq!(c.byte_len, 20);
    assert_eq!(l.a.read(3, 3), b"123");
    assert_eq!(l.a.read(41, 8), b"456789AB");
    assert_eq!(l.a.read(13, 9), b"CDEFGHIJ\0");
}

#[test]
fn cas_compares_host_order_and_returns_old_value_in_host_order() {
    let l = setup();
    l.b.write(64, &0x1122_3344_5566_7788u64.to_le_bytes());
    // Mismatch: success completion, target unchanged, old value returned.
    run(
        &l,
        WrOp::CompareSwap {
            remote: l.b.mr.remote(64),
            compare: 1,
            swap: 2,
            result: Some(l.a.mr.sge(0, 8)),
        },
    );
    assert_eq!(l.b.read(64, 8), 0x1122_3344_5566_7788u64.to_le_bytes());
    // Upstream Linux sets ConnectX's atomic replies to host order (kernel f91e6d8941bf).
    assert_eq!(l.a.read(0, 8), 0x1122_3344_5566_7788u64.to_le_bytes());
    // Match.
    run(
        &l,
        WrOp::CompareSwap {
            remote: l.b.mr.remote(64),
            compare: 0x1122_3344_5566_7788,
            swap: 42,
            result: None,
        },
    );
    assert_eq!(l.b.read(64, 8), 42u64.to_le_bytes());
}

#[test]
fn atomic_replies_land_big_endian_only_on_a_qp_that_asks_for_it() {
    // MLNX_OFED's per-QP ATOMIC_BE_REPLY: the old value lands big-endian, for CAS and
    // FETCH_ADD alike.
    let nic = nic(1, Prefetch::Depth(8));
    let pd = nic.alloc_pd().unwrap();
    let a = Region::new(&nic, pd, 4096, ALL);
    let ep = endpoint(&nic, pd, |c| c.atomic_be_reply = true);
    nic.connect(ep.qp.qpn, ep.qp.qpn).unwrap();
    a.write(64, &0x0102_0304_0506_0708u64.to_le_bytes());
    let faa = WrOp::FetchAdd {
        remote: a.mr.remote(64),
        add: 1,
        result: Some(a.mr.sge(0, 8)),
    };
    let cas = WrOp::CompareSwap {
        remote: a.mr.remote(64),
        compare: 0,
        swap: 0,
        result: Some(a.mr.sge(8, 8)),
    };
    nic.post_send(ep.qp.qpn, &[wr(1, SIG, faa), wr(2, SIG, cas)])
        .unwrap();
    assert!(wait_cqes(&nic, ep.cq, 2).iter().all(|c| c.is_ok()));
    assert_eq!(a.read(0, 8), 0x0102_0304_0506_0708u64.to_be_bytes());
    assert_eq!(a.read(8, 8), 0x0102_0304_0506_0709u64.to_be_bytes());
}

#[test]
fn cas_on_a_big_endian_control_word_uses_byte_reversed_operands() {
    // RedN's `if`: the target is a WQE's first 8 bytes (big-endian fields); the CAS compares
    // them read as a little-endian u64, so the operands are the reversed byte images.
    let l = setup();
    let nop = [0u8, 0x00, 0x05, 0x00, 0x00, 0x00, 0x00, 0x03]; // idx 5, NOP, qpn 0, ds 3
    let write = [0u8, 0x00, 0x05, 0x09, 0x00, 0x01, 0x23, 0x03]; // WRITE_IMM, qpn 0x123
    l.b.write(128, &nop);
    run(
        &l,
        WrOp::CompareSwap {
            remote: l.b.mr.remote(128),
            compare: u64::from_le_bytes(nop),
            swap: u64::from_le_bytes(write),
            result: None,
        },
    );
    assert_eq!(l.b.read(128, 8), write);
}

#[test]
fn fetch_add_and_masked_atomics() {
    let l = setup();
    l.b.write(0, &10u64.to_le_bytes());
    run(
        &l,
        WrOp::FetchAdd {
            remote: l.b.mr.remote(0),
            add: 5,
            result: Some(l.a.mr.sge(8, 8)),
        },
    );
    assert_eq!(l.b.read(0, 8), 15u64.to_le_bytes());
    assert_eq!(l.a.read(8, 8), 10u64.to_le_bytes());

    l.b.write(16, &0xab11u64.to_le_bytes());
    run(
        &l,
        WrOp::MaskedCompareSwap {
            remote: l.b.mr.remote(16),
            compare: 0xab00,
            compare_mask: 0xff00,
            swap: 0xcd,
            swap_mask: 0xff,
            result: None,
        },
    );
    assert_eq!(l.b.read(16, 8), 0xabcdu64.to_le_bytes());

    l.b.write(24, &0x0000_0005_ffff_ffffu64.to_le_bytes());
    run(
        &l,
        WrOp::MaskedFetchAdd {
            remote: l.b.mr.remote(24),
            add: 1,
            field_boundary: 1 << 31,
            result: None,
        },
    );
    assert_eq!(l.b.read(24, 8), 0x0000_0005_0000_0000u64.to_le_bytes());
    let c = l.nic.counters(l.ep.qp.qpn).unwrap();
    assert_eq!(c.by_opcode(Opcode::AtomicFa), 1);
    assert_eq!(c.by_opcode(Opcode::AtomicMaskedCs), 1);
    assert_eq!(c.by_opcode(Opcode::AtomicMaskedFa), 1);
}

/// Masked CAS on 8 bytes at b+64 (b+56..64 and b+72..80 hold a guard pattern), returning
/// the old value in host order at a+0; the word afterwards must be `after` and the guards intact.
#[allow(clippy::too_many_arguments)]
fn masked_cas_case(
    l: &Loop,
    old: u64,
    compare: u64,
    compare_mask: u64,
    swap: u64,
    swap_mask: u64,
    after: u64,
) {
    let guard = [0x5au8; 8];
    l.b.write(56, &guard);
    l.b.write(64, &old.to_le_bytes());
    l.b.write(72, &guard);
    l.a.write(0, &[0; 8]);
    run(
        l,
        WrOp::MaskedCompareSwap {
            remote: l.b.mr.remote(64),
            compare,
            compare_mask,
            swap,
            swap_mask,
            result: Some(l.a.mr.sge(0, 8)),
        },
    );
    let what = format!(
        "old {old:#018x} compare {compare:#018x}/{compare_mask:#018x} \
         swap {swap:#018x}/{swap_mask:#018x}"
    );
    assert_eq!(
        u64::from_le_bytes(l.b.read(64, 8).try_into().unwrap()),
        after,
        "{what}"
    );
    assert_eq!(l.b.read(56, 8), guard, "{what}");
    assert_eq!(l.b.read(72, 8), guard, "{what}");
    assert_eq!(
        l.a.read(0, 8),
        old.to_le_bytes(),
        "{what}: old value returned"
    );
}

#[test]
fn masked_cas_honours_the_high_32_bits_of_both_masks() {
    // Expected words worked out by hand: swap when (old ^ compare) & compare_mask == 0, to
    // (old & !swap_mask) | (swap & swap_mask).
    let l = setup();
    let swap = 0xaaaa_bbbb_cccc_dddd;
    // Compare under a mask of the high half only: equal there (the low half differs), swap.
    masked_cas_case(
        &l,
        0x1234_5678_9abc_def0,
        0x1234_5678_0000_0000,
        0xffff_ffff_0000_0000,
        swap,
        u64::MAX,
        swap,
    );
    // Different only in bit 32, then only in bit 63, each under the mask: unchanged.
    masked_cas_case(
        &l,
        0x1234_5678_9abc_def0,
        0x1234_5679_9abc_def0,
        0xffff_ffff_0000_0000,
        swap,
        u64::MAX,
        0x1234_5678_9abc_def0,
    );
    masked_cas_case(
        &l,
        0x1234_5678_9abc_def0,
        0x9234_5678_9abc_def0,
        0x8000_0000_0000_0000,
        swap,
        u64::MAX,
        0x1234_5678_9abc_def0,
    );
    // Swap under a mask of high bits only (an empty compare mask always matches): the high
    // 16 bits, then bits 63 and 32 alone.
    masked_cas_case(
        &l,
        0x1111_2222_3333_4444,
        0,
        0,
        swap,
        0xffff_0000_0000_0000,
        0xaaaa_2222_3333_4444,
    );
    masked_cas_case(
        &l,
        0x1111_2222_3333_4444,
        0,
        0,
        swap,
        0x8000_0001_0000_0000,
        0x9111_2223_3333_4444,
    );
}

#[test]
fn masked_cas_with_masks_in_both_halves() {
    let l = setup();
    let old = 0x0123_4567_89ab_cdef;
    let swap = 0xfedc_ba98_7654_3210;
    // Compare byte 6 and byte 0; swap nibbles 15, 8, 3 and 0.
    let (compare_mask, swap_mask) = (0x00ff_0000_0000_00ff, 0xf000_000f_0000_f00f);
    // Both compared bytes equal: nibbles 15 and 8 (high half) and 3 and 0 (low) swapped.
    masked_cas_case(
        &l,
        old,
        0x0023_0000_0000_00ef,
        compare_mask,
        swap,
        swap_mask,
        0xf123_4568_89ab_3de0,
    );
    // The high compared byte differs, then the low one: unchanged.
    masked_cas_case(
        &l,
        old,
        0x0024_0000_0000_00ef,
        compare_mask,
        swap,
        swap_mask,
        old,
    );
    masked_cas_case(
        &l,
        old,
        0x0023_0000_0000_00ee,
        compare_mask,
        swap,
        swap_mask,
        old,
    );
    let c = l.nic.counters(l.ep.qp.qpn).unwrap();
    assert_eq!(c.by_opcode(Opcode::AtomicMaskedCs), 3);
}

#[test]
fn misaligned_atomic_is_a_remote_invalid_request() {
    let l = setup();
    l.nic
        .post_send(
            l.ep.qp.qpn,
            &[wr(
                9,
                WqeFlags::NONE,
                WrOp::FetchAdd {
                    remote: l.b.mr.remote(4),
                    add: 1,
                    result: None,
                },
            )],
        )
        .unwrap();
    let c = wait_cqes(&l.nic, l.ep.cq, 1).remove(0);
    assert_eq!(
        c.status,
        Err(redn_program::wqe::Syndrome::RemoteInvalidRequest)
    );
}

#[test]
fn nop_does_nothing_but_complete() {
    let l = setup();
    let c = run(
        &l,
        WrOp::Nop {
            raw_segments: vec![],
        },
    );
    assert_eq!(c.opcode, CqeOpcode::Req);
    assert_eq!(c.cqe.send_opcode, Opcode::Nop as u8);
    // Unsignaled WQEs produce no completion.
    l.nic
        .post_send(
            l.ep.qp.qpn,
            &[wr(
                2,
                WqeFlags::NONE,
                WrOp::Nop {
                    raw_segments: vec![],
                },
            )],
        )
        .unwrap();
    wait_until("the unsignaled NOP ran", || {
        l.nic.counters(l.ep.qp.qpn).unwrap().by_opcode(Opcode::Nop) == 2
    });
    expect_no_cqe(&l.nic, l.ep.cq, 20);
}

/// A client QP on one softnic and a server QP on another, connected in-process.
struct Pair {
    client_nic: SoftNic,
    server_nic: SoftNic,
    client: Endpoint,
    server: Endpoint,
    cbuf: Region,
    sbuf: Region,
}

fn pair() -> Pair {
    let client_nic = nic(1, Prefetch::Depth(8));
    let server_nic = nic(1, Prefetch::Depth(8));
    let cpd = client_nic.alloc_pd().unwrap();
    let spd = server_nic.alloc_pd().unwrap();
    let cbuf = Region::new(&client_nic, cpd, 4096, ALL);
    let sbuf = Region::new(&server_nic, spd, 4096, ALL);
    let client = endpoint(&client_nic, cpd, |_| {});
    let server = endpoint(&server_nic, spd, |_| {});
    SoftNic::connect_pair(&client_nic, client.qp.qpn, &server_nic, server.qp.qpn).unwrap();
    Pair {
        client_nic,
        server_nic,
        client,
        server,
        cbuf,
        sbuf,
    }
}

impl Pair {
    /// Post one signaled SEND (wr_id 1) from the client.
    fn send(&self, payload: Payload, imm: Option<u32>) {
        self.client_nic
            .post_send(
                self.client.qp.qpn,
                &[wr(1, SIG, WrOp::Send { payload, imm })],
            )
            .unwrap();
    }
}

#[test]
fn send_scatters_into_a_posted_receive_across_two_nics() {
    let p = pair();
    p.server_nic
        .post_recv(
            p.server.qp.qpn,
            77,
            &[p.sbuf.mr.sge(10, 3), p.sbuf.mr.sge(200, 8)],
        )
        .unwrap();
    p.cbuf.write(0, b"keyADDRESS!");
    p.send(Payload::Sgl(vec![p.cbuf.mr.sge(0, 11)]), Some(0xbeef));
    let sc = wait_cqes(&p.server_nic, p.server.cq, 1).remove(0);
    assert_eq!(
        (sc.wr_id, sc.opcode, sc.byte_len, sc.imm),
        (77, CqeOpcode::RespSendImm, 11, Some(0xbeef))
    );
    assert_eq!(sc.qpn, p.server.qp.qpn);
    assert_eq!(p.sbuf.read(10, 3), b"key");
    assert_eq!(p.sbuf.read(200, 8), b"ADDRESS!");
    assert!(wait_cqes(&p.client_nic, p.client.cq, 1)[0].is_ok());
    assert_eq!(p.server_nic.counters(p.server.qp.qpn).unwrap().recvs, 1);
}

/// The responder checks every entry a SEND's bytes reach before it places any, and only
/// those: a refused entry (a key that names nothing, or a window past its region) places no
/// byte anywhere and fails the receive and the SEND; an entry past the message's end is not
/// looked at.
#[test]
fn a_receive_places_nothing_if_any_entry_the_data_reaches_is_refused() {
    use redn_program::wqe::{Sge, Syndrome};
    use redn_sys::Lkey;
    let send = |p: &Pair, data: &[u8]| {
        p.send(Payload::Inline(data.to_vec()), None);
        (
            wait_cqes(&p.client_nic, p.client.cq, 1).remove(0),
            wait_cqes(&p.server_nic, p.server.cq, 1).remove(0),
        )
    };
    let unknown = |addr| Sge {
        addr,
        len: 8,
        lkey: Lkey(0x00de_ad01),
    };
    for (what, second) in [
        ("a key that names nothing", None),
        ("a window past its region's end", Some(4092)),
    ] {
        let p = pair();
        let bad = second.map_or_else(|| unknown(p.sbuf.mr.addr), |at| p.sbuf.mr.sge(at, 8));
        p.server_nic
            .post_recv(p.server.qp.qpn, 7, &[p.sbuf.mr.sge(10, 3), bad])
            .unwrap();
        let (c, s) = send(&p, b"keyADDRESS!");
        assert_eq!(c.status, Err(Syndrome::RemoteOperation), "{what}");
        assert_eq!(
            (s.wr_id, s.status),
            (7, Err(Syndrome::LocalProtection)),
            "{what}"
        );
        assert_eq!(
            p.sbuf.read(10, 3),
            [0; 3],
            "{what}: the first entry got nothing"
        );
    }
    // The message ends in the second entry: the third, whose key names nothing, is not read.
    let p = pair();
    p.server_nic
        .post_recv(
            p.server.qp.qpn,
            8,
            &[
                p.sbuf.mr.sge(10, 3),
                p.sbuf.mr.sge(200, 16),
                unknown(p.sbuf.mr.addr),
            ],
        )
        .unwrap();
    let (c, s) = send(&p, b"keyADDRESS!");
    assert!(c.is_ok(), "{c:?}");
    assert_eq!((s.wr_id, s.byte_len, s.status), (8, 11, Ok(())));
    assert_eq!(p.sbuf.read(10, 3), b"key");
    assert_eq!(p.sbuf.read(200, 9), b"ADDRESS!\0");
}

#[test]
fn write_with_immediate_consumes_a_receive() {
    let p = pair();
    p.server_nic.post_recv(p.server.qp.qpn, 5, &[]).unwrap();
    p.cbuf.write(0, b"payload");
    p.client_nic
        .post_send(
            p.client.qp.qpn,
            &[wr(
                1,
                WqeFlags::NONE,
                WrOp::Write {
                    remote: p.sbuf.mr.remote(64),
                    payload: Payload::Sgl(vec![p.cbuf.mr.sge(0, 7)]),
                    imm: Some(3),
                },
            )],
        )
        .unwrap();
    let sc = wait_cqes(&p.server_nic, p.server.cq, 1).remove(0);
    assert_eq!(
        (sc.wr_id, sc.opcode, sc.byte_len, sc.imm),
        (5, CqeOpcode::RespWriteImm, 7, Some(3))
    );
    assert_eq!(p.sbuf.read(64, 7), b"payload");
}

#[test]
fn send_without_a_receive_waits_until_one_is_posted() {
    let p = pair();
    p.send(Payload::Inline(b"hi".to_vec()), None);
    // The SEND finds no receive: it waits (and is counted), with no completion.
    wait_until("the SEND finds no receive", || {
        p.client_nic.counters(p.client.qp.qpn).unwrap().rnr_waits > 0
    });
    expect_no_cqe(&p.client_nic, p.client.cq, 20);
    p.server_nic
        .post_recv(p.server.qp.qpn, 1, &[p.sbuf.mr.sge(0, 16)])
        .unwrap();
    assert!(wait_cqes(&p.client_nic, p.client.cq, 1)[0].is_ok());
    assert_eq!(p.sbuf.read(0, 2), b"hi");
}

#[test]
fn send_longer_than_the_receive_is_refused_by_the_responder() {
    let p = pair();
    p.server_nic
        .post_recv(p.server.qp.qpn, 1, &[p.sbuf.mr.sge(0, 4)])
        .unwrap();
    p.send(Payload::Inline(b"too long".to_vec()), None);
    let c = wait_cqes(&p.client_nic, p.client.cq, 1).remove(0);
    assert_eq!(
        c.status,
        Err(redn_program::wqe::Syndrome::RemoteInvalidRequest)
    );
    let s = wait_cqes(&p.server_nic, p.server.cq, 1).remove(0);
    assert_eq!(s.status, Err(redn_program::wqe::Syndrome::LocalLength));
    assert_eq!(p.sbuf.read(0, 4), [0; 4], "nothing placed");
}

#[test]
fn wait_send_en_and_recv_en() {
    let nic = nic(2, Prefetch::Depth(8));
    let pd = nic.alloc_pd().unwrap();
    let buf = Region::new(&nic, pd, 4096, ALL);
    let master = endpoint(&nic, pd, |_| {});
    let counted = endpoint(&nic, pd, |_| {});
    let managed = endpoint(&nic, pd, |c| {
        c.managed_send = true;
        c.managed_recv = true;
        c.pu = Some(1);
    });
    for q in [master.qp.qpn, counted.qp.qpn, managed.qp.qpn] {
        nic.connect(q, q).unwrap();
    }
    // The managed queue holds a WRITE; posting does not run it.
    buf.write(0, b"X");
    nic.post_send(
        managed.qp.qpn,
        &[wr(
            1,
            SIG,
            WrOp::Write {
                remote: buf.mr.remote(100),
                payload: Payload::Sgl(vec![buf.mr.sge(0, 1)]),
                imm: None,
            },
        )],
    )
    .unwrap();
    // The master waits for one completion on `counted`'s CQ, then enables the managed queue.
    nic.post_send(
        master.qp.qpn,
        &[
            wr(
                2,
                WqeFlags::NONE,
                WrOp::Wait {
                    cq: counted.cq,
                    count: 0,
                },
            ),
            wr(
                3,
                SIG,
                WrOp::SendEnable {
                    qp: managed.qp.qpn,
                    pi: 1,
                },
            ),
        ],
    )
    .unwrap();
    wait_until("the master's WAIT stalls", || {
        nic.counters(master.qp.qpn).unwrap().wait_stalls == 1
    });
    expect_no_cqe(&nic, managed.cq, 20);
    assert_eq!(buf.read(100, 1), [0]);
    // One completion on `counted` releases the chain.
    nic.post_send(
        counted.qp.qpn,
        &[wr(
            4,
            SIG,
            WrOp::Nop {
                raw_segments: vec![],
            },
        )],
    )
    .unwrap();
    wait_cqes(&nic, managed.cq, 1);
    assert_eq!(buf.read(100, 1), b"X");
    let m = wait_cqes(&nic, master.cq, 1).remove(0);
    assert_eq!(m.wr_id, 3);

    // RECV_EN: a managed receive queue does not take a posted receive until enabled.
    nic.post_recv(managed.qp.qpn, 9, &[buf.mr.sge(200, 8)])
        .unwrap();
    // The managed QP is connected to itself: its SEND lands in its own managed receive queue.
    nic.post_send(
        managed.qp.qpn,
        &[wr(
            6,
            SIG,
            WrOp::Send {
                payload: Payload::Inline(b"late".to_vec()),
                imm: None,
            },
        )],
    )
    .unwrap();
    nic.post_send(
        master.qp.qpn,
        &[wr(
            7,
            SIG,
            WrOp::SendEnable {
                qp: managed.qp.qpn,
                pi: 2,
            },
        )],
    )
    .unwrap();
    wait_until("the managed SEND finds its receive not enabled", || {
        nic.counters(managed.qp.qpn).unwrap().rnr_waits > 0
    });
    expect_no_cqe(&nic, managed.cq, 20);
    assert_eq!(buf.read(200, 4), [0; 4]);
    nic.post_send(
        master.qp.qpn,
        &[wr(
            8,
            SIG,
            WrOp::RecvEnable {
                qp: managed.qp.qpn,
                pi: 1,
            },
        )],
    )
    .unwrap();
    let got = wait_cqes(&nic, managed.cq, 2);
    assert!(got
        .iter()
        .any(|c| c.wr_id == 9 && c.opcode == CqeOpcode::RespSend));
    assert_eq!(buf.read(200, 4), b"late");
}

#[test]
fn enable_of_an_unmanaged_or_unknown_queue_is_a_local_qp_operation_error() {
    let nic = nic(1, Prefetch::Depth(8));
    let pd = nic.alloc_pd().unwrap();
    let a = endpoint(&nic, pd, |_| {});
    let b = endpoint(&nic, pd, |_| {});
    nic.connect(a.qp.qpn, a.qp.qpn).unwrap();
    nic.post_send(
        a.qp.qpn,
        &[wr(
            1,
            SIG,
            WrOp::SendEnable {
                qp: b.qp.qpn,
                pi: 1,
            },
        )],
    )
    .unwrap();
    let c = wait_cqes(&nic, a.cq, 1).remove(0);
    assert_eq!(c.status, Err(redn_program::wqe::Syndrome::LocalQpOperation));
    let c2 = endpoint(&nic, pd, |_| {});
    nic.connect(c2.qp.qpn, c2.qp.qpn).unwrap();
    nic.post_send(
        c2.qp.qpn,
        &[wr(
            1,
            SIG,
            WrOp::Wait {
                cq: Cqn(0xabcd),
                count: 0,
            },
        )],
    )
    .unwrap();
    assert_eq!(
        wait_cqes(&nic, c2.cq, 1)[0].status,
        Err(redn_program::wqe::Syndrome::LocalQpOperation)
    );
}
