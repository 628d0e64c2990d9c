//! Byte rates: what an inline payload and a WRITE without data segments are charged.

use super::*;

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
