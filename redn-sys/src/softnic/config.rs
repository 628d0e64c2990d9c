//! Settings of one softnic instance: plain data every other module may read.

/// How far ahead of execution a queue fetches WQEs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum Prefetch {
    /// Each WQE is fetched just before it runs ("snapshot at execute"): the most forgiving.
    AtExecute,
    /// Up to this many BBs past the running WQE are fetched early (at most
    /// [`Prefetch::MAX_DEPTH`]).
    Depth(u32),
    /// Everything eligible is fetched as early as allowed ("snapshot at enable / doorbell"),
    /// up to [`Prefetch::MAX_DEPTH`] BBs ahead: the harshest setting, for testing that a
    /// chain orders its patches correctly. In this setting the responses of unsignaled READs
    /// and atomics also land as late as ConnectX may land them: after later unfenced WQEs of
    /// the queue have run (a fenced WQE waits for them).
    Adversarial,
}

impl Prefetch {
    /// The furthest a queue fetches ahead, in BBs: each queue keeps its snapshots (64 bytes a
    /// BB), so this bounds that memory at 256 KiB a queue.
    pub const MAX_DEPTH: u64 = 4096;

    pub(crate) fn depth(self, ring_entries: u64) -> u64 {
        let d = match self {
            Prefetch::AtExecute => 0,
            Prefetch::Depth(d) => u64::from(d),
            Prefetch::Adversarial => ring_entries,
        };
        d.min(ring_entries).min(Self::MAX_DEPTH)
    }
}

/// Settings of one softnic instance: start from [`SoftNicConfig::new`] and set fields.
#[derive(Clone, Debug)]
#[non_exhaustive]
pub struct SoftNicConfig {
    /// Name for logs.
    pub name: String,
    /// Processing units (worker threads), 1..=64.
    pub pus: usize,
    /// WQE prefetch model.
    pub prefetch: Prefetch,
    /// Check that each WQE's QPN and index match its queue and slot (ConnectX's "WQE checks").
    /// RedN needs them off, because its chains keep operands in those fields; off by default.
    pub wqe_checks: bool,
    /// Run the executor's fast paths (the one-BB loop, the hot re-run loop, the doorbell
    /// hand-over). On by default. Off, every WQE goes through the general executor, which is
    /// the definition of what a WQE does: the fast paths are optimisations of it, and the
    /// differential test (`tests/differential.rs`) runs the same programs both ways and
    /// requires the same memory, completions, counters and states.
    pub fast_paths: bool,
    /// Run no PU threads: the calling thread runs the PUs' rounds inside its own calls
    /// (`post_send`, `ring_doorbell`, `post_recv`, `poll_cq`, [`SoftNic::progress`]), as a
    /// poll-mode driver does, so an app that busy-polls is the only thread on the path.
    /// Work handed to a queue (a doorbell, a SEND_EN, a completion a WAIT counts, a RoCE
    /// datagram) runs at the next such call; an app that stops calling stops its queues
    /// (`docs/rocev2.md`, "Host-driven softnics"). Off by default.
    ///
    /// [`SoftNic::progress`]: super::SoftNic::progress
    pub host_driven: bool,
    /// CPUs to pin the PU threads to: PU `i` runs only on `pu_cpus[i % len]`. Empty (the
    /// default): the kernel places them. Each must be one this process may run on. For cores
    /// kept free of other threads: a pinned PU cannot move away from another busy thread on
    /// its CPU (`softnic::affinity` says why pin at all).
    pub pu_cpus: Vec<usize>,
}

impl SoftNicConfig {
    /// A softnic called `name` with one processing unit, 8-BB prefetch and no WQE checks.
    #[must_use]
    pub fn new(name: &str) -> SoftNicConfig {
        SoftNicConfig {
            name: name.into(),
            pus: 1,
            prefetch: Prefetch::Depth(8),
            wqe_checks: false,
            fast_paths: true,
            host_driven: false,
            pu_cpus: Vec::new(),
        }
    }
}

impl Default for SoftNicConfig {
    /// [`SoftNicConfig::new`]`("softnic0")`.
    fn default() -> Self {
        SoftNicConfig::new("softnic0")
    }
}
