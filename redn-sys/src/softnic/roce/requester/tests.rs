//! The requester's state machine on a scripted clock: segmentation, windows, ACKs, NAKs,
//! timers and retries.

// Test data is made of byte patterns: narrowing an index to a byte is the point.
#![allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]

use super::*;
use crate::clock::{Clock, ManualClock};
use crate::softnic::roce::packet::Aeth;

fn attrs() -> RequesterAttrs {
    RequesterAttrs {
        mtu: 256,
        timeout: 8, // 1.048576 ms
        retry_cnt: 2,
        rnr_retry: 1,
    }
}

fn ack(op: u8, psn: u32, syndrome: u8) -> Header {
    let mut h = Header::new(op, 7, psn);
    h.aeth = Some(Aeth { syndrome, msn: 0 });
    h
}

fn tx(r: &mut Requester, now: Instant) -> Vec<(Header, Range<usize>)> {
    let mut out = Vec::new();
    r.transmit(now, |h, range, data| {
        assert_eq!(data.len(), range.len(), "the payload of its range");
        out.push((*h, range));
    });
    out
}

/// What one call did to the oldest message: still outstanding, or its outcome.
#[derive(Debug, PartialEq, Eq)]
enum Progress {
    Pending,
    Done(u64),
    Failed(Nak),
}

fn outcome(r: &mut Requester) -> Progress {
    match r.pop_finished() {
        None => Progress::Pending,
        Some(Ok(v)) => Progress::Done(v),
        Some(Err(n)) => Progress::Failed(n),
    }
}

fn resp(
    r: &mut Requester,
    h: &Header,
    payload: &[u8],
    now: Instant,
    read_out: &mut [u8],
) -> Result<Progress, DropReason> {
    r.on_response(h, payload, now, read_out)?;
    Ok(outcome(r))
}

/// An ACK or NAK (`syndrome`) of `psn`, taken.
fn answer(r: &mut Requester, psn: u32, syndrome: u8, now: Instant) -> Result<Progress, DropReason> {
    resp(
        r,
        &ack(opcode::ACKNOWLEDGE, psn, syndrome),
        &[],
        now,
        &mut [],
    )
}

/// A plain ACK of `psn`, taken.
fn plain_ack(r: &mut Requester, psn: u32, now: Instant) {
    r.on_response(
        &ack(opcode::ACKNOWLEDGE, psn, Syndrome::ACK),
        &[],
        now,
        &mut [],
    )
    .unwrap();
}

fn timer(r: &mut Requester, now: Instant) -> Progress {
    r.on_timer(now);
    outcome(r)
}

/// Start `msg` with a payload of its length, byte i being i mod 251.
fn start(r: &mut Requester, msg: Message) {
    let data = (0..msg.payload()).map(|i| (i % 251) as u8).collect();
    r.start(msg, data, true);
}

#[test]
fn a_write_is_segmented_first_middle_last_across_the_psn_wrap() {
    let c = ManualClock::new();
    let mut r = Requester::new(attrs(), 7, 0xff_fffe);
    start(
        &mut r,
        Message::Write {
            va: 0x1000,
            rkey: 5,
            len: 600,
            imm: Some(9),
        },
    );
    let p = tx(&mut r, c.now());
    let ops: Vec<_> = p.iter().map(|(h, _)| h.opcode).collect();
    assert_eq!(
        ops,
        [
            opcode::WRITE_FIRST,
            opcode::WRITE_MIDDLE,
            opcode::WRITE_LAST_IMM
        ]
    );
    let psns: Vec<_> = p.iter().map(|(h, _)| h.psn).collect();
    assert_eq!(psns, [0xff_fffe, 0xff_ffff, 0]);
    assert_eq!(
        p[0].0.reth,
        Some(Reth {
            va: 0x1000,
            rkey: 5,
            len: 600
        })
    );
    assert_eq!((p[1].0.reth, p[2].0.imm), (None, Some(9)));
    assert_eq!(
        p.iter().map(|(_, r)| r.clone()).collect::<Vec<_>>(),
        [0..256, 256..512, 512..600]
    );
    assert!(p[2].0.ack_req && !p[0].0.ack_req);
    // The ACK of the last PSN (0 after the wrap) completes it; the next message starts at 1.
    let mut buf = [];
    assert_eq!(
        resp(
            &mut r,
            &ack(opcode::ACKNOWLEDGE, 0, 0x1f),
            &[],
            c.now(),
            &mut buf
        ),
        Ok(Progress::Done(0))
    );
    assert_eq!(r.next_psn(), 1);
}

