//! Enforcement: what the auditor's findings do to offloads, clients and queues.

use super::*;
use crate::auditor::Auditor;
use redn_policy::PeerIdentity;
use redn_sys::clock::SystemClock;
use redn_sys::nic::RateLimit;
use std::os::fd::AsFd;
use std::sync::Arc;
use std::time::{Duration, Instant};

fn manager(client_keys: &str) -> (Manager, u64) {
    let nic = Arc::new(redn_sys::softnic::SoftNic::with_pus(1).unwrap());
    manager_on(client_keys, nic)
}

/// A policy of one app rule, for this process's uid, with `[app.client]` keys
/// `client_keys`.
fn policy_text(client_keys: &str) -> String {
    let uid = nix::unistd::getuid().as_raw();
    format!(
        "[[app]]\nname = \"t\"\nuid = {uid}\noffloads = [\"server-loop\", \"echo\"]\n\
         max_regions = 4\nmax_pinned = \"16M\"\nmax_queues = 32\n\
         max_remote_clients = 4\n[app.client]\nrate_limit_kbps = \"infinity\"\n\
         wqes_per_second = \"infinity\"\nwqes_per_invocation = 16\n{client_keys}\n"
    )
}

/// A manager on `nic` whose one app rule has `[app.client]` keys `client_keys`, and a
/// client it matches.
fn manager_on(client_keys: &str, nic: Arc<DynNic>) -> (Manager, u64) {
    let uid = nix::unistd::getuid().as_raw();
    let policy = redn_policy::parse_policy(&policy_text(client_keys), "policy.toml").unwrap();
    let mut m = Manager::with_catalog(policy, nic, "softnic").unwrap();
    let client = m.connect(PeerIdentity {
        uid,
        gid: 0,
        pid: std::process::id(),
        exe: "/t".into(),
        cgroup: "/".into(),
        start_time: 0,
    });
    (m, client)
}

fn install_server_loop(
    m: &mut Manager,
    client: u64,
) -> Result<(u64, Vec<u8>), redn_proto::errors::ManagerError> {
    let region = redn_client::SealedRegion::create("t", 1 << 16).unwrap();
    let fd = region.fd().as_fd().try_clone_to_owned().unwrap();
    let r = m.register_region(client, fd)?;
    let (request, trigger) = server_loop_over(&r);
    Ok((m.install(client, request)?.handle, trigger))
}

#[test]
fn a_banned_runaway_is_freed_entirely_told_and_refused_again() {
    let (mut m, client) = manager("on_violation = \"ban\"\nban_duration = \"1h\"");
    let before = m.nic().objects();
    let (handle, trigger) = install_server_loop(&mut m, client).unwrap();
    assert_ne!(m.nic().objects(), before);
    let mut auditor = Auditor::new(Duration::ZERO);
    m.audit_round(&mut auditor, SystemClock);
    assert_eq!(m.test_run(handle, &trigger, 32).unwrap().sent, 32);
    let deadline = Instant::now() + Duration::from_secs(30);
    while m.installed_count() > 0 {
        assert!(Instant::now() < deadline, "the runaway was never stopped");
        m.audit_round(&mut auditor, SystemClock);
        std::thread::yield_now();
    }
    // Every queue, key, CQ and domain of the install and its parking side is gone.
    assert_eq!(m.nic().objects(), before);
    let bodies: Vec<String> = m.take_records().iter().map(|r| r.body()).collect();
    assert!(bodies.iter().any(|b| b.starts_with("event=terminate ")
        && b.contains(&format!("handle={handle} rule=loop-budget"))));
    assert!(bodies
        .iter()
        .any(|b| b.starts_with("event=ban ") && b.contains("duration=3600s")));
    let notes = m.stats(client).unwrap().terminated.unwrap();
    assert_eq!((notes[0].handle, notes[0].banned), (handle, true));
    let e = install_server_loop(&mut m, client).unwrap_err();
    assert!(
        matches!(&e, redn_proto::errors::ManagerError::PolicyDenied { reason } if reason.contains("banned")),
        "{e:?}"
    );
}

