//! Remote clients' side of enforcement: a client (its app and address, [`ClientId`]) is
//! paced, terminated and banned over all its sessions with the app's offloads; one
//! instance over its loop budget is terminated alone.

use super::super::Manager;
use crate::audit::{Event, Severity};
use crate::auditor::{describe_span, Auditor, Banned, ClientId, TrackId, Violation};
use redn_proto::api;
use redn_sys::nic::RateLimit;

/// `limit` shared out among `n` queues: each rate a share (at least 1: 0 is "not paced").
fn share(limit: RateLimit, n: usize) -> RateLimit {
    let n = u64::try_from(n.max(1)).unwrap_or(u64::MAX);
    let part = |r: u64| if r == 0 { 0 } else { (r / n).max(1) };
    RateLimit {
        wqes_per_sec: part(limit.wqes_per_sec),
        bytes_per_sec: part(limit.bytes_per_sec),
    }
}

impl Manager {
    /// Remote client `id`'s instance of offload `handle` broke its budget: its queues to
    /// error (nothing in flight runs on), then released; the data plane's reap closes the
    /// client's connection. With `ban`, the client's address may not say hello to the app's
    /// offloads for that long. The app's install and its other remote clients run on; the
    /// app learns of it through `Stats`.
    pub(super) fn terminate_remote(
        &mut self,
        handle: u64,
        id: u64,
        v: &Violation,
        ban: Option<Option<std::time::Duration>>,
    ) {
        let track = TrackId::remote(handle, id);
        let queues = self.track_queues(track);
        let Some(o) = self.installed.get(&handle) else {
            return;
        };
        let Some(peer) = o.remote.get(&id).map(|r| r.peer) else {
            return;
        };
        let (client, offload) = (o.client, o.program.name.clone());
        let app_key = o.app_key;
        for qpn in queues {
            let _ = self.nic.set_qp_error(qpn);
        }
        let record = self
            .track_record(Event::Terminate, Severity::Warning, track)
            .field("rule", v.rule())
            .fields(v.details());
        // Banned at once (nothing below reads the bans): the record says what holds.
        let ban_record = ban.map(|span| {
            let who = Banned::Remote {
                app: app_key,
                addr: peer.ip(),
            };
            let kept = self.bans.ban(who, span, redn_sys::clock::SystemClock);
            self.track_record(Event::Ban, Severity::Warning, track)
                .field("address", peer.ip())
                .field("duration", describe_span(kept))
                .field("rule", v.rule())
                .res(true)
        });
        self.detach_remote(handle, id);
        let released = !self.has_remote(handle, id);
        self.outbox.push(record.res(released));
        if let Some(o) = self.installed.get_mut(&handle) {
            o.remote_terminated += 1;
            o.remote_banned += u64::from(ban.is_some());
        }
        let banned = ban.is_some();
        if let Some(r) = ban_record {
            self.outbox.push(r);
        }
        self.notes
            .entry(client)
            .or_default()
            .note_remote(api::TerminatedRemote {
                handle,
                offload,
                instance: id,
                peer: peer.to_string(),
                rule: v.rule().into(),
                banned,
            });
        if banned {
            let client = ClientId {
                app: app_key,
                addr: peer.ip(),
            };
            self.end_sessions_of_banned(client, v);
        }
    }

    /// Throttle remote `client` for violation `v` at `limit` (over all its instances'
    /// queues together), or with `None` lift its throttle; with an audit record naming
    /// offload `handle` (where it was last seen).
    pub(super) fn pace_client(
        &mut self,
        client: ClientId,
        handle: u64,
        throttle: Option<(&Violation, RateLimit)>,
    ) {
        match throttle {
            Some((_, limit)) => self.client_pacing.insert(client, limit),
            None => self.client_pacing.remove(&client),
        };
        let (ok, instances) = self.pace_client_queues(client);
        let r = match throttle {
            Some((v, _)) => self
                .offload_record(Event::Throttle, Severity::Warning, handle)
                .field("address", client.addr)
                .field("rule", v.rule())
                .fields(v.details()),
            None => self
                .offload_record(Event::Unthrottle, Severity::Notice, handle)
                .field("address", client.addr),
        };
        let installed = self.installed.get(&handle).map(|o| o.limit);
        let paced = throttle.map(|t| t.1).or(installed).unwrap_or_default();
        let r = r
            .field("instances", instances)
            .field("paced_wqes_per_s", paced.wqes_per_sec)
            .field("paced_bytes_per_s", paced.bytes_per_sec)
            .res(ok);
        self.outbox.push(r);
    }

