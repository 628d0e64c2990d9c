//! What the fast paths (`softnic/exec/fast.rs`'s one-BB loop, `hot.rs`'s re-run loop) must
//! leave to the general executor, or do exactly as it does: WQEs with too few segments for
//! their opcode, a WRITE or READ whose `ds` is not one data segment's, a message over the
//! size cap, late responses around NOPs and hot slots, a re-posted WRITE whose byte count
//! changed, and re-run 64-byte moves at unaligned offsets. Every case runs with the fast
//! paths off (the reference) and on, under the prefetch settings that reach each arm, and
//! expects what is worked out by hand here, not what the code under test computes. Written
//! for the mutation run over those files (docs/testing.md, "Mutation testing"): each case
//! is one a mutant of the fast path's guards ran differently from the reference.

mod common;
use common::*;
use redn_program::wqe::{
    encode_wqe, off, wqe_index, Payload, Syndrome, WorkRequest, WqeFlags, WrOp, BB_SIZE,
};
use redn_sys::nic::{Completion, Nic, QpInfo};
use redn_sys::softnic::{Prefetch, SoftNic, SoftNicConfig};
use redn_sys::{Access, Pdn};

/// An executor path: fast paths on or off, and the prefetch model.
type Path = (bool, Prefetch);

/// Every path: the general executor alone, and the fast paths under each prefetch setting
/// (ahead, at execute, and with late landing, which some arms leave to `execute`).
const EVERY_PATH: [Path; 4] = [
    (false, Prefetch::Depth(8)),
    (true, Prefetch::Depth(8)),
    (true, Prefetch::AtExecute),
    (true, Prefetch::Adversarial),
];
/// For re-posted (hot) slots: the general executor, and the fast paths fetching at execute
/// (where the hot loop's own fetch compares a hot slot's words) and ahead (where the fast
/// path's fetch does).
const REPOST_PATHS: [Path; 3] = [
    (false, Prefetch::AtExecute),
    (true, Prefetch::AtExecute),
    (true, Prefetch::Depth(8)),
];
/// The general executor and the fast paths, fetching ahead.
const PLAIN_PATHS: [Path; 2] = [(false, Prefetch::Depth(8)), (true, Prefetch::Depth(8))];

fn softnic((fast_paths, prefetch): Path) -> SoftNic {
    let mut cfg = SoftNicConfig::new("fast-semantics");
    cfg.fast_paths = fast_paths;
    cfg.prefetch = prefetch;
    cfg.pus = 1;
    SoftNic::new(cfg).unwrap()
}

/// A queue of `sq_bbs` BBs in `pd` of `nic`, connected to itself.
fn looped(nic: &SoftNic, pd: Pdn, sq_bbs: u32) -> Endpoint {
    let q = endpoint(nic, pd, |c| c.sq_bbs = sq_bbs);
    nic.connect(q.qp.qpn, q.qp.qpn).unwrap();
    q
}

/// The one-BB image of `wr` as slot `index` of `qp`'s ring holds it, after `patch`.
fn image(qp: &QpInfo, index: u64, wr: &WorkRequest, patch: impl FnOnce(&mut [u8])) -> Vec<u8> {
    let mut e = encode_wqe(wr, qp.qpn, wqe_index(index)).unwrap();
    assert_eq!(e.bbs(), 1, "{:?}", wr.op);
    patch(e.bytes_mut());
    e.bytes()[..BB_SIZE].to_vec()
}

/// Write one-BB `images` into `qp`'s ring from index `start` on (wr_ids `start`, ...) and
/// ring the doorbell once for all of them; returns the index after them.
fn post_images(nic: &SoftNic, qp: &QpInfo, start: u64, images: &[Vec<u8>]) -> u64 {
    let entries = u64::from(qp.sq.entries);
    for (i, img) in images.iter().enumerate() {
        let pi = start + i as u64;
        let slot = usize::try_from(pi % entries).unwrap();
        qp.sq.buffer.write(qp.sq.offset + slot * BB_SIZE, img);
        nic.note_posted(qp.qpn, pi, pi + 1, pi).unwrap();
    }
    let end = start + images.len() as u64;
    nic.ring_doorbell(qp.qpn, end).unwrap();
    end
}

