//! Checking the file as written and converting it into a [`Program`]: the `build` of
//! [`RawDefinition`], [`RawQueue`] and [`RawWqe`] checks names, the keys each operation
//! takes, ring and slot sizes and static blocks, then [`resolve`]s the names and lays the
//! program out.

use super::fields::{
    check_name, parse_access, parse_addr, parse_hex, parse_operand, parse_sge, parse_sgl,
    parse_source,
};
use super::raw::{
    FormKind, IterKind, OpName, RawDefinition, RawEnable, RawOperand, RawQueue, RawWqe, RegionKind,
    RoleKind, U64,
};
use super::resolve::resolve;
use super::write::FLAG_KEYS;
use super::{MAX_RING_BBS, MAX_RQ_SGES, MAX_RQ_SLOTS, MAX_STATIC_BYTES};
use crate::source::{invalid, Document, Invalid, KeyPath};
use redn_program::program::{
    Addr, Form, Iterations, Op, Param, PatchPoint, Program, Queue, QueueRole, Recv, RegionDecl,
    RegionRole, StaticBlock, Wqe,
};
use redn_program::wqe::{Opcode, WqeFlags, MAX_DS};

impl RawWqe {
    /// The operand keys present, in declaration order.
    fn present(&self) -> Vec<&'static str> {
        [
            ("remote", self.remote.is_some()),
            ("sgl", self.sgl.is_some()),
            ("imm", self.imm.is_some()),
            ("compare", self.compare.is_some()),
            ("compare_mask", self.compare_mask.is_some()),
            ("swap", self.swap.is_some()),
            ("swap_mask", self.swap_mask.is_some()),
            ("add", self.add.is_some()),
            ("result", self.result.is_some()),
            ("queue", self.queue.is_some()),
            ("count", self.count.is_some()),
        ]
        .into_iter()
        .filter_map(|(k, set)| set.then_some(k))
        .collect()
    }

    fn build(&self, at: &KeyPath) -> std::result::Result<Wqe, Invalid> {
        check_name(&at.key("label"), &self.label)?;
        let (name, keys): (String, &[&str]) = match (self.op, self.opcode) {
            (Some(_), Some(_)) => {
                return Err(invalid(
                    at.key("opcode"),
                    "give either op or a raw opcode, not both",
                ))
            }
            (None, None) => {
                return Err(invalid(
                    at.key("op"),
                    "this key is required but missing (or give a raw opcode = 0x..)",
                ))
            }
            (Some(op), None) => (format!("op {:?}", op.name()), op.keys()),
            (None, Some(code)) => (format!("opcode {code:#04x}"), &[]),
        };
        for key in self.present() {
            if !keys.contains(&key) {
                let takes = if keys.is_empty() {
                    "it takes no operands".to_string()
                } else {
                    format!("it takes {}", keys.join(", "))
                };
                return Err(invalid(
                    at.key(key),
                    format!("does not apply to {name}; {takes}"),
                ));
            }
        }
        fn need<'r, T>(
            at: &KeyPath,
            name: &str,
            key: &str,
            v: &'r Option<T>,
        ) -> std::result::Result<&'r T, Invalid> {
            v.as_ref()
                .ok_or_else(|| invalid(at.key(key), format!("{name} needs this key")))
        }
        let remote = || -> std::result::Result<Addr, Invalid> {
            parse_addr(&at.key("remote"), need(at, &name, "remote", &self.remote)?)
        };
        let sgl = || match &self.sgl {
            Some(sgl) => parse_sgl(&at.key("sgl"), sgl),
            None => Ok(Vec::new()),
        };
        let result = || {
            self.result
                .as_ref()
                .map(|r| parse_sge(&at.key("result"), r))
                .transpose()
        };
        let operand = |key: &str, v: &Option<RawOperand>| {
            parse_operand(&at.key(key), need(at, &name, key, v)?)
        };
        let number = |key: &str, v: &Option<U64>| -> std::result::Result<u64, Invalid> {
            Ok(need(at, &name, key, v)?.0)
        };
        let queue = || -> std::result::Result<(String, u32), Invalid> {
            let q = need(at, &name, "queue", &self.queue)?;
            check_name(&at.key("queue"), q)?;
            Ok((q.clone(), *need(at, &name, "count", &self.count)?))
        };
        let op = match (self.op, self.opcode) {
            (None, Some(opcode)) => {
                if let Some(known) = Opcode::from_u8(opcode).filter(|o| {
                    !matches!(o, Opcode::Send | Opcode::SendImm | Opcode::AtomicMaskedFa)
                }) {
                    return Err(invalid(
                        at.key("opcode"),
                        format!(
                            "opcode {opcode:#04x} is {}: write it as op = \"...\" with its operands",
                            known.name()
                        ),
                    ));
                }
                Op::Other { opcode }
            }
            (Some(OpName::Nop), _) => Op::Nop,
            (Some(OpName::Write), _) => Op::Write {
                remote: remote()?,
                sgl: sgl()?,
                imm: self.imm,
            },
            (Some(OpName::Read), _) => Op::Read {
                remote: remote()?,
                sgl: sgl()?,
            },
            (Some(OpName::Cas), _) => Op::Cas {
                remote: remote()?,
                compare: operand("compare", &self.compare)?,
                swap: operand("swap", &self.swap)?,
                result: result()?,
            },
            (Some(OpName::MaskedCas), _) => Op::MaskedCas {
                remote: remote()?,
                compare: operand("compare", &self.compare)?,
                compare_mask: number("compare_mask", &self.compare_mask)?,
                swap: operand("swap", &self.swap)?,
                swap_mask: number("swap_mask", &self.swap_mask)?,
            },
            (Some(OpName::Faa), _) => Op::Faa {
                remote: remote()?,
                add: number("add", &self.add)?,
                result: result()?,
            },
            (Some(OpName::Wait), _) => {
                let (queue, count) = queue()?;
                Op::Wait { queue, count }
            }
            (Some(OpName::SendEn), _) => {
                let (queue, count) = queue()?;
                Op::SendEn { queue, count }
            }
            (Some(OpName::RecvEn), _) => {
                let (queue, count) = queue()?;
                Op::RecvEn { queue, count }
            }
            (None, None) => Op::Nop, // refused above
        };
        if let Op::Write { sgl, .. } | Op::Read { sgl, .. } = &op {
            let segments = 2 + sgl.iter().filter(|s| s.len > 0).count();
            if segments > usize::from(MAX_DS) {
                return Err(invalid(
                    at.key("sgl"),
                    format!(
                        "{} non-empty entries make {segments} segments; a WQE holds at most {MAX_DS}",
                        segments - 2
                    ),
                ));
            }
        }
        let named = [self.signaled, self.fence, self.solicited];
        let flags = match self.flags {
            Some(_) if named.iter().any(Option::is_some) => {
                return Err(invalid(
                    at.key("flags"),
                    "give either the raw flags byte or signaled/fence/solicited, not both",
                ))
            }
            Some(bits) => WqeFlags(bits),
            None => {
                let mut bits = 0;
                for ((flag, _), set) in FLAG_KEYS.iter().zip(named) {
                    if set == Some(true) {
                        bits |= flag.0;
                    }
                }
                WqeFlags(bits)
            }
        };
        let form = match self.form {
            None | Some(FormKind::Active) => Form::Active,
            Some(FormKind::Nop) => Form::Nop,
        };
        Ok(Wqe {
            label: self.label.clone(),
            op,
            flags,
            form,
        })
    }
}

