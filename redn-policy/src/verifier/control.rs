//! The control-word model: every value the first 8 bytes of each WQE (opmod, index, opcode,
//! QPN, ds) can take, over every order of every write the program can make into them.
//!
//! The installer's narrow keys keep every write into code inside a declared patch point, so
//! the writers of a control word are exactly the sources of the patch points that cover it.
//! Each is a transfer on the word's abstract value, a 64-bit value with a mask of the bits
//! that are known (as a CAS reads the word: little-endian):
//!
//! - a CAS or masked CAS aimed at the word: where the known bits let it match its compare,
//!   the swap replaces the bits of its swap mask, computed bitwise (so masks that splice
//!   compare and swap bits are followed exactly); compare bytes a trigger patches are
//!   unknown, so both outcomes are kept;
//! - a WRITE of 8 constant bytes (a static block nothing writes, through a WRITE whose remote
//!   address and data segment no patch point covers) onto the word: that value;
//! - any other write (a trigger, a READ, an atomic's result, a WRITE of data): its bytes
//!   become unknown.
//!
//! Starting from the installed image, the transfers are applied in every order until no new
//! value appears (a fixpoint; writers may run any number of times in any order, which is
//! more than the program allows and so sound). Every reachable value must then be a control
//! word the hardware runs as the WQE's own operation or as a NOP, over the same basic
//! blocks: opcode known and either NOP or the WQE's own; ds known, with the WQE's block
//! count, and, active, at least what its opcode needs and at most its own segments;
//! opmod known for masked atomics (it selects their width). The index and QPN bytes may
//! hold anything: with WQE checks off (RedN's requirement) the NIC ignores them, which is
//! what lets them carry operands.
//!
//! `Checker::control_words` runs the model over every WQE whose control word something may
//! write, from the image the installer would write (`installed_images`), and turns each
//! refusal into a finding.

use super::checker::Checker;
use super::Rule;
use redn_program::endian::Be64;
use redn_program::program::{
    Addr, CodeLayout, Op, PatchPoint, PatchSource, Program, Resolver, Sge, WqePos,
};
use redn_program::wqe::{bbs_for_ds, off, Opcode, OPMOD_EXT_ATOMIC_8B};
use std::collections::{HashMap, HashSet, VecDeque};

/// Where a CAS keeps its operands (big-endian), as the encoder lays them out: swap and
/// compare in the first atomic segment, the masks of a masked CAS in the second.
const SWAP: u32 = 32;
const COMPARE: u32 = 40;
const SWAP_MASK: u32 = 48;
const COMPARE_MASK: u32 = 56;
const _: () = assert!(SWAP as usize == off::SWAP_ADD && COMPARE as usize == off::COMPARE);

/// Most values one control word may reach before the verifier gives up (and refuses).
const MAX_STATES: usize = 256;

/// An abstract control word: `value`'s bits where `known` is set, anything elsewhere.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(super) struct Word {
    pub value: u64,
    pub known: u64,
}

impl Word {
    fn exact(value: u64) -> Word {
        Word {
            value,
            known: u64::MAX,
        }
    }

    /// Byte `i` (0 = opmod ... 7 = ds) if all its bits are known.
    fn byte(self, i: usize) -> Option<u8> {
        let shift = 8 * i;
        ((self.known >> shift) & 0xff == 0xff).then_some(((self.value >> shift) & 0xff) as u8)
    }

    fn render(self) -> String {
        (0..8)
            .map(|i| {
                self.byte(i)
                    .map_or("??".to_string(), |b| format!("{b:02x}"))
            })
            .collect::<Vec<_>>()
            .join(" ")
    }
}

/// A write into a control word.
#[derive(Clone, Debug)]
pub(super) enum Transfer {
    /// CAS `label`: compare (with the bits that are known), swap (likewise), masks.
    Cas {
        label: String,
        compare: Word,
        compare_mask: u64,
        swap: Word,
        swap_mask: u64,
    },
    /// WRITE `label` of constant bytes.
    Set { label: String, value: u64 },
    /// Any other write: these bits become unknown.
    Clobber { source: String, bits: u64 },
}

impl Transfer {
    fn name(&self) -> String {
        match self {
            Transfer::Cas { label, .. } => format!("CAS {label:?}"),
            Transfer::Set { label, .. } => format!("WRITE {label:?}"),
            Transfer::Clobber { source, .. } => source.clone(),
        }
    }

