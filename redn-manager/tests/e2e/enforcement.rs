//! The auditor on remote clients: a runaway instance terminated, a client over its WQE or
//! trigger rate throttled, a banned address refused, each alone while neighbours are served.

use super::remote_clients::{remote, remote_within};
use super::*;

/// The first audit record on the manager's syslog socket holding every one of `needles`.
fn audit_record_with(m: &Manager, needles: &[&str]) -> String {
    let syslog = m.syslog.as_ref().unwrap();
    let mut buf = [0u8; 2048];
    let start = Instant::now();
    loop {
        assert!(start.elapsed() < DEADLINE, "no record with {needles:?}");
        let n = recv(syslog, &mut buf).expect("audit records within the deadline");
        let rec = String::from_utf8_lossy(&buf[..n]).into_owned();
        if needles.iter().all(|n| rec.contains(n)) {
            return rec;
        }
    }
}

/// An app's server-loop serving key 0x2a ("hello"), and a remote client served once.
struct ServerLoop {
    app: Client,
    /// Holds the app's table mapped while the offload reads it.
    _table: TwoChoiceTable,
    handle: u64,
    token: String,
    endpoint: String,
    calm: RemoteClient,
}

fn server_loop_with_a_calm_client(m: &Manager) -> ServerLoop {
    let mut app = m.client();
    let mut table = TwoChoiceTable::create(64).unwrap();
    let (_, installed) = app.install_table("server-loop", &mut table).unwrap();
    table.set(0x2a, b"hello").unwrap();
    let endpoint = installed.endpoint.clone().expect("an endpoint");
    let (handle, token) = (installed.handle, installed.token.clone());
    let mut calm = remote(&endpoint, handle, &token).unwrap();
    assert_eq!(calm.get(0x2a).unwrap().as_deref(), Some(&b"hello"[..]));
    ServerLoop {
        app,
        _table: table,
        handle,
        token,
        endpoint,
        calm,
    }
}

/// server-loop overdrawing a budget of 50 WQEs a trigger (it spends 56), remote clients
/// banned for an hour over it.
fn overdraw_ban_policy() -> String {
    policy("", "")
        .replace("\"echo\"]", "\"echo\", \"server-loop\"]")
        .replace("wqes_per_invocation = 64", "wqes_per_invocation = 50")
        .replace(
            "on_violation = \"terminate\"",
            "on_violation = \"ban\"\nban_duration = \"1h\"",
        )
}

/// A remote client at 127.0.0.1 GETting until the auditor stops it; the client.
fn run_away(endpoint: &str, handle: u64, token: &str) -> RemoteClient {
    let mut runaway = remote_within(endpoint, handle, token, Duration::from_secs(1)).unwrap();
    let mut served = 0u32;
    while runaway.get(0x2a).is_ok() {
        served += 1;
        assert!(served < 10_000, "the runaway instance was never stopped");
    }
    runaway
}

#[test]
fn a_remote_clients_runaway_instance_alone_is_terminated() {
    // server-loop spends 56 WQEs a round against a budget of 50 a trigger: each trigger
    // overdraws by 6, so a client that keeps triggering breaks the one-round slack within
    // about nine, while one that triggers a few times stays inside it.
    let m = Manager::start_with_dataplane(
        &policy("", "")
            .replace("\"echo\"]", "\"echo\", \"server-loop\"]")
            .replace("wqes_per_invocation = 64", "wqes_per_invocation = 50"),
    );
    let mut s = server_loop_with_a_calm_client(&m);
    let (handle, token, endpoint) = (s.handle, s.token.clone(), s.endpoint.clone());
    // What the runaway waits for once terminated never comes: it need not wait long.
    let mut runaway = remote_within(&endpoint, handle, &token, Duration::from_secs(1)).unwrap();
    let mut served = 0u32;
    let stopped = loop {
        match runaway.get(0x2a) {
            Ok(v) => {
                assert_eq!(v.as_deref(), Some(&b"hello"[..]));
                served += 1;
                assert!(served < 10_000, "the runaway instance was never stopped");
            }
            Err(e) => break e,
        }
    };
    assert!(
        matches!(
            stopped,
            ClientError::Timeout { .. } | ClientError::ResponseFailed { .. }
        ),
        "{stopped:?}"
    );
    assert!(
        served >= 4,
        "stopped after {served} gets, inside its budget"
    );
    let record = audit_record_with(
        &m,
        &[
            "event=terminate ",
            &format!(" handle={handle} "),
            " instance=",
            " peer=127.0.0.1:",
            " rule=loop-budget ",
        ],
    );
    assert!(record.contains("offload=server-loop"), "{record}");
    assert!(record.ends_with("res=success"), "{record}");
    assert!(!record.contains(&token), "the token leaked: {record}");
    audit_record_with(
        &m,
        &[
            "event=remote-exit ",
            "reason=\"instance terminated by the auditor\"",
        ],
    );
    // Nobody else was touched: the offload stays installed and the calm client is served.
    let list: api::InstalledList =
        m.admin_call("io.redn.Admin.ListOffloads", serde_json::json!({}));
    assert_eq!(
        list.offloads.iter().map(|o| o.handle).collect::<Vec<_>>(),
        [handle]
    );
    for _ in 0..2 {
        assert_eq!(s.calm.get(0x2a).unwrap().as_deref(), Some(&b"hello"[..]));
    }
    assert_eq!(
        s.calm.sessions_opened(),
        1,
        "the calm client kept its instance"
    );
    let stats = stats(&mut s.app);
    assert_eq!(
        stats.terminated, None,
        "the app's own install was not touched"
    );
}

