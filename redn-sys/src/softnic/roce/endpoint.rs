//! A softnic's RoCEv2 endpoint: one UDP socket, a receive thread that checks every datagram
//! and hands requests to the responder of the QP they name and responses to its requester,
//! and the [`Transport`] a connected QP's PU sends through.

use super::exchange::QpRecord;
use super::io::{DatagramIo, Faults, LossyIo, RecvBatch, UdpIo};
use super::packet::{self, opcode, DropCounters, DropReason, Header, Route, Syndrome};
use super::requester::{Message, Requester, RequesterAttrs};
use super::responder::{Memory, Responder};
use crate::mem::{KeyCache, Span};
use crate::softnic::idle::{Found, IdleWork};
use crate::softnic::in_process::InProcess;
use crate::softnic::qp::QpShared;
use crate::softnic::shared::{ObjectMap, Shared};
use crate::softnic::transport::{Ask, AtomicOp, Nak, Transport};
use crate::softnic::SoftNic;
use crate::types::{Access, Qpn, Rkey, VirtAddr};
use crate::wqe::RemoteAddr;
use crate::{Error, QpState, Result};
use std::any::Any;
use std::collections::{HashMap, VecDeque};
use std::net::{Ipv4Addr, SocketAddrV4};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock, RwLock};
use std::thread::{JoinHandle, Thread};
use std::time::{Duration, Instant};

/// The UDP port RoCEv2 uses (IANA "roce").
pub const ROCE_PORT: u16 = 4791;

/// Settings of one endpoint.
#[derive(Clone, Debug)]
#[non_exhaustive]
pub struct RoceConfig {
    /// Address and UDP port to bind: a specific IPv4 address; port [`ROCE_PORT`] by
    /// default, another so that several softnics share a host (0: any free port).
    pub bind: SocketAddrV4,
    /// How long a requester waiting for an answer polls the socket before it sleeps and
    /// leaves the socket to the receive thread: a busy connection pays no wake-up per
    /// packet, an idle one no CPU.
    pub spin: Duration,
    /// Faults to inject on what this endpoint sends (tests).
    pub faults: Option<Faults>,
}

impl RoceConfig {
    /// Bind `ip` on port 4791, spin 50 µs, no faults.
    #[must_use]
    pub fn new(ip: Ipv4Addr) -> RoceConfig {
        RoceConfig {
            bind: SocketAddrV4::new(ip, ROCE_PORT),
            spin: Duration::from_micros(50),
            faults: None,
        }
    }
}

/// Packets moved by an endpoint.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RoceCounters {
    /// Datagrams sent.
    pub sent: u64,
    /// Datagrams received.
    pub received: u64,
    /// Of those, the ones the receive thread took off the socket (the others a PU did, while
    /// it was awake: see `docs/rocev2.md`, "I/O").
    pub by_receive_thread: u64,
    /// Datagrams dropped (any reason; see [`RoceEndpoint::drops`]).
    pub dropped: u64,
}

/// How long a host-driven app's poll of the socket keeps its endpoint's receive thread off
/// it: the receive thread looks once a lease whether the app polled since its last look, and
/// serves the socket itself once a whole lease passed without a poll (so one to two leases
/// after the app's last). Short against the ACK timeout (4.096 µs · 2^14 by default, 67
/// ms) because the ACKs the app holds for its next request go when this runs out; long
/// against a poll loop's gaps, so that the receive thread does not wake often (1,000 times a
/// second while the app polls).
const HOST_LEASE: Duration = Duration::from_millis(1);

/// Bytes of payload a post copies before it sends with the clock read before the copy
/// (well under a microsecond of copying, against ACK timers of milliseconds); a larger
/// message's timers start from a second reading, taken after its copy.
const COPY_BEFORE_CLOCK: usize = 4096;

/// Plain ACKs a host-driven PU holds for its next request at most (to QPs that alternate,
/// which do not replace each other).
const HELD_ACKS: usize = 16;

/// Responses one QP's mailbox holds at most: a requester's window of READ responses and
/// then some.
const MAILBOX_CAP: usize = 1024;

/// A response waiting for the requester that owns it.
struct Response {
    header: Header,
    payload: Vec<u8>,
}

/// Where the receive thread leaves responses for a requester, and how it wakes it.
#[derive(Default)]
struct Mailbox {
    queue: Mutex<VecDeque<Response>>,
    pending: AtomicU64,
    waiter: Mutex<Option<Thread>>,
}

impl Mailbox {
    /// Leave a response; false (and nothing left) if `MAILBOX_CAP` are already waiting,
    /// so that a peer answering what was never asked cannot grow memory without bound.
    fn push(&self, r: Response) -> bool {
        {
            let mut q = self.queue.lock().unwrap_or_else(|e| e.into_inner());
            if q.len() >= MAILBOX_CAP {
                return false;
            }
            q.push_back(r);
        }
        self.pending.fetch_add(1, Ordering::Release);
        if let Some(t) = self
            .waiter
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .as_ref()
        {
            t.unpark();
        }
        true
    }

    fn is_empty(&self) -> bool {
        self.pending.load(Ordering::Acquire) == 0
    }

    fn take(&self) -> Option<Response> {
        if self.is_empty() {
            return None;
        }
        let r = self
            .queue
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .pop_front();
        if r.is_some() {
            self.pending.fetch_sub(1, Ordering::Release);
        }
        r
    }

    /// The next response: for `spin`, `poll` the socket and pause (the waiting thread takes
    /// what arrives itself, with no hand-over from the receive thread), then sleep until
    /// `until` while the receive thread delivers.
    fn wait(
        &self,
        spin: Duration,
        until: Option<Instant>,
        give_up: impl Fn() -> bool,
        poll: impl FnMut(),
        before_sleep: impl Fn(),
    ) -> Option<Response> {
        let r = self.wait_registered(spin, until, give_up, poll, before_sleep);
        // Registered only while it waits: the waiter is the PU's own thread, and a response
        // pushed after the wait would otherwise leave its park token set, so that the PU's
        // next park in its idle loop returned at once and it polled through another spell
        // of idling, taking a core from the threads with work.
        let mut w = self.waiter.lock().unwrap_or_else(|e| e.into_inner());
        if w.is_some() {
            *w = None;
        }
        r
    }