    /// The values `w` may become (besides staying as it is).
    fn apply(&self, w: Word) -> Option<Word> {
        match self {
            Transfer::Cas {
                compare,
                compare_mask,
                swap,
                swap_mask,
                ..
            } => {
                let both_known = w.known & compare.known & compare_mask;
                let could_match = (w.value ^ compare.value) & both_known == 0;
                could_match.then(|| Word {
                    value: (w.value & !swap_mask) | (swap.value & swap_mask),
                    known: (w.known & !swap_mask) | (swap.known & swap_mask),
                })
            }
            Transfer::Set { value, .. } => Some(Word::exact(*value)),
            Transfer::Clobber { bits, .. } => Some(Word {
                value: w.value & !bits,
                known: w.known & !bits,
            }),
        }
    }
}

/// The bits of a control word (little-endian u64) that bytes `from..to` of the WQE cover.
fn bits_of(from: u32, to: u32) -> u64 {
    (from.min(8)..to.min(8)).fold(0, |m, b| m | (0xffu64 << (8 * b)))
}

/// The bits of a CAS operand (as the CAS uses it) that bytes `from..to` of the CAS WQE
/// cover, for the operand stored big-endian at `at..at + 8`.
fn operand_bits(from: u32, to: u32, at: u32) -> u64 {
    (from.max(at)..to.min(at + 8)).fold(0, |m, b| m | (0xffu64 << (8 * (7 - (b - at)))))
}

/// Why a reachable value is not a control word the hardware may run.
pub(super) fn judge(op: &Op, own_ds: u8, w: Word) -> Option<String> {
    let Some(opcode) = w.byte(off::OPCODE) else {
        return Some("its opcode byte may hold anything".into());
    };
    let own = op.opcode_byte();
    let nop = Opcode::Nop as u8;
    if opcode != nop && opcode != own {
        return Some(format!(
            "opcode {opcode:#04x} is neither NOP nor the WQE's own ({own:#04x}): its segments \
             would be read as another operation's"
        ));
    }
    let Some(ds) = w.byte(off::DS) else {
        return Some("its ds byte may hold anything".into());
    };
    if ds == 0 || bbs_for_ds(ds) != bbs_for_ds(own_ds) {
        return Some(format!(
            "ds {ds} spans another number of blocks than the WQE's {own_ds}: the NIC would \
             run its blocks as other WQEs"
        ));
    }
    if opcode == own && opcode != nop {
        let min = super::min_ds(op);
        if ds < min || ds > own_ds {
            return Some(format!(
                "ds {ds} for an active {}: it holds {own_ds} segments and needs at least {min}",
                op.opcode().name()
            ));
        }
        if matches!(op, Op::MaskedCas { .. }) && w.byte(off::OPMOD) != Some(OPMOD_EXT_ATOMIC_8B) {
            return Some("a masked atomic's opmod (its width) may change".into());
        }
    }
    None
}

/// One refused control word: the value, how it is reached, and why it is refused.
struct Refusal {
    pub word: String,
    pub path: Vec<String>,
    pub steps: usize,
    pub why: String,
}

/// Every value the control word of the WQE at `initial` reaches under `transfers`, breadth
/// first; the first refused one (with the writers that lead to it), or `Err` if more than
/// [`MAX_STATES`] values are reachable.
fn explore(op: &Op, initial: u64, transfers: &[Transfer]) -> Result<Option<Refusal>, usize> {
    let own_ds = op.ds();
    let start = Word::exact(initial);
    let mut parent: HashMap<Word, (Word, usize)> = HashMap::new();
    let mut seen: HashSet<Word> = HashSet::from([start]);
    let mut queue = VecDeque::from([(start, 0usize)]);
    while let Some((w, depth)) = queue.pop_front() {
        if let Some(why) = judge(op, own_ds, w) {
            let mut path = Vec::new();
            let mut at = w;
            while let Some(&(prev, t)) = parent.get(&at) {
                path.push(transfers[t].name());
                at = prev;
            }
            path.reverse();
            return Ok(Some(Refusal {
                word: w.render(),
                path,
                steps: depth,
                why,
            }));
        }
        for (i, t) in transfers.iter().enumerate() {
            let Some(next) = t.apply(w) else { continue };
            if seen.insert(next) {
                if seen.len() > MAX_STATES {
                    return Err(seen.len());
                }
                parent.insert(next, (w, i));
                queue.push_back((next, depth + 1));
            }
        }
    }
    Ok(None)
}

