//! The general executor is the reference; every fast path (the one-BB loop, the hot re-run
//! loop, the doorbell hand-over) is an optimisation of it. This test runs the same random
//! programs with the fast paths off (`SoftNicConfig::fast_paths`) and on, under every
//! prefetch setting and with the enabled queue on the same PU as its master or another, and
//! requires them to end byte-for-byte equal: memory, completions, counters and queue states.
//!
//! A program is an exec soup of one-BB and multi-BB operations on a loopback queue Q,
//! extended with doorbell-ordered chain steps (SEND_EN of a managed queue M, then a WAIT for
//! its completions) and re-armed hot rings: M's four-slot ring runs again at every lap of its
//! enabled index, and Q's batch is posted again, the same bytes into the same slots, for
//! three rounds. Some operations WRITE valid WQE images over later slots of Q's own ring,
//! which run or not as the prefetch setting decides; some rounds plant a fault. Every WAIT
//! is one the program satisfies, so each run ends by itself and its result does not depend
//! on timing: only on the executor's semantics.

mod common;
use common::*;
use redn_program::wqe::{
    encode_wqe, CqeOpcode, Payload, RemoteAddr, Syndrome, WorkRequest, WqeFlags, WrOp, BB_SIZE,
};
use redn_sys::nic::{CqConfig, Nic, QpConfig, QpCounters};
use redn_sys::softnic::{Prefetch, SoftNic, SoftNicConfig};
use redn_sys::{Access, Cqn, QpState, Qpn, Rkey, VirtAddr};

/// Q's ring, which one round's batch fills exactly.
const Q_BBS: u32 = 64;
/// M's ring: four one-BB WQEs, run again at every lap.
const M_BBS: u64 = 4;
const ROUNDS: usize = 3;
/// The data region: Q's operations use `0..Q_AREA`; M's WRITEs copy `M_SRC` to `M_DST`
/// (nothing else touches either, so M running concurrently on another PU races with
/// nothing); the WQE images Q copies into its ring live at `IMAGES`.
const LEN: usize = 4096;
const Q_AREA: u64 = 2048;
const M_DST: u64 = 2048;
const M_SRC: u64 = 2560;
const IMAGES: u64 = 3072;

/// One executor configuration.
#[derive(Clone, Copy, Debug)]
struct Setup {
    fast_paths: bool,
    prefetch: Prefetch,
    same_pu: bool,
}

/// Everything a run leaves behind that its program determines (not the counters that
/// measure timing: WAIT stalls, RNR waits).
/// Memory is compared below `IMAGES`: the images hold addresses, which differ from run to
/// run (so do the rings' bytes, which are compared through what ran instead).
#[derive(Debug, PartialEq)]
struct Outcome {
    memory: Vec<u8>,
    q_cqes: Vec<Cqe>,
    m_cqes: Vec<Cqe>,
    produced: (u64, u64),
    counters: [Counts; 2],
    states: (QpState, QpState),
    consumed: (u64, u64),
}

/// A completion's fields that the program determines.
type Cqe = (u64, CqeOpcode, Result<(), Syndrome>, u32, u16);

/// The counters a program determines.
#[derive(Debug, PartialEq)]
struct Counts {
    wqes: [u64; 32],
    bytes: u64,
    errors: u64,
    recvs: u64,
    host_posts: u64,
}

impl From<QpCounters> for Counts {
    fn from(c: QpCounters) -> Counts {
        Counts {
            wqes: c.wqes,
            bytes: c.bytes,
            errors: c.errors,
            recvs: c.recvs,
            host_posts: c.host_posts,
        }
    }
}

/// One entry of a round's batch, before the round's counts are filled in.
#[derive(Clone)]
enum Item {
    Op(WrOp, WqeFlags),
    /// SEND_EN M this many more BBs, then WAIT for the completions that makes.
    Chain(u64),
    /// WAIT on Q's own CQ for its n-th signaled completion so far, picked by this number.
    WaitOwn(u64),
    /// WRITE image `image` over the placeholder NOP at batch position `target`.
    Patch {
        image: u64,
        target: usize,
    },
    /// A NOP that a `Patch` may overwrite.
    Placeholder,
}

/// The program: M's four WQEs (and which are signaled) and Q's batch, with the round
/// (if any) whose batch plants a fault instead of its first operation.
struct Program {
    m: Vec<(WrOp, WqeFlags)>,
    batch: Vec<Item>,
    fault_round: Option<usize>,
}

const SIG: WqeFlags = WqeFlags::SIGNALED;

