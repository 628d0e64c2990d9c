//! The remote-client side: a client of an app's offload, served by the NIC through the
//! manager's data plane with no app CPU.
//!
//! [`RemoteClient::connect`] opens a TCP connection to the manager's `[dataplane] listen`
//! address, starts a softnic of its own with a RoCEv2 endpoint on the local address of that
//! connection, and sends a [`Hello`] (the offload's handle, the app's token, the exchange
//! record of a fresh queue pair and of its response buffer). The manager installs the
//! offload once more for this client alone (its own queues and protection domains, facing
//! only this queue pair) and answers with its side; the queue pairs are then connected
//! over RoCEv2. The TCP connection stays open: closing it releases the client's instance.
//!
//! Triggers go out as SENDs; each response comes back as an RDMA WRITE with immediate into
//! the response buffer. An instance of a bounded offload serves as many triggers as its
//! program has invocations ([`Session::invocations`]); the client then says hello again for
//! a fresh instance, transparently. A response that does not come within the timeout, or a
//! failed completion, ends the session (the next call starts a new one).

use crate::kv::{bucket_indices, BUCKET_STRIDE, MAX_KEY};
use crate::{Error, Result};
use redn_program::wqe::{Payload, WorkRequest, WqeFlags, WrOp, MAX_WQE_BYTES};
use redn_proto::dataplane::{Accepted, Answer, Hello, ANSWER_HEADER_LEN, TOKEN_LEN};
use redn_sys::mem::SharedBuffer;
use redn_sys::nic::{Completion, CqConfig, MrInfo, Nic, QpConfig};
use redn_sys::softnic::roce::{QpRecord, RegionRecord, RoceConfig, RoceEndpoint};
use redn_sys::softnic::{SoftNic, SoftNicConfig};
use redn_sys::{Access, Cqn, Pdn, Qpn};
use std::io::{Read, Write};
use std::net::{IpAddr, SocketAddr, TcpStream};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Bytes of the response buffer: a value of up to 64 KiB (paper_bench GETs values that big).
const RESPONSE_LEN: usize = 64 << 10;
/// Receives kept posted for responses.
const RECEIVES: u32 = 16;
/// Responses one trigger may bring, and their bytes together: a server that streams
/// answers without the last one cannot make the client hold more. (An offload's answers
/// to one trigger are a few: one per key a trigger carries, and a trigger fits a WQE.)
const MAX_RESPONSES: usize = 1024;
const MAX_RESPONSE_BYTES: usize = 16 << 20;
/// Remote rights of the response buffer in the exchange record: WRITE.
const RIGHT_WRITE: u32 = 2;

/// Settings of a remote client.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RemoteOptions {
    /// How long a connection, a hello or a response may take.
    pub timeout: Duration,
    /// The local address to connect from (a host with several; the manager knows a remote
    /// client by its address), or the one the kernel picks.
    pub source: Option<std::net::Ipv4Addr>,
}

impl Default for RemoteOptions {
    /// Two seconds for everything, from the address the kernel picks.
    fn default() -> RemoteOptions {
        RemoteOptions {
            timeout: Duration::from_secs(2),
            source: None,
        }
    }
}

/// A TCP connection to `addr` within `timeout`, from `source` if given.
fn connect_tcp(
    addr: SocketAddr,
    source: Option<std::net::Ipv4Addr>,
    timeout: Duration,
) -> std::io::Result<TcpStream> {
    use nix::sys::socket::{
        bind, connect, setsockopt, socket, sockopt, AddressFamily, SockFlag, SockType, SockaddrIn,
    };
    let (Some(source), SocketAddr::V4(to)) = (source, addr) else {
        return TcpStream::connect_timeout(&addr, timeout);
    };
    let fd = socket(
        AddressFamily::Inet,
        SockType::Stream,
        SockFlag::SOCK_CLOEXEC,
        None,
    )?;
    bind(
        std::os::fd::AsRawFd::as_raw_fd(&fd),
        &SockaddrIn::from(std::net::SocketAddrV4::new(source, 0)),
    )?;
    // A blocking connect gives up after the send timeout (socket(7)).
    let tv = nix::sys::time::TimeVal::new(
        i64::try_from(timeout.as_secs()).unwrap_or(i64::MAX),
        i64::from(timeout.subsec_micros()),
    );
    setsockopt(&fd, sockopt::SendTimeout, &tv)?;
    connect(std::os::fd::AsRawFd::as_raw_fd(&fd), &SockaddrIn::from(to))?;
    Ok(TcpStream::from(fd))
}

