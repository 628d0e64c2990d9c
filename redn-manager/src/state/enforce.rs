//! The manager's side of the auditor ([`crate::auditor`]): sampling each installed
//! offload's queues from the NIC's counters, carrying out verdicts (throttle, terminate, ban),
//! the bans on installs, what goes when a reload narrows the policy or an app exits, and the
//! admin's test run. Every action leaves [`Record`]s for the audit trail in the manager's
//! outbox ([`Manager::take_records`]); nothing here touches a socket.

use super::DynNic;
use super::Manager;
use crate::audit::{Event, Record, Severity};
use crate::auditor::{
    describe_span, Auditor, Banned, Budget, ClientId, Sample, TrackId, Verdict, Violation,
};
use redn_program::program::{Program, QueueRole};
use redn_program::wqe::{Payload, WorkRequest, WqeFlags, WrOp};
use redn_proto::api;
use redn_proto::errors::AdminError;
use redn_sys::clock::Clock;
use redn_sys::install::Installed;
use redn_sys::nic::AsyncEvent;
use redn_sys::QpState;
use std::collections::HashSet;

/// Auditor notes a client keeps for `Stats`, at most (of each kind; for remote clients,
/// the newest).
const MAX_NOTES: usize = 64;
/// Asynchronous events taken from the NIC in one round, at most (the rest wait for the
/// next round, so a storm of them cannot stall the loop).
const MAX_EVENTS_PER_ROUND: usize = 4096;

/// What the auditor did to one client's offloads and their remote clients, for `Stats`.
#[derive(Debug, Default)]
pub(super) struct Notes {
    offloads: Vec<api::TerminatedOffload>,
    remote: std::collections::VecDeque<api::TerminatedRemote>,
}

impl Notes {
    /// Take `other`'s notes too (an app adopting what an earlier connection left).
    pub(super) fn merge(&mut self, other: Notes) {
        for n in other.offloads {
            self.note_offload(n);
        }
        for n in other.remote {
            self.note_remote(n);
        }
    }

    fn note_offload(&mut self, n: api::TerminatedOffload) {
        if self.offloads.len() < MAX_NOTES {
            self.offloads.push(n);
        }
    }

    fn note_remote(&mut self, n: api::TerminatedRemote) {
        if self.remote.len() == MAX_NOTES {
            self.remote.pop_front();
        }
        self.remote.push_back(n);
    }
}

/// The queues and CQs asynchronous events said went to error.
#[derive(Debug, Default)]
struct Failed {
    qps: HashSet<redn_sys::Qpn>,
    cqs: HashSet<redn_sys::Cqn>,
}
/// Triggers a test run may leave outstanding on the parking queue.
pub const MAX_TEST_RUN: u32 = 4096;
/// Trigger arrival times an offload keeps until an admin takes them; older ones are dropped
/// (and counted).
pub const MAX_ARRIVALS: usize = 4096;
/// Receive completions taken from one client-facing CQ per harvest, at most (16 polls of
/// 256): a harvest's cost stays bounded however fast triggers come.
const HARVEST_POLLS: usize = 16;

/// When an offload's triggers arrived: the timestamps of the receive completions of its
/// instances' client-facing queues (the NIC's clock: on the softnic, `CLOCK_MONOTONIC`
/// nanoseconds, `redn_sys::softnic::completion_clock_ns`), kept until an admin takes them
/// with `io.redn.Admin.TriggerTimes`.
#[derive(Debug, Default)]
pub(super) struct Arrivals {
    times: std::collections::VecDeque<u64>,
    dropped: u64,
}

impl Arrivals {
    fn add(&mut self, ns: u64) {
        if self.times.len() == MAX_ARRIVALS {
            self.times.pop_front();
            self.dropped += 1;
        }
        self.times.push_back(ns);
    }
}

/// Why an offload was torn down (the `reason=` of its `teardown` record).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Teardown {
    /// Its app exited and the policy says tear down.
    AppExit,
    /// A reload's policy no longer allows it.
    Reload,
    /// The manager is stopping.
    Shutdown,
}

