//! The audit trail and the daemon's outputs: forged and oversized records, a closed stderr,
//! and `redn` into a closed pipe.

use super::*;

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
