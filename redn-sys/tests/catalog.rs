//! The offload catalog on the softnic, with the client on a second softnic instance.

mod common;
use common::*;
use redn_program::program::catalog::{self, HashVariant, BUCKET_STRIDE};
use redn_program::program::Iterations;
use redn_sys::conv::idx;
use redn_sys::install::RegionBinding;
use redn_sys::nic::Nic;
use redn_sys::softnic::Prefetch;
use redn_sys::QpState;

const MODES: [Prefetch; 2] = [Prefetch::AtExecute, Prefetch::Adversarial];
const VALUES_AT: usize = 512 << 10;
const TABLE_AT: usize = 0;

fn value(i: u64, len: usize) -> Vec<u8> {
    // The low byte of i * 31 + b.
    (0..len)
        .map(|b| (idx(i) * 31 + b).to_le_bytes()[0])
        .collect()
}

/// Fill `buckets` buckets; bucket i holds key `keys[i]` and value(i).
fn fill_table(rig: &Rig, keys: &[u64], len: usize) {
    for (i, &k) in keys.iter().enumerate() {
        let vaddr = VALUES_AT + i * 4096;
        rig.data.write(vaddr, &value(i as u64, len));
        let len = u32::try_from(len).unwrap();
        let b = catalog::bucket_bytes(k, len, rig.data.mr.addr.0 + vaddr as u64);
        rig.data.write(TABLE_AT + i * idx(BUCKET_STRIDE), &b);
    }
}

fn bucket_addr(rig: &Rig, i: u64) -> [u8; 8] {
    (rig.data.mr.addr.0 + TABLE_AT as u64 + i * BUCKET_STRIDE).to_be_bytes()
}

fn trigger(parts: &[&[u8]]) -> Vec<u8> {
    parts.concat()
}

#[test]
fn echo_returns_the_payload() {
    for mode in MODES {
        let mut rig = Rig::new(catalog::echo(16, 4).unwrap(), mode);
        for k in 0..4u32 {
            let msg = format!("echo number {k:04}").into_bytes();
            let r = rig.trigger(&msg, 1);
            assert_eq!(r, vec![(k, msg)], "{mode:?}");
        }
    }
}

#[test]
fn hash_get_single_hit_miss_and_collision() {
    for mode in MODES {
        let mut rig = Rig::new(catalog::hash_get(HashVariant::Single, 8).unwrap(), mode);
        let keys = [0x1111_2222_3333u64, 0xabcd_ef01_2345, 0x0000_0000_0001];
        fill_table(&rig, &keys, 64);
        let k = |i: usize| catalog::trigger_key(keys[i]);
        // hit
        let r = rig.trigger(&trigger(&[&k(1), &bucket_addr(&rig, 1)]), 1);
        assert_eq!(r, vec![(0, value(1, 64))], "{mode:?}");
        // miss: a key no bucket holds
        let r = rig.trigger(
            &trigger(&[&catalog::trigger_key(0x42), &bucket_addr(&rig, 1)]),
            1,
        );
        assert_eq!(r, vec![(1, vec![])], "{mode:?}");
        // collision: the key hashes to a bucket that holds another key
        let r = rig.trigger(&trigger(&[&k(2), &bucket_addr(&rig, 0)]), 1);
        assert_eq!(r, vec![(2, vec![])], "{mode:?}");
        // keys differing only in the top byte do not match
        let r = rig.trigger(
            &trigger(&[
                &catalog::trigger_key(keys[0] ^ (0xff << 40)),
                &bucket_addr(&rig, 0),
            ]),
            1,
        );
        assert_eq!(r, vec![(3, vec![])], "{mode:?}");
        let r = rig.trigger(&trigger(&[&k(0), &bucket_addr(&rig, 0)]), 1);
        assert_eq!(r, vec![(4, value(0, 64))], "{mode:?}");
    }
}

