//! The admin's remote-client and ban methods (`ListRemoteClients`, `DisconnectRemote`,
//! `ListBans`, `BanRemote`, `LiftBan`) called as a careless admin or script calls them: an
//! address written another way, parameters at and past their bounds, sessions that are
//! already gone, lists too long for one reply.

use super::*;
use redn_proto::dataplane::{Answer, Refusal};
use serde_json::{json, Value};
use std::io::Read;
use std::time::Duration;

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
