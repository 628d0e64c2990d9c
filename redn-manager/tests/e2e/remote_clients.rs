//! The data plane: remote clients over RoCEv2, their hellos, tokens, sources and limits,
//! and the GETs and triggers they send while the app's process does nothing.

use super::*;

/// What the `kv-serve` app SETs.
pub(super) const KV_DATA: [(u64, &str); 3] =
    [(0x2a, "hello"), (0x2b, "world"), (0x2c, "from the app")];

/// Handle, token and data-plane endpoint from an app's "handle=.. token=.. endpoint=.." line.
fn installed_line(lines: &[String]) -> (u64, String, String) {
    let line = lines
        .iter()
        .find(|l| l.starts_with("handle="))
        .expect("the app printed its handle");
    let field = |name: &str| {
        line.split(' ')
            .find_map(|f| f.strip_prefix(name))
            .unwrap_or_else(|| panic!("no {name} in {line}"))
            .to_owned()
    };
    let endpoint = field("endpoint=");
    let endpoint = endpoint
        .trim_start_matches("Some(\"")
        .trim_end_matches("\")")
        .to_owned();
    (field("handle=").parse().unwrap(), field("token="), endpoint)
}

/// The body of the `remote-get` process: GET each key of REDN_E2E_KEYS (hex, commas) from
/// the data plane at REDN_E2E_DATAPLANE, printing "APP get KEY hit VALUE" or "... miss".
pub(super) fn remote_get_process() {
    let var = |n: &str| std::env::var(n).unwrap();
    let mut c = remote(
        &var("REDN_E2E_DATAPLANE"),
        var("REDN_E2E_HANDLE").parse().unwrap(),
        &var("REDN_E2E_TOKEN"),
    )
    .unwrap();
    for key in var("REDN_E2E_KEYS").split(',') {
        let k = u64::from_str_radix(key, 16).unwrap();
        match c.get(k).unwrap() {
            Some(v) => println!("APP get {k:#x} hit {}", String::from_utf8(v).unwrap()),
            None => println!("APP get {k:#x} miss"),
        }
    }
    println!("APP sessions {}", c.sessions_opened());
    println!("APP triggers {}", c.triggers_sent());
}

pub(super) fn remote(
    endpoint: &str,
    handle: u64,
    token: &str,
) -> Result<RemoteClient, ClientError> {
    remote_within(endpoint, handle, token, DEADLINE)
}

/// A remote client that waits at most `timeout` for anything.
pub(super) fn remote_within(
    endpoint: &str,
    handle: u64,
    token: &str,
    timeout: Duration,
) -> Result<RemoteClient, ClientError> {
    let options = RemoteOptions {
        timeout,
        ..Default::default()
    };
    RemoteClient::connect(endpoint.parse().unwrap(), handle, token, options)
}

fn signal(child: &Child, sig: nix::sys::signal::Signal) {
    let pid = nix::unistd::Pid::from_raw(i32::try_from(child.id()).unwrap());
    nix::sys::signal::kill(pid, sig).unwrap();
}

/// The app's CPU time so far (utime + stime, in clock ticks) from /proc.
fn cpu_ticks(pid: u32) -> u64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap();
    // Fields after the command name (which may hold spaces) start at its closing ')'.
    let rest = &stat[stat.rfind(')').unwrap() + 2..];
    let f: Vec<&str> = rest.split(' ').collect();
    f[11].parse::<u64>().unwrap() + f[12].parse::<u64>().unwrap()
}