#[test]
fn a_burst_that_ends_before_the_first_audit_round_is_still_charged() {
    let (mut m, client) = manager("on_violation = \"terminate\"");
    let (handle, trigger) = install_server_loop(&mut m, client).unwrap();
    // No round yet: a busy manager may sample an offload first only after its triggers
    // were all served (the flake of audit_trail's runaway test).
    assert_eq!(m.test_run(handle, &trigger, 8).unwrap().sent, 8);
    let served = |m: &Manager| {
        let s = m.stats(client).unwrap();
        s.offloads
            .iter()
            .any(|o| o.handle == handle && o.triggers == 8 && o.wqes > 9 * 16)
    };
    let deadline = Instant::now() + Duration::from_secs(30);
    while !served(&m) {
        assert!(Instant::now() < deadline, "the triggers were never served");
        std::thread::yield_now();
    }
    let mut auditor = Auditor::new(Duration::ZERO);
    m.audit_round(&mut auditor, SystemClock);
    assert_eq!(m.installed_count(), 0, "terminated at its first sample");
    let bodies: Vec<String> = m.take_records().iter().map(|r| r.body()).collect();
    assert!(
        bodies.iter().any(|b| b.starts_with("event=terminate ")
            && b.contains(&format!("handle={handle} rule=loop-budget"))),
        "{bodies:?}"
    );
}

/// Install echo for `client`, then make its client-facing queue refuse a trigger as
/// responder (longer than the receive it lands in: to error, with an asynchronous
/// event); run audit rounds until the `queue-error` record, and return it.
fn responder_error_record(m: &mut Manager, client: u64) -> (u64, String) {
    let echo = m
        .install(
            client,
            api::InstallOffload {
                offload: "echo".into(),
                regions: vec![],
                parameters: None,
            },
        )
        .unwrap()
        .handle;
    let mut auditor = Auditor::new(Duration::ZERO);
    m.audit_round(&mut auditor, SystemClock);
    let parked = m.installed[&echo]._parking._qp.qpn();
    let wr = WorkRequest {
        wr_id: 0,
        flags: WqeFlags::NONE,
        op: WrOp::Send {
            payload: Payload::Inline(vec![7; 128]),
            imm: None,
        },
    };
    m.nic().post_send(parked, &[wr]).unwrap();
    // The sender's queue goes to error on the NAK, which the responder returns after
    // raising its event: from then on the event is there to be taken.
    let deadline = Instant::now() + Duration::from_secs(30);
    while !matches!(m.nic().qp_state(parked), Ok(QpState::Error)) {
        assert!(Instant::now() < deadline, "the sender never saw the NAK");
        std::thread::yield_now();
    }
    let record = loop {
        assert!(Instant::now() < deadline, "no queue-error record");
        m.audit_round(&mut auditor, SystemClock);
        let found = m
            .take_records()
            .iter()
            .map(Record::body)
            .find(|b| b.starts_with("event=queue-error "));
        if let Some(b) = found {
            break b;
        }
        std::thread::yield_now();
    };
    // Reported once: later rounds are quiet.
    for _ in 0..3 {
        m.audit_round(&mut auditor, SystemClock);
    }
    assert!(m.take_records().is_empty());
    (echo, record)
}

#[test]
fn a_responder_error_is_learnt_from_its_asynchronous_event_once() {
    let (mut m, client) = manager("on_violation = \"terminate\"");
    let (echo, record) = responder_error_record(&mut m, client);
    assert!(
        record.contains(&format!(" handle={echo} queues=1 "))
            && record.ends_with(" seen_by=async-event res=failed"),
        "{record}"
    );
    assert_eq!(m.async_events(), 1);
}

