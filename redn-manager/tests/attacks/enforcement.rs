//! The auditor's budgets and the pacing of remote clients and apps, attacked: work that
//! escapes its budget, and one client's work starving another's.
//!
//! Each test asserts the safe behaviour; a failing test is a weakness (the numbers are
//! printed with `--nocapture`).
//!
//! Found (these fail on the code as it is; 2-core VM, `pus = 1`):
//! - Rate budgets are kept per session (one `Track` per instance, created at its first
//!   sample, judged only once a 100 ms window has passed, forgotten at detach): a client
//!   whose sessions last under 100 ms is never judged (15-26k triggers/s against 100/s
//!   under "ban"); a throttled client sheds its throttle by saying hello again; hash-get's
//!   four-trigger sessions make every unmodified client such a client (7k/s against 100/s).
//! - Parallel sessions from one address each get the whole budget (4 x 150/s against 200/s,
//!   never judged), and can hold every `max_remote_clients` slot with a trigger a second.
//! - A throttle paces each queue of an instance at the whole budget: server-loop runs 1.9x
//!   its `wqes_per_second` (and its `triggers_per_second`) while throttled.
//! - A reload that lowers `rate_limit_kbps` never reaches the offload's pacing: sessions
//!   that follow run unpaced (885-1395 GETs in 90 ms against 2 at the new limit).
//! - Sequence NAKs that move one PSN on restore the requester's retries for every message
//!   behind it: 4 answers went out as 102 WRITEs, none paced or counted.
//!
//! Held: a pause whenever throttled (banned on the next burst), short bursts between calm
//! seconds (1.2-2.8x the budget, banned in one run of three: the design's throttle-then-
//! forgive lets about one window's burst through a second), a hello flood
//! (the auditor's rounds halve, the app's calls stay fast), a calm client's GETs while
//! another floods past its budget on one PU.

use super::*;
use redn_client::kv::TwoChoiceTable;
use redn_client::remote::{RemoteClient, RemoteOptions};
use redn_client::{Client, Error as ClientError};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// The first record holding all of `needles` within `within` (others read and dropped).
fn wait_record(m: &Manager, needles: &[&str], within: Duration) -> Option<String> {
    first_record_where(m, within, |rec| needles.iter().all(|n| rec.contains(n)))
}

/// GET key 0x2a on `c` until `until`; the GETs served and the error that ended it, if any.
fn get_until(c: &mut RemoteClient, until: Instant) -> (u64, Option<ClientError>) {
    let mut n = 0;
    while Instant::now() < until {
        match c.get(0x2a) {
            Ok(v) => {
                assert_eq!(v.as_deref(), Some(&b"hello"[..]));
                n += 1;
            }
            Err(e) => return (n, Some(e)),
        }
    }
    (n, None)
}

/// A client that keeps each session shorter than the auditor's first rate window (a fresh
/// session every `life`), for `total`: triggers served, sessions, and the first refusal.
fn churn(c: &mut RemoteClient, life: Duration, total: Duration) -> (u64, u64, Option<ClientError>) {
    let end = Instant::now() + total;
    let mut served = 0;
    let mut sessions = 0;
    while Instant::now() < end {
        if let Err(e) = c.reconnect() {
            return (served, sessions, Some(e));
        }
        sessions += 1;
        let (n, err) = get_until(c, (Instant::now() + life).min(end));
        served += n;
        if let Some(e) = err {
            return (served, sessions, Some(e));
        }
    }
    (served, sessions, None)
}

