//! RoCEv2 packets: the base and extended transport headers of the RC transport, the ICRC,
//! and the checks every received datagram passes before anything acts on it.
//!
//! A packet here is a UDP payload: BTH, extended headers, payload, pad, ICRC. The IPv4 and
//! UDP headers the ICRC covers are not in our hands on a UDP socket (the kernel writes them
//! and does not hand them back), so both ends rebuild them as the sender's kernel writes them
//! for an unconnected socket with DF set: identification 0, DF, no options
//! (`docs/rocev2.md`, "ICRC"). Field layouts and the ICRC procedure are IBTA's, as summarised
//! in the project's RoCEv2 reference; all multi-byte fields are big-endian except the ICRC,
//! which goes out least-significant byte first.

use std::net::SocketAddrV4;
use std::sync::atomic::{AtomicU64, Ordering};

/// Bytes of the base transport header.
pub const BTH_LEN: usize = 12;
/// Bytes of the ICRC trailer.
pub const ICRC_LEN: usize = 4;
/// The largest path MTU (payload bytes per packet) RoCE has.
pub const MAX_MTU: usize = 4096;
/// Bytes of the largest header stack (BTH + AtomicETH) plus the ICRC: what a datagram
/// buffer needs beyond the MTU.
pub const MAX_OVERHEAD: usize = BTH_LEN + 28 + ICRC_LEN;
/// The default P_Key (full member of the default partition).
pub const DEFAULT_PKEY: u16 = 0xffff;

/// RC opcodes (`include/rdma/ib_pack.h`; RC is transport 000, so the operation is the byte).
pub mod opcode {
    /// SEND_FIRST.
    pub const SEND_FIRST: u8 = 0x00;
    /// SEND_MIDDLE.
    pub const SEND_MIDDLE: u8 = 0x01;
    /// SEND_LAST.
    pub const SEND_LAST: u8 = 0x02;
    /// SEND_LAST_WITH_IMMEDIATE.
    pub const SEND_LAST_IMM: u8 = 0x03;
    /// SEND_ONLY.
    pub const SEND_ONLY: u8 = 0x04;
    /// SEND_ONLY_WITH_IMMEDIATE.
    pub const SEND_ONLY_IMM: u8 = 0x05;
    /// RDMA_WRITE_FIRST.
    pub const WRITE_FIRST: u8 = 0x06;
    /// RDMA_WRITE_MIDDLE.
    pub const WRITE_MIDDLE: u8 = 0x07;
    /// RDMA_WRITE_LAST.
    pub const WRITE_LAST: u8 = 0x08;
    /// RDMA_WRITE_LAST_WITH_IMMEDIATE.
    pub const WRITE_LAST_IMM: u8 = 0x09;
    /// RDMA_WRITE_ONLY.
    pub const WRITE_ONLY: u8 = 0x0a;
    /// RDMA_WRITE_ONLY_WITH_IMMEDIATE.
    pub const WRITE_ONLY_IMM: u8 = 0x0b;
    /// RDMA_READ_REQUEST.
    pub const READ_REQUEST: u8 = 0x0c;
    /// RDMA_READ_RESPONSE_FIRST.
    pub const READ_RESPONSE_FIRST: u8 = 0x0d;
    /// RDMA_READ_RESPONSE_MIDDLE.
    pub const READ_RESPONSE_MIDDLE: u8 = 0x0e;
    /// RDMA_READ_RESPONSE_LAST.
    pub const READ_RESPONSE_LAST: u8 = 0x0f;
    /// RDMA_READ_RESPONSE_ONLY.
    pub const READ_RESPONSE_ONLY: u8 = 0x10;
    /// ACKNOWLEDGE.
    pub const ACKNOWLEDGE: u8 = 0x11;
    /// ATOMIC_ACKNOWLEDGE.
    pub const ATOMIC_ACKNOWLEDGE: u8 = 0x12;
    /// COMPARE_SWAP.
    pub const COMPARE_SWAP: u8 = 0x13;
    /// FETCH_ADD.
    pub const FETCH_ADD: u8 = 0x14;
    /// SEND_LAST_WITH_INVALIDATE (decoded so it can be refused with a NAK).
    pub const SEND_LAST_INV: u8 = 0x16;
    /// SEND_ONLY_WITH_INVALIDATE (decoded so it can be refused with a NAK).
    pub const SEND_ONLY_INV: u8 = 0x17;
}

