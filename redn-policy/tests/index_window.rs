//! The index-window rule: a ConnectX compares SEND_EN / RECV_EN targets modulo 2^16 and WAIT
//! targets modulo 2^24, so the verifier refuses counts that lie half that range or more from
//! where their index starts, and recycled counts whose step a round it cannot bound. Each
//! limit is tried just under (accepted) and at it (refused, naming the WQE).

use redn_policy::{verify, Finding, Grants, Report, Rule};
use redn_program::program::catalog;
use redn_program::program::{
    Addr, Builder, Form, Iterations, Op, Operand, PatchSource, Program, QueueRole, Sge,
};
use redn_program::wqe::WqeFlags;
use redn_program::Access;

/// A bounded program: queue `m` (not managed, rung once at install) enables managed queue
/// `w` (a ring of 2^16 BBs) up to `enable`, then waits on `w`'s CQ for `wait`
/// completions; `w` holds one signaled NOP. `entry` is the count the install enables `w` to.
fn one_enable(enable: u32, wait: u32, entry: u32) -> Program {
    let mut b = Builder::new("window", "an enable and a wait with chosen counts");
    let w = b.queue("w", QueueRole::Worker, true, false, None, 1 << 16, 1, 1);
    let m = b.queue("m", QueueRole::Worker, false, false, None, 4, 1, 1);
    b.push(w, "nop", Op::Nop, WqeFlags::SIGNALED, Form::Active);
    let en = Op::SendEn {
        queue: "w".into(),
        count: enable,
    };
    b.push(m, "en", en, WqeFlags::NONE, Form::Active);
    let wait = Op::Wait {
        queue: "w".into(),
        count: wait,
    };
    b.push(m, "wait", wait, WqeFlags::NONE, Form::Active);
    b.entry(m, 2);
    if entry > 0 {
        b.entry(w, entry);
    }
    b.finish(Iterations::bounded(1, 3), "nothing");
    b.build().unwrap()
}

fn window_findings(r: &Report) -> Vec<&Finding> {
    r.findings
        .iter()
        .filter(|f| f.rule == Rule::IndexWindow)
        .collect()
}

/// The one index-window finding of `r`, which must name WQE `label` (or an entry if `None`).
fn the_window_finding<'r>(r: &'r Report, label: Option<&str>) -> &'r Finding {
    let found = window_findings(r);
    assert_eq!(found.len(), 1, "{}", r.log());
    let f = found[0];
    assert_eq!(
        f.wqe.as_ref().map(|(_, l)| l.as_str()),
        label,
        "{}",
        r.log()
    );
    f
}

#[test]
fn an_enable_just_under_2_15_bbs_is_accepted_and_one_at_2_15_refused() {
    let under = verify(&one_enable((1 << 15) - 1, 0, 0), &Grants::new());
    assert!(under.accepted(), "{}", under.log());

    let over = verify(&one_enable(1 << 15, 0, 0), &Grants::new());
    let f = the_window_finding(&over, Some("en"));
    assert_eq!(f.queue.as_deref(), Some("m"));
    assert_eq!(f.field, "count");
    assert!(f.detail.contains("count 32768"), "{f}");
    assert!(f.detail.contains("modulo 2^16"), "{f}");
    assert!(
        over.log().contains("wqe 0 (en): count: index-window:"),
        "{}",
        over.log()
    );
}

#[test]
fn an_entry_is_held_to_the_same_window() {
    let under = verify(&one_enable(1, 0, (1 << 15) - 1), &Grants::new());
    assert!(window_findings(&under).is_empty(), "{}", under.log());
    let over = verify(&one_enable(1, 0, 1 << 15), &Grants::new());
    let f = the_window_finding(&over, None);
    assert_eq!((f.queue.as_deref(), f.field.as_str()), (Some("w"), "entry"));
}