    /// [`Self::wait`], which may leave this thread registered as the waiter.
    fn wait_registered(
        &self,
        spin: Duration,
        until: Option<Instant>,
        give_up: impl Fn() -> bool,
        mut poll: impl FnMut(),
        before_sleep: impl Fn(),
    ) -> Option<Response> {
        let start = Instant::now();
        loop {
            if let Some(r) = self.take() {
                return Some(r);
            }
            let now = Instant::now();
            if until.is_some_and(|u| now >= u) || give_up() {
                return None;
            }
            if now - start < spin {
                // `poll` also pauses, as its caller's threads want (`RoceTransport::run`).
                poll();
                continue;
            }
            *self.waiter.lock().unwrap_or_else(|e| e.into_inner()) = Some(std::thread::current());
            before_sleep();
            if let Some(r) = self.take() {
                return Some(r);
            }
            // Wake at least every 10 ms to notice a QP put in error or a shutdown.
            let nap = until
                .map_or(Duration::from_millis(10), |u| {
                    u.saturating_duration_since(now)
                })
                .min(Duration::from_millis(10));
            std::thread::park_timeout(nap);
        }
    }
}

/// One connected QP.
struct Conn {
    remote: SocketAddrV4,
    local: InProcess,
    responder: Mutex<(Responder, KeyCache)>,
    mailbox: Mailbox,
    /// How the QP's PU takes packets off the socket while it waits for an answer.
    poller: Arc<PuPoller>,
}

/// One PU's turn at the endpoint's socket. While the PU is awake it takes the packets off
/// the socket itself, in its idle rounds ([`IdleWork`]) and while it waits for an answer, so
/// that a request's placement, its receive completion, the WAIT that counts it and the WQE
/// that WAIT releases all run on the PU's thread with no hand-off; meanwhile the endpoint's
/// receive thread stands down rather than poll the same socket (two pollers of one socket
/// on a small machine take turns on the cores and each finds half the packets). The PU gives
/// the socket back before it sleeps.
struct PuPoller {
    /// Its endpoint. A strong reference (a weak one's upgrade was two atomic operations on
    /// every poll of an idle loop): the cycle through `Inner::pu_pollers` and the
    /// connections is broken when the endpoint is dropped, which empties both.
    inner: Arc<Inner>,
    /// The softnic is host-driven: the PU is the app's thread, present while it calls in
    /// (`Inner::host_polled`), and the plain ACKs it owes ride on its next request.
    host: bool,
    /// This PU counts in `Inner::pollers`.
    present: AtomicBool,
    /// Receive buffers and the replies of one batch (made at first use).
    bufs: Mutex<Option<Box<(RecvBatch, Outbox)>>>,
}

impl PuPoller {
    /// Take what is on the socket now, as the PU present at it; how many datagrams.
    ///
    /// The replies to what arrives (ACKs, READ and atomic responses, NAKs) are held for the
    /// PU's next send through [`Self::send_with_replies`] until its next poll or until it
    /// sleeps, that is for one round of its queues: the PU first runs what the arrivals
    /// released (the WAIT a WRITE_IMM's completion satisfies and the WRITE behind it),
    /// whose packets then carry the replies in the same system call. No longer: a ConnectX
    /// answers at once, so a READ response or an ACK that nothing in the round carried
    /// goes out at the next poll, not after a timer (a longer hold, up to 20 µs, made a
    /// host-answered ping-pong cheaper on the busy VM and every reply that no send follows,
    /// a one-sided READ's, that much later). The answer is
    /// not queued behind the ACK's system call, and in a run of requests and answers each
    /// side pays one `sendmmsg` a turn, not two (on a busy two-core machine, where the
    /// threads of a round trip take turns on one core, that system call was on the path).
    ///
    /// Returns how many datagrams it took and the most their handling did.
    fn poll_with(&self, inner: &Inner) -> (usize, Found) {
        if self.host {
            // A plain store, not a clock read (~40 ns of a ~500 ns poll): the receive thread
            // asks once a lease whether any poll came.
            inner.host_polled.store(true, Ordering::Relaxed);
        } else if !self.present.swap(true, Ordering::AcqRel) {
            // A swap, not a load and a store: should another thread ever run this PU's WQEs
            // (and so poll as it), the count must still go up once per presence.
            inner.pollers.fetch_add(1, Ordering::AcqRel);
        }
        let mut g = self.bufs.lock().unwrap_or_else(|e| e.into_inner());
        let b = g.get_or_insert_with(|| Box::new((RecvBatch::default(), Outbox::default())));
        // What the last poll's arrivals were owed and no send of the round since carried;
        // a host's plain ACKs wait for its next request (at most `HELD_ACKS` of them, and
        // at most the host's lease: then the receive thread sends them).
        if !(self.host && b.1.only_acks && b.1.frames.len() < HELD_ACKS) {
            b.1.flush(inner);
        }
        receive_batch(inner, &mut b.0, &mut b.1, None)
    }

    /// Send `frames` (ranges of `bytes`, to `to`) and the replies held since the last poll.
    fn send_with_replies(
        &self,
        inner: &Inner,
        to: SocketAddrV4,
        bytes: &[u8],
        frames: &[(usize, usize)],
    ) {
        let mut g = self.bufs.lock().unwrap_or_else(|e| e.into_inner());
        if let ([(s, e)], true) = (frames, g.as_deref().map_or(true, |b| b.1.frames.is_empty())) {
            // One packet and no replies held (a request or an answer): no batch to build.
            inner.send(&[(to, &bytes[*s..*e])]);
            return;
        }
        let mut batch: Vec<(SocketAddrV4, &[u8])> =
            frames.iter().map(|&(s, e)| (to, &bytes[s..e])).collect();
        if let Some(b) = g.as_deref_mut() {
            let held = &b.1;
            batch.extend(held.frames.iter().map(|&(a, s, e)| (a, &held.bytes[s..e])));
        }
        inner.send(&batch);
        drop(batch);
        if let Some(b) = g.as_deref_mut() {
            b.1.clear();
        }
    }

    /// Send the replies held since the last poll.
    fn flush(&self, inner: &Inner) {
        if let Some(b) = self
            .bufs
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .as_deref_mut()
        {
            b.1.flush(inner);
        }
    }

    /// Send what is held and stop counting as present: the last PU to leave wakes the
    /// receive thread.
    fn leave(&self, inner: &Inner) {
        self.flush(inner);
        if self.host {
            // The host is about to sleep in a wait: the socket is the receive thread's now.
            inner.host_polled.store(false, Ordering::Relaxed);
            if let Some(t) = inner.rx_thread.get() {
                t.unpark();
            }
        } else if self.present.swap(false, Ordering::AcqRel)
            && inner.pollers.fetch_sub(1, Ordering::AcqRel) == 1
        {
            if let Some(t) = inner.rx_thread.get() {
                t.unpark();
            }
        }
    }
}

