//! Offload definition files: the shipped catalog files, round trips, and bad input refused
//! with the file, the line and the key.

use redn_policy::{
    load_definition, load_offloads_dir, parse_definition, shipped_offloads, verify,
    write_definition, Grants, MAX_FILE_BYTES,
};
use redn_program::program::catalog::{self, HashVariant};
use redn_program::program::{
    Addr, Form, Iterations, Op, Operand, Program, RegionRole, Sge, Slots, StaticBlock, Wqe,
};
use redn_program::wqe::WqeFlags;
use redn_program::Access;
use std::path::{Path, PathBuf};

fn offloads_d() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../etc/redn/offloads.d")
}

/// A small program that uses most of the format, written by hand as an operator would.
const TINY: &str = r#"# A hand-written definition.
name = "tiny"
summary = "a tiny program for tests"
response = "the static block's first 8 bytes if the key matches"
iterations = { kind = "bounded", invocations = 1, wqes_per_invocation = 5 }
entry = [{ queue = "worker", count = 3 }]

[[region]]
name = "data"
role = "data"
access = "remote-read|local-write"
min_len = 64

[[region]]
name = "response"
role = "response"
min_len = 8

[[param]]
name = "key"
len = 6

[[static]]
name = "blk"
len = 16
bytes = "01 02"

[[queue]]
name = "client"
role = "client"
managed_send = true
sq_bbs = 1
rq_slots = 1
rq_sges = 2

[[queue.wqe]]
label = "reply"
op = "write"
form = "nop"
remote = "region:response+0"
sgl = [{ addr = "static:blk", len = 8 }]
imm = 7

[[queue.recv]]
sgl = [{ addr = "wqe:if@41", len = 3 }, { addr = "wqe:if@45", len = 3 }]

[[queue]]
name = "worker"
role = "worker"
managed_send = true
sq_bbs = 4
rq_slots = 1
rq_sges = 1

[[queue.wqe]]
label = "wait"
op = "wait"
queue = "client"
count = 0

[[queue.wqe]]
label = "if"
op = "cas"
fence = true
signaled = true
remote = "wqe:reply@0"
compare = "ctrl:reply:nop:operand=0x0"
swap = "ctrl:reply:active:real"

[[queue.wqe]]
label = "answer"
op = "send-en"
queue = "client"
count = 1

[[patch]]
label = "reply"
bytes = [0, 8]
source = "cas:if"

[[patch]]
label = "if"
byte = 41
len = 3
source = "trigger:key"

[[patch]]
label = "if"
bytes = [45, 48]
source = "trigger:key"
"#;

fn tiny() -> Program {
    parse_definition(TINY, "tiny.toml").unwrap_or_else(|e| panic!("{e}"))
}

/// Load `text`, write it, load that: the same program, and writing again the same text.
fn round_trip(p: &Program) {
    let text = write_definition(p);
    let back = parse_definition(&text, "written.toml")
        .unwrap_or_else(|e| panic!("{}: {e}\n{text}", p.name));
    assert_eq!(&back, p);
    assert_eq!(write_definition(&back), text);
}

/// The 1-based line where `needle` first starts in `text`.
fn line_of(text: &str, needle: &str) -> usize {
    let at = text
        .find(needle)
        .unwrap_or_else(|| panic!("{needle:?} not in the text"));
    text[..at].matches('\n').count() + 1
}

/// `TINY` with `from` replaced by `to` (which must occur once).
fn edit(from: &str, to: &str) -> String {
    assert_eq!(TINY.matches(from).count(), 1, "{from:?}");
    TINY.replace(from, to)
}

/// The error for `text`, checked to start with `t.toml:LINE:` where LINE is the line that
/// holds `at`, to name `key`, and to say `message`.
fn refused(text: &str, at: &str, key: &str, message: &str) -> String {
    let e = match parse_definition(text, "t.toml") {
        Ok(_) => panic!("accepted:\n{text}"),
        Err(e) => e.to_string(),
    };
    let line = line_of(text, at);
    assert!(
        e.starts_with(&format!("t.toml:{line}:")),
        "expected line {line} ({at:?}): {e}"
    );
    assert!(e.contains(&format!(": {key}: ")), "expected key {key}: {e}");
    assert!(e.contains(message), "expected {message:?}: {e}");
    e
}

// ---- the shipped catalog ---------------------------------------------------------------

