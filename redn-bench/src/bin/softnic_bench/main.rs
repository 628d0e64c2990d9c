//! softnic_bench: the RedN paper's §5.1 microbenchmarks run against the softnic, each figure
//! printed next to a native baseline measured in the same run (the same memory operations done
//! directly by the CPU on the same `SharedBuffer`s) and a slowdown column.
//!
//! 1. Chain latency vs chain length (Fig. 8) in WQ, completion and doorbell order.
//! 2. Throughput per opcode (NOP, 64 B WRITE, 64 B READ, CAS, FAA) on one PU and on all PUs.
//! 3. What queues without work (idle, or parked on a WAIT) cost a busy PU per visit.
//!
//! Run with `cargo run --release -p redn-bench --bin softnic_bench -- --help`.
//! It prints tables; nothing is asserted. Exit status 1 means the softnic misbehaved (a hang,
//! an error or out-of-order completion, a wrong result in memory): see the "anomalies" list.

use redn_bench::bytes::low_byte;
use redn_bench::native::{cross_thread_rtt, mean_ns_samples, on_threads};
use redn_bench::opts::{parse_num, CommonOpts};
use redn_bench::queues::{flags_if, nop, post_endless_wait, push_doorbell_master, SqWriter};
use redn_bench::report::{fmt_ns, print_anomalies, print_failed, print_head, section, verdict};
use redn_bench::setup::{counting_cq, loopback_qp, Region};
use redn_bench::stats::{median, min, ns, stats, Stats};
use redn_bench::wait::{
    wait_produced, Backoff, TimedOut, WaitMode, SPIN_BEFORE_YIELD, WAIT_TIMEOUT,
};
use redn_bench::Ctx;
use redn_program::wqe::{
    encode_wqe, wqe_index, Opcode, Payload, WorkRequest, WqeFlags, WrOp, BB_SIZE,
};
use redn_sys::conv::{idx, low32};
use redn_sys::mem::SharedBuffer;
use redn_sys::nic::{CompChannel, Completion, CqConfig, MrInfo, Nic};
use redn_sys::softnic::SoftNic;
use redn_sys::{Access, Cqn, Pdn, QpState, Qpn};
use std::hint::black_box;
use std::sync::Arc;
use std::time::{Duration, Instant};

const HELP: &str = "\
softnic_bench: RedN §5.1 microbenchmarks on the softnic, with native CPU baselines

USAGE:
    cargo run --release -p redn-bench --bin softnic_bench -- [OPTIONS]

OPTIONS:
    --quick             short run (< ~10 s): fewer samples, repetitions and batches
    --pus N             softnic processing units (default: available cores); the
                        throughput table's \"all PUs\" rows use one QP per PU
    --iters N           latency samples per chain length and order
                        (default 5000, quick 400)
    --reps N            throughput repetitions per row (default 7, quick 3)
    --batches N         throughput batches of 1024 WQEs per repetition
                        (default 256, quick 32)
    --prefetch P        softnic WQE prefetch: at-execute | adversarial | depth:N | N
                        (default depth:8, the softnic default)
    --only SECTION      latency | throughput | visits (default: all three)
    --orders LIST       latency orders to run, comma-separated from wq, completion,
                        doorbell (default: all)
    --detect LIST       how the latency host sees a chain end, comma-separated from
                        poll, count, flag, sleep (default: all)
    --ops LIST          throughput rows to run, comma-separated from nop, write, read,
                        cas, faa, re-armed, post-send (default: all; for profiling one row)
    -h, --help          this text

