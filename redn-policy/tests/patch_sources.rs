//! Which patch points may cover a WQE's protected bytes, by source: a CAS only as RedN's
//! `if` (the whole control word), and the operand bytes only on a conditional WQE (one a CAS
//! decides). (Mutation testing found both exceptions unchecked beyond their own case;
//! docs/testing.md.)

use redn_policy::{verify, Grants, Rule};
use redn_program::program::{
    Addr, Builder, Form, Iterations, Op, PatchSource, Program, QueueRole, Sge,
};
use redn_program::wqe::WqeFlags;

fn write() -> Op {
    Op::Write {
        remote: Addr::static_("data", 32),
        sgl: vec![Sge::new(Addr::static_("data", 0), 8)],
        imm: None,
    }
}

/// Queue `q` runs CAS "cas" (RedN's `if`) on WRITE "target", posted as a NOP, WRITE
/// "plain", which nothing decides, and SEND_EN "en" of queue `w`; plus one patch point
/// `(label, byte, len, source)`.
fn program(label: &str, byte: u32, len: u32, source: PatchSource) -> Program {
    let mut b = Builder::new("sources", "an if and a plain WRITE");
    b.static_block("data", vec![0; 64]);
    b.param("p", 8, "a parameter");
    let q = b.queue("q", QueueRole::Worker, false, false, None, 16, 1, 1);
    let w = b.queue("w", QueueRole::Worker, true, false, None, 16, 1, 1);
    b.if_eq(q, "cas", "target", Some(1), WqeFlags::NONE)
        .unwrap();
    b.push(q, "target", write(), WqeFlags::NONE, Form::Nop);
    b.push(q, "plain", write(), WqeFlags::NONE, Form::Active);
    let en = Op::SendEn {
        queue: "w".into(),
        count: 1,
    };
    b.push(q, "en", en, WqeFlags::NONE, Form::Active);
    b.push(w, "nop", Op::Nop, WqeFlags::NONE, Form::Active);
    b.patch(label, byte, len, source);
    b.entry(q, 4);
    b.finish(Iterations::bounded(1, 5), "nothing");
    b.build().unwrap()
}

/// Whether the patch point `label@byte..byte+len` is refused for covering protected bytes.
fn refused(label: &str, byte: u32, len: u32, source: PatchSource) -> bool {
    let r = verify(&program(label, byte, len, source), &Grants::new());
    let field = format!("bytes {byte}..{}", byte + len);
    r.findings.iter().any(|f| {
        f.rule == Rule::ProtectedField
            && f.field == field
            && f.wqe.as_ref().is_some_and(|(_, l)| l == label)
    })
}

fn from_cas() -> PatchSource {
    PatchSource::Cas {
        label: "cas".into(),
    }
}

fn from_trigger() -> PatchSource {
    PatchSource::Trigger { param: "p".into() }
}

#[test]
fn a_cas_may_rewrite_only_a_whole_control_word() {
    // The `if` itself (declared by `if_eq` too).
    assert!(!refused("target", 0, 8, from_cas()));
    // Part of the control word, or other protected bytes: the rkey, the lkey, the padding.
    for (byte, len) in [(0, 4), (0, 7), (4, 4), (24, 4), (36, 4), (48, 8)] {
        assert!(refused("target", byte, len, from_cas()), "{byte}+{len}");
    }
}

#[test]
fn only_a_conditional_wqes_operand_bytes_are_data() {
    for (byte, len) in [(0, 3), (4, 3)] {
        assert!(
            !refused("target", byte, len, from_trigger()),
            "target {byte}+{len}"
        );
        assert!(
            refused("plain", byte, len, from_trigger()),
            "plain {byte}+{len}"
        );
    }
}

#[test]
fn a_fetch_adds_old_value_may_fill_only_an_enable_counts_reserved_half() {
    let old_value = || PatchSource::AtomicResult {
        label: "faa".into(),
    };
    // The big-endian old value: the count's reserved high half and the count itself.
    assert!(!refused("en", 20, 8, old_value()));
    // Anywhere else over reserved bytes: another offset or length of the enable's, or a
    // WRITE's reserved word.
    for (label, byte, len) in [
        ("en", 16, 8),
        ("en", 20, 4),
        ("en", 16, 4),
        ("plain", 28, 4),
    ] {
        assert!(
            refused(label, byte, len, old_value()),
            "{label} {byte}+{len}"
        );
    }
}
