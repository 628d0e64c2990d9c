//! `manager.toml`: the manager's sockets, backend, data plane and audit settings.
//!
//! ```toml
//! [api]                                  # the socket apps connect to
//! socket = "/run/redn/manager.sock"      # default
//! mode = "0660"                          # default; a quoted octal string
//! group = "redn"                         # default: none (the manager's own group)
//!
//! [admin]                                # the socket `redn` (the CLI) uses
//! socket = "/run/redn/admin.sock"        # default
//! mode = "0600"                          # default; never open to "other"
//!
//! [backend]
//! kind = "mlx5"                          # or "softnic"; required
//! pci_address = "0000:3b:00.0"           # mlx5: exactly one of device, node_guid, pci_address
//!
//! [dataplane]
//! listen = "192.0.2.10:7471"             # IP:PORT; absent = no remote clients
//!
//! [audit]
//! socket = "/dev/log"                    # default
//! facility = "authpriv"                  # default
//! identifier = "redn-manager"            # default
//! ```
//!
//! Every table and key except `backend.kind` is optional; unknown keys are refused. The
//! shipped `etc/redn/manager.toml` documents each key. When the manager is socket-activated,
//! the `.socket` unit's `SocketMode=`/`SocketGroup=` apply instead of `mode`/`group`.
//!
//! **Device selection (mlx5).** rdma-core renames devices (`mlx5_0` may become
//! `rocep59s0f0`), so the manager never assumes a name: an mlx5 backend needs exactly one of
//! - `device = "NAME"`: the RDMA device name as `rdma dev` / `ibv_devices` show it;
//! - `device = "auto"`: the only RDMA device present; the manager refuses to start if there
//!   are none or several (and lists them);
//! - `node_guid = "0002:c903:00a1:b2c3"` (as `ibv_devinfo` prints it) or `"0x0002c90300a1b2c3"`;
//! - `pci_address = "0000:3b:00.0"` (`[DOMAIN:]BUS:DEVICE.FUNCTION`, as `lspci -D` prints it).
//!
//! The softnic backend takes `pus` (processing units, 1..=64, default 1), `prefetch`
//! (`"at-execute"`, `"depth:N"` with N ≥ 1, or `"adversarial"`; default `"depth:8"`) and
//! `pu_cpus` (a CPU for each PU to be pinned to, as many as `pus`, no CPU twice; default
//! none: not pinned); these keys are refused for mlx5 and the device keys are refused for
//! softnic.

use crate::error::{Error, Result};
use crate::source::{invalid, read_capped, Document, Invalid, KeyPath};
use serde::de::{self, Deserializer, Visitor};
use serde::Deserialize;
use std::fmt;
use std::net::SocketAddr;
use std::num::NonZeroU32;
use std::path::{Path, PathBuf};
use std::str::FromStr;

/// Where the manager reads its configuration by default.
pub const DEFAULT_MANAGER_CONFIG_PATH: &str = "/etc/redn/manager.toml";
/// Default path of the socket apps connect to (`api.socket`).
pub const DEFAULT_API_SOCKET: &str = "/run/redn/manager.sock";
/// Default mode of the app socket (`api.mode`).
pub const DEFAULT_API_MODE: FileMode = FileMode(0o660);
/// Default path of the admin socket (`admin.socket`).
pub const DEFAULT_ADMIN_SOCKET: &str = "/run/redn/admin.sock";
/// Default mode of the admin socket (`admin.mode`).
pub const DEFAULT_ADMIN_MODE: FileMode = FileMode(0o600);
/// Default syslog socket (`audit.socket`).
pub const DEFAULT_SYSLOG_SOCKET: &str = "/dev/log";
/// Default syslog identifier (`audit.identifier`).
pub const DEFAULT_IDENTIFIER: &str = "redn-manager";
/// Largest CPU number `backend.pu_cpus` takes (a `cpu_set_t` names 1,024 CPUs).
pub const MAX_CPU: usize = 1023;
/// Largest softnic processing-unit count (`backend.pus`).
pub const MAX_SOFTNIC_PUS: usize = 64;
/// Longest unix socket path in bytes (`sun_path` is 108 bytes with its terminating NUL).
pub const MAX_SOCKET_PATH: usize = 107;