#[test]
fn a_wait_just_under_2_23_completions_is_accepted_and_one_at_2_23_refused() {
    // Under the window the wait is only never satisfied (one completion ever comes), which
    // the verifier does not judge; at 2^23 a ConnectX would let it pass at once.
    let under = verify(&one_enable(1, (1 << 23) - 1, 0), &Grants::new());
    assert!(window_findings(&under).is_empty(), "{}", under.log());
    let over = verify(&one_enable(1, 1 << 23, 0), &Grants::new());
    let f = the_window_finding(&over, Some("wait"));
    assert!(f.detail.contains("modulo 2^24"), "{f}");
    // The WAIT follows the one-BB enable: ring index 1.
    assert_eq!(f.wqe, Some((1, "wait".to_string())));
}

fn loop_grants() -> Grants {
    let mut g = Grants::new()
        .with_region("table", Access::REMOTE_READ, 1 << 20)
        .with_region("values", Access::NONE, 1 << 20)
        .with_region("response", Access::REMOTE_WRITE, 1 << 17);
    g.loop_budget = Some(1_000_000);
    g.max_wqes_per_invocation = 256;
    g
}

fn op_mut<'p>(p: &'p mut Program, label: &str) -> &'p mut Op {
    p.queues
        .iter_mut()
        .flat_map(|q| q.wqes.iter_mut())
        .find(|w| w.label == label)
        .map(|w| &mut w.op)
        .unwrap_or_else(|| panic!("no WQE {label}"))
}

fn set_add(p: &mut Program, label: &str, to: u64) {
    match op_mut(p, label) {
        Op::Faa { add, .. } => *add = to,
        other => panic!("{label} is {other:?}"),
    }
}

#[test]
fn server_loop_passes_and_a_recycled_step_of_2_15_is_refused() {
    let g = loop_grants();
    let r = verify(&catalog::server_loop().unwrap(), &g);
    assert!(r.accepted(), "{}", r.log());

    // The worker is enabled by `go` (counter c.go) and `rearm.worker` (c.worker); both move
    // it by the same step, first just under the window, then at it.
    for (step, refused) in [((1u64 << 15) - 1, false), (1 << 15, true)] {
        let mut p = catalog::server_loop().unwrap();
        set_add(&mut p, "adv.go.add", step);
        set_add(&mut p, "adv.worker.add", step);
        let r = verify(&p, &g);
        let found = window_findings(&r);
        if refused {
            assert_eq!(found.len(), 2, "{}", r.log());
            for (f, label) in found.iter().zip(["go", "rearm.worker"]) {
                assert_eq!(f.wqe.as_ref().unwrap().1, label, "{}", r.log());
                assert!(f.detail.contains("moves 32768 BBs a round"), "{f}");
            }
        } else {
            assert!(found.is_empty(), "{}", r.log());
        }
    }
}

#[test]
fn a_recycled_receive_enable_is_held_to_the_same_window() {
    // `rearm.recv` enables the client's receives from counter c.recv.
    let mut p = catalog::server_loop().unwrap();
    set_add(&mut p, "adv.recv.add", 1 << 15);
    let r = verify(&p, &loop_grants());
    let f = the_window_finding(&r, Some("rearm.recv"));
    assert!(f.detail.contains("moves 32768 receives a round"), "{f}");
    assert!(f.detail.contains("the receive index of \"client\""), "{f}");
}

#[test]
fn recycled_counts_of_one_queue_that_move_by_different_steps_are_refused() {
    let mut p = catalog::server_loop().unwrap();
    set_add(&mut p, "adv.worker.add", 33);
    let r = verify(&p, &loop_grants());
    let f = the_window_finding(&r, Some("rearm.worker"));
    assert!(
        f.detail
            .contains("moves 33 BBs a round where \"go\" moves 32"),
        "{f}"
    );

    // WAIT counts on one CQ too: `trigger` and `sent` both wait on the client's CQ.
    let mut p = catalog::server_loop().unwrap();
    set_add(&mut p, "adv.sent.add", 3);
    let r = verify(&p, &loop_grants());
    let f = the_window_finding(&r, Some("sent"));
    assert!(f.detail.contains("completions a round"), "{f}");
}

