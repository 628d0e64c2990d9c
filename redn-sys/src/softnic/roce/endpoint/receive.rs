//! The receive side: the receive thread's loop, the check and dispatch of every datagram to
//! the responder or requester of the QP it names, the replies a batch gathers, and the glue
//! from the responder to the softnic's memory and receive queues.

use super::mailbox::Response;
use super::{Inner, HOST_LEASE};
use crate::mem::KeyCache;
use crate::softnic::idle::Found;
use crate::softnic::in_process::InProcess;
use crate::softnic::roce::io::RecvBatch;
use crate::softnic::roce::packet::{self, opcode, DropReason, Header, Route, Syndrome};
use crate::softnic::roce::responder::Memory;
use crate::softnic::transport::{AtomicOp, Nak, Transport};
use crate::types::{Access, Rkey, VirtAddr};
use crate::wqe::RemoteAddr;
use crate::{QpState, Result};
use std::net::SocketAddrV4;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

/// Replies gathered from one batch of received datagrams, sent in one call.
///
/// A plain ACK or an RNR NAK supersedes the one of its kind held for the same QP of the
/// same peer when that is the QP's last reply held (nothing it must not overtake came
/// after it): an ACK is cumulative, and RNR NAKs for a packet retried too soon say the
/// same thing again. So a batch answers a burst of one QP's duplicates, or of SENDs that
/// find no receive, with one datagram, however the burst interleaves with other QPs'; a
/// peer flooding them costs the PU no more sends than batches (at most 64 datagrams each
/// under load), where it once cost one a datagram (`docs/attacks.md`, "The data plane").
pub(super) struct Outbox {
    pub(super) bytes: Vec<u8>,
    /// (destination, start, end) of each encoded reply.
    pub(super) frames: Vec<(SocketAddrV4, usize, usize)>,
    /// The QP number each frame goes to and what it is, for the superseding above.
    kinds: Vec<(u32, Reply)>,
    /// Every reply held is a plain ACK (true when empty): nothing a requester waits on to
    /// go on, which a host-driven PU may hold for its next request.
    pub(super) only_acks: bool,
}

/// What a held reply is, as far as superseding goes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Reply {
    /// A plain ACK.
    Ack,
    /// An RNR NAK.
    Rnr,
    /// Anything else (a response, another NAK): superseded by nothing.
    Other,
}

impl Reply {
    fn of(h: &Header) -> Reply {
        if h.opcode != opcode::ACKNOWLEDGE {
            return Reply::Other;
        }
        match h.aeth.map(|a| Syndrome::of(a.syndrome)) {
            Some(Syndrome::Ack) => Reply::Ack,
            Some(Syndrome::Rnr(_)) => Reply::Rnr,
            _ => Reply::Other,
        }
    }
}

impl Default for Outbox {
    fn default() -> Outbox {
        Outbox {
            bytes: Vec::new(),
            frames: Vec::new(),
            kinds: Vec::new(),
            only_acks: true,
        }
    }
}

impl Outbox {
    pub(super) fn push(
        &mut self,
        local: SocketAddrV4,
        to: SocketAddrV4,
        h: &Header,
        payload: &[u8],
    ) {
        let reply = Reply::of(h);
        let start = self.bytes.len();
        packet::encode(
            &mut self.bytes,
            &Route {
                src: local,
                dst: to,
            },
            h,
            payload,
        );
        let end = self.bytes.len();
        if reply != Reply::Other {
            // The QP's last reply held, if it is one of this kind, takes the new one's bytes
            // where it stands (both are a BTH and an AETH: the same length): its place is
            // after everything else held for that QP, so order per QP is kept.
            let last = (0..self.frames.len())
                .rev()
                .find(|&i| self.frames[i].0 == to && self.kinds[i].0 == h.dest_qp);
            if let Some(i) = last.filter(|&i| self.kinds[i].1 == reply) {
                let (_, s, e) = self.frames[i];
                if e - s == end - start {
                    self.bytes.copy_within(start..end, s);
                    self.bytes.truncate(start);
                    return;
                }
            }
        }
        self.frames.push((to, start, end));
        self.kinds.push((h.dest_qp, reply));
        self.only_acks &= reply == Reply::Ack;
    }

    pub(super) fn flush(&mut self, inner: &Inner) {
        if !self.frames.is_empty() {
            let batch: Vec<(SocketAddrV4, &[u8])> = self
                .frames
                .iter()
                .map(|&(a, s, e)| (a, &self.bytes[s..e]))
                .collect();
            inner.send(&batch);
        }
        self.clear();
    }

