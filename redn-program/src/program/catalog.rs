//! The offload catalog: builder functions for the programs operators install.
//!
//! Shared conventions:
//! - the client-facing queue is `client`; its CQ counts only receives (responses are
//!   unsignaled), so `WAIT(client, k)` means "trigger k has arrived";
//! - every response is an RDMA WRITE with immediate into the client's `response` region at
//!   offset 0, immediate = the invocation number (round number for `server-loop`, which uses
//!   0); a zero-length response means "not found";
//! - keys are 48-bit: stored **big-endian** in app memory, sent **little-endian** in triggers
//!   (the CAS compares a control word read as a little-endian u64 against a big-endian
//!   operand, so the two byte orders meet);
//! - addresses in triggers and app memory are big-endian 64-bit virtual addresses of the
//!   bound regions.
//!
//! | offload | trigger | response |
//! |---|---|---|
//! | `echo` | `payload` bytes | the same bytes |
//! | `hash-get` | key (6, LE) · bucket address (8, BE) | the value, or 0 bytes |
//! | `hash-get-seq` / `hash-get-par` | key · key · bucket 1 · bucket 2 | one response per bucket: the value or 0 bytes |
//! | `list-find` | head (8, BE) · key × N | the value of each match, then a 0-byte end marker |
//! | `list-find-break` | head · head · (key · key) × N | the first match's value, or 0 bytes |
//! | `server-loop` | key · bucket address (as hash-get) | the value, or 0 bytes; forever |

use super::{
    wqe_byte, Addr, Builder, Form, Iterations, Op, PatchSource, Program, ProgramError, QueueHandle,
    QueueRole, RegionRole, Sge,
};
use crate::endian::{Be32, Be64};
use crate::types::Access;
use crate::wqe::{off, WqeFlags};

/// Bytes of one hash bucket: key (BE48) @0, value length (BE32) @6, value address (BE64) @10.
/// A probe lands only the length's low three bytes in the response's byte count (its top
/// byte holds the inline bit): values are below 2^24 bytes.
pub const BUCKET_LEN: u64 = BUCKET_BYTES as u64;
/// [`BUCKET_LEN`] as a buffer size.
pub const BUCKET_BYTES: usize = 18;
/// Distance between buckets in a table.
pub const BUCKET_STRIDE: u64 = 32;
/// Bytes of one list node: key (BE48) @0, length (BE32) @6, value address (BE64) @10,
/// next node (BE64) @18.
pub const NODE_LEN: u64 = NODE_BYTES as u64;
/// [`NODE_LEN`] as a buffer size.
pub const NODE_BYTES: usize = 26;

/// Encode a hash bucket.
#[must_use]
pub fn bucket_bytes(key: u64, value_len: u32, value_addr: u64) -> [u8; BUCKET_BYTES] {
    let mut b = [0u8; BUCKET_BYTES];
    // BE48: the low six of the key's eight big-endian bytes.
    b[..6].copy_from_slice(&Be64::new(key).to_bytes()[2..]);
    Be32::new(value_len).write(&mut b, 6);
    Be64::new(value_addr).write(&mut b, 10);
    b
}

/// Encode a list node.
#[must_use]
pub fn node_bytes(key: u64, value_len: u32, value_addr: u64, next: u64) -> [u8; NODE_BYTES] {
    let mut b = [0u8; NODE_BYTES];
    b[..18].copy_from_slice(&bucket_bytes(key, value_len, value_addr));
    Be64::new(next).write(&mut b, 18);
    b
}

/// A key as a trigger carries it.
pub fn trigger_key(key: u64) -> [u8; 6] {
    let b = key.to_le_bytes();
    [b[0], b[1], b[2], b[3], b[4], b[5]]
}

/// A ring size for `n` entries: the next power of two. Past 2^31 it says 2^31, the largest
/// power of two a `u32` holds, and [`Builder::build`] refuses the ring as too small.
fn pow2(n: u64) -> u32 {
    u32::try_from(n.max(1).next_power_of_two()).unwrap_or(1 << 31)
}

const NONE: WqeFlags = WqeFlags::NONE;
const SIG: WqeFlags = WqeFlags::SIGNALED;

