//! Writing a [`Program`] back as an offload definition: [`write_definition`], and the TOML
//! text of each kind of value (strings, numbers, addresses, scatter/gather lists, operands,
//! patch sources). The flag keys ([`FLAG_KEYS`]) are shared with the loader.

use super::raw::OpName;
use redn_program::program::{
    Addr, Form, Iterations, Op, Operand, PatchSource, Program, QueueRole, RegionRole, Sge, Slots,
    Wqe,
};
use redn_program::wqe::WqeFlags;
use std::fmt::Write as _;

/// Write `program` as an offload definition. [`parse_definition`](super::parse_definition) of the result gives
/// `program` back, for every program that is well formed (as the builder and the loader
/// check); the text carries `# index N` comments with each WQE's ring position.
pub fn write_definition(p: &Program) -> String {
    let mut s = String::new();
    let _ = writeln!(s, "name = {}", quote(&p.name));
    let _ = writeln!(s, "summary = {}", quote(&p.summary));
    let _ = writeln!(s, "response = {}", quote(&p.response_doc));
    match p.iterations {
        Iterations::Bounded {
            invocations,
            wqes_per_invocation,
        } => {
            let _ = writeln!(
                s,
                "iterations = {{ kind = \"bounded\", invocations = {invocations}, wqes_per_invocation = {wqes_per_invocation} }}"
            );
        }
        Iterations::Recycled { wqes_per_round } => {
            let _ = writeln!(
                s,
                "iterations = {{ kind = \"recycled\", wqes_per_round = {wqes_per_round} }}"
            );
        }
    }
    let _ = writeln!(s, "trigger_len = {}", p.trigger_len);
    for (key, list) in [("entry", &p.entry), ("recv_entry", &p.recv_entry)] {
        if list.is_empty() && key == "recv_entry" {
            continue;
        }
        let items: Vec<String> = list
            .iter()
            .map(|(q, c)| format!("{{ queue = {}, count = {c} }}", quote(q)))
            .collect();
        let _ = writeln!(s, "{key} = [{}]", items.join(", "));
    }
    for r in &p.regions {
        s.push_str("\n[[region]]\n");
        let _ = writeln!(s, "name = {}", quote(&r.name));
        match &r.role {
            RegionRole::Data { access } => {
                s.push_str("role = \"data\"\n");
                let _ = writeln!(s, "access = {}", quote(&access.to_string()));
            }
            RegionRole::Response => s.push_str("role = \"response\"\n"),
        }
        let _ = writeln!(s, "min_len = {}", uint(r.min_len));
        let _ = writeln!(s, "doc = {}", quote(&r.doc));
    }
    for prm in &p.params {
        s.push_str("\n[[param]]\n");
        let _ = writeln!(s, "name = {}", quote(&prm.name));
        let _ = writeln!(s, "offset = {}", prm.offset);
        let _ = writeln!(s, "len = {}", prm.len);
        let _ = writeln!(s, "doc = {}", quote(&prm.doc));
    }
    for b in &p.statics {
        s.push_str("\n[[static]]\n");
        let _ = writeln!(s, "name = {}", quote(&b.name));
        let _ = writeln!(s, "len = {}", b.bytes.len());
        let used = b.bytes.iter().rposition(|&x| x != 0).map_or(0, |i| i + 1);
        if used > 0 {
            let mut hex = String::with_capacity(2 * used);
            for x in &b.bytes[..used] {
                let _ = write!(hex, "{x:02x}");
            }
            let _ = writeln!(s, "bytes = \"{hex}\"");
        }
    }
    for q in &p.queues {
        s.push_str("\n[[queue]]\n");
        let _ = writeln!(s, "name = {}", quote(&q.name));
        let role = match q.role {
            QueueRole::Worker => "worker",
            QueueRole::Client => "client",
        };
        let _ = writeln!(s, "role = \"{role}\"");
        let _ = writeln!(s, "managed_send = {}", q.managed_send);
        let _ = writeln!(s, "managed_recv = {}", q.managed_recv);
        if let Some(pu) = q.pu {
            let _ = writeln!(s, "pu = {pu}");
        }
        let _ = writeln!(s, "sq_bbs = {}", q.sq_bbs);
        let _ = writeln!(s, "rq_slots = {}", q.rq_slots);
        let _ = writeln!(s, "rq_sges = {}", q.rq_sges);
        let mut at = 0u64;
        for w in &q.wqes {
            let _ = writeln!(s, "\n[[queue.wqe]]  # index {at}");
            write_wqe(&mut s, w);
            at += w.op.bbs();
        }
        for (i, r) in q.recvs.iter().enumerate() {
            let _ = writeln!(s, "\n[[queue.recv]]  # slot {i}");
            let _ = writeln!(s, "sgl = {}", sgl_text(&r.sgl));
        }
    }
    for pp in &p.patches {
        s.push_str("\n[[patch]]\n");
        let _ = writeln!(s, "label = {}", quote(&pp.label));
        let _ = writeln!(
            s,
            "bytes = [{}, {}]",
            pp.byte,
            u64::from(pp.byte) + u64::from(pp.len)
        );
        let _ = writeln!(s, "source = {}", quote(&source_text(&pp.source)));
    }
    s
}