    pub(super) fn clear(&mut self) {
        self.bytes.clear();
        self.frames.clear();
        self.kinds.clear();
        self.only_acks = true;
    }
}

/// Receive one batch (waiting up to `wait` for its first datagram) and hand each datagram
/// to its QP, leaving the replies in `out`; how many arrived and the most their handling
/// did.
pub(super) fn receive_batch(
    inner: &Inner,
    batch: &mut RecvBatch,
    out: &mut Outbox,
    wait: Option<Duration>,
) -> (usize, Found) {
    let n = match inner.io.recv(batch, wait) {
        Ok(n) => n,
        Err(_) => {
            // A socket error is not the packets' fault; do not spin on it.
            std::thread::sleep(Duration::from_millis(1));
            0
        }
    };
    if n == 0 {
        return (0, Found::Nothing);
    }
    inner.received.fetch_add(n as u64, Ordering::Relaxed);
    let mut found = Found::Nothing;
    for i in 0..n {
        let (d, from) = batch.get(i);
        found = found.max(dispatch(inner, from, d, out));
    }
    (n, found)
}

/// The receive thread: serves the socket while no PU does, blocked in the kernel between
/// datagrams (it never spins: a spinning receive thread takes turns on the cores with the
/// PUs and hosts that have the work), and sleeps while a PU is present at the socket.
pub(super) fn receive_loop(inner: &Arc<Inner>) {
    let _ = inner.rx_thread.set(std::thread::current());
    let mut batch = RecvBatch::default();
    let mut out = Outbox::default();
    // Wake at least this often to notice a shutdown.
    let nap = Duration::from_millis(10);
    // A host-driven app held the socket at the last look (its held replies are owed).
    let mut host_held = false;
    // The present PUs' polls when this thread first saw them at that count.
    let mut polls_seen: Option<(u64, std::time::Instant)> = None;
    while !inner.shutdown.load(Ordering::Acquire) {
        if inner.pollers.load(Ordering::Acquire) > 0 {
            // The last PU to leave unparks this thread (an unpark before the park makes it
            // return at once).
            std::thread::park_timeout(nap);
            // Present PUs that made no poll in a whole nap (by the clock: a park may end
            // early) are off the CPU (a busy machine: a PU leaves the socket only before it
            // parks): take what waits, rather than leave it for its sender's retransmission
            // timer (docs/attacks.md, the 67 ms stall). Not while one is in a poll.
            let (polls, in_poll) = inner.present_polls();
            match polls_seen {
                Some((seen, since)) if seen == polls => {
                    if !in_poll
                        && since.elapsed() >= nap
                        && inner.pollers.load(Ordering::Acquire) > 0
                    {
                        take_batch(inner, &mut batch, &mut out, None);
                    }
                }
                _ => polls_seen = Some((polls, std::time::Instant::now())),
            }
            continue;
        }
        polls_seen = None;
        if inner.host_polled.swap(false, Ordering::Relaxed) {
            // A host-driven app polled since the last look: it takes the datagrams itself.
            // Look again after a lease (its polls renew it; a wait it sleeps in ends it).
            host_held = true;
            std::thread::park_timeout(HOST_LEASE);
            continue;
        }
        if std::mem::take(&mut host_held) {
            // The app stopped calling: the ACKs it held for its next request go now.
            inner.flush_host_replies();
        }
        take_batch(inner, &mut batch, &mut out, Some(nap));
    }
}

/// The receive thread's take of a batch (waiting up to `wait` for one), its replies sent.
fn take_batch(inner: &Inner, batch: &mut RecvBatch, out: &mut Outbox, wait: Option<Duration>) {
    let (n, _) = receive_batch(inner, batch, out, wait);
    if n > 0 {
        inner
            .by_receive_thread
            .fetch_add(n as u64, Ordering::Relaxed);
        out.flush(inner);
    }
}

