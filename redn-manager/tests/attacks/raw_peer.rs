//! A remote client of the attacker's own making: a plain UDP socket that its hellos name,
//! from which it sends hand-built RoCE packets (triggers, replies to the offload's answers,
//! whatever it likes) and reads what the manager sends back. `requester`, `lifecycle`,
//! `enforcement` and `flood` attack with it.

use super::*;
use redn_proto::dataplane::{Answer, Hello, Refusal};
use redn_sys::softnic::roce::packet::{self, opcode, psn, Aeth, Header, Reth, Route, Syndrome};
use redn_sys::softnic::roce::QpRecord;
use std::net::{SocketAddrV4, TcpStream, UdpSocket};
use std::time::{Duration, Instant};

/// The PSN the attacker's requests start at (the manager's responder expects it first).
pub const START_PSN: u32 = 0x12_3456;

/// Where and as what a remote client says hello: the data plane's address and the
/// offload's handle and token (what the app hands its remote clients).
#[derive(Clone)]
pub struct Door {
    pub endpoint: String,
    pub handle: u64,
    pub token: [u8; 32],
}

impl Door {
    pub fn of(installed: &redn_client::Installed) -> Door {
        Door {
            endpoint: installed.endpoint.clone().unwrap(),
            handle: installed.handle,
            token: redn_client::remote::parse_token(&installed.token).unwrap(),
        }
    }

    pub fn of_app(a: &App) -> Door {
        Door {
            endpoint: a.endpoint.clone(),
            handle: a.handle,
            token: redn_client::remote::parse_token(&a.token).unwrap(),
        }
    }

    /// A well-behaved remote client (the library's) at this door.
    pub fn good_client(&self) -> redn_client::remote::RemoteClient {
        let token: String = self.token.iter().map(|b| format!("{b:02x}")).collect();
        redn_client::remote::RemoteClient::connect(
            self.endpoint.parse().unwrap(),
            self.handle,
            &token,
            redn_client::remote::RemoteOptions {
                timeout: DEADLINE,
                ..Default::default()
            },
        )
        .unwrap()
    }

    /// The hello with our `record`, encoded.
    pub fn hello_bytes(&self, record: &QpRecord) -> Vec<u8> {
        Hello {
            handle: self.handle,
            token: self.token,
            record: record.encode().unwrap(),
        }
        .encode()
        .unwrap()
    }

    /// Connect and send a hello with our `record`; the connection, answer unread.
    pub fn send_hello(&self, record: &QpRecord) -> TcpStream {
        let mut tcp = TcpStream::connect(&self.endpoint).unwrap();
        tcp.set_read_timeout(Some(DEADLINE)).unwrap();
        tcp.write_all(&self.hello_bytes(record)).unwrap();
        tcp
    }

    /// Say hello with our `record` and read the answer: the session, or the refusal and
    /// the manager's words for it.
    pub fn try_hello(&self, record: &QpRecord) -> Result<Session, (Refusal, String)> {
        let mut tcp = self.send_hello(record);
        match read_answer(&mut tcp) {
            Answer::Accepted(a) => Ok(Session {
                server: QpRecord::decode(&a.record).unwrap(),
                tcp,
                epsn: record.psn,
            }),
            Answer::Refused(r, why) => Err((r, why)),
        }
    }

    /// [`Door::try_hello`] for a test that must be accepted.
    pub fn hello(&self, record: &QpRecord) -> Session {
        self.try_hello(record)
            .unwrap_or_else(|(r, why)| panic!("hello refused: {r}: {why}"))
    }
}

/// An offload an app installed on a table holding key 0x2a ("hello"), and the door to it.
pub struct Served {
    _table: redn_client::kv::TwoChoiceTable,
    pub door: Door,
}

impl Served {
    pub fn install(app: &mut redn_client::Client, offload: &str) -> Served {
        let mut table = redn_client::kv::TwoChoiceTable::create(64).unwrap();
        let (_, installed) = app.install_table(offload, &mut table).unwrap();
        table.set(0x2a, b"hello").unwrap();
        Served {
            _table: table,
            door: Door::of(&installed),
        }
    }
}

/// An accepted session: the manager's record and the connection that holds the instance.
pub struct Session {
    pub server: QpRecord,
    pub tcp: TcpStream,
    /// The PSN the manager's responder expects next.
    pub epsn: u32,
}

/// How big a datagram the manager sent was.
#[derive(Clone, Copy, Debug)]
pub struct Size {
    /// The whole datagram (headers, payload, ICRC).
    pub datagram: usize,
    pub payload: usize,
}

