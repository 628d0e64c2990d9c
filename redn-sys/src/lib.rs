//! NIC access for the RedN offload manager.
//!
//! Programs, WQE bytes and the numbers a NIC hands out are pure data in `redn-program`; this
//! crate is what touches memory and devices:
//!
//! - [`clock`]: where code that reasons about time reads it (the system's clock, or a test's);
//! - [`mem`]: shared buffers, memory regions, keys and the one place access is checked;
//! - [`nic`]: the [`Nic`](nic::Nic) trait every backend implements;
//! - [`conv`]: the integer conversions between the NIC's 64-bit numbers and memory
//!   offsets, for 64-bit hosts (the only ones the crate builds for);
//! - [`handle`]: owned NIC objects that release themselves when dropped;
//! - [`fault`]: a NIC wrapper that fails a chosen call, for all-or-nothing tests;
//! - [`install`]: installing one client's instance of a program on any [`Nic`](nic::Nic);
//! - [`softnic`]: the software RDMA NIC that executes mlx5 WQE bytes from ring memory, the
//!   default backend.
//!
//! See `docs/architecture.md` for how the pieces fit.

pub mod clock;
pub mod conv;
pub mod fault;
pub mod handle;
pub mod install;
pub mod mem;
pub mod nic;
pub mod rdma_devices;
pub mod softnic;

// The pure modules keep their crate-relative paths inside this crate.
use redn_program::{program, types, wqe};

pub use redn_program::{Access, Cqn, Lkey, Pdn, Qpn, Rkey, VirtAddr};

use std::fmt;

/// Errors of the redn-sys crate.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// A work request could not be encoded.
    #[error("invalid work request")]
    Wqe(#[from] wqe::WqeError),
    /// A memory registration was refused.
    #[error("memory registration refused")]
    Register(#[from] mem::RegisterError),
    /// No queue pair with this number.
    #[error("no queue pair {0}")]
    NoSuchQp(Qpn),
    /// No completion queue with this number.
    #[error("no completion queue {0}")]
    NoSuchCq(Cqn),
    /// No protection domain with this number.
    #[error("no protection domain {0}")]
    NoSuchPd(Pdn),
    /// No memory region with this key.
    #[error("no memory region with key {0}")]
    NoSuchKey(Lkey),
    /// A resource is still used by another.
    #[error("{what} is still in use by {by}")]
    Busy {
        /// The resource.
        what: String,
        /// Who uses it.
        by: String,
    },
    /// The send or receive queue has no room for the request.
    #[error("{queue} queue of QP {qpn} is full ({capacity} entries)")]
    QueueFull {
        /// The queue pair.
        qpn: Qpn,
        /// "send" or "receive".
        queue: &'static str,
        /// Its capacity.
        capacity: u64,
    },
    /// The queue pair is not in a state that allows the operation.
    #[error("QP {qpn} is in state {state}, {what} needs {needed}")]
    QpState {
        /// The queue pair.
        qpn: Qpn,
        /// Its state.
        state: QpState,
        /// The operation.
        what: &'static str,
        /// The state(s) it needs.
        needed: &'static str,
    },
    /// A configuration value is out of range.
    #[error("invalid {what}: {detail}")]
    InvalidConfig {
        /// The setting.
        what: &'static str,
        /// What is wrong with it.
        detail: String,
    },
    /// The CQ overflowed: completions were lost.
    #[error("completion queue {0} overran; completions were lost")]
    CqOverrun(Cqn),
    /// There is no RDMA device to open.
    #[error("no RDMA device: {0}")]
    NoDevice(String),
    /// A RoCE endpoint's socket call failed.
    #[error("cannot {what}")]
    Roce {
        /// What the endpoint was doing.
        what: &'static str,
        /// The system call's error.
        #[source]
        source: std::io::Error,
    },
    /// The out-of-band connection exchange failed.
    #[error("connection exchange failed")]
    Exchange(#[from] softnic::roce::ExchangeError),
}

/// Result with the crate's error.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Queue-pair states (the subset of the IB state machine the softnic models).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum QpState {
    /// Created, not yet connected: receives may be posted, nothing executes.
    Init = 0,
    /// Connected and running.
    ReadyToSend = 1,
    /// Failed or moved to error: outstanding WQEs were flushed with error completions.
    Error = 2,
}

impl QpState {
    pub(crate) fn from_u8(v: u8) -> QpState {
        match v {
            0 => QpState::Init,
            1 => QpState::ReadyToSend,
            _ => QpState::Error,
        }
    }
}

impl fmt::Display for QpState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            QpState::Init => "INIT",
            QpState::ReadyToSend => "RTS",
            QpState::Error => "ERR",
        })
    }
}
