//! The out-of-band connection exchange: one fixed binary record per side over TCP, carrying
//! what RC needs to connect (QP number, start PSN, address, UDP port, MTU, read depths,
//! timers) and the remote regions a program uses (name, address, R_Key, length). The format
//! is in `docs/rocev2.md`, written so that a libibverbs client can implement it.
//!
//! The client writes its record first; the server reads it and answers with its own (as
//! `ibv_rc_pingpong` orders its exchange).

use std::io::{Read, Write};
use std::net::{Ipv4Addr, SocketAddrV4, TcpStream};
use std::time::{Duration, Instant};

/// The record's first bytes.
pub const MAGIC: [u8; 4] = *b"RDNX";
/// The format version this code writes and reads.
pub const VERSION: u8 = 1;
/// Bytes before the regions.
pub const HEADER_LEN: usize = 32;
/// Bytes of one region entry.
pub const REGION_LEN: usize = 40;
/// Regions one record may carry.
pub const MAX_REGIONS: usize = 64;
/// Bytes of a region's name field (UTF-8, zero-padded).
pub const NAME_LEN: usize = 16;

/// Why an exchange failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ExchangeError {
    /// Reading or writing the TCP stream failed (or timed out).
    #[error("connection exchange I/O failed")]
    Io(#[from] std::io::Error),
    /// The peer's record does not start with "RDNX".
    #[error("not a connection record (magic {0:02x?})")]
    BadMagic([u8; 4]),
    /// The peer speaks another version of the format.
    #[error("record version {0}, this side speaks {VERSION}")]
    Version(u8),
    /// A field is out of range.
    #[error("record field {field}: {detail}")]
    Field {
        /// The field.
        field: &'static str,
        /// What is wrong with it.
        detail: String,
    },
}

/// One remote region a program may use.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RegionRecord {
    /// Name the program knows it by (at most 16 bytes of UTF-8).
    pub name: String,
    /// Address of its first byte.
    pub addr: u64,
    /// Remote key.
    pub rkey: u32,
    /// Length in bytes.
    pub len: u64,
    /// Remote rights: bit 0 READ, bit 1 WRITE, bit 2 ATOMIC.
    pub rights: u32,
}

/// One side's connection record.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct QpRecord {
    /// QP number (24 bits).
    pub qpn: u32,
    /// The PSN this side's requests start at (24 bits): the peer's expected PSN.
    pub psn: u32,
    /// IPv4 address and UDP port this side sends from and receives at.
    pub addr: SocketAddrV4,
    /// Path MTU in bytes (256, 512, 1024, 2048 or 4096); both sides use the smaller.
    pub mtu: u16,
    /// READs and atomics this side keeps outstanding as requester.
    pub max_rd_atomic: u8,
    /// READs and atomics this side keeps replay state for as responder.
    pub max_dest_rd_atomic: u8,
    /// Local ACK timeout code (4.096 µs × 2^code; 0 none).
    pub timeout: u8,
    /// Retries after timeouts and sequence NAKs (0..=7).
    pub retry_cnt: u8,
    /// Retries after RNR NAKs (0..=7, 7 infinite).
    pub rnr_retry: u8,
    /// RNR timer code this side puts in its RNR NAKs.
    pub min_rnr_timer: u8,
    /// Regions the peer may use.
    pub regions: Vec<RegionRecord>,
}

impl QpRecord {
    /// A record with the defaults: MTU 4096, depth 16/16, timeout 14 (67 ms), retry 7,
    /// RNR retry 7, RNR timer 1 (10 µs), no regions.
    #[must_use]
    pub fn new(qpn: u32, psn: u32, addr: SocketAddrV4) -> QpRecord {
        QpRecord {
            qpn,
            psn: psn & 0xff_ffff,
            addr,
            mtu: 4096,
            max_rd_atomic: 16,
            max_dest_rd_atomic: 16,
            timeout: 14,
            retry_cnt: 7,
            rnr_retry: 7,
            min_rnr_timer: 1,
            regions: Vec::new(),
        }
    }

    /// The region called `name`.
    #[must_use]
    pub fn region(&self, name: &str) -> Option<&RegionRecord> {
        self.regions.iter().find(|r| r.name == name)
    }

