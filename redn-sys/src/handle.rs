//! Owned NIC objects: a handle per protection domain, region, CQ and queue pair that releases
//! its object when the last reference to it drops.
//!
//! The numbers a [`Nic`] hands out (`Pdn`, `Lkey`, `Cqn`, `Qpn`) are plain data and release
//! nothing; a manager that installs offloads for many clients for months must not leak one
//! when an install fails half-way or an offload is removed. These handles make release a
//! matter of ownership: a queue pair holds its protection domain and CQs alive (as
//! rust-ibverbs' queue pairs do), a region holds its protection domain, so whatever order the
//! owners drop in, an object goes only after everything that uses it. Each handle holds an
//! `Arc` of its NIC, so an owner needs no lifetime tied to the NIC.
//!
//! Releasing in `Drop` cannot report an error. It can only fail if something other than the
//! handle released the object first (the handle is its only owner, and its users are gone by
//! construction), so the error is dropped; [`crate::install::Installed::remove`] releases
//! explicitly and reports.

use crate::mem::SharedBuffer;
use crate::nic::{CqConfig, MrInfo, Nic, QpConfig, QpInfo};
use crate::types::{Access, Cqn, Pdn, Qpn};
use crate::Result;
use std::fmt;
use std::sync::Arc;

/// A protection domain, deallocated when the last handle (or region or queue pair in it) drops.
#[must_use = "dropping the handle deallocates the protection domain"]
pub struct ProtectionDomain<N: Nic + ?Sized> {
    nic: Arc<N>,
    pdn: Pdn,
}

impl<N: Nic + ?Sized> ProtectionDomain<N> {
    /// Allocate a protection domain on `nic`.
    pub fn alloc(nic: &Arc<N>) -> Result<Arc<ProtectionDomain<N>>> {
        let pdn = nic.alloc_pd()?;
        Ok(Arc::new(ProtectionDomain {
            nic: Arc::clone(nic),
            pdn,
        }))
    }

    /// Its number.
    pub fn pdn(&self) -> Pdn {
        self.pdn
    }

    /// The NIC it lives on.
    pub fn nic(&self) -> &Arc<N> {
        &self.nic
    }
}

impl<N: Nic + ?Sized> Drop for ProtectionDomain<N> {
    fn drop(&mut self) {
        // See the module docs: only a release by someone else could make this fail.
        let _ = self.nic.dealloc_pd(self.pdn);
    }
}

impl<N: Nic + ?Sized> fmt::Debug for ProtectionDomain<N> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "ProtectionDomain({} on {})", self.pdn, self.nic.name())
    }
}

/// A registered memory region, deregistered when dropped (its keys stop working at once). It
/// keeps its protection domain alive.
#[must_use = "dropping the handle deregisters the region"]
pub struct RegisteredRegion<N: Nic + ?Sized> {
    pd: Arc<ProtectionDomain<N>>,
    info: MrInfo,
    /// Set by [`RegisteredRegion::release`], which has deregistered it already.
    released: bool,
}

impl<N: Nic + ?Sized> RegisteredRegion<N> {
    /// Register `len` bytes of `buffer` from `offset` in `pd` with `access`.
    pub fn register(
        pd: &Arc<ProtectionDomain<N>>,
        buffer: &Arc<SharedBuffer>,
        offset: usize,
        len: usize,
        access: Access,
    ) -> Result<RegisteredRegion<N>> {
        let info = pd.nic.reg_mr(pd.pdn, buffer, offset, len, access)?;
        Ok(RegisteredRegion {
            pd: Arc::clone(pd),
            info,
            released: false,
        })
    }

    /// Its key, extent and rights.
    pub fn info(&self) -> &MrInfo {
        &self.info
    }

    /// Deregister now and say whether the NIC agreed.
    pub fn release(mut self) -> Result<()> {
        self.released = true;
        self.pd.nic.dereg_mr(self.info.lkey)
    }
}

impl<N: Nic + ?Sized> Drop for RegisteredRegion<N> {
    fn drop(&mut self) {
        if !self.released {
            // See the module docs: only a release by someone else could make this fail.
            let _ = self.pd.nic.dereg_mr(self.info.lkey);
        }
    }
}

impl<N: Nic + ?Sized> fmt::Debug for RegisteredRegion<N> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RegisteredRegion")
            .field("pd", &self.pd.pdn)
            .field("info", &self.info)
            .finish()
    }
}

