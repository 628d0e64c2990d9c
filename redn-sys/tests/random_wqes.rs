//! Arbitrary WQE bytes on the softnic, in every test run: the `softnic_exec` fuzz target's
//! harness (`exec_soup`: no panic, the error state ends every run, completions in order with
//! every fault reported, no byte outside the writable region changes) on the fuzz seeds and
//! on a few hundred seeded random programs.

mod common;
mod exec_soup;

use common::Rng;

use redn_program::wqe::{off, Opcode, WqeFlags, BB_SIZE};

macro_rules! seeds {
    ($($name:literal),* $(,)?) => {
        [$(($name, &include_bytes!(concat!("../../fuzz/seeds/softnic_exec/", $name))[..])),*]
    };
}

#[test]
fn the_fuzz_seeds_run_cleanly() {
    let seeds = seeds![
        "seed_nop",
        "seed_write",
        "seed_read",
        "seed_cas",
        "seed_faa",
        "seed_wait",
        "seed_send_en",
        "seed_recv_en",
        "seed_send_inline",
        "seed_chain",
        "seed_selfmod",
    ];
    for (name, bytes) in seeds {
        if std::panic::catch_unwind(|| exec_soup::run(bytes)).is_err() {
            panic!("seed {name} failed");
        }
    }
}

/// One random BB that is mostly a well-formed WQE: a real opcode with the size it needs and
/// its keys, addresses and objects aimed at real ones (the harness's last-byte selector;
/// about one in eight fields left as random bytes), so that most programs run past their
/// first WQE into the checks and operations behind it.
fn random_bb(rng: &mut Rng) -> [u8; BB_SIZE] {
    let mut bb = [0u8; BB_SIZE];
    for b in bb.iter_mut() {
        *b = rng.byte();
    }
    // (opcode, ds, selector): bit 0 aims the remote address, bit 1 the data segment at 32,
    // bits 1 and 3 the one at 48, bit 2 the WAIT / ENABLE object (bit 4: a CQ).
    let (op, ds, sel) = match rng.below(12) {
        0 => (Opcode::Nop, 1, 0),
        1 | 2 => (Opcode::RdmaWrite, 3, 0b11),
        3 => (Opcode::RdmaRead, 3, 0b11),
        4 => (Opcode::Send, 3, 0),
        5 => (Opcode::AtomicCs, 4, 0b1011),
        6 => (Opcode::AtomicFa, 4, 0b1011),
        7 => (Opcode::AtomicMaskedFa, 4, 0b1011),
        8 => (Opcode::Wait, 2, 0b10100),
        9 => (Opcode::SendEn, 2, 0b100),
        10 => (Opcode::RecvEn, 2, 0b100),
        _ => (Opcode::RdmaWriteImm, 3, 0b11),
    };
    if rng.below(8) != 0 {
        bb[off::OPCODE] = op as u8;
    }
    if rng.below(8) != 0 {
        bb[off::DS] = ds;
    }
    // Signaled half the time, no fence bits beyond.
    bb[off::FM_CE_SE] = if rng.below(2) == 0 {
        WqeFlags::SIGNALED.0
    } else {
        0
    };
    bb[exec_soup::SELECTOR] = if rng.below(8) != 0 { sel } else { rng.byte() };
    bb
}

#[test]
fn random_programs_run_cleanly() {
    let cases = if cfg!(miri) { 4 } else { 300 };
    let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
    for case in 0..cases {
        let bbs = 1 + rng.index(16);
        let data: Vec<u8> = (0..bbs).flat_map(|_| random_bb(&mut rng)).collect();
        if std::panic::catch_unwind(|| exec_soup::run(&data)).is_err() {
            panic!("random program {case} failed: {data:02x?}");
        }
    }
}
