//! The RedN offload manager daemon, as a library so its tests and benchmarks can drive it.
//!
//! - [`audit`]: audit records to syslog;
//! - [`auditor`]: run-time budgets judged from the NIC's counters;
//! - [`system`]: sockets (bound under a lock, or from socket activation), capabilities,
//!   memlock, sd_notify;
//! - [`peer`]: who is on a connection (`SO_PEERCRED`, `SO_PEERPIDFD`, procfs), re-checked
//!   before each request;
//! - [`region`]: sealed memfds, checked and mapped;
//! - [`state`]: policy, offloads, the NIC, clients and installs; the method handlers;
//! - [`server`]: the one event loop serving every connection;
//! - [`outbox`]: a connection's unread replies, kept from growing;
//! - [`dataplane`]: remote clients (TCP hello, an instance of the offload per client,
//!   connected over RoCEv2), served from that loop;
//! - [`cli`]: command-line options and start-up, shared by the binary and the tests.
#![deny(unsafe_code)]

pub mod audit;
pub mod auditor;
pub mod backend;
pub mod cli;
pub mod dataplane;
pub mod heap_trim;
pub mod outbox;
pub mod peer;
pub mod region;
pub mod server;
pub mod state;
pub mod system;
