//! The installer is all or nothing: a failure at any step leaves the NIC holding exactly the
//! objects it held before, and a removed or dropped offload releases everything it made.
//!
//! `redn_sys::fault::FailingNic` wraps a softnic and fails the Nth call that creates or
//! changes something (releases are never failed: they are what is being checked).

use redn_program::program::catalog::{self, HashVariant};
use redn_program::program::Program;
use redn_program::program::{QueueRole, RegionRole};
use redn_sys::fault::{FailingNic, Released};
use redn_sys::install::{install, RegionBinding};
use redn_sys::mem::SharedBuffer;
use redn_sys::nic::Nic;
use redn_sys::softnic::SoftNic;
use redn_sys::{Access, Rkey, VirtAddr};
use std::collections::HashMap;
use std::sync::Arc;

const DATA_LEN: usize = 1 << 16;

/// Region bindings as `install` takes them.
type Bindings = HashMap<String, RegionBinding>;

/// A failing NIC, and bindings for every region name the catalog uses: server memory for
/// the data regions, a stand-in for a client's buffer as the response region.
fn setup() -> (Arc<FailingNic<SoftNic>>, Bindings) {
    let nic = Arc::new(FailingNic::new(SoftNic::with_pus(1).unwrap()));
    let data = SharedBuffer::new(DATA_LEN);
    let mut regions: Bindings = ["table", "list", "values"]
        .into_iter()
        .map(|n| {
            let binding = RegionBinding::Local {
                buffer: Arc::clone(&data),
                offset: 0,
                len: DATA_LEN,
                access: Access::ALL,
            };
            (n.to_string(), binding)
        })
        .collect();
    regions.insert(
        "response".into(),
        RegionBinding::Remote {
            addr: VirtAddr(0x10_0000),
            rkey: Rkey(0x1234),
            len: 4096,
        },
    );
    (nic, regions)
}

fn programs() -> Vec<Program> {
    vec![
        catalog::echo(64, 4).unwrap(),
        catalog::hash_get(HashVariant::Single, 4).unwrap(),
        catalog::hash_get(HashVariant::Parallel, 2).unwrap(),
        catalog::list_find(4, true, 1).unwrap(),
        catalog::server_loop().unwrap(),
    ]
}

/// Releases go queues and CQs first, then regions, then protection domains: the reverse of
/// the order an install creates them in.
fn assert_reverse_order(released: &[Released], what: &str) {
    let rank = |r: &Released| match r {
        Released::Qp(_) | Released::Cq(_) => 0,
        Released::Region(_) => 1,
        Released::Pd(_) => 2,
    };
    assert!(
        released.windows(2).all(|w| rank(&w[0]) <= rank(&w[1])),
        "{what}: released out of order: {released:?}"
    );
}

