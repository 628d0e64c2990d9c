//! The auditor: what each installed offload does at run time, judged against its app's
//! budgets, from the NIC's own counters, so detection never depends on the client's
//! cooperation.
//!
//! The event loop calls [`Auditor::due`] and, every sampling interval (2 ms by default),
//! samples each offload's queues ([`Sample`]) and hands them to [`Auditor::observe`], which
//! answers with what to do ([`Verdict`]). Nothing here touches the NIC or a socket: the budget logic runs on
//! any [`Clock`], so its tests move a [`redn_sys::clock::ManualClock`] by hand.
//!
//! **Budgets** ([`Budget`], from the app's `[app.client]` rule):
//! - *WQEs per trigger* (`wqes_per_invocation`): the verifier bounds unrolled chains; a
//!   recycled loop (`iterations = { kind = "recycled" }`) runs as long as it is fed, so the
//!   auditor holds it to the same budget: over the offload's life, the WQEs it executed may
//!   exceed `triggers × wqes_per_invocation` by at most one invocation's worth (the round in
//!   flight). A loop that spins without triggers, or spends more per trigger than its budget,
//!   breaks this within one sampling interval. This is a **loop-budget** violation.
//! - *WQEs per second* (`wqes_per_second`), *bytes per second* (`rate_limit_kbps`) and
//!   *triggers per second* (`triggers_per_second`): rates measured over a [`RATE_WINDOW`],
//!   with [`RATE_TOLERANCE`] for the softnic's bursts. Bytes are also paced by the NIC from
//!   install on; WQEs are paced only once a client is throttled (the policy says the
//!   auditor counts them). The NIC cannot pace triggers, so a trigger flood is throttled by
//!   pacing WQEs at the trigger budget times the WQEs each of its triggers ran.
//!
//! **Escalation.** A rate violation first throttles (the client's queues are paced at its
//! budget), whatever `on_violation` says. A throttled client that keeps pressing against the
//! pacer for a whole window (the NIC's `rate_limit_delays` counter keeps climbing) has shown
//! it will not slow down: under `terminate` or `ban` it is then terminated (and banned), as
//! is one over a budget again within [`REPEAT_AFTER`] of its throttle being lifted. A
//! loop-budget violation goes straight to `on_violation`: a runaway loop cannot be slowed into
//! compliance. `throttle` never terminates anyone.
//!
//! **Bans** ([`Bans`]) are kept per app rule and uid (the app's own install broke its
//! budget: its connections and installs are refused) or per app rule and remote address (a
//! remote client's instance did: its hellos are refused), until the ban ends.

use redn_policy::{AppRule, KbitRate, OnViolation, TriggerRate, WqeRate};
use redn_sys::clock::Clock;
use redn_sys::nic::RateLimit;
use std::collections::HashMap;
use std::time::{Duration, Instant};

/// How often the loop samples every offload by default (detection latency is at most about
/// this, plus the time to tear down).
pub const DEFAULT_INTERVAL: Duration = Duration::from_millis(2);
/// The window rates are measured over.
pub const RATE_WINDOW: Duration = Duration::from_millis(100);
/// Measured rates may exceed the budget by this factor before it counts as a violation
/// (the softnic's token buckets let short bursts through).
pub const RATE_TOLERANCE: f64 = 1.25;
/// Pacer hold-backs in one window that show a throttled client is still pushing.
pub const PRESSING_DELAYS: u64 = 16;
/// Windows in a row without a single pacer hold-back after which a throttle is lifted.
pub const CALM_WINDOWS: u32 = 10;
/// A rate violation this soon after a throttle was lifted is not throttled again but goes
/// to `on_violation`, as a client still pressing against its pacer does: bursts shorter
/// than a window, each followed by the calm that lifts the throttle, otherwise cycled
/// throttle and release for ever at several times the budget.
pub const REPEAT_AFTER: Duration = Duration::from_secs(10);
/// How long the auditor remembers a remote client that holds no instance (its rate window
/// and throttle): one that says hello again within it goes on where it left off.
pub const CLIENT_MEMORY: Duration = Duration::from_secs(60);

