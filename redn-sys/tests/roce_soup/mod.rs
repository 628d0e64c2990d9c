//! Arbitrary datagrams into a softnic's RoCE endpoint, shared by the `roce_packets` fuzz
//! target and the `roce_packets` test: a softnic with one QP connected to a peer address,
//! a region granted for remote access and receives posted into another; the input is cut
//! into datagrams, each either raw bytes or a packet built from them with a valid ICRC (its
//! opcode, PSN, keys and addresses aimed near real ones, so that most get past the ICRC
//! into the checks behind it), from the peer or from a stranger. Checked: no panic, no
//! byte outside the granted and receive regions changes, every drop is counted, and the
//! QP is connected or in error.

use redn_sys::mem::SharedBuffer;
use redn_sys::nic::{CqConfig, Nic, QpConfig};
use redn_sys::softnic::roce::io::{DatagramIo, RecvBatch};
use redn_sys::softnic::roce::packet::{self, opcode, Aeth, AtomicEth, Header, Reth, Route};
use redn_sys::softnic::roce::{QpRecord, RoceEndpoint};
use redn_sys::softnic::{SoftNic, SoftNicConfig};
use redn_sys::{Access, QpState};
use std::io;
use std::net::{Ipv4Addr, SocketAddrV4};
use std::time::Duration;

const LEN: usize = 16 << 10;

/// A socket that sends nowhere and receives nothing.
struct NullIo(SocketAddrV4);

impl DatagramIo for NullIo {
    fn send(&self, _: &[(SocketAddrV4, &[u8])]) -> io::Result<()> {
        Ok(())
    }
    fn recv(&self, _: &mut RecvBatch, wait: Option<Duration>) -> io::Result<usize> {
        if let Some(w) = wait {
            std::thread::sleep(w.min(Duration::from_millis(1)));
        }
        Ok(0)
    }
    fn local_addr(&self) -> SocketAddrV4 {
        self.0
    }
}

/// Reads the input a byte at a time, zeros once it runs out.
struct Bytes<'a>(&'a [u8]);

impl Bytes<'_> {
    fn u8(&mut self) -> u8 {
        match self.0.split_first() {
            Some((&b, rest)) => {
                self.0 = rest;
                b
            }
            None => 0,
        }
    }
    fn u32(&mut self) -> u32 {
        u32::from_le_bytes([self.u8(), self.u8(), self.u8(), self.u8()])
    }
    fn u64(&mut self) -> u64 {
        u64::from(self.u32()) | (u64::from(self.u32()) << 32)
    }
    fn take(&mut self, n: usize) -> &[u8] {
        let n = n.min(self.0.len());
        let (a, b) = self.0.split_at(n);
        self.0 = b;
        a
    }
}

fn snapshot(b: &SharedBuffer) -> Vec<u8> {
    let mut v = vec![0u8; b.len()];
    b.read(0, &mut v);
    v
}

