//! The responder side of one RC connection, as a state machine without I/O: in-order
//! acceptance against the expected PSN, one sequence NAK per gap, opcode-sequence and
//! length checks, reassembly of multi-packet SENDs, placement of WRITEs packet by packet,
//! READ responses, atomics, duplicates answered as IBTA says (SEND/WRITE re-ACKed, READs
//! replayed from memory, atomics from the saved result without executing again), RNR NAKs
//! and the NAKs that put the QP in error.
//!
//! Memory is reached through [`Memory`], which the endpoint implements with the softnic's
//! own responder functions, so placement, keys and bounds are decided where the in-process
//! transport decides them.

use super::packet::{opcode, psn, Aeth, Header, Packet, Syndrome};
use super::DropReason;
use crate::softnic::transport::{AtomicOp, Nak};
use std::collections::VecDeque;

/// The largest RDMA message a RETH may describe (IBTA C9-94: 2^31).
const MAX_DMA: u32 = 1 << 31;

/// What the responder does to the QP's memory and receive queue.
pub trait Memory {
    /// Check that `len` bytes at `va` may be written with `rkey` (a WRITE's whole message,
    /// before its first packet is placed).
    fn check_write(&mut self, va: u64, rkey: u32, len: u32) -> Result<(), Nak>;
    /// Place WRITE bytes; with `imm`, consume a receive and complete it.
    fn write(&mut self, va: u64, rkey: u32, data: &[u8], imm: Option<u32>) -> Result<(), Nak>;
    /// Consume a receive and complete it for a WRITE with immediate of `len` bytes whose
    /// data is already placed.
    fn complete_imm(&mut self, len: u32, imm: u32) -> Result<(), Nak>;
    /// Deliver a whole SEND into the next receive.
    fn send(&mut self, data: &[u8], imm: Option<u32>) -> Result<(), Nak>;
    /// Read `out.len()` bytes at `va`.
    fn read(&mut self, va: u64, rkey: u32, out: &mut [u8]) -> Result<(), Nak>;
    /// Run an atomic on the 8 bytes at `va`, returning the original value.
    fn atomic(&mut self, va: u64, rkey: u32, op: AtomicOp) -> Result<u64, Nak>;
    /// The room of the next receive (the bytes its scatter list takes), if one is posted
    /// (and enabled) for a SEND or WRITE-with-immediate.
    fn recv_room(&mut self) -> Option<u64>;
    /// Move the QP to the error state: a class C error was NAKed with `nak` (an access
    /// error or an invalid request also raises the QP's asynchronous event, as
    /// `in_process::refuse` does for every transport).
    fn fail(&mut self, nak: Nak);
}

/// A READ or atomic kept for answering its duplicates.
#[derive(Clone, Copy, Debug)]
enum Resource {
    Read {
        first: u32,
        last: u32,
        va: u64,
        rkey: u32,
        len: u32,
    },
    Atomic {
        psn: u32,
        orig: u64,
    },
}

/// A multi-packet message being received.
#[derive(Debug)]
enum Partial {
    Send {
        data: Vec<u8>,
        /// The room of the receive it will land in (taken when the message's last packet
        /// comes): gathering stops there, so a peer cannot make the responder hold more than
        /// its receive takes (a first packet and endless middles held 16 MiB a QP).
        room: u64,
    },
    Write {
        va: u64,
        rkey: u32,
        len: u32,
        done: u32,
    },
}

/// One QP's responder.
#[derive(Debug)]
pub struct Responder {
    /// The peer's QP number (replies go there).
    dest_qp: u32,
    mtu: u32,
    epsn: u32,
    msn: u32,
    min_rnr_timer: u8,
    /// A sequence NAK for the current gap went out.
    nak_sent: bool,
    partial: Option<Partial>,
    resources: VecDeque<Resource>,
    max_resources: usize,
    /// Scratch for READ data.
    scratch: Vec<u8>,
}

/// Where replies go: each is a header and its payload.
pub type Emit<'e> = dyn FnMut(&Header, &[u8]) + 'e;

impl Responder {
    /// A responder expecting `start_psn` (the peer's sq_psn) first, keeping state for
    /// `max_dest_rd_atomic` READs and atomics, answering "not ready" with `min_rnr_timer`.
    #[must_use]
    pub fn new(
        dest_qp: u32,
        mtu: u32,
        start_psn: u32,
        max_dest_rd_atomic: u8,
        min_rnr_timer: u8,
    ) -> Responder {
        Responder {
            dest_qp,
            mtu,
            epsn: start_psn & psn::MASK,
            msn: 0,
            min_rnr_timer: min_rnr_timer & 31,
            nak_sent: false,
            partial: None,
            resources: VecDeque::new(),
            max_resources: usize::from(max_dest_rd_atomic),
            scratch: Vec::new(),
        }
    }

