//! Byte-exact checks of the encoder and decoder against the layouts mlx5 defines.

use super::*;

fn sge(addr: u64, len: u32, lkey: u32) -> Sge {
    Sge {
        addr: VirtAddr(addr),
        len,
        lkey: Lkey(lkey),
    }
}

#[test]
fn ctrl_segment_golden_bytes() {
    let c = CtrlSeg {
        opmod: 0,
        wqe_index: 0x0102,
        opcode: Opcode::RdmaWriteImm as u8,
        qpn: Qpn(0x00abcdef),
        ds: 3,
        signature: 0,
        flags: WqeFlags::SIGNALED | WqeFlags::FENCE,
        imm: 0x11223344,
    };
    let b = c.encode();
    assert_eq!(
        b,
        [
            0x00, 0x01, 0x02, 0x09, 0xab, 0xcd, 0xef, 0x03, 0x00, 0x00, 0x00, 0x88, 0x11, 0x22,
            0x33, 0x44
        ]
    );
    assert_eq!(CtrlSeg::decode(&b), c);
}

/// `encode_wqe_into` writes every byte of the WQE's blocks, whatever the buffer held.
#[test]
fn encoding_into_a_dirty_buffer_gives_the_same_bytes() {
    let remote = RemoteAddr {
        addr: VirtAddr(0x1000),
        rkey: Rkey(0x200),
    };
    let ops = [
        WrOp::Nop {
            raw_segments: vec![],
        },
        WrOp::Write {
            remote,
            payload: Payload::Inline(vec![7; 5]),
            imm: Some(3),
        },
        WrOp::Write {
            remote,
            payload: Payload::Inline(vec![9; 44]),
            imm: None,
        },
        WrOp::Read {
            remote,
            sgl: vec![sge(1, 3, 5), sge(2, 8, 5), sge(3, 8, 5)],
        },
        WrOp::FetchAdd {
            remote,
            add: 1,
            result: Some(sge(8, 8, 5)),
        },
        WrOp::Wait {
            cq: Cqn(4),
            count: 9,
        },
    ];
    let mut dirty = [0xa5u8; MAX_WQE_BYTES];
    for op in ops {
        let wr = WorkRequest {
            wr_id: 0,
            flags: WqeFlags::SIGNALED,
            op,
        };
        let clean = encode_wqe(&wr, Qpn(7), 4).unwrap();
        let ds = encode_wqe_into(&wr, Qpn(7), 4, &mut dirty).unwrap();
        assert_eq!(ds, clean.ds());
        assert_eq!(&dirty[..clean.bytes().len()], clean.bytes(), "{:?}", wr.op);
        dirty.fill(0xa5);
    }
}

#[test]
fn read_with_three_scatter_entries_takes_two_bbs() {
    let wr = WorkRequest {
        wr_id: 1,
        flags: WqeFlags::SIGNALED,
        op: WrOp::Read {
            remote: RemoteAddr {
                addr: VirtAddr(0x1000),
                rkey: Rkey(0x200),
            },
            sgl: vec![sge(1, 3, 5), sge(2, 8, 5), sge(3, 8, 5)],
        },
    };
    let e = encode_wqe(&wr, Qpn(7), 4).unwrap();
    assert_eq!(e.ds(), 5);
    assert_eq!(e.bbs(), 2);
    assert_eq!(e.bytes().len(), 128);
    let d = decode_wqe(e.bytes()).unwrap();
    assert_eq!(d.op, wr.op);
    assert_eq!(d.ctrl.wqe_index, 4);
}

#[test]
fn zero_length_sges_are_skipped() {
    let wr = WorkRequest {
        wr_id: 0,
        flags: WqeFlags::NONE,
        op: WrOp::Send {
            payload: Payload::Sgl(vec![sge(1, 0, 5), sge(2, 8, 5)]),
            imm: None,
        },
    };
    let e = encode_wqe(&wr, Qpn(1), 0).unwrap();
    assert_eq!(e.ds(), 2);
}