/// What an offload may spend, from its app's rule.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Budget {
    /// WQEs per trigger (`wqes_per_invocation`).
    pub wqes_per_trigger: u64,
    /// WQEs per second (`wqes_per_second`), `None` for no limit.
    pub wqes_per_second: Option<u64>,
    /// Payload bytes per second (`rate_limit_kbps`), `None` for no limit.
    pub bytes_per_second: Option<u64>,
    /// Triggers per second (`triggers_per_second`), `None` for no limit.
    pub triggers_per_second: Option<u64>,
    /// What a violation gets (`on_violation`).
    pub on_violation: OnViolation,
}

impl Budget {
    /// The budget an app rule gives each of its offloads' clients.
    pub fn of(app: &AppRule) -> Budget {
        let c = &app.client;
        Budget {
            wqes_per_trigger: u64::from(c.wqes_per_invocation.get()),
            wqes_per_second: match c.wqes_per_second {
                WqeRate::Limited(n) => Some(n.get()),
                WqeRate::Unlimited => None,
            },
            bytes_per_second: match c.rate_limit_kbps {
                KbitRate::Limited(k) => Some(u64::from(k.get()) * 1000 / 8),
                KbitRate::Unlimited => None,
            },
            triggers_per_second: match c.triggers_per_second {
                TriggerRate::Limited(n) => Some(n.get()),
                TriggerRate::Unlimited => None,
            },
            on_violation: c.on_violation,
        }
    }

    /// The pacing every client has from install on: its bandwidth only.
    pub fn install_limit(&self) -> RateLimit {
        self.bytes_per_second
            .map_or_else(RateLimit::default, RateLimit::bytes)
    }

    /// The pacing a throttled client gets: its budgets, enforced by the NIC.
    pub fn throttle_limit(&self) -> RateLimit {
        let mut l = RateLimit::default();
        if let Some(b) = self.bytes_per_second {
            l = l.with_bytes(b);
        }
        // A client with no WQE budget that floods bytes is paced at one WQE per 64 bytes
        // of its byte budget, so throttling always lowers something.
        let wqes = self
            .wqes_per_second
            .or(self.bytes_per_second.map(|b| (b / 64).max(1)));
        if let Some(w) = wqes {
            l = l.with_wqes(w);
        }
        l
    }
}

/// One reading of an offload's counters, summed over its queues.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Sample {
    /// WQEs executed.
    pub wqes: u64,
    /// Payload bytes moved.
    pub bytes: u64,
    /// Triggers served (receives consumed on its client-facing queues).
    pub triggers: u64,
    /// WQEs that completed in error.
    pub errors: u64,
    /// Times the pacer held a WQE back.
    pub rate_limit_delays: u64,
    /// Queues found in the error state.
    pub queues_in_error: u32,
}

impl Sample {
    /// What the counters moved from `base` to `self` (queue states are not counters: 0).
    #[must_use]
    pub fn since(self, base: Sample) -> Sample {
        Sample {
            wqes: self.wqes.saturating_sub(base.wqes),
            bytes: self.bytes.saturating_sub(base.bytes),
            triggers: self.triggers.saturating_sub(base.triggers),
            errors: self.errors.saturating_sub(base.errors),
            rate_limit_delays: self
                .rate_limit_delays
                .saturating_sub(base.rate_limit_delays),
            queues_in_error: 0,
        }
    }

    /// The counters of `self` and `other` together (queue states: 0).
    #[must_use]
    pub fn plus(self, other: Sample) -> Sample {
        Sample {
            wqes: self.wqes.saturating_add(other.wqes),
            bytes: self.bytes.saturating_add(other.bytes),
            triggers: self.triggers.saturating_add(other.triggers),
            errors: self.errors.saturating_add(other.errors),
            rate_limit_delays: self
                .rate_limit_delays
                .saturating_add(other.rate_limit_delays),
            queues_in_error: 0,
        }
    }
}

/// What went wrong.
#[derive(Clone, Debug, PartialEq)]
pub enum Violation {
    /// More WQEs than the triggers served allow (a runaway or over-budget loop).
    LoopBudget {
        /// WQEs executed since install.
        wqes: u64,
        /// Triggers served since install.
        triggers: u64,
        /// WQEs those triggers allow.
        allowed: u64,
    },
    /// WQEs per second over budget.
    WqeRate {
        /// Measured.
        per_second: u64,
        /// Budget.
        limit: u64,
    },
    /// Bytes per second over budget.
    ByteRate {
        /// Measured.
        per_second: u64,
        /// Budget.
        limit: u64,
    },
    /// Triggers per second over budget.
    TriggerRate {
        /// Measured.
        per_second: u64,
        /// Budget.
        limit: u64,
    },
    /// Throttled, and still pressing against the pacer for a whole window.
    StillFlooding {
        /// Pacer hold-backs in the window.
        delays: u64,
    },
}