/// One response: the immediate (the invocation number) and the bytes written.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Response {
    /// The immediate.
    pub imm: u32,
    /// The bytes (none: "not found").
    pub data: Vec<u8>,
    /// When the response's receive completion was written on this client's softnic (its
    /// CQE timestamp: `CLOCK_MONOTONIC` nanoseconds, the clock of every softnic on the host).
    /// Less the manager's arrival time of the trigger (`io.redn.Admin.TriggerTimes`), it is
    /// the span from the trigger reaching the server's NIC to the response reaching this
    /// one, without this process's wake-ups.
    pub received_ns: u64,
}

/// The instance the manager serves to this client now.
#[derive(Debug)]
pub struct Session {
    stream: TcpStream,
    qp: Qpn,
    /// What the manager said.
    pub accepted: Accepted,
    /// The manager's record: its QP and the app's data regions (address, length).
    pub manager: QpRecord,
    /// Triggers this instance serves; 0: until the client leaves.
    pub invocations: u32,
    /// Triggers sent on it.
    pub served: u32,
    /// When it was opened or last sent a trigger.
    last_used: Instant,
}

impl Session {
    /// Whether the manager closed the session's connection: it released the instance (the
    /// app uninstalled the offload, the auditor stopped it, or a new client took the slot
    /// of this idle or long-held one: the app's `evict_idle_after`, `evict_held_after`).
    /// The manager writes nothing after
    /// its answer, so anything but "no data yet" means the session is over.
    fn closed_by_manager(&self) -> bool {
        let mut byte = [0u8; 1];
        if self.stream.set_nonblocking(true).is_err() {
            return true;
        }
        let peeked = self.stream.peek(&mut byte);
        let restored = self.stream.set_nonblocking(false).is_ok();
        !restored || !matches!(peeked, Err(e) if e.kind() == std::io::ErrorKind::WouldBlock)
    }
}

/// How long a session may sit unused before the next trigger first checks that the
/// manager still holds it (a look at its connection: three system calls, so not on every
/// trigger of a busy client).
const STALE_AFTER: Duration = Duration::from_millis(100);

/// A remote client of one installed offload.
pub struct RemoteClient {
    addr: SocketAddr,
    handle: u64,
    token: [u8; TOKEN_LEN],
    options: RemoteOptions,
    nic: SoftNic,
    ep: RoceEndpoint,
    cq: Cqn,
    pd: Pdn,
    response: Arc<SharedBuffer>,
    response_mr: MrInfo,
    session: Option<Session>,
    sessions_opened: u64,
    triggers_sent: u64,
}

impl std::fmt::Debug for RemoteClient {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RemoteClient")
            .field("addr", &self.addr)
            .field("handle", &self.handle)
            .field("session", &self.session)
            .finish_non_exhaustive()
    }
}

/// A 64-digit hex token as `InstallOffload` returns it.
///
/// # Errors
/// [`Error::BadToken`].
pub fn parse_token(hex: &str) -> Result<[u8; TOKEN_LEN]> {
    let hex = hex.trim();
    if hex.len() != TOKEN_LEN * 2 || !hex.is_ascii() {
        return Err(Error::BadToken);
    }
    let mut t = [0u8; TOKEN_LEN];
    for (i, b) in t.iter_mut().enumerate() {
        *b = u8::from_str_radix(&hex[2 * i..2 * i + 2], 16).map_err(|_| Error::BadToken)?;
    }
    Ok(t)
}

pub(crate) fn sys(what: &'static str) -> impl Fn(redn_sys::Error) -> Error {
    move |source| Error::Softnic { what, source }
}

pub(crate) fn io(what: &'static str) -> impl Fn(std::io::Error) -> Error {
    move |source| Error::Dataplane { what, source }
}

/// A 24-bit start PSN that differs between sessions.
pub(crate) fn fresh_psn(n: u64) -> u32 {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.subsec_nanos());
    (nanos ^ redn_sys::conv::low32(n.wrapping_mul(0x9e37_79b9))) & 0xff_ffff
}