/// Which extended headers follow the BTH for an opcode, in IBTA order, and whether it may
/// carry a payload.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
struct Layout {
    reth: bool,
    atomic: bool,
    aeth: bool,
    atomic_ack: bool,
    imm: bool,
    ieth: bool,
    payload: bool,
}

impl Layout {
    fn len(self) -> usize {
        BTH_LEN
            + 16 * usize::from(self.reth)
            + 28 * usize::from(self.atomic)
            + 4 * usize::from(self.aeth)
            + 8 * usize::from(self.atomic_ack)
            + 4 * usize::from(self.imm)
            + 4 * usize::from(self.ieth)
    }
}

/// The layout of an RC opcode, or None for anything else (UC, UD, CNP, reserved,
/// manufacturer-specific, FLUSH, ATOMIC_WRITE: none of which an RC softnic speaks).
fn layout(op: u8) -> Option<Layout> {
    use opcode::*;
    let data = Layout {
        payload: true,
        ..Layout::default()
    };
    Some(match op {
        SEND_FIRST | SEND_MIDDLE | SEND_LAST | SEND_ONLY | WRITE_MIDDLE | WRITE_LAST
        | READ_RESPONSE_MIDDLE => data,
        SEND_LAST_IMM | SEND_ONLY_IMM | WRITE_LAST_IMM => Layout { imm: true, ..data },
        SEND_LAST_INV | SEND_ONLY_INV => Layout { ieth: true, ..data },
        WRITE_FIRST | WRITE_ONLY => Layout { reth: true, ..data },
        WRITE_ONLY_IMM => Layout {
            reth: true,
            imm: true,
            ..data
        },
        READ_REQUEST => Layout {
            reth: true,
            ..Layout::default()
        },
        READ_RESPONSE_FIRST | READ_RESPONSE_LAST | READ_RESPONSE_ONLY => {
            Layout { aeth: true, ..data }
        }
        ACKNOWLEDGE => Layout {
            aeth: true,
            ..Layout::default()
        },
        ATOMIC_ACKNOWLEDGE => Layout {
            aeth: true,
            atomic_ack: true,
            ..Layout::default()
        },
        COMPARE_SWAP | FETCH_ADD => Layout {
            atomic: true,
            ..Layout::default()
        },
        _ => return None,
    })
}

/// True for the opcodes a responder sends (READ responses and acknowledgements): these go to
/// the requester side of the QP they name, everything else to its responder side.
#[must_use]
pub fn is_response(op: u8) -> bool {
    (opcode::READ_RESPONSE_FIRST..=opcode::ATOMIC_ACKNOWLEDGE).contains(&op)
}

/// 24-bit packet sequence numbers.
pub mod psn {
    /// The PSN space is 24 bits.
    pub const MASK: u32 = 0x00ff_ffff;

    /// `p + n`, wrapping at 2^24.
    #[must_use]
    pub fn add(p: u32, n: u32) -> u32 {
        p.wrapping_add(n) & MASK
    }

    /// Signed distance from `b` to `a` on the 24-bit circle: positive when `a` is after `b`
    /// (the circle splits into two halves of 2^23, as rxe's `psn_compare` does).
    #[must_use]
    pub fn diff(a: u32, b: u32) -> i32 {
        // The shift puts the 24-bit difference in the top bits, so its sign is the order;
        // the cast reinterprets those bits, which is the point.
        #[allow(clippy::cast_possible_wrap)]
        let d = (a.wrapping_sub(b) << 8) as i32;
        d >> 8
    }
}

/// RDMA extended transport header: the remote buffer of a WRITE or READ.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Reth {
    /// Remote virtual address.
    pub va: u64,
    /// Remote key.
    pub rkey: u32,
    /// Total bytes of the whole message.
    pub len: u32,
}

/// Atomic extended transport header.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct AtomicEth {
    /// Remote virtual address (8-byte aligned).
    pub va: u64,
    /// Remote key.
    pub rkey: u32,
    /// Swap (CMP_SWAP) or add (FETCH_ADD) operand.
    pub swap_add: u64,
    /// Compare operand (CMP_SWAP).
    pub compare: u64,
}

/// ACK extended transport header.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Aeth {
    /// ACK, RNR NAK or NAK, with its code (see [`Syndrome`]).
    pub syndrome: u8,
    /// Message sequence number (24 bits).
    pub msn: u32,
}

