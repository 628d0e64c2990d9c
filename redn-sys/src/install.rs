//! Installing one client's instance of a program on a NIC, all or nothing.
//!
//! [`install`] creates the program's code region, CQs and queue pairs one after another
//! through the [`Nic`] trait, so every backend installs the same way. Each object it creates
//! goes into an [`Objects`] log as an owning handle ([`crate::handle`]); if a later step
//! fails, the log drops and releases everything made so far, newest first, so a refused or
//! failed install leaves the NIC exactly as it was. An [`Installed`] offload owns its log and
//! releases it the same way when removed or dropped.

use crate::handle::{CompletionQueue, ProtectionDomain, QueuePair, RegisteredRegion};
use crate::mem::SharedBuffer;
use crate::nic::{CqConfig, MrInfo, Nic, QpConfig, QpInfo, RingPlacement};
use crate::program::{Bound, Program, ProgramError, QueueRole, Resolver};
use crate::types::{Access, Cqn, Lkey, Qpn, VirtAddr};
use crate::wqe::{WorkRequest, WqeFlags, WrOp};
use crate::Error;
use std::collections::HashMap;
use std::fmt;
use std::sync::Arc;

/// One object an install created, owned.
enum Owned<N: Nic + ?Sized> {
    Region(RegisteredRegion<N>),
    Cq(Arc<CompletionQueue<N>>),
    Qp(QueuePair<N>),
}

/// The objects an install created, in creation order; released newest first, so a queue
/// pair goes before the CQs and region it uses.
struct Objects<N: Nic + ?Sized>(Vec<Owned<N>>);

impl<N: Nic + ?Sized> Objects<N> {
    /// Release every object, newest first, going on past failures; the first failure is the
    /// result.
    fn release(&mut self) -> Result<(), Error> {
        let mut result = Ok(());
        while let Some(object) = self.0.pop() {
            let released = match object {
                Owned::Qp(qp) => qp.release(),
                Owned::Region(mr) => mr.release(),
                // A CQ a queue pair still holds goes with that queue pair.
                Owned::Cq(cq) => Arc::try_unwrap(cq).map_or(Ok(()), CompletionQueue::release),
            };
            if result.is_ok() {
                result = released;
            }
        }
        result
    }
}

impl<N: Nic + ?Sized> Drop for Objects<N> {
    fn drop(&mut self) {
        // Errors cannot be reported from here; `Installed::remove` reports them.
        let _ = self.release();
    }
}

/// A program running for one client. It owns the objects it runs on and releases them when
/// [removed](Installed::remove) or dropped.
#[must_use = "dropping an installed offload tears it down"]
pub struct Installed<N: Nic + ?Sized> {
    /// The program's queues, in program order.
    pub qps: Vec<QpInfo>,
    /// Each queue's CQ.
    pub cqs: Vec<Cqn>,
    /// The code region (rings and static blocks).
    pub code: Arc<SharedBuffer>,
    /// Its registration.
    pub code_mr: MrInfo,
    /// The unmanaged queue that issued the entry enables.
    pub master: Qpn,
    /// Its CQ.
    pub master_cq: Cqn,
    /// The resolver used (addresses and keys), for listings and tests.
    pub resolver: Resolver,
    objects: Objects<N>,
    /// Kept so the protection domain outlives everything in it, whatever the caller drops.
    pd: Arc<ProtectionDomain<N>>,
}

impl<N: Nic + ?Sized> fmt::Debug for Installed<N> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Installed")
            .field("pd", &self.pd)
            .field("qps", &self.qps.iter().map(|q| q.qpn).collect::<Vec<_>>())
            .field("cqs", &self.cqs)
            .field("code_mr", &self.code_mr)
            .field("master", &self.master)
            .field("master_cq", &self.master_cq)
            .finish_non_exhaustive()
    }
}

impl<N: Nic + ?Sized> Installed<N> {
    /// The queue called `name`.
    pub fn qp(&self, program: &Program, name: &str) -> Option<Qpn> {
        program.queue(name).map(|(i, _)| self.qps[i].qpn)
    }

    /// Tear down now: the master queue and the program's queues (newest first) to error and
    /// destroyed, then their CQs, then the code region. Everything is released even if one
    /// release fails; the first failure is returned.
    pub fn remove(mut self) -> Result<(), Error> {
        self.objects.release()
    }
}

fn program_err(e: ProgramError) -> Error {
    Error::InvalidConfig {
        what: "offload program",
        detail: e.to_string(),
    }
}

