//! The local API's authorization, attacked: one app naming another's objects, app sockets
//! asking for what only admins may, and identities that change after the connection.
//!
//! The attacker and the other apps are this test binary again (`auth_entry`, run as another
//! uid and gid through `setpriv`, or at another path).
//!
//! Held: another app's region, handle and client ids are refused exactly as ids nobody
//! holds, admin methods are refused on the app socket (and app methods on the admin
//! socket), tokens are shown to no one but their app, an app of another rule under the
//! same uid or of another uid under the same rule takes no kept offload over, and a child
//! on its exited (zombie, unreaped) parent's connection is not served.
//!
//! Failing (holes), each with the root cause in its test's comment:
//! - `exe` rules are matched on `/proc/PID/exe` as the manager reads it at accept
//!   (`peer::Peer::identify`), which says nothing of what connected: a process that
//!   connects and `execve`s the rule's program before the accept, or that runs its own
//!   program at the rule's path in a mount namespace of its own, is served as that app
//!   (takes its kept offloads over, installs under its rule);
//! - `system::bind_locked` binds the socket and only then sets its mode, under the umask
//!   it inherited: started with umask 0, the admin socket is open to every user for a
//!   moment, and a connection made then is an admin connection for good;
//! - the lock file beside each socket is created under that umask too (0644 under the usual
//!   022), so any user may open it and `flock` it, and the next start fails
//!   `AlreadyRunning`.

use super::*;
use redn_client::Client;
use redn_proto::api;
use serde_json::{json, Map, Value};
use std::os::fd::AsRawFd;
use std::time::{Duration, Instant};

const NOBODY: u32 = 65534;
/// The `users` group: a second gid for a uid-65534 process (`setpriv --regid`).
const USERS: u32 = 100;

/// An `[[app]]` rule with `matchers` (TOML lines) allowing `offloads`.
fn rule(name: &str, matchers: &str, offloads: &str) -> String {
    format!(
        "[[app]]\nname = \"{name}\"\n{matchers}\noffloads = {offloads}\n\
         max_regions = 4\nmax_pinned = \"16M\"\nmax_queues = 16\nmax_remote_clients = 4\n\
         [app.client]\nrate_limit_kbps = \"infinity\"\nwqes_per_second = \"infinity\"\n\
         wqes_per_invocation = 64\non_violation = \"terminate\"\n"
    )
}

/// A manager whose API socket any uid may open (the admin socket stays 0600, root's).
fn open_with(policy_text: &str) -> Manager {
    let m = Manager::configure(policy_text);
    m.open_api_socket();
    m.launch(&[], &[])
}

/// A call's outcome as one JSON value: `{"ok": …}`, `{"error": NAME, "parameters": …}` or
/// `{"io": …}` when the connection failed.
fn outcome(c: &mut Connection, method: &str, params: Value) -> Value {
    let Value::Object(p) = params else {
        panic!("parameters must be an object")
    };
    match c.call_raw(method, p, &[]) {
        Ok(r) => json!({ "ok": Value::Object(r) }),
        Err(redn_proto::Error::Remote(w)) => {
            json!({ "error": w.name, "parameters": Value::Object(w.parameters) })
        }
        Err(e) => json!({ "io": e.to_string() }),
    }
}

/// The arguments that run `auth_entry` alone.
const ENTRY_ARGS: [&str; 5] = [
    "--exact",
    "authorization::auth_entry",
    "--ignored",
    "--nocapture",
    "--test-threads=1",
];

/// This test binary again as `uid`/`gid`, playing `role` against `m`'s API socket.
struct AuthProcess {
    child: Child,
    out: BufReader<std::process::ChildStdout>,
}

impl AuthProcess {
    fn start(m: &Manager, uid: u32, gid: u32, role: &str, env: &[(&str, String)]) -> Self {
        AuthProcess::start_exe(&std::env::current_exe().unwrap(), m, uid, gid, role, env)
    }

    /// [`AuthProcess::start`] with this test binary at (a copy at) `program`.
    fn start_exe(
        program: &Path,
        m: &Manager,
        uid: u32,
        gid: u32,
        role: &str,
        env: &[(&str, String)],
    ) -> Self {
        let mut command = Command::new("setpriv");
        command
            .args([
                &format!("--reuid={uid}"),
                &format!("--regid={gid}"),
                "--clear-groups",
            ])
            .arg(program)
            .args(ENTRY_ARGS);
        AuthProcess::spawn(command, m, role, env)
    }

    /// Run `command` (which runs this binary's `auth_entry`) as [`AuthProcess::start`] does.
    fn spawn(mut command: Command, m: &Manager, role: &str, env: &[(&str, String)]) -> Self {
        let mut child = command
            .envs(env.iter().map(|(k, v)| (*k, v.as_str())))
            .env("REDN_AUTH_ROLE", role)
            .env("REDN_MANAGER_SOCKET", m.api())
            .env("REDN_ADMIN_SOCKET", m.admin())
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .unwrap();
        let out = BufReader::new(child.stdout.take().unwrap());
        AuthProcess { child, out }
    }

    /// Its next report (an `AUTH KEY JSON` line).
    fn line(&mut self) -> (String, Value) {
        let mut line = String::new();
        loop {
            line.clear();
            assert!(
                self.out.read_line(&mut line).unwrap() > 0,
                "the process exited"
            );
            if let Some((_, rest)) = line.split_once("AUTH ") {
                let (k, v) = rest.trim().split_once(' ').unwrap_or((rest.trim(), "null"));
                return (k.to_owned(), serde_json::from_str(v).unwrap());
            }
        }
    }

