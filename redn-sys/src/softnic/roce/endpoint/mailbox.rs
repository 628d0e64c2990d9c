//! A connected QP's mailbox: where the endpoint's receive thread (or a PU polling the
//! socket) leaves the responses that QP's requester waits for, and how a waiting requester
//! polls, spins and sleeps until one comes.

use super::MAILBOX_CAP;
use crate::softnic::roce::packet::Header;
use std::collections::VecDeque;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;
use std::thread::Thread;
use std::time::{Duration, Instant};

/// A response waiting for the requester that owns it.
pub(super) struct Response {
    pub(super) header: Header,
    pub(super) payload: Vec<u8>,
}

/// Where the receive thread leaves responses for a requester, and how it wakes it.
#[derive(Default)]
pub(super) struct Mailbox {
    queue: Mutex<VecDeque<Response>>,
    pending: AtomicU64,
    waiter: Mutex<Option<Thread>>,
}

impl Mailbox {
    /// Leave a response; false (and nothing left) if `MAILBOX_CAP` are already waiting,
    /// so that a peer answering what was never asked cannot grow memory without bound.
    pub(super) fn push(&self, r: Response) -> bool {
        {
            let mut q = self.queue.lock().unwrap_or_else(|e| e.into_inner());
            if q.len() >= MAILBOX_CAP {
                return false;
            }
            q.push_back(r);
        }
        self.pending.fetch_add(1, Ordering::Release);
        if let Some(t) = self
            .waiter
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .as_ref()
        {
            t.unpark();
        }
        true
    }

    pub(super) fn is_empty(&self) -> bool {
        self.pending.load(Ordering::Acquire) == 0
    }

    pub(super) fn take(&self) -> Option<Response> {
        if self.is_empty() {
            return None;
        }
        let r = self
            .queue
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .pop_front();
        if r.is_some() {
            self.pending.fetch_sub(1, Ordering::Release);
        }
        r
    }

    /// The next response: for `spin`, `poll` the socket and pause (the waiting thread takes
    /// what arrives itself, with no hand-over from the receive thread), then sleep until
    /// `until` while the receive thread delivers.
    pub(super) fn wait(
        &self,
        spin: Duration,
        until: Option<Instant>,
        give_up: impl Fn() -> bool,
        poll: impl FnMut(),
        before_sleep: impl Fn(),
    ) -> Option<Response> {
        let r = self.wait_registered(spin, until, give_up, poll, before_sleep);
        // Registered only while it waits: the waiter is the PU's own thread, and a response
        // pushed after the wait would otherwise leave its park token set, so that the PU's
        // next park in its idle loop returned at once and it polled through another spell
        // of idling, taking a core from the threads with work.
        let mut w = self.waiter.lock().unwrap_or_else(|e| e.into_inner());
        if w.is_some() {
            *w = None;
        }
        r
    }

    /// [`Self::wait`], which may leave this thread registered as the waiter.
    fn wait_registered(
        &self,
        spin: Duration,
        until: Option<Instant>,
        give_up: impl Fn() -> bool,
        mut poll: impl FnMut(),
        before_sleep: impl Fn(),
    ) -> Option<Response> {
        let start = Instant::now();
        loop {
            if let Some(r) = self.take() {
                return Some(r);
            }
            let now = Instant::now();
            if until.is_some_and(|u| now >= u) || give_up() {
                return None;
            }
            if now - start < spin {
                // `poll` also pauses, as its caller's threads want (`RoceTransport::run`).
                poll();
                continue;
            }
            *self.waiter.lock().unwrap_or_else(|e| e.into_inner()) = Some(std::thread::current());
            before_sleep();
            if let Some(r) = self.take() {
                return Some(r);
            }
            // Wake at least every 10 ms to notice a QP put in error or a shutdown.
            let nap = until
                .map_or(Duration::from_millis(10), |u| {
                    u.saturating_duration_since(now)
                })
                .min(Duration::from_millis(10));
            std::thread::park_timeout(nap);
        }
    }
}