#[test]
fn remote_gets_are_served_while_the_app_is_stopped() {
    let m = Manager::start_with_dataplane(&policy("", ""));
    let mut app = app_command("kv-serve", &m.api())
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut out = BufReader::new(app.stdout.take().unwrap());
    let mut lines = Vec::new();
    while !lines.iter().any(|l: &String| l.starts_with("handle=")) {
        let mut line = String::new();
        assert!(out.read_line(&mut line).unwrap() > 0, "the app exited");
        lines.extend(app_lines(&line));
    }
    let (handle, token, endpoint) = installed_line(&lines);
    assert!(endpoint.starts_with("127.0.0.1:"), "{endpoint}");
    // The app sleeps for good: every GET below is the NIC's work.
    signal(&app, nix::sys::signal::Signal::SIGSTOP);
    let ticks = cpu_ticks(app.id());
    let keys = "2a,2b,99,2c,2a,1234,2b";
    let got = app_lines(&stdout_of(
        app_command("remote-get", &m.api())
            .env("REDN_E2E_DATAPLANE", &endpoint)
            .env("REDN_E2E_HANDLE", handle.to_string())
            .env("REDN_E2E_TOKEN", &token)
            .env("REDN_E2E_KEYS", keys),
    ));
    let want: Vec<String> = keys
        .split(',')
        .map(|k| {
            let k = u64::from_str_radix(k, 16).unwrap();
            match KV_DATA.iter().find(|(key, _)| *key == k) {
                Some((_, v)) => format!("get {k:#x} hit {v}"),
                None => format!("get {k:#x} miss"),
            }
        })
        .collect();
    assert_eq!(&got[..want.len()], &want[..], "{}", m.log());
    // hash-get serves 4 triggers per instance: 9 triggers took a fresh instance thrice.
    let triggers: u64 = got[want.len() + 1]
        .strip_prefix("triggers ")
        .unwrap()
        .parse()
        .unwrap();
    // hash-get serves 4 triggers per instance; each instance used up took a fresh one.
    assert!(triggers >= 7, "{got:?}");
    assert_eq!(
        got[want.len()],
        format!("sessions {}", triggers.div_ceil(4))
    );
    assert_eq!(cpu_ticks(app.id()), ticks, "the stopped app ran");
    signal(&app, nix::sys::signal::Signal::SIGCONT);
    drop(app.stdin.take());
    let mut rest = String::new();
    out.read_to_string(&mut rest).unwrap();
    assert!(app.wait().unwrap().success());
    // The app's Stats count what its remote clients' instances served.
    assert_eq!(
        app_lines(&rest),
        vec![format!("stats triggers={triggers} errors=0")]
    );
    let log = m.log();
    assert!(log.contains("event=remote-connect"), "{log}");
    assert!(log.contains("event=remote-exit"), "{log}");
}

/// An app that installed hash-get over a table holding KV_DATA[0] and exited (its offload
/// keeps serving); its handle, token and endpoint.
fn kv_app_left_serving(m: &Manager) -> (u64, String, String) {
    installed_line(&app_process("kv", &m.api()))
}

#[test]
fn a_remote_client_with_a_wrong_token_is_refused() {
    let m = Manager::start_with_dataplane(&policy("", ""));
    let (handle, token, endpoint) = kv_app_left_serving(&m);
    let mut wrong = token.clone().into_bytes();
    wrong[0] = if wrong[0] == b'0' { b'1' } else { b'0' };
    let wrong = String::from_utf8(wrong).unwrap();
    for (h, t) in [(handle, wrong.as_str()), (handle + 100, token.as_str())] {
        match remote(&endpoint, h, t) {
            Err(ClientError::RemoteRefused { refusal, reason }) => {
                assert_eq!(refusal, Refusal::AccessDenied, "{reason}");
            }
            other => panic!("expected AccessDenied, got {other:?}"),
        }
    }
    // A hello that is not one: a named error, and the connection is closed.
    let mut raw = std::net::TcpStream::connect(&endpoint).unwrap();
    raw.set_read_timeout(Some(DEADLINE)).unwrap();
    std::io::Write::write_all(&mut raw, &[b'X'; 64]).unwrap();
    let mut header = [0u8; dataplane::ANSWER_HEADER_LEN];
    raw.read_exact(&mut header).unwrap();
    let mut body = vec![0u8; dataplane::Answer::body_len(&header).unwrap()];
    raw.read_exact(&mut body).unwrap();
    match dataplane::Answer::decode(&header, &body).unwrap() {
        dataplane::Answer::Refused(Refusal::InvalidHello, reason) => {
            assert!(reason.starts_with("magic"), "{reason}");
        }
        other => panic!("expected InvalidHello, got {other:?}"),
    }
    // The daemon goes on serving the right token.
    let mut c = remote(&endpoint, handle, &token).unwrap();
    assert_eq!(c.get(0x2a).unwrap().as_deref(), Some(&b"hello"[..]));
    assert!(
        m.log().contains("event=remote-connect peer=127.0.0.1:")
            && m.log().contains(" error=AccessDenied "),
        "{}",
        m.log()
    );
}

