//! The cross-channel WQEs (CQE_WAIT, SEND_EN, RECV_EN) and the masked-CAS segment, which
//! rdma-core's `mlx5dv.h` does not define (so `mlx5dv_layout.rs` cannot check them), checked
//! against byte images written out by hand here from the layouts that other drivers of the
//! same hardware publish. Nothing in this file is computed with `redn_program`'s own field
//! writers or offsets: each image is a literal, its bytes annotated.
//!
//! Sources (public driver code for ConnectX, read for this test):
//! - DPDK `drivers/common/mlx5/mlx5_prm.h`:
//!   - `struct mlx5_wqe_cseg { uint32_t opcode; uint32_t sq_ds; uint32_t flags; uint32_t misc; }`,
//!     big-endian; `opcode` holds "Bits 31:24 OPC_MOD, Bits 23:8 wqe_index, Bits 7:0 OPCODE";
//!     `sq_ds` is `qpn << 8 | ds`; `flags` carries the completion mode at
//!     `MLX5_COMP_MODE_OFFSET` (2), `MLX5_COMP_ALWAYS` = 2, so a signaled WQE has 0x08 in its
//!     last byte;
//!   - `struct mlx5_wqe_qseg { uint32_t reserved0; uint32_t reserved1; uint32_t max_index;
//!     uint32_t qpn_cqn; }`, the 16-byte segment after the control segment;
//!   - "Missed in mlx5dv.h, should define here": `MLX5_OPCODE_SEND_EN 0x17u`,
//!     `MLX5_OPCODE_WAIT 0x0fu`.
//! - DPDK `drivers/net/mlx5/mlx5_txpp.c`, `mlx5_txpp_fill_wqe_rearm_queue`: builds SEND_EN
//!   and WAIT WQEs as `cs->opcode = RTE_BE32(MLX5_OPCODE_SEND_EN | 0)`, `cs->sq_ds =
//!   rte_cpu_to_be_32((sq id << 8) | 2)`, `qs->max_index = rte_cpu_to_be_32(index)`,
//!   `qs->qpn_cqn = rte_cpu_to_be_32(slave SQ number, or CQ number for WAIT)`.
//! - MLNX_OFED libmlx5 `src/wqe.h`: `struct mlx5_wqe_wait_en_seg { uint8_t rsvd0[8]; uint32_t
//!   pi; uint32_t obj_num; }`; `src/qp.c`, `set_wait_en_seg(seg, obj_num, count)`:
//!   `seg->pi = htonl(count); seg->obj_num = htonl(obj_num);` (the CQN for CQE_WAIT, the
//!   target QPN for SEND_ENABLE / RECV_ENABLE); `src/mlx5.h`: `MLX5_OPCODE_SEND_ENABLE = 0x17`,
//!   `MLX5_OPCODE_RECV_ENABLE = 0x16`, `MLX5_OPCODE_CQE_WAIT = 0x0f`; `src/qp.c`:
//!   `MLX5_OPCODE_EXT_ATOMICS = 0x08`, the opmod of extended atomics, ORed with
//!   log2(argument size) - 2 (1 for 8 bytes).
//! - Linux `include/linux/mlx5/qp.h` (and libmlx5's `src/wqe.h`): `struct
//!   mlx5_wqe_masked_atomic_seg { __be64 swap_add; __be64 compare; __be64 swap_add_mask;
//!   __be64 compare_mask; }`, after the remote-address segment.
//!
//! The project's summary of these sources: `shared/reference/redn-programs.md` §1.2, §1.5,
//! §1.8 and `shared/reference/mlx5-hardware.md` §1.4.

use redn_program::wqe::{decode_wqe, encode_wqe, RemoteAddr, WorkRequest, WqeFlags, WrOp, BB_SIZE};
use redn_program::{Cqn, Qpn, Rkey, VirtAddr};

