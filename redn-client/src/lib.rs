//! The app side of the RedN offload manager: connect to `manager.sock`, share memory as a
//! sealed memfd, install offloads over it, uninstall them, read their counters.
//!
//! It speaks the manager's varlink API through [`redn_proto`] (the wire types the manager
//! uses too) and depends on nothing else of the manager's: no policy, no verifier, no NIC.
//!
//! ```no_run
//! use redn_client::{Client, SealedRegion};
//!
//! let mut manager = Client::connect_default()?;
//! let region = SealedRegion::create("kv", 1 << 20)?;
//! let registered = manager.register_region(&region, "kv")?;
//! let installed = manager.install(
//!     "hash-get",
//!     &[
//!         ("table", registered.region, 0, 64 << 10),
//!         ("values", registered.region, 64 << 10, 512 << 10),
//!     ],
//! )?;
//! println!("handle {} token {}", installed.handle, installed.token);
//! # Ok::<(), redn_client::Error>(())
//! ```
//!
//! Remote clients of an app's offloads use [`remote::RemoteClient`]: connect to the
//! manager's data plane with the handle and token, then `get`, `find` or raw triggers,
//! answered by the NIC over RoCEv2 with no app CPU.
#![deny(unsafe_code)]
#![warn(missing_docs)]

pub mod baseline;
pub mod kv;
pub mod remote;

pub use redn_proto::api::{Installed, ManagerInfo, Offload, OffloadStats, RegionRegistered};
pub use redn_proto::errors::ManagerError;

use nix::fcntl::{fcntl, FcntlArg, SealFlag};
use nix::sys::memfd::{memfd_create, MFdFlags};
use redn_proto::api;
use redn_proto::client::Connection;
use std::fs::File;
use std::os::fd::{AsFd, BorrowedFd};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::time::Duration;

/// Where the manager listens unless `REDN_MANAGER_SOCKET` says otherwise.
pub const DEFAULT_SOCKET: &str = "/run/redn/manager.sock";

/// How long a call waits for its reply.
pub const CALL_TIMEOUT: Duration = Duration::from_secs(30);