/// Every `rule=` an auditor record may carry ([`Violation::rule`]).
pub const RULES: [&str; 5] = [
    "loop-budget",
    "wqes-per-second",
    "bytes-per-second",
    "triggers-per-second",
    "still-flooding",
];

impl Violation {
    /// The `rule=` of its audit record (one of [`RULES`]).
    pub fn rule(&self) -> &'static str {
        match self {
            Violation::LoopBudget { .. } => "loop-budget",
            Violation::WqeRate { .. } => "wqes-per-second",
            Violation::ByteRate { .. } => "bytes-per-second",
            Violation::TriggerRate { .. } => "triggers-per-second",
            Violation::StillFlooding { .. } => "still-flooding",
        }
    }

    /// `key=value` details for its audit record.
    pub fn details(&self) -> Vec<(&'static str, String)> {
        match self {
            Violation::LoopBudget {
                wqes,
                triggers,
                allowed,
            } => vec![
                ("wqes", wqes.to_string()),
                ("triggers", triggers.to_string()),
                ("allowed", allowed.to_string()),
            ],
            Violation::WqeRate { per_second, limit }
            | Violation::ByteRate { per_second, limit }
            | Violation::TriggerRate { per_second, limit } => {
                vec![
                    ("measured_per_s", per_second.to_string()),
                    ("limit_per_s", limit.to_string()),
                ]
            }
            Violation::StillFlooding { delays } => vec![("pacer_delays", delays.to_string())],
        }
    }
}

/// What the loop must do to an offload.
#[derive(Clone, Debug, PartialEq)]
pub enum Verdict {
    /// Pace its queues at this limit.
    Throttle(Violation, RateLimit),
    /// It stopped pressing against its throttle: pace it as at install again.
    Unthrottle(RateLimit),
    /// Move its queues to error, revoke its keys, free it.
    Terminate(Violation),
    /// Terminate it and refuse its app's installs for this long (`None`: forever).
    Ban(Violation, Option<Duration>),
}

/// What the auditor knows of one offload.
#[derive(Clone, Debug)]
struct Track {
    budget: Budget,
    /// The counters at install (WQEs the install itself ran count against nobody).
    base: Sample,
    window_start: Instant,
    window_base: Sample,
    throttled: bool,
    /// Windows in a row a throttled offload did not touch its pacer.
    calm_windows: u32,
    /// When its throttle was last lifted (see [`REPEAT_AFTER`]).
    let_off_at: Option<Instant>,
    /// A queue in error was already reported.
    error_reported: bool,
    /// Error completions in the latest sample, and in the one before.
    last_errors: u64,
    prev_errors: u64,
}

/// Which budget track a sample belongs to: an offload's own install, or the instance the
/// data plane installed for one of its remote clients (each has budgets of its own, so one
/// runaway remote client is stopped without touching the others).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct TrackId {
    /// The offload's handle.
    pub handle: u64,
    /// The data plane's id of the remote client's instance; `None` for the app's install.
    pub remote: Option<u64>,
}

impl TrackId {
    /// The app's own install of offload `handle`.
    pub fn own(handle: u64) -> TrackId {
        TrackId {
            handle,
            remote: None,
        }
    }

    /// Remote client `id`'s instance of offload `handle`.
    pub fn remote(handle: u64, id: u64) -> TrackId {
        TrackId {
            handle,
            remote: Some(id),
        }
    }
}

/// A remote client of one app, as the auditor holds it to its rate budgets: the app's rule
/// and the client's address (the TCP peer's, which it cannot forge). Not one instance: a
/// bounded offload serves a few triggers a session and the client library says hello
/// again when one is used up, and a client may hold several sessions at once, so rates
/// judged per instance started afresh with every hello and each parallel session had the
/// whole budget. Nor one offload: the budgets are the app rule's, and a client of two of
/// its offloads judged per offload had each budget twice (a ban, too, is of the app). The
/// loop budget stays per instance (WQEs per trigger of each).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ClientId {
    /// The app's rule.
    pub app: AppKey,
    /// The client's address.
    pub addr: std::net::IpAddr,
}

