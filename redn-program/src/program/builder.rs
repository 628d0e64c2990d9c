//! A builder for programs, with RedN's constructs.
//!
//! - [`Builder::if_eq`]: a CAS on a conditional WQE's control word. The WQE is posted as a NOP
//!   whose operand bytes (opmod, index, QPN: 48 bits) something patches (a READ of app data);
//!   the CAS compares them with its own operand (a constant, or bytes the trigger patched into
//!   the CAS) and on a match swaps in the WQE's real control word: a NOP becomes a WRITE.
//! - [`Builder::else_unchanged`]: a masked CAS after the `if` that turns a conditional WQE
//!   still in NOP form into a zero-length WRITE_IMM: a well-defined "no" answer.
//! - [`Builder::break_if_eq`]: a CAS that turns an enabling WQE (the SEND_EN that starts the
//!   next iteration) into a NOP when its operand matches: later iterations are never enabled.
//! - unrolled `while`: the catalog emits one copy of the body per iteration with a static trip
//!   count; recycled `while`: the body re-arms itself with WAIT/ENABLE whose counts a
//!   byte-reversing READ and a FETCH_ADD advance each round ([`Builder::advance_count`]).
//! - [`Builder::gate`]: WAIT then SEND_EN, the doorbell-order barrier between a patch and the
//!   WQE it patches.

use super::{
    wqe_byte, Addr, Form, Iterations, Op, Operand, Param, PatchPoint, PatchSource, Program,
    ProgramError, Queue, QueueRole, Recv, RegionDecl, RegionRole, Sge, Slots, StaticBlock, Wqe,
    MAX_OPERAND,
};
use crate::wqe::{off, WqeFlags};
use std::collections::HashSet;

/// A queue being built.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct QueueHandle(pub usize);

/// Builds a [`Program`].
#[derive(Debug)]
pub struct Builder {
    p: Program,
    /// Signaled send WQEs pushed on each queue (its CQ's send completions so far).
    signaled: Vec<u32>,
    /// BBs pushed on each queue so far.
    bbs: Vec<u32>,
    /// Label -> (queue, index in the queue).
    labels: std::collections::HashMap<String, (usize, usize)>,
}

/// Control-segment bytes that hold a 48-bit operand: (first byte, length) pairs.
pub(crate) const OPERAND_SLOTS: [(u32, u32); 2] = [(0, 3), (4, 3)];
/// The bytes of a CAS WQE's compare operand that hold a control image's operand bytes
/// (the compare is the byte-reversed image): (first byte, length) pairs.
pub(crate) const COMPARE_SLOTS: [(u32, u32); 2] = [(41, 3), (45, 3)];

impl Builder {
    /// Start a program.
    pub fn new(name: &str, summary: &str) -> Builder {
        Builder {
            p: Program {
                name: name.into(),
                summary: summary.into(),
                queues: Vec::new(),
                regions: Vec::new(),
                statics: Vec::new(),
                params: Vec::new(),
                trigger_len: 0,
                patches: Vec::new(),
                entry: Vec::new(),
                recv_entry: Vec::new(),
                iterations: Iterations::Bounded {
                    invocations: 0,
                    wqes_per_invocation: 0,
                },
                response_doc: String::new(),
            },
            signaled: Vec::new(),
            bbs: Vec::new(),
            labels: std::collections::HashMap::new(),
        }
    }

    /// Add a queue.
    #[allow(clippy::too_many_arguments)]
    pub fn queue(
        &mut self,
        name: &str,
        role: QueueRole,
        managed_send: bool,
        managed_recv: bool,
        pu: Option<usize>,
        sq_bbs: u32,
        rq_slots: u32,
        rq_sges: u32,
    ) -> QueueHandle {
        self.p.queues.push(Queue {
            name: name.into(),
            role,
            managed_send,
            managed_recv,
            pu,
            sq_bbs,
            rq_slots,
            rq_sges,
            wqes: Vec::new(),
            recvs: Vec::new(),
        });
        self.signaled.push(0);
        self.bbs.push(0);
        QueueHandle(self.p.queues.len() - 1)
    }

    /// Name of a queue.
    pub fn name(&self, q: QueueHandle) -> String {
        self.p.queues[q.0].name.clone()
    }

    /// Next WQE position (BB index) on `q`.
    pub fn pos(&self, q: QueueHandle) -> u32 {
        self.bbs[q.0]
    }

    /// WQEs pushed on `q` so far.
    pub fn wqe_count(&self, q: QueueHandle) -> u32 {
        u32::try_from(self.p.queues[q.0].wqes.len()).unwrap_or(u32::MAX)
    }

    /// Signaled send WQEs pushed on `q` so far.
    pub fn signaled(&self, q: QueueHandle) -> u32 {
        self.signaled[q.0]
    }