    /// The PSN the responder expects next.
    #[cfg(test)]
    #[must_use]
    pub fn expected_psn(&self) -> u32 {
        self.epsn
    }

    fn ack(&self, psn: u32, syndrome: u8) -> Header {
        let mut h = Header::new(opcode::ACKNOWLEDGE, self.dest_qp, psn);
        h.aeth = Some(Aeth {
            syndrome,
            msn: self.msn,
        });
        h
    }

    fn keep(&mut self, r: Resource) {
        if self.resources.len() >= self.max_resources {
            self.resources.pop_front();
        }
        self.resources.push_back(r);
    }

    /// Take one request packet. Replies go to `emit`; `Err` says why it was dropped without
    /// one. A class C error NAKs and calls [`Memory::fail`].
    pub fn handle(
        &mut self,
        p: &Packet<'_>,
        mem: &mut dyn Memory,
        emit: &mut Emit<'_>,
    ) -> Result<(), DropReason> {
        let h = &p.header;
        let d = psn::diff(h.psn, self.epsn);
        if d > 0 {
            if self.nak_sent {
                return Err(DropReason::OutOfSequence);
            }
            self.nak_sent = true;
            emit(&self.ack(self.epsn, Syndrome::NAK_SEQUENCE), &[]);
            return Ok(());
        }
        if d < 0 {
            return self.duplicate(p, mem, emit);
        }
        self.nak_sent = false;
        match self.execute(p, mem, emit) {
            Ok(()) => Ok(()),
            Err(Nak::ReceiverNotReady) => {
                emit(&self.ack(h.psn, 0x20 | self.min_rnr_timer), &[]);
                Ok(())
            }
            Err(Nak::NoResponse | Nak::RnrRetryExceeded) => Err(DropReason::QpInError),
            Err(nak) => {
                let code = match nak {
                    Nak::RemoteAccess(_) => Syndrome::NAK_ACCESS,
                    Nak::RemoteOperation => Syndrome::NAK_OPERATION,
                    _ => Syndrome::NAK_INVALID,
                };
                emit(&self.ack(h.psn, code), &[]);
                self.partial = None;
                mem.fail(nak);
                Ok(())
            }
        }
    }

