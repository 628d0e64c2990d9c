//! The requester side of one RC connection, as a state machine without I/O: it segments
//! messages into packets at the path MTU, keeps several SENDs and WRITEs outstanding at once
//! (a window, as RC and rxe do), takes ACKs, NAKs and READ / atomic responses, retransmits
//! go-back-N from the oldest unacknowledged PSN on a sequence NAK, a gap in READ responses
//! or an ACK timeout, waits out RNR NAKs, and ends every message in its outcome, in order.
//!
//! The window: at most [`MAX_MESSAGES`] messages and [`MAX_BYTES`] of their payload are
//! outstanding (a bigger message goes alone), and at most [`WINDOW`] packets past the oldest
//! unacknowledged one are on the wire. A READ or an atomic goes alone: it starts once
//! everything before it is acknowledged and nothing starts until it is answered, so a QP has
//! at most one outstanding, which any peer's `max_dest_rd_atomic` >= 1 admits, and the
//! softnic's executor takes its result at once (its data lands before a later WQE runs).
//! Time comes in as `now` from the caller's clock, so timers are tested to the nanosecond.

use super::packet::{self, opcode, psn, AtomicEth, Header, Reth, Syndrome};
use super::DropReason;
use crate::mem::AccessFault;
use crate::softnic::transport::Nak;
use std::collections::VecDeque;
use std::ops::Range;
use std::time::{Duration, Instant};

/// Packets sent past the oldest unacknowledged one before the requester waits for ACKs.
pub const WINDOW: u32 = 64;
/// Every packet whose PSN is a multiple of this, less one, asks for an ACK (AckReq), so that
/// the window keeps moving whatever the messages' sizes; so does the last packet of a
/// message whose outcome is waited for (a signaled WQE's). Other packets do not: the
/// responder acknowledges them with the next ACK it sends (ACKs are cumulative), and a
/// request-answer exchange sends one datagram a side, not two.
pub const ACK_EVERY: u32 = 16;
/// How long the newest packet sent may go without an ACK asked for (the sender fell quiet
/// after packets that did not ask) before the requester asks, by sending it again with
/// AckReq: a duplicate, which the responder acknowledges without running it again (C9-105).
/// Short against the ACK timeout (at most a quarter of it), so that a quiet sender's last
/// messages are acknowledged, not retransmitted.
pub const SOLICIT_AFTER: Duration = Duration::from_millis(1);
/// SENDs and WRITEs outstanding (started, not yet acknowledged) at most.
pub const MAX_MESSAGES: usize = 32;
/// Payload bytes of the outstanding messages at most: the requester keeps a copy of each
/// until its ACK, for retransmission. A message bigger than this goes out alone.
pub const MAX_BYTES: usize = 1 << 20;
/// The RC WRITE opcodes are the SEND ones this far on, in the same order (IBTA's opcode
/// table: FIRST, MIDDLE, LAST, LAST with immediate, ONLY, ONLY with immediate).
const WRITE_AFTER_SEND: u8 = opcode::WRITE_FIRST - opcode::SEND_FIRST;
const _: () = assert!(
    opcode::WRITE_MIDDLE - opcode::SEND_MIDDLE == WRITE_AFTER_SEND
        && opcode::WRITE_LAST - opcode::SEND_LAST == WRITE_AFTER_SEND
        && opcode::WRITE_LAST_IMM - opcode::SEND_LAST_IMM == WRITE_AFTER_SEND
        && opcode::WRITE_ONLY - opcode::SEND_ONLY == WRITE_AFTER_SEND
        && opcode::WRITE_ONLY_IMM - opcode::SEND_ONLY_IMM == WRITE_AFTER_SEND
);
/// Payload buffers of finished messages kept for reuse.
const SPARE_BUFFERS: usize = 8;

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

/// One message, as the wire sees it; a SEND's or WRITE's data is handed over with it.
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

impl Message {
    /// True for a SEND or a WRITE: acknowledged by plain ACKs, and windowed.
    fn posted(&self) -> bool {
        matches!(self, Message::Send { .. } | Message::Write { .. })
    }

    /// Payload bytes the requester keeps for it.
    fn payload(&self) -> usize {
        match *self {
            Message::Send { len, .. } | Message::Write { len, .. } => len as usize,
            Message::Read { .. } | Message::Atomic { .. } => 0,
        }
    }
}

