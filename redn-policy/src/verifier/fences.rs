//! Fences: a WQE that uses bytes an earlier READ or atomic of its queue brings carries the
//! fence flag, or comes after a WAIT on its own queue's completions that covers that READ
//! or atomic. It relies on send completions coming in order, which holds only on a queue
//! with no receives (their completions count on the same CQ).

use super::checker::Checker;
use super::Rule;
use redn_program::program::{Addr, Op};

/// A READ or atomic whose bytes land late: its label, the bytes it writes locally, and how
/// many signaled WQEs of its queue come before it.
type Landing<'p> = (&'p str, Vec<(&'p Addr, u64)>, u64);

/// Whether `alen` bytes at `a` and `blen` bytes at `b` may be the same bytes, for the fence
/// rule: two WQE or two static addresses by their names and offsets; two region addresses
/// always may; addresses of different kinds never are (a WQE's bytes lie in the code
/// ring, a static block in the program's own memory, a region in the app's).
fn may_overlap(a: &Addr, alen: u64, b: &Addr, blen: u64) -> bool {
    let ranges =
        |x: u64, xl: u64, y: u64, yl: u64| x < y.saturating_add(yl) && y < x.saturating_add(xl);
    match (a, b) {
        (
            Addr::Wqe {
                label: l1,
                byte: b1,
            },
            Addr::Wqe {
                label: l2,
                byte: b2,
            },
        ) => l1 == l2 && ranges(u64::from(*b1), alen, u64::from(*b2), blen),
        (
            Addr::Static {
                name: n1,
                offset: o1,
            },
            Addr::Static {
                name: n2,
                offset: o2,
            },
        ) => n1 == n2 && ranges(*o1, alen, *o2, blen),
        // Region addresses may be patched, and two names may bind the same memory.
        (Addr::Region { .. }, Addr::Region { .. }) => true,
        _ => false,
    }
}

impl Checker<'_> {
    /// The fence rule: on a ConnectX a WQE may start before an earlier READ's or atomic's
    /// response has landed, unless it carries the fence flag. So a WQE that reads bytes an
    /// earlier READ (its scatter) or atomic (its result) of the same queue writes — as its
    /// gather, its atomic target or its READ source — must carry it, or come after a WAIT
    /// on its own queue's completions that covers that READ or atomic: send completions
    /// come in order, so a completion of a WQE at or after it says it is done. (Only on a
    /// queue with no receives: their completions count on the same CQ.)
    pub(super) fn fences(&mut self) {
        let p = self.p;
        let mut found = Vec::new();
        for q in &p.queues {
            // READs and atomics so far: label, what they write locally, and the signaled WQEs
            // of this queue before them.
            let mut landing: Vec<Landing<'_>> = Vec::new();
            let mut signaled_so_far = 0u64;
            let mut waited_for = 0u64;
            let mut pos = 0;
            for w in &q.wqes {
                let reads: Vec<(&Addr, u64)> = match &w.op {
                    Op::Write { sgl, .. } => {
                        sgl.iter().map(|s| (&s.addr, u64::from(s.len))).collect()
                    }
                    Op::Read { remote, sgl } => {
                        vec![(remote, sgl.iter().map(|s| u64::from(s.len)).sum())]
                    }
                    Op::Cas { remote, .. }
                    | Op::MaskedCas { remote, .. }
                    | Op::Faa { remote, .. } => {
                        vec![(remote, 8)]
                    }
                    _ => Vec::new(),
                };
                {
                    for (label, writes, index) in &landing {
                        if q.recvs.is_empty() && *index < waited_for {
                            continue;
                        }
                        let hit = reads
                            .iter()
                            .any(|(a, n)| writes.iter().any(|(b, m)| may_overlap(a, *n, b, *m)));
                        if hit && !w.flags.waits_for_responses() {
                            found.push((
                                q.name.clone(),
                                (pos, w.label.clone()),
                                format!(
                                    "uses bytes {label:?} brings, which may not have landed: \
                                     set the fence flag"
                                ),
                            ));
                            break;
                        }
                    }
                }
                if let Op::Wait { queue, count } = &w.op {
                    if queue == &q.name {
                        waited_for = waited_for.max(u64::from(*count) + 1);
                        if q.recvs.is_empty() {
                            // What this WAIT covers has landed for every WQE after it.
                            landing.retain(|(_, _, index)| *index >= waited_for);
                        }
                    }
                }
                let writes: Vec<(&Addr, u64)> = match &w.op {
                    Op::Read { sgl, .. } => {
                        sgl.iter().map(|s| (&s.addr, u64::from(s.len))).collect()
                    }
                    Op::Cas { result, .. } | Op::Faa { result, .. } => {
                        result.iter().map(|s| (&s.addr, u64::from(s.len))).collect()
                    }
                    _ => Vec::new(),
                };
                if !writes.is_empty() {
                    landing.push((w.label.as_str(), writes, signaled_so_far));
                }
                if w.flags.signaled() {
                    signaled_so_far += 1;
                }
                pos += w.op.bbs();
            }
        }
        for (qn, (pos, label), detail) in found {
            self.find(
                Some(&qn),
                Some((pos, &label)),
                "flags",
                Rule::MissingFence,
                detail,
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::may_overlap;
    use redn_program::program::Addr;

    #[test]
    fn accesses_overlap_only_where_they_share_a_byte_of_the_same_thing() {
        let wqe = |label: &str, byte: usize| Addr::wqe(label, byte);
        let block = |name: &str, offset: u64| Addr::static_(name, offset);
        // Bytes 8..16 of a WQE against 0..8, 0..9, 15..16 and 16..24 of it, both ways round.
        for (a, b, overlap) in [
            (wqe("x", 8), wqe("x", 0), false),
            (wqe("x", 8), wqe("x", 15), true),
            (wqe("x", 8), wqe("x", 16), false),
            (block("s", 8), block("s", 0), false),
            (block("s", 8), block("s", 15), true),
            (block("s", 8), block("s", 16), false),
        ] {
            let len_b = if overlap { 1 } else { 8 };
            assert_eq!(may_overlap(&a, 8, &b, len_b), overlap, "{a:?} {b:?}");
            assert_eq!(may_overlap(&b, len_b, &a, 8), overlap, "{b:?} {a:?}");
        }
        assert!(
            may_overlap(&wqe("x", 0), 9, &wqe("x", 8), 8),
            "one byte shared"
        );
        assert!(
            may_overlap(&block("s", 0), 9, &block("s", 8), 8),
            "one byte shared"
        );
        // The same bytes of another WQE or block are other bytes.
        assert!(!may_overlap(&wqe("x", 0), 8, &wqe("y", 0), 8));
        assert!(!may_overlap(&block("s", 0), 8, &block("t", 0), 8));
        // Code and data never share a byte; two region addresses always may.
        assert!(!may_overlap(&wqe("x", 0), 8, &block("s", 0), 8));
        assert!(!may_overlap(&wqe("x", 0), 8, &Addr::region("r", 0), 8));
        assert!(may_overlap(
            &Addr::region("r", 0),
            8,
            &Addr::region("q", 4096),
            8
        ));
    }
}