#[test]
fn sessions_shorter_than_the_rate_window_cannot_escape_the_trigger_budget() {
    // 100 triggers a second, banned for an hour over it. The attacker floods GETs (one
    // trigger each) but says hello again every 60 ms: each session is younger than the
    // auditor's first 100 ms rate window when it ends.
    let m = Manager::start_with_dataplane(&trigger_budget_ban_policy());
    let a = server_loop_app(&m);
    let mut c = remote_client(&a, Duration::from_secs(2)).unwrap();
    let total = Duration::from_secs(2);
    let start = Instant::now();
    let (served, sessions, err) = churn(&mut c, Duration::from_millis(60), total);
    let secs = start.elapsed().as_secs_f64();
    let rate = served as f64 / secs;
    let records = drain_records(&m, Duration::from_millis(300));
    let (bans, throttles, terminates) = (
        count(&records, "event=ban "),
        count(&records, "event=throttle "),
        count(&records, "event=terminate "),
    );
    eprintln!(
        "churn under ban: {served} triggers in {secs:.2}s = {rate:.0}/s over {sessions} \
         sessions (budget 100/s); ended by {err:?}; records: {bans} ban, {throttles} \
         throttle, {terminates} terminate"
    );
    // Safe: the address is throttled or banned, or its rate stays near its budget.
    assert!(
        bans > 0 || throttles > 0 || rate <= 300.0,
        "{rate:.0} triggers/s from one address against a budget of 100/s, never throttled \
         or banned ({sessions} sessions of 60 ms)"
    );
}

#[test]
fn a_throttled_client_cannot_shed_its_throttle_by_saying_hello_again() {
    // Under "throttle", a client over 100 triggers a second is paced to it. Once paced, the
    // attacker says hello again (and again, every 60 ms).
    let m = Manager::start_with_dataplane(&server_loop_policy(|p| {
        p.replace(
            "wqes_per_invocation",
            "triggers_per_second = 100\nwqes_per_invocation",
        )
        .replace(
            "on_violation = \"terminate\"",
            "on_violation = \"throttle\"",
        )
    }));
    let a = server_loop_app(&m);
    let stop = Arc::new(AtomicBool::new(false));
    let flag = stop.clone();
    let (endpoint, handle, token) = (a.endpoint.clone(), a.handle, a.token.clone());
    let flooder = std::thread::spawn(move || {
        let mut c = RemoteClient::connect(
            endpoint.parse().unwrap(),
            handle,
            &token,
            RemoteOptions {
                timeout: Duration::from_secs(2),
                ..Default::default()
            },
        )
        .unwrap();
        while !flag.load(Ordering::Relaxed) {
            c.get(0x2a).unwrap();
        }
        // Paced now: measure it for 500 ms.
        let start = Instant::now();
        let (paced, _) = get_until(&mut c, start + Duration::from_millis(500));
        let paced_rate = paced as f64 / start.elapsed().as_secs_f64();
        // Then say hello again, and keep doing so.
        let start = Instant::now();
        let (served, sessions, err) = churn(
            &mut c,
            Duration::from_millis(60),
            Duration::from_millis(1500),
        );
        let churn_rate = served as f64 / start.elapsed().as_secs_f64();
        (
            paced_rate,
            churn_rate,
            sessions,
            err.map(|e| format!("{e:?}")),
        )
    });
    let throttled = wait_record(
        &m,
        &["event=throttle ", " rule=triggers-per-second "],
        Duration::from_secs(5),
    );
    stop.store(true, Ordering::Relaxed);
    let (paced_rate, churn_rate, sessions, err) = flooder.join().unwrap();
    let records = drain_records(&m, Duration::from_millis(300));
    eprintln!(
        "throttled: {}; paced at {paced_rate:.0}/s; after saying hello again: \
         {churn_rate:.0}/s over {sessions} sessions (budget 100/s), ended by {err:?}; \
         later throttle records: {}",
        throttled.is_some(),
        count(&records, "event=throttle ")
    );
    assert!(throttled.is_some(), "the flood was never throttled");
    assert!(
        churn_rate <= 300.0,
        "a throttled client shed its throttle by saying hello again: {churn_rate:.0} \
         triggers/s against a budget of 100/s (paced: {paced_rate:.0}/s)"
    );
}