#[test]
fn a_bad_request_kills_only_its_own_queues() {
    let m = Manager::start_with_dataplane(&policy("", ""));
    let (handle, token, endpoint) = kv_app_left_serving(&m);
    let mut good = remote(&endpoint, handle, &token).unwrap();
    // What the bad client waits for never comes: it need not wait long.
    let mut bad = remote_within(&endpoint, handle, &token, Duration::from_secs(1)).unwrap();
    assert_eq!(good.get(0x2a).unwrap().as_deref(), Some(&b"hello"[..]));
    // A bucket address past the table: the offload's READ of it is refused by its narrow
    // key, the bad client's instance stops, and no answer comes.
    let table = bad
        .session()
        .unwrap()
        .manager
        .region("table")
        .unwrap()
        .clone();
    let mut msg = redn_program::program::catalog::trigger_key(0x2a).to_vec();
    msg.extend((table.addr + table.len + (1 << 20)).to_be_bytes());
    match bad.trigger(&msg, 1) {
        Err(ClientError::Timeout { .. } | ClientError::ResponseFailed { .. }) => {}
        other => panic!("a bad request was answered: {other:?}"),
    }
    // The other client's queues are untouched: it goes on getting correct answers, over
    // more triggers than one instance serves.
    for _ in 0..3 {
        assert_eq!(good.get(0x2a).unwrap().as_deref(), Some(&b"hello"[..]));
        assert_eq!(good.get(0x77).unwrap(), None);
    }
    let list: api::InstalledList =
        m.admin_call("io.redn.Admin.ListOffloads", serde_json::json!({}));
    assert!(list.offloads[0].errors > 0, "{list:?}");
    // The bad client itself starts over with a fresh instance.
    assert_eq!(bad.get(0x2a).unwrap().as_deref(), Some(&b"hello"[..]));
    assert_eq!(bad.sessions_opened(), 2);
}

#[test]
fn remote_clients_past_the_apps_limit_are_refused() {
    let one = policy("", "").replace("max_remote_clients = 4", "max_remote_clients = 1");
    let m = Manager::start_with_dataplane(&one);
    let (handle, token, endpoint) = kv_app_left_serving(&m);
    let first = remote(&endpoint, handle, &token).unwrap();
    match remote(&endpoint, handle, &token) {
        Err(ClientError::RemoteRefused { refusal, reason }) => {
            assert_eq!(refusal, Refusal::TooManyClients, "{reason}");
            assert!(reason.contains("max_remote_clients is 1"), "{reason}");
        }
        other => panic!("expected TooManyClients, got {other:?}"),
    }
    drop(first);
    // Its place is free once the manager has seen it go.
    let deadline = Instant::now() + DEADLINE;
    let mut second = loop {
        match remote(&endpoint, handle, &token) {
            Ok(c) => break c,
            Err(ClientError::RemoteRefused {
                refusal: Refusal::TooManyClients,
                ..
            }) if Instant::now() < deadline => std::thread::yield_now(),
            Err(e) => panic!("{e}"),
        }
    };
    assert_eq!(second.get(0x2a).unwrap().as_deref(), Some(&b"hello"[..]));
}

/// A client that asks to wait for ever (`Duration::MAX`, past what the clock can count) is
/// served as any other. Before, its first GET overflowed `Instant` and panicked.
#[test]
fn a_remote_client_that_waits_for_ever_is_served() {
    let m = Manager::start_with_dataplane(&policy("", ""));
    let (handle, token, endpoint) = kv_app_left_serving(&m);
    let mut c = remote_within(&endpoint, handle, &token, Duration::MAX).unwrap();
    assert_eq!(c.get(0x2a).unwrap().as_deref(), Some(&b"hello"[..]));
    assert_eq!(c.get(0x99).unwrap(), None);
}

