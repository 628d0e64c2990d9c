//! chain_profile: one long doorbell-ordered chain on one PU, for instruction counts.
//!
//! The softnic_bench latency table times short chains with a polling host; this runs a chain
//! of N steps (a master SQ doing WAIT + SEND_EN for a managed SQ of signaled NOPs, the
//! paper's doorbell order) while the host sleeps, so a profiler sees almost only the PU:
//!
//! ```text
//! cargo build --release -p redn-bench --bin chain_profile
//! valgrind --tool=callgrind --collect-atstart=no \
//!     --toggle-collect='redn_sys::softnic::exec::SqExec::run' \
//!     target/release/chain_profile 8000 2
//! ```
//!
//! and the total divided by N × rounds is the executor's instruction cost of one step
//! (counting the whole PU thread instead adds the PU loop and its idle polling between
//! rounds, which moves by a few percent with scheduling).
//!
//! With `--write`, the chain is N unsignaled 64-byte RDMA WRITEs in WQ order (the last one
//! signaled) that the host writes into the ring again before each round, the same bytes but
//! for the WQE index: the cost of one WRITE, first resolved and then re-run.
//!
//! With `--cross`, the master runs on PU 0 and the managed queue on PU 1, so every step is
//! two cross-PU hand-offs; built with the feature `handoff-trace`, each round then also
//! prints where a step's time goes (see [`cross_trace`]). Without `--cross`, such a build
//! prints at the end the PU's completion-to-completion gaps by where the step is in its
//! chain (see [`StepGaps`]): a short chain's first steps apart from its steady state.

use redn_bench::opts::{parse_cpus, parse_in, read_command_line};
use redn_bench::queues::{flags_if, nop, post_endless_wait, push_doorbell_master, SqWriter};
use redn_bench::setup::{counting_cq, loopback_qp, Region};
use redn_bench::Ctx;
use redn_program::wqe::{Payload, WorkRequest, WqeFlags, WrOp};
use redn_sys::conv::idx;
use redn_sys::nic::Nic;
use redn_sys::softnic::handoff_trace::{self, HandoffEvent};
use redn_sys::softnic::{SoftNic, SoftNicConfig};
use redn_sys::{Cqn, Pdn};
use std::time::{Duration, Instant};

const USAGE: &str = "\
chain_profile: one long doorbell-ordered NOP chain on one softnic PU (for profilers)

USAGE:
    cargo run --release -p redn-bench --bin chain_profile -- [--write] [--cross] [--spin]
        [--parked N] [--idle N] [--pu-cpus LIST] [STEPS [ROUNDS]]

    STEPS    chain length, 1..=8000 (default 4000)
    ROUNDS   chains to run one after another (default 5)
    --write  instead of the doorbell-ordered chain: STEPS 64 B RDMA WRITEs in WQ order, the
             last one signaled, re-posted by the host (same bytes) before each round
    --parked N  also give the PU N queues (0..=1000) that sit on a WAIT that never
             completes, as a manager's idle clients do: the PU visits them once a round
             (a handed-over doorbell chain takes a round per 128 steps; softnic_bench
             --only visits measures visits on a busy PU)
    --idle N also give the PU N queues (0..=1000) with nothing posted
    --cross  two PUs: the master SQ on PU 0, the managed SQ on PU 1 (every step crosses
             PUs; --parked and --idle queues go to PU 0). Built with
             `--features handoff-trace`, also prints each round's step split into its
             four hand-off parts (medians and 10th percentiles, from time stamps);
             without --cross such a build prints the gaps between completions, steps
             2-8, 9-64 and later of each chain apart
    --spin   the host spins and looks for the end every 5 µs instead of sleeping 200 µs
             between looks (~280 µs here, so sleeping rounds an 8000-step chain's time up
             by as much as 35 ns a step): use it for wall-clock timing, not under a
             profiler (it takes a core of its own; the PU has the other)
    --pu-cpus LIST  pin PU i to the i-th CPU of LIST (comma-separated, e.g. 0,1), so
             that with --cross the kernel cannot leave both PUs on one CPU for a while

Prints ns per step for each round. Under valgrind --tool=callgrind --collect-atstart=no
--toggle-collect='redn_sys::softnic::exec::SqExec::run', the instruction total /
(STEPS x ROUNDS) is the executor's cost of one step.
";

/// What the command line asks for.
#[derive(Debug)]
struct Opts {
    write: bool,
    cross: bool,
    spin: bool,
    parked: u64,
    idle: u64,
    steps: u64,
    rounds: u64,
    pu_cpus: Vec<usize>,
}

