//! Execution bounds: which trigger each WQE of a bounded program runs for.
//!
//! In a bounded program every count (WAIT, SEND_EN, RECV_EN, entry) is static and no enable
//! reaches past its ring, so each WQE runs at most once and its ring index fixes when it
//! may: once the enables before it reach it, the WQE before it on its queue has run, and,
//! for a WAIT, its CQ has produced enough completions. A completion is a signaled WQE
//! having run or a receive consumed: the client-facing queue's k-th receive needs the
//! client's k-th trigger, a worker queue's k-th receive the k-th SEND or WRITE with
//! immediate its own queue runs (worker queues are connected to themselves).
//!
//! [`trigger_times`] computes, for every WQE, the least number of triggers after which it
//! runs (0: at install, with no trigger at all; `None`: never), as a fixpoint from "never"
//! down. The WQEs that run for one trigger are those whose time is that trigger; the
//! verifier bounds the worst trigger, not the average.
//!
//! The times assume no queue fails. A queue that fails flushes what it holds, and each
//! flush is a completion a WAIT counts, so chains of later triggers may then run early:
//! one trigger may run up to the whole program. Even then no WQE of a bounded program runs
//! twice (its counts are static and stay inside its rings), so the program's WQE count
//! bounds any run with failures, and the soundness test checks exactly that. Telling the
//! client's failures apart from the work it paid for is the manager's auditor's job.
//!
//! The checker's bounds passes live here too: `Checker::sizes_and_budget` (rings, code
//! bytes and the declared WQE counts against the policy, before anything is allocated) and
//! `Checker::execution_bounds` (static counts inside their rings, then the worst trigger,
//! the install and the responses per trigger, from [`trigger_times`]).

use super::checker::Checker;
use super::{overlap, source_name, Rule, WAIT_PI_BYTE};
use redn_program::program::{Iterations, Op, Program, QueueRole};
use std::cmp::Reverse;
use std::collections::{BTreeMap, BinaryHeap};

/// "Never": a time no trigger count reaches.
const NEVER: u64 = u64::MAX;

/// Each WQE's trigger time, by queue and WQE index (`None`: it never runs), or `Err` with
/// the passes made if the fixpoint did not settle (the program is refused as unbounded).
fn trigger_times(p: &Program) -> Result<Vec<Vec<Option<u64>>>, usize> {
    // Each pass can only lower times, and a time is a trigger count no larger than the
    // client's receives, so passes are bounded; a cap guards against a mistake here.
    trigger_times_within(p, 4 * (p.wqe_count() + p.queues.len()) + 8)
}