/// How a message ended: bytes read, the atomic's original value, or 0; or the error its
/// completion carries (the QP goes to error).
pub type Outcome = Result<u64, Nak>;

/// One outstanding message.
#[derive(Debug)]
struct Outstanding {
    msg: Message,
    first: u32,
    /// PSNs the message takes (a READ one per response packet).
    npsn: u32,
    /// A SEND's or WRITE's payload, kept for retransmission.
    data: Vec<u8>,
    /// Its last packet asks for an ACK (someone waits for its outcome).
    ack: bool,
}

impl Outstanding {
    /// The PSN after its last.
    fn end(&self) -> u32 {
        psn::add(self.first, self.npsn)
    }
}

/// One QP's requester.
#[derive(Debug)]
pub struct Requester {
    attrs: RequesterAttrs,
    dest_qp: u32,
    /// The PSN the next message starts at.
    next_psn: u32,
    /// Outstanding messages, oldest first, their PSNs contiguous up to `next_psn`.
    msgs: VecDeque<Outstanding>,
    /// Payload bytes of `msgs`.
    bytes: usize,
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
    /// A sequence NAK started a go-back that no progress has ended yet: further sequence
    /// NAKs at the same PSN start no other and cost no retry, as in rxe's completer
    /// (`started_retry`, cleared by `reset_retry_counters`); a resend lost again is the ACK
    /// timer's to retry. Without it every NAK resent the whole window again: a peer
    /// repeating a NAK made the QP send its window once a NAK. A NAK at a later PSN is
    /// progress (it acknowledges packets) and names a new gap: it clears this.
    nak_retry: bool,
    rnr: u8,
    deadline: Option<Instant>,
    rnr_until: Option<Instant>,
    /// The newest SEND/WRITE packet sent asked for an ACK (or none was sent): nothing to
    /// solicit.
    asked: bool,
    /// When to ask for an ACK of the newest packet sent, which did not ask (see
    /// [`SOLICIT_AFTER`]).
    solicit_at: Option<Instant>,
    /// A copy of the newest packet sent, asking for an ACK, goes out with the next transmit.
    solicit_due: bool,
    /// Outcomes of finished messages not yet taken, oldest first.
    finished: VecDeque<Outcome>,
    /// A message failed: nothing more goes out (the QP is going to error).
    failed: bool,
    spare: Vec<Vec<u8>>,
    /// The PSN after the newest SEND/WRITE packet ever sent: one before it goes out again.
    fresh: u32,
    /// Payload bytes of SEND/WRITE packets sent again (go-back-N after a NAK or a timeout,
    /// a copy that asks for an ACK), since the requester was made: retransmissions cost the
    /// QP as much as first sends, and its owner charges them (see `resent_bytes`).
    resent: u64,
}

impl Requester {
    /// A requester sending to `dest_qp`, its first PSN `start_psn` (the peer's rq_psn).
    #[must_use]
    pub fn new(attrs: RequesterAttrs, dest_qp: u32, start_psn: u32) -> Requester {
        let start = start_psn & psn::MASK;
        Requester {
            attrs,
            dest_qp,
            next_psn: start,
            msgs: VecDeque::new(),
            bytes: 0,
            una: start,
            sent: start,
            request_due: false,
            read_done: 0,
            gap_retried: None,
            retries: attrs.retry_cnt,
            nak_retry: false,
            rnr: attrs.rnr_retry,
            fresh: start,
            resent: 0,
            deadline: None,
            rnr_until: None,
            asked: true,
            solicit_at: None,
            solicit_due: false,
            finished: VecDeque::new(),
            failed: false,
            spare: Vec::new(),
        }
    }

    /// The PSN the next message starts at.
    #[cfg(test)]
    #[must_use]
    pub fn next_psn(&self) -> u32 {
        self.next_psn
    }

    /// Retries left before a timeout or a sequence NAK without progress fails the oldest
    /// message.
    #[cfg(test)]
    #[must_use]
    pub fn retries_left(&self) -> u8 {
        self.retries
    }

    /// Messages started and not finished.
    #[must_use]
    pub fn outstanding(&self) -> usize {
        self.msgs.len()
    }