const NOP: WrOp = WrOp::Nop {
    raw_segments: Vec::new(),
};

/// The WQEs whose `ds` is patched below what their opcode needs (NOP 1, WAIT and enables 2,
/// CAS, FETCH_ADD and masked FETCH_ADD 3, masked CAS 4; a WRITE or READ needs its remote
/// segment, 2): the general executor refuses each as a local QP operation error without
/// touching memory, and the fast path must not run it.
#[test]
fn a_wqe_with_too_few_segments_for_its_opcode_fails_on_every_path() {
    const TARGET: u64 = 64;
    const OLD: u64 = 0x1111_2222_3333_4444;
    for path in EVERY_PATH {
        let nic = softnic(path);
        let pd = nic.alloc_pd().unwrap();
        let mem = Region::new(&nic, pd, 4096, ALL);
        let managed_send = endpoint(&nic, pd, |c| c.managed_send = true);
        let managed_recv = endpoint(&nic, pd, |c| c.managed_recv = true);
        for q in [&managed_send, &managed_recv] {
            nic.connect(q.qp.qpn, q.qp.qpn).unwrap();
        }
        let remote = mem.mr.remote(TARGET);
        let result = Some(mem.mr.sge(256, 8));
        // The cases for queue `q` (the WAIT waits on its CQ).
        let cases = |q: &Endpoint| -> Vec<(&str, WrOp, u8)> {
            vec![
                ("NOP", NOP, 0),
                ("WAIT", WrOp::Wait { cq: q.cq, count: 0 }, 1),
                (
                    "SEND_EN",
                    WrOp::SendEnable {
                        qp: managed_send.qp.qpn,
                        pi: 0,
                    },
                    1,
                ),
                (
                    "RECV_EN",
                    WrOp::RecvEnable {
                        qp: managed_recv.qp.qpn,
                        pi: 0,
                    },
                    1,
                ),
                (
                    "CAS",
                    WrOp::CompareSwap {
                        remote,
                        compare: OLD,
                        swap: 7,
                        result,
                    },
                    2,
                ),
                (
                    "FETCH_ADD",
                    WrOp::FetchAdd {
                        remote,
                        add: 1,
                        result,
                    },
                    2,
                ),
                (
                    "masked FETCH_ADD",
                    WrOp::MaskedFetchAdd {
                        remote,
                        add: 1,
                        field_boundary: 0,
                        result,
                    },
                    2,
                ),
                (
                    "masked CAS",
                    WrOp::MaskedCompareSwap {
                        remote,
                        compare: OLD,
                        compare_mask: !0,
                        swap: 7,
                        swap_mask: !0,
                        result: None,
                    },
                    3,
                ),
                (
                    "WRITE",
                    WrOp::Write {
                        remote,
                        payload: Payload::Sgl(vec![mem.mr.sge(1024, 8)]),
                        imm: None,
                    },
                    1,
                ),
                (
                    "READ",
                    WrOp::Read {
                        remote: mem.mr.remote(1024),
                        sgl: vec![mem.mr.sge(TARGET, 8)],
                    },
                    1,
                ),
            ]
        };
        for case in 0..10 {
            // Each refusal moves its queue to error: a queue of its own per case.
            let q = looped(&nic, pd, 64);
            let (what, op, ds) = cases(&q).swap_remove(case);
            mem.write(usize::try_from(TARGET).unwrap(), &OLD.to_be_bytes());
            mem.write(1024, &[0xee; 8]);
            // A signaled NOP first, so the WAIT's count (0) is passed: only its ds is wrong.
            let images = [
                image(&q.qp, 0, &wr(0, SIG, NOP), |_| {}),
                image(&q.qp, 1, &wr(1, SIG, op), |b| b[off::DS] = ds),
            ];
            post_images(&nic, &q.qp, 0, &images);
            let done = wait_cqes(&nic, q.cq, 2);
            assert!(done[0].is_ok(), "{path:?} {what}: {done:?}");
            assert_eq!(
                done[1].status,
                Err(Syndrome::LocalQpOperation),
                "{path:?}: {what} with ds {ds}"
            );
            assert_eq!(
                mem.read(usize::try_from(TARGET).unwrap(), 8),
                OLD.to_be_bytes(),
                "{path:?}: {what} with ds {ds} changed its target"
            );
        }
    }
}

