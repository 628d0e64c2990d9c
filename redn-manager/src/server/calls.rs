//! Calls: one message decoded, checked against its interface and the peer, handed to the
//! [`crate::state::Manager`], and its reply (or named error) encoded.

use super::{Server, SocketKind};
use crate::audit::{Event, Record, Severity};
use redn_proto::api::{self, ADMIN, SERVICE};
use redn_proto::codec::{Call, Reply};
use redn_proto::errors::{AdminError, ManagerError, Named, ServiceError, WireError};
use redn_proto::idl;
use serde::de::DeserializeOwned;
use serde::Serialize;
use serde_json::{Map, Value};
use std::os::fd::OwnedFd;
use std::time::{Duration, Instant};

impl Server {
    pub(super) fn handle_message(&mut self, token: usize, msg: &[u8]) {
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
            "ListClients" => decode::<api::ListPage>(call).and_then(|p| {
                let mut list = m.admin_clients();
                (list.omitted, list.next) = page(&mut list.clients, p, list_budget(&m.limits))?;
                encode(&list)
            }),
            "ListOffloads" => decode::<api::ListPage>(call).and_then(|p| {
                let mut list = m.admin_offloads();
                (list.omitted, list.next) = page(&mut list.offloads, p, list_budget(&m.limits))?;
                encode(&list)
            }),
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
            "ListRemoteClients" => decode::<api::ListPage>(call).and_then(|p| {
                let mut list = m.admin_remotes();
                (list.omitted, list.next) = page(&mut list.remotes, p, list_budget(&m.limits))?;
                encode(&list)
            }),
            "ListBans" => decode::<api::ListPage>(call).and_then(|p| {
                let mut list = m.admin_bans();
                (list.omitted, list.next) = page(&mut list.bans, p, list_budget(&m.limits))?;
                encode(&list)
            }),
            "DisconnectRemote" => decode::<api::DisconnectRemote>(call).and_then(|p| {
                let gone = self.dataplane.as_mut().is_some_and(|dp| {
                    let registry = self.poll.registry();
                    dp.disconnect(
                        registry,
                        (p.handle, p.instance),
                        &mut self.manager,
                        &mut self.audit,
                        "disconnected by an administrator",
                    )
                });
                if gone {
                    Ok(Map::new())
                } else {
                    Err(wire(AdminError::NoSuchRemote {
                        handle: p.handle,
                        instance: p.instance,
                    }))
                }
            }),
            "BanRemote" => decode::<api::BanRemote>(call).and_then(|p| {
                let addr = self.remote_address(&p.address)?;
                if p.seconds == Some(0) {
                    // As `ban_duration` in the policy: a ban is longer than 0s.
                    return Err(ServiceError::InvalidParameter {
                        parameter: "seconds".into(),
                    }
                    .to_wire());
                }
                let span = p.seconds.map(std::time::Duration::from_secs);
                let crate::state::RemoteBan { sessions, left } = self
                    .manager
                    .admin_ban_remote(&mut self.auditor, &p.app, addr, span)
                    .map_err(wire)?;
                self.audit.event(
                    &Record::new(Event::Ban, Severity::Warning)
                        .field("app", &p.app)
                        .field("address", addr)
                        .field("duration", crate::auditor::describe_span(left))
                        .field("by", "admin")
                        .res(true),
                );
                let mut ended = 0u32;
                if let Some(dp) = self.dataplane.as_mut() {
                    let registry = self.poll.registry();
                    for s in sessions {
                        let why = "banned by an administrator";
                        if dp.disconnect(registry, s, &mut self.manager, &mut self.audit, why) {
                            ended += 1;
                        }
                    }
                }
                encode(&api::BannedRemote { ended })
            }),
            "LiftBan" => decode::<api::LiftBan>(call).and_then(|p| {
                use crate::state::BanTarget;
                let target = match (p.uid, p.address.as_deref()) {
                    (Some(uid), None) => BanTarget::Uid(uid),
                    (None, Some(a)) => BanTarget::Address(self.remote_address(a)?),
                    // Exactly one of the two.
                    _ => return Err(invalid_address()),
                };
                let r = self.manager.admin_lift_ban(&p.app, target).map_err(wire)?;
                let record = Record::new(Event::Unban, Severity::Notice).field("app", &p.app);
                let record = match target {
                    BanTarget::Uid(uid) => record.field("uid", uid),
                    BanTarget::Address(a) => record.field("address", a),
                };
                self.audit
                    .event(&record.field("lifted", r.lifted).res(true));
                encode(&r)
            }),
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

    /// A remote client's `address` parameter ([`address_parameter`]), which must be one a
    /// remote client can have: a plain IPv6 address is `AddressNotServed` while the data
    /// plane serves IPv4 only, since a ban on it would be listed and match nobody. Today it
    /// always does: `Dataplane::bind` refuses an IPv6 listener (so every TCP peer is IPv4),
    /// the softnic's RoCEv2 endpoints are IPv4, and a client's RoCE record carries an IPv4
    /// address that must be the one its hello came from.
    fn remote_address(&self, text: &str) -> Result<std::net::IpAddr, WireError> {
        let addr = address_parameter(text)?;
        let ipv6_served = self
            .dataplane
            .as_ref()
            .is_some_and(|dp| dp.local_addr().is_ipv6());
        if addr.is_ipv6() && !ipv6_served {
            return Err(AdminError::AddressNotServed {
                address: addr.to_string(),
                reason: "the data plane serves remote clients over IPv4 only (the softnic's \
                         RoCEv2), so no remote client has an IPv6 address"
                    .into(),
            }
            .to_wire());
        }
        Ok(addr)
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
}

/// The bytes of entries a list reply may carry: [`api::LIST_REPLY_MAX`], and half of
/// `pending-output-bytes` (past which a reply would close the connection as a client's
/// that does not read its replies; half leaves room for the rest of the reply and what
/// else the connection has queued).
fn list_budget(limits: &crate::state::Limits) -> usize {
    api::LIST_REPLY_MAX.min(limits.max_pending_output / 2)
}

/// Keep the first of `entries` whose JSON fits in `budget` bytes (with a separator each);
/// how many were left out. A list (bans an administrator added by script, a data plane's
/// sessions, clients whose programs' paths are as long as the kernel allows) can outgrow
/// any one reply: the admin gets what fits and the count of the rest rather than a closed
/// connection.
fn fit_list<T: Serialize>(entries: &mut Vec<T>, budget: usize) -> u64 {
    let mut used = 0usize;
    let keep = entries
        .iter()
        .take_while(|e| {
            let len = serde_json::to_vec(e).map_or(0, |v| v.len());
            used = used.saturating_add(len + 1);
            used <= budget
        })
        .count();
    let omitted = entries.len() - keep;
    entries.truncate(keep);
    u64::try_from(omitted).unwrap_or(u64::MAX)
}

/// Cut `entries` (a whole list, in its order) to the page `p` asks for (from its `offset`,
/// at most its `limit`, capped at [`api::LIST_LIMIT_MAX`]), then to what fits in `budget`
/// bytes ([`fit_list`]): how many were left out after the page's entries, and the offset
/// the next page starts at (`None` at the end of the list). A call without `offset` and
/// `limit` gets what it always got: the list from its start, as much as fits.
///
/// # Errors
/// `InvalidParameter` naming `limit` if it is 0.
fn page<T: Serialize>(
    entries: &mut Vec<T>,
    p: api::ListPage,
    budget: usize,
) -> Result<(u64, Option<u64>), WireError> {
    if p.limit == Some(0) {
        return Err(ServiceError::InvalidParameter {
            parameter: "limit".into(),
        }
        .to_wire());
    }
    let start = usize::try_from(p.offset.unwrap_or(0))
        .unwrap_or(usize::MAX)
        .min(entries.len());
    entries.drain(..start);
    let limit = p.limit.map_or(usize::MAX, |l| {
        usize::try_from(l.min(api::LIST_LIMIT_MAX)).unwrap_or(usize::MAX)
    });
    let past_limit = entries.len().saturating_sub(limit);
    entries.truncate(limit);
    let omitted =
        fit_list(entries, budget).saturating_add(u64::try_from(past_limit).unwrap_or(u64::MAX));
    let next = (omitted > 0).then(|| u64::try_from(start + entries.len()).unwrap_or(u64::MAX));
    Ok((omitted, next))
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
pub(super) fn stream_reply<T: Serialize>(value: &T) -> Vec<u8> {
    let parameters = encode(value).unwrap_or_default();
    Reply {
        error: None,
        parameters,
        continues: true,
    }
    .encode()
}

pub(super) fn error_reply(w: &WireError) -> Vec<u8> {
    Reply {
        error: Some(w.name.clone()),
        parameters: w.parameters.clone(),
        continues: false,
    }
    .encode()
}

/// `org.varlink.service.InvalidParameter` naming `address`.
fn invalid_address() -> WireError {
    ServiceError::InvalidParameter {
        parameter: "address".into(),
    }
    .to_wire()
}

/// An `address` parameter: an IPv4 or IPv6 address, or `InvalidParameter`. An IPv4 address
/// written as IPv6 (`::ffff:a.b.c.d`, as dual-stack tools print it) is that IPv4 address:
/// the data plane knows its clients by IPv4 address, and a ban under the other spelling
/// would be listed but never match one.
fn address_parameter(text: &str) -> Result<std::net::IpAddr, WireError> {
    text.parse::<std::net::IpAddr>()
        .map(|a| a.to_canonical())
        .map_err(|_| invalid_address())
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
    fn a_list_is_cut_to_its_byte_budget_and_counts_the_rest() {
        let mut v: Vec<String> = (0..10).map(|i| format!("entry{i}")).collect();
        // "entry0" is 8 bytes of JSON, 9 with its separator.
        assert_eq!(fit_list(&mut v, 9 * 3 + 8), 7);
        assert_eq!(v, ["entry0", "entry1", "entry2"]);
        assert_eq!(fit_list(&mut v, 1 << 20), 0, "all fit");
        assert_eq!(v.len(), 3);
        assert_eq!(fit_list(&mut v, 0), 3, "none fits");
        assert!(v.is_empty());
        let limits = crate::state::Limits {
            max_pending_output: 8192,
            ..Default::default()
        };
        assert_eq!(list_budget(&limits), 4096);
        assert_eq!(
            list_budget(&crate::state::Limits::default()),
            api::LIST_REPLY_MAX.min(2 << 20)
        );
    }

    #[test]
    fn a_page_starts_at_its_offset_stops_at_its_limit_and_says_where_the_next_starts() {
        let list = || -> Vec<String> { (0..10).map(|i| format!("entry{i}")).collect() };
        let at = |offset: Option<u64>, limit: Option<u64>| api::ListPage { offset, limit };
        let mut v = list();
        assert_eq!(page(&mut v, at(None, None), 1 << 20).unwrap(), (0, None));
        assert_eq!(v.len(), 10, "all of it, as before paging");
        let mut v = list();
        assert_eq!(
            page(&mut v, at(Some(2), Some(3)), 1 << 20).unwrap(),
            (5, Some(5))
        );
        assert_eq!(v, ["entry2", "entry3", "entry4"]);
        // Cut by bytes too: "entry0" is 9 bytes with its separator.
        let mut v = list();
        assert_eq!(page(&mut v, at(Some(8), None), 9).unwrap(), (1, Some(9)));
        assert_eq!(v, ["entry8"]);
        let mut v = list();
        assert_eq!(page(&mut v, at(None, None), 9 * 4).unwrap(), (6, Some(4)));
        assert_eq!(
            v.len(),
            4,
            "the old call, cut as before, and where to go on"
        );
        let mut v = list();
        assert_eq!(
            page(&mut v, at(Some(7), Some(3)), 1 << 20).unwrap(),
            (0, None)
        );
        assert_eq!(v, ["entry7", "entry8", "entry9"], "the last page");
        for offset in [10, 11, u64::MAX] {
            let mut v = list();
            assert_eq!(
                page(&mut v, at(Some(offset), None), 1 << 20).unwrap(),
                (0, None)
            );
            assert!(v.is_empty(), "{offset}: past the end");
        }
        let mut v = list();
        let e = page(&mut v, at(None, Some(0)), 1 << 20).unwrap_err();
        assert!(e.to_string().contains("limit"), "{e}");
        // A limit past the cap is the cap.
        let mut v: Vec<u32> = (0..20_000).collect();
        let (omitted, next) = page(&mut v, at(Some(1), Some(u64::MAX)), 1 << 30).unwrap();
        assert_eq!(v.len() as u64, api::LIST_LIMIT_MAX);
        assert_eq!(
            (omitted, next),
            (20_000 - 1 - api::LIST_LIMIT_MAX, Some(10_001))
        );
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
