//! The softnic's asynchronous event queue (`ibv_get_async_event(3)`): what a responder that
//! failed a request, or a CQ that overran, reports to the owner of the object, outside any
//! completion. One queue per softnic, shared by its queue pairs and CQs.

use crate::nic::AsyncEvent;
use std::collections::VecDeque;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;

/// Events kept for the owner before the newest are dropped (and counted). A bound, because
/// a peer can make events (each bad request kills one queue pair, and a client may have
/// many): the queue must not grow without limit if nobody reads it.
pub(crate) const MAX_ASYNC_EVENTS: usize = 4096;

/// The queue of events not yet taken.
#[derive(Default)]
pub(crate) struct AsyncEvents {
    queue: Mutex<VecDeque<AsyncEvent>>,
    lost: AtomicU64,
}

impl AsyncEvents {
    /// Raise `event` (dropped and counted if the queue is full).
    pub(crate) fn raise(&self, event: AsyncEvent) {
        let mut q = self.queue.lock().unwrap_or_else(|e| e.into_inner());
        if q.len() >= MAX_ASYNC_EVENTS {
            self.lost.fetch_add(1, Ordering::Relaxed);
            return;
        }
        q.push_back(event);
    }

    /// Take the oldest event.
    pub(crate) fn take(&self) -> Option<AsyncEvent> {
        self.queue
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .pop_front()
    }

    /// Events dropped so far because the queue was full.
    pub(crate) fn lost(&self) -> u64 {
        self.lost.load(Ordering::Relaxed)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::types::Qpn;

    #[test]
    fn events_come_out_in_order_and_past_the_cap_are_counted_as_lost() {
        let e = AsyncEvents::default();
        for i in 0..u32::try_from(MAX_ASYNC_EVENTS).unwrap() + 3 {
            e.raise(AsyncEvent::QpAccessError(Qpn(i)));
        }
        assert_eq!(e.lost(), 3);
        assert_eq!(e.take(), Some(AsyncEvent::QpAccessError(Qpn(0))));
        assert_eq!(e.take(), Some(AsyncEvent::QpAccessError(Qpn(1))));
        let rest = std::iter::from_fn(|| e.take()).count();
        assert_eq!(rest, MAX_ASYNC_EVENTS - 2);
    }
}
