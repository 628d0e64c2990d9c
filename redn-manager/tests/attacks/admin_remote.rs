//! The admin's remote-client and ban methods (`ListRemoteClients`, `DisconnectRemote`,
//! `ListBans`, `BanRemote`, `LiftBan`) called as a careless admin or script calls them: an
//! address written another way, parameters at and past their bounds, sessions that are
//! already gone, lists too long for one reply.

use super::*;
use redn_proto::dataplane::{Answer, Refusal};
use serde_json::{json, Value};
use std::io::Read;

/// `io.redn.Admin.METHOD` on a connection of its own: the reply, or the error as text.
fn admin(m: &Manager, method: &str, params: Value) -> Result<Value, String> {
    let mut c = m.raw(&m.admin());
    c.call::<_, Value>(&format!("io.redn.Admin.{method}"), &params, &[])
        .map_err(|e| format!("{e:?}"))
}

/// Whether the data plane closed `tcp` (read end of file, or reset).
fn closed(tcp: &mut std::net::TcpStream) -> bool {
    tcp.set_read_timeout(Some(DEADLINE)).unwrap();
    let mut byte = [0u8; 1];
    matches!(tcp.read(&mut byte), Ok(0) | Err(_))
}

/// The first audit record holding all of `needles` (others read and dropped).
fn record_with(m: &Manager, needles: &[&str]) -> String {
    let syslog = m.syslog.as_ref().unwrap();
    let mut buf = [0u8; 4096];
    loop {
        let n = recv(syslog, &mut buf).expect("audit records within the deadline");
        let rec = String::from_utf8_lossy(&buf[..n]).into_owned();
        if needles.iter().all(|n| rec.contains(n)) {
            return rec;
        }
    }
}

#[test]
fn an_ipv4_address_written_as_ipv4_mapped_ipv6_bans_and_lifts_that_client() {
    // The data plane knows its clients by IPv4 address; an admin pasting the address as a
    // dual-stack tool prints it (::ffff:a.b.c.d) must ban that client, not an address no
    // client ever has (before: ended=0, the ban listed as ::ffff:127.0.0.3, the client
    // served on and its hellos accepted).
    let m = Manager::start_with_dataplane(&server_loop_policy(|p| p));
    let a = server_loop_app(&m);
    let (mut tcp, first) = hello_from("127.0.0.3", &a);
    assert!(matches!(first, Answer::Accepted(_)), "{first:?}");
    let ban = json!({ "app": "tester", "address": "::ffff:127.0.0.3", "seconds": 3600 });
    let r = admin(&m, "BanRemote", ban).unwrap();
    assert_eq!(r["ended"], 1, "its session ended: {r}");
    assert!(closed(&mut tcp), "its connection closed");
    record_with(&m, &["event=ban ", " address=127.0.0.3 ", " by=admin "]);
    let (_t, again) = hello_from("127.0.0.3", &a);
    assert!(
        matches!(&again, Answer::Refused(Refusal::Banned, why) if !why.contains("auditor")),
        "refused, not said to be the auditor's ban: {again:?}"
    );
    let bans = admin(&m, "ListBans", json!({})).unwrap();
    assert_eq!(bans["bans"][0]["address"], "127.0.0.3", "{bans}");
    // Lifted the same way (hex this time).
    let lift = json!({ "app": "tester", "address": "::FFFF:7f00:3" });
    let r = admin(&m, "LiftBan", lift).unwrap();
    assert_eq!(r["lifted"], 1, "{r}");
    record_with(&m, &["event=unban ", " address=127.0.0.3 "]);
    let (_t, back) = hello_from("127.0.0.3", &a);
    assert!(matches!(back, Answer::Accepted(_)), "{back:?}");
}