#[test]
fn only_packets_and_zero_length() {
    let c = ManualClock::new();
    let mut r = Requester::new(attrs(), 7, 10);
    start(&mut r, Message::Send { len: 0, imm: None });
    let p = tx(&mut r, c.now());
    assert_eq!(
        (p.len(), p[0].0.opcode, p[0].1.clone()),
        (1, opcode::SEND_ONLY, 0..0)
    );
    // An ACK older than the message is stale.
    assert_eq!(
        answer(&mut r, 9, 0x1f, c.now()),
        Err(DropReason::UnexpectedResponse)
    );
    plain_ack(&mut r, 10, c.now());
    start(
        &mut r,
        Message::Send {
            len: 256,
            imm: Some(1),
        },
    );
    let p = tx(&mut r, c.now());
    assert_eq!(
        (p.len(), p[0].0.opcode, p[0].0.psn),
        (1, opcode::SEND_ONLY_IMM, 11)
    );
}

#[test]
fn a_sequence_nak_goes_back_n_and_costs_a_retry() {
    let c = ManualClock::new();
    let five = Message::Send {
        len: 256 * 5,
        imm: None,
    };
    let mut r = Requester::new(attrs(), 7, 100);
    start(&mut r, five);
    assert_eq!(tx(&mut r, c.now()).len(), 5);
    // Packet 102 was lost: the responder NAKs with its expected PSN.
    assert_eq!(answer(&mut r, 102, 0x60, c.now()), Ok(Progress::Pending));
    let p = tx(&mut r, c.now());
    assert_eq!(
        p.iter().map(|(h, _)| h.psn).collect::<Vec<_>>(),
        [102, 103, 104]
    );
    assert_eq!(p[0].0.opcode, opcode::SEND_MIDDLE, "original segmentation");
    // While that go-back is under way, another NAK starts none and costs nothing (rxe's
    // `started_retry`): a resend lost again is the ACK timer's.
    for _ in 0..5 {
        assert_eq!(answer(&mut r, 102, 0x60, c.now()), Ok(Progress::Pending));
        assert!(
            tx(&mut r, c.now()).is_empty(),
            "a repeated NAK resends nothing"
        );
    }
    c.advance(Duration::from_millis(2));
    assert_eq!(timer(&mut r, c.now()), Progress::Pending);
    assert_eq!(
        tx(&mut r, c.now()).len(),
        3,
        "the timer's retry, the last of two"
    );
    c.advance(Duration::from_millis(2));
    assert_eq!(
        timer(&mut r, c.now()),
        Progress::Failed(Nak::NoResponse),
        "retry_cnt 2 allows two resends"
    );
    // NAKs further into the same message acknowledge packets: each that moves the oldest
    // unacknowledged PSN is progress (it restores the retries and starts a go-back from
    // itself), a repeat of the PSN already named starts nothing. Nothing goes out between
    // them here, so the go-backs end as one, from the last PSN named.
    let mut r = Requester::new(attrs(), 7, 100);
    start(&mut r, five);
    tx(&mut r, c.now());
    for nak in [101, 101, 102, 102, 103, 103] {
        assert_eq!(
            answer(&mut r, nak, 0x60, c.now()),
            Ok(Progress::Pending),
            "NAK {nak}"
        );
    }
    let p = tx(&mut r, c.now());
    assert_eq!(
        p.iter().map(|(h, _)| h.psn).collect::<Vec<_>>(),
        [103, 104],
        "the one go-back, from what the NAKs acknowledged"
    );
    c.advance(Duration::from_millis(2));
    assert_eq!(timer(&mut r, c.now()), Progress::Pending);
    assert_eq!(tx(&mut r, c.now()).len(), 2, "the timer's retry");
    c.advance(Duration::from_millis(2));
    assert_eq!(
        timer(&mut r, c.now()),
        Progress::Failed(Nak::NoResponse),
        "one retry for the NAKs, one for the timer"
    );
}

