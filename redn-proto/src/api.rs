//! The parameters and replies of every method, as the IDL files declare them.
//!
//! Requests refuse unknown fields (the spec's `InvalidParameter`); replies are read
//! leniently by clients (serde ignores unknown fields by default), so the manager may add
//! optional reply fields without breaking them.

use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// Interface names.
pub const SERVICE: &str = "org.varlink.service";
/// The apps' interface.
pub const MANAGER: &str = "io.redn.Manager";
/// The admins' interface.
pub const ADMIN: &str = "io.redn.Admin";

/// `org.varlink.service.GetInfo` reply.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[allow(missing_docs)] // the IDL documents the fields
pub struct ServiceInfo {
    pub vendor: String,
    pub product: String,
    pub version: String,
    pub url: String,
    pub interfaces: Vec<String>,
}

/// `org.varlink.service.GetInterfaceDescription` parameters.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DescribeInterface {
    /// The interface's name.
    pub interface: String,
}

/// `io.redn.Manager.GetInfo` reply.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[allow(missing_docs)] // the IDL documents the fields
pub struct ManagerInfo {
    pub version: String,
    pub backend: String,
    pub app: String,
    pub uid: u32,
    pub pid: i32,
    pub max_regions: u32,
    pub max_pinned: u64,
    pub regions: u32,
    pub pinned: u64,
    pub offloads: u32,
}

/// One trigger parameter of an offload.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[allow(missing_docs)] // the IDL documents the fields
pub struct Param {
    pub name: String,
    pub offset: u32,
    pub len: u32,
    pub doc: String,
}

/// One region an offload binds.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[allow(missing_docs)] // the IDL documents the fields
pub struct RegionSpec {
    pub name: String,
    pub role: String,
    pub access: String,
    pub min_len: u64,
    pub doc: String,
}

/// An offload the caller may install.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[allow(missing_docs)] // the IDL documents the fields
pub struct Offload {
    pub name: String,
    pub summary: String,
    pub response: String,
    pub trigger_len: u32,
    pub params: Vec<Param>,
    pub regions: Vec<RegionSpec>,
}

/// `ListOffloads` reply (both interfaces' shapes differ; this is the apps').
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct OffloadList {
    /// The offloads.
    pub offloads: Vec<Offload>,
}

/// `RegisterRegion` parameters.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RegisterRegion {
    /// Index of the fd among those passed with the call.
    pub fd: u32,
    /// A name for listings.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
}

/// `RegisterRegion` reply.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct RegionRegistered {
    /// The region's id, for bindings.
    pub region: u64,
    /// Its size in bytes.
    pub size: u64,
    /// The address offload WQEs use for its first byte.
    pub addr: u64,
}

/// A data region of an offload bound to part of a registered region.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Binding {
    /// The offload's region name.
    pub name: String,
    /// The registered region's id.
    pub region: u64,
    /// First byte bound.
    pub offset: u64,
    /// Bytes bound.
    pub len: u64,
}

/// `InstallOffload` parameters.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct InstallOffload {
    /// The offload's name.
    pub offload: String,
    /// Its data regions' bindings.
    pub regions: Vec<Binding>,
    /// Install-time settings the offload declares.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub parameters: Option<BTreeMap<String, i64>>,
}

/// `InstallOffload` reply.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Installed {
    /// The installed offload's handle.
    pub handle: u64,
    /// 64 hex digits (32 bytes): what the app's remote clients present.
    pub token: String,
    /// Where remote clients connect (`IP:PORT`, the hello of [`crate::dataplane`]); `None`
    /// when the manager has no data plane (`[dataplane] listen` unset).
    pub endpoint: Option<String>,
}

/// `Uninstall` parameters.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Uninstall {
    /// The handle `InstallOffload` returned.
    pub handle: u64,
}

/// What one installed offload has done.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[allow(missing_docs)] // the IDL documents the fields
pub struct OffloadStats {
    pub handle: u64,
    pub offload: String,
    pub triggers: u64,
    pub wqes: u64,
    pub errors: u64,
}

/// An offload the auditor terminated.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[allow(missing_docs)] // the IDL documents the fields
pub struct TerminatedOffload {
    pub handle: u64,
    pub offload: String,
    pub rule: String,
    pub banned: bool,
}

/// A remote client's instance of an offload that the auditor terminated.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[allow(missing_docs)] // the IDL documents the fields
pub struct TerminatedRemote {
    pub handle: u64,
    pub offload: String,
    pub instance: u64,
    pub peer: String,
    pub rule: String,
    pub banned: bool,
}

/// `Stats` reply.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct StatsReply {
    /// The caller's offloads.
    pub offloads: Vec<OffloadStats>,
    /// Its offloads the auditor terminated.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub terminated: Option<Vec<TerminatedOffload>>,
    /// Its offloads' remote clients whose instances the auditor terminated (the newest 64).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub remote_terminated: Option<Vec<TerminatedRemote>>,
}