/// Check one datagram and hand it to the QP it names.
pub(super) fn dispatch(inner: &Inner, from: SocketAddrV4, d: &[u8], out: &mut Outbox) -> Found {
    let dropped = |why| {
        inner.drops.count(why);
        Found::Placed
    };
    let p = match packet::decode(
        &Route {
            src: from,
            dst: inner.local,
        },
        d,
    ) {
        Ok(p) => p,
        Err(why) => return dropped(why),
    };
    // Looked up and used under the table's read lock, not cloned out of it (an Arc's two
    // atomic operations a packet): a connect or a removal waits for the packets in hand.
    let conns = inner.conns.read().unwrap_or_else(|e| e.into_inner());
    // Unknown QPs get no reply: nothing about which QPs exist leaks.
    let Some(conn) = conns.get(&p.header.dest_qp) else {
        return dropped(DropReason::UnknownQp);
    };
    if conn.remote != from {
        return dropped(DropReason::WrongSource);
    }
    let t = &conn.local.target;
    if t.destroyed.load(Ordering::Acquire) {
        drop(conns);
        inner
            .conns
            .write()
            .unwrap_or_else(|e| e.into_inner())
            .remove(&p.header.dest_qp);
        return dropped(DropReason::UnknownQp);
    }
    if t.state() == QpState::Error {
        return dropped(DropReason::QpInError);
    }
    if packet::is_response(p.header.opcode) {
        let r = Response {
            header: p.header,
            payload: p.payload.to_vec(),
        };
        if !conn.mailbox.push(r) {
            return dropped(DropReason::UnexpectedResponse);
        }
        // The requester takes it in its queue's next visit, which its PU makes now even if
        // it parked (its queue does not wait for the peer: `Transport::settle`).
        t.pus.notify(t.pu);
        return Found::QueueWork;
    }
    let mut guard = conn.responder.lock().unwrap_or_else(|e| e.into_inner());
    let (responder, keys) = &mut *guard;
    let mut mem = Glue {
        ip: &conn.local,
        keys,
    };
    let (local, remote) = (inner.local, conn.remote);
    if let Err(why) = responder.handle(&p, &mut mem, &mut |h: &Header, payload: &[u8]| {
        out.push(local, remote, h, payload)
    }) {
        inner.drops.count(why);
    }
    // What the queues see of a request: a receive it consumed (a completion a WAIT may
    // count), or the QP put in error (its queues flush). A WRITE without immediate, a READ
    // or an atomic only places or reads memory and replies.
    let memory_only = matches!(
        p.header.opcode,
        opcode::WRITE_FIRST
            | opcode::WRITE_MIDDLE
            | opcode::WRITE_LAST
            | opcode::WRITE_ONLY
            | opcode::READ_REQUEST
            | opcode::COMPARE_SWAP
            | opcode::FETCH_ADD
    );
    if memory_only && t.state() != QpState::Error {
        Found::Placed
    } else {
        Found::QueueWork
    }
}

/// The responder's memory: the softnic's own responder functions (those the in-process
/// transport runs), with this connection's cache of the local key table.
pub(super) struct Glue<'a> {
    ip: &'a InProcess,
    keys: &'a mut KeyCache,
}

pub(super) fn remote(va: u64, rkey: u32) -> RemoteAddr {
    RemoteAddr {
        addr: VirtAddr(va),
        rkey: Rkey(rkey),
    }
}

impl Memory for Glue<'_> {
    fn check_write(&mut self, va: u64, rkey: u32, len: u32) -> Result<(), Nak> {
        let t = &self.ip.target;
        self.keys
            .get(&self.ip.keys, rkey)
            .and_then(|r| {
                r.check(t.pd, VirtAddr(va), u64::from(len), Access::REMOTE_WRITE)
                    .map(|_| ())
            })
            .map_err(Nak::RemoteAccess)
    }

    fn write(&mut self, va: u64, rkey: u32, data: &[u8], imm: Option<u32>) -> Result<(), Nak> {
        self.ip.write(self.keys, remote(va, rkey), data, imm, false)
    }

    fn complete_imm(&mut self, len: u32, imm: u32) -> Result<(), Nak> {
        self.ip.complete_write_imm(len as usize, imm)
    }

    fn send(&mut self, data: &[u8], imm: Option<u32>) -> Result<(), Nak> {
        self.ip.send(self.keys, data, imm, false)
    }

    fn read(&mut self, va: u64, rkey: u32, out: &mut [u8]) -> Result<(), Nak> {
        self.ip.read(self.keys, remote(va, rkey), out)
    }

    fn atomic(&mut self, va: u64, rkey: u32, op: AtomicOp) -> Result<u64, Nak> {
        self.ip.atomic(self.keys, remote(va, rkey), op)
    }

    fn recv_room(&mut self) -> Option<u64> {
        crate::softnic::in_process::next_recv_room(&self.ip.target)
    }

    fn fail(&mut self, nak: Nak) {
        // An access error or invalid request: to error with the QP's asynchronous event
        // (nothing more if the in-process responder function already refused it); any
        // other class C error: to error.
        crate::softnic::in_process::refuse(&self.ip.target, nak);
        self.ip.target.enter_error();
    }
}
