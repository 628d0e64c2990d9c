//! Narrow keys: the windows of a code region that keys may cover.
//!
//! A program's rings live in one code region, and RedN's chains write into them: a trigger's
//! scatter, a READ, a CAS or an atomic's result lands in a WQE. If one key covered the whole
//! region, any of those writes whose address or length can change at run time (a trigger
//! patches it, or another WQE does) could land on any byte of any WQE — a key, a queue
//! number, an opcode — and the verifier's word would be all that stands in the way. So no
//! key covers the region. The installer registers one memory region per *window*:
//!
//! - the bytes of one WQE that one kind of source may write, merged where its declared patch
//!   points touch (a window never reaches past a patch point), for the queue whose WQE or
//!   receive does the writing;
//! - each static block, for the queues that use it.
//!
//! A WQE names code bytes only through such a window's key, so the NIC's bounds check keeps
//! every write inside a declared patch point, whatever address it ends up carrying. Keys live
//! in the protection domain of the queue that uses them: worker queues (connected to
//! themselves) in one, the client-facing queue in another, which holds no code window with
//! remote rights, so a client that learns or guesses a key can use none of them on code.
//!
//! A worker queue may also read the bytes of a WQE's patch points (to copy what a READ
//! brought into another WQE), through a window over them with no write right; a static
//! block may be a source on either side (it holds what the program keeps there, never ring
//! bytes). What is refused here, because no window can serve it: a client-facing queue
//! naming code as a remote address (its peer is the client) or sending WQE bytes, a
//! FETCH_ADD on a WQE (no patch source says what it may change), and any access to a WQE
//! outside every patch point declared for its source.

use super::layout::CodeLayout;
use super::{code_usize, Addr, Op, PatchPoint, PatchSource, Program, ProgramError, QueueRole, Sge};
use crate::types::Access;
use crate::wqe::BB_SIZE;
use std::collections::hash_map::Entry;
use std::collections::HashMap;

/// A window of a code region that one key covers.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CodeWindow {
    /// The side whose protection domain holds the key: the queues of that role use it.
    pub side: QueueRole,
    /// First byte, from the code region's start.
    pub offset: usize,
    /// Bytes covered.
    pub len: usize,
    /// Rights the key carries (never more than its users need).
    pub access: Access,
    /// What it covers, for listings and errors.
    pub what: String,
}

impl CodeWindow {
    /// True if the window covers `[offset, offset + len)` (a zero-length access at its end
    /// included).
    #[must_use]
    pub fn covers(&self, offset: usize, len: usize) -> bool {
        offset >= self.offset
            && offset
                .checked_add(len)
                .is_some_and(|end| end <= self.offset + self.len)
    }
}

/// How a WQE or receive uses bytes it names.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Use {
    /// The local side writes them (READ scatter, atomic result, receive scatter).
    LocalWrite,
    /// The local side reads them (WRITE gather).
    LocalRead,
    /// A loopback RDMA WRITE lands there.
    RemoteWrite,
    /// A loopback RDMA READ reads them.
    RemoteRead,
    /// A loopback atomic targets them.
    RemoteAtomic,
}

impl Use {
    /// Rights a key needs for this use. A remote write or atomic also needs local write
    /// (`ibv_reg_mr(3)` refuses the one without the other).
    fn access(self) -> Access {
        match self {
            Use::LocalWrite => Access::LOCAL_WRITE,
            Use::LocalRead => Access::NONE,
            Use::RemoteWrite => Access::REMOTE_WRITE | Access::LOCAL_WRITE,
            Use::RemoteRead => Access::REMOTE_READ,
            Use::RemoteAtomic => Access::REMOTE_ATOMIC | Access::LOCAL_WRITE,
        }
    }
}

/// Who makes a code access: a WQE (by label), or a queue's receive (by index).
#[derive(Clone, Copy)]
enum User<'p> {
    Wqe(&'p str),
    Receive(&'p str, usize),
}

/// One code access of one WQE or receive: what it names, how many bytes, how, and which
/// patch source a write there must be declared for.
struct Access1<'p> {
    addr: &'p Addr,
    len: u64,
    how: Use,
    source: Option<PatchSource>,
}

fn sgl_len(sgl: &[Sge]) -> u64 {
    sgl.iter().map(|s| u64::from(s.len)).sum()
}