/// A completion queue, destroyed when the last handle (or queue pair using it) drops.
#[must_use = "dropping the handle destroys the completion queue"]
pub struct CompletionQueue<N: Nic + ?Sized> {
    nic: Arc<N>,
    cqn: Cqn,
    /// Set by [`CompletionQueue::release`], which has destroyed it already.
    released: bool,
}

impl<N: Nic + ?Sized> CompletionQueue<N> {
    /// Create a completion queue on `nic`.
    pub fn create(nic: &Arc<N>, cfg: CqConfig) -> Result<Arc<CompletionQueue<N>>> {
        let cqn = nic.create_cq(cfg)?;
        Ok(Arc::new(CompletionQueue {
            nic: Arc::clone(nic),
            cqn,
            released: false,
        }))
    }

    /// Its number.
    pub fn cqn(&self) -> Cqn {
        self.cqn
    }

    /// Destroy now and say whether the NIC agreed (it refuses while a queue pair uses it).
    pub fn release(mut self) -> Result<()> {
        self.released = true;
        self.nic.destroy_cq(self.cqn)
    }
}

impl<N: Nic + ?Sized> Drop for CompletionQueue<N> {
    fn drop(&mut self) {
        if !self.released {
            // See the module docs: only a release by someone else could make this fail.
            let _ = self.nic.destroy_cq(self.cqn);
        }
    }
}

impl<N: Nic + ?Sized> fmt::Debug for CompletionQueue<N> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "CompletionQueue({} on {})", self.cqn, self.nic.name())
    }
}

/// A queue pair, destroyed (moved to error, then removed) when dropped. It keeps its
/// protection domain and both CQs alive, so they go only after it.
#[must_use = "dropping the handle destroys the queue pair"]
pub struct QueuePair<N: Nic + ?Sized> {
    pd: Arc<ProtectionDomain<N>>,
    send_cq: Arc<CompletionQueue<N>>,
    recv_cq: Arc<CompletionQueue<N>>,
    info: QpInfo,
    /// Set by [`QueuePair::release`], which has destroyed it already.
    released: bool,
}

impl<N: Nic + ?Sized> QueuePair<N> {
    /// Create a queue pair in `pd` whose completions go to `send_cq` and `recv_cq`. The
    /// protection domain and CQ numbers in `cfg` are set from the handles.
    pub fn create(
        pd: &Arc<ProtectionDomain<N>>,
        send_cq: &Arc<CompletionQueue<N>>,
        recv_cq: &Arc<CompletionQueue<N>>,
        mut cfg: QpConfig,
    ) -> Result<QueuePair<N>> {
        cfg.pd = pd.pdn;
        cfg.send_cq = send_cq.cqn;
        cfg.recv_cq = recv_cq.cqn;
        let info = pd.nic.create_qp(cfg)?;
        Ok(QueuePair {
            pd: Arc::clone(pd),
            send_cq: Arc::clone(send_cq),
            recv_cq: Arc::clone(recv_cq),
            info,
            released: false,
        })
    }

    /// Its number.
    pub fn qpn(&self) -> Qpn {
        self.info.qpn
    }

    /// Its number, rings and PU.
    pub fn info(&self) -> &QpInfo {
        &self.info
    }

    /// The CQ its send completions go to.
    pub fn send_cq(&self) -> &Arc<CompletionQueue<N>> {
        &self.send_cq
    }

    /// The CQ its receive completions go to.
    pub fn recv_cq(&self) -> &Arc<CompletionQueue<N>> {
        &self.recv_cq
    }

    /// Move it to the error state: nothing more runs on it (what is posted is flushed).
    pub fn set_error(&self) -> Result<()> {
        self.pd.nic.set_qp_error(self.info.qpn)
    }

    /// Destroy now and say whether the NIC agreed. Its CQs and protection domain are
    /// released after it if this was their last user.
    pub fn release(mut self) -> Result<()> {
        self.released = true;
        self.pd.nic.destroy_qp(self.info.qpn)
    }
}

impl<N: Nic + ?Sized> Drop for QueuePair<N> {
    fn drop(&mut self) {
        if !self.released {
            // See the module docs: only a release by someone else could make this fail. The
            // fields (CQs, PD) drop after this, so they outlive the queue pair.
            let _ = self.pd.nic.destroy_qp(self.info.qpn);
        }
    }
}

impl<N: Nic + ?Sized> fmt::Debug for QueuePair<N> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("QueuePair")
            .field("qpn", &self.info.qpn)
            .field("pd", &self.pd.pdn)
            .field("send_cq", &self.send_cq.cqn)
            .field("recv_cq", &self.recv_cq.cqn)
            .finish()
    }
}
