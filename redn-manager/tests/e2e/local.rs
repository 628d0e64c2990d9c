//! The varlink API on the manager's unix sockets: admission, refusals, malformed input,
//! caps and quotas, configuration and policy reloads, socket handling, audit records.

use super::*;

#[test]
fn an_app_is_admitted_and_its_offload_outlives_its_connection() {
    let m = Manager::start(&policy("", ""), &[]);
    let lines = app_process("kv", &m.api());
    let line = lines
        .iter()
        .find(|l| l.starts_with("handle="))
        .expect("the app printed its handle");
    let handle: u64 = line["handle=".len()..]
        .split(' ')
        .next()
        .unwrap()
        .parse()
        .unwrap();
    let token = line
        .split("token=")
        .nth(1)
        .unwrap()
        .split(' ')
        .next()
        .unwrap();
    assert_eq!(token.len(), 64);
    assert!(token.bytes().all(|b| b.is_ascii_hexdigit()));
    assert!(line.ends_with("endpoint=None"), "{line}");
    // The app has exited; its offload still serves (keep_serving_after_exit defaults to true).
    let list: api::InstalledList =
        m.admin_call("io.redn.Admin.ListOffloads", serde_json::json!({}));
    assert_eq!(list.offloads.len(), 1);
    let o = &list.offloads[0];
    assert_eq!(
        (o.handle, o.offload.as_str(), o.app.as_str()),
        (handle, "hash-get", "tester")
    );
    assert!(o.keys > 0 && o.queues > 0);
    let clients: api::ClientList = m.admin_call("io.redn.Admin.ListClients", serde_json::json!({}));
    assert_eq!(clients.clients.len(), 1);
    assert!(!clients.clients[0].connected);
    let dump: api::DumpReply = m.admin_call(
        "io.redn.Admin.Dump",
        serde_json::json!({ "handle": handle }),
    );
    assert!(
        dump.listing.starts_with("offload hash-get"),
        "{}",
        dump.listing
    );
    assert!(!dump.wqes.is_empty());
    let killed: api::Killed = m.admin_call(
        "io.redn.Admin.KillClient",
        serde_json::json!({ "client": clients.clients[0].id }),
    );
    assert_eq!(killed.uninstalled, 1);
    let list: api::InstalledList =
        m.admin_call("io.redn.Admin.ListOffloads", serde_json::json!({}));
    assert!(list.offloads.is_empty());
}

#[test]
fn an_offload_goes_with_its_app_when_policy_says_so() {
    let m = Manager::start(&policy("keep_serving_after_exit = false", ""), &[]);
    app_process("kv", &m.api());
    // The manager handles the app's hang-up before this later connection's call.
    let list: api::InstalledList =
        m.admin_call("io.redn.Admin.ListOffloads", serde_json::json!({}));
    assert!(list.offloads.is_empty(), "{list:?}");
}

#[test]
fn install_uninstall_and_stats_through_the_client_library() {
    let m = Manager::start(&policy("", ""), &[]);
    let mut c = m.client();
    let info = c.info().unwrap();
    assert_eq!(
        (info.app.as_str(), info.backend.as_str(), info.uid),
        ("tester", "softnic", uid())
    );
    let names: Vec<String> = c.offloads().unwrap().into_iter().map(|o| o.name).collect();
    assert_eq!(names, ["hash-get", "echo"]);
    let (_table, installed) = kv_install(&mut c);
    let stats = c.stats().unwrap();
    assert_eq!(stats.len(), 1);
    assert_eq!(
        (stats[0].handle, stats[0].offload.as_str(), stats[0].errors),
        (installed.handle, "hash-get", 0)
    );
    c.uninstall(installed.handle).unwrap();
    assert!(c.stats().unwrap().is_empty());
    let again = refused(c.uninstall(installed.handle).unwrap_err());
    assert_eq!(
        again,
        ManagerError::NoSuchHandle {
            handle: installed.handle
        }
    );
}