fn push_sgl<'p>(out: &mut Vec<Access1<'p>>, sgl: &'p [Sge], how: Use, source: Option<PatchSource>) {
    for s in sgl {
        out.push(Access1 {
            addr: &s.addr,
            len: u64::from(s.len),
            how,
            source: source.clone(),
        });
    }
}

/// Every code access `op` (the WQE `label`) makes.
fn accesses<'p>(label: &str, op: &'p Op) -> Vec<Access1<'p>> {
    let label = label.to_string();
    let mut out = Vec::new();
    match op {
        Op::Write { remote, sgl, .. } => {
            push_sgl(&mut out, sgl, Use::LocalRead, None);
            out.push(Access1 {
                addr: remote,
                len: sgl_len(sgl),
                how: Use::RemoteWrite,
                source: Some(PatchSource::Write { label }),
            });
        }
        Op::Read { remote, sgl } => {
            push_sgl(
                &mut out,
                sgl,
                Use::LocalWrite,
                Some(PatchSource::Read { label }),
            );
            out.push(Access1 {
                addr: remote,
                len: sgl_len(sgl),
                how: Use::RemoteRead,
                source: None,
            });
        }
        Op::Cas { remote, result, .. } | Op::Faa { remote, result, .. } => {
            if let Some(r) = result {
                out.push(Access1 {
                    addr: &r.addr,
                    len: u64::from(r.len),
                    how: Use::LocalWrite,
                    source: Some(PatchSource::AtomicResult {
                        label: label.clone(),
                    }),
                });
            }
            // A FETCH_ADD has no patch source of its own: it may target static blocks only.
            let target = matches!(op, Op::Cas { .. }).then_some(PatchSource::Cas { label });
            out.push(Access1 {
                addr: remote,
                len: 8,
                how: Use::RemoteAtomic,
                source: target,
            });
        }
        Op::MaskedCas { remote, .. } => out.push(Access1 {
            addr: remote,
            len: 8,
            how: Use::RemoteAtomic,
            source: Some(PatchSource::Cas { label }),
        }),
        Op::Nop | Op::Wait { .. } | Op::SendEn { .. } | Op::RecvEn { .. } | Op::Other { .. } => {}
    }
    out
}

/// The patch points of one program by target WQE, built once so that finding a window is
/// linear in the WQE's own patch points, not the program's.
struct PatchIndex<'p> {
    by_label: HashMap<&'p str, Vec<&'p PatchPoint>>,
}

