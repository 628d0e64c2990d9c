//! The offload verifier, modelled on the eBPF verifier: an offload program is admitted for a
//! client only if every WQE provably stays inside what the client was granted.
//!
//! RedN's own instructions ask users to turn off the NIC's WQE checks; this pass is what makes
//! self-modifying chains safe to run for several tenants. It checks, statically:
//!
//! - **structure**: every WAIT / SEND_EN / RECV_EN and every entry names a queue of the
//!   program (no queue or CQ it does not own), enables only managed queues, and every WQE can
//!   be enabled (none unreachable);
//! - **each WQE**: its opcode is on the allow-list (no UMR, LOCAL_INVAL, CONFIG_CMD, ...);
//!   every key names a region granted to the client with the right the opcode needs, on the
//!   right side of the connection; every static address range lies inside its region; atomic
//!   targets are 8-byte aligned;
//! - **self-modification**: every write into a WQE (receive scatter, READ scatter, CAS, atomic
//!   result, WRITE) lands inside its WQE's blocks and a declared patch point of that source;
//!   no patch point runs past its WQE's blocks or covers a key, a QP or CQ number, the ds or
//!   flag bytes, reserved bytes, a byte count's top byte (its inline bit) or an opcode —
//!   except the operand bytes of a conditional WQE
//!   and a CAS whose swap is a static control image of an allowed opcode with the queue's real
//!   numbers (RedN's `if`, `else`, `break`);
//! - **control words** (`verifier::control`): every value each WQE's first 8 bytes can reach, over
//!   every order of every write into them (CASes computed bitwise under their masks), is the
//!   WQE's own operation or a NOP over the same blocks (a WRITE of a NOP template counts as a
//!   constant only while no patch point covers its remote address or data segment);
//! - **bounds**: queue count, ring sizes and code bytes within limits (before anything is
//!   allocated); in a bounded program every count static and no enable past its ring, and
//!   the worst trigger (`verifier::bounds`: the WQEs each trigger runs, not an average), the install
//!   and the responses to one trigger within the policy; a recycled loop needs a budget that
//!   the manager's auditor enforces at run time;
//! - **fences**: a WQE that uses bytes an earlier READ or atomic of its queue brings carries
//!   the fence flag (or waits for that completion), as a ConnectX needs;
//! - **index windows** (`verifier::window`): every count stays within half the range the
//!   hardware compares it modulo (2^16 queue indices, 2^24 CQ counts), and a recycled
//!   count moves by a bounded step each round from a counter that starts inside the window.
//!
//! Addresses and lengths patched at run time (a bucket address, say) cannot be checked
//! here; the keys can, and the NIC checks every access against them. The installer's narrow
//! keys (`redn_sys::install`) make that check exact: no key a program holds spans more than
//! the patch points or static blocks it may write, so a patched address ends in a
//! protection error, never in memory outside the grant or bytes outside a patch point.
//!
//! Findings are data ([`Finding`]) and render one per line like the eBPF verifier's log,
//! followed by a stats line; the log is never truncated.
//!
//! Each check lives in the module named for it: `verifier::checker` holds the checker's
//! state, `verifier::structure`, `verifier::wqes`, `verifier::patches`,
//! `verifier::control`, `verifier::bounds`, `verifier::fences` and `verifier::window` one
//! concern each (an `impl Checker` block apiece); [`verify`] runs them in order.

mod bounds;
mod checker;
mod control;
mod fences;
mod patches;
mod structure;
mod window;
mod wqes;

use checker::{Checker, Index};
use redn_program::program::{Iterations, Op, PatchSource, Program};
use redn_program::wqe::{off, Opcode, SEG_SIZE};
use redn_program::Access;
use std::collections::BTreeMap;
use std::fmt;

// Byte offsets inside a WQE are `u32` (as `PatchPoint::byte` is). The two offsets taken from
// `redn_program::wqe` are small (16 and 24), so these casts cannot truncate; the assertion
// below checks it when compiling.
/// [`SEG_SIZE`] as a byte offset.
#[allow(clippy::cast_possible_truncation)]
const SEG_BYTES: u32 = SEG_SIZE as u32;
/// [`off::WAIT_PI`] as a byte offset.
#[allow(clippy::cast_possible_truncation)]
const WAIT_PI_BYTE: u32 = off::WAIT_PI as u32;
const _: () = assert!(SEG_BYTES as usize == SEG_SIZE && WAIT_PI_BYTE as usize == off::WAIT_PI);

