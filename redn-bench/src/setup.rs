//! What a benchmark runs on: loopback queue pairs, CQs that WAITs count, registered regions.

use crate::Ctx;
use redn_sys::conv::idx;
use redn_sys::mem::SharedBuffer;
use redn_sys::nic::{CqConfig, MrInfo, Nic, QpConfig, QpInfo};
use redn_sys::softnic::SoftNic;
use redn_sys::{Access, Cqn, Pdn};
use std::sync::Arc;

/// A CQ counted by WAITs and never polled, so it may wrap.
pub fn counting_cq(nic: &SoftNic) -> Result<Cqn, String> {
    nic.create_cq(CqConfig::counted(4096)).ctx("create_cq")
}

/// A QP connected to itself (its WQEs' remote side is its own NIC) on PU `pu`, completing
/// into `cq`, with a send ring of `sq_bbs` BBs; `managed`: a managed send queue, which runs
/// only what a SEND_EN enabled.
pub fn loopback_qp(
    nic: &SoftNic,
    pd: Pdn,
    cq: Cqn,
    pu: usize,
    sq_bbs: u32,
    managed: bool,
) -> Result<QpInfo, String> {
    let mut c = QpConfig::new(pd, cq);
    c.sq_bbs = sq_bbs;
    c.pu = Some(pu);
    c.managed_send = managed;
    let info = nic.create_qp(c).ctx("create_qp")?;
    nic.connect(info.qpn, info.qpn).ctx("connect")?;
    Ok(info)
}

/// A buffer registered as one memory region.
#[derive(Debug)]
pub struct Region {
    /// The buffer.
    pub buf: Arc<SharedBuffer>,
    /// Its registration.
    pub mr: MrInfo,
}

impl Region {
    /// `len` zeroed bytes registered on `nic` in `pd` with `access`.
    pub fn new(nic: &SoftNic, pd: Pdn, len: usize, access: Access) -> Result<Region, String> {
        let buf = SharedBuffer::new(len);
        let mr = nic.reg_mr(pd, &buf, 0, len, access).ctx("reg_mr")?;
        Ok(Region { buf, mr })
    }

    /// `len` bytes, byte `i` set to `fill(i)`, registered with all rights.
    pub fn filled(
        nic: &SoftNic,
        pd: Pdn,
        len: usize,
        fill: impl Fn(usize) -> u8,
    ) -> Result<Region, String> {
        let buf = SharedBuffer::new(len);
        let bytes: Vec<u8> = (0..len).map(fill).collect();
        buf.write(0, &bytes);
        let mr = nic.reg_mr(pd, &buf, 0, len, Access::ALL).ctx("reg_mr")?;
        Ok(Region { buf, mr })
    }

    /// `len` bytes from offset `off`.
    pub fn read(&self, off: u64, len: usize) -> Vec<u8> {
        let mut v = vec![0u8; len];
        self.buf.read(idx(off), &mut v);
        v
    }

    /// All the region's bytes.
    pub fn bytes(&self) -> Vec<u8> {
        self.read(0, idx(self.mr.len))
    }

    /// Write `data` at offset `off`.
    pub fn write(&self, off: u64, data: &[u8]) {
        self.buf.write(idx(off), data);
    }

    /// The address of offset `off`, as WQEs name it.
    pub fn addr(&self, off: u64) -> u64 {
        self.mr.addr.0 + off
    }
}
