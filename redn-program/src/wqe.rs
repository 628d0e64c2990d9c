//! Byte-exact mlx5 work-queue entries (WQEs) and completion entries (CQEs).
//!
//! Pure data: no FFI, no device. The softnic executes exactly these bytes out of ring memory and
//! the mlx5 backend writes them into a ConnectX send queue, so one encoder serves both.
//!
//! Layout facts (all multi-byte fields big-endian, segments 16 bytes, WQEs occupy whole 64-byte
//! basic blocks):
//!
//! | WQE bytes | segment |
//! |---|---|
//! | 0..16 | control: opmod, wqe index, opcode, QPN (24 bit), ds, signature, fm_ce_se, imm |
//! | 16..32 | remote address (READ/WRITE/atomics) or wait/enable (WAIT, SEND_EN, RECV_EN) |
//! | 32..48 | atomic operands (CAS swap @32, compare @40; FAA addend @32) |
//! | then | data segments (byte_count, lkey, addr) or one inline segment |

use crate::endian::{Be16, Be32, Be64};
use crate::types::{Cqn, Lkey, Qpn, Rkey, VirtAddr, MAX_QPN};
use std::fmt;

/// Size of a send-queue basic block: every WQE starts on one and occupies whole ones.
pub const BB_SIZE: usize = 64;
/// Size of every WQE segment; `ds` counts these.
pub const SEG_SIZE: usize = 16;
/// The ds field has six usable bits.
pub const MAX_DS: u8 = 63;
/// The largest WQE: 63 segments round up to 16 basic blocks.
pub const MAX_WQE_BBS: usize = 16;
/// The largest WQE in bytes (whole basic blocks).
pub const MAX_WQE_BYTES: usize = MAX_WQE_BBS * BB_SIZE;
/// Terminates a receive WQE's scatter list when fewer than the slot's entries are used.
pub const INVALID_LKEY: u32 = 0x100;
/// Size of a completion entry.
pub const CQE_SIZE: usize = 64;
/// Set in an inline segment's header to tell it from a data segment.
pub const INLINE_FLAG: u32 = 0x8000_0000;
/// opmod for 8-byte extended (masked) atomics: `0x08 | (log2(8) - 2)`.
pub const OPMOD_EXT_ATOMIC_8B: u8 = 0x09;

/// The control segment's `wqe_index` for the WQE at producer index `pi`: the index mod 2^16,
/// as mlx5 counts it (rings keep 64-bit indices that only grow).
#[inline(always)]
#[must_use]
pub const fn wqe_index(pi: u64) -> u16 {
    (pi & 0xffff) as u16
}

/// Byte offsets inside a WQE of the fields that programs patch and the executor reads.
pub mod off {
    /// ctrl: opcode modifier.
    pub const OPMOD: usize = 0;
    /// ctrl: wqe index (BE16, producer counter mod 2^16).
    pub const WQE_INDEX: usize = 1;
    /// ctrl: opcode.
    pub const OPCODE: usize = 3;
    /// ctrl: QP number (24-bit BE).
    pub const QPN: usize = 4;
    /// ctrl: ds, WQE size in 16-byte units.
    pub const DS: usize = 7;
    /// ctrl: signature.
    pub const SIGNATURE: usize = 8;
    /// ctrl: fence / completion / solicited flags.
    pub const FM_CE_SE: usize = 11;
    /// ctrl: immediate data (raw, as it goes on the wire).
    pub const IMM: usize = 12;
    /// remote-address segment: remote address (BE64).
    pub const RADDR: usize = 16;
    /// remote-address segment: rkey (BE32).
    pub const RKEY: usize = 24;
    /// remote-address segment: reserved, zero.
    pub const RADDR_RESERVED: usize = 28;
    /// atomic segment: swap value (CAS) or addend (FAA), BE64.
    pub const SWAP_ADD: usize = 32;
    /// atomic segment: compare value (CAS), BE64.
    pub const COMPARE: usize = 40;
    /// wait/enable segment: reserved, zero (8 bytes).
    pub const WAIT_RESERVED: usize = 16;
    /// wait/enable segment: absolute count `pi` (BE32).
    pub const WAIT_PI: usize = 24;
    /// wait/enable segment: object number, a CQN or QPN (BE32).
    pub const WAIT_OBJ: usize = 28;
    /// data segment: byte count, relative to the segment.
    pub const SEG_BYTE_COUNT: usize = 0;
    /// data segment: lkey, relative to the segment.
    pub const SEG_LKEY: usize = 4;
    /// data segment: address, relative to the segment.
    pub const SEG_ADDR: usize = 8;
}

/// WQE flags in control byte 11 (`fm_ce_se`).
#[derive(Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct WqeFlags(pub u8);

impl WqeFlags {
    /// No completion, no fence.
    pub const NONE: WqeFlags = WqeFlags(0);
    /// Solicited event (`MLX5_WQE_CTRL_SOLICITED`).
    pub const SOLICITED: WqeFlags = WqeFlags(0x02);
    /// Generate a CQE when done (`MLX5_WQE_CTRL_CQ_UPDATE`): a "signaled" WQE.
    pub const SIGNALED: WqeFlags = WqeFlags(0x08);
    /// Initiator small fence.
    pub const INITIATOR_SMALL_FENCE: WqeFlags = WqeFlags(0x20);
    /// Strong ordering.
    pub const STRONG_ORDERING: WqeFlags = WqeFlags(0x60);
    /// Small-and-fence: wait for earlier READs and atomics on this queue (`IBV_SEND_FENCE`).
    pub const FENCE: WqeFlags = WqeFlags(0x80);

    /// True if a CQE is generated on success: completion mode (bits 3:2) 2, "CQE always"
    /// (`MLX5_WQE_CTRL_CQ_UPDATE`), or 3, "CQE and EQE" (`MLX5_WQE_CTRL_CQ_UPDATE_AND_EQE`),
    /// which writes the same CQE and also raises an event.
    #[must_use]
    pub const fn signaled(self) -> bool {
        self.0 & 0x08 != 0
    }

    /// The fence mode bits (7:5), nonzero if the WQE waits for earlier READs/atomics.
    pub const fn fence_mode(self) -> u8 {
        self.0 >> 5
    }

    /// True if the WQE waits for earlier RDMA READs and atomics of its queue to have landed
    /// before it runs: fence mode FENCE (2) or SMALL_AND_FENCE (4, what libmlx5 sets for
    /// `IBV_SEND_FENCE`), the kernel's `MLX5_FENCE_MODE_*`. Initiator-small (1) and strong
    /// ordering (3) do not count: no public source says they order against READ responses,
    /// so the stricter case is modelled.
    #[must_use]
    pub const fn waits_for_responses(self) -> bool {
        matches!(self.0 >> 5, 2 | 4)
    }

    /// Both flag sets together.
    #[must_use]
    pub const fn with(self, other: WqeFlags) -> WqeFlags {
        WqeFlags(self.0 | other.0)
    }
}

impl std::ops::BitOr for WqeFlags {
    type Output = WqeFlags;
    fn bitor(self, rhs: WqeFlags) -> WqeFlags {
        self.with(rhs)
    }
}

impl fmt::Debug for WqeFlags {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "WqeFlags({:#04x})", self.0)
    }
}

