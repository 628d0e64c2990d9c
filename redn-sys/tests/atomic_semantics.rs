//! What a CAS, a FETCH_ADD and their masked forms, a WAIT, a SEND_EN and a RECV_EN do, on
//! every path of the executor: the general executor alone (fast paths off), the fast paths,
//! and the general executor landing responses late (`Prefetch::Adversarial`, which the fast
//! paths leave to it). Expected words are worked out by hand from the operations'
//! definitions, not computed by the code under test. Written for the mutation run over
//! `softnic/transport.rs` and `softnic/exec/reference.rs` (docs/testing.md): the other
//! suites run atomics and WAITs mostly on the fast paths, so the general executor's copy of
//! these semantics went untested.

mod common;
use common::*;
use redn_program::wqe::{encode_wqe, Opcode, Syndrome, WorkRequest, WrOp};
use redn_sys::nic::{Completion, Nic};
use redn_sys::softnic::{Prefetch, SoftNic, SoftNicConfig};
use redn_sys::Cqn;

/// An executor path: fast paths on or off, and the prefetch model.
type Path = (bool, Prefetch);

/// The paths every case runs on: the general executor alone, the fast paths, and late
/// landing of READ and atomic responses (the general executor again, for atomics).
const PATHS: [Path; 3] = [
    (false, Prefetch::Depth(8)),
    (true, Prefetch::Depth(8)),
    (true, Prefetch::Adversarial),
];

fn softnic((fast_paths, prefetch): Path, pus: usize) -> SoftNic {
    let mut cfg = SoftNicConfig::new("semantics");
    cfg.fast_paths = fast_paths;
    cfg.prefetch = prefetch;
    cfg.pus = pus;
    SoftNic::new(cfg).unwrap()
}

/// A queue connected to itself and one region it reaches, on one path.
struct Loopback {
    nic: SoftNic,
    ep: Endpoint,
    mem: Region,
    path: Path,
}

/// Where the atomics' target words are, and where their old values land.
const TARGET: u64 = 64;
const RESULT: u64 = 256;
/// What fills the result word before an atomic, so that an old value of 0 shows.
const GUARD: u64 = 0x5a5a_5a5a_5a5a_5a5a;

fn loopback(path: Path, be_reply: bool) -> Loopback {
    let nic = softnic(path, 1);
    let pd = nic.alloc_pd().unwrap();
    let mem = Region::new(&nic, pd, 4096, ALL);
    let ep = endpoint(&nic, pd, |c| c.atomic_be_reply = be_reply);
    nic.connect(ep.qp.qpn, ep.qp.qpn).unwrap();
    Loopback { nic, ep, mem, path }
}

impl Loopback {
    fn word(&self, off: u64) -> u64 {
        let bytes = self.mem.read(usize::try_from(off).unwrap(), 8);
        u64::from_le_bytes(bytes.try_into().unwrap())
    }

    fn set_word(&self, off: u64, v: u64) {
        self.mem
            .write(usize::try_from(off).unwrap(), &v.to_le_bytes());
    }

    fn result_sge(&self) -> Option<redn_program::wqe::Sge> {
        Some(self.mem.mr.sge(RESULT, 8))
    }

    /// Post `wrs` and take one completion per signaled one.
    fn run(&self, wrs: &[WorkRequest]) -> Vec<Completion> {
        self.nic.post_send(self.ep.qp.qpn, wrs).unwrap();
        let signaled = wrs.iter().filter(|w| w.flags.signaled()).count();
        wait_cqes(&self.nic, self.ep.cq, signaled)
    }

    /// Run atomic `op` signaled on a target word holding `old`; returns the target's new
    /// value. The completion must be a success moving 8 bytes.
    fn atomic(&self, old: u64, op: WrOp) -> u64 {
        self.set_word(TARGET, old);
        self.set_word(RESULT, GUARD);
        let c = self.run(&[wr(1, SIG, op)]).remove(0);
        assert!(c.is_ok(), "{:?}: {c:?}", self.path);
        assert_eq!(c.byte_len, 8, "{:?}: an atomic's completion", self.path);
        self.word(TARGET)
    }

    /// The result word as the old value landed (host order unless `be`).
    fn landed(&self, be: bool) -> u64 {
        let bytes: [u8; 8] = self
            .mem
            .read(usize::try_from(RESULT).unwrap(), 8)
            .try_into()
            .unwrap();
        if be {
            u64::from_be_bytes(bytes)
        } else {
            u64::from_le_bytes(bytes)
        }
    }
}

#[test]
fn cas_swaps_only_on_an_exact_match_of_all_64_bits() {
    let old = 0x8000_0001_0000_0001;
    let swap = 0x0123_4567_89ab_cdef;
    for path in PATHS {
        let l = loopback(path, false);
        let cas = |compare| WrOp::CompareSwap {
            remote: l.mem.mr.remote(TARGET),
            compare,
            swap,
            result: l.result_sge(),
        };
        // Compares differing in bit 63, bit 32 and bit 0 each leave the word; each
        // returns the old value.
        for compare in [
            0x0000_0001_0000_0001,
            0x8000_0000_0000_0001,
            0x8000_0001_0000_0000,
        ] {
            assert_eq!(l.atomic(old, cas(compare)), old, "{path:?} {compare:#x}");
            assert_eq!(l.landed(false), old, "{path:?} {compare:#x}: old value");
        }
        assert_eq!(l.atomic(old, cas(old)), swap, "{path:?}: exact match");
        assert_eq!(l.landed(false), old, "{path:?}: old value of the swap");
        // Without a result entry (ds 3) the swap happens and nothing lands.
        let no_result = WrOp::CompareSwap {
            remote: l.mem.mr.remote(TARGET),
            compare: old,
            swap,
            result: None,
        };
        assert_eq!(l.atomic(old, no_result), swap, "{path:?}: no result entry");
        assert_eq!(l.landed(false), GUARD, "{path:?}: nothing lands");
    }
}

