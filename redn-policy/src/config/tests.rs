//! The manager's configuration: parsing, defaults, bounds and the errors that name the key.

use super::*;

fn parse(text: &str) -> Result<ManagerConfig> {
    parse_manager_config(text, "manager.toml")
}

/// The error for `text`, checked to name the file, the line and the key.
fn error(text: &str, line: usize, key: &str) -> String {
    let e = parse(text).expect_err(text).to_string();
    let want = format!("manager.toml:{line}:");
    assert!(e.starts_with(&want), "expected {want}: {e}");
    assert!(e.contains(&format!(": {key}: ")), "expected key {key}: {e}");
    e
}

#[test]
fn minimal_softnic_gets_the_defaults() {
    let c = parse("[backend]\nkind = \"softnic\"\n").unwrap();
    assert_eq!(
        c,
        ManagerConfig {
            api: SocketConfig {
                path: DEFAULT_API_SOCKET.into(),
                mode: FileMode(0o660),
                group: None,
            },
            admin: SocketConfig {
                path: DEFAULT_ADMIN_SOCKET.into(),
                mode: FileMode(0o600),
                group: None,
            },
            backend: Backend::SoftNic {
                pus: 1,
                prefetch: Prefetch::Depth(NonZeroU32::new(8).unwrap()),
                pu_cpus: Vec::new(),
            },
            dataplane: Dataplane { listen: None },
            audit: AuditConfig {
                socket: "/dev/log".into(),
                facility: Facility::AuthPriv,
                identifier: "redn-manager".into(),
            },
        }
    );
}

#[test]
fn full_mlx5_file() {
    let c = parse(
        r#"
[api]
socket = "/run/redn/apps.sock"
mode = "660"
group = "redn"

[admin]
socket = "/run/redn/admin.sock"
mode = "0640"
group = "wheel"

[backend]
kind = "mlx5"
pci_address = "0000:3b:00.1"

[dataplane]
listen = "[2001:db8::1]:7471"

[audit]
socket = "/run/systemd/journal/dev-log"
facility = "local3"
identifier = "redn"
"#,
    )
    .unwrap();
    assert_eq!(c.api.path, PathBuf::from("/run/redn/apps.sock"));
    assert_eq!(c.api.mode.bits(), 0o660);
    assert_eq!(c.api.group.as_deref(), Some("redn"));
    assert_eq!(c.admin.mode.bits(), 0o640);
    assert_eq!(c.admin.group.as_deref(), Some("wheel"));
    let Backend::Mlx5 {
        device: DeviceSelector::PciAddress(pci),
    } = c.backend
    else {
        panic!("{:?}", c.backend)
    };
    assert_eq!(
        (pci.domain(), pci.bus(), pci.device(), pci.function()),
        (0, 0x3b, 0, 1)
    );
    assert_eq!(
        c.dataplane.listen,
        Some("[2001:db8::1]:7471".parse().unwrap())
    );
    assert_eq!(c.audit.facility, Facility::Local3);
    assert_eq!(c.audit.facility.code(), 19);
    assert_eq!(c.audit.identifier, "redn");
}

#[test]
fn device_selectors() {
    let dev = |sel: &str| match parse(&format!("[backend]\nkind = \"mlx5\"\n{sel}\n"))
        .unwrap()
        .backend
    {
        Backend::Mlx5 { device } => device,
        other => panic!("{other:?}"),
    };
    assert_eq!(dev("device = \"auto\""), DeviceSelector::Auto);
    assert_eq!(
        dev("device = \"rocep59s0f0\""),
        DeviceSelector::Name("rocep59s0f0".into())
    );
    let guid = "0002:c903:00a1:b2c3".parse().unwrap();
    assert_eq!(
        dev("node_guid = \"0002:c903:00a1:b2c3\""),
        DeviceSelector::NodeGuid(guid)
    );
    assert_eq!(
        dev("node_guid = \"0x2c90300a1b2c3\""),
        DeviceSelector::NodeGuid(guid)
    );
    assert_eq!(guid.to_string(), "0002:c903:00a1:b2c3");
    assert_eq!(guid.get(), 0x0002_c903_00a1_b2c3);
    let pci = dev("pci_address = \"3b:00.0\"");
    assert_eq!(
        pci,
        DeviceSelector::PciAddress("0000:3b:00.0".parse().unwrap())
    );
}