    /// Append a WQE; returns its label.
    pub fn push(
        &mut self,
        q: QueueHandle,
        label: &str,
        op: Op,
        flags: WqeFlags,
        form: Form,
    ) -> String {
        if flags.signaled() {
            self.signaled[q.0] += 1;
        }
        // A WQE is at most MAX_WQE_BBS (16) BBs: bbs_for_ds masks ds to six bits.
        #[allow(clippy::cast_possible_truncation)]
        let bbs = op.bbs() as u32;
        self.bbs[q.0] += bbs;
        self.labels
            .entry(label.to_string())
            .or_insert((q.0, self.p.queues[q.0].wqes.len()));
        self.p.queues[q.0].wqes.push(Wqe {
            label: label.into(),
            op,
            flags,
            form,
        });
        label.into()
    }

    /// Append a receive.
    pub fn recv(&mut self, q: QueueHandle, sgl: Vec<Sge>) {
        self.p.queues[q.0].recvs.push(Recv { sgl });
    }

    /// Declare a patch point.
    pub fn patch(&mut self, label: &str, byte: u32, len: u32, source: PatchSource) {
        self.p.patches.push(PatchPoint {
            label: label.into(),
            byte,
            len,
            source,
        });
    }

    /// Bind a region.
    pub fn region(&mut self, name: &str, role: RegionRole, min_len: u64, doc: &str) {
        self.p.regions.push(RegionDecl {
            name: name.into(),
            role,
            min_len,
            doc: doc.into(),
        });
    }

    /// Keep bytes in the code region.
    pub fn static_block(&mut self, name: &str, bytes: Vec<u8>) {
        self.p.statics.push(StaticBlock {
            name: name.into(),
            bytes,
        });
    }

    /// Declare a trigger parameter at the end of the trigger so far; returns its offset.
    pub fn param(&mut self, name: &str, len: u32, doc: &str) -> u32 {
        let offset = self.p.trigger_len;
        self.p.params.push(Param {
            name: name.into(),
            offset,
            len,
            doc: doc.into(),
        });
        self.p.trigger_len += len;
        offset
    }

    /// Enable `q` up to `count` when the program starts.
    pub fn entry(&mut self, q: QueueHandle, count: u32) {
        let name = self.name(q);
        self.p.entry.push((name, count));
    }

    /// Let managed receive queue `q` take `count` receives when the program starts.
    pub fn recv_entry(&mut self, q: QueueHandle, count: u32) {
        let name = self.name(q);
        self.p.recv_entry.push((name, count));
    }

    /// Set the iteration bound and the response description.
    pub fn finish(&mut self, iterations: Iterations, response_doc: &str) {
        self.p.iterations = iterations;
        self.p.response_doc = response_doc.into();
    }

    /// WAIT on `wait`'s CQ for completion `count`, then SEND_EN `enable` up to `upto`.
    pub fn gate(
        &mut self,
        on: QueueHandle,
        label: &str,
        wait: QueueHandle,
        count: u32,
        enable: QueueHandle,
        upto: u32,
    ) {
        let (w, e) = (self.name(wait), self.name(enable));
        self.push(
            on,
            &format!("{label}.wait"),
            Op::Wait { queue: w, count },
            WqeFlags::NONE,
            Form::Active,
        );
        self.push(
            on,
            &format!("{label}.en"),
            Op::SendEn {
                queue: e,
                count: upto,
            },
            WqeFlags::NONE,
            Form::Active,
        );
    }

    /// RedN's `if`: a CAS (on `on`) that turns conditional WQE `target`, posted in NOP form,
    /// into its active form when its operand bytes equal `operand`. `operand: None` leaves
    /// the compare's operand bytes to a patch (declared by the caller, e.g. from the trigger).
    pub fn if_eq(
        &mut self,
        on: QueueHandle,
        label: &str,
        target: &str,
        operand: Option<u64>,
        flags: WqeFlags,
    ) -> Result<String, ProgramError> {
        let v = operand.unwrap_or(0);
        if v > MAX_OPERAND {
            return Err(ProgramError::OperandTooWide(v));
        }
        let op = Op::Cas {
            remote: Addr::wqe(target, 0),
            compare: Operand::ctrl(target, Form::Nop, Slots::Operand(v)),
            swap: Operand::ctrl(target, Form::Active, Slots::Real),
            result: None,
        };
        self.push(on, label, op, flags | WqeFlags::FENCE, Form::Active);
        self.patch(
            target,
            0,
            8,
            PatchSource::Cas {
                label: label.into(),
            },
        );
        Ok(label.into())
    }

