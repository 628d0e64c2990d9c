//! Section 1's chains (chain latency): the queues one chain order runs on, the wakers of its
//! PUs, how the host sees a chain end (poll, count, flag, sleep), one timed run of a chain,
//! and the native chain the slowdown divides by.

use super::wait_cq;
use redn_bench::native::mean_ns_samples;
use redn_bench::queues::{flags_if, nop, push_doorbell_master, SqWriter};
use redn_bench::setup::{counting_cq, loopback_qp};
use redn_bench::stats::{stats, Stats};
use redn_bench::wait::{Backoff, TimedOut, WaitMode, WAIT_TIMEOUT};
use redn_bench::Ctx;
use redn_program::wqe::{Payload, WorkRequest, WqeFlags, WrOp, BB_SIZE};
use redn_sys::conv::low32;
use redn_sys::mem::SharedBuffer;
use redn_sys::nic::{CompChannel, MrInfo, Nic};
use redn_sys::softnic::SoftNic;
use redn_sys::{Cqn, Pdn, Qpn};
use std::hint::black_box;
use std::sync::Arc;
use std::time::{Duration, Instant};

const LAT_RING: u32 = 1024;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Chain {
    /// WQ order.
    Wq,
    /// Completion order.
    Cq,
    /// Doorbell order.
    Db,
}

/// A master (unmanaged) queue driving a managed queue with WAIT + SEND_EN.
pub(crate) struct DbPair {
    m: SqWriter,
    cq_m: Cqn,
    q: SqWriter,
    cq_q: Cqn,
}

/// The queues one chain order runs on; created for that order alone, so no other queue
/// shares its PU (every queue on a PU costs time in each of the PU's scheduling rounds).
pub(crate) enum LatQueues {
    /// One unmanaged SQ and its CQ (WQ and completion order).
    Single { l: SqWriter, cq: Cqn },
    /// A master / managed pair (doorbell order).
    Pair(DbPair),
}

impl LatQueues {
    pub(crate) fn new(
        nic: &SoftNic,
        pd: Pdn,
        kind: Chain,
        mpu: usize,
        qpu: usize,
    ) -> Result<Self, String> {
        if kind != Chain::Db {
            let cq = counting_cq(nic)?;
            let l = loopback_qp(nic, pd, cq, qpu, LAT_RING, false)?;
            return Ok(LatQueues::Single {
                l: SqWriter::new(&l, false),
                cq,
            });
        }
        let cq_m = counting_cq(nic)?;
        let cq_q = counting_cq(nic)?;
        // Managed queue first: the PU scans its queues in creation order.
        let q = loopback_qp(nic, pd, cq_q, qpu, LAT_RING, true)?;
        let m = loopback_qp(nic, pd, cq_m, mpu, LAT_RING, false)?;
        Ok(LatQueues::Pair(DbPair {
            m: SqWriter::new(&m, false),
            cq_m,
            q: SqWriter::new(&q, false),
            cq_q,
        }))
    }

    pub(crate) fn qpns(&self) -> Vec<Qpn> {
        match self {
            LatQueues::Single { l, .. } => vec![l.qpn],
            LatQueues::Pair(p) => vec![p.m.qpn, p.q.qpn],
        }
    }

    pub(crate) fn cqns(&self) -> Vec<Cqn> {
        match self {
            LatQueues::Single { cq, .. } => vec![*cq],
            LatQueues::Pair(p) => vec![p.cq_m, p.cq_q],
        }
    }

    /// The ring the native baseline reads WQEs from.
    pub(crate) fn native_ring(&self) -> &SqWriter {
        match self {
            LatQueues::Single { l, .. } => l,
            LatQueues::Pair(p) => &p.m,
        }
    }

    pub(crate) fn destroy(&self, nic: &SoftNic) {
        for q in self.qpns() {
            let _ = nic.destroy_qp(q);
        }
        for c in self.cqns() {
            let _ = nic.destroy_cq(c);
        }
    }
}

/// One queue per PU a chain runs on, for a signaled NOP right before the chain's doorbell:
/// every sample starts with its PUs awake. Without it, a chain whose WQEs take the host
/// longer to write than a PU's idle spin (the 64-step chains: 191 WQEs) found its PU parked
/// and paid an unpark that the shorter ones did not, which the slope between N=1 and N=64
/// then counted as step time.
pub(crate) struct Wakers {
    queues: Vec<(SqWriter, Cqn)>,
}