#[test]
fn shipped_files_load_to_exactly_the_builders_programs() {
    let shipped = shipped_offloads().unwrap();
    let names: Vec<String> = shipped.iter().map(|s| s.file_name()).collect();
    assert_eq!(
        names,
        [
            "echo.toml",
            "hash-get.toml",
            "hash-get-seq.toml",
            "hash-get-par.toml",
            "list-find.toml",
            "list-find-break.toml",
            "server-loop.toml"
        ]
    );
    for s in &shipped {
        let path = offloads_d().join(s.file_name());
        let loaded = load_definition(&path).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(loaded, s.program, "{}", path.display());
        let text = std::fs::read_to_string(&path).unwrap();
        assert!(
            text == s.file_text(),
            "{} is not what the builder generates: run `cargo run -p redn-policy --example gen_offloads`",
            path.display()
        );
        assert!(
            text.starts_with(&format!("# {}: ", s.program.name)),
            "{}",
            s.file_name()
        );
        assert!(text.contains(&format!("redn_program::program::{} ", s.builder)));
        assert!(
            (text.len() as u64) < MAX_FILE_BYTES / 2,
            "{} is too close to the cap",
            s.file_name()
        );
    }
    // The builder defaults the issue documents.
    assert_eq!(shipped[0].program, catalog::echo(64, 4).unwrap());
    assert_eq!(
        shipped[1].program,
        catalog::hash_get(HashVariant::Single, 4).unwrap()
    );
    assert_eq!(
        shipped[2].program,
        catalog::hash_get(HashVariant::Sequential, 4).unwrap()
    );
    assert_eq!(
        shipped[3].program,
        catalog::hash_get(HashVariant::Parallel, 4).unwrap()
    );
    assert_eq!(shipped[4].program, catalog::list_find(8, false, 4).unwrap());
    assert_eq!(shipped[5].program, catalog::list_find(8, true, 1).unwrap());
    assert_eq!(shipped[6].program, catalog::server_loop().unwrap());
}

#[test]
fn the_shipped_directory_loads_sorted() {
    let programs = load_offloads_dir(offloads_d()).unwrap_or_else(|e| panic!("{e}"));
    let names: Vec<&str> = programs.iter().map(|p| p.name.as_str()).collect();
    assert_eq!(
        names,
        [
            "echo",
            "hash-get",
            "hash-get-par",
            "hash-get-seq",
            "list-find",
            "list-find-break",
            "server-loop"
        ]
    );
}

#[test]
fn shipped_programs_pass_the_verifier() {
    let mut g = Grants::new()
        .with_region("table", Access::REMOTE_READ, 1 << 20)
        .with_region("list", Access::REMOTE_READ, 1 << 20)
        .with_region("values", Access::NONE, 1 << 20)
        .with_region("response", Access::REMOTE_WRITE, 1 << 17);
    g.loop_budget = Some(1_000_000);
    g.max_wqes_per_invocation = 256;
    for p in load_offloads_dir(offloads_d()).unwrap() {
        let r = verify(&p, &g);
        assert!(r.accepted(), "{}", r.log());
    }
}

#[test]
fn every_catalog_program_round_trips() {
    let mut programs = vec![
        catalog::echo(1, 1).unwrap(),
        catalog::echo(16, 3).unwrap(),
        catalog::server_loop().unwrap(),
        catalog::list_find(1, false, 1).unwrap(),
        catalog::list_find(4, false, 2).unwrap(),
        catalog::list_find(14, true, 1).unwrap(),
    ];
    for v in [
        HashVariant::Single,
        HashVariant::Sequential,
        HashVariant::Parallel,
    ] {
        for n in [1, 2, 5] {
            programs.push(catalog::hash_get(v, n).unwrap());
        }
    }
    programs.extend(shipped_offloads().unwrap().into_iter().map(|s| s.program));
    for p in &programs {
        round_trip(p);
    }
}

// ---- hand-written files and unusual programs -----------------------------------------

#[test]
fn a_hand_written_file_loads_round_trips_and_verifies() {
    let p = tiny();
    assert_eq!(p.name, "tiny");
    assert_eq!(p.trigger_len, 6);
    assert_eq!(p.params[0].offset, 0);
    assert_eq!(
        p.statics[0].bytes,
        [1, 2, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0]
    );
    assert_eq!(
        p.regions[0].role,
        RegionRole::Data {
            access: Access::REMOTE_READ | Access::LOCAL_WRITE
        }
    );
    let reply = &p.queues[0].wqes[0];
    assert_eq!(reply.form, Form::Nop);
    assert_eq!(
        reply.op,
        Op::Write {
            remote: Addr::region("response", 0),
            sgl: vec![Sge::new(Addr::static_("blk", 0), 8)],
            imm: Some(7),
        }
    );
    let cas = &p.queues[1].wqes[1];
    assert_eq!(cas.flags, WqeFlags::FENCE | WqeFlags::SIGNALED);
    assert_eq!(p.patches[1].byte, 41);
    assert_eq!(p.patches[1].len, 3);
    assert_eq!(p.patches[2].byte, 45);
    round_trip(&p);
    let g = Grants::new()
        .with_region("data", Access::REMOTE_READ | Access::LOCAL_WRITE, 64)
        .with_region("response", Access::REMOTE_WRITE, 4096);
    let r = verify(&p, &g);
    assert!(r.accepted(), "{}", r.log());
}