#[test]
fn parallel_sessions_from_one_address_cannot_multiply_the_trigger_budget() {
    // 200 triggers a second per client, banned over it; room for 8 clients. The attacker,
    // at one address, opens 4 sessions and keeps each at 150 GETs a second: each under the
    // budget, together three times it.
    let m = Manager::start_with_dataplane(&server_loop_policy(|p| {
        p.replace(
            "wqes_per_invocation",
            "triggers_per_second = 200\nwqes_per_invocation",
        )
        .replace(
            "on_violation = \"terminate\"",
            "on_violation = \"ban\"\nban_duration = \"1h\"",
        )
        .replace("max_remote_clients = 4", "max_remote_clients = 8")
    }));
    let a = server_loop_app(&m);
    let total = Arc::new(AtomicU64::new(0));
    let sessions = 4;
    let span = Duration::from_secs(2);
    let start = Instant::now() + Duration::from_millis(300);
    let threads: Vec<_> = (0..sessions)
        .map(|_| {
            let mut c = remote_client(&a, Duration::from_secs(2)).unwrap();
            let total = total.clone();
            std::thread::spawn(move || {
                while Instant::now() < start {
                    std::thread::sleep(Duration::from_millis(1));
                }
                let period = Duration::from_micros(1_000_000 / 150);
                let mut next = start;
                let mut failed = None;
                while Instant::now() < start + span {
                    match c.get(0x2a) {
                        Ok(_) => {
                            total.fetch_add(1, Ordering::Relaxed);
                        }
                        Err(e) => {
                            failed = Some(format!("{e:?}"));
                            break;
                        }
                    }
                    next += period;
                    if let Some(d) = next.checked_duration_since(Instant::now()) {
                        std::thread::sleep(d);
                    }
                }
                (c.sessions_opened(), failed)
            })
        })
        .collect();
    let outcomes: Vec<_> = threads.into_iter().map(|t| t.join().unwrap()).collect();
    let served = total.load(Ordering::Relaxed);
    let rate = served as f64 / span.as_secs_f64();
    let records = drain_records(&m, Duration::from_millis(300));
    let judged = count(&records, "event=ban ")
        + count(&records, "event=throttle ")
        + count(&records, "event=terminate ");
    eprintln!(
        "{sessions} parallel sessions from 127.0.0.1: {served} triggers in {:.1}s = \
         {rate:.0}/s (budget 200/s per client); auditor records: {judged}; sessions: \
         {outcomes:?}",
        span.as_secs_f64()
    );
    assert!(
        judged > 0 || rate <= 2.0 * 200.0,
        "one address ran {rate:.0} triggers/s on {sessions} sessions, each under the 200/s \
         budget, and the auditor never acted"
    );
}

/// The app's `Stats` for its one offload: (triggers, WQEs), all instances together.
fn offload_counters(app: &mut Client) -> (u64, u64) {
    let s = stats(app);
    let o = &s.offloads[0];
    (o.triggers, o.wqes)
}

#[test]
fn a_throttled_client_is_paced_at_its_wqe_budget_not_a_multiple_of_it() {
    // Under "throttle", a client over 2,000 WQEs a second is paced "at its budget". The
    // attacker floods GETs (server-loop: 56 WQEs a trigger, over three queues) and goes on
    // flooding once paced; it is never escalated under "throttle", so what the pacer lets
    // through is what it gets for as long as it likes.
    let m = Manager::start_with_dataplane(&server_loop_policy(|p| {
        p.replace("wqes_per_second = \"infinity\"", "wqes_per_second = 2000")
            .replace(
                "on_violation = \"terminate\"",
                "on_violation = \"throttle\"",
            )
    }));
    let mut a = server_loop_app(&m);
    let stop = Arc::new(AtomicBool::new(false));
    let flag = stop.clone();
    let mut c = remote_client(&a, Duration::from_secs(2)).unwrap();
    let flooder = std::thread::spawn(move || {
        let mut n = 0u64;
        while !flag.load(Ordering::Relaxed) {
            c.get(0x2a).unwrap();
            n += 1;
        }
        (n, c.sessions_opened())
    });
    let throttled = wait_record(
        &m,
        &["event=throttle ", " rule=wqes-per-second ", " address="],
        Duration::from_secs(5),
    );
    // Let the pacer settle, then measure a second of the paced flood.
    std::thread::sleep(Duration::from_millis(200));
    let (t0, w0) = offload_counters(&mut a._app);
    let start = Instant::now();
    std::thread::sleep(Duration::from_secs(1));
    let (t1, w1) = offload_counters(&mut a._app);
    let secs = start.elapsed().as_secs_f64();
    stop.store(true, Ordering::Relaxed);
    let (_, sessions) = flooder.join().unwrap();
    let wqe_rate = (w1 - w0) as f64 / secs;
    let trigger_rate = (t1 - t0) as f64 / secs;
    eprintln!(
        "throttle record: {throttled:?}\npaced flood: {wqe_rate:.0} WQEs/s ({trigger_rate:.0} \
         triggers/s) against wqes_per_second = 2000; sessions {sessions}"
    );
    assert!(throttled.is_some(), "never throttled");
    assert_eq!(sessions, 1);
    assert!(
        wqe_rate <= 2000.0 * 1.4,
        "throttled, the client still runs {wqe_rate:.0} WQEs/s against a budget of 2,000: \
         each of the instance's queues is paced at the whole budget"
    );
}

