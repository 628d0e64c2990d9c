//! Hostile clients against the real `redn-manager` binary: each test is one attack, run
//! as an attacker would (real processes, real sockets, other uids), and what must hold
//! while it runs: the daemon stays up and keeps serving everyone else. `docs/attacks.md`
//! lists them with what each pins.

mod common;

use common::*;
use redn_proto::client::Connection;
use std::io::{BufRead, BufReader, Write};
use std::path::Path;
use std::process::{Child, Command, Stdio};

/// A uid with no rule and no privileges: the attacker.
const HOSTILE_UID: &str = "65534";

/// This test binary again, as `uid`, doing attack `role` against `socket`.
fn hostile_as(uid: &str, role: &str, socket: &Path) -> Child {
    Command::new("setpriv")
        .args([
            &format!("--reuid={uid}"),
            &format!("--regid={uid}"),
            "--clear-groups",
        ])
        .arg(std::env::current_exe().unwrap())
        .args([
            "--exact",
            "hostile_entry",
            "--ignored",
            "--nocapture",
            "--test-threads=1",
        ])
        .env("REDN_ATTACK", role)
        .env("REDN_MANAGER_SOCKET", socket)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap()
}

/// The next "HOSTILE ..." line the attacker printed, without the prefix.
fn hostile_line(out: &mut impl BufRead) -> String {
    let mut line = String::new();
    loop {
        line.clear();
        assert!(out.read_line(&mut line).unwrap() > 0, "the attacker exited");
        if let Some((_, rest)) = line.split_once("HOSTILE ") {
            return rest.trim().to_owned();
        }
    }
}

/// An attacker process and its stdout.
struct Attacker {
    child: Child,
    out: BufReader<std::process::ChildStdout>,
}

impl Attacker {
    /// Start attack `role` against `socket` as `uid`.
    fn start_as(uid: &str, role: &str, socket: &Path) -> Attacker {
        let mut child = hostile_as(uid, role, socket);
        let out = BufReader::new(child.stdout.take().unwrap());
        Attacker { child, out }
    }

    /// Start attack `role` against `socket` as uid 65534.
    fn start(role: &str, socket: &Path) -> Attacker {
        Attacker::start_as(HOSTILE_UID, role, socket)
    }

    /// Its next report.
    fn line(&mut self) -> String {
        hostile_line(&mut self.out)
    }

    /// Tell it to let go (close its stdin) and wait for it to exit cleanly.
    fn finish(mut self) {
        drop(self.child.stdin.take());
        assert!(self.child.wait().unwrap().success());
    }
}

/// The clients the manager lists to its admin.
fn admin_clients(m: &Manager) -> Vec<redn_proto::api::ClientEntry> {
    let mut c = m.raw(&m.admin());
    let r: redn_proto::api::ClientList = c.call("io.redn.Admin.ListClients", &(), &[]).unwrap();
    r.clients
}

