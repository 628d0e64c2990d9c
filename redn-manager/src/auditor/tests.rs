//! The auditor's budgets and bans on a manual clock.

use super::*;
use redn_policy::TimeSpan;
use redn_sys::clock::ManualClock;

fn budget(on: OnViolation) -> Budget {
    Budget {
        wqes_per_trigger: 16,
        wqes_per_second: Some(10_000),
        bytes_per_second: Some(1_000_000),
        triggers_per_second: None,
        on_violation: on,
    }
}

fn sample(wqes: u64, triggers: u64) -> Sample {
    Sample {
        wqes,
        triggers,
        ..Sample::default()
    }
}

#[test]
fn budgets_come_from_the_app_rule_in_the_units_the_auditor_counts() {
    let uid = nix::unistd::getuid().as_raw();
    let policy = redn_policy::parse_policy(
        &format!(
            "[[app]]\nname = \"t\"\nuid = {uid}\noffloads = [\"echo\"]\n\
             max_regions = 1\nmax_pinned = \"1M\"\nmax_queues = 4\nmax_remote_clients = 0\n\
             [app.client]\nrate_limit_kbps = 80\nwqes_per_second = \"2k\"\n\
             triggers_per_second = 300\nwqes_per_invocation = 24\n\
             on_violation = \"terminate\"\n"
        ),
        "policy.toml",
    )
    .unwrap();
    let b = Budget::of(policy.app("t").unwrap());
    assert_eq!(
        b,
        Budget {
            wqes_per_trigger: 24,
            wqes_per_second: Some(2_000),
            // 80 kbit/s is 10,000 bytes a second.
            bytes_per_second: Some(10_000),
            triggers_per_second: Some(300),
            on_violation: OnViolation::Terminate,
        }
    );
    assert_eq!(b.install_limit(), RateLimit::bytes(10_000));
    assert_eq!(
        b.throttle_limit(),
        RateLimit::bytes(10_000).with_wqes(2_000)
    );
    // No WQE budget: a throttled byte flooder is paced at one WQE per 64 bytes.
    let bytes_only = Budget {
        wqes_per_second: None,
        ..b
    };
    assert_eq!(
        bytes_only.throttle_limit(),
        RateLimit::bytes(10_000).with_wqes(10_000 / 64)
    );
}

#[test]
fn each_violation_details_what_was_measured_against_what() {
    let loop_budget = Violation::LoopBudget {
        wqes: 900,
        triggers: 8,
        allowed: 144,
    };
    assert_eq!(
        loop_budget.details(),
        [
            ("wqes", "900".to_owned()),
            ("triggers", "8".to_owned()),
            ("allowed", "144".to_owned())
        ]
    );
    for rate in [
        Violation::WqeRate {
            per_second: 30_000,
            limit: 20_000,
        },
        Violation::ByteRate {
            per_second: 30_000,
            limit: 20_000,
        },
        Violation::TriggerRate {
            per_second: 30_000,
            limit: 20_000,
        },
    ] {
        assert_eq!(
            rate.details(),
            [
                ("measured_per_s", "30000".to_owned()),
                ("limit_per_s", "20000".to_owned())
            ]
        );
    }
    assert_eq!(
        Violation::StillFlooding { delays: 17 }.details(),
        [("pacer_delays", "17".to_owned())]
    );
}

#[test]
fn tracks_no_longer_live_are_forgotten_and_samples_counted() {
    let clock = ManualClock::new();
    let mut a = Auditor::new(DEFAULT_INTERVAL);
    let b = budget(OnViolation::Terminate);
    let (gone, kept) = (TrackId::own(1), TrackId::own(2));
    let flooded = Sample {
        bytes: 1_000_000,
        ..Sample::default()
    };
    for t in [gone, kept] {
        a.observe_track(t, b, Sample::default(), Sample::default(), &clock);
        clock.advance(RATE_WINDOW);
        let (v, _) = a.observe_track(t, b, Sample::default(), flooded, &clock);
        assert!(matches!(v, Some(Verdict::Throttle(..))), "{v:?}");
    }
    assert_eq!(a.counters.samples, 4);
    a.retain(|t| t != gone, &clock);
    assert!(!a.is_track_throttled(gone));
    assert!(a.is_track_throttled(kept));
}

