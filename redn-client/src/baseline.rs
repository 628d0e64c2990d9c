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

use crate::kv::{bucket_indices, BUCKET_LEN, BUCKET_STRIDE, MAX_KEY};
use crate::remote::{fresh_psn, io, sys, LocalNic};
use crate::{Error, Result, SealedRegion};
use redn_program::wqe::{CqeOpcode, Payload, RemoteAddr, WorkRequest, WqeFlags, WrOp};
use redn_sys::mem::SharedBuffer;
use redn_sys::nic::{Completion, CqConfig, MrInfo, Nic, QpConfig};
use redn_sys::softnic::roce::{
    read_record, write_record, QpRecord, RegionRecord, RoceConfig, RoceEndpoint,
};
use redn_sys::softnic::{SoftNic, SoftNicConfig};
use redn_sys::{Access, Cqn, Pdn, Qpn, Rkey, VirtAddr};
use std::collections::HashMap;
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, RwLock};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

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

/// Counters of a server.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ServerStats {
    /// Clients connected since the start.
    pub connections: u64,
    /// Bootstraps refused or failed (bad hello, bad record, too many clients).
    pub refused: u64,
    /// RPC requests answered (found, absent or too large).
    pub answered: u64,
    /// RPC requests dropped as malformed.
    pub malformed: u64,
    /// Completions with an error (a client's queue pair failed; only that client is lost).
    pub failed: u64,
}

#[derive(Default)]
struct Counters {
    connections: AtomicU64,
    refused: AtomicU64,
    answered: AtomicU64,
    malformed: AtomicU64,
    failed: AtomicU64,
}

impl Counters {
    fn snapshot(&self) -> ServerStats {
        let l = |c: &AtomicU64| c.load(Ordering::Relaxed);
        ServerStats {
            connections: l(&self.connections),
            refused: l(&self.refused),
            answered: l(&self.answered),
            malformed: l(&self.malformed),
            failed: l(&self.failed),
        }
    }
}

/// One client's queue pair on a server, alive while its TCP connection is open.
struct Conn {
    stream: TcpStream,
    qp: Qpn,
}

/// What both servers share: a softnic with a RoCEv2 endpoint, the table registered on it,
/// one CQ, the bootstrap listener's thread.
struct ServerCore {
    _nic: Arc<SoftNic>,
    _ep: Arc<RoceEndpoint>,
    addr: SocketAddr,
    stop: Arc<AtomicBool>,
    counters: Arc<Counters>,
    threads: Vec<JoinHandle<()>>,
}

/// What the bootstrap thread needs to make a client's queue pair.
struct Bootstrap {
    kind: Kind,
    nic: Arc<SoftNic>,
    ep: Arc<RoceEndpoint>,
    pd: Pdn,
    cq: Cqn,
    table: MrInfo,
    layout: TableLayout,
    options: BaselineOptions,
    counters: Arc<Counters>,
    /// RPC: per client, its response region and request buffer.
    rpc: Option<Arc<RpcState>>,
}

impl ServerCore {
    /// Check the layout against `memory`, start a softnic and endpoint on `listen`'s address,
    /// register the table with `access`, and start the bootstrap thread.
    fn start(
        kind: Kind,
        memory: &Arc<SharedBuffer>,
        layout: TableLayout,
        listen: SocketAddr,
        options: BaselineOptions,
        access: Access,
        rpc: Option<Arc<RpcState>>,
    ) -> Result<(ServerCore, Arc<SoftNic>, Cqn, MrInfo)> {
        options.check()?;
        let table_end = layout.buckets.checked_mul(BUCKET_STRIDE);
        if layout.buckets == 0 || !table_end.is_some_and(|end| end <= memory.len() as u64) {
            return Err(bad_config(format!(
                "{} buckets do not fit a region of {} bytes",
                layout.buckets,
                memory.len()
            )));
        }
        let SocketAddr::V4(listen) = listen else {
            return Err(Error::Ipv6(listen));
        };
        let nic = Arc::new(
            SoftNic::new(SoftNicConfig::new(&format!("redn-{}-server", kind.name())))
                .map_err(sys("starting the softnic"))?,
        );
        let mut cfg = RoceConfig::new(*listen.ip());
        cfg.bind.set_port(0);
        let ep =
            Arc::new(RoceEndpoint::start(&nic, &cfg).map_err(sys("starting the RoCE endpoint"))?);
        let pd = nic.alloc_pd().map_err(sys("alloc_pd"))?;
        let table = nic
            .reg_mr(pd, memory, 0, memory.len(), access)
            .map_err(sys("registering the table"))?;
        let cq = nic
            .create_cq(CqConfig::new(4096))
            .map_err(sys("create_cq"))?;
        let listener = TcpListener::bind(listen).map_err(io("binding the bootstrap listener"))?;
        listener
            .set_nonblocking(true)
            .map_err(io("setting the listener non-blocking"))?;
        let addr = listener
            .local_addr()
            .map_err(io("the listener's address"))?;
        let stop = Arc::new(AtomicBool::new(false));
        let counters = Arc::new(Counters::default());
        let boot = Bootstrap {
            kind,
            nic: Arc::clone(&nic),
            ep: Arc::clone(&ep),
            pd,
            cq,
            table: table.clone(),
            layout,
            options,
            counters: Arc::clone(&counters),
            rpc,
        };
        let stop2 = Arc::clone(&stop);
        let t = std::thread::Builder::new()
            .name(format!("redn-{}-bootstrap", kind.name()))
            .spawn(move || boot.run(&listener, &stop2))
            .map_err(io("starting the bootstrap thread"))?;
        let core = ServerCore {
            _nic: Arc::clone(&nic),
            _ep: ep,
            addr,
            stop,
            counters,
            threads: vec![t],
        };
        Ok((core, nic, cq, table))
    }
}