#[test]
fn old_values_land_in_host_order_or_big_endian_as_the_queue_asks() {
    let old = 0x0102_0304_0506_0708;
    for path in PATHS {
        for be in [false, true] {
            let l = loopback(path, be);
            let ops = [
                WrOp::CompareSwap {
                    remote: l.mem.mr.remote(TARGET),
                    compare: 0,
                    swap: 0,
                    result: l.result_sge(),
                },
                WrOp::FetchAdd {
                    remote: l.mem.mr.remote(TARGET),
                    add: 0x10,
                    result: l.result_sge(),
                },
                WrOp::MaskedCompareSwap {
                    remote: l.mem.mr.remote(TARGET),
                    compare: 0,
                    compare_mask: u64::MAX,
                    swap: 0,
                    swap_mask: u64::MAX,
                    result: l.result_sge(),
                },
                WrOp::MaskedFetchAdd {
                    remote: l.mem.mr.remote(TARGET),
                    add: 0x10,
                    field_boundary: 0,
                    result: l.result_sge(),
                },
            ];
            for op in ops {
                let what = format!("{path:?} be {be} {:?}", op.opcode());
                l.atomic(old, op);
                assert_eq!(l.landed(be), old, "{what}");
            }
        }
    }
}

#[test]
fn fetch_add_wraps_at_64_bits() {
    for path in PATHS {
        let l = loopback(path, false);
        let faa = |add| WrOp::FetchAdd {
            remote: l.mem.mr.remote(TARGET),
            add,
            result: l.result_sge(),
        };
        assert_eq!(l.atomic(0xffff_ffff_ffff_fffe, faa(3)), 1, "{path:?}");
        assert_eq!(l.landed(false), 0xffff_ffff_ffff_fffe, "{path:?}");
        assert_eq!(
            l.atomic(0x0000_0000_ffff_ffff, faa(0x0000_0001_0000_0001)),
            0x0000_0002_0000_0000,
            "{path:?}: the carry crosses the halves"
        );
        assert_eq!(l.landed(false), 0x0000_0000_ffff_ffff, "{path:?}");
    }
}

#[test]
fn masked_fetch_add_cuts_carries_exactly_at_the_boundary_bits() {
    // (old, add, boundary, new): each bit set in the boundary ends a field, and a carry out
    // of a field's top bit is lost. Worked out by hand, field by field.
    let cases: [(u64, u64, u64, u64); 6] = [
        // Eight byte fields: 0x12+1, 0xff+1 (wraps alone), 0x34+1, 0xfe+2, ...
        (
            0x12ff_34fe_56fd_78fc,
            0x0101_0102_0103_0104,
            0x8080_8080_8080_8080,
            0x1300_3500_5700_7900,
        ),
        // No boundary: one 64-bit field, the carries run through.
        (
            0x12ff_34fe_56fd_78fc,
            0x0101_0102_0103_0104,
            0,
            0x1400_3600_5800_7a00,
        ),
        // A one-bit field at bit 0: 1 + 1 wraps to 0 and the rest is untouched.
        (u64::MAX, 1, 1, 0xffff_ffff_ffff_fffe),
        // Fields 0..=11, 12..=40, 41..=63: only the lowest field is added to, and wraps.
        (u64::MAX, 1, 1 << 40 | 1 << 11, 0xffff_ffff_ffff_f000),
        // A field of bits 0..=62 wraps; bit 63, a field of its own, keeps its 0.
        (0x7fff_ffff_ffff_ffff, 1, 1 << 62, 0),
        // The boundary one bit higher: the carry reaches bit 62, not 63.
        (0x3fff_ffff_ffff_ffff, 1, 1 << 62, 0x4000_0000_0000_0000),
    ];
    for path in PATHS {
        let l = loopback(path, false);
        for (old, add, field_boundary, new) in cases {
            let op = WrOp::MaskedFetchAdd {
                remote: l.mem.mr.remote(TARGET),
                add,
                field_boundary,
                result: l.result_sge(),
            };
            let what = format!("{path:?}: {old:#x} + {add:#x} cut at {field_boundary:#x}");
            assert_eq!(l.atomic(old, op), new, "{what}");
            assert_eq!(l.landed(false), old, "{what}: old value");
        }
    }
}

