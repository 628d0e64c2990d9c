//! Self-modification: every write into a WQE lies inside a declared patch point of its
//! source; no patch point runs past its WQE or covers a protected field, except RedN's
//! `if` (a CAS on a control word with verified images), a NOP reset from a constant
//! template, a conditional WQE's operands and a FETCH_ADD's old value in a count's high
//! half. It relies on the installer's narrow keys: nothing writes code outside a patch point.

use super::checker::Checker;
use super::{allowed, control, min_ds, overlap, source_name, Rule, SEG_BYTES, WAIT_PI_BYTE};
use redn_program::program::{Addr, Form, Op, Operand, PatchSource, Slots};
use redn_program::wqe::BB_SIZE;

/// Byte ranges of a WQE that nothing but the installer may write, with their names.
fn protected(op: &Op) -> Vec<(u32, u32, &'static str)> {
    let mut v = vec![
        (3, 4, "opcode"),
        (7, 8, "ds"),
        (8, 12, "signature and flags"),
        (0, 3, "opmod and index"),
        (4, 7, "QPN"),
    ];
    let ds = u32::from(op.ds());
    match op {
        Op::Write { .. }
        | Op::Read { .. }
        | Op::Cas { .. }
        | Op::MaskedCas { .. }
        | Op::Faa { .. } => {
            v.push((24, 28, "rkey"));
            v.push((28, 32, "reserved"));
        }
        Op::Wait { .. } | Op::SendEn { .. } | Op::RecvEn { .. } => {
            v.push((16, 24, "reserved"));
            v.push((28, 32, "object number (QP/CQ)"));
        }
        _ => {}
    }
    let first_data = match op {
        Op::Write { .. } | Op::Read { .. } => Some(2),
        Op::Cas {
            result: Some(_), ..
        }
        | Op::Faa {
            result: Some(_), ..
        } => Some(3),
        _ => None,
    };
    if let Some(first) = first_data {
        for s in first..ds {
            let b = s * SEG_BYTES;
            // Bit 31 of a byte count makes the segment inline (mlx5's MLX5_INLINE_SEG, which
            // a ConnectX honours as the softnic does): the WQE's own bytes become the data,
            // and a WRITE sends them (its keys and addresses) to the peer.
            v.push((b, b + 1, "byte count's inline bit"));
            v.push((b + 4, b + 8, "lkey"));
        }
    }
    // A WQE has at most 16 BBs; were it ever too long for a u32, the padding would still
    // run to the end.
    let end = u32::try_from(op.bbs() * 64).unwrap_or(u32::MAX);
    v.push((ds * SEG_BYTES, end, "padding"));
    v
}

