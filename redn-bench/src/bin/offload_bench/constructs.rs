//! Section 1: construct throughput (RedN Table 3): timed runs of the Builder programs and of
//! the catalog's offloads with pipelined triggers, their native baselines, and the table and
//! its targets.

use super::baselines::{native_get, native_parallel, next_node};
use super::contents::{
    bucket_off, fill_list, fill_table, hkey, hvalue, list_msg, lkey, single_msg, BUCKETS,
    LIST_STEPS,
};
use super::env::{install, install_for, on_pu, remove, ClientSide, Env, Inst};
use super::programs::{if_program, loop_program};
use super::{send_wr, take_cqes, wait_cq, Opts};
use redn_bench::bytes::be48;
use redn_bench::report::{mops, print_failed, verdict};
use redn_bench::stats::{median, min};
use redn_bench::steal::{fmt_share, verdict_note, StealMeter};
use redn_bench::wait::WaitMode;
use redn_bench::Ctx;
use redn_program::program::catalog::{self, HashVariant, NODE_BYTES};
use redn_program::program::{Program, QueueRole};
use redn_program::wqe::Opcode;
use redn_program::wqe::{WorkRequest, WqeFlags, WrOp};
use redn_sys::conv::{idx, low32};
use redn_sys::mem::SharedBuffer;
use redn_sys::nic::{CqConfig, Nic};
use redn_sys::softnic::completion_clock_ns;
use redn_sys::Cqn;
use redn_sys::QpState;
use std::hint::black_box;
use std::time::{Duration, Instant};

// Targets and the paper's ConnectX-5 figures.
const IF_TARGET: f64 = 5e6;
/// Target: pipelined hash GETs/s on 2 server PUs over those on 1.
const GET_SCALING_TARGET: f64 = 1.7;
const CX5_IF: f64 = 0.7e6;
const LOOP_TARGET: f64 = 2e6;
const CX5_LOOP: f64 = 0.3e6;

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
    let before = load_triggers(env, insts, count, resp, msg)?;
    let base = env.client.cq_produced(env.ccq).ctx("cq_produced")?;
    let total = insts.len() as u64 * count * resp;
    let pus = server_pus(insts);
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
    for inst in insts.iter() {
        let n = cqes.iter().filter(|c| c.qpn == inst.cqp).count() as u64;
        if n != count * resp {
            return Err(format!(
                "QP {} got {n} responses, expected {}",
                inst.cqp,
                count * resp
            ));
        }
    }
    let ops = (insts.len() as u64 * count) as f64;
    Ok((ops / secs, wqes_per_trigger(env, insts, count, before)?))
}

