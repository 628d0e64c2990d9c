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

use redn_bench::bytes::{be48, low_byte};
use redn_bench::native::{cross_thread_rtt, mean_ns_samples, on_threads};
use redn_bench::opts::{parse_num, CommonOpts};
use redn_bench::queues::{flags_if, nop, SqWriter};
use redn_bench::report::{
    fmt_ns, mops, print_anomalies, print_failed, print_head, section, size_name, us, verdict,
};
use redn_bench::setup::{loopback_qp, Region};
use redn_bench::stats::{median, min, ns, stats, Stats};
use redn_bench::wait::{timed_out, wait_produced, Backoff, WaitMode, WAIT_TIMEOUT};
use redn_bench::Ctx;
use redn_program::endian::{Be32, Be64};
use redn_program::program::catalog::{
    self, HashVariant, BUCKET_BYTES, BUCKET_LEN, BUCKET_STRIDE, NODE_BYTES, NODE_LEN,
};
use redn_program::program::{
    Addr, Builder, Form, Iterations, Op, Program, ProgramError, QueueRole, RegionRole, Sge,
};
use redn_program::wqe::{Opcode, Payload, WorkRequest, WqeFlags, WrOp};
use redn_sys::conv::{idx, low32};
use redn_sys::install::RegionBinding;
use redn_sys::mem::SharedBuffer;
use redn_sys::nic::{CompChannel, Completion, CqConfig, Nic, QpConfig};
use redn_sys::softnic::SoftNic;
use redn_sys::{Access, Cqn, Pdn, QpState, Qpn, VirtAddr};
use std::collections::HashMap;
use std::hint::black_box;
use std::time::{Duration, Instant};

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
    --only SECTION      constructs | hash | list (default: all three)
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
                client: a GET is READ + if + else + WAITs/ENABLEs + the response. Target:
                GETs/s on 2 server PUs ≥ 1.7× those on 1 (clients on as many PUs).
  while, unrolled   list-find without break over an 8-node list, key absent (every
                iteration runs), triggers pipelined: iterations/s.
  while, recycled   a minimal recycled loop built with the Builder: two managed queues that
                re-arm each other; each round, each queue runs a byte-reversing READ and a
                FETCH_ADD (advance_count, patching the other's SEND_EN count with host-order
                atomic replies) + SEND_EN (fenced); no host involvement
                after setup: rounds/s from the WQE counters over a time window.
  while, recycled (server-loop)   the catalog's server-loop serving pipelined GET triggers
                (it enables one receive per round, so the client's SENDs wait for it).
  Native: the same memory operations done by one CPU thread per PU.

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

// Targets and the paper's ConnectX-5 figures.
const IF_TARGET: f64 = 5e6;
/// Target: pipelined hash GETs/s on 2 server PUs over those on 1.
const GET_SCALING_TARGET: f64 = 1.7;
const CX5_IF: f64 = 0.7e6;
const LOOP_TARGET: f64 = 2e6;
const CX5_LOOP: f64 = 0.3e6;
const PAR_TARGET_RATIO: f64 = 1.2;

// Server data region layout.
const DATA_LEN: usize = 2 << 20;
const TABLE_AT: u64 = 0;
const LIST_AT: u64 = 8192;
const HVALUES_AT: u64 = 64 << 10;
const HVALUE_STRIDE: u64 = 64 << 10;
const LVALUES_AT: u64 = 1 << 20;
const SCRATCH_AT: u64 = 1536 << 10;
const BUCKETS: u64 = 8;
const LIST_STEPS: u32 = 8;
const LIST_VALUE: u32 = 64;
const SIZES: [usize; 5] = [64, 1024, 4096, 16384, 65536];
// The catalog's bucket and node sizes (18 and 26 bytes) as READ lengths; the assertion
// checks that the casts keep them whole.
#[allow(clippy::cast_possible_truncation)]
const BUCKET_LEN32: u32 = BUCKET_LEN as u32;
#[allow(clippy::cast_possible_truncation)]
const NODE_LEN32: u32 = NODE_LEN as u32;
const _: () = assert!(BUCKET_LEN32 as u64 == BUCKET_LEN && NODE_LEN32 as u64 == NODE_LEN);

// Client region layout.
const CBUF_LEN: usize = 256 << 10;
const RESP_LEN: u64 = 64 << 10;
const READ_AT: u64 = 128 << 10;

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
}

fn parse_args() -> Opts {
    let (mut samples, mut reps) = (None, None);
    let mut only: Option<String> = None;
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
// The two softnics and their regions

/// A one-sided client: a client QP connected to a passive server QP, for the READ baselines.
struct Reader {
    sq: SqWriter,
    cq: Cqn,
}

struct Env {
    server: std::sync::Arc<SoftNic>,
    client: SoftNic,
    cpd: Pdn,
    /// Server data: the hash table, the list, the values, scratch.
    data: Region,
    /// Client memory: responses at 0, READ landing area at READ_AT.
    cbuf: Region,
    /// The client CQ every client QP of an installation uses.
    ccq: Cqn,
    /// For hosts that sleep until `ccq` has a completion instead of polling it.
    channel: CompChannel,
    /// The READ baselines' connection.
    reader: std::cell::RefCell<Reader>,
    /// A loopback QP and its CQ on each server PU, then one on the client's PU: a signaled NOP
    /// on each wakes the PUs (an idle PU parks after 50 µs) right before a timed run.
    wakers: Vec<(bool, Qpn, Cqn)>,
    /// Installs by (program, WQEs): count and total seconds.
    install_costs: std::cell::RefCell<std::collections::BTreeMap<(String, usize), (u64, f64)>>,
    pus: usize,
}

impl Env {
    fn new(o: &Opts) -> Result<Env, String> {
        let server = std::sync::Arc::new(
            o.common
                .softnic("server", o.common.pus)
                .ctx("server softnic")?,
        );
        let client = o
            .common
            .softnic("client", o.common.pus)
            .ctx("client softnic")?;
        let spd = server.alloc_pd().ctx("alloc_pd")?;
        let cpd = client.alloc_pd().ctx("alloc_pd")?;
        let data = Region::new(&server, spd, DATA_LEN, Access::ALL)?;
        let cbuf = Region::new(&client, cpd, CBUF_LEN, Access::ALL)?;
        let ccq = client.create_cq(CqConfig::new(1 << 16)).ctx("create_cq")?;
        // The READ baseline's connection: a client QP and a passive server QP.
        let rcq = client.create_cq(CqConfig::new(4096)).ctx("create_cq")?;
        let mut rc = QpConfig::new(cpd, rcq);
        rc.pu = Some(0);
        let rqp = client.create_qp(rc).ctx("create_qp")?;
        let scq = server.create_cq(CqConfig::default()).ctx("create_cq")?;
        let sqp = server.create_qp(QpConfig::new(spd, scq)).ctx("create_qp")?;
        SoftNic::connect_pair(&client, rqp.qpn, &server, sqp.qpn).ctx("connect_pair")?;
        let mut wakers = Vec::new();
        for (on_server, nic, pd, pu) in (0..o.common.pus)
            .map(|p| (true, &*server, spd, p))
            .chain((0..o.common.pus).map(|p| (false, &client, cpd, p)))
        {
            let cq = nic.create_cq(CqConfig::default()).ctx("create_cq")?;
            // A plain QP's 256 BBs (QpConfig::new): a waker only ever holds one NOP.
            let q = loopback_qp(nic, pd, cq, pu, 256, false)?;
            wakers.push((on_server, q.qpn, cq));
        }
        Ok(Env {
            server,
            client,
            cpd,
            data,
            cbuf,
            ccq,
            channel: CompChannel::new(),
            reader: std::cell::RefCell::new(Reader {
                sq: SqWriter::new(&rqp, true),
                cq: rcq,
            }),
            wakers,
            install_costs: Default::default(),
            pus: o.common.pus,
        })
    }

    /// Wake the client's PU 0 and the server PUs in `server_pus` (see [`Self::wake_pus`]).
    fn wake(&self, server_pus: &[usize]) -> Result<(), String> {
        self.wake_pus(&[0], server_pus)
    }

    /// Wake the client PUs in `client_pus` and the server PUs in `server_pus`: a signaled
    /// NOP on each one's waker queue, waited for. Only the PUs an operation uses are woken:
    /// a woken PU busy-spins for 5 µs, and a spinning PU that has nothing to do only takes
    /// a core from the threads that do.
    fn wake_pus(&self, client_pus: &[usize], server_pus: &[usize]) -> Result<(), String> {
        let mut targets = Vec::new();
        for (i, &(on_server, q, cq)) in self.wakers.iter().enumerate() {
            let used = if on_server {
                server_pus.contains(&i)
            } else {
                client_pus.contains(&(i - self.pus))
            };
            if !used {
                continue;
            }
            let nic = if on_server {
                &self.server
            } else {
                &self.client
            };
            let base = nic.cq_produced(cq).ctx("cq_produced")?;
            nic.post_send(q, &[nop(SIG, 0)]).ctx("post_send")?;
            targets.push((nic, cq, base + 1));
        }
        for (nic, cq, t) in targets {
            wait_cq(nic, cq, t, WaitMode::Spin)?;
            take_cqes(nic, cq, 1)?;
        }
        Ok(())
    }

    /// Region bindings for an installation; `scratch` is the `data` region of the Builder
    /// programs (4 KiB of its own per instance).
    fn regions(&self, scratch: u64) -> HashMap<String, RegionBinding> {
        let local = |offset, len| RegionBinding::Local {
            buffer: std::sync::Arc::clone(&self.data.buf),
            offset,
            len,
            access: Access::ALL,
        };
        let mut m = HashMap::new();
        for name in ["table", "list", "values"] {
            m.insert(name.to_string(), local(0, DATA_LEN));
        }
        m.insert(
            "data".to_string(),
            local(idx(SCRATCH_AT + scratch * 4096), 4096),
        );
        m.insert(
            "response".to_string(),
            RegionBinding::Remote {
                addr: self.cbuf.mr.addr,
                rkey: self.cbuf.mr.lkey.into(),
                len: RESP_LEN,
            },
        );
        m
    }
}

/// One installed offload and the client queue pair talking to it.
struct Inst {
    installed: redn_sys::install::Installed<SoftNic>,
    cqp: Qpn,
    csq: SqWriter,
    /// Invocations it serves (u64::MAX for recycled programs).
    capacity: u64,
    /// Triggers sent so far.
    served: u64,
    /// The server PUs its queues run on.
    pus: Vec<usize>,
    /// The client PU its client QP runs on.
    client_pu: usize,
}

impl Inst {
    fn left(&self) -> u64 {
        self.capacity - self.served
    }

    fn server_qps(&self) -> Vec<Qpn> {
        self.installed.qps.iter().map(|q| q.qpn).collect()
    }

    /// WQEs executed so far on the program's queues.
    fn wqes(&self, env: &Env) -> Result<u64, String> {
        let mut t = 0;
        for q in &self.installed.qps {
            t += env.server.counters(q.qpn).ctx("counters")?.total_wqes();
        }
        Ok(t)
    }

    fn diag(&self, env: &Env) -> String {
        let mut s = diag(&env.server, &self.server_qps(), &self.installed.cqs);
        s += &diag(&env.client, &[self.cqp], &[env.ccq]);
        s
    }
}

/// Install `program` on the server with a fresh client QP (send ring `sq_bbs`, `rq_slots`
/// receive slots) connected to its client-facing queue.
/// Install `program` for a new client QP on client PU `client_pu`.
fn install(
    env: &Env,
    program: &Program,
    scratch: u64,
    sq_bbs: u32,
    rq_slots: u32,
    client_pu: usize,
) -> Result<Inst, String> {
    let mut c = QpConfig::new(env.cpd, env.ccq);
    c.sq_bbs = sq_bbs;
    c.rq_slots = rq_slots;
    c.rq_sges = 1;
    c.pu = Some(client_pu);
    let cinfo = env.client.create_qp(c).ctx("create client QP")?;
    let regions = env.regions(scratch);
    let t_inst = Instant::now();
    let r = redn_sys::install::install(&env.server, program, &regions, &mut |q| {
        SoftNic::connect_pair(&env.client, cinfo.qpn, &env.server, q)
    });
    {
        let mut costs = env.install_costs.borrow_mut();
        let e = costs
            .entry((program.name.clone(), program.wqe_count()))
            .or_insert((0, 0.0));
        e.0 += 1;
        e.1 += t_inst.elapsed().as_secs_f64();
    }
    let installed = match r {
        Ok(i) => i,
        Err(e) => {
            let _ = env.client.destroy_qp(cinfo.qpn);
            return Err(format!("install {}: {e}", program.name));
        }
    };
    let capacity = match program.iterations {
        Iterations::Bounded { invocations, .. } => u64::from(invocations),
        Iterations::Recycled { .. } => u64::MAX,
    };
    let mut pus: Vec<usize> = installed.qps.iter().map(|q| q.pu).collect();
    pus.sort_unstable();
    pus.dedup();
    Ok(Inst {
        installed,
        cqp: cinfo.qpn,
        csq: SqWriter::new(&cinfo, true),
        capacity,
        served: 0,
        pus,
        client_pu,
    })
}

/// Tear an installation down: its queues, code region and CQs, and the client QP.
fn remove(env: &Env, inst: Inst) -> Result<(), String> {
    // `remove` destroys the offload's queues, their CQs and the code region.
    inst.installed.remove().ctx("remove offload")?;
    env.client.destroy_qp(inst.cqp).ctx("destroy client QP")?;
    Ok(())
}

/// `program` with every queue placed on PU `pu`.
fn on_pu(program: &Program, pu: usize) -> Program {
    let mut p = program.clone();
    for q in &mut p.queues {
        q.pu = Some(pu);
    }
    p
}

/// How the host waits for a response.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum HostWait {
    /// Busy-polls the client CQ's count (yielding only after 20 µs).
    Poll,
    /// Sleeps on a completion channel armed for the client CQ (as RedN's client thread does),
    /// so it holds no core while the GET runs; its wake-up is part of the latency.
    Channel,
}

