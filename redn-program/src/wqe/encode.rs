//! Work requests to WQE bytes: the segments each opcode takes, in the order and at the
//! offsets the hardware reads them, and receive WQEs with their terminator.

use super::{
    bbs_for_ds, CtrlSeg, Payload, RemoteAddr, Sge, WorkRequest, WqeError, WrOp, BB_SIZE,
    INLINE_FLAG, INVALID_LKEY, MAX_DS, MAX_WQE_BYTES, OPMOD_EXT_ATOMIC_8B, SEG_SIZE,
};
use crate::endian::{Be32, Be64};
use crate::types::{Lkey, Qpn, VirtAddr, MAX_QPN};
use std::fmt;

/// One encoded WQE: whole basic blocks, ready to copy into a ring.
#[derive(Clone)]
pub struct EncodedWqe {
    buf: [u8; MAX_WQE_BYTES],
    ds: u8,
}

impl fmt::Debug for EncodedWqe {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("EncodedWqe")
            .field("ds", &self.ds)
            .field("bytes", &self.bytes())
            .finish()
    }
}

impl EncodedWqe {
    /// The WQE's bytes, padded with zeros to whole basic blocks.
    pub fn bytes(&self) -> &[u8] {
        &self.buf[..self.bbs() * BB_SIZE]
    }

    /// Mutable access, for tools that patch an encoded WQE before posting it.
    pub fn bytes_mut(&mut self) -> &mut [u8] {
        let n = self.bbs() * BB_SIZE;
        &mut self.buf[..n]
    }

    /// The ds it was encoded with.
    pub fn ds(&self) -> u8 {
        self.ds
    }

    /// Basic blocks it occupies.
    pub fn bbs(&self) -> usize {
        bbs_for_ds(self.ds)
    }
}

/// Appends segments after the control segment. Every byte it covers is written, so the
/// buffer's old contents do not matter.
struct SegWriter<'a> {
    buf: &'a mut [u8; MAX_WQE_BYTES],
    segs: usize,
}

impl SegWriter<'_> {
    fn push(&mut self, seg: &[u8; SEG_SIZE]) -> Result<(), WqeError> {
        if self.segs >= usize::from(MAX_DS) {
            return Err(WqeError::TooLarge(self.segs + 1));
        }
        let at = self.segs * SEG_SIZE;
        self.buf[at..at + SEG_SIZE].copy_from_slice(seg);
        self.segs += 1;
        Ok(())
    }

    fn push_sgl(&mut self, sgl: &[Sge]) -> Result<(), WqeError> {
        for sge in sgl.iter().filter(|s| s.len != 0) {
            if sge.len & INLINE_FLAG != 0 {
                // It would read back as an inline header.
                return Err(WqeError::SgeTooLong(sge.len));
            }
            self.push(&sge.encode())?;
        }
        Ok(())
    }

    fn push_inline(&mut self, data: &[u8]) -> Result<(), WqeError> {
        let total = (data.len() + 4).div_ceil(SEG_SIZE);
        if self.segs + total > usize::from(MAX_DS) {
            return Err(WqeError::TooLarge(self.segs + total));
        }
        // Never fails: the check above keeps the data under 63 segments.
        let len = u32::try_from(data.len()).map_err(|_| WqeError::TooLarge(self.segs + total))?;
        let at = self.segs * SEG_SIZE;
        Be32::new(len | INLINE_FLAG).write(self.buf, at);
        self.buf[at + 4..at + 4 + data.len()].copy_from_slice(data);
        self.buf[at + 4 + data.len()..at + total * SEG_SIZE].fill(0);
        self.segs += total;
        Ok(())
    }

    fn push_payload(&mut self, p: &Payload) -> Result<(), WqeError> {
        match p {
            Payload::Sgl(s) => self.push_sgl(s),
            Payload::Inline(d) => self.push_inline(d),
        }
    }

    fn push_raddr(&mut self, r: &RemoteAddr) -> Result<(), WqeError> {
        let mut s = [0u8; SEG_SIZE];
        Be64::new(r.addr.0).write(&mut s, 0);
        Be32::new(r.rkey.0).write(&mut s, 8);
        self.push(&s)
    }

    fn push_pair(&mut self, a: u64, b: u64) -> Result<(), WqeError> {
        let mut s = [0u8; SEG_SIZE];
        Be64::new(a).write(&mut s, 0);
        Be64::new(b).write(&mut s, 8);
        self.push(&s)
    }

    fn push_atomic_result(&mut self, r: &Option<Sge>) -> Result<(), WqeError> {
        match r {
            // An atomic's data segment always moves 8 bytes, whatever the SGE says.
            Some(sge) => self.push(&Sge { len: 8, ..*sge }.encode()),
            None => Ok(()),
        }
    }

    fn push_wait_en(&mut self, pi: u32, obj: u32) -> Result<(), WqeError> {
        if obj > MAX_QPN {
            return Err(WqeError::ObjectNumberTooWide(obj));
        }
        let mut s = [0u8; SEG_SIZE];
        Be32::new(pi).write(&mut s, 8);
        Be32::new(obj).write(&mut s, 12);
        self.push(&s)
    }
}