/// A WRITE or READ of ds 2 has no data segment: it moves nothing, whatever the bytes past its
/// remote segment hold (here a data segment that a ds of 3 would move), and completes.
#[test]
fn a_write_or_read_without_a_data_segment_moves_nothing() {
    for path in EVERY_PATH {
        let nic = softnic(path);
        let pd = nic.alloc_pd().unwrap();
        let mem = Region::new(&nic, pd, 4096, ALL);
        let q = looped(&nic, pd, 64);
        mem.write(0, &[0xaa; 16]);
        mem.write(512, &[0x55; 16]);
        let write = WrOp::Write {
            remote: mem.mr.remote(512),
            payload: Payload::Sgl(vec![mem.mr.sge(0, 16)]),
            imm: None,
        };
        let read = WrOp::Read {
            remote: mem.mr.remote(0),
            sgl: vec![mem.mr.sge(512, 16)],
        };
        let images = [
            image(&q.qp, 0, &wr(0, SIG, write), |b| b[off::DS] = 2),
            image(&q.qp, 1, &wr(1, SIG, read), |b| b[off::DS] = 2),
        ];
        post_images(&nic, &q.qp, 0, &images);
        let done = wait_cqes(&nic, q.cq, 2);
        assert!(done.iter().all(Completion::is_ok), "{path:?}: {done:?}");
        assert_eq!(done[1].byte_len, 0, "{path:?}: the READ's byte count");
        assert_eq!(
            mem.read(0, 16),
            [0xaa; 16],
            "{path:?}: the READ's destination"
        );
        assert_eq!(
            mem.read(512, 16),
            [0x55; 16],
            "{path:?}: the WRITE's destination"
        );
    }
}

/// A one-segment WRITE or READ of one byte more than the 16 MiB message cap is refused as a
/// local length error, and moves nothing; one of exactly the cap moves it all.
#[test]
fn a_move_over_the_message_cap_is_a_local_length_error() {
    const CAP: usize = 16 << 20;
    for path in PLAIN_PATHS {
        let nic = softnic(path);
        let pd = nic.alloc_pd().unwrap();
        let src = Region::new(&nic, pd, CAP + 1, ALL);
        let dst = Region::new(&nic, pd, CAP + 1, ALL);
        src.write(CAP - 1, &[1, 2]);
        let write = |len: usize| WrOp::Write {
            remote: dst.mr.remote(0),
            payload: Payload::Sgl(vec![src.mr.sge(0, u32::try_from(len).unwrap())]),
            imm: None,
        };
        let read = |len: usize| WrOp::Read {
            remote: src.mr.remote(0),
            sgl: vec![dst.mr.sge(0, u32::try_from(len).unwrap())],
        };
        for (what, op) in [("WRITE", write(CAP + 1)), ("READ", read(CAP + 1))] {
            let q = looped(&nic, pd, 64);
            nic.post_send(q.qp.qpn, &[wr(1, SIG, op)]).unwrap();
            let done = wait_cqes(&nic, q.cq, 1).remove(0);
            assert_eq!(done.status, Err(Syndrome::LocalLength), "{path:?}: {what}");
            assert_eq!(dst.read(CAP - 1, 2), [0, 0], "{path:?}: {what} moved bytes");
        }
        let q = looped(&nic, pd, 64);
        nic.post_send(q.qp.qpn, &[wr(1, SIG, write(CAP))]).unwrap();
        assert!(wait_cqes(&nic, q.cq, 1)[0].is_ok(), "{path:?}");
        assert_eq!(dst.read(CAP - 1, 2), [1, 0], "{path:?}: exactly the cap");
    }
}

