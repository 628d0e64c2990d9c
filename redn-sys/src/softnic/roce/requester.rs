//! The requester side of one RC connection, as a state machine without I/O: it segments a
//! message into packets at the path MTU, takes ACKs, NAKs and READ / atomic responses,
//! retransmits go-back-N on a sequence NAK, a gap in READ responses or an ACK timeout, waits
//! out RNR NAKs, and ends every message in a result or the error its completion carries.
//!
//! One message is in flight at a time: the softnic's transport seam is synchronous (a PU
//! hands a WQE's operation to its transport and takes the result), so a QP never has more
//! than one READ or atomic outstanding, which any peer's `max_dest_rd_atomic` >= 1 admits.
//! Time comes in as `now` from the caller's clock, so timers are tested to the nanosecond.

use super::packet::{self, opcode, psn, AtomicEth, Header, Reth, Syndrome};
use super::DropReason;
use crate::mem::AccessFault;
use crate::softnic::transport::Nak;
use std::ops::Range;
use std::time::{Duration, Instant};

/// Packets sent past the oldest unacknowledged one before the requester waits for ACKs.
pub const WINDOW: u32 = 64;
/// Every this many packets of a long message asks for an ACK, so the window keeps moving.
pub const ACK_EVERY: u32 = 16;

/// Connection attributes the requester keeps to (the RTS attributes of IB).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RequesterAttrs {
    /// Path MTU in bytes (256..=4096, a power of two).
    pub mtu: u32,
    /// Local ACK timeout code: 4.096 µs × 2^code, 0 for none.
    pub timeout: u8,
    /// Retransmissions after a timeout or sequence NAK (0..=7).
    pub retry_cnt: u8,
    /// Retries after RNR NAKs (0..=7; 7 is infinite).
    pub rnr_retry: u8,
}

impl RequesterAttrs {
    /// The ACK timeout, or None if the code is 0 (no timer).
    #[must_use]
    pub fn ack_timeout(&self) -> Option<Duration> {
        (self.timeout != 0).then(|| Duration::from_nanos(4096u64 << self.timeout.min(31)))
    }
}

/// One message, as the wire sees it; data is passed separately when packets are built.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Message {
    /// SEND of `len` bytes.
    Send {
        /// Bytes.
        len: u32,
        /// Immediate data.
        imm: Option<u32>,
    },
    /// RDMA WRITE of `len` bytes to `va`.
    Write {
        /// Remote address.
        va: u64,
        /// Remote key.
        rkey: u32,
        /// Bytes.
        len: u32,
        /// Immediate data.
        imm: Option<u32>,
    },
    /// RDMA READ of `len` bytes from `va`.
    Read {
        /// Remote address.
        va: u64,
        /// Remote key.
        rkey: u32,
        /// Bytes.
        len: u32,
    },
    /// CMP_SWAP (`compare` Some) or FETCH_ADD on the 8 bytes at `va`.
    Atomic {
        /// Remote address.
        va: u64,
        /// Remote key.
        rkey: u32,
        /// Swap or add operand.
        swap_add: u64,
        /// Compare operand: Some for CMP_SWAP.
        compare: Option<u64>,
    },
}

/// What a response or a timer did to the message in flight.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Progress {
    /// Still in flight (maybe with packets to send: see [`Requester::transmit`]).
    Pending,
    /// Done: bytes read, the atomic's original value, or 0.
    Done(u64),
    /// Failed with the error its completion carries; the QP goes to error.
    Failed(Nak),
}

#[derive(Debug)]
struct InFlight {
    msg: Message,
    first: u32,
    /// PSNs the message takes (a READ one per response packet).
    npsn: u32,
    /// Oldest PSN not yet acknowledged (SEND/WRITE) or answered (READ/atomic).
    una: u32,
    /// Next SEND/WRITE packet to send.
    sent: u32,
    /// READ/atomic: the request (from `una`) must go out again.
    request_due: bool,
    /// READ: bytes received, in order.
    read_done: u32,
    /// READ: a response gap at this PSN was already retried (once per gap, as a NAK).
    gap_retried: Option<u32>,
    retries: u8,
    rnr: u8,
    deadline: Option<Instant>,
    rnr_until: Option<Instant>,
}

