//! The seam between a requester and the responder it talks to.
//!
//! A [`Transport`] carries one request of an RC connection to the peer and brings back its
//! answer (a windowed one posts WRITEs and SENDs and settles their outcomes later, in
//! order: [`Transport::windowed`]); what a requester asks ([`AtomicOp`]) and how a
//! responder refuses ([`Nak`]) are defined here too. Queue pairs of one softnic, and of two
//! softnic instances in one process, use `in_process::InProcess`; QPs connected over RoCEv2
//! use the `roce` endpoint's transport, whose receive side calls the same responder
//! functions when packets arrive.

use crate::mem::{AccessFault, KeyCache, Span};
use crate::wqe::{RemoteAddr, Syndrome};
use std::any::Any;
use std::sync::Arc;
use std::time::Instant;

/// The atomic a requester asks for; values are host-order u64s.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum AtomicOp {
    CompareSwap {
        compare: u64,
        swap: u64,
    },
    FetchAdd {
        add: u64,
    },
    MaskedCompareSwap {
        compare: u64,
        compare_mask: u64,
        swap: u64,
        swap_mask: u64,
    },
    MaskedFetchAdd {
        add: u64,
        field_boundary: u64,
    },
}

impl AtomicOp {
    /// The new value for `old`, or `None` to leave it.
    pub(crate) fn apply(self, old: u64) -> Option<u64> {
        match self {
            AtomicOp::CompareSwap { compare, swap } => (old == compare).then_some(swap),
            AtomicOp::FetchAdd { add } => Some(old.wrapping_add(add)),
            AtomicOp::MaskedCompareSwap {
                compare,
                compare_mask,
                swap,
                swap_mask,
            } => ((old ^ compare) & compare_mask == 0)
                .then_some((old & !swap_mask) | (swap & swap_mask)),
            AtomicOp::MaskedFetchAdd {
                add,
                field_boundary,
            } => Some(masked_add(old, add, field_boundary)),
        }
    }
}

/// Add with carries cut at the bits set in `boundary` (each set bit ends a field).
fn masked_add(a: u64, b: u64, boundary: u64) -> u64 {
    let mut out = 0u64;
    let mut carry = 0u64;
    for i in 0..64 {
        let s = ((a >> i) & 1) + ((b >> i) & 1) + carry;
        out |= (s & 1) << i;
        carry = if boundary >> i & 1 == 1 { 0 } else { s >> 1 };
    }
    out
}

/// Why the responder refused a request (the NAK the requester turns into a completion).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Nak {
    /// Key, PD, bounds or rights refused.
    RemoteAccess(AccessFault),
    /// Malformed request (misaligned atomic, message longer than the receive).
    RemoteInvalid,
    /// The responder failed to place the data (its receive's own keys were bad).
    RemoteOperation,
    /// No receive posted: retry later.
    ReceiverNotReady,
    /// Not a refusal: a windowed transport's window is full (its peer has not acknowledged
    /// enough of what was posted), so nothing was sent; the WQE runs again on a later visit
    /// (an ACK's arrival or the transport's timer brings the PU back). Never reported.
    WindowFull,
    /// The peer is gone or in error: nothing answers.
    NoResponse,
    /// The peer kept answering "receiver not ready" past the RNR retry count (a network
    /// transport's requester; in-process peers wait for a receive instead).
    RnrRetryExceeded,
}

impl Nak {
    pub(crate) fn syndrome(self) -> Syndrome {
        match self {
            Nak::RemoteAccess(_) => Syndrome::RemoteAccess,
            Nak::RemoteInvalid => Syndrome::RemoteInvalidRequest,
            Nak::RemoteOperation => Syndrome::RemoteOperation,
            Nak::ReceiverNotReady => Syndrome::RnrRetryExceeded,
            // Never reported (see the variant), but a syndrome must be given.
            Nak::WindowFull => Syndrome::TransportRetryExceeded,
            Nak::NoResponse => Syndrome::TransportRetryExceeded,
            Nak::RnrRetryExceeded => Syndrome::RnrRetryExceeded,
        }
    }
}