/// [`trigger_times`] in at most `max_passes` passes over the program.
fn trigger_times_within(p: &Program, max_passes: usize) -> Result<Vec<Vec<Option<u64>>>, usize> {
    let n = p.queues.len();
    let by_name: std::collections::HashMap<&str, usize> = p
        .queues
        .iter()
        .enumerate()
        .map(|(i, q)| (q.name.as_str(), i))
        .collect();
    let index = |name: &str| by_name.get(name).copied();
    let mut wqe_t: Vec<Vec<u64>> = p.queues.iter().map(|q| vec![NEVER; q.wqes.len()]).collect();
    for pass in 0..max_passes {
        // Enables, by target queue: (count, time) from the entry and from SEND_EN/RECV_EN.
        let mut send_en: Vec<Vec<(u64, u64)>> = vec![Vec::new(); n];
        let mut recv_en: Vec<Vec<(u64, u64)>> = vec![Vec::new(); n];
        for (name, count) in &p.entry {
            if let Some(q) = index(name) {
                send_en[q].push((u64::from(*count), 0));
            }
        }
        for (name, count) in &p.recv_entry {
            if let Some(q) = index(name) {
                recv_en[q].push((u64::from(*count), 0));
            }
        }
        for (qi, q) in p.queues.iter().enumerate() {
            for (w, &t) in q.wqes.iter().zip(&wqe_t[qi]) {
                match &w.op {
                    Op::SendEn { queue, count } => {
                        if let Some(target) = index(queue) {
                            send_en[target].push((u64::from(*count), t));
                        }
                    }
                    Op::RecvEn { queue, count } => {
                        if let Some(target) = index(queue) {
                            recv_en[target].push((u64::from(*count), t));
                        }
                    }
                    _ => {}
                }
            }
        }
        let send_en: Vec<Reach> = send_en.into_iter().map(Reach::new).collect();
        let recv_en: Vec<Reach> = recv_en.into_iter().map(Reach::new).collect();
        let enabled_at = |reach: &Reach, at: u64| reach.earliest_past(at);
        // Completions, by queue: its receives and its signaled WQEs, as the last pass left
        // them. A queue's own enables and completions are also followed as its scan finds
        // them (below), so that a chain of links on one queue settles in one pass rather
        // than a pass per link.
        let mut events: Vec<Vec<u64>> = vec![Vec::new(); n];
        let mut receives: Vec<Vec<u64>> = vec![Vec::new(); n];
        for (qi, q) in p.queues.iter().enumerate() {
            let consumers: Vec<u64> = q
                .wqes
                .iter()
                .zip(&wqe_t[qi])
                .filter(|(w, _)| consumes_receive(&w.op))
                .map(|(_, t)| *t)
                .collect();
            for k in 0..q.recvs.len() {
                let arrives = match q.role {
                    QueueRole::Client => k as u64 + 1,
                    QueueRole::Worker => consumers.get(k).copied().unwrap_or(NEVER),
                };
                let enabled = if q.managed_recv {
                    enabled_at(&recv_en[qi], k as u64)
                } else {
                    0
                };
                events[qi].push(arrives.max(enabled));
            }
            receives[qi] = events[qi].clone();
            receives[qi].sort_unstable();
            for (w, t) in q.wqes.iter().zip(&wqe_t[qi]) {
                if w.flags.signaled() {
                    events[qi].push(*t);
                }
            }
            events[qi].sort_unstable();
        }
        let mut changed = false;
        for (qi, q) in p.queues.iter().enumerate() {
            let mut prev = 0u64;
            let mut bb = 0u64;
            // The queue's own SEND_ENs met so far in this scan, as (time, count), earliest
            // first; one whose count the scan has passed can never enable anything again.
            let mut own_enables: BinaryHeap<Reverse<(u64, u64)>> = BinaryHeap::new();
            // The times of the queue's signaled WQEs met so far: in ring order, and so in
            // time order (a queue runs in order).
            let mut own_completions: Vec<u64> = Vec::new();
            for (wi, w) in q.wqes.iter().enumerate() {
                // Unmanaged queues run what the entry doorbell reaches, managed ones what
                // an enable reaches.
                while own_enables
                    .peek()
                    .is_some_and(|Reverse((_, count))| *count <= bb)
                {
                    own_enables.pop();
                }
                let own = own_enables.peek().map_or(NEVER, |Reverse((t, _))| *t);
                let enabled = enabled_at(&send_en[qi], bb).min(own);
                let gate = match &w.op {
                    // On its own CQ: the receives, and the WQEs before it (a WAIT for a
                    // later WQE's completion waits for ever).
                    Op::Wait { queue, count } if index(queue) == Some(qi) => {
                        nth_of_merged(&receives[qi], &own_completions, *count as usize)
                    }
                    Op::Wait { queue, count } => index(queue)
                        .and_then(|x| events[x].get(*count as usize).copied())
                        .unwrap_or(NEVER),
                    _ => 0,
                };
                let t = prev.max(enabled).max(gate);
                if t < wqe_t[qi][wi] {
                    wqe_t[qi][wi] = t;
                    changed = true;
                }
                let t = wqe_t[qi][wi];
                if let Op::SendEn { queue, count } = &w.op {
                    if index(queue) == Some(qi) && t != NEVER {
                        own_enables.push(Reverse((t, u64::from(*count))));
                    }
                }
                if w.flags.signaled() {
                    own_completions.push(t);
                }
                prev = t;
                bb += w.op.bbs();
            }
        }
        if !changed {
            return Ok(wqe_t
                .into_iter()
                .map(|q| q.into_iter().map(|t| (t != NEVER).then_some(t)).collect())
                .collect());
        }
        if pass + 1 == max_passes {
            return Err(max_passes);
        }
    }
    Err(max_passes)
}

