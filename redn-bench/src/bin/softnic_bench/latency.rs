//! Section 1: chain latency vs chain length (RedN Fig. 8): the interleaved runs of every
//! length and detection mode, the tables, the per-step slopes and the targets' verdicts.

use super::chain::{
    chain_wqes, native_chain_stats, run_chain, Chain, Detect, Flag, LatQueues, Sleeper, Wakers,
};
use super::{diag, Opts};
use redn_bench::native::cross_thread_rtt;
use redn_bench::report::{fmt_ns, verdict};
use redn_bench::stats::{ns, stats, Stats};
use redn_bench::wait::SPIN_BEFORE_YIELD;
use redn_bench::Ctx;
use redn_program::wqe::Opcode;
use redn_sys::mem::SharedBuffer;
use redn_sys::nic::{CompChannel, Nic};
use redn_sys::softnic::SoftNic;
use redn_sys::{Access, Pdn, QpState};

const CHAIN_LENGTHS: [usize; 7] = [1, 2, 4, 8, 16, 32, 64];
const DB_TARGET_NS: f64 = 50.0;
/// Target: a same-PU doorbell step within this many times the native chain's step.
const DB_TARGET_NATIVE: f64 = 4.0;
/// Target: a cross-PU doorbell step (host asleep) within this many times the same run's
/// cross-thread round trip.
const CROSS_TARGET_FLOOR: f64 = 1.5;
const CX5_DB_NS: f64 = 540.0;

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

pub(crate) fn latency_section(
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
