//! Checks the mlx5 layout in `redn_program::wqe` against rdma-core's `infiniband/mlx5dv.h`.
//!
//! At test time a small C program is generated, compiled with `cc` (or `$CC`) and run. It prints
//! one `name value` line per fact: the header's field offsets, struct sizes and enum values, and
//! golden bytes built with the header's own structs and inline encoders (`mlx5dv_set_ctrl_seg`,
//! `mlx5dv_set_data_seg`, `mlx5dv_set_cqe_owner`). Our constants, offsets and encoders must agree
//! byte for byte.
//!
//! If the check cannot run here (no header, no C compiler), each test fails under CI (the
//! environment variable `CI` set, to any value): CI must run the check. Elsewhere each test
//! prints a `SKIPPED mlx5dv_layout::TEST: why` line to the terminal (past libtest's capture)
//! and returns; libtest still counts it as passed, so look for those lines.
//!
//! The header lacks the cross-channel opcodes (WAIT, SEND_EN, RECV_EN), their wait/enable
//! segment, the masked-atomic segments and the extended-atomic opmod: those are checked against
//! byte images written from other drivers' published layouts in `cross_channel_layout.rs`.

use redn_program::types::MAX_QPN;
use redn_program::wqe::{
    encode_wqe, off, Cqe, CqeOpcode, CtrlSeg, Opcode, Payload, RemoteAddr, Sge, Syndrome,
    WorkRequest, WqeFlags, WrOp, BB_SIZE, CQE_SIZE, CQE_TIMESTAMP, INLINE_FLAG, INVALID_LKEY,
    MAX_DS, OPMOD_EXT_ATOMIC_8B, SEG_SIZE,
};
use redn_program::{Lkey, Qpn, Rkey, VirtAddr};
use std::collections::HashMap;
use std::fmt::Write as _;
use std::io::Write as _;
use std::path::Path;
use std::process::Command;
use std::sync::OnceLock;
use std::time::{SystemTime, UNIX_EPOCH};

const HEADER: &str = "/usr/include/infiniband/mlx5dv.h";

/// CQE byte offsets `Cqe::encode` writes (literals there, mirrored here).
const CQE_IMM: usize = 36;
const CQE_BYTE_CNT: usize = 44;
const CQE_VENDOR_SYND: usize = 54;
const CQE_SYNDROME: usize = 55;
const CQE_SOP_DROP_QPN: usize = 56;
const CQE_WQE_COUNTER: usize = 60;
const CQE_OP_OWN: usize = 63;

// Operands of the whole-WQE and CQE golden cases, shared with the C program as #defines.
const QPN: u32 = 0x00ab_cdef;
const IDX: u16 = 0xfffe;
const RADDR: u64 = 0xdead_beef_0000_1008;
const RKEY: u32 = 0x1234_5678;
const LADDR: u64 = 0x0000_7f00_1234_5670;
const LKEY: u32 = 0x0bad_c0de;
const LEN: u32 = 0x0001_0203;
const SWAP: u64 = 0x0102_0304_0506_0708;
const COMPARE: u64 = 0xf0e0_d0c0_b0a0_9080;
const ADD: u64 = 0x0000_0001_0000_0002;
const IMM: u32 = 0xcafe_f00d;
const BYTES: u32 = 0x0000_1234;
const VENDOR: u8 = 0x88;
const TSTAMP: u64 = 0x0011_2233_4455_6677;
/// 21 bytes: the inline segment takes two 16-byte segments.
const INLINE: &str = "inline payload bytes!";

/// Control segments encoded by both sides.
fn ctrl_cases() -> Vec<CtrlSeg> {
    vec![
        CtrlSeg {
            opmod: 0,
            wqe_index: 0x0102,
            opcode: Opcode::RdmaWriteImm as u8,
            qpn: Qpn(QPN),
            ds: 3,
            signature: 0,
            flags: WqeFlags::SIGNALED | WqeFlags::FENCE,
            imm: 0x1122_3344,
        },
        CtrlSeg {
            opmod: OPMOD_EXT_ATOMIC_8B,
            wqe_index: 0xffff,
            opcode: Opcode::AtomicMaskedCs as u8,
            qpn: Qpn(MAX_QPN),
            ds: MAX_DS,
            signature: 0xa5,
            flags: WqeFlags::SOLICITED | WqeFlags::INITIATOR_SMALL_FENCE,
            imm: 0xdead_beef,
        },
        CtrlSeg::default(),
        CtrlSeg {
            opmod: 0,
            wqe_index: 0x8000,
            opcode: Opcode::Send as u8,
            qpn: Qpn(1),
            ds: 1,
            signature: 0,
            flags: WqeFlags::SIGNALED,
            imm: 0,
        },
        CtrlSeg {
            opmod: 0,
            wqe_index: 7,
            opcode: Opcode::RdmaRead as u8,
            qpn: Qpn(0x100),
            ds: 5,
            signature: 0xff,
            flags: WqeFlags::STRONG_ORDERING | WqeFlags::SIGNALED,
            imm: 0x8000_0001,
        },
    ]
}

fn sge(addr: u64, len: u32, lkey: u32) -> Sge {
    Sge {
        addr: VirtAddr(addr),
        len,
        lkey: Lkey(lkey),
    }
}

/// Data segments encoded by both sides.
fn data_cases() -> Vec<Sge> {
    vec![
        sge(0x0123_4567_89ab_cdef, 0x1000, 0x00c0_ffee),
        sge(0, 0, INVALID_LKEY),
        sge(u64::MAX, u32::MAX, u32::MAX - 1),
        sge(0x7fff_0000_0010, 8, 0x0100_0001),
    ]
}

