//! Which writes the control-word model follows exactly and which only make bytes unknown,
//! through whole programs: a CAS, or a WRITE of a constant, is followed only through a patch
//! point over the whole control word and only when it is aimed at that word; compare bytes
//! something patches are unknown, however many patch points cover them; a masked CAS with a
//! patched mask may swap in any bit. (Mutation testing found these cases untested:
//! docs/testing.md.)

use redn_policy::{verify, Grants, Report, Rule};
use redn_program::program::{
    Addr, Builder, Form, Iterations, Op, Operand, PatchSource, Program, QueueRole, Sge, Slots,
};
use redn_program::wqe::WqeFlags;

/// Worker queue "q" runs `wqes` once, each fenced (as RedN's CASes on code are), with patch
/// points `patches` (label, byte, len, source); each `trigger` range (label, byte, len) is
/// where a trigger parameter of its own lands, through the client queue's receive.
fn program(
    wqes: Vec<(&str, Op, Form)>,
    patches: Vec<(&str, u32, u32, PatchSource)>,
    trigger: &[(&str, u32, u32)],
) -> Program {
    let mut b = Builder::new("writers", "writers of a control word");
    b.static_block("data", vec![0; 64]);
    let client = b.queue("client", QueueRole::Client, true, false, None, 16, 4, 8);
    let q = b.queue("q", QueueRole::Worker, false, false, None, 16, 1, 1);
    let n = u32::try_from(wqes.len()).unwrap();
    for (label, op, form) in wqes {
        b.push(q, label, op, WqeFlags::FENCE, form);
    }
    for (label, byte, len, source) in patches {
        b.patch(label, byte, len, source);
    }
    let mut sgl = Vec::new();
    for (i, &(label, byte, len)) in trigger.iter().enumerate() {
        let param = format!("operand{i}");
        b.param(&param, len, "bytes of a compare");
        b.patch(label, byte, len, PatchSource::Trigger { param });
        sgl.push(Sge::new(Addr::wqe(label, byte as usize), len));
    }
    if !sgl.is_empty() {
        b.recv(client, sgl);
    }
    b.entry(q, n);
    b.finish(Iterations::bounded(1, n), "nothing");
    b.build().unwrap()
}

fn from_cas(label: &str) -> PatchSource {
    PatchSource::Cas {
        label: label.into(),
    }
}

fn from_write(label: &str) -> PatchSource {
    PatchSource::Write {
        label: label.into(),
    }
}

/// The control-word findings on WQE `label`, as the log prints them.
fn control_word(r: &Report, label: &str) -> Vec<String> {
    r.findings
        .iter()
        .filter(|f| f.field == "control word" && f.wqe.as_ref().is_some_and(|(_, l)| l == label))
        .map(ToString::to_string)
        .collect()
}

/// A masked CAS "target" on a static block, posted active (its opmod byte sets its width);
/// CAS "break" (RedN's `break`) that would turn it into a NOP when its operand bytes hold 0,
/// which they never do; WRITE "reset" of its NOP image from a template nothing writes. Their
/// whole-word patch points, then `patches`; `stray` is one more WQE.
fn width_program(patches: Vec<(u32, u32, PatchSource)>, stray: Option<Op>) -> Program {
    let target = Op::MaskedCas {
        remote: Addr::static_("data", 0),
        compare: Operand::Lit(0),
        compare_mask: 0,
        swap: Operand::Lit(0),
        swap_mask: 0,
    };
    let brk = Op::Cas {
        remote: Addr::wqe("target", 0),
        compare: Operand::ctrl("target", Form::Active, Slots::Operand(0)),
        swap: Operand::ctrl("target", Form::Nop, Slots::Operand(0)),
        result: None,
    };
    let reset = Op::Write {
        remote: Addr::wqe("target", 0),
        sgl: vec![Sge::new(Addr::static_("nop", 0), 8)],
        imm: None,
    };
    let nop = vec![0, 0, 0, 0, 0, 0, 0, target.ds()];
    let mut wqes = vec![
        ("break", brk, Form::Active),
        ("target", target, Form::Active),
        ("reset", reset, Form::Active),
    ];
    wqes.extend(stray.map(|op| ("stray", op, Form::Active)));
    let mut all = vec![
        ("target", 0, 8, from_cas("break")),
        ("target", 0, 8, from_write("reset")),
    ];
    all.extend(patches.into_iter().map(|(b, l, s)| ("target", b, l, s)));
    let mut p = program(wqes, all, &[]);
    p.statics.push(redn_program::program::StaticBlock {
        name: "nop".into(),
        bytes: nop,
    });
    p
}

#[test]
fn a_partial_patch_point_of_a_cas_or_a_write_makes_its_bytes_unknown() {
    // The whole-word writes alone: the break never fires, the reset installs the NOP.
    let r = verify(&width_program(vec![], None), &Grants::new());
    assert!(r.accepted(), "{}", r.log());
    // A second patch point of the same CAS or WRITE over the opmod and index bytes: the
    // model does not follow the writer through it; its bytes (here the width) are unknown.
    for (source, name) in [
        (from_cas("break"), "CAS \"break\""),
        (from_write("reset"), "WRITE \"reset\""),
    ] {
        let r = verify(&width_program(vec![(0, 3, source)], None), &Grants::new());
        let found = control_word(&r, "target");
        assert_eq!(found.len(), 1, "{}", r.log());
        // Opmod and index unknown, opcode 0x14 (masked CAS), then the QPN and ds 4.
        let line = &found[0];
        assert!(
            line.contains("unsafe-swap: may become [?? ?? ?? 14 "),
            "{line}"
        );
        assert!(
            line.contains(&format!(
                "04] through {name} (step 1 of the fixpoint): a masked atomic's opmod (its \
                 width) may change"
            )),
            "{line}"
        );
        assert_eq!(r.findings.len(), 1, "{}", r.log());
    }
    // Over bytes the NIC ignores (index and QPN) the same patch points are harmless.
    let r = verify(
        &width_program(
            vec![(1, 2, from_cas("break")), (4, 3, from_write("reset"))],
            None,
        ),
        &Grants::new(),
    );
    assert!(r.accepted(), "{}", r.log());
}

