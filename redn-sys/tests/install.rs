//! The installer is all or nothing: a failure at any step leaves the NIC holding exactly the
//! objects it held before, and a removed or dropped offload releases everything it made.
//!
//! `FailingNic` wraps a softnic and fails the Nth call that creates or changes something
//! (releases are never failed: they are what is being checked).

use redn_program::program::catalog::{self, HashVariant};
use redn_program::program::Program;
use redn_program::wqe::{Sge, WorkRequest};
use redn_sys::handle::ProtectionDomain;
use redn_sys::install::install;
use redn_sys::mem::SharedBuffer;
use redn_sys::nic::{
    CompChannel, Completion, CqConfig, MrInfo, Nic, ObjectCounts, QpConfig, QpCounters, QpInfo,
    RateLimit,
};
use redn_sys::softnic::SoftNic;
use redn_sys::{Access, Cqn, Error, Lkey, Pdn, QpState, Qpn, Result, VirtAddr};
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
}

const DATA_LEN: usize = 1 << 16;

/// A failing NIC with one data region bound under every name the catalog uses.
/// Region bindings as `install` takes them: name → (address, key, length).
type Bindings = HashMap<String, (VirtAddr, Lkey, u64)>;

fn setup() -> (Arc<FailingNic>, Arc<ProtectionDomain<FailingNic>>, Bindings) {
    let nic = Arc::new(FailingNic {
        inner: SoftNic::with_pus(1).unwrap(),
        calls: AtomicUsize::new(0),
        fail_at: AtomicUsize::new(usize::MAX),
        released: Mutex::new(Vec::new()),
    });
    let pd = ProtectionDomain::alloc(&nic).unwrap();
    let data = SharedBuffer::new(DATA_LEN);
    let mr = nic
        .reg_mr(pd.pdn(), &data, 0, DATA_LEN, Access::ALL)
        .unwrap();
    let regions = ["table", "list", "values", "response"]
        .into_iter()
        .map(|n| (n.to_string(), (mr.addr, mr.lkey, DATA_LEN as u64)))
        .collect();
    (nic, pd, regions)
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

#[test]
fn a_failure_at_any_step_of_an_install_leaves_nothing_behind() {
    for program in programs() {
        let (nic, pd, regions) = setup();
        let before = nic.objects();
        let mut failures = 0;
        for fail_at in 0.. {
            nic.arm(fail_at);
            nic.released.lock().unwrap().clear();
            // The client-facing queue is connected to itself: that call can fail too.
            let connect_nic = Arc::clone(&nic);
            let result = install(&pd, &program, &regions, &mut |q| connect_nic.connect(q, q));
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
                    // Newest first: the code region, made first, goes last.
                    let released = nic.released.lock().unwrap().clone();
                    if let Some(at) = released
                        .iter()
                        .position(|r| matches!(r, Released::Region(_)))
                    {
                        assert_eq!(at + 1, released.len(), "{}: {released:?}", program.name);
                    }
                    failures += 1;
                }
                Ok(installed) => {
                    assert_eq!(
                        nic.calls.load(Ordering::Relaxed),
                        fail_at,
                        "{}: the install succeeded with step {fail_at} failing",
                        program.name
                    );
                    // An install creates a code region and a CQ and queue pair per queue
                    // plus the master's, and nothing else.
                    let queues = program.queues.len() + 1;
                    let during = nic.objects();
                    assert_eq!(
                        (during.pds, during.regions, during.cqs, during.qps),
                        (
                            before.pds,
                            before.regions + 1,
                            before.cqs + queues,
                            before.qps + queues
                        ),
                        "{}",
                        program.name
                    );
                    let (master, code) = (installed.master, installed.code_mr.lkey);
                    nic.released.lock().unwrap().clear();
                    installed.remove().unwrap();
                    assert_eq!(nic.objects(), before, "{}: after remove", program.name);
                    // Newest first: the master queue (made last), and the code region that
                    // holds every ring only after every queue is gone.
                    let released = nic.released.lock().unwrap().clone();
                    assert_eq!(released.first(), Some(&Released::Qp(master)));
                    assert_eq!(released.last(), Some(&Released::Region(code)));
                    assert_eq!(released.len(), 1 + 2 * queues, "{released:?}");
                    break;
                }
            }
        }
        // Every creating step was tried as the failing one: at least a region, a CQ and
        // a queue pair per queue, the master's, and their connects.
        assert!(
            failures >= 3 * program.queues.len() + 3,
            "{}: only {failures} steps",
            program.name
        );
    }
}

#[test]
fn a_dropped_offload_releases_everything_and_its_protection_domain_last() {
    // The data region lives in the setup's protection domain; the offload gets one of its
    // own, held only through handles, so its release can be seen.
    let (nic, _data_pd, regions) = setup();
    let before = nic.objects();
    let pd = ProtectionDomain::alloc(&nic).unwrap();
    let program = catalog::hash_get(HashVariant::Single, 4).unwrap();
    let installed = install(&pd, &program, &regions, &mut |q| nic.connect(q, q)).unwrap();
    let (pdn, master, code) = (pd.pdn(), installed.master, installed.code_mr.lkey);
    // The caller lets go of its handle first: the offload keeps the domain alive.
    drop(pd);
    assert_eq!(nic.objects().pds, before.pds + 1);
    nic.released.lock().unwrap().clear();
    drop(installed);
    assert_eq!(nic.objects(), before);
    // Newest first, the code region after every queue, the domain after everything in it.
    let released = nic.released.lock().unwrap().clone();
    let n = released.len();
    assert_eq!(released[0], Released::Qp(master), "{released:?}");
    assert_eq!(
        released[n - 2..],
        [Released::Region(code), Released::Pd(pdn)]
    );
}

#[test]
fn a_refused_binding_creates_nothing() {
    let (nic, pd, mut regions) = setup();
    let before = nic.objects();
    let program = catalog::hash_get(HashVariant::Single, 4).unwrap();
    regions.remove("table");
    nic.arm(usize::MAX);
    let e = install(&pd, &program, &regions, &mut |q| nic.connect(q, q)).unwrap_err();
    assert!(e.to_string().contains("region binding"), "{e}");
    assert_eq!(nic.calls.load(Ordering::Relaxed), 0);
    assert_eq!(nic.objects(), before);
}
