//! Baselines: one-sided READs (the client doing the lookup over the same softnic connection)
//! and the CPU (the same lookup on the same `SharedBuffer`).

use super::contents::{bucket_off, BUCKET_LEN32, LIST_STEPS, NODE_LEN32, READ_AT};
use super::env::{Env, Reader};
use super::{take_cqes, wait_cq, SIG};
use redn_bench::bytes::be48;
use redn_bench::native::{mean_ns_samples, on_threads};
use redn_bench::queues::SqWriter;
use redn_bench::stats::ns;
use redn_bench::wait::WaitMode;
use redn_bench::Ctx;
use redn_program::endian::{Be32, Be64};
use redn_program::program::catalog::{BUCKET_BYTES, NODE_BYTES};
use redn_program::wqe::{WorkRequest, WrOp};
use redn_sys::conv::idx;
use redn_sys::mem::SharedBuffer;
use redn_sys::nic::Nic;
use redn_sys::{Cqn, VirtAddr};
use std::time::{Duration, Instant};

/// One READ from the server's data region into the client buffer at READ_AT + `dst`, waited
/// for. The WQE is encoded here (the client builds it from what the previous READ returned).
fn read_once(
    env: &Env,
    r: &mut SqWriter,
    cq: Cqn,
    reads: &[(u64, u64, u32)],
) -> Result<(), String> {
    for &(src_addr, dst, len) in reads {
        let wr = WorkRequest {
            wr_id: 1,
            flags: SIG,
            op: WrOp::Read {
                remote: redn_program::wqe::RemoteAddr {
                    addr: VirtAddr(src_addr),
                    rkey: env.data.mr.lkey.into(),
                },
                sgl: vec![env.cbuf.mr.sge(READ_AT + dst, len)],
            },
        };
        r.push(&env.client, &wr)?;
    }
    let base = env.client.cq_produced(cq).ctx("cq_produced")?;
    r.ring(&env.client)?;
    wait_cq(&env.client, cq, base + reads.len() as u64, WaitMode::Spin)?;
    let cqes = take_cqes(&env.client, cq, reads.len())?;
    if let Some(c) = cqes.iter().find(|c| !c.is_ok()) {
        return Err(format!("READ failed: {c:?}"));
    }
    Ok(())
}

/// A bucket's or list node's key, value length and value address: the catalog's layout
/// (`catalog::bucket_bytes`, `node_bytes`).
struct Entry {
    key: u64,
    len: u32,
    addr: u64,
}

impl Entry {
    fn parse(b: &[u8]) -> Entry {
        Entry {
            key: be48(b),
            len: Be32::read(b, 6).get(),
            addr: Be64::read(b, 10).get(),
        }
    }
}

/// A list node's next pointer (after the entry's fields).
pub(crate) fn next_node(n: &[u8]) -> u64 {
    Be64::read(n, BUCKET_BYTES).get()
}

/// READ the value of `found`, if any, into the client buffer at READ_AT + 256: its length (0
/// when nothing was found).
fn read_value(env: &Env, rd: &mut Reader, found: Option<Entry>) -> Result<usize, String> {
    match found {
        Some(e) => {
            read_once(env, &mut rd.sq, rd.cq, &[(e.addr, 256, e.len)])?;
            Ok(e.len as usize)
        }
        None => Ok(0),
    }
}

/// Hash GET by one-sided READs: READ the candidate buckets (all in one post), check the key,
/// READ the value. Returns the ns taken and the value's length (0: not found).
pub(crate) fn read_get(
    env: &Env,
    rd: &mut Reader,
    key: u64,
    buckets: &[u64],
) -> Result<(f64, usize), String> {
    env.wake(&[])?;
    let t0 = Instant::now();
    let reads: Vec<(u64, u64, u32)> = buckets
        .iter()
        .enumerate()
        .map(|(i, &b)| (env.data.addr(bucket_off(b)), 32 * i as u64, BUCKET_LEN32))
        .collect();
    read_once(env, &mut rd.sq, rd.cq, &reads)?;
    let mut hit = None;
    for i in 0..buckets.len() {
        let mut bk = [0u8; BUCKET_BYTES];
        env.cbuf.buf.read(idx(READ_AT) + 32 * i, &mut bk);
        let e = Entry::parse(&bk);
        if e.key == key {
            hit = Some(e);
            break;
        }
    }
    let len = read_value(env, rd, hit)?;
    Ok((ns(t0.elapsed()), len))
}

