//! offload_bench: the RedN paper's Table 3 and §5.2–5.3 run against the softnic, each figure
//! printed next to baselines measured in the same run.
//!
//! 1. Construct throughput (Table 3): `if`, unrolled `while`, recycled `while`, on one PU and
//!    on all PUs (one instance per PU).
//! 2. Hash GET latency (§5.2) by value size, one bucket vs two buckets sequentially vs two
//!    buckets in parallel, with collisions (the key in the second bucket).
//! 3. Linked-list find latency by position (§5.3), with and without `break`, and the WQEs each
//!    lookup executes.
//!
//! Baselines: the same lookup done by the CPU on the same `SharedBuffer`, and the same lookup
//! done by the client with one-sided RDMA READs over the same pair of softnics.
//!
//! Run with `cargo run --release -p redn-bench --bin offload_bench -- --help`. It prints
//! tables; nothing is asserted. Exit status 1 means the softnic or a program misbehaved (a hang,
//! an error completion, a wrong response, wrong WQE counts): see the "anomalies" list.
//!
//! Here: the command line, the small helpers and `main` (with the installation-cost table);
//! `env` has the two softnics, installing an offload and triggering it; `contents` the
//! regions' layout and the hash table and list in them; `baselines` the one-sided READ and
//! CPU baselines; `programs` the Builder programs of the constructs table; `constructs`,
//! `hash` and `list` the three sections.

use redn_bench::opts::{parse_num, CommonOpts};
use redn_bench::report::{print_anomalies, print_head, section};
use redn_bench::steal::{fmt_share, StealMeter};
use redn_bench::wait::{timed_out, wait_produced, Backoff, WaitMode, WAIT_TIMEOUT};
use redn_bench::Ctx;
use redn_program::wqe::{Payload, WorkRequest, WqeFlags, WrOp};
use redn_sys::conv::idx;
use redn_sys::nic::{CompChannel, Completion, Nic};
use redn_sys::softnic::SoftNic;
use redn_sys::{Cqn, Qpn};
use std::time::Instant;

mod baselines;
mod constructs;
mod contents;
mod env;
mod hash;
mod list;
mod programs;
use constructs::constructs_section;
use env::Env;
use hash::hash_section;
use list::list_section;

const HELP: &str = "\
offload_bench: RedN Table 3 and §5.2-5.3 on the softnic, with same-run baselines

USAGE:
    cargo run --release -p redn-bench --bin offload_bench -- [OPTIONS]

OPTIONS:
    --quick             short run (< ~15 s): fewer samples, repetitions and instances
    --pus N             server softnic processing units (default: available cores); the
                        \"all PUs\" rows run the same work on every PU at once
    --samples N         hash GET latency samples per row (default 3000, quick 300); list
                        rows take half of that, list rows with a fresh installation per
                        lookup a quarter
    --reps N            throughput repetitions per row, and interleaved latency blocks
                        (default 5, quick 3)
    --prefetch P        softnic WQE prefetch: at-execute | adversarial | depth:N | N
                        (default depth:8, the softnic default)
    --pu-cpus LIST      pin PU i of each softnic to the i-th CPU of LIST (comma-separated,
                        taken again from its start past its end); default: not pinned
    --only SECTION      constructs | hash | list (default: all three)
    --rows LIST         the constructs section's rows to run, comma-separated from if,
                        pipelined, drained, unrolled, recycled, server-loop (default: all;
                        for profiling one row)
    -h, --help          this text

