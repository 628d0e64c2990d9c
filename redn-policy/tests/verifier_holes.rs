//! Holes a red-team pass found in the verifier (docs/attacks.md, "Offload definitions"), and
//! what held beside them: each test asserts the safe verdict (the program refused), so a
//! failing test is a program the verifier admits although at run time it can leave its
//! grants. The run-time side (the same programs on the softnic) is
//! `redn-sys/tests/verifier_holes.rs`. What they pin:
//!
//! - a NOP-reset WRITE is a constant copy only while no patch point covers its remote
//!   address or data segment (`control::constant_copy`);
//! - a patch point, and a receive entry, must lie inside its WQE's blocks
//!   (`Checker::patch_points`, `Checker::wqes`);
//! - a recycled count's step is read off the program only while nothing patches the READ
//!   or FETCH_ADD landing it or the FETCH_ADDs on its counter, and its counter starts below
//!   half the index window (`window::step_of`, `window::check`).

use redn_policy::{verify, Grants, Report, Rule};
use redn_program::program::catalog;
use redn_program::program::{
    Addr, Builder, Form, Iterations, Op, PatchSource, Program, QueueRole, RegionRole, Sge,
};
use redn_program::wqe::WqeFlags;
use redn_program::Access;

const NONE: WqeFlags = WqeFlags::NONE;

fn refused(p: &Program, g: &Grants) {
    let r: Report = verify(p, g);
    assert!(!r.accepted(), "admitted:\n{}", r.log());
}

fn trigger(param: &str) -> PatchSource {
    PatchSource::Trigger {
        param: param.into(),
    }
}

/// See `redn-sys/tests/verifier_holes.rs` (same program): a NOP-reset WRITE from a 16-byte
/// static block whose gather address (a data segment's address, bytes 40..48 of the WRITE)
/// a trigger parameter patches.
fn reset_with_patched_gather(extra: [u8; 8]) -> Program {
    let mut b = Builder::new("reset-gather", "red team");
    b.region(
        "values",
        RegionRole::Data {
            access: Access::LOCAL_WRITE,
        },
        64,
        "server data",
    );
    b.region("response", RegionRole::Response, 64, "the client's buffer");
    b.param("sel", 8, "the reset's gather address");
    let mut tmpl = vec![0, 0, 0, 0, 0, 0, 0, 3];
    tmpl.extend_from_slice(&extra);
    b.static_block("tmpl", tmpl);
    let client = b.queue("client", QueueRole::Client, true, false, Some(0), 1, 1, 1);
    let w = b.queue("worker", QueueRole::Worker, true, false, Some(0), 4, 1, 1);
    let resp = Op::Write {
        remote: Addr::region("response", 0),
        sgl: vec![Sge::new(Addr::region("values", 0), 64)],
        imm: Some(7),
    };
    b.push(client, "resp", resp, NONE, Form::Nop);
    let wait = Op::Wait {
        queue: "client".into(),
        count: 0,
    };
    b.push(w, "trig", wait, NONE, Form::Active);
    b.if_eq(w, "if", "resp", Some(0), NONE).unwrap();
    b.patch(
        "resp",
        0,
        8,
        PatchSource::Write {
            label: "reset".into(),
        },
    );
    let reset = Op::Write {
        remote: Addr::wqe("resp", 0),
        sgl: vec![Sge::new(Addr::static_("tmpl", 0), 8)],
        imm: None,
    };
    b.push(w, "reset", reset, WqeFlags::FENCE, Form::Active);
    b.patch("reset", 40, 8, trigger("sel"));
    b.recv(client, vec![Sge::new(Addr::wqe("reset", 40), 8)]);
    let answer = Op::SendEn {
        queue: "client".into(),
        count: 1,
    };
    b.push(w, "answer", answer, WqeFlags::FENCE, Form::Active);
    b.entry(w, 4);
    b.finish(Iterations::bounded(1, 5), "red team");
    b.build().unwrap()
}

fn reset_grants() -> Grants {
    Grants::new()
        .with_region("values", Access::LOCAL_WRITE, 1 << 20)
        .with_region("response", Access::REMOTE_WRITE, 1 << 17)
}

/// Was a hole: the control-word model takes a NOP-reset WRITE as "these 8 constant bytes" from its
/// declared gather (`control::constant_copy`), but a trigger patch over the WRITE's own
/// gather address moves the copy anywhere in the static block's window.
#[test]
fn a_reset_whose_gather_address_is_patched_is_not_a_constant_copy() {
    // The extra 8 bytes: a READ control word (opcode 0x10, ds 3).
    refused(
        &reset_with_patched_gather([0, 0, 0, 0x10, 0, 0, 0, 3]),
        &reset_grants(),
    );
}

