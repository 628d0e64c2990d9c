//! Policy files: parsing, matching apps and clients, and the errors that name what is wrong.

use super::*;
use std::num::NonZeroU64;

const KV: &str = r#"
[[app]]
name = "kv"
uid = 1000
exe = "/usr/bin/kvstore"
offloads = ["hash-get", "list-find"]
max_regions = 4
max_pinned = "1G"
max_queues = 16
max_remote_clients = 64

[app.client]
rate_limit_kbps = 1000000
wqes_per_second = "2M"
wqes_per_invocation = 64
on_violation = "ban"
ban_duration = "1h"
token_lifetime = "1d"
"#;

fn parse(text: &str) -> Result<Policy> {
    parse_policy(text, "policy.toml")
}

/// The error for `text`, checked to name the file, the line and the key.
fn error(text: &str, line: usize, key: &str) -> String {
    let e = parse(text).expect_err(text).to_string();
    let want = format!("policy.toml:{line}:");
    assert!(e.starts_with(&want), "expected {want}: {e}");
    assert!(e.contains(&format!(" {key}: ")), "expected key {key}: {e}");
    e
}

/// KV with `from` replaced by `to` (which must occur).
fn kv_with(from: &str, to: &str) -> String {
    assert!(KV.contains(from), "{from}");
    KV.replacen(from, to, 1)
}

#[test]
fn good_file_parses_to_the_expected_rule() {
    let p = parse(KV).unwrap();
    assert_eq!(
        p.apps(),
        [AppRule {
            name: "kv".into(),
            matchers: Matchers {
                uid: Some(1000),
                gid: None,
                exe: Some("/usr/bin/kvstore".into()),
                cgroup: None,
            },
            offloads: vec!["hash-get".into(), "list-find".into()],
            quota: Quota {
                max_regions: NonZeroU32::new(4).unwrap(),
                max_pinned: ByteSize::new(1 << 30),
                max_queues: NonZeroU32::new(16).unwrap(),
                max_remote_clients: 64,
            },
            keep_serving_after_exit: true,
            remote_sources: None,
            client: ClientLimits {
                rate_limit_kbps: KbitRate::Limited(NonZeroU32::new(1_000_000).unwrap()),
                wqes_per_second: WqeRate::Limited(NonZeroU64::new(2_000_000).unwrap()),
                triggers_per_second: TriggerRate::Unlimited,
                wqes_per_invocation: NonZeroU32::new(64).unwrap(),
                on_violation: OnViolation::Ban(TimeSpan::Finite(Duration::from_secs(3600))),
                token_lifetime: TimeSpan::Finite(Duration::from_secs(86_400)),
                evict_idle_after: DEFAULT_EVICT_IDLE_AFTER,
                evict_held_after: DEFAULT_EVICT_HELD_AFTER,
            },
        }]
    );
    let kv = p.app("kv").unwrap();
    assert!(kv.allows_offload("hash-get"));
    assert!(!kv.allows_offload("echo"));
    assert!(p.app("nope").is_none());
}