    /// Its reports (`AUTH KEY JSON` lines) up to `AUTH done`.
    fn reports(&mut self) -> Map<String, Value> {
        let mut got = Map::new();
        let mut line = String::new();
        loop {
            line.clear();
            assert!(
                self.out.read_line(&mut line).unwrap() > 0,
                "the process exited before it was done; so far {got:?}"
            );
            let Some((_, rest)) = line.split_once("AUTH ") else {
                continue;
            };
            let (key, value) = rest.trim().split_once(' ').unwrap_or((rest.trim(), "null"));
            if key == "done" {
                return got;
            }
            got.insert(key.to_owned(), serde_json::from_str(value).unwrap());
        }
    }

    /// Close its stdin and wait for its clean exit.
    fn finish(mut self) {
        drop(self.child.stdin.take());
        assert!(self.child.wait().unwrap().success());
    }
}

fn report(key: &str, value: &Value) {
    println!("AUTH {key} {value}");
    std::io::stdout().flush().unwrap();
}

fn done_and_hold() {
    println!("AUTH done");
    std::io::stdout().flush().unwrap();
    let mut rest = String::new();
    let _ = std::io::stdin().read_line(&mut rest);
}

fn env_u64(name: &str) -> u64 {
    std::env::var(name).unwrap().parse().unwrap()
}

/// Not a test: the body of the processes the tests below start ([`AuthProcess`]).
#[test]
#[ignore = "run by the other tests as an app or attacker process"]
fn auth_entry() {
    let Ok(role) = std::env::var("REDN_AUTH_ROLE") else {
        return;
    };
    if role == "idle" {
        // The victim's program exec'd by the attacker's child: stay alive a while.
        std::thread::sleep(Duration::from_secs(5));
        return;
    }
    let socket = std::path::PathBuf::from(std::env::var("REDN_MANAGER_SOCKET").unwrap());
    match role.as_str() {
        "idor" => idor(&socket),
        "install-echo-and-exit" => {
            let mut c = Client::connect(&socket).unwrap();
            let i = c.install("echo", &[]).unwrap();
            report(
                "installed",
                &json!({ "handle": i.handle, "token": i.token }),
            );
            println!("AUTH done");
            // Exit: the manager sees it through the pidfd (keep_serving_after_exit).
        }
        "probe" => {
            // What a connection of this identity sees of the handle in HANDLE.
            let handle = env_u64("HANDLE");
            let mut c = Connection::connect(&socket, DEADLINE).unwrap();
            report(
                "info",
                &outcome(&mut c, "io.redn.Manager.GetInfo", json!({})),
            );
            report(
                "stats",
                &outcome(&mut c, "io.redn.Manager.Stats", json!({})),
            );
            report(
                "uninstall",
                &outcome(
                    &mut c,
                    "io.redn.Manager.Uninstall",
                    json!({ "handle": handle }),
                ),
            );
            done_and_hold();
        }
        "exec-race" => exec_race(&socket),
        "spin-admin" => spin_admin(),
        "hold-lock" => hold_lock(),
        "spoof" => {
            // This binary, run at the victim's exe path (a bind mount in a namespace of its
            // own): what the manager lets it do.
            let mut c = Connection::connect(&socket, DEADLINE).unwrap();
            report("served", &take_over(&mut c));
            println!("AUTH done");
        }
        other => panic!("unknown role {other}"),
    }
}