#[test]
fn rounds_are_due_once_per_interval() {
    let clock = ManualClock::new();
    let mut a = Auditor::new(Duration::from_millis(2));
    assert!(a.due(&clock));
    assert!(!a.due(&clock));
    assert_eq!(a.until_due(&clock), Duration::from_millis(2));
    clock.advance(Duration::from_millis(1));
    assert!(!a.due(&clock));
    assert_eq!(a.until_due(&clock), Duration::from_millis(1));
    clock.advance(Duration::from_millis(1));
    assert!(a.due(&clock));
    assert_eq!(a.counters.rounds, 2);
}

#[test]
fn each_remote_instance_is_judged_on_its_own_counters() {
    let base = sample(5, 0);
    let clock = ManualClock::new();
    let mut a = Auditor::new(DEFAULT_INTERVAL);
    let b = budget(OnViolation::Terminate);
    let (own, calm, runaway) = (
        TrackId::own(9),
        TrackId::remote(9, 1),
        TrackId::remote(9, 2),
    );
    for t in [own, calm, runaway] {
        assert_eq!(a.observe_track(t, b, base, sample(5, 0), &clock).0, None);
    }
    // The runaway's 100 WQEs without a trigger are its own, not the offload's.
    let (v, _) = a.observe_track(runaway, b, base, sample(105, 0), &clock);
    assert!(matches!(
        v,
        Some(Verdict::Terminate(Violation::LoopBudget { .. }))
    ));
    assert_eq!(
        a.observe_track(calm, b, base, sample(5 + 16, 1), &clock).0,
        None
    );
    assert_eq!(a.observe(9, b, base, sample(5, 0), &clock).0, None);
    // Its track is gone with it; the others keep theirs.
    a.retain(|t| t != runaway, &clock);
    assert_eq!(
        a.observe_track(calm, b, base, sample(5 + 32, 2), &clock).0,
        None
    );
    assert_eq!(a.counters.terminations, 1);
}

#[test]
fn a_loop_within_budget_per_trigger_is_left_alone() {
    let base = sample(5, 0);
    let clock = ManualClock::new();
    let mut a = Auditor::new(DEFAULT_INTERVAL);
    let b = budget(OnViolation::Terminate);
    // Install ran 5 WQEs: the baseline.
    assert_eq!(a.observe(1, b, base, sample(5, 0), &clock).0, None);
    // One round in flight before any trigger is allowed...
    assert_eq!(a.observe(1, b, base, sample(5 + 16, 0), &clock).0, None);
    // ...and exactly 16 per trigger after.
    clock.advance(Duration::from_millis(1));
    assert_eq!(
        a.observe(1, b, base, sample(5 + 16 * 11, 10), &clock).0,
        None
    );
}

#[test]
fn work_done_before_the_first_sample_is_charged() {
    let base = sample(5, 0);
    let clock = ManualClock::new();
    let mut a = Auditor::new(DEFAULT_INTERVAL);
    let b = budget(OnViolation::Terminate);
    // 64 triggers of 56 WQEs each against a budget of 16, all run between the install
    // and the first sample (a busy manager samples late): still over budget.
    let (v, _) = a.observe(1, b, base, sample(5 + 64 * 56, 64), &clock);
    assert!(
        matches!(
            v,
            Some(Verdict::Terminate(Violation::LoopBudget { wqes, triggers: 64, allowed }))
                if wqes == 64 * 56 && allowed == 65 * 16
        ),
        "{v:?}"
    );
    // The same burst within budget (16 a trigger) is left alone at its first sample.
    assert_eq!(
        a.observe(2, b, base, sample(5 + 64 * 16, 64), &clock).0,
        None
    );
    // And a loop that spun with no trigger before its first sample is stopped there.
    assert!(a.observe(3, b, base, sample(5 + 17, 0), &clock).0.is_some());
}

#[test]
fn a_runaway_loop_is_terminated_from_the_counters_alone() {
    let base = sample(5, 0);
    let clock = ManualClock::new();
    let mut a = Auditor::new(DEFAULT_INTERVAL);
    let b = budget(OnViolation::Terminate);
    a.observe(7, b, base, sample(5, 0), &clock);
    // One WQE past the allowance of 10 triggers.
    clock.advance(Duration::from_millis(2));
    let (v, _) = a.observe(7, b, base, sample(5 + 16 * 11 + 1, 10), &clock);
    assert_eq!(
        v,
        Some(Verdict::Terminate(Violation::LoopBudget {
            wqes: 16 * 11 + 1,
            triggers: 10,
            allowed: 16 * 11
        }))
    );
    assert_eq!(a.counters.terminations, 1);
    // Terminated offloads are forgotten: a handle seen again is a new install, judged
    // from its own counters at install.
    let reinstalled = sample(1_000_000, 10);
    assert_eq!(a.observe(7, b, reinstalled, reinstalled, &clock).0, None);
}