fn write_wqe(s: &mut String, w: &Wqe) {
    let _ = writeln!(s, "label = {}", quote(&w.label));
    match &w.op {
        Op::Other { opcode } => {
            let _ = writeln!(s, "opcode = {opcode:#04x}");
        }
        op => {
            let _ = writeln!(s, "op = \"{}\"", op_name(op).name());
        }
    }
    if w.form == Form::Nop {
        s.push_str("form = \"nop\"\n");
    }
    let bits = w.flags.0;
    if bits & !NAMED_FLAGS == 0 {
        for (flag, key) in FLAG_KEYS {
            if bits & flag.0 != 0 {
                let _ = writeln!(s, "{key} = true");
            }
        }
    } else {
        let _ = writeln!(s, "flags = {bits:#04x}");
    }
    let remote = |s: &mut String, a: &Addr| {
        let _ = writeln!(s, "remote = {}", quote(&addr_text(a)));
    };
    match &w.op {
        Op::Nop | Op::Other { .. } => {}
        Op::Write {
            remote: r,
            sgl,
            imm,
        } => {
            remote(s, r);
            let _ = writeln!(s, "sgl = {}", sgl_text(sgl));
            if let Some(imm) = imm {
                let _ = writeln!(s, "imm = {imm}");
            }
        }
        Op::Read { remote: r, sgl } => {
            remote(s, r);
            let _ = writeln!(s, "sgl = {}", sgl_text(sgl));
        }
        Op::Cas {
            remote: r,
            compare,
            swap,
            result,
        } => {
            remote(s, r);
            let _ = writeln!(s, "compare = {}", operand_text(compare));
            let _ = writeln!(s, "swap = {}", operand_text(swap));
            if let Some(res) = result {
                let _ = writeln!(s, "result = {}", sge_text(res));
            }
        }
        Op::MaskedCas {
            remote: r,
            compare,
            compare_mask,
            swap,
            swap_mask,
        } => {
            remote(s, r);
            let _ = writeln!(s, "compare = {}", operand_text(compare));
            let _ = writeln!(s, "compare_mask = \"{compare_mask:#x}\"");
            let _ = writeln!(s, "swap = {}", operand_text(swap));
            let _ = writeln!(s, "swap_mask = \"{swap_mask:#x}\"");
        }
        Op::Faa {
            remote: r,
            add,
            result,
        } => {
            remote(s, r);
            let _ = writeln!(s, "add = {}", uint(*add));
            if let Some(res) = result {
                let _ = writeln!(s, "result = {}", sge_text(res));
            }
        }
        Op::Wait { queue, count } | Op::SendEn { queue, count } | Op::RecvEn { queue, count } => {
            let _ = writeln!(s, "queue = {}", quote(queue));
            let _ = writeln!(s, "count = {count}");
        }
    }
}

