//! The checker's state (the program, the grants, where each WQE sits, the patch points by
//! the WQE they patch, the code layout, the findings so far) and [`Checker::find`], the one
//! way a pass records a finding. Every pass is an `impl Checker` block in the module named
//! for its concern. Passes only append findings; only `control_words` reads those so far
//! (it reports an unrenderable program only if no pass before it found anything).

use super::{Finding, Grants, Rule};
use redn_program::program::{CodeLayout, Program, WqePos};
use std::collections::HashMap;

/// Where each WQE sits, by label.
pub(super) struct Index<'p> {
    p: &'p Program,
    pub(super) at: HashMap<&'p str, WqePos>,
}

impl<'p> Index<'p> {
    pub(super) fn new(p: &'p Program) -> Index<'p> {
        Index {
            p,
            at: p.wqe_positions(),
        }
    }

    pub(super) fn wqe(&self, label: &str) -> Option<(usize, u64, &'p redn_program::program::Wqe)> {
        let pos = *self.at.get(label)?;
        Some((pos.queue, pos.bb, self.p.wqe_at(pos)?))
    }
}

pub(super) struct Checker<'a> {
    pub(super) p: &'a Program,
    pub(super) g: &'a Grants,
    pub(super) idx: Index<'a>,
    /// The program's patch points by the WQE they patch, built once: a large program has
    /// thousands, and each write into a WQE looks at that WQE's only.
    pub(super) patches: HashMap<&'a str, Vec<&'a redn_program::program::PatchPoint>>,
    /// Where each ring lies in the code region, to name the bytes a refused write would
    /// need a key over (`None` if the program cannot be laid out; another pass says why).
    pub(super) layout: Option<CodeLayout>,
    pub(super) out: Vec<Finding>,
}

impl Checker<'_> {
    pub(super) fn find(
        &mut self,
        queue: Option<&str>,
        wqe: Option<(u64, &str)>,
        field: &str,
        rule: Rule,
        detail: String,
    ) {
        self.out.push(Finding {
            queue: queue.map(str::to_string),
            wqe: wqe.map(|(i, l)| (i, l.to_string())),
            field: field.into(),
            rule,
            detail,
        });
    }
}