fn remote() -> RemoteAddr {
    RemoteAddr {
        addr: VirtAddr(RADDR),
        rkey: Rkey(RKEY),
    }
}

/// Whole WQEs: our `encode_wqe` against the same WQE laid out with the header's structs in
/// `C_BODY` (same name).
fn wqe_cases() -> Vec<(&'static str, WorkRequest)> {
    let local = |i: u32| sge(LADDR + u64::from(i) * 0x100, LEN + i, LKEY);
    let wr = |flags, op| WorkRequest {
        wr_id: 0,
        flags,
        op,
    };
    vec![
        (
            "wqe.nop",
            wr(
                WqeFlags::SIGNALED,
                WrOp::Nop {
                    raw_segments: vec![],
                },
            ),
        ),
        (
            "wqe.write",
            wr(
                WqeFlags::SIGNALED,
                WrOp::Write {
                    remote: remote(),
                    payload: Payload::Sgl(vec![local(0)]),
                    imm: None,
                },
            ),
        ),
        (
            "wqe.write_imm_inline",
            wr(
                WqeFlags::SIGNALED | WqeFlags::SOLICITED,
                WrOp::Write {
                    remote: remote(),
                    payload: Payload::Inline(INLINE.as_bytes().to_vec()),
                    imm: Some(IMM),
                },
            ),
        ),
        (
            "wqe.send",
            wr(
                WqeFlags::SIGNALED | WqeFlags::FENCE,
                WrOp::Send {
                    payload: Payload::Sgl(vec![local(0), local(1)]),
                    imm: None,
                },
            ),
        ),
        (
            "wqe.read",
            wr(
                WqeFlags::NONE,
                WrOp::Read {
                    remote: remote(),
                    sgl: vec![local(0), local(1), local(2)],
                },
            ),
        ),
        (
            "wqe.cas",
            wr(
                WqeFlags::SIGNALED | WqeFlags::FENCE,
                WrOp::CompareSwap {
                    remote: remote(),
                    compare: COMPARE,
                    swap: SWAP,
                    result: Some(local(0)),
                },
            ),
        ),
        (
            "wqe.faa",
            wr(
                WqeFlags::SIGNALED,
                WrOp::FetchAdd {
                    remote: remote(),
                    add: ADD,
                    result: Some(local(0)),
                },
            ),
        ),
    ]
}

/// CQEs: our `Cqe::encode` against the same CQE filled in through the header's structs in
/// `C_BODY` (same name).
fn cqe_cases() -> Vec<(&'static str, Cqe)> {
    vec![
        (
            "cqe.resp_send_imm",
            Cqe {
                opcode: CqeOpcode::RespSendImm,
                qpn: Qpn(QPN),
                send_opcode: 0,
                wqe_counter: IDX,
                byte_cnt: BYTES,
                imm: IMM,
                syndrome: 0,
                vendor_syndrome: 0,
                timestamp: TSTAMP,
                owner: true,
            },
        ),
        (
            "cqe.req_read",
            Cqe {
                opcode: CqeOpcode::Req,
                qpn: Qpn(QPN),
                send_opcode: Opcode::RdmaRead as u8,
                wqe_counter: IDX,
                byte_cnt: BYTES,
                imm: 0,
                syndrome: 0,
                vendor_syndrome: 0,
                timestamp: TSTAMP,
                owner: false,
            },
        ),
        (
            "cqe.req_err",
            Cqe {
                opcode: CqeOpcode::ReqErr,
                qpn: Qpn(QPN),
                send_opcode: Opcode::RdmaWrite as u8,
                wqe_counter: IDX,
                byte_cnt: 0,
                imm: 0,
                syndrome: Syndrome::RemoteAccess as u8,
                vendor_syndrome: VENDOR,
                timestamp: 0,
                owner: true,
            },
        ),
        (
            "cqe.resp_err",
            Cqe {
                opcode: CqeOpcode::RespErr,
                qpn: Qpn(QPN),
                send_opcode: 0,
                wqe_counter: IDX,
                byte_cnt: 0,
                imm: 0,
                syndrome: Syndrome::WrFlush as u8,
                vendor_syndrome: VENDOR,
                timestamp: 0,
                owner: false,
            },
        ),
    ]
}

/// The fixed part of the C program: offsets, sizes, enum values, whole WQEs and CQEs. The
/// generated part (ctrl and data segment cases, #defines) is added around it.
const C_BODY: &str = r#"
#define OFF(s, f) printf("off." #s "." #f " %zu\n", offsetof(struct s, f))
#define SIZE(s) printf("size." #s " %zu\n", sizeof(struct s))
#define VAL(e) printf(#e " %llu\n", (unsigned long long)(uint32_t)(e))

static void hex(const char *name, const void *p, size_t n)
{
	const unsigned char *b = p;
	printf("%s ", name);
	for (size_t i = 0; i < n; i++)
		printf("%02x", b[i]);
	printf("\n");
}

/* A WQE of ds segments occupies whole 64-byte basic blocks. */
static void emit_wqe(const char *name, const uint8_t *w, unsigned ds)
{
	hex(name, w, (ds * 16 + MLX5_SEND_WQE_BB - 1) / MLX5_SEND_WQE_BB * MLX5_SEND_WQE_BB);
}

static void set_raddr(void *p, uint64_t addr, uint32_t rkey)
{
	struct mlx5_wqe_raddr_seg *r = p;
	r->raddr = htobe64(addr);
	r->rkey = htobe32(rkey);
	r->reserved = 0;
}