/// One QP's requester.
#[derive(Debug)]
pub struct Requester {
    attrs: RequesterAttrs,
    dest_qp: u32,
    next_psn: u32,
    cur: Option<InFlight>,
}

impl Requester {
    /// A requester sending to `dest_qp`, its first PSN `start_psn` (the peer's rq_psn).
    #[must_use]
    pub fn new(attrs: RequesterAttrs, dest_qp: u32, start_psn: u32) -> Requester {
        Requester {
            attrs,
            dest_qp,
            next_psn: start_psn & psn::MASK,
            cur: None,
        }
    }

    /// The PSN the next message starts at.
    #[cfg(test)]
    #[must_use]
    pub fn next_psn(&self) -> u32 {
        self.next_psn
    }

    /// Packets a message of `len` bytes takes at this MTU (at least one).
    fn packets(&self, len: u32) -> u32 {
        len.div_ceil(self.attrs.mtu).max(1)
    }

    /// Start a message (the previous one must be finished). Its packets go out through
    /// [`Self::transmit`].
    pub fn start(&mut self, msg: Message) {
        let npsn = match msg {
            Message::Send { len, .. } | Message::Write { len, .. } | Message::Read { len, .. } => {
                self.packets(len)
            }
            Message::Atomic { .. } => 1,
        };
        let first = self.next_psn;
        self.next_psn = psn::add(first, npsn);
        self.cur = Some(InFlight {
            msg,
            first,
            npsn,
            una: first,
            sent: first,
            request_due: true,
            read_done: 0,
            gap_retried: None,
            retries: self.attrs.retry_cnt,
            rnr: self.attrs.rnr_retry,
            deadline: None,
            rnr_until: None,
        });
    }

    /// The packets to send now, each a header and the range of the message's data it
    /// carries. Arms the ACK timer when something goes out.
    pub fn transmit(&mut self, now: Instant, out: &mut Vec<(Header, Range<usize>)>) {
        let mtu = self.attrs.mtu;
        let timeout = self.attrs.ack_timeout();
        let dest_qp = self.dest_qp;
        let Some(f) = self.cur.as_mut() else { return };
        if f.rnr_until.is_some() {
            return;
        }
        let last = psn::add(f.first, f.npsn - 1);
        let before = out.len();
        match f.msg {
            Message::Send { len, imm } | Message::Write { len, imm, .. } => {
                let write = matches!(f.msg, Message::Write { .. });
                while psn::diff(f.sent, last) <= 0
                    && psn::diff(f.sent, f.una) < i32::try_from(WINDOW).unwrap_or(i32::MAX)
                {
                    // psn::diff of two PSNs of one message is in 0..npsn.
                    let k = psn::diff(f.sent, f.first).unsigned_abs();
                    let from = k * mtu;
                    let to = (from + mtu).min(len);
                    let (only, is_first, is_last) = (f.npsn == 1, k == 0, k + 1 == f.npsn);
                    let op = match (write, only, is_first, is_last, imm.is_some()) {
                        (false, true, _, _, false) => opcode::SEND_ONLY,
                        (false, true, _, _, true) => opcode::SEND_ONLY_IMM,
                        (false, false, true, _, _) => opcode::SEND_FIRST,
                        (false, false, _, true, false) => opcode::SEND_LAST,
                        (false, false, _, true, true) => opcode::SEND_LAST_IMM,
                        (false, ..) => opcode::SEND_MIDDLE,
                        (true, true, _, _, false) => opcode::WRITE_ONLY,
                        (true, true, _, _, true) => opcode::WRITE_ONLY_IMM,
                        (true, false, true, _, _) => opcode::WRITE_FIRST,
                        (true, false, _, true, false) => opcode::WRITE_LAST,
                        (true, false, _, true, true) => opcode::WRITE_LAST_IMM,
                        (true, ..) => opcode::WRITE_MIDDLE,
                    };
                    let mut h = Header::new(op, dest_qp, f.sent);
                    h.ack_req = is_last || k % ACK_EVERY == ACK_EVERY - 1;
                    if is_last {
                        h.imm = imm;
                    }
                    if let (Message::Write { va, rkey, len, .. }, true) = (f.msg, is_first) {
                        h.reth = Some(Reth { va, rkey, len });
                    }
                    out.push((h, from as usize..to as usize));
                    f.sent = psn::add(f.sent, 1);
                }
            }
            Message::Read { va, rkey, len } => {
                if f.request_due {
                    let mut h = Header::new(opcode::READ_REQUEST, dest_qp, f.una);
                    h.ack_req = true;
                    h.reth = Some(Reth {
                        va: va.wrapping_add(u64::from(f.read_done)),
                        rkey,
                        len: len - f.read_done,
                    });
                    out.push((h, 0..0));
                    f.request_due = false;
                }
            }
            Message::Atomic {
                va,
                rkey,
                swap_add,
                compare,
            } => {
                if f.request_due {
                    let op = if compare.is_some() {
                        opcode::COMPARE_SWAP
                    } else {
                        opcode::FETCH_ADD
                    };
                    let mut h = Header::new(op, dest_qp, f.first);
                    h.ack_req = true;
                    h.atomic = Some(AtomicEth {
                        va,
                        rkey,
                        swap_add,
                        compare: compare.unwrap_or(0),
                    });
                    out.push((h, 0..0));
                    f.request_due = false;
                }
            }
        }
        if out.len() > before || f.deadline.is_none() {
            f.deadline = timeout.map(|t| now + t);
        }
    }

