//! The event loop: one mio (epoll) poll serves both listening sockets, every connection and
//! the signals; no thread per client.
//!
//! Each connection has an input buffer split at NUL bytes (capped), the fds that arrived
//! with the first byte of its next message, a queue of replies not yet written, and a
//! one-second request window. A request is decoded, the peer re-checked through its pidfd,
//! then handed to [`crate::state::Manager`]. Anything wrong with one connection (bad JSON,
//! an oversize message, too many fds, deep nesting, an unknown method, a flood) is
//! answered with a named error on that connection — closed after the reply when its
//! framing can no longer be trusted — and the loop goes on serving everyone else.

use crate::audit::{Audit, Event, Record, Severity};
use crate::auditor::Auditor;
use crate::dataplane::Dataplane;
use crate::outbox::Outbox;
use crate::peer::{Peer, Procfs};
use crate::state::Manager;
use mio::net::{UnixListener, UnixStream};
use mio::unix::SourceFd;
use mio::{Events, Interest, Poll, Token};
use nix::sys::signal::Signal;
use nix::sys::signalfd::SignalFd;
use redn_proto::api::{self, ADMIN, MANAGER, SERVICE};
use redn_proto::codec::{Call, MessageBuffer, Reply};
use redn_proto::errors::{AdminError, ManagerError, Named, ServiceError, WireError};
use redn_proto::fds::recv_with_fds;
use redn_proto::idl;
use serde::de::DeserializeOwned;
use serde::Serialize;
use serde_json::{Map, Value};
use std::collections::{HashMap, HashSet};
use std::io::{self, Write};
use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::time::{Duration, Instant};

/// Which socket a connection came in on.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SocketKind {
    /// `manager.sock`: apps, `io.redn.Manager`.
    Api,
    /// `admin.sock`: admins, `io.redn.Admin`.
    Admin,
}

impl SocketKind {
    fn interface(self) -> (&'static str, &'static str) {
        match self {
            SocketKind::Api => (MANAGER, idl::MANAGER_IDL),
            SocketKind::Admin => (ADMIN, idl::ADMIN_IDL),
        }
    }
}

const SIGNALS: Token = Token(0);
/// A connection's pidfd has this plus the connection's token as its token: a range of its
/// own, below the data plane's tokens (from `usize::MAX / 2`).
const PIDFD_BASE: usize = usize::MAX / 4;

/// The connection whose pidfd has `token`, if it is a pidfd's.
fn pidfd_conn(token: usize) -> Option<usize> {
    (PIDFD_BASE..2 * PIDFD_BASE)
        .contains(&token)
        .then(|| token - PIDFD_BASE)
}
/// How long the audit trail may take to drain at exit.
const AUDIT_DRAIN: Duration = Duration::from_secs(2);
/// How soon the loop retries records a stalled syslog daemon did not take.
const AUDIT_RETRY: Duration = Duration::from_millis(10);
/// How long a hang-up waits for its process's pidfd before it counts as a plain disconnect:
/// a dying process's sockets close just before its pidfd turns readable.
const HANGUP_GRACE: Duration = Duration::from_millis(50);

/// An app connection that hung up while its process still seemed alive.
struct Hangup {
    client: u64,
    peer: Peer,
    since: Instant,
}
const FIRST_LISTENER: usize = 1;
const FIRST_CONN: usize = 16;
/// Reads one connection may do per wakeup before others get a turn.
const READS_PER_TURN: usize = 16;
/// Messages one connection may have handled per turn: a backlog of calls (one-way ones
/// cost a parse and get no reply, so nothing else holds them back) is taken a slice at a
/// time, after everyone else's.
const MESSAGES_PER_TURN: usize = 64;
/// A connection with more replies than this unread is not read from, nor are its
/// requests handled, until its peer reads them: a client that sends without reading holds
/// this much of the daemon's memory (plus one reply and its input), not the whole
/// pending-output cap on each of its connections.
const OUTPUT_HIGH_WATER: usize = 256 << 10;
/// What a connection may hold (requests and replies) before it is counted against its
/// uid's `buffered-bytes-per-uid`.
const BUFFER_ALLOWANCE: usize = 32 << 10;

struct Conn {
    stream: UnixStream,
    kind: SocketKind,
    peer: Peer,
    client: Option<u64>,
    input: MessageBuffer,
    /// Fds that arrived with the first byte of the next message.
    fds: Vec<OwnedFd>,
    /// The next message is refused with this error (its fds broke a cap).
    refuse_next: Option<ManagerError>,
    output: Outbox,
    close_after_flush: bool,
    window_start: Instant,
    window_requests: u32,
    wants_write: bool,
    /// Not read from until its replies drain below [`OUTPUT_HIGH_WATER`].
    paused: bool,
}

/// What the loop did, for sd_notify's STATUS line and the benchmark.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Counters {
    /// Connections accepted.
    pub accepted: u64,
    /// Connections refused at accept (caps, unknown peer).
    pub refused: u64,
    /// Requests handled.
    pub requests: u64,
}

/// The loop and everything it serves.
pub struct Server {
    poll: Poll,
    listeners: Vec<(UnixListener, SocketKind)>,
    signals: Option<SignalFd>,
    conns: HashMap<usize, Conn>,
    /// Connections stopped after READS_PER_TURN reads with input maybe still waiting.
    unfinished: HashSet<usize>,
    next_token: usize,
    manager: Manager,
    procfs: Procfs,
    stop: bool,
    audit: Audit,
    /// The receive buffer every read uses (one event loop, one read at a time).
    scratch: Vec<u8>,
    /// What happened, for logs and tests.
    pub counters: Counters,
    /// Remote clients, when `[dataplane] listen` is set.
    dataplane: Option<Dataplane>,
    /// Run-time budgets (see [`crate::auditor`]).
    pub auditor: Auditor,
    /// The listeners were closed: stopping, nothing more is admitted.
    closed: bool,
    /// Hang-ups waiting to be told apart: the app exiting, or only its connection closing.
    hangups: HashMap<usize, Hangup>,
    /// Admin connections streaming `Monitor`, and when they last got the counters.
    monitors: HashMap<usize, Instant>,
    /// `manager.toml` as loaded, and where, for reloads.
    config: Option<(std::path::PathBuf, redn_policy::ManagerConfig)>,
}