/// A softnic of a remote client's own, with a RoCE endpoint on the local address of its
/// TCP connection to a server, a protection domain and one CQ.
pub(crate) struct LocalNic {
    pub(crate) nic: SoftNic,
    pub(crate) ep: RoceEndpoint,
    pub(crate) pd: Pdn,
    pub(crate) cq: Cqn,
}

impl LocalNic {
    /// Start one called `name` for `stream` (connected to `addr`) with a CQ of `cq_depth`.
    pub(crate) fn start(
        stream: &TcpStream,
        addr: SocketAddr,
        name: &str,
        cq_depth: u32,
    ) -> Result<LocalNic> {
        let local = match stream.local_addr().map_err(io("local address"))?.ip() {
            IpAddr::V4(ip) => ip,
            IpAddr::V6(_) => return Err(Error::Ipv6(addr)),
        };
        let nic = SoftNic::new(SoftNicConfig::new(name)).map_err(sys("starting the softnic"))?;
        let mut cfg = RoceConfig::new(local);
        cfg.bind.set_port(0);
        let ep = RoceEndpoint::start(&nic, &cfg).map_err(sys("starting the RoCE endpoint"))?;
        let pd = nic.alloc_pd().map_err(sys("alloc_pd"))?;
        let cq = nic
            .create_cq(CqConfig::new(cq_depth))
            .map_err(sys("create_cq"))?;
        Ok(LocalNic { nic, ep, pd, cq })
    }
}

impl RemoteClient {
    /// Connect to the data plane at `addr` as a client of offload `handle` with the app's
    /// `token` (64 hex digits), and open the first session.
    ///
    /// # Errors
    /// [`Error::BadToken`], [`Error::Dataplane`] (TCP), [`Error::Softnic`] (the local
    /// softnic or its RoCE endpoint), [`Error::RemoteRefused`] with the manager's reason,
    /// [`Error::Malformed`], [`Error::Timeout`].
    pub fn connect(
        addr: SocketAddr,
        handle: u64,
        token: &str,
        options: RemoteOptions,
    ) -> Result<RemoteClient> {
        let token = parse_token(token)?;
        let stream = connect_tcp(addr, options.source, options.timeout)
            .map_err(io("connecting to the data plane"))?;
        let LocalNic { nic, ep, pd, cq } =
            LocalNic::start(&stream, addr, "redn-remote-client", 4 * RECEIVES)?;
        let response = SharedBuffer::new(RESPONSE_LEN);
        let response_mr = nic
            .reg_mr(
                pd,
                &response,
                0,
                RESPONSE_LEN,
                Access::LOCAL_WRITE | Access::REMOTE_WRITE,
            )
            .map_err(sys("reg_mr"))?;
        let mut c = RemoteClient {
            addr,
            handle,
            token,
            options,
            nic,
            ep,
            cq,
            pd,
            response,
            response_mr,
            session: None,
            sessions_opened: 0,
            triggers_sent: 0,
        };
        c.open(stream)?;
        Ok(c)
    }

    /// The current session (none after a failure, until the next call opens one).
    pub fn session(&self) -> Option<&Session> {
        self.session.as_ref()
    }

    /// Sessions opened so far (one per instance the manager installed for this client).
    pub fn sessions_opened(&self) -> u64 {
        self.sessions_opened
    }

    /// Triggers sent so far, over all sessions (a GET may take two).
    pub fn triggers_sent(&self) -> u64 {
        self.triggers_sent
    }

    /// Say hello on `stream` with a fresh queue pair and connect it to the manager's side.
    fn open(&mut self, mut stream: TcpStream) -> Result<()> {
        let timeout = Some(self.options.timeout);
        stream
            .set_read_timeout(timeout)
            .and_then(|()| stream.set_write_timeout(timeout))
            .and_then(|()| stream.set_nodelay(true))
            .map_err(io("setting socket options"))?;
        let mut qc = QpConfig::new(self.pd, self.cq);
        qc.rq_slots = RECEIVES;
        let qp = self.nic.create_qp(qc).map_err(sys("create_qp"))?.qpn;
        let result = self.hello(&mut stream, qp);
        match result {
            Ok((accepted, manager)) => {
                self.sessions_opened += 1;
                self.session = Some(Session {
                    stream,
                    qp,
                    invocations: accepted.invocations,
                    accepted,
                    manager,
                    served: 0,
                    last_used: Instant::now(),
                });
                Ok(())
            }
            Err(e) => {
                let _ = self.nic.destroy_qp(qp);
                Err(e)
            }
        }
    }

