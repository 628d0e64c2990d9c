//! The data plane: remote clients of installed offloads, each served by the NIC on queues of
//! its own.
//!
//! A TCP listener at `[dataplane] listen` is served from the manager's event loop
//! ([`crate::server`]); no thread per client. A remote client writes a
//! [`redn_proto::dataplane::Hello`] (handle, token, its RoCEv2 exchange record); the hello
//! is buffered up to its capped length and checked field by field, the token compared in
//! constant time and its age against the app's `token_lifetime`
//! ([`Manager::remote_client_spec`]), the client's address checked against
//! the app's `remote_sources` (if its rule has them), the client's record checked (its RoCE
//! address must be the address the hello came from, so nobody can aim the manager's
//! traffic at a third host, nor at the manager's own endpoint; its `response` region must
//! be large enough), and the app's
//! `max_remote_clients` counted. Then the offload is installed once more for this client
//! alone through `redn_sys::install::install`: its own managed queues, receive ring and
//! code region, its own two protection domains, the client-facing queue connected over
//! RoCEv2 to the client's queue pair and the response bound to the client's buffer. The
//! answer carries the manager's record: its QP and the app's data regions by name,
//! address and length, without keys (only the offload reads them).
//!
//! The TCP connection stays open while the client is served: when it closes (or sends
//! anything after its hello, or the app uninstalls the offload, or TCP keepalive finds the
//! client's host gone) the client's instance is released. A refusal is a named [`Refusal`] in the answer, the connection is closed after
//! it, and the loop goes on serving everyone else.
//!
//! The softnic's RoCEv2 endpoints (one per local IPv4 address clients come in on, bound to
//! an ephemeral UDP port that the records carry) run their own receive threads, as they
//! always do; past four, one with no client left is dropped (`Dataplane::reap_endpoint`),
//! and all share one cap on their peer sockets (`PeerBudget`).

use crate::audit::{Audit, Event, Record, Severity};
use crate::auditor::AppKey;
use crate::state::{DynNic, Manager};
use mio::net::{TcpListener, TcpStream};
use mio::{Interest, Registry, Token};
use redn_policy::Token as OffloadToken;
use redn_program::program::{Iterations, RegionRole};
use redn_proto::dataplane::{Accepted, Answer, Hello, Refusal};
use redn_sys::install::{install, Installed, RegionBinding};
use redn_sys::softnic::roce::io::PeerBudget;
use redn_sys::softnic::roce::{QpRecord, RegionRecord, RoceConfig, RoceEndpoint};
use redn_sys::softnic::SoftNic;
use std::collections::HashMap;
use std::io::{self, Read};
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::sync::Arc;
use std::time::Instant;

mod slots;
use slots::Eviction;

/// The listener's token; connections take the ones after it. Far above the tokens of the
/// Unix-socket connections, so the two never meet.
pub const FIRST_TOKEN: usize = usize::MAX / 2;
/// RoCE endpoints kept open with no remote client on them, at most (see
/// `Dataplane::reap_endpoint`): a data plane listening at one address has one, which stays.
const IDLE_ENDPOINTS: usize = 4;
/// Connections that have not finished their hello; past this, the oldest is dropped.
const MAX_PENDING: usize = 64;
/// Remote rights bit for WRITE in an exchange record.
const RIGHT_WRITE: u32 = 2;
/// RNR retries of the queues that answer a remote client (its record's `rnr_retry`). Not 7,
/// which RoCE reads as "retry for ever": an answer's receiver is the client, and a client
/// answering every retry with an RNR NAK (legal for a WRITE with immediate) kept its
/// instance's queue retransmitting for as long as it liked, at the NAK's own timer. Three
/// retries, as for a peer that is merely slow to post its receives.
const REMOTE_CLIENT_RNR_RETRY: u8 = 3;
/// TCP keepalive: probes after this many idle seconds, this often, this many times, so the
/// instance of a client whose host vanished is released within about two minutes.
const KEEPALIVE: (u32, u32, u32) = (60, 10, 6);

