//! The softnic's executor on arbitrary WQE bytes (see `redn-sys/tests/exec_soup`, shared
//! with the `random_wqes` test): a PU thread that panics aborts the process, which libFuzzer
//! reports.
#![no_main]

use libfuzzer_sys::fuzz_target;

#[path = "../../redn-sys/tests/exec_soup/mod.rs"]
mod exec_soup;

fuzz_target!(|data: &[u8]| exec_soup::run(data));
