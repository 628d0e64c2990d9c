//! The size cap on configuration files: a file (or text) of exactly `MAX_FILE_BYTES` is read
//! and parsed; one byte more is refused before parsing.

use redn_policy::{
    load_definition, load_policy, parse_definition, parse_policy, Error, MAX_FILE_BYTES,
};
use std::path::PathBuf;

// 1 MiB: a u64 that fits any usize this project builds for (checked when compiling).
#[allow(clippy::cast_possible_truncation)]
const CAP: usize = MAX_FILE_BYTES as usize;
const _: () = assert!(CAP as u64 == MAX_FILE_BYTES);

/// `text` followed by one comment line that brings it to exactly `len` bytes.
fn padded(text: &str, len: usize) -> String {
    let fill = len - text.len() - 2;
    let out = format!("{text}#{}\n", "x".repeat(fill));
    assert_eq!(out.len(), len);
    out
}

/// A policy with no app (valid: it admits nobody).
const POLICY: &str = "# no app\n";

/// A definition from the shipped catalog.
fn definition() -> String {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../etc/redn/offloads.d");
    std::fs::read_to_string(dir.join("echo.toml")).unwrap()
}

fn too_large(e: &Error, origin: &str) {
    assert!(
        matches!(e, Error::TooLarge { cap, origin: o } if *cap == MAX_FILE_BYTES && o == origin),
        "{e}"
    );
    assert!(
        e.to_string()
            .starts_with(&format!("{origin}: larger than the 1048576-byte limit")),
        "{e}"
    );
}

struct TempFile(PathBuf);

impl TempFile {
    fn new(tag: &str, text: &str) -> TempFile {
        let path =
            std::env::temp_dir().join(format!("redn-file-cap-{tag}-{}.toml", std::process::id()));
        std::fs::write(&path, text).unwrap();
        TempFile(path)
    }
    fn name(&self) -> String {
        self.0.display().to_string()
    }
}

impl Drop for TempFile {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

#[test]
fn a_policy_of_exactly_the_cap_loads_one_byte_more_is_refused() {
    let text = padded(POLICY, CAP);
    let p = parse_policy(&text, "p.toml").unwrap_or_else(|e| panic!("{e}"));
    assert!(p.apps().is_empty());
    let f = TempFile::new("policy-at-cap", &text);
    load_policy(&f.0).unwrap_or_else(|e| panic!("{e}"));

    let text = padded(POLICY, CAP + 1);
    too_large(&parse_policy(&text, "p.toml").unwrap_err(), "p.toml");
    let f = TempFile::new("policy-over-cap", &text);
    too_large(&load_policy(&f.0).unwrap_err(), &f.name());
}

#[test]
fn a_definition_of_exactly_the_cap_loads_one_byte_more_is_refused() {
    let base = definition();
    let want = parse_definition(&base, "echo.toml").unwrap_or_else(|e| panic!("{e}"));
    let text = padded(&base, CAP);
    assert_eq!(parse_definition(&text, "echo.toml").unwrap(), want);
    let f = TempFile::new("definition-at-cap", &text);
    assert_eq!(load_definition(&f.0).unwrap(), want);

    let text = padded(&base, CAP + 1);
    too_large(
        &parse_definition(&text, "echo.toml").unwrap_err(),
        "echo.toml",
    );
    let f = TempFile::new("definition-over-cap", &text);
    too_large(&load_definition(&f.0).unwrap_err(), &f.name());
}

#[test]
fn a_file_over_the_cap_is_too_large_even_where_the_cap_cuts_a_character() {
    // The loader reads one byte past the cap: here that byte is the first of a two-byte
    // character, so what it read is not UTF-8. The size, not the encoding, is the reason.
    let text = format!("{POLICY}#{}é\n", "x".repeat(CAP - POLICY.len() - 1));
    assert!(!text.is_char_boundary(CAP + 1));
    let f = TempFile::new("policy-cut", &text);
    too_large(&load_policy(&f.0).unwrap_err(), &f.name());
}