impl std::fmt::Debug for Server {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Server")
            .field("connections", &self.conns.len())
            .field("counters", &self.counters)
            .finish_non_exhaustive()
    }
}

impl Server {
    /// A server over `listeners` (non-blocking), with `signals` (blocked already) if given.
    ///
    /// # Errors
    /// If epoll cannot be set up.
    pub fn new(
        manager: Manager,
        listeners: Vec<(std::os::unix::net::UnixListener, SocketKind)>,
        signals: Option<SignalFd>,
        audit: Audit,
    ) -> io::Result<Server> {
        let poll = Poll::new()?;
        let mut mio_listeners = Vec::new();
        for (i, (l, kind)) in listeners.into_iter().enumerate() {
            l.set_nonblocking(true)?;
            let mut l = UnixListener::from_std(l);
            poll.registry()
                .register(&mut l, Token(FIRST_LISTENER + i), Interest::READABLE)?;
            mio_listeners.push((l, kind));
        }
        if let Some(s) = &signals {
            poll.registry().register(
                &mut SourceFd(&s.as_fd().as_raw_fd()),
                SIGNALS,
                Interest::READABLE,
            )?;
        }
        Ok(Server {
            poll,
            listeners: mio_listeners,
            signals,
            conns: HashMap::new(),
            unfinished: HashSet::new(),
            next_token: FIRST_CONN,
            manager,
            procfs: Procfs::default(),
            stop: false,
            audit,
            scratch: vec![0u8; 64 << 10],
            counters: Counters::default(),
            dataplane: None,
            auditor: Auditor::new(crate::auditor::DEFAULT_INTERVAL),
            closed: false,
            hangups: HashMap::new(),
            monitors: HashMap::new(),
            config: None,
        })
    }

    /// Serve remote clients from `dataplane` too; installs then report its address.
    ///
    /// # Errors
    /// If epoll refuses its listener.
    pub fn set_dataplane(&mut self, mut dataplane: Dataplane) -> io::Result<()> {
        dataplane.register(self.poll.registry())?;
        self.manager
            .set_dataplane_endpoint(dataplane.local_addr().to_string());
        self.dataplane = Some(dataplane);
        Ok(())
    }

    /// The manager state.
    pub fn manager(&self) -> &Manager {
        &self.manager
    }

    /// Open connections.
    pub fn connections(&self) -> usize {
        self.conns.len()
    }

    /// Reload `manager.toml` from `path` too (it was loaded as `config`): its `[audit]`
    /// section takes effect at once; the sockets, backend and data plane need a restart.
    pub fn reload_config_from(
        &mut self,
        path: std::path::PathBuf,
        config: redn_policy::ManagerConfig,
    ) {
        self.config = Some((path, config));
    }

    /// The audit trail.
    pub fn audit(&mut self) -> &mut Audit {
        &mut self.audit
    }

    /// Serve until SIGTERM or SIGINT; then stop admitting, tear everything down (a
    /// `teardown` record each), record `stop` and drain the audit trail.
    ///
    /// # Errors
    /// If polling fails.
    pub fn run(&mut self) -> io::Result<()> {
        self.audit.event(
            &Record::new(Event::Start, Severity::Notice)
                .field("pid", std::process::id())
                .field("backend", self.manager.backend())
                .field("version", env!("CARGO_PKG_VERSION"))
                .res(true),
        );
        while !self.stop {
            self.turn(None)?;
        }
        self.shutdown();
        Ok(())
    }

    /// Stop admitting, hang up on everyone, tear everything down, drain the audit trail.
    pub fn shutdown(&mut self) {
        for (l, _) in &mut self.listeners {
            let _ = self.poll.registry().deregister(l);
        }
        self.listeners.clear();
        self.closed = true;
        let (conns, offloads) = (self.conns.len(), self.manager.installed_count());
        let tokens: Vec<usize> = self.conns.keys().copied().collect();
        for t in tokens {
            if let Some(c) = self.conns.get_mut(&t) {
                // Torn down below, with the rest.
                c.client = None;
            }
            self.close(t);
        }
        self.resolve_hangups(true);
        if let Some(dp) = &mut self.dataplane {
            dp.shutdown(self.poll.registry(), &mut self.manager, &mut self.audit);
        }
        self.manager.shutdown();
        self.drain_manager_records();
        let objects = self.manager.nic().objects();
        self.audit.event(
            &Record::new(Event::Stop, Severity::Notice)
                .field("connections", conns)
                .field("offloads", offloads)
                .field(
                    "objects_left",
                    objects.pds + objects.regions + objects.cqs + objects.qps,
                )
                .field("audit_dropped", self.audit.dropped)
                .res(true),
        );
        self.audit.drain(Instant::now() + AUDIT_DRAIN);
    }

    fn drain_manager_records(&mut self) {
        for r in self.manager.take_records() {
            self.audit.event(&r);
        }
    }