#[test]
fn lost_events_make_the_auditor_read_queue_states_instead() {
    let lossy = Arc::new(redn_sys::fault::FailingNic::new(
        redn_sys::softnic::SoftNic::with_pus(1).unwrap(),
    ));
    lossy.lose_async_events(true);
    let (mut m, client) = manager_on("on_violation = \"terminate\"", lossy.clone());
    let (echo, record) = responder_error_record(&mut m, client);
    assert!(
        record.contains(&format!(" handle={echo} queues=1 "))
            && record.ends_with(" seen_by=state-poll res=failed"),
        "{record}"
    );
    assert_eq!((m.async_events(), m.nic().async_events_lost()), (0, 1));
}

#[test]
fn trigger_times_are_the_receive_stamps_of_each_trigger_once() {
    let (mut m, client) = manager("on_violation = \"throttle\"");
    let (handle, trigger) = install_server_loop(&mut m, client).unwrap();
    assert_eq!(
        m.trigger_times(handle + 1).unwrap_err(),
        AdminError::NoSuchOffload { handle: handle + 1 }
    );
    let before = redn_sys::softnic::completion_clock_ns();
    assert_eq!(m.test_run(handle, &trigger, 3).unwrap().sent, 3);
    let mut got = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(30);
    while got.len() < 3 {
        assert!(
            Instant::now() < deadline,
            "only {} arrivals seen",
            got.len()
        );
        let r = m.trigger_times(handle).unwrap();
        assert_eq!(r.dropped, 0);
        got.extend(r.received_ns);
        std::thread::yield_now();
    }
    let after = redn_sys::softnic::completion_clock_ns();
    assert_eq!(got.len(), 3, "each trigger once");
    assert!(got.windows(2).all(|w| w[0] <= w[1]));
    assert!(
        got[0] >= before && got[2] <= after,
        "{before} {got:?} {after}"
    );
    // Taken: the next call has nothing new.
    assert!(m.trigger_times(handle).unwrap().received_ns.is_empty());
}

#[test]
fn app_exit_keeps_or_tears_down_by_rule_and_unknown_handles_are_named() {
    let (mut m, client) = manager("on_violation = \"terminate\"");
    let (handle, _) = install_server_loop(&mut m, client).unwrap();
    assert_eq!(
        m.test_run(handle + 100, &[0; 14], 1).unwrap_err(),
        AdminError::NoSuchOffload {
            handle: handle + 100
        }
    );
    assert!(matches!(
        m.test_run(handle, &[0; 3], 1),
        Err(AdminError::TestRunFailed { reason }) if reason.contains("14-byte")
    ));
    // keep_serving_after_exit defaults to true.
    assert_eq!(m.app_exited(client), (1, 0));
    assert_eq!(m.installed_count(), 1);
    let body = m.take_records()[0].body();
    assert!(
        body.starts_with(&format!("event=app-exit client={client} uid="))
            && body.ends_with("policy=keep kept=1 torn_down=0 res=success"),
        "{body}"
    );
}

