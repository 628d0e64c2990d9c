//! Holes a red-team pass found in the verifier (docs/attacks.md, "Offload definitions"):
//! programs it admitted, run on the softnic. Each test asserts the safe behaviour (refusal,
//! or memory and protected WQE bytes outside the grants left alone), so a failing test
//! demonstrates a hole. What they pin: a NOP-reset WRITE whose gather address or byte count
//! a trigger patches cannot install another opcode; a patch point past its WQE cannot
//! retarget the next WQE's enable at another install's queue or make a bounded program lap
//! its ring; a recycled counter starting far ahead cannot run many rounds for one trigger;
//! a bucket length with the inline bit cannot make a response send its own WQE bytes.
//! The verifier-only side is `redn-policy/tests/verifier_holes.rs`.

mod common;
use common::{settle, wait_until, Rig};
use redn_policy::{verify, Grants};
use redn_program::program::{
    Addr, Builder, Form, Iterations, Op, PatchSource, Program, QueueRole, RegionRole, Sge,
};
use redn_program::wqe::{Payload, WqeFlags, WrOp};
use redn_sys::nic::Nic;
use redn_sys::softnic::Prefetch;
use redn_sys::Access;

const NONE: WqeFlags = WqeFlags::NONE;

/// A conditional response (WRITE_IMM of 64 bytes of `values` to the client, posted as a NOP)
/// that a worker `if` turns active and a `reset` WRITE puts back from a NOP template kept
/// in a static block nothing writes. The template block holds 16 bytes: the NOP image the
/// verifier reads at offset 0, then `extra`. The reset's gather address (bytes 40..48 of
/// the reset WQE, a data segment's address: not a protected field) is a trigger parameter.
fn reset_with_patched_gather(extra: [u8; 8]) -> Program {
    let mut b = Builder::new(
        "reset-gather",
        "red team: a reset whose gather the trigger moves",
    );
    b.region(
        "values",
        RegionRole::Data {
            access: Access::LOCAL_WRITE,
        },
        64,
        "server data",
    );
    b.region("response", RegionRole::Response, 64, "the client's buffer");
    b.param("sel", 8, "the reset's gather address, big-endian");
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
    b.push(
        w,
        "trig",
        Op::Wait {
            queue: "client".into(),
            count: 0,
        },
        NONE,
        Form::Active,
    );
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
    b.patch(
        "reset",
        40,
        8,
        PatchSource::Trigger {
            param: "sel".into(),
        },
    );
    b.recv(client, vec![Sge::new(Addr::wqe("reset", 40), 8)]);
    b.push(
        w,
        "answer",
        Op::SendEn {
            queue: "client".into(),
            count: 1,
        },
        WqeFlags::FENCE,
        Form::Active,
    );
    b.entry(w, 4);
    b.finish(Iterations::bounded(1, 5), "the values, or worse");
    b.build().unwrap()
}

fn reset_grants() -> Grants {
    Grants::new()
        .with_region("values", Access::LOCAL_WRITE, common::DATA_LEN as u64)
        .with_region("response", Access::REMOTE_WRITE, 128 << 10)
}

/// The control-word model treats the reset as "write the NOP image" because the copy's
/// declared source is 8 constant bytes; but the trigger moves the copy's gather address to
/// the other 8 bytes of the same (window-covered) static block. Here those bytes are an RDMA
/// READ image: the client-facing response becomes a READ of the client's memory into the
/// server's, which the verifier forbids outright (`wrong-side`).
#[test]
fn a_reset_whose_gather_address_the_trigger_moves_cannot_install_another_opcode() {
    // READ (0x10), ds 3: the response's own segments read as a READ's.
    let p = reset_with_patched_gather([0, 0, 0, 0x10, 0, 0, 0, 3]);
    let report = verify(&p, &reset_grants());
    if !report.accepted() {
        // Refused: the safe outcome.
        return;
    }
    let rig = Rig::new(p.clone(), Prefetch::AtExecute);
    // The client's buffer holds a secret the offload was never granted to read.
    let secret: Vec<u8> = (0..64u8).map(|i| i ^ 0xa5).collect();
    rig.cbuf.write(0, &secret);
    let layout = p.layout().unwrap();
    let tmpl_at = rig.installed.code_addr.0 + layout.statics[0] as u64;
    let resp_at = layout.sq[0];
    let msg = (tmpl_at + 8).to_be_bytes().to_vec();
    rig.client.post_recv(rig.cqp, 0, &[]).unwrap();
    rig.client
        .post_send(
            rig.cqp,
            &[common::wr(
                0,
                NONE,
                WrOp::Send {
                    payload: Payload::Inline(msg),
                    imm: None,
                },
            )],
        )
        .unwrap();
    let server = std::sync::Arc::clone(&rig.server);
    let qps: Vec<_> = rig.installed.qps.iter().map(|q| q.qpn).collect();
    wait_until("the worker ran", || {
        server.counters(qps[1]).unwrap().total_wqes() >= 4
    });
    settle(&rig.server, || {
        qps.iter()
            .map(|q| server.counters(*q).unwrap().total_wqes())
            .sum()
    });
    let mut ctrl = [0u8; 8];
    rig.installed.code.read(resp_at, &mut ctrl);
    let opcode = ctrl[3];
    let leaked = rig.data.read(0, 64) == secret;
    assert!(
        !leaked && (opcode == 0x00 || opcode == 0x09),
        "admitted program ran its response as opcode {opcode:#04x} (control word {ctrl:02x?}); \
         client secret copied into server memory: {leaked}\n{}",
        report.log()
    );
}

