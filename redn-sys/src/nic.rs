//! The [`Nic`] trait: what the manager needs from an RDMA NIC, whichever backend serves it.

use crate::mem::{MemoryRegion, SharedBuffer};
use crate::types::{Access, Cqn, Lkey, Pdn, Qpn, VirtAddr};
use crate::wqe::{Cqe, CqeOpcode, Opcode, Sge, Syndrome, WorkRequest};
use crate::{QpState, Result};
use std::collections::VecDeque;
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

/// How to create a completion queue.
///
/// Start from [`CqConfig::new`] (a CQ that is polled) or [`CqConfig::counted`] (one that only
/// WAITs count) and set fields; [`CqConfig::default`] is `new(256)`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct CqConfig {
    /// Number of CQEs the ring holds (rounded up to a power of two).
    pub depth: u32,
    /// A CQ that is only counted by WAITs and never polled may wrap without error
    /// (`IBV_EXP_CQ_IGNORE_OVERRUN`).
    pub ignore_overrun: bool,
    /// Success CQEs carry the completion clock's timestamp (`Cqe::timestamp`), as a CQ
    /// created with `IBV_WC_EX_WITH_COMPLETION_TIMESTAMP` reports it. On by default for a
    /// polled CQ, off for a counted one: reading the clock costs about as much as a
    /// doorbell step's other work, and nobody reads a counted CQ's entries.
    pub timestamps: bool,
}

impl CqConfig {
    /// A CQ of `depth` entries (rounded up to a power of two) that its owner polls: an
    /// overrun is an error.
    #[must_use]
    pub const fn new(depth: u32) -> CqConfig {
        CqConfig {
            depth,
            ignore_overrun: false,
            timestamps: true,
        }
    }

    /// A CQ of `depth` entries that only WAITs count and no one polls: it may wrap without
    /// error (`ignore_overrun`), and its CQEs carry no timestamp unless `timestamps` is set.
    #[must_use]
    pub const fn counted(depth: u32) -> CqConfig {
        CqConfig {
            depth,
            ignore_overrun: true,
            timestamps: false,
        }
    }
}

impl Default for CqConfig {
    fn default() -> Self {
        CqConfig::new(256)
    }
}

/// A completion channel (`ibv_comp_channel`): a CQ armed with [`Nic::req_notify_cq`] puts one
/// event here when its next completion arrives, so a thread can sleep until there is
/// something to poll instead of spinning on the CQ (RedN's client and server threads block on
/// one). Clones share the channel. One channel may serve many CQs.
#[derive(Clone, Debug, Default)]
pub struct CompChannel {
    inner: Arc<ChannelInner>,
}

#[derive(Debug, Default)]
struct ChannelInner {
    events: Mutex<VecDeque<Cqn>>,
    ready: Condvar,
}

impl CompChannel {
    /// A channel with no events.
    pub fn new() -> CompChannel {
        CompChannel::default()
    }

    /// Wait up to `timeout` for an event and take it: the CQ that had a completion after it
    /// was armed (`ibv_get_cq_event`). Events come in the order they happened, one per
    /// arming. `None` if the time passed first.
    #[must_use = "an event taken and dropped is lost"]
    pub fn get_event(&self, timeout: Duration) -> Option<Cqn> {
        // A timeout past what the clock can count (`Duration::MAX`) waits for ever.
        let deadline = Instant::now().checked_add(timeout);
        let mut events = self.inner.events.lock().unwrap_or_else(|e| e.into_inner());
        loop {
            if let Some(cq) = events.pop_front() {
                return Some(cq);
            }
            let left = deadline.map_or(Duration::MAX, |d| {
                d.saturating_duration_since(Instant::now())
            });
            if left.is_zero() {
                return None;
            }
            events = self
                .inner
                .ready
                .wait_timeout(events, left)
                .unwrap_or_else(|e| e.into_inner())
                .0;
        }
    }

    /// Take an event if one is waiting, without blocking.
    #[must_use = "an event taken and dropped is lost"]
    pub fn try_event(&self) -> Option<Cqn> {
        self.inner
            .events
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .pop_front()
    }