/// Flag bits that have a key of their own.
pub(super) const FLAG_KEYS: [(WqeFlags, &str); 3] = [
    (WqeFlags::SIGNALED, "signaled"),
    (WqeFlags::FENCE, "fence"),
    (WqeFlags::SOLICITED, "solicited"),
];
const NAMED_FLAGS: u8 = WqeFlags::SIGNALED.0 | WqeFlags::FENCE.0 | WqeFlags::SOLICITED.0;

/// A TOML basic string.
pub(super) fn quote(text: &str) -> String {
    let mut s = String::with_capacity(text.len() + 2);
    s.push('"');
    for c in text.chars() {
        match c {
            '"' => s.push_str("\\\""),
            '\\' => s.push_str("\\\\"),
            '\n' => s.push_str("\\n"),
            '\t' => s.push_str("\\t"),
            '\r' => s.push_str("\\r"),
            c if c.is_control() => {
                let _ = write!(s, "\\u{:04x}", u32::from(c));
            }
            c => s.push(c),
        }
    }
    s.push('"');
    s
}

/// A TOML integer, or a hex string when it is too large for one.
pub(super) fn uint(v: u64) -> String {
    if i64::try_from(v).is_ok() {
        v.to_string()
    } else {
        format!("\"{v:#x}\"")
    }
}

pub(super) fn addr_text(a: &Addr) -> String {
    match a {
        Addr::Region { region, offset } => format!("region:{region}+{offset}"),
        Addr::Static { name, offset } => format!("static:{name}+{offset}"),
        Addr::Wqe { label, byte } => format!("wqe:{label}@{byte}"),
    }
}

fn sge_text(s: &Sge) -> String {
    format!(
        "{{ addr = {}, len = {} }}",
        quote(&addr_text(&s.addr)),
        s.len
    )
}

fn sgl_text(sgl: &[Sge]) -> String {
    if sgl.len() <= 2 {
        let items: Vec<String> = sgl.iter().map(sge_text).collect();
        return format!("[{}]", items.join(", "));
    }
    let mut s = String::from("[\n");
    for e in sgl {
        let _ = writeln!(s, "  {},", sge_text(e));
    }
    s.push(']');
    s
}

pub(super) fn operand_text(o: &Operand) -> String {
    match o {
        Operand::Lit(v) => format!("\"{v:#x}\""),
        Operand::Ctrl {
            label,
            form,
            slots,
            ds,
        } => {
            let mut s = format!(
                "ctrl:{label}:{}:",
                match form {
                    Form::Active => "active",
                    Form::Nop => "nop",
                }
            );
            match slots {
                Slots::Real => s.push_str("real"),
                Slots::Operand(v) => {
                    let _ = write!(s, "operand={v:#x}");
                }
            }
            if let Some(ds) = ds {
                let _ = write!(s, ":ds={ds}");
            }
            quote(&s)
        }
    }
}

pub(super) fn source_text(src: &PatchSource) -> String {
    match src {
        PatchSource::Trigger { param } => format!("trigger:{param}"),
        PatchSource::Read { label } => format!("read:{label}"),
        PatchSource::Cas { label } => format!("cas:{label}"),
        PatchSource::AtomicResult { label } => format!("result:{label}"),
        PatchSource::Write { label } => format!("write:{label}"),
    }
}

fn op_name(op: &Op) -> OpName {
    match op {
        Op::Nop | Op::Other { .. } => OpName::Nop,
        Op::Write { .. } => OpName::Write,
        Op::Read { .. } => OpName::Read,
        Op::Cas { .. } => OpName::Cas,
        Op::MaskedCas { .. } => OpName::MaskedCas,
        Op::Faa { .. } => OpName::Faa,
        Op::Wait { .. } => OpName::Wait,
        Op::SendEn { .. } => OpName::SendEn,
        Op::RecvEn { .. } => OpName::RecvEn,
    }
}
