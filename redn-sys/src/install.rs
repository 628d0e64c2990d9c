//! Installing one client's instance of a program on a NIC, all or nothing.
//!
//! [`install`] creates the program's code region, CQs and queue pairs one after another
//! through the [`Nic`] trait, so every backend installs the same way. Each object it creates
//! goes into an `Objects` log as an owning handle ([`crate::handle`]); if a later step
//! fails, the log drops and releases everything made so far, newest first, so a refused or
//! failed install leaves the NIC exactly as it was. An [`Installed`] offload owns its log and
//! releases it the same way when removed or dropped.
//!
//! **Narrow keys.** No key covers the code region: each window that something may write (the
//! bytes of a WQE covered by the patch points of one source, a static block) gets a memory
//! region of its own, with only the rights its users need, in the protection domain of the
//! queues that use it ([`redn_program::program::CodeWindow`]). Each install has two
//! protection domains of its own: one for its worker queues (connected to themselves) and
//! one for its client-facing queue, which holds no code window with remote rights. So a
//! patched address can only move a write within a patch point — the NIC's bounds check
//! stops it at the window's edge — and a client that learns or guesses a key cannot use it on
//! code. Bound server memory is registered per install too: on the worker side with the
//! rights the program declares, on the client side with local rights only.

use crate::handle::{CompletionQueue, ProtectionDomain, QueuePair, RegisteredRegion};
use crate::mem::SharedBuffer;
use crate::nic::{CqConfig, MrInfo, Nic, QpConfig, QpInfo, RingPlacement};
use crate::program::{Bound, CodeWindow, Program, ProgramError, QueueRole, RegionRole, Resolver};
use crate::types::{Access, Cqn, Qpn, Rkey, VirtAddr};
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
    /// result. Every queue pair goes to error before any object goes, so no WQE of the
    /// install runs once the first of its queues or CQs is gone: none can enable or wait
    /// on a number after it is freed (numbers come back to other installs, in turn).
    fn release(&mut self) -> Result<(), Error> {
        for object in &self.0 {
            if let Owned::Qp(qp) = object {
                // A queue already gone or in error needs nothing; its destroy reports it.
                let _ = qp.set_error();
            }
        }
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
    /// Its first address as WQEs name it. No key covers all of it: see the module docs.
    pub code_addr: VirtAddr,
    /// The narrow keys over it: each code window with its registration.
    pub code_keys: Vec<(CodeWindow, MrInfo)>,
    /// The unmanaged queue that issued the entry enables.
    pub master: Qpn,
    /// Its CQ.
    pub master_cq: Cqn,
    /// The resolver used (addresses and keys), for listings and tests.
    pub resolver: Resolver,
    objects: Objects<N>,
    /// The client-facing queue's protection domain; dropped after everything in it.
    client_pd: Arc<ProtectionDomain<N>>,
    /// The worker queues' protection domain (made first, so dropped last).
    worker_pd: Arc<ProtectionDomain<N>>,
}