/// The attacker's RoCE side: a plain UDP socket its hellos name.
pub struct Peer {
    pub sock: UdpSocket,
    pub me: SocketAddrV4,
}

impl Peer {
    pub fn new() -> Peer {
        let sock = UdpSocket::bind("127.0.0.1:0").unwrap();
        // Room for what the manager sends while we are not reading (a flood's replies, an
        // answer's resends); forcing past rmem_max needs root, else the default stays.
        let _ = nix::sys::socket::setsockopt(
            &sock,
            nix::sys::socket::sockopt::RcvBufForce,
            &(32 << 20),
        );
        let std::net::SocketAddr::V4(me) = sock.local_addr().unwrap() else {
            unreachable!("bound to an IPv4 address")
        };
        Peer { sock, me }
    }

    /// Our record for QP `qpn` at our socket, our requests starting at [`START_PSN`] (a
    /// writable 4 KiB `response` region).
    pub fn record(&self, qpn: u32) -> QpRecord {
        qp_record(qpn, START_PSN, self.me)
    }

    /// Say hello at `door` for QP `qpn` at our socket: the session, or the refusal.
    pub fn try_hello(&self, door: &Door, qpn: u32) -> Result<Session, Refusal> {
        door.try_hello(&self.record(qpn)).map_err(|(r, _)| r)
    }

    /// Say hello at `door` for QP `qpn` at our socket; refused, the test fails.
    pub fn hello(&self, door: &Door, qpn: u32) -> Session {
        door.hello(&self.record(qpn))
    }

    /// The same with our requests starting at `start_psn` and our path MTU `mtu`.
    pub fn hello_with(&self, door: &Door, qpn: u32, start_psn: u32, mtu: u16) -> Session {
        let mut record = qp_record(qpn, start_psn, self.me);
        record.mtu = mtu;
        door.hello(&record)
    }

    /// Send `h` and `payload` to the manager's endpoint that `server` names; the bytes
    /// sent.
    pub fn send(&self, server: &QpRecord, h: &Header, payload: &[u8]) -> usize {
        let mut d = Vec::new();
        let route = Route {
            src: self.me,
            dst: server.addr,
        };
        packet::encode(&mut d, &route, h, payload);
        self.sock.send_to(&d, server.addr).unwrap();
        d.len()
    }

    /// The next datagram the manager sends us within `wait`, decoded, with its size.
    pub fn recv(&self, wait: Duration) -> Option<(Header, Size)> {
        self.sock
            .set_read_timeout(Some(wait.max(Duration::from_micros(1))))
            .unwrap();
        let mut buf = [0u8; 8192];
        let (n, from) = self.sock.recv_from(&mut buf).ok()?;
        let std::net::SocketAddr::V4(from) = from else {
            unreachable!("IPv4 only")
        };
        let p = packet::decode(
            &Route {
                src: from,
                dst: self.me,
            },
            &buf[..n],
        )
        .unwrap();
        let size = Size {
            datagram: n,
            payload: p.payload.len(),
        };
        Some((p.header, size))
    }