#[test]
fn refusals_are_named_errors_and_the_connection_goes_on() {
    let m = Manager::start(
        &policy("", "").replace("max_regions = 4", "max_regions = 2"),
        &[],
    );
    let mut c = m.client();
    // Policy: an offload this app may not install.
    let table = TwoChoiceTable::create(8).unwrap();
    let r = c.register_region(table.region(), "t").unwrap();
    let e = refused(
        c.install(
            "list-find",
            &[("list", r.region, 0, 4096), ("values", r.region, 0, 4096)],
        )
        .unwrap_err(),
    );
    assert!(
        matches!(e, ManagerError::PolicyDenied { ref reason } if reason.contains("list-find")),
        "{e:?}"
    );
    // Unknown offload.
    let e = refused(c.install("no-such", &[]).unwrap_err());
    assert_eq!(
        e,
        ManagerError::NoSuchOffload {
            offload: "no-such".into()
        }
    );
    // A binding outside its region.
    let e = refused(
        c.install(
            "hash-get",
            &[("table", r.region, 0, 1 << 30), ("values", r.region, 0, 64)],
        )
        .unwrap_err(),
    );
    assert!(
        matches!(e, ManagerError::InvalidParameter { ref parameter, .. } if parameter == "regions[table]"),
        "{e:?}"
    );
    // An unsealed memfd.
    let raw = nix::sys::memfd::memfd_create("plain", nix::sys::memfd::MFdFlags::MFD_ALLOW_SEALING)
        .unwrap();
    nix::unistd::ftruncate(&raw, 4096).unwrap();
    let e = refused(c.register_fd(raw.as_fd(), "plain").unwrap_err());
    assert_eq!(
        e,
        ManagerError::NotSealed {
            kind: "memfd".into(),
            seals: 0,
            required: 6
        }
    );
    // A pipe.
    let (rd, _wr) = nix::unistd::pipe().unwrap();
    let e = refused(c.register_fd(rd.as_fd(), "pipe").unwrap_err());
    assert!(
        matches!(e, ManagerError::NotSealed { ref kind, .. } if kind == "pipe"),
        "{e:?}"
    );
    // Quota: a second region is allowed, a third is not.
    let t2 = TwoChoiceTable::create(8).unwrap();
    c.register_region(t2.region(), "second").unwrap();
    let t3 = TwoChoiceTable::create(8).unwrap();
    let e = refused(c.register_region(t3.region(), "third").unwrap_err());
    assert_eq!(
        e,
        ManagerError::QuotaExceeded {
            resource: "regions".into(),
            limit: 2,
            requested: 3
        }
    );
    // The same connection still works.
    assert_eq!(c.info().unwrap().regions, 2);
}

#[test]
fn a_region_over_the_pinned_quota_is_refused() {
    let m = Manager::start(
        &policy("", "").replace("max_pinned = \"16M\"", "max_pinned = \"64K\""),
        &[],
    );
    let mut c = m.client();
    let big = redn_client::SealedRegion::create("big", 128 << 10).unwrap();
    let e = refused(c.register_region(&big, "big").unwrap_err());
    assert_eq!(
        e,
        ManagerError::QuotaExceeded {
            resource: "bytes".into(),
            limit: 64 << 10,
            requested: 128 << 10
        }
    );
}

#[test]
fn the_verifier_refuses_what_the_grants_do_not_cover_and_says_why() {
    // hash-get runs 9 WQEs per invocation; this app's clients may run 4.
    let p = policy("", "").replace("wqes_per_invocation = 64", "wqes_per_invocation = 4");
    let m = Manager::start(&p, &[]);
    let mut c = m.client();
    let mut table = TwoChoiceTable::create(8).unwrap();
    let e = refused(c.install_table("hash-get", &mut table).unwrap_err());
    match e {
        ManagerError::VerifierRefused { offload, log } => {
            assert_eq!(offload, "hash-get");
            assert!(
                log.contains('9') && log.contains('4'),
                "the log names both counts: {log}"
            );
        }
        other => panic!("{other:?}"),
    }
    let list: api::InstalledList =
        m.admin_call("io.redn.Admin.ListOffloads", serde_json::json!({}));
    assert!(list.offloads.is_empty());
}

#[test]
fn a_peer_no_rule_matches_is_refused_by_policy() {
    let other_uid = policy("", "").replace(
        &format!("uid = {}", uid()),
        &format!("uid = {}", uid() + 4242),
    );
    let m = Manager::start(&other_uid, &[]);
    let mut c = m.client();
    let e = refused(c.info().unwrap_err());
    assert!(
        matches!(e, ManagerError::PolicyDenied { ref reason } if reason.contains("no app rule")),
        "{e:?}"
    );
}