    /// True if `msg` may start now: nothing is outstanding, or it is a SEND or WRITE behind
    /// SENDs and WRITEs and the window has room for it. Always true once a message failed
    /// (nothing more goes out).
    #[must_use]
    pub fn has_room(&self, msg: &Message) -> bool {
        let Some(front) = self.msgs.front() else {
            return true;
        };
        self.failed
            || (msg.posted()
                && front.msg.posted()
                && self.msgs.len() < MAX_MESSAGES
                && self.bytes + msg.payload() <= MAX_BYTES)
    }

    /// A cleared buffer for a message's payload (one a finished message left, if any).
    pub fn buffer(&mut self) -> Vec<u8> {
        self.spare.pop().unwrap_or_default()
    }

    /// Packets a message of `len` bytes takes at this MTU (at least one).
    fn packets(&self, len: u32) -> u32 {
        len.div_ceil(self.attrs.mtu).max(1)
    }

    /// Start a message (see [`Self::has_room`]; a caller that starts one without room
    /// only widens the window) with its payload (a SEND's or WRITE's `len` bytes; empty
    /// for a READ or atomic). With `ack`, its last packet asks for an ACK (its outcome is
    /// waited for: a signaled WQE); without, it is acknowledged with what follows it (see
    /// [`ACK_EVERY`]). Its packets go out through [`Self::transmit`]. Once a message
    /// failed, nothing starts and no outcome comes.
    pub fn start(&mut self, msg: Message, data: Vec<u8>, ack: bool) {
        if self.failed {
            self.recycle(data);
            return;
        }
        let npsn = match msg {
            Message::Send { len, .. } | Message::Write { len, .. } | Message::Read { len, .. } => {
                self.packets(len)
            }
            Message::Atomic { .. } => 1,
        };
        let first = self.next_psn;
        self.next_psn = psn::add(first, npsn);
        if self.msgs.is_empty() {
            // A fresh window: its own retry counts and timers.
            self.una = first;
            self.sent = first;
            self.retries = self.attrs.retry_cnt;
            self.nak_retry = false;
            self.rnr = self.attrs.rnr_retry;
            self.deadline = None;
            self.rnr_until = None;
            self.clear_solicit();
        }
        self.request_due = true;
        self.read_done = 0;
        self.gap_retried = None;
        self.bytes += data.len();
        self.msgs.push_back(Outstanding {
            msg,
            first,
            npsn,
            data,
            ack,
        });
    }

    /// Payload bytes of SEND/WRITE packets sent again so far (see `resent`).
    #[must_use]
    pub fn resent_bytes(&self) -> u64 {
        self.resent
    }

    /// The outcome of the oldest finished message not taken yet.
    pub fn pop_finished(&mut self) -> Option<Outcome> {
        self.finished.pop_front()
    }

    /// The outcome of the newest finished message not taken yet.
    pub fn pop_last_finished(&mut self) -> Option<Outcome> {
        self.finished.pop_back()
    }

    /// Outcomes not taken yet.
    #[must_use]
    pub fn finished(&self) -> usize {
        self.finished.len()
    }

    /// Forget everything outstanding and every outcome not taken (the QP went to error;
    /// its completions are flushed).
    pub fn clear(&mut self) {
        self.drop_outstanding();
        self.finished.clear();
    }

    /// End the oldest outstanding message with `nak` and drop the rest (nothing more goes
    /// out: the QP goes to error and flushes them). Outcomes not taken yet stay.
    pub fn fail(&mut self, nak: Nak) {
        if self.msgs.is_empty() {
            return;
        }
        self.drop_outstanding();
        self.finished.push_back(Err(nak));
    }

    /// Drop every outstanding message; nothing more starts or goes out.
    fn drop_outstanding(&mut self) {
        self.failed = true;
        while let Some(m) = self.msgs.pop_front() {
            self.recycle(m.data);
        }
        self.bytes = 0;
        self.deadline = None;
        self.rnr_until = None;
        self.clear_solicit();
    }

    /// Nothing sent is waiting for an ACK to be asked for.
    fn clear_solicit(&mut self) {
        self.asked = true;
        self.solicit_at = None;
        self.solicit_due = false;
    }

