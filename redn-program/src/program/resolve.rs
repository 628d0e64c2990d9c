//! Resolving one client's instance of a program: the addresses, keys and queue numbers its
//! symbols stand for ([`Resolver`]), and the bytes of its code region ([`Program::render`]).

use super::layout::CodeLayout;
use super::windows::CodeWindow;
use super::{
    code_usize, Addr, Form, Op, Operand, Program, ProgramError, QueueRole, Sge, Slots, WqePos,
    MAX_OPERAND,
};
use crate::endian::{Be16, Be32, Be64};
use crate::types::{Cqn, Lkey, Qpn, Rkey, VirtAddr};
use crate::wqe::{
    self, encode_recv, encode_wqe, wqe_index, Payload, RemoteAddr, WorkRequest, WrOp, BB_SIZE,
    SEG_SIZE,
};
use std::collections::HashMap;

/// A bound region: where it is and its key.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Bound {
    /// First address.
    pub addr: VirtAddr,
    /// Key (lkey == rkey).
    pub key: u32,
    /// Length.
    pub len: u64,
}

/// Everything needed to turn symbols into numbers for one client's instance.
///
/// Keys depend on which side uses them: worker queues and the client-facing queue sit in
/// protection domains of their own, so a region bound for both has a key on each side, and
/// code bytes are named only through the narrow key of a [`CodeWindow`] of that side.
#[derive(Clone, Debug)]
pub struct Resolver {
    /// The code region's first address.
    pub code_addr: VirtAddr,
    /// The layout inside it.
    pub layout: CodeLayout,
    /// The code windows and their keys.
    pub code_keys: Vec<(CodeWindow, u32)>,
    /// Bound regions by side and name.
    pub regions: HashMap<(QueueRole, String), Bound>,
    /// Each queue's QPN and CQN, in program order.
    pub queues: Vec<(Qpn, Cqn)>,
    /// WQE label -> position, built once: resolving is linear in the program's size.
    positions: HashMap<String, WqePos>,
    /// (side, 64-byte block of the code region) -> the code windows touching it, so that a
    /// key is found among a few windows rather than all of them.
    windows_by_block: HashMap<(QueueRole, usize), Vec<usize>>,
}

impl Resolver {
    /// A resolver for `program` placed at `code_addr` with `layout`, naming its code through
    /// `code_keys` and its regions through `regions`.
    pub fn new(
        program: &Program,
        code_addr: VirtAddr,
        layout: CodeLayout,
        code_keys: Vec<(CodeWindow, u32)>,
        regions: HashMap<(QueueRole, String), Bound>,
        queues: Vec<(Qpn, Cqn)>,
    ) -> Resolver {
        let positions = program
            .wqe_positions()
            .into_iter()
            .map(|(label, pos)| (label.to_string(), pos))
            .collect();
        let mut windows_by_block: HashMap<(QueueRole, usize), Vec<usize>> = HashMap::new();
        for (i, (w, _)) in code_keys.iter().enumerate() {
            let last = (w.offset + w.len.max(1) - 1) / BB_SIZE;
            for block in w.offset / BB_SIZE..=last {
                windows_by_block.entry((w.side, block)).or_default().push(i);
            }
        }
        Resolver {
            code_addr,
            layout,
            code_keys,
            windows_by_block,
            regions,
            queues,
            positions,
        }
    }

