//! This side's softnics: a [`Side`] (a softnic, its endpoint, memory and a QP) and the
//! [`Client`] of the latency and bandwidth rows, connected to the peer's softnic.

use super::{Control, MEM, MTU, OFFLOAD_PONG_OFF, PONG_AT, SEQ_AT};
use redn_bench::stats::ns;
use redn_program::wqe::{Payload, WorkRequest, WqeFlags, WrOp};
use redn_sys::mem::SharedBuffer;
use redn_sys::nic::{Completion, CqConfig, MrInfo, Nic, QpConfig};
use redn_sys::softnic::roce::{read_record, write_record, RegionRecord, RoceConfig, RoceEndpoint};
use redn_sys::softnic::{SoftNic, SoftNicConfig};
use redn_sys::{Access, Cqn, Pdn, Qpn, Rkey, VirtAddr};
use std::net::Ipv4Addr;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// A softnic of one PU with its endpoint, 16 MiB of memory and one QP (room for 1,024
/// receives); what both processes set up.
pub(crate) struct Side {
    pub(crate) nic: Arc<SoftNic>,
    pub(crate) ep: RoceEndpoint,
    pub(crate) pd: Pdn,
    pub(crate) buf: Arc<SharedBuffer>,
    pub(crate) mr: MrInfo,
    pub(crate) cq: Cqn,
    pub(crate) qp: Qpn,
}

impl Side {
    /// A softnic of one PU, host-driven (`SoftNicConfig::host_driven`: no PU thread, this
    /// thread's calls run its round) or not, with its endpoint, memory and a QP.
    pub(crate) fn new(name: &str, spin: Duration, host_driven: bool) -> Side {
        let mut config = SoftNicConfig::new(name);
        config.host_driven = host_driven;
        let nic = Arc::new(SoftNic::new(config).expect("softnic"));
        let mut cfg = RoceConfig::new(Ipv4Addr::LOCALHOST);
        cfg.bind.set_port(0);
        cfg.spin = spin;
        let ep = RoceEndpoint::start(&nic, &cfg).expect("endpoint");
        let pd = nic.alloc_pd().expect("pd");
        let buf = SharedBuffer::new(MEM);
        let mr = nic.reg_mr(pd, &buf, 0, MEM, Access::ALL).expect("mr");
        let cq = nic.create_cq(CqConfig::new(1 << 16)).expect("cq");
        let mut qc = QpConfig::new(pd, cq);
        qc.rq_slots = 1024;
        qc.sq_bbs = 4096;
        let qp = nic.create_qp(qc).expect("qp").qpn;
        Side {
            nic,
            ep,
            pd,
            buf,
            mr,
            cq,
            qp,
        }
    }

    /// Spin (yielding: two cores carry both processes) until the word at `pong` is `seq`;
    /// a host-driven softnic's round runs in each turn (its only way to take the answer in).
    pub(crate) fn await_answer(&self, pong: usize, seq: u64) {
        let deadline = Instant::now() + Duration::from_secs(30);
        let mut polls = 0u32;
        while self.buf.load_u64(pong) != seq {
            // The clock only now and then: a read is 30-100 ns on our VMs, and the raw UDP
            // loop this is measured against reads none between its polls.
            polls = polls.wrapping_add(1);
            if polls % 1024 == 0 {
                assert!(Instant::now() < deadline, "no answer to WRITE_IMM {seq}");
            }
            if self.nic.config().host_driven {
                // Its only thread on the path: it busy-polls, as raw UDP's ends do.
                self.nic.progress();
            } else {
                std::thread::yield_now();
            }
        }
    }