    /// When the requester next needs [`Self::on_timer`]: the ACK timeout or the end of an
    /// RNR wait.
    #[must_use]
    pub fn next_timer(&self) -> Option<Instant> {
        let f = self.cur.as_ref()?;
        f.rnr_until.or(f.deadline)
    }

    /// Let time pass: an RNR wait that ended resends from the oldest unacknowledged PSN; an
    /// ACK timeout uses up a retry and resends, or fails the message once none are left.
    pub fn on_timer(&mut self, now: Instant) -> Progress {
        let Some(f) = self.cur.as_mut() else {
            return Progress::Pending;
        };
        if let Some(t) = f.rnr_until {
            if now >= t {
                f.rnr_until = None;
                f.sent = f.una;
                f.request_due = true;
                f.deadline = None;
            }
            return Progress::Pending;
        }
        match f.deadline {
            Some(t) if now >= t => {
                if f.retries == 0 {
                    return self.finish(Progress::Failed(Nak::NoResponse));
                }
                f.retries -= 1;
                f.sent = f.una;
                f.request_due = true;
                f.deadline = None;
                Progress::Pending
            }
            _ => Progress::Pending,
        }
    }

    fn finish(&mut self, p: Progress) -> Progress {
        self.cur = None;
        p
    }

    /// Take a response (ACK, NAK, READ response or atomic ACK) for this QP. A READ's data
    /// lands in `read_out` (the message's length). `Err` says why a response that does not
    /// belong to the message in flight was dropped.
    pub fn on_response(
        &mut self,
        h: &Header,
        payload: &[u8],
        now: Instant,
        read_out: &mut [u8],
    ) -> Result<Progress, DropReason> {
        let mtu = self.attrs.mtu;
        let timeout = self.attrs.ack_timeout();
        let Some(f) = self.cur.as_mut() else {
            return Err(DropReason::UnexpectedResponse);
        };
        let last = psn::add(f.first, f.npsn - 1);
        let within = |p: u32, hi: u32| psn::diff(p, f.una) >= 0 && psn::diff(p, hi) <= 0;
        let syndrome = h.aeth.map(|a| Syndrome::of(a.syndrome));
        // NAKs that end the message, whatever it is.
        let fatal = match syndrome {
            Some(Syndrome::InvalidRequest) => Some(Nak::RemoteInvalid),
            // The wire does not say which rule refused; the completion only needs the class.
            Some(Syndrome::RemoteAccess) => Some(Nak::RemoteAccess(AccessFault::UnknownKey(0))),
            Some(Syndrome::RemoteOperation | Syndrome::Reserved) => Some(Nak::RemoteOperation),
            _ => None,
        };
        if let Some(nak) = fatal {
            if !within(h.psn, last) {
                return Err(DropReason::UnexpectedResponse);
            }
            return Ok(self.finish(Progress::Failed(nak)));
        }
        if h.opcode == opcode::ACKNOWLEDGE {
            match syndrome {
                Some(Syndrome::SequenceError) => {
                    // The responder expects `h.psn`: everything before it arrived.
                    if !within(h.psn, psn::add(last, 1)) {
                        return Err(DropReason::UnexpectedResponse);
                    }
                    if matches!(f.msg, Message::Send { .. } | Message::Write { .. }) {
                        if h.psn != f.una {
                            // It acknowledges packets: progress restores the retries.
                            f.retries = self.attrs.retry_cnt;
                        }
                        f.una = h.psn;
                        if f.una == psn::add(last, 1) {
                            return Ok(self.finish(Progress::Done(0)));
                        }
                    }
                    if f.retries == 0 {
                        return Ok(self.finish(Progress::Failed(Nak::NoResponse)));
                    }
                    f.retries -= 1;
                    f.sent = f.una;
                    f.request_due = true;
                    f.deadline = None;
                    return Ok(Progress::Pending);
                }
                Some(Syndrome::Rnr(code)) => {
                    if !within(h.psn, last) {
                        return Err(DropReason::UnexpectedResponse);
                    }
                    if matches!(f.msg, Message::Send { .. } | Message::Write { .. }) {
                        f.una = h.psn;
                    }
                    if f.rnr != 7 {
                        if f.rnr == 0 {
                            return Ok(self.finish(Progress::Failed(Nak::RnrRetryExceeded)));
                        }
                        f.rnr -= 1;
                    }
                    f.rnr_until = Some(now + Duration::from_nanos(packet::rnr_delay_ns(code)));
                    f.deadline = None;
                    return Ok(Progress::Pending);
                }
                Some(Syndrome::Ack) => {
                    if !matches!(f.msg, Message::Send { .. } | Message::Write { .. })
                        || !within(h.psn, last)
                    {
                        return Err(DropReason::UnexpectedResponse);
                    }
                    f.una = psn::add(h.psn, 1);
                    f.retries = self.attrs.retry_cnt;
                    f.rnr = self.attrs.rnr_retry;
                    if f.una == psn::add(last, 1) {
                        return Ok(self.finish(Progress::Done(0)));
                    }
                    f.deadline = timeout.map(|t| now + t);
                    return Ok(Progress::Pending);
                }
                _ => return Err(DropReason::UnexpectedResponse),
            }
        }
        match (f.msg, h.opcode) {
            (Message::Atomic { .. }, opcode::ATOMIC_ACKNOWLEDGE) => {
                if h.psn != f.first || syndrome != Some(Syndrome::Ack) {
                    return Err(DropReason::UnexpectedResponse);
                }
                let orig = h.atomic_ack.unwrap_or(0);
                Ok(self.finish(Progress::Done(orig)))
            }
            (Message::Read { len, .. }, op)
                if packet::is_response(op) && op <= opcode::READ_RESPONSE_ONLY =>
            {
                if !within(h.psn, last) {
                    return Err(DropReason::UnexpectedResponse);
                }
                if h.psn != f.una {
                    // A response went missing: ask again from it, once per gap.
                    if f.gap_retried != Some(f.una) {
                        f.gap_retried = Some(f.una);
                        if f.retries == 0 {
                            return Ok(self.finish(Progress::Failed(Nak::NoResponse)));
                        }
                        f.retries -= 1;
                        f.request_due = true;
                    }
                    return Err(DropReason::OutOfSequence);
                }
                let rest = len - f.read_done;
                let n = u32::try_from(payload.len()).map_err(|_| DropReason::BadLength)?;
                let ends = matches!(op, opcode::READ_RESPONSE_LAST | opcode::READ_RESPONSE_ONLY);
                let starts = matches!(op, opcode::READ_RESPONSE_FIRST | opcode::READ_RESPONSE_ONLY);
                // A response restarts with FIRST/ONLY at the message's first PSN; after a
                // retry it may go on with MIDDLE/LAST or start over with FIRST/ONLY.
                let order_ok = starts || f.read_done != 0;
                let len_ok = if ends {
                    n == rest && n <= mtu
                } else {
                    n == mtu && rest > mtu
                };
                let aeth_ok = op == opcode::READ_RESPONSE_MIDDLE || syndrome == Some(Syndrome::Ack);
                if !(order_ok && len_ok && aeth_ok) || read_out.len() < len as usize {
                    return Err(DropReason::UnexpectedResponse);
                }
                let at = f.read_done as usize;
                read_out[at..at + n as usize].copy_from_slice(payload);
                f.read_done += n;
                f.una = psn::add(f.una, 1);
                f.retries = self.attrs.retry_cnt;
                if ends {
                    return Ok(self.finish(Progress::Done(u64::from(len))));
                }
                f.deadline = timeout.map(|t| now + t);
                Ok(Progress::Pending)
            }
            _ => Err(DropReason::UnexpectedResponse),
        }
    }
}