#[test]
fn bans_in_force_are_listed_with_what_is_left_and_can_be_lifted() {
    let clock = ManualClock::new();
    let mut bans = Bans::default();
    let app = Banned::App {
        app: "kv".into(),
        uid: 1000,
    };
    let remote = |addr: &str| Banned::Remote {
        app: AppKey(1),
        addr: addr.parse().unwrap(),
    };
    bans.ban(app.clone(), None, &clock);
    bans.ban(remote("192.0.2.7"), Some(Duration::from_secs(30)), &clock);
    bans.ban(remote("192.0.2.8"), Some(Duration::from_secs(10)), &clock);
    clock.advance(Duration::from_secs(10));
    assert_eq!(
        bans.in_force(&clock),
        [
            (app.clone(), None),
            (remote("192.0.2.7"), Some(Duration::from_secs(20)))
        ],
        "the ended ban is not listed, though not yet expired"
    );
    assert!(
        !bans.lift(&remote("192.0.2.8"), &clock),
        "ended: nothing lifted"
    );
    assert!(bans.lift(&remote("192.0.2.7"), &clock));
    assert_eq!(bans.banned(&remote("192.0.2.7"), &clock), None);
    assert!(!bans.lift(&remote("192.0.2.7"), &clock), "lifted once");
    assert!(bans.lift(&app, &clock), "a ban for ever");
    assert_eq!(bans.in_force(&clock), []);
    assert_eq!(bans.held(), 0, "lifting drops the entries");
    // A span past what the clock can hold is for ever, not a panic, and says so.
    let kept = bans.ban(app.clone(), Some(Duration::from_secs(u64::MAX)), &clock);
    assert_eq!(kept, None);
    assert_eq!(bans.in_force(&clock), [(app, None)]);
}

#[test]
fn a_ban_never_shortens_a_ban_in_force() {
    let clock = ManualClock::new();
    let mut bans = Bans::default();
    let who = |addr: &str| Banned::Remote {
        app: AppKey(1),
        addr: addr.parse().unwrap(),
    };
    let secs = Duration::from_secs;
    assert_eq!(bans.ban(who("192.0.2.1"), None, &clock), None);
    assert_eq!(bans.ban(who("192.0.2.1"), Some(secs(60)), &clock), None);
    assert_eq!(
        bans.banned(&who("192.0.2.1"), &clock),
        Some(None),
        "for ever"
    );
    assert_eq!(
        bans.ban(who("192.0.2.2"), Some(secs(3600)), &clock),
        Some(secs(3600))
    );
    clock.advance(secs(600));
    assert_eq!(
        bans.ban(who("192.0.2.2"), Some(secs(60)), &clock),
        Some(secs(3000)),
        "the longer ban kept"
    );
    assert_eq!(
        bans.ban(who("192.0.2.2"), Some(secs(7200)), &clock),
        Some(secs(7200)),
        "a longer one extends it"
    );
    assert_eq!(bans.ban(who("192.0.2.2"), None, &clock), None, "for ever");
    // An ended ban is no ban: a new one runs its own span.
    assert_eq!(
        bans.ban(who("192.0.2.3"), Some(secs(10)), &clock),
        Some(secs(10))
    );
    clock.advance(secs(20));
    assert_eq!(
        bans.ban(who("192.0.2.3"), Some(secs(5)), &clock),
        Some(secs(5))
    );
    // Lifted, an address may be banned for less.
    assert!(bans.lift(&who("192.0.2.2"), &clock));
    assert_eq!(
        bans.ban(who("192.0.2.2"), Some(secs(1)), &clock),
        Some(secs(1))
    );
}

