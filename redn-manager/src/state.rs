//! The manager's state: policy, offload definitions, the NIC, clients, their regions and
//! installed offloads; and the method handlers of `io.redn.Manager` and `io.redn.Admin`.
//!
//! Handlers are plain functions of the state and a request: the event loop
//! ([`crate::server`]) decodes, re-checks the peer and encodes; nothing here touches a
//! socket, so the install path is tested without one.
//!
//! **Install path** ([`Manager::install`]): the app rule (policy) → the offload's
//! definition → the bindings (each data region bound to a registered region, in bounds) →
//! the queue quota → the verifier, with the client's grants → the transactional install of
//! `redn_sys::install` (narrow keys, two protection domains, managed queues, code region) →
//! a handle and a 32-byte token. Every NIC object is owned by the offload's record, so a
//! failure at any step, or an uninstall, releases all of them.
//!
//! **The client-facing side.** An install's client-facing queue must be connected and its
//! response region bound to a remote client's buffer. The app's own install has no remote
//! client, so it connects that queue to a *parking* queue pair the manager owns, with a manager-owned response buffer registered in a protection
//! domain of its own: the install is complete and counted, and nothing outside the manager
//! can reach it. Each remote client then gets an instance of its own from the data plane
//! ([`crate::dataplane`], through [`Manager::remote_client_spec`]); `InstallOffload`
//! reports the data plane's address as `endpoint` when one is configured.

use crate::auditor::Sample;
use redn_policy::{
    verify, AppRule, Grants, KbitRate, PeerIdentity, Policy, TimeSpan, Token, WqeRate,
};
use redn_program::program::{Program, RegionRole};
use redn_program::Access;
use redn_proto::api;
use redn_proto::errors::{AdminError, ManagerError};
use redn_sys::handle::{CompletionQueue, ProtectionDomain, QueuePair, RegisteredRegion};
use redn_sys::install::{install, Installed, RegionBinding};
use redn_sys::mem::SharedBuffer;
use redn_sys::nic::{CqConfig, Nic, QpConfig, RateLimit};
use std::collections::{BTreeMap, HashMap};
use std::io::Read;
use std::os::fd::OwnedFd;
use std::path::PathBuf;
use std::sync::Arc;

mod admin;
mod app_keys;
mod clients;
mod enforce;
mod install;
pub use admin::{BanTarget, RemoteBan};
use app_keys::AppKeys;
pub use enforce::{server_loop_over, Teardown, MAX_TEST_RUN};

/// The NIC as the manager holds it.
pub type DynNic = dyn Nic;

/// Size of the parking response buffer (the catalog's responses are at most 64 bytes).
const PARKING_RESPONSE_LEN: usize = 4096;

/// Limits the manager enforces besides the policy's quotas.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Limits {
    /// Message caps per connection.
    pub codec: redn_proto::codec::Limits,
    /// Requests one connection may make per second.
    pub requests_per_second: u32,
    /// Open connections in all.
    pub max_connections: usize,
    /// Open connections per uid.
    pub max_connections_per_uid: usize,
    /// Registered regions per uid, over all its connections.
    pub max_regions_per_uid: usize,
    /// Registered bytes per uid, over all its connections.
    pub max_bytes_per_uid: u64,
    /// Bytes of replies queued for one connection that does not read them.
    pub max_pending_output: usize,
    /// Data-plane connections in all (pending hellos and served remote clients).
    pub max_dataplane_connections: usize,
    /// Bytes held for one uid's connections together (unhandled requests, unread replies).
    pub max_buffered_per_uid: usize,
}

/// File descriptors the manager keeps for itself whatever its clients hold: listeners,
/// epoll, the signalfd, the audit socket, lock files, RoCE endpoints, the fds of one
/// message being received, a hang-up's pidfd, the NIC's own.
pub const RESERVED_FDS: u64 = 64;

impl Default for Limits {
    /// sd-varlink's connection limits (4096, 1024 per uid), 1000 requests/s, 64 regions and
    /// 64 GiB per uid (the policy's per-app quotas are usually tighter), 4 MiB of unread
    /// replies, 32 MiB buffered per uid.
    fn default() -> Limits {
        Limits {
            codec: redn_proto::codec::Limits::default(),
            requests_per_second: 1000,
            max_connections: 4096,
            max_connections_per_uid: 1024,
            max_regions_per_uid: 64,
            max_bytes_per_uid: 64 << 30,
            max_pending_output: 4 << 20,
            max_dataplane_connections: 4096,
            max_buffered_per_uid: 32 << 20,
        }
    }
}