#[test]
fn masked_cas_compares_and_swaps_under_high_low_and_mixed_masks() {
    // (old, compare, compare_mask, swap, swap_mask, new), worked out by hand: swap when
    // (old ^ compare) & compare_mask == 0, to (old & !swap_mask) | (swap & swap_mask).
    let old = 0x0123_4567_89ab_cdef;
    let swap = 0xfedc_ba98_7654_3210;
    let cases: [(u64, u64, u64, u64, u64); 8] = [
        // High half compared and equal (low half differs), high half swapped.
        (
            0x0123_4567_0000_0000,
            0xffff_ffff_0000_0000,
            swap,
            0xffff_ffff_0000_0000,
            0xfedc_ba98_89ab_cdef,
        ),
        // Low half compared and equal, low half swapped.
        (
            0xffff_ffff_89ab_cdef,
            0x0000_0000_ffff_ffff,
            swap,
            0x0000_0000_ffff_ffff,
            0x0123_4567_7654_3210,
        ),
        // Bit 63 compared and different: unchanged.
        (
            0x8000_0000_0000_0000,
            0x8000_0000_0000_0000,
            swap,
            u64::MAX,
            old,
        ),
        // Bit 0 compared and different: unchanged.
        (
            0x0000_0000_0000_0000,
            0x0000_0000_0000_0001,
            swap,
            u64::MAX,
            old,
        ),
        // Bytes 7 and 0 compared and equal; nibbles 15, 8, 3 and 0 swapped.
        (
            0x0100_0000_0000_00ef,
            0xff00_0000_0000_00ff,
            swap,
            0xf000_000f_0000_f00f,
            0xf123_4568_89ab_3de0,
        ),
        // Byte 7 equal, byte 0 not: unchanged.
        (
            0x0100_0000_0000_00ee,
            0xff00_0000_0000_00ff,
            swap,
            u64::MAX,
            old,
        ),
        // An empty compare mask always matches; an empty swap mask writes nothing.
        (0xdead_beef_dead_beef, 0, swap, 0, old),
        // Swap bits taken from the operand where its bits are 0 and the word's are 1.
        (0, 0, 0, 0x00ff_0000_0000_ff00, 0x0100_4567_89ab_00ef),
    ];
    for path in PATHS {
        let l = loopback(path, false);
        for (compare, compare_mask, swap, swap_mask, new) in cases {
            let op = WrOp::MaskedCompareSwap {
                remote: l.mem.mr.remote(TARGET),
                compare,
                compare_mask,
                swap,
                swap_mask,
                result: l.result_sge(),
            };
            let what = format!(
                "{path:?}: compare {compare:#x}/{compare_mask:#x} swap {swap:#x}/{swap_mask:#x}"
            );
            assert_eq!(l.atomic(old, op), new, "{what}");
            assert_eq!(l.landed(false), old, "{what}: old value");
        }
    }
}

/// A master queue whose WAITs watch a counted queue's CQ, and a queue managed for sends
/// and receives, on one path. Master and counted run on PU 0, managed on PU 1.
struct Control {
    nic: SoftNic,
    master: Endpoint,
    counted: Endpoint,
    managed: Endpoint,
    mem: Region,
}

fn control(path: Path) -> Control {
    let nic = softnic(path, 2);
    let pd = nic.alloc_pd().unwrap();
    let mem = Region::new(&nic, pd, 4096, ALL);
    let master = endpoint(&nic, pd, |c| c.pu = Some(0));
    let counted = endpoint(&nic, pd, |c| c.pu = Some(0));
    let managed = endpoint(&nic, pd, |c| {
        c.managed_send = true;
        c.managed_recv = true;
        c.pu = Some(1);
    });
    for q in [&master, &counted, &managed] {
        nic.connect(q.qp.qpn, q.qp.qpn).unwrap();
    }
    Control {
        nic,
        master,
        counted,
        managed,
        mem,
    }
}

impl Control {
    /// Give the counted queue's CQ one more completion.
    fn complete(&self) {
        self.nic.post_send(self.counted.qp.qpn, &nops(1)).unwrap();
        wait_cqes(&self.nic, self.counted.cq, 1);
    }

    /// WQEs the master and the managed queue ran so far.
    fn ran(&self) -> (u64, u64) {
        let count = |q: &Endpoint| self.nic.counters(q.qp.qpn).unwrap().total_wqes();
        (count(&self.master), count(&self.managed))
    }

    /// Wait until nothing more runs on the NIC.
    fn settle(&self) {
        settle(&self.nic, || {
            let (m, q) = self.ran();
            m + q
        });
    }

    /// Post `op` signaled on the master and return its completion.
    fn master_runs(&self, wr_id: u64, op: WrOp) -> Completion {
        self.nic
            .post_send(self.master.qp.qpn, &[wr(wr_id, SIG, op)])
            .unwrap();
        wait_cqes(&self.nic, self.master.cq, 1).remove(0)
    }
}