#[test]
fn a_ban_policy_bans_for_its_duration() {
    let base = Sample::default();
    let clock = ManualClock::new();
    let mut a = Auditor::new(DEFAULT_INTERVAL);
    let span = TimeSpan::Finite(Duration::from_secs(60));
    let b = budget(OnViolation::Ban(span));
    a.observe(1, b, base, sample(0, 0), &clock);
    let (v, _) = a.observe(1, b, base, sample(100, 0), &clock);
    assert!(
        matches!(v, Some(Verdict::Ban(Violation::LoopBudget { .. }, Some(d))) if d == Duration::from_secs(60))
    );
    let app = |name: &str, uid| Banned::App {
        app: name.into(),
        uid,
    };
    let remote = |app: u64, addr: &str| Banned::Remote {
        app: AppKey(app),
        addr: addr.parse().unwrap(),
    };
    let mut bans = Bans::default();
    bans.ban(app("kv", 1000), Some(Duration::from_secs(60)), &clock);
    bans.ban(
        remote(1, "192.0.2.7"),
        Some(Duration::from_secs(30)),
        &clock,
    );
    assert_eq!(
        bans.banned(&app("kv", 1000), &clock),
        Some(Some(Duration::from_secs(60)))
    );
    assert_eq!(bans.banned(&app("kv", 1001), &clock), None, "another uid");
    assert_eq!(
        bans.banned(&app("other", 1000), &clock),
        None,
        "another app"
    );
    assert_eq!(
        bans.banned(&remote(1, "192.0.2.7"), &clock),
        Some(Some(Duration::from_secs(30)))
    );
    assert_eq!(
        bans.banned(&remote(1, "192.0.2.8"), &clock),
        None,
        "another address"
    );
    assert_eq!(
        bans.banned(&remote(2, "192.0.2.7"), &clock),
        None,
        "another app's client"
    );
    clock.advance(Duration::from_secs(30));
    assert_eq!(bans.banned(&remote(1, "192.0.2.7"), &clock), None);
    clock.advance(Duration::from_secs(29));
    assert_eq!(
        bans.banned(&app("kv", 1000), &clock),
        Some(Some(Duration::from_secs(1)))
    );
    clock.advance(Duration::from_secs(1));
    assert_eq!(bans.banned(&app("kv", 1000), &clock), None);
    bans.ban(app("kv", 1000), None, &clock);
    clock.advance(Duration::from_secs(1 << 30));
    assert_eq!(bans.banned(&app("kv", 1000), &clock), Some(None));
    bans.expire(&clock);
    assert_eq!(bans.banned(&app("kv", 1000), &clock), Some(None));
    // Ended bans are dropped, bans in force kept.
    bans.ban(app("kv", 1001), Some(Duration::from_secs(1)), &clock);
    assert_eq!(bans.held(), 2);
    clock.advance(Duration::from_secs(1));
    bans.expire(&clock);
    assert_eq!(bans.held(), 1);
    assert_eq!(bans.banned(&app("kv", 1000), &clock), Some(None));
}

/// An auditor that has seen offload 3 (2 WQEs per trigger, under `on`) flood at
/// 13_000 WQEs/s for one window, over 10_000 × 1.25; its verdict and last sample.
fn flooded(clock: &ManualClock, on: OnViolation) -> (Auditor, Budget, Sample, Option<Verdict>) {
    let base = Sample::default();
    let mut a = Auditor::new(DEFAULT_INTERVAL);
    let b = Budget {
        wqes_per_trigger: 2,
        ..budget(on)
    };
    a.observe(3, b, base, sample(0, 0), clock);
    clock.advance(RATE_WINDOW);
    let s = sample(1_300, 650);
    let (v, _) = a.observe(3, b, base, s, clock);
    (a, b, s, v)
}

#[test]
fn a_flood_is_throttled_then_terminated_if_it_keeps_pushing() {
    let base = Sample::default();
    let clock = ManualClock::new();
    let (mut a, b, mut s, v) = flooded(&clock, OnViolation::Terminate);
    assert_eq!(
        v,
        Some(Verdict::Throttle(
            Violation::WqeRate {
                per_second: 13_000,
                limit: 10_000
            },
            RateLimit::bytes(1_000_000).with_wqes(10_000)
        ))
    );
    assert!(a.is_throttled(3));
    // Paced, it still runs into the pacer 15 times in a window: tolerated.
    clock.advance(RATE_WINDOW);
    s.wqes += 1000;
    s.triggers += 500;
    s.rate_limit_delays += PRESSING_DELAYS - 1;
    assert_eq!(a.observe(3, b, base, s, &clock).0, None);
    // 16 times: it keeps pushing, terminated.
    clock.advance(RATE_WINDOW);
    s.wqes += 1000;
    s.triggers += 500;
    s.rate_limit_delays += PRESSING_DELAYS;
    assert_eq!(
        a.observe(3, b, base, s, &clock).0,
        Some(Verdict::Terminate(Violation::StillFlooding {
            delays: PRESSING_DELAYS
        }))
    );
}