/// One 64-byte basic block from its four 16-byte segments.
fn bb(segs: [[u8; 16]; 4]) -> [u8; BB_SIZE] {
    let mut out = [0u8; BB_SIZE];
    for (i, s) in segs.iter().enumerate() {
        out[i * 16..(i + 1) * 16].copy_from_slice(s);
    }
    out
}

const ZERO: [u8; 16] = [0; 16];

/// Our encoding of `op` (issued on QP `qpn` at producer index `idx`) is exactly `image`, and
/// `image` decodes back to `op`.
fn check(name: &str, op: WrOp, flags: WqeFlags, qpn: u32, idx: u16, image: &[u8]) {
    let wr = WorkRequest {
        wr_id: 0,
        flags,
        op: op.clone(),
    };
    let ours = encode_wqe(&wr, Qpn(qpn), idx).unwrap_or_else(|e| panic!("{name}: {e}"));
    assert_eq!(
        ours.bytes(),
        image,
        "{name}: our bytes differ from the image"
    );
    let back = decode_wqe(image).unwrap_or_else(|e| panic!("{name}: {e}"));
    assert_eq!(
        back.op, op,
        "{name}: the image decodes to another operation"
    );
}

#[test]
fn cqe_wait_matches_the_published_wait_segment() {
    // As DPDK's rearm queue builds its WAIT (completion only on error) and libmlx5's
    // set_wait_en_seg(seg, cqn, count): WAIT for CQE #5 of CQ 0x000123, issued by QP
    // 0xabcdef at index 0x1234.
    let image = bb([
        [
            0x00, 0x12, 0x34, 0x0f, // OPC_MOD 0, wqe_index 0x1234, opcode WAIT
            0xab, 0xcd, 0xef, 0x02, // qpn, ds 2 (ctrl + wait segment)
            0x00, 0x00, 0x00, 0x00, // signature, reserved, no completion requested
            0x00, 0x00, 0x00, 0x00, // misc / imm
        ],
        [
            0x00, 0x00, 0x00, 0x00, // reserved0 / rsvd0[0..4]
            0x00, 0x00, 0x00, 0x00, // reserved1 / rsvd0[4..8]
            0x00, 0x00, 0x00, 0x05, // max_index / pi, big-endian
            0x00, 0x00, 0x01, 0x23, // qpn_cqn / obj_num: the CQ
        ],
        ZERO,
        ZERO,
    ]);
    check(
        "wait",
        WrOp::Wait {
            cq: Cqn(0x00_0123),
            count: 5,
        },
        WqeFlags::NONE,
        0x00ab_cdef,
        0x1234,
        &image,
    );
    // Every field at its widest: a 32-bit count, a 24-bit CQN, index 0xffff, signaled.
    let image = bb([
        [
            0x00, 0xff, 0xff, 0x0f, //
            0xff, 0xff, 0xff, 0x02, //
            0x00, 0x00, 0x00, 0x08, // MLX5_COMP_ALWAYS << MLX5_COMP_MODE_OFFSET
            0x00, 0x00, 0x00, 0x00, //
        ],
        [
            0x00, 0x00, 0x00, 0x00, //
            0x00, 0x00, 0x00, 0x00, //
            0xfe, 0xdc, 0xba, 0x98, //
            0x00, 0xff, 0xff, 0xff, //
        ],
        ZERO,
        ZERO,
    ]);
    check(
        "wait (widest)",
        WrOp::Wait {
            cq: Cqn(0x00ff_ffff),
            count: 0xfedc_ba98,
        },
        WqeFlags::SIGNALED,
        0x00ff_ffff,
        0xffff,
        &image,
    );
}

