//! The softnic's executor on arbitrary WQE bytes, for the `softnic_exec` fuzz target and the
//! `random_wqes` test: never a panic; once the run has come to rest (all consumed,
//! the queue in error, blocked on a WAIT or a missing receive) or run 100 ms (a chain that
//! loops), putting the queue in the error state ends it, every WQE consumed; its completions
//! come in ring order, successes then at most one fault then flushes, and a queue that went
//! to the error state by itself has its fault's completion; and no byte that no region grants
//! a write to changes.
//!
//! Each input is up to 16 BBs that go into a loopback queue's send ring as they are. So that
//! mutations reach past the key and bound checks, the last byte of each BB picks fields to
//! point at real objects: the remote key and address (at RADDR/RKEY), the local key and
//! address of the data segment after them, the CQ or queue a WAIT / SEND_EN / RECV_EN names
//! (the queue itself, or a managed queue of four signaled NOPs, on the other PU or, by bit 1
//! of the first byte, on the same one, where SEND_EN and WAIT take the doorbell-step loop).
//! Keys and addresses picked this way still land up to 64 bytes outside their regions.
//!
//! Memory: one buffer holding a guard, region `rw` (every right), region `ro` (remote read
//! only) and another guard; the send ring itself is registered too (every right), so WQEs
//! can rewrite WQEs. Nothing but `rw` and the ring may change.
use redn_program::endian::{Be32, Be64};
use redn_program::wqe::{off, CqeOpcode, Syndrome, WorkRequest, WqeFlags, WrOp, BB_SIZE};
use redn_sys::mem::SharedBuffer;
use redn_sys::nic::{CqConfig, MrInfo, Nic, QpConfig};
use redn_sys::softnic::{Prefetch, SoftNic, SoftNicConfig};
use redn_sys::{Access, Cqn, Pdn, QpState, Qpn};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

const GUARD: usize = 4096;
const RW_LEN: usize = 4096;
const RO_LEN: usize = 2048;
const BUF_LEN: usize = GUARD + RW_LEN + RO_LEN + GUARD;
const RING_BBS: u32 = 16;
/// The byte of each input BB that picks which of its fields `aim` points at real objects.
pub const SELECTOR: usize = BB_SIZE - 1;
/// Times below are this many times longer under Miri, which runs a WQE in milliseconds.
const SLOWDOWN: u32 = if cfg!(miri) { 50 } else { 1 };
/// A run that has made no progress for this long is at rest (blocked).
const QUIET: Duration = Duration::from_millis(2 * SLOWDOWN as u64);
/// A run still moving after this long is a loop (a chain that re-arms itself): stopped.
const LONGEST: Duration = Duration::from_millis(100 * SLOWDOWN as u64);
/// A flush not done after this long is a hang.
const FLUSH: Duration = Duration::from_secs(5 * SLOWDOWN as u64);

struct Rig {
    nic: SoftNic,
    pd: Pdn,
    buf: Arc<SharedBuffer>,
    rw: MrInfo,
    ro: MrInfo,
    /// The buffer's bytes before every run (`pattern`).
    initial: Vec<u8>,
    /// Held by each run: they share the buffer (a test binary runs tests in parallel).
    one_at_a_time: Mutex<()>,
}

fn rig() -> &'static Rig {
    static RIG: OnceLock<Rig> = OnceLock::new();
    RIG.get_or_init(|| {
        let mut cfg = SoftNicConfig::default();
        cfg.pus = 2;
        cfg.prefetch = Prefetch::Depth(4);
        let nic = SoftNic::new(cfg).expect("softnic");
        let pd = nic.alloc_pd().expect("pd");
        let buf = SharedBuffer::new(BUF_LEN);
        let rw = nic
            .reg_mr(pd, &buf, GUARD, RW_LEN, Access::ALL)
            .expect("rw");
        let ro = nic
            .reg_mr(pd, &buf, GUARD + RW_LEN, RO_LEN, Access::REMOTE_READ)
            .expect("ro");
        Rig {
            nic,
            pd,
            buf,
            rw,
            ro,
            initial: (0..BUF_LEN).map(pattern).collect(),
            one_at_a_time: Mutex::new(()),
        }
    })
}

/// The byte at `i` of the buffer before every run.
fn pattern(i: usize) -> u8 {
    // The low byte of i, times 7.
    i.to_le_bytes()[0].wrapping_mul(7) ^ 0x5a
}

