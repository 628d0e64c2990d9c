//! Who takes datagrams off the endpoint's socket: a connected QP ([`Conn`]) and the per-PU
//! poller through which an awake PU reads the socket itself instead of the receive thread.

use super::mailbox::Mailbox;
use super::receive::{receive_batch, Outbox};
use super::{Inner, HELD_ACKS};
use crate::mem::KeyCache;
use crate::softnic::idle::{Found, IdleWork};
use crate::softnic::in_process::InProcess;
use crate::softnic::roce::io::{PeerLease, RecvBatch};
use crate::softnic::roce::responder::Responder;
use std::net::SocketAddrV4;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

/// One connected QP.
pub(super) struct Conn {
    pub(super) remote: SocketAddrV4,
    pub(super) local: InProcess,
    pub(super) responder: Mutex<(Responder, KeyCache)>,
    pub(super) mailbox: Mailbox,
    /// How the QP's PU takes packets off the socket while it waits for an answer.
    pub(super) poller: Arc<PuPoller>,
    /// The peer's datagrams queue on a socket of their own while a connection to it lives
    /// (`roce/io/peers.rs`).
    pub(super) _queue: PeerLease,
}

/// One PU's turn at the endpoint's socket. While the PU is awake it takes the packets off
/// the socket itself, in its idle rounds ([`IdleWork`]) and while it waits for an answer, so
/// that a request's placement, its receive completion, the WAIT that counts it and the WQE
/// that WAIT releases all run on the PU's thread with no hand-off; meanwhile the endpoint's
/// receive thread stands down rather than poll the same socket (two pollers of one socket
/// on a small machine take turns on the cores and each finds half the packets). The PU gives
/// the socket back before it sleeps.
pub(super) struct PuPoller {
    /// Its endpoint. A strong reference (a weak one's upgrade was two atomic operations on
    /// every poll of an idle loop): the cycle through `Inner::pu_pollers` and the
    /// connections is broken when the endpoint is dropped, which empties both.
    inner: Arc<Inner>,
    /// The softnic is host-driven: the PU is the app's thread, present while it calls in
    /// (`Inner::host_polled`), and the plain ACKs it owes ride on its next request.
    pub(super) host: bool,
    /// This PU counts in `Inner::pollers`.
    pub(super) present: AtomicBool,
    /// Polls it has made (written by its PU alone, so a plain load and store: a lost step
    /// is harmless), for the receive thread to tell a present PU that polls from one that
    /// is off the CPU ([`Inner::present_polls`]).
    pub(super) polls: AtomicU64,
    /// It is in a poll: the receive thread does not take the socket over meanwhile, so
    /// that a QP's later packets are not dispatched before the earlier ones this poll
    /// holds (a PU can be taken off the CPU mid-poll).
    pub(super) in_poll: AtomicBool,
    /// Receive buffers and the replies of one batch (made at first use).
    bufs: Mutex<Option<Box<(RecvBatch, Outbox)>>>,
}

impl PuPoller {
    /// A PU's poller of `inner`'s socket, not yet polling it.
    pub(super) fn new(inner: Arc<Inner>) -> PuPoller {
        PuPoller {
            host: inner.nic.config.host_driven,
            inner,
            present: AtomicBool::new(false),
            polls: AtomicU64::new(0),
            in_poll: AtomicBool::new(false),
            bufs: Mutex::new(None),
        }
    }