    /// One round of the loop: wait at most `timeout` for events (not at all if a
    /// connection has unread input left over) and handle them.
    ///
    /// # Errors
    /// If polling fails.
    pub fn turn(&mut self, timeout: Option<Duration>) -> io::Result<()> {
        let mut events = Events::with_capacity(256);
        let mut timeout = if self.unfinished.is_empty() {
            timeout
        } else {
            Some(Duration::ZERO)
        };
        // The auditor's next round (none while nothing is installed: an idle manager sleeps),
        // and records a stalled receiver left queued.
        let mut wake = (self.manager.installed_count() > 0)
            .then(|| self.auditor.until_due(redn_sys::clock::SystemClock));
        if self.audit.queued() > 0 || !self.hangups.is_empty() || !self.monitors.is_empty() {
            wake = Some(wake.map_or(AUDIT_RETRY, |w| w.min(AUDIT_RETRY)));
        }
        if let Some(w) = wake {
            timeout = Some(timeout.map_or(w, |t| t.min(w)));
        }
        match self.poll.poll(&mut events, timeout) {
            Ok(()) => {}
            Err(e) if e.kind() == io::ErrorKind::Interrupted => return Ok(()),
            Err(e) => return Err(e),
        }
        let mut ready: Vec<(usize, bool, bool)> = events
            .iter()
            .map(|e| {
                (
                    e.token().0,
                    e.is_readable() || e.is_read_closed(),
                    e.is_writable(),
                )
            })
            .collect();
        for t in std::mem::take(&mut self.unfinished) {
            ready.push((t, true, false));
        }
        // Before any request: an app whose exit is now visible is not served as alive.
        self.resolve_hangups(false);
        for (token, readable, writable) in ready {
            if token == SIGNALS.0 {
                self.handle_signals();
            } else if token >= crate::dataplane::FIRST_TOKEN {
                if let Some(dp) = &mut self.dataplane {
                    let registry = self.poll.registry();
                    dp.ready(
                        registry,
                        token,
                        readable,
                        writable,
                        &mut self.manager,
                        &mut self.audit,
                    );
                }
            } else if let Some(conn) = pidfd_conn(token) {
                self.app_exited(conn);
            } else if token < FIRST_CONN {
                self.accept_all(token - FIRST_LISTENER);
            } else {
                if writable {
                    self.flush(token);
                }
                if readable {
                    self.read(token);
                }
            }
        }
        if let Some(dp) = &mut self.dataplane {
            // Remote clients of offloads uninstalled in this turn lose their instances.
            dp.reap(self.poll.registry(), &mut self.manager, &mut self.audit);
        }
        self.audit_round();
        Ok(())
    }

    /// An auditor round if one is due, then the records of what the manager did.
    fn audit_round(&mut self) {
        let clock = redn_sys::clock::SystemClock;
        if self.auditor.due(clock) {
            self.manager.audit_round(&mut self.auditor, clock);
        }
        self.drain_manager_records();
        self.audit.flush();
        self.feed_monitors();
    }

    /// What `Monitor` reports once a second.
    fn monitor_counters(&self) -> api::MonitorCounters {
        let a = self.auditor.counters;
        api::MonitorCounters {
            connections: self.conns.len() as u64,
            offloads: self.manager.installed_count() as u64,
            auditor_rounds: a.rounds,
            auditor_samples: a.samples,
            throttles: a.throttles,
            terminations: a.terminations,
            audit_sent: self.audit.sent,
            audit_dropped: self.audit.dropped,
            buffered_bytes: self
                .conns
                .values()
                .map(|c| (c.input.held() + c.output.held()) as u64)
                .sum(),
            packets_dropped: self
                .dataplane
                .as_ref()
                .map_or(0, Dataplane::packets_dropped),
        }
    }

    /// Send each `Monitor` subscriber the records since the last turn, and the counters
    /// once a second.
    fn feed_monitors(&mut self) {
        self.monitors.retain(|t, _| self.conns.contains_key(t));
        self.audit.set_tap(!self.monitors.is_empty());
        if self.monitors.is_empty() {
            return;
        }
        let records = self.audit.take_tapped();
        let counters = self.monitor_counters();
        let now = Instant::now();
        let tokens: Vec<usize> = self.monitors.keys().copied().collect();
        for t in tokens {
            let mut bytes = Vec::new();
            for r in &records {
                bytes.extend(stream_reply(&api::MonitorReply {
                    record: Some(r.clone()),
                    counters: None,
                }));
            }
            let due = self
                .monitors
                .get(&t)
                .is_some_and(|last| now.duration_since(*last) >= Duration::from_secs(1));
            if due {
                self.monitors.insert(t, now);
                bytes.extend(stream_reply(&api::MonitorReply {
                    record: None,
                    counters: Some(counters),
                }));
            }
            if !bytes.is_empty() {
                // A monitor that does not read is dropped by the pending-output cap.
                self.send(t, bytes);
            }
        }
    }

    /// The process behind connection `token` exited (its pidfd became readable): apply its
    /// rule's `keep_serving_after_exit` and record `app-exit`. The connection stays open if
    /// another process still holds the socket: its next call gets `PeerChanged`.
    fn app_exited(&mut self, token: usize) {
        let Some(c) = self.conns.get_mut(&token) else {
            return;
        };
        if let Some(fd) = &c.peer.pidfd {
            let _ = self
                .poll
                .registry()
                .deregister(&mut SourceFd(&fd.as_raw_fd()));
        }
        if let Some(client) = c.client.take() {
            self.manager.app_exited(client);
        }
    }

    fn handle_signals(&mut self) {
        let Some(sfd) = &self.signals else { return };
        let mut got = Vec::new();
        while let Ok(Some(info)) = sfd.read_signal() {
            got.push(info.ssi_signo);
        }
        for signo in got {
            match i32::try_from(signo)
                .ok()
                .and_then(|s| Signal::try_from(s).ok())
            {
                Some(Signal::SIGHUP) => {
                    let _ = self.reload("SIGHUP");
                }
                Some(s @ (Signal::SIGTERM | Signal::SIGINT)) => {
                    self.audit.event(
                        &Record::new(Event::StopRequested, Severity::Notice)
                            .field("signal", s.as_str())
                            .res(true),
                    );
                    self.stop = true;
                }
                _ => {}
            }
        }
    }

