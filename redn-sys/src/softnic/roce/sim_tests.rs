//! A deterministic simulation of one RC connection: a [`Requester`] and a [`Responder`]
//! joined by a seeded wire that drops, duplicates and reorders datagrams both ways, on a
//! virtual clock, driven as the endpoint drives them (`endpoint/transport.rs`: `post`,
//! `settle`, `run`; `endpoint/receive.rs`: batches of requests, their replies superseded
//! and sent as one batch).
//!
//! It runs the workload of `tests/roce/opcodes.rs::loss_reordering_and_duplication_leave_
//! results_exact` (three 300 KB WRITEs at MTU 1024 and their READs back, 200 FETCH_ADDs,
//! 20 SENDs, a burst of 40 WRITEs and SENDs in flight) over many seeds and fault rates, and
//! holds every message to complete exactly: memory as written, each atomic run once, each
//! SEND delivered once and in order. It is the search for a livelock (a pattern of faults
//! after which the retries run out without progress) that a CI failure of that test raised
//! (its first 300 KB WRITE ended in "retry exceeded" after about 1.1 s).
//!
//! It found one: a sequence NAK further into a message than the go-back under way (a new
//! gap, the responder having taken the packets before it) started no go-back and restored
//! no retry, so each new gap waited for the 67 ms ACK timer at a retry's cost, and a long
//! WRITE that met a gap in every go-back ran out of retries while moving on: 27 of 2,000
//! seeds at 3 % faults (the shortest, seed 986 of the posted messages, after 558 datagrams
//! and 7 timeouts, 470 ms of virtual time). See
//! `a_new_gap_in_each_go_back_is_resent_at_once_and_never_runs_out_of_retries` and the fix
//! in `Requester::on_response`.
//!
//! Faults, per direction: as `io::LossyIo` (dropped; held back to go after the sender's
//! next datagram, so that a lone request or answer held waits for the next retransmission
//! or reply; sent twice), at the same rate each. Time: the clock stands still while
//! anything is on the wire (datagrams are delivered in no time, in seeded batches of 1 to
//! 16 and interleavings of the two directions) and jumps to the requester's next timer
//! when nothing is; a third of the seeds also let each delivery take up to 20 µs, and a
//! third up to 5 µs with datagrams overtaken by up to 16 others as well.

// Test data is made of byte patterns: narrowing an index to a byte is the point.
#![allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]

use super::packet::{opcode, Header, Packet, Syndrome};
use super::requester::{Message, Outcome, Requester, RequesterAttrs};
use super::responder::{Memory, Responder};
use crate::mem::AccessFault;
use crate::softnic::transport::{AtomicOp, Nak};
use std::collections::VecDeque;
use std::fmt::Write as _;
use std::time::{Duration, Instant};

const RKEY: u32 = 7;
/// The requester's and the responder's QP numbers.
const REQ_QP: u32 = 0x11;
const RESP_QP: u32 = 0x22;
/// The PSN the connection starts at: near the wrap, so that the 24-bit circle is crossed.
const START_PSN: u32 = 0xff_fc00;
const MTU: u32 = 1024;
/// Where the workload's messages go, as in the CI test.
const BIG_AT: u64 = 8192;
const ATOMIC_AT: u64 = 3 << 20;
const MEM_LEN: usize = (3 << 20) + 4096;
/// The endpoint's mailbox holds this many responses at most (`endpoint::MAILBOX_CAP`).
const MAILBOX_CAP: usize = 1024;

/// xorshift64*: small and seeded.
struct Rng(u64);

impl Rng {
    fn new(seed: u64) -> Rng {
        // Spread small seeds over the state; never zero.
        Rng((seed ^ 0x9e37_79b9_7f4a_7c15).wrapping_mul(0xbf58_476d_1ce4_e5b9) | 1)
    }

    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    /// A number in 0..n (n > 0).
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }

    /// True with probability `per_mille` / 1000.
    fn chance(&mut self, per_mille: u32) -> bool {
        self.below(1000) < u64::from(per_mille)
    }
}

/// Faults on one direction, per mille, as `io::Faults`.
#[derive(Clone, Copy, Debug)]
struct Faults {
    drop: u32,
    duplicate: u32,
    reorder: u32,
}

#[derive(Debug)]
struct Datagram {
    h: Header,
    payload: Vec<u8>,
}

/// Payload buffers of datagrams gone, for the next (a run moves millions).
#[derive(Default)]
struct Pool(Vec<Vec<u8>>);