/// Turn TCP keepalive on for a client's connection (best effort: a failure leaves the
/// connection to be closed by its client or an uninstall).
fn keepalive(stream: &TcpStream) {
    use nix::sys::socket::{setsockopt, sockopt};
    let (idle, interval, count) = KEEPALIVE;
    let _ = setsockopt(stream, sockopt::KeepAlive, &true)
        .and_then(|()| setsockopt(stream, sockopt::TcpKeepIdle, &idle))
        .and_then(|()| setsockopt(stream, sockopt::TcpKeepInterval, &interval))
        .and_then(|()| setsockopt(stream, sockopt::TcpKeepCount, &count));
}

/// Whose instance a connection holds. The instance itself (its queues, keys, code region)
/// is the offload's record's in the manager ([`Manager::attach_remote`]), so that its
/// counters show in `Stats` and it goes with an uninstall.
struct RemoteInstance {
    handle: u64,
    /// The app rule's name, for records.
    app: String,
    /// The app rule's number: whose `max_remote_clients` slots this session takes. Not the
    /// name: a reload that gives the name to other processes makes it another tenant's
    /// rule, and the old tenant's sessions must not take the new tenant's slots.
    app_key: AppKey,
    offload: String,
}

impl RemoteInstance {
    /// A record about this instance (the data plane's `id` of it) of the client at `peer`.
    fn record(&self, kind: Event, severity: Severity, id: usize, peer: SocketAddr) -> Record {
        Record::new(kind, severity)
            .field("handle", self.handle)
            .field("app", &self.app)
            .field("offload", &self.offload)
            .field("instance", id)
            .field("peer", peer)
    }
}

/// A hello accepted: the client's instance, installed, and the answer to send; with them,
/// when the app was at `max_remote_clients`, the session that makes room (its connection's
/// token, and why: see `Dataplane::make_room`).
struct Served {
    instance: RemoteInstance,
    installed: Installed<DynNic>,
    accepted: Accepted,
    evict: Option<Eviction>,
}

/// The `remote-connect` record of a refusal: who (if known), which refusal, why.
fn refusal_record(peer: Option<SocketAddr>, error: &str, reason: &str) -> Record {
    let r = Record::new(Event::RemoteConnect, Severity::Warning);
    let r = match peer {
        Some(p) => r.field("peer", p),
        None => r,
    };
    r.field("error", error).field("reason", reason).res(false)
}

struct Conn {
    stream: TcpStream,
    peer: SocketAddr,
    local: SocketAddr,
    input: Vec<u8>,
    output: Vec<u8>,
    written: usize,
    close_after_flush: bool,
    instance: Option<RemoteInstance>,
    /// Accept order, to find the oldest pending connection.
    serial: u64,
}

/// The data plane's listener, connections and RoCE endpoints.
pub struct Dataplane {
    listener: TcpListener,
    addr: SocketAddr,
    nic: Arc<SoftNic>,
    endpoints: HashMap<Ipv4Addr, RoceEndpoint>,
    /// The caps of the endpoints' peer sockets, shared: at most `MAX_PEER_SOCKETS` over
    /// all of them (what the fd budget keeps back, `Limits::fit_fds`), and one host's share
    /// over all of them, however many local addresses clients come in on.
    peer_budget: Arc<PeerBudget>,
    /// Datagrams dropped by endpoints since reaped, by reason and in all (the counts an
    /// operator reads do not go back).
    retired_drops: std::collections::BTreeMap<String, u64>,
    retired_dropped: u64,
    conns: HashMap<usize, Conn>,
    next_token: usize,
    serial: u64,
    psn_seed: u32,
    /// Connections in all (pending and served).
    max_connections: usize,
    /// The last `accept` failed (not for an empty backlog): connections may wait in the
    /// backlog with no edge to come for them.
    accept_stalled: bool,
    /// Per app and address, the sessions that took their slots by the address or the tenure
    /// rule in the last [`slots::ADDRESS_WIN_HOLD`], and when (older ones are dropped at each look).
    address_wins: HashMap<(AppKey, IpAddr), Vec<(usize, Instant)>>,
    /// Per app and address whose session gave its slot up by the tenure rule, until when
    /// that address may not take one by it: else the evicted client's next hello would
    /// evict the next session held longest, and that one's the next, one newcomer setting
    /// off a chain of evictions through every slot.
    tenure_losses: HashMap<(AppKey, IpAddr), Instant>,
}