impl Teardown {
    fn as_str(self) -> &'static str {
        match self {
            Teardown::AppExit => "app-exit",
            Teardown::Reload => "policy-reload",
            Teardown::Shutdown => "shutdown",
        }
    }
}

/// The `InstallOffload` request for the catalog's server-loop over `region` (its table at
/// offset 0, its values at 4096, 4 KiB each), and a trigger for key 0x2a in the table's first
/// bucket: what the auditor's benchmark and tests drive.
pub fn server_loop_over(region: &api::RegionRegistered) -> (api::InstallOffload, Vec<u8>) {
    let bind = |name: &str, offset: u64| api::Binding {
        name: name.into(),
        region: region.region,
        offset,
        len: 4096,
    };
    let request = api::InstallOffload {
        offload: "server-loop".into(),
        regions: vec![bind("table", 0), bind("values", 4096)],
        parameters: None,
    };
    // key0 (6 bytes, little-endian) · bucket0 (8 bytes, big-endian address).
    let mut trigger = vec![0x2a, 0, 0, 0, 0, 0];
    trigger.extend_from_slice(&region.addr.to_be_bytes());
    (request, trigger)
}

impl Manager {
    /// A manager with `policy` over the built-in offload catalog, with default limits.
    ///
    /// # Errors
    /// If the catalog does not load.
    pub fn with_catalog(
        policy: redn_policy::Policy,
        nic: std::sync::Arc<super::DynNic>,
        backend: &str,
    ) -> Result<Manager, redn_program::program::ProgramError> {
        let offloads = redn_policy::shipped_offloads()?
            .into_iter()
            .map(|s| s.program)
            .collect();
        Ok(Manager::new(
            "policy.toml".into(),
            policy,
            offloads,
            nic,
            backend.into(),
            super::Limits::default(),
        ))
    }

    /// The handles of `client`'s offloads.
    pub(super) fn handles_of(&self, client: u64) -> Vec<u64> {
        self.installed
            .iter()
            .filter(|(_, o)| o.client == client)
            .map(|(h, _)| *h)
            .collect()
    }

    /// Audit records the manager's own actions left since the last call.
    pub fn take_records(&mut self) -> Vec<Record> {
        std::mem::take(&mut self.outbox)
    }

    /// The backend's kind (`softnic`, `mlx5`).
    pub fn backend(&self) -> &str {
        &self.backend
    }

    /// The verifier rules the last refused install broke, comma-separated.
    pub fn take_refused_rules(&mut self) -> String {
        std::mem::take(&mut self.refused_rules)
    }

    /// A record about offload `handle`: its client, the client's identity, app and offload.
    fn offload_record(&self, kind: Event, sev: Severity, handle: u64) -> Record {
        let mut r = Record::new(kind, sev);
        if let Some(o) = self.installed.get(&handle) {
            r = r.field("client", o.client);
            if let Some(c) = self.clients.get(&o.client) {
                r = r.peer(&c.identity);
            }
            r = r
                .field("app", &o.app)
                .field("offload", &o.program.name)
                .field("handle", handle);
        }
        r
    }

    /// The counters of one instance's queues (the app's install or a remote client's),
    /// summed. Queue states are not read here: see [`Manager::audit_round`].
    pub(super) fn sample(&self, program: &Program, installed: &Installed<DynNic>) -> Sample {
        let mut s = Sample::default();
        for (i, q) in installed.qps.iter().enumerate() {
            if let Ok(c) = self.nic.counters(q.qpn) {
                s.wqes += c.total_wqes();
                s.bytes += c.bytes;
                s.errors += c.errors;
                s.rate_limit_delays += c.rate_limit_delays;
                if program
                    .queues
                    .get(i)
                    .is_some_and(|d| d.role == QueueRole::Client)
                {
                    s.triggers += c.recvs;
                }
            }
        }
        s
    }

    /// The instance's queues whose state reads as error now (the fallback to events).
    fn queues_in_error(&self, installed: &Installed<DynNic>) -> u32 {
        let n = installed
            .qps
            .iter()
            .filter(|q| matches!(self.nic.qp_state(q.qpn), Ok(QpState::Error)))
            .count();
        u32::try_from(n).unwrap_or(u32::MAX)
    }