/// The manager's configuration, from `manager.toml`.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct ManagerConfig {
    /// The socket apps connect to (`[api]`).
    pub api: SocketConfig,
    /// The socket the `redn` CLI connects to (`[admin]`).
    pub admin: SocketConfig,
    /// The NIC (`[backend]`).
    pub backend: Backend,
    /// The network side remote clients reach (`[dataplane]`).
    pub dataplane: Dataplane,
    /// Where audit records go (`[audit]`).
    pub audit: AuditConfig,
}

/// A unix socket the manager listens on.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct SocketConfig {
    /// Its path (`socket`): absolute, at most [`MAX_SOCKET_PATH`] bytes.
    pub path: PathBuf,
    /// Its permission bits (`mode`).
    pub mode: FileMode,
    /// The group that owns it (`group`): a group name or a numeric gid, resolved by the
    /// manager. `None` leaves the manager's own group.
    pub group: Option<String>,
}

/// Permission bits of a file, at most `0o777`; written in TOML as a quoted octal string such
/// as `"0660"` (3 or 4 digits), never as a number.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct FileMode(u32);

impl FileMode {
    /// The mode from its bits, if they fit in `0o777`.
    pub const fn new(bits: u32) -> Option<Self> {
        if bits <= 0o777 {
            Some(FileMode(bits))
        } else {
            None
        }
    }

    /// The permission bits.
    pub const fn bits(self) -> u32 {
        self.0
    }
}

impl FromStr for FileMode {
    type Err = Error;

    fn from_str(text: &str) -> Result<Self> {
        let bad = |reason: &str| Error::value("mode", text, reason);
        if !(3..=4).contains(&text.len()) || !text.bytes().all(|b| (b'0'..=b'7').contains(&b)) {
            return Err(bad("expected 3 or 4 octal digits such as \"0660\""));
        }
        let bits = u32::from_str_radix(text, 8).map_err(|_| bad("not an octal number"))?;
        FileMode::new(bits)
            .ok_or_else(|| bad("setuid, setgid and sticky bits have no meaning on a socket"))
    }
}

impl fmt::Display for FileMode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:04o}", self.0)
    }
}

impl<'de> Deserialize<'de> for FileMode {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct ModeVisitor;
        impl Visitor<'_> for ModeVisitor {
            type Value = FileMode;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("an octal mode as a quoted string, such as \"0660\"")
            }
            fn visit_i64<E: de::Error>(self, v: i64) -> Result<FileMode, E> {
                Err(E::custom(format!(
                    "write the mode as a quoted octal string such as \"0660\", not the number {v} \
                     (a TOML number is not read as octal)"
                )))
            }
            fn visit_str<E: de::Error>(self, v: &str) -> Result<FileMode, E> {
                v.parse().map_err(E::custom)
            }
        }
        deserializer.deserialize_any(ModeVisitor)
    }
}

/// The NIC the manager drives (`[backend]`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Backend {
    /// The software RNIC (`kind = "softnic"`).
    SoftNic {
        /// Processing units (`pus`), 1..=[`MAX_SOFTNIC_PUS`]; default 1.
        pus: usize,
        /// WQE prefetch model (`prefetch`); default `depth:8`.
        prefetch: Prefetch,
        /// The CPU each PU is pinned to (`pu_cpus`): empty (the default), or one for each
        /// PU, each at most [`MAX_CPU`] and none twice.
        pu_cpus: Vec<usize>,
    },
    /// A ConnectX NIC through rdma-core (`kind = "mlx5"`).
    Mlx5 {
        /// Which device (`device`, `node_guid` or `pci_address`).
        device: DeviceSelector,
    },
}

/// How far ahead of execution the softnic fetches WQEs (`backend.prefetch`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Prefetch {
    /// `"at-execute"`: each WQE is fetched just before it runs.
    AtExecute,
    /// `"depth:N"`: up to N 64-byte blocks past the running WQE are fetched early.
    Depth(NonZeroU32),
    /// `"adversarial"`: everything eligible, as early as allowed.
    Adversarial,
}