/// With late landing (`Prefetch::Adversarial`), an unsignaled READ's response lands before
/// the next completion of its queue, a signaled NOP's too, and not at an unsignaled NOP: a
/// WRITE behind a signaled NOP copies what the READ brought, behind an unsignaled one what
/// was there before.
#[test]
fn a_late_read_lands_at_a_signaled_nop_and_not_at_an_unsignaled_one() {
    for fast_paths in [false, true] {
        for (nop_flags, landed) in [(SIG, true), (WqeFlags::NONE, false)] {
            let nic = softnic((fast_paths, Prefetch::Adversarial));
            let pd = nic.alloc_pd().unwrap();
            let mem = Region::new(&nic, pd, 4096, ALL);
            let q = looped(&nic, pd, 64);
            mem.write(0, &[0x11; 8]); // what the READ brings
            mem.write(64, &[0x22; 8]); // where it lands: what was there before
            let ops = [
                wr(
                    0,
                    WqeFlags::NONE,
                    WrOp::Read {
                        remote: mem.mr.remote(0),
                        sgl: vec![mem.mr.sge(64, 8)],
                    },
                ),
                wr(1, nop_flags, NOP),
                wr(
                    2,
                    WqeFlags::NONE,
                    WrOp::Write {
                        remote: mem.mr.remote(128),
                        payload: Payload::Sgl(vec![mem.mr.sge(64, 8)]),
                        imm: None,
                    },
                ),
                wr(3, SIG, NOP),
            ];
            nic.post_send(q.qp.qpn, &ops).unwrap();
            let n = if nop_flags == SIG { 2 } else { 1 };
            assert!(wait_cqes(&nic, q.cq, n).iter().all(Completion::is_ok));
            let want = if landed { [0x11; 8] } else { [0x22; 8] };
            assert_eq!(
                mem.read(128, 8),
                want,
                "fast paths {fast_paths}, NOP {nop_flags:?}: what the WRITE copied"
            );
            assert_eq!(mem.read(64, 8), [0x11; 8], "the READ landed in the end");
        }
    }
}

/// With late landing, a fenced WRITE waits for the READ before it even when it runs again
/// from a hot slot (an unsignaled WRITE re-posted with the same bytes, behind a hot NOP):
/// each round copies what that round's READ brought.
#[test]
fn a_fenced_write_in_a_hot_slot_waits_for_a_late_read() {
    for fast_paths in [false, true] {
        let nic = softnic((fast_paths, Prefetch::Adversarial));
        let pd = nic.alloc_pd().unwrap();
        let mem = Region::new(&nic, pd, 4096, ALL);
        let q = looped(&nic, pd, 4);
        let round = [
            wr(
                0,
                WqeFlags::NONE,
                WrOp::Read {
                    remote: mem.mr.remote(0),
                    sgl: vec![mem.mr.sge(64, 8)],
                },
            ),
            wr(1, WqeFlags::NONE, NOP),
            wr(
                2,
                WqeFlags::FENCE,
                WrOp::Write {
                    remote: mem.mr.remote(128),
                    payload: Payload::Sgl(vec![mem.mr.sge(64, 8)]),
                    imm: None,
                },
            ),
            wr(3, SIG, NOP),
        ];
        for r in 1..=3u8 {
            mem.write(0, &[r; 8]);
            nic.post_send(q.qp.qpn, &round).unwrap();
            assert!(wait_cqes(&nic, q.cq, 1)[0].is_ok());
            assert_eq!(
                mem.read(128, 8),
                [r; 8],
                "fast paths {fast_paths}, round {r}: the fenced WRITE copied"
            );
        }
    }
}