#[test]
fn remote_sources_admit_only_their_networks() {
    let p = parse(&kv_with(
        "max_remote_clients = 64\n",
        "max_remote_clients = 64\nremote_sources = [\"10.1.0.0/16\", \"192.0.2.7\", \"2001:db8::/32\"]\n",
    ))
    .unwrap();
    let kv = p.app("kv").unwrap();
    for (ip, admitted) in [
        ("10.1.200.3", true),
        ("10.2.0.1", false),
        ("192.0.2.7", true),
        ("192.0.2.8", false),
        ("2001:db8:5::1", true),
        ("2001:db9::1", false),
        ("::ffff:10.1.0.9", true),
    ] {
        assert_eq!(kv.admits_source(ip.parse().unwrap()), admitted, "{ip}");
    }
    let any = parse(KV).unwrap();
    assert!(any
        .app("kv")
        .unwrap()
        .admits_source("203.0.113.9".parse().unwrap()));
    let none = parse(&kv_with(
        "max_remote_clients = 64\n",
        "max_remote_clients = 64\nremote_sources = []\n",
    ))
    .unwrap();
    assert!(!none
        .app("kv")
        .unwrap()
        .admits_source("10.1.0.1".parse().unwrap()));
    let everywhere: SourceNet = "0.0.0.0/0".parse().unwrap();
    assert!(everywhere.contains("8.8.8.8".parse().unwrap()));
    for (bad, why) in [
        ("\"10.0.0.1/33\"", "prefix must be a number 0..=32"),
        ("\"10.0.0.1/8\"", "host bits set past /8"),
        ("\"db.example\"", "not an IPv4 or IPv6 address"),
    ] {
        let e = parse(&kv_with(
            "max_remote_clients = 64\n",
            &format!("max_remote_clients = 64\nremote_sources = [\"10.0.0.0/8\", {bad}]\n"),
        ))
        .unwrap_err()
        .to_string();
        assert!(e.contains("remote_sources[1]") && e.contains(why), "{e}");
    }
}

#[test]
fn defaults_and_other_violations() {
    let text = kv_with(
        "on_violation = \"ban\"\nban_duration = \"1h\"\ntoken_lifetime = \"1d\"\n",
        "on_violation = \"throttle\"\n",
    );
    let text = text.replace("max_remote_clients = 64", "max_remote_clients = 0");
    let p = parse(&text).unwrap();
    let kv = &p.apps()[0];
    assert_eq!(kv.client.on_violation, OnViolation::Throttle);
    assert_eq!(kv.client.token_lifetime, DEFAULT_TOKEN_LIFETIME);
    assert_eq!(kv.client.evict_idle_after, DEFAULT_EVICT_IDLE_AFTER);
    assert_eq!(kv.client.evict_held_after, DEFAULT_EVICT_HELD_AFTER);
    assert_eq!(kv.quota.max_remote_clients, 0);
    let p = parse(&kv_with(
        "on_violation = \"ban\"\nban_duration = \"1h\"",
        "on_violation = \"terminate\"",
    ))
    .unwrap();
    assert_eq!(p.apps()[0].client.on_violation, OnViolation::Terminate);
    let p = parse(&kv_with("\"1h\"", "\"infinity\"")).unwrap();
    assert_eq!(
        p.apps()[0].client.on_violation,
        OnViolation::Ban(TimeSpan::Infinite)
    );
    let p = parse(&kv_with(
        "max_remote_clients = 64",
        "max_remote_clients = 64\nkeep_serving_after_exit = false",
    ))
    .unwrap();
    assert!(!p.apps()[0].keep_serving_after_exit);
    assert_eq!(parse("").unwrap(), Policy::default());
    assert_eq!(parse("# nobody\n").unwrap().apps().len(), 0);
}

#[test]
fn missing_ban_duration() {
    let e = error(
        &kv_with("ban_duration = \"1h\"\n", ""),
        16,
        "app \"kv\" client.on_violation",
    );
    assert!(
        e.ends_with("\"ban\" requires ban_duration (such as \"1h\", or \"infinity\")"),
        "{e}"
    );
    let e = error(
        &kv_with("\"ban\"", "\"terminate\""),
        17,
        "app \"kv\" client.ban_duration",
    );
    assert!(e.contains("only used with on_violation = \"ban\""), "{e}");
    error(
        &kv_with("\"1h\"", "\"0s\""),
        17,
        "app \"kv\" client.ban_duration",
    );
}

#[test]
fn unknown_keys_are_refused() {
    let e = error(
        &kv_with("max_queues", "max_cpus = 1\nmax_queues"),
        9,
        "app \"kv\" max_cpus",
    );
    assert!(e.contains("unknown key"), "{e}");
    error(
        &kv_with("wqes_per_second", "burst = 1\nwqes_per_second"),
        14,
        "app \"kv\" client.burst",
    );
    error(&format!("version = 1\n{KV}"), 1, "version");
}