#[test]
fn a_throttled_installs_remote_clients_are_paced_by_the_rule_and_reloads() {
    // The app's own install throttled by the auditor; remote clients attached before and
    // during the throttle. Each remote client is a client of its own: paced as the rule
    // says (not at the app's throttle), and re-paced when a reload changes the rule.
    let nic = Arc::new(redn_sys::softnic::SoftNic::with_pus(1).unwrap());
    let (mut m, client) = manager_on("on_violation = \"throttle\"", nic.clone());
    let (handle, _) = install_server_loop(&mut m, client).unwrap();
    // Two more installs lend their queues as remote clients' instances of `handle`.
    let lend = |m: &mut Manager, id: u64, at: &str| -> Vec<redn_sys::Qpn> {
        let (spare, _) = install_server_loop(m, client).unwrap();
        let o = m.installed.remove(&spare).unwrap();
        let qps = o.installed.qps.iter().map(|q| q.qpn).collect();
        assert!(m.attach_remote(handle, id, at.parse().unwrap(), o.installed));
        qps
    };
    let before = lend(&mut m, 1, "127.0.0.2:4000");
    let throttle = RateLimit::default().with_wqes(100);
    let v = crate::auditor::Violation::WqeRate {
        per_second: 1_000,
        limit: 100,
    };
    m.throttle(crate::auditor::TrackId::own(handle), Some(&v), throttle);
    let own = m.installed[&handle].installed.qps[0].qpn;
    assert_eq!(nic.rate_limit(own).unwrap(), throttle);
    let during = lend(&mut m, 2, "127.0.0.3:4000");
    let limits = |qps: &[redn_sys::Qpn]| -> Vec<RateLimit> {
        qps.iter().map(|q| nic.rate_limit(*q).unwrap()).collect()
    };
    let unlimited = RateLimit::default();
    assert!(limits(&before).iter().all(|l| *l == unlimited));
    assert!(limits(&during).iter().all(|l| *l == unlimited));
    // What a client saying hello now is installed with (`Dataplane::serve`).
    let token = m.installed[&handle].token.clone();
    assert_eq!(
        m.remote_client_spec(handle, &token).unwrap().limit,
        unlimited,
        "a client that comes while the app is throttled would get the app's pace"
    );
    // A reload lowers rate_limit_kbps to 8 (1,000 bytes a second).
    let policy = policy_text("on_violation = \"throttle\"")
        .replace("rate_limit_kbps = \"infinity\"", "rate_limit_kbps = 8");
    m.policy = redn_policy::parse_policy(&policy, "policy.toml").unwrap();
    assert_eq!(m.enforce_reloaded_policy(), 0);
    let paced = RateLimit::bytes(1_000);
    for (what, qps) in [("before", &before), ("during", &during)] {
        assert!(
            limits(qps).iter().all(|l| *l == paced),
            "a client attached {what} the app's throttle after the reload: {:?}",
            limits(qps)
        );
    }
    // The app's own queues keep its throttle until the auditor lifts it.
    assert_eq!(nic.rate_limit(own).unwrap(), throttle);
}