/// One of `regions`, by `sel`, and an address from `raw` within 64 bytes of it.
fn pick(regions: &[&MrInfo], sel: u8, raw: u64) -> (u32, u64) {
    let r = regions[usize::from(sel) % regions.len()];
    let span = r.len + 128;
    let addr = (r.addr.0 + raw % span).wrapping_sub(64);
    (r.lkey.0, addr)
}

/// Point the fields that the BB's last byte selects at real objects (see the module docs).
fn aim(bb: &mut [u8], regions: &[&MrInfo], cqs: &[Cqn], qps: &[Qpn]) {
    let sel = bb[SELECTOR];
    if sel & 1 != 0 {
        let (key, addr) = pick(regions, bb[off::RKEY], Be64::read(bb, off::RADDR).get());
        Be64::new(addr).write(bb, off::RADDR);
        Be32::new(key).write(bb, off::RKEY);
    }
    if sel & 2 != 0 {
        // The data segment after a control and a remote-address segment (WRITE, READ); an
        // atomic's comes one segment later, which bit 3 picks instead.
        let seg = if sel & 8 != 0 { 48 } else { 32 };
        let (key, addr) = pick(
            regions,
            bb[seg + off::SEG_LKEY],
            Be64::read(bb, seg + off::SEG_ADDR).get(),
        );
        let len = Be32::read(bb, seg).get() & 0x1ff; // at most 511 bytes, never inline
        Be32::new(len).write(bb, seg + off::SEG_BYTE_COUNT);
        Be32::new(key).write(bb, seg + off::SEG_LKEY);
        Be64::new(addr).write(bb, seg + off::SEG_ADDR);
    }
    if sel & 4 != 0 {
        let raw = Be32::read(bb, off::WAIT_OBJ).get();
        let obj = if sel & 16 != 0 {
            cqs[raw as usize % cqs.len()].0
        } else {
            qps[raw as usize % qps.len()].0
        };
        Be32::new(obj).write(bb, off::WAIT_OBJ);
        // Small counts, so WAITs can pass and enables stay near the posted WQEs.
        let pi = Be32::read(bb, off::WAIT_PI).get() % 24;
        Be32::new(pi).write(bb, off::WAIT_PI);
    }
}