/// Send one trigger and wait for `responses` completions on the client CQ: the ns from the
/// doorbell to each, and the completions. The client CQ must be drained before.
fn trigger(
    env: &Env,
    inst: &mut Inst,
    msg: &[u8],
    responses: u64,
    how: HostWait,
) -> Result<(Vec<f64>, Vec<Completion>), String> {
    for _ in 0..responses {
        env.client.post_recv(inst.cqp, 0, &[]).ctx("post_recv")?;
    }
    inst.csq.push(&env.client, &send_wr(msg.to_vec()))?;
    let base = env.client.cq_produced(env.ccq).ctx("cq_produced")?;
    env.wake(&inst.pus)?;
    let t0 = Instant::now();
    inst.csq.ring(&env.client)?;
    let seen = match how {
        HostWait::Poll => wait_steps(&env.client, env.ccq, base, responses, None),
        HostWait::Channel => wait_steps(&env.client, env.ccq, base, responses, Some(&env.channel)),
    }
    .map_err(|e| format!("{e}{}", inst.diag(env)))?;
    inst.served += 1;
    let times = seen.iter().map(|t| ns(*t - t0)).collect();
    let cqes = take_cqes(&env.client, env.ccq, idx(responses))?;
    Ok((times, cqes))
}

/// Check responses: all successful, immediate `imm`, the byte lengths `lens` (any order).
fn check_responses(cqes: &[Completion], imm: u32, lens: &[u32]) -> Result<(), String> {
    let mut got: Vec<u32> = Vec::new();
    for c in cqes {
        if !c.is_ok() {
            return Err(format!("response failed: {c:?}"));
        }
        if c.imm != Some(imm) {
            return Err(format!(
                "response immediate {:?}, expected {imm}: {c:?}",
                c.imm
            ));
        }
        got.push(c.byte_len);
    }
    got.sort_unstable();
    let mut want = lens.to_vec();
    want.sort_unstable();
    if got != want {
        return Err(format!("response lengths {got:?}, expected {want:?}"));
    }
    Ok(())
}

// ---------------------------------------------------------------------------------------------
// Hash table and list contents

fn hkey(b: u64) -> u64 {
    0x00a0_0000_0000 + b * 0x0001_0203
}

fn hvalue(b: u64, size: usize) -> Vec<u8> {
    (0..size)
        .map(|i| low_byte(idx(b) * 37 + i * 7 + size / 64))
        .collect()
}

fn hvalue_off(b: u64) -> u64 {
    HVALUES_AT + b * HVALUE_STRIDE
}

fn bucket_off(b: u64) -> u64 {
    TABLE_AT + b * BUCKET_STRIDE
}

/// Fill the table: bucket b holds key hkey(b) and a value of `size` bytes.
fn fill_table(env: &Env, size: usize) {
    for b in 0..BUCKETS {
        env.data.write(hvalue_off(b), &hvalue(b, size));
        let len = u32::try_from(size).expect("value sizes are at most 64 KiB");
        let bytes = catalog::bucket_bytes(hkey(b), len, env.data.addr(hvalue_off(b)));
        env.data.write(bucket_off(b), &bytes);
    }
}

fn bucket_addr(env: &Env, b: u64) -> [u8; 8] {
    env.data.addr(bucket_off(b)).to_be_bytes()
}

fn single_msg(env: &Env, key: u64, b: u64) -> Vec<u8> {
    [catalog::trigger_key(key).as_slice(), &bucket_addr(env, b)].concat()
}

fn two_msg(env: &Env, key: u64, b0: u64, b1: u64) -> Vec<u8> {
    let k = catalog::trigger_key(key);
    [
        k.as_slice(),
        &k,
        &bucket_addr(env, b0),
        &bucket_addr(env, b1),
    ]
    .concat()
}

fn lkey(i: u64) -> u64 {
    0x0070_0000_0000 + i * 0x0011
}

fn lvalue(i: u64) -> Vec<u8> {
    (0..LIST_VALUE as usize)
        .map(|b| low_byte(idx(i) * 31 + b))
        .collect()
}

fn lnode_off(i: u64) -> u64 {
    LIST_AT + 64 * i
}

/// Lay out the list; the last node points at itself. Returns the head's address.
fn fill_list(env: &Env) -> u64 {
    let steps = u64::from(LIST_STEPS);
    for i in 0..steps {
        let next = if i + 1 < steps {
            lnode_off(i + 1)
        } else {
            lnode_off(i)
        };
        let voff = LVALUES_AT + i * 4096;
        env.data.write(voff, &lvalue(i));
        let b = catalog::node_bytes(
            lkey(i),
            LIST_VALUE,
            env.data.addr(voff),
            env.data.addr(next),
        );
        env.data.write(lnode_off(i), &b);
    }
    env.data.addr(lnode_off(0))
}

fn list_msg(head: u64, key: u64, with_break: bool) -> Vec<u8> {
    let mut m = head.to_be_bytes().to_vec();
    if with_break {
        m.extend(head.to_be_bytes());
    }
    for _ in 0..LIST_STEPS {
        m.extend(catalog::trigger_key(key));
        if with_break {
            m.extend(catalog::trigger_key(key));
        }
    }
    m
}

// ---------------------------------------------------------------------------------------------
// Baselines: one-sided READs, and the CPU

