//! The executor's fast path and its general path agree. The same random stream of work
//! requests runs on a queue without a rate limit (one-BB WQEs take the fast path) and on one
//! with a limit too high to ever hold anything back (a rate-limited queue always takes the
//! general path); both must end with the same memory, the same completions and the same
//! counters, including when a WQE in the middle faults.

mod common;
use common::*;
use redn_program::wqe::{Opcode, Payload, RemoteAddr, WqeFlags, WrOp, BB_SIZE, SEG_SIZE};
use redn_sys::conv::idx;
use redn_sys::nic::{Completion, Nic, RateLimit};
use redn_sys::softnic::Prefetch;
use redn_sys::{Access, Cqn, Rkey, VirtAddr};

const LEN: usize = 4096;
/// Work requests per stream (few under Miri, whose slowness meets the tests' 5 s waits).
const WRS: usize = if cfg!(miri) { 8 } else { 160 };
const SIG: WqeFlags = WqeFlags::SIGNALED;

/// Everything a run leaves behind.
#[derive(Debug, PartialEq)]
struct Outcome {
    local: Vec<u8>,
    remote: Vec<u8>,
    completions: Vec<(u64, Result<(), redn_program::wqe::Syndrome>, u32)>,
    wqes: [u64; 32],
    bytes: u64,
    errors: u64,
}

/// A random work request at position `i` (every one signaled, so WQE k's completion is
/// index k and a WAIT for an earlier one passes). `fault` makes this one refused.
fn random_wr(rng: &mut Rng, i: u64, local: &Region, remote: &Region, cq: Cqn, fault: bool) -> WrOp {
    let len = 1 + rng.below32(64);
    let off = |rng: &mut Rng, len: u32| rng.below(LEN as u64 - u64::from(len) + 1);
    if fault {
        return match rng.below(3) {
            // One byte past the end of the remote region.
            0 => WrOp::Write {
                remote: remote.mr.remote(LEN as u64 - u64::from(len) + 1),
                payload: Payload::Sgl(vec![local.mr.sge(0, len)]),
                imm: None,
            },
            1 => WrOp::Read {
                remote: RemoteAddr {
                    addr: VirtAddr(remote.mr.addr.0),
                    rkey: Rkey(0x00dead01),
                },
                sgl: vec![local.mr.sge(0, len)],
            },
            _ => WrOp::Wait {
                cq: Cqn(0x00ff_fff0),
                count: 0,
            },
        };
    }
    match rng.below(9) {
        0 => WrOp::Nop {
            raw_segments: Vec::new(),
        },
        1 | 2 => WrOp::Write {
            remote: remote.mr.remote(off(rng, len)),
            payload: Payload::Sgl(vec![local.mr.sge(off(rng, len), len)]),
            imm: None,
        },
        3 | 4 => WrOp::Read {
            remote: remote.mr.remote(off(rng, len)),
            sgl: vec![local.mr.sge(off(rng, len), len)],
        },
        // Two scatter entries: one BB, but not a one-segment READ.
        5 => WrOp::Read {
            remote: remote.mr.remote(off(rng, 2 * len)),
            sgl: vec![
                local.mr.sge(off(rng, len), len),
                local.mr.sge(off(rng, len), len),
            ],
        },
        6 => WrOp::Write {
            remote: remote.mr.remote(off(rng, len)),
            payload: Payload::Inline((0..len).map(|_| rng.byte()).collect()),
            imm: None,
        },
        7 => {
            let at = remote.mr.remote(rng.below(LEN as u64 / 8) * 8);
            // With and without a result segment (a masked CAS with one takes two BBs).
            let result =
                (rng.below(3) != 0).then(|| local.mr.sge(rng.below(LEN as u64 / 8) * 8, 8));
            random_atomic(rng, at, result)
        }
        _ if i > 0 => WrOp::Wait {
            cq,
            count: u32::try_from(rng.below(i)).unwrap(),
        },
        _ => WrOp::Nop {
            raw_segments: Vec::new(),
        },
    }
}

/// A rate limit too high to ever hold anything back: a rate-limited queue always takes the
/// general path, so this makes `qpn` run every WQE there.
fn force_general_path(nic: &redn_sys::softnic::SoftNic, qpn: redn_sys::Qpn) {
    let limit = RateLimit::wqes(1 << 40).with_bytes(1 << 50);
    nic.set_rate_limit(qpn, limit).unwrap();
}

