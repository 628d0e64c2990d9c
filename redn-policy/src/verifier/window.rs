//! Index windows: every WAIT, SEND_EN, RECV_EN and entry count stays within half the index
//! range the hardware compares it in.
//!
//! A ConnectX compares SEND_EN and RECV_EN targets with the queue's index modulo 2^16 and
//! WAIT targets with the CQ's count modulo 2^24 (DPDK's `MLX5_WQ_INDEX_WIDTH` and
//! `MLX5_CQ_INDEX_WIDTH`), reading a target as at most half the range ahead or behind; the
//! softnic does the same. So an enable that would move its queue 2^15 BBs or more is read as
//! behind and does nothing, and a stale one that lags 2^15 or more is read as ahead and runs
//! WQEs nobody enabled; a WAIT 2^23 or more ahead of its CQ passes at once.
//!
//! - **Static counts**: every index starts at 0 at install and only moves to a count the
//!   program names, so counts below half the range keep every move and every lag inside
//!   the window, whatever order the enables run in. The verifier does not order enables,
//!   so it asks that of every count (a staged chain past 2^15 BBs would need that order).
//! - **Recycled counts** (a count a READ of a counter or a FETCH_ADD's old value lands in,
//!   as `Builder::advance_count` does): each round every WQE runs once, so the count moves
//!   by the sum of the FETCH_ADDs on its counter. That step must be below half the range,
//!   every recycled count of one queue (or CQ) must move by the same step (different steps
//!   drift apart until one target aliases), and an enable of such a queue may not have a
//!   static count (the queue passes it for good and, 2^16 BBs on, it aliases ahead). Its
//!   counter must start below half the range, as a static count must (the first target it
//!   lands is that value; later ones move with the queue). A count whose step cannot be
//!   read off the program (a counter something else also writes, a count patched from a
//!   trigger, a READ or FETCH_ADD landing it or adding to its counter that something may
//!   patch) is refused.
//!
//! `Checker::index_windows` turns each of [`check`]'s refusals into an `index-window`
//! finding.

use super::checker::Checker;
use super::{Rule, WAIT_PI_BYTE};
use redn_program::program::{Addr, Iterations, Op, PatchSource, Program};
use std::collections::BTreeMap;

/// Targets SEND_EN and RECV_EN may move a queue by, exclusive: 2^15 (the window of a 16-bit
/// index, `MLX5_WQ_INDEX_WIDTH`).
pub(super) const WQ_WINDOW: u64 = 1 << 15;
/// Completions a WAIT target may lie ahead of its CQ, exclusive: 2^23 (the window of a
/// 24-bit index, `MLX5_CQ_INDEX_WIDTH`).
pub(super) const CQ_WINDOW: u64 = 1 << 23;

/// A WQE's ring index and label, or `None` for an entry.
type At = Option<(u64, String)>;

/// One refusal: the queue it is about, where ([`At`]), the field, and what is wrong.
struct Refusal {
    pub(super) queue: String,
    pub(super) wqe: At,
    pub(super) field: &'static str,
    pub(super) detail: String,
}

/// What a count counts in: the index it is compared with.
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Kind {
    Send,
    Recv,
    Cq,
}

impl Kind {
    fn window(self) -> u64 {
        match self {
            Kind::Send | Kind::Recv => WQ_WINDOW,
            Kind::Cq => CQ_WINDOW,
        }
    }

    /// The index the count is compared with, for messages.
    fn what(self, queue: &str) -> String {
        match self {
            Kind::Send => format!("the send index of {queue:?} (compared modulo 2^16)"),
            Kind::Recv => format!("the receive index of {queue:?} (compared modulo 2^16)"),
            Kind::Cq => format!("the completion count of {queue:?}'s CQ (compared modulo 2^24)"),
        }
    }

    fn unit(self) -> &'static str {
        match self {
            Kind::Send => "BBs",
            Kind::Recv => "receives",
            Kind::Cq => "completions",
        }
    }
}

