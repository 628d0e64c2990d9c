//! Hand-written files and unusual programs: they load, round-trip and verify.

use super::*;

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