/// Send `bytes` (with `fds`) on a fresh connection; the reply, if any came before close.
fn send_raw(path: &Path, bytes: &[u8], fds: &[std::os::fd::BorrowedFd<'_>]) -> Option<Reply> {
    let mut c = Connection::connect(path, DEADLINE).unwrap();
    c.send_bytes(bytes, fds).unwrap();
    c.read_reply().ok()
}

fn violation(r: &Option<Reply>) -> String {
    let r = r.as_ref().expect("a reply before the connection closed");
    assert_eq!(
        r.error.as_deref(),
        Some("io.redn.Manager.ProtocolViolation"),
        "{r:?}"
    );
    r.parameters["limit"].as_str().unwrap().to_owned()
}

#[test]
fn malformed_requests_get_errors_while_another_client_is_served() {
    let m = Manager::start(&policy("", ""), &["--limit", "message-bytes=4096"]);
    let mut good = m.client();
    good.info().unwrap();
    assert_eq!(
        violation(&send_raw(&m.api(), b"{\"method\": \0", &[])),
        "json"
    );
    good.info().unwrap();
    let big = format!(
        "{{\"method\":\"io.redn.Manager.GetInfo\",\"parameters\":{{\"x\":\"{}\"}}}}\0",
        "a".repeat(8192)
    );
    assert_eq!(
        violation(&send_raw(&m.api(), big.as_bytes(), &[])),
        "message-size"
    );
    good.info().unwrap();
    let deep = format!(
        "{{\"method\":\"io.redn.Manager.GetInfo\",\"parameters\":{{\"x\":{}1{}}}}}\0",
        "[".repeat(100),
        "]".repeat(100)
    );
    assert_eq!(
        violation(&send_raw(&m.api(), deep.as_bytes(), &[])),
        "nesting"
    );
    good.info().unwrap();
    // Well-framed calls the manager cannot serve: named errors, the connection kept.
    for (call, error, parameter) in [
        (
            &br#"{"method":"io.redn.Manager.Explode","parameters":{}}"#[..],
            "org.varlink.service.MethodNotFound",
            ("method", "io.redn.Manager.Explode"),
        ),
        (
            br#"{"method":"com.example.Other.M"}"#,
            "org.varlink.service.InterfaceNotFound",
            ("interface", "com.example.Other"),
        ),
        (
            br#"{"method":"io.redn.Manager.Uninstall","parameters":{"handle":"x"}}"#,
            "org.varlink.service.InvalidParameter",
            ("parameter", "handle"),
        ),
        (
            br#"{"method":"io.redn.Manager.Uninstall","parameters":{"handle":1,"evil":1}}"#,
            "org.varlink.service.InvalidParameter",
            ("parameter", "evil"),
        ),
    ] {
        let mut c = m.raw(&m.api());
        c.send_bytes(&[call, b"\0"].concat(), &[]).unwrap();
        let r = c.read_reply().unwrap();
        assert_eq!(r.error.as_deref(), Some(error));
        assert_eq!(r.parameters[parameter.0], parameter.1);
        let info: api::ManagerInfo = c.call("io.redn.Manager.GetInfo", &(), &[]).unwrap();
        assert_eq!(info.app, "tester");
    }
    // Five fds where four are allowed: refused, the fds closed, the connection kept.
    let regions: Vec<_> = (0..5)
        .map(|_| redn_client::SealedRegion::create("x", 4096).unwrap())
        .collect();
    let fds: Vec<_> = regions.iter().map(redn_client::SealedRegion::fd).collect();
    let mut c = m.raw(&m.api());
    c.send_bytes(
        b"{\"method\":\"io.redn.Manager.RegisterRegion\",\"parameters\":{\"fd\":0}}\0",
        &fds,
    )
    .unwrap();
    let r = c.read_reply().unwrap();
    assert_eq!(
        r.error.as_deref(),
        Some("io.redn.Manager.ProtocolViolation")
    );
    assert_eq!(r.parameters["limit"], "fds");
    let info: api::ManagerInfo = c.call("io.redn.Manager.GetInfo", &(), &[]).unwrap();
    assert_eq!(
        info.regions, 0,
        "nothing was registered from the refused call"
    );
    good.info().unwrap();
    assert!(m.log().contains("event=protocol-violation"));
}

#[test]
fn per_uid_connection_and_request_rate_caps_refuse_only_the_excess() {
    let m = Manager::start(
        &policy("", ""),
        &[
            "--limit",
            "connections-per-uid=2",
            "--limit",
            "requests-per-second=5",
        ],
    );
    let mut a = m.client();
    let mut b = m.client();
    a.info().unwrap();
    // The manager refuses the third at accept, with an unprompted error reply, then closes;
    // a call sent meanwhile may meet the closed socket, so only read.
    let third = m.raw(&m.api()).read_reply().unwrap();
    assert_eq!(
        third.error.as_deref(),
        Some("io.redn.Manager.QuotaExceeded")
    );
    assert_eq!(third.parameters["resource"], "connections-per-uid");
    // 200 calls at once cannot all fall in distinct one-second windows of 5.
    let mut limited = 0;
    for _ in 0..200 {
        match b.info() {
            Ok(_) => {}
            Err(ClientError::Refused(ManagerError::RateLimited {
                requests_per_second: 5,
            })) => limited += 1,
            Err(e) => panic!("{e:?}"),
        }
    }
    assert!(limited > 0);
    a.info().unwrap();
}

#[test]
fn a_second_manager_on_the_same_paths_refuses_to_start() {
    let m = Manager::start(&policy("", ""), &[]);
    let out = m.run_once(&[]);
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("another redn-manager holds"), "{err}");
    m.client().info().unwrap();
}