    /// Report that armed CQ `cq` got a completion.
    pub(crate) fn signal(&self, cq: Cqn) {
        self.inner
            .events
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push_back(cq);
        self.inner.ready.notify_one();
    }
}

/// Where a queue's ring lives. Rings in caller-supplied memory let a program keep all its
/// rings in one code region that RDMA operations may patch.
#[derive(Clone, Debug)]
pub struct RingPlacement {
    /// The buffer holding the ring.
    pub buffer: Arc<SharedBuffer>,
    /// Byte offset of the ring (a multiple of 64).
    pub offset: usize,
}

/// How to create a reliable-connected queue pair: start from [`QpConfig::new`] and set
/// fields.
#[derive(Clone, Debug)]
#[non_exhaustive]
pub struct QpConfig {
    /// Protection domain: the QP may only use regions of this PD.
    pub pd: Pdn,
    /// CQ for send completions.
    pub send_cq: Cqn,
    /// CQ for receive completions (may equal `send_cq`).
    pub recv_cq: Cqn,
    /// Send-queue size in 64-byte basic blocks (power of two).
    pub sq_bbs: u32,
    /// Receive-queue slots (power of two).
    pub rq_slots: u32,
    /// Scatter entries per receive slot (power of two, at most 64).
    pub rq_sges: u32,
    /// Managed send queue: nothing runs past the index a SEND_EN enabled; never doorbelled.
    pub managed_send: bool,
    /// Managed receive queue: receives are consumed only up to the index a RECV_EN enabled.
    pub managed_recv: bool,
    /// Processing unit to run on (taken modulo the PU count); `None` spreads by QPN.
    pub pu: Option<usize>,
    /// Where the send ring lives; `None` allocates one.
    pub sq_placement: Option<RingPlacement>,
    /// Where the receive ring lives; `None` allocates one.
    pub rq_placement: Option<RingPlacement>,
    /// Atomic replies (the old value a CAS or FETCH_ADD returns into its result entry)
    /// big-endian instead of in host order. Off by default, as on upstream Linux: mlx5_core
    /// sets the HCA's 8-byte atomic replies to host order when the device supports it (kernel
    /// commit f91e6d8941bf, "net/mlx5_core: Add setting ATOMIC endian mode", v4.5). Only
    /// MLNX_OFED offers big-endian replies, per QP (`IBV_EXP_QP_CREATE_ATOMIC_BE_REPLY`);
    /// upstream rdma-core has no such flag, so a program that needs this runs only there.
    pub atomic_be_reply: bool,
}

impl QpConfig {
    /// A plain QP in `pd` using `cq` for everything, 256 BBs, 64 receive slots of 4 entries.
    #[must_use]
    pub fn new(pd: Pdn, cq: Cqn) -> QpConfig {
        QpConfig {
            pd,
            send_cq: cq,
            recv_cq: cq,
            sq_bbs: 256,
            rq_slots: 64,
            rq_sges: 4,
            managed_send: false,
            managed_recv: false,
            pu: None,
            sq_placement: None,
            rq_placement: None,
            atomic_be_reply: false,
        }
    }
}

/// Where a queue's ring sits in memory, for code that writes WQEs directly.
#[derive(Clone, Debug)]
#[non_exhaustive]
pub struct RingInfo {
    /// The buffer holding the ring.
    pub buffer: Arc<SharedBuffer>,
    /// Byte offset of the ring in the buffer.
    pub offset: usize,
    /// Entries (send: 64-byte BBs; receive: slots).
    pub entries: u32,
    /// Bytes per entry.
    pub stride: u32,
    /// Address of the ring's first byte, as WQEs name it.
    pub addr: VirtAddr,
}

/// A queue pair as created.
#[derive(Clone, Debug)]
#[non_exhaustive]
pub struct QpInfo {
    /// Its number.
    pub qpn: Qpn,
    /// The send ring.
    pub sq: RingInfo,
    /// The receive ring.
    pub rq: RingInfo,
    /// The processing unit it runs on.
    pub pu: usize,
}