/// Flood GETs on `c` until one takes longer than `slow` (the pacer caught up with it) or
/// `most` passed; then the GETs served.
fn flood_until_slowed(
    c: &mut RemoteClient,
    slow: Duration,
    most: Duration,
) -> (u64, Option<ClientError>) {
    let end = Instant::now() + most;
    let mut n = 0;
    while Instant::now() < end {
        let t = Instant::now();
        if let Err(e) = c.get(0x2a) {
            return (n, Some(e));
        }
        n += 1;
        if t.elapsed() > slow && n > 50 {
            break;
        }
    }
    (n, None)
}

#[test]
fn a_client_that_pauses_whenever_throttled_cannot_flood_again_and_again() {
    // 100 triggers a second, banned over it. The attacker floods on one session until its
    // GETs slow down (it was throttled), pauses for 1.2 s (ten calm windows lift the
    // throttle), and floods again.
    let m = Manager::start_with_dataplane(&trigger_budget_ban_policy());
    let a = server_loop_app(&m);
    let mut c = remote_client(&a, Duration::from_secs(2)).unwrap();
    let start = Instant::now();
    let mut served = 0;
    let mut bursts = Vec::new();
    while start.elapsed() < Duration::from_secs(6) {
        let (n, err) = flood_until_slowed(&mut c, Duration::from_millis(3), Duration::from_secs(1));
        bursts.push(n);
        served += n;
        if let Some(e) = err {
            eprintln!("the flood was stopped: {e:?}");
            break;
        }
        std::thread::sleep(Duration::from_millis(1200));
    }
    let secs = start.elapsed().as_secs_f64();
    let rate = served as f64 / secs;
    let records = drain_records(&m, Duration::from_millis(300));
    let (throttles, unthrottles, bans) = (
        count(&records, "event=throttle "),
        count(&records, "event=unthrottle "),
        count(&records, "event=ban "),
    );
    eprintln!(
        "pause-when-throttled: {served} triggers in {secs:.1}s = {rate:.0}/s (budget 100/s), \
         bursts {bursts:?}, sessions {}; records: {throttles} throttle, {unthrottles} \
         unthrottle, {bans} ban",
        c.sessions_opened()
    );
    assert!(
        bans > 0 || rate <= 300.0,
        "{rate:.0} triggers/s against a budget of 100/s under \"ban\": throttled {throttles} \
         times and let off {unthrottles} times, never banned"
    );
}

#[test]
fn one_address_cannot_hold_every_slot_of_an_app_for_a_trigger_a_second() {
    // The attacker, at 127.0.0.1, holds all four sessions; a client at 127.0.0.2 says
    // hello meanwhile. No tenure rule: the address rule alone makes room.
    let (got_in, answers) = knock_on_a_hoard([1; 4], "infinity");
    assert!(
        got_in,
        "one address held all 4 of the app's slots with a trigger per session every 400 ms; \
         another address was refused {answers:?} for 3 s"
    );
}