#[test]
fn a_new_remote_client_at_the_apps_limit_takes_the_slot_of_the_one_idle_longest() {
    // Clients that say hello and then stay silent must not hold an app's slots for as
    // long as they keep their connections: past `evict_idle_after`, a newcomer takes the
    // place of the one idle longest, never that of a client still sending requests.
    let two = policy("", "evict_idle_after = \"1s\"")
        .replace("max_remote_clients = 4", "max_remote_clients = 2");
    let m = Manager::start_with_dataplane(&two);
    let (handle, token, endpoint) = kv_app_left_serving(&m);
    let connect = || remote(&endpoint, handle, &token);
    let mut busy = connect().unwrap(); // connected first
    let mut silent = connect().unwrap();
    match connect() {
        Err(ClientError::RemoteRefused { refusal, reason }) => {
            assert_eq!(refusal, Refusal::TooManyClients, "{reason}");
            assert!(reason.contains("none of them idle for 1s"), "{reason}");
        }
        other => panic!("expected TooManyClients, got {other:?}"),
    }
    let get = |c: &mut RemoteClient| c.get(0x2a).unwrap();
    let busy_for = |c: &mut RemoteClient, span: Duration| {
        let until = Instant::now() + span;
        while Instant::now() < until {
            assert_eq!(get(c).as_deref(), Some(&b"hello"[..]));
            std::thread::sleep(Duration::from_millis(50));
        }
    };
    busy_for(&mut busy, Duration::from_millis(1500));
    let mut newcomer = connect().unwrap();
    let newcomer_instance = *instances(&m.log(), "event=remote-connect", "res=success")
        .last()
        .unwrap();
    assert_eq!(get(&mut newcomer).as_deref(), Some(&b"hello"[..]));
    // Exactly one client made room, and it was the silent one (the second admitted), not
    // the busy one connected before it.
    let log = m.log();
    let admitted = instances(&log, "event=remote-connect", "res=success");
    let evicted = instances(&log, "event=remote-exit", "its slot taken by a new client");
    assert_eq!(evicted, [admitted[1]], "{log}");
    // The silent client's next GET finds its session gone and opens another, in the place
    // of the newcomer, now the one idle longest (over 1s).
    busy_for(&mut busy, Duration::from_millis(1200));
    let opened = silent.sessions_opened();
    assert_eq!(get(&mut silent).as_deref(), Some(&b"hello"[..]));
    assert_eq!(silent.sessions_opened(), opened + 1);
    let log = m.log();
    let evicted = instances(&log, "event=remote-exit", "its slot taken by a new client");
    assert_eq!(evicted.len(), 2, "{log}");
    assert_eq!(evicted[1], newcomer_instance, "{log}");
}

/// The `instance=` of each line of `log` that contains both `a` and `b`, in order.
fn instances(log: &str, a: &str, b: &str) -> Vec<u64> {
    log.lines()
        .filter(|l| l.contains(a) && l.contains(b))
        .filter_map(|l| {
            let v = l.split(' ').find_map(|f| f.strip_prefix("instance="))?;
            v.parse().ok()
        })
        .collect()
}

#[test]
fn an_uninstall_takes_its_remote_clients_instances_with_it() {
    let m = Manager::start_with_dataplane(&policy("", ""));
    let mut app = m.client();
    let (mut table, installed) = kv_install(&mut app);
    table.set(0x2a, b"hello").unwrap();
    let endpoint = installed.endpoint.clone().expect("an endpoint");
    let (handle, token) = (installed.handle, &installed.token);
    let mut c = remote_within(&endpoint, handle, token, Duration::from_secs(1)).unwrap();
    assert_eq!(c.get(0x2a).unwrap().as_deref(), Some(&b"hello"[..]));
    app.uninstall(installed.handle).unwrap();
    // Its instance is gone: no answer on it, and no new one for that handle.
    let deadline = Instant::now() + DEADLINE;
    loop {
        match c.get(0x2a) {
            Err(ClientError::RemoteRefused { refusal, .. }) => {
                assert_eq!(refusal, Refusal::AccessDenied);
                break;
            }
            // The session's queue pair times out or its SEND finds no peer.
            Err(ClientError::Timeout { .. } | ClientError::ResponseFailed { .. })
                if Instant::now() < deadline => {}
            other => panic!("served after the uninstall: {other:?}"),
        }
    }
    assert!(
        m.log().contains("reason=\"offload uninstalled\""),
        "{}",
        m.log()
    );
}

