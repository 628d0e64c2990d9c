//! The handlers of `io.redn.Admin`: what an administrator lists, dumps and kills, and the
//! policy reload.

use super::*;

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
        api::ClientList { clients }
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
        api::InstalledList { offloads }
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