fn run(seed: u64, limited: bool) -> Outcome {
    let nic = nic(1, Prefetch::Depth(8));
    let pd = nic.alloc_pd().unwrap();
    let local = Region::new(&nic, pd, LEN, Access::ALL);
    let remote = Region::new(&nic, pd, LEN, Access::ALL);
    let mut fill = Rng(seed ^ 0x5eed);
    let bytes: Vec<u8> = (0..2 * LEN).map(|_| fill.byte()).collect();
    local.write(0, &bytes[..LEN]);
    remote.write(0, &bytes[LEN..]);
    let ep = endpoint(&nic, pd, |c| c.sq_bbs = 1024);
    nic.connect(ep.qp.qpn, ep.qp.qpn).unwrap();
    if limited {
        force_general_path(&nic, ep.qp.qpn);
    }
    let mut rng = Rng(seed);
    // A third of the streams fault somewhere: the rest is flushed.
    let fault_at = (seed % 3 == 0).then(|| rng.below(WRS as u64));
    let wrs: Vec<_> = (0..WRS as u64)
        .map(|i| {
            let op = random_wr(&mut rng, i, &local, &remote, ep.cq, fault_at == Some(i));
            wr(i, SIG, op)
        })
        .collect();
    nic.post_send(ep.qp.qpn, &wrs).unwrap();
    let done: Vec<Completion> = wait_cqes(&nic, ep.cq, WRS);
    let c = nic.counters(ep.qp.qpn).unwrap();
    Outcome {
        local: local.read(0, LEN),
        remote: remote.read(0, LEN),
        completions: done
            .iter()
            .map(|c| (c.wr_id, c.status, c.byte_len))
            .collect(),
        wqes: c.wqes,
        bytes: c.bytes,
        errors: c.errors,
    }
}

/// Equal outcomes, or a panic naming the first difference (not two dumps of 8 KiB).
fn assert_same(seed: u64, fast: &Outcome, general: &Outcome) {
    assert_eq!(
        fast.completions, general.completions,
        "seed {seed}: completions"
    );
    assert_eq!(
        (fast.wqes, fast.bytes, fast.errors),
        (general.wqes, general.bytes, general.errors),
        "seed {seed}: counters"
    );
    for (name, a, b) in [
        ("local", &fast.local, &general.local),
        ("remote", &fast.remote, &general.remote),
    ] {
        if let Some(at) = a.iter().zip(b.iter()).position(|(x, y)| x != y) {
            panic!(
                "seed {seed}: {name} memory differs from byte {at}: fast {:?}, general {:?}",
                &a[at..(at + 16).min(LEN)],
                &b[at..(at + 16).min(LEN)]
            );
        }
    }
}

#[test]
fn fast_and_general_paths_agree_on_random_streams() {
    let seeds = if cfg!(miri) { 2 } else { 24 };
    for seed in 1..=seeds {
        let fast = run(seed, false);
        let general = run(seed, true);
        let ran: u64 = fast.wqes.iter().sum();
        assert!(ran > 0, "seed {seed}: nothing ran");
        if seed % 3 != 0 {
            assert_eq!(ran, WRS as u64, "seed {seed}: every WQE ran");
            assert_eq!(fast.errors, 0, "seed {seed}");
        } else {
            assert_eq!(fast.errors, 1, "seed {seed}: the planted fault");
        }
        assert!(
            fast.wqes[Opcode::RdmaWrite as usize] > 0 && fast.wqes[Opcode::RdmaRead as usize] > 0,
            "seed {seed}: the stream has WRITEs and READs"
        );
        assert_same(seed, &fast, &general);
    }
}

/// Regions the recycled streams spread their local buffers over: more than a queue's key
/// cache holds (8), so entries are replaced while WQEs resolved through them stay in the ring.
const KEYS: usize = 10;
/// Length of each of those regions.
const PIECE: usize = 512;
/// BBs in the recycled ring (fewer under Miri, as `WRS`).
const RING: usize = if cfg!(miri) { 16 } else { 64 };

/// A random one-BB WRITE, READ or NOP: what the executor may resolve once and re-run.
fn recycled_wr(rng: &mut Rng, locals: &[Region], remote: &Region) -> WrOp {
    let len = [8, 64, 1 + rng.below32(64)][rng.index(3)];
    let local = &locals[rng.index(locals.len())];
    let l = local
        .mr
        .sge(rng.below(PIECE as u64 - u64::from(len) + 1), len);
    let r = remote.mr.remote(rng.below(LEN as u64 - u64::from(len) + 1));
    match rng.below(5) {
        0 => WrOp::Nop {
            raw_segments: Vec::new(),
        },
        1 | 2 => WrOp::Write {
            remote: r,
            payload: Payload::Sgl(vec![l]),
            imm: None,
        },
        _ => WrOp::Read {
            remote: r,
            sgl: vec![l],
        },
    }
}