#[test]
fn a_sequence_nak_that_finishes_a_message_restores_the_retries() {
    let c = ManualClock::new();
    let mut r = Requester::new(attrs(), 7, 100);
    for _ in 0..3 {
        start(&mut r, write(8));
    }
    assert_eq!(tx(&mut r, c.now()).len(), 3);
    assert_eq!(answer(&mut r, 100, 0x60, c.now()), Ok(Progress::Pending));
    assert_eq!(tx(&mut r, c.now()).len(), 3, "all three again");
    assert_eq!(answer(&mut r, 100, 0x60, c.now()), Ok(Progress::Pending));
    assert!(tx(&mut r, c.now()).is_empty(), "not again");
    // 101: the first WRITE arrived. Progress: a new go-back, of the two left.
    assert_eq!(answer(&mut r, 101, 0x60, c.now()), Ok(Progress::Done(0)));
    let p = tx(&mut r, c.now());
    assert_eq!(p.iter().map(|(h, _)| h.psn).collect::<Vec<_>>(), [101, 102]);
    // Its retries were restored, then its go-back took one: a timeout still resends once
    // (without the progress, this go-back would have taken the last).
    c.advance(Duration::from_millis(2));
    assert_eq!(timer(&mut r, c.now()), Progress::Pending);
    assert_eq!(tx(&mut r, c.now()).len(), 2);
    c.advance(Duration::from_millis(2));
    assert_eq!(timer(&mut r, c.now()), Progress::Failed(Nak::NoResponse));
}

#[test]
fn ack_timeouts_resend_then_fail_with_retry_exceeded() {
    let c = ManualClock::new();
    let mut r = Requester::new(attrs(), 7, 0);
    start(
        &mut r,
        Message::Write {
            va: 0,
            rkey: 1,
            len: 8,
            imm: None,
        },
    );
    tx(&mut r, c.now());
    let t = r.next_timer().expect("armed");
    assert_eq!(t - c.now(), Duration::from_nanos(4096 << 8));
    c.advance(Duration::from_nanos((4096 << 8) - 1));
    assert_eq!(timer(&mut r, c.now()), Progress::Pending);
    assert!(tx(&mut r, c.now()).is_empty(), "not yet");
    for _ in 0..2 {
        c.advance(Duration::from_millis(2));
        assert_eq!(timer(&mut r, c.now()), Progress::Pending);
        assert_eq!(tx(&mut r, c.now()).len(), 1, "resent");
    }
    c.advance(Duration::from_millis(2));
    assert_eq!(timer(&mut r, c.now()), Progress::Failed(Nak::NoResponse));
}

#[test]
fn progress_resets_the_retry_count() {
    let c = ManualClock::new();
    let mut r = Requester::new(attrs(), 7, 0);
    start(
        &mut r,
        Message::Send {
            len: 256 * 40,
            imm: None,
        },
    );
    assert_eq!(tx(&mut r, c.now()).len(), 40);
    for _ in 0..2 {
        c.advance(Duration::from_millis(2));
        timer(&mut r, c.now());
    }
    assert_eq!(
        tx(&mut r, c.now()).len(),
        40,
        "go back to the oldest unacknowledged"
    );
    plain_ack(&mut r, 15, c.now());
    c.advance(Duration::from_millis(2));
    assert_eq!(
        timer(&mut r, c.now()),
        Progress::Pending,
        "retries restored by the ACK"
    );
    assert_eq!(tx(&mut r, c.now())[0].0.psn, 16);
}

#[test]
fn the_window_holds_back_a_long_message() {
    let c = ManualClock::new();
    let mut r = Requester::new(attrs(), 7, 0);
    start(
        &mut r,
        Message::Write {
            va: 0,
            rkey: 1,
            len: 256 * 200,
            imm: None,
        },
    );
    let p = tx(&mut r, c.now());
    assert_eq!(p.len(), WINDOW as usize);
    assert!(p[ACK_EVERY as usize - 1].0.ack_req);
    plain_ack(&mut r, 15, c.now());
    let p = tx(&mut r, c.now());
    assert_eq!((p.len(), p[0].0.psn), (16, 64));
}