/// Same reset with its byte count patched instead (bytes 32..36): with bit 31 set the
/// segment is read as inline data, so the 8 bytes copied are the WRITE's own lkey and
/// address bytes, not the template.
#[test]
fn a_reset_whose_byte_count_is_patched_is_not_a_constant_copy() {
    let mut p = reset_with_patched_gather([0; 8]);
    for pp in &mut p.patches {
        if pp.label == "reset" {
            pp.byte = 32;
            pp.len = 4;
        }
    }
    p.params[0].len = 4;
    p.trigger_len = 4;
    p.queues[0].recvs[0].sgl = vec![Sge::new(Addr::wqe("reset", 32), 4)];
    refused(&p, &reset_grants());
}

/// See `redn-sys/tests/verifier_holes.rs`: a trigger patch point declared on a one-BB NOP at
/// bytes 88..96, i.e. on the count and QP number of the SEND_EN after it.
fn patch_past_its_wqe(byte: u32) -> Program {
    let mut b = Builder::new("past-the-wqe", "red team");
    b.param("target", 8, "count and QP number");
    let client = b.queue("client", QueueRole::Client, false, false, Some(0), 1, 1, 1);
    let w = b.queue("worker", QueueRole::Worker, true, false, Some(0), 4, 1, 1);
    let wait = Op::Wait {
        queue: "client".into(),
        count: 0,
    };
    b.push(w, "trig", wait, NONE, Form::Active);
    b.push(w, "pad", Op::Nop, NONE, Form::Active);
    let en = Op::SendEn {
        queue: "worker".into(),
        count: 3,
    };
    b.push(w, "en", en, NONE, Form::Active);
    b.patch("pad", byte, 8, trigger("target"));
    b.recv(client, vec![Sge::new(Addr::wqe("pad", byte as usize), 8)]);
    b.entry(w, 3);
    b.finish(Iterations::bounded(1, 3), "nothing");
    b.build().unwrap()
}

/// Was a hole: no pass checked that a patch point lies inside its WQE's blocks, and a receive
/// entry landing in a WQE was checked against the patch points only (not `range`): bytes
/// 88..96 of a one-BB NOP are another WQE's count and QP number.
#[test]
fn a_trigger_patch_point_past_its_wqe_is_refused() {
    refused(&patch_past_its_wqe(88), &Grants::new());
}

/// The same bytes reached from a READ scatter are refused (`range` checks READ scatter
/// entries against the WQE's size): held.
#[test]
fn a_read_scatter_past_its_wqe_is_refused() {
    let mut p = patch_past_its_wqe(88);
    p.patches[0].source = PatchSource::Read { label: "rd".into() };
    p.queues[0].recvs.clear();
    p.params.clear();
    p.trigger_len = 0;
    p.regions.push(redn_program::program::RegionDecl {
        name: "table".into(),
        role: RegionRole::Data {
            access: Access::REMOTE_READ,
        },
        min_len: 8,
        doc: String::new(),
    });
    p.queues[1].sq_bbs = 8;
    p.queues[1].wqes.insert(
        1,
        redn_program::program::Wqe {
            label: "rd".into(),
            op: Op::Read {
                remote: Addr::region("table", 0),
                sgl: vec![Sge::new(Addr::wqe("pad", 88), 8)],
            },
            flags: NONE,
            form: Form::Active,
        },
    );
    p.entry = vec![("worker".into(), 4)];
    let g = Grants::new().with_region("table", Access::REMOTE_READ, 64);
    refused(&p, &g);
}

/// The server loop with one more trigger parameter, `step`, landing in the addend of the
/// FETCH_ADD that advances the worker's `go` count (`adv.go.add`, bytes 32..40: an atomic
/// operand, not a protected field). The index-window rule reads the step off the program
/// (`window::step_of`: the FETCH_ADD's `add`), but the client picks it each round.
#[test]
fn a_recycled_counts_step_patched_by_the_trigger_is_refused() {
    let mut p = catalog::server_loop().unwrap();
    let at = p.trigger_len;
    p.params.push(redn_program::program::Param {
        name: "step".into(),
        offset: at,
        len: 8,
        doc: String::new(),
    });
    p.trigger_len += 8;
    p.patches.push(redn_program::program::PatchPoint {
        label: "adv.go.add".into(),
        byte: 32,
        len: 8,
        source: trigger("step"),
    });
    let client = p.queues.iter().position(|q| q.name == "client").unwrap();
    let sgl = &mut p.queues[client].recvs[0].sgl;
    assert!(sgl.len() < 4);
    sgl.push(Sge::new(Addr::wqe("adv.go.add", 32), 8));
    let mut g = Grants::new();
    g.loop_budget = Some(1_000_000);
    for (name, access) in [
        ("table", Access::REMOTE_READ),
        ("values", Access::NONE),
        ("response", Access::REMOTE_WRITE),
    ] {
        g = g.with_region(name, access, 1 << 20);
    }
    g.max_wqes_per_invocation = 256;
    // Unmodified, it is admitted under these grants.
    let base = catalog::server_loop().unwrap();
    assert!(verify(&base, &g).accepted(), "{}", verify(&base, &g).log());
    refused(&p, &g);
}

