//! Who is on the other end of a connection, read at accept and checked again before each
//! request acts.
//!
//! At accept: `SO_PEERCRED` (uid, gid, pid as of `connect()`) and, on kernels ≥ 6.5,
//! `SO_PEERPIDFD` (a pidfd for that process). The pidfd must name the same pid (its fdinfo
//! `Pid:` line; `-1` once the process was reaped). Then `/proc/PID/{stat,exe,cgroup}` are
//! read, and the pidfd checked again: a pid cannot be reused before its process is reaped,
//! and reaping turns the pidfd's pid into `-1`, so what procfs said belonged to the process
//! that connected (systemd's `pidref_verify` recipe). Without a pidfd the start time from
//! `/proc/PID/stat` (field 22) stands in: a reused pid has a later start time.
//!
//! An executable that cannot be read (an unprivileged manager reading another user's
//! process, so ptrace read access is denied; as root the manager keeps `CAP_SYS_PTRACE` for
//! this) is left empty: no `exe` rule matches it.
//!
//! Before a request acts, [`Peer::still_same`] repeats the pidfd (or start-time) check, so
//! a process that exited and whose pid was handed to another never passes on its rights.

use nix::sys::socket::{getsockopt, sockopt};
use redn_policy::PeerIdentity;
use std::fs;
use std::os::fd::{AsRawFd, BorrowedFd, OwnedFd};
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

/// Why a peer could not be identified.
#[derive(Debug, thiserror::Error)]
pub enum PeerError {
    /// `getsockopt(SO_PEERCRED)` failed.
    #[error("SO_PEERCRED failed")]
    Credentials(#[source] nix::Error),
    /// A procfs file could not be read or parsed.
    #[error("cannot read {path}: {reason}")]
    Proc {
        /// The file.
        path: PathBuf,
        /// What went wrong.
        reason: String,
    },
    /// The process is gone or is not the one that connected.
    #[error("{0}")]
    Changed(String),
}

/// Where procfs is (a temp dir in tests).
#[derive(Clone, Debug)]
pub struct Procfs {
    root: PathBuf,
}

impl Default for Procfs {
    fn default() -> Procfs {
        Procfs {
            root: PathBuf::from("/proc"),
        }
    }
}

impl Procfs {
    /// Procfs mounted at `root`.
    pub fn at(root: impl Into<PathBuf>) -> Procfs {
        Procfs { root: root.into() }
    }

    fn read(&self, rel: &str) -> Result<String, PeerError> {
        let path = self.root.join(rel);
        fs::read_to_string(&path).map_err(|e| PeerError::Proc {
            path,
            reason: e.to_string(),
        })
    }

    /// Field 22 of `/proc/PID/stat`: start time in clock ticks since boot.
    pub fn start_time(&self, pid: i32) -> Result<u64, PeerError> {
        let rel = format!("{pid}/stat");
        let text = self.read(&rel)?;
        parse_start_time(&text).ok_or_else(|| PeerError::Proc {
            path: self.root.join(rel),
            reason: "no start time after the command name".into(),
        })
    }

    /// `/proc/PID/exe`.
    ///
    /// The link's text is a path in the peer's own mount namespace: a process of any user
    /// can bind-mount its own program over an app's path in a namespace of its own and run
    /// it from there. So the path is kept only if the file at it, as the manager sees it, is
    /// the very file the process runs (same device and inode, as `stat` of the link and of
    /// the path give them); otherwise the path gets a suffix no rule's absolute path has.
    pub fn exe(&self, pid: i32) -> Result<PathBuf, PeerError> {
        let link = self.root.join(format!("{pid}/exe"));
        let path = fs::read_link(&link).map_err(|e| PeerError::Proc {
            path: link.clone(),
            reason: e.to_string(),
        })?;
        let running = fs::metadata(&link).map(|m| (m.dev(), m.ino()));
        let here = fs::metadata(&path).map(|m| (m.dev(), m.ino()));
        match (running, here) {
            (Ok(a), Ok(b)) if a == b => Ok(path),
            _ => {
                let mut elsewhere = path.into_os_string();
                elsewhere.push(" (not the file at this path)");
                Ok(PathBuf::from(elsewhere))
            }
        }
    }

