//! The man pages in `man/` cannot drift from what they describe. Every list checked here is
//! taken from the code, never copied by hand:
//!
//! - `redn-manager(8)`: the options, `--limit` names and defaults, signals and environment
//!   variables that `redn-manager --help` prints;
//! - `redn(1)`: every object, command and option of the `redn` command table
//!   (`src/bin/redn/table.rs`, compiled in here) and of `redn help`;
//! - `redn.toml(5)` and `redn-offload(5)`: the key set of every table, as redn-policy itself
//!   reports it when handed an unknown probe key ("unknown key, expected one of `a`, `b`");
//!   the examples of `redn.toml(5)` must load;
//! - `redn(7)`: the verifier's rule ids (`Rule::id` in redn-policy's `verifier.rs`) and the
//!   methods and errors of `redn-proto/interfaces/io.redn.*.varlink`;
//! - every page: `mandoc -T lint -W warning` and `man --warnings` (groff, as lintian runs
//!   it) report nothing; `redn*` pages a page refers to exist; `.TH` names this version;
//! - the units in `etc/systemd/` name only pages in `man/`, and `systemd-analyze verify
//!   --man=yes` finds them with `MANPATH` pointing at a tree of these pages.
//!
//! A page documents a name by giving it a tagged paragraph (`.TP`/`.TQ`) in the section or
//! subsection it belongs to; the checks read the roff source, with font escapes removed.
//! mandoc, man and systemd-analyze come from Debian's `mandoc`, `man-db` and `systemd`: where
//! one is missing its check fails when `CI` is set and is skipped, saying so, elsewhere.

#[allow(dead_code)] // the binary's parser and completions use the rest; the table is read here
#[path = "../src/bin/redn/table.rs"]
mod table;

use std::path::{Path, PathBuf};
use std::process::Command;

const REDN_MANAGER: &str = env!("CARGO_BIN_EXE_redn-manager");
const REDN: &str = env!("CARGO_BIN_EXE_redn");

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// A roff line as it reads once rendered: font escapes and `\c` dropped, `\-`, `\(dq`,
/// `\(aq`, `\~`, `\&` and `\(ha` turned back into their characters, and the arguments of a
/// font macro joined as roff joins them (`.BR a b` is `ab`, `.B a b` is `a b`).
fn rendered(line: &str) -> String {
    let mut text = line.to_owned();
    for (escape, plain) in [
        ("\\fB", ""),
        ("\\fI", ""),
        ("\\fR", ""),
        ("\\fP", ""),
        ("\\c", ""),
        ("\\-", "-"),
        ("\\(dq", "\""),
        ("\\(aq", "'"),
        ("\\(ha", "^"),
        ("\\~", " "),
        ("\\&", ""),
    ] {
        text = text.replace(escape, plain);
    }
    let Some(rest) = text.strip_prefix('.') else {
        return text;
    };
    let (mac, args) = rest.split_once(' ').unwrap_or((rest, ""));
    let joined_without_space = ["BR", "RB", "BI", "IB", "IR", "RI"].contains(&mac);
    if !joined_without_space && !["B", "I"].contains(&mac) {
        return text;
    }
    let words = roff_args(args);
    words.join(if joined_without_space { "" } else { " " })
}

/// The arguments of a macro line: split at spaces, with `"..."` kept whole.
fn roff_args(args: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut word = String::new();
    let mut quoted = false;
    for c in args.chars() {
        match c {
            '"' => quoted = !quoted,
            ' ' if !quoted => {
                if !word.is_empty() {
                    out.push(std::mem::take(&mut word));
                }
            }
            _ => word.push(c),
        }
    }
    if !word.is_empty() {
        out.push(word);
    }
    out
}

/// One `.SH` or `.SS` of a page: its heading, its tags (the lines after `.TP` and `.TQ`),
/// and all its lines as rendered.
#[derive(Debug)]
struct Section {
    heading: String,
    /// `.SH` (true) or `.SS`.
    top: bool,
    tags: Vec<String>,
    text: String,
}

/// A page, read and cut into sections.
struct Page {
    name: String,
    source: String,
    sections: Vec<Section>,
}

