//! The handlers of `io.redn.Admin`: what an administrator lists, dumps and kills, and the
//! policy reload.

use super::*;
use crate::auditor::Banned;

/// Whose ban `io.redn.Admin.LiftBan` lifts, besides the app's name.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BanTarget {
    /// The app's own installs, by the uid it runs as.
    Uid(u32),
    /// A remote client of the app, by its address.
    Address(std::net::IpAddr),
}

impl std::fmt::Display for BanTarget {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            BanTarget::Uid(uid) => write!(f, "uid {uid}"),
            BanTarget::Address(a) => write!(f, "address {a}"),
        }
    }
}

/// What `io.redn.Admin.BanRemote` did ([`Manager::admin_ban_remote`]).
#[derive(Debug)]
pub struct RemoteBan {
    /// The sessions (offload handle, instance) the address holds with the app's offloads,
    /// for the data plane to end.
    pub sessions: Vec<(u64, u64)>,
    /// What the ban under the rule as it is now has left (`None`: for ever), for the
    /// record.
    pub left: Option<std::time::Duration>,
}

/// `d` in whole nanoseconds, as the admin API's `*_ns` fields carry it (saturating: a span
/// past 584 years reads as `u64::MAX`).
fn nanos(d: std::time::Duration) -> u64 {
    u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)
}

impl Manager {
    /// `io.redn.Admin.ListClients`.
    pub fn admin_clients(&self) -> api::ClientList {
        let clients = self
            .clients
            .values()
            .map(|c| api::ClientEntry {
                id: c.id,
                app: self
                    .policy
                    .match_app(&c.identity)
                    .map_or_else(String::new, |a| a.name.clone()),
                uid: c.identity.uid,
                gid: c.identity.gid,
                pid: i32::try_from(c.identity.pid).unwrap_or(-1),
                exe: c.identity.exe.display().to_string(),
                cgroup: c.identity.cgroup.clone(),
                connected: c.connected,
                regions: u32::try_from(c.regions.len()).unwrap_or(u32::MAX),
                pinned: c.pinned(),
                offloads: u32::try_from(
                    self.installed.values().filter(|o| o.client == c.id).count(),
                )
                .unwrap_or(u32::MAX),
            })
            .collect();
        api::ClientList {
            clients,
            omitted: 0,
            next: None,
        }
    }

    /// `io.redn.Admin.ListOffloads`.
    pub fn admin_offloads(&self) -> api::InstalledList {
        let offloads = self
            .installed
            .iter()
            .map(|(h, o)| {
                let (triggers, wqes, errors) = self.stats_of(o);
                api::InstalledEntry {
                    handle: *h,
                    client: o.client,
                    app: o.app.clone(),
                    offload: o.program.name.clone(),
                    queues: u32::try_from(o.installed.qps.len()).unwrap_or(u32::MAX),
                    keys: u32::try_from(o.installed.code_keys.len()).unwrap_or(u32::MAX),
                    code_bytes: o.installed.code.len() as u64,
                    triggers,
                    wqes,
                    errors,
                    remote_clients: u32::try_from(o.remote.len()).unwrap_or(u32::MAX),
                    remote_terminated: o.remote_terminated,
                    remote_banned: o.remote_banned,
                }
            })
            .collect();
        api::InstalledList {
            offloads,
            omitted: 0,
            next: None,
        }
    }

    /// `io.redn.Admin.ListDevices`: the backend device, with the objects it holds. The
    /// softnic has no GUID or PCI address; the mlx5 backend (which cannot serve yet) would
    /// fill them from the device `[backend]` selected.
    pub fn admin_devices(&self) -> api::DeviceList {
        let objects = self.nic.objects();
        api::DeviceList {
            devices: vec![api::DeviceEntry {
                ifindex: 0,
                ifname: self.nic.name().to_owned(),
                backend: self.backend.clone(),
                node_guid: None,
                pci_address: None,
                dataplane: self.dataplane_endpoint.clone(),
                pd: objects.pds as u64,
                mr: objects.regions as u64,
                cq: objects.cqs as u64,
                qp: objects.qps as u64,
                async_events: self.async_events,
                async_events_lost: self.nic.async_events_lost(),
                // The data plane's, which the server adds (`Server::admin_call`).
                packets_dropped: 0,
                packet_drops: std::collections::BTreeMap::new(),
            }],
        }
    }

