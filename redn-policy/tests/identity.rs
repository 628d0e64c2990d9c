//! Which app rule a local peer gets: numeric uid and gid rules match exactly that id. Root
//! (uid 0) and group 0 are ids like any other here, never wildcards.

use redn_policy::{parse_policy, Matchers, PeerIdentity, Policy};

fn peer(uid: u32, gid: u32) -> PeerIdentity {
    PeerIdentity {
        uid,
        gid,
        pid: 4242,
        exe: "/usr/bin/kv".into(),
        cgroup: "/system.slice/kv.service".into(),
        start_time: 1,
    }
}

/// A policy with one app per `(name, matchers)`, all else minimal.
fn policy(apps: &[(&str, &str)]) -> Policy {
    let mut text = String::new();
    for (name, matchers) in apps {
        text.push_str(&format!(
            "[[app]]\nname = \"{name}\"\n{matchers}\noffloads = []\nmax_regions = 1\n\
             max_pinned = \"1M\"\nmax_queues = 1\nmax_remote_clients = 0\n[app.client]\n\
             rate_limit_kbps = 1000\nwqes_per_second = 1000\nwqes_per_invocation = 8\n\
             on_violation = \"terminate\"\n\n"
        ));
    }
    parse_policy(&text, "policy.toml").unwrap_or_else(|e| panic!("{e}\n{text}"))
}

fn chosen(p: &Policy, who: &PeerIdentity) -> Option<String> {
    p.match_app(who).map(|a| a.name.clone())
}

/// Ids a rule may name, and ids a peer may have (`u32::MAX` is "no id", which a policy
/// refuses as a rule but a peer could still report).
const RULE_IDS: [u32; 5] = [0, 1, 100, 1000, 65534];
const PEER_IDS: [u32; 6] = [0, 1, 100, 1000, 65534, u32::MAX];

/// A rule with only the matcher `key` (`uid` or `gid`) set to each of [`RULE_IDS`], both as
/// `Matchers` and in a loaded policy, matches a peer exactly when the peer's id of that kind
/// (`peer(id, other)` puts it in place) is the rule's, whatever the peer's other id.
fn id_rule_matches_exactly(key: &str, peer: fn(u32, u32) -> PeerIdentity) {
    for rule in RULE_IDS {
        let mut m = Matchers::default();
        match key {
            "uid" => m.uid = Some(rule),
            _ => m.gid = Some(rule),
        }
        let p = policy(&[("app", &format!("{key} = {rule}"))]);
        for id in PEER_IDS {
            for other in [0, 1000] {
                let who = peer(id, other);
                let what = format!("{key} rule {rule}, peer {who:?}");
                assert_eq!(m.matches(&who), rule == id, "{what}");
                assert_eq!(chosen(&p, &who).is_some(), rule == id, "{what}");
            }
        }
    }
}

#[test]
fn a_gid_rule_matches_exactly_its_gid_group_0_included() {
    id_rule_matches_exactly("gid", |gid, uid| peer(uid, gid));
}

#[test]
fn a_uid_rule_matches_exactly_its_uid_root_included() {
    id_rule_matches_exactly("uid", peer);
}

#[test]
fn root_and_group_0_get_only_the_rules_naming_them() {
    let p = policy(&[
        ("alice", "uid = 1000"),
        ("staff", "gid = 50"),
        ("alice-staff", "uid = 1000\ngid = 50"),
        ("root", "uid = 0"),
        ("wheel", "gid = 0"),
    ]);
    assert_eq!(chosen(&p, &peer(0, 0)).as_deref(), Some("root"));
    assert_eq!(chosen(&p, &peer(0, 50)).as_deref(), Some("root"));
    assert_eq!(chosen(&p, &peer(0, 7)).as_deref(), Some("root"));
    assert_eq!(chosen(&p, &peer(7, 0)).as_deref(), Some("wheel"));
    assert_eq!(chosen(&p, &peer(1000, 0)).as_deref(), Some("alice"));
    assert_eq!(chosen(&p, &peer(1000, 50)).as_deref(), Some("alice-staff"));
    assert_eq!(chosen(&p, &peer(7, 50)).as_deref(), Some("staff"));
    assert_eq!(chosen(&p, &peer(7, 7)), None);
    // Without the rules for 0, root and group 0 are nobody the policy knows.
    let p = policy(&[
        ("alice", "uid = 1000"),
        ("staff", "gid = 50"),
        ("alice-staff", "uid = 1000\ngid = 50"),
    ]);
    assert_eq!(chosen(&p, &peer(0, 0)), None);
    assert_eq!(chosen(&p, &peer(0, 7)), None);
    assert_eq!(chosen(&p, &peer(7, 0)), None);
    assert_eq!(chosen(&p, &peer(1000, 0)).as_deref(), Some("alice"));
    assert_eq!(chosen(&p, &peer(0, 50)).as_deref(), Some("staff"));
}
