//! Hostile clients against the real `redn-manager` binary: each test is one attack, run
//! as an attacker would (real processes, real sockets, other uids), and what must hold
//! while it runs: the daemon stays up and keeps serving everyone else. `docs/attacks.md`
//! lists them with what each pins.

mod admin_remote;
mod app_lifecycle;
mod authorization;
#[path = "../common/mod.rs"]
mod common;
mod dataplane;
mod definitions;
mod enforcement;
mod eviction;
mod flood;
mod lifecycle;
mod peer_sockets;
mod raw_peer;
mod records;
mod requester;
mod sockets;

use common::*;
use redn_proto::client::Connection;
use std::io::{BufRead, BufReader, Write};
use std::path::Path;
use std::process::{Child, Command, Stdio};

/// A uid with no rule and no privileges: the attacker.
const HOSTILE_UID: &str = "65534";

/// This test binary again, as `uid`, doing attack `role` against `socket`.
fn hostile_as(uid: &str, role: &str, socket: &Path) -> Child {
    hostile_at(&std::env::current_exe().unwrap(), uid, role, socket)
}

/// This test binary run from `exe` (a link to it), as `uid`, doing attack `role` against
/// `socket`.
fn hostile_at(exe: &Path, uid: &str, role: &str, socket: &Path) -> Child {
    Command::new("setpriv")
        .args([
            &format!("--reuid={uid}"),
            &format!("--regid={uid}"),
            "--clear-groups",
        ])
        .arg(exe)
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
        Attacker::watch(hostile_as(uid, role, socket))
    }

    /// Start attack `role` against `socket` as uid 65534, from the test binary linked at
    /// `exe`.
    fn start_at(exe: &Path, role: &str, socket: &Path) -> Attacker {
        Attacker::watch(hostile_at(exe, HOSTILE_UID, role, socket))
    }

    fn watch(mut child: Child) -> Attacker {
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
        "bind-udp" => peer_sockets::hostile_bind(),
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

/// The manager's resident memory, in KiB.
fn rss_kib(m: &Manager) -> u64 {
    let pid = m.child.as_ref().unwrap().id();
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap()
}

/// A manager whose API socket anyone may connect to (the attacker runs as another uid).
fn open_manager(wrapper: &[&str]) -> Manager {
    let m = Manager::configure(&policy("", ""));
    m.open_api_socket();
    m.launch(&[], wrapper)
}

/// The manager's soft fd limit lowered to its lowest free fd, so that its next `accept`
/// (or any other open) fails with `EMFILE`, as a manager short of fds would see it; the
/// limit it had comes back with [`FdStarvation::end`].
struct FdStarvation {
    pid: u32,
    soft: String,
}

impl FdStarvation {
    fn start(m: &Manager) -> FdStarvation {
        let pid = m.child.as_ref().unwrap().id();
        let limits = std::fs::read_to_string(format!("/proc/{pid}/limits")).unwrap();
        let soft = limits
            .lines()
            .find_map(|l| l.strip_prefix("Max open files"))
            .and_then(|rest| rest.split_whitespace().next())
            .unwrap()
            .to_owned();
        let open: std::collections::BTreeSet<u32> = std::fs::read_dir(format!("/proc/{pid}/fd"))
            .unwrap()
            .filter_map(|e| e.ok()?.file_name().to_str()?.parse().ok())
            .collect();
        let lowest_free = (0..).find(|n| !open.contains(n)).unwrap();
        FdStarvation::set(pid, &lowest_free.to_string());
        FdStarvation { pid, soft }
    }

    fn set(pid: u32, soft: &str) {
        let status = Command::new("prlimit")
            .arg(format!("--pid={pid}"))
            .arg(format!("--nofile={soft}:"))
            .status()
            .unwrap();
        assert!(status.success(), "prlimit --nofile={soft}: failed");
    }

    fn end(self) {
        FdStarvation::set(self.pid, &self.soft);
    }

    /// Starve `m` of fds, then `connect`, until the manager's log says (`marker`, once more
    /// than before) that it could not accept: a transient fd the manager closes between the
    /// look at its table and the new limit leaves a free fd below the limit, and the accept
    /// then succeeds, so such a round is undone and tried again.
    fn connect_while_starved<T>(
        m: &Manager,
        marker: &str,
        mut connect: impl FnMut() -> T,
    ) -> (FdStarvation, T) {
        let before = m.log().matches(marker).count();
        for _ in 0..10 {
            let starved = FdStarvation::start(m);
            let c = connect();
            let deadline = std::time::Instant::now() + std::time::Duration::from_secs(3);
            while std::time::Instant::now() < deadline {
                if m.log().matches(marker).count() > before {
                    return (starved, c);
                }
                std::thread::sleep(std::time::Duration::from_millis(5));
            }
            starved.end();
        }
        panic!(
            "the manager's accept never failed for want of fds\n{}",
            m.log()
        );
    }
}

// ---- Remote clients of server-loop (the enforcement and eviction attacks) ----

/// The default test policy with server-loop allowed and `edit` applied to it.
fn server_loop_policy(edit: impl Fn(String) -> String) -> String {
    edit(policy("", "").replace("\"echo\"]", "\"echo\", \"server-loop\"]"))
}

/// [`server_loop_policy`] with every client held to 100 triggers a second, banned for an
/// hour over it.
fn trigger_budget_ban_policy() -> String {
    server_loop_policy(|p| {
        p.replace(
            "wqes_per_invocation",
            "triggers_per_second = 100\nwqes_per_invocation",
        )
        .replace(
            "on_violation = \"terminate\"",
            "on_violation = \"ban\"\nban_duration = \"1h\"",
        )
    })
}

/// An app serving server-loop over a table holding key 0x2a ("hello").
struct App {
    _app: redn_client::Client,
    _table: redn_client::kv::TwoChoiceTable,
    handle: u64,
    token: String,
    endpoint: String,
}

fn server_loop_app(m: &Manager) -> App {
    let mut app = m.client();
    let mut table = redn_client::kv::TwoChoiceTable::create(64).unwrap();
    let (_, installed) = app.install_table("server-loop", &mut table).unwrap();
    table.set(0x2a, b"hello").unwrap();
    App {
        endpoint: installed.endpoint.clone().expect("an endpoint"),
        handle: installed.handle,
        token: installed.token.clone(),
        _app: app,
        _table: table,
    }
}

fn remote_client(
    a: &App,
    timeout: std::time::Duration,
) -> Result<redn_client::remote::RemoteClient, redn_client::Error> {
    remote_client_from(a, timeout, None)
}

/// [`remote_client`] connecting from `source` (the manager knows a client by its address:
/// another address is another client).
fn remote_client_from(
    a: &App,
    timeout: std::time::Duration,
    source: Option<std::net::Ipv4Addr>,
) -> Result<redn_client::remote::RemoteClient, redn_client::Error> {
    redn_client::remote::RemoteClient::connect(
        a.endpoint.parse().unwrap(),
        a.handle,
        &a.token,
        redn_client::remote::RemoteOptions { timeout, source },
    )
}

/// Every audit record the manager sent so far and not yet read (waits `settle` first).
fn drain_records(m: &Manager, settle: std::time::Duration) -> Vec<String> {
    std::thread::sleep(settle);
    let syslog = m.syslog.as_ref().unwrap();
    syslog.set_nonblocking(true).unwrap();
    let mut buf = [0u8; 4096];
    let mut out = Vec::new();
    while let Ok(n) = recv(syslog, &mut buf) {
        out.push(String::from_utf8_lossy(&buf[..n]).into_owned());
    }
    syslog.set_nonblocking(false).unwrap();
    out
}

fn count(records: &[String], needle: &str) -> usize {
    records.iter().filter(|r| r.contains(needle)).count()
}

/// Say hello for the app's offload from `source` ([`hello_at`]); the connection and the
/// answer.
fn hello_from(source: &str, a: &App) -> (std::net::TcpStream, redn_proto::dataplane::Answer) {
    hello_at(source, &a.endpoint, a.handle, &a.token)
}

/// Four remote clients of server-loop (`max_remote_clients = 4`, idle ones evicted after
/// 1 s, busy ones after `held_after`) at 127.0.0.`hoarders[i]`, holding every slot with a
/// GET a session every 400 ms (far inside every budget, never idle long enough), while a
/// client at 127.0.0.2 says hello every 100 ms for up to 3 s: whether it got in, and the
/// answers it had.
fn knock_on_a_hoard(
    hoarders: [u8; 4],
    held_after: &str,
) -> (bool, std::collections::BTreeMap<String, u32>) {
    use std::time::{Duration, Instant};
    let m = Manager::start_with_dataplane(&server_loop_policy(|p| {
        p.replace(
            "on_violation = \"terminate\"",
            &format!(
                "on_violation = \"terminate\"\nevict_idle_after = \"1s\"\n\
                 evict_held_after = \"{held_after}\""
            ),
        )
    }));
    let a = server_loop_app(&m);
    let mut hoard: Vec<redn_client::remote::RemoteClient> = hoarders
        .iter()
        .map(|h| {
            let at = Some(std::net::Ipv4Addr::new(127, 0, 0, *h));
            remote_client_from(&a, Duration::from_secs(2), at).unwrap()
        })
        .collect();
    let start = Instant::now();
    let mut answers = std::collections::BTreeMap::<String, u32>::new();
    let mut last_touch = Instant::now() - Duration::from_secs(1);
    let mut got_in = false;
    while start.elapsed() < Duration::from_secs(3) {
        if last_touch.elapsed() >= Duration::from_millis(400) {
            for c in &mut hoard {
                c.get(0x2a).unwrap();
            }
            last_touch = Instant::now();
        }
        let (_tcp, answer) = hello_from("127.0.0.2", &a);
        let key = match &answer {
            redn_proto::dataplane::Answer::Accepted(_) => "Accepted".to_owned(),
            redn_proto::dataplane::Answer::Refused(r, _) => format!("{r:?}"),
        };
        *answers.entry(key).or_default() += 1;
        if matches!(answer, redn_proto::dataplane::Answer::Accepted(_)) {
            got_in = true;
            break;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    let sessions: Vec<u64> = hoard.iter().map(|c| c.sessions_opened()).collect();
    eprintln!(
        "slot hoarding from 127.0.0.{hoarders:?}: the newcomer's hellos in {:.1}s: \
         {answers:?}; the hoarders' sessions {sessions:?}",
        start.elapsed().as_secs_f64()
    );
    (got_in, answers)
}

/// Wait until process `pid` is stopped (a `SIGSTOP` takes effect after `kill` returns).
fn stopped(pid: nix::unistd::Pid) {
    let deadline = std::time::Instant::now() + DEADLINE;
    loop {
        let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap();
        // The state follows the command's closing parenthesis.
        let state = stat.rsplit_once(") ").map(|(_, rest)| rest.chars().next());
        if state == Some(Some('T')) {
            return;
        }
        assert!(std::time::Instant::now() < deadline, "not stopped: {stat}");
        std::thread::sleep(std::time::Duration::from_millis(1));
    }
}

/// The first audit record `m` sends from now on that `wanted` accepts, within `within`
/// (the others read and dropped).
fn first_record_where(
    m: &Manager,
    within: std::time::Duration,
    wanted: impl Fn(&str) -> bool,
) -> Option<String> {
    let syslog = m.syslog.as_ref().unwrap();
    syslog
        .set_read_timeout(Some(std::time::Duration::from_millis(50)))
        .unwrap();
    let mut buf = [0u8; 4096];
    let start = std::time::Instant::now();
    let found = loop {
        if start.elapsed() > within {
            break None;
        }
        let Ok(n) = recv(syslog, &mut buf) else {
            continue;
        };
        let rec = String::from_utf8_lossy(&buf[..n]).into_owned();
        if wanted(&rec) {
            break Some(rec);
        }
    };
    syslog.set_read_timeout(Some(DEADLINE)).unwrap();
    found
}
