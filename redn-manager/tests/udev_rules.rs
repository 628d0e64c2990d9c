//! `udev/90-redn.rules` checked against udev(7)'s rule syntax by a checker of our own:
//! Debian 12's `udevadm` (systemd 252) has no `verify` (it arrived in systemd 254), so the
//! suite cannot ask udev itself. The checker follows udev(7) of systemd 252: a rule is one
//! line (a trailing backslash continues it) of comma-separated `KEY[{attribute}]OP"value"`
//! pairs; match operators `==` and `!=`, assignment operators `=`, `+=`, `-=` and `:=`; each
//! key is a match key, an assignment key or both, and some need an attribute in braces;
//! values are double-quoted. Beyond syntax it checks what this file relies on: every `GOTO`
//! has its `LABEL`, and a rule that sets `SYSTEMD_WANTS` tags the device for systemd (the
//! property is ignored otherwise, systemd.device(5)). Commented-out rules (a `#` directly
//! followed by a key) are checked too, so the documented fence is valid when uncommented.

use std::collections::HashSet;

/// How a key may be used: as a match, an assignment, or both; whether `{attribute}` is
/// required, optional or not allowed.
#[derive(Clone, Copy)]
struct KeyKind {
    matches: bool,
    assigns: bool,
    attribute: Attribute,
}

#[derive(Clone, Copy, PartialEq)]
enum Attribute {
    Required,
    Optional,
    None,
}

/// udev(7), systemd 252: "Rules files" → match keys and assignment keys.
fn key_kind(key: &str) -> Option<KeyKind> {
    use Attribute::{None as No, Optional, Required};
    let (matches, assigns, attribute) = match key {
        "ACTION" | "DEVPATH" | "KERNEL" | "KERNELS" | "SUBSYSTEM" | "SUBSYSTEMS" | "DRIVER"
        | "DRIVERS" | "TAGS" | "PROGRAM" | "RESULT" => (true, false, No),
        "ATTRS" | "CONST" => (true, false, Required),
        "TEST" => (true, false, Optional),
        "NAME" | "SYMLINK" | "TAG" => (true, true, No),
        "ATTR" | "SYSCTL" | "ENV" => (true, true, Required),
        "OWNER" | "GROUP" | "MODE" | "LABEL" | "GOTO" | "OPTIONS" => (false, true, No),
        "SECLABEL" | "IMPORT" => (false, true, Required),
        "RUN" => (false, true, Optional),
        _ => return None,
    };
    Some(KeyKind {
        matches,
        assigns,
        attribute,
    })
}

/// One `KEY{attr}OP"value"` pair.
#[derive(Debug, PartialEq)]
struct Pair {
    key: String,
    attribute: Option<String>,
    op: &'static str,
    value: String,
}

const OPERATORS: [&str; 6] = ["==", "!=", "+=", "-=", ":=", "="];

/// Parse one rule line into its pairs, or say what is wrong and where.
fn parse_rule(line: &str) -> Result<Vec<Pair>, String> {
    let mut pairs = Vec::new();
    let mut rest = line.trim();
    while !rest.is_empty() {
        let key_len = rest
            .find(|c: char| !(c.is_ascii_uppercase() || c == '_'))
            .unwrap_or(rest.len());
        let key = &rest[..key_len];
        if key.is_empty() {
            return Err(format!("expected a key at {rest:?}"));
        }
        let kind = key_kind(key).ok_or_else(|| format!("unknown key {key}"))?;
        rest = &rest[key_len..];
        let mut attribute = None;
        if let Some(after) = rest.strip_prefix('{') {
            let close = after
                .find('}')
                .ok_or_else(|| format!("{key}: unclosed '{{'"))?;
            if close == 0 {
                return Err(format!("{key}: empty attribute"));
            }
            attribute = Some(after[..close].to_owned());
            rest = &after[close + 1..];
        }
        match (kind.attribute, &attribute) {
            (Attribute::Required, None) => return Err(format!("{key} needs {{attribute}}")),
            (Attribute::None, Some(_)) => return Err(format!("{key} takes no {{attribute}}")),
            _ => {}
        }
        let op = OPERATORS
            .into_iter()
            .find(|op| rest.starts_with(op))
            .ok_or_else(|| format!("{key}: expected an operator at {rest:?}"))?;
        rest = &rest[op.len()..];
        let is_match = op == "==" || op == "!=";
        if is_match && !kind.matches {
            return Err(format!("{key} is an assignment key; {op} matches"));
        }
        if !is_match && !kind.assigns {
            return Err(format!("{key} is a match key; {op} assigns"));
        }
        if matches!(key, "LABEL" | "GOTO") && op != "=" {
            return Err(format!("{key} takes only '='"));
        }
        let body = rest
            .strip_prefix('"')
            .ok_or_else(|| format!("{key}: the value must be in double quotes"))?;
        let mut end = None;
        let mut escaped = false;
        for (i, c) in body.char_indices() {
            match c {
                _ if escaped => escaped = false,
                '\\' => escaped = true,
                '"' => {
                    end = Some(i);
                    break;
                }
                _ => {}
            }
        }
        let end = end.ok_or_else(|| format!("{key}: unterminated value"))?;
        pairs.push(Pair {
            key: key.to_owned(),
            attribute,
            op,
            value: body[..end].to_owned(),
        });
        rest = body[end + 1..].trim_start();
        if rest.is_empty() {
            break;
        }
        rest = rest
            .strip_prefix(',')
            .ok_or_else(|| format!("expected ',' between pairs at {rest:?}"))?
            .trim_start();
        if rest.is_empty() {
            return Err("a ',' with no pair after it".into());
        }
    }
    Ok(pairs)
}