    /// A packet at the expected PSN.
    fn execute(
        &mut self,
        p: &Packet<'_>,
        mem: &mut dyn Memory,
        emit: &mut Emit<'_>,
    ) -> Result<(), Nak> {
        use opcode::*;
        let h = &p.header;
        let n = u32::try_from(p.payload.len()).map_err(|_| Nak::RemoteInvalid)?;
        let mtu = self.mtu;
        // Opcode sequence: a message in progress admits only its own MIDDLE / LAST.
        let continues = matches!(
            h.opcode,
            SEND_MIDDLE
                | SEND_LAST
                | SEND_LAST_IMM
                | SEND_LAST_INV
                | WRITE_MIDDLE
                | WRITE_LAST
                | WRITE_LAST_IMM
        );
        match (&self.partial, continues) {
            (None, true) | (Some(_), false) => return Err(Nak::RemoteInvalid),
            (Some(Partial::Send { .. }), true) if h.opcode >= WRITE_FIRST => {
                return Err(Nak::RemoteInvalid)
            }
            (Some(Partial::Write { .. }), true) if h.opcode < WRITE_FIRST => {
                return Err(Nak::RemoteInvalid)
            }
            _ => {}
        }
        let ends_message =
            |op: u8| !matches!(op, SEND_FIRST | SEND_MIDDLE | WRITE_FIRST | WRITE_MIDDLE);
        match h.opcode {
            SEND_FIRST | SEND_MIDDLE => {
                if n != mtu {
                    return Err(Nak::RemoteInvalid);
                }
                if h.opcode == SEND_FIRST {
                    let room = mem.recv_room().ok_or(Nak::ReceiverNotReady)?;
                    self.partial = Some(Partial::Send {
                        data: Vec::new(),
                        room: room.min(crate::softnic::MAX_MESSAGE),
                    });
                }
                if let Some(Partial::Send { data, room }) = &mut self.partial {
                    data.extend_from_slice(p.payload);
                    if data.len() as u64 > *room {
                        // Longer than its receive: placing it now fails as the whole
                        // message's placement would (the receive completes in error and
                        // the QP goes to error), with at most a packet more than the
                        // receive held.
                        let over = std::mem::take(data);
                        self.partial = None;
                        mem.send(&over, None)?;
                        return Err(Nak::RemoteInvalid);
                    }
                }
            }
            SEND_LAST | SEND_LAST_IMM | SEND_ONLY | SEND_ONLY_IMM => {
                let min = u32::from(matches!(h.opcode, SEND_LAST | SEND_LAST_IMM));
                if n < min || n > mtu {
                    return Err(Nak::RemoteInvalid);
                }
                match &mut self.partial {
                    Some(Partial::Send { data, .. }) => {
                        let keep = data.len();
                        data.extend_from_slice(p.payload);
                        let r = mem.send(data, h.imm);
                        if r.is_err() {
                            // An RNR resends this LAST: take its bytes off again.
                            data.truncate(keep);
                        }
                        r?;
                    }
                    _ => mem.send(p.payload, h.imm)?,
                }
                self.partial = None;
            }
            SEND_LAST_INV | SEND_ONLY_INV => return Err(Nak::RemoteInvalid),
            WRITE_FIRST | WRITE_ONLY | WRITE_ONLY_IMM => {
                let r = h.reth.ok_or(Nak::RemoteInvalid)?;
                if r.len > MAX_DMA {
                    return Err(Nak::RemoteInvalid);
                }
                if h.opcode == WRITE_FIRST {
                    if n != mtu || r.len <= mtu {
                        return Err(Nak::RemoteInvalid);
                    }
                    mem.check_write(r.va, r.rkey, r.len)?;
                    mem.write(r.va, r.rkey, p.payload, None)?;
                    self.partial = Some(Partial::Write {
                        va: r.va,
                        rkey: r.rkey,
                        len: r.len,
                        done: n,
                    });
                } else {
                    if n != r.len || n > mtu {
                        return Err(Nak::RemoteInvalid);
                    }
                    if n > 0 || h.imm.is_some() {
                        mem.write(r.va, r.rkey, p.payload, h.imm)?;
                    }
                }
            }
            WRITE_MIDDLE | WRITE_LAST | WRITE_LAST_IMM => {
                let Some(Partial::Write {
                    va,
                    rkey,
                    len,
                    done,
                }) = self.partial
                else {
                    return Err(Nak::RemoteInvalid);
                };
                let rest = len - done;
                let ok = if h.opcode == WRITE_MIDDLE {
                    n == mtu && rest > mtu
                } else {
                    n == rest && n >= 1 && n <= mtu
                };
                if !ok {
                    return Err(Nak::RemoteInvalid);
                }
                mem.write(va.wrapping_add(u64::from(done)), rkey, p.payload, None)?;
                if h.opcode == WRITE_LAST_IMM {
                    // After the data: a receive completed means the whole message is there.
                    mem.complete_imm(len, h.imm.unwrap_or(0))?;
                }
                self.partial = if h.opcode == WRITE_MIDDLE {
                    Some(Partial::Write {
                        va,
                        rkey,
                        len,
                        done: done + n,
                    })
                } else {
                    None
                };
            }
            READ_REQUEST => {
                let r = h.reth.ok_or(Nak::RemoteInvalid)?;
                // No responder resources: this QP takes no READs (IBA: invalid request).
                if self.max_resources == 0 {
                    return Err(Nak::RemoteInvalid);
                }
                if r.len > MAX_DMA || u64::from(r.len) > crate::softnic::MAX_MESSAGE {
                    return Err(Nak::RemoteInvalid);
                }
                let npsn = r.len.div_ceil(mtu).max(1);
                self.scratch.resize(r.len as usize, 0);
                let mut buf = std::mem::take(&mut self.scratch);
                let read = if r.len == 0 {
                    Ok(())
                } else {
                    mem.read(r.va, r.rkey, &mut buf)
                };
                if let Err(e) = read {
                    self.scratch = buf;
                    return Err(e);
                }
                // The MSN counts a READ when it is accepted (C9-148).
                self.msn = psn::add(self.msn, 1);
                self.keep(Resource::Read {
                    first: h.psn,
                    last: psn::add(h.psn, npsn - 1),
                    va: r.va,
                    rkey: r.rkey,
                    len: r.len,
                });
                self.respond_read(h.psn, true, &buf, emit);
                self.scratch = buf;
                self.epsn = psn::add(h.psn, npsn);
                return Ok(());
            }
            COMPARE_SWAP | FETCH_ADD => {
                let a = h.atomic.ok_or(Nak::RemoteInvalid)?;
                if self.max_resources == 0 {
                    return Err(Nak::RemoteInvalid);
                }
                if a.va % 8 != 0 {
                    return Err(Nak::RemoteInvalid);
                }
                let op = if h.opcode == COMPARE_SWAP {
                    AtomicOp::CompareSwap {
                        compare: a.compare,
                        swap: a.swap_add,
                    }
                } else {
                    AtomicOp::FetchAdd { add: a.swap_add }
                };
                let orig = mem.atomic(a.va, a.rkey, op)?;
                self.msn = psn::add(self.msn, 1);
                self.keep(Resource::Atomic { psn: h.psn, orig });
                self.atomic_ack(h.psn, orig, emit);
                self.epsn = psn::add(h.psn, 1);
                return Ok(());
            }
            _ => return Err(Nak::RemoteInvalid),
        }
        if ends_message(h.opcode) {
            self.msn = psn::add(self.msn, 1);
        }
        self.epsn = psn::add(h.psn, 1);
        if h.ack_req {
            emit(&self.ack(h.psn, Syndrome::ACK), &[]);
        }
        Ok(())
    }