impl Default for Prefetch {
    /// `depth:8`, the softnic's default.
    fn default() -> Self {
        Prefetch::Depth(NonZeroU32::MIN.saturating_add(7))
    }
}

impl FromStr for Prefetch {
    type Err = Error;

    fn from_str(text: &str) -> Result<Self> {
        let bad = |reason: &str| Error::value("prefetch", text, reason);
        match text {
            "at-execute" => Ok(Prefetch::AtExecute),
            "adversarial" => Ok(Prefetch::Adversarial),
            _ => match text.strip_prefix("depth:") {
                Some(n) => n
                    .parse::<NonZeroU32>()
                    .map(Prefetch::Depth)
                    .map_err(|_| bad("the depth is a whole number of blocks from 1 (use \"at-execute\" for none)")),
                None => Err(bad("expected \"at-execute\", \"depth:N\" or \"adversarial\"")),
            },
        }
    }
}

impl fmt::Display for Prefetch {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Prefetch::AtExecute => f.write_str("at-execute"),
            Prefetch::Depth(n) => write!(f, "depth:{n}"),
            Prefetch::Adversarial => f.write_str("adversarial"),
        }
    }
}

/// How the mlx5 backend picks its device. See the [module docs](self).
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum DeviceSelector {
    /// `device = "auto"`: the only RDMA device present (none or several is an error at start).
    Auto,
    /// `device = "NAME"`: an RDMA device name such as `rocep59s0f0`.
    Name(String),
    /// `node_guid = "..."`.
    NodeGuid(NodeGuid),
    /// `pci_address = "..."`.
    PciAddress(PciAddress),
}

/// A node GUID: `"0002:c903:00a1:b2c3"` (four groups of four hex digits, as `ibv_devinfo`
/// and sysfs print it) or `"0x0002c90300a1b2c3"`. Never zero. Prints in the grouped form.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct NodeGuid(u64);

impl NodeGuid {
    /// The GUID as a number (host order).
    pub const fn get(self) -> u64 {
        self.0
    }
}

impl FromStr for NodeGuid {
    type Err = Error;

    fn from_str(text: &str) -> Result<Self> {
        let bad = |reason: &str| Error::value("node GUID", text, reason);
        let hex = if let Some(hex) = text.strip_prefix("0x") {
            if hex.is_empty() || hex.len() > 16 {
                return Err(bad("expected 1 to 16 hex digits after 0x"));
            }
            hex.to_owned()
        } else {
            let groups: Vec<&str> = text.split(':').collect();
            if groups.len() != 4 || groups.iter().any(|g| g.len() != 4) {
                return Err(bad(
                    "expected four groups of four hex digits, such as 0002:c903:00a1:b2c3",
                ));
            }
            groups.concat()
        };
        if !hex.bytes().all(|b| b.is_ascii_hexdigit()) {
            return Err(bad("not a hexadecimal number"));
        }
        match u64::from_str_radix(&hex, 16) {
            Ok(0) => Err(bad("a zero GUID names no device")),
            Ok(v) => Ok(NodeGuid(v)),
            Err(_) => Err(bad("not a hexadecimal number")),
        }
    }
}

impl fmt::Display for NodeGuid {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let v = self.0;
        write!(
            f,
            "{:04x}:{:04x}:{:04x}:{:04x}",
            (v >> 48) & 0xffff,
            (v >> 32) & 0xffff,
            (v >> 16) & 0xffff,
            v & 0xffff
        )
    }
}

/// A PCI function address, `[DOMAIN:]BUS:DEVICE.FUNCTION` in hex (`"0000:3b:00.0"`,
/// `"3b:00.0"`); the domain defaults to 0. Prints as `lspci -D` does.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct PciAddress {
    domain: u32,
    bus: u8,
    device: u8,
    function: u8,
}

impl PciAddress {
    /// The PCI domain (segment).
    pub const fn domain(self) -> u32 {
        self.domain
    }
    /// The bus number.
    pub const fn bus(self) -> u8 {
        self.bus
    }
    /// The device number, 0..=0x1f.
    pub const fn device(self) -> u8 {
        self.device
    }
    /// The function number, 0..=7.
    pub const fn function(self) -> u8 {
        self.function
    }
}

impl FromStr for PciAddress {
    type Err = Error;

