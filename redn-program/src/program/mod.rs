//! Offload programs as data.
//!
//! A [`Program`] is what an offload is before it is given to a client: queues with WQE
//! templates whose addresses, keys, queue and CQ numbers are symbolic; *patch points* that say
//! which bytes of which WQE a receive scatter, a READ, a CAS or a FETCH_ADD result may rewrite;
//! the *parameters* a client puts in its trigger message; the *regions* it binds (data regions
//! of the app, the client's response buffer) and static bytes it keeps in its code region.
//!
//! [`Program::layout`] places every ring and static block of one client's instance in one code
//! region; [`Program::render`] resolves every symbol against the bound addresses and keys and
//! produces the exact ring bytes; `redn_sys::install` does both on a NIC. The
//! manager inspects programs (the verifier), lays them out per client and shows them to admins
//! ([`Program::listing`]).
//!
//! Conventions used by the builder and the catalog:
//! - every queue has its own CQ (sends and receives); WAIT counts name "the CQ of queue Q";
//! - counts (WAIT, SEND_EN, RECV_EN) are absolute: a client's queues start at zero;
//! - a *conditional* WQE is posted in NOP form (control bytes 0..8 = `[0,0,0,NOP,0,0,0,ds]`);
//!   a CAS whose compare is that NOP image with a 48-bit operand in the opmod/index/QPN bytes
//!   turns it into its active form (RedN's `if`).

mod builder;
pub mod catalog;
mod layout;
mod resolve;
mod windows;

pub use builder::{Builder, QueueHandle};
pub use layout::{CodeLayout, MAX_CODE_BYTES};
pub use resolve::{Bound, Rendered, Resolver};
pub use windows::CodeWindow;

use crate::types::Access;
use crate::wqe::{Opcode, WqeFlags};
use std::collections::HashMap;
use std::fmt::Write as _;

/// A byte offset inside a WQE as the `u32` that [`Addr::Wqe`] and [`PatchPoint::byte`] hold.
/// An offset past `u32::MAX` says `u32::MAX`: past the end of any WQE either way, so every
/// check refuses it as it would the true offset.
pub(crate) fn wqe_byte(off: usize) -> u32 {
    u32::try_from(off).unwrap_or(u32::MAX)
}

/// An offset or length inside a code region as a `usize`. Layout refuses code regions past
/// [`MAX_CODE_BYTES`] (1 GiB), so everything inside one fits on any host; a value that does not
/// fit is refused, not wrapped.
pub(crate) fn code_usize(v: u64) -> Result<usize, ProgramError> {
    usize::try_from(v)
        .map_err(|_| ProgramError::Invalid(format!("{v} bytes is past any code region")))
}

/// Errors of program construction and layout.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ProgramError {
    /// A 48-bit operand was asked to hold more.
    #[error("operand {0:#x} is wider than 48 bits")]
    OperandTooWide(u64),
    /// A queue's WQEs do not fit its ring.
    #[error("queue {queue:?} needs {needed} BBs, its ring has {ring}")]
    RingTooSmall {
        /// The queue.
        queue: String,
        /// BBs its WQEs take.
        needed: u64,
        /// Ring size.
        ring: u32,
    },
    /// A label, queue, region or static block is named but not defined.
    #[error("unknown {kind} {name:?}")]
    Unknown {
        /// What kind of name.
        kind: &'static str,
        /// The name.
        name: String,
    },
    /// A name is defined twice.
    #[error("duplicate {kind} {name:?}")]
    Duplicate {
        /// What kind of name.
        kind: &'static str,
        /// The name.
        name: String,
    },
    /// A value outside what the program can express.
    #[error("{0}")]
    Invalid(String),
}

/// Which side a queue faces.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum QueueRole {
    /// Connected to itself: its READs, WRITEs and atomics act on the server's own memory.
    Worker,
    /// Connected to the remote client: receives its triggers, sends its responses.
    Client,
}