    /// Pace every queue of remote `client`'s instances: at its throttle limit shared out
    /// among them (each queue a share, so that together they stay within it whichever of
    /// them does the work), or as the offload's queues are paced if it is not throttled.
    /// Whether every queue took it, and how many instances it has.
    pub(in crate::state) fn pace_client_queues(&mut self, client: ClientId) -> (bool, usize) {
        // Each queue with the unthrottled pace of its offload.
        let sessions = self.sessions_of(client);
        let queues: Vec<(redn_sys::Qpn, RateLimit)> = sessions
            .iter()
            .filter_map(|(h, id)| {
                let o = self.installed.get(h)?;
                Some((o, o.remote.get(id)?))
            })
            .flat_map(|(o, r)| r.installed.qps.iter().map(|q| (q.qpn, o.limit)))
            .collect();
        let n = sessions.len();
        let throttle = self
            .client_pacing
            .get(&client)
            .map(|l| share(*l, queues.len()));
        let mut ok = true;
        for (q, unthrottled) in queues {
            ok &= self
                .nic
                .set_rate_limit(q, throttle.unwrap_or(unthrottled))
                .is_ok();
        }
        (ok, n)
    }

    /// Every session (offload handle, instance id) remote `client` holds, with any of its
    /// app's offloads.
    pub(in crate::state) fn sessions_of(&self, client: ClientId) -> Vec<(u64, u64)> {
        self.installed
            .iter()
            .filter(|(_, o)| o.app_key == client.app)
            .flat_map(|(h, o)| {
                o.remote
                    .iter()
                    .filter(|(_, r)| r.peer.ip() == client.addr)
                    .map(|(id, _)| (*h, *id))
            })
            .collect()
    }

    /// Remote `client` was banned (by the auditor or an administrator): what enforcement
    /// holds of it goes, the auditor's rate window, throttle and escalation, its pace and
    /// what its released sessions did. Its sessions have ended and its hellos are refused,
    /// so nothing of it is judged or paced meanwhile; kept, a client whose ban is shorter
    /// than [`crate::auditor::CLIENT_MEMORY`] came back throttled (or, without a pace,
    /// believed throttled by the auditor) and was escalated past throttling for what it did
    /// before its ban. After its ban it starts afresh, as a client the auditor terminated
    /// does.
    pub(in crate::state) fn forget_banned_client(
        &mut self,
        auditor: &mut Auditor,
        client: ClientId,
    ) {
        auditor.forget_client(client);
        self.client_pacing.remove(&client);
        self.retired_clients.remove(&client);
    }

    /// Remote `client` was just banned from its app's offloads: its other sessions with any
    /// of them end too (terminated for `v`, without a ban record of their own), as new ones
    /// are refused: a ban is of the address, not of the offload it flooded.
    fn end_sessions_of_banned(&mut self, client: ClientId, v: &Violation) {
        self.client_pacing.remove(&client);
        for (handle, id) in self.sessions_of(client) {
            self.terminate_remote(handle, id, v, None);
        }
    }

    /// Remote `client` broke its budget past throttling: every instance it holds, with any
    /// of its app's offloads, is terminated, and with `ban` its address banned (once).
    pub(super) fn terminate_client(
        &mut self,
        client: ClientId,
        v: &Violation,
        ban: Option<Option<std::time::Duration>>,
    ) {
        self.client_pacing.remove(&client);
        for (i, (handle, id)) in self.sessions_of(client).into_iter().enumerate() {
            self.terminate_remote(handle, id, v, if i == 0 { ban } else { None });
        }
    }
}
