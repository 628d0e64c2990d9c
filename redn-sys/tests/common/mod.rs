//! Helpers shared by the softnic tests: a loopback or two-NIC setup with registered buffers.
#![allow(dead_code)]

use redn_program::wqe::{WorkRequest, WqeFlags, WrOp};
use redn_sys::install::{Installed, RegionBinding};
use redn_sys::mem::SharedBuffer;
use redn_sys::nic::{Completion, CqConfig, MrInfo, Nic, QpConfig, QpInfo};
use redn_sys::softnic::{Prefetch, SoftNic, SoftNicConfig};
use redn_sys::{Access, Cqn, Pdn};
use std::sync::Arc;
use std::time::{Duration, Instant};

pub fn nic(pus: usize, prefetch: Prefetch) -> SoftNic {
    let mut cfg = SoftNicConfig::new("test");
    cfg.pus = pus;
    cfg.prefetch = prefetch;
    SoftNic::new(cfg).unwrap()
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
    let cq = nic.create_cq(CqConfig::new(4096)).unwrap();
    let mut c = QpConfig::new(pd, cq);
    cfg(&mut c);
    let qp = nic.create_qp(c).unwrap();
    Endpoint { pd, cq, qp }
}

/// How long a wait for something that should happen may take before the test fails as hung:
/// seconds natively, minutes under Miri (which runs a WQE in milliseconds).
pub fn patience(secs: u64) -> Duration {
    Duration::from_secs(if cfg!(miri) { secs * 30 } else { secs })
}

