//! The shipped catalog: [`shipped_offloads`] makes the programs of `etc/redn/offloads.d/`
//! with their default sizes, and [`ShippedOffload::file_text`] the text of each file (a
//! comment header, then the definition), as the example `gen_offloads` writes them.

use super::write_definition;
use redn_program::program::{catalog, Program, ProgramError};

/// One offload of the shipped catalog: the program a [`catalog`] builder makes with the
/// documented default sizes, and the comment header of its file.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct ShippedOffload {
    /// The program.
    pub program: Program,
    /// The builder call that made it, such as `catalog::echo(64, 4)`.
    pub builder: &'static str,
    /// What the offload does, its trigger and its response (without comment markers).
    pub about: &'static str,
}

impl ShippedOffload {
    /// `NAME.toml`.
    pub fn file_name(&self) -> String {
        format!("{}.toml", self.program.name)
    }

    /// The file's text: a comment header, then [`write_definition`] of the program.
    pub fn file_text(&self) -> String {
        let mut s = String::new();
        for line in self.about.lines() {
            push_comment(&mut s, line);
        }
        push_comment(&mut s, "");
        for line in CONVENTIONS.lines() {
            push_comment(&mut s, line);
        }
        push_comment(&mut s, "");
        push_comment(
            &mut s,
            &format!(
                "Generated from the builder redn_program::program::{} by",
                self.builder
            ),
        );
        push_comment(
            &mut s,
            "`cargo run -p redn-policy --example gen_offloads`; a test checks that this file",
        );
        push_comment(
            &mut s,
            "loads to exactly that program. To adapt it, copy it under a new name (the file name",
        );
        push_comment(
            &mut s,
            "must equal `name`) and edit the copy; the format is described in the docs of",
        );
        push_comment(&mut s, "redn_policy::definition.");
        s.push('\n');
        s.push_str(&write_definition(&self.program));
        s
    }
}

fn push_comment(s: &mut String, line: &str) {
    if line.is_empty() {
        s.push_str("#\n");
    } else {
        s.push_str("# ");
        s.push_str(line);
        s.push('\n');
    }
}

/// The catalog's shared conventions, stated in every shipped file.
const CONVENTIONS: &str = "\
Conventions: keys are 48-bit, stored big-endian in app memory and sent little-endian in
triggers; addresses in triggers and app memory are big-endian 64-bit virtual addresses of
the bound regions. Every response is an RDMA WRITE with immediate into the client's
`response` region at offset 0; a zero-length response means \"not found\".";

/// The trigger, response and capacity of the two-bucket hash GETs (`hash-get-seq`,
/// `hash-get-par`), for their `about`.
macro_rules! two_bucket_get {
    () => {
        "Trigger:  key0 · key1 (the same key twice, 6 bytes each, little-endian) · bucket0 ·
          bucket1 (8 bytes each, big-endian addresses of the two candidate buckets).
Response: one WRITE_IMM per bucket: its value on a hit, zero bytes on a miss;
          immediate = invocation number.
Serves 4 triggers per installation (bounded)."
    };
}

/// The shipped catalog with its default sizes: `echo(64, 4)`, `hash_get(v, 4)` for the
/// three variants, `list_find(8, false, 4)`, `list_find(8, true, 1)` and `server_loop()`,
/// in that order. These are the files of `etc/redn/offloads.d/`.
pub fn shipped_offloads() -> std::result::Result<Vec<ShippedOffload>, ProgramError> {
    use catalog::HashVariant;
    let hash = |v: HashVariant| catalog::hash_get(v, 4);
    Ok(vec![
        ShippedOffload {
            program: catalog::echo(64, 4)?,
            builder: "catalog::echo(64, 4)",
            about: "echo: the client SENDs a payload; it comes back by RDMA WRITE with immediate.

Trigger:  payload (64 bytes): the bytes to echo.
Response: the same 64 bytes, by WRITE_IMM into the client's `response` region at
          offset 0; immediate = invocation number.
Serves 4 triggers per installation (bounded); the receives land in the static
block `echo`, one 64-byte slot per invocation.",
        },
        ShippedOffload {
            program: hash(HashVariant::Single)?,
            builder: "catalog::hash_get(HashVariant::Single, 4)",
            about: "hash-get: a hash-table GET probing one bucket.

Trigger:  key0 (6 bytes, little-endian 48-bit key) · bucket0 (8 bytes, big-endian
          address of the candidate bucket in `table`).
Response: the value (WRITE_IMM of the bucket's value bytes from `values`) if the
          bucket's key matches, or a zero-length WRITE_IMM if not; immediate =
          invocation number.
Buckets are 18 bytes: key (BE48) @0, value length (BE32, below 2^24: the offload takes
its low three bytes) @6, value address (BE64) @10.
Serves 4 triggers per installation (bounded).",
        },
        ShippedOffload {
            program: hash(HashVariant::Sequential)?,
            builder: "catalog::hash_get(HashVariant::Sequential, 4)",
            about: concat!(
                "hash-get-seq: a hash-table GET probing two buckets, one after the other on one
worker queue.

",
                two_bucket_get!()
            ),
        },
        ShippedOffload {
            program: hash(HashVariant::Parallel)?,
            builder: "catalog::hash_get(HashVariant::Parallel, 4)",
            about: concat!(
                "hash-get-par: a hash-table GET probing two buckets at once on two worker queues
on different processing units, joined before answering.

",
                two_bucket_get!()
            ),
        },
        ShippedOffload {
            program: catalog::list_find(8, false, 4)?,
            builder: "catalog::list_find(8, false, 4)",
            about: "list-find: find a key in a linked list, unrolled for 8 nodes, without break.

Trigger:  head (8 bytes, big-endian address of the first node) · key0 .. key7 (the
          key once per step, 6 bytes each, little-endian).
Response: a WRITE_IMM with the value of each node whose key matches, then a
          zero-length end marker; immediate = invocation number.
Nodes are 26 bytes: key (BE48) @0, length (BE32, below 2^24) @6, value address (BE64) @10,
next node (BE64) @18. The last node's next should point at itself, so that a list
shorter than 8 nodes is re-read harmlessly.
Serves 4 triggers per installation (bounded).",
        },
        ShippedOffload {
            program: catalog::list_find(8, true, 1)?,
            builder: "catalog::list_find(8, true, 1)",
            about: "list-find-break: find a key in a linked list, unrolled for 8 nodes, stopping at
the first match (RedN's `break` turns the SEND_EN of the next step into a NOP).

Trigger:  head · head_copy (the first node's address twice, 8 bytes each,
          big-endian) · (keyJ · keyJ_break) for J = 0..7 (the key twice per step,
          6 bytes each, little-endian).
Response: the value of the first node whose key matches, or zero bytes;
          immediate = invocation number.
A break leaves its queue stopped, so an installation serves one trigger; the
manager lays out a fresh instance for the next.",
        },
        ShippedOffload {
            program: catalog::server_loop()?,
            builder: "catalog::server_loop()",
            about: "server-loop: a hash-table GET (one bucket) served forever by a recycled loop,
with no host post after setup.

Trigger:  key0 (6 bytes, little-endian) · bucket0 (8 bytes, big-endian bucket
          address), as for hash-get.
Response: the value, or zero bytes; immediate 0. One trigger at a time.
Each round's WAIT/ENABLE counts are copied from the host-order counters in the
static blocks c.* by READs that reverse their bytes into the next round's WQEs,
then advanced by FETCH_ADDs (no atomic reply is used: upstream Linux returns them
in host order).
Recycled: it needs a loop budget in the policy, which the manager's auditor
enforces.",
        },
    ])
}
