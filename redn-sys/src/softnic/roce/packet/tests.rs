//! Packets: header layouts, the ICRC, and every check a received datagram must pass.

// Test data is made of byte patterns: narrowing an index to a byte is the point.
#![allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]

use super::*;
use std::net::Ipv4Addr;

/// Hex (spaces and offsets ignored: each line of the reference's dumps starts with a
/// 4-digit offset).
fn frame(dump: &str) -> Vec<u8> {
    let mut out = Vec::new();
    for line in dump.lines() {
        let hex: String = line.split_whitespace().skip(1).collect::<Vec<_>>().concat();
        for i in (0..hex.len()).step_by(2) {
            out.push(u8::from_str_radix(&hex[i..i + 2], 16).expect("hex"));
        }
    }
    out
}

/// Split an untagged Ethernet/IPv4/UDP frame into its IP header, UDP header and UDP
/// payload (located from the UDP length, as a receiver must).
fn split(f: &[u8]) -> ([u8; 20], [u8; 8], &[u8]) {
    let ip: [u8; 20] = f[14..34].try_into().unwrap();
    let udp: [u8; 8] = f[34..42].try_into().unwrap();
    let len = usize::from(u16::from_be_bytes([udp[4], udp[5]])) - 8;
    (ip, udp, &f[42..42 + len])
}

// Frames from the project's RoCEv2 reference, §4.6: (a) captured on a ConnectX-4 Lx,
// (b) built independently and checked with scapy's compute_icrc.
const CNP: &str = "0000  e41d 2dab 2bc2 7cfe 9064 3b32 0800 45c2
0010  003c 718c 4000 4011 9161 0a00 1101 0a00
0020  1201 0000 12b7 0028 0000 8100 ffff 4000
0030  0118 0000 0000 0000 0000 0000 0000 0000
0040  0000 0000 0000 82fd 002a";
const SEND_ONLY: &str = "0000  0200 0000 0002 0200 0000 0001 0800 4502
0010  0038 0001 4000 4011 26b0 0a00 0001 0a00
0020  0002 c123 12b7 0024 0000 0410 ffff 0000
0030  0011 8000 0064 6865 6c6c 6f20 526f 4345
0040  2100 8b54 8be1";
const ACK: &str = "0000  0200 0000 0002 0200 0000 0001 0800 4502
0010  0030 0001 4000 4011 26b8 0a00 0001 0a00
0020  0002 c123 12b7 001c 0000 1100 ffff 0000
0030  0012 0000 0064 1f00 0001 f4ba cdde";
const NAK_SEQ: &str = "0000  0200 0000 0002 0200 0000 0001 0800 4502
0010  0030 0001 4000 4011 26b8 0a00 0001 0a00
0020  0002 c123 12b7 001c 0000 1100 ffff 0000
0030  0012 0000 0065 6000 0001 8e23 f1d0";
const WRITE_IMM: &str = "0000  0200 0000 0002 0200 0000 0001 0800 4502
0010  0044 0001 4000 4011 26a4 0a00 0001 0a00
0020  0002 c123 12b7 0030 0000 0b00 ffff 0000
0030  0011 8000 012d 0000 7f00 0000 3000 0000
0040  9abc 0000 0004 dead beef 6162 6364 8f80
0050  1cda";
const WRAP: &str = "0000  0200 0000 0002 0200 0000 0001 0800 4502
0010  0030 0001 4000 4011 26b8 0a00 0001 0a00
0020  0002 c123 12b7 001c 0000 0400 ffff 0000
0030  0011 80ff ffff 7772 6170 006f 220a";

#[test]
fn crc_check_value_and_lrh_seed() {
    assert_eq!(crc32fast::hash(b"123456789"), 0xcbf4_3926);
    // rxe's raw seed: the register after eight 0xFF bytes (the masked LRH).
    assert_eq!(!crc32fast::hash(&[0xff; 8]), 0xdebb_20e3);
}

