//! Helpers shared by the softnic tests: a loopback or two-NIC setup with registered buffers.
#![allow(dead_code)]

use redn_sys::mem::SharedBuffer;
use redn_sys::nic::{Completion, CqConfig, MrInfo, Nic, QpConfig, QpInfo};
use redn_sys::softnic::{Prefetch, SoftNic, SoftNicConfig};
use redn_sys::wqe::{WorkRequest, WqeFlags, WrOp};
use redn_sys::{Access, Cqn, Pdn};
use std::sync::Arc;
use std::time::{Duration, Instant};

pub fn nic(pus: usize, prefetch: Prefetch) -> SoftNic {
    SoftNic::new(SoftNicConfig {
        name: "test".into(),
        pus,
        prefetch,
        wqe_checks: false,
    })
    .unwrap()
}

/// A registered buffer.
pub struct Region {
    pub buf: Arc<SharedBuffer>,
    pub mr: MrInfo,
}

impl Region {
    pub fn new(nic: &SoftNic, pd: Pdn, len: usize, access: Access) -> Region {
        let buf = SharedBuffer::new(len);
        let mr = nic.reg_mr(pd, &buf, 0, len, access).unwrap();
        Region { buf, mr }
    }

    pub fn read(&self, off: usize, len: usize) -> Vec<u8> {
        let mut v = vec![0u8; len];
        self.buf.read(off, &mut v);
        v
    }

    pub fn write(&self, off: usize, data: &[u8]) {
        self.buf.write(off, data);
    }
}

/// One queue pair with its own CQ.
pub struct Endpoint {
    pub pd: Pdn,
    pub cq: Cqn,
    pub qp: QpInfo,
}

pub fn endpoint(nic: &SoftNic, pd: Pdn, cfg: impl FnOnce(&mut QpConfig)) -> Endpoint {
    let cq = nic
        .create_cq(CqConfig {
            depth: 4096,
            ignore_overrun: false,
        })
        .unwrap();
    let mut c = QpConfig::new(pd, cq);
    cfg(&mut c);
    let qp = nic.create_qp(c).unwrap();
    Endpoint { pd, cq, qp }
}

/// Poll `cq` until `n` completions arrived or 5 s passed.
pub fn wait_cqes(nic: &dyn Nic, cq: Cqn, n: usize) -> Vec<Completion> {
    let mut out = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(5);
    while out.len() < n {
        nic.poll_cq(cq, n - out.len(), &mut out).unwrap();
        if Instant::now() > deadline {
            panic!("timed out: {} of {n} completions on {cq}: {out:?}", out.len());
        }
        std::thread::yield_now();
    }
    out
}

/// Assert no completion shows up on `cq` within `ms` milliseconds.
pub fn expect_no_cqe(nic: &dyn Nic, cq: Cqn, ms: u64) {
    let mut out = Vec::new();
    let deadline = Instant::now() + Duration::from_millis(ms);
    while Instant::now() < deadline {
        nic.poll_cq(cq, 16, &mut out).unwrap();
        assert!(out.is_empty(), "unexpected completions: {out:?}");
        std::thread::sleep(Duration::from_millis(1));
    }
}

pub fn wr(wr_id: u64, flags: WqeFlags, op: WrOp) -> WorkRequest {
    WorkRequest { wr_id, flags, op }
}

pub const SIG: WqeFlags = WqeFlags::SIGNALED;
pub const ALL: Access = Access::ALL;