    fn atomic_ack(&self, psn: u32, orig: u64, emit: &mut Emit<'_>) {
        let mut a = Header::new(opcode::ATOMIC_ACKNOWLEDGE, self.dest_qp, psn);
        a.aeth = Some(Aeth {
            syndrome: Syndrome::ACK,
            msn: self.msn,
        });
        a.atomic_ack = Some(orig);
        emit(&a, &[]);
    }

    /// READ response packets for `data` from `first`: FIRST..LAST or ONLY when `from_start`,
    /// otherwise MIDDLE..LAST (a replay from inside the original response).
    fn respond_read(&self, first: u32, from_start: bool, data: &[u8], emit: &mut Emit<'_>) {
        let mtu = self.mtu as usize;
        let n = data.len().div_ceil(mtu).max(1);
        for k in 0..n {
            let chunk = &data[(k * mtu).min(data.len())..((k + 1) * mtu).min(data.len())];
            let op = match (n == 1, k == 0, k + 1 == n) {
                (true, ..) if from_start => opcode::READ_RESPONSE_ONLY,
                (true, ..) => opcode::READ_RESPONSE_LAST,
                (false, true, _) if from_start => opcode::READ_RESPONSE_FIRST,
                (false, _, true) => opcode::READ_RESPONSE_LAST,
                _ => opcode::READ_RESPONSE_MIDDLE,
            };
            // k < n <= 2^31 / 256.
            let mut h = Header::new(
                op,
                self.dest_qp,
                psn::add(first, u32::try_from(k).unwrap_or(0)),
            );
            if op != opcode::READ_RESPONSE_MIDDLE {
                h.aeth = Some(Aeth {
                    syndrome: Syndrome::ACK,
                    msn: self.msn,
                });
            }
            emit(&h, chunk);
        }
    }

    /// A request behind the expected PSN.
    fn duplicate(
        &mut self,
        p: &Packet<'_>,
        mem: &mut dyn Memory,
        emit: &mut Emit<'_>,
    ) -> Result<(), DropReason> {
        let h = &p.header;
        match h.opcode {
            opcode::READ_REQUEST => {
                let r = h.reth.ok_or(DropReason::StaleDuplicate)?;
                let found = self.resources.iter().rev().find_map(|res| match *res {
                    Resource::Read {
                        first,
                        last,
                        va,
                        rkey,
                        len,
                    } if psn::diff(h.psn, first) >= 0 && psn::diff(h.psn, last) <= 0 => {
                        Some((first, va, rkey, len))
                    }
                    _ => None,
                });
                let (first, va, rkey, len) = found.ok_or(DropReason::StaleDuplicate)?;
                // The re-request must ask for a tail of the original from a packet boundary.
                let off = r.va.wrapping_sub(va);
                let k = u64::from(psn::diff(h.psn, first).unsigned_abs());
                if r.rkey != rkey
                    || off != k * u64::from(self.mtu)
                    || off + u64::from(r.len) != u64::from(len)
                {
                    return Err(DropReason::StaleDuplicate);
                }
                let mut buf = std::mem::take(&mut self.scratch);
                buf.resize(r.len as usize, 0);
                let ok = r.len == 0 || mem.read(r.va, r.rkey, &mut buf).is_ok();
                if ok {
                    self.respond_read(h.psn, h.psn == first, &buf, emit);
                }
                self.scratch = buf;
                if ok {
                    Ok(())
                } else {
                    Err(DropReason::StaleDuplicate)
                }
            }
            opcode::COMPARE_SWAP | opcode::FETCH_ADD => {
                let orig = self.resources.iter().rev().find_map(|res| match *res {
                    Resource::Atomic { psn, orig } if psn == h.psn => Some(orig),
                    _ => None,
                });
                let orig = orig.ok_or(DropReason::StaleDuplicate)?;
                self.atomic_ack(h.psn, orig, emit);
                Ok(())
            }
            _ => {
                // SEND / WRITE: not again; acknowledge what has arrived (C9-105).
                emit(
                    &self.ack(psn::add(self.epsn, psn::MASK), Syndrome::ACK),
                    &[],
                );
                Ok(())
            }
        }
    }
}