#[test]
fn rnr_naks_wait_their_timer_and_run_out() {
    let c = ManualClock::new();
    let mut r = Requester::new(attrs(), 7, 50);
    start(&mut r, Message::Send { len: 4, imm: None });
    tx(&mut r, c.now());
    assert_eq!(
        resp(
            &mut r,
            &ack(opcode::ACKNOWLEDGE, 50, 0x20 | 14),
            &[],
            c.now(),
            &mut []
        ),
        Ok(Progress::Pending)
    );
    assert!(tx(&mut r, c.now()).is_empty(), "waits");
    assert_eq!(r.next_timer(), Some(c.now() + Duration::from_micros(1280)));
    c.advance(Duration::from_micros(1279));
    timer(&mut r, c.now());
    assert!(tx(&mut r, c.now()).is_empty());
    c.advance(Duration::from_micros(1));
    timer(&mut r, c.now());
    assert_eq!(tx(&mut r, c.now())[0].0.psn, 50, "resent after the timer");
    assert_eq!(
        answer(&mut r, 50, 0x21, c.now()),
        Ok(Progress::Failed(Nak::RnrRetryExceeded)),
        "rnr_retry 1"
    );
    // rnr_retry 7 never runs out.
    let mut r = Requester::new(
        RequesterAttrs {
            rnr_retry: 7,
            ..attrs()
        },
        7,
        0,
    );
    start(&mut r, Message::Send { len: 4, imm: None });
    for _ in 0..100 {
        tx(&mut r, c.now());
        assert_eq!(answer(&mut r, 0, 0x21, c.now()), Ok(Progress::Pending));
        c.advance(Duration::from_millis(1));
        timer(&mut r, c.now());
    }
}

#[test]
fn remote_naks_end_the_message_with_their_error() {
    let c = ManualClock::new();
    for (code, want) in [
        (0x61, Nak::RemoteInvalid),
        (0x62, Nak::RemoteAccess(AccessFault::UnknownKey(0))),
        (0x63, Nak::RemoteOperation),
        (0x6a, Nak::RemoteOperation),
    ] {
        let mut r = Requester::new(attrs(), 7, 0);
        start(
            &mut r,
            Message::Read {
                va: 0,
                rkey: 1,
                len: 8,
            },
        );
        tx(&mut r, c.now());
        assert_eq!(
            resp(
                &mut r,
                &ack(opcode::ACKNOWLEDGE, 0, code),
                &[],
                c.now(),
                &mut [0; 8]
            ),
            Ok(Progress::Failed(want))
        );
    }
}

#[test]
fn a_read_reassembles_and_re_requests_from_a_gap() {
    let c = ManualClock::new();
    let mut r = Requester::new(attrs(), 7, 0xff_fffe);
    start(
        &mut r,
        Message::Read {
            va: 0x5000,
            rkey: 3,
            len: 700,
        },
    );
    let p = tx(&mut r, c.now());
    assert_eq!(p.len(), 1);
    assert_eq!(
        p[0].0.reth,
        Some(Reth {
            va: 0x5000,
            rkey: 3,
            len: 700
        })
    );
    assert_eq!(r.next_psn(), 1, "a READ of 3 packets takes 3 PSNs");
    let data: Vec<u8> = (0..700).map(|i| (i * 7) as u8).collect();
    let mut out = vec![0u8; 700];
    let first = ack(opcode::READ_RESPONSE_FIRST, 0xff_fffe, 0x1f);
    assert_eq!(
        resp(&mut r, &first, &data[..256], c.now(), &mut out),
        Ok(Progress::Pending)
    );
    // The MIDDLE is lost; the LAST arrives: one re-request from the missing PSN.
    let last = ack(opcode::READ_RESPONSE_LAST, 0, 0x1f);
    assert_eq!(
        resp(&mut r, &last, &data[512..], c.now(), &mut out),
        Err(DropReason::OutOfSequence)
    );
    assert_eq!(
        resp(&mut r, &last, &data[512..], c.now(), &mut out),
        Err(DropReason::OutOfSequence)
    );
    let p = tx(&mut r, c.now());
    assert_eq!(p.len(), 1, "once per gap");
    assert_eq!(p[0].0.psn, 0xff_ffff);
    assert_eq!(
        p[0].0.reth,
        Some(Reth {
            va: 0x5000 + 256,
            rkey: 3,
            len: 444
        })
    );
    let mid = Header::new(opcode::READ_RESPONSE_MIDDLE, 7, 0xff_ffff);
    assert_eq!(
        resp(&mut r, &mid, &data[256..512], c.now(), &mut out),
        Ok(Progress::Pending)
    );
    // A LAST of the wrong length is not taken.
    assert_eq!(
        resp(&mut r, &last, &data[511..], c.now(), &mut out),
        Err(DropReason::UnexpectedResponse)
    );
    assert_eq!(
        resp(&mut r, &last, &data[512..], c.now(), &mut out),
        Ok(Progress::Done(700))
    );
    assert_eq!(out, data);
}