/// A remote client on a thread of its own getting key 0x2a as fast as it can until `stop`
/// is set; it returns the GETs served and the sessions it opened.
#[allow(clippy::type_complexity)] // a flag and a thread handle, used once each
fn flood(
    endpoint: &str,
    handle: u64,
    token: &str,
) -> (
    std::sync::Arc<std::sync::atomic::AtomicBool>,
    std::thread::JoinHandle<(u64, u64)>,
) {
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let (endpoint, token, flag) = (endpoint.to_owned(), token.to_owned(), stop.clone());
    let flooder = std::thread::spawn(move || {
        let mut c = remote(&endpoint, handle, &token).unwrap();
        let mut served = 0u64;
        while !flag.load(std::sync::atomic::Ordering::Relaxed) {
            assert_eq!(c.get(0x2a).unwrap().as_deref(), Some(&b"hello"[..]));
            served += 1;
        }
        (served, c.sessions_opened())
    });
    (stop, flooder)
}

/// A manager whose app serves server-loop, its remote clients under `on_violation =
/// "throttle"` and the policy `policy` makes of the default one; a calm client, and a
/// flooder getting until the auditor throttles it for `rule`. Returns the manager, the app
/// with its calm client, the throttle record and the flooder's GETs and sessions.
fn flood_until_throttled(
    policy_of: impl Fn(String) -> String,
    rule: &str,
) -> (Manager, ServerLoop, String, (u64, u64)) {
    let m = Manager::start_with_dataplane(&policy_of(
        policy("", "")
            .replace("\"echo\"]", "\"echo\", \"server-loop\"]")
            .replace(
                "on_violation = \"terminate\"",
                "on_violation = \"throttle\"",
            ),
    ));
    let s = server_loop_with_a_calm_client(&m);
    let (stop, flooder) = flood(&s.endpoint, s.handle, &s.token);
    let record = audit_record_with(
        &m,
        &[
            "event=throttle ",
            &format!(" handle={} ", s.handle),
            // A remote client is its address: all its sessions are paced together.
            " address=127.0.0.1 ",
            &format!(" rule={rule} "),
        ],
    );
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let flooded = flooder.join().unwrap();
    (m, s, record, flooded)
}

#[test]
fn a_remote_client_over_its_wqe_rate_alone_is_throttled() {
    // 64 WQEs a trigger covers server-loop's 56; 2,000 WQEs a second is some 35 gets, far
    // below what a client getting as fast as it can asks for.
    let (m, mut s, record, (served, sessions)) = flood_until_throttled(
        |p| p.replace("wqes_per_second = \"infinity\"", "wqes_per_second = 2000"),
        "wqes-per-second",
    );
    let token = s.token.clone();
    assert!(record.contains("paced_wqes_per_s=2000"), "{record}");
    assert!(!record.contains(&token), "the token leaked: {record}");
    // Paced, not cut off: the flooder kept its one instance throughout.
    assert!(served > 0);
    assert_eq!(sessions, 1);
    // The calm client and the offload are left as they were.
    assert_eq!(s.calm.get(0x2a).unwrap().as_deref(), Some(&b"hello"[..]));
    assert_eq!(s.calm.sessions_opened(), 1);
    let list: api::InstalledList =
        m.admin_call("io.redn.Admin.ListOffloads", serde_json::json!({}));
    assert_eq!(list.offloads.len(), 1);
}