/// A worker NOP whose trigger patch point lies past the NOP's one BB: bytes 88..96 of
/// `pad` are bytes 24..32 of the SEND_EN `en` after it (its count and QP number). The
/// verifier checks a patch point only against `pad`'s own protected fields (none reach past
/// byte 64) and never range-checks a receive entry that lands in a WQE; the installer
/// registers a window over those bytes for the client-facing queue's receive.
fn patch_past_its_wqe() -> Program {
    patch_past_its_wqe_ring(false)
}

/// `full`: one more NOP after the SEND_EN, so the WQEs fill the 4-BB ring exactly.
fn patch_past_its_wqe_ring(full: bool) -> Program {
    let mut b = Builder::new(
        "past-the-wqe",
        "red team: a patch point past its WQE's blocks",
    );
    b.param("target", 8, "count and QP number, big-endian");
    let client = b.queue("client", QueueRole::Client, false, false, Some(0), 1, 1, 1);
    let w = b.queue("worker", QueueRole::Worker, true, false, Some(0), 4, 1, 1);
    b.push(
        w,
        "trig",
        Op::Wait {
            queue: "client".into(),
            count: 0,
        },
        NONE,
        Form::Active,
    );
    b.push(w, "pad", Op::Nop, NONE, Form::Active);
    b.push(
        w,
        "en",
        Op::SendEn {
            queue: "worker".into(),
            count: 3,
        },
        NONE,
        Form::Active,
    );
    b.patch(
        "pad",
        88,
        8,
        PatchSource::Trigger {
            param: "target".into(),
        },
    );
    b.recv(client, vec![Sge::new(Addr::wqe("pad", 88), 8)]);
    if full {
        b.push(w, "tail", Op::Nop, NONE, Form::Active);
        b.entry(w, 4);
        b.finish(Iterations::bounded(1, 4), "nothing");
    } else {
        b.entry(w, 3);
        b.finish(Iterations::bounded(1, 3), "nothing");
    }
    b.build().unwrap()
}

/// The attacker's trigger rewrites its SEND_EN's QP number to the client-facing queue of
/// another offload (catalog `echo`, installed on the same softnic for another client) and
/// its count to 4: that offload sends its four responses to its own client, which never
/// triggered it.
#[test]
fn a_patch_point_past_its_wqe_cannot_retarget_an_enable_at_another_offload() {
    use redn_program::program::catalog;
    use redn_sys::install::{install, RegionBinding};
    use redn_sys::nic::{CqConfig, QpConfig};
    let p = patch_past_its_wqe();
    let report = verify(&p, &Grants::new());
    if !report.accepted() {
        return;
    }
    let rig = Rig::new(p, Prefetch::AtExecute);
    // The victim: echo, for a client of its own on its own softnic.
    let vclient = common::nic(1, Prefetch::AtExecute);
    let vpd = vclient.alloc_pd().unwrap();
    let vbuf = common::Region::new(&vclient, vpd, 4096, Access::ALL);
    let vcq = vclient.create_cq(CqConfig::new(64)).unwrap();
    let mut vcfg = QpConfig::new(vpd, vcq);
    vcfg.rq_slots = 16;
    let vqp = vclient.create_qp(vcfg).unwrap().qpn;
    let echo = catalog::echo(16, 4).unwrap();
    let mut regions = std::collections::HashMap::new();
    regions.insert(
        "response".to_string(),
        RegionBinding::Remote {
            addr: vbuf.mr.addr,
            rkey: vbuf.mr.lkey.into(),
            len: 4096,
        },
    );
    let victim = install(&rig.server, &echo, &regions, &mut |q| {
        redn_sys::softnic::SoftNic::connect_pair(&vclient, vqp, &rig.server, q)
    })
    .unwrap();
    let vclient_q = victim.qp(&echo, "client").unwrap();
    // The victim's client is ready for answers but sends no trigger.
    for i in 0..4 {
        vclient.post_recv(vqp, i, &[]).unwrap();
    }
    let mut msg = 4u32.to_be_bytes().to_vec();
    msg.extend_from_slice(&vclient_q.0.to_be_bytes());
    rig.client.post_recv(rig.cqp, 0, &[]).unwrap();
    rig.client
        .post_send(
            rig.cqp,
            &[common::wr(
                0,
                NONE,
                WrOp::Send {
                    payload: Payload::Inline(msg),
                    imm: None,
                },
            )],
        )
        .unwrap();
    let server = std::sync::Arc::clone(&rig.server);
    let qps: Vec<_> = rig
        .installed
        .qps
        .iter()
        .chain(&victim.qps)
        .map(|q| q.qpn)
        .collect();
    settle(&rig.server, || {
        qps.iter()
            .map(|q| server.counters(*q).unwrap().total_wqes())
            .sum()
    });
    std::thread::sleep(std::time::Duration::from_millis(50));
    let mut got = Vec::new();
    vclient.poll_cq(vcq, 16, &mut got).unwrap();
    let victim_sent = server.counters(vclient_q).unwrap().total_wqes();
    assert!(
        got.is_empty() && victim_sent == 0,
        "another offload's client queue ran {victim_sent} WQEs and its client got {} answers \
         it never asked for: {got:?}\n{}",
        got.len(),
        report.log()
    );
    drop(victim);
}