/// A queue of the program.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Queue {
    /// Name, unique in the program.
    pub name: String,
    /// Worker (loopback) or client-facing.
    pub role: QueueRole,
    /// Managed send queue: runs only what a SEND_EN enabled.
    pub managed_send: bool,
    /// Managed receive queue: consumes only what a RECV_EN enabled.
    pub managed_recv: bool,
    /// Preferred processing unit (queues on different PUs run in parallel).
    pub pu: Option<usize>,
    /// Send ring size in BBs (power of two).
    pub sq_bbs: u32,
    /// Receive ring slots (power of two).
    pub rq_slots: u32,
    /// Scatter entries per receive slot (power of two).
    pub rq_sges: u32,
    /// The send WQEs, in ring order from index 0.
    pub wqes: Vec<Wqe>,
    /// The receives, in ring order from slot 0.
    pub recvs: Vec<Recv>,
}

/// How a WQE sits in the ring before anything patches it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Form {
    /// As its operation says.
    Active,
    /// Control bytes 0..8 replaced by a NOP image whose operand bytes (opmod, index, QPN) are
    /// zero: a conditional WQE waiting for its CAS.
    Nop,
}

/// One send WQE template.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Wqe {
    /// Label, unique in the program.
    pub label: String,
    /// Operation with symbolic operands.
    pub op: Op,
    /// Completion / fence flags.
    pub flags: WqeFlags,
    /// Form it is posted in.
    pub form: Form,
}

/// Where a WQE sits in its program.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct WqePos {
    /// Index of its queue.
    pub queue: usize,
    /// Its first basic block in the queue's ring.
    pub bb: u64,
    /// Its index among the queue's WQEs.
    pub index: usize,
}

/// One receive template: its scatter list.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Recv {
    /// Scatter entries, filled in order by the incoming message.
    pub sgl: Vec<Sge>,
}

/// A symbolic address.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum Addr {
    /// `offset` bytes into a bound region.
    Region {
        /// Region name.
        region: String,
        /// Byte offset.
        offset: u64,
    },
    /// A byte of a WQE (in the code region).
    Wqe {
        /// WQE label.
        label: String,
        /// Byte offset in the WQE.
        byte: u32,
    },
    /// A byte of a static block (in the code region).
    Static {
        /// Block name.
        name: String,
        /// Byte offset.
        offset: u64,
    },
}

impl Addr {
    /// Byte `byte` of WQE `label`.
    pub fn wqe(label: &str, byte: usize) -> Addr {
        Addr::Wqe {
            label: label.into(),
            byte: wqe_byte(byte),
        }
    }

    /// Byte `offset` of region `region`.
    pub fn region(region: &str, offset: u64) -> Addr {
        Addr::Region {
            region: region.into(),
            offset,
        }
    }

    /// Byte `offset` of static block `name`.
    pub fn static_(name: &str, offset: u64) -> Addr {
        Addr::Static {
            name: name.into(),
            offset,
        }
    }

    /// The key that covers this address.
    pub fn key(&self) -> Key {
        match self {
            Addr::Region { region, .. } => Key::Region(region.clone()),
            Addr::Wqe { .. } | Addr::Static { .. } => Key::Code,
        }
    }
}

/// A symbolic memory key.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum Key {
    /// The key of a bound region.
    Region(String),
    /// The key of the client's code region (its rings and static blocks).
    Code,
}

/// A symbolic scatter/gather entry.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Sge {
    /// Start.
    pub addr: Addr,
    /// Length in bytes.
    pub len: u32,
}

impl Sge {
    /// `len` bytes at `addr` (the key follows from the address).
    pub fn new(addr: Addr, len: u32) -> Sge {
        Sge { addr, len }
    }
}

/// What the operand bytes of a control image (opmod, WQE index, QPN: 48 bits) hold.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Slots {
    /// The WQE's real index and QPN (opmod 0): what the hardware expects of an active WQE.
    Real,
    /// A 48-bit operand, stored big-endian in bytes 0,1,2,4,5,6 of the control segment.
    Operand(u64),
}

/// A 64-bit atomic operand.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Operand {
    /// A literal value.
    Lit(u64),
    /// The first 8 bytes of WQE `label`'s control segment, as a CAS reads them (a
    /// little-endian u64): opcode from `form` (its own opcode, or NOP), operand bytes from
    /// `slots`, and ds from `ds` (or its own).
    Ctrl {
        /// WQE label.
        label: String,
        /// Active opcode or NOP.
        form: Form,
        /// Operand bytes.
        slots: Slots,
        /// ds override (a WRITE_IMM with ds 2 moves no data: a zero-length answer).
        ds: Option<u8>,
    },
}