    /// The cgroup v2 path (the `0::` line of `/proc/PID/cgroup`); `/` if there is none.
    pub fn cgroup(&self, pid: i32) -> Result<String, PeerError> {
        Ok(parse_cgroup(&self.read(&format!("{pid}/cgroup"))?))
    }

    /// The pid a pidfd refers to (`Pid:` in `/proc/self/fdinfo/FD`): `None` once the
    /// process was reaped (the kernel reports `-1`).
    pub fn pidfd_pid(&self, pidfd: BorrowedFd<'_>) -> Result<Option<i32>, PeerError> {
        let rel = format!("self/fdinfo/{}", pidfd.as_raw_fd());
        let text = self.read(&rel)?;
        let pid = text
            .lines()
            .find_map(|l| l.strip_prefix("Pid:"))
            .and_then(|v| v.trim().parse::<i32>().ok())
            .ok_or_else(|| PeerError::Proc {
                path: self.root.join(rel),
                reason: "no Pid: line (not a pidfd?)".into(),
            })?;
        Ok((pid > 0).then_some(pid))
    }
}

/// Field 22 of a `stat` line, counted after the last `)` (the command name may hold any
/// byte, `)` and spaces included).
pub fn parse_start_time(stat: &str) -> Option<u64> {
    let after = &stat[stat.rfind(')')? + 1..];
    // Fields 3.. follow the name: field 22 is the 20th of them.
    after.split_whitespace().nth(19)?.parse().ok()
}

/// The `0::PATH` line of a cgroup file, `/` without one (a v1-only host).
pub fn parse_cgroup(text: &str) -> String {
    text.lines()
        .find_map(|l| l.strip_prefix("0::"))
        .map_or_else(|| "/".to_owned(), |p| p.trim().to_owned())
}

/// A connected peer's identity.
#[derive(Debug)]
pub struct Peer {
    /// Who it is, as the policy matches it.
    pub identity: PeerIdentity,
    /// A pidfd for the process that connected, if the kernel gives one.
    pub pidfd: Option<OwnedFd>,
    procfs: Procfs,
}

impl Peer {
    /// Identify the peer of `socket`.
    ///
    /// # Errors
    /// [`PeerError`] if its credentials or procfs cannot be read, or it is gone.
    pub fn identify(socket: BorrowedFd<'_>, procfs: &Procfs) -> Result<Peer, PeerError> {
        let cred = getsockopt(&socket, sockopt::PeerCredentials).map_err(PeerError::Credentials)?;
        let pid = cred.pid();
        // ENOPROTOOPT before Linux 6.5: fall back to the start time alone.
        let pidfd = getsockopt(&socket, sockopt::PeerPidfd).ok();
        let peer = Peer {
            identity: PeerIdentity {
                uid: cred.uid(),
                gid: cred.gid(),
                pid: u32::try_from(pid)
                    .map_err(|_| PeerError::Changed(format!("peer pid {pid} is not a process")))?,
                exe: PathBuf::new(),
                cgroup: String::new(),
                start_time: 0,
            },
            pidfd,
            procfs: procfs.clone(),
        };
        peer.check_pidfd(pid)?;
        let start_time = procfs.start_time(pid)?;
        // Reading another process's exe needs ptrace read access (the manager keeps
        // CAP_SYS_PTRACE for it when it has it). When it is denied the exe stays empty, so
        // rules that match by exe fail closed for the peer while uid/gid/cgroup rules work.
        let exe = procfs.exe(pid).unwrap_or_default();
        let cgroup = procfs.cgroup(pid)?;
        let mut peer = peer;
        peer.identity.start_time = start_time;
        peer.identity.exe = exe;
        peer.identity.cgroup = cgroup;
        peer.still_same()?;
        Ok(peer)
    }

    fn pid(&self) -> i32 {
        // It came from an i32 in `identify`.
        i32::try_from(self.identity.pid).unwrap_or(i32::MAX)
    }

    fn check_pidfd(&self, pid: i32) -> Result<(), PeerError> {
        if let Some(fd) = &self.pidfd {
            use std::os::fd::AsFd;
            match self.procfs.pidfd_pid(fd.as_fd())? {
                Some(p) if p == pid => {}
                Some(p) => {
                    return Err(PeerError::Changed(format!(
                        "the peer's pidfd names pid {p}, its credentials pid {pid}"
                    )))
                }
                None => return Err(PeerError::Changed(format!("process {pid} has exited"))),
            }
        }
        Ok(())
    }

