//! Offload definition loading on arbitrary UTF-8: never a panic, every error names the file,
//! and whatever loads round-trips exactly (write, load again: the same program and text).
#![no_main]

use libfuzzer_sys::fuzz_target;
use redn_policy::{parse_definition, write_definition};

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    match parse_definition(text, "fuzz.toml") {
        Err(e) => {
            let e = e.to_string();
            assert!(e.starts_with("fuzz.toml"), "{e}");
        }
        Ok(program) => {
            let written = write_definition(&program);
            let again = parse_definition(&written, "written.toml")
                .unwrap_or_else(|e| panic!("what was written does not load: {e}\n{written}"));
            assert_eq!(again, program);
            assert_eq!(write_definition(&again), written);
        }
    }
});