impl Wakers {
    pub(crate) fn new(nic: &SoftNic, pd: Pdn, pus: &[usize]) -> Result<Wakers, String> {
        let mut queues = Vec::new();
        for &pu in pus {
            let cq = counting_cq(nic)?;
            let qp = loopback_qp(nic, pd, cq, pu, LAT_RING, false)?;
            queues.push((SqWriter::new(&qp, false), cq));
        }
        Ok(Wakers { queues })
    }

    /// Run one NOP on each PU and wait for it: the PUs are then spinning, not parked.
    fn wake(&mut self, nic: &SoftNic) -> Result<(), String> {
        for (sq, cq) in &mut self.queues {
            let target = nic.cq_produced(*cq).ctx("cq_produced")? + 1;
            sq.push(nic, &nop(WqeFlags::SIGNALED, 0))?;
            sq.ring(nic)?;
            wait_cq(nic, *cq, target, WaitMode::Spin)?;
        }
        Ok(())
    }

    pub(crate) fn destroy(&self, nic: &SoftNic) {
        for (sq, cq) in &self.queues {
            let _ = nic.destroy_qp(sq.qpn);
            let _ = nic.destroy_cq(*cq);
        }
    }
}

/// WQEs a chain of `n` steps executes.
pub(crate) fn chain_wqes(kind: Chain, n: usize) -> usize {
    match kind {
        Chain::Wq => n,
        Chain::Cq => 2 * n - 1,
        Chain::Db => 3 * n - 1,
    }
}

/// How the host learns that a chain finished.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Detect {
    /// Busy-poll `Nic::poll_cq`, taking the chain's completions as they come, until the last
    /// NOP's: what a verbs host does.
    Poll,
    /// Busy-poll `Nic::cq_produced` (the count WAIT compares with) until the last NOP's
    /// completion is counted.
    Cq,
    /// The chain ends with an extra unsignaled 8-byte inline WRITE of a sequence number into a
    /// registered host word (after the last NOP, same queue); the host spins on that word and
    /// never calls into the softnic while the chain runs.
    Flag,
    /// Doorbell order only: the master ends with a WAIT for the last NOP's completion and a
    /// signaled NOP of its own, on the master's CQ, armed for a completion channel the host
    /// sleeps on; so the host holds no core while the chain runs.
    Sleep,
}

/// How a sleeping host learns that a chain ended: a completion channel for the master's CQ.
pub(crate) struct Sleeper {
    pub(crate) channel: CompChannel,
    /// Chains the master's CQ has completed (one signaled NOP each).
    pub(crate) done: u64,
}

impl Sleeper {
    /// Sleep until the master's CQ `cq_m` has the chain's completion, then take it.
    fn wait(&mut self, nic: &SoftNic, cq_m: Cqn) -> Result<(), String> {
        match self.channel.get_event(WAIT_TIMEOUT) {
            Some(c) if c == cq_m => {}
            Some(c) => return Err(format!("completion channel reported CQ {c}, not {cq_m}")),
            None => {
                return Err(format!(
                    "timed out after {WAIT_TIMEOUT:?} asleep on the master's CQ {cq_m}"
                ))
            }
        }
        self.done += 1;
        let mut out = Vec::new();
        nic.poll_cq(cq_m, 4, &mut out).ctx("poll_cq")?;
        match out.as_slice() {
            [c] if c.is_ok() && c.wr_id == SLEEP_WR_ID => Ok(()),
            other => Err(format!(
                "the master's CQ held {other:?}, expected one successful completion {SLEEP_WR_ID}"
            )),
        }
    }
}

/// The wr_id of the master's closing NOP in "sleep" detection.
const SLEEP_WR_ID: u64 = 0x51ee9;

/// Where flag-detected chains write their sequence number.
pub(crate) struct Flag {
    pub(crate) buf: Arc<SharedBuffer>,
    pub(crate) mr: MrInfo,
    pub(crate) seq: u64,
}