#[test]
fn icrc_matches_a_connectx_capture() {
    let f = frame(CNP);
    let (ip, udp, body) = split(&f);
    let n = body.len() - 4;
    assert_eq!(icrc_ipv4(&ip, &udp, &body[..n]), 0x2a00_fd82);
    assert_eq!(&body[n..], &[0x82, 0xfd, 0x00, 0x2a]);
    // The CRC over everything including the trailer leaves the CRC-32 residue.
    let mut h = crc32fast::Hasher::new();
    let mut ipm = ip;
    ipm[1] = 0xff;
    ipm[8] = 0xff;
    ipm[10] = 0xff;
    ipm[11] = 0xff;
    let mut udpm = udp;
    udpm[6] = 0xff;
    udpm[7] = 0xff;
    let mut b = body.to_vec();
    b[4] = 0xff;
    h.update(&[0xff; 8]);
    h.update(&ipm);
    h.update(&udpm);
    h.update(&b);
    assert_eq!(h.finalize(), 0x2144_df1c);
    // A CNP is not RC: the decoder refuses it before anything else.
    assert_eq!(decode_with(&ip, &udp, body), Err(DropReason::UnknownOpcode));
}

#[test]
fn reference_frames_decode_to_their_fields() {
    let f = frame(SEND_ONLY);
    let (ip, udp, body) = split(&f);
    let p = decode_with(&ip, &udp, body).expect("valid SEND_ONLY");
    assert_eq!(p.header.opcode, opcode::SEND_ONLY);
    assert_eq!(
        (p.header.dest_qp, p.header.psn, p.header.ack_req),
        (0x11, 100, true)
    );
    assert_eq!(p.payload, b"hello RoCE!");

    let f = frame(ACK);
    let (ip, udp, body) = split(&f);
    let p = decode_with(&ip, &udp, body).expect("valid ACK");
    assert_eq!(
        p.header.aeth,
        Some(Aeth {
            syndrome: 0x1f,
            msn: 1
        })
    );
    assert_eq!(Syndrome::of(0x1f), Syndrome::Ack);

    let f = frame(NAK_SEQ);
    let (ip, udp, body) = split(&f);
    let p = decode_with(&ip, &udp, body).expect("valid NAK");
    assert_eq!(p.header.psn, 101);
    assert_eq!(
        Syndrome::of(p.header.aeth.unwrap().syndrome),
        Syndrome::SequenceError
    );

    let f = frame(WRITE_IMM);
    let (ip, udp, body) = split(&f);
    let p = decode_with(&ip, &udp, body).expect("valid WRITE_ONLY_IMM");
    assert_eq!(
        p.header.reth,
        Some(Reth {
            va: 0x7f00_0000_3000,
            rkey: 0x9abc,
            len: 4
        })
    );
    assert_eq!(p.header.imm, Some(0xdead_beef));
    assert_eq!(p.payload, b"abcd");

    let f = frame(WRAP);
    let (ip, udp, body) = split(&f);
    let p = decode_with(&ip, &udp, body).expect("valid PSN 0xFFFFFF");
    assert_eq!(p.header.psn, 0xff_ffff);
    assert_eq!(p.payload, b"wrap");
}

#[test]
fn our_encoder_reproduces_the_reference_bytes() {
    // Re-encode the SEND_ONLY and WRITE_ONLY_IMM frames' transport parts with the wire
    // IP header they had (ID 1): the bytes, ICRC included, must be the reference's.
    for (dump, h, payload) in [
        (
            SEND_ONLY,
            {
                let mut h = Header::new(opcode::SEND_ONLY, 0x11, 100);
                h.ack_req = true;
                h
            },
            &b"hello RoCE!"[..],
        ),
        (
            WRITE_IMM,
            {
                let mut h = Header::new(opcode::WRITE_ONLY_IMM, 0x11, 301);
                h.ack_req = true;
                h.reth = Some(Reth {
                    va: 0x7f00_0000_3000,
                    rkey: 0x9abc,
                    len: 4,
                });
                h.imm = Some(0xdead_beef);
                h
            },
            &b"abcd"[..],
        ),
    ] {
        let f = frame(dump);
        let (ip, udp, body) = split(&f);
        let route = Route {
            src: SocketAddrV4::new(Ipv4Addr::new(10, 0, 0, 1), 0xc123),
            dst: SocketAddrV4::new(Ipv4Addr::new(10, 0, 0, 2), 4791),
        };
        let mut out = Vec::new();
        encode(&mut out, &route, &h, payload);
        let n = out.len() - 4;
        assert_eq!(&out[..n], &body[..n], "headers, payload and pad");
        // Our own pseudo-headers use ID 0, the reference frame ID 1: recompute over the
        // wire headers to compare the trailer byte for byte.
        assert_eq!(icrc_ipv4(&ip, &udp, &out[..n]).to_le_bytes(), body[n..]);
    }
}

