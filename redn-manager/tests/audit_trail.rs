//! End-to-end: the real `redn-manager` binary with a real syslog daemon (rsyslog from
//! Debian's packages, listening on a private socket with `imuxsock` and writing to a file) as
//! its audit receiver. Each test finds the records of what it did in rsyslog's file, parsed
//! here by the grammar of docs/audit.md. Offloads are driven with `io.redn.Admin.TestRun`.

mod common;

use common::*;
use redn_client::{Client, ManagerError, SealedRegion};
use redn_proto::api;
use std::collections::BTreeMap;
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Instant;

/// A private rsyslogd: `imuxsock` on `DIR/log.sock`, everything to `DIR/audit.log`.
struct Rsyslog {
    dir: PathBuf,
    child: Child,
}

/// One audit record as rsyslog wrote it: `facility.severity tag: event=… key=value …`.
#[derive(Clone, Debug)]
struct AuditRecord {
    facility: String,
    severity: String,
    tag: String,
    fields: BTreeMap<String, String>,
}

impl AuditRecord {
    fn get(&self, key: &str) -> &str {
        self.fields.get(key).map_or("", String::as_str)
    }
}

/// Parse an auditd-style body: `key=value` pairs, values bare or double-quoted with `\"`,
/// `\\` and `\xNN` escapes.
fn parse_body(body: &str) -> Option<BTreeMap<String, String>> {
    let mut out = BTreeMap::new();
    let mut chars = body.trim().chars().peekable();
    loop {
        while chars.peek() == Some(&' ') {
            chars.next();
        }
        if chars.peek().is_none() {
            return Some(out);
        }
        let key: String = chars.by_ref().take_while(|&c| c != '=').collect();
        let mut value = String::new();
        if chars.peek() == Some(&'"') {
            chars.next();
            loop {
                match chars.next()? {
                    '"' => break,
                    '\\' => match chars.next()? {
                        'x' => {
                            let hex: String = [chars.next()?, chars.next()?].iter().collect();
                            value.push(char::from(u8::from_str_radix(&hex, 16).ok()?));
                        }
                        c => value.push(c),
                    },
                    c => value.push(c),
                }
            }
        } else {
            while let Some(&c) = chars.peek() {
                if c == ' ' {
                    break;
                }
                value.push(c);
                chars.next();
            }
        }
        out.insert(key, value);
    }
}

impl Rsyslog {
    /// Start one, or `None` (skipped with the reason; a failure under CI) without rsyslogd.
    fn start() -> Option<Rsyslog> {
        let Some(rsyslogd) = which("rsyslogd").or_else(|| {
            let p = PathBuf::from("/usr/sbin/rsyslogd");
            p.is_file().then_some(p)
        }) else {
            skip("rsyslogd is not installed (apt-get install rsyslog)");
            return None;
        };
        let dir = std::env::temp_dir().join(format!(
            "redn-rsyslog-{}-{}",
            std::process::id(),
            rand_suffix()
        ));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let conf = dir.join("rsyslog.conf");
        std::fs::write(
            &conf,
            format!(
                "global(workDirectory=\"{d}\" maxMessageSize=\"64k\")\n\
                 module(load=\"imuxsock\" SysSock.Use=\"off\")\n\
                 input(type=\"imuxsock\" Socket=\"{d}/log.sock\" CreatePath=\"on\")\n\
                 template(name=\"t\" type=\"string\" \
                 string=\"%syslogfacility-text%.%syslogseverity-text% %syslogtag%%msg%\\n\")\n\
                 *.* action(type=\"omfile\" file=\"{d}/audit.log\" template=\"t\")\n",
                d = dir.display()
            ),
        )
        .unwrap();
        let child = Command::new(rsyslogd)
            .arg("-n")
            .arg("-f")
            .arg(&conf)
            .arg("-i")
            .arg(dir.join("rsyslogd.pid"))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        let r = Rsyslog { dir, child };
        wait_until("rsyslogd's socket", || r.socket().exists());
        Some(r)
    }

    fn socket(&self) -> PathBuf {
        self.dir.join("log.sock")
    }