#[test]
fn an_atomic_is_resent_with_its_psn_and_takes_the_original_value() {
    let c = ManualClock::new();
    let mut r = Requester::new(attrs(), 7, 33);
    start(
        &mut r,
        Message::Atomic {
            va: 8,
            rkey: 2,
            swap_add: 5,
            compare: Some(4),
        },
    );
    let p = tx(&mut r, c.now());
    assert_eq!(p[0].0.opcode, opcode::COMPARE_SWAP);
    c.advance(Duration::from_millis(2));
    timer(&mut r, c.now());
    let p = tx(&mut r, c.now());
    assert_eq!(
        (p[0].0.psn, p[0].0.atomic.unwrap().compare),
        (33, 4),
        "same PSN: a duplicate"
    );
    let mut a = ack(opcode::ATOMIC_ACKNOWLEDGE, 33, 0x1f);
    a.atomic_ack = Some(0xfeed);
    assert_eq!(
        resp(&mut r, &a, &[], c.now(), &mut []),
        Ok(Progress::Done(0xfeed))
    );
    assert_eq!(r.next_psn(), 34);
}

fn write(len: u32) -> Message {
    Message::Write {
        va: 0x1000,
        rkey: 5,
        len,
        imm: None,
    }
}

#[test]
fn several_messages_go_out_before_any_ack_and_finish_in_order() {
    let c = ManualClock::new();
    let mut r = Requester::new(attrs(), 7, 0xff_fffe);
    // Three WRITEs of 2, 1 and 3 packets: PSNs fffffe-ffffff, 0, 1-3.
    for len in [512, 100, 700] {
        assert!(r.has_room(&write(len)));
        start(&mut r, write(len));
    }
    let p = tx(&mut r, c.now());
    let psns: Vec<_> = p.iter().map(|(h, _)| h.psn).collect();
    assert_eq!(psns, [0xff_fffe, 0xff_ffff, 0, 1, 2, 3]);
    let ops: Vec<_> = p.iter().map(|(h, _)| h.opcode).collect();
    assert_eq!(
        ops,
        [
            opcode::WRITE_FIRST,
            opcode::WRITE_LAST,
            opcode::WRITE_ONLY,
            opcode::WRITE_FIRST,
            opcode::WRITE_MIDDLE,
            opcode::WRITE_LAST
        ]
    );
    // Each message's last packet asks for an ACK; ranges are within each message.
    assert!(p[1].0.ack_req && p[2].0.ack_req && p[5].0.ack_req && !p[3].0.ack_req);
    assert_eq!(p[5].1, 512..700);
    // An ACK in the middle of the first message finishes nothing.
    let mut none = [];
    r.on_response(
        &ack(opcode::ACKNOWLEDGE, 0xff_fffe, 0x1f),
        &[],
        c.now(),
        &mut none,
    )
    .unwrap();
    assert_eq!(r.pop_finished(), None);
    // One ACK covering the first two finishes both, in order.
    plain_ack(&mut r, 0, c.now());
    assert_eq!(
        (r.pop_finished(), r.pop_finished(), r.pop_finished()),
        (Some(Ok(0)), Some(Ok(0)), None)
    );
    assert_eq!(r.outstanding(), 1);
    // A stale ACK is dropped.
    assert_eq!(
        r.on_response(
            &ack(opcode::ACKNOWLEDGE, 0xff_ffff, 0x1f),
            &[],
            c.now(),
            &mut none
        ),
        Err(DropReason::UnexpectedResponse)
    );
    plain_ack(&mut r, 3, c.now());
    assert_eq!((r.pop_finished(), r.outstanding()), (Some(Ok(0)), 0));
    assert_eq!(r.next_timer(), None, "nothing outstanding, no timer");
}