impl Limits {
    /// Shrink the connection caps so that what clients may hold fits in `nofile` file
    /// descriptors (the manager's `RLIMIT_NOFILE`), [`RESERVED_FDS`] kept back, and with a
    /// data plane the RoCE endpoint's peer sockets (at most `MAX_PEER_SOCKETS`): an app or
    /// admin connection costs its socket, its process's pidfd and the fds a message may
    /// carry (held until the message is complete), a data-plane connection one (counted
    /// only with a data plane). Without this, one uid opening
    /// connections up to its cap would run the manager out of fds and every other client
    /// would be refused or left unanswered at accept. The caps shrink in proportion, and
    /// one uid gets at most a quarter of what is left (as by default, 1024 of 4096); a
    /// per-uid cap already below that stays. `None` if they fit as they are, else what
    /// changed.
    pub fn fit_fds(&mut self, nofile: u64, dataplane: bool) -> Option<String> {
        let unix = self.max_connections as u64;
        let remote = if dataplane {
            self.max_dataplane_connections as u64
        } else {
            0
        };
        let per_conn = 2 + self.codec.max_fds as u64;
        let wanted = per_conn * unix + remote;
        // The data plane's endpoints keep a socket for each remote address they have QPs
        // connected to, up to a fixed number over all of them (they share one
        // `PeerBudget`: `redn_sys::softnic::roce::io::peers`).
        let peer_sockets = if dataplane {
            redn_sys::softnic::roce::io::MAX_PEER_SOCKETS as u64
        } else {
            0
        };
        let available = nofile.saturating_sub(RESERVED_FDS + peer_sockets);
        if wanted <= available {
            return None;
        }
        // Each cap times available / wanted, at least one; 128-bit so nothing overflows.
        let scale = |cap: u64| -> usize {
            let scaled = u128::from(cap) * u128::from(available) / u128::from(wanted);
            usize::try_from(scaled).unwrap_or(usize::MAX).max(1)
        };
        let before = (self.max_connections, self.max_connections_per_uid);
        self.max_connections = scale(unix);
        self.max_connections_per_uid = self
            .max_connections_per_uid
            .min((self.max_connections / 4).max(1));
        if dataplane {
            self.max_dataplane_connections = scale(remote);
        }
        Some(format!(
            "RLIMIT_NOFILE is {nofile}: connections capped at {} ({} per uid) instead of {} \
             ({}){}, so clients cannot run the manager out of file descriptors; raise \
             LimitNOFILE in the unit to serve more",
            self.max_connections,
            self.max_connections_per_uid,
            before.0,
            before.1,
            if dataplane {
                format!(
                    ", data-plane connections at {}",
                    self.max_dataplane_connections
                )
            } else {
                String::new()
            }
        ))
    }

    /// Set the limit called `name` (as `--limit NAME=VALUE` names it).
    ///
    /// # Errors
    /// A message naming the limits there are, or why the value is wrong.
    pub fn set(&mut self, name: &str, value: &str) -> Result<(), String> {
        let n: u64 = value
            .parse()
            .map_err(|_| format!("--limit {name}={value}: not a whole number"))?;
        let small = |n: u64| usize::try_from(n).map_err(|_| format!("{name}: too large"));
        if n == 0 {
            return Err(format!("--limit {name}: 0 would refuse everything"));
        }
        match name {
            "message-bytes" => self.codec.max_message = small(n)?,
            "fds-per-message" => {
                let most = redn_proto::fds::SCM_MAX_FD;
                let n = small(n)?;
                if n > most {
                    return Err(format!(
                        "--limit {name}={value}: at most {most} (the kernel's SCM_MAX_FD: no \
                         message can carry more)"
                    ));
                }
                self.codec.max_fds = n;
            }
            "nesting" => self.codec.max_depth = small(n)?,
            "requests-per-second" => {
                self.requests_per_second =
                    u32::try_from(n).map_err(|_| format!("{name}: too large"))?;
            }
            "connections" => self.max_connections = small(n)?,
            "connections-per-uid" => self.max_connections_per_uid = small(n)?,
            "regions-per-uid" => self.max_regions_per_uid = small(n)?,
            "bytes-per-uid" => self.max_bytes_per_uid = n,
            "pending-output-bytes" => self.max_pending_output = small(n)?,
            "buffered-bytes-per-uid" => self.max_buffered_per_uid = small(n)?,
            _ => {
                return Err(format!(
                    "unknown limit {name:?}; limits: message-bytes, fds-per-message, nesting, \
                     requests-per-second, connections, connections-per-uid, regions-per-uid, \
                     bytes-per-uid, pending-output-bytes, buffered-bytes-per-uid"
                ))
            }
        }
        Ok(())
    }
}