/// A host that re-posts an unsignaled WRITE into the same slot with a byte count 256 larger
/// (the bytes differ only in the count's second-lowest byte, which sits where the WQE index
/// does in the control segment's word) gets the new count moved, behind a hot NOP that sends
/// the fast path into its hot loop (which compares a hot slot's bytes before it re-runs it).
#[test]
fn a_reposted_write_with_a_new_byte_count_moves_the_new_count() {
    for path in REPOST_PATHS {
        let nic = softnic(path);
        let pd = nic.alloc_pd().unwrap();
        let mem = Region::new(&nic, pd, 4096, ALL);
        let q = looped(&nic, pd, 4);
        let src: Vec<u8> = (0..=255u8).cycle().skip(7).take(512).collect();
        mem.write(0, &src);
        let round = |len: u32| -> Vec<Vec<u8>> {
            // Each round's images carry the same WQE indices (0..4): only the count differs.
            let write = WrOp::Write {
                remote: mem.mr.remote(1024),
                payload: Payload::Sgl(vec![mem.mr.sge(0, len)]),
                imm: None,
            };
            vec![
                image(&q.qp, 0, &wr(0, WqeFlags::NONE, NOP), |_| {}),
                image(&q.qp, 1, &wr(0, WqeFlags::NONE, write), |_| {}),
                image(&q.qp, 2, &wr(0, WqeFlags::NONE, NOP), |_| {}),
                image(&q.qp, 3, &wr(0, SIG, NOP), |_| {}),
            ]
        };
        let mut pi = 0;
        for (r, len) in [8u32, 8, 264, 8].into_iter().enumerate() {
            mem.write(1024, &[0; 512]);
            pi = post_images(&nic, &q.qp, pi, &round(len));
            assert!(wait_cqes(&nic, q.cq, 1)[0].is_ok(), "{path:?}");
            let n = usize::try_from(len).unwrap();
            assert_eq!(
                mem.read(1024, n),
                src[..n],
                "{path:?}, round {r}: {len} bytes"
            );
            assert_eq!(
                mem.read(1024 + n, 512 - n),
                vec![0; 512 - n],
                "{path:?}, round {r}: past {len} bytes"
            );
        }
    }
}

/// Re-run WRITEs (the same bytes posted again, their windows resolved the first time) of 64
/// bytes between offsets of which at least one is not a multiple of 8, and of fewer bytes
/// between aligned ones: each moves its own bytes, not a whole aligned line. (Offsets 3 and
/// 5, 3 and 200, 3 and 299: an aligned-line test that looked at `a / 8`, `a & b` or `a ^ b`
/// instead of `a | b` modulo 8 would take each for a line.)
#[test]
fn rerun_moves_copy_their_own_bytes_at_any_alignment() {
    // (source offset, destination offset, length)
    const MOVES: [(u64, u64, u32); 5] = [
        (5, 3, 64),
        (3, 200, 64),
        (3, 299, 64),
        (64, 400, 64),
        (512, 600, 8),
    ];
    const LEN: usize = 1024;
    for path in REPOST_PATHS {
        let nic = softnic(path);
        let pd = nic.alloc_pd().unwrap();
        let src = Region::new(&nic, pd, LEN, ALL);
        let dst = Region::new(&nic, pd, LEN, ALL);
        let q = looped(&nic, pd, 8);
        let mut ops: Vec<WorkRequest> = MOVES
            .iter()
            .map(|&(from, to, len)| {
                let write = WrOp::Write {
                    remote: dst.mr.remote(to),
                    payload: Payload::Sgl(vec![src.mr.sge(from, len)]),
                    imm: None,
                };
                wr(0, WqeFlags::NONE, write)
            })
            .collect();
        ops.extend([wr(0, WqeFlags::NONE, NOP), wr(0, WqeFlags::NONE, NOP)]);
        ops.push(wr(0, SIG, NOP));
        assert_eq!(ops.len(), 8, "one round fills the ring");
        for r in 0..3u8 {
            let bytes: Vec<u8> = (0..LEN)
                .map(|i| u8::try_from(i % 251).unwrap() ^ (r * 0x35))
                .collect();
            src.write(0, &bytes);
            dst.write(0, &[0xc3; LEN]);
            nic.post_send(q.qp.qpn, &ops).unwrap();
            assert!(wait_cqes(&nic, q.cq, 1)[0].is_ok(), "{path:?}");
            let mut want = vec![0xc3u8; LEN];
            for &(from, to, len) in &MOVES {
                let (from, to) = (usize::try_from(from).unwrap(), usize::try_from(to).unwrap());
                let len = usize::try_from(len).unwrap();
                want[to..to + len].copy_from_slice(&bytes[from..from + len]);
            }
            assert_eq!(dst.read(0, LEN), want, "{path:?}, round {r}");
        }
    }
}