#[test]
fn find_and_raw_triggers_through_the_data_plane() {
    let m = Manager::start_with_dataplane(
        &policy("", "").replace("\"echo\"]", "\"echo\", \"list-find\"]"),
    );
    let mut app = m.client();
    // Three nodes 64 bytes apart, values from 4 KiB; the last node points at itself.
    let region = redn_client::SealedRegion::create("list", 8192).unwrap();
    let reg = app.register_region(&region, "list").unwrap();
    for i in 0..3u64 {
        let value = format!("node-{i}");
        let value_at = 4096 + 64 * i;
        region.write_at(value_at, value.as_bytes()).unwrap();
        let node = redn_program::program::catalog::node_bytes(
            0x7000 + i,
            u32::try_from(value.len()).unwrap(),
            reg.addr + value_at,
            reg.addr + 64 * (i + 1).min(2),
        );
        region.write_at(64 * i, &node).unwrap();
    }
    let list = app
        .install(
            "list-find",
            &[
                ("list", reg.region, 0, 4096),
                ("values", reg.region, 4096, 4096),
            ],
        )
        .unwrap();
    let endpoint = list.endpoint.clone().expect("an endpoint");
    let mut finder = remote(&endpoint, list.handle, &list.token).unwrap();
    for i in [1u64, 0, 2] {
        let want = format!("node-{i}");
        assert_eq!(
            finder.find(0x7000 + i).unwrap().as_deref(),
            Some(want.as_bytes())
        );
    }
    assert_eq!(finder.find(0x7abc).unwrap(), None);
    assert!(matches!(
        finder.get(0x7001),
        Err(ClientError::Unsupported { .. })
    ));
    // Any other offload takes raw triggers in its own format: echo sends them back.
    let echo = app.install("echo", &[]).unwrap();
    let mut echoer = remote(&endpoint, echo.handle, &echo.token).unwrap();
    let payload: Vec<u8> = (0..64).collect();
    let got = echoer.trigger(&payload, 1).unwrap();
    assert_eq!(got[0].data, payload);
    assert!(matches!(
        echoer.trigger(&payload[..10], 1),
        Err(ClientError::TriggerLength { got: 10, want: 64 })
    ));
}

#[test]
fn remote_clients_from_outside_the_apps_sources_are_refused() {
    let m = Manager::start_with_dataplane(&policy(
        "remote_sources = [\"192.0.2.0/24\", \"2001:db8::/32\"]",
        "",
    ));
    let (handle, token, endpoint) = kv_app_left_serving(&m);
    match remote(&endpoint, handle, &token) {
        Err(ClientError::RemoteRefused { refusal, reason }) => {
            assert_eq!(refusal, Refusal::SourceNotAllowed, "{reason}");
            assert!(reason.contains("127.0.0.1"), "{reason}");
        }
        other => panic!("expected SourceNotAllowed, got {other:?}"),
    }
    // A wrong token is refused as such, not for its source: nothing about the app leaks.
    let wrong = "ab".repeat(32);
    assert!(matches!(
        remote(&endpoint, handle, &wrong),
        Err(ClientError::RemoteRefused {
            refusal: Refusal::AccessDenied,
            ..
        })
    ));
}

#[test]
fn an_expired_token_admits_no_new_remote_client() {
    let short = policy("", "token_lifetime = \"1s\"");
    let m = Manager::start_with_dataplane(&short);
    let (handle, token, endpoint) = kv_app_left_serving(&m);
    let deadline = Instant::now() + DEADLINE;
    loop {
        match remote(&endpoint, handle, &token) {
            Err(ClientError::RemoteRefused {
                refusal: Refusal::AccessDenied,
                ..
            }) => break,
            Ok(_) if Instant::now() < deadline => std::thread::yield_now(),
            other => panic!("expected the token to expire, got {other:?}"),
        }
    }
    // The lifetime is the policy's: with a longer one the same token is valid again.
    std::fs::write(m.dir.join("policy.toml"), policy("", "")).unwrap();
    let _: api::Reloaded = m.admin_call("io.redn.Admin.ReloadPolicy", serde_json::json!({}));
    let mut c = remote(&endpoint, handle, &token).unwrap();
    assert_eq!(c.get(0x2a).unwrap().as_deref(), Some(&b"hello"[..]));
}