/// A region an app registered.
#[derive(Debug)]
struct Region {
    buffer: Arc<SharedBuffer>,
    size: u64,
    /// Taken over from a closed connection of the same app (`Manager::adopt`): the process
    /// holding it now has neither its id nor its memory, so it is kept only while an offload
    /// of the client binds it.
    adopted: bool,
}

/// An app connection and what it holds.
#[derive(Debug)]
pub struct Client {
    /// Its id.
    pub id: u64,
    /// Who it is.
    pub identity: PeerIdentity,
    /// Its connection is open.
    pub connected: bool,
    regions: BTreeMap<u64, Region>,
}

impl Client {
    fn pinned(&self) -> u64 {
        self.regions.values().map(|r| r.size).sum()
    }
}

/// The manager-owned queue an install's client-facing queue is connected to until the
/// data plane connects a remote client (see the module docs). Fields drop in order: the
/// queue pair and key before the CQ and protection domain.
struct Parking {
    _qp: QueuePair<DynNic>,
    /// Test-run triggers posted on it (`io.redn.Admin.TestRun`).
    sends: u64,
    _key: RegisteredRegion<DynNic>,
    _cq: Arc<CompletionQueue<DynNic>>,
    _pd: Arc<ProtectionDomain<DynNic>>,
}

/// An installed offload.
struct Offload {
    client: u64,
    app: String,
    /// `app` as a remote client's identity names it ([`AppKeys`]).
    app_key: crate::auditor::AppKey,
    program: Program,
    token: Token,
    /// The app's data regions as bound (the response binding is per remote client).
    data_bindings: HashMap<String, RegionBinding>,
    /// The pacing of each of its queues.
    limit: RateLimit,
    /// Dropped first: the program's queues go before the parking queue they talk to.
    installed: Installed<DynNic>,
    /// Its queues' counters at install, before anyone could trigger it: the auditor's
    /// loop budget counts from here.
    at_install: Sample,
    _parking: Parking,
    /// The instances the data plane installed for remote clients, by the data plane's id
    /// of each; released with the offload (or alone, by the auditor).
    remote: BTreeMap<u64, RemoteInstance>,
    /// Counters of remote instances released so far (triggers, WQEs, errors).
    retired: (u64, u64, u64),
    /// Remote clients' instances the auditor terminated, and of those banned.
    remote_terminated: u64,
    remote_banned: u64,
    /// When the token was handed out (its app's `token_lifetime` runs from here).
    token_issued: std::time::Instant,
    /// When its triggers arrived, for `io.redn.Admin.TriggerTimes` (see
    /// `Manager::trigger_times`).
    arrivals: enforce::Arrivals,
}

/// A remote client's own instance of an offload, installed by the data plane.
struct RemoteInstance {
    /// The client's address, for the audit trail.
    peer: std::net::SocketAddr,
    installed: Installed<DynNic>,
    /// Its queues' counters when it was attached, before the client learnt its queue
    /// numbers: the auditor's loop budget counts from here.
    at_install: Sample,
    /// Its triggers as the auditor last counted them, and when that count last moved (or
    /// the attach): how long the client has been idle, for `evict_idle_after`.
    triggers_seen: u64,
    active_at: std::time::Instant,
    /// When it was attached: how long it has held its slot (`evict_held_after`,
    /// `io.redn.Admin.ListRemoteClients`).
    attached_at: std::time::Instant,
}

impl RemoteInstance {
    /// How long it has been idle and held its instance at `now`.
    fn ages(&self, now: std::time::Instant) -> RemoteAges {
        RemoteAges {
            idle: now.saturating_duration_since(self.active_at),
            held: now.saturating_duration_since(self.attached_at),
        }
    }
}

/// How long a remote client has been idle and has held its instance
/// ([`Manager::remote_ages`]).
#[derive(Clone, Copy, Debug)]
pub struct RemoteAges {
    /// Since its last trigger (or its attach).
    pub idle: std::time::Duration,
    /// Since its attach.
    pub held: std::time::Duration,
}