impl Operand {
    /// The control image of `label` in `form` with `slots`.
    pub fn ctrl(label: &str, form: Form, slots: Slots) -> Operand {
        Operand::Ctrl {
            label: label.into(),
            form,
            slots,
            ds: None,
        }
    }
}

/// Largest operand a control image can carry.
pub const MAX_OPERAND: u64 = (1 << 48) - 1;

/// An operation with symbolic operands.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Op {
    /// No operation.
    Nop,
    /// RDMA WRITE (with immediate if `imm`).
    Write {
        /// Target.
        remote: Addr,
        /// Source entries.
        sgl: Vec<Sge>,
        /// Immediate.
        imm: Option<u32>,
    },
    /// RDMA READ.
    Read {
        /// Source.
        remote: Addr,
        /// Where the bytes land.
        sgl: Vec<Sge>,
    },
    /// Compare and swap.
    Cas {
        /// 8-byte aligned target.
        remote: Addr,
        /// Compare value.
        compare: Operand,
        /// Swap value.
        swap: Operand,
        /// Where the old value lands (host order; big-endian on a QP that asks for
        /// MLNX_OFED's big-endian replies).
        result: Option<Sge>,
    },
    /// Masked compare and swap.
    MaskedCas {
        /// 8-byte aligned target.
        remote: Addr,
        /// Compare value.
        compare: Operand,
        /// Bits of the compare that count.
        compare_mask: u64,
        /// Swap value.
        swap: Operand,
        /// Bits the swap replaces.
        swap_mask: u64,
    },
    /// Fetch and add; the old value lands at `result` (host order, as for `Cas`).
    Faa {
        /// 8-byte aligned target.
        remote: Addr,
        /// Addend.
        add: u64,
        /// Where the old value lands.
        result: Option<Sge>,
    },
    /// Wait until queue `queue`'s CQ has produced more than `count` completions.
    Wait {
        /// The queue whose CQ is counted.
        queue: String,
        /// Absolute 0-based completion index.
        count: u32,
    },
    /// Enable managed send queue `queue` up to `count` BBs.
    SendEn {
        /// The managed queue.
        queue: String,
        /// Absolute producer index.
        count: u32,
    },
    /// Enable managed receive queue `queue` up to `count` receives.
    RecvEn {
        /// The managed queue.
        queue: String,
        /// Absolute receive index.
        count: u32,
    },
    /// An opcode outside the ones above (UMR, LOCAL_INVAL, CONFIG_CMD, ...). Representable so
    /// that a definition naming one can be loaded and refused by the verifier; never rendered.
    Other {
        /// The raw opcode byte.
        opcode: u8,
    },
}

impl Op {
    /// The raw opcode byte.
    pub fn opcode_byte(&self) -> u8 {
        match self {
            Op::Other { opcode } => *opcode,
            other => other.opcode() as u8,
        }
    }

    /// The opcode this operation encodes to (NOP for [`Op::Other`]; see
    /// [`Op::opcode_byte`]).
    pub fn opcode(&self) -> Opcode {
        match self {
            Op::Other { .. } => Opcode::Nop,
            Op::Nop => Opcode::Nop,
            Op::Write { imm: None, .. } => Opcode::RdmaWrite,
            Op::Write { imm: Some(_), .. } => Opcode::RdmaWriteImm,
            Op::Read { .. } => Opcode::RdmaRead,
            Op::Cas { .. } => Opcode::AtomicCs,
            Op::MaskedCas { .. } => Opcode::AtomicMaskedCs,
            Op::Faa { .. } => Opcode::AtomicFa,
            Op::Wait { .. } => Opcode::Wait,
            Op::SendEn { .. } => Opcode::SendEn,
            Op::RecvEn { .. } => Opcode::RecvEn,
        }
    }

    /// Segments (ds) the encoded WQE has.
    pub fn ds(&self) -> u8 {
        let n = match self {
            Op::Nop | Op::Other { .. } => 1,
            Op::Write { sgl, .. } | Op::Read { sgl, .. } => {
                2 + sgl.iter().filter(|s| s.len > 0).count()
            }
            Op::Cas { result, .. } | Op::Faa { result, .. } => 3 + usize::from(result.is_some()),
            Op::MaskedCas { .. } => 4,
            Op::Wait { .. } | Op::SendEn { .. } | Op::RecvEn { .. } => 2,
        };
        // More than 255 segments say 255: no WQE has that many (the limit is MAX_DS, 63),
        // so the encoder refuses it as it would the true count.
        u8::try_from(n).unwrap_or(u8::MAX)
    }