/// A data segment's byte count has 31 bits (bit 31 marks inline data), so a longer
/// scatter/gather entry is refused rather than encoded as something else.
#[test]
fn a_scatter_gather_entry_of_2_gib_or_more_is_refused() {
    let write = |len| WorkRequest {
        wr_id: 0,
        flags: WqeFlags::NONE,
        op: WrOp::Write {
            remote: RemoteAddr {
                addr: VirtAddr(0),
                rkey: Rkey(1),
            },
            payload: Payload::Sgl(vec![sge(0, 8, 2), sge(0, len, 2)]),
            imm: None,
        },
    };
    assert!(encode_wqe(&write(INLINE_FLAG - 1), Qpn(1), 0).is_ok());
    assert_eq!(
        encode_wqe(&write(INLINE_FLAG), Qpn(1), 0).err(),
        Some(WqeError::SgeTooLong(INLINE_FLAG))
    );
}

/// An atomic's result segment moves 8 bytes whatever its byte count says (the executor
/// writes 8): a ring patched to another count still decodes, and re-encodes, as 8.
#[test]
fn an_atomic_result_decodes_as_eight_bytes_whatever_its_count() {
    let wr = WorkRequest {
        wr_id: 0,
        flags: WqeFlags::SIGNALED,
        op: WrOp::FetchAdd {
            remote: RemoteAddr {
                addr: VirtAddr(64),
                rkey: Rkey(7),
            },
            add: 1,
            result: Some(sge(0x10, 8, 3)),
        },
    };
    let mut b = encode_wqe(&wr, Qpn(1), 0).unwrap().bytes().to_vec();
    for count in [0u32, 3, 4096] {
        Be32::new(count).write(&mut b, 3 * SEG_SIZE);
        let d = decode_wqe(&b).unwrap();
        assert_eq!(d.op, wr.op, "byte count {count}");
    }
}

#[test]
fn every_opcode_round_trips() {
    let r = RemoteAddr {
        addr: VirtAddr(0xdead_beef_0000),
        rkey: Rkey(0x1234_5600),
    };
    let res = Some(sge(0x10, 8, 3));
    let ops = vec![
        WrOp::Nop {
            raw_segments: vec![[7u8; 16]],
        },
        WrOp::Write {
            remote: r,
            payload: Payload::Sgl(vec![sge(5, 64, 9)]),
            imm: None,
        },
        WrOp::Write {
            remote: r,
            payload: Payload::Inline(b"hello, inline".to_vec()),
            imm: Some(42),
        },
        WrOp::Send {
            payload: Payload::Sgl(vec![sge(5, 3, 9), sge(9, 8, 9)]),
            imm: None,
        },
        WrOp::Send {
            payload: Payload::Inline(vec![1, 2, 3]),
            imm: Some(0xfeed),
        },
        WrOp::Read {
            remote: r,
            sgl: vec![sge(8, 11, 2)],
        },
        WrOp::CompareSwap {
            remote: r,
            compare: 1,
            swap: 2,
            result: res,
        },
        WrOp::FetchAdd {
            remote: r,
            add: 6,
            result: None,
        },
        WrOp::MaskedCompareSwap {
            remote: r,
            compare: 1,
            compare_mask: 0xff,
            swap: 3,
            swap_mask: 0xf0,
            result: res,
        },
        WrOp::MaskedFetchAdd {
            remote: r,
            add: 1,
            field_boundary: 1 << 31,
            result: res,
        },
        WrOp::Wait {
            cq: Cqn(0x55),
            count: 9,
        },
        WrOp::SendEnable {
            qp: Qpn(0x66),
            pi: 12,
        },
        WrOp::RecvEnable {
            qp: Qpn(0x77),
            pi: 3,
        },
    ];
    let mut seen = std::collections::HashSet::new();
    for op in ops {
        seen.insert(op.opcode());
        let wr = WorkRequest {
            wr_id: 0,
            flags: WqeFlags::SIGNALED,
            op,
        };
        let e = encode_wqe(&wr, Qpn(0x42), 0xffff).unwrap();
        assert_eq!(e.bytes().len() % BB_SIZE, 0);
        let d = decode_wqe(e.bytes()).unwrap();
        assert_eq!(d.op, wr.op, "round trip of {}", wr.op.opcode());
        assert_eq!(d.ctrl.opcode, wr.op.opcode() as u8);
        assert_eq!(d.ctrl.qpn, Qpn(0x42));
        assert_eq!(d.ctrl.flags, WqeFlags::SIGNALED);
    }
    assert_eq!(seen.len(), Opcode::ALL.len());
}