/// Poll `cq` until `n` completions arrived or 5 s passed (see [`patience`]).
pub fn wait_cqes(nic: &dyn Nic, cq: Cqn, n: usize) -> Vec<Completion> {
    let mut out = Vec::new();
    let deadline = Instant::now() + patience(5);
    while out.len() < n {
        nic.poll_cq(cq, n - out.len(), &mut out).unwrap();
        if Instant::now() > deadline {
            panic!(
                "timed out: {} of {n} completions on {cq}: {out:?}",
                out.len()
            );
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

/// A server softnic running one installed offload and a client softnic connected to it.
pub struct Rig {
    pub server: Arc<SoftNic>,
    pub client: SoftNic,
    pub program: redn_program::program::Program,
    pub installed: redn_sys::install::Installed<SoftNic>,
    pub data: Region,
    pub cqp: redn_sys::Qpn,
    pub ccq: Cqn,
    pub cbuf: Region,
    pub next_recv: u64,
}

/// Bytes of the server's data region (one region bound as `table`/`list` and `values`).
pub const DATA_LEN: usize = 1 << 20;

impl Rig {
    pub fn new(program: redn_program::program::Program, prefetch: Prefetch) -> Rig {
        let server = Arc::new(nic(2, prefetch));
        let client = nic(1, prefetch);
        // The data lives in a domain of the test's; the install registers it again in its own.
        let spd = server.alloc_pd().unwrap();
        let data = Region::new(&server, spd, DATA_LEN, ALL);
        let cpd = client.alloc_pd().unwrap();
        let cbuf = Region::new(&client, cpd, 128 << 10, ALL);
        let ccq = client.create_cq(CqConfig::new(4096)).unwrap();
        let mut ccfg = QpConfig::new(cpd, ccq);
        ccfg.rq_slots = 4096;
        let cqp = client.create_qp(ccfg).unwrap().qpn;
        let mut regions = std::collections::HashMap::new();
        for name in ["table", "list", "values"] {
            regions.insert(
                name.to_string(),
                RegionBinding::Local {
                    buffer: Arc::clone(&data.buf),
                    offset: 0,
                    len: DATA_LEN,
                    access: ALL,
                },
            );
        }
        regions.insert(
            "response".to_string(),
            RegionBinding::Remote {
                addr: cbuf.mr.addr,
                rkey: cbuf.mr.lkey.into(),
                len: 128 << 10,
            },
        );
        let installed = redn_sys::install::install(&server, &program, &regions, &mut |q| {
            SoftNic::connect_pair(&client, cqp, &server, q)
        })
        .unwrap();
        Rig {
            server,
            client,
            program,
            installed,
            data,
            cqp,
            ccq,
            cbuf,
            next_recv: 0,
        }
    }

    /// Send one trigger; collect responses until one with `byte_len == 0` or `until` says done.
    pub fn trigger(&mut self, msg: &[u8], responses: usize) -> Vec<(u32, Vec<u8>)> {
        for _ in 0..responses {
            self.client
                .post_recv(self.cqp, self.next_recv, &[])
                .unwrap();
            self.next_recv += 1;
        }
        self.client
            .post_send(
                self.cqp,
                &[wr(
                    0,
                    WqeFlags::NONE,
                    WrOp::Send {
                        payload: redn_program::wqe::Payload::Inline(msg.to_vec()),
                        imm: None,
                    },
                )],
            )
            .unwrap();
        let cqes = wait_cqes(&self.client, self.ccq, responses);
        cqes.iter()
            .map(|c| {
                assert!(c.is_ok(), "response failed: {c:?}");
                (
                    c.imm.unwrap_or(u32::MAX),
                    self.cbuf.read(0, c.byte_len as usize),
                )
            })
            .collect()
    }

    /// WQEs the server executed on all the program's queues.
    pub fn server_wqes(&self) -> u64 {
        self.installed
            .qps
            .iter()
            .map(|q| self.server.counters(q.qpn).unwrap().total_wqes())
            .sum()
    }

    /// Host posts on the server's program queues (and the installer's master).
    pub fn server_host_posts(&self) -> u64 {
        self.installed
            .qps
            .iter()
            .map(|q| q.qpn)
            .chain([self.installed.master])
            .map(|q| self.server.counters(q).unwrap().host_posts)
            .sum()
    }
}

/// Wait (10 s at most) until `cond` holds; for states a PU reaches in its own time.
pub fn wait_until(what: &str, mut cond: impl FnMut() -> bool) {
    let deadline = Instant::now() + patience(10);
    while !cond() {
        assert!(Instant::now() < deadline, "timed out waiting until {what}");
        std::thread::yield_now();
    }
}

/// Wait until nothing more runs on `nic`: until `count` (the WQEs its queues ran, say) is
/// the same before and after every PU has gone once round all its queues, which two probe
/// NOPs in turn on a queue of each PU show (the second runs in a later round than the
/// first). A PU that visits every queue and runs nothing changes nothing, so nothing can run
/// after; this holds unless a queue waits for a time (a rate limit, a receiver-not-ready
/// retry). Why not "until the count holds still for some milliseconds": a PU descheduled
/// that long passes it, half-way through a chain. 10 s at most (see [`patience`]).
pub fn settle(nic: &SoftNic, count: impl Fn() -> u64) {
    let pd = nic.alloc_pd().unwrap();
    let probes: Vec<Endpoint> = (0..nic.config().pus)
        .map(|pu| {
            let ep = endpoint(nic, pd, |c| c.pu = Some(pu));
            nic.connect(ep.qp.qpn, ep.qp.qpn).unwrap();
            ep
        })
        .collect();
    let probe = WrOp::Nop {
        raw_segments: vec![],
    };
    let deadline = Instant::now() + patience(10);
    let mut last = count();
    loop {
        for _ in 0..2 {
            for p in &probes {
                nic.post_send(p.qp.qpn, &[wr(0, SIG, probe.clone())])
                    .unwrap();
            }
            for p in &probes {
                wait_cqes(nic, p.cq, 1);
            }
        }
        let now = count();
        if now == last {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "still running after {:?} ({now} WQEs)",
            patience(10)
        );
        last = now;
    }
    for p in probes {
        nic.destroy_qp(p.qp.qpn).unwrap();
        nic.destroy_cq(p.cq).unwrap();
    }
    nic.dealloc_pd(pd).unwrap();
}

/// WQEs an installed program's queues and its master queue ran.
pub fn installed_wqes(nic: &SoftNic, inst: &Installed<SoftNic>) -> u64 {
    inst.qps
        .iter()
        .map(|q| q.qpn)
        .chain([inst.master])
        .map(|q| nic.counters(q).unwrap().total_wqes())
        .sum()
}

/// `n` NOPs, the last one signaled.
pub fn nops(n: usize) -> Vec<WorkRequest> {
    (0..n)
        .map(|i| {
            let flags = if i + 1 == n { SIG } else { WqeFlags::NONE };
            wr(
                i as u64,
                flags,
                WrOp::Nop {
                    raw_segments: vec![],
                },
            )
        })
        .collect()
}

/// xorshift64*: a fixed sequence from a seed, so a failing random case replays.
pub struct Rng(pub u64);

impl Rng {
    pub fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    /// Uniform enough below `n` for tests.
    pub fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }

    /// [`Rng::below`] for a `u32` bound.
    pub fn below32(&mut self, n: u32) -> u32 {
        u32::try_from(self.below(u64::from(n))).unwrap()
    }

    /// [`Rng::below`] for an index into `n` things.
    pub fn index(&mut self, n: usize) -> usize {
        usize::try_from(self.below(n as u64)).unwrap()
    }

    /// A random byte.
    pub fn byte(&mut self) -> u8 {
        self.next().to_le_bytes()[0]
    }
}

/// A managed queue `q` and a master queue `m` of `sq_bbs` BBs each, each connected to itself.
pub fn doorbell_pair(nic: &SoftNic, pd: Pdn, sq_bbs: u32) -> (Endpoint, Endpoint) {
    let q = endpoint(nic, pd, |c| {
        c.managed_send = true;
        c.sq_bbs = sq_bbs;
    });
    nic.connect(q.qp.qpn, q.qp.qpn).unwrap();
    let m = endpoint(nic, pd, |c| c.sq_bbs = sq_bbs);
    nic.connect(m.qp.qpn, m.qp.qpn).unwrap();
    (q, m)
}

/// The master's side of a doorbell-ordered chain of `steps` WQEs on `q`: SEND_EN(q, 1), then
/// for each further step a WAIT for the previous WQE's completion (q's CQ has counted k) and
/// SEND_EN(q, k + 1).
pub fn doorbell_master(q: &Endpoint, steps: u32) -> Vec<WorkRequest> {
    let mut master = Vec::new();
    for k in 0..steps {
        if k > 0 {
            let wait = WrOp::Wait {
                cq: q.cq,
                count: k - 1,
            };
            master.push(wr(0, WqeFlags::NONE, wait));
        }
        let enable = WrOp::SendEnable {
            qp: q.qp.qpn,
            pi: k + 1,
        };
        master.push(wr(0, WqeFlags::NONE, enable));
    }
    master
}

/// A random atomic on `remote` (CAS, FETCH_ADD or their masked forms) with small compare
/// operands, so that compares match now and then; its old value lands at `result`.
pub fn random_atomic(
    rng: &mut Rng,
    remote: redn_program::wqe::RemoteAddr,
    result: Option<redn_program::wqe::Sge>,
) -> WrOp {
    let (compare, mask) = (rng.below(4), rng.next() | 0xff);
    match rng.below(4) {
        0 => WrOp::CompareSwap {
            remote,
            compare,
            swap: rng.next(),
            result,
        },
        1 => WrOp::FetchAdd {
            remote,
            add: rng.next(),
            result,
        },
        2 => WrOp::MaskedCompareSwap {
            remote,
            compare,
            compare_mask: 0x3,
            swap: rng.next(),
            swap_mask: mask,
            result,
        },
        _ => WrOp::MaskedFetchAdd {
            remote,
            add: rng.next(),
            field_boundary: mask,
            result,
        },
    }
}