fn one_bb_write(src: u64, dst: u64, len: u32, mr: &redn_sys::nic::MrInfo) -> WrOp {
    WrOp::Write {
        remote: mr.remote(dst),
        payload: Payload::Sgl(vec![mr.sge(src, len)]),
        imm: None,
    }
}

fn bbs(op: &WrOp) -> u32 {
    let wr = WorkRequest {
        wr_id: 0,
        flags: WqeFlags::NONE,
        op: op.clone(),
    };
    u32::try_from(encode_wqe(&wr, Qpn(0), 0).unwrap().bbs()).unwrap()
}

/// A random one-sided operation inside Q's area (region `mr`).
fn random_op(rng: &mut Rng, mr: &redn_sys::nic::MrInfo) -> WrOp {
    let len = 1 + rng.below32(64);
    let at = |rng: &mut Rng, len: u32| rng.below(Q_AREA - u64::from(len) + 1);
    match rng.below(9) {
        0 => WrOp::Nop {
            raw_segments: Vec::new(),
        },
        1 | 2 => one_bb_write(at(rng, len), at(rng, len), len, mr),
        3 | 4 => WrOp::Read {
            remote: mr.remote(at(rng, len)),
            sgl: vec![mr.sge(at(rng, len), len)],
        },
        5 => WrOp::Read {
            remote: mr.remote(at(rng, 2 * len)),
            sgl: vec![mr.sge(at(rng, len), len), mr.sge(at(rng, len), len)],
        },
        6 => WrOp::Write {
            remote: mr.remote(at(rng, len)),
            payload: Payload::Inline((0..len).map(|_| rng.byte()).collect()),
            imm: None,
        },
        // A byte-reversing READ (`Builder::advance_count`'s): one-byte entries at descending
        // consecutive addresses, 2 to 6 of them (a WQE of at most two BBs).
        7 => {
            let n = 2 + rng.below32(5);
            let top = at(rng, n) + u64::from(n) - 1;
            WrOp::Read {
                remote: mr.remote(at(rng, n)),
                sgl: (0..u64::from(n)).map(|i| mr.sge(top - i, 1)).collect(),
            }
        }
        _ => {
            let word = |rng: &mut Rng| rng.below(Q_AREA / 8) * 8;
            let remote = mr.remote(word(rng));
            let result = (rng.below(3) != 0).then(|| mr.sge(word(rng), 8));
            random_atomic(rng, remote, result)
        }
    }
}

/// Signaled, unsignaled (hot when run again) or fenced, at random.
fn random_flags(rng: &mut Rng) -> WqeFlags {
    match rng.below(4) {
        0 | 1 => WqeFlags::NONE,
        2 => SIG,
        _ => WqeFlags::FENCE,
    }
}

fn program(seed: u64, mr: &redn_sys::nic::MrInfo) -> Program {
    let mut rng = Rng(seed);
    let m = (0..M_BBS)
        .map(|_| {
            let op = if rng.below(2) == 0 {
                WrOp::Nop {
                    raw_segments: Vec::new(),
                }
            } else {
                let len = 1 + rng.below32(64);
                let off = rng.below(256 - u64::from(len));
                one_bb_write(M_SRC + off, M_DST + off, len, mr)
            };
            (
                op,
                if rng.below(2) == 0 {
                    SIG
                } else {
                    WqeFlags::NONE
                },
            )
        })
        .collect();
    let mut batch = Vec::new();
    let mut used = 0;
    let mut placeholders = Vec::new();
    // Leave room for the largest item (a 2-BB op) and fill the rest with NOPs below.
    while used + 4 <= Q_BBS {
        let item = match rng.below(10) {
            0 | 1 => Item::Chain(1 + rng.below(3)),
            2 => Item::WaitOwn(rng.next()),
            3 | 4 => Item::Placeholder,
            // Its target, the first placeholder after it, is found below.
            5 => Item::Patch {
                image: rng.below(3),
                target: usize::MAX,
            },
            _ => Item::Op(random_op(&mut rng, mr), random_flags(&mut rng)),
        };
        used += match &item {
            Item::Op(op, _) => bbs(op),
            Item::Chain(_) => 2,
            Item::WaitOwn(_) | Item::Patch { .. } | Item::Placeholder => 1,
        };
        batch.push(item);
    }
    while used < Q_BBS {
        batch.push(Item::Op(
            WrOp::Nop {
                raw_segments: Vec::new(),
            },
            WqeFlags::NONE,
        ));
        used += 1;
    }
    // Each patch targets the first placeholder after it (a slot that has not run yet);
    // a patch with none after it becomes a placeholder itself.
    for i in (0..batch.len()).rev() {
        match batch[i] {
            Item::Placeholder => placeholders.push(i),
            Item::Patch { image, .. } => {
                batch[i] = match placeholders.last() {
                    Some(&target) => Item::Patch { image, target },
                    None => Item::Placeholder,
                };
                if matches!(batch[i], Item::Placeholder) {
                    placeholders.push(i);
                }
            }
            _ => {}
        }
    }
    let fault_round = (seed % 4 == 0).then(|| rng.index(ROUNDS));
    Program {
        m,
        batch,
        fault_round,
    }
}