impl RawQueue {
    fn build(&self, at: &KeyPath) -> std::result::Result<Queue, Invalid> {
        check_name(&at.key("name"), &self.name)?;
        for (key, v, max) in [
            ("sq_bbs", self.sq_bbs, MAX_RING_BBS),
            ("rq_slots", self.rq_slots, MAX_RQ_SLOTS),
            ("rq_sges", self.rq_sges, MAX_RQ_SGES),
        ] {
            if !v.is_power_of_two() || v > max {
                return Err(invalid(
                    at.key(key),
                    format!("{v} is not a power of two from 1 to {max}"),
                ));
            }
        }
        let wqes_at = at.key("wqe");
        let wqes = self
            .wqe
            .iter()
            .enumerate()
            .map(|(i, w)| w.build(&wqes_at.index(i)))
            .collect::<std::result::Result<Vec<_>, _>>()?;
        let needed: u64 = wqes.iter().map(|w| w.op.bbs()).sum();
        if needed > u64::from(self.sq_bbs) {
            return Err(invalid(
                at.key("sq_bbs"),
                format!(
                    "the queue's WQEs take {needed} BBs, more than its ring of {}",
                    self.sq_bbs
                ),
            ));
        }
        if self.recv.len() as u64 > u64::from(self.rq_slots) {
            return Err(invalid(
                at.key("rq_slots"),
                format!(
                    "{} receives do not fit {} slots",
                    self.recv.len(),
                    self.rq_slots
                ),
            ));
        }
        let recv_at = at.key("recv");
        let mut recvs = Vec::with_capacity(self.recv.len());
        for (i, r) in self.recv.iter().enumerate() {
            if r.sgl.len() as u64 > u64::from(self.rq_sges) {
                return Err(invalid(
                    recv_at.index(i).key("sgl"),
                    format!(
                        "{} entries, but a slot holds rq_sges = {}",
                        r.sgl.len(),
                        self.rq_sges
                    ),
                ));
            }
            recvs.push(Recv {
                sgl: parse_sgl(&recv_at.index(i).key("sgl"), &r.sgl)?,
            });
        }
        Ok(Queue {
            name: self.name.clone(),
            role: match self.role {
                RoleKind::Worker => QueueRole::Worker,
                RoleKind::Client => QueueRole::Client,
            },
            managed_send: self.managed_send,
            managed_recv: self.managed_recv,
            pu: self.pu.map(|p| p as usize),
            sq_bbs: self.sq_bbs,
            rq_slots: self.rq_slots,
            rq_sges: self.rq_sges,
            wqes,
            recvs,
        })
    }
}