    /// Someone waits for an outcome: if the newest packet sent did not ask for an ACK, a copy
    /// of it that asks goes out with the next [`Self::transmit`] (true), rather than after
    /// [`SOLICIT_AFTER`].
    pub fn solicit(&mut self) -> bool {
        if self.asked || self.solicit_due || !self.unacknowledged_sent() {
            return false;
        }
        self.solicit_due = true;
        true
    }

    /// SEND/WRITE packets were sent and not all are acknowledged.
    fn unacknowledged_sent(&self) -> bool {
        self.msgs.front().is_some_and(|m| m.msg.posted()) && psn::diff(self.sent, self.una) > 0
    }

    fn recycle(&mut self, mut data: Vec<u8>) {
        if self.spare.len() < SPARE_BUFFERS && data.capacity() > 0 {
            data.clear();
            self.spare.push(data);
        }
    }

    /// Finish the oldest message with `outcome`.
    fn finish_front(&mut self, outcome: Outcome) {
        if let Some(m) = self.msgs.pop_front() {
            self.bytes -= m.data.len();
            self.recycle(m.data);
            self.finished.push_back(outcome);
        }
        if self.msgs.is_empty() {
            self.deadline = None;
            self.rnr_until = None;
            self.clear_solicit();
        }
    }

    /// Finish every SEND/WRITE whose PSNs all lie before `una` (acknowledged).
    fn acknowledge_to(&mut self, una: u32) {
        while let Some(m) = self.msgs.front() {
            if !m.msg.posted() || psn::diff(una, m.end()) < 0 {
                break;
            }
            self.finish_front(Ok(0));
        }
    }

    /// The packets to send now, each passed to `emit` as its header, the range of its
    /// message's payload it carries and those bytes. Arms the ACK timer when something goes
    /// out.
    pub fn transmit(&mut self, now: Instant, mut emit: impl FnMut(&Header, Range<usize>, &[u8])) {
        let timeout = self.attrs.ack_timeout();
        let Some(front) = self.msgs.front() else {
            return;
        };
        if self.rnr_until.is_some() {
            return;
        }
        let mut any = false;
        match front.msg {
            Message::Send { .. } | Message::Write { .. } => {
                if self.solicit_due {
                    self.solicit_due = false;
                    if self.unacknowledged_sent() {
                        // Not progress: the ACK timer runs on.
                        let newest = psn::add(self.sent, psn::MASK);
                        if let Some(m) = self.msgs.iter().find(|m| psn::diff(newest, m.end()) < 0) {
                            let (mut h, range) = self.packet(m, newest);
                            h.ack_req = true;
                            self.resent += range.len() as u64;
                            emit(&h, range.clone(), m.data.get(range).unwrap_or(&[]));
                            self.asked = true;
                            self.solicit_at = None;
                        }
                    }
                }
                // The message holding `sent`, looked for from the back: the PSNs of `msgs`
                // run contiguously, so it is the newest that starts at or before `sent`, and
                // after a post that is the message just started (from the front, each send
                // walked every unacknowledged message, up to 16 for unsignaled streams).
                let mut at = self
                    .msgs
                    .iter()
                    .rposition(|m| psn::diff(self.sent, m.first) >= 0)
                    .unwrap_or(0);
                let window = i32::try_from(WINDOW).unwrap_or(i32::MAX);
                // The last packet this call sends: before `next_psn`, or the window's end.
                let last = if psn::diff(self.next_psn, self.una) > window {
                    psn::add(self.una, WINDOW - 1)
                } else {
                    psn::add(self.next_psn, psn::MASK)
                };
                while psn::diff(self.sent, self.next_psn) < 0
                    && psn::diff(self.sent, self.una) < window
                {
                    // Past the messages `sent` has passed: the PSNs of `msgs` run contiguously
                    // to `next_psn`, so one holds it.
                    while self
                        .msgs
                        .get(at)
                        .is_some_and(|m| psn::diff(self.sent, m.end()) >= 0)
                    {
                        at += 1;
                    }
                    let Some(m) = self.msgs.get(at) else { break };
                    let (mut h, range) = self.packet(m, self.sent);
                    if psn::diff(self.sent, self.fresh) < 0 {
                        self.resent += range.len() as u64;
                        // The last of a go-back asks for its ACK itself: packets are being
                        // recovered, and a copy that asks would only follow it.
                        h.ack_req |= self.sent == last;
                    }
                    emit(&h, range.clone(), m.data.get(range).unwrap_or(&[]));
                    self.sent = psn::add(self.sent, 1);
                    if psn::diff(self.sent, self.fresh) > 0 {
                        self.fresh = self.sent;
                    }
                    self.asked = h.ack_req;
                    any = true;
                }
                if any {
                    self.solicit_at = (!self.asked).then(|| now + self.solicit_delay());
                }
            }
            Message::Read { va, rkey, len } => {
                if self.request_due {
                    let mut h = Header::new(opcode::READ_REQUEST, self.dest_qp, self.una);
                    h.ack_req = true;
                    h.reth = Some(Reth {
                        va: va.wrapping_add(u64::from(self.read_done)),
                        rkey,
                        len: len - self.read_done,
                    });
                    emit(&h, 0..0, &[]);
                    self.request_due = false;
                    any = true;
                }
            }
            Message::Atomic {
                va,
                rkey,
                swap_add,
                compare,
            } => {
                if self.request_due {
                    let op = if compare.is_some() {
                        opcode::COMPARE_SWAP
                    } else {
                        opcode::FETCH_ADD
                    };
                    let mut h = Header::new(op, self.dest_qp, front.first);
                    h.ack_req = true;
                    h.atomic = Some(AtomicEth {
                        va,
                        rkey,
                        swap_add,
                        compare: compare.unwrap_or(0),
                    });
                    emit(&h, 0..0, &[]);
                    self.request_due = false;
                    any = true;
                }
            }
        }
        if any || self.deadline.is_none() {
            self.deadline = timeout.map(|t| now + t);
        }
    }