/// What went wrong.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// The manager refused the call with one of its named errors.
    #[error("the manager refused: {0:?}")]
    Refused(ManagerError),
    /// The connection or the protocol failed, or the manager sent another error.
    #[error("talking to the manager failed")]
    Protocol(#[source] redn_proto::Error),
    /// A memfd call failed.
    #[error("{call} failed on the shared region")]
    Memfd {
        /// The call (`memfd_create`, `ftruncate`, `F_ADD_SEALS`, `pwrite`, `pread`).
        call: &'static str,
        /// The cause.
        #[source]
        source: std::io::Error,
    },
    /// A token is 64 hex digits, as `InstallOffload` returns it.
    #[error("the token is not 64 hex digits")]
    BadToken,
    /// Keys have 48 bits and 0 marks empty buckets.
    #[error("key {0:#x} is outside 1..=2^48-1")]
    BadKey(u64),
    /// The data plane's TCP connection failed.
    #[error("{what} failed")]
    Dataplane {
        /// What was being done.
        what: &'static str,
        /// The cause.
        #[source]
        source: std::io::Error,
    },
    /// The data plane is reached over IPv4 only (the softnic's RoCEv2 speaks IPv4).
    #[error("{0} is not an IPv4 address")]
    Ipv6(std::net::SocketAddr),
    /// The client's own softnic or RoCE endpoint failed.
    #[error("{what} failed on the client's softnic")]
    Softnic {
        /// What was being done.
        what: &'static str,
        /// The cause.
        #[source]
        source: redn_sys::Error,
    },
    /// The manager refused the hello.
    #[error("the manager refused the remote client ({refusal}): {reason}")]
    RemoteRefused {
        /// Which refusal.
        refusal: redn_proto::dataplane::Refusal,
        /// The manager's reason (control characters and bidi marks escaped:
        /// [`redn_proto::printable`]).
        reason: String,
    },
    /// The manager's answer did not parse.
    #[error("malformed data-plane frame")]
    Malformed(#[source] redn_proto::dataplane::FrameError),
    /// An exchange record did not encode or parse.
    #[error("bad exchange record")]
    Exchange(#[source] redn_sys::softnic::roce::ExchangeError),
    /// Nothing came in time; the session is closed (the next call opens a new one).
    #[error("no {what} within {waited:?}")]
    Timeout {
        /// How long it waited.
        waited: std::time::Duration,
        /// What it waited for.
        what: &'static str,
    },
    /// A response completed with an error; the session is closed.
    #[error("a response failed: {detail}")]
    ResponseFailed {
        /// The completion's syndrome and opcode.
        detail: String,
    },
    /// A raw trigger of the wrong length.
    #[error("a trigger of {got} bytes where the offload takes {want}")]
    TriggerLength {
        /// Bytes given.
        got: usize,
        /// Bytes the offload takes.
        want: u32,
    },
    /// A server's answer, record or setting did not check: a baseline server's or
    /// client's ([`baseline`]), or the data plane's ([`remote`]).
    #[error("bad {from}: {detail}")]
    BadAnswer {
        /// Whose answer (or which input).
        from: &'static str,
        /// What was wrong with it.
        detail: String,
    },
    /// The operation does not fit the offload the handle names.
    #[error("offload {offload:?} does not serve {what}")]
    Unsupported {
        /// The offload.
        offload: String,
        /// What was asked, or what its answer lacks.
        what: String,
    },
    /// No session could be opened.
    #[error("no data-plane session")]
    SessionLost,
}

impl From<redn_proto::Error> for Error {
    fn from(e: redn_proto::Error) -> Error {
        match e {
            redn_proto::Error::Remote(w) => {
                match <ManagerError as redn_proto::errors::Named>::from_wire(&w) {
                    Some(m) => Error::Refused(m),
                    None => Error::Protocol(redn_proto::Error::Remote(w)),
                }
            }
            other => Error::Protocol(other),
        }
    }
}

/// The crate's result type.
pub type Result<T> = std::result::Result<T, Error>;

/// `e` and its sources as one line, `outer: inner: innermost` (what the examples print).
pub fn error_chain(e: &dyn std::error::Error) -> String {
    let mut line = e.to_string();
    let mut source = e.source();
    while let Some(s) = source {
        line.push_str(": ");
        line.push_str(&s.to_string());
        source = s.source();
    }
    line
}

fn memfd_err(call: &'static str) -> impl Fn(nix::Error) -> Error {
    move |e| Error::Memfd {
        call,
        source: e.into(),
    }
}

/// Memory shared with the manager: a memfd sealed against shrinking and growing (so the
/// manager can map it safely), read and written here through the file (no mapping in the
/// app, so no unsafe code).
#[derive(Debug)]
pub struct SealedRegion {
    file: File,
    len: u64,
}

impl SealedRegion {
    /// A zeroed memfd of `len` bytes (rounded up to whole 4 KiB pages), sealed.
    ///
    /// # Errors
    /// [`Error::Memfd`].
    pub fn create(name: &str, len: u64) -> Result<SealedRegion> {
        let len = len.max(1).div_ceil(4096) * 4096;
        let fd = memfd_create(name, MFdFlags::MFD_ALLOW_SEALING | MFdFlags::MFD_CLOEXEC)
            .map_err(memfd_err("memfd_create"))?;
        let size = i64::try_from(len).map_err(|_| Error::Memfd {
            call: "ftruncate",
            source: std::io::Error::from(std::io::ErrorKind::InvalidInput),
        })?;
        nix::unistd::ftruncate(&fd, size).map_err(memfd_err("ftruncate"))?;
        fcntl(
            fd.as_fd(),
            FcntlArg::F_ADD_SEALS(
                SealFlag::F_SEAL_SHRINK | SealFlag::F_SEAL_GROW | SealFlag::F_SEAL_SEAL,
            ),
        )
        .map_err(memfd_err("F_ADD_SEALS"))?;
        Ok(SealedRegion {
            file: File::from(fd),
            len,
        })
    }

    /// Its length in bytes.
    pub fn len(&self) -> u64 {
        self.len
    }

    /// Always false: a region holds at least a page.
    pub fn is_empty(&self) -> bool {
        false
    }

    /// Write `bytes` at `offset`.
    ///
    /// # Errors
    /// [`Error::Memfd`] (`pwrite`), also for a range past the end.
    pub fn write_at(&self, offset: u64, bytes: &[u8]) -> Result<()> {
        self.check(offset, bytes.len(), "pwrite")?;
        self.file
            .write_all_at(bytes, offset)
            .map_err(|source| Error::Memfd {
                call: "pwrite",
                source,
            })
    }

    /// Read `buf.len()` bytes at `offset`.
    ///
    /// # Errors
    /// [`Error::Memfd`] (`pread`), also for a range past the end.
    pub fn read_at(&self, offset: u64, buf: &mut [u8]) -> Result<()> {
        self.check(offset, buf.len(), "pread")?;
        self.file
            .read_exact_at(buf, offset)
            .map_err(|source| Error::Memfd {
                call: "pread",
                source,
            })
    }

    fn check(&self, offset: u64, len: usize, call: &'static str) -> Result<()> {
        match offset.checked_add(len as u64) {
            Some(end) if end <= self.len => Ok(()),
            _ => Err(Error::Memfd {
                call,
                source: std::io::Error::new(
                    std::io::ErrorKind::InvalidInput,
                    format!("{len} bytes at {offset} pass the end ({} bytes)", self.len),
                ),
            }),
        }
    }

    /// The memfd, to pass to the manager.
    pub fn fd(&self) -> BorrowedFd<'_> {
        self.file.as_fd()
    }
}

/// A connection to the manager.
#[derive(Debug)]
pub struct Client {
    conn: Connection,
}

impl Client {
    /// Connect to the manager's socket at `path`.
    ///
    /// # Errors
    /// [`Error::Protocol`] if it cannot be reached.
    pub fn connect(path: &Path) -> Result<Client> {
        Ok(Client {
            conn: Connection::connect(path, CALL_TIMEOUT)?,
        })
    }

    /// Connect to `$REDN_MANAGER_SOCKET`, or [`DEFAULT_SOCKET`].
    ///
    /// # Errors
    /// As [`Client::connect`].
    pub fn connect_default() -> Result<Client> {
        let path = std::env::var_os("REDN_MANAGER_SOCKET")
            .map_or_else(|| PathBuf::from(DEFAULT_SOCKET), PathBuf::from);
        Client::connect(&path)
    }

    /// Who the manager takes this app to be and what it holds.
    ///
    /// # Errors
    /// [`Error::Refused`] (`PolicyDenied` if no rule matches), [`Error::Protocol`].
    pub fn info(&mut self) -> Result<ManagerInfo> {
        Ok(self.conn.call("io.redn.Manager.GetInfo", &(), &[])?)
    }

    /// The offloads this app may install.
    ///
    /// # Errors
    /// As [`Client::info`].
    pub fn offloads(&mut self) -> Result<Vec<Offload>> {
        let list: api::OffloadList = self.conn.call("io.redn.Manager.ListOffloads", &(), &[])?;
        Ok(list.offloads)
    }

    /// Share `region` with the manager.
    ///
    /// # Errors
    /// [`Error::Refused`] (`QuotaExceeded`, `NotSealed`...), [`Error::Protocol`].
    pub fn register_region(
        &mut self,
        region: &SealedRegion,
        name: &str,
    ) -> Result<RegionRegistered> {
        self.register_fd(region.fd(), name)
    }

    /// Pass any fd as a region (the manager decides whether it is one).
    ///
    /// # Errors
    /// As [`Client::register_region`].
    pub fn register_fd(&mut self, fd: BorrowedFd<'_>, name: &str) -> Result<RegionRegistered> {
        let params = api::RegisterRegion {
            fd: 0,
            name: Some(name.to_owned()),
        };
        Ok(self
            .conn
            .call("io.redn.Manager.RegisterRegion", &params, &[fd])?)
    }

    /// Install `offload` with each data region bound as `(name, region id, offset, len)`.
    ///
    /// # Errors
    /// [`Error::Refused`] (`PolicyDenied`, `VerifierRefused` with the verifier log,
    /// `QuotaExceeded`...), [`Error::Protocol`].
    pub fn install(
        &mut self,
        offload: &str,
        bindings: &[(&str, u64, u64, u64)],
    ) -> Result<Installed> {
        let params = api::InstallOffload {
            offload: offload.to_owned(),
            regions: bindings
                .iter()
                .map(|&(name, region, offset, len)| api::Binding {
                    name: name.to_owned(),
                    region,
                    offset,
                    len,
                })
                .collect(),
            parameters: None,
        };
        Ok(self
            .conn
            .call("io.redn.Manager.InstallOffload", &params, &[])?)
    }

    /// Share `table`'s region, record the manager's address of it in the table, and install
    /// `offload` (a hash-get variant) over it.
    ///
    /// # Errors
    /// As [`Client::register_region`] and [`Client::install`].
    pub fn install_table(
        &mut self,
        offload: &str,
        table: &mut kv::TwoChoiceTable,
    ) -> Result<(RegionRegistered, Installed)> {
        let region = self.register_region(table.region(), "kv")?;
        table.set_base(region.addr);
        let installed = self.install(offload, &table.bindings(region.region))?;
        Ok((region, installed))
    }

    /// Uninstall the offload `handle`.
    ///
    /// # Errors
    /// [`Error::Refused`] (`NoSuchHandle`), [`Error::Protocol`].
    pub fn uninstall(&mut self, handle: u64) -> Result<()> {
        let _: api::Empty =
            self.conn
                .call("io.redn.Manager.Uninstall", &api::Uninstall { handle }, &[])?;
        Ok(())
    }

    /// What this app's offloads have done.
    ///
    /// # Errors
    /// [`Error::Protocol`].
    pub fn stats(&mut self) -> Result<Vec<OffloadStats>> {
        let r: api::StatsReply = self.conn.call("io.redn.Manager.Stats", &(), &[])?;
        Ok(r.offloads)
    }

    /// The raw connection, for calls this type has no method for.
    pub fn connection(&mut self) -> &mut Connection {
        &mut self.conn
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_error_chain_names_every_source_once() {
        let e = Error::Dataplane {
            what: "connecting to the data plane",
            source: std::io::Error::new(std::io::ErrorKind::ConnectionRefused, "refused"),
        };
        assert_eq!(
            error_chain(&e),
            "connecting to the data plane failed: refused"
        );
    }
}