/// An app rule as a number, so that a [`ClientId`] is a plain value: the manager numbers
/// each rule it meets by its name and the processes it is for (`state::app_keys::AppKeys`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct AppKey(pub u64);

/// Totals for `redn monitor` and the benchmarks.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct AuditorCounters {
    /// Sampling rounds.
    pub rounds: u64,
    /// Offload samples judged.
    pub samples: u64,
    /// Throttles ordered.
    pub throttles: u64,
    /// Throttles lifted.
    pub unthrottles: u64,
    /// Terminations ordered (bans included).
    pub terminations: u64,
}

/// The auditor's memory between samples.
#[derive(Debug)]
pub struct Auditor {
    interval: Duration,
    next: Option<Instant>,
    tracks: HashMap<TrackId, Track>,
    /// Remote clients' rate tracks, and when each last had an instance sampled.
    clients: HashMap<ClientId, (Track, Instant)>,
    /// Totals.
    pub counters: AuditorCounters,
}

impl Auditor {
    /// An auditor sampling every `interval`.
    pub fn new(interval: Duration) -> Auditor {
        Auditor {
            interval,
            next: None,
            tracks: HashMap::new(),
            clients: HashMap::new(),
            counters: AuditorCounters::default(),
        }
    }

    /// How long the loop may sleep before the next round is due (zero if it is due).
    pub fn until_due(&self, clock: impl Clock) -> Duration {
        self.next
            .map_or(Duration::ZERO, |n| n.saturating_duration_since(clock.now()))
    }

    /// Whether a round is due; if so, the next one is scheduled.
    pub fn due(&mut self, clock: impl Clock) -> bool {
        let now = clock.now();
        if self.next.is_some_and(|n| now < n) {
            return false;
        }
        self.next = Some(now + self.interval);
        self.counters.rounds += 1;
        true
    }

    /// Forget every track not in `live`, and every remote client with no instance sampled
    /// for [`CLIENT_MEMORY`].
    pub fn retain(&mut self, live: impl Fn(TrackId) -> bool, clock: impl Clock) {
        self.tracks.retain(|id, _| live(*id));
        let now = clock.now();
        self.clients
            .retain(|_, (_, seen)| now.saturating_duration_since(*seen) < CLIENT_MEMORY);
    }

    /// Forget remote client `id`: its rate window, its throttle and when one was last
    /// lifted. It was banned: once its ban ends (or is lifted) it starts afresh, as a client
    /// this auditor terminated does, rather than going on throttled or escalated for what
    /// it did before its ban. Whether it was remembered.
    pub fn forget_client(&mut self, id: ClientId) -> bool {
        self.clients.remove(&id).is_some()
    }

    /// Whether remote client `id` is remembered (its rate window and throttle).
    pub fn knows_client(&self, id: ClientId) -> bool {
        self.clients.contains_key(&id)
    }

    /// Whether remote client `id` is throttled.
    pub fn is_client_throttled(&self, id: ClientId) -> bool {
        self.clients.get(&id).is_some_and(|(t, _)| t.throttled)
    }

    /// Whether the offload's own install is throttled.
    pub fn is_throttled(&self, handle: u64) -> bool {
        self.is_track_throttled(TrackId::own(handle))
    }

    /// Whether track `id`'s error completions grew between its two latest samples. The
    /// manager then reads its queues' states (a WQE of its own that failed moves its queue
    /// to error, and no asynchronous event says so); a round after the growth was first
    /// seen, so that an event raised with it has had a round to come first.
    pub fn errors_grew(&self, id: TrackId) -> bool {
        self.tracks
            .get(&id)
            .is_some_and(|t| t.last_errors > t.prev_errors)
    }

    /// Whether track `id` is throttled.
    pub fn is_track_throttled(&self, id: TrackId) -> bool {
        self.tracks.get(&id).is_some_and(|t| t.throttled)
    }

    /// Judge the latest `sample` of offload `handle`'s own install under `budget` (see
    /// [`Auditor::observe_track`]).
    pub fn observe(
        &mut self,
        handle: u64,
        budget: Budget,
        at_install: Sample,
        sample: Sample,
        clock: impl Clock,
    ) -> (Option<Verdict>, bool) {
        self.observe_track(TrackId::own(handle), budget, at_install, sample, clock)
    }