impl IdleWork for PuPoller {
    fn poll(&self) -> Found {
        if self.inner.shutdown.load(Ordering::Acquire) {
            return Found::Nothing;
        }
        self.poll_with(&self.inner).1
    }

    fn parking(&self) {
        self.leave(&self.inner);
    }
}

/// What the receive thread and the transports share.
struct Inner {
    io: Box<dyn DatagramIo>,
    local: SocketAddrV4,
    nic: Arc<Shared>,
    conns: RwLock<ObjectMap<Arc<Conn>>>,
    drops: DropCounters,
    sent: AtomicU64,
    received: AtomicU64,
    by_receive_thread: AtomicU64,
    spin: Duration,
    shutdown: AtomicBool,
    /// PUs taking packets off the socket now ([`PuPoller`]); the receive thread serves the
    /// socket only while there are none.
    pollers: AtomicUsize,
    /// The receive thread, for the last PU that leaves the socket to wake.
    rx_thread: OnceLock<Thread>,
    /// Per PU with a connected QP, its turn at the socket (registered as its idle work).
    pu_pollers: Mutex<HashMap<usize, Arc<PuPoller>>>,
    /// On a host-driven softnic, the app's thread polled the socket since the receive
    /// thread last looked (false once it has left it): the receive thread stands down for a
    /// [`HOST_LEASE`] each time it finds it set, and clears it.
    host_polled: AtomicBool,
    /// Origin of the published timers ([`RoceTransport::published_timer`]).
    epoch: Instant,
}

impl Inner {
    /// Send the replies that host-driven PUs hold for their next request (their app has
    /// stopped calling in).
    fn flush_host_replies(&self) {
        let pollers: Vec<Arc<PuPoller>> = self
            .pu_pollers
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .values()
            .filter(|p| p.host)
            .cloned()
            .collect();
        for p in pollers {
            p.flush(self);
        }
    }

    fn send(&self, batch: &[(SocketAddrV4, &[u8])]) {
        self.sent.fetch_add(batch.len() as u64, Ordering::Relaxed);
        // A failed send is a lost packet: the requester's timer recovers it.
        let _ = self.io.send(batch);
    }
}

/// A softnic's RoCEv2 endpoint. Dropping it stops its receive thread; QPs connected through
/// it then get no answers (their requests end in "retry exceeded").
pub struct RoceEndpoint {
    inner: Arc<Inner>,
    rx: Option<JoinHandle<()>>,
}

impl std::fmt::Debug for RoceEndpoint {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RoceEndpoint")
            .field("local", &self.inner.local)
            .finish_non_exhaustive()
    }
}

impl RoceEndpoint {
    /// Bind `cfg.bind` for `nic` and start the receive thread.
    ///
    /// # Errors
    /// [`Error::Roce`] if the socket cannot be bound or configured.
    pub fn start(nic: &SoftNic, cfg: &RoceConfig) -> Result<RoceEndpoint> {
        let udp = UdpIo::bind(cfg.bind).map_err(|source| Error::Roce {
            what: "bind the RoCE UDP socket",
            source,
        })?;
        let io: Box<dyn DatagramIo> = match cfg.faults {
            Some(f) => Box::new(LossyIo::new(udp, f)),
            None => Box::new(udp),
        };
        Ok(Self::with_io(nic, io, cfg.spin))
    }

    /// An endpoint on any [`DatagramIo`] (tests and fuzzing feed their own datagrams).
    pub fn with_io(nic: &SoftNic, io: Box<dyn DatagramIo>, spin: Duration) -> RoceEndpoint {
        let inner = Arc::new(Inner {
            local: io.local_addr(),
            io,
            nic: Arc::clone(&nic.shared),
            conns: RwLock::new(ObjectMap::default()),
            drops: DropCounters::default(),
            sent: AtomicU64::new(0),
            received: AtomicU64::new(0),
            by_receive_thread: AtomicU64::new(0),
            spin,
            shutdown: AtomicBool::new(false),
            pollers: AtomicUsize::new(0),
            rx_thread: OnceLock::new(),
            pu_pollers: Mutex::new(HashMap::new()),
            host_polled: AtomicBool::new(false),
            epoch: Instant::now(),
        });
        let rx_inner = Arc::clone(&inner);
        let rx = std::thread::Builder::new()
            .name(format!("{}-roce-rx", nic.shared.config.name))
            .spawn(move || receive_loop(&rx_inner))
            .ok();
        RoceEndpoint { inner, rx }
    }

    /// The address and port this endpoint is bound to.
    #[must_use]
    pub fn local_addr(&self) -> SocketAddrV4 {
        self.inner.local
    }

    /// Datagrams dropped, per reason.
    #[must_use]
    pub fn drops(&self) -> &DropCounters {
        &self.inner.drops
    }

    /// Packets moved so far.
    #[must_use]
    pub fn counters(&self) -> RoceCounters {
        RoceCounters {
            sent: self.inner.sent.load(Ordering::Relaxed),
            received: self.inner.received.load(Ordering::Relaxed),
            by_receive_thread: self.inner.by_receive_thread.load(Ordering::Relaxed),
            dropped: self.inner.drops.total(),
        }
    }

    /// The record a peer needs to connect to local QP `qpn` (start PSN `psn`), with this
    /// endpoint's address and default attributes; add regions before sending it.
    #[must_use]
    pub fn record(&self, qpn: Qpn, psn: u32) -> QpRecord {
        QpRecord::new(qpn.0, psn, self.inner.local)
    }