#[test]
fn a_remote_client_banned_for_a_runaway_instance_keeps_no_throttle_or_pace() {
    // A remote client the auditor throttled for its rates, then banned (for 1 s) because
    // one of its instances ran past its loop budget. Its ban ends its sessions and drops
    // its pace; the auditor must not go on holding it throttled (before: it did, for up to
    // CLIENT_MEMORY, 60 s: back from its ban the client was unpaced yet judged as
    // throttled, so the auditor recorded `unthrottle` for a client it no longer paced, or
    // banned it as `still-flooding` with no pacer to press against and no throttle first).
    let clock = redn_sys::clock::ManualClock::new();
    let (mut m, client) = manager_on(
        "triggers_per_second = 100\non_violation = \"ban\"\nban_duration = \"1s\"",
        Arc::new(redn_sys::softnic::SoftNic::with_pus(1).unwrap()),
    );
    let (handle, _) = install_server_loop(&mut m, client).unwrap();
    // Another install lends its queues as the remote client's instance of `handle`; its
    // parking queue drives them.
    let (spare, trigger) = install_server_loop(&mut m, client).unwrap();
    let lent = m.installed.remove(&spare).unwrap();
    let parking = lent._parking;
    assert!(m.attach_remote(handle, 1, "127.0.0.2:4000".parse().unwrap(), lent.installed));
    let remote = ClientId {
        app: m.installed[&handle].app_key,
        addr: "127.0.0.2".parse().unwrap(),
    };
    // Throttled for its rates, as an audit round throttles it.
    let mut auditor = Auditor::new(Duration::ZERO);
    let budget = Budget::of(m.policy.app("t").unwrap());
    let flood = Sample {
        triggers: 1_000,
        ..Sample::default()
    };
    auditor.observe_client(remote, budget, Sample::default(), &clock);
    clock.advance(crate::auditor::RATE_WINDOW);
    let Some(Verdict::Throttle(v, _)) = auditor.observe_client(remote, budget, flood, &clock)
    else {
        panic!("not throttled");
    };
    // Paced loosely, so that its runaway is quick to show.
    let loose = RateLimit::default().with_wqes(1_000_000);
    m.pace_client(remote, handle, Some((&v, loose)));
    assert!(auditor.is_client_throttled(remote) && m.client_pacing.contains_key(&remote));
    // Its instance runs away: 32 triggers of server-loop are far past 16 WQEs each.
    let qpn = parking._qp.qpn();
    for _ in 0..32 {
        m.nic.post_recv(qpn, 0, &[]).unwrap();
        let wr = WorkRequest {
            wr_id: 0,
            flags: WqeFlags::NONE,
            op: WrOp::Send {
                payload: Payload::Inline(trigger.clone()),
                imm: None,
            },
        };
        m.nic.post_send(qpn, &[wr]).unwrap();
    }
    let deadline = Instant::now() + Duration::from_secs(30);
    while m.has_remote(handle, 1) {
        assert!(Instant::now() < deadline, "the runaway was never stopped");
        m.audit_round(&mut auditor, &clock);
        std::thread::yield_now();
    }
    let bodies: Vec<String> = m.take_records().iter().map(|r| r.body()).collect();
    assert!(
        bodies
            .iter()
            .any(|b| b.starts_with("event=ban ") && b.contains(" address=127.0.0.2 ")),
        "{bodies:?}"
    );
    assert!(m.remote_ban_refusal("t", remote.app, remote.addr).is_some());
    assert!(
        !m.client_pacing.contains_key(&remote),
        "its sessions ended, nothing to pace"
    );
    assert!(
        !auditor.knows_client(remote) && !auditor.is_client_throttled(remote),
        "after its ban the client starts afresh, not throttled without a pace"
    );
    m.audit_round(&mut auditor, &clock);
    assert!(
        !m.retired_clients.contains_key(&remote),
        "nothing of it is kept"
    );
    drop(parking);
}

#[test]
fn an_admin_ban_forgets_the_clients_throttle_under_every_number_of_the_app() {
    // As the auditor's own ban does: the address's throttle and pace as the app's client
    // go with an admin's ban (`BanRemote`), so that after the ban it starts afresh.
    let clock = redn_sys::clock::ManualClock::new();
    let (mut m, client) =
        manager("triggers_per_second = 100\non_violation = \"ban\"\nban_duration = \"1h\"");
    let (handle, _) = install_server_loop(&mut m, client).unwrap();
    let addr: std::net::IpAddr = "127.0.0.2".parse().unwrap();
    let remote = ClientId {
        app: m.installed[&handle].app_key,
        addr,
    };
    let other = ClientId {
        addr: "127.0.0.3".parse().unwrap(),
        ..remote
    };
    let mut auditor = Auditor::new(Duration::ZERO);
    let budget = Budget::of(m.policy.app("t").unwrap());
    let flood = Sample {
        triggers: 1_000,
        ..Sample::default()
    };
    for c in [remote, other] {
        auditor.observe_client(c, budget, Sample::default(), &clock);
    }
    clock.advance(crate::auditor::RATE_WINDOW);
    for c in [remote, other] {
        let Some(Verdict::Throttle(v, limit)) = auditor.observe_client(c, budget, flood, &clock)
        else {
            panic!("not throttled");
        };
        m.pace_client(c, handle, Some((&v, limit)));
    }
    let ban = m
        .admin_ban_remote(&mut auditor, "t", addr, Some(Duration::from_secs(1)))
        .unwrap();
    assert!(ban.sessions.is_empty());
    assert!(!auditor.knows_client(remote) && !m.client_pacing.contains_key(&remote));
    assert!(
        auditor.is_client_throttled(other) && m.client_pacing.contains_key(&other),
        "another address keeps its throttle"
    );
}