/// Check a whole rules file; every problem as `LINE: message`.
fn check_rules(text: &str) -> Vec<String> {
    let mut problems = Vec::new();
    let mut rules: Vec<(usize, Vec<Pair>)> = Vec::new();
    let mut pending = String::new();
    let mut start = 0;
    for (i, raw) in text.lines().enumerate() {
        let n = i + 1;
        if pending.is_empty() {
            start = n;
        }
        if let Some(head) = raw.strip_suffix('\\') {
            pending.push_str(head);
            continue;
        }
        pending.push_str(raw);
        let line = std::mem::take(&mut pending);
        let trimmed = line.trim();
        // A comment directly followed by a key is a rule shipped disabled: check it too.
        let rule = match trimmed.strip_prefix('#') {
            Some(c) if c.starts_with(|ch: char| ch.is_ascii_uppercase()) => c,
            Some(_) => continue,
            None if trimmed.is_empty() => continue,
            None => trimmed,
        };
        match parse_rule(rule) {
            Ok(pairs) => rules.push((start, pairs)),
            Err(e) => problems.push(format!("{start}: {e}")),
        }
    }
    if !pending.is_empty() {
        problems.push(format!("{start}: the file ends inside a continued line"));
    }
    let labels: HashSet<&str> = rules
        .iter()
        .flat_map(|(_, pairs)| pairs)
        .filter(|p| p.key == "LABEL")
        .map(|p| p.value.as_str())
        .collect();
    for (line, pairs) in &rules {
        for p in pairs {
            if p.key == "GOTO" && !labels.contains(p.value.as_str()) {
                problems.push(format!("{line}: GOTO {:?} has no LABEL", p.value));
            }
        }
        let wants = pairs
            .iter()
            .any(|p| p.key == "ENV" && p.attribute.as_deref() == Some("SYSTEMD_WANTS"));
        let tagged = pairs
            .iter()
            .any(|p| p.key == "TAG" && p.op == "+=" && p.value == "systemd");
        if wants && !tagged {
            problems.push(format!(
                "{line}: SYSTEMD_WANTS without TAG+=\"systemd\" is ignored"
            ));
        }
    }
    problems
}

fn shipped() -> String {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../udev/90-redn.rules");
    std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{path}: {e}"))
}

#[test]
fn the_shipped_rules_follow_udev_syntax() {
    let problems = check_rules(&shipped());
    assert!(problems.is_empty(), "{problems:#?}");
}

#[test]
fn the_shipped_rules_start_the_manager_and_offer_the_fence() {
    let text = shipped();
    let rules: Vec<Vec<Pair>> = text
        .lines()
        .filter_map(|l| {
            let l = l.trim();
            let rule = l.strip_prefix('#').unwrap_or(l);
            rule.starts_with(|c: char| c.is_ascii_uppercase())
                .then(|| parse_rule(rule).unwrap())
        })
        .collect();
    let has = |rule: &[Pair], key: &str, attribute: Option<&str>, op: &str, value: &str| {
        rule.iter().any(|p| {
            p.key == key && p.attribute.as_deref() == attribute && p.op == op && p.value == value
        })
    };
    assert!(rules
        .iter()
        .any(|r| has(r, "SUBSYSTEM", None, "==", "infiniband")
            && has(
                r,
                "ENV",
                Some("SYSTEMD_WANTS"),
                "+=",
                "redn-manager.service"
            )));
    // The fence makes the nodes root's only: not a group that apps are in (the api socket
    // admits apps by group, so a group fence would let them around the manager).
    for node in ["uverbs*", "rdma_cm"] {
        assert!(
            rules.iter().any(|r| has(r, "KERNEL", None, "==", node)
                && has(r, "OWNER", None, ":=", "root")
                && has(r, "GROUP", None, ":=", "root")
                && has(r, "MODE", None, ":=", "0600")),
            "no fence for {node}"
        );
    }
    // The fence ships disabled: enabling it is the admin's choice.
    for line in text.lines().filter(|l| l.contains("MODE:=")) {
        assert!(line.starts_with('#'), "fence enabled by default: {line}");
    }
}

#[test]
fn the_checker_refuses_what_udev_refuses() {
    let bad = [
        ("SUBSYSTEM=\"infiniband\"", "match key"),
        ("GROUP==\"redn\"", "assignment key"),
        ("SUBSYSTEM==infiniband", "double quotes"),
        ("SUBSYSTEM==\"infiniband\" TAG+=\"systemd\"", "','"),
        ("SUBSYSTEM==\"infiniband\",", "no pair after it"),
        ("BOGUS==\"x\"", "unknown key"),
        ("ENV==\"x\"", "needs {attribute}"),
        ("KERNEL{x}==\"y\"", "takes no {attribute}"),
        ("KERNEL<>\"y\"", "operator"),
        ("KERNEL==\"y", "unterminated"),
        ("GOTO+=\"end\"", "only '='"),
        ("GOTO=\"nowhere\"", "no LABEL"),
        (
            "SUBSYSTEM==\"infiniband\", ENV{SYSTEMD_WANTS}+=\"x.service\"",
            "ignored",
        ),
        ("SUBSYSTEM==\"infiniband\", \\", "ends inside"),
    ];
    for (text, why) in bad {
        let problems = check_rules(text);
        assert!(
            problems.iter().any(|p| p.contains(why)),
            "{text:?}: expected a problem containing {why:?}, got {problems:?}"
        );
    }
    // Continued lines, escapes inside values, disabled rules and plain comments pass.
    let good =
        "# a comment\nKERNEL==\"a\\\"b\", \\\n  TAG+=\"systemd\", ENV{SYSTEMD_WANTS}+=\"x\"\n\
                #KERNEL==\"c\", MODE:=\"0600\"\nLABEL=\"end\"\n";
    assert_eq!(check_rules(good), Vec::<String>::new());
}