#[test]
fn a_banned_remote_client_alone_is_refused_for_its_ban() {
    // As in the runaway test, server-loop overdraws its budget by 6 WQEs a trigger; the
    // policy bans for an hour.
    let m = Manager::start_with_dataplane(&overdraw_ban_policy());
    // The calm client, at 127.0.0.1 as the runaway will be, already holds its instance
    // (ended with the ban: a ban is of the address).
    let mut s = server_loop_with_a_calm_client(&m);
    let (handle, token, endpoint) = (s.handle, s.token.clone(), s.endpoint.clone());
    // A neighbour at another address holds an instance throughout.
    let (neighbour, answer) = hello_at("127.0.0.2", &endpoint, handle, &token);
    assert!(
        matches!(answer, dataplane::Answer::Accepted(_)),
        "{answer:?}"
    );
    // The runaway, at 127.0.0.1, gets until the auditor cuts it off.
    let mut runaway = run_away(&endpoint, handle, &token);
    let ban = audit_record_with(
        &m,
        &[
            "event=ban ",
            &format!(" handle={handle} "),
            " address=127.0.0.1 ",
            " duration=3600s ",
        ],
    );
    assert!(
        ban.contains(" rule=loop-budget ") && ban.contains(" instance="),
        "{ban}"
    );
    assert!(!ban.contains(&token), "the token leaked: {ban}");
    // Its reconnects are refused for the ban, by name...
    match runaway.get(0x2a) {
        Err(ClientError::RemoteRefused {
            refusal: Refusal::Banned,
            reason,
        }) => assert!(
            reason.contains("127.0.0.1") && reason.contains("banned"),
            "{reason}"
        ),
        other => panic!("expected Banned, got {other:?}"),
    }
    let (_, again) = hello_at("127.0.0.1", &endpoint, handle, &token);
    assert!(
        matches!(again, dataplane::Answer::Refused(Refusal::Banned, _)),
        "{again:?}"
    );
    audit_record_with(
        &m,
        &["event=remote-connect ", " error=Banned ", "res=failed"],
    );
    // ...and nobody else is touched: another address says hello, the neighbour keeps its
    // instance, the offload stays, the app reconnects.
    let (_newcomer, fresh) = hello_at("127.0.0.3", &endpoint, handle, &token);
    assert!(matches!(fresh, dataplane::Answer::Accepted(_)), "{fresh:?}");
    neighbour.set_nonblocking(true).unwrap();
    let mut byte = [0u8; 1];
    let open = (&neighbour).read(&mut byte);
    assert!(
        matches!(&open, Err(e) if e.kind() == std::io::ErrorKind::WouldBlock),
        "the neighbour's connection was closed: {open:?}"
    );
    let list: api::InstalledList =
        m.admin_call("io.redn.Admin.ListOffloads", serde_json::json!({}));
    let entry = list.offloads.iter().find(|o| o.handle == handle).unwrap();
    assert_eq!(
        (
            entry.remote_clients,
            entry.remote_terminated,
            entry.remote_banned
        ),
        (2, 2, 1)
    );
    // The instance the calm client held before the ban ended with it: the address is
    // banned, so its session does not serve on.
    let calm = s.calm.get(0x2a);
    assert!(
        matches!(
            calm,
            Err(ClientError::RemoteRefused {
                refusal: Refusal::Banned,
                ..
            })
        ),
        "the calm client at the banned address: {calm:?}"
    );
    let mut reconnected = m.client();
    let fresh = stats(&mut reconnected);
    assert_eq!(
        fresh.terminated, None,
        "the app's own install was not touched"
    );
    let stats = stats(&mut s.app);
    let notes = stats.remote_terminated.expect("the app is told");
    assert_eq!(notes.len(), 2, "{notes:?}");
    let n = notes
        .iter()
        .find(|n| n.banned)
        .expect("the banned instance");
    assert_eq!(
        (n.handle, n.offload.as_str(), n.rule.as_str(), n.banned),
        (handle, "server-loop", "loop-budget", true)
    );
    assert!(n.peer.starts_with("127.0.0.1:"), "{n:?}");
    // An admin sees the same through `redn`, as JSON and as a table.
    let admin = m.admin().display().to_string();
    let redn = |args: &[&str]| {
        let mut c = Command::new(env!("CARGO_BIN_EXE_redn"));
        stdout_of(c.args(["-s", &admin]).args(args))
    };
    let stat: serde_json::Value = serde_json::from_str(&redn(&["-j", "stat", "show"])).unwrap();
    assert_eq!(stat[0]["handle"], handle);
    assert_eq!(
        (
            &stat[0]["remote_clients"],
            &stat[0]["remote_terminated"],
            &stat[0]["remote_banned"]
        ),
        (&2.into(), &2.into(), &1.into())
    );
    let dev: serde_json::Value = serde_json::from_str(&redn(&["-j", "dev", "show"])).unwrap();
    let dev = dev.as_array().expect("an array of devices");
    assert_eq!(dev.len(), 1);
    assert_eq!(dev[0]["backend"], "softnic");
    assert_eq!(dev[0]["dataplane"], endpoint.as_str());
    assert!(dev[0]["node_guid"].is_null() && dev[0]["pci_address"].is_null());
    assert!(dev[0]["qp"].as_u64().unwrap() > 0, "{dev:?}");
    let table = redn(&["dev"]);
    let mut lines = table.lines();
    assert!(
        lines.next().unwrap().starts_with("IFINDEX  IFNAME"),
        "{table}"
    );
    let row = lines.next().unwrap();
    assert!(
        row.starts_with("0 ") && row.contains(" softnic ") && row.contains(" - "),
        "{table}"
    );
    // The data plane's address, then what it dropped (a number).
    let cells: Vec<&str> = row.split_whitespace().collect();
    assert_eq!(cells[cells.len() - 2], endpoint, "{table}");
    assert!(cells[cells.len() - 1].parse::<u64>().is_ok(), "{table}");
}