/// List find by one-sided READs: READ node after node until the key matches (then READ the
/// value) or the walk has covered LIST_STEPS nodes.
pub(crate) fn read_find(
    env: &Env,
    rd: &mut Reader,
    head: u64,
    key: u64,
) -> Result<(f64, usize), String> {
    env.wake(&[])?;
    let t0 = Instant::now();
    let mut node = head;
    let mut found = None;
    for _ in 0..LIST_STEPS {
        read_once(env, &mut rd.sq, rd.cq, &[(node, 0, NODE_LEN32)])?;
        let mut n = [0u8; NODE_BYTES];
        env.cbuf.buf.read(idx(READ_AT), &mut n);
        let e = Entry::parse(&n);
        if e.key == key {
            found = Some(e);
            break;
        }
        node = next_node(&n);
    }
    let len = read_value(env, rd, found)?;
    Ok((ns(t0.elapsed()), len))
}

/// Copy the value of `e`, in `data` (whose first byte is at address `base`), to the start of
/// `dst`: its length.
fn copy_value(data: &SharedBuffer, base: u64, dst: &SharedBuffer, e: &Entry) -> usize {
    let len = e.len as usize;
    dst.copy_from(0, data, idx(e.addr - base), len);
    len
}

/// The CPU's hash GET on the same buffer: read each candidate bucket, compare, copy the value
/// into `dst`. Returns the value length.
pub(crate) fn native_get(
    data: &SharedBuffer,
    base: u64,
    dst: &SharedBuffer,
    key: u64,
    buckets: &[u64],
) -> usize {
    for &b in buckets {
        let mut bk = [0u8; BUCKET_BYTES];
        data.read(idx(bucket_off(b)), &mut bk);
        let e = Entry::parse(&bk);
        if e.key == key {
            return copy_value(data, base, dst, &e);
        }
    }
    0
}

/// The CPU's list find on the same buffer.
pub(crate) fn native_find(
    data: &SharedBuffer,
    base: u64,
    dst: &SharedBuffer,
    head: u64,
    key: u64,
) -> usize {
    let mut node = head;
    for _ in 0..LIST_STEPS {
        let mut n = [0u8; NODE_BYTES];
        data.read(idx(node - base), &mut n);
        let e = Entry::parse(&n);
        if e.key == key {
            return copy_value(data, base, dst, &e);
        }
        node = next_node(&n);
    }
    0
}

/// Per-operation ns of `f`, timed over batches sized so a batch moves ~64 KiB (1..64 ops).
pub(crate) fn native_samples(
    samples: usize,
    bytes_per_op: usize,
    f: impl FnMut() -> usize,
) -> Vec<f64> {
    let batch = (65536 / bytes_per_op.max(1)).clamp(1, 64);
    mean_ns_samples(samples, batch, batch * 16, f)
}

/// `threads` CPU threads each running `f(count)` (which times itself) at the same time:
/// total operations per second over the slowest thread.
pub(crate) fn native_parallel(
    threads: usize,
    count: u64,
    f: &(dyn Fn(u64) -> Duration + Sync),
) -> f64 {
    let slowest = on_threads(threads, |_| f(count))
        .into_iter()
        .map(|r| r.unwrap_or(Duration::MAX))
        .max()
        .unwrap_or(Duration::MAX);
    threads as f64 * count as f64 / slowest.as_secs_f64()
}