/// One READ from the server's data region into the client buffer at READ_AT + `dst`, waited
/// for. The WQE is encoded here (the client builds it from what the previous READ returned).
fn read_once(
    env: &Env,
    r: &mut SqWriter,
    cq: Cqn,
    reads: &[(u64, u64, u32)],
) -> Result<(), String> {
    for &(src_addr, dst, len) in reads {
        let wr = WorkRequest {
            wr_id: 1,
            flags: SIG,
            op: WrOp::Read {
                remote: redn_program::wqe::RemoteAddr {
                    addr: VirtAddr(src_addr),
                    rkey: env.data.mr.lkey.into(),
                },
                sgl: vec![env.cbuf.mr.sge(READ_AT + dst, len)],
            },
        };
        r.push(&env.client, &wr)?;
    }
    let base = env.client.cq_produced(cq).ctx("cq_produced")?;
    r.ring(&env.client)?;
    wait_cq(&env.client, cq, base + reads.len() as u64, WaitMode::Spin)?;
    let cqes = take_cqes(&env.client, cq, reads.len())?;
    if let Some(c) = cqes.iter().find(|c| !c.is_ok()) {
        return Err(format!("READ failed: {c:?}"));
    }
    Ok(())
}

/// A bucket's or list node's key, value length and value address: the catalog's layout
/// (`catalog::bucket_bytes`, `node_bytes`).
struct Entry {
    key: u64,
    len: u32,
    addr: u64,
}

impl Entry {
    fn parse(b: &[u8]) -> Entry {
        Entry {
            key: be48(b),
            len: Be32::read(b, 6).get(),
            addr: Be64::read(b, 10).get(),
        }
    }
}

/// A list node's next pointer (after the entry's fields).
fn next_node(n: &[u8]) -> u64 {
    Be64::read(n, BUCKET_BYTES).get()
}

/// READ the value of `found`, if any, into the client buffer at READ_AT + 256: its length (0
/// when nothing was found).
fn read_value(env: &Env, rd: &mut Reader, found: Option<Entry>) -> Result<usize, String> {
    match found {
        Some(e) => {
            read_once(env, &mut rd.sq, rd.cq, &[(e.addr, 256, e.len)])?;
            Ok(e.len as usize)
        }
        None => Ok(0),
    }
}

/// Hash GET by one-sided READs: READ the candidate buckets (all in one post), check the key,
/// READ the value. Returns the ns taken and the value's length (0: not found).
fn read_get(env: &Env, rd: &mut Reader, key: u64, buckets: &[u64]) -> Result<(f64, usize), String> {
    env.wake(&[])?;
    let t0 = Instant::now();
    let reads: Vec<(u64, u64, u32)> = buckets
        .iter()
        .enumerate()
        .map(|(i, &b)| (env.data.addr(bucket_off(b)), 32 * i as u64, BUCKET_LEN32))
        .collect();
    read_once(env, &mut rd.sq, rd.cq, &reads)?;
    let mut hit = None;
    for i in 0..buckets.len() {
        let mut bk = [0u8; BUCKET_BYTES];
        env.cbuf.buf.read(idx(READ_AT) + 32 * i, &mut bk);
        let e = Entry::parse(&bk);
        if e.key == key {
            hit = Some(e);
            break;
        }
    }
    let len = read_value(env, rd, hit)?;
    Ok((ns(t0.elapsed()), len))
}

/// List find by one-sided READs: READ node after node until the key matches (then READ the
/// value) or the walk has covered LIST_STEPS nodes.
fn read_find(env: &Env, rd: &mut Reader, head: u64, key: u64) -> Result<(f64, usize), String> {
    env.wake(&[])?;
    let t0 = Instant::now();
    let mut node = head;
    let mut found = None;
    for _ in 0..LIST_STEPS {
        read_once(env, &mut rd.sq, rd.cq, &[(node, 0, NODE_LEN32)])?;
        let mut n = [0u8; NODE_BYTES];
        env.cbuf.buf.read(idx(READ_AT), &mut n);
        let e = Entry::parse(&n);
        if e.key == key {
            found = Some(e);
            break;
        }
        node = next_node(&n);
    }
    let len = read_value(env, rd, found)?;
    Ok((ns(t0.elapsed()), len))
}

/// Copy the value of `e`, in `data` (whose first byte is at address `base`), to the start of
/// `dst`: its length.
fn copy_value(data: &SharedBuffer, base: u64, dst: &SharedBuffer, e: &Entry) -> usize {
    let len = e.len as usize;
    dst.copy_from(0, data, idx(e.addr - base), len);
    len
}

/// The CPU's hash GET on the same buffer: read each candidate bucket, compare, copy the value
/// into `dst`. Returns the value length.
fn native_get(
    data: &SharedBuffer,
    base: u64,
    dst: &SharedBuffer,
    key: u64,
    buckets: &[u64],
) -> usize {
    for &b in buckets {
        let mut bk = [0u8; BUCKET_BYTES];
        data.read(idx(bucket_off(b)), &mut bk);
        let e = Entry::parse(&bk);
        if e.key == key {
            return copy_value(data, base, dst, &e);
        }
    }
    0
}

/// The CPU's list find on the same buffer.
fn native_find(data: &SharedBuffer, base: u64, dst: &SharedBuffer, head: u64, key: u64) -> usize {
    let mut node = head;
    for _ in 0..LIST_STEPS {
        let mut n = [0u8; NODE_BYTES];
        data.read(idx(node - base), &mut n);
        let e = Entry::parse(&n);
        if e.key == key {
            return copy_value(data, base, dst, &e);
        }
        node = next_node(&n);
    }
    0
}

/// Per-operation ns of `f`, timed over batches sized so a batch moves ~64 KiB (1..64 ops).
fn native_samples(samples: usize, bytes_per_op: usize, f: impl FnMut() -> usize) -> Vec<f64> {
    let batch = (65536 / bytes_per_op.max(1)).clamp(1, 64);
    mean_ns_samples(samples, batch, batch * 16, f)
}

/// `threads` CPU threads each running `f(count)` (which times itself) at the same time:
/// total operations per second over the slowest thread.
fn native_parallel(threads: usize, count: u64, f: &(dyn Fn(u64) -> Duration + Sync)) -> f64 {
    let slowest = on_threads(threads, |_| f(count))
        .into_iter()
        .map(|r| r.unwrap_or(Duration::MAX))
        .max()
        .unwrap_or(Duration::MAX);
    threads as f64 * count as f64 / slowest.as_secs_f64()
}

// ---------------------------------------------------------------------------------------------
// Section 1: construct throughput (Table 3)

/// `n` CAS-based `if`s: worker queue `w` (unmanaged, started by its doorbell) runs
/// { CAS (if_eq on t_i, signaled, fenced), WAIT(w, i), SEND_EN(t, i + 1) } per `if`; managed
/// queue `t` holds t_i, an 8 B WRITE posted as NOP. Even `if`s compare equal (taken: the NOP
/// becomes the WRITE), odd ones do not. The last t_i is signaled.
fn if_program(n: u32) -> Result<Program, ProgramError> {
    let mut b = Builder::new("bench-if", "n CAS-based ifs, every other one taken");
    b.region(
        "data",
        RegionRole::Data {
            access: Access::REMOTE_WRITE,
        },
        128,
        "scratch the taken WRITEs copy within",
    );
    // `t` first: every label the render looks up is a t_i, and lookups scan the queues in order.
    let t = b.queue(
        "t",
        QueueRole::Worker,
        true,
        false,
        Some(0),
        n.next_power_of_two(),
        1,
        1,
    );
    let w = b.queue(
        "w",
        QueueRole::Worker,
        false,
        false,
        Some(0),
        (3 * n).next_power_of_two(),
        1,
        1,
    );
    for i in 0..n {
        let target = format!("t{i}");
        let op = Op::Write {
            remote: Addr::region("data", 0),
            sgl: vec![Sge::new(Addr::region("data", 64), 8)],
            imm: None,
        };
        b.push(t, &target, op, flags_if(i + 1 == n), Form::Nop);
        b.if_eq(w, &format!("c{i}"), &target, Some(u64::from(i % 2)), SIG)?;
        b.push(
            w,
            &format!("w{i}"),
            Op::Wait {
                queue: "w".into(),
                count: i,
            },
            NONE,
            Form::Active,
        );
        b.push(
            w,
            &format!("e{i}"),
            Op::SendEn {
                queue: "t".into(),
                count: i + 1,
            },
            NONE,
            Form::Active,
        );
    }
    b.finish(
        Iterations::Bounded {
            invocations: 1,
            wqes_per_invocation: 4 * n,
        },
        "none: the last conditional WQE's completion on t's CQ",
    );
    b.build()
}

/// A minimal recycled `while`: managed queues `w` and `h` (one round each, 4 BBs) re-arm each
/// other forever. Each round, each queue advances a counter into the other queue's SEND_EN
/// count (`advance_count`: a byte-reversing READ, then a FETCH_ADD; the other is not enabled,
/// so the patch is never stale), then SEND_ENs (fenced, so the READ has landed) the other
/// queue for its next round.
fn loop_program() -> Result<Program, ProgramError> {
    let mut b = Builder::new(
        "bench-while",
        "a recycled loop: two queues re-arming each other",
    );
    let w = b.queue("w", QueueRole::Worker, true, false, Some(0), 4, 1, 1);
    let h = b.queue("h", QueueRole::Worker, true, false, Some(0), 4, 1, 1);
    // Round r: w enables h up to 4(r+1); h enables w up to 4(r+2).
    b.static_block("c.h", 8u64.to_le_bytes().to_vec()); // h.en in h's round r: 4(r+2)
    b.static_block("c.w", 8u64.to_le_bytes().to_vec()); // w.en in w's round r+1: 4(r+2)
    b.advance_count(w, "w.adv", "c.h", 4, "h.en");
    let fence = WqeFlags::FENCE;
    b.push(
        w,
        "w.en",
        Op::SendEn {
            queue: "h".into(),
            count: 4,
        },
        fence,
        Form::Active,
    );
    b.advance_count(h, "h.adv", "c.w", 4, "w.en");
    b.push(
        h,
        "h.en",
        Op::SendEn {
            queue: "w".into(),
            count: 8,
        },
        fence,
        Form::Active,
    );
    b.entry(w, 4);
    b.finish(Iterations::Recycled { wqes_per_round: 6 }, "none");
    b.build()
}