#[test]
fn unusual_programs_round_trip() {
    let mut p = tiny();
    p.summary =
        "quotes \" and \\ backslashes, a\nnewline, a\ttab, \u{7f}, \u{1} and ünïcødé".into();
    p.response_doc = String::new();
    p.trigger_len = 100;
    p.params[0].offset = 10;
    p.params[0].doc = "#not a comment".into();
    p.regions[0].min_len = u64::MAX;
    p.regions[0].role = RegionRole::Data {
        access: Access::NONE,
    };
    p.statics.push(StaticBlock {
        name: "zeros".into(),
        bytes: vec![0; 3],
    });
    p.statics.push(StaticBlock {
        name: "empty".into(),
        bytes: vec![],
    });
    p.statics.push(StaticBlock {
        name: "inner".into(),
        bytes: vec![0, 0xff, 0, 0x10, 0],
    });
    p.queues[0].pu = None;
    p.queues[1].pu = Some(63);
    p.queues[1].managed_recv = true;
    p.recv_entry = vec![("worker".into(), 0), ("client".into(), 9)];
    p.entry.push(("worker".into(), 0));
    p.iterations = Iterations::Recycled { wqes_per_round: 0 };
    let w = &mut p.queues[1].wqes;
    w[0].flags = WqeFlags(0x28); // signaled and a small fence: only the raw byte says that
    w[2].flags = WqeFlags::SOLICITED;
    w[2].form = Form::Nop;
    w.push(Wqe {
        label: "umr".into(),
        op: Op::Other { opcode: 0x25 },
        flags: WqeFlags(0xff),
        form: Form::Active,
    });
    p.queues[1].sq_bbs = 64;
    let extra = [
        Op::Nop,
        Op::Write {
            remote: Addr::region("data", u64::MAX),
            sgl: vec![],
            imm: None,
        },
        Op::Read {
            remote: Addr::region("data", 0x8000_0000_0000_0000),
            sgl: vec![
                Sge::new(Addr::wqe("if", 63), 0),
                Sge::new(Addr::static_("inner", u64::MAX), u32::MAX),
                Sge::new(Addr::region("data", 1), 1),
            ],
        },
        Op::Cas {
            remote: Addr::static_("blk", 8),
            compare: Operand::Lit(u64::MAX),
            swap: Operand::Lit(0),
            result: Some(Sge::new(Addr::region("data", 8), 8)),
        },
        Op::MaskedCas {
            remote: Addr::wqe("answer", 0),
            compare: Operand::Ctrl {
                label: "answer".into(),
                form: Form::Active,
                slots: Slots::Operand((1 << 48) - 1),
                ds: Some(0),
            },
            compare_mask: 0,
            swap: Operand::Lit(i64::MAX as u64),
            swap_mask: 1,
        },
        Op::Faa {
            remote: Addr::region("data", 16),
            add: u64::MAX,
            result: None,
        },
        Op::RecvEn {
            queue: "worker".into(),
            count: u32::MAX,
        },
    ];
    for (i, op) in extra.into_iter().enumerate() {
        p.queues[1].wqes.push(Wqe {
            label: format!("x{i}"),
            op,
            flags: WqeFlags::NONE,
            form: Form::Active,
        });
    }
    round_trip(&p);
    let text = write_definition(&p);
    assert!(text.contains("opcode = 0x25\nflags = 0xff\n"), "{text}");
    assert!(text.contains("flags = 0x28\n"), "{text}");
    assert!(
        text.contains("min_len = \"0xffffffffffffffff\"\n"),
        "{text}"
    );
    assert!(
        text.contains("compare = \"0xffffffffffffffff\"\n"),
        "{text}"
    );
    assert!(
        text.contains("compare = \"ctrl:answer:active:operand=0xffffffffffff:ds=0\"\n"),
        "{text}"
    );
    assert!(
        text.contains("[[static]]\nname = \"empty\"\nlen = 0\n\n"),
        "{text}"
    );
    assert!(text.contains("bytes = \"00ff0010\"\n"), "{text}");
    assert!(text.contains("access = \"local-read\"\n"), "{text}");
}

#[test]
fn numbers_may_be_written_in_several_ways() {
    let text = edit("min_len = 64", "min_len = \"0x40\"")
        .replace("count = 0", "count = 0x0")
        .replace("operand=0x0", "operand=0")
        .replace("bytes = \"01 02\"", "bytes = \"01_02\"");
    assert_eq!(parse_definition(&text, "t.toml").unwrap(), tiny());
    // A wider value than a TOML integer holds, as a string.
    let p = parse_definition(
        &edit("signaled = true\n", "signaled = false\n").replace(
            "compare = \"ctrl:reply:nop:operand=0x0\"",
            "compare = \"18446744073709551615\"",
        ),
        "t.toml",
    )
    .unwrap();
    let Op::Cas { compare, .. } = &p.queues[1].wqes[1].op else {
        panic!()
    };
    assert_eq!(compare, &Operand::Lit(u64::MAX));
    assert_eq!(p.queues[1].wqes[1].flags, WqeFlags::FENCE);
}

// ---- bad input: file, line and key -----------------------------------------------------