fn two_bucket(variant: HashVariant) {
    for mode in MODES {
        let mut rig = Rig::new(catalog::hash_get(variant, 8).unwrap(), mode);
        let keys = [0x10u64, 0x20, 0x30, 0x40];
        fill_table(&rig, &keys, 100);
        let msg = |key: u64, b0: u64, b1: u64, rig: &Rig| {
            let kk = catalog::trigger_key(key);
            trigger(&[&kk, &kk, &bucket_addr(rig, b0), &bucket_addr(rig, b1)])
        };
        let sorted = |mut v: Vec<(u32, Vec<u8>)>| {
            v.sort_by_key(|x| x.1.len());
            v
        };
        // hit in the first bucket
        let r = sorted(rig.trigger(&msg(0x10, 0, 1, &rig), 2));
        assert_eq!(
            r,
            vec![(0, vec![]), (0, value(0, 100))],
            "{variant:?} {mode:?}"
        );
        // collision: first bucket holds another key, the key is in the second
        let r = sorted(rig.trigger(&msg(0x40, 2, 3, &rig), 2));
        assert_eq!(
            r,
            vec![(1, vec![]), (1, value(3, 100))],
            "{variant:?} {mode:?}"
        );
        // miss in both
        let r = rig.trigger(&msg(0x99, 0, 1, &rig), 2);
        assert_eq!(r, vec![(2, vec![]), (2, vec![])], "{variant:?} {mode:?}");
    }
}

#[test]
fn hash_get_sequential_two_buckets() {
    two_bucket(HashVariant::Sequential);
}

#[test]
fn hash_get_parallel_two_buckets() {
    two_bucket(HashVariant::Parallel);
}

#[test]
fn bucket_address_outside_the_table_is_a_protection_error_not_an_answer() {
    // Bind the table to its first 4 KiB only; a bucket address past it must fail.
    let program = catalog::hash_get(HashVariant::Single, 4).unwrap();
    let server = std::sync::Arc::new(nic(1, Prefetch::Adversarial));
    let client = nic(1, Prefetch::Adversarial);
    let spd = server.alloc_pd().unwrap();
    let data = Region::new(&server, spd, 1 << 16, ALL);
    let cpd = client.alloc_pd().unwrap();
    let cbuf = Region::new(&client, cpd, 4096, ALL);
    let ccq = client
        .create_cq(redn_sys::nic::CqConfig::default())
        .unwrap();
    let cqp = client
        .create_qp(redn_sys::nic::QpConfig::new(cpd, ccq))
        .unwrap()
        .qpn;
    let mut regions = std::collections::HashMap::new();
    let local = |len, access| RegionBinding::Local {
        buffer: std::sync::Arc::clone(&data.buf),
        offset: 0,
        len,
        access,
    };
    regions.insert(
        "table".to_string(),
        local(4096, redn_sys::Access::REMOTE_READ),
    );
    regions.insert("values".to_string(), local(1 << 16, ALL));
    regions.insert(
        "response".to_string(),
        RegionBinding::Remote {
            addr: cbuf.mr.addr,
            rkey: cbuf.mr.lkey.into(),
            len: 4096,
        },
    );
    let inst = redn_sys::install::install(&server, &program, &regions, &mut |q| {
        redn_sys::softnic::SoftNic::connect_pair(&client, cqp, &server, q)
    })
    .unwrap();
    // A secret right after the table, in the same buffer.
    data.write(8192, b"SECRET!!");
    let b = catalog::bucket_bytes(7, 8, data.mr.addr.0 + 8192);
    data.write(8192 - 32, &b);
    client.post_recv(cqp, 0, &[]).unwrap();
    let evil = (data.mr.addr.0 + 8192 - 32).to_be_bytes();
    let msg = [catalog::trigger_key(7).as_slice(), &evil].concat();
    client
        .post_send(
            cqp,
            &[wr(
                1,
                SIG,
                redn_program::wqe::WrOp::Send {
                    payload: redn_program::wqe::Payload::Inline(msg),
                    imm: None,
                },
            )],
        )
        .unwrap();
    // The worker's READ faults: its QP goes to error with a remote access error; the client
    // gets nothing back, and the secret stays put. The worker is its own responder
    // (loopback), so the refused READ also raises an access-error event on it.
    let worker = inst.qp(&program, "worker0").unwrap();
    let deadline = std::time::Instant::now() + patience(5);
    let mut out = Vec::new();
    while !out.iter().any(|c: &redn_sys::nic::Completion| {
        c.status == Err(redn_program::wqe::Syndrome::RemoteAccess)
    }) {
        assert!(
            std::time::Instant::now() < deadline,
            "worker never faulted: {out:?}"
        );
        server.poll_cq(inst.cqs[1], 8, &mut out).unwrap_or(0);
        std::thread::yield_now();
    }
    assert_eq!(server.qp_state(worker).unwrap(), QpState::Error);
    // The READ's error completion (the refusal as responder is the event's to report).
    assert_eq!(server.counters(worker).unwrap().errors, 1);
    assert_eq!(
        server.get_async_event(),
        Some(redn_sys::nic::AsyncEvent::QpAccessError(worker))
    );
    let sent = wait_cqes(&client, ccq, 1);
    assert!(
        sent.iter()
            .all(|c| c.opcode == redn_program::wqe::CqeOpcode::Req),
        "no response: {sent:?}"
    );
    assert_eq!(cbuf.read(0, 8), [0u8; 8]);
}

