//! Waiting for the softnic: how a host polls, when it gives up, and what it reports then.

use crate::Ctx;
use redn_program::wqe::Opcode;
use redn_sys::nic::Nic;
use redn_sys::softnic::SoftNic;
use redn_sys::{Cqn, Qpn};
use std::time::{Duration, Instant};

/// How long the host waits for the softnic before it calls it a hang.
pub const WAIT_TIMEOUT: Duration = Duration::from_secs(2);
/// A busy-polling host yields its CPU after this long: if the PU it waits for was scheduled
/// on the same core (other processes running), the PU only runs once the host yields.
pub const SPIN_BEFORE_YIELD: Duration = Duration::from_micros(20);

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
    pub fn pause(&mut self, mode: WaitMode) -> Result<(), TimedOut> {
        self.spins = self.spins.wrapping_add(1);
        if mode != WaitMode::Spin {
            if self.waited() > WAIT_TIMEOUT {
                return Err(TimedOut);
            }
            if mode == WaitMode::Sleep {
                std::thread::sleep(Duration::from_micros(20));
            } else {
                std::thread::yield_now();
            }
        } else if self.spins % self.check_every == 0 {
            let waited = self.waited();
            if waited > WAIT_TIMEOUT {
                return Err(TimedOut);
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

/// A host waited longer than WAIT_TIMEOUT.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TimedOut;

/// What to say when `cq` produced only `p` of the `target` completions a host waited for.
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
        backoff
            .pause(mode)
            .map_err(|TimedOut| timed_out(cq, p, target))?;
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