static void set_atomic(void *p, uint64_t swap_add, uint64_t compare)
{
	struct mlx5_wqe_atomic_seg *a = p;
	a->swap_add = htobe64(swap_add);
	a->compare = htobe64(compare);
}

static void body(void)
{
	OFF(mlx5_wqe_ctrl_seg, opmod_idx_opcode);
	OFF(mlx5_wqe_ctrl_seg, qpn_ds);
	OFF(mlx5_wqe_ctrl_seg, signature);
	OFF(mlx5_wqe_ctrl_seg, fm_ce_se);
	OFF(mlx5_wqe_ctrl_seg, imm);
	SIZE(mlx5_wqe_ctrl_seg);
	OFF(mlx5_wqe_raddr_seg, raddr);
	OFF(mlx5_wqe_raddr_seg, rkey);
	OFF(mlx5_wqe_raddr_seg, reserved);
	SIZE(mlx5_wqe_raddr_seg);
	OFF(mlx5_wqe_atomic_seg, swap_add);
	OFF(mlx5_wqe_atomic_seg, compare);
	SIZE(mlx5_wqe_atomic_seg);
	OFF(mlx5_wqe_data_seg, byte_count);
	OFF(mlx5_wqe_data_seg, lkey);
	OFF(mlx5_wqe_data_seg, addr);
	SIZE(mlx5_wqe_data_seg);
	OFF(mlx5_wqe_inl_data_seg, byte_count);
	SIZE(mlx5_wqe_inl_data_seg);

	OFF(mlx5_cqe64, imm_inval_pkey);
	OFF(mlx5_cqe64, byte_cnt);
	OFF(mlx5_cqe64, timestamp);
	OFF(mlx5_cqe64, sop_drop_qpn);
	OFF(mlx5_cqe64, wqe_counter);
	OFF(mlx5_cqe64, signature);
	OFF(mlx5_cqe64, op_own);
	SIZE(mlx5_cqe64);
	OFF(mlx5_err_cqe, vendor_err_synd);
	OFF(mlx5_err_cqe, syndrome);
	OFF(mlx5_err_cqe, s_wqe_opcode_qpn);
	OFF(mlx5_err_cqe, wqe_counter);
	OFF(mlx5_err_cqe, op_own);
	SIZE(mlx5_err_cqe);

	VAL(MLX5_OPCODE_NOP);
	VAL(MLX5_OPCODE_RDMA_WRITE);
	VAL(MLX5_OPCODE_RDMA_WRITE_IMM);
	VAL(MLX5_OPCODE_SEND);
	VAL(MLX5_OPCODE_SEND_IMM);
	VAL(MLX5_OPCODE_RDMA_READ);
	VAL(MLX5_OPCODE_ATOMIC_CS);
	VAL(MLX5_OPCODE_ATOMIC_FA);
	VAL(MLX5_OPCODE_ATOMIC_MASKED_CS);
	VAL(MLX5_OPCODE_ATOMIC_MASKED_FA);
	/* Opcodes we do not implement: they must not decode as one of ours. */
	VAL(MLX5_OPCODE_SEND_INVAL);
	VAL(MLX5_OPCODE_TSO);
	VAL(MLX5_OPCODE_FMR);
	VAL(MLX5_OPCODE_LOCAL_INVAL);
	VAL(MLX5_OPCODE_CONFIG_CMD);
	VAL(MLX5_OPCODE_SET_PSV);
	VAL(MLX5_OPCODE_UMR);

	VAL(MLX5_WQE_CTRL_CQ_UPDATE);
	VAL(MLX5_WQE_CTRL_SOLICITED);
	VAL(MLX5_WQE_CTRL_FENCE);
	VAL(MLX5_WQE_CTRL_INITIATOR_SMALL_FENCE);
	VAL(MLX5_SEND_WQE_BB);
	VAL(MLX5_SEND_WQE_SHIFT);
	VAL(MLX5_INLINE_SEG);
	VAL(MLX5_INVALID_LKEY);

	VAL(MLX5_CQE_OWNER_MASK);
	VAL(MLX5_CQE_REQ);
	VAL(MLX5_CQE_RESP_WR_IMM);
	VAL(MLX5_CQE_RESP_SEND);
	VAL(MLX5_CQE_RESP_SEND_IMM);
	VAL(MLX5_CQE_REQ_ERR);
	VAL(MLX5_CQE_RESP_ERR);

	VAL(MLX5_CQE_SYNDROME_LOCAL_LENGTH_ERR);
	VAL(MLX5_CQE_SYNDROME_LOCAL_QP_OP_ERR);
	VAL(MLX5_CQE_SYNDROME_LOCAL_PROT_ERR);
	VAL(MLX5_CQE_SYNDROME_WR_FLUSH_ERR);
	VAL(MLX5_CQE_SYNDROME_MW_BIND_ERR);
	VAL(MLX5_CQE_SYNDROME_BAD_RESP_ERR);
	VAL(MLX5_CQE_SYNDROME_LOCAL_ACCESS_ERR);
	VAL(MLX5_CQE_SYNDROME_REMOTE_INVAL_REQ_ERR);
	VAL(MLX5_CQE_SYNDROME_REMOTE_ACCESS_ERR);
	VAL(MLX5_CQE_SYNDROME_REMOTE_OP_ERR);
	VAL(MLX5_CQE_SYNDROME_TRANSPORT_RETRY_EXC_ERR);
	VAL(MLX5_CQE_SYNDROME_RNR_RETRY_EXC_ERR);
	VAL(MLX5_CQE_SYNDROME_REMOTE_ABORTED_ERR);

	/*
	 * Whole WQEs, laid out as libmlx5 does: ctrl, then raddr, atomic and data or inline
	 * segments. The imm argument of mlx5dv_set_ctrl_seg is stored as is: libmlx5 passes
	 * ibv_send_wr.imm_data, which is already big-endian, hence htobe32 here.
	 */
	{
		uint8_t w[256];
		memset(w, 0, sizeof w);
		mlx5dv_set_ctrl_seg((void *)w, IDX, MLX5_OPCODE_NOP, 0, QPN,
				    MLX5_WQE_CTRL_CQ_UPDATE, 1, 0, 0);
		emit_wqe("wqe.nop", w, 1);
	}
	{
		uint8_t w[256];
		memset(w, 0, sizeof w);
		mlx5dv_set_ctrl_seg((void *)w, IDX, MLX5_OPCODE_RDMA_WRITE, 0, QPN,
				    MLX5_WQE_CTRL_CQ_UPDATE, 3, 0, 0);
		set_raddr(w + 16, RADDR, RKEY);
		mlx5dv_set_data_seg((void *)(w + 32), LEN, LKEY, LADDR);
		emit_wqe("wqe.write", w, 3);
	}
	{
		uint8_t w[256];
		static const char data[] = INLINE;
		uint32_t len = sizeof data - 1;
		struct mlx5_wqe_inl_data_seg *inl = (void *)(w + 32);
		unsigned ds = 2 + (sizeof *inl + len + 15) / 16;
		memset(w, 0, sizeof w);
		mlx5dv_set_ctrl_seg((void *)w, IDX, MLX5_OPCODE_RDMA_WRITE_IMM, 0, QPN,
				    MLX5_WQE_CTRL_CQ_UPDATE | MLX5_WQE_CTRL_SOLICITED, ds, 0,
				    htobe32(IMM));
		set_raddr(w + 16, RADDR, RKEY);
		inl->byte_count = htobe32(len | MLX5_INLINE_SEG);
		memcpy(inl + 1, data, len);
		emit_wqe("wqe.write_imm_inline", w, ds);
	}
	{
		uint8_t w[256];
		memset(w, 0, sizeof w);
		mlx5dv_set_ctrl_seg((void *)w, IDX, MLX5_OPCODE_SEND, 0, QPN,
				    MLX5_WQE_CTRL_CQ_UPDATE | MLX5_WQE_CTRL_FENCE, 3, 0, 0);
		mlx5dv_set_data_seg((void *)(w + 16), LEN, LKEY, LADDR);
		mlx5dv_set_data_seg((void *)(w + 32), LEN + 1, LKEY, LADDR + 0x100);
		emit_wqe("wqe.send", w, 3);
	}
	{
		uint8_t w[256];
		memset(w, 0, sizeof w);
		mlx5dv_set_ctrl_seg((void *)w, IDX, MLX5_OPCODE_RDMA_READ, 0, QPN, 0, 5, 0, 0);
		set_raddr(w + 16, RADDR, RKEY);
		for (unsigned i = 0; i < 3; i++)
			mlx5dv_set_data_seg((void *)(w + 32 + 16 * i), LEN + i, LKEY,
					    LADDR + 0x100 * i);
		emit_wqe("wqe.read", w, 5);
	}
	{
		uint8_t w[256];
		memset(w, 0, sizeof w);
		mlx5dv_set_ctrl_seg((void *)w, IDX, MLX5_OPCODE_ATOMIC_CS, 0, QPN,
				    MLX5_WQE_CTRL_CQ_UPDATE | MLX5_WQE_CTRL_FENCE, 4, 0, 0);
		set_raddr(w + 16, RADDR, RKEY);
		set_atomic(w + 32, SWAP, COMPARE);
		mlx5dv_set_data_seg((void *)(w + 48), 8, LKEY, LADDR);
		emit_wqe("wqe.cas", w, 4);
	}
	{
		uint8_t w[256];
		memset(w, 0, sizeof w);
		mlx5dv_set_ctrl_seg((void *)w, IDX, MLX5_OPCODE_ATOMIC_FA, 0, QPN,
				    MLX5_WQE_CTRL_CQ_UPDATE, 4, 0, 0);
		set_raddr(w + 16, RADDR, RKEY);
		set_atomic(w + 32, ADD, 0);
		mlx5dv_set_data_seg((void *)(w + 48), 8, LKEY, LADDR);
		emit_wqe("wqe.faa", w, 4);
	}

	/* CQEs. */
	{
		struct mlx5_cqe64 c;
		memset(&c, 0, sizeof c);
		c.imm_inval_pkey = htobe32(IMM);
		c.byte_cnt = htobe32(BYTES);
		c.timestamp = htobe64(TSTAMP);
		c.sop_drop_qpn = htobe32(QPN);
		c.wqe_counter = htobe16(IDX);
		c.op_own = MLX5_CQE_RESP_SEND_IMM << 4;
		mlx5dv_set_cqe_owner(&c, 1);
		hex("cqe.resp_send_imm", &c, sizeof c);
		printf("cqe.resp_send_imm.opcode %u\n", mlx5dv_get_cqe_opcode(&c));
	}
	{
		struct mlx5_cqe64 c;
		memset(&c, 0, sizeof c);
		c.byte_cnt = htobe32(BYTES);
		c.timestamp = htobe64(TSTAMP);
		c.sop_drop_qpn = htobe32((uint32_t)MLX5_OPCODE_RDMA_READ << 24 | QPN);
		c.wqe_counter = htobe16(IDX);
		c.op_own = MLX5_CQE_REQ << 4;
		mlx5dv_set_cqe_owner(&c, 0);
		hex("cqe.req_read", &c, sizeof c);
	}
	{
		struct mlx5_err_cqe e;
		memset(&e, 0, sizeof e);
		e.vendor_err_synd = VENDOR;
		e.syndrome = MLX5_CQE_SYNDROME_REMOTE_ACCESS_ERR;
		e.s_wqe_opcode_qpn = htobe32((uint32_t)MLX5_OPCODE_RDMA_WRITE << 24 | QPN);
		e.wqe_counter = htobe16(IDX);
		e.op_own = MLX5_CQE_REQ_ERR << 4 | 1;
		hex("cqe.req_err", &e, sizeof e);
	}
	{
		struct mlx5_err_cqe e;
		memset(&e, 0, sizeof e);
		e.vendor_err_synd = VENDOR;
		e.syndrome = MLX5_CQE_SYNDROME_WR_FLUSH_ERR;
		e.s_wqe_opcode_qpn = htobe32(QPN);
		e.wqe_counter = htobe16(IDX);
		e.op_own = MLX5_CQE_RESP_ERR << 4;
		hex("cqe.resp_err", &e, sizeof e);
	}
}
"#;