#[cfg(test)]
// Test data is made of byte patterns: narrowing an index to a byte is the point.
#[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
mod tests {
    use super::*;
    use crate::clock::{Clock, ManualClock};
    use crate::softnic::roce::packet::Aeth;

    fn attrs() -> RequesterAttrs {
        RequesterAttrs {
            mtu: 256,
            timeout: 8, // 1.048576 ms
            retry_cnt: 2,
            rnr_retry: 1,
        }
    }

    fn ack(op: u8, psn: u32, syndrome: u8) -> Header {
        let mut h = Header::new(op, 7, psn);
        h.aeth = Some(Aeth { syndrome, msn: 0 });
        h
    }

    fn tx(r: &mut Requester, now: Instant) -> Vec<(Header, Range<usize>)> {
        let mut out = Vec::new();
        r.transmit(now, &mut out);
        out
    }

    #[test]
    fn a_write_is_segmented_first_middle_last_across_the_psn_wrap() {
        let c = ManualClock::new();
        let mut r = Requester::new(attrs(), 7, 0xff_fffe);
        r.start(Message::Write {
            va: 0x1000,
            rkey: 5,
            len: 600,
            imm: Some(9),
        });
        let p = tx(&mut r, c.now());
        let ops: Vec<_> = p.iter().map(|(h, _)| h.opcode).collect();
        assert_eq!(
            ops,
            [
                opcode::WRITE_FIRST,
                opcode::WRITE_MIDDLE,
                opcode::WRITE_LAST_IMM
            ]
        );
        let psns: Vec<_> = p.iter().map(|(h, _)| h.psn).collect();
        assert_eq!(psns, [0xff_fffe, 0xff_ffff, 0]);
        assert_eq!(
            p[0].0.reth,
            Some(Reth {
                va: 0x1000,
                rkey: 5,
                len: 600
            })
        );
        assert_eq!((p[1].0.reth, p[2].0.imm), (None, Some(9)));
        assert_eq!(
            p.iter().map(|(_, r)| r.clone()).collect::<Vec<_>>(),
            [0..256, 256..512, 512..600]
        );
        assert!(p[2].0.ack_req && !p[0].0.ack_req);
        // The ACK of the last PSN (0 after the wrap) completes it; the next message starts at 1.
        let mut buf = [];
        assert_eq!(
            r.on_response(&ack(opcode::ACKNOWLEDGE, 0, 0x1f), &[], c.now(), &mut buf),
            Ok(Progress::Done(0))
        );
        assert_eq!(r.next_psn(), 1);
    }