    /// Reload policy and definitions (SIGHUP or `ReloadPolicy`), recording `reload` and the
    /// teardowns it causes.
    fn reload(&mut self, by: &str) -> Result<api::Reloaded, AdminError> {
        // manager.toml first: if it is broken, nothing changes.
        let loaded = self
            .config
            .as_ref()
            .map(|(path, _)| redn_policy::load_manager_config(path));
        let config = match loaded {
            Some(Err(e)) => {
                let e = AdminError::ReloadFailed {
                    reason: e.to_string(),
                };
                return Err(self.reload_failed(by, e));
            }
            Some(Ok(c)) => Some(c),
            None => None,
        };
        let r = self.manager.reload_policy();
        match &r {
            Ok(ok) => {
                let mut restart = Vec::new();
                if let (Some(new), Some((_, old))) = (config, &mut self.config) {
                    for (part, changed) in [
                        ("api", new.api != old.api),
                        ("admin", new.admin != old.admin),
                        ("backend", new.backend != old.backend),
                        ("dataplane", new.dataplane != old.dataplane),
                    ] {
                        if changed {
                            restart.push(part);
                        }
                    }
                    self.audit.reconfigure(new.audit.clone());
                    *old = new;
                }
                let records = self.manager.take_records();
                let mut rec = Record::new(Event::Reload, Severity::Notice)
                    .field("by", by)
                    .field("apps", ok.apps)
                    .field("torn_down", records.len());
                if !restart.is_empty() {
                    // Changed, but only a restart applies them (sockets, the NIC).
                    rec = rec.field("restart_needed", restart.join(","));
                }
                self.audit.event(&rec.res(true));
                for rec in records {
                    self.audit.event(&rec);
                }
            }
            Err(e) => {
                self.reload_failed(by, e.clone());
            }
        }
        r
    }

    /// Record a failed reload; `e` back.
    fn reload_failed(&mut self, by: &str, e: AdminError) -> AdminError {
        let reason = match &e {
            AdminError::ReloadFailed { reason } => reason.clone(),
            other => other.to_wire().name,
        };
        self.audit.event(
            &Record::new(Event::Reload, Severity::Warning)
                .field("by", by)
                .field("kept", "old-policy")
                .field("reason", reason)
                .res(false),
        );
        e
    }