    fn from_str(text: &str) -> Result<Self> {
        let bad = || {
            Error::value(
                "PCI address",
                text,
                "expected [DOMAIN:]BUS:DEVICE.FUNCTION in hex, such as 0000:3b:00.0 (device at most 1f, function at most 7)",
            )
        };
        let hex = |s: &str, max_digits: usize| -> Result<u32> {
            if s.is_empty() || s.len() > max_digits || !s.bytes().all(|b| b.is_ascii_hexdigit()) {
                return Err(bad());
            }
            u32::from_str_radix(s, 16).map_err(|_| bad())
        };
        let (rest, function) = text.rsplit_once('.').ok_or_else(bad)?;
        let parts: Vec<&str> = rest.split(':').collect();
        let (domain, bus, device) = match parts.as_slice() {
            [bus, device] => (0, *bus, *device),
            [domain, bus, device] => (hex(domain, 8)?, *bus, *device),
            _ => return Err(bad()),
        };
        let (bus, device, function) = (hex(bus, 2)?, hex(device, 2)?, hex(function, 1)?);
        if device > 0x1f || function > 7 {
            return Err(bad());
        }
        Ok(PciAddress {
            domain,
            bus: u8::try_from(bus).map_err(|_| bad())?,
            device: u8::try_from(device).map_err(|_| bad())?,
            function: u8::try_from(function).map_err(|_| bad())?,
        })
    }
}

impl fmt::Display for PciAddress {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{:04x}:{:02x}:{:02x}.{:x}",
            self.domain, self.bus, self.device, self.function
        )
    }
}

/// The network side (`[dataplane]`).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct Dataplane {
    /// Where remote clients connect (`listen`, `"IP:PORT"`, IPv6 as `"[::1]:7471"` but not
    /// with the softnic, whose RoCEv2 speaks IPv4; port not 0; no host names, so that
    /// starting needs no DNS). `None`: no remote clients.
    pub listen: Option<SocketAddr>,
}

/// Where audit records go (`[audit]`): RFC 3164 lines on a local syslog socket.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct AuditConfig {
    /// The syslog socket (`socket`), default `/dev/log`.
    pub socket: PathBuf,
    /// The syslog facility (`facility`), default `authpriv`.
    pub facility: Facility,
    /// The syslog identifier (`identifier`, the RFC 3164 TAG), default `redn-manager`:
    /// 1 to 32 characters among letters, digits, `.`, `_` and `-`.
    pub identifier: String,
}

/// A syslog facility, by its syslog(3) name without `LOG_`, lower case.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Facility {
    /// `daemon`: system daemons without a facility of their own.
    Daemon,
    /// `auth`: security and authorization messages.
    Auth,
    /// `authpriv`: security and authorization messages, kept private (the default; Debian
    /// routes it to `/var/log/auth.log` only).
    AuthPriv,
    /// `local0`, reserved for local use.
    Local0,
    /// `local1`, reserved for local use.
    Local1,
    /// `local2`, reserved for local use.
    Local2,
    /// `local3`, reserved for local use.
    Local3,
    /// `local4`, reserved for local use.
    Local4,
    /// `local5`, reserved for local use.
    Local5,
    /// `local6`, reserved for local use.
    Local6,
    /// `local7`, reserved for local use.
    Local7,
}

impl Facility {
    /// The facility number (syslog(3): `LOG_DAEMON` is 3, `LOG_AUTH` 4, `LOG_AUTHPRIV` 10,
    /// `LOG_LOCAL0`..`LOG_LOCAL7` 16..23); the priority is `facility * 8 + severity`.
    pub const fn code(self) -> u8 {
        match self {
            Facility::Daemon => 3,
            Facility::Auth => 4,
            Facility::AuthPriv => 10,
            Facility::Local0 => 16,
            Facility::Local1 => 17,
            Facility::Local2 => 18,
            Facility::Local3 => 19,
            Facility::Local4 => 20,
            Facility::Local5 => 21,
            Facility::Local6 => 22,
            Facility::Local7 => 23,
        }
    }