/// App B names app A's region, handle and client (REGION, HANDLE, CLIENT) in every call
/// that takes one, next to ids nobody holds, and asks the app socket for admin methods.
fn idor(socket: &Path) {
    let (region, handle, client) = (env_u64("REGION"), env_u64("HANDLE"), env_u64("CLIENT"));
    let none = 1 << 40;
    let mut c = Client::connect(socket).unwrap();
    // A region of its own, so that its quota is not what refuses it.
    let own = redn_client::SealedRegion::create("own", 16 << 10).unwrap();
    let mine = c.register_region(&own, "own").unwrap();
    report("own-region", &json!(mine.region));
    let conn = c.connection();
    let install = |r: u64| {
        json!({ "offload": "hash-get", "regions": [
            { "name": "table", "region": r, "offset": 0, "len": 4096 },
            { "name": "values", "region": r, "offset": 4096, "len": 4096 },
        ]})
    };
    for (key, id) in [("theirs", region), ("none", none)] {
        let o = outcome(conn, "io.redn.Manager.InstallOffload", install(id));
        report(&format!("install-{key}"), &o);
        // Their region second, after one of its own.
        let mixed = json!({ "offload": "hash-get", "regions": [
            { "name": "table", "region": mine.region, "offset": 0, "len": 4096 },
            { "name": "values", "region": id, "offset": 0, "len": 4096 },
        ]});
        let o = outcome(conn, "io.redn.Manager.InstallOffload", mixed);
        report(&format!("install-mixed-{key}"), &o);
    }
    for (key, id) in [("theirs", handle), ("none", none)] {
        let o = outcome(conn, "io.redn.Manager.Uninstall", json!({ "handle": id }));
        report(&format!("uninstall-{key}"), &o);
    }
    report("stats", &outcome(conn, "io.redn.Manager.Stats", json!({})));
    report("info", &outcome(conn, "io.redn.Manager.GetInfo", json!({})));
    let admin_calls = [
        ("ListClients", json!({})),
        ("ListOffloads", json!({})),
        ("ListDevices", json!({})),
        ("KillClient", json!({ "client": client })),
        ("Dump", json!({ "handle": handle })),
        (
            "TestRun",
            json!({ "handle": handle, "trigger": "", "count": 1 }),
        ),
        ("TriggerTimes", json!({ "handle": handle })),
        ("ReloadPolicy", json!({})),
        ("ListRemoteClients", json!({})),
        ("ListBans", json!({})),
        (
            "DisconnectRemote",
            json!({ "handle": handle, "instance": 0 }),
        ),
        ("LiftBan", json!({ "app": "kv", "address": "127.0.0.1" })),
        (
            "BanRemote",
            json!({ "app": "kv", "address": "127.0.0.1", "seconds": 60 }),
        ),
    ];
    for (method, params) in admin_calls {
        let o = outcome(conn, &format!("io.redn.Admin.{method}"), params);
        report(&format!("admin-{method}"), &o);
    }
    let o = outcome(
        conn,
        "org.varlink.service.GetInterfaceDescription",
        json!({ "interface": "io.redn.Admin" }),
    );
    report("admin-describe", &o);
    // Monitor with `more`, as redn monitor follow asks it.
    conn.send_bytes(
        b"{\"method\":\"io.redn.Admin.Monitor\",\"more\":true}\0",
        &[],
    )
    .unwrap();
    let r = conn.read_reply().unwrap();
    report(
        "admin-Monitor",
        &json!({ "error": r.error, "parameters": Value::Object(r.parameters) }),
    );
    // Still the same app after all that.
    report(
        "stats-after",
        &outcome(conn, "io.redn.Manager.Stats", json!({})),
    );
    let admin = std::path::PathBuf::from(std::env::var("REDN_ADMIN_SOCKET").unwrap());
    let v = match Connection::connect(&admin, DEADLINE) {
        Ok(mut a) => outcome(&mut a, "io.redn.Admin.ListClients", json!({})),
        Err(e) => json!({ "io": e.to_string() }),
    };
    report("admin-socket", &v);
    done_and_hold();
}

/// The reply's error name, or "ok".
fn name_of(v: &Value) -> &str {
    if v.get("ok").is_some() {
        return "ok";
    }
    v.get("error").and_then(Value::as_str).unwrap_or("io")
}

/// App B (another uid, another rule) names app A's region, handle and client id in every
/// call of `io.redn.Manager` that takes one, and asks its socket for every `io.redn.Admin`
/// method (and root asks the admin socket for `io.redn.Manager`'s): each is refused exactly as an id nobody holds is (the same error, the same
/// parameters but the id), A's offloads and region stay as they were, and B's `Stats`
/// shows none of them. A's tokens appear nowhere but in A's own install replies: not in
/// the log, the audit records, nor any admin listing.
#[test]
fn another_apps_ids_are_refused_as_ids_nobody_holds() {
    let policy_text = format!(
        "{}{}",
        policy("", ""),
        rule(
            "other",
            &format!("uid = {NOBODY}"),
            "[\"hash-get\", \"echo\"]"
        )
    );
    let m = open_with(&policy_text);
    let mut a = m.client();
    let mut table = redn_client::kv::TwoChoiceTable::create(64).unwrap();
    let (region, hash) = a.install_table("hash-get", &mut table).unwrap();
    let echo = a.install("echo", &[]).unwrap();
    let a_client = admin_clients(&m).iter().find(|c| c.connected).unwrap().id;
    let mut b = AuthProcess::start(
        &m,
        NOBODY,
        NOBODY,
        "idor",
        &[
            ("REGION", region.region.to_string()),
            ("HANDLE", echo.handle.to_string()),
            ("CLIENT", a_client.to_string()),
        ],
    );
    let r = b.reports();
    let strip = |v: &Value, key: &str| {
        let mut v = v.clone();
        if let Some(p) = v.get_mut("parameters").and_then(Value::as_object_mut) {
            p.remove(key);
        }
        v
    };
    for what in ["install", "install-mixed"] {
        let theirs = &r[&format!("{what}-theirs")];
        let none = &r[&format!("{what}-none")];
        assert_eq!(
            name_of(theirs),
            "io.redn.Manager.NoSuchRegion",
            "{what}: {theirs}"
        );
        assert_eq!(
            strip(theirs, "region"),
            strip(none, "region"),
            "{what}: another app's region is told from one that does not exist"
        );
    }
    let (theirs, none) = (&r["uninstall-theirs"], &r["uninstall-none"]);
    assert_eq!(name_of(theirs), "io.redn.Manager.NoSuchHandle", "{theirs}");
    assert_eq!(strip(theirs, "handle"), strip(none, "handle"));
    for key in ["stats", "stats-after"] {
        let offloads = &r[key]["ok"]["offloads"];
        assert_eq!(
            offloads,
            &json!([]),
            "{key}: B sees A's offloads: {}",
            r[key]
        );
    }
    assert_eq!(r["info"]["ok"]["app"], "other", "{}", r["info"]);
    assert_eq!(r["info"]["ok"]["offloads"], 0, "{}", r["info"]);
    for (key, v) in &r {
        if key.starts_with("admin-") {
            assert_ne!(name_of(v), "ok", "{key} served to an app: {v}");
        }
    }
    // App methods on the admin socket: not served there either.
    let mut admin = m.raw(&m.admin());
    for (method, params) in [
        ("Uninstall", json!({ "handle": echo.handle })),
        ("Stats", json!({})),
        ("GetInfo", json!({})),
        (
            "InstallOffload",
            json!({ "offload": "echo", "regions": [] }),
        ),
    ] {
        let o = outcome(&mut admin, &format!("io.redn.Manager.{method}"), params);
        assert_ne!(
            name_of(&o),
            "ok",
            "{method} served on the admin socket: {o}"
        );
    }
    // A keeps everything: its two offloads serve, its region is bound, its client is alive.
    let listed: api::InstalledList =
        m.admin_call("io.redn.Admin.ListOffloads", serde_json::json!({}));
    let mut held: Vec<(u64, u64)> = listed
        .offloads
        .iter()
        .map(|o| (o.handle, o.client))
        .collect();
    held.sort_unstable();
    assert_eq!(
        held,
        vec![(hash.handle, a_client), (echo.handle, a_client)],
        "{listed:?}"
    );
    let mine: Vec<u64> = stats(&mut a).offloads.iter().map(|o| o.handle).collect();
    assert_eq!(mine, vec![hash.handle, echo.handle]);
    assert!(a.info().unwrap().regions == 1);
    // Tokens: nowhere but in A's replies.
    let mut seen = String::new();
    for (method, params) in [
        ("ListOffloads", json!({})),
        ("ListClients", json!({})),
        ("Dump", json!({ "handle": hash.handle })),
        ("Dump", json!({ "handle": echo.handle })),
    ] {
        let o = outcome(&mut admin, &format!("io.redn.Admin.{method}"), params);
        seen.push_str(&o.to_string());
    }
    seen.push_str(&m.log());
    for t in [&hash.token, &echo.token] {
        assert!(!seen.contains(t.as_str()), "token {t} revealed");
        assert!(!seen.contains(&t.to_uppercase()), "token {t} revealed");
    }
    b.finish();
}

