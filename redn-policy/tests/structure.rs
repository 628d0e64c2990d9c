//! The structure pass at its edges: a queue count exactly at the limit, and receive enables
//! of queues whose receives are not managed. (Mutation testing found these unchecked.)

use redn_policy::{verify, Grants, Report, Rule};
use redn_program::program::{Builder, Form, Iterations, Op, Program, QueueRole};
use redn_program::wqe::WqeFlags;

/// Queue `m` (rung at install) runs `op`; queue `w` has managed sends and, if
/// `managed_recv`, managed receives. `recv_entry`: enable `w`'s receives at install.
fn program(op: Op, managed_recv: bool, recv_entry: bool) -> Program {
    let mut b = Builder::new("structure", "two queues");
    let w = b.queue("w", QueueRole::Worker, true, managed_recv, None, 8, 1, 1);
    let m = b.queue("m", QueueRole::Worker, false, false, None, 8, 1, 1);
    b.push(w, "nop", Op::Nop, WqeFlags::NONE, Form::Active);
    b.push(m, "op", op, WqeFlags::NONE, Form::Active);
    b.entry(m, 1);
    b.entry(w, 1);
    if recv_entry {
        b.recv_entry(w, 1);
    }
    b.finish(Iterations::bounded(1, 2), "nothing");
    b.build().unwrap()
}

fn broke(r: &Report, rule: Rule, field: &str) -> bool {
    r.findings
        .iter()
        .any(|f| f.rule == rule && f.field == field)
}

#[test]
fn exactly_the_queue_limit_is_accepted_one_more_refused() {
    let p = program(Op::Nop, false, false);
    let mut g = Grants::new();
    g.max_queues = 2;
    let r = verify(&p, &g);
    assert!(!broke(&r, Rule::Size, "queues"), "{}", r.log());
    g.max_queues = 1;
    let r = verify(&p, &g);
    assert!(broke(&r, Rule::Size, "queues"), "{}", r.log());
}

#[test]
fn receives_are_enabled_only_where_they_are_managed() {
    let recv_en = || Op::RecvEn {
        queue: "w".into(),
        count: 1,
    };
    for managed in [false, true] {
        let r = verify(&program(recv_en(), managed, false), &Grants::new());
        assert_eq!(
            broke(&r, Rule::EnableUnmanaged, "enable.queue"),
            !managed,
            "RECV_EN, managed {managed}: {}",
            r.log()
        );
        let r = verify(&program(Op::Nop, managed, true), &Grants::new());
        assert_eq!(
            broke(&r, Rule::EnableUnmanaged, "recv entry"),
            !managed,
            "recv entry, managed {managed}: {}",
            r.log()
        );
    }
}