/// The server alone draining a backlog, for the scaling target with the clients out of the
/// way. Each instance in `insts` was installed from `gated` (its program without its entry
/// enables), so its workers have nothing to run; `count` triggers (from `msg(instance, k)`)
/// are sent to each and wait, received, on its client-facing queue. With the client's PUs
/// idle long enough to park and the host asleep, `entry`'s enables are posted at `t0`: from
/// then on only the server's PUs run. Returns the GETs/s from `t0` to the last answer's
/// completion stamp (written by the server PU that answered, so the host's wake-up is not in
/// it), and the WQEs the server executed per trigger.
fn drained(
    env: &Env,
    insts: &mut [Inst],
    gated: &Program,
    entry: &[(String, u32)],
    count: u64,
    msg: &dyn Fn(usize, u64) -> Vec<u8>,
    resp_len: u32,
) -> Result<(f64, f64), String> {
    let (front, _) = gated
        .queues
        .iter()
        .enumerate()
        .find(|(_, q)| q.role == QueueRole::Client)
        .ok_or("the program has no client-facing queue")?;
    let mut cqs: Vec<Cqn> = insts.iter().map(|i| i.ccq).collect();
    cqs.sort_unstable();
    cqs.dedup();
    let mut bases = Vec::new();
    for &cq in &cqs {
        bases.push(env.client.cq_produced(cq).ctx("cq_produced")?);
    }
    let before = load_triggers(env, insts, count, 1, msg)?;
    for inst in insts.iter() {
        inst.csq.ring(&env.client)?;
    }
    // Every trigger received, none answered: the backlog is whole.
    for inst in insts.iter() {
        wait_cq(
            &env.server,
            inst.installed.cqs[front],
            count,
            WaitMode::Spin,
        )
        .map_err(|e| format!("triggers not received: {e}{}", inst.diag(env)))?;
    }
    for (&cq, &base) in cqs.iter().zip(&bases) {
        let answered = env.client.cq_produced(cq).ctx("cq_produced")? - base;
        if answered != 0 {
            return Err(format!(
                "{answered} answers came before the workers were enabled"
            ));
        }
    }
    // The client's PUs park after 50 µs with nothing to do.
    std::thread::sleep(Duration::from_micros(300));
    let pus = server_pus(insts);
    env.wake_pus(&[], &pus)?;
    let t0 = completion_clock_ns();
    for inst in insts.iter() {
        let mut enables = Vec::new();
        for (name, pi) in entry {
            let qp = inst
                .installed
                .qp(gated, name)
                .ok_or_else(|| format!("no queue {name}"))?;
            enables.push(WorkRequest {
                wr_id: 0,
                flags: WqeFlags::NONE,
                op: WrOp::SendEnable { qp, pi: *pi },
            });
        }
        env.server
            .post_send(inst.installed.master, &enables)
            .ctx("post the entry enables")?;
    }
    let per_cq = count * insts.len() as u64 / cqs.len() as u64;
    let started = Instant::now();
    let mut end = t0;
    for (&cq, &base) in cqs.iter().zip(&bases) {
        // Looked at every 200 µs: the span ends at the completion stamps, not at the look.
        while env.client.cq_produced(cq).ctx("cq_produced")? < base + per_cq {
            if started.elapsed() > Duration::from_secs(10) {
                let d: String = insts.iter().map(|i| i.diag(env)).collect();
                return Err(format!("the backlog was not drained in 10 s{d}"));
            }
            std::thread::sleep(Duration::from_micros(200));
        }
        let cqes = take_cqes(&env.client, cq, idx(per_cq))?;
        if let Some(c) = cqes.iter().find(|c| !c.is_ok() || c.byte_len != resp_len) {
            return Err(format!(
                "drained response wrong (expected {resp_len} bytes): {c:?}"
            ));
        }
        for inst in insts.iter().filter(|i| i.ccq == cq) {
            let n = cqes.iter().filter(|c| c.qpn == inst.cqp).count() as u64;
            if n != count {
                return Err(format!(
                    "QP {} got {n} responses, expected {count}",
                    inst.cqp
                ));
            }
        }
        end = cqes.iter().map(|c| c.cqe.timestamp).fold(end, u64::max);
    }
    let ops = (insts.len() as u64 * count) as f64;
    let secs = Duration::from_nanos(end.saturating_sub(t0)).as_secs_f64();
    Ok((ops / secs, wqes_per_trigger(env, insts, count, before)?))
}

/// The server PUs the queues of `insts` run on, each once.
fn server_pus(insts: &[Inst]) -> Vec<usize> {
    let mut pus: Vec<usize> = insts.iter().flat_map(|i| i.pus.iter().copied()).collect();
    pus.sort_unstable();
    pus.dedup();
    pus
}

/// Before a run: `count` triggers (from `msg(instance, k)`) encoded into each instance's
/// client send ring, not rung, and `resp` receives per trigger posted for the answers. The
/// WQEs the server has run on the instances' queues so far.
fn load_triggers(
    env: &Env,
    insts: &mut [Inst],
    count: u64,
    resp: u64,
    msg: &dyn Fn(usize, u64) -> Vec<u8>,
) -> Result<u64, String> {
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
    Ok(before)
}

/// After a run of `count` triggers to each of `insts`: count them served, give the PUs a
/// moment to publish their counters (a PU does at the end of a burst), and return the WQEs
/// the server ran per trigger since it had run `before`.
fn wqes_per_trigger(env: &Env, insts: &mut [Inst], count: u64, before: u64) -> Result<f64, String> {
    for inst in insts.iter_mut() {
        inst.served += count;
    }
    std::thread::sleep(Duration::from_micros(300));
    let mut after = 0;
    for inst in insts.iter() {
        after += inst.wqes(env)?;
    }
    Ok((after - before) as f64 / (insts.len() as u64 * count) as f64)
}