fn wait(b: &mut Builder, on: QueueHandle, label: &str, q: QueueHandle, count: u32) {
    let queue = b.name(q);
    b.push(on, label, Op::Wait { queue, count }, NONE, Form::Active);
}

fn enable(b: &mut Builder, on: QueueHandle, label: &str, q: QueueHandle, count: u32) {
    let queue = b.name(q);
    b.push(on, label, Op::SendEn { queue, count }, NONE, Form::Active);
}

/// The response WQE for a probe, posted as a NOP: WRITE_IMM of a value whose length and
/// address a READ patches in.
fn response(b: &mut Builder, client: QueueHandle, label: &str, imm: u32) {
    let op = Op::Write {
        remote: Addr::region("response", 0),
        sgl: vec![Sge::new(Addr::region("values", 0), 1)],
        imm: Some(imm),
    };
    b.push(client, label, op, NONE, Form::Nop);
}

/// A zero-length response (the not-found / end marker), posted active.
fn marker(b: &mut Builder, client: QueueHandle, label: &str, imm: u32) {
    let op = Op::Write {
        remote: Addr::region("response", 0),
        sgl: vec![],
        imm: Some(imm),
    };
    b.push(client, label, op, NONE, Form::Active);
}

/// READ of a bucket or node (its address patched in by someone else) into the response's
/// operand bytes, length and address, plus `extra` scatter entries for the bytes after them.
fn probe_read(
    b: &mut Builder,
    on: QueueHandle,
    label: &str,
    region: &str,
    resp: &str,
    extra: Vec<Sge>,
) {
    let mut sgl = Builder::operand_sges(resp);
    // The value length's top byte goes to a scratch block, not to the response's byte count:
    // its bit 31 would make the data segment inline, and the response would then send the
    // WQE's own bytes (its key and addresses) to the client. The count's top byte stays 0,
    // so a value is at most 2^24 - 1 bytes (a message is at most 16 MiB anyway).
    sgl.push(Sge::new(Addr::static_(LEN_TOP, 0), 1));
    sgl.push(Sge::new(Addr::wqe(resp, 33), 3));
    sgl.push(Sge::new(Addr::wqe(resp, 40), 8));
    sgl.extend(extra);
    b.patch_sges(
        &sgl,
        PatchSource::Read {
            label: label.into(),
        },
    );
    b.push(
        on,
        label,
        Op::Read {
            remote: Addr::region(region, 0),
            sgl,
        },
        NONE,
        Form::Active,
    );
}

/// The scratch block where a probe's READ drops the top byte of a value's length.
const LEN_TOP: &str = "len.top";

fn data_regions(b: &mut Builder, table: &str, table_doc: &str) {
    b.static_block(LEN_TOP, vec![0u8; 8]);
    b.region(
        table,
        RegionRole::Data {
            access: Access::REMOTE_READ,
        },
        BUCKET_LEN,
        table_doc,
    );
    b.region(
        "values",
        RegionRole::Data {
            access: Access::NONE,
        },
        1,
        "the values the table points at (read by the response)",
    );
    b.region(
        "response",
        RegionRole::Response,
        1,
        "the client's response buffer",
    );
}

/// One probe of one bucket for invocation `k`: READ, `if` (hit: the response sends the
/// value), `else` (miss: a zero-length response). Declares the trigger patches: the key
/// (param `key_param`) and the bucket address (param `addr_param`). Returns the receive
/// entries for the trigger, in param order (key first, then address).
fn bucket_probe(
    b: &mut Builder,
    w: QueueHandle,
    resp: &str,
    tag: &str,
) -> Result<(Vec<Sge>, Vec<Sge>), ProgramError> {
    let read = format!("{tag}.read");
    let cas = format!("{tag}.if");
    probe_read(b, w, &read, "table", resp, vec![]);
    b.if_eq(w, &cas, resp, None, NONE)?;
    b.else_unchanged(w, &format!("{tag}.else"), resp, SIG);
    Ok((
        Builder::compare_sges(&cas),
        vec![Sge::new(Addr::wqe(&read, off::RADDR), 8)],
    ))
}

fn trigger_patches(b: &mut Builder, sgl: &[Sge], param: &str) {
    b.patch_sges(
        sgl,
        PatchSource::Trigger {
            param: param.into(),
        },
    );
}