    fn accept_all(&mut self, index: usize) {
        loop {
            let Some((listener, kind)) = self.listeners.get(index) else {
                return;
            };
            let kind = *kind;
            let stream = match listener.accept() {
                Ok((s, _)) => s,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) => {
                    // EMFILE and the like: leave the rest in the backlog for now.
                    self.audit.event(
                        &Record::new(Event::Refuse, Severity::Warning)
                            .field("reason", format!("accept: {e}"))
                            .res(false),
                    );
                    return;
                }
            };
            self.admit(stream, kind);
        }
    }

    fn admit(&mut self, mut stream: UnixStream, kind: SocketKind) {
        let peer = match Peer::identify(stream.as_fd(), &self.procfs) {
            Ok(p) => p,
            Err(e) => {
                self.counters.refused += 1;
                // Best effort: the peer may be gone, or still reading.
                let err = ManagerError::PeerChanged {
                    reason: e.to_string(),
                };
                let _ = stream.write(&error_reply(&err.to_wire()));
                self.audit.event(
                    &Record::new(Event::Refuse, Severity::Warning)
                        .field("socket", format!("{kind:?}"))
                        .field("reason", e)
                        .res(false),
                );
                return;
            }
        };
        let uid = peer.identity.uid;
        let limits = self.manager.limits;
        // A hang-up not yet settled still holds its process's pidfd: it counts as a
        // connection, or closing connections in a loop would pile pidfds up past the fd
        // budget.
        let same_uid = self
            .conns
            .values()
            .map(|c| &c.peer)
            .chain(self.hangups.values().map(|h| &h.peer))
            .filter(|p| p.identity.uid == uid)
            .count();
        let held = self.conns.len() + self.hangups.len();
        let quota = |resource: &str, limit: usize, held: usize| {
            let err = ManagerError::QuotaExceeded {
                resource: resource.into(),
                limit: limit as u64,
                requested: held as u64 + 1,
            };
            (err, resource.to_owned())
        };
        // An app the auditor banned may not come back until the ban ends (its connections
        // already open stay, so it can read Stats and learn why).
        let banned = match kind {
            SocketKind::Api => self.manager.connect_refusal(&peer.identity),
            SocketKind::Admin => None,
        };
        let refusal = if let Some(reason) = banned {
            let err = ManagerError::PolicyDenied {
                reason: reason.clone(),
            };
            Some((err, reason))
        } else if held >= limits.max_connections {
            Some(quota("connections", limits.max_connections, held))
        } else if same_uid >= limits.max_connections_per_uid {
            Some(quota(
                "connections-per-uid",
                limits.max_connections_per_uid,
                same_uid,
            ))
        } else {
            None
        };
        if let Some((err, reason)) = refusal {
            self.counters.refused += 1;
            // Best effort: a fresh socket's buffer takes one short reply.
            let _ = stream.write(&error_reply(&err.to_wire()));
            self.audit.event(
                &Record::new(Event::Refuse, Severity::Warning)
                    .field("socket", format!("{kind:?}"))
                    .peer(&peer.identity)
                    .field("reason", reason)
                    .res(false),
            );
            return;
        }
        let token = self.next_token;
        self.next_token += 1;
        if let Err(e) = self
            .poll
            .registry()
            .register(&mut stream, Token(token), Interest::READABLE)
        {
            self.audit.event(
                &Record::new(Event::Refuse, Severity::Warning)
                    .peer(&peer.identity)
                    .field("reason", format!("epoll: {e}"))
                    .res(false),
            );
            return;
        }
        // The app's exit is noticed through its pidfd, even while another process still
        // holds its socket.
        if let (SocketKind::Api, Some(fd)) = (kind, &peer.pidfd) {
            let _ = self.poll.registry().register(
                &mut SourceFd(&fd.as_raw_fd()),
                Token(PIDFD_BASE + token),
                Interest::READABLE,
            );
        }
        let client = (kind == SocketKind::Api).then(|| self.manager.connect(peer.identity.clone()));
        if let Some(id) = client {
            let adopted = self.manager.adopt(id);
            if adopted > 0 {
                self.audit.event(
                    &Record::new(Event::Adopt, Severity::Notice)
                        .field("client", id)
                        .peer(&peer.identity)
                        .field("offloads", adopted)
                        .res(true),
                );
            }
        }
        self.audit.event(
            &Record::new(Event::Connect, Severity::Info)
                .field("socket", format!("{kind:?}"))
                .field("client", client.unwrap_or(0))
                .peer(&peer.identity)
                .res(true),
        );
        self.counters.accepted += 1;
        self.conns.insert(
            token,
            Conn {
                stream,
                kind,
                peer,
                client,
                input: MessageBuffer::new(limits.codec),
                fds: Vec::new(),
                refuse_next: None,
                output: Outbox::default(),
                close_after_flush: false,
                window_start: Instant::now(),
                window_requests: 0,
                wants_write: false,
                paused: false,
            },
        );
        // Data sent before the accept is reported by the first poll (edge triggers on
        // registration when data is already there).
    }

    fn close(&mut self, token: usize) {
        if let Some(mut c) = self.conns.remove(&token) {
            let _ = self.poll.registry().deregister(&mut c.stream);
            match c.client {
                Some(client) if c.peer.still_same().is_err() || exited(&c.peer) => {
                    // The hang-up is the app's exit (its pidfd may not have been read yet).
                    self.forget_pidfd(&c.peer);
                    self.manager.app_exited(client);
                }
                Some(client) if c.peer.pidfd.is_some() && !self.closed => {
                    // Its process may be dying: wait briefly for the pidfd (still
                    // registered) to tell.
                    self.hangups.insert(
                        token,
                        Hangup {
                            client,
                            peer: c.peer,
                            since: Instant::now(),
                        },
                    );
                }
                Some(client) => {
                    self.forget_pidfd(&c.peer);
                    self.disconnected(client, &c.peer);
                }
                None => self.forget_pidfd(&c.peer),
            }
            self.drain_manager_records();
        }
        self.unfinished.remove(&token);
    }

    fn forget_pidfd(&self, peer: &Peer) {
        if let Some(fd) = &peer.pidfd {
            let _ = self
                .poll
                .registry()
                .deregister(&mut SourceFd(&fd.as_raw_fd()));
        }
    }

    /// A client's connection closed while its process lives on.
    fn disconnected(&mut self, client: u64, peer: &Peer) {
        let removed = self.manager.disconnect(client);
        self.audit.event(
            &Record::new(Event::Disconnect, Severity::Info)
                .field("client", client)
                .peer(&peer.identity)
                .field("uninstalled", removed)
                .res(true),
        );
    }

    /// Settle hang-ups: an exited process is an app exit; one alive after the grace period
    /// (or, with `all`, now) only closed its connection.
    fn resolve_hangups(&mut self, all: bool) {
        if self.hangups.is_empty() {
            return;
        }
        let settled: Vec<usize> = self
            .hangups
            .iter()
            .filter(|(_, h)| all || exited(&h.peer) || h.since.elapsed() >= HANGUP_GRACE)
            .map(|(t, _)| *t)
            .collect();
        for t in settled {
            let Some(h) = self.hangups.remove(&t) else {
                continue;
            };
            self.forget_pidfd(&h.peer);
            if exited(&h.peer) || h.peer.still_same().is_err() {
                self.manager.app_exited(h.client);
            } else {
                self.disconnected(h.client, &h.peer);
            }
        }
        self.drain_manager_records();
    }

    fn read(&mut self, token: usize) {
        let mut buf = std::mem::take(&mut self.scratch);
        self.read_with(token, &mut buf);
        self.scratch = buf;
    }

    fn read_with(&mut self, token: usize, buf: &mut [u8]) {
        let max_fds = self.manager.limits.codec.max_fds;
        // Requests held back (paused, or left for the next turn) come first.
        let mut budget = MESSAGES_PER_TURN;
        if !self.drain_messages(token, &mut budget) {
            self.unfinished.insert(token);
            return;
        }
        for _ in 0..READS_PER_TURN {
            let Some(c) = self.conns.get_mut(&token) else {
                return;
            };
            if c.close_after_flush || c.paused {
                return;
            }
            let got = match recv_with_fds(c.stream.as_fd(), buf) {
                Ok(g) => g,
                Err(redn_proto::Error::Io { source, .. })
                    if source.kind() == io::ErrorKind::WouldBlock =>
                {
                    return
                }
                Err(redn_proto::Error::Io { source, .. })
                    if source.kind() == io::ErrorKind::Interrupted =>
                {
                    continue
                }
                Err(e) => {
                    let reason = e.to_string();
                    self.violation(token, "fds", reason, true);
                    return;
                }
            };
            if got.len == 0 {
                self.close(token);
                return;
            }
            if !got.fds.is_empty() {
                // Admins pass no fds.
                let max = if c.kind == SocketKind::Api {
                    max_fds
                } else {
                    0
                };
                if !c.input.is_empty() || !c.fds.is_empty() {
                    self.violation(
                        token,
                        "fds",
                        "file descriptors must arrive with the first byte of the message \
                         that names them, with no earlier call awaiting its reply"
                            .into(),
                        true,
                    );
                    return;
                }
                if got.fds.len() > max {
                    c.refuse_next = Some(ManagerError::ProtocolViolation {
                        limit: "fds".into(),
                        reason: format!(
                            "{} file descriptors in one message, at most {max}",
                            got.fds.len()
                        ),
                    });
                } else {
                    c.fds = got.fds;
                }
            }
            c.input.extend(&buf[..got.len]);
            if let Some(reason) = self.over_buffer_budget(token) {
                self.violation(token, "buffered-bytes", reason, true);
                return;
            }
            if !self.drain_messages(token, &mut budget) {
                // Its turn is used up: the rest next turn, after everyone else's.
                break;
            }
        }
        self.unfinished.insert(token);
    }

    /// Handle the connection's complete messages, at most `budget` of them (counted down);
    /// `false` if the budget ran out first (some may be left).
    fn drain_messages(&mut self, token: usize, budget: &mut usize) -> bool {
        loop {
            let Some(c) = self.conns.get_mut(&token) else {
                return true;
            };
            if c.close_after_flush || c.paused {
                return true;
            }
            if c.output.pending() > OUTPUT_HIGH_WATER {
                // Its peer is not reading: leave the rest of its requests (and its socket)
                // until it does (`flush` resumes it).
                c.paused = true;
                return true;
            }
            if *budget == 0 {
                return false;
            }
            match c.input.next_message() {
                None => return true,
                Some(Err(e)) => {
                    let reason = e.to_string();
                    self.violation(token, "message-size", reason, true);
                    return true;
                }
                Some(Ok(msg)) => {
                    *budget -= 1;
                    self.handle_message(token, &msg);
                }
            }
        }
    }

    /// Answer a protocol violation; close after the reply if `fatal`.
    fn violation(&mut self, token: usize, limit: &str, reason: String, fatal: bool) {
        self.audit.event(
            &Record::new(Event::ProtocolViolation, Severity::Warning)
                .field("limit", limit)
                .field("reason", &reason)
                .res(false),
        );
        let err = ManagerError::ProtocolViolation {
            limit: limit.into(),
            reason,
        };
        self.send(token, error_reply(&err.to_wire()));
        if fatal {
            if let Some(c) = self.conns.get_mut(&token) {
                c.close_after_flush = true;
                c.fds.clear();
                c.input.clear();
            }
            self.flush(token);
        }
    }

    /// Why the connection at `token` takes its uid past `buffered-bytes-per-uid`, if it
    /// does. Only a connection holding more than [`BUFFER_ALLOWANCE`] is counted against
    /// the others, so the common case costs no scan.
    fn over_buffer_budget(&self, token: usize) -> Option<String> {
        let held = |c: &Conn| c.input.held() + c.output.held();
        let c = self.conns.get(&token)?;
        if held(c) <= BUFFER_ALLOWANCE {
            return None;
        }
        let uid = c.peer.identity.uid;
        let total: usize = self
            .conns
            .values()
            .filter(|o| o.peer.identity.uid == uid)
            .map(held)
            .sum();
        let max = self.manager.limits.max_buffered_per_uid;
        (total > max).then(|| {
            format!(
                "uid {uid}'s connections hold {total} bytes of requests and replies, over the \
                 {max} a uid may"
            )
        })
    }

    fn handle_message(&mut self, token: usize, msg: &[u8]) {
        let Some(c) = self.conns.get_mut(&token) else {
            return;
        };
        let fds = std::mem::take(&mut c.fds);
        if let Some(err) = c.refuse_next.take() {
            drop(fds);
            self.send(token, error_reply(&err.to_wire()));
            return;
        }
        let call = match Call::parse(msg, &self.manager.limits.codec) {
            Ok(call) => call,
            Err(redn_proto::Error::Protocol { limit, reason }) => {
                // Bad JSON or headers: the spec closes the connection; we say why first.
                self.violation(token, limit, reason, true);
                return;
            }
            Err(e) => {
                self.violation(token, "json", e.to_string(), true);
                return;
            }
        };
        let now = Instant::now();
        if now.duration_since(c.window_start) >= Duration::from_secs(1) {
            c.window_start = now;
            c.window_requests = 0;
        }
        c.window_requests += 1;
        let rps = self.manager.limits.requests_per_second;
        if c.window_requests > rps {
            if !call.oneway {
                let err = ManagerError::RateLimited {
                    requests_per_second: rps,
                };
                self.send(token, error_reply(&err.to_wire()));
            }
            return;
        }
        self.counters.requests += 1;
        if call.method == format!("{ADMIN}.Monitor") && !call.oneway {
            self.monitor(token, &call);
            return;
        }
        let (result, close) = self.dispatch(token, &call, fds);
        if !call.oneway {
            let bytes = match result {
                Ok(p) => Reply::ok(p).encode(),
                Err(w) => error_reply(&w),
            };
            self.send(token, bytes);
        }
        if close {
            if let Some(c) = self.conns.get_mut(&token) {
                c.close_after_flush = true;
            }
            self.flush(token);
        }
    }

    /// Run one call; the reply and whether to close the connection after it.
    fn dispatch(
        &mut self,
        token: usize,
        call: &Call,
        fds: Vec<OwnedFd>,
    ) -> (Result<Map<String, Value>, WireError>, bool) {
        let Some(c) = self.conns.get(&token) else {
            return (Err(ServiceError::PermissionDenied {}.to_wire()), true);
        };
        let (kind, client) = (c.kind, c.client);
        let (iface, idl_text) = kind.interface();
        let Some((interface, method)) = call.method.rsplit_once('.') else {
            return (
                Err(ServiceError::MethodNotFound {
                    method: call.method.clone(),
                }
                .to_wire()),
                false,
            );
        };
        let not_found = || {
            Err(ServiceError::MethodNotFound {
                method: call.method.clone(),
            }
            .to_wire())
        };
        if interface == SERVICE {
            let r = match method {
                "GetInfo" => encode(&api::ServiceInfo {
                    vendor: "RedN".into(),
                    product: "redn-manager".into(),
                    version: env!("CARGO_PKG_VERSION").into(),
                    url: "https://github.com/redn-project/redn-manager".into(),
                    interfaces: vec![SERVICE.into(), iface.into()],
                }),
                "GetInterfaceDescription" => decode::<api::DescribeInterface>(call)
                    .and_then(|p| match p.interface.as_str() {
                        i if i == iface => Ok(idl_text),
                        SERVICE => Ok(idl::SERVICE_IDL),
                        _ => Err(ServiceError::InterfaceNotFound {
                            interface: p.interface.clone(),
                        }
                        .to_wire()),
                    })
                    .map(|text| {
                        let mut m = Map::new();
                        m.insert("description".into(), Value::String(text.into()));
                        m
                    }),
                _ => not_found(),
            };
            return (r, false);
        }
        if interface != iface {
            return (
                Err(ServiceError::InterfaceNotFound {
                    interface: interface.into(),
                }
                .to_wire()),
                false,
            );
        }
        // The process that connected must still be the one behind the connection.
        if let Err(e) = c.peer.still_same() {
            let err = ManagerError::PeerChanged {
                reason: e.to_string(),
            };
            return (Err(err.to_wire()), true);
        }
        match (kind, client) {
            (SocketKind::Api, Some(client)) => (self.api_call(client, method, call, fds), false),
            (SocketKind::Admin, _) => self.admin_call(method, call),
            (SocketKind::Api, None) => (Err(ServiceError::PermissionDenied {}.to_wire()), true),
        }
    }

    fn api_call(
        &mut self,
        client: u64,
        method: &str,
        call: &Call,
        mut fds: Vec<OwnedFd>,
    ) -> Result<Map<String, Value>, WireError> {
        let m = &mut self.manager;
        let wire = |e: ManagerError| e.to_wire();
        match method {
            "GetInfo" => m.info(client).map_err(wire).and_then(|r| encode(&r)),
            "ListOffloads" => m
                .list_offloads(client)
                .map_err(wire)
                .and_then(|r| encode(&r)),
            "RegisterRegion" => {
                let p: api::RegisterRegion = decode(call)?;
                let index = usize::try_from(p.fd).unwrap_or(usize::MAX);
                if index >= fds.len() {
                    return Err(wire(ManagerError::InvalidParameter {
                        parameter: "fd".into(),
                        reason: format!(
                            "fd index {} but {} file descriptors came with the call",
                            p.fd,
                            fds.len()
                        ),
                    }));
                }
                let fd = fds.swap_remove(index);
                let r = m.register_region(client, fd).map_err(wire)?;
                self.audit.event(
                    &Record::new(Event::RegionRegister, Severity::Notice)
                        .field("client", client)
                        .field("region", r.region)
                        .field("name", p.name.unwrap_or_default())
                        .field("size", r.size)
                        .res(true),
                );
                encode(&r)
            }
            "InstallOffload" => {
                let p: api::InstallOffload = decode(call)?;
                let name = p.offload.clone();
                match m.install(client, p) {
                    Ok(r) => {
                        self.audit.event(
                            &Record::new(Event::OffloadAdmit, Severity::Notice)
                                .field("client", client)
                                .field("offload", name)
                                .field("handle", r.handle)
                                .res(true),
                        );
                        encode(&r)
                    }
                    Err(e) => {
                        let rule = m.take_refused_rules();
                        let w = e.to_wire();
                        let reason = match &e {
                            ManagerError::PolicyDenied { reason } => reason.clone(),
                            _ => String::new(),
                        };
                        let mut rec = Record::new(Event::OffloadRefuse, Severity::Warning)
                            .field("client", client)
                            .field("offload", name)
                            .field("error", w.name.rsplit('.').next().unwrap_or_default());
                        if !rule.is_empty() {
                            rec = rec.field("rule", rule);
                        }
                        if !reason.is_empty() {
                            rec = rec.field("reason", reason);
                        }
                        self.audit.event(&rec.res(false));
                        Err(w)
                    }
                }
            }
            "Uninstall" => {
                let p: api::Uninstall = decode(call)?;
                m.uninstall(client, p.handle).map_err(wire)?;
                self.audit.event(
                    &Record::new(Event::Teardown, Severity::Notice)
                        .field("client", client)
                        .field("handle", p.handle)
                        .field("reason", "uninstall")
                        .res(true),
                );
                Ok(Map::new())
            }
            "Stats" => m.stats(client).map_err(wire).and_then(|r| encode(&r)),
            _ => Err(ServiceError::MethodNotFound {
                method: call.method.clone(),
            }
            .to_wire()),
        }
    }

    fn admin_call(
        &mut self,
        method: &str,
        call: &Call,
    ) -> (Result<Map<String, Value>, WireError>, bool) {
        let wire = |e: AdminError| e.to_wire();
        let m = &mut self.manager;
        let r = match method {
            "ListClients" => encode(&m.admin_clients()),
            "ListOffloads" => encode(&m.admin_offloads()),
            "ListDevices" => {
                let mut list = m.admin_devices();
                if let (Some(dp), Some(dev)) = (&self.dataplane, list.devices.first_mut()) {
                    dev.packet_drops = dp.packet_drops();
                    // The total of the same reading, so the two always agree.
                    dev.packets_dropped = dev.packet_drops.values().sum();
                }
                encode(&list)
            }
            "Dump" => decode::<api::Dump>(call)
                .and_then(|p| m.admin_dump(p.handle).map_err(wire))
                .and_then(|r| encode(&r)),
            "KillClient" => match decode::<api::KillClient>(call) {
                Ok(p) => match m.admin_kill(p.client) {
                    Ok(r) => {
                        self.audit.event(
                            &Record::new(Event::Kill, Severity::Warning)
                                .field("client", p.client)
                                .field("uninstalled", r.uninstalled)
                                .res(true),
                        );
                        let victims: Vec<usize> = self
                            .conns
                            .iter()
                            .filter(|(_, c)| c.client == Some(p.client))
                            .map(|(t, _)| *t)
                            .collect();
                        for t in victims {
                            if let Some(c) = self.conns.get_mut(&t) {
                                // Already forgotten by the manager: nothing to disconnect.
                                c.client = None;
                            }
                            self.close(t);
                        }
                        encode(&r)
                    }
                    Err(e) => Err(wire(e)),
                },
                Err(e) => Err(e),
            },
            "ReloadPolicy" => match self.reload("ReloadPolicy") {
                Ok(r) => encode(&r),
                Err(e) => Err(wire(e)),
            },
            "TestRun" => decode::<api::TestRun>(call).and_then(|p| {
                let trigger = parse_hex(&p.trigger).ok_or_else(|| {
                    ServiceError::InvalidParameter {
                        parameter: "trigger".into(),
                    }
                    .to_wire()
                })?;
                let r = self
                    .manager
                    .test_run(p.handle, &trigger, p.count)
                    .map_err(wire)?;
                encode(&r)
            }),
            "TriggerTimes" => decode::<api::TriggerTimes>(call).and_then(|p| {
                let r = self.manager.trigger_times(p.handle).map_err(wire)?;
                encode(&r)
            }),
            _ => Err(ServiceError::MethodNotFound {
                method: call.method.clone(),
            }
            .to_wire()),
        };
        (r, false)
    }

    /// `io.redn.Admin.Monitor`: with `more`, subscribe the connection (records and counters
    /// follow as replies with `continues`); without, `ExpectedMore`.
    fn monitor(&mut self, token: usize, call: &Call) {
        let admin = self
            .conns
            .get(&token)
            .is_some_and(|c| c.kind == SocketKind::Admin);
        let err = if !admin {
            Some(
                ServiceError::MethodNotFound {
                    method: call.method.clone(),
                }
                .to_wire(),
            )
        } else if !call.more {
            Some(ServiceError::ExpectedMore {}.to_wire())
        } else if !call.parameters.is_empty() {
            Some(
                ServiceError::InvalidParameter {
                    parameter: call.parameters.keys().next().cloned().unwrap_or_default(),
                }
                .to_wire(),
            )
        } else {
            None
        };
        if let Some(e) = err {
            self.send(token, error_reply(&e));
            return;
        }
        // The counters at once, then every second.
        self.monitors.insert(token, Instant::now());
        self.audit.set_tap(true);
        let first = stream_reply(&api::MonitorReply {
            record: None,
            counters: Some(self.monitor_counters()),
        });
        self.send(token, first);
    }

    fn send(&mut self, token: usize, bytes: Vec<u8>) {
        let max = self.manager.limits.max_pending_output;
        let Some(c) = self.conns.get_mut(&token) else {
            return;
        };
        c.output.push(&bytes);
        let over = if c.output.pending() > max {
            Some("unread-replies")
        } else if self.over_buffer_budget(token).is_some() {
            Some("buffered-bytes")
        } else {
            None
        };
        if let Some(reason) = over {
            if let Some(c) = self.conns.get(&token) {
                let r = Record::new(Event::Disconnect, Severity::Warning)
                    .peer(&c.peer.identity)
                    .field("reason", reason)
                    .res(false);
                self.audit.event(&r);
            }
            self.close(token);
            return;
        }
        self.flush(token);
    }

    fn flush(&mut self, token: usize) {
        let Some(c) = self.conns.get_mut(&token) else {
            return;
        };
        let Ok(done) = c.output.flush(&mut c.stream) else {
            self.close(token);
            return;
        };
        if done && c.close_after_flush {
            self.close(token);
            return;
        }
        if c.paused && c.output.pending() <= OUTPUT_HIGH_WATER {
            // Its replies are being read again: take its requests again.
            c.paused = false;
            self.unfinished.insert(token);
        }
        if done == c.wants_write {
            c.wants_write = !done;
            let interest = if done {
                Interest::READABLE
            } else {
                Interest::READABLE | Interest::WRITABLE
            };
            let _ = self
                .poll
                .registry()
                .reregister(&mut c.stream, Token(token), interest);
        }
    }
}