impl std::fmt::Debug for Dataplane {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Dataplane")
            .field("addr", &self.addr)
            .field("connections", &self.conns.len())
            .finish_non_exhaustive()
    }
}

fn refuse(r: Refusal, reason: impl Into<String>) -> (Refusal, String) {
    (r, reason.into())
}

impl Dataplane {
    /// Listen at `addr` (IPv4: the softnic's RoCEv2 speaks IPv4) for remote clients of
    /// offloads installed on `nic`.
    ///
    /// # Errors
    /// An IPv6 address, or the bind failing.
    pub fn bind(addr: SocketAddr, nic: Arc<SoftNic>) -> io::Result<Dataplane> {
        if addr.is_ipv6() {
            return Err(io::Error::new(
                io::ErrorKind::Unsupported,
                "the softnic's RoCEv2 speaks IPv4: give [dataplane] listen an IPv4 address",
            ));
        }
        let listener = TcpListener::bind(addr)?;
        let addr = listener.local_addr()?;
        // Start PSNs an off-path sender cannot guess from the clock.
        let mut seed = [0u8; 4];
        std::fs::File::open("/dev/urandom")?.read_exact(&mut seed)?;
        let psn_seed = u32::from_ne_bytes(seed);
        Ok(Dataplane {
            listener,
            addr,
            nic,
            endpoints: HashMap::new(),
            peer_budget: PeerBudget::new(),
            retired_drops: std::collections::BTreeMap::new(),
            retired_dropped: 0,
            conns: HashMap::new(),
            next_token: FIRST_TOKEN + 1,
            serial: 0,
            psn_seed,
            max_connections: crate::state::Limits::default().max_dataplane_connections,
            accept_stalled: false,
            address_wins: HashMap::new(),
            tenure_losses: HashMap::new(),
        })
    }

    /// Hold at most `max` connections (pending and served); more are closed at accept.
    pub fn set_max_connections(&mut self, max: usize) {
        self.max_connections = max;
    }

    /// The address it listens at (with the port the kernel chose for port 0).
    pub fn local_addr(&self) -> SocketAddr {
        self.addr
    }

    /// Remote clients being served.
    pub fn served(&self) -> usize {
        self.conns.values().filter(|c| c.instance.is_some()).count()
    }

    /// RoCE datagrams its endpoints dropped, by reason (those with a count), over every
    /// endpoint: what an operator reads to tell a hostile or broken sender from loss.
    pub fn packet_drops(&self) -> std::collections::BTreeMap<String, u64> {
        let mut drops = self.retired_drops.clone();
        for ep in self.endpoints.values() {
            for (why, n) in ep.drops().snapshot() {
                if n > 0 {
                    *drops.entry(why.name().to_owned()).or_insert(0) += n;
                }
            }
        }
        drops
    }

    /// RoCE datagrams its endpoints dropped, for every reason (what `Monitor` reports each
    /// second: a sum of counters, without the by-reason map).
    pub fn packets_dropped(&self) -> u64 {
        self.retired_dropped
            + self
                .endpoints
                .values()
                .map(|ep| ep.drops().total())
                .sum::<u64>()
    }

    /// Whether the last `accept` failed with connections maybe left in the backlog: the
    /// server's loop then offers the listener's token again in a moment.
    pub fn accept_stalled(&self) -> bool {
        self.accept_stalled
    }

    /// Register the listener with the event loop.
    ///
    /// # Errors
    /// If epoll refuses it.
    pub fn register(&mut self, registry: &Registry) -> io::Result<()> {
        registry.register(&mut self.listener, Token(FIRST_TOKEN), Interest::READABLE)
    }

