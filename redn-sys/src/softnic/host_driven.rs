//! Host-driven softnics ([`SoftNicConfig::host_driven`](super::SoftNicConfig::host_driven)):
//! no PU threads; the app thread's own calls run the PUs' rounds, as a DPDK poll-mode driver
//! or rxe's requester task runs in its caller's context. A round is the PU thread's round
//! (`pu::PuQueues`: the same executor, the same RoCE endpoint code), so a host-driven
//! softnic has no second copy of any WQE's semantics.
//!
//! Why: a RoCE round trip between two processes on a small machine is a rotation of the
//! busy threads on its cores. A client whose PU is a thread of its own puts three on the
//! path (its host, its PU, the server's PU) where a raw UDP ping-pong has two; host-driven,
//! the client's host is its PU (`docs/softnic-performance.md`, "The RoCEv2 round trip").
//!
//! One caller at a time runs the rounds (a try-lock); a call that finds them running leaves
//! a request (`wanted`) that the running caller serves before it lets go, so no call's
//! doorbell waits for a later call. What the queues are handed between calls (a completion
//! a WAIT counts, a datagram for the RoCE endpoint) waits for the next call: an app that
//! stops calling stops its queues, and its endpoint's receive thread serves the socket for
//! it (see `roce::endpoint`, the host's lease).

use super::idle::Found;
use super::pu::PuQueues;
use super::shared::Shared;
use std::sync::atomic::{fence, AtomicBool, Ordering};
use std::sync::{Arc, Mutex, TryLockError};

/// Rounds one call runs at most while they make progress: a queue that always has work (a
/// recycled loop) must not keep the caller forever; its next call goes on.
const MAX_ROUNDS: usize = 64;

/// The PUs' state of a host-driven softnic, run by whichever app thread calls in.
pub(crate) struct HostDriven {
    /// Some call wants the rounds run: set before the try-lock, so that a caller holding
    /// the lock runs them once more for a caller that could not take it.
    wanted: AtomicBool,
    pus: Mutex<Vec<PuQueues>>,
}

impl HostDriven {
    pub(crate) fn new(pus: usize) -> HostDriven {
        HostDriven {
            wanted: AtomicBool::new(false),
            pus: Mutex::new((0..pus).map(|_| PuQueues::default()).collect()),
        }
    }

    /// Run every PU's rounds until none makes progress (at most [`MAX_ROUNDS`] each), or
    /// leave that to the caller running them now.
    pub(crate) fn drive(&self, shared: &Arc<Shared>) {
        self.wanted.store(true, Ordering::Relaxed);
        loop {
            // The caller's half of a store-load handshake with the holder's release below:
            // either this try-lock sees the lock free or the holder sees `wanted`.
            fence(Ordering::SeqCst);
            let mut pus = match self.pus.try_lock() {
                Ok(g) => g,
                Err(TryLockError::Poisoned(e)) => e.into_inner(),
                Err(TryLockError::WouldBlock) => return,
            };
            while self.wanted.swap(false, Ordering::AcqRel) {
                for (index, pu) in pus.iter_mut().enumerate() {
                    rounds(index, pu, shared);
                }
            }
            drop(pus);
            fence(Ordering::SeqCst);
            if !self.wanted.load(Ordering::Relaxed) {
                return;
            }
        }
    }
}