/// `io.redn.Admin` client entry.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[allow(missing_docs)] // the IDL documents the fields
pub struct ClientEntry {
    pub id: u64,
    pub app: String,
    pub uid: u32,
    pub gid: u32,
    pub pid: i32,
    pub exe: String,
    pub cgroup: String,
    pub connected: bool,
    pub regions: u32,
    pub pinned: u64,
    pub offloads: u32,
}

/// `io.redn.Admin.ListClients` reply.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ClientList {
    /// The clients (the first that fit in one reply).
    pub clients: Vec<ClientEntry>,
    /// Clients left out after these: past the call's `limit`, or more than one reply may
    /// carry (see [`LIST_REPLY_MAX`]).
    #[serde(default)]
    pub omitted: u64,
    /// Where the next page starts (the `offset` to ask for it), when entries were left
    /// out; absent at the end of the list.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub next: Option<u64>,
}

/// `io.redn.Admin` installed offload entry.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[allow(missing_docs)] // the IDL documents the fields
pub struct InstalledEntry {
    pub handle: u64,
    pub client: u64,
    pub app: String,
    pub offload: String,
    pub queues: u32,
    pub keys: u32,
    pub code_bytes: u64,
    pub triggers: u64,
    pub wqes: u64,
    pub errors: u64,
    pub remote_clients: u32,
    pub remote_terminated: u64,
    pub remote_banned: u64,
}

/// `io.redn.Admin.ListOffloads` reply.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct InstalledList {
    /// The installed offloads (the first that fit in one reply).
    pub offloads: Vec<InstalledEntry>,
    /// Offloads left out after these: past the call's `limit`, or more than one reply may
    /// carry (see [`LIST_REPLY_MAX`]).
    #[serde(default)]
    pub omitted: u64,
    /// Where the next page starts (the `offset` to ask for it), when entries were left
    /// out; absent at the end of the list.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub next: Option<u64>,
}

/// `io.redn.Admin` device entry.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[allow(missing_docs)] // the IDL documents the fields
pub struct DeviceEntry {
    pub ifindex: u32,
    pub ifname: String,
    pub backend: String,
    pub node_guid: Option<String>,
    pub pci_address: Option<String>,
    pub dataplane: Option<String>,
    pub pd: u64,
    pub mr: u64,
    pub cq: u64,
    pub qp: u64,
    pub async_events: u64,
    pub async_events_lost: u64,
    #[serde(default)]
    pub packets_dropped: u64,
    #[serde(default)]
    pub packet_drops: std::collections::BTreeMap<String, u64>,
}

/// `io.redn.Admin.ListDevices` reply.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct DeviceList {
    /// The devices.
    pub devices: Vec<DeviceEntry>,
}

/// `io.redn.Admin.Dump` parameters.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Dump {
    /// The installed offload.
    pub handle: u64,
}

/// `io.redn.Admin.Dump` reply.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct DumpReply {
    /// The program listing.
    pub listing: String,
    /// The code region's first address.
    pub code_addr: u64,
    /// Each 64-byte block of the code region that holds anything, as
    /// `OFFSET: HEX`.
    pub wqes: Vec<String>,
}

/// `io.redn.Admin.KillClient` parameters.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct KillClient {
    /// The client's id.
    pub client: u64,
}

/// `io.redn.Admin.KillClient` reply.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Killed {
    /// Offloads uninstalled.
    pub uninstalled: u32,
}

/// The most bytes of entries an `io.redn.Admin` list reply carries (and at most half the
/// manager's `pending-output-bytes`, which a larger reply would break: the connection is
/// closed as a client's that does not read its replies). The rest are counted in the
/// reply's `omitted`.
pub const LIST_REPLY_MAX: usize = 4 << 20;

/// The most entries one page of an `io.redn.Admin` list carries: a larger `limit` is taken
/// as this.
pub const LIST_LIMIT_MAX: u64 = 10_000;

/// The parameters of the `io.redn.Admin` lists (`ListClients`, `ListOffloads`,
/// `ListRemoteClients`, `ListBans`): which page of the list, in its order (clients by id,
/// offloads by handle, sessions by handle and instance, bans on uids before bans on
/// addresses). Without
/// them, the list from its start, as many entries as fit in one reply.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ListPage {
    /// Entries to skip: the `next` of the reply before (default 0; past the end, none are
    /// listed).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub offset: Option<u64>,
    /// At most this many entries (at least 1; more than [`LIST_LIMIT_MAX`] is taken as it);
    /// fewer if they do not fit in one reply. Default: as many as fit.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub limit: Option<u64>,
}

