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
//!
//! Here: the layout (constants, field offsets, opcodes, flags, segments and work requests);
//! `encode` turns work requests into WQE bytes, `decode` reads WQE bytes back, `cqe` has
//! completion entries.

mod cqe;
mod decode;
mod encode;

pub use cqe::{Cqe, CqeOpcode, Syndrome, CQE_TIMESTAMP};
pub use decode::{decode_recv, decode_wqe, recv_entries, DecodedWqe};
pub use encode::{encode_recv, encode_wqe, encode_wqe_into, EncodedWqe};

#[cfg(test)]
mod tests;

use crate::endian::{Be16, Be32, Be64};
use crate::types::{Cqn, Lkey, Qpn, Rkey, VirtAddr};
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
