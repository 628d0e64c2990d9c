//! The verifier's size and budget limits at their edges: each one exactly met is accepted,
//! one past it refused, naming the field. (Mutation testing found the edges unchecked;
//! docs/testing.md.)

use redn_policy::{verify, Grants, Report, Rule};
use redn_program::program::catalog::{self, HashVariant};
use redn_program::program::{Addr, Builder, Form, Iterations, Op, Program, QueueRole};
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

fn broke(r: &Report, rule: Rule, field: &str) -> bool {
    r.findings
        .iter()
        .any(|f| f.rule == rule && f.field == field)
}

#[test]
fn rings_exactly_at_their_limits_are_accepted_one_more_refused() {
    let p = program(16, 32, 4, Iterations::bounded(1, 4));
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
    let p = program(16, 32, 4, Iterations::bounded(1, 4));
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
        let r = verify(
            &program(16, 1, 6, Iterations::bounded(invocations, per)),
            &g,
        );
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
    let r = verify(&program(16, 1, 6, Iterations::bounded(1, 8)), &g);
    assert!(!broke(&r, Rule::WqeBudget, "iterations"), "{}", r.log());
    let r = verify(&program(16, 1, 6, Iterations::bounded(1, 9)), &g);
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

/// The details of the WQE-budget findings that contain `needle`.
fn budget(r: &Report, needle: &str) -> Vec<String> {
    r.findings
        .iter()
        .filter(|f| f.rule == Rule::WqeBudget && f.detail.contains(needle))
        .map(|f| f.detail.clone())
        .collect()
}

/// The number right after `before` in `text`.
fn number_after(text: &str, before: &str) -> u64 {
    let at = text.find(before).expect("the phrase") + before.len();
    let digits: String = text[at..]
        .chars()
        .take_while(char::is_ascii_digit)
        .collect();
    digits.parse().expect("a number")
}

#[test]
fn what_runs_at_install_may_meet_the_policy_cap_but_not_pass_it() {
    // Six NOPs the entry enables: they run at install, with no trigger.
    let p = program(16, 1, 6, Iterations::bounded(1, 6));
    let mut g = Grants::new();
    g.max_wqes_per_invocation = 6;
    let r = verify(&p, &g);
    assert!(budget(&r, "at install").is_empty(), "{}", r.log());
    g.max_wqes_per_invocation = 5;
    let r = verify(&p, &g);
    assert_eq!(
        budget(&r, "at install"),
        ["6 WQEs run at install, with no trigger; the limit is 5"],
        "{}",
        r.log()
    );
}

#[test]
fn what_one_trigger_runs_and_answers_may_meet_the_policy_caps_but_not_pass_them() {
    // echo answers each trigger with one WRITE with immediate, in at most the 3 WQEs a
    // trigger it declares; the verifier's count of the worst trigger's WQEs is read from
    // its finding at a cap of 0 and must be inside that declaration.
    let p = catalog::echo(64, 4).unwrap();
    let mut g = Grants::new();
    let r = verify(&p, &g);
    assert!(budget(&r, "").is_empty(), "{}", r.log());
    g.max_wqes_per_invocation = 0;
    let r = verify(&p, &g);
    let runs = budget(&r, "runs ");
    let line = runs
        .iter()
        .find(|d| d.contains("; the limit is 0"))
        .unwrap_or_else(|| panic!("{}", r.log()));
    let n = number_after(line, "runs ");
    assert!((1..=3).contains(&n), "{line}");
    g.max_wqes_per_invocation = u32::try_from(n).unwrap();
    let r = verify(&p, &g);
    assert!(
        budget(&r, "; the limit is").is_empty(),
        "a trigger running exactly the cap: {}",
        r.log()
    );
    g.max_wqes_per_invocation = u32::try_from(n - 1).unwrap();
    let r = verify(&p, &g);
    assert!(
        budget(&r, &format!("runs {n} WQEs; the limit is {}", n - 1)).len() == 1,
        "{}",
        r.log()
    );

    // One response a trigger: a cap of one is met, a cap of none is not. Only the
    // client-facing queue's WRITEs count: not hash-get's WAITs on that queue, nor the
    // READs of its worker.
    for p in [p, catalog::hash_get(HashVariant::Single, 4).unwrap()] {
        let mut g = Grants::new();
        g.max_responses_per_trigger = 1;
        let r = verify(&p, &g);
        assert!(budget(&r, "responses").is_empty(), "{}", r.log());
        g.max_responses_per_trigger = 0;
        let r = verify(&p, &g);
        let refused = budget(&r, "responses");
        assert_eq!(refused.len(), 1, "{}", r.log());
        assert!(
            refused[0].ends_with("sends 1 responses; the limit is 0"),
            "{}",
            refused[0]
        );
    }
}

#[test]
fn only_the_client_queues_writes_count_as_responses() {
    // At install the client-facing queue runs a NOP and a WRITE, a worker a WRITE: one
    // response, the client queue's WRITE.
    let write = || Op::Write {
        remote: Addr::region("r", 0),
        sgl: Vec::new(),
        imm: None,
    };
    let mut b = Builder::new("responses", "a WRITE and a NOP");
    let c = b.queue("c", QueueRole::Client, false, false, None, 16, 1, 1);
    let w = b.queue("w", QueueRole::Worker, false, false, None, 16, 1, 1);
    b.push(c, "c0", Op::Nop, WqeFlags::NONE, Form::Active);
    b.push(c, "c1", write(), WqeFlags::NONE, Form::Active);
    b.push(w, "w0", write(), WqeFlags::NONE, Form::Active);
    b.entry(c, 2);
    b.entry(w, 1);
    b.finish(Iterations::bounded(1, 3), "one WRITE");
    let p = b.build().unwrap();
    let mut g = Grants::new();
    g.max_responses_per_trigger = 0;
    let r = verify(&p, &g);
    assert_eq!(
        budget(&r, "responses"),
        ["the install sends 1 responses; the limit is 0"],
        "{}",
        r.log()
    );
}

#[test]
fn a_recv_en_past_its_receive_ring_is_a_loop_named_where_it_stands() {
    let build = |count: u32| {
        let mut b = Builder::new("recv-en", "a RECV_EN");
        let w = b.queue("w", QueueRole::Worker, false, true, None, 16, 4, 1);
        let m = b.queue("m", QueueRole::Worker, false, false, None, 16, 1, 1);
        b.push(w, "w0", Op::Nop, WqeFlags::NONE, Form::Active);
        b.push(m, "m0", Op::Nop, WqeFlags::NONE, Form::Active);
        b.push(m, "m1", Op::Nop, WqeFlags::NONE, Form::Active);
        b.push(
            m,
            "m2",
            Op::RecvEn {
                queue: "w".into(),
                count,
            },
            WqeFlags::NONE,
            Form::Active,
        );
        b.entry(w, 1);
        b.entry(m, 4);
        b.finish(Iterations::bounded(1, 4), "nothing");
        b.build().unwrap()
    };
    let g = Grants::new();
    let past = |r: &Report| {
        r.findings
            .iter()
            .filter(|f| f.rule == Rule::UnboundedLoop && f.field == "count")
            .map(|f| (f.queue.clone(), f.wqe.clone(), f.detail.clone()))
            .collect::<Vec<_>>()
    };
    let r = verify(&build(4), &g);
    assert!(past(&r).is_empty(), "a whole ring: {}", r.log());
    let r = verify(&build(5), &g);
    let found = past(&r);
    assert_eq!(found.len(), 1, "{}", r.log());
    let (queue, wqe, detail) = &found[0];
    assert_eq!(queue.as_deref(), Some("w"));
    assert_eq!(wqe, &Some((2, "m2".to_string())), "after two one-BB NOPs");
    assert!(
        detail.contains("enables receive 5 of \"w\", whose ring holds 4"),
        "{detail}"
    );
}
