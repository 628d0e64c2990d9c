//! Section 3: queues without work: what idle queues, and queues parked on a WAIT, cost the busy
//! PU that visits them (a manager's idle clients), next to a minimal native scan.

use super::{diag, wait_cq, Opts};
use redn_bench::queues::{flags_if, nop, post_endless_wait, SqWriter};
use redn_bench::report::fmt_ns;
use redn_bench::setup::{counting_cq, loopback_qp};
use redn_bench::stats::{median, ns};
use redn_bench::wait::WaitMode;
use redn_bench::Ctx;
use redn_sys::nic::Nic;
use redn_sys::softnic::SoftNic;
use redn_sys::{Cqn, Pdn, Qpn};
use std::hint::black_box;
use std::time::Instant;

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

pub(crate) fn visits_section(nic: &SoftNic, pd: Pdn, o: &Opts) -> Result<(), String> {
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