/// A registered region as the caller sees it.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct MrInfo {
    /// Local key (the remote key has the same value).
    pub lkey: Lkey,
    /// First address.
    pub addr: VirtAddr,
    /// Length in bytes.
    pub len: u64,
    /// Rights granted.
    pub access: Access,
}

impl MrInfo {
    pub(crate) fn of(r: &MemoryRegion) -> MrInfo {
        MrInfo {
            lkey: r.lkey,
            addr: r.addr,
            len: r.len,
            access: r.access,
        }
    }

    /// A scatter/gather entry for `len` bytes at `off` into this region.
    #[must_use]
    pub fn sge(&self, off: u64, len: u32) -> Sge {
        Sge {
            addr: VirtAddr(self.addr.0 + off),
            len,
            lkey: self.lkey,
        }
    }

    /// The remote address of byte `off`.
    #[must_use]
    pub fn remote(&self, off: u64) -> crate::wqe::RemoteAddr {
        crate::wqe::RemoteAddr {
            addr: VirtAddr(self.addr.0 + off),
            rkey: self.lkey.into(),
        }
    }
}

/// Per-QP rate limit: a token bucket on WQEs and bytes. Zero means unlimited.
///
/// Build one with [`RateLimit::wqes`] or [`RateLimit::bytes`] (and [`RateLimit::with_bytes`]
/// / [`RateLimit::with_wqes`] for both); [`RateLimit::default`] is unlimited.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct RateLimit {
    /// WQEs per second.
    pub wqes_per_sec: u64,
    /// Payload bytes per second.
    pub bytes_per_sec: u64,
}

impl RateLimit {
    /// At most `per_sec` WQEs a second; bytes unlimited.
    #[must_use]
    pub const fn wqes(per_sec: u64) -> RateLimit {
        RateLimit {
            wqes_per_sec: per_sec,
            bytes_per_sec: 0,
        }
    }

    /// At most `per_sec` payload bytes a second; WQEs unlimited.
    #[must_use]
    pub const fn bytes(per_sec: u64) -> RateLimit {
        RateLimit {
            wqes_per_sec: 0,
            bytes_per_sec: per_sec,
        }
    }

    /// This limit with WQEs limited to `per_sec` a second.
    #[must_use = "with_wqes returns the changed limit"]
    pub const fn with_wqes(self, per_sec: u64) -> RateLimit {
        RateLimit {
            wqes_per_sec: per_sec,
            ..self
        }
    }

    /// This limit with payload bytes limited to `per_sec` a second.
    #[must_use = "with_bytes returns the changed limit"]
    pub const fn with_bytes(self, per_sec: u64) -> RateLimit {
        RateLimit {
            bytes_per_sec: per_sec,
            ..self
        }
    }

    /// True if neither dimension is limited.
    #[must_use]
    pub fn is_unlimited(&self) -> bool {
        self.wqes_per_sec == 0 && self.bytes_per_sec == 0
    }
}

/// Counters of one queue pair, readable while it runs.
#[derive(Clone, Debug, PartialEq, Eq, Default)]
#[non_exhaustive]
pub struct QpCounters {
    /// WQEs executed, by opcode (see [`QpCounters::by_opcode`]).
    pub wqes: [u64; 32],
    /// Payload bytes moved by this QP's WQEs.
    pub bytes: u64,
    /// WQEs that ended in an error completion (flushes not counted).
    pub errors: u64,
    /// Times a WAIT found its count not yet reached.
    pub wait_stalls: u64,
    /// Times the rate limiter held a WQE back.
    pub rate_limit_delays: u64,
    /// Times a SEND or WRITE_IMM found no receive posted at the peer.
    pub rnr_waits: u64,
    /// Receives consumed.
    pub recvs: u64,
    /// Send WQEs the host posted (through `post_send`); a NIC-resident loop leaves it still.
    pub host_posts: u64,
}