/// Two apps share uid 65534 and are told apart by gid (rules `a` and `b`). A installs echo
/// and exits (`keep_serving_after_exit`); B's next connection must not take A's offload
/// over (no `Stats` of it, no `Uninstall`); A's own next connection does.
#[test]
fn an_app_of_another_rule_under_the_same_uid_does_not_take_over_kept_offloads() {
    let policy_text = format!(
        "{}{}",
        rule(
            "a",
            &format!("uid = {NOBODY}\ngid = {NOBODY}"),
            "[\"echo\"]"
        ),
        rule("b", &format!("uid = {NOBODY}\ngid = {USERS}"), "[\"echo\"]")
    );
    let m = open_with(&policy_text);
    let mut a = AuthProcess::start(&m, NOBODY, NOBODY, "install-echo-and-exit", &[]);
    let handle = a.reports()["installed"]["handle"].as_u64().unwrap();
    assert!(a.child.wait().unwrap().success());
    wait_for("A's exit noticed", || {
        admin_clients(&m).iter().all(|c| !c.connected)
    });
    let env = [("HANDLE", handle.to_string())];
    let mut b = AuthProcess::start(&m, NOBODY, USERS, "probe", &env);
    let r = b.reports();
    assert_eq!(r["info"]["ok"]["app"], "b", "{}", r["info"]);
    assert_eq!(r["info"]["ok"]["offloads"], 0, "{}", r["info"]);
    assert_eq!(r["stats"]["ok"]["offloads"], json!([]), "{}", r["stats"]);
    assert_eq!(name_of(&r["uninstall"]), "io.redn.Manager.NoSuchHandle");
    let listed: api::InstalledList =
        m.admin_call("io.redn.Admin.ListOffloads", serde_json::json!({}));
    assert_eq!(listed.offloads.len(), 1, "{listed:?}");
    assert_eq!(listed.offloads[0].app, "a");
    b.finish();
    // A again (same uid and gid): takes it over, as designed.
    let mut again = AuthProcess::start(&m, NOBODY, NOBODY, "probe", &env);
    let r = again.reports();
    assert_eq!(r["info"]["ok"]["app"], "a", "{}", r["info"]);
    assert_eq!(name_of(&r["uninstall"]), "ok", "{}", r["uninstall"]);
    again.finish();
}

/// Requests the busy connections of [`exec_race`] each send before an attempt.
const BUSY_REQUESTS: usize = 60;
/// Connections that keep the manager's loop busy (`REDN_AUTH_BUSY` overrides it).
const BUSY_CONNECTIONS: usize = 12;
/// Attempts of [`exec_race`] at most, and the time it may take.
const RACE_ATTEMPTS: usize = 40;
const RACE_TIME: Duration = Duration::from_secs(6);