/// Lay out `program` in a fresh code region, create its queues in `pd`, write its WQEs and
/// receives, connect its worker queues to themselves and its client-facing queue through
/// `connect_client`, and issue its entry enables.
///
/// `regions` binds every region the program declares: (address, key, length). The caller
/// (the manager) decides what each client may reach; the program cannot name anything else.
///
/// All or nothing: if any step fails, every object this call created has been released when
/// it returns the error.
pub fn install<N: Nic + ?Sized>(
    pd: &Arc<ProtectionDomain<N>>,
    program: &Program,
    regions: &HashMap<String, (VirtAddr, Lkey, u64)>,
    connect_client: &mut dyn FnMut(Qpn) -> Result<(), Error>,
) -> Result<Installed<N>, Error> {
    check_bindings(program, regions)?;
    let nic = pd.nic();
    let layout = program.layout().map_err(program_err)?;
    let code = SharedBuffer::new(layout.len);
    let mut objects = Objects(Vec::new());
    let code_region = RegisteredRegion::register(pd, &code, 0, code.len(), Access::ALL)?;
    let code_mr = code_region.info().clone();
    objects.0.push(Owned::Region(code_region));
    let mut qps = Vec::new();
    let mut cqs = Vec::new();
    for (i, q) in program.queues.iter().enumerate() {
        let cq = CompletionQueue::create(
            nic,
            CqConfig {
                depth: 1024,
                ignore_overrun: true,
            },
        )?;
        objects.0.push(Owned::Cq(Arc::clone(&cq)));
        let mut cfg = QpConfig::new(pd.pdn(), cq.cqn());
        cfg.sq_bbs = q.sq_bbs;
        cfg.rq_slots = q.rq_slots;
        cfg.rq_sges = q.rq_sges;
        cfg.managed_send = q.managed_send;
        cfg.managed_recv = q.managed_recv;
        cfg.pu = q.pu;
        cfg.sq_placement = Some(RingPlacement {
            buffer: Arc::clone(&code),
            offset: layout.sq[i],
        });
        cfg.rq_placement = Some(RingPlacement {
            buffer: Arc::clone(&code),
            offset: layout.rq[i],
        });
        let qp = QueuePair::create(pd, &cq, &cq, cfg)?;
        qps.push(qp.info().clone());
        cqs.push(cq.cqn());
        objects.0.push(Owned::Qp(qp));
    }
    let bound = |addr, key: Lkey, len| Bound {
        addr,
        key: key.0,
        len,
    };
    let resolver = Resolver::new(
        program,
        bound(code_mr.addr, code_mr.lkey, code_mr.len),
        layout,
        regions
            .iter()
            .map(|(name, (addr, key, len))| (name.clone(), bound(*addr, *key, *len)))
            .collect(),
        qps.iter().zip(&cqs).map(|(q, c)| (q.qpn, *c)).collect(),
    );
    let rendered = program.render(&resolver).map_err(program_err)?;
    // The rings are written before anything can run: no queue is connected yet.
    code.write(0, &rendered.code);
    for (i, q) in program.queues.iter().enumerate() {
        let qpn = qps[i].qpn;
        nic.note_posted(qpn, 0, rendered.posted[i], 0)?;
        nic.note_recvs_posted(qpn, rendered.recvs[i])?;
        match q.role {
            QueueRole::Worker => nic.connect(qpn, qpn)?,
            QueueRole::Client => connect_client(qpn)?,
        }
    }
    let master_cq = CompletionQueue::create(nic, CqConfig::default())?;
    objects.0.push(Owned::Cq(Arc::clone(&master_cq)));
    let master_qp = QueuePair::create(
        pd,
        &master_cq,
        &master_cq,
        QpConfig::new(pd.pdn(), master_cq.cqn()),
    )?;
    let master = master_qp.qpn();
    objects.0.push(Owned::Qp(master_qp));
    nic.connect(master, master)?;
    let mut enables = Vec::new();
    for (name, count) in &program.entry {
        let (i, q) = queue_index(program, name)?;
        let qpn = qps[i].qpn;
        if q.managed_send {
            enables.push(WorkRequest {
                wr_id: 0,
                flags: WqeFlags::NONE,
                op: WrOp::SendEnable {
                    qp: qpn,
                    pi: *count,
                },
            });
        } else {
            nic.ring_doorbell(qpn, u64::from(*count))?;
        }
    }
    for (name, count) in &program.recv_entry {
        let (i, _) = queue_index(program, name)?;
        enables.push(WorkRequest {
            wr_id: 0,
            flags: WqeFlags::NONE,
            op: WrOp::RecvEnable {
                qp: qps[i].qpn,
                pi: *count,
            },
        });
    }
    if !enables.is_empty() {
        nic.post_send(master, &enables)?;
    }
    Ok(Installed {
        qps,
        cqs,
        code,
        code_mr,
        master,
        master_cq: master_cq.cqn(),
        resolver,
        objects,
        pd: Arc::clone(pd),
    })
}

/// The queue called `name`, with its index.
fn queue_index<'p>(
    program: &'p Program,
    name: &str,
) -> Result<(usize, &'p crate::program::Queue), Error> {
    program.queue(name).ok_or_else(|| {
        program_err(ProgramError::Unknown {
            kind: "queue",
            name: name.to_string(),
        })
    })
}

/// Every region the program declares is bound, and long enough.
fn check_bindings(
    program: &Program,
    regions: &HashMap<String, (VirtAddr, Lkey, u64)>,
) -> Result<(), Error> {
    for r in &program.regions {
        match regions.get(&r.name) {
            None => {
                return Err(Error::InvalidConfig {
                    what: "region binding",
                    detail: format!("program {} needs region {:?}", program.name, r.name),
                })
            }
            Some((_, _, len)) if *len < r.min_len => {
                return Err(Error::InvalidConfig {
                    what: "region binding",
                    detail: format!(
                        "region {:?} has {len} bytes, program {} needs at least {}",
                        r.name, program.name, r.min_len
                    ),
                })
            }
            Some(_) => {}
        }
    }
    Ok(())
}