    /// A resolver for `program` laid out as `layout`, with stand-in numbers: a key of its own
    /// for every code window, every region bound on both sides at an address of its own, a
    /// QPN and CQN of its own for every queue, all distinct so that no check passes by
    /// coincidence. For what needs a program's bytes without a NIC (the verifier, tools).
    pub fn stand_in(program: &Program, layout: CodeLayout) -> Result<Resolver, ProgramError> {
        let code_keys = program
            .code_windows(&layout)?
            .into_iter()
            .zip(0x1000u32..)
            .map(|(w, i)| (w, i << 8 | 0x5a))
            .collect();
        let mut regions = HashMap::new();
        for (i, r) in (0u32..).zip(&program.regions) {
            for side in [QueueRole::Worker, QueueRole::Client] {
                let bound = Bound {
                    addr: VirtAddr(0x7000_0000_0000 + (u64::from(i) << 32)),
                    key: 0x0a00_0000 | i << 8,
                    len: r.min_len,
                };
                regions.insert((side, r.name.clone()), bound);
            }
        }
        let queues = (0u32..)
            .zip(&program.queues)
            .map(|(i, _)| (Qpn(0x00a0_0000 | i << 4), Cqn(0x00b0_0000 | i << 4)))
            .collect();
        Ok(Resolver::new(
            program,
            VirtAddr(0x5000_0000_0000),
            layout,
            code_keys,
            regions,
            queues,
        ))
    }

