//! Audit records: one RFC 3164 datagram per event on the local syslog socket, tagged with
//! the configured identifier and our pid and without a hostname (journald then sets
//! `SYSLOG_IDENTIFIER`), so `journalctl -t redn-manager` finds them. Each record's message
//! is `key=value` fields an admin can grep, such as `event=offload-admit client=3 ...`.
//!
//! The socket is non-blocking: a stalled syslog daemon must never stall the event loop, so
//! a record that cannot be sent is counted as dropped. A receiver that restarted
//! (`ECONNREFUSED`) or appeared late is reconnected, at most once a second. Every record is
//! also written to stderr (the service's journal stream when run by systemd).

use redn_policy::AuditConfig;
use std::os::unix::net::UnixDatagram;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

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

/// The audit trail.
#[derive(Debug)]
pub struct Audit {
    config: AuditConfig,
    socket: Option<UnixDatagram>,
    last_attempt: Option<Instant>,
    pid: u32,
    echo: bool,
    /// Records that could not be sent.
    pub dropped: u64,
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
            dropped: 0,
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

    /// Record `message`.
    pub fn record(&mut self, severity: Severity, message: &str) {
        if self.echo {
            eprintln!("{}: {message}", self.config.identifier);
        }
        let line = self.format(severity, message, SystemTime::now());
        let retry_due = self
            .last_attempt
            .map_or(true, |t| t.elapsed() >= Duration::from_secs(1));
        if self.socket.is_none() && retry_due {
            self.reconnect();
        }
        let Some(s) = &self.socket else {
            self.dropped += 1;
            return;
        };
        match s.send(line.as_bytes()) {
            Ok(_) => {}
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => self.dropped += 1,
            Err(_) => {
                // The receiver went away (restarted): try a fresh socket once.
                self.reconnect();
                let sent = self.socket.as_ref().map(|s| s.send(line.as_bytes()));
                if !matches!(sent, Some(Ok(_))) {
                    self.dropped += 1;
                }
            }
        }
    }
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
        audit.record(Severity::Notice, "event=early");
        assert_eq!(audit.dropped, 1, "no receiver yet");
        let rx = UnixDatagram::bind(&path).unwrap();
        audit.last_attempt = None; // as if a second had passed
        audit.record(Severity::Notice, "event=offload-admit client=3");
        let mut buf = [0u8; 512];
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
}
