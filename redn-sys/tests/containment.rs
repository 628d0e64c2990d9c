//! The verifier and the softnic together: for every catalog program the verifier accepts,
//! arbitrary client triggers never make the NIC read or write memory outside the client's
//! grants. A trigger either gets a well-formed answer or ends in an error completion with a
//! protection (or length) syndrome; no byte outside the granted windows changes, and the
//! read-only grants do not change at all.

mod common;
use common::{installed_wqes, settle, wait_until};
use redn_policy::{verify, Grants};
use redn_program::program::catalog::{self, HashVariant, BUCKET_STRIDE};
use redn_program::program::Program;
use redn_program::wqe::{Payload, Syndrome, WorkRequest, WqeFlags, WrOp};
use redn_sys::conv::idx;
use redn_sys::install::{install, RegionBinding};
use redn_sys::mem::SharedBuffer;
use redn_sys::nic::{Completion, CqConfig, Nic, QpConfig};
use redn_sys::softnic::{Prefetch, SoftNic, SoftNicConfig};
use redn_sys::{Access, QpState};
use std::collections::HashMap;
use std::sync::Arc;

const GUARD: u8 = 0x5a;
/// Server memory: guard | table (4 KiB) | values (8 KiB) | guard.
const SERVER_LEN: usize = 32 << 10;
const TABLE: (usize, usize) = (4096, 4096);
const VALUES: (usize, usize) = (8192, 8192);
/// Client memory: guard | response buffer (8 KiB) | guard.
const CLIENT_LEN: usize = 16 << 10;
const RESPONSE: (usize, usize) = (4096, 8192);

struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
    fn below32(&mut self, n: u32) -> u32 {
        u32::try_from(self.below(u64::from(n))).unwrap()
    }
    fn byte(&mut self) -> u8 {
        self.next().to_le_bytes()[0]
    }
}

fn snapshot(b: &SharedBuffer) -> Vec<u8> {
    let mut v = vec![0u8; b.len()];
    b.read(0, &mut v);
    v
}

struct World {
    server: std::sync::Arc<SoftNic>,
    client: SoftNic,
    smem: Arc<SharedBuffer>,
    cmem: Arc<SharedBuffer>,
    table_addr: u64,
    values_addr: u64,
    cqp: redn_sys::Qpn,
    ccq: redn_sys::Cqn,
    installed: redn_sys::install::Installed<SoftNic>,
}