impl std::fmt::Debug for ServerCore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ServerCore")
            .field("addr", &self.addr)
            .field("stats", &self.counters.snapshot())
            .finish_non_exhaustive()
    }
}

impl Drop for ServerCore {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Release);
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
    }
}

impl Bootstrap {
    /// Accept clients until `stop`; release a client's queue pair when its connection closes.
    fn run(self, listener: &TcpListener, stop: &AtomicBool) {
        let mut conns: Vec<Conn> = Vec::new();
        while !stop.load(Ordering::Acquire) {
            match listener.accept() {
                Ok((stream, _)) => match self.admit(stream, conns.len()) {
                    Ok(c) => {
                        self.counters.connections.fetch_add(1, Ordering::Relaxed);
                        conns.push(c);
                    }
                    Err(_) => {
                        self.counters.refused.fetch_add(1, Ordering::Relaxed);
                    }
                },
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                    // Nothing to accept: look for closed connections, then wait a little
                    // (a poll interval for new clients, not a synchronisation).
                    conns.retain(|c| {
                        let open = is_open(&c.stream);
                        if !open {
                            self.release(c.qp);
                        }
                        open
                    });
                    std::thread::sleep(Duration::from_millis(2));
                }
                Err(_) => std::thread::sleep(Duration::from_millis(2)),
            }
        }
        for c in conns {
            self.release(c.qp);
        }
    }

    fn release(&self, qp: Qpn) {
        let _ = self.nic.destroy_qp(qp);
        if let Some(rpc) = &self.rpc {
            let gone = rpc
                .conns
                .write()
                .unwrap_or_else(|e| e.into_inner())
                .remove(&qp);
            if let Some(conn) = gone {
                let _ = self.nic.dereg_mr(conn.requests_mr.lkey);
            }
        }
    }

    /// One client's bootstrap: its hello and record, a queue pair for it, the answer.
    fn admit(&self, mut stream: TcpStream, open: usize) -> Result<Conn> {
        stream
            .set_nonblocking(false)
            .and_then(|()| stream.set_read_timeout(Some(self.options.timeout)))
            .and_then(|()| stream.set_write_timeout(Some(self.options.timeout)))
            .and_then(|()| stream.set_nodelay(true))
            .map_err(io("setting socket options"))?;
        let mut hello = [0u8; HELLO_LEN];
        stream
            .read_exact(&mut hello)
            .map_err(io("reading a client's hello"))?;
        if hello[..4] != MAGIC || hello[4] != VERSION || hello[6..] != [0, 0] {
            return Err(bad("a client's hello", format!("{hello:02x?}")));
        }
        let refuse = |stream: &mut TcpStream, status: u8| {
            let _ = stream.write_all(&self.header(status));
        };
        if hello[5] != self.kind as u8 {
            refuse(&mut stream, REFUSED_KIND);
            return Err(bad(
                "a client's hello",
                format!("kind {} at a {} server", hello[5], self.kind.name()),
            ));
        }
        let theirs = read_record(&mut stream).map_err(Error::Exchange)?;
        if open >= MAX_CONNECTIONS {
            refuse(&mut stream, REFUSED_FULL);
            return Err(bad(
                "a client",
                format!("{MAX_CONNECTIONS} clients already"),
            ));
        }
        let response = match self.kind {
            Kind::OneSided => None,
            Kind::Rpc => Some(check_response_region(&theirs)?),
        };
        let mut qc = QpConfig::new(self.pd, self.cq);
        qc.rq_slots = RPC_RECEIVES;
        let qp = self.nic.create_qp(qc).map_err(sys("create_qp"))?.qpn;
        let made = self.connect(qp, &theirs, response, &mut stream);
        if made.is_err() {
            self.release(qp);
        }
        made.map(|()| Conn { stream, qp })
    }

    fn connect(
        &self,
        qp: Qpn,
        theirs: &QpRecord,
        response: Option<RegionRecord>,
        stream: &mut TcpStream,
    ) -> Result<()> {
        let mut ours = self.ep.record(qp, fresh_psn(u64::from(qp.0)));
        if let (Some(rpc), Some(response)) = (&self.rpc, response) {
            let requests = SharedBuffer::new(idx_of(RPC_RECEIVES * RPC_RECEIVE_LEN));
            let mr = self
                .nic
                .reg_mr(self.pd, &requests, 0, requests.len(), Access::LOCAL_WRITE)
                .map_err(sys("registering the request buffer"))?;
            for i in 0..RPC_RECEIVES {
                self.nic
                    .post_recv(
                        qp,
                        u64::from(i),
                        &[mr.sge(u64::from(i * RPC_RECEIVE_LEN), RPC_RECEIVE_LEN)],
                    )
                    .map_err(sys("post_recv"))?;
            }
            rpc.conns.write().unwrap_or_else(|e| e.into_inner()).insert(
                qp,
                RpcConn {
                    requests,
                    requests_mr: mr,
                    response,
                    sent: 0,
                },
            );
        } else {
            ours.regions.push(RegionRecord {
                name: "memory".into(),
                addr: self.table.addr.0,
                rkey: self.table.lkey.0,
                len: self.table.len,
                rights: RIGHT_READ,
            });
        }
        self.ep
            .connect(&ours, theirs)
            .map_err(sys("connecting the queue pair"))?;
        stream
            .write_all(&self.header(0))
            .map_err(io("answering a client"))?;
        write_record(stream, &ours).map_err(Error::Exchange)
    }

    fn header(&self, status: u8) -> [u8; HEADER_LEN] {
        let mut h = [0u8; HEADER_LEN];
        h[..4].copy_from_slice(&MAGIC);
        h[4] = VERSION;
        h[5] = self.kind as u8;
        h[6] = status;
        h[8..16].copy_from_slice(&self.layout.buckets.to_be_bytes());
        h[16..24].copy_from_slice(&self.layout.base.to_be_bytes());
        h[24..28].copy_from_slice(&self.options.max_value.to_be_bytes());
        h
    }
}