#[cfg(test)]
// Test data is made of byte patterns: narrowing an index to a byte is the point.
#[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
mod tests {
    use super::*;
    use crate::mem::AccessFault;
    use crate::softnic::roce::packet::{AtomicEth, Reth};

    /// Memory of 4 KiB at address 0x1000 with rkey 7, a count of receives (each of
    /// `recv_len` bytes), and a log.
    struct Fake {
        mem: Vec<u8>,
        recvs: usize,
        recv_len: u64,
        sends: Vec<(Vec<u8>, Option<u32>)>,
        write_imms: Vec<u32>,
        atomics: usize,
        failed: bool,
    }

    impl Fake {
        fn new(recvs: usize) -> Fake {
            Fake {
                mem: vec![0; 4096],
                recvs,
                recv_len: 1 << 20,
                sends: vec![],
                write_imms: vec![],
                atomics: 0,
                failed: false,
            }
        }
        fn range(&self, va: u64, rkey: u32, len: usize) -> Result<usize, Nak> {
            let off = va
                .checked_sub(0x1000)
                .ok_or(Nak::RemoteAccess(AccessFault::UnknownKey(rkey)))?;
            let off = usize::try_from(off)
                .map_err(|_| Nak::RemoteAccess(AccessFault::UnknownKey(rkey)))?;
            if rkey != 7 || off + len > self.mem.len() {
                return Err(Nak::RemoteAccess(AccessFault::UnknownKey(rkey)));
            }
            Ok(off)
        }
    }

    impl Memory for Fake {
        fn check_write(&mut self, va: u64, rkey: u32, len: u32) -> Result<(), Nak> {
            self.range(va, rkey, len as usize).map(|_| ())
        }
        fn write(&mut self, va: u64, rkey: u32, data: &[u8], imm: Option<u32>) -> Result<(), Nak> {
            let off = self.range(va, rkey, data.len())?;
            if let Some(i) = imm {
                if self.recvs == 0 {
                    return Err(Nak::ReceiverNotReady);
                }
                self.recvs -= 1;
                self.write_imms.push(i);
            }
            self.mem[off..off + data.len()].copy_from_slice(data);
            Ok(())
        }
        fn complete_imm(&mut self, len: u32, imm: u32) -> Result<(), Nak> {
            if self.recvs == 0 {
                return Err(Nak::ReceiverNotReady);
            }
            self.recvs -= 1;
            self.write_imms.push(imm ^ len);
            Ok(())
        }
        fn send(&mut self, data: &[u8], imm: Option<u32>) -> Result<(), Nak> {
            if self.recvs == 0 {
                return Err(Nak::ReceiverNotReady);
            }
            self.recvs -= 1;
            if data.len() as u64 > self.recv_len {
                // As `in_process::consume_recv`: the receive completes in error.
                self.failed = true;
                return Err(Nak::RemoteInvalid);
            }
            self.sends.push((data.to_vec(), imm));
            Ok(())
        }
        fn read(&mut self, va: u64, rkey: u32, out: &mut [u8]) -> Result<(), Nak> {
            let off = self.range(va, rkey, out.len())?;
            out.copy_from_slice(&self.mem[off..off + out.len()]);
            Ok(())
        }
        fn atomic(&mut self, va: u64, rkey: u32, op: AtomicOp) -> Result<u64, Nak> {
            let off = self.range(va, rkey, 8)?;
            self.atomics += 1;
            let old = u64::from_le_bytes(self.mem[off..off + 8].try_into().unwrap());
            if let Some(new) = op.apply(old) {
                self.mem[off..off + 8].copy_from_slice(&new.to_le_bytes());
            }
            Ok(old)
        }
        fn recv_room(&mut self) -> Option<u64> {
            (self.recvs > 0).then_some(self.recv_len)
        }
        fn fail(&mut self, _nak: Nak) {
            self.failed = true;
        }
    }

    type Ran = (Result<(), DropReason>, Vec<(Header, Vec<u8>)>);

    fn run(r: &mut Responder, m: &mut Fake, h: Header, payload: &[u8]) -> Ran {
        let mut out = Vec::new();
        let res = r.handle(
            &Packet { header: h, payload },
            m,
            &mut |h: &Header, d: &[u8]| out.push((*h, d.to_vec())),
        );
        (res, out)
    }

    fn req(op: u8, psn: u32, ack: bool) -> Header {
        let mut h = Header::new(op, 5, psn);
        h.ack_req = ack;
        h
    }

    fn syn(out: &[(Header, Vec<u8>)]) -> Vec<(u8, u32, u8)> {
        out.iter()
            .map(|(h, _)| (h.opcode, h.psn, h.aeth.map_or(0, |a| a.syndrome)))
            .collect()
    }

