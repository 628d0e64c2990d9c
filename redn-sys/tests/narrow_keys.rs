//! Narrow keys: no key a program holds spans more than it may touch, so the NIC itself keeps
//! writes into code inside declared patch points, and a client that knows or guesses a key
//! and address of the server's code can neither read nor write it.

mod common;

use common::*;
use redn_program::program::catalog::{self, HashVariant};
use redn_program::program::{Addr, Program, QueueRole};
use redn_program::wqe::{Payload, RemoteAddr, WrOp, BB_SIZE};
use redn_sys::conv::idx;
use redn_sys::nic::Nic;
use redn_sys::softnic::Prefetch;
use redn_sys::{Access, Rkey, VirtAddr};

fn catalog_programs() -> Vec<Program> {
    vec![
        catalog::echo(64, 4).unwrap(),
        catalog::hash_get(HashVariant::Single, 4).unwrap(),
        catalog::hash_get(HashVariant::Sequential, 4).unwrap(),
        catalog::hash_get(HashVariant::Parallel, 4).unwrap(),
        catalog::list_find(4, false, 2).unwrap(),
        catalog::list_find(4, true, 1).unwrap(),
        catalog::server_loop().unwrap(),
    ]
}

/// The bytes of the code region a declared patch point covers, and the ring bytes.
fn patched_and_ring_bytes(rig: &Rig) -> (Vec<bool>, Vec<bool>) {
    let r = &rig.installed.resolver;
    let len = rig.installed.code.len();
    let mut patched = vec![false; len];
    let mut ring = vec![false; len];
    for p in &rig.program.patches {
        let at = r
            .addr(&rig.program, &Addr::wqe(&p.label, p.byte as usize))
            .unwrap()
            .0
            - r.code_addr.0;
        for b in &mut patched[idx(at)..idx(at + u64::from(p.len))] {
            *b = true;
        }
    }
    for (i, q) in rig.program.queues.iter().enumerate() {
        let at = r.layout.sq[i];
        for b in &mut ring[at..at + q.sq_bbs as usize * BB_SIZE] {
            *b = true;
        }
    }
    (patched, ring)
}

#[test]
fn every_key_over_code_covers_patch_points_or_statics_only() {
    for program in catalog_programs() {
        let name = program.name.clone();
        let rig = Rig::new(program, Prefetch::Depth(8));
        let (patched, ring) = patched_and_ring_bytes(&rig);
        let code = &rig.installed;
        assert!(!code.code_keys.is_empty(), "{name}");
        let mut covered = 0;
        for (w, mr) in &code.code_keys {
            let off = idx(mr.addr.0 - code.code_addr.0);
            assert_eq!((off, idx(mr.len)), (w.offset, w.len), "{name}: {}", w.what);
            for byte in off..off + w.len {
                // A ring byte a key covers is a patch point's; anything else is a static.
                assert!(
                    !ring[byte] || patched[byte],
                    "{name}: key {} over {} covers unpatchable ring byte {byte}",
                    mr.lkey,
                    w.what
                );
            }
            covered += w.len;
            if w.side == QueueRole::Client {
                for right in [
                    Access::REMOTE_READ,
                    Access::REMOTE_WRITE,
                    Access::REMOTE_ATOMIC,
                ] {
                    assert!(
                        !mr.access.contains(right),
                        "{name}: client-side key over {} has {right}",
                        w.what
                    );
                }
            }
        }
        assert!(
            covered < code.code.len(),
            "{name}: the keys cover the whole code region"
        );
        // Every key over code is one of the windows: none of the server's keys spans more.
        let code_range = code.code_addr.0..code.code_addr.0 + code.code.len() as u64;
        for mr in rig.server.regions() {
            if code_range.contains(&mr.addr.0) {
                assert!(
                    code.code_keys.iter().any(|(_, k)| k.lkey == mr.lkey),
                    "{name}: key {} over code at {} is no window's",
                    mr.lkey,
                    mr.addr
                );
            }
        }
    }
}