impl Pool {
    fn datagram(&mut self, h: &Header, data: &[u8]) -> Datagram {
        let mut payload = self.0.pop().unwrap_or_default();
        payload.extend_from_slice(data);
        Datagram { h: *h, payload }
    }

    fn done(&mut self, d: Datagram) {
        let mut v = d.payload;
        v.clear();
        self.0.push(v);
    }
}

/// One direction of the wire: what its sender's lossy wrapper does (as `io::LossyIo`:
/// drop, hold one back until after the next, send twice), and, with `deep`, reordering
/// further than one place (a datagram overtaken by up to 16 others).
struct Wire {
    faults: Faults,
    deep: bool,
    held: Option<Datagram>,
    flight: VecDeque<Datagram>,
    sent: u64,
}

impl Wire {
    fn new(faults: Faults, deep: bool) -> Wire {
        Wire {
            faults,
            deep,
            held: None,
            flight: VecDeque::new(),
            sent: 0,
        }
    }

    fn put(&mut self, rng: &mut Rng, d: Datagram) {
        if self.deep && !self.flight.is_empty() && rng.chance(self.faults.reorder) {
            let back = 1 + rng.below(16.min(self.flight.len() as u64)) as usize;
            self.flight.insert(self.flight.len() - back, d);
        } else {
            self.flight.push_back(d);
        }
    }

    fn send(&mut self, rng: &mut Rng, pool: &mut Pool, batch: &mut Vec<Datagram>) {
        for d in batch.drain(..) {
            self.sent += 1;
            if rng.chance(self.faults.drop) {
                pool.done(d);
                continue;
            }
            if self.held.is_none() && rng.chance(self.faults.reorder) {
                self.held = Some(d);
                continue;
            }
            let dup = rng
                .chance(self.faults.duplicate)
                .then(|| pool.datagram(&d.h, &d.payload));
            self.put(rng, d);
            if let Some(h) = self.held.take() {
                self.put(rng, h);
            }
            if let Some(dup) = dup {
                self.put(rng, dup);
            }
        }
    }
}

/// The responder's memory: one region at address 0 with rkey [`RKEY`], receives always
/// posted (64 KiB each), and a log of what ran.
struct SimMem {
    mem: Vec<u8>,
    sends: Vec<(Vec<u8>, Option<u32>)>,
    atomics: u32,
    failed: Option<Nak>,
}

impl SimMem {
    fn range(&self, va: u64, rkey: u32, len: usize) -> Result<usize, Nak> {
        let off =
            usize::try_from(va).map_err(|_| Nak::RemoteAccess(AccessFault::UnknownKey(rkey)))?;
        if rkey != RKEY || off + len > self.mem.len() {
            return Err(Nak::RemoteAccess(AccessFault::UnknownKey(rkey)));
        }
        Ok(off)
    }
}

impl Memory for SimMem {
    fn check_write(&mut self, va: u64, rkey: u32, len: u32) -> Result<(), Nak> {
        self.range(va, rkey, len as usize).map(|_| ())
    }
    fn write(&mut self, va: u64, rkey: u32, data: &[u8], imm: Option<u32>) -> Result<(), Nak> {
        assert!(imm.is_none(), "the workload writes no immediates");
        let off = self.range(va, rkey, data.len())?;
        self.mem[off..off + data.len()].copy_from_slice(data);
        Ok(())
    }
    fn complete_imm(&mut self, _len: u32, _imm: u32) -> Result<(), Nak> {
        unreachable!("the workload writes no immediates")
    }
    fn send(&mut self, data: &[u8], imm: Option<u32>) -> Result<(), Nak> {
        self.sends.push((data.to_vec(), imm));
        Ok(())
    }
    fn read(&mut self, va: u64, rkey: u32, out: &mut [u8]) -> Result<(), Nak> {
        let off = self.range(va, rkey, out.len())?;
        out.copy_from_slice(&self.mem[off..off + out.len()]);
        Ok(())
    }
    fn atomic(&mut self, va: u64, rkey: u32, op: AtomicOp) -> Result<u64, Nak> {
        let off = self.range(va, rkey, 8)?;
        self.atomics += 1;
        let old = u64::from_le_bytes(self.mem[off..off + 8].try_into().unwrap());
        if let Some(new) = op.apply(old) {
            self.mem[off..off + 8].copy_from_slice(&new.to_le_bytes());
        }
        Ok(old)
    }
    fn recv_room(&mut self) -> Option<u64> {
        Some(64 << 10)
    }
    fn fail(&mut self, nak: Nak) {
        self.failed = Some(nak);
    }
}