    /// Take the NIC's asynchronous events (at most [`MAX_EVENTS_PER_ROUND`]): the queue
    /// pairs a responder error moved to error and the CQs that overran. Returns them and
    /// whether some events were lost since the last call (the NIC's queue was full), in
    /// which case every queue's state must be read instead.
    fn take_async_events(&mut self) -> (Failed, bool) {
        let mut failed = Failed::default();
        for _ in 0..MAX_EVENTS_PER_ROUND {
            match self.nic.get_async_event() {
                Some(AsyncEvent::QpAccessError(q) | AsyncEvent::QpRequestError(q)) => {
                    failed.qps.insert(q);
                }
                Some(AsyncEvent::CqError(c)) => {
                    failed.cqs.insert(c);
                }
                // Kinds a newer NIC reports that the auditor does not act on.
                Some(_) => {}
                None => break,
            }
            self.async_events += 1;
        }
        let lost = self.nic.async_events_lost();
        let missed = lost != self.async_events_lost;
        self.async_events_lost = lost;
        (failed, missed)
    }

    /// One auditor round over every installed offload and every remote client's instance
    /// of one, each its own budget track: sample, judge, act. Returns how many tracks were
    /// sampled.
    ///
    /// Queues that go to error are learnt from the NIC's asynchronous events (a responder
    /// that refused a request, a CQ that overran), not by reading every queue's state each
    /// round. The state is read as a fallback only where an event may not come: for a
    /// track whose error completions grew (a WQE of its own failed, which moves its queue
    /// to error without an event; read a round later, so an event raised with the errors
    /// comes first), and for every track after the NIC lost events.
    pub fn audit_round(&mut self, auditor: &mut Auditor, clock: impl Clock) -> usize {
        self.harvest_arrivals(None);
        let (failed, missed) = self.take_async_events();
        let mut verdicts = Vec::new();
        let mut sampled = 0;
        // Remote instances whose trigger count moved since the last round.
        let mut active = Vec::new();
        // Per remote client, its budget, what each of its live instances did since its
        // attach (offload handle, instance id, counts), and the offload its records name
        // (the one it was last seen on).
        type Sessions = Vec<(u64, u64, Sample)>;
        let mut clients: std::collections::BTreeMap<ClientId, (Budget, Sessions, u64)> =
            std::collections::BTreeMap::new();
        for (handle, o) in &self.installed {
            let Some(app) = self.policy.app(&o.app) else {
                continue;
            };
            let budget = Budget::of(app);
            let own = std::iter::once((TrackId::own(*handle), &o.installed, o.at_install));
            let remote = o
                .remote
                .iter()
                .map(|(id, r)| (TrackId::remote(*handle, *id), &r.installed, r.at_install));
            for (track, installed, at_install) in own.chain(remote) {
                let mut sample = self.sample(&o.program, installed);
                let evented = installed
                    .qps
                    .iter()
                    .filter(|q| failed.qps.contains(&q.qpn))
                    .count()
                    + installed
                        .cqs
                        .iter()
                        .filter(|c| failed.cqs.contains(c))
                        .count();
                sample.queues_in_error = u32::try_from(evented).unwrap_or(u32::MAX);
                let mut seen_by = "async-event";
                if evented == 0 && (missed || auditor.errors_grew(track)) {
                    sample.queues_in_error = self.queues_in_error(installed);
                    seen_by = "state-poll";
                }
                sampled += 1;
                let remote = track.remote.and_then(|id| Some((id, o.remote.get(&id)?)));
                if let Some((id, r)) = remote {
                    if r.triggers_seen != sample.triggers {
                        active.push((track.handle, id, sample.triggers));
                    }
                    let client = ClientId {
                        app: o.app_key,
                        addr: r.peer.ip(),
                    };
                    let c = clients
                        .entry(client)
                        .or_insert((budget, Vec::new(), track.handle));
                    c.1.push((track.handle, id, sample.since(at_install)));
                    c.2 = track.handle;
                }
                let (verdict, queue_error) =
                    auditor.observe_track(track, budget, at_install, sample, &clock);
                if queue_error {
                    verdicts.push((track, None, sample, seen_by));
                }
                if verdict.is_some() {
                    verdicts.push((track, verdict, sample, seen_by));
                }
            }
        }
        let now = clock.now();
        for (handle, id, triggers) in active {
            if let Some(r) = self
                .installed
                .get_mut(&handle)
                .and_then(|o| o.remote.get_mut(&id))
            {
                r.triggers_seen = triggers;
                r.active_at = now;
            }
        }
        for (track, verdict, sample, seen_by) in verdicts {
            match (verdict, track.remote) {
                (None, remote) => {
                    let mut r = self
                        .track_record(Event::QueueError, Severity::Warning, track)
                        .field("queues", sample.queues_in_error)
                        .field("errors", sample.errors)
                        .field("seen_by", seen_by);
                    // A remote client's instance with a queue in error can never serve again
                    // (a QP stays in error): it is released, so that it holds none of the
                    // app's `max_remote_clients` slots, and the data plane's reap closes
                    // the client's connection. (An app's own install stays for the app to
                    // see and uninstall.)
                    if let Some(id) = remote {
                        self.detach_remote(track.handle, id);
                        let released = !self.has_remote(track.handle, id);
                        if released {
                            self.failed_remotes.insert((track.handle, id));
                        }
                        r = r.field("released", released);
                    }
                    self.outbox.push(r.res(false));
                }
                (Some(Verdict::Throttle(v, limit)), _) => self.throttle(track, Some(&v), limit),
                (Some(Verdict::Unthrottle(limit)), _) => self.throttle(track, None, limit),
                (Some(Verdict::Terminate(v)), None) => self.terminate(track.handle, &v, None),
                (Some(Verdict::Ban(v, span)), None) => {
                    self.terminate(track.handle, &v, Some(span));
                }
                (Some(Verdict::Terminate(v)), Some(id)) => {
                    self.terminate_remote(track.handle, id, &v, None);
                }
                // A remote client is not the app: its address is banned, not the app.
                (Some(Verdict::Ban(v, span)), Some(id)) => {
                    let client = self.installed.get(&track.handle).and_then(|o| {
                        let r = o.remote.get(&id)?;
                        Some(ClientId {
                            app: o.app_key,
                            addr: r.peer.ip(),
                        })
                    });
                    self.terminate_remote(track.handle, id, &v, Some(span));
                    if let Some(client) = client {
                        self.forget_banned_client(auditor, client);
                    }
                }
            }
        }
        // Each remote client's rates, over every instance it held: what it did in those it
        // has now, and in those released before.
        let mut client_verdicts = Vec::new();
        for (client, (budget, sessions, handle)) in clients {
            // Sessions the verdicts above released are in `retired_clients` now: counted
            // there, not twice.
            let held = sessions
                .iter()
                .filter(|(h, id, _)| self.has_remote(*h, *id))
                .map(|(_, _, s)| *s)
                .reduce(Sample::plus);
            // None: all released this round (terminated, banned, failed): nothing left to
            // pace, and what they did is judged if the client comes back.
            let Some(live) = held else {
                continue;
            };
            let total = self
                .retired_clients
                .get(&client)
                .map_or(live, |r| live.plus(*r));
            if let Some(v) = auditor.observe_client(client, budget, total, &clock) {
                client_verdicts.push((client, handle, v));
            }
        }
        for (client, handle, verdict) in client_verdicts {
            match verdict {
                Verdict::Throttle(v, limit) => {
                    self.pace_client(client, handle, Some((&v, limit)));
                }
                Verdict::Unthrottle(_) => self.pace_client(client, handle, None),
                Verdict::Terminate(v) => self.terminate_client(client, &v, None),
                Verdict::Ban(v, span) => {
                    self.terminate_client(client, &v, Some(span));
                    self.forget_banned_client(auditor, client);
                }
            }
        }
        auditor.retain(
            |t| match t.remote {
                None => self.installed.contains_key(&t.handle),
                Some(id) => self.has_remote(t.handle, id),
            },
            &clock,
        );
        // What the auditor no longer remembers need not be kept either: a client coming
        // back after that starts a new window, which its old counts would not enter.
        self.retired_clients.retain(|c, _| auditor.knows_client(*c));
        self.client_pacing
            .retain(|c, _| auditor.is_client_throttled(*c));
        self.bans.expire(&clock);
        sampled
    }

