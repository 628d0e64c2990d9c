//! CAS, FETCH_ADD and their masked forms: what they swap, add and return, and where the
//! old value lands, whatever the operand fields hold.

use super::*;

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