/// Open `n` connections to `socket`, sending `bytes` (with `fds`) on each; those still
/// open and how many the manager cut (their write failed).
fn open_sending(
    socket: &Path,
    n: usize,
    bytes: &[u8],
    fds: &[std::os::fd::BorrowedFd<'_>],
) -> (Vec<Connection>, usize) {
    let mut held = Vec::new();
    let mut cut = 0;
    for _ in 0..n {
        let mut c = Connection::connect(socket, DEADLINE).unwrap();
        match c.send_bytes(bytes, fds) {
            Ok(()) => held.push(c),
            Err(_) => cut += 1,
        }
    }
    (held, cut)
}

/// Report `what` to the test, then hold everything until stdin closes.
fn report_and_hold(what: &str) {
    println!("HOSTILE {what}");
    std::io::stdout().flush().unwrap();
    let mut rest = String::new();
    let _ = std::io::stdin().read_line(&mut rest);
}

/// Not a test: the body of the attacker processes the tests start (see `hostile`).
#[test]
#[ignore = "run by the other tests as an attacker process"]
fn hostile_entry() {
    let Ok(role) = std::env::var("REDN_ATTACK") else {
        return;
    };
    let socket = std::path::PathBuf::from(std::env::var("REDN_MANAGER_SOCKET").unwrap());
    match role.as_str() {
        "hold-connections" => {
            // Open connections until the manager refuses one, each proven served by a
            // call; say how it ended; hold them until stdin closes.
            let mut held = Vec::new();
            let verdict = loop {
                let mut c = match Connection::connect(&socket, DEADLINE) {
                    Ok(c) => c,
                    Err(e) => break format!("connect-failed {e}"),
                };
                // A connection refused at accept gets its error unprompted and is closed,
                // so the send may fail: the reply is read either way.
                let _ = c.send_bytes(b"{\"method\":\"org.varlink.service.GetInfo\"}\0", &[]);
                let call = c.read_reply();
                match call {
                    Ok(r) if r.error.is_none() => held.push(c),
                    Ok(r) => {
                        break format!(
                            "refused {} {}",
                            r.error.unwrap_or_default(),
                            r.parameters
                                .get("resource")
                                .and_then(|v| v.as_str())
                                .unwrap_or_default()
                        )
                    }
                    Err(e) => break format!("stalled after {} connections: {e}", held.len()),
                }
                if held.len() > 5000 {
                    break "never refused".into();
                }
            };
            report_and_hold(&format!("{verdict} held={}", held.len()));
        }
        "flood-unread" => {
            // Pipeline requests with large replies on many connections and never read
            // one: each connection stays just under the pending-output cap (about 3.8 MB
            // of replies each), so none is dropped for it.
            let request = b"{\"method\":\"org.varlink.service.GetInterfaceDescription\",\
                            \"parameters\":{\"interface\":\"io.redn.Manager\"}}\0";
            let burst = request.repeat(FLOOD_REQUESTS);
            let (_held, cut) = open_sending(&socket, FLOOD_CONNECTIONS, &burst, &[]);
            assert_eq!(cut, 0);
            report_and_hold("sent");
        }
        "slow-loris" => {
            // On many connections, a message just under the size cap, never finished.
            let partial = vec![b' '; LORIS_BYTES];
            let (_held, cut) = open_sending(&socket, LORIS_CONNECTIONS, &partial, &[]);
            report_and_hold(&format!("sent cut={cut}"));
        }
        "hold-fds" => {
            // On as many connections as the manager takes, the first byte of a message
            // with four fds riding on it, the message never finished.
            let files: Vec<std::fs::File> = (0..4)
                .map(|_| std::fs::File::open("/dev/null").unwrap())
                .collect();
            let fds: Vec<_> = files.iter().map(std::os::fd::AsFd::as_fd).collect();
            let _held = open_sending(&socket, 64, b"{", &fds);
            report_and_hold("sent");
        }
        "churn" => {
            // Connect, call, hang up, as fast as the manager answers; tally the answers.
            let mut tally = std::collections::BTreeMap::<String, usize>::new();
            for _ in 0..CHURN_ROUNDS {
                let Ok(mut c) = Connection::connect(&socket, DEADLINE) else {
                    *tally.entry("connect-failed".into()).or_default() += 1;
                    continue;
                };
                let _ = c.send_bytes(b"{\"method\":\"org.varlink.service.GetInfo\"}\0", &[]);
                let answer = match c.read_reply() {
                    Ok(r) => r.error.unwrap_or_else(|| "served".into()),
                    Err(e) => format!("no-reply:{e}"),
                };
                *tally.entry(answer).or_default() += 1;
            }
            let text: Vec<String> = tally.iter().map(|(k, n)| format!("{k}={n}")).collect();
            println!("HOSTILE {}", text.join(" "));
        }
        other => panic!("unknown attack {other}"),
    }
}

/// Connections the reply flood uses, and requests on each (under the rate limit).
const FLOOD_CONNECTIONS: usize = 32;
const FLOOD_REQUESTS: usize = 700;

/// Connections the churn attack opens and closes, one after another.
const CHURN_ROUNDS: usize = 3000;

/// Connections the slow-loris attack uses, and the unfinished message on each.
const LORIS_CONNECTIONS: usize = 64;
const LORIS_BYTES: usize = (1 << 20) - 64;

/// Subscribe to `Monitor` on the admin socket.
fn monitor(m: &Manager) -> Connection {
    let mut c = m.raw(&m.admin());
    c.send_bytes(
        b"{\"method\":\"io.redn.Admin.Monitor\",\"more\":true}\0",
        &[],
    )
    .unwrap();
    c
}

/// The next counters `Monitor` sends (records in between skipped).
fn next_counters(c: &mut Connection) -> redn_proto::api::MonitorCounters {
    loop {
        let r = c.read_reply().unwrap();
        assert!(r.error.is_none(), "{r:?}");
        if let Some(k) = r.parameters.get("counters") {
            return serde_json::from_value(k.clone()).unwrap();
        }
    }
}

/// A manager whose API socket anyone may connect to (the attacker runs as another uid).
fn open_manager(wrapper: &[&str]) -> Manager {
    let m = Manager::configure(&policy("", ""));
    let config = std::fs::read_to_string(m.config()).unwrap();
    std::fs::write(m.config(), config.replace("0660", "0666")).unwrap();
    m.launch(&[], wrapper)
}

#[test]
fn one_uid_cannot_exhaust_the_managers_file_descriptors() {
    // A manager started with few fds (as under a low LimitNOFILE): every app connection
    // costs it a socket and a pidfd. One uid opening connections must meet a named cap
    // before the manager runs out of fds, and everyone else must still be served.
    let m = open_manager(&["prlimit", "--nofile=96:96"]);
    let mut attacker = Attacker::start("hold-connections", &m.api());
    let verdict = attacker.line();
    assert!(
        verdict.starts_with("refused io.redn.Manager.QuotaExceeded connections-per-uid"),
        "{verdict}\n{}",
        m.log()
    );
    // The admin and an app of another uid are still served while the attacker holds on.
    let clients = admin_clients(&m);
    assert!(clients.iter().any(|c| c.uid == 65534), "{clients:?}");
    let mut app = m.client();
    assert_eq!(app.info().unwrap().app, "tester");
    attacker.finish();
}

#[test]
fn clients_that_never_read_their_replies_hold_little_of_the_managers_memory() {
    // Many connections pipelining requests with large replies, none read: the manager
    // stops taking a connection's requests while its replies wait, so what it holds for
    // each is bounded by that, not by the pending-output cap (4 MiB a connection, 1024
    // connections a uid).
    let m = open_manager(&[]);
    let mut attacker = Attacker::start("flood-unread", &m.api());
    assert_eq!(attacker.line(), "sent");
    let mut counters = monitor(&m);
    // Wait for the manager to have taken the flood in: at least 256 KiB of replies are
    // held for each connection either way (the kernel takes about 200 KiB of each).
    let taken_in = (FLOOD_CONNECTIONS * (256 << 10)) as u64;
    let k = loop {
        let k = next_counters(&mut counters);
        if k.buffered_bytes >= taken_in {
            break k;
        }
    };
    let bound = (FLOOD_CONNECTIONS * (512 << 10)) as u64;
    assert!(
        k.buffered_bytes <= bound,
        "{} bytes held for {FLOOD_CONNECTIONS} connections that do not read, more than {bound}",
        k.buffered_bytes
    );
    // Everyone else is served meanwhile.
    assert_eq!(m.client().info().unwrap().app, "tester");
    attacker.finish();
}

#[test]
fn unfinished_messages_on_many_connections_meet_the_per_uid_buffer_cap() {
    // Slow loris: 64 connections each with a message just under the 1 MiB size cap and no
    // NUL, 64 MiB in all. What one uid's connections hold together is capped
    // (buffered-bytes-per-uid, 32 MiB); past it a connection is refused and closed.
    let m = open_manager(&[]);
    let mut attacker = Attacker::start("slow-loris", &m.api());
    let verdict = attacker.line();
    // Each write returned, so the manager has read all but what the kernel buffers.
    let k = next_counters(&mut monitor(&m));
    let bound = (32 << 20) + LORIS_CONNECTIONS as u64 * (32 << 10);
    assert!(
        k.buffered_bytes <= bound,
        "{} bytes held for unfinished messages ({verdict}), more than {bound}",
        k.buffered_bytes
    );
    assert!(m.log().contains("limit=buffered-bytes"), "{}", m.log());
    assert_eq!(m.client().info().unwrap().app, "tester");
    attacker.finish();
}

#[test]
fn fds_held_by_unfinished_messages_cannot_exhaust_the_managers_fds() {
    // Fds that come with a message's first byte are held until the message ends. Two uids
    // opening all the connections they may, each with four fds on a message never
    // finished, must not run the manager out of fds: the connection caps count them.
    let m = open_manager(&["prlimit", "--nofile=256:256"]);
    let mut attackers: Vec<Attacker> = ["65534", "65533"]
        .iter()
        .map(|uid| Attacker::start_as(uid, "hold-fds", &m.api()))
        .collect();
    for a in &mut attackers {
        assert_eq!(a.line(), "sent");
    }
    let clients = admin_clients(&m);
    assert!(clients.iter().any(|c| c.uid == 65533), "{clients:?}");
    assert_eq!(m.client().info().unwrap().app, "tester");
    // Every fd sent was received: the kernel truncates what a full fd table cannot take.
    assert!(!m.log().contains("truncated"), "{}", m.log());
    for a in attackers {
        a.finish();
    }
}

/// A pipe whose write end goes to the manager: the read end sees EOF once every copy of
/// the write end, the manager's included, is closed.
fn pipe_probe() -> (std::fs::File, std::os::fd::OwnedFd) {
    let (read, write) = nix::unistd::pipe().unwrap();
    (std::fs::File::from(read), write)
}

/// Wait (up to the deadline) for EOF on `read`: the manager closed the fd it was sent.
fn closed_by_manager(read: &mut std::fs::File) -> bool {
    use std::io::Read;
    let mut fds = [nix::poll::PollFd::new(
        std::os::fd::AsFd::as_fd(read),
        nix::poll::PollFlags::POLLIN,
    )];
    let millis = u16::try_from(DEADLINE.as_millis()).unwrap_or(u16::MAX);
    if nix::poll::poll(&mut fds, nix::poll::PollTimeout::from(millis)).unwrap_or(0) == 0 {
        return false;
    }
    let mut byte = [0u8; 1];
    matches!(read.read(&mut byte), Ok(0))
}

#[test]
fn every_fd_a_client_passes_is_closed_unless_registered() {
    // SCM_RIGHTS on calls that take none, on a refused registration, beyond the one a
    // registration uses, over the per-message cap, mid-message and on the admin socket:
    // the manager keeps none of them.
    let m = open_manager(&[]);
    let get_info = b"{\"method\":\"io.redn.Manager.GetInfo\"}\0";
    let register = b"{\"method\":\"io.redn.Manager.RegisterRegion\",\"parameters\":{\"fd\":0}}\0";
    let region = redn_client::SealedRegion::create("r", 4096).unwrap();
    type Sender = fn(&Manager, &[std::os::fd::BorrowedFd<'_>]) -> Option<String>;
    let cases: Vec<(&str, Sender)> = vec![
        ("a call that takes none", |m, fds| {
            let mut c = m.raw(&m.api());
            c.send_bytes(b"{\"method\":\"io.redn.Manager.GetInfo\"}\0", fds)
                .unwrap();
            c.read_reply().unwrap().error
        }),
        ("a registration refused (a pipe is no memfd)", |m, fds| {
            let mut c = m.raw(&m.api());
            let call =
                b"{\"method\":\"io.redn.Manager.RegisterRegion\",\"parameters\":{\"fd\":0}}\0";
            c.send_bytes(call, fds).unwrap();
            c.read_reply().unwrap().error
        }),
        ("an admin call", |m, fds| {
            let mut c = m.raw(&m.admin());
            c.send_bytes(b"{\"method\":\"io.redn.Admin.ListClients\"}\0", fds)
                .unwrap();
            c.read_reply().unwrap().error
        }),
    ];
    for (what, send) in cases {
        let (mut read, write) = pipe_probe();
        let error = send(&m, &[std::os::fd::AsFd::as_fd(&write)]);
        drop(write);
        assert!(
            closed_by_manager(&mut read),
            "{what}: the manager kept the fd ({error:?})"
        );
    }
    // Beside a registered memfd, the extra fds of the same call.
    let (mut read, write) = pipe_probe();
    let mut c = m.raw(&m.api());
    c.send_bytes(register, &[region.fd(), std::os::fd::AsFd::as_fd(&write)])
        .unwrap();
    let r = c.read_reply().unwrap();
    assert!(r.error.is_none(), "{r:?}");
    drop(write);
    assert!(
        closed_by_manager(&mut read),
        "an fd beside the registered one was kept"
    );
    // Five where four are allowed.
    let probes: Vec<_> = (0..5).map(|_| pipe_probe()).collect();
    let fds: Vec<_> = probes
        .iter()
        .map(|(_, w)| std::os::fd::AsFd::as_fd(w))
        .collect();
    let mut c = m.raw(&m.api());
    c.send_bytes(get_info, &fds).unwrap();
    assert!(c.read_reply().unwrap().error.is_some());
    drop(fds);
    for (mut read, write) in probes {
        drop(write);
        assert!(closed_by_manager(&mut read), "an fd over the cap was kept");
    }
    // Fds sent in the middle of a message: if the manager read the first part alone, the
    // connection is closed for it; either way the fds are closed.
    let (mut read, write) = pipe_probe();
    let mut c = m.raw(&m.api());
    c.send_bytes(b"{\"method\":", &[]).unwrap();
    assert_eq!(m.client().info().unwrap().app, "tester");
    let _ = c.send_bytes(
        b"\"io.redn.Manager.GetInfo\"}\0",
        &[std::os::fd::AsFd::as_fd(&write)],
    );
    drop(write);
    assert!(
        closed_by_manager(&mut read),
        "an fd sent mid-message was kept"
    );
    assert_eq!(m.client().info().unwrap().app, "tester");
}

#[test]
fn malformed_and_boundary_calls_get_named_errors_and_the_daemon_serves_on() {
    let m = open_manager(&[]);
    let mut good = m.client();
    // Framing the manager cannot trust: an error naming the limit, then the close.
    for bytes in [
        &b"{\"method\":\"io.redn.Manager.GetInfo\xff\"}\0"[..],
        b"\xc3\x28\0",
        b"\0",
        b"[]\0",
        b"{\"method\":5}\0",
        b"{\"method\":\"io.redn.Manager.GetInfo\",\"parameters\":[]}\0",
        b"{\"method\":\"io.redn.Manager.GetInfo\",\"oneway\":true,\"more\":true}\0",
        b"{\"method\":\"io.redn.Manager.GetInfo\",\"evil\":1}\0",
    ] {
        let mut c = m.raw(&m.api());
        c.send_bytes(bytes, &[]).unwrap();
        let r = c.read_reply().unwrap();
        assert_eq!(
            r.error.as_deref(),
            Some("io.redn.Manager.ProtocolViolation"),
            "{:?}: {r:?}",
            String::from_utf8_lossy(bytes)
        );
        assert!(
            r.parameters["limit"]
                .as_str()
                .is_some_and(|l| !l.is_empty()),
            "{:?}: {r:?} names no limit",
            String::from_utf8_lossy(bytes)
        );
        assert!(c.read_reply().is_err(), "closed after the error");
        good.info().unwrap();
    }
    // Parameters at and past their bounds: a named error, the connection kept.
    let mut c = m.raw(&m.api());
    for (method, params, parameter) in [
        ("Uninstall", serde_json::json!({"handle": -1}), "handle"),
        ("Uninstall", serde_json::json!({"handle": 1e300}), "handle"),
        (
            "Uninstall",
            serde_json::json!({"handle": "18446744073709551616"}),
            "handle",
        ),
        ("Uninstall", serde_json::json!({}), "handle"),
        ("RegisterRegion", serde_json::json!({"fd": -1}), "fd"),
        ("RegisterRegion", serde_json::json!({"fd": i64::MAX}), "fd"),
        ("RegisterRegion", serde_json::json!({"fd": 0}), "fd"),
        (
            "InstallOffload",
            serde_json::json!({"offload": "x".repeat(60_000), "regions": []}),
            "",
        ),
        (
            "InstallOffload",
            serde_json::json!({"offload": "echo", "regions": [
                {"name": "table", "region": u64::MAX, "offset": u64::MAX, "len": u64::MAX}
            ]}),
            "",
        ),
    ] {
        let r = c
            .call_raw(
                &format!("io.redn.Manager.{method}"),
                params.as_object().unwrap().clone(),
                &[],
            )
            .unwrap_err();
        let text = format!("{r:?}");
        assert!(
            matches!(r, redn_proto::Error::Remote(_)) && text.contains(parameter),
            "{method} {params}: {text}"
        );
        let info: redn_proto::api::ManagerInfo =
            c.call("io.redn.Manager.GetInfo", &(), &[]).unwrap();
        assert_eq!(info.app, "tester");
    }
    good.info().unwrap();
}

/// The NIC objects the manager holds (protection domains, regions, CQs, QPs).
fn nic_objects(m: &Manager) -> [u64; 4] {
    let mut c = m.raw(&m.admin());
    let r: redn_proto::api::DeviceList = c.call("io.redn.Admin.ListDevices", &(), &[]).unwrap();
    let d = &r.devices[0];
    [d.pd, d.mr, d.cq, d.qp]
}

/// Wait (up to the deadline) until the manager holds `want` NIC objects again.
fn objects_return_to(m: &Manager, want: [u64; 4]) {
    wait_for(&format!("NIC objects never returned to {want:?}"), || {
        nic_objects(m) == want
    });
}

/// A hash-get offload installed by an app on a manager with a data plane, key 0x2a holding
/// "hello" (the app's connection and its table live as long as this).
struct ServedHashGet {
    _app: redn_client::Client,
    _table: redn_client::kv::TwoChoiceTable,
    installed: redn_client::Installed,
    endpoint: String,
    token: [u8; 32],
}

impl ServedHashGet {
    fn install(m: &Manager) -> ServedHashGet {
        let mut app = m.client();
        let mut table = redn_client::kv::TwoChoiceTable::create(64).unwrap();
        let (_, installed) = app.install_table("hash-get", &mut table).unwrap();
        table.set(0x2a, b"hello").unwrap();
        let endpoint = installed.endpoint.clone().unwrap();
        let token = redn_client::remote::parse_token(&installed.token).unwrap();
        ServedHashGet {
            _app: app,
            _table: table,
            installed,
            endpoint,
            token,
        }
    }

    /// A remote client of it, connected (its first instance open).
    fn remote_client(&self) -> redn_client::remote::RemoteClient {
        redn_client::remote::RemoteClient::connect(
            self.endpoint.parse().unwrap(),
            self.installed.handle,
            &self.installed.token,
            redn_client::remote::RemoteOptions { timeout: DEADLINE },
        )
        .unwrap()
    }
}

#[test]
fn a_storm_of_corrupt_hellos_leaks_nothing_and_logs_no_token() {
    use std::io::Read;
    let m = Manager::start_with_dataplane(&policy("", ""));
    let served = ServedHashGet::install(&m);
    let (installed, endpoint, token) = (&served.installed, &served.endpoint, served.token);
    let baseline = nic_objects(&m);
    let hello = redn_proto::dataplane::Hello {
        handle: installed.handle,
        token,
        record: client_record("127.0.0.1"),
    }
    .encode()
    .unwrap();
    // Every byte of a valid hello corrupted in turn (two ways), then cut short at every
    // length: each gets an answer or a close, never a hang or a crash.
    let mut variants: Vec<Vec<u8>> = Vec::new();
    for i in 0..hello.len() {
        for v in [0xff, 0x00] {
            let mut h = hello.clone();
            if h[i] != v {
                h[i] = v;
                variants.push(h);
            }
        }
    }
    for cut in [1, 4, 8, 47, 48, 49, hello.len() - 1] {
        variants.push(hello[..cut].to_vec());
    }
    let mut answered = 0;
    for v in &variants {
        let mut s = std::net::TcpStream::connect(endpoint).unwrap();
        s.set_read_timeout(Some(DEADLINE)).unwrap();
        std::io::Write::write_all(&mut s, v).unwrap();
        // Then the write side closed: a header announcing more than came is answered by
        // the close, not waited for.
        s.shutdown(std::net::Shutdown::Write).unwrap();
        let mut answer = Vec::new();
        match s.read_to_end(&mut answer) {
            Ok(_) => {}
            Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => {}
            Err(e) => panic!("no answer and no close for {v:02x?}: {e}"),
        }
        if answer.starts_with(b"RDNA") {
            answered += 1;
        }
    }
    assert!(answered >= 2 * 48, "only {answered} answers");
    // Still serving, and holding no more than before once the clients are gone.
    let mut client = served.remote_client();
    assert_eq!(client.get(0x2a).unwrap().as_deref(), Some(&b"hello"[..]));
    drop(client);
    objects_return_to(&m, baseline);
    assert!(!m.log().contains(&installed.token), "the token was logged");
}

#[test]
fn a_region_name_cannot_forge_audit_records() {
    // RegisterRegion's name is the client's and goes into the audit trail: quoted, with
    // control characters escaped, it can never start a record or a field of its own.
    let m = open_manager(&[]);
    let mut app = m.client();
    let region = redn_client::SealedRegion::create("r", 4096).unwrap();
    let forged = "x\nredn-manager: event=kill client=1 res=success\" res=success uid=0";
    app.register_fd(region.fd(), forged).unwrap();
    let log = m.log();
    let line = log
        .lines()
        .find(|l| l.contains("event=region-register"))
        .expect("a region-register record");
    assert!(line.ends_with(" res=success"), "{line}");
    assert!(
        line.contains(
            r#"name="x\x0aredn-manager: event=kill client=1 res=success\" res=success uid=0""#
        ),
        "{line}"
    );
    assert!(
        !log.lines()
            .any(|l| l.starts_with("redn-manager: event=kill")),
        "{log}"
    );
}

/// The audit records the manager sent to its syslog socket, in order, until one holds
/// `last` (within the deadline).
fn syslog_records_until(m: &Manager, last: &str) -> Vec<String> {
    let syslog = m.syslog.as_ref().unwrap();
    let mut buf = vec![0u8; 1 << 20];
    let mut records = Vec::new();
    loop {
        let n = recv(syslog, &mut buf).expect("audit records within the deadline");
        let rec = String::from_utf8_lossy(&buf[..n]).into_owned();
        let done = rec.contains(last);
        records.push(rec);
        if done {
            return records;
        }
    }
}

#[test]
fn a_huge_client_string_cannot_push_its_record_out_of_the_audit_trail() {
    // A refused install whose offload name is 400 KB: its record must still reach syslog
    // (a datagram that large cannot be sent at all, and would be dropped).
    let m = open_manager(&[]);
    let mut c = m.raw(&m.api());
    for name in ["y".repeat(400_000), "second-refusal".to_owned()] {
        let params = serde_json::json!({"offload": name, "regions": []});
        let r = c
            .call_raw(
                "io.redn.Manager.InstallOffload",
                params.as_object().unwrap().clone(),
                &[],
            )
            .unwrap_err();
        assert!(format!("{r:?}").contains("offload"), "{r:?}");
    }
    let records = syslog_records_until(&m, "second-refusal");
    let refusals: Vec<&String> = records
        .iter()
        .filter(|r| r.contains("event=offload-refuse"))
        .collect();
    assert_eq!(refusals.len(), 2, "{refusals:?}");
    assert!(refusals[0].len() < 4096, "{} bytes", refusals[0].len());
    assert!(refusals[0].contains("yyyy"), "{}", refusals[0]);
}

#[test]
fn a_closed_stderr_does_not_stop_the_manager() {
    // Every audit record is copied to stderr; a stderr whose reader went away (a log
    // pipe that died, a journal stream lost) must not take the daemon down with it.
    let m = Manager::configure(&policy("", ""));
    let notify = std::os::unix::net::UnixDatagram::bind(m.dir.join("notify")).unwrap();
    notify.set_read_timeout(Some(DEADLINE)).unwrap();
    let _syslog = std::os::unix::net::UnixDatagram::bind(m.dir.join("log.sock")).unwrap();
    let mut child = Command::new(MANAGER)
        .arg("--config")
        .arg(m.config())
        .env("NOTIFY_SOCKET", m.dir.join("notify"))
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut buf = [0u8; 512];
    recv(&notify, &mut buf).expect("READY=1");
    drop(child.stderr.take());
    // Records now go to a pipe nobody reads from.
    for _ in 0..3 {
        let mut app = m.client();
        assert_eq!(app.info().unwrap().app, "tester");
    }
    assert!(child.try_wait().unwrap().is_none(), "the manager exited");
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(i32::try_from(child.id()).unwrap()),
        nix::sys::signal::Signal::SIGTERM,
    )
    .unwrap();
    assert!(child.wait().unwrap().success());
}

#[test]
fn redn_into_a_closed_pipe_exits_without_a_panic() {
    // `redn ... | head`: stdout's reader gone before the first write.
    let (read, write) = nix::unistd::pipe().unwrap();
    drop(read);
    let out = Command::new(env!("CARGO_BIN_EXE_redn"))
        .args(["help"])
        .stdout(Stdio::from(write))
        .stderr(Stdio::piped())
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!stderr.contains("panicked"), "{stderr}");
    assert_ne!(out.status.code(), Some(101), "{stderr}");
}

/// Install hash-get over a fresh table on `app`: `Ok` if admitted, else the refusal.
fn install_one(app: &mut redn_client::Client) -> Result<(), redn_client::ManagerError> {
    let mut table = redn_client::kv::TwoChoiceTable::create(64).unwrap();
    match app.install_table("hash-get", &mut table) {
        Ok(_) => Ok(()),
        Err(e) => Err(refused(e)),
    }
}

#[test]
fn an_apps_quotas_hold_over_all_its_connections() {
    // max_regions, max_pinned and max_queues are the app's. What one connection may
    // install before a QuotaExceeded is all the app gets: more connections at once, or
    // installing, hanging up and coming back (its offloads keep serving), get no more.
    let single = open_manager(&[]);
    let mut app = single.client();
    let mut quota = 0;
    let first_refusal = loop {
        match install_one(&mut app) {
            Ok(()) => quota += 1,
            Err(e) => break e,
        }
        assert!(quota < 100, "never refused");
    };
    assert!(
        matches!(
            first_refusal,
            redn_client::ManagerError::QuotaExceeded { .. }
        ),
        "{first_refusal:?}"
    );
    let m = open_manager(&[]);
    let mut admitted = 0;
    let mut held = Vec::new();
    let mut refusals = Vec::new();
    for round in 0..2 * quota + 2 {
        let mut app = m.client();
        match install_one(&mut app) {
            Ok(()) => admitted += 1,
            Err(e) => refusals.push(e),
        }
        // Half the connections stay open, half hang up at once.
        if round % 2 == 0 {
            held.push(app);
        }
    }
    assert_eq!(admitted, quota, "{refusals:?}");
    assert!(
        refusals
            .iter()
            .all(|e| matches!(e, redn_client::ManagerError::QuotaExceeded { .. })),
        "{refusals:?}"
    );
}

#[test]
fn connections_churned_as_fast_as_possible_cannot_exhaust_the_managers_fds() {
    // Each hang-up of a live process keeps its pidfd a moment (to tell an exit from a
    // close): connections opened and closed in a tight loop must not pile those up past
    // the fd budget. Every answer is a service or a named cap, never a failure of the
    // manager's own (a pidfd it could not open shows as PeerChanged).
    let m = open_manager(&["prlimit", "--nofile=96:96"]);
    let mut attacker = Attacker::start("churn", &m.api());
    let tally = attacker.line();
    for entry in tally.split(' ') {
        let (answer, _) = entry.split_once('=').unwrap();
        assert!(
            answer == "served" || answer == "io.redn.Manager.QuotaExceeded",
            "{tally}\n{}",
            m.log()
                .lines()
                .filter(|l| !l.contains("event=connect") && !l.contains("event=disconnect"))
                .take(20)
                .collect::<Vec<_>>()
                .join("\n")
        );
    }
    assert!(tally.contains("served="), "{tally}");
    attacker.finish();
    assert_eq!(m.client().info().unwrap().app, "tester");
}

#[test]
fn hostile_edits_of_a_shipped_definition_are_refused_naming_the_rule() {
    // An offload definition edited to escape its grants, judged as `redn offload verify`
    // and `--check` judge it: each edit refused, naming the file position or the rule.
    let repo = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let shipped = |name: &str| {
        std::fs::read_to_string(repo.join(format!("etc/redn/offloads.d/{name}.toml"))).unwrap()
    };
    let dir = std::env::temp_dir().join(format!("redn-attacks-defs-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(dir.join("policy.toml"), policy("", "")).unwrap();
    let cas = "op = \"cas\"\nfence = true\nremote = \"wqe:0.r0@0\"\n";
    let edits: &[(&str, &str, &str, &str)] = &[
        // (offload, text, replacement, what the refusal says)
        ("echo", "sq_bbs = 4", "sq_bbs = 4294967295", "is not a power of two"),
        ("echo", "len = 256", "len = 18446744073709551615", "the most a program may keep"),
        ("echo", "count = 8", "count = 4294967295", "index-window"),
        ("echo", "wqes_per_invocation = 3", "wqes_per_invocation = 4294967295", "wqe-budget"),
        ("echo", "static:echo+0\"", "static:echo+18446744073709551615\"", "out-of-region"),
        ("echo", "len = 64 }]", "len = 4294967295 }]", "out-of-region"),
        (
            "hash-get",
            "bytes = [0, 3]\nsource = \"read:0.b0.read\"",
            "bytes = [0, 64]\nsource = \"read:0.b0.read\"",
            "protected-field",
        ),
        (
            "hash-get",
            "bytes = [16, 24]\nsource = \"trigger:bucket0\"",
            "bytes = [16, 72]\nsource = \"trigger:bucket0\"",
            "may rewrite the rkey",
        ),
        (
            "hash-get",
            "bytes = [41, 44]\nsource = \"trigger:key0\"",
            "bytes = [0, 8]\nsource = \"trigger:key0\"",
            "may rewrite the opcode",
        ),
        (
            "hash-get",
            "swap = \"ctrl:0.r0:active:real\"",
            "swap = \"0x0a00000000000008\"",
            "unsafe-swap",
        ),
        (
            "hash-get",
            cas,
            "op = \"cas\"\nfence = true\nremote = \"wqe:0.r0@4\"\n",
            "misaligned",
        ),
        (
            "hash-get",
            cas,
            "op = \"cas\"\nfence = true\nremote = \"wqe:1.r0@0\"\n",
            "undeclared-patch",
        ),
        (
            "hash-get",
            "op = \"cas\"\nfence = true\nremote = \"wqe:0.r0@0\"\ncompare = \"ctrl:0.r0:nop:operand=0x0\"\nswap = \"ctrl:0.r0:active:real\"",
            "op = \"faa\"\nfence = true\nremote = \"wqe:0.r0@0\"\nadd = 1",
            "FETCH_ADD aimed at a WQE",
        ),
    ];
    for (offload, text, edit, says) in edits {
        let original = shipped(offload);
        assert!(original.contains(text), "{offload}: no {text:?} to edit");
        let file = dir.join(format!("{offload}.toml"));
        std::fs::write(&file, original.replacen(text, edit, 1)).unwrap();
        let out = Command::new(env!("CARGO_BIN_EXE_redn"))
            .args(["offload", "verify"])
            .arg(&file)
            .arg("--policy")
            .arg(dir.join("policy.toml"))
            .output()
            .unwrap();
        let text_out = format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        assert_eq!(
            out.status.code(),
            Some(1),
            "{offload} with {edit:?}: {text_out}"
        );
        assert!(
            text_out.contains(says),
            "{offload} with {edit:?}: {text_out}"
        );
    }
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_connection_flooding_calls_gets_its_turn_and_no_more() {
    // One connection's backlog of calls is handled a slice a turn, so a call that arrived
    // after it on another connection is served before the backlog's end, not behind it.
    // With the manager stopped, the attacker queues 1,500 one-way calls and then an
    // install; the admin then asks for the installed offloads; the manager resumes with
    // both waiting. The admin must see no offload: its call came before the backlog's end.
    let m = Manager::start(&policy("", ""), &["--limit", "requests-per-second=1000000"]);
    let mut attacker = m.raw(&m.api());
    let pid = nix::unistd::Pid::from_raw(i32::try_from(m.child.as_ref().unwrap().id()).unwrap());
    nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGSTOP).unwrap();
    let mut backlog = b"{\"method\":\"io.redn.Manager.GetInfo\",\"oneway\":true}\0".repeat(1500);
    backlog.extend_from_slice(
        b"{\"method\":\"io.redn.Manager.InstallOffload\",\
          \"parameters\":{\"offload\":\"echo\",\"regions\":[]}}\0",
    );
    attacker.send_bytes(&backlog, &[]).unwrap();
    let mut admin = m.raw(&m.admin());
    admin
        .send_bytes(b"{\"method\":\"io.redn.Admin.ListOffloads\"}\0", &[])
        .unwrap();
    nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGCONT).unwrap();
    let listed = admin.read_reply().unwrap();
    let installed = attacker.read_reply().unwrap();
    assert!(installed.error.is_none(), "{installed:?}");
    assert_eq!(
        listed.parameters["offloads"].as_array().map(Vec::len),
        Some(0),
        "the admin waited behind the whole backlog: {listed:?}"
    );
}

/// Say a raw hello for offload `handle` (as a client at 127.0.0.1) and return the manager's
/// exchange record from its answer, with the TCP connection that holds the instance.
fn raw_hello(
    endpoint: &str,
    handle: u64,
    token: [u8; 32],
) -> (redn_sys::softnic::roce::QpRecord, std::net::TcpStream) {
    use redn_proto::dataplane::{Answer, Hello, ANSWER_HEADER_LEN};
    use std::io::Read;
    let hello = Hello {
        handle,
        token,
        record: client_record("127.0.0.1"),
    }
    .encode()
    .unwrap();
    let mut s = std::net::TcpStream::connect(endpoint).unwrap();
    s.set_read_timeout(Some(DEADLINE)).unwrap();
    s.write_all(&hello).unwrap();
    let mut header = [0u8; ANSWER_HEADER_LEN];
    s.read_exact(&mut header).unwrap();
    let mut body = vec![0u8; Answer::body_len(&header).unwrap()];
    s.read_exact(&mut body).unwrap();
    match Answer::decode(&header, &body).unwrap() {
        Answer::Accepted(a) => (
            redn_sys::softnic::roce::QpRecord::decode(&a.record).unwrap(),
            s,
        ),
        Answer::Refused(why, text) => panic!("hello refused: {why}: {text}"),
    }
}

#[test]
fn hostile_roce_datagrams_are_dropped_unanswered_counted_and_serving_goes_on() {
    use redn_sys::softnic::roce::packet::{self, opcode, Header, Route};
    let m = Manager::start_with_dataplane(&policy("", ""));
    let served = ServedHashGet::install(&m);
    let (installed, endpoint, token) = (&served.installed, &served.endpoint, served.token);
    let mut client = served.remote_client();
    assert_eq!(client.get(0x2a).unwrap().as_deref(), Some(&b"hello"[..]));
    // A connected QP of the manager's (its peer is 127.0.0.1:4791, which this test is not),
    // and where it listens.
    let (server, _held) = raw_hello(endpoint, installed.handle, token);
    let attacker = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
    let std::net::SocketAddr::V4(from) = attacker.local_addr().unwrap() else {
        unreachable!("bound to an IPv4 address")
    };
    let route = Route {
        src: from,
        dst: server.addr,
    };
    let well_formed = |qpn: u32, psn: u32| {
        let mut d = Vec::new();
        packet::encode(
            &mut d,
            &route,
            &Header::new(opcode::SEND_ONLY, qpn, psn),
            &[0x41; 64],
        );
        d
    };
    let dropped = |m: &Manager| {
        let list: redn_proto::api::DeviceList =
            m.admin_call("io.redn.Admin.ListDevices", serde_json::json!({}));
        list.devices[0].clone()
    };
    // In bursts the socket buffer holds, each counted before the next (on a loaded
    // machine the kernel would drop what a slow receiver has no room for, uncounted).
    let rounds = 200u32;
    for burst in 0..rounds / 20 {
        for i in burst * 20..(burst + 1) * 20 {
            // Every PSN of the connected QP, from a sender that is not its peer.
            attacker
                .send_to(
                    &well_formed(server.qpn, server.psn.wrapping_add(i) & 0xff_ffff),
                    server.addr,
                )
                .unwrap();
            // QPs that do not exist.
            attacker
                .send_to(&well_formed(0x80_0000 | i, i), server.addr)
                .unwrap();
            // A good packet with one bit of its ICRC flipped, and one cut short.
            let mut bad = well_formed(server.qpn, i);
            let last = bad.len() - 1;
            bad[last] ^= 1;
            attacker.send_to(&bad, server.addr).unwrap();
            attacker.send_to(&bad[..7], server.addr).unwrap();
        }
        let want = u64::from(4 * 20 * (burst + 1));
        wait_for("the manager never counted the hostile datagrams", || {
            dropped(&m).packets_dropped >= want
        });
    }
    let dev = dropped(&m);
    for (reason, at_least) in [
        ("wrong_source", rounds),
        ("unknown_qp", rounds),
        ("bad_icrc", rounds),
        ("truncated", rounds),
    ] {
        let n = dev.packet_drops.get(reason).copied().unwrap_or(0);
        assert!(
            n >= u64::from(at_least),
            "{reason}: {n} drops, {:?}",
            dev.packet_drops
        );
    }
    assert_eq!(dev.packets_dropped, dev.packet_drops.values().sum::<u64>());
    // Nothing came back: no NAK, no ACK, nothing that says which QPs exist.
    attacker.set_nonblocking(true).unwrap();
    let mut buf = [0u8; 2048];
    match attacker.recv_from(&mut buf) {
        Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
        other => panic!("the manager answered a hostile datagram: {other:?}"),
    }
    // The client is served as before, and the flood is in the counters an operator reads.
    assert_eq!(client.get(0x2a).unwrap().as_deref(), Some(&b"hello"[..]));
    let admin = m.admin().display().to_string();
    let out = stdout_of(
        Command::new(env!("CARGO_BIN_EXE_redn")).args(["-s", &admin, "-j", "-d", "dev", "show"]),
    );
    let rows: serde_json::Value = serde_json::from_str(&out).unwrap();
    let drops = rows[0]["packet_drops"].as_str().unwrap_or_default();
    assert!(
        drops.contains("wrong_source=") && drops.contains("unknown_qp="),
        "{out}"
    );
}
