//! The varlink sockets: file descriptors, memory, buffers, floods, churn, quotas, malformed
//! calls and passed fds, each against a manager that must go on serving everyone else.

use super::*;

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
    stopped(pid);
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

#[test]
fn a_uid_spreading_a_backlog_over_many_connections_gets_four_slices_a_turn() {
    // Each connection has its slice of a turn (64 messages), and its uid's connections
    // together four slices: a uid that spreads its backlog over many connections does not
    // get a slice for each ahead of everyone else's next turn. With the manager stopped,
    // 16 connections of the app's uid each queue turns of 63 one-way calls and an
    // install (one install a slice), then the admin asks for the installed offloads; the
    // manager resumes with all waiting, the admin's request readied last. The admin must
    // see at most the four installs of the uid's four slices, not sixteen.
    const CONNECTIONS: usize = 16;
    let policy = policy("", "").replace("max_queues = 16", "max_queues = 1024");
    let m = Manager::start(&policy, &["--limit", "requests-per-second=1000000"]);
    let mut conns: Vec<Connection> = (0..CONNECTIONS).map(|_| m.raw(&m.api())).collect();
    let mut admin = m.raw(&m.admin());
    // Each accepted and registered before the stop, in this order.
    for c in &mut conns {
        let _: serde_json::Value = c.call("io.redn.Manager.GetInfo", &(), &[]).unwrap();
    }
    let _: serde_json::Value = admin.call("io.redn.Admin.ListOffloads", &(), &[]).unwrap();
    let pid = nix::unistd::Pid::from_raw(i32::try_from(m.child.as_ref().unwrap().id()).unwrap());
    nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGSTOP).unwrap();
    stopped(pid);
    let mut slice = b"{\"method\":\"io.redn.Manager.GetInfo\",\"oneway\":true}\0".repeat(63);
    slice.extend_from_slice(
        b"{\"method\":\"io.redn.Manager.InstallOffload\",\"oneway\":true,\
          \"parameters\":{\"offload\":\"echo\",\"regions\":[]}}\0",
    );
    let backlog = slice.repeat(2);
    for c in &mut conns {
        c.send_bytes(&backlog, &[]).unwrap();
    }
    admin
        .send_bytes(b"{\"method\":\"io.redn.Admin.ListOffloads\"}\0", &[])
        .unwrap();
    nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGCONT).unwrap();
    let listed = admin.read_reply().unwrap();
    let installed = listed.parameters["offloads"].as_array().map(Vec::len);
    assert!(
        installed.is_some_and(|n| n <= 4),
        "the admin waited behind more than four of the uid's slices: {installed:?} installs \
         before it"
    );
    // The backlogs are all served in the end: every install took place.
    let deadline = std::time::Instant::now() + DEADLINE;
    loop {
        let r: redn_proto::api::InstalledList = m
            .raw(&m.admin())
            .call("io.redn.Admin.ListOffloads", &(), &[])
            .unwrap();
        if r.offloads.len() == 2 * CONNECTIONS {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "{} of {} installs",
            r.offloads.len(),
            2 * CONNECTIONS
        );
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
}

#[test]
fn a_connection_left_in_the_backlog_by_a_failed_accept_is_taken_once_fds_free_up() {
    // The listener is edge-triggered: a connection the manager could not accept (no fd
    // free) raised its one edge already. Once fds free up it must still be taken, without
    // waiting for another connection to arrive.
    let m = open_manager(&[]);
    let (starved, mut waiting) =
        FdStarvation::connect_while_starved(&m, "accept: Too many open files", || {
            Connection::connect(&m.api(), DEADLINE).unwrap()
        });
    starved.end();
    // Nothing else connects: the waiting connection alone must be served.
    waiting
        .send_bytes(b"{\"method\":\"io.redn.Manager.GetInfo\"}\0", &[])
        .unwrap();
    let reply = waiting.read_reply().unwrap();
    assert_eq!(reply.error, None, "{reply:?}");
    assert_eq!(reply.parameters["app"], "tester", "{reply:?}");
    // The stall was said once, not at every retry (nor for an earlier round, whose
    // connection the manager accepted and served).
    let said = m.log().matches("accept: Too many open files").count();
    assert_eq!(said, 1, "{}", m.log());
}