    /// WRITE_IMM of 64 B whose first word is the sequence number, answered by an offload on
    /// the peer (a WAIT on its receive CQ, then a WRITE of the 64 B just received back to
    /// this side; all posted before the run, so no server host in the loop), on a second QP
    /// pair: post to seeing the sequence number come back.
    pub(crate) fn offload_round_trips(&self, c: &mut Control, n: usize) -> Vec<f64> {
        let rounds = n + n / 10;
        c.say(&format!("offload {rounds}"));
        let cq = self.nic.create_cq(CqConfig::new(1 << 16)).expect("cq");
        let mut qc = QpConfig::new(self.pd, cq);
        qc.sq_bbs = 4096;
        let qp = self.nic.create_qp(qc).expect("qp").qpn;
        let mut ours = self.ep.record(qp, 1);
        ours.mtu = MTU;
        ours.regions.push(RegionRecord {
            name: "pong".into(),
            addr: self.mr.addr.0 + PONG_AT + OFFLOAD_PONG_OFF,
            rkey: self.mr.lkey.0,
            len: 64,
            rights: 2,
        });
        write_record(&mut c.writer, &ours).expect("record");
        let theirs = read_record(&mut c.reader).expect("peer record");
        self.ep.connect(&ours, &theirs).expect("connect");
        let echo = theirs.region("echo").expect("peer echo region").clone();
        let pong = redn_sys::conv::idx(PONG_AT + OFFLOAD_PONG_OFF);
        let mut v = Vec::with_capacity(n);
        let mut out = Vec::new();
        for i in 1..=rounds as u64 {
            self.buf.store_u64(redn_sys::conv::idx(SEQ_AT), i);
            let op = WrOp::Write {
                remote: redn_program::wqe::RemoteAddr {
                    addr: VirtAddr(echo.addr),
                    rkey: Rkey(echo.rkey),
                },
                payload: Payload::Sgl(vec![self.mr.sge(SEQ_AT, 64)]),
                imm: Some(redn_sys::conv::low32(i)),
            };
            let signaled = i % 256 == 0;
            let t = Instant::now();
            self.nic
                .post_send(
                    qp,
                    &[WorkRequest {
                        wr_id: i,
                        flags: if signaled {
                            WqeFlags::SIGNALED
                        } else {
                            WqeFlags::NONE
                        },
                        op,
                    }],
                )
                .expect("post");
            self.await_answer(pong, i);
            if i > (n / 10) as u64 {
                v.push(ns(t.elapsed()));
            }
            if signaled {
                let deadline = Instant::now() + Duration::from_secs(30);
                // Keep the send ring from filling: its slots come back with this completion.
                while out.is_empty() {
                    self.nic.poll_cq(cq, 1, &mut out).expect("poll");
                    assert!(Instant::now() < deadline, "no completion for {i}");
                }
                assert!(out[0].is_ok(), "WRITE_IMM failed: {:?}", out[0]);
                out.clear();
            }
        }
        c.say("offload done");
        assert_eq!(
            c.hear(),
            "host_posts 0",
            "the offload ran with no server host post"
        );
        // As on the server: no queue of this block in the next block's rounds.
        self.nic.destroy_qp(qp).expect("destroy the offload qp");
        self.nic.destroy_cq(cq).expect("destroy the offload cq");
        v
    }
}

/// This side's softnic, connected to the peer's.
pub(crate) struct Client {
    pub(crate) side: Side,
    pub(crate) remote: RegionRecord,
    pub(crate) out: Vec<Completion>,
}

impl Client {
    pub(crate) fn connect(c: &mut Control, spin: Duration) -> Client {
        c.say("softnic");
        let side = Side::new("client", spin, false);
        let (ep, mr, qp) = (&side.ep, &side.mr, side.qp);
        let mut ours = ep.record(qp, 1);
        ours.mtu = MTU;
        ours.regions.push(RegionRecord {
            name: "pong".into(),
            addr: mr.addr.0 + PONG_AT,
            rkey: mr.lkey.0,
            len: 4096,
            rights: 2,
        });
        write_record(&mut c.writer, &ours).expect("record");
        let theirs = read_record(&mut c.reader).expect("peer record");
        ep.connect(&ours, &theirs).expect("connect");
        let remote = theirs.region("mem").expect("peer memory").clone();
        Client {
            side,
            remote,
            out: Vec::new(),
        }
    }

    pub(crate) fn op(&self, what: &str, wr_id: u64, len: u32) -> WrOp {
        let remote = redn_program::wqe::RemoteAddr {
            addr: VirtAddr(self.remote.addr),
            rkey: Rkey(self.remote.rkey),
        };
        let sge = self.side.mr.sge(0, len);
        match what {
            "SEND" => WrOp::Send {
                payload: Payload::Sgl(vec![sge]),
                imm: None,
            },
            "WRITE" => WrOp::Write {
                remote,
                payload: Payload::Sgl(vec![sge]),
                imm: None,
            },
            "WRITE_IMM" => WrOp::Write {
                remote,
                payload: Payload::Sgl(vec![sge]),
                imm: Some(redn_sys::conv::low32(wr_id)),
            },
            "READ" => WrOp::Read {
                remote,
                sgl: vec![self.side.mr.sge(1 << 20, len)],
            },
            _ => WrOp::CompareSwap {
                remote,
                compare: 0,
                swap: 0,
                result: Some(self.side.mr.sge(2 << 20, 8)),
            },
        }
    }