/// The `n`-th smallest (from 0) of two sorted lists together; `NEVER` if they hold no more
/// than `n` values.
fn nth_of_merged(a: &[u64], b: &[u64], n: usize) -> u64 {
    let (mut i, mut j) = (0, 0);
    for _ in 0..n {
        match (a.get(i), b.get(j)) {
            (Some(x), Some(y)) if x <= y => i += 1,
            (Some(_), Some(_)) | (None, Some(_)) => j += 1,
            (Some(_), None) => i += 1,
            (None, None) => return NEVER,
        }
    }
    match (a.get(i), b.get(j)) {
        (Some(x), Some(y)) => *x.min(y),
        (Some(x), None) | (None, Some(x)) => *x,
        (None, None) => NEVER,
    }
}

/// The enables of one queue, for "when is index `at` first enabled": sorted by count, with
/// the earliest time of every enable at or after each position (so a query is a binary
/// search, not a scan: a 4,096-WQE program has a thousand enables).
struct Reach {
    counts: Vec<u64>,
    earliest_from: Vec<u64>,
}

impl Reach {
    fn new(mut enables: Vec<(u64, u64)>) -> Reach {
        enables.sort_unstable();
        let counts = enables.iter().map(|(c, _)| *c).collect();
        let mut earliest_from = vec![NEVER; enables.len()];
        let mut best = NEVER;
        for (i, (_, t)) in enables.iter().enumerate().rev() {
            best = best.min(*t);
            earliest_from[i] = best;
        }
        Reach {
            counts,
            earliest_from,
        }
    }

    /// The earliest time an enable with a count past `at` runs (`NEVER` if none does).
    fn earliest_past(&self, at: u64) -> u64 {
        let first = self.counts.partition_point(|c| *c <= at);
        self.earliest_from.get(first).copied().unwrap_or(NEVER)
    }
}

/// True if the WQE consumes a receive at its peer (on a worker queue, its own).
fn consumes_receive(op: &Op) -> bool {
    matches!(op, Op::Write { imm: Some(_), .. })
}

/// True if the WQE sends something to its peer (on the client-facing queue: a response).
fn responds(op: &Op) -> bool {
    matches!(op, Op::Write { .. })
}