/// What lands locally lands only through its data segment's lkey: a READ into, or a CAS's
/// old value for, a region registered without local write fails as a local protection error
/// and writes nothing, whatever key the WQE's other bytes hold (here, one of the same buffer
/// that may be written: in the READ's remote-segment reserved word, in the low half of the
/// CAS's compare operand, which sit 4 bytes before each lkey's segment).
#[test]
fn a_local_write_goes_only_through_its_own_lkey() {
    for path in PLAIN_PATHS {
        let nic = softnic(path);
        let pd = nic.alloc_pd().unwrap();
        let src = Region::new(&nic, pd, 64, ALL);
        src.write(0, &[0x77; 8]);
        let buf = redn_sys::mem::SharedBuffer::new(64);
        let read_only = nic.reg_mr(pd, &buf, 0, 64, Access::REMOTE_READ).unwrap();
        let writable = nic.reg_mr(pd, &buf, 0, 64, ALL).unwrap();
        let key = writable.lkey.0;
        let read = WrOp::Read {
            remote: src.mr.remote(0),
            sgl: vec![read_only.sge(0, 8)],
        };
        let cas = WrOp::CompareSwap {
            remote: src.mr.remote(0),
            compare: u64::from(key),
            swap: 1,
            result: Some(read_only.sge(0, 8)),
        };
        let cases = [
            ("READ", read, off::RADDR_RESERVED),
            ("CAS", cas, off::COMPARE + 4),
        ];
        for (what, op, at) in cases {
            let q = looped(&nic, pd, 64);
            let img = image(&q.qp, 0, &wr(0, SIG, op), |b| {
                b[at..at + 4].copy_from_slice(&key.to_be_bytes());
            });
            post_images(&nic, &q.qp, 0, &[img]);
            let done = wait_cqes(&nic, q.cq, 1).remove(0);
            assert_eq!(
                done.status,
                Err(Syndrome::LocalProtection),
                "{path:?} {what}"
            );
            let mut landed = [0u8; 8];
            buf.read(0, &mut landed);
            assert_eq!(landed, [0; 8], "{path:?}: the {what} wrote");
            assert_eq!(src.read(0, 8), [0x77; 8], "{path:?}: the {what}'s target");
        }
    }
}

/// Run one lap of `qp`'s ring of `n` BBs (NOPs, all unsignaled but the last) from `start`,
/// then a second whose images are `lap2` (the same WQE indices), and return the second lap's
/// completions (`expect` of them). The first lap marks every unsignaled NOP's slot hot.
fn two_laps(
    nic: &SoftNic,
    ep: &Endpoint,
    n: usize,
    lap2: impl FnOnce(&QpInfo) -> Vec<Vec<u8>>,
    expect: usize,
) -> Vec<Completion> {
    let qp = &ep.qp;
    let lap1: Vec<Vec<u8>> = (0..n)
        .map(|i| {
            let flags = if i + 1 == n { SIG } else { WqeFlags::NONE };
            image(qp, i as u64, &wr(0, flags, NOP), |_| {})
        })
        .collect();
    let end = post_images(nic, qp, 0, &lap1);
    assert!(wait_cqes(nic, ep.cq, 1)[0].is_ok());
    let images = lap2(qp);
    assert_eq!(images.len(), n);
    post_images(nic, qp, end, &images);
    wait_cqes(nic, ep.cq, expect)
}