    fn find<'p>(
        &self,
        p: &'p Program,
        label: &str,
    ) -> Result<(usize, u64, &'p super::Wqe), ProgramError> {
        self.positions
            .get(label)
            .and_then(|&pos| Some((pos.queue, pos.bb, p.wqe_at(pos)?)))
            .ok_or_else(|| ProgramError::Unknown {
                kind: "WQE label",
                name: label.into(),
            })
    }

    fn wqe_pos(&self, p: &Program, label: &str) -> Result<(usize, u64), ProgramError> {
        self.find(p, label).map(|(q, at, _)| (q, at))
    }

    /// Resolve an address.
    pub fn addr(&self, p: &Program, a: &Addr) -> Result<VirtAddr, ProgramError> {
        Ok(match a {
            Addr::Region { region, offset } => {
                let b = self
                    .regions
                    .iter()
                    .find(|((_, name), _)| name == region)
                    .map(|(_, b)| b)
                    .ok_or_else(|| unbound(region))?;
                VirtAddr(b.addr.0 + offset)
            }
            Addr::Wqe { label, byte } => {
                let (q, at) = self.wqe_pos(p, label)?;
                VirtAddr(
                    self.code_addr.0
                        + (self.layout.sq[q] + code_usize(at)? * BB_SIZE) as u64
                        + u64::from(*byte),
                )
            }
            Addr::Static { name, offset } => {
                let i = p
                    .statics
                    .iter()
                    .position(|s| &s.name == name)
                    .ok_or_else(|| ProgramError::Unknown {
                        kind: "static block",
                        name: name.clone(),
                    })?;
                VirtAddr(self.code_addr.0 + self.layout.statics[i] as u64 + offset)
            }
        })
    }

    /// The key that a queue of `side` uses for the `len` bytes at `a`: the region's key on
    /// that side, or the key of the code window that covers them.
    pub fn key(
        &self,
        p: &Program,
        side: QueueRole,
        a: &Addr,
        len: u64,
    ) -> Result<u32, ProgramError> {
        if let Addr::Region { region, .. } = a {
            return self
                .regions
                .get(&(side, region.clone()))
                .map(|b| b.key)
                .ok_or_else(|| unbound(region));
        }
        let offset = self.addr(p, a)?.0 - self.code_addr.0;
        let (offset, len) = (code_usize(offset)?, code_usize(len)?);
        self.windows_by_block
            .get(&(side, offset / BB_SIZE))
            .into_iter()
            .flatten()
            .map(|&i| &self.code_keys[i])
            .find(|(w, _)| w.covers(offset, len))
            .map(|(_, key)| *key)
            .ok_or_else(|| {
                ProgramError::Invalid(format!(
                    "no code window of the {side:?} side covers {len} bytes at {a:?}"
                ))
            })
    }

    fn sge(&self, p: &Program, side: QueueRole, s: &Sge) -> Result<wqe::Sge, ProgramError> {
        Ok(wqe::Sge {
            addr: self.addr(p, &s.addr)?,
            len: s.len,
            lkey: Lkey(self.key(p, side, &s.addr, u64::from(s.len))?),
        })
    }

    fn remote(
        &self,
        p: &Program,
        side: QueueRole,
        a: &Addr,
        len: u64,
    ) -> Result<RemoteAddr, ProgramError> {
        Ok(RemoteAddr {
            addr: self.addr(p, a)?,
            rkey: Rkey(self.key(p, side, a, len)?),
        })
    }

    fn queue(&self, p: &Program, name: &str) -> Result<(Qpn, Cqn), ProgramError> {
        p.queue(name)
            .map(|(i, _)| self.queues[i])
            .ok_or_else(|| ProgramError::Unknown {
                kind: "queue",
                name: name.into(),
            })
    }

    /// The 8 control bytes of WQE `label`: opcode per `form`, operand bytes per `slots`,
    /// ds from the WQE unless `ds` overrides it.
    pub fn ctrl_image(
        &self,
        p: &Program,
        label: &str,
        form: Form,
        slots: Slots,
        ds: Option<u8>,
    ) -> Result<[u8; 8], ProgramError> {
        let (q, at, w) = self.find(p, label)?;
        let ds = ds.unwrap_or_else(|| w.op.ds());
        let opcode = match form {
            Form::Nop => wqe::Opcode::Nop as u8,
            Form::Active => w.op.opcode() as u8,
        };
        let s = match slots {
            Slots::Real => {
                let idx = Be16::new(wqe_index(at)).to_bytes();
                let qpn = Be32::new(self.queues[q].0 .0).to_bytes();
                [0, idx[0], idx[1], qpn[1], qpn[2], qpn[3]]
            }
            Slots::Operand(v) => {
                if v > MAX_OPERAND {
                    return Err(ProgramError::OperandTooWide(v));
                }
                let b = Be64::new(v).to_bytes();
                [b[2], b[3], b[4], b[5], b[6], b[7]]
            }
        };
        Ok([s[0], s[1], s[2], opcode, s[3], s[4], s[5], ds])
    }

    fn operand(&self, p: &Program, o: &Operand) -> Result<u64, ProgramError> {
        Ok(match o {
            Operand::Lit(v) => *v,
            Operand::Ctrl {
                label,
                form,
                slots,
                ds,
            } => u64::from_le_bytes(self.ctrl_image(p, label, *form, *slots, *ds)?),
        })
    }

    /// The concrete work request for a template on a queue of `side`.
    pub fn work_request(
        &self,
        p: &Program,
        side: QueueRole,
        op: &Op,
    ) -> Result<WrOp, ProgramError> {
        let sgl = |v: &[Sge]| {
            v.iter()
                .map(|s| self.sge(p, side, s))
                .collect::<Result<Vec<_>, _>>()
        };
        let total = |v: &[Sge]| v.iter().map(|s| u64::from(s.len)).sum::<u64>();
        Ok(match op {
            Op::Other { opcode } => {
                return Err(ProgramError::Invalid(format!(
                    "opcode {opcode:#04x} cannot be rendered"
                )))
            }
            Op::Nop => WrOp::Nop {
                raw_segments: vec![],
            },
            Op::Write {
                remote,
                sgl: s,
                imm,
            } => WrOp::Write {
                remote: self.remote(p, side, remote, total(s))?,
                payload: Payload::Sgl(sgl(s)?),
                imm: *imm,
            },
            Op::Read { remote, sgl: s } => WrOp::Read {
                remote: self.remote(p, side, remote, total(s))?,
                sgl: sgl(s)?,
            },
            Op::Cas {
                remote,
                compare,
                swap,
                result,
            } => WrOp::CompareSwap {
                remote: self.remote(p, side, remote, 8)?,
                compare: self.operand(p, compare)?,
                swap: self.operand(p, swap)?,
                result: result.as_ref().map(|r| self.sge(p, side, r)).transpose()?,
            },
            Op::MaskedCas {
                remote,
                compare,
                compare_mask,
                swap,
                swap_mask,
            } => WrOp::MaskedCompareSwap {
                remote: self.remote(p, side, remote, 8)?,
                compare: self.operand(p, compare)?,
                compare_mask: *compare_mask,
                swap: self.operand(p, swap)?,
                swap_mask: *swap_mask,
                result: None,
            },
            Op::Faa {
                remote,
                add,
                result,
            } => WrOp::FetchAdd {
                remote: self.remote(p, side, remote, 8)?,
                add: *add,
                result: result.as_ref().map(|r| self.sge(p, side, r)).transpose()?,
            },
            Op::Wait { queue, count } => WrOp::Wait {
                cq: self.queue(p, queue)?.1,
                count: *count,
            },
            Op::SendEn { queue, count } => WrOp::SendEnable {
                qp: self.queue(p, queue)?.0,
                pi: *count,
            },
            Op::RecvEn { queue, count } => WrOp::RecvEnable {
                qp: self.queue(p, queue)?.0,
                pi: *count,
            },
        })
    }
}