/// What the client tries against the server's code: one RDMA operation of up to 8 bytes
/// (what the pick says fits) with `rkey` at `addr`, from a fresh installation (a failed
/// request ends the client's connection).
fn attack(pick: impl Fn(&Rig) -> (VirtAddr, Rkey, u32), op: &str) {
    let rig = Rig::new(
        catalog::hash_get(HashVariant::Single, 4).unwrap(),
        Prefetch::Depth(8),
    );
    let (addr, rkey, n) = pick(&rig);
    let len = rig.installed.code.len();
    let mut before = vec![0u8; len];
    rig.installed.code.read(0, &mut before);
    rig.cbuf.write(0, &[0xee; 64]);
    let remote = RemoteAddr { addr, rkey };
    let local = rig.cbuf.mr.sge(0, n);
    let op_name = op;
    let op = match op {
        "write" => WrOp::Write {
            remote,
            payload: Payload::Sgl(vec![local]),
            imm: None,
        },
        "read" => WrOp::Read {
            remote,
            sgl: vec![local],
        },
        _ => WrOp::CompareSwap {
            remote,
            compare: 0,
            swap: u64::MAX,
            result: Some(rig.cbuf.mr.sge(0, 8)),
        },
    };
    rig.client.post_send(rig.cqp, &[wr(1, SIG, op)]).unwrap();
    let c = wait_cqes(&rig.client, rig.ccq, 1);
    assert!(
        c[0].status.is_err(),
        "{op:?} with key {rkey} at {addr} succeeded: {c:?}",
        op = c[0].opcode
    );
    let mut after = vec![0u8; len];
    rig.installed.code.read(0, &mut after);
    // The refused request moved the server's client-facing queue pair to error (as on
    // ConnectX), which flushed its receives; each flush completion counts for the worker's
    // WAIT, so the program may have run on stale triggers and rewritten its own patch
    // points. Nothing else may have changed, and the attacked bytes do not hold what the
    // attacker sent.
    let (patched, _) = patched_and_ring_bytes(&rig);
    for byte in (0..len).filter(|&i| before[i] != after[i]) {
        assert!(
            patched[byte],
            "the server's code changed at byte {byte}, no patch point's"
        );
    }
    let code_addr = rig.installed.code_addr.0;
    if addr.0 >= code_addr && addr.0 + u64::from(n) <= code_addr + len as u64 {
        let at = idx(addr.0 - code_addr);
        let sent = if op_name == "cas" { 0xff } else { 0xee };
        assert_ne!(
            after[at..at + n as usize],
            vec![sent; n as usize],
            "the attacker's bytes reached the code"
        );
    }
    assert_eq!(
        rig.cbuf.read(0, 64),
        vec![0xee; 64],
        "code bytes reached the client"
    );
}

/// The first code window of `side` that holds an aligned 8-byte word and whose rights
/// `rights` accepts, as (address, key, 8): the request itself then fits the window, so only
/// the key can refuse it.
fn aligned_window(
    rig: &Rig,
    side: QueueRole,
    rights: impl Fn(Access) -> bool,
) -> (VirtAddr, Rkey, u32) {
    let (_, mr) = rig
        .installed
        .code_keys
        .iter()
        .find(|(w, mr)| w.side == side && rights(w.access) && mr.len >= 8 && mr.addr.0 % 8 == 0)
        .expect("an aligned window");
    (mr.addr, mr.lkey.into(), 8)
}

#[test]
fn a_client_with_a_trigger_window_key_cannot_write_or_read_it() {
    for op in ["write", "read", "cas"] {
        attack(|rig| aligned_window(rig, QueueRole::Client, |_| true), op);
    }
}

#[test]
fn a_client_with_a_worker_window_key_cannot_use_it() {
    for op in ["write", "read", "cas"] {
        attack(
            |rig| {
                aligned_window(rig, QueueRole::Worker, |a| {
                    a.contains(Access::REMOTE_ATOMIC)
                })
            },
            op,
        );
    }
}

#[test]
fn a_client_guessing_any_server_key_at_the_rings_gets_nothing() {
    // Every key the server holds, aimed at the start of the code region (the first ring).
    let rig = Rig::new(
        catalog::hash_get(HashVariant::Single, 4).unwrap(),
        Prefetch::Depth(8),
    );
    let keys = rig.server.regions().len();
    drop(rig);
    for i in 0..keys {
        let op = ["write", "read", "cas"][i % 3];
        attack(
            |rig| {
                let key = rig.server.regions()[i].lkey;
                (rig.installed.code_addr, key.into(), 8)
            },
            op,
        );
    }
}