/// mlx5 send opcodes (control byte 3).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum Opcode {
    /// Does nothing; RedN's `if` turns one into a WRITE.
    Nop = 0x00,
    /// RDMA WRITE.
    RdmaWrite = 0x08,
    /// RDMA WRITE with immediate: consumes a receive at the peer.
    RdmaWriteImm = 0x09,
    /// SEND.
    Send = 0x0a,
    /// SEND with immediate.
    SendImm = 0x0b,
    /// CQE_WAIT: block this queue until a CQ has produced more than `pi` completions.
    Wait = 0x0f,
    /// RDMA READ.
    RdmaRead = 0x10,
    /// 64-bit compare and swap.
    AtomicCs = 0x11,
    /// 64-bit fetch and add.
    AtomicFa = 0x12,
    /// Masked compare and swap (extended atomic).
    AtomicMaskedCs = 0x14,
    /// Masked fetch and add (extended atomic, field boundaries stop carries).
    AtomicMaskedFa = 0x15,
    /// RECV_EN: let a managed receive queue consume receives up to `pi`.
    RecvEn = 0x16,
    /// SEND_EN: let a managed send queue fetch and run WQEs up to `pi`.
    SendEn = 0x17,
}

impl Opcode {
    /// Every opcode this crate encodes and the softnic executes.
    pub const ALL: [Opcode; 13] = [
        Opcode::Nop,
        Opcode::RdmaWrite,
        Opcode::RdmaWriteImm,
        Opcode::Send,
        Opcode::SendImm,
        Opcode::Wait,
        Opcode::RdmaRead,
        Opcode::AtomicCs,
        Opcode::AtomicFa,
        Opcode::AtomicMaskedCs,
        Opcode::AtomicMaskedFa,
        Opcode::RecvEn,
        Opcode::SendEn,
    ];

    /// The opcode for a control byte, if it is one we know.
    pub const fn from_u8(b: u8) -> Option<Opcode> {
        Some(match b {
            0x00 => Opcode::Nop,
            0x08 => Opcode::RdmaWrite,
            0x09 => Opcode::RdmaWriteImm,
            0x0a => Opcode::Send,
            0x0b => Opcode::SendImm,
            0x0f => Opcode::Wait,
            0x10 => Opcode::RdmaRead,
            0x11 => Opcode::AtomicCs,
            0x12 => Opcode::AtomicFa,
            0x14 => Opcode::AtomicMaskedCs,
            0x15 => Opcode::AtomicMaskedFa,
            0x16 => Opcode::RecvEn,
            0x17 => Opcode::SendEn,
            _ => return None,
        })
    }

    /// Short upper-case name, as listings and counters print it.
    pub const fn name(self) -> &'static str {
        match self {
            Opcode::Nop => "NOP",
            Opcode::RdmaWrite => "WRITE",
            Opcode::RdmaWriteImm => "WRITE_IMM",
            Opcode::Send => "SEND",
            Opcode::SendImm => "SEND_IMM",
            Opcode::Wait => "WAIT",
            Opcode::RdmaRead => "READ",
            Opcode::AtomicCs => "CAS",
            Opcode::AtomicFa => "FAA",
            Opcode::AtomicMaskedCs => "MASKED_CAS",
            Opcode::AtomicMaskedFa => "MASKED_FAA",
            Opcode::RecvEn => "RECV_EN",
            Opcode::SendEn => "SEND_EN",
        }
    }

    /// True for the opcodes whose second segment is a remote-address segment.
    pub const fn has_raddr(self) -> bool {
        matches!(
            self,
            Opcode::RdmaWrite
                | Opcode::RdmaWriteImm
                | Opcode::RdmaRead
                | Opcode::AtomicCs
                | Opcode::AtomicFa
                | Opcode::AtomicMaskedCs
                | Opcode::AtomicMaskedFa
        )
    }

    /// True for the cross-channel opcodes that carry a wait/enable segment.
    pub const fn is_wait_enable(self) -> bool {
        matches!(self, Opcode::Wait | Opcode::SendEn | Opcode::RecvEn)
    }

    /// True for the four atomics.
    pub const fn is_atomic(self) -> bool {
        matches!(
            self,
            Opcode::AtomicCs | Opcode::AtomicFa | Opcode::AtomicMaskedCs | Opcode::AtomicMaskedFa
        )
    }
}

impl fmt::Display for Opcode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// Why a byte string is not a WQE we can decode.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum WqeError {
    /// The opcode byte is not one of [`Opcode`].
    #[error("unknown opcode {0:#04x}")]
    UnknownOpcode(u8),
    /// ds is smaller than the opcode's fixed segments need.
    #[error("ds {ds} too small for {opcode} (needs at least {min})")]
    DsTooSmall {
        /// The opcode.
        opcode: Opcode,
        /// The ds found.
        ds: u8,
        /// The smallest ds the opcode can have.
        min: u8,
    },
    /// Fewer bytes than ds says.
    #[error("WQE truncated: ds {ds} needs {needed} bytes, have {have}")]
    Truncated {
        /// The ds found.
        ds: u8,
        /// Bytes needed.
        needed: usize,
        /// Bytes given.
        have: usize,
    },
    /// The request does not fit in 63 segments.
    #[error("WQE needs {0} segments, the limit is 63")]
    TooLarge(usize),
    /// A QP or CQ number wider than 24 bits.
    #[error("object number {0:#x} exceeds 24 bits")]
    ObjectNumberTooWide(u32),
    /// An inline segment whose length runs past ds.
    #[error("inline length {len} exceeds the {room} bytes ds leaves")]
    InlineOverrun {
        /// The inline length in the header.
        len: usize,
        /// Room left in the WQE.
        room: usize,
    },
    /// Inline data mixed with data segments.
    #[error("inline segment followed by more segments")]
    InlineNotLast,
    /// A scatter/gather entry longer than a data segment can say: bit 31 of its byte count
    /// marks inline data.
    #[error("scatter/gather entry of {0} bytes: a data segment holds at most 2^31 - 1")]
    SgeTooLong(u32),
}

/// The 16-byte control segment that starts every send WQE.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct CtrlSeg {
    /// Opcode modifier (0 except for extended atomics).
    pub opmod: u8,
    /// Producer counter of the WQE's first basic block, mod 2^16.
    pub wqe_index: u16,
    /// Raw opcode byte (see [`Opcode`]); raw so a patched, unknown byte still decodes here.
    pub opcode: u8,
    /// Queue pair number (24 bits).
    pub qpn: Qpn,
    /// WQE size in 16-byte units, control segment included (6 bits).
    pub ds: u8,
    /// WQE signature byte.
    pub signature: u8,
    /// Fence / completion / solicited flags.
    pub flags: WqeFlags,
    /// Immediate data as a host value; stored big-endian at bytes 12..16.
    pub imm: u32,
}

impl CtrlSeg {
    /// Encode into 16 bytes.
    pub fn encode(&self) -> [u8; SEG_SIZE] {
        let mut b = [0u8; SEG_SIZE];
        b[off::OPMOD] = self.opmod;
        Be16::new(self.wqe_index).write(&mut b, off::WQE_INDEX);
        b[off::OPCODE] = self.opcode;
        Be32::new((self.qpn.0 << 8) | u32::from(self.ds & MAX_DS)).write(&mut b, off::QPN);
        b[off::SIGNATURE] = self.signature;
        b[off::FM_CE_SE] = self.flags.0;
        Be32::new(self.imm).write(&mut b, off::IMM);
        b
    }

    /// Decode the first 16 bytes of `b` (which must hold at least 16).
    pub fn decode(b: &[u8]) -> CtrlSeg {
        let qpn_ds = Be32::read(b, off::QPN).get();
        CtrlSeg {
            opmod: b[off::OPMOD],
            wqe_index: Be16::read(b, off::WQE_INDEX).get(),
            opcode: b[off::OPCODE],
            qpn: Qpn(qpn_ds >> 8),
            ds: (qpn_ds & 0x3f) as u8,
            signature: b[off::SIGNATURE],
            flags: WqeFlags(b[off::FM_CE_SE]),
            imm: Be32::read(b, off::IMM).get(),
        }
    }

