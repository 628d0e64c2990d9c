//! What the benchmark binaries share: command-line parsing, statistics, waiting for the
//! softnic, writing WQEs straight into a send ring, the native baselines' timing and the
//! report's head and tail.

pub mod bytes;
pub mod native;
pub mod opts;
pub mod queues;
pub mod report;
pub mod setup;
pub mod stats;
pub mod wait;

use std::fmt::Display;

/// Errors as text that says what failed: `nic.create_cq(c).ctx("create_cq")?`.
pub trait Ctx<T> {
    fn ctx(self, what: &str) -> Result<T, String>;
}

impl<T, E: Display> Ctx<T> for Result<T, E> {
    fn ctx(self, what: &str) -> Result<T, String> {
        self.map_err(|e| format!("{what}: {e}"))
    }
}