/// What an AETH syndrome byte means.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Syndrome {
    /// Positive acknowledgement (any credit code).
    Ack,
    /// Receiver not ready: retry after the timer this code names.
    Rnr(u8),
    /// PSN sequence error: resend from the PSN the NAK carries.
    SequenceError,
    /// Invalid request.
    InvalidRequest,
    /// Remote access error.
    RemoteAccess,
    /// Remote operational error.
    RemoteOperation,
    /// A reserved or unknown code (treated as a remote operational error, as rxe does).
    Reserved,
}

impl Syndrome {
    /// ACK with "no credit information" (what rxe always sends).
    pub const ACK: u8 = 0x1f;
    /// NAK: PSN sequence error.
    pub const NAK_SEQUENCE: u8 = 0x60;
    /// NAK: invalid request.
    pub const NAK_INVALID: u8 = 0x61;
    /// NAK: remote access error.
    pub const NAK_ACCESS: u8 = 0x62;
    /// NAK: remote operational error.
    pub const NAK_OPERATION: u8 = 0x63;

    /// Decode a syndrome byte.
    #[must_use]
    pub fn of(b: u8) -> Syndrome {
        match b >> 5 {
            0 => Syndrome::Ack,
            1 => Syndrome::Rnr(b & 0x1f),
            3 => match b {
                Self::NAK_SEQUENCE => Syndrome::SequenceError,
                Self::NAK_INVALID => Syndrome::InvalidRequest,
                Self::NAK_ACCESS => Syndrome::RemoteAccess,
                Self::NAK_OPERATION => Syndrome::RemoteOperation,
                _ => Syndrome::Reserved,
            },
            _ => Syndrome::Reserved,
        }
    }
}

/// Minimum wait an RNR NAK timer code asks for, in nanoseconds (`enum ib_rnr_timeout`).
#[must_use]
pub fn rnr_delay_ns(code: u8) -> u64 {
    // 10 µs units; code 0 is the longest (655.36 ms).
    const UNITS: [u64; 32] = [
        65536, 1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64, 96, 128, 192, 256, 384, 512, 768, 1024,
        1536, 2048, 3072, 4096, 6144, 8192, 12288, 16384, 24576, 32768, 49152,
    ];
    UNITS[usize::from(code & 31)] * 10_000
}

/// Every header of one packet (what is present for its opcode), without the payload.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Header {
    /// BTH opcode.
    pub opcode: u8,
    /// Solicited event.
    pub solicited: bool,
    /// Destination QP number (24 bits).
    pub dest_qp: u32,
    /// AckReq: the responder must acknowledge this packet.
    pub ack_req: bool,
    /// Packet sequence number (24 bits).
    pub psn: u32,
    /// RETH, on WRITE FIRST/ONLY and READ requests.
    pub reth: Option<Reth>,
    /// AtomicETH, on CMP_SWAP and FETCH_ADD.
    pub atomic: Option<AtomicEth>,
    /// AETH, on ACKs and READ response FIRST/LAST/ONLY.
    pub aeth: Option<Aeth>,
    /// AtomicAckETH: the original remote data.
    pub atomic_ack: Option<u64>,
    /// Immediate data, as the 32-bit big-endian number its four bytes are.
    pub imm: Option<u32>,
    /// IETH: the R_Key to invalidate.
    pub ieth: Option<u32>,
}

impl Header {
    /// A header with only the BTH fields set.
    #[must_use]
    pub fn new(opcode: u8, dest_qp: u32, psn: u32) -> Header {
        Header {
            opcode,
            solicited: false,
            dest_qp,
            ack_req: false,
            psn,
            reth: None,
            atomic: None,
            aeth: None,
            atomic_ack: None,
            imm: None,
            ieth: None,
        }
    }
}

/// A received packet: its headers and a view of its payload (pad removed).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Packet<'a> {
    /// The headers.
    pub header: Header,
    /// The payload bytes.
    pub payload: &'a [u8],
}

/// Why a received datagram was dropped. Each has a counter (see [`DropCounters`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[repr(usize)]
#[non_exhaustive]
pub enum DropReason {
    /// Shorter than its headers and ICRC.
    Truncated = 0,
    /// Not an RC opcode the softnic speaks.
    UnknownOpcode,
    /// BTH transport version not 0.
    BadVersion,
    /// P_Key not the default partition's.
    BadPkey,
    /// Destination QP 0 or 1 (special QPs the softnic does not have).
    SpecialQp,
    /// ICRC mismatch.
    BadIcrc,
    /// Pad count larger than the payload, or pad bytes not zero.
    BadPad,
    /// Payload on an opcode that carries none, or more than the largest MTU.
    BadLength,
    /// No connected QP has this number.
    UnknownQp,
    /// The sender is not the peer this QP is connected to.
    WrongSource,
    /// The QP is in the error state (it answers nothing).
    QpInError,
    /// A request after a PSN gap, already NAKed once.
    OutOfSequence,
    /// A duplicate READ or atomic with no saved resource matching it.
    StaleDuplicate,
    /// A response the requester was not waiting for (old, unexpected or malformed).
    UnexpectedResponse,
    /// The datagram did not fit a receive buffer.
    Oversize,
}