    /// Handle readiness of `token` (the listener or a connection).
    pub fn ready(
        &mut self,
        registry: &Registry,
        token: usize,
        readable: bool,
        writable: bool,
        manager: &mut Manager,
        audit: &mut Audit,
    ) {
        if token == FIRST_TOKEN {
            self.accept_all(registry, manager, audit);
            return;
        }
        if writable {
            self.flush(registry, token, manager, audit);
        }
        if readable {
            self.read(registry, token, manager, audit);
        }
    }

    /// Release the instances of offloads no longer installed (uninstalled, or their app
    /// killed) and close those clients' connections, and those of clients whose own
    /// instance the auditor terminated.
    pub fn reap(&mut self, registry: &Registry, manager: &mut Manager, audit: &mut Audit) {
        let gone: Vec<(usize, &'static str)> = self
            .conns
            .iter()
            .filter_map(|(t, c)| {
                let i = c.instance.as_ref()?;
                if !manager.has_offload(i.handle) {
                    Some((*t, "offload uninstalled"))
                } else if manager.has_remote(i.handle, *t as u64) {
                    None
                } else if manager.take_failed_remote(i.handle, *t as u64) {
                    Some((*t, "its queues failed"))
                } else {
                    Some((*t, "instance terminated by the auditor"))
                }
            })
            .collect();
        for (t, why) in gone {
            self.close(registry, t, manager, audit, why);
        }
    }

    /// End the session holding instance `instance` of offload `handle` for an
    /// administrator (`io.redn.Admin.DisconnectRemote`, `BanRemote`): its connection closed
    /// and its instance released, with a `remote-exit` record saying `why`; false if no such
    /// session.
    pub fn disconnect(
        &mut self,
        registry: &Registry,
        (handle, instance): (u64, u64),
        manager: &mut Manager,
        audit: &mut Audit,
        why: &str,
    ) -> bool {
        let Ok(token) = usize::try_from(instance) else {
            return false;
        };
        let held = self
            .conns
            .get(&token)
            .and_then(|c| c.instance.as_ref())
            .is_some_and(|i| i.handle == handle);
        if held {
            self.close(registry, token, manager, audit, why);
        }
        held
    }

    /// Release every instance (shutdown).
    pub fn shutdown(&mut self, registry: &Registry, manager: &mut Manager, audit: &mut Audit) {
        let all: Vec<usize> = self.conns.keys().copied().collect();
        for t in all {
            self.close(registry, t, manager, audit, "manager shutting down");
        }
    }

    fn accept_all(&mut self, registry: &Registry, manager: &mut Manager, audit: &mut Audit) {
        loop {
            let (mut stream, peer) = match self.listener.accept() {
                Ok(s) => s,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                    self.accept_stalled = false;
                    return;
                }
                // A signal, or a connection reset while it waited in the backlog.
                Err(e)
                    if matches!(
                        e.kind(),
                        io::ErrorKind::Interrupted | io::ErrorKind::ConnectionAborted
                    ) =>
                {
                    continue
                }
                Err(e) => {
                    // EMFILE and the like: the rest stay in the backlog until the server's
                    // loop tries again (`accept_stalled`), said once a stall.
                    if !self.accept_stalled {
                        audit.event(&refusal_record(None, "AcceptFailed", &e.to_string()));
                    }
                    self.accept_stalled = true;
                    return;
                }
            };
            if self.conns.len() >= self.max_connections {
                let reason = format!("the data plane holds {} connections", self.max_connections);
                audit.event(&refusal_record(Some(peer), "TooManyConnections", &reason));
                continue; // dropping the stream closes it
            }
            let pending: Vec<(u64, usize)> = self
                .conns
                .iter()
                .filter(|(_, c)| c.instance.is_none() && !c.close_after_flush)
                .map(|(t, c)| (c.serial, *t))
                .collect();
            if pending.len() >= MAX_PENDING {
                if let Some(&(_, oldest)) = pending.iter().min() {
                    self.close(
                        registry,
                        oldest,
                        manager,
                        audit,
                        "hello not finished in time",
                    );
                }
            }
            let local = match stream.local_addr() {
                Ok(a) => a,
                Err(_) => continue,
            };
            let token = self.next_token;
            self.next_token += 1;
            if registry
                .register(&mut stream, Token(token), Interest::READABLE)
                .is_err()
            {
                continue;
            }
            let _ = stream.set_nodelay(true);
            keepalive(&stream);
            self.serial += 1;
            self.conns.insert(
                token,
                Conn {
                    stream,
                    peer,
                    local,
                    input: Vec::new(),
                    output: Vec::new(),
                    written: 0,
                    close_after_flush: false,
                    instance: None,
                    serial: self.serial,
                },
            );
        }
    }

