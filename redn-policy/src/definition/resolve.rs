//! [`resolve`]: every name of a program unique (regions, parameters, static blocks, queues,
//! WQE labels) and every name it uses defined, with addresses and patch points inside the
//! WQEs they name; a duplicate's error gives the line of the first definition.

use crate::source::{invalid, Document, Invalid, KeyPath};
use redn_program::program::{Addr, Op, Operand, PatchSource, Program, Sge};
use redn_program::wqe::BB_SIZE;
use std::collections::HashMap;

/// Unique names, and every name a program uses defined, each error at its key.
pub(super) fn resolve<'p>(p: &'p Program, doc: &Document<'_>) -> std::result::Result<(), Invalid> {
    let root = KeyPath::root();
    let line = |path: &KeyPath| {
        doc.line_of(path)
            .map_or_else(String::new, |l| format!(" (line {l})"))
    };
    fn unique<'p>(
        seen: &mut HashMap<&'p str, KeyPath>,
        name: &'p str,
        at: KeyPath,
        what: &str,
        line: &dyn Fn(&KeyPath) -> String,
    ) -> std::result::Result<(), Invalid> {
        if let Some(first) = seen.get(name) {
            return Err(invalid(
                at,
                format!("{what} {name:?} is already defined{}", line(first)),
            ));
        }
        seen.insert(name, at);
        Ok(())
    }
    // The `name`s of the tables in array `key`, each unique; where each is.
    let unique_names = |key: &str, what: &str, list: &mut dyn Iterator<Item = &'p str>| {
        let mut seen = HashMap::new();
        for (i, name) in list.enumerate() {
            unique(
                &mut seen,
                name,
                root.key(key).index(i).key("name"),
                what,
                &line,
            )?;
        }
        Ok::<_, Invalid>(seen)
    };
    let mut list = p.regions.iter().map(|r| r.name.as_str());
    let regions = unique_names("region", "region", &mut list)?;
    let mut list = p.params.iter().map(|x| x.name.as_str());
    let params = unique_names("param", "parameter", &mut list)?;
    let mut list = p.statics.iter().map(|b| b.name.as_str());
    let statics = unique_names("static", "static block", &mut list)?;
    let mut queues = HashMap::new();
    let mut labels = HashMap::new();
    // Bytes each WQE occupies.
    let mut sizes: HashMap<&str, u64> = HashMap::new();
    for (qi, q) in p.queues.iter().enumerate() {
        let at = root.key("queue").index(qi);
        unique(&mut queues, &q.name, at.key("name"), "queue", &line)?;
        for (wi, w) in q.wqes.iter().enumerate() {
            unique(
                &mut labels,
                &w.label,
                at.key("wqe").index(wi).key("label"),
                "WQE label",
                &line,
            )?;
            sizes.insert(&w.label, w.op.bbs() * BB_SIZE as u64);
        }
    }
    let addr = |at: KeyPath, a: &Addr| -> std::result::Result<(), Invalid> {
        match a {
            Addr::Region { region, .. } if !regions.contains_key(region.as_str()) => Err(invalid(
                at,
                format!("region {region:?} is not declared (add a [[region]])"),
            )),
            Addr::Static { name, .. } if !statics.contains_key(name.as_str()) => Err(invalid(
                at,
                format!("static block {name:?} is not declared (add a [[static]])"),
            )),
            Addr::Wqe { label, byte } => match sizes.get(label.as_str()) {
                None => Err(invalid(at, format!("no WQE is labelled {label:?}"))),
                Some(&size) if u64::from(*byte) >= size => Err(invalid(
                    at,
                    format!("byte {byte} is outside WQE {label:?}, which has {size} bytes"),
                )),
                Some(_) => Ok(()),
            },
            _ => Ok(()),
        }
    };
    let sgl = |at: KeyPath, sgl: &[Sge]| {
        sgl.iter()
            .enumerate()
            .try_for_each(|(i, s)| addr(at.index(i).key("addr"), &s.addr))
    };
    let label = |at: KeyPath, l: &str, what: &str| {
        if labels.contains_key(l) {
            Ok(())
        } else {
            Err(invalid(
                at,
                format!("{what} {l:?}, but no WQE has that label"),
            ))
        }
    };
    let queue = |at: KeyPath, q: &str| {
        if queues.contains_key(q) {
            Ok(())
        } else {
            Err(invalid(at, format!("no queue is called {q:?}")))
        }
    };
    let operand = |at: KeyPath, o: &Operand| match o {
        Operand::Lit(_) => Ok(()),
        Operand::Ctrl { label: l, .. } => label(at, l, "the control image of"),
    };
    for (qi, q) in p.queues.iter().enumerate() {
        let qat = root.key("queue").index(qi);
        for (wi, w) in q.wqes.iter().enumerate() {
            let at = qat.key("wqe").index(wi);
            if let Some(r) = w.op.remote() {
                addr(at.key("remote"), r)?;
            }
            match &w.op {
                Op::Write { sgl: s, .. } | Op::Read { sgl: s, .. } => sgl(at.key("sgl"), s)?,
                Op::Cas {
                    compare,
                    swap,
                    result,
                    ..
                } => {
                    operand(at.key("compare"), compare)?;
                    operand(at.key("swap"), swap)?;
                    if let Some(r) = result {
                        addr(at.key("result").key("addr"), &r.addr)?;
                    }
                }
                Op::MaskedCas { compare, swap, .. } => {
                    operand(at.key("compare"), compare)?;
                    operand(at.key("swap"), swap)?;
                }
                Op::Faa { result, .. } => {
                    if let Some(r) = result {
                        addr(at.key("result").key("addr"), &r.addr)?;
                    }
                }
                Op::Wait { queue: t, .. }
                | Op::SendEn { queue: t, .. }
                | Op::RecvEn { queue: t, .. } => {
                    queue(at.key("queue"), t)?;
                }
                Op::Nop | Op::Other { .. } => {}
            }
        }
        for (ri, r) in q.recvs.iter().enumerate() {
            sgl(qat.key("recv").index(ri).key("sgl"), &r.sgl)?;
        }
    }
    for (i, pp) in p.patches.iter().enumerate() {
        let at = root.key("patch").index(i);
        let size = *sizes.get(pp.label.as_str()).ok_or_else(|| {
            invalid(
                at.key("label"),
                format!("no WQE is labelled {:?}", pp.label),
            )
        })?;
        let end = u64::from(pp.byte) + u64::from(pp.len);
        if end > size {
            let key = if doc.line_of(&at.key("bytes")).is_some() {
                "bytes"
            } else {
                "len"
            };
            return Err(invalid(
                at.key(key),
                format!(
                    "bytes {}..{end} are outside WQE {:?}, which has {size} bytes",
                    pp.byte, pp.label
                ),
            ));
        }
        match &pp.source {
            PatchSource::Trigger { param } if !params.contains_key(param.as_str()) => {
                return Err(invalid(
                    at.key("source"),
                    format!("no trigger parameter is called {param:?}"),
                ))
            }
            PatchSource::Trigger { .. } => {}
            PatchSource::Read { label: l }
            | PatchSource::Cas { label: l }
            | PatchSource::AtomicResult { label: l }
            | PatchSource::Write { label: l } => label(at.key("source"), l, "the source is")?,
        }
    }
    for (key, list) in [("entry", &p.entry), ("recv_entry", &p.recv_entry)] {
        for (i, (q, _)) in list.iter().enumerate() {
            queue(root.key(key).index(i).key("queue"), q)?;
        }
    }
    Ok(())
}