/// What the program knows about one of its CAS WQEs and static blocks, to build transfers.
struct Writers<'p> {
    pub program: &'p Program,
    /// The program's patch points by the WQE they patch (`Program::patches_by_wqe`).
    pub patches: &'p HashMap<&'p str, Vec<&'p PatchPoint>>,
    pub positions: &'p HashMap<&'p str, WqePos>,
    /// The installed image of each WQE's first 64 bytes, by label.
    pub image: &'p dyn Fn(&str) -> Option<[u8; 64]>,
    /// True if static block `name` may be written by the program.
    pub static_written: &'p dyn Fn(&str) -> bool,
}

impl Writers<'_> {
    /// The transfers on the control word of WQE `target`: one per patch point over its first
    /// 8 bytes.
    pub(super) fn transfers(&self, target: &str) -> Vec<Transfer> {
        let mut out = Vec::new();
        for pp in self.patches.get(target).into_iter().flatten() {
            let end = pp.byte.saturating_add(pp.len);
            if pp.byte >= 8 {
                continue;
            }
            let bits = bits_of(pp.byte, end);
            let clobber = |source: String| Transfer::Clobber { source, bits };
            let t = match &pp.source {
                PatchSource::Cas { label } if pp.byte == 0 && pp.len == 8 => self
                    .cas(label, target)
                    .unwrap_or_else(|| clobber(format!("CAS {label:?}"))),
                PatchSource::Write { label } if pp.byte == 0 && pp.len == 8 => self
                    .constant_write(label, target)
                    .unwrap_or_else(|| clobber(format!("WRITE {label:?}"))),
                other => clobber(super::source_name(other)),
            };
            out.push(t);
        }
        out
    }

    /// CAS `label` as a transfer on `target`'s control word, if it is a CAS aimed at it.
    fn cas(&self, label: &str, target: &str) -> Option<Transfer> {
        let pos = self.positions.get(label)?;
        let w = self.program.wqe_at(*pos)?;
        let aimed =
            |remote: &Addr| matches!(remote, Addr::Wqe { label: l, byte: 0 } if l == target);
        let masked = match &w.op {
            Op::Cas { remote, .. } if aimed(remote) => false,
            Op::MaskedCas { remote, .. } if aimed(remote) => true,
            _ => return None,
        };
        let img = (self.image)(label)?;
        let be = |at: usize| Be64::read(&img, at).get();
        // Bytes of the CAS's own atomic segment that something may patch are unknown.
        let unknown = |at: u32| {
            self.patches
                .get(label)
                .into_iter()
                .flatten()
                .fold(0u64, |m, pp| {
                    m | operand_bits(pp.byte, pp.byte.saturating_add(pp.len), at)
                })
        };
        let word = |at: u32| Word {
            value: be(at as usize),
            known: !unknown(at),
        };
        let swap = word(SWAP);
        let compare = word(COMPARE);
        let (compare_mask, swap_mask) = if masked {
            let cm = word(COMPARE_MASK);
            let sm = word(SWAP_MASK);
            if cm.known != u64::MAX || sm.known != u64::MAX {
                // A mask that may change: any bit may be swapped in.
                return Some(Transfer::Clobber {
                    source: format!("CAS {label:?} (its masks may be patched)"),
                    bits: u64::MAX,
                });
            }
            (cm.value, sm.value)
        } else {
            (u64::MAX, u64::MAX)
        };
        Some(Transfer::Cas {
            label: label.to_string(),
            compare,
            compare_mask,
            swap,
            swap_mask,
        })
    }

    /// WRITE `label` as a transfer, if it writes 8 constant bytes onto `target`'s word.
    fn constant_write(&self, label: &str, target: &str) -> Option<Transfer> {
        let value = constant_copy(
            self.program,
            self.positions,
            self.static_written,
            label,
            target,
        )?;
        Some(Transfer::Set {
            label: label.to_string(),
            value,
        })
    }
}