    /// Number of basic blocks the WQE occupies (at least one, even for ds 0).
    pub fn bbs(&self) -> usize {
        bbs_for_ds(self.ds)
    }
}

/// Basic blocks a WQE of `ds` segments occupies (a zero ds still occupies one block).
#[must_use]
pub fn bbs_for_ds(ds: u8) -> usize {
    (usize::from(ds & MAX_DS) * SEG_SIZE)
        .div_ceil(BB_SIZE)
        .max(1)
}

/// A scatter/gather entry: local memory a WQE reads from or writes to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Sge {
    /// Start address.
    pub addr: VirtAddr,
    /// Length in bytes (zero-length entries are skipped when encoding, as libmlx5 does).
    pub len: u32,
    /// Key of the region holding it.
    pub lkey: Lkey,
}

impl Sge {
    /// Encode as a data segment.
    pub fn encode(&self) -> [u8; SEG_SIZE] {
        let mut b = [0u8; SEG_SIZE];
        Be32::new(self.len).write(&mut b, off::SEG_BYTE_COUNT);
        Be32::new(self.lkey.0).write(&mut b, off::SEG_LKEY);
        Be64::new(self.addr.0).write(&mut b, off::SEG_ADDR);
        b
    }

    /// Decode a data segment from the first 16 bytes of `b`.
    pub fn decode(b: &[u8]) -> Sge {
        Sge {
            len: Be32::read(b, off::SEG_BYTE_COUNT).get(),
            lkey: Lkey(Be32::read(b, off::SEG_LKEY).get()),
            addr: VirtAddr(Be64::read(b, off::SEG_ADDR).get()),
        }
    }
}

/// The target of a one-sided operation.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RemoteAddr {
    /// Address in the peer's region.
    pub addr: VirtAddr,
    /// The peer region's key.
    pub rkey: Rkey,
}

/// Where a WRITE or SEND takes its bytes from.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Payload {
    /// Gathered from registered memory.
    Sgl(Vec<Sge>),
    /// Carried inside the WQE itself.
    Inline(Vec<u8>),
}

impl Payload {
    /// Total payload length in bytes.
    pub fn len(&self) -> u64 {
        match self {
            Payload::Sgl(s) => s.iter().map(|e| u64::from(e.len)).sum(),
            Payload::Inline(d) => d.len() as u64,
        }
    }

    /// True if there are no bytes to move.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// What a send WQE does, with every operand it carries.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum WrOp {
    /// No operation. `sgl` keeps data segments a NOP may carry (RedN's response WQE is a
    /// WRITE_IMM whose opcode was cleared, so its remote-address and data segments stay).
    Nop {
        /// Segments after ctrl, kept verbatim (16 bytes each).
        raw_segments: Vec<[u8; SEG_SIZE]>,
    },
    /// RDMA WRITE (with immediate if `imm` is set: the peer consumes a receive).
    Write {
        /// Where to write.
        remote: RemoteAddr,
        /// What to write.
        payload: Payload,
        /// Immediate data: `Some` encodes RDMA_WRITE_IMM.
        imm: Option<u32>,
    },
    /// SEND (with immediate if `imm` is set).
    Send {
        /// What to send.
        payload: Payload,
        /// Immediate data: `Some` encodes SEND_IMM.
        imm: Option<u32>,
    },
    /// RDMA READ into a scatter list.
    Read {
        /// What to read.
        remote: RemoteAddr,
        /// Where the bytes land, in order.
        sgl: Vec<Sge>,
    },
    /// Compare and swap; `result` receives the old value (8 bytes, host order).
    CompareSwap {
        /// The 8-byte-aligned target.
        remote: RemoteAddr,
        /// Compared with the target read as a host-order u64.
        compare: u64,
        /// Stored on a match.
        swap: u64,
        /// Where the old value goes.
        result: Option<Sge>,
    },
    /// Fetch and add; `result` receives the old value.
    FetchAdd {
        /// The 8-byte-aligned target.
        remote: RemoteAddr,
        /// Added to the target.
        add: u64,
        /// Where the old value goes.
        result: Option<Sge>,
    },
    /// Masked compare and swap: matches when `(old ^ compare) & compare_mask == 0`, then
    /// stores `(old & !swap_mask) | (swap & swap_mask)`.
    MaskedCompareSwap {
        /// The 8-byte-aligned target.
        remote: RemoteAddr,
        /// Compare value.
        compare: u64,
        /// Bits of the compare that count.
        compare_mask: u64,
        /// Swap value.
        swap: u64,
        /// Bits the swap replaces.
        swap_mask: u64,
        /// Where the old value goes.
        result: Option<Sge>,
    },
    /// Masked fetch and add: a set bit in `field_boundary` stops the carry out of that bit, so
    /// one 64-bit word holds several independent counters.
    MaskedFetchAdd {
        /// The 8-byte-aligned target.
        remote: RemoteAddr,
        /// Addend.
        add: u64,
        /// Carry stops.
        field_boundary: u64,
        /// Where the old value goes.
        result: Option<Sge>,
    },
    /// CQE_WAIT: block until CQ `cq` has produced more than `count` completions.
    Wait {
        /// The CQ counted.
        cq: Cqn,
        /// Absolute 0-based index of the completion waited for.
        count: u32,
    },
    /// SEND_EN: managed send queue `qp` may run WQEs below producer index `pi` (in BBs).
    SendEnable {
        /// The managed queue.
        qp: Qpn,
        /// New enabled index, exclusive, absolute.
        pi: u32,
    },
    /// RECV_EN: managed receive queue `qp` may consume receives below `pi`.
    RecvEnable {
        /// The managed queue.
        qp: Qpn,
        /// New enabled index, exclusive, absolute.
        pi: u32,
    },
}

impl WrOp {
    /// The opcode this operation encodes to.
    pub fn opcode(&self) -> Opcode {
        match self {
            WrOp::Nop { .. } => Opcode::Nop,
            WrOp::Write { imm: None, .. } => Opcode::RdmaWrite,
            WrOp::Write { imm: Some(_), .. } => Opcode::RdmaWriteImm,
            WrOp::Send { imm: None, .. } => Opcode::Send,
            WrOp::Send { imm: Some(_), .. } => Opcode::SendImm,
            WrOp::Read { .. } => Opcode::RdmaRead,
            WrOp::CompareSwap { .. } => Opcode::AtomicCs,
            WrOp::FetchAdd { .. } => Opcode::AtomicFa,
            WrOp::MaskedCompareSwap { .. } => Opcode::AtomicMaskedCs,
            WrOp::MaskedFetchAdd { .. } => Opcode::AtomicMaskedFa,
            WrOp::Wait { .. } => Opcode::Wait,
            WrOp::SendEnable { .. } => Opcode::SendEn,
            WrOp::RecvEnable { .. } => Opcode::RecvEn,
        }
    }
}

/// A send work request as an application posts it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct WorkRequest {
    /// Returned in this WQE's completion.
    pub wr_id: u64,
    /// Completion, fence and solicited flags.
    pub flags: WqeFlags,
    /// The operation.
    pub op: WrOp,
}

/// One encoded WQE: whole basic blocks, ready to copy into a ring.
#[derive(Clone)]
pub struct EncodedWqe {
    buf: [u8; MAX_WQE_BYTES],
    ds: u8,
}

