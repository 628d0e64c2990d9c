//! What the benchmark binaries share: command-line parsing, statistics, waiting for the
//! softnic, writing WQEs straight into a send ring, the native baselines' timing and the
//! report's head and tail.

use redn_program::wqe::{encode_wqe, Opcode, WorkRequest, WqeFlags, WrOp, BB_SIZE};
use redn_sys::mem::SharedBuffer;
use redn_sys::nic::{Nic, QpInfo};
use redn_sys::softnic::{Prefetch, SoftNic};
use redn_sys::{Cqn, Qpn};
use std::fmt::Display;
use std::hint::black_box;
use std::sync::{Arc, Barrier};
use std::time::{Duration, Instant};

/// How long the host waits for the softnic before it calls it a hang.
pub const WAIT_TIMEOUT: Duration = Duration::from_secs(2);
/// A busy-polling host yields its CPU after this long: if the PU it waits for was scheduled
/// on the same core (other processes running), the PU only runs once the host yields.
pub const SPIN_BEFORE_YIELD: Duration = Duration::from_micros(20);

// ---------------------------------------------------------------------------------------------
// Options

/// The options both benchmarks take.
#[derive(Clone, Debug)]
pub struct CommonOpts {
    pub quick: bool,
    /// Softnic processing units (default: the available cores; at most 64).
    pub pus: usize,
    /// Available cores.
    pub cores: usize,
    pub prefetch: Prefetch,
}

/// The value `v` of option `name`: a whole number from 1.
pub fn parse_num(name: &str, v: Option<String>) -> Result<usize, String> {
    let v = v.ok_or_else(|| format!("{name} needs a value"))?;
    let n: usize = v
        .parse()
        .map_err(|_| format!("{name}: '{v}' is not a number"))?;
    if n == 0 {
        return Err(format!("{name} must be at least 1"));
    }
    Ok(n)
}

fn parse_prefetch(v: Option<String>) -> Result<Prefetch, String> {
    let v = v.ok_or("--prefetch needs a value")?;
    match v.as_str() {
        "at-execute" | "atexecute" | "0" => Ok(Prefetch::AtExecute),
        "adversarial" => Ok(Prefetch::Adversarial),
        s => {
            let d = s.strip_prefix("depth:").unwrap_or(s);
            d.parse::<u32>()
                .map(Prefetch::Depth)
                .map_err(|_| format!("--prefetch: '{v}' is not at-execute, adversarial or depth:N"))
        }
    }
}

/// Read the command line. `-h` / `--help` prints `help` and exits; `--quick`, `--pus N` and
/// `--prefetch P` are read here. Any other option goes to `other` with its name and a way to
/// take its value (`--name=value`, or the next argument); `other` returns false for an
/// option it does not know. On an error, says so on stderr (as `bench`) and exits with
/// status 2.
pub fn parse_args(
    bench: &str,
    help: &str,
    other: impl FnMut(&str, &mut dyn FnMut() -> Option<String>) -> Result<bool, String>,
) -> CommonOpts {
    match read_args(help, other) {
        Ok(o) => o,
        Err(e) => {
            eprintln!("{bench}: {e}\n(see --help)");
            std::process::exit(2);
        }
    }
}

fn read_args(
    help: &str,
    mut other: impl FnMut(&str, &mut dyn FnMut() -> Option<String>) -> Result<bool, String>,
) -> Result<CommonOpts, String> {
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    let (mut quick, mut pus) = (false, None);
    let mut prefetch = Prefetch::Depth(8);
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        let (name, inline) = match a.split_once('=') {
            Some((n, v)) if a.starts_with("--") => (n.to_string(), Some(v.to_string())),
            _ => (a.clone(), None),
        };
        let mut value = || inline.clone().or_else(|| args.next());
        match name.as_str() {
            "-h" | "--help" => {
                print!("{help}");
                std::process::exit(0);
            }
            "--quick" => quick = true,
            "--pus" => pus = Some(parse_num("--pus", value())?),
            "--prefetch" => prefetch = parse_prefetch(value())?,
            name => {
                if !other(name, &mut value)? {
                    return Err(format!("unknown option '{name}'"));
                }
            }
        }
    }
    let pus = pus.unwrap_or(cores);
    if pus > 64 {
        return Err("--pus: the softnic has at most 64 PUs".into());
    }
    Ok(CommonOpts {
        quick,
        pus,
        cores,
        prefetch,
    })
}