#[test]
fn a_plain_ipv6_address_no_remote_client_can_have_is_refused_by_name() {
    // The data plane is IPv4 only (its listener, the softnic's RoCEv2 endpoints, the
    // address in a client's record): no remote client has a plain IPv6 address. A ban on
    // one must be refused with the reason, not kept as if it held (before: `ended=0`, a
    // `ban` record, listed by ListBans, matching nobody, while the admin believed the
    // address kept out).
    let m = Manager::start_with_dataplane(&server_loop_policy(|p| p));
    let a = server_loop_app(&m);
    let endpoint: std::net::SocketAddr = a.endpoint.parse().unwrap();
    assert!(endpoint.is_ipv4(), "{endpoint}");
    let v6 = std::net::SocketAddr::from((std::net::Ipv6Addr::LOCALHOST, endpoint.port()));
    assert!(
        std::net::TcpStream::connect_timeout(&v6, DEADLINE).is_err(),
        "nothing reaches the data plane over IPv6"
    );
    for address in [
        "::1",
        "::",
        "2001:db8::1",
        "fe80::1",
        "::127.0.0.3",
        "64:ff9b::7f00:3",
        "2001:DB8:0:0:0:0:0:1",
    ] {
        let canonical = address.parse::<std::net::IpAddr>().unwrap().to_string();
        let ban = json!({ "app": "tester", "address": address, "seconds": 60 });
        let e = admin(&m, "BanRemote", ban).expect_err("refused");
        assert!(
            e.contains("AddressNotServed") && e.contains(&canonical) && e.contains("IPv4 only"),
            "{address}: {e}"
        );
        let lift = json!({ "app": "tester", "address": address });
        let e = admin(&m, "LiftBan", lift).expect_err("refused");
        assert!(e.contains("AddressNotServed"), "{address}: {e}");
    }
    let bans = admin(&m, "ListBans", json!({})).unwrap();
    assert!(bans["bans"].as_array().unwrap().is_empty(), "{bans}");
    // Still refused as what it is: no address at all, or no app.
    let ban = json!({ "app": "tester", "address": "[::1]", "seconds": 60 });
    let e = admin(&m, "BanRemote", ban).expect_err("refused");
    assert!(
        e.contains("InvalidParameter") && e.contains("address"),
        "{e}"
    );
    let ban = json!({ "app": "nope", "address": "::1", "seconds": 60 });
    let e = admin(&m, "BanRemote", ban).expect_err("refused");
    assert!(
        e.contains("AddressNotServed"),
        "the address is checked first: {e}"
    );
    // An IPv4 address written as IPv6 is that IPv4 address, and banned as it.
    let ban = json!({ "app": "tester", "address": "::ffff:127.0.0.3", "seconds": 60 });
    admin(&m, "BanRemote", ban).unwrap();
    let bans = admin(&m, "ListBans", json!({})).unwrap();
    assert_eq!(bans["bans"][0]["address"], "127.0.0.3", "{bans}");
}

/// A manager with a data plane and `--limit pending-output-bytes=BYTES` (a reply queue an
/// operator sized down), policy from [`server_loop_policy`] with `edit`.
fn with_output_cap(bytes: usize, edit: impl Fn(String) -> String) -> Manager {
    let cap = format!("pending-output-bytes={bytes}");
    Manager::start_with_dataplane_and(&server_loop_policy(edit), &["--limit", &cap])
}

/// Long admin lists under a small reply queue: a manager [`with_output_cap`] of `cap`
/// bytes serving the server loop to `sessions` remote clients (from 127.0.1.1 on, their
/// connections held), whose app has `bans` addresses banned for an hour (from 10.0.0.1 on).
/// The manager, the app, the held connections and the banned addresses.
fn long_lists(
    cap: usize,
    sessions: usize,
    bans: usize,
) -> (Manager, App, Vec<std::net::TcpStream>, Vec<String>) {
    let m = with_output_cap(cap, |p| {
        p.replace(
            "max_remote_clients = 4",
            &format!("max_remote_clients = {sessions}"),
        )
    });
    let a = server_loop_app(&m);
    let mut held = Vec::new();
    for i in 0..sessions {
        let (tcp, answer) = hello_from(&format!("127.0.1.{}", i + 1), &a);
        assert!(matches!(answer, Answer::Accepted(_)), "{i}: {answer:?}");
        held.push(tcp);
    }
    let mut c = m.raw(&m.admin());
    let mut banned = Vec::new();
    for i in 0..bans {
        if i % 500 == 499 {
            c = m.raw(&m.admin()); // under the per-connection request rate
        }
        let address = format!("10.0.{}.{}", i / 250, i % 250 + 1);
        let ban = json!({ "app": "tester", "address": address, "seconds": 3600 });
        c.call::<_, Value>("io.redn.Admin.BanRemote", &ban, &[])
            .unwrap();
        banned.push(address);
    }
    (m, a, held, banned)
}