/// `io.redn.Admin` remote client entry: one session, its own instance of an offload.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[allow(missing_docs)] // the IDL documents the fields
pub struct RemoteEntry {
    pub handle: u64,
    pub instance: u64,
    pub app: String,
    pub offload: String,
    pub peer: String,
    pub held_ns: u64,
    pub idle_ns: u64,
    pub triggers: u64,
}

/// `io.redn.Admin.ListRemoteClients` reply.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct RemoteList {
    /// Every remote client's session (the first that fit in one reply).
    pub remotes: Vec<RemoteEntry>,
    /// Sessions left out after these: past the call's `limit`, or more than one reply may
    /// carry (see [`LIST_REPLY_MAX`]).
    #[serde(default)]
    pub omitted: u64,
    /// Where the next page starts (the `offset` to ask for it), when entries were left
    /// out; absent at the end of the list.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub next: Option<u64>,
}

/// `io.redn.Admin.DisconnectRemote` parameters.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DisconnectRemote {
    /// The installed offload.
    pub handle: u64,
    /// The session's instance (as `ListRemoteClients` shows it).
    pub instance: u64,
}

/// `io.redn.Admin` ban entry.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[allow(missing_docs)] // the IDL documents the fields
pub struct BanEntry {
    pub app: String,
    pub uid: Option<u32>,
    pub address: Option<String>,
    pub left_ns: Option<u64>,
}

/// `io.redn.Admin.ListBans` reply.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct BanList {
    /// The bans in force (the first that fit in one reply).
    pub bans: Vec<BanEntry>,
    /// Bans left out after these: past the call's `limit`, or more than one reply may
    /// carry (see [`LIST_REPLY_MAX`]).
    #[serde(default)]
    pub omitted: u64,
    /// Where the next page starts (the `offset` to ask for it), when entries were left
    /// out; absent at the end of the list.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub next: Option<u64>,
}

/// `io.redn.Admin.BanRemote` parameters.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
#[allow(missing_docs)] // the IDL documents the fields
pub struct BanRemote {
    pub app: String,
    pub address: String,
    #[serde(default)]
    pub seconds: Option<u64>,
}

/// `io.redn.Admin.BanRemote` reply.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct BannedRemote {
    /// The sessions the ban ended.
    pub ended: u32,
}

/// `io.redn.Admin.LiftBan` parameters: the app rule's name and one of `uid` (a ban on the
/// app's own installs) or `address` (a ban on a remote client).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
#[allow(missing_docs)] // the IDL documents the fields
pub struct LiftBan {
    pub app: String,
    #[serde(default)]
    pub uid: Option<u32>,
    #[serde(default)]
    pub address: Option<String>,
}

/// `io.redn.Admin.LiftBan` reply.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Lifted {
    /// Bans lifted: one, or more when a reload gave the app rule's name to other processes
    /// and both its tenants banned the address.
    pub lifted: u32,
}

/// `io.redn.Admin.TestRun` parameters.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TestRun {
    /// The installed offload.
    pub handle: u64,
    /// The trigger, in hex.
    pub trigger: String,
    /// Copies to send.
    pub count: u32,
}

/// `io.redn.Admin.TestRun` reply.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct TestRunReply {
    /// Triggers sent.
    pub sent: u32,
}

/// `io.redn.Admin.TriggerTimes` parameters.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TriggerTimes {
    /// The installed offload.
    pub handle: u64,
}

/// `io.redn.Admin.TriggerTimes` reply.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct TriggerTimesReply {
    /// When each trigger since the last call arrived (the NIC's completion clock; on the
    /// softnic `CLOCK_MONOTONIC` nanoseconds), oldest first.
    pub received_ns: Vec<u64>,
    /// Older arrivals dropped because more than the manager keeps came between two calls.
    pub dropped: u64,
}

/// `io.redn.Admin.Monitor` counters.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[allow(missing_docs)] // the IDL documents the fields
pub struct MonitorCounters {
    pub connections: u64,
    pub offloads: u64,
    pub auditor_rounds: u64,
    pub auditor_samples: u64,
    pub throttles: u64,
    pub terminations: u64,
    pub audit_sent: u64,
    pub audit_dropped: u64,
    #[serde(default)]
    pub buffered_bytes: u64,
    #[serde(default)]
    pub packets_dropped: u64,
    #[serde(default)]
    pub heap_in_use: Option<u64>,
}

/// One `io.redn.Admin.Monitor` reply: a record, or the counters.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct MonitorReply {
    /// An audit record's body.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub record: Option<String>,
    /// The counters.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub counters: Option<MonitorCounters>,
}

/// `io.redn.Admin.ReloadPolicy` reply.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Reloaded {
    /// App rules in the new policy.
    pub apps: u32,
}

/// A reply (or parameters) with no fields.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Empty {}
