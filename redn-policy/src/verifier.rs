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

mod bounds;
mod control;
mod window;

use redn_program::program::{
    Addr, CodeLayout, Form, Iterations, Op, Operand, PatchSource, Program, QueueRole, RegionRole,
    Resolver, Sge, Slots, WqePos,
};
use redn_program::wqe::{off, Opcode, BB_SIZE, SEG_SIZE};
use redn_program::Access;
use std::collections::{BTreeMap, HashMap};
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
    /// A recycled loop without a run-time budget.
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
    /// The per-invocation limit.
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
            "{}: {}\nchecked {} wqes (limit {}) queues {} patch_points {} loops {}\n",
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

/// Where each WQE sits, by label.
struct Index<'p> {
    p: &'p Program,
    at: HashMap<&'p str, WqePos>,
}

impl<'p> Index<'p> {
    fn new(p: &'p Program) -> Index<'p> {
        Index {
            p,
            at: p.wqe_positions(),
        }
    }

    fn wqe(&self, label: &str) -> Option<(usize, u64, &'p redn_program::program::Wqe)> {
        let pos = *self.at.get(label)?;
        Some((pos.queue, pos.bb, self.p.wqe_at(pos)?))
    }
}

struct Checker<'a> {
    p: &'a Program,
    g: &'a Grants,
    idx: Index<'a>,
    /// The program's patch points by the WQE they patch, built once: a large program has
    /// thousands, and each write into a WQE looks at that WQE's only.
    patches: HashMap<&'a str, Vec<&'a redn_program::program::PatchPoint>>,
    /// Where each ring lies in the code region, to name the bytes a refused write would
    /// need a key over (`None` if the program cannot be laid out; another pass says why).
    layout: Option<CodeLayout>,
    out: Vec<Finding>,
}

/// Byte ranges of a WQE that nothing but the installer may write, with their names.
fn protected(op: &Op) -> Vec<(u32, u32, &'static str)> {
    let mut v = vec![
        (3, 4, "opcode"),
        (7, 8, "ds"),
        (8, 12, "signature and flags"),
        (0, 3, "opmod and index"),
        (4, 7, "QPN"),
    ];
    let ds = u32::from(op.ds());
    match op {
        Op::Write { .. }
        | Op::Read { .. }
        | Op::Cas { .. }
        | Op::MaskedCas { .. }
        | Op::Faa { .. } => {
            v.push((24, 28, "rkey"));
            v.push((28, 32, "reserved"));
        }
        Op::Wait { .. } | Op::SendEn { .. } | Op::RecvEn { .. } => {
            v.push((16, 24, "reserved"));
            v.push((28, 32, "object number (QP/CQ)"));
        }
        _ => {}
    }
    let first_data = match op {
        Op::Write { .. } | Op::Read { .. } => Some(2),
        Op::Cas {
            result: Some(_), ..
        }
        | Op::Faa {
            result: Some(_), ..
        } => Some(3),
        _ => None,
    };
    if let Some(first) = first_data {
        for s in first..ds {
            let b = s * SEG_BYTES;
            // Bit 31 of a byte count makes the segment inline (mlx5's MLX5_INLINE_SEG, which
            // a ConnectX honours as the softnic does): the WQE's own bytes become the data,
            // and a WRITE sends them (its keys and addresses) to the peer.
            v.push((b, b + 1, "byte count's inline bit"));
            v.push((b + 4, b + 8, "lkey"));
        }
    }
    // A WQE has at most 16 BBs; were it ever too long for a u32, the padding would still
    // run to the end.
    let end = u32::try_from(op.bbs() * 64).unwrap_or(u32::MAX);
    v.push((ds * SEG_BYTES, end, "padding"));
    v
}

fn overlap(a: (u32, u32), b: (u32, u32)) -> bool {
    a.0 < b.1 && b.0 < a.1
}

impl<'a> Checker<'a> {
    fn find(
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

    fn queue_exists(&self, name: &str) -> Option<&'a redn_program::program::Queue> {
        self.p.queues.iter().find(|q| q.name == name)
    }

