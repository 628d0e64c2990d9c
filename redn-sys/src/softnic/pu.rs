//! Processing units: worker threads that run queues. Each queue belongs to one PU, so a queue's
//! WQEs run in order while queues on different PUs run in parallel.
//!
//! Wake-ups dominate latency (design §3), so an idle PU spins for a short while (busy only
//! while the process's awake PUs fit its cores, yielding between polls and parking sooner
//! otherwise) before it parks. While awake it finds work by rescanning its queues; anything that may unblock one
//! of its queues (a doorbell, a SEND_EN, a completion a WAIT is counting, a receive a SEND
//! was waiting for) unparks it if it parks (`wake` has the handshake).

use super::affinity;
use super::exec::{RunOutcome, Siblings, SqExec};
use super::idle::{Found, IdleWork};
use super::shared::Shared;
use super::wake::{self, PuSet};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, OnceLock, Weak};
use std::time::{Duration, Instant};

/// How long a PU keeps polling after its last useful work before it parks.
const SPIN: Duration = Duration::from_micros(50);
/// For how much of that it busy-spins before it starts yielding the CPU between polls
/// (a yield costs ~1 µs on our VMs, so short gaps are better spun through; long ones are
/// better yielded, because PUs, apps and pollers often outnumber cores). Only while every
/// awake PU thread of the process can have a core: with more PUs than cores a spinning PU
/// holds the core that the PU with the work is waiting for, and each hand-off costs the
/// whole spin (measured on 2 cores: a one-bucket hash GET across two softnics, 3 PUs, took
/// 10-13 µs with the spin and 7-8 µs without; a chain handing off between 2 PUs took
/// 1-1.5 µs per step with the spin and 5 µs without, so PUs == cores keeps it).
const BUSY: Duration = Duration::from_micros(5);
/// How long an idle PU polls before it parks while the process's awake PUs outnumber its
/// cores ("crowded"): each of its polls then takes a turn on a core from a PU that has work,
/// so it parks soon, and a parked PU leaves the others the cores, which lets them busy-spin
/// again (a parallel hash GET's two server PUs while the client's PU waits for the answer).
const SPIN_CROWDED: Duration = Duration::from_micros(5);

/// PU threads of this process that are not parked, over all softnic instances.
static AWAKE_PUS: AtomicUsize = AtomicUsize::new(0);

/// The cores this process may use, as the first thread to start a softnic saw them.
static CORES: OnceLock<usize> = OnceLock::new();

/// Read the cores this process may use, from the thread that starts a softnic, before any
/// PU thread runs. `available_parallelism` reads the calling thread's CPU set, and a PU
/// pinned to one CPU (`SoftNicConfig::pu_cpus`) would see one core: every awake PU would
/// then count as crowded, and each cross-PU hand-off took twice as long.
pub(crate) fn read_cores() {
    CORES.get_or_init(|| std::thread::available_parallelism().map_or(1, |n| n.get()));
}

/// The cores this process may use ([`read_cores`]; 1 if no softnic was started).
fn cores() -> usize {
    CORES.get().copied().unwrap_or(1)
}

/// Whether the process's awake PUs outnumber its cores now.
fn crowded() -> bool {
    AWAKE_PUS.load(Ordering::Relaxed) > cores()
}

/// At most how long a queue stopped at a WAIT whose completion another awake PU is about to
/// produce spins for it ([`spin_for`]), rather than return to the PU loop. A cross-PU
/// doorbell step is a few hundred nanoseconds (two cache-line round trips and the work
/// between); a little more than that covers a step, and bounds what the PU's other queues
/// wait if the other PU is slow (preempted).
const HANDOFF_SPIN: Duration = Duration::from_micros(2);

/// Polls between two reads of the clock in [`spin_for`] (a clock read is ~20-25 ns, a poll
/// with its PAUSE a few to ~40).
const POLLS_PER_CLOCK: u32 = 32;

/// Poll `ready` until it is true (returning true) or [`HANDOFF_SPIN`] has passed (false),
/// pausing between polls, on PU `me` of `pus`; false at once while the process's awake PUs
/// outnumber its cores or another awake PU of the set was last seen on this PU's CPU
/// ([`PuSet::shares_cpu`]), where the spin would hold the core the PU producing the answer
/// waits for.
///
/// Why: a WAIT that blocks returns to the PU loop, which comes back to the queue a round
/// later through a full visit (the queue switch, on the master's side of every cross-PU
/// step); spinning on the one word the other PU writes sees its answer one cache-line
/// transfer after it is written and goes on in the same visit. The caller spins only
/// where an answer is coming (a completion of a queue it just enabled on another, awake
/// PU), so an idle queue still waits in the PU loop.
#[inline(never)]
pub(crate) fn spin_for(pus: &PuSet, me: usize, ready: impl FnMut() -> bool) -> bool {
    if crowded() || wake::current_cpu().is_some_and(|cpu| pus.shares_cpu(me, cpu)) {
        return false;
    }
    poll_for(HANDOFF_SPIN, ready)
}

