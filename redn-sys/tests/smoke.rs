//! A loopback WRITE on one softnic: the smallest end-to-end check.

mod common;
use common::*;
use redn_program::wqe::{Payload, WrOp};
use redn_sys::nic::Nic;
use redn_sys::softnic::Prefetch;

#[test]
fn loopback_write() {
    let nic = nic(1, Prefetch::Depth(8));
    let pd = nic.alloc_pd().unwrap();
    let src = Region::new(&nic, pd, 4096, ALL);
    let dst = Region::new(&nic, pd, 4096, ALL);
    let ep = endpoint(&nic, pd, |_| {});
    nic.connect(ep.qp.qpn, ep.qp.qpn).unwrap();
    src.write(0, b"hello softnic");
    nic.post_send(
        ep.qp.qpn,
        &[wr(
            7,
            SIG,
            WrOp::Write {
                remote: dst.mr.remote(100),
                payload: Payload::Sgl(vec![src.mr.sge(0, 13)]),
                imm: None,
            },
        )],
    )
    .unwrap();
    let c = wait_cqes(&nic, ep.cq, 1);
    assert_eq!(c[0].wr_id, 7);
    assert!(c[0].is_ok());
    assert_eq!(dst.read(100, 13), b"hello softnic");
}