#[test]
fn lists_longer_than_one_reply_may_carry_are_cut_and_say_so() {
    // A script bans 300 addresses one by one, and 64 sessions are served, under a reply
    // queue of 8 KiB: neither list fits in one reply. Each must still be answered (the
    // entries that fit, and how many were left out), not cut off with the admin's
    // connection as a client that does not read its replies (before: the connection closed
    // with a `disconnect reason=unread-replies` record, for ever while the bans stood).
    const CAP: usize = 8192;
    const BANS: usize = 300;
    const SESSIONS: usize = 64;
    let (m, a, _held, _) = long_lists(CAP, SESSIONS, BANS);
    for (method, key, total) in [
        ("ListBans", "bans", BANS),
        ("ListRemoteClients", "remotes", SESSIONS),
    ] {
        let r =
            admin(&m, method, json!({})).unwrap_or_else(|e| panic!("{method}: {e}\n{}", m.log()));
        let listed = r[key].as_array().unwrap().len();
        let omitted = usize::try_from(r["omitted"].as_u64().unwrap_or(0)).unwrap();
        assert!(listed > 0, "{method}: {r}");
        assert_eq!(
            listed + omitted,
            total,
            "{method}: {listed} listed, {omitted} omitted"
        );
        assert!(
            r.to_string().len() <= CAP,
            "{method}: a reply of {} bytes",
            r.to_string().len()
        );
    }
    // The manager serves on.
    let (_t, answer) = hello_from("127.0.2.1", &a);
    assert!(
        matches!(answer, Answer::Refused(Refusal::TooManyClients, _)),
        "{answer:?}"
    );
}

/// A directory tree removed when dropped.
struct TempTree(std::path::PathBuf);

impl Drop for TempTree {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// This test binary linked at a path as long as the kernel allows, each of its 15
/// directories named by 250 control characters (6 bytes each in JSON: `\u0001`): a program
/// any local user can run from a directory of their own.
fn exe_at_a_hostile_path() -> (TempTree, std::path::PathBuf) {
    use std::os::unix::ffi::OsStrExt;
    use std::os::unix::fs::DirBuilderExt;
    let me = std::env::current_exe().unwrap();
    let root = me
        .parent()
        .unwrap()
        .join(format!("redn-exe-{}", std::process::id()));
    let mut dir = root.clone();
    let name = std::ffi::OsStr::from_bytes(&[1u8; 250]);
    for _ in 0..15 {
        dir.push(name);
    }
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o755)
        .create(&dir)
        .unwrap();
    let exe = dir.join("x");
    std::fs::hard_link(&me, &exe).unwrap();
    (TempTree(root), exe)
}

#[test]
fn a_user_with_a_long_exe_path_cannot_hide_the_client_list_from_the_admin() {
    // Uid 65534 opens connections until refused, from a program whose path is 23 KB of
    // JSON: the client list would be tens of MB in one reply. The admin must still get
    // the clients that fit and the count of the rest (before: the admin's connection was
    // closed at the pending-output cap, `redn client show` failed for as long as the
    // attacker held its connections).
    let m = open_manager(&[]);
    let (_tree, exe) = exe_at_a_hostile_path();
    let mut attacker = Attacker::start_at(&exe, "hold-connections", &m.api());
    let verdict = attacker.line();
    let held: usize = verdict
        .rsplit_once("held=")
        .and_then(|(_, n)| n.parse().ok())
        .unwrap_or_else(|| panic!("{verdict}"));
    assert!(held > 200, "{verdict}");
    let r = admin(&m, "ListClients", json!({}))
        .unwrap_or_else(|e| panic!("ListClients: {e}\n{verdict}"));
    let listed = r["clients"].as_array().unwrap();
    let omitted = usize::try_from(r["omitted"].as_u64().unwrap_or(0)).unwrap();
    assert!(!listed.is_empty() && omitted > 0, "{} listed", listed.len());
    assert_eq!(listed.len() + omitted, held);
    assert!(listed[0]["exe"].as_str().unwrap().contains('\u{1}'));
    attacker.finish();
}

#[test]
fn entries_too_large_for_any_reply_are_counted_and_end_redns_walk_through_the_pages() {
    // Under a reply queue of 16 KiB (8 KiB of entries a reply), every client entry of a
    // program at a 23 KB path is too large for any reply: the first page is empty, with
    // `next` at its own offset. `redn client show` must say so and stop, not ask for the
    // same page for ever.
    let m = Manager::configure(&policy("", ""));
    m.open_api_socket();
    let m = m.launch(&["--limit", "pending-output-bytes=16384"], &[]);
    let (_tree, exe) = exe_at_a_hostile_path();
    let mut attacker = Attacker::start_at(&exe, "hold-connections", &m.api());
    let verdict = attacker.line();
    let held: u64 = verdict
        .rsplit_once("held=")
        .and_then(|(_, n)| n.parse().ok())
        .unwrap_or_else(|| panic!("{verdict}"));
    for offset in [0, 5] {
        let r = admin(&m, "ListClients", json!({ "offset": offset })).unwrap();
        assert!(r["clients"].as_array().unwrap().is_empty(), "{r:.300}");
        assert_eq!(r["omitted"].as_u64(), Some(held - offset), "{r:.300}");
        assert_eq!(r["next"].as_u64(), Some(offset), "{r:.300}");
    }
    let admin = m.admin();
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_redn"))
        .args(["-s", admin.to_str().unwrap(), "-j", "client", "show"])
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{out:?}");
    assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), "[]");
    assert!(
        stderr.contains(&format!("{held} more not listed"))
            && stderr.contains("larger than one reply may carry"),
        "{stderr}"
    );
    attacker.finish();
}