/// [`spin_for`]'s loop: poll `ready`, pausing between polls, until it is true (true) or
/// `bound` has passed since the first [`POLLS_PER_CLOCK`] polls (false).
fn poll_for(bound: Duration, mut ready: impl FnMut() -> bool) -> bool {
    let mut start = None;
    loop {
        for _ in 0..POLLS_PER_CLOCK {
            if ready() {
                return true;
            }
            std::hint::spin_loop();
        }
        let now = Instant::now();
        if now.duration_since(*start.get_or_insert(now)) >= bound {
            return false;
        }
    }
}

/// Counts a PU thread in [`AWAKE_PUS`] while it lives, except while it is parked.
struct AwakePu;

impl AwakePu {
    fn enter() -> AwakePu {
        AWAKE_PUS.fetch_add(1, Ordering::Relaxed);
        AwakePu
    }

    /// Park the thread (until `deadline`, if any), not counted meanwhile.
    fn park(&self, deadline: Option<(Instant, Instant)>) {
        AWAKE_PUS.fetch_sub(1, Ordering::Relaxed);
        match deadline {
            Some((d, now)) => std::thread::park_timeout(d.saturating_duration_since(now)),
            None => std::thread::park(),
        }
        AWAKE_PUS.fetch_add(1, Ordering::Relaxed);
    }
}

impl Drop for AwakePu {
    fn drop(&mut self) {
        AWAKE_PUS.fetch_sub(1, Ordering::Relaxed);
    }
}

/// WQEs one queue may run before the PU looks at its other queues.
const BURST: usize = 256;

/// Idle rounds between two reads of the clock while a PU busy-spins: a round of a few quiet
/// queues is tens of nanoseconds, and a clock read each round would be a good part of it, so
/// of the time it takes the PU to find work handed to it.
const ROUNDS_PER_CLOCK: u32 = 16;

/// How near a queue's deadline must be to the PU's last clock reading for the PU to read the
/// clock for it in every idle round. A farther one is looked at every [`ROUNDS_PER_CLOCK`]
/// idle rounds, so it is seen that many rounds late at most, never early.
const DEADLINE_NEAR: Duration = Duration::from_micros(20);

/// Rounds with queue work between two polls of the PU's idle work.
const BUSY_ROUNDS_PER_IDLE_POLL: u32 = 64;

/// At most one move a PU makes off a CPU it shares with another busy PU ([`step_aside`]) in
/// this long: a move is two system calls and a migration.
const STEP_ASIDE_EVERY: Duration = Duration::from_millis(1);

/// The queues one PU runs and what it polls when they have nothing: the state of a PU's
/// round, kept by its thread, or by a host-driven softnic's handle for the calling thread
/// (`host_driven`), so both run the same round.
#[derive(Default)]
pub(crate) struct PuQueues {
    /// Boxed and taken out while they run, so a running queue can hand over to the others
    /// (`Siblings`).
    queues: Vec<Option<Box<SqExec>>>,
    /// What the PU polls when its queues have nothing (`idle`: a RoCE endpoint's socket).
    pub(crate) idle_work: Vec<Arc<dyn IdleWork>>,
}

impl PuQueues {
    /// Take the queues handed to PU `index` since the last call, drop destroyed ones and
    /// re-read the PU's idle work (after its `changed` flag was seen set).
    pub(crate) fn take_changes(&mut self, index: usize, shared: &Arc<Shared>) {
        let new: Vec<_> = std::mem::take(
            &mut *shared.incoming[index]
                .lock()
                .unwrap_or_else(|e| e.into_inner()),
        );
        for qp in new {
            self.queues
                .push(Some(Box::new(SqExec::new(qp, Arc::clone(shared)))));
        }
        self.queues
            .retain(|q| q.as_ref().is_some_and(|q| !q.is_destroyed()));
        self.idle_work = shared.idle.of(index);
    }

    /// Visit every queue once (up to `BURST` WQEs each): whether any made progress, and the
    /// earliest time a rate-limited one may go on.
    pub(crate) fn scan(&mut self) -> (bool, Option<Instant>) {
        let mut progress = false;
        let mut deadline: Option<Instant> = None;
        for i in 0..self.queues.len() {
            let Some(mut q) = self.queues[i].take() else {
                continue;
            };
            let outcome = q.run(
                BURST,
                Some(&mut Siblings {
                    queues: &mut self.queues,
                }),
            );
            self.queues[i] = Some(q);
            match outcome {
                RunOutcome::Progress => progress = true,
                RunOutcome::Idle => {}
                RunOutcome::RetryAt(t) => deadline = Some(deadline.map_or(t, |d| d.min(t))),
            }
        }
        (progress, deadline)
    }

