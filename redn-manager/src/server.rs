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
//!
//! This file holds the loop itself (its turn, signals, reloads, the auditor's rounds and
//! `Monitor` feeds); `connection` accepts, reads and writes connections, and `calls`
//! decodes each call and hands it to the manager.

use crate::audit::{Audit, Event, Record, Severity};
use crate::auditor::Auditor;
use crate::dataplane::Dataplane;
use crate::heap_trim::HeapTrim;
use crate::outbox::Outbox;
use crate::peer::{Peer, Procfs};
use crate::state::Manager;
use mio::net::{UnixListener, UnixStream};
use mio::unix::SourceFd;
use mio::{Events, Interest, Poll, Token};
use nix::sys::signal::Signal;
use nix::sys::signalfd::SignalFd;
use redn_proto::api::{self, ADMIN, MANAGER};
use redn_proto::codec::MessageBuffer;
use redn_proto::errors::{AdminError, ManagerError, Named};
use redn_proto::idl;
use std::collections::{BTreeSet, HashMap, HashSet};
use std::io;
use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::time::{Duration, Instant};

mod calls;
use calls::{error_reply, stream_reply};
mod connection;

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
/// How soon the loop tries a listener again after `accept` failed for want of a resource
/// (`EMFILE`, `ENFILE`, `ENOBUFS`): the listeners are edge-triggered, so the connections
/// left in the backlog would otherwise wait for the next one to arrive.
const ACCEPT_RETRY: Duration = Duration::from_millis(100);

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
/// Messages one uid's app connections together may have handled per turn: four
/// connections' slices. Without it, a uid that spreads a backlog over the 1,024
/// connections it may open had 65,536 messages (a good part of a second) handled ahead of
/// everyone else's next turn. Admin connections (root, trusted) have only their own slice.
const UID_MESSAGES_PER_TURN: usize = 4 * MESSAGES_PER_TURN;
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
    /// Messages each uid's app connections may still have handled this turn (a uid not
    /// here has its whole [`UID_MESSAGES_PER_TURN`]).
    uid_turn_left: HashMap<u32, usize>,
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
    /// Listeners (by index) whose last `accept` failed with connections maybe left in
    /// their backlogs: tried again every [`ACCEPT_RETRY`].
    accept_stalled: BTreeSet<usize>,
    /// Freed heap memory handed back to the kernel after teardowns.
    heap_trim: HeapTrim,
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
        let nic_objects = held_objects(&manager);
        let mut mio_listeners = Vec::new();
        for (i, (l, kind)) in listeners.into_iter().enumerate() {
            l.set_nonblocking(true)?;
            // Accepted connections inherit it: every write a peer makes then carries its
            // writer's pid (and a write made before the accept always does), so bytes from
            // any process but the one identified at accept are told apart (see `read`).
            nix::sys::socket::setsockopt(&l, nix::sys::socket::sockopt::PassCred, &true)
                .map_err(io::Error::from)?;
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
            uid_turn_left: HashMap::new(),
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
            accept_stalled: BTreeSet::new(),
            heap_trim: HeapTrim::new(nic_objects, Instant::now()),
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
        self.accept_stalled.clear();
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
        let accepts_stalled = !self.accept_stalled.is_empty()
            || self
                .dataplane
                .as_ref()
                .is_some_and(Dataplane::accept_stalled);
        if accepts_stalled {
            wake = Some(wake.map_or(ACCEPT_RETRY, |w| w.min(ACCEPT_RETRY)));
        }
        if let Some(trim) = self.heap_trim.wake_in(Instant::now()) {
            wake = Some(wake.map_or(trim, |w| w.min(trim)));
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
        self.uid_turn_left.clear();
        if accepts_stalled {
            // No edge will come for what is already in a backlog: look again.
            for index in self.accept_stalled.clone() {
                ready.push((FIRST_LISTENER + index, true, false));
            }
            if self
                .dataplane
                .as_ref()
                .is_some_and(Dataplane::accept_stalled)
            {
                ready.push((crate::dataplane::FIRST_TOKEN, true, false));
            }
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
            self.audit_if_due();
        }
        if let Some(dp) = &mut self.dataplane {
            // Remote clients of offloads uninstalled in this turn lose their instances.
            dp.reap(self.poll.registry(), &mut self.manager, &mut self.audit);
        }
        self.audit_round();
        self.heap_trim
            .after_turn(held_objects(&self.manager), Instant::now());
        Ok(())
    }

    /// An auditor round if one is due, then the records of what the manager did.
    fn audit_round(&mut self) {
        self.audit_if_due();
        self.drain_manager_records();
        self.audit.flush();
        self.feed_monitors();
    }

    /// An auditor round if one is due. Also between the events of a turn: a turn may
    /// carry many hellos, each installing an instance, and the auditor's cadence must not
    /// wait for all of them (a hello flood with a valid token would otherwise stretch its
    /// rounds to one a turn).
    fn audit_if_due(&mut self) {
        let clock = redn_sys::clock::SystemClock;
        if self.auditor.due(clock) {
            self.manager.audit_round(&mut self.auditor, clock);
        }
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
            heap_in_use: crate::heap_trim::heap_in_use(),
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

/// The NIC objects the manager holds (protection domains, regions, CQs, QPs): fewer than at
/// the last turn means something was torn down.
fn held_objects(manager: &Manager) -> usize {
    let o = manager.nic().objects();
    o.pds + o.regions + o.cqs + o.qps
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
}
