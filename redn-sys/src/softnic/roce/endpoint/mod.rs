//! A softnic's RoCEv2 endpoint: one UDP socket, a receive thread that checks every datagram
//! and hands requests to the responder of the QP they name and responses to its requester,
//! and the [`Transport`](crate::softnic::transport::Transport) a connected QP's PU sends
//! through.
//!
//! Here: the endpoint itself (its socket, receive thread and connections); `mailbox` has
//! where responses wait for their requester, `poller` how a PU takes datagrams off the
//! socket itself, `receive` the check and dispatch of each datagram and the replies a batch
//! gathers, `transport` a connected QP's requester side.

mod mailbox;
mod poller;
mod receive;
mod transport;

#[cfg(test)]
mod tests;

use super::exchange::QpRecord;
use super::io::{DatagramIo, Faults, LossyIo, PeerBudget, UdpIo};
use super::packet::{DropCounters, DropReason};
use super::requester::{Requester, RequesterAttrs};
use super::responder::Responder;
use crate::mem::KeyCache;
use crate::softnic::idle::IdleWork;
use crate::softnic::in_process::InProcess;
use crate::softnic::qp::QpShared;
use crate::softnic::shared::{ObjectMap, Shared};
use crate::softnic::SoftNic;
use crate::types::Qpn;
use crate::{Error, QpState, Result};
use mailbox::Mailbox;
use poller::{Conn, PuPoller};
use receive::{dispatch, receive_loop, Outbox};
use std::collections::HashMap;
use std::net::{Ipv4Addr, SocketAddrV4};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock, RwLock};
use std::thread::{JoinHandle, Thread};
use std::time::{Duration, Instant};
use transport::RoceTransport;

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
    /// The peer sockets' caps to share with other endpoints of the process (`None`: caps
    /// of its own; see [`PeerBudget`]).
    pub peer_budget: Option<Arc<PeerBudget>>,
}

impl RoceConfig {
    /// Bind `ip` on port 4791, spin 50 µs, no faults.
    #[must_use]
    pub fn new(ip: Ipv4Addr) -> RoceConfig {
        RoceConfig {
            bind: SocketAddrV4::new(ip, ROCE_PORT),
            spin: Duration::from_micros(50),
            faults: None,
            peer_budget: None,
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
pub(super) const HOST_LEASE: Duration = Duration::from_millis(1);

/// Bytes of payload a post copies before it sends with the clock read before the copy
/// (well under a microsecond of copying, against ACK timers of milliseconds); a larger
/// message's timers start from a second reading, taken after its copy.
pub(super) const COPY_BEFORE_CLOCK: usize = 4096;

/// Plain ACKs a host-driven PU holds for its next request at most (to QPs that alternate,
/// which do not replace each other).
pub(super) const HELD_ACKS: usize = 16;

/// Responses one QP's mailbox holds at most: a requester's window of READ responses and
/// then some.
pub(super) const MAILBOX_CAP: usize = 1024;

/// What the receive thread and the transports share.
pub(super) struct Inner {
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
    /// The polls made so far by the PUs present at the socket ([`PuPoller::polls`]), and
    /// whether one of them is in a poll now.
    fn present_polls(&self) -> (u64, bool) {
        self.pu_pollers
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .values()
            .filter(|p| !p.host && p.present.load(Ordering::Acquire))
            .fold((0, false), |(n, busy), p| {
                (
                    n.wrapping_add(p.polls.load(Ordering::Relaxed)),
                    busy || p.in_poll.load(Ordering::Acquire),
                )
            })
    }

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

    /// Count the datagrams the I/O threw away unread (a peer's socket closed with its last
    /// QP, holding datagrams for QPs that are gone) as for an unknown QP, which is what
    /// they would have met on the one socket.
    fn count_discarded(&self) {
        let n = self.io.take_discarded();
        if n > 0 {
            self.drops.add(DropReason::UnknownQp, n);
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
        let budget = cfg.peer_budget.clone().unwrap_or_default();
        let udp = UdpIo::bind_sharing(cfg.bind, budget).map_err(|source| Error::Roce {
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
        self.inner.count_discarded();
        &self.inner.drops
    }

    /// Packets moved so far.
    #[must_use]
    pub fn counters(&self) -> RoceCounters {
        RoceCounters {
            sent: self.inner.sent.load(Ordering::Relaxed),
            received: self.inner.received.load(Ordering::Relaxed),
            by_receive_thread: self.inner.by_receive_thread.load(Ordering::Relaxed),
            dropped: {
                self.inner.count_discarded();
                self.inner.drops.total()
            },
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
        self.connect_qp(self.inner.nic.qp(Qpn(local.qpn))?, local, remote)
    }

    /// [`Self::connect`] for the QP `q`, looked up already.
    fn connect_qp(&self, q: Arc<QpShared>, local: &QpRecord, remote: &QpRecord) -> Result<()> {
        let qpn = q.qpn;
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
        // A QP destroyed since it was looked up (on another thread): `destroy_qp` marks it
        // destroyed before it takes the peer under this lock, so either it is seen here or
        // the destroy takes what this connect installs. Without this the connection and its
        // peer socket were held for ever.
        if q.destroyed.load(Ordering::Acquire) {
            return Err(Error::NoSuchQp(qpn));
        }
        if peer.is_some() {
            return Err(Error::QpState {
                qpn,
                state: q.state(),
                what: "RoCE connect",
                needed: "an unconnected QP",
            });
        }
        // Before the connection is in the table: from here on the peer's datagrams queue on
        // its own socket, and none for this QP can have come to the main one before (they
        // were for an unknown QP, and dropped).
        let queue = self.inner.io.peer_lease(remote.addr);
        let conn = Arc::new(Conn {
            _queue: queue,
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
        *peer = Some(Arc::new(RoceTransport::new(
            conn,
            Arc::clone(&self.inner),
            Requester::new(attrs, remote.qpn, local.psn),
            local.max_rd_atomic > 0 && remote.max_dest_rd_atomic > 0,
        )));
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
            let p = Arc::new(PuPoller::new(Arc::clone(&self.inner)));
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