/// The NIC objects the manager holds (protection domains, regions, CQs, QPs).
fn nic_objects(m: &Manager) -> [u64; 4] {
    let r = admin(m, "ListDevices", json!({})).unwrap();
    let d = &r["devices"][0];
    ["pd", "mr", "cq", "qp"].map(|k| d[k].as_u64().unwrap())
}

/// The (handle, instance) of every session `ListRemoteClients` shows from `ip`.
fn sessions_from(m: &Manager, ip: &str) -> Vec<(u64, u64)> {
    let r = admin(m, "ListRemoteClients", json!({})).unwrap();
    r["remotes"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|s| s["peer"].as_str().unwrap().starts_with(&format!("{ip}:")))
        .map(|s| {
            (
                s["handle"].as_u64().unwrap(),
                s["instance"].as_u64().unwrap(),
            )
        })
        .collect()
}

#[test]
fn bad_parameters_gone_sessions_and_spent_bans_are_refused_by_name_and_leak_nothing() {
    let m = Manager::start_with_dataplane(&server_loop_policy(|p| p));
    let (one, two) = (server_loop_app(&m), server_loop_app(&m));
    let baseline = nic_objects(&m);
    // 127.0.0.3 holds a session with each of the app's two offloads, 127.0.0.4 one.
    let mut held = Vec::new();
    for (ip, a) in [
        ("127.0.0.3", &one),
        ("127.0.0.3", &two),
        ("127.0.0.4", &one),
    ] {
        let (tcp, answer) = hello_from(ip, a);
        assert!(matches!(answer, Answer::Accepted(_)), "{answer:?}");
        held.push(tcp);
    }
    let theirs = sessions_from(&m, "127.0.0.4");
    assert_eq!(theirs.len(), 1);
    let (handle, instance) = theirs[0];
    // DisconnectRemote of sessions nobody holds, or not with that offload; parameters no
    // session id can be.
    for (params, error) in [
        (
            json!({ "handle": handle, "instance": u64::MAX }),
            "NoSuchRemote",
        ),
        (json!({ "handle": handle, "instance": 0 }), "NoSuchRemote"),
        (
            json!({ "handle": two.handle, "instance": instance }),
            "NoSuchRemote",
        ),
        (
            json!({ "handle": u64::MAX, "instance": instance }),
            "NoSuchRemote",
        ),
        (
            json!({ "handle": handle, "instance": -1 }),
            "InvalidParameter",
        ),
        (
            json!({ "handle": handle, "instance": 1.5 }),
            "InvalidParameter",
        ),
        (
            json!({ "handle": handle, "instance": "1" }),
            "InvalidParameter",
        ),
        (json!({ "handle": handle }), "InvalidParameter"),
    ] {
        let e = admin(&m, "DisconnectRemote", params.clone()).expect_err("refused");
        assert!(e.contains(error), "{params}: {e}");
    }
    // BanRemote: addresses that are not one, seconds that are not a count of them, apps
    // the policy does not have.
    let huge = "1".repeat(500_000);
    for address in [
        "",
        " 127.0.0.3",
        "127.0.0.3 ",
        "127.0.0.3\n",
        "127.0.0.3:4791",
        "127.0.0.3/32",
        "[::1]",
        "127.0.0.03x",
        "１２７.0.0.3",
        "127.0.0.256",
        huge.as_str(),
    ] {
        let ban = json!({ "app": "tester", "address": address, "seconds": 60 });
        let e = admin(&m, "BanRemote", ban).expect_err("refused");
        assert!(
            e.contains("InvalidParameter") && e.contains("address"),
            "{e:.200}"
        );
    }
    for seconds in [json!(-1), json!(1.5), json!("60"), json!(1e300)] {
        let ban = json!({ "app": "tester", "address": "127.0.0.3", "seconds": seconds });
        let e = admin(&m, "BanRemote", ban).expect_err("refused");
        assert!(
            e.contains("InvalidParameter") && e.contains("seconds"),
            "{e}"
        );
    }
    for app in ["nope", "", "tester\n", huge.as_str()] {
        let ban = json!({ "app": app, "address": "127.0.0.3", "seconds": 60 });
        let e = admin(&m, "BanRemote", ban).expect_err("refused");
        assert!(e.contains("NoSuchApp"), "{e:.200}");
    }
    // Addresses no client has: banned, nothing ended (plain IPv6 ones are refused: see
    // `a_plain_ipv6_address_no_remote_client_can_have_is_refused_by_name`).
    for address in ["0.0.0.0", "255.255.255.255"] {
        let ban = json!({ "app": "tester", "address": address, "seconds": 60 });
        let r = admin(&m, "BanRemote", ban).unwrap();
        assert_eq!(r["ended"], 0, "{address}: {r}");
    }
    assert_eq!(sessions_from(&m, "127.0.0.3").len(), 2, "nothing ended yet");
    // A ban ends the address's sessions with every offload of the app, and only those.
    let mine = sessions_from(&m, "127.0.0.3");
    let ban = json!({ "app": "tester", "address": "127.0.0.3", "seconds": 3600 });
    let r = admin(&m, "BanRemote", ban).unwrap();
    assert_eq!(r["ended"], 2, "{r}");
    assert!(closed(&mut held[0]) && closed(&mut held[1]));
    for (h, i) in &mine {
        record_with(
            &m,
            &[
                "event=remote-exit ",
                &format!(" handle={h} "),
                &format!(" instance={i} "),
                "banned by an administrator",
            ],
        );
        // Ended: not ended again, however often asked.
        for _ in 0..2 {
            let gone = json!({ "handle": h, "instance": i });
            let e = admin(&m, "DisconnectRemote", gone).expect_err("gone");
            assert!(e.contains("NoSuchRemote"), "{e}");
        }
    }
    assert_eq!(
        sessions_from(&m, "127.0.0.4"),
        theirs,
        "the neighbour serves on"
    );
    // A ban that ran out is no ban to lift; nor one on a uid nobody banned.
    let ban = json!({ "app": "tester", "address": "127.0.0.5", "seconds": 1 });
    admin(&m, "BanRemote", ban).unwrap();
    wait_for("the 1s ban never ran out", || {
        let bans = admin(&m, "ListBans", json!({})).unwrap();
        !bans.to_string().contains("\"127.0.0.5\"")
    });
    for lift in [
        json!({ "app": "tester", "address": "127.0.0.5" }),
        json!({ "app": "tester", "uid": 0 }),
        json!({ "app": "nope", "address": "127.0.0.3" }),
    ] {
        let e = admin(&m, "LiftBan", lift.clone()).expect_err("no such ban");
        assert!(e.contains("NoSuchBan"), "{lift}: {e}");
    }
    let (_t, answer) = hello_from("127.0.0.5", &one);
    assert!(matches!(answer, Answer::Accepted(_)), "{answer:?}");
    drop(_t);
    // Every session closed: the NIC holds what the two installs hold, no more.
    drop(held);
    wait_for("NIC objects never returned to the installs' own", || {
        nic_objects(&m) == baseline
    });
}

