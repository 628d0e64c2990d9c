//! Writes into WQEs: every byte a WRITE, READ or atomic may change lies inside a patch point.

use super::*;

/// `base()` with the READ's scatter entry `i` (into the response WQE "0.r0") `len` bytes long.
fn read_scatter_of(i: usize, len: u32) -> Program {
    let mut p = base();
    if let Op::Read { sgl, .. } = &mut wqe_mut(&mut p, "0.b0.read").op {
        sgl[i].len = len;
    }
    p
}

#[test]
fn a_read_scatter_running_past_its_patch_point_is_refused() {
    // The READ's scatter list, as declared: 0.r0@0..3, @4..7, a scratch byte (the length's
    // top byte, never the byte count's), @33..36, @40..48, each into WQE bytes exactly one
    // patch point of that READ. As built it is accepted.
    let r = verify(&base(), &grants());
    assert!(r.accepted(), "{}", r.log());
    // Each entry one byte longer, or as long as the next patch point's end: it starts inside
    // its patch point and runs past it (into the opcode byte, the lkey, the padding). Only
    // the bytes after the first are outside, so a check of the first byte alone passes them.
    for (i, from, declared, lens) in [
        (0, 0u32, 3u32, [4u32, 7]),
        (1, 4, 3, [4, 12]),
        (3, 33, 3, [4, 7]),
        (4, 40, 8, [9, 16]),
    ] {
        for len in lens {
            let r = verify(&read_scatter_of(i, len), &grants());
            let f = only_finding(&r, Rule::UndeclaredPatch, "0.b0.read", &format!("sgl[{i}]"));
            assert_eq!(
                f.detail,
                format!(
                    "writes 0.r0@{from}..{end} outside every patch point declared for READ \
                     \"0.b0.read\" (code bytes {from}..{end}): the installer grants no key over \
                     them",
                    end = from + len
                )
            );
            // Still inside the patch point: accepted.
            let r = verify(&read_scatter_of(i, declared - 1), &grants());
            assert!(!r.broke(Rule::UndeclaredPatch), "{}", r.log());
        }
    }
}

#[test]
fn a_write_spanning_two_patch_points_and_the_gap_between_is_refused() {
    // One scatter entry over 0.r0@0..7: both of the READ's first patch points (0..3 and
    // 4..7) cover all of it but byte 3, the opcode.
    let mut p = base();
    if let Op::Read { sgl, .. } = &mut wqe_mut(&mut p, "0.b0.read").op {
        sgl[0].len = 7;
        sgl.remove(1);
    }
    let r = verify(&p, &grants());
    only_finding(&r, Rule::UndeclaredPatch, "0.b0.read", "sgl[0]");
    // With the gap declared too, the same entry is covered by three adjacent patch points
    // (and refused only because the new one covers the opcode).
    patch(&mut p, "0.r0", 3, 1, read_source());
    let r = verify(&p, &grants());
    assert!(!r.broke(Rule::UndeclaredPatch), "{}", r.log());
    assert!(r.broke(Rule::ProtectedField), "{}", r.log());
}

/// `base()` with an RDMA WRITE "patcher" on the worker queue writing `len` bytes into the
/// response WQE at byte 33, where a 3-byte patch point of that WRITE is declared (the byte
/// count's low three bytes); the queue enables one more WQE and has room for it.
fn write_into_response(len: u32) -> Program {
    write_into_response_at(33, 3, len)
}

/// [`write_into_response`] with the WRITE and its patch point at `byte`, the patch point
/// `declared` bytes long.
fn write_into_response_at(byte: u32, declared: u32, len: u32) -> Program {
    let mut p = base();
    let q = p.queues.iter_mut().find(|q| q.name == "worker0").unwrap();
    q.sq_bbs = 16;
    q.wqes.insert(
        2,
        Wqe {
            label: "patcher".into(),
            op: Op::Write {
                remote: Addr::wqe("0.r0", byte as usize),
                sgl: vec![Sge::new(Addr::region("values", 0), len)],
                imm: None,
            },
            flags: WqeFlags::NONE,
            form: Form::Active,
        },
    );
    if let Op::SendEn { count, .. } = &mut wqe_mut(&mut p, "0.w0.go").op {
        *count += 1;
    }
    p.iterations = Iterations::bounded(1, 10);
    patch(
        &mut p,
        "0.r0",
        byte,
        declared,
        PatchSource::Write {
            label: "patcher".into(),
        },
    );
    p
}

#[test]
fn a_write_running_past_its_patch_point_is_refused() {
    for len in 1..=3 {
        let r = verify(&write_into_response(len), &grants());
        assert!(r.accepted(), "{len} bytes: {}", r.log());
    }
    // One byte past the patch point (the first byte of the lkey), and all of the lkey.
    for len in [4u32, 7] {
        let r = verify(&write_into_response(len), &grants());
        let f = only_finding(&r, Rule::UndeclaredPatch, "patcher", "raddr");
        assert_eq!(
            f.detail,
            format!(
                "writes 0.r0@33..{end} outside every patch point declared for WRITE \
                 \"patcher\" (code bytes 33..{end}): the installer grants no key over them",
                end = 33 + len
            )
        );
    }
}

#[test]
fn a_patch_point_over_a_byte_counts_inline_bit_is_refused() {
    // The whole byte count (32..36), as the catalog once patched it from a bucket: its top
    // byte holds the inline bit, which would send the WQE's own bytes to the client.
    for (byte, declared) in [(32, 4), (32, 1)] {
        let r = verify(&write_into_response_at(byte, declared, declared), &grants());
        assert!(r.broke(Rule::ProtectedField), "{}", r.log());
        assert!(
            r.log().contains("byte count's inline bit"),
            "{byte}+{declared}: {}",
            r.log()
        );
    }
    // The low three bytes are the count's own.
    let r = verify(&write_into_response_at(33, 3, 3), &grants());
    assert!(r.accepted(), "{}", r.log());
}