#[test]
fn oversized_requests_are_refused() {
    let wr = WorkRequest {
        wr_id: 0,
        flags: WqeFlags::NONE,
        op: WrOp::Send {
            payload: Payload::Sgl(vec![sge(1, 1, 1); 63]),
            imm: None,
        },
    };
    assert_eq!(
        encode_wqe(&wr, Qpn(1), 0).unwrap_err(),
        WqeError::TooLarge(64)
    );
    let wait = WorkRequest {
        wr_id: 0,
        flags: WqeFlags::NONE,
        op: WrOp::Wait {
            cq: Cqn(1 << 24),
            count: 0,
        },
    };
    assert!(matches!(
        encode_wqe(&wait, Qpn(1), 0),
        Err(WqeError::ObjectNumberTooWide(_))
    ));
}

#[test]
fn decode_rejects_garbage() {
    let mut b = [0u8; 64];
    b[3] = 0x25; // UMR
    b[7] = 1;
    assert_eq!(decode_wqe(&b).unwrap_err(), WqeError::UnknownOpcode(0x25));
    b[3] = Opcode::AtomicCs as u8;
    assert!(matches!(decode_wqe(&b), Err(WqeError::DsTooSmall { .. })));
    b[7] = 8;
    assert!(matches!(decode_wqe(&b), Err(WqeError::Truncated { .. })));
}

#[test]
fn recv_wqe_has_terminator() {
    let b = encode_recv(&[sge(0x100, 3, 7), sge(0x200, 8, 7)], 4).unwrap();
    assert_eq!(b.len(), 64);
    assert_eq!(Be32::read(&b, 32 + 4), Be32::new(INVALID_LKEY));
    assert_eq!(decode_recv(&b).len(), 2);
    let full = encode_recv(&[sge(1, 1, 1)], 1).unwrap();
    assert_eq!(decode_recv(&full).len(), 1);
}

#[test]
fn cqe_golden_bytes() {
    let c = Cqe {
        opcode: CqeOpcode::RespSendImm,
        qpn: Qpn(0x000102),
        send_opcode: 0,
        wqe_counter: 0x0a0b,
        byte_cnt: 11,
        imm: 0xcafe,
        syndrome: 0,
        vendor_syndrome: 0,
        timestamp: 0x0102_0304_0506_0708,
        owner: true,
    };
    let b = c.encode();
    assert_eq!(&b[36..40], &[0, 0, 0xca, 0xfe]);
    assert_eq!(&b[44..48], &[0, 0, 0, 11]);
    assert_eq!(
        &b[48..56],
        &[1, 2, 3, 4, 5, 6, 7, 8],
        "mlx5_cqe64.timestamp, big-endian"
    );
    assert_eq!(&b[56..60], &[0, 0, 1, 2]);
    assert_eq!(&b[60..62], &[0x0a, 0x0b]);
    assert_eq!(b[63], 0x31);
    assert_eq!(Cqe::decode(&b), Some(c));

    let e = Cqe {
        opcode: CqeOpcode::ReqErr,
        qpn: Qpn(5),
        send_opcode: Opcode::RdmaWrite as u8,
        wqe_counter: 3,
        byte_cnt: 0,
        imm: 0,
        syndrome: Syndrome::RemoteAccess as u8,
        vendor_syndrome: 0x88,
        timestamp: 0,
        owner: false,
    };
    let b = e.encode();
    assert_eq!(b[55], 0x13);
    assert_eq!(b[54], 0x88);
    assert_eq!(b[56], 0x08);
    assert_eq!(b[63], 0xd0);
    assert_eq!(Cqe::decode(&b), Some(e));
    // An error CQE has no timestamp: mlx5_err_cqe reserves 48..54 and puts the
    // syndromes at 54..56, so a timestamp given to one is not encoded.
    let stamped = Cqe {
        timestamp: u64::MAX,
        ..e
    };
    let b = stamped.encode();
    assert_eq!(&b[48..54], &[0; 6]);
    assert_eq!((b[54], b[55]), (0x88, 0x13));
    assert_eq!(Cqe::decode(&b).map(|c| c.timestamp), Some(0));
}