#[test]
fn a_wait_passes_once_its_cq_has_produced_more_than_its_count_modulo_2_pow_24() {
    for path in PATHS {
        let c = control(path);
        let cq = c.counted.cq;
        c.complete();
        c.complete();
        // Two completions (indices 0 and 1): a WAIT for index 1 passes, for index 1 read
        // modulo 2^24 too, and for index 2 does not, until the third.
        for count in [1, (1 << 24) | 1, 0xff00_0001] {
            let done = c.master_runs(count.into(), WrOp::Wait { cq, count });
            assert!(
                done.is_ok(),
                "{path:?}: WAIT({count:#x}) at 2 completions: {done:?}"
            );
        }
        let counters = || c.nic.counters(c.master.qp.qpn).unwrap();
        assert_eq!(
            counters().wait_stalls,
            0,
            "{path:?}: no WAIT so far was short"
        );
        // Index 2, then index 3 (read modulo 2^24): each blocks until one more completion.
        for (wr_id, count) in [(20, 2), (21, (1 << 24) | 3)] {
            let (stalls, waits) = (counters().wait_stalls, counters().by_opcode(Opcode::Wait));
            c.nic
                .post_send(c.master.qp.qpn, &[wr(wr_id, SIG, WrOp::Wait { cq, count })])
                .unwrap();
            wait_until("the WAIT stalls", || counters().wait_stalls > stalls);
            c.settle();
            let what = format!("{path:?}: WAIT({count:#x})");
            expect_no_cqe(&c.nic, c.master.cq, 1);
            assert_eq!(
                counters().by_opcode(Opcode::Wait),
                waits,
                "{what} has not run"
            );
            c.complete();
            let done = wait_cqes(&c.nic, c.master.cq, 1).remove(0);
            assert_eq!((done.wr_id, done.status), (wr_id, Ok(())), "{what}");
        }
        assert_eq!(
            counters().wait_stalls,
            2,
            "{path:?}: each blocked WAIT counted once"
        );
    }
}

#[test]
fn a_wait_on_an_unknown_cq_is_a_local_qp_operation_error() {
    for path in PATHS {
        let c = control(path);
        let done = c.master_runs(
            1,
            WrOp::Wait {
                cq: Cqn(0x00ab_cdef),
                count: 0,
            },
        );
        assert_eq!(done.status, Err(Syndrome::LocalQpOperation), "{path:?}");
    }
}

#[test]
fn send_en_runs_exactly_the_enabled_wqes_and_never_moves_back() {
    for path in PATHS {
        let c = control(path);
        c.mem.write(0, b"abc");
        let writes: Vec<WorkRequest> = (0..3u8)
            .map(|i| {
                let op = WrOp::Write {
                    remote: c.mem.mr.remote(100 + u64::from(i)),
                    payload: redn_program::wqe::Payload::Sgl(vec![c.mem.mr.sge(u64::from(i), 1)]),
                    imm: None,
                };
                wr(u64::from(i), SIG, op)
            })
            .collect();
        c.nic.post_send(c.managed.qp.qpn, &writes).unwrap();
        let q = c.managed.qp.qpn;
        c.settle();
        assert_eq!(
            c.ran().1,
            0,
            "{path:?}: posting runs nothing on a managed queue"
        );
        let en = |pi| WrOp::SendEnable { qp: q, pi };
        assert!(c.master_runs(1, en(2)).is_ok(), "{path:?}");
        let done = wait_cqes(&c.nic, c.managed.cq, 2);
        assert_eq!(
            done.iter().map(|d| d.wr_id).collect::<Vec<_>>(),
            [0, 1],
            "{path:?}"
        );
        // An enable behind the index succeeds and changes nothing.
        assert!(c.master_runs(2, en(1)).is_ok(), "{path:?}");
        c.settle();
        assert_eq!(c.ran().1, 2, "{path:?}: two WQEs enabled, two ran");
        assert_eq!(c.mem.read(100, 3), b"ab\0", "{path:?}");
        assert!(c.master_runs(3, en(3)).is_ok(), "{path:?}");
        assert_eq!(wait_cqes(&c.nic, c.managed.cq, 1)[0].wr_id, 2, "{path:?}");
        assert_eq!(c.mem.read(100, 3), b"abc", "{path:?}");
    }
}

#[test]
fn recv_en_lets_exactly_the_enabled_receives_be_taken() {
    for path in PATHS {
        let c = control(path);
        let q = c.managed.qp.qpn;
        for slot in 0..2u64 {
            c.nic
                .post_recv(q, 10 + slot, &[c.mem.mr.sge(200 + 8 * slot, 8)])
                .unwrap();
        }
        // The managed queue SENDs to itself; its receives are not enabled yet.
        let send = |text: &[u8]| WrOp::Send {
            payload: redn_program::wqe::Payload::Inline(text.to_vec()),
            imm: None,
        };
        c.nic
            .post_send(q, &[wr(1, SIG, send(b"one")), wr(2, SIG, send(b"two"))])
            .unwrap();
        assert!(
            c.master_runs(1, WrOp::SendEnable { qp: q, pi: 2 }).is_ok(),
            "{path:?}"
        );
        wait_until("the first SEND finds no enabled receive", || {
            c.nic.counters(q).unwrap().rnr_waits > 0
        });
        assert_eq!(c.mem.read(200, 16), [0; 16], "{path:?}: nothing placed");
        assert!(
            c.master_runs(2, WrOp::RecvEnable { qp: q, pi: 1 }).is_ok(),
            "{path:?}"
        );
        // One receive enabled: the first SEND lands, the second waits for the next.
        let done = wait_cqes(&c.nic, c.managed.cq, 2);
        let ids: Vec<u64> = done.iter().map(|d| d.wr_id).collect();
        assert!(ids.contains(&1) && ids.contains(&10), "{path:?}: {done:?}");
        assert_eq!(c.mem.read(200, 3), b"one", "{path:?}");
        c.settle();
        let sends = c.nic.counters(q).unwrap().by_opcode(Opcode::Send);
        assert_eq!(sends, 1, "{path:?}: the second SEND has not run");
        assert_eq!(c.mem.read(208, 3), [0; 3], "{path:?}");
        assert!(
            c.master_runs(3, WrOp::RecvEnable { qp: q, pi: 2 }).is_ok(),
            "{path:?}"
        );
        wait_cqes(&c.nic, c.managed.cq, 2);
        assert_eq!(c.mem.read(208, 3), b"two", "{path:?}");
    }
}

