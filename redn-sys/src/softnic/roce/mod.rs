//! The softnic on the wire: RoCEv2 reliable connections (the InfiniBand RC transport over
//! UDP, as ConnectX NICs and Linux's rxe speak it) between softnic instances in different
//! processes or on different hosts.
//!
//! A [`RoceEndpoint`] binds one UDP socket for a softnic (port 4791 by default, another so
//! that several softnics share a host) and runs a receive thread. [`RoceEndpoint::connect`]
//! gives a local QP a `Transport` (`softnic::transport`) that speaks RC to the
//! remote QP a [`QpRecord`] describes; the records are exchanged out of band over TCP
//! ([`exchange`]). In-process connections ([`Nic::connect`](crate::nic::Nic::connect),
//! [`SoftNic::connect_pair`](super::SoftNic::connect_pair)) are unchanged.
//!
//! Modules, in dependency order: `packet` (headers, ICRC, validation), `requester` and
//! `responder` (the RC state machines, without I/O, on the caller's clock), `io` (batched
//! UDP, fault injection), `exchange` (the connection record), `endpoint` (the socket's
//! receive thread, the transport, the glue to the softnic's responder functions).
//! The format and the protocol choices are documented in `docs/rocev2.md`.

mod endpoint;
pub mod exchange;
pub mod io;
pub mod packet;
mod requester;
mod responder;
#[cfg(test)]
mod sim_tests;

pub use endpoint::{RoceConfig, RoceCounters, RoceEndpoint, ROCE_PORT};
pub use exchange::{
    exchange_client, exchange_server, read_record, write_record, ExchangeError, QpRecord,
    RegionRecord,
};
pub use io::Faults;
pub use packet::{DropCounters, DropReason};