/// Why a run stopped short.
#[derive(Debug, PartialEq, Eq)]
enum Stop {
    /// A message ended in error (`NoResponse` is "transport retry exceeded").
    Failed(&'static str, Nak),
}

/// How a seed runs.
#[derive(Clone, Copy, Debug)]
struct Setup {
    seed: u64,
    faults: Faults,
    /// Most microseconds a delivery takes (0: the clock stands still while anything is on
    /// the wire).
    jitter: u64,
    /// Reordering beyond the lossy wrapper's one place.
    deep: bool,
    /// The requester's `retry_cnt`: 7 as in the CI test; more to tell a livelock (no end
    /// however many retries) from bad luck (more losses in a row than the retries).
    retry_cnt: u8,
}

impl Setup {
    fn new(seed: u64, per_mille: u32) -> Setup {
        let faults = Faults {
            drop: per_mille,
            duplicate: per_mille,
            reorder: per_mille,
        };
        let (jitter, deep) = match seed % 3 {
            0 => (0, false),
            1 => (20, false),
            _ => (5, true),
        };
        Setup {
            seed,
            faults,
            jitter,
            deep,
            retry_cnt: 7,
        }
    }
}

struct Sim {
    rng: Rng,
    setup: Setup,
    base: Instant,
    off: Duration,
    req: Requester,
    resp: Responder,
    mem: SimMem,
    to_resp: Wire,
    to_req: Wire,
    mailbox: VecDeque<Datagram>,
    pool: Pool,
    /// A batch being gathered.
    batch: Vec<Datagram>,
    /// With Some, every event is logged here (for a failing seed's trace).
    trace: Option<String>,
    /// The fewest retries the requester had left at any transmit: how near the run came to
    /// "retry exceeded".
    least_retries: u8,
}

impl Sim {
    fn new(setup: Setup, trace: bool) -> Sim {
        let attrs = RequesterAttrs {
            mtu: MTU,
            timeout: 14, // 67 ms
            retry_cnt: setup.retry_cnt,
            rnr_retry: 7,
        };
        Sim {
            rng: Rng::new(setup.seed),
            setup,
            base: Instant::now(),
            off: Duration::ZERO,
            req: Requester::new(attrs, RESP_QP, START_PSN),
            resp: Responder::new(REQ_QP, MTU, START_PSN, 16, 1),
            mem: SimMem {
                mem: vec![0; MEM_LEN],
                sends: Vec::new(),
                atomics: 0,
                failed: None,
            },
            to_resp: Wire::new(setup.faults, setup.deep),
            to_req: Wire::new(setup.faults, setup.deep),
            mailbox: VecDeque::new(),
            pool: Pool::default(),
            batch: Vec::new(),
            trace: trace.then(String::new),
            least_retries: setup.retry_cnt,
        }
    }

    fn now(&self) -> Instant {
        self.base + self.off
    }

    fn log(&mut self, what: impl FnOnce() -> String) {
        if let Some(t) = &mut self.trace {
            let _ = writeln!(t, "{:>12.6} {}", self.off.as_secs_f64() * 1e3, what());
        }
    }

    fn describe(h: &Header, payload: &[u8]) -> String {
        let aeth = h.aeth.map_or(String::new(), |a| {
            format!(" {:?}", Syndrome::of(a.syndrome))
        });
        format!(
            "op {:#04x} psn {:#08x}{}{} len {}",
            h.opcode,
            h.psn,
            if h.ack_req { " A" } else { "" },
            aeth,
            payload.len()
        )
    }

    /// Send what the requester has due (`RoceTransport::transmit`).
    fn transmit(&mut self) {
        self.least_retries = self.least_retries.min(self.req.retries_left());
        let now = self.now();
        let (batch, pool) = (&mut self.batch, &mut self.pool);
        self.req.transmit(now, |h, _, payload| {
            batch.push(pool.datagram(h, payload));
        });
        if self.trace.is_some() {
            for i in 0..self.batch.len() {
                let d = &self.batch[i];
                let s = format!("req  -> {}", Self::describe(&d.h, &d.payload));
                self.log(|| s);
            }
        }
        self.to_resp
            .send(&mut self.rng, &mut self.pool, &mut self.batch);
    }