/// One measured figure of the constructs table.
struct TpRow {
    rates: Vec<f64>,
    wqes_per_op: f64,
    native: f64,
}

/// Run the `if` program: `k` instances on each of `p` PUs, all doorbells rung together.
fn if_run(
    env: &Env,
    progs: &[Program],
    k: usize,
    n: u32,
    mode: WaitMode,
) -> Result<(f64, f64), String> {
    let mut insts = Vec::new();
    for (p, prog) in progs.iter().enumerate() {
        for j in 0..k {
            insts.push(install(env, prog, (p * k + j) as u64, 1, 1, 0)?);
        }
    }
    // Queue 0 is `t` (the conditional WQEs), queue 1 is `w` (the CASes).
    let w_bbs: u64 = progs[0].queues[1].wqes.iter().map(|w| w.op.bbs()).sum();
    let res = (|| {
        env.wake(&(0..progs.len()).collect::<Vec<_>>())?;
        let t0 = Instant::now();
        for i in &insts {
            env.server
                .ring_doorbell(i.installed.qps[1].qpn, w_bbs)
                .ctx("ring_doorbell")?;
        }
        let mut end = t0;
        for i in &insts {
            end = end.max(
                wait_cq(&env.server, i.installed.cqs[0], 1, mode)
                    .map_err(|e| format!("{e}{}", i.diag(env)))?,
            );
        }
        let secs = (end - t0).as_secs_f64();
        // Verify: every CAS ran, half the conditional WQEs became WRITEs, no errors. A PU
        // publishes its counters at the end of a burst, so give them a moment to settle.
        let mut wqes = 0;
        for i in &insts {
            let (taken, not) = (u64::from(n).div_ceil(2), u64::from(n) / 2);
            let settle = Instant::now();
            loop {
                let t = env
                    .server
                    .counters(i.installed.qps[0].qpn)
                    .ctx("counters")?;
                let w = env
                    .server
                    .counters(i.installed.qps[1].qpn)
                    .ctx("counters")?;
                let ok = w.by_opcode(Opcode::AtomicCs) == u64::from(n)
                    && t.by_opcode(Opcode::RdmaWrite) == taken
                    && t.by_opcode(Opcode::Nop) == not
                    && w.errors + t.errors == 0;
                if ok {
                    wqes += w.total_wqes() + t.total_wqes();
                    break;
                }
                if settle.elapsed() > Duration::from_millis(100) {
                    return Err(format!(
                        "if program: expected {n} CAS, {taken} WRITEs and {not} NOPs{}",
                        i.diag(env)
                    ));
                }
                std::thread::sleep(Duration::from_micros(50));
            }
        }
        let ops = (insts.len() as u64 * u64::from(n)) as f64;
        Ok((ops / secs, wqes as f64 / ops))
    })();
    for i in insts {
        remove(env, i)?;
    }
    res
}

/// Run the recycled loop: one instance on each of `p` PUs, rounds per second over `window`.
fn loop_run(env: &Env, prog: &Program, p: usize, window: Duration) -> Result<f64, String> {
    let mut insts = Vec::new();
    for pu in 0..p {
        insts.push(install(env, &on_pu(prog, pu), pu as u64, 1, 1, 0)?);
    }
    let res = (|| {
        let rounds = |insts: &[Inst]| -> Result<u64, String> {
            let mut t = 0;
            for i in insts {
                t += env
                    .server
                    .counters(i.installed.qps[0].qpn)
                    .ctx("counters")?
                    .by_opcode(Opcode::AtomicFa);
            }
            Ok(t)
        };
        std::thread::sleep(Duration::from_millis(3));
        let (c0, t0) = (rounds(&insts)?, Instant::now());
        std::thread::sleep(window);
        let (c1, t1) = (rounds(&insts)?, Instant::now());
        for i in &insts {
            for q in i.server_qps() {
                let c = env.server.counters(q).ctx("counters")?;
                if c.errors != 0 || env.server.qp_state(q).ctx("qp_state")? != QpState::ReadyToSend
                {
                    return Err(format!("recycled loop failed{}", i.diag(env)));
                }
            }
        }
        if c1 <= c0 {
            let d: String = insts.iter().map(|i| i.diag(env)).collect();
            return Err(format!("recycled loop made no progress{d}"));
        }
        Ok((c1 - c0) as f64 / (t1 - t0).as_secs_f64())
    })();
    for i in insts {
        remove(env, i)?;
    }
    res
}

/// Pipelined triggers: `count` triggers (from `msg(instance, k)`) pre-written into each
/// instance's client send ring, `resp` responses each; all doorbells rung at once; the time
/// until every response is in, and the WQEs the server executed per trigger.
fn pipelined(
    env: &Env,
    insts: &mut [Inst],
    count: u64,
    msg: &dyn Fn(usize, u64) -> Vec<u8>,
    resp: u64,
    resp_len: u32,
    mode: WaitMode,
) -> Result<(f64, f64), String> {
    let mut before = 0;
    for (i, inst) in insts.iter_mut().enumerate() {
        for _ in 0..count * resp {
            env.client.post_recv(inst.cqp, 0, &[]).ctx("post_recv")?;
        }
        for k in 0..count {
            inst.csq.push(&env.client, &send_wr(msg(i, k)))?;
        }
        before += inst.wqes(env)?;
    }
    let base = env.client.cq_produced(env.ccq).ctx("cq_produced")?;
    let total = insts.len() as u64 * count * resp;
    let mut pus: Vec<usize> = insts.iter().flat_map(|i| i.pus.iter().copied()).collect();
    pus.sort_unstable();
    pus.dedup();
    let mut client_pus: Vec<usize> = insts.iter().map(|i| i.client_pu).collect();
    client_pus.sort_unstable();
    client_pus.dedup();
    env.wake_pus(&client_pus, &pus)?;
    let t0 = Instant::now();
    for inst in insts.iter() {
        inst.csq.ring(&env.client)?;
    }
    let end = wait_cq(&env.client, env.ccq, base + total, mode).map_err(|e| {
        let d: String = insts.iter().map(|i| i.diag(env)).collect();
        format!("{e}{d}")
    })?;
    let secs = (end - t0).as_secs_f64();
    let cqes = take_cqes(&env.client, env.ccq, idx(total))?;
    if let Some(c) = cqes.iter().find(|c| !c.is_ok() || c.byte_len != resp_len) {
        return Err(format!(
            "pipelined response wrong (expected {resp_len} bytes): {c:?}"
        ));
    }
    for inst in insts.iter_mut() {
        let n = cqes.iter().filter(|c| c.qpn == inst.cqp).count() as u64;
        if n != count * resp {
            return Err(format!(
                "QP {} got {n} responses, expected {}",
                inst.cqp,
                count * resp
            ));
        }
        inst.served += count;
    }
    std::thread::sleep(Duration::from_micros(300));
    let mut after = 0;
    for inst in insts.iter() {
        after += inst.wqes(env)?;
    }
    let ops = (insts.len() as u64 * count) as f64;
    Ok((ops / secs, (after - before) as f64 / ops))
}

/// `f` run `warm` times untimed, then `runs` times: what the latter returned. The first error
/// stops it.
fn repeated<T>(
    warm: usize,
    runs: usize,
    mut f: impl FnMut() -> Result<T, String>,
) -> Result<Vec<T>, String> {
    let mut v = Vec::with_capacity(runs);
    for i in 0..warm + runs {
        let r = f()?;
        if i >= warm {
            v.push(r);
        }
    }
    Ok(v)
}

/// A pipelined catalog row: `reps` runs (after a warm-up run) of `count` triggers on each of
/// `k` instances per PU on `p` PUs. Bounded programs are installed for each run (install time
/// is quadratic in the program size, so programs stay small); recycled ones once.
#[allow(clippy::too_many_arguments)]
fn pipelined_row(
    env: &Env,
    prog: &Program,
    p: usize,
    k: usize,
    count: u64,
    reps: usize,
    msg: &dyn Fn(usize, u64) -> Vec<u8>,
    resp_len: u32,
    ops_per_trigger: f64,
    mode: WaitMode,
) -> Result<(Vec<f64>, f64), String> {
    let placed: Vec<Program> = (0..p).map(|pu| on_pu(prog, pu)).collect();
    let ring = u32::try_from((count * 2).next_power_of_two().max(64)).ctx("send ring size")?;
    let mut insts: Vec<Inst> = Vec::new();
    // The first run is a warm-up.
    let res = repeated(1, reps, || {
        if insts.is_empty() || insts[0].left() < count {
            for i in insts.drain(..) {
                remove(env, i)?;
            }
            for (pu, pr) in placed.iter().enumerate() {
                for j in 0..k {
                    // Client QPs on the client's PUs in turn.
                    let n = pu * k + j;
                    insts.push(install(env, pr, n as u64, ring, ring, n % env.pus)?);
                }
            }
        }
        pipelined(env, &mut insts, count, msg, 1, resp_len, mode)
    });
    for i in insts {
        remove(env, i)?;
    }
    let runs = res?;
    let rates = runs
        .iter()
        .map(|&(rate, _)| rate * ops_per_trigger)
        .collect();
    let wqes: Vec<f64> = runs.iter().map(|&(_, w)| w / ops_per_trigger).collect();
    Ok((rates, median(&wqes)))
}