    /// Take the receive completions waiting on the client-facing CQ of every instance of
    /// offload `only` (of every offload: `None`) and keep their timestamps. Nothing else
    /// reads those CQs: they exist for the program's WAITs, which count completions
    /// written, not taken, so taking them changes nothing the program sees.
    pub(super) fn harvest_arrivals(&mut self, only: Option<u64>) {
        use redn_program::wqe::CqeOpcode;
        let nic = std::sync::Arc::clone(&self.nic);
        let mut out = Vec::new();
        for (handle, o) in &mut self.installed {
            if only.is_some_and(|h| h != *handle) {
                continue;
            }
            let Some(client) = o
                .program
                .queues
                .iter()
                .position(|q| q.role == QueueRole::Client)
            else {
                continue;
            };
            let mut stamps = Vec::new();
            let instances =
                std::iter::once(&o.installed).chain(o.remote.values().map(|r| &r.installed));
            for cq in instances.filter_map(|i| i.cqs.get(client).copied()) {
                for _ in 0..HARVEST_POLLS {
                    out.clear();
                    if !matches!(nic.poll_cq(cq, 256, &mut out), Ok(n) if n > 0) {
                        break;
                    }
                    stamps.extend(
                        out.iter()
                            .filter(|c| {
                                c.is_ok()
                                    && matches!(
                                        c.opcode,
                                        CqeOpcode::RespSend | CqeOpcode::RespSendImm
                                    )
                            })
                            .map(|c| c.cqe.timestamp),
                    );
                }
            }
            for t in stamps {
                o.arrivals.add(t);
            }
        }
    }