    /// `io.redn.Admin.Dump`: the listing and every non-zero 64-byte block of the code
    /// region.
    ///
    /// # Errors
    /// `NoSuchOffload`.
    pub fn admin_dump(&self, handle: u64) -> Result<api::DumpReply, AdminError> {
        let o = self
            .installed
            .get(&handle)
            .ok_or(AdminError::NoSuchOffload { handle })?;
        let code = &o.installed.code;
        let mut wqes = Vec::new();
        let mut block = [0u8; 64];
        for off in (0..code.len()).step_by(64) {
            if off + 64 > code.len() {
                break;
            }
            code.read_block(off, &mut block);
            if block.iter().any(|&b| b != 0) {
                let hex: String = block.iter().map(|b| format!("{b:02x}")).collect();
                wqes.push(format!("{off:06x}: {hex}"));
            }
        }
        Ok(api::DumpReply {
            listing: o.program.listing(),
            code_addr: o.installed.code_addr.0,
            wqes,
        })
    }

    /// `io.redn.Admin.ListRemoteClients`: every remote client's session, by offload and
    /// instance.
    pub fn admin_remotes(&self) -> api::RemoteList {
        let now = std::time::Instant::now();
        let remotes = self
            .installed
            .iter()
            .flat_map(|(h, o)| {
                o.remote.iter().map(move |(id, r)| {
                    let done = self.sample(&o.program, &r.installed).since(r.at_install);
                    let ages = r.ages(now);
                    api::RemoteEntry {
                        handle: *h,
                        instance: *id,
                        app: o.app.clone(),
                        offload: o.program.name.clone(),
                        peer: r.peer.to_string(),
                        held_ns: nanos(ages.held),
                        idle_ns: nanos(ages.idle),
                        triggers: done.triggers,
                    }
                })
            })
            .collect();
        api::RemoteList {
            remotes,
            omitted: 0,
            next: None,
        }
    }

    /// `io.redn.Admin.ListBans`: the bans in force, with the app rule's name (a remote
    /// client's ban is keyed by the rule's number: see `AppKeys`).
    pub fn admin_bans(&self) -> api::BanList {
        let bans = self
            .bans
            .in_force(redn_sys::clock::SystemClock)
            .into_iter()
            .map(|(who, left)| {
                let (app, uid, address) = match who {
                    Banned::App { app, uid } => (app, Some(uid), None),
                    Banned::Remote { app, addr } => (
                        self.app_keys.name_of(app).unwrap_or("").to_owned(),
                        None,
                        Some(addr.to_string()),
                    ),
                };
                api::BanEntry {
                    app,
                    uid,
                    address,
                    left_ns: left.map(nanos),
                }
            })
            .collect();
        api::BanList {
            bans,
            omitted: 0,
            next: None,
        }
    }

    /// `io.redn.Admin.BanRemote`: ban the remote clients at `addr` from app `app`'s offloads
    /// for `span` (`None`: for ever), under every number the rule's name has had (the
    /// installs of a tenant a reload replaced serve on under theirs); the sessions the
    /// address holds with them, for the data plane to end, and what is left of the ban
    /// under the rule as it is now (`None`: for ever; a ban in force that ends later is
    /// kept: see `Bans::ban`), for the record. What `auditor` and enforcement held of the
    /// address as the app's client goes (`forget_banned_client`): after its ban it starts
    /// afresh, as after the auditor's own ban.
    ///
    /// # Errors
    /// `NoSuchApp` if the policy has no rule of that name.
    pub fn admin_ban_remote(
        &mut self,
        auditor: &mut crate::auditor::Auditor,
        app: &str,
        addr: std::net::IpAddr,
        span: Option<std::time::Duration>,
    ) -> Result<RemoteBan, AdminError> {
        let rule = self.policy.app(app).ok_or_else(|| AdminError::NoSuchApp {
            app: app.to_owned(),
        })?;
        // The number a new install under the rule gets, so that the ban holds for it too.
        let current = self.app_keys.key(app, &rule.matchers);
        let keys = self.app_keys.keys_named(app);
        let mut sessions = Vec::new();
        let mut left = span;
        for key in keys {
            let who = Banned::Remote { app: key, addr };
            let kept = self.bans.ban(who, span, redn_sys::clock::SystemClock);
            if key == current {
                left = kept;
            }
            let client = crate::auditor::ClientId { app: key, addr };
            sessions.extend(self.sessions_of(client));
            self.forget_banned_client(auditor, client);
        }
        Ok(RemoteBan { sessions, left })
    }