/// What the data plane needs to serve a remote client of one installed offload (see
/// [`Manager::remote_client_spec`]).
#[derive(Debug)]
pub struct RemoteClientSpec<'a> {
    /// The offload's program.
    pub program: &'a Program,
    /// The app's data regions, bound as at install.
    pub data_bindings: &'a HashMap<String, RegionBinding>,
    /// How each of the client's queues is paced.
    pub limit: RateLimit,
    /// The name of the app rule the offload was installed under.
    pub app: &'a str,
    /// That rule's number for its remote clients (whose bans are keyed by it).
    pub app_key: crate::auditor::AppKey,
    /// That rule as the policy has it now (`max_remote_clients`, `remote_sources`); `None`
    /// if a reload removed it.
    pub rule: Option<&'a AppRule>,
}

/// Everything the manager knows.
pub struct Manager {
    policy_path: PathBuf,
    policy: Policy,
    offloads: BTreeMap<String, Program>,
    nic: Arc<DynNic>,
    backend: String,
    /// The manager's limits.
    pub limits: Limits,
    clients: BTreeMap<u64, Client>,
    installed: BTreeMap<u64, Offload>,
    next_id: u64,
    /// What `InstallOffload` reports as `endpoint` (the data plane's address, if any).
    dataplane_endpoint: Option<String>,
    /// Apps the auditor banned from installing.
    bans: crate::auditor::Bans,
    /// Per client, what the auditor terminated of its offloads and their remote clients
    /// (for `Stats`).
    notes: BTreeMap<u64, enforce::Notes>,
    /// Remote clients' instances (offload handle, instance id) released because a queue of
    /// theirs went to error, until the data plane closes their connections and says why.
    failed_remotes: std::collections::BTreeSet<(u64, u64)>,
    /// Per remote client (app and address), what its released instances did (each from
    /// its attach): its rates are judged over every instance it held
    /// ([`crate::auditor::ClientId`]).
    retired_clients: HashMap<crate::auditor::ClientId, Sample>,
    /// The number each app rule is known by in a [`crate::auditor::ClientId`].
    app_keys: AppKeys,
    /// Remote clients the auditor throttled, and at what pace (shared by all their queues).
    client_pacing: HashMap<crate::auditor::ClientId, RateLimit>,
    /// Offloads whose own install the auditor throttled (a reload does not re-pace them).
    own_throttled: std::collections::HashSet<u64>,
    /// Asynchronous events taken from the NIC.
    async_events: u64,
    /// The NIC's count of lost asynchronous events when last read.
    async_events_lost: u64,
    /// Audit records of the manager's own actions, for the event loop to send.
    outbox: Vec<crate::audit::Record>,
    /// The verifier rules the last refused install broke (for its audit record).
    refused_rules: String,
}

impl std::fmt::Debug for Manager {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Manager")
            .field("backend", &self.backend)
            .field("clients", &self.clients.len())
            .field("installed", &self.installed.len())
            .finish_non_exhaustive()
    }
}

fn policy_denied(reason: String) -> ManagerError {
    ManagerError::PolicyDenied { reason }
}

fn no_device(e: &redn_sys::Error) -> ManagerError {
    ManagerError::NoDevice {
        reason: e.to_string(),
    }
}

/// 32 bytes from the kernel's CSPRNG.
fn random_token() -> std::io::Result<Token> {
    let mut bytes = [0u8; Token::BYTES];
    std::fs::File::open("/dev/urandom")?.read_exact(&mut bytes)?;
    Ok(Token::from_bytes(bytes))
}

/// The softnic/NIC pacing for an app's `rate_limit_kbps` and `wqes_per_second`.
pub fn rate_limit((kbps, wqes): (KbitRate, WqeRate)) -> RateLimit {
    let mut limit = RateLimit::default();
    if let KbitRate::Limited(k) = kbps {
        limit = limit.with_bytes(u64::from(k.get()) * 1000 / 8);
    }
    if let WqeRate::Limited(n) = wqes {
        limit = limit.with_wqes(n.get());
    }
    limit
}

/// The grants an app rule gives a program before any region is bound: each data region as
/// large as the rule's pinned quota (the most an install could bind). What `--check` and
/// `redn offload verify` judge a definition by.
pub fn grants_at_quota(app: &AppRule, program: &Program) -> Grants {
    let lens: HashMap<String, u64> = program
        .regions
        .iter()
        .filter(|r| matches!(r.role, RegionRole::Data { .. }))
        .map(|r| (r.name.clone(), app.quota.max_pinned.bytes().max(r.min_len)))
        .collect();
    grants_for(app, program, &lens)
}