    /// `io.redn.Admin.TriggerTimes`: when offload `handle`'s triggers arrived since the last
    /// call (all its instances: the app's and each remote client's), oldest first, from the
    /// timestamps of their receive completions, and how many older ones were dropped
    /// (more than `MAX_ARRIVALS`, 4,096, between two calls). The auditor's rounds collect
    /// them, and so does this call first, so a caller sees every trigger that arrived before
    /// it asked.
    ///
    /// With the timestamp of the response's receive completion on the client's softnic
    /// (`redn_client::remote::Response::received_ns`, the same host clock), a benchmark gets
    /// the span from the trigger reaching the server's NIC to the response reaching the
    /// client's, without the client's own wake-ups.
    ///
    /// # Errors
    /// `NoSuchOffload`.
    pub fn trigger_times(&mut self, handle: u64) -> Result<api::TriggerTimesReply, AdminError> {
        if !self.installed.contains_key(&handle) {
            return Err(AdminError::NoSuchOffload { handle });
        }
        self.harvest_arrivals(Some(handle));
        let o = self
            .installed
            .get_mut(&handle)
            .ok_or(AdminError::NoSuchOffload { handle })?;
        let mut received_ns: Vec<u64> = std::mem::take(&mut o.arrivals.times).into();
        // Instances are taken one after another: their stamps interleave.
        received_ns.sort_unstable();
        Ok(api::TriggerTimesReply {
            received_ns,
            dropped: std::mem::take(&mut o.arrivals.dropped),
        })
    }

    /// [`Manager::offload_record`], naming the remote client's instance (the data plane's
    /// id and the client's address) when `track` is one.
    fn track_record(&self, kind: Event, sev: Severity, track: TrackId) -> Record {
        let r = self.offload_record(kind, sev, track.handle);
        let Some(id) = track.remote else {
            return r;
        };
        let r = r.field("instance", id);
        match self
            .installed
            .get(&track.handle)
            .and_then(|o| o.remote.get(&id))
        {
            Some(i) => r.field("peer", i.peer),
            None => r,
        }
    }