/// The 8 bytes (as a CAS reads them: little-endian) that WRITE `label` copies onto the
/// control word of `target`, if it copies exactly 8 bytes from a static block nothing ever
/// writes and nothing may patch the WRITE past its control segment; `None` otherwise.
pub(super) fn constant_copy(
    program: &Program,
    positions: &HashMap<&str, WqePos>,
    static_written: &dyn Fn(&str) -> bool,
    label: &str,
    target: &str,
) -> Option<u64> {
    let w = program.wqe_at(*positions.get(label)?)?;
    let Op::Write {
        remote: Addr::Wqe { label: to, byte: 0 },
        sgl,
        imm: None,
    } = &w.op
    else {
        return None;
    };
    let [Sge {
        addr: Addr::Static { name, offset },
        len: 8,
    }] = sgl.as_slice()
    else {
        return None;
    };
    if to != target || static_written(name) {
        return None;
    }
    // Every write into a WQE lands in a patch point of it (the other passes check each
    // source; the installer's keys hold it to them). One over the WRITE's remote address or
    // data segment makes the copy any bytes its keys reach, or (with the inline bit in the
    // byte count) the WRITE's own bytes.
    let segments = (super::SEG_BYTES, u32::MAX);
    if program.patches.iter().any(|pp| {
        pp.label == label && super::overlap((pp.byte, pp.byte.saturating_add(pp.len)), segments)
    }) {
        return None;
    }
    let block = program.statics.iter().find(|b| &b.name == name)?;
    let at = usize::try_from(*offset).ok()?;
    let bytes: [u8; 8] = block.bytes.get(at..at.checked_add(8)?)?.try_into().ok()?;
    Some(u64::from_le_bytes(bytes))
}

impl Checker<'_> {
    /// The control-word model (see [`control`](self)): every value each WQE's first 8 bytes can
    /// reach under every write the program can make into them must be one the hardware runs
    /// as the WQE's own operation or a NOP.
    pub(super) fn control_words(&mut self) {
        let p = self.p;
        let Some(images) = self.layout.clone().and_then(|l| installed_images(p, l)) else {
            // Layout or rendering failed: the other passes say why.
            if self.out.is_empty() {
                self.find(
                    None,
                    None,
                    "program",
                    Rule::UnknownName,
                    "the program cannot be laid out and rendered".into(),
                );
            }
            return;
        };
        let image = |label: &str| images.get(label).copied();
        let static_written = |name: &str| self.static_written(name);
        let writers = Writers {
            program: p,
            patches: &self.patches,
            positions: &self.idx.at,
            image: &image,
            static_written: &static_written,
        };
        let mut found = Vec::new();
        for q in &p.queues {
            let mut pos = 0;
            for w in &q.wqes {
                let transfers = writers.transfers(&w.label);
                if !transfers.is_empty() {
                    if let Some(img) = image(&w.label) {
                        let mut first = [0u8; 8];
                        first.copy_from_slice(&img[..8]);
                        let initial = u64::from_le_bytes(first);
                        let here = Some((pos, w.label.clone()));
                        match explore(&w.op, initial, &transfers) {
                            Ok(None) => {}
                            Ok(Some(r)) => {
                                let rule = if r.why.contains("may hold anything") {
                                    Rule::ProtectedField
                                } else if r.why.starts_with("ds") {
                                    Rule::BadDs
                                } else {
                                    Rule::UnsafeSwap
                                };
                                let path = if r.path.is_empty() {
                                    "as installed".to_string()
                                } else {
                                    format!("through {}", r.path.join(", then "))
                                };
                                found.push((
                                    q.name.clone(),
                                    here,
                                    rule,
                                    format!(
                                        "may become [{}] {path} (step {} of the fixpoint): {}",
                                        r.word, r.steps, r.why
                                    ),
                                ));
                            }
                            Err(n) => found.push((
                                q.name.clone(),
                                here,
                                Rule::UnsafeSwap,
                                format!(
                                    "reaches more than {} values ({n} seen): too many to check",
                                    MAX_STATES
                                ),
                            )),
                        }
                    }
                }
                pos += w.op.bbs();
            }
        }
        for (qn, here, rule, detail) in found {
            self.find(
                Some(&qn),
                here.as_ref().map(|(i, l)| (*i, l.as_str())),
                "control word",
                rule,
                detail,
            );
        }
    }
}

