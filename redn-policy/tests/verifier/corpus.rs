//! The hostile corpus: each program breaks one rule and is refused for it.

use super::*;

/// Each entry: a name, a hostile program (and the grants it is checked with), the rule.
fn corpus() -> Vec<(&'static str, Program, Grants, Rule)> {
    let g = grants;
    let mut v = Vec::new();

    // 1. A READ scatter into another WQE's key field (declared, so it is the field that fails).
    let mut p = base();
    if let Op::Read { sgl, .. } = &mut wqe_mut(&mut p, "0.b0.read").op {
        sgl.push(Sge::new(Addr::wqe("0.b0.if", 24), 4));
    }
    patch(&mut p, "0.b0.if", 24, 4, read_source());
    v.push(("write into a key field", p, g(), Rule::ProtectedField));

    // 2. A WRITE into memory of another client (a region this client is not granted).
    let mut p = base();
    p.regions.push(RegionDecl {
        name: "client_b_code".into(),
        role: RegionRole::Data {
            access: Access::REMOTE_WRITE,
        },
        min_len: 64,
        doc: String::new(),
    });
    push(
        &mut p,
        "worker0",
        "evil",
        Op::Write {
            remote: Addr::region("client_b_code", 0),
            sgl: vec![Sge::new(Addr::region("values", 0), 8)],
            imm: None,
        },
    );
    v.push((
        "write into another client's code region",
        p,
        g(),
        Rule::KeyNotGranted,
    ));

    // 3. The trigger scattered into an opcode byte.
    let mut p = base();
    p.queues[0].recvs[0]
        .sgl
        .push(Sge::new(Addr::wqe("0.b0.read", 3), 1));
    p.params.push(redn_program::program::Param {
        name: "evil".into(),
        offset: p.trigger_len,
        len: 1,
        doc: String::new(),
    });
    p.trigger_len += 1;
    patch(
        &mut p,
        "0.b0.read",
        3,
        1,
        PatchSource::Trigger {
            param: "evil".into(),
        },
    );
    v.push(("scatter into an opcode", p, g(), Rule::ProtectedField));

    // 4. WAIT on a CQ the offload does not own.
    let mut p = base();
    if let Op::Wait { queue, .. } = &mut wqe_mut(&mut p, "0.join").op {
        *queue = "other-tenant".into();
    }
    v.push(("WAIT on a foreign CQ", p, g(), Rule::UnknownName));

    // 5. SEND_EN of a queue the offload does not own.
    let mut p = base();
    if let Op::SendEn { queue, .. } = &mut wqe_mut(&mut p, "0.answer").op {
        *queue = "other-tenant".into();
    }
    v.push(("ENABLE of a foreign queue", p, g(), Rule::UnknownName));

    // 6. A recycled loop, but the policy gives no loop budget.
    v.push((
        "unbounded loop without budget",
        catalog::server_loop().unwrap(),
        g(),
        Rule::UnboundedLoop,
    ));

    // 7. A forbidden opcode (UMR).
    let mut p = base();
    push(&mut p, "worker0", "umr", Op::Other { opcode: 0x25 });
    v.push(("forbidden opcode (UMR)", p, g(), Rule::Opcode));

    // 8. A static address outside the region.
    let mut p = base();
    if let Op::Read { remote, .. } = &mut wqe_mut(&mut p, "0.b0.read").op {
        *remote = Addr::region("table", (1 << 20) - 4);
    }
    v.push(("out-of-region static address", p, g(), Rule::OutOfRegion));

    // 9. A ring over the limit.
    let mut p = base();
    p.queues[1].sq_bbs = 1 << 20;
    v.push(("ring over the limit", p, g(), Rule::Size));

    // 10. A wrong ds: the `else` image claims more segments than the WQE holds.
    let mut p = base();
    if let Op::MaskedCas {
        swap: Operand::Ctrl { ds, .. },
        ..
    } = &mut wqe_mut(&mut p, "0.b0.else").op
    {
        *ds = Some(9);
    }
    v.push(("wrong ds count", p, g(), Rule::BadDs));

    // 11. A READ scatter into a WQE with no patch point declared.
    let mut p = base();
    if let Op::Read { sgl, .. } = &mut wqe_mut(&mut p, "0.b0.read").op {
        sgl.push(Sge::new(Addr::wqe("0.answer", 24), 4));
    }
    v.push(("undeclared patch", p, g(), Rule::UndeclaredPatch));

    // 12. A CAS on a control word with a literal swap (could install anything).
    let mut p = base();
    if let Op::Cas { swap, .. } = &mut wqe_mut(&mut p, "0.b0.if").op {
        *swap = Operand::Lit(0x0300_0000_2500_0000);
    }
    v.push(("literal swap on a control word", p, g(), Rule::UnsafeSwap));

    // 13. The trigger may rewrite the CAS's swap value.
    let mut p = base();
    patch(
        &mut p,
        "0.b0.if",
        32,
        8,
        PatchSource::Trigger {
            param: "key0".into(),
        },
    );
    v.push(("trigger rewrites a CAS swap", p, g(), Rule::UnsafeSwap));

    // 14. A swap that installs a forbidden opcode.
    let mut p = base();
    wqe_mut(&mut p, "0.r0").op = Op::Other { opcode: 0x1f };
    v.push(("swap installs a forbidden opcode", p, g(), Rule::UnsafeSwap));

    // 15. A swap whose QPN bytes come from an operand (could name another tenant's QP).
    let mut p = base();
    if let Op::Cas {
        swap: Operand::Ctrl { slots, .. },
        ..
    } = &mut wqe_mut(&mut p, "0.b0.if").op
    {
        *slots = Slots::Operand(0x00ab_cdef);
    }
    v.push(("swap with a foreign QPN", p, g(), Rule::UnsafeSwap));

    // 16. The table granted without the right a READ needs.
    v.push((
        "missing remote-read right",
        base(),
        g().with_region("table", Access::REMOTE_WRITE, 1 << 20),
        Rule::MissingRight,
    ));

    // 17. A worker (loopback) queue writing the client's response buffer.
    let mut p = base();
    push(
        &mut p,
        "worker0",
        "sneak",
        Op::Write {
            remote: Addr::region("response", 0),
            sgl: vec![Sge::new(Addr::region("values", 0), 8)],
            imm: None,
        },
    );
    v.push(("worker writes the client's buffer", p, g(), Rule::WrongSide));

    // 18. A READ through the client's connection (reads the client's memory).
    let mut p = base();
    push(
        &mut p,
        "client",
        "peek",
        Op::Read {
            remote: Addr::region("response", 0),
            sgl: vec![Sge::new(Addr::static_("nope", 0), 8)],
        },
    );
    v.push(("READ of the client's memory", p, g(), Rule::WrongSide));

    // 19. A misaligned atomic target.
    let mut p = base();
    push(
        &mut p,
        "worker0",
        "faa",
        Op::Faa {
            remote: Addr::region("table", 4),
            add: 1,
            result: None,
        },
    );
    v.push((
        "misaligned atomic",
        p,
        g().with_region(
            "table",
            Access::REMOTE_READ | Access::REMOTE_ATOMIC,
            1 << 20,
        ),
        Rule::Misaligned,
    ));

    // 20. SEND_EN of a queue that is not managed.
    let mut p = base();
    p.queues[0].managed_send = false;
    v.push((
        "enable of an unmanaged queue",
        p,
        g(),
        Rule::EnableUnmanaged,
    ));

    // 21. A WQE nothing ever enables.
    let mut p = base();
    push(&mut p, "worker0", "orphan", Op::Nop);
    v.push(("unreachable WQE", p, g(), Rule::Unreachable));

    // 22. More WQEs per invocation than the policy allows.
    let mut g22 = g();
    g22.max_wqes_per_invocation = 4;
    v.push((
        "over the per-invocation budget",
        base(),
        g22,
        Rule::WqeBudget,
    ));

    // 23. Too many queues.
    let mut g23 = g();
    g23.max_queues = 1;
    v.push(("too many queues", base(), g23, Rule::Size));

    // 24. A FETCH_ADD aimed straight at a WQE.
    let mut p = base();
    push(
        &mut p,
        "worker0",
        "bump",
        Op::Faa {
            remote: Addr::wqe("0.answer", 24),
            add: 1,
            result: None,
        },
    );
    v.push(("FETCH_ADD on a WQE", p, g(), Rule::ProtectedField));

    // 25. An atomic result landing on a SEND_EN's object number.
    let mut p = base();
    p.statics.push(redn_program::program::StaticBlock {
        name: "ctr".into(),
        bytes: vec![0; 8],
    });
    push(
        &mut p,
        "worker0",
        "retarget",
        Op::Faa {
            remote: Addr::static_("ctr", 0),
            add: 1,
            result: Some(Sge::new(Addr::wqe("0.answer", 24), 8)),
        },
    );
    patch(
        &mut p,
        "0.answer",
        24,
        8,
        PatchSource::AtomicResult {
            label: "retarget".into(),
        },
    );
    v.push((
        "atomic result onto a QP number",
        p,
        g(),
        Rule::ProtectedField,
    ));

    // 26. A receive scattering into the client's own buffer as if it were local memory.
    let mut p = base();
    p.queues[0].recvs.push(Recv {
        sgl: vec![Sge::new(Addr::region("response", 0), 8)],
    });
    v.push(("receive into the client's buffer", p, g(), Rule::WrongSide));

    // 27. The loop's "reset to NOP" template is itself written by the trigger, so the reset
    // could install any opcode.
    let mut p = catalog::server_loop().unwrap();
    p.queues[0].recvs[0]
        .sgl
        .push(Sge::new(Addr::static_("resp.nop", 0), 8));
    let mut g27 = g();
    g27.loop_budget = Some(1_000_000);
    v.push((
        "reset template writable by the trigger",
        p,
        g27,
        Rule::ProtectedField,
    ));

    // 28. Masks that splice: the `else` masked CAS swaps in only bit 3 of the opcode byte,
    // so a NOP becomes an RDMA WRITE (0x08), which is neither the WQE's WRITE_IMM nor a NOP:
    // every operand is still the target's own image, only the computed result is wrong.
    let mut p = base();
    if let Op::MaskedCas { swap_mask, .. } = &mut wqe_mut(&mut p, "0.b0.else").op {
        *swap_mask = 0x0000_0000_0800_0000;
    }
    v.push((
        "a masked CAS splicing opcode bits",
        p,
        g(),
        Rule::UnsafeSwap,
    ));

    // 29. The same on a SEND_EN: a masked CAS whose swap is the SEND_EN's own active image
    // but whose swap mask covers only some opcode bits and whose compare mask is empty (it
    // always fires), turning SEND_EN (0x17) into 0x13 or the like.
    let mut p = base();
    push(
        &mut p,
        "worker0",
        "splice",
        Op::MaskedCas {
            remote: Addr::wqe("0.answer", 0),
            compare: Operand::Lit(0),
            compare_mask: 0,
            swap: Operand::ctrl("0.answer", Form::Active, Slots::Real),
            swap_mask: 0x0000_0000_0400_0000,
        },
    );
    if let Some(Op::MaskedCas { swap, .. }) = p
        .queues
        .iter_mut()
        .flat_map(|q| q.wqes.iter_mut())
        .find(|w| w.label == "splice")
        .map(|w| &mut w.op)
    {
        // The SEND_EN itself, with its opcode bits cleared: what the mask splices into.
        *swap = Operand::Ctrl {
            label: "0.answer".into(),
            form: Form::Nop,
            slots: Slots::Real,
            ds: None,
        };
    }
    patch(
        &mut p,
        "0.answer",
        0,
        8,
        PatchSource::Cas {
            label: "splice".into(),
        },
    );
    v.push((
        "a masked CAS turning a SEND_EN into another opcode",
        p,
        g(),
        Rule::UnsafeSwap,
    ));

    // 30. A resource bomb: receive slots and scatter entries each within what the policy
    // names, their product 32 GiB of receive ring, refused before anything is allocated.
    let mut p = base();
    p.queues[0].rq_slots = 1 << 16;
    p.queues[0].rq_sges = 1 << 15;
    v.push(("32 GiB of receive ring", p, g(), Rule::Size));

    // 31. Budget inflation: a static SEND_EN of its own queue far past its ring (the queue
    // would run its ring again and again for one trigger).
    let mut p = base();
    if let Op::SendEn { count, .. } = &mut wqe_mut(&mut p, "0.w0.go").op {
        *count = 1 << 30;
    }
    v.push(("an enable far past the ring", p, g(), Rule::UnboundedLoop));

    // 32. Work with no trigger at all: an unmanaged queue doorbelled at install runs 100
    // NOPs before any client sends anything.
    let mut p = base();
    let mut q = p.queues[1].clone();
    q.name = "busy".into();
    q.managed_send = false;
    q.sq_bbs = 128;
    q.recvs.clear();
    q.wqes = (0..100)
        .map(|i| Wqe {
            label: format!("busy{i}"),
            op: Op::Nop,
            flags: WqeFlags::NONE,
            form: Form::Active,
        })
        .collect();
    p.queues.push(q);
    p.entry.push(("busy".into(), 100));
    v.push(("100 WQEs at install", p, g(), Rule::WqeBudget));

    // 33. The average hides the worst: two invocations declared, 16 WQEs in all (8 each on
    // average, under the declared 9), but the first trigger runs all 16.
    let mut p = base();
    p.iterations = Iterations::bounded(2, 9);
    p.queues[1].sq_bbs = 32;
    for i in 0..8 {
        push(&mut p, "worker0", &format!("extra{i}"), Op::Nop);
    }
    if let Op::SendEn { count, .. } = &mut wqe_mut(&mut p, "0.w0.go").op {
        *count = 17;
    }
    v.push((
        "the first trigger runs twice the average",
        p,
        g(),
        Rule::WqeBudget,
    ));

    // 34. One trigger, twenty responses.
    let mut p = base();
    p.queues[0].sq_bbs = 32;
    for i in 0..20 {
        push(
            &mut p,
            "client",
            &format!("spam{i}"),
            Op::Write {
                remote: Addr::region("response", 0),
                sgl: vec![Sge::new(Addr::region("values", 0), 1)],
                imm: Some(i),
            },
        );
    }
    if let Op::SendEn { count, .. } = &mut wqe_mut(&mut p, "0.answer").op {
        *count = 21;
    }
    p.iterations = Iterations::bounded(1, 64);
    v.push(("twenty responses to one trigger", p, g(), Rule::WqeBudget));

    // 35. A count the trigger writes: the client chooses how far the answer queue runs.
    let mut p = base();
    p.params.push(redn_program::program::Param {
        name: "how_far".into(),
        offset: p.trigger_len,
        len: 4,
        doc: String::new(),
    });
    p.trigger_len += 4;
    p.queues[0].recvs[0]
        .sgl
        .push(Sge::new(Addr::wqe("0.answer", 24), 4));
    patch(
        &mut p,
        "0.answer",
        24,
        4,
        PatchSource::Trigger {
            param: "how_far".into(),
        },
    );
    v.push((
        "an enable count from the trigger",
        p,
        g(),
        Rule::UnboundedLoop,
    ));

    // 36. RedN's `if` without its fence: the CAS compares bytes the READ before it brings,
    // and on a ConnectX it may run before they land (the softnic would not show it).
    let mut p = base();
    wqe_mut(&mut p, "0.b0.if").flags = WqeFlags::NONE;
    v.push((
        "a CAS comparing a READ's bytes unfenced",
        p,
        g(),
        Rule::MissingFence,
    ));

    // 37-40. A trigger parameter declared over a field the NIC must keep: a READ's rkey,
    // a WAIT's CQ number, a SEND_EN's QP number (enabling another client's queue), and the
    // response's flags byte (its fence and completion bits).
    for (i, (label, byte, len, what)) in [
        ("0.b0.read", 24, 4, "a READ's rkey from the trigger"),
        ("0.w0.trigger", 28, 4, "a WAIT's CQ number from the trigger"),
        ("0.answer", 28, 4, "a SEND_EN's QP number from the trigger"),
        ("0.r0", 11, 1, "the response's flags from the trigger"),
    ]
    .into_iter()
    .enumerate()
    {
        let mut p = base();
        let name = format!("evil{i}");
        p.params.push(redn_program::program::Param {
            name: name.clone(),
            offset: p.trigger_len,
            len,
            doc: String::new(),
        });
        p.trigger_len += len;
        p.queues[0].recvs[0]
            .sgl
            .push(Sge::new(Addr::wqe(label, byte as usize), len));
        patch(
            &mut p,
            label,
            byte,
            len,
            PatchSource::Trigger { param: name },
        );
        v.push((what, p, g(), Rule::ProtectedField));
    }

    // 41. A CAS that installs another WQE's image: the response would run as a READ.
    let mut p = base();
    if let Op::Cas { swap, .. } = &mut wqe_mut(&mut p, "0.b0.if").op {
        *swap = Operand::ctrl("0.b0.read", Form::Active, Slots::Real);
    }
    v.push(("a swap with another WQE's image", p, g(), Rule::UnsafeSwap));

    // 42. A ds override past the WQE's own segments: the NIC would read the next WQE's
    // block as this one's segments.
    let mut p = base();
    if let Op::Cas { swap, .. } = &mut wqe_mut(&mut p, "0.b0.if").op {
        *swap = Operand::Ctrl {
            label: "0.r0".into(),
            form: Form::Active,
            slots: Slots::Real,
            ds: Some(5),
        };
    }
    v.push(("a ds override spanning two blocks", p, g(), Rule::BadDs));

    // 43. LOCAL_INVAL (0x1b), off the allow-list like UMR: it would revoke a key.
    let mut p = base();
    push(&mut p, "worker0", "inval", Op::Other { opcode: 0x1b });
    v.push(("LOCAL_INVAL", p, g(), Rule::Opcode));

    // 44. The response gathers bytes of a WQE: the client would read the server's keys.
    let mut p = base();
    if let Op::Write { sgl, .. } = &mut wqe_mut(&mut p, "0.r0").op {
        sgl.push(Sge::new(Addr::wqe("0.b0.read", 16), 16));
    }
    v.push(("WQE bytes sent to the client", p, g(), Rule::WrongSide));

    // 45. A receive enable past the receive ring (the ring would be consumed again).
    let mut p = base();
    p.queues[0].managed_recv = true;
    p.recv_entry.push(("client".into(), 1 << 20));
    v.push((
        "a receive enable far past its ring",
        p,
        g(),
        Rule::UnboundedLoop,
    ));

    // 46. An unmanaged queue doorbelled past its ring at install.
    let mut p = base();
    let mut q = p.queues[1].clone();
    q.name = "spin".into();
    q.managed_send = false;
    q.recvs.clear();
    q.wqes = vec![Wqe {
        label: "spin0".into(),
        op: Op::Nop,
        flags: WqeFlags::NONE,
        form: Form::Active,
    }];
    p.queues.push(q);
    p.entry.push(("spin".into(), 1 << 24));
    v.push(("a doorbell far past its ring", p, g(), Rule::UnboundedLoop));

    // 47. The `else` masks patched by the trigger: any bit of the response's control word
    // could be swapped in.
    let mut p = base();
    p.params.push(redn_program::program::Param {
        name: "mask".into(),
        offset: p.trigger_len,
        len: 8,
        doc: String::new(),
    });
    p.trigger_len += 8;
    p.queues[0].recvs[0]
        .sgl
        .push(Sge::new(Addr::wqe("0.b0.else", 48), 8));
    patch(
        &mut p,
        "0.b0.else",
        48,
        8,
        PatchSource::Trigger {
            param: "mask".into(),
        },
    );
    v.push(("masks from the trigger", p, g(), Rule::UnsafeSwap));

    // 48. A WRITE of data (not a constant template) onto a control word.
    let mut p = base();
    push(
        &mut p,
        "worker0",
        "smash",
        Op::Write {
            remote: Addr::wqe("0.r0", 0),
            sgl: vec![Sge::new(Addr::region("values", 0), 8)],
            imm: None,
        },
    );
    patch(
        &mut p,
        "0.r0",
        0,
        8,
        PatchSource::Write {
            label: "smash".into(),
        },
    );
    v.push((
        "app data written onto a control word",
        p,
        g(),
        Rule::ProtectedField,
    ));

    // 49-. One class swept over a whole program: the bucket READ declared as landing on each
    // field of each WQE of hash-get that the NIC must keep (keys, object numbers, reserved
    // bytes, signature, flags, opcode, ds): every one refused for that field.
    let base_program = base();
    for q in &base_program.queues {
        for w in &q.wqes {
            let mut fields: Vec<(u32, u32)> = vec![(3, 1), (7, 1), (8, 1), (11, 1)];
            match &w.op {
                Op::Write { .. } | Op::Read { .. } | Op::Cas { .. } | Op::MaskedCas { .. } => {
                    fields.extend([(24, 4), (28, 4)]);
                }
                Op::Wait { .. } | Op::SendEn { .. } | Op::RecvEn { .. } => {
                    fields.extend([(16, 8), (28, 4)]);
                }
                _ => {}
            }
            for (byte, len) in fields {
                if w.label == "0.b0.read" {
                    // A READ landing in itself is another case (its own fetch races it).
                    continue;
                }
                let mut p = base();
                if let Op::Read { sgl, .. } = &mut wqe_mut(&mut p, "0.b0.read").op {
                    sgl.push(Sge::new(Addr::wqe(&w.label, byte as usize), len));
                }
                patch(&mut p, &w.label, byte, len, read_source());
                v.push((
                    "a READ landing on a field the NIC must keep",
                    p,
                    g(),
                    Rule::ProtectedField,
                ));
            }
        }
    }

    v
}