    #[test]
    fn in_order_sends_are_reassembled_and_acked_when_asked() {
        let mut r = Responder::new(9, 256, 0xff_fffe, 4, 12);
        let mut m = Fake::new(1);
        let data: Vec<u8> = (0..600u32).map(|i| i as u8).collect();
        let (res, out) = run(
            &mut r,
            &mut m,
            req(opcode::SEND_FIRST, 0xff_fffe, false),
            &data[..256],
        );
        assert_eq!(
            (res, out.len()),
            (Ok(()), 0),
            "no AckReq, no ACK (coalesced)"
        );
        run(
            &mut r,
            &mut m,
            req(opcode::SEND_MIDDLE, 0xff_ffff, false),
            &data[256..512],
        )
        .0
        .unwrap();
        let mut last = req(opcode::SEND_LAST_IMM, 0, true);
        last.imm = Some(0xabcd);
        let (_, out) = run(&mut r, &mut m, last, &data[512..]);
        assert_eq!(syn(&out), [(opcode::ACKNOWLEDGE, 0, 0x1f)]);
        assert_eq!(out[0].0.aeth.unwrap().msn, 1);
        assert_eq!(out[0].0.dest_qp, 9);
        assert_eq!(m.sends, [(data, Some(0xabcd))]);
        assert_eq!(r.expected_psn(), 1);
    }

    #[test]
    fn a_send_longer_than_its_receive_is_refused_at_the_packet_that_overflows_it() {
        // A 600-byte receive: FIRST and MIDDLE (512 bytes) fit; the second MIDDLE does not.
        let mut r = Responder::new(9, 256, 0, 4, 12);
        let mut m = Fake::new(2);
        m.recv_len = 600;
        for (psn, op) in [(0, opcode::SEND_FIRST), (1, opcode::SEND_MIDDLE)] {
            let (res, out) = run(&mut r, &mut m, req(op, psn, false), &[7; 256]);
            assert_eq!((res, out.len()), (Ok(()), 0), "{op:#x}: within the receive");
        }
        assert!(!m.failed);
        let (res, out) = run(
            &mut r,
            &mut m,
            req(opcode::SEND_MIDDLE, 2, false),
            &[7; 256],
        );
        assert_eq!(res, Ok(()), "answered");
        assert_eq!(
            syn(&out),
            [(opcode::ACKNOWLEDGE, 2, 0x61)],
            "invalid request"
        );
        assert!(m.failed, "the QP goes to error");
        assert_eq!(
            m.recvs, 1,
            "the receive was consumed (its error completion)"
        );
        assert!(m.sends.is_empty(), "nothing delivered");
        // A message of exactly the receive's room is delivered.
        let mut r = Responder::new(9, 256, 0, 4, 12);
        let mut m = Fake::new(1);
        m.recv_len = 512;
        run(&mut r, &mut m, req(opcode::SEND_FIRST, 0, false), &[1; 256])
            .0
            .unwrap();
        let (_, out) = run(&mut r, &mut m, req(opcode::SEND_LAST, 1, true), &[2; 256]);
        assert_eq!(syn(&out), [(opcode::ACKNOWLEDGE, 1, 0x1f)]);
        assert_eq!(m.sends.len(), 1);
        assert_eq!(m.sends[0].0.len(), 512);
        // No receive posted at the first packet: RNR, nothing kept.
        let mut r = Responder::new(9, 256, 0, 4, 12);
        let mut m = Fake::new(0);
        let (_, out) = run(&mut r, &mut m, req(opcode::SEND_FIRST, 0, false), &[1; 256]);
        assert_eq!(out.len(), 1);
        assert_eq!(
            out[0].0.aeth.map(|a| a.syndrome & 0xe0),
            Some(0x20),
            "RNR NAK"
        );
    }

    #[test]
    fn a_gap_is_naked_once_and_duplicates_are_re_acked() {
        let mut r = Responder::new(9, 256, 10, 4, 12);
        let mut m = Fake::new(8);
        let (_, out) = run(&mut r, &mut m, req(opcode::SEND_ONLY, 12, true), b"x");
        assert_eq!(
            syn(&out),
            [(opcode::ACKNOWLEDGE, 10, 0x60)],
            "NAK with the expected PSN"
        );
        let (res, out) = run(&mut r, &mut m, req(opcode::SEND_ONLY, 13, true), b"x");
        assert_eq!(
            (res, out.len()),
            (Err(DropReason::OutOfSequence), 0),
            "one NAK per gap"
        );
        run(&mut r, &mut m, req(opcode::SEND_ONLY, 10, false), b"a")
            .0
            .unwrap();
        run(&mut r, &mut m, req(opcode::SEND_ONLY, 11, false), b"b")
            .0
            .unwrap();
        // A duplicate SEND is not delivered again; the ACK names the newest PSN taken.
        let (_, out) = run(&mut r, &mut m, req(opcode::SEND_ONLY, 10, false), b"a");
        assert_eq!(syn(&out), [(opcode::ACKNOWLEDGE, 11, 0x1f)]);
        assert_eq!(m.sends.len(), 2);
        // A new gap gets a new NAK.
        let (_, out) = run(&mut r, &mut m, req(opcode::SEND_ONLY, 14, true), b"x");
        assert_eq!(syn(&out), [(opcode::ACKNOWLEDGE, 12, 0x60)]);
    }

