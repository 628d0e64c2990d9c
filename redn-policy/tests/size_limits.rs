//! The verifier's size and budget limits at their edges: each one exactly met is accepted,
//! one past it refused, naming the field. (Mutation testing found the edges unchecked;
//! docs/testing.md.)

use redn_policy::{verify, Grants, Report, Rule};
use redn_program::program::{Builder, Form, Iterations, Op, Program, QueueRole};
use redn_program::wqe::WqeFlags;

/// One queue of `sq_bbs` BBs and `rq_slots` receive slots holding `wqes` NOPs, run as
/// `iterations`.
fn program(sq_bbs: u32, rq_slots: u32, wqes: u32, iterations: Iterations) -> Program {
    let mut b = Builder::new("sizes", "NOPs");
    let q = b.queue(
        "q",
        QueueRole::Worker,
        false,
        false,
        None,
        sq_bbs,
        rq_slots,
        1,
    );
    for i in 0..wqes {
        b.push(q, &format!("nop{i}"), Op::Nop, WqeFlags::NONE, Form::Active);
    }
    b.entry(q, wqes);
    b.finish(iterations, "nothing");
    b.build().unwrap()
}

fn bounded(invocations: u32, wqes_per_invocation: u32) -> Iterations {
    Iterations::Bounded {
        invocations,
        wqes_per_invocation,
    }
}

fn broke(r: &Report, rule: Rule, field: &str) -> bool {
    r.findings
        .iter()
        .any(|f| f.rule == rule && f.field == field)
}

#[test]
fn rings_exactly_at_their_limits_are_accepted_one_more_refused() {
    let p = program(16, 32, 4, bounded(1, 4));
    let mut g = Grants::new();
    g.max_ring_bbs = 16;
    g.max_rq_slots = 32;
    let r = verify(&p, &g);
    assert!(!broke(&r, Rule::Size, "ring"), "{}", r.log());
    assert!(!broke(&r, Rule::Size, "receive ring"), "{}", r.log());
    g.max_ring_bbs = 15;
    let r = verify(&p, &g);
    assert!(broke(&r, Rule::Size, "ring"), "{}", r.log());
    assert!(!broke(&r, Rule::Size, "receive ring"), "{}", r.log());
    g.max_ring_bbs = 16;
    g.max_rq_slots = 31;
    let r = verify(&p, &g);
    assert!(!broke(&r, Rule::Size, "ring"), "{}", r.log());
    assert!(broke(&r, Rule::Size, "receive ring"), "{}", r.log());
}

#[test]
fn the_code_region_exactly_at_its_limit_is_accepted_one_byte_more_refused() {
    let p = program(16, 32, 4, bounded(1, 4));
    let need = p.code_bytes().unwrap();
    let mut g = Grants::new();
    g.max_code_bytes = need;
    let r = verify(&p, &g);
    assert!(!broke(&r, Rule::Size, "code region"), "{}", r.log());
    g.max_code_bytes = need - 1;
    let r = verify(&p, &g);
    assert!(broke(&r, Rule::Size, "code region"), "{}", r.log());
}

#[test]
fn a_bounded_budget_holds_exactly_the_wqes_each_invocation_runs() {
    let g = Grants::new();
    // 6 WQEs over 2 invocations: 3 each.
    for (invocations, per, refused) in [
        (2, 3, false),
        (2, 2, true),
        (3, 2, false),
        (4, 2, false),
        (1, 6, false),
        (1, 5, true),
    ] {
        let r = verify(&program(16, 1, 6, bounded(invocations, per)), &g);
        assert_eq!(
            broke(&r, Rule::WqeBudget, "iterations"),
            refused,
            "{invocations} x {per}: {}",
            r.log()
        );
    }
    // The policy's own cap on WQEs per invocation, exactly met and one past.
    let mut g = Grants::new();
    g.max_wqes_per_invocation = 8;
    let r = verify(&program(16, 1, 6, bounded(1, 8)), &g);
    assert!(!broke(&r, Rule::WqeBudget, "iterations"), "{}", r.log());
    let r = verify(&program(16, 1, 6, bounded(1, 9)), &g);
    assert!(broke(&r, Rule::WqeBudget, "iterations"), "{}", r.log());
}

#[test]
fn a_recycled_round_holds_every_wqe_and_needs_a_loop_budget() {
    let recycled = |wqes_per_round| Iterations::Recycled { wqes_per_round };
    let mut g = Grants::new();
    let r = verify(&program(16, 1, 6, recycled(6)), &g);
    assert!(broke(&r, Rule::UnboundedLoop, "iterations"), "{}", r.log());
    assert!(!broke(&r, Rule::WqeBudget, "iterations"), "{}", r.log());
    g.loop_budget = Some(1000);
    let r = verify(&program(16, 1, 6, recycled(6)), &g);
    assert!(!broke(&r, Rule::UnboundedLoop, "iterations"), "{}", r.log());
    assert!(!broke(&r, Rule::WqeBudget, "iterations"), "{}", r.log());
    let r = verify(&program(16, 1, 6, recycled(5)), &g);
    assert!(broke(&r, Rule::WqeBudget, "iterations"), "{}", r.log());
}