    /// Take what is on the socket now, as the PU present at it; how many datagrams.
    ///
    /// The replies to what arrives (ACKs, READ and atomic responses, NAKs) are held for the
    /// PU's next send through [`Self::send_with_replies`] until its next poll or until it
    /// sleeps, that is for one round of its queues: the PU first runs what the arrivals
    /// released (the WAIT a WRITE_IMM's completion satisfies and the WRITE behind it),
    /// whose packets then carry the replies in the same system call. No longer: a ConnectX
    /// answers at once, so a READ response or an ACK that nothing in the round carried
    /// goes out at the next poll, not after a timer (a longer hold, up to 20 µs, made a
    /// host-answered ping-pong cheaper on the busy VM and every reply that no send follows,
    /// a one-sided READ's, that much later). The answer is
    /// not queued behind the ACK's system call, and in a run of requests and answers each
    /// side pays one `sendmmsg` a turn, not two (on a busy two-core machine, where the
    /// threads of a round trip take turns on one core, that system call was on the path).
    ///
    /// Returns how many datagrams it took and the most their handling did.
    pub(super) fn poll_with(&self, inner: &Inner) -> (usize, Found) {
        if self.host {
            // A plain store, not a clock read (~40 ns of a ~500 ns poll): the receive thread
            // asks once a lease whether any poll came.
            inner.host_polled.store(true, Ordering::Relaxed);
        } else {
            let polls = self.polls.load(Ordering::Relaxed);
            self.polls.store(polls.wrapping_add(1), Ordering::Relaxed);
            if !self.present.swap(true, Ordering::AcqRel) {
                // A swap, not a load and a store: should another thread ever run this PU's
                // WQEs (and so poll as it), the count must still go up once per presence.
                inner.pollers.fetch_add(1, Ordering::AcqRel);
            }
        }
        let mut g = self.bufs.lock().unwrap_or_else(|e| e.into_inner());
        let b = g.get_or_insert_with(|| Box::new((RecvBatch::default(), Outbox::default())));
        // What the last poll's arrivals were owed and no send of the round since carried;
        // a host's plain ACKs wait for its next request (at most `HELD_ACKS` of them, and
        // at most the host's lease: then the receive thread sends them).
        if !(self.host && b.1.only_acks && b.1.frames.len() < HELD_ACKS) {
            b.1.flush(inner);
        }
        self.in_poll.store(true, Ordering::Release);
        let taken = receive_batch(inner, &mut b.0, &mut b.1, None);
        self.in_poll.store(false, Ordering::Release);
        taken
    }

    /// Send `frames` (ranges of `bytes`, to `to`) and the replies held since the last poll.
    pub(super) fn send_with_replies(
        &self,
        inner: &Inner,
        to: SocketAddrV4,
        bytes: &[u8],
        frames: &[(usize, usize)],
    ) {
        let mut g = self.bufs.lock().unwrap_or_else(|e| e.into_inner());
        if let ([(s, e)], true) = (frames, g.as_deref().map_or(true, |b| b.1.frames.is_empty())) {
            // One packet and no replies held (a request or an answer): no batch to build.
            inner.send(&[(to, &bytes[*s..*e])]);
            return;
        }
        let mut batch: Vec<(SocketAddrV4, &[u8])> =
            frames.iter().map(|&(s, e)| (to, &bytes[s..e])).collect();
        if let Some(b) = g.as_deref_mut() {
            let held = &b.1;
            batch.extend(held.frames.iter().map(|&(a, s, e)| (a, &held.bytes[s..e])));
        }
        inner.send(&batch);
        drop(batch);
        if let Some(b) = g.as_deref_mut() {
            b.1.clear();
        }
    }

    /// Send the replies held since the last poll.
    pub(super) fn flush(&self, inner: &Inner) {
        if let Some(b) = self
            .bufs
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .as_deref_mut()
        {
            b.1.flush(inner);
        }
    }

    /// Send what is held and stop counting as present: the last PU to leave wakes the
    /// receive thread.
    pub(super) fn leave(&self, inner: &Inner) {
        self.flush(inner);
        if self.host {
            // The host is about to sleep in a wait: the socket is the receive thread's now.
            inner.host_polled.store(false, Ordering::Relaxed);
            if let Some(t) = inner.rx_thread.get() {
                t.unpark();
            }
        } else if self.present.swap(false, Ordering::AcqRel)
            && inner.pollers.fetch_sub(1, Ordering::AcqRel) == 1
        {
            if let Some(t) = inner.rx_thread.get() {
                t.unpark();
            }
        }
    }
}

impl IdleWork for PuPoller {
    fn poll(&self) -> Found {
        if self.inner.shutdown.load(Ordering::Acquire) {
            return Found::Nothing;
        }
        self.poll_with(&self.inner).1
    }

    fn parking(&self) {
        self.leave(&self.inner);
    }
}