    fn timer_due(&self) -> bool {
        self.req.next_timer().is_some_and(|t| t <= self.now())
    }

    /// Take one response from the mailbox.
    fn take(&mut self, d: Datagram, read_out: &mut [u8]) {
        let now = self.now();
        let r = self.req.on_response(&d.h, &d.payload, now, read_out);
        if self.trace.is_some() {
            let s = format!(
                "req  <- {} {:?} retries {}",
                Self::describe(&d.h, &d.payload),
                r.err(),
                self.req.retries_left()
            );
            self.log(|| s);
        }
        self.pool.done(d);
    }

    fn on_timer(&mut self) {
        let due = self.timer_due();
        self.req.on_timer(self.now());
        if due {
            let left = self.req.retries_left();
            self.log(|| format!("req  timer, retries {left}"));
        }
    }

    /// `RoceTransport::take_arrived`.
    fn take_arrived(&mut self, read_out: &mut [u8]) {
        while let Some(d) = self.mailbox.pop_front() {
            self.take(d, read_out);
        }
        self.on_timer();
        self.transmit();
    }

    /// One event on the wire: a batch delivered one way or the other; with nothing on the
    /// wire, the clock jumps to the requester's next timer. False if nothing can happen.
    fn step(&mut self) -> bool {
        let (a, b) = (self.to_resp.flight.len(), self.to_req.flight.len());
        if a + b == 0 {
            let Some(t) = self.req.next_timer() else {
                return false;
            };
            let now = self.now();
            if t > now {
                self.off += t - now;
            }
            return true;
        }
        if self.setup.jitter > 0 {
            self.off += Duration::from_micros(self.rng.below(self.setup.jitter + 1));
        }
        let to_resp = b == 0 || (a > 0 && self.rng.below(2) == 0);
        let n = 1 + self.rng.below(16) as usize;
        if to_resp {
            self.deliver_requests(n);
        } else {
            for _ in 0..n {
                let Some(d) = self.to_req.flight.pop_front() else {
                    break;
                };
                if self.mailbox.len() < MAILBOX_CAP {
                    self.mailbox.push_back(d);
                } else {
                    self.pool.done(d);
                }
            }
        }
        true
    }

    /// The responder's receive thread takes a batch of `n` requests; its replies go out as
    /// one batch, a plain ACK (or RNR NAK) superseding the last reply held if that is one
    /// of its kind (`receive::Outbox`).
    fn deliver_requests(&mut self, n: usize) {
        // What supersedes what: Some(true) a plain ACK, Some(false) an RNR NAK.
        let kind = |h: &Header| {
            (h.opcode == opcode::ACKNOWLEDGE)
                .then(|| h.aeth.map(|a| Syndrome::of(a.syndrome)))
                .flatten()
                .filter(|s| matches!(s, Syndrome::Ack | Syndrome::Rnr(_)))
                .map(|s| matches!(s, Syndrome::Ack))
        };
        for _ in 0..n {
            let Some(d) = self.to_resp.flight.pop_front() else {
                break;
            };
            let (out, pool) = (&mut self.batch, &mut self.pool);
            let r = self.resp.handle(
                &Packet {
                    header: d.h,
                    payload: &d.payload,
                },
                &mut self.mem,
                &mut |h: &Header, p: &[u8]| {
                    if let (Some(k), Some(last)) = (kind(h), out.last_mut()) {
                        if kind(&last.h) == Some(k) {
                            last.h = *h;
                            return;
                        }
                    }
                    out.push(pool.datagram(h, p));
                },
            );
            if self.trace.is_some() {
                let s = format!("resp <- {} {:?}", Self::describe(&d.h, &d.payload), r.err());
                self.log(|| s);
            }
            self.pool.done(d);
        }
        if self.trace.is_some() {
            for i in 0..self.batch.len() {
                let d = &self.batch[i];
                let s = format!("resp -> {}", Self::describe(&d.h, &d.payload));
                self.log(|| s);
            }
        }
        self.to_req
            .send(&mut self.rng, &mut self.pool, &mut self.batch);
    }

    fn check_time(&self) {
        assert!(
            self.off < Duration::from_secs(600),
            "seed {:?}: no end after 600 s of virtual time (livelock)",
            self.setup
        );
    }