    /// The header of SEND/WRITE packet `at` of `m` and the range of its payload.
    fn packet(&self, m: &Outstanding, at: u32) -> (Header, Range<usize>) {
        let mtu = self.attrs.mtu;
        // psn::diff of two PSNs of one message is in 0..npsn.
        let k = psn::diff(at, m.first).unsigned_abs();
        let (write, len, imm) = match m.msg {
            Message::Write { len, imm, .. } => (true, len, imm),
            Message::Send { len, imm } => (false, len, imm),
            Message::Read { .. } | Message::Atomic { .. } => (false, 0, None),
        };
        let from = k * mtu;
        let to = (from + mtu).min(len);
        let (only, is_first, is_last) = (m.npsn == 1, k == 0, k + 1 == m.npsn);
        let op = match (only, is_first, is_last, imm.is_some()) {
            (true, _, _, false) => opcode::SEND_ONLY,
            (true, _, _, true) => opcode::SEND_ONLY_IMM,
            (false, true, _, _) => opcode::SEND_FIRST,
            (false, _, true, false) => opcode::SEND_LAST,
            (false, _, true, true) => opcode::SEND_LAST_IMM,
            _ => opcode::SEND_MIDDLE,
        };
        let op = if write { op + WRITE_AFTER_SEND } else { op };
        let mut h = Header::new(op, self.dest_qp, at);
        h.ack_req = (is_last && m.ack) || at % ACK_EVERY == ACK_EVERY - 1;
        if is_last {
            h.imm = imm;
        }
        if let (Message::Write { va, rkey, len, .. }, true) = (m.msg, is_first) {
            h.reth = Some(Reth { va, rkey, len });
        }
        (h, from as usize..to as usize)
    }

    /// When the requester next needs [`Self::on_timer`]: the ACK timeout, the end of an RNR
    /// wait, or the time to ask for the ACK of a quiet sender's newest packet.
    #[must_use]
    pub fn next_timer(&self) -> Option<Instant> {
        if self.msgs.is_empty() {
            return None;
        }
        match (self.rnr_until.or(self.deadline), self.solicit_at) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }

    /// How long the newest packet waits before the requester asks for its ACK.
    fn solicit_delay(&self) -> Duration {
        self.attrs
            .ack_timeout()
            .map_or(SOLICIT_AFTER, |t| (t / 4).min(SOLICIT_AFTER))
    }

    /// Go back to the oldest unacknowledged PSN: resend from there.
    fn go_back(&mut self) {
        self.sent = self.una;
        self.request_due = true;
        self.deadline = None;
    }