/// The report's head: `title`, then the cores, the PUs (`pus` says how many, where), the
/// prefetch and the kind of run, with a warning in a debug build.
pub fn print_head(title: &str, o: &CommonOpts, pus: &str) {
    println!("{title}");
    println!(
        "   {} cores, {pus}, prefetch {:?}, {}{}",
        o.cores,
        o.prefetch,
        if o.quick { "quick run" } else { "full run" },
        if cfg!(debug_assertions) {
            "  !! debug build: numbers are meaningless, use --release"
        } else {
            ""
        }
    );
}

/// The report's tail: the anomalies and the total run time.
pub fn print_anomalies(anomalies: &[String], started: Instant) {
    if anomalies.is_empty() {
        println!("anomalies: none");
    } else {
        println!("anomalies ({}):", anomalies.len());
        for a in anomalies {
            println!(" - {a}");
        }
    }
    println!("total run time {:.1} s", started.elapsed().as_secs_f64());
}

// ---------------------------------------------------------------------------------------------
// Small helpers

pub trait Ctx<T> {
    fn ctx(self, what: &str) -> Result<T, String>;
}

impl<T, E: Display> Ctx<T> for Result<T, E> {
    fn ctx(self, what: &str) -> Result<T, String> {
        self.map_err(|e| format!("{what}: {e}"))
    }
}

/// Median and p99 (nearest rank) of a sample set.
#[derive(Clone, Copy, Debug)]
pub struct Stats {
    pub median: f64,
    pub p99: f64,
}

impl Default for Stats {
    fn default() -> Self {
        Stats {
            median: f64::NAN,
            p99: f64::NAN,
        }
    }
}

fn percentile(sorted: &[f64], q: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    let rank = ((q * sorted.len() as f64).ceil() as usize).clamp(1, sorted.len());
    sorted[rank - 1]
}

pub fn stats(v: &[f64]) -> Stats {
    let mut s = v.to_vec();
    s.sort_by(f64::total_cmp);
    Stats {
        median: percentile(&s, 0.5),
        p99: percentile(&s, 0.99),
    }
}

pub fn median(v: &[f64]) -> f64 {
    stats(v).median
}

pub fn ns(d: Duration) -> f64 {
    d.as_secs_f64() * 1e9
}

pub fn verdict(met: bool) -> &'static str {
    if met {
        "MET"
    } else {
        "NOT MET"
    }
}

pub fn flags_if(signaled: bool) -> WqeFlags {
    if signaled {
        WqeFlags::SIGNALED
    } else {
        WqeFlags::NONE
    }
}

pub fn nop(flags: WqeFlags, wr_id: u64) -> WorkRequest {
    WorkRequest {
        wr_id,
        flags,
        op: WrOp::Nop {
            raw_segments: Vec::new(),
        },
    }
}

// ---------------------------------------------------------------------------------------------
// Waiting for the softnic

/// How the host waits for the softnic.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum WaitMode {
    /// Busy-poll, yielding after SPIN_BEFORE_YIELD (the PUs may share the host's core).
    Spin,
    /// Poll, yield the CPU between polls: host + PUs fit the cores, but a busy host would
    /// steal a PU's CPU whenever anything else runs on the machine. (offload_bench never
    /// yields.)
    Yield,
    /// Poll, then sleep 20 µs between polls: host and PUs share cores.
    Sleep,
}

impl WaitMode {
    /// How the report names it.
    pub fn name(self) -> &'static str {
        match self {
            WaitMode::Spin => "busy-polls",
            WaitMode::Yield => "polls + sched_yield",
            WaitMode::Sleep => "polls + 20 µs sleep",
        }
    }
}

/// What a polling host does between two polls that found nothing: spin, yield or sleep (see
/// [`WaitMode`]); while spinning it reads the clock only every `check_every` polls.
#[derive(Debug)]
pub struct Backoff {
    spins: u32,
    check_every: u32,
    started: Option<Instant>,
}

impl Backoff {
    /// Time out WAIT_TIMEOUT after `started`; with `None`, after the first look at the clock
    /// (so nothing is spent on the clock before that).
    pub fn new(check_every: u32, started: Option<Instant>) -> Backoff {
        Backoff {
            spins: 0,
            check_every,
            started,
        }
    }

    fn waited(&mut self) -> Duration {
        let now = Instant::now();
        now - *self.started.get_or_insert(now)
    }

    /// Pause after a poll that found nothing; `Err` once WAIT_TIMEOUT has passed.
    pub fn pause(&mut self, mode: WaitMode) -> Result<(), ()> {
        self.spins = self.spins.wrapping_add(1);
        if mode != WaitMode::Spin {
            if self.waited() > WAIT_TIMEOUT {
                return Err(());
            }
            if mode == WaitMode::Sleep {
                std::thread::sleep(Duration::from_micros(20));
            } else {
                std::thread::yield_now();
            }
        } else if self.spins % self.check_every == 0 {
            let waited = self.waited();
            if waited > WAIT_TIMEOUT {
                return Err(());
            }
            if waited > SPIN_BEFORE_YIELD {
                std::thread::yield_now();
            }
        } else {
            std::hint::spin_loop();
        }
        Ok(())
    }
}