impl Flag {
    fn write_wr(&self) -> WorkRequest {
        WorkRequest {
            wr_id: u64::MAX,
            flags: WqeFlags::NONE,
            op: WrOp::Write {
                remote: self.mr.remote(0),
                payload: Payload::Inline(self.seq.to_le_bytes().to_vec()),
                imm: None,
            },
        }
    }

    fn wait(&self) -> Result<(), String> {
        let mut backoff = Backoff::new(128, None);
        while self.buf.load_u64(0) != self.seq {
            backoff.pause(WaitMode::Spin).map_err(|TimedOut| {
                format!(
                    "timed out after {WAIT_TIMEOUT:?} waiting for flag write {} (flag holds {})",
                    self.seq,
                    self.buf.load_u64(0)
                )
            })?;
        }
        Ok(())
    }
}

/// Build a chain of `n` NOPs in `kind` order (untimed), wake its PUs, ring the doorbell and
/// time until the chain is seen finished.
// The queues, the chain's shape and the three host-side helpers (flag, sleeper, wakers) are
// each used by some modes only; bundling them would only rename them.
#[allow(clippy::too_many_arguments)]
pub(crate) fn run_chain(
    nic: &SoftNic,
    lq: &mut LatQueues,
    kind: Chain,
    n: usize,
    detect: Detect,
    flag: &mut Flag,
    sleeper: &mut Sleeper,
    wakers: &mut Wakers,
) -> Result<Duration, String> {
    if (kind == Chain::Db) != matches!(lq, LatQueues::Pair(_)) {
        return Err(format!("{kind:?} chain needs other queues"));
    }
    let master_cq = match lq {
        LatQueues::Pair(p) => Some(p.cq_m),
        LatQueues::Single { .. } => None,
    };
    if detect == Detect::Sleep && master_cq.is_none() {
        return Err("sleep detection is for doorbell-ordered chains".into());
    }
    flag.seq += 1;
    if detect == Detect::Poll {
        // Take what earlier chains left (count- and flag-detected ones are not polled), so
        // that the polls timed below see this chain's completions only.
        if let Some(&cq) = lq.cqns().last() {
            let mut out = Vec::new();
            while nic.poll_cq(cq, 256, &mut out).ctx("poll_cq")? > 0 {
                out.clear();
            }
        }
    }
    let (db, cq, target): (&SqWriter, Cqn, u64) = match lq {
        LatQueues::Single { l, cq } => {
            let cq = *cq;
            let base = nic.cq_produced(cq).ctx("cq_produced")?;
            for i in 0..n {
                if kind == Chain::Cq && i > 0 {
                    let w = WorkRequest {
                        wr_id: 0,
                        flags: WqeFlags::NONE,
                        op: WrOp::Wait {
                            cq,
                            count: low32(base + i as u64 - 1),
                        },
                    };
                    l.push(nic, &w)?;
                }
                let sig = kind == Chain::Cq || i + 1 == n;
                l.push(nic, &nop(flags_if(sig), i as u64))?;
            }
            if detect == Detect::Flag {
                l.push(nic, &flag.write_wr())?;
            }
            let target = base + if kind == Chain::Cq { n as u64 } else { 1 };
            (l, cq, target)
        }
        LatQueues::Pair(pair) => {
            let base = nic.cq_produced(pair.cq_q).ctx("cq_produced")?;
            let qb = pair.q.pi;
            for i in 0..n {
                pair.q.push(nic, &nop(WqeFlags::SIGNALED, i as u64))?;
            }
            // With flag detection the last SEND_EN also enables the trailing WRITE.
            let extra = u64::from(detect == Detect::Flag);
            if detect == Detect::Flag {
                pair.q.push(nic, &flag.write_wr())?;
            }
            push_doorbell_master(
                nic,
                &mut pair.m,
                pair.q.qpn,
                pair.cq_q,
                qb,
                base,
                n as u64,
                extra,
            )?;
            if detect == Detect::Sleep {
                let wait = WorkRequest {
                    wr_id: 0,
                    flags: WqeFlags::NONE,
                    op: WrOp::Wait {
                        cq: pair.cq_q,
                        count: low32(base + n as u64 - 1),
                    },
                };
                pair.m.push(nic, &wait)?;
                pair.m.push(nic, &nop(WqeFlags::SIGNALED, SLEEP_WR_ID))?;
                nic.req_notify_cq(pair.cq_m, &sleeper.channel)
                    .ctx("req_notify_cq")?;
            }
            (&pair.m, pair.cq_q, base + n as u64)
        }
    };
    wakers.wake(nic)?;
    let t0 = Instant::now();
    db.ring(nic)?;
    match detect {
        Detect::Poll => poll_chain(nic, cq, target, n as u64 - 1)?,
        Detect::Cq => wait_cq(nic, cq, target, WaitMode::Spin)?,
        Detect::Flag => flag.wait()?,
        Detect::Sleep => sleeper.wait(nic, master_cq.ok_or("no master CQ")?)?,
    }
    let d = t0.elapsed();
    if detect == Detect::Flag {
        // The NOPs completed before the WRITE ran (same queue, in order); check it.
        let p = nic.cq_produced(cq).ctx("cq_produced")?;
        if p < target {
            return Err(format!(
                "flag written but CQ {cq} has produced only {p} of {target} completions"
            ));
        }
    }
    Ok(d)
}