#[test]
fn a_throttle_is_lifted_after_calm_windows_and_not_before() {
    let base = Sample::default();
    let clock = ManualClock::new();
    let (mut a, b, mut s, v) = flooded(&clock, OnViolation::Terminate);
    assert!(matches!(v, Some(Verdict::Throttle(..))));
    // Nine calm windows, then one hold-back: the count starts again.
    for _ in 0..CALM_WINDOWS - 1 {
        clock.advance(RATE_WINDOW);
        assert_eq!(a.observe(3, b, base, s, &clock).0, None);
    }
    clock.advance(RATE_WINDOW);
    s.rate_limit_delays += 1;
    assert_eq!(a.observe(3, b, base, s, &clock).0, None);
    for _ in 0..CALM_WINDOWS - 1 {
        clock.advance(RATE_WINDOW);
        assert_eq!(a.observe(3, b, base, s, &clock).0, None);
        assert!(a.is_throttled(3));
    }
    clock.advance(RATE_WINDOW);
    assert_eq!(
        a.observe(3, b, base, s, &clock).0,
        Some(Verdict::Unthrottle(RateLimit::bytes(1_000_000)))
    );
    assert!(!a.is_throttled(3));
    assert_eq!((a.counters.throttles, a.counters.unthrottles), (1, 1));
}

#[test]
fn under_throttle_policy_nobody_is_terminated() {
    let base = Sample::default();
    let clock = ManualClock::new();
    let (mut a, b, _, v) = flooded(&clock, OnViolation::Throttle);
    assert!(matches!(v, Some(Verdict::Throttle(..))));
    clock.advance(RATE_WINDOW);
    let s = Sample {
        rate_limit_delays: 1_000,
        ..sample(3_000, 1_500)
    };
    assert_eq!(a.observe(3, b, base, s, &clock).0, None);
    // A runaway loop that is already paced is not throttled again every round.
    assert_eq!(
        a.observe(3, b, base, sample(100_000, 1_500), &clock).0,
        None
    );
    assert_eq!(a.counters.throttles, 1);
    // One that is not yet paced is only paced.
    a.observe(4, b, base, sample(0, 0), &clock);
    let (v, _) = a.observe(4, b, base, sample(100_000, 0), &clock);
    assert!(matches!(
        v,
        Some(Verdict::Throttle(Violation::LoopBudget { .. }, _))
    ));
}

#[test]
fn rates_under_tolerance_and_byte_floods_are_told_apart() {
    let base = Sample::default();
    let clock = ManualClock::new();
    let mut a = Auditor::new(DEFAULT_INTERVAL);
    let b = Budget {
        wqes_per_trigger: 2,
        ..budget(OnViolation::Terminate)
    };
    a.observe(1, b, base, sample(0, 0), &clock);
    clock.advance(RATE_WINDOW);
    // 12_500/s is exactly the tolerance: not over.
    assert_eq!(a.observe(1, b, base, sample(1_250, 625), &clock).0, None);
    clock.advance(RATE_WINDOW);
    let s = Sample {
        bytes: 200_000,
        ..sample(1_250, 625)
    };
    let (v, _) = a.observe(1, b, base, s, &clock);
    assert!(matches!(
        v,
        Some(Verdict::Throttle(
            Violation::ByteRate {
                per_second: 2_000_000,
                limit: 1_000_000
            },
            _
        ))
    ));
}

#[test]
fn a_trigger_flood_is_paced_at_its_budget_and_terminated_if_it_keeps_on() {
    let base = Sample::default();
    let clock = ManualClock::new();
    let mut a = Auditor::new(DEFAULT_INTERVAL);
    let b = Budget {
        wqes_per_trigger: 64,
        wqes_per_second: None,
        bytes_per_second: None,
        triggers_per_second: Some(1_000),
        on_violation: OnViolation::Terminate,
    };
    a.observe(5, b, base, sample(0, 0), &clock);
    // 3 WQEs a trigger, well inside the WQE budget, but 2,000 triggers/s.
    clock.advance(RATE_WINDOW);
    let mut s = sample(600, 200);
    let (v, _) = a.observe(5, b, base, s, &clock);
    assert_eq!(
        v,
        Some(Verdict::Throttle(
            Violation::TriggerRate {
                per_second: 2_000,
                limit: 1_000
            },
            RateLimit::wqes(3_000)
        ))
    );
    // Paced, it sends 1,100/s: within the tolerance, left alone.
    clock.advance(RATE_WINDOW);
    s.wqes += 330;
    s.triggers += 110;
    assert_eq!(a.observe(5, b, base, s, &clock).0, None);
    // Still 2,000/s past the pacer: terminated.
    clock.advance(RATE_WINDOW);
    s.wqes += 600;
    s.triggers += 200;
    assert!(matches!(
        a.observe(5, b, base, s, &clock).0,
        Some(Verdict::Terminate(Violation::StillFlooding { .. }))
    ));
}