#[test]
fn softnic_settings() {
    let c = parse("[backend]\nkind = \"softnic\"\npus = 64\nprefetch = \"adversarial\"\n").unwrap();
    assert_eq!(
        c.backend,
        Backend::SoftNic {
            pus: 64,
            prefetch: Prefetch::Adversarial,
            pu_cpus: Vec::new(),
        }
    );
    let c = parse("[backend]\nkind = \"softnic\"\npus = 2\npu_cpus = [3, 1023]\n").unwrap();
    assert_eq!(
        c.backend,
        Backend::SoftNic {
            pus: 2,
            prefetch: Prefetch::default(),
            pu_cpus: vec![3, 1023],
        }
    );
    let c = parse("[backend]\nkind = \"softnic\"\npus = 2\npu_cpus = []\n").unwrap();
    assert!(
        matches!(c.backend, Backend::SoftNic { ref pu_cpus, .. } if pu_cpus.is_empty()),
        "an empty list pins nothing"
    );
    for (text, p) in [
        ("at-execute", Prefetch::AtExecute),
        ("depth:1", Prefetch::Depth(NonZeroU32::MIN)),
        ("adversarial", Prefetch::Adversarial),
    ] {
        assert_eq!(text.parse::<Prefetch>().unwrap(), p);
        assert_eq!(p.to_string(), text);
    }
    assert_eq!(
        Prefetch::default(),
        Prefetch::Depth(NonZeroU32::new(8).unwrap())
    );
}

#[test]
fn two_device_selectors_are_refused() {
    let e = error(
        "[backend]\nkind = \"mlx5\"\ndevice = \"mlx5_0\"\npci_address = \"0000:3b:00.0\"\n",
        4,
        "backend.pci_address",
    );
    assert!(e.contains("device is also set"), "{e}");
}

#[test]
fn mlx5_needs_a_selector() {
    let e = error("[backend]\nkind = \"mlx5\"\n", 2, "backend.kind");
    assert!(e.contains("never assumes mlx5_0"), "{e}");
}

#[test]
fn backend_keys_must_fit_the_kind() {
    error(
        "[backend]\nkind = \"softnic\"\ndevice = \"auto\"\n",
        3,
        "backend.device",
    );
    error(
        "[backend]\nkind = \"mlx5\"\ndevice = \"auto\"\npus = 2\n",
        4,
        "backend.pus",
    );
    error(
        "[backend]\nkind = \"mlx5\"\ndevice = \"auto\"\npu_cpus = [0]\n",
        4,
        "backend.pu_cpus",
    );
    for (cpus, why) in [
        ("[0]", "1 CPUs for 2 processing units"),
        ("[0, 1, 2]", "3 CPUs for 2 processing units"),
        ("[1, 1]", "CPU 1 is listed twice"),
        ("[0, 1024]", "CPU 1024 is outside 0..=1023"),
    ] {
        let e = error(
            &format!("[backend]\nkind = \"softnic\"\npus = 2\npu_cpus = {cpus}\n"),
            4,
            "backend.pu_cpus",
        );
        assert!(e.contains(why), "{cpus}: {e}");
    }
    let e = parse("[backend]\nkind = \"softnic\"\npus = 2\npu_cpus = [0, -1]\n")
        .unwrap_err()
        .to_string();
    assert!(e.starts_with("manager.toml:4:"), "{e}");
    assert!(
        e.contains("backend.pu_cpus[1]: invalid value: integer `-1`"),
        "{e}"
    );
    let e = error("[backend]\nkind = \"softnic\"\npus = 0\n", 3, "backend.pus");
    assert!(e.contains("outside 1..=64"), "{e}");
    error(
        "[backend]\nkind = \"softnic\"\npus = 65\n",
        3,
        "backend.pus",
    );
    error(
        "[backend]\nkind = \"softnic\"\npus = -1\n",
        3,
        "backend.pus",
    );
    let e = error(
        "[backend]\nkind = \"softnic\"\nprefetch = \"depth:0\"\n",
        3,
        "backend.prefetch",
    );
    assert!(e.contains("invalid prefetch \"depth:0\""), "{e}");
    let e = error("[backend]\nkind = \"rxe\"\n", 2, "backend.kind");
    assert!(e.contains("`softnic`"), "{e}");
    let e = error(
        "[backend]\nkind = \"mlx5\"\nnode_guid = \"0000:0000:0000:0000\"\n",
        3,
        "backend.node_guid",
    );
    assert!(e.contains("zero GUID"), "{e}");
    error(
        "[backend]\nkind = \"mlx5\"\nnode_guid = \"2:c903:a1:b2c3\"\n",
        3,
        "backend.node_guid",
    );
    let e = error(
        "[backend]\nkind = \"mlx5\"\npci_address = \"0000:3b:20.0\"\n",
        3,
        "backend.pci_address",
    );
    assert!(e.contains("invalid PCI address \"0000:3b:20.0\""), "{e}");
    error(
        "[backend]\nkind = \"mlx5\"\npci_address = \"3b:00.8\"\n",
        3,
        "backend.pci_address",
    );
    error(
        "[backend]\nkind = \"mlx5\"\ndevice = \"../x\"\n",
        3,
        "backend.device",
    );
}