/// Lay out a list of `keys` in order; the last node points at itself.
fn fill_list(rig: &Rig, keys: &[u64]) -> u64 {
    let base = rig.data.mr.addr.0;
    let node = |i: usize| base + 64 * i as u64;
    for (i, &k) in keys.iter().enumerate() {
        let vaddr = VALUES_AT + i * 4096;
        rig.data.write(vaddr, &value(i as u64, 32));
        let next = if i + 1 < keys.len() {
            node(i + 1)
        } else {
            node(i)
        };
        let b = catalog::node_bytes(k, 32, base + vaddr as u64, next);
        rig.data.write(64 * i, &b);
    }
    node(0)
}

fn list_trigger(head: u64, key: u64, steps: u32, with_break: bool) -> Vec<u8> {
    let mut m = head.to_be_bytes().to_vec();
    if with_break {
        m.extend(head.to_be_bytes());
    }
    for _ in 0..steps {
        m.extend(catalog::trigger_key(key));
        if with_break {
            m.extend(catalog::trigger_key(key));
        }
    }
    m
}

#[test]
fn list_find_at_each_position_with_and_without_break() {
    let steps = 6u32;
    let keys: Vec<u64> = (0..steps as u64).map(|i| 0x7000 + i).collect();
    for mode in MODES {
        for with_break in [false, true] {
            let positions = steps as u64 + 1;
            // Without break one installation serves every trigger; with break each trigger
            // gets a fresh installation (a break leaves its queue stopped).
            let fresh = || {
                Rig::new(
                    catalog::list_find(
                        steps,
                        with_break,
                        if with_break {
                            1
                        } else {
                            u32::try_from(positions).unwrap()
                        },
                    )
                    .unwrap(),
                    mode,
                )
            };
            let mut rig = fresh();
            let mut executed = Vec::new();
            for pos in 0..positions {
                if with_break && pos > 0 {
                    rig = fresh();
                }
                let head = fill_list(&rig, &keys);
                let k = if with_break {
                    0
                } else {
                    u32::try_from(pos).unwrap()
                };
                let key = if pos < steps as u64 {
                    keys[idx(pos)]
                } else {
                    0xdead
                };
                let before = rig.server_wqes();
                let msg = list_trigger(head, key, steps, with_break);
                let found = pos < steps as u64;
                let expect: Vec<(u32, Vec<u8>)> = match (found, with_break) {
                    (true, true) => vec![(k, value(pos, 32))],
                    (false, true) => vec![(k, vec![])],
                    (true, false) => vec![(k, value(pos, 32)), (k, vec![])],
                    (false, false) => vec![(k, vec![])],
                };
                let got = rig.trigger(&msg, expect.len());
                assert_eq!(got, expect, "pos {pos} break {with_break} {mode:?}");
                // Let the rest of the chain finish before counting.
                settle(&rig.server, || installed_wqes(&rig.server, &rig.installed));
                executed.push(rig.server_wqes() - before);
            }
            if with_break {
                // Break stops at the match: the WQEs executed grow with the match position,
                // and finding the first node costs well under half of a full traversal.
                assert!(executed.windows(2).all(|w| w[0] < w[1]), "{executed:?}");
                assert!(executed[0] * 3 < executed[steps as usize], "{executed:?}");
            } else {
                assert!(executed.windows(2).all(|w| w[0] == w[1]), "{executed:?}");
            }
            eprintln!(
                "list-find break={with_break} {mode:?}: WQEs per lookup by position {executed:?}"
            );
        }
    }
}

