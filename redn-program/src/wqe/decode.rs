//! WQE bytes back to what they say, checked: what the softnic executes and what tests and
//! the verifier read back, and a receive WQE's entries up to its terminator.

use super::{
    off, CtrlSeg, Opcode, Payload, RemoteAddr, Sge, WqeError, WrOp, INLINE_FLAG, INVALID_LKEY,
    SEG_SIZE,
};
use crate::endian::{Be32, Be64};
use crate::types::{Cqn, Qpn, Rkey, VirtAddr};

/// A WQE read back from bytes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DecodedWqe {
    /// The control segment as found.
    pub ctrl: CtrlSeg,
    /// The operation with its operands.
    pub op: WrOp,
}

fn min_ds(op: Opcode) -> u8 {
    match op {
        Opcode::Nop | Opcode::Send | Opcode::SendImm => 1,
        Opcode::RdmaWrite | Opcode::RdmaWriteImm | Opcode::RdmaRead => 2,
        Opcode::Wait | Opcode::SendEn | Opcode::RecvEn => 2,
        Opcode::AtomicCs | Opcode::AtomicFa | Opcode::AtomicMaskedFa => 3,
        Opcode::AtomicMaskedCs => 4,
    }
}

fn decode_sgl(b: &[u8], from: usize, ds: usize) -> Vec<Sge> {
    (from..ds)
        .map(|s| Sge::decode(&b[s * SEG_SIZE..]))
        .collect()
}

fn decode_payload(b: &[u8], from: usize, ds: usize) -> Result<Payload, WqeError> {
    if from < ds && Be32::read(b, from * SEG_SIZE).get() & INLINE_FLAG != 0 {
        let len = (Be32::read(b, from * SEG_SIZE).get() & !INLINE_FLAG) as usize;
        let room = (ds - from) * SEG_SIZE - 4;
        if len > room {
            return Err(WqeError::InlineOverrun { len, room });
        }
        if (len + 4).div_ceil(SEG_SIZE) != ds - from {
            return Err(WqeError::InlineNotLast);
        }
        let at = from * SEG_SIZE + 4;
        return Ok(Payload::Inline(b[at..at + len].to_vec()));
    }
    Ok(Payload::Sgl(decode_sgl(b, from, ds)))
}

fn decode_raddr(b: &[u8]) -> RemoteAddr {
    RemoteAddr {
        addr: VirtAddr(Be64::read(b, off::RADDR).get()),
        rkey: Rkey(Be32::read(b, off::RKEY).get()),
    }
}

/// An atomic's result segment, if it has one. It always receives the 8-byte old value,
/// whatever its byte count says (the executor writes 8, the encoder writes 8), so it decodes
/// as 8 bytes: what runs, and what encodes back to the same WQE.
fn decode_result(b: &[u8], seg: usize, ds: usize) -> Option<Sge> {
    (seg < ds).then(|| Sge {
        len: 8,
        ..Sge::decode(&b[seg * SEG_SIZE..])
    })
}

/// Decode a WQE from `b`, which must hold at least `ds` segments.
pub fn decode_wqe(b: &[u8]) -> Result<DecodedWqe, WqeError> {
    if b.len() < SEG_SIZE {
        return Err(WqeError::Truncated {
            ds: 0,
            needed: SEG_SIZE,
            have: b.len(),
        });
    }
    let ctrl = CtrlSeg::decode(b);
    let opcode = Opcode::from_u8(ctrl.opcode).ok_or(WqeError::UnknownOpcode(ctrl.opcode))?;
    let ds = usize::from(ctrl.ds);
    if b.len() < ds * SEG_SIZE {
        return Err(WqeError::Truncated {
            ds: ctrl.ds,
            needed: ds * SEG_SIZE,
            have: b.len(),
        });
    }
    let min = min_ds(opcode);
    if ctrl.ds < min {
        return Err(WqeError::DsTooSmall {
            opcode,
            ds: ctrl.ds,
            min,
        });
    }
    let imm = ctrl.imm;
    let op = match opcode {
        Opcode::Nop => WrOp::Nop {
            raw_segments: (1..ds)
                .map(|s| {
                    let mut seg = [0u8; SEG_SIZE];
                    seg.copy_from_slice(&b[s * SEG_SIZE..(s + 1) * SEG_SIZE]);
                    seg
                })
                .collect(),
        },
        Opcode::RdmaWrite | Opcode::RdmaWriteImm => WrOp::Write {
            remote: decode_raddr(b),
            payload: decode_payload(b, 2, ds)?,
            imm: (opcode == Opcode::RdmaWriteImm).then_some(imm),
        },
        Opcode::Send | Opcode::SendImm => WrOp::Send {
            payload: decode_payload(b, 1, ds)?,
            imm: (opcode == Opcode::SendImm).then_some(imm),
        },
        Opcode::RdmaRead => WrOp::Read {
            remote: decode_raddr(b),
            sgl: decode_sgl(b, 2, ds),
        },
        Opcode::AtomicCs => WrOp::CompareSwap {
            remote: decode_raddr(b),
            swap: Be64::read(b, off::SWAP_ADD).get(),
            compare: Be64::read(b, off::COMPARE).get(),
            result: decode_result(b, 3, ds),
        },
        Opcode::AtomicFa => WrOp::FetchAdd {
            remote: decode_raddr(b),
            add: Be64::read(b, off::SWAP_ADD).get(),
            result: decode_result(b, 3, ds),
        },
        Opcode::AtomicMaskedCs => WrOp::MaskedCompareSwap {
            remote: decode_raddr(b),
            swap: Be64::read(b, 32).get(),
            compare: Be64::read(b, 40).get(),
            swap_mask: Be64::read(b, 48).get(),
            compare_mask: Be64::read(b, 56).get(),
            result: decode_result(b, 4, ds),
        },
        Opcode::AtomicMaskedFa => WrOp::MaskedFetchAdd {
            remote: decode_raddr(b),
            add: Be64::read(b, 32).get(),
            field_boundary: Be64::read(b, 40).get(),
            result: decode_result(b, 3, ds),
        },
        Opcode::Wait => WrOp::Wait {
            cq: Cqn(Be32::read(b, off::WAIT_OBJ).get()),
            count: Be32::read(b, off::WAIT_PI).get(),
        },
        Opcode::SendEn => WrOp::SendEnable {
            qp: Qpn(Be32::read(b, off::WAIT_OBJ).get()),
            pi: Be32::read(b, off::WAIT_PI).get(),
        },
        Opcode::RecvEn => WrOp::RecvEnable {
            qp: Qpn(Be32::read(b, off::WAIT_OBJ).get()),
            pi: Be32::read(b, off::WAIT_PI).get(),
        },
    };
    Ok(DecodedWqe { ctrl, op })
}

/// Decode a receive WQE: entries up to the terminator or the end of the slot.
pub fn decode_recv(b: &[u8]) -> Vec<Sge> {
    recv_entries(b).collect()
}

/// A receive WQE's entries, decoded as they are walked (no allocation: a responder places
/// every SEND through them): up to the terminator or the end of the slot.
pub fn recv_entries(b: &[u8]) -> impl Iterator<Item = Sge> + Clone + '_ {
    b.chunks_exact(SEG_SIZE)
        .map(Sge::decode)
        .take_while(|s| s.lkey.0 != INVALID_LKEY)
}
