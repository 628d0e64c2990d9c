//! Audit records: one RFC 3164 datagram per event on the local syslog socket, tagged with
//! the configured identifier and our pid and without a hostname (journald then sets
//! `SYSLOG_IDENTIFIER`), so `journalctl -t redn-manager` finds them. Each record's message
//! is an auditd-style body built by [`Record`]: `event=KIND key=value … res=success|failed`;
//! the grammar (every event and its keys) is in `docs/audit.md`.
//!
//! Records go through a bounded queue ([`QUEUE_CAP`]) drained on a non-blocking socket: a
//! stalled syslog daemon never stalls the event loop. A record that finds the queue full is
//! dropped and counted, and once the queue drains an `event=audit-drop dropped=N` record says
//! how many were lost. A receiver that restarted (`ECONNREFUSED`) or appeared late is
//! reconnected, at most once a second. Every record is also written to stderr (the
//! service's journal stream when run by systemd).

use redn_policy::{AuditConfig, PeerIdentity};
use std::collections::VecDeque;
use std::fmt::Display;
use std::os::unix::net::UnixDatagram;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

/// Records waiting for the receiver, at most.
pub const QUEUE_CAP: usize = 4096;

/// Severity of a record (syslog(3)).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Severity {
    /// `LOG_WARNING`: refusals, violations, kills.
    Warning = 4,
    /// `LOG_NOTICE`: admissions and other normal events worth keeping.
    Notice = 5,
    /// `LOG_INFO`: connections.
    Info = 6,
}

/// Every kind of audit record, `event=` of its body. The one list: `docs/audit.md` and
/// redn(7) must describe each (their tests check it).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Event {
    /// The loop starts serving.
    Start,
    /// SIGTERM or SIGINT arrived.
    StopRequested,
    /// Everything was torn down.
    Stop,
    /// Config, policy and definitions reloaded, or kept.
    Reload,
    /// A local connection was accepted.
    Connect,
    /// A local connection was refused at accept.
    Refuse,
    /// A local connection closed while its process lives on.
    Disconnect,
    /// A reconnecting app took over what its earlier connections left serving.
    Adopt,
    /// `RegisterRegion` succeeded.
    RegionRegister,
    /// `InstallOffload` succeeded.
    OffloadAdmit,
    /// `InstallOffload` was refused.
    OffloadRefuse,
    /// The data plane admitted or refused a remote client.
    RemoteConnect,
    /// A remote client's instance was released.
    RemoteExit,
    /// The auditor paced an instance's queues.
    Throttle,
    /// The auditor lifted a throttle.
    Unthrottle,
    /// The auditor terminated an offload or a remote client's instance.
    Terminate,
    /// The auditor banned an app or a remote client's address.
    Ban,
    /// An admin's `LiftBan`.
    Unban,
    /// One of an instance's queues went to the error state.
    QueueError,
    /// An app's process exited.
    AppExit,
    /// An offload was uninstalled.
    Teardown,
    /// An admin's `KillClient`.
    Kill,
    /// A connection broke the wire protocol or a cap.
    ProtocolViolation,
    /// Records were lost while the receiver stalled.
    AuditDrop,
}

impl Event {
    /// Every event.
    pub const ALL: [Event; 24] = [
        Event::Start,
        Event::StopRequested,
        Event::Stop,
        Event::Reload,
        Event::Connect,
        Event::Refuse,
        Event::Disconnect,
        Event::Adopt,
        Event::RegionRegister,
        Event::OffloadAdmit,
        Event::OffloadRefuse,
        Event::RemoteConnect,
        Event::RemoteExit,
        Event::Throttle,
        Event::Unthrottle,
        Event::Terminate,
        Event::Ban,
        Event::Unban,
        Event::QueueError,
        Event::AppExit,
        Event::Teardown,
        Event::Kill,
        Event::ProtocolViolation,
        Event::AuditDrop,
    ];

