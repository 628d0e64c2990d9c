//! Protected fields past the first segments: the lkey of every local data segment and the
//! padding to a multi-BB WQE's end. A patch point over any of them is refused; one over the
//! data beside them (a local address) is not. (Mutation testing found these unchecked.)

use redn_policy::{verify, Grants, Rule};
use redn_program::program::{
    Addr, Builder, Form, Iterations, Op, Operand, PatchSource, Program, QueueRole, RegionRole, Sge,
};
use redn_program::wqe::WqeFlags;
use redn_program::Access;

/// A program whose one worker queue runs `op` (labelled `w`), with a trigger parameter
/// patching `len` bytes of it at `byte`.
fn with_patch(op: Op, byte: u32, len: u32) -> Program {
    let mut b = Builder::new("fields", "one WQE with one patch point");
    b.region(
        "data",
        RegionRole::Data {
            access: Access::ALL,
        },
        4096,
        "memory",
    );
    b.param("p", len, "patched bytes");
    let q = b.queue("q", QueueRole::Worker, false, false, None, 8, 1, 1);
    b.push(q, "w", op, WqeFlags::NONE, Form::Active);
    b.patch("w", byte, len, PatchSource::Trigger { param: "p".into() });
    b.entry(q, 8);
    b.finish(Iterations::bounded(1, 1), "nothing");
    b.build().unwrap()
}

fn data(offset: u64) -> Sge {
    Sge::new(Addr::region("data", offset), 8)
}

/// A WRITE with `n` local data segments (2 + n segments of 16 bytes).
fn write(n: u64) -> Op {
    Op::Write {
        remote: Addr::region("data", 1024),
        sgl: (0..n).map(|i| data(8 * i)).collect(),
        imm: None,
    }
}

/// The protected field a patch at `byte..byte+len` of `op` is refused for, if any.
fn refused_for(op: Op, byte: u32, len: u32) -> Option<String> {
    let g = Grants::new().with_region("data", Access::ALL, 4096);
    let r = verify(&with_patch(op, byte, len), &g);
    let found: Vec<_> = r
        .findings
        .iter()
        .filter(|f| f.rule == Rule::ProtectedField)
        .collect();
    assert!(found.len() <= 1, "{}", r.log());
    found.first().map(|f| {
        let start = f.detail.find("the ").expect("names the field") + 4;
        let end = f.detail.find(')').expect("names its bytes") + 1;
        f.detail[start..end].to_string()
    })
}

#[test]
fn every_local_lkey_is_protected_and_the_addresses_beside_them_are_not() {
    // WRITE / READ: data segments from segment 2 (bytes 32..), lkey at 4..8 of each.
    assert_eq!(
        refused_for(write(2), 36, 4).as_deref(),
        Some("lkey (bytes 36..40)")
    );
    assert_eq!(
        refused_for(write(2), 52, 4).as_deref(),
        Some("lkey (bytes 52..56)")
    );
    let read = Op::Read {
        remote: Addr::region("data", 1024),
        sgl: vec![data(0), data(8)],
    };
    assert_eq!(
        refused_for(read, 52, 4).as_deref(),
        Some("lkey (bytes 52..56)")
    );
    // The local addresses of both segments are data a program may patch.
    assert_eq!(refused_for(write(2), 40, 8), None);
    assert_eq!(refused_for(write(2), 56, 8), None);

    // CAS and FETCH_ADD with a result: the atomic segment (bytes 32..48) is operands, the
    // result's data segment (48..64) has an lkey.
    let cas = Op::Cas {
        remote: Addr::region("data", 1024),
        compare: Operand::Lit(0),
        swap: Operand::Lit(1),
        result: Some(data(0)),
    };
    assert_eq!(
        refused_for(cas.clone(), 52, 4).as_deref(),
        Some("lkey (bytes 52..56)")
    );
    assert_eq!(refused_for(cas, 36, 4), None, "a CAS's swap is an operand");
    let faa = Op::Faa {
        remote: Addr::region("data", 1024),
        add: 1,
        result: Some(data(0)),
    };
    assert_eq!(
        refused_for(faa, 52, 4).as_deref(),
        Some("lkey (bytes 52..56)")
    );
}

#[test]
fn the_padding_of_a_multi_bb_wqe_runs_to_its_last_bb() {
    // Five segments (80 bytes) take two BBs: bytes 80..128 are padding.
    assert_eq!(
        refused_for(write(3), 120, 4).as_deref(),
        Some("padding (bytes 80..128)")
    );
    assert_eq!(
        refused_for(write(3), 80, 4).as_deref(),
        Some("padding (bytes 80..128)")
    );
    // The last data segment's address, just before the padding, is data.
    assert_eq!(refused_for(write(3), 72, 8), None);
}