/// The attacker (this binary, uid 65534, rule `attacker`: may install nothing) opens a
/// socket, forks a child that connects it and at once `execve`s the victim's executable
/// (VICTIM_EXE, role `idle`), and uses the connection itself. The manager reads
/// `/proc/PID/exe` at accept, not at `connect()`: if the `execve` came first, the
/// connection is the victim's.
fn exec_race(socket: &Path) {
    use nix::sys::socket::{
        connect, socket as new_socket, AddressFamily, SockFlag, SockType, UnixAddr,
    };
    use std::ffi::CString;
    let victim = std::env::var("VICTIM_EXE").unwrap();
    let busy_connections = std::env::var("REDN_AUTH_BUSY")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(BUSY_CONNECTIONS);
    let addr = UnixAddr::new(socket).unwrap();
    let prog = CString::new(victim.as_str()).unwrap();
    let args: Vec<CString> = [
        "kvstore",
        "--exact",
        "authorization::auth_entry",
        "--ignored",
    ]
    .iter()
    .map(|a| CString::new(*a).unwrap())
    .collect();
    let env = [CString::new("REDN_AUTH_ROLE=idle").unwrap()];
    // execve's NULL-terminated arrays, built here: the forked child may not allocate (nix's
    // `execve` would build them in the child, with malloc).
    let argv: Vec<*const std::ffi::c_char> = args
        .iter()
        .map(|a| a.as_ptr())
        .chain([std::ptr::null()])
        .collect();
    let envp: Vec<*const std::ffi::c_char> = env
        .iter()
        .map(|e| e.as_ptr())
        .chain([std::ptr::null()])
        .collect();
    let own_exe = std::env::current_exe().unwrap();
    let mut busy: Vec<Connection> = (0..busy_connections)
        .map(|_| Connection::connect(socket, DEADLINE).unwrap())
        .collect();
    let request = b"{\"method\":\"io.redn.Manager.ListOffloads\"}\0".repeat(BUSY_REQUESTS);
    let start = Instant::now();
    let mut attempts = 0;
    let mut wins = Vec::new();
    let mut seen = Vec::new();
    while attempts < RACE_ATTEMPTS && start.elapsed() < RACE_TIME {
        attempts += 1;
        let sock = new_socket(
            AddressFamily::Unix,
            SockType::Stream,
            SockFlag::SOCK_CLOEXEC,
            None,
        )
        .unwrap();
        for b in &mut busy {
            b.send_bytes(&request, &[]).unwrap();
        }
        // SAFETY: fork(2) in a threaded process: the child makes only async-signal-safe calls
        // (connect, execve, _exit) and allocates nothing; `addr`, `prog`, `argv` and `envp`
        // were built before the fork.
        let child = match unsafe { nix::unistd::fork() }.unwrap() {
            nix::unistd::ForkResult::Child => {
                if connect(sock.as_raw_fd(), &addr).is_ok() {
                    // SAFETY: `prog` is a NUL-terminated path; `argv` and `envp` are arrays
                    // of NUL-terminated strings (`args`, `env`, alive here) ending in NULL.
                    unsafe { nix::libc::execve(prog.as_ptr(), argv.as_ptr(), envp.as_ptr()) };
                }
                // SAFETY: leaving the forked child without running anything of the parent's.
                unsafe { nix::libc::_exit(1) }
            }
            nix::unistd::ForkResult::Parent { child } => child,
        };
        // The child has connected once it has exec'd (a setgid program: its exe is then
        // unreadable to us, or shows the victim's path).
        let exe = format!("/proc/{child}/exe");
        let t = Instant::now();
        while std::fs::read_link(&exe).ok().as_deref() == Some(own_exe.as_path()) {
            assert!(t.elapsed() < DEADLINE, "the child never exec'd");
            std::thread::sleep(Duration::from_micros(200));
        }
        let stream = std::os::unix::net::UnixStream::from(sock);
        stream.set_read_timeout(Some(DEADLINE)).unwrap();
        let mut c = Connection::from_stream(stream);
        let info = outcome(&mut c, "io.redn.Manager.GetInfo", json!({}));
        seen.push(info["ok"]["app"].clone());
        if info["ok"]["app"] == "victim" {
            let mut won = take_over(&mut c);
            won["attempt"] = json!(attempts);
            wins.push(won);
        }
        drop(c);
        let _ = nix::sys::signal::kill(child, nix::sys::signal::Signal::SIGKILL);
        let _ = nix::sys::wait::waitpid(child, None);
        for b in &mut busy {
            for _ in 0..BUSY_REQUESTS {
                b.read_reply().unwrap();
            }
        }
        if !wins.is_empty() {
            break;
        }
    }
    report("attempts", &json!(attempts));
    report("apps", &json!(seen));
    report("wins", &json!(wins));
    done_and_hold();
}

/// What a connection served as the victim app does: its `GetInfo` and `Stats`, then it
/// uninstalls every offload `Stats` shows and installs echo under the victim's rule.
fn take_over(c: &mut Connection) -> Value {
    let info = outcome(c, "io.redn.Manager.GetInfo", json!({}));
    let stats = outcome(c, "io.redn.Manager.Stats", json!({}));
    let mut uninstalled = Vec::new();
    if let Some(list) = stats["ok"]["offloads"].as_array() {
        for o in list {
            let h = o["handle"].clone();
            let u = outcome(c, "io.redn.Manager.Uninstall", json!({ "handle": h }));
            uninstalled.push(json!({ "handle": h, "outcome": u }));
        }
    }
    let echo = outcome(
        c,
        "io.redn.Manager.InstallOffload",
        json!({ "offload": "echo", "regions": [] }),
    );
    json!({ "info": info, "stats": stats, "uninstalled": uninstalled, "install": echo })
}

/// A copy of this test binary at `path`, setgid `users`: an app's executable its uid may
/// run but neither preload nor trace (`AT_SECURE`, not dumpable).
fn setgid_copy(path: &Path) {
    use std::os::unix::fs::PermissionsExt;
    std::fs::copy(std::env::current_exe().unwrap(), path).unwrap();
    nix::unistd::chown(path, None, Some(nix::unistd::Gid::from_raw(USERS))).unwrap();
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o2755)).unwrap();
}