    fn close(
        &mut self,
        registry: &Registry,
        token: usize,
        manager: &mut Manager,
        audit: &mut Audit,
        why: &str,
    ) {
        if let Some(mut c) = self.conns.remove(&token) {
            let _ = registry.deregister(&mut c.stream);
            if let Some(i) = c.instance.take() {
                manager.detach_remote(i.handle, token as u64);
                // Released for a failed queue and closed before the reap said so: forgotten.
                manager.take_failed_remote(i.handle, token as u64);
                audit.event(
                    &i.record(Event::RemoteExit, Severity::Info, token, c.peer)
                        .field("reason", why),
                );
            }
            self.reap_endpoint(c.local);
        }
    }

    /// Drop the RoCE endpoint of local address `local` if no remote client is served on it
    /// and more than [`IDLE_ENDPOINTS`] endpoints are open. Listening on every address,
    /// the data plane makes an endpoint (a socket, an epoll set, a receive thread) for each
    /// local address a hello comes in on, and a local client can reach 16 million of them
    /// (127/8): kept for ever, 100 hellos at 100 addresses, each closed, left the manager
    /// 200 more files and 100 more threads.
    fn reap_endpoint(&mut self, local: SocketAddr) {
        let IpAddr::V4(ip) = local.ip() else {
            return;
        };
        if self.endpoints.len() <= IDLE_ENDPOINTS
            || self
                .conns
                .values()
                .any(|c| c.instance.is_some() && c.local.ip() == local.ip())
        {
            return;
        }
        let Some(ep) = self.endpoints.remove(&ip) else {
            return;
        };
        for (why, n) in ep.drops().snapshot() {
            if n > 0 {
                *self.retired_drops.entry(why.name().to_owned()).or_insert(0) += n;
            }
        }
        self.retired_dropped += ep.drops().total();
        // Its drop joins its receive thread, which naps up to 10 ms: not on the event loop
        // (where the thread cannot be started, the closure and the endpoint are dropped
        // here).
        let _ = std::thread::Builder::new()
            .name("redn-ep-reap".into())
            .spawn(move || drop(ep));
    }

