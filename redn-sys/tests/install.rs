//! The installer is all or nothing: a failure at any step leaves the NIC holding exactly the
//! objects it held before, and a removed or dropped offload releases everything it made.
//!
//! `FailingNic` wraps a softnic and fails the Nth call that creates or changes something
//! (releases are never failed: they are what is being checked).

use redn_program::program::catalog::{self, HashVariant};
use redn_program::program::Program;
use redn_program::program::{QueueRole, RegionRole};
use redn_program::wqe::{Sge, WorkRequest};
use redn_sys::install::{install, RegionBinding};
use redn_sys::mem::SharedBuffer;
use redn_sys::nic::{
    CompChannel, Completion, CqConfig, MrInfo, Nic, ObjectCounts, QpConfig, QpCounters, QpInfo,
    RateLimit,
};
use redn_sys::softnic::SoftNic;
use redn_sys::{Access, Cqn, Error, Lkey, Pdn, QpState, Qpn, Result, Rkey, VirtAddr};
use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

/// A softnic whose `fail_at`-th creating or changing call (counted from 0) fails.
struct FailingNic {
    inner: SoftNic,
    calls: AtomicUsize,
    fail_at: AtomicUsize,
    /// Every release, in order.
    released: Mutex<Vec<Released>>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Released {
    Pd(Pdn),
    Region(Lkey),
    Cq(Cqn),
    Qp(Qpn),
}

impl FailingNic {
    fn step(&self, what: &'static str) -> Result<()> {
        if self.calls.fetch_add(1, Ordering::Relaxed) == self.fail_at.load(Ordering::Relaxed) {
            return Err(Error::InvalidConfig {
                what,
                detail: "injected failure".into(),
            });
        }
        Ok(())
    }

    fn log(&self, r: Released) {
        self.released.lock().unwrap().push(r);
    }