#[test]
fn a_broken_config_is_refused_naming_file_line_and_key() {
    let m = Manager::configure(&policy("", ""));
    let text = std::fs::read_to_string(m.config())
        .unwrap()
        .replace("pus = 1", "pus = 0");
    std::fs::write(m.config(), text).unwrap();
    let out = m.run_once(&["--check"]);
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    let want = format!("{}:8:", m.config().display());
    assert!(err.contains(&want) && err.contains("backend.pus"), "{err}");
    assert!(!m.api().exists());
}

#[test]
fn check_verifies_every_allowed_offload_for_every_rule() {
    let m = Manager::configure(
        &policy("", "").replace("wqes_per_invocation = 64", "wqes_per_invocation = 2"),
    );
    let out = m.run_once(&["--check"]);
    assert_eq!(out.status.code(), Some(1));
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.contains("offload \"hash-get\"") && text.contains("offload \"echo\""),
        "{text}"
    );
    let ok = Manager::configure(&policy("", ""));
    let out = ok.run_once(&["--check"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn policy_reloads_atomically() {
    let m = Manager::start(&policy("", ""), &[]);
    let mut c = m.client();
    assert_eq!(c.info().unwrap().app, "tester");
    std::fs::write(m.dir.join("policy.toml"), "[[app]]\nname = \"broken\n").unwrap();
    let mut admin = m.raw(&m.admin());
    let e = admin
        .call::<_, api::Reloaded>("io.redn.Admin.ReloadPolicy", &(), &[])
        .unwrap_err();
    assert!(e.to_string().contains("io.redn.Admin.ReloadFailed"), "{e}");
    assert_eq!(c.info().unwrap().app, "tester", "the old policy stays");
    std::fs::write(
        m.dir.join("policy.toml"),
        policy("", "").replace("\"tester\"", "\"renamed\""),
    )
    .unwrap();
    let r: api::Reloaded = admin.call("io.redn.Admin.ReloadPolicy", &(), &[]).unwrap();
    assert_eq!(r.apps, 1);
    assert_eq!(c.info().unwrap().app, "renamed");
}

#[test]
fn sockets_have_their_modes_and_go_away_at_shutdown() {
    use std::os::unix::fs::PermissionsExt;
    let mut m = Manager::start(&policy("", ""), &[]);
    let mode = |p: &Path| std::fs::metadata(p).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode(&m.api()), 0o660);
    assert_eq!(mode(&m.admin()), 0o600);
    let mut child = m.child.take().unwrap();
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(i32::try_from(child.id()).unwrap()),
        nix::sys::signal::Signal::SIGTERM,
    )
    .unwrap();
    assert!(child.wait().unwrap().success());
    assert!(!m.api().exists() && !m.admin().exists());
    assert!(m.log().contains("event=stop "));
}

