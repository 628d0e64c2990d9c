//! Configuration, policy and the offload verifier for the RedN manager.
//!
//! This crate is pure logic: it never touches a device and needs no privileges, so it can be
//! tested and fuzzed anywhere. What is here:
//!
//! - [`config`]: `manager.toml` (sockets, backend and device selection, data plane, audit),
//!   loaded with [`load_manager_config`] or [`parse_manager_config`];
//! - [`policy`]: `policy.toml` (app rules, the offloads each may install, quotas, limits on
//!   remote clients), loaded with [`load_policy`] or [`parse_policy`];
//! - [`identity`]: choosing the app rule for a local peer ([`Policy::match_app`], most
//!   specific rule wins) and the [`Token`] remote clients present;
//! - [`units`]: sizes (`"64M"`, base 1024 like systemd), durations (`"5min"`, `"infinity"`)
//!   and rates;
//! - [`definition`]: offload definition files (`offloads.d/NAME.toml`), the readable form of
//!   a [`Program`](redn_program::program::Program), loaded with [`load_definition`],
//!   [`parse_definition`] or [`load_offloads_dir`] and written with [`write_definition`];
//! - [`verifier`]: the offload verifier ([`verify`]): admits a program for a client only if
//!   every WQE stays inside the client's grants, and says why not in a verifier log;
//! - [`error`]: the crate's one [`Error`] type.
//!
//! Modules import each other in one direction only: `error` and `names` (the name rule)
//! first, then `units`, `source` (capped reading) and `identity`, then `config`, `definition`
//! and `policy`; `verifier` imports none of them.
//!
//! # Loading files
//!
//! Every file is read with a cap of [`MAX_FILE_BYTES`] (1 MiB): a larger one is refused
//! before anything is parsed. Unknown keys are refused. Every error names the file, the line
//! and column, and the key, in the `FILE:LINE:COLUMN: KEY: MESSAGE` form:
//!
//! ```
//! let text = "[backend]\nkind = \"mlx5\"\ndevice = \"mlx5_0\"\nnode_guid = \"0002:c903:00a1:b2c3\"\n";
//! let err = redn_policy::parse_manager_config(text, "manager.toml").unwrap_err();
//! assert_eq!(
//!     err.to_string(),
//!     "manager.toml:4:1: backend.node_guid: select the device one way only: device is also set \
//!      (keep one of device, node_guid, pci_address)"
//! );
//! ```
//!
//! Keys inside an `[[app]]` are shown after the app's name: `app "kv" client.on_violation`.
//! The `parse_*` functions take the text and an `origin` to name it by, for tests and
//! fuzzing; they apply the same cap.
//!
//! # Example
//!
//! ```
//! use redn_policy::{parse_policy, PeerIdentity};
//!
//! let policy = parse_policy(
//!     r#"
//! [[app]]
//! name = "kv"
//! exe = "/usr/bin/kvstore"
//! offloads = ["hash-get"]
//! max_regions = 4
//! max_pinned = "1G"
//! max_queues = 16
//! max_remote_clients = 64
//! [app.client]
//! rate_limit_kbps = 1000000
//! wqes_per_second = "2M"
//! wqes_per_invocation = 64
//! on_violation = "terminate"
//! "#,
//!     "policy.toml",
//! )?;
//! let peer = PeerIdentity {
//!     uid: 1000,
//!     gid: 1000,
//!     pid: 4242,
//!     exe: "/usr/bin/kvstore".into(),
//!     cgroup: "/user.slice/user-1000.slice/session-2.scope".into(),
//!     start_time: 123_456,
//! };
//! let app = policy.match_app(&peer).expect("kv matches");
//! assert!(app.allows_offload("hash-get"));
//! assert_eq!(app.quota.max_pinned.bytes(), 1 << 30);
//! # Ok::<(), redn_policy::Error>(())
//! ```
#![forbid(unsafe_code)]
#![warn(missing_docs)]

pub mod config;
pub mod definition;
pub mod error;
pub mod identity;
mod names;
pub mod policy;
mod source;
pub mod units;
pub mod verifier;

pub use config::{
    load_manager_config, parse_manager_config, AuditConfig, Backend, Dataplane, DeviceSelector,
    Facility, FileMode, ManagerConfig, NodeGuid, PciAddress, Prefetch, SocketConfig,
};
pub use definition::{
    load_definition, load_offloads_dir, parse_definition, shipped_offloads, write_definition,
    ShippedOffload,
};
pub use error::{Error, Location, Result};
pub use identity::{Matchers, PeerIdentity, Specificity, Token};
pub use policy::{
    load_policy, parse_policy, AppRule, ClientLimits, OnViolation, Policy, Quota, SourceNet,
    TriggerRate,
};
pub use source::MAX_FILE_BYTES;
pub use units::{ByteSize, KbitRate, TimeSpan, WqeRate};
pub use verifier::{verify, Finding, Grants, RegionGrant, Report, Rule};

#[cfg(test)]
mod tests {
    use super::*;

    const MANAGER: &str = include_str!("../../etc/redn/manager.toml");
    const POLICY: &str = include_str!("../../etc/redn/policy.toml");

    /// Parse `text` both ways; errors must name the origin. Panics are the failure.
    fn parse_both(text: &str) {
        for e in [
            parse_manager_config(text, "m.toml").err(),
            parse_policy(text, "p.toml").err(),
        ]
        .into_iter()
        .flatten()
        {
            let e = e.to_string();
            assert!(e.starts_with("m.toml") || e.starts_with("p.toml"), "{e}");
        }
    }

    #[test]
    fn truncated_examples_never_panic() {
        for text in [MANAGER, POLICY] {
            for (i, _) in text.char_indices().step_by(7) {
                parse_both(&text[..i]);
            }
        }
    }

    #[test]
    fn mutated_examples_never_panic() {
        // xorshift64*, fixed seed: the same mutations every run.
        let mut state = 0x9e37_79b9_7f4a_7c15_u64;
        let mut next = move || {
            state ^= state >> 12;
            state ^= state << 25;
            state ^= state >> 27;
            state.wrapping_mul(0x2545_f491_4f6c_dd1d)
        };
        let alphabet = b"[]{}=\"'#.,:-_0123456789kMGsx \n\tab/\\";
        for round in 0..1500 {
            let base = if round % 2 == 0 { MANAGER } else { POLICY };
            let mut bytes = base.as_bytes().to_vec();
            for _ in 0..1 + next() % 4 {
                let at = usize::try_from(next() % bytes.len() as u64).unwrap();
                let c = alphabet[usize::try_from(next() % alphabet.len() as u64).unwrap()];
                match next() % 3 {
                    0 => bytes[at] = c,
                    1 => bytes.insert(at, c),
                    _ => {
                        bytes.remove(at);
                    }
                }
            }
            if let Ok(text) = String::from_utf8(bytes) {
                parse_both(&text);
            }
        }
    }
}