/// The first 64 bytes of every WQE the control-word model reads (those whose control word
/// something may write, and every CAS, for its operands) as the installer would write them,
/// with stand-in numbers (`Resolver::stand_in`) over `layout`; `None` if one of them cannot
/// be rendered.
fn installed_images(p: &Program, layout: CodeLayout) -> Option<HashMap<String, [u8; 64]>> {
    let resolver = Resolver::stand_in(p, layout).ok()?;
    let needed: std::collections::HashSet<&str> = p
        .patches
        .iter()
        .filter(|pp| pp.byte < 8)
        .map(|pp| pp.label.as_str())
        .chain(
            p.queues
                .iter()
                .flat_map(|q| &q.wqes)
                .filter(|w| matches!(w.op, Op::Cas { .. } | Op::MaskedCas { .. }))
                .map(|w| w.label.as_str()),
        )
        .collect();
    let mut out = HashMap::new();
    for (label, pos) in p.wqe_positions() {
        if !needed.contains(label) {
            continue;
        }
        let w = p.wqe_at(pos)?;
        let q = &p.queues[pos.queue];
        let bytes = p
            .render_wqe(&resolver, q.role, resolver.queues[pos.queue].0, w, pos.bb)
            .ok()?;
        let mut img = [0u8; 64];
        img.copy_from_slice(bytes.get(..64)?);
        out.insert(label.to_string(), img);
    }
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_masked_cas_is_followed_bit_by_bit() {
        // Compare only the low byte; swap the opcode byte's low nibble only.
        let t = Transfer::Cas {
            label: "x".into(),
            compare: Word::exact(0x11),
            compare_mask: 0xff,
            swap: Word::exact(0x0000_0000_0a00_0000),
            swap_mask: 0x0000_0000_0f00_0000,
        };
        let r = t.apply(Word::exact(0x0000_0000_f000_0011)).unwrap();
        assert_eq!(r.value, 0x0000_0000_fa00_0011);
        assert_eq!(r.known, u64::MAX);
        assert!(t.apply(Word::exact(0x12)).is_none(), "no match, no swap");
        // An unknown low byte may match.
        let unknown = Word {
            value: 0,
            known: !0xff,
        };
        assert!(t.apply(unknown).is_some());
    }

    #[test]
    fn a_swap_keeps_what_is_unknown_outside_its_mask_and_unknown_swap_bits_inside() {
        // The word's opcode byte is unknown; the swap replaces the ds byte only.
        let word = Word {
            value: 0x3300_0000_0000_0011,
            known: !0x0000_0000_ff00_0000,
        };
        let t = Transfer::Cas {
            label: "x".into(),
            compare: Word::exact(0x11),
            compare_mask: 0xff,
            swap: Word {
                value: 0x0400_0000_0000_0000,
                // Bits outside the mask are known in the swap too: they must not leak.
                known: 0x0f00_0000_ffff_ffff,
            },
            swap_mask: 0xff00_0000_0000_0000,
        };
        let r = t.apply(word).unwrap();
        // Outside the mask: the word's own bits, known where they were known.
        assert_eq!(
            r.known & 0x00ff_ffff_ffff_ffff,
            word.known & 0x00ff_ffff_ffff_ffff
        );
        assert_eq!(r.value & 0x00ff_ffff_ffff_ffff, 0x11);
        // Inside it: the swap's bits, known only where the swap's are.
        assert_eq!(r.known >> 56, 0x0f);
        assert_eq!((r.value >> 56) & 0x0f, 0x04);
    }

    /// A control word: opmod, opcode and ds where a CAS reads them, index and QPN zero.
    fn ctrl(opmod: u8, opcode: Opcode, ds: u8) -> Word {
        Word::exact(u64::from(opmod) | (u64::from(opcode as u8) << 24) | (u64::from(ds) << 56))
    }

    fn write_with(sges: usize) -> Op {
        Op::Write {
            remote: Addr::region("r", 0),
            sgl: (0..sges)
                .map(|_| Sge::new(Addr::region("r", 0), 8))
                .collect(),
            imm: None,
        }
    }

    #[test]
    fn judge_allows_the_own_operation_and_a_nop_over_the_same_blocks_only() {
        let write = write_with(2); // ds 4: one block
        let own_ds = write.ds();
        assert_eq!(own_ds, 4);
        assert_eq!(judge(&write, own_ds, ctrl(0, Opcode::RdmaWrite, 4)), None);
        // A NOP over the same block, with any ds that keeps the block count.
        assert_eq!(judge(&write, own_ds, ctrl(0, Opcode::Nop, 1)), None);
        assert_eq!(judge(&write, own_ds, ctrl(0, Opcode::Nop, 4)), None);
        let refused = |w: Word| judge(&write, own_ds, w).is_some();
        // ds 0, and a ds over another block count (5 segments: two blocks).
        assert!(refused(ctrl(0, Opcode::Nop, 0)));
        assert!(refused(ctrl(0, Opcode::RdmaWrite, 0)));
        assert!(refused(ctrl(0, Opcode::Nop, 5)));
        // Active: fewer segments than a WRITE needs, or more than the WQE holds.
        assert!(refused(ctrl(0, Opcode::RdmaWrite, 1)));
        let short = write_with(0); // ds 2 in a one-block WQE
        assert!(judge(&short, 2, ctrl(0, Opcode::RdmaWrite, 3)).is_some());
        assert_eq!(judge(&short, 2, ctrl(0, Opcode::RdmaWrite, 2)), None);
        // A NOP WQE has no segments to check: any ds over its one block.
        assert_eq!(judge(&Op::Nop, 1, ctrl(0, Opcode::Nop, 3)), None);
        // Another opcode, or an unknown opcode or ds byte.
        assert!(refused(ctrl(0, Opcode::RdmaRead, 4)));
        let mut w = ctrl(0, Opcode::RdmaWrite, 4);
        w.known &= !(0xff << 24);
        assert!(refused(w));
        let mut w = ctrl(0, Opcode::RdmaWrite, 4);
        w.known &= !(0xff << 56);
        assert!(refused(w));
    }

    #[test]
    fn a_masked_cas_must_keep_its_width() {
        let cas = Op::MaskedCas {
            remote: Addr::region("r", 0),
            compare: redn_program::program::Operand::Lit(0),
            compare_mask: 0,
            swap: redn_program::program::Operand::Lit(0),
            swap_mask: 0,
        };
        let own_ds = cas.ds();
        let w = |opmod| ctrl(opmod, Opcode::AtomicMaskedCs, own_ds);
        assert_eq!(judge(&cas, own_ds, w(OPMOD_EXT_ATOMIC_8B)), None);
        assert!(judge(&cas, own_ds, w(0x08)).is_some());
        let mut unknown = w(OPMOD_EXT_ATOMIC_8B);
        unknown.known &= !0xff;
        assert!(judge(&cas, own_ds, unknown).is_some());
        // As a NOP its opmod does not matter.
        assert_eq!(judge(&cas, own_ds, ctrl(0x08, Opcode::Nop, own_ds)), None);
    }

    #[test]
    fn exploration_gives_up_past_max_states() {
        let write = write_with(2);
        let start = ctrl(0, Opcode::RdmaWrite, 4).value;
        // Each WRITE of a constant control word that differs only in its index bytes adds
        // one value; with the start, `n` writes reach n + 1 values.
        let sets = |n: u64| -> Vec<Transfer> {
            (1..=n)
                .map(|i| Transfer::Set {
                    label: format!("w{i}"),
                    value: start | (i << 8),
                })
                .collect()
        };
        let at_cap = sets(MAX_STATES as u64 - 1);
        assert!(matches!(explore(&write, start, &at_cap), Ok(None)));
        let over = sets(MAX_STATES as u64);
        assert_eq!(explore(&write, start, &over).err(), Some(MAX_STATES + 1));
    }

    #[test]
    fn a_clobber_forgets_its_bits_and_keeps_the_rest() {
        let t = Transfer::Clobber {
            source: "trigger".into(),
            bits: 0x0000_0000_ffff_ff00,
        };
        let r = t.apply(Word::exact(0x0102_0304_0506_0708)).unwrap();
        assert_eq!(r.known, !0x0000_0000_ffff_ff00);
        assert_eq!(r.value & r.known, 0x0102_0304_0000_0008);
        assert_eq!(r.render(), "08 ?? ?? ?? 04 03 02 01");
        let t = Transfer::Set {
            label: "w".into(),
            value: 7,
        };
        assert_eq!(t.apply(r), Some(Word::exact(7)));
    }

    #[test]
    fn operand_bytes_map_to_the_value_big_endian() {
        // Byte 40 (first of a compare at 40) is the value's most significant byte.
        assert_eq!(operand_bits(40, 41, 40), 0xff << 56);
        assert_eq!(operand_bits(47, 48, 40), 0xff);
        assert_eq!(operand_bits(30, 50, 40), u64::MAX);
        assert_eq!(operand_bits(10, 20, 40), 0);
        assert_eq!(bits_of(3, 4), 0xff << 24);
        assert_eq!(bits_of(6, 12), 0xffff << 48);
    }
}