#[test]
fn syntax_and_schema_errors_name_line_and_key() {
    refused(
        &edit("count = 0", "count = = 0"),
        "count = = 0",
        "queue.wqe.count",
        "",
    );
    refused(
        &edit("count = 0", "count = -1"),
        "count = -1",
        "queue \"worker\" wqe \"wait\" count",
        "invalid value",
    );
    refused(
        &edit("count = 0", "count = \"zero\""),
        "count = \"zero\"",
        "queue \"worker\" wqe \"wait\" count",
        "invalid type",
    );
    let e = refused(
        &edit("count = 0", "count = 0\ncolour = 1"),
        "colour",
        "queue \"worker\" wqe \"wait\" colour",
        "unknown key",
    );
    assert!(e.contains("`compare_mask`"), "{e}");
    refused(
        &edit("summary = ", "colour = 1\nsummary = "),
        "colour",
        "colour",
        "unknown key",
    );
    refused(
        &edit("op = \"wait\"", "op = \"sleep\""),
        "op = \"sleep\"",
        "queue \"worker\" wqe \"wait\" op",
        "unknown variant `sleep`",
    );
    refused(
        &edit("role = \"worker\"", "role = \"boss\""),
        "role = \"boss\"",
        "queue \"worker\" role",
        "unknown variant `boss`",
    );
    refused(
        &edit("sq_bbs = 4\n", ""),
        "[[queue]]\nname = \"worker\"",
        "queue \"worker\" sq_bbs",
        "required but missing",
    );
    refused(
        &edit("name = \"tiny\"\n", ""),
        "# A hand-written",
        "name",
        "required but missing",
    );
    refused(
        &edit("kind = \"bounded\"", "kind = \"forever\""),
        "iterations",
        "iterations.kind",
        "unknown variant `forever`",
    );
    refused(
        &edit("[[param]]", "[param]"),
        "[param]",
        "param",
        "expected a sequence",
    );
    refused(
        &edit("fence = true", "fence = 1"),
        "fence = 1",
        "queue \"worker\" wqe \"if\" fence",
        "invalid type",
    );
    refused(
        &edit("min_len = 64", "min_len = -64"),
        "min_len = -64",
        "region \"data\" min_len",
        "negative",
    );
    refused(
        &edit("min_len = 64", "min_len = \"lots\""),
        "min_len = \"lots\"",
        "region \"data\" min_len",
        "invalid number \"lots\"",
    );
    refused(
        &edit("len = 16", "len = 16\nlen = 17"),
        "len = 17",
        "static.len",
        "duplicate key",
    );
}

#[test]
fn operation_keys_are_checked() {
    refused(
        &edit("imm = 7", "imm = 7\ncompare = 1"),
        "compare = 1",
        "queue \"client\" wqe \"reply\" compare",
        "does not apply to op \"write\"; it takes remote, sgl, imm",
    );
    refused(
        &edit("remote = \"region:response+0\"\n", ""),
        "[[queue.wqe]]\nlabel = \"reply\"",
        "queue \"client\" wqe \"reply\" remote",
        "op \"write\" needs this key",
    );
    refused(
        &edit("swap = \"ctrl:reply:active:real\"\n", ""),
        "[[queue.wqe]]\nlabel = \"if\"",
        "queue \"worker\" wqe \"if\" swap",
        "op \"cas\" needs this key",
    );
    refused(
        &edit("op = \"wait\"", "opcode = 0x25"),
        "queue = \"client\"\ncount = 0",
        "queue \"worker\" wqe \"wait\" queue",
        "does not apply to opcode 0x25; it takes no operands",
    );
    refused(
        &edit("op = \"wait\"", "op = \"wait\"\nopcode = 0x0f"),
        "opcode = 0x0f",
        "queue \"worker\" wqe \"wait\" opcode",
        "not both",
    );
    refused(
        &edit(
            "op = \"send-en\"\nqueue = \"client\"\ncount = 1",
            "opcode = 0x17",
        ),
        "opcode = 0x17",
        "queue \"worker\" wqe \"answer\" opcode",
        "is SEND_EN: write it as op",
    );
    refused(
        &edit("op = \"send-en\"\n", ""),
        "[[queue.wqe]]\nlabel = \"answer\"",
        "queue \"worker\" wqe \"answer\" op",
        "required but missing",
    );
    refused(
        &edit("fence = true", "flags = 0x80"),
        "flags = 0x80",
        "queue \"worker\" wqe \"if\" flags",
        "not both",
    );
    refused(
        &edit("op = \"wait\"", "opcode = 0x100"),
        "opcode = 0x100",
        "queue \"worker\" wqe \"wait\" opcode",
        "invalid value",
    );
    let many: Vec<String> = (0..62)
        .map(|i| format!("{{ addr = \"static:blk+{i}\", len = 1 }}"))
        .collect();
    refused(
        &edit(
            "sgl = [{ addr = \"static:blk\", len = 8 }]",
            &format!("sgl = [{}]", many.join(", ")),
        ),
        "sgl = [",
        "queue \"client\" wqe \"reply\" sgl",
        "62 non-empty entries make 64 segments; a WQE holds at most 63",
    );
}