    /// The name as written in `manager.toml`.
    pub const fn name(self) -> &'static str {
        match self {
            Facility::Daemon => "daemon",
            Facility::Auth => "auth",
            Facility::AuthPriv => "authpriv",
            Facility::Local0 => "local0",
            Facility::Local1 => "local1",
            Facility::Local2 => "local2",
            Facility::Local3 => "local3",
            Facility::Local4 => "local4",
            Facility::Local5 => "local5",
            Facility::Local6 => "local6",
            Facility::Local7 => "local7",
        }
    }
}

impl fmt::Display for Facility {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// Read `manager.toml` at `path` (at most [`MAX_FILE_BYTES`](crate::MAX_FILE_BYTES)) and
/// validate it. Errors name the file, the line and column, and the key.
pub fn load_manager_config(path: impl AsRef<Path>) -> Result<ManagerConfig> {
    let path = path.as_ref();
    let text = read_capped(path)?;
    parse_manager_config(&text, &path.display().to_string())
}

/// Parse and validate the text of a `manager.toml`; `origin` names it in errors (a path, or
/// anything that tells the reader where the text came from).
pub fn parse_manager_config(text: &str, origin: &str) -> Result<ManagerConfig> {
    let (raw, doc) = Document::parse::<RawManager>(text, origin)?;
    raw.validate().map_err(|e| doc.error(e))
}

// ---------------------------------------------------------------------------------------------
// The file as written; validated into the public types above.

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawManager {
    #[serde(default)]
    api: RawSocket,
    #[serde(default)]
    admin: RawSocket,
    backend: RawBackend,
    #[serde(default)]
    dataplane: RawDataplane,
    #[serde(default)]
    audit: RawAudit,
}

#[derive(Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawSocket {
    socket: Option<SocketPath>,
    mode: Option<FileMode>,
    group: Option<GroupName>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawBackend {
    kind: BackendKind,
    device: Option<DeviceArg>,
    node_guid: Option<NodeGuid>,
    pci_address: Option<PciAddress>,
    pus: Option<u64>,
    prefetch: Option<Prefetch>,
    pu_cpus: Option<Vec<u64>>,
}

#[derive(Clone, Copy, Deserialize)]
#[serde(rename_all = "lowercase")]
enum BackendKind {
    SoftNic,
    Mlx5,
}

#[derive(Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawDataplane {
    listen: Option<ListenAddr>,
}

#[derive(Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawAudit {
    socket: Option<SocketPath>,
    facility: Option<Facility>,
    identifier: Option<Identifier>,
}

/// Implements `Deserialize` through `FromStr` for types that are written as TOML strings.
macro_rules! deserialize_from_str {
    ($($t:ty),*) => {$(
        impl<'de> Deserialize<'de> for $t {
            fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
                let text = String::deserialize(deserializer)?;
                text.parse().map_err(de::Error::custom)
            }
        }
    )*};
}

deserialize_from_str!(
    Prefetch, NodeGuid, PciAddress, SocketPath, GroupName, DeviceArg, ListenAddr, Identifier
);

/// An absolute unix socket path that fits `sun_path`.
struct SocketPath(PathBuf);

impl FromStr for SocketPath {
    type Err = Error;
    fn from_str(text: &str) -> Result<Self> {
        let bad = |reason: String| Error::value("socket path", text, reason);
        if !text.starts_with('/') {
            return Err(bad("must be absolute".into()));
        }
        if text.contains('\0') {
            return Err(bad("contains a NUL byte".into()));
        }
        if text.ends_with('/') {
            return Err(bad("names a directory".into()));
        }
        if text.len() > MAX_SOCKET_PATH {
            return Err(bad(format!(
                "{} bytes long; a unix socket path holds at most {MAX_SOCKET_PATH}",
                text.len()
            )));
        }
        Ok(SocketPath(PathBuf::from(text)))
    }
}

/// A group name or numeric gid.
struct GroupName(String);

impl FromStr for GroupName {
    type Err = Error;
    fn from_str(text: &str) -> Result<Self> {
        let bad = |reason: &str| Error::value("group", text, reason);
        if text.bytes().all(|b| b.is_ascii_digit()) && !text.is_empty() {
            return match text.parse::<u32>() {
                Ok(u32::MAX) | Err(_) => Err(bad("not a valid gid")),
                Ok(_) => Ok(GroupName(text.to_owned())),
            };
        }
        let name_ok = (1..=32).contains(&text.len())
            && !text.starts_with('-')
            && text
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'-' | b'.'));
        if name_ok {
            Ok(GroupName(text.to_owned()))
        } else {
            Err(bad("expected a group name (letters, digits, _ - ., at most 32, not starting with -) or a numeric gid"))
        }
    }
}

