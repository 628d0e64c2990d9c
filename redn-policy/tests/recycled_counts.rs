//! The structure pass's reachability at its edges: which patched enable counts make a queue
//! "recycled" (its reach is then rewritten at run time, so no position is refused), that a
//! RECV_EN reaches no send ring, and the positions its findings name. (Mutation testing
//! found these unchecked; docs/testing.md.)

use redn_policy::{verify, Finding, Grants, Report, Rule};
use redn_program::program::{Builder, Form, Iterations, Op, PatchSource, Program, QueueRole};
use redn_program::wqe::{off, WqeFlags};

/// The byte of an enable WQE where its count (the WAIT segment's producer index) starts.
const COUNT_BYTE: u32 = 24;
const _: () = assert!(COUNT_BYTE as usize == off::WAIT_PI);

/// Queue `w` (managed sends, no entry) holds three NOPs; queue `m` (rung at install) runs
/// `op`, labelled "en", which a patch point from `patch` (byte, len, source) may cover.
fn program(op: Op, patch: Option<(u32, u32, PatchSource)>) -> Program {
    let mut b = Builder::new("reach", "an enable of three NOPs");
    let w = b.queue("w", QueueRole::Worker, true, true, None, 8, 1, 1);
    let m = b.queue("m", QueueRole::Worker, false, false, None, 8, 1, 1);
    for i in 0..3 {
        b.push(w, &format!("nop{i}"), Op::Nop, WqeFlags::NONE, Form::Active);
    }
    b.push(m, "en", op, WqeFlags::NONE, Form::Active);
    if let Some((byte, len, source)) = patch {
        b.patch("en", byte, len, source);
    }
    b.entry(m, 1);
    b.finish(Iterations::bounded(1, 4), "nothing");
    b.build().unwrap()
}

fn send_en_of_one() -> Op {
    Op::SendEn {
        queue: "w".into(),
        count: 1,
    }
}

/// The structure pass's "unreachable" finding for queue `w`, if any.
fn unreachable_in_w(r: &Report) -> Option<&Finding> {
    r.findings.iter().find(|f| {
        f.rule == Rule::Unreachable && f.field == "position" && f.queue.as_deref() == Some("w")
    })
}

fn read() -> PatchSource {
    PatchSource::Read {
        label: "counter.read".into(),
    }
}

#[test]
fn an_enable_count_is_recycled_only_where_a_counter_patch_covers_its_first_byte() {
    let fetch_add = || PatchSource::AtomicResult {
        label: "counter.add".into(),
    };
    let cases = [
        // (byte, len, source, recycled)
        (COUNT_BYTE, 4, read(), true),
        (COUNT_BYTE, 1, read(), true),
        (COUNT_BYTE, 4, fetch_add(), true),
        // Starting before the count and running into its first byte.
        (COUNT_BYTE - 3, 4, read(), true),
        (1, COUNT_BYTE, read(), true),
        // Ending just before the count, or starting past its first byte.
        (COUNT_BYTE - 4, 4, read(), false),
        (1, COUNT_BYTE - 1, read(), false),
        (COUNT_BYTE + 1, 3, read(), false),
        (COUNT_BYTE + 1, 3, fetch_add(), false),
        // Over the count but not a counter: a client's parameter, a CAS, a copy.
        (
            COUNT_BYTE,
            4,
            PatchSource::Trigger {
                param: "count".into(),
            },
            false,
        ),
        (
            COUNT_BYTE,
            4,
            PatchSource::Cas {
                label: "cas".into(),
            },
            false,
        ),
        (
            COUNT_BYTE,
            4,
            PatchSource::Write {
                label: "copy".into(),
            },
            false,
        ),
    ];
    for (byte, len, source, recycled) in cases {
        let what = format!("{byte}+{len} from {source:?}");
        let r = verify(
            &program(send_en_of_one(), Some((byte, len, source))),
            &Grants::new(),
        );
        match unreachable_in_w(&r) {
            None => assert!(recycled, "{what}: nothing refused\n{}", r.log()),
            Some(f) => {
                assert!(!recycled, "{what}: {f:?}");
                // The enable reaches one NOP: the second is the first one refused.
                assert_eq!(f.wqe, Some((1, "nop1".to_string())), "{what}");
            }
        }
    }
    // No patch at all: an enable of one reaches one NOP.
    let r = verify(&program(send_en_of_one(), None), &Grants::new());
    assert_eq!(
        unreachable_in_w(&r).and_then(|f| f.wqe.clone()),
        Some((1, "nop1".to_string()))
    );
}

