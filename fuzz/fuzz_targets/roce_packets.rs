//! Arbitrary datagrams into a softnic's RoCEv2 endpoint with a connected QP (see
//! `redn-sys/tests/roce_soup`, shared with the `roce_packets` test): no panic, no byte
//! outside the granted and receive regions changes, every drop counted, the QP connected or
//! in error.
#![no_main]

use libfuzzer_sys::fuzz_target;

#[path = "../../redn-sys/tests/roce_soup/mod.rs"]
mod roce_soup;

fuzz_target!(|data: &[u8]| roce_soup::run(data));