/// A hot NOP slot (an unsignaled NOP run before, its bytes unchanged) that the host fills
/// with another WQE runs that WQE, however the two control words differ: here a two-entry
/// gather WRITE whose control word shares no bit with the NOP's (its QPN field 0, as RedN's
/// operands may leave it with WQE checks off, and an even ds), and an invalid opcode in a
/// 16-BB WQE whose control word is the NOP's with every bit but the index flipped.
#[test]
fn a_hot_nop_slot_filled_with_another_wqe_runs_that_wqe() {
    for path in REPOST_PATHS {
        // The gather WRITE.
        let nic = softnic(path);
        let pd = nic.alloc_pd().unwrap();
        let mem = Region::new(&nic, pd, 4096, ALL);
        mem.write(0, &[0x31; 8]);
        mem.write(64, &[0x42; 8]);
        let ep = looped(&nic, pd, 4);
        let write = WrOp::Write {
            remote: mem.mr.remote(1024),
            payload: Payload::Sgl(vec![mem.mr.sge(0, 8), mem.mr.sge(64, 8)]),
            imm: None,
        };
        let done = two_laps(
            &nic,
            &ep,
            4,
            |qp| {
                let nop = |i: u64, f| image(qp, i, &wr(0, f, NOP), |_| {});
                let w = image(qp, 1, &wr(0, WqeFlags::NONE, write), |b| {
                    b[off::QPN..off::QPN + 3].fill(0);
                });
                assert_eq!(w[off::DS] & 1, 0, "an even ds");
                vec![
                    nop(0, WqeFlags::NONE),
                    w,
                    nop(2, WqeFlags::NONE),
                    nop(3, SIG),
                ]
            },
            1,
        );
        assert!(done[0].is_ok(), "{path:?}: {done:?}");
        let mut want = vec![0x31; 8];
        want.extend([0x42; 8]);
        assert_eq!(mem.read(1024, 16), want, "{path:?}: the WRITE's gather");

        // The invalid opcode.
        let nic = softnic(path);
        let pd = nic.alloc_pd().unwrap();
        let ep = looped(&nic, pd, 32);
        let done = two_laps(
            &nic,
            &ep,
            32,
            |qp| {
                let nop = |i: u64, f| image(qp, i, &wr(0, f, NOP), |_| {});
                let mut lap = vec![nop(0, WqeFlags::NONE)];
                lap.push(image(qp, 1, &wr(0, WqeFlags::NONE, NOP), |b| {
                    for i in [off::OPMOD, off::OPCODE, 4, 5, 6, off::DS] {
                        b[i] ^= 0xff;
                    }
                }));
                // The rest of that 16-BB WQE, then NOPs to the ring's end.
                lap.extend((2..32).map(|i| nop(i, if i == 31 { SIG } else { WqeFlags::NONE })));
                lap
            },
            1,
        );
        assert_eq!(
            (done[0].wr_id, done[0].status),
            (33, Err(Syndrome::LocalQpOperation)),
            "{path:?}: the 16-BB WQE of opcode 0xff"
        );
    }
}