fn world(program: &Program, rng: &mut Rng) -> World {
    let cfg = |name: &str| {
        let mut c = SoftNicConfig::new(name);
        c.prefetch = Prefetch::Adversarial;
        c
    };
    let server = std::sync::Arc::new(SoftNic::new(cfg("server")).unwrap());
    let client = SoftNic::new(cfg("client")).unwrap();
    // The test's own registrations give the addresses; the install registers the same
    // memory again, with the same rights, in its own protection domains.
    let spd = server.alloc_pd().unwrap();
    let smem = SharedBuffer::new(SERVER_LEN);
    smem.write(0, &vec![GUARD; SERVER_LEN]);
    let table = server
        .reg_mr(spd, &smem, TABLE.0, TABLE.1, Access::REMOTE_READ)
        .unwrap();
    let values = server
        .reg_mr(spd, &smem, VALUES.0, VALUES.1, Access::NONE)
        .unwrap();
    // A table of valid buckets / list nodes pointing into the values, plus some junk.
    for i in 0..(TABLE.1 as u64 / BUCKET_STRIDE) {
        let key = 0x1000 + i;
        let len = 1 + rng.below32(64);
        let value = values.addr.0 + rng.below(VALUES.1 as u64 - 64);
        let next = table.addr.0 + rng.below(TABLE.1 as u64 / BUCKET_STRIDE) * BUCKET_STRIDE;
        let mut node = catalog::node_bytes(key, len, value, next).to_vec();
        if rng.below(4) == 0 {
            // Junk: a length or pointer reaching just outside the values (into the guard),
            // or anywhere at all.
            let near = values.addr.0 + VALUES.1 as u64 - rng.below(32);
            let far = values.addr.0 - 1 - rng.below(64);
            let ptr = [near, far, rng.next()][idx(rng.below(3))];
            node[6..10].copy_from_slice(&(64 + rng.below32(64)).to_be_bytes());
            node[10..18].copy_from_slice(&ptr.to_be_bytes());
        }
        smem.write(
            TABLE.0 + idx(i * BUCKET_STRIDE),
            &node[..idx(BUCKET_STRIDE).min(node.len())],
        );
    }
    // Values never contain the guard byte, so a response carrying one read outside the grants.
    let mut v = vec![0u8; VALUES.1];
    for b in v.iter_mut() {
        *b = rng.byte().max(1);
        if *b == GUARD {
            *b = 0;
        }
    }
    smem.write(VALUES.0, &v);

    let cpd = client.alloc_pd().unwrap();
    let cmem = SharedBuffer::new(CLIENT_LEN);
    cmem.write(0, &vec![GUARD; CLIENT_LEN]);
    let resp = client
        .reg_mr(
            cpd,
            &cmem,
            RESPONSE.0,
            RESPONSE.1,
            Access::LOCAL_WRITE | Access::REMOTE_WRITE,
        )
        .unwrap();
    let ccq = client.create_cq(CqConfig::new(1024)).unwrap();
    let mut qcfg = QpConfig::new(cpd, ccq);
    qcfg.rq_slots = 64;
    let cqp = client.create_qp(qcfg).unwrap().qpn;

    let mut regions = HashMap::new();
    let local = |(offset, len), access| RegionBinding::Local {
        buffer: Arc::clone(&smem),
        offset,
        len,
        access,
    };
    regions.insert("table".to_string(), local(TABLE, Access::REMOTE_READ));
    regions.insert("list".to_string(), local(TABLE, Access::REMOTE_READ));
    regions.insert("values".to_string(), local(VALUES, Access::NONE));
    regions.insert(
        "response".to_string(),
        RegionBinding::Remote {
            addr: resp.addr,
            rkey: resp.lkey.into(),
            len: resp.len,
        },
    );
    let installed = install(&server, program, &regions, &mut |q| {
        SoftNic::connect_pair(&client, cqp, &server, q)
    })
    .unwrap();
    World {
        server,
        client,
        smem,
        cmem,
        table_addr: table.addr.0,
        values_addr: values.addr.0,
        cqp,
        ccq,
        installed,
    }
}

fn grants() -> Grants {
    let mut g = Grants::new()
        .with_region("table", Access::REMOTE_READ, TABLE.1 as u64)
        .with_region("list", Access::REMOTE_READ, TABLE.1 as u64)
        .with_region("values", Access::NONE, VALUES.1 as u64)
        .with_region("response", Access::REMOTE_WRITE, RESPONSE.1 as u64);
    g.loop_budget = Some(1_000_000);
    g.max_wqes_per_invocation = 256;
    g
}

/// A trigger: sometimes pure noise, usually keys and addresses near (and across) the table's
/// edges, so both valid and hostile addresses are tried.
fn trigger(p: &Program, w: &World, rng: &mut Rng) -> Vec<u8> {
    let mut m = vec![0u8; p.trigger_len as usize];
    for b in m.iter_mut() {
        *b = rng.byte();
    }
    if rng.below(4) == 0 {
        return m;
    }
    for prm in &p.params {
        let at = prm.offset as usize;
        match prm.len {
            8 => {
                let base = if rng.below(2) == 0 {
                    w.table_addr
                } else {
                    w.values_addr
                };
                let delta = rng.below(3 * 4096) as i64 - 4096;
                let addr =
                    base.wrapping_add_signed(delta) & !if rng.below(2) == 0 { 31 } else { 0 };
                m[at..at + 8].copy_from_slice(&addr.to_be_bytes());
            }
            6 => {
                let key = 0x1000 + rng.below(TABLE.1 as u64 / BUCKET_STRIDE + 8);
                m[at..at + 6].copy_from_slice(&catalog::trigger_key(key));
            }
            _ => {}
        }
    }
    m
}

/// Protection-class syndromes: what an out-of-grant access must end in.
fn protection(s: Syndrome) -> bool {
    matches!(
        s,
        Syndrome::RemoteAccess
            | Syndrome::LocalProtection
            | Syndrome::LocalLength
            | Syndrome::RemoteInvalidRequest
            | Syndrome::RemoteOperation
            | Syndrome::TransportRetryExceeded
            | Syndrome::WrFlush
    )
}