/// Send `hello` on a fresh connection to the data plane; the manager's answer.
fn raw_hello(endpoint: &str, hello: &dataplane::Hello) -> dataplane::Answer {
    say_hello(std::net::TcpStream::connect(endpoint).unwrap(), hello).1
}

/// Send `hello` on `raw`; the connection, still open, and the manager's answer.
pub(super) fn say_hello(
    mut raw: std::net::TcpStream,
    hello: &dataplane::Hello,
) -> (std::net::TcpStream, dataplane::Answer) {
    raw.set_read_timeout(Some(DEADLINE)).unwrap();
    std::io::Write::write_all(&mut raw, &hello.encode().unwrap()).unwrap();
    let mut header = [0u8; dataplane::ANSWER_HEADER_LEN];
    raw.read_exact(&mut header).unwrap();
    let mut body = vec![0u8; dataplane::Answer::body_len(&header).unwrap()];
    raw.read_exact(&mut body).unwrap();
    let answer = dataplane::Answer::decode(&header, &body).unwrap();
    (raw, answer)
}

#[test]
fn hello_records_are_checked_and_half_open_connections_capped() {
    use redn_sys::softnic::roce::{QpRecord, RegionRecord};
    let m = Manager::start_with_dataplane(&policy("", ""));
    let (handle, token_hex, endpoint) = kv_app_left_serving(&m);
    let token = redn_client::remote::parse_token(&token_hex).unwrap();
    let response = RegionRecord {
        name: "response".into(),
        addr: 0x10_0000,
        rkey: 7,
        len: 4096,
        rights: 2,
    };
    let hello = |addr: &str, regions: Vec<RegionRecord>| {
        let mut r = QpRecord::new(0x42, 1, addr.parse().unwrap());
        r.regions = regions;
        dataplane::Hello {
            handle,
            token,
            record: r.encode().unwrap(),
        }
    };
    let refused = |answer: dataplane::Answer, why: &str| match answer {
        dataplane::Answer::Refused(Refusal::InvalidHello, reason) => {
            assert!(reason.contains(why), "{reason}");
        }
        other => panic!("expected InvalidHello ({why}), got {other:?}"),
    };
    // RoCE traffic may go only to the host the hello came from.
    refused(
        raw_hello(&endpoint, &hello("192.0.2.1:4791", vec![response.clone()])),
        "not the address the hello came from",
    );
    refused(
        raw_hello(&endpoint, &hello("127.0.0.1:4791", vec![])),
        "no region named \"response\"",
    );
    let mut read_only = response.clone();
    read_only.rights = 1;
    refused(
        raw_hello(&endpoint, &hello("127.0.0.1:4791", vec![read_only])),
        "needs that many and WRITE",
    );
    // Nor to the manager's own RoCE endpoint (a local client can name its port): learnt
    // from an accepted hello's record, whose session ends with its connection.
    let (session, answer) = say_hello(
        std::net::TcpStream::connect(&endpoint).unwrap(),
        &hello("127.0.0.1:4791", vec![response.clone()]),
    );
    let dataplane::Answer::Accepted(accepted) = answer else {
        panic!("a good hello was refused: {answer:?}")
    };
    let own = QpRecord::decode(&accepted.record).unwrap().addr;
    drop(session);
    refused(
        raw_hello(&endpoint, &hello(&own.to_string(), vec![response.clone()])),
        "this manager's own RoCE endpoint",
    );
    // Connections that never finish a hello: past 64, the oldest goes.
    let mut idle: Vec<std::net::TcpStream> = (0..65)
        .map(|_| std::net::TcpStream::connect(&endpoint).unwrap())
        .collect();
    // Once the manager has seen the last, it has closed the first.
    let mut client = remote(&endpoint, handle, &token_hex).unwrap();
    idle[0].set_read_timeout(Some(DEADLINE)).unwrap();
    let mut byte = [0u8; 1];
    assert_eq!(idle[0].read(&mut byte).unwrap(), 0, "the oldest was closed");
    assert_eq!(client.get(0x2a).unwrap().as_deref(), Some(&b"hello"[..]));
}
