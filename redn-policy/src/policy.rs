//! `policy.toml`: which local apps may use the manager, which offloads each may install,
//! its quotas, and the limits on its remote clients.
//!
//! ```toml
//! [[app]]
//! name = "kv"                        # unique; letters, digits, _ . -
//! uid = 1000                         # matchers: at least one of uid, gid, exe, cgroup
//! exe = "/usr/bin/kvstore"
//! offloads = ["hash-get", "list-find"]
//! max_regions = 4                    # memory regions registered at once, >= 1
//! max_pinned = "1G"                  # bytes pinned at once, base-1024 suffixes, > 0
//! max_queues = 16                    # queue pairs at once, >= 1
//! max_remote_clients = 64            # clients holding a token at once, may be 0
//! remote_sources = ["10.0.0.0/8"]    # default: any address
//! keep_serving_after_exit = true     # default true
//!
//! [app.client]                       # limits on each remote client of this app
//! rate_limit_kbps = 1000000          # kbit/s, or "infinity"
//! wqes_per_second = "2M"             # decimal k/M/G, or "infinity"
//! triggers_per_second = "50k"        # decimal k/M/G, or "infinity" (the default)
//! wqes_per_invocation = 64           # >= 1
//! on_violation = "ban"               # "throttle" | "terminate" | "ban"
//! ban_duration = "1h"                # required with "ban", refused otherwise
//! token_lifetime = "1d"              # default "1h"; "infinity" allowed
//! evict_idle_after = "5m"            # default "1m"; "infinity": never
//! evict_held_after = "30m"           # default "10m"; "infinity": never
//! ```
//!
//! Every key above is required unless a default is given; unknown keys are refused. Units are
//! described in [`units`](crate::units); which rule applies to a process is described in
//! [`identity`](crate::identity). A policy without any `[[app]]` is valid and admits nobody.
//!
//! Meaning of the per-app keys:
//! - `offloads`: names of the offload definitions (`offloads.d/NAME.toml`) the app may
//!   install; an empty list lets the app connect but install nothing. Each name once.
//! - `max_regions`, `max_pinned`, `max_queues`, `max_remote_clients`: quotas over everything
//!   the app holds at one time. They are charged by the manager, which owns every verbs
//!   object (the rdma cgroup would charge the manager, not the app).
//! - `remote_sources`: the addresses the app's remote clients may connect to the data plane
//!   from, each an IPv4 or IPv6 address, alone or as `ADDRESS/PREFIX`; without the key,
//!   any address (the token is still required). An empty list admits no remote client.
//! - `keep_serving_after_exit`: whether the app's offloads keep serving its remote clients
//!   after the app exits or crashes (the resources belong to the manager). `false` tears them
//!   down when the app's connection closes.
//!
//! Meaning of the per-client keys (`[app.client]`), which apply to each remote client
//! separately (a client is its address: every session one address holds, at once or one
//! after another, shares its rate budgets, throttle and ban; the loop budget is per
//! session):
//! - `rate_limit_kbps`: bandwidth, applied as QP pacing on mlx5 and a token bucket on the
//!   softnic;
//! - `wqes_per_second`: work requests the client's invocations may execute per second,
//!   counted by the manager's auditor;
//! - `triggers_per_second`: triggers (requests) the client may send per second, counted by
//!   the auditor from the receives its client-facing queue consumed; optional, default
//!   `"infinity"`. A flood of cheap triggers stays inside a WQE budget but is caught here;
//! - `wqes_per_invocation`: work requests one invocation may execute (the verifier's bound
//!   for unrolled chains, the auditor's budget per trigger for recycled loops);
//! - `on_violation`: what a client over a limit gets: `throttle` (its queues paced at its
//!   budgets until it stops pressing against them), `terminate` (its queues go to error, its keys are revoked and its resources
//!   freed), `ban` (terminated and refused for `ban_duration`: a remote client's hellos from
//!   its address, or, for the app's own install, the app's connections and installs). A rate
//!   violation is throttled first whatever this says; see the manager's `docs/audit.md`;
//! - `token_lifetime`: how long a token handed to a client stays valid.
//! - `evict_idle_after`: when the app already has `max_remote_clients` remote clients, a
//!   new client's hello releases the one that has sent no trigger for longest, if that is
//!   at least this long, instead of being refused `TooManyClients`; `"infinity"`: never.
//!   (Whatever it says, an address holding two sessions more than the newcomer's gives up
//!   its idlest: no address keeps every slot from the others.)
//!   Without it, clients that connect and stay silent could hold every slot for as long
//!   as they keep their connections. A released client's library opens a new session on
//!   its next request.
//! - `evict_held_after`: when neither of the above makes room, the session held longest
//!   gives its slot up if it has held it at least this long and its address holds more
//!   sessions than the newcomer's; `"infinity"`: never. Without it, a party with as many
//!   addresses as `max_remote_clients` that keeps every session busy holds every slot for
//!   ever. Under contention each session so keeps its slot at least this long, and
//!   sessions take turns. An address whose session gave a slot up this way may not take
//!   one this way for as long again (so one newcomer does not set off a chain of
//!   evictions).