fn native_if(count: u64) -> Duration {
    // A control word per `if` (a NOP image), the CAS the NIC does on it, and the taken WRITE's
    // 8 B copy.
    let n = 4096usize;
    let code = SharedBuffer::new(n * 64);
    let data = SharedBuffer::new(256);
    let nop: u64 = 0x0300_0000_0000_0000;
    let active: u64 = 0x0300_0000_0000_0008;
    let run = |count: u64| {
        for i in 0..n {
            code.store_u64(i * 64, nop);
        }
        for i in 0..count {
            let at = (idx(i) % n) * 64;
            let cmp = if i % 2 == 0 { nop } else { nop | 1 };
            code.atomic_update(at, |old| (old == cmp).then_some(active));
            if code.load_u64(at) == active {
                let mut b = [0u8; 8];
                data.read(64, &mut b);
                data.write(0, &b);
                code.store_u64(at, nop);
            }
        }
    };
    warm_then_time(count, run)
}

/// Run `run` on a quarter of `count` to warm up, then time it on `count`.
fn warm_then_time(count: u64, run: impl Fn(u64)) -> Duration {
    run(count / 4);
    let t0 = Instant::now();
    run(count);
    t0.elapsed()
}

fn native_loop(count: u64) -> Duration {
    // Per round, for each of the two queues: FETCH_ADD a counter, store the old value into the
    // other queue's enable count, store the enable index.
    let b = SharedBuffer::new(512);
    let run = |count: u64| {
        for _ in 0..count {
            for q in 0..2usize {
                let old = b.atomic_update(q * 64, |v| Some(v + 2));
                b.write(128 + (1 - q) * 64 + 24, &low32(old).to_be_bytes());
                b.store_u64(256 + q * 64, old);
            }
        }
    };
    warm_then_time(count, run)
}

fn native_get_loop(count: u64) -> Duration {
    let data = SharedBuffer::new(64 << 10);
    let dst = SharedBuffer::new(4096);
    let base = data.addr().0;
    for b in 0..BUCKETS {
        let v = 4096 + b * 64;
        data.write(idx(v), &hvalue(b, 64));
        data.write(
            idx(bucket_off(b)),
            &catalog::bucket_bytes(hkey(b), 64, base + v),
        );
    }
    let run = |count: u64| {
        for i in 0..count {
            let b = i % BUCKETS;
            black_box(native_get(&data, base, &dst, hkey(b), &[b]));
        }
    };
    warm_then_time(count, run)
}

fn native_list_iter(count: u64) -> Duration {
    // One iteration: read a node, compare its key, follow next (key absent: walk on).
    let data = SharedBuffer::new(4096);
    let base = data.addr().0;
    let steps = u64::from(LIST_STEPS);
    for i in 0..steps {
        let next = if i + 1 < steps { i + 1 } else { 0 };
        let b = catalog::node_bytes(lkey(i), 64, base + 2048, base + 64 * next);
        data.write(64 * idx(i), &b);
    }
    let run = |count: u64| {
        let mut node = base;
        let mut hits = 0u64;
        for _ in 0..count {
            let mut n = [0u8; NODE_BYTES];
            data.read(idx(node - base), &mut n);
            if be48(&n) == 0xdead {
                hits += 1;
            }
            node = next_node(&n);
        }
        black_box(hits);
    };
    warm_then_time(count, run)
}

fn constructs_section(env: &Env, o: &Opts, anomalies: &mut Vec<String>) -> Result<(), String> {
    println!();
    println!("== 1. Construct throughput (RedN Table 3) ==");
    let all = env.pus;
    // The host busy-polls only if it has a core of its own: it, the server PUs a row uses and
    // (for rows driven by client triggers) the client's PUs must fit the cores.
    let mode_for = |server_pus: usize, client: bool| {
        if server_pus + if client { all } else { 0 } + 1 > o.common.cores {
            WaitMode::Sleep
        } else {
            WaitMode::Spin
        }
    };
    // Sizes: installing is quadratic in the program's WQE count (see the report), so programs
    // stay small and several instances share a PU to make each timed run long enough.
    // (instances per PU with one PU, instances per PU with all PUs)
    let if_n: u32 = 512;
    let if_k = if o.common.quick { (4, 8) } else { (8, 16) };
    let hash_n: u32 = 256;
    let hash_k = if o.common.quick { (4, 4) } else { (8, 8) };
    let list_n: u32 = 32;
    let list_k = if o.common.quick { (8, 8) } else { (16, 16) };
    let sl_n: u64 = if o.common.quick { 500 } else { 2000 };
    let window = Duration::from_millis(if o.common.quick { 20 } else { 60 });
    println!(
        "   ops/s: median over {} reps (after a warm-up run); \"worst\" is the slowest rep. Time: from the",
        o.reps
    );
    println!("   first doorbell (PUs woken just before) to the host seeing the last completion.");
    println!(
        "   One PU: everything on server PU 0. All PUs ({all}): the same on every PU at once. The host"
    );
    println!(
        "   busy-polls when it, the server PUs in use and (for rows driven by client triggers) the client's"
    );
    println!(
        "   PU fit the {} cores; otherwise (rows marked *) it sleeps 20 µs between polls: detection up to",
        o.common.cores
    );
    println!("   ~70 µs late, so those rates err low.");
    println!(
        "   Per PU (one PU / all PUs): if {}/{} instances × {if_n} ifs; hash-get {}/{} instances × \
         {hash_n} GETs;",
        if_k.0, if_k.1, hash_k.0, hash_k.1
    );
    println!(
        "   list-find {}/{} instances × {list_n} lookups × {LIST_STEPS} iterations; server-loop 1 instance × {sl_n} GETs;",
        list_k.0, list_k.1
    );
    println!(
        "   minimal recycled loop: 1 instance, rounds counted over {} ms.",
        window.as_millis()
    );
    println!("   WQEs/op: measured from the server's QP counters (all program queues).");
    println!();
    println!(
        "   {:<40} {:>3} {:>11} {:>9} {:>8} {:>8} {:>10} {:>9} {:>9}   target",
        "construct",
        "PUs",
        "softnic/s",
        "worst",
        "ns/op/PU",
        "WQEs/op",
        "native/s",
        "slowdown",
        "CX-5"
    );
    // A row of the table, or FAILED (`short` names it there and in the anomaly) when it could
    // not be measured; the median rate.
    let mut row = |name: &str,
                   short: &str,
                   p: usize,
                   r: Result<TpRow, String>,
                   cx5: Option<f64>,
                   target: Option<f64>,
                   mode: WaitMode| {
        let r = match r {
            Ok(r) => r,
            Err(e) => {
                print_failed(&format!("{short:<40} {p:>3}"));
                anomalies.push(format!("constructs: {short} on {p} PU(s): {e}"));
                return None;
            }
        };
        let med = median(&r.rates);
        let t = match target {
            Some(t) => format!("≥ {} M/s: {}", t / 1e6, verdict(med >= t)),
            None => String::new(),
        };
        println!(
            "   {:<40} {:>3} {:>9}{} {:>8}M {:>8.1} {:>8.1} {:>9}M {:>8.1}× {:>9}   {}",
            name,
            p,
            mops(med),
            if mode == WaitMode::Sleep { "M*" } else { "M " },
            mops(min(&r.rates)),
            1e9 * p as f64 / med,
            r.wqes_per_op,
            mops(r.native),
            r.native / med,
            cx5.map_or("-".into(), |c| format!("{}M", mops(c))),
            t
        );
        Some(med)
    };
    // 1, 2 (the scaling target's) and all PUs.
    let mut pu_sets: Vec<usize> = vec![1, 2.min(all), all];
    pu_sets.dedup();
    let native_n = if o.common.quick { 200_000 } else { 1_000_000 };
    let native = |p: usize, f: &(dyn Fn(u64) -> Duration + Sync)| -> f64 {
        let v: Vec<f64> = (0..o.reps.min(3))
            .map(|_| native_parallel(p, native_n, f))
            .collect();
        median(&v)
    };
    // A pipelined row's rates and WQEs per operation, with the native figure when they were
    // measured.
    let pipelined_tp = |r: Result<(Vec<f64>, f64), String>, native: &dyn Fn() -> f64| {
        r.map(|(rates, wqes_per_op)| TpRow {
            rates,
            wqes_per_op,
            native: native(),
        })
    };
    let mut if1 = None;
    let mut loop1 = None;

    // `if` (Builder).
    let if_progs: Vec<Program> = match (0..all)
        .map(|p| if_program(if_n).map(|pr| on_pu(&pr, p)))
        .collect()
    {
        Ok(v) => v,
        Err(e) => return Err(format!("if program: {e}")),
    };
    for &p in &pu_sets {
        let mode = mode_for(p, false);
        let k = if p == 1 { if_k.0 } else { if_k.1 };
        let r = repeated(1, o.reps, || if_run(env, &if_progs[..p], k, if_n, mode)).map(|v| TpRow {
            rates: v.iter().map(|&(rate, _)| rate).collect(),
            wqes_per_op: v.last().map_or(f64::NAN, |&(_, w)| w),
            native: native(p, &native_if),
        });
        let name = "if (CAS → NOP/WRITE, WAIT, SEND_EN)";
        let med = row(
            name,
            "if",
            p,
            r,
            Some(CX5_IF),
            (p == 1).then_some(IF_TARGET),
            mode,
        );
        if p == 1 {
            if1 = med;
        }
    }

    // `if` in the catalog's hash-get, triggers pipelined; (server PUs, median GETs/s).
    let mut gets: Vec<(usize, Option<f64>)> = Vec::new();
    let hash = catalog::hash_get(HashVariant::Single, hash_n).map_err(|e| e.to_string())?;
    fill_table(env, 64);
    let hmsg = |_i: usize, k: u64| {
        let b = k % BUCKETS;
        single_msg(env, hkey(b), b)
    };
    for &p in &pu_sets {
        let mode = mode_for(p, true);
        let k = if p == 1 { hash_k.0 } else { hash_k.1 };
        let r = pipelined_row(
            env,
            &hash,
            p,
            k,
            u64::from(hash_n),
            o.reps,
            &hmsg,
            64,
            1.0,
            mode,
        );
        let r = pipelined_tp(r, &|| native(p, &native_get_loop));
        let name = "if in hash-get (GETs, pipelined)";
        gets.push((p, row(name, "if in hash-get", p, r, None, None, mode)));
    }

    // Unrolled `while`: list-find without break, key absent.
    let lf = catalog::list_find(LIST_STEPS, false, list_n).map_err(|e| e.to_string())?;
    let head = fill_list(env);
    let lmsg = move |_i: usize, _k: u64| list_msg(head, 0xdead, false);
    let iterations = f64::from(LIST_STEPS);
    for &p in &pu_sets {
        let mode = mode_for(p, true);
        let k = if p == 1 { list_k.0 } else { list_k.1 };
        let r = pipelined_row(
            env,
            &lf,
            p,
            k,
            u64::from(list_n),
            o.reps,
            &lmsg,
            0,
            iterations,
            mode,
        );
        let r = pipelined_tp(r, &|| native(p, &native_list_iter));
        let name = "while, unrolled (list-find iterations)";
        row(name, "while, unrolled", p, r, None, None, mode);
    }

    // Recycled `while`: the minimal loop.
    let lp = loop_program().map_err(|e| e.to_string())?;
    for &p in &pu_sets {
        let r = repeated(0, o.reps, || loop_run(env, &lp, p, window)).map(|rates| TpRow {
            rates,
            wqes_per_op: 6.0,
            native: native(p, &native_loop),
        });
        // Counted over a window between two clock reads: no detection delay, no marker.
        let name = "while, recycled (minimal loop rounds)";
        let target = (p == 1).then_some(LOOP_TARGET);
        let med = row(
            name,
            "while, recycled",
            p,
            r,
            Some(CX5_LOOP),
            target,
            WaitMode::Spin,
        );
        if p == 1 {
            loop1 = med;
        }
    }

    // Recycled `while`: server-loop, triggers pipelined.
    let sl = catalog::server_loop().map_err(|e| e.to_string())?;
    for &p in &pu_sets {
        let mode = mode_for(p, true);
        let r = pipelined_row(env, &sl, p, 1, sl_n, o.reps, &hmsg, 64, 1.0, mode);
        let r = pipelined_tp(r, &|| native(p, &native_get_loop));
        let (name, short) = (
            "while, recycled (server-loop rounds)",
            "while, recycled (server-loop)",
        );
        row(name, short, p, r, Some(CX5_LOOP), None, mode);
    }
    println!();
    println!(
        "   native: if = CAS on a control word + the 8 B copy when taken; hash GET = read bucket,"
    );
    println!(
        "   compare, copy 64 B; list iteration = read node, compare, follow next; recycled round ="
    );
    println!("   2 × (FETCH_ADD + store the count + store the enable index). One thread per PU.");
    println!("   CX-5: the paper's ConnectX-5 figures (whole NIC).");
    println!();
    match if1 {
        Some(r) => println!(
            "   target: if ≥ {} M/s on one PU (ConnectX-5: {} M/s): {} M/s: {}",
            IF_TARGET / 1e6,
            CX5_IF / 1e6,
            mops(r),
            verdict(r >= IF_TARGET)
        ),
        None => println!(
            "   target: if ≥ {} M/s on one PU: not measured: NOT MET",
            IF_TARGET / 1e6
        ),
    }
    match loop1 {
        Some(r) => println!(
            "   target: recycled while ≥ {} M iterations/s on one PU (ConnectX-5: {} M/s): {} M/s: {}",
            LOOP_TARGET / 1e6,
            CX5_LOOP / 1e6,
            mops(r),
            verdict(r >= LOOP_TARGET)
        ),
        None => println!(
            "   target: recycled while ≥ {} M iterations/s on one PU: not measured: NOT MET",
            LOOP_TARGET / 1e6
        ),
    }
    let on = |n: usize| gets.iter().find(|g| g.0 == n).and_then(|g| g.1);
    match (on(1), on(2)) {
        (Some(one), Some(two)) => println!(
            "   target: hash-get GETs/s from 1 to 2 server PUs ≥ {GET_SCALING_TARGET}× (client QPs \
             on {all} client PUs): {:.2}×: {}",
            two / one,
            verdict(two / one >= GET_SCALING_TARGET)
        ),
        _ => println!(
            "   target: hash-get GETs/s from 1 to 2 server PUs ≥ {GET_SCALING_TARGET}×: not \
             measured (needs --pus 2): NOT MET"
        ),
    }
    Ok(())
}