impl fmt::Debug for EncodedWqe {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("EncodedWqe")
            .field("ds", &self.ds)
            .field("bytes", &self.bytes())
            .finish()
    }
}

impl EncodedWqe {
    /// The WQE's bytes, padded with zeros to whole basic blocks.
    pub fn bytes(&self) -> &[u8] {
        &self.buf[..self.bbs() * BB_SIZE]
    }

    /// Mutable access, for tools that patch an encoded WQE before posting it.
    pub fn bytes_mut(&mut self) -> &mut [u8] {
        let n = self.bbs() * BB_SIZE;
        &mut self.buf[..n]
    }

    /// The ds it was encoded with.
    pub fn ds(&self) -> u8 {
        self.ds
    }

    /// Basic blocks it occupies.
    pub fn bbs(&self) -> usize {
        bbs_for_ds(self.ds)
    }
}

/// Appends segments after the control segment. Every byte it covers is written, so the
/// buffer's old contents do not matter.
struct SegWriter<'a> {
    buf: &'a mut [u8; MAX_WQE_BYTES],
    segs: usize,
}

impl SegWriter<'_> {
    fn push(&mut self, seg: &[u8; SEG_SIZE]) -> Result<(), WqeError> {
        if self.segs >= usize::from(MAX_DS) {
            return Err(WqeError::TooLarge(self.segs + 1));
        }
        let at = self.segs * SEG_SIZE;
        self.buf[at..at + SEG_SIZE].copy_from_slice(seg);
        self.segs += 1;
        Ok(())
    }

    fn push_sgl(&mut self, sgl: &[Sge]) -> Result<(), WqeError> {
        for sge in sgl.iter().filter(|s| s.len != 0) {
            if sge.len & INLINE_FLAG != 0 {
                // It would read back as an inline header.
                return Err(WqeError::SgeTooLong(sge.len));
            }
            self.push(&sge.encode())?;
        }
        Ok(())
    }

    fn push_inline(&mut self, data: &[u8]) -> Result<(), WqeError> {
        let total = (data.len() + 4).div_ceil(SEG_SIZE);
        if self.segs + total > usize::from(MAX_DS) {
            return Err(WqeError::TooLarge(self.segs + total));
        }
        // Never fails: the check above keeps the data under 63 segments.
        let len = u32::try_from(data.len()).map_err(|_| WqeError::TooLarge(self.segs + total))?;
        let at = self.segs * SEG_SIZE;
        Be32::new(len | INLINE_FLAG).write(self.buf, at);
        self.buf[at + 4..at + 4 + data.len()].copy_from_slice(data);
        self.buf[at + 4 + data.len()..at + total * SEG_SIZE].fill(0);
        self.segs += total;
        Ok(())
    }

    fn push_payload(&mut self, p: &Payload) -> Result<(), WqeError> {
        match p {
            Payload::Sgl(s) => self.push_sgl(s),
            Payload::Inline(d) => self.push_inline(d),
        }
    }

    fn push_raddr(&mut self, r: &RemoteAddr) -> Result<(), WqeError> {
        let mut s = [0u8; SEG_SIZE];
        Be64::new(r.addr.0).write(&mut s, 0);
        Be32::new(r.rkey.0).write(&mut s, 8);
        self.push(&s)
    }

    fn push_pair(&mut self, a: u64, b: u64) -> Result<(), WqeError> {
        let mut s = [0u8; SEG_SIZE];
        Be64::new(a).write(&mut s, 0);
        Be64::new(b).write(&mut s, 8);
        self.push(&s)
    }

    fn push_atomic_result(&mut self, r: &Option<Sge>) -> Result<(), WqeError> {
        match r {
            // An atomic's data segment always moves 8 bytes, whatever the SGE says.
            Some(sge) => self.push(&Sge { len: 8, ..*sge }.encode()),
            None => Ok(()),
        }
    }

    fn push_wait_en(&mut self, pi: u32, obj: u32) -> Result<(), WqeError> {
        if obj > MAX_QPN {
            return Err(WqeError::ObjectNumberTooWide(obj));
        }
        let mut s = [0u8; SEG_SIZE];
        Be32::new(pi).write(&mut s, 8);
        Be32::new(obj).write(&mut s, 12);
        self.push(&s)
    }
}

/// Encode `wr` as the WQE a ConnectX would fetch, for queue pair `qpn` at producer counter
/// `wqe_index` (stored mod 2^16).
pub fn encode_wqe(wr: &WorkRequest, qpn: Qpn, wqe_index: u16) -> Result<EncodedWqe, WqeError> {
    let mut buf = [0u8; MAX_WQE_BYTES];
    let ds = encode_wqe_into(wr, qpn, wqe_index, &mut buf)?;
    Ok(EncodedWqe { buf, ds })
}

/// As [`encode_wqe`], into the start of `out`, whose old contents do not matter: every byte of
/// the WQE's basic blocks (`bbs_for_ds` of the returned ds) is written. For posting many
/// WQEs through one buffer without clearing 1 KiB for each.
pub fn encode_wqe_into(
    wr: &WorkRequest,
    qpn: Qpn,
    wqe_index: u16,
    out: &mut [u8; MAX_WQE_BYTES],
) -> Result<u8, WqeError> {
    if qpn.0 > MAX_QPN {
        return Err(WqeError::ObjectNumberTooWide(qpn.0));
    }
    let mut w = SegWriter { buf: out, segs: 1 };
    let mut imm = 0u32;
    let mut opmod = 0u8;
    match &wr.op {
        WrOp::Nop { raw_segments } => {
            for s in raw_segments {
                w.push(s)?;
            }
        }
        WrOp::Write {
            remote,
            payload,
            imm: i,
        } => {
            imm = i.unwrap_or(0);
            w.push_raddr(remote)?;
            w.push_payload(payload)?;
        }
        WrOp::Send { payload, imm: i } => {
            imm = i.unwrap_or(0);
            w.push_payload(payload)?;
        }
        WrOp::Read { remote, sgl } => {
            w.push_raddr(remote)?;
            w.push_sgl(sgl)?;
        }
        WrOp::CompareSwap {
            remote,
            compare,
            swap,
            result,
        } => {
            w.push_raddr(remote)?;
            w.push_pair(*swap, *compare)?;
            w.push_atomic_result(result)?;
        }
        WrOp::FetchAdd {
            remote,
            add,
            result,
        } => {
            w.push_raddr(remote)?;
            w.push_pair(*add, 0)?;
            w.push_atomic_result(result)?;
        }
        WrOp::MaskedCompareSwap {
            remote,
            compare,
            compare_mask,
            swap,
            swap_mask,
            result,
        } => {
            opmod = OPMOD_EXT_ATOMIC_8B;
            w.push_raddr(remote)?;
            w.push_pair(*swap, *compare)?;
            w.push_pair(*swap_mask, *compare_mask)?;
            w.push_atomic_result(result)?;
        }
        WrOp::MaskedFetchAdd {
            remote,
            add,
            field_boundary,
            result,
        } => {
            opmod = OPMOD_EXT_ATOMIC_8B;
            w.push_raddr(remote)?;
            w.push_pair(*add, *field_boundary)?;
            w.push_atomic_result(result)?;
        }
        WrOp::Wait { cq, count } => w.push_wait_en(*count, cq.0)?,
        WrOp::SendEnable { qp, pi } | WrOp::RecvEnable { qp, pi } => w.push_wait_en(*pi, qp.0)?,
    }
    // Never fails: every push checks the segment count against MAX_DS.
    let ds = u8::try_from(w.segs).map_err(|_| WqeError::TooLarge(w.segs))?;
    let ctrl = CtrlSeg {
        opmod,
        wqe_index,
        opcode: wr.op.opcode() as u8,
        qpn,
        ds,
        signature: 0,
        flags: wr.flags,
        imm,
    };
    w.buf[..SEG_SIZE].copy_from_slice(&ctrl.encode());
    // Padding up to the basic block boundary.
    w.buf[w.segs * SEG_SIZE..bbs_for_ds(ds) * BB_SIZE].fill(0);
    Ok(ds)
}

