//! The ds a CAS's control image may set on its target, at each edge: no more than the
//! target's own segments, and at least what its opcode needs when active (one segment for a
//! NOP image). (Mutation testing found the edges unchecked; docs/testing.md.)

use redn_policy::{verify, Grants, Rule};
use redn_program::program::{
    Addr, Builder, Form, Iterations, Op, Operand, Program, QueueRole, Sge, Slots,
};
use redn_program::wqe::WqeFlags;

/// A WRITE of two entries: four segments (control, remote address, two data).
const OWN_DS: u8 = 4;
/// What an active WRITE needs: control and remote address.
const WRITE_MIN_DS: u8 = 2;

/// Queue `q` runs CAS "cas" (RedN's `if`) on WRITE "target", posted as a NOP; `image`
/// replaces the CAS's swap (`swap`) or its compare.
fn program(swap: bool, image: Operand) -> Program {
    let mut b = Builder::new("ctrl", "an if on a WRITE");
    b.static_block("data", vec![0; 64]);
    let q = b.queue("q", QueueRole::Worker, false, false, None, 16, 1, 1);
    b.if_eq(q, "cas", "target", Some(1), WqeFlags::NONE)
        .unwrap();
    let write = Op::Write {
        remote: Addr::static_("data", 32),
        sgl: vec![
            Sge::new(Addr::static_("data", 0), 4),
            Sge::new(Addr::static_("data", 8), 4),
        ],
        imm: None,
    };
    assert_eq!(write.ds(), OWN_DS);
    b.push(q, "target", write, WqeFlags::NONE, Form::Nop);
    b.entry(q, 3);
    b.finish(Iterations::bounded(1, 2), "nothing");
    let mut p = b.build().unwrap();
    let Op::Cas {
        swap: s,
        compare: c,
        ..
    } = &mut p.queues[0].wqes[0].op
    else {
        panic!("the if is a CAS");
    };
    *(if swap { s } else { c }) = image;
    p
}

fn image(form: Form, slots: Slots, ds: u8) -> Operand {
    Operand::Ctrl {
        label: "target".into(),
        form,
        slots,
        ds: Some(ds),
    }
}

fn bad_ds(p: &Program) -> bool {
    verify(p, &Grants::new()).broke(Rule::BadDs)
}

#[test]
fn an_active_image_sets_a_ds_between_its_opcodes_need_and_the_targets_own() {
    for ds in [0, 1, WRITE_MIN_DS, 3, OWN_DS, OWN_DS + 1, 63] {
        let refused = !(WRITE_MIN_DS..=OWN_DS).contains(&ds);
        let p = program(true, image(Form::Active, Slots::Real, ds));
        assert_eq!(bad_ds(&p), refused, "swap, active, ds {ds}");
    }
}

#[test]
fn a_nop_image_needs_one_segment_and_no_more_than_the_targets_own() {
    for ds in [0, 1, WRITE_MIN_DS, OWN_DS, OWN_DS + 1] {
        let refused = !(1..=OWN_DS).contains(&ds);
        let p = program(false, image(Form::Nop, Slots::Operand(1), ds));
        assert_eq!(bad_ds(&p), refused, "compare, NOP, ds {ds}");
    }
}