    fn structure(&mut self) {
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

    fn sizes_and_budget(&mut self) {
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

    /// Check one address range used by `q`'s WQE; `remote` for the remote side of an op.
    #[allow(clippy::too_many_arguments)]
    fn range(
        &mut self,
        q: &redn_program::program::Queue,
        here: (u64, &str),
        field: &str,
        a: &Addr,
        len: u64,
        need: Access,
        remote: bool,
    ) {
        let qn = Some(q.name.as_str());
        match a {
            Addr::Region { region, offset } => {
                let decl = self.p.regions.iter().find(|r| &r.name == region);
                let is_response = matches!(decl.map(|d| &d.role), Some(RegionRole::Response));
                if decl.is_none() {
                    self.find(
                        qn,
                        Some(here),
                        field,
                        Rule::UnknownName,
                        format!("region {region:?} is not declared by the program"),
                    );
                    return;
                }
                // Which side may name which region.
                if remote && q.role == QueueRole::Client && !is_response {
                    self.find(
                        qn,
                        Some(here),
                        field,
                        Rule::WrongSide,
                        format!(
                            "region {region:?} is app memory, but this queue's peer is the client"
                        ),
                    );
                    return;
                }
                if is_response && !(remote && q.role == QueueRole::Client) {
                    self.find(qn, Some(here), field, Rule::WrongSide, format!("region {region:?} is the client's buffer: only the client-facing queue may write it"));
                    return;
                }
                let Some(grant) = self.g.regions.get(region) else {
                    self.find(
                        qn,
                        Some(here),
                        field,
                        Rule::KeyNotGranted,
                        format!("region {region:?} is not granted to this client"),
                    );
                    return;
                };
                if !grant.access.contains(need) {
                    self.find(
                        qn,
                        Some(here),
                        field,
                        Rule::MissingRight,
                        format!(
                            "region {region:?} is granted {} but needs {need}",
                            grant.access
                        ),
                    );
                }
                if offset.checked_add(len).map_or(true, |end| end > grant.len) {
                    self.find(
                        qn,
                        Some(here),
                        field,
                        Rule::OutOfRegion,
                        format!(
                            "{region}+{offset}..+{len} is outside the {}-byte region",
                            grant.len
                        ),
                    );
                }
            }
            Addr::Static { name, offset } => {
                match self.p.statics.iter().find(|s| &s.name == name) {
                    None => self.find(
                        qn,
                        Some(here),
                        field,
                        Rule::UnknownName,
                        format!("static block {name:?} does not exist"),
                    ),
                    Some(s)
                        if offset
                            .checked_add(len)
                            .map_or(true, |e| e > s.bytes.len() as u64) =>
                    {
                        self.find(
                            qn,
                            Some(here),
                            field,
                            Rule::OutOfRegion,
                            format!(
                                "static {name}+{offset}..+{len} is outside its {} bytes",
                                s.bytes.len()
                            ),
                        );
                    }
                    Some(_) if remote && q.role == QueueRole::Client => {
                        self.find(
                            qn,
                            Some(here),
                            field,
                            Rule::WrongSide,
                            "the code region is not reachable through the client's connection"
                                .into(),
                        );
                    }
                    Some(_) => {}
                }
            }
            Addr::Wqe { label, byte } => match self.idx.wqe(label) {
                None => self.find(
                    qn,
                    Some(here),
                    field,
                    Rule::UnknownName,
                    format!("WQE {label:?} does not exist"),
                ),
                Some((_, _, w)) => {
                    if u64::from(*byte) + len > w.op.bbs() * 64 {
                        self.find(
                            qn,
                            Some(here),
                            field,
                            Rule::OutOfRegion,
                            format!("{label}@{byte}..+{len} is outside that WQE"),
                        );
                    }
                    if remote && q.role == QueueRole::Client {
                        self.find(
                            qn,
                            Some(here),
                            field,
                            Rule::WrongSide,
                            "the code region is not reachable through the client's connection"
                                .into(),
                        );
                    }
                }
            },
        }
    }

    /// A write of `len` bytes at `a` by `source`: if it lands in a WQE, it must be inside a
    /// declared patch point of that source.
    fn code_write(
        &mut self,
        qn: &str,
        here: Option<(u64, &str)>,
        field: &str,
        a: &Addr,
        len: u64,
        source: &PatchSource,
    ) {
        let Addr::Wqe { label, byte } = a else { return };
        let (b, e) = (u64::from(*byte), u64::from(*byte).saturating_add(len));
        // The write may be covered by several adjacent patch points of the same source:
        // sweep them in order of their first byte (lengths come from files; no byte maps).
        let mut points: Vec<(u64, u64)> = self
            .patches
            .get(label.as_str())
            .into_iter()
            .flatten()
            .filter(|pp| &pp.source == source)
            .map(|pp| (u64::from(pp.byte), u64::from(pp.byte) + u64::from(pp.len)))
            .collect();
        points.sort_unstable();
        let mut covered_to = b;
        for (from, to) in points {
            if from > covered_to {
                break;
            }
            covered_to = covered_to.max(to);
        }
        if covered_to < e {
            self.find(
                Some(qn),
                here,
                field,
                Rule::UndeclaredPatch,
                format!(
                    "writes {label}@{b}..{e} outside every patch point declared for {}{}: \
                     the installer grants no key over them",
                    source_name(source),
                    self.code_bytes(label, b, e)
                ),
            );
        }
    }

    /// `, code bytes X..Y`: where bytes `from..to` of WQE `label` lie in the code region,
    /// which a key would have to cover to write them.
    fn code_bytes(&self, label: &str, from: u64, to: u64) -> String {
        let Some(layout) = &self.layout else {
            return String::new();
        };
        let Some(&pos) = self.idx.at.get(label) else {
            return String::new();
        };
        let at = layout.sq.get(pos.queue).and_then(|&sq| {
            let wqe = u64::try_from(sq)
                .ok()?
                .checked_add(pos.bb.checked_mul(BB_SIZE as u64)?)?;
            Some((wqe.checked_add(from)?, wqe.checked_add(to)?))
        });
        match at {
            Some((x, y)) => format!(" (code bytes {x}..{y})"),
            None => String::new(),
        }
    }

    fn ctrl_operand_ok(
        &mut self,
        qn: &str,
        here: (u64, &str),
        field: &str,
        o: &Operand,
        target: &str,
        what: &str,
    ) {
        let Some((_, _, t)) = self.idx.wqe(target) else {
            return;
        };
        match o {
            Operand::Lit(_) => self.find(
                Some(qn),
                Some(here),
                field,
                Rule::UnsafeSwap,
                format!("{what} of a control word must be a control image, not a literal"),
            ),
            Operand::Ctrl {
                label,
                form,
                slots,
                ds,
            } => {
                if label != target {
                    self.find(
                        Some(qn),
                        Some(here),
                        field,
                        Rule::UnsafeSwap,
                        format!("{what} is the image of {label:?}, not of the target {target:?}"),
                    );
                }
                if *form == Form::Active && !allowed(t.op.opcode_byte()) {
                    self.find(
                        Some(qn),
                        Some(here),
                        field,
                        Rule::UnsafeSwap,
                        format!(
                            "{what} installs opcode {:#04x}, which is not allowed",
                            t.op.opcode_byte()
                        ),
                    );
                }
                if what == "swap" && *form == Form::Active && *slots != Slots::Real {
                    self.find(Some(qn), Some(here), field, Rule::UnsafeSwap, format!("swap installs an active {} with an operand in its QPN and index bytes instead of the queue's own", t.op.opcode().name()));
                }
                if let Some(d) = ds {
                    let own = t.op.ds();
                    let min = if *form == Form::Active {
                        min_ds(&t.op)
                    } else {
                        1
                    };
                    if *d > own || *d < min {
                        self.find(Some(qn), Some(here), field, Rule::BadDs, format!("{what} sets ds {d}; {target:?} holds {own} segments and its opcode needs at least {min}"));
                    }
                }
            }
        }
    }

    fn wqes(&mut self) {
        let p = self.p;
        for q in &p.queues {
            let qn = q.name.as_str();
            let mut pos = 0u64;
            for w in &q.wqes {
                let here = (pos, w.label.as_str());
                let byte = w.op.opcode_byte();
                if !allowed(byte) {
                    self.find(
                        Some(qn),
                        Some(here),
                        "opcode",
                        Rule::Opcode,
                        format!("opcode {byte:#04x} is not on the allow-list"),
                    );
                } else if let Op::Other { .. } = &w.op {
                    // A raw opcode (from a definition's `opcode = 0x..`) has no operands to check.
                    self.find(
                        Some(qn),
                        Some(here),
                        "opcode",
                        Rule::Opcode,
                        format!(
                            "raw opcode {byte:#04x} carries no operands the verifier can check"
                        ),
                    );
                }
                let src = |l: &str| l.to_string();
                match &w.op {
                    Op::Write { remote, sgl, .. } => {
                        let len: u64 = sgl.iter().map(|s| u64::from(s.len)).sum();
                        self.range(q, here, "raddr", remote, len, Access::REMOTE_WRITE, true);
                        if let Addr::Wqe { .. } = remote {
                            self.code_write(
                                qn,
                                Some(here),
                                "raddr",
                                remote,
                                len,
                                &PatchSource::Write {
                                    label: src(&w.label),
                                },
                            );
                        }
                        for (i, s) in sgl.iter().enumerate() {
                            self.range(
                                q,
                                here,
                                &format!("sgl[{i}]"),
                                &s.addr,
                                u64::from(s.len),
                                Access::NONE,
                                false,
                            );
                            // Ring bytes hold keys and addresses: they never leave the server.
                            if q.role == QueueRole::Client && matches!(s.addr, Addr::Wqe { .. }) {
                                self.find(
                                    Some(qn),
                                    Some(here),
                                    &format!("sgl[{i}]"),
                                    Rule::WrongSide,
                                    "WQE bytes are never a source of data sent to the client"
                                        .into(),
                                );
                            }
                        }
                    }
                    Op::Read { remote, sgl } => {
                        let len: u64 = sgl.iter().map(|s| u64::from(s.len)).sum();
                        if q.role == QueueRole::Client {
                            self.find(Some(qn), Some(here), "opcode", Rule::WrongSide, "READ through the client's connection would read the client's memory".into());
                        }
                        self.range(q, here, "raddr", remote, len, Access::REMOTE_READ, true);
                        for (i, s) in sgl.iter().enumerate() {
                            self.local_write(
                                q,
                                here,
                                &format!("sgl[{i}]"),
                                s,
                                PatchSource::Read {
                                    label: src(&w.label),
                                },
                            );
                        }
                    }
                    Op::Cas {
                        remote,
                        compare,
                        swap,
                        result,
                    } => self.cas(q, here, &w.label, remote, compare, swap, result.as_ref()),
                    Op::MaskedCas {
                        remote,
                        compare,
                        swap,
                        ..
                    } => self.cas(q, here, &w.label, remote, compare, swap, None),
                    Op::Faa { remote, result, .. } => {
                        if let Addr::Wqe { .. } = remote {
                            self.find(Some(qn), Some(here), "raddr", Rule::ProtectedField, "FETCH_ADD aimed at a WQE (WQE fields are big-endian; use a counter and land its old value)".into());
                        }
                        self.atomic_common(q, here, remote, result.as_ref(), &w.label);
                    }
                    Op::Nop
                    | Op::Wait { .. }
                    | Op::SendEn { .. }
                    | Op::RecvEn { .. }
                    | Op::Other { .. } => {}
                }
                pos += w.op.bbs();
            }
            // Receives: their scatter lists write what the client sends.
            for (i, r) in q.recvs.iter().enumerate() {
                let field = format!("recv[{i}]");
                let mut at = 0u64;
                for s in &r.sgl {
                    let param = self
                        .p
                        .params
                        .iter()
                        .find(|pr| {
                            u64::from(pr.offset) <= at
                                && at < u64::from(pr.offset) + u64::from(pr.len)
                        })
                        .map(|pr| pr.name.clone());
                    if let Addr::Wqe { .. } = &s.addr {
                        // Inside the WQE's blocks, as a READ's scatter must be: its patch
                        // points alone do not say so.
                        self.range(
                            q,
                            (0, "receive"),
                            &field,
                            &s.addr,
                            u64::from(s.len),
                            Access::NONE,
                            false,
                        );
                    }
                    match (&s.addr, param) {
                        (Addr::Wqe { .. }, Some(param)) => self.code_write(qn, None, &field, &s.addr, u64::from(s.len), &PatchSource::Trigger { param }),
                        (Addr::Wqe { label, byte }, None) => self.find(Some(qn), None, &field, Rule::UndeclaredPatch, format!("trigger bytes {at}.. land in {label}@{byte} but no parameter covers them")),
                        (Addr::Region { .. }, _) => self.range(q, (0, "receive"), &field, &s.addr, u64::from(s.len), Access::LOCAL_WRITE, false),
                        (Addr::Static { .. }, _) => self.range(q, (0, "receive"), &field, &s.addr, u64::from(s.len), Access::NONE, false),
                    }
                    at += u64::from(s.len);
                }
            }
        }
    }

    /// A CAS or masked CAS `label`: the atomic's own checks, and, aimed at a WQE, the
    /// patch point it writes and (on a control word) that its operands are safe images.
    #[allow(clippy::too_many_arguments)]
    fn cas(
        &mut self,
        q: &redn_program::program::Queue,
        here: (u64, &str),
        label: &str,
        remote: &Addr,
        compare: &Operand,
        swap: &Operand,
        result: Option<&Sge>,
    ) {
        self.atomic_common(q, here, remote, result, label);
        if let Addr::Wqe {
            label: target,
            byte,
        } = remote
        {
            let source = PatchSource::Cas {
                label: label.to_string(),
            };
            self.code_write(&q.name, Some(here), "raddr", remote, 8, &source);
            if *byte == 0 {
                self.ctrl_operand_ok(&q.name, here, "swap", swap, target, "swap");
                self.ctrl_operand_ok(&q.name, here, "compare", compare, target, "compare");
            }
        }
    }

    fn local_write(
        &mut self,
        q: &redn_program::program::Queue,
        here: (u64, &str),
        field: &str,
        s: &Sge,
        source: PatchSource,
    ) {
        match &s.addr {
            Addr::Wqe { .. } => {
                self.range(
                    q,
                    here,
                    field,
                    &s.addr,
                    u64::from(s.len),
                    Access::NONE,
                    false,
                );
                self.code_write(
                    &q.name,
                    Some(here),
                    field,
                    &s.addr,
                    u64::from(s.len),
                    &source,
                );
            }
            _ => self.range(
                q,
                here,
                field,
                &s.addr,
                u64::from(s.len),
                Access::LOCAL_WRITE,
                false,
            ),
        }
    }

    fn atomic_common(
        &mut self,
        q: &redn_program::program::Queue,
        here: (u64, &str),
        remote: &Addr,
        result: Option<&Sge>,
        label: &str,
    ) {
        if q.role == QueueRole::Client {
            self.find(
                Some(&q.name),
                Some(here),
                "opcode",
                Rule::WrongSide,
                "atomic through the client's connection would act on the client's memory".into(),
            );
        }
        self.range(q, here, "raddr", remote, 8, Access::REMOTE_ATOMIC, true);
        let misaligned = match remote {
            Addr::Region { offset, .. } | Addr::Static { offset, .. } => offset % 8 != 0,
            Addr::Wqe { byte, .. } => byte % 8 != 0,
        };
        if misaligned {
            self.find(
                Some(&q.name),
                Some(here),
                "raddr",
                Rule::Misaligned,
                "atomic target is not 8-byte aligned".into(),
            );
        }
        if let Some(r) = result {
            self.local_write(
                q,
                here,
                "result",
                r,
                PatchSource::AtomicResult {
                    label: label.into(),
                },
            );
        }
    }

    /// Patch points: sources exist and are of the right kind; no protected bytes.
    fn patch_points(&mut self) {
        let p = self.p;
        let cas_targets: std::collections::HashSet<&str> = p
            .queues
            .iter()
            .flat_map(|q| &q.wqes)
            .filter_map(|w| match &w.op {
                Op::Cas {
                    remote: Addr::Wqe { label, byte: 0 },
                    ..
                }
                | Op::MaskedCas {
                    remote: Addr::Wqe { label, byte: 0 },
                    ..
                } => Some(label.as_str()),
                _ => None,
            })
            .collect();
        for pp in &p.patches {
            let Some((qi, pos, w)) = self.idx.wqe(&pp.label) else {
                self.find(
                    None,
                    None,
                    "patch",
                    Rule::UnknownName,
                    format!("patch point on unknown WQE {:?}", pp.label),
                );
                continue;
            };
            let qn = p.queues[qi].name.clone();
            let here = Some((pos, pp.label.as_str()));
            let end = pp.byte.saturating_add(pp.len);
            let field = format!(
                "bytes {}..{}",
                pp.byte,
                u64::from(pp.byte) + u64::from(pp.len)
            );
            // The source must exist and be of its kind.
            let kind_ok = match &pp.source {
                PatchSource::Trigger { param } => p.params.iter().any(|x| &x.name == param),
                PatchSource::Read { label } => {
                    matches!(self.idx.wqe(label).map(|x| &x.2.op), Some(Op::Read { .. }))
                }
                PatchSource::Cas { label } => matches!(
                    self.idx.wqe(label).map(|x| &x.2.op),
                    Some(Op::Cas { .. } | Op::MaskedCas { .. })
                ),
                PatchSource::AtomicResult { label } => matches!(
                    self.idx.wqe(label).map(|x| &x.2.op),
                    Some(Op::Cas { .. } | Op::Faa { .. })
                ),
                PatchSource::Write { label } => {
                    matches!(self.idx.wqe(label).map(|x| &x.2.op), Some(Op::Write { .. }))
                }
            };
            if !kind_ok {
                self.find(
                    Some(&qn),
                    here,
                    &field,
                    Rule::UnknownName,
                    format!(
                        "patch source {} does not exist or is not of that kind",
                        source_name(&pp.source)
                    ),
                );
            }
            // Bytes past the WQE's blocks are the next WQE's (its control word, count, QP
            // number), which no protected range of this WQE names.
            let (size, to) = (w.op.bbs() * 64, u64::from(pp.byte) + u64::from(pp.len));
            if to > size {
                self.find(
                    Some(&qn),
                    here,
                    &field,
                    Rule::OutOfRegion,
                    format!(
                        "patch point {}@{}..{to} runs past the WQE's {size} bytes into the next \
                         WQE's{}",
                        pp.label,
                        pp.byte,
                        self.code_bytes(&pp.label, u64::from(pp.byte), to)
                    ),
                );
            }
            let conditional = cas_targets.contains(&pp.label.as_str());
            for (b, e, name) in protected(&w.op) {
                if !overlap((pp.byte, end), (b, e)) {
                    continue;
                }
                let ok = match (&pp.source, name) {
                    // RedN's `if`: a (verified) CAS rewrites the whole control word.
                    (PatchSource::Cas { .. }, _) if pp.byte == 0 && pp.len == 8 && b < 8 => true,
                    // A conditional WQE put back in its NOP form from a constant template.
                    (PatchSource::Write { label }, _)
                        if conditional
                            && pp.byte == 0
                            && pp.len == 8
                            && b < 8
                            && self.nop_reset(label, w) =>
                    {
                        true
                    }
                    // The operand bytes of a conditional WQE are data until the CAS decides.
                    (_, "opmod and index" | "QPN") if conditional => true,
                    // A FETCH_ADD's big-endian old value fills a count's high, reserved half.
                    (PatchSource::AtomicResult { .. }, "reserved")
                        if matches!(
                            w.op,
                            Op::Wait { .. } | Op::SendEn { .. } | Op::RecvEn { .. }
                        ) && pp.byte == WAIT_PI_BYTE - 4
                            && pp.len == 8 =>
                    {
                        true
                    }
                    _ => false,
                };
                if !ok {
                    self.find(
                        Some(&qn),
                        here,
                        &field,
                        Rule::ProtectedField,
                        format!(
                            "{} may rewrite the {name} (bytes {b}..{e}) through the key over \
                             its patch point {}@{}..{end}{}",
                            source_name(&pp.source),
                            pp.label,
                            pp.byte,
                            self.code_bytes(&pp.label, u64::from(pp.byte), u64::from(end))
                        ),
                    );
                }
            }
            // A CAS on a control word: its compare may be patched only in the operand bytes,
            // its swap not at all.
            if let Op::Cas {
                remote: Addr::Wqe { byte: 0, .. },
                ..
            }
            | Op::MaskedCas {
                remote: Addr::Wqe { byte: 0, .. },
                ..
            } = &w.op
            {
                let operand_slots = [(41u32, 44u32), (45, 48)];
                let r = (pp.byte, end);
                let in_slots = operand_slots.iter().any(|s| r.0 >= s.0 && r.1 <= s.1);
                if overlap(r, (32, 64)) && !in_slots {
                    self.find(
                        Some(&qn),
                        here,
                        &field,
                        Rule::UnsafeSwap,
                        format!(
                            "{} may rewrite this CAS's swap or the opcode/ds bytes of its compare",
                            source_name(&pp.source)
                        ),
                    );
                }
            }
        }
    }
}

impl Checker<'_> {
    /// True if WRITE `label` copies, from a static block nothing ever writes, exactly the NOP
    /// image of `target` (opcode 0, operand bytes 0, its own ds) onto its control word.
    fn nop_reset(&self, label: &str, target: &redn_program::program::Wqe) -> bool {
        let static_written = |name: &str| self.static_written(name);
        let want = u64::from_le_bytes([0, 0, 0, 0, 0, 0, 0, target.op.ds()]);
        control::constant_copy(self.p, &self.idx.at, &static_written, label, &target.label)
            == Some(want)
    }

    /// True if any WQE or receive may write static block `name`.
    fn static_written(&self, name: &str) -> bool {
        let hits = |a: &Addr| matches!(a, Addr::Static { name: n, .. } if n == name);
        self.p.queues.iter().any(|q| {
            q.recvs.iter().flat_map(|r| &r.sgl).any(|s| hits(&s.addr))
                || q.wqes.iter().any(|w| match &w.op {
                    Op::Write { remote, .. } => hits(remote),
                    Op::Read { sgl, .. } => sgl.iter().any(|s| hits(&s.addr)),
                    Op::Cas { remote, result, .. } => {
                        hits(remote) || result.as_ref().is_some_and(|r| hits(&r.addr))
                    }
                    Op::Faa { remote, result, .. } => {
                        // Counters are FETCH_ADD targets by design; a template never is.
                        hits(remote) || result.as_ref().is_some_and(|r| hits(&r.addr))
                    }
                    Op::MaskedCas { remote, .. } => hits(remote),
                    _ => false,
                })
        })
    }
}

impl Checker<'_> {
    /// The control-word model (see [`control`]): every value each WQE's first 8 bytes can
    /// reach under every write the program can make into them must be one the hardware runs
    /// as the WQE's own operation or a NOP.
    fn control_words(&mut self) {
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
        let writers = control::Writers {
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
                        match control::explore(&w.op, initial, &transfers) {
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
                                    control::MAX_STATES
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

impl Checker<'_> {
    /// Execution bounds (see [`bounds`]): a bounded program's counts are static and reach no
    /// further than their rings, and the worst trigger (and the install, with no trigger)
    /// runs no more WQEs than the policy allows and sends no more responses.
    fn execution_bounds(&mut self) {
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
        let times = match bounds::trigger_times(p) {
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
                if q.role == QueueRole::Client && bounds::responds(&w.op) {
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

impl Checker<'_> {
    /// Counts within the hardware's index windows (see [`window`]).
    fn index_windows(&mut self) {
        for r in window::check(self.p, WAIT_PI_BYTE) {
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

/// A READ or atomic whose bytes land late: its label, the bytes it writes locally, and how
/// many signaled WQEs of its queue come before it.
type Landing<'p> = (&'p str, Vec<(&'p Addr, u64)>, u64);

/// Bytes a WQE names, for the fence rule: `len` bytes at `addr`.
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
    fn fences(&mut self) {
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