/// An RPC client's response region from its record: present, writable, of sane size.
fn check_response_region(theirs: &QpRecord) -> Result<RegionRecord> {
    let r = theirs
        .region("response")
        .ok_or_else(|| bad("a client's record", "no \"response\" region".into()))?;
    if r.rights & RIGHT_WRITE == 0 || r.len == 0 || r.len > u64::from(MAX_VALUE_LIMIT) {
        return Err(bad(
            "a client's record",
            format!(
                "response region of {} bytes with rights {:#x}: needs WRITE and 1..={MAX_VALUE_LIMIT} bytes",
                r.len, r.rights
            ),
        ));
    }
    Ok(r.clone())
}

/// True while the peer has not closed `stream` (nothing is expected on it).
fn is_open(stream: &TcpStream) -> bool {
    if stream.set_nonblocking(true).is_err() {
        return false;
    }
    let mut b = [0u8; 1];
    let open = match stream.peek(&mut b) {
        Ok(0) => false,
        Ok(_) => true,
        Err(e) => e.kind() == std::io::ErrorKind::WouldBlock,
    };
    let _ = stream.set_nonblocking(false);
    open
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

/// The one-sided baseline's server: the table registered for remote READ on a softnic; no
/// thread runs on a GET.
#[derive(Debug)]
pub struct OneSidedServer {
    core: ServerCore,
}

impl OneSidedServer {
    /// Serve `memory` (the table's region, [`map_region`]) laid out as `layout` to
    /// one-sided clients bootstrapping at `listen` (port 0 picks one; IPv4).
    ///
    /// # Errors
    /// [`Error::BadAnswer`] for a layout that does not fit or bad options, [`Error::Ipv6`],
    /// [`Error::Softnic`], [`Error::Dataplane`] (the listener).
    pub fn start(
        memory: Arc<SharedBuffer>,
        layout: TableLayout,
        listen: SocketAddr,
        options: BaselineOptions,
    ) -> Result<OneSidedServer> {
        let (core, ..) = ServerCore::start(
            Kind::OneSided,
            &memory,
            layout,
            listen,
            options,
            Access::REMOTE_READ,
            None,
        )?;
        Ok(OneSidedServer { core })
    }

    /// The bootstrap address clients connect to.
    pub fn addr(&self) -> SocketAddr {
        self.core.addr
    }

    /// Counters.
    pub fn stats(&self) -> ServerStats {
        self.core.counters.snapshot()
    }
}

/// One RPC client as the serving thread sees it.
struct RpcConn {
    requests: Arc<SharedBuffer>,
    requests_mr: MrInfo,
    response: RegionRecord,
    sent: u64,
}

#[derive(Default)]
struct RpcState {
    conns: RwLock<HashMap<Qpn, RpcConn>>,
}

/// The two-sided baseline's server: a thread that busy-polls the receive completions,
/// looks the key up and WRITEs the value back with immediate.
#[derive(Debug)]
pub struct RpcServer {
    core: ServerCore,
}

impl RpcServer {
    /// Serve `memory` (the table's region, [`map_region`]) laid out as `layout` to RPC
    /// clients bootstrapping at `listen` (port 0 picks one; IPv4), with one serving thread
    /// that busy-polls (yielding the CPU between empty polls, never sleeping).
    ///
    /// # Errors
    /// As [`OneSidedServer::start`].
    pub fn start(
        memory: Arc<SharedBuffer>,
        layout: TableLayout,
        listen: SocketAddr,
        options: BaselineOptions,
    ) -> Result<RpcServer> {
        let state = Arc::new(RpcState::default());
        let (mut core, nic, cq, table) = ServerCore::start(
            Kind::Rpc,
            &memory,
            layout,
            listen,
            options,
            Access::NONE,
            Some(Arc::clone(&state)),
        )?;
        let serving = RpcServing {
            nic,
            cq,
            table,
            memory,
            layout,
            max_value: options.max_value,
            state,
            counters: Arc::clone(&core.counters),
        };
        let stop = Arc::clone(&core.stop);
        let t = std::thread::Builder::new()
            .name("redn-rpc-server".into())
            .spawn(move || serving.run(&stop))
            .map_err(io("starting the serving thread"))?;
        core.threads.push(t);
        Ok(RpcServer { core })
    }

    /// The bootstrap address clients connect to.
    pub fn addr(&self) -> SocketAddr {
        self.core.addr
    }

    /// Counters.
    pub fn stats(&self) -> ServerStats {
        self.core.counters.snapshot()
    }
}

struct RpcServing {
    nic: Arc<SoftNic>,
    cq: Cqn,
    table: MrInfo,
    memory: Arc<SharedBuffer>,
    layout: TableLayout,
    max_value: u32,
    state: Arc<RpcState>,
    counters: Arc<Counters>,
}

/// What one request asks for, or why it is dropped.
fn parse_request(b: &[u8]) -> Option<(u64, u32)> {
    if b.len() != REQUEST_LEN || b[12..16] != [0; 4] {
        return None;
    }
    let key = u64::from_be_bytes(b[..8].try_into().ok()?);
    let id = u32::from_be_bytes(b[8..12].try_into().ok()?);
    (key != 0 && key <= MAX_KEY && id <= 0xff_ffff).then_some((key, id))
}

impl RpcServing {
    fn run(self, stop: &AtomicBool) {
        let mut out: Vec<Completion> = Vec::with_capacity(64);
        while !stop.load(Ordering::Acquire) {
            out.clear();
            if self.nic.poll_cq(self.cq, 64, &mut out).is_err() {
                return;
            }
            for c in &out {
                self.handle(c);
            }
            if out.is_empty() {
                // Busy-poll, but let the softnic's own threads have a core of two.
                std::thread::yield_now();
            }
        }
    }

    fn handle(&self, c: &Completion) {
        if !c.is_ok() {
            // The client's queue pair failed (a request longer than a receive, a bad
            // response key): only that client is lost; its flushes land here too.
            self.counters.failed.fetch_add(1, Ordering::Relaxed);
            return;
        }
        if c.opcode == CqeOpcode::Req {
            return; // a send completion of ours (none are signaled)
        }
        // Any other kind consumed a receive (a SEND with immediate, a WRITE with immediate
        // is not a request): its slot is re-posted below and it counts as malformed.
        let is_send = c.opcode == CqeOpcode::RespSend;
        let mut conns = self.state.conns.write().unwrap_or_else(|e| e.into_inner());
        let Some(conn) = conns.get_mut(&c.qpn) else {
            return; // released meanwhile
        };
        let slot = c.wr_id % u64::from(RPC_RECEIVES);
        let at = slot * u64::from(RPC_RECEIVE_LEN);
        let got = redn_sys::conv::idx(u64::from(c.byte_len.min(RPC_RECEIVE_LEN)));
        let mut req = [0u8; RPC_RECEIVE_LEN as usize];
        conn.requests.read(redn_sys::conv::idx(at), &mut req[..got]);
        let answer = parse_request(&req[..got])
            .filter(|_| is_send)
            .map(|(key, id)| (id, self.lookup(key, conn)));
        // The request was copied out: the slot can take the next one.
        let _ = self
            .nic
            .post_recv(c.qpn, slot, &[conn.requests_mr.sge(at, RPC_RECEIVE_LEN)]);
        let Some((id, (status, value))) = answer else {
            self.counters.malformed.fetch_add(1, Ordering::Relaxed);
            return;
        };
        let payload = match value {
            Some((off, len)) => vec![self.table.sge(off, len)],
            None => Vec::new(),
        };
        conn.sent += 1;
        let wr = WorkRequest {
            wr_id: conn.sent,
            flags: WqeFlags::NONE,
            op: WrOp::Write {
                remote: RemoteAddr {
                    addr: VirtAddr(conn.response.addr),
                    rkey: Rkey(conn.response.rkey),
                },
                payload: Payload::Sgl(payload),
                imm: Some((u32::from(status) << 24) | id),
            },
        };
        if self.nic.post_send(c.qpn, &[wr]).is_ok() {
            self.counters.answered.fetch_add(1, Ordering::Relaxed);
        } else {
            self.counters.failed.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// The answer's status and the value's place, from both buckets read as they are now.
    fn lookup(&self, key: u64, conn: &RpcConn) -> (u8, Option<(u64, u32)>) {
        let mut b = [0u8; BUCKET_BYTES];
        for i in bucket_indices(key, self.layout.buckets) {
            self.memory
                .read(redn_sys::conv::idx(i * BUCKET_STRIDE), &mut b);
            let (k, len, addr) = parse_bucket(&b);
            if k != key {
                continue;
            }
            let max = self
                .max_value
                .min(u32::try_from(conn.response.len).unwrap_or(u32::MAX));
            return match value_offset(addr, len, self.layout.base, self.table.len, max) {
                Some(off) => (FOUND, Some((off, len))),
                None => (TOO_LARGE, None),
            };
        }
        (ABSENT, None)
    }
}

/// A client's own softnic, endpoint, queue pair and local buffer, connected to a server.
struct ClientCore {
    nic: SoftNic,
    _ep: RoceEndpoint,
    cq: Cqn,
    qp: Qpn,
    local: Arc<SharedBuffer>,
    local_mr: MrInfo,
    _stream: TcpStream,
    options: BaselineOptions,
    /// The server's header fields.
    buckets: u64,
    base: u64,
    server_max_value: u32,
    theirs: QpRecord,
    out: Vec<Completion>,
}

impl ClientCore {
    /// Bootstrap with the server at `addr` as a `kind` client with `local_len` bytes of local
    /// memory (registered with `access`; named `response` in the record if `respond`).
    fn connect(
        addr: SocketAddr,
        kind: Kind,
        options: BaselineOptions,
        local_len: usize,
        access: Access,
        respond: bool,
    ) -> Result<ClientCore> {
        options.check()?;
        let mut stream = TcpStream::connect_timeout(&addr, options.timeout)
            .map_err(io("connecting to the baseline server"))?;
        stream
            .set_read_timeout(Some(options.timeout))
            .and_then(|()| stream.set_write_timeout(Some(options.timeout)))
            .and_then(|()| stream.set_nodelay(true))
            .map_err(io("setting socket options"))?;
        let LocalNic { nic, ep, pd, cq } = LocalNic::start(
            &stream,
            addr,
            &format!("redn-{}-client", kind.name()),
            4 * CLIENT_RECEIVES,
        )?;
        let local = SharedBuffer::new(local_len);
        let local_mr = nic
            .reg_mr(pd, &local, 0, local.len(), access)
            .map_err(sys("reg_mr"))?;
        let mut qc = QpConfig::new(pd, cq);
        qc.rq_slots = CLIENT_RECEIVES;
        let qp = nic.create_qp(qc).map_err(sys("create_qp"))?.qpn;
        let mut ours = ep.record(qp, fresh_psn(u64::from(qp.0) << 8));
        if respond {
            for i in 0..CLIENT_RECEIVES {
                nic.post_recv(qp, u64::from(i), &[])
                    .map_err(sys("post_recv"))?;
            }
            ours.regions.push(RegionRecord {
                name: "response".into(),
                addr: local_mr.addr.0,
                rkey: local_mr.lkey.0,
                len: local_mr.len,
                rights: RIGHT_WRITE,
            });
        }
        let mut hello = [0u8; HELLO_LEN];
        hello[..4].copy_from_slice(&MAGIC);
        hello[4] = VERSION;
        hello[5] = kind as u8;
        stream.write_all(&hello).map_err(io("sending the hello"))?;
        write_record(&mut stream, &ours).map_err(Error::Exchange)?;
        let mut h = [0u8; HEADER_LEN];
        stream
            .read_exact(&mut h)
            .map_err(|e| timeout_or(e, options.timeout, "the server's answer"))?;
        let from = "the baseline server's answer";
        if h[..4] != MAGIC || h[4] != VERSION {
            return Err(bad(from, format!("header {:02x?}", &h[..8])));
        }
        match h[6] {
            0 if h[5] == kind as u8 => {}
            REFUSED_KIND => {
                return Err(bad(from, format!("refused: not a {} server", kind.name())))
            }
            REFUSED_FULL => return Err(bad(from, "refused: too many clients".into())),
            s => {
                return Err(bad(
                    from,
                    format!("status {s} from a server of kind {}", h[5]),
                ))
            }
        }
        let word = |at: usize| u64::from_be_bytes(h[at..at + 8].try_into().unwrap_or([0; 8]));
        let buckets = word(8);
        let base = word(16);
        let server_max_value = u32::from_be_bytes([h[24], h[25], h[26], h[27]]);
        if buckets == 0 {
            return Err(bad(from, "a table of 0 buckets".into()));
        }
        let theirs = read_record(&mut stream).map_err(Error::Exchange)?;
        ep.connect(&ours, &theirs)
            .map_err(sys("connecting the queue pair"))?;
        Ok(ClientCore {
            nic,
            _ep: ep,
            cq,
            qp,
            local,
            local_mr,
            _stream: stream,
            options,
            buckets,
            base,
            server_max_value,
            theirs,
            out: Vec::with_capacity(8),
        })
    }

    /// Wait for completions until `take` has accepted `want` of them (it returns false for
    /// ones to skip), within the timeout.
    fn wait(
        &mut self,
        want: usize,
        what: &'static str,
        mut take: impl FnMut(&Completion) -> Result<bool>,
    ) -> Result<()> {
        let deadline = Instant::now() + self.options.timeout;
        let mut got = 0;
        let mut idle = 0u32;
        while got < want {
            self.out.clear();
            self.nic
                .poll_cq(self.cq, 8, &mut self.out)
                .map_err(sys("poll_cq"))?;
            for c in &self.out {
                if let Err(syndrome) = c.status {
                    return Err(Error::ResponseFailed {
                        detail: format!("{syndrome:?} on {:?} while waiting for {what}", c.opcode),
                    });
                }
                if take(c)? {
                    got += 1;
                }
            }
            if self.out.is_empty() {
                if Instant::now() >= deadline {
                    return Err(Error::Timeout {
                        waited: self.options.timeout,
                        what,
                    });
                }
                idle += 1;
                if idle < 1000 {
                    std::thread::yield_now();
                } else {
                    std::thread::sleep(Duration::from_micros(50));
                }
            }
        }
        Ok(())
    }

    fn post(&self, wrs: &[WorkRequest]) -> Result<()> {
        self.nic.post_send(self.qp, wrs).map_err(sys("post_send"))
    }
}

fn timeout_or(e: std::io::Error, waited: Duration, what: &'static str) -> Error {
    match e.kind() {
        std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut => {
            Error::Timeout { waited, what }
        }
        _ => Error::Dataplane {
            what: "reading the server's answer",
            source: e,
        },
    }
}

/// How a one-sided GET finds the key's bucket.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Probe {
    /// READ the first bucket; READ the second only if the key is not in the first.
    Sequential,
    /// READ both buckets at once (two READs in one post), then the value.
    Parallel,
}

/// Where a one-sided client's READs land: the two buckets, then the value.
const VALUE_AT: u64 = 2 * BUCKET_STRIDE;

/// The one-sided baseline's client: GETs by RDMA READs alone.
pub struct OneSidedClient {
    core: ClientCore,
    memory: RegionRecord,
    probe: Probe,
    round_trips: u64,
    max_value: u32,
}

impl std::fmt::Debug for OneSidedClient {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("OneSidedClient")
            .field("probe", &self.probe)
            .field("round_trips", &self.round_trips)
            .finish_non_exhaustive()
    }
}

impl OneSidedClient {
    /// Bootstrap with the [`OneSidedServer`] at `addr`.
    ///
    /// # Errors
    /// [`Error::Dataplane`] (TCP), [`Error::Timeout`], [`Error::BadAnswer`] (a refusal, a
    /// header or record that does not check), [`Error::Exchange`], [`Error::Softnic`].
    pub fn connect(
        addr: SocketAddr,
        probe: Probe,
        options: BaselineOptions,
    ) -> Result<OneSidedClient> {
        let len = idx_of(options.max_value) + redn_sys::conv::idx(VALUE_AT);
        let core = ClientCore::connect(
            addr,
            Kind::OneSided,
            options,
            len,
            Access::LOCAL_WRITE,
            false,
        )?;
        let memory = core
            .theirs
            .region("memory")
            .filter(|r| r.rights & RIGHT_READ != 0)
            .cloned()
            .ok_or_else(|| {
                bad(
                    "the one-sided server's record",
                    "no readable \"memory\" region".into(),
                )
            })?;
        let table_end = core.buckets.checked_mul(BUCKET_STRIDE);
        if !table_end.is_some_and(|end| end <= memory.len) {
            return Err(bad(
                "the one-sided server's record",
                format!("{} buckets do not fit {} bytes", core.buckets, memory.len),
            ));
        }
        let max_value = options.max_value.min(core.server_max_value);
        Ok(OneSidedClient {
            core,
            memory,
            probe,
            round_trips: 0,
            max_value,
        })
    }

    /// Network round trips taken so far (a round of READs posted together counts once).
    pub fn round_trips(&self) -> u64 {
        self.round_trips
    }

    /// READ `reads` (remote address, local offset, length) together and wait for all.
    fn read(&mut self, reads: &[(u64, u64, u32)]) -> Result<()> {
        let wrs: Vec<WorkRequest> = reads
            .iter()
            .enumerate()
            .map(|(i, &(remote, at, len))| WorkRequest {
                wr_id: i as u64,
                flags: WqeFlags::SIGNALED,
                op: WrOp::Read {
                    remote: RemoteAddr {
                        addr: VirtAddr(remote),
                        rkey: Rkey(self.memory.rkey),
                    },
                    sgl: vec![self.core.local_mr.sge(at, len)],
                },
            })
            .collect();
        self.core.post(&wrs)?;
        self.round_trips += 1;
        let qp = self.core.qp;
        self.core.wait(reads.len(), "a READ's completion", |c| {
            Ok(c.qpn == qp && c.opcode == CqeOpcode::Req)
        })
    }

    fn bucket_at(&self, local: u64) -> (u64, u32, u64) {
        let mut b = [0u8; BUCKET_BYTES];
        self.core.local.read(redn_sys::conv::idx(local), &mut b);
        parse_bucket(&b)
    }

    /// GET `key`: READ its bucket(s) as [`Probe`] says, then the value.
    ///
    /// # Errors
    /// [`Error::BadKey`], [`Error::Timeout`], [`Error::ResponseFailed`] (a READ failed),
    /// [`Error::BadAnswer`] (a bucket whose value lies outside the region or is longer than
    /// the largest value: corrupt, or read mid-update).
    pub fn get(&mut self, key: u64) -> Result<Option<Vec<u8>>> {
        if key == 0 || key > MAX_KEY {
            return Err(Error::BadKey(key));
        }
        let [a, b] =
            bucket_indices(key, self.core.buckets).map(|i| self.memory.addr + i * BUCKET_STRIDE);
        let len = u32::try_from(BUCKET_LEN).unwrap_or(18);
        let mut found = None;
        match self.probe {
            Probe::Sequential => {
                for (bucket, at) in [(a, 0), (b, BUCKET_STRIDE)] {
                    self.read(&[(bucket, at, len)])?;
                    let (k, vlen, vaddr) = self.bucket_at(at);
                    if k == key {
                        found = Some((vlen, vaddr));
                        break;
                    }
                }
            }
            Probe::Parallel => {
                self.read(&[(a, 0, len), (b, BUCKET_STRIDE, len)])?;
                found = [0, BUCKET_STRIDE]
                    .into_iter()
                    .map(|at| self.bucket_at(at))
                    .find(|&(k, ..)| k == key)
                    .map(|(_, vlen, vaddr)| (vlen, vaddr));
            }
        }
        let Some((vlen, vaddr)) = found else {
            return Ok(None);
        };
        let off = value_offset(vaddr, vlen, self.core.base, self.memory.len, self.max_value)
            .ok_or_else(|| {
                bad(
                    "the table",
                    format!(
                        "key {key:#x}'s bucket names {vlen} bytes at {vaddr:#x}, outside the region or over {} bytes",
                        self.max_value
                    ),
                )
            })?;
        if vlen > 0 {
            self.read(&[(self.memory.addr + off, VALUE_AT, vlen)])?;
        }
        let mut v = vec![0u8; idx_of(vlen)];
        self.core.local.read(redn_sys::conv::idx(VALUE_AT), &mut v);
        Ok(Some(v))
    }
}

/// The two-sided baseline's client: a GET is one SEND of the key and one answer.
pub struct RpcClient {
    core: ClientCore,
    next_id: u32,
}

impl std::fmt::Debug for RpcClient {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RpcClient")
            .field("next_id", &self.next_id)
            .finish_non_exhaustive()
    }
}

