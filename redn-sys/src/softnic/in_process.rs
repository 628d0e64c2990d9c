//! The in-process transport: a requester reaches a responder queue of this process (of the
//! same softnic, or of another softnic instance) and the request is served at once on the
//! requester's thread by the responder functions here.

use super::qp::QpShared;
use super::transport::{AtomicOp, Nak, Transport};
use crate::conv::{self, small32};
use crate::mem::{KeyCache, KeyTable, Span};
use crate::nic::AsyncEvent;
use crate::types::Access;
use crate::wqe::{recv_entries, wqe_index, Cqe, CqeOpcode, RemoteAddr, Syndrome};
use crate::QpState;
use std::any::Any;
use std::sync::atomic::Ordering;
use std::sync::Arc;

/// A peer in the same process: the responder's QP and its NIC's key table.
pub(crate) struct InProcess {
    pub(crate) target: Arc<QpShared>,
    pub(crate) keys: Arc<KeyTable>,
}

impl InProcess {
    fn live(&self) -> Result<&QpShared, Nak> {
        let t = &*self.target;
        if t.state() == QpState::Error || t.destroyed.load(Ordering::Relaxed) {
            return Err(Nak::NoResponse);
        }
        Ok(t)
    }
}

impl InProcess {
    /// The live target and the checked window `remote`..+`len` for `need`: the responder's
    /// key, PD, bounds and rights check, in one place for every one-sided operation.
    #[inline(always)]
    fn remote_span<'k>(
        &self,
        keys: &'k mut KeyCache,
        remote: RemoteAddr,
        len: u64,
        need: Access,
    ) -> Result<(&QpShared, Span<'k>), Nak> {
        let t = self.live()?;
        let span = keys
            .get(&self.keys, remote.rkey.0)
            .and_then(|r| r.check(t.pd, remote.addr, len, need))
            .map_err(|fault| refuse(t, Nak::RemoteAccess(fault)))?;
        Ok((t, span))
    }

    /// As [`Self::remote_span`], without saying why not: the executor's fast path leaves
    /// refused requests to the general path, which reports them. (Taking `remote_span(..).ok()`
    /// instead costs ~40 instructions a WRITE: the `Result` carries the NAK's fault details.)
    /// Also returns the region's index in `keys`, for [`Self::live_epoch`].
    #[inline(always)]
    pub(crate) fn remote_window<'k>(
        &self,
        keys: &'k mut KeyCache,
        remote: RemoteAddr,
        len: u64,
        need: Access,
    ) -> Option<(usize, Span<'k>)> {
        let t = self.live().ok()?;
        let i = keys.find(&self.keys, remote.rkey.0).ok()?;
        let span = keys.region_at(i)?.window(t.pd, remote.addr, len, need)?;
        Some((i, span))
    }

    /// True while the target is live and `keys` (this peer's key cache) current: what
    /// [`Self::live_epoch`] tests, for a caller that already holds the epoch.
    #[inline(always)]
    pub(crate) fn still_current(&self, keys: &KeyCache) -> bool {
        self.live().is_ok() && keys.is_current(&self.keys)
    }

    /// The epoch under which indices `remote_window` returned from `keys` are still good
    /// ([`KeyCache::current_epoch`]), or [`KeyCache::STALE`] once the target is no longer
    /// live: what a window resolved earlier needs re-checked before it is used again.
    #[inline(always)]
    pub(crate) fn live_epoch(&self, keys: &KeyCache) -> u64 {
        match self.live() {
            Ok(_) => keys.current_epoch(&self.keys),
            Err(_) => KeyCache::STALE,
        }
    }

    /// Place a WRITE's `len` bytes with `put`. WRITE_IMM consumes a receive first, so an RNR
    /// leaves memory untouched; its data goes to the RDMA address, so the receive needs no
    /// room for it.
    #[inline(always)]
    fn place_write(
        &self,
        t: &QpShared,
        len: usize,
        imm: Option<u32>,
        put: impl FnOnce(),
    ) -> Result<(), Nak> {
        match imm {
            None => {
                put();
                Ok(())
            }
            Some(imm) => consume_recv(t, 0, |_| {
                put();
                Ok(())
            })
            .map(|idx| complete_recv(t, CqeOpcode::RespWriteImm, idx, len, imm)),
        }
    }
}

impl InProcess {
    /// Complete a WRITE with immediate of `len` bytes whose data is already placed (a
    /// network responder places a long WRITE packet by packet): consume a receive and
    /// complete it, as `write` does after placing.
    pub(crate) fn complete_write_imm(&self, len: usize, imm: u32) -> Result<(), Nak> {
        let t = self.live()?;
        self.place_write(t, len, Some(imm), || {})
    }
}

impl Transport for InProcess {
    fn into_any(self: Arc<Self>) -> Arc<dyn Any + Send + Sync> {
        self
    }