/// The WQE images a patch may copy into Q's ring: a signaled NOP, an unsignaled WRITE, a
/// signaled WRITE (both inside Q's area).
fn images(mr: &redn_sys::nic::MrInfo) -> Vec<WorkRequest> {
    vec![
        WorkRequest {
            wr_id: 0,
            flags: SIG,
            op: WrOp::Nop {
                raw_segments: Vec::new(),
            },
        },
        WorkRequest {
            wr_id: 0,
            flags: WqeFlags::NONE,
            op: one_bb_write(8, 1024, 16, mr),
        },
        WorkRequest {
            wr_id: 0,
            flags: SIG,
            op: one_bb_write(512, 1536, 24, mr),
        },
    ]
}

fn run(seed: u64, setup: Setup) -> Outcome {
    let mut cfg = SoftNicConfig::new("differential");
    cfg.pus = 2;
    cfg.prefetch = setup.prefetch;
    cfg.fast_paths = setup.fast_paths;
    let nic = SoftNic::new(cfg).unwrap();
    let pd = nic.alloc_pd().unwrap();
    let data = Region::new(&nic, pd, LEN, Access::ALL);
    let mut fill = Rng(seed ^ 0xd1ff);
    let initial: Vec<u8> = (0..LEN).map(|_| fill.byte()).collect();
    data.write(0, &initial);
    let q_cq = nic.create_cq(CqConfig::new(4096)).unwrap();
    let m_cq = nic.create_cq(CqConfig::new(4096)).unwrap();
    let mut c = QpConfig::new(pd, q_cq);
    c.sq_bbs = Q_BBS;
    c.pu = Some(0);
    let q = nic.create_qp(c).unwrap();
    let mut c = QpConfig::new(pd, m_cq);
    c.sq_bbs = u32::try_from(M_BBS).unwrap();
    c.managed_send = true;
    c.pu = Some(if setup.same_pu { 0 } else { 1 });
    let m = nic.create_qp(c).unwrap();
    for qp in [q.qpn, m.qpn] {
        nic.connect(qp, qp).unwrap();
    }
    let ring = nic
        .reg_mr(
            pd,
            &q.sq.buffer,
            q.sq.offset,
            Q_BBS as usize * BB_SIZE,
            Access::ALL,
        )
        .unwrap();
    for (i, image) in images(&data.mr).iter().enumerate() {
        let w = encode_wqe(image, q.qpn, 0).unwrap();
        data.write(
            usize::try_from(IMAGES).unwrap() + i * BB_SIZE,
            &w.bytes()[..BB_SIZE],
        );
    }
    let p = program(seed, &data.mr);
    let m_wrs: Vec<WorkRequest> =
        p.m.iter()
            .map(|(op, flags)| wr(0, *flags, op.clone()))
            .collect();
    nic.post_send(m.qpn, &m_wrs).unwrap();
    let m_signaled: Vec<bool> = p.m.iter().map(|(_, f)| f.signaled()).collect();
    // M's completions once enabled up to `e` (M never fails: its WRITEs are in bounds).
    let m_count = |e: u64| -> u64 {
        let lap = m_signaled.iter().filter(|&&s| s).count() as u64;
        (e / M_BBS) * lap
            + m_signaled[..usize::try_from(e % M_BBS).unwrap()]
                .iter()
                .filter(|&&s| s)
                .count() as u64
    };
    let mut enabled = 0u64;
    // What M was enabled for by the rounds that ran to their end (a faulted round's enables
    // are flushed: its fault is its first WQE).
    let mut m_enabled = 0u64;
    let mut q_signaled = 0u64;
    let mut posted = 0u64;
    for round in 0..ROUNDS {
        let mut wrs = Vec::new();
        for (i, item) in p.batch.iter().enumerate() {
            let id = (round * p.batch.len() + i) as u64;
            let w = match item {
                _ if p.fault_round == Some(round) && i == 0 => {
                    // A READ through a key nobody has: a remote access error.
                    let op = WrOp::Read {
                        remote: RemoteAddr {
                            addr: VirtAddr(data.mr.addr.0),
                            rkey: Rkey(0x00de_ad01),
                        },
                        sgl: vec![data.mr.sge(0, 8)],
                    };
                    vec![wr(id, WqeFlags::NONE, op)]
                }
                Item::Op(op, flags) => vec![wr(id, *flags, op.clone())],
                Item::Chain(k) => {
                    enabled += k;
                    let target = u32::try_from(enabled % (1 << 16)).unwrap();
                    let mut v = vec![wr(
                        id,
                        WqeFlags::NONE,
                        WrOp::SendEnable {
                            qp: m.qpn,
                            pi: target,
                        },
                    )];
                    let want = m_count(enabled);
                    let wait = if want > 0 {
                        WrOp::Wait {
                            cq: m_cq,
                            count: u32::try_from(want - 1).unwrap(),
                        }
                    } else {
                        WrOp::Nop {
                            raw_segments: Vec::new(),
                        }
                    };
                    v.push(wr(id, WqeFlags::NONE, wait));
                    v
                }
                Item::WaitOwn(n) if q_signaled > 0 => vec![wr(
                    id,
                    WqeFlags::NONE,
                    WrOp::Wait {
                        cq: q_cq,
                        count: u32::try_from(n % q_signaled).unwrap(),
                    },
                )],
                Item::Patch { image, target } => {
                    // The target's slot: the BBs of the items before it.
                    let slot: u32 = p.batch[..*target]
                        .iter()
                        .map(|it| match it {
                            Item::Op(op, _) => bbs(op),
                            Item::Chain(_) => 2,
                            _ => 1,
                        })
                        .sum();
                    let op = WrOp::Write {
                        remote: ring.remote(u64::from(slot) * BB_SIZE as u64),
                        payload: Payload::Sgl(vec![data.mr.sge(
                            IMAGES + image * BB_SIZE as u64,
                            u32::try_from(BB_SIZE).unwrap(),
                        )]),
                        imm: None,
                    };
                    vec![wr(id, WqeFlags::NONE, op)]
                }
                Item::WaitOwn(_) | Item::Placeholder => vec![wr(
                    id,
                    WqeFlags::NONE,
                    WrOp::Nop {
                        raw_segments: Vec::new(),
                    },
                )],
            };
            // Signaled WQEs of Q so far, for later WAITs on its own CQ (a patched slot may
            // add one more, which only makes such a WAIT pass sooner).
            q_signaled += w.iter().filter(|w| w.flags.signaled()).count() as u64;
            wrs.extend(w);
        }
        nic.post_send(q.qpn, &wrs).unwrap();
        posted += wrs.iter().map(|w| u64::from(bbs(&w.op))).sum::<u64>();
        let deadline = std::time::Instant::now() + patience(10);
        while nic.sq_consumed(q.qpn).unwrap() < posted {
            assert!(
                std::time::Instant::now() < deadline,
                "seed {seed} {setup:?}: round {round} stalled at {} of {posted}",
                nic.sq_consumed(q.qpn).unwrap()
            );
            std::thread::yield_now();
        }
        if nic.qp_state(q.qpn).unwrap() == QpState::Error {
            break;
        }
        m_enabled = enabled;
    }
    // M runs what it was enabled for (its completions come after its counts).
    let deadline = std::time::Instant::now() + patience(10);
    while nic.sq_consumed(m.qpn).unwrap() < m_enabled
        || nic.cq_produced(m_cq).unwrap() < m_count(m_enabled)
    {
        assert!(
            std::time::Instant::now() < deadline,
            "seed {seed} {setup:?}: M stalled at {} of {m_enabled}",
            nic.sq_consumed(m.qpn).unwrap()
        );
        std::thread::yield_now();
    }
    let poll = |cq: Cqn| {
        let mut out = Vec::new();
        while nic.poll_cq(cq, 256, &mut out).unwrap() > 0 {}
        out.iter()
            .map(|c| (c.wr_id, c.opcode, c.status, c.byte_len, c.cqe.wqe_counter))
            .collect::<Vec<Cqe>>()
    };
    Outcome {
        memory: data.read(0, usize::try_from(IMAGES).unwrap()),
        q_cqes: poll(q_cq),
        m_cqes: poll(m_cq),
        produced: (
            nic.cq_produced(q_cq).unwrap(),
            nic.cq_produced(m_cq).unwrap(),
        ),
        counters: [
            nic.counters(q.qpn).unwrap().into(),
            nic.counters(m.qpn).unwrap().into(),
        ],
        states: (nic.qp_state(q.qpn).unwrap(), nic.qp_state(m.qpn).unwrap()),
        consumed: (
            nic.sq_consumed(q.qpn).unwrap(),
            nic.sq_consumed(m.qpn).unwrap(),
        ),
    }
}