/// Bucket-probing strategy of a hash GET.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum HashVariant {
    /// One bucket.
    Single,
    /// Two buckets, one after the other on one worker queue.
    Sequential,
    /// Two buckets at once on two worker queues on different PUs, joined before answering.
    Parallel,
}

/// `echo`: the client SENDs `payload` bytes; they come back by RDMA WRITE with immediate.
/// Serves `invocations` triggers.
pub fn echo(payload: u32, invocations: u32) -> Result<Program, ProgramError> {
    if payload == 0 || payload > 4096 {
        return Err(ProgramError::Invalid(format!(
            "echo payload {payload} outside 1..=4096"
        )));
    }
    let n = invocations.max(1);
    let echo_bytes = usize::try_from(u64::from(n) * u64::from(payload)).map_err(|_| {
        ProgramError::Invalid(format!(
            "echo of {payload} bytes {n} times does not fit this host's memory"
        ))
    })?;
    let mut b = Builder::new("echo", "SEND in, WRITE the payload back");
    b.region(
        "response",
        RegionRole::Response,
        u64::from(payload),
        "the client's response buffer",
    );
    b.param("payload", payload, "bytes to echo");
    b.static_block("echo", vec![0u8; echo_bytes]);
    let client = b.queue(
        "client",
        QueueRole::Client,
        true,
        false,
        Some(0),
        pow2(u64::from(n)),
        pow2(u64::from(n)),
        1,
    );
    let w = b.queue(
        "worker",
        QueueRole::Worker,
        false,
        false,
        Some(0),
        pow2(2 * u64::from(n)),
        1,
        1,
    );
    for k in 0..n {
        let slot = Addr::static_("echo", u64::from(k) * u64::from(payload));
        b.recv(client, vec![Sge::new(slot.clone(), payload)]);
        let op = Op::Write {
            remote: Addr::region("response", 0),
            sgl: vec![Sge::new(slot, payload)],
            imm: Some(k),
        };
        b.push(client, &format!("{k}.reply"), op, NONE, Form::Active);
        wait(&mut b, w, &format!("{k}.wait"), client, k);
        enable(&mut b, w, &format!("{k}.release"), client, k + 1);
    }
    b.entry(w, 2 * n);
    b.finish(
        Iterations::bounded(n, 3),
        "the payload, by WRITE_IMM (immediate = invocation number)",
    );
    b.build()
}