/// Every refusal of `p` (see the module comment). `wait_pi_byte`: where the 4-byte count
/// sits in a WAIT, SEND_EN or RECV_EN.
fn check(p: &Program, wait_pi_byte: u32) -> Vec<Refusal> {
    let recycled = matches!(p.iterations, Iterations::Recycled { .. });
    let (lo, hi) = (wait_pi_byte, wait_pi_byte + 4);
    let mut out = Vec::new();
    let static_count = |kind: Kind, queue: &str, count: u32| {
        let window = kind.window();
        (u64::from(count) >= window).then(|| {
            format!(
                "count {count} is {window} {} or more past 0, where {} starts: the hardware \
                 would read it as behind, or a stale one as ahead",
                kind.unit(),
                kind.what(queue)
            )
        })
    };
    for (kind, entries, field) in [
        (Kind::Send, &p.entry, "entry"),
        (Kind::Recv, &p.recv_entry, "recv entry"),
    ] {
        for (name, count) in entries {
            if let Some(detail) = static_count(kind, name, *count) {
                out.push(Refusal {
                    queue: name.clone(),
                    wqe: None,
                    field,
                    detail,
                });
            }
        }
    }
    // Recycled counts by what they count: (kind, queue) -> (step, first WQE with it).
    let mut steps: BTreeMap<(Kind, &str), (u64, String)> = BTreeMap::new();
    // Static enables of each queue, checked once every recycled count is known.
    let mut statics: Vec<(Kind, &str, &str, At)> = Vec::new();
    for q in &p.queues {
        let mut pos = 0;
        for w in &q.wqes {
            let at = Some((pos, w.label.clone()));
            pos += w.op.bbs();
            let (kind, target, count) = match &w.op {
                Op::Wait { queue, count } => (Kind::Cq, queue.as_str(), *count),
                Op::SendEn { queue, count } => (Kind::Send, queue.as_str(), *count),
                Op::RecvEn { queue, count } => (Kind::Recv, queue.as_str(), *count),
                _ => continue,
            };
            let sources: Vec<&PatchSource> = p
                .patches
                .iter()
                .filter(|pp| pp.label == w.label && pp.byte < hi && lo < pp.byte + pp.len)
                .map(|pp| &pp.source)
                .collect();
            let refuse = |detail: String| Refusal {
                queue: q.name.clone(),
                wqe: at.clone(),
                field: "count",
                detail,
            };
            if sources.is_empty() {
                if let Some(detail) = static_count(kind, target, count) {
                    out.push(refuse(detail));
                } else if recycled && kind != Kind::Cq {
                    statics.push((kind, target, &q.name, at.clone()));
                }
                continue;
            }
            if !recycled {
                // A bounded program's counts must be static; `execution_bounds` says so.
                continue;
            }
            for source in sources {
                let (step, first) = match step_of(p, source) {
                    Ok(counter) => counter,
                    Err(why) => {
                        out.push(refuse(format!(
                            "{why}: the verifier cannot bound how far it moves {} a round",
                            kind.what(target)
                        )));
                        continue;
                    }
                };
                let window = kind.window();
                if step >= window {
                    out.push(refuse(format!(
                        "moves {step} {} a round, {window} or more: the hardware reads the \
                         next target as behind {}",
                        kind.unit(),
                        kind.what(target)
                    )));
                    continue;
                }
                if first >= window {
                    out.push(refuse(format!(
                        "its counter starts at {first}, {window} {} or more past 0, where {} \
                         starts: the hardware would read its first target as behind",
                        kind.unit(),
                        kind.what(target)
                    )));
                    continue;
                }
                match steps.get(&(kind, target)) {
                    None => {
                        steps.insert((kind, target), (step, w.label.clone()));
                    }
                    Some((first, label)) if *first != step => {
                        out.push(refuse(format!(
                            "moves {step} {} a round where {label:?} moves {first}: the two \
                             targets of {} drift apart until one aliases",
                            kind.unit(),
                            kind.what(target)
                        )));
                    }
                    Some(_) => {}
                }
            }
        }
    }
    for (kind, target, queue, at) in statics {
        if let Some((step, label)) = steps.get(&(kind, target)) {
            out.push(Refusal {
                queue: queue.to_string(),
                wqe: at,
                field: "count",
                detail: format!(
                    "a static count for {}, which {label:?} moves {step} {} every round: \
                     once it has moved 2^16 the count aliases ahead",
                    kind.what(target),
                    kind.unit()
                ),
            });
        }
    }
    out
}