/// One [`drained`] run: `count` triggers to each of `k` instances per PU on `p` PUs,
/// installed for it (the entry enables run once). The instances on one server PU answer
/// into a client CQ and answer area of their own (`ClientSide::apart`), as clients on
/// different hosts would have. GETs/s and WQEs per GET.
fn drained_run(
    env: &Env,
    prog: &Program,
    p: usize,
    k: usize,
    count: u64,
    msg: &dyn Fn(usize, u64) -> Vec<u8>,
    resp_len: u32,
) -> Result<(f64, f64), String> {
    let ring = u32::try_from((count * 2).next_power_of_two().max(64)).ctx("send ring size")?;
    let depth = u32::try_from((count * k as u64 * 2).next_power_of_two()).ctx("CQ depth")?;
    // The program without its entry enables: installed so, its workers run nothing until
    // `drained` posts them.
    let mut gated = prog.clone();
    let entry = std::mem::take(&mut gated.entry);
    if !gated.recv_entry.is_empty() {
        return Err(format!(
            "{}: a drained run posts no receive enables",
            prog.name
        ));
    }
    let mut cqs = Vec::new();
    let mut insts: Vec<Inst> = Vec::new();
    let res = (|| {
        for pu in 0..p {
            cqs.push(
                env.client
                    .create_cq(CqConfig::new(depth))
                    .ctx("create_cq")?,
            );
            let placed = on_pu(&gated, pu);
            for j in 0..k {
                let n = pu * k + j;
                let side = ClientSide::apart(n % env.pus, cqs[pu], pu as u64)?;
                insts.push(install_for(env, &placed, n as u64, ring, ring, side)?);
            }
        }
        drained(env, &mut insts, &gated, &entry, count, msg, resp_len)
    })();
    for i in insts {
        remove(env, i)?;
    }
    for cq in cqs {
        env.client.destroy_cq(cq).ctx("destroy_cq")?;
    }
    res
}