    /// Let time pass: an RNR wait that ended resends from the oldest unacknowledged PSN; an
    /// ACK timeout uses up a retry and resends, or fails the oldest message once none are
    /// left.
    pub fn on_timer(&mut self, now: Instant) {
        if self.msgs.is_empty() {
            return;
        }
        if self.solicit_at.is_some_and(|t| now >= t) {
            self.solicit_at = None;
            self.solicit_due = true;
        }
        if let Some(t) = self.rnr_until {
            if now >= t {
                self.rnr_until = None;
                self.go_back();
            }
            return;
        }
        if self.deadline.is_some_and(|t| now >= t) {
            if self.retries == 0 {
                self.fail(Nak::NoResponse);
                return;
            }
            self.retries -= 1;
            self.go_back();
        }
    }

    /// Take a response (ACK, NAK, READ response or atomic ACK) for this QP; what finished
    /// comes out of [`Self::pop_finished`]. A READ's data lands in `read_out` (the
    /// message's length). `Err` says why a response that does not belong to what is
    /// outstanding was dropped.
    pub fn on_response(
        &mut self,
        h: &Header,
        payload: &[u8],
        now: Instant,
        read_out: &mut [u8],
    ) -> Result<(), DropReason> {
        let timeout = self.attrs.ack_timeout();
        let Some(front) = self.msgs.front() else {
            return Err(DropReason::UnexpectedResponse);
        };
        let (front_msg, front_first) = (front.msg, front.first);
        let last = psn::add(self.next_psn, psn::MASK);
        let una = self.una;
        let within = |p: u32, hi: u32| psn::diff(p, una) >= 0 && psn::diff(p, hi) <= 0;
        let syndrome = h.aeth.map(|a| Syndrome::of(a.syndrome));
        // NAKs that end the message they name, whatever it is.
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
            // A NAK acknowledges every PSN before its own.
            self.acknowledge_to(h.psn);
            self.fail(nak);
            return Ok(());
        }
        if h.opcode == opcode::ACKNOWLEDGE {
            match syndrome {
                Some(Syndrome::SequenceError) => {
                    // The responder expects `h.psn`: everything before it arrived.
                    if !within(h.psn, self.next_psn) {
                        return Err(DropReason::UnexpectedResponse);
                    }
                    if front_msg.posted() {
                        let progress = psn::diff(h.psn, self.una) > 0;
                        self.una = h.psn;
                        self.acknowledge_to(h.psn);
                        if self.msgs.is_empty() {
                            return Ok(());
                        }
                        if progress {
                            // It acknowledges packets not acknowledged before (a NAK
                            // acknowledges every PSN before its own: "a nak implicitly
                            // acks all packets with psns before", rxe's `check_ack`):
                            // progress, as an ACK that moves `una` is, so the retries are
                            // restored (rxe resets them at every ACK). And it names a new
                            // gap, not the one the go-back under way is for (a responder
                            // NAKs a gap once, and again only after taking the PSN it
                            // named), so a go-back starts from it. rxe's completer does
                            // neither for a NAK inside the oldest WQE (`started_retry`
                            // holds until an ACK); neither did this: each new gap then
                            // waited for the ACK timer at a retry's cost, and a long
                            // WRITE meeting a gap in every go-back ran out of retries
                            // while moving on (`sim_tests`). A NAK at the PSN already
                            // named still starts nothing and costs nothing; a peer moving
                            // its NAKs on a PSN at a time gets a window resent per PSN it
                            // acknowledges, as one moving them a message of one packet at
                            // a time always could.
                            self.retries = self.attrs.retry_cnt;
                            self.nak_retry = false;
                        }
                        if psn::diff(self.sent, self.una) < 0 {
                            self.sent = self.una;
                        }
                    }
                    if self.nak_retry {
                        return Ok(());
                    }
                    if self.retries == 0 {
                        self.fail(Nak::NoResponse);
                        return Ok(());
                    }
                    self.retries -= 1;
                    self.nak_retry = true;
                    self.go_back();
                    return Ok(());
                }
                Some(Syndrome::Rnr(code)) => {
                    if !within(h.psn, last) {
                        return Err(DropReason::UnexpectedResponse);
                    }
                    if front_msg.posted() {
                        self.una = h.psn;
                        self.acknowledge_to(h.psn);
                    }
                    if self.rnr != 7 {
                        if self.rnr == 0 {
                            self.fail(Nak::RnrRetryExceeded);
                            return Ok(());
                        }
                        self.rnr -= 1;
                    }
                    self.rnr_until = Some(now + Duration::from_nanos(packet::rnr_delay_ns(code)));
                    self.deadline = None;
                    return Ok(());
                }
                Some(Syndrome::Ack) => {
                    if !front_msg.posted() || !within(h.psn, last) {
                        return Err(DropReason::UnexpectedResponse);
                    }
                    self.una = psn::add(h.psn, 1);
                    if psn::diff(self.sent, self.una) <= 0 {
                        // Everything sent is acknowledged: nothing to ask for.
                        self.sent = self.una;
                        self.clear_solicit();
                    }
                    self.retries = self.attrs.retry_cnt;
                    self.nak_retry = false;
                    self.rnr = self.attrs.rnr_retry;
                    self.acknowledge_to(self.una);
                    if !self.msgs.is_empty() {
                        self.deadline = timeout.map(|t| now + t);
                    }
                    return Ok(());
                }
                _ => return Err(DropReason::UnexpectedResponse),
            }
        }
        match (front_msg, h.opcode) {
            (Message::Atomic { .. }, opcode::ATOMIC_ACKNOWLEDGE) => {
                if h.psn != front_first || syndrome != Some(Syndrome::Ack) {
                    return Err(DropReason::UnexpectedResponse);
                }
                let orig = h.atomic_ack.unwrap_or(0);
                self.finish_front(Ok(orig));
                Ok(())
            }
            (Message::Read { len, .. }, op)
                if packet::is_response(op) && op <= opcode::READ_RESPONSE_ONLY =>
            {
                self.read_response(h, op, len, payload, now, read_out)
            }
            _ => Err(DropReason::UnexpectedResponse),
        }
    }

    /// A READ response packet for the READ outstanding (alone), of `len` bytes.
    fn read_response(
        &mut self,
        h: &Header,
        op: u8,
        len: u32,
        payload: &[u8],
        now: Instant,
        read_out: &mut [u8],
    ) -> Result<(), DropReason> {
        let mtu = self.attrs.mtu;
        let last = psn::add(self.next_psn, psn::MASK);
        if psn::diff(h.psn, self.una) < 0 || psn::diff(h.psn, last) > 0 {
            return Err(DropReason::UnexpectedResponse);
        }
        let syndrome = h.aeth.map(|a| Syndrome::of(a.syndrome));
        if h.psn != self.una {
            // A response went missing: ask again from it, once per gap.
            if self.gap_retried != Some(self.una) {
                self.gap_retried = Some(self.una);
                if self.retries == 0 {
                    self.fail(Nak::NoResponse);
                    return Ok(());
                }
                self.retries -= 1;
                self.request_due = true;
            }
            return Err(DropReason::OutOfSequence);
        }
        let rest = len - self.read_done;
        let n = u32::try_from(payload.len()).map_err(|_| DropReason::BadLength)?;
        let ends = matches!(op, opcode::READ_RESPONSE_LAST | opcode::READ_RESPONSE_ONLY);
        let starts = matches!(op, opcode::READ_RESPONSE_FIRST | opcode::READ_RESPONSE_ONLY);
        // A response restarts with FIRST/ONLY at the message's first PSN; after a retry it
        // may go on with MIDDLE/LAST or start over with FIRST/ONLY.
        let order_ok = starts || self.read_done != 0;
        let len_ok = if ends {
            n == rest && n <= mtu
        } else {
            n == mtu && rest > mtu
        };
        let aeth_ok = op == opcode::READ_RESPONSE_MIDDLE || syndrome == Some(Syndrome::Ack);
        if !(order_ok && len_ok && aeth_ok) || read_out.len() < len as usize {
            return Err(DropReason::UnexpectedResponse);
        }
        let at = self.read_done as usize;
        read_out[at..at + n as usize].copy_from_slice(payload);
        self.read_done += n;
        self.una = psn::add(self.una, 1);
        self.retries = self.attrs.retry_cnt;
        self.nak_retry = false;
        if ends {
            self.finish_front(Ok(u64::from(len)));
            return Ok(());
        }
        self.deadline = self.attrs.ack_timeout().map(|t| now + t);
        Ok(())
    }
}

#[cfg(test)]
mod tests;