use crate::error::{Error, Result};
use crate::identity::{is_normal_absolute, Matchers, PeerIdentity};
use crate::names;
use crate::source::{invalid, read_capped, Document, Invalid, KeyPath};
use crate::units::{ByteSize, KbitRate, TimeSpan, WqeRate};
use serde::de::{self, Deserializer};
use serde::Deserialize;
use std::collections::HashMap;
use std::net::IpAddr;
use std::num::NonZeroU32;
use std::path::{Path, PathBuf};
use std::str::FromStr;
use std::time::Duration;

/// Where the manager reads its policy by default.
pub const DEFAULT_POLICY_PATH: &str = "/etc/redn/policy.toml";
/// `token_lifetime` when not given: one hour.
pub const DEFAULT_TOKEN_LIFETIME: TimeSpan = TimeSpan::Finite(Duration::from_secs(3600));
/// `evict_idle_after` when not given: a minute.
pub const DEFAULT_EVICT_IDLE_AFTER: TimeSpan = TimeSpan::Finite(Duration::from_secs(60));
/// `evict_held_after` when not given: ten minutes.
pub const DEFAULT_EVICT_HELD_AFTER: TimeSpan = TimeSpan::Finite(Duration::from_secs(600));
pub use crate::names::MAX_NAME_LEN;

/// The policy: every app rule, from `policy.toml`. Valid by construction: names are unique,
/// every rule has a matcher, and no two rules tie (see [`identity`](crate::identity)).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Policy {
    apps: Vec<AppRule>,
}

impl Policy {
    /// The rules, in file order.
    pub fn apps(&self) -> &[AppRule] {
        &self.apps
    }

    /// The rule named `name`.
    pub fn app(&self, name: &str) -> Option<&AppRule> {
        self.apps.iter().find(|a| a.name == name)
    }

    /// The rule for a local peer: the most specific rule whose matchers all match, or `None`
    /// if no rule matches (the manager then refuses the peer). See the [module
    /// docs](crate::identity) for the exact order. The result never depends on the order of
    /// the rules in the file: rules that could tie are refused when the policy is loaded.
    #[must_use]
    pub fn match_app(&self, peer: &PeerIdentity) -> Option<&AppRule> {
        self.apps()
            .iter()
            .filter(|app| app.matchers.matches(peer))
            .max_by_key(|app| app.matchers.specificity())
    }
}

/// One `[[app]]`: who the app is, and what it and its remote clients may do.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct AppRule {
    /// Unique name (`name`), used in audit records and by `redn`.
    pub name: String,
    /// Which local processes this rule is for (`uid`, `gid`, `exe`, `cgroup`).
    pub matchers: Matchers,
    /// Offloads the app may install (`offloads`), in file order, no duplicates.
    pub offloads: Vec<String>,
    /// What the app may hold at once.
    pub quota: Quota,
    /// Whether its offloads keep serving after the app exits (`keep_serving_after_exit`).
    pub keep_serving_after_exit: bool,
    /// Where its remote clients may connect from (`remote_sources`); `None`: anywhere.
    pub remote_sources: Option<Vec<SourceNet>>,
    /// Limits on each of its remote clients (`[app.client]`).
    pub client: ClientLimits,
}

/// One entry of `remote_sources`: an address and how many leading bits of it must match.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SourceNet {
    /// The address (host bits past the prefix are zero).
    pub addr: IpAddr,
    /// Leading bits that must match: up to 32 for IPv4, 128 for IPv6.
    pub prefix: u8,
}