#[test]
fn hostile_corpus_is_refused_for_the_right_reason() {
    let corpus = corpus();
    assert!(corpus.len() >= 80, "{} programs", corpus.len());
    for (name, p, g, rule) in corpus {
        let r = verify(&p, &g);
        assert!(!r.accepted(), "{name}: accepted\n{}", r.log());
        assert!(r.broke(rule), "{name}: expected {rule}, got\n{}", r.log());
        // The log names the rule on a line of its own and ends with the stats line.
        assert!(
            r.log().lines().any(|l| l.contains(&format!(": {rule}: "))),
            "{name}: {}",
            r.log()
        );
        assert!(r.log().lines().last().unwrap().starts_with("checked "));
    }
}

#[test]
fn a_refused_control_word_says_how_it_is_reached() {
    let (_, p, g, _) = corpus()
        .into_iter()
        .find(|(name, ..)| *name == "a masked CAS splicing opcode bits")
        .unwrap();
    let log = verify(&p, &g).log();
    let line = log
        .lines()
        .find(|l| l.contains("control word"))
        .unwrap_or_else(|| panic!("{log}"));
    // The queue, the WQE, the reachable word with its opcode byte 0x08, the writer that
    // makes it and the fixpoint step, and why it is refused.
    assert!(
        line.starts_with("queue client: wqe 0 (0.r0): control word: unsafe-swap: "),
        "{line}"
    );
    assert!(line.contains(" 08 "), "{line}");
    assert!(
        line.contains("through CAS \"0.b0.else\" (step 1 of the fixpoint)"),
        "{line}"
    );
    assert!(
        line.contains("neither NOP nor the WQE's own (0x09)"),
        "{line}"
    );
}

