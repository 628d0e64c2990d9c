//! Completion queue entries: their opcodes, error syndromes and the 64-byte layout a
//! consumer polls.

use super::CQE_SIZE;
use crate::endian::{Be16, Be32, Be64};
use crate::types::{Qpn, MAX_QPN};
use std::fmt;

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