/// The whole C program: includes, #defines of the shared operands, `C_BODY`, and a `main`
/// that runs it and then the generated ctrl/data segment cases.
fn c_program() -> String {
    let mut s = String::from(
        "#include <stddef.h>\n#include <stdint.h>\n#include <stdio.h>\n#include <string.h>\n\
         #include <endian.h>\n#include <infiniband/mlx5dv.h>\n\n",
    );
    let defines: [(&str, u64); 14] = [
        ("QPN", QPN.into()),
        ("IDX", IDX.into()),
        ("RADDR", RADDR),
        ("RKEY", RKEY.into()),
        ("LADDR", LADDR),
        ("LKEY", LKEY.into()),
        ("LEN", LEN.into()),
        ("SWAP", SWAP),
        ("COMPARE", COMPARE),
        ("ADD", ADD),
        ("IMM", IMM.into()),
        ("BYTES", BYTES.into()),
        ("VENDOR", VENDOR.into()),
        ("TSTAMP", TSTAMP),
    ];
    for (name, v) in defines {
        writeln!(s, "#define {name} ((uint64_t){v:#x}ull)").unwrap();
    }
    assert!(INLINE.bytes().all(|b| b.is_ascii_graphic() || b == b' ') && !INLINE.contains('"'));
    writeln!(s, "#define INLINE \"{INLINE}\"").unwrap();
    s.push_str(C_BODY);
    s.push_str("\nint main(void)\n{\n\tbody();\n");
    for (i, c) in ctrl_cases().iter().enumerate() {
        writeln!(
            s,
            "\t{{\n\t\tstruct mlx5_wqe_ctrl_seg c;\n\t\tmemset(&c, 0, sizeof c);\n\
             \t\tmlx5dv_set_ctrl_seg(&c, {:#x}, {:#x}, {:#x}, {:#x}u, {:#x}, {}, {:#x}, \
             htobe32({:#x}u));\n\t\thex(\"ctrl.{i}\", &c, sizeof c);\n\t}}",
            c.wqe_index, c.opcode, c.opmod, c.qpn.0, c.flags.0, c.ds, c.signature, c.imm
        )
        .unwrap();
    }
    for (i, d) in data_cases().iter().enumerate() {
        writeln!(
            s,
            "\t{{\n\t\tstruct mlx5_wqe_data_seg d;\n\t\tmemset(&d, 0, sizeof d);\n\
             \t\tmlx5dv_set_data_seg(&d, {:#x}u, {:#x}u, (uintptr_t){:#x}ull);\n\
             \t\thex(\"data.{i}\", &d, sizeof d);\n\t}}",
            d.len, d.lkey.0, d.addr.0
        )
        .unwrap();
    }
    s.push_str("\treturn 0;\n}\n");
    s
}