fn loop_grants() -> Grants {
    let mut g = Grants::new();
    g.loop_budget = Some(1_000_000);
    for (name, access) in [
        ("table", Access::REMOTE_READ),
        ("values", Access::NONE),
        ("response", Access::REMOTE_WRITE),
    ] {
        g = g.with_region(name, access, 1 << 20);
    }
    g.max_wqes_per_invocation = 256;
    g
}

/// The index-window rule bounds a recycled count's step a round (the FETCH_ADDs on its
/// counter) but not where the counter starts: the server loop's `c.go` counter starting
/// 2^15 BBs further makes the worker's first `go` SEND_EN read as behind (or, just under,
/// run the ring for ~1000 laps), exactly what a static count of that size is refused for.
#[test]
fn a_recycled_counter_starting_past_half_the_window_is_refused() {
    let base = catalog::server_loop().unwrap();
    assert!(verify(&base, &loop_grants()).accepted());
    let mut p = base;
    let c = p.statics.iter_mut().find(|s| s.name == "c.go").unwrap();
    let first = u64::from_le_bytes(c.bytes[..8].try_into().unwrap());
    c.bytes = (first + (1 << 15)).to_le_bytes().to_vec();
    refused(&p, &loop_grants());
}

/// Held: a static count at 2^15 is refused (`index-window`), as documented.
#[test]
fn a_static_enable_at_half_the_window_is_refused() {
    let mut p = patch_past_its_wqe(16);
    p.patches.clear();
    p.queues[0].recvs.clear();
    p.params.clear();
    p.trigger_len = 0;
    for w in &mut p.queues[1].wqes {
        if let Op::SendEn { count, .. } = &mut w.op {
            *count = 1 << 15;
        }
    }
    refused(&p, &Grants::new());
}

/// The program through the definition file format, as an operator's `offloads.d/` file
/// reaches the manager: written, loaded back (the loader's checks), then verified.
fn through_toml(p: &Program) -> Result<Program, String> {
    let text = redn_policy::write_definition(p);
    redn_policy::parse_definition(&text, &format!("{}.toml", p.name)).map_err(|e| e.to_string())
}

/// Was a hole, reachable from a definition file: the reset-gather program loads from TOML and
/// the loaded program is admitted.
#[test]
fn a_reset_whose_gather_address_is_patched_is_refused_from_a_definition_file() {
    let p = through_toml(&reset_with_patched_gather([0, 0, 0, 0x10, 0, 0, 0, 3])).unwrap();
    refused(&p, &reset_grants());
}

/// Was a hole, reachable from a definition file: the server loop with the trigger-patched
/// FETCH_ADD addend.
#[test]
fn a_recycled_step_patched_by_the_trigger_is_refused_from_a_definition_file() {
    let mut p = catalog::server_loop().unwrap();
    let at = p.trigger_len;
    p.params.push(redn_program::program::Param {
        name: "step".into(),
        offset: at,
        len: 8,
        doc: String::new(),
    });
    p.trigger_len += 8;
    p.patches.push(redn_program::program::PatchPoint {
        label: "adv.go.add".into(),
        byte: 32,
        len: 8,
        source: trigger("step"),
    });
    let client = p.queues.iter().position(|q| q.name == "client").unwrap();
    p.queues[client].recvs[0]
        .sgl
        .push(Sge::new(Addr::wqe("adv.go.add", 32), 8));
    let p = through_toml(&p).unwrap();
    refused(&p, &loop_grants());
}

/// Held (by the loader, not the verifier): a patch point or receive entry past its WQE
/// cannot be written in a definition file (`definition::resolve` checks both against the
/// WQE's size), so the past-the-WQE hole needs a program built in code.
#[test]
fn a_patch_point_past_its_wqe_is_refused_by_the_definition_loader() {
    let e = through_toml(&patch_past_its_wqe(88)).unwrap_err();
    assert!(e.contains("outside WQE"), "{e}");
}

/// Whether `r` refuses patch point `label`@`from`..`to` for running past its WQE.
fn past_its_wqe(r: &Report, label: &str, from: u32, to: u32) -> bool {
    r.findings.iter().any(|f| {
        f.rule == Rule::OutOfRegion
            && f.field == format!("bytes {from}..{to}")
            && f.wqe.as_ref().is_some_and(|(_, l)| l == label)
    })
}