#[test]
fn a_hello_flood_with_a_valid_token_does_not_stall_the_auditor_or_the_apps() {
    // A remote client with the token says hello and hangs up as fast as it can, from two
    // threads: each hello installs an instance (queues, code region) on the manager's one
    // event loop, which also runs the auditor and serves the apps. No budget counts hellos.
    let m = Manager::start_with_dataplane(&server_loop_policy(|p| p));
    let mut a = server_loop_app(&m);
    let mut mon = monitor(&m);
    next_counters(&mut mon);
    let c0 = next_counters(&mut mon);
    let t0 = Instant::now();
    let c1 = next_counters(&mut mon);
    let quiet_rounds = (c1.auditor_rounds - c0.auditor_rounds) as f64 / t0.elapsed().as_secs_f64();
    // The app's calls meanwhile, timed.
    let stop = Arc::new(AtomicBool::new(false));
    let hellos = Arc::new(AtomicU64::new(0));
    let flooders: Vec<_> = (0..2)
        .map(|_| {
            let (stop, hellos) = (stop.clone(), hellos.clone());
            let (endpoint, handle, token) = (a.endpoint.clone(), a.handle, a.token.clone());
            std::thread::spawn(move || {
                let hello = redn_proto::dataplane::Hello {
                    handle,
                    token: redn_client::remote::parse_token(&token).unwrap(),
                    record: client_record("127.0.0.1"),
                }
                .encode()
                .unwrap();
                while !stop.load(Ordering::Relaxed) {
                    let mut tcp = std::net::TcpStream::connect(&endpoint).unwrap();
                    tcp.set_read_timeout(Some(DEADLINE)).unwrap();
                    tcp.write_all(&hello).unwrap();
                    let _ = read_answer(&mut tcp);
                    hellos.fetch_add(1, Ordering::Relaxed);
                }
            })
        })
        .collect();
    let c2 = next_counters(&mut mon);
    let t2 = Instant::now();
    let h2 = hellos.load(Ordering::Relaxed);
    let mut worst = Duration::ZERO;
    let mut calls = 0;
    while t2.elapsed() < Duration::from_secs(2) {
        let t = Instant::now();
        let _ = stats(&mut a._app);
        worst = worst.max(t.elapsed());
        calls += 1;
        std::thread::sleep(Duration::from_millis(10));
    }
    let c3 = next_counters(&mut mon);
    let secs = t2.elapsed().as_secs_f64();
    let h3 = hellos.load(Ordering::Relaxed);
    stop.store(true, Ordering::Relaxed);
    for f in flooders {
        f.join().unwrap();
    }
    let flood_rounds = (c3.auditor_rounds - c2.auditor_rounds) as f64 / secs;
    let hello_rate = (h3 - h2) as f64 / secs;
    eprintln!(
        "hello flood: {hello_rate:.0} hellos/s; auditor rounds {quiet_rounds:.0}/s quiet, \
         {flood_rounds:.0}/s under the flood; the app's Stats: {calls} calls, worst {worst:?}"
    );
    assert!(
        flood_rounds >= quiet_rounds / 4.0,
        "a hello flood cut the auditor from {quiet_rounds:.0} to {flood_rounds:.0} rounds/s"
    );
    assert!(
        worst < Duration::from_millis(250),
        "an app call took {worst:?}"
    );
}

#[test]
fn a_client_over_its_trigger_budget_does_not_starve_another_clients_gets() {
    // One PU, as shipped. Every client may send 100 triggers a second (banned over it). A
    // calm client GETs as fast as it can, alone and then while the attacker floods in
    // sessions shorter than the auditor's first rate window.
    let m = Manager::start_with_dataplane(&trigger_budget_ban_policy());
    let a = server_loop_app(&m);
    // Another address: a client is its address, so one at the attacker's would share its
    // budget (and its ban).
    let calm_at = Some(std::net::Ipv4Addr::new(127, 0, 0, 2));
    let mut calm = remote_client_from(&a, Duration::from_secs(2), calm_at).unwrap();
    // The calm client is inside its budget only if it GETs at most 100 a second: it does,
    // paced, and its latency is what is measured.
    let paced_gets = |c: &mut RemoteClient, span: Duration| {
        let start = Instant::now();
        let mut lat = Vec::new();
        let mut next = start;
        while start.elapsed() < span {
            let t = Instant::now();
            c.get(0x2a).unwrap();
            lat.push(t.elapsed());
            next += Duration::from_millis(12);
            if let Some(d) = next.checked_duration_since(Instant::now()) {
                std::thread::sleep(d);
            }
        }
        lat.sort();
        // Percentiles in thousandths.
        let p = |per_mille: usize| lat[(lat.len() - 1) * per_mille / 1000];
        (lat.len(), p(500), p(990), *lat.last().unwrap())
    };
    let alone = paced_gets(&mut calm, Duration::from_secs(1));
    let stop = Arc::new(AtomicBool::new(false));
    let flag = stop.clone();
    let mut attacker = remote_client(&a, Duration::from_secs(2)).unwrap();
    let flooder = std::thread::spawn(move || {
        let mut served = 0;
        while !flag.load(Ordering::Relaxed) {
            let (n, _, err) = churn(
                &mut attacker,
                Duration::from_millis(60),
                Duration::from_millis(200),
            );
            served += n;
            if err.is_some() {
                break;
            }
        }
        served
    });
    let start = Instant::now();
    let flooded = paced_gets(&mut calm, Duration::from_millis(1500));
    stop.store(true, Ordering::Relaxed);
    let attack = flooder.join().unwrap() as f64 / start.elapsed().as_secs_f64();
    eprintln!(
        "calm client (GETs, median / p99 / worst): alone {:?}; while another client at its \
         address floods {attack:.0} triggers/s against a budget of 100/s: {:?}",
        alone, flooded
    );
    assert!(
        flooded.2 <= (alone.2 * 10).max(Duration::from_millis(5)),
        "the calm client's p99 GET went from {:?} to {:?} while a client over its budget \
         ran {attack:.0} triggers/s",
        alone.2,
        flooded.2
    );
}

