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
//! FETCH_ADD on a WQE (no patch source says what it may change), any access to a WQE
//! outside every patch point declared for its source, and a patch point running past its
//! WQE's blocks (its window would cover the next WQE's bytes).

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
        PatchIndex {
            by_label: p.patches_by_wqe(),
        }
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
                        // A patch point past the WQE's blocks would give a key over the next
                        // WQE's bytes (its control word, its count and QP number).
                        let size = self.wqe_at(*pos).map_or(0, |w| w.op.bbs()) * BB_SIZE as u64;
                        if to > size {
                            return refuse(format!(
                                "names bytes {from}..{to} of WQE {label}, past its {size} bytes: \
                                 no key may name the next WQE's"
                            ));
                        }
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::program::catalog::{self, HashVariant};
    use crate::program::{Form, Wqe};
    use crate::wqe::WqeFlags;

    /// The windows of `p` as (side, WQE label or `static:NAME`, first byte, end byte,
    /// rights), sorted.
    fn named(p: &Program) -> Vec<(QueueRole, String, usize, usize, Access)> {
        let layout = p.layout().unwrap();
        let wqes = p.wqe_positions().into_iter().map(|(l, pos)| {
            let at = layout.sq[pos.queue] + usize::try_from(pos.bb).unwrap() * BB_SIZE;
            (l.to_string(), at, at + 64)
        });
        let statics = p
            .statics
            .iter()
            .zip(&layout.statics)
            .map(|(b, &at)| (format!("static:{}", b.name), at, at + b.bytes.len()));
        let holders: Vec<(String, usize, usize)> = wqes.chain(statics).collect();
        let mut out: Vec<_> = p
            .code_windows(&layout)
            .unwrap()
            .into_iter()
            .map(|w| {
                let (label, at, _) = holders
                    .iter()
                    .filter(|(_, at, end)| *at <= w.offset && w.offset < *end)
                    .max_by_key(|(_, at, _)| *at)
                    .expect("a WQE or a static block holds the window");
                (
                    w.side,
                    label.clone(),
                    w.offset - at,
                    w.offset - at + w.len,
                    w.access,
                )
            })
            .collect();
        out.sort_by(|a, b| (a.1.as_str(), a.2, a.3).cmp(&(b.1.as_str(), b.2, b.3)));
        out
    }

    #[test]
    fn hash_get_has_exactly_the_windows_its_writers_need() {
        let p = catalog::hash_get(HashVariant::Single, 1).unwrap();
        let w = QueueRole::Worker;
        let c = QueueRole::Client;
        let lw = Access::LOCAL_WRITE;
        let cas = Access::REMOTE_ATOMIC | Access::LOCAL_WRITE;
        let want = vec![
            // The trigger lands the key in the `if`'s compare slots and the bucket address
            // in the READ, through the client-facing queue's receive.
            (c, "0.b0.if".to_string(), 41, 44, lw),
            (c, "0.b0.if".to_string(), 45, 48, lw),
            (c, "0.b0.read".to_string(), 16, 24, lw),
            // The READ brings the bucket into the response (two operand slots, the length
            // and the value address: four patch points that do not touch, four windows).
            (w, "0.r0".to_string(), 0, 3, lw),
            // The `if` and the `else` share one window over the control word.
            (w, "0.r0".to_string(), 0, 8, cas),
            (w, "0.r0".to_string(), 4, 7, lw),
            (w, "0.r0".to_string(), 33, 36, lw),
            (w, "0.r0".to_string(), 40, 48, lw),
            // The length's top byte, dropped in a scratch block (a window covers a block).
            (w, "static:len.top".to_string(), 0, 8, lw),
        ];
        assert_eq!(named(&p), want);
    }

    /// hash-get with one more WQE on queue `queue`.
    fn with(queue: usize, label: &str, op: Op) -> Program {
        let mut p = catalog::hash_get(HashVariant::Single, 1).unwrap();
        p.queues[queue].sq_bbs *= 4;
        p.queues[queue].wqes.push(Wqe {
            label: label.into(),
            op,
            flags: WqeFlags::NONE,
            form: Form::Active,
        });
        p
    }

    fn refusal(p: &Program) -> String {
        p.code_windows(&p.layout().unwrap())
            .unwrap_err()
            .to_string()
    }

    #[test]
    fn what_no_window_can_serve_is_refused_naming_the_wqe() {
        let sge = |label: &str, byte, len| Sge::new(Addr::wqe(label, byte), len);
        // The client-facing queue (0) naming code as a remote address.
        let e = refusal(&with(
            0,
            "x",
            Op::Write {
                remote: Addr::wqe("0.r0", 16),
                sgl: vec![Sge::new(Addr::region("values", 0), 8)],
                imm: None,
            },
        ));
        assert!(e.starts_with("WQE x: queue client faces the client"), "{e}");
        // The client-facing queue sending bytes of a WQE, even a patch point's.
        let e = refusal(&with(
            0,
            "x",
            Op::Write {
                remote: Addr::region("response", 0),
                sgl: vec![sge("0.b0.read", 16, 8)],
                imm: None,
            },
        ));
        assert!(e.contains("WQE bytes are never sent to a peer"), "{e}");
        // A FETCH_ADD on a WQE: no patch source says what it may change.
        let e = refusal(&with(
            1,
            "x",
            Op::Faa {
                remote: Addr::wqe("0.r0", 0),
                add: 1,
                result: None,
            },
        ));
        assert!(e.contains("is not a target it may name"), "{e}");
        // A READ landing one byte past its patch point (0..3 of the response).
        let e = refusal(&with(
            1,
            "x",
            Op::Read {
                remote: Addr::region("table", 0),
                sgl: vec![sge("0.r0", 1, 3)],
            },
        ));
        assert!(
            e.contains("names bytes 1..4 of WQE 0.r0 outside every patch point"),
            "{e}"
        );
    }

    #[test]
    fn a_worker_may_copy_patch_point_bytes_but_nothing_else_of_a_wqe() {
        // A loopback WRITE whose gather is the READ's bucket address (a trigger's patch
        // point), onto the response's value address (declared for this WRITE).
        let copy = |byte| Op::Write {
            remote: Addr::wqe("0.r0", 40),
            sgl: vec![Sge::new(Addr::wqe("0.b0.read", byte), 8)],
            imm: None,
        };
        let declare = |p: &mut Program| {
            p.patches.push(crate::program::PatchPoint {
                label: "0.r0".into(),
                byte: 40,
                len: 8,
                source: PatchSource::Write { label: "x".into() },
            });
        };
        let mut p = with(1, "x", copy(16));
        declare(&mut p);
        let windows = named(&p);
        assert!(windows.contains(&(QueueRole::Worker, "0.b0.read".into(), 16, 24, Access::NONE)));
        assert!(windows.contains(&(
            QueueRole::Worker,
            "0.r0".into(),
            40,
            48,
            Access::REMOTE_WRITE | Access::LOCAL_WRITE
        )));
        // Its rkey, next to the patch point, is not a patch point's.
        let mut p = with(1, "x", copy(24));
        declare(&mut p);
        assert!(refusal(&p).contains("names bytes 24..32 of WQE 0.b0.read"));
    }

    #[test]
    fn a_copy_into_a_wqe_is_contained_over_its_whole_length() {
        // 8 bytes from the READ's bucket address onto the response's value address at 44:
        // bytes 44..52, past the patch point 40..48 declared for the copy.
        let mut p = with(
            1,
            "x",
            Op::Write {
                remote: Addr::wqe("0.r0", 44),
                sgl: vec![Sge::new(Addr::wqe("0.b0.read", 16), 8)],
                imm: None,
            },
        );
        p.patches.push(crate::program::PatchPoint {
            label: "0.r0".into(),
            byte: 40,
            len: 8,
            source: PatchSource::Write { label: "x".into() },
        });
        assert!(refusal(&p).contains("names bytes 44..52 of WQE 0.r0"));
    }

    #[test]
    fn a_window_ends_at_its_wqes_last_byte_and_never_past_it() {
        // A two-BB WRITE (four gather entries), and a READ landing at bytes `byte..byte + 8`
        // of it, declared there.
        let landing = |byte: u32| {
            let mut p = with(
                1,
                "two",
                Op::Write {
                    remote: Addr::region("table", 0),
                    sgl: (0..4)
                        .map(|_| Sge::new(Addr::region("values", 0), 8))
                        .collect(),
                    imm: None,
                },
            );
            assert_eq!(p.queues[1].wqes.last().unwrap().op.bbs(), 2);
            p.queues[1].wqes.push(Wqe {
                label: "x".into(),
                op: Op::Read {
                    remote: Addr::region("table", 0),
                    sgl: vec![Sge::new(Addr::wqe("two", byte as usize), 8)],
                },
                flags: WqeFlags::NONE,
                form: Form::Active,
            });
            p.patches.push(crate::program::PatchPoint {
                label: "two".into(),
                byte,
                len: 8,
                source: PatchSource::Read { label: "x".into() },
            });
            p
        };
        let p = landing(120);
        let layout = p.layout().unwrap();
        let two = p.wqe_positions()["two"];
        let at = layout.sq[two.queue] + usize::try_from(two.bb).unwrap() * BB_SIZE;
        assert!(p.code_windows(&layout).unwrap().contains(&CodeWindow {
            side: QueueRole::Worker,
            offset: at + 120,
            len: 8,
            access: Access::LOCAL_WRITE,
            what: "WQE two bytes 120..128".into(),
        }));
        let e = refusal(&landing(124));
        assert!(
            e.contains("names bytes 124..132 of WQE two, past its 128 bytes"),
            "{e}"
        );
    }

    #[test]
    fn touching_patch_points_of_one_source_make_one_window() {
        // The bucket READ declared as two halves, 40..44 and 44..48, lands 8 bytes at 40.
        let mut p = with(
            1,
            "x",
            Op::Read {
                remote: Addr::region("table", 0),
                sgl: vec![Sge::new(Addr::wqe("0.r0", 40), 8)],
            },
        );
        for byte in [40, 44] {
            p.patches.push(crate::program::PatchPoint {
                label: "0.r0".into(),
                byte,
                len: 4,
                source: PatchSource::Read { label: "x".into() },
            });
        }
        assert!(named(&p).contains(&(
            QueueRole::Worker,
            "0.r0".into(),
            40,
            48,
            Access::LOCAL_WRITE
        )));
    }

    #[test]
    fn a_static_block_is_one_window_and_nothing_past_it() {
        let p = catalog::echo(16, 2).unwrap();
        let layout = p.layout().unwrap();
        let windows = p.code_windows(&layout).unwrap();
        let echo = windows
            .iter()
            .find(|w| w.what == "static echo")
            .expect("the echo block's window");
        assert_eq!((echo.offset, echo.len), (layout.statics[0], 32));
        // Its receive scattering one byte past the block.
        let mut p = p;
        p.queues[0].recvs[1].sgl[0] = Sge::new(Addr::static_("echo", 17), 16);
        assert!(refusal(&p).contains("16 bytes at offset 17 run past static block"));
        p.queues[0].recvs[1].sgl[0] = Sge::new(Addr::static_("nowhere", 0), 16);
        assert!(refusal(&p).contains("unknown static block \"nowhere\""));
    }

    #[test]
    fn a_window_covers_its_bytes_and_nothing_past_them() {
        let w = CodeWindow {
            side: QueueRole::Worker,
            offset: 64,
            len: 8,
            access: Access::LOCAL_WRITE,
            what: String::new(),
        };
        assert!(w.covers(64, 8) && w.covers(70, 2) && w.covers(72, 0));
        assert!(!w.covers(63, 1) && !w.covers(65, 8) && !w.covers(72, 1));
        assert!(!w.covers(usize::MAX, 2));
    }
}