impl DropReason {
    /// Number of reasons.
    pub const COUNT: usize = 15;
    /// Every reason, in counter order.
    pub const ALL: [DropReason; DropReason::COUNT] = [
        DropReason::Truncated,
        DropReason::UnknownOpcode,
        DropReason::BadVersion,
        DropReason::BadPkey,
        DropReason::SpecialQp,
        DropReason::BadIcrc,
        DropReason::BadPad,
        DropReason::BadLength,
        DropReason::UnknownQp,
        DropReason::WrongSource,
        DropReason::QpInError,
        DropReason::OutOfSequence,
        DropReason::StaleDuplicate,
        DropReason::UnexpectedResponse,
        DropReason::Oversize,
    ];

    /// A short name for tables and logs.
    #[must_use]
    pub fn name(self) -> &'static str {
        match self {
            DropReason::Truncated => "truncated",
            DropReason::UnknownOpcode => "unknown_opcode",
            DropReason::BadVersion => "bad_version",
            DropReason::BadPkey => "bad_pkey",
            DropReason::SpecialQp => "special_qp",
            DropReason::BadIcrc => "bad_icrc",
            DropReason::BadPad => "bad_pad",
            DropReason::BadLength => "bad_length",
            DropReason::UnknownQp => "unknown_qp",
            DropReason::WrongSource => "wrong_source",
            DropReason::QpInError => "qp_in_error",
            DropReason::OutOfSequence => "out_of_sequence",
            DropReason::StaleDuplicate => "stale_duplicate",
            DropReason::UnexpectedResponse => "unexpected_response",
            DropReason::Oversize => "oversize",
        }
    }
}

/// Dropped datagrams, counted per reason.
#[derive(Debug, Default)]
pub struct DropCounters([AtomicU64; DropReason::COUNT]);

impl DropCounters {
    /// Count one drop.
    pub fn count(&self, why: DropReason) {
        self.0[why as usize].fetch_add(1, Ordering::Relaxed);
    }

    /// Count `n` drops at once.
    pub fn add(&self, why: DropReason, n: u64) {
        self.0[why as usize].fetch_add(n, Ordering::Relaxed);
    }

    /// Drops for one reason so far.
    #[must_use]
    pub fn get(&self, why: DropReason) -> u64 {
        self.0[why as usize].load(Ordering::Relaxed)
    }

    /// Every reason with its count.
    #[must_use]
    pub fn snapshot(&self) -> Vec<(DropReason, u64)> {
        DropReason::ALL.iter().map(|&d| (d, self.get(d))).collect()
    }

    /// All drops.
    #[must_use]
    pub fn total(&self) -> u64 {
        self.0.iter().map(|c| c.load(Ordering::Relaxed)).sum()
    }
}

/// The two ends of a datagram: what the ICRC's IP and UDP headers hold.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Route {
    /// Sender's address and UDP port.
    pub src: SocketAddrV4,
    /// Receiver's address and UDP port.
    pub dst: SocketAddrV4,
}

/// The IPv4 and UDP headers the sender's kernel writes for a UDP payload of `udp_payload`
/// bytes on an unconnected socket with DF set: identification 0, DF, TTL and TOS as they may
/// be (masked out of the ICRC anyway), checksums left for the ICRC's masking.
fn pseudo_headers(route: &Route, udp_payload: usize) -> ([u8; 20], [u8; 8]) {
    // Callers bound payloads by MAX_MTU + MAX_OVERHEAD, far below 64 KiB.
    let udp_len = u16::try_from(udp_payload + 8).unwrap_or(u16::MAX);
    let total = udp_len.saturating_add(20);
    let mut ip = [0u8; 20];
    ip[0] = 0x45;
    ip[2..4].copy_from_slice(&total.to_be_bytes());
    // Identification 0 (bytes 4-5); flags DF, fragment offset 0.
    ip[6] = 0x40;
    ip[8] = 64;
    ip[9] = 17;
    ip[12..16].copy_from_slice(&route.src.ip().octets());
    ip[16..20].copy_from_slice(&route.dst.ip().octets());
    let mut udp = [0u8; 8];
    udp[0..2].copy_from_slice(&route.src.port().to_be_bytes());
    udp[2..4].copy_from_slice(&route.dst.port().to_be_bytes());
    udp[4..6].copy_from_slice(&udp_len.to_be_bytes());
    (ip, udp)
}