impl Checker<'_> {
    pub(super) fn sizes_and_budget(&mut self) {
        let p = self.p;
        for q in &p.queues {
            if q.sq_bbs > self.g.max_ring_bbs {
                self.find(
                    Some(&q.name),
                    None,
                    "ring",
                    Rule::Size,
                    format!("{} BBs, the limit is {}", q.sq_bbs, self.g.max_ring_bbs),
                );
            }
            if q.rq_slots > self.g.max_rq_slots {
                self.find(
                    Some(&q.name),
                    None,
                    "receive ring",
                    Rule::Size,
                    format!("{} slots, the limit is {}", q.rq_slots, self.g.max_rq_slots),
                );
            }
        }
        match p.code_bytes() {
            Some(n) if n <= self.g.max_code_bytes => {}
            n => self.find(
                None,
                None,
                "code region",
                Rule::Size,
                format!(
                    "rings, receive rings and static blocks need {} bytes, the limit is {}",
                    n.map_or("over 2^64".to_string(), |n| n.to_string()),
                    self.g.max_code_bytes
                ),
            ),
        }
        let total: u64 = p.queues.iter().map(|q| q.wqes.len() as u64).sum();
        match p.iterations {
            Iterations::Bounded {
                invocations,
                wqes_per_invocation,
            } => {
                let per = total.div_ceil(u64::from(invocations.max(1)));
                if per > u64::from(wqes_per_invocation) {
                    self.find(None, None, "iterations", Rule::WqeBudget, format!("declares {wqes_per_invocation} WQEs per invocation but holds {total} for {invocations} invocations"));
                }
                if wqes_per_invocation > self.g.max_wqes_per_invocation {
                    self.find(
                        None,
                        None,
                        "iterations",
                        Rule::WqeBudget,
                        format!(
                            "{wqes_per_invocation} WQEs per invocation, the limit is {}",
                            self.g.max_wqes_per_invocation
                        ),
                    );
                }
            }
            Iterations::Recycled { wqes_per_round } => {
                if self.g.loop_budget.is_none() {
                    self.find(None, None, "iterations", Rule::UnboundedLoop, format!("recycled loop ({wqes_per_round} WQEs a round) but the policy gives no loop budget"));
                }
                if u64::from(wqes_per_round) < total {
                    self.find(
                        None,
                        None,
                        "iterations",
                        Rule::WqeBudget,
                        format!("declares {wqes_per_round} WQEs per round but holds {total}"),
                    );
                }
            }
        }
    }

    /// Execution bounds (see [`bounds`](self)): a bounded program's counts are static and
    /// reach no further than their rings, and the worst trigger (and the install, with no
    /// trigger) runs no more WQEs than the policy allows and sends no more responses.
    pub(super) fn execution_bounds(&mut self) {
        let p = self.p;
        let Iterations::Bounded {
            wqes_per_invocation,
            ..
        } = p.iterations
        else {
            // A recycled loop runs for ever by design; its budget is the auditor's.
            return;
        };
        let loop_hint = "a loop: declare the program recycled, with a loop budget";
        let mut loops = Vec::new();
        for pp in &p.patches {
            let Some((qi, pos, w)) = self.idx.wqe(&pp.label) else {
                continue;
            };
            if matches!(
                w.op,
                Op::Wait { .. } | Op::SendEn { .. } | Op::RecvEn { .. }
            ) && overlap(
                (pp.byte, pp.byte.saturating_add(pp.len)),
                (WAIT_PI_BYTE - 4, WAIT_PI_BYTE + 4),
            ) {
                loops.push((
                    p.queues[qi].name.clone(),
                    Some((pos, pp.label.clone())),
                    "count".to_string(),
                    format!(
                        "{} may change this count at run time: {loop_hint}",
                        source_name(&pp.source)
                    ),
                ));
            }
        }
        let ring = |name: &str, recv: bool| {
            p.queues.iter().find(|q| q.name == name).map(|q| {
                if recv {
                    u64::from(q.rq_slots)
                } else {
                    u64::from(q.sq_bbs)
                }
            })
        };
        let mut past_ring = |queue: &str, at: Option<(u64, String)>, count: u32, recv: bool| {
            if let Some(size) = ring(queue, recv).filter(|s| u64::from(count) > *s) {
                loops.push((
                    queue.to_string(),
                    at,
                    "count".into(),
                    format!(
                        "enables {} {count} of {queue:?}, whose ring holds {size}: it would run \
                         its ring again, {loop_hint}",
                        if recv { "receive" } else { "index" }
                    ),
                ));
            }
        };
        for (name, count) in &p.entry {
            past_ring(name, None, *count, false);
        }
        for (name, count) in &p.recv_entry {
            past_ring(name, None, *count, true);
        }
        for q in &p.queues {
            let mut pos = 0;
            for w in &q.wqes {
                match &w.op {
                    Op::SendEn { queue, count } => {
                        past_ring(queue, Some((pos, w.label.clone())), *count, false);
                    }
                    Op::RecvEn { queue, count } => {
                        past_ring(queue, Some((pos, w.label.clone())), *count, true);
                    }
                    _ => {}
                }
                pos += w.op.bbs();
            }
        }
        let static_counts = loops.is_empty();
        for (qn, at, field, detail) in loops {
            self.find(
                Some(&qn),
                at.as_ref().map(|(i, l)| (*i, l.as_str())),
                &field,
                Rule::UnboundedLoop,
                detail,
            );
        }
        if !static_counts {
            // Times are meaningless where counts may change.
            return;
        }
        let times = match trigger_times(p) {
            Ok(t) => t,
            Err(passes) => {
                self.find(
                    None,
                    None,
                    "iterations",
                    Rule::WqeBudget,
                    format!("which trigger runs each WQE did not settle in {passes} passes"),
                );
                return;
            }
        };
        let mut wqes: BTreeMap<u64, u64> = BTreeMap::new();
        let mut responses: BTreeMap<u64, u64> = BTreeMap::new();
        for (q, ts) in p.queues.iter().zip(&times) {
            for (w, t) in q.wqes.iter().zip(ts) {
                let Some(t) = t else { continue };
                *wqes.entry(*t).or_default() += 1;
                if q.role == QueueRole::Client && responds(&w.op) {
                    *responses.entry(*t).or_default() += 1;
                }
            }
        }
        let install = wqes.get(&0).copied().unwrap_or(0);
        let limit = u64::from(self.g.max_wqes_per_invocation);
        if install > limit {
            self.find(
                None,
                None,
                "iterations",
                Rule::WqeBudget,
                format!("{install} WQEs run at install, with no trigger; the limit is {limit}"),
            );
        }
        let worst = wqes
            .iter()
            .filter(|(t, _)| **t > 0)
            .max_by_key(|(_, n)| **n);
        if let Some((&t, &n)) = worst {
            if n > u64::from(wqes_per_invocation) {
                self.find(
                    None,
                    None,
                    "iterations",
                    Rule::WqeBudget,
                    format!(
                        "declares {wqes_per_invocation} WQEs per invocation, but trigger {t} \
                         runs {n}"
                    ),
                );
            }
            if n > limit {
                self.find(
                    None,
                    None,
                    "iterations",
                    Rule::WqeBudget,
                    format!("trigger {t} runs {n} WQEs; the limit is {limit}"),
                );
            }
        }
        let max_responses = u64::from(self.g.max_responses_per_trigger);
        if let Some((&t, &n)) = responses.iter().max_by_key(|(_, n)| **n) {
            if n > max_responses {
                self.find(
                    None,
                    None,
                    "responses",
                    Rule::WqeBudget,
                    format!(
                        "{} sends {n} responses; the limit is {max_responses}",
                        if t == 0 {
                            "the install".to_string()
                        } else {
                            format!("trigger {t}")
                        }
                    ),
                );
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use redn_program::program::catalog::{self, HashVariant};
    use redn_program::program::{Addr, Form, Iterations, Queue, Recv, Wqe};
    use redn_program::wqe::WqeFlags;

    fn wqe(label: &str, op: Op, signaled: bool) -> Wqe {
        Wqe {
            label: label.into(),
            op,
            flags: if signaled {
                WqeFlags::SIGNALED
            } else {
                WqeFlags::NONE
            },
            form: Form::Active,
        }
    }

    fn wait(queue: &str, count: u32) -> Op {
        Op::Wait {
            queue: queue.into(),
            count,
        }
    }

    fn send_en(queue: &str, count: u32) -> Op {
        Op::SendEn {
            queue: queue.into(),
            count,
        }
    }

    fn write_imm() -> Op {
        Op::Write {
            remote: Addr::region("r", 0),
            sgl: Vec::new(),
            imm: Some(1),
        }
    }

    fn queue(
        name: &str,
        role: QueueRole,
        managed: (bool, bool),
        wqes: Vec<Wqe>,
        recvs: usize,
    ) -> Queue {
        Queue {
            name: name.into(),
            role,
            managed_send: managed.0,
            managed_recv: managed.1,
            pu: None,
            sq_bbs: 64,
            rq_slots: 16,
            rq_sges: 1,
            wqes,
            recvs: (0..recvs).map(|_| Recv { sgl: Vec::new() }).collect(),
        }
    }

    fn program(queues: Vec<Queue>, entry: &[(&str, u32)], recv_entry: &[(&str, u32)]) -> Program {
        let mut p = catalog::echo(16, 1).unwrap();
        p.queues = queues;
        p.entry = entry.iter().map(|(q, n)| ((*q).into(), *n)).collect();
        p.recv_entry = recv_entry.iter().map(|(q, n)| ((*q).into(), *n)).collect();
        p.patches.clear();
        p.iterations = Iterations::bounded(2, 64);
        p
    }

    /// The client-facing queue `c` with `n` receives and no WQEs: its k-th receive
    /// completes with trigger k + 1.
    fn client(n: usize) -> Queue {
        queue("c", QueueRole::Client, (false, false), Vec::new(), n)
    }

    #[test]
    fn nth_of_merged_takes_the_nth_smallest_of_both_lists() {
        let (a, b) = ([1, 4, 6], [2, 3, 9]);
        let got: Vec<u64> = (0..7).map(|n| nth_of_merged(&a, &b, n)).collect();
        assert_eq!(got, [1, 2, 3, 4, 6, 9, NEVER]);
        assert_eq!(nth_of_merged(&[5], &[], 0), 5);
        assert_eq!(nth_of_merged(&[], &[5], 0), 5);
        assert_eq!(nth_of_merged(&[], &[5, 7], 1), 7);
        assert_eq!(nth_of_merged(&[2, 2], &[2], 2), 2);
        assert_eq!(nth_of_merged(&[], &[], 0), NEVER);
    }

    #[test]
    fn only_writes_respond_and_only_writes_with_immediate_consume_a_receive() {
        let write = Op::Write {
            remote: Addr::region("r", 0),
            sgl: Vec::new(),
            imm: None,
        };
        assert!(responds(&write) && responds(&write_imm()));
        assert!(!responds(&Op::Nop) && !responds(&wait("c", 0)));
        assert!(consumes_receive(&write_imm()));
        assert!(!consumes_receive(&write) && !consumes_receive(&Op::Nop));
    }

    #[test]
    fn a_queue_runs_only_as_far_as_its_own_enables_reach() {
        // Managed queue m, entry enables 2 blocks; its first WQE enables 4 blocks of m
        // itself. The WAIT at block 2 runs on trigger 1; blocks 3 and 4 follow it, block 4
        // is past every enable and never runs.
        let m = queue(
            "m",
            QueueRole::Worker,
            (true, false),
            vec![
                wqe("m0", send_en("m", 4), false),
                wqe("m1", Op::Nop, false),
                wqe("m2", wait("c", 0), false),
                wqe("m3", Op::Nop, false),
                wqe("m4", Op::Nop, false),
            ],
            0,
        );
        let p = program(vec![client(1), m], &[("m", 2)], &[]);
        let t = trigger_times(&p).unwrap();
        assert_eq!(t[1], [Some(0), Some(0), Some(1), Some(1), None]);
    }

    #[test]
    fn an_enable_of_another_queue_does_not_enable_its_own() {
        // a's SEND_EN reaches queue b only: a's second WQE is past a's entry and never runs;
        // b's first two blocks run at install.
        let a = queue(
            "a",
            QueueRole::Worker,
            (true, false),
            vec![wqe("a0", send_en("b", 2), false), wqe("a1", Op::Nop, false)],
            0,
        );
        let b = queue(
            "b",
            QueueRole::Worker,
            (true, false),
            vec![
                wqe("b0", Op::Nop, false),
                wqe("b1", Op::Nop, false),
                wqe("b2", Op::Nop, false),
            ],
            0,
        );
        let p = program(vec![client(1), a, b], &[("a", 1)], &[]);
        let t = trigger_times(&p).unwrap();
        assert_eq!(t[1], [Some(0), None]);
        assert_eq!(t[2], [Some(0), Some(0), None]);
    }

    #[test]
    fn a_worker_receive_completes_when_a_write_with_immediate_arrives_and_is_enabled() {
        // Worker w (managed receives, entry enables none) writes to itself with immediate
        // twice at install; its receives are enabled by c's RECV_ENs on triggers 1 and 2.
        // Queue x waits for each receive's completion on w's CQ.
        let c = queue(
            "c",
            QueueRole::Client,
            (false, false),
            vec![
                wqe("c0", wait("c", 0), false),
                wqe(
                    "c1",
                    Op::RecvEn {
                        queue: "w".into(),
                        count: 1,
                    },
                    false,
                ),
                wqe("c2", wait("c", 1), false),
                wqe(
                    "c3",
                    Op::RecvEn {
                        queue: "w".into(),
                        count: 2,
                    },
                    false,
                ),
            ],
            2,
        );
        let w = queue(
            "w",
            QueueRole::Worker,
            (false, true),
            vec![wqe("w0", write_imm(), false), wqe("w1", write_imm(), false)],
            2,
        );
        let x = queue(
            "x",
            QueueRole::Worker,
            (false, false),
            vec![
                wqe("x0", wait("w", 0), false),
                wqe("x1", wait("w", 1), false),
            ],
            0,
        );
        let p = program(vec![c, w, x], &[("c", 8), ("w", 8), ("x", 8)], &[]);
        let t = trigger_times(&p).unwrap();
        assert_eq!(t[0], [Some(1), Some(1), Some(2), Some(2)]);
        assert_eq!(t[1], [Some(0), Some(0)]);
        assert_eq!(t[2], [Some(1), Some(2)]);
    }

    #[test]
    fn a_chain_on_one_queue_settles_in_one_pass_and_a_confirming_one() {
        // Forty links of self-enables (each SEND_EN reaches one block further) and forty of
        // WAITs on the queue's own completions: followed as the scan meets them, so two
        // passes settle them (the second finds nothing to lower). Without that, each link
        // would take a pass of its own.
        let mut wqes = Vec::new();
        for k in 0..40u32 {
            wqes.push(wqe(&format!("e{k}"), send_en("m", k + 2), false));
        }
        for k in 0..40u32 {
            wqes.push(wqe(&format!("n{k}"), Op::Nop, true));
            wqes.push(wqe(&format!("w{k}"), wait("m", k), false));
        }
        let m = queue("m", QueueRole::Worker, (true, false), wqes, 0);
        let p = program(vec![client(1), m], &[("m", 1)], &[]);
        let t = trigger_times_within(&p, 2).unwrap();
        // Forty enables reach 41 blocks: the enables and the first NOP; the rest wait for an
        // enable that never comes.
        assert!(t[1][..41].iter().all(|t| *t == Some(0)), "{:?}", t[1]);
        assert!(t[1][41..].iter().all(Option::is_none), "{:?}", t[1]);
        let mut p = p;
        p.entry = vec![("m".into(), 200)];
        let t = trigger_times_within(&p, 2).unwrap();
        assert!(t[1].iter().all(|t| *t == Some(0)), "{:?}", t[1]);
    }

    #[test]
    fn the_pass_cap_lets_a_chain_across_queues_settle() {
        // Queues a and b wait on each other's completions in turn, 30 times: each hop to the
        // other queue takes a pass, and the default cap must allow them all.
        let hops = 30u32;
        let mut a = Vec::new();
        let mut b = Vec::new();
        for k in 0..hops {
            a.push(wqe(&format!("a{k}"), wait("b", k), true));
            b.push(wqe(&format!("b{k}"), wait("a", k), true));
        }
        b.insert(0, wqe("start", wait("c", 0), true));
        let a = queue("a", QueueRole::Worker, (false, false), a, 0);
        let b = queue("b", QueueRole::Worker, (false, false), b, 0);
        let p = program(vec![client(1), a, b], &[("a", 64), ("b", 64)], &[]);
        assert!(trigger_times_within(&p, 8).is_err(), "settled in 8 passes");
        let t = trigger_times(&p).unwrap();
        assert!(t[1].iter().chain(&t[2]).all(|t| *t == Some(1)), "{t:?}");
    }

    #[test]
    fn a_worker_receive_waits_for_the_write_with_immediate_that_fills_it() {
        // w reaches its WRITE with immediate only after trigger 1; the NOP before it does not
        // fill the receive, so x's WAIT on w's first completion runs on trigger 1, not at
        // install.
        let w = queue(
            "w",
            QueueRole::Worker,
            (false, false),
            vec![
                wqe("w0", Op::Nop, false),
                wqe("w1", wait("c", 0), false),
                wqe("w2", write_imm(), false),
            ],
            1,
        );
        let x = queue(
            "x",
            QueueRole::Worker,
            (false, false),
            vec![wqe("x0", wait("w", 0), false)],
            0,
        );
        let p = program(vec![client(1), w, x], &[("w", 8), ("x", 8)], &[]);
        let t = trigger_times(&p).unwrap();
        assert_eq!(t[1], [Some(0), Some(1), Some(1)]);
        assert_eq!(t[2], [Some(1)]);
    }

    /// WQEs per trigger time.
    fn per_trigger(p: &Program) -> Vec<usize> {
        let times = trigger_times(p).unwrap();
        let mut out = Vec::new();
        for t in times.iter().flatten() {
            let t = usize::try_from(t.expect("every catalog WQE runs")).unwrap();
            if out.len() <= t {
                out.resize(t + 1, 0);
            }
            out[t] += 1;
        }
        out
    }

    #[test]
    fn each_hash_get_trigger_runs_its_own_chain() {
        let p = catalog::hash_get(HashVariant::Single, 4).unwrap();
        let per = per_trigger(&p);
        // The first WAIT of each invocation's chain is reached at install and blocks: it
        // counts for the install; the rest of each chain for its trigger.
        assert_eq!(per.len(), 5, "{per:?}");
        assert!(per[1..].iter().all(|n| *n == per[1]), "{per:?}");
        assert_eq!(per.iter().sum::<usize>(), p.wqe_count());
    }
}