    #[inline]
    fn write(
        &self,
        keys: &mut KeyCache,
        remote: RemoteAddr,
        data: &[u8],
        imm: Option<u32>,
        _ack: bool,
    ) -> Result<(), Nak> {
        let (t, span) = self.remote_span(keys, remote, data.len() as u64, Access::REMOTE_WRITE)?;
        self.place_write(t, data.len(), imm, || span.write(data))
    }

    #[inline]
    fn write_from(
        &self,
        keys: &mut KeyCache,
        remote: RemoteAddr,
        src: &Span<'_>,
        imm: Option<u32>,
        _ack: bool,
    ) -> Result<(), Nak> {
        let (t, span) = self.remote_span(keys, remote, src.len as u64, Access::REMOTE_WRITE)?;
        self.place_write(t, src.len, imm, || span.copy_from(src))
    }

    #[inline]
    fn read_into(
        &self,
        keys: &mut KeyCache,
        remote: RemoteAddr,
        dst: &Span<'_>,
    ) -> Result<(), Nak> {
        let (_, span) = self.remote_span(keys, remote, dst.len as u64, Access::REMOTE_READ)?;
        dst.copy_from(&span);
        Ok(())
    }

    fn send(
        &self,
        _keys: &mut KeyCache,
        data: &[u8],
        imm: Option<u32>,
        _ack: bool,
    ) -> Result<(), Nak> {
        let t = self.live()?;
        let idx = consume_recv(t, data.len(), |slot| scatter(t, &self.keys, slot, data))?;
        let op = if imm.is_some() {
            CqeOpcode::RespSendImm
        } else {
            CqeOpcode::RespSend
        };
        complete_recv(t, op, idx, data.len(), imm.unwrap_or(0));
        Ok(())
    }

    #[inline]
    fn read(&self, keys: &mut KeyCache, remote: RemoteAddr, out: &mut [u8]) -> Result<(), Nak> {
        let (_, span) = self.remote_span(keys, remote, out.len() as u64, Access::REMOTE_READ)?;
        span.read(out);
        Ok(())
    }

    #[inline]
    fn atomic(&self, keys: &mut KeyCache, remote: RemoteAddr, op: AtomicOp) -> Result<u64, Nak> {
        if remote.addr.0 % 8 != 0 {
            let t = self.live()?;
            return Err(refuse(t, Nak::RemoteInvalid));
        }
        let (_, span) = self.remote_span(keys, remote, 8, Access::REMOTE_ATOMIC)?;
        Ok(span.buffer.atomic_update(span.off, |old| op.apply(old)))
    }
}

/// The responder `t` refuses a one-sided request with `nak`; returns the NAK for the
/// requester. A remote access error or an invalid request moves the responder's queue pair to
/// error, flushing its posted receives, and raises an asynchronous event its owner reads
/// (`IBV_EVENT_QP_ACCESS_ERR`, `IBV_EVENT_QP_REQ_ERR`), as on ConnectX (mlx5's
/// `MLX5_EVENT_TYPE_WQ_ACCESS_ERROR` / `WQ_INVAL_REQ_ERROR` events on the QP) and in Linux rxe
/// (`rxe_resp.c`: an RC responder that NAKs an access or invalid request moves its QP to
/// error). Every transport's responder calls this for such refusals (the RoCEv2 one too).
pub(crate) fn refuse(t: &QpShared, nak: Nak) -> Nak {
    let event = match nak {
        Nak::RemoteAccess(_) => AsyncEvent::QpAccessError(t.qpn),
        Nak::RemoteInvalid => AsyncEvent::QpRequestError(t.qpn),
        _ => return nak,
    };
    // Not counted in the QP's `errors` (no WQE of its own failed): the event reports it.
    if t.enter_error() {
        t.events.raise(event);
    }
    nak
}

/// Take the next receive of `t` (if one is posted and enabled), let `place` put the data
/// through the receive's scatter list (the bytes of its slot; none when `len` is 0), and
/// return the receive's index. On a placement failure the responder's QP goes to error
/// with an error completion for that receive, as a responder does.
/// How far `t`'s receives may be consumed: a managed receive queue consumes up to what
/// RECV_EN enabled, whatever the host posted (a NIC-resident loop re-arms the same slots,
/// their scatter lists staying in the ring); another up to what the host posted.
fn recv_limit(t: &QpShared) -> u64 {
    if t.managed_recv {
        t.rq.enabled.load(Ordering::Acquire)
    } else {
        t.rq.posted.load(Ordering::Acquire)
    }
}

/// The bytes of receive `idx`'s slot, read into `line` when it fits (a receive slot is at
/// most 16 entries; most are one or a few, and zeroing 1 KiB cost ~80 instructions a SEND)
/// or into `large`.
fn read_recv_slot<'a>(
    t: &QpShared,
    idx: u64,
    line: &'a mut [u8; 64],
    large: &'a mut Vec<u8>,
) -> &'a [u8] {
    let stride = t.rq.ring.stride;
    let slot = if stride <= line.len() {
        &mut line[..stride]
    } else {
        large.resize(stride, 0);
        &mut large[..]
    };
    t.rq.ring.buffer.read(t.rq.ring.entry_off(idx), slot);
    slot
}

