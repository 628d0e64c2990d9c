//! READs: byte-reversing scatters, the windows they are checked as, refused scatter entries
//! that land nothing, and how READ runs are found.

use super::*;

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
