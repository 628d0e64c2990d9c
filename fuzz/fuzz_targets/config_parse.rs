//! `manager.toml` and `policy.toml` parsing on arbitrary UTF-8: never a panic, and every error
//! names the file it was given.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    if let Err(e) = redn_policy::parse_manager_config(text, "manager.toml") {
        let e = e.to_string();
        assert!(e.starts_with("manager.toml"), "{e}");
    }
    if let Err(e) = redn_policy::parse_policy(text, "policy.toml") {
        let e = e.to_string();
        assert!(e.starts_with("policy.toml"), "{e}");
    }
});
