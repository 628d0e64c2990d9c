//! What the manager asks of the system at start: its sockets (bound under a lock, or taken
//! from systemd socket activation), capabilities, the memlock limit, and readiness
//! notification.

use caps::{CapSet, Capability};
use nix::fcntl::{Flock, FlockArg};
use nix::sys::resource::{getrlimit, setrlimit, Resource, RLIM_INFINITY};
use redn_policy::SocketConfig;
use std::fs::{self, File, OpenOptions};
use std::os::fd::{FromRawFd, OwnedFd, RawFd};
use std::os::unix::fs::{FileTypeExt, OpenOptionsExt, PermissionsExt};
use std::os::unix::net::{UnixDatagram, UnixListener};
use std::path::{Path, PathBuf};

/// Why the manager cannot start.
#[derive(Debug, thiserror::Error)]
pub enum StartError {
    /// Another manager holds the lock on these socket paths.
    #[error("another redn-manager holds {lock} (it serves {socket}); stop it first")]
    AlreadyRunning {
        /// The lock file.
        lock: PathBuf,
        /// Its socket.
        socket: PathBuf,
    },
    /// A system call on a path failed.
    #[error("{what} {path}")]
    Path {
        /// What was being done.
        what: &'static str,
        /// The path.
        path: PathBuf,
        /// The cause.
        #[source]
        source: std::io::Error,
    },
    /// Something at the socket path is not a socket.
    #[error("{0} exists and is not a socket; refusing to replace it")]
    NotASocket(PathBuf),
    /// The configured group does not exist.
    #[error("group {0:?} (from the config's group key) does not exist")]
    NoSuchGroup(String),
    /// The activation environment is inconsistent.
    #[error("socket activation: {0}")]
    Activation(String),
}

fn path_err<'p>(
    what: &'static str,
    path: &'p Path,
) -> impl FnOnce(std::io::Error) -> StartError + 'p {
    move |source| StartError::Path {
        what,
        path: path.to_owned(),
        source,
    }
}

/// A socket the manager listens on, with the lock that makes it ours.
#[derive(Debug)]
pub struct BoundSocket {
    /// The listener.
    pub listener: UnixListener,
    /// Its path, removed on drop if we bound it.
    pub path: PathBuf,
    /// Held while the manager runs: a second manager on the same path cannot take it.
    _lock: Option<Flock<File>>,
    bound_here: bool,
}

impl Drop for BoundSocket {
    fn drop(&mut self) {
        if self.bound_here {
            let _ = fs::remove_file(&self.path);
        }
    }
}

/// `PATH.lock` beside the socket.
pub fn lock_path(socket: &Path) -> PathBuf {
    let mut p = socket.as_os_str().to_owned();
    p.push(".lock");
    PathBuf::from(p)
}