#[test]
fn a_failure_at_any_step_of_an_install_leaves_nothing_behind() {
    for program in programs() {
        let (nic, regions) = setup();
        let before = nic.objects();
        let mut failures = 0;
        for fail_at in 0.. {
            nic.arm(fail_at);
            let _ = nic.take_released();
            // The client-facing queue is connected to itself: that call can fail too.
            let connect_nic = Arc::clone(&nic);
            let result = install(&nic, &program, &regions, &mut |q| connect_nic.connect(q, q));
            match result {
                Err(e) => {
                    assert!(
                        e.to_string().contains("injected failure"),
                        "{}: step {fail_at}: unexpected error {e}",
                        program.name
                    );
                    assert_eq!(
                        nic.objects(),
                        before,
                        "{}: objects left behind by a failure at step {fail_at}",
                        program.name
                    );
                    let released = nic.take_released();
                    assert_reverse_order(&released, &program.name);
                    failures += 1;
                }
                Ok(installed) => {
                    assert_eq!(
                        nic.calls(),
                        fail_at,
                        "{}: the install succeeded with step {fail_at} failing",
                        program.name
                    );
                    // Two protection domains, a narrow key per code window and one per data
                    // region on each side, a CQ and queue pair per queue plus the master's.
                    let queues = program.queues.len() + 1;
                    let data = program
                        .regions
                        .iter()
                        .filter(|r| matches!(r.role, RegionRole::Data { .. }))
                        .count();
                    let during = nic.objects();
                    assert_eq!(
                        (during.pds, during.regions, during.cqs, during.qps),
                        (
                            before.pds + 2,
                            before.regions + installed.code_keys.len() + 2 * data,
                            before.cqs + queues,
                            before.qps + queues
                        ),
                        "{}",
                        program.name
                    );
                    let master = installed.master;
                    let first_window = installed.code_keys[0].1.lkey;
                    let pds = [QueueRole::Client, QueueRole::Worker]
                        .map(|side| Released::Pd(installed.pd(side).pdn()));
                    let _ = nic.take_released();
                    installed.remove().unwrap();
                    assert_eq!(nic.objects(), before, "{}: after remove", program.name);
                    // Newest first: the master queue (made last); the first code window
                    // (made first) after every queue; the domains after everything in them.
                    let released = nic.take_released();
                    assert_reverse_order(&released, &program.name);
                    let n = released.len();
                    assert_eq!(released[0], Released::Qp(master), "{released:?}");
                    assert_eq!(released[n - 3], Released::Region(first_window));
                    assert_eq!(released[n - 2..], pds);
                    break;
                }
            }
        }
        // Every creating step was tried as the failing one: at least the two domains, a
        // code window, a CQ and a queue pair per queue, the master's, and their connects.
        assert!(
            failures >= 3 * program.queues.len() + 5,
            "{}: only {failures} steps",
            program.name
        );
    }
}

#[test]
fn a_dropped_offload_releases_everything_newest_first() {
    let (nic, regions) = setup();
    let before = nic.objects();
    let program = catalog::hash_get(HashVariant::Single, 4).unwrap();
    let installed = install(&nic, &program, &regions, &mut |q| nic.connect(q, q)).unwrap();
    let master = installed.master;
    let worker_pd = installed.pd(QueueRole::Worker).pdn();
    let _ = nic.take_released();
    drop(installed);
    assert_eq!(nic.objects(), before);
    let released = nic.take_released();
    assert_reverse_order(&released, "hash-get");
    assert_eq!(released.first(), Some(&Released::Qp(master)));
    assert_eq!(released.last(), Some(&Released::Pd(worker_pd)));
}

#[test]
fn a_refused_binding_creates_nothing() {
    let (nic, mut regions) = setup();
    let before = nic.objects();
    let program = catalog::hash_get(HashVariant::Single, 4).unwrap();
    nic.arm(usize::MAX);
    let e = install(&nic, &program, &regions, &mut |q| nic.connect(q, q));
    assert!(e.is_ok());
    drop(e);
    // The response region bound as server memory, and the table left out.
    regions.insert("response".into(), regions["table"].clone());
    nic.arm(usize::MAX);
    let e = install(&nic, &program, &regions, &mut |q| nic.connect(q, q)).unwrap_err();
    assert!(
        e.to_string().contains("bind it as RegionBinding::Remote"),
        "{e}"
    );
    regions.remove("table");
    nic.arm(usize::MAX);
    let e = install(&nic, &program, &regions, &mut |q| nic.connect(q, q)).unwrap_err();
    assert!(e.to_string().contains("needs region \"table\""), "{e}");
    assert_eq!(nic.calls(), 0);
    assert_eq!(nic.objects(), before);
}

#[test]
fn a_program_asking_for_gigabytes_of_rings_is_refused_before_anything_is_made() {
    let (nic, regions) = setup();
    let before = nic.objects();
    let mut program = catalog::hash_get(HashVariant::Single, 4).unwrap();
    program.queues[0].rq_slots = 1 << 16;
    program.queues[0].rq_sges = 1 << 15;
    nic.arm(usize::MAX);
    let e = install(&nic, &program, &regions, &mut |q| nic.connect(q, q)).unwrap_err();
    assert!(e.to_string().contains("the code region would need"), "{e}");
    assert_eq!(nic.calls(), 0);
    assert_eq!(nic.objects(), before);
}