    /// Count calls from zero again and fail the `n`-th (`usize::MAX`: none).
    fn arm(&self, n: usize) {
        self.calls.store(0, Ordering::Relaxed);
        self.fail_at.store(n, Ordering::Relaxed);
    }
}

impl Nic for FailingNic {
    fn name(&self) -> &str {
        self.inner.name()
    }
    fn alloc_pd(&self) -> Result<Pdn> {
        self.step("alloc_pd")?;
        self.inner.alloc_pd()
    }
    fn dealloc_pd(&self, pd: Pdn) -> Result<()> {
        self.log(Released::Pd(pd));
        self.inner.dealloc_pd(pd)
    }
    fn reg_mr(
        &self,
        pd: Pdn,
        buffer: &Arc<SharedBuffer>,
        offset: usize,
        len: usize,
        access: Access,
    ) -> Result<MrInfo> {
        self.step("reg_mr")?;
        self.inner.reg_mr(pd, buffer, offset, len, access)
    }
    fn dereg_mr(&self, lkey: Lkey) -> Result<()> {
        self.log(Released::Region(lkey));
        self.inner.dereg_mr(lkey)
    }
    fn create_cq(&self, cfg: CqConfig) -> Result<Cqn> {
        self.step("create_cq")?;
        self.inner.create_cq(cfg)
    }
    fn destroy_cq(&self, cq: Cqn) -> Result<()> {
        self.log(Released::Cq(cq));
        self.inner.destroy_cq(cq)
    }
    fn create_qp(&self, cfg: QpConfig) -> Result<QpInfo> {
        self.step("create_qp")?;
        self.inner.create_qp(cfg)
    }
    fn destroy_qp(&self, qp: Qpn) -> Result<()> {
        self.log(Released::Qp(qp));
        self.inner.destroy_qp(qp)
    }
    fn connect(&self, a: Qpn, b: Qpn) -> Result<()> {
        self.step("connect")?;
        self.inner.connect(a, b)
    }
    fn post_send(&self, qp: Qpn, wrs: &[WorkRequest]) -> Result<()> {
        self.step("post_send")?;
        self.inner.post_send(qp, wrs)
    }
    fn post_recv(&self, qp: Qpn, wr_id: u64, sgl: &[Sge]) -> Result<()> {
        self.step("post_recv")?;
        self.inner.post_recv(qp, wr_id, sgl)
    }
    fn ring_doorbell(&self, qp: Qpn, pi: u64) -> Result<()> {
        self.step("ring_doorbell")?;
        self.inner.ring_doorbell(qp, pi)
    }
    fn note_posted(&self, qp: Qpn, pi: u64, end: u64, wr_id: u64) -> Result<()> {
        self.step("note_posted")?;
        self.inner.note_posted(qp, pi, end, wr_id)
    }
    fn note_recvs_posted(&self, qp: Qpn, n: u64) -> Result<()> {
        self.step("note_recvs_posted")?;
        self.inner.note_recvs_posted(qp, n)
    }
    fn poll_cq(&self, cq: Cqn, max: usize, out: &mut Vec<Completion>) -> Result<usize> {
        self.inner.poll_cq(cq, max, out)
    }
    fn cq_produced(&self, cq: Cqn) -> Result<u64> {
        self.inner.cq_produced(cq)
    }
    fn req_notify_cq(&self, cq: Cqn, channel: &CompChannel) -> Result<()> {
        self.step("req_notify_cq")?;
        self.inner.req_notify_cq(cq, channel)
    }
    fn qp_state(&self, qp: Qpn) -> Result<QpState> {
        self.inner.qp_state(qp)
    }
    fn set_qp_error(&self, qp: Qpn) -> Result<()> {
        self.step("set_qp_error")?;
        self.inner.set_qp_error(qp)
    }
    fn set_rate_limit(&self, qp: Qpn, limit: RateLimit) -> Result<()> {
        self.step("set_rate_limit")?;
        self.inner.set_rate_limit(qp, limit)
    }
    fn counters(&self, qp: Qpn) -> Result<QpCounters> {
        self.inner.counters(qp)
    }
    fn sq_consumed(&self, qp: Qpn) -> Result<u64> {
        self.inner.sq_consumed(qp)
    }
    fn objects(&self) -> ObjectCounts {
        self.inner.objects()
    }
    fn get_async_event(&self) -> Option<redn_sys::nic::AsyncEvent> {
        self.inner.get_async_event()
    }
    fn async_events_lost(&self) -> u64 {
        self.inner.async_events_lost()
    }
}

const DATA_LEN: usize = 1 << 16;

/// Region bindings as `install` takes them.
type Bindings = HashMap<String, RegionBinding>;

/// A failing NIC, and bindings for every region name the catalog uses: server memory for
/// the data regions, a stand-in for a client's buffer as the response region.
fn setup() -> (Arc<FailingNic>, Bindings) {
    let nic = Arc::new(FailingNic {
        inner: SoftNic::with_pus(1).unwrap(),
        calls: AtomicUsize::new(0),
        fail_at: AtomicUsize::new(usize::MAX),
        released: Mutex::new(Vec::new()),
    });
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
            nic.released.lock().unwrap().clear();
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
                    let released = nic.released.lock().unwrap().clone();
                    assert_reverse_order(&released, &program.name);
                    failures += 1;
                }
                Ok(installed) => {
                    assert_eq!(
                        nic.calls.load(Ordering::Relaxed),
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
                    nic.released.lock().unwrap().clear();
                    installed.remove().unwrap();
                    assert_eq!(nic.objects(), before, "{}: after remove", program.name);
                    // Newest first: the master queue (made last); the first code window
                    // (made first) after every queue; the domains after everything in them.
                    let released = nic.released.lock().unwrap().clone();
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
    nic.released.lock().unwrap().clear();
    drop(installed);
    assert_eq!(nic.objects(), before);
    let released = nic.released.lock().unwrap().clone();
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
    assert_eq!(nic.calls.load(Ordering::Relaxed), 0);
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
    assert_eq!(nic.calls.load(Ordering::Relaxed), 0);
    assert_eq!(nic.objects(), before);
}