/// The grants an app rule gives a program whose data regions are bound with `lens`.
pub fn grants_for(app: &AppRule, program: &Program, lens: &HashMap<String, u64>) -> Grants {
    let mut g = Grants::new();
    for decl in &program.regions {
        let len = lens.get(&decl.name).copied().unwrap_or(decl.min_len);
        g = match decl.role {
            RegionRole::Data { access } => g.with_region(&decl.name, access, len),
            RegionRole::Response => g.with_region(
                &decl.name,
                Access::REMOTE_WRITE,
                PARKING_RESPONSE_LEN as u64,
            ),
        };
    }
    g.max_wqes_per_invocation = app.client.wqes_per_invocation.get();
    g.max_queues = usize::try_from(app.quota.max_queues.get()).unwrap_or(usize::MAX);
    g.loop_budget = match app.client.wqes_per_second {
        WqeRate::Limited(n) => Some(n.get()),
        WqeRate::Unlimited => Some(u64::MAX),
    };
    g
}

impl Manager {
    /// A manager with `policy` (from `policy_path`), `offloads` and `nic`.
    pub fn new(
        policy_path: PathBuf,
        policy: Policy,
        offloads: Vec<Program>,
        nic: Arc<DynNic>,
        backend: String,
        limits: Limits,
    ) -> Manager {
        Manager {
            policy_path,
            policy,
            offloads: offloads.into_iter().map(|p| (p.name.clone(), p)).collect(),
            nic,
            backend,
            limits,
            clients: BTreeMap::new(),
            installed: BTreeMap::new(),
            next_id: 1,
            dataplane_endpoint: None,
            bans: crate::auditor::Bans::default(),
            notes: BTreeMap::new(),
            failed_remotes: std::collections::BTreeSet::new(),
            retired_clients: HashMap::new(),
            app_keys: AppKeys::default(),
            client_pacing: HashMap::new(),
            own_throttled: std::collections::HashSet::new(),
            async_events: 0,
            async_events_lost: 0,
            outbox: Vec::new(),
            refused_rules: String::new(),
        }
    }

    /// The data plane serves remote clients at `endpoint`; installs report it.
    pub fn set_dataplane_endpoint(&mut self, endpoint: String) {
        self.dataplane_endpoint = Some(endpoint);
    }

    /// Whether offload `handle` is installed (the data plane drops the remote clients of
    /// one that is not any more).
    pub fn has_offload(&self, handle: u64) -> bool {
        self.installed.contains_key(&handle)
    }

    /// The NIC.
    pub fn nic(&self) -> &Arc<DynNic> {
        &self.nic
    }

    /// Installed offloads.
    pub fn installed_count(&self) -> usize {
        self.installed.len()
    }

    fn fresh_id(&mut self) -> u64 {
        let id = self.next_id;
        self.next_id += 1;
        id
    }

    fn client(&self, id: u64) -> Result<&Client, ManagerError> {
        self.clients
            .get(&id)
            .ok_or_else(|| ManagerError::PeerChanged {
                reason: "the client is no longer known".into(),
            })
    }

    fn app_of(&self, client: &Client) -> Result<&AppRule, ManagerError> {
        let p = &client.identity;
        self.policy.match_app(p).ok_or_else(|| {
            policy_denied(format!(
                "no app rule in {} matches uid={} gid={} exe={} cgroup={}",
                self.policy_path.display(),
                p.uid,
                p.gid,
                p.exe.display(),
                p.cgroup
            ))
        })
    }

    /// The clients that are one app: `client`'s uid, matched by the same app rule, its
    /// connection open or closed (what a closed one left serving is the app's still). The
    /// policy's quotas are the app's, so they are counted over all of them: an app cannot
    /// multiply them by opening more connections, or by hanging up and coming back.
    fn app_clients(&self, client: &Client, rule: &str) -> Vec<u64> {
        let uid = client.identity.uid;
        self.clients
            .values()
            .filter(|c| c.identity.uid == uid)
            .filter(|c| {
                self.policy
                    .match_app(&c.identity)
                    .is_some_and(|a| a.name == rule)
            })
            .map(|c| c.id)
            .collect()
    }

    fn uid_usage(&self, uid: u32) -> (usize, u64) {
        self.clients
            .values()
            .filter(|c| c.identity.uid == uid)
            .fold((0, 0), |(n, b), c| (n + c.regions.len(), b + c.pinned()))
    }