/// What each round of [`run_recycled`] left behind.
type Rounds = Vec<Outcome>;

/// The same ring of one-BB WQEs posted again round after round (only the last one signaled),
/// with changes between rounds that must each undo what the executor resolved before:
/// round 2 rewrites some of the WQEs, round 3 copies new bytes into the source regions,
/// round 4 re-registers one local region under a new key and points its WQEs there, and
/// round 5 deregisters the remote region under WQEs that still name it (they fault).
fn run_recycled(seed: u64, limited: bool) -> Rounds {
    let nic = nic(1, Prefetch::Depth(8));
    let pd = nic.alloc_pd().unwrap();
    let mut locals: Vec<Region> = (0..KEYS)
        .map(|_| Region::new(&nic, pd, PIECE, Access::ALL))
        .collect();
    let remote = Region::new(&nic, pd, LEN, Access::ALL);
    let mut fill = Rng(seed ^ 0xf111);
    let refill = |locals: &[Region], fill: &mut Rng| {
        for l in locals {
            l.write(0, &(0..PIECE).map(|_| fill.byte()).collect::<Vec<_>>());
        }
    };
    refill(&locals, &mut fill);
    remote.write(0, &(0..LEN).map(|_| fill.byte()).collect::<Vec<_>>());
    let ep = endpoint(&nic, pd, |c| c.sq_bbs = u32::try_from(RING).unwrap());
    nic.connect(ep.qp.qpn, ep.qp.qpn).unwrap();
    if limited {
        force_general_path(&nic, ep.qp.qpn);
    }
    let mut rng = Rng(seed);
    let mut ops: Vec<WrOp> = (0..RING)
        .map(|_| recycled_wr(&mut rng, &locals, &remote))
        .collect();
    let mut rounds = Vec::new();
    let mut seen = 0;
    for round in 0..6 {
        match round {
            2 => {
                for _ in 0..8 {
                    let i = rng.index(RING);
                    ops[i] = recycled_wr(&mut rng, &locals, &remote);
                }
            }
            3 => refill(&locals, &mut fill),
            4 => {
                let i = rng.index(KEYS);
                let old = locals[i].mr.lkey;
                nic.dereg_mr(old).unwrap();
                let buf = std::sync::Arc::clone(&locals[i].buf);
                let mr = nic.reg_mr(pd, &buf, 0, PIECE, Access::ALL).unwrap();
                for op in &mut ops {
                    let sge = match op {
                        WrOp::Write {
                            payload: Payload::Sgl(sgl),
                            ..
                        } => &mut sgl[0],
                        WrOp::Read { sgl, .. } => &mut sgl[0],
                        _ => continue,
                    };
                    if sge.lkey == old {
                        sge.lkey = mr.lkey;
                    }
                }
                locals[i] = Region { buf, mr };
            }
            5 => nic.dereg_mr(remote.mr.lkey).unwrap(),
            _ => {}
        }
        let wrs: Vec<_> = ops
            .iter()
            .enumerate()
            .map(|(i, op)| {
                let last = i + 1 == RING;
                wr(
                    i as u64,
                    if last { SIG } else { WqeFlags::NONE },
                    op.clone(),
                )
            })
            .collect();
        nic.post_send(ep.qp.qpn, &wrs).unwrap();
        let done: Vec<Completion> = wait_cqes(&nic, ep.cq, 1);
        let failed = done.iter().any(|c| !c.is_ok());
        let c = nic.counters(ep.qp.qpn).unwrap();
        let mut local = Vec::new();
        for l in &locals {
            local.extend(l.read(0, PIECE));
        }
        rounds.push(Outcome {
            local,
            remote: remote.read(0, LEN),
            completions: done
                .iter()
                .map(|c| (c.wr_id + 100 * round, c.status, c.byte_len))
                .collect(),
            wqes: c.wqes,
            bytes: c.bytes,
            errors: c.errors,
        });
        seen += done.len();
        if failed {
            // The rest of the ring was flushed; the QP is in error.
            break;
        }
    }
    assert!(seen >= 6, "seed {seed}: a completion per round");
    rounds
}

