//! What a CAS, a FETCH_ADD and their masked forms, a WAIT, a SEND_EN and a RECV_EN do, on
//! every path of the executor: the general executor alone (fast paths off), the fast paths,
//! and the general executor landing responses late (`Prefetch::Adversarial`, which the fast
//! paths leave to it). Expected words are worked out by hand from the operations'
//! definitions, not computed by the code under test. Written for the mutation run over
//! `softnic/transport.rs` and `softnic/exec/reference.rs` (docs/testing.md): the other
//! suites run atomics and WAITs mostly on the fast paths, so the general executor's copy of
//! these semantics went untested.

#[path = "../common/mod.rs"]
mod common;
use common::*;
use redn_program::wqe::{encode_wqe, Opcode, Syndrome, WorkRequest, WrOp};
use redn_sys::nic::{Completion, Nic};
use redn_sys::softnic::{Prefetch, SoftNic, SoftNicConfig};
use redn_sys::Cqn;

/// An executor path: fast paths on or off, and the prefetch model.
type Path = (bool, Prefetch);

/// The paths every case runs on: the general executor alone, the fast paths, and late
/// landing of READ and atomic responses (the general executor again, for atomics).
const PATHS: [Path; 3] = [
    (false, Prefetch::Depth(8)),
    (true, Prefetch::Depth(8)),
    (true, Prefetch::Adversarial),
];

fn softnic((fast_paths, prefetch): Path, pus: usize) -> SoftNic {
    let mut cfg = SoftNicConfig::new("semantics");
    cfg.fast_paths = fast_paths;
    cfg.prefetch = prefetch;
    cfg.pus = pus;
    SoftNic::new(cfg).unwrap()
}

/// A queue connected to itself and one region it reaches, on one path.
struct Loopback {
    nic: SoftNic,
    ep: Endpoint,
    mem: Region,
    path: Path,
}

/// Where the atomics' target words are, and where their old values land.
const TARGET: u64 = 64;
const RESULT: u64 = 256;
/// What fills the result word before an atomic, so that an old value of 0 shows.
const GUARD: u64 = 0x5a5a_5a5a_5a5a_5a5a;

fn loopback(path: Path, be_reply: bool) -> Loopback {
    let nic = softnic(path, 1);
    let pd = nic.alloc_pd().unwrap();
    let mem = Region::new(&nic, pd, 4096, ALL);
    let ep = endpoint(&nic, pd, |c| c.atomic_be_reply = be_reply);
    nic.connect(ep.qp.qpn, ep.qp.qpn).unwrap();
    Loopback { nic, ep, mem, path }
}

impl Loopback {
    fn word(&self, off: u64) -> u64 {
        let bytes = self.mem.read(usize::try_from(off).unwrap(), 8);
        u64::from_le_bytes(bytes.try_into().unwrap())
    }

    fn set_word(&self, off: u64, v: u64) {
        self.mem
            .write(usize::try_from(off).unwrap(), &v.to_le_bytes());
    }

    fn result_sge(&self) -> Option<redn_program::wqe::Sge> {
        Some(self.mem.mr.sge(RESULT, 8))
    }

    /// Post `wrs` and take one completion per signaled one.
    fn run(&self, wrs: &[WorkRequest]) -> Vec<Completion> {
        self.nic.post_send(self.ep.qp.qpn, wrs).unwrap();
        let signaled = wrs.iter().filter(|w| w.flags.signaled()).count();
        wait_cqes(&self.nic, self.ep.cq, signaled)
    }

    /// Run atomic `op` signaled on a target word holding `old`; returns the target's new
    /// value. The completion must be a success moving 8 bytes.
    fn atomic(&self, old: u64, op: WrOp) -> u64 {
        self.set_word(TARGET, old);
        self.set_word(RESULT, GUARD);
        let c = self.run(&[wr(1, SIG, op)]).remove(0);
        assert!(c.is_ok(), "{:?}: {c:?}", self.path);
        assert_eq!(c.byte_len, 8, "{:?}: an atomic's completion", self.path);
        self.word(TARGET)
    }

    /// The result word as the old value landed (host order unless `be`).
    fn landed(&self, be: bool) -> u64 {
        let bytes: [u8; 8] = self
            .mem
            .read(usize::try_from(RESULT).unwrap(), 8)
            .try_into()
            .unwrap();
        if be {
            u64::from_be_bytes(bytes)
        } else {
            u64::from_le_bytes(bytes)
        }
    }
}

/// Run `op` on a new loopback queue as the bytes `encode_wqe` makes of it, after `patch`
/// changed them (what a patched ring holds), and return its completion.
fn run_patched(l: &Loopback, op: WrOp, patch: impl FnOnce(&mut [u8])) -> Completion {
    let qp = &l.ep.qp;
    let mut e = encode_wqe(&wr(1, SIG, op), qp.qpn, 0).unwrap();
    patch(e.bytes_mut());
    qp.sq.buffer.write(qp.sq.offset, e.bytes());
    let end = u64::try_from(e.bbs()).unwrap();
    l.nic.note_posted(qp.qpn, 0, end, 1).unwrap();
    l.nic.ring_doorbell(qp.qpn, end).unwrap();
    wait_cqes(&l.nic, l.ep.cq, 1).remove(0)
}

mod atomics;
mod control;
mod rates;
mod reads;
