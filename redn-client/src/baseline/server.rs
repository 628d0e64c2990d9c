//! The baselines' servers: the bootstrap both share, the one-sided server (the table
//! registered for remote READ) and the RPC server (a thread that looks keys up and answers).

use super::{
    bad, bad_config, idx_of, parse_bucket, value_offset, BaselineOptions, Kind, TableLayout,
    ABSENT, BUCKET_BYTES, FOUND, HEADER_LEN, HELLO_LEN, MAGIC, MAX_CONNECTIONS, MAX_VALUE_LIMIT,
    REFUSED_FULL, REFUSED_KIND, REQUEST_LEN, RIGHT_READ, RIGHT_WRITE, RPC_RECEIVES,
    RPC_RECEIVE_LEN, TOO_LARGE, VERSION,
};
use crate::kv::{bucket_indices, BUCKET_STRIDE, MAX_KEY};
use crate::remote::{fresh_psn, io, sys};
use crate::{Error, Result};
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
use std::time::Duration;

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
    /// [`map_region`]: super::map_region
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
    /// [`map_region`]: super::map_region
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
}