    /// Until the requester's PU visits again: a response arrived (and, at random, more
    /// were let in behind it) or its timer is due.
    fn wait(&mut self) {
        loop {
            self.check_time();
            let flying = !self.to_resp.flight.is_empty() || !self.to_req.flight.is_empty();
            if !self.mailbox.is_empty() && (!flying || self.rng.below(3) == 0) {
                return;
            }
            if self.timer_due() {
                return;
            }
            assert!(
                self.step(),
                "seed {:?}: nothing on the wire, no timer, and {} messages outstanding (hang)",
                self.setup,
                self.req.outstanding()
            );
        }
    }

    /// `RoceTransport::post`: false for "window full".
    fn post(&mut self, msg: Message, data: &[u8], ack: bool) -> bool {
        if !self.mailbox.is_empty() || self.timer_due() {
            self.take_arrived(&mut []);
        }
        if !self.req.has_room(&msg) {
            if self.req.solicit() {
                self.transmit();
            }
            return false;
        }
        let mut buf = self.req.buffer();
        buf.extend_from_slice(data);
        self.req.start(msg, buf, ack);
        self.transmit();
        if !self.mailbox.is_empty() {
            self.take_arrived(&mut []);
        }
        true
    }

    /// `RoceTransport::settle` (`now`: `Ask::Now`, else `Ask::Arrived`).
    fn settle(&mut self, now: bool) -> Option<Outcome> {
        let nothing =
            self.mailbox.is_empty() && self.req.finished() == 0 && !(now && self.timer_due());
        if nothing {
            return None;
        }
        self.take_arrived(&mut []);
        self.req.pop_finished()
    }

    /// `RoceTransport::drive`.
    fn drive(&mut self, read_out: &mut [u8]) {
        loop {
            self.transmit();
            if self.req.outstanding() == 0 {
                return;
            }
            if self.req.solicit() {
                continue;
            }
            // The mailbox's wait: a response, or the timer.
            loop {
                self.check_time();
                if !self.mailbox.is_empty() || self.timer_due() {
                    break;
                }
                assert!(
                    self.step(),
                    "seed {:?}: nothing on the wire, no timer, and {} messages outstanding \
                     (hang)",
                    self.setup,
                    self.req.outstanding()
                );
            }
            if let Some(d) = self.mailbox.pop_front() {
                self.take(d, read_out);
            } else {
                self.on_timer();
            }
        }
    }

    /// `RoceTransport::run`: a READ or an atomic, alone.
    fn run(&mut self, msg: Message, read_out: &mut [u8]) -> Outcome {
        self.drive(&mut []);
        let before = self.req.finished();
        self.req.start(msg, Vec::new(), true);
        self.drive(read_out);
        if self.req.finished() > before {
            self.req.pop_last_finished().unwrap_or(Err(Nak::NoResponse))
        } else {
            Err(Nak::NoResponse)
        }
    }

    /// Outcomes that came before the READ or atomic `run` made: the posted messages'.
    fn settled_before_run(&mut self) -> Result<(), Stop> {
        while let Some(o) = self.req.pop_finished() {
            o.map_err(|n| Stop::Failed("a posted message", n))?;
        }
        Ok(())
    }

    /// A signaled WRITE or SEND posted and waited for.
    fn post_and_wait(&mut self, what: &'static str, msg: Message, data: &[u8]) -> Result<(), Stop> {
        while !self.post(msg, data, true) {
            self.wait();
        }
        loop {
            if let Some(o) = self.settle(true) {
                return o.map(|_| ()).map_err(|n| Stop::Failed(what, n));
            }
            self.wait();
        }
    }

    fn read(&mut self, what: &'static str, va: u64, len: usize) -> Result<Vec<u8>, Stop> {
        let mut out = vec![0; len];
        let o = self.run(
            Message::Read {
                va,
                rkey: RKEY,
                len: len as u32,
            },
            &mut out,
        );
        self.settled_before_run()?;
        let got = o.map_err(|n| Stop::Failed(what, n))?;
        assert_eq!(got, len as u64, "seed {:?}: {what}: bytes read", self.setup);
        Ok(out)
    }

    fn write(&mut self, what: &'static str, va: u64, data: &[u8]) -> Result<(), Stop> {
        let msg = Message::Write {
            va,
            rkey: RKEY,
            len: data.len() as u32,
            imm: None,
        };
        self.post_and_wait(what, msg, data)
    }

