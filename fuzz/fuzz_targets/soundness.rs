//! The verifier's soundness property under libFuzzer (see `redn-sys/tests/soundness.rs`, which
//! runs the same model at one fixed seed): the input picks the seed program and seeds the
//! mutations, the table contents and the triggers; every variant the verifier accepts runs
//! on the softnic, and a written code byte outside every writable window, a control word the
//! verifier did not allow, or a trigger over its budget fails an assertion.
#![no_main]

use libfuzzer_sys::fuzz_target;

#[path = "../../redn-sys/tests/common/mod.rs"]
mod common;
#[path = "../../redn-sys/tests/soundness_model/mod.rs"]
mod soundness_model;

fuzz_target!(|data: &[u8]| {
    let mut seed = [0u8; 8];
    let n = data.len().min(8);
    seed[..n].copy_from_slice(&data[..n]);
    // xorshift stalls at zero.
    let mut rng = common::Rng(u64::from_le_bytes(seed) | 1);
    let index = usize::from(data.get(8).copied().unwrap_or(0));
    let grants = soundness_model::grants();
    if let (program, Some(budget)) = soundness_model::variant(index, &mut rng, &grants) {
        soundness_model::run(program, &mut rng, 4, budget);
    }
});
