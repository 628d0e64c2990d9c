//! The two baselines RedN's hash GET is measured against (the paper's Fig. 10), over the
//! same softnic RoCEv2 transport the offload uses, on the same memory: a table laid out as
//! [`crate::kv::TwoChoiceTable`] lays it out (buckets of [`BUCKET_LEN`] bytes every
//! [`BUCKET_STRIDE`] from the region's first byte: key BE48, value length BE32, value
//! address BE64, addresses in the manager's space).
//!
//! - **One-sided, FaRM-style** ([`OneSidedServer`], [`OneSidedClient`]): the server registers
//!   the table's memory for remote READ and does nothing else; a GET is RDMA READs issued by
//!   the client: READ the bucket, then READ the value. How it probes the second bucket is
//!   [`Probe`]: `Sequential` READs the first bucket and the second only on a miss (a key in
//!   the first bucket: two round trips; in the second: three; absent: two bucket READs and
//!   no value READ); `Parallel` READs both buckets at once (two READs in one post), then the
//!   value: two round trips wherever the key is, one when it is absent.
//! - **Two-sided RPC** ([`RpcServer`], [`RpcClient`]): a server thread busy-polls its
//!   completion queue for receives, looks the key up in both buckets itself and answers with
//!   an RDMA WRITE with immediate of the value into the client's response buffer, then
//!   re-posts the receive. That is the offload's answer exactly (a WRITE_IMM of the value;
//!   an empty one for "not found"), so the client side differs only in who did the lookup.
//!
//! Both servers run inside the process that starts them: start them in the app on the app's
//! live table ([`map_region`] maps the app's [`SealedRegion`], the memfd it shared with the
//! manager), and a SIGKILL of the app ends them, which is the two-sided outage of the crash
//! figure (the offload, owned by the manager, keeps serving).
//!
//! # Bootstrap
//! A client connects over TCP to the server's [`OneSidedServer::addr`] /
//! [`RpcServer::addr`] and writes an 8-byte hello (`RDNB`, version 1, the kind: 1 one-sided,
//! 2 RPC, 2 zero bytes) and its RoCEv2 exchange record (`redn_sys::softnic::roce`'s
//! format; the RPC client's carries its `response` region). The server answers with a 32-byte
//! header (`RDNB`, version, kind, status 0 or a refusal, a zero byte, then big-endian: buckets
//! u64, base u64, largest value u32, 4 zero bytes) and, if accepted, its own record (the
//! one-sided server's carries the `memory` region: the whole table region, READ only). The
//! `base` is the manager's address of the region's first byte, which the buckets' value
//! addresses are relative to; a one-sided client translates them into the server's region
//! (FaRM clients follow remote pointers the same way). The TCP connection stays open;
//! closing it releases the client's queue pair on the server.
//!
//! # Untrusted input
//! Servers: hellos and records are read with a timeout and checked (kind, sizes, regions);
//! at most [`MAX_CONNECTIONS`] clients; an RPC request is exactly [`REQUEST_LEN`] bytes with a
//! key in `1..=2^48-1` and zero reserved bytes, or it is counted as malformed and dropped
//! (its receive re-posted: there is no request id to answer to); a value is sent only if its
//! address and length lie inside the region and the length is at most the largest value
//! and the client's response buffer. Clients: answers are checked (kind, lengths, the
//! request id, value addresses inside the server's region) and every wait has the timeout
//! of [`BaselineOptions`], ending in [`Error::Timeout`].
//!
//! # Concurrent writers
//! [`crate::kv::TwoChoiceTable::set`] writes the value first, then the bucket, with no
//! version or lock; the offload reads without one, and so do both baselines. A GET racing a
//! SET of the same key may return the old or the new length with a value whose bytes mix the
//! old and new values. Neither reads outside the region: a bucket read mid-update whose
//! address or length falls outside it is refused (the RPC server answers "too large", the
//! one-sided client checks before its value READ), and the GET ends in
//! [`Error::BadAnswer`]. A GET racing the first SET of a key may miss it. Bootstraps are
//! served one at a time, each within the timeout, so a client that stalls its hello delays
//! the next bootstrap by at most that.
//!
//! # Fig. 11's server-side span (for a remote client of the manager's offload)
//! The span from a trigger reaching the server's NIC to its response leaving it cannot be
//! read from the offload's completions alone: the catalog's responses are unsignaled, and
//! a signaled WRITE completes only at its ACK. What the product offers instead, on one
//! host clock (every softnic stamps CQEs with `CLOCK_MONOTONIC` nanoseconds,
//! `redn_sys::softnic::completion_clock_ns`):
//! - `io.redn.Admin.TriggerTimes(handle)` on the manager's admin socket: when each trigger
//!   of the offload reached the manager's softnic since the last call (the receive CQE
//!   timestamps of its instances' client-facing queues), oldest first;
//! - [`crate::remote::Response::received_ns`]: when the response's receive completion was
//!   written on the client's softnic.
//!
//! Send GETs one at a time, note `completion_clock_ns()` before each, then fetch
//! `TriggerTimes`: the arrival of GET *i* is the one stamp between its send and its
//! `received_ns` (the test `redn-manager/tests/trigger_times.rs` pairs them so). The span
//! `received_ns - arrival` runs from NIC to NIC: the server's work plus the response's
//! one-way trip over loopback (half the same-run UDP floor is a fair estimate of the
//! latter) and the client softnic's receive thread (the NIC's part on hardware), without
//! the client application's wake-up to poll or its softnic's wake-up to send. For the
//! two-bucket offloads, take the last response of the trigger.
//!
//! # Usage
//! ```no_run
//! use redn_client::baseline::{map_region, BaselineOptions, OneSidedClient, RpcServer,
//!     RpcClient, OneSidedServer, TableLayout, Probe};
//! use redn_client::kv::TwoChoiceTable;
//! # fn main() -> redn_client::Result<()> {
//! let table = TwoChoiceTable::create(1024)?;           // the app's table (registered, set_base)
//! let memory = map_region(table.region())?;
//! let layout = TableLayout::of(&table);
//! let listen = "127.0.0.1:0".parse().unwrap();
//! let opts = BaselineOptions::default();
//! let one_sided = OneSidedServer::start(memory.clone(), layout, listen, opts)?;
//! let rpc = RpcServer::start(memory, layout, listen, opts)?;
//! // In a remote client process:
//! let mut c = OneSidedClient::connect(one_sided.addr(), Probe::Sequential, opts)?;
//! let _value = c.get(42)?;
//! let mut r = RpcClient::connect(rpc.addr(), opts)?;
//! let _value = r.get(42)?;
//! # Ok(()) }
//! ```
//!
//! [`BUCKET_LEN`]: crate::kv::BUCKET_LEN
//! [`BUCKET_STRIDE`]: crate::kv::BUCKET_STRIDE