impl RpcClient {
    /// Bootstrap with the [`RpcServer`] at `addr`; values up to `options.max_value` fit the
    /// response buffer.
    ///
    /// # Errors
    /// As [`OneSidedClient::connect`].
    pub fn connect(addr: SocketAddr, options: BaselineOptions) -> Result<RpcClient> {
        let core = ClientCore::connect(
            addr,
            Kind::Rpc,
            options,
            idx_of(options.max_value),
            Access::LOCAL_WRITE | Access::REMOTE_WRITE,
            true,
        )?;
        Ok(RpcClient { core, next_id: 1 })
    }

    /// Send raw request bytes (inline, at most 64) without waiting: for tests of how the
    /// server treats malformed requests.
    ///
    /// # Errors
    /// [`Error::Softnic`] (the post).
    pub fn send_raw(&mut self, request: &[u8]) -> Result<()> {
        self.core.post(&[WorkRequest {
            wr_id: 0,
            flags: WqeFlags::NONE,
            op: WrOp::Send {
                payload: Payload::Inline(request.to_vec()),
                imm: None,
            },
        }])
    }

    /// GET `key`: SEND it, wait for the server's WRITE with immediate.
    ///
    /// # Errors
    /// [`Error::BadKey`], [`Error::Timeout`], [`Error::ResponseFailed`], [`Error::BadAnswer`]
    /// (an answer longer than the buffer, or the server's "too large": the value is longer
    /// than `max_value` or lies outside its region).
    pub fn get(&mut self, key: u64) -> Result<Option<Vec<u8>>> {
        if key == 0 || key > MAX_KEY {
            return Err(Error::BadKey(key));
        }
        let id = self.next_id;
        self.next_id = (self.next_id % 0xff_ffff) + 1;
        let mut req = [0u8; REQUEST_LEN];
        req[..8].copy_from_slice(&key.to_be_bytes());
        req[8..12].copy_from_slice(&id.to_be_bytes());
        self.send_raw(&req)?;
        let cap = self.core.local_mr.len;
        let qp = self.core.qp;
        let mut answer = None;
        let mut reposts = Vec::new();
        self.core.wait(1, "the RPC server's answer", |c| {
            if c.qpn != qp || c.opcode != CqeOpcode::RespWriteImm {
                return Ok(false);
            }
            reposts.push(c.wr_id);
            let imm = c.imm.unwrap_or(u32::MAX);
            if imm & 0xff_ffff != id {
                return Ok(false); // an answer to a request that timed out earlier
            }
            if u64::from(c.byte_len) > cap {
                return Err(bad(
                    "the RPC server's answer",
                    format!("{} bytes for a {cap}-byte buffer", c.byte_len),
                ));
            }
            answer = Some((imm >> 24, c.byte_len));
            Ok(true)
        })?;
        for wr_id in reposts {
            self.core
                .nic
                .post_recv(qp, wr_id, &[])
                .map_err(sys("post_recv"))?;
        }
        let from = "the RPC server's answer";
        match answer {
            Some((s, len)) if s == u32::from(FOUND) => {
                let mut v = vec![0u8; idx_of(len)];
                self.core.local.read(0, &mut v);
                Ok(Some(v))
            }
            Some((s, 0)) if s == u32::from(ABSENT) => Ok(None),
            Some((s, 0)) if s == u32::from(TOO_LARGE) => Err(bad(
                from,
                format!("key {key:#x}'s value is over the largest value or outside the region"),
            )),
            Some((s, len)) => Err(bad(from, format!("status {s} with {len} bytes"))),
            None => Err(bad(from, "none".into())),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn requests_parse_only_in_their_one_form() {
        let mut r = [0u8; REQUEST_LEN];
        r[..8].copy_from_slice(&0x1234u64.to_be_bytes());
        r[8..12].copy_from_slice(&77u32.to_be_bytes());
        assert_eq!(parse_request(&r), Some((0x1234, 77)));
        assert_eq!(parse_request(&r[..15]), None);
        let mut bad = r;
        bad[12] = 1;
        assert_eq!(parse_request(&bad), None);
        bad = r;
        bad[..8].copy_from_slice(&(MAX_KEY + 1).to_be_bytes());
        assert_eq!(parse_request(&bad), None);
        bad = r;
        bad[..8].fill(0);
        assert_eq!(parse_request(&bad), None);
    }

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