/// A WQE read back from bytes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DecodedWqe {
    /// The control segment as found.
    pub ctrl: CtrlSeg,
    /// The operation with its operands.
    pub op: WrOp,
}

fn min_ds(op: Opcode) -> u8 {
    match op {
        Opcode::Nop | Opcode::Send | Opcode::SendImm => 1,
        Opcode::RdmaWrite | Opcode::RdmaWriteImm | Opcode::RdmaRead => 2,
        Opcode::Wait | Opcode::SendEn | Opcode::RecvEn => 2,
        Opcode::AtomicCs | Opcode::AtomicFa | Opcode::AtomicMaskedFa => 3,
        Opcode::AtomicMaskedCs => 4,
    }
}

fn decode_sgl(b: &[u8], from: usize, ds: usize) -> Vec<Sge> {
    (from..ds)
        .map(|s| Sge::decode(&b[s * SEG_SIZE..]))
        .collect()
}

fn decode_payload(b: &[u8], from: usize, ds: usize) -> Result<Payload, WqeError> {
    if from < ds && Be32::read(b, from * SEG_SIZE).get() & INLINE_FLAG != 0 {
        let len = (Be32::read(b, from * SEG_SIZE).get() & !INLINE_FLAG) as usize;
        let room = (ds - from) * SEG_SIZE - 4;
        if len > room {
            return Err(WqeError::InlineOverrun { len, room });
        }
        if (len + 4).div_ceil(SEG_SIZE) != ds - from {
            return Err(WqeError::InlineNotLast);
        }
        let at = from * SEG_SIZE + 4;
        return Ok(Payload::Inline(b[at..at + len].to_vec()));
    }
    Ok(Payload::Sgl(decode_sgl(b, from, ds)))
}

fn decode_raddr(b: &[u8]) -> RemoteAddr {
    RemoteAddr {
        addr: VirtAddr(Be64::read(b, off::RADDR).get()),
        rkey: Rkey(Be32::read(b, off::RKEY).get()),
    }
}

/// An atomic's result segment, if it has one. It always receives the 8-byte old value,
/// whatever its byte count says (the executor writes 8, the encoder writes 8), so it decodes
/// as 8 bytes: what runs, and what encodes back to the same WQE.
fn decode_result(b: &[u8], seg: usize, ds: usize) -> Option<Sge> {
    (seg < ds).then(|| Sge {
        len: 8,
        ..Sge::decode(&b[seg * SEG_SIZE..])
    })
}

/// Decode a WQE from `b`, which must hold at least `ds` segments.
pub fn decode_wqe(b: &[u8]) -> Result<DecodedWqe, WqeError> {
    if b.len() < SEG_SIZE {
        return Err(WqeError::Truncated {
            ds: 0,
            needed: SEG_SIZE,
            have: b.len(),
        });
    }
    let ctrl = CtrlSeg::decode(b);
    let opcode = Opcode::from_u8(ctrl.opcode).ok_or(WqeError::UnknownOpcode(ctrl.opcode))?;
    let ds = usize::from(ctrl.ds);
    if b.len() < ds * SEG_SIZE {
        return Err(WqeError::Truncated {
            ds: ctrl.ds,
            needed: ds * SEG_SIZE,
            have: b.len(),
        });
    }
    let min = min_ds(opcode);
    if ctrl.ds < min {
        return Err(WqeError::DsTooSmall {
            opcode,
            ds: ctrl.ds,
            min,
        });
    }
    let imm = ctrl.imm;
    let op = match opcode {
        Opcode::Nop => WrOp::Nop {
            raw_segments: (1..ds)
                .map(|s| {
                    let mut seg = [0u8; SEG_SIZE];
                    seg.copy_from_slice(&b[s * SEG_SIZE..(s + 1) * SEG_SIZE]);
                    seg
                })
                .collect(),
        },
        Opcode::RdmaWrite | Opcode::RdmaWriteImm => WrOp::Write {
            remote: decode_raddr(b),
            payload: decode_payload(b, 2, ds)?,
            imm: (opcode == Opcode::RdmaWriteImm).then_some(imm),
        },
        Opcode::Send | Opcode::SendImm => WrOp::Send {
            payload: decode_payload(b, 1, ds)?,
            imm: (opcode == Opcode::SendImm).then_some(imm),
        },
        Opcode::RdmaRead => WrOp::Read {
            remote: decode_raddr(b),
            sgl: decode_sgl(b, 2, ds),
        },
        Opcode::AtomicCs => WrOp::CompareSwap {
            remote: decode_raddr(b),
            swap: Be64::read(b, off::SWAP_ADD).get(),
            compare: Be64::read(b, off::COMPARE).get(),
            result: decode_result(b, 3, ds),
        },
        Opcode::AtomicFa => WrOp::FetchAdd {
            remote: decode_raddr(b),
            add: Be64::read(b, off::SWAP_ADD).get(),
            result: decode_result(b, 3, ds),
        },
        Opcode::AtomicMaskedCs => WrOp::MaskedCompareSwap {
            remote: decode_raddr(b),
            swap: Be64::read(b, 32).get(),
            compare: Be64::read(b, 40).get(),
            swap_mask: Be64::read(b, 48).get(),
            compare_mask: Be64::read(b, 56).get(),
            result: decode_result(b, 4, ds),
        },
        Opcode::AtomicMaskedFa => WrOp::MaskedFetchAdd {
            remote: decode_raddr(b),
            add: Be64::read(b, 32).get(),
            field_boundary: Be64::read(b, 40).get(),
            result: decode_result(b, 3, ds),
        },
        Opcode::Wait => WrOp::Wait {
            cq: Cqn(Be32::read(b, off::WAIT_OBJ).get()),
            count: Be32::read(b, off::WAIT_PI).get(),
        },
        Opcode::SendEn => WrOp::SendEnable {
            qp: Qpn(Be32::read(b, off::WAIT_OBJ).get()),
            pi: Be32::read(b, off::WAIT_PI).get(),
        },
        Opcode::RecvEn => WrOp::RecvEnable {
            qp: Qpn(Be32::read(b, off::WAIT_OBJ).get()),
            pi: Be32::read(b, off::WAIT_PI).get(),
        },
    };
    Ok(DecodedWqe { ctrl, op })
}

/// Encode a receive WQE for a slot of `slot_entries` data segments: the used entries, then an
/// [`INVALID_LKEY`] terminator if any room is left. Zero-length entries are skipped.
pub fn encode_recv(sgl: &[Sge], slot_entries: usize) -> Result<Vec<u8>, WqeError> {
    let used: Vec<&Sge> = sgl.iter().filter(|s| s.len != 0).collect();
    if used.len() > slot_entries {
        return Err(WqeError::TooLarge(used.len()));
    }
    let mut out = vec![0u8; slot_entries * SEG_SIZE];
    for (i, s) in used.iter().enumerate() {
        out[i * SEG_SIZE..(i + 1) * SEG_SIZE].copy_from_slice(&s.encode());
    }
    if used.len() < slot_entries {
        let t = Sge {
            addr: VirtAddr(0),
            len: 0,
            lkey: Lkey(INVALID_LKEY),
        };
        out[used.len() * SEG_SIZE..(used.len() + 1) * SEG_SIZE].copy_from_slice(&t.encode());
    }
    Ok(out)
}