    /// Every record of `redn-manager` in the file so far.
    fn records(&self) -> Vec<AuditRecord> {
        let text = std::fs::read_to_string(self.dir.join("audit.log")).unwrap_or_default();
        text.lines()
            .filter_map(|l| {
                let (prio, rest) = l.split_once(' ')?;
                let (facility, severity) = prio.split_once('.')?;
                let (tag, body) = rest.split_once(": ")?;
                tag.ends_with(']').then_some(())?;
                Some(AuditRecord {
                    facility: facility.into(),
                    severity: severity.into(),
                    tag: tag.into(),
                    fields: parse_body(body)?,
                })
            })
            .collect()
    }

    /// The first record of `event` for which `also` holds, waiting for it until the deadline.
    fn find(&self, event: &str, also: impl Fn(&AuditRecord) -> bool) -> AuditRecord {
        self.find_or(event, also, String::new)
    }

    /// [`Self::find`], adding what `report` says to the failure (the manager's view of its
    /// offloads, when a record that depends on them never came).
    fn find_or(
        &self,
        event: &str,
        also: impl Fn(&AuditRecord) -> bool,
        report: impl Fn() -> String,
    ) -> AuditRecord {
        let start = Instant::now();
        loop {
            if let Some(r) = self
                .records()
                .into_iter()
                .find(|r| r.get("event") == event && also(r))
            {
                return r;
            }
            assert!(
                start.elapsed() < DEADLINE,
                "no event={event} record; the file has:\n{}\n{}",
                std::fs::read_to_string(self.dir.join("audit.log")).unwrap_or_default(),
                report()
            );
            std::thread::yield_now();
        }
    }
}

