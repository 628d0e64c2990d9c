//! The regions' layout, and what the server's region holds: the hash table's buckets and
//! values and the list's nodes and values; and the trigger messages that look them up.

use super::env::Env;
use redn_bench::bytes::low_byte;
use redn_program::program::catalog::{self, BUCKET_LEN, BUCKET_STRIDE, NODE_LEN};
use redn_sys::conv::idx;

// Server data region layout.
pub(crate) const DATA_LEN: usize = 2 << 20;
const TABLE_AT: u64 = 0;
const LIST_AT: u64 = 8192;
const HVALUES_AT: u64 = 64 << 10;
const HVALUE_STRIDE: u64 = 64 << 10;
const LVALUES_AT: u64 = 1 << 20;
pub(crate) const SCRATCH_AT: u64 = 1536 << 10;
pub(crate) const BUCKETS: u64 = 8;
pub(crate) const LIST_STEPS: u32 = 8;
pub(crate) const LIST_VALUE: u32 = 64;
// The catalog's bucket and node sizes (18 and 26 bytes) as READ lengths; the assertion
// checks that the casts keep them whole.
#[allow(clippy::cast_possible_truncation)]
pub(crate) const BUCKET_LEN32: u32 = BUCKET_LEN as u32;
#[allow(clippy::cast_possible_truncation)]
pub(crate) const NODE_LEN32: u32 = NODE_LEN as u32;
const _: () = assert!(BUCKET_LEN32 as u64 == BUCKET_LEN && NODE_LEN32 as u64 == NODE_LEN);

// Client region layout.
pub(crate) const CBUF_LEN: usize = 256 << 10;
pub(crate) const RESP_LEN: u64 = 64 << 10;
pub(crate) const READ_AT: u64 = 128 << 10;

pub(crate) fn hkey(b: u64) -> u64 {
    0x00a0_0000_0000 + b * 0x0001_0203
}

pub(crate) fn hvalue(b: u64, size: usize) -> Vec<u8> {
    (0..size)
        .map(|i| low_byte(idx(b) * 37 + i * 7 + size / 64))
        .collect()
}

fn hvalue_off(b: u64) -> u64 {
    HVALUES_AT + b * HVALUE_STRIDE
}

pub(crate) fn bucket_off(b: u64) -> u64 {
    TABLE_AT + b * BUCKET_STRIDE
}

/// Fill the table: bucket b holds key hkey(b) and a value of `size` bytes.
pub(crate) fn fill_table(env: &Env, size: usize) {
    for b in 0..BUCKETS {
        env.data.write(hvalue_off(b), &hvalue(b, size));
        let len = u32::try_from(size).expect("value sizes are at most 64 KiB");
        let bytes = catalog::bucket_bytes(hkey(b), len, env.data.addr(hvalue_off(b)));
        env.data.write(bucket_off(b), &bytes);
    }
}

fn bucket_addr(env: &Env, b: u64) -> [u8; 8] {
    env.data.addr(bucket_off(b)).to_be_bytes()
}

pub(crate) fn single_msg(env: &Env, key: u64, b: u64) -> Vec<u8> {
    [catalog::trigger_key(key).as_slice(), &bucket_addr(env, b)].concat()
}

pub(crate) fn two_msg(env: &Env, key: u64, b0: u64, b1: u64) -> Vec<u8> {
    let k = catalog::trigger_key(key);
    [
        k.as_slice(),
        &k,
        &bucket_addr(env, b0),
        &bucket_addr(env, b1),
    ]
    .concat()
}

pub(crate) fn lkey(i: u64) -> u64 {
    0x0070_0000_0000 + i * 0x0011
}

pub(crate) fn lvalue(i: u64) -> Vec<u8> {
    (0..LIST_VALUE as usize)
        .map(|b| low_byte(idx(i) * 31 + b))
        .collect()
}

fn lnode_off(i: u64) -> u64 {
    LIST_AT + 64 * i
}

/// Lay out the list; the last node points at itself. Returns the head's address.
pub(crate) fn fill_list(env: &Env) -> u64 {
    let steps = u64::from(LIST_STEPS);
    for i in 0..steps {
        let next = if i + 1 < steps {
            lnode_off(i + 1)
        } else {
            lnode_off(i)
        };
        let voff = LVALUES_AT + i * 4096;
        env.data.write(voff, &lvalue(i));
        let b = catalog::node_bytes(
            lkey(i),
            LIST_VALUE,
            env.data.addr(voff),
            env.data.addr(next),
        );
        env.data.write(lnode_off(i), &b);
    }
    env.data.addr(lnode_off(0))
}

pub(crate) fn list_msg(head: u64, key: u64, with_break: bool) -> Vec<u8> {
    let mut m = head.to_be_bytes().to_vec();
    if with_break {
        m.extend(head.to_be_bytes());
    }
    for _ in 0..LIST_STEPS {
        m.extend(catalog::trigger_key(key));
        if with_break {
            m.extend(catalog::trigger_key(key));
        }
    }
    m
}