#[test]
fn a_nak_mid_window_goes_back_to_its_psn_across_messages() {
    let c = ManualClock::new();
    let mut r = Requester::new(attrs(), 7, 100);
    for _ in 0..4 {
        start(&mut r, write(512)); // 2 packets each: 100-107
    }
    assert_eq!(tx(&mut r, c.now()).len(), 8);
    // 103 (the second packet of the second message) was lost.
    let mut none = [];
    r.on_response(
        &ack(opcode::ACKNOWLEDGE, 103, 0x60),
        &[],
        c.now(),
        &mut none,
    )
    .unwrap();
    assert_eq!(
        r.pop_finished(),
        Some(Ok(0)),
        "the first message is acknowledged"
    );
    assert_eq!(r.pop_finished(), None);
    let p = tx(&mut r, c.now());
    assert_eq!(
        p.iter().map(|(h, _)| (h.psn, h.opcode)).collect::<Vec<_>>(),
        [
            (103, opcode::WRITE_LAST),
            (104, opcode::WRITE_FIRST),
            (105, opcode::WRITE_LAST),
            (106, opcode::WRITE_FIRST),
            (107, opcode::WRITE_LAST)
        ],
        "from the PSN named, with the original segmentation"
    );
    assert_eq!(p[0].1, 256..512);
    // An ACK timeout in the middle: back to the oldest unacknowledged PSN, 106.
    r.on_response(
        &ack(opcode::ACKNOWLEDGE, 105, 0x1f),
        &[],
        c.now(),
        &mut none,
    )
    .unwrap();
    assert_eq!(
        (r.pop_finished(), r.pop_finished()),
        (Some(Ok(0)), Some(Ok(0)))
    );
    c.advance(Duration::from_millis(2));
    r.on_timer(c.now());
    let p = tx(&mut r, c.now());
    assert_eq!(p.iter().map(|(h, _)| h.psn).collect::<Vec<_>>(), [106, 107]);
}

#[test]
fn a_failure_ends_the_message_it_names_and_drops_the_rest() {
    let c = ManualClock::new();
    let mut r = Requester::new(attrs(), 7, 10);
    for _ in 0..3 {
        start(&mut r, write(100)); // PSNs 10, 11, 12
    }
    tx(&mut r, c.now());
    // The responder refuses the second: the first is implicitly acknowledged.
    r.on_response(&ack(opcode::ACKNOWLEDGE, 11, 0x62), &[], c.now(), &mut [])
        .unwrap();
    assert_eq!(r.pop_finished(), Some(Ok(0)));
    assert_eq!(
        r.pop_finished(),
        Some(Err(Nak::RemoteAccess(AccessFault::UnknownKey(0))))
    );
    assert_eq!((r.pop_finished(), r.outstanding()), (None, 0));
    // Nothing more goes out, and a later start is dropped without an outcome.
    start(&mut r, write(100));
    assert!(tx(&mut r, c.now()).is_empty());
    assert_eq!((r.pop_finished(), r.outstanding()), (None, 0));

    // Timeouts with no ACK fail the oldest, once the retries are spent.
    let mut r = Requester::new(attrs(), 7, 10);
    for _ in 0..3 {
        start(&mut r, write(100));
    }
    for resend in 0..3 {
        assert_eq!(tx(&mut r, c.now()).len(), 3, "resend {resend}");
        c.advance(Duration::from_millis(2));
        r.on_timer(c.now());
    }
    assert_eq!(r.pop_finished(), Some(Err(Nak::NoResponse)));
    assert_eq!((r.pop_finished(), r.outstanding()), (None, 0));
}