/// How far a count patched from `source` moves each round of a recycled loop (the sum of
/// the FETCH_ADDs on the counter it comes from) and where its counter starts (its first 8
/// bytes, little-endian: the first count it lands). `Err` says why that cannot be read off.
fn step_of(p: &Program, source: &PatchSource) -> Result<(u64, u64), String> {
    // The READ or FETCH_ADD that lands the count, and every FETCH_ADD on its counter's
    // block, must run as written: a patched address, addend, scatter or result would make
    // the step, the counter or the count anything.
    let patched = |label: &str| p.patches.iter().any(|pp| pp.label == label);
    if let PatchSource::Read { label } | PatchSource::AtomicResult { label } = source {
        if patched(label) {
            return Err(format!(
                "its count comes from {label:?}, which may be patched"
            ));
        }
    }
    let counter = match source {
        PatchSource::Read { label } => match find_op(p, label) {
            Some(Op::Read { remote, .. }) => remote,
            _ => return Err(format!("its count comes from {label:?}, not a READ")),
        },
        PatchSource::AtomicResult { label } => match find_op(p, label) {
            Some(Op::Faa { remote, .. }) => remote,
            _ => {
                return Err(format!(
                    "its count is the result of {label:?}, not a FETCH_ADD"
                ))
            }
        },
        PatchSource::Trigger { param } => {
            return Err(format!("its count comes from trigger parameter {param:?}"))
        }
        PatchSource::Cas { label } | PatchSource::Write { label } => {
            return Err(format!("its count is written by {label:?}"))
        }
    };
    let Addr::Static { name, offset } = counter else {
        return Err("its count comes from outside the code region".into());
    };
    // The counter's 8 bytes: FETCH_ADDs on exactly them add up; anything else that writes
    // the block may set any value.
    let at = |a: &Addr| matches!(a, Addr::Static { name: n, .. } if n == name);
    let mut step: u64 = 0;
    for q in &p.queues {
        if q.recvs.iter().flat_map(|r| &r.sgl).any(|s| at(&s.addr)) {
            return Err(format!("counter {name:?} is also written by a receive"));
        }
        for w in &q.wqes {
            if matches!(&w.op, Op::Faa { remote, .. } if at(remote)) && patched(&w.label) {
                return Err(format!(
                    "counter {name:?} is added to by {:?}, which may be patched",
                    w.label
                ));
            }
            let other = match &w.op {
                Op::Faa { result, .. } if result.as_ref().is_some_and(|r| at(&r.addr)) => true,
                Op::Faa { remote, add, .. } => match remote {
                    Addr::Static { name: n, offset: o } if n == name && o == offset => {
                        step = step.saturating_add(*add);
                        false
                    }
                    _ => at(remote),
                },
                Op::Write { remote, .. } | Op::MaskedCas { remote, .. } => at(remote),
                Op::Read { sgl, .. } => sgl.iter().any(|s| at(&s.addr)),
                Op::Cas { remote, result, .. } => {
                    at(remote) || result.as_ref().is_some_and(|r| at(&r.addr))
                }
                _ => false,
            };
            if other {
                return Err(format!(
                    "counter {name:?} is also written by {:?}, not only added to",
                    w.label
                ));
            }
        }
    }
    let first = p
        .statics
        .iter()
        .find(|s| &s.name == name)
        .and_then(|s| s.bytes.get(usize::try_from(*offset).ok()?..)?.get(..8))
        .and_then(|b| b.try_into().ok())
        .map(u64::from_le_bytes)
        .ok_or_else(|| format!("counter {name:?} holds no 8 bytes at offset {offset}"))?;
    Ok((step, first))
}

/// The operation of WQE `label`.
fn find_op<'p>(p: &'p Program, label: &str) -> Option<&'p Op> {
    p.queues
        .iter()
        .flat_map(|q| &q.wqes)
        .find(|w| w.label == label)
        .map(|w| &w.op)
}

impl Checker<'_> {
    /// Counts within the hardware's index windows (see [`window`](self)).
    pub(super) fn index_windows(&mut self) {
        for r in check(self.p, WAIT_PI_BYTE) {
            self.find(
                Some(&r.queue),
                r.wqe.as_ref().map(|(i, l)| (*i, l.as_str())),
                r.field,
                Rule::IndexWindow,
                r.detail,
            );
        }
    }
}