impl Page {
    fn read(file: &str) -> Page {
        let path = repo().join("man").join(file);
        let source =
            std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        let mut sections: Vec<Section> = Vec::new();
        let mut next_is_tag = false;
        for line in source.lines() {
            if line.starts_with(".\\\"") {
                continue;
            }
            let heading = line
                .strip_prefix(".SH ")
                .map(|h| (h, true))
                .or_else(|| line.strip_prefix(".SS ").map(|h| (h, false)));
            if let Some((heading, top)) = heading {
                sections.push(Section {
                    heading: roff_args(&rendered(heading)).join(" "),
                    top,
                    tags: Vec::new(),
                    text: String::new(),
                });
                continue;
            }
            let Some(section) = sections.last_mut() else {
                continue;
            };
            if line == ".TP" || line == ".TQ" {
                next_is_tag = true;
                continue;
            }
            let plain = rendered(line);
            if next_is_tag {
                section.tags.push(plain.clone());
                next_is_tag = false;
            }
            section.text.push_str(&plain);
            section.text.push('\n');
        }
        Page {
            name: file.to_owned(),
            source,
            sections,
        }
    }

    /// The `.SH` or `.SS` whose heading is `heading`, and for a `.SH`, its subsections too.
    fn section(&self, heading: &str) -> Vec<&Section> {
        let Some(at) = self.sections.iter().position(|s| s.heading == heading) else {
            panic!(
                "{}: no section {heading:?}; there are {:?}",
                self.name,
                self.sections.iter().map(|s| &s.heading).collect::<Vec<_>>()
            )
        };
        let first = &self.sections[at];
        let mut out = vec![first];
        if first.top {
            out.extend(self.sections[at + 1..].iter().take_while(|s| !s.top));
        }
        out
    }

    /// Whether `name` is a word of some tag under `heading`.
    fn tags_word(&self, heading: &str, name: &str) -> bool {
        self.section(heading)
            .iter()
            .flat_map(|s| &s.tags)
            .any(|tag| words(tag).any(|w| w == name))
    }

    /// Whether `name` is a word of the text under `heading`.
    fn mentions(&self, heading: &str, name: &str) -> bool {
        self.section(heading)
            .iter()
            .any(|s| words(&s.text).any(|w| w == name))
    }

    fn has_heading(&self, heading: &str) -> bool {
        self.sections.iter().any(|s| s.heading == heading)
    }
}

/// The words of rendered text: split at spaces and punctuation that never belongs to an
/// option, key or name.
fn words(text: &str) -> impl Iterator<Item = &str> {
    text.split(|c: char| c.is_whitespace() || ",;:()[]{}=|\"'`".contains(c))
        .map(|w| w.trim_end_matches('.'))
        .filter(|w| !w.is_empty())
}

fn run(bin: &str, args: &[&str]) -> String {
    let out = Command::new(bin).args(args).output().unwrap();
    assert!(out.status.success(), "{bin} {args:?}: {out:?}");
    String::from_utf8(out.stdout).unwrap()
}

#[test]
fn redn_manager_8_describes_every_option_signal_and_variable_of_its_help() {
    let help = run(REDN_MANAGER, &["--help"]);
    let page = Page::read("redn-manager.8");
    let mut missing = Vec::new();
    let help_words: Vec<&str> = words(&help).collect();
    for option in help_words.iter().filter(|w| w.starts_with("--")) {
        if !page.tags_word("OPTIONS", option) {
            missing.push(format!("option {option}"));
        }
    }
    // `--limit NAME=VALUE   change a limit: message-bytes (1048576), nesting (16), ...`
    let limits = help
        .split_once("change a limit:")
        .and_then(|(_, rest)| rest.split_once("--help"))
        .map(|(limits, _)| limits)
        .expect("--help lists the limits after `change a limit:`");
    let mut seen = 0;
    for entry in limits.split(',') {
        let (name, default) = entry
            .trim()
            .split_once(' ')
            .unwrap_or_else(|| panic!("a limit without its default: {entry:?}"));
        let default = default.trim().trim_matches(|c| c == '(' || c == ')');
        seen += 1;
        if !page.tags_word("OPTIONS", name) {
            missing.push(format!("limit {name}"));
        }
        if !page.mentions("OPTIONS", default) {
            missing.push(format!("limit {name}'s default {default}"));
        }
    }
    assert!(seen >= 9, "the help's limits were not all read: {limits}");
    for signal in help_words.iter().filter(|w| w.starts_with("SIG")) {
        if !page.tags_word("SIGNALS", signal) {
            missing.push(format!("signal {signal}"));
        }
    }
    for variable in help_words
        .iter()
        .filter(|w| w.contains('_') && w.chars().all(|c| c.is_ascii_uppercase() || c == '_'))
    {
        if !page.tags_word("ENVIRONMENT", variable) {
            missing.push(format!("environment variable {variable}"));
        }
    }
    assert!(missing.is_empty(), "redn-manager(8) lacks: {missing:?}");
}