/// A victim app (`kvstore`: a setgid executable, so that its uid can neither preload code
/// into it nor trace it; rule `victim` by uid and exe) installs echo and exits, its offload
/// kept. An attacker of the same uid, whose own rule allows nothing, connects from a child
/// that then `execve`s `kvstore` before the manager accepts the connection (the manager's
/// loop kept busy meanwhile by the attacker's other connections; `REDN_AUTH_BUSY=0` turns
/// that off, and the attacker still won its first attempt in each of three runs), and uses
/// the connection from its parent. (A real attacker keeps the exec'd program alive by
/// stopping it, or by giving it arguments or a stdin it blocks on; its pidfd is all the
/// manager checks.) The connection must be served as what connected (the `attacker`
/// rule), never as the victim: no takeover of the victim's kept offloads, no installs
/// under its rule.
///
/// Fails today: `peer::Peer::identify` reads `/proc/PID/exe` when the manager accepts, not
/// when the peer connected, and `server::connection::admit` then matches the rule and
/// adopts the kept offloads on it; nothing ties requests to the process identified (its
/// pidfd only proves that the process that connected still lives).
#[test]
fn a_process_that_execs_another_program_after_connecting_is_not_served_as_it() {
    let m = Manager::configure("");
    let victim = m.dir.join("kvstore");
    setgid_copy(&victim);
    let policy_text = format!(
        "{}{}",
        rule(
            "victim",
            &format!("uid = {NOBODY}\nexe = \"{}\"", victim.display()),
            "[\"echo\"]"
        ),
        rule("attacker", &format!("uid = {NOBODY}"), "[]")
    );
    std::fs::write(m.dir.join("policy.toml"), policy_text).unwrap();
    m.open_api_socket();
    let m = m.launch(&[], &[]);
    let mut app = AuthProcess::start_exe(&victim, &m, NOBODY, NOBODY, "install-echo-and-exit", &[]);
    let handle = app.reports()["installed"]["handle"].as_u64().unwrap();
    assert!(app.child.wait().unwrap().success());
    wait_for("the victim's exit noticed", || {
        admin_clients(&m).iter().all(|c| !c.connected)
    });
    let listed: api::InstalledList =
        m.admin_call("io.redn.Admin.ListOffloads", serde_json::json!({}));
    assert_eq!(listed.offloads[0].app, "victim", "{listed:?}");
    let env = [("VICTIM_EXE", victim.display().to_string())];
    let mut attacker = AuthProcess::start(&m, NOBODY, NOBODY, "exec-race", &env);
    let r = attacker.reports();
    attacker.finish();
    let listed: api::InstalledList =
        m.admin_call("io.redn.Admin.ListOffloads", serde_json::json!({}));
    assert_eq!(
        r["wins"],
        json!([]),
        "in {} attempts the attacker was served as the victim app (apps seen: {})",
        r["attempts"],
        r["apps"]
    );
    assert!(
        listed.offloads.iter().any(|o| o.handle == handle),
        "the victim's kept offload is gone: {listed:?}"
    );
}

/// Spin on `connect()` to the admin socket (REDN_ADMIN_SOCKET) until it connects or is
/// refused; if it connects, ask it for `ListClients`.
fn spin_admin() {
    let path = std::path::PathBuf::from(std::env::var("REDN_ADMIN_SOCKET").unwrap());
    report("spinning", &json!(null));
    let start = Instant::now();
    let verdict = loop {
        match std::os::unix::net::UnixStream::connect(&path) {
            Ok(s) => {
                s.set_read_timeout(Some(DEADLINE)).unwrap();
                let mut c = Connection::from_stream(s);
                break json!({ "connected": outcome(&mut c, "io.redn.Admin.ListClients", json!({})) });
            }
            Err(e) if e.raw_os_error() == Some(nix::libc::EACCES) => {
                break json!({ "refused": e.to_string() })
            }
            Err(e) if start.elapsed() > Duration::from_secs(10) => {
                break json!({ "gave-up": e.to_string() })
            }
            Err(_) => {}
        }
    };
    report("verdict", &verdict);
    println!("AUTH done");
}

/// Manager starts in a row while uid 65534 spins on the admin socket's path.
const ADMIN_ROUNDS: usize = 60;

/// A manager started with umask 0 (as a unit with `UMask=0000`, or a shell that set it)
/// while uid 65534 spins on `connect()` to the admin socket's path. The socket must never
/// be open to it, not even between the `bind` that creates it and the `chmod` to 0600: a
/// connection accepted then would be an admin connection for good.
///
/// Fails today (a few rounds in): `system::bind_locked` binds (the socket is created 0777
/// less the umask, and listens) and only then sets its mode.
#[test]
fn the_admin_socket_is_never_open_to_other_users_while_the_manager_starts() {
    let mut verdicts = Vec::new();
    for _ in 0..ADMIN_ROUNDS {
        let m = Manager::configure(&policy("", ""));
        let mut spy = AuthProcess::start(&m, NOBODY, NOBODY, "spin-admin", &[]);
        assert_eq!(spy.line().0, "spinning");
        let m = m.launch(&[], &["sh", "-c", "umask 0; exec \"$0\" \"$@\""]);
        let r = spy.reports();
        assert!(spy.child.wait().unwrap().success());
        drop(m);
        let won = r["verdict"].get("connected").is_some();
        verdicts.push(r["verdict"].clone());
        if won {
            break;
        }
    }
    assert!(
        verdicts.iter().all(|v| v.get("connected").is_none()),
        "uid 65534 reached io.redn.Admin: {verdicts:?}"
    );
}