/// Decode a receive WQE: entries up to the terminator or the end of the slot.
pub fn decode_recv(b: &[u8]) -> Vec<Sge> {
    recv_entries(b).collect()
}

/// A receive WQE's entries, decoded as they are walked (no allocation: a responder places
/// every SEND through them): up to the terminator or the end of the slot.
pub fn recv_entries(b: &[u8]) -> impl Iterator<Item = Sge> + Clone + '_ {
    b.chunks_exact(SEG_SIZE)
        .map(Sge::decode)
        .take_while(|s| s.lkey.0 != INVALID_LKEY)
}

/// The opcode nibble of a CQE (`op_own >> 4`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum CqeOpcode {
    /// A send-queue WQE completed.
    Req = 0x0,
    /// A receive consumed by RDMA WRITE with immediate.
    RespWriteImm = 0x1,
    /// A receive consumed by SEND.
    RespSend = 0x2,
    /// A receive consumed by SEND with immediate.
    RespSendImm = 0x3,
    /// A send-queue WQE failed (or was flushed).
    ReqErr = 0xd,
    /// A receive failed (or was flushed).
    RespErr = 0xe,
}

impl CqeOpcode {
    /// The opcode for a nibble, if known.
    pub fn from_nibble(n: u8) -> Option<CqeOpcode> {
        Some(match n {
            0x0 => CqeOpcode::Req,
            0x1 => CqeOpcode::RespWriteImm,
            0x2 => CqeOpcode::RespSend,
            0x3 => CqeOpcode::RespSendImm,
            0xd => CqeOpcode::ReqErr,
            0xe => CqeOpcode::RespErr,
            _ => return None,
        })
    }

    /// True for the two error kinds.
    pub fn is_error(self) -> bool {
        matches!(self, CqeOpcode::ReqErr | CqeOpcode::RespErr)
    }
}

/// Error syndromes of an error CQE (byte 55).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum Syndrome {
    /// Local length error.
    LocalLength = 0x01,
    /// Local QP operation error (a malformed WQE).
    LocalQpOperation = 0x02,
    /// Local protection error: a local key, bound or right was violated.
    LocalProtection = 0x04,
    /// Work request flushed because the QP is in the error state.
    WrFlush = 0x05,
    /// Memory window bind error (`MLX5_CQE_SYNDROME_MW_BIND_ERR`, `IBV_WC_MW_BIND_ERR`).
    MwBind = 0x06,
    /// Bad response from the peer.
    BadResponse = 0x10,
    /// Local access error.
    LocalAccess = 0x11,
    /// Remote invalid request: the peer found the request malformed (misaligned atomic,
    /// message longer than the receive).
    RemoteInvalidRequest = 0x12,
    /// Remote access error: the peer refused the key, bound or right.
    RemoteAccess = 0x13,
    /// Remote operation error.
    RemoteOperation = 0x14,
    /// Transport retries exhausted.
    TransportRetryExceeded = 0x15,
    /// RNR retries exhausted.
    RnrRetryExceeded = 0x16,
    /// The peer aborted the operation (`MLX5_CQE_SYNDROME_REMOTE_ABORTED_ERR`,
    /// `IBV_WC_REM_ABORT_ERR`).
    RemoteAborted = 0x22,
    /// General error (`IBV_WC_GENERAL_ERR`): an error CQE whose syndrome byte is none of the
    /// above, as rdma-core's `mlx5_handle_error_cqe` reports it (its default case). Not a
    /// byte mlx5 defines: its discriminant, 0xff, is only a placeholder; the byte the CQE
    /// carried stays in the CQE ([`Cqe::syndrome`]). The softnic never writes it.
    General = 0xff,
}

impl Syndrome {
    /// The syndrome for a byte, if known.
    pub fn from_u8(b: u8) -> Option<Syndrome> {
        Some(match b {
            0x01 => Syndrome::LocalLength,
            0x02 => Syndrome::LocalQpOperation,
            0x04 => Syndrome::LocalProtection,
            0x05 => Syndrome::WrFlush,
            0x06 => Syndrome::MwBind,
            0x10 => Syndrome::BadResponse,
            0x11 => Syndrome::LocalAccess,
            0x12 => Syndrome::RemoteInvalidRequest,
            0x13 => Syndrome::RemoteAccess,
            0x14 => Syndrome::RemoteOperation,
            0x15 => Syndrome::TransportRetryExceeded,
            0x16 => Syndrome::RnrRetryExceeded,
            0x22 => Syndrome::RemoteAborted,
            _ => return None,
        })
    }

    /// The status an error CQE with syndrome byte `b` completes with: its syndrome, or
    /// [`Syndrome::General`] for a byte `mlx5dv.h` does not define (`mlx5_handle_error_cqe`).
    pub fn of_error_cqe(b: u8) -> Syndrome {
        Syndrome::from_u8(b).unwrap_or(Syndrome::General)
    }

    /// Lower-case name for logs.
    pub fn name(self) -> &'static str {
        match self {
            Syndrome::LocalLength => "local length error",
            Syndrome::LocalQpOperation => "local QP operation error",
            Syndrome::LocalProtection => "local protection error",
            Syndrome::WrFlush => "work request flushed",
            Syndrome::MwBind => "memory window bind error",
            Syndrome::BadResponse => "bad response",
            Syndrome::LocalAccess => "local access error",
            Syndrome::RemoteInvalidRequest => "remote invalid request",
            Syndrome::RemoteAccess => "remote access error",
            Syndrome::RemoteOperation => "remote operation error",
            Syndrome::TransportRetryExceeded => "transport retry exceeded",
            Syndrome::RnrRetryExceeded => "RNR retry exceeded",
            Syndrome::RemoteAborted => "remote aborted",
            Syndrome::General => "general error",
        }
    }
}

impl fmt::Display for Syndrome {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// Byte offset of a success CQE's 64-bit timestamp (`struct mlx5_cqe64`: 32 bytes of
/// receive-side fields, then `srqn_uidx`, `imm_inval_pkey`, 4 bytes, `byte_cnt`).
pub const CQE_TIMESTAMP: usize = 48;

/// The fields of a 64-byte mlx5 CQE that the softnic produces and pollers read.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Cqe {
    /// Kind of completion.
    pub opcode: CqeOpcode,
    /// The queue pair it belongs to.
    pub qpn: Qpn,
    /// Send opcode of the WQE (requester CQEs, top byte of `sop_drop_qpn`).
    pub send_opcode: u8,
    /// Counter of the WQE (send: its first BB; receive: the receive index), mod 2^16.
    pub wqe_counter: u16,
    /// Bytes transferred (receives) or 8 for atomics.
    pub byte_cnt: u32,
    /// Immediate data (host value; stored big-endian at bytes 36..40).
    pub imm: u32,
    /// Error syndrome (error CQEs only).
    pub syndrome: u8,
    /// Vendor syndrome (error CQEs only).
    pub vendor_syndrome: u8,
    /// When the completion was written (bytes 48..56, big-endian: `timestamp` of
    /// `struct mlx5_cqe64`). A ConnectX writes its free-running HCA clock in ticks
    /// (`mlx5dv_get_clock_info` / `ibv_query_rt_values_ex` convert them); the softnic writes
    /// nanoseconds of the host's `CLOCK_MONOTONIC`. Success CQEs only: in an error CQE
    /// (`struct mlx5_err_cqe`) bytes 48..54 are reserved and 54..56 hold the syndromes, and
    /// verbs promise only wr_id, status, QP number and vendor syndrome of a failed completion,
    /// so an error CQE encodes no timestamp and decodes as 0.
    pub timestamp: u64,
    /// Owner bit, flips each time the CQ ring wraps.
    pub owner: bool,
}