#[test]
fn socket_activation_with_systemd_socket_activate() {
    let Some(activate) = which("systemd-socket-activate") else {
        return skip("systemd-socket-activate is not installed (Debian package systemd)");
    };
    let m = Manager::configure(&policy("", ""));
    let notify = UnixDatagram::bind(m.dir.join("notify")).unwrap();
    notify.set_read_timeout(Some(DEADLINE)).unwrap();
    let mut child = Command::new(activate)
        .arg("-l")
        .arg(m.api())
        .arg("--fdname=manager")
        .arg("-E")
        .arg(format!("NOTIFY_SOCKET={}", m.dir.join("notify").display()))
        .arg(MANAGER)
        .arg("--config")
        .arg(m.config())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // It binds first and says so; the manager starts on the first connection.
    let mut err = BufReader::new(child.stderr.take().unwrap());
    let mut line = String::new();
    let start = Instant::now();
    while !line.contains("Listening on") {
        line.clear();
        assert!(
            err.read_line(&mut line).unwrap() > 0 && start.elapsed() < DEADLINE,
            "no listening line"
        );
    }
    let mut c = Client::connect(&m.api()).unwrap();
    assert_eq!(c.info().unwrap().app, "tester");
    let mut buf = [0u8; 256];
    let n = recv(&notify, &mut buf).unwrap();
    assert!(String::from_utf8_lossy(&buf[..n]).contains("READY=1"));
    assert!(
        m.admin().exists(),
        "the admin socket was not passed, so the manager bound it"
    );
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(i32::try_from(child.id()).unwrap()),
        nix::sys::signal::Signal::SIGTERM,
    )
    .unwrap();
    assert!(child.wait().unwrap().success());
    let mut rest = String::new();
    let _ = err.read_to_string(&mut rest);
    assert!(rest.contains("event=stop "), "{rest}");
}

/// A Python with PyPI's `varlink` package: `$REDN_PYTHON`, `python3`, or a venv `.ci/run`
/// made.
fn python_with_varlink() -> Option<String> {
    let candidates = [
        std::env::var("REDN_PYTHON").ok(),
        Some("python3".to_owned()),
    ];
    candidates.into_iter().flatten().find(|p| {
        Command::new(p)
            .args(["-c", "import varlink"])
            .stderr(Stdio::null())
            .status()
            .is_ok_and(|s| s.success())
    })
}

#[test]
fn pythons_varlink_client_talks_to_the_manager() {
    let Some(py) = python_with_varlink() else {
        return skip("no Python with the varlink package (pip install varlink; set REDN_PYTHON)");
    };
    let m = Manager::start(&policy("", ""), &[]);
    let cli = |args: &[&str]| {
        let mut command = Command::new(&py);
        command.args(["-m", "varlink.cli"]).args(args);
        // The CLI prints an error reply on stderr and still exits 0.
        stdout_of(&mut command)
    };
    let api = format!("unix:{}", m.api().display());
    let admin = format!("unix:{}", m.admin().display());
    let info = cli(&["info", &api]);
    assert!(
        info.contains("io.redn.Manager") && info.contains("org.varlink.service"),
        "{info}"
    );
    let help = cli(&["help", &format!("{api}/io.redn.Manager")]);
    assert_eq!(help.trim_end(), redn_proto::idl::MANAGER_IDL.trim_end());
    let help = cli(&["help", &format!("{admin}/io.redn.Admin")]);
    assert_eq!(help.trim_end(), redn_proto::idl::ADMIN_IDL.trim_end());
    let list = cli(&["call", &format!("{api}/io.redn.Manager.ListOffloads"), "{}"]);
    let v: serde_json::Value = serde_json::from_str(&list).unwrap();
    let names: Vec<&str> = v["offloads"]
        .as_array()
        .unwrap()
        .iter()
        .map(|o| o["name"].as_str().unwrap())
        .collect();
    assert_eq!(names, ["hash-get", "echo"]);
    // Fds from a client written elsewhere: a sealed memfd passed with SCM_RIGHTS on the
    // call's first byte, by index 0, as sd-varlink passes them.
    let script = format!(
        "import fcntl,json,os,socket\n\
         fd=os.memfd_create('py',os.MFD_ALLOW_SEALING)\n\
         os.ftruncate(fd,8192)\n\
         fcntl.fcntl(fd,fcntl.F_ADD_SEALS,fcntl.F_SEAL_SHRINK|fcntl.F_SEAL_GROW)\n\
         s=socket.socket(socket.AF_UNIX)\n\
         s.connect({:?})\n\
         call={{'method':'io.redn.Manager.RegisterRegion','parameters':{{'fd':0,'name':'py'}}}}\n\
         socket.send_fds(s,[json.dumps(call).encode()+b'\\0'],[fd])\n\
         print(s.recv(4096).rstrip(b'\\0').decode())\n",
        m.api().to_str().unwrap()
    );
    let out = Command::new(&py).args(["-c", &script]).output().unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    let reply: serde_json::Value =
        serde_json::from_str(text.trim()).unwrap_or_else(|e| panic!("{e}: {text}"));
    assert_eq!(reply["parameters"]["size"], 8192, "{reply}");
    assert!(reply.get("error").is_none(), "{reply}");
}