#[test]
fn a_patch_point_ending_exactly_at_a_protected_field_is_accepted() {
    // The bucket READ also brings an address into the response's remote address (bytes
    // 16..24), which ends where its rkey begins: data, not a field the NIC must keep.
    let mut p = base();
    if let Op::Read { sgl, .. } = &mut wqe_mut(&mut p, "0.b0.read").op {
        sgl.push(Sge::new(Addr::wqe("0.r0", 16), 8));
    }
    patch(&mut p, "0.r0", 16, 8, read_source());
    let r = verify(&p, &grants());
    assert!(r.accepted(), "{}", r.log());
    // One byte further is the rkey.
    let mut p = base();
    if let Op::Read { sgl, .. } = &mut wqe_mut(&mut p, "0.b0.read").op {
        sgl.push(Sge::new(Addr::wqe("0.r0", 17), 8));
    }
    patch(&mut p, "0.r0", 17, 8, read_source());
    assert!(verify(&p, &grants()).broke(Rule::ProtectedField));
}

#[test]
fn a_program_exactly_at_the_code_limit_is_accepted_one_byte_over_refused() {
    let p = base();
    let need = p.code_bytes().unwrap();
    let mut g = grants();
    g.max_code_bytes = need;
    let r = verify(&p, &g);
    assert!(r.accepted(), "{}", r.log());
    g.max_code_bytes = need - 1;
    let r = verify(&p, &g);
    assert!(r.broke(Rule::Size), "{}", r.log());
    assert!(r
        .log()
        .contains(&format!("need {need} bytes, the limit is {}", need - 1)));
}

#[test]
fn findings_name_queue_wqe_field_and_rule() {
    let mut p = base();
    push(&mut p, "worker0", "umr", Op::Other { opcode: 0x25 });
    let r = verify(&p, &grants());
    let f = r.findings.iter().find(|f| f.rule == Rule::Opcode).unwrap();
    assert_eq!(f.queue.as_deref(), Some("worker0"));
    assert_eq!(f.wqe.as_ref().map(|w| w.1.as_str()), Some("umr"));
    assert_eq!(f.field, "opcode");
    assert_eq!(
        f.to_string(),
        "queue worker0: wqe 8 (umr): opcode: opcode: opcode 0x25 is not on the allow-list"
    );
}

#[test]
fn the_log_is_never_truncated() {
    // Many findings: every one appears.
    let mut p = base();
    for i in 0..500 {
        push(
            &mut p,
            "worker0",
            &format!("umr{i}"),
            Op::Other { opcode: 0x25 },
        );
    }
    let r = verify(&p, &grants());
    let log = r.log();
    assert_eq!(
        log.lines().filter(|l| l.contains(": opcode: ")).count(),
        500
    );
    let _ = Iterations::Recycled { wqes_per_round: 1 };
}