    /// Judge track `id`'s latest `sample` under `budget`. `at_install` is the instance's
    /// counters when it was installed, read before any trigger could reach it: the loop
    /// budget charges every WQE after it, so a burst that ends before the track's first
    /// sample is charged too. Rates are measured from the first sample, for the app's own
    /// install only: a remote client's instance is held to its loop budget and queue
    /// errors, and its client's rates are judged over all the client's instances
    /// ([`Auditor::observe_client`]). Also returns whether a queue went to error for the
    /// first time (reported once, as an asynchronous QP event would be).
    pub fn observe_track(
        &mut self,
        id: TrackId,
        budget: Budget,
        at_install: Sample,
        sample: Sample,
        clock: impl Clock,
    ) -> (Option<Verdict>, bool) {
        let now = clock.now();
        self.counters.samples += 1;
        let t = self
            .tracks
            .entry(id)
            .or_insert_with(|| new_track(budget, at_install, sample, now));
        t.prev_errors = std::mem::replace(&mut t.last_errors, sample.errors);
        // A reload may have changed the budget.
        t.budget = budget;
        let new_error = sample.queues_in_error > 0 && !t.error_reported;
        t.error_reported |= sample.queues_in_error > 0;
        let verdict = match judge_loop(t, sample) {
            Some(loop_verdict) => loop_verdict,
            None if id.remote.is_none() => judge_rates(t, sample, now),
            None => None,
        };
        if settle_verdict(t, &verdict, &mut self.counters) {
            self.tracks.remove(&id);
        }
        (verdict, new_error)
    }

    /// Judge remote client `id`'s rates from `sample`, its counters summed over every
    /// instance it has held (released ones included, each from its attach), under `budget`.
    pub fn observe_client(
        &mut self,
        id: ClientId,
        budget: Budget,
        sample: Sample,
        clock: impl Clock,
    ) -> Option<Verdict> {
        let now = clock.now();
        let (t, seen) = self
            .clients
            .entry(id)
            .or_insert_with(|| (new_track(budget, Sample::default(), sample, now), now));
        *seen = now;
        t.budget = budget;
        let verdict = judge_rates(t, sample, now);
        if settle_verdict(t, &verdict, &mut self.counters) {
            self.clients.remove(&id);
        }
        verdict
    }
}

/// What `verdict` does to track `t` and the totals; true if the track ends with it (its
/// instance, or client, is terminated).
fn settle_verdict(
    t: &mut Track,
    verdict: &Option<Verdict>,
    counters: &mut AuditorCounters,
) -> bool {
    match verdict {
        Some(Verdict::Throttle(..)) => {
            t.throttled = true;
            counters.throttles += 1;
        }
        Some(Verdict::Unthrottle(_)) => {
            t.throttled = false;
            counters.unthrottles += 1;
        }
        Some(Verdict::Terminate(_) | Verdict::Ban(..)) => {
            counters.terminations += 1;
            return true;
        }
        None => {}
    }
    false
}

/// A track from its first `sample` at `now`, its loop budget counting from `base`.
fn new_track(budget: Budget, base: Sample, sample: Sample, now: Instant) -> Track {
    Track {
        budget,
        base,
        window_start: now,
        window_base: sample,
        throttled: false,
        calm_windows: 0,
        let_off_at: None,
        error_reported: false,
        last_errors: sample.errors,
        prev_errors: sample.errors,
    }
}

/// The loop-budget check: `Some(verdict)` when the track is over it (`Some(None)`: over,
/// but already paced as far as its policy goes), `None` when within it.
#[allow(clippy::option_option)] // "decided, with this verdict" vs "not decided here"
fn judge_loop(t: &mut Track, s: Sample) -> Option<Option<Verdict>> {
    let b = t.budget;
    let wqes = s.wqes.saturating_sub(t.base.wqes);
    let triggers = s.triggers.saturating_sub(t.base.triggers);
    let allowed = triggers
        .saturating_add(1)
        .saturating_mul(b.wqes_per_trigger);
    if wqes > allowed {
        let v = Violation::LoopBudget {
            wqes,
            triggers,
            allowed,
        };
        if t.throttled && b.on_violation == OnViolation::Throttle {
            // Already paced, as far as this policy goes: nothing new to do or record.
            t.calm_windows = 0;
            return Some(None);
        }
        return Some(Some(apply(t, v)));
    }
    None
}