#[test]
fn an_enable_of_a_queue_not_managed_for_it_is_a_local_qp_operation_error() {
    for path in PATHS {
        let nic = softnic(path, 1);
        let pd = nic.alloc_pd().unwrap();
        let master = endpoint(&nic, pd, |_| {});
        let plain = endpoint(&nic, pd, |_| {});
        let sends = endpoint(&nic, pd, |c| c.managed_send = true);
        let recvs = endpoint(&nic, pd, |c| c.managed_recv = true);
        for q in [&master, &plain, &sends, &recvs] {
            nic.connect(q.qp.qpn, q.qp.qpn).unwrap();
        }
        let unknown = redn_sys::Qpn(0x00ab_cdef);
        let cases = [
            (
                "SEND_EN of an unmanaged queue",
                WrOp::SendEnable {
                    qp: plain.qp.qpn,
                    pi: 1,
                },
            ),
            (
                "RECV_EN of an unmanaged queue",
                WrOp::RecvEnable {
                    qp: plain.qp.qpn,
                    pi: 1,
                },
            ),
            (
                "SEND_EN of a queue managed for receives",
                WrOp::SendEnable {
                    qp: recvs.qp.qpn,
                    pi: 1,
                },
            ),
            (
                "RECV_EN of a queue managed for sends",
                WrOp::RecvEnable {
                    qp: sends.qp.qpn,
                    pi: 1,
                },
            ),
            (
                "SEND_EN of no queue",
                WrOp::SendEnable { qp: unknown, pi: 1 },
            ),
            (
                "RECV_EN of no queue",
                WrOp::RecvEnable { qp: unknown, pi: 1 },
            ),
        ];
        for (what, op) in cases {
            // Each error moves the master to error: a new master per case.
            let m = endpoint(&nic, pd, |_| {});
            nic.connect(m.qp.qpn, m.qp.qpn).unwrap();
            nic.post_send(m.qp.qpn, &[wr(1, SIG, op)]).unwrap();
            let done = wait_cqes(&nic, m.cq, 1).remove(0);
            assert_eq!(
                done.status,
                Err(Syndrome::LocalQpOperation),
                "{path:?}: {what}"
            );
        }
        // The queues managed for the other direction take their own enable.
        for op in [
            WrOp::SendEnable {
                qp: sends.qp.qpn,
                pi: 0,
            },
            WrOp::RecvEnable {
                qp: recvs.qp.qpn,
                pi: 0,
            },
        ] {
            nic.post_send(master.qp.qpn, &[wr(2, SIG, op)]).unwrap();
            assert!(wait_cqes(&nic, master.cq, 1)[0].is_ok(), "{path:?}");
        }
    }
}

/// Run `op` on a new loopback queue as the bytes `encode_wqe` makes of it, after `patch`
/// changed them (what a patched ring holds), and return its completion.
fn run_patched(l: &Loopback, op: WrOp, patch: impl FnOnce(&mut [u8])) -> Completion {
    let qp = &l.ep.qp;
    let mut e = encode_wqe(&wr(1, SIG, op), qp.qpn, 0).unwrap();
    patch(e.bytes_mut());
    qp.sq.buffer.write(qp.sq.offset, e.bytes());
    let end = u64::try_from(e.bbs()).unwrap();
    l.nic.note_posted(qp.qpn, 0, end, 1).unwrap();
    l.nic.ring_doorbell(qp.qpn, end).unwrap();
    wait_cqes(&l.nic, l.ep.cq, 1).remove(0)
}

#[test]
fn fetch_add_ignores_what_its_compare_field_holds() {
    // A plain FETCH_ADD has no field boundary: bytes 40..48 (CAS's compare operand) mean
    // nothing to it, whatever a patch left there.
    for path in PATHS {
        let l = loopback(path, false);
        l.set_word(TARGET, 0x0000_0000_ffff_ffff);
        let faa = WrOp::FetchAdd {
            remote: l.mem.mr.remote(TARGET),
            add: 1,
            result: l.result_sge(),
        };
        let done = run_patched(&l, faa, |b| b[40..48].fill(0xff));
        assert!(done.is_ok(), "{path:?}: {done:?}");
        assert_eq!(l.word(TARGET), 0x0000_0001_0000_0000, "{path:?}");
        assert_eq!(l.landed(false), 0x0000_0000_ffff_ffff, "{path:?}");
    }
}