/// Take the lock for `socket`, then (and only then: while we hold it, any socket at the
/// path is stale) replace whatever socket is there, bind, and set mode and group.
///
/// # Errors
/// [`StartError::AlreadyRunning`] if another manager holds the lock; others for the paths.
pub fn bind_locked(cfg: &SocketConfig) -> Result<BoundSocket, StartError> {
    let path = &cfg.path;
    if let Some(dir) = path.parent() {
        fs::create_dir_all(dir).map_err(path_err("cannot create the directory of", path))?;
    }
    let lock = lock_path(path);
    // Readable by the manager's user alone: `flock` needs no more than a read-only fd, so a
    // lock file others may open lets any user hold it and keep the manager from starting.
    let file = OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .mode(0o600)
        .open(&lock)
        .map_err(path_err("cannot open the lock file", &lock))?;
    // One left by an older version with a wider mode is narrowed too.
    file.set_permissions(fs::Permissions::from_mode(0o600))
        .map_err(path_err("cannot set the mode of", &lock))?;
    let held = Flock::lock(file, FlockArg::LockExclusiveNonblock).map_err(|(_, errno)| {
        if errno == nix::errno::Errno::EWOULDBLOCK {
            StartError::AlreadyRunning {
                lock: lock.clone(),
                socket: path.clone(),
            }
        } else {
            StartError::Path {
                what: "cannot lock",
                path: lock.clone(),
                source: errno.into(),
            }
        }
    })?;
    match fs::symlink_metadata(path) {
        Ok(m) if m.file_type().is_socket() => {
            fs::remove_file(path).map_err(path_err("cannot remove the stale socket", path))?;
        }
        Ok(_) => return Err(StartError::NotASocket(path.clone())),
        Err(_) => {}
    }
    // The socket listens as soon as it is bound, before its mode can be set: bound under a
    // umask that leaves it to the manager's user alone, it is widened (group first, then
    // mode) only once it is what the config says. (Under the shipped units systemd binds it,
    // with the unit's mode.)
    let old_umask = nix::sys::stat::umask(nix::sys::stat::Mode::from_bits_truncate(0o177));
    let bound = UnixListener::bind(path);
    nix::sys::stat::umask(old_umask);
    let listener = bound.map_err(path_err("cannot bind", path))?;
    let socket = BoundSocket {
        listener,
        path: path.clone(),
        _lock: Some(held),
        bound_here: true,
    };
    if let Some(group) = &cfg.group {
        let gid = match group.parse::<u32>() {
            Ok(n) => nix::unistd::Gid::from_raw(n),
            Err(_) => {
                nix::unistd::Group::from_name(group)
                    .ok()
                    .flatten()
                    .ok_or_else(|| StartError::NoSuchGroup(group.clone()))?
                    .gid
            }
        };
        nix::unistd::chown(path.as_path(), None, Some(gid)).map_err(|e| StartError::Path {
            what: "cannot set the group of",
            path: path.clone(),
            source: e.into(),
        })?;
    }
    fs::set_permissions(path, fs::Permissions::from_mode(cfg.mode.bits()))
        .map_err(path_err("cannot set the mode of", path))?;
    Ok(socket)
}

/// Sockets systemd passed (`LISTEN_FDS` from fd 3, for this pid, named by
/// `LISTEN_FDNAMES`): by role, `"api"` for a fd named `manager`, `varlink` or unnamed (a
/// lone socket), `"admin"` for one named `admin`. The variables are removed so children do
/// not see them, and so a second call adopts nothing.
///
/// Call it before any other thread starts (`run` does, before the softnic's PUs):
/// `remove_var` races with any other thread's `getenv` (glibc does not lock the environment
/// for readers; edition 2024 makes it an `unsafe fn` for that reason).
///
/// # Errors
/// [`StartError::Activation`] for names it does not know or counts that do not fit.
pub fn activated_sockets() -> Result<Vec<(&'static str, UnixListener)>, StartError> {
    let pid_ok = std::env::var("LISTEN_PID")
        .ok()
        .and_then(|p| p.parse::<u32>().ok())
        == Some(std::process::id());
    let count = std::env::var("LISTEN_FDS")
        .ok()
        .and_then(|n| n.parse::<usize>().ok());
    let names = std::env::var("LISTEN_FDNAMES").unwrap_or_default();
    for v in [
        "LISTEN_PID",
        "LISTEN_FDS",
        "LISTEN_FDNAMES",
        "LISTEN_PIDFDID",
    ] {
        std::env::remove_var(v);
    }
    let (true, Some(count)) = (pid_ok, count) else {
        return Ok(Vec::new());
    };
    if count > 2 {
        return Err(StartError::Activation(format!(
            "{count} sockets passed; the manager takes at most 2 (manager and admin)"
        )));
    }
    let names: Vec<&str> = if names.is_empty() {
        Vec::new()
    } else {
        names.split(':').collect()
    };
    let mut out = Vec::new();
    for i in 0..count {
        let role = match names.get(i).copied() {
            None | Some("" | "manager" | "varlink" | "unknown" | "connection") if count == 1 => {
                "api"
            }
            Some("manager" | "varlink") => "api",
            Some("admin") => "admin",
            other => {
                return Err(StartError::Activation(format!(
                    "socket {i} is named {other:?}; name them manager (or varlink) and admin \
                     with FileDescriptorName="
                )))
            }
        };
        let fd = RawFd::try_from(3 + i).unwrap_or(RawFd::MAX);
        // The variables are only text: a fd they name that is closed, or that this process
        // opened itself (the signalfd made just before, if fd 3 was free), must not become a
        // second owner's. What systemd passes is a socket; look before wrapping (through
        // /proc, which needs no fd of ours), as sd_is_socket(3) would.
        let is_socket =
            fs::metadata(format!("/proc/self/fd/{fd}")).is_ok_and(|m| m.file_type().is_socket());
        if !is_socket {
            return Err(StartError::Activation(format!(
                "LISTEN_FDS names fd {fd}, which is not an open socket"
            )));
        }
        // SAFETY: sd_listen_fds(3): with LISTEN_PID our pid (checked above), fds
        // 3..3+LISTEN_FDS are sockets systemd handed to this process, open (and a socket:
        // checked just above) and owned by nobody else in it, since the manager opens no
        // socket before this; each is wrapped once: here, and a second call finds the
        // variables removed above and wraps nothing.
        #[allow(unsafe_code)]
        let owned = unsafe { OwnedFd::from_raw_fd(fd) };
        let _ = nix::fcntl::fcntl(
            &owned,
            nix::fcntl::FcntlArg::F_SETFD(nix::fcntl::FdFlag::FD_CLOEXEC),
        );
        out.push((role, UnixListener::from(owned)));
    }
    Ok(out)
}