impl<N: Nic + ?Sized> fmt::Debug for Installed<N> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Installed")
            .field("worker_pd", &self.worker_pd)
            .field("client_pd", &self.client_pd)
            .field("qps", &self.qps.iter().map(|q| q.qpn).collect::<Vec<_>>())
            .field("cqs", &self.cqs)
            .field("code_addr", &self.code_addr)
            .field("code_keys", &self.code_keys)
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

    /// The protection domain of the queues of `side`.
    pub fn pd(&self, side: QueueRole) -> &Arc<ProtectionDomain<N>> {
        match side {
            QueueRole::Worker => &self.worker_pd,
            QueueRole::Client => &self.client_pd,
        }
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

/// How a region the program declares is bound for one install.
#[derive(Clone, Debug)]
#[non_exhaustive]
pub enum RegionBinding {
    /// Server memory (an app's region, for a data region of the program): the installer
    /// registers it in the install's own protection domains, on the worker side with the
    /// rights both the program declares and `access` grants, on the client side with local
    /// rights only.
    Local {
        /// The memory.
        buffer: Arc<SharedBuffer>,
        /// First byte bound.
        offset: usize,
        /// Bytes bound.
        len: usize,
        /// The most the client's grant allows.
        access: Access,
    },
    /// Memory of the remote client (for the program's response region), as its connection
    /// names it.
    Remote {
        /// First address.
        addr: VirtAddr,
        /// The client's key for it.
        rkey: Rkey,
        /// Bytes.
        len: u64,
    },
}

impl RegionBinding {
    fn len(&self) -> u64 {
        match self {
            RegionBinding::Local { len, .. } => *len as u64,
            RegionBinding::Remote { len, .. } => *len,
        }
    }
}

/// Lay out `program` in a fresh code region, create its queues in two protection domains of
/// its own (worker queues, client-facing queue) on `nic`, register its code windows and
/// bound regions with narrow keys (see the module docs), write its WQEs and receives,
/// connect its worker queues to themselves and its client-facing queue through
/// `connect_client`, and issue its entry enables.
///
/// `regions` binds every region the program declares. The caller (the manager) decides what
/// each client may reach; the program cannot name anything else.
///
/// All or nothing: if any step fails, every object this call created has been released when
/// it returns the error.
pub fn install<N: Nic + ?Sized>(
    nic: &Arc<N>,
    program: &Program,
    regions: &HashMap<String, RegionBinding>,
    connect_client: &mut dyn FnMut(Qpn) -> Result<(), Error>,
) -> Result<Installed<N>, Error> {
    check_bindings(program, regions)?;
    let layout = program.layout().map_err(program_err)?;
    let windows = program.code_windows(&layout).map_err(program_err)?;
    let worker_pd = ProtectionDomain::alloc(nic)?;
    let client_pd = ProtectionDomain::alloc(nic)?;
    let pd_of = |side| match side {
        QueueRole::Worker => &worker_pd,
        QueueRole::Client => &client_pd,
    };
    let code = SharedBuffer::new(layout.len);
    let code_addr = code.addr();
    let mut objects = Objects(Vec::new());
    let mut code_keys = Vec::new();
    let mut window_keys = Vec::new();
    for w in windows {
        let mr = RegisteredRegion::register(pd_of(w.side), &code, w.offset, w.len, w.access)?;
        window_keys.push((w.clone(), mr.info().lkey.0));
        code_keys.push((w, mr.info().clone()));
        objects.0.push(Owned::Region(mr));
    }
    let mut bound = HashMap::new();
    for decl in &program.regions {
        // check_bindings saw every declared region bound.
        let Some(binding) = regions.get(&decl.name) else {
            continue;
        };
        match (binding, &decl.role) {
            (
                RegionBinding::Local {
                    buffer,
                    offset,
                    len,
                    access: granted,
                },
                RegionRole::Data { access: declared },
            ) => {
                let both = |a: Access, b: Access| Access::from_bits_truncate(a.bits() & b.bits());
                let rights = both(*declared, *granted);
                let local = both(rights, Access::LOCAL_WRITE);
                // ibv_reg_mr(3): remote write and atomic rights need local write.
                let worker = if rights.contains(Access::REMOTE_WRITE)
                    || rights.contains(Access::REMOTE_ATOMIC)
                {
                    rights | Access::LOCAL_WRITE
                } else {
                    rights
                };
                for (side, rights) in [(QueueRole::Worker, worker), (QueueRole::Client, local)] {
                    let mr =
                        RegisteredRegion::register(pd_of(side), buffer, *offset, *len, rights)?;
                    let info = mr.info();
                    bound.insert(
                        (side, decl.name.clone()),
                        Bound {
                            addr: info.addr,
                            key: info.lkey.0,
                            len: info.len,
                        },
                    );
                    objects.0.push(Owned::Region(mr));
                }
            }
            (RegionBinding::Remote { addr, rkey, len }, RegionRole::Response) => {
                bound.insert(
                    (QueueRole::Client, decl.name.clone()),
                    Bound {
                        addr: *addr,
                        key: rkey.0,
                        len: *len,
                    },
                );
            }
            _ => {
                return Err(Error::InvalidConfig {
                    what: "region binding",
                    detail: format!(
                        "region {:?} of program {} is {}: bind it as {}",
                        decl.name,
                        program.name,
                        match decl.role {
                            RegionRole::Data { .. } => "server memory",
                            RegionRole::Response => "the client's response buffer",
                        },
                        match decl.role {
                            RegionRole::Data { .. } => "RegionBinding::Local",
                            RegionRole::Response => "RegionBinding::Remote",
                        }
                    ),
                })
            }
        }
    }
    let mut qps = Vec::new();
    let mut cqs = Vec::new();
    for (i, q) in program.queues.iter().enumerate() {
        let mut cq_config = CqConfig::counted(1024);
        // The client-facing queue's receive completions stamp when each trigger arrived
        // (the manager's `TriggerTimes`); the workers' CQs are only counted.
        cq_config.timestamps = q.role == QueueRole::Client;
        let cq = CompletionQueue::create(nic, cq_config)?;
        objects.0.push(Owned::Cq(Arc::clone(&cq)));
        let pd = pd_of(q.role);
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
    let resolver = Resolver::new(
        program,
        code_addr,
        layout,
        window_keys,
        bound,
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
    // The master only enables (SEND_EN, RECV_EN): it names no memory.
    let master_qp = QueuePair::create(
        &worker_pd,
        &master_cq,
        &master_cq,
        QpConfig::new(worker_pd.pdn(), master_cq.cqn()),
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
        code_addr,
        code_keys,
        master,
        master_cq: master_cq.cqn(),
        resolver,
        objects,
        client_pd,
        worker_pd,
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
    regions: &HashMap<String, RegionBinding>,
) -> Result<(), Error> {
    for r in &program.regions {
        match regions.get(&r.name).map(RegionBinding::len) {
            None => {
                return Err(Error::InvalidConfig {
                    what: "region binding",
                    detail: format!("program {} needs region {:?}", program.name, r.name),
                })
            }
            Some(len) if len < r.min_len => {
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