    /// The next request the manager sends us within `wait` (an offload's answer to a
    /// trigger: a WRITE to our `response`), skipping ACKs and NAKs.
    pub fn answer_within(&self, wait: Duration) -> Option<Header> {
        let end = Instant::now() + wait;
        loop {
            let left = end.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return None;
            }
            let (h, _) = self.recv(left)?;
            if is_request(&h) {
                return Some(h);
            }
        }
    }

    /// [`Peer::answer_within`] the deadline, for a test that must have it.
    pub fn answer(&self) -> Header {
        self.answer_within(DEADLINE)
            .expect("the offload never answered")
    }

    /// The syndrome of the next ACK or NAK the manager sends us.
    pub fn next_syndrome(&self) -> u8 {
        let (h, _) = self.recv(DEADLINE).expect("the manager never replied");
        assert_eq!(h.opcode, opcode::ACKNOWLEDGE, "{h:?}");
        h.aeth.unwrap().syndrome
    }

    /// A GET trigger for key 0x2a in the app's table's first bucket to `s`'s QP at the PSN
    /// it expects, asking for an ACK: the offload answers with a WRITE to our `response`.
    pub fn trigger(&self, s: &mut Session) {
        let table = s.server.region("table").unwrap().addr;
        self.trigger_at(s, table);
    }

    /// The same for key 0x2a at `bucket` (its address).
    pub fn trigger_at(&self, s: &mut Session, bucket: u64) {
        let mut h = Header::new(opcode::SEND_ONLY, s.server.qpn, s.epsn);
        h.ack_req = true;
        self.send(&s.server, &h, &trigger_payload(0x2a, bucket));
        s.epsn = psn::add(s.epsn, 1);
    }

    /// Trigger a GET as a requester would: sent again at the same PSN after each RNR NAK
    /// (the offload enables its receive a moment after the hello), until its answer comes.
    pub fn trigger_answered(&self, s: &mut Session) -> Header {
        let at = s.epsn;
        let end = Instant::now() + Duration::from_secs(5);
        loop {
            s.epsn = at;
            self.trigger(s);
            let (h, _) = self
                .recv(end.saturating_duration_since(Instant::now()))
                .expect("the offload never answered the trigger");
            if is_request(&h) {
                return h;
            }
            if is_rnr(&h) {
                std::thread::sleep(Duration::from_millis(1));
                continue;
            }
            // An ACK of the trigger: the answer follows.
            return self
                .answer_within(Duration::from_secs(5))
                .expect("no answer after the ACK");
        }
    }

    /// An ACKNOWLEDGE (or `op`) with `syndrome` at `at` to `s`'s QP; the bytes sent.
    pub fn reply(&self, s: &Session, op: u8, at: u32, syndrome: u8, payload: &[u8]) -> usize {
        let mut h = Header::new(op, s.server.qpn, at & psn::MASK);
        h.aeth = Some(Aeth { syndrome, msn: 0 });
        if op == opcode::ATOMIC_ACKNOWLEDGE {
            h.atomic_ack = Some(0xdead_beef);
        }
        if op == opcode::READ_RESPONSE_MIDDLE {
            h.aeth = None;
        }
        self.send(&s.server, &h, payload)
    }

    /// ACK the manager's request at `at` on `s`'s QP.
    pub fn ack(&self, s: &Session, at: u32) {
        self.reply(s, opcode::ACKNOWLEDGE, at, Syndrome::ACK, &[]);
    }

    /// A sequence NAK ("I expect `at`") to `s`'s QP.
    pub fn nak_sequence(&self, s: &Session, at: u32) {
        self.reply(s, opcode::ACKNOWLEDGE, at, Syndrome::NAK_SEQUENCE, &[]);
    }

    /// A WRITE at the expected PSN to a key that is not the QP's domain's: a remote access
    /// NAK, and the manager's side of the QP in error.
    pub fn write_to_a_bad_key(&self, s: &Session) {
        self.send(&s.server, &bad_key_write(s.server.qpn, s.epsn), &[0; 8]);
    }

    /// A WRITE MIDDLE at the expected PSN with no WRITE in progress: an invalid request
    /// NAK, and the manager's side of the QP in error.
    pub fn write_middle_out_of_sequence(&self, s: &Session) {
        self.send(
            &s.server,
            &Header::new(opcode::WRITE_MIDDLE, s.server.qpn, s.epsn),
            &[0; 256],
        );
    }
}

/// A GET trigger's payload: `key` (6 bytes little-endian), then the address of the bucket
/// to look in (8 bytes big-endian).
pub fn trigger_payload(key: u64, bucket: u64) -> [u8; 14] {
    let mut trigger = [0u8; 14];
    trigger[..6].copy_from_slice(&key.to_le_bytes()[..6]);
    trigger[6..].copy_from_slice(&bucket.to_be_bytes());
    trigger
}

/// A WRITE_ONLY of 8 bytes to QP `qpn` at `at` for a key no domain of the manager's has.
pub fn bad_key_write(qpn: u32, at: u32) -> Header {
    let mut h = Header::new(opcode::WRITE_ONLY, qpn, at);
    h.reth = Some(Reth {
        va: 0x1000,
        rkey: 0xbad,
        len: 8,
    });
    h
}

/// Whether `h` is the manager's request (an offload's answer or its resend), not a reply.
pub fn is_request(h: &Header) -> bool {
    !packet::is_response(h.opcode)
}

/// Whether `h` is an RNR NAK.
pub fn is_rnr(h: &Header) -> bool {
    h.aeth
        .is_some_and(|a| matches!(Syndrome::of(a.syndrome), Syndrome::Rnr(_)))
}

/// Close `tcp` with a reset instead of a FIN (`SO_LINGER` 0).
pub(super) fn reset(tcp: TcpStream) {
    let linger = nix::libc::linger {
        l_onoff: 1,
        l_linger: 0,
    };
    nix::sys::socket::setsockopt(&tcp, nix::sys::socket::sockopt::Linger, &linger).unwrap();
    drop(tcp);
}