/// Run `data` (up to 16 BBs) on the shared softnic and check what the module docs say;
/// panics if something does not hold.
pub fn run(data: &[u8]) {
    let bbs = (data.len() / BB_SIZE).min(RING_BBS as usize);
    if bbs == 0 {
        return;
    }
    let r = rig();
    let _alone = r.one_at_a_time.lock().unwrap_or_else(|e| e.into_inner());
    let nic = &r.nic;
    r.buf.write(0, &r.initial);

    let cq = nic.create_cq(CqConfig::counted(64)).expect("cq");
    let other_cq = nic.create_cq(CqConfig::default()).expect("cq");
    let mut c = QpConfig::new(r.pd, cq);
    c.sq_bbs = RING_BBS;
    c.pu = Some(usize::from(data[0] & 1));
    let qp = nic.create_qp(c).expect("qp");
    // A managed queue for SEND_EN / WAIT to reach, holding signaled NOPs: on the other PU,
    // or (bit 1 of the first byte) on the same one, where a SEND_EN and a WAIT on its CQ
    // hand over to it (the executor's doorbell-step loop).
    let mut c = QpConfig::new(r.pd, other_cq);
    c.sq_bbs = 4;
    c.managed_send = true;
    let same_pu = data[0] & 2 != 0;
    c.pu = Some(usize::from((data[0] & 1 != 0) == same_pu));
    let managed = nic.create_qp(c).expect("qp");
    for q in [qp.qpn, managed.qpn] {
        nic.connect(q, q).expect("connect");
    }
    let nop = WorkRequest {
        wr_id: 0,
        flags: WqeFlags::SIGNALED,
        op: WrOp::Nop {
            raw_segments: vec![],
        },
    };
    nic.post_send(managed.qpn, &vec![nop; 4])
        .expect("post managed NOPs");
    let ring = nic
        .reg_mr(
            r.pd,
            &qp.sq.buffer,
            qp.sq.offset,
            RING_BBS as usize * BB_SIZE,
            Access::ALL,
        )
        .expect("ring mr");

    let regions = [&r.rw, &r.ro, &ring];
    let n = bbs as u64;
    for (i, bb) in data.chunks_exact(BB_SIZE).take(bbs).enumerate() {
        let mut bb: [u8; BB_SIZE] = bb.try_into().unwrap();
        aim(&mut bb, &regions, &[cq, other_cq], &[qp.qpn, managed.qpn]);
        qp.sq.buffer.write(qp.sq.offset + i * BB_SIZE, &bb);
        nic.note_posted(qp.qpn, i as u64, i as u64 + 1, i as u64)
            .expect("note_posted");
    }
    nic.ring_doorbell(qp.qpn, n).expect("doorbell");

    // Until it comes to rest, or is stopped.
    let mut faulted = false;
    let start = Instant::now();
    let mut last = (u64::MAX, u64::MAX);
    let mut since = Instant::now();
    loop {
        let now = (
            nic.sq_consumed(qp.qpn).expect("consumed"),
            nic.counters(qp.qpn)
                .expect("counters")
                .wqes
                .iter()
                .sum::<u64>(),
        );
        if nic.qp_state(qp.qpn).expect("state") == QpState::Error {
            faulted = true;
            break;
        }
        if now.0 >= n {
            break;
        }
        if now != last {
            last = now;
            since = Instant::now();
        } else if since.elapsed() > QUIET || start.elapsed() > LONGEST {
            break;
        }
        std::thread::yield_now();
    }
    for q in [qp.qpn, managed.qpn] {
        nic.set_qp_error(q).expect("set_qp_error");
    }
    // The PUs flush what is left; destroying waits for nothing, so wait for the flush.
    let deadline = Instant::now() + FLUSH;
    while nic.sq_consumed(qp.qpn).expect("consumed") < n {
        assert!(Instant::now() < deadline, "the flush never finished");
        std::thread::yield_now();
    }
    check_completions(nic, cq, qp.qpn, faulted);
    nic.dereg_mr(ring.lkey).expect("dereg ring");
    for q in [qp.qpn, managed.qpn] {
        nic.destroy_qp(q).expect("destroy_qp");
    }
    for c in [cq, other_cq] {
        nic.destroy_cq(c).expect("destroy_cq");
    }

    // Only `rw` may have changed.
    let mut now = vec![0u8; BUF_LEN];
    r.buf.read(0, &mut now);
    let writable = GUARD..GUARD + RW_LEN;
    for (i, (a, b)) in r.initial.iter().zip(&now).enumerate() {
        assert!(
            a == b || writable.contains(&i),
            "byte {i} outside the writable region changed: {a:#x} -> {b:#x}"
        );
    }
}

/// The queue's send completions: in ring order, each with the wr_id posted at its index;
/// successes, then at most one error that is not a flush, then only flushes; and if the queue
/// went to the error state by itself (`faulted`), that error is there.
fn check_completions(nic: &SoftNic, cq: Cqn, qpn: Qpn, faulted: bool) {
    // `QpShared::retire` publishes a WQE's consumer index, then pushes its CQE, and a queue's
    // state is not ordered with its CQEs (nor is it on a ConnectX, where only the CQEs
    // speak): so the last CQE may land after the flush wait above ends, and a faulted
    // queue's error completion is waited for, with a deadline, rather than expected at once.
    let mut got = Vec::new();
    let deadline = Instant::now() + FLUSH;
    loop {
        while nic.poll_cq(cq, 64, &mut got).expect("poll_cq") > 0 {}
        let fault_there = got
            .iter()
            .any(|c| c.qpn == qpn && !matches!(c.status, Ok(()) | Err(Syndrome::WrFlush)));
        if !faulted || fault_there || Instant::now() >= deadline {
            break;
        }
        std::thread::yield_now();
    }
    let sent: Vec<_> = got
        .iter()
        .filter(|c| c.qpn == qpn && matches!(c.opcode, CqeOpcode::Req | CqeOpcode::ReqErr))
        .collect();
    let mut last = None;
    let mut error_seen = false;
    let mut fault_seen = false;
    for c in &sent {
        let index = c.cqe.wqe_counter;
        assert!(last < Some(index), "completion out of order: {sent:?}");
        last = Some(index);
        assert_eq!(c.wr_id, u64::from(index), "{c:?}");
        match c.status {
            Ok(()) => assert!(!error_seen, "a success after an error: {sent:?}"),
            Err(Syndrome::WrFlush) => error_seen = true,
            Err(_) => {
                assert!(!error_seen, "an error after an error: {sent:?}");
                error_seen = true;
                fault_seen = true;
            }
        }
    }
    assert!(
        !faulted || fault_seen,
        "the queue went to the error state with no error completion: {sent:?}"
    );
}