/// A socket systemd passed: used as it is (its unit sets mode and group).
pub fn adopt(listener: UnixListener) -> BoundSocket {
    let path = listener
        .local_addr()
        .ok()
        .and_then(|a| a.as_pathname().map(Path::to_path_buf))
        .unwrap_or_default();
    BoundSocket {
        listener,
        path,
        _lock: None,
        bound_here: false,
    }
}

/// Send `state` to `$NOTIFY_SOCKET` (sd_notify(3)) if it is set; a leading `@` names an
/// abstract socket.
pub fn notify(state: &str) {
    let Some(path) = std::env::var_os("NOTIFY_SOCKET") else {
        return;
    };
    let Ok(sock) = UnixDatagram::unbound() else {
        return;
    };
    let bytes = std::os::unix::ffi::OsStrExt::as_bytes(path.as_os_str());
    let sent = match bytes {
        [b'@', name @ ..] => {
            use std::os::linux::net::SocketAddrExt;
            std::os::unix::net::SocketAddr::from_abstract_name(name)
                .and_then(|a| sock.send_to_addr(state.as_bytes(), &a))
        }
        _ => sock.send_to(state.as_bytes(), &path),
    };
    if let Err(e) = sent {
        crate::audit::to_stderr(&format!(
            "redn-manager: sd_notify to {} failed: {e}",
            path.to_string_lossy()
        ));
    }
}

/// The capabilities the manager keeps: `CAP_IPC_LOCK` to pin app memory beyond
/// `RLIMIT_MEMLOCK`, and `CAP_SYS_PTRACE` to read `/proc/PID/exe` of apps of other users
/// (proc(5): the link needs ptrace read access), without which policy rules that match by
/// executable could never match them. The systemd unit's bounding set says the same.
pub const KEPT_CAPABILITIES: [Capability; 2] =
    [Capability::CAP_IPC_LOCK, Capability::CAP_SYS_PTRACE];