    /// Connect local QP `local.qpn` (in INIT, not yet connected) to the remote QP `remote`
    /// describes: requests go out from `local.psn`, the peer's are expected from
    /// `remote.psn`, at the smaller of the two MTUs, with `local`'s timers and retry counts.
    ///
    /// # Errors
    /// No such QP, a QP already connected or past INIT, or attributes out of range.
    pub fn connect(&self, local: &QpRecord, remote: &QpRecord) -> Result<()> {
        let qpn = Qpn(local.qpn);
        let q = self.inner.nic.qp(qpn)?;
        if q.state() != QpState::Init {
            return Err(Error::QpState {
                qpn,
                state: q.state(),
                what: "RoCE connect",
                needed: "INIT",
            });
        }
        let mtu = u32::from(local.mtu.min(remote.mtu));
        if !(256..=4096).contains(&mtu) || !mtu.is_power_of_two() {
            return Err(Error::InvalidConfig {
                what: "path MTU",
                detail: format!("{mtu} is not one of 256, 512, 1024, 2048, 4096"),
            });
        }
        let mut peer = q.peer.lock().unwrap_or_else(|e| e.into_inner());
        if peer.is_some() {
            return Err(Error::QpState {
                qpn,
                state: q.state(),
                what: "RoCE connect",
                needed: "an unconnected QP",
            });
        }
        let conn = Arc::new(Conn {
            remote: remote.addr,
            local: InProcess {
                target: Arc::clone(&q),
                keys: Arc::clone(&self.inner.nic.keys),
            },
            responder: Mutex::new((
                Responder::new(
                    remote.qpn,
                    mtu,
                    remote.psn,
                    local.max_dest_rd_atomic,
                    local.min_rnr_timer,
                ),
                KeyCache::new(),
            )),
            mailbox: Mailbox::default(),
            poller: self.pu_poller(q.pu),
        });
        let attrs = RequesterAttrs {
            mtu,
            timeout: local.timeout,
            retry_cnt: local.retry_cnt.min(7),
            rnr_retry: local.rnr_retry.min(7),
        };
        self.inner
            .conns
            .write()
            .unwrap_or_else(|e| e.into_inner())
            .insert(qpn.0, Arc::clone(&conn));
        *peer = Some(Arc::new(RoceTransport {
            conn,
            inner: Arc::clone(&self.inner),
            sending: Mutex::new(Sending {
                req: Requester::new(attrs, remote.qpn, local.psn),
                bytes: Vec::new(),
                frames: Vec::new(),
            }),
            timer_ns: AtomicU64::new(0),
            finished: AtomicBool::new(false),
            reads_allowed: local.max_rd_atomic > 0 && remote.max_dest_rd_atomic > 0,
        }));
        drop(peer);
        q.set_ready();
        q.pus.notify(q.pu);
        Ok(())
    }

    /// PU `pu`'s turn at the socket, registered as its idle work at first use.
    fn pu_poller(&self, pu: usize) -> Arc<PuPoller> {
        let mut map = self
            .inner
            .pu_pollers
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        Arc::clone(map.entry(pu).or_insert_with(|| {
            let p = Arc::new(PuPoller {
                inner: Arc::clone(&self.inner),
                host: self.inner.nic.config.host_driven,
                present: AtomicBool::new(false),
                bufs: Mutex::new(None),
            });
            self.inner
                .nic
                .idle
                .add(pu, Arc::clone(&p) as Arc<dyn IdleWork>);
            self.inner.nic.pus.mark_changed(pu);
            p
        }))
    }

    /// Handle one datagram as if it had arrived from `from` (the fuzz target's entry: the
    /// same checks and state machines as the receive thread's).
    pub fn inject(&self, from: SocketAddrV4, datagram: &[u8]) {
        let mut out = Outbox::default();
        dispatch(&self.inner, from, datagram, &mut out);
        out.flush(&self.inner);
    }
}

impl Drop for RoceEndpoint {
    fn drop(&mut self) {
        self.inner.shutdown.store(true, Ordering::Release);
        if let Some(t) = self.rx.take() {
            let _ = t.join();
        }
        let pollers = std::mem::take(
            &mut *self
                .inner
                .pu_pollers
                .lock()
                .unwrap_or_else(|e| e.into_inner()),
        );
        for (pu, p) in pollers {
            self.inner.nic.idle.remove(pu, &(p as Arc<dyn IdleWork>));
            self.inner.nic.pus.mark_changed(pu);
        }
        // Break the QP -> transport -> connection -> QP cycles.
        self.inner
            .conns
            .write()
            .unwrap_or_else(|e| e.into_inner())
            .clear();
    }
}

/// Replies gathered from one batch of received datagrams, sent in one call.
struct Outbox {
    bytes: Vec<u8>,
    /// (destination, start, end) of each encoded reply.
    frames: Vec<(SocketAddrV4, usize, usize)>,
    /// The last reply is a plain ACK to this QP: a later one to it replaces it (ACKs are
    /// cumulative, so only the newest of a batch needs to go).
    last_ack: Option<u32>,
    /// Every reply held is a plain ACK (true when empty): nothing a requester waits on to
    /// go on, which a host-driven PU may hold for its next request.
    only_acks: bool,
}

impl Default for Outbox {
    fn default() -> Outbox {
        Outbox {
            bytes: Vec::new(),
            frames: Vec::new(),
            last_ack: None,
            only_acks: true,
        }
    }
}

impl Outbox {
    fn push(&mut self, local: SocketAddrV4, to: SocketAddrV4, h: &Header, payload: &[u8]) {
        let plain_ack = h.opcode == opcode::ACKNOWLEDGE
            && h.aeth
                .is_some_and(|a| Syndrome::of(a.syndrome) == Syndrome::Ack);
        if plain_ack && self.last_ack == Some(h.dest_qp) {
            if let Some((_, start, _)) = self.frames.pop() {
                self.bytes.truncate(start);
            }
        }
        let start = self.bytes.len();
        packet::encode(
            &mut self.bytes,
            &Route {
                src: local,
                dst: to,
            },
            h,
            payload,
        );
        self.frames.push((to, start, self.bytes.len()));
        self.last_ack = plain_ack.then_some(h.dest_qp);
        self.only_acks &= plain_ack;
    }

    fn flush(&mut self, inner: &Inner) {
        if !self.frames.is_empty() {
            let batch: Vec<(SocketAddrV4, &[u8])> = self
                .frames
                .iter()
                .map(|&(a, s, e)| (a, &self.bytes[s..e]))
                .collect();
            inner.send(&batch);
        }
        self.clear();
    }

    fn clear(&mut self) {
        self.bytes.clear();
        self.frames.clear();
        self.last_ack = None;
        self.only_acks = true;
    }
}