pub fn timed_out(cq: Cqn, p: u64, target: u64) -> String {
    format!("timed out after {WAIT_TIMEOUT:?}: CQ {cq} produced {p}, waiting for {target}")
}

/// Wait until `cq` has produced at least `target` completions (what WAIT counts).
pub fn wait_produced(
    nic: &SoftNic,
    cq: Cqn,
    target: u64,
    mode: WaitMode,
    mut backoff: Backoff,
) -> Result<(), String> {
    loop {
        let p = nic.cq_produced(cq).ctx("cq_produced")?;
        if p >= target {
            return Ok(());
        }
        backoff.pause(mode).map_err(|()| timed_out(cq, p, target))?;
    }
}

/// Opcodes a diagnosis counts WQEs of, in order: name, opcode, and whether a short diagnosis
/// (one without receives) counts it too.
const DIAG_OPCODES: [(&str, Opcode, bool); 11] = [
    ("NOP", Opcode::Nop, true),
    ("WAIT", Opcode::Wait, true),
    ("SEND_EN", Opcode::SendEn, true),
    ("RECV_EN", Opcode::RecvEn, false),
    ("WRITE", Opcode::RdmaWrite, true),
    ("WRITE_IMM", Opcode::RdmaWriteImm, false),
    ("SEND", Opcode::Send, false),
    ("READ", Opcode::RdmaRead, true),
    ("CAS", Opcode::AtomicCs, true),
    ("MCAS", Opcode::AtomicMaskedCs, false),
    ("FAA", Opcode::AtomicFa, true),
];

/// What the softnic says about some queues, for hang and error reports: per QP its state,
/// consumer index, WQE counts (in total and by opcode), errors and WAIT stalls; with
/// `receives`, also the receive-side opcodes, RNR waits and receives; per CQ what it produced.
pub fn diag(nic: &SoftNic, qps: &[Qpn], cqs: &[Cqn], receives: bool) -> String {
    let mut s = String::new();
    for &q in qps {
        let st = nic.qp_state(q).map_or("?".into(), |s| s.to_string());
        let ci = nic.sq_consumed(q).map_or("?".into(), |c| c.to_string());
        match nic.counters(q) {
            Ok(c) => {
                let by_op: Vec<String> = DIAG_OPCODES
                    .iter()
                    .filter(|&&(_, _, short)| short || receives)
                    .map(|&(name, op, _)| format!("{name} {}", c.by_opcode(op)))
                    .collect();
                s += &format!(
                    "\n      QP {q}: state {st}, sq_consumed {ci}, WQEs {} ({}), errors {}, \
                     wait_stalls {}",
                    c.total_wqes(),
                    by_op.join(", "),
                    c.errors,
                    c.wait_stalls
                );
                if receives {
                    s += &format!(", rnr_waits {}, recvs {}", c.rnr_waits, c.recvs);
                }
            }
            Err(e) => s += &format!("\n      QP {q}: {e}"),
        }
    }
    for &c in cqs {
        let p = nic.cq_produced(c).map_or("?".into(), |p| p.to_string());
        s += &format!("\n      CQ {c}: produced {p}");
    }
    s
}

// ---------------------------------------------------------------------------------------------
// Send rings

/// Writes WQE bytes straight into a send ring (what a driver does), so encoding is never
/// timed; the doorbell (or a SEND_EN) is what a measurement starts with.
#[derive(Debug)]
pub struct SqWriter {
    pub qpn: Qpn,
    pub buf: Arc<SharedBuffer>,
    off: usize,
    entries: u64,
    /// Producer index (BBs), absolute.
    pub pi: u64,
    check_full: bool,
}

impl SqWriter {
    /// With `check_full`, [`SqWriter::push`] asks the softnic how far it has consumed and
    /// fails rather than overwrite WQEs it has not executed yet.
    pub fn new(info: &QpInfo, check_full: bool) -> SqWriter {
        SqWriter {
            qpn: info.qpn,
            buf: Arc::clone(&info.sq.buffer),
            off: info.sq.offset,
            entries: u64::from(info.sq.entries),
            pi: 0,
            check_full,
        }
    }

