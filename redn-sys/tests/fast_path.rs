//! The executor's fast path and its general path agree. The same random stream of work
//! requests runs on a queue without a rate limit (one-BB WQEs take the fast path) and on one
//! with a limit too high to ever hold anything back (a rate-limited queue always takes the
//! general path); both must end with the same memory, the same completions and the same
//! counters, including when a WQE in the middle faults.

mod common;
use common::*;
use redn_sys::nic::{Completion, Nic, RateLimit};
use redn_sys::softnic::Prefetch;
use redn_sys::wqe::{Opcode, Payload, RemoteAddr, WqeFlags, WrOp};
use redn_sys::{Access, Cqn, Rkey, VirtAddr};

const LEN: usize = 4096;
/// Work requests per stream (few under Miri, whose slowness meets the tests' 5 s waits).
const WRS: usize = if cfg!(miri) { 8 } else { 160 };
const SIG: WqeFlags = WqeFlags::SIGNALED;

struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

/// Everything a run leaves behind.
#[derive(Debug, PartialEq)]
struct Outcome {
    local: Vec<u8>,
    remote: Vec<u8>,
    completions: Vec<(u64, Result<(), redn_sys::wqe::Syndrome>, u32)>,
    wqes: [u64; 32],
    bytes: u64,
    errors: u64,
}

/// A random work request at position `i` (every one signaled, so WQE k's completion is
/// index k and a WAIT for an earlier one passes). `fault` makes this one refused.
fn random_wr(rng: &mut Rng, i: u64, local: &Region, remote: &Region, cq: Cqn, fault: bool) -> WrOp {
    let len = 1 + rng.below(64);
    let off = |rng: &mut Rng, len: u64| rng.below(LEN as u64 - len + 1);
    if fault {
        return match rng.below(3) {
            // One byte past the end of the remote region.
            0 => WrOp::Write {
                remote: remote.mr.remote(LEN as u64 - len + 1),
                payload: Payload::Sgl(vec![local.mr.sge(0, len as u32)]),
                imm: None,
            },
            1 => WrOp::Read {
                remote: RemoteAddr {
                    addr: VirtAddr(remote.mr.addr.0),
                    rkey: Rkey(0x00dead01),
                },
                sgl: vec![local.mr.sge(0, len as u32)],
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
            payload: Payload::Sgl(vec![local.mr.sge(off(rng, len), len as u32)]),
            imm: None,
        },
        3 | 4 => WrOp::Read {
            remote: remote.mr.remote(off(rng, len)),
            sgl: vec![local.mr.sge(off(rng, len), len as u32)],
        },
        // Two scatter entries: one BB, but not a one-segment READ.
        5 => WrOp::Read {
            remote: remote.mr.remote(off(rng, 2 * len)),
            sgl: vec![
                local.mr.sge(off(rng, len), len as u32),
                local.mr.sge(off(rng, len), len as u32),
            ],
        },
        6 => WrOp::Write {
            remote: remote.mr.remote(off(rng, len)),
            payload: Payload::Inline((0..len).map(|_| rng.next() as u8).collect()),
            imm: None,
        },
        7 => {
            let at = remote.mr.remote(rng.below(LEN as u64 / 8) * 8);
            // With and without a result segment (a masked CAS with one takes two BBs).
            let result =
                (rng.below(3) != 0).then(|| local.mr.sge(rng.below(LEN as u64 / 8) * 8, 8));
            // Small operands, so compares match now and then.
            let (compare, mask) = (rng.below(4), rng.next() | 0xff);
            match rng.below(4) {
                0 => WrOp::CompareSwap {
                    remote: at,
                    compare,
                    swap: rng.next(),
                    result,
                },
                1 => WrOp::FetchAdd {
                    remote: at,
                    add: rng.next(),
                    result,
                },
                2 => WrOp::MaskedCompareSwap {
                    remote: at,
                    compare,
                    compare_mask: 0x3,
                    swap: rng.next(),
                    swap_mask: mask,
                    result,
                },
                _ => WrOp::MaskedFetchAdd {
                    remote: at,
                    add: rng.next(),
                    field_boundary: mask,
                    result,
                },
            }
        }
        _ if i > 0 => WrOp::Wait {
            cq,
            count: rng.below(i) as u32,
        },
        _ => WrOp::Nop {
            raw_segments: Vec::new(),
        },
    }
}

fn run(seed: u64, limited: bool) -> Outcome {
    let nic = nic(1, Prefetch::Depth(8));
    let pd = nic.alloc_pd().unwrap();
    let local = Region::new(&nic, pd, LEN, Access::ALL);
    let remote = Region::new(&nic, pd, LEN, Access::ALL);
    let mut fill = Rng(seed ^ 0x5eed);
    let bytes: Vec<u8> = (0..2 * LEN).map(|_| fill.next() as u8).collect();
    local.write(0, &bytes[..LEN]);
    remote.write(0, &bytes[LEN..]);
    let ep = endpoint(&nic, pd, |c| c.sq_bbs = 1024);
    nic.connect(ep.qp.qpn, ep.qp.qpn).unwrap();
    if limited {
        let limit = RateLimit {
            wqes_per_sec: 1 << 40,
            bytes_per_sec: 1 << 50,
        };
        nic.set_rate_limit(ep.qp.qpn, limit).unwrap();
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
