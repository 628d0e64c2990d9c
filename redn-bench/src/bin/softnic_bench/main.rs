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
//!
//! Here: the command line, the options and `main`; `header` has the header's timing floors,
//! `chain` one chain of section 1 (its queues, how the host sees it end, the native chain),
//! `latency` section 1's runs and tables, `throughput` section 2, `visits` section 3.

use redn_bench::native::cross_thread_rtt;
use redn_bench::opts::{parse_num, CommonOpts};
use redn_bench::report::{fmt_ns, print_anomalies, print_head, section};
use redn_bench::wait::{wait_produced, Backoff, WaitMode};
use redn_sys::nic::Nic;
use redn_sys::softnic::SoftNic;
use redn_sys::{Cqn, Qpn};
use std::time::Instant;

mod chain;
mod header;
mod latency;
mod throughput;
mod visits;
use chain::Detect;
use header::{handoff_anatomy, instant_overhead_ns};
use latency::latency_section;
use throughput::throughput_section;
use visits::visits_section;

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
    --pu-cpus LIST      pin PU i of each softnic to the i-th CPU of LIST (comma-separated,
                        taken again from its start past its end); default: not pinned
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
  to the longest chains alone); the time runs from the doorbell until the host sees the
  chain done, four ways (--detect): \"poll\" busy-polls the CQ with Nic::poll_cq, as a
  verbs host does; \"count\" busy-polls Nic::cq_produced, the count WAIT compares with;
  \"flag\" appends one 8 B inline WRITE to a host word the host spins on (so the host
  never calls into the softnic while the chain runs); \"sleep\" (doorbell order only)
  appends WAIT(last NOP's CQE) + a signaled NOP to the master, whose CQ is armed for a
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