    /// Its name, as `event=` writes it.
    pub fn name(self) -> &'static str {
        match self {
            Event::Start => "start",
            Event::StopRequested => "stop-requested",
            Event::Stop => "stop",
            Event::Reload => "reload",
            Event::Connect => "connect",
            Event::Refuse => "refuse",
            Event::Disconnect => "disconnect",
            Event::Adopt => "adopt",
            Event::RegionRegister => "region-register",
            Event::OffloadAdmit => "offload-admit",
            Event::OffloadRefuse => "offload-refuse",
            Event::RemoteConnect => "remote-connect",
            Event::RemoteExit => "remote-exit",
            Event::Throttle => "throttle",
            Event::Unthrottle => "unthrottle",
            Event::Terminate => "terminate",
            Event::Ban => "ban",
            Event::Unban => "unban",
            Event::QueueError => "queue-error",
            Event::AppExit => "app-exit",
            Event::Teardown => "teardown",
            Event::Kill => "kill",
            Event::ProtocolViolation => "protocol-violation",
            Event::AuditDrop => "audit-drop",
        }
    }
}

/// Formatted records waiting for the receiver, one after another in one buffer. Not a
/// string each: while the receiver is stalled the queue holds thousands of records for as
/// long as it stays stalled, and small long-lived blocks scattered among the big
/// short-lived ones of installs and uninstalls keep glibc from reusing or returning the
/// freed memory around them (the manager's RSS grew by hundreds of MB under install churn,
/// `attacks::app_lifecycle::install_churn_while_the_audit_receiver_is_stalled_...`).
#[derive(Debug, Default)]
struct LineQueue {
    bytes: Vec<u8>,
    /// Where each waiting line ends in `bytes`, oldest first.
    ends: VecDeque<usize>,
    /// Where the oldest waiting line starts.
    head: usize,
}

impl LineQueue {
    fn len(&self) -> usize {
        self.ends.len()
    }

    fn is_empty(&self) -> bool {
        self.ends.is_empty()
    }

    fn push(&mut self, line: &str) {
        self.bytes.extend_from_slice(line.as_bytes());
        self.ends.push_back(self.bytes.len());
    }

    fn front(&self) -> Option<&[u8]> {
        let end = *self.ends.front()?;
        self.bytes.get(self.head..end)
    }

    fn pop_front(&mut self) {
        let Some(end) = self.ends.pop_front() else {
            return;
        };
        self.head = end;
        if self.ends.is_empty() {
            self.clear();
        } else if self.head >= self.bytes.len() / 2 {
            // Move what waits to the front once the sent part is the larger half, so the
            // buffer never grows past twice what waits (each byte moved at most once for
            // every byte sent before it).
            let head = std::mem::take(&mut self.head);
            self.bytes.drain(..head);
            for e in &mut self.ends {
                *e -= head;
            }
        }
    }

    fn clear(&mut self) {
        self.bytes.clear();
        self.ends.clear();
        self.head = 0;
    }
}

/// The audit trail.
#[derive(Debug)]
pub struct Audit {
    config: AuditConfig,
    socket: Option<UnixDatagram>,
    last_attempt: Option<Instant>,
    pid: u32,
    echo: bool,
    queue: LineQueue,
    /// Records lost (queue full, or no receiver at all).
    pub dropped: u64,
    /// Drops not yet reported by an `audit-drop` record.
    unreported: u64,
    /// Records sent.
    pub sent: u64,
    /// A copy of each record's body for `Monitor` subscribers, while some are listening.
    tap: Option<Vec<String>>,
}

impl Audit {
    /// Records to `config.socket` (tried now, and again later if it is not there yet).
    pub fn new(config: AuditConfig) -> Audit {
        let mut a = Audit {
            config,
            socket: None,
            last_attempt: None,
            pid: std::process::id(),
            echo: true,
            queue: LineQueue::default(),
            dropped: 0,
            unreported: 0,
            sent: 0,
            tap: None,
        };
        a.reconnect();
        a
    }

    fn reconnect(&mut self) {
        self.last_attempt = Some(Instant::now());
        self.socket = UnixDatagram::unbound()
            .and_then(|s| {
                s.set_nonblocking(true)?;
                s.connect(&self.config.socket)?;
                Ok(s)
            })
            .ok();
    }