    /// The CI test's workload (with `full`; without, only its posted messages: the big
    /// WRITEs, the SENDs and the burst, not the READs and atomics, whose go-backs are the
    /// simpler kind and whose READ replays make most of a run's datagrams); Err if a
    /// message failed.
    fn workload(&mut self, full: bool) -> Result<(), Stop> {
        let setup = self.setup;
        for round in 0..3u8 {
            let big = pattern(300_000 + usize::from(round), round);
            self.write("big WRITE", BIG_AT, &big)?;
            let at = BIG_AT as usize;
            assert!(
                self.mem.mem[at..at + big.len()] == big[..],
                "seed {setup:?}: round {round}: WRITE placed exactly"
            );
            if full {
                let back = self.read("big READ", BIG_AT, big.len())?;
                assert!(
                    back == big,
                    "seed {setup:?}: round {round}: READ back exactly"
                );
            }
        }
        if full {
            self.atomics()?;
        }
        for i in 0..20u32 {
            let msg = Message::Send {
                len: 2000,
                imm: Some(i),
            };
            self.post_and_wait("SEND", msg, &pattern(2000, i as u8))?;
        }
        let expect: Vec<_> = (0..20u32)
            .map(|i| (pattern(2000, i as u8), Some(i)))
            .collect();
        assert!(
            self.mem.sends == expect,
            "seed {setup:?}: each SEND delivered once, in order ({} delivered)",
            self.mem.sends.len()
        );
        self.burst()?;
        assert_eq!(
            self.mem.failed, None,
            "seed {setup:?}: the responder saw no error"
        );
        Ok(())
    }

    /// 200 FETCH_ADDs of 1 on a zeroed word, one at a time: each returns the count before
    /// it and runs once, however often its request or answer is lost or repeated.
    fn atomics(&mut self) -> Result<(), Stop> {
        let setup = self.setup;
        self.write("zero", ATOMIC_AT, &0u64.to_le_bytes())?;
        for i in 0..200u64 {
            let o = self.run(
                Message::Atomic {
                    va: ATOMIC_AT,
                    rkey: RKEY,
                    swap_add: 1,
                    compare: None,
                },
                &mut [],
            );
            self.settled_before_run()?;
            let orig = o.map_err(|n| Stop::Failed("FETCH_ADD", n))?;
            assert_eq!(orig, i, "seed {setup:?}: FETCH_ADD {i}'s original");
        }
        assert_eq!(
            self.mem.atomics, 200,
            "seed {setup:?}: each atomic ran once"
        );
        let v = self.read("atomic READ", ATOMIC_AT, 8)?;
        assert_eq!(v, 200u64.to_le_bytes(), "seed {setup:?}: the sum");
        Ok(())
    }