/// PU `index`'s rounds: its queues, then (when they had nothing, and on the last round)
/// its idle work, until a round does nothing. The app is waiting for what idle work takes
/// in, so a call returns right after a poll that found something:
/// - at once if it only placed data or sent replies ([`Found::Placed`]): the app sees the
///   WRITE that landed one scan of its queues sooner (~150-250 ns on the RoCE round trip's
///   path, `docs/rocev2.md`), and they have nothing new to run;
/// - after the queues' next round if it gave them something ([`Found::QueueWork`]: a
///   completion a WAIT may count, a response), without polling again unless they ran
///   something too.
fn rounds(index: usize, pu: &mut PuQueues, shared: &Arc<Shared>) {
    let notice = &shared.pus.pus[index].0.changed;
    let mut idle_did = false;
    for round in 0..MAX_ROUNDS {
        if notice.load(Ordering::Relaxed) && notice.swap(false, Ordering::AcqRel) {
            pu.take_changes(index, shared);
        }
        // A rate-limited queue's deadline needs no timer here: the app's next call looks
        // again.
        let (mut progress, _deadline) = pu.scan();
        if (!progress && !idle_did) || round + 1 == MAX_ROUNDS {
            match pu.poll_idle() {
                Found::Nothing => idle_did = false,
                Found::Placed => return,
                Found::QueueWork => {
                    idle_did = true;
                    progress = true;
                }
            }
        } else {
            idle_did = false;
        }
        if !progress {
            return;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::Found;
    use crate::mem::SharedBuffer;
    use crate::nic::{CqConfig, Nic, QpConfig};
    use crate::softnic::{SoftNic, SoftNicConfig};
    use crate::types::{Access, Rkey};
    use crate::wqe::{Payload, RemoteAddr, WorkRequest, WqeFlags, WrOp};
    use std::time::{Duration, Instant};

    fn host_driven_nic(pus: usize) -> SoftNic {
        let mut cfg = SoftNicConfig::new("host-driven-unit");
        cfg.pus = pus;
        cfg.host_driven = true;
        SoftNic::new(cfg).unwrap()
    }

    /// A QP of `nic` connected to itself, with 4 KiB registered: the memory, its region
    /// and the QP.
    fn loopback_qp(
        nic: &SoftNic,
    ) -> (
        std::sync::Arc<SharedBuffer>,
        crate::nic::MrInfo,
        crate::types::Qpn,
    ) {
        let pd = nic.alloc_pd().unwrap();
        let buf = SharedBuffer::new(4096);
        let mr = nic.reg_mr(pd, &buf, 0, 4096, Access::ALL).unwrap();
        let cq = nic.create_cq(CqConfig::new(16)).unwrap();
        let qp = nic.create_qp(QpConfig::new(pd, cq)).unwrap().qpn;
        nic.connect(qp, qp).unwrap();
        (buf, mr, qp)
    }

    /// The call that posts runs the WQE: a loopback WRITE has run when `post_send`
    /// returns, with no other thread to run it.
    #[test]
    fn a_post_runs_its_wqe_before_it_returns() {
        let nic = host_driven_nic(1);
        let (buf, mr, qp) = loopback_qp(&nic);
        buf.write(0, b"inline!!");
        let op = WrOp::Write {
            remote: RemoteAddr {
                addr: crate::types::VirtAddr(mr.addr.0 + 1024),
                rkey: Rkey(mr.lkey.0),
            },
            payload: Payload::Sgl(vec![mr.sge(0, 8)]),
            imm: None,
        };
        nic.post_send(
            qp,
            &[WorkRequest {
                wr_id: 7,
                flags: WqeFlags::SIGNALED,
                op,
            }],
        )
        .unwrap();
        assert_eq!(nic.sq_consumed(qp).unwrap(), 1);
        let mut placed = [0u8; 8];
        buf.read(1024, &mut placed);
        assert_eq!(&placed, b"inline!!");
    }

    /// Threads calling in at once (each posting to its own queue, on a PU of its own or a
    /// shared one) all see their work done, each WQE once and in order: one caller at a
    /// time runs the rounds, whoever it is.
    #[test]
    fn concurrent_callers_all_see_their_work_done() {
        const PER_THREAD: u64 = 2000;
        let nic = host_driven_nic(2);
        let pd = nic.alloc_pd().unwrap();
        let buf = SharedBuffer::new(1 << 16);
        let mr = nic.reg_mr(pd, &buf, 0, 1 << 16, Access::ALL).unwrap();
        let mut queues = Vec::new();
        for pu in [0, 1, 1] {
            let cq = nic.create_cq(CqConfig::new(4096)).unwrap();
            let mut qc = QpConfig::new(pd, cq);
            qc.pu = Some(pu);
            qc.sq_bbs = 64;
            let qp = nic.create_qp(qc).unwrap().qpn;
            nic.connect(qp, qp).unwrap();
            queues.push((qp, cq));
        }
        std::thread::scope(|s| {
            for (t, &(qp, cq)) in queues.iter().enumerate() {
                let (nic, mr) = (&nic, &mr);
                s.spawn(move || {
                    let mut done = 0u64;
                    let mut out = Vec::new();
                    let deadline = Instant::now() + Duration::from_secs(30);
                    for i in 0..PER_THREAD {
                        let op = WrOp::Write {
                            remote: RemoteAddr {
                                addr: crate::types::VirtAddr(mr.addr.0 + 4096 * (t as u64 + 1)),
                                rkey: Rkey(mr.lkey.0),
                            },
                            payload: Payload::Inline(i.to_le_bytes().to_vec()),
                            imm: None,
                        };
                        let wr = WorkRequest {
                            wr_id: i,
                            flags: WqeFlags::SIGNALED,
                            op,
                        };
                        // Keep at most 32 in flight: the ring has 64 slots.
                        while i - done >= 32 {
                            out.clear();
                            done += nic.poll_cq(cq, 64, &mut out).unwrap() as u64;
                            assert!(Instant::now() < deadline, "queue {t} stalled at {done}");
                        }
                        nic.post_send(qp, &[wr]).unwrap();
                    }
                    while done < PER_THREAD {
                        out.clear();
                        done += nic.poll_cq(cq, 64, &mut out).unwrap() as u64;
                        assert!(out.iter().all(|c| c.is_ok()), "{out:?}");
                        assert!(Instant::now() < deadline, "queue {t} stalled at {done}");
                    }
                });
            }
        });
        for t in 0..queues.len() {
            assert_eq!(buf.load_u64(4096 * (t + 1)), PER_THREAD - 1);
        }
    }

    /// Idle work that finds queue work on its first poll only, counting its polls.
    struct Once(std::sync::atomic::AtomicUsize);
    impl crate::softnic::idle::IdleWork for Once {
        fn poll(&self) -> Found {
            if self.0.fetch_add(1, std::sync::atomic::Ordering::Relaxed) == 0 {
                Found::QueueWork
            } else {
                Found::Nothing
            }
        }
        fn parking(&self) {}
    }

    /// A call's rounds poll the idle work while its queues have nothing, and not again
    /// right after a poll that found something (the app waits for what came; its next
    /// call polls again): one poll that finds, one more call, one more poll.
    #[test]
    fn a_call_does_not_poll_again_right_after_idle_work_found_something() {
        let nic = host_driven_nic(1);
        let work = std::sync::Arc::new(Once(std::sync::atomic::AtomicUsize::new(0)));
        nic.shared.idle.add(0, work.clone());
        nic.shared.pus.mark_changed(0);
        nic.progress();
        assert_eq!(work.0.load(std::sync::atomic::Ordering::Relaxed), 1);
        nic.progress();
        assert_eq!(work.0.load(std::sync::atomic::Ordering::Relaxed), 2);
    }

    /// Idle work whose first poll gives a queue a WQE to run (posted without running the
    /// queues, as an arrival releases a WAIT) and reports `found`.
    struct GivesWork {
        nic: std::sync::Weak<SoftNic>,
        qp: crate::types::Qpn,
        wr: WorkRequest,
        found: Found,
        polled: std::sync::atomic::AtomicBool,
    }
    impl crate::softnic::idle::IdleWork for GivesWork {
        fn poll(&self) -> Found {
            if self.polled.swap(true, std::sync::atomic::Ordering::Relaxed) {
                return Found::Nothing;
            }
            let nic = self.nic.upgrade().unwrap();
            let q = nic.shared.qp(self.qp).unwrap();
            nic.post_send_to(&q, std::slice::from_ref(&self.wr))
                .unwrap();
            self.found
        }
        fn parking(&self) {}
    }

    /// After a poll that gave the queues work, the call scans them once more, so what the
    /// arrival released has run when it returns; after one that only placed data, it
    /// returns at once (the app looks at what landed) and the next call runs the queues.
    #[test]
    fn a_call_scans_again_only_after_idle_work_that_gave_the_queues_work() {
        for (found, run_by_first_call) in [(Found::QueueWork, 1), (Found::Placed, 0)] {
            let nic = std::sync::Arc::new(host_driven_nic(1));
            let (buf, mr, qp) = loopback_qp(&nic);
            let wr = WorkRequest {
                wr_id: 1,
                flags: WqeFlags::SIGNALED,
                op: WrOp::Write {
                    remote: RemoteAddr {
                        addr: crate::types::VirtAddr(mr.addr.0 + 1024),
                        rkey: Rkey(mr.lkey.0),
                    },
                    payload: Payload::Inline(b"released".to_vec()),
                    imm: None,
                },
            };
            let work = std::sync::Arc::new(GivesWork {
                nic: std::sync::Arc::downgrade(&nic),
                qp,
                wr,
                found,
                polled: std::sync::atomic::AtomicBool::new(false),
            });
            nic.shared.idle.add(0, work);
            nic.shared.pus.mark_changed(0);
            nic.progress();
            assert_eq!(nic.sq_consumed(qp).unwrap(), run_by_first_call, "{found:?}");
            nic.progress();
            assert_eq!(nic.sq_consumed(qp).unwrap(), 1, "{found:?}");
            let mut landed = [0u8; 8];
            buf.read(1024, &mut landed);
            assert_eq!(&landed, b"released");
        }
    }
}