#[test]
fn symbolic_fields_are_checked() {
    // The example of the issue, and its neighbours.
    refused(
        &edit("swap = \"ctrl:reply:active:real\"", "swap = \"ctrl:x\""),
        "swap = ",
        "queue \"worker\" wqe \"if\" swap",
        "unknown operand form \"ctrl:x\"",
    );
    refused(
        &edit(
            "swap = \"ctrl:reply:active:real\"",
            "swap = \"ctrl:reply:on:real\"",
        ),
        "swap = ",
        "queue \"worker\" wqe \"if\" swap",
        "unknown operand form",
    );
    refused(
        &edit(
            "swap = \"ctrl:reply:active:real\"",
            "swap = \"ctrl:reply:active:real:ds=64\"",
        ),
        "swap = ",
        "queue \"worker\" wqe \"if\" swap",
        "ds 64 in \"ctrl:reply:active:real:ds=64\" is above 63",
    );
    refused(
        &edit("operand=0x0", "operand=0x1000000000000"),
        "compare = ",
        "queue \"worker\" wqe \"if\" compare",
        "wider than 48 bits",
    );
    refused(
        &edit("swap = \"ctrl:reply:active:real\"", "swap = \"maybe\""),
        "swap = ",
        "queue \"worker\" wqe \"if\" swap",
        "unknown operand form \"maybe\"",
    );
    refused(
        &edit(
            "swap = \"ctrl:reply:active:real\"",
            "swap = \"ctrl:nobody:active:real\"",
        ),
        "swap = ",
        "queue \"worker\" wqe \"if\" swap",
        "the control image of \"nobody\", but no WQE has that label",
    );
    refused(
        &edit("swap = \"ctrl:reply:active:real\"", "swap = -1"),
        "swap = ",
        "queue \"worker\" wqe \"if\" swap",
        "negative",
    );
    refused(
        &edit("remote = \"region:response+0\"", "remote = \"response+0\""),
        "remote = ",
        "queue \"client\" wqe \"reply\" remote",
        "unknown address form \"response+0\"",
    );
    refused(
        &edit(
            "remote = \"region:response+0\"",
            "remote = \"heap:response+0\"",
        ),
        "remote = ",
        "queue \"client\" wqe \"reply\" remote",
        "unknown address form",
    );
    refused(
        &edit(
            "remote = \"region:response+0\"",
            "remote = \"region:response+x\"",
        ),
        "remote = ",
        "queue \"client\" wqe \"reply\" remote",
        "invalid offset \"x\"",
    );
    refused(
        &edit(
            "remote = \"region:response+0\"",
            "remote = \"region:heap+0\"",
        ),
        "remote = ",
        "queue \"client\" wqe \"reply\" remote",
        "region \"heap\" is not declared",
    );
    refused(
        &edit("addr = \"static:blk\"", "addr = \"static:blob\""),
        "static:blob",
        "queue \"client\" wqe \"reply\" sgl[0].addr",
        "static block \"blob\" is not declared",
    );
    refused(
        &edit(
            "{ addr = \"wqe:if@45\", len = 3 }",
            "{ addr = \"wqe:fi@45\", len = 3 }",
        ),
        "wqe:fi",
        "queue \"client\" recv[0].sgl[1].addr",
        "no WQE is labelled \"fi\"",
    );
    refused(
        &edit(
            "{ addr = \"wqe:if@45\", len = 3 }",
            "{ addr = \"wqe:if@64\", len = 3 }",
        ),
        "wqe:if@64",
        "queue \"client\" recv[0].sgl[1].addr",
        "byte 64 is outside WQE \"if\", which has 64 bytes",
    );
    refused(
        &edit(
            "{ addr = \"wqe:if@45\", len = 3 }",
            "{ addr = \"wqe:if@45\", len = 3, key = 1 }",
        ),
        "wqe:if@45",
        "queue \"client\" recv[0].sgl[1].key",
        "unknown key",
    );
    refused(
        &edit(
            "queue = \"client\"\ncount = 0",
            "queue = \"server\"\ncount = 0",
        ),
        "queue = \"server\"",
        "queue \"worker\" wqe \"wait\" queue",
        "no queue is called \"server\"",
    );
    refused(
        &edit(
            "entry = [{ queue = \"worker\", count = 3 }]",
            "entry = [{ queue = \"workers\", count = 3 }]",
        ),
        "entry = ",
        "entry[0].queue",
        "no queue is called \"workers\"",
    );
}

#[test]
fn names_are_unique_and_well_formed() {
    let e = refused(
        &edit("label = \"answer\"", "label = \"wait\""),
        "label = \"wait\"\nop = \"send-en\"",
        "queue \"worker\" wqe \"wait\" label",
        "WQE label \"wait\" is already defined",
    );
    assert!(
        e.contains(&format!("(line {})", line_of(TINY, "label = \"wait\""))),
        "{e}"
    );
    refused(
        &edit("name = \"client\"", "name = \"worker\""),
        "name = \"worker\"\nrole = \"worker\"",
        "queue \"worker\" name",
        "queue \"worker\" is already defined",
    );
    refused(
        &edit("name = \"data\"", "name = \"response\""),
        "name = \"response\"\nrole = \"response\"",
        "region \"response\" name",
        "region \"response\" is already defined",
    );
    refused(
        &edit("label = \"if\"\nop", "label = \"if then\"\nop"),
        "label = \"if then\"",
        "queue \"worker\" wqe \"if then\" label",
        "invalid name \"if then\"",
    );
    refused(
        &edit("name = \"tiny\"", "name = \"\""),
        "name = \"\"",
        "name",
        "invalid name \"\"",
    );
    refused(
        &edit("name = \"blk\"", "name = \"-blk\""),
        "name = \"-blk\"",
        "static \"-blk\" name",
        "starting with a letter or digit",
    );
}