/// `backend.device`: a device name or `"auto"`.
enum DeviceArg {
    Auto,
    Name(String),
}

impl FromStr for DeviceArg {
    type Err = Error;
    fn from_str(text: &str) -> Result<Self> {
        if text == "auto" {
            return Ok(DeviceArg::Auto);
        }
        // IB_DEVICE_NAME_MAX is 64 with the NUL; names are sysfs directory names.
        let ok = (1..=63).contains(&text.len())
            && text != "."
            && text != ".."
            && text.bytes().all(|b| b.is_ascii_graphic() && b != b'/');
        if ok {
            Ok(DeviceArg::Name(text.to_owned()))
        } else {
            Err(Error::value(
                "device name",
                text,
                "expected an RDMA device name as `rdma dev` shows it (1 to 63 printable characters, no /), or \"auto\"",
            ))
        }
    }
}

/// `dataplane.listen`.
struct ListenAddr(SocketAddr);

impl FromStr for ListenAddr {
    type Err = Error;
    fn from_str(text: &str) -> Result<Self> {
        let addr: SocketAddr = text.parse().map_err(|_| {
            Error::value(
                "listen address",
                text,
                "expected IP:PORT such as 192.0.2.10:7471 or [2001:db8::1]:7471 (no host names)",
            )
        })?;
        if addr.port() == 0 {
            return Err(Error::value(
                "listen address",
                text,
                "port 0 would pick a random port that clients cannot know",
            ));
        }
        Ok(ListenAddr(addr))
    }
}

/// `audit.identifier`.
struct Identifier(String);

impl FromStr for Identifier {
    type Err = Error;
    fn from_str(text: &str) -> Result<Self> {
        let ok = (1..=32).contains(&text.len())
            && text
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'-' | b'.'));
        if ok {
            Ok(Identifier(text.to_owned()))
        } else {
            Err(Error::value(
                "syslog identifier",
                text,
                "expected 1 to 32 letters, digits, '.', '_' or '-'",
            ))
        }
    }
}

impl RawSocket {
    fn into_config(self, default_path: &str, default_mode: FileMode) -> SocketConfig {
        SocketConfig {
            path: self
                .socket
                .map_or_else(|| PathBuf::from(default_path), |s| s.0),
            mode: self.mode.unwrap_or(default_mode),
            group: self.group.map(|g| g.0),
        }
    }
}

impl RawManager {
    fn validate(self) -> Result<ManagerConfig, Invalid> {
        let root = KeyPath::root();
        let api = self.api.into_config(DEFAULT_API_SOCKET, DEFAULT_API_MODE);
        let admin = self
            .admin
            .into_config(DEFAULT_ADMIN_SOCKET, DEFAULT_ADMIN_MODE);
        if admin.mode.bits() & 0o007 != 0 {
            return Err(invalid(
                root.key("admin").key("mode"),
                format!(
                    "mode {} opens the admin socket to every user; use 0600, or 0660 with a group",
                    admin.mode
                ),
            ));
        }
        if admin.path == api.path {
            return Err(invalid(
                root.key("admin").key("socket"),
                format!(
                    "{} is also the app socket (api.socket)",
                    admin.path.display()
                ),
            ));
        }
        let backend = self.backend.validate(&root.key("backend"))?;
        let listen = self.dataplane.listen.map(|l| l.0);
        if let (Backend::SoftNic { .. }, Some(addr)) = (&backend, listen) {
            // Refused here rather than at start, so that `--check` catches it.
            if addr.is_ipv6() {
                return Err(invalid(
                    root.key("dataplane").key("listen"),
                    format!("{addr} is IPv6, and the softnic's RoCEv2 speaks IPv4 only"),
                ));
            }
        }
        let audit = AuditConfig {
            socket: self
                .audit
                .socket
                .map_or_else(|| PathBuf::from(DEFAULT_SYSLOG_SOCKET), |s| s.0),
            facility: self.audit.facility.unwrap_or(Facility::AuthPriv),
            identifier: self
                .audit
                .identifier
                .map_or_else(|| DEFAULT_IDENTIFIER.to_owned(), |i| i.0),
        };
        Ok(ManagerConfig {
            api,
            admin,
            backend,
            dataplane: Dataplane { listen },
            audit,
        })
    }
}