    /// Byte offset in `buf` of ring slot `index` (absolute).
    pub fn slot_off(&self, index: u64) -> usize {
        self.off + (index & (self.entries - 1)) as usize * BB_SIZE
    }

    /// Write `wr` at the producer index and tell the softnic it was posted (no doorbell).
    pub fn push(&mut self, nic: &SoftNic, wr: &WorkRequest) -> Result<(), String> {
        let e = encode_wqe(wr, self.qpn, self.pi as u16).ctx("encode_wqe")?;
        let end = self.pi + e.bbs() as u64;
        if self.check_full {
            let consumed = nic.sq_consumed(self.qpn).ctx("sq_consumed")?;
            if end - consumed > self.entries {
                return Err(format!(
                    "send ring of QP {} full ({} BBs)",
                    self.qpn, self.entries
                ));
            }
        }
        for (i, bb) in e.bytes().chunks_exact(BB_SIZE).enumerate() {
            self.buf.write(self.slot_off(self.pi + i as u64), bb);
        }
        nic.note_posted(self.qpn, self.pi, end, wr.wr_id)
            .ctx("note_posted")?;
        self.pi = end;
        Ok(())
    }

    /// Ring the doorbell up to the producer index.
    pub fn ring(&self, nic: &SoftNic) -> Result<(), String> {
        nic.ring_doorbell(self.qpn, self.pi).ctx("ring_doorbell")
    }
}

/// Post a WAIT for `cq`'s first completion on the queue `info` and ring its doorbell: with a CQ
/// that nothing completes into, the queue sits on it for good (a manager's idle client).
pub fn post_endless_wait(nic: &SoftNic, info: &QpInfo, cq: Cqn) -> Result<(), String> {
    let mut w = SqWriter::new(info, false);
    let wait = WorkRequest {
        wr_id: 0,
        flags: WqeFlags::NONE,
        op: WrOp::Wait { cq, count: 0 },
    };
    w.push(nic, &wait)?;
    w.ring(nic)
}

/// The master queue's half of a doorbell-ordered chain of `n` steps (RedN §3.1): SEND_EN of
/// the managed queue `q` up to its first WQE, then for each further step WAIT(`q_cq`, the
/// previous WQE's completion) + SEND_EN of the next. `qb` is `q`'s producer index before the
/// chain's WQEs and `base` the CQ's count then; the last SEND_EN enables `extra` more WQEs.
#[allow(clippy::too_many_arguments)]
pub fn push_doorbell_master(
    nic: &SoftNic,
    m: &mut SqWriter,
    q: Qpn,
    q_cq: Cqn,
    qb: u64,
    base: u64,
    n: u64,
    extra: u64,
) -> Result<(), String> {
    let enable = |k: u64| WorkRequest {
        wr_id: 0,
        flags: WqeFlags::NONE,
        op: WrOp::SendEnable {
            qp: q,
            pi: (qb + k + if k == n { extra } else { 0 }) as u32,
        },
    };
    m.push(nic, &enable(1))?;
    for k in 1..n {
        let wait = WorkRequest {
            wr_id: 0,
            flags: WqeFlags::NONE,
            op: WrOp::Wait {
                cq: q_cq,
                count: (base + k - 1) as u32,
            },
        };
        m.push(nic, &wait)?;
        m.push(nic, &enable(k + 1))?;
    }
    Ok(())
}

// ---------------------------------------------------------------------------------------------
// Native baselines

/// Per-call ns of `f`, each sample the mean over a batch of `batch` calls; `warm` calls first,
/// untimed.
pub fn mean_ns_samples<T>(
    samples: usize,
    batch: usize,
    warm: usize,
    mut f: impl FnMut() -> T,
) -> Vec<f64> {
    for _ in 0..warm {
        black_box(f());
    }
    let mut v = Vec::with_capacity(samples);
    for _ in 0..samples {
        let t0 = Instant::now();
        for _ in 0..batch {
            black_box(f());
        }
        v.push(ns(t0.elapsed()) / batch as f64);
    }
    v
}

/// `f(0)`, ..., `f(threads - 1)`, each on a thread of its own, released together by a
/// barrier; the results in order (`Err` where the thread panicked).
pub fn on_threads<R: Send>(
    threads: usize,
    f: impl Fn(usize) -> R + Sync,
) -> Vec<std::thread::Result<R>> {
    let barrier = Barrier::new(threads);
    std::thread::scope(|s| {
        let hs: Vec<_> = (0..threads)
            .map(|i| {
                let (b, f) = (&barrier, &f);
                s.spawn(move || {
                    b.wait();
                    f(i)
                })
            })
            .collect();
        hs.into_iter().map(|h| h.join()).collect()
    })
}
