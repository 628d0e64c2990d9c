//! RedN's benchmarks on the softnic, and what they share. They print tables, not verdicts a
//! test could check; run each in release mode, `-- --help` for its options:
//!
//! - `cargo run --release -p redn-bench --bin softnic_bench`: the paper's §5.1
//!   microbenchmarks. (1) Chain latency by chain length (Fig. 8) in WQ, completion and
//!   doorbell order, the host seeing the end by polling the CQ, spinning on its count, or
//!   spinning on a word the chain's last WRITE sets; with the per-step slope. (2) Throughput
//!   per opcode (NOP, 64 B WRITE and READ, CAS, FAA; re-armed and `post_send` WRITEs) on
//!   one PU and on all PUs. (3) What queues without work (idle or parked on a WAIT) cost a
//!   busy PU per visit. Each figure sits next to a native baseline: the CPU doing the same
//!   memory operations on the same buffers in the same run.
//! - `cargo run --release -p redn-bench --bin offload_bench`: the paper's Table 3 and
//!   §5.2-5.3 with a server and a client softnic. (1) Construct throughput: `if`, unrolled
//!   and recycled `while`, on one PU and on all PUs. (2) Hash GET latency by value size: one
//!   bucket, two buckets in sequence and in parallel, a host that polls or sleeps. (3)
//!   List-find latency by the key's position, with and without `break`, and the WQEs each
//!   lookup runs. Baselines: the client doing the lookup with one-sided READs, and the CPU
//!   doing it on the same memory; then what installing each program cost.
//! - `cargo run --release -p redn-bench --bin chain_profile -- STEPS ROUNDS`: one long
//!   doorbell-ordered chain (or `--write`: a run of 64 B WRITEs) on one PU while the host
//!   sleeps, so that callgrind (`--toggle-collect='redn_sys::softnic::exec::SqExec::run'`)
//!   counts the executor's instructions per step; `--spin` for wall-clock time, `--parked N`
//!   / `--idle N` to put quiet queues beside it.
//! - `target/release/paper_bench [--quick] [--out DIR]` (after `cargo build --release -p
//!   redn-manager -p redn-bench`): the paper's end-to-end figures through the real
//!   `redn-manager` binary, with app, writer and remote-client processes, as tables and SVG
//!   plots ([`plot`]); committed results in `docs/results/`.
//!
//! The library holds one copy of what the binaries share: reading the command line
//! ([`opts`]), median / p99 and the table's number formats ([`stats`], [`report`]), the
//! queues, CQs, regions and softnics they run on ([`setup`]), writing WQEs straight into a
//! send ring and the chains built from them ([`queues`]), waiting for the softnic and what
//! to say when it hangs ([`wait`]), big-endian fields ([`bytes`]), timing the native
//! baselines ([`native`]), the hypervisor's share of the CPUs ([`steal`]), and line plots as
//! SVG ([`plot`]).

pub mod bytes;
pub mod native;
pub mod opts;
pub mod plot;
pub mod queues;
pub mod report;
pub mod setup;
pub mod stats;
pub mod steal;
pub mod wait;

use std::fmt::Display;

/// Errors as text that says what failed: `nic.create_cq(c).ctx("create_cq")?`.
pub trait Ctx<T> {
    /// The value, or the error as text prefixed with `what`.
    fn ctx(self, what: &str) -> Result<T, String>;
}

impl<T, E: Display> Ctx<T> for Result<T, E> {
    fn ctx(self, what: &str) -> Result<T, String> {
        self.map_err(|e| format!("{what}: {e}"))
    }
}