#[test]
fn a_connection_handed_to_another_process_loses_its_rights() {
    let Some(py) = which("python3") else {
        return skip("no python3 to fork a peer");
    };
    let m = Manager::start(&policy("", ""), &[]);
    let reaped = m.dir.join("reaped");
    // The parent connects and makes one call (so the manager has identified it), forks and
    // exits; once this test has reaped it, the child (which kept the socket) calls GetInfo
    // on the parent's connection.
    let script = format!(
        "import os,socket,time\n\
         s=socket.socket(socket.AF_UNIX)\n\
         s.connect({api:?})\n\
         s.sendall(b'{{\"method\":\"org.varlink.service.GetInfo\"}}\\0')\n\
         s.recv(4096)\n\
         if os.fork():\n    os._exit(0)\n\
         for _ in range(3000):\n    \
             if os.path.exists({reaped:?}): break\n    \
             time.sleep(0.01)\n\
         s.sendall(b'{{\"method\":\"io.redn.Manager.GetInfo\"}}\\0')\n\
         print(s.recv(4096).rstrip(b'\\0').decode(),flush=True)\n",
        api = m.api().to_str().unwrap(),
        reaped = reaped.to_str().unwrap(),
    );
    let mut parent = Command::new(py)
        .args(["-c", &script])
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    assert!(parent.wait().unwrap().success());
    std::fs::write(&reaped, b"").unwrap();
    let mut text = String::new();
    parent
        .stdout
        .take()
        .unwrap()
        .read_to_string(&mut text)
        .unwrap();
    let reply: serde_json::Value =
        serde_json::from_str(text.trim()).unwrap_or_else(|e| panic!("{e}: {text}"));
    assert_eq!(reply["error"], "io.redn.Manager.PeerChanged", "{reply}");
    // The child is not the process that opened the connection: its bytes are refused as
    // such (the kernel says who wrote them), whether or not the opener has exited.
    let reason = reply["parameters"]["reason"].as_str().unwrap();
    assert!(
        reason.contains("not from process") && reason.contains("which opened it"),
        "{reply}"
    );
}

#[test]
fn admissions_and_refusals_are_audit_records_on_syslog() {
    let m = Manager::start(&policy("", ""), &[]);
    let mut c = m.client();
    let (_t, installed) = kv_install(&mut c);
    let e = refused(c.install("list-find", &[]).unwrap_err());
    assert!(matches!(e, ManagerError::PolicyDenied { .. }));
    let syslog = m.syslog.as_ref().unwrap();
    let mut buf = [0u8; 2048];
    let (mut admit, mut refuse) = (None, None);
    while admit.is_none() || refuse.is_none() {
        let n = recv(syslog, &mut buf).expect("audit records within the deadline");
        let rec = String::from_utf8_lossy(&buf[..n]).into_owned();
        if rec.contains("event=offload-admit") {
            admit = Some(rec);
        } else if rec.contains("event=offload-refuse") {
            refuse = Some(rec);
        }
    }
    let pid = m.child.as_ref().unwrap().id();
    let admit = admit.unwrap();
    // authpriv.notice, no hostname, the identifier and the manager's pid as the tag.
    assert!(admit.starts_with("<85>"), "{admit}");
    assert!(
        admit.contains(&format!(" redn-manager[{pid}]: event=offload-admit ")),
        "{admit}"
    );
    assert!(
        admit.contains(&format!("handle={}", installed.handle)),
        "{admit}"
    );
    let refuse = refuse.unwrap();
    assert!(refuse.starts_with("<84>"), "authpriv.warning: {refuse}");
    assert!(
        refuse.contains("offload=list-find") && refuse.contains("PolicyDenied"),
        "{refuse}"
    );
}