    fn hello(&self, stream: &mut TcpStream, qp: Qpn) -> Result<(Accepted, QpRecord)> {
        for i in 0..RECEIVES {
            self.nic
                .post_recv(qp, u64::from(i), &[])
                .map_err(sys("post_recv"))?;
        }
        let mut ours = self.ep.record(qp, fresh_psn(self.sessions_opened));
        ours.regions.push(RegionRecord {
            name: "response".into(),
            addr: self.response_mr.addr.0,
            rkey: self.response_mr.lkey.0,
            len: self.response_mr.len,
            rights: RIGHT_WRITE,
        });
        let hello = Hello {
            handle: self.handle,
            token: self.token,
            record: ours.encode().map_err(Error::Exchange)?,
        };
        // The whole answer is due within the timeout, however it is cut up.
        let deadline = Instant::now().checked_add(self.options.timeout);
        stream
            .write_all(&hello.encode().map_err(Error::Malformed)?)
            .map_err(io("sending the hello"))?;
        let mut header = [0u8; ANSWER_HEADER_LEN];
        read_answer(stream, &mut header, deadline, self.options.timeout)?;
        let mut body = vec![0u8; Answer::body_len(&header).map_err(Error::Malformed)?];
        read_answer(stream, &mut body, deadline, self.options.timeout)?;
        match Answer::decode(&header, &body).map_err(Error::Malformed)? {
            // The reason is the server's text, and goes into messages users print.
            Answer::Refused(refusal, reason) => Err(Error::RemoteRefused {
                refusal,
                reason: redn_proto::printable(&reason).into_owned(),
            }),
            Answer::Accepted(a) => {
                // Triggers go out inline in one WQE; a longer one can never be sent, and
                // find() builds its trigger this long.
                if usize::try_from(a.trigger_len).map_or(true, |n| n > MAX_WQE_BYTES) {
                    return Err(Error::BadAnswer {
                        from: "the manager's answer",
                        detail: format!(
                            "a trigger of {} bytes, over a WQE's {MAX_WQE_BYTES}",
                            a.trigger_len
                        ),
                    });
                }
                let theirs = QpRecord::decode(&a.record).map_err(Error::Exchange)?;
                // The manager's RoCE side is on the host this connection reached (as the
                // manager checks the client's): triggers carry keys, and go where the
                // record says.
                let peer = stream.peer_addr().map_err(io("peer address"))?.ip();
                if IpAddr::V4(*theirs.addr.ip()) != peer {
                    return Err(Error::BadAnswer {
                        from: "the manager's record",
                        detail: format!(
                            "its address {} is not {peer}, the data plane's",
                            theirs.addr.ip()
                        ),
                    });
                }
                self.ep
                    .connect(&ours, &theirs)
                    .map_err(sys("connecting the queue pair"))?;
                Ok((a, theirs))
            }
        }
    }

    /// The session to send on: the current one, or a new one if it is used up or gone.
    fn ready_session(&mut self) -> Result<()> {
        let used_up = self
            .session
            .as_ref()
            .is_some_and(|s| s.invocations != 0 && s.served >= s.invocations);
        // A session unused for a while may have been released by the manager since: a
        // trigger sent on it would only time out.
        let released = self
            .session
            .as_ref()
            .is_some_and(|s| s.last_used.elapsed() >= STALE_AFTER && s.closed_by_manager());
        if used_up || released {
            self.close_session();
        }
        if self.session.is_none() {
            let stream = connect_tcp(self.addr, self.options.source, self.options.timeout)
                .map_err(io("connecting to the data plane"))?;
            self.open(stream)?;
        }
        Ok(())
    }