#[test]
fn wrong_types_are_refused() {
    let e = error(
        &kv_with("uid = 1000", "uid = \"alice\""),
        4,
        "app \"kv\" uid",
    );
    assert!(e.contains("invalid type: string \"alice\""), "{e}");
    error(&kv_with("uid = 1000", "uid = -1"), 4, "app \"kv\" uid");
    error(
        &kv_with("max_queues = 16", "max_queues = \"16\""),
        9,
        "app \"kv\" max_queues",
    );
    error(
        &kv_with("[\"hash-get\", \"list-find\"]", "\"hash-get\""),
        6,
        "app \"kv\" offloads",
    );
    error(
        &kv_with("on_violation = \"ban\"", "on_violation = \"kill\""),
        16,
        "app \"kv\" client.on_violation",
    );
    error(
        &kv_with(
            "max_remote_clients = 64",
            "max_remote_clients = 64\nkeep_serving_after_exit = \"yes\"",
        ),
        11,
        "app \"kv\" keep_serving_after_exit",
    );
}

#[test]
fn triggers_per_second_is_optional_decimal_and_never_zero() {
    let with = |v: &str| {
        kv_with(
            "wqes_per_invocation",
            &format!("triggers_per_second = {v}\nwqes_per_invocation"),
        )
    };
    let rate = |text: &str| parse(text).unwrap().apps()[0].client.triggers_per_second;
    assert_eq!(rate(KV), TriggerRate::Unlimited, "the default");
    assert_eq!(
        rate(&with("\"50k\"")),
        TriggerRate::Limited(NonZeroU64::new(50_000).unwrap())
    );
    assert_eq!(
        rate(&with("7")),
        TriggerRate::Limited(NonZeroU64::new(7).unwrap())
    );
    assert_eq!(rate(&with("\"infinity\"")), TriggerRate::Unlimited);
    let e = error(&with("0"), 15, "app \"kv\" client.triggers_per_second");
    assert!(
        e.contains("invalid trigger rate \"0\"") && e.contains("\"infinity\""),
        "{e}"
    );
    let e = error(
        &with("\"5 Hz\""),
        15,
        "app \"kv\" client.triggers_per_second",
    );
    assert!(e.contains("invalid trigger rate \"5 Hz\""), "{e}");
    error(&with("-3"), 15, "app \"kv\" client.triggers_per_second");
    assert_eq!(
        TriggerRate::Limited(NonZeroU64::new(9).unwrap()).to_string(),
        "9"
    );
}

#[test]
fn bad_units_are_refused() {
    let e = error(&kv_with("\"1G\"", "\"1GB\""), 8, "app \"kv\" max_pinned");
    assert!(e.contains("invalid size \"1GB\": ambiguous unit"), "{e}");
    let e = error(
        &kv_with("\"2M\"", "\"2Mi\""),
        14,
        "app \"kv\" client.wqes_per_second",
    );
    assert!(e.contains("invalid WQE rate \"2Mi\""), "{e}");
    let e = error(
        &kv_with("1000000", "0"),
        13,
        "app \"kv\" client.rate_limit_kbps",
    );
    assert!(e.contains("write \"infinity\" for no limit"), "{e}");
    let e = error(
        &kv_with("\"1d\"", "\"1 fortnight\""),
        18,
        "app \"kv\" client.token_lifetime",
    );
    assert!(e.contains("invalid duration \"1 fortnight\""), "{e}");
    error(
        &kv_with("\"1d\"", "\"0s\""),
        18,
        "app \"kv\" client.token_lifetime",
    );
}

#[test]
fn evict_idle_after_takes_a_span_or_infinity_and_never_zero() {
    let with = |v: &str| {
        kv_with(
            "token_lifetime = \"1d\"\n",
            &format!("token_lifetime = \"1d\"\nevict_idle_after = {v}\n"),
        )
    };
    let p = parse(&with("\"90s\"")).unwrap();
    assert_eq!(
        p.apps()[0].client.evict_idle_after,
        TimeSpan::Finite(Duration::from_secs(90))
    );
    let p = parse(&with("\"infinity\"")).unwrap();
    assert_eq!(p.apps()[0].client.evict_idle_after, TimeSpan::Infinite);
    let e = error(&with("\"0s\""), 19, "app \"kv\" client.evict_idle_after");
    assert!(e.contains("use \"infinity\" to never release one"), "{e}");
    let e = error(&with("\"soon\""), 19, "app \"kv\" client.evict_idle_after");
    assert!(e.contains("invalid duration \"soon\""), "{e}");
}