/// What a client may use: the regions bound for it and the limits of its policy.
///
/// Start from [`Grants::new`], add regions with [`Grants::with_region`] and set the limits
/// as fields.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct Grants {
    /// Regions by the name the program binds, with the rights granted and their length.
    pub regions: BTreeMap<String, RegionGrant>,
    /// Most WQEs one invocation may run.
    pub max_wqes_per_invocation: u32,
    /// Largest send ring, in 64-byte BBs.
    pub max_ring_bbs: u32,
    /// Largest receive ring, in slots.
    pub max_rq_slots: u32,
    /// Most queues per offload instance.
    pub max_queues: usize,
    /// Most bytes of code region (rings and static blocks) per instance, checked before
    /// anything is allocated.
    pub max_code_bytes: u64,
    /// Most responses (WRITEs to the client) one trigger may send.
    pub max_responses_per_trigger: u32,
    /// WQEs per second a recycled loop may run, enforced by the auditor; `None` refuses
    /// recycled loops.
    pub loop_budget: Option<u64>,
}

/// One granted region.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct RegionGrant {
    /// Rights granted.
    pub access: Access,
    /// Length in bytes.
    pub len: u64,
}

impl Grants {
    /// Limits with no regions, suitable defaults for tests: 64 WQEs per invocation, 64 Ki-BB
    /// rings, 8 queues, 64 MiB of code, no loops.
    pub fn new() -> Grants {
        Grants {
            regions: BTreeMap::new(),
            max_wqes_per_invocation: 64,
            max_ring_bbs: 1 << 16,
            max_rq_slots: 1 << 16,
            max_queues: 8,
            max_code_bytes: 64 << 20,
            max_responses_per_trigger: 16,
            loop_budget: None,
        }
    }

    /// Grant `name` with `access` over `len` bytes.
    #[must_use = "with_region returns the grants with the region added"]
    pub fn with_region(mut self, name: &str, access: Access, len: u64) -> Grants {
        self.regions
            .insert(name.into(), RegionGrant { access, len });
        self
    }
}

impl Default for Grants {
    fn default() -> Self {
        Grants::new()
    }
}

/// The verifier's rules. [`Rule::id`] is what the log shows and tests match.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
#[non_exhaustive]
pub enum Rule {
    /// A WAIT, ENABLE, entry or patch names a queue, WQE or parameter the program lacks.
    UnknownName,
    /// SEND_EN of a queue that is not managed (or RECV_EN of one whose receives are not).
    EnableUnmanaged,
    /// A WQE no enable or doorbell ever reaches.
    Unreachable,
    /// An opcode outside the allow-list.
    Opcode,
    /// A key names a region not granted to the client.
    KeyNotGranted,
    /// A granted region lacks the right the opcode needs.
    MissingRight,
    /// A static address range is not inside its region.
    OutOfRegion,
    /// A region used from the wrong side: app memory through the client's connection, the
    /// client's buffer as local memory, or a read or atomic aimed at the client.
    WrongSide,
    /// An atomic target not 8-byte aligned.
    Misaligned,
    /// A write into a WQE outside every patch point declared for its source.
    UndeclaredPatch,
    /// A patch point covers a key, a QP/CQ number, ds, flags, reserved bytes, a byte
    /// count's inline bit or an opcode.
    ProtectedField,
    /// A CAS on a control word whose swap is not a static image of an allowed opcode with
    /// real numbers, or whose compare may be patched outside the operand bytes.
    UnsafeSwap,
    /// A control image that changes a WQE's size (ds) in a way it cannot hold.
    BadDs,
    /// More WQEs per invocation than the policy allows, or more than declared.
    WqeBudget,
    /// A recycled loop without a run-time budget, or a loop in a bounded program: a count
    /// a patch point may change, or an enable past its ring.
    UnboundedLoop,
    /// A ring, receive queue or queue count over the limits.
    Size,
    /// A WQE that uses bytes an earlier READ or atomic of its queue brings, without the
    /// fence flag: on a ConnectX it may run before those bytes land.
    MissingFence,
    /// A WAIT, SEND_EN, RECV_EN or entry count that may lie half the index range the
    /// hardware compares it in (2^15 BBs or receives, 2^23 completions) or more from its
    /// queue's index, or a recycled count whose step cannot be bounded (`verifier::window`).
    IndexWindow,
}

impl Rule {
    /// Short stable id.
    pub fn id(self) -> &'static str {
        match self {
            Rule::UnknownName => "unknown-name",
            Rule::EnableUnmanaged => "enable-unmanaged",
            Rule::Unreachable => "unreachable",
            Rule::Opcode => "opcode",
            Rule::KeyNotGranted => "key-not-granted",
            Rule::MissingRight => "missing-right",
            Rule::OutOfRegion => "out-of-region",
            Rule::WrongSide => "wrong-side",
            Rule::Misaligned => "misaligned",
            Rule::UndeclaredPatch => "undeclared-patch",
            Rule::ProtectedField => "protected-field",
            Rule::UnsafeSwap => "unsafe-swap",
            Rule::BadDs => "bad-ds",
            Rule::WqeBudget => "wqe-budget",
            Rule::UnboundedLoop => "unbounded-loop",
            Rule::Size => "size",
            Rule::MissingFence => "missing-fence",
            Rule::IndexWindow => "index-window",
        }
    }
}

impl fmt::Display for Rule {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.id())
    }
}