    /// Poll the idle work once; the most any of it did.
    pub(crate) fn poll_idle(&self) -> Found {
        let mut found = Found::Nothing;
        for w in &self.idle_work {
            found = found.max(w.poll());
        }
        found
    }
}

/// Body of PU thread `index`. Holds only a weak reference to the NIC so that dropping the last
/// handle shuts the PUs down.
pub(crate) fn run(index: usize, pus: Arc<PuSet>, nic: Weak<Shared>) {
    let awake = AwakePu::enter();
    let me = &pus.pus[index].0;
    let _ = me.thread.set(std::thread::current());
    wake::enter(&pus, index);
    let mut round = PuQueues::default();
    let mut busy_rounds: u32 = 0;
    let mut idle_since: Option<Instant> = None;
    // Idle rounds since the last progress, and whether the PU has stopped busy-spinning.
    let mut idle_rounds: u32 = 0;
    let mut yielding = false;
    // Set `sleeping` and is making its last scan before it parks (`wake`'s handshake).
    let mut parking = false;
    // The clock as this loop last read it.
    let mut last_clock: Option<Instant> = None;
    // When this PU last moved off a CPU it shared with another PU; pinned PUs, and the PU of
    // a softnic that has one, stay put.
    let mut last_step: Option<Instant> = None;
    let may_step_aside =
        pus.len() > 1 && nic.upgrade().is_some_and(|s| s.config.pu_cpus.is_empty());
    loop {
        if pus.shutdown.load(Ordering::Acquire) {
            return;
        }
        if me.changed.load(Ordering::Relaxed) && me.changed.swap(false, Ordering::AcqRel) {
            let Some(shared) = nic.upgrade() else { return };
            round.take_changes(index, &shared);
        }

        let (mut progress, deadline) = round.scan();
        // Idle work runs when the queues have none, and every `BUSY_ROUNDS_PER_IDLE_POLL`
        // rounds of queue work too, so a PU kept busy does not starve what it polls.
        busy_rounds = if progress {
            busy_rounds.wrapping_add(1)
        } else {
            0
        };
        if busy_rounds % BUSY_ROUNDS_PER_IDLE_POLL == 0 {
            progress |= round.poll_idle() != Found::Nothing;
        }
        if progress {
            if may_step_aside {
                step_aside(&pus, index, crowded, &mut last_step);
            }
            if parking {
                me.awake();
                parking = false;
            }
            idle_since = None;
            idle_rounds = 0;
            yielding = false;
            continue;
        }
        idle_rounds = idle_rounds.wrapping_add(1);
        let mut now = None;
        if let Some(d) = deadline {
            // A RoCE queue with messages in flight always has one (its ACK timer, milliseconds
            // away): a clock read for it in every idle round, and the CPU check below that a
            // reading brings, lengthened the loop that takes the next datagram in.
            let near = last_clock.map_or(true, |t| d <= t + DEADLINE_NEAR);
            if near || idle_rounds % ROUNDS_PER_CLOCK == 1 {
                let t = Instant::now();
                last_clock = Some(t);
                if d <= t {
                    continue;
                }
                now = Some(t);
            }
        }
        if !parking {
            if yielding || now.is_some() || idle_rounds % ROUNDS_PER_CLOCK == 1 {
                let t = *now.get_or_insert_with(Instant::now);
                last_clock = Some(t);
                let idle = t.duration_since(*idle_since.get_or_insert(t));
                let crowded = crowded();
                // Sharing a core with another awake PU (a busy machine), this PU's spin
                // would only delay the other's work, which may be what it waits for.
                let shares_cpu = wake::current_cpu().is_some_and(|cpu| {
                    me.note_cpu(cpu);
                    pus.shares_cpu(index, cpu)
                });
                yielding = crowded || shares_cpu || idle >= BUSY;
                if idle >= if crowded { SPIN_CROWDED } else { SPIN } {
                    // One more scan with `sleeping` set before the park.
                    me.prepare_to_park();
                    parking = true;
                    continue;
                }
            }
            if yielding {
                std::thread::yield_now();
            } else {
                std::hint::spin_loop();
            }
            continue;
        }
        // The scan after `prepare_to_park` found nothing: whoever gives this PU work from
        // now on sees `sleeping` and unparks it.
        for w in &round.idle_work {
            w.parking();
        }
        awake.park(deadline.map(|d| (d, now.unwrap_or_else(Instant::now))));
        me.awake();
        parking = false;
        idle_since = None;
        idle_rounds = 0;
        yielding = false;
    }
}