#[test]
fn evict_held_after_takes_a_span_or_infinity_and_never_zero() {
    let with = |v: &str| {
        kv_with(
            "token_lifetime = \"1d\"\n",
            &format!("token_lifetime = \"1d\"\nevict_held_after = {v}\n"),
        )
    };
    let p = parse(&with("\"30m\"")).unwrap();
    assert_eq!(
        p.apps()[0].client.evict_held_after,
        TimeSpan::Finite(Duration::from_secs(1800))
    );
    let p = parse(&with("\"infinity\"")).unwrap();
    assert_eq!(p.apps()[0].client.evict_held_after, TimeSpan::Infinite);
    let e = error(&with("\"0s\""), 19, "app \"kv\" client.evict_held_after");
    assert!(
        e.contains("use \"infinity\" to never release a busy client"),
        "{e}"
    );
    let e = error(&with("\"soon\""), 19, "app \"kv\" client.evict_held_after");
    assert!(e.contains("invalid duration \"soon\""), "{e}");
}

#[test]
fn ranges_are_checked() {
    for (from, to, line, key) in [
        (
            "max_regions = 4",
            "max_regions = 0",
            7,
            "app \"kv\" max_regions",
        ),
        (
            "max_queues = 16",
            "max_queues = 0",
            9,
            "app \"kv\" max_queues",
        ),
        ("\"1G\"", "0", 8, "app \"kv\" max_pinned"),
        (
            "wqes_per_invocation = 64",
            "wqes_per_invocation = 0",
            15,
            "app \"kv\" client.wqes_per_invocation",
        ),
        (
            "max_queues = 16",
            "max_queues = 4294967296",
            9,
            "app \"kv\" max_queues",
        ),
        ("uid = 1000", "uid = 4294967295", 4, "app \"kv\" uid"),
    ] {
        error(&kv_with(from, to), line, key);
    }
}

#[test]
fn duplicate_apps_are_refused() {
    let other = KV.replace("uid = 1000", "uid = 1001");
    let e = error(&format!("{KV}{other}"), 21, "app \"kv\" name");
    assert!(
        e.ends_with("the name \"kv\" is already used by another app (line 2)"),
        "{e}"
    );
}

#[test]
fn duplicate_offloads_are_refused() {
    let e = error(
        &kv_with("\"list-find\"]", "\"hash-get\"]"),
        6,
        "app \"kv\" offloads[1]",
    );
    assert!(e.contains("\"hash-get\" is listed twice"), "{e}");
}

#[test]
fn an_app_needs_a_matcher() {
    let e = error(
        &kv_with("uid = 1000\nexe = \"/usr/bin/kvstore\"\n", ""),
        2,
        "app \"kv\"",
    );
    assert!(
        e.contains("no matcher: give at least one of uid, gid, exe or cgroup"),
        "{e}"
    );
    assert!(e.contains("every local process"), "{e}");
}