#[test]
fn patch_points_are_checked() {
    refused(
        &edit("bytes = [45, 48]", "bytes = [48, 45]"),
        "bytes = [48, 45]",
        "patch \"if\" bytes",
        "from < to",
    );
    refused(
        &edit("bytes = [45, 48]", "bytes = [45, 48, 50]"),
        "bytes = [45, 48, 50]",
        "patch \"if\" bytes",
        "from < to",
    );
    refused(
        &edit("bytes = [45, 48]", "bytes = [45, 65]"),
        "bytes = [45, 65]",
        "patch \"if\" bytes",
        "bytes 45..65 are outside WQE \"if\", which has 64 bytes",
    );
    refused(
        &edit("len = 3\nsource", "len = 0\nsource"),
        "len = 0",
        "patch \"if\" len",
        "at least one byte",
    );
    refused(
        &edit("bytes = [45, 48]", "bytes = [45, 48]\nbyte = 45"),
        "byte = 45",
        "patch \"if\" byte",
        "not both",
    );
    refused(
        &edit("len = 3\nsource", "source"),
        "[[patch]]\nlabel = \"if\"\nbyte = 41",
        "patch \"if\" len",
        "required but missing",
    );
    refused(
        &edit("source = \"cas:if\"", "source = \"cas:fi\""),
        "source = \"cas:fi\"",
        "patch \"reply\" source",
        "the source is \"fi\", but no WQE has that label",
    );
    refused(
        &edit(
            "byte = 41\nlen = 3\nsource = \"trigger:key\"",
            "byte = 41\nlen = 3\nsource = \"trigger:key2\"",
        ),
        "trigger:key2",
        "patch \"if\" source",
        "no trigger parameter is called \"key2\"",
    );
    refused(
        &edit("source = \"cas:if\"", "source = \"dma:if\""),
        "source = \"dma:if\"",
        "patch \"reply\" source",
        "unknown patch source \"dma:if\"",
    );
    refused(
        &edit("label = \"reply\"\nbytes", "label = \"replay\"\nbytes"),
        "label = \"replay\"",
        "patch \"replay\" label",
        "no WQE is labelled \"replay\"",
    );
}

#[test]
fn sizes_and_other_values_are_checked() {
    refused(
        &edit("sq_bbs = 4", "sq_bbs = 2"),
        "sq_bbs = 2",
        "queue \"worker\" sq_bbs",
        "the queue's WQEs take 3 BBs, more than its ring of 2",
    );
    refused(
        &edit("sq_bbs = 4", "sq_bbs = 3"),
        "sq_bbs = 3",
        "queue \"worker\" sq_bbs",
        "not a power of two",
    );
    refused(
        &edit("sq_bbs = 4", "sq_bbs = 33554432"),
        "sq_bbs = 33554432",
        "queue \"worker\" sq_bbs",
        "from 1 to 16777216",
    );
    refused(
        &edit("rq_sges = 2", "rq_sges = 1"),
        "sgl = [{ addr = \"wqe:if@41\"",
        "queue \"client\" recv[0].sgl",
        "2 entries, but a slot holds rq_sges = 1",
    );
    refused(
        &edit("[[queue.recv]]", "[[queue.recv]]\nsgl = []\n[[queue.recv]]"),
        "rq_slots = 1",
        "queue \"client\" rq_slots",
        "2 receives do not fit 1 slots",
    );
    refused(
        &edit(
            "access = \"remote-read|local-write\"",
            "access = \"remote-read|write\"",
        ),
        "access = ",
        "region \"data\" access",
        "unknown right \"write\"",
    );
    refused(
        &edit("access = \"remote-read|local-write\"\n", ""),
        "[[region]]\nname = \"data\"",
        "region \"data\" access",
        "needs the rights",
    );
    refused(
        &edit(
            "role = \"response\"",
            "role = \"response\"\naccess = \"remote-write\"",
        ),
        "access = \"remote-write\"",
        "region \"response\" access",
        "takes no access key",
    );
    refused(
        &edit("bytes = \"01 02\"", "bytes = \"012\""),
        "bytes = \"012\"",
        "static \"blk\" bytes",
        "odd number of hex digits",
    );
    refused(
        &edit("bytes = \"01 02\"", "bytes = \"0g\""),
        "bytes = \"0g\"",
        "static \"blk\" bytes",
        "expected hex digits",
    );
    refused(
        &edit("len = 16\n", "len = 1\n"),
        "bytes = \"01 02\"",
        "static \"blk\" bytes",
        "2 bytes given for a block of len = 1",
    );
    refused(
        &edit("len = 16\n", "len = 16777217\n"),
        "len = 16777217",
        "static \"blk\" len",
        "more than 16777216 bytes",
    );
    refused(
        &edit("len = 16\nbytes = \"01 02\"\n", ""),
        "[[static]]\nname = \"blk\"",
        "static \"blk\" len",
        "needs len, bytes, or both",
    );
    refused(
        &edit(
            "iterations = { kind = \"bounded\", invocations = 1, wqes_per_invocation = 5 }",
            "iterations = { kind = \"recycled\", invocations = 1 }",
        ),
        "iterations",
        "iterations.invocations",
        "does not apply to recycled iterations",
    );
    refused(
        &edit(
            "iterations = { kind = \"bounded\", invocations = 1, wqes_per_invocation = 5 }",
            "iterations = { kind = \"bounded\", invocations = 1 }",
        ),
        "iterations",
        "iterations.wqes_per_invocation",
        "bounded iterations need this key",
    );
    refused(
        &edit(
            "name = \"key\"\nlen = 6",
            "name = \"key\"\nlen = 6\noffset = 4294967295",
        ),
        "len = 6\noffset",
        "param \"key\" len",
        "past 2^32",
    );
    refused(
        &edit("summary = ", "trigger_len = 5\nsummary = "),
        "trigger_len = 5",
        "trigger_len",
        "5 bytes, but the parameters reach byte 6",
    );
}