#[test]
fn server_loop_serves_1000_gets_with_no_host_posts() {
    for mode in MODES {
        let mut rig = Rig::new(catalog::server_loop().unwrap(), mode);
        let keys: Vec<u64> = (0..16).map(|i| 0x5000 + i).collect();
        fill_table(&rig, &keys, 48);
        let posts = rig.server_host_posts();
        // Fewer under Miri, which takes most of a second a GET, and in a debug build. (Each
        // GET is a pass of the one-round rings; optimised, 1000 take well under a second.)
        let gets: u64 = if cfg!(miri) {
            40
        } else if cfg!(debug_assertions) {
            200
        } else {
            1000
        };
        for i in 0..gets {
            let b = i % 17;
            let key = if b < 16 { keys[b as usize] } else { 0x1 };
            let msg = trigger(&[&catalog::trigger_key(key), &bucket_addr(&rig, b % 16)]);
            let r = rig.trigger(&msg, 1);
            let expect = if b < 16 { value(b, 48) } else { vec![] };
            assert_eq!(r, vec![(0, expect)], "request {i} {mode:?}");
        }
        assert_eq!(
            rig.server_host_posts(),
            posts,
            "the server host posted during the loop"
        );
        // A round runs every WQE of both rings and the response; the last round may still be
        // re-arming when the client has its answer.
        let Iterations::Recycled { wqes_per_round } = rig.program.iterations else {
            panic!("server-loop is recycled");
        };
        assert!(
            rig.server_wqes() >= (gets - 1) * u64::from(wqes_per_round),
            "{}",
            rig.server_wqes()
        );
    }
}

/// `program` with every fence flag cleared.
fn without_fences(mut program: redn_program::program::Program) -> redn_program::program::Program {
    for q in &mut program.queues {
        for w in &mut q.wqes {
            w.flags = redn_program::wqe::WqeFlags(w.flags.0 & 0x1f);
        }
    }
    program
}

#[test]
fn hash_get_needs_its_fence_when_read_responses_land_late() {
    // RedN fences the CAS that compares what the READ before it brought. With prefetch at
    // execute, responses land at once and the fence changes nothing; in the adversarial
    // setting a READ's response lands only when something waits for it, so the chain as
    // shipped (fenced) still hits, and the same chain without its fences compares the bytes
    // from before the READ and answers "not found".
    let keys = [0x1111_2222_3333u64, 0xabcd_ef01_2345];
    for mode in [
        Prefetch::AtExecute,
        Prefetch::Depth(8),
        Prefetch::Adversarial,
    ] {
        for fenced in [true, false] {
            let program = catalog::hash_get(HashVariant::Single, 8).unwrap();
            let program = if fenced {
                program
            } else {
                without_fences(program)
            };
            let mut rig = Rig::new(program, mode);
            fill_table(&rig, &keys, 64);
            let msg = trigger(&[&catalog::trigger_key(keys[1]), &bucket_addr(&rig, 1)]);
            let r = rig.trigger(&msg, 1);
            let hit = vec![(0, value(1, 64))];
            if fenced || mode != Prefetch::Adversarial {
                assert_eq!(r, hit, "{mode:?}, fenced {fenced}");
            } else {
                assert_eq!(r, vec![(0, vec![])], "{mode:?}, without fences");
            }
        }
    }
}