impl QpCounters {
    /// WQEs executed with `op`.
    #[must_use]
    pub fn by_opcode(&self, op: Opcode) -> u64 {
        self.wqes[op as usize & 31]
    }

    /// All WQEs executed.
    #[must_use]
    pub fn total_wqes(&self) -> u64 {
        self.wqes.iter().sum()
    }
}

/// What a completion reports.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct Completion {
    /// The work request's id.
    pub wr_id: u64,
    /// The queue pair.
    pub qpn: Qpn,
    /// Kind of completion.
    pub opcode: CqeOpcode,
    /// `Err` with the syndrome for error and flush completions.
    pub status: std::result::Result<(), Syndrome>,
    /// Bytes received (receives), 8 (atomics), or 0.
    pub byte_len: u32,
    /// Immediate data, for receives consumed by *_IMM operations.
    pub imm: Option<u32>,
    /// The raw CQE, for those who need its other fields.
    pub cqe: Cqe,
}

impl Completion {
    /// True if the work request succeeded.
    #[must_use]
    pub fn is_ok(&self) -> bool {
        self.status.is_ok()
    }

    /// The vendor syndrome of an error completion (`ibv_wc.vendor_err`: byte 54 of the error
    /// CQE, kept as the NIC wrote it), 0 otherwise.
    #[must_use]
    pub fn vendor_err(&self) -> u8 {
        self.cqe.vendor_syndrome
    }
}

/// An asynchronous event: something that happened to a queue pair or CQ outside any work
/// request's completion, as `ibv_get_async_event(3)` reports it. The owner of the object
/// reads them with [`Nic::get_async_event`] (the manager polls it and handles the client
/// whose object it names).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum AsyncEvent {
    /// `IBV_EVENT_QP_ACCESS_ERR`: a request that reached this queue pair as responder broke
    /// a key, PD, bounds or rights rule (mlx5: `MLX5_EVENT_TYPE_WQ_ACCESS_ERROR`). The queue
    /// pair is in the error state and its posted receives were flushed.
    QpAccessError(Qpn),
    /// `IBV_EVENT_QP_REQ_ERR`: an invalid request reached this queue pair as responder (a
    /// misaligned atomic, a message longer than the receive; mlx5:
    /// `MLX5_EVENT_TYPE_WQ_INVAL_REQ_ERROR`). The queue pair is in the error state and its
    /// posted receives were flushed.
    QpRequestError(Qpn),
    /// `IBV_EVENT_CQ_ERR`: the CQ overran (a completion found it full); it is in error and
    /// takes no more completions (mlx5: `MLX5_EVENT_TYPE_CQ_ERROR`).
    CqError(Cqn),
}