/// The rate checks, once a window is complete.
fn judge_rates(t: &mut Track, s: Sample, now: Instant) -> Option<Verdict> {
    let b = t.budget;
    let elapsed = now.saturating_duration_since(t.window_start);
    if elapsed < RATE_WINDOW {
        return None;
    }
    let w = std::mem::replace(&mut t.window_base, s);
    t.window_start = now;
    let secs = elapsed.as_secs_f64();
    // Rates in f64: counters over a window are far below 2^53.
    let rate = |now: u64, then: u64| now.saturating_sub(then) as f64 / secs;
    let over =
        |measured: f64, limit: Option<u64>| limit.filter(|&l| measured > l as f64 * RATE_TOLERANCE);
    let trigger_rate = rate(s.triggers, w.triggers);
    let trigger_flood = over(trigger_rate, b.triggers_per_second);
    if t.throttled {
        let delays = s.rate_limit_delays.saturating_sub(w.rate_limit_delays);
        // A trigger flood the pacer did not slow is pressing as hard as one it holds back;
        // so are bytes over the budget that the pacer never saw (a peer's NAKs drawing
        // retransmissions, which go out unpaced).
        let byte_flood = over(rate(s.bytes, w.bytes), b.bytes_per_second);
        if delays >= PRESSING_DELAYS || trigger_flood.is_some() || byte_flood.is_some() {
            t.calm_windows = 0;
            return match b.on_violation {
                OnViolation::Throttle => None,
                _ => Some(apply(t, Violation::StillFlooding { delays })),
            };
        }
        t.calm_windows = if delays == 0 { t.calm_windows + 1 } else { 0 };
        if t.calm_windows >= CALM_WINDOWS {
            t.calm_windows = 0;
            t.let_off_at = Some(now);
            return Some(Verdict::Unthrottle(b.install_limit()));
        }
        return None;
    }
    // Let off a throttle moments ago and over a budget again: past throttling.
    let repeat = b.on_violation != OnViolation::Throttle
        && t.let_off_at
            .is_some_and(|at| now.saturating_duration_since(at) < REPEAT_AFTER);
    let first_or_repeat = |t: &Track, v: Violation| {
        if repeat {
            apply(t, v)
        } else {
            throttle(t, v)
        }
    };
    let wqe_rate = rate(s.wqes, w.wqes);
    if let Some(limit) = over(wqe_rate, b.wqes_per_second) {
        return Some(first_or_repeat(
            t,
            Violation::WqeRate {
                per_second: to_u64(wqe_rate),
                limit,
            },
        ));
    }
    let byte_rate = rate(s.bytes, w.bytes);
    if let Some(limit) = over(byte_rate, b.bytes_per_second) {
        return Some(first_or_repeat(
            t,
            Violation::ByteRate {
                per_second: to_u64(byte_rate),
                limit,
            },
        ));
    }
    if let (Some(limit), true) = (trigger_flood, repeat) {
        let v = Violation::TriggerRate {
            per_second: to_u64(trigger_rate),
            limit,
        };
        return Some(apply(t, v));
    }
    if let Some(limit) = trigger_flood {
        // Triggers cannot be paced: their WQEs are, at the trigger budget times what each
        // trigger of this window ran (at least one WQE).
        let triggers = s.triggers.saturating_sub(w.triggers).max(1);
        let per_trigger = s.wqes.saturating_sub(w.wqes).div_ceil(triggers).max(1);
        let mut paced = t.budget.throttle_limit();
        let wqes = limit.saturating_mul(per_trigger);
        // 0 is "not paced".
        paced.wqes_per_sec = match paced.wqes_per_sec {
            0 => wqes,
            w => w.min(wqes),
        };
        let v = Violation::TriggerRate {
            per_second: to_u64(trigger_rate),
            limit,
        };
        return Some(Verdict::Throttle(v, paced));
    }
    None
}

#[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)] // clamped to u64's range first
fn to_u64(x: f64) -> u64 {
    x.clamp(0.0, u64::MAX as f64) as u64
}