fn parse_args() -> Opts {
    let mut o = Opts {
        write: false,
        cross: false,
        spin: false,
        parked: 0,
        idle: 0,
        steps: 4000,
        rounds: 5,
        pu_cpus: Vec::new(),
    };
    let mut positionals = 0;
    read_command_line("chain_profile", USAGE, &mut |name, value| {
        match name {
            "--write" => o.write = true,
            "--cross" => o.cross = true,
            "--spin" => o.spin = true,
            "--parked" => o.parked = parse_in("--parked", value(), 0..=1000)?,
            "--idle" => o.idle = parse_in("--idle", value(), 0..=1000)?,
            "--pu-cpus" => o.pu_cpus = parse_cpus(value())?,
            a if a.starts_with('-') => return Ok(false),
            a => {
                let v = Some(a.to_string());
                match positionals {
                    0 => o.steps = parse_in("STEPS", v, 1..=8000)?,
                    1 => o.rounds = parse_in("ROUNDS", v, 1..=1000)?,
                    _ => return Err(format!("unexpected argument '{a}' after STEPS and ROUNDS")),
                }
                positionals += 1;
            }
        }
        Ok(true)
    });
    o
}

fn main() {
    let o = parse_args();
    if let Err(e) = run(&o) {
        eprintln!("chain_profile: {e}");
        std::process::exit(1);
    }
}

fn run(o: &Opts) -> Result<(), String> {
    let Opts {
        write,
        cross,
        spin,
        parked,
        idle,
        steps,
        rounds,
        ref pu_cpus,
    } = *o;
    let mut cfg = SoftNicConfig::new("softnic0");
    cfg.pus = if cross { 2 } else { 1 };
    cfg.pu_cpus.clone_from(pu_cpus);
    let nic = SoftNic::new(cfg).ctx("softnic")?;
    let pd = nic.alloc_pd().ctx("alloc_pd")?;
    let cq = || counting_cq(&nic);
    // Queues parked on a WAIT for a completion that never comes (their CQ has none).
    let never = cq()?;
    for _ in 0..parked {
        let info = loopback_qp(&nic, pd, never, 0, 64, false)?;
        post_endless_wait(&nic, &info, never)?;
    }
    for _ in 0..idle {
        loopback_qp(&nic, pd, never, 0, 64, false)?;
    }
    if write {
        return writes(&nic, pd, cq()?, steps, rounds, spin);
    }
    let (cq_m, cq_q) = (cq()?, cq()?);
    // Managed queue first: the PU runs its queues in creation order.
    let qi = loopback_qp(&nic, pd, cq_q, usize::from(cross), 16384, true)?;
    let mi = loopback_qp(&nic, pd, cq_m, 0, 32768, false)?;
    let (mut q, mut m) = (SqWriter::new(&qi, false), SqWriter::new(&mi, false));
    let mut gaps = StepGaps::default();
    for _ in 0..rounds {
        let base = nic.cq_produced(cq_q).ctx("cq_produced")?;
        let qb = q.pi;
        for i in 0..steps {
            q.push(&nic, &nop(WqeFlags::SIGNALED, i))?;
        }
        push_doorbell_master(&nic, &mut m, qi.qpn, cq_q, qb, base, steps, 0)?;
        let _ = handoff_trace::take();
        let (t0, c0) = (Instant::now(), handoff_trace::clock());
        m.ring(&nic)?;
        report(&nic, cq_q, base + steps, t0, steps, "step", spin)?;
        if handoff_trace::ENABLED {
            let ticks_per_ns =
                (handoff_trace::clock() - c0) as f64 / t0.elapsed().as_nanos().max(1) as f64;
            if cross {
                cross_trace(&handoff_trace::take(), ticks_per_ns);
            } else {
                gaps.add(&handoff_trace::take(), ticks_per_ns);
            }
        }
    }
    gaps.print();
    Ok(())
}

/// A same-PU chain's time between one step's completion and the next, by where the step
/// is in its chain, from the PU's completion stamps (`handoff_trace`): the chain's first
/// steps apart from its steady state, and the PU's own time apart from the host's (the
/// host's wake-up and its looks at the CQ are in no gap). Built without the feature, empty.
#[derive(Default)]
struct StepGaps {
    /// Gaps after the chain's first completion: to the 2nd-8th, to the 9th-64th, and on.
    by_part: [Vec<f64>; 3],
}

