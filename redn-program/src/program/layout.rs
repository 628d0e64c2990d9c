//! Placing one client's instance of a program in its code region: where each ring and
//! static block sits, and how many bytes it all takes (checked before anything is allocated).

use super::{Program, ProgramError};
use crate::wqe::{BB_SIZE, SEG_SIZE};

/// Where each ring and static block sits in the code region (offsets from its start).
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct CodeLayout {
    /// Send ring offset of each queue.
    pub sq: Vec<usize>,
    /// Receive ring offset of each queue.
    pub rq: Vec<usize>,
    /// Offset of each static block.
    pub statics: Vec<usize>,
    /// Bytes the code region needs.
    pub len: usize,
}

fn align(v: usize, a: usize) -> usize {
    v.div_ceil(a) * a
}

/// The largest code region any program may lay out, whatever a policy allows: a layout is
/// computed (and refused) before anything is allocated, so a hostile definition asking for
/// gigabytes of rings is refused, not attempted.
pub const MAX_CODE_BYTES: u64 = 1 << 30;

impl Program {
    /// Bytes the code region of one instance needs: every send ring, receive ring and static
    /// block, each rounded up to 64 bytes. Computed without overflow from whatever sizes the
    /// program declares; `None` past `u64`.
    pub fn code_bytes(&self) -> Option<u64> {
        let round = |v: u64| v.checked_add(63).map(|v| v & !63);
        let mut total = 0u64;
        for q in &self.queues {
            let sq = u64::from(q.sq_bbs).checked_mul(BB_SIZE as u64)?;
            let rq = u64::from(q.rq_slots)
                .checked_mul(u64::from(q.rq_sges))?
                .checked_mul(SEG_SIZE as u64)?;
            total = total.checked_add(sq)?.checked_add(round(rq)?)?;
        }
        for b in &self.statics {
            total = total.checked_add(round((b.bytes.len() as u64).max(1))?)?;
        }
        Some(total.max(BB_SIZE as u64))
    }

    /// Check ring sizes and place rings and statics in a code region (at most
    /// [`MAX_CODE_BYTES`]).
    pub fn layout(&self) -> Result<CodeLayout, ProgramError> {
        match self.code_bytes() {
            Some(n) if n <= MAX_CODE_BYTES => {}
            n => {
                return Err(ProgramError::Invalid(format!(
                    "the code region would need {} bytes, more than the {MAX_CODE_BYTES} any \
                     program may have",
                    n.map_or("over 2^64".to_string(), |n| n.to_string())
                )))
            }
        }
        let mut at = 0usize;
        let mut sq = Vec::new();
        let mut rq = Vec::new();
        for q in &self.queues {
            let needed: u64 = q.wqes.iter().map(|w| w.op.bbs()).sum();
            if needed > u64::from(q.sq_bbs) || !q.sq_bbs.is_power_of_two() {
                return Err(ProgramError::RingTooSmall {
                    queue: q.name.clone(),
                    needed,
                    ring: q.sq_bbs,
                });
            }
            if q.recvs.len() > q.rq_slots as usize || !q.rq_slots.is_power_of_two() {
                return Err(ProgramError::Invalid(format!(
                    "queue {:?}: {} receives do not fit {} slots",
                    q.name,
                    q.recvs.len(),
                    q.rq_slots
                )));
            }
            if let Some(r) = q.recvs.iter().find(|r| r.sgl.len() > q.rq_sges as usize) {
                return Err(ProgramError::Invalid(format!(
                    "queue {:?}: a receive has {} entries, slots hold {}",
                    q.name,
                    r.sgl.len(),
                    q.rq_sges
                )));
            }
            sq.push(at);
            at += q.sq_bbs as usize * BB_SIZE;
            rq.push(at);
            at = align(
                at + q.rq_slots as usize * q.rq_sges as usize * SEG_SIZE,
                BB_SIZE,
            );
        }
        let mut statics = Vec::new();
        for b in &self.statics {
            statics.push(at);
            at = align(at + b.bytes.len().max(1), BB_SIZE);
        }
        Ok(CodeLayout {
            sq,
            rq,
            statics,
            len: at.max(BB_SIZE),
        })
    }
}

#[cfg(test)]
mod tests {
    use crate::program::catalog::{self, HashVariant};
    use crate::program::MAX_CODE_BYTES;

    #[test]
    fn code_bytes_is_what_the_layout_takes_and_a_bomb_is_refused() {
        for p in [
            catalog::echo(64, 8).unwrap(),
            catalog::hash_get(HashVariant::Parallel, 8).unwrap(),
            catalog::list_find(8, true, 1).unwrap(),
            catalog::server_loop().unwrap(),
        ] {
            assert_eq!(
                p.code_bytes(),
                Some(p.layout().unwrap().len as u64),
                "{}",
                p.name
            );
        }
        let mut p = catalog::echo(64, 1).unwrap();
        p.queues[0].rq_slots = 1 << 20;
        p.queues[0].rq_sges = 1 << 20;
        assert!(p.code_bytes().is_some_and(|n| n > MAX_CODE_BYTES));
        let e = p.layout().unwrap_err().to_string();
        assert!(e.contains("the code region would need"), "{e}");
        p.queues[0].rq_slots = u32::MAX;
        p.queues[0].rq_sges = u32::MAX;
        p.queues[0].sq_bbs = u32::MAX;
        p.queues
            .extend(std::iter::repeat(p.queues[0].clone()).take(300));
        assert_eq!(p.code_bytes(), None, "past u64");
        assert!(p.layout().is_err());
    }
}