#[test]
fn a_static_enable_of_a_queue_a_recycled_loop_advances_is_refused() {
    // `go` keeps its template count: the worker passes it in the first round and, 2^16 BBs
    // later, the same count reads as ahead again.
    let mut p = catalog::server_loop().unwrap();
    p.patches.retain(|pp| pp.label != "go");
    let r = verify(&p, &loop_grants());
    let f = the_window_finding(&r, Some("go"));
    assert!(f.detail.contains("a static count"), "{f}");
    assert!(f.detail.contains("\"rearm.worker\" moves 32"), "{f}");
}

#[test]
fn a_recycled_count_the_verifier_cannot_bound_is_refused() {
    // From a trigger: the client would choose the target.
    let mut p = catalog::server_loop().unwrap();
    for pp in p.patches.iter_mut().filter(|pp| pp.label == "answer") {
        pp.source = PatchSource::Trigger {
            param: "key0".into(),
        };
    }
    let r = verify(&p, &loop_grants());
    let f = the_window_finding(&r, Some("answer"));
    assert!(f.detail.contains("trigger parameter \"key0\""), "{f}");

    // From a counter something other than a FETCH_ADD writes: any value may land.
    let p = with_worker_op(Op::Write {
        remote: Addr::static_("c.answer", 0),
        sgl: vec![Sge::new(Addr::static_("c.done", 0), 8)],
        imm: None,
    });
    let r = verify(&p, &loop_grants());
    let f = the_window_finding(&r, Some("answer"));
    assert!(
        f.detail
            .contains("counter \"c.answer\" is also written by \"pad"),
        "{f}"
    );
}

/// server-loop with the worker's first padding NOP replaced by `op`.
fn with_worker_op(op: Op) -> Program {
    let mut p = catalog::server_loop().unwrap();
    let w = p.queues.iter_mut().find(|q| q.name == "worker").unwrap();
    let pad = w.wqes.iter_mut().find(|w| matches!(w.op, Op::Nop)).unwrap();
    assert!(pad.label.starts_with("pad"), "{} is no padding", pad.label);
    pad.op = op;
    p
}

#[test]
fn a_counter_anything_but_its_fetch_adds_may_write_is_unbounded() {
    let answer = || Addr::static_("c.answer", 0);
    let elsewhere = || Addr::static_("resp.nop", 0);
    let cases: Vec<(&str, Program)> = vec![
        (
            "a READ landing in it",
            with_worker_op(Op::Read {
                remote: elsewhere(),
                sgl: vec![Sge::new(answer(), 8)],
            }),
        ),
        (
            "a CAS on it",
            with_worker_op(Op::Cas {
                remote: answer(),
                compare: Operand::Lit(0),
                swap: Operand::Lit(1),
                result: None,
            }),
        ),
        (
            "a CAS result landing in it",
            with_worker_op(Op::Cas {
                remote: elsewhere(),
                compare: Operand::Lit(0),
                swap: Operand::Lit(1),
                result: Some(Sge::new(answer(), 8)),
            }),
        ),
        (
            "a masked CAS on it",
            with_worker_op(Op::MaskedCas {
                remote: answer(),
                compare: Operand::Lit(0),
                compare_mask: u64::MAX,
                swap: Operand::Lit(1),
                swap_mask: u64::MAX,
            }),
        ),
        (
            "a FETCH_ADD result landing in it",
            with_worker_op(Op::Faa {
                remote: elsewhere(),
                add: 1,
                result: Some(Sge::new(answer(), 8)),
            }),
        ),
        (
            "a FETCH_ADD on other bytes of its block",
            with_worker_op(Op::Faa {
                remote: Addr::static_("c.answer", 8),
                add: 1,
                result: None,
            }),
        ),
        ("a receive scattering into it", {
            let mut p = catalog::server_loop().unwrap();
            let client = p.queues.iter_mut().find(|q| q.name == "client").unwrap();
            client.recvs[0].sgl.push(Sge::new(answer(), 8));
            p
        }),
    ];
    for (what, p) in cases {
        let r = verify(&p, &loop_grants());
        let f = the_window_finding(&r, Some("answer"));
        assert!(
            f.detail.contains("counter \"c.answer\" is also written by"),
            "{what}: {f}"
        );
    }
    // A FETCH_ADD that only reads another counter's value into a WQE is no writer of it.
    let p = with_worker_op(Op::Faa {
        remote: elsewhere(),
        add: 1,
        result: None,
    });
    let r = verify(&p, &loop_grants());
    assert!(window_findings(&r).is_empty(), "{}", r.log());
}