/// Open the manager's lock file (REDN_LOCK) read-only, as any user may, and take it
/// exclusively, waiting while the manager holds it; hold it until stdin closes.
fn hold_lock() {
    use nix::fcntl::{Flock, FlockArg};
    let path = std::env::var("REDN_LOCK").unwrap();
    let file = match std::fs::File::open(&path) {
        Ok(f) => f,
        Err(e) => {
            report("open", &json!({ "io": e.to_string() }));
            println!("AUTH done");
            return;
        }
    };
    report("open", &json!("ok"));
    match Flock::lock(file, FlockArg::LockExclusive) {
        Ok(held) => {
            report("locked", &json!(true));
            done_and_hold();
            drop(held);
        }
        Err((_, e)) => {
            report("locked", &json!(e.to_string()));
            println!("AUTH done");
        }
    }
}

/// uid 65534 opens the admin socket's lock file (`admin.sock.lock`, created 0644 beside
/// the socket) read-only and waits in `flock(LOCK_EX)`; the manager is restarted (stopped,
/// then started on the same config). The new manager must start: a user who may not even
/// connect to the admin socket must not be able to keep the daemon from starting.
///
/// Fails today: `system::bind_locked` creates `PATH.lock` under the inherited umask (0644
/// under 022), and `flock` needs only a descriptor open for reading. (Under the shipped
/// units, socket-activated with `UMask=0077`, no lock file is made.)
#[test]
fn another_user_cannot_keep_the_manager_from_restarting_by_taking_its_lock() {
    let mut m = open_with(&policy("", ""));
    let lock = redn_manager::system::lock_path(&m.admin());
    let mut spy = AuthProcess::start(
        &m,
        NOBODY,
        NOBODY,
        "hold-lock",
        &[("REDN_LOCK", lock.display().to_string())],
    );
    let (k, v) = spy.line();
    assert_eq!(k, "open");
    if v != json!("ok") {
        // The lock file is the manager's user's alone (mode 0600): nobody else can hold it.
        let why = v["io"].as_str().unwrap_or_default().to_owned();
        assert!(why.contains("Permission denied"), "{v}");
        spy.finish();
        return;
    }
    // Stop the manager (as `systemctl restart` would), then start it again.
    let mut first = m.child.take().unwrap();
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(i32::try_from(first.id()).unwrap()),
        nix::sys::signal::Signal::SIGTERM,
    )
    .unwrap();
    assert!(first.wait().unwrap().success());
    let (k, v) = spy.line();
    assert_eq!((k.as_str(), &v), ("locked", &json!(true)));
    let mut second = Command::new(MANAGER)
        .arg("--config")
        .arg(m.config())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let start = Instant::now();
    let verdict = loop {
        if let Some(status) = second.try_wait().unwrap() {
            let mut err = String::new();
            std::io::Read::read_to_string(&mut second.stderr.take().unwrap(), &mut err).unwrap();
            break Err(format!("{status}: {err}"));
        }
        if Connection::connect(&m.admin(), DEADLINE).is_ok() {
            break Ok(());
        }
        assert!(
            start.elapsed() < Duration::from_secs(5),
            "neither up nor down"
        );
        std::thread::sleep(Duration::from_millis(10));
    };
    let _ = second.kill();
    let _ = second.wait();
    spy.finish();
    if let Err(why) = verdict {
        panic!(
            "uid 65534 holding {} kept the manager from starting: {why}",
            lock.display()
        );
    }
}

/// The victim app's executable is `kvstore` (a setgid program, so its uid can neither
/// preload code into it nor trace it; rule `victim` by uid and exe), and the victim has
/// left an echo offload serving. The attacker, of the same uid but whose rule allows
/// nothing, runs its own program at the victim's path: `unshare -Urm` (an unprivileged
/// user and mount namespace), a bind mount of its binary over `kvstore` there, and an
/// `exec` of that path. `/proc/PID/exe`, read by the manager, then names the victim's path.
/// The manager must not take it for the victim's program.
///
/// Fails today: `peer::Procfs::exe` is `readlink("/proc/PID/exe")`, a path the kernel
/// renders in the peer's own mount namespace, and `Matchers::matches` compares that
/// string with the rule's path; the file it names in the manager's namespace is never
/// looked at.
#[test]
fn an_exe_rule_is_not_matched_by_another_program_mounted_at_its_path() {
    if which("unshare").is_none() {
        return skip("no unshare(1)");
    }
    let m = Manager::configure("");
    let victim = m.dir.join("kvstore");
    setgid_copy(&victim);
    let policy_text = format!(
        "{}{}",
        rule(
            "victim",
            &format!("uid = {NOBODY}\nexe = \"{}\"", victim.display()),
            "[\"echo\"]"
        ),
        rule("attacker", &format!("uid = {NOBODY}"), "[]")
    );
    std::fs::write(m.dir.join("policy.toml"), policy_text).unwrap();
    m.open_api_socket();
    let m = m.launch(&[], &[]);
    let mut app = AuthProcess::start_exe(&victim, &m, NOBODY, NOBODY, "install-echo-and-exit", &[]);
    let handle = app.reports()["installed"]["handle"].as_u64().unwrap();
    assert!(app.child.wait().unwrap().success());
    wait_for("the victim's exit noticed", || {
        admin_clients(&m).iter().all(|c| !c.connected)
    });
    let mut command = Command::new("setpriv");
    command
        .args([
            &format!("--reuid={NOBODY}"),
            &format!("--regid={NOBODY}"),
            "--clear-groups",
            "unshare",
            "-Urm",
            "sh",
            "-c",
            "mount --bind \"$1\" \"$2\" && shift && exec \"$@\"",
            "sh",
        ])
        .arg(std::env::current_exe().unwrap())
        .arg(&victim)
        .args(ENTRY_ARGS);
    let mut attacker = AuthProcess::spawn(command, &m, "spoof", &[]);
    let r = attacker.reports();
    assert!(attacker.child.wait().unwrap().success());
    let listed: api::InstalledList =
        m.admin_call("io.redn.Admin.ListOffloads", serde_json::json!({}));
    assert_ne!(
        r["served"]["info"]["ok"]["app"], "victim",
        "another program at the victim's exe path was served as the victim: {}",
        r["served"]
    );
    assert!(
        listed.offloads.iter().any(|o| o.handle == handle),
        "the victim's kept offload is gone: {listed:?}"
    );
}