#[test]
fn redn_1_describes_every_object_command_and_option_of_the_table() {
    let page = Page::read("redn.1");
    let mut missing = Vec::new();
    for object in table::objects() {
        if !page.has_heading(object) {
            missing.push(format!("subsection {object}"));
        }
    }
    for cmd in table::COMMANDS {
        let documented = page.section("COMMANDS").iter().any(|s| {
            s.tags.iter().any(|tag| {
                let mut w = words(tag);
                w.next() == Some("redn")
                    && w.next() == Some(cmd.object)
                    && w.next() == Some(cmd.name)
            })
        });
        if !documented {
            missing.push(format!("redn {} {}", cmd.object, cmd.name));
        }
        for option in cmd.options {
            if !page.tags_word("COMMANDS", option) {
                missing.push(format!("redn {} {} {option}", cmd.object, cmd.name));
            }
        }
    }
    for (short, long, value, _) in table::GLOBAL_OPTIONS {
        let documented = page.section("OPTIONS").iter().any(|s| {
            s.tags.iter().any(|tag| {
                let w: Vec<&str> = words(tag).collect();
                w.contains(short)
                    && w.contains(long)
                    && (value.is_empty() || w.contains(&value.to_lowercase().as_str()))
            })
        });
        if !documented {
            missing.push(format!("option {short}, {long} {value}"));
        }
    }
    assert!(missing.is_empty(), "redn(1) lacks: {missing:?}");
}

#[test]
fn redn_help_lists_what_the_table_holds() {
    // The table read above is the one the binary was built from: its help shows each
    // command and option, so the page is checked against what `redn` really offers.
    let help = run(REDN, &["help"]);
    for cmd in table::COMMANDS {
        let call = format!("redn {} {}", cmd.object, cmd.name);
        assert!(help.contains(&call), "`redn help` lacks {call}:\n{help}");
    }
    for (short, long, _, _) in table::GLOBAL_OPTIONS {
        assert!(
            help.contains(&format!("{short}, {long}")),
            "`redn help` lacks {short}, {long}:\n{help}"
        );
    }
}

/// The keys redn-policy accepts where `probe` puts an unknown key, from its error
/// ("unknown key, expected one of `a`, `b`" or "unknown key, expected `a`").
fn accepted_keys(error: &str) -> Vec<String> {
    let Some((_, expected)) = error.split_once("unknown key, expected") else {
        panic!("not an unknown-key error (has the wording changed?): {error}")
    };
    expected
        .split('`')
        .skip(1)
        .step_by(2)
        .map(str::to_owned)
        .collect()
}

/// Check that every key a table accepts is documented under `heading`: by a tag there,
/// or, for a key that is itself a table, by a subsection of its own (`[key]`, `[[key]]`,
/// `[[parent.key]]`...). `probed` is redn-policy's answer to a file with an unknown key in
/// that table.
fn check_table<T: std::fmt::Debug>(
    page: &Page,
    heading: &str,
    probed: redn_policy::Result<T>,
    missing: &mut Vec<String>,
) {
    let error = probed.expect_err("the probe key is refused").to_string();
    let keys = accepted_keys(&error);
    assert!(!keys.is_empty(), "no keys read from: {error}");
    for key in keys {
        let own_subsection = page.sections.iter().any(|s| {
            let h = s.heading.trim_matches(|c| c == '[' || c == ']');
            h == key || h.ends_with(&format!(".{key}"))
        });
        if !page.tags_word(heading, &key) && !own_subsection {
            missing.push(format!("{heading}: {key}"));
        }
    }
}

const PROBE: &str = "redn_man_page_probe = 1\n";