#[test]
fn a_read_reverses_bytes_only_across_one_byte_entries_at_descending_addresses() {
    // RedN's byte-reversing READ (`Builder::advance_count`) scatters into one-byte entries
    // at descending addresses; the executor writes such a run at once. Entries that are not
    // part of one (longer, ascending, under another key, with a gap) land as they are.
    for path in PATHS {
        let l = loopback(path, false);
        let pd = l.ep.pd;
        let other = Region::new(&l.nic, pd, 4096, ALL);
        l.mem.write(0, b"ABCDEFGHIJKLMN");
        let one = |r: &Region, at: u64| r.mr.sge(at, 1);
        let sgl = vec![
            // A run of four: D C B A at 1000..1004.
            one(&l.mem, 1003),
            one(&l.mem, 1002),
            one(&l.mem, 1001),
            one(&l.mem, 1000),
            // Two bytes, then two ascending one-byte entries.
            l.mem.mr.sge(1100, 2),
            one(&l.mem, 1200),
            one(&l.mem, 1201),
            // Descending, but the second under another key, then with a gap of one.
            one(&l.mem, 1301),
            one(&other, 1300),
            one(&l.mem, 1400),
            one(&l.mem, 1398),
            // A run of two ending the list.
            one(&l.mem, 1501),
            one(&l.mem, 1500),
        ];
        let read = WrOp::Read {
            remote: l.mem.mr.remote(0),
            sgl,
        };
        let done = l.run(&[wr(1, SIG, read)]).remove(0);
        assert!(done.is_ok(), "{path:?}: {done:?}");
        assert_eq!(done.byte_len, 14, "{path:?}");
        let at = |r: &Region, off: usize, len: usize| r.read(off, len);
        assert_eq!(at(&l.mem, 999, 6), b"\0DCBA\0", "{path:?}: the run of four");
        assert_eq!(at(&l.mem, 1100, 2), b"EF", "{path:?}");
        assert_eq!(at(&l.mem, 1200, 2), b"GH", "{path:?}");
        assert_eq!(at(&l.mem, 1300, 2), b"\0I", "{path:?}");
        assert_eq!(at(&other, 1300, 2), b"J\0", "{path:?}: another key");
        assert_eq!(at(&l.mem, 1398, 3), b"L\0K", "{path:?}: a gap");
        assert_eq!(at(&l.mem, 1499, 4), b"\0NM\0", "{path:?}: the last run");
    }
}

#[test]
fn a_byte_reversing_read_is_checked_as_the_window_its_bytes_cover() {
    // The executor checks a run of one-byte entries at descending addresses as the one
    // window its bytes cover. A run that ends at either edge of its region lands; one that
    // reaches past the end is refused whole (local protection), and none of it lands, as
    // when each entry was checked on its own.
    for path in PATHS {
        let l = loopback(path, false);
        let edge = Region::new(&l.nic, l.ep.pd, 64, ALL);
        l.mem.write(0, b"ABCD");
        let read = |top: u64| WrOp::Read {
            remote: l.mem.mr.remote(0),
            sgl: (0..4).map(|k| edge.mr.sge(top - k, 1)).collect(),
        };
        for (top, at) in [(63, 60), (3, 0)] {
            let done = l.run(&[wr(1, SIG, read(top))]).remove(0);
            assert!(
                done.is_ok(),
                "{path:?}: a run ending at byte {top}: {done:?}"
            );
            assert_eq!(
                edge.read(at, 4),
                b"DCBA",
                "{path:?}: a run ending at byte {top}"
            );
        }
        edge.write(60, b"wxyz");
        let done = l.run(&[wr(1, SIG, read(65))]).remove(0);
        assert_eq!(
            done.status,
            Err(Syndrome::LocalProtection),
            "{path:?}: two of the run's bytes past the region"
        );
        assert_eq!(
            edge.read(60, 4),
            b"wxyz",
            "{path:?}: nothing of a refused run lands"
        );
    }
}

#[test]
fn a_read_with_any_scatter_byte_outside_its_region_is_refused_and_lands_nothing() {
    // The executor checks a READ's scatter list as runs (see the test above); every byte of
    // every entry is still checked. Cases that a run taken too widely, too narrowly or
    // from the wrong entry would let through: a two-byte entry across the region's end
    // followed by a one-byte entry just below it (not a byte-reversing run: the first entry
    // is two bytes), and a byte-reversing run that reaches below the region's start.
    for path in PATHS {
        let base = |l: &Loopback| {
            let edge = Region::new(&l.nic, l.ep.pd, 64, ALL);
            edge.write(60, b"wxyz");
            edge.write(0, b"abcd");
            edge
        };
        let read = |l: &Loopback, sgl| WrOp::Read {
            remote: l.mem.mr.remote(0),
            sgl,
        };
        let l = loopback(path, false);
        let edge = base(&l);
        let across_the_end = vec![edge.mr.sge(63, 2), edge.mr.sge(62, 1)];
        let done = l.run(&[wr(1, SIG, read(&l, across_the_end))]).remove(0);
        assert_eq!(
            done.status,
            Err(Syndrome::LocalProtection),
            "{path:?}: a two-byte entry across the end"
        );
        assert_eq!(edge.read(60, 4), b"wxyz", "{path:?}: nothing lands");

        let l = loopback(path, false);
        let edge = base(&l);
        let below = |k: u64| {
            let mut e = edge.mr.sge(0, 1);
            e.addr.0 = e.addr.0 + 1 - k;
            e
        };
        let done = l
            .run(&[wr(1, SIG, read(&l, (0..4).map(below).collect()))])
            .remove(0);
        assert_eq!(
            done.status,
            Err(Syndrome::LocalProtection),
            "{path:?}: a reversing run below the start"
        );
        assert_eq!(edge.read(0, 4), b"abcd", "{path:?}: nothing lands");
    }
}