/// `hash-get` in its three variants over a table of 2-choice buckets. Serves `invocations`
/// triggers.
pub fn hash_get(variant: HashVariant, invocations: u32) -> Result<Program, ProgramError> {
    let n = invocations.max(1);
    let (name, summary) = match variant {
        HashVariant::Single => ("hash-get", "hash GET probing one bucket"),
        HashVariant::Sequential => ("hash-get-seq", "hash GET probing two buckets on one queue"),
        HashVariant::Parallel => (
            "hash-get-par",
            "hash GET probing two buckets on two PUs in parallel",
        ),
    };
    let mut b = Builder::new(name, summary);
    data_regions(
        &mut b,
        "table",
        "the bucket table (18-byte buckets: key BE48, len BE32, value address BE64)",
    );
    let buckets: u32 = if variant == HashVariant::Single { 1 } else { 2 };
    for i in 0..buckets {
        b.param(
            &format!("key{i}"),
            6,
            "the key, little-endian 48 bits (repeated once per bucket)",
        );
    }
    for i in 0..buckets {
        b.param(
            &format!("bucket{i}"),
            8,
            "address of a candidate bucket in the table, big-endian",
        );
    }
    let per_inv_w: u32 = match variant {
        HashVariant::Single => 8,
        HashVariant::Sequential => 12,
        HashVariant::Parallel => 6,
    };
    // The answer is enabled by the join; keep the client queue on the join's PU so the
    // answer does not cross PUs (worker1 is on PU 1 in the parallel variant).
    let client_pu = if variant == HashVariant::Parallel {
        1
    } else {
        0
    };
    let client = b.queue(
        "client",
        QueueRole::Client,
        true,
        false,
        Some(client_pu),
        pow2(u64::from(n * buckets)),
        pow2(u64::from(n)),
        8,
    );
    let w0 = b.queue(
        "worker0",
        QueueRole::Worker,
        true,
        false,
        Some(0),
        pow2(u64::from(per_inv_w * n)),
        1,
        1,
    );
    let w1 = (variant == HashVariant::Parallel).then(|| {
        b.queue(
            "worker1",
            QueueRole::Worker,
            true,
            false,
            Some(1),
            pow2(u64::from(9 * n)),
            1,
            1,
        )
    });
    for k in 0..n {
        let mut keys = Vec::new();
        let mut addrs = Vec::new();
        // Header of each worker: wait for trigger k, then enable this invocation.
        let workers: Vec<QueueHandle> = [Some(w0), w1].into_iter().flatten().collect();
        for (i, &w) in workers.iter().enumerate() {
            let per = if i == 1 { 9 } else { per_inv_w };
            wait(&mut b, w, &format!("{k}.w{i}.trigger"), client, k);
            let next = (per * (k + 1) + 2).min(per * n);
            enable(&mut b, w, &format!("{k}.w{i}.go"), w, next);
        }
        for bucket in 0..buckets {
            let resp = format!("{k}.r{bucket}");
            response(&mut b, client, &resp, k);
            let w = if bucket == 1 { w1.unwrap_or(w0) } else { w0 };
            let (key, addr) = bucket_probe(&mut b, w, &resp, &format!("{k}.b{bucket}"))?;
            trigger_patches(&mut b, &key, &format!("key{bucket}"));
            trigger_patches(&mut b, &addr, &format!("bucket{bucket}"));
            keys.extend(key);
            addrs.extend(addr);
        }
        let join = w1.unwrap_or(w0);
        let done = b.signaled(join) - 1;
        wait(&mut b, join, &format!("{k}.join"), join, done);
        if let Some(_w1) = w1 {
            let d0 = b.signaled(w0) - 1;
            wait(&mut b, join, &format!("{k}.join0"), w0, d0);
        }
        enable(
            &mut b,
            join,
            &format!("{k}.answer"),
            client,
            buckets * (k + 1),
        );
        keys.extend(addrs);
        b.recv(client, keys);
    }
    for w in [Some(w0), w1].into_iter().flatten() {
        b.entry(w, 2);
    }
    let wqes = per_inv_w + w1.map_or(0, |_| 9) + buckets;
    b.finish(
        Iterations::bounded(n, wqes),
        "one WRITE_IMM per bucket probed: the value on a hit, zero bytes on a miss",
    );
    b.build()
}