    /// Basic blocks the encoded WQE occupies.
    pub fn bbs(&self) -> u64 {
        crate::wqe::bbs_for_ds(self.ds()) as u64
    }

    /// The remote address, for the one-sided operations.
    pub fn remote(&self) -> Option<&Addr> {
        match self {
            Op::Write { remote, .. }
            | Op::Read { remote, .. }
            | Op::Cas { remote, .. }
            | Op::MaskedCas { remote, .. }
            | Op::Faa { remote, .. } => Some(remote),
            _ => None,
        }
    }

    /// Local scatter/gather entries (gather for WRITE, scatter for READ, atomic results).
    pub fn local(&self) -> Vec<&Sge> {
        match self {
            Op::Write { sgl, .. } | Op::Read { sgl, .. } => sgl.iter().collect(),
            Op::Cas { result, .. } | Op::Faa { result, .. } => result.iter().collect(),
            _ => Vec::new(),
        }
    }
}

/// What may rewrite the bytes of a patch point.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum PatchSource {
    /// The client's trigger message (a receive's scatter), carrying parameter `param`.
    Trigger {
        /// Parameter name.
        param: String,
    },
    /// The scatter list of READ `label`.
    Read {
        /// The READ's label.
        label: String,
    },
    /// CAS (or masked CAS) `label` on a control word.
    Cas {
        /// The CAS's label.
        label: String,
    },
    /// The result (old value) of FETCH_ADD or CAS `label`.
    AtomicResult {
        /// The atomic's label.
        label: String,
    },
    /// WRITE `label` (a copy inside the code region).
    Write {
        /// The WRITE's label.
        label: String,
    },
}

/// Bytes of a WQE that something other than the installer may rewrite.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PatchPoint {
    /// The WQE patched.
    pub label: String,
    /// First byte patched, within the WQE.
    pub byte: u32,
    /// Bytes patched.
    pub len: u32,
    /// Who patches it.
    pub source: PatchSource,
}

/// A field of the trigger message a client sends.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Param {
    /// Name.
    pub name: String,
    /// Offset in the trigger message.
    pub offset: u32,
    /// Length in bytes.
    pub len: u32,
    /// What it means and how it is encoded.
    pub doc: String,
}

/// What a region binding is for.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum RegionRole {
    /// App memory on the server, used with the given rights.
    Data {
        /// Rights the program's WQEs need.
        access: Access,
    },
    /// The remote client's response buffer (written by RDMA WRITE).
    Response,
}

/// A region the program binds by name.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RegionDecl {
    /// Name WQE templates use.
    pub name: String,
    /// Role.
    pub role: RegionRole,
    /// Smallest size that works.
    pub min_len: u64,
    /// What it holds.
    pub doc: String,
}

/// Bytes the program keeps in its code region (templates, counters of recycled loops).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StaticBlock {
    /// Name.
    pub name: String,
    /// Initial content.
    pub bytes: Vec<u8>,
}

/// How many WQEs one invocation runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Iterations {
    /// Pre-posted: the program serves this many triggers, each running at most
    /// `wqes_per_invocation` WQEs, then stops.
    Bounded {
        /// Triggers served.
        invocations: u32,
        /// Most WQEs one trigger runs.
        wqes_per_invocation: u32,
    },
    /// Recycled: the program re-arms itself forever; each round runs `wqes_per_round` WQEs.
    /// Its budget is the manager's auditor's to enforce.
    Recycled {
        /// WQEs per round.
        wqes_per_round: u32,
    },
}

impl Iterations {
    /// [`Iterations::Bounded`]: `invocations` triggers of at most `wqes_per_invocation`
    /// WQEs each.
    #[must_use]
    pub const fn bounded(invocations: u32, wqes_per_invocation: u32) -> Iterations {
        Iterations::Bounded {
            invocations,
            wqes_per_invocation,
        }
    }
}