    /// `io.redn.Admin.LiftBan`: lift the ban on app `app`'s installs by `uid`, or on its
    /// remote clients at `address`: of every rule the name has had (a reload that gave the
    /// name to other processes numbered it anew, and both may have banned the address).
    /// Returns how many were lifted, and what to call the target in records.
    ///
    /// # Errors
    /// `NoSuchBan` if none is in force.
    pub fn admin_lift_ban(
        &mut self,
        app: &str,
        target: BanTarget,
    ) -> Result<api::Lifted, AdminError> {
        let clock = redn_sys::clock::SystemClock;
        let who: Vec<Banned> = match target {
            BanTarget::Uid(uid) => vec![Banned::App {
                app: app.to_owned(),
                uid,
            }],
            BanTarget::Address(addr) => self
                .bans
                .in_force(clock)
                .into_iter()
                .filter_map(|(who, _)| match who {
                    Banned::Remote { app: key, addr: a }
                        if a == addr && self.app_keys.name_of(key) == Some(app) =>
                    {
                        Some(who)
                    }
                    _ => None,
                })
                .collect(),
        };
        let lifted = who.iter().filter(|w| self.bans.lift(w, clock)).count();
        if lifted == 0 {
            return Err(AdminError::NoSuchBan {
                app: app.to_owned(),
                target: target.to_string(),
            });
        }
        Ok(api::Lifted {
            lifted: u32::try_from(lifted).unwrap_or(u32::MAX),
        })
    }

    /// `io.redn.Admin.KillClient`: uninstall its offloads and forget it; the server closes
    /// its connection.
    ///
    /// # Errors
    /// `NoSuchClient`.
    pub fn admin_kill(&mut self, client: u64) -> Result<api::Killed, AdminError> {
        if !self.clients.contains_key(&client) {
            return Err(AdminError::NoSuchClient { client });
        }
        let n = self.uninstall_all(client);
        self.forget(client);
        Ok(api::Killed {
            uninstalled: u32::try_from(n).unwrap_or(u32::MAX),
        })
    }

    /// `io.redn.Admin.ReloadPolicy` (and SIGHUP): load policy.toml and the offload
    /// definitions in `offloads.d/` beside it again, all or nothing; then tear down (with a
    /// `teardown` record each) the installed offloads the new files no longer allow.
    ///
    /// # Errors
    /// `ReloadFailed` naming the file, line and key; the old policy and definitions stay.
    pub fn reload_policy(&mut self) -> Result<api::Reloaded, AdminError> {
        let failed = |e: redn_policy::Error| AdminError::ReloadFailed {
            reason: e.to_string(),
        };
        let policy = redn_policy::load_policy(&self.policy_path).map_err(failed)?;
        let dir = self
            .policy_path
            .parent()
            .map(|d| d.join("offloads.d"))
            .filter(|d| d.is_dir());
        let offloads = match dir {
            Some(d) => Some(redn_policy::load_offloads_dir(&d).map_err(failed)?),
            // Without offloads.d/ the manager serves the built-in catalog, which never changes.
            None => None,
        };
        let apps = u32::try_from(policy.apps().len()).unwrap_or(u32::MAX);
        self.policy = policy;
        if let Some(offloads) = offloads {
            self.offloads = offloads.into_iter().map(|p| (p.name.clone(), p)).collect();
        }
        self.enforce_reloaded_policy();
        Ok(api::Reloaded { apps })
    }
}