#[test]
fn a_cas_aimed_elsewhere_only_makes_the_word_unknown() {
    // A CAS and a masked CAS on a static block whose compare (0) never matches the target,
    // each declared as a writer of the whole control word. Followed as if aimed at it they
    // would change nothing; they are not aimed at it, so the word is unknown.
    let strays = [
        Op::Cas {
            remote: Addr::static_("data", 8),
            compare: Operand::Lit(0),
            swap: Operand::Lit(0),
            result: None,
        },
        Op::MaskedCas {
            remote: Addr::static_("data", 8),
            compare: Operand::Lit(0),
            compare_mask: u64::MAX,
            swap: Operand::Lit(0),
            swap_mask: u64::MAX,
        },
    ];
    for stray in strays {
        let what = stray.opcode().name();
        let p = width_program(vec![(0, 8, from_cas("stray"))], Some(stray));
        let r = verify(&p, &Grants::new());
        let found = control_word(&r, "target");
        assert_eq!(found.len(), 1, "{what}: {}", r.log());
        assert!(
            found[0].contains(
                "protected-field: may become [?? ?? ?? ?? ?? ?? ?? ??] through CAS \"stray\" \
                 (step 1 of the fixpoint): its opcode byte may hold anything"
            ),
            "{what}: {}",
            found[0]
        );
        assert_eq!(r.findings.len(), 1, "{what}: {}", r.log());
    }
}

/// CAS "target" (on a static block), posted as a NOP, and masked CAS "if" on it whose
/// compare is the NOP image with operand 0xabcdef and whose swap mask takes only bit 0 of
/// the active opcode (0x11): a match turns the NOP into opcode 0x01, neither NOP nor CAS.
/// `trigger`: ranges of "if" that trigger parameters fill.
fn splice_program(trigger: &[(u32, u32)]) -> Program {
    let splice = Op::MaskedCas {
        remote: Addr::wqe("target", 0),
        compare: Operand::ctrl("target", Form::Nop, Slots::Operand(0xab_cdef)),
        compare_mask: u64::MAX,
        swap: Operand::ctrl("target", Form::Active, Slots::Real),
        swap_mask: 0x0000_0000_0100_0000,
    };
    let target = Op::Cas {
        remote: Addr::static_("data", 0),
        compare: Operand::Lit(0),
        swap: Operand::Lit(0),
        result: None,
    };
    let trigger: Vec<(&str, u32, u32)> = trigger.iter().map(|&(b, l)| ("if", b, l)).collect();
    program(
        vec![("if", splice, Form::Active), ("target", target, Form::Nop)],
        vec![("target", 0, 8, from_cas("if"))],
        &trigger,
    )
}

/// Where RedN's `if` takes its operand: the compare's two operand slots.
const COMPARE_SLOTS: [(u32, u32); 2] = [(41, 3), (45, 3)];

#[test]
fn compare_bytes_a_trigger_patches_may_match_however_many_points_cover_them() {
    // Unpatched, the compare's operand never matches the target's own slot bytes.
    let r = verify(&splice_program(&[]), &Grants::new());
    assert!(r.accepted(), "{}", r.log());
    // Patched by one trigger parameter, or by two over the same bytes: it may match.
    let once = COMPARE_SLOTS.to_vec();
    let twice = [COMPARE_SLOTS, COMPARE_SLOTS].concat();
    for trigger in [once, twice] {
        let r = verify(&splice_program(&trigger), &Grants::new());
        let found = control_word(&r, "target");
        assert_eq!(found.len(), 1, "{trigger:?}: {}", r.log());
        assert!(
            found[0].contains(
                "unsafe-swap: may become [00 00 00 01 00 00 00 03] through CAS \"if\" (step 1 of \
                 the fixpoint): opcode 0x01 is neither NOP nor the WQE's own (0x11)"
            ),
            "{trigger:?}: {}",
            found[0]
        );
        assert_eq!(r.findings.len(), 1, "{trigger:?}: {}", r.log());
    }
}

#[test]
fn a_masked_cas_with_either_mask_patched_may_swap_in_any_bit() {
    // Its compare never matches as installed; with its swap mask (bytes 48..56) or its
    // compare mask (56..64) from the trigger, any bit of the word may change. The patch
    // point is refused on its own too; the control-word model does not rely on that.
    for mask in [(48, 8), (56, 8)] {
        let r = verify(&splice_program(&[mask]), &Grants::new());
        let found = control_word(&r, "target");
        assert_eq!(found.len(), 1, "{mask:?}: {}", r.log());
        assert!(
            found[0].contains(
                "protected-field: may become [?? ?? ?? ?? ?? ?? ?? ??] through CAS \"if\" (its \
                 masks may be patched) (step 1 of the fixpoint): its opcode byte may hold \
                 anything"
            ),
            "{mask:?}: {}",
            found[0]
        );
        assert!(r.broke(Rule::UnsafeSwap), "{mask:?}: {}", r.log());
        assert_eq!(r.findings.len(), 2, "{mask:?}: {}", r.log());
    }
}