/// An offload program.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Program {
    /// Catalog name.
    pub name: String,
    /// One-line description.
    pub summary: String,
    /// The queues.
    pub queues: Vec<Queue>,
    /// Regions bound by name.
    pub regions: Vec<RegionDecl>,
    /// Static blocks in the code region.
    pub statics: Vec<StaticBlock>,
    /// Trigger-message parameters.
    pub params: Vec<Param>,
    /// Length of one trigger message.
    pub trigger_len: u32,
    /// Declared patch points.
    pub patches: Vec<PatchPoint>,
    /// Initial enables: (queue, count). Managed queues get a SEND_EN from the installer's
    /// master queue; unmanaged ones a doorbell.
    pub entry: Vec<(String, u32)>,
    /// Initial receive enables of managed receive queues: (queue, count).
    pub recv_entry: Vec<(String, u32)>,
    /// Invocation bound.
    pub iterations: Iterations,
    /// How the response looks.
    pub response_doc: String,
}

impl Program {
    /// The queue called `name`.
    pub fn queue(&self, name: &str) -> Option<(usize, &Queue)> {
        self.queues.iter().enumerate().find(|(_, q)| q.name == name)
    }

    /// Every WQE's position by label, in one pass over the program (for a label used twice,
    /// the first one).
    pub fn wqe_positions(&self) -> HashMap<&str, WqePos> {
        let mut positions = HashMap::new();
        for (queue, q) in self.queues.iter().enumerate() {
            let mut bb = 0;
            for (index, w) in q.wqes.iter().enumerate() {
                positions
                    .entry(w.label.as_str())
                    .or_insert(WqePos { queue, bb, index });
                bb += w.op.bbs();
            }
        }
        positions
    }

    /// The patch points by the WQE they patch, in declaration order: what a pass that looks
    /// at each WQE's own patch points builds once (a large program has thousands).
    pub fn patches_by_wqe(&self) -> HashMap<&str, Vec<&PatchPoint>> {
        let mut by: HashMap<&str, Vec<&PatchPoint>> = HashMap::new();
        for pp in &self.patches {
            by.entry(pp.label.as_str()).or_default().push(pp);
        }
        by
    }

    /// The WQE at `pos`.
    pub fn wqe_at(&self, pos: WqePos) -> Option<&Wqe> {
        self.queues.get(pos.queue)?.wqes.get(pos.index)
    }

    /// Total WQEs across queues.
    pub fn wqe_count(&self) -> usize {
        self.queues.iter().map(|q| q.wqes.len()).sum()
    }

    /// A readable listing: queues, then each WQE with its index, opcode, fields and the patch
    /// points that cover it (what `redn offload dump` shows).
    pub fn listing(&self) -> String {
        let mut s = String::new();
        let _ = writeln!(s, "offload {}: {}", self.name, self.summary);
        match self.iterations {
            Iterations::Bounded {
                invocations,
                wqes_per_invocation,
            } => {
                let _ = writeln!(
                    s,
                    "iterations: bounded, {invocations} invocations, at most {wqes_per_invocation} WQEs each"
                );
            }
            Iterations::Recycled { wqes_per_round } => {
                let _ = writeln!(s, "iterations: recycled, {wqes_per_round} WQEs per round");
            }
        }
        for r in &self.regions {
            let _ = writeln!(
                s,
                "region {} ({:?}, at least {} B): {}",
                r.name, r.role, r.min_len, r.doc
            );
        }
        for p in &self.params {
            let _ = writeln!(s, "param {} @{}+{}: {}", p.name, p.offset, p.len, p.doc);
        }
        for b in &self.statics {
            let _ = writeln!(s, "static {} ({} B)", b.name, b.bytes.len());
        }
        for q in &self.queues {
            let _ = writeln!(
                s,
                "queue {} ({:?}{}{}, {} BBs, {} receives){}",
                q.name,
                q.role,
                if q.managed_send { ", managed send" } else { "" },
                if q.managed_recv { ", managed recv" } else { "" },
                q.sq_bbs,
                q.rq_slots,
                q.pu.map(|p| format!(" on PU {p}")).unwrap_or_default()
            );
            let mut at = 0u64;
            for w in &q.wqes {
                let _ = write!(
                    s,
                    "  {at:>5}  {:<14} {:<10}{}{}",
                    w.label,
                    match &w.op {
                        Op::Other { opcode } => format!("OP_{opcode:#04x}"),
                        op => op.opcode().name().to_string(),
                    },
                    if w.form == Form::Nop {
                        " [posted as NOP]"
                    } else {
                        ""
                    },
                    flags_text(w.flags)
                );
                let _ = writeln!(s, " {}", op_text(&w.op));
                for p in self.patches.iter().filter(|p| p.label == w.label) {
                    let _ = writeln!(
                        s,
                        "         patch bytes {}..{} by {}",
                        p.byte,
                        p.byte + p.len,
                        source_text(&p.source)
                    );
                }
                at += w.op.bbs();
            }
            for (i, r) in q.recvs.iter().enumerate() {
                let list: Vec<String> = r.sgl.iter().map(sge_text).collect();
                let _ = writeln!(s, "  recv {i:>3}  [{}]", list.join(", "));
            }
        }
        let _ = writeln!(s, "response: {}", self.response_doc);
        s
    }
}