#[test]
fn redn_toml_5_describes_every_key_of_manager_toml_and_policy_toml() {
    let page = Page::read("redn.toml.5");
    let mut missing = Vec::new();
    let manager = |text: &str| redn_policy::parse_manager_config(text, "manager.toml");
    check_table(&page, "MANAGER.TOML", manager(PROBE), &mut missing);
    for table in ["api", "admin", "backend", "dataplane", "audit"] {
        let probed = manager(&format!("[{table}]\n{PROBE}"));
        check_table(&page, &format!("[{table}]"), probed, &mut missing);
    }
    let policy = |text: &str| redn_policy::parse_policy(text, "policy.toml");
    for (heading, probe) in [
        ("POLICY.TOML", PROBE.to_owned()),
        ("[[app]]", format!("[[app]]\n{PROBE}")),
        ("[app.client]", format!("[[app]]\n[app.client]\n{PROBE}")),
    ] {
        check_table(&page, heading, policy(&probe), &mut missing);
    }
    assert!(missing.is_empty(), "redn.toml(5) lacks: {missing:?}");
}

#[test]
fn redn_offload_5_describes_every_key_of_a_definition() {
    let page = Page::read("redn-offload.5");
    let mut missing = Vec::new();
    for (heading, probe) in [
        ("TOP LEVEL", PROBE.to_owned()),
        (
            "iterations",
            "iterations = { kind = \"bounded\", redn_man_page_probe = 1 }\n".to_owned(),
        ),
        ("[[region]]", format!("[[region]]\n{PROBE}")),
        ("[[param]]", format!("[[param]]\n{PROBE}")),
        ("[[static]]", format!("[[static]]\n{PROBE}")),
        ("[[queue]]", format!("[[queue]]\n{PROBE}")),
        (
            "[[queue.wqe]]",
            format!("[[queue]]\n[[queue.wqe]]\n{PROBE}"),
        ),
        (
            "[[queue.recv]]",
            format!("[[queue]]\n[[queue.recv]]\n{PROBE}"),
        ),
        ("[[patch]]", format!("[[patch]]\n{PROBE}")),
    ] {
        let probed = redn_policy::parse_definition(&probe, "probe.toml");
        check_table(&page, heading, probed, &mut missing);
    }
    assert!(missing.is_empty(), "redn-offload(5) lacks: {missing:?}");
}

/// The `.EX` blocks of `page` that follow a `.\" example: KIND` comment, as plain text.
fn examples(page: &Page, kind: &str) -> Vec<String> {
    let marker = format!(".\\\" example: {kind}");
    let mut out = Vec::new();
    let mut lines = page.source.lines();
    while let Some(line) = lines.next() {
        if line != marker {
            continue;
        }
        let block: Vec<String> = lines
            .by_ref()
            .skip_while(|l| *l != ".EX")
            .skip(1)
            .take_while(|l| *l != ".EE")
            .map(rendered)
            .collect();
        out.push(block.join("\n") + "\n");
    }
    out
}

#[test]
fn the_examples_of_redn_toml_5_load() {
    let page = Page::read("redn.toml.5");
    let managers = examples(&page, "manager.toml");
    let policies = examples(&page, "policy.toml");
    assert!(
        !managers.is_empty() && !policies.is_empty(),
        "no marked examples found"
    );
    for text in managers {
        if let Err(e) = redn_policy::parse_manager_config(&text, "redn.toml(5) example") {
            panic!("{e}\n{text}");
        }
    }
    for text in policies {
        if let Err(e) = redn_policy::parse_policy(&text, "redn.toml(5) example") {
            panic!("{e}\n{text}");
        }
    }
}