/// The bytes of one client's code region, ready to copy in.
#[derive(Clone, Debug)]
#[non_exhaustive]
pub struct Rendered {
    /// The whole code region.
    pub code: Vec<u8>,
    /// BBs of WQEs in each queue (its posted index).
    pub posted: Vec<u64>,
    /// Receives in each queue.
    pub recvs: Vec<u64>,
}

impl Program {
    /// The bytes of WQE `w` of a queue of `side` numbered `qpn`, at ring index `at`, as the
    /// installer writes them (a conditional WQE in its NOP form).
    pub fn render_wqe(
        &self,
        r: &Resolver,
        side: QueueRole,
        qpn: Qpn,
        w: &super::Wqe,
        at: u64,
    ) -> Result<Vec<u8>, ProgramError> {
        let wr = WorkRequest {
            wr_id: 0,
            flags: w.flags,
            op: r.work_request(self, side, &w.op)?,
        };
        let e = encode_wqe(&wr, qpn, wqe_index(at))
            .map_err(|e| ProgramError::Invalid(format!("WQE {}: {e}", w.label)))?;
        debug_assert_eq!(e.bbs() as u64, w.op.bbs(), "{}", w.label);
        let mut bytes = e.bytes().to_vec();
        if w.form == Form::Nop {
            let img = r.ctrl_image(self, &w.label, Form::Nop, Slots::Operand(0), None)?;
            bytes[..8].copy_from_slice(&img);
        }
        Ok(bytes)
    }

    /// Resolve every symbol and produce the code region's bytes.
    pub fn render(&self, r: &Resolver) -> Result<Rendered, ProgramError> {
        let mut code = vec![0u8; r.layout.len];
        let mut posted = Vec::new();
        let mut recvs = Vec::new();
        for (qi, q) in self.queues.iter().enumerate() {
            let qpn = r.queues[qi].0;
            let mut at = 0usize;
            for w in &q.wqes {
                let off = r.layout.sq[qi] + at * BB_SIZE;
                let bytes = self.render_wqe(r, q.role, qpn, w, at as u64)?;
                code[off..off + bytes.len()].copy_from_slice(&bytes);
                at += bytes.len() / BB_SIZE;
            }
            posted.push(at as u64);
            let stride = q.rq_sges as usize * SEG_SIZE;
            for (i, recv) in q.recvs.iter().enumerate() {
                let sgl = recv
                    .sgl
                    .iter()
                    .map(|s| r.sge(self, q.role, s))
                    .collect::<Result<Vec<_>, _>>()?;
                let bytes = encode_recv(&sgl, q.rq_sges as usize).map_err(|e| {
                    ProgramError::Invalid(format!("queue {} receive {i}: {e}", q.name))
                })?;
                let off = r.layout.rq[qi] + i * stride;
                code[off..off + stride].copy_from_slice(&bytes);
            }
            recvs.push(q.recvs.len() as u64);
        }
        for (b, off) in self.statics.iter().zip(&r.layout.statics) {
            code[*off..*off + b.bytes.len()].copy_from_slice(&b.bytes);
        }
        Ok(Rendered {
            code,
            posted,
            recvs,
        })
    }
}

fn unbound(region: &str) -> ProgramError {
    ProgramError::Unknown {
        kind: "region binding",
        name: region.into(),
    }
}