    /// The record's bytes.
    ///
    /// # Errors
    /// A field out of range (more than 64 regions, a name over 16 bytes, a QPN or PSN over
    /// 24 bits, an MTU IB does not have).
    pub fn encode(&self) -> Result<Vec<u8>, ExchangeError> {
        self.check()?;
        let mut b = Vec::with_capacity(HEADER_LEN + REGION_LEN * self.regions.len());
        b.extend_from_slice(&MAGIC);
        b.push(VERSION);
        b.push(0);
        // check() bounds the count by MAX_REGIONS.
        b.extend_from_slice(&u16::try_from(self.regions.len()).unwrap_or(0).to_be_bytes());
        b.extend_from_slice(&self.qpn.to_be_bytes());
        b.extend_from_slice(&self.psn.to_be_bytes());
        b.extend_from_slice(&self.addr.ip().octets());
        b.extend_from_slice(&self.addr.port().to_be_bytes());
        b.extend_from_slice(&self.mtu.to_be_bytes());
        b.extend_from_slice(&[
            self.max_rd_atomic,
            self.max_dest_rd_atomic,
            self.timeout,
            self.retry_cnt,
            self.rnr_retry,
            self.min_rnr_timer,
            0,
            0,
        ]);
        for r in &self.regions {
            let mut name = [0u8; NAME_LEN];
            name[..r.name.len()].copy_from_slice(r.name.as_bytes());
            b.extend_from_slice(&name);
            b.extend_from_slice(&r.addr.to_be_bytes());
            b.extend_from_slice(&r.rkey.to_be_bytes());
            b.extend_from_slice(&r.len.to_be_bytes());
            b.extend_from_slice(&r.rights.to_be_bytes());
        }
        Ok(b)
    }

    fn check(&self) -> Result<(), ExchangeError> {
        let bad = |field, detail: String| Err(ExchangeError::Field { field, detail });
        if self.qpn > 0xff_ffff || self.qpn <= 1 {
            return bad(
                "qpn",
                format!("{:#x} is not a 24-bit QP number above 1", self.qpn),
            );
        }
        if self.psn > 0xff_ffff {
            return bad("psn", format!("{:#x} is over 24 bits", self.psn));
        }
        if !matches!(self.mtu, 256 | 512 | 1024 | 2048 | 4096) {
            return bad(
                "mtu",
                format!("{} is not 256, 512, 1024, 2048 or 4096", self.mtu),
            );
        }
        if self.addr.ip().is_unspecified() || self.addr.port() == 0 {
            return bad(
                "addr",
                format!("{} is not an address to send to", self.addr),
            );
        }
        for (f, v, max) in [
            ("timeout", self.timeout, 31),
            ("retry_cnt", self.retry_cnt, 7),
            ("rnr_retry", self.rnr_retry, 7),
            ("min_rnr_timer", self.min_rnr_timer, 31),
        ] {
            if v > max {
                return bad(f, format!("{v} is over {max}"));
            }
        }
        if self.regions.len() > MAX_REGIONS {
            return bad(
                "regions",
                format!("{} is over {MAX_REGIONS}", self.regions.len()),
            );
        }
        for r in &self.regions {
            if r.name.len() > NAME_LEN || r.name.contains('\0') {
                return bad(
                    "region name",
                    format!("{:?} is over {NAME_LEN} bytes or has a NUL", r.name),
                );
            }
        }
        Ok(())
    }

