//! The [`Transport`] of a QP connected over RoCE: posts and runs messages through its
//! requester, sends their packets and takes their responses and timers.

use super::mailbox::Response;
use super::poller::Conn;
use super::{Inner, COPY_BEFORE_CLOCK};
use crate::mem::{KeyCache, Span};
use crate::softnic::roce::packet::{self, Route};
use crate::softnic::roce::requester::{Message, Requester};
use crate::softnic::transport::{Ask, AtomicOp, Nak, Transport};
use crate::wqe::RemoteAddr;
use crate::{QpState, Result};
use std::any::Any;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// A QP's requester and the datagrams of its last transmission, under one lock: every
/// transmission runs with the requester held, and a second lock for the buffers alone cost
/// two atomic operations on each of the several transmits a post or a settle makes.
pub(super) struct Sending {
    req: Requester,
    /// Datagrams laid end to end (kept for their capacity)...
    bytes: Vec<u8>,
    /// ...and where each one starts and ends.
    frames: Vec<(usize, usize)>,
}

/// The lock of a [`RoceTransport`]'s requester; its release publishes what
/// [`RoceTransport::nothing_new`] and [`Transport::next_timer`] read without it.
pub(super) struct Locked<'a> {
    t: &'a RoceTransport,
    s: std::sync::MutexGuard<'a, Sending>,
}

impl std::ops::Deref for Locked<'_> {
    type Target = Sending;
    fn deref(&self) -> &Sending {
        &self.s
    }
}

impl std::ops::DerefMut for Locked<'_> {
    fn deref_mut(&mut self) -> &mut Sending {
        &mut self.s
    }
}

impl Drop for Locked<'_> {
    fn drop(&mut self) {
        let req = &self.s.req;
        let ns = req.next_timer().map_or(0, |t| {
            let ns = t.saturating_duration_since(self.t.inner.epoch).as_nanos();
            u64::try_from(ns).unwrap_or(u64::MAX).max(1)
        });
        self.t.timer_ns.store(ns, Ordering::Release);
        self.t.finished.store(req.finished() > 0, Ordering::Release);
    }
}

/// How a QP connected over RoCE reaches its peer. WRITEs and SENDs are posted: each goes
/// out as soon as the requester's window has room (see `requester`), and the executor takes
/// their outcomes in order ([`Transport::settle`]) as their ACKs arrive. A READ or an
/// atomic runs alone: its PU sends it and waits (polling the socket, then sleeping) for the
/// answer.
pub(super) struct RoceTransport {
    conn: Arc<Conn>,
    inner: Arc<Inner>,
    sending: Mutex<Sending>,
    /// What an idle visit needs to know without the lock, as of its last release
    /// ([`Locked`]): the requester's next timer, in nanoseconds since the endpoint's epoch
    /// (0: none), and whether outcomes wait to be taken.
    timer_ns: AtomicU64,
    finished: AtomicBool,
    /// READs and atomics may go out: this side's `max_rd_atomic` and the peer's
    /// `max_dest_rd_atomic` are both at least 1 (one is ever outstanding: see `requester`).
    reads_allowed: bool,
}

impl RoceTransport {
    /// The transport of `conn`, sending through `inner`'s socket with `req`; READs and
    /// atomics go out only if `reads_allowed`.
    pub(super) fn new(
        conn: Arc<Conn>,
        inner: Arc<Inner>,
        req: Requester,
        reads_allowed: bool,
    ) -> RoceTransport {
        RoceTransport {
            conn,
            inner,
            sending: Mutex::new(Sending {
                req,
                bytes: Vec::new(),
                frames: Vec::new(),
            }),
            timer_ns: AtomicU64::new(0),
            finished: AtomicBool::new(false),
            reads_allowed,
        }
    }