fn route() -> Route {
    Route {
        src: SocketAddrV4::new(Ipv4Addr::new(127, 0, 0, 1), 5000),
        dst: SocketAddrV4::new(Ipv4Addr::new(127, 0, 0, 1), 4791),
    }
}

#[test]
fn icrc_covers_what_it_must_and_masks_what_routers_change() {
    let f = frame(SEND_ONLY);
    let (ip, udp, body) = split(&f);
    let n = body.len() - 4;
    let base = icrc_ipv4(&ip, &udp, &body[..n]);
    // Masked: TOS, TTL, IP checksum, UDP checksum, BTH byte 4.
    for (at, in_ip) in [(1, true), (8, true), (10, true), (6, false), (4, false)] {
        let (mut ip2, mut udp2, mut b2) = (ip, udp, body[..n].to_vec());
        if in_ip {
            ip2[at] ^= 0x5a;
        } else if at == 6 {
            udp2[at] ^= 0x5a;
        } else {
            b2[at] ^= 0x5a;
        }
        assert_eq!(icrc_ipv4(&ip2, &udp2, &b2), base, "masked byte {at}");
    }
    // Covered: identification, length, addresses, ports, PSN, payload.
    for at in [4usize, 3, 12, 19] {
        let mut ip2 = ip;
        ip2[at] ^= 1;
        assert_ne!(icrc_ipv4(&ip2, &udp, &body[..n]), base, "ip byte {at}");
    }
    for at in [0usize, 3] {
        let mut udp2 = udp;
        udp2[at] ^= 1;
        assert_ne!(icrc_ipv4(&ip, &udp2, &body[..n]), base, "udp byte {at}");
    }
    for at in [11usize, 14, n - 1] {
        let mut b2 = body[..n].to_vec();
        b2[at] ^= 1;
        assert_ne!(icrc_ipv4(&ip, &udp, &b2), base, "body byte {at}");
    }
}

#[test]
fn every_header_round_trips_and_pads() {
    let r = route();
    let mut h = Header::new(opcode::COMPARE_SWAP, 0x1234, 0xff_fffe);
    h.atomic = Some(AtomicEth {
        va: 0x1122_3344_5566_7788,
        rkey: 0xabcd,
        swap_add: 7,
        compare: 9,
    });
    let mut out = Vec::new();
    encode(&mut out, &r, &h, &[]);
    assert_eq!(out.len(), 12 + 28 + 4);
    assert_eq!(decode(&r, &out).unwrap().header, h);

    let mut h = Header::new(opcode::ATOMIC_ACKNOWLEDGE, 0x22, 3);
    h.aeth = Some(Aeth {
        syndrome: Syndrome::ACK,
        msn: 0xabcdef,
    });
    h.atomic_ack = Some(0x0102_0304_0506_0708);
    out.clear();
    encode(&mut out, &r, &h, &[]);
    assert_eq!(decode(&r, &out).unwrap().header, h);

    for len in 0..8 {
        let payload: Vec<u8> = (0..len).map(|i| i as u8 + 1).collect();
        let mut h = Header::new(opcode::SEND_ONLY_IMM, 0x22, 3);
        h.imm = Some(0x0102_0304);
        h.solicited = true;
        out.clear();
        encode(&mut out, &r, &h, &payload);
        assert_eq!(out.len() % 4, 0, "padded to 4 bytes");
        assert_eq!(usize::from(out[1] >> 4 & 3), (4 - len % 4) % 4);
        let p = decode(&r, &out).unwrap();
        assert_eq!((p.header, p.payload), (h, &payload[..]));
    }
}