    /// Parse and check a record.
    ///
    /// # Errors
    /// A short, foreign or out-of-range record, naming the field.
    pub fn decode(b: &[u8]) -> Result<QpRecord, ExchangeError> {
        let short = |what: &str| ExchangeError::Field {
            field: "length",
            detail: format!("{} bytes, {what}", b.len()),
        };
        if b.len() < HEADER_LEN {
            return Err(short("shorter than the 32-byte header"));
        }
        let magic: [u8; 4] = [b[0], b[1], b[2], b[3]];
        if magic != MAGIC {
            return Err(ExchangeError::BadMagic(magic));
        }
        if b[4] != VERSION {
            return Err(ExchangeError::Version(b[4]));
        }
        let n = usize::from(u16::from_be_bytes([b[6], b[7]]));
        if n > MAX_REGIONS {
            return Err(ExchangeError::Field {
                field: "regions",
                detail: format!("{n} is over {MAX_REGIONS}"),
            });
        }
        if b.len() != HEADER_LEN + n * REGION_LEN {
            return Err(short("not the header and its regions"));
        }
        let be32 = |at: usize| u32::from_be_bytes([b[at], b[at + 1], b[at + 2], b[at + 3]]);
        let be64 = |at: usize| (u64::from(be32(at)) << 32) | u64::from(be32(at + 4));
        let mut regions = Vec::with_capacity(n);
        for i in 0..n {
            let at = HEADER_LEN + i * REGION_LEN;
            let raw = &b[at..at + NAME_LEN];
            let end = raw.iter().position(|&c| c == 0).unwrap_or(NAME_LEN);
            if raw[end..].iter().any(|&c| c != 0) {
                return Err(ExchangeError::Field {
                    field: "region name",
                    detail: "bytes after its NUL padding".into(),
                });
            }
            let name = std::str::from_utf8(&raw[..end])
                .map_err(|_| ExchangeError::Field {
                    field: "region name",
                    detail: "not UTF-8".into(),
                })?
                .to_owned();
            regions.push(RegionRecord {
                name,
                addr: be64(at + 16),
                rkey: be32(at + 24),
                len: be64(at + 28),
                rights: be32(at + 36),
            });
        }
        let r = QpRecord {
            qpn: be32(8),
            psn: be32(12),
            addr: SocketAddrV4::new(
                Ipv4Addr::new(b[16], b[17], b[18], b[19]),
                u16::from_be_bytes([b[20], b[21]]),
            ),
            mtu: u16::from_be_bytes([b[22], b[23]]),
            max_rd_atomic: b[24],
            max_dest_rd_atomic: b[25],
            timeout: b[26],
            retry_cnt: b[27],
            rnr_retry: b[28],
            min_rnr_timer: b[29],
            regions,
        };
        r.check()?;
        Ok(r)
    }
}

/// Read one record from `s` (its read timeout applies): the fixed header first, so a
/// foreign or oversized count is refused before anything is sized from it.
///
/// # Errors
/// I/O, or a record that does not check.
pub fn read_record(s: &mut impl Read) -> Result<QpRecord, ExchangeError> {
    let mut head = [0u8; HEADER_LEN];
    s.read_exact(&mut head)?;
    // Check the fixed part before trusting its count to size a read.
    if head[..4] != MAGIC {
        return Err(ExchangeError::BadMagic([
            head[0], head[1], head[2], head[3],
        ]));
    }
    let n = usize::from(u16::from_be_bytes([head[6], head[7]]));
    if n > MAX_REGIONS {
        return Err(ExchangeError::Field {
            field: "regions",
            detail: format!("{n} is over {MAX_REGIONS}"),
        });
    }
    let mut all = head.to_vec();
    all.resize(HEADER_LEN + n * REGION_LEN, 0);
    s.read_exact(&mut all[HEADER_LEN..])?;
    QpRecord::decode(&all)
}

/// Write one record to `s`.
///
/// # Errors
/// I/O, or a record with a field out of range.
pub fn write_record(s: &mut impl Write, r: &QpRecord) -> Result<(), ExchangeError> {
    s.write_all(&r.encode()?)?;
    Ok(())
}

/// Reads from a stream until a deadline, however the bytes are spread out: each read waits
/// only for what is left (a read timeout alone restarts with every byte a peer trickles).
struct Deadline<'a> {
    s: &'a TcpStream,
    at: Option<Instant>,
}

impl<'a> Deadline<'a> {
    /// `timeout` from now (no deadline if the clock cannot count that far).
    fn after(s: &'a TcpStream, timeout: Duration) -> Deadline<'a> {
        Deadline {
            s,
            at: Instant::now().checked_add(timeout),
        }
    }
}

impl Read for Deadline<'_> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        if let Some(at) = self.at {
            let left = at.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Err(std::io::Error::new(
                    std::io::ErrorKind::TimedOut,
                    "the peer's record did not come in time",
                ));
            }
            self.s.set_read_timeout(Some(left))?;
        }
        let mut s = self.s;
        s.read(buf)
    }
}

/// The client's side: send `ours`, then read and return the server's record. Waits at most
/// `timeout` for the whole record.
///
/// # Errors
/// I/O, or a record that does not check.
pub fn exchange_client(
    s: &mut TcpStream,
    ours: &QpRecord,
    timeout: Duration,
) -> Result<QpRecord, ExchangeError> {
    let at = Instant::now().checked_add(timeout);
    write_record(s, ours)?;
    read_record(&mut Deadline { s, at })
}