impl Drop for Rsyslog {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

fn rand_suffix() -> u64 {
    use std::sync::atomic::{AtomicU64, Ordering};
    static N: AtomicU64 = AtomicU64::new(0);
    N.fetch_add(1, Ordering::Relaxed)
}

/// Wait until `cond` holds, failing at the deadline.
fn wait_until(what: &str, mut cond: impl FnMut() -> bool) {
    let start = Instant::now();
    while !cond() {
        assert!(start.elapsed() < DEADLINE, "timed out waiting for {what}");
        std::thread::yield_now();
    }
}

/// A policy for this uid allowing `offloads`, with `[app.client]` keys `client`.
fn app_policy(name: &str, offloads: &str, extra: &str, client: &str) -> String {
    format!(
        "[[app]]\nname = \"{name}\"\nuid = {}\noffloads = [{offloads}]\n\
         max_regions = 4\nmax_pinned = \"16M\"\nmax_queues = 32\nmax_remote_clients = 4\n{extra}\n\
         [app.client]\nrate_limit_kbps = \"infinity\"\n{client}\n",
        uid()
    )
}

/// Install server-loop over a fresh region: its handle and a trigger for bucket 0.
fn install_server_loop(c: &mut Client) -> Result<(u64, String), redn_client::Error> {
    let region = SealedRegion::create("table", 1 << 16).unwrap();
    let r = c.register_region(&region, "table")?;
    let (handle, trigger) = common::try_install_server_loop(c, &r)?;
    Ok((handle, hex(&trigger)))
}

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

fn test_run(m: &Manager, handle: u64, trigger: &str, count: u32) -> u32 {
    let r: api::TestRunReply = m.admin_call(
        "io.redn.Admin.TestRun",
        serde_json::json!({ "handle": handle, "trigger": trigger, "count": count }),
    );
    r.sent
}

fn offloads(m: &Manager) -> Vec<api::InstalledEntry> {
    let l: api::InstalledList = m.admin_call("io.redn.Admin.ListOffloads", serde_json::json!({}));
    l.offloads
}

fn manager_pid(m: &Manager) -> nix::unistd::Pid {
    nix::unistd::Pid::from_raw(i32::try_from(m.child.as_ref().unwrap().id()).unwrap())
}

/// A manager logging to `syslog` whose app may install server-loop and echo with 16 WQEs
/// per trigger: server-loop spends 56 a round, so driving it runs over budget.
fn runaway_manager(syslog: &Rsyslog) -> Manager {
    let policy = app_policy(
        "tester",
        "\"server-loop\", \"echo\"",
        "",
        "wqes_per_second = \"infinity\"\nwqes_per_invocation = 16\non_violation = \"terminate\"",
    );
    Manager::start_logging_to(&policy, &syslog.socket(), &[])
}

/// Send `n` triggers to echo `handle` and wait until it has served exactly `n`, cleanly.
fn echo_serves(m: &Manager, handle: u64, n: u32) {
    assert_eq!(test_run(m, handle, &hex(&[9u8; 64]), n), n);
    wait_until("the echo's triggers served", || {
        offloads(m)
            .iter()
            .any(|o| o.handle == handle && o.triggers == u64::from(n) && o.errors == 0)
    });
}

#[test]
fn two_runaway_loops_at_once_are_terminated_and_a_third_client_is_unaffected() {
    let Some(syslog) = Rsyslog::start() else {
        return;
    };
    let m = runaway_manager(&syslog);
    let (mut a, mut b, mut third) = (m.client(), m.client(), m.client());
    let (ra, ta) = install_server_loop(&mut a).unwrap();
    let (rb, tb) = install_server_loop(&mut b).unwrap();
    let echo = third.install("echo", &[]).unwrap().handle;
    assert!(test_run(&m, ra, &ta, 64) > 0);
    assert!(test_run(&m, rb, &tb, 64) > 0);
    for h in [ra, rb] {
        let t = syslog.find("terminate", |r| r.get("handle") == h.to_string());
        assert_eq!(t.get("rule"), "loop-budget");
    }
    echo_serves(&m, echo, 3);
    let stats = stats(&mut third);
    assert_eq!(
        stats.terminated, None,
        "nothing of the third client's was touched"
    );
    assert_eq!(offloads(&m).len(), 1);
}

#[test]
fn a_runaway_loop_is_terminated_while_a_neighbour_keeps_serving() {
    let Some(syslog) = Rsyslog::start() else {
        return;
    };
    let m = runaway_manager(&syslog);
    let mut c = m.client();
    let echo = c.install("echo", &[]).unwrap().handle;
    let (runaway, trigger) = install_server_loop(&mut c).unwrap();
    assert!(test_run(&m, runaway, &trigger, 64) > 0);
    // This wait failed once in about 32 suite runs (no record in 30 s, not reproduced
    // alone): on a failure, say where the offloads stood.
    let t = syslog.find_or(
        "terminate",
        |r| r.get("handle") == runaway.to_string(),
        || format!("the manager's offloads: {:#?}", offloads(&m)),
    );
    assert_eq!(
        (t.facility.as_str(), t.severity.as_str()),
        ("authpriv", "warning")
    );
    assert_eq!(t.get("rule"), "loop-budget");
    assert_eq!(t.get("offload"), "server-loop");
    assert_eq!(t.get("uid"), uid().to_string());
    assert_eq!(t.get("pid"), std::process::id().to_string());
    assert_eq!(t.get("res"), "success");
    assert!(t.tag.starts_with("redn-manager["), "{t:?}");
    // The app is told through Stats; the neighbour is untouched and still answers.
    let stats = stats(&mut c);
    let notes = stats.terminated.unwrap();
    assert_eq!(
        (notes[0].handle, notes[0].rule.as_str(), notes[0].banned),
        (runaway, "loop-budget", false)
    );
    assert_eq!(
        stats.offloads.iter().map(|o| o.handle).collect::<Vec<_>>(),
        [echo]
    );
    echo_serves(&m, echo, 2);
}

#[test]
fn a_flooding_client_is_throttled_then_terminated_then_banned_and_refused() {
    let Some(syslog) = Rsyslog::start() else {
        return;
    };
    let policy = app_policy(
        "flooder",
        "\"server-loop\"",
        "",
        "wqes_per_second = \"2k\"\nwqes_per_invocation = 64\non_violation = \"ban\"\n\
         ban_duration = \"1h\"",
    );
    let m = Manager::start_logging_to(&policy, &syslog.socket(), &[]);
    let mut c = m.client();
    let (handle, trigger) = install_server_loop(&mut c).unwrap();
    let is_ours = |r: &AuditRecord| r.get("handle") == handle.to_string();
    // Keep the queue full until the auditor has acted.
    let start = Instant::now();
    while offloads(&m).iter().any(|o| o.handle == handle) {
        assert!(start.elapsed() < DEADLINE, "the flood was never stopped");
        let r: Result<api::TestRunReply, _> = m.raw(&m.admin()).call(
            "io.redn.Admin.TestRun",
            &serde_json::json!({ "handle": handle, "trigger": trigger, "count": 4096 }),
            &[],
        );
        // Once terminated the handle is gone.
        let _ = r;
    }
    let throttle = syslog.find("throttle", is_ours);
    assert_eq!(throttle.get("rule"), "wqes-per-second");
    assert_eq!(throttle.get("paced_wqes_per_s"), "2000");
    let terminate = syslog.find("terminate", is_ours);
    assert_eq!(terminate.get("rule"), "still-flooding");
    let ban = syslog.find("ban", is_ours);
    assert_eq!((ban.get("app"), ban.get("duration")), ("flooder", "3600s"));
    // Banned: the connection it had may read why but install nothing...
    match install_server_loop(&mut c) {
        Err(redn_client::Error::Refused(ManagerError::PolicyDenied { reason })) => {
            assert!(reason.contains("banned"), "{reason}");
        }
        other => panic!("expected a refusal, got {other:?}"),
    }
    let refuse = syslog.find("offload-refuse", |r| r.get("reason").contains("banned"));
    assert_eq!(refuse.get("res"), "failed");
    // ...and a reconnect is refused at accept (an unprompted error, then the close: only
    // read, a call sent meanwhile may meet the closed socket), a record too.
    drop(c);
    let reply = m.raw(&m.api()).read_reply().unwrap();
    assert_eq!(reply.error.as_deref(), Some("io.redn.Manager.PolicyDenied"));
    let reason = reply.parameters["reason"].as_str().unwrap_or_default();
    assert!(reason.contains("banned"), "{reason}");
    let refused = syslog.find("refuse", |r| r.get("reason").contains("banned"));
    assert_eq!(
        (
            refused.get("socket"),
            refused.get("uid"),
            refused.get("res")
        ),
        ("Api", uid().to_string().as_str(), "failed")
    );
    // Admins still get in.
    assert!(offloads(&m).is_empty());
}

/// Not a test: the body of the app process `held_app` starts.
#[test]
#[ignore = "run by the other tests as an app process"]
fn held_app_entry() {
    let Ok(socket) = std::env::var("REDN_AUDIT_APP") else {
        return;
    };
    let mut c = Client::connect(Path::new(&socket)).unwrap();
    let i = c.install("echo", &[]).unwrap();
    println!("APP handle={}", i.handle);
    // Hold the connection until killed.
    let mut line = String::new();
    let _ = std::io::stdin().read_line(&mut line);
}

/// Start an app process that installs echo and waits to be killed: it and its handle.
fn held_app(m: &Manager) -> (Child, u64) {
    let mut child = Command::new(std::env::current_exe().unwrap())
        .args([
            "--exact",
            "held_app_entry",
            "--ignored",
            "--nocapture",
            "--test-threads=1",
        ])
        .env("REDN_AUDIT_APP", m.api())
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut out = BufReader::new(child.stdout.take().unwrap());
    let mut line = String::new();
    while !line.contains("APP handle=") {
        line.clear();
        assert!(
            out.read_line(&mut line).unwrap() > 0,
            "the app exited early"
        );
    }
    let handle = line
        .split("APP handle=")
        .nth(1)
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    (child, handle)
}

fn sigkill_app(keep: bool) {
    let Some(syslog) = Rsyslog::start() else {
        return;
    };
    let extra = format!("keep_serving_after_exit = {keep}");
    let policy = app_policy(
        "tester",
        "\"echo\"",
        &extra,
        "wqes_per_second = \"infinity\"\nwqes_per_invocation = 16\non_violation = \"terminate\"",
    );
    let m = Manager::start_logging_to(&policy, &syslog.socket(), &[]);
    let (mut app, handle) = held_app(&m);
    let pid = app.id();
    app.kill().unwrap();
    let _ = app.wait();
    let exit = syslog.find("app-exit", |r| r.get("pid") == pid.to_string());
    assert_eq!(exit.get("policy"), if keep { "keep" } else { "tear-down" });
    assert_eq!(exit.get("res"), "success");
    if keep {
        assert_eq!(exit.get("kept"), "1");
        // Still serving from the still-mapped memory: a trigger is answered.
        assert_eq!(test_run(&m, handle, &hex(&[1u8; 64]), 1), 1);
        wait_until("the kept offload serves a trigger", || {
            offloads(&m)
                .iter()
                .any(|o| o.handle == handle && o.triggers == 1)
        });
    } else {
        let t = syslog.find("teardown", |r| r.get("handle") == handle.to_string());
        assert_eq!((t.get("reason"), t.get("res")), ("app-exit", "success"));
        assert!(offloads(&m).is_empty());
    }
}

#[test]
fn an_app_killed_with_sigkill_keeps_its_offload_serving_when_policy_says_keep() {
    sigkill_app(true);
}

#[test]
fn an_app_killed_with_sigkill_loses_its_offload_when_policy_says_tear_down() {
    sigkill_app(false);
}

#[test]
fn sigterm_releases_everything_records_it_and_exits_zero() {
    let Some(syslog) = Rsyslog::start() else {
        return;
    };
    let policy = app_policy(
        "tester",
        "\"echo\", \"server-loop\"",
        "",
        "wqes_per_second = \"infinity\"\nwqes_per_invocation = 64\non_violation = \"terminate\"",
    );
    let mut m = Manager::start_logging_to(&policy, &syslog.socket(), &[]);
    let mut c = m.client();
    let echo = c.install("echo", &[]).unwrap().handle;
    let (lp, trigger) = install_server_loop(&mut c).unwrap();
    // In the middle of serving.
    test_run(&m, lp, &trigger, 256);
    nix::sys::signal::kill(manager_pid(&m), nix::sys::signal::Signal::SIGTERM).unwrap();
    let status = m.child.take().unwrap().wait().unwrap();
    assert!(status.success(), "{status:?}\n{}", m.log());
    for h in [echo, lp] {
        let t = syslog.find("teardown", |r| r.get("handle") == h.to_string());
        assert_eq!((t.get("reason"), t.get("res")), ("shutdown", "success"));
    }
    let stop = syslog.find("stop", |_| true);
    assert_eq!(
        (
            stop.get("offloads"),
            stop.get("objects_left"),
            stop.get("res")
        ),
        ("2", "0", "success")
    );
    syslog.find("stop-requested", |r| r.get("signal") == "SIGTERM");
    syslog.find("start", |r| r.get("backend") == "softnic");
}

#[test]
fn sighup_with_a_broken_policy_keeps_the_old_one() {
    let Some(syslog) = Rsyslog::start() else {
        return;
    };
    let client =
        "wqes_per_second = \"infinity\"\nwqes_per_invocation = 16\non_violation = \"terminate\"";
    let m = Manager::start_logging_to(
        &app_policy("tester", "\"echo\"", "", client),
        &syslog.socket(),
        &[],
    );
    let mut c = m.client();
    let first = c.install("echo", &[]).unwrap().handle;
    std::fs::write(
        m.dir.join("policy.toml"),
        app_policy("tester", "\"echo\"", "max_colour = 3", client),
    )
    .unwrap();
    nix::sys::signal::kill(manager_pid(&m), nix::sys::signal::Signal::SIGHUP).unwrap();
    let r = syslog.find("reload", |r| r.get("res") == "failed");
    assert_eq!(r.get("by"), "SIGHUP");
    assert_eq!(r.get("kept"), "old-policy");
    assert!(
        r.get("reason").contains("policy.toml:") && r.get("reason").contains("max_colour"),
        "{r:?}"
    );
    // The old policy stands: the installed offload stays, and installs still work.
    assert!(offloads(&m).iter().any(|o| o.handle == first));
    c.install("echo", &[]).unwrap();
}

#[test]
fn sighup_with_a_stricter_policy_tears_down_what_it_no_longer_allows() {
    let Some(syslog) = Rsyslog::start() else {
        return;
    };
    let client =
        "wqes_per_second = \"infinity\"\nwqes_per_invocation = 64\non_violation = \"terminate\"";
    let m = Manager::start_logging_to(
        &app_policy("tester", "\"echo\", \"server-loop\"", "", client),
        &syslog.socket(),
        &[],
    );
    let mut c = m.client();
    let echo = c.install("echo", &[]).unwrap().handle;
    let (lp, _) = install_server_loop(&mut c).unwrap();
    std::fs::write(
        m.dir.join("policy.toml"),
        app_policy("tester", "\"server-loop\"", "", client),
    )
    .unwrap();
    nix::sys::signal::kill(manager_pid(&m), nix::sys::signal::Signal::SIGHUP).unwrap();
    let r = syslog.find("reload", |r| r.get("res") == "success");
    assert_eq!(r.get("torn_down"), "1");
    let t = syslog.find("teardown", |r| r.get("handle") == echo.to_string());
    assert_eq!(
        (t.get("reason"), t.get("offload")),
        ("policy-reload", "echo")
    );
    let left: Vec<u64> = offloads(&m).iter().map(|o| o.handle).collect();
    assert_eq!(left, [lp]);
    let e = c.install("echo", &[]).unwrap_err();
    assert!(matches!(
        e,
        redn_client::Error::Refused(ManagerError::PolicyDenied { .. })
    ));
}

#[test]
fn audit_bodies_parse_by_the_documented_grammar() {
    let f = parse_body("event=x a=1 b=\"two words\" c=\"q\\\"\\\\\\x0a\" res=success").unwrap();
    assert_eq!(f["a"], "1");
    assert_eq!(f["b"], "two words");
    assert_eq!(f["c"], "q\"\\\n");
    assert_eq!(f["res"], "success");
}

#[test]
fn monitor_streams_records_and_counters_until_the_admin_hangs_up() {
    let m = Manager::start(&common::policy("", ""), &[]);
    let mut mon = m.raw(&m.admin());
    mon.send_bytes(
        b"{\"method\":\"io.redn.Admin.Monitor\",\"more\":true}\0",
        &[],
    )
    .unwrap();
    let first = mon.read_reply().unwrap();
    assert!(first.continues && first.error.is_none(), "{first:?}");
    let first: api::MonitorReply =
        serde_json::from_value(serde_json::Value::Object(first.parameters)).unwrap();
    assert_eq!(first.counters.unwrap().offloads, 0);
    let mut c = m.client();
    let handle = c.install("echo", &[]).unwrap().handle;
    let start = Instant::now();
    let (mut admitted, mut counted) = (false, false);
    while !(admitted && counted) {
        assert!(start.elapsed() < DEADLINE, "no record or counters streamed");
        let r = mon.read_reply().unwrap();
        assert!(r.continues);
        let r: api::MonitorReply =
            serde_json::from_value(serde_json::Value::Object(r.parameters)).unwrap();
        if let Some(rec) = r.record {
            let f = parse_body(&rec).unwrap();
            admitted |= f["event"] == "offload-admit" && f["handle"] == handle.to_string();
        }
        if let Some(k) = r.counters {
            counted |= k.offloads == 1 && k.auditor_rounds > 0;
        }
    }
    // Without `more` it is refused by name.
    let mut plain = m.raw(&m.admin());
    plain
        .send_bytes(b"{\"method\":\"io.redn.Admin.Monitor\"}\0", &[])
        .unwrap();
    let r = plain.read_reply().unwrap();
    assert_eq!(r.error.as_deref(), Some("org.varlink.service.ExpectedMore"));
}

#[test]
fn redn_monitor_prints_json_lines_of_records_and_counters() {
    let m = Manager::start(&common::policy("", ""), &[]);
    let mut redn = Command::new(env!("CARGO_BIN_EXE_redn"))
        .args(["-j", "-s"])
        .arg(m.admin())
        .arg("monitor")
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(redn.stdout.take().unwrap()).lines();
    // The counters come first: the subscription is in place before the install.
    let first: serde_json::Value = serde_json::from_str(&lines.next().unwrap().unwrap()).unwrap();
    assert_eq!(first["offloads"], 0, "{first}");
    let handle = m.client().install("echo", &[]).unwrap().handle;
    let (mut admitted, mut counted) = (false, false);
    for line in lines.by_ref() {
        let v: serde_json::Value = serde_json::from_str(&line.unwrap()).unwrap();
        assert!(v.is_object(), "{v}");
        if let Some(r) = v["record"].as_str() {
            let f = parse_body(r).unwrap();
            admitted |= f["event"] == "offload-admit" && f["handle"] == handle.to_string();
        } else {
            counted |= v["offloads"] == 1;
        }
        if admitted && counted {
            break;
        }
    }
    assert!(admitted && counted);
    redn.kill().unwrap();
    let _ = redn.wait();
}

#[test]
fn sighup_tears_down_an_offload_whose_definition_was_removed() {
    let Some(syslog) = Rsyslog::start() else {
        return;
    };
    let client =
        "wqes_per_second = \"infinity\"\nwqes_per_invocation = 64\non_violation = \"terminate\"";
    let echo_toml = include_str!("../../etc/redn/offloads.d/echo.toml");
    let loop_toml = include_str!("../../etc/redn/offloads.d/server-loop.toml");
    let m = Manager::start_logging_to(
        &app_policy("tester", "\"echo\", \"server-loop\"", "", client),
        &syslog.socket(),
        &[("echo", echo_toml), ("server-loop", loop_toml)],
    );
    let mut c = m.client();
    let echo = c.install("echo", &[]).unwrap().handle;
    let (lp, _) = install_server_loop(&mut c).unwrap();
    // A broken definition: nothing changes, and the record says which file.
    let defs = m.dir.join("offloads.d");
    std::fs::write(defs.join("echo.toml"), "name = \"echo\"\nbogus = 1\n").unwrap();
    nix::sys::signal::kill(manager_pid(&m), nix::sys::signal::Signal::SIGHUP).unwrap();
    let r = syslog.find("reload", |r| r.get("res") == "failed");
    assert!(r.get("reason").contains("echo.toml"), "{r:?}");
    assert_eq!(offloads(&m).len(), 2);
    // The definition removed: its installed offload goes; the other stays.
    std::fs::remove_file(defs.join("echo.toml")).unwrap();
    nix::sys::signal::kill(manager_pid(&m), nix::sys::signal::Signal::SIGHUP).unwrap();
    let t = syslog.find("teardown", |r| r.get("handle") == echo.to_string());
    assert_eq!(t.get("reason"), "policy-reload");
    let left: Vec<u64> = offloads(&m).iter().map(|o| o.handle).collect();
    assert_eq!(left, [lp]);
}

#[test]
fn sighup_reloads_manager_toml_audit_settings_and_refuses_a_broken_one() {
    let Some(syslog) = Rsyslog::start() else {
        return;
    };
    let client =
        "wqes_per_second = \"infinity\"\nwqes_per_invocation = 64\non_violation = \"terminate\"";
    let m = Manager::start_logging_to(
        &app_policy("tester", "\"echo\"", "", client),
        &syslog.socket(),
        &[],
    );
    let good = std::fs::read_to_string(m.config()).unwrap();
    std::fs::write(m.config(), format!("{good}colour = \"blue\"\n")).unwrap();
    nix::sys::signal::kill(manager_pid(&m), nix::sys::signal::Signal::SIGHUP).unwrap();
    let r = syslog.find("reload", |r| r.get("res") == "failed");
    assert!(r.get("reason").contains("manager.toml"), "{r:?}");
    // A new identifier takes effect at once; a new socket mode needs a restart, and says so.
    let renamed = good
        .replace("[audit]\n", "[audit]\nidentifier = \"redn-audit\"\n")
        .replace("mode = \"0660\"", "mode = \"0600\"");
    assert_ne!(renamed, good);
    std::fs::write(m.config(), renamed).unwrap();
    nix::sys::signal::kill(manager_pid(&m), nix::sys::signal::Signal::SIGHUP).unwrap();
    let r = syslog.find("reload", |r| r.get("res") == "success");
    assert!(r.tag.starts_with("redn-audit["), "{r:?}");
    assert_eq!(r.get("restart_needed"), "api");
}