/// A busy PU's look at its CPU (every round with queue work: `sched_getcpu` reads the
/// kernel's restartable-sequence area, a few nanoseconds): note it, and if a lower-numbered
/// awake PU of its set was last seen there too while the process's awake PUs fit its cores
/// (`crowded` says whether they do not), move to another CPU ([`affinity::step_aside`]), at
/// most once every [`STEP_ASIDE_EVERY`]. Whether it moved.
///
/// Why: the kernel places a woken thread near its waker or where it last ran, so two PUs
/// woken together often land on one CPU while another idles, and its load balancer leaves
/// them there for milliseconds (a task that ran within `sched_migration_cost_ns`, 0.5 ms, is
/// "cache hot" and is not pulled). Two PUs with work then run at half speed, and a cross-PU
/// hand-off waits for a context switch (`docs/softnic-performance.md`, "PUs that step
/// aside"). Only busy PUs move: an idle PU that shares a CPU yields it instead.
fn step_aside(
    pus: &PuSet,
    me: usize,
    crowded: impl FnOnce() -> bool,
    last_step: &mut Option<Instant>,
) -> bool {
    let Some(cpu) = wake::current_cpu() else {
        return false;
    };
    let mine = &pus.pus[me].0;
    mine.note_cpu(cpu);
    if !pus.lower_pu_on(me, cpu) || crowded() {
        return false;
    }
    let now = Instant::now();
    if last_step.is_some_and(|t| now.duration_since(t) < STEP_ASIDE_EVERY) {
        return false;
    }
    *last_step = Some(now);
    match affinity::step_aside(&pus.cpus_of_others(me)) {
        Some(landed) => {
            mine.note_cpu(landed);
            true
        }
        None => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// PU 1 of `set` (the calling thread) moves off the CPU it finds PU 0 on: PU 0 noted
    /// where the thread runs, then `step_aside`; retried, since the thread may migrate
    /// between the two reads of its CPU. The CPU it left, or None if it did not move.
    fn move_off_pu0(set: &PuSet, last: &mut Option<Instant>) -> Option<u32> {
        for _ in 0..100 {
            let here = wake::current_cpu().unwrap();
            set.pus[0].0.note_cpu(here);
            let tried = *last;
            if step_aside(set, 1, || false, last) {
                return Some(here);
            }
            assert_eq!(*last, tried, "tried to move and did not");
        }
        None
    }

    /// A busy PU on the CPU of a lower-numbered awake PU moves off it and notes where it
    /// landed, at most once every `STEP_ASIDE_EVERY`; a PU alone on its CPU stays, and so
    /// does one whose process has more awake PUs than cores.
    #[test]
    fn a_busy_pu_steps_off_another_pus_cpu_once_a_period() {
        std::thread::spawn(|| {
            if affinity::allowed_cpus().unwrap().len() < 2 {
                eprintln!("skipped: this process may run on one CPU only");
                return;
            }
            let set = PuSet::new(2);
            let mut last = None;
            set.pus[0].0.note_cpu(100_000);
            assert!(
                !step_aside(&set, 1, || false, &mut last),
                "alone on its CPU"
            );
            assert!(last.is_none());
            for _ in 0..10 {
                set.pus[0].0.note_cpu(wake::current_cpu().unwrap());
                assert!(
                    !step_aside(&set, 1, || true, &mut last),
                    "crowded: it stays"
                );
                assert!(last.is_none());
            }
            let left = move_off_pu0(&set, &mut last).expect("moved off PU 0's CPU");
            assert!(!set.shares_cpu(0, left), "PU 1 noted the CPU it landed on");
            // Not again within the period (a preempted test thread may see it pass).
            let moved_at = last.expect("the move was noted");
            if move_off_pu0(&set, &mut last).is_some() {
                assert!(
                    moved_at.elapsed() >= STEP_ASIDE_EVERY,
                    "moved twice in a period"
                );
            }
            last = last.map(|t| t - STEP_ASIDE_EVERY);
            assert!(move_off_pu0(&set, &mut last).is_some(), "a period later");
        })
        .join()
        .unwrap();
    }

    /// The spin's loop returns as soon as its condition holds, and gives up (having polled
    /// at least one batch) when it never does.
    #[test]
    fn polling_stops_when_ready_and_gives_up_when_never() {
        let mut polls = 0u32;
        assert!(poll_for(Duration::from_secs(60), || {
            polls += 1;
            polls == 100
        }));
        assert_eq!(polls, 100, "no poll after the condition held");
        let mut polls = 0u32;
        assert!(!poll_for(Duration::ZERO, || {
            polls += 1;
            false
        }));
        assert!(polls >= POLLS_PER_CLOCK);
    }
}