#[test]
fn bad_names_and_paths_are_refused() {
    error(
        &kv_with("name = \"kv\"", "name = \"k v\""),
        3,
        "app \"k v\" name",
    );
    error(&kv_with("name = \"kv\"", "name = \"\""), 3, "app \"\" name");
    error(&kv_with("name = \"kv\"", "name = 7"), 3, "app[0].name");
    let e = error(
        &kv_with("\"list-find\"", "\"../etc\""),
        6,
        "app \"kv\" offloads",
    );
    assert!(e.contains("invalid name \"../etc\""), "{e}");
    let e = error(&kv_with("/usr/bin/kvstore", "kvstore"), 5, "app \"kv\" exe");
    assert!(e.contains("invalid path \"kvstore\""), "{e}");
    error(
        &kv_with("/usr/bin/kvstore", "/usr/bin/../bin/kvstore"),
        5,
        "app \"kv\" exe",
    );
    error(
        &kv_with("uid = 1000", "cgroup = \"/system.slice/\""),
        4,
        "app \"kv\" cgroup",
    );
    let p = parse(&kv_with("uid = 1000", "cgroup = \"/\"")).unwrap();
    assert_eq!(p.apps()[0].matchers.cgroup.as_deref(), Some("/"));
}

#[test]
fn missing_required_keys_are_named() {
    let e = error(
        &kv_with("max_queues = 16\n", ""),
        2,
        "app \"kv\" max_queues",
    );
    assert!(e.contains("required"), "{e}");
    let e = error(
        &kv_with("wqes_per_invocation = 64\n", ""),
        12,
        "app \"kv\" client.wqes_per_invocation",
    );
    assert!(e.contains("required"), "{e}");
}