/// What the C program printed: `name -> value`.
#[derive(Debug)]
struct Facts(HashMap<String, String>);

impl Facts {
    fn raw(&self, name: &str) -> &str {
        self.0
            .get(name)
            .unwrap_or_else(|| panic!("the C program printed no `{name}`"))
    }

    fn num(&self, name: &str) -> u64 {
        let v = self.raw(name);
        v.parse()
            .unwrap_or_else(|e| panic!("`{name}` is not a number ({v:?}): {e}"))
    }

    fn usize(&self, name: &str) -> usize {
        usize::try_from(self.num(name)).unwrap()
    }

    fn byte(&self, name: &str) -> u8 {
        let v = self.num(name);
        u8::try_from(v).unwrap_or_else(|_| panic!("`{name}` = {v} is not a byte"))
    }

    fn off(&self, strukt: &str, field: &str) -> usize {
        self.usize(&format!("off.{strukt}.{field}"))
    }

    fn size(&self, strukt: &str) -> usize {
        self.usize(&format!("size.{strukt}"))
    }

    fn bytes(&self, name: &str) -> Vec<u8> {
        let v = self.raw(name);
        assert!(v.len() % 2 == 0, "`{name}` has an odd number of hex digits");
        (0..v.len())
            .step_by(2)
            .map(|i| u8::from_str_radix(&v[i..i + 2], 16).unwrap())
            .collect()
    }