/// GETs a fresh remote client of `a` is served in its first `span` (its session's first
/// moments, before any auditor window closes).
fn gets_of_a_fresh_session(a: &App, span: Duration) -> u64 {
    let mut c = remote_client(a, Duration::from_secs(2)).unwrap();
    let (n, err) = get_until(&mut c, Instant::now() + span);
    assert!(err.is_none(), "{err:?}");
    n
}

#[test]
fn a_reload_that_lowers_rate_limit_kbps_paces_the_sessions_that_follow() {
    // 1,000 bytes a second (8 kbit/s) for every client. Control: a manager started with it;
    // then one started without a bandwidth limit whose policy is reloaded with it. In each,
    // a new remote client GETs as fast as it can for 90 ms.
    let limited = |p: String| {
        p.replace("rate_limit_kbps = \"infinity\"", "rate_limit_kbps = 8")
            .replace(
                "on_violation = \"terminate\"",
                "on_violation = \"throttle\"",
            )
    };
    let control = {
        let m = Manager::start_with_dataplane(&server_loop_policy(limited));
        let a = server_loop_app(&m);
        gets_of_a_fresh_session(&a, Duration::from_millis(90))
    };
    let m = Manager::start_with_dataplane(&server_loop_policy(|p| {
        p.replace(
            "on_violation = \"terminate\"",
            "on_violation = \"throttle\"",
        )
    }));
    let a = server_loop_app(&m);
    let before = gets_of_a_fresh_session(&a, Duration::from_millis(90));
    std::fs::write(m.dir.join("policy.toml"), server_loop_policy(limited)).unwrap();
    let _: redn_proto::api::Reloaded =
        m.admin_call("io.redn.Admin.ReloadPolicy", serde_json::json!({}));
    // The offload was kept (its rule still allows it).
    let list: redn_proto::api::InstalledList =
        m.admin_call("io.redn.Admin.ListOffloads", serde_json::json!({}));
    assert_eq!(list.offloads.len(), 1);
    let after = gets_of_a_fresh_session(&a, Duration::from_millis(90));
    eprintln!(
        "GETs of a fresh session in 90 ms at rate_limit_kbps = 8: {control} when the manager \
         started with it; {before} unlimited; {after} after a reload set it"
    );
    assert!(
        after <= control.max(1) * 5,
        "after the reload a new session got {after} GETs in 90 ms, where one paced at the \
         new limit gets {control}: the reload did not reach the offload's pacing"
    );
}