    /// The queues of `track`'s instance.
    fn track_queues(&self, track: TrackId) -> Vec<redn_sys::Qpn> {
        let Some(o) = self.installed.get(&track.handle) else {
            return Vec::new();
        };
        let installed = match track.remote {
            None => Some(&o.installed),
            Some(id) => o.remote.get(&id).map(|r| &r.installed),
        };
        installed.map_or_else(Vec::new, |i| i.qps.iter().map(|q| q.qpn).collect())
    }

    /// Pace the queues of `track`'s instance at `limit`: a throttle for violation `v`, or
    /// with `None` the lifting of one.
    fn throttle(&mut self, track: TrackId, v: Option<&Violation>, limit: redn_sys::nic::RateLimit) {
        let queues = self.track_queues(track);
        if queues.is_empty() {
            return;
        }
        let mut ok = true;
        for qpn in queues {
            ok &= self.nic.set_rate_limit(qpn, limit).is_ok();
        }
        if track.remote.is_none() {
            // The offload's `limit` stays its rule's: each remote client is judged and
            // throttled as a client of its own, never at the app's pace (a client that
            // came while the app was throttled would keep that pace after the lift).
            if v.is_some() {
                self.own_throttled.insert(track.handle);
            } else {
                self.own_throttled.remove(&track.handle);
            }
        }
        let r = match v {
            Some(v) => self
                .track_record(Event::Throttle, Severity::Warning, track)
                .field("rule", v.rule())
                .fields(v.details()),
            None => self.track_record(Event::Unthrottle, Severity::Notice, track),
        };
        let r = r
            .field("paced_wqes_per_s", limit.wqes_per_sec)
            .field("paced_bytes_per_s", limit.bytes_per_sec)
            .res(ok);
        self.outbox.push(r);
    }

    /// Terminate offload `handle`: its queues to error (nothing in flight runs on), then
    /// uninstalled (keys revoked, memory and queues freed); its client told through `Stats`;
    /// with `ban`, its app (rule and uid) refused installs for that long.
    fn terminate(&mut self, handle: u64, v: &Violation, ban: Option<Option<std::time::Duration>>) {
        let Some(o) = self.installed.get(&handle) else {
            return;
        };
        let (client, app, offload) = (o.client, o.app.clone(), o.program.name.clone());
        let uid = self.clients.get(&client).map(|c| c.identity.uid);
        for q in &o.installed.qps {
            let _ = self.nic.set_qp_error(q.qpn);
        }
        let record = self
            .offload_record(Event::Terminate, Severity::Warning, handle)
            .field("rule", v.rule())
            .fields(v.details());
        let removed = self.remove_offload(handle);
        self.outbox.push(record.res(removed));
        self.notes
            .entry(client)
            .or_default()
            .note_offload(api::TerminatedOffload {
                handle,
                offload,
                rule: v.rule().into(),
                banned: ban.is_some(),
            });
        if let (Some(span), Some(uid)) = (ban, uid) {
            let who = Banned::App {
                app: app.clone(),
                uid,
            };
            let kept = self.bans.ban(who, span, redn_sys::clock::SystemClock);
            let r = Record::new(Event::Ban, Severity::Warning)
                .field("client", client)
                .field("uid", uid)
                .field("app", &app)
                .field("handle", handle)
                .field("duration", describe_span(kept))
                .field("rule", v.rule())
                .res(true);
            self.outbox.push(r);
        }
        self.forget_if_idle(client);
    }

    /// A client whose connection closed and that holds nothing more is forgotten.
    fn forget_if_idle(&mut self, client: u64) {
        let holds = self.installed.values().any(|o| o.client == client);
        if !holds && self.clients.get(&client).is_some_and(|c| !c.connected) {
            self.forget(client);
        }
    }

    /// Why app `app` run by `uid` may not install now, if it is banned.
    pub(super) fn ban_refusal(&self, app: &str, uid: u32) -> Option<String> {
        let left = self.ban_left(Banned::App {
            app: app.to_owned(),
            uid,
        })?;
        Some(format!(
            "app {app:?} (uid {uid}) is banned by the auditor for {left} more"
        ))
    }