#[test]
fn a_ban_is_recorded_as_it_holds_and_a_shorter_one_does_not_cut_it_short() {
    // A ban longer than the clock can count holds for ever: its record says so (before:
    // duration=18446744073709551615s). A careless admin (or script) banning an address
    // already banned for ever, or for longer, does not shorten its ban (before: replaced,
    // 60s left): lifting is how a ban is cut short.
    let m = Manager::start_with_dataplane(&server_loop_policy(|p| p));
    let ban = |address: &str, seconds: Option<u64>| {
        let ban = json!({ "app": "tester", "address": address, "seconds": seconds });
        admin(&m, "BanRemote", ban).unwrap();
    };
    let left = |address: &str| {
        let bans = admin(&m, "ListBans", json!({})).unwrap();
        let entry = bans["bans"]
            .as_array()
            .unwrap()
            .iter()
            .find(|b| b["address"] == address)
            .cloned();
        entry.map(|b| b["left_ns"].as_u64())
    };
    ban("127.0.0.7", Some(u64::MAX));
    record_with(
        &m,
        &["event=ban ", " address=127.0.0.7 ", " duration=infinity "],
    );
    ban("127.0.0.7", Some(60));
    record_with(
        &m,
        &["event=ban ", " address=127.0.0.7 ", " duration=infinity "],
    );
    assert_eq!(left("127.0.0.7"), Some(None), "still for ever");
    ban("127.0.0.8", None);
    ban("127.0.0.8", Some(1));
    assert_eq!(left("127.0.0.8"), Some(None), "still for ever");
    ban("127.0.0.9", Some(3600));
    ban("127.0.0.9", Some(60));
    let kept = left("127.0.0.9").flatten().unwrap();
    assert!(kept > 3_500_000_000_000, "the hour kept: {kept} ns left");
    record_with(&m, &["event=ban ", " address=127.0.0.9 ", " duration=359"]);
    // A longer ban extends a shorter one.
    ban("127.0.0.9", Some(7200));
    let longer = left("127.0.0.9").flatten().unwrap();
    assert!(longer > 7_100_000_000_000, "{longer} ns left");
    // Lifted, the address may be banned for less.
    admin(
        &m,
        "LiftBan",
        json!({ "app": "tester", "address": "127.0.0.9" }),
    )
    .unwrap();
    ban("127.0.0.9", Some(60));
    let short = left("127.0.0.9").flatten().unwrap();
    assert!(short <= 60_000_000_000, "{short} ns left");
}