    /// Assert our bytes equal the golden bytes `name`, listing every differing byte.
    fn assert_bytes(&self, name: &str, ours: &[u8]) {
        let golden = self.bytes(name);
        if golden == ours {
            return;
        }
        let mut diff = String::new();
        for i in 0..golden.len().max(ours.len()) {
            let (g, o) = (golden.get(i), ours.get(i));
            if g != o {
                let show = |b: Option<&u8>| b.map_or("--".to_owned(), |b| format!("{b:02x}"));
                writeln!(diff, "  byte {i}: header {}, ours {}", show(g), show(o)).unwrap();
            }
        }
        panic!(
            "{name}: our encoding differs from mlx5dv.h\n  header: {}\n  ours:   {}\n{diff}",
            hex(&golden),
            hex(ours)
        );
    }
}

fn hex(b: &[u8]) -> String {
    b.iter().fold(String::new(), |mut s, x| {
        write!(s, "{x:02x}").unwrap();
        s
    })
}

/// Test `test` cannot run here because of `why`: under CI (`ci`) that is a failure; elsewhere
/// the test says so on a line of its own and is skipped.
fn cannot_run(test: &str, why: &str, ci: bool) {
    if ci {
        panic!("{why} (CI is set: the mlx5dv.h layout check must run)");
    }
    // Straight to the process's stderr, past libtest's output capture, so the skip is seen.
    let _ = writeln!(
        std::io::stderr(),
        "SKIPPED mlx5dv_layout::{test}: {why} (set CI to make this a failure)"
    );
}

/// The probe's facts, or why the check cannot run here.
fn build_and_run() -> Result<Facts, String> {
    if !Path::new(HEADER).exists() {
        return Err(format!(
            "mlx5dv.h not installed; install libibverbs-dev to run the layout check \
             (looked for {HEADER})"
        ));
    }
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_nanos())
        .unwrap_or(0);
    let dir =
        std::env::temp_dir().join(format!("redn-mlx5dv-layout-{}-{nanos}", std::process::id()));
    std::fs::create_dir(&dir).unwrap_or_else(|e| panic!("creating {}: {e}", dir.display()));
    let src = dir.join("layout.c");
    let exe = dir.join("layout");
    std::fs::write(&src, c_program()).unwrap();

    let cc = std::env::var("CC").unwrap_or_else(|_| "cc".to_owned());
    let compiled = Command::new(&cc)
        .args(["-std=gnu11", "-Wall", "-o"])
        .arg(&exe)
        .arg(&src)
        .output();
    let compiled = match compiled {
        Ok(o) => o,
        Err(e) => {
            let _ = std::fs::remove_dir_all(&dir);
            return Err(format!("cannot run the C compiler `{cc}`: {e}"));
        }
    };
    assert!(
        compiled.status.success(),
        "compiling the mlx5dv.h probe {} failed ({}):\n{}",
        src.display(),
        compiled.status,
        String::from_utf8_lossy(&compiled.stderr)
    );
    let run = Command::new(&exe)
        .output()
        .unwrap_or_else(|e| panic!("running {}: {e}", exe.display()));
    assert!(
        run.status.success(),
        "the mlx5dv.h probe {} failed ({}):\n{}",
        exe.display(),
        run.status,
        String::from_utf8_lossy(&run.stderr)
    );
    let _ = std::fs::remove_dir_all(&dir);

    let out = String::from_utf8(run.stdout).expect("probe output is not UTF-8");
    let mut facts = HashMap::new();
    for line in out.lines() {
        let (name, value) = line
            .split_once(' ')
            .unwrap_or_else(|| panic!("malformed probe line {line:?}"));
        let old = facts.insert(name.to_owned(), value.to_owned());
        assert!(old.is_none(), "probe printed `{name}` twice");
    }
    Ok(Facts(facts))
}

/// The probe's output for test `test`, built once per test binary; `None` if the check cannot
/// run here and is skipped (see [`cannot_run`]).
fn facts(test: &str) -> Option<&'static Facts> {
    static FACTS: OnceLock<Result<Facts, String>> = OnceLock::new();
    match FACTS.get_or_init(build_and_run) {
        Ok(facts) => Some(facts),
        Err(why) => {
            cannot_run(test, why, std::env::var_os("CI").is_some());
            None
        }
    }
}

#[test]
#[should_panic(expected = "no header here (CI is set: the mlx5dv.h layout check must run)")]
fn a_check_that_cannot_run_fails_under_ci() {
    cannot_run("a_test", "no header here", true);
}