/// Whether the peer's process has exited (its pidfd polls readable).
fn exited(peer: &Peer) -> bool {
    let Some(fd) = &peer.pidfd else {
        return false;
    };
    let mut fds = [nix::poll::PollFd::new(
        fd.as_fd(),
        nix::poll::PollFlags::POLLIN,
    )];
    matches!(nix::poll::poll(&mut fds, nix::poll::PollTimeout::ZERO), Ok(n) if n > 0)
}

/// Bytes from hex (an even number of digits), at most 4096 bytes.
fn parse_hex(text: &str) -> Option<Vec<u8>> {
    if text.len() % 2 != 0 || text.len() > 8192 {
        return None;
    }
    (0..text.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(text.get(i..i + 2)?, 16).ok())
        .collect()
}

/// One reply of a `more` stream.
fn stream_reply<T: Serialize>(value: &T) -> Vec<u8> {
    let parameters = encode(value).unwrap_or_default();
    Reply {
        error: None,
        parameters,
        continues: true,
    }
    .encode()
}

fn error_reply(w: &WireError) -> Vec<u8> {
    Reply {
        error: Some(w.name.clone()),
        parameters: w.parameters.clone(),
        continues: false,
    }
    .encode()
}

fn encode<T: Serialize>(value: &T) -> Result<Map<String, Value>, WireError> {
    match serde_json::to_value(value) {
        Ok(Value::Object(m)) => Ok(m),
        _ => Ok(Map::new()),
    }
}