use crate::{Error, Result, SealedRegion};
use redn_sys::mem::SharedBuffer;
use std::sync::Arc;
use std::time::Duration;

mod client;
mod server;

pub use client::{OneSidedClient, Probe, RpcClient};
pub use server::{OneSidedServer, RpcServer, ServerStats};

/// [`BUCKET_LEN`] as an array length.
const BUCKET_BYTES: usize = 18;
/// Clients one server serves at once; more are refused.
pub const MAX_CONNECTIONS: usize = 64;
/// Bytes of an RPC request: key (BE64), request id (BE32), 4 zero bytes.
pub const REQUEST_LEN: usize = 16;
/// The largest value a server or client may be configured for.
pub const MAX_VALUE_LIMIT: u32 = 1 << 20;
/// Receives an RPC server keeps posted per client (requests a client may have in flight).
const RPC_RECEIVES: u32 = 16;
/// Bytes of one RPC receive: longer than a request, so a longer one is seen and dropped
/// rather than failing the connection, up to this size.
const RPC_RECEIVE_LEN: u32 = 64;
/// Receives an RPC client keeps posted for answers.
const CLIENT_RECEIVES: u32 = 16;
/// Hello magic and version.
const MAGIC: [u8; 4] = *b"RDNB";
const VERSION: u8 = 1;
const HELLO_LEN: usize = 8;
const HEADER_LEN: usize = 32;
/// Remote rights in exchange records: bit 0 READ, bit 1 WRITE.
const RIGHT_READ: u32 = 1;
const RIGHT_WRITE: u32 = 2;

/// Answer statuses (the top byte of an RPC answer's immediate; the bootstrap header's status).
const FOUND: u8 = 0;
const ABSENT: u8 = 1;
const TOO_LARGE: u8 = 2;
const REFUSED_KIND: u8 = 3;
const REFUSED_FULL: u8 = 4;

/// Which baseline a bootstrap connection is for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Kind {
    OneSided = 1,
    Rpc = 2,
}

impl Kind {
    fn name(self) -> &'static str {
        match self {
            Kind::OneSided => "one-sided",
            Kind::Rpc => "RPC",
        }
    }
}

/// Where the table lies in a region: the bucket count and the address its value pointers
/// are relative to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TableLayout {
    /// Buckets, from the region's first byte, every [`BUCKET_STRIDE`] bytes.
    ///
    /// [`BUCKET_STRIDE`]: crate::kv::BUCKET_STRIDE
    pub buckets: u64,
    /// The manager's address of the region's first byte (`RegisterRegion`'s `addr`): a
    /// bucket's value address minus this is the value's offset in the region.
    pub base: u64,
}