impl RawDefinition {
    pub(super) fn build(&self, doc: &Document<'_>) -> std::result::Result<Program, Invalid> {
        let root = KeyPath::root();
        check_name(&root.key("name"), &self.name)?;
        let iterations = self.iterations(&root.key("iterations"))?;

        // Regions.
        let mut regions = Vec::with_capacity(self.region.len());
        for (i, r) in self.region.iter().enumerate() {
            let at = root.key("region").index(i);
            check_name(&at.key("name"), &r.name)?;
            let role = match (r.role, &r.access) {
                (RegionKind::Data, Some(a)) => RegionRole::Data {
                    access: parse_access(&at.key("access"), a)?,
                },
                (RegionKind::Data, None) => {
                    return Err(invalid(
                        at.key("access"),
                        "a data region needs the rights its WQEs use (\"local-read\" for none)",
                    ))
                }
                (RegionKind::Response, None) => RegionRole::Response,
                (RegionKind::Response, Some(_)) => {
                    return Err(invalid(
                        at.key("access"),
                        "the response region is the client's buffer, written by RDMA WRITE; it takes no access key",
                    ))
                }
            };
            regions.push(RegionDecl {
                name: r.name.clone(),
                role,
                min_len: r.min_len.0,
                doc: r.doc.clone(),
            });
        }

        // Parameters and the trigger length.
        let mut params = Vec::with_capacity(self.param.len());
        let mut next = 0u32;
        let mut end = 0u32;
        for (i, p) in self.param.iter().enumerate() {
            let at = root.key("param").index(i);
            check_name(&at.key("name"), &p.name)?;
            let offset = p.offset.unwrap_or(next);
            next = offset
                .checked_add(p.len)
                .ok_or_else(|| invalid(at.key("len"), "the parameter ends past 2^32 bytes"))?;
            end = end.max(next);
            params.push(Param {
                name: p.name.clone(),
                offset,
                len: p.len,
                doc: p.doc.clone(),
            });
        }
        let trigger_len = match self.trigger_len {
            None => end,
            Some(t) if t >= end => t,
            Some(t) => {
                return Err(invalid(
                    root.key("trigger_len"),
                    format!("{t} bytes, but the parameters reach byte {end}"),
                ))
            }
        };

        // Static blocks.
        let mut statics = Vec::with_capacity(self.statics.len());
        let mut static_bytes = 0u64;
        for (i, b) in self.statics.iter().enumerate() {
            let at = root.key("static").index(i);
            check_name(&at.key("name"), &b.name)?;
            let mut bytes = match &b.bytes {
                Some(hex) => parse_hex(&at.key("bytes"), hex)?,
                None => Vec::new(),
            };
            let len = match (b.len, &b.bytes) {
                (Some(U64(len)), _) => len,
                (None, Some(_)) => bytes.len() as u64,
                (None, None) => {
                    return Err(invalid(
                        at.key("len"),
                        "a static block needs len, bytes, or both",
                    ))
                }
            };
            if (bytes.len() as u64) > len {
                return Err(invalid(
                    at.key("bytes"),
                    format!("{} bytes given for a block of len = {len}", bytes.len()),
                ));
            }
            static_bytes = static_bytes.saturating_add(len);
            if static_bytes > MAX_STATIC_BYTES {
                return Err(invalid(
                    at.key("len"),
                    format!(
                        "the static blocks take more than {MAX_STATIC_BYTES} bytes, the most a program may keep"
                    ),
                ));
            }
            // `len` is at most MAX_STATIC_BYTES (16 MiB) here, so it fits any usize.
            #[allow(clippy::cast_possible_truncation)]
            let len = len as usize;
            bytes.resize(len, 0);
            statics.push(StaticBlock {
                name: b.name.clone(),
                bytes,
            });
        }

        // Queues and their WQEs.
        let queues = self
            .queue
            .iter()
            .enumerate()
            .map(|(i, q)| q.build(&root.key("queue").index(i)))
            .collect::<std::result::Result<Vec<_>, _>>()?;

        // Patch points.
        let mut patches = Vec::with_capacity(self.patch.len());
        for (i, pp) in self.patch.iter().enumerate() {
            let at = root.key("patch").index(i);
            check_name(&at.key("label"), &pp.label)?;
            let (byte, len) = match (&pp.bytes, pp.byte, pp.len) {
                (Some(range), None, None) => match range.as_slice() {
                    [from, to] if from < to => (*from, to - from),
                    _ => {
                        return Err(invalid(
                            at.key("bytes"),
                            "expected [from, to] with from < to: the bytes from..to of the WQE, to excluded",
                        ))
                    }
                },
                (None, Some(byte), Some(len)) if len > 0 => (byte, len),
                (None, Some(_), Some(_)) => {
                    return Err(invalid(at.key("len"), "a patch point covers at least one byte"))
                }
                (Some(_), _, _) => {
                    let key = if pp.byte.is_some() { "byte" } else { "len" };
                    return Err(invalid(
                        at.key(key),
                        "give either bytes = [from, to] or byte and len, not both",
                    ));
                }
                (None, byte, _) => {
                    let key = if byte.is_some() { "len" } else { "bytes" };
                    return Err(invalid(
                        at.key(key),
                        "this key is required but missing (bytes = [from, to], or byte and len)",
                    ));
                }
            };
            patches.push(PatchPoint {
                label: pp.label.clone(),
                byte,
                len,
                source: parse_source(&at.key("source"), &pp.source)?,
            });
        }

        let enables = |key: &str, list: &[RawEnable]| {
            list.iter()
                .enumerate()
                .map(|(i, e)| {
                    check_name(&root.key(key).index(i).key("queue"), &e.queue)?;
                    Ok((e.queue.clone(), e.count))
                })
                .collect::<std::result::Result<Vec<_>, Invalid>>()
        };
        let program = Program {
            name: self.name.clone(),
            summary: self.summary.clone(),
            queues,
            regions,
            statics,
            params,
            trigger_len,
            patches,
            entry: enables("entry", &self.entry)?,
            recv_entry: enables("recv_entry", &self.recv_entry)?,
            iterations,
            response_doc: self.response.clone(),
        };
        resolve(&program, doc)?;
        program
            .layout()
            .map_err(|e| invalid(root.clone(), format!("the program cannot be laid out: {e}")))?;
        Ok(program)
    }