/// A hot WRITE (unsignaled, re-posted with the same bytes) whose target's entry in the
/// queue's key cache was replaced since it was resolved (nine targets through a cache of
/// eight) is resolved again: each round writes every target, not the region that took its
/// entry.
#[test]
fn a_hot_write_whose_key_cache_entry_was_replaced_writes_its_own_target() {
    const TARGETS: usize = 9;
    for path in REPOST_PATHS {
        let nic = softnic(path);
        let pd = nic.alloc_pd().unwrap();
        let src = Region::new(&nic, pd, 8 * TARGETS, ALL);
        let targets: Vec<Region> = (0..TARGETS)
            .map(|_| Region::new(&nic, pd, 64, ALL))
            .collect();
        let q = looped(&nic, pd, 16);
        let mut ops = vec![wr(0, WqeFlags::NONE, NOP)];
        for (i, t) in targets.iter().enumerate() {
            let write = WrOp::Write {
                remote: t.mr.remote(8),
                payload: Payload::Sgl(vec![src.mr.sge(8 * i as u64, 8)]),
                imm: None,
            };
            ops.push(wr(0, WqeFlags::NONE, write));
        }
        while ops.len() < 15 {
            ops.push(wr(0, WqeFlags::NONE, NOP));
        }
        ops.push(wr(0, SIG, NOP));
        for round in 1..=3u8 {
            let bytes: Vec<u8> = (0..8 * TARGETS)
                .map(|b| u8::try_from(b).unwrap() ^ (round * 0x35))
                .collect();
            src.write(0, &bytes);
            for t in &targets {
                t.write(0, &[0; 64]);
            }
            nic.post_send(q.qp.qpn, &ops).unwrap();
            assert!(wait_cqes(&nic, q.cq, 1)[0].is_ok(), "{path:?}");
            for (i, t) in targets.iter().enumerate() {
                let mut want = vec![0u8; 64];
                want[8..16].copy_from_slice(&bytes[8 * i..8 * i + 8]);
                assert_eq!(t.read(0, 64), want, "{path:?}, round {round}: target {i}");
            }
        }
    }
}

/// A byte-reversing READ (one-byte entries at descending addresses, a recycled loop's count)
/// with fewer entries than the one its queue ran before, whose segments begin as that one's
/// do (the same remote word, the same highest byte): it moves its own two bytes, not the
/// four of the READ before (`Core::fast_read` keeps one resolved READ a queue, known by its
/// segments and how many there are). The long READ runs twice, so the second is a replay.
#[test]
fn a_shorter_byte_reversing_read_moves_its_own_bytes_after_a_longer_one() {
    for path in EVERY_PATH {
        let nic = softnic(path);
        let pd = nic.alloc_pd().unwrap();
        let mem = Region::new(&nic, pd, 4096, ALL);
        let q = looped(&nic, pd, 64);
        mem.write(0, &[1, 2, 3, 4, 5, 6, 7, 8]);
        let reversing = |entries: u64| WrOp::Read {
            remote: mem.mr.remote(0),
            sgl: (0..entries).map(|i| mem.mr.sge(103 - i, 1)).collect(),
        };
        let zero = WrOp::Write {
            remote: mem.mr.remote(100),
            payload: Payload::Inline(vec![0; 4]),
            imm: None,
        };
        // The WRITEs are fenced: with late landing the READ before lands first.
        let ops = [
            wr(0, WqeFlags::NONE, reversing(4)),
            wr(1, WqeFlags::FENCE, zero.clone()),
            wr(2, WqeFlags::NONE, reversing(4)),
            wr(3, SIG, NOP),
        ];
        nic.post_send(q.qp.qpn, &ops).unwrap();
        assert!(wait_cqes(&nic, q.cq, 1).iter().all(Completion::is_ok));
        assert_eq!(
            mem.read(100, 4),
            [4, 3, 2, 1],
            "{path:?}: the long READ, replayed"
        );
        let ops = [wr(4, WqeFlags::FENCE, zero), wr(5, SIG, reversing(2))];
        nic.post_send(q.qp.qpn, &ops).unwrap();
        assert!(wait_cqes(&nic, q.cq, 1).iter().all(Completion::is_ok));
        assert_eq!(
            mem.read(100, 4),
            [0, 0, 2, 1],
            "{path:?}: the short READ's two bytes"
        );
    }
}