impl TableLayout {
    /// The layout of `table` (after [`crate::kv::TwoChoiceTable::set_base`]).
    pub fn of(table: &crate::kv::TwoChoiceTable) -> TableLayout {
        TableLayout {
            buckets: table.buckets(),
            base: table.base(),
        }
    }
}

/// Settings shared by the servers and clients.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BaselineOptions {
    /// How long a connection, a bootstrap read or an answer may take.
    pub timeout: Duration,
    /// The largest value served or accepted (at most [`MAX_VALUE_LIMIT`]); a client sizes its
    /// buffers by it.
    pub max_value: u32,
}

impl Default for BaselineOptions {
    /// Two seconds; values up to 64 KiB.
    fn default() -> BaselineOptions {
        BaselineOptions {
            timeout: Duration::from_secs(2),
            max_value: 64 << 10,
        }
    }
}

impl BaselineOptions {
    fn check(&self) -> Result<()> {
        if self.max_value == 0 || self.max_value > MAX_VALUE_LIMIT {
            return Err(bad_config(format!(
                "max_value {} is outside 1..={MAX_VALUE_LIMIT}",
                self.max_value
            )));
        }
        if self.timeout.is_zero() {
            return Err(bad_config("timeout is zero".into()));
        }
        Ok(())
    }
}

fn bad_config(detail: String) -> Error {
    Error::BadAnswer {
        from: "the baseline's settings",
        detail,
    }
}

fn bad(from: &'static str, detail: String) -> Error {
    Error::BadAnswer { from, detail }
}

/// Map the app's sealed region (the memfd it registered with the manager) into this
/// process, shared, as a buffer a softnic can register: the servers then serve the live
/// table the app writes and the manager's offload reads.
///
/// # Errors
/// [`Error::Memfd`] (`mmap`).
pub fn map_region(region: &SealedRegion) -> Result<Arc<SharedBuffer>> {
    let mmap_err = |source| Error::Memfd {
        call: "mmap",
        source,
    };
    let len = usize::try_from(region.len())
        .map_err(|_| mmap_err(std::io::ErrorKind::InvalidInput.into()))?;
    // SAFETY: the memfd is sealed against shrinking (`SealedRegion::create`), so it stays
    // `len` bytes long; this process touches the mapping only through the buffer (the app's
    // own writes go through the file with pwrite, like another process's would).
    #[allow(unsafe_code)]
    let mapped = unsafe { SharedBuffer::map_shared(region.fd(), len) };
    mapped.map_err(mmap_err)
}

fn idx_of(n: u32) -> usize {
    redn_sys::conv::idx(u64::from(n))
}

/// The key, value length and value address of a bucket's bytes.
fn parse_bucket(b: &[u8]) -> (u64, u32, u64) {
    let mut k = [0u8; 8];
    k[2..].copy_from_slice(&b[..6]);
    let len = u32::from_be_bytes([b[6], b[7], b[8], b[9]]);
    let mut a = [0u8; 8];
    a.copy_from_slice(&b[10..18]);
    (u64::from_be_bytes(k), len, u64::from_be_bytes(a))
}

/// The offset in a region of `region_len` bytes of a value a bucket says is `len` bytes at
/// `addr` (relative to `base`), if it lies inside and is at most `max` bytes.
fn value_offset(addr: u64, len: u32, base: u64, region_len: u64, max: u32) -> Option<u64> {
    let off = addr.checked_sub(base)?;
    let end = off.checked_add(u64::from(len))?;
    (len <= max && end <= region_len).then_some(off)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kv::BUCKET_LEN;

    #[test]
    fn values_are_placed_only_inside_the_region_and_the_cap() {
        let base = 0x1000;
        assert_eq!(value_offset(base + 64, 64, base, 128, 64), Some(64));
        assert_eq!(
            value_offset(base + 65, 64, base, 128, 64),
            None,
            "past the end"
        );
        assert_eq!(
            value_offset(base - 1, 1, base, 128, 64),
            None,
            "before the start"
        );
        assert_eq!(value_offset(base, 65, base, 128, 64), None, "over the cap");
        assert_eq!(value_offset(u64::MAX, 2, 0, u64::MAX, 64), None, "wrapping");
    }

    #[test]
    fn buckets_parse_as_kv_writes_them() {
        assert_eq!(BUCKET_BYTES as u64, BUCKET_LEN);
        let b = crate::kv::bucket_bytes(0xabcd_ef01_2345, 41, 0x7f00_dead_beef);
        assert_eq!(parse_bucket(&b), (0xabcd_ef01_2345, 41, 0x7f00_dead_beef));
    }
}