    #[test]
    fn only_packets_and_zero_length() {
        let c = ManualClock::new();
        let mut r = Requester::new(attrs(), 7, 10);
        r.start(Message::Send { len: 0, imm: None });
        let p = tx(&mut r, c.now());
        assert_eq!(
            (p.len(), p[0].0.opcode, p[0].1.clone()),
            (1, opcode::SEND_ONLY, 0..0)
        );
        // An ACK older than the message is stale.
        assert_eq!(
            r.on_response(&ack(opcode::ACKNOWLEDGE, 9, 0x1f), &[], c.now(), &mut []),
            Err(DropReason::UnexpectedResponse)
        );
        r.on_response(&ack(opcode::ACKNOWLEDGE, 10, 0x1f), &[], c.now(), &mut [])
            .unwrap();
        r.start(Message::Send {
            len: 256,
            imm: Some(1),
        });
        let p = tx(&mut r, c.now());
        assert_eq!(
            (p.len(), p[0].0.opcode, p[0].0.psn),
            (1, opcode::SEND_ONLY_IMM, 11)
        );
    }

    #[test]
    fn a_sequence_nak_goes_back_n_and_costs_a_retry() {
        let c = ManualClock::new();
        let mut r = Requester::new(attrs(), 7, 100);
        r.start(Message::Send {
            len: 256 * 5,
            imm: None,
        });
        assert_eq!(tx(&mut r, c.now()).len(), 5);
        // Packet 102 was lost: the responder NAKs with its expected PSN.
        for retry in 0..2 {
            assert_eq!(
                r.on_response(&ack(opcode::ACKNOWLEDGE, 102, 0x60), &[], c.now(), &mut []),
                Ok(Progress::Pending)
            );
            let p = tx(&mut r, c.now());
            assert_eq!(
                p.iter().map(|(h, _)| h.psn).collect::<Vec<_>>(),
                [102, 103, 104],
                "{retry}"
            );
            assert_eq!(p[0].0.opcode, opcode::SEND_MIDDLE, "original segmentation");
        }
        assert_eq!(
            r.on_response(&ack(opcode::ACKNOWLEDGE, 102, 0x60), &[], c.now(), &mut []),
            Ok(Progress::Failed(Nak::NoResponse)),
            "retry_cnt 2 allows two resends"
        );
        // A NAK further on acknowledges packets: that progress restores the retries.
        let mut r = Requester::new(attrs(), 7, 100);
        r.start(Message::Send {
            len: 256 * 5,
            imm: None,
        });
        tx(&mut r, c.now());
        for nak in [101, 101, 102, 102, 103, 103] {
            assert_eq!(
                r.on_response(&ack(opcode::ACKNOWLEDGE, nak, 0x60), &[], c.now(), &mut []),
                Ok(Progress::Pending),
                "NAK {nak}"
            );
        }
    }