#[test]
fn error_counts_are_remembered_per_track() {
    let base = Sample::default();
    let clock = ManualClock::new();
    let mut a = Auditor::new(DEFAULT_INTERVAL);
    let b = budget(OnViolation::Terminate);
    let t = TrackId::remote(1, 2);
    let errors = |n| Sample {
        errors: n,
        ..Sample::default()
    };
    assert!(!a.errors_grew(t), "not seen yet");
    a.observe_track(t, b, base, errors(0), &clock);
    assert!(!a.errors_grew(t));
    a.observe_track(t, b, base, errors(3), &clock);
    assert!(a.errors_grew(t));
    assert!(!a.errors_grew(TrackId::own(1)), "another track");
    a.observe_track(t, b, base, errors(3), &clock);
    assert!(!a.errors_grew(t), "no new errors");
}

#[test]
fn a_queue_in_error_is_reported_once() {
    let base = Sample::default();
    let clock = ManualClock::new();
    let mut a = Auditor::new(DEFAULT_INTERVAL);
    let b = budget(OnViolation::Terminate);
    let bad = Sample {
        queues_in_error: 1,
        ..Sample::default()
    };
    assert_eq!(
        a.observe(1, b, base, Sample::default(), &clock),
        (None, false)
    );
    assert_eq!(a.observe(1, b, base, bad, &clock), (None, true));
    assert_eq!(a.observe(1, b, base, bad, &clock), (None, false));
}

fn client() -> ClientId {
    ClientId {
        app: AppKey(7),
        addr: std::net::IpAddr::from([10, 0, 0, 9]),
    }
}

#[test]
fn a_remote_clients_rates_are_judged_over_its_instances_not_per_instance() {
    let clock = ManualClock::new();
    let mut a = Auditor::new(DEFAULT_INTERVAL);
    let b = budget(OnViolation::Terminate);
    let c = client();
    // An instance track judges its loop budget only: a flood within it is not its to judge.
    let t = TrackId::remote(7, 1);
    let (v, _) = a.observe_track(t, b, Sample::default(), sample(0, 0), &clock);
    assert_eq!(v, None);
    assert!(!a.knows_client(c));
    assert_eq!(a.observe_client(c, b, sample(0, 0), &clock), None);
    assert!(a.knows_client(c) && !a.is_client_throttled(c));
    clock.advance(RATE_WINDOW);
    // 2,000 WQEs in a window (20,000 a second against 10,000), within the loop budget.
    let flood = sample(2_000, 200);
    let (v, _) = a.observe_track(t, b, Sample::default(), flood, &clock);
    assert_eq!(v, None, "an instance track does not judge rates");
    // The same counts, summed over the client's instances, break its WQE budget.
    match a.observe_client(c, b, flood, &clock) {
        Some(Verdict::Throttle(Violation::WqeRate { limit, .. }, _)) => assert_eq!(limit, 10_000),
        other => panic!("expected a WQE-rate throttle, got {other:?}"),
    }
    assert!(a.is_client_throttled(c));
    assert_eq!(a.counters.throttles, 1);
    // The loop budget still holds per instance: 10 triggers allow 11 × 16 WQEs.
    let (v, _) = a.observe_track(t, b, Sample::default(), sample(177, 10), &clock);
    assert!(
        matches!(v, Some(Verdict::Terminate(Violation::LoopBudget { .. }))),
        "{v:?}"
    );
}

#[test]
fn a_remote_client_is_remembered_for_a_while_after_its_last_instance() {
    let clock = ManualClock::new();
    let mut a = Auditor::new(DEFAULT_INTERVAL);
    let b = budget(OnViolation::Throttle);
    let c = client();
    a.observe_client(c, b, sample(0, 0), &clock);
    clock.advance(RATE_WINDOW);
    assert!(a.observe_client(c, b, sample(5_000, 10), &clock).is_some());
    // Remembered until CLIENT_MEMORY after its last sample, whatever tracks are live.
    let live = |_: TrackId| true;
    clock.advance(CLIENT_MEMORY - Duration::from_millis(1));
    a.retain(live, &clock);
    assert!(
        a.knows_client(c) && a.is_client_throttled(c),
        "a hello now goes on throttled"
    );
    clock.advance(Duration::from_millis(1));
    a.retain(live, &clock);
    assert!(!a.knows_client(c) && !a.is_client_throttled(c));
    // It is the app's client, not an offload's: with every offload of the app gone it is
    // remembered as long (a new offload of the app is held to the same budgets).
    a.observe_client(c, b, sample(0, 0), &clock);
    a.retain(|_| false, &clock);
    assert!(a.knows_client(c));
}