#[test]
fn regions_are_capped_per_uid_across_connections() {
    let m = Manager::start(&policy("", ""), &["--limit", "regions-per-uid=1"]);
    let mut first = m.client();
    let mut second = m.client();
    let a = redn_client::SealedRegion::create("a", 4096).unwrap();
    first.register_region(&a, "a").unwrap();
    let b = redn_client::SealedRegion::create("b", 4096).unwrap();
    let e = refused(second.register_region(&b, "b").unwrap_err());
    assert_eq!(
        e,
        ManagerError::QuotaExceeded {
            resource: "regions-per-uid".into(),
            limit: 1,
            requested: 2
        }
    );
    // The first connection's hang-up gives its region back to the uid.
    drop(first);
    wait_for("the region was never given back", || {
        match second.register_region(&b, "b") {
            Ok(_) => true,
            Err(e) => {
                assert!(matches!(
                    refused(e),
                    ManagerError::QuotaExceeded { .. } | ManagerError::RateLimited { .. }
                ));
                false
            }
        }
    });
}

#[test]
fn sighup_reloads_the_policy() {
    let m = Manager::start(&policy("", ""), &[]);
    let mut c = m.client();
    assert_eq!(c.info().unwrap().app, "tester");
    std::fs::write(
        m.dir.join("policy.toml"),
        policy("", "").replace("\"tester\"", "\"after-hup\""),
    )
    .unwrap();
    let pid = i32::try_from(m.child.as_ref().unwrap().id()).unwrap();
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(pid),
        nix::sys::signal::Signal::SIGHUP,
    )
    .unwrap();
    // The reload's audit record says when it happened.
    let syslog = m.syslog.as_ref().unwrap();
    let mut buf = [0u8; 1024];
    loop {
        let n = recv(syslog, &mut buf).expect("a reload record within the deadline");
        let rec = String::from_utf8_lossy(&buf[..n]);
        if rec.contains("event=reload by=SIGHUP apps=1 ") && rec.ends_with(" res=success") {
            break;
        }
    }
    assert_eq!(c.info().unwrap().app, "after-hup");
}

#[test]
fn a_restarted_app_can_uninstall_what_it_left_serving() {
    let m = Manager::start(&policy("", ""), &[]);
    let lines = app_process("kv", &m.api());
    let line = lines.iter().find(|l| l.starts_with("handle=")).unwrap();
    let handle: u64 = line["handle=".len()..]
        .split(' ')
        .next()
        .unwrap()
        .parse()
        .unwrap();
    // This process is the same app by policy (same uid, same rule): it takes over.
    let mut c = m.client();
    let stats = c.stats().unwrap();
    assert_eq!(stats.iter().map(|s| s.handle).collect::<Vec<_>>(), [handle]);
    c.uninstall(handle).unwrap();
    let list: api::InstalledList =
        m.admin_call("io.redn.Admin.ListOffloads", serde_json::json!({}));
    assert!(list.offloads.is_empty());
    assert!(m.log().contains("event=adopt"));
}

#[test]
fn the_manager_runs_unprivileged_on_the_softnic() {
    if !nix::unistd::getuid().is_root() {
        // Already unprivileged: every other test shows it.
        return skip("not root: the other tests already run the manager unprivileged");
    }
    let Some(setpriv) = which("setpriv") else {
        return skip("setpriv (util-linux) is not installed");
    };
    let setpriv = setpriv.to_str().unwrap().to_owned();
    let wrapper = [
        setpriv.as_str(),
        "--reuid=65534",
        "--regid=65534",
        "--clear-groups",
        "--inh-caps=-all",
        "--bounding-set=-all",
    ];
    let m = Manager::start_under_open(&policy("", ""), &wrapper);
    let info = m.client().info().unwrap();
    assert_eq!(info.app, "tester");
    assert!(m.log().contains("capabilities: none held"), "{}", m.log());
}

