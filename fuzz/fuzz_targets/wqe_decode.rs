//! The WQE decoder on arbitrary bytes (what a ring holds after RDMA operations patched it,
//! what `dump_offload` reads back): never a panic, and whatever decodes encodes again to a WQE
//! that decodes to the same operation (but for zero-length SGEs, which the encoder skips as
//! rdma-core does), flags, queue and index.
#![no_main]

use libfuzzer_sys::fuzz_target;
use redn_program::wqe::{decode_wqe, encode_wqe, Payload, WorkRequest, WrOp};

fuzz_target!(|data: &[u8]| {
    let Ok(first) = decode_wqe(data) else {
        return;
    };
    let wr = WorkRequest {
        wr_id: 0,
        flags: first.ctrl.flags,
        op: first.op.clone(),
    };
    // Some decodable WQEs are not encodable (too many segments for the encoder's limits, say);
    // those must be refused with an error, not a panic.
    let Ok(again) = encode_wqe(&wr, first.ctrl.qpn, first.ctrl.wqe_index) else {
        return;
    };
    let second = decode_wqe(again.bytes()).expect("an encoded WQE decodes");
    assert_eq!(second.op, without_empty_sges(first.op));
    assert_eq!(second.ctrl.opcode, first.ctrl.opcode);
    assert_eq!(second.ctrl.flags, first.ctrl.flags);
    assert_eq!(second.ctrl.qpn, first.ctrl.qpn);
    assert_eq!(second.ctrl.wqe_index, first.ctrl.wqe_index);
});

/// `op` with its zero-length scatter/gather entries dropped (they move nothing).
fn without_empty_sges(mut op: WrOp) -> WrOp {
    match &mut op {
        WrOp::Write {
            payload: Payload::Sgl(sgl),
            ..
        }
        | WrOp::Send {
            payload: Payload::Sgl(sgl),
            ..
        }
        | WrOp::Read { sgl, .. } => sgl.retain(|s| s.len != 0),
        _ => {}
    }
    op
}