/// The ICRC of a packet given the IPv4 and UDP headers as they go on the wire and the UDP
/// payload up to (not including) the ICRC: CRC-32 over 8 bytes of 0xFF (the absent LRH), the
/// headers with TOS, TTL, IP checksum, UDP checksum and BTH byte 4 set to all ones, then the
/// transport headers, payload and pad as sent.
#[must_use]
pub fn icrc_ipv4(ip: &[u8; 20], udp: &[u8; 8], body: &[u8]) -> u32 {
    // The masked headers and the BTH's first five bytes in one buffer, then the rest of the
    // body: two CRC updates, not six (each update of a few bytes costs its own set-up,
    // and a 64 B packet's whole ICRC is a few of them).
    // Eight 0xff bytes for the LRH, then the IPv4 header with TOS, TTL and checksum masked,
    // the UDP header with its checksum masked, and the BTH with its reserved byte masked.
    let mut head = [0u8; 8 + 20 + 8 + 5];
    head[..8].fill(0xff);
    head[8..28].copy_from_slice(ip);
    head[28..36].copy_from_slice(udp);
    for at in [8 + 1, 8 + 8, 8 + 10, 8 + 11, 28 + 6, 28 + 7] {
        head[at] = 0xff;
    }
    let mut h = crc32fast::Hasher::new();
    if body.len() > 4 {
        head[36..40].copy_from_slice(&body[..4]);
        head[40] = 0xff;
        h.update(&head);
        h.update(&body[5..]);
    } else {
        h.update(&head[..36]);
        h.update(body);
    }
    h.finalize()
}

#[inline(always)]
fn be32(b: &[u8], at: usize) -> u32 {
    u32::from_be_bytes([b[at], b[at + 1], b[at + 2], b[at + 3]])
}

#[inline(always)]
fn be64(b: &[u8], at: usize) -> u64 {
    (u64::from(be32(b, at)) << 32) | u64::from(be32(b, at + 4))
}

/// Decode and check a received UDP payload that came over `route`. Every field the
/// softnic acts on is checked here or by the QP that receives it (PSN, MTU, keys, bounds);
/// a datagram that fails gets the reason it is dropped for.
pub fn decode<'a>(route: &Route, datagram: &'a [u8]) -> Result<Packet<'a>, DropReason> {
    let (ip, udp) = pseudo_headers(route, datagram.len());
    decode_with(&ip, &udp, datagram)
}

/// [`decode`] against IPv4 and UDP headers as they were on the wire (for captured frames).
pub fn decode_with<'a>(
    ip: &[u8; 20],
    udp: &[u8; 8],
    d: &'a [u8],
) -> Result<Packet<'a>, DropReason> {
    if d.len() < BTH_LEN + ICRC_LEN {
        return Err(DropReason::Truncated);
    }
    if d.len() > MAX_MTU + MAX_OVERHEAD {
        return Err(DropReason::Oversize);
    }
    let op = d[0];
    let lay = layout(op).ok_or(DropReason::UnknownOpcode)?;
    if d[1] & 0x0f != 0 {
        return Err(DropReason::BadVersion);
    }
    let pkey = u16::from_be_bytes([d[2], d[3]]);
    // Same partition (low 15 bits) as the default full-member key; a limited member may
    // talk to a full one.
    if pkey & 0x7fff != DEFAULT_PKEY & 0x7fff {
        return Err(DropReason::BadPkey);
    }
    let dest_qp = be32(d, 4) & psn::MASK;
    if dest_qp <= 1 {
        return Err(DropReason::SpecialQp);
    }
    let hdr_len = lay.len();
    if d.len() < hdr_len + ICRC_LEN {
        return Err(DropReason::Truncated);
    }
    let body_end = d.len() - ICRC_LEN;
    let wire_icrc = u32::from_le_bytes([
        d[body_end],
        d[body_end + 1],
        d[body_end + 2],
        d[body_end + 3],
    ]);
    if icrc_ipv4(ip, udp, &d[..body_end]) != wire_icrc {
        return Err(DropReason::BadIcrc);
    }
    let pad = usize::from((d[1] >> 4) & 3);
    let with_pad = body_end - hdr_len;
    if pad > with_pad || d[body_end - pad..body_end].iter().any(|&b| b != 0) {
        return Err(DropReason::BadPad);
    }
    let payload = &d[hdr_len..body_end - pad];
    if !lay.payload && with_pad != 0 || payload.len() > MAX_MTU {
        return Err(DropReason::BadLength);
    }
    let mut h = Header::new(op, dest_qp, be32(d, 8) & psn::MASK);
    h.solicited = d[1] & 0x80 != 0;
    h.ack_req = d[8] & 0x80 != 0;
    let mut at = BTH_LEN;
    if lay.reth {
        h.reth = Some(Reth {
            va: be64(d, at),
            rkey: be32(d, at + 8),
            len: be32(d, at + 12),
        });
        at += 16;
    }
    if lay.atomic {
        h.atomic = Some(AtomicEth {
            va: be64(d, at),
            rkey: be32(d, at + 8),
            swap_add: be64(d, at + 12),
            compare: be64(d, at + 20),
        });
        at += 28;
    }
    if lay.aeth {
        h.aeth = Some(Aeth {
            syndrome: d[at],
            msn: be32(d, at) & psn::MASK,
        });
        at += 4;
    }
    if lay.atomic_ack {
        h.atomic_ack = Some(be64(d, at));
        at += 8;
    }
    if lay.imm {
        h.imm = Some(be32(d, at));
        at += 4;
    }
    if lay.ieth {
        h.ieth = Some(be32(d, at));
    }
    Ok(Packet { header: h, payload })
}