/// One reason to refuse a program.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct Finding {
    /// The queue, when the finding is about one.
    pub queue: Option<String>,
    /// The WQE: its index (BB position) and label.
    pub wqe: Option<(u64, String)>,
    /// The field (`opcode`, `rkey`, `sgl[1]`, `bytes 24..28`, ...).
    pub field: String,
    /// The rule broken.
    pub rule: Rule,
    /// What exactly.
    pub detail: String,
}

impl fmt::Display for Finding {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if let Some(q) = &self.queue {
            write!(f, "queue {q}: ")?;
        }
        if let Some((i, l)) = &self.wqe {
            write!(f, "wqe {i} ({l}): ")?;
        }
        write!(f, "{}: {}: {}", self.field, self.rule, self.detail)
    }
}

/// Counts for the stats line.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
#[non_exhaustive]
pub struct Stats {
    /// WQEs checked.
    pub wqes: usize,
    /// The policy's limit on the WQEs one invocation (a trigger, or the install) runs; the
    /// program as a whole may hold more.
    pub limit: u32,
    /// Queues.
    pub queues: usize,
    /// Patch points.
    pub patch_points: usize,
    /// Recycled loops.
    pub loops: usize,
}

/// The verifier's verdict.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
#[must_use = "the report says whether the program may be installed"]
pub struct Report {
    /// The program's name.
    pub program: String,
    /// Every reason to refuse it (empty: accepted).
    pub findings: Vec<Finding>,
    /// What was checked.
    pub stats: Stats,
}

impl Report {
    /// True if the program may be installed.
    #[must_use]
    pub fn accepted(&self) -> bool {
        self.findings.is_empty()
    }

    /// True if some finding broke `rule`.
    #[must_use]
    pub fn broke(&self, rule: Rule) -> bool {
        self.findings.iter().any(|f| f.rule == rule)
    }

    /// The verifier log: one line per finding, then the verdict and the stats line.
    pub fn log(&self) -> String {
        let mut s = String::new();
        for f in &self.findings {
            s.push_str(&f.to_string());
            s.push('\n');
        }
        s.push_str(&format!(
            "{}: {}\nchecked {} wqes (limit {} per invocation) queues {} patch_points {} loops {}\n",
            self.program,
            if self.accepted() {
                "accepted".to_string()
            } else {
                format!("refused ({} findings)", self.findings.len())
            },
            self.stats.wqes,
            self.stats.limit,
            self.stats.queues,
            self.stats.patch_points,
            self.stats.loops
        ));
        s
    }
}

/// Opcodes a program may contain.
pub const ALLOWED_OPCODES: [Opcode; 12] = [
    Opcode::Nop,
    Opcode::RdmaWrite,
    Opcode::RdmaWriteImm,
    Opcode::Send,
    Opcode::SendImm,
    Opcode::RdmaRead,
    Opcode::AtomicCs,
    Opcode::AtomicFa,
    Opcode::AtomicMaskedCs,
    Opcode::Wait,
    Opcode::SendEn,
    Opcode::RecvEn,
];

fn allowed(opcode: u8) -> bool {
    ALLOWED_OPCODES.iter().any(|o| *o as u8 == opcode)
}

fn overlap(a: (u32, u32), b: (u32, u32)) -> bool {
    a.0 < b.1 && b.0 < a.1
}

fn min_ds(op: &Op) -> u8 {
    match op {
        Op::Nop | Op::Other { .. } => 1,
        Op::Write { .. }
        | Op::Read { .. }
        | Op::Wait { .. }
        | Op::SendEn { .. }
        | Op::RecvEn { .. } => 2,
        Op::Cas { .. } | Op::Faa { .. } => 3,
        Op::MaskedCas { .. } => 4,
    }
}

fn source_name(s: &PatchSource) -> String {
    match s {
        PatchSource::Trigger { param } => format!("trigger parameter {param:?}"),
        PatchSource::Read { label } => format!("READ {label:?}"),
        PatchSource::Cas { label } => format!("CAS {label:?}"),
        PatchSource::AtomicResult { label } => format!("the result of {label:?}"),
        PatchSource::Write { label } => format!("WRITE {label:?}"),
    }
}

/// Verify `program` for a client with `grants`.
pub fn verify(program: &Program, grants: &Grants) -> Report {
    let mut c = Checker {
        p: program,
        g: grants,
        idx: Index::new(program),
        patches: program.patches_by_wqe(),
        layout: program.layout().ok(),
        out: Vec::new(),
    };
    c.structure();
    c.sizes_and_budget();
    c.wqes();
    c.patch_points();
    c.control_words();
    c.execution_bounds();
    c.fences();
    c.index_windows();
    let loops = usize::from(matches!(program.iterations, Iterations::Recycled { .. }));
    Report {
        program: program.name.clone(),
        findings: c.out,
        stats: Stats {
            wqes: program.wqe_count(),
            limit: grants.max_wqes_per_invocation,
            queues: program.queues.len(),
            patch_points: program.patches.len(),
            loops,
        },
    }
}