impl Cqe {
    /// Encode into the 64-byte mlx5 layout (`struct mlx5_cqe64` / `struct mlx5_err_cqe`).
    pub fn encode(&self) -> [u8; CQE_SIZE] {
        let mut b = [0u8; CQE_SIZE];
        self.encode_into(&mut b);
        b
    }

    /// Encode into `b` in place (every byte is written: the fields, zeros elsewhere).
    #[inline]
    pub fn encode_into(&self, b: &mut [u8; CQE_SIZE]) {
        *b = [0u8; CQE_SIZE];
        if self.opcode.is_error() {
            b[54] = self.vendor_syndrome;
            b[55] = self.syndrome;
        } else {
            Be32::new(self.imm).write(b, 36);
            Be32::new(self.byte_cnt).write(b, 44);
            Be64::new(self.timestamp).write(b, CQE_TIMESTAMP);
        }
        Be32::new((u32::from(self.send_opcode) << 24) | (self.qpn.0 & MAX_QPN)).write(b, 56);
        Be16::new(self.wqe_counter).write(b, 60);
        b[63] = ((self.opcode as u8) << 4) | u8::from(self.owner);
    }

    /// Decode 64 bytes; `None` if the opcode nibble is unknown.
    pub fn decode(b: &[u8; CQE_SIZE]) -> Option<Cqe> {
        let opcode = CqeOpcode::from_nibble(b[63] >> 4)?;
        let err = opcode.is_error();
        let sop_qpn = Be32::read(b, 56).get();
        Some(Cqe {
            opcode,
            qpn: Qpn(sop_qpn & MAX_QPN),
            send_opcode: (sop_qpn >> 24) as u8,
            wqe_counter: Be16::read(b, 60).get(),
            byte_cnt: if err { 0 } else { Be32::read(b, 44).get() },
            imm: if err { 0 } else { Be32::read(b, 36).get() },
            syndrome: if err { b[55] } else { 0 },
            vendor_syndrome: if err { b[54] } else { 0 },
            timestamp: if err {
                0
            } else {
                Be64::read(b, CQE_TIMESTAMP).get()
            },
            owner: b[63] & 1 == 1,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sge(addr: u64, len: u32, lkey: u32) -> Sge {
        Sge {
            addr: VirtAddr(addr),
            len,
            lkey: Lkey(lkey),
        }
    }

    #[test]
    fn ctrl_segment_golden_bytes() {
        let c = CtrlSeg {
            opmod: 0,
            wqe_index: 0x0102,
            opcode: Opcode::RdmaWriteImm as u8,
            qpn: Qpn(0x00abcdef),
            ds: 3,
            signature: 0,
            flags: WqeFlags::SIGNALED | WqeFlags::FENCE,
            imm: 0x11223344,
        };
        let b = c.encode();
        assert_eq!(
            b,
            [
                0x00, 0x01, 0x02, 0x09, 0xab, 0xcd, 0xef, 0x03, 0x00, 0x00, 0x00, 0x88, 0x11, 0x22,
                0x33, 0x44
            ]
        );
        assert_eq!(CtrlSeg::decode(&b), c);
    }

    /// `encode_wqe_into` writes every byte of the WQE's blocks, whatever the buffer held.
    #[test]
    fn encoding_into_a_dirty_buffer_gives_the_same_bytes() {
        let remote = RemoteAddr {
            addr: VirtAddr(0x1000),
            rkey: Rkey(0x200),
        };
        let ops = [
            WrOp::Nop {
                raw_segments: vec![],
            },
            WrOp::Write {
                remote,
                payload: Payload::Inline(vec![7; 5]),
                imm: Some(3),
            },
            WrOp::Write {
                remote,
                payload: Payload::Inline(vec![9; 44]),
                imm: None,
            },
            WrOp::Read {
                remote,
                sgl: vec![sge(1, 3, 5), sge(2, 8, 5), sge(3, 8, 5)],
            },
            WrOp::FetchAdd {
                remote,
                add: 1,
                result: Some(sge(8, 8, 5)),
            },
            WrOp::Wait {
                cq: Cqn(4),
                count: 9,
            },
        ];
        let mut dirty = [0xa5u8; MAX_WQE_BYTES];
        for op in ops {
            let wr = WorkRequest {
                wr_id: 0,
                flags: WqeFlags::SIGNALED,
                op,
            };
            let clean = encode_wqe(&wr, Qpn(7), 4).unwrap();
            let ds = encode_wqe_into(&wr, Qpn(7), 4, &mut dirty).unwrap();
            assert_eq!(ds, clean.ds());
            assert_eq!(&dirty[..clean.bytes().len()], clean.bytes(), "{:?}", wr.op);
            dirty.fill(0xa5);
        }
    }

    #[test]
    fn read_with_three_scatter_entries_takes_two_bbs() {
        let wr = WorkRequest {
            wr_id: 1,
            flags: WqeFlags::SIGNALED,
            op: WrOp::Read {
                remote: RemoteAddr {
                    addr: VirtAddr(0x1000),
                    rkey: Rkey(0x200),
                },
                sgl: vec![sge(1, 3, 5), sge(2, 8, 5), sge(3, 8, 5)],
            },
        };
        let e = encode_wqe(&wr, Qpn(7), 4).unwrap();
        assert_eq!(e.ds(), 5);
        assert_eq!(e.bbs(), 2);
        assert_eq!(e.bytes().len(), 128);
        let d = decode_wqe(e.bytes()).unwrap();
        assert_eq!(d.op, wr.op);
        assert_eq!(d.ctrl.wqe_index, 4);
    }

    #[test]
    fn zero_length_sges_are_skipped() {
        let wr = WorkRequest {
            wr_id: 0,
            flags: WqeFlags::NONE,
            op: WrOp::Send {
                payload: Payload::Sgl(vec![sge(1, 0, 5), sge(2, 8, 5)]),
                imm: None,
            },
        };
        let e = encode_wqe(&wr, Qpn(1), 0).unwrap();
        assert_eq!(e.ds(), 2);
    }

    /// A data segment's byte count has 31 bits (bit 31 marks inline data), so a longer
    /// scatter/gather entry is refused rather than encoded as something else.
    #[test]
    fn a_scatter_gather_entry_of_2_gib_or_more_is_refused() {
        let write = |len| WorkRequest {
            wr_id: 0,
            flags: WqeFlags::NONE,
            op: WrOp::Write {
                remote: RemoteAddr {
                    addr: VirtAddr(0),
                    rkey: Rkey(1),
                },
                payload: Payload::Sgl(vec![sge(0, 8, 2), sge(0, len, 2)]),
                imm: None,
            },
        };
        assert!(encode_wqe(&write(INLINE_FLAG - 1), Qpn(1), 0).is_ok());
        assert_eq!(
            encode_wqe(&write(INLINE_FLAG), Qpn(1), 0).err(),
            Some(WqeError::SgeTooLong(INLINE_FLAG))
        );
    }

    /// An atomic's result segment moves 8 bytes whatever its byte count says (the executor
    /// writes 8): a ring patched to another count still decodes, and re-encodes, as 8.
    #[test]
    fn an_atomic_result_decodes_as_eight_bytes_whatever_its_count() {
        let wr = WorkRequest {
            wr_id: 0,
            flags: WqeFlags::SIGNALED,
            op: WrOp::FetchAdd {
                remote: RemoteAddr {
                    addr: VirtAddr(64),
                    rkey: Rkey(7),
                },
                add: 1,
                result: Some(sge(0x10, 8, 3)),
            },
        };
        let mut b = encode_wqe(&wr, Qpn(1), 0).unwrap().bytes().to_vec();
        for count in [0u32, 3, 4096] {
            Be32::new(count).write(&mut b, 3 * SEG_SIZE);
            let d = decode_wqe(&b).unwrap();
            assert_eq!(d.op, wr.op, "byte count {count}");
        }
    }

    #[test]
    fn every_opcode_round_trips() {
        let r = RemoteAddr {
            addr: VirtAddr(0xdead_beef_0000),
            rkey: Rkey(0x1234_5600),
        };
        let res = Some(sge(0x10, 8, 3));
        let ops = vec![
            WrOp::Nop {
                raw_segments: vec![[7u8; 16]],
            },
            WrOp::Write {
                remote: r,
                payload: Payload::Sgl(vec![sge(5, 64, 9)]),
                imm: None,
            },
            WrOp::Write {
                remote: r,
                payload: Payload::Inline(b"hello, inline".to_vec()),
                imm: Some(42),
            },
            WrOp::Send {
                payload: Payload::Sgl(vec![sge(5, 3, 9), sge(9, 8, 9)]),
                imm: None,
            },
            WrOp::Send {
                payload: Payload::Inline(vec![1, 2, 3]),
                imm: Some(0xfeed),
            },
            WrOp::Read {
                remote: r,
                sgl: vec![sge(8, 11, 2)],
            },
            WrOp::CompareSwap {
                remote: r,
                compare: 1,
                swap: 2,
                result: res,
            },
            WrOp::FetchAdd {
                remote: r,
                add: 6,
                result: None,
            },
            WrOp::MaskedCompareSwap {
                remote: r,
                compare: 1,
                compare_mask: 0xff,
                swap: 3,
                swap_mask: 0xf0,
                result: res,
            },
            WrOp::MaskedFetchAdd {
                remote: r,
                add: 1,
                field_boundary: 1 << 31,
                result: res,
            },
            WrOp::Wait {
                cq: Cqn(0x55),
                count: 9,
            },
            WrOp::SendEnable {
                qp: Qpn(0x66),
                pi: 12,
            },
            WrOp::RecvEnable {
                qp: Qpn(0x77),
                pi: 3,
            },
        ];
        let mut seen = std::collections::HashSet::new();
        for op in ops {
            seen.insert(op.opcode());
            let wr = WorkRequest {
                wr_id: 0,
                flags: WqeFlags::SIGNALED,
                op,
            };
            let e = encode_wqe(&wr, Qpn(0x42), 0xffff).unwrap();
            assert_eq!(e.bytes().len() % BB_SIZE, 0);
            let d = decode_wqe(e.bytes()).unwrap();
            assert_eq!(d.op, wr.op, "round trip of {}", wr.op.opcode());
            assert_eq!(d.ctrl.opcode, wr.op.opcode() as u8);
            assert_eq!(d.ctrl.qpn, Qpn(0x42));
            assert_eq!(d.ctrl.flags, WqeFlags::SIGNALED);
        }
        assert_eq!(seen.len(), Opcode::ALL.len());
    }

    #[test]
    fn oversized_requests_are_refused() {
        let wr = WorkRequest {
            wr_id: 0,
            flags: WqeFlags::NONE,
            op: WrOp::Send {
                payload: Payload::Sgl(vec![sge(1, 1, 1); 63]),
                imm: None,
            },
        };
        assert_eq!(
            encode_wqe(&wr, Qpn(1), 0).unwrap_err(),
            WqeError::TooLarge(64)
        );
        let wait = WorkRequest {
            wr_id: 0,
            flags: WqeFlags::NONE,
            op: WrOp::Wait {
                cq: Cqn(1 << 24),
                count: 0,
            },
        };
        assert!(matches!(
            encode_wqe(&wait, Qpn(1), 0),
            Err(WqeError::ObjectNumberTooWide(_))
        ));
    }

    #[test]
    fn decode_rejects_garbage() {
        let mut b = [0u8; 64];
        b[3] = 0x25; // UMR
        b[7] = 1;
        assert_eq!(decode_wqe(&b).unwrap_err(), WqeError::UnknownOpcode(0x25));
        b[3] = Opcode::AtomicCs as u8;
        assert!(matches!(decode_wqe(&b), Err(WqeError::DsTooSmall { .. })));
        b[7] = 8;
        assert!(matches!(decode_wqe(&b), Err(WqeError::Truncated { .. })));
    }

    #[test]
    fn recv_wqe_has_terminator() {
        let b = encode_recv(&[sge(0x100, 3, 7), sge(0x200, 8, 7)], 4).unwrap();
        assert_eq!(b.len(), 64);
        assert_eq!(Be32::read(&b, 32 + 4), Be32::new(INVALID_LKEY));
        assert_eq!(decode_recv(&b).len(), 2);
        let full = encode_recv(&[sge(1, 1, 1)], 1).unwrap();
        assert_eq!(decode_recv(&full).len(), 1);
    }

    #[test]
    fn cqe_golden_bytes() {
        let c = Cqe {
            opcode: CqeOpcode::RespSendImm,
            qpn: Qpn(0x000102),
            send_opcode: 0,
            wqe_counter: 0x0a0b,
            byte_cnt: 11,
            imm: 0xcafe,
            syndrome: 0,
            vendor_syndrome: 0,
            timestamp: 0x0102_0304_0506_0708,
            owner: true,
        };
        let b = c.encode();
        assert_eq!(&b[36..40], &[0, 0, 0xca, 0xfe]);
        assert_eq!(&b[44..48], &[0, 0, 0, 11]);
        assert_eq!(
            &b[48..56],
            &[1, 2, 3, 4, 5, 6, 7, 8],
            "mlx5_cqe64.timestamp, big-endian"
        );
        assert_eq!(&b[56..60], &[0, 0, 1, 2]);
        assert_eq!(&b[60..62], &[0x0a, 0x0b]);
        assert_eq!(b[63], 0x31);
        assert_eq!(Cqe::decode(&b), Some(c));

        let e = Cqe {
            opcode: CqeOpcode::ReqErr,
            qpn: Qpn(5),
            send_opcode: Opcode::RdmaWrite as u8,
            wqe_counter: 3,
            byte_cnt: 0,
            imm: 0,
            syndrome: Syndrome::RemoteAccess as u8,
            vendor_syndrome: 0x88,
            timestamp: 0,
            owner: false,
        };
        let b = e.encode();
        assert_eq!(b[55], 0x13);
        assert_eq!(b[54], 0x88);
        assert_eq!(b[56], 0x08);
        assert_eq!(b[63], 0xd0);
        assert_eq!(Cqe::decode(&b), Some(e));
        // An error CQE has no timestamp: mlx5_err_cqe reserves 48..54 and puts the
        // syndromes at 54..56, so a timestamp given to one is not encoded.
        let stamped = Cqe {
            timestamp: u64::MAX,
            ..e
        };
        let b = stamped.encode();
        assert_eq!(&b[48..54], &[0; 6]);
        assert_eq!((b[54], b[55]), (0x88, 0x13));
        assert_eq!(Cqe::decode(&b).map(|c| c.timestamp), Some(0));
    }
}