    fn lock(&self) -> Locked<'_> {
        Locked {
            t: self,
            s: self.sending.lock().unwrap_or_else(|e| e.into_inner()),
        }
    }

    /// The requester's next timer as published at the last release of the lock.
    fn published_timer(&self) -> Option<Instant> {
        match self.timer_ns.load(Ordering::Acquire) {
            0 => None,
            ns => Some(self.inner.epoch + Duration::from_nanos(ns)),
        }
    }

    /// True if a visit that does not wait has nothing to do: nothing has arrived (see
    /// [`Self::nothing_arrived`]) and no timer has fallen due. Reads the clock only if a
    /// timer is set.
    fn nothing_new(&self) -> bool {
        self.nothing_arrived() && !self.timer_due(Instant::now)
    }

    /// True if no outcome waits and no response has come, whatever the timers: what a
    /// visit asks between WQEs ([`Ask::Arrived`]), without reading the clock. (The
    /// requester changes only under the lock, whose release publishes its state, and
    /// through the mailbox.)
    fn nothing_arrived(&self) -> bool {
        !self.finished.load(Ordering::Acquire) && self.conn.mailbox.is_empty()
    }

    /// True if the published timer has fallen due at the time `now` gives (read only if a
    /// timer is set).
    fn timer_due(&self, now: impl FnOnce() -> Instant) -> bool {
        self.published_timer().is_some_and(|t| t <= now())
    }

    /// True if [`Self::take_arrived`] has something to do at the time `now` gives (read only
    /// if a timer is set): a response waits or a timer is due. (With neither, its transmit
    /// has nothing either: packets a full window held back wait for ACKs, and a go-back or
    /// a solicitation is sent where it is made.)
    fn arrivals_due(&self, now: impl FnOnce() -> Instant) -> bool {
        !self.conn.mailbox.is_empty() || self.timer_due(now)
    }

    /// True if the QP or the endpoint is going away: nothing will answer.
    fn gone(&self) -> bool {
        let t = &self.conn.local.target;
        t.destroyed.load(Ordering::Acquire)
            || t.state() == QpState::Error
            || self.inner.shutdown.load(Ordering::Acquire)
            || t.pus.shutdown.load(Ordering::Acquire)
    }

    /// Send the packets the requester has due at `now` (with the replies its PU holds).
    fn transmit(&self, s: &mut Sending, now: Instant) {
        let route = Route {
            src: self.inner.local,
            dst: self.conn.remote,
        };
        let Sending { req, bytes, frames } = s;
        bytes.clear();
        frames.clear();
        let resent = req.resent_bytes();
        req.transmit(now, |h, _, payload| {
            let start = bytes.len();
            packet::encode(bytes, &route, h, payload);
            frames.push((start, bytes.len()));
        });
        // A retransmission moves its bytes again: the QP's byte counter, which the manager's
        // auditor holds to `rate_limit_kbps`, counts them too (a peer's NAKs could
        // otherwise make it send again and again, charged to nobody).
        let again = req.resent_bytes() - resent;
        if again != 0 {
            crate::softnic::qp::bump(&self.conn.local.target.counters.bytes, again);
        }
        if !frames.is_empty() {
            self.conn
                .poller
                .send_with_replies(&self.inner, self.conn.remote, bytes, frames);
        }
    }

    /// Take a response from the mailbox, at `now`.
    fn take(&self, s: &mut Sending, r: &Response, read_out: &mut [u8], now: Instant) {
        if let Err(why) = s.req.on_response(&r.header, &r.payload, now, read_out) {
            self.inner.drops.count(why);
        }
    }

    /// Take the responses waiting in the mailbox and let time pass to `now`, without
    /// waiting; then send what that made due. (A call reads the clock once or twice, not
    /// at each step: a read costs 30-100 ns on our VMs, and a post used to make six.)
    fn take_arrived(&self, s: &mut Sending, read_out: &mut [u8], now: Instant) {
        while let Some(r) = self.conn.mailbox.take() {
            self.take(s, &r, read_out, now);
        }
        s.req.on_timer(now);
        self.transmit(s, now);
    }

    /// Send what is due, then until `done(req)`: wait for a response (polling the socket,
    /// then sleeping until the receive thread wakes it) or the requester's next timer, take
    /// it and send what that made due. If the QP or the endpoint goes away meanwhile, the
    /// oldest message fails with "retry exceeded" (nothing will answer).
    fn drive(
        &self,
        s: &mut Sending,
        read_out: &mut [u8],
        now: Instant,
        done: impl Fn(&Requester) -> bool,
    ) {
        let mut now = now;
        loop {
            self.transmit(s, now);
            if done(&s.req) {
                return;
            }
            if s.req.solicit() {
                // What it waits for did not ask for an ACK: ask now (sent by the transmit).
                continue;
            }
            // A host-driven app's thread polls until the answer or the requester's next timer
            // (a retransmission), never sleeping: it is in a call to the softnic already,
            // and a sleep would hand every answer over from the receive thread to it.
            let spin = if self.conn.poller.host {
                Duration::MAX
            } else {
                self.inner.spin
            };
            let got = self.conn.mailbox.wait(
                spin,
                s.req.next_timer(),
                || self.gone(),
                || {
                    self.conn.poller.poll_with(&self.inner);
                    if self.conn.poller.host {
                        // A host-driven softnic's app thread is the only thread of its side
                        // on the path (as a raw UDP ping-pong's): it spins as they do.
                        std::hint::spin_loop();
                    } else {
                        // On a machine whose cores the PUs, receive threads and hosts of
                        // both ends outnumber, a pure spin holds the core the answer needs.
                        std::thread::yield_now();
                    }
                },
                || self.conn.poller.leave(&self.inner),
            );
            now = Instant::now();
            match got {
                Some(r) => self.take(s, &r, read_out, now),
                None if self.gone() => s.req.fail(Nak::NoResponse),
                None => s.req.on_timer(now),
            }
        }
    }

    /// Post a SEND or WRITE whose payload `fill` puts into an empty buffer: if the window
    /// has room for it, start it (its last packet asking for an ACK with `ack`), send what
    /// is due, and take what has arrived. [`Nak::WindowFull`] if it has not: the peer
    /// decides when its ACKs make room, so the PU does not wait for them (the executor
    /// runs the WQE again on a later visit).
    fn post(&self, msg: Message, ack: bool, fill: impl FnOnce(&mut Vec<u8>)) -> Result<(), Nak> {
        let mut s = self.lock();
        let mut now = Instant::now();
        if self.arrivals_due(|| now) {
            self.take_arrived(&mut s, &mut [], now);
        }
        if !s.req.has_room(&msg) {
            // Ask for the ACKs that would make room, if they were not asked for yet.
            if s.req.solicit() {
                self.transmit(&mut s, now);
            }
            return Err(Nak::WindowFull);
        }
        let mut data = s.req.buffer();
        fill(&mut data);
        if data.len() > COPY_BEFORE_CLOCK {
            // The timers start when the packets go out, after a large message's copy.
            now = Instant::now();
        }
        s.req.start(msg, data, ack);
        self.transmit(&mut s, now);
        // The ACKs of what went out before, if they are here: the executor settles them next.
        // Not redundant with the PU's idle polls: a PU posting a stream polls only every 64th
        // busy round, and without this the 64 KiB stream fell from 0.76 to 0.57 of raw UDP.
        self.conn.poller.poll_with(&self.inner);
        // Only responses can be new: a timer due at `now` was fired above.
        if !self.conn.mailbox.is_empty() {
            self.take_arrived(&mut s, &mut [], now);
        }
        Ok(())
    }

    /// Run a READ or an atomic alone: once every posted message has finished (their
    /// outcomes wait for the executor), send it and wait for its answer.
    fn run(&self, msg: Message, read_out: &mut [u8]) -> Result<u64, Nak> {
        let mut s = self.lock();
        self.drive(&mut s, read_out, Instant::now(), |r| r.outstanding() == 0);
        let before = s.req.finished();
        s.req.start(msg, Vec::new(), true);
        self.drive(&mut s, read_out, Instant::now(), |r| r.outstanding() == 0);
        if s.req.finished() > before {
            s.req.pop_last_finished().unwrap_or(Err(Nak::NoResponse))
        } else {
            // An earlier message failed: nothing more went out.
            Err(Nak::NoResponse)
        }
    }

    fn len32(n: usize) -> Result<u32, Nak> {
        u32::try_from(n).map_err(|_| Nak::RemoteInvalid)
    }
}