impl SourceNet {
    /// Whether `ip` lies in this network. An IPv4 client seen as an IPv4-mapped IPv6
    /// address matches IPv4 entries.
    #[must_use]
    pub fn contains(&self, ip: IpAddr) -> bool {
        let ip = match ip {
            IpAddr::V6(v6) => v6.to_ipv4_mapped().map_or(ip, IpAddr::V4),
            v4 @ IpAddr::V4(_) => v4,
        };
        match (self.addr, ip) {
            (IpAddr::V4(net), IpAddr::V4(a)) => {
                masked(u128::from(u32::from(a)), 32, self.prefix) == u128::from(u32::from(net))
            }
            (IpAddr::V6(net), IpAddr::V6(a)) => {
                masked(u128::from(a), 128, self.prefix) == u128::from(net)
            }
            _ => false,
        }
    }
}

/// The `prefix` leading bits of a `width`-bit address.
fn masked(addr: u128, width: u8, prefix: u8) -> u128 {
    if prefix == 0 {
        return 0;
    }
    let keep = u32::from(width.saturating_sub(prefix));
    let mask = (u128::MAX >> (128 - u32::from(width))) >> keep << keep;
    addr & mask
}

impl FromStr for SourceNet {
    type Err = String;
    fn from_str(text: &str) -> std::result::Result<SourceNet, String> {
        let (addr, prefix) = match text.split_once('/') {
            Some((a, p)) => (a, Some(p)),
            None => (text, None),
        };
        let addr: IpAddr = addr
            .parse()
            .map_err(|_| format!("{text:?} is not an IPv4 or IPv6 address (no host names)"))?;
        let width: u8 = if addr.is_ipv4() { 32 } else { 128 };
        let prefix = match prefix {
            None => width,
            Some(p) => p
                .parse::<u8>()
                .ok()
                .filter(|&p| p <= width)
                .ok_or_else(|| format!("{text:?}: the prefix must be a number 0..={width}"))?,
        };
        let bits = match addr {
            IpAddr::V4(a) => u128::from(u32::from(a)),
            IpAddr::V6(a) => u128::from(a),
        };
        if masked(bits, width, prefix) != bits {
            return Err(format!(
                "{text:?} has host bits set past /{prefix}; write the network's first address"
            ));
        }
        Ok(SourceNet { addr, prefix })
    }
}

impl AppRule {
    /// Whether a remote client of the app may connect from `ip` (`remote_sources`).
    #[must_use]
    pub fn admits_source(&self, ip: IpAddr) -> bool {
        self.remote_sources
            .as_ref()
            .map_or(true, |nets| nets.iter().any(|n| n.contains(ip)))
    }

    /// Whether the app may install the offload named `offload`.
    #[must_use]
    pub fn allows_offload(&self, offload: &str) -> bool {
        self.offloads.iter().any(|o| o == offload)
    }
}

/// What one app may hold at once.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct Quota {
    /// Memory regions registered (`max_regions`).
    pub max_regions: NonZeroU32,
    /// Bytes pinned over all its regions (`max_pinned`).
    pub max_pinned: ByteSize,
    /// Queue pairs (`max_queues`).
    pub max_queues: NonZeroU32,
    /// Remote clients holding a valid token (`max_remote_clients`); 0 allows none.
    pub max_remote_clients: u32,
}

/// Limits on each remote client of an app (`[app.client]`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct ClientLimits {
    /// Bandwidth (`rate_limit_kbps`).
    pub rate_limit_kbps: KbitRate,
    /// Work requests per second (`wqes_per_second`).
    pub wqes_per_second: WqeRate,
    /// Triggers per second (`triggers_per_second`, default unlimited).
    pub triggers_per_second: TriggerRate,
    /// Work requests per invocation (`wqes_per_invocation`).
    pub wqes_per_invocation: NonZeroU32,
    /// What a client over a limit gets (`on_violation`, `ban_duration`).
    pub on_violation: OnViolation,
    /// How long a token stays valid (`token_lifetime`).
    pub token_lifetime: TimeSpan,
    /// How long a client must have sent no trigger before a new client at the app's
    /// `max_remote_clients` may take its place (`evict_idle_after`).
    pub evict_idle_after: TimeSpan,
    /// How long a client must have held its slot before a new client at the app's
    /// `max_remote_clients` may take it when no client is idle (`evict_held_after`).
    pub evict_held_after: TimeSpan,
}

