//! The `redn` command, run as a real process: offline verification of the shipped catalog
//! and of a hostile definition, exit codes, errors in text and JSON, prefixes, and the
//! shell completions (`bash -n` on the generated script).

use serde_json::Value;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

const REDN: &str = env!("CARGO_BIN_EXE_redn");

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

fn redn(args: &[&str]) -> Output {
    Command::new(REDN).args(args).output().unwrap()
}

fn stdout(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

fn json(o: &Output) -> Value {
    serde_json::from_slice(&o.stdout)
        .unwrap_or_else(|e| panic!("not JSON ({e}): {}\n{}", stdout(o), stderr(o)))
}

fn shipped_policy() -> String {
    repo().join("etc/redn/policy.toml").display().to_string()
}

#[test]
fn every_shipped_offload_verifies_under_the_shipped_policy() {
    let dir = repo().join("etc/redn/offloads.d");
    let mut checked = 0;
    for entry in std::fs::read_dir(&dir).unwrap() {
        let path = entry.unwrap().path();
        let file = path.display().to_string();
        let o = redn(&[
            "-j",
            "offload",
            "verify",
            &file,
            "--policy",
            &shipped_policy(),
        ]);
        let rows = json(&o);
        let name = path.file_stem().unwrap().to_string_lossy().into_owned();
        if o.status.code() == Some(1) && rows.get("error").is_some() {
            // No app rule of the shipped policy lists this offload: said, not hidden.
            let e = rows["error"].as_str().unwrap();
            assert!(e.contains("no app rule may install"), "{e}");
            continue;
        }
        assert!(o.status.success(), "{name}: {}{}", stdout(&o), stderr(&o));
        for row in rows.as_array().unwrap() {
            assert_eq!(row["offload"], Value::String(name.clone()));
            assert_eq!(row["accepted"], Value::Bool(true), "{row}");
            assert_eq!(row["findings"], 0);
        }
        checked += 1;
    }
    assert!(
        checked >= 1,
        "no shipped offload is allowed by the shipped policy"
    );
}

/// echo with a response aimed outside the client's response region: the verifier refuses
/// it, and `redn` says so and which rule, exits 1, in both modes.
#[test]
fn a_refused_definition_exits_one_and_names_the_rule() {
    let text = std::fs::read_to_string(repo().join("etc/redn/offloads.d/echo.toml")).unwrap();
    let dir = std::env::temp_dir().join(format!("redn-cli-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    // The first reply's WRITE aimed past the end of the client's response region.
    let hostile = text.replacen(
        "remote = \"region:response+0\"",
        "remote = \"region:response+4096\"",
        1,
    );
    assert_ne!(hostile, text, "echo.toml has no reply to aim elsewhere");
    let file = dir.join("echo.toml");
    std::fs::write(&file, &hostile).unwrap();
    let file = file.display().to_string();
    let policy = shipped_policy();
    let o = redn(&[
        "offload", "verify", &file, "--policy", &policy, "--app", "kvstore",
    ]);
    let out = stdout(&o);
    if o.status.code() == Some(1) && stderr(&o).contains("Error:") {
        // The definition did not load: the loader's error names the file.
        assert!(stderr(&o).contains("echo.toml"), "{}", stderr(&o));
    } else {
        assert_eq!(o.status.code(), Some(1), "{out}");
        assert!(out.contains("refused"), "{out}");
        let o = redn(&[
            "-j", "offload", "verify", &file, "--policy", &policy, "--app", "kvstore",
        ]);
        assert_eq!(o.status.code(), Some(1));
        let rows = json(&o);
        let row = &rows.as_array().unwrap()[0];
        assert_eq!(row["accepted"], Value::Bool(false));
        assert!(row["findings"].as_u64().unwrap() >= 1, "{row}");
        assert!(!row["rules"].as_str().unwrap().is_empty(), "{row}");
    }
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn usage_errors_exit_two_and_runtime_errors_exit_one() {
    let o = redn(&["frobnicate"]);
    assert_eq!(o.status.code(), Some(2));
    assert!(
        stderr(&o).starts_with("Error: unknown object \"frobnicate\""),
        "{}",
        stderr(&o)
    );
    let o = redn(&["client", "kill"]);
    assert_eq!(o.status.code(), Some(2));
    assert!(stderr(&o).contains("needs ID"), "{}", stderr(&o));
    let o = redn(&["client", "kill", "seven"]);
    assert_eq!(o.status.code(), Some(2));
    let o = redn(&["--bogus"]);
    assert_eq!(o.status.code(), Some(2));
    // `o` is offload only; `c` is client, completion: ambiguous.
    let o = redn(&["c"]);
    assert_eq!(o.status.code(), Some(2));
    assert!(stderr(&o).contains("ambiguous"), "{}", stderr(&o));
    // No manager listens here: exit 1, the path named; with -j an {"error": ...} object.
    let nowhere = std::env::temp_dir().join("redn-cli-no-manager.sock");
    let nowhere = nowhere.display().to_string();
    let o = redn(&["-s", &nowhere, "client", "show"]);
    assert_eq!(o.status.code(), Some(1));
    assert!(stderr(&o).contains(&nowhere), "{}", stderr(&o));
    let o = redn(&["-j", "-s", &nowhere, "cl", "sh"]);
    assert_eq!(o.status.code(), Some(1));
    assert!(json(&o)["error"].as_str().unwrap().contains(&nowhere));
}

#[test]
fn help_and_version_list_every_object() {
    let o = redn(&["help"]);
    assert!(o.status.success());
    let text = stdout(&o);
    for object in [
        "client",
        "offload",
        "stat",
        "region",
        "policy",
        "completion",
    ] {
        assert!(
            text.contains(&format!("redn {object} ")),
            "{object} missing:\n{text}"
        );
    }
    assert_eq!(stdout(&redn(&["--help"])), text);
    let o = redn(&["offload", "help"]);
    assert!(stdout(&o).contains("redn offload verify FILE"));
    assert!(!stdout(&o).contains("redn client"));
    let o = redn(&["-V"]);
    assert_eq!(
        stdout(&o).trim(),
        format!("redn {}", env!("CARGO_PKG_VERSION"))
    );
}

#[test]
fn completions_are_made_from_the_command_table() {
    for shell in ["bash", "zsh", "fish"] {
        let o = redn(&["completion", shell]);
        assert!(o.status.success(), "{shell}");
        let script = stdout(&o);
        for word in ["client", "offload", "verify", "reload", "json", "policy"] {
            assert!(script.contains(word), "{shell}: no {word}");
        }
    }
    // The bash script parses, and completes what the table says.
    let script = stdout(&redn(&["completion", "bash"]));
    let probe = format!(
        "{script}\nCOMP_WORDS=(redn off); COMP_CWORD=1; _redn; echo \"${{COMPREPLY[*]}}\"\n\
         COMP_WORDS=(redn offload ''); COMP_CWORD=2; _redn; echo \"${{COMPREPLY[*]}}\"\n\
         COMP_WORDS=(redn offload verify --p); COMP_CWORD=3; _redn; echo \"${{COMPREPLY[*]}}\"\n"
    );
    let o = Command::new("bash").arg("-c").arg(&probe).output().unwrap();
    assert!(o.status.success(), "{}", stderr(&o));
    let lines: Vec<String> = stdout(&o).lines().map(str::to_owned).collect();
    assert_eq!(lines[0], "offload");
    assert_eq!(lines[1], "show dump verify help");
    assert_eq!(lines[2], "--pretty --policy");
}