    /// `io.redn.Manager.GetInfo`.
    ///
    /// # Errors
    /// `PolicyDenied` for a caller no rule matches.
    pub fn info(&self, client: u64) -> Result<api::ManagerInfo, ManagerError> {
        let c = self.client(client)?;
        let app = self.app_of(c)?;
        Ok(api::ManagerInfo {
            version: env!("CARGO_PKG_VERSION").into(),
            backend: self.backend.clone(),
            app: app.name.clone(),
            uid: c.identity.uid,
            pid: i32::try_from(c.identity.pid).unwrap_or(-1),
            max_regions: app.quota.max_regions.get(),
            max_pinned: app.quota.max_pinned.bytes(),
            regions: u32::try_from(c.regions.len()).unwrap_or(u32::MAX),
            pinned: c.pinned(),
            offloads: u32::try_from(
                self.installed
                    .values()
                    .filter(|o| o.client == client)
                    .count(),
            )
            .unwrap_or(u32::MAX),
        })
    }

    /// `io.redn.Manager.ListOffloads`: what the caller may install.
    ///
    /// # Errors
    /// `PolicyDenied` for a caller no rule matches.
    pub fn list_offloads(&self, client: u64) -> Result<api::OffloadList, ManagerError> {
        let app = self.app_of(self.client(client)?)?;
        let offloads = app
            .offloads
            .iter()
            .filter_map(|n| self.offloads.get(n))
            .map(describe)
            .collect();
        Ok(api::OffloadList { offloads })
    }

    /// `io.redn.Manager.RegisterRegion` with the fd already taken from the message.
    ///
    /// # Errors
    /// `PolicyDenied`, `QuotaExceeded` (`regions`, `bytes`), `NotSealed`, `InvalidParameter`.
    pub fn register_region(
        &mut self,
        client: u64,
        fd: OwnedFd,
    ) -> Result<api::RegionRegistered, ManagerError> {
        let c = self.client(client)?;
        let app = self.app_of(c)?;
        let max_regions = u64::from(app.quota.max_regions.get());
        let (held, pinned) = self
            .app_clients(c, &app.name)
            .iter()
            .filter_map(|id| self.clients.get(id))
            .fold((0u64, 0u64), |(n, b), o| {
                (n + o.regions.len() as u64, b + o.pinned())
            });
        if held >= max_regions {
            return Err(ManagerError::QuotaExceeded {
                resource: "regions".into(),
                limit: max_regions,
                requested: held + 1,
            });
        }
        let (uid_regions, uid_bytes) = self.uid_usage(c.identity.uid);
        if uid_regions >= self.limits.max_regions_per_uid {
            return Err(ManagerError::QuotaExceeded {
                resource: "regions-per-uid".into(),
                limit: self.limits.max_regions_per_uid as u64,
                requested: uid_regions as u64 + 1,
            });
        }
        let room = app
            .quota
            .max_pinned
            .bytes()
            .saturating_sub(pinned)
            .min(self.limits.max_bytes_per_uid.saturating_sub(uid_bytes));
        let buffer = crate::region::map_sealed(fd, room)?;
        let size = buffer.len() as u64;
        let addr = buffer.addr().0;
        let id = self.fresh_id();
        if let Some(c) = self.clients.get_mut(&client) {
            c.regions.insert(
                id,
                Region {
                    buffer,
                    size,
                    adopted: false,
                },
            );
        }
        Ok(api::RegionRegistered {
            region: id,
            size,
            addr,
        })
    }

    /// An offload's counters: its own instance's, its remote clients' and those of the
    /// remote instances already released.
    fn stats_of(&self, o: &Offload) -> (u64, u64, u64) {
        let (mut triggers, mut wqes, mut errors) = o.retired;
        for i in std::iter::once(&o.installed).chain(o.remote.values().map(|r| &r.installed)) {
            let (t, w, e) = self.instance_counters(&o.program, i);
            triggers += t;
            wqes += w;
            errors += e;
        }
        (triggers, wqes, errors)
    }

    /// Hand the instance installed for a remote client (`id`, the data plane's, at `peer`)
    /// to offload `handle`, so that its counters show in `Stats`, the auditor holds it to
    /// the app's budgets and it goes with the offload. False (and the instance released) if
    /// the offload is gone.
    pub fn attach_remote(
        &mut self,
        handle: u64,
        id: u64,
        peer: std::net::SocketAddr,
        instance: Installed<DynNic>,
    ) -> bool {
        let Some(o) = self.installed.get(&handle) else {
            return false;
        };
        let o_app_key = o.app_key;
        let at_install = self.sample(&o.program, &instance);
        let now = std::time::Instant::now();
        let remote = RemoteInstance {
            peer,
            at_install,
            installed: instance,
            triggers_seen: at_install.triggers,
            active_at: now,
            attached_at: now,
        };
        if let Some(o) = self.installed.get_mut(&handle) {
            o.remote.insert(id, remote);
        }
        // A throttled client's new session is paced as its others (their share shrinks).
        let client = crate::auditor::ClientId {
            app: o_app_key,
            addr: peer.ip(),
        };
        if self.client_pacing.contains_key(&client) {
            self.pace_client_queues(client);
        }
        true
    }