    #[test]
    fn ack_timeouts_resend_then_fail_with_retry_exceeded() {
        let c = ManualClock::new();
        let mut r = Requester::new(attrs(), 7, 0);
        r.start(Message::Write {
            va: 0,
            rkey: 1,
            len: 8,
            imm: None,
        });
        tx(&mut r, c.now());
        let t = r.next_timer().expect("armed");
        assert_eq!(t - c.now(), Duration::from_nanos(4096 << 8));
        c.advance(Duration::from_nanos((4096 << 8) - 1));
        assert_eq!(r.on_timer(c.now()), Progress::Pending);
        assert!(tx(&mut r, c.now()).is_empty(), "not yet");
        for _ in 0..2 {
            c.advance(Duration::from_millis(2));
            assert_eq!(r.on_timer(c.now()), Progress::Pending);
            assert_eq!(tx(&mut r, c.now()).len(), 1, "resent");
        }
        c.advance(Duration::from_millis(2));
        assert_eq!(r.on_timer(c.now()), Progress::Failed(Nak::NoResponse));
    }

    #[test]
    fn progress_resets_the_retry_count() {
        let c = ManualClock::new();
        let mut r = Requester::new(attrs(), 7, 0);
        r.start(Message::Send {
            len: 256 * 40,
            imm: None,
        });
        assert_eq!(tx(&mut r, c.now()).len(), 40);
        for _ in 0..2 {
            c.advance(Duration::from_millis(2));
            r.on_timer(c.now());
        }
        assert_eq!(
            tx(&mut r, c.now()).len(),
            40,
            "go back to the oldest unacknowledged"
        );
        r.on_response(&ack(opcode::ACKNOWLEDGE, 15, 0x1f), &[], c.now(), &mut [])
            .unwrap();
        c.advance(Duration::from_millis(2));
        assert_eq!(
            r.on_timer(c.now()),
            Progress::Pending,
            "retries restored by the ACK"
        );
        assert_eq!(tx(&mut r, c.now())[0].0.psn, 16);
    }