/// Decode a call's parameters; a missing, unknown or mistyped one is
/// `org.varlink.service.InvalidParameter` naming it.
fn decode<T: DeserializeOwned>(call: &Call) -> Result<T, WireError> {
    let value = Value::Object(call.parameters.clone());
    serde_path_to_error::deserialize(value).map_err(|e| {
        let path = e.path().to_string();
        let parameter = if path.is_empty() || path == "." {
            // An unknown or missing field: serde names it between backticks.
            let text = e.inner().to_string();
            text.split('`')
                .nth(1)
                .map_or_else(|| text.clone(), str::to_owned)
        } else {
            path
        };
        ServiceError::InvalidParameter { parameter }.to_wire()
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pidfd_tokens_have_a_range_of_their_own() {
        assert_eq!(pidfd_conn(PIDFD_BASE + FIRST_CONN), Some(FIRST_CONN));
        assert_eq!(pidfd_conn(FIRST_CONN), None, "a connection");
        assert_eq!(pidfd_conn(SIGNALS.0), None);
        // The data plane's tokens start at usize::MAX / 2.
        assert_eq!(pidfd_conn(usize::MAX / 2), None);
        assert_eq!(pidfd_conn(usize::MAX / 2 + 1), None);
    }

    #[test]
    fn test_run_triggers_are_even_hex() {
        assert_eq!(parse_hex("2a00ff"), Some(vec![0x2a, 0, 0xff]));
        assert_eq!(parse_hex(""), Some(vec![]));
        assert_eq!(parse_hex("2a0"), None, "odd length");
        assert_eq!(parse_hex("zz"), None);
        assert_eq!(parse_hex("é"), None, "not ASCII");
        assert_eq!(parse_hex(&"00".repeat(4097)), None, "over 4096 bytes");
    }
}