/// How a requester reaches its responder. `keys` is the requester's cache of the responder's
/// keys, so the hot path does not lock the responder's key table.
///
/// `ack` on a WRITE or SEND: its outcome is waited for (the WQE is signaled), so a windowed
/// transport asks for its ACK at once rather than with a later message's (see `windowed`).
pub(crate) trait Transport: Send + Sync {
    fn write(
        &self,
        keys: &mut KeyCache,
        remote: RemoteAddr,
        data: &[u8],
        imm: Option<u32>,
        ack: bool,
    ) -> Result<(), Nak>;
    /// WRITE straight from a checked local window (the one-segment fast path).
    fn write_from(
        &self,
        keys: &mut KeyCache,
        remote: RemoteAddr,
        src: &Span<'_>,
        imm: Option<u32>,
        ack: bool,
    ) -> Result<(), Nak>;
    /// READ straight into a checked local window (the one-segment fast path).
    fn read_into(&self, keys: &mut KeyCache, remote: RemoteAddr, dst: &Span<'_>)
        -> Result<(), Nak>;
    fn send(
        &self,
        keys: &mut KeyCache,
        data: &[u8],
        imm: Option<u32>,
        ack: bool,
    ) -> Result<(), Nak>;
    fn read(&self, keys: &mut KeyCache, remote: RemoteAddr, out: &mut [u8]) -> Result<(), Nak>;
    fn atomic(&self, keys: &mut KeyCache, remote: RemoteAddr, op: AtomicOp) -> Result<u64, Nak>;
    /// True if WRITEs and SENDs are posted: `write`, `write_from` and `send` return once
    /// the message is on its way (`Ok`, or `Err` for what is refused before anything is
    /// sent), and its outcome comes later from [`Self::settle`], in order (a network
    /// transport keeping several messages in flight). False: they return their outcome.
    fn windowed(&self) -> bool {
        false
    }
    /// The outcome of the oldest posted message whose outcome was not taken yet, asked for
    /// as [`Ask`] says; None if it is not known yet (or nothing is posted). Never waits:
    /// the peer decides when its ACKs come, so a PU that waited for one would serve none
    /// of its other queues meanwhile (a peer that never acknowledged held a manager's only
    /// PU for the ~0.5 s its retries took, per message).
    fn settle(&self, _ask: Ask) -> Option<Result<(), Nak>> {
        None
    }
    /// Forget every posted message and outcome not taken (the queue went to error and
    /// flushes them).
    fn abandon(&self) {}
    /// The queue pair was destroyed: let go of what the transport registered for it
    /// elsewhere (a RoCE endpoint's entry for its QP number), so that nothing keeps the
    /// destroyed queue, its rings and its connection state alive.
    fn detach(&self) {}
    /// When a windowed transport next needs its owner's visit (through [`Self::settle`])
    /// for what it has posted: a retransmission or an ACK to ask for. None if never.
    fn next_timer(&self) -> Option<Instant> {
        None
    }
    /// The transport as `Any`, so the executor can find an in-process peer and reach it
    /// without a dynamic call on its fast path.
    fn into_any(self: Arc<Self>) -> Arc<dyn Any + Send + Sync>;
}

/// How an executor asks a windowed transport for a posted message's outcome
/// ([`Transport::settle`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Ask {
    /// Take it if it is known, after taking what has come and running the timers that
    /// have fallen due (a retransmission, an ACK to ask for): a queue at rest.
    Now,
    /// Take it if it has come, without reading the clock: between the WQEs of a visit (a
    /// clock read for each was on the RoCE round trip's path), whose end asks [`Ask::Now`],
    /// so a timer that fell due fires at most a visit late, never early.
    Arrived,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn masked_add_stops_carries_at_boundaries() {
        // Two 32-bit counters in one word: the low one wraps without touching the high one.
        let a = 0x0000_0001_ffff_ffffu64;
        assert_eq!(masked_add(a, 1, 1 << 31), 0x0000_0001_0000_0000);
        assert_eq!(masked_add(a, 1, 0), 0x0000_0002_0000_0000);
    }