#[test]
fn missing_backend_is_refused() {
    let e = parse("[api]\nmode = \"0660\"\n").unwrap_err().to_string();
    assert!(e.starts_with("manager.toml:"), "{e}");
    assert!(e.contains("backend: this key is required"), "{e}");
}

#[test]
fn invalid_modes_are_refused() {
    let sn = "[backend]\nkind = \"softnic\"\n";
    let e = error(&format!("{sn}[api]\nmode = \"rw-rw----\"\n"), 4, "api.mode");
    assert!(e.contains("invalid mode \"rw-rw----\""), "{e}");
    let e = error(&format!("{sn}[api]\nmode = 0660\n"), 4, "api.mode");
    assert!(e.contains("leading zero"), "{e}");
    let e = error(&format!("{sn}[api]\nmode = 660\n"), 4, "api.mode");
    assert!(e.contains("quoted octal string"), "{e}");
    let e = error(&format!("{sn}[api]\nmode = 0o660\n"), 4, "api.mode");
    assert!(e.contains("quoted octal string"), "{e}");
    error(&format!("{sn}[api]\nmode = \"0668\"\n"), 4, "api.mode");
    let e = error(&format!("{sn}[api]\nmode = \"4660\"\n"), 4, "api.mode");
    assert!(e.contains("setuid"), "{e}");
    let e = error(&format!("{sn}[admin]\nmode = \"0666\"\n"), 4, "admin.mode");
    assert!(e.contains("every user"), "{e}");
}

#[test]
fn socket_checks() {
    let sn = "[backend]\nkind = \"softnic\"\n";
    let e = error(
        &format!("{sn}[api]\nsocket = \"run/x.sock\"\n"),
        4,
        "api.socket",
    );
    assert!(e.contains("must be absolute"), "{e}");
    let long = format!("/{}", "x".repeat(107));
    let e = error(
        &format!("{sn}[api]\nsocket = \"{long}\"\n"),
        4,
        "api.socket",
    );
    assert!(e.contains("at most 107"), "{e}");
    let e = error(
        &format!("{sn}[admin]\nsocket = \"/run/redn/manager.sock\"\n"),
        4,
        "admin.socket",
    );
    assert!(e.contains("also the app socket"), "{e}");
    error(&format!("{sn}[api]\ngroup = \"-x\"\n"), 4, "api.group");
    error(
        &format!("{sn}[api]\ngroup = \"4294967295\"\n"),
        4,
        "api.group",
    );
    let c = parse(&format!("{sn}[api]\ngroup = \"1001\"\n")).unwrap();
    assert_eq!(c.api.group.as_deref(), Some("1001"));
}