/// The server's side: read the client's record, then send `ours` (made with the client's
/// record in hand, e.g. after creating a QP for it).
///
/// # Errors
/// I/O, or a record that does not check.
pub fn exchange_server(
    s: &mut TcpStream,
    timeout: Duration,
    ours: impl FnOnce(&QpRecord) -> QpRecord,
) -> Result<(QpRecord, QpRecord), ExchangeError> {
    let theirs = read_record(&mut Deadline::after(s, timeout))?;
    let mine = ours(&theirs);
    write_record(s, &mine)?;
    Ok((theirs, mine))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::TcpListener;

    fn sample() -> QpRecord {
        let mut r = QpRecord::new(
            0x12,
            0xabcdef,
            SocketAddrV4::new(Ipv4Addr::new(10, 0, 0, 1), 4791),
        );
        r.regions.push(RegionRecord {
            name: "table".into(),
            addr: 0x7f00_0000_1000,
            rkey: 0x1234,
            len: 4096,
            rights: 3,
        });
        r
    }

    #[test]
    fn the_record_has_its_documented_bytes() {
        let b = sample().encode().unwrap();
        assert_eq!(b.len(), 72);
        assert_eq!(&b[..8], b"RDNX\x01\x00\x00\x01");
        assert_eq!(&b[8..16], &[0, 0, 0, 0x12, 0, 0xab, 0xcd, 0xef]);
        assert_eq!(&b[16..24], &[10, 0, 0, 1, 0x12, 0xb7, 0x10, 0x00]);
        assert_eq!(&b[24..32], &[16, 16, 14, 7, 7, 1, 0, 0]);
        assert_eq!(&b[32..37], b"table");
        assert_eq!(&b[48..56], &0x7f00_0000_1000u64.to_be_bytes());
        assert_eq!(&b[56..60], &[0, 0, 0x12, 0x34]);
        assert_eq!(QpRecord::decode(&b).unwrap(), sample());
    }

    #[test]
    fn bad_records_name_what_is_wrong() {
        let good = sample().encode().unwrap();
        let mut b = good.clone();
        b[0] = b'X';
        assert!(matches!(
            QpRecord::decode(&b),
            Err(ExchangeError::BadMagic(_))
        ));
        let mut b = good.clone();
        b[4] = 2;
        assert!(matches!(
            QpRecord::decode(&b),
            Err(ExchangeError::Version(2))
        ));
        let mut b = good.clone();
        b[23] = 0x01; // MTU 4097
        assert!(matches!(
            QpRecord::decode(&b),
            Err(ExchangeError::Field { field: "mtu", .. })
        ));
        let mut b = good.clone();
        b[8] = 1; // QPN over 24 bits
        assert!(matches!(
            QpRecord::decode(&b),
            Err(ExchangeError::Field { field: "qpn", .. })
        ));
        assert!(matches!(
            QpRecord::decode(&good[..40]),
            Err(ExchangeError::Field {
                field: "length",
                ..
            })
        ));
        let mut b = good.clone();
        b[7] = 65;
        assert!(matches!(
            QpRecord::decode(&b),
            Err(ExchangeError::Field {
                field: "regions",
                ..
            })
        ));
        let mut b = good;
        b[40] = b'!'; // after the name's NUL
        assert!(matches!(
            QpRecord::decode(&b),
            Err(ExchangeError::Field {
                field: "region name",
                ..
            })
        ));
        let mut r = sample();
        r.regions[0].name = "a name too long for it".into();
        assert!(r.encode().is_err());
    }

    #[test]
    fn both_sides_exchange_over_tcp() {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let at = l.local_addr().unwrap();
        let server = std::thread::spawn(move || {
            let (mut s, _) = l.accept().unwrap();
            exchange_server(&mut s, Duration::from_secs(10), |theirs| {
                let mut mine = QpRecord::new(
                    theirs.qpn + 1,
                    7,
                    SocketAddrV4::new(Ipv4Addr::LOCALHOST, 4792),
                );
                mine.mtu = 1024;
                mine
            })
            .unwrap()
        });
        let mut c = TcpStream::connect(at).unwrap();
        let theirs = exchange_client(&mut c, &sample(), Duration::from_secs(10)).unwrap();
        let (seen, mine) = server.join().unwrap();
        assert_eq!(seen, sample());
        assert_eq!(theirs, mine);
        assert_eq!((theirs.qpn, theirs.mtu), (0x13, 1024));
    }
}