// ---------------------------------------------------------------------------------------------
// Section 2: hash GET latency (§5.2)

/// An installation that is replaced when it runs out of invocations.
struct Slot {
    program: Program,
    inst: Option<Inst>,
    ring: u32,
    installs: usize,
}

impl Slot {
    fn new(program: Program, ring: u32) -> Slot {
        Slot {
            program,
            inst: None,
            ring,
            installs: 0,
        }
    }

    /// The installation, with at least `need` invocations left.
    fn get(&mut self, env: &Env, need: u64) -> Result<&mut Inst, String> {
        if self.inst.as_ref().map_or(true, |i| i.left() < need) {
            if let Some(i) = self.inst.take() {
                remove(env, i)?;
            }
            self.inst = Some(install(env, &self.program, 0, self.ring, self.ring, 0)?);
            self.installs += 1;
            // Let the entry enables run, and the PUs be awake, before the first trigger.
            std::thread::sleep(Duration::from_micros(100));
        }
        self.inst
            .as_mut()
            .ok_or_else(|| "no installation".to_string())
    }

    fn clear(&mut self, env: &Env) -> Result<(), String> {
        if let Some(i) = self.inst.take() {
            remove(env, i)?;
        }
        Ok(())
    }
}

fn hash_section(env: &Env, o: &Opts, anomalies: &mut Vec<String>) -> Result<(), String> {
    println!();
    println!("== 2. Hash GET latency by value size (RedN §5.2) ==");
    let n: u32 = 128;
    let blocks = o.reps.max(2);
    let per_block = o.samples.div_ceil(blocks);
    let warm = 20;
    println!(
        "   {} samples per row in {blocks} interleaved blocks (+{warm} warm-up each); µs from the \
         client's doorbell to the last",
        per_block * blocks
    );
    println!(
        "   response (PUs woken before each sample). Programs installed with {n} invocations, \
         reinstalled when used up"
    );
    println!("   (not timed). Buckets rotate over 4 pairs.");
    println!(
        "   Threads that must run for one GET: the host, the client's PU and server PU 0 (hash-get-par: and PU 1),"
    );
    println!(
        "   on {} cores; for the READ baselines only the host and the client's PU.",
        o.common.cores
    );
    // The offload rows: (variant, the client-facing queue moved to PU 1, how the host waits).
    // The first four poll; the last three repeat hash-get, hash-get-par and hash-get-seq with
    // a host that sleeps on a completion channel, so that on 2 cores the two server PUs can
    // have both (the comparison: the host asleep on both sides).
    let offloads = [
        (
            HashVariant::Single,
            false,
            HostWait::Poll,
            "offload hash-get, 1 bucket (hit)",
        ),
        (
            HashVariant::Sequential,
            false,
            HostWait::Poll,
            "offload hash-get-seq, key in 2nd bucket",
        ),
        (
            HashVariant::Parallel,
            false,
            HostWait::Poll,
            "offload hash-get-par, key in 2nd bucket",
        ),
        (
            HashVariant::Parallel,
            true,
            HostWait::Poll,
            "  same, client queue on the join's PU 1",
        ),
        (
            HashVariant::Single,
            false,
            HostWait::Channel,
            "hash-get, host sleeps on a compl. channel",
        ),
        (
            HashVariant::Parallel,
            false,
            HostWait::Channel,
            "hash-get-par, host sleeps on a compl. chan.",
        ),
        (
            HashVariant::Sequential,
            false,
            HostWait::Channel,
            "hash-get-seq, host sleeps on a compl. chan.",
        ),
    ];
    let mut slots = Vec::new();
    for (v, moved, _, _) in offloads {
        let mut p = catalog::hash_get(v, n).map_err(|e| format!("hash_get {v:?}: {e}"))?;
        if moved {
            for q in &mut p.queues {
                if q.role == QueueRole::Client {
                    q.pu = Some(1);
                }
            }
        }
        slots.push(Slot::new(p, (2 * n).next_power_of_two()));
    }
    let no = offloads.len();
    let mut names: Vec<&str> = offloads.iter().map(|x| x.3).collect();
    names.extend([
        "2 one-sided READs (bucket, value)",
        "3 one-sided READs (2 buckets, value)",
        "native CPU, 1 bucket",
        "native CPU, 2 buckets (key in 2nd)",
    ]);
    let dst = SharedBuffer::new(64 << 10);
    let base = env.data.mr.addr.0;
    let mut rd = env.reader.borrow_mut();
    println!();
    println!(
        "   {:<7} {:<44} {:>9} {:>9} {:>11}",
        "value", "lookup", "p50 µs", "p99 µs", "p50 ÷ 1-bkt"
    );
    let mut ratios = Vec::new();
    // The floor under every hand-off between PUs, right before and after the table.
    let floor_samples = if o.common.quick { 2000 } else { 20000 };
    let floor_before = cross_thread_rtt(floor_samples).median;
    for &size in &SIZES {
        let size32 = u32::try_from(size).ctx("value size")?;
        fill_table(env, size);
        let mut lat: Vec<Vec<f64>> = vec![Vec::new(); names.len()];
        let mut failed: Vec<Option<String>> = vec![None; names.len()];
        for _block in 0..blocks {
            for (vi, (v, _, how, _)) in offloads.iter().enumerate() {
                if failed[vi].is_some() {
                    continue;
                }
                let r = (|| -> Result<(), String> {
                    let mut s = 0;
                    while s < per_block + warm {
                        let inst = slots[vi].get(env, 1)?;
                        let pair = (s % 4) as u64;
                        let k = u32::try_from(inst.served).ctx("invocation number")?;
                        let (msg, resp, lens, key_b) = match v {
                            HashVariant::Single => (
                                single_msg(env, hkey(2 * pair), 2 * pair),
                                1,
                                vec![size32],
                                2 * pair,
                            ),
                            _ => (
                                two_msg(env, hkey(2 * pair + 1), 2 * pair, 2 * pair + 1),
                                2,
                                vec![0, size32],
                                2 * pair + 1,
                            ),
                        };
                        let (t, cqes) = trigger(env, inst, &msg, resp, *how)?;
                        check_responses(&cqes, k, &lens)
                            .map_err(|e| format!("{e} (invocation {k}){}", inst.diag(env)))?;
                        if s == warm || s % 64 == 0 {
                            let got = env.cbuf.read(0, size);
                            if got != hvalue(key_b, size) {
                                return Err(format!(
                                    "wrong value bytes for bucket {key_b} ({size} B)"
                                ));
                            }
                        }
                        if s >= warm {
                            lat[vi].push(*t.last().unwrap_or(&f64::NAN));
                        }
                        s += 1;
                    }
                    Ok(())
                })();
                if let Err(e) = r {
                    failed[vi] = Some(e);
                }
            }
            // READ baselines.
            for (ri, two) in [(no, false), (no + 1, true)] {
                if failed[ri].is_some() {
                    continue;
                }
                let r = (|| -> Result<(), String> {
                    for s in 0..per_block + warm {
                        let pair = (s % 4) as u64;
                        let (key, bk): (u64, Vec<u64>) = if two {
                            (hkey(2 * pair + 1), vec![2 * pair, 2 * pair + 1])
                        } else {
                            (hkey(2 * pair), vec![2 * pair])
                        };
                        let (t, len) = read_get(env, &mut rd, key, &bk)?;
                        if len != size {
                            return Err(format!("READ GET returned {len} bytes, expected {size}"));
                        }
                        if s == warm {
                            let got = env.cbuf.read(READ_AT + 256, size);
                            if got != hvalue(*bk.last().unwrap_or(&0), size) {
                                return Err("READ GET: wrong value bytes".into());
                            }
                        }
                        if s >= warm {
                            lat[ri].push(t);
                        }
                    }
                    Ok(())
                })();
                if let Err(e) = r {
                    failed[ri] = Some(e);
                }
            }
            // Native.
            let mut s = 0u64;
            lat[no + 2].extend(native_samples(per_block, size, || {
                s += 1;
                let pair = s % 4;
                native_get(&env.data.buf, base, &dst, hkey(2 * pair), &[2 * pair])
            }));
            lat[no + 3].extend(native_samples(per_block, size, || {
                s += 1;
                let pair = s % 4;
                native_get(
                    &env.data.buf,
                    base,
                    &dst,
                    hkey(2 * pair + 1),
                    &[2 * pair, 2 * pair + 1],
                )
            }));
        }
        let st: Vec<Stats> = lat.iter().map(|v| stats(v)).collect();
        let single = st[0].median;
        for (i, name) in names.iter().enumerate() {
            let label = if i == 0 {
                size_name(size)
            } else {
                String::new()
            };
            match &failed[i] {
                Some(e) => {
                    print_failed(&format!("{label:<7} {name:<44}"));
                    anomalies.push(format!("hash GET {}, {size} B: {e}", name.trim()));
                }
                None => println!(
                    "   {:<7} {:<44} {:>9} {:>9} {:>10.2}×",
                    label,
                    name,
                    us(st[i].median),
                    us(st[i].p99),
                    st[i].median / single
                ),
            }
        }
        if failed[0].is_none() && failed[2].is_none() {
            // (par ÷ one-bucket, par ÷ seq), all three with the host asleep.
            let sleeping = (failed[4].is_none() && failed[5].is_none() && failed[6].is_none())
                .then(|| (st[5].median / st[4].median, st[5].median / st[6].median));
            ratios.push((
                size,
                st[2].median / single,
                st[1].median / single,
                st[3].median / single,
                sleeping,
            ));
        }
    }
    let floor_after = cross_thread_rtt(floor_samples).median;
    for s in &mut slots {
        s.clear(env)?;
    }
    println!();
    println!(
        "   floor: cross-thread round trip through a shared word, right before / after the \
         table: {} / {} ns (a GET crosses PUs at least twice)",
        fmt_ns(floor_before),
        fmt_ns(floor_after)
    );
    println!(
        "   installs (not timed): {}",
        slots
            .iter()
            .zip(&offloads)
            .map(|(s, o)| format!(
                "{} × {}{}",
                s.installs,
                s.program.name,
                if o.1 { " (moved)" } else { "" }
            ))
            .collect::<Vec<_>>()
            .join(", ")
    );
    println!(
        "   target: parallel two-bucket GET (collision) within {PAR_TARGET_RATIO}× of a one-bucket GET \
         (p50, catalog layout):"
    );
    for (size, par, seq, moved, sleeping) in &ratios {
        println!(
            "     {:>6}: par {:.2}×: {}   (seq {:.2}×; par with the client queue on PU 1 {:.2}×)",
            size_name(*size),
            par,
            verdict(*par <= PAR_TARGET_RATIO),
            seq,
            moved
        );
        if let Some((r, vs_seq)) = sleeping {
            println!(
                "             host sleeping on a completion channel: par {r:.2}× the 1-bucket GET \
                 with the same host: {}; par {vs_seq:.2}× seq (target ≤ 1): {}",
                verdict(*r <= PAR_TARGET_RATIO),
                verdict(*vs_seq <= 1.0)
            );
        }
    }
    if ratios.is_empty() {
        println!("     not measured: NOT MET");
    }
    Ok(())
}

