//! Each WQE on its own: opcode allow-list, keys granted with the right the opcode needs and
//! used from the right side, static ranges inside their region, block or WQE, atomic
//! targets 8-byte aligned. Only static addresses are checked: patched ones rely on the NIC
//! checking each access against the keys. Writes into WQEs (scatters, atomic results,
//! WRITEs, CASes, receives) go on to [`Checker::code_write`].

use super::checker::Checker;
use super::{allowed, Rule};
use redn_program::program::{Addr, Op, Operand, PatchSource, QueueRole, RegionRole, Sge};
use redn_program::Access;

impl Checker<'_> {
    /// Check one address range used by `q`'s WQE; `remote` for the remote side of an op.
    #[allow(clippy::too_many_arguments)]
    fn range(
        &mut self,
        q: &redn_program::program::Queue,
        here: (u64, &str),
        field: &str,
        a: &Addr,
        len: u64,
        need: Access,
        remote: bool,
    ) {
        let qn = Some(q.name.as_str());
        match a {
            Addr::Region { region, offset } => {
                let decl = self.p.regions.iter().find(|r| &r.name == region);
                let is_response = matches!(decl.map(|d| &d.role), Some(RegionRole::Response));
                if decl.is_none() {
                    self.find(
                        qn,
                        Some(here),
                        field,
                        Rule::UnknownName,
                        format!("region {region:?} is not declared by the program"),
                    );
                    return;
                }
                // Which side may name which region.
                if remote && q.role == QueueRole::Client && !is_response {
                    self.find(
                        qn,
                        Some(here),
                        field,
                        Rule::WrongSide,
                        format!(
                            "region {region:?} is app memory, but this queue's peer is the client"
                        ),
                    );
                    return;
                }
                if is_response && !(remote && q.role == QueueRole::Client) {
                    self.find(qn, Some(here), field, Rule::WrongSide, format!("region {region:?} is the client's buffer: only the client-facing queue may write it"));
                    return;
                }
                let Some(grant) = self.g.regions.get(region) else {
                    self.find(
                        qn,
                        Some(here),
                        field,
                        Rule::KeyNotGranted,
                        format!("region {region:?} is not granted to this client"),
                    );
                    return;
                };
                if !grant.access.contains(need) {
                    self.find(
                        qn,
                        Some(here),
                        field,
                        Rule::MissingRight,
                        format!(
                            "region {region:?} is granted {} but needs {need}",
                            grant.access
                        ),
                    );
                }
                if offset.checked_add(len).map_or(true, |end| end > grant.len) {
                    self.find(
                        qn,
                        Some(here),
                        field,
                        Rule::OutOfRegion,
                        format!(
                            "{region}+{offset}..+{len} is outside the {}-byte region",
                            grant.len
                        ),
                    );
                }
            }
            Addr::Static { name, offset } => {
                match self.p.statics.iter().find(|s| &s.name == name) {
                    None => self.find(
                        qn,
                        Some(here),
                        field,
                        Rule::UnknownName,
                        format!("static block {name:?} does not exist"),
                    ),
                    Some(s)
                        if offset
                            .checked_add(len)
                            .map_or(true, |e| e > s.bytes.len() as u64) =>
                    {
                        self.find(
                            qn,
                            Some(here),
                            field,
                            Rule::OutOfRegion,
                            format!(
                                "static {name}+{offset}..+{len} is outside its {} bytes",
                                s.bytes.len()
                            ),
                        );
                    }
                    Some(_) if remote && q.role == QueueRole::Client => {
                        self.find(
                            qn,
                            Some(here),
                            field,
                            Rule::WrongSide,
                            "the code region is not reachable through the client's connection"
                                .into(),
                        );
                    }
                    Some(_) => {}
                }
            }
            Addr::Wqe { label, byte } => match self.idx.wqe(label) {
                None => self.find(
                    qn,
                    Some(here),
                    field,
                    Rule::UnknownName,
                    format!("WQE {label:?} does not exist"),
                ),
                Some((_, _, w)) => {
                    if u64::from(*byte) + len > w.op.bbs() * 64 {
                        self.find(
                            qn,
                            Some(here),
                            field,
                            Rule::OutOfRegion,
                            format!("{label}@{byte}..+{len} is outside that WQE"),
                        );
                    }
                    if remote && q.role == QueueRole::Client {
                        self.find(
                            qn,
                            Some(here),
                            field,
                            Rule::WrongSide,
                            "the code region is not reachable through the client's connection"
                                .into(),
                        );
                    }
                }
            },
        }
    }

    pub(super) fn wqes(&mut self) {
        let p = self.p;
        for q in &p.queues {
            let qn = q.name.as_str();
            let mut pos = 0u64;
            for w in &q.wqes {
                let here = (pos, w.label.as_str());
                let byte = w.op.opcode_byte();
                if !allowed(byte) {
                    self.find(
                        Some(qn),
                        Some(here),
                        "opcode",
                        Rule::Opcode,
                        format!("opcode {byte:#04x} is not on the allow-list"),
                    );
                } else if let Op::Other { .. } = &w.op {
                    // A raw opcode (from a definition's `opcode = 0x..`) has no operands to check.
                    self.find(
                        Some(qn),
                        Some(here),
                        "opcode",
                        Rule::Opcode,
                        format!(
                            "raw opcode {byte:#04x} carries no operands the verifier can check"
                        ),
                    );
                }
                let src = |l: &str| l.to_string();
                match &w.op {
                    Op::Write { remote, sgl, .. } => {
                        let len: u64 = sgl.iter().map(|s| u64::from(s.len)).sum();
                        self.range(q, here, "raddr", remote, len, Access::REMOTE_WRITE, true);
                        if let Addr::Wqe { .. } = remote {
                            self.code_write(
                                qn,
                                Some(here),
                                "raddr",
                                remote,
                                len,
                                &PatchSource::Write {
                                    label: src(&w.label),
                                },
                            );
                        }
                        for (i, s) in sgl.iter().enumerate() {
                            self.range(
                                q,
                                here,
                                &format!("sgl[{i}]"),
                                &s.addr,
                                u64::from(s.len),
                                Access::NONE,
                                false,
                            );
                            // Ring bytes hold keys and addresses: they never leave the server.
                            if q.role == QueueRole::Client && matches!(s.addr, Addr::Wqe { .. }) {
                                self.find(
                                    Some(qn),
                                    Some(here),
                                    &format!("sgl[{i}]"),
                                    Rule::WrongSide,
                                    "WQE bytes are never a source of data sent to the client"
                                        .into(),
                                );
                            }
                        }
                    }
                    Op::Read { remote, sgl } => {
                        let len: u64 = sgl.iter().map(|s| u64::from(s.len)).sum();
                        if q.role == QueueRole::Client {
                            self.find(Some(qn), Some(here), "opcode", Rule::WrongSide, "READ through the client's connection would read the client's memory".into());
                        }
                        self.range(q, here, "raddr", remote, len, Access::REMOTE_READ, true);
                        for (i, s) in sgl.iter().enumerate() {
                            self.local_write(
                                q,
                                here,
                                &format!("sgl[{i}]"),
                                s,
                                PatchSource::Read {
                                    label: src(&w.label),
                                },
                            );
                        }
                    }
                    Op::Cas {
                        remote,
                        compare,
                        swap,
                        result,
                    } => self.cas(q, here, &w.label, remote, compare, swap, result.as_ref()),
                    Op::MaskedCas {
                        remote,
                        compare,
                        swap,
                        ..
                    } => self.cas(q, here, &w.label, remote, compare, swap, None),
                    Op::Faa { remote, result, .. } => {
                        if let Addr::Wqe { .. } = remote {
                            self.find(Some(qn), Some(here), "raddr", Rule::ProtectedField, "FETCH_ADD aimed at a WQE (WQE fields are big-endian; use a counter and land its old value)".into());
                        }
                        self.atomic_common(q, here, remote, result.as_ref(), &w.label);
                    }
                    Op::Nop
                    | Op::Wait { .. }
                    | Op::SendEn { .. }
                    | Op::RecvEn { .. }
                    | Op::Other { .. } => {}
                }
                pos += w.op.bbs();
            }
            // Receives: their scatter lists write what the client sends.
            for (i, r) in q.recvs.iter().enumerate() {
                let field = format!("recv[{i}]");
                let mut at = 0u64;
                for s in &r.sgl {
                    let param = self
                        .p
                        .params
                        .iter()
                        .find(|pr| {
                            u64::from(pr.offset) <= at
                                && at < u64::from(pr.offset) + u64::from(pr.len)
                        })
                        .map(|pr| pr.name.clone());
                    if let Addr::Wqe { .. } = &s.addr {
                        // Inside the WQE's blocks, as a READ's scatter must be: its patch
                        // points alone do not say so.
                        self.range(
                            q,
                            (0, "receive"),
                            &field,
                            &s.addr,
                            u64::from(s.len),
                            Access::NONE,
                            false,
                        );
                    }
                    match (&s.addr, param) {
                        (Addr::Wqe { .. }, Some(param)) => self.code_write(qn, None, &field, &s.addr, u64::from(s.len), &PatchSource::Trigger { param }),
                        (Addr::Wqe { label, byte }, None) => self.find(Some(qn), None, &field, Rule::UndeclaredPatch, format!("trigger bytes {at}.. land in {label}@{byte} but no parameter covers them")),
                        (Addr::Region { .. }, _) => self.range(q, (0, "receive"), &field, &s.addr, u64::from(s.len), Access::LOCAL_WRITE, false),
                        (Addr::Static { .. }, _) => self.range(q, (0, "receive"), &field, &s.addr, u64::from(s.len), Access::NONE, false),
                    }
                    at += u64::from(s.len);
                }
            }
        }
    }

    /// A CAS or masked CAS `label`: the atomic's own checks, and, aimed at a WQE, the
    /// patch point it writes and (on a control word) that its operands are safe images.
    #[allow(clippy::too_many_arguments)]
    fn cas(
        &mut self,
        q: &redn_program::program::Queue,
        here: (u64, &str),
        label: &str,
        remote: &Addr,
        compare: &Operand,
        swap: &Operand,
        result: Option<&Sge>,
    ) {
        self.atomic_common(q, here, remote, result, label);
        if let Addr::Wqe {
            label: target,
            byte,
        } = remote
        {
            let source = PatchSource::Cas {
                label: label.to_string(),
            };
            self.code_write(&q.name, Some(here), "raddr", remote, 8, &source);
            if *byte == 0 {
                self.ctrl_operand_ok(&q.name, here, "swap", swap, target, "swap");
                self.ctrl_operand_ok(&q.name, here, "compare", compare, target, "compare");
            }
        }
    }

    fn local_write(
        &mut self,
        q: &redn_program::program::Queue,
        here: (u64, &str),
        field: &str,
        s: &Sge,
        source: PatchSource,
    ) {
        match &s.addr {
            Addr::Wqe { .. } => {
                self.range(
                    q,
                    here,
                    field,
                    &s.addr,
                    u64::from(s.len),
                    Access::NONE,
                    false,
                );
                self.code_write(
                    &q.name,
                    Some(here),
                    field,
                    &s.addr,
                    u64::from(s.len),
                    &source,
                );
            }
            _ => self.range(
                q,
                here,
                field,
                &s.addr,
                u64::from(s.len),
                Access::LOCAL_WRITE,
                false,
            ),
        }
    }

    fn atomic_common(
        &mut self,
        q: &redn_program::program::Queue,
        here: (u64, &str),
        remote: &Addr,
        result: Option<&Sge>,
        label: &str,
    ) {
        if q.role == QueueRole::Client {
            self.find(
                Some(&q.name),
                Some(here),
                "opcode",
                Rule::WrongSide,
                "atomic through the client's connection would act on the client's memory".into(),
            );
        }
        self.range(q, here, "raddr", remote, 8, Access::REMOTE_ATOMIC, true);
        let misaligned = match remote {
            Addr::Region { offset, .. } | Addr::Static { offset, .. } => offset % 8 != 0,
            Addr::Wqe { byte, .. } => byte % 8 != 0,
        };
        if misaligned {
            self.find(
                Some(&q.name),
                Some(here),
                "raddr",
                Rule::Misaligned,
                "atomic target is not 8-byte aligned".into(),
            );
        }
        if let Some(r) = result {
            self.local_write(
                q,
                here,
                "result",
                r,
                PatchSource::AtomicResult {
                    label: label.into(),
                },
            );
        }
    }
}
