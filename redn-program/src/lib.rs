//! RedN offload programs as pure data.
//!
//! This crate is what the verifier, the manager and every backend share about programs, and
//! nothing else: it makes no system call, starts no thread, holds no `unsafe`, and cannot
//! reach a device. A crate that reasons about programs (the verifier in `redn-policy`)
//! depends on this one only, so it cannot touch a NIC even by mistake.
//!
//! - [`endian`]: the big-endian integers WQE, CQE and data bytes hold;
//! - [`types`]: the numbers an RNIC hands out (keys, queue and CQ numbers, addresses) and
//!   access rights;
//! - [`wqe`]: the byte-exact mlx5 send/receive WQE and CQE encoder and decoder;
//! - [`program`]: offload programs (IR, builder, layout, listing) and the offload catalog.
//!
//! Installing a program on a NIC is `redn_sys::install`.

#![forbid(unsafe_code)]

pub mod endian;
pub mod program;
pub mod types;
pub mod wqe;

pub use types::{Access, Cqn, Lkey, Pdn, Qpn, Rkey, VirtAddr};