    pub(crate) fn post(&self, wr_id: u64, op: WrOp, flags: WqeFlags) {
        self.side
            .nic
            .post_send(self.side.qp, &[WorkRequest { wr_id, flags, op }])
            .expect("post");
    }

    pub(crate) fn wait(&mut self, n: usize) {
        let mut got = 0;
        let deadline = Instant::now() + Duration::from_secs(30);
        while got < n {
            let took = self.take(n - got);
            got += took;
            if took == 0 {
                std::thread::yield_now();
            }
            assert!(Instant::now() < deadline, "the softnic stopped answering");
        }
    }

    /// Post-to-completion times of `n` 64 B operations.
    pub(crate) fn latencies(&mut self, what: &str, n: usize) -> Vec<f64> {
        let mut v = Vec::with_capacity(n);
        for i in 0..n + n / 10 {
            let op = self.op(what, i as u64, 64);
            let t = Instant::now();
            self.post(i as u64, op, WqeFlags::SIGNALED);
            self.wait(1);
            if i >= n / 10 {
                v.push(ns(t.elapsed()));
            }
        }
        v
    }

    /// WRITE_IMM of 64 B, answered by the peer's host with a WRITE of 64 B whose first word
    /// is the immediate: post to seeing that word.
    pub(crate) fn write_imm_round_trips(&mut self, n: usize) -> Vec<f64> {
        let mut v = Vec::with_capacity(n);
        let pong = redn_sys::conv::idx(PONG_AT);
        for i in 1..=(n + n / 10) as u64 {
            let op = self.op("WRITE_IMM", i, 64);
            let t = Instant::now();
            // Unsignaled: a send queue error still completes, and the answer is what counts.
            self.post(
                i,
                op,
                if i % 256 == 0 {
                    WqeFlags::SIGNALED
                } else {
                    WqeFlags::NONE
                },
            );
            self.side.await_answer(pong, i);
            if i > (n / 10) as u64 {
                v.push(ns(t.elapsed()));
            }
            if i % 256 == 0 {
                self.wait(1);
            }
        }
        v
    }

    /// Bytes per second WRITEs of `size` reach, `total` bytes in all (at least 64 WRITEs).
    pub(crate) fn write_bandwidth(&mut self, size: usize, total: usize) -> f64 {
        let count = (total / size).max(64);
        let len = u32::try_from(size).expect("sizes up to 1 MiB");
        let window = 256;
        let t = Instant::now();
        let mut posted = 0;
        let mut done = 0;
        let deadline = t + Duration::from_secs(60);
        while done < count {
            while posted < count && posted - done < window {
                let op = self.op("WRITE", posted as u64, len);
                self.post(posted as u64, op, WqeFlags::SIGNALED);
                posted += 1;
            }
            done += self.reap(window);
            assert!(Instant::now() < deadline, "the softnic stopped answering");
        }
        (count * size) as f64 / t.elapsed().as_secs_f64()
    }

    /// Take up to `max` completions (each must be good); if none has come, sleep 100 us
    /// first. A streaming app with a deep send queue reaps in batches so: its host does not
    /// take a core from the softnic's PU and receive threads (a host that polled and
    /// yielded took a quarter of the two cores' time in `perf`), and 100 us is a small
    /// part of the queue's work (256 WRITEs).
    pub(crate) fn reap(&mut self, max: usize) -> usize {
        let got = self.take(max);
        if got == 0 {
            std::thread::sleep(Duration::from_micros(100));
        }
        got
    }

    /// Take up to `max` completions that have come, each of which must be good; how many.
    pub(crate) fn take(&mut self, max: usize) -> usize {
        self.out.clear();
        let got = self
            .side
            .nic
            .poll_cq(self.side.cq, max, &mut self.out)
            .expect("poll");
        for c in &self.out {
            assert!(c.is_ok(), "completion failed: {c:?}");
        }
        got
    }
}
