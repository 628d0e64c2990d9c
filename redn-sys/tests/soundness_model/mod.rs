//! The soundness property, shared by the `soundness` test (a fixed seed, bounded) and the
//! `soundness` fuzz target (long runs): random variants of the catalog's programs and, for
//! each the verifier accepts, adversarial triggers on the softnic checked against what the
//! verifier reasoned about. `tests/soundness.rs` states the properties.
#![allow(dead_code)]

use crate::common::*;
use redn_policy::{verify, Grants};
use redn_program::program::catalog::{self, HashVariant};
use redn_program::program::{
    Addr, Iterations, Op, Operand, Param, PatchPoint, PatchSource, Program, QueueRole, Sge,
};
use redn_program::wqe::{bbs_for_ds, off, Opcode, WqeFlags, WrOp, BB_SIZE};
use redn_sys::nic::Nic;
use redn_sys::softnic::Prefetch;
use redn_sys::{Access, QpState};
use std::time::{Duration, Instant};

pub fn grants() -> Grants {
    let mut g = Grants::new()
        .with_region("table", Access::ALL, DATA_LEN as u64)
        .with_region("list", Access::ALL, DATA_LEN as u64)
        .with_region("values", Access::ALL, DATA_LEN as u64)
        .with_region("response", Access::REMOTE_WRITE, 128 << 10);
    g.max_wqes_per_invocation = 64;
    g
}

pub fn seeds() -> Vec<Program> {
    vec![
        catalog::echo(16, 2).unwrap(),
        catalog::hash_get(HashVariant::Single, 3).unwrap(),
        catalog::hash_get(HashVariant::Sequential, 2).unwrap(),
        catalog::hash_get(HashVariant::Parallel, 2).unwrap(),
        catalog::list_find(3, false, 2).unwrap(),
        catalog::list_find(3, true, 1).unwrap(),
    ]
}

fn labels(p: &Program) -> Vec<String> {
    p.queues
        .iter()
        .flat_map(|q| q.wqes.iter().map(|w| w.label.clone()))
        .collect()
}

fn wqe_mut<'a>(p: &'a mut Program, label: &str) -> &'a mut redn_program::program::Wqe {
    p.queues
        .iter_mut()
        .flat_map(|q| q.wqes.iter_mut())
        .find(|w| w.label == label)
        .unwrap()
}

/// One random change to `p`, the way a hostile definition might differ from the catalog.
pub fn mutate(p: &mut Program, rng: &mut Rng) {
    let all = labels(p);
    let pick = |rng: &mut Rng, v: &[String]| v[rng.index(v.len())].clone();
    let target = pick(rng, &all);
    let byte = rng.below32(64);
    let len = 1 + rng.below32(8);
    match rng.below(9) {
        // A trigger parameter scattered into any bytes of any WQE, declared.
        0 => {
            let name = format!("p{}", p.params.len());
            p.params.push(Param {
                name: name.clone(),
                offset: p.trigger_len,
                len,
                doc: String::new(),
            });
            p.trigger_len += len;
            if let Some(q) = p.queues.iter_mut().find(|q| q.role == QueueRole::Client) {
                for r in &mut q.recvs {
                    r.sgl.push(Sge::new(Addr::wqe(&target, byte as usize), len));
                }
                q.rq_sges = q.rq_sges.max(
                    q.recvs
                        .iter()
                        .map(|r| u32::try_from(r.sgl.len()).unwrap())
                        .max()
                        .unwrap_or(1)
                        .next_power_of_two(),
                );
            }
            p.patches.push(PatchPoint {
                label: target,
                byte,
                len,
                source: PatchSource::Trigger { param: name },
            });
        }
        // An existing READ also lands in other bytes of a WQE, declared.
        1 => {
            let reads: Vec<String> = p
                .queues
                .iter()
                .flat_map(|q| &q.wqes)
                .filter(|w| matches!(w.op, Op::Read { .. }))
                .map(|w| w.label.clone())
                .collect();
            if reads.is_empty() {
                return;
            }
            let read = pick(rng, &reads);
            if let Op::Read { sgl, .. } = &mut wqe_mut(p, &read).op {
                sgl.push(Sge::new(Addr::wqe(&target, byte as usize), len));
            }
            p.patches.push(PatchPoint {
                label: target,
                byte,
                len,
                source: PatchSource::Read { label: read },
            });
        }
        // A CAS's masks or operands changed (the commonest change: where splicing hides).
        2..=5 => {
            // Masked CASes first: their masks are where splicing hides.
            let masked = rng.below(4) != 0;
            let cases: Vec<String> = p
                .queues
                .iter()
                .flat_map(|q| &q.wqes)
                .filter(|w| match w.op {
                    Op::MaskedCas { .. } => true,
                    Op::Cas { .. } => !masked,
                    _ => false,
                })
                .map(|w| w.label.clone())
                .collect();
            if cases.is_empty() {
                return;
            }
            let c = pick(rng, &cases);
            // Half the time a bit of the opcode or ds byte (as a CAS reads the word), where
            // splicing matters.
            let bits = match rng.below(3) {
                0 => 1u64 << (24 + rng.below(8)),
                1 => 1u64 << (56 + rng.below(8)),
                _ => 1u64 << rng.below(64),
            };
            match &mut wqe_mut(p, &c).op {
                Op::MaskedCas {
                    swap_mask,
                    compare_mask,
                    ..
                } => match rng.below(3) {
                    // A random mask over the opcode byte: which of its bits are swapped in.
                    0 => *swap_mask = (*swap_mask & !0xff00_0000) | (rng.below(256) << 24),
                    1 => *swap_mask ^= bits,
                    _ => *compare_mask ^= bits,
                },
                Op::Cas {
                    swap: Operand::Ctrl { ds, .. },
                    ..
                } => *ds = Some(1 + rng.byte() % 6),
                _ => {}
            }
        }
        // A count changed.
        6 => match &mut wqe_mut(p, &target).op {
            Op::SendEn { count, .. } | Op::RecvEn { count, .. } | Op::Wait { count, .. } => {
                *count = rng.below32(40);
            }
            _ => {}
        },
        // A fence dropped.
        7 => {
            let w = wqe_mut(p, &target);
            w.flags = WqeFlags::SIGNALED.with(WqeFlags::NONE);
            if rng.below(2) == 0 {
                w.flags = WqeFlags::NONE;
            }
        }
        // A WRITE within the code, declared: copy some bytes of one WQE onto another.
        _ => {
            let from = pick(rng, &all);
            let label = format!("copy{}", p.patches.len());
            let Some(q) = p.queues.iter().position(|q| q.role == QueueRole::Worker) else {
                return;
            };
            p.queues[q].wqes.push(redn_program::program::Wqe {
                label: label.clone(),
                op: Op::Write {
                    remote: Addr::wqe(&target, byte as usize),
                    sgl: vec![Sge::new(Addr::wqe(&from, 16), len)],
                    imm: None,
                },
                flags: WqeFlags::NONE,
                form: redn_program::program::Form::Active,
            });
            p.patches.push(PatchPoint {
                label: target,
                byte,
                len,
                source: PatchSource::Write { label },
            });
        }
    }
}