fn flags_text(f: WqeFlags) -> String {
    let mut v = Vec::new();
    if f.signaled() {
        v.push("signaled");
    }
    if f.fence_mode() != 0 {
        v.push("fence");
    }
    if v.is_empty() {
        String::new()
    } else {
        format!(" ({})", v.join(","))
    }
}

fn addr_text(a: &Addr) -> String {
    match a {
        Addr::Region { region, offset } => format!("{region}+{offset}"),
        Addr::Wqe { label, byte } => format!("{label}@{byte}"),
        Addr::Static { name, offset } => format!("static {name}+{offset}"),
    }
}

fn sge_text(s: &Sge) -> String {
    format!("{}:{}", addr_text(&s.addr), s.len)
}

fn operand_text(o: &Operand) -> String {
    match o {
        Operand::Lit(v) => format!("{v:#x}"),
        Operand::Ctrl {
            label,
            form,
            slots,
            ds,
        } => format!(
            "ctrl({label}, {form:?}, {}{})",
            match slots {
                Slots::Real => "real".to_string(),
                Slots::Operand(v) => format!("operand {v:#x}"),
            },
            ds.map(|d| format!(", ds {d}")).unwrap_or_default()
        ),
    }
}

fn op_text(op: &Op) -> String {
    let list = |v: &[Sge]| v.iter().map(sge_text).collect::<Vec<_>>().join(", ");
    match op {
        Op::Nop => String::new(),
        Op::Write { remote, sgl, imm } => format!(
            "to {} from [{}]{}",
            addr_text(remote),
            list(sgl),
            imm.map(|i| format!(" imm {i}")).unwrap_or_default()
        ),
        Op::Read { remote, sgl } => format!("from {} into [{}]", addr_text(remote), list(sgl)),
        Op::Cas {
            remote,
            compare,
            swap,
            result,
        } => format!(
            "at {} if == {} then {}{}",
            addr_text(remote),
            operand_text(compare),
            operand_text(swap),
            result
                .as_ref()
                .map(|r| format!(" old -> {}", sge_text(r)))
                .unwrap_or_default()
        ),
        Op::MaskedCas {
            remote,
            compare,
            compare_mask,
            swap,
            swap_mask,
        } => format!(
            "at {} if & {compare_mask:#x} == {} then {} & {swap_mask:#x}",
            addr_text(remote),
            operand_text(compare),
            operand_text(swap)
        ),
        Op::Faa {
            remote,
            add,
            result,
        } => format!(
            "at {} += {add}{}",
            addr_text(remote),
            result
                .as_ref()
                .map(|r| format!(" old -> {}", sge_text(r)))
                .unwrap_or_default()
        ),
        Op::Wait { queue, count } => format!("cq({queue}) > {count}"),
        Op::SendEn { queue, count } => format!("{queue} up to {count}"),
        Op::RecvEn { queue, count } => format!("{queue} receives up to {count}"),
        Op::Other { opcode } => format!("raw opcode {opcode:#04x}"),
    }
}

fn source_text(s: &PatchSource) -> String {
    match s {
        PatchSource::Trigger { param } => format!("trigger param {param}"),
        PatchSource::Read { label } => format!("READ {label}"),
        PatchSource::Cas { label } => format!("CAS {label}"),
        PatchSource::AtomicResult { label } => format!("result of {label}"),
        PatchSource::Write { label } => format!("WRITE {label}"),
    }
}