#[test]
fn a_hash_get_client_is_held_to_its_trigger_budget() {
    // hash-get serves four triggers an instance: the client library says hello again every
    // four. Every client may send 100 triggers a second, banned over it. An unmodified
    // client GETs as fast as it can for 2 s.
    let m = Manager::start_with_dataplane(
        &policy("", "triggers_per_second = 100\nban_duration = \"1h\"")
            .replace("on_violation = \"terminate\"", "on_violation = \"ban\""),
    );
    let mut app = m.client();
    let mut table = TwoChoiceTable::create(64).unwrap();
    let (_, installed) = app.install_table("hash-get", &mut table).unwrap();
    table.set(0x2a, b"hello").unwrap();
    let mut c = RemoteClient::connect(
        installed.endpoint.clone().unwrap().parse().unwrap(),
        installed.handle,
        &installed.token,
        RemoteOptions {
            timeout: Duration::from_secs(2),
            ..Default::default()
        },
    )
    .unwrap();
    let start = Instant::now();
    let (served, err) = get_until(&mut c, start + Duration::from_secs(2));
    let secs = start.elapsed().as_secs_f64();
    let rate = c.triggers_sent() as f64 / secs;
    // From the manager's stderr, which has every record at once: hundreds of sessions' own
    // records may still queue for the syslog receiver behind a full socket.
    std::thread::sleep(Duration::from_millis(300));
    let log = m.log();
    let records: Vec<String> = log.lines().map(str::to_owned).collect();
    let judged = count(&records, "event=ban ")
        + count(&records, "event=throttle ")
        + count(&records, "event=terminate ");
    eprintln!(
        "hash-get: {served} GETs, {} triggers in {secs:.1}s = {rate:.0} triggers/s (budget \
         100/s) over {} sessions; ended by {err:?}; auditor records: {judged}",
        c.triggers_sent(),
        c.sessions_opened()
    );
    assert!(
        judged > 0 || rate <= 300.0,
        "an unmodified hash-get client ran {rate:.0} triggers/s against a budget of 100/s \
         and the auditor never acted"
    );
}

#[test]
fn sequence_naks_cannot_make_the_manager_resend_an_answer_more_than_its_retries() {
    // hash-get answers each of an instance's four triggers with an unsignaled WRITE, so
    // four can be outstanding. The attacker triggers four, acknowledges none, then sends a
    // sequence NAK at the oldest seven times, moves its NAK one PSN on (which acknowledges
    // one answer: progress, so the retries are restored), and so on.
    // Found: every sequence NAK started a go-back of the whole window and cost a retry
    // only without progress: 28 NAKs of 20 bytes got 102 WRITEs. Fixed as rxe's completer
    // does it (`started_retry`): while the go-back one NAK started is under way, further
    // NAKs start none, until progress or the ACK timer.
    let m = Manager::start_with_dataplane(&policy("", ""));
    let mut app = m.client();
    let mut table = TwoChoiceTable::create(64).unwrap();
    let (_, installed) = app.install_table("hash-get", &mut table).unwrap();
    let value = [0x5au8; 64];
    table.set(0x2a, &value).unwrap();
    let a = App {
        endpoint: installed.endpoint.clone().unwrap(),
        handle: installed.handle,
        token: installed.token.clone(),
        _app: app,
        _table: table,
    };
    let peer = raw_peer::Peer::new();
    // The manager's ACK timer at 4.3 s (timeout code 20, which the record sets): every
    // resend in the test's ~0.3 s is the NAKs' doing, none the timer's.
    let mut record = peer.record(0x42);
    record.timeout = 20;
    let mut s = raw_peer::Door::of_app(&a).hello(&record);
    let table_rec = s.server.region("table").unwrap().clone();
    let buckets = table_rec.len / redn_client::kv::BUCKET_STRIDE;
    let bucket = table_rec.addr
        + redn_client::kv::bucket_indices(0x2a, buckets)[0] * redn_client::kv::BUCKET_STRIDE;
    let mut writes = 0u64;
    let mut write_bytes = 0u64;
    let mut psns = std::collections::BTreeSet::new();
    // Four triggers, each sent again after an RNR NAK until its answer comes.
    for _ in 0..4 {
        let at = s.epsn;
        let end = Instant::now() + Duration::from_secs(5);
        loop {
            assert!(Instant::now() < end, "no answer");
            s.epsn = at;
            peer.trigger_at(&mut s, bucket);
            let Some((h, n)) = peer.recv(Duration::from_millis(200)) else {
                continue;
            };
            if raw_peer::is_request(&h) {
                writes += 1;
                write_bytes += n.payload as u64;
                psns.insert(h.psn);
                break;
            }
            if raw_peer::is_rnr(&h) {
                std::thread::sleep(Duration::from_millis(1));
                continue;
            }
            // The ACK of the trigger; its answer follows.
            let (h, n) = loop {
                let (h, n) = peer.recv(Duration::from_secs(2)).expect("no answer");
                if raw_peer::is_request(&h) {
                    break (h, n);
                }
            };
            writes += 1;
            write_bytes += n.payload as u64;
            psns.insert(h.psn);
            break;
        }
    }
    let first = *psns.iter().next().unwrap();
    // What the trigger phase sent (answers, resends of answers to triggers sent again after
    // RNR NAKs): not the NAKs' doing.
    let before_naks = writes;
    let mut take = |wait: Duration| {
        let mut n = 0u64;
        while let Some((h, size)) = peer.recv(wait) {
            if raw_peer::is_request(&h) {
                n += 1;
                write_bytes += size.payload as u64;
            }
        }
        n
    };
    // Seven NAKs at a time, back to back, then what they brought: the phase takes a few
    // milliseconds, and each go-back re-arms the manager's ACK timer, so its own resends
    // (milliseconds apart, at most `retry_cnt` an answer) fall after it.
    let mut for_naks = 0;
    for k in 0..4u32 {
        for _ in 0..7 {
            peer.nak_sequence(&s, first + k);
        }
        for_naks += take(Duration::from_millis(3));
    }
    let by_timer = take(Duration::from_millis(100));
    writes += for_naks + by_timer;
    eprintln!(
        "sequence NAKs with progress: 4 answers ran (PSNs {psns:?}); the manager sent {writes} \
         WRITEs ({write_bytes} payload bytes): {before_naks} for the triggers, {for_naks} for \
         28 twenty-byte NAKs, {by_timer} by its ACK timer in the 100 ms after"
    );
    // One go-back for each NAK that acknowledged an answer, of the answers left: 4 + 3 +
    // 2 + 1 (before the fix: one for every NAK, 7 x that), and room for one go-back of the
    // ACK timer's should the machine stall the phase past the timeout.
    assert!(
        for_naks <= (4 + 3 + 2 + 1) + 4,
        "{for_naks} WRITEs on the wire for 28 NAKs: a repeated sequence NAK resent the window"
    );
}