    /// Whether remote client `id`'s instance of offload `handle` is still held (the data
    /// plane closes the connection of one the auditor terminated).
    pub fn has_remote(&self, handle: u64, id: u64) -> bool {
        self.installed
            .get(&handle)
            .is_some_and(|o| o.remote.contains_key(&id))
    }

    /// How long remote client `id` of offload `handle` has sent no trigger, as of the
    /// auditor's latest round (from its attach if it never has), and how long it has held
    /// its instance (for `evict_idle_after` and `evict_held_after`); `None` if it holds no
    /// instance.
    pub fn remote_ages(&self, handle: u64, id: u64, now: std::time::Instant) -> Option<RemoteAges> {
        Some(self.installed.get(&handle)?.remote.get(&id)?.ages(now))
    }

    /// True (once) if remote client `id`'s instance of offload `handle` was released because
    /// a queue of its went to error (see `audit_round`), so that the data plane can say why
    /// it closes the client's connection.
    pub fn take_failed_remote(&mut self, handle: u64, id: u64) -> bool {
        self.failed_remotes.remove(&(handle, id))
    }

    /// Release remote client `id`'s instance of offload `handle`, keeping its counters.
    pub fn detach_remote(&mut self, handle: u64, id: u64) {
        // Its trigger arrivals not yet taken go with the rest of the offload's.
        self.harvest_arrivals(Some(handle));
        let Some(instance) = self
            .installed
            .get_mut(&handle)
            .and_then(|o| o.remote.remove(&id))
        else {
            return;
        };
        let Some(o) = self.installed.get(&handle) else {
            return;
        };
        let last = self.sample(&o.program, &instance.installed);
        let app_key = o.app_key;
        let (t, w, e) = (last.triggers, last.wqes, last.errors);
        if let Some(o) = self.installed.get_mut(&handle) {
            o.retired.0 += t;
            o.retired.1 += w;
            o.retired.2 += e;
        }
        // Its client's rates go on counting what it did (see `retired_clients`).
        let client = crate::auditor::ClientId {
            app: app_key,
            addr: instance.peer.ip(),
        };
        let done = last.since(instance.at_install);
        let total = self.retired_clients.entry(client).or_default();
        *total = total.plus(done);
        if self.client_pacing.contains_key(&client) {
            self.pace_client_queues(client);
        }
    }

    fn instance_counters(
        &self,
        program: &Program,
        installed: &Installed<DynNic>,
    ) -> (u64, u64, u64) {
        let s = self.sample(program, installed);
        (s.triggers, s.wqes, s.errors)
    }

    /// `io.redn.Manager.Stats`.
    ///
    /// # Errors
    /// `PeerChanged` for an unknown client.
    pub fn stats(&self, client: u64) -> Result<api::StatsReply, ManagerError> {
        self.client(client)?;
        let offloads = self
            .installed
            .iter()
            .filter(|(_, o)| o.client == client)
            .map(|(h, o)| {
                let (triggers, wqes, errors) = self.stats_of(o);
                api::OffloadStats {
                    handle: *h,
                    offload: o.program.name.clone(),
                    triggers,
                    wqes,
                    errors,
                }
            })
            .collect();
        Ok(api::StatsReply {
            offloads,
            terminated: self.notes_of(client),
            remote_terminated: self.remote_notes_of(client),
        })
    }

    /// The seam for the data plane ([`crate::dataplane`]): what it needs to
    /// install a remote client's own instance of offload `handle` — the program, the app's
    /// data-region bindings (add the client's `response` binding and install with
    /// `redn_sys::install::install`), and the pacing — if `token` is the offload's token
    /// (compared in constant time) and younger than its app's `token_lifetime`. `None` for
    /// an unknown handle, a wrong token and an expired one alike.
    pub fn remote_client_spec(&self, handle: u64, token: &Token) -> Option<RemoteClientSpec<'_>> {
        let o = self.installed.get(&handle)?;
        let rule = self.policy.app(&o.app);
        let expired = rule.is_some_and(|r| match r.client.token_lifetime {
            TimeSpan::Finite(d) => o.token_issued.elapsed() >= d,
            TimeSpan::Infinite => false,
        });
        (&o.token == token && !expired).then_some(RemoteClientSpec {
            program: &o.program,
            data_bindings: &o.data_bindings,
            limit: o.limit,
            app: &o.app,
            app_key: o.app_key,
            rule,
        })
    }

    /// Asynchronous events the auditor has taken from the NIC.
    pub fn async_events(&self) -> u64 {
        self.async_events
    }

    /// Whether `client` is known (a killed client is not).
    pub fn has_client(&self, client: u64) -> bool {
        self.clients.contains_key(&client)
    }
}