#[test]
fn bans_of_an_app_rule_a_reload_renamed_are_listed_and_lifted_under_the_old_name() {
    // The admin bans 127.0.0.3 from "tester", then a reload renames the rule "renamed"
    // (the same processes): the old rule's install is torn down with its sessions; the
    // ban stays listed under the name it was given and is lifted by it; the old name is no
    // app to ban from, the new one is.
    let m = Manager::start_with_dataplane(&server_loop_policy(|p| p));
    let a = server_loop_app(&m);
    let (mut tcp, answer) = hello_from("127.0.0.4", &a);
    assert!(matches!(answer, Answer::Accepted(_)), "{answer:?}");
    let ban = json!({ "app": "tester", "address": "127.0.0.3", "seconds": 3600 });
    admin(&m, "BanRemote", ban).unwrap();
    let policy = std::fs::read_to_string(m.dir.join("policy.toml")).unwrap();
    std::fs::write(
        m.dir.join("policy.toml"),
        policy.replace("name = \"tester\"", "name = \"renamed\""),
    )
    .unwrap();
    admin(&m, "ReloadPolicy", json!({})).unwrap();
    assert!(
        closed(&mut tcp),
        "the old rule's session ended with its install"
    );
    let bans = admin(&m, "ListBans", json!({})).unwrap();
    assert_eq!(bans["bans"].as_array().unwrap().len(), 1, "{bans}");
    assert_eq!(bans["bans"][0]["app"], "tester", "{bans}");
    let old = json!({ "app": "tester", "address": "127.0.0.5", "seconds": 60 });
    let e = admin(&m, "BanRemote", old).expect_err("no such app");
    assert!(e.contains("NoSuchApp"), "{e}");
    let new = json!({ "app": "renamed", "address": "127.0.0.3", "seconds": 60 });
    assert_eq!(admin(&m, "BanRemote", new).unwrap()["ended"], 0);
    let e = admin(
        &m,
        "LiftBan",
        json!({ "app": "renamed", "address": "127.0.0.4" }),
    )
    .expect_err("never banned");
    assert!(e.contains("NoSuchBan"), "{e}");
    for app in ["tester", "renamed"] {
        let lift = json!({ "app": app, "address": "127.0.0.3" });
        assert_eq!(admin(&m, "LiftBan", lift).unwrap()["lifted"], 1, "{app}");
    }
    let bans = admin(&m, "ListBans", json!({})).unwrap();
    assert!(bans["bans"].as_array().unwrap().is_empty(), "{bans}");
}

/// Flood GETs from `source` on one session until it ends (or `most` passes): the GETs
/// served and how the session ended.
fn flood_from(a: &App, source: [u8; 4], most: std::time::Duration) -> (u64, Option<String>) {
    let at = Some(std::net::Ipv4Addr::from(source));
    let mut c = remote_client_from(a, std::time::Duration::from_secs(2), at).unwrap();
    let end = std::time::Instant::now() + most;
    let mut n = 0;
    while std::time::Instant::now() < end {
        if let Err(e) = c.get(0x2a) {
            return (n, Some(format!("{e:?}")));
        }
        n += 1;
    }
    (n, None)
}

/// The first auditor verdict on `address` among the records from now on (`throttle`,
/// `unthrottle`, `terminate` or `ban`, naming it as `address=` or `peer=`), within `within`.
fn next_verdict_on(m: &Manager, address: &str, within: std::time::Duration) -> Option<String> {
    let named = [format!(" address={address} "), format!(" peer={address}:")];
    first_record_where(m, within, |rec| {
        let verdict = ["throttle", "unthrottle", "terminate", "ban"]
            .iter()
            .any(|e| rec.contains(&format!("event={e} ")));
        verdict && named.iter().any(|n| rec.contains(n.as_str()))
    })
}