/// The reset of the first test with its byte count patched instead of its address: bit 31
/// of a data segment's byte count marks inline data, so the "copy of the NOP template" is
/// the reset WQE's own bytes 36..44 (its lkey and the template address's high half).
#[test]
fn a_reset_whose_byte_count_the_trigger_patches_cannot_install_another_opcode() {
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
    let report = verify(&p, &reset_grants());
    if !report.accepted() {
        return;
    }
    let resp_at = p.layout().unwrap().sq[0];
    let rig = Rig::new(p, Prefetch::AtExecute);
    let msg = (0x8000_0000u32 | 8).to_be_bytes().to_vec();
    rig.client.post_recv(rig.cqp, 0, &[]).unwrap();
    rig.client
        .post_send(
            rig.cqp,
            &[common::wr(
                0,
                NONE,
                WrOp::Send {
                    payload: Payload::Inline(msg),
                    imm: None,
                },
            )],
        )
        .unwrap();
    let server = std::sync::Arc::clone(&rig.server);
    let qps: Vec<_> = rig.installed.qps.iter().map(|q| q.qpn).collect();
    wait_until("the worker ran", || {
        server.counters(qps[1]).unwrap().total_wqes() >= 3
    });
    settle(&rig.server, || {
        qps.iter()
            .map(|q| server.counters(*q).unwrap().total_wqes())
            .sum()
    });
    let mut ctrl = [0u8; 8];
    rig.installed.code.read(resp_at, &mut ctrl);
    assert!(
        (ctrl[3] == 0x00 || ctrl[3] == 0x09) && ctrl[7] == 3,
        "admitted program rewrote its response's control word to {ctrl:02x?} (opcode \
         {:#04x}, ds {})\n{}",
        ctrl[3],
        ctrl[7],
        report.log()
    );
}

/// Catalog hash-get: the READ of the bucket lands the bucket's length in the response's
/// byte count (a patch point, as designed). It landed all four bytes: a bucket whose length
/// had bit 31 set (0x8000000c) turned the response's gather entry into 12 bytes of inline
/// data, the response WQE's own lkey and value address, sent to the client, although the
/// verifier's rule is that WQE bytes never leave the server. The remote client picks the
/// bucket address anywhere in the table (not only at bucket boundaries), so any 18 bytes of
/// the table it can predict serve as a bucket. Now the length's top byte lands in a scratch
/// block and the verifier refuses any patch over a byte count's top byte: the client gets
/// the value's first 12 bytes.
#[test]
fn a_bucket_length_with_the_inline_bit_cannot_send_wqe_bytes_to_the_client() {
    use redn_program::program::catalog::{self, HashVariant};
    let p = catalog::hash_get(HashVariant::Single, 1).unwrap();
    let g = Grants::new()
        .with_region("table", Access::REMOTE_READ, common::DATA_LEN as u64)
        .with_region("values", Access::NONE, common::DATA_LEN as u64)
        .with_region("response", Access::REMOTE_WRITE, 128 << 10);
    assert!(verify(&p, &g).accepted(), "{}", verify(&p, &g).log());
    let mut rig = Rig::new(p.clone(), Prefetch::AtExecute);
    let key = 0x0102_0304_0506u64;
    let vaddr = rig.data.mr.addr.0 + (512 << 10);
    rig.data.write(512 << 10, &[0xee; 64]);
    rig.data
        .write(0, &catalog::bucket_bytes(key, 0x8000_000c, vaddr));
    let mut msg = catalog::trigger_key(key).to_vec();
    msg.extend_from_slice(&rig.data.mr.addr.0.to_be_bytes());
    let r = rig.trigger(&msg, 1);
    let resp = &r[0].1;
    // The response WQE's lkey (client side, `values`) as rendered.
    let leaked_wqe_bytes = resp.len() == 12 && resp[4..] == vaddr.to_be_bytes();
    assert!(
        !leaked_wqe_bytes,
        "the client got the response WQE's own bytes 36..48 (lkey {:02x?}, address {:02x?})",
        &resp[..4],
        &resp[4..]
    );
    assert_eq!(resp[..], [0xee; 12], "the value's first 12 bytes");
}

