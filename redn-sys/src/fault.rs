//! Failure injection for tests of code that drives a [`Nic`]: [`FailingNic`] wraps any NIC
//! and fails the Nth call that creates or changes something, so a test can fail every step
//! of a multi-step operation in turn and check what is left behind (with
//! [`Nic::objects`]) and the order things were released in.
//!
//! Releases are never failed: they are what such tests check.

use crate::mem::SharedBuffer;
use crate::nic::{
    CompChannel, Completion, CqConfig, MrInfo, Nic, ObjectCounts, QpConfig, QpCounters, QpInfo,
    RateLimit,
};
use crate::wqe::{Sge, WorkRequest};
use crate::{Access, Cqn, Error, Lkey, Pdn, QpState, Qpn, Result};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

/// A NIC whose `fail_at`-th creating or changing call (counted from 0 since [`FailingNic::arm`])
/// fails with an `InvalidConfig` error whose detail is "injected failure".
#[derive(Debug)]
pub struct FailingNic<N: Nic> {
    inner: N,
    calls: AtomicUsize,
    fail_at: AtomicUsize,
    /// Every release, in order.
    released: Mutex<Vec<Released>>,
    /// Asynchronous events are dropped (and counted) instead of handed out.
    lose_events: AtomicBool,
    lost_events: AtomicU64,
}

/// One release a [`FailingNic`] saw.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Released {
    /// `dealloc_pd`.
    Pd(Pdn),
    /// `dereg_mr`.
    Region(Lkey),
    /// `destroy_cq`.
    Cq(Cqn),
    /// `destroy_qp`.
    Qp(Qpn),
}

impl<N: Nic> FailingNic<N> {
    /// Wrap `inner`, failing nothing until armed.
    pub fn new(inner: N) -> FailingNic<N> {
        FailingNic {
            inner,
            calls: AtomicUsize::new(0),
            fail_at: AtomicUsize::new(usize::MAX),
            released: Mutex::new(Vec::new()),
            lose_events: AtomicBool::new(false),
            lost_events: AtomicU64::new(0),
        }
    }

    /// Drop every asynchronous event (`on`), counting each in
    /// [`Nic::async_events_lost`], as a NIC whose event queue overflowed would; or hand
    /// them out again.
    pub fn lose_async_events(&self, on: bool) {
        self.lose_events.store(on, Ordering::Relaxed);
    }

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
        self.released
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .push(r);
    }

    /// Count calls from zero again and fail the `n`-th (`usize::MAX`: none).
    pub fn arm(&self, n: usize) {
        self.calls.store(0, Ordering::Relaxed);
        self.fail_at.store(n, Ordering::Relaxed);
    }

    /// Creating or changing calls since [`FailingNic::arm`].
    pub fn calls(&self) -> usize {
        self.calls.load(Ordering::Relaxed)
    }

    /// The releases seen since the last [`FailingNic::take_released`], in order; the log
    /// starts again empty.
    pub fn take_released(&self) -> Vec<Released> {
        std::mem::take(
            &mut *self
                .released
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner),
        )
    }
}

impl<N: Nic> Nic for FailingNic<N> {
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
    fn get_async_event(&self) -> Option<crate::nic::AsyncEvent> {
        if self.lose_events.load(Ordering::Relaxed) {
            while self.inner.get_async_event().is_some() {
                self.lost_events.fetch_add(1, Ordering::Relaxed);
            }
            return None;
        }
        self.inner.get_async_event()
    }
    fn async_events_lost(&self) -> u64 {
        self.inner.async_events_lost() + self.lost_events.load(Ordering::Relaxed)
    }
}