/// Triggers per second (`triggers_per_second`): a count like [`WqeRate`], with the same
/// decimal suffixes (`"50k"`), never 0, `"infinity"` for no limit.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum TriggerRate {
    /// At most this many triggers per second.
    Limited(std::num::NonZeroU64),
    /// No trigger rate limit (`"infinity"`).
    Unlimited,
}

impl TriggerRate {
    /// Parse `text` as [`WqeRate`] does, naming triggers in the error.
    fn parse(text: &str) -> Result<TriggerRate> {
        match text.parse::<WqeRate>() {
            Ok(WqeRate::Limited(n)) => Ok(TriggerRate::Limited(n)),
            Ok(WqeRate::Unlimited) => Ok(TriggerRate::Unlimited),
            Err(Error::Value { value, reason, .. }) => Err(Error::value(
                "trigger rate",
                value,
                reason.replace("WQEs", "triggers"),
            )),
            Err(e) => Err(e),
        }
    }
}

impl std::fmt::Display for TriggerRate {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            TriggerRate::Limited(n) => write!(f, "{n}"),
            TriggerRate::Unlimited => f.write_str("infinity"),
        }
    }
}

impl<'de> Deserialize<'de> for TriggerRate {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> std::result::Result<Self, D::Error> {
        struct Visitor;
        impl de::Visitor<'_> for Visitor {
            type Value = TriggerRate;
            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("a number of triggers per second (\"50k\") or \"infinity\"")
            }
            fn visit_u64<E: de::Error>(self, v: u64) -> std::result::Result<TriggerRate, E> {
                TriggerRate::parse(&v.to_string()).map_err(E::custom)
            }
            fn visit_i64<E: de::Error>(self, v: i64) -> std::result::Result<TriggerRate, E> {
                TriggerRate::parse(&v.to_string()).map_err(E::custom)
            }
            fn visit_str<E: de::Error>(self, v: &str) -> std::result::Result<TriggerRate, E> {
                TriggerRate::parse(v).map_err(E::custom)
            }
        }
        deserializer.deserialize_any(Visitor)
    }
}

/// What happens to a remote client that goes over a limit.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum OnViolation {
    /// `"throttle"`: its queues paced at its budgets.
    Throttle,
    /// `"terminate"`: its queues are moved to error and its keys revoked; nobody else is
    /// touched.
    Terminate,
    /// `"ban"`: terminated, and the app's installs refused for this long (`ban_duration`, never
    /// zero).
    Ban(TimeSpan),
}

/// Read `policy.toml` at `path` (at most [`MAX_FILE_BYTES`](crate::MAX_FILE_BYTES)) and
/// validate it. Errors name the file, the line and column, and the key.
pub fn load_policy(path: impl AsRef<Path>) -> Result<Policy> {
    let path = path.as_ref();
    let text = read_capped(path)?;
    parse_policy(&text, &path.display().to_string())
}

/// Parse and validate the text of a `policy.toml`; `origin` names it in errors.
pub fn parse_policy(text: &str, origin: &str) -> Result<Policy> {
    let (raw, doc) = Document::parse::<RawPolicy>(text, origin)?;
    raw.validate(&doc).map_err(|e| doc.error(e))
}