/// `list-find` over a linked list, unrolled for `steps` nodes, with or without `break`.
/// Serves `invocations` triggers. The last node's `next` should point at itself: a list
/// shorter than `steps` is then re-read harmlessly.
///
/// With `break`, a match turns the SEND_EN that would start the next step into a NOP, so the
/// rest of the traversal never runs. Queues run in order and enabling is a prefix, so the
/// stopped queue can serve no later trigger: `list-find-break` serves one trigger per
/// installation, and the manager lays out a fresh instance for the next (as RedN's CPU
/// re-posts its chains).
pub fn list_find(steps: u32, with_break: bool, invocations: u32) -> Result<Program, ProgramError> {
    if steps == 0 || steps > 14 {
        return Err(ProgramError::Invalid(format!(
            "list-find steps {steps} outside 1..=14"
        )));
    }
    if with_break && invocations > 1 {
        return Err(ProgramError::Invalid(format!(
            "list-find-break serves one trigger per installation, not {invocations}: a break \
             leaves its queue stopped"
        )));
    }
    let n = invocations.max(1);
    let name = if with_break {
        "list-find-break"
    } else {
        "list-find"
    };
    let mut b = Builder::new(name, "find a key in a linked list (unrolled)");
    data_regions(
        &mut b,
        "list",
        "the list nodes (26 bytes: key BE48, len BE32, value BE64, next BE64)",
    );
    b.param("head", 8, "address of the first node, big-endian");
    if with_break {
        b.param("head_copy", 8, "the same address again");
    }
    for j in 0..steps {
        b.param(
            &format!("key{j}"),
            6,
            "the key, little-endian 48 bits (one copy per CAS)",
        );
        if with_break {
            b.param(&format!("key{j}_break"), 6, "the key again");
        }
    }
    b.static_block("sink", vec![0u8; 8]);
    let s = u64::from(steps);
    let per_inv_w: u32 = if with_break {
        2 + 7 * steps + 4 * (steps - 1) + 2 + 1
    } else {
        2 + 6 * steps + 1
    };
    let client = b.queue(
        "client",
        QueueRole::Client,
        true,
        false,
        Some(0),
        pow2((s + 1) * u64::from(n)),
        pow2(u64::from(n)),
        64,
    );
    let w = b.queue(
        "worker",
        QueueRole::Worker,
        true,
        false,
        Some(0),
        pow2(u64::from(per_inv_w) * u64::from(n)),
        1,
        1,
    );
    let step_a: u32 = if with_break { 7 } else { 6 };
    for k in 0..n {
        let base = b.pos(w);
        let s_base = (steps + 1) * k;
        let mut rsgl = Vec::new();
        wait(&mut b, w, &format!("{k}.trigger"), client, k);
        enable(&mut b, w, &format!("{k}.go"), w, base + 2 + step_a);
        for j in 0..steps {
            let resp = format!("{k}.r{j}");
            response(&mut b, client, &resp, k);
            let read = format!("{k}.s{j}.read");
            let next_read = format!("{k}.s{}.read", j + 1);
            let next = if j + 1 < steps {
                Sge::new(Addr::wqe(&next_read, off::RADDR), 8)
            } else {
                Sge::new(Addr::static_("sink", 0), 8)
            };
            let gate = format!("{k}.s{j}.next");
            if j == 0 {
                let head = vec![Sge::new(Addr::wqe(&read, off::RADDR), 8)];
                trigger_patches(&mut b, &head, "head");
                rsgl.extend(head);
                if with_break {
                    let head2 = vec![Sge::new(Addr::wqe(&format!("{k}.s0.key"), off::RADDR), 8)];
                    trigger_patches(&mut b, &head2, "head_copy");
                    rsgl.extend(head2);
                }
            }
            probe_read(&mut b, w, &read, "list", &resp, vec![next]);
            if with_break {
                // A second READ of the node's key into the operand bytes of the gate.
                let key_read = format!("{k}.s{j}.key");
                let sgl = Builder::operand_sges(&gate);
                b.patch_sges(
                    &sgl,
                    PatchSource::Read {
                        label: key_read.clone(),
                    },
                );
                b.push(
                    w,
                    &key_read,
                    Op::Read {
                        remote: Addr::region("list", 0),
                        sgl,
                    },
                    NONE,
                    Form::Active,
                );
            }
            let cas = format!("{k}.s{j}.if");
            b.if_eq(w, &cas, &resp, None, if with_break { NONE } else { SIG })?;
            let key = Builder::compare_sges(&cas);
            trigger_patches(&mut b, &key, &format!("key{j}"));
            rsgl.extend(key);
            if with_break {
                let brk = format!("{k}.s{j}.break");
                b.break_if_eq(w, &brk, &gate, SIG);
                let key = Builder::compare_sges(&brk);
                trigger_patches(&mut b, &key, &format!("key{j}_break"));
                rsgl.extend(key);
            }
            let c = b.signaled(w) - 1;
            wait(&mut b, w, &format!("{k}.s{j}.wait"), w, c);
            if with_break {
                // Part B of the step: enabled only now that the gate is final.
                let last = j + 1 == steps;
                let part_b = if last { 2 } else { 4 };
                let here = b.pos(w) + 1;
                enable(&mut b, w, &format!("{k}.s{j}.b"), w, here + part_b);
                if !last {
                    let copy = format!("{k}.s{j}.copy");
                    let dst = format!("{k}.s{}.key", j + 1);
                    b.patch(
                        &dst,
                        wqe_byte(off::RADDR),
                        8,
                        PatchSource::Write {
                            label: copy.clone(),
                        },
                    );
                    let op = Op::Write {
                        remote: Addr::wqe(&dst, off::RADDR),
                        sgl: vec![Sge::new(Addr::wqe(&next_read, off::RADDR), 8)],
                        imm: None,
                    };
                    b.push(w, &copy, op, SIG, Form::Active);
                    let c = b.signaled(w) - 1;
                    wait(&mut b, w, &format!("{k}.s{j}.copied"), w, c);
                }
                enable(
                    &mut b,
                    w,
                    &format!("{k}.s{j}.answer"),
                    client,
                    s_base + j + 1,
                );
                // The gate: enables the next step's part A (or the end), unless `break`
                // turned it into a NOP.
                let upto = if last {
                    b.pos(w) + 1 + 1
                } else {
                    b.pos(w) + 1 + step_a
                };
                enable(&mut b, w, &gate, w, upto);
            } else {
                enable(
                    &mut b,
                    w,
                    &format!("{k}.s{j}.answer"),
                    client,
                    s_base + j + 1,
                );
                let upto = if j + 1 < steps {
                    b.pos(w) + 1 + step_a
                } else {
                    b.pos(w) + 1 + 1
                };
                enable(&mut b, w, &gate, w, upto);
            }
        }
        marker(&mut b, client, &format!("{k}.end"), k);
        // After the last step: answer "not found" (break) or "end of list" (no break), and
        // enable the next invocation's header.
        enable(
            &mut b,
            w,
            &format!("{k}.end.en"),
            client,
            s_base + steps + 1,
        );
        b.recv(client, rsgl);
        // Re-point the last gate so it also enables the next invocation's header.
        let end_pos = b.pos(w);
        let hdr = if k + 1 < n { 2 } else { 0 };
        b.set_enable_count(&format!("{k}.s{}.next", steps - 1), end_pos + hdr);
    }
    b.entry(w, 2);
    b.finish(
        Iterations::bounded(n, per_inv_w + steps + 1),
        if with_break {
            "the value of the first node whose key matches, or zero bytes"
        } else {
            "a WRITE_IMM with the value of each matching node, then a zero-byte end marker"
        },
    );
    b.build()
}