// ---------------------------------------------------------------------------------------------
// Section 3: list-find latency (§5.3)

/// The list-find latency series.
#[derive(Clone, Copy, PartialEq, Eq)]
enum LSeries {
    /// No break, one installation serving many lookups.
    Warm,
    /// No break, client-facing queue moved to PU 1, many lookups per installation.
    Moved,
    /// No break, a fresh installation per lookup.
    Fresh,
    /// Break (a fresh installation per lookup, as it must).
    Break,
}

fn list_section(env: &Env, o: &Opts, anomalies: &mut Vec<String>) -> Result<(), String> {
    println!();
    println!("== 3. List find latency by position (RedN §5.3) ==");
    let n: u32 = 16;
    let blocks = o.reps.max(2);
    let per_block = (o.samples / 2).div_ceil(blocks);
    let fresh_per_block = (o.samples / 4).div_ceil(blocks).max(1);
    let warm = 10;
    let head = fill_list(env);
    let base = env.data.mr.addr.0;
    let dst = SharedBuffer::new(4096);
    println!(
        "   a list of {LIST_STEPS} nodes ({LIST_VALUE} B values), programs unrolled for {LIST_STEPS} steps; \
         µs from the client's doorbell (PUs woken before each sample)."
    );
    println!(
        "   Samples per position: {} for programs serving {n} lookups per installation and for READs, \
         {} for a fresh",
        per_block * blocks,
        fresh_per_block * blocks
    );
    println!("   installation per lookup (install not timed), in {blocks} interleaved blocks.");
    let nb = catalog::list_find(LIST_STEPS, false, n).map_err(|e| e.to_string())?;
    let mut moved = nb.clone();
    for q in &mut moved.queues {
        if q.role == QueueRole::Client {
            q.pu = Some(1);
        }
    }
    let nb1 = catalog::list_find(LIST_STEPS, false, 1).map_err(|e| e.to_string())?;
    let brk = catalog::list_find(LIST_STEPS, true, 1).map_err(|e| e.to_string())?;
    let ring = (2 * n).next_power_of_two();
    let mut slots = [Slot::new(nb, ring), Slot::new(moved, ring)];
    let mut rd = env.reader.borrow_mut();
    let positions = LIST_STEPS as usize + 1; // 1..8, then absent
    let key_at = |pos: usize| {
        if pos < LIST_STEPS as usize {
            lkey(pos as u64)
        } else {
            0xdead
        }
    };
    // Per position: [warm value, warm end, moved value, moved end, fresh end, break, READs, native]
    let mut lat: Vec<Vec<Vec<f64>>> = vec![vec![Vec::new(); 8]; positions];
    let series = [
        LSeries::Warm,
        LSeries::Moved,
        LSeries::Fresh,
        LSeries::Break,
    ];
    let mut failed: Vec<Option<String>> = vec![None; 6];
    for block in 0..blocks {
        // Positions in a rotated order, so no position is always first in a block.
        for i in 0..positions {
            let pos = (block * 2 + i) % positions;
            let lp = &mut lat[pos];
            let key = key_at(pos);
            let found = pos < LIST_STEPS as usize;
            for (si, &ser) in series.iter().enumerate() {
                if failed[si].is_some() {
                    continue;
                }
                let with_break = ser == LSeries::Break;
                let msg = list_msg(head, key, with_break);
                let fresh = matches!(ser, LSeries::Fresh | LSeries::Break);
                let count = if fresh {
                    fresh_per_block + 2
                } else {
                    per_block + warm
                };
                let skip = if fresh { 2 } else { warm };
                let r = (|| -> Result<(), String> {
                    for s in 0..count {
                        let mut fresh_inst = None;
                        let inst = match ser {
                            LSeries::Warm => slots[0].get(env, 1)?,
                            LSeries::Moved => slots[1].get(env, 1)?,
                            LSeries::Fresh | LSeries::Break => {
                                let p = if with_break { &brk } else { &nb1 };
                                let i = fresh_inst.insert(install(env, p, 0, 16, 16, 0)?);
                                std::thread::sleep(Duration::from_micros(20));
                                i
                            }
                        };
                        let k = u32::try_from(inst.served).ctx("invocation number")?;
                        let resp = if found && !with_break { 2 } else { 1 };
                        let res =
                            trigger(env, inst, &msg, resp, HostWait::Poll).and_then(|(t, cqes)| {
                                let lens: Vec<u32> = match (found, with_break) {
                                    (true, false) => vec![LIST_VALUE, 0],
                                    (true, true) => vec![LIST_VALUE],
                                    (false, _) => vec![0],
                                };
                                check_responses(&cqes, k, &lens).map_err(|e| {
                                    format!("position {}: {e}{}", pos + 1, inst.diag(env))
                                })?;
                                if found && cqes[0].byte_len == 0 {
                                    return Err(format!(
                                        "position {}: end marker before the value",
                                        pos + 1
                                    ));
                                }
                                if found
                                    && s == skip
                                    && env.cbuf.read(0, LIST_VALUE as usize) != lvalue(pos as u64)
                                {
                                    return Err(format!("position {}: wrong value bytes", pos + 1));
                                }
                                Ok(t)
                            });
                        if let Some(i) = fresh_inst {
                            remove(env, i)?;
                        }
                        let t = res?;
                        if s < skip {
                            continue;
                        }
                        let last = *t.last().unwrap_or(&f64::NAN);
                        match ser {
                            LSeries::Warm | LSeries::Moved => {
                                let at = if ser == LSeries::Warm { 0 } else { 2 };
                                if found {
                                    lp[at].push(t[0]);
                                }
                                lp[at + 1].push(last);
                            }
                            LSeries::Fresh => lp[4].push(last),
                            LSeries::Break => lp[5].push(last),
                        }
                    }
                    Ok(())
                })();
                if let Err(e) = r {
                    failed[si] = Some(e);
                }
            }
            // One-sided READs.
            if failed[4].is_none() {
                let r = (|| -> Result<(), String> {
                    for s in 0..per_block + warm {
                        let (t, len) = read_find(env, &mut rd, head, key)?;
                        let want = if found { LIST_VALUE as usize } else { 0 };
                        if len != want {
                            return Err(format!(
                                "READ find, position {}: {len} bytes, expected {want}",
                                pos + 1
                            ));
                        }
                        if s >= warm {
                            lp[6].push(t);
                        }
                    }
                    Ok(())
                })();
                if let Err(e) = r {
                    failed[4] = Some(e);
                }
            }
            lp[7].extend(native_samples(per_block, 64 * (pos + 1), || {
                native_find(&env.data.buf, base, &dst, head, key)
            }));
        }
    }
    let installs: Vec<usize> = slots.iter().map(|s| s.installs).collect();
    for s in &mut slots {
        s.clear(env)?;
    }

    // WQEs per lookup, in a pass of its own: counters before, one lookup, counters once the
    // chain has gone quiet.
    let mut wqes: Vec<[f64; 2]> = vec![[f64::NAN; 2]; positions];
    let wres = (|| -> Result<(), String> {
        for (pos, w) in wqes.iter_mut().enumerate() {
            let found = pos < LIST_STEPS as usize;
            for (j, with_break) in [false, true].into_iter().enumerate() {
                let p = if with_break { &brk } else { &nb1 };
                let mut inst = install(env, p, 0, 16, 16, 0)?;
                std::thread::sleep(Duration::from_micros(200));
                let before = inst.wqes(env)?;
                let resp = if found && !with_break { 2 } else { 1 };
                let r = trigger(
                    env,
                    &mut inst,
                    &list_msg(head, key_at(pos), with_break),
                    resp,
                    HostWait::Poll,
                );
                std::thread::sleep(Duration::from_millis(3));
                let after = inst.wqes(env);
                remove(env, inst)?;
                r?;
                w[j] = (after? - before) as f64;
            }
        }
        Ok(())
    })();
    if let Err(e) = wres {
        failed[5] = Some(e);
    }

    println!();
    println!(
        "   {:<9}|{:^29}|{:^19}|{:^9}|{:^19}|{:^9}|{:^9}",
        "", "no break", "break", "no break", "READ chase", "native", "WQEs"
    );
    println!(
        "   {:<9}|{:^29}|{:^19}|{:^9}|{:^19}|{:^9}|{:^9}",
        "", "(warm installation)", "(fresh inst.)", "(fresh)", "", "", "nb / b"
    );
    println!(
        "   {:<9}|{:>9} {:>9} {:>9}|{:>9} {:>9}|{:>9}|{:>9} {:>9}|{:>9}|{:>9}",
        "position",
        "value p50",
        "end p50",
        "end p99",
        "p50",
        "p99",
        "end p50",
        "p50",
        "p99",
        "p50",
        ""
    );
    // A series' figures, or none ("-") where it failed.
    let st = |v: &[f64], failed: bool| {
        if failed {
            Stats::default()
        } else {
            stats(v)
        }
    };
    let wq = |v: f64| {
        if v.is_finite() {
            format!("{v:.0}")
        } else {
            "-".into()
        }
    };
    for (pos, lp) in lat.iter().enumerate() {
        let name = if pos < LIST_STEPS as usize {
            format!("{}", pos + 1)
        } else {
            "absent".into()
        };
        println!(
            "   {:<9}|{:>9} {:>9} {:>9}|{:>9} {:>9}|{:>9}|{:>9} {:>9}|{:>9}|{:>9}",
            name,
            us(st(&lp[0], failed[0].is_some()).median),
            us(st(&lp[1], failed[0].is_some()).median),
            us(st(&lp[1], failed[0].is_some()).p99),
            us(st(&lp[5], failed[3].is_some()).median),
            us(st(&lp[5], failed[3].is_some()).p99),
            us(st(&lp[4], failed[2].is_some()).median),
            us(st(&lp[6], failed[4].is_some()).median),
            us(st(&lp[6], failed[4].is_some()).p99),
            us(stats(&lp[7]).median),
            format!("{}/{}", wq(wqes[pos][0]), wq(wqes[pos][1])),
        );
    }
    println!();
    println!("   no break with the client-facing queue moved to PU 1 (warm installation), p50 µs:");
    let mut line_v = String::new();
    let mut line_e = String::new();
    for lp in &lat {
        line_v += &format!(" {:>7}", us(st(&lp[2], failed[1].is_some()).median));
        line_e += &format!(" {:>7}", us(st(&lp[3], failed[1].is_some()).median));
    }
    println!(
        "   {:<9} {}",
        "position",
        (1..=positions)
            .map(|p| if p <= LIST_STEPS as usize {
                format!("{p:>7}")
            } else {
                format!("{:>7}", "absent")
            })
            .collect::<Vec<_>>()
            .join(" ")
    );
    println!("   {:<9}{line_v}", "value");
    println!("   {:<9}{line_e}", "end");
    let names = [
        "list-find (no break)",
        "list-find, client queue on PU 1",
        "list-find, fresh installations",
        "list-find-break",
        "READ chase",
        "WQE counts",
    ];
    for (i, f) in failed.iter().enumerate() {
        if let Some(e) = f {
            anomalies.push(format!("list find, {}: {e}", names[i]));
        }
    }
    println!();
    println!("   value = doorbell → the matching node's value; end = doorbell → the end marker after all");
    println!("   {LIST_STEPS} steps; break: doorbell → its only response. READ chase: one READ per node visited,");
    println!("   then one for the value. WQEs nb/b: executed on the program's queues per lookup (responses");
    println!("   included), no break / break. native: the CPU walking the same list and copying the value.");
    println!(
        "   installs (not timed): {} × list-find ({n} lookups each), {} × the same with the client queue \
         on PU 1, one per fresh lookup.",
        installs[0], installs[1]
    );
    let w = &wqes;
    if failed[5].is_none() {
        let brk_fewer = (0..LIST_STEPS as usize).all(|p| w[p][1] < w[LIST_STEPS as usize][1])
            && (0..LIST_STEPS as usize - 1).all(|p| w[p][1] < w[p + 1][1]);
        let nb_flat = w.windows(2).all(|x| x[0][0] == x[1][0]);
        println!(
            "   check: break's WQEs grow with the match position and stay below a full traversal: {}; \
             no-break count independent of position: {}",
            if brk_fewer { "yes" } else { "NO" },
            if nb_flat { "yes" } else { "NO" }
        );
        if !brk_fewer || !nb_flat {
            anomalies.push(format!(
                "list find WQE counts unexpected (no break, break): {w:?}"
            ));
        }
    }
    Ok(())
}

// ---------------------------------------------------------------------------------------------

fn main() {
    let o = parse_args();
    let started = Instant::now();
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
    print_anomalies(&anomalies, started);
    drop(env);
    if !anomalies.is_empty() {
        std::process::exit(1);
    }
}