/// Where each WQE's first byte sits in the code region, with its opcode byte and ds.
fn wqe_slots(rig: &Rig) -> Vec<(String, usize, u8, u8)> {
    let r = &rig.installed.resolver;
    rig.program
        .queues
        .iter()
        .flat_map(|q| &q.wqes)
        .map(|w| {
            let at = r.addr(&rig.program, &Addr::wqe(&w.label, 0)).unwrap().0 - r.code_addr.0;
            let at = usize::try_from(at).unwrap();
            (w.label.clone(), at, w.op.opcode_byte(), w.op.ds())
        })
        .collect()
}

/// Wait until everything the server can run has run (`common::settle`: every PU has gone
/// round its queues with nothing to do, which no timing can fake), and say how many WQEs it
/// ran in all.
fn settled(rig: &Rig) -> u64 {
    settle(&rig.server, || rig.server_wqes());
    rig.server_wqes()
}

/// Wait until the client's SEND (its `sent`-th) has left, so that the server has its
/// trigger; false if it never leaves (the server has no receive left for it).
fn trigger_delivered(rig: &Rig, sent: u64) -> bool {
    let deadline = Instant::now() + Duration::from_millis(200);
    while rig.client.sq_consumed(rig.cqp).unwrap() < sent {
        if Instant::now() > deadline {
            return false;
        }
        std::thread::yield_now();
    }
    true
}