impl Transport for RoceTransport {
    fn write(
        &self,
        _keys: &mut KeyCache,
        remote: RemoteAddr,
        data: &[u8],
        imm: Option<u32>,
        ack: bool,
    ) -> Result<(), Nak> {
        let msg = Message::Write {
            va: remote.addr.0,
            rkey: remote.rkey.0,
            len: Self::len32(data.len())?,
            imm,
        };
        self.post(msg, ack, |b| b.extend_from_slice(data))
    }

    fn write_from(
        &self,
        _keys: &mut KeyCache,
        remote: RemoteAddr,
        src: &Span<'_>,
        imm: Option<u32>,
        ack: bool,
    ) -> Result<(), Nak> {
        let msg = Message::Write {
            va: remote.addr.0,
            rkey: remote.rkey.0,
            len: Self::len32(src.len)?,
            imm,
        };
        self.post(msg, ack, |b| {
            b.resize(src.len, 0);
            src.read(b);
        })
    }

    fn read_into(
        &self,
        keys: &mut KeyCache,
        remote: RemoteAddr,
        dst: &Span<'_>,
    ) -> Result<(), Nak> {
        let mut data = vec![0u8; dst.len];
        self.read(keys, remote, &mut data)?;
        dst.write(&data);
        Ok(())
    }