/// `server-loop`: a recycled hash GET (one bucket) that serves triggers forever with no host
/// post after setup.
///
/// Each round's WAIT/ENABLE counts are advanced from host-order counters by a byte-reversing
/// READ into the next round's WQEs and a FETCH_ADD (`Builder::advance_count`), so the loop
/// runs with the host-order atomic replies of upstream Linux. A WQE is never patched once it
/// may have been fetched: the worker and the re-arm queue patch each other's re-arming WQEs
/// while the other is not enabled (the SEND_EN that enables the other is fenced, so the
/// READs have landed), and the probe (patched by each trigger) is enabled only after the
/// trigger arrived.
pub fn server_loop() -> Result<Program, ProgramError> {
    let mut b = Builder::new(
        "server-loop",
        "hash GET (one bucket), served forever by a recycled loop",
    );
    data_regions(
        &mut b,
        "table",
        "the bucket table (18-byte buckets: key BE48, len BE32, value address BE64)",
    );
    b.param("key0", 6, "the key, little-endian 48 bits");
    b.param(
        "bucket0",
        8,
        "address of the bucket in the table, big-endian",
    );
    const W: u32 = 32; // worker ring: one round
    const H: u32 = 32; // re-arm ring: one round
    let client = b.queue("client", QueueRole::Client, true, true, Some(0), 1, 1, 4);
    let w = b.queue("worker", QueueRole::Worker, true, false, Some(0), W, 1, 1);
    let h = b.queue("rearm", QueueRole::Worker, true, false, Some(0), H, 1, 1);
    // Counters hold the value a count takes in the round after the one that patches it.
    let w_ = u64::from(W);
    let h_ = u64::from(H);
    let counters: [(&str, u64, u64); 8] = [
        ("c.trigger", 2, 2),      // worker WAIT(client) for trigger r: completion 2r
        ("c.go", 2 * w_, w_),     // worker SEND_EN(self) after the trigger: 16(r+1)
        ("c.done", 1, 1),         // worker WAIT(self) for the else-CAS: r
        ("c.answer", 2, 1),       // worker SEND_EN(client): r+1
        ("c.sent", 3, 2),         // worker WAIT(client) for the response: 2r+1
        ("c.rearm", 2 * h_, h_),  // worker SEND_EN(rearm): 8(r+1)
        ("c.recv", 2, 1),         // rearm RECV_EN(client): r+2 (patched in the same round)
        ("c.worker", w_ + 2, w_), // rearm SEND_EN(worker): 16(r+1)+2 (same round)
    ];
    for (name, first, _) in counters {
        b.static_block(name, first.to_le_bytes().to_vec());
    }
    let step = |name: &str| counters.iter().find(|c| c.0 == name).map_or(0, |c| c.2);
    b.static_block("resp.nop", vec![0, 0, 0, 0, 0, 0, 0, 3]);
    // The response, reused every round; signaled so the worker knows when it has gone out.
    let resp = "resp";
    let op = Op::Write {
        remote: Addr::region("response", 0),
        sgl: vec![Sge::new(Addr::region("values", 0), 1)],
        imm: Some(0),
    };
    b.push(client, resp, op, SIG, Form::Nop);

    // Worker, one round (16 BBs).
    wait(&mut b, w, "trigger", client, 0);
    enable(&mut b, w, "go", w, W);
    b.patch(
        resp,
        0,
        8,
        PatchSource::Write {
            label: "reset".into(),
        },
    );
    let reset = Op::Write {
        remote: Addr::wqe(resp, 0),
        sgl: vec![Sge::new(Addr::static_("resp.nop", 0), 8)],
        imm: None,
    };
    b.push(w, "reset", reset, NONE, Form::Active);
    let (key, addr) = bucket_probe(&mut b, w, resp, "probe")?;
    trigger_patches(&mut b, &key, "key0");
    trigger_patches(&mut b, &addr, "bucket0");
    let mut rsgl = key;
    rsgl.extend(addr);
    b.recv(client, rsgl);
    wait(&mut b, w, "done", w, 0);
    enable(&mut b, w, "answer", client, 1);
    wait(&mut b, w, "sent", client, 1);
    b.advance_count(w, "adv.recv", "c.recv", step("c.recv"), "rearm.recv");
    b.advance_count(
        w,
        "adv.worker",
        "c.worker",
        step("c.worker"),
        "rearm.worker",
    );
    let rearm = b.name(h);
    let to_rearm = Op::SendEn {
        queue: rearm,
        count: H,
    };
    b.push(w, "to.rearm", to_rearm, WqeFlags::FENCE, Form::Active);
    debug_assert!(b.pos(w) <= W, "the worker's round fits its ring");
    while b.pos(w) < W {
        let l = format!("pad{}", b.pos(w));
        b.push(w, &l, Op::Nop, NONE, Form::Active);
    }
    // Re-arm queue, one round (8 BBs): patch the worker's next round, let the next trigger
    // in, then enable the worker's next trigger WAIT and its SEND_EN.
    for (label, counter, target) in [
        ("adv.rearm", "c.rearm", "to.rearm"),
        ("adv.trigger", "c.trigger", "trigger"),
        ("adv.go", "c.go", "go"),
        ("adv.done", "c.done", "done"),
        ("adv.answer", "c.answer", "answer"),
        ("adv.sent", "c.sent", "sent"),
    ] {
        b.advance_count(h, label, counter, step(counter), target);
    }
    let client_name = b.name(client);
    b.push(
        h,
        "rearm.recv",
        Op::RecvEn {
            queue: client_name,
            count: 2,
        },
        NONE,
        Form::Active,
    );
    let worker = b.name(w);
    let rearm_worker = Op::SendEn {
        queue: worker,
        count: W + 2,
    };
    b.push(
        h,
        "rearm.worker",
        rearm_worker,
        WqeFlags::FENCE,
        Form::Active,
    );
    debug_assert!(b.pos(h) <= H, "the re-arm round fits its ring");
    while b.pos(h) < H {
        let l = format!("rpad{}", b.pos(h));
        b.push(h, &l, Op::Nop, NONE, Form::Active);
    }
    b.recv_entry(client, 1);
    b.entry(w, 2);
    // Every WQE of both rings and the response run once a round.
    let wqes_per_round = b.wqe_count(w) + b.wqe_count(h) + 1;
    b.finish(
        Iterations::Recycled { wqes_per_round },
        "the value, or zero bytes (immediate 0); one trigger at a time",
    );
    b.build()
}