/// The first difference between two outcomes, readably.
fn first_difference(a: &Outcome, b: &Outcome) -> String {
    let n = a.memory.len();
    if let Some(i) = (0..n).find(|&i| a.memory[i] != b.memory[i]) {
        return format!(
            "memory from byte {i}: reference {:02x?}, fast {:02x?}",
            &a.memory[i..(i + 16).min(n)],
            &b.memory[i..(i + 16).min(n)]
        );
    }
    if a.q_cqes != b.q_cqes {
        let i = a.q_cqes.iter().zip(&b.q_cqes).position(|(x, y)| x != y);
        return format!(
            "Q's completions ({} vs {}), first differing {:?}: {:?} vs {:?}",
            a.q_cqes.len(),
            b.q_cqes.len(),
            i,
            i.map(|i| a.q_cqes[i]),
            i.map(|i| b.q_cqes[i])
        );
    }
    if a.m_cqes != b.m_cqes {
        return format!("M's completions ({} vs {})", a.m_cqes.len(), b.m_cqes.len());
    }
    format!(
        "produced {:?} vs {:?}, counters {:?} vs {:?}, states {:?} vs {:?}, consumed {:?} vs {:?}",
        a.produced, b.produced, a.counters, b.counters, a.states, b.states, a.consumed, b.consumed
    )
}