    /// The `else` of [`Builder::if_eq`]: a masked CAS comparing only the opcode and ds bytes;
    /// if `target` is still a NOP it becomes its active form with ds 2 (a WRITE_IMM that
    /// carries no data, only its immediate: "not found").
    pub fn else_unchanged(
        &mut self,
        on: QueueHandle,
        label: &str,
        target: &str,
        flags: WqeFlags,
    ) -> String {
        let mask_opcode_ds = 0xff00_0000_ff00_0000u64;
        let op = Op::MaskedCas {
            remote: Addr::wqe(target, 0),
            compare: Operand::ctrl(target, Form::Nop, Slots::Operand(0)),
            compare_mask: mask_opcode_ds,
            swap: Operand::Ctrl {
                label: target.into(),
                form: Form::Active,
                slots: Slots::Real,
                ds: Some(2),
            },
            swap_mask: u64::MAX,
        };
        self.push(on, label, op, flags | WqeFlags::FENCE, Form::Active);
        self.patch(
            target,
            0,
            8,
            PatchSource::Cas {
                label: label.into(),
            },
        );
        label.into()
    }

    /// RedN's `break`: a CAS that turns `gate` (the WQE enabling later iterations, posted
    /// active, its operand bytes patched with the value to test) into a NOP when they equal
    /// the compare's operand bytes (patched by the caller from the trigger).
    pub fn break_if_eq(
        &mut self,
        on: QueueHandle,
        label: &str,
        gate: &str,
        flags: WqeFlags,
    ) -> String {
        let op = Op::Cas {
            remote: Addr::wqe(gate, 0),
            compare: Operand::ctrl(gate, Form::Active, Slots::Operand(0)),
            swap: Operand::ctrl(gate, Form::Nop, Slots::Operand(0)),
            result: None,
        };
        self.push(on, label, op, flags | WqeFlags::FENCE, Form::Active);
        self.patch(
            gate,
            0,
            8,
            PatchSource::Cas {
                label: label.into(),
            },
        );
        label.into()
    }

    /// Scatter entries that put a 48-bit operand into a control word's operand bytes.
    pub fn operand_sges(target: &str) -> Vec<Sge> {
        OPERAND_SLOTS
            .iter()
            .map(|&(b, l)| Sge::new(Addr::wqe(target, b as usize), l))
            .collect()
    }

    /// Scatter entries that put a 48-bit operand into a CAS's compare operand bytes.
    pub fn compare_sges(cas: &str) -> Vec<Sge> {
        COMPARE_SLOTS
            .iter()
            .map(|&(b, l)| Sge::new(Addr::wqe(cas, b as usize), l))
            .collect()
    }

    /// Declare the patch points of `sges` (all into WQEs) as written by `source`.
    pub fn patch_sges(&mut self, sges: &[Sge], source: PatchSource) {
        for s in sges {
            if let Addr::Wqe { label, byte } = &s.addr {
                self.patch(&label.clone(), *byte, s.len, source.clone());
            }
        }
    }

    /// Recycled `while`: advance the 32-bit count of WAIT/ENABLE `target` by `step` each
    /// round, from counter `counter` (a static block holding a host-order u64: the value the
    /// count takes in the round this runs in).
    ///
    /// Two WQEs on `on`: an RDMA READ of the counter's low four bytes whose scatter list is
    /// four one-byte entries at descending addresses (the count's bytes 27, 26, 25, 24), so
    /// the little-endian counter lands big-endian in the count; then a FETCH_ADD of `step`
    /// on the counter, with no result. Why not the FETCH_ADD's reply: upstream Linux sets the
    /// HCA's 8-byte atomic replies to host order (commit f91e6d8941bf), so the old value
    /// would land byte-reversed; only MLNX_OFED offers big-endian replies. The byte-reversing
    /// READ is RedN's own `IBV_CONVERT_ENDIAN_ASYNC` trick. The responder runs the two in
    /// order, so the READ sees the count before the add. `target` must not be enabled (and
    /// so fetchable) before the READ has landed: the WQE that enables it carries the fence
    /// flag (a READ's data may land after later unfenced WQEs ran).
    pub fn advance_count(
        &mut self,
        on: QueueHandle,
        label: &str,
        counter: &str,
        step: u64,
        target: &str,
    ) {
        let pi = off::WAIT_PI;
        let sgl = (0..4)
            .map(|i| Sge::new(Addr::wqe(target, pi + 3 - i), 1))
            .collect();
        let read = Op::Read {
            remote: Addr::static_(counter, 0),
            sgl,
        };
        self.push(on, label, read, WqeFlags::NONE, Form::Active);
        self.patch(
            target,
            wqe_byte(pi),
            4,
            PatchSource::Read {
                label: label.into(),
            },
        );
        let add = Op::Faa {
            remote: Addr::static_(counter, 0),
            add: step,
            result: None,
        };
        self.push(
            on,
            &format!("{label}.add"),
            add,
            WqeFlags::NONE,
            Form::Active,
        );
    }