/// The edges of "inside its WQE": a patch point may end at the last byte of its WQE's
/// blocks (of one BB, or of two), and not one byte past it. (Bytes that far in are padding
/// too, refused as such; here only the rule about the WQE's end is looked at.)
#[test]
fn a_patch_point_may_end_at_its_wqes_last_byte_and_not_past_it() {
    let mut b = Builder::new("edges", "patch points at the ends of their WQEs");
    b.static_block("s", vec![0; 64]);
    b.param("x", 8, "");
    let w = b.queue("worker", QueueRole::Worker, true, false, Some(0), 4, 1, 1);
    b.push(w, "one", Op::Nop, NONE, Form::Active);
    let two = Op::Write {
        remote: Addr::static_("s", 0),
        sgl: (0..4).map(|_| Sge::new(Addr::static_("s", 0), 8)).collect(),
        imm: None,
    };
    assert_eq!(two.bbs(), 2);
    b.push(w, "two", two, NONE, Form::Active);
    for (label, byte) in [("one", 56), ("one", 60), ("two", 120), ("two", 124)] {
        b.patch(label, byte, 8, trigger("x"));
    }
    b.entry(w, 3);
    b.finish(Iterations::bounded(1, 2), "nothing");
    let r = verify(&b.build().unwrap(), &Grants::new());
    assert!(!past_its_wqe(&r, "one", 56, 64), "{}", r.log());
    assert!(past_its_wqe(&r, "one", 60, 68), "{}", r.log());
    assert!(!past_its_wqe(&r, "two", 120, 128), "{}", r.log());
    assert!(past_its_wqe(&r, "two", 124, 132), "{}", r.log());
}

/// A receive entry landing past its WQE is refused as a READ's scatter is, whatever the
/// patch points say (`range`, beside `code_write`).
#[test]
fn a_receive_entry_past_its_wqe_is_refused_itself() {
    let r = verify(&patch_past_its_wqe(88), &Grants::new());
    assert!(
        r.findings.iter().any(|f| f.rule == Rule::OutOfRegion
            && f.field == "recv[0]"
            && f.detail.contains("pad@88..+8 is outside that WQE")),
        "{}",
        r.log()
    );
    assert!(past_its_wqe(&r, "pad", 88, 96), "{}", r.log());
}

/// The server loop with the READ that lands the worker's `go` count (`adv.go`) patched by
/// a trigger parameter over its remote address: the count may come from any counter (or
/// byte) of the block's window, so its step cannot be read off the program.
#[test]
fn a_recycled_count_whose_read_is_patched_is_refused() {
    let mut p = catalog::server_loop().unwrap();
    let at = p.trigger_len;
    p.params.push(redn_program::program::Param {
        name: "from".into(),
        offset: at,
        len: 8,
        doc: String::new(),
    });
    p.trigger_len += 8;
    p.patches.push(redn_program::program::PatchPoint {
        label: "adv.go".into(),
        byte: 16,
        len: 8,
        source: trigger("from"),
    });
    let client = p.queues.iter().position(|q| q.name == "client").unwrap();
    p.queues[client].recvs[0]
        .sgl
        .push(Sge::new(Addr::wqe("adv.go", 16), 8));
    let r = verify(&p, &loop_grants());
    assert!(
        r.findings.iter().any(|f| f.rule == Rule::IndexWindow
            && f.detail
                .contains("comes from \"adv.go\", which may be patched")),
        "{}",
        r.log()
    );
}

/// The edge of a counter's start, on the counter it belongs to: `c.go` at 2^15 - 1 is
/// admitted; at 2^15 the `go` SEND_EN it lands in is refused, and no other count.
#[test]
fn a_recycled_counter_may_start_just_under_half_the_window() {
    let with_go = |first: u64| {
        let mut p = catalog::server_loop().unwrap();
        let c = p.statics.iter_mut().find(|s| s.name == "c.go").unwrap();
        c.bytes = first.to_le_bytes().to_vec();
        verify(&p, &loop_grants())
    };
    let r = with_go((1 << 15) - 1);
    assert!(r.accepted(), "{}", r.log());
    let r = with_go(1 << 15);
    let labels: Vec<&str> = r
        .findings
        .iter()
        .map(|f| {
            assert_eq!(f.rule, Rule::IndexWindow, "{}", r.log());
            assert!(f.detail.contains("counter starts at 32768"), "{}", r.log());
            f.wqe.as_ref().map_or("", |(_, l)| l.as_str())
        })
        .collect();
    assert_eq!(labels, ["go"], "{}", r.log());
}