/// Run `p` on the softnic with `triggers` random triggers; check the three properties.
pub fn run(p: Program, rng: &mut Rng, triggers: usize, budget: u64) {
    let name = p.name.clone();
    let mut rig = Rig::new(p, Prefetch::Adversarial);
    // Adversarial data: random bytes, with some valid-looking buckets and nodes pointing
    // anywhere in the data region.
    let mut junk = vec![0u8; DATA_LEN];
    for b in junk.chunks_mut(8) {
        b.copy_from_slice(&rng.next().to_le_bytes()[..b.len()]);
    }
    rig.data.write(0, &junk);
    for i in 0..64u64 {
        let at = rng.below(DATA_LEN as u64 - 64);
        let value = rig.data.mr.addr.0 + rng.below(DATA_LEN as u64);
        let node = catalog::node_bytes(i, rng.below32(200), value, rig.data.mr.addr.0 + at);
        rig.data.write(usize::try_from(at).unwrap(), &node);
    }
    let rendered = rig.program.render(&rig.installed.resolver).unwrap().code;
    let writable: Vec<(usize, usize)> = rig
        .installed
        .code_keys
        .iter()
        .filter(|(w, _)| {
            w.access.contains(Access::LOCAL_WRITE)
                || w.access.contains(Access::REMOTE_WRITE)
                || w.access.contains(Access::REMOTE_ATOMIC)
        })
        .map(|(w, _)| (w.offset, w.offset + w.len))
        .collect();
    let slots = wqe_slots(&rig);
    // No more triggers than the program has receives for (a SEND past them waits for ever).
    let receives = rig
        .program
        .queues
        .iter()
        .filter(|q| q.role == QueueRole::Client)
        .map(|q| q.recvs.len())
        .sum::<usize>();
    let triggers = triggers.min(receives.max(1));
    let mut before = settled(&rig);
    let mut sent = 0;
    let initial = before;
    for t in 0..triggers {
        // A trigger: random bytes, with every 8-byte address parameter (a bucket or a list
        // head) inside the data region most of the time, so that chains run on rather than
        // end at their first protection error, and now and then anywhere at all.
        let mut msg = vec![0u8; usize::try_from(rig.program.trigger_len).unwrap()];
        for b in &mut msg {
            *b = rng.byte();
        }
        for param in &rig.program.params {
            let at = usize::try_from(param.offset).unwrap();
            if param.len == 8 && rng.below(8) != 0 && at + 8 <= msg.len() {
                let addr = rig.data.mr.addr.0 + rng.below(DATA_LEN as u64 - 64);
                msg[at..at + 8].copy_from_slice(&addr.to_be_bytes());
            }
        }
        rig.client.post_recv(rig.cqp, rig.next_recv, &[]).unwrap();
        rig.next_recv += 1;
        let send = WrOp::Send {
            payload: redn_program::wqe::Payload::Inline(msg),
            imm: None,
        };
        if rig
            .client
            .post_send(rig.cqp, &[wr(0, WqeFlags::NONE, send)])
            .is_err()
        {
            break;
        }
        sent += 1;
        if !trigger_delivered(&rig, sent) {
            break;
        }
        let after = settled(&rig);
        let mut code = vec![0u8; rendered.len()];
        rig.installed.code.read(0, &mut code);
        for (i, (now, was)) in code.iter().zip(&rendered).enumerate() {
            assert!(
                now == was || writable.iter().any(|(a, b)| (*a..*b).contains(&i)),
                "{name}: trigger {t}: code byte {i} changed ({was:#04x} -> {now:#04x}) outside \
                 every writable window"
            );
        }
        for (label, at, own, ds) in &slots {
            let (opcode, now_ds) = (code[at + off::OPCODE], code[at + off::DS]);
            assert!(
                opcode == Opcode::Nop as u8 || opcode == *own,
                "{name}: trigger {t}: WQE {label} now has opcode {opcode:#04x} (own {own:#04x})"
            );
            assert!(
                now_ds != 0 && bbs_for_ds(now_ds) == bbs_for_ds(*ds),
                "{name}: trigger {t}: WQE {label} now has ds {now_ds} (own {ds})"
            );
        }
        // A queue that ends in error flushes what it holds, and every flush is a completion
        // a WAIT may count: the chains of later triggers may then run now. The verifier does
        // not model that (its per-trigger bound assumes no queue fails); what still holds is
        // that no WQE runs twice.
        let failed = rig
            .installed
            .qps
            .iter()
            .any(|q| rig.server.qp_state(q.qpn).unwrap() == QpState::Error);
        let (ran, limit) = if failed {
            (after - initial, rig.program.wqe_count() as u64)
        } else {
            (after - before, budget)
        };
        assert!(
            ran <= limit,
            "{name}: trigger {t} ran {ran} WQEs, the budget is {limit} (a queue failed: \
             {failed})\n{}",
            rig.program.listing()
        );
        before = after;
        let _ = BB_SIZE;
    }
}

/// One variant: a seed program mutated once or twice, with the budget the verifier bounds
/// each of its triggers by when it accepts the variant (`None` when it refuses it).
pub fn variant(index: usize, rng: &mut Rng, g: &Grants) -> (Program, Option<u64>) {
    let all = seeds();
    let mut p = all[index % all.len()].clone();
    for _ in 0..1 + rng.below(2) {
        mutate(&mut p, rng);
    }
    let report = verify(&p, g);
    if !report.accepted() {
        if std::env::var("REDN_SOUNDNESS_DEBUG").is_ok()
            && report.findings.iter().all(|f| f.field == "control word")
        {
            eprintln!("{}: only control words\n{}", p.name, report.log());
        }
        return (p, None);
    }
    // The verifier bounds the worst trigger by what the program declares.
    let budget = match p.iterations {
        Iterations::Bounded {
            wqes_per_invocation,
            ..
        } => wqes_per_invocation,
        Iterations::Recycled { .. } => g.max_wqes_per_invocation,
    };
    (p, Some(u64::from(budget)))
}