impl RawBackend {
    fn validate(self, at: &KeyPath) -> Result<Backend, Invalid> {
        let mut selectors = Vec::new();
        if let Some(d) = self.device {
            selectors.push((
                "device",
                match d {
                    DeviceArg::Auto => DeviceSelector::Auto,
                    DeviceArg::Name(n) => DeviceSelector::Name(n),
                },
            ));
        }
        if let Some(g) = self.node_guid {
            selectors.push(("node_guid", DeviceSelector::NodeGuid(g)));
        }
        if let Some(p) = self.pci_address {
            selectors.push(("pci_address", DeviceSelector::PciAddress(p)));
        }
        match self.kind {
            BackendKind::SoftNic => {
                if let Some((key, _)) = selectors.first() {
                    return Err(invalid(
                        at.key(key),
                        "the softnic backend has no device to select; remove this key or set kind = \"mlx5\"",
                    ));
                }
                let pus = self.pus.unwrap_or(1);
                let pus = usize::try_from(pus)
                    .ok()
                    .filter(|p| (1..=MAX_SOFTNIC_PUS).contains(p))
                    .ok_or_else(|| {
                        invalid(
                            at.key("pus"),
                            format!("{pus} processing units is outside 1..={MAX_SOFTNIC_PUS}"),
                        )
                    })?;
                let pu_cpus = pu_cpus(self.pu_cpus.unwrap_or_default(), pus)
                    .map_err(|why| invalid(at.key("pu_cpus"), why))?;
                Ok(Backend::SoftNic {
                    pus,
                    prefetch: self.prefetch.unwrap_or_default(),
                    pu_cpus,
                })
            }
            BackendKind::Mlx5 => {
                for (key, set) in [
                    ("pus", self.pus.is_some()),
                    ("prefetch", self.prefetch.is_some()),
                    ("pu_cpus", self.pu_cpus.is_some()),
                ] {
                    if set {
                        return Err(invalid(
                            at.key(key),
                            "only the softnic backend takes this key; remove it for mlx5",
                        ));
                    }
                }
                let mut selectors = selectors.into_iter();
                match (selectors.next(), selectors.next()) {
                    (None, _) => Err(invalid(
                        at.key("kind"),
                        "mlx5 needs a device: set device = \"NAME\" (or \"auto\" for the only RDMA device present), node_guid or pci_address; the manager never assumes mlx5_0",
                    )),
                    (Some((first, _)), Some((second, _))) => Err(invalid(
                        at.key(second),
                        format!("select the device one way only: {first} is also set (keep one of device, node_guid, pci_address)"),
                    )),
                    (Some((_, device)), None) => Ok(Backend::Mlx5 { device }),
                }
            }
        }
    }
}

/// `backend.pu_cpus` for `pus` processing units: empty, or a CPU for each PU, none twice.
fn pu_cpus(cpus: Vec<u64>, pus: usize) -> std::result::Result<Vec<usize>, String> {
    if cpus.is_empty() {
        return Ok(Vec::new());
    }
    if cpus.len() != pus {
        return Err(format!(
            "{} CPUs for {pus} processing units: list one CPU for each PU, or none",
            cpus.len()
        ));
    }
    let mut out: Vec<usize> = Vec::with_capacity(cpus.len());
    for cpu in cpus {
        let n = usize::try_from(cpu)
            .ok()
            .filter(|&n| n <= MAX_CPU)
            .ok_or_else(|| format!("CPU {cpu} is outside 0..={MAX_CPU}"))?;
        if out.contains(&n) {
            return Err(format!(
                "CPU {n} is listed twice: each PU is pinned to a CPU of its own"
            ));
        }
        out.push(n);
    }
    Ok(out)
}

#[cfg(test)]
mod tests;