impl<'p> PatchIndex<'p> {
    fn new(p: &'p Program) -> PatchIndex<'p> {
        let mut by_label: HashMap<&str, Vec<&PatchPoint>> = HashMap::new();
        for pp in &p.patches {
            by_label.entry(pp.label.as_str()).or_default().push(pp);
        }
        PatchIndex { by_label }
    }

    /// The byte ranges of WQE `target` that `source` may write, merged where they touch.
    fn ranges(&self, target: &str, source: &dyn Fn(&PatchSource) -> bool) -> Vec<(u64, u64)> {
        let mut ranges: Vec<(u64, u64)> = self
            .by_label
            .get(target)
            .into_iter()
            .flatten()
            .filter(|pp| source(&pp.source))
            .map(|pp| (u64::from(pp.byte), u64::from(pp.byte) + u64::from(pp.len)))
            .collect();
        ranges.sort_unstable();
        let mut merged: Vec<(u64, u64)> = Vec::new();
        for (start, end) in ranges {
            match merged.last_mut() {
                Some(last) if start <= last.1 => last.1 = last.1.max(end),
                _ => merged.push((start, end)),
            }
        }
        merged
    }
}

impl Program {
    /// The windows of this program's code region, laid out as `layout`, that its keys must
    /// cover, with the rights each needs: one per static block a side uses and one per
    /// (side, WQE, merged patch range) something writes. Refuses, naming the WQE or receive,
    /// any code access no window can serve (see the module docs).
    pub fn code_windows(&self, layout: &CodeLayout) -> Result<Vec<CodeWindow>, ProgramError> {
        let positions = self.wqe_positions();
        let patches = PatchIndex::new(self);
        let mut windows: Vec<CodeWindow> = Vec::new();
        // (side, offset, len) -> index in `windows`: a window used by several WQEs is one
        // key with the union of their rights.
        let mut seen: HashMap<(QueueRole, usize, usize), usize> = HashMap::new();
        // The window's name is made only for a new window (a large program adds thousands).
        let mut add =
            |side: QueueRole,
             offset: usize,
             len: usize,
             access: Access,
             what: &dyn Fn() -> String| match seen.entry((side, offset, len)) {
                Entry::Occupied(i) => {
                    let o = &mut windows[*i.get()];
                    o.access = o.access | access;
                }
                Entry::Vacant(v) => {
                    v.insert(windows.len());
                    windows.push(CodeWindow {
                        side,
                        offset,
                        len,
                        access,
                        what: what(),
                    });
                }
            };
        for q in &self.queues {
            // Who makes each access, named only if it is refused.
            let mut uses: Vec<(User<'_>, Access1<'_>)> = Vec::new();
            for w in &q.wqes {
                for a in accesses(&w.label, &w.op) {
                    uses.push((User::Wqe(&w.label), a));
                }
            }
            for (i, r) in q.recvs.iter().enumerate() {
                for s in &r.sgl {
                    uses.push((
                        User::Receive(&q.name, i),
                        Access1 {
                            addr: &s.addr,
                            len: u64::from(s.len),
                            how: Use::LocalWrite,
                            source: Some(PatchSource::Trigger {
                                param: String::new(),
                            }),
                        },
                    ));
                }
            }
            for (user, a) in uses {
                let refuse = |why: String| {
                    let user = match user {
                        User::Wqe(label) => format!("WQE {label}"),
                        User::Receive(queue, i) => format!("queue {queue} receive {i}"),
                    };
                    Err(ProgramError::Invalid(format!("{user}: {why}")))
                };
                let remote = matches!(
                    a.how,
                    Use::RemoteWrite | Use::RemoteRead | Use::RemoteAtomic
                );
                match a.addr {
                    Addr::Region { .. } => continue,
                    _ if remote && q.role == QueueRole::Client => {
                        return refuse(format!(
                            "queue {} faces the client: its remote addresses are the client's, \
                             never code",
                            q.name
                        ))
                    }
                    Addr::Wqe { .. } if a.how == Use::LocalRead && q.role == QueueRole::Client => {
                        return refuse(format!(
                            "queue {} faces the client: WQE bytes are never sent to a peer",
                            q.name
                        ))
                    }
                    Addr::Static { name, offset } => {
                        let (i, block) = self
                            .statics
                            .iter()
                            .enumerate()
                            .find(|(_, s)| &s.name == name)
                            .ok_or_else(|| ProgramError::Unknown {
                                kind: "static block",
                                name: name.clone(),
                            })?;
                        let len = block.bytes.len().max(1);
                        let fits = offset
                            .checked_add(a.len)
                            .is_some_and(|end| end <= len as u64);
                        if !fits {
                            return refuse(format!(
                                "{} bytes at offset {offset} run past static block {name:?} \
                                 ({len} bytes)",
                                a.len
                            ));
                        }
                        add(q.role, layout.statics[i], len, a.how.access(), &|| {
                            format!("static {name}")
                        });
                    }
                    Addr::Wqe { label, byte } => {
                        let pos =
                            positions
                                .get(label.as_str())
                                .ok_or_else(|| ProgramError::Unknown {
                                    kind: "WQE label",
                                    name: label.clone(),
                                })?;
                        let reads = matches!(a.how, Use::LocalRead | Use::RemoteRead);
                        if a.source.is_none() && !reads {
                            return refuse(format!("WQE {label} is not a target it may name"));
                        }
                        // A write must be declared for its source; a read (a copy of what
                        // some source wrote, kept on the server) may take any patch point's
                        // bytes, and nothing else of the WQE.
                        let matches = |s: &PatchSource| match (&a.source, s) {
                            (None, _) => true,
                            (Some(PatchSource::Trigger { .. }), PatchSource::Trigger { .. }) => {
                                true
                            }
                            (Some(source), _) => s == source,
                        };
                        let start = u64::from(*byte);
                        let end = start.saturating_add(a.len);
                        let Some(&(from, to)) = patches
                            .ranges(label, &matches)
                            .iter()
                            .find(|(from, to)| start >= *from && end <= *to)
                        else {
                            return refuse(format!(
                                "names bytes {start}..{end} of WQE {label} outside every patch \
                                 point declared for it: no key may name them"
                            ));
                        };
                        let wqe_at = layout.sq[pos.queue] + code_usize(pos.bb)? * BB_SIZE;
                        add(
                            q.role,
                            wqe_at + code_usize(from)?,
                            code_usize(to - from)?,
                            a.how.access(),
                            &|| format!("WQE {label} bytes {from}..{to}"),
                        );
                    }
                }
            }
        }
        Ok(windows)
    }
}
