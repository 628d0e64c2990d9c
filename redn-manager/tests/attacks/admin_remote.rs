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
        matches!(again, Answer::Refused(Refusal::Banned, _)),
        "{again:?}"
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

/// A manager with a data plane and `--limit pending-output-bytes=BYTES` (a reply queue an
/// operator sized down), policy from [`server_loop_policy`] with `edit`.
fn with_output_cap(bytes: usize, edit: impl Fn(String) -> String) -> Manager {
    let m = Manager::configure(&server_loop_policy(edit));
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let mut config = std::fs::read_to_string(m.config()).unwrap();
    config.push_str(&format!("[dataplane]\nlisten = \"127.0.0.1:{port}\"\n"));
    std::fs::write(m.config(), config).unwrap();
    m.launch(&["--limit", &format!("pending-output-bytes={bytes}")], &[])
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
    let m = with_output_cap(CAP, |p| {
        p.replace(
            "max_remote_clients = 4",
            &format!("max_remote_clients = {SESSIONS}"),
        )
    });
    let a = server_loop_app(&m);
    let mut held = Vec::new();
    for i in 0..SESSIONS {
        let (tcp, answer) = hello_from(&format!("127.0.1.{}", i + 1), &a);
        assert!(matches!(answer, Answer::Accepted(_)), "{i}: {answer:?}");
        held.push(tcp);
    }
    let mut c = m.raw(&m.admin());
    for i in 0..BANS {
        if i % 500 == 499 {
            c = m.raw(&m.admin()); // under the per-connection request rate
        }
        let address = format!("10.0.{}.{}", i / 250, i % 250 + 1);
        let ban = json!({ "app": "tester", "address": address, "seconds": 3600 });
        c.call::<_, Value>("io.redn.Admin.BanRemote", &ban, &[])
            .unwrap();
    }
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
    let mut child = Command::new("setpriv")
        .args([
            &format!("--reuid={HOSTILE_UID}"),
            &format!("--regid={HOSTILE_UID}"),
            "--clear-groups",
        ])
        .arg(&exe)
        .args([
            "--exact",
            "hostile_entry",
            "--ignored",
            "--nocapture",
            "--test-threads=1",
        ])
        .env("REDN_ATTACK", "hold-connections")
        .env("REDN_MANAGER_SOCKET", m.api())
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let out = BufReader::new(child.stdout.take().unwrap());
    let mut attacker = Attacker { child, out };
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