#[test]
fn oversize_files_are_refused() {
    let dir = std::env::temp_dir().join(format!("redn-policy-policy-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("policy.toml");
    let mut text = KV.to_owned();
    while text.len() as u64 <= crate::source::MAX_FILE_BYTES {
        text.push_str("# padding padding padding padding padding padding padding padding\n");
    }
    std::fs::write(&path, &text).unwrap();
    let e = load_policy(&path).unwrap_err().to_string();
    assert!(
        e.contains("policy.toml: larger than the 1048576-byte limit"),
        "{e}"
    );
    let e = parse(&text).unwrap_err().to_string();
    assert!(e.starts_with("policy.toml: larger than"), "{e}");
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn shipped_example_parses() {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../etc/redn/policy.toml");
    let p = load_policy(&path).unwrap();
    assert!(p.apps().len() >= 2, "{p:?}");
    for app in p.apps() {
        assert!(!app.matchers.is_empty());
    }
}

/// Which rule [`Policy::match_app`] picks (the order is described in `identity`).
mod matching {
    use super::*;
    use crate::identity::tests::peer;

    /// A policy with one app per `(name, matchers)`, all else minimal.
    fn policy(apps: &[(&str, &str)]) -> Result<Policy> {
        let mut text = String::new();
        for (name, matchers) in apps {
            text.push_str(&format!(
                "[[app]]\nname = \"{name}\"\n{matchers}\noffloads = []\nmax_regions = 1\n\
                 max_pinned = \"1M\"\nmax_queues = 1\nmax_remote_clients = 0\n[app.client]\n\
                 rate_limit_kbps = 1000\nwqes_per_second = 1000\nwqes_per_invocation = 8\n\
                 on_violation = \"terminate\"\n\n"
            ));
        }
        parse_policy(&text, "policy.toml")
    }

    fn chosen<'p>(p: &'p Policy, who: &PeerIdentity) -> Option<&'p str> {
        p.match_app(who).map(|a| a.name.as_str())
    }

    #[test]
    fn all_matchers_must_match() {
        let p = policy(&[("kv", "uid = 1000\nexe = \"/usr/bin/kv\"")]).unwrap();
        assert_eq!(
            chosen(&p, &peer(1000, 1000, "/usr/bin/kv", "/")),
            Some("kv")
        );
        assert_eq!(chosen(&p, &peer(1001, 1000, "/usr/bin/kv", "/")), None);
        assert_eq!(chosen(&p, &peer(1000, 1000, "/usr/bin/kv2", "/")), None);
    }

    #[test]
    fn precedence_exe_over_cgroup_over_uid_over_gid() {
        let p = policy(&[
            ("by-gid", "gid = 100"),
            ("by-uid", "uid = 1000"),
            ("by-cgroup", "cgroup = \"/system.slice\""),
            ("by-exe", "exe = \"/usr/bin/kv\""),
        ])
        .unwrap();
        let sys = "/system.slice/kv.service";
        assert_eq!(
            chosen(&p, &peer(1000, 100, "/usr/bin/kv", sys)),
            Some("by-exe")
        );
        assert_eq!(
            chosen(&p, &peer(1000, 100, "/usr/bin/other", sys)),
            Some("by-cgroup")
        );
        assert_eq!(
            chosen(&p, &peer(1000, 100, "/usr/bin/other", "/user.slice")),
            Some("by-uid")
        );
        assert_eq!(
            chosen(&p, &peer(1, 100, "/usr/bin/other", "/user.slice")),
            Some("by-gid")
        );
        assert_eq!(
            chosen(&p, &peer(1, 1, "/usr/bin/other", "/user.slice")),
            None
        );
    }

    #[test]
    fn scores_add_up() {
        // cgroup + uid + gid (7) still loses to exe alone (8); uid + gid (3) beats uid (2).
        let p = policy(&[
            ("wide", "cgroup = \"/\"\nuid = 0\ngid = 0"),
            ("exe", "exe = \"/usr/sbin/kvd\""),
            ("uid", "uid = 7"),
            ("uid-gid", "uid = 7\ngid = 7"),
        ])
        .unwrap();
        assert_eq!(chosen(&p, &peer(0, 0, "/usr/sbin/kvd", "/a")), Some("exe"));
        assert_eq!(
            chosen(&p, &peer(0, 0, "/usr/sbin/other", "/a")),
            Some("wide")
        );
        assert_eq!(chosen(&p, &peer(7, 7, "/x", "/a")), Some("uid-gid"));
        assert_eq!(chosen(&p, &peer(7, 8, "/x", "/a")), Some("uid"));
    }

    #[test]
    fn longer_cgroup_prefix_wins_on_equal_scores() {
        let p = policy(&[
            ("slice", "cgroup = \"/system.slice\""),
            ("service", "cgroup = \"/system.slice/kv.service\""),
            ("root", "cgroup = \"/\""),
        ])
        .unwrap();
        assert_eq!(
            chosen(&p, &peer(0, 0, "/x", "/system.slice/kv.service/w")),
            Some("service")
        );
        assert_eq!(
            chosen(&p, &peer(0, 0, "/x", "/system.slice/kv.service")),
            Some("service")
        );
        assert_eq!(
            chosen(&p, &peer(0, 0, "/x", "/system.slice/kv.service2")),
            Some("slice")
        );
        assert_eq!(chosen(&p, &peer(0, 0, "/x", "/user.slice")), Some("root"));
        // Order in the file does not matter.
        let q = policy(&[
            ("root", "cgroup = \"/\""),
            ("service", "cgroup = \"/system.slice/kv.service\""),
            ("slice", "cgroup = \"/system.slice\""),
        ])
        .unwrap();
        for cg in [
            "/system.slice/kv.service/w",
            "/system.slice/x",
            "/user.slice",
        ] {
            let who = peer(0, 0, "/x", cg);
            assert_eq!(chosen(&p, &who), chosen(&q, &who), "{cg}");
        }
    }

    #[test]
    fn equally_specific_overlapping_rules_are_refused() {
        let e = policy(&[("a", "uid = 1000"), ("b", "uid = 1000")])
            .unwrap_err()
            .to_string();
        assert!(e.starts_with("policy.toml:15:1: app \"b\": "), "{e}");
        assert!(e.contains("same matchers as app \"a\" (line 1)"), "{e}");
        let e = policy(&[
            ("a", "uid = 1\ncgroup = \"/s\""),
            ("b", "cgroup = \"/s\"\nuid = 1"),
        ])
        .unwrap_err()
        .to_string();
        assert!(e.contains("same matchers"), "{e}");
        // Equal scores that cannot match the same peer are fine.
        policy(&[("a", "uid = 1000"), ("b", "uid = 1001")]).unwrap();
        policy(&[("a", "cgroup = \"/s/a\""), ("b", "cgroup = \"/s/b\"")]).unwrap();
    }
}
