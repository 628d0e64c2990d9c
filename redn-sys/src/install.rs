//! Installing one client's instance of a program on a softnic.

use crate::program::{Bound, Program, ProgramError, QueueRole, Resolver};
use crate::mem::SharedBuffer;
use crate::nic::{CqConfig, MrInfo, Nic, QpConfig, QpInfo, RingPlacement};
use crate::softnic::SoftNic;
use crate::types::{Access, Lkey, Pdn, Qpn};
use crate::wqe::{WorkRequest, WqeFlags, WrOp};
use crate::Error;
use std::collections::HashMap;
use std::sync::Arc;

/// A program running for one client.
#[derive(Debug)]
pub struct Installed {
    /// The program's queues, in program order.
    pub qps: Vec<QpInfo>,
    /// Each queue's CQ.
    pub cqs: Vec<crate::Cqn>,
    /// The code region (rings and static blocks).
    pub code: Arc<SharedBuffer>,
    /// Its registration.
    pub code_mr: MrInfo,
    /// The unmanaged queue that issued the entry enables.
    pub master: Qpn,
    /// Its CQ.
    pub master_cq: crate::Cqn,
    /// The resolver used (addresses and keys), for listings and tests.
    pub resolver: Resolver,
}

impl Installed {
    /// The queue called `name`.
    pub fn qp(&self, program: &Program, name: &str) -> Option<Qpn> {
        program.queue(name).map(|(i, _)| self.qps[i].qpn)
    }

    /// Tear down: queues to error and destroyed, then their CQs, then the code region.
    pub fn remove(self, nic: &SoftNic) -> Result<(), Error> {
        for q in self.qps.iter().map(|q| q.qpn).chain([self.master]) {
            nic.destroy_qp(q)?;
        }
        for cq in self.cqs.iter().chain([&self.master_cq]) {
            nic.destroy_cq(*cq)?;
        }
        nic.dereg_mr(self.code_mr.lkey)?;
        Ok(())
    }
}

fn program_err(e: ProgramError) -> Error {
    Error::InvalidConfig {
        what: "offload program",
        detail: e.to_string(),
    }
}

/// Lay out `program` in a fresh code region, create its queues on `nic` in `pd`, write its
/// WQEs and receives, connect its worker queues to themselves and its client-facing queue
/// through `connect_client`, and issue its entry enables.
///
/// `regions` binds every region the program declares: (address, key, length). The caller
/// (the manager) decides what each client may reach; the program cannot name anything else.
pub fn install(
    nic: &SoftNic,
    pd: Pdn,
    program: &Program,
    regions: &HashMap<String, (crate::VirtAddr, Lkey, u64)>,
    connect_client: &mut dyn FnMut(Qpn) -> Result<(), Error>,
) -> Result<Installed, Error> {
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
    let layout = program.layout().map_err(program_err)?;
    let code = SharedBuffer::new(layout.len);
    let code_mr = nic.reg_mr(pd, &code, 0, code.len(), Access::ALL)?;
    let mut qps = Vec::new();
    let mut cqs = Vec::new();
    for (i, q) in program.queues.iter().enumerate() {
        let cq = nic.create_cq(CqConfig {
            depth: 1024,
            ignore_overrun: true,
        })?;
        let mut cfg = QpConfig::new(pd, cq);
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
        qps.push(nic.create_qp(cfg)?);
        cqs.push(cq);
    }
    let resolver = Resolver::new(
        program,
        Bound {
            addr: code_mr.addr,
            key: code_mr.lkey.0,
            len: code_mr.len,
        },
        layout,
        regions
            .iter()
            .map(|(k, (a, key, len))| {
                (
                    k.clone(),
                    Bound {
                        addr: *a,
                        key: key.0,
                        len: *len,
                    },
                )
            })
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
    let master_cq = nic.create_cq(CqConfig::default())?;
    let master = nic.create_qp(QpConfig::new(pd, master_cq))?.qpn;
    nic.connect(master, master)?;
    let mut enables = Vec::new();
    for (name, count) in &program.entry {
        let (i, q) = program.queue(name).ok_or_else(|| {
            program_err(ProgramError::Unknown {
                kind: "queue",
                name: name.clone(),
            })
        })?;
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
        let (i, _) = program.queue(name).ok_or_else(|| {
            program_err(ProgramError::Unknown {
                kind: "queue",
                name: name.clone(),
            })
        })?;
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
        master_cq,
        resolver,
    })
}