    fn read(
        &mut self,
        registry: &Registry,
        token: usize,
        manager: &mut Manager,
        audit: &mut Audit,
    ) {
        let mut buf = [0u8; 4096];
        loop {
            let Some(c) = self.conns.get_mut(&token) else {
                return;
            };
            match c.stream.read(&mut buf) {
                Ok(0) => {
                    self.close(
                        registry,
                        token,
                        manager,
                        audit,
                        "client closed the connection",
                    );
                    return;
                }
                Ok(n) => {
                    if c.instance.is_some() || c.close_after_flush {
                        self.close(registry, token, manager, audit, "bytes after the hello");
                        return;
                    }
                    c.input.extend_from_slice(&buf[..n]);
                    match Hello::frame_len(&c.input) {
                        Ok(None) => {}
                        Ok(Some(len)) if c.input.len() < len => {}
                        Ok(Some(len)) if c.input.len() > len => {
                            let e = refuse(Refusal::InvalidHello, "bytes after the hello");
                            self.answer(registry, token, Err(e), manager, audit);
                        }
                        Ok(Some(_)) => {
                            let input = std::mem::take(&mut c.input);
                            self.hello(registry, token, &input, manager, audit);
                        }
                        Err(e) => {
                            let e = refuse(Refusal::InvalidHello, e.to_string());
                            self.answer(registry, token, Err(e), manager, audit);
                        }
                    }
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(_) => {
                    self.close(registry, token, manager, audit, "connection failed");
                    return;
                }
            }
        }
    }

    fn hello(
        &mut self,
        registry: &Registry,
        token: usize,
        bytes: &[u8],
        manager: &mut Manager,
        audit: &mut Audit,
    ) {
        let peer = self.conns.get(&token).map(|c| c.peer);
        let result = self.serve(token, bytes, manager).and_then(|served| {
            let attached = peer.is_some_and(|peer| {
                let handle = served.instance.handle;
                manager.attach_remote(handle, token as u64, peer, served.installed)
            });
            if attached {
                Ok((served.instance, served.accepted, served.evict))
            } else {
                Err(refuse(Refusal::AccessDenied, "the offload was uninstalled"))
            }
        });
        let answer = match result {
            Ok((instance, accepted, evict)) => {
                // The newcomer is installed: only now does the idle client make room.
                if let Some(e) = evict {
                    let loser = self.conns.get(&e.session).map(|c| c.peer.ip());
                    self.close(registry, e.session, manager, audit, &e.why);
                    let winner = peer.map(|p| (token, p.ip()));
                    self.remember(&e, instance.app_key, winner, loser);
                }
                if let Some(c) = self.conns.get_mut(&token) {
                    audit.event(
                        &instance
                            .record(Event::RemoteConnect, Severity::Notice, token, c.peer)
                            .res(true),
                    );
                    c.instance = Some(instance);
                }
                Ok(accepted)
            }
            Err(e) => Err(e),
        };
        self.answer(registry, token, answer, manager, audit);
    }

    /// Check the hello and install the client's instance.
    fn serve(
        &mut self,
        token: usize,
        bytes: &[u8],
        manager: &Manager,
    ) -> Result<Served, (Refusal, String)> {
        let (peer, local) = match self.conns.get(&token) {
            Some(c) => (c.peer, c.local),
            None => return Err(refuse(Refusal::InvalidHello, "connection gone")),
        };
        let hello =
            Hello::decode(bytes).map_err(|e| refuse(Refusal::InvalidHello, e.to_string()))?;
        let theirs = QpRecord::decode(&hello.record)
            .map_err(|e| refuse(Refusal::InvalidHello, format!("record: {e}")))?;
        let spec = manager
            .remote_client_spec(hello.handle, &OffloadToken::from_bytes(hello.token))
            .ok_or_else(|| {
                refuse(
                    Refusal::AccessDenied,
                    "no offload with that handle and token",
                )
            })?;
        let Some(rule) = spec.rule else {
            return Err(refuse(
                Refusal::AccessDenied,
                format!("app rule {:?} is no longer in the policy", spec.app),
            ));
        };
        if !rule.admits_source(peer.ip()) {
            return Err(refuse(
                Refusal::SourceNotAllowed,
                format!(
                    "app {:?} takes remote clients only from its remote_sources, not {}",
                    spec.app,
                    peer.ip()
                ),
            ));
        }
        // After the token, like the sources: a wrong token learns nothing of bans either.
        if let Some(reason) = manager.remote_ban_refusal(spec.app, spec.app_key, peer.ip()) {
            return Err(refuse(Refusal::Banned, reason));
        }
        if IpAddr::V4(*theirs.addr.ip()) != peer.ip() {
            return Err(refuse(
                Refusal::InvalidHello,
                format!(
                    "record addr: {} is not the address the hello came from ({})",
                    theirs.addr.ip(),
                    peer.ip()
                ),
            ));
        }
        let response = theirs.region("response").ok_or_else(|| {
            refuse(
                Refusal::InvalidHello,
                "record: no region named \"response\"",
            )
        })?;
        let min_len = spec
            .program
            .regions
            .iter()
            .find(|r| matches!(r.role, RegionRole::Response))
            .map_or(0, |r| r.min_len);
        if response.len < min_len || response.rights & RIGHT_WRITE == 0 {
            return Err(refuse(
                Refusal::InvalidHello,
                format!(
                    "record region \"response\": {} bytes with rights {:#x}; the offload \
                     writes up to {min_len} bytes, so it needs that many and WRITE",
                    response.len, response.rights
                ),
            ));
        }
        let serving = self
            .conns
            .values()
            .filter(|c| {
                c.instance
                    .as_ref()
                    .is_some_and(|i| i.app_key == spec.app_key)
            })
            .count();
        let max = rule.quota.max_remote_clients;
        let mut evict = None;
        if serving as u64 >= u64::from(max) {
            let idle_after = rule.client.evict_idle_after.as_duration();
            let held_after = rule.client.evict_held_after.as_duration();
            match self.make_room(spec.app_key, idle_after, held_after, peer.ip(), manager) {
                Ok(e) => evict = Some(e),
                Err(why_not) => {
                    return Err(refuse(
                        Refusal::TooManyClients,
                        format!(
                            "app {:?} has {serving} remote clients: {why_not}; its \
                             max_remote_clients is {max}",
                            spec.app
                        ),
                    ))
                }
            }
        }
        let IpAddr::V4(local_ip) = local.ip() else {
            return Err(refuse(Refusal::NoDevice, "the hello came over IPv6"));
        };
        // A start PSN that differs between clients (a linear congruential step).
        self.psn_seed = self
            .psn_seed
            .wrapping_mul(1_664_525)
            .wrapping_add(1_013_904_223);
        let psn = self.psn_seed & 0xff_ffff;
        let ep = match self.endpoints.entry(local_ip) {
            std::collections::hash_map::Entry::Occupied(e) => e.into_mut(),
            std::collections::hash_map::Entry::Vacant(v) => {
                let mut cfg = RoceConfig::new(local_ip);
                cfg.bind.set_port(0);
                cfg.peer_budget = Some(Arc::clone(&self.peer_budget));
                let ep = RoceEndpoint::start(&self.nic, &cfg).map_err(|e| {
                    refuse(
                        Refusal::NoDevice,
                        format!("no RoCE endpoint on {local_ip}: {e}"),
                    )
                })?;
                v.insert(ep)
            }
        };
        let ep: &RoceEndpoint = ep;
        if theirs.addr == ep.local_addr() {
            // Only a local client at the endpoint's IP can name it. The QP would be
            // connected to the endpoint itself (inert: nothing else sends from that port),
            // with a peer socket connected to its own address.
            return Err(refuse(
                Refusal::InvalidHello,
                format!(
                    "record addr: {} is this manager's own RoCE endpoint",
                    theirs.addr
                ),
            ));
        }
        let mut bindings = spec.data_bindings.clone();
        let mut regions: Vec<RegionRecord> = bindings
            .iter()
            .filter_map(|(name, b)| match b {
                RegionBinding::Local {
                    buffer,
                    offset,
                    len,
                    ..
                } => Some(RegionRecord {
                    name: name.clone(),
                    addr: buffer.addr().0 + *offset as u64,
                    rkey: 0,
                    len: *len as u64,
                    rights: 0,
                }),
                _ => None,
            })
            .collect();
        regions.sort_by(|a, b| a.name.cmp(&b.name));
        bindings.insert(
            "response".to_owned(),
            RegionBinding::Remote {
                addr: redn_sys::VirtAddr(response.addr),
                rkey: redn_sys::Rkey(response.rkey),
                len: response.len,
            },
        );
        let mut ours: Option<QpRecord> = None;
        let installed = install(manager.nic(), spec.program, &bindings, &mut |q| {
            let mut r = ep.record(q, psn);
            r.rnr_retry = REMOTE_CLIENT_RNR_RETRY;
            r.regions.clone_from(&regions);
            ep.connect(&r, &theirs)?;
            ours = Some(r);
            Ok(())
        })
        .map_err(|e| {
            refuse(
                Refusal::NoDevice,
                format!("installing for this client: {e}"),
            )
        })?;
        let ours = ours.ok_or_else(|| {
            refuse(
                Refusal::NotServable,
                format!("offload {:?} has no client queue", spec.program.name),
            )
        })?;
        if !spec.limit.is_unlimited() {
            for q in &installed.qps {
                manager
                    .nic()
                    .set_rate_limit(q.qpn, spec.limit)
                    .map_err(|e| refuse(Refusal::NoDevice, format!("pacing: {e}")))?;
            }
        }
        let record = ours
            .encode()
            .map_err(|e| refuse(Refusal::NoDevice, format!("our record: {e}")))?;
        let invocations = match spec.program.iterations {
            Iterations::Bounded { invocations, .. } => invocations,
            Iterations::Recycled { .. } => 0,
        };
        Ok(Served {
            instance: RemoteInstance {
                handle: hello.handle,
                app: spec.app.to_owned(),
                app_key: spec.app_key,
                offload: spec.program.name.clone(),
            },
            installed,
            accepted: Accepted {
                invocations,
                trigger_len: spec.program.trigger_len,
                offload: spec.program.name.clone(),
                record,
            },
            evict,
        })
    }

    fn answer(
        &mut self,
        registry: &Registry,
        token: usize,
        answer: Result<Accepted, (Refusal, String)>,
        manager: &mut Manager,
        audit: &mut Audit,
    ) {
        let Some(c) = self.conns.get_mut(&token) else {
            return;
        };
        let answer = match answer {
            Ok(a) => Answer::Accepted(a),
            Err((r, reason)) => {
                let short = r.name().rsplit('.').next().unwrap_or_default();
                audit.event(&refusal_record(Some(c.peer), short, &reason));
                c.close_after_flush = true;
                Answer::Refused(r, reason)
            }
        };
        match answer.encode() {
            Ok(b) => c.output.extend_from_slice(&b),
            Err(_) => c.close_after_flush = true,
        }
        self.flush(registry, token, manager, audit);
    }

    fn flush(
        &mut self,
        registry: &Registry,
        token: usize,
        manager: &mut Manager,
        audit: &mut Audit,
    ) {
        let Some(c) = self.conns.get_mut(&token) else {
            return;
        };
        if crate::outbox::write_pending(&mut c.stream, &c.output, &mut c.written).is_err() {
            self.close(registry, token, manager, audit, "connection failed");
            return;
        }
        let done = c.written >= c.output.len();
        if done {
            c.output.clear();
            c.written = 0;
            if c.close_after_flush {
                self.close(registry, token, manager, audit, "refused");
                return;
            }
        }
        let interest = if done {
            Interest::READABLE
        } else {
            Interest::READABLE | Interest::WRITABLE
        };
        let _ = registry.reregister(&mut c.stream, Token(token), interest);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use nix::sys::socket::{getsockopt, sockopt};

    #[test]
    fn client_connections_get_tcp_keepalive() {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let _client = std::net::TcpStream::connect(listener.local_addr().unwrap()).unwrap();
        let (accepted, _) = listener.accept().unwrap();
        let stream = TcpStream::from_std(accepted);
        assert!(!getsockopt(&stream, sockopt::KeepAlive).unwrap());
        keepalive(&stream);
        assert!(getsockopt(&stream, sockopt::KeepAlive).unwrap());
        assert_eq!(
            (
                getsockopt(&stream, sockopt::TcpKeepIdle).unwrap(),
                getsockopt(&stream, sockopt::TcpKeepInterval).unwrap(),
                getsockopt(&stream, sockopt::TcpKeepCount).unwrap(),
            ),
            KEEPALIVE
        );
    }
}