#[test]
fn redn_7_describes_every_verifier_rule_and_varlink_method_and_error() {
    let page = Page::read("redn.7");
    let mut missing = Vec::new();
    // `Rule::id`: one `Rule::Name => "id",` arm per rule.
    let verifier = std::fs::read_to_string(repo().join("redn-policy/src/verifier.rs")).unwrap();
    let id_fn = verifier
        .split_once("pub fn id(self)")
        .and_then(|(_, rest)| rest.split_once("\n    }\n"))
        .map(|(body, _)| body)
        .expect("verifier.rs has Rule::id");
    let ids: Vec<&str> = id_fn
        .lines()
        .filter_map(|l| l.split_once("=> \"").and_then(|(_, id)| id.split_once('"')))
        .map(|(id, _)| id)
        .collect();
    assert!(ids.len() >= 17, "the rule ids were not all read: {ids:?}");
    for id in ids {
        if !page.tags_word("The verifier", id) {
            missing.push(format!("verifier rule {id}"));
        }
    }
    let dir = repo().join("redn-proto/interfaces");
    let mut interfaces = 0;
    for entry in std::fs::read_dir(&dir).unwrap() {
        let path = entry.unwrap().path();
        let idl = std::fs::read_to_string(&path).unwrap();
        let Some(name) = idl
            .lines()
            .find_map(|l| l.strip_prefix("interface "))
            .filter(|n| n.starts_with("io.redn."))
        else {
            continue;
        };
        interfaces += 1;
        let Some(section) = page
            .sections
            .iter()
            .find(|s| s.heading.split(' ').next() == Some(name))
        else {
            missing.push(format!("subsection {name}"));
            continue;
        };
        for line in idl.lines() {
            let declared = |keyword: &str| {
                line.strip_prefix(keyword)
                    .and_then(|rest| rest.split(['(', ' ']).next())
            };
            if let Some(method) = declared("method ") {
                if !section.tags.iter().any(|t| words(t).any(|w| w == method)) {
                    missing.push(format!("{name}.{method}"));
                }
            }
            if let Some(error) = declared("error ") {
                if !words(&section.text).any(|w| w == error) {
                    missing.push(format!("{name}.{error} (error)"));
                }
            }
        }
    }
    assert_eq!(
        interfaces,
        2,
        "io.redn.Manager and io.redn.Admin in {}",
        dir.display()
    );
    assert!(missing.is_empty(), "redn(7) lacks: {missing:?}");
}

#[test]
fn redn_7_describes_every_audit_event() {
    let page = Page::read("redn.7");
    let missing: Vec<&str> = redn_manager::audit::Event::ALL
        .iter()
        .map(|e| e.name())
        .filter(|name| !page.tags_word("AUDIT RECORDS", name))
        .collect();
    assert!(
        missing.is_empty(),
        "redn(7) AUDIT RECORDS lacks: {missing:?}"
    );
}

/// Every page in `man/`.
fn pages() -> Vec<String> {
    let mut out: Vec<String> = std::fs::read_dir(repo().join("man"))
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| {
            n.rsplit_once('.')
                .is_some_and(|(_, s)| s.len() == 1 && s.chars().all(|c| ('1'..='8').contains(&c)))
        })
        .collect();
    out.sort();
    out
}

#[test]
fn the_pages_refer_only_to_redn_pages_that_exist_and_the_readme_lists_them() {
    let all = pages();
    assert_eq!(all.len(), 5, "{all:?}");
    let readme = std::fs::read_to_string(repo().join("man/README.md")).unwrap();
    for file in &all {
        let page = Page::read(file);
        // `.BR redn.toml (5),` renders `redn.toml(5),`.
        for line in page.source.lines().filter(|l| l.starts_with(".BR redn")) {
            let args = roff_args(&line[4..]);
            let [name, section, ..] = args.as_slice() else {
                continue;
            };
            let Some(number) = section.strip_prefix('(').and_then(|s| s.get(..1)) else {
                continue;
            };
            let target = format!("{name}.{number}");
            assert!(
                all.contains(&target),
                "{file} refers to {name}({number}), which is not in man/"
            );
        }
        // `.TH REDN 1 DATE "redn 0.1.0" ...`: the pages name the version they describe.
        let th = page
            .source
            .lines()
            .find(|l| l.starts_with(".TH "))
            .unwrap_or_default();
        let source = format!("\"redn {}\"", env!("CARGO_PKG_VERSION"));
        assert!(
            th.contains(&source),
            "{file}: .TH does not name {source}: {th}"
        );
        let (stem, number) = file.rsplit_once('.').unwrap();
        assert!(
            readme.contains(&format!("{stem}({number})")),
            "man/README.md does not list {stem}({number})"
        );
    }
}

/// Skip, saying why, where a tool is missing; under CI (`CI` set), where `.ci/run` installs
/// every tool, a missing one is a failure.
fn skip(reason: &str) {
    assert!(
        std::env::var_os("CI").is_none(),
        "CI must provide this: {reason}"
    );
    println!("skipped: {reason}");
}

