//! Section 2: throughput per opcode: the throughput queue pairs and their batches, the native
//! baseline on the same buffers, the checks after each row, and the table and its targets.

use super::{diag, wait_cq, Opts};
use redn_bench::bytes::low_byte;
use redn_bench::native::on_threads;
use redn_bench::queues::{flags_if, SqWriter};
use redn_bench::report::{fmt_ns, print_failed, verdict};
use redn_bench::setup::{loopback_qp, Region};
use redn_bench::stats::{median, min, ns, stats};
use redn_bench::wait::{WaitMode, WAIT_TIMEOUT};
use redn_bench::Ctx;
use redn_program::wqe::{
    encode_wqe, wqe_index, Opcode, Payload, WorkRequest, WqeFlags, WrOp, BB_SIZE,
};
use redn_sys::conv::idx;
use redn_sys::nic::{Completion, CqConfig, MrInfo, Nic};
use redn_sys::softnic::SoftNic;
use redn_sys::{Cqn, Pdn, QpState, Qpn};
use std::hint::black_box;
use std::time::{Duration, Instant};

/// Throughput ring when the host has a core of its own (it polls the CQ, yielding in between).
const TP_RING: u32 = 4096;
/// Throughput ring when host and PUs share cores: the host sleeps (≥ ~60 µs with Linux timer
/// slack), so the ring must hold more queued work than that.
const TP_RING_SHARED: u32 = 16384;
const TP_BATCH: usize = 1024;
const TP_REGION: usize = 4096;
const WRITE_TARGET_MWQES: f64 = 50.0;
const WRITE_TARGET_SLOWDOWN: f64 = 5.0;

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

/// Native rate (ops/s) with one thread per QP (each on a CPU of its own: `on_threads`), plus
/// per-chunk times.
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

pub(crate) fn throughput_section(
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