#[test]
fn the_window_admits_sends_and_writes_up_to_its_bounds_and_reads_alone() {
    let mut r = Requester::new(attrs(), 7, 0);
    let read = Message::Read {
        va: 0,
        rkey: 1,
        len: 8,
    };
    assert!(r.has_room(&read), "nothing outstanding");
    start(&mut r, write(8));
    assert!(!r.has_room(&read), "a READ waits for the WRITE's ACK");
    for _ in 1..MAX_MESSAGES {
        assert!(r.has_room(&write(8)));
        start(&mut r, write(8));
    }
    assert!(!r.has_room(&write(8)), "{MAX_MESSAGES} messages");
    let mut r = Requester::new(attrs(), 7, 0);
    start(&mut r, write(u32::try_from(MAX_BYTES).unwrap() - 8));
    assert!(r.has_room(&write(8)) && !r.has_room(&write(9)), "bytes");
    let mut r = Requester::new(attrs(), 7, 0);
    start(&mut r, write(u32::try_from(MAX_BYTES).unwrap() + 1));
    assert_eq!(r.outstanding(), 1, "a big message goes alone");
    assert!(!r.has_room(&write(1)));
    start(&mut r, read);
    let mut r = Requester::new(attrs(), 7, 0);
    start(&mut r, read);
    assert!(!r.has_room(&write(1)), "nothing passes a READ");
}

/// The PSNs of the packets in `p` that ask for an ACK.
fn asking(p: &[(Header, Range<usize>)]) -> Vec<u32> {
    p.iter()
        .filter(|(h, _)| h.ack_req)
        .map(|(h, _)| h.psn)
        .collect()
}

/// Start a WRITE of `len` bytes whose outcome nobody waits for (an unsignaled WQE's).
fn start_unasked(r: &mut Requester, len: u32) {
    r.start(write(len), vec![7; len as usize], false);
}

#[test]
fn only_waited_for_messages_and_every_sixteenth_psn_ask_for_an_ack() {
    let c = ManualClock::new();
    // PSNs 10..: one-packet WRITEs, unsignaled but for the fourth.
    let mut r = Requester::new(attrs(), 7, 10);
    for i in 0..8 {
        if i == 3 {
            r.start(write(100), vec![1; 100], true);
        } else {
            start_unasked(&mut r, 100);
        }
    }
    let p = tx(&mut r, c.now());
    // PSN 13 is the signaled one's; 15 is the sixteenth PSN's (15 mod 16).
    assert_eq!(asking(&p), [13, 15]);
    // A long message asks on its PSNs 15 mod 16 too, and not at its unsignaled end.
    let mut r = Requester::new(attrs(), 7, 0);
    start_unasked(&mut r, 40 * 256);
    let p = tx(&mut r, c.now());
    assert_eq!(p.len(), 40);
    assert_eq!(asking(&p), [15, 31]);
}

#[test]
fn a_quiet_senders_unasked_packets_are_asked_for_by_a_duplicate() {
    let c = ManualClock::new();
    let mut r = Requester::new(attrs(), 7, 100);
    start_unasked(&mut r, 100);
    start_unasked(&mut r, 300);
    let sent_at = c.now();
    assert_eq!(tx(&mut r, sent_at).len(), 3, "PSNs 100, 101, 102");
    // ACK timeout 1.05 ms: the ACK is asked for after a quarter of it.
    let ask_at = sent_at + Duration::from_nanos((4096u64 << 8) / 4);
    assert_eq!(r.next_timer(), Some(ask_at));
    c.advance(Duration::from_micros(200));
    r.on_timer(c.now());
    assert!(tx(&mut r, c.now()).is_empty(), "not yet");
    c.advance(Duration::from_micros(63));
    assert_eq!(timer(&mut r, c.now()), Progress::Pending);
    let p = tx(&mut r, c.now());
    assert_eq!(p.len(), 1, "one duplicate: {p:?}");
    let (h, range) = &p[0];
    assert_eq!(
        (h.psn, h.opcode, h.ack_req, range.clone()),
        (102, opcode::WRITE_LAST, true, 256..300),
        "the newest packet again, asking"
    );
    // The ACK timer was not re-armed by the duplicate; nothing more is asked for.
    assert_eq!(
        r.next_timer(),
        Some(sent_at + Duration::from_nanos(4096 << 8))
    );
    assert!(!r.solicit(), "the newest packet sent asked");
    plain_ack(&mut r, 102, c.now());
    assert_eq!(
        (outcome(&mut r), outcome(&mut r), r.next_timer()),
        (Progress::Done(0), Progress::Done(0), None)
    );
}

