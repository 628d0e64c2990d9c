//! Clients' lifecycle: a connection's client, what it takes over from earlier connections
//! of the same app ([`Manager::adopt`]), its hang-up ([`Manager::disconnect`]), and
//! forgetting it with what was kept for it.

use super::*;

impl Manager {
    /// A new client for a connection from `identity`. The server then lets it take over
    /// what earlier connections of the same app left serving ([`Manager::adopt`]).
    pub fn connect(&mut self, identity: PeerIdentity) -> u64 {
        let id = self.fresh_id();
        self.clients.insert(
            id,
            Client {
                id,
                identity,
                connected: true,
                regions: BTreeMap::new(),
            },
        );
        id
    }

    /// Give `client` the regions and offloads of every closed connection of the same app:
    /// the same uid, matched by the same app rule. An app that restarts can then see its
    /// offloads' counters and uninstall them. Rights follow the policy's identity (uid and
    /// rule), never a pid, and the adopted resources count against the new client's quotas.
    /// Returns the offloads adopted.
    pub fn adopt(&mut self, client: u64) -> usize {
        let Some(me) = self.clients.get(&client) else {
            return 0;
        };
        let uid = me.identity.uid;
        let Some(rule) = self.policy.match_app(&me.identity).map(|a| a.name.clone()) else {
            return 0;
        };
        let orphans: Vec<u64> = self
            .clients
            .values()
            .filter(|c| !c.connected && c.identity.uid == uid)
            .filter(|c| {
                self.policy
                    .match_app(&c.identity)
                    .is_some_and(|a| a.name == rule)
            })
            .map(|c| c.id)
            .collect();
        let mut adopted = 0;
        for old in orphans {
            let Some(c) = self.clients.remove(&old) else {
                continue;
            };
            if let Some(me) = self.clients.get_mut(&client) {
                me.regions.extend(c.regions.into_iter().map(|(id, mut r)| {
                    r.adopted = true;
                    (id, r)
                }));
            }
            if let Some(notes) = self.notes.remove(&old) {
                self.notes.entry(client).or_default().merge(notes);
            }
            for o in self.installed.values_mut().filter(|o| o.client == old) {
                o.client = client;
                adopted += 1;
            }
        }
        self.release_unbound_adopted(client);
        adopted
    }

    /// Release `client`'s adopted regions that none of its offloads binds: nothing can use
    /// them again (see `Region::adopted`), and kept they would count against the app's
    /// quotas for as long as any of its offloads serves. An app that restarts under
    /// `keep_serving_after_exit`, installs anew and uninstalls its old offload would
    /// otherwise strand a region a restart until `max_regions` refused it.
    pub(super) fn release_unbound_adopted(&mut self, client: u64) {
        let bound = |buffer: &Arc<SharedBuffer>| {
            self.installed
                .values()
                .filter(|o| o.client == client)
                .flat_map(|o| o.data_bindings.values())
                .any(|b| matches!(b, RegionBinding::Local { buffer: held, .. } if Arc::ptr_eq(held, buffer)))
        };
        let Some(c) = self.clients.get(&client) else {
            return;
        };
        let unbound: Vec<u64> = c
            .regions
            .iter()
            .filter(|(_, r)| r.adopted && !bound(&r.buffer))
            .map(|(id, _)| *id)
            .collect();
        if let Some(c) = self.clients.get_mut(&client) {
            for id in unbound {
                c.regions.remove(&id);
            }
        }
    }

    /// Its connection closed: its offloads keep serving if its app rule says so
    /// (`keep_serving_after_exit`, the default), else they are uninstalled; a client
    /// with no offloads left is forgotten. Returns the offloads uninstalled.
    pub fn disconnect(&mut self, client: u64) -> usize {
        let keep = self
            .clients
            .get(&client)
            .and_then(|c| self.policy.match_app(&c.identity))
            .is_some_and(|a| a.keep_serving_after_exit);
        let mut removed = 0;
        if !keep {
            removed = self.uninstall_all(client);
        }
        let holds = self.installed.values().any(|o| o.client == client);
        if holds {
            if let Some(c) = self.clients.get_mut(&client) {
                c.connected = false;
            }
        } else {
            self.forget(client);
        }
        removed
    }

    /// Drop client `client` and what was kept for it: its regions and its notes of what the
    /// auditor terminated (client ids are never reused, so a note left behind would stay
    /// for the life of the daemon).
    pub(super) fn forget(&mut self, client: u64) {
        self.clients.remove(&client);
        self.notes.remove(&client);
    }

    pub(super) fn uninstall_all(&mut self, client: u64) -> usize {
        let handles = self.handles_of(client);
        for h in &handles {
            self.remove_offload(*h);
        }
        handles.len()
    }

    pub(super) fn remove_offload(&mut self, handle: u64) -> bool {
        // Its remote clients' sessions end with it; what they did goes on counting in their
        // rates (a client is the app's, and may go on with its other offloads).
        let sessions: Vec<u64> = self
            .installed
            .get(&handle)
            .map(|o| o.remote.keys().copied().collect())
            .unwrap_or_default();
        for id in sessions {
            self.detach_remote(handle, id);
        }
        match self.installed.remove(&handle) {
            Some(o) => {
                if let Err(e) = o.installed.remove() {
                    crate::audit::to_stderr(&format!(
                        "redn-manager: event=uninstall handle={handle} res=partial error={e}"
                    ));
                }
                true
            }
            None => false,
        }
    }

    /// Uninstall everything (shutdown).
    pub fn shutdown(&mut self) {
        let handles: Vec<u64> = self.installed.keys().copied().collect();
        for h in handles {
            self.tear_down(h, Teardown::Shutdown);
        }
        self.clients.clear();
    }
}