#[test]
fn mandoc_lint_finds_nothing_in_any_page() {
    for file in pages() {
        let path = repo().join("man").join(&file);
        let out = match Command::new("mandoc")
            .args(["-T", "lint", "-W", "warning"])
            .arg(&path)
            .output()
        {
            Ok(out) => out,
            Err(e) => return skip(&format!("mandoc cannot run ({e}): Debian package mandoc")),
        };
        let report = format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        assert!(
            out.status.success() && report.is_empty(),
            "mandoc -T lint {file}:\n{report}"
        );
    }
}

#[test]
fn groff_prints_no_warning_for_any_page() {
    for file in pages() {
        let path = repo().join("man").join(&file);
        // lintian's check. man's exit status stays 0 on warnings: stderr is what counts.
        let out = match Command::new("man")
            .env("LC_ALL", "C.UTF-8")
            .env("MANROFFSEQ", "")
            .env("MANWIDTH", "80")
            .args(["--warnings", "-E", "UTF-8", "-l", "-Tutf8", "-Z"])
            .arg(&path)
            .output()
        {
            Ok(out) => out,
            Err(e) => return skip(&format!("man cannot run ({e}): Debian package man-db")),
        };
        let warnings = String::from_utf8_lossy(&out.stderr);
        assert!(
            out.status.success() && warnings.is_empty() && !out.stdout.is_empty(),
            "man --warnings {file}:\n{warnings}"
        );
    }
}

/// A `MANPATH` tree (`man1/`, `man5/`, ...) of the pages in `man/`, under `dir`.
fn staged_manpath(dir: &Path) -> PathBuf {
    let root = dir.join("man");
    for file in pages() {
        let (_, section) = file.rsplit_once('.').unwrap();
        let into = root.join(format!("man{section}"));
        std::fs::create_dir_all(&into).unwrap();
        std::fs::copy(repo().join("man").join(&file), into.join(&file)).unwrap();
    }
    root
}

#[test]
fn the_units_name_only_pages_that_exist_and_systemd_finds_them() {
    let units = repo().join("etc/systemd");
    let all = pages();
    let dir = std::env::temp_dir().join(format!("redn-man-units-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let mut names = Vec::new();
    for entry in std::fs::read_dir(&units).unwrap() {
        let path = entry.unwrap().path();
        let name = path.file_name().unwrap().to_string_lossy().into_owned();
        let text = std::fs::read_to_string(&path).unwrap();
        // `Documentation=man:redn-manager(8) man:redn(7)`.
        for doc in text
            .lines()
            .filter_map(|l| l.strip_prefix("Documentation="))
            .flat_map(str::split_whitespace)
            .filter_map(|d| d.strip_prefix("man:"))
        {
            let (page, section) = doc
                .trim_end_matches(')')
                .split_once('(')
                .unwrap_or_else(|| panic!("{name}: {doc} is not NAME(SECTION)"));
            assert!(
                all.contains(&format!("{page}.{section}")),
                "{name} names {doc}, which is not in man/"
            );
        }
        // verify refuses an ExecStart that does not exist: run the binary this build made.
        let text = text.replace("/usr/sbin/redn-manager", REDN_MANAGER);
        std::fs::write(dir.join(&name), text).unwrap();
        names.push(format!("./{name}"));
    }
    assert!(!names.is_empty(), "no units in {}", units.display());
    let manpath = staged_manpath(&dir);
    // `verify --man=yes` runs `man` for each Documentation= page and fails if one is missing.
    let out = match Command::new("systemd-analyze")
        .current_dir(&dir)
        .env("MANPATH", &manpath)
        .args(["verify", "--man=yes"])
        .args(&names)
        .output()
    {
        Ok(out) => out,
        Err(e) => {
            return skip(&format!(
                "systemd-analyze cannot run ({e}): Debian package systemd"
            ))
        }
    };
    let stderr = String::from_utf8_lossy(&out.stderr);
    let ours: Vec<&str> = stderr.lines().filter(|l| l.contains("redn")).collect();
    assert!(out.status.success() && ours.is_empty(), "{stderr}");
    std::fs::remove_dir_all(&dir).unwrap();
}