/// Encode `wr` as the WQE a ConnectX would fetch, for queue pair `qpn` at producer counter
/// `wqe_index` (stored mod 2^16).
pub fn encode_wqe(wr: &WorkRequest, qpn: Qpn, wqe_index: u16) -> Result<EncodedWqe, WqeError> {
    let mut buf = [0u8; MAX_WQE_BYTES];
    let ds = encode_wqe_into(wr, qpn, wqe_index, &mut buf)?;
    Ok(EncodedWqe { buf, ds })
}

/// As [`encode_wqe`], into the start of `out`, whose old contents do not matter: every byte of
/// the WQE's basic blocks (`bbs_for_ds` of the returned ds) is written. For posting many
/// WQEs through one buffer without clearing 1 KiB for each.
pub fn encode_wqe_into(
    wr: &WorkRequest,
    qpn: Qpn,
    wqe_index: u16,
    out: &mut [u8; MAX_WQE_BYTES],
) -> Result<u8, WqeError> {
    if qpn.0 > MAX_QPN {
        return Err(WqeError::ObjectNumberTooWide(qpn.0));
    }
    let mut w = SegWriter { buf: out, segs: 1 };
    let mut imm = 0u32;
    let mut opmod = 0u8;
    match &wr.op {
        WrOp::Nop { raw_segments } => {
            for s in raw_segments {
                w.push(s)?;
            }
        }
        WrOp::Write {
            remote,
            payload,
            imm: i,
        } => {
            imm = i.unwrap_or(0);
            w.push_raddr(remote)?;
            w.push_payload(payload)?;
        }
        WrOp::Send { payload, imm: i } => {
            imm = i.unwrap_or(0);
            w.push_payload(payload)?;
        }
        WrOp::Read { remote, sgl } => {
            w.push_raddr(remote)?;
            w.push_sgl(sgl)?;
        }
        WrOp::CompareSwap {
            remote,
            compare,
            swap,
            result,
        } => {
            w.push_raddr(remote)?;
            w.push_pair(*swap, *compare)?;
            w.push_atomic_result(result)?;
        }
        WrOp::FetchAdd {
            remote,
            add,
            result,
        } => {
            w.push_raddr(remote)?;
            w.push_pair(*add, 0)?;
            w.push_atomic_result(result)?;
        }
        WrOp::MaskedCompareSwap {
            remote,
            compare,
            compare_mask,
            swap,
            swap_mask,
            result,
        } => {
            opmod = OPMOD_EXT_ATOMIC_8B;
            w.push_raddr(remote)?;
            w.push_pair(*swap, *compare)?;
            w.push_pair(*swap_mask, *compare_mask)?;
            w.push_atomic_result(result)?;
        }
        WrOp::MaskedFetchAdd {
            remote,
            add,
            field_boundary,
            result,
        } => {
            opmod = OPMOD_EXT_ATOMIC_8B;
            w.push_raddr(remote)?;
            w.push_pair(*add, *field_boundary)?;
            w.push_atomic_result(result)?;
        }
        WrOp::Wait { cq, count } => w.push_wait_en(*count, cq.0)?,
        WrOp::SendEnable { qp, pi } | WrOp::RecvEnable { qp, pi } => w.push_wait_en(*pi, qp.0)?,
    }
    // Never fails: every push checks the segment count against MAX_DS.
    let ds = u8::try_from(w.segs).map_err(|_| WqeError::TooLarge(w.segs))?;
    let ctrl = CtrlSeg {
        opmod,
        wqe_index,
        opcode: wr.op.opcode() as u8,
        qpn,
        ds,
        signature: 0,
        flags: wr.flags,
        imm,
    };
    w.buf[..SEG_SIZE].copy_from_slice(&ctrl.encode());
    // Padding up to the basic block boundary.
    w.buf[w.segs * SEG_SIZE..bbs_for_ds(ds) * BB_SIZE].fill(0);
    Ok(ds)
}

/// Encode a receive WQE for a slot of `slot_entries` data segments: the used entries, then an
/// [`INVALID_LKEY`] terminator if any room is left. Zero-length entries are skipped.
pub fn encode_recv(sgl: &[Sge], slot_entries: usize) -> Result<Vec<u8>, WqeError> {
    let used: Vec<&Sge> = sgl.iter().filter(|s| s.len != 0).collect();
    if used.len() > slot_entries {
        return Err(WqeError::TooLarge(used.len()));
    }
    let mut out = vec![0u8; slot_entries * SEG_SIZE];
    for (i, s) in used.iter().enumerate() {
        out[i * SEG_SIZE..(i + 1) * SEG_SIZE].copy_from_slice(&s.encode());
    }
    if used.len() < slot_entries {
        let t = Sge {
            addr: VirtAddr(0),
            len: 0,
            lkey: Lkey(INVALID_LKEY),
        };
        out[used.len() * SEG_SIZE..(used.len() + 1) * SEG_SIZE].copy_from_slice(&t.encode());
    }
    Ok(out)
}