/// An administrator, through `redn`, sees every remote client's session and every ban in
/// force, lifts a ban and ends a session: each with its audit record, the manager acting
/// on it at once, and a clear error for what is not there.
#[test]
fn an_admin_sees_sessions_and_bans_lifts_a_ban_and_ends_a_session_with_redn() {
    // As in the ban test: server-loop overdraws a budget of 50 WQEs a trigger; an hour's ban.
    let m = Manager::start_with_dataplane(&overdraw_ban_policy());
    let s = server_loop_with_a_calm_client(&m);
    let (handle, token, endpoint) = (s.handle, s.token.clone(), s.endpoint.clone());
    let (neighbour, answer) = hello_at("127.0.0.2", &endpoint, handle, &token);
    assert!(
        matches!(answer, dataplane::Answer::Accepted(_)),
        "{answer:?}"
    );
    let admin = m.admin().display().to_string();
    let redn = |args: &[&str]| {
        Command::new(env!("CARGO_BIN_EXE_redn"))
            .args(["-s", &admin])
            .args(args)
            .output()
            .unwrap()
    };
    let rows = |args: &[&str]| -> Vec<serde_json::Value> {
        let o = redn(args);
        assert!(o.status.success(), "redn {args:?}: {o:?}");
        serde_json::from_slice::<serde_json::Value>(&o.stdout)
            .unwrap()
            .as_array()
            .expect("an array")
            .clone()
    };
    // Both sessions: the calm client's (127.0.0.1, one GET) and the neighbour's.
    let remotes = rows(&["-j", "remote", "show"]);
    assert_eq!(remotes.len(), 2, "{remotes:?}");
    let at = |addr: &str| {
        remotes
            .iter()
            .find(|r| r["peer"].as_str().unwrap().starts_with(addr))
            .unwrap_or_else(|| panic!("no session at {addr}: {remotes:?}"))
            .clone()
    };
    let (calm, theirs) = (at("127.0.0.1:"), at("127.0.0.2:"));
    for r in [&calm, &theirs] {
        assert_eq!(
            (&r["handle"], &r["app"]),
            (&handle.into(), &"tester".into()),
            "{r}"
        );
        assert_eq!(r["offload"], "server-loop", "{r}");
        assert!(r["held_ns"].as_u64().unwrap() > 0, "{r}");
    }
    assert_eq!(
        (&calm["triggers"], &theirs["triggers"]),
        (&1.into(), &0.into())
    );
    let table = String::from_utf8(redn(&["remote"]).stdout).unwrap();
    let header: Vec<&str> = table.lines().next().unwrap().split_whitespace().collect();
    assert_eq!(
        header,
        ["HANDLE", "INSTANCE", "APP", "OFFLOAD", "PEER", "HELD", "IDLE", "TRIGGERS"],
        "{table}"
    );
    assert!(
        table.contains(" server-loop ") && table.contains("s "),
        "{table}"
    );
    // A runaway at 127.0.0.1 is banned; the ban is listed with what is left of its hour.
    run_away(&endpoint, handle, &token);
    audit_record_with(&m, &["event=ban ", " address=127.0.0.1 "]);
    let bans = rows(&["-j", "ban", "show"]);
    assert_eq!(bans.len(), 1, "{bans:?}");
    assert_eq!(
        (&bans[0]["app"], &bans[0]["address"], &bans[0]["uid"]),
        (
            &"tester".into(),
            &"127.0.0.1".into(),
            &serde_json::Value::Null
        )
    );
    let left = bans[0]["left_ns"].as_u64().unwrap();
    assert!(
        (3_500_000_000_000..=3_600_000_000_000).contains(&left),
        "{left}"
    );
    // Lifted: the address is served again at once.
    let o = redn(&["ban", "lift", "tester", "127.0.0.1"]);
    assert!(o.status.success(), "{o:?}");
    assert_eq!(String::from_utf8_lossy(&o.stdout).trim(), "1 ban(s) lifted");
    audit_record_with(
        &m,
        &[
            "event=unban ",
            " app=tester ",
            " address=127.0.0.1 ",
            " lifted=1 ",
        ],
    );
    assert!(rows(&["-j", "ban", "show"]).is_empty());
    let (_back, again) = hello_at("127.0.0.1", &endpoint, handle, &token);
    assert!(matches!(again, dataplane::Answer::Accepted(_)), "{again:?}");
    let o = redn(&["ban", "lift", "tester", "127.0.0.1"]);
    assert_eq!(o.status.code(), Some(1), "{o:?}");
    assert!(
        String::from_utf8_lossy(&o.stderr).contains("NoSuchBan"),
        "{o:?}"
    );
    let o = redn(&["ban", "lift", "tester", "nowhere"]);
    assert_eq!(o.status.code(), Some(2), "a usage error: {o:?}");
    // The method itself, past redn's own checks: exactly one of uid and address, and an
    // address that is one.
    let mut admin_socket = m.raw(&m.admin());
    for bad in [
        serde_json::json!({ "app": "tester" }),
        serde_json::json!({ "app": "tester", "uid": 0, "address": "127.0.0.1" }),
        serde_json::json!({ "app": "tester", "address": "nowhere" }),
    ] {
        let r: Result<api::Lifted, _> = admin_socket.call("io.redn.Admin.LiftBan", &bad, &[]);
        let e = format!("{:?}", r.expect_err("refused"));
        assert!(
            e.contains("InvalidParameter") && e.contains("address"),
            "{bad}: {e}"
        );
    }
    // BanRemote for no time at all is refused; for longer than the clock can count, it is
    // for ever (the manager serves on: no overflow).
    let zero = serde_json::json!({ "app": "tester", "address": "127.0.0.9", "seconds": 0 });
    let r: Result<api::BannedRemote, _> = admin_socket.call("io.redn.Admin.BanRemote", &zero, &[]);
    let e = format!("{:?}", r.expect_err("refused"));
    assert!(
        e.contains("InvalidParameter") && e.contains("seconds"),
        "{e}"
    );
    let huge = serde_json::json!({ "app": "tester", "address": "127.0.0.9", "seconds": u64::MAX });
    let r: api::BannedRemote = admin_socket
        .call("io.redn.Admin.BanRemote", &huge, &[])
        .unwrap();
    assert_eq!(r.ended, 0);
    let bans = rows(&["-j", "ban", "show"]);
    assert!(
        bans.iter()
            .any(|b| b["address"] == "127.0.0.9" && b["left_ns"].is_null()),
        "{bans:?}"
    );
    assert!(redn(&["ban", "lift", "tester", "127.0.0.9"])
        .status
        .success());
    // The neighbour's session ended: its connection closed, a record, no longer listed.
    let instance = theirs["instance"].as_u64().unwrap().to_string();
    let o = redn(&["remote", "kill", &handle.to_string(), &instance]);
    assert!(o.status.success(), "{o:?}");
    audit_record_with(
        &m,
        &[
            "event=remote-exit ",
            &format!(" instance={instance} "),
            "disconnected by an administrator",
        ],
    );
    neighbour.set_read_timeout(Some(DEADLINE)).unwrap();
    let mut byte = [0u8; 1];
    assert_eq!(
        (&neighbour).read(&mut byte).unwrap(),
        0,
        "its connection closed"
    );
    let left: Vec<_> = rows(&["-j", "remote", "show"])
        .into_iter()
        .filter(|r| r["peer"].as_str().unwrap().starts_with("127.0.0.2:"))
        .collect();
    assert!(left.is_empty(), "{left:?}");
    let o = redn(&["remote", "kill", &handle.to_string(), &instance]);
    assert_eq!(o.status.code(), Some(1), "{o:?}");
    assert!(
        String::from_utf8_lossy(&o.stderr).contains("NoSuchRemote"),
        "{o:?}"
    );
    // An admin's own ban: the session 127.0.0.1 opened after the lift ends, its hellos are
    // refused, and the ban is listed until lifted.
    let o = redn(&["-j", "ban", "add", "tester", "127.0.0.1", "30m"]);
    assert!(o.status.success(), "{o:?}");
    let reply: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(reply[0]["ended"], 1, "{reply}");
    audit_record_with(
        &m,
        &[
            "event=ban ",
            " app=tester ",
            " address=127.0.0.1 ",
            " by=admin ",
        ],
    );
    audit_record_with(&m, &["event=remote-exit ", "banned by an administrator"]);
    let (_t, refused) = hello_at("127.0.0.1", &endpoint, handle, &token);
    assert!(
        matches!(refused, dataplane::Answer::Refused(Refusal::Banned, _)),
        "{refused:?}"
    );
    let bans = rows(&["-j", "ban", "show"]);
    assert_eq!(bans.len(), 1, "{bans:?}");
    let left = bans[0]["left_ns"].as_u64().unwrap();
    assert!(
        (1_700_000_000_000..=1_800_000_000_000).contains(&left),
        "{left}"
    );
    for (bad, says) in [
        (
            &["ban", "add", "nobody", "127.0.0.1", "1h"][..],
            "NoSuchApp",
        ),
        (&["ban", "add", "tester", "127.0.0.1", "soon"], "DURATION"),
        (
            &["ban", "add", "tester", "127.0.0.1", "10ms"],
            "at least 1s",
        ),
    ] {
        let o = redn(bad);
        let err = String::from_utf8_lossy(&o.stderr);
        assert!(!o.status.success() && err.contains(says), "{bad:?}: {o:?}");
    }
    assert!(redn(&["ban", "lift", "tester", "127.0.0.1"])
        .status
        .success());
}

#[test]
fn a_remote_client_over_its_trigger_rate_is_throttled() {
    // Each GET is one trigger of server-loop's 56 WQEs, inside every WQE budget; 100
    // triggers a second is far below what a client getting as fast as it can sends.
    let (_m, mut s, record, (_, sessions)) = flood_until_throttled(
        |p| {
            p.replace(
                "wqes_per_invocation",
                "triggers_per_second = 100\nwqes_per_invocation",
            )
        },
        "triggers-per-second",
    );
    assert_eq!(sessions, 1, "paced, not cut off");
    assert!(record.contains(" limit_per_s=100 "), "{record}");
    // The WQEs of 100 triggers a second at what each ran in the window: 56, or a little
    // more or less with a round in flight when the window opened or closed (a loaded
    // machine measured 54: a counted trigger whose round had not finished).
    let paced: u64 = record
        .split(" paced_wqes_per_s=")
        .nth(1)
        .and_then(|v| v.split(' ').next())
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("{record}"));
    assert!((5000..=6000).contains(&paced), "{record}");
    assert_eq!(s.calm.get(0x2a).unwrap().as_deref(), Some(&b"hello"[..]));
    assert_eq!(s.calm.sessions_opened(), 1);
}