// ---------------------------------------------------------------------------------------------
// The file as written; validated into the public types above.

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawPolicy {
    #[serde(default)]
    app: Vec<RawApp>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawApp {
    name: Name,
    uid: Option<u32>,
    gid: Option<u32>,
    exe: Option<AbsolutePath>,
    cgroup: Option<AbsolutePath>,
    offloads: Vec<Name>,
    max_regions: u32,
    max_pinned: ByteSize,
    max_queues: u32,
    max_remote_clients: u32,
    remote_sources: Option<Vec<String>>,
    #[serde(default = "yes")]
    keep_serving_after_exit: bool,
    client: RawClient,
}

fn yes() -> bool {
    true
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawClient {
    rate_limit_kbps: KbitRate,
    wqes_per_second: WqeRate,
    triggers_per_second: Option<TriggerRate>,
    wqes_per_invocation: u32,
    on_violation: ViolationKind,
    ban_duration: Option<TimeSpan>,
    token_lifetime: Option<TimeSpan>,
    evict_idle_after: Option<TimeSpan>,
    evict_held_after: Option<TimeSpan>,
}

#[derive(Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
enum ViolationKind {
    Throttle,
    Terminate,
    Ban,
}

/// An app or offload name.
struct Name(String);

impl FromStr for Name {
    type Err = Error;
    fn from_str(text: &str) -> Result<Self> {
        names::check_name(text)
            .map(|()| Name(text.to_owned()))
            .map_err(|rule| Error::value("name", text, rule))
    }
}

/// An absolute path in normal form (`exe`, `cgroup`).
struct AbsolutePath(String);

impl FromStr for AbsolutePath {
    type Err = Error;
    fn from_str(text: &str) -> Result<Self> {
        if is_normal_absolute(text) && !text.contains('\0') && text.len() < 4096 {
            Ok(AbsolutePath(text.to_owned()))
        } else {
            Err(Error::value(
                "path",
                text,
                "expected an absolute path without '.', '..', '//' or a trailing '/', as /proc reports it",
            ))
        }
    }
}

impl<'de> Deserialize<'de> for Name {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        String::deserialize(deserializer)?
            .parse()
            .map_err(de::Error::custom)
    }
}

impl<'de> Deserialize<'de> for AbsolutePath {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        String::deserialize(deserializer)?
            .parse()
            .map_err(de::Error::custom)
    }
}

/// `(uid_t)-1` / `(gid_t)-1`: "no id", which no process has.
const NO_ID: u32 = u32::MAX;

impl RawPolicy {
    fn validate(self, doc: &Document<'_>) -> Result<Policy, Invalid> {
        let apps_at = KeyPath::root().key("app");
        let mut apps = Vec::with_capacity(self.app.len());
        for (i, raw) in self.app.into_iter().enumerate() {
            apps.push(raw.validate(&apps_at.index(i))?);
        }
        let mut names: HashMap<&str, usize> = HashMap::new();
        // Equal matchers are the only way two rules can tie on a peer (see `identity`).
        let mut matchers: HashMap<&Matchers, usize> = HashMap::new();
        for (i, app) in apps.iter().enumerate() {
            let line = |j: usize| {
                doc.line_of(&apps_at.index(j))
                    .map_or_else(String::new, |l| format!(" (line {l})"))
            };
            if let Some(&first) = names.get(app.name.as_str()) {
                return Err(invalid(
                    apps_at.index(i).key("name"),
                    format!(
                        "the name {:?} is already used by another app{}",
                        app.name,
                        line(first)
                    ),
                ));
            }
            names.insert(&app.name, i);
            if let Some(&first) = matchers.get(&app.matchers) {
                return Err(invalid(
                    apps_at.index(i),
                    format!(
                        "same matchers as app {:?}{}, so a process matching both could not be \
                         assigned to one; make one of them more specific or merge them",
                        apps[first].name,
                        line(first)
                    ),
                ));
            }
            matchers.insert(&app.matchers, i);
        }
        Ok(Policy { apps })
    }
}

