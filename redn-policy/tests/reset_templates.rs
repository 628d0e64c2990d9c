//! A conditional WQE may be put back in its NOP form by a WRITE from a static template only
//! while nothing at all writes that template: no WRITE, READ, CAS, FETCH_ADD (target or
//! result) or masked CAS. (Mutation testing found each kind of writer unchecked;
//! docs/testing.md.)

use redn_policy::{verify, Grants, Rule};
use redn_program::program::catalog;
use redn_program::program::{Addr, Form, Op, Operand, Sge, Wqe};
use redn_program::wqe::WqeFlags;

/// The server loop's NOP template.
fn template(offset: u64) -> Addr {
    Addr::static_("resp.nop", offset)
}

/// Whether the server loop, with `op` added to its last queue, is refused for a protected
/// field (its reset then copies bytes that may have changed).
fn reset_refused(op: Option<Op>) -> bool {
    let mut p = catalog::server_loop().unwrap();
    if let Some(op) = op {
        let q = p.queues.len() - 1;
        p.queues[q].wqes.push(Wqe {
            label: "writer".into(),
            op,
            flags: WqeFlags::NONE,
            form: Form::Active,
        });
    }
    let mut g = Grants::new();
    g.loop_budget = Some(1_000_000);
    verify(&p, &g).broke(Rule::ProtectedField)
}

#[test]
fn a_reset_template_nothing_writes_is_a_constant() {
    assert!(!reset_refused(None));
    // Reading the template, or writing other memory with it, changes nothing.
    let reader = Op::Write {
        remote: Addr::static_("elsewhere", 0),
        sgl: vec![Sge::new(template(0), 8)],
        imm: None,
    };
    assert!(!reset_refused(Some(reader)));
}

#[test]
fn any_write_into_the_template_makes_the_reset_unsafe() {
    let result = || Some(Sge::new(template(0), 8));
    let writers = [
        Op::Write {
            remote: template(0),
            sgl: vec![],
            imm: None,
        },
        Op::Read {
            remote: template(8),
            sgl: vec![Sge::new(template(0), 8)],
        },
        Op::Cas {
            remote: template(0),
            compare: Operand::Lit(0),
            swap: Operand::Lit(1),
            result: None,
        },
        Op::Cas {
            remote: Addr::static_("other", 0),
            compare: Operand::Lit(0),
            swap: Operand::Lit(1),
            result: result(),
        },
        Op::Faa {
            remote: template(0),
            add: 1,
            result: None,
        },
        Op::Faa {
            remote: Addr::static_("other", 0),
            add: 1,
            result: result(),
        },
        Op::MaskedCas {
            remote: template(0),
            compare: Operand::Lit(0),
            compare_mask: u64::MAX,
            swap: Operand::Lit(1),
            swap_mask: u64::MAX,
        },
    ];
    for op in writers {
        let what = format!("{op:?}");
        assert!(reset_refused(Some(op)), "{what}");
    }
}