fn check_program(p: &Program, cases: usize, seed: u64) {
    let report = verify(p, &grants());
    assert!(report.accepted(), "{}", report.log());
    let mut rng = Rng(seed);
    let mut faults = 0;
    let mut answers = 0;
    for case in 0..cases {
        let w = world(p, &mut rng);
        let server_before = snapshot(&w.smem);
        let client_before = snapshot(&w.cmem);
        for _ in 0..16 {
            w.client.post_recv(w.cqp, 0, &[]).unwrap();
        }
        let msg = trigger(p, &w, &mut rng);
        w.client
            .post_send(
                w.cqp,
                &[WorkRequest {
                    wr_id: 1,
                    flags: WqeFlags::NONE,
                    op: WrOp::Send {
                        payload: Payload::Inline(msg.clone()),
                        imm: None,
                    },
                }],
            )
            .unwrap();
        // Every trigger ends somewhere: an answer (found or not) or a fault on the server;
        // then whatever else the trigger set off runs to its end before anything is checked.
        let mut got: Vec<Completion> = Vec::new();
        let in_error = |w: &World| {
            w.installed
                .qps
                .iter()
                .any(|q| w.server.qp_state(q.qpn).unwrap() == QpState::Error)
        };
        let what = format!("{}: case {case}: an answer or a fault", p.name);
        wait_until(&what, || {
            w.client.poll_cq(w.ccq, 16, &mut got).unwrap();
            in_error(&w) || got.iter().any(|c| c.imm.is_some())
        });
        settle(&w.server, || installed_wqes(&w.server, &w.installed));
        w.client.poll_cq(w.ccq, 16, &mut got).unwrap();
        // Errors on the server are protection-class, never anything else.
        for (i, q) in w.installed.qps.iter().enumerate() {
            let mut cqes = Vec::new();
            let _ = w.server.poll_cq(w.installed.cqs[i], 1024, &mut cqes);
            for c in cqes.iter().filter(|c| !c.is_ok()) {
                let s = c.status.unwrap_err();
                assert!(
                    protection(s),
                    "{}: case {case}: {:?} on {} ({s})",
                    p.name,
                    c,
                    q.qpn
                );
            }
        }
        if in_error(&w) {
            faults += 1;
        }
        answers += got.iter().filter(|c| c.imm.is_some()).count();
        // What came back was read from inside the grants: no guard byte (echo returns the
        // client's own bytes, so only the lookups are checked).
        if p.name != "echo" {
            for c in got.iter().filter(|c| c.imm.is_some()) {
                let mut data = vec![0u8; c.byte_len as usize];
                w.cmem.read(RESPONSE.0, &mut data);
                assert!(
                    !data.contains(&GUARD),
                    "{}: case {case}: response carries bytes from outside the grants",
                    p.name
                );
            }
        }
        // Nothing outside the grants changed on either side; read-only grants did not change.
        let server_after = snapshot(&w.smem);
        assert!(
            server_before == server_after,
            "{}: case {case}: server memory changed (trigger {msg:02x?})",
            p.name
        );
        let client_after = snapshot(&w.cmem);
        for (i, (a, b)) in client_before.iter().zip(&client_after).enumerate() {
            let inside = i >= RESPONSE.0 && i < RESPONSE.0 + RESPONSE.1;
            assert!(
                inside || a == b,
                "{}: case {case}: client byte {i} outside the response buffer changed",
                p.name
            );
        }
        drop(w);
    }
    eprintln!(
        "{}: {cases} triggers, {answers} answers, {faults} ended in a protection fault",
        p.name
    );
}

#[test]
fn hash_get_variants_stay_inside_their_grants() {
    for (i, v) in [
        HashVariant::Single,
        HashVariant::Sequential,
        HashVariant::Parallel,
    ]
    .into_iter()
    .enumerate()
    {
        check_program(&catalog::hash_get(v, 1).unwrap(), 40, 0x1234 + i as u64);
    }
}

#[test]
fn list_find_stays_inside_its_grants() {
    check_program(&catalog::list_find(4, false, 1).unwrap(), 40, 0x777);
    check_program(&catalog::list_find(4, true, 1).unwrap(), 40, 0x778);
}

#[test]
fn echo_and_server_loop_stay_inside_their_grants() {
    check_program(&catalog::echo(64, 1).unwrap(), 20, 0x999);
    check_program(&catalog::server_loop().unwrap(), 40, 0xabc);
}