#[test]
fn a_client_banned_while_throttled_starts_afresh_when_its_ban_ends() {
    // 100 triggers a second, banned for an hour by the auditor past throttling. A client
    // floods and is throttled; the admin bans its address for a second, then it comes back
    // and floods again. Its ban was the penalty: it must be judged afresh, throttled first
    // (as after the auditor's own ban), not go on throttled and be banned for an hour at
    // once for what it did before its ban (before: its throttle outlived the ban by up to
    // CLIENT_MEMORY, 60 s: paced from its hello, then `terminate rule=still-flooding` and
    // the auditor's hour-long ban, with no throttle first).
    use std::time::Duration;
    let m = Manager::start_with_dataplane(&trigger_budget_ban_policy());
    let a = server_loop_app(&m);
    let flood = std::thread::scope(|s| {
        let flooder = s.spawn(|| flood_from(&a, [127, 0, 0, 5], Duration::from_secs(10)));
        let throttled = next_verdict_on(&m, "127.0.0.5", Duration::from_secs(5));
        let ban = json!({ "app": "tester", "address": "127.0.0.5", "seconds": 1 });
        let banned = admin(&m, "BanRemote", ban).unwrap();
        (throttled, banned, flooder.join().unwrap())
    });
    let (throttled, banned, (served, ended)) = flood;
    let throttled = throttled.expect("the first flood was never judged");
    assert!(
        throttled.contains("event=throttle ") && banned["ended"] == 1,
        "the admin banned a throttled client: {throttled}, {banned}"
    );
    assert!(
        ended.is_some(),
        "its session ended with the ban ({served} GETs)"
    );
    wait_for("the 1 s ban never ran out", || {
        let bans = admin(&m, "ListBans", json!({})).unwrap();
        !bans.to_string().contains("\"127.0.0.5\"")
    });
    drain_records(&m, Duration::from_millis(100));
    let again = std::thread::scope(|s| {
        let flooder = s.spawn(|| flood_from(&a, [127, 0, 0, 5], Duration::from_secs(3)));
        let first = next_verdict_on(&m, "127.0.0.5", Duration::from_secs(5));
        (first, flooder.join().unwrap())
    });
    let (first, (served, ended)) = again;
    let first = first.expect("the second flood was never judged");
    assert!(
        first.contains("event=throttle ") && first.contains(" rule=triggers-per-second "),
        "back from its ban, the client's first flood is throttled first, as a new client's: \
         {first} ({served} GETs, ended by {ended:?})"
    );
}

/// Every page of `method`'s list from the start, following `next` (and the call with the
/// page asked for, each reply): the entries, in order.
fn all_pages(m: &Manager, method: &str, key: &str, limit: Option<u64>) -> Vec<Value> {
    let mut c = m.raw(&m.admin());
    let mut entries = Vec::new();
    let mut params = json!({});
    if let Some(l) = limit {
        params["limit"] = json!(l);
    }
    for _ in 0..1000 {
        let r: Value = c
            .call(&format!("io.redn.Admin.{method}"), &params, &[])
            .unwrap_or_else(|e| panic!("{method} {params}: {e:?}"));
        let page = r[key].as_array().unwrap();
        let before = entries.len();
        entries.extend(page.iter().cloned());
        let omitted = r["omitted"].as_u64().unwrap();
        match r.get("next").and_then(Value::as_u64) {
            None => {
                assert_eq!(omitted, 0, "{method}: no next page, yet {omitted} omitted");
                return entries;
            }
            Some(next) => {
                assert!(
                    !page.is_empty(),
                    "{method} {params}: an empty page, and a next"
                );
                assert_eq!(
                    usize::try_from(next).ok(),
                    Some(entries.len()),
                    "{method}: next after {before}"
                );
                params["offset"] = json!(next);
            }
        }
    }
    panic!("{method}: more than 1000 pages");
}

