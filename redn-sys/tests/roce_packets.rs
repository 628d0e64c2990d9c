//! Arbitrary datagrams into a softnic's RoCE endpoint, in every test run: the
//! `roce_packets` fuzz target's harness (`roce_soup`: no panic, no byte outside the granted
//! and receive regions changes, drops counted, the QP connected or in error) on a few
//! hundred seeded random inputs.

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