#[test]
fn a_reads_zero_length_scatter_entries_are_skipped_unchecked() {
    // rdma-core skips zero-length entries, whatever key and address they carry (the encoder
    // drops them, so this WQE is patched after encoding); the entry after one is checked
    // and lands as usual.
    for path in PATHS {
        let l = loopback(path, false);
        l.mem.write(0, b"ABCD");
        let read = WrOp::Read {
            remote: l.mem.mr.remote(0),
            sgl: vec![l.mem.mr.sge(1000, 4), l.mem.mr.sge(2000, 4)],
        };
        let done = run_patched(&l, read, |b| {
            b[32..36].fill(0);
            b[36..40].copy_from_slice(&0xdead_beef_u32.to_be_bytes());
        });
        assert!(done.is_ok(), "{path:?}: {done:?}");
        assert_eq!(l.mem.read(2000, 4), b"ABCD", "{path:?}");
        assert_eq!(l.mem.read(1000, 4), [0; 4], "{path:?}: the skipped entry");
    }
}

#[test]
fn a_read_reads_no_scatter_entry_past_its_ds() {
    // A READ of two entries is exactly one BB. The executor's copy of a WQE keeps, past its
    // BBs, what an earlier and longer WQE left there: here a third "entry" with a key that
    // names nothing, written by a two-BB NOP (a three-entry READ's bytes with the opcode
    // patched). The READ reads its ds entries and no more, and succeeds.
    for path in PATHS {
        let l = loopback(path, false);
        l.mem.write(0, b"ABCD");
        let qp = &l.ep.qp;
        let sgl = |n: u64| (0..n).map(|k| l.mem.mr.sge(1000 + 100 * k, 2)).collect();
        let read = |n| WrOp::Read {
            remote: l.mem.mr.remote(0),
            sgl: sgl(n),
        };
        let mut nop = encode_wqe(&wr(1, SIG, read(3)), qp.qpn, 0).unwrap();
        nop.bytes_mut()[3] = Opcode::Nop as u8;
        nop.bytes_mut()[68..72].copy_from_slice(&0xdead_beef_u32.to_be_bytes());
        let two = encode_wqe(&wr(2, SIG, read(2)), qp.qpn, 2).unwrap();
        assert_eq!((nop.bbs(), two.bbs()), (2, 1));
        qp.sq.buffer.write(qp.sq.offset, nop.bytes());
        qp.sq.buffer.write(qp.sq.offset + 128, two.bytes());
        l.nic.note_posted(qp.qpn, 0, 2, 1).unwrap();
        l.nic.note_posted(qp.qpn, 2, 3, 2).unwrap();
        l.nic.ring_doorbell(qp.qpn, 3).unwrap();
        let done = wait_cqes(&l.nic, l.ep.cq, 2);
        assert!(done.iter().all(Completion::is_ok), "{path:?}: {done:?}");
        assert_eq!(l.mem.read(1000, 2), b"AB", "{path:?}");
        assert_eq!(l.mem.read(1100, 2), b"CD", "{path:?}");
    }
}

/// A byte rate of 30,000 bytes a second on the loopback queue: a burst of 30 bytes (one
/// millisecond's), which the bucket starts with.
fn byte_rate(l: &Loopback) {
    let limit = redn_sys::nic::RateLimit {
        wqes_per_sec: 0,
        bytes_per_sec: 30_000,
    };
    l.nic.set_rate_limit(l.ep.qp.qpn, limit).unwrap();
}

#[test]
fn a_byte_rate_charges_an_inline_payload_its_length() {
    // Under a byte rate every WQE goes through the general executor, which charges what
    // `payload_len` says: three inline WRITEs and SENDs of 12 bytes cost 12 each, so they
    // take 30 to -6 and pass at once (a bucket may go negative by one operation's cost).
    // Charged anything else (the inline header word as a length, 2^31 + 12, or the control
    // segment's first word, 8 for a WRITE at index 0 and 266 for a SEND at index 1) the
    // bucket runs dry before the third and delays it.
    for path in PATHS {
        let l = loopback(path, false);
        l.nic
            .post_recv(l.ep.qp.qpn, 9, &[l.mem.mr.sge(600, 12)])
            .unwrap();
        byte_rate(&l);
        let inline = || redn_program::wqe::Payload::Inline(b"0123456789ab".to_vec());
        let ops = [
            WrOp::Write {
                remote: l.mem.mr.remote(500),
                payload: inline(),
                imm: None,
            },
            WrOp::Send {
                payload: inline(),
                imm: None,
            },
            WrOp::Write {
                remote: l.mem.mr.remote(512),
                payload: inline(),
                imm: None,
            },
        ];
        let wrs: Vec<WorkRequest> = ops.into_iter().map(|op| wr(1, SIG, op)).collect();
        let done = l.run(&wrs);
        assert!(done.iter().all(Completion::is_ok), "{path:?}: {done:?}");
        assert_eq!(l.mem.read(500, 24), b"0123456789ab0123456789ab", "{path:?}");
        assert_eq!(l.mem.read(600, 12), b"0123456789ab", "{path:?}");
        let delays = l.nic.counters(l.ep.qp.qpn).unwrap().rate_limit_delays;
        assert_eq!(delays, 0, "{path:?}: 36 bytes from a 30-byte burst");
    }
}

