//! The verifier on every program a definition file can express: never a panic, and the log
//! always ends with its stats line.
#![no_main]

use libfuzzer_sys::fuzz_target;
use redn_policy::{parse_definition, verify, Grants};
use redn_program::Access;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let Ok(program) = parse_definition(text, "fuzz.toml") else {
        return;
    };
    // What a client of the shipped catalog is granted (as in tests/verifier.rs), with a
    // loop budget so that recycled programs get past that check.
    let mut grants = Grants::new()
        .with_region("table", Access::REMOTE_READ, 1 << 20)
        .with_region("list", Access::REMOTE_READ, 1 << 20)
        .with_region("values", Access::NONE, 1 << 20)
        .with_region("response", Access::REMOTE_WRITE, 1 << 17)
        .with_region("data", Access::ALL, 4096);
    grants.loop_budget = Some(1_000_000);
    grants.max_wqes_per_invocation = 256;
    let report = verify(&program, &grants);
    let log = report.log();
    assert!(log.contains("\nchecked "), "{log}");
    assert_eq!(report.accepted(), report.findings.is_empty());
});