fn set_sources(p: &mut Program, label: &str, source: PatchSource) {
    for pp in p.patches.iter_mut().filter(|pp| pp.label == label) {
        pp.source = source.clone();
    }
}

#[test]
fn a_recycled_count_must_come_from_a_read_of_a_counter_or_a_fetch_add() {
    // The FETCH_ADD's old value itself (RedN's big-endian form): its step is its add.
    let mut p = catalog::server_loop().unwrap();
    let add = PatchSource::AtomicResult {
        label: "adv.answer.add".into(),
    };
    set_sources(&mut p, "answer", add);
    let r = verify(&p, &loop_grants());
    assert!(window_findings(&r).is_empty(), "{}", r.log());

    let refused = |source: PatchSource, want: &str| {
        let mut p = catalog::server_loop().unwrap();
        set_sources(&mut p, "answer", source);
        let r = verify(&p, &loop_grants());
        let f = the_window_finding(&r, Some("answer"));
        assert!(f.detail.contains(want), "{f}");
        assert!(f.detail.contains("cannot bound"), "{f}");
    };
    refused(
        PatchSource::AtomicResult {
            label: "adv.answer".into(),
        },
        "the result of \"adv.answer\", not a FETCH_ADD",
    );
    refused(
        PatchSource::Read {
            label: "adv.answer.add".into(),
        },
        "from \"adv.answer.add\", not a READ",
    );
    refused(
        PatchSource::Cas {
            label: "adv.answer.add".into(),
        },
        "written by \"adv.answer.add\"",
    );
    refused(
        PatchSource::Write {
            label: "reset".into(),
        },
        "written by \"reset\"",
    );

    // A READ of a region, not of a counter in the code region.
    let mut p = catalog::server_loop().unwrap();
    match op_mut(&mut p, "adv.answer") {
        Op::Read { remote, .. } => *remote = Addr::region("table", 0),
        other => panic!("adv.answer is {other:?}"),
    }
    let r = verify(&p, &loop_grants());
    let f = the_window_finding(&r, Some("answer"));
    assert!(f.detail.contains("outside the code region"), "{f}");
}

#[test]
fn only_a_patch_over_the_count_bytes_makes_a_count_patched() {
    // A bounded program's patched counts are refused by another rule; a static count is
    // checked here. Patch points next to the count, ending at its first byte or starting
    // after its last, leave it static: 2^15 is still refused.
    for (byte, len) in [(20, 4), (28, 4)] {
        let mut p = one_enable(1 << 15, 0, 0);
        p.patches.push(redn_program::program::PatchPoint {
            label: "en".into(),
            byte,
            len,
            source: PatchSource::Trigger {
                param: "none".into(),
            },
        });
        let r = verify(&p, &Grants::new());
        let f = the_window_finding(&r, Some("en"));
        assert!(f.detail.contains("count 32768"), "bytes {byte}+{len}: {f}");
    }
}

#[test]
fn a_static_wait_in_a_recycled_loop_is_left_to_the_program() {
    // A WAIT whose count never moves only stops waiting (and, 2^23 completions on, waits
    // for ever): the program's liveness, not which WQEs may run. Not refused here.
    let mut p = catalog::server_loop().unwrap();
    p.patches.retain(|pp| pp.label != "sent");
    let r = verify(&p, &loop_grants());
    assert!(window_findings(&r).is_empty(), "{}", r.log());
}
