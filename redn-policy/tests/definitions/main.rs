//! Offload definition files: the shipped catalog files, round trips, and bad input refused
//! with the file, the line and the key.

use redn_policy::{
    load_definition, load_offloads_dir, parse_definition, shipped_offloads, verify,
    write_definition, Grants, MAX_FILE_BYTES,
};
use redn_program::program::catalog::{self, HashVariant};
use redn_program::program::{
    Addr, Form, Iterations, Op, Operand, Program, RegionRole, Sge, Slots, StaticBlock, Wqe,
};
use redn_program::wqe::WqeFlags;
use redn_program::Access;
use std::path::{Path, PathBuf};

fn offloads_d() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../etc/redn/offloads.d")
}

/// A small program that uses most of the format, written by hand as an operator would.
const TINY: &str = r#"# A hand-written definition.
name = "tiny"
summary = "a tiny program for tests"
response = "the static block's first 8 bytes if the key matches"
iterations = { kind = "bounded", invocations = 1, wqes_per_invocation = 5 }
entry = [{ queue = "worker", count = 3 }]

[[region]]
name = "data"
role = "data"
access = "remote-read|local-write"
min_len = 64

[[region]]
name = "response"
role = "response"
min_len = 8

[[param]]
name = "key"
len = 6

[[static]]
name = "blk"
len = 16
bytes = "01 02"

[[queue]]
name = "client"
role = "client"
managed_send = true
sq_bbs = 1
rq_slots = 1
rq_sges = 2

[[queue.wqe]]
label = "reply"
op = "write"
form = "nop"
remote = "region:response+0"
sgl = [{ addr = "static:blk", len = 8 }]
imm = 7

[[queue.recv]]
sgl = [{ addr = "wqe:if@41", len = 3 }, { addr = "wqe:if@45", len = 3 }]

[[queue]]
name = "worker"
role = "worker"
managed_send = true
sq_bbs = 4
rq_slots = 1
rq_sges = 1

[[queue.wqe]]
label = "wait"
op = "wait"
queue = "client"
count = 0

[[queue.wqe]]
label = "if"
op = "cas"
fence = true
signaled = true
remote = "wqe:reply@0"
compare = "ctrl:reply:nop:operand=0x0"
swap = "ctrl:reply:active:real"

[[queue.wqe]]
label = "answer"
op = "send-en"
queue = "client"
count = 1

[[patch]]
label = "reply"
bytes = [0, 8]
source = "cas:if"

[[patch]]
label = "if"
byte = 41
len = 3
source = "trigger:key"

[[patch]]
label = "if"
bytes = [45, 48]
source = "trigger:key"
"#;

fn tiny() -> Program {
    parse_definition(TINY, "tiny.toml").unwrap_or_else(|e| panic!("{e}"))
}

/// Load `text`, write it, load that: the same program, and writing again the same text.
fn round_trip(p: &Program) {
    let text = write_definition(p);
    let back = parse_definition(&text, "written.toml")
        .unwrap_or_else(|e| panic!("{}: {e}\n{text}", p.name));
    assert_eq!(&back, p);
    assert_eq!(write_definition(&back), text);
}

/// The 1-based line where `needle` first starts in `text`.
fn line_of(text: &str, needle: &str) -> usize {
    let at = text
        .find(needle)
        .unwrap_or_else(|| panic!("{needle:?} not in the text"));
    text[..at].matches('\n').count() + 1
}

/// `TINY` with `from` replaced by `to` (which must occur once).
fn edit(from: &str, to: &str) -> String {
    assert_eq!(TINY.matches(from).count(), 1, "{from:?}");
    TINY.replace(from, to)
}

/// The error for `text`, checked to start with `t.toml:LINE:` where LINE is the line that
/// holds `at`, to name `key`, and to say `message`.
fn refused(text: &str, at: &str, key: &str, message: &str) -> String {
    let e = match parse_definition(text, "t.toml") {
        Ok(_) => panic!("accepted:\n{text}"),
        Err(e) => e.to_string(),
    };
    let line = line_of(text, at);
    assert!(
        e.starts_with(&format!("t.toml:{line}:")),
        "expected line {line} ({at:?}): {e}"
    );
    assert!(e.contains(&format!(": {key}: ")), "expected key {key}: {e}");
    assert!(e.contains(message), "expected {message:?}: {e}");
    e
}

mod bad_input;
mod directory;
mod hand_written;
mod hostile;
mod shipped;