    /// Start over: release the current instance (closing its connection) and say hello
    /// for a new one.
    ///
    /// # Errors
    /// As [`RemoteClient::connect`].
    pub fn reconnect(&mut self) -> Result<()> {
        self.close_session();
        self.ready_session()
    }

    fn close_session(&mut self) {
        if let Some(s) = self.session.take() {
            let _ = s.stream.shutdown(std::net::Shutdown::Both);
            let _ = self.nic.destroy_qp(s.qp);
            // Its receives were flushed into the CQ: take them now, or a run of sessions
            // opened with no trigger between them (reconnects) overruns the CQ.
            let mut flushed = Vec::new();
            while self
                .nic
                .poll_cq(self.cq, 64, &mut flushed)
                .is_ok_and(|n| n > 0)
            {
                flushed.clear();
            }
        }
    }

    /// Send one raw trigger (`trigger_len` bytes, the offload's format) and collect
    /// responses until `done` says the last one came (at most 1,024 of them, 16 MiB in all).
    ///
    /// # Errors
    /// [`Error::TriggerLength`], [`Error::Timeout`], [`Error::ResponseFailed`],
    /// [`Error::BadAnswer`] past the most responses one trigger may bring (the session is
    /// closed), and what opening a session can fail with.
    pub fn trigger_until(
        &mut self,
        msg: &[u8],
        mut done: impl FnMut(&Response) -> bool,
    ) -> Result<Vec<Response>> {
        self.ready_session()?;
        if !self.drop_stale() {
            // The session failed while idle: this trigger goes out on a new one.
            self.close_session();
            self.ready_session()?;
            self.drop_stale();
        }
        let Some(s) = self.session.as_mut() else {
            return Err(Error::SessionLost);
        };
        let want = s.accepted.trigger_len;
        if u32::try_from(msg.len()).ok() != Some(want) {
            return Err(Error::TriggerLength {
                got: msg.len(),
                want,
            });
        }
        let qp = s.qp;
        s.served += 1;
        s.last_used = Instant::now();
        self.triggers_sent += 1;
        let send = WorkRequest {
            wr_id: 0,
            flags: WqeFlags::NONE,
            op: WrOp::Send {
                payload: Payload::Inline(msg.to_vec()),
                imm: None,
            },
        };
        if let Err(e) = self.nic.post_send(qp, &[send]) {
            self.close_session();
            return Err(sys("post_send")(e));
        }
        // A timeout past what the clock counts (`Duration::MAX`) waits for ever.
        let deadline = Instant::now().checked_add(self.options.timeout);
        let mut got = Vec::new();
        let mut got_bytes = 0usize;
        let mut out: Vec<Completion> = Vec::new();
        let mut idle = 0u32;
        loop {
            out.clear();
            let polled = self.nic.poll_cq(self.cq, 4, &mut out);
            if let Err(e) = polled {
                self.close_session();
                return Err(sys("poll_cq")(e));
            }
            for c in &out {
                if c.qpn != qp {
                    continue; // an earlier session's receives, flushed as it closed
                }
                if let Err(syndrome) = c.status {
                    self.close_session();
                    return Err(Error::ResponseFailed {
                        detail: format!("{:?} on {:?}", syndrome, c.opcode),
                    });
                }
                let _ = self.nic.post_recv(qp, c.wr_id, &[]);
                let len = usize::try_from(c.byte_len)
                    .unwrap_or(RESPONSE_LEN)
                    .min(RESPONSE_LEN);
                let mut data = vec![0u8; len];
                self.response.read(0, &mut data);
                let r = Response {
                    imm: c.imm.unwrap_or(0),
                    data,
                    received_ns: c.cqe.timestamp,
                };
                let last = done(&r);
                got_bytes += r.data.len();
                got.push(r);
                if last {
                    return Ok(got);
                }
                if got.len() >= MAX_RESPONSES || got_bytes > MAX_RESPONSE_BYTES {
                    self.close_session();
                    return Err(Error::BadAnswer {
                        from: "the server's responses",
                        detail: format!(
                            "{} responses ({got_bytes} bytes) to one trigger and no last \
                             one; at most {MAX_RESPONSES} ({MAX_RESPONSE_BYTES} bytes) are taken",
                            got.len()
                        ),
                    });
                }
            }
            if out.is_empty() {
                if deadline.is_some_and(|d| Instant::now() >= d) {
                    self.close_session();
                    return Err(Error::Timeout {
                        waited: self.options.timeout,
                        what: "a response",
                    });
                }
                // Spin briefly, then yield the CPU more politely while the NIC works.
                idle += 1;
                if idle < 1000 {
                    std::thread::yield_now();
                } else {
                    std::thread::sleep(Duration::from_micros(50));
                }
            }
        }
    }