    /// 40 signaled WRITEs (1 B..9 KB) and SENDs (1,500 B, every fifth) posted at once, so
    /// that many are in flight; their outcomes come in order, all good.
    fn burst(&mut self) -> Result<(), Stop> {
        let setup = self.setup;
        let n = 40;
        let is_send = |i: usize| i % 5 == 4;
        let len = |i: usize| if is_send(i) { 1500 } else { i * 997 % 9000 + 1 };
        let at = |i: usize| (1u64 << 20) + i as u64 * (16 << 10);
        let msg = |i: usize| {
            if is_send(i) {
                Message::Send {
                    len: len(i) as u32,
                    imm: Some(1000 + i as u32),
                }
            } else {
                Message::Write {
                    va: at(i),
                    rkey: RKEY,
                    len: len(i) as u32,
                    imm: None,
                }
            }
        };
        let mut done = 0;
        let take = |o: Outcome| o.map(|_| ()).map_err(|n| Stop::Failed("burst", n));
        for i in 0..n {
            let data = pattern(len(i), i as u8);
            while !self.post(msg(i), &data, true) {
                while let Some(o) = self.settle(true) {
                    take(o)?;
                    done += 1;
                }
                self.wait();
            }
            while let Some(o) = self.settle(false) {
                take(o)?;
                done += 1;
            }
        }
        while done < n {
            if let Some(o) = self.settle(true) {
                take(o)?;
                done += 1;
            } else {
                self.wait();
            }
        }
        let mut sends = self.mem.sends[20..].iter();
        for i in 0..n {
            let data = pattern(len(i), i as u8);
            if is_send(i) {
                assert_eq!(
                    sends.next(),
                    Some(&(data, Some(1000 + i as u32))),
                    "seed {setup:?}: burst SEND {i}"
                );
            } else {
                let a = at(i) as usize;
                assert!(
                    self.mem.mem[a..a + data.len()] == data[..],
                    "seed {setup:?}: burst WRITE {i}"
                );
            }
        }
        assert_eq!(sends.next(), None, "seed {setup:?}: no SEND twice");
        Ok(())
    }
}

fn pattern(len: usize, seed: u8) -> Vec<u8> {
    (0..len)
        .map(|i| ((i as u32).wrapping_mul(2_654_435_761) >> 24) as u8 ^ seed)
        .collect()
}

/// What a batch of seeds came to.
#[derive(Debug, Default)]
struct Tally {
    runs: u32,
    /// Seeds whose run stopped short, why, and the datagrams sent until then.
    failed: Vec<(u64, Stop, u64)>,
    virtual_time: Duration,
    datagrams: u64,
    /// Runs by the fewest retries they had left: [k] ran down to k.
    least_retries: [u32; 8],
    /// The seed that came nearest to running out (the first of those as near).
    nearest: Option<(u8, u64)>,
}

/// The workload (`full`, or only its posted messages) over `seeds` at `per_mille` faults.
fn run_seeds(per_mille: u32, full: bool, seeds: std::ops::Range<u64>) -> Tally {
    let mut t = Tally::default();
    for seed in seeds {
        let mut sim = Sim::new(Setup::new(seed, per_mille), false);
        let r = sim.workload(full);
        t.runs += 1;
        t.virtual_time += sim.off;
        t.datagrams += sim.to_resp.sent + sim.to_req.sent;
        t.least_retries[usize::from(sim.least_retries.min(7))] += 1;
        if t.nearest.is_none_or(|(least, _)| sim.least_retries < least) {
            t.nearest = Some((sim.least_retries, seed));
        }
        if let Err(stop) = r {
            t.failed
                .push((seed, stop, sim.to_resp.sent + sim.to_req.sent));
        }
    }
    t
}

/// Seeds a run takes: fewer in a debug build (about 20 times slower).
fn seeds(release: u64) -> u64 {
    if cfg!(debug_assertions) {
        (release / 40).max(1)
    } else {
        release
    }
}

fn report(what: &str, per_mille: u32, t: &Tally) {
    let shortest = t.failed.iter().min_by_key(|f| f.2);
    eprintln!(
        "{what}, {per_mille}‰ faults: {} seeds, {} ran out of retries (the shortest: \
         {shortest:?}); runs by the fewest retries left, 0..=7: {:?} (the first nearest, \
         (retries left, seed): {:?}); {:.1} s virtual, {} datagrams",
        t.runs,
        t.failed.len(),
        t.least_retries,
        t.nearest,
        t.virtual_time.as_secs_f64(),
        t.datagrams
    );
}

/// Runs the workload (`full`, or its posted messages) over `n` seeds from `first` at
/// `per_mille` faults; every result must be exact (the workload asserts it), at most
/// `allowed` runs may run out of their 7 retries, and each that does must end, exactly,
/// when run again with 40: bad luck (more losses in a row than the retries), not a livelock.
fn check(what: &str, per_mille: u32, full: bool, first: u64, n: u64, allowed: usize) {
    let t = run_seeds(per_mille, full, first..first + seeds(n));
    report(what, per_mille, &t);
    assert!(
        t.failed.len() <= allowed,
        "{what}, {per_mille}‰: {} runs out of retries, {allowed} allowed: {:?}",
        t.failed.len(),
        t.failed
    );
    for (seed, ..) in &t.failed {
        let mut setup = Setup::new(*seed, per_mille);
        setup.retry_cnt = 40;
        let mut sim = Sim::new(setup, false);
        assert_eq!(sim.workload(full), Ok(()), "{setup:?} with 40 retries");
    }
}

/// The CI test's posted messages (three 300 KB WRITEs, 20 SENDs, the burst of 40), where
/// its failure was, over many seeds at its 3 % faults: none runs out of retries. (Before
/// the fix in `Requester::on_response`, 27 of these 2,000 did.)
#[test]
fn posted_messages_never_run_out_of_retries_at_3_percent_faults() {
    check("posted", 30, false, 0, 2000, 0);
}

/// At 10 %: a run may be unlucky (a few in a thousand come within one retry of it), but
/// rarely. (Before the fix, 406 of 600 ran out.)
#[test]
fn posted_messages_rarely_run_out_of_retries_at_10_percent_faults() {
    check("posted", 100, false, 0, 400, 4);
}

/// The CI test's whole workload (with the READs back and the 200 FETCH_ADDs): at 3 %
/// faults none runs out of retries, at 10 % rarely, and every result is exact.
#[test]
fn the_whole_workload_is_exact_and_runs_out_of_retries_rarely_if_ever() {
    check("whole", 30, true, 1000, 250, 0);
    check("whole", 100, true, 1000, 60, 1);
}

/// At 20 % faults each way (dropped, and as many duplicated, and as many held back), eight
/// go-backs in a row that all lose their first packet or their one answer are no longer
/// rare: how often a run runs out of its 7 retries is reported, not held to a bound (about
/// 1 in 13 of the posted messages' runs, 1 in 5 of the whole workload's); each such seed
/// must end, exactly, with 40.
#[test]
fn twenty_percent_faults_leave_results_exact() {
    check("posted", 200, false, 2000, 120, usize::MAX);
    check("whole", 200, true, 2000, 30, usize::MAX);
}

/// The trace of one seed, for minimising a failure: `SIM_SEED=<seed> SIM_RATE=<per
/// mille> [SIM_RETRY=<retry_cnt>] [SIM_FULL=0] cargo test ... sim_tests::trace --
/// --ignored --nocapture`.
#[test]
#[ignore = "a tool for a failing seed"]
fn trace() {
    let var = |k: &str, d: u64| {
        std::env::var(k)
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(d)
    };
    let mut setup = Setup::new(var("SIM_SEED", 0), var("SIM_RATE", 30) as u32);
    setup.retry_cnt = var("SIM_RETRY", 7) as u8;
    let mut sim = Sim::new(setup, true);
    let r = sim.workload(var("SIM_FULL", 1) != 0);
    eprintln!("{}", sim.trace.take().unwrap_or_default());
    eprintln!("{setup:?}: {r:?} at {:?}", sim.off);
}

/// The livelock the simulation found, reduced to the requester alone: a long WRITE whose
/// every go-back meets a new gap a few packets in. The responder NAKs each new gap once,
/// at a later PSN each time (it took the packets before it). Each NAK must start a go-back
/// from its PSN and, being progress, restore the retries: the message must not fail while
/// the responder keeps taking packets. (Before the fix, a NAK further into the message
/// than the go-back under way started none and restored nothing: each new gap waited for
/// the ACK timer, which spent a retry, and after `retry_cnt` + 1 gaps the WRITE failed with
/// "retry exceeded" though every go-back had moved it on.)
#[test]
fn a_new_gap_in_each_go_back_is_resent_at_once_and_never_runs_out_of_retries() {
    let attrs = RequesterAttrs {
        mtu: 256,
        timeout: 8, // 1 ms
        retry_cnt: 7,
        rnr_retry: 7,
    };
    let mut r = Requester::new(attrs, RESP_QP, 100);
    let len = 256 * 60;
    r.start(
        Message::Write {
            va: 0,
            rkey: RKEY,
            len,
            imm: None,
        },
        vec![0; len as usize],
        true,
    );
    let mut now = Instant::now();
    let tx = |r: &mut Requester, now: Instant| {
        let mut psns = Vec::new();
        r.transmit(now, |h, _, _| psns.push(h.psn));
        psns
    };
    assert_eq!(tx(&mut r, now).len(), 60);
    let nak = |psn: u32| {
        let mut h = Header::new(opcode::ACKNOWLEDGE, REQ_QP, psn);
        h.aeth = Some(super::packet::Aeth {
            syndrome: Syndrome::NAK_SEQUENCE,
            msn: 0,
        });
        h
    };
    // Twelve gaps, each three packets past the last (more than retry_cnt + 1), each NAK
    // delivered twice (a duplicate on the wire starts nothing more).
    for k in 0..12u32 {
        let at = 101 + 3 * k;
        for copy in 0..2 {
            r.on_response(&nak(at), &[], now, &mut []).unwrap();
            let resent = tx(&mut r, now);
            if copy == 0 {
                assert_eq!(
                    resent.first(),
                    Some(&at),
                    "gap {k}: the go-back starts at once, at the NAK's PSN"
                );
            } else {
                assert!(resent.is_empty(), "gap {k}: a repeated NAK resends nothing");
            }
        }
        // And the go-back is lost too: the ACK timer resends.
        now = r.next_timer().expect("armed").max(now);
        r.on_timer(now);
        assert_eq!(r.pop_finished(), None, "gap {k}: the WRITE goes on");
        assert_eq!(
            tx(&mut r, now).first(),
            Some(&at),
            "gap {k}: the timer's go-back"
        );
    }
}