    /// Do not copy records to stderr (benchmarks).
    #[must_use]
    pub fn quiet(mut self) -> Audit {
        self.echo = false;
        self
    }

    /// The datagram for `message` at `severity`, stamped `now`.
    pub fn format(&self, severity: Severity, message: &str, now: SystemTime) -> String {
        let pri = u32::from(self.config.facility.code()) * 8 + severity as u32;
        format!(
            "<{pri}>{} {}[{}]: {message}",
            rfc3164_time(now),
            self.config.identifier,
            self.pid
        )
    }

    /// Record `message` (a body [`Record::body`] built).
    fn record(&mut self, severity: Severity, message: &str) {
        if self.echo {
            to_stderr(&format!("{}: {message}", self.config.identifier));
        }
        if let Some(tap) = &mut self.tap {
            // Bounded like the queue: the loop drains it every turn.
            if tap.len() < QUEUE_CAP {
                tap.push(message.to_owned());
            }
        }
        if self.queue.len() >= QUEUE_CAP {
            self.dropped += 1;
            self.unreported += 1;
            return;
        }
        let line = self.format(severity, message, SystemTime::now());
        self.queue.push(&line);
        self.flush();
    }

    /// Record an event.
    pub fn event(&mut self, record: &Record) {
        self.record(record.severity, &record.body());
    }

    /// Send later records by `config` (a reload changed `[audit]`): a new socket, facility
    /// or identifier. Records already queued go to the new socket as they were formatted.
    pub fn reconfigure(&mut self, config: AuditConfig) {
        if config != self.config {
            self.config = config;
            self.reconnect();
        }
    }

    /// Copy record bodies for [`Audit::take_tapped`] (`on`), or stop.
    pub fn set_tap(&mut self, on: bool) {
        if on != self.tap.is_some() {
            self.tap = on.then(Vec::new);
        }
    }

    /// The record bodies copied since the last call.
    pub fn take_tapped(&mut self) -> Vec<String> {
        self.tap.as_mut().map(std::mem::take).unwrap_or_default()
    }

    /// Records waiting for the receiver.
    pub fn queued(&self) -> usize {
        self.queue.len()
    }

    /// Send what the receiver takes now, without blocking; then report drops once the queue
    /// has drained.
    pub fn flush(&mut self) {
        let retry_due = self
            .last_attempt
            .map_or(true, |t| t.elapsed() >= Duration::from_secs(1));
        if self.socket.is_none() && retry_due {
            self.reconnect();
        }
        while let Some(line) = self.queue.front() {
            let Some(s) = &self.socket else {
                // No receiver: what is queued stays until one appears or the queue fills.
                return;
            };
            match s.send(line) {
                Ok(_) => {
                    self.sent += 1;
                    self.queue.pop_front();
                }
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => return,
                Err(e) if e.raw_os_error() == Some(nix::libc::EMSGSIZE) => {
                    // Never sendable: drop it rather than block the queue behind it.
                    self.queue.pop_front();
                    self.dropped += 1;
                    self.unreported += 1;
                }
                Err(_) => {
                    // The receiver went away (restarted): a fresh socket, tried again later.
                    self.socket = None;
                    if retry_due {
                        self.reconnect();
                    }
                    if self.socket.is_none() {
                        return;
                    }
                }
            }
        }
        if self.unreported > 0 {
            let n = std::mem::take(&mut self.unreported);
            let body = Record::new(Event::AuditDrop, Severity::Warning)
                .field("dropped", n)
                .field("dropped_total", self.dropped)
                .res(false)
                .body();
            if self.echo {
                to_stderr(&format!("{}: {body}", self.config.identifier));
            }
            let line = self.format(Severity::Warning, &body, SystemTime::now());
            self.queue.push(&line);
            self.flush();
        }
    }

    /// At exit: keep flushing until the queue is empty or `deadline` passes; the records
    /// still queued then are counted as dropped.
    pub fn drain(&mut self, deadline: Instant) {
        loop {
            self.flush();
            if self.queue.is_empty() || Instant::now() >= deadline {
                break;
            }
            // The receiver is behind: give it a moment (exit path only, never the loop).
            std::thread::sleep(Duration::from_millis(1));
        }
        self.dropped += self.queue.len() as u64;
        self.queue.clear();
    }
}

