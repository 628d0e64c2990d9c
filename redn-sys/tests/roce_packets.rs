//! Arbitrary datagrams into a softnic's RoCE endpoint, in every test run: the
//! `roce_packets` fuzz target's harness (`roce_soup`: no panic, no byte outside the granted
//! and receive regions changes, drops counted, the QP connected or in error) on a few
//! hundred seeded random inputs, and on the corpus a coverage-guided run of the target
//! kept (`fuzz/seeds/roce_packets.corpus`).

mod common;
mod roce_soup;

use common::Rng;

#[test]
fn random_datagrams_change_nothing_outside_grants() {
    let mut rng = Rng(0x5eed_0001);
    for case in 0..300 {
        let len = rng.index(2048);
        let input: Vec<u8> = (0..len).map(|_| rng.byte()).collect();
        if std::panic::catch_unwind(|| roce_soup::run(&input)).is_err() {
            panic!("case {case} failed: input {input:02x?}");
        }
    }
}

/// The inputs of `fuzz/seeds/roce_packets.corpus`: each a little-endian `u32` length, then
/// that many bytes. It holds what `-merge=1` kept of a 25-minute libFuzzer run of the target
/// (731,146 inputs, 2026-11-28): 686 inputs reaching 1,728 edges of the receive path,
/// where random bytes mostly stop at the first check.
fn corpus() -> Vec<&'static [u8]> {
    let mut rest: &'static [u8] = include_bytes!("../../fuzz/seeds/roce_packets.corpus");
    let mut inputs = Vec::new();
    while let Some((len, tail)) = rest.split_first_chunk::<4>() {
        let len = usize::try_from(u32::from_le_bytes(*len)).unwrap();
        let (input, tail) = tail.split_at(len);
        inputs.push(input);
        rest = tail;
    }
    inputs
}

#[test]
fn the_fuzz_corpus_changes_nothing_outside_grants() {
    let inputs = corpus();
    assert_eq!(inputs.len(), 686, "the corpus file is whole");
    for (i, input) in inputs.into_iter().enumerate() {
        if std::panic::catch_unwind(|| roce_soup::run(input)).is_err() {
            panic!("corpus input {i} failed: {input:02x?}");
        }
    }
}