/// An offload as `ListOffloads` shows it.
pub fn describe(p: &Program) -> api::Offload {
    api::Offload {
        name: p.name.clone(),
        summary: p.summary.clone(),
        response: p.response_doc.clone(),
        trigger_len: p.trigger_len,
        params: p
            .params
            .iter()
            .map(|q| api::Param {
                name: q.name.clone(),
                offset: q.offset,
                len: q.len,
                doc: q.doc.clone(),
            })
            .collect(),
        regions: p
            .regions
            .iter()
            .map(|r| api::RegionSpec {
                name: r.name.clone(),
                role: match r.role {
                    RegionRole::Data { .. } => "data".into(),
                    RegionRole::Response => "response".into(),
                },
                access: match r.role {
                    RegionRole::Data { access } => access.to_string(),
                    RegionRole::Response => Access::REMOTE_WRITE.to_string(),
                },
                min_len: r.min_len,
                doc: r.doc.clone(),
            })
            .collect(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::num::{NonZeroU32, NonZeroU64};

    #[test]
    fn connection_caps_shrink_to_fit_the_fd_limit() {
        let mut roomy = Limits::default();
        assert_eq!(
            roomy.fit_fds(1 << 20, true),
            None,
            "systemd's hard limit fits"
        );
        assert_eq!(roomy, Limits::default());
        for (nofile, dataplane) in [
            (96, false),
            (96, true),
            (1024, true),
            (1024, false),
            (0, true),
        ] {
            let mut l = Limits::default();
            let note = l.fit_fds(nofile, dataplane).unwrap();
            assert!(
                note.contains(&format!("RLIMIT_NOFILE is {nofile}")),
                "{note}"
            );
            let remote = if dataplane {
                l.max_dataplane_connections
            } else {
                0
            };
            let held = 2 * l.max_connections + remote;
            let peer_sockets = if dataplane {
                redn_sys::softnic::roce::io::MAX_PEER_SOCKETS as u64
            } else {
                0
            };
            if nofile > RESERVED_FDS + peer_sockets {
                assert!(
                    held as u64 + RESERVED_FDS + peer_sockets <= nofile,
                    "{nofile}: {l:?}"
                );
            }
            assert!(
                l.max_connections >= 1 && l.max_connections_per_uid >= 1,
                "{l:?}"
            );
            // One uid still gets a quarter of the connections, as by default.
            assert!(
                l.max_connections_per_uid <= l.max_connections / 4 + 1,
                "{nofile}: {l:?}"
            );
            // A per-uid cap already small is kept.
            let mut small = Limits {
                max_connections_per_uid: 2,
                ..Limits::default()
            };
            if small.fit_fds(nofile, dataplane).is_some() && small.max_connections >= 8 {
                assert_eq!(small.max_connections_per_uid, 2, "{nofile}: {small:?}");
            }
        }
    }

    #[test]
    fn app_rates_become_nic_pacing() {
        let limited = rate_limit((
            KbitRate::Limited(NonZeroU32::new(8000).unwrap()),
            WqeRate::Limited(NonZeroU64::new(2_000_000).unwrap()),
        ));
        assert_eq!(limited, RateLimit::bytes(1_000_000).with_wqes(2_000_000));
        assert!(rate_limit((KbitRate::Unlimited, WqeRate::Unlimited)).is_unlimited());
    }

    #[test]
    fn limits_are_set_by_name_and_refuse_nonsense() {
        let mut l = Limits::default();
        assert!(l
            .set("fds-per-message", "1000")
            .unwrap_err()
            .contains("at most 253"));
        l.set("fds-per-message", "253").unwrap();
        assert_eq!(l.codec.max_fds, redn_proto::fds::SCM_MAX_FD);
        l.set("connections-per-uid", "3").unwrap();
        assert_eq!(l.max_connections_per_uid, 3);
        assert!(l
            .set("connections", "0")
            .unwrap_err()
            .contains("refuse everything"));
        assert!(l.set("colour", "1").unwrap_err().contains("unknown limit"));
        assert!(l
            .set("nesting", "deep")
            .unwrap_err()
            .contains("not a whole number"));
    }
}