/// One audit record: `event=KIND`, then `key=value` fields in the order added, then
/// `res=success|failed` if given. Values made only of letters, digits and `._/:@+,-` are
/// written bare; anything else is double-quoted, with `"` and `\` escaped by a backslash and
/// control characters as `\xNN`, so a value can never forge another key.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Record {
    severity: Severity,
    kind: Event,
    fields: Vec<(&'static str, String)>,
    res: Option<bool>,
}

impl Record {
    /// A record of event `kind`.
    pub fn new(kind: Event, severity: Severity) -> Record {
        Record {
            severity,
            kind,
            fields: Vec::new(),
            res: None,
        }
    }

    /// Add `key=value` (a value over [`MAX_VALUE_BYTES`] cut short, saying so).
    #[must_use]
    pub fn field(mut self, key: &'static str, value: impl Display) -> Record {
        self.fields.push((key, capped(value.to_string())));
        self
    }

    /// Add the peer's `uid`, `pid`, `exe` and `cgroup`.
    #[must_use]
    pub fn peer(self, p: &PeerIdentity) -> Record {
        self.field("uid", p.uid)
            .field("pid", p.pid)
            .field("exe", p.exe.display())
            .field("cgroup", &p.cgroup)
    }

    /// Add every `(key, value)`.
    #[must_use]
    pub fn fields(mut self, kv: Vec<(&'static str, String)>) -> Record {
        self.fields
            .extend(kv.into_iter().map(|(k, v)| (k, capped(v))));
        self
    }

    /// End with `res=success` or `res=failed`.
    #[must_use]
    pub fn res(mut self, ok: bool) -> Record {
        self.res = Some(ok);
        self
    }

    /// Its severity.
    pub fn severity(&self) -> Severity {
        self.severity
    }

    /// The message body.
    pub fn body(&self) -> String {
        let mut out = format!("event={}", self.kind.name());
        for (k, v) in &self.fields {
            out.push(' ');
            out.push_str(k);
            out.push('=');
            quote_into(&mut out, v);
        }
        if let Some(ok) = self.res {
            out.push_str(if ok { " res=success" } else { " res=failed" });
        }
        out
    }
}

/// Write `line` to stderr, ignoring failure: a stderr nobody reads any more (a dead log
/// pipe, a lost journal stream) must not stop the daemon, as `eprintln!` would by
/// panicking; syslog still gets the record.
pub fn to_stderr(line: &str) {
    use std::io::Write;
    let mut err = std::io::stderr().lock();
    let _ = err
        .write_all(line.as_bytes())
        .and_then(|()| err.write_all(b"\n"));
}

/// The longest field value a record carries. Values can hold what clients sent (an
/// offload's name, a region's, a protocol error quoting a key): cut short, a record always
/// fits in one syslog datagram, so a client cannot make its own record too large to send
/// and so dropped.
pub const MAX_VALUE_BYTES: usize = 512;

/// `v`, or its first [`MAX_VALUE_BYTES`] (at a character boundary) and how long it was.
fn capped(mut v: String) -> String {
    if v.len() <= MAX_VALUE_BYTES {
        return v;
    }
    let total = v.len();
    let mut cut = MAX_VALUE_BYTES;
    while !v.is_char_boundary(cut) {
        cut -= 1;
    }
    v.truncate(cut);
    v.push_str(&format!("...({total} bytes)"));
    v
}

fn quote_into(out: &mut String, v: &str) {
    let bare = !v.is_empty()
        && v.chars()
            .all(|c| c.is_ascii_alphanumeric() || "._/:@+,-".contains(c));
    if bare {
        out.push_str(v);
        return;
    }
    out.push('"');
    for c in v.chars() {
        match c {
            '"' | '\\' => {
                out.push('\\');
                out.push(c);
            }
            c if c.is_control() => {
                out.push_str(&format!("\\x{:02x}", u32::from(c)));
            }
            c => out.push(c),
        }
    }
    out.push('"');
}

/// `Mmm dd hh:mm:ss` in UTC, as RFC 3164 writes it (day space-padded).
pub fn rfc3164_time(t: SystemTime) -> String {
    const MONTHS: [&str; 12] = [
        "Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec",
    ];
    let secs = t.duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs());
    let days = secs / 86_400;
    let rem = secs % 86_400;
    // Civil date from days since 1970-01-01 (Howard Hinnant's algorithm), in u64 with the
    // era shifted so nothing goes negative.
    let z = days + 719_468;
    let era = z / 146_097;
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let name = MONTHS[usize::try_from(month - 1).unwrap_or(0) % 12];
    format!(
        "{name} {day:>2} {:02}:{:02}:{:02}",
        rem / 3600,
        rem % 3600 / 60,
        rem % 60
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_line_queue_gives_lines_back_in_order_and_compacts_what_was_sent() {
        let mut q = LineQueue::default();
        let lines: Vec<String> = (0..50)
            .map(|i| format!("record {i} {}", "x".repeat(i)))
            .collect();
        let mut next = 0;
        for (i, l) in lines.iter().enumerate() {
            q.push(l);
            if i % 3 == 2 {
                // Send two of every three: the sent part keeps being compacted away.
                for _ in 0..2 {
                    assert_eq!(q.front(), Some(lines[next].as_bytes()));
                    q.pop_front();
                    next += 1;
                }
                let waiting: usize = lines[next..=i].iter().map(String::len).sum();
                assert!(q.bytes.len() - q.head == waiting);
                assert!(q.bytes.len() <= 2 * waiting.max(1) + lines[i].len());
            }
        }
        assert_eq!(q.len(), lines.len() - next);
        while let Some(front) = q.front() {
            assert_eq!(front, lines[next].as_bytes());
            q.pop_front();
            next += 1;
        }
        assert_eq!(next, lines.len());
        assert!(q.is_empty() && q.bytes.is_empty() && q.head == 0);
        q.pop_front(); // on an empty queue: nothing
        assert!(q.is_empty());
    }

    #[test]
    fn long_values_are_cut_at_a_character_boundary_saying_how_long() {
        let short = "é".repeat(MAX_VALUE_BYTES / 2);
        assert_eq!(capped(short.clone()), short, "exactly the cap is kept");
        let long = format!("a{}", "é".repeat(MAX_VALUE_BYTES));
        let body = Record::new(Event::Refuse, Severity::Warning)
            .field("reason", &long)
            .fields(vec![("name", long.clone())])
            .body();
        let cut = format!("a{}", "é".repeat(MAX_VALUE_BYTES / 2 - 1));
        let want = format!("{cut}...({} bytes)", long.len());
        assert_eq!(body, format!("event=refuse reason={want:?} name={want:?}"));
    }

    fn config(path: &std::path::Path) -> AuditConfig {
        let text = format!(
            "[backend]\nkind = \"softnic\"\n[audit]\nsocket = \"{}\"\nfacility = \"authpriv\"\n",
            path.display()
        );
        redn_policy::parse_manager_config(&text, "m.toml")
            .unwrap()
            .audit
    }

    #[test]
    fn timestamps_are_rfc3164_utc() {
        let t = UNIX_EPOCH + Duration::from_secs(1_764_112_260); // 2025-11-25 23:11:00 UTC
        assert_eq!(rfc3164_time(t), "Nov 25 23:11:00");
        let t = UNIX_EPOCH + Duration::from_secs(951_782_400 + 3_661); // 2000-02-29 01:01:01
        assert_eq!(rfc3164_time(t), "Feb 29 01:01:01");
        assert_eq!(rfc3164_time(UNIX_EPOCH), "Jan  1 00:00:00");
    }

    #[test]
    fn records_reach_the_socket_tagged_and_late_receivers_are_found() {
        let dir = std::env::temp_dir().join(format!("redn-audit-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("log.sock");
        let mut audit = Audit::new(config(&path));
        audit.event(&Record::new(Event::Start, Severity::Notice));
        assert_eq!(audit.queued(), 1, "no receiver yet: held");
        let rx = UnixDatagram::bind(&path).unwrap();
        audit.last_attempt = None; // as if a second had passed
        audit.event(&Record::new(Event::OffloadAdmit, Severity::Notice).field("client", 3));
        let mut buf = [0u8; 512];
        let n = rx.recv(&mut buf).unwrap();
        assert!(std::str::from_utf8(&buf[..n])
            .unwrap()
            .ends_with("event=start"));
        let n = rx.recv(&mut buf).unwrap();
        let got = std::str::from_utf8(&buf[..n]).unwrap();
        // authpriv (10) * 8 + notice (5) = 85; no hostname before the tag.
        assert!(got.starts_with("<85>"), "{got}");
        let tail = format!(
            " redn-manager[{}]: event=offload-admit client=3",
            std::process::id()
        );
        assert_eq!(&got[4 + 15..], tail, "{got}");
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn every_event_is_in_the_table_of_docs_audit_md() {
        let doc = include_str!("../../docs/audit.md");
        let mut names = std::collections::HashSet::new();
        for e in Event::ALL {
            assert!(names.insert(e.name()), "{} twice", e.name());
            assert!(
                doc.contains(&format!("| `{}` |", e.name())),
                "docs/audit.md has no row for event {}",
                e.name()
            );
        }
        // And the table names no event the code does not make.
        for row in doc.lines().filter(|l| l.starts_with("| `")) {
            let name = row
                .trim_start_matches("| `")
                .split('`')
                .next()
                .unwrap_or("");
            assert!(
                names.contains(name) || crate::auditor::RULES.contains(&name),
                "docs/audit.md lists {name:?}, which is neither an event nor a rule"
            );
        }
    }

    #[test]
    fn record_bodies_quote_what_could_forge_a_key() {
        let r = Record::new(Event::Terminate, Severity::Warning)
            .field("offload", "server-loop")
            .field("reason", "loop budget")
            .field("exe", "/x/a\"b c=d\n")
            .field("empty", "")
            .res(true);
        assert_eq!(
            r.body(),
            "event=terminate offload=server-loop reason=\"loop budget\" \
             exe=\"/x/a\\\"b c=d\\x0a\" empty=\"\" res=success"
        );
    }

    #[test]
    fn a_stalled_receiver_costs_drops_that_are_counted_and_reported() {
        let dir = std::env::temp_dir().join(format!("redn-audit-q-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("log.sock");
        let rx = UnixDatagram::bind(&path).unwrap();
        let mut audit = Audit::new(config(&path)).quiet();
        // Nobody reads: the socket fills, then the queue, then records are dropped.
        for i in 0..QUEUE_CAP + 2000 {
            audit.event(&Record::new(Event::Start, Severity::Notice).field("n", i));
        }
        assert_eq!(audit.queued(), QUEUE_CAP);
        let sent = audit.sent;
        assert!(sent > 0, "the socket took some before it stalled");
        assert!(
            sent < 2000,
            "a datagram socket holds far fewer than 2000 records"
        );
        assert_eq!(audit.dropped, 2000 - sent);
        let dropped = audit.dropped;
        assert!(dropped > 0);
        // The receiver catches up: everything queued arrives in order, then the drop report.
        rx.set_nonblocking(true).unwrap();
        let mut buf = [0u8; 512];
        let mut got = Vec::new();
        let deadline = Instant::now() + Duration::from_secs(30);
        while !got
            .last()
            .is_some_and(|l: &String| l.contains("event=audit-drop"))
        {
            assert!(Instant::now() < deadline, "no drop report");
            match rx.recv(&mut buf) {
                Ok(n) => got.push(String::from_utf8_lossy(&buf[..n]).into_owned()),
                Err(_) => audit.flush(),
            }
        }
        assert_eq!(got.len() as u64, sent + QUEUE_CAP as u64 + 1);
        assert!(got.last().unwrap().ends_with(&format!(
            "event=audit-drop dropped={dropped} dropped_total={dropped} res=failed"
        )));
        let _ = std::fs::remove_dir_all(&dir);
    }
}