/// Receive one batch (waiting up to `wait` for its first datagram) and hand each datagram
/// to its QP, leaving the replies in `out`; how many arrived and the most their handling
/// did.
fn receive_batch(
    inner: &Inner,
    batch: &mut RecvBatch,
    out: &mut Outbox,
    wait: Option<Duration>,
) -> (usize, Found) {
    let n = match inner.io.recv(batch, wait) {
        Ok(n) => n,
        Err(_) => {
            // A socket error is not the packets' fault; do not spin on it.
            std::thread::sleep(Duration::from_millis(1));
            0
        }
    };
    if n == 0 {
        return (0, Found::Nothing);
    }
    inner.received.fetch_add(n as u64, Ordering::Relaxed);
    let mut found = Found::Nothing;
    for i in 0..n {
        let (d, from) = batch.get(i);
        found = found.max(dispatch(inner, from, d, out));
    }
    (n, found)
}

/// The receive thread: serves the socket while no PU does, blocked in the kernel between
/// datagrams (it never spins: a spinning receive thread takes turns on the cores with the
/// PUs and hosts that have the work), and sleeps while a PU is present at the socket.
fn receive_loop(inner: &Arc<Inner>) {
    let _ = inner.rx_thread.set(std::thread::current());
    let mut batch = RecvBatch::default();
    let mut out = Outbox::default();
    // Wake at least this often to notice a shutdown.
    let nap = Duration::from_millis(10);
    // A host-driven app held the socket at the last look (its held replies are owed).
    let mut host_held = false;
    while !inner.shutdown.load(Ordering::Acquire) {
        if inner.pollers.load(Ordering::Acquire) > 0 {
            // The last PU to leave unparks this thread (an unpark before the park makes it
            // return at once).
            std::thread::park_timeout(nap);
            continue;
        }
        if inner.host_polled.swap(false, Ordering::Relaxed) {
            // A host-driven app polled since the last look: it takes the datagrams itself.
            // Look again after a lease (its polls renew it; a wait it sleeps in ends it).
            host_held = true;
            std::thread::park_timeout(HOST_LEASE);
            continue;
        }
        if std::mem::take(&mut host_held) {
            // The app stopped calling: the ACKs it held for its next request go now.
            inner.flush_host_replies();
        }
        let (n, _) = receive_batch(inner, &mut batch, &mut out, Some(nap));
        if n > 0 {
            inner
                .by_receive_thread
                .fetch_add(n as u64, Ordering::Relaxed);
            out.flush(inner);
        }
    }
}

/// Check one datagram and hand it to the QP it names.
fn dispatch(inner: &Inner, from: SocketAddrV4, d: &[u8], out: &mut Outbox) -> Found {
    let dropped = |why| {
        inner.drops.count(why);
        Found::Placed
    };
    let p = match packet::decode(
        &Route {
            src: from,
            dst: inner.local,
        },
        d,
    ) {
        Ok(p) => p,
        Err(why) => return dropped(why),
    };
    // Looked up and used under the table's read lock, not cloned out of it (an Arc's two
    // atomic operations a packet): a connect or a removal waits for the packets in hand.
    let conns = inner.conns.read().unwrap_or_else(|e| e.into_inner());
    // Unknown QPs get no reply: nothing about which QPs exist leaks.
    let Some(conn) = conns.get(&p.header.dest_qp) else {
        return dropped(DropReason::UnknownQp);
    };
    if conn.remote != from {
        return dropped(DropReason::WrongSource);
    }
    let t = &conn.local.target;
    if t.destroyed.load(Ordering::Acquire) {
        drop(conns);
        inner
            .conns
            .write()
            .unwrap_or_else(|e| e.into_inner())
            .remove(&p.header.dest_qp);
        return dropped(DropReason::UnknownQp);
    }
    if t.state() == QpState::Error {
        return dropped(DropReason::QpInError);
    }
    if packet::is_response(p.header.opcode) {
        let r = Response {
            header: p.header,
            payload: p.payload.to_vec(),
        };
        if !conn.mailbox.push(r) {
            return dropped(DropReason::UnexpectedResponse);
        }
        // The requester takes it in its queue's next visit.
        return Found::QueueWork;
    }
    let mut guard = conn.responder.lock().unwrap_or_else(|e| e.into_inner());
    let (responder, keys) = &mut *guard;
    let mut mem = Glue {
        ip: &conn.local,
        keys,
    };
    let (local, remote) = (inner.local, conn.remote);
    if let Err(why) = responder.handle(&p, &mut mem, &mut |h: &Header, payload: &[u8]| {
        out.push(local, remote, h, payload)
    }) {
        inner.drops.count(why);
    }
    // What the queues see of a request: a receive it consumed (a completion a WAIT may
    // count), or the QP put in error (its queues flush). A WRITE without immediate, a READ
    // or an atomic only places or reads memory and replies.
    let memory_only = matches!(
        p.header.opcode,
        opcode::WRITE_FIRST
            | opcode::WRITE_MIDDLE
            | opcode::WRITE_LAST
            | opcode::WRITE_ONLY
            | opcode::READ_REQUEST
            | opcode::COMPARE_SWAP
            | opcode::FETCH_ADD
    );
    if memory_only && t.state() != QpState::Error {
        Found::Placed
    } else {
        Found::QueueWork
    }
}

/// The responder's memory: the softnic's own responder functions (those the in-process
/// transport runs), with this connection's cache of the local key table.
struct Glue<'a> {
    ip: &'a InProcess,
    keys: &'a mut KeyCache,
}

fn remote(va: u64, rkey: u32) -> RemoteAddr {
    RemoteAddr {
        addr: VirtAddr(va),
        rkey: Rkey(rkey),
    }
}

impl Memory for Glue<'_> {
    fn check_write(&mut self, va: u64, rkey: u32, len: u32) -> Result<(), Nak> {
        let t = &self.ip.target;
        self.keys
            .get(&self.ip.keys, rkey)
            .and_then(|r| {
                r.check(t.pd, VirtAddr(va), u64::from(len), Access::REMOTE_WRITE)
                    .map(|_| ())
            })
            .map_err(Nak::RemoteAccess)
    }

    fn write(&mut self, va: u64, rkey: u32, data: &[u8], imm: Option<u32>) -> Result<(), Nak> {
        self.ip.write(self.keys, remote(va, rkey), data, imm, false)
    }

    fn complete_imm(&mut self, len: u32, imm: u32) -> Result<(), Nak> {
        self.ip.complete_write_imm(len as usize, imm)
    }

    fn send(&mut self, data: &[u8], imm: Option<u32>) -> Result<(), Nak> {
        self.ip.send(self.keys, data, imm, false)
    }

    fn read(&mut self, va: u64, rkey: u32, out: &mut [u8]) -> Result<(), Nak> {
        self.ip.read(self.keys, remote(va, rkey), out)
    }

    fn atomic(&mut self, va: u64, rkey: u32, op: AtomicOp) -> Result<u64, Nak> {
        self.ip.atomic(self.keys, remote(va, rkey), op)
    }

    fn recv_ready(&mut self) -> bool {
        let t: &QpShared = &self.ip.target;
        let consumed = *t.rq.consumer.lock().unwrap_or_else(|e| e.into_inner());
        let limit = if t.managed_recv {
            t.rq.enabled.load(Ordering::Acquire)
        } else {
            t.rq.posted.load(Ordering::Acquire)
        };
        consumed < limit
    }

    fn fail(&mut self, nak: Nak) {
        // An access error or invalid request: to error with the QP's asynchronous event
        // (nothing more if the in-process responder function already refused it); any
        // other class C error: to error.
        crate::softnic::in_process::refuse(&self.ip.target, nak);
        self.ip.target.enter_error();
    }
}