#[test]
fn recycled_rings_agree_with_the_general_path_through_rewrites_and_new_keys() {
    let seeds = if cfg!(miri) { 1 } else { 12 };
    for seed in 1..=seeds {
        let fast = run_recycled(seed, false);
        let general = run_recycled(seed, true);
        assert_eq!(fast.len(), general.len(), "seed {seed}: rounds");
        assert_eq!(fast.len(), 6, "seed {seed}: every round ran");
        for (round, (f, g)) in fast.iter().zip(&general).enumerate() {
            assert_same(seed * 100 + round as u64, f, g);
        }
        let last = fast.last().unwrap();
        let moves = last.wqes[Opcode::RdmaWrite as usize] + last.wqes[Opcode::RdmaRead as usize];
        if moves > 0 {
            // Round 5's first WRITE or READ names the deregistered remote region.
            assert_eq!(last.errors, 1, "seed {seed}: the stale remote key faults");
        }
    }
}

#[test]
fn a_recycled_write_to_a_target_that_failed_lands_nowhere() {
    let nic = nic(1, Prefetch::Depth(8));
    let pd = nic.alloc_pd().unwrap();
    let src = Region::new(&nic, pd, PIECE, Access::ALL);
    let dst = Region::new(&nic, pd, PIECE, Access::ALL);
    let a = endpoint(&nic, pd, |c| c.sq_bbs = 16);
    let b = endpoint(&nic, pd, |c| c.sq_bbs = 16);
    nic.connect(a.qp.qpn, b.qp.qpn).unwrap();
    let writes: Vec<_> = (0..16u64)
        .map(|i| {
            let op = WrOp::Write {
                remote: dst.mr.remote(i * 32),
                payload: Payload::Sgl(vec![src.mr.sge(i * 32, 32)]),
                imm: None,
            };
            wr(i, if i == 15 { SIG } else { WqeFlags::NONE }, op)
        })
        .collect();
    for round in 0..3u8 {
        src.write(0, &[round + 1; PIECE]);
        if round == 2 {
            // B fails (a WRITE from an unknown key); A's WQEs are the same bytes as before.
            let bad = WrOp::Write {
                remote: src.mr.remote(0),
                payload: Payload::Sgl(vec![redn_program::wqe::Sge {
                    addr: src.mr.addr,
                    len: 8,
                    lkey: redn_sys::Lkey(0x00dead01),
                }]),
                imm: None,
            };
            nic.post_send(b.qp.qpn, &[wr(0, SIG, bad)]).unwrap();
            let failed = wait_cqes(&nic, b.cq, 1);
            assert!(!failed[0].is_ok(), "B's bad WRITE fails");
        }
        nic.post_send(a.qp.qpn, &writes).unwrap();
        let done = wait_cqes(&nic, a.cq, 1);
        if round < 2 {
            assert!(done[0].is_ok(), "round {round}: {done:?}");
            assert_eq!(dst.read(0, PIECE), vec![round + 1; PIECE], "round {round}");
        } else {
            assert!(
                !done[0].is_ok(),
                "a WRITE to a failed target fails: {done:?}"
            );
            assert_eq!(
                dst.read(0, PIECE),
                vec![2; PIECE],
                "nothing landed in round 2"
            );
        }
    }
}