    #[test]
    fn the_window_holds_back_a_long_message() {
        let c = ManualClock::new();
        let mut r = Requester::new(attrs(), 7, 0);
        r.start(Message::Write {
            va: 0,
            rkey: 1,
            len: 256 * 200,
            imm: None,
        });
        let p = tx(&mut r, c.now());
        assert_eq!(p.len(), WINDOW as usize);
        assert!(p[ACK_EVERY as usize - 1].0.ack_req);
        r.on_response(&ack(opcode::ACKNOWLEDGE, 15, 0x1f), &[], c.now(), &mut [])
            .unwrap();
        let p = tx(&mut r, c.now());
        assert_eq!((p.len(), p[0].0.psn), (16, 64));
    }

    #[test]
    fn rnr_naks_wait_their_timer_and_run_out() {
        let c = ManualClock::new();
        let mut r = Requester::new(attrs(), 7, 50);
        r.start(Message::Send { len: 4, imm: None });
        tx(&mut r, c.now());
        assert_eq!(
            r.on_response(
                &ack(opcode::ACKNOWLEDGE, 50, 0x20 | 14),
                &[],
                c.now(),
                &mut []
            ),
            Ok(Progress::Pending)
        );
        assert!(tx(&mut r, c.now()).is_empty(), "waits");
        assert_eq!(r.next_timer(), Some(c.now() + Duration::from_micros(1280)));
        c.advance(Duration::from_micros(1279));
        r.on_timer(c.now());
        assert!(tx(&mut r, c.now()).is_empty());
        c.advance(Duration::from_micros(1));
        r.on_timer(c.now());
        assert_eq!(tx(&mut r, c.now())[0].0.psn, 50, "resent after the timer");
        assert_eq!(
            r.on_response(&ack(opcode::ACKNOWLEDGE, 50, 0x21), &[], c.now(), &mut []),
            Ok(Progress::Failed(Nak::RnrRetryExceeded)),
            "rnr_retry 1"
        );
        // rnr_retry 7 never runs out.
        let mut r = Requester::new(
            RequesterAttrs {
                rnr_retry: 7,
                ..attrs()
            },
            7,
            0,
        );
        r.start(Message::Send { len: 4, imm: None });
        for _ in 0..100 {
            tx(&mut r, c.now());
            assert_eq!(
                r.on_response(&ack(opcode::ACKNOWLEDGE, 0, 0x21), &[], c.now(), &mut []),
                Ok(Progress::Pending)
            );
            c.advance(Duration::from_millis(1));
            r.on_timer(c.now());
        }
    }