/// A QP's requester and the datagrams of its last transmission, under one lock: every
/// transmission runs with the requester held, and a second lock for the buffers alone cost
/// two atomic operations on each of the several transmits a post or a settle makes.
struct Sending {
    req: Requester,
    /// Datagrams laid end to end (kept for their capacity)...
    bytes: Vec<u8>,
    /// ...and where each one starts and ends.
    frames: Vec<(usize, usize)>,
}

/// The lock of a [`RoceTransport`]'s requester; its release publishes what
/// [`RoceTransport::nothing_new`] and [`Transport::next_timer`] read without it.
struct Locked<'a> {
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
struct RoceTransport {
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
        req.transmit(now, |h, _, payload| {
            let start = bytes.len();
            packet::encode(bytes, &route, h, payload);
            frames.push((start, bytes.len()));
        });
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

    /// Post a SEND or WRITE whose payload `fill` puts into an empty buffer: wait for room in
    /// the window, start it (its last packet asking for an ACK with `ack`), send what is
    /// due, and take what has arrived.
    fn post(&self, msg: Message, ack: bool, fill: impl FnOnce(&mut Vec<u8>)) {
        let mut s = self.lock();
        let mut now = Instant::now();
        if self.arrivals_due(|| now) {
            self.take_arrived(&mut s, &mut [], now);
        }
        if !s.req.has_room(&msg) {
            self.drive(&mut s, &mut [], now, |r| r.has_room(&msg));
            now = Instant::now();
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
        self.post(msg, ack, |b| b.extend_from_slice(data));
        Ok(())
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
        });
        Ok(())
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
        self.post(msg, ack, |b| b.extend_from_slice(data));
        Ok(())
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
            Ask::Wait => false,
            Ask::Now => self.nothing_new(),
            Ask::Arrived => self.nothing_arrived(),
        };
        if nothing {
            return None;
        }
        let mut s = self.lock();
        let now = Instant::now();
        self.take_arrived(&mut s, &mut [], now);
        if ask == Ask::Wait {
            self.drive(&mut s, &mut [], now, |r| {
                r.finished() > 0 || r.outstanding() == 0
            });
        }
        s.req.pop_finished().map(|o| o.map(|_| ()))
    }

    fn abandon(&self) {
        self.lock().req.clear();
    }

    fn next_timer(&self) -> Option<Instant> {
        self.published_timer()
    }

    fn into_any(self: Arc<Self>) -> Arc<dyn Any + Send + Sync> {
        self
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::mem::SharedBuffer;
    use crate::nic::{CqConfig, Nic, QpConfig};
    use crate::softnic::roce::packet::{decode, Aeth, Reth};
    use crate::softnic::SoftNicConfig;
    use std::thread::ThreadId;

    /// Datagrams handed only to one thread's non-blocking receives (so neither the receive
    /// thread nor the PU's own idle polls take them), and every send call recorded.
    struct Script {
        local: SocketAddrV4,
        reader: ThreadId,
        inbox: Mutex<VecDeque<(SocketAddrV4, Vec<u8>)>>,
        sent: Mutex<Vec<Vec<Vec<u8>>>>,
    }

    impl DatagramIo for Arc<Script> {
        fn send(&self, batch: &[(SocketAddrV4, &[u8])]) -> std::io::Result<()> {
            let calls = batch.iter().map(|(_, d)| d.to_vec()).collect();
            self.sent.lock().unwrap().push(calls);
            Ok(())
        }

        fn recv(&self, batch: &mut RecvBatch, wait: Option<Duration>) -> std::io::Result<usize> {
            if wait.is_some() || std::thread::current().id() != self.reader {
                // The receive thread's blocking wait, as a poll that times out.
                std::thread::sleep(wait.unwrap_or_default().min(Duration::from_millis(1)));
                return Ok(0);
            }
            Ok(hand_over(&mut self.inbox.lock().unwrap(), batch))
        }

        fn local_addr(&self) -> SocketAddrV4 {
            self.local
        }
    }

    /// A softnic on `io` with one QP (start PSN 100, ACK timeout code `timeout`) connected
    /// to QP 0x99 at `peer` (its PSNs from 500), and 4 KiB of memory registered.
    struct Rig {
        nic: SoftNic,
        ep: RoceEndpoint,
        buf: Arc<SharedBuffer>,
        mr: crate::nic::MrInfo,
        cq: crate::types::Cqn,
        qp: Qpn,
    }

    impl Rig {
        fn new(io: Box<dyn DatagramIo>, peer: SocketAddrV4, timeout: u8) -> Rig {
            let nic = SoftNic::new(SoftNicConfig::new("endpoint-unit")).unwrap();
            let ep = RoceEndpoint::with_io(&nic, io, Duration::ZERO);
            let pd = nic.alloc_pd().unwrap();
            let buf = SharedBuffer::new(4096);
            let mr = nic.reg_mr(pd, &buf, 0, 4096, Access::ALL).unwrap();
            let cq = nic.create_cq(CqConfig::new(16)).unwrap();
            let qp = nic.create_qp(QpConfig::new(pd, cq)).unwrap().qpn;
            let mut ours = ep.record(qp, 100);
            ours.timeout = timeout;
            ep.connect(&ours, &QpRecord::new(0x99, 500, peer)).unwrap();
            Rig {
                nic,
                ep,
                buf,
                mr,
                cq,
                qp,
            }
        }
    }

    /// Move every datagram of `inbox` into `batch`; how many.
    fn hand_over(inbox: &mut VecDeque<(SocketAddrV4, Vec<u8>)>, batch: &mut RecvBatch) -> usize {
        let mut n = 0;
        while let Some((from, d)) = inbox.pop_front() {
            batch.set(n, &d, from);
            n += 1;
        }
        n
    }

    #[test]
    fn a_pus_replies_ride_on_its_next_send() {
        let local = SocketAddrV4::new(Ipv4Addr::LOCALHOST, 4791);
        let peer = SocketAddrV4::new(Ipv4Addr::LOCALHOST, 4792);
        let script = Arc::new(Script {
            local,
            reader: std::thread::current().id(),
            inbox: Mutex::new(VecDeque::new()),
            sent: Mutex::new(Vec::new()),
        });
        // The softnic stays up for the test (its PUs run the QP).
        let Rig {
            nic,
            ep,
            buf,
            mr,
            qp,
            ..
        } = Rig::new(Box::new(Arc::clone(&script)), peer, 14);

        // A WRITE that asks for an ACK, taken off the socket by a PU's poll.
        let mut h = Header::new(opcode::WRITE_ONLY, qp.0, 500);
        h.ack_req = true;
        h.reth = Some(Reth {
            va: mr.addr.0 + 64,
            rkey: mr.lkey.0,
            len: 8,
        });
        let mut d = Vec::new();
        let route = Route {
            src: peer,
            dst: local,
        };
        packet::encode(&mut d, &route, &h, &[7; 8]);
        script.inbox.lock().unwrap().push_back((peer, d));
        let poller = PuPoller {
            inner: Arc::clone(&ep.inner),
            host: false,
            present: AtomicBool::new(false),
            bufs: Mutex::new(None),
        };
        // A WRITE leaves the queues nothing new (a host-driven call returns at once).
        assert_eq!(poller.poll_with(&ep.inner), (1, Found::Placed));
        let mut placed = [0u8; 8];
        buf.read(64, &mut placed);
        assert_eq!(placed, [7; 8], "placed at once");
        assert!(script.sent.lock().unwrap().is_empty(), "the ACK is held");

        // The PU's next send carries it, after its own packet, in one system call.
        poller.send_with_replies(&ep.inner, peer, b"request", &[(0, 7)]);
        let sent = std::mem::take(&mut *script.sent.lock().unwrap());
        assert_eq!(sent.len(), 1, "one call");
        assert_eq!(sent[0].len(), 2);
        assert_eq!(sent[0][0], b"request");
        let back = Route {
            src: local,
            dst: peer,
        };
        let ack = decode(&back, &sent[0][1]).expect("a valid ACK").header;
        assert_eq!(
            (ack.opcode, ack.dest_qp, ack.psn),
            (opcode::ACKNOWLEDGE, 0x99, 500)
        );

        // A reply that no send of the round carries goes at the next poll, with nothing to
        // receive: a READ's response is not kept waiting for a send that may never come.
        let mut h2 = h;
        h2.psn = 501;
        let mut d2 = Vec::new();
        packet::encode(&mut d2, &route, &h2, &[8; 8]);
        script.inbox.lock().unwrap().push_back((peer, d2));
        assert_eq!(poller.poll_with(&ep.inner).0, 1);
        assert!(script.sent.lock().unwrap().is_empty(), "held for the round");
        assert_eq!(poller.poll_with(&ep.inner), (0, Found::Nothing));
        let sent = std::mem::take(&mut *script.sent.lock().unwrap());
        assert_eq!(sent.len(), 1, "sent at the next poll");
        let ack = decode(&back, &sent[0][0]).expect("a valid ACK").header;
        assert_eq!((ack.opcode, ack.psn), (opcode::ACKNOWLEDGE, 501));

        // What other arrivals leave the queues: a WRITE with immediate a receive's
        // completion (or an RNR NAK, with none posted), a response the requester takes and a
        // refused request (its QP in error) are queue work; a datagram dropped is not.
        let mut imm = Header::new(opcode::WRITE_ONLY_IMM, qp.0, 502);
        imm.reth = h.reth;
        imm.imm = Some(9);
        let mut ack = Header::new(opcode::ACKNOWLEDGE, qp.0, 0);
        ack.aeth = Some(Aeth {
            syndrome: 0,
            msn: 0,
        });
        // A WRITE its responder refuses (a wrong key) puts the QP in error: its queues flush.
        let mut refused = Header::new(opcode::WRITE_ONLY, qp.0, 502);
        refused.reth = Some(Reth {
            va: mr.addr.0 + 64,
            rkey: mr.lkey.0 ^ 0xff,
            len: 8,
        });
        for (header, payload, found) in [
            (imm, &[9u8; 8][..], Found::QueueWork),
            (ack, &[][..], Found::QueueWork),
            (refused, &[1u8; 8][..], Found::QueueWork),
        ] {
            let mut d = Vec::new();
            packet::encode(&mut d, &route, &header, payload);
            script.inbox.lock().unwrap().push_back((peer, d));
            assert_eq!(
                poller.poll_with(&ep.inner),
                (1, found),
                "{header:?} {:?}",
                ep.inner.drops.snapshot()
            );
        }
        assert_eq!(nic.qp_state(qp).unwrap(), QpState::Error);
        script.inbox.lock().unwrap().push_back((peer, vec![0; 3]));
        assert_eq!(poller.poll_with(&ep.inner), (1, Found::Placed), "a runt");
        poller.flush(&ep.inner);
        script.sent.lock().unwrap().clear();

        // Nothing held: leaving sends nothing and gives up this poller's presence (the
        // count also has the softnic's own PU while it is awake, so only the flag is
        // checked).
        assert!(poller.present.load(Ordering::Acquire));
        poller.leave(&ep.inner);
        assert!(script.sent.lock().unwrap().is_empty());
        assert!(!poller.present.load(Ordering::Acquire));
    }

    fn ack(qp: u32, psn: u32, syndrome: u8) -> Header {
        let mut h = Header::new(opcode::ACKNOWLEDGE, qp, psn);
        h.aeth = Some(Aeth { syndrome, msn: 0 });
        h
    }

    #[test]
    fn a_batch_sends_only_the_newest_plain_ack_to_a_qp() {
        let a = SocketAddrV4::new(Ipv4Addr::LOCALHOST, 1000);
        let b = SocketAddrV4::new(Ipv4Addr::LOCALHOST, 2000);
        let mut out = Outbox::default();
        out.push(a, b, &ack(7, 1, Syndrome::ACK), &[]);
        out.push(a, b, &ack(7, 2, Syndrome::ACK), &[]);
        out.push(a, b, &ack(7, 3, Syndrome::ACK), &[]);
        assert_eq!(
            out.frames.len(),
            1,
            "cumulative: the newest covers the others"
        );
        // Another QP's ACK, a NAK or a response between keeps what came before.
        out.push(a, b, &ack(8, 9, Syndrome::ACK), &[]);
        out.push(a, b, &ack(7, 4, Syndrome::NAK_SEQUENCE), &[]);
        out.push(a, b, &ack(7, 5, Syndrome::ACK), &[]);
        let route = Route { src: a, dst: b };
        let psns: Vec<(u32, u32)> = out
            .frames
            .iter()
            .map(|&(_, s, e)| {
                let h = decode(&route, &out.bytes[s..e]).expect("valid").header;
                (h.dest_qp, h.psn)
            })
            .collect();
        assert_eq!(psns, [(7, 3), (8, 9), (7, 4), (7, 5)]);
    }

    /// Datagrams the test releases to whoever receives (the PU's polls, its waits, the
    /// receive thread), and every datagram sent.
    struct Held {
        local: SocketAddrV4,
        inbox: Mutex<VecDeque<(SocketAddrV4, Vec<u8>)>>,
        sent: Mutex<Vec<Vec<u8>>>,
    }

    impl DatagramIo for Arc<Held> {
        fn send(&self, batch: &[(SocketAddrV4, &[u8])]) -> std::io::Result<()> {
            let mut sent = self.sent.lock().unwrap();
            sent.extend(batch.iter().map(|(_, d)| d.to_vec()));
            Ok(())
        }

        fn recv(&self, batch: &mut RecvBatch, wait: Option<Duration>) -> std::io::Result<usize> {
            let mut inbox = self.inbox.lock().unwrap();
            if inbox.is_empty() {
                drop(inbox);
                // The receive thread's blocking wait, as a poll that times out.
                if let Some(w) = wait {
                    std::thread::sleep(w.min(Duration::from_millis(1)));
                }
                return Ok(0);
            }
            Ok(hand_over(&mut inbox, batch))
        }

        fn local_addr(&self) -> SocketAddrV4 {
            self.local
        }
    }

    /// Wait (with a deadline) until `cond`.
    fn wait_for(what: &str, mut cond: impl FnMut() -> bool) {
        let deadline = Instant::now() + Duration::from_secs(10);
        while !cond() {
            assert!(Instant::now() < deadline, "timed out waiting for {what}");
            std::thread::yield_now();
        }
    }

    /// Through the executor and the transport: signaled WRITEs posted at once all go out
    /// before any ACK, complete only when ACKs cover them, in order; a sequence NAK in the
    /// middle of the window resends from the PSN it names and no earlier.
    #[test]
    fn writes_in_flight_complete_in_order_as_their_acks_come() {
        use crate::wqe::{Payload, WorkRequest, WqeFlags, WrOp};
        let local = SocketAddrV4::new(Ipv4Addr::LOCALHOST, 4791);
        let peer = SocketAddrV4::new(Ipv4Addr::LOCALHOST, 4792);
        let io = Arc::new(Held {
            local,
            inbox: Mutex::new(VecDeque::new()),
            sent: Mutex::new(Vec::new()),
        });
        // No ACK timer: only the ACKs and NAKs below move the window.
        let Rig {
            nic,
            ep: _ep,
            buf,
            mr,
            cq,
            qp,
        } = Rig::new(Box::new(Arc::clone(&io)), peer, 0);
        let wrs: Vec<WorkRequest> = (0..4u32)
            .map(|i| WorkRequest {
                wr_id: u64::from(i),
                flags: WqeFlags::SIGNALED,
                op: WrOp::Write {
                    remote: RemoteAddr {
                        addr: crate::types::VirtAddr(0x10_0000 + u64::from(i) * 64),
                        rkey: Rkey(7),
                    },
                    payload: Payload::Sgl(vec![mr.sge(u64::from(i) * 64, 64)]),
                    imm: None,
                },
            })
            .collect();
        buf.write(0, &(0..=255).collect::<Vec<u8>>());
        nic.post_send(qp, &wrs).unwrap();

        let out = Route {
            src: local,
            dst: peer,
        };
        let sent_psns = |from: usize| -> Vec<u32> {
            io.sent.lock().unwrap()[from..]
                .iter()
                .map(|d| decode(&out, d).expect("a valid packet").header)
                .filter(|h| h.opcode == opcode::WRITE_ONLY)
                .map(|h| h.psn)
                .collect()
        };
        wait_for("four WRITEs on the wire", || sent_psns(0).len() >= 4);
        assert_eq!(sent_psns(0), [100, 101, 102, 103], "no ACK was needed");
        let payload = decode(&out, &io.sent.lock().unwrap()[2])
            .unwrap()
            .payload
            .to_vec();
        assert_eq!(
            payload,
            (128..192).collect::<Vec<u8>>(),
            "the third WRITE's bytes"
        );
        assert_eq!(nic.cq_produced(cq).unwrap(), 0, "nothing acknowledged yet");

        let back = Route {
            src: peer,
            dst: local,
        };
        let answer = |h: Header| {
            let mut d = Vec::new();
            packet::encode(&mut d, &back, &h, &[]);
            io.inbox.lock().unwrap().push_back((peer, d));
        };
        let mut got = Vec::new();
        let mut take = |n: usize| {
            wait_for("completions", || nic.cq_produced(cq).unwrap() >= n as u64);
            nic.poll_cq(cq, 16, &mut got).unwrap();
            got.iter().map(|c| (c.wr_id, c.is_ok())).collect::<Vec<_>>()
        };
        // One ACK covers the first two.
        answer(ack(qp.0, 101, Syndrome::ACK));
        assert_eq!(take(2), [(0, true), (1, true)]);
        // The responder lost 103: its NAK acknowledges 102 and asks from 103.
        let before = io.sent.lock().unwrap().len();
        answer(ack(qp.0, 103, Syndrome::NAK_SEQUENCE));
        assert_eq!(take(3), [(0, true), (1, true), (2, true)]);
        wait_for("the resend", || !sent_psns(before).is_empty());
        assert_eq!(sent_psns(before), [103], "from the PSN named");
        answer(ack(qp.0, 103, Syndrome::ACK));
        assert_eq!(take(4), [(0, true), (1, true), (2, true), (3, true)]);
        assert_eq!(nic.qp_state(qp).unwrap(), QpState::ReadyToSend);
    }
}