#[test]
fn short_bursts_between_calm_seconds_cannot_beat_the_trigger_budget() {
    // 100 triggers a second, banned over it. The attacker floods one session for 25 ms at a
    // time and rests 1.1 s in between (the throttle of one burst is lifted by the next).
    let m = Manager::start_with_dataplane(&trigger_budget_ban_policy());
    let a = server_loop_app(&m);
    let mut c = remote_client(&a, Duration::from_secs(2)).unwrap();
    let start = Instant::now();
    let mut served = 0;
    let mut bursts = Vec::new();
    let mut stopped = None;
    while start.elapsed() < Duration::from_secs(6) {
        let (n, err) = get_until(&mut c, Instant::now() + Duration::from_millis(25));
        served += n;
        bursts.push(n);
        if let Some(e) = err {
            stopped = Some(e);
            break;
        }
        std::thread::sleep(Duration::from_millis(1100));
    }
    let secs = start.elapsed().as_secs_f64();
    let rate = served as f64 / secs;
    let records = drain_records(&m, Duration::from_millis(300));
    let (throttles, unthrottles, bans) = (
        count(&records, "event=throttle "),
        count(&records, "event=unthrottle "),
        count(&records, "event=ban "),
    );
    eprintln!(
        "25 ms bursts: {served} triggers in {secs:.1}s = {rate:.0}/s (budget 100/s), bursts \
         {bursts:?}; stopped by {stopped:?}; records: {throttles} throttle, {unthrottles} \
         unthrottle, {bans} ban"
    );
    // Held if the bursts together stay within 5x the budget (one window's burst a second
    // is what the design's throttle-then-forgive allows; it measured 1.7-2.8x).
    assert!(
        bans > 0 || rate <= 500.0,
        "{rate:.0} triggers/s against a budget of 100/s under \"ban\" in short bursts: \
         throttled {throttles} times, let off {unthrottles} times, never banned"
    );
}
