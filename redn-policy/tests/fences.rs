//! The fence rule on one queue: a WQE that uses bytes an earlier READ or atomic of its queue
//! brings must carry the fence flag, unless a WAIT on its own queue's completions covers that
//! READ or atomic. Each kind of user (a WRITE's gather, a READ's source, an atomic's target)
//! and of bringer (a READ's scatter, a FETCH_ADD's result), and the WAIT's coverage exactly at
//! its edge. (Mutation testing found only RedN's fenced CAS tested: docs/testing.md.)

use redn_policy::{verify, Grants, Rule};
use redn_program::program::{Addr, Builder, Form, Iterations, Op, Sge};
use redn_program::program::{Program, QueueRole};
use redn_program::wqe::WqeFlags;

const SIG: WqeFlags = WqeFlags::SIGNALED;

fn buf() -> Vec<Sge> {
    vec![Sge::new(Addr::region("buf", 0), 8)]
}

fn read() -> Op {
    Op::Read {
        remote: Addr::region("src", 0),
        sgl: buf(),
    }
}

fn write() -> Op {
    Op::Write {
        remote: Addr::region("dst", 0),
        sgl: buf(),
        imm: None,
    }
}

fn fetch_add() -> Op {
    Op::Faa {
        remote: Addr::region("src", 0),
        add: 1,
        result: Some(Sge::new(Addr::region("buf", 0), 8)),
    }
}

fn wait_own(count: u32) -> Op {
    Op::Wait {
        queue: "w".into(),
        count,
    }
}

/// One worker queue running `wqes` (label, op, flags) at install.
fn program(wqes: Vec<(&str, Op, WqeFlags)>) -> Program {
    let mut b = Builder::new("fences", "one queue");
    let w = b.queue("w", QueueRole::Worker, false, false, None, 64, 1, 1);
    let n = u32::try_from(wqes.len()).unwrap();
    for (label, op, flags) in wqes {
        b.push(w, label, op, flags, Form::Active);
    }
    b.entry(w, n);
    b.finish(Iterations::bounded(1, n), "nothing");
    b.build().unwrap()
}

/// The WQEs the fence rule refuses: BB position and label (every WQE here is one BB).
fn unfenced(p: &Program) -> Vec<(u64, String)> {
    let r = verify(p, &Grants::new());
    r.findings
        .iter()
        .filter(|f| f.rule == Rule::MissingFence)
        .map(|f| f.wqe.clone().expect("names its WQE"))
        .collect()
}

fn at(pos: u64, label: &str) -> Vec<(u64, String)> {
    vec![(pos, label.to_string())]
}

#[test]
fn every_user_of_bytes_a_read_or_fetch_add_brings_needs_the_fence() {
    for (what, bringer, user) in [
        ("a WRITE gathering a READ's bytes", read(), write()),
        ("a READ after a READ (its source)", read(), read()),
        (
            "a WRITE gathering a FETCH_ADD's result",
            fetch_add(),
            write(),
        ),
        ("a FETCH_ADD after a READ (its target)", read(), fetch_add()),
    ] {
        let p = program(vec![
            ("bring", bringer.clone(), SIG),
            ("use", user.clone(), SIG),
        ]);
        assert_eq!(unfenced(&p), at(1, "use"), "{what}");
        let p = program(vec![
            ("bring", bringer, SIG),
            ("use", user, SIG.with(WqeFlags::FENCE)),
        ]);
        assert!(unfenced(&p).is_empty(), "{what}, fenced");
    }
}

#[test]
fn a_wait_on_the_queues_own_completions_covers_only_what_completed_by_then() {
    // The WAIT's count 0 is the queue's first completion: the READ itself.
    let p = program(vec![
        ("read", read(), SIG),
        ("wait", wait_own(0), WqeFlags::NONE),
        ("use", write(), SIG),
    ]);
    assert!(unfenced(&p).is_empty(), "covered by the WAIT");
    // The first completion is a NOP's: the READ after it is not covered.
    let p = program(vec![
        ("nop", Op::Nop, SIG),
        ("read", read(), SIG),
        ("wait", wait_own(0), WqeFlags::NONE),
        ("use", write(), SIG),
    ]);
    assert_eq!(
        unfenced(&p),
        at(3, "use"),
        "the READ is the second completion"
    );
    // A READ after the WAIT, two completions after what it covers.
    let p = program(vec![
        ("nop0", Op::Nop, SIG),
        ("nop1", Op::Nop, SIG),
        ("wait", wait_own(0), WqeFlags::NONE),
        ("read", read(), SIG),
        ("use", write(), SIG),
    ]);
    assert_eq!(unfenced(&p), at(4, "use"), "the READ comes after the WAIT");
}
