//! The shipped systemd units (`etc/systemd/`): what the hardening must and must not contain
//! (checked on the text), `systemd-analyze verify` on all three units, and the service's
//! exposure score from `systemd-analyze security --offline=yes` (at most 3.0, "OK").
//!
//! `systemd-analyze` comes with Debian's systemd package. Where it is missing the two checks
//! that need it fail when `CI` is set and are skipped, saying so, elsewhere. `verify` runs
//! with `--man=no` until the man pages the units name are installed (the packaging tests
//! resolve them), and with `ExecStart` pointed at the built `redn-manager` binary.

use std::path::{Path, PathBuf};
use std::process::Command;

fn units_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../etc/systemd")
}

fn unit(name: &str) -> String {
    let path = units_dir().join(name);
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// The `key=value` settings of one section, in order (comments and blank lines dropped).
fn settings(text: &str, section: &str) -> Vec<(String, String)> {
    let mut inside = false;
    let mut out = Vec::new();
    for line in text.lines().map(str::trim) {
        if line.starts_with('[') {
            inside = line == format!("[{section}]");
            continue;
        }
        if !inside || line.is_empty() || line.starts_with('#') {
            continue;
        }
        let (k, v) = line
            .split_once('=')
            .unwrap_or_else(|| panic!("not a setting: {line}"));
        out.push((k.to_owned(), v.to_owned()));
    }
    out
}

fn values<'a>(settings: &'a [(String, String)], key: &str) -> Vec<&'a str> {
    settings
        .iter()
        .filter(|(k, _)| k == key)
        .map(|(_, v)| v.as_str())
        .collect()
}

/// `systemd-analyze`, or `None` (after saying why) where the machine lacks it and this is
/// not CI.
fn systemd_analyze() -> Option<Command> {
    let found = Command::new("systemd-analyze")
        .arg("--version")
        .output()
        .is_ok_and(|o| o.status.success());
    if found {
        return Some(Command::new("systemd-analyze"));
    }
    assert!(
        std::env::var_os("CI").is_none(),
        "systemd-analyze is missing in CI (Debian package systemd)"
    );
    eprintln!("SKIPPED: systemd-analyze not found (Debian package systemd)");
    None
}

/// The three units in a temporary directory, the service's binary replaced by the one this
/// build made (verify refuses an `ExecStart` that does not exist). `tag` keeps the tests'
/// directories apart: they run in parallel.
fn staged_units(tag: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("redn-units-{tag}-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    for name in [
        "redn-manager.service",
        "redn-manager.socket",
        "redn-manager-admin.socket",
    ] {
        let text = unit(name).replace("/usr/sbin/redn-manager", env!("CARGO_BIN_EXE_redn-manager"));
        std::fs::write(dir.join(name), text).unwrap();
    }
    dir
}

#[test]
fn the_service_is_hardened_without_breaking_rdma() {
    let service = unit("redn-manager.service");
    let s = settings(&service, "Service");
    assert_eq!(values(&s, "Type"), ["notify"]);
    assert_eq!(values(&s, "LimitMEMLOCK"), ["infinity"]);
    assert_eq!(values(&s, "ProtectSystem"), ["strict"]);
    assert_eq!(values(&s, "DevicePolicy"), ["closed"]);
    assert_eq!(values(&s, "NoNewPrivileges"), ["yes"]);
    // PrivateDevices= would hide /dev/infiniband; DeviceAllow= cannot glob a path, so the
    // verbs nodes are allowed by their device group.
    assert!(values(&s, "PrivateDevices").is_empty());
    let allowed = values(&s, "DeviceAllow");
    assert!(allowed.contains(&"char-infiniband_verbs rw"), "{allowed:?}");
    assert!(allowed.iter().all(|d| !d.contains('*')), "{allowed:?}");
    let families = values(&s, "RestrictAddressFamilies").join(" ");
    for family in ["AF_UNIX", "AF_NETLINK", "AF_INET"] {
        assert!(families.split(' ').any(|f| f == family), "{families}");
    }
    // Exactly the capabilities the manager keeps (it drops the rest itself at start).
    let caps: Vec<&str> = values(&s, "CapabilityBoundingSet")
        .iter()
        .flat_map(|v| v.split(' '))
        .collect();
    let mut kept: Vec<String> = redn_manager::system::KEPT_CAPABILITIES
        .iter()
        .map(ToString::to_string)
        .collect();
    kept.sort();
    let mut caps: Vec<String> = caps.iter().map(|c| (*c).to_owned()).collect();
    caps.sort();
    assert_eq!(caps, kept, "the bounding set is not what the manager keeps");
    assert!(!values(&s, "ExecReload").is_empty(), "no reload on SIGHUP");
    // A RuntimeDirectory= would be removed, sockets and all, when the service stops.
    assert!(values(&s, "RuntimeDirectory").is_empty());
    let install = settings(&service, "Install");
    assert!(values(&install, "WantedBy")
        .iter()
        .any(|v| v.split(' ').any(|t| t == "rdma-hw.target")));
}

#[test]
fn the_sockets_outlive_manager_restarts_with_their_own_modes_and_names() {
    for (name, path, mode, fd_name) in [
        (
            "redn-manager.socket",
            "/run/redn/manager.sock",
            "0660",
            "manager",
        ),
        (
            "redn-manager-admin.socket",
            "/run/redn/admin.sock",
            "0600",
            "admin",
        ),
    ] {
        let text = unit(name);
        let s = settings(&text, "Socket");
        assert_eq!(values(&s, "ListenStream"), [path], "{name}");
        assert_eq!(values(&s, "SocketMode"), [mode], "{name}");
        assert_eq!(values(&s, "FileDescriptorName"), [fd_name], "{name}");
        assert_eq!(values(&s, "Service"), ["redn-manager.service"], "{name}");
        // PartOf= the service would stop the socket with it; RemoveOnStop= would unlink it.
        assert!(
            values(&settings(&text, "Unit"), "PartOf").is_empty(),
            "{name}"
        );
        assert!(values(&s, "RemoveOnStop").is_empty(), "{name}");
    }
    assert_eq!(
        values(
            &settings(&unit("redn-manager.socket"), "Socket"),
            "SocketGroup"
        ),
        ["redn"]
    );
}

#[test]
fn systemd_analyze_verifies_the_units() {
    let Some(mut cmd) = systemd_analyze() else {
        return;
    };
    let dir = staged_units("verify");
    let out = cmd
        .current_dir(&dir)
        .args([
            "verify",
            "--man=no",
            "./redn-manager.service",
            "./redn-manager.socket",
            "./redn-manager-admin.socket",
        ])
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    // Lines about the unit files themselves (verify also reports unrelated system units).
    let ours: Vec<&str> = stderr.lines().filter(|l| l.contains("redn")).collect();
    assert!(out.status.success() && ours.is_empty(), "{stderr}");
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn the_service_rates_ok_in_systemd_analyze_security() {
    let Some(mut cmd) = systemd_analyze() else {
        return;
    };
    let dir = staged_units("security");
    let out = cmd
        .current_dir(&dir)
        .args(["security", "--offline=yes", "./redn-manager.service"])
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    let score: f64 = text
        .lines()
        .find_map(|l| l.split("redn-manager.service: ").nth(1))
        .and_then(|rest| rest.split_whitespace().next())
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("no exposure level in:\n{text}"));
    eprintln!("systemd-analyze security: exposure level {score}");
    assert!(score <= 3.0, "exposure level {score} (goal: 3.0 or better)");
    std::fs::remove_dir_all(&dir).unwrap();
}