/// `0.93-1.71×`: the range of `ratios`.
fn spread(ratios: &[f64]) -> String {
    let lo = ratios.iter().copied().fold(f64::INFINITY, f64::min);
    let hi = ratios.iter().copied().fold(f64::NEG_INFINITY, f64::max);
    format!("{lo:.2}-{hi:.2}×")
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

pub(crate) fn constructs_section(
    env: &Env,
    o: &Opts,
    anomalies: &mut Vec<String>,
) -> Result<(), String> {
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
    println!("   ~70 µs late, so those rates err low. \"backlog drained\" rows: the server's PUs alone, from");
    println!("   the post of the enables that let them start to the last answer's completion stamp (see --help).");
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
        "   {:<40} {:>3} {:>11} {:>9} {:>8} {:>8} {:>10} {:>9} {:>9} {:>6}   target",
        "construct",
        "PUs",
        "softnic/s",
        "worst",
        "ns/op/PU",
        "WQEs/op",
        "native/s",
        "slowdown",
        "CX-5",
        "stolen"
    );
    // The hypervisor's share of the CPUs while each row ran (its native baseline included):
    // from the end of the row before, or from here, to its own end.
    let mut steal = StealMeter::start();
    // A row of the table, or FAILED (`short` names it there and in the anomaly) when it could
    // not be measured; the median rate and the share of the CPUs stolen while it ran.
    let mut row = |name: &str,
                   short: &str,
                   p: usize,
                   r: Result<TpRow, String>,
                   cx5: Option<f64>,
                   target: Option<f64>,
                   mode: WaitMode| {
        let stolen = steal.lap();
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
            "   {:<40} {:>3} {:>9}{} {:>8}M {:>8.1} {:>8.1} {:>9}M {:>8.1}× {:>9} {:>6}   {}",
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
            fmt_share(stolen),
            t
        );
        Some((med, stolen))
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
    for &p in pu_sets.iter().filter(|_| o.row("if")) {
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
    for &p in pu_sets.iter().filter(|_| o.row("pipelined")) {
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
        let med = row(name, "if in hash-get", p, r, None, None, mode);
        gets.push((p, med.map(|(rate, _)| rate)));
    }
    // The same GETs drained from a backlog by the server alone (the scaling target's rows):
    // a 1-PU run and a 2-PU run in turn, and the native loop on 1 and 2 threads in turn, so
    // each ratio compares runs made in the same state of the machine.
    let mut scaling = Err(if o.row("drained") {
        "needs --pus 2"
    } else {
        "not in --rows"
    });
    if all >= 2 && o.row("drained") {
        let mut runs: [Vec<(f64, f64)>; 2] = [Vec::new(), Vec::new()];
        let mut natives: [Vec<f64>; 2] = [Vec::new(), Vec::new()];
        // The first pair is a warm-up.
        let measured = (|| {
            for rep in 0..=o.reps {
                for (i, p) in [1, 2].into_iter().enumerate() {
                    let k = if p == 1 { hash_k.0 } else { hash_k.1 };
                    let r = drained_run(env, &hash, p, k, u64::from(hash_n), &hmsg, 64)?;
                    if rep > 0 {
                        runs[i].push(r);
                        natives[i].push(native_parallel(p, native_n, &native_get_loop));
                    }
                }
            }
            Ok::<(), String>(())
        })();
        let name = "if in hash-get (GETs, backlog drained)";
        for (i, p) in [1, 2].into_iter().enumerate() {
            let r = match &measured {
                Err(e) => Err(e.clone()),
                Ok(()) => Ok(TpRow {
                    rates: runs[i].iter().map(|r| r.0).collect(),
                    wqes_per_op: median(&runs[i].iter().map(|r| r.1).collect::<Vec<_>>()),
                    native: median(&natives[i]),
                }),
            };
            // Timed by completion stamps, not by the host's polls: no asterisk.
            row(name, "hash-get drained", p, r, None, None, WaitMode::Spin);
        }
        scaling = Err("the drained rows failed");
        if measured.is_ok() {
            let ratios = |v: &[Vec<f64>; 2]| -> Vec<f64> {
                v[1].iter().zip(&v[0]).map(|(two, one)| two / one).collect()
            };
            let rates = runs.each_ref().map(|r| r.iter().map(|x| x.0).collect());
            scaling = Ok((ratios(&rates), ratios(&natives)));
        }
    }

    // Unrolled `while`: list-find without break, key absent.
    let lf = catalog::list_find(LIST_STEPS, false, list_n).map_err(|e| e.to_string())?;
    let head = fill_list(env);
    let lmsg = move |_i: usize, _k: u64| list_msg(head, 0xdead, false);
    let iterations = f64::from(LIST_STEPS);
    for &p in pu_sets.iter().filter(|_| o.row("unrolled")) {
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
    for &p in pu_sets.iter().filter(|_| o.row("recycled")) {
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
    for &p in pu_sets.iter().filter(|_| o.row("server-loop")) {
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
    println!(
        "   2 × (FETCH_ADD + store the count + store the enable index). One thread per PU, pinned."
    );
    println!("   CX-5: the paper's ConnectX-5 figures (whole NIC).");
    println!();
    match if1 {
        Some((r, stolen)) => println!(
            "   target: if ≥ {} M/s on one PU (ConnectX-5: {} M/s): {} M/s: {}{}",
            IF_TARGET / 1e6,
            CX5_IF / 1e6,
            mops(r),
            verdict(r >= IF_TARGET),
            verdict_note(stolen)
        ),
        None if !o.row("if") => println!("   target: if ≥ {} M/s: not run", IF_TARGET / 1e6),
        None => println!(
            "   target: if ≥ {} M/s on one PU: not measured: NOT MET",
            IF_TARGET / 1e6
        ),
    }
    match loop1 {
        Some((r, stolen)) => println!(
            "   target: recycled while ≥ {} M iterations/s on one PU (ConnectX-5: {} M/s): {} M/s: {}{}",
            LOOP_TARGET / 1e6,
            CX5_LOOP / 1e6,
            mops(r),
            verdict(r >= LOOP_TARGET),
            verdict_note(stolen)
        ),
        None if !o.row("recycled") => println!(
            "   target: recycled while ≥ {} M iterations/s: not run",
            LOOP_TARGET / 1e6
        ),
        None => println!(
            "   target: recycled while ≥ {} M iterations/s on one PU: not measured: NOT MET",
            LOOP_TARGET / 1e6
        ),
    }
    match scaling {
        Ok((softnic, native)) => {
            let relative: Vec<f64> = softnic.iter().zip(&native).map(|(s, n)| s / n).collect();
            println!(
            "   target: hash-get GETs/s from 1 to 2 server PUs ≥ {GET_SCALING_TARGET}×, clients not \
             the bottleneck (backlog drained), median of {} run pairs: {:.2}× ({}): {}\n   \
             (the native GET loop on 1 and 2 threads, pinned, pairs run beside them: {:.2}× ({});\n   \
             the softnic's ratio over the native's, pair by pair: {:.2} ({}))",
            softnic.len(),
            median(&softnic),
            spread(&softnic),
            verdict(median(&softnic) >= GET_SCALING_TARGET),
            median(&native),
            spread(&native),
            median(&relative),
            spread(&relative).trim_end_matches('×')
        )
        }
        Err(why) if !o.row("drained") => println!(
            "   target: hash-get GETs/s from 1 to 2 server PUs ≥ {GET_SCALING_TARGET}×: not run \
             ({why})"
        ),
        Err(why) => println!(
            "   target: hash-get GETs/s from 1 to 2 server PUs ≥ {GET_SCALING_TARGET}×: not \
             measured ({why}): NOT MET"
        ),
    }
    let on = |n: usize| gets.iter().find(|g| g.0 == n).and_then(|g| g.1);
    if let (Some(one), Some(two)) = (on(1), on(2)) {
        println!(
            "   (pipelined, the client's {all} PUs sending meanwhile on the same {} cores: {:.2}×)",
            o.common.cores,
            two / one
        );
    }
    Ok(())
}