    /// Drop the completions that came before a trigger was sent: they answer no trigger
    /// (a server's WRITEs with immediate nobody asked for, an extra response to an earlier
    /// trigger after its caller stopped waiting), and would be taken for the next one's
    /// answer. At most a few CQs' worth, so that a server writing without pause cannot
    /// keep the client here. False if one was an error: the session's QP is then dead.
    fn drop_stale(&mut self) -> bool {
        let Some(qp) = self.session.as_ref().map(|s| s.qp) else {
            return true;
        };
        let mut out: Vec<Completion> = Vec::new();
        let mut dropped = 0;
        while dropped < 4 * RECEIVES {
            out.clear();
            if self.nic.poll_cq(self.cq, 16, &mut out).is_err() {
                return false;
            }
            if out.is_empty() {
                break;
            }
            for c in &out {
                dropped += 1;
                if c.qpn != qp {
                    continue; // an earlier session's receives, flushed as it closed
                }
                if c.status.is_err() {
                    return false;
                }
                let _ = self.nic.post_recv(qp, c.wr_id, &[]);
            }
        }
        true
    }

    /// Send one raw trigger and wait for `responses` responses.
    ///
    /// # Errors
    /// As [`RemoteClient::trigger_until`].
    pub fn trigger(&mut self, msg: &[u8], responses: usize) -> Result<Vec<Response>> {
        let mut n = 0;
        self.trigger_until(msg, |_| {
            n += 1;
            n >= responses
        })
    }

    /// The offload this client is served (after the first session).
    fn offload(&mut self) -> Result<String> {
        self.ready_session()?;
        self.session
            .as_ref()
            .map(|s| s.accepted.offload.clone())
            .ok_or(Error::SessionLost)
    }

    fn region(&self, name: &str, offload: &str) -> Result<RegionRecord> {
        self.session
            .as_ref()
            .and_then(|s| s.manager.region(name).cloned())
            .ok_or_else(|| Error::Unsupported {
                offload: offload.to_owned(),
                what: format!("no region {name:?} in the manager's answer"),
            })
    }

    /// GET `key` from a two-choice hash table ([`crate::kv`]) served by `hash-get`,
    /// `server-loop` (one bucket per trigger: the second is probed on a miss in the
    /// first), `hash-get-seq` or `hash-get-par` (both in one trigger).
    ///
    /// # Errors
    /// [`Error::BadKey`], [`Error::Unsupported`] for another offload, and as
    /// [`RemoteClient::trigger_until`].
    pub fn get(&mut self, key: u64) -> Result<Option<Vec<u8>>> {
        if key == 0 || key > MAX_KEY {
            return Err(Error::BadKey(key));
        }
        let offload = self.offload()?;
        let table = self.region("table", &offload)?;
        // The manager's numbers: a table past the end of the address space has no
        // bucket addresses (each below is under `table.addr + table.len`).
        if table.addr.checked_add(table.len).is_none() {
            return Err(Error::BadAnswer {
                from: "the manager's record",
                detail: format!(
                    "table region of {} bytes at {:#x} passes the end of the address space",
                    table.len, table.addr
                ),
            });
        }
        let buckets = table.len / BUCKET_STRIDE;
        let [a, b] = bucket_indices(key, buckets).map(|i| table.addr + i * BUCKET_STRIDE);
        let key_le = key_bytes(key);
        match offload.as_str() {
            "hash-get" | "server-loop" => {
                for bucket in [a, b] {
                    let msg = [&key_le[..], &bucket.to_be_bytes()].concat();
                    let r = self.trigger(&msg, 1)?;
                    if let Some(hit) = r.into_iter().find(|r| !r.data.is_empty()) {
                        return Ok(Some(hit.data));
                    }
                }
                Ok(None)
            }
            "hash-get-seq" | "hash-get-par" => {
                let msg = [&key_le[..], &key_le, &a.to_be_bytes(), &b.to_be_bytes()].concat();
                let r = self.trigger(&msg, 2)?;
                Ok(r.into_iter().find(|r| !r.data.is_empty()).map(|r| r.data))
            }
            _ => Err(Error::Unsupported {
                offload,
                what: "get (a hash GET)".into(),
            }),
        }
    }

