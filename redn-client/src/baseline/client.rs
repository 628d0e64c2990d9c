//! The baselines' clients: a softnic, endpoint and queue pair of their own per client, the
//! one-sided GET (READs) and the RPC GET (a SEND answered by a WRITE with immediate).

use super::{
    bad, idx_of, parse_bucket, value_offset, BaselineOptions, Kind, ABSENT, BUCKET_BYTES,
    CLIENT_RECEIVES, FOUND, HEADER_LEN, HELLO_LEN, MAGIC, REFUSED_FULL, REFUSED_KIND, REQUEST_LEN,
    RIGHT_READ, RIGHT_WRITE, TOO_LARGE, VERSION,
};
use crate::kv::{bucket_indices, BUCKET_LEN, BUCKET_STRIDE, MAX_KEY};
use crate::remote::{fresh_psn, io, sys, ByDeadline, LocalNic};
use crate::{Error, Result};
use redn_program::wqe::{CqeOpcode, Payload, RemoteAddr, WorkRequest, WqeFlags, WrOp};
use redn_sys::mem::SharedBuffer;
use redn_sys::nic::{Completion, MrInfo, Nic, QpConfig};
use redn_sys::softnic::roce::{
    read_record, write_record, ExchangeError, QpRecord, RegionRecord, RoceEndpoint,
};
use redn_sys::softnic::SoftNic;
use redn_sys::{Access, Cqn, Qpn, Rkey, VirtAddr};
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::sync::Arc;
use std::time::{Duration, Instant};

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
        // The server's header and record are due within the timeout as a whole.
        let deadline = Instant::now().checked_add(options.timeout);
        stream.write_all(&hello).map_err(io("sending the hello"))?;
        write_record(&mut stream, &ours).map_err(Error::Exchange)?;
        let mut answer = ByDeadline {
            stream: &stream,
            deadline,
        };
        let mut h = [0u8; HEADER_LEN];
        answer
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
        let theirs = read_record(&mut answer).map_err(|e| match e {
            ExchangeError::Io(e)
                if matches!(
                    e.kind(),
                    std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                ) =>
            {
                timeout_or(e, options.timeout, "the server's record")
            }
            e => Error::Exchange(e),
        })?;
        // Its RoCE side is on the host this connection reached: requests go where the
        // record says.
        let peer = stream.peer_addr().map_err(io("peer address"))?.ip();
        if std::net::IpAddr::V4(*theirs.addr.ip()) != peer {
            return Err(bad(
                "the baseline server's record",
                format!(
                    "its address {} is not {peer}, the server's",
                    theirs.addr.ip()
                ),
            ));
        }
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
        // A timeout past what the clock counts (`Duration::MAX`) waits for ever.
        let deadline = Instant::now().checked_add(self.options.timeout);
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
                if deadline.is_some_and(|d| Instant::now() >= d) {
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
    /// [`OneSidedServer`]: super::OneSidedServer
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
    /// [`RpcServer`]: super::RpcServer
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