impl StepGaps {
    const PARTS: [&'static str; 3] = ["steps 2-8", "steps 9-64", "steps 65-"];

    /// Take one chain's stamps: the PU thread's completions (the thread that stamped most).
    fn add(&mut self, logs: &[Vec<(u64, HandoffEvent)>], ticks_per_ns: f64) {
        let done = |l: &&Vec<(u64, HandoffEvent)>| {
            l.iter().filter(|s| s.1 == HandoffEvent::Completed).count()
        };
        let Some(pu) = logs.iter().max_by_key(done) else {
            return;
        };
        let stamps: Vec<u64> = pu
            .iter()
            .filter(|s| s.1 == HandoffEvent::Completed)
            .map(|s| s.0)
            .collect();
        for (i, w) in stamps.windows(2).enumerate() {
            let part = match i + 2 {
                ..=8 => 0,
                9..=64 => 1,
                _ => 2,
            };
            self.by_part[part].push(w[1].saturating_sub(w[0]) as f64 / ticks_per_ns);
        }
    }

    fn print(&mut self) {
        if !handoff_trace::ENABLED {
            return;
        }
        println!("   completion to completion, ns (median / p10 / p90, how many):");
        for (name, v) in Self::PARTS.iter().zip(self.by_part.iter_mut()) {
            if v.is_empty() {
                continue;
            }
            v.sort_by(f64::total_cmp);
            let q = |pct: usize| v[(v.len() - 1) * pct / 100];
            println!(
                "     {name:<12} {:>7.1} / {:>7.1} / {:>7.1}  ({})",
                q(50),
                q(10),
                q(90),
                v.len()
            );
        }
    }
}

/// Print where a cross-PU step's time went, from the PU threads' stamps
/// (`redn_sys::softnic::handoff_trace`): the master's PU is the thread that stamped
/// SEND_ENs, the managed queue's the one that stamped completions. A step, SEND_EN to
/// SEND_EN, is four parts: the managed queue's PU finding the enable (publication to its
/// visit), running the NOP to its completion's count, the master's PU seeing that count
/// (the count's store to the WAIT passing), and the master running on to the next SEND_EN.
/// Also: how often the master's WAIT was found blocked per step (each block on the old path
/// was a return to the PU loop).
fn cross_trace(logs: &[Vec<(u64, HandoffEvent)>], ticks_per_ns: f64) {
    let count = |l: &Vec<(u64, HandoffEvent)>, e| l.iter().filter(|s| s.1 == e).count();
    let (Some(master), Some(target)) = (
        logs.iter().max_by_key(|l| count(l, HandoffEvent::Enabled)),
        logs.iter()
            .max_by_key(|l| count(l, HandoffEvent::Completed)),
    ) else {
        println!("   trace: no stamps");
        return;
    };
    if std::ptr::eq(master, target) {
        println!("   trace: one thread stamped both sides; not a cross-PU run");
        return;
    }
    // The master's enables, passes and blocks; the target's visits and completions.
    let mut events: Vec<(u64, HandoffEvent)> = master
        .iter()
        .filter(|s| s.1 != HandoffEvent::Found && s.1 != HandoffEvent::Completed)
        .chain(
            target
                .iter()
                .filter(|s| matches!(s.1, HandoffEvent::Found | HandoffEvent::Completed)),
        )
        .copied()
        .collect();
    events.sort_by_key(|s| s.0);
    // Walk the cycle Enabled -> Found -> Completed -> WaitPassed -> Enabled.
    let order = [
        HandoffEvent::Enabled,
        HandoffEvent::Found,
        HandoffEvent::Completed,
        HandoffEvent::WaitPassed,
    ];
    let mut parts: [Vec<f64>; 4] = Default::default();
    let mut steps = Vec::new();
    let (mut at, mut stamps, mut blocked) = (0usize, [0u64; 4], 0u64);
    let mut blocks_per_step = Vec::new();
    for &(t, e) in &events {
        if e == HandoffEvent::WaitBlocked {
            blocked += 1;
            continue;
        }
        if e != order[at] {
            continue;
        }
        if at == 0 && stamps[0] != 0 {
            // A full cycle since the last enable: record it.
            for (i, part) in parts.iter_mut().enumerate() {
                let end = if i == 3 { t } else { stamps[i + 1] };
                part.push(end.saturating_sub(stamps[i]) as f64 / ticks_per_ns);
            }
            steps.push(t.saturating_sub(stamps[0]) as f64 / ticks_per_ns);
            blocks_per_step.push(blocked as f64);
        }
        if at == 0 {
            blocked = 0;
        }
        stamps[at] = t;
        at = (at + 1) % order.len();
    }
    if steps.is_empty() {
        println!("   trace: no complete step");
        return;
    }
    // The `pct`th percentile (nearest rank below).
    let q = |v: &mut Vec<f64>, pct: usize| {
        v.sort_by(f64::total_cmp);
        v[(v.len() - 1) * pct / 100]
    };
    let names = [
        "enable -> target's visit",
        "visit -> completion counted",
        "count -> master's WAIT passes",
        "WAIT -> next SEND_EN",
    ];
    println!(
        "   trace ({} steps; ns, median / p10): step {:.0} / {:.0}",
        steps.len(),
        q(&mut steps, 50),
        q(&mut steps, 10)
    );
    for (name, part) in names.iter().zip(parts.iter_mut()) {
        println!(
            "     {name:<30} {:>6.0} / {:>6.0}",
            q(part, 50),
            q(part, 10)
        );
    }
    let mean_blocks = blocks_per_step.iter().sum::<f64>() / blocks_per_step.len() as f64;
    println!("     master WAIT found blocked {mean_blocks:.2} times a step (mean)");
}

/// Wait until `cq` has produced `target` completions, then print the time per step: by
/// sleeping 200 µs between looks (for profilers: the host thread stays out of the way, but
/// the time is rounded up to the next look, ~280 µs steps here: 35 ns a step of an
/// 8000-step chain), or with `spin` by spinning on the clock and looking every 5 µs (exact
/// to that, and the PU loses the CQ's cache line to the host only once per look).
fn report(
    nic: &SoftNic,
    cq: Cqn,
    target: u64,
    t0: Instant,
    steps: u64,
    what: &str,
    spin: bool,
) -> Result<(), String> {
    while nic.cq_produced(cq).ctx("cq_produced")? < target {
        if t0.elapsed() > Duration::from_secs(60) {
            return Err("the chain did not finish within 60 s".into());
        }
        if spin {
            let t = Instant::now();
            while t.elapsed() < SPIN_PERIOD {
                std::hint::spin_loop();
            }
        } else {
            std::thread::sleep(Duration::from_micros(200));
        }
    }
    let ns = t0.elapsed().as_nanos() as f64 / steps as f64;
    let how = if spin {
        "host looking every 5 µs"
    } else {
        "includes up to ~280 µs of host sleep"
    };
    println!("{steps} {what}s: {ns:.1} ns/{what} ({how})");
    Ok(())
}

/// Time between two looks at the CQ with `--spin`. Why not shorter: each look takes the
/// CQ's count's cache line from the PU, and on these VMs a host looking every microsecond
/// slowed an 8000-step chain from ~50 to 90-130 ns a step.
const SPIN_PERIOD: Duration = Duration::from_micros(5);

/// The `--write` chain: `steps` 64 B WRITEs from one region to another, posted again (same
/// bytes, new WQE indices) before each of `rounds` doorbells.
fn writes(
    nic: &SoftNic,
    pd: Pdn,
    cq: Cqn,
    steps: u64,
    rounds: u64,
    spin: bool,
) -> Result<(), String> {
    let len = idx(steps) * 64;
    let src = Region::filled(nic, pd, len, |_| 0x5a)?;
    let dst = Region::filled(nic, pd, len, |_| 0)?;
    let ring = u32::try_from(steps.next_power_of_two()).ctx("send ring size")?;
    let info = loopback_qp(nic, pd, cq, 0, ring, false)?;
    let mut q = SqWriter::new(&info, false);
    for _ in 0..rounds {
        let base = nic.cq_produced(cq).ctx("cq_produced")?;
        for i in 0..steps {
            let off = i * 64;
            q.push(
                nic,
                &WorkRequest {
                    wr_id: i,
                    flags: flags_if(i + 1 == steps),
                    op: WrOp::Write {
                        remote: dst.mr.remote(off),
                        payload: Payload::Sgl(vec![src.mr.sge(off, 64)]),
                        imm: None,
                    },
                },
            )?;
        }
        let t0 = Instant::now();
        q.ring(nic)?;
        report(nic, cq, base + 1, t0, steps, "WRITE", spin)?;
    }
    if dst.bytes().iter().any(|&b| b != 0x5a) {
        return Err("the WRITEs did not copy the source region".into());
    }
    Ok(())
}
