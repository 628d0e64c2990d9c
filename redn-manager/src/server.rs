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

use crate::audit::{Audit, Severity};
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
const FIRST_LISTENER: usize = 1;
const FIRST_CONN: usize = 16;
/// Reads one connection may do per wakeup before others get a turn.
const READS_PER_TURN: usize = 16;

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
    output: Vec<u8>,
    written: usize,
    close_after_flush: bool,
    window_start: Instant,
    window_requests: u32,
    wants_write: bool,
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
        })
    }

    /// The manager state.
    pub fn manager(&self) -> &Manager {
        &self.manager
    }

    /// Open connections.
    pub fn connections(&self) -> usize {
        self.conns.len()
    }

    /// Serve until SIGTERM or SIGINT; then uninstall everything.
    ///
    /// # Errors
    /// If polling fails.
    pub fn run(&mut self) -> io::Result<()> {
        while !self.stop {
            self.turn(None)?;
        }
        self.audit.record(
            Severity::Notice,
            &format!(
                "event=shutdown connections={} offloads={}",
                self.conns.len(),
                self.manager.installed_count()
            ),
        );
        self.manager.shutdown();
        Ok(())
    }

    /// One round of the loop: wait at most `timeout` for events (not at all if a
    /// connection has unread input left over) and handle them.
    ///
    /// # Errors
    /// If polling fails.
    pub fn turn(&mut self, timeout: Option<Duration>) -> io::Result<()> {
        let mut events = Events::with_capacity(256);
        let timeout = if self.unfinished.is_empty() {
            timeout
        } else {
            Some(Duration::ZERO)
        };
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
        for (token, readable, writable) in ready {
            if token == SIGNALS.0 {
                self.handle_signals();
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
        Ok(())
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
                Some(Signal::SIGHUP) => match self.manager.reload_policy() {
                    Ok(r) => self.audit.record(
                        Severity::Notice,
                        &format!("event=reload res=success apps={}", r.apps),
                    ),
                    Err(e) => self.audit.record(
                        Severity::Warning,
                        &format!("event=reload res=failed {}", e.to_wire()),
                    ),
                },
                Some(Signal::SIGTERM | Signal::SIGINT) => self.stop = true,
                _ => {}
            }
        }
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
                    self.audit.record(
                        Severity::Warning,
                        &format!("event=accept res=failed error={e}"),
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
                self.audit.record(
                    Severity::Warning,
                    &format!("event=connect res=refused reason=\"{e}\""),
                );
                return;
            }
        };
        let uid = peer.identity.uid;
        let limits = self.manager.limits;
        let same_uid = self
            .conns
            .values()
            .filter(|c| c.peer.identity.uid == uid)
            .count();
        let refusal = if self.conns.len() >= limits.max_connections {
            Some(("connections", limits.max_connections, self.conns.len()))
        } else if same_uid >= limits.max_connections_per_uid {
            Some((
                "connections-per-uid",
                limits.max_connections_per_uid,
                same_uid,
            ))
        } else {
            None
        };
        if let Some((resource, limit, held)) = refusal {
            self.counters.refused += 1;
            let err = ManagerError::QuotaExceeded {
                resource: resource.into(),
                limit: limit as u64,
                requested: held as u64 + 1,
            };
            // Best effort: a fresh socket's buffer takes one short reply.
            let _ = stream.write(&error_reply(&err.to_wire()));
            self.audit.record(
                Severity::Warning,
                &format!(
                    "event=connect res=refused uid={uid} pid={} reason={resource}",
                    peer.identity.pid
                ),
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
            self.audit.record(
                Severity::Warning,
                &format!("event=connect res=failed error={e}"),
            );
            return;
        }
        let client = (kind == SocketKind::Api).then(|| self.manager.connect(peer.identity.clone()));
        if let Some(id) = client {
            let adopted = self.manager.adopt(id);
            if adopted > 0 {
                self.audit.record(
                    Severity::Notice,
                    &format!("event=adopt client={id} uid={uid} offloads={adopted}"),
                );
            }
        }
        self.audit.record(
            Severity::Info,
            &format!(
                "event=connect socket={kind:?} client={} uid={uid} pid={} exe={}",
                client.unwrap_or(0),
                peer.identity.pid,
                peer.exe().display()
            ),
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
                output: Vec::new(),
                written: 0,
                close_after_flush: false,
                window_start: Instant::now(),
                window_requests: 0,
                wants_write: false,
            },
        );
        // Data sent before the accept is reported by the first poll (edge triggers on
        // registration when data is already there).
    }

    fn close(&mut self, token: usize) {
        if let Some(mut c) = self.conns.remove(&token) {
            let _ = self.poll.registry().deregister(&mut c.stream);
            if let Some(client) = c.client {
                let removed = self.manager.disconnect(client);
                self.audit.record(
                    Severity::Info,
                    &format!(
                        "event=disconnect client={client} pid={} uninstalled={removed}",
                        c.peer.identity.pid
                    ),
                );
            }
        }
        self.unfinished.remove(&token);
    }

    fn read(&mut self, token: usize) {
        let mut buf = std::mem::take(&mut self.scratch);
        self.read_with(token, &mut buf);
        self.scratch = buf;
    }

    fn read_with(&mut self, token: usize, buf: &mut [u8]) {
        let max_fds = self.manager.limits.codec.max_fds;
        for _ in 0..READS_PER_TURN {
            let Some(c) = self.conns.get_mut(&token) else {
                return;
            };
            if c.close_after_flush {
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
            self.drain_messages(token);
        }
        self.unfinished.insert(token);
    }

    fn drain_messages(&mut self, token: usize) {
        loop {
            let Some(c) = self.conns.get_mut(&token) else {
                return;
            };
            if c.close_after_flush {
                return;
            }
            match c.input.next_message() {
                None => return,
                Some(Err(e)) => {
                    let reason = e.to_string();
                    self.violation(token, "message-size", reason, true);
                    return;
                }
                Some(Ok(msg)) => self.handle_message(token, &msg),
            }
        }
    }

    /// Answer a protocol violation; close after the reply if `fatal`.
    fn violation(&mut self, token: usize, limit: &str, reason: String, fatal: bool) {
        self.audit.record(
            Severity::Warning,
            &format!("event=protocol-violation limit={limit} reason=\"{reason}\""),
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
            }
            self.flush(token);
        }
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
                self.audit.record(
                    Severity::Notice,
                    &format!(
                        "event=region-register client={client} region={} name={:?} size={}",
                        r.region,
                        p.name.unwrap_or_default(),
                        r.size
                    ),
                );
                encode(&r)
            }
            "InstallOffload" => {
                let p: api::InstallOffload = decode(call)?;
                let name = p.offload.clone();
                match m.install(client, p) {
                    Ok(r) => {
                        self.audit.record(Severity::Notice, &format!("event=offload-admit client={client} offload={name} handle={} res=success", r.handle));
                        encode(&r)
                    }
                    Err(e) => {
                        let w = e.to_wire();
                        self.audit.record(
                            Severity::Warning,
                            &format!(
                                "event=offload-refuse client={client} offload={name} error={}",
                                w.name
                            ),
                        );
                        Err(w)
                    }
                }
            }
            "Uninstall" => {
                let p: api::Uninstall = decode(call)?;
                m.uninstall(client, p.handle).map_err(wire)?;
                self.audit.record(
                    Severity::Notice,
                    &format!(
                        "event=offload-uninstall client={client} handle={}",
                        p.handle
                    ),
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
            "Dump" => decode::<api::Dump>(call)
                .and_then(|p| m.admin_dump(p.handle).map_err(wire))
                .and_then(|r| encode(&r)),
            "KillClient" => match decode::<api::KillClient>(call) {
                Ok(p) => match m.admin_kill(p.client) {
                    Ok(r) => {
                        self.audit.record(
                            Severity::Warning,
                            &format!(
                                "event=kill client={} uninstalled={}",
                                p.client, r.uninstalled
                            ),
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
            "ReloadPolicy" => match self.manager.reload_policy() {
                Ok(r) => {
                    self.audit.record(
                        Severity::Notice,
                        &format!("event=reload res=success apps={}", r.apps),
                    );
                    encode(&r)
                }
                Err(e) => {
                    self.audit.record(
                        Severity::Warning,
                        &format!("event=reload res=failed {}", e.to_wire()),
                    );
                    Err(wire(e))
                }
            },
            _ => Err(ServiceError::MethodNotFound {
                method: call.method.clone(),
            }
            .to_wire()),
        };
        (r, false)
    }

    fn send(&mut self, token: usize, bytes: Vec<u8>) {
        let max = self.manager.limits.max_pending_output;
        let Some(c) = self.conns.get_mut(&token) else {
            return;
        };
        c.output.extend_from_slice(&bytes);
        if c.output.len() - c.written > max {
            self.audit.record(
                Severity::Warning,
                &format!(
                    "event=disconnect reason=unread-replies pid={}",
                    c.peer.identity.pid
                ),
            );
            self.close(token);
            return;
        }
        self.flush(token);
    }

    fn flush(&mut self, token: usize) {
        let Some(c) = self.conns.get_mut(&token) else {
            return;
        };
        while c.written < c.output.len() {
            match c.stream.write(&c.output[c.written..]) {
                Ok(0) => break,
                Ok(n) => c.written += n,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(_) => {
                    self.close(token);
                    return;
                }
            }
        }
        let done = c.written == c.output.len();
        if done {
            c.output.clear();
            c.written = 0;
            if c.close_after_flush {
                self.close(token);
                return;
            }
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