    #[test]
    fn remote_naks_end_the_message_with_their_error() {
        let c = ManualClock::new();
        for (code, want) in [
            (0x61, Nak::RemoteInvalid),
            (0x62, Nak::RemoteAccess(AccessFault::UnknownKey(0))),
            (0x63, Nak::RemoteOperation),
            (0x6a, Nak::RemoteOperation),
        ] {
            let mut r = Requester::new(attrs(), 7, 0);
            r.start(Message::Read {
                va: 0,
                rkey: 1,
                len: 8,
            });
            tx(&mut r, c.now());
            assert_eq!(
                r.on_response(
                    &ack(opcode::ACKNOWLEDGE, 0, code),
                    &[],
                    c.now(),
                    &mut [0; 8]
                ),
                Ok(Progress::Failed(want))
            );
        }
    }

    #[test]
    fn a_read_reassembles_and_re_requests_from_a_gap() {
        let c = ManualClock::new();
        let mut r = Requester::new(attrs(), 7, 0xff_fffe);
        r.start(Message::Read {
            va: 0x5000,
            rkey: 3,
            len: 700,
        });
        let p = tx(&mut r, c.now());
        assert_eq!(p.len(), 1);
        assert_eq!(
            p[0].0.reth,
            Some(Reth {
                va: 0x5000,
                rkey: 3,
                len: 700
            })
        );
        assert_eq!(r.next_psn(), 1, "a READ of 3 packets takes 3 PSNs");
        let data: Vec<u8> = (0..700).map(|i| (i * 7) as u8).collect();
        let mut out = vec![0u8; 700];
        let first = ack(opcode::READ_RESPONSE_FIRST, 0xff_fffe, 0x1f);
        assert_eq!(
            r.on_response(&first, &data[..256], c.now(), &mut out),
            Ok(Progress::Pending)
        );
        // The MIDDLE is lost; the LAST arrives: one re-request from the missing PSN.
        let last = ack(opcode::READ_RESPONSE_LAST, 0, 0x1f);
        assert_eq!(
            r.on_response(&last, &data[512..], c.now(), &mut out),
            Err(DropReason::OutOfSequence)
        );
        assert_eq!(
            r.on_response(&last, &data[512..], c.now(), &mut out),
            Err(DropReason::OutOfSequence)
        );
        let p = tx(&mut r, c.now());
        assert_eq!(p.len(), 1, "once per gap");
        assert_eq!(p[0].0.psn, 0xff_ffff);
        assert_eq!(
            p[0].0.reth,
            Some(Reth {
                va: 0x5000 + 256,
                rkey: 3,
                len: 444
            })
        );
        let mid = Header::new(opcode::READ_RESPONSE_MIDDLE, 7, 0xff_ffff);
        assert_eq!(
            r.on_response(&mid, &data[256..512], c.now(), &mut out),
            Ok(Progress::Pending)
        );
        // A LAST of the wrong length is not taken.
        assert_eq!(
            r.on_response(&last, &data[511..], c.now(), &mut out),
            Err(DropReason::UnexpectedResponse)
        );
        assert_eq!(
            r.on_response(&last, &data[512..], c.now(), &mut out),
            Ok(Progress::Done(700))
        );
        assert_eq!(out, data);
    }

    #[test]
    fn an_atomic_is_resent_with_its_psn_and_takes_the_original_value() {
        let c = ManualClock::new();
        let mut r = Requester::new(attrs(), 7, 33);
        r.start(Message::Atomic {
            va: 8,
            rkey: 2,
            swap_add: 5,
            compare: Some(4),
        });
        let p = tx(&mut r, c.now());
        assert_eq!(p[0].0.opcode, opcode::COMPARE_SWAP);
        c.advance(Duration::from_millis(2));
        r.on_timer(c.now());
        let p = tx(&mut r, c.now());
        assert_eq!(
            (p[0].0.psn, p[0].0.atomic.unwrap().compare),
            (33, 4),
            "same PSN: a duplicate"
        );
        let mut a = ack(opcode::ATOMIC_ACKNOWLEDGE, 33, 0x1f);
        a.atomic_ack = Some(0xfeed);
        assert_eq!(
            r.on_response(&a, &[], c.now(), &mut []),
            Ok(Progress::Done(0xfeed))
        );
        assert_eq!(r.next_psn(), 34);
    }
}