    fn send(
        &self,
        _keys: &mut KeyCache,
        data: &[u8],
        imm: Option<u32>,
        ack: bool,
    ) -> Result<(), Nak> {
        let msg = Message::Send {
            len: Self::len32(data.len())?,
            imm,
        };
        self.post(msg, ack, |b| b.extend_from_slice(data))
    }

    fn read(&self, _keys: &mut KeyCache, remote: RemoteAddr, out: &mut [u8]) -> Result<(), Nak> {
        if !self.reads_allowed {
            return Err(Nak::RemoteInvalid);
        }
        let msg = Message::Read {
            va: remote.addr.0,
            rkey: remote.rkey.0,
            len: Self::len32(out.len())?,
        };
        self.run(msg, out).map(|_| ())
    }

    fn atomic(&self, _keys: &mut KeyCache, remote: RemoteAddr, op: AtomicOp) -> Result<u64, Nak> {
        if !self.reads_allowed {
            return Err(Nak::RemoteInvalid);
        }
        let (swap_add, compare) = match op {
            AtomicOp::CompareSwap { compare, swap } => (swap, Some(compare)),
            AtomicOp::FetchAdd { add } => (add, None),
            // RC has no masked atomics on the wire (ConnectX's are a vendor extension).
            AtomicOp::MaskedCompareSwap { .. } | AtomicOp::MaskedFetchAdd { .. } => {
                return Err(Nak::RemoteInvalid)
            }
        };
        if remote.addr.0 % 8 != 0 {
            return Err(Nak::RemoteInvalid);
        }
        self.run(
            Message::Atomic {
                va: remote.addr.0,
                rkey: remote.rkey.0,
                swap_add,
                compare,
            },
            &mut [],
        )
    }

    fn windowed(&self) -> bool {
        true
    }

    fn settle(&self, ask: Ask) -> Option<Result<(), Nak>> {
        // A PU at rest visits its windowed queues at every turn, and a queue asks before
        // each WQE it runs behind posted messages: most find nothing new, and the lock,
        // clock reads and transmit they made were a third of a RoCE client's poll.
        let nothing = match ask {
            Ask::Now => self.nothing_new(),
            Ask::Arrived => self.nothing_arrived(),
        };
        if nothing {
            return None;
        }
        let mut s = self.lock();
        self.take_arrived(&mut s, &mut [], Instant::now());
        s.req.pop_finished().map(|o| o.map(|_| ()))
    }

    fn abandon(&self) {
        self.lock().req.clear();
    }

    fn detach(&self) {
        // Its own entry only: the endpoint's map is keyed by QP number, and a number may
        // one day name another QP's connection.
        let qpn = self.conn.local.target.qpn.0;
        let mut conns = self.inner.conns.write().unwrap_or_else(|e| e.into_inner());
        if conns.get(&qpn).is_some_and(|c| Arc::ptr_eq(c, &self.conn)) {
            conns.remove(&qpn);
        }
    }

    fn next_timer(&self) -> Option<Instant> {
        self.published_timer()
    }

    fn into_any(self: Arc<Self>) -> Arc<dyn Any + Send + Sync> {
        self
    }
}