    #[test]
    fn no_receive_gets_an_rnr_nak_and_the_retry_is_taken() {
        let mut r = Responder::new(9, 256, 0, 4, 14);
        let mut m = Fake::new(0);
        let (_, out) = run(&mut r, &mut m, req(opcode::SEND_ONLY, 0, true), b"hi");
        assert_eq!(syn(&out), [(opcode::ACKNOWLEDGE, 0, 0x20 | 14)]);
        assert_eq!(r.expected_psn(), 0, "not accepted");
        assert!(!m.failed, "RNR is no error");
        m.recvs = 1;
        let (_, out) = run(&mut r, &mut m, req(opcode::SEND_ONLY, 0, true), b"hi");
        assert_eq!(syn(&out), [(opcode::ACKNOWLEDGE, 0, 0x1f)]);
    }

    #[test]
    fn writes_are_placed_by_packet_and_checked_whole() {
        let mut r = Responder::new(9, 256, 0, 4, 1);
        let mut m = Fake::new(1);
        let data: Vec<u8> = (0..300u32).map(|i| (i * 3) as u8).collect();
        let mut first = req(opcode::WRITE_FIRST, 0, false);
        first.reth = Some(Reth {
            va: 0x1010,
            rkey: 7,
            len: 300,
        });
        run(&mut r, &mut m, first, &data[..256]).0.unwrap();
        let mut last = req(opcode::WRITE_LAST_IMM, 1, true);
        last.imm = Some(77);
        let (_, out) = run(&mut r, &mut m, last, &data[256..]);
        assert_eq!(syn(&out), [(opcode::ACKNOWLEDGE, 1, 0x1f)]);
        assert_eq!(&m.mem[0x10..0x10 + 300], &data[..]);
        assert_eq!(m.write_imms, [77 ^ 300], "completed with the whole length");
        // A WRITE whose whole range does not fit is refused before any byte lands.
        let mut m2 = Fake::new(0);
        let mut r2 = Responder::new(9, 256, 0, 4, 1);
        let mut first = req(opcode::WRITE_FIRST, 0, false);
        first.reth = Some(Reth {
            va: 0x1000 + 4000,
            rkey: 7,
            len: 512,
        });
        let (_, out) = run(&mut r2, &mut m2, first, &[1; 256]);
        assert_eq!(syn(&out), [(opcode::ACKNOWLEDGE, 0, 0x62)]);
        assert!(m2.failed && m2.mem.iter().all(|&b| b == 0));
    }

    #[test]
    fn length_and_sequence_violations_are_invalid_requests() {
        for (op, psn_, payload, partial) in [
            (opcode::SEND_MIDDLE, 0, 256usize, false), // MIDDLE with no FIRST
            (opcode::SEND_FIRST, 0, 100, false),       // FIRST shorter than the MTU
            (opcode::SEND_ONLY, 0, 257, false),        // ONLY longer than the MTU
            (opcode::WRITE_MIDDLE, 1, 256, true),      // WRITE in a SEND
            (opcode::SEND_ONLY, 1, 4, true),           // new message inside one
            (opcode::SEND_ONLY_INV, 0, 4, false),      // not supported
        ] {
            let mut r = Responder::new(9, 256, 0, 4, 1);
            let mut m = Fake::new(4);
            if partial {
                run(&mut r, &mut m, req(opcode::SEND_FIRST, 0, false), &[0; 256])
                    .0
                    .unwrap();
            }
            let (_, out) = run(&mut r, &mut m, req(op, psn_, false), &vec![0; payload]);
            assert_eq!(syn(&out), [(opcode::ACKNOWLEDGE, psn_, 0x61)], "{op:#x}");
            assert!(m.failed);
        }
    }