    /// Change the count of an already pushed WAIT, SEND_EN or RECV_EN (for counts that are
    /// only known once later WQEs are placed).
    pub fn set_enable_count(&mut self, label: &str, new: u32) {
        let Some(&(q, i)) = self.labels.get(label) else {
            return;
        };
        if let Op::Wait { count, .. } | Op::SendEn { count, .. } | Op::RecvEn { count, .. } =
            &mut self.p.queues[q].wqes[i].op
        {
            *count = new;
        }
    }

    /// Check and return the program.
    pub fn build(self) -> Result<Program, ProgramError> {
        let p = self.p;
        let mut labels = HashSet::new();
        for q in &p.queues {
            for w in &q.wqes {
                if !labels.insert(w.label.as_str()) {
                    return Err(ProgramError::Duplicate {
                        kind: "WQE label",
                        name: w.label.clone(),
                    });
                }
            }
        }
        let mut queues = HashSet::new();
        for q in &p.queues {
            if !queues.insert(q.name.as_str()) {
                return Err(ProgramError::Duplicate {
                    kind: "queue",
                    name: q.name.clone(),
                });
            }
        }
        for pp in &p.patches {
            if !labels.contains(pp.label.as_str()) {
                return Err(ProgramError::Unknown {
                    kind: "WQE label",
                    name: pp.label.clone(),
                });
            }
        }
        for (q, _) in &p.entry {
            if !queues.contains(q.as_str()) {
                return Err(ProgramError::Unknown {
                    kind: "queue",
                    name: q.clone(),
                });
            }
        }
        p.layout()?;
        Ok(p)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::program::catalog;

    fn tiny() -> (Builder, QueueHandle) {
        let mut b = Builder::new("t", "test");
        let q = b.queue("q", QueueRole::Worker, true, false, None, 2, 1, 1);
        b.push(q, "target", Op::Nop, WqeFlags::NONE, Form::Nop);
        (b, q)
    }

    #[test]
    fn operand_wider_than_48_bits_is_refused() {
        let (mut b, q) = tiny();
        assert_eq!(
            b.if_eq(q, "cas", "target", Some(1 << 48), WqeFlags::NONE),
            Err(ProgramError::OperandTooWide(1 << 48))
        );
        assert!(b
            .if_eq(q, "cas", "target", Some((1 << 48) - 1), WqeFlags::NONE)
            .is_ok());
    }

    #[test]
    fn ring_too_small_is_refused_with_sizes() {
        let (mut b, q) = tiny();
        b.push(q, "a", Op::Nop, WqeFlags::NONE, Form::Active);
        b.push(q, "b", Op::Nop, WqeFlags::NONE, Form::Active);
        let e = b.build().unwrap_err();
        assert_eq!(
            e,
            ProgramError::RingTooSmall {
                queue: "q".into(),
                needed: 3,
                ring: 2
            }
        );
        assert_eq!(e.to_string(), "queue \"q\" needs 3 BBs, its ring has 2");
    }

    #[test]
    fn duplicate_labels_and_unknown_patch_targets_are_refused() {
        let (mut b, q) = tiny();
        b.push(q, "target", Op::Nop, WqeFlags::NONE, Form::Active);
        assert!(matches!(b.build(), Err(ProgramError::Duplicate { .. })));
        let (mut b, _) = tiny();
        b.patch("nowhere", 0, 8, PatchSource::Cas { label: "x".into() });
        assert!(matches!(b.build(), Err(ProgramError::Unknown { .. })));
    }

    #[test]
    fn catalog_programs_build_and_list() {
        for p in [
            catalog::echo(16, 4).unwrap(),
            catalog::hash_get(catalog::HashVariant::Single, 4).unwrap(),
            catalog::hash_get(catalog::HashVariant::Sequential, 4).unwrap(),
            catalog::hash_get(catalog::HashVariant::Parallel, 4).unwrap(),
            catalog::list_find(4, false, 2).unwrap(),
            catalog::list_find(4, true, 1).unwrap(),
            catalog::server_loop().unwrap(),
        ] {
            let l = p.listing();
            assert!(l.starts_with(&format!("offload {}:", p.name)), "{l}");
            // Every WQE appears in the listing, and every patch point under its WQE.
            for q in &p.queues {
                for w in &q.wqes {
                    assert!(l.contains(&w.label), "{} missing from listing", w.label);
                }
            }
            assert_eq!(l.matches("patch bytes").count(), p.patches.len());
            // Trigger parameters tile the trigger.
            let mut at = 0;
            for prm in &p.params {
                assert_eq!(prm.offset, at);
                at += prm.len;
            }
            assert_eq!(at, p.trigger_len);
        }
        assert!(catalog::list_find(4, true, 2).is_err());
        assert!(catalog::list_find(0, false, 1).is_err());
        assert!(catalog::echo(0, 1).is_err());
    }
}
