//! Structure: every entry, WAIT, SEND_EN and RECV_EN names a queue of the program (no queue
//! or CQ it does not own), enables only managed queues, the queue count is within the
//! limit, and every WQE can be enabled. Reachability takes each queue's furthest static
//! enable; a queue whose SEND_EN count a READ or FETCH_ADD result patches (a recycled
//! loop) is reached wherever it goes.

use super::checker::Checker;
use super::{Rule, WAIT_PI_BYTE};
use redn_program::program::{Op, PatchSource};
use std::collections::HashMap;

impl<'a> Checker<'a> {
    fn queue_exists(&self, name: &str) -> Option<&'a redn_program::program::Queue> {
        self.p.queues.iter().find(|q| q.name == name)
    }

    pub(super) fn structure(&mut self) {
        let p = self.p;
        if p.queues.len() > self.g.max_queues {
            self.find(
                None,
                None,
                "queues",
                Rule::Size,
                format!(
                    "{} queues, the limit is {}",
                    p.queues.len(),
                    self.g.max_queues
                ),
            );
        }
        let mut reach: HashMap<&str, u64> = HashMap::new();
        let mut recycled: Vec<&str> = Vec::new();
        for (name, count) in &p.entry {
            match self.queue_exists(name) {
                None => self.find(
                    Some(name),
                    None,
                    "entry",
                    Rule::UnknownName,
                    format!("entry enables unknown queue {name:?}"),
                ),
                Some(_) => {
                    let e = reach.entry(name).or_default();
                    *e = (*e).max(u64::from(*count));
                }
            }
        }
        for (name, _) in &p.recv_entry {
            match self.queue_exists(name) {
                None => self.find(
                    Some(name),
                    None,
                    "recv entry",
                    Rule::UnknownName,
                    format!("entry enables receives of unknown queue {name:?}"),
                ),
                Some(q) if !q.managed_recv => self.find(
                    Some(name),
                    None,
                    "recv entry",
                    Rule::EnableUnmanaged,
                    "receive queue is not managed".into(),
                ),
                Some(_) => {}
            }
        }
        let patched_counts: Vec<&str> = p
            .patches
            .iter()
            .filter(|pp| {
                // A recycled loop's counts: a FETCH_ADD's big-endian old value, or a READ of a
                // counter (the byte-reversing READ of `Builder::advance_count`).
                matches!(
                    pp.source,
                    PatchSource::AtomicResult { .. } | PatchSource::Read { .. }
                ) && pp.byte <= WAIT_PI_BYTE
                    && u64::from(pp.byte) + u64::from(pp.len) > u64::from(WAIT_PI_BYTE)
            })
            .map(|pp| pp.label.as_str())
            .collect();
        for q in &p.queues {
            let mut pos = 0;
            for w in &q.wqes {
                let here = Some((pos, w.label.as_str()));
                match &w.op {
                    Op::Wait { queue, .. } if self.queue_exists(queue).is_none() => {
                        self.find(
                            Some(&q.name),
                            here,
                            "wait.cq",
                            Rule::UnknownName,
                            format!("WAIT on the CQ of {queue:?}, which this offload does not own"),
                        );
                    }
                    Op::SendEn { queue, count } | Op::RecvEn { queue, count } => {
                        let recv = matches!(w.op, Op::RecvEn { .. });
                        match self.queue_exists(queue) {
                            None => self.find(
                                Some(&q.name),
                                here,
                                "enable.queue",
                                Rule::UnknownName,
                                format!("enables {queue:?}, which this offload does not own"),
                            ),
                            Some(t) if !recv && !t.managed_send => self.find(
                                Some(&q.name),
                                here,
                                "enable.queue",
                                Rule::EnableUnmanaged,
                                format!("SEND_EN of {queue:?}, whose send queue is not managed"),
                            ),
                            Some(t) if recv && !t.managed_recv => self.find(
                                Some(&q.name),
                                here,
                                "enable.queue",
                                Rule::EnableUnmanaged,
                                format!("RECV_EN of {queue:?}, whose receive queue is not managed"),
                            ),
                            Some(t) if !recv => {
                                if patched_counts.contains(&w.label.as_str()) {
                                    recycled.push(t.name.as_str());
                                }
                                let e = reach.entry(t.name.as_str()).or_default();
                                *e = (*e).max(u64::from(*count));
                            }
                            Some(_) => {}
                        }
                    }
                    _ => {}
                }
                pos += w.op.bbs();
            }
        }
        for q in &p.queues {
            if recycled.contains(&q.name.as_str()) {
                continue;
            }
            let limit = reach.get(q.name.as_str()).copied().unwrap_or(0);
            let mut pos = 0;
            for w in &q.wqes {
                if pos + w.op.bbs() > limit {
                    self.find(
                        Some(&q.name),
                        Some((pos, &w.label)),
                        "position",
                        Rule::Unreachable,
                        format!("no enable or doorbell reaches index {pos} (they reach {limit})"),
                    );
                    break;
                }
                pos += w.op.bbs();
            }
        }
    }
}