    #[test]
    fn reads_respond_in_packets_and_replay_from_memory() {
        let mut r = Responder::new(9, 256, 0, 4, 1);
        let mut m = Fake::new(0);
        for (i, b) in m.mem.iter_mut().enumerate() {
            *b = (i % 251) as u8;
        }
        let mut rd = req(opcode::READ_REQUEST, 0, true);
        rd.reth = Some(Reth {
            va: 0x1000,
            rkey: 7,
            len: 600,
        });
        let (_, out) = run(&mut r, &mut m, rd, &[]);
        assert_eq!(
            out.iter()
                .map(|(h, d)| (h.opcode, h.psn, d.len()))
                .collect::<Vec<_>>(),
            [
                (opcode::READ_RESPONSE_FIRST, 0, 256),
                (opcode::READ_RESPONSE_MIDDLE, 1, 256),
                (opcode::READ_RESPONSE_LAST, 2, 88)
            ]
        );
        assert_eq!(r.expected_psn(), 3);
        // A re-request from the middle replays MIDDLE, LAST with memory as it is now.
        m.mem[300] = 0xee;
        let mut again = req(opcode::READ_REQUEST, 1, true);
        again.reth = Some(Reth {
            va: 0x1100,
            rkey: 7,
            len: 344,
        });
        let (_, out) = run(&mut r, &mut m, again, &[]);
        assert_eq!(
            out.iter()
                .map(|(h, _)| (h.opcode, h.psn))
                .collect::<Vec<_>>(),
            [
                (opcode::READ_RESPONSE_MIDDLE, 1),
                (opcode::READ_RESPONSE_LAST, 2)
            ]
        );
        assert_eq!(out[0].1[300 - 256], 0xee);
        // A re-request that does not match the saved READ is dropped silently.
        let mut bogus = req(opcode::READ_REQUEST, 1, true);
        bogus.reth = Some(Reth {
            va: 0x1104,
            rkey: 7,
            len: 340,
        });
        assert_eq!(
            run(&mut r, &mut m, bogus, &[]).0,
            Err(DropReason::StaleDuplicate)
        );
        // A READ outside the region is a remote access error.
        let mut far = req(opcode::READ_REQUEST, 3, true);
        far.reth = Some(Reth {
            va: 0x1000 + 4090,
            rkey: 7,
            len: 16,
        });
        let (_, out) = run(&mut r, &mut m, far, &[]);
        assert_eq!(syn(&out), [(opcode::ACKNOWLEDGE, 3, 0x62)]);
    }

    #[test]
    fn a_duplicate_atomic_returns_the_saved_value_without_running_again() {
        let mut r = Responder::new(9, 256, 0, 2, 1);
        let mut m = Fake::new(0);
        m.mem[8..16].copy_from_slice(&5u64.to_le_bytes());
        let mut fa = req(opcode::FETCH_ADD, 0, true);
        fa.atomic = Some(AtomicEth {
            va: 0x1008,
            rkey: 7,
            swap_add: 10,
            compare: 0,
        });
        let (_, out) = run(&mut r, &mut m, fa, &[]);
        assert_eq!(
            (out[0].0.opcode, out[0].0.atomic_ack),
            (opcode::ATOMIC_ACKNOWLEDGE, Some(5))
        );
        let (_, out) = run(&mut r, &mut m, fa, &[]);
        assert_eq!(out[0].0.atomic_ack, Some(5), "the saved original");
        assert_eq!(
            (
                m.atomics,
                u64::from_le_bytes(m.mem[8..16].try_into().unwrap())
            ),
            (1, 15)
        );
        // The resource ring keeps max_dest_rd_atomic entries: the oldest is forgotten.
        for p in 1..3 {
            let mut fa = req(opcode::FETCH_ADD, p, true);
            fa.atomic = Some(AtomicEth {
                va: 0x1008,
                rkey: 7,
                swap_add: 1,
                compare: 0,
            });
            run(&mut r, &mut m, fa, &[]).0.unwrap();
        }
        assert_eq!(
            run(&mut r, &mut m, fa, &[]).0,
            Err(DropReason::StaleDuplicate)
        );
        assert_eq!(m.atomics, 3);
        // A QP with no responder resources takes no READs or atomics.
        let mut r0 = Responder::new(9, 256, 0, 0, 1);
        let mut m0 = Fake::new(0);
        let mut fa0 = req(opcode::FETCH_ADD, 0, true);
        fa0.atomic = fa.atomic;
        let (_, out) = run(&mut r0, &mut m0, fa0, &[]);
        assert_eq!(syn(&out), [(opcode::ACKNOWLEDGE, 0, 0x61)]);
        assert_eq!(m0.atomics, 0);
        // Misaligned: invalid request.
        let mut bad = req(opcode::COMPARE_SWAP, 3, true);
        bad.atomic = Some(AtomicEth {
            va: 0x1004,
            rkey: 7,
            swap_add: 1,
            compare: 0,
        });
        let (_, out) = run(&mut r, &mut m, bad, &[]);
        assert_eq!(syn(&out), [(opcode::ACKNOWLEDGE, 3, 0x61)]);
    }
}