#[test]
fn a_byte_rate_charges_nothing_for_a_write_without_data_segments() {
    // A WRITE of ds 2 has no payload segment: what follows its remote-address segment in
    // its basic block (here a word with the inline bit set) is no length of its.
    for path in PATHS {
        let l = loopback(path, false);
        byte_rate(&l);
        let empty = WrOp::Write {
            remote: l.mem.mr.remote(500),
            payload: redn_program::wqe::Payload::Sgl(vec![]),
            imm: None,
        };
        let done = run_patched(&l, empty, |b| b[32..36].fill(0xff));
        assert!(done.is_ok(), "{path:?}: {done:?}");
        let next = WrOp::Write {
            remote: l.mem.mr.remote(500),
            payload: redn_program::wqe::Payload::Inline(b"after".to_vec()),
            imm: None,
        };
        assert!(l.run(&[wr(2, SIG, next)])[0].is_ok(), "{path:?}");
        assert_eq!(l.mem.read(500, 5), b"after", "{path:?}");
        let delays = l.nic.counters(l.ep.qp.qpn).unwrap().rate_limit_delays;
        assert_eq!(delays, 0, "{path:?}: 5 bytes from a 30-byte burst");
    }
}

#[test]
fn a_read_run_needs_one_key_and_consecutive_addresses() {
    // Each case is one entry off a run: what decides a run is read at each entry's own
    // fields.
    for path in PATHS {
        let l = loopback(path, false);
        // The same memory under two keys, split at byte 2048: `hi` holds 2048.., `lo` ..2048.
        let lo = l.nic.reg_mr(l.ep.pd, &l.mem.buf, 0, 2048, ALL).unwrap();
        let hi = l.nic.reg_mr(l.ep.pd, &l.mem.buf, 2048, 2048, ALL).unwrap();
        l.mem.write(0, b"ABCDEF");
        l.mem.write(2047, &[0x5a]);
        let sgl = vec![
            // 2048 twice under `hi`, then 2047 under `lo`: the second and third are at
            // consecutive descending addresses, but under different keys.
            hi.sge(0, 1),
            hi.sge(0, 1),
            lo.sge(2047, 1),
            // A run of two (1700, 1699), then an entry elsewhere.
            l.mem.mr.sge(1700, 1),
            l.mem.mr.sge(1699, 1),
            l.mem.mr.sge(1710, 1),
        ];
        let read = WrOp::Read {
            remote: l.mem.mr.remote(0),
            sgl,
        };
        let done = l.run(&[wr(1, SIG, read)]).remove(0);
        assert!(done.is_ok(), "{path:?}: {done:?}");
        assert_eq!(l.mem.read(2047, 2), b"CB", "{path:?}: under two keys");
        assert_eq!(l.mem.read(1698, 3), b"\0ED", "{path:?}: the run of two");
        assert_eq!(l.mem.read(1710, 1), b"F", "{path:?}: the entry after it");
    }
}

#[test]
fn a_read_run_ends_with_the_wqes_last_entry() {
    // The last entry, one byte at 1801 (after one at 1950), followed in its basic block by bytes that would
    // continue it as a run (one byte at 1800 under the same key): they are padding, not an
    // entry of the WQE.
    for path in PATHS {
        let l = loopback(path, false);
        l.mem.write(0, b"ABCD");
        l.mem.write(1800, &[0x5a]);
        let read = WrOp::Read {
            remote: l.mem.mr.remote(0),
            sgl: vec![
                l.mem.mr.sge(1900, 2),
                l.mem.mr.sge(1950, 1),
                l.mem.mr.sge(1801, 1),
            ],
        };
        let lkey = l.mem.mr.lkey.0.to_be_bytes();
        let addr = (l.mem.mr.addr.0 + 1800).to_be_bytes();
        let done = run_patched(&l, read, |b| {
            // ds 5 (control, remote address, three entries) in two basic blocks: bytes
            // 80..128 are padding.
            b[80..84].copy_from_slice(&1u32.to_be_bytes());
            b[84..88].copy_from_slice(&lkey);
            b[88..96].copy_from_slice(&addr);
        });
        assert!(done.is_ok(), "{path:?}: {done:?}");
        assert_eq!(l.mem.read(1900, 2), b"AB", "{path:?}");
        assert_eq!(l.mem.read(1950, 1), b"C", "{path:?}");
        assert_eq!(
            l.mem.read(1800, 2),
            [0x5a, b'D'],
            "{path:?}: the last entry alone"
        );
    }
}

#[test]
fn an_atomics_old_value_lands_where_its_result_entry_says_whatever_its_operands_hold() {
    // Operands that read as an address inside the result's region (a CAS's compare word,
    // right before its result entry) are numbers, not where anything lands.
    for path in PATHS {
        let l = loopback(path, false);
        let decoy = l.mem.mr.addr.0 + 512;
        l.set_word(512, GUARD);
        let cas = WrOp::CompareSwap {
            remote: l.mem.mr.remote(TARGET),
            compare: decoy,
            swap: 1,
            result: l.result_sge(),
        };
        assert_eq!(l.atomic(7, cas), 7, "{path:?}: no match, no swap");
        assert_eq!(l.landed(false), 7, "{path:?}");
        assert_eq!(
            l.word(512),
            GUARD,
            "{path:?}: nothing at the compare word's address"
        );
    }
}