#[test]
fn wqe_segment_offsets_and_sizes() {
    let Some(h) = facts("wqe_segment_offsets_and_sizes") else {
        return;
    };
    let ctrl = "mlx5_wqe_ctrl_seg";
    assert_eq!(h.size(ctrl), SEG_SIZE);
    // opmod_idx_opcode is BE32 `opmod << 24 | wqe_index << 8 | opcode`.
    assert_eq!(off::OPMOD, h.off(ctrl, "opmod_idx_opcode"));
    assert_eq!(off::WQE_INDEX, h.off(ctrl, "opmod_idx_opcode") + 1);
    assert_eq!(off::OPCODE, h.off(ctrl, "opmod_idx_opcode") + 3);
    // qpn_ds is BE32 `qpn << 8 | ds`.
    assert_eq!(off::QPN, h.off(ctrl, "qpn_ds"));
    assert_eq!(off::DS, h.off(ctrl, "qpn_ds") + 3);
    assert_eq!(off::SIGNATURE, h.off(ctrl, "signature"));
    assert_eq!(off::FM_CE_SE, h.off(ctrl, "fm_ce_se"));
    assert_eq!(off::IMM, h.off(ctrl, "imm"));

    // The remote-address segment follows the control segment.
    let raddr = "mlx5_wqe_raddr_seg";
    let base = h.size(ctrl);
    assert_eq!(h.size(raddr), SEG_SIZE);
    assert_eq!(off::RADDR, base + h.off(raddr, "raddr"));
    assert_eq!(off::RKEY, base + h.off(raddr, "rkey"));
    assert_eq!(off::RADDR_RESERVED, base + h.off(raddr, "reserved"));

    // The atomic segment follows the remote-address segment.
    let atomic = "mlx5_wqe_atomic_seg";
    let base = h.size(ctrl) + h.size(raddr);
    assert_eq!(h.size(atomic), SEG_SIZE);
    assert_eq!(off::SWAP_ADD, base + h.off(atomic, "swap_add"));
    assert_eq!(off::COMPARE, base + h.off(atomic, "compare"));

    let data = "mlx5_wqe_data_seg";
    assert_eq!(h.size(data), SEG_SIZE);
    assert_eq!(off::SEG_BYTE_COUNT, h.off(data, "byte_count"));
    assert_eq!(off::SEG_LKEY, h.off(data, "lkey"));
    assert_eq!(off::SEG_ADDR, h.off(data, "addr"));

    // The inline header is one BE32 at the segment start; the data follows it (our encoder
    // puts the payload at +4).
    let inl = "mlx5_wqe_inl_data_seg";
    assert_eq!(h.off(inl, "byte_count"), 0);
    assert_eq!(h.size(inl), 4);
}

#[test]
fn cqe_offsets_and_sizes() {
    let Some(h) = facts("cqe_offsets_and_sizes") else {
        return;
    };
    let cqe = "mlx5_cqe64";
    assert_eq!(h.size(cqe), CQE_SIZE);
    assert_eq!(h.off(cqe, "imm_inval_pkey"), CQE_IMM);
    assert_eq!(h.off(cqe, "byte_cnt"), CQE_BYTE_CNT);
    assert_eq!(h.off(cqe, "timestamp"), CQE_TIMESTAMP);
    assert_eq!(h.off(cqe, "sop_drop_qpn"), CQE_SOP_DROP_QPN);
    assert_eq!(h.off(cqe, "wqe_counter"), CQE_WQE_COUNTER);
    assert_eq!(h.off(cqe, "op_own"), CQE_OP_OWN);
    // We leave the signature byte zero; it sits between wqe_counter and op_own.
    assert_eq!(h.off(cqe, "signature"), CQE_WQE_COUNTER + 2);

    let err = "mlx5_err_cqe";
    assert_eq!(h.size(err), CQE_SIZE);
    assert_eq!(h.off(err, "vendor_err_synd"), CQE_VENDOR_SYND);
    assert_eq!(h.off(err, "syndrome"), CQE_SYNDROME);
    assert_eq!(h.off(err, "s_wqe_opcode_qpn"), CQE_SOP_DROP_QPN);
    assert_eq!(h.off(err, "wqe_counter"), CQE_WQE_COUNTER);
    assert_eq!(h.off(err, "op_own"), CQE_OP_OWN);
}

#[test]
fn send_opcodes_match() {
    let Some(h) = facts("send_opcodes_match") else {
        return;
    };
    let ours = [
        (Opcode::Nop, "MLX5_OPCODE_NOP"),
        (Opcode::RdmaWrite, "MLX5_OPCODE_RDMA_WRITE"),
        (Opcode::RdmaWriteImm, "MLX5_OPCODE_RDMA_WRITE_IMM"),
        (Opcode::Send, "MLX5_OPCODE_SEND"),
        (Opcode::SendImm, "MLX5_OPCODE_SEND_IMM"),
        (Opcode::RdmaRead, "MLX5_OPCODE_RDMA_READ"),
        (Opcode::AtomicCs, "MLX5_OPCODE_ATOMIC_CS"),
        (Opcode::AtomicFa, "MLX5_OPCODE_ATOMIC_FA"),
        (Opcode::AtomicMaskedCs, "MLX5_OPCODE_ATOMIC_MASKED_CS"),
        (Opcode::AtomicMaskedFa, "MLX5_OPCODE_ATOMIC_MASKED_FA"),
    ];
    for (op, name) in ours {
        let v = h.num(name);
        assert_eq!(u64::from(op as u8), v, "{op:?} vs {name}");
        assert_eq!(Opcode::from_u8(h.byte(name)), Some(op), "decoding {name}");
    }
    // The header's other opcodes must not decode as one of ours (in particular not as the
    // hand-written WAIT / SEND_EN / RECV_EN).
    for name in [
        "MLX5_OPCODE_SEND_INVAL",
        "MLX5_OPCODE_TSO",
        "MLX5_OPCODE_FMR",
        "MLX5_OPCODE_LOCAL_INVAL",
        "MLX5_OPCODE_CONFIG_CMD",
        "MLX5_OPCODE_SET_PSV",
        "MLX5_OPCODE_UMR",
    ] {
        let v = h.num(name);
        assert_eq!(
            Opcode::from_u8(h.byte(name)),
            None,
            "{name} ({v:#x}) decodes as ours"
        );
    }
}