    fn iterations(&self, at: &KeyPath) -> std::result::Result<Iterations, Invalid> {
        let it = &self.iterations;
        let refuse = |key: &str, kind: &str| {
            invalid(at.key(key), format!("does not apply to {kind} iterations"))
        };
        let need = |key: &str, v: Option<u32>, kind: &str| {
            v.ok_or_else(|| invalid(at.key(key), format!("{kind} iterations need this key")))
        };
        match it.kind {
            IterKind::Bounded => {
                if it.wqes_per_round.is_some() {
                    return Err(refuse("wqes_per_round", "bounded"));
                }
                Ok(Iterations::Bounded {
                    invocations: need("invocations", it.invocations, "bounded")?,
                    wqes_per_invocation: need(
                        "wqes_per_invocation",
                        it.wqes_per_invocation,
                        "bounded",
                    )?,
                })
            }
            IterKind::Recycled => {
                for (key, v) in [
                    ("invocations", it.invocations),
                    ("wqes_per_invocation", it.wqes_per_invocation),
                ] {
                    if v.is_some() {
                        return Err(refuse(key, "recycled"));
                    }
                }
                Ok(Iterations::Recycled {
                    wqes_per_round: need("wqes_per_round", it.wqes_per_round, "recycled")?,
                })
            }
        }
    }
}