    #[test]
    fn atomic_ops_apply() {
        let cas = AtomicOp::CompareSwap {
            compare: 5,
            swap: 9,
        };
        assert_eq!(cas.apply(5), Some(9));
        assert_eq!(cas.apply(6), None);
        let m = AtomicOp::MaskedCompareSwap {
            compare: 0xab00,
            compare_mask: 0xff00,
            swap: 0x00cd,
            swap_mask: 0x00ff,
        };
        assert_eq!(m.apply(0xab11), Some(0xabcd));
        assert_eq!(m.apply(0xac11), None);
        let faa = AtomicOp::FetchAdd { add: 3 };
        assert_eq!(faa.apply(u64::MAX - 1), Some(1));
        let mfaa = AtomicOp::MaskedFetchAdd {
            add: 1,
            field_boundary: 1 << 31,
        };
        assert_eq!(
            mfaa.apply(0x0000_0001_ffff_ffff),
            Some(0x0000_0001_0000_0000)
        );
        // Masked CAS: compared bits equal (bit 63 set on both sides, the rest differing
        // outside the mask), swapped bits taken from the operand, the rest kept.
        let high = AtomicOp::MaskedCompareSwap {
            compare: 0x8000_0000_0000_00f0,
            compare_mask: 0x8000_0000_0000_00f0,
            swap: 0x0f0f_0f0f_0f0f_0f0f,
            swap_mask: 0xff00_0000_0000_00ff,
        };
        assert_eq!(
            high.apply(0x8123_4567_89ab_cdf5),
            Some(0x0f23_4567_89ab_cd0f)
        );
        assert_eq!(high.apply(0x0123_4567_89ab_cdf5), None, "bit 63 differs");
        assert_eq!(high.apply(0x8123_4567_89ab_cde5), None, "bit 4 differs");
        let top = AtomicOp::CompareSwap {
            compare: 1 << 63,
            swap: 7,
        };
        assert_eq!(top.apply(1 << 63), Some(7));
        assert_eq!(top.apply(0), None);
    }

    /// `masked_add` defined a second way: field by field (each field ends at a bit set in
    /// `boundary`, the last at bit 63), each field's sum wrapping inside it.
    fn add_by_fields(a: u64, b: u64, boundary: u64) -> u64 {
        let mut out = 0u64;
        let mut start = 0u32;
        for end in 0..64u32 {
            if boundary >> end & 1 == 1 || end == 63 {
                let field = (u64::MAX >> (63 - end)) & (u64::MAX << start);
                out |= (a & field).wrapping_add(b & field) & field;
                start = end + 1;
            }
        }
        out
    }

    #[test]
    fn masked_add_agrees_with_a_field_by_field_sum() {
        // Every one-bit boundary, then seeded random words and boundaries (xorshift64*), with
        // boundaries sparse and dense, and operands all ones so that every carry runs.
        let mut cases = vec![(u64::MAX, 1, 0), (u64::MAX, u64::MAX, u64::MAX)];
        for bit in 0..64 {
            cases.push((u64::MAX, 1, 1 << bit));
            cases.push((u64::MAX >> 1, 1 << bit, 1 << bit));
        }
        let mut x = 0x9e37_79b9_7f4a_7c15u64;
        let mut next = || {
            x ^= x >> 12;
            x ^= x << 25;
            x ^= x >> 27;
            x.wrapping_mul(0x2545_f491_4f6c_dd1d)
        };
        for _ in 0..2000 {
            let (a, b, r) = (next(), next(), next());
            cases.push((a, b, r));
            cases.push((a, b, r & next() & next()));
            cases.push((u64::MAX, b | 1, r & next()));
        }
        for (a, b, boundary) in cases {
            assert_eq!(
                masked_add(a, b, boundary),
                add_by_fields(a, b, boundary),
                "{a:#x} + {b:#x} cut at {boundary:#x}"
            );
        }
    }
}
