//! Writing work requests straight into a send ring, and the chains the benchmarks build.

use crate::Ctx;
use redn_program::wqe::{encode_wqe, wqe_index, WorkRequest, WqeFlags, WrOp, BB_SIZE};
use redn_sys::conv::{idx, low32};
use redn_sys::mem::SharedBuffer;
use redn_sys::nic::{Nic, QpInfo};
use redn_sys::softnic::SoftNic;
use redn_sys::{Cqn, Qpn};
use std::sync::Arc;

/// [`WqeFlags::SIGNALED`] if `signaled`, else no flags.
pub fn flags_if(signaled: bool) -> WqeFlags {
    if signaled {
        WqeFlags::SIGNALED
    } else {
        WqeFlags::NONE
    }
}

/// A NOP work request.
pub fn nop(flags: WqeFlags, wr_id: u64) -> WorkRequest {
    WorkRequest {
        wr_id,
        flags,
        op: WrOp::Nop {
            raw_segments: Vec::new(),
        },
    }
}

/// Writes WQE bytes straight into a send ring (what a driver does), so encoding is never
/// timed; the doorbell (or a SEND_EN) is what a measurement starts with.
#[derive(Debug)]
pub struct SqWriter {
    /// The queue pair whose send ring this writes.
    pub qpn: Qpn,
    /// The buffer holding the ring.
    pub buf: Arc<SharedBuffer>,
    off: usize,
    entries: u64,
    /// Producer index (BBs), absolute.
    pub pi: u64,
    check_full: bool,
}

impl SqWriter {
    /// With `check_full`, [`SqWriter::push`] asks the softnic how far it has consumed and
    /// fails rather than overwrite WQEs it has not executed yet.
    pub fn new(info: &QpInfo, check_full: bool) -> SqWriter {
        SqWriter {
            qpn: info.qpn,
            buf: Arc::clone(&info.sq.buffer),
            off: info.sq.offset,
            entries: u64::from(info.sq.entries),
            pi: 0,
            check_full,
        }
    }

    /// Byte offset in `buf` of ring slot `index` (absolute).
    pub fn slot_off(&self, index: u64) -> usize {
        self.off + idx(index & (self.entries - 1)) * BB_SIZE
    }

    /// Write `wr` at the producer index and tell the softnic it was posted (no doorbell).
    pub fn push(&mut self, nic: &SoftNic, wr: &WorkRequest) -> Result<(), String> {
        let e = encode_wqe(wr, self.qpn, wqe_index(self.pi)).ctx("encode_wqe")?;
        let end = self.pi + e.bbs() as u64;
        if self.check_full {
            let consumed = nic.sq_consumed(self.qpn).ctx("sq_consumed")?;
            if end - consumed > self.entries {
                return Err(format!(
                    "send ring of QP {} full ({} BBs)",
                    self.qpn, self.entries
                ));
            }
        }
        for (i, bb) in e.bytes().chunks_exact(BB_SIZE).enumerate() {
            self.buf.write(self.slot_off(self.pi + i as u64), bb);
        }
        nic.note_posted(self.qpn, self.pi, end, wr.wr_id)
            .ctx("note_posted")?;
        self.pi = end;
        Ok(())
    }

    /// Ring the doorbell up to the producer index.
    pub fn ring(&self, nic: &SoftNic) -> Result<(), String> {
        nic.ring_doorbell(self.qpn, self.pi).ctx("ring_doorbell")
    }
}

/// Post a WAIT for `cq`'s first completion on the queue `info` and ring its doorbell: with a CQ
/// that nothing completes into, the queue sits on it for good (a manager's idle client).
pub fn post_endless_wait(nic: &SoftNic, info: &QpInfo, cq: Cqn) -> Result<(), String> {
    let mut w = SqWriter::new(info, false);
    let wait = WorkRequest {
        wr_id: 0,
        flags: WqeFlags::NONE,
        op: WrOp::Wait { cq, count: 0 },
    };
    w.push(nic, &wait)?;
    w.ring(nic)
}

/// The master queue's half of a doorbell-ordered chain of `n` steps (RedN §3.1): SEND_EN of
/// the managed queue `q` up to its first WQE, then for each further step WAIT(`q_cq`, the
/// previous WQE's completion) + SEND_EN of the next. `qb` is `q`'s producer index before the
/// chain's WQEs and `base` the CQ's count then; the last SEND_EN enables `extra` more WQEs.
#[allow(clippy::too_many_arguments)]
pub fn push_doorbell_master(
    nic: &SoftNic,
    m: &mut SqWriter,
    q: Qpn,
    q_cq: Cqn,
    qb: u64,
    base: u64,
    n: u64,
    extra: u64,
) -> Result<(), String> {
    let enable = |k: u64| WorkRequest {
        wr_id: 0,
        flags: WqeFlags::NONE,
        op: WrOp::SendEnable {
            qp: q,
            // SEND_EN counts are 32 bits and wrap, as the hardware's do.
            pi: low32(qb + k + if k == n { extra } else { 0 }),
        },
    };
    m.push(nic, &enable(1))?;
    for k in 1..n {
        let wait = WorkRequest {
            wr_id: 0,
            flags: WqeFlags::NONE,
            op: WrOp::Wait {
                cq: q_cq,
                count: low32(base + k - 1),
            },
        };
        m.push(nic, &wait)?;
        m.push(nic, &enable(k + 1))?;
    }
    Ok(())
}
