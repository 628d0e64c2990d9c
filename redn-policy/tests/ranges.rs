//! Static address ranges at their exact limits: a range ending on the last byte of a region,
//! a static block or a WQE is inside; one byte more is outside. And the code region is never
//! reachable through the client's connection. An atomic target is aligned wherever it
//! points. (Mutation testing found these unchecked.)

use redn_policy::{verify, Grants, Report, Rule};
use redn_program::program::{
    Addr, Builder, Form, Iterations, Op, Operand, Program, QueueRole, RegionRole, Sge,
};
use redn_program::wqe::WqeFlags;
use redn_program::Access;

const DATA: u64 = 4096;
const ALL: Access = Access::ALL;

/// A program with an 8-byte static block `blk`, a granted region `data` of [`DATA`] bytes,
/// a 64-byte WQE `target` (a WRITE with two local segments, no padding) and `op` (labelled
/// `op`), both on a queue of `role`.
fn with_op(role: QueueRole, op: Op) -> Program {
    let mut b = Builder::new("ranges", "one operation at a limit");
    b.region("data", RegionRole::Data { access: ALL }, DATA, "memory");
    b.static_block("blk", vec![0; 8]);
    let q = b.queue("q", role, false, false, None, 8, 1, 1);
    let target = Op::Write {
        remote: Addr::region("data", 0),
        sgl: vec![
            Sge::new(Addr::region("data", 0), 8),
            Sge::new(Addr::region("data", 8), 8),
        ],
        imm: None,
    };
    b.push(q, "target", target, WqeFlags::NONE, Form::Active);
    b.push(q, "op", op, WqeFlags::NONE, Form::Active);
    b.entry(q, 2);
    b.finish(Iterations::bounded(1, 2), "nothing");
    b.build().unwrap()
}

fn check(role: QueueRole, op: Op) -> Report {
    verify(
        &with_op(role, op),
        &Grants::new().with_region("data", ALL, DATA),
    )
}

/// Whether `r` has a finding of `rule` on WQE `op`.
fn broke(r: &Report, rule: Rule) -> bool {
    r.findings
        .iter()
        .any(|f| f.rule == rule && f.wqe.as_ref().is_some_and(|(_, l)| l == "op"))
}

fn read_into(local: Addr) -> Op {
    Op::Read {
        remote: Addr::region("data", 0),
        sgl: vec![Sge::new(local, 8)],
    }
}

#[test]
fn a_range_ending_at_a_regions_last_byte_is_inside_one_more_is_not() {
    let write_at = |offset| Op::Write {
        remote: Addr::region("data", offset),
        sgl: vec![Sge::new(Addr::region("data", 0), 8)],
        imm: None,
    };
    let r = check(QueueRole::Worker, write_at(DATA - 8));
    assert!(!broke(&r, Rule::OutOfRegion), "{}", r.log());
    let r = check(QueueRole::Worker, write_at(DATA - 7));
    assert!(broke(&r, Rule::OutOfRegion), "{}", r.log());
}

#[test]
fn a_range_ending_at_a_static_blocks_last_byte_is_inside_one_more_is_not() {
    let r = check(QueueRole::Worker, read_into(Addr::static_("blk", 0)));
    assert!(!broke(&r, Rule::OutOfRegion), "{}", r.log());
    let r = check(QueueRole::Worker, read_into(Addr::static_("blk", 1)));
    assert!(broke(&r, Rule::OutOfRegion), "{}", r.log());
    assert!(
        r.log().contains("static blk+1..+8 is outside its 8 bytes"),
        "{}",
        r.log()
    );
}

#[test]
fn a_range_ending_at_a_wqes_last_byte_is_inside_one_more_is_not() {
    // `target` is one BB: bytes 56..64 are its second local address, 57..65 run past it.
    let r = check(QueueRole::Worker, read_into(Addr::wqe("target", 56)));
    assert!(!broke(&r, Rule::OutOfRegion), "{}", r.log());
    let r = check(QueueRole::Worker, read_into(Addr::wqe("target", 57)));
    assert!(broke(&r, Rule::OutOfRegion), "{}", r.log());
    assert!(
        r.log().contains("target@57..+8 is outside that WQE"),
        "{}",
        r.log()
    );
}

#[test]
fn the_client_cannot_name_the_code_region() {
    // Through the client's connection a static block or a WQE is the client's memory, not
    // ours: refused either way.
    for remote in [Addr::static_("blk", 0), Addr::wqe("target", 56)] {
        let op = Op::Write {
            remote: remote.clone(),
            sgl: vec![Sge::new(Addr::region("data", 0), 8)],
            imm: None,
        };
        let r = check(QueueRole::Client, op.clone());
        assert!(broke(&r, Rule::WrongSide), "{remote:?}: {}", r.log());
        let r = check(QueueRole::Worker, op);
        assert!(!broke(&r, Rule::WrongSide), "{remote:?}: {}", r.log());
    }
}

fn cas_on(remote: Addr) -> Op {
    Op::Cas {
        remote,
        compare: Operand::Lit(0),
        swap: Operand::Lit(1),
        result: None,
    }
}

#[test]
fn an_atomic_is_refused_exactly_where_its_target_is_unaligned() {
    let misaligned = |remote| broke(&check(QueueRole::Worker, cas_on(remote)), Rule::Misaligned);
    // WQE bytes (aligned ones other than byte 0 too), then region bytes.
    for byte in [0usize, 8, 16, 56] {
        assert!(!misaligned(Addr::wqe("target", byte)), "WQE byte {byte}");
    }
    for byte in [1usize, 4, 7, 12, 60] {
        assert!(misaligned(Addr::wqe("target", byte)), "WQE byte {byte}");
    }
    for offset in [0u64, 8, 48] {
        assert!(!misaligned(Addr::region("data", offset)), "offset {offset}");
    }
    for offset in [1u64, 4, 12] {
        assert!(misaligned(Addr::region("data", offset)), "offset {offset}");
    }
}