#[test]
fn every_entry_of_a_long_list_is_reached_a_page_at_a_time() {
    // As in `lists_longer_than_one_reply_may_carry_are_cut_and_say_so`: 300 bans and 24
    // sessions under a reply queue of 8 KiB. The entries past the first reply must be
    // reachable, by `offset` and `limit` with the reply saying where the next page starts,
    // and `redn ban show` must show them all (before: `offset` was ignored, every call
    // answered the first page, and the admin had only the count of the rest).
    const BANS: usize = 300;
    const SESSIONS: usize = 24;
    let (m, _a, _held, banned) = long_lists(8192, SESSIONS, BANS);
    // The old call: the first page, as before, with where the next starts.
    let first = admin(&m, "ListBans", json!({})).unwrap();
    let listed = first["bans"].as_array().unwrap().len();
    assert!(listed > 0 && listed < BANS, "{listed}");
    assert_eq!(first["omitted"].as_u64(), Some((BANS - listed) as u64));
    assert_eq!(first["next"].as_u64(), Some(listed as u64));
    // Every ban, once each, in the order the first page began.
    for limit in [None, Some(7), Some(u64::MAX)] {
        let bans = all_pages(&m, "ListBans", "bans", limit);
        let mut addresses: Vec<String> = bans
            .iter()
            .map(|b| b["address"].as_str().unwrap().to_owned())
            .collect();
        let first_page: Vec<&str> = first["bans"]
            .as_array()
            .unwrap()
            .iter()
            .map(|b| b["address"].as_str().unwrap())
            .collect();
        assert_eq!(addresses[..listed], first_page[..], "the same order");
        addresses.sort();
        let mut want = banned.clone();
        want.sort();
        assert_eq!(addresses, want, "limit {limit:?}");
        let sessions = all_pages(&m, "ListRemoteClients", "remotes", limit);
        assert_eq!(sessions.len(), SESSIONS, "limit {limit:?}");
    }
    // A page in the middle, the last one, and past the end.
    let r = admin(&m, "ListBans", json!({ "offset": 10, "limit": 5 })).unwrap();
    assert_eq!(r["bans"].as_array().unwrap().len(), 5, "{r}");
    assert_eq!(
        (r["omitted"].as_u64(), r["next"].as_u64()),
        (Some(285), Some(15))
    );
    let r = admin(&m, "ListBans", json!({ "offset": 298, "limit": 5 })).unwrap();
    assert_eq!(r["bans"].as_array().unwrap().len(), 2, "{r}");
    assert_eq!(
        (r["omitted"].as_u64(), r.get("next")),
        (Some(0), None),
        "{r}"
    );
    for offset in [json!(300), json!(u64::MAX)] {
        let r = admin(&m, "ListBans", json!({ "offset": offset })).unwrap();
        assert!(r["bans"].as_array().unwrap().is_empty(), "{r}");
        assert_eq!(
            (r["omitted"].as_u64(), r.get("next")),
            (Some(0), None),
            "{r}"
        );
    }
    let r = admin(&m, "ListOffloads", json!({ "limit": 1 })).unwrap();
    assert_eq!(r["offloads"].as_array().unwrap().len(), 1, "{r}");
    let r = admin(&m, "ListClients", json!({ "offset": 0, "limit": 1 })).unwrap();
    assert_eq!(r["clients"].as_array().unwrap().len(), 1, "{r}");
    // Parameters that are no page, by name.
    for (method, params, name) in [
        ("ListBans", json!({ "limit": 0 }), "limit"),
        ("ListBans", json!({ "limit": -1 }), "limit"),
        ("ListRemoteClients", json!({ "limit": 1.5 }), "limit"),
        ("ListClients", json!({ "offset": -1 }), "offset"),
        ("ListOffloads", json!({ "offset": "5" }), "offset"),
        ("ListBans", json!({ "offset": 1e300 }), "offset"),
        ("ListBans", json!({ "page": 2 }), "page"),
    ] {
        let e = admin(&m, method, params.clone()).expect_err("refused");
        assert!(
            e.contains("InvalidParameter") && e.contains(name),
            "{method} {params}: {e}"
        );
    }
    // `redn ban show` fetches every page; with --offset and --limit, one.
    let redn = |args: &[&str]| {
        let admin = m.admin();
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_redn"))
            .args(["-s", admin.to_str().unwrap(), "-j"])
            .args(args)
            .output()
            .unwrap();
        assert!(out.status.success(), "{args:?}: {out:?}");
        let rows: Value = serde_json::from_slice(&out.stdout).unwrap();
        (
            rows.as_array().unwrap().len(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    };
    let (rows, stderr) = redn(&["ban", "show"]);
    assert_eq!(rows, BANS, "{stderr}");
    assert!(stderr.is_empty(), "{stderr}");
    let (rows, _) = redn(&["remote", "show"]);
    assert_eq!(rows, SESSIONS);
    let (rows, stderr) = redn(&["ban", "show", "--offset", "10", "--limit", "5"]);
    assert_eq!(rows, 5);
    assert!(stderr.contains("--offset 15"), "{stderr}");
    let (rows, stderr) = redn(&["ban", "show", "--offset", "298"]);
    assert_eq!(rows, 2);
    assert!(stderr.is_empty(), "{stderr}");
}
