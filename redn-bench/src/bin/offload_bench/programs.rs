//! The Builder programs of section 1's constructs table: n CAS-based `if`s, and a minimal
//! recycled `while` (two queues re-arming each other).

use super::{NONE, SIG};
use redn_bench::queues::flags_if;
use redn_program::program::{
    Addr, Builder, Form, Iterations, Op, Program, ProgramError, QueueRole, RegionRole, Sge,
};
use redn_program::wqe::WqeFlags;
use redn_sys::Access;

/// `n` CAS-based `if`s: worker queue `w` (unmanaged, started by its doorbell) runs
/// { CAS (if_eq on t_i, signaled, fenced), WAIT(w, i), SEND_EN(t, i + 1) } per `if`; managed
/// queue `t` holds t_i, an 8 B WRITE posted as NOP. Even `if`s compare equal (taken: the NOP
/// becomes the WRITE), odd ones do not. The last t_i is signaled.
pub(crate) fn if_program(n: u32) -> Result<Program, ProgramError> {
    let mut b = Builder::new("bench-if", "n CAS-based ifs, every other one taken");
    b.region(
        "data",
        RegionRole::Data {
            access: Access::REMOTE_WRITE,
        },
        128,
        "scratch the taken WRITEs copy within",
    );
    // `t` first: every label the render looks up is a t_i, and lookups scan the queues in order.
    let t = b.queue(
        "t",
        QueueRole::Worker,
        true,
        false,
        Some(0),
        n.next_power_of_two(),
        1,
        1,
    );
    let w = b.queue(
        "w",
        QueueRole::Worker,
        false,
        false,
        Some(0),
        (3 * n).next_power_of_two(),
        1,
        1,
    );
    for i in 0..n {
        let target = format!("t{i}");
        let op = Op::Write {
            remote: Addr::region("data", 0),
            sgl: vec![Sge::new(Addr::region("data", 64), 8)],
            imm: None,
        };
        b.push(t, &target, op, flags_if(i + 1 == n), Form::Nop);
        b.if_eq(w, &format!("c{i}"), &target, Some(u64::from(i % 2)), SIG)?;
        b.push(
            w,
            &format!("w{i}"),
            Op::Wait {
                queue: "w".into(),
                count: i,
            },
            NONE,
            Form::Active,
        );
        b.push(
            w,
            &format!("e{i}"),
            Op::SendEn {
                queue: "t".into(),
                count: i + 1,
            },
            NONE,
            Form::Active,
        );
    }
    b.finish(
        Iterations::Bounded {
            invocations: 1,
            wqes_per_invocation: 4 * n,
        },
        "none: the last conditional WQE's completion on t's CQ",
    );
    b.build()
}

/// A minimal recycled `while`: managed queues `w` and `h` (one round each, 4 BBs) re-arm each
/// other forever. Each round, each queue advances a counter into the other queue's SEND_EN
/// count (`advance_count`: a byte-reversing READ, then a FETCH_ADD; the other is not enabled,
/// so the patch is never stale), then SEND_ENs (fenced, so the READ has landed) the other
/// queue for its next round.
pub(crate) fn loop_program() -> Result<Program, ProgramError> {
    let mut b = Builder::new(
        "bench-while",
        "a recycled loop: two queues re-arming each other",
    );
    let w = b.queue("w", QueueRole::Worker, true, false, Some(0), 4, 1, 1);
    let h = b.queue("h", QueueRole::Worker, true, false, Some(0), 4, 1, 1);
    // Round r: w enables h up to 4(r+1); h enables w up to 4(r+2).
    b.static_block("c.h", 8u64.to_le_bytes().to_vec()); // h.en in h's round r: 4(r+2)
    b.static_block("c.w", 8u64.to_le_bytes().to_vec()); // w.en in w's round r+1: 4(r+2)
    b.advance_count(w, "w.adv", "c.h", 4, "h.en");
    let fence = WqeFlags::FENCE;
    b.push(
        w,
        "w.en",
        Op::SendEn {
            queue: "h".into(),
            count: 4,
        },
        fence,
        Form::Active,
    );
    b.advance_count(h, "h.adv", "c.w", 4, "w.en");
    b.push(
        h,
        "h.en",
        Op::SendEn {
            queue: "w".into(),
            count: 8,
        },
        fence,
        Form::Active,
    );
    b.entry(w, 4);
    b.finish(Iterations::Recycled { wqes_per_round: 6 }, "none");
    b.build()
}