    /// Why a process with `identity` may not connect now: its app (the rule it matches,
    /// and its uid) is banned. Reconnects are refused for the ban's duration; a connection
    /// already open stays, so the app can read `Stats`.
    pub fn connect_refusal(&self, identity: &redn_policy::PeerIdentity) -> Option<String> {
        let app = self.policy.match_app(identity)?;
        self.ban_refusal(&app.name, identity.uid)
    }

    /// Why a remote client at `addr` may not say hello to the offloads of app `app`
    /// (numbered `key` for its remote clients) now: its address is banned, by the auditor
    /// or an administrator (`BanRemote`); the refusal does not say which, as it cannot
    /// know (a ban never shortens another: it may be both).
    pub fn remote_ban_refusal(
        &self,
        app: &str,
        key: crate::auditor::AppKey,
        addr: std::net::IpAddr,
    ) -> Option<String> {
        let left = self.ban_left(Banned::Remote { app: key, addr })?;
        Some(format!(
            "address {addr} is banned from app {app:?}'s offloads for {left} more"
        ))
    }

    /// What is left of `who`'s ban, if banned, for a refusal's reason (rounded up to
    /// whole seconds, or `infinity`).
    fn ban_left(&self, who: Banned) -> Option<String> {
        let left = self.bans.banned(&who, redn_sys::clock::SystemClock)?;
        Some(describe_span(
            left.map(|d| d + std::time::Duration::from_secs(1)),
        ))
    }

    /// The offloads the auditor terminated for `client` (for `Stats`).
    pub(super) fn notes_of(&self, client: u64) -> Option<Vec<api::TerminatedOffload>> {
        let n = &self.notes.get(&client)?.offloads;
        (!n.is_empty()).then(|| n.clone())
    }

    /// The remote clients' instances of `client`'s offloads the auditor terminated, newest
    /// last (for `Stats`).
    pub(super) fn remote_notes_of(&self, client: u64) -> Option<Vec<api::TerminatedRemote>> {
        let n = &self.notes.get(&client)?.remote;
        (!n.is_empty()).then(|| n.iter().cloned().collect())
    }

    /// Tear down offload `handle` for `why`, leaving a `teardown` record.
    pub(super) fn tear_down(&mut self, handle: u64, why: Teardown) {
        let r = self
            .offload_record(Event::Teardown, Severity::Notice, handle)
            .field("reason", why.as_str());
        let ok = self.remove_offload(handle);
        self.outbox.push(r.res(ok));
    }

    /// After a reload: tear down every installed offload whose client no rule matches any
    /// more, whose rule changed, or whose rule no longer allows it.
    pub(super) fn enforce_reloaded_policy(&mut self) -> usize {
        let doomed: Vec<u64> = self
            .installed
            .iter()
            .filter(|(_, o)| {
                let rule = self
                    .clients
                    .get(&o.client)
                    .and_then(|c| self.policy.match_app(&c.identity));
                !rule.is_some_and(|r| r.name == o.app && r.allows_offload(&o.program.name))
                    || !self.offloads.contains_key(&o.program.name)
            })
            .map(|(h, _)| *h)
            .collect();
        for h in &doomed {
            self.tear_down(*h, Teardown::Reload);
        }
        self.own_throttled.retain(|h| !doomed.contains(h));
        self.repace_after_reload();
        let clients: Vec<u64> = self.clients.keys().copied().collect();
        for c in clients {
            self.forget_if_idle(c);
        }
        doomed.len()
    }

    /// A reload may have changed an app's `rate_limit_kbps`: pace what it installed as the
    /// new rule says (every queue of the app's install and of its remote clients' instances)
    /// and as new instances will be, except what the auditor throttled (paced at its budgets,
    /// which the next audit round reads from the new rule). The app's install and each
    /// remote client are apart: a throttled install's unthrottled clients are re-paced.
    fn repace_after_reload(&mut self) {
        let handles: Vec<u64> = self.installed.keys().copied().collect();
        for h in handles {
            let Some(o) = self.installed.get(&h) else {
                continue;
            };
            let Some(rule) = self.policy.app(&o.app) else {
                continue;
            };
            // As at install, and as an unthrottled client is paced again.
            let limit = Budget::of(rule).install_limit();
            if limit == o.limit {
                continue;
            }
            let own: Vec<redn_sys::Qpn> = o.installed.qps.iter().map(|q| q.qpn).collect();
            let app_key = o.app_key;
            let addrs: std::collections::BTreeSet<std::net::IpAddr> =
                o.remote.values().map(|r| r.peer.ip()).collect();
            if let Some(o) = self.installed.get_mut(&h) {
                o.limit = limit;
            }
            if !self.own_throttled.contains(&h) {
                for q in own {
                    let _ = self.nic.set_rate_limit(q, limit);
                }
            }
            for addr in addrs {
                let client = ClientId { app: app_key, addr };
                if !self.client_pacing.contains_key(&client) {
                    self.pace_client_queues(client);
                }
            }
        }
    }

