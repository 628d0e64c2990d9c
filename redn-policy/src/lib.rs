//! Configuration, policy and the offload verifier for the RedN manager.
//!
//! This crate is pure logic: it never touches a device and needs no privileges. It is a
//! skeleton until the policy issue lands; see `docs/architecture.md`.
#![forbid(unsafe_code)]