fn throttle(t: &Track, v: Violation) -> Verdict {
    Verdict::Throttle(v, t.budget.throttle_limit())
}

/// What `on_violation` orders for a violation that is past throttling.
fn apply(t: &Track, v: Violation) -> Verdict {
    match t.budget.on_violation {
        OnViolation::Throttle => throttle(t, v),
        OnViolation::Terminate => Verdict::Terminate(v),
        OnViolation::Ban(span) => Verdict::Ban(v, span.as_duration()),
    }
}

/// Who a ban is on.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Banned {
    /// An app (its rule and uid): its connections and installs are refused.
    App {
        /// The app rule's name.
        app: String,
        /// The uid it runs as.
        uid: u32,
    },
    /// A remote client of an app, as the data plane knows it: its address (the TCP peer's,
    /// which a client cannot forge; its port changes with every connection, and the token
    /// is shared by all of the offload's clients). Its hellos to the app's offloads are
    /// refused; clients of other apps are not touched.
    Remote {
        /// The app's rule, as it is numbered for its remote clients (a reload that gives the
        /// rule's name to other processes makes it another app: see [`AppKey`]).
        app: AppKey,
        /// The client's address.
        addr: std::net::IpAddr,
    },
}

/// Bans in force, each until a time (or for ever).
#[derive(Debug, Default)]
pub struct Bans {
    until: HashMap<Banned, Option<Instant>>,
}

impl Bans {
    /// Ban `who` for `span` from now (`None`: forever; so is a span too long for the
    /// clock, as an administrator's `BanRemote` may ask), unless a ban of `who` in force
    /// ends later: a ban never shortens another (an administrator banning an address the
    /// auditor banned for ever, for a minute, must not let it back in a minute later;
    /// `lift` is how a ban is cut short). What the ban in force now has left (`None`: for
    /// ever), for its record.
    pub fn ban(
        &mut self,
        who: Banned,
        span: Option<Duration>,
        clock: impl Clock,
    ) -> Option<Duration> {
        let now = clock.now();
        let asked = span.and_then(|d| now.checked_add(d));
        // An ended ban's end is before `asked`, so the later of the two is `asked`.
        let until = match (self.until.get(&who), asked) {
            (Some(None), _) | (_, None) => None,
            (Some(Some(held)), Some(asked)) => Some((*held).max(asked)),
            (None, Some(asked)) => Some(asked),
        };
        self.until.insert(who, until);
        until.map(|t| t.saturating_duration_since(now))
    }

    /// If `who` is banned now: `Some(remaining)` (`None` inside: forever).
    pub fn banned(&self, who: &Banned, clock: impl Clock) -> Option<Option<Duration>> {
        let until = self.until.get(who)?;
        match until {
            None => Some(None),
            Some(t) => {
                let left = t.saturating_duration_since(clock.now());
                (!left.is_zero()).then_some(Some(left))
            }
        }
    }

    /// The bans in force now, each with what is left of it (`None`: forever), in a
    /// stable order (for `io.redn.Admin.ListBans`).
    pub fn in_force(&self, clock: impl Clock) -> Vec<(Banned, Option<Duration>)> {
        let mut v: Vec<(Banned, Option<Duration>)> = self
            .until
            .keys()
            .filter_map(|who| Some((who.clone(), self.banned(who, &clock)?)))
            .collect();
        v.sort();
        v
    }

    /// Lift `who`'s ban (an administrator's order); whether it was in force.
    pub fn lift(&mut self, who: &Banned, clock: impl Clock) -> bool {
        let was = self.banned(who, &clock).is_some();
        self.until.remove(who);
        was
    }

    /// Drop ended bans.
    pub fn expire(&mut self, clock: impl Clock) {
        let now = clock.now();
        self.until.retain(|_, t| !matches!(t, Some(t) if *t <= now));
    }

    /// Bans held, ended or not (for the tests of `expire`: the map must not grow with
    /// every address ever banned).
    #[cfg(test)]
    fn held(&self) -> usize {
        self.until.len()
    }
}

/// `ban_duration` for an audit record.
pub fn describe_span(span: Option<Duration>) -> String {
    span.map_or_else(|| "infinity".into(), |d| format!("{}s", d.as_secs()))
}

#[cfg(test)]
mod tests;