#[test]
fn a_recv_en_reaches_no_send_ring() {
    let recv_en = Op::RecvEn {
        queue: "w".into(),
        count: 3,
    };
    let r = verify(&program(recv_en, None), &Grants::new());
    assert!(!r.broke(Rule::EnableUnmanaged), "{}", r.log());
    assert_eq!(
        unreachable_in_w(&r).and_then(|f| f.wqe.clone()),
        Some((0, "nop0".to_string())),
        "{}",
        r.log()
    );
    // The same count as a SEND_EN reaches all three.
    let send_en = Op::SendEn {
        queue: "w".into(),
        count: 3,
    };
    let r = verify(&program(send_en, None), &Grants::new());
    assert!(unreachable_in_w(&r).is_none(), "{}", r.log());
}

#[test]
fn a_structure_finding_names_the_position_of_its_wqe() {
    // Queue `m` runs two NOPs before the offending enable: its position counts the BBs
    // before it.
    let mut b = Builder::new("positions", "an enable of a queue nobody owns");
    let m = b.queue("m", QueueRole::Worker, false, false, None, 8, 1, 1);
    b.push(m, "nop0", Op::Nop, WqeFlags::NONE, Form::Active);
    b.push(m, "nop1", Op::Nop, WqeFlags::NONE, Form::Active);
    b.push(
        m,
        "en",
        Op::SendEn {
            queue: "elsewhere".into(),
            count: 1,
        },
        WqeFlags::NONE,
        Form::Active,
    );
    b.push(
        m,
        "wait",
        Op::Wait {
            queue: "elsewhere".into(),
            count: 1,
        },
        WqeFlags::NONE,
        Form::Active,
    );
    b.entry(m, 4);
    b.finish(Iterations::bounded(1, 4), "nothing");
    let r = verify(&b.build().unwrap(), &Grants::new());
    let at = |field: &str| {
        r.findings
            .iter()
            .find(|f| f.rule == Rule::UnknownName && f.field == field)
            .and_then(|f| f.wqe.clone())
    };
    assert_eq!(
        at("enable.queue"),
        Some((2, "en".to_string())),
        "{}",
        r.log()
    );
    assert_eq!(at("wait.cq"), Some((3, "wait".to_string())), "{}", r.log());
}

#[test]
fn in_a_bounded_program_a_patched_count_is_a_loop_and_bytes_past_it_are_not() {
    let loop_found = |byte, len| {
        let r = verify(
            &program(send_en_of_one(), Some((byte, len, read()))),
            &Grants::new(),
        );
        r.findings
            .iter()
            .any(|f| f.rule == Rule::UnboundedLoop && f.field == "count")
    };
    // The count and its reserved high half (bytes 20..28), each edge.
    for (byte, len) in [
        (COUNT_BYTE, 4),
        (COUNT_BYTE + 3, 1),
        (COUNT_BYTE - 4, 1),
        (16, 5),
    ] {
        assert!(loop_found(byte, len), "{byte}+{len}");
    }
    // The object number after it, and the bytes before the reserved half.
    for (byte, len) in [(COUNT_BYTE + 4, 4), (16, 4), (0, 8)] {
        assert!(!loop_found(byte, len), "{byte}+{len}");
    }
}