#[test]
fn bad_listen_addresses_are_refused() {
    let sn = "[backend]\nkind = \"softnic\"\n";
    for bad in [
        "localhost:7471",
        "0.0.0.0",
        "10.0.0.1:99999",
        "[::1]:0",
        "::1:7471",
    ] {
        let e = error(
            &format!("{sn}[dataplane]\nlisten = \"{bad}\"\n"),
            4,
            "dataplane.listen",
        );
        assert!(
            e.contains(&format!("invalid listen address {bad:?}")),
            "{e}"
        );
    }
    error(
        &format!("{sn}[dataplane]\nlisten = 7471\n"),
        4,
        "dataplane.listen",
    );
}

/// The softnic speaks RoCEv2 over IPv4 only: an IPv6 data plane is refused when the file is
/// loaded (so `--check` says so), not when the manager starts; a ConnectX may have one.
#[test]
fn an_ipv6_data_plane_is_refused_for_the_softnic_only() {
    let v6 = "[dataplane]\nlisten = \"[2001:db8::1]:7471\"\n";
    let e = error(
        &format!("[backend]\nkind = \"softnic\"\n{v6}"),
        4,
        "dataplane.listen",
    );
    assert!(e.contains("IPv4 only"), "{e}");
    let c = parse(&format!(
        "[backend]\nkind = \"mlx5\"\ndevice = \"auto\"\n{v6}"
    ))
    .unwrap();
    assert!(c.dataplane.listen.is_some_and(|a| a.is_ipv6()));
    let c = parse("[backend]\nkind = \"softnic\"\n[dataplane]\nlisten = \"192.0.2.10:7471\"\n");
    assert!(c.unwrap().dataplane.listen.is_some_and(|a| a.is_ipv4()));
}

#[test]
fn audit_checks() {
    let sn = "[backend]\nkind = \"softnic\"\n";
    let e = error(
        &format!("{sn}[audit]\nfacility = \"kern\"\n"),
        4,
        "audit.facility",
    );
    assert!(e.contains("`authpriv`"), "{e}");
    error(
        &format!("{sn}[audit]\nidentifier = \"redn manager\"\n"),
        4,
        "audit.identifier",
    );
    error(
        &format!("{sn}[audit]\nidentifier = \"\"\n"),
        4,
        "audit.identifier",
    );
    for (name, f) in [
        ("daemon", Facility::Daemon),
        ("auth", Facility::Auth),
        ("local7", Facility::Local7),
    ] {
        let c = parse(&format!("{sn}[audit]\nfacility = \"{name}\"\n")).unwrap();
        assert_eq!(c.audit.facility, f);
        assert_eq!(f.to_string(), name);
    }
}

#[test]
fn unknown_keys_and_wrong_types_are_refused() {
    let e = error(
        "[backend]\nkind = \"softnic\"\nthreads = 4\n",
        3,
        "backend.threads",
    );
    assert!(e.contains("unknown key"), "{e}");
    error("[backend]\nkind = \"softnic\"\n[apis]\n", 3, "apis");
    let e = error(
        "[backend]\nkind = \"softnic\"\npus = \"four\"\n",
        3,
        "backend.pus",
    );
    assert!(e.contains("invalid type"), "{e}");
    error(
        "[backend]\nkind = \"softnic\"\n[api]\nsocket = 5\n",
        4,
        "api.socket",
    );
}

#[test]
fn shipped_example_parses() {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../etc/redn/manager.toml");
    let c = load_manager_config(&path).unwrap();
    assert_eq!(c.api.path, PathBuf::from(DEFAULT_API_SOCKET));
    assert_eq!(c.api.group.as_deref(), Some("redn"));
    assert_eq!(c.admin.mode, DEFAULT_ADMIN_MODE);
    assert_eq!(c.audit.facility, Facility::AuthPriv);
    assert!(
        matches!(c.backend, Backend::SoftNic { .. }),
        "{:?}",
        c.backend
    );
}