/// An RDMA NIC: the softnic or a ConnectX through rdma-core.
pub trait Nic: Send + Sync {
    /// A name for logs ("softnic0", "mlx5_2").
    fn name(&self) -> &str;
    /// Allocate a protection domain.
    fn alloc_pd(&self) -> Result<Pdn>;
    /// Free a protection domain that nothing uses any more.
    fn dealloc_pd(&self, pd: Pdn) -> Result<()>;
    /// Register `len` bytes of `buffer` from `offset`.
    fn reg_mr(
        &self,
        pd: Pdn,
        buffer: &Arc<SharedBuffer>,
        offset: usize,
        len: usize,
        access: Access,
    ) -> Result<MrInfo>;
    /// Deregister a region: its key stops working at once.
    fn dereg_mr(&self, lkey: Lkey) -> Result<()>;
    /// Create a completion queue.
    fn create_cq(&self, cfg: CqConfig) -> Result<Cqn>;
    /// Destroy a completion queue no queue pair uses.
    fn destroy_cq(&self, cq: Cqn) -> Result<()>;
    /// Create a queue pair (state INIT until connected).
    fn create_qp(&self, cfg: QpConfig) -> Result<QpInfo>;
    /// Destroy a queue pair (moves it to error first).
    fn destroy_qp(&self, qp: Qpn) -> Result<()>;
    /// Connect two queue pairs of this NIC to each other, or one to itself (loopback, as a
    /// program's worker queues are): both move to RTS.
    fn connect(&self, a: Qpn, b: Qpn) -> Result<()>;
    /// Encode and post send work requests; rings the doorbell unless the queue is managed.
    fn post_send(&self, qp: Qpn, wrs: &[WorkRequest]) -> Result<()>;
    /// Post one receive.
    fn post_recv(&self, qp: Qpn, wr_id: u64, sgl: &[Sge]) -> Result<()>;
    /// Tell the NIC that the send ring holds WQEs up to producer index `pi` (in BBs): what a
    /// doorbell write does. Ignored by managed queues, which only SEND_EN advances.
    fn ring_doorbell(&self, qp: Qpn, pi: u64) -> Result<()>;
    /// Record `wr_id` for the WQE starting at producer index `pi`, for code that writes WQE
    /// bytes straight into the ring, and advance the posted index to `end`.
    fn note_posted(&self, qp: Qpn, pi: u64, end: u64, wr_id: u64) -> Result<()>;
    /// Tell the NIC that the receive ring holds `n` receives written straight into it.
    fn note_recvs_posted(&self, qp: Qpn, n: u64) -> Result<()>;
    /// Take up to `max` completions off a CQ. This is how a host waits for completions: a
    /// poll that finds none reads the next entry only, as a verbs consumer reads the next
    /// CQE, and disturbs the NIC writing them no more than that.
    fn poll_cq(&self, cq: Cqn, max: usize, out: &mut Vec<Completion>) -> Result<usize>;
    /// Completions a CQ has produced since creation (what WAIT counts). The NIC's own
    /// count, exposed for tests, tools and WAIT targets; every completion writes it, so a
    /// host that spins on it slows the queues producing into the CQ (poll instead).
    fn cq_produced(&self, cq: Cqn) -> Result<u64>;
    /// Arm a CQ (`ibv_req_notify_cq`): the first completion it gets after this call puts one
    /// event on `channel`, then the CQ is disarmed. Completions already there do not count,
    /// so the usual loop is: arm, poll (or read `cq_produced`) until there is nothing new,
    /// wait for the event, repeat. Arming again before the event moves it to `channel`.
    fn req_notify_cq(&self, cq: Cqn, channel: &CompChannel) -> Result<()>;
    /// A queue pair's state.
    fn qp_state(&self, qp: Qpn) -> Result<QpState>;
    /// Move a queue pair to the error state: nothing more runs, outstanding WQEs are flushed.
    fn set_qp_error(&self, qp: Qpn) -> Result<()>;
    /// Set or clear a queue pair's rate limit.
    fn set_rate_limit(&self, qp: Qpn, limit: RateLimit) -> Result<()>;
    /// Read a queue pair's counters. While the queue runs they include every WQE run (and
    /// every error) whose consumption (`sq_consumed`) or completion (`poll_cq`,
    /// `cq_produced`) the caller has already seen, and may lag behind what ran after that.
    fn counters(&self, qp: Qpn) -> Result<QpCounters>;
    /// Send queue: WQEs consumed so far (producer-index units).
    fn sq_consumed(&self, qp: Qpn) -> Result<u64>;
    /// How many objects of each kind the NIC holds now, whoever created them.
    fn objects(&self) -> ObjectCounts;
    /// Take the oldest asynchronous event, if any (`ibv_get_async_event`, without
    /// blocking; the caller polls). Events are kept in order, up to a cap: past it the newest
    /// are dropped and [`Nic::async_events_lost`] counts them.
    fn get_async_event(&self) -> Option<AsyncEvent>;
    /// Asynchronous events dropped because nobody took them in time (the queue was full).
    fn async_events_lost(&self) -> u64;
}

/// How many objects of each kind a NIC holds: what a leak check compares before and after.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub struct ObjectCounts {
    /// Protection domains.
    pub pds: usize,
    /// Registered memory regions (each with its key).
    pub regions: usize,
    /// Completion queues.
    pub cqs: usize,
    /// Queue pairs.
    pub qps: usize,
}