#[test]
fn malformed_datagrams_are_dropped_for_their_reason() {
    let r = route();
    let mut h = Header::new(opcode::SEND_ONLY, 0x22, 3);
    h.ack_req = true;
    let mut good = Vec::new();
    encode(&mut good, &r, &h, b"abcdef");
    assert!(decode(&r, &good).is_ok());
    // Re-sign a mutated packet so that the check under test, not the ICRC, refuses it.
    let resign = |mut d: Vec<u8>| {
        let n = d.len() - 4;
        let (ip, udp) = pseudo_headers(&r, d.len());
        let c = icrc_ipv4(&ip, &udp, &d[..n]);
        d[n..].copy_from_slice(&c.to_le_bytes());
        d
    };
    assert_eq!(decode(&r, &good[..10]), Err(DropReason::Truncated));
    let mut bad = good.clone();
    bad[14] ^= 1;
    assert_eq!(decode(&r, &bad), Err(DropReason::BadIcrc));
    let other = Route {
        src: SocketAddrV4::new(Ipv4Addr::new(127, 0, 0, 2), 5000),
        ..r
    };
    assert_eq!(
        decode(&other, &good),
        Err(DropReason::BadIcrc),
        "the ICRC covers the source"
    );
    let mut bad = good.clone();
    bad[0] = 0x81;
    assert_eq!(decode(&r, &resign(bad)), Err(DropReason::UnknownOpcode));
    let mut bad = good.clone();
    bad[0] = 0x15;
    assert_eq!(decode(&r, &resign(bad)), Err(DropReason::UnknownOpcode));
    let mut bad = good.clone();
    bad[1] |= 1;
    assert_eq!(decode(&r, &resign(bad)), Err(DropReason::BadVersion));
    let mut bad = good.clone();
    bad[3] = 0x12;
    assert_eq!(decode(&r, &resign(bad)), Err(DropReason::BadPkey));
    let mut bad = good.clone();
    bad[5..8].copy_from_slice(&[0, 0, 1]);
    assert_eq!(decode(&r, &resign(bad)), Err(DropReason::SpecialQp));
    let mut bad = good.clone();
    bad[1] |= 0x30; // pad 3 with a non-zero pad byte ('f' is the payload's last)
    assert_eq!(decode(&r, &resign(bad)), Err(DropReason::BadPad));
    // A READ request with a payload.
    let mut hr = Header::new(opcode::READ_REQUEST, 0x22, 3);
    hr.reth = Some(Reth {
        va: 0,
        rkey: 1,
        len: 8,
    });
    let mut rr = Vec::new();
    encode(&mut rr, &r, &hr, b"xxxx");
    assert_eq!(decode(&r, &rr), Err(DropReason::BadLength));
    // An atomic cut short: its headers claim more than arrived.
    let mut ha = Header::new(opcode::FETCH_ADD, 0x22, 3);
    ha.atomic = Some(AtomicEth {
        va: 0,
        rkey: 1,
        swap_add: 1,
        compare: 0,
    });
    let mut aa = Vec::new();
    encode(&mut aa, &r, &ha, &[]);
    let short = resign(aa[..30].to_vec());
    assert_eq!(decode(&r, &short), Err(DropReason::Truncated));
}

#[test]
fn psns_wrap_at_24_bits() {
    assert_eq!(psn::add(0xff_ffff, 1), 0);
    assert_eq!(psn::add(0xff_fffe, 5), 3);
    assert_eq!(psn::diff(0, 0xff_ffff), 1);
    assert_eq!(psn::diff(0xff_ffff, 0), -1);
    assert_eq!(psn::diff(5, 5), 0);
    assert!(psn::diff(0x40_0000, 0) > 0);
    assert!(
        psn::diff(0x80_0001, 0) < 0,
        "more than half the circle ahead is behind"
    );
}

#[test]
fn rnr_timer_codes_follow_the_table() {
    assert_eq!(rnr_delay_ns(1), 10_000);
    assert_eq!(rnr_delay_ns(14), 1_280_000);
    assert_eq!(rnr_delay_ns(0), 655_360_000);
    assert_eq!(rnr_delay_ns(31), 491_520_000);
}