    /// Find `key` in the linked list served by `list-find` or `list-find-break`: the value
    /// of the first node holding it.
    ///
    /// # Errors
    /// [`Error::BadKey`], [`Error::Unsupported`] for another offload, and as
    /// [`RemoteClient::trigger_until`].
    pub fn find(&mut self, key: u64) -> Result<Option<Vec<u8>>> {
        if key == 0 || key > MAX_KEY {
            return Err(Error::BadKey(key));
        }
        let offload = self.offload()?;
        if !offload.starts_with("list-find") {
            return Err(Error::Unsupported {
                offload,
                what: "find (a list walk)".into(),
            });
        }
        let head = self.region("list", &offload)?;
        let trigger_len = self.session.as_ref().map_or(0, |s| s.accepted.trigger_len);
        // list-find: head · key × N; list-find-break: head · head · (key · key) × N.
        let copies: u32 = if offload == "list-find-break" { 2 } else { 1 };
        let steps = trigger_len.saturating_sub(8 * copies) / (6 * copies);
        let mut msg = Vec::new();
        for _ in 0..copies {
            msg.extend(head.addr.to_be_bytes());
        }
        for _ in 0..steps * copies {
            msg.extend(key_bytes(key));
        }
        // list-find: values first, then a zero-length end marker; with break, one answer.
        let r = self.trigger_until(&msg, |r| copies == 2 || r.data.is_empty())?;
        Ok(r.into_iter().find(|r| !r.data.is_empty()).map(|r| r.data))
    }
}

impl Drop for RemoteClient {
    fn drop(&mut self) {
        self.close_session();
    }
}

/// A key as triggers carry it: 6 bytes, little-endian.
fn key_bytes(key: u64) -> [u8; 6] {
    let b = key.to_le_bytes();
    [b[0], b[1], b[2], b[3], b[4], b[5]]
}

/// Reads from a stream until a deadline (none: no limit), however the bytes are spread out:
/// each read waits only for what is left of it, where a read timeout alone restarts with
/// every byte a server trickles. A read past the deadline fails `TimedOut`.
pub(crate) struct ByDeadline<'a> {
    pub(crate) stream: &'a TcpStream,
    pub(crate) deadline: Option<Instant>,
}

impl Read for ByDeadline<'_> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        if let Some(d) = self.deadline {
            let left = d.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Err(std::io::ErrorKind::TimedOut.into());
            }
            self.stream.set_read_timeout(Some(left))?;
        }
        let mut s = self.stream;
        s.read(buf)
    }
}

/// Fill `buf` from `stream` by `deadline`, so that an answer sent a byte at a time cannot
/// hold the client past its timeout.
fn read_answer(
    stream: &TcpStream,
    buf: &mut [u8],
    deadline: Option<Instant>,
    waited: Duration,
) -> Result<()> {
    ByDeadline { stream, deadline }
        .read_exact(buf)
        .map_err(|e| match e.kind() {
            std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut => Error::Timeout {
                waited,
                what: "the manager's answer",
            },
            _ => Error::Dataplane {
                what: "reading the answer",
                source: e,
            },
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tokens_parse_from_hex_only() {
        let hex = "0f".repeat(32);
        assert_eq!(parse_token(&hex).unwrap(), [0x0f; 32]);
        assert!(matches!(parse_token("0f"), Err(Error::BadToken)));
        assert!(matches!(
            parse_token(&"zz".repeat(32)),
            Err(Error::BadToken)
        ));
        assert!(matches!(parse_token(&"é".repeat(32)), Err(Error::BadToken)));
    }

    #[test]
    fn keys_go_out_little_endian_as_the_catalog_sends_them() {
        assert_eq!(
            key_bytes(0x0102_0304_0506),
            redn_program::program::catalog::trigger_key(0x0102_0304_0506)
        );
    }
}