#[test]
fn a_terminated_remote_client_starts_afresh() {
    let clock = ManualClock::new();
    let mut a = Auditor::new(DEFAULT_INTERVAL);
    let b = budget(OnViolation::Terminate);
    let c = client();
    a.observe_client(c, b, sample(0, 0), &clock);
    clock.advance(RATE_WINDOW);
    assert!(matches!(
        a.observe_client(c, b, sample(5_000, 10), &clock),
        Some(Verdict::Throttle(..))
    ));
    // Throttled, and still pressing (a trigger flood the pacer did not slow).
    let b = Budget {
        triggers_per_second: Some(10),
        ..b
    };
    clock.advance(RATE_WINDOW);
    let v = a.observe_client(c, b, sample(5_100, 500), &clock);
    assert!(
        matches!(v, Some(Verdict::Terminate(Violation::StillFlooding { .. }))),
        "{v:?}"
    );
    assert!(!a.knows_client(c));
    assert_eq!(a.counters.terminations, 1);
}

#[test]
fn samples_subtract_and_add_field_by_field() {
    let a = Sample {
        wqes: 10,
        bytes: 20,
        triggers: 3,
        errors: 2,
        rate_limit_delays: 5,
        queues_in_error: 1,
    };
    let base = Sample {
        wqes: 4,
        bytes: 25,
        triggers: 1,
        errors: 2,
        rate_limit_delays: 1,
        queues_in_error: 1,
    };
    let d = a.since(base);
    assert_eq!(
        d,
        Sample {
            wqes: 6,
            bytes: 0,
            triggers: 2,
            errors: 0,
            rate_limit_delays: 4,
            queues_in_error: 0,
        }
    );
    assert_eq!(
        d.plus(base),
        Sample {
            wqes: 10,
            bytes: 25,
            triggers: 3,
            errors: 2,
            rate_limit_delays: 5,
            queues_in_error: 0,
        }
    );
    let max = Sample {
        wqes: u64::MAX,
        ..Sample::default()
    };
    assert_eq!(max.plus(max).wqes, u64::MAX);
}

#[test]
fn a_throttled_remote_client_that_calms_down_is_unthrottled() {
    let clock = ManualClock::new();
    let mut a = Auditor::new(DEFAULT_INTERVAL);
    let b = budget(OnViolation::Terminate);
    let c = client();
    a.observe_client(c, b, sample(0, 0), &clock);
    clock.advance(RATE_WINDOW);
    let mut s = sample(5_000, 10);
    assert!(matches!(
        a.observe_client(c, b, s, &clock),
        Some(Verdict::Throttle(..))
    ));
    // Windows in which the pacer never held it back: lifted after CALM_WINDOWS of them.
    for w in 1..=CALM_WINDOWS {
        clock.advance(RATE_WINDOW);
        s.wqes += 10;
        let v = a.observe_client(c, b, s, &clock);
        if w < CALM_WINDOWS {
            assert_eq!(v, None, "window {w}");
            assert!(a.is_client_throttled(c));
        } else {
            assert_eq!(v, Some(Verdict::Unthrottle(b.install_limit())));
        }
    }
    assert!(!a.is_client_throttled(c) && a.knows_client(c));
    assert_eq!((a.counters.throttles, a.counters.unthrottles), (1, 1));
}

#[test]
fn a_throttled_client_whose_bytes_stay_over_budget_is_still_flooding() {
    // Bytes the pacer never held back (retransmissions a peer's NAKs drew) keep a
    // throttled client over its byte budget: that presses as hard as a held-back flood.
    let clock = ManualClock::new();
    let mut a = Auditor::new(DEFAULT_INTERVAL);
    let b = budget(OnViolation::Terminate);
    let c = client();
    let bytes = |n: u64| Sample {
        bytes: n,
        ..Sample::default()
    };
    a.observe_client(c, b, bytes(0), &clock);
    clock.advance(RATE_WINDOW);
    // 1 MB/s budget: 200 KB in a window is 2 MB/s.
    assert!(matches!(
        a.observe_client(c, b, bytes(200_000), &clock),
        Some(Verdict::Throttle(Violation::ByteRate { .. }, _))
    ));
    // Within the budget while throttled (and no pacer hold-backs): nothing new.
    clock.advance(RATE_WINDOW);
    assert_eq!(a.observe_client(c, b, bytes(280_000), &clock), None);
    // Over it again, with no hold-back to show for it: still flooding.
    clock.advance(RATE_WINDOW);
    let v = a.observe_client(c, b, bytes(480_000), &clock);
    assert!(
        matches!(
            v,
            Some(Verdict::Terminate(Violation::StillFlooding { delays: 0 }))
        ),
        "{v:?}"
    );
}