impl RawApp {
    fn validate(self, at: &KeyPath) -> Result<AppRule, Invalid> {
        let matchers = Matchers {
            uid: self.uid,
            gid: self.gid,
            exe: self.exe.map(|p| PathBuf::from(p.0)),
            cgroup: self.cgroup.map(|p| p.0),
        };
        if matchers.is_empty() {
            return Err(invalid(
                at.clone(),
                "no matcher: give at least one of uid, gid, exe or cgroup (a rule without one \
                 would admit every local process)",
            ));
        }
        for (key, id) in [("uid", matchers.uid), ("gid", matchers.gid)] {
            if id == Some(NO_ID) {
                return Err(invalid(
                    at.key(key),
                    format!("{NO_ID} means \"no id\" ((uid_t)-1) and matches no process"),
                ));
            }
        }
        let mut offloads: Vec<String> = Vec::with_capacity(self.offloads.len());
        for (k, Name(offload)) in self.offloads.into_iter().enumerate() {
            if offloads.contains(&offload) {
                return Err(invalid(
                    at.key("offloads").index(k),
                    format!("{offload:?} is listed twice"),
                ));
            }
            offloads.push(offload);
        }
        let at_least_one = |key: &str, n: u32, what: &str| {
            NonZeroU32::new(n).ok_or_else(|| {
                invalid(
                    at.key(key),
                    format!("must be at least 1: an app without {what} can install nothing (remove the app to refuse it)"),
                )
            })
        };
        let quota = Quota {
            max_regions: at_least_one("max_regions", self.max_regions, "memory regions")?,
            max_pinned: self.max_pinned,
            max_queues: at_least_one("max_queues", self.max_queues, "queues")?,
            max_remote_clients: self.max_remote_clients,
        };
        if quota.max_pinned.bytes() == 0 {
            return Err(invalid(
                at.key("max_pinned"),
                "must be more than 0 bytes: an app without pinned memory can install nothing",
            ));
        }
        let client = self.client.validate(&at.key("client"))?;
        let remote_sources = match self.remote_sources {
            None => None,
            Some(list) => Some(
                list.iter()
                    .enumerate()
                    .map(|(k, text)| {
                        text.parse::<SourceNet>()
                            .map_err(|e| invalid(at.key("remote_sources").index(k), e))
                    })
                    .collect::<Result<Vec<_>, Invalid>>()?,
            ),
        };
        Ok(AppRule {
            name: self.name.0,
            matchers,
            offloads,
            quota,
            keep_serving_after_exit: self.keep_serving_after_exit,
            remote_sources,
            client,
        })
    }
}

impl RawClient {
    fn validate(self, at: &KeyPath) -> Result<ClientLimits, Invalid> {
        let wqes_per_invocation = NonZeroU32::new(self.wqes_per_invocation).ok_or_else(|| {
            invalid(
                at.key("wqes_per_invocation"),
                "must be at least 1: every invocation executes work requests",
            )
        })?;
        let on_violation = match (self.on_violation, self.ban_duration) {
            (ViolationKind::Ban, None) => {
                return Err(invalid(
                    at.key("on_violation"),
                    "\"ban\" requires ban_duration (such as \"1h\", or \"infinity\")",
                ))
            }
            (ViolationKind::Ban, Some(d)) if d.is_zero() => {
                return Err(invalid(
                    at.key("ban_duration"),
                    "must be longer than 0s (use on_violation = \"terminate\" for no ban)",
                ))
            }
            (ViolationKind::Ban, Some(d)) => OnViolation::Ban(d),
            (_, Some(_)) => return Err(invalid(
                at.key("ban_duration"),
                "only used with on_violation = \"ban\"; remove it or set on_violation = \"ban\"",
            )),
            (ViolationKind::Throttle, None) => OnViolation::Throttle,
            (ViolationKind::Terminate, None) => OnViolation::Terminate,
        };
        let token_lifetime = self.token_lifetime.unwrap_or(DEFAULT_TOKEN_LIFETIME);
        if token_lifetime.is_zero() {
            return Err(invalid(
                at.key("token_lifetime"),
                "must be longer than 0s: a token that is never valid admits no client",
            ));
        }
        let evict_idle_after = self.evict_idle_after.unwrap_or(DEFAULT_EVICT_IDLE_AFTER);
        if evict_idle_after.is_zero() {
            return Err(invalid(
                at.key("evict_idle_after"),
                "must be longer than 0s: a client that just said hello has not been idle; \
                 use \"infinity\" to never release one for a newcomer",
            ));
        }
        let evict_held_after = self.evict_held_after.unwrap_or(DEFAULT_EVICT_HELD_AFTER);
        if evict_held_after.is_zero() {
            return Err(invalid(
                at.key("evict_held_after"),
                "must be longer than 0s: every newcomer would take a slot just given; \
                 use \"infinity\" to never release a busy client for a newcomer",
            ));
        }
        Ok(ClientLimits {
            rate_limit_kbps: self.rate_limit_kbps,
            wqes_per_second: self.wqes_per_second,
            triggers_per_second: self.triggers_per_second.unwrap_or(TriggerRate::Unlimited),
            wqes_per_invocation,
            on_violation,
            token_lifetime,
            evict_idle_after,
            evict_held_after,
        })
    }
}

#[cfg(test)]
mod tests;