Setup: a server softnic (--pus PUs) runs the offloads; a client softnic (as many PUs)
  holds the client's queue pairs (on its PU 0, but for the pipelined construct rows, whose
  instances' client QPs take its PUs in turn, so one client PU is not what limits the
  server's scaling), connected to the offload's client-facing queue with
  SoftNic::connect_pair, as a remote client would be. One 2 MiB server region (all rights)
  holds the hash table, the list and the values; the client has a 256 KiB region whose first
  64 KiB receive the responses. Installing (program::install) is never timed: bounded
  programs are installed with a few invocations and reinstalled when used up (the install
  cost grows with the program size; see the table at the end);
  list-find-break serves one lookup per installation, so it gets one per lookup.
  Triggers are encoded into the client's send ring before the clock starts; the clock starts
  at the client's doorbell and stops when the host sees the last response's completion on
  the client CQ (latency: busy-polling Nic::cq_produced, yielding after 20 µs; throughput:
  the same when the host has a core of its own, else polling every 20 µs). Right before
  each timed sample or run, the client's PU and the server PUs the operation uses are woken
  by a NOP on a queue of their own (an idle softnic PU yields after 5 µs and parks after
  50 µs, or at once and after 5 µs while the process's awake PUs outnumber its cores,
  where a NIC's PUs always poll); PUs it does not use are left alone, since a
  spinning PU with nothing to do only takes a core from those that have work.

Section 1 (Table 3, construct throughput; median over reps, ops/s):
  if            a Builder program: n x { CAS on a conditional WQE's control word (if_eq,
                signaled, fenced), WAIT for it, SEND_EN of the conditional WQE } on an
                unmanaged worker queue; the conditional 8 B WRITE, posted as NOP, on a
                managed queue; every other `if` is taken. Several instances per PU, all
                started by their doorbells at once; done at the last conditional WQE's CQE.
  if in hash-get    the catalog's hash-get (one bucket, hits), triggers pipelined by the
                client: a GET is READ + if + else + WAITs/ENABLEs + the response.
                backlog drained: the same GETs with the clients out of the way: each
                instance is installed without its entry enables, every trigger is sent
                and received first, the client's PUs park, and the server's PUs then
                drain the backlog alone (host asleep), timed from the enables' post to
                the last answer's completion stamp; the instances of each server PU
                answer into a client CQ and response area of their own. 1-PU and 2-PU
                runs alternate, each pair followed by the native GET loop on 1 and 2
                threads. Target: drained GETs/s on 2 server PUs ≥ 1.7× those on 1
                (median of the pairs' ratios), printed beside the native loop's ratio:
                a machine whose two CPUs do not double native work cannot show it.
  while, unrolled   list-find without break over an 8-node list, key absent (every
                iteration runs), triggers pipelined: iterations/s.
  while, recycled   a minimal recycled loop built with the Builder: two managed queues that
                re-arm each other; each round, each queue runs a byte-reversing READ and a
                FETCH_ADD (advance_count, patching the other's SEND_EN count with host-order
                atomic replies) + SEND_EN (fenced); no host involvement
                after setup: rounds/s from the WQE counters over a time window.
  while, recycled (server-loop)   the catalog's server-loop serving pipelined GET triggers
                (it enables one receive per round, so the client's SENDs wait for it).
  Native: the same memory operations done by one CPU thread per PU, thread i pinned to
  the i-th CPU the process may use.

Section 2 (§5.2, hash GET latency by value size): hash-get (one bucket, hit),
  hash-get-seq and hash-get-par with the key in the second bucket (the first holds another
  key); a two-bucket GET is done when both responses (a zero-length miss and the value) are
  in. One extra row moves hash-get-par's client-facing queue to PU 1, where its join runs.
  The host busy-polls the client CQ; two more rows repeat hash-get and hash-get-par with a
  host that sleeps on a completion channel instead (Nic::req_notify_cq, as RedN's client
  thread does), which frees its core for the PUs but adds its wake-up to every GET.
  Baselines: one-sided READs over the same softnic connection (client READs the bucket,
  checks the key, READs the value; three READs for the collision case, both buckets read in
  one post), and the CPU doing the lookup on the same SharedBuffer (read bucket, compare,
  copy the value into a second buffer; mean over small batches).

Section 3 (§5.3, list-find latency by position 1..8 and absent): list-find without break
  (the matching node's value, then an end marker after the whole traversal) on a warm
  installation and on a fresh one per lookup, list-find-break (fresh per lookup, as it must
  be), and list-find with its client-facing queue on PU 1. Baselines: pointer chasing with
  one-sided READs (one READ per node, then the value) and the CPU walking the same list.
  WQEs per lookup: Nic::counters summed over the program's queues, read before a lookup and
  after the chain went quiet.
";

// ---------------------------------------------------------------------------------------------
// Options

#[derive(Clone, Debug)]
struct Opts {
    /// --quick, --pus, --prefetch, and the cores.
    common: CommonOpts,
    samples: usize,
    reps: usize,
    constructs: bool,
    hash: bool,
    list: bool,
    /// The constructs section's rows to run (`--rows`; `None`: all).
    rows: Option<Vec<String>>,
}

impl Opts {
    /// True if the constructs row `name` is to run.
    fn row(&self, name: &str) -> bool {
        self.rows
            .as_ref()
            .map_or(true, |r| r.iter().any(|x| x == name))
    }
}

/// The constructs section's rows, as `--rows` names them.
const ROWS: [&str; 6] = [
    "if",
    "pipelined",
    "drained",
    "unrolled",
    "recycled",
    "server-loop",
];

fn parse_args() -> Opts {
    let (mut samples, mut reps) = (None, None);
    let mut only: Option<String> = None;
    let mut rows: Option<Vec<String>> = None;
    let common = redn_bench::opts::parse_args("offload_bench", HELP, |name, value| {
        match name {
            "--samples" => samples = Some(parse_num("--samples", value())?),
            "--reps" => reps = Some(parse_num("--reps", value())?),
            "--only" => match value().as_deref() {
                Some(s @ ("constructs" | "hash" | "list")) => only = Some(s.to_string()),
                other => {
                    return Err(format!(
                        "--only: expected constructs, hash or list, got {other:?}"
                    ))
                }
            },
            "--rows" => {
                let list = value().unwrap_or_default();
                let names: Vec<String> = list.split(',').map(str::to_string).collect();
                if let Some(bad) = names.iter().find(|n| !ROWS.contains(&n.as_str())) {
                    return Err(format!(
                        "--rows: expected names from {}, got {bad:?}",
                        ROWS.join(", ")
                    ));
                }
                rows = Some(names);
            }
            _ => return Ok(false),
        }
        Ok(true)
    });
    let quick = common.quick;
    let on = |s: &str| only.as_deref().map_or(true, |o| o == s);
    Opts {
        samples: samples.unwrap_or(if quick { 300 } else { 3000 }),
        reps: reps.unwrap_or(if quick { 3 } else { 5 }),
        constructs: on("constructs"),
        hash: on("hash"),
        list: on("list"),
        rows,
        common,
    }
}

// ---------------------------------------------------------------------------------------------
// Small helpers

/// /proc/loadavg's first three fields, or "?".
fn loadavg() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .ok()
        .map(|s| s.split_whitespace().take(3).collect::<Vec<_>>().join(" "))
        .unwrap_or_else(|| "?".into())
}

const NONE: WqeFlags = WqeFlags::NONE;
const SIG: WqeFlags = WqeFlags::SIGNALED;

/// Wait until `cq` has produced at least `target` completions; the instant it was seen.
fn wait_cq(nic: &SoftNic, cq: Cqn, target: u64, mode: WaitMode) -> Result<Instant, String> {
    wait_produced(
        nic,
        cq,
        target,
        mode,
        Backoff::new(64, Some(Instant::now())),
    )?;
    Ok(Instant::now())
}

/// Wait until `cq` has produced `base + 1`, ..., `base + n` completions; when each was seen.
/// With a `channel`, sleep on it between looks (armed before each look, so a completion after
/// the look signals) instead of busy-polling.
fn wait_steps(
    nic: &SoftNic,
    cq: Cqn,
    base: u64,
    n: u64,
    channel: Option<&CompChannel>,
) -> Result<Vec<Instant>, String> {
    let mut seen = Vec::with_capacity(idx(n));
    let mut backoff = Backoff::new(64, Some(Instant::now()));
    loop {
        if let Some(ch) = channel {
            nic.req_notify_cq(cq, ch).ctx("req_notify_cq")?;
        }
        let p = nic.cq_produced(cq).ctx("cq_produced")?;
        if p > base + seen.len() as u64 {
            let now = Instant::now();
            while (seen.len() as u64) < (p - base).min(n) {
                seen.push(now);
            }
            if seen.len() as u64 >= n {
                if let Some(ch) = channel {
                    // Leave no event behind for the next wait.
                    while ch.try_event().is_some() {}
                }
                return Ok(seen);
            }
        }
        let waited = match channel {
            Some(ch) => ch.get_event(WAIT_TIMEOUT).is_some(),
            None => backoff.pause(WaitMode::Spin).is_ok(),
        };
        if !waited {
            return Err(timed_out(cq, p, base + n));
        }
    }
}

/// Take exactly `n` completions off `cq` (they were already produced).
fn take_cqes(nic: &SoftNic, cq: Cqn, n: usize) -> Result<Vec<Completion>, String> {
    let mut out = Vec::with_capacity(n);
    let started = Instant::now();
    while out.len() < n {
        nic.poll_cq(cq, n - out.len(), &mut out).ctx("poll_cq")?;
        if started.elapsed() > WAIT_TIMEOUT {
            return Err(format!(
                "only {} of {n} completions could be polled from CQ {cq}",
                out.len()
            ));
        }
    }
    Ok(out)
}

/// What the softnic says about some queues, for hang and error reports.
fn diag(nic: &SoftNic, qps: &[Qpn], cqs: &[Cqn]) -> String {
    redn_bench::wait::diag(nic, qps, cqs, true)
}

fn send_wr(msg: Vec<u8>) -> WorkRequest {
    WorkRequest {
        wr_id: 0,
        flags: NONE,
        op: WrOp::Send {
            payload: Payload::Inline(msg),
            imm: None,
        },
    }
}

// ---------------------------------------------------------------------------------------------

fn main() {
    let o = parse_args();
    let started = Instant::now();
    let mut steal = StealMeter::start();
    let pus = format!(
        "server softnic {} PUs, client softnic {} PUs",
        o.common.pus, o.common.pus
    );
    print_head(
        "offload_bench: RedN Table 3 and §5.2-5.3 on the softnic, with same-run baselines",
        &o.common,
        &pus,
    );
    println!(
        "   load average at the start: {} (other processes share these cores; latencies are",
        loadavg()
    );
    println!("   sensitive to it)");
    let env = match Env::new(&o) {
        Ok(e) => e,
        Err(e) => {
            eprintln!("offload_bench: setup failed: {e}");
            std::process::exit(2);
        }
    };
    let mut anomalies = Vec::new();
    section("constructs", o.constructs, &mut anomalies, |a| {
        constructs_section(&env, &o, a)
    });
    section("hash", o.hash, &mut anomalies, |a| {
        hash_section(&env, &o, a)
    });
    section("list", o.list, &mut anomalies, |a| {
        list_section(&env, &o, a)
    });
    println!();
    println!("== Installation cost (never inside a timed region) ==");
    println!("   program::install (layout, render, queues, ring writes): grows with the program's WQE count.");
    println!(
        "   {:<18} {:>7} {:>9} {:>10}",
        "program", "WQEs", "installs", "mean ms"
    );
    for ((name, wqes), (count, secs)) in env.install_costs.borrow().iter() {
        println!(
            "   {name:<18} {wqes:>7} {count:>9} {:>10.3}",
            secs * 1e3 / *count as f64
        );
    }
    println!();
    println!("load average at the end: {}", loadavg());
    println!(
        "the hypervisor's share of the CPUs' time over the run (steal): {}",
        fmt_share(steal.lap())
    );
    print_anomalies(&anomalies, started);
    drop(env);
    if !anomalies.is_empty() {
        std::process::exit(1);
    }
}