#[test]
fn oversize_text_is_refused_before_parsing() {
    let text = format!(
        "{TINY}{}",
        "#".repeat(usize::try_from(MAX_FILE_BYTES).unwrap())
    );
    let e = parse_definition(&text, "t.toml").unwrap_err().to_string();
    assert!(
        e.starts_with("t.toml: larger than the 1048576-byte limit"),
        "{e}"
    );
}

// ---- the directory loader -----------------------------------------------------------------

struct TempDir(PathBuf);

impl TempDir {
    fn new(tag: &str) -> TempDir {
        let dir =
            std::env::temp_dir().join(format!("redn-definitions-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        TempDir(dir)
    }
    fn write(&self, name: &str, text: &str) {
        std::fs::write(self.0.join(name), text).unwrap();
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

#[test]
fn the_directory_loader_sorts_skips_and_checks_names() {
    let d = TempDir::new("dir");
    let echo = catalog::echo(8, 1).unwrap();
    d.write("tiny.toml", TINY);
    d.write("echo.toml", &write_definition(&echo));
    d.write("README", "not a definition");
    d.write(".tiny.toml.swp", "editor junk");
    d.write("echo.toml~", "backup");
    let programs = load_offloads_dir(&d.0).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(programs, vec![echo.clone(), tiny()]);

    d.write("zz.toml", TINY);
    let e = load_offloads_dir(&d.0).unwrap_err().to_string();
    let want = format!("{}:2:1: name: the offload is called \"tiny\" but its file is zz.toml; name the file tiny.toml", d.0.join("zz.toml").display());
    assert_eq!(e, want);
    std::fs::remove_file(d.0.join("zz.toml")).unwrap();

    d.write(
        "broken.toml",
        &TINY
            .replace("name = \"tiny\"", "name = \"broken\"")
            .replace("count = 0", "count = x"),
    );
    let e = load_offloads_dir(&d.0).unwrap_err().to_string();
    assert!(
        e.starts_with(&format!(
            "{}:{}:",
            d.0.join("broken.toml").display(),
            line_of(TINY, "count = 0")
        )),
        "{e}"
    );

    let e = load_offloads_dir(d.0.join("missing"))
        .unwrap_err()
        .to_string();
    assert!(e.ends_with("missing: cannot read the file"), "{e}");
}

// ---- hostile but well-formed files: the verifier refuses, never panics ---------------------

#[test]
fn the_verifier_survives_extreme_values_from_files() {
    let text = edit("{ addr = \"wqe:if@45\", len = 3 }", "{ addr = \"wqe:if@45\", len = 4294967295 }")
        .replace("sgl = [{ addr = \"static:blk\", len = 8 }]", "sgl = [{ addr = \"static:blk+18446744073709551615\", len = 4294967295 }, { addr = \"region:data+18446744073709551615\", len = 4294967295 }]")
        .replace("remote = \"wqe:reply@0\"", "remote = \"wqe:reply@63\"")
        .replace("name = \"key\"\nlen = 6", "name = \"key\"\noffset = 4294967290\nlen = 5");
    let p = parse_definition(&text, "t.toml").unwrap_or_else(|e| panic!("{e}"));
    let g = Grants::new()
        .with_region("data", Access::ALL, u64::MAX)
        .with_region("response", Access::REMOTE_WRITE, u64::MAX);
    let r = verify(&p, &g);
    assert!(!r.accepted());
    assert!(r.log().contains("\nchecked "), "{}", r.log());
}

#[test]
fn mutated_files_never_panic_and_what_loads_round_trips() {
    let server_loop = write_definition(&catalog::server_loop().unwrap());
    // xorshift64*, fixed seed: the same mutations every run.
    let mut state = 0x2545_f491_4f6c_dd1d_u64;
    let mut next = move || {
        state ^= state >> 12;
        state ^= state << 25;
        state ^= state >> 27;
        state.wrapping_mul(0x2545_f491_4f6c_dd1d)
    };
    let alphabet = b"[]{}=\"'#.,:+@-_0123456789xabf \n\ttrue";
    let grants = Grants::new().with_region("data", Access::ALL, 64);
    let mut loaded = 0;
    for round in 0..600 {
        let base = if round % 2 == 0 {
            TINY
        } else {
            server_loop.as_str()
        };
        let mut bytes = base.as_bytes().to_vec();
        for _ in 0..1 + next() % 3 {
            let at = usize::try_from(next() % bytes.len() as u64).unwrap();
            let c = alphabet[usize::try_from(next() % alphabet.len() as u64).unwrap()];
            match next() % 3 {
                0 => bytes[at] = c,
                1 => bytes.insert(at, c),
                _ => {
                    bytes.remove(at);
                }
            }
        }
        let Ok(text) = String::from_utf8(bytes) else {
            continue;
        };
        match parse_definition(&text, "m.toml") {
            Err(e) => assert!(e.to_string().starts_with("m.toml"), "{e}"),
            Ok(p) => {
                loaded += 1;
                round_trip(&p);
                let _ = verify(&p, &grants).log();
            }
        }
    }
    assert!(loaded > 15, "only {loaded} mutants loaded");
    for (i, _) in TINY.char_indices().step_by(3) {
        let _ = parse_definition(&TINY[..i], "cut.toml");
    }
}

#[test]
fn raw_opcodes_load_and_the_verifier_refuses_them() {
    let g = Grants::new()
        .with_region("data", Access::ALL, 64)
        .with_region("response", Access::REMOTE_WRITE, 4096);
    // UMR (not on the allow-list) and SEND (on it, but a raw opcode has no operands).
    for opcode in ["0x25", "0x0a"] {
        let text = edit(
            "label = \"answer\"\nop = \"send-en\"\nqueue = \"client\"\ncount = 1",
            &format!("label = \"answer\"\nopcode = {opcode}"),
        );
        let p = parse_definition(&text, "t.toml").unwrap_or_else(|e| panic!("{e}"));
        let r = verify(&p, &g);
        assert!(r.broke(redn_policy::Rule::Opcode), "{}", r.log());
        assert!(
            r.log().contains("wqe 2 (answer): opcode: opcode: "),
            "{}",
            r.log()
        );
    }
}

/// The opcodes a program may contain, written out from the hardware's opcode table (NOP,
/// WRITE, WRITE_IMM, SEND, SEND_IMM, CQE_WAIT, READ, CAS, FAA, masked CAS, RECV_EN, SEND_EN)
/// rather than read from `redn_policy::verifier::ALLOWED_OPCODES`, so that a change to that
/// list shows here.
const ALLOWED_BYTES: [u8; 12] = [
    0x00, 0x08, 0x09, 0x0a, 0x0b, 0x0f, 0x10, 0x11, 0x12, 0x14, 0x16, 0x17,
];

#[test]
fn every_raw_opcode_is_judged_by_the_allow_list() {
    let g = Grants::new()
        .with_region("data", Access::ALL, 64)
        .with_region("response", Access::REMOTE_WRITE, 4096);
    let reply = "op = \"write\"\nform = \"nop\"\nremote = \"region:response+0\"\nsgl = [{ addr = \
                 \"static:blk\", len = 8 }]\nimm = 7";
    let mut loaded = Vec::new();
    for byte in 0..=u8::MAX {
        // The response WQE, the one RedN's `if` CAS turns active, written as a raw opcode:
        // both the WQE itself and the CAS's swap (which installs it) are judged.
        let text = edit(reply, &format!("opcode = {byte:#04x}\nform = \"nop\""));
        let p = match parse_definition(&text, "t.toml") {
            Ok(p) => p,
            Err(e) => {
                // Only opcodes the format writes with their operands are refused raw.
                assert!(
                    e.to_string()
                        .contains("write it as op = \"...\" with its operands"),
                    "{byte:#04x}: {e}"
                );
                continue;
            }
        };
        loaded.push(byte);
        let findings: Vec<String> = verify(&p, &g)
            .findings
            .iter()
            .map(ToString::to_string)
            .collect();
        let expected = if ALLOWED_BYTES.contains(&byte) {
            // Allowed, but a raw opcode has no operands to check.
            vec![format!(
                "queue client: wqe 0 (reply): opcode: opcode: raw opcode {byte:#04x} carries \
                 no operands the verifier can check"
            )]
        } else {
            vec![
                format!(
                    "queue client: wqe 0 (reply): opcode: opcode: opcode {byte:#04x} is not on \
                     the allow-list"
                ),
                format!(
                    "queue worker: wqe 1 (if): swap: unsafe-swap: swap installs opcode \
                     {byte:#04x}, which is not allowed"
                ),
            ]
        };
        assert_eq!(findings, expected, "opcode {byte:#04x}");
    }
    // SEND, SEND_IMM (allowed, with no `op` of their own) and MASKED_FAA (not allowed) load
    // raw, as does every byte that is no opcode; the other known opcodes do not.
    let known_refused = [0x00, 0x08, 0x09, 0x0f, 0x10, 0x11, 0x12, 0x14, 0x16, 0x17];
    assert_eq!(loaded.len(), 256 - known_refused.len());
    for b in [0x0a, 0x0b, 0x15] {
        assert!(loaded.contains(&b), "{b:#04x}");
    }
}