/// The server loop with its `c.go` counter starting 2^15 - 1 BBs past the worker's entry
/// index (the verifier bounds a recycled count's step, not where its counter starts): one
/// trigger's `go` enables the worker ~1000 laps of its ring at once. Safe behaviour: one GET
/// runs about one round of WQEs (`wqes_per_round`), as for the unmodified loop.
#[test]
fn a_recycled_counter_starting_far_ahead_cannot_run_many_rounds_for_one_trigger() {
    use redn_program::program::catalog;
    let mut p = catalog::server_loop().unwrap();
    let c = p.statics.iter_mut().find(|s| s.name == "c.go").unwrap();
    c.bytes = (2u64 + (1 << 15) - 1).to_le_bytes().to_vec();
    let mut g = Grants::new();
    g.loop_budget = Some(1_000_000);
    g.max_wqes_per_invocation = 256;
    for (name, access) in [
        ("table", Access::REMOTE_READ),
        ("values", Access::NONE),
        ("response", Access::REMOTE_WRITE),
    ] {
        g = g.with_region(name, access, common::DATA_LEN as u64);
    }
    let report = verify(&p, &g);
    if !report.accepted() {
        return;
    }
    let Iterations::Recycled { wqes_per_round } = p.iterations else {
        unreachable!()
    };
    let rig = Rig::new(p, Prefetch::AtExecute);
    let before = rig.server_wqes();
    let mut msg = catalog::trigger_key(0x77).to_vec();
    msg.extend_from_slice(&rig.data.mr.addr.0.to_be_bytes());
    rig.client.post_recv(rig.cqp, 0, &[]).unwrap();
    rig.client
        .post_send(
            rig.cqp,
            &[common::wr(
                0,
                NONE,
                WrOp::Send {
                    payload: Payload::Inline(msg),
                    imm: None,
                },
            )],
        )
        .unwrap();
    std::thread::sleep(std::time::Duration::from_millis(300));
    let ran = rig.server_wqes() - before;
    assert!(
        ran <= 2 * u64::from(wqes_per_round),
        "one trigger ran {ran} WQEs; a round is {wqes_per_round}\n{}",
        report.log()
    );
}

/// The same admitted bounded program (one trigger, 3 WQEs per invocation), its trigger now
/// rewriting its own SEND_EN to count 2^15 - 1 on its own 4-BB ring: the worker laps its
/// ring thousands of times for one trigger. A bounded program is not watched as a loop.
#[test]
fn a_patch_point_past_its_wqe_cannot_make_a_bounded_program_lap_its_ring() {
    let p = patch_past_its_wqe_ring(true);
    let report = verify(&p, &Grants::new());
    if !report.accepted() {
        return;
    }
    let Iterations::Bounded {
        wqes_per_invocation,
        ..
    } = p.iterations
    else {
        unreachable!()
    };
    let rig = Rig::new(p, Prefetch::AtExecute);
    let worker = rig.installed.qps[1].qpn;
    let mut msg = ((1u32 << 15) - 1).to_be_bytes().to_vec();
    msg.extend_from_slice(&worker.0.to_be_bytes());
    rig.client.post_recv(rig.cqp, 0, &[]).unwrap();
    rig.client
        .post_send(
            rig.cqp,
            &[common::wr(
                0,
                NONE,
                WrOp::Send {
                    payload: Payload::Inline(msg),
                    imm: None,
                },
            )],
        )
        .unwrap();
    let server = std::sync::Arc::clone(&rig.server);
    let qps: Vec<_> = rig.installed.qps.iter().map(|q| q.qpn).collect();
    settle(&rig.server, || {
        qps.iter()
            .map(|q| server.counters(*q).unwrap().total_wqes())
            .sum()
    });
    let ran = rig.server_wqes();
    assert!(
        ran <= u64::from(wqes_per_invocation) + 1,
        "one trigger of a bounded program declared at {wqes_per_invocation} WQEs ran {ran}"
    );
}