/// Busy-poll `cq` with `Nic::poll_cq` until its count reaches `target`, the last completion
/// being the one with `last_wr_id`; checks every completion polled (success, and the last
/// one's wr_id).
fn poll_chain(nic: &SoftNic, cq: Cqn, target: u64, last_wr_id: u64) -> Result<(), String> {
    let mut out = Vec::with_capacity(64);
    let mut backoff = Backoff::new(128, None);
    loop {
        out.clear();
        if nic.poll_cq(cq, 64, &mut out).ctx("poll_cq")? == 0 {
            backoff.pause(WaitMode::Spin).map_err(|TimedOut| {
                format!("timed out polling CQ {cq} for the chain's last completion")
            })?;
            continue;
        }
        if let Some(c) = out.iter().find(|c| c.status.is_err()) {
            return Err(format!("error completion polled: {c:?}"));
        }
        if out.last().is_some_and(|c| c.wr_id == last_wr_id) {
            // The chain's completions come in order, so this is its last. The count is
            // published right after the entry: it must reach the chain's end, and no more.
            wait_cq(nic, cq, target, WaitMode::Spin)?;
            let p = nic.cq_produced(cq).ctx("cq_produced")?;
            if p != target {
                return Err(format!(
                    "CQ {cq} counts {p} completions after the chain's last, expected {target}"
                ));
            }
            return Ok(());
        }
    }
}

/// The same chain's memory operations done by one CPU thread: 64 B WQE loads from the same
/// ring, a completion counter bumped per signaled WQE and read per WAIT, an enable index
/// stored per SEND_EN and read by the "managed queue".
fn native_chain(kind: Chain, n: usize, ring: &SqWriter, ctr: &SharedBuffer) {
    let mut blk = [0u8; BB_SIZE];
    let mut load_wqe = |i: usize| {
        ring.buf.read_block(ring.slot_off(i as u64), &mut blk);
        black_box(&blk);
    };
    if kind == Chain::Wq {
        for i in 0..n {
            load_wqe(i);
        }
        ctr.atomic_update(0, |v| Some(v + 1));
        return;
    }
    // Completion and doorbell order: WAIT for the previous completion, then the NOP (doorbell
    // order: the SEND_EN, its enable index, and the NOP on the managed queue).
    let base = ctr.load_u64(0);
    for i in 0..n {
        if i > 0 {
            load_wqe(2 * i - 1);
            black_box(ctr.load_u64(0) > base + i as u64 - 1);
        }
        load_wqe(2 * i);
        if kind == Chain::Db {
            ctr.store_u64(8, i as u64 + 1);
            black_box(ctr.load_u64(8) > i as u64);
            load_wqe(2 * n + i);
        }
        ctr.atomic_update(0, |v| Some(v + 1));
    }
}

/// Per-sample mean of `reps` native chains; samples of such means.
pub(crate) fn native_chain_stats(kind: Chain, n: usize, ring: &SqWriter, samples: usize) -> Stats {
    let ctr = SharedBuffer::new(64);
    let reps = (4096 / n).max(16);
    stats(&mean_ns_samples(samples, reps, reps, || {
        native_chain(kind, n, ring, &ctr)
    }))
}