#[test]
fn a_client_over_budget_again_soon_after_its_throttle_was_lifted_goes_to_on_violation() {
    let clock = ManualClock::new();
    let mut a = Auditor::new(DEFAULT_INTERVAL);
    let c = client();
    let run = |a: &mut Auditor, on: OnViolation, wqes: &mut u64| {
        let b = budget(on);
        // A burst: throttled.
        a.observe_client(c, b, sample(*wqes, 0), &clock);
        clock.advance(RATE_WINDOW);
        *wqes += 5_000;
        let v = a.observe_client(c, b, sample(*wqes, 0), &clock);
        assert!(matches!(v, Some(Verdict::Throttle(..))), "{v:?}");
        // Calm until let off.
        for _ in 0..CALM_WINDOWS {
            clock.advance(RATE_WINDOW);
            a.observe_client(c, b, sample(*wqes, 0), &clock);
        }
        assert!(!a.is_client_throttled(c));
        // Another burst soon after.
        clock.advance(RATE_WINDOW);
        *wqes += 5_000;
        a.observe_client(c, b, sample(*wqes, 0), &clock)
    };
    let mut wqes = 0;
    let v = run(&mut a, OnViolation::Terminate, &mut wqes);
    assert!(
        matches!(v, Some(Verdict::Terminate(Violation::WqeRate { .. }))),
        "{v:?}"
    );
    assert!(!a.knows_client(c));
    // Under throttle: throttled again.
    let v = run(&mut a, OnViolation::Throttle, &mut wqes);
    assert!(
        matches!(v, Some(Verdict::Throttle(Violation::WqeRate { .. }, _))),
        "{v:?}"
    );
    // Long after being let off: a first offence again.
    clock.advance(CLIENT_MEMORY);
    a.retain(|_| false, &clock);
    let b = budget(OnViolation::Terminate);
    a.observe_client(c, b, sample(wqes, 0), &clock);
    clock.advance(RATE_WINDOW);
    wqes += 5_000;
    assert!(matches!(
        a.observe_client(c, b, sample(wqes, 0), &clock),
        Some(Verdict::Throttle(..))
    ));
    for _ in 0..CALM_WINDOWS {
        clock.advance(RATE_WINDOW);
        a.observe_client(c, b, sample(wqes, 0), &clock);
    }
    // The burst's window ends exactly REPEAT_AFTER after the let-off: no longer "soon".
    clock.advance(REPEAT_AFTER - RATE_WINDOW);
    assert_eq!(a.observe_client(c, b, sample(wqes, 0), &clock), None);
    clock.advance(RATE_WINDOW);
    wqes += 5_000;
    let v = a.observe_client(c, b, sample(wqes, 0), &clock);
    assert!(matches!(v, Some(Verdict::Throttle(..))), "{v:?}");
}

#[test]
fn a_trigger_flood_soon_after_its_throttle_was_lifted_goes_to_on_violation() {
    let clock = ManualClock::new();
    let mut a = Auditor::new(DEFAULT_INTERVAL);
    let c = client();
    let b = Budget {
        triggers_per_second: Some(100),
        ..budget(OnViolation::Ban(TimeSpan::Finite(Duration::from_secs(60))))
    };
    a.observe_client(c, b, sample(0, 0), &clock);
    clock.advance(RATE_WINDOW);
    assert!(matches!(
        a.observe_client(c, b, sample(100, 100), &clock),
        Some(Verdict::Throttle(Violation::TriggerRate { .. }, _))
    ));
    for _ in 0..CALM_WINDOWS {
        clock.advance(RATE_WINDOW);
        a.observe_client(c, b, sample(100, 100), &clock);
    }
    clock.advance(RATE_WINDOW);
    let v = a.observe_client(c, b, sample(200, 200), &clock);
    assert!(
        matches!(v, Some(Verdict::Ban(Violation::TriggerRate { .. }, _))),
        "{v:?}"
    );
}