    /// The app behind `client` exited (its pidfd said so): apply its rule's
    /// `keep_serving_after_exit` and leave an `app-exit` record. Returns (kept, torn down).
    pub fn app_exited(&mut self, client: u64) -> (usize, usize) {
        let Some(c) = self.clients.get(&client) else {
            return (0, 0);
        };
        let identity = c.identity.clone();
        let rule = self.policy.match_app(&identity).map(|a| a.name.clone());
        let keep = self
            .policy
            .match_app(&identity)
            .is_some_and(|a| a.keep_serving_after_exit);
        let handles = self.handles_of(client);
        let mut record = Record::new(Event::AppExit, Severity::Notice)
            .field("client", client)
            .peer(&identity)
            .field("app", rule.unwrap_or_default())
            .field("policy", if keep { "keep" } else { "tear-down" });
        if keep {
            record = record.field("kept", handles.len()).field("torn_down", 0);
            self.outbox.push(record.res(true));
        } else {
            record = record.field("kept", 0).field("torn_down", handles.len());
            self.outbox.push(record.res(true));
            for h in &handles {
                self.tear_down(*h, Teardown::AppExit);
            }
        }
        if let Some(c) = self.clients.get_mut(&client) {
            c.connected = false;
        }
        self.forget_if_idle(client);
        if keep {
            (handles.len(), 0)
        } else {
            (0, handles.len())
        }
    }

    /// `io.redn.Admin.TestRun`: send `count` copies of `trigger` into offload `handle`
    /// from its parking queue, each with a receive posted for its response.
    ///
    /// # Errors
    /// `NoSuchOffload`; `TestRunFailed` when the trigger is not the offload's length, too
    /// many are outstanding, or the NIC refuses the post.
    pub fn test_run(
        &mut self,
        handle: u64,
        trigger: &[u8],
        count: u32,
    ) -> Result<api::TestRunReply, AdminError> {
        let o = self
            .installed
            .get_mut(&handle)
            .ok_or(AdminError::NoSuchOffload { handle })?;
        let failed = |reason: String| AdminError::TestRunFailed { reason };
        if trigger.len() != o.program.trigger_len as usize {
            return Err(failed(format!(
                "offload {:?} takes {}-byte triggers, got {}",
                o.program.name,
                o.program.trigger_len,
                trigger.len()
            )));
        }
        let qpn = o._parking._qp.qpn();
        let done = self.nic.counters(qpn).map_or(0, |c| c.total_wqes());
        let outstanding = o._parking.sends.saturating_sub(done);
        let room = u64::from(MAX_TEST_RUN).saturating_sub(outstanding);
        let n = u64::from(count).min(room);
        for _ in 0..n {
            self.nic
                .post_recv(qpn, 0, &[])
                .map_err(|e| failed(e.to_string()))?;
            let wr = WorkRequest {
                wr_id: 0,
                flags: WqeFlags::NONE,
                op: WrOp::Send {
                    payload: Payload::Inline(trigger.to_vec()),
                    imm: None,
                },
            };
            self.nic
                .post_send(qpn, &[wr])
                .map_err(|e| failed(e.to_string()))?;
            o._parking.sends += 1;
        }
        Ok(api::TestRunReply {
            sent: u32::try_from(n).unwrap_or(u32::MAX),
        })
    }
}

mod remote_clients;
#[cfg(test)]
mod tests;