/// The room of `t`'s next receive (the bytes its scatter list takes), if one is posted and
/// enabled: what a SEND arriving in several packets may gather before it is placed.
pub(crate) fn next_recv_room(t: &QpShared) -> Option<u64> {
    let consumed = t.rq.consumer.lock().unwrap_or_else(|e| e.into_inner());
    if *consumed >= recv_limit(t) {
        return None;
    }
    let (mut line, mut large) = ([0u8; 64], Vec::new());
    let slot = read_recv_slot(t, *consumed, &mut line, &mut large);
    Some(recv_entries(slot).map(|s| u64::from(s.len)).sum())
}

fn consume_recv(
    t: &QpShared,
    len: usize,
    place: impl FnOnce(&[u8]) -> Result<(), (Syndrome, Nak)>,
) -> Result<u64, Nak> {
    let mut consumed = t.rq.consumer.lock().unwrap_or_else(|e| e.into_inner());
    let idx = *consumed;
    if idx >= recv_limit(t) {
        // Counted by the requester (its rnr_waits), not here.
        return Err(Nak::ReceiverNotReady);
    }
    let placed = if len == 0 {
        // Nothing lands in the receive (a WRITE with immediate, an empty SEND): its scatter
        // list is not read, which spares a WRITE_IMM's responder a ring read and a decode.
        place(&[])
    } else {
        let (mut line, mut large) = ([0u8; 64], Vec::new());
        let slot = read_recv_slot(t, idx, &mut line, &mut large);
        let room: u64 = recv_entries(slot).map(|s| u64::from(s.len)).sum();
        if len as u64 > room {
            Err((Syndrome::LocalLength, Nak::RemoteInvalid))
        } else {
            place(slot)
        }
    };
    *consumed += 1;
    drop(consumed);
    t.counters.recvs.fetch_add(1, Ordering::Relaxed);
    if let Err((syndrome, nak)) = placed {
        t.counters.responder_errors.fetch_add(1, Ordering::Relaxed);
        push_recv_cqe(t, CqeOpcode::RespErr, idx, 0, 0, syndrome as u8);
        t.enter_error();
        if nak == Nak::RemoteInvalid {
            // Longer than the receive: an invalid request (the receive's own bad keys are
            // its error completion's to report).
            t.events.raise(AsyncEvent::QpRequestError(t.qpn));
        }
        return Err(nak);
    }
    Ok(idx)
}

/// Scatter `data` over the entries of a receive (`slot`, its bytes), each checked for
/// LOCAL_WRITE in the responder's PD, under one view of the responder's key table: every
/// entry is checked before any byte is written (a bad entry places no byte), with one lock
/// and no copy of a region. (A trigger's receive scatters into the fields of several code
/// windows, each its own key, used once: a key cache would miss on each.)
fn scatter(
    t: &QpShared,
    table: &KeyTable,
    slot: &[u8],
    data: &[u8],
) -> Result<(), (Syndrome, Nak)> {
    // Each entry with its part of `data`, in order, while data is left.
    let parts = {
        let mut at = 0;
        recv_entries(slot).map_while(move |sge| {
            (at < data.len()).then(|| {
                let n = (data.len() - at).min(sge.len as usize);
                let part = at..at + n;
                at += n;
                (sge, part)
            })
        })
    };
    let keys = table.view();
    let window = |sge: &crate::wqe::Sge, len: usize| {
        keys.region(sge.lkey.0)
            .ok()
            .and_then(|r| r.window(t.pd, sge.addr, len as u64, Access::LOCAL_WRITE))
    };
    for (sge, part) in parts.clone() {
        window(&sge, part.len()).ok_or((Syndrome::LocalProtection, Nak::RemoteOperation))?;
    }
    for (sge, part) in parts {
        // Checked above, under the same view.
        if let Some(w) = window(&sge, part.len()) {
            w.write(&data[part]);
        }
    }
    Ok(())
}

fn complete_recv(t: &QpShared, op: CqeOpcode, idx: u64, len: usize, imm: u32) {
    // A message is at most MAX_MESSAGE (16 MiB).
    push_recv_cqe(t, op, idx, small32(len), imm, 0);
}

fn push_recv_cqe(t: &QpShared, op: CqeOpcode, idx: u64, len: u32, imm: u32, syndrome: u8) {
    t.recv_cq.push(
        Cqe {
            opcode: op,
            qpn: t.qpn,
            send_opcode: 0,
            wqe_counter: wqe_index(idx),
            byte_cnt: len,
            imm,
            syndrome,
            vendor_syndrome: 0,
            timestamp: 0,
            owner: false,
        },
        t.rq.wr_ids[conv::idx(idx & (t.rq.ring.entries - 1))].load(Ordering::Relaxed),
    );
}