/// Run one input.
pub fn run(data: &[u8]) {
    let nic = SoftNic::new(SoftNicConfig::new("soup")).unwrap();
    let local = SocketAddrV4::new(Ipv4Addr::new(127, 0, 0, 1), 4791);
    let peer = SocketAddrV4::new(Ipv4Addr::new(127, 0, 0, 2), 4791);
    let ep = RoceEndpoint::with_io(&nic, Box::new(NullIo(local)), Duration::ZERO);
    let pd = nic.alloc_pd().unwrap();
    let other_pd = nic.alloc_pd().unwrap();
    let granted = SharedBuffer::new(LEN);
    let recv = SharedBuffer::new(LEN);
    let read_only = SharedBuffer::new(LEN);
    let foreign = SharedBuffer::new(LEN);
    let g = nic.reg_mr(pd, &granted, 0, LEN, Access::ALL).unwrap();
    let r = nic.reg_mr(pd, &recv, 0, LEN, Access::LOCAL_WRITE).unwrap();
    let ro = nic
        .reg_mr(pd, &read_only, 0, LEN, Access::REMOTE_READ)
        .unwrap();
    let f = nic.reg_mr(other_pd, &foreign, 0, LEN, Access::ALL).unwrap();
    for (b, seed) in [(&granted, 1u8), (&recv, 2), (&read_only, 3), (&foreign, 4)] {
        let fill: Vec<u8> = (0..LEN)
            .map(|i| i.to_le_bytes()[0].wrapping_mul(seed))
            .collect();
        b.write(0, &fill);
    }
    let before_ro = snapshot(&read_only);
    let before_f = snapshot(&foreign);
    let cq = nic.create_cq(CqConfig::new(256)).unwrap();
    let mut qc = QpConfig::new(pd, cq);
    qc.rq_slots = 16;
    let qp = nic.create_qp(qc).unwrap().qpn;
    for i in 0..8u64 {
        nic.post_recv(qp, i, &[r.sge(i * 2048, 2048)]).unwrap();
    }
    let mut ours = QpRecord::new(qp.0, 0, local);
    ours.mtu = 256;
    let theirs = QpRecord::new(0x42, 0xff_fff8, peer);
    ep.connect(&ours, &theirs).unwrap();

    let keys = [g.lkey.0, r.lkey.0, ro.lkey.0, f.lkey.0, 0x1234_5600];
    let bases = [g.addr.0, r.addr.0, ro.addr.0, f.addr.0, 0];
    let mut input = Bytes(data);
    let mut next_psn = 0xff_fff8u32;
    while !input.0.is_empty() {
        let sel = input.u8();
        let from = if sel % 16 != 15 {
            peer
        } else {
            SocketAddrV4::new(Ipv4Addr::new(127, 0, 0, 9), 4791)
        };
        let dg = if sel % 8 == 1 {
            let n = usize::from(input.u8()) * 4;
            input.take(n).to_vec()
        } else {
            // A packet with a valid ICRC: mostly requests the QP takes, with keys and
            // addresses aimed at real ones and lengths around the 256-byte MTU.
            let op = match input.u8() % 20 {
                0..=3 => opcode::WRITE_ONLY,
                4 => opcode::WRITE_ONLY_IMM,
                12 | 13 => opcode::SEND_ONLY,
                14 | 15 => opcode::READ_REQUEST,
                5 | 16 => opcode::COMPARE_SWAP,
                6 | 17 => opcode::FETCH_ADD,
                7 => opcode::WRITE_FIRST,
                8 => opcode::WRITE_MIDDLE,
                9 => opcode::WRITE_LAST_IMM,
                10 => opcode::SEND_FIRST,
                11 => opcode::SEND_LAST,
                _ => input.u8(),
            };
            let psn = match input.u8() % 8 {
                0 => input.u32() & 0xff_ffff,
                1 => next_psn.wrapping_sub(1) & 0xff_ffff,
                2 => (next_psn + 1) & 0xff_ffff,
                _ => next_psn,
            };
            let dest_qp = if input.u8() % 16 == 0 {
                input.u32() & 0xff_ffff
            } else {
                qp.0
            };
            let mut h = Header::new(op, dest_qp, psn);
            h.ack_req = input.u8() & 1 == 1;
            let k = match input.u8() % 16 {
                k @ 1..=4 => usize::from(k),
                _ => 0,
            };
            let len_sel = input.u8();
            let payload_len =
                [0u16, 4, 8, 100, 256, 255, 257, 64, 8, 16, 24, 32][usize::from(len_sel % 12)];
            let payload: Vec<u8> = (0..usize::from(payload_len))
                .map(|i| i.to_le_bytes()[0] ^ len_sel)
                .collect();
            let va = bases[k]
                .wrapping_add(u64::from(u32::from(input.u8()) << 6) + u64::from(input.u8() % 16));
            let dma = match input.u8() % 16 {
                0 => input.u32(),
                1 => 512,
                _ => u32::from(payload_len),
            };
            h.reth = Some(Reth {
                va,
                rkey: keys[k],
                len: dma,
            });
            h.atomic = Some(AtomicEth {
                va: va & !7,
                rkey: keys[k],
                swap_add: input.u64(),
                compare: input.u64() & 0xff,
            });
            h.aeth = Some(Aeth {
                syndrome: input.u8(),
                msn: 0,
            });
            h.atomic_ack = Some(input.u64());
            h.imm = Some(input.u32());
            let mut d = Vec::new();
            packet::encode(
                &mut d,
                &Route {
                    src: from,
                    dst: local,
                },
                &h,
                &payload,
            );
            if psn == next_psn {
                next_psn = (next_psn + 1) & 0xff_ffff;
            }
            d
        };
        ep.inject(from, &dg);
    }
    assert_eq!(
        snapshot(&read_only),
        before_ro,
        "a region without remote write changed"
    );
    assert_eq!(
        snapshot(&foreign),
        before_f,
        "a region of another protection domain changed"
    );
    let total: u64 = ep.drops().snapshot().iter().map(|(_, n)| n).sum();
    assert_eq!(total, ep.drops().total());
    let state = nic.qp_state(qp).unwrap();
    assert!(
        matches!(state, QpState::ReadyToSend | QpState::Error),
        "{state}"
    );
}
