//! The verifier: every catalog program is accepted; a hostile corpus is refused, each program
//! for the rule it breaks.

use redn_policy::{verify, Grants, Rule};
use redn_program::program::catalog::{self, HashVariant};
use redn_program::program::{
    Addr, Form, Iterations, Op, Operand, PatchPoint, PatchSource, Program, Recv, RegionDecl,
    RegionRole, Sge, Slots, Wqe,
};
use redn_program::wqe::WqeFlags;
use redn_program::Access;

/// What a client of the catalog is granted.
fn grants() -> Grants {
    Grants::new()
        .with_region("table", Access::REMOTE_READ, 1 << 20)
        .with_region("list", Access::REMOTE_READ, 1 << 20)
        .with_region("values", Access::NONE, 1 << 20)
        .with_region("response", Access::REMOTE_WRITE, 1 << 17)
}

fn catalog_programs() -> Vec<Program> {
    vec![
        catalog::echo(64, 8).unwrap(),
        catalog::hash_get(HashVariant::Single, 8).unwrap(),
        catalog::hash_get(HashVariant::Sequential, 8).unwrap(),
        catalog::hash_get(HashVariant::Parallel, 8).unwrap(),
        catalog::list_find(8, false, 4).unwrap(),
        catalog::list_find(8, true, 1).unwrap(),
        catalog::server_loop().unwrap(),
    ]
}

#[test]
fn every_catalog_program_is_accepted() {
    let mut g = grants();
    g.loop_budget = Some(1_000_000);
    g.max_wqes_per_invocation = 256;
    for p in catalog_programs() {
        let r = verify(&p, &g);
        assert!(r.accepted(), "{}", r.log());
        assert!(r.log().ends_with(&format!(
            "checked {} wqes (limit 256 per invocation) queues {} patch_points {} loops {}\n",
            p.wqe_count(),
            p.queues.len(),
            p.patches.len(),
            usize::from(matches!(p.iterations, Iterations::Recycled { .. }))
        )));
    }
}

fn base() -> Program {
    catalog::hash_get(HashVariant::Single, 1).unwrap()
}

fn wqe_mut<'a>(p: &'a mut Program, label: &str) -> &'a mut Wqe {
    p.queues
        .iter_mut()
        .flat_map(|q| q.wqes.iter_mut())
        .find(|w| w.label == label)
        .unwrap_or_else(|| panic!("no WQE {label}"))
}

fn push(p: &mut Program, queue: &str, label: &str, op: Op) {
    let q = p.queues.iter_mut().find(|q| q.name == queue).unwrap();
    q.wqes.push(Wqe {
        label: label.into(),
        op,
        flags: WqeFlags::NONE,
        form: Form::Active,
    });
}

fn patch(p: &mut Program, label: &str, byte: u32, len: u32, source: PatchSource) {
    p.patches.push(PatchPoint {
        label: label.into(),
        byte,
        len,
        source,
    });
}

fn read_source() -> PatchSource {
    PatchSource::Read {
        label: "0.b0.read".into(),
    }
}

/// The one finding of `rule` in `r`, which must be on WQE `label` and field `field`.
fn only_finding<'r>(
    r: &'r redn_policy::Report,
    rule: Rule,
    label: &str,
    field: &str,
) -> &'r redn_policy::Finding {
    let hits: Vec<_> = r.findings.iter().filter(|f| f.rule == rule).collect();
    assert_eq!(hits.len(), 1, "expected one {rule} finding:\n{}", r.log());
    let f = hits[0];
    assert_eq!(
        f.wqe.as_ref().map(|w| w.1.as_str()),
        Some(label),
        "{}",
        r.log()
    );
    assert_eq!(f.field, field, "{}", r.log());
    f
}

mod control_cas;
mod corpus;
mod wqe_writes;