#[test]
fn send_enable_matches_the_published_enable_segment() {
    // As DPDK's rearm queue builds its SEND_EN (completion always): enable the managed SQ
    // 0x000042 up to producer index 0x00010002, issued by QP 0x000007 at index 0.
    let image = bb([
        [
            0x00, 0x00, 0x00, 0x17, // OPC_MOD 0, wqe_index 0, opcode SEND_EN
            0x00, 0x00, 0x07, 0x02, // qpn 7, ds 2
            0x00, 0x00, 0x00, 0x08, // MLX5_COMP_ALWAYS << MLX5_COMP_MODE_OFFSET
            0x00, 0x00, 0x00, 0x00, //
        ],
        [
            0x00, 0x00, 0x00, 0x00, //
            0x00, 0x00, 0x00, 0x00, //
            0x00, 0x01, 0x00, 0x02, // max_index / pi
            0x00, 0x00, 0x00, 0x42, // qpn_cqn / obj_num: the managed QP
        ],
        ZERO,
        ZERO,
    ]);
    check(
        "send_en",
        WrOp::SendEnable {
            qp: Qpn(0x42),
            pi: 0x0001_0002,
        },
        WqeFlags::SIGNALED,
        7,
        0,
        &image,
    );
}

#[test]
fn recv_enable_matches_the_published_enable_segment() {
    // libmlx5's RECV_ENABLE (DPDK does not use it): the same segment with opcode 0x16, the
    // target QPN and the new receive index. Fenced, to show the fence bits (0x80) too.
    let image = bb([
        [
            0x00, 0x80, 0x01, 0x16, // OPC_MOD 0, wqe_index 0x8001, opcode RECV_EN
            0x12, 0x34, 0x56, 0x02, // qpn 0x123456, ds 2
            0x00, 0x00, 0x00, 0x80, // fence
            0x00, 0x00, 0x00, 0x00, //
        ],
        [
            0x00, 0x00, 0x00, 0x00, //
            0x00, 0x00, 0x00, 0x00, //
            0x00, 0x00, 0x00, 0x03, // pi 3
            0x00, 0x65, 0x43, 0x21, // the managed QP 0x654321
        ],
        ZERO,
        ZERO,
    ]);
    check(
        "recv_en",
        WrOp::RecvEnable {
            qp: Qpn(0x0065_4321),
            pi: 3,
        },
        WqeFlags::FENCE,
        0x0012_3456,
        0x8001,
        &image,
    );
}

#[test]
fn masked_cas_matches_the_published_masked_atomic_segment() {
    // ctrl, remote-address segment, then the 32-byte masked atomic segment (swap_add,
    // compare, swap_add_mask, compare_mask, each big-endian): ds 4, one BB, opmod 0x09
    // (MLX5_OPCODE_EXT_ATOMICS | log2(8) - 2).
    let image = bb([
        [
            0x09, 0x00, 0x05, 0x14, // OPC_MOD 0x09, wqe_index 5, opcode ATOMIC_MASKED_CS
            0x00, 0x00, 0x42, 0x04, // qpn 0x42, ds 4
            0x00, 0x00, 0x00, 0x08, // signaled
            0x00, 0x00, 0x00, 0x00, //
        ],
        [
            0xde, 0xad, 0xbe, 0xef, 0x00, 0x00, 0x10, 0x08, // raddr
            0x12, 0x34, 0x56, 0x78, // rkey
            0x00, 0x00, 0x00, 0x00, // reserved
        ],
        [
            0x01, 0x02, 0x03, 0x04, 0x05, 0x06, 0x07, 0x08, // swap_add
            0xf0, 0xe0, 0xd0, 0xc0, 0xb0, 0xa0, 0x90, 0x80, // compare
        ],
        [
            0xff, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x0f, // swap_add_mask
            0x80, 0x00, 0x00, 0x01, 0x00, 0x00, 0x00, 0x00, // compare_mask
        ],
    ]);
    check(
        "masked_cas",
        WrOp::MaskedCompareSwap {
            remote: RemoteAddr {
                addr: VirtAddr(0xdead_beef_0000_1008),
                rkey: Rkey(0x1234_5678),
            },
            compare: 0xf0e0_d0c0_b0a0_9080,
            compare_mask: 0x8000_0001_0000_0000,
            swap: 0x0102_0304_0506_0708,
            swap_mask: 0xff00_0000_0000_000f,
            result: None,
        },
        WqeFlags::SIGNALED,
        0x42,
        5,
        &image,
    );
}