#[test]
fn fast_paths_end_byte_for_byte_where_the_general_executor_does() {
    // Fewer in a debug build, whose executor is many times slower.
    let seeds = if cfg!(miri) {
        1
    } else if cfg!(debug_assertions) {
        8
    } else {
        32
    };
    let prefetches = [
        Prefetch::AtExecute,
        Prefetch::Depth(8),
        Prefetch::Adversarial,
    ];
    for seed in 1..=seeds {
        for prefetch in prefetches {
            for same_pu in [true, false] {
                let setup = |fast_paths| Setup {
                    fast_paths,
                    prefetch,
                    same_pu,
                };
                let reference = run(seed, setup(false));
                let fast = run(seed, setup(true));
                assert!(
                    reference == fast,
                    "seed {seed}, {prefetch:?}, M on the same PU: {same_pu}: {}",
                    first_difference(&reference, &fast)
                );
            }
        }
    }
}

#[test]
fn the_programs_reach_every_path() {
    // The soup must exercise what the fast paths optimise: one-BB moves and atomics,
    // multi-BB WQEs, chain steps that complete, hot re-runs (unsignaled WQEs posted again),
    // byte-reversing READs (replayed when run again), patched slots, and planted faults.
    let mut faults = 0;
    let mut chains = 0;
    let mut patches = 0;
    let mut reversing = 0;
    for seed in 1..=16 {
        let setup = Setup {
            fast_paths: true,
            prefetch: Prefetch::Depth(8),
            same_pu: true,
        };
        let o = run(seed, setup);
        faults += usize::from(o.states.0 == QpState::Error);
        chains += usize::from(o.counters[1].wqes.iter().sum::<u64>() > 0);
        let mut nic_cfg = SoftNicConfig::new("count");
        nic_cfg.pus = 1;
        let nic = SoftNic::new(nic_cfg).unwrap();
        let pd = nic.alloc_pd().unwrap();
        let data = Region::new(&nic, pd, LEN, Access::ALL);
        let batch = program(seed, &data.mr).batch;
        patches += batch
            .iter()
            .filter(|i| matches!(i, Item::Patch { .. }))
            .count();
        reversing += batch
            .iter()
            .filter(|i| match i {
                Item::Op(WrOp::Read { sgl, .. }, _) => {
                    sgl.len() > 1 && sgl.iter().all(|e| e.len == 1)
                }
                _ => false,
            })
            .count();
    }
    assert!(faults > 0, "no run faulted");
    assert!(chains > 8, "few runs enabled M: {chains}");
    assert!(patches > 0, "no program patches its ring");
    assert!(reversing > 0, "no program has a byte-reversing READ");
}