    /// Check that the process that connected still lives under its pid: through the
    /// pidfd, or by its start time where the kernel gave none.
    ///
    /// # Errors
    /// [`PeerError::Changed`] if it is gone or its pid now belongs to another process.
    pub fn still_same(&self) -> Result<(), PeerError> {
        let pid = self.pid();
        if self.pidfd.is_some() {
            return self.check_pidfd(pid);
        }
        match self.procfs.start_time(pid) {
            Ok(t) if t == self.identity.start_time => Ok(()),
            Ok(_) => Err(PeerError::Changed(format!(
                "pid {pid} now belongs to another process"
            ))),
            Err(_) => Err(PeerError::Changed(format!("process {pid} has exited"))),
        }
    }

    /// Where its exe is (for logs).
    pub fn exe(&self) -> &Path {
        &self.identity.exe
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::fd::AsFd;
    use std::os::unix::net::UnixStream;

    #[test]
    fn start_time_is_read_after_the_last_parenthesis() {
        let stat = "4242 (a) b) c) S 1 2 3 4 5 6 7 8 9 10 11 12 13 14 15 16 17 18 99999 19 20";
        assert_eq!(parse_start_time(stat), Some(99_999));
        assert_eq!(parse_start_time("4242 (x) S 1 2"), None);
    }

    #[test]
    fn the_v2_cgroup_line_is_chosen_on_a_hybrid_host() {
        let text = "12:cpu,cpuacct:/user.slice\n0::/user.slice/session-2.scope\n";
        assert_eq!(parse_cgroup(text), "/user.slice/session-2.scope");
        assert_eq!(parse_cgroup("3:memory:/x\n"), "/");
    }

    #[test]
    fn a_socket_pair_peer_is_this_process() {
        let (a, _b) = UnixStream::pair().unwrap();
        let peer = Peer::identify(a.as_fd(), &Procfs::default()).unwrap();
        assert_eq!(peer.identity.pid, std::process::id());
        assert_eq!(peer.identity.exe, std::env::current_exe().unwrap());
        assert!(peer.identity.cgroup.starts_with('/'));
        assert!(peer.identity.start_time > 0);
        peer.still_same().unwrap();
    }

    #[test]
    fn without_a_pidfd_the_start_time_tells_a_reused_pid() {
        let (a, _b) = UnixStream::pair().unwrap();
        let mut peer = Peer::identify(a.as_fd(), &Procfs::default()).unwrap();
        // As on a kernel before 6.5: no pidfd, the start time alone.
        peer.pidfd = None;
        peer.still_same().unwrap();
        peer.identity.start_time += 1;
        let err = peer.still_same().unwrap_err().to_string();
        assert!(err.contains("now belongs to another process"), "{err}");
        peer.identity.pid = u32::try_from(i32::MAX).unwrap();
        let err = peer.still_same().unwrap_err().to_string();
        assert!(err.contains("has exited"), "{err}");
    }

    #[test]
    fn a_peer_that_exited_is_refused() {
        let dir = std::env::temp_dir().join(format!("redn-peer-{}", std::process::id()));
        let _ = fs::remove_file(&dir);
        let listener = std::os::unix::net::UnixListener::bind(&dir).unwrap();
        // A child connects, then exits and is reaped; the socket stays open in us.
        let path = dir.clone();
        let mut child = connect_and_exit(&path);
        let (server_side, _) = listener.accept().unwrap();
        let status = child.wait().unwrap();
        assert!(status.success());
        let _ = fs::remove_file(&dir);
        let err = Peer::identify(server_side.as_fd(), &Procfs::default()).unwrap_err();
        assert!(
            matches!(err, PeerError::Changed(_) | PeerError::Proc { .. }),
            "{err}"
        );
    }

    /// A child process that connects to `path` and exits.
    fn connect_and_exit(path: &Path) -> std::process::Child {
        std::process::Command::new("python3")
            .arg("-c")
            .arg(format!(
                "import socket;s=socket.socket(socket.AF_UNIX);s.connect({:?})",
                path.to_str().unwrap()
            ))
            .spawn()
            .unwrap()
    }
}