/// A recycled ring that patches itself: WQE 0 rewrites the local address of WQE `near`
/// (within the prefetch depth of it) and of WQE `far` (beyond it) to the source the host
/// picked for this round. Returns, per round, the 8 bytes each of the two WRITEs copied.
fn self_patching_rounds(limited: bool) -> Vec<(Vec<u8>, Vec<u8>)> {
    const NEAR: u64 = 3;
    const FAR: u64 = 12;
    let nic = nic(1, Prefetch::Depth(8));
    let pd = nic.alloc_pd().unwrap();
    let data = Region::new(&nic, pd, 4096, Access::ALL);
    // Sources: "posted" at 0 (what the host writes into the WQEs), and one per round at 64+.
    data.write(0, b"posted!!");
    for r in 0..6u8 {
        data.write(64 + 8 * usize::from(r), &[b'a' + r; 8]);
    }
    let ep = endpoint(&nic, pd, |c| c.sq_bbs = 16);
    let ring = nic
        .reg_mr(
            pd,
            &ep.qp.sq.buffer,
            ep.qp.sq.offset,
            16 * BB_SIZE,
            Access::ALL,
        )
        .unwrap();
    nic.connect(ep.qp.qpn, ep.qp.qpn).unwrap();
    if limited {
        force_general_path(&nic, ep.qp.qpn);
    }
    let seg_addr = 2 * SEG_SIZE as u64 + 8; // a WRITE's data segment address
    let mut wrs = Vec::new();
    for i in 0..16u64 {
        let op = match i {
            // The patch source at 2048 holds this round's address twice.
            0 => WrOp::Write {
                remote: ring.remote(NEAR * BB_SIZE as u64 + seg_addr),
                payload: Payload::Sgl(vec![data.mr.sge(2048, 8)]),
                imm: None,
            },
            1 => WrOp::Write {
                remote: ring.remote(FAR * BB_SIZE as u64 + seg_addr),
                payload: Payload::Sgl(vec![data.mr.sge(2056, 8)]),
                imm: None,
            },
            NEAR | FAR => WrOp::Write {
                remote: data.mr.remote(1024 + 8 * i),
                payload: Payload::Sgl(vec![data.mr.sge(0, 8)]),
                imm: None,
            },
            _ => WrOp::Nop {
                raw_segments: Vec::new(),
            },
        };
        wrs.push(wr(i, if i == 15 { SIG } else { WqeFlags::NONE }, op));
    }
    let mut out = Vec::new();
    for r in 0..6u64 {
        let src = (data.mr.addr.0 + 64 + 8 * r).to_be_bytes();
        data.write(2048, &src);
        data.write(2056, &src);
        nic.post_send(ep.qp.qpn, &wrs).unwrap();
        let done = wait_cqes(&nic, ep.cq, 1);
        assert!(done[0].is_ok(), "round {r}: {done:?}");
        out.push((
            data.read(1024 + 8 * idx(NEAR), 8),
            data.read(1024 + 8 * idx(FAR), 8),
        ));
    }
    out
}

#[test]
fn a_recycled_ring_that_patches_itself_runs_stale_and_fresh_wqes_as_the_prefetch_decides() {
    let fast = self_patching_rounds(false);
    assert_eq!(fast, self_patching_rounds(true), "fast and general paths");
    for (r, (near, far)) in fast.iter().enumerate() {
        // The near WQE was fetched before the patch landed: it runs as posted, every round
        // (also once its slot is hot). The far one was fetched after: this round's source.
        assert_eq!(near, b"posted!!", "round {r}: near");
        assert_eq!(
            far,
            &vec![b'a' + u8::try_from(r).unwrap(); 8],
            "round {r}: far"
        );
    }
}

/// A ring longer than the executor keeps snapshots for (16 Ki BBs): slots 16 Ki apart share
/// one, so every fetch there finds another WQE's bytes and what was resolved from them. Each
/// WRITE must still run as posted, round after round.
#[test]
#[cfg_attr(miri, ignore = "a 32 Ki-BB ring is too slow under Miri")]
fn a_ring_longer_than_the_snapshots_runs_every_wqe_as_posted() {
    const BBS: usize = 32 << 10;
    let nic = nic(1, Prefetch::Depth(8));
    let pd = nic.alloc_pd().unwrap();
    let src = Region::new(&nic, pd, 4096, Access::ALL);
    let dst = Region::new(&nic, pd, BBS * 8, Access::ALL);
    let ep = endpoint(&nic, pd, |c| c.sq_bbs = u32::try_from(BBS).unwrap());
    nic.connect(ep.qp.qpn, ep.qp.qpn).unwrap();
    let wrs: Vec<_> = (0..BBS as u64)
        .map(|i| {
            let op = WrOp::Write {
                remote: dst.mr.remote(i * 8),
                payload: Payload::Sgl(vec![src.mr.sge(i * 8 % 4096, 8)]),
                imm: None,
            };
            let last = i + 1 == BBS as u64;
            wr(i, if last { SIG } else { WqeFlags::NONE }, op)
        })
        .collect();
    for round in 0..3u8 {
        // Bytes 0, 7, 14, ... (mod 256), again every 256.
        let fill: Vec<u8> = (0..=255u8)
            .cycle()
            .take(4096)
            .map(|i| i.wrapping_mul(7) ^ round)
            .collect();
        src.write(0, &fill);
        nic.post_send(ep.qp.qpn, &wrs).unwrap();
        let done = wait_cqes(&nic, ep.cq, 1);
        assert!(done[0].is_ok(), "round {round}: {done:?}");
        let got = dst.read(0, BBS * 8);
        for i in 0..BBS {
            let want = &fill[i * 8 % 4096..][..8];
            assert_eq!(&got[i * 8..][..8], want, "round {round}: WRITE {i}");
        }
    }
}