Section 1 (chain latency, paper Fig. 8): chains of N NOPs, N in 1..64, in three orders,
  each on fresh queues of its own:
  (a) WQ order: N NOPs on one unmanaged SQ, one doorbell, last one signaled;
  (b) completion order: one SQ, every NOP signaled, each NOP after the first preceded by
      WAIT(cq, previous NOP's completion);
  (c) doorbell order: NOPs on a managed SQ Q; a master SQ runs SEND_EN(Q, 1), then
      WAIT(cq of Q, completion of NOP k-1) + SEND_EN(Q, k+1) for each further NOP;
  (c') as (c) with master and managed SQ on different PUs (when --pus >= 2).
  WQEs are written straight into the ring (encoding not timed); then a NOP on a queue of
  its own runs on each PU the chain uses (untimed: every sample starts with its PUs awake,
  where a long chain's writing would otherwise outlast the PU's idle spin and add an unpark
  to the longest chains alone); the time runs from the
  doorbell until the host sees the chain done, two ways: \"CQ\" busy-polls
  Nic::cq_produced; \"flag\" appends one 8 B inline WRITE to a host word the host spins on
  (so the host never calls into the softnic while the chain runs); \"sleep\" (doorbell order
  only) appends WAIT(last NOP's CQE) + a signaled NOP to the master, whose CQ is armed for a
  completion channel the host sleeps on (so on 2 cores the two PUs of (c') have both; the
  host's wake-up is in every length and cancels in the slope). Lengths and modes are
  interleaved. Reported: median, p99, and the slope (median(64) - median(1)) / 63. The
  cross-PU row prints the cross-thread round-trip floor measured right before and after it
  (the header's test), and its verdict: a step (a round trip between the two PUs) within
  1.5× that floor, host asleep. The same-PU row's verdicts: ≤ 50 ns, and ≤ 4× the native
  chain.
  Native: one CPU thread doing the chain's memory ops (64 B WQE loads from the same ring,
  completion-counter / enable-index atomics).

Section 2 (throughput): batches of 1024 WQEs, last of each batch signaled, on a 4096-BB
  ring with at most 3 batches outstanding (16384 BBs / 15 when PUs + host exceed the cores
  and the host sleeps between polls). The ring is encoded once; per batch the host records
  the batch's wr_id and rings the doorbell (the ring is recycled, as RedN's loops recycle
  theirs: this measures the PU). Row \"re-armed\": the host also rewrites each WQE's ctrl
  word (wqe_index) before ringing, so every ring line moves between the host's core and
  the PU's; row \"post_send\": posts through Nic::post_send (encoding included).
  Every completion is checked (status, order, wr_id), then counters, QP state and memory
  contents.
  Native: the same operation by the CPU on the same buffers (64 B copy with
  SharedBuffer::copy_from, word by word as the softnic copies; atomic_update for CAS/FAA,
  old value stored like the NIC does).

Section 3 (visits): what queues without work cost the PU that owns them (a manager's idle
  clients). 16384 NOPs in WQ order on PU 0 (ring written once, doorbell advanced a ring
  per sample), which runs 256 of them a visit and then visits every other queue: alone and
  beside K queues on the same PU that have nothing posted (idle) or sit on a WAIT that
  never completes (parked). Reported: median ns per PU round, and per visit = (round beside
  K - round alone) / K. Native: one atomic load and compare per queue (a minimal scan).

Slowdown columns are softnic time / native time (> 1 means the softnic is slower).
";

const CHAIN_LENGTHS: [usize; 7] = [1, 2, 4, 8, 16, 32, 64];
const LAT_RING: u32 = 1024;
/// Throughput ring when the host has a core of its own (it polls the CQ, yielding in between).
const TP_RING: u32 = 4096;
/// Throughput ring when host and PUs share cores: the host sleeps (≥ ~60 µs with Linux timer
/// slack), so the ring must hold more queued work than that.
const TP_RING_SHARED: u32 = 16384;
const TP_BATCH: usize = 1024;
const TP_REGION: usize = 4096;
const DB_TARGET_NS: f64 = 50.0;
/// Target: a same-PU doorbell step within this many times the native chain's step.
const DB_TARGET_NATIVE: f64 = 4.0;
/// Target: a cross-PU doorbell step (host asleep) within this many times the same run's
/// cross-thread round trip.
const CROSS_TARGET_FLOOR: f64 = 1.5;
/// Names of the latency detection modes for `--detect`, in `Detect`'s order.
const LAT_DETECTS: [&str; 4] = ["poll", "count", "flag", "sleep"];
/// Names of the latency orders for `--orders`.
const LAT_ORDERS: [&str; 3] = ["wq", "completion", "doorbell"];
/// Names of the throughput rows for `--ops`.
const TP_OPS: [&str; 7] = [
    "nop",
    "write",
    "read",
    "cas",
    "faa",
    "re-armed",
    "post-send",
];
const CX5_DB_NS: f64 = 540.0;
const WRITE_TARGET_MWQES: f64 = 50.0;
const WRITE_TARGET_SLOWDOWN: f64 = 5.0;

// ---------------------------------------------------------------------------------------------
// Options

#[derive(Clone, Debug)]
struct Opts {
    /// --quick, --pus, --prefetch, and the cores.
    common: CommonOpts,
    iters: usize,
    reps: usize,
    batches: usize,
    latency: bool,
    throughput: bool,
    visits: bool,
    /// Throughput rows to run (`--ops`); the post_send row is `post-send`.
    ops: Vec<String>,
    /// Latency orders to run (`--orders`).
    orders: Vec<String>,
    /// Latency detection modes to run (`--detect`).
    detects: Vec<Detect>,
}

fn parse_args() -> Opts {
    let (mut iters, mut reps, mut batches) = (None, None, None);
    let (mut latency, mut throughput, mut visits) = (true, true, true);
    let mut ops: Vec<String> = TP_OPS.iter().map(|s| s.to_string()).collect();
    let mut orders: Vec<String> = LAT_ORDERS.iter().map(|s| s.to_string()).collect();
    let mut detects: Vec<String> = LAT_DETECTS.iter().map(|s| s.to_string()).collect();
    let common = redn_bench::opts::parse_args("softnic_bench", HELP, |name, value| {
        match name {
            "--iters" => iters = Some(parse_num("--iters", value())?),
            "--reps" => reps = Some(parse_num("--reps", value())?),
            "--batches" => batches = Some(parse_num("--batches", value())?),
            "--only" => match value().as_deref() {
                Some("latency") => (latency, throughput, visits) = (true, false, false),
                Some("throughput") => (latency, throughput, visits) = (false, true, false),
                Some("visits") => (latency, throughput, visits) = (false, false, true),
                other => {
                    return Err(format!(
                        "--only: expected latency, throughput or visits, got {other:?}"
                    ))
                }
            },
            "--ops" => ops = parse_list("--ops", value(), &TP_OPS)?,
            "--orders" => orders = parse_list("--orders", value(), &LAT_ORDERS)?,
            "--detect" => detects = parse_list("--detect", value(), &LAT_DETECTS)?,
            _ => return Ok(false),
        }
        Ok(true)
    });
    let quick = common.quick;
    Opts {
        iters: iters.unwrap_or(if quick { 400 } else { 5000 }),
        reps: reps.unwrap_or(if quick { 3 } else { 7 }),
        batches: batches.unwrap_or(if quick { 32 } else { 256 }),
        latency,
        throughput,
        visits,
        ops,
        orders,
        detects: [Detect::Poll, Detect::Cq, Detect::Flag, Detect::Sleep]
            .into_iter()
            .zip(LAT_DETECTS)
            .filter(|(_, name)| detects.iter().any(|d| d == name))
            .map(|(d, _)| d)
            .collect(),
        common,
    }
}

/// A comma-separated list of names from `known`.
fn parse_list(name: &str, v: Option<String>, known: &[&str]) -> Result<Vec<String>, String> {
    let v = v.ok_or_else(|| format!("{name} needs a value"))?;
    let list: Vec<String> = v
        .split(',')
        .map(|s| s.trim().to_ascii_lowercase())
        .collect();
    match list.iter().find(|o| !known.contains(&o.as_str())) {
        Some(bad) => Err(format!(
            "{name}: '{bad}' is not one of {}",
            known.join(", ")
        )),
        None => Ok(list),
    }
}

// ---------------------------------------------------------------------------------------------
// Small helpers

/// Wait until `cq` has produced at least `target` completions (what WAIT counts). Latency
/// runs spin: the clock is only read every 128 polls, and not before.
fn wait_cq(nic: &SoftNic, cq: Cqn, target: u64, mode: WaitMode) -> Result<(), String> {
    wait_produced(nic, cq, target, mode, Backoff::new(128, None))
}

/// What the softnic says about some queues, for hang reports.
fn diag(nic: &SoftNic, qps: &[Qpn], cqs: &[Cqn]) -> String {
    redn_bench::wait::diag(nic, qps, cqs, false)
}

// ---------------------------------------------------------------------------------------------
// Header: environment and timing floors

fn instant_overhead_ns() -> f64 {
    let n = 100_000;
    let t0 = Instant::now();
    for _ in 0..n {
        black_box(Instant::now());
    }
    ns(t0.elapsed()) / f64::from(n)
}

/// How one side of a hand-off tells the other, in [`handoff_anatomy`].
#[derive(Clone, Copy, PartialEq, Eq)]
enum Notice {
    /// Nothing: the other side finds the work by reading the word that carries it (the floor).
    None,
    /// The softnic's wake-up before this session: a locked add on the target's event word,
    /// which the target loads every round, and a read of its park flag; both sides' words
    /// on one cache line, as two PUs' were.
    EventWord,
    /// Now: a fence, and a read of the target's park flag, on a line of its own that an awake
    /// target never writes.
    ParkFlag,
}

/// A cache line of its own, for [`handoff_anatomy`]'s words.
#[repr(align(64))]
#[derive(Default)]
struct Line<T>(T);

/// Round trips between two spinning threads, with each hand-off also giving one of the
/// [`Notice`]s; the three interleaved in blocks, so the machine's phases hit them alike.
/// What a cross-PU hand-off adds to the cross-thread floor, without the rest of the softnic.
fn handoff_anatomy(samples: usize) -> [Stats; 3] {
    use std::sync::atomic::{fence, AtomicBool, AtomicU64, Ordering::*};
    let kinds = [Notice::None, Notice::EventWord, Notice::ParkFlag];
    let mut v: [Vec<f64>; 3] = Default::default();
    let blocks = 10;
    for b in 0..blocks * kinds.len() {
        let (k, kind) = (b % kinds.len(), kinds[b % kinds.len()]);
        let ping = Line(AtomicU64::new(0));
        let pong = Line(AtomicU64::new(0));
        // Event words of the two sides, side by side, as two PUs' were.
        let events = Line([AtomicU64::new(0), AtomicU64::new(0)]);
        let sleeping: [Line<AtomicBool>; 2] = Default::default();
        // The notifier's half; the target's is its load of its event word each round.
        let notice = |to: usize| match kind {
            Notice::None => {}
            Notice::EventWord => {
                events.0[to].fetch_add(1, SeqCst);
                black_box(sleeping[to].0.load(SeqCst));
            }
            Notice::ParkFlag => {
                fence(SeqCst);
                black_box(sleeping[to].0.load(Relaxed));
            }
        };
        let round = |me: usize| {
            if kind == Notice::EventWord {
                black_box(events.0[me].load(SeqCst));
            }
            std::hint::spin_loop();
        };
        let n = samples.div_ceil(blocks) + 20;
        std::thread::scope(|s| {
            s.spawn(|| {
                let mut last = 0;
                loop {
                    let x = ping.0.load(Acquire);
                    if x == u64::MAX {
                        return;
                    }
                    if x != last {
                        pong.0.store(x, Release);
                        notice(0);
                        last = x;
                    }
                    round(1);
                }
            });
            for i in 1..=n as u64 {
                let t0 = Instant::now();
                ping.0.store(i, Release);
                notice(1);
                while pong.0.load(Acquire) != i {
                    round(0);
                }
                if i > 20 {
                    v[k].push(ns(t0.elapsed()));
                }
            }
            ping.0.store(u64::MAX, Release);
        });
    }
    v.map(|x| stats(&x))
}

// ---------------------------------------------------------------------------------------------
// Section 1: chain latency

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Chain {
    /// WQ order.
    Wq,
    /// Completion order.
    Cq,
    /// Doorbell order.
    Db,
}

/// A master (unmanaged) queue driving a managed queue with WAIT + SEND_EN.
struct DbPair {
    m: SqWriter,
    cq_m: Cqn,
    q: SqWriter,
    cq_q: Cqn,
}

/// The queues one chain order runs on; created for that order alone, so no other queue
/// shares its PU (every queue on a PU costs time in each of the PU's scheduling rounds).
enum LatQueues {
    /// One unmanaged SQ and its CQ (WQ and completion order).
    Single { l: SqWriter, cq: Cqn },
    /// A master / managed pair (doorbell order).
    Pair(DbPair),
}

impl LatQueues {
    fn new(nic: &SoftNic, pd: Pdn, kind: Chain, mpu: usize, qpu: usize) -> Result<Self, String> {
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

    fn qpns(&self) -> Vec<Qpn> {
        match self {
            LatQueues::Single { l, .. } => vec![l.qpn],
            LatQueues::Pair(p) => vec![p.m.qpn, p.q.qpn],
        }
    }

    fn cqns(&self) -> Vec<Cqn> {
        match self {
            LatQueues::Single { cq, .. } => vec![*cq],
            LatQueues::Pair(p) => vec![p.cq_m, p.cq_q],
        }
    }

    /// The ring the native baseline reads WQEs from.
    fn native_ring(&self) -> &SqWriter {
        match self {
            LatQueues::Single { l, .. } => l,
            LatQueues::Pair(p) => &p.m,
        }
    }

    fn destroy(&self, nic: &SoftNic) {
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
struct Wakers {
    queues: Vec<(SqWriter, Cqn)>,
}

impl Wakers {
    fn new(nic: &SoftNic, pd: Pdn, pus: &[usize]) -> Result<Wakers, String> {
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

    fn destroy(&self, nic: &SoftNic) {
        for (sq, cq) in &self.queues {
            let _ = nic.destroy_qp(sq.qpn);
            let _ = nic.destroy_cq(*cq);
        }
    }
}

/// WQEs a chain of `n` steps executes.
fn chain_wqes(kind: Chain, n: usize) -> usize {
    match kind {
        Chain::Wq => n,
        Chain::Cq => 2 * n - 1,
        Chain::Db => 3 * n - 1,
    }
}

/// How the host learns that a chain finished.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Detect {
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
struct Sleeper {
    channel: CompChannel,
    /// Chains the master's CQ has completed (one signaled NOP each).
    done: u64,
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
struct Flag {
    buf: Arc<SharedBuffer>,
    mr: MrInfo,
    seq: u64,
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
fn run_chain(
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
fn native_chain_stats(kind: Chain, n: usize, ring: &SqWriter, samples: usize) -> Stats {
    let ctr = SharedBuffer::new(64);
    let reps = (4096 / n).max(16);
    stats(&mean_ns_samples(samples, reps, reps, || {
        native_chain(kind, n, ring, &ctr)
    }))
}

struct ChainRow {
    n: usize,
    /// Completion seen by polling the CQ (`Nic::poll_cq`).
    poll: Stats,
    /// Completion seen by spinning on the CQ's count (`Nic::cq_produced`).
    cq: Stats,
    /// Completion seen through the trailing flag WRITE.
    flag: Stats,
    /// Host asleep on a completion channel (doorbell order).
    sleep: Stats,
    native: Stats,
}

struct Slope {
    name: String,
    target: bool,
    poll: f64,
    cq: f64,
    flag: f64,
    sleep: f64,
    native: f64,
    /// Cross-PU rows: the cross-thread round trip measured right before and after the row
    /// (medians, ns).
    floor: Option<(f64, f64)>,
}

/// The first of the detection modes' figures (poll, count, flag, sleep) that was measured
/// (the others are NaN when `--detect` leaves them out or the order has no such mode): what
/// the slowdown column divides.
fn first_run<const N: usize>(v: [f64; N]) -> f64 {
    v.into_iter().find(|x| x.is_finite()).unwrap_or(f64::NAN)
}

/// The doorbell target's verdict on a per-step figure, or "not run".
fn verdict_if_run(ns: f64) -> &'static str {
    if ns.is_finite() {
        verdict(ns <= DB_TARGET_NS)
    } else {
        "not run"
    }
}

fn slope(rows: &[ChainRow], f: impl Fn(&ChainRow) -> f64) -> f64 {
    let (a, b) = (&rows[0], &rows[rows.len() - 1]);
    (f(b) - f(a)) / (b.n - a.n) as f64
}

fn latency_section(
    nic: &SoftNic,
    pd: Pdn,
    o: &Opts,
    anomalies: &mut Vec<String>,
) -> Result<(), String> {
    let warm = (o.iters / 10).max(20);
    println!();
    println!("== 1. Chain latency vs chain length (RedN Fig. 8) ==");
    println!("   NOP chains; time from the doorbell until the host sees the chain finished;");
    println!(
        "   {} samples per point and detection mode (+{warm} warm-up); lengths and modes are",
        o.iters
    );
    println!("   interleaved round-robin. Detection modes:");
    println!("   - \"poll\": host busy-polls the CQ with Nic::poll_cq, taking the completions as");
    println!("     they come, until the last NOP's (a verbs host's ibv_poll_cq loop);");
    println!(
        "   - \"count\": host busy-polls Nic::cq_produced, the count WAIT compares with, for the"
    );
    println!("     last NOP's completion (no verbs host can read that count on a ConnectX);");
    println!(
        "   - \"flag\": the chain ends with one extra 8 B inline WRITE to a host word the host"
    );
    println!(
        "     spins on (no softnic calls while the chain runs; +1 WQE, cancels in the slope);"
    );
    println!(
        "   - \"sleep\" (doorbell order): the master ends with WAIT(last NOP) + a signaled NOP on its"
    );
    println!(
        "     own CQ, armed for a completion channel the host sleeps on (the PUs have the cores;"
    );
    println!("     the host's wake-up is in every length and cancels in the slope).");
    println!(
        "   Both poll without pause for {} µs, then yield between polls (so a PU that shares the",
        SPIN_BEFORE_YIELD.as_micros()
    );
    println!("   host's core can run).");
    println!("   Native: one CPU thread doing the chain's memory ops (mean over repeated runs;");
    println!("   median/p99 over those means). Slowdown = poll (else count, else flag) median /");
    println!("   native median.");

    let fbuf = SharedBuffer::new(64);
    let fmr = nic.reg_mr(pd, &fbuf, 0, 64, Access::ALL).ctx("reg_mr")?;
    let mut flag = Flag {
        buf: fbuf,
        mr: fmr,
        seq: 0,
    };
    let mut sleeper = Sleeper {
        channel: CompChannel::new(),
        done: 0,
    };

    // (kind, master PU, chain PU, title); each order gets fresh queues of its own.
    let mut kinds = vec![
        (
            Chain::Wq,
            0,
            0,
            "(a) WQ order: N NOPs on one unmanaged SQ (PU 0), one doorbell, last signaled"
                .to_string(),
        ),
        (
            Chain::Cq,
            0,
            0,
            "(b) completion order: one SQ (PU 0), every NOP signaled, WAIT(previous NOP's CQE) \
             before each NOP but the first"
                .to_string(),
        ),
    ];
    let db_title = |tag: &str, placement: &str| {
        format!(
            "({tag}) doorbell order: managed SQ Q holds the NOPs; master SQ runs SEND_EN(Q,1), \
             then WAIT(CQE k-1) + SEND_EN(Q,k+1);\n    {placement}"
        )
    };
    kinds.push((
        Chain::Db,
        0,
        0,
        db_title("c", "master and managed SQ both on PU 0"),
    ));
    if o.common.pus >= 2 {
        kinds.push((
            Chain::Db,
            0,
            1,
            db_title(
                "c'",
                "master SQ on PU 0, managed SQ on PU 1 (every step crosses PUs)",
            ),
        ));
    }

    let key = |k: Chain| match k {
        Chain::Wq => "wq",
        Chain::Cq => "completion",
        Chain::Db => "doorbell",
    };
    kinds.retain(|(k, ..)| o.orders.iter().any(|x| x == key(*k)));

    let native_samples = (o.iters / 10).clamp(30, 400);
    let mut slopes: Vec<Slope> = Vec::new();
    let (mut expected_nops, mut expected_writes) = (0u64, 0u64);
    let (mut nops, mut writes) = (0u64, 0u64);
    for (kind, mpu, qpu, title) in &kinds {
        let (kind, cross) = (*kind, mpu != qpu);
        let mut lq = LatQueues::new(nic, pd, kind, *mpu, *qpu)?;
        let pus: Vec<usize> = if cross { vec![*qpu, *mpu] } else { vec![*mpu] };
        let mut wakers = Wakers::new(nic, pd, &pus)?;
        let floor_samples = if o.common.quick { 2000 } else { 20000 };
        let floor_before = cross.then(|| cross_thread_rtt(floor_samples).median);
        println!();
        println!("{title}");
        if cross && o.common.cores < 3 {
            println!(
                "    note: 2 PUs + host on {} cores: only \"sleep\" leaves the PUs a core each; the others \
                 share cores, expect preemption noise",
                o.common.cores
            );
        }
        println!(
            "   {:>4} {:>5} {:>9} {:>9} {:>9} {:>9} {:>9} {:>9} {:>9} {:>9} {:>9} {:>9}",
            "N",
            "WQEs",
            "poll med",
            "poll p99",
            "count med",
            "count p99",
            "flag med",
            "flag p99",
            "sleep med",
            "sleep p99",
            "native",
            "slowdown"
        );
        // Lengths and detection modes are interleaved round-robin, so slow phases of the
        // machine hit every point alike and the slope stays meaningful.
        let nl = CHAIN_LENGTHS.len();
        let mut v_poll = vec![Vec::with_capacity(o.iters); nl];
        let mut v_cq = vec![Vec::with_capacity(o.iters); nl];
        let mut v_flag = vec![Vec::with_capacity(o.iters); nl];
        let mut v_sleep = vec![Vec::with_capacity(o.iters); nl];
        for i in 0..warm + o.iters {
            for (j, &n) in CHAIN_LENGTHS.iter().enumerate() {
                for &detect in &o.detects {
                    if detect == Detect::Sleep && kind != Chain::Db {
                        continue;
                    }
                    let d = match run_chain(
                        nic,
                        &mut lq,
                        kind,
                        n,
                        detect,
                        &mut flag,
                        &mut sleeper,
                        &mut wakers,
                    ) {
                        Ok(d) => d,
                        Err(e) => {
                            let msg = format!(
                                "chain latency {kind:?} N={n} ({detect:?} detection), iteration \
                                 {i}: {e}{}",
                                diag(nic, &lq.qpns(), &lq.cqns())
                            );
                            lq.destroy(nic);
                            wakers.destroy(nic);
                            return Err(msg);
                        }
                    };
                    expected_nops += n as u64;
                    match detect {
                        Detect::Flag => expected_writes += 1,
                        // The master's closing NOP.
                        Detect::Sleep => expected_nops += 1,
                        Detect::Poll | Detect::Cq => {}
                    }
                    if i >= warm {
                        match detect {
                            Detect::Poll => v_poll[j].push(ns(d)),
                            Detect::Cq => v_cq[j].push(ns(d)),
                            Detect::Flag => v_flag[j].push(ns(d)),
                            Detect::Sleep => v_sleep[j].push(ns(d)),
                        }
                    }
                }
            }
        }
        let mut rows: Vec<ChainRow> = Vec::new();
        for (j, &n) in CHAIN_LENGTHS.iter().enumerate() {
            let row = ChainRow {
                n,
                poll: stats(&v_poll[j]),
                cq: stats(&v_cq[j]),
                flag: stats(&v_flag[j]),
                sleep: stats(&v_sleep[j]),
                native: native_chain_stats(kind, n, lq.native_ring(), native_samples),
            };
            println!(
                "   {:>4} {:>5} {:>9} {:>9} {:>9} {:>9} {:>9} {:>9} {:>9} {:>9} {:>9} {:>8.1}×",
                n,
                chain_wqes(kind, n),
                fmt_ns(row.poll.median),
                fmt_ns(row.poll.p99),
                fmt_ns(row.cq.median),
                fmt_ns(row.cq.p99),
                fmt_ns(row.flag.median),
                fmt_ns(row.flag.p99),
                fmt_ns(row.sleep.median),
                fmt_ns(row.sleep.p99),
                fmt_ns(row.native.median),
                first_run([
                    row.poll.median,
                    row.cq.median,
                    row.flag.median,
                    row.sleep.median
                ]) / row.native.median
            );
            rows.push(row);
        }
        let sl = Slope {
            name: match kind {
                Chain::Wq => "WQ order".to_string(),
                Chain::Cq => "completion order".to_string(),
                Chain::Db if cross => "doorbell order, cross-PU".to_string(),
                Chain::Db => "doorbell order".to_string(),
            },
            target: kind == Chain::Db && !cross,
            poll: slope(&rows, |r| r.poll.median),
            cq: slope(&rows, |r| r.cq.median),
            flag: slope(&rows, |r| r.flag.median),
            sleep: slope(&rows, |r| r.sleep.median),
            native: slope(&rows, |r| r.native.median),
            floor: floor_before.map(|b| (b, cross_thread_rtt(floor_samples).median)),
        };
        println!(
            "   per additional step (median slope N={}→{}): poll {} ns, count {} ns, flag {} ns, \
             sleep {} ns, native {} ns",
            rows[0].n,
            rows[rows.len() - 1].n,
            fmt_ns(sl.poll),
            fmt_ns(sl.cq),
            fmt_ns(sl.flag),
            fmt_ns(sl.sleep),
            fmt_ns(sl.native)
        );
        if let Some((before, after)) = sl.floor {
            println!(
                "   floor: cross-thread round trip through a SharedBuffer word, medians right before \
                 and after this table: {} / {} ns",
                fmt_ns(before),
                fmt_ns(after)
            );
        }
        slopes.push(sl);

        // Did every chain run exactly what was posted, without errors?
        let (mut n_nop, mut n_write) = (0, 0);
        for q in lq.qpns() {
            let c = nic.counters(q).ctx("counters")?;
            n_nop += c.by_opcode(Opcode::Nop);
            n_write += c.by_opcode(Opcode::RdmaWrite);
            let st = nic.qp_state(q).ctx("qp_state")?;
            if c.errors != 0 || st != QpState::ReadyToSend {
                anomalies.push(format!(
                    "chain latency {kind:?}: QP {q} ended in state {st} with {} errors{}",
                    c.errors,
                    diag(nic, &[q], &[])
                ));
            }
        }
        lq.destroy(nic);
        wakers.destroy(nic);
        nops += n_nop;
        writes += n_write;
    }
    let ok = nops == expected_nops && writes == expected_writes;
    if !ok {
        anomalies.push(format!(
            "chain latency: softnic counted {nops} NOPs and {writes} WRITEs, {expected_nops} and \
             {expected_writes} were posted"
        ));
    }
    println!();
    println!(
        "   verified: {nops} NOPs + {writes} flag WRITEs executed (= posted), no error completions, \
         QPs still RTS: {}; {} sleeping waits each woken by its chain's completion",
        if ok { "yes" } else { "NO" },
        sleeper.done
    );

    println!();
    println!("Per-additional-step cost (slope of the medians between N=1 and N=64):");
    println!(
        "   {:<26} {:>9} {:>9} {:>9} {:>9} {:>10} {:>9}   reference / target",
        "order", "poll ns", "count ns", "flag ns", "sleep ns", "native ns", "slowdown"
    );
    for sl in &slopes {
        let note = if sl.target {
            format!(
                "ConnectX-5 {CX5_DB_NS:.0} ns; target ≤ {DB_TARGET_NS:.0} ns: poll {}, flag {}",
                verdict_if_run(sl.poll),
                verdict_if_run(sl.flag)
            )
        } else if let Some((before, after)) = sl.floor {
            format!(
                "floor (cross-thread round trip) {} / {} ns before / after",
                fmt_ns(before),
                fmt_ns(after)
            )
        } else {
            String::new()
        };
        println!(
            "   {:<26} {:>9} {:>9} {:>9} {:>9} {:>10} {:>8.1}×   {}",
            sl.name,
            fmt_ns(sl.poll),
            fmt_ns(sl.cq),
            fmt_ns(sl.flag),
            fmt_ns(sl.sleep),
            fmt_ns(sl.native),
            first_run([sl.poll, sl.cq, sl.flag, sl.sleep]) / sl.native,
            note
        );
    }
    // The ratio targets, each from figures of this run.
    for sl in &slopes {
        if sl.target {
            // The PU alone on its core if the host sleeps; else with the flag-spinning host.
            let step = first_run([sl.sleep, sl.flag, sl.poll]);
            let r = step / sl.native;
            println!(
                "   target: same-PU doorbell step ≤ {DB_TARGET_NATIVE}× the native chain's: {} ns = \
                 {r:.1}×: {}",
                fmt_ns(step),
                if r.is_finite() { verdict(r <= DB_TARGET_NATIVE) } else { "not run" }
            );
        }
        if let Some((before, after)) = sl.floor {
            let floor = (before + after) / 2.0;
            let r = sl.sleep / floor;
            println!(
                "   target: cross-PU doorbell step, host asleep, ≤ {CROSS_TARGET_FLOOR}× the \
                 cross-thread round trip ({} ns): {} ns = {r:.2}×: {}",
                fmt_ns(floor),
                fmt_ns(sl.sleep),
                if r.is_finite() {
                    verdict(r <= CROSS_TARGET_FLOOR)
                } else {
                    "not run"
                }
            );
        }
    }

    if slopes.iter().any(|sl| sl.target) {
        println!(
            "   (poll and count detection cost the PU too: the host reads lines every step's \
             completion writes (each CQ entry, or the\n    count), so they move to the host's \
             core and back while the chain runs; flag detection keeps the host off the\n    \
             PU's lines.)"
        );
    }

    let _ = nic.dereg_mr(flag.mr.lkey);
    Ok(())
}

// ---------------------------------------------------------------------------------------------
// Section 2: throughput

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum TOp {
    Nop,
    Write,
    Read,
    Cas,
    Faa,
}

impl TOp {
    /// The name `--ops` knows it by.
    fn key(self) -> &'static str {
        match self {
            TOp::Nop => "nop",
            TOp::Write => "write",
            TOp::Read => "read",
            TOp::Cas => "cas",
            TOp::Faa => "faa",
        }
    }

    fn name(self) -> &'static str {
        match self {
            TOp::Nop => "NOP",
            TOp::Write => "WRITE 64 B",
            TOp::Read => "READ 64 B",
            TOp::Cas => "CAS",
            TOp::Faa => "FAA",
        }
    }

    fn opcode(self) -> Opcode {
        match self {
            TOp::Nop => Opcode::Nop,
            TOp::Write => Opcode::RdmaWrite,
            TOp::Read => Opcode::RdmaRead,
            TOp::Cas => Opcode::AtomicCs,
            TOp::Faa => Opcode::AtomicFa,
        }
    }

    fn native_name(self) -> &'static str {
        match self {
            TOp::Nop => "64 B WQE load (read_block)",
            TOp::Write | TOp::Read => "64 B copy (copy_from)",
            TOp::Cas => "atomic_update CAS + store old",
            TOp::Faa => "atomic_update FAA + store old",
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Posting {
    /// Pre-encoded ring that is never rewritten: the host only records the batch's wr_id
    /// and rings the doorbell (the WQEs' wqe_index fields are right on the first lap only,
    /// which the softnic, like a RedN-configured ConnectX, does not check). This is how
    /// RedN's recycled loops run, and it measures the PU, not the host's writes into ring
    /// lines the PU just read.
    Recycled,
    /// Pre-encoded ring; the host rewrites each WQE's ctrl word (wqe_index) and rings.
    Rearm,
    /// `Nic::post_send` of 1024 work requests (encoding included).
    PostSend,
}

/// Byte offset used by the WQE in ring slot `s`: 64 different cache lines of a 4 KiB region.
fn slot_data_off(s: u64) -> u64 {
    (s % 64) * 64
}

fn tp_wr(op: TOp, s: u64, src: &MrInfo, dst: &MrInfo, flags: WqeFlags, wr_id: u64) -> WorkRequest {
    let off = slot_data_off(s);
    let op = match op {
        TOp::Nop => WrOp::Nop {
            raw_segments: Vec::new(),
        },
        TOp::Write => WrOp::Write {
            remote: dst.remote(off),
            payload: Payload::Sgl(vec![src.sge(off, 64)]),
            imm: None,
        },
        TOp::Read => WrOp::Read {
            remote: src.remote(off),
            sgl: vec![dst.sge(off, 64)],
        },
        TOp::Cas => WrOp::CompareSwap {
            remote: src.remote(off),
            compare: 0,
            swap: 0,
            result: Some(dst.sge(off, 8)),
        },
        TOp::Faa => WrOp::FetchAdd {
            remote: src.remote(off),
            add: 1,
            result: Some(dst.sge(off, 8)),
        },
    };
    WorkRequest { wr_id, flags, op }
}

/// One throughput queue pair with its buffers.
struct TpQp {
    w: SqWriter,
    cq: Cqn,
    /// First 8 bytes (opmod, wqe_index, opcode, qpn, ds) of the pre-encoded WQEs.
    ctrl0: [u8; 8],
    /// For `Posting::PostSend`.
    wrs: Vec<WorkRequest>,
    /// Source / remote / atomic target.
    src: Region,
    /// Destination / local / atomic result.
    dst: Region,
    /// Batches posted and seen completed.
    posted: u64,
    seen: u64,
    /// Batches that may be outstanding (ring / batch - 1).
    outstanding: u64,
    /// When each batch's completion was observed.
    obs: Vec<Instant>,
    polled: Vec<Completion>,
}

impl TpQp {
    fn new(
        nic: &SoftNic,
        pd: Pdn,
        op: TOp,
        pu: usize,
        post: Posting,
        ring: u32,
    ) -> Result<TpQp, String> {
        let cq = nic.create_cq(CqConfig::new(64)).ctx("create_cq")?;
        let info = loopback_qp(nic, pd, cq, pu, ring, false)?;
        let w = SqWriter::new(&info, false);
        let (src, dst) = match op {
            TOp::Cas | TOp::Faa => (
                Region::filled(nic, pd, TP_REGION, |_| 0)?,
                Region::filled(nic, pd, TP_REGION, |_| 0xff)?,
            ),
            _ => (
                Region::filled(nic, pd, TP_REGION, |i| low_byte(i * 7 + pu * 13 + 1))?,
                Region::filled(nic, pd, TP_REGION, |_| 0)?,
            ),
        };
        let mut ctrl0 = [0u8; 8];
        let mut wrs = Vec::new();
        match post {
            Posting::Rearm | Posting::Recycled => {
                for s in 0..u64::from(ring) {
                    let last = (s + 1) % TP_BATCH as u64 == 0;
                    let wr = tp_wr(op, s, &src.mr, &dst.mr, flags_if(last), 0);
                    let e = encode_wqe(&wr, w.qpn, wqe_index(s)).ctx("encode_wqe")?;
                    if e.bbs() != 1 {
                        return Err(format!(
                            "{} WQE takes {} BBs, expected 1",
                            op.name(),
                            e.bbs()
                        ));
                    }
                    w.buf.write(w.slot_off(s), e.bytes());
                    if s == 0 {
                        ctrl0.copy_from_slice(&e.bytes()[..8]);
                    }
                }
            }
            Posting::PostSend => {
                wrs = (0..TP_BATCH as u64)
                    .map(|s| {
                        tp_wr(
                            op,
                            s,
                            &src.mr,
                            &dst.mr,
                            flags_if(s + 1 == TP_BATCH as u64),
                            0,
                        )
                    })
                    .collect();
            }
        }
        Ok(TpQp {
            w,
            cq,
            ctrl0,
            wrs,
            src,
            dst,
            posted: 0,
            seen: 0,
            outstanding: u64::from(ring) / TP_BATCH as u64 - 1,
            obs: Vec::new(),
            polled: Vec::new(),
        })
    }

    fn post_batch(&mut self, nic: &SoftNic, post: Posting) -> Result<(), String> {
        let start = self.w.pi;
        let end = start + TP_BATCH as u64;
        match post {
            Posting::Recycled => {
                nic.note_posted(self.w.qpn, end - 1, end, self.posted)
                    .ctx("note_posted")?;
                nic.ring_doorbell(self.w.qpn, end).ctx("ring_doorbell")?;
            }
            Posting::Rearm => {
                let mut word = self.ctrl0;
                for i in start..end {
                    word[1..3].copy_from_slice(&wqe_index(i).to_be_bytes());
                    self.w.buf.write(self.w.slot_off(i), &word);
                }
                nic.note_posted(self.w.qpn, end - 1, end, self.posted)
                    .ctx("note_posted")?;
                nic.ring_doorbell(self.w.qpn, end).ctx("ring_doorbell")?;
            }
            Posting::PostSend => {
                self.wrs[TP_BATCH - 1].wr_id = self.posted;
                let t0 = Instant::now();
                loop {
                    match nic.post_send(self.w.qpn, &self.wrs) {
                        Ok(()) => break,
                        Err(redn_sys::Error::QueueFull { .. }) if t0.elapsed() < WAIT_TIMEOUT => {
                            std::thread::yield_now()
                        }
                        Err(e) => return Err(format!("post_send: {e}")),
                    }
                }
            }
        }
        self.w.pi = end;
        self.posted += 1;
        Ok(())
    }

    /// Wait until batch `k` (absolute) completed; check every completion on the way.
    fn wait_batch(&mut self, nic: &SoftNic, k: u64, mode: WaitMode) -> Result<(), String> {
        while self.seen <= k {
            wait_cq(nic, self.cq, k + 1, mode)?;
            let now = Instant::now();
            self.polled.clear();
            nic.poll_cq(self.cq, 64, &mut self.polled).ctx("poll_cq")?;
            if self.polled.is_empty() {
                return Err(format!(
                    "CQ {} produced {} completions but poll_cq returned none (seen {})",
                    self.cq,
                    nic.cq_produced(self.cq).unwrap_or(0),
                    self.seen
                ));
            }
            for c in &self.polled {
                if !c.is_ok() || c.wr_id != self.seen || c.qpn != self.w.qpn {
                    return Err(format!(
                        "QP {}: completion for batch {} is wrong: wr_id {}, qpn {}, status {:?}, \
                         cqe {:?}",
                        self.w.qpn, self.seen, c.wr_id, c.qpn, c.status, c.cqe
                    ));
                }
                self.seen += 1;
                self.obs.push(now);
            }
        }
        Ok(())
    }
}

/// Intervals between successive observed batch completions, in ns.
fn batch_intervals(qps: &[TpQp], t0: Instant, from: usize) -> Vec<f64> {
    let mut v = Vec::new();
    for q in qps {
        let mut last = t0;
        for &t in &q.obs[from..] {
            v.push(ns(t - last));
            last = t;
        }
    }
    v
}

/// Stream `nb` batches into every QP (round robin); returns elapsed time.
fn run_stream(
    nic: &SoftNic,
    qps: &mut [TpQp],
    nb: u64,
    post: Posting,
    mode: WaitMode,
) -> Result<(Duration, Vec<f64>), String> {
    let first = qps[0].posted;
    let obs_from = qps[0].obs.len();
    let t0 = Instant::now();
    for b in 0..nb {
        for q in qps.iter_mut() {
            if b >= q.outstanding {
                q.wait_batch(nic, first + b - q.outstanding, mode)?;
            }
            q.post_batch(nic, post)?;
        }
    }
    for q in qps.iter_mut() {
        q.wait_batch(nic, first + nb - 1, mode)?;
    }
    let el = t0.elapsed();
    Ok((el, batch_intervals(qps, t0, obs_from)))
}

/// Run `count` native operations in chunks of TP_BATCH; per-chunk times in ns.
fn native_chunks(count: usize, mut f: impl FnMut(u64)) -> Vec<f64> {
    let mut iv = Vec::with_capacity(count / TP_BATCH);
    let mut last = Instant::now();
    for c in 0..count / TP_BATCH {
        for j in 0..TP_BATCH {
            f(black_box((c * TP_BATCH + j) as u64));
        }
        let t = Instant::now();
        iv.push(ns(t - last));
        last = t;
    }
    iv
}

/// The operation the softnic performs, done by the CPU on the same buffers.
fn native_worker(op: TOp, q: &TpQp, count: usize) -> (Instant, Instant, Vec<f64>) {
    let (src, dst, ring) = (&*q.src.buf, &*q.dst.buf, &q.w);
    let start = Instant::now();
    let iv = match op {
        TOp::Nop => native_chunks(count, |s| {
            let mut blk = [0u8; BB_SIZE];
            ring.buf.read_block(ring.slot_off(s), &mut blk);
            black_box(&blk);
        }),
        TOp::Write | TOp::Read => native_chunks(count, |s| {
            let off = idx(slot_data_off(s));
            dst.copy_from(off, src, black_box(off), 64);
        }),
        TOp::Cas => native_chunks(count, |s| {
            let off = idx(slot_data_off(s));
            let old = src.atomic_update(off, |v| (v == 0).then_some(0));
            dst.write(off, &old.to_le_bytes());
        }),
        TOp::Faa => native_chunks(count, |s| {
            let off = idx(slot_data_off(s));
            let old = src.atomic_update(off, |v| Some(v.wrapping_add(1)));
            dst.write(off, &old.to_le_bytes());
        }),
    };
    (start, Instant::now(), iv)
}

/// Native rate (ops/s) with one thread per QP, plus per-chunk times.
fn native_run(op: TOp, qps: &[TpQp], count: usize) -> (f64, Vec<f64>) {
    if qps.len() == 1 {
        let (s, e, iv) = native_worker(op, &qps[0], count);
        return (count as f64 / (e - s).as_secs_f64(), iv);
    }
    let results: Vec<(Instant, Instant, Vec<f64>)> =
        on_threads(qps.len(), |i| native_worker(op, &qps[i], count))
            .into_iter()
            .map(|r| r.expect("native worker"))
            .collect();
    let start = results.iter().map(|r| r.0).min().expect("threads");
    let end = results.iter().map(|r| r.1).max().expect("threads");
    let iv = results.into_iter().flat_map(|r| r.2).collect();
    ((count * qps.len()) as f64 / (end - start).as_secs_f64(), iv)
}

struct TpRow {
    label: String,
    nqp: usize,
    /// Median rate over repetitions (WQE/s).
    soft: f64,
    /// Slow-tail rate (WQE/s): at the p99 batch time, or the p99 (slowest) repetition when the
    /// host sleeps and so sees batch completions in bursts.
    soft_p99: f64,
    native: f64,
    native_p99: f64,
}

/// Check memory, counters and state after a throughput run.
fn tp_verify(nic: &SoftNic, op: TOp, qps: &[TpQp], expected_per_qp: u64) -> Result<(), String> {
    for q in qps {
        let c = nic.counters(q.w.qpn).ctx("counters")?;
        let st = nic.qp_state(q.w.qpn).ctx("qp_state")?;
        let ran = c.by_opcode(op.opcode());
        if ran != expected_per_qp || c.errors != 0 || st != QpState::ReadyToSend {
            return Err(format!(
                "{}: QP {} executed {ran} {} WQEs (expected {expected_per_qp}), {} errors, \
                 state {st}",
                op.name(),
                q.w.qpn,
                op.opcode(),
                c.errors
            ));
        }
        let (src, dst) = (q.src.bytes(), q.dst.bytes());
        match op {
            TOp::Nop => {}
            TOp::Write | TOp::Read => {
                if src != dst {
                    let at = src.iter().zip(&dst).position(|(a, b)| a != b).unwrap_or(0);
                    return Err(format!(
                        "{}: QP {}: destination differs from source at byte {at}",
                        op.name(),
                        q.w.qpn
                    ));
                }
            }
            TOp::Cas | TOp::Faa => {
                let mut total = 0u64;
                for wd in 0..64usize {
                    let off = wd * 64;
                    let v = q.src.buf.load_u64(off);
                    total += v;
                    let got =
                        u64::from_le_bytes(dst[off..off + 8].try_into().expect("eight bytes"));
                    let want = if op == TOp::Cas { 0 } else { v.wrapping_sub(1) };
                    if got != want {
                        return Err(format!(
                            "{}: QP {}: result word at {off} holds {got:#x}, expected {want:#x} \
                             (target {v})",
                            op.name(),
                            q.w.qpn,
                        ));
                    }
                }
                let want = if op == TOp::Cas { 0 } else { expected_per_qp };
                if total != want {
                    return Err(format!(
                        "{}: QP {}: target words sum to {total}, expected {want}",
                        op.name(),
                        q.w.qpn
                    ));
                }
            }
        }
    }
    Ok(())
}

/// Poll + yield with a 4096-BB ring if the host has a core besides the PUs, else sleep between
/// polls and use a bigger ring.
fn wait_mode(o: &Opts, nqp: usize) -> (WaitMode, u32) {
    if nqp < o.common.cores {
        (WaitMode::Yield, TP_RING)
    } else {
        (WaitMode::Sleep, TP_RING_SHARED)
    }
}

fn tp_row(
    nic: &SoftNic,
    pd: Pdn,
    o: &Opts,
    op: TOp,
    post: Posting,
    nqp: usize,
) -> Result<TpRow, String> {
    let (mode, ring) = wait_mode(o, nqp);
    let mut qps = Vec::with_capacity(nqp);
    for pu in 0..nqp {
        qps.push(TpQp::new(nic, pd, op, pu, post, ring)?);
    }
    let count = o.batches.max(4) * TP_BATCH;
    let nb = o.batches.max(4) as u64;
    let warm = (nb / 4).max(4);
    // The native repetitions alternate with the softnic's where the native operation leaves
    // what the softnic's verification checks unchanged (a NOP, or the same copy src -> dst),
    // so each ratio is taken in one machine state (these VMs drift between runs); the
    // atomics' natives change their targets, so they run after verification.
    let interleave = matches!(op, TOp::Nop | TOp::Write | TOp::Read);
    let mut nrates = Vec::new();
    let mut niv = Vec::new();
    let result = (|| {
        run_stream(nic, &mut qps, warm, post, mode)?;
        if interleave {
            native_run(op, &qps, count / 4);
        }
        let mut rates = Vec::new();
        let mut iv = Vec::new();
        for _ in 0..o.reps {
            let (el, v) = run_stream(nic, &mut qps, nb, post, mode)?;
            rates.push((count * nqp) as f64 / el.as_secs_f64());
            iv.extend(v);
            if interleave {
                let (r, v) = native_run(op, &qps, count);
                nrates.push(r);
                niv.extend(v);
            }
        }
        tp_verify(nic, op, &qps, (warm + nb * o.reps as u64) * TP_BATCH as u64)?;
        Ok::<_, String>((rates, iv))
    })();
    let (rates, iv) = match result {
        Ok(r) => r,
        Err(e) => {
            let qpns: Vec<Qpn> = qps.iter().map(|q| q.w.qpn).collect();
            let cqns: Vec<Cqn> = qps.iter().map(|q| q.cq).collect();
            let d = diag(nic, &qpns, &cqns);
            cleanup(nic, &qps);
            return Err(format!("{e}{d}"));
        }
    };
    if !interleave {
        // Native baseline on the same buffers, after verification (it changes them).
        native_run(op, &qps, count / 4);
        for _ in 0..o.reps {
            let (r, v) = native_run(op, &qps, count);
            nrates.push(r);
            niv.extend(v);
        }
    }
    cleanup(nic, &qps);
    let at_p99_batch = |iv: &[f64]| (TP_BATCH * nqp) as f64 / stats(iv).p99 * 1e9;
    let soft_p99 = match mode {
        WaitMode::Spin | WaitMode::Yield => at_p99_batch(&iv),
        // The slowest repetition is the 1st-percentile rate.
        WaitMode::Sleep => min(&rates),
    };
    Ok(TpRow {
        label: match post {
            Posting::Recycled => op.name().to_string(),
            Posting::Rearm => format!("{} (re-armed)", op.name()),
            Posting::PostSend => format!("{} (post_send)", op.name()),
        },
        nqp,
        soft: median(&rates),
        soft_p99,
        native: median(&nrates),
        native_p99: at_p99_batch(&niv),
    })
}

fn cleanup(nic: &SoftNic, qps: &[TpQp]) {
    for q in qps {
        let _ = nic.destroy_qp(q.w.qpn);
        let _ = nic.destroy_cq(q.cq);
        let _ = nic.dereg_mr(q.src.mr.lkey);
        let _ = nic.dereg_mr(q.dst.mr.lkey);
    }
}

fn throughput_section(
    nic: &SoftNic,
    pd: Pdn,
    o: &Opts,
    anomalies: &mut Vec<String>,
) -> Result<(), String> {
    println!();
    println!("== 2. Throughput per opcode ==");
    let ring1 = TP_RING;
    println!(
        "   batches of {TP_BATCH} WQEs (last signaled), {} batches × {} reps per row (+ warm-up);",
        o.batches, o.reps
    );
    println!(
        "   ring {ring1} BBs (≤ {} batches outstanding) while the host has a core of its own (it polls \
         the CQ, yielding between polls);",
        ring1 as usize / TP_BATCH - 1
    );
    println!(
        "   ring {TP_RING_SHARED} BBs (≤ {} outstanding) when PUs + host exceed the cores and the \
         host sleeps 20 µs between polls.",
        TP_RING_SHARED as usize / TP_BATCH - 1
    );
    println!(
        "   M/s: median over reps. p99: rate at the 99th-percentile time between successive batch"
    );
    println!("   completions (* = host sleeps, so p99 over reps instead, i.e. the slowest rep).");
    println!(
        "   Native: one CPU thread per QP doing the same operation on the same buffers; for NOP,"
    );
    println!("   WRITE and READ its repetitions alternate with the softnic's (one machine state per ratio).");
    let wanted = |name: &str| o.ops.iter().any(|x| x == name);
    let all = [TOp::Nop, TOp::Write, TOp::Read, TOp::Cas, TOp::Faa];
    let mut configs: Vec<(TOp, Posting, usize)> = Vec::new();
    for op in all.into_iter().filter(|op| wanted(op.key())) {
        configs.push((op, Posting::Recycled, 1));
    }
    if wanted("re-armed") {
        configs.push((TOp::Write, Posting::Rearm, 1));
    }
    if wanted("post-send") {
        configs.push((TOp::Write, Posting::PostSend, 1));
    }
    if o.common.pus > 1 {
        for op in all.into_iter().filter(|op| wanted(op.key())) {
            configs.push((op, Posting::Recycled, o.common.pus));
        }
    }
    println!();
    println!(
        "   {:<22} {:>3} {:>11} {:>11} {:>9} {:>11} {:>11} {:>9}   native op",
        "op", "PUs", "softnic M/s", "p99 M/s", "ns/WQE/PU", "native M/s", "p99 M/s", "slowdown",
    );
    let mut write1: Option<(f64, f64)> = None;
    let mut last_nqp = 0;
    for (op, post, nqp) in configs {
        let (mode, ring) = wait_mode(o, nqp);
        if nqp != last_nqp {
            println!(
                "   -- {nqp} PU{}, one QP per PU; host {}; ring {ring} BBs ({} cores for {nqp} PU \
                 thread{} + host)",
                if nqp == 1 { "" } else { "s" },
                mode.name(),
                o.common.cores,
                if nqp == 1 { "" } else { "s" },
            );
            last_nqp = nqp;
        }
        match tp_row(nic, pd, o, op, post, nqp) {
            Ok(r) => {
                println!(
                    "   {:<22} {:>3} {:>11.2} {:>10.2}{} {:>9} {:>11.2} {:>11.2} {:>8.1}×   {}",
                    r.label,
                    r.nqp,
                    r.soft / 1e6,
                    r.soft_p99 / 1e6,
                    if mode == WaitMode::Sleep { "*" } else { " " },
                    fmt_ns(1e9 * r.nqp as f64 / r.soft),
                    r.native / 1e6,
                    r.native_p99 / 1e6,
                    r.native / r.soft,
                    op.native_name()
                );
                let (soft, nat) = (r.soft, r.native);
                if op == TOp::Write && post == Posting::Recycled && nqp == 1 {
                    write1 = Some((soft, nat));
                }
            }
            Err(e) => {
                print_failed(&format!("{:<22} {:>3}", op.name(), nqp));
                anomalies.push(format!("throughput {} on {nqp} PU(s): {e}", op.name()));
            }
        }
    }
    println!();
    println!("   verified after each row: WQE counters = posted, no error completions, QPs RTS,");
    println!("   completions in order with the right wr_id, WRITE/READ destinations = source,");
    println!("   CAS/FAA targets and returned old values as expected.");
    println!();
    if let Some((soft, nat)) = write1 {
        println!(
            "   target: 64 B WRITE, WQ order, 1 PU ≥ {WRITE_TARGET_MWQES:.0} M WQE/s: {:.2} M WQE/s: {}",
            soft / 1e6,
            verdict(soft / 1e6 >= WRITE_TARGET_MWQES)
        );
        println!(
            "   target: 64 B WRITE within {WRITE_TARGET_SLOWDOWN:.0}× of the native 64 B copy: {:.1}×: {}",
            nat / soft,
            verdict(nat / soft <= WRITE_TARGET_SLOWDOWN)
        );
    }
    Ok(())
}

// ---------------------------------------------------------------------------------------------

// ---------------------------------------------------------------------------------------------
// Section 3: queues without work

/// NOPs of the WQ-order run that section 3 times: the PU runs 256 of them a visit (its
/// burst), then visits every other queue, so 64 rounds.
const VISIT_NOPS: u64 = VISIT_RING as u64;
/// The send ring that holds them.
const VISIT_RING: u32 = 16 << 10;
const VISIT_ROUNDS: u64 = VISIT_NOPS / 256;

/// Queues beside the run in section 3.
const VISIT_COUNTS: [usize; 3] = [0, 16, 64];

/// Quiet queues on PU 0: idle (nothing posted) or parked (on a WAIT for `never`, a CQ that
/// nothing completes into: the queues complete into `cq`, which takes the flush completions
/// of those destroyed on the way).
struct Quiet {
    cq: Cqn,
    never: Cqn,
    idle: Vec<Qpn>,
    parked: Vec<Qpn>,
}

impl Quiet {
    /// Make it `idle` idle and `parked` parked queues (creating or destroying the difference).
    fn resize(&mut self, nic: &SoftNic, pd: Pdn, idle: usize, parked: usize) -> Result<(), String> {
        for (list, want, park) in [
            (&mut self.idle, idle, false),
            (&mut self.parked, parked, true),
        ] {
            while list.len() > want {
                let q = list.pop().expect("not empty");
                nic.destroy_qp(q).ctx("destroy_qp")?;
            }
            while list.len() < want {
                let info = loopback_qp(nic, pd, self.cq, 0, 64, false)?;
                if park {
                    post_endless_wait(nic, &info, self.never)?;
                }
                list.push(info.qpn);
            }
        }
        Ok(())
    }
}

/// One sample: ns per PU round of a WQ-order run of `VISIT_NOPS` NOPs, the `i`th on this
/// queue (its ring was written once; each sample advances the doorbell by a whole ring).
fn nops_round_ns(nic: &SoftNic, qpn: Qpn, cq: Cqn, i: u64) -> Result<f64, String> {
    let end = VISIT_NOPS * (i + 1);
    nic.note_posted(qpn, end - 1, end, i).ctx("note_posted")?;
    let t0 = Instant::now();
    nic.ring_doorbell(qpn, end).ctx("ring_doorbell")?;
    wait_cq(nic, cq, i + 1, WaitMode::Spin)?;
    Ok(ns(t0.elapsed()) / VISIT_ROUNDS as f64)
}

/// Native baseline: what checking `k` queues costs at least, one atomic load and compare
/// each (ns per queue).
fn native_scan_ns(k: usize) -> f64 {
    let words: Vec<std::sync::atomic::AtomicU64> = (0..k)
        .map(|i| std::sync::atomic::AtomicU64::new(i as u64))
        .collect();
    let rounds: u64 = 20_000;
    let t0 = Instant::now();
    let mut busy = 0u64;
    for r in 0..rounds {
        for w in &words {
            busy += u64::from(w.load(std::sync::atomic::Ordering::Acquire) > black_box(r));
        }
    }
    black_box(busy);
    ns(t0.elapsed()) / (rounds * k.max(1) as u64) as f64
}

fn visits_section(nic: &SoftNic, pd: Pdn, o: &Opts) -> Result<(), String> {
    println!();
    println!("== 3. Queues without work on a busy PU (a manager's idle clients) ==");
    println!(
        "   {VISIT_NOPS} NOPs in WQ order on PU 0, which runs 256 a visit and then visits every \
         other"
    );
    println!(
        "   queue ({VISIT_ROUNDS} rounds), alone and beside K idle (nothing posted) or parked"
    );
    println!(
        "   (WAIT that never completes) queues; the setups take turns, a few samples each, so"
    );
    println!(
        "   every one sees the machine's phases alike. ns per round (median), and per visit ="
    );
    println!("   (round beside K - round alone) / K. Native: one atomic load + compare per queue.");
    let mut quiet = Quiet {
        cq: counting_cq(nic)?,
        never: counting_cq(nic)?,
        idle: Vec::new(),
        parked: Vec::new(),
    };
    let cq = counting_cq(nic)?;
    let info = loopback_qp(nic, pd, cq, 0, VISIT_RING, false)?;
    let mut w = SqWriter::new(&info, false);
    // (idle, parked) queues beside the run, in the order the setups take turns.
    let setups: Vec<(usize, usize)> = std::iter::once((0, 0))
        .chain(VISIT_COUNTS.iter().skip(1).flat_map(|&k| [(k, 0), (0, k)]))
        .collect();
    let reps = (o.iters / 250).max(4);
    let per_turn = 5;
    let mut samples: Vec<Vec<f64>> = vec![Vec::new(); setups.len()];
    let result = (|| {
        for i in 0..VISIT_NOPS {
            w.push(nic, &nop(flags_if(i + 1 == VISIT_NOPS), i))?;
        }
        let mut n = 0;
        for rep in 0..reps + 1 {
            for (j, &(idle, parked)) in setups.iter().enumerate() {
                quiet.resize(nic, pd, idle, parked)?;
                for t in 0..per_turn + 1 {
                    let v = nops_round_ns(nic, info.qpn, cq, n)?;
                    n += 1;
                    // The first repetition and each turn's first sample warm up.
                    if rep > 0 && t > 0 {
                        samples[j].push(v);
                    }
                }
            }
        }
        let stalled: u64 = quiet
            .parked
            .iter()
            .map(|&q| nic.counters(q).map(|c| c.wait_stalls).unwrap_or(0))
            .sum();
        if stalled != quiet.parked.len() as u64 {
            return Err(format!(
                "{stalled} of {} parked queues stalled on their WAIT{}",
                quiet.parked.len(),
                diag(nic, &quiet.parked[..2], &[quiet.never])
            ));
        }
        Ok::<_, String>(())
    })();
    let _ = quiet.resize(nic, pd, 0, 0);
    let _ = nic.destroy_qp(info.qpn);
    let _ = nic.destroy_cq(cq);
    let _ = nic.destroy_cq(quiet.never);
    let _ = nic.destroy_cq(quiet.cq);
    result?;
    let med: Vec<f64> = samples.iter().map(|v| median(v)).collect();
    println!(
        "   {:>4} {:>14} {:>11} {:>16} {:>11} {:>14}",
        "K", "idle ns/round", "per visit", "parked ns/round", "per visit", "native/queue"
    );
    println!(
        "   {:>4} {:>14} {:>11} {:>16} {:>11} {:>14}",
        0,
        fmt_ns(med[0]),
        "-",
        fmt_ns(med[0]),
        "-",
        "-"
    );
    for (i, &k) in VISIT_COUNTS.iter().skip(1).enumerate() {
        let (idle, parked) = (med[1 + 2 * i], med[2 + 2 * i]);
        println!(
            "   {:>4} {:>14} {:>11} {:>16} {:>11} {:>14}",
            k,
            fmt_ns(idle),
            fmt_ns((idle - med[0]) / k as f64),
            fmt_ns(parked),
            fmt_ns((parked - med[0]) / k as f64),
            fmt_ns(native_scan_ns(k))
        );
    }
    Ok(())
}

fn main() {
    let o = parse_args();
    let started = Instant::now();
    print_head(
        "softnic_bench: RedN §5.1 microbenchmarks on the softnic, with native baselines",
        &o.common,
        &format!("{} PUs", o.common.pus),
    );
    println!("   Instant::now() costs {:.1} ns", instant_overhead_ns());
    if o.common.cores >= 2 {
        let rtt = cross_thread_rtt(if o.common.quick { 2000 } else { 20000 });
        println!(
            "   floor: cross-thread round trip through a SharedBuffer word: median {} ns, p99 {} ns",
            fmt_ns(rtt.median),
            fmt_ns(rtt.p99)
        );
        let [none, event_word, park_flag] =
            handoff_anatomy(if o.common.quick { 2000 } else { 20000 });
        println!(
            "   hand-off anatomy (the same round trip, interleaved; each hand-off also tells the other"
        );
        println!(
            "   thread as the softnic's PUs do): nothing {} ns; locked add on an event word the target"
        ,fmt_ns(none.median));
        println!(
            "   reads every round (before this session) {} ns; fence + read of a park flag (now) {} ns",
            fmt_ns(event_word.median),
            fmt_ns(park_flag.median)
        );
    }

    let nic = match o.common.softnic("bench", o.common.pus) {
        Ok(n) => n,
        Err(e) => {
            eprintln!("softnic_bench: cannot start the softnic: {e}");
            std::process::exit(2);
        }
    };
    let pd = nic.alloc_pd().expect("alloc_pd");
    let mut anomalies = Vec::new();
    section("latency", o.latency, &mut anomalies, |a| {
        latency_section(&nic, pd, &o, a)
    });
    section("throughput", o.throughput, &mut anomalies, |a| {
        throughput_section(&nic, pd, &o, a)
    });
    section("visits", o.visits, &mut anomalies, |_| {
        visits_section(&nic, pd, &o)
    });
    println!();
    print_anomalies(&anomalies, started);
    drop(nic);
    if !anomalies.is_empty() {
        std::process::exit(1);
    }
}