/// Append the UDP payload of one packet (headers, payload, pad, ICRC) to `out`, addressed
/// over `route`. The header fields that do not belong to `h.opcode` are not written; those
/// it needs and lacks are written as zero.
pub fn encode(out: &mut Vec<u8>, route: &Route, h: &Header, payload: &[u8]) {
    let lay = layout(h.opcode).unwrap_or_default();
    let start = out.len();
    let pad = payload.len().wrapping_neg() & 3;
    out.push(h.opcode);
    // Pad is 0..=3 by the mask above.
    #[allow(clippy::cast_possible_truncation)]
    out.push(u8::from(h.solicited) << 7 | (pad as u8) << 4);
    out.extend_from_slice(&DEFAULT_PKEY.to_be_bytes());
    out.extend_from_slice(&(h.dest_qp & psn::MASK).to_be_bytes());
    out.extend_from_slice(&((u32::from(h.ack_req) << 31) | (h.psn & psn::MASK)).to_be_bytes());
    if lay.reth {
        let r = h.reth.unwrap_or(Reth {
            va: 0,
            rkey: 0,
            len: 0,
        });
        out.extend_from_slice(&r.va.to_be_bytes());
        out.extend_from_slice(&r.rkey.to_be_bytes());
        out.extend_from_slice(&r.len.to_be_bytes());
    }
    if lay.atomic {
        let a = h.atomic.unwrap_or(AtomicEth {
            va: 0,
            rkey: 0,
            swap_add: 0,
            compare: 0,
        });
        out.extend_from_slice(&a.va.to_be_bytes());
        out.extend_from_slice(&a.rkey.to_be_bytes());
        out.extend_from_slice(&a.swap_add.to_be_bytes());
        out.extend_from_slice(&a.compare.to_be_bytes());
    }
    if lay.aeth {
        let a = h.aeth.unwrap_or(Aeth {
            syndrome: Syndrome::ACK,
            msn: 0,
        });
        out.extend_from_slice(&((u32::from(a.syndrome) << 24) | (a.msn & psn::MASK)).to_be_bytes());
    }
    if lay.atomic_ack {
        out.extend_from_slice(&h.atomic_ack.unwrap_or(0).to_be_bytes());
    }
    if lay.imm {
        out.extend_from_slice(&h.imm.unwrap_or(0).to_be_bytes());
    }
    if lay.ieth {
        out.extend_from_slice(&h.ieth.unwrap_or(0).to_be_bytes());
    }
    out.extend_from_slice(payload);
    out.extend_from_slice(&[0u8; 3][..pad]);
    let body_len = out.len() - start;
    let (ip, udp) = pseudo_headers(route, body_len + ICRC_LEN);
    let crc = icrc_ipv4(&ip, &udp, &out[start..]);
    out.extend_from_slice(&crc.to_le_bytes());
}

#[cfg(test)]
mod tests;