/// Keep only [`KEPT_CAPABILITIES`] in every set, bounding set first, as capabilities(7)
/// requires; returns what was kept, for the log. Unprivileged (nothing permitted), there is
/// nothing to drop.
///
/// # Errors
/// A message if a set cannot be changed.
pub fn drop_capabilities() -> Result<Vec<String>, String> {
    let permitted = caps::read(None, CapSet::Permitted).map_err(|e| e.to_string())?;
    if permitted.is_empty() {
        return Ok(Vec::new());
    }
    if caps::has_cap(None, CapSet::Effective, Capability::CAP_SETPCAP).unwrap_or(false) {
        for c in caps::all() {
            if !KEPT_CAPABILITIES.contains(&c) {
                caps::drop(None, CapSet::Bounding, c).map_err(|e| format!("bounding {c}: {e}"))?;
            }
        }
    }
    caps::clear(None, CapSet::Ambient).map_err(|e| format!("ambient: {e}"))?;
    caps::clear(None, CapSet::Inheritable).map_err(|e| format!("inheritable: {e}"))?;
    let kept: caps::CapsHashSet = KEPT_CAPABILITIES
        .into_iter()
        .filter(|c| permitted.contains(c))
        .collect();
    // Effective before permitted: capset needs effective ⊆ permitted at every step.
    caps::set(None, CapSet::Effective, &kept).map_err(|e| format!("effective: {e}"))?;
    caps::set(None, CapSet::Permitted, &kept).map_err(|e| format!("permitted: {e}"))?;
    Ok(kept.iter().map(ToString::to_string).collect())
}

/// Raise the soft `RLIMIT_NOFILE` to the hard one (the manager uses no `select`, so a
/// high limit costs nothing) and return the soft limit now in force (unchanged if raising failed, 1024 if it
/// cannot be read).
pub fn raise_nofile() -> u64 {
    match getrlimit(Resource::RLIMIT_NOFILE) {
        Ok((soft, hard)) if soft < hard => {
            if setrlimit(Resource::RLIMIT_NOFILE, hard, hard).is_ok() {
                hard
            } else {
                soft
            }
        }
        Ok((soft, _)) => soft,
        Err(_) => 1024,
    }
}

/// If pinning app memory may fail, say why and how to fix it: `None` if the memlock limit
/// is unlimited or the manager holds `CAP_IPC_LOCK`.
pub fn memlock_problem() -> Option<String> {
    let has_ipc_lock =
        caps::has_cap(None, CapSet::Effective, Capability::CAP_IPC_LOCK).unwrap_or(false);
    match getrlimit(Resource::RLIMIT_MEMLOCK) {
        Ok((soft, _)) if soft == RLIM_INFINITY || has_ipc_lock => None,
        Ok((soft, _)) => Some(format!(
            "RLIMIT_MEMLOCK is {soft} bytes and CAP_IPC_LOCK is not held: registering more \
             would fail on an RDMA NIC; set LimitMEMLOCK=infinity in the unit (or ulimit -l \
             unlimited) or grant CAP_IPC_LOCK (AmbientCapabilities=CAP_IPC_LOCK)"
        )),
        Err(e) => Some(format!("cannot read RLIMIT_MEMLOCK: {e}")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use redn_policy::FileMode;

    fn cfg(dir: &Path) -> SocketConfig {
        let text = format!(
            "[api]\nsocket = \"{}/m.sock\"\nmode = \"0640\"\n[backend]\nkind = \"softnic\"\n",
            dir.display()
        );
        redn_policy::parse_manager_config(&text, "t.toml")
            .unwrap()
            .api
    }

    #[test]
    fn a_stale_socket_is_replaced_and_a_live_lock_refuses() {
        let dir = std::env::temp_dir().join(format!("redn-sys-{}", std::process::id()));
        let _ = fs::remove_dir_all(&dir);
        fs::create_dir_all(&dir).unwrap();
        let c = cfg(&dir);
        // A stale socket left by a crashed manager: bound, never removed.
        drop(UnixListener::bind(&c.path).unwrap());
        assert!(c.path.exists());
        let first = bind_locked(&c).unwrap();
        let mode = fs::metadata(&c.path).unwrap().permissions().mode() & 0o777;
        assert_eq!(FileMode::new(mode), Some(c.mode));
        let err = bind_locked(&c).unwrap_err();
        assert!(matches!(err, StartError::AlreadyRunning { .. }), "{err}");
        assert!(
            c.path.exists(),
            "the refused second bind left the first socket alone"
        );
        drop(first);
        assert!(!c.path.exists(), "the socket goes with its manager");
        let _ = fs::remove_dir_all(&dir);
    }
}