#[test]
fn a_wait_asks_at_once_and_an_ack_of_everything_cancels_the_ask() {
    let c = ManualClock::new();
    let mut r = Requester::new(attrs(), 7, 0);
    assert!(!r.solicit(), "nothing sent");
    start_unasked(&mut r, 10);
    assert!(!r.solicit(), "nothing sent yet");
    tx(&mut r, c.now());
    assert!(r.solicit(), "someone waits: ask now");
    assert!(!r.solicit(), "already asked");
    let p = tx(&mut r, c.now());
    assert_eq!((p.len(), p[0].0.psn, p[0].0.ack_req), (1, 0, true));
    // Another unasked packet, then an ACK of everything before its ask is due.
    start_unasked(&mut r, 10);
    tx(&mut r, c.now());
    plain_ack(&mut r, 1, c.now());
    assert_eq!(r.next_timer(), None, "nothing outstanding, no ask");
    assert!(!r.solicit());
    // An ACK of part of what was sent leaves the ask armed for the rest.
    start_unasked(&mut r, 10);
    start_unasked(&mut r, 10);
    let at = c.now();
    tx(&mut r, at);
    plain_ack(&mut r, 2, at);
    assert_eq!(outcome(&mut r), Progress::Done(0));
    assert_eq!(outcome(&mut r), Progress::Done(0));
    c.advance(SOLICIT_AFTER);
    r.on_timer(c.now());
    let p = tx(&mut r, c.now());
    assert_eq!((p.len(), p[0].0.psn, p[0].0.ack_req), (1, 3, true));
}

#[test]
fn packets_sent_again_are_counted_as_resent_bytes_and_first_sends_are_not() {
    let c = ManualClock::new();
    let mut r = Requester::new(attrs(), 7, 100);
    start(
        &mut r,
        Message::Send {
            len: 256 * 5,
            imm: None,
        },
    );
    assert_eq!(tx(&mut r, c.now()).len(), 5);
    assert_eq!(r.resent_bytes(), 0, "first sends");
    // A sequence NAK at 102: 102..=104 go out again.
    assert_eq!(answer(&mut r, 102, 0x60, c.now()), Ok(Progress::Pending));
    assert_eq!(tx(&mut r, c.now()).len(), 3);
    assert_eq!(r.resent_bytes(), 3 * 256);
    // The next message's packets are new.
    plain_ack(&mut r, 104, c.now());
    start(
        &mut r,
        Message::Send {
            len: 100,
            imm: None,
        },
    );
    assert_eq!(tx(&mut r, c.now()).len(), 1);
    assert_eq!(r.resent_bytes(), 3 * 256, "a new message is no resend");
    // An ACK timeout resends it.
    c.advance(Duration::from_millis(2));
    timer(&mut r, c.now());
    assert_eq!(tx(&mut r, c.now()).len(), 1);
    assert_eq!(r.resent_bytes(), 3 * 256 + 100);
}

#[test]
fn the_last_packet_of_a_go_back_asks_for_its_ack_and_no_copy_follows() {
    let c = ManualClock::new();
    let mut r = Requester::new(attrs(), 7, 100);
    for _ in 0..3 {
        start_unasked(&mut r, 8);
    }
    assert_eq!(
        asking(&tx(&mut r, c.now())),
        [] as [u32; 0],
        "nobody waits: none asks"
    );
    assert_eq!(answer(&mut r, 101, 0x60, c.now()), Ok(Progress::Done(0)));
    let p = tx(&mut r, c.now());
    assert_eq!(p.iter().map(|(h, _)| h.psn).collect::<Vec<_>>(), [101, 102]);
    assert_eq!(asking(&p), [102], "the go-back's last asks");
    assert!(!r.solicit(), "asked already: no copy to send");
    assert!(tx(&mut r, c.now()).is_empty());
    // More than a window to resend: its last packet is the window's end.
    let mut r = Requester::new(attrs(), 7, 5);
    start_unasked(&mut r, 256 * (WINDOW + 8));
    assert_eq!(tx(&mut r, c.now()).len(), WINDOW as usize);
    assert_eq!(answer(&mut r, 5, 0x60, c.now()), Ok(Progress::Pending));
    let p = tx(&mut r, c.now());
    assert_eq!(p.len(), WINDOW as usize);
    let end = 5 + WINDOW - 1;
    let mut expected: Vec<u32> = (5..end).filter(|i| i % 16 == 15).collect();
    expected.push(end);
    assert_eq!(
        asking(&p),
        expected,
        "every sixteenth PSN, and the window's end"
    );
}