/// uid 65534 (rule `other`, may install echo): a process P connects and is identified (one
/// call), forks C (which keeps the socket) and exits; P's parent does not reap it, so P
/// stays a zombie and its pid (and pidfd) still name it. C, once P is a zombie, asks
/// `InstallOffload` on P's connection. The manager must not serve it: P has exited.
#[test]
fn a_child_on_its_exited_parents_connection_is_not_served_while_the_parent_is_a_zombie() {
    let policy_text = format!(
        "{}{}",
        policy("", ""),
        rule("other", &format!("uid = {NOBODY}"), "[\"echo\"]")
    );
    let m = open_with(&policy_text);
    let script = r#"
import os, socket, sys
api = sys.argv[1]
r, w = os.pipe()
p = os.fork()
if p == 0:
    s = socket.socket(socket.AF_UNIX)
    s.connect(api)
    s.sendall(b'{"method":"io.redn.Manager.GetInfo"}\0')
    s.recv(65536)
    me = os.getpid()
    if os.fork() == 0:
        while open('/proc/%d/stat' % me).read().rsplit(') ', 1)[1][0] != 'Z':
            pass
        s.sendall(b'{"method":"io.redn.Manager.InstallOffload","parameters":{"offload":"echo","regions":[]}}\0')
        data = b''
        while not data.endswith(b'\0'):
            got = s.recv(65536)
            if not got:
                break
            data += got
        os.write(w, data.rstrip(b'\0') or b'{"closed":true}')
        os._exit(0)
    os._exit(0)
os.close(w)
print(os.read(r, 65536).decode(), flush=True)
os.waitpid(p, 0)
"#;
    let out = Command::new("setpriv")
        .args([
            &format!("--reuid={NOBODY}"),
            &format!("--regid={NOBODY}"),
            "--clear-groups",
            "/usr/bin/python3",
            "-c",
            script,
        ])
        .arg(m.api())
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    let reply: Value = serde_json::from_str(text.trim())
        .unwrap_or_else(|e| panic!("{e}: {text} {}", String::from_utf8_lossy(&out.stderr)));
    assert!(
        reply.get("error").is_some() || reply.get("closed").is_some(),
        "the child was served on its dead parent's connection: {reply}"
    );
    let listed: api::InstalledList =
        m.admin_call("io.redn.Admin.ListOffloads", serde_json::json!({}));
    assert!(listed.offloads.is_empty(), "{listed:?}");
}

/// One rule (`shared`, by gid alone) matches two uids, 65534 and 65533. uid 65534 installs
/// echo and exits (`keep_serving_after_exit`); uid 65533's next connection under the same
/// rule must not take the offload over (the app is the uid and the rule together).
#[test]
fn another_uid_under_the_same_rule_does_not_take_over_kept_offloads() {
    let m = open_with(&rule("shared", &format!("gid = {USERS}"), "[\"echo\"]"));
    let mut a = AuthProcess::start(&m, NOBODY, USERS, "install-echo-and-exit", &[]);
    let handle = a.reports()["installed"]["handle"].as_u64().unwrap();
    assert!(a.child.wait().unwrap().success());
    wait_for("A's exit noticed", || {
        admin_clients(&m).iter().all(|c| !c.connected)
    });
    let env = [("HANDLE", handle.to_string())];
    let mut b = AuthProcess::start(&m, NOBODY - 1, USERS, "probe", &env);
    let r = b.reports();
    assert_eq!(r["info"]["ok"]["app"], "shared", "{}", r["info"]);
    assert_eq!(r["info"]["ok"]["offloads"], 0, "{}", r["info"]);
    assert_eq!(r["stats"]["ok"]["offloads"], json!([]), "{}", r["stats"]);
    assert_eq!(name_of(&r["uninstall"]), "io.redn.Manager.NoSuchHandle");
    b.finish();
    let listed: api::InstalledList =
        m.admin_call("io.redn.Admin.ListOffloads", serde_json::json!({}));
    assert_eq!(listed.offloads.len(), 1, "{listed:?}");
}