impl Checker<'_> {
    /// A write of `len` bytes at `a` by `source`: if it lands in a WQE, it must be inside a
    /// declared patch point of that source.
    pub(super) fn code_write(
        &mut self,
        qn: &str,
        here: Option<(u64, &str)>,
        field: &str,
        a: &Addr,
        len: u64,
        source: &PatchSource,
    ) {
        let Addr::Wqe { label, byte } = a else { return };
        let (b, e) = (u64::from(*byte), u64::from(*byte).saturating_add(len));
        // The write may be covered by several adjacent patch points of the same source:
        // sweep them in order of their first byte (lengths come from files; no byte maps).
        let mut points: Vec<(u64, u64)> = self
            .patches
            .get(label.as_str())
            .into_iter()
            .flatten()
            .filter(|pp| &pp.source == source)
            .map(|pp| (u64::from(pp.byte), u64::from(pp.byte) + u64::from(pp.len)))
            .collect();
        points.sort_unstable();
        let mut covered_to = b;
        for (from, to) in points {
            if from > covered_to {
                break;
            }
            covered_to = covered_to.max(to);
        }
        if covered_to < e {
            self.find(
                Some(qn),
                here,
                field,
                Rule::UndeclaredPatch,
                format!(
                    "writes {label}@{b}..{e} outside every patch point declared for {}{}: \
                     the installer grants no key over them",
                    source_name(source),
                    self.code_bytes(label, b, e)
                ),
            );
        }
    }

    /// `, code bytes X..Y`: where bytes `from..to` of WQE `label` lie in the code region,
    /// which a key would have to cover to write them.
    fn code_bytes(&self, label: &str, from: u64, to: u64) -> String {
        let Some(layout) = &self.layout else {
            return String::new();
        };
        let Some(&pos) = self.idx.at.get(label) else {
            return String::new();
        };
        let at = layout.sq.get(pos.queue).and_then(|&sq| {
            let wqe = u64::try_from(sq)
                .ok()?
                .checked_add(pos.bb.checked_mul(BB_SIZE as u64)?)?;
            Some((wqe.checked_add(from)?, wqe.checked_add(to)?))
        });
        match at {
            Some((x, y)) => format!(" (code bytes {x}..{y})"),
            None => String::new(),
        }
    }

    pub(super) fn ctrl_operand_ok(
        &mut self,
        qn: &str,
        here: (u64, &str),
        field: &str,
        o: &Operand,
        target: &str,
        what: &str,
    ) {
        let Some((_, _, t)) = self.idx.wqe(target) else {
            return;
        };
        match o {
            Operand::Lit(_) => self.find(
                Some(qn),
                Some(here),
                field,
                Rule::UnsafeSwap,
                format!("{what} of a control word must be a control image, not a literal"),
            ),
            Operand::Ctrl {
                label,
                form,
                slots,
                ds,
            } => {
                if label != target {
                    self.find(
                        Some(qn),
                        Some(here),
                        field,
                        Rule::UnsafeSwap,
                        format!("{what} is the image of {label:?}, not of the target {target:?}"),
                    );
                }
                if *form == Form::Active && !allowed(t.op.opcode_byte()) {
                    self.find(
                        Some(qn),
                        Some(here),
                        field,
                        Rule::UnsafeSwap,
                        format!(
                            "{what} installs opcode {:#04x}, which is not allowed",
                            t.op.opcode_byte()
                        ),
                    );
                }
                if what == "swap" && *form == Form::Active && *slots != Slots::Real {
                    self.find(Some(qn), Some(here), field, Rule::UnsafeSwap, format!("swap installs an active {} with an operand in its QPN and index bytes instead of the queue's own", t.op.opcode().name()));
                }
                if let Some(d) = ds {
                    let own = t.op.ds();
                    let min = if *form == Form::Active {
                        min_ds(&t.op)
                    } else {
                        1
                    };
                    if *d > own || *d < min {
                        self.find(Some(qn), Some(here), field, Rule::BadDs, format!("{what} sets ds {d}; {target:?} holds {own} segments and its opcode needs at least {min}"));
                    }
                }
            }
        }
    }

    /// Patch points: sources exist and are of the right kind; no protected bytes.
    pub(super) fn patch_points(&mut self) {
        let p = self.p;
        let cas_targets: std::collections::HashSet<&str> = p
            .queues
            .iter()
            .flat_map(|q| &q.wqes)
            .filter_map(|w| match &w.op {
                Op::Cas {
                    remote: Addr::Wqe { label, byte: 0 },
                    ..
                }
                | Op::MaskedCas {
                    remote: Addr::Wqe { label, byte: 0 },
                    ..
                } => Some(label.as_str()),
                _ => None,
            })
            .collect();
        for pp in &p.patches {
            let Some((qi, pos, w)) = self.idx.wqe(&pp.label) else {
                self.find(
                    None,
                    None,
                    "patch",
                    Rule::UnknownName,
                    format!("patch point on unknown WQE {:?}", pp.label),
                );
                continue;
            };
            let qn = p.queues[qi].name.clone();
            let here = Some((pos, pp.label.as_str()));
            let end = pp.byte.saturating_add(pp.len);
            let field = format!(
                "bytes {}..{}",
                pp.byte,
                u64::from(pp.byte) + u64::from(pp.len)
            );
            // The source must exist and be of its kind.
            let kind_ok = match &pp.source {
                PatchSource::Trigger { param } => p.params.iter().any(|x| &x.name == param),
                PatchSource::Read { label } => {
                    matches!(self.idx.wqe(label).map(|x| &x.2.op), Some(Op::Read { .. }))
                }
                PatchSource::Cas { label } => matches!(
                    self.idx.wqe(label).map(|x| &x.2.op),
                    Some(Op::Cas { .. } | Op::MaskedCas { .. })
                ),
                PatchSource::AtomicResult { label } => matches!(
                    self.idx.wqe(label).map(|x| &x.2.op),
                    Some(Op::Cas { .. } | Op::Faa { .. })
                ),
                PatchSource::Write { label } => {
                    matches!(self.idx.wqe(label).map(|x| &x.2.op), Some(Op::Write { .. }))
                }
            };
            if !kind_ok {
                self.find(
                    Some(&qn),
                    here,
                    &field,
                    Rule::UnknownName,
                    format!(
                        "patch source {} does not exist or is not of that kind",
                        source_name(&pp.source)
                    ),
                );
            }
            // Bytes past the WQE's blocks are the next WQE's (its control word, count, QP
            // number), which no protected range of this WQE names.
            let (size, to) = (w.op.bbs() * 64, u64::from(pp.byte) + u64::from(pp.len));
            if to > size {
                self.find(
                    Some(&qn),
                    here,
                    &field,
                    Rule::OutOfRegion,
                    format!(
                        "patch point {}@{}..{to} runs past the WQE's {size} bytes into the next \
                         WQE's{}",
                        pp.label,
                        pp.byte,
                        self.code_bytes(&pp.label, u64::from(pp.byte), to)
                    ),
                );
            }
            let conditional = cas_targets.contains(&pp.label.as_str());
            for (b, e, name) in protected(&w.op) {
                if !overlap((pp.byte, end), (b, e)) {
                    continue;
                }
                let ok = match (&pp.source, name) {
                    // RedN's `if`: a (verified) CAS rewrites the whole control word.
                    (PatchSource::Cas { .. }, _) if pp.byte == 0 && pp.len == 8 && b < 8 => true,
                    // A conditional WQE put back in its NOP form from a constant template.
                    (PatchSource::Write { label }, _)
                        if conditional
                            && pp.byte == 0
                            && pp.len == 8
                            && b < 8
                            && self.nop_reset(label, w) =>
                    {
                        true
                    }
                    // The operand bytes of a conditional WQE are data until the CAS decides.
                    (_, "opmod and index" | "QPN") if conditional => true,
                    // A FETCH_ADD's big-endian old value fills a count's high, reserved half.
                    (PatchSource::AtomicResult { .. }, "reserved")
                        if matches!(
                            w.op,
                            Op::Wait { .. } | Op::SendEn { .. } | Op::RecvEn { .. }
                        ) && pp.byte == WAIT_PI_BYTE - 4
                            && pp.len == 8 =>
                    {
                        true
                    }
                    _ => false,
                };
                if !ok {
                    self.find(
                        Some(&qn),
                        here,
                        &field,
                        Rule::ProtectedField,
                        format!(
                            "{} may rewrite the {name} (bytes {b}..{e}) through the key over \
                             its patch point {}@{}..{end}{}",
                            source_name(&pp.source),
                            pp.label,
                            pp.byte,
                            self.code_bytes(&pp.label, u64::from(pp.byte), u64::from(end))
                        ),
                    );
                }
            }
            // A CAS on a control word: its compare may be patched only in the operand bytes,
            // its swap not at all.
            if let Op::Cas {
                remote: Addr::Wqe { byte: 0, .. },
                ..
            }
            | Op::MaskedCas {
                remote: Addr::Wqe { byte: 0, .. },
                ..
            } = &w.op
            {
                let operand_slots = [(41u32, 44u32), (45, 48)];
                let r = (pp.byte, end);
                let in_slots = operand_slots.iter().any(|s| r.0 >= s.0 && r.1 <= s.1);
                if overlap(r, (32, 64)) && !in_slots {
                    self.find(
                        Some(&qn),
                        here,
                        &field,
                        Rule::UnsafeSwap,
                        format!(
                            "{} may rewrite this CAS's swap or the opcode/ds bytes of its compare",
                            source_name(&pp.source)
                        ),
                    );
                }
            }
        }
    }

    /// True if WRITE `label` copies, from a static block nothing ever writes, exactly the NOP
    /// image of `target` (opcode 0, operand bytes 0, its own ds) onto its control word.
    fn nop_reset(&self, label: &str, target: &redn_program::program::Wqe) -> bool {
        let static_written = |name: &str| self.static_written(name);
        let want = u64::from_le_bytes([0, 0, 0, 0, 0, 0, 0, target.op.ds()]);
        control::constant_copy(self.p, &self.idx.at, &static_written, label, &target.label)
            == Some(want)
    }

    /// True if any WQE or receive may write static block `name`.
    pub(super) fn static_written(&self, name: &str) -> bool {
        let hits = |a: &Addr| matches!(a, Addr::Static { name: n, .. } if n == name);
        self.p.queues.iter().any(|q| {
            q.recvs.iter().flat_map(|r| &r.sgl).any(|s| hits(&s.addr))
                || q.wqes.iter().any(|w| match &w.op {
                    Op::Write { remote, .. } => hits(remote),
                    Op::Read { sgl, .. } => sgl.iter().any(|s| hits(&s.addr)),
                    Op::Cas { remote, result, .. } => {
                        hits(remote) || result.as_ref().is_some_and(|r| hits(&r.addr))
                    }
                    Op::Faa { remote, result, .. } => {
                        // Counters are FETCH_ADD targets by design; a template never is.
                        hits(remote) || result.as_ref().is_some_and(|r| hits(&r.addr))
                    }
                    Op::MaskedCas { remote, .. } => hits(remote),
                    _ => false,
                })
        })
    }
}