#[test]
fn wqe_flags_and_constants_match() {
    let Some(h) = facts("wqe_flags_and_constants_match") else {
        return;
    };
    assert_eq!(
        u64::from(WqeFlags::SIGNALED.0),
        h.num("MLX5_WQE_CTRL_CQ_UPDATE")
    );
    assert_eq!(
        u64::from(WqeFlags::SOLICITED.0),
        h.num("MLX5_WQE_CTRL_SOLICITED")
    );
    assert_eq!(u64::from(WqeFlags::FENCE.0), h.num("MLX5_WQE_CTRL_FENCE"));
    assert_eq!(
        u64::from(WqeFlags::INITIATOR_SMALL_FENCE.0),
        h.num("MLX5_WQE_CTRL_INITIATOR_SMALL_FENCE")
    );
    assert!(WqeFlags(h.byte("MLX5_WQE_CTRL_CQ_UPDATE")).signaled());
    assert!(!WqeFlags(h.byte("MLX5_WQE_CTRL_SOLICITED")).signaled());
    assert_eq!(BB_SIZE as u64, h.num("MLX5_SEND_WQE_BB"));
    assert_eq!(BB_SIZE as u64, 1 << h.num("MLX5_SEND_WQE_SHIFT"));
    assert_eq!(u64::from(INLINE_FLAG), h.num("MLX5_INLINE_SEG"));
    assert_eq!(u64::from(INVALID_LKEY), h.num("MLX5_INVALID_LKEY"));
}

#[test]
fn cqe_opcodes_and_syndromes_match() {
    let Some(h) = facts("cqe_opcodes_and_syndromes_match") else {
        return;
    };
    let opcodes = [
        (CqeOpcode::Req, "MLX5_CQE_REQ"),
        (CqeOpcode::RespWriteImm, "MLX5_CQE_RESP_WR_IMM"),
        (CqeOpcode::RespSend, "MLX5_CQE_RESP_SEND"),
        (CqeOpcode::RespSendImm, "MLX5_CQE_RESP_SEND_IMM"),
        (CqeOpcode::ReqErr, "MLX5_CQE_REQ_ERR"),
        (CqeOpcode::RespErr, "MLX5_CQE_RESP_ERR"),
    ];
    for (op, name) in opcodes {
        let v = h.num(name);
        assert_eq!(u64::from(op as u8), v, "{op:?} vs {name}");
        assert_eq!(
            CqeOpcode::from_nibble(h.byte(name)),
            Some(op),
            "decoding {name}"
        );
    }
    // The owner bit is bit 0 of op_own.
    assert_eq!(h.num("MLX5_CQE_OWNER_MASK"), 1);

    let syndromes = [
        (Syndrome::LocalLength, "LOCAL_LENGTH_ERR"),
        (Syndrome::LocalQpOperation, "LOCAL_QP_OP_ERR"),
        (Syndrome::LocalProtection, "LOCAL_PROT_ERR"),
        (Syndrome::WrFlush, "WR_FLUSH_ERR"),
        (Syndrome::MwBind, "MW_BIND_ERR"),
        (Syndrome::BadResponse, "BAD_RESP_ERR"),
        (Syndrome::LocalAccess, "LOCAL_ACCESS_ERR"),
        (Syndrome::RemoteInvalidRequest, "REMOTE_INVAL_REQ_ERR"),
        (Syndrome::RemoteAccess, "REMOTE_ACCESS_ERR"),
        (Syndrome::RemoteOperation, "REMOTE_OP_ERR"),
        (Syndrome::TransportRetryExceeded, "TRANSPORT_RETRY_EXC_ERR"),
        (Syndrome::RnrRetryExceeded, "RNR_RETRY_EXC_ERR"),
        (Syndrome::RemoteAborted, "REMOTE_ABORTED_ERR"),
    ];
    for (s, suffix) in syndromes {
        let name = format!("MLX5_CQE_SYNDROME_{suffix}");
        let v = h.num(&name);
        assert_eq!(u64::from(s as u8), v, "{s:?} vs {name}");
        assert_eq!(Syndrome::from_u8(h.byte(&name)), Some(s), "decoding {name}");
    }
}

#[test]
fn ctrl_segment_matches_mlx5dv_set_ctrl_seg() {
    let Some(h) = facts("ctrl_segment_matches_mlx5dv_set_ctrl_seg") else {
        return;
    };
    for (i, c) in ctrl_cases().iter().enumerate() {
        let ours = c.encode();
        h.assert_bytes(&format!("ctrl.{i}"), &ours);
        assert_eq!(CtrlSeg::decode(&ours), *c, "ctrl.{i} round trip");
    }
}

#[test]
fn data_segment_matches_mlx5dv_set_data_seg() {
    let Some(h) = facts("data_segment_matches_mlx5dv_set_data_seg") else {
        return;
    };
    for (i, d) in data_cases().iter().enumerate() {
        let ours = d.encode();
        h.assert_bytes(&format!("data.{i}"), &ours);
        assert_eq!(Sge::decode(&ours), *d, "data.{i} round trip");
    }
}

#[test]
fn whole_wqes_match_header_layout() {
    let Some(h) = facts("whole_wqes_match_header_layout") else {
        return;
    };
    for (name, wr) in wqe_cases() {
        let e = encode_wqe(&wr, Qpn(QPN), IDX).unwrap_or_else(|e| panic!("{name}: {e}"));
        h.assert_bytes(name, e.bytes());
    }
}

#[test]
fn cqes_match_header_layout() {
    let Some(h) = facts("cqes_match_header_layout") else {
        return;
    };
    for (name, c) in cqe_cases() {
        let ours = c.encode();
        h.assert_bytes(name, &ours);
        assert_eq!(Cqe::decode(&ours), Some(c), "{name} round trip");
    }
    assert_eq!(
        h.num("cqe.resp_send_imm.opcode"),
        u64::from(CqeOpcode::RespSendImm as u8),
        "mlx5dv_get_cqe_opcode"
    );
}