/// The CPUs this test process may run on (`Cpus_allowed_list`, as `0-3,6`).
fn allowed_cpus() -> Vec<usize> {
    let status = std::fs::read_to_string("/proc/self/status").unwrap();
    let list = status
        .lines()
        .find_map(|l| l.strip_prefix("Cpus_allowed_list:"))
        .unwrap()
        .trim();
    let mut cpus = Vec::new();
    for part in list.split(',') {
        let (a, b) = part.split_once('-').unwrap_or((part, part));
        cpus.extend(a.parse::<usize>().unwrap()..=b.parse::<usize>().unwrap());
    }
    cpus
}

/// The manager's config with `extra` added to its `[backend]`.
fn with_backend_keys(m: &Manager, extra: &str) {
    let text = std::fs::read_to_string(m.config())
        .unwrap()
        .replace("pus = 1\n", &format!("pus = 1\n{extra}\n"));
    std::fs::write(m.config(), text).unwrap();
}

#[test]
fn the_softnic_pus_run_on_the_cpus_the_config_names() {
    let cpus = allowed_cpus();
    let last = *cpus.last().unwrap();
    let m = Manager::configure(&policy("", ""));
    with_backend_keys(&m, &format!("pu_cpus = [{last}]"));
    let m = m.launch(&[], &[]);
    let pid = m.child.as_ref().unwrap().id();
    // The PU thread, "redn-manager-pu0" cut to the kernel's 15 characters. It is pinned by
    // the thread that spawns it, before READY=1, but it names itself when it first runs,
    // which on a loaded machine may be after READY=1: until then it answers to the
    // process's name, so look again until it has its own.
    let started = Instant::now();
    let pinned = loop {
        let mut pinned = Vec::new();
        for task in std::fs::read_dir(format!("/proc/{pid}/task")).unwrap() {
            let dir = task.unwrap().path();
            let comm = std::fs::read_to_string(dir.join("comm")).unwrap_or_default();
            if comm.trim_end() == "redn-manager-pu" {
                let status = std::fs::read_to_string(dir.join("status")).unwrap();
                pinned.extend(
                    status
                        .lines()
                        .filter_map(|l| l.strip_prefix("Cpus_allowed_list:"))
                        .map(|l| l.trim().to_owned()),
                );
            }
        }
        if !pinned.is_empty() || started.elapsed() > DEADLINE {
            break pinned;
        }
        std::thread::sleep(Duration::from_millis(10));
    };
    assert_eq!(pinned, [last.to_string()], "{}", m.log());
    let said = format!("softnic: 1 processing unit(s) pinned to CPU(s) {last}");
    assert!(m.log().contains(&said), "{}", m.log());
    drop(m);

    // A CPU the manager may not run on: it refuses to start, naming the key and the CPU.
    let outside = (0..1024).find(|c| !cpus.contains(c)).unwrap();
    let m = Manager::configure(&policy("", ""));
    with_backend_keys(&m, &format!("pu_cpus = [{outside}]"));
    let out = m.run_once(&[]);
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("pu_cpus") && err.contains(&format!("CPU {outside} is not one")),
        "{err}"
    );
    assert!(!m.api().exists());
}

/// LISTEN_FDS naming a fd that systemd did not pass (here fd 3, closed when the manager
/// starts, so the signalfd it makes before adopting sockets takes it) is refused: the fd is
/// not a socket, and wrapping it would have made the signalfd a listener with two owners.
#[test]
fn listen_fds_naming_a_fd_that_is_no_socket_is_refused() {
    let m = Manager::configure(&policy("", ""));
    let mut child = Command::new("sh")
        .arg("-c")
        .arg("LISTEN_PID=$$ LISTEN_FDS=1 exec \"$0\" --config \"$1\" 3<&-")
        .arg(common::MANAGER)
        .arg(m.config())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let start = Instant::now();
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break Some(status);
        }
        if start.elapsed() > Duration::from_secs(20) {
            child.kill().unwrap();
            child.wait().unwrap();
            break None;
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    let mut err = String::new();
    child
        .stderr
        .take()
        .unwrap()
        .read_to_string(&mut err)
        .unwrap();
    assert_eq!(status.and_then(|s| s.code()), Some(1), "{err}");
    assert!(err.contains("fd 3, which is not an open socket"), "{err}");
    assert!(!m.api().exists(), "it went on with its own sockets");
}
