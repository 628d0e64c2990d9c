//! The manager's side as a REQUESTER, and the RC state machines, attacked by a remote client
//! of its own making (`raw_peer`: a plain UDP socket its hellos name).
//!
//! The offload's chain answers a trigger with an RDMA WRITE to the client's `response`
//! region and its requester then waits for the client's ACK: the client decides what comes
//! back. What it may send instead: nothing at all, RNR NAKs, sequence NAKs, ACKs of PSNs
//! never sent, reserved syndromes, READ responses and atomic ACKs nobody asked for. And as
//! the manager's responder sees it: SENDs in many packets longer than the receive posted,
//! opcodes out of sequence, and PSNs wrapping at 2^24.
//!
//! What must hold: one client's games cost the others nothing (the manager has one PU in
//! these tests, as `etc/redn/manager.toml` ships it), the manager's retransmissions stay
//! bounded (its QP goes to error within its retry counts), nothing completes a WQE wrongly,
//! and a client holds no more of the manager's memory than its receive buffers.
//!
//! Found (these tests fail on the code as it is; 2-core VM, one run each):
//! - A server-loop answer (a signaled WRITE) left unacknowledged holds the PU: the executor
//!   waits for its ACK at rest (`Core::settle_at_rest` asks `Ask::Wait`, and
//!   `RoceTransport::settle` drives the requester until an outcome), so no other queue runs
//!   until the retries run out: another client's GET waited 537 ms a session, 2.15 s for
//!   four sessions triggered at once.
//! - With RNR NAKs (the manager's QPs keep `QpRecord::new`'s `rnr_retry` 7, "for ever") the
//!   wait never ends: four 20-byte datagrams in 2.5 s (the 655 ms RNR timer) left another
//!   client with no GET at all; with the 10 µs timer the answer was resent 61,385 times in
//!   1.5 s, one WRITE a NAK, the QP never in error.
//! - A SEND in many packets is reassembled up to 16 MiB (`MAX_MESSAGE`) whatever receive is
//!   posted (14 bytes here): two sessions holding unfinished 16 MiB SENDs grew the manager
//!   by 34 MB.
//!
//! Held: sequence NAKs (7 resends, then error), forged ACKs / responses / MSNs (dropped),
//! a reserved syndrome (that QP to error), opcode sequence and segment lengths (invalid
//! request NAK, that QP to error), PSNs wrapping at 2^24 with duplicates.

use super::raw_peer::{Peer, Served, Session, START_PSN};
use super::*;
use redn_sys::softnic::roce::packet::{self, opcode, psn, Header, Syndrome};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// A manager (one PU) serving `server-loop` (whose answering WRITE is signaled: its
/// completion waits for the client's ACK) and `hash-get` (unsignaled answers, four
/// triggers an instance) to remote clients of one app.
struct Setup {
    m: Manager,
    _app: redn_client::Client,
    server_loop: Served,
    hash_get: Served,
}

impl Setup {
    fn start() -> Setup {
        let policy = policy("", "")
            .replace("\"echo\"]", "\"echo\", \"server-loop\"]")
            .replace("max_remote_clients = 4", "max_remote_clients = 16");
        let m = Manager::start_with_dataplane(&policy);
        let mut app = m.client();
        let server_loop = Served::install(&mut app, "server-loop");
        let hash_get = Served::install(&mut app, "hash-get");
        Setup {
            m,
            _app: app,
            server_loop,
            hash_get,
        }
    }
}

/// A good client's GETs for `window`: how many, and the slowest.
fn gets_during(
    good: &mut redn_client::remote::RemoteClient,
    window: Duration,
) -> (usize, Duration, Vec<String>) {
    let start = Instant::now();
    let (mut n, mut worst, mut failed) = (0, Duration::ZERO, Vec::new());
    while start.elapsed() < window {
        let t = Instant::now();
        match good.get(0x2a) {
            Ok(v) => {
                assert_eq!(v.as_deref(), Some(&b"hello"[..]));
                n += 1;
            }
            Err(e) => failed.push(e.to_string()),
        }
        worst = worst.max(t.elapsed());
    }
    (n, worst, failed)
}

/// What the attacker's thread saw of one QP: the manager's requests (the answer and its
/// resends), their bytes, the attacker's datagrams and bytes, and when the last request came.
#[derive(Debug, Default)]
struct Seen {
    requests: u64,
    request_bytes: u64,
    sent: u64,
    sent_bytes: u64,
    last_request: Option<Duration>,
}

/// Run `answer` (the attacker's reply to each request the manager sends to `s`, or None for
/// silence) on a thread until `stop`; what it saw.
fn hostile_thread(
    peer: Peer,
    s: Session,
    stop: Arc<AtomicBool>,
    answer: impl Fn(&Peer, &Session, &Header) -> Option<usize> + Send + 'static,
) -> std::thread::JoinHandle<Seen> {
    std::thread::spawn(move || {
        let start = Instant::now();
        let mut seen = Seen::default();
        while !stop.load(Ordering::Acquire) {
            let Some((h, n)) = peer.recv(Duration::from_millis(20)) else {
                continue;
            };
            if packet::is_response(h.opcode) {
                continue;
            }
            seen.requests += 1;
            seen.request_bytes += n.datagram as u64;
            seen.last_request = Some(start.elapsed());
            if let Some(b) = answer(&peer, &s, &h) {
                seen.sent += 1;
                seen.sent_bytes += b as u64;
            }
        }
        drop(s);
        seen
    })
}

/// A server-loop session whose first answer has come (unacknowledged): the peer, the
/// session and that answer's header.
fn triggered_session(s: &Setup, qpn: u32) -> (Peer, Session, Header) {
    let peer = Peer::new();
    let mut sess = peer.hello(&s.server_loop.door, qpn);
    let h = peer.trigger_answered(&mut sess);
    (peer, sess, h)
}

/// Attack 1: a client triggers server-loop and never acknowledges the WRITE that answers it. The
/// manager's requester retransmits it (7 retries, 67 ms apart) and then fails it: that is
/// bounded. What must also hold: meanwhile another client of the same manager is served
/// (its GETs take milliseconds, not the half second the retries take).
#[test]
fn a_client_that_never_acknowledges_its_answer_does_not_stall_the_other_clients() {
    let s = Setup::start();
    let mut good = s.server_loop.door.good_client();
    assert_eq!(good.get(0x2a).unwrap().as_deref(), Some(&b"hello"[..]));
    let mut worst_all = Duration::ZERO;
    let mut total = 0;
    for round in 0..2 {
        let (peer, sess, _) = triggered_session(&s, 0x42 + round);
        let stop = Arc::new(AtomicBool::new(false));
        let t = hostile_thread(peer, sess, Arc::clone(&stop), |_, _, _| None);
        let (n, worst, failed) = gets_during(&mut good, Duration::from_millis(1200));
        stop.store(true, Ordering::Release);
        let seen = t.join().unwrap();
        eprintln!(
            "never-ack round {round}: the manager sent {} requests ({} B), the last at {:?}; \
             the good client got {n} GETs, the slowest {worst:?}, failed {failed:?}",
            seen.requests, seen.request_bytes, seen.last_request
        );
        assert!(failed.is_empty(), "{failed:?}");
        assert!(
            seen.requests <= 8,
            "retransmitted {} times: never to error",
            seen.requests
        );
        worst_all = worst_all.max(worst);
        total += n;
    }
    // Below the ~537 ms a stall took (seven retries 67 ms apart), with room for a loaded
    // machine's scheduling and a lost datagram's 67 ms ACK timeout.
    assert!(
        worst_all < Duration::from_millis(400),
        "a client that never ACKs stalled another client's GET for {worst_all:?} \
         ({total} GETs in 2.4 s)"
    );
}

/// 1b. The same from four sessions at once (each a hello and one trigger, under
/// `max_remote_clients`): six datagrams of the attacker's against another client's GETs for
/// 2.5 s. What must hold: that client is still served within milliseconds.
#[test]
fn four_sessions_that_never_acknowledge_do_not_stall_the_other_clients() {
    let s = Setup::start();
    let mut good = s.server_loop.door.good_client();
    assert_eq!(good.get(0x2a).unwrap().as_deref(), Some(&b"hello"[..]));
    // Sessions first (each hello installs an instance: slow), then the triggers at once.
    let mut sessions: Vec<(Peer, Session)> = (0..4)
        .map(|i| {
            let peer = Peer::new();
            let sess = peer.hello(&s.server_loop.door, 0x42 + i);
            (peer, sess)
        })
        .collect();
    // Let every instance enable its first receive.
    std::thread::sleep(Duration::from_millis(50));
    for (peer, sess) in &mut sessions {
        peer.trigger(sess);
    }
    let window = Duration::from_millis(2500);
    let (n, worst, failed) = gets_during(&mut good, window);
    let mut answers = 0;
    for (peer, _) in &sessions {
        while let Some((h, _)) = peer.recv(Duration::from_millis(1)) {
            answers += u64::from(!packet::is_response(h.opcode));
        }
    }
    eprintln!(
        "four sessions never ACKing: {answers} WRITEs to them; the good client got {n} GETs \
         in {window:?}, the slowest {worst:?}, failed {failed:?}"
    );
    assert!(failed.is_empty(), "{failed:?}");
    assert!(
        worst < Duration::from_millis(400),
        "four sessions that never ACK stalled another client's GET for {worst:?} ({n} GETs \
         in {window:?})"
    );
}

/// Attack 2: a client answers every WRITE of the offload (a WRITE with immediate, which consumes a
/// receive, so an RNR NAK is legal) with an RNR NAK naming the shortest RNR timer (10 µs).
/// The manager's QPs take `QpRecord::new`'s `rnr_retry` of 7, "retry for ever", which no
/// requester should grant a peer nobody trusts.
/// What must hold: the manager's QP goes to error after a bounded number of retries (its
/// `rnr_retry`), rather than retransmitting for as long as the client likes.
#[test]
fn rnr_naks_cannot_keep_the_managers_answer_retransmitting_for_ever() {
    let s = Setup::start();
    let (peer, sess, first) = triggered_session(&s, 0x42);
    assert_eq!(first.opcode, opcode::WRITE_ONLY_IMM, "{first:?}");
    // RNR NAK code 1: 10 µs.
    peer.reply(&sess, opcode::ACKNOWLEDGE, first.psn, 0x21, &[]);
    let stop = Arc::new(AtomicBool::new(false));
    let t = hostile_thread(peer, sess, Arc::clone(&stop), |p, s, h| {
        Some(p.reply(s, opcode::ACKNOWLEDGE, h.psn, 0x21, &[]))
    });
    std::thread::sleep(Duration::from_millis(1500));
    stop.store(true, Ordering::Release);
    let seen = t.join().unwrap();
    eprintln!(
        "RNR NAKs: the attacker sent {} NAKs ({} B), the manager {} WRITEs ({} B) in 1.5 s, \
         the last at {:?}",
        seen.sent + 1,
        seen.sent_bytes,
        seen.requests,
        seen.request_bytes,
        seen.last_request
    );
    assert!(
        seen.requests <= 8,
        "the manager retransmitted its answer {} times in 1.5 s for RNR NAKs and never went \
         to error",
        seen.requests
    );
}

/// Attack 3: the same with the longest RNR timer (code 0: 655 ms): one 48-byte datagram every
/// 655 ms. What must hold: the other clients of the manager are served meanwhile.
#[test]
fn a_client_sending_rnr_naks_cannot_stall_the_other_clients() {
    let s = Setup::start();
    let mut good = s.server_loop.door.good_client();
    assert_eq!(good.get(0x2a).unwrap().as_deref(), Some(&b"hello"[..]));
    let (peer, sess, first) = triggered_session(&s, 0x42);
    peer.reply(&sess, opcode::ACKNOWLEDGE, first.psn, 0x20, &[]);
    let stop = Arc::new(AtomicBool::new(false));
    let t = hostile_thread(peer, sess, Arc::clone(&stop), |p, s, h| {
        Some(p.reply(s, opcode::ACKNOWLEDGE, h.psn, 0x20, &[]))
    });
    // A GET in another thread, so that a stalled one is measured, not waited for (its
    // timeout is 30 s).
    let window = Duration::from_millis(2500);
    let done = Arc::new(AtomicU64::new(0));
    let g = {
        let done = Arc::clone(&done);
        std::thread::spawn(move || {
            let start = Instant::now();
            let mut worst = Duration::ZERO;
            while start.elapsed() < window {
                let t = Instant::now();
                let v = good.get(0x2a);
                worst = worst.max(t.elapsed());
                assert_eq!(v.unwrap().as_deref(), Some(&b"hello"[..]));
                done.fetch_add(1, Ordering::AcqRel);
            }
            (good, worst)
        })
    };
    std::thread::sleep(window);
    let during = done.load(Ordering::Acquire);
    stop.store(true, Ordering::Release);
    let seen = t.join().unwrap();
    let (_good, worst) = g.join().unwrap();
    eprintln!(
        "RNR NAKs (655 ms): the attacker sent {} datagrams, the manager {} WRITEs; the good \
         client got {during} GETs in {window:?}, the slowest {worst:?}",
        seen.sent + 1,
        seen.requests
    );
    // Below the 655 ms RNR wait one NAK bought, with room for a loaded machine.
    assert!(
        worst < Duration::from_millis(400),
        "an RNR-NAKing client stalled another client's GET for {worst:?} ({during} GETs in \
         {window:?})"
    );
}

/// Attack 4: sequence NAKs at the answer's own PSN, each time it comes: the first starts a
/// go-back and costs a retry; while it is under way further NAKs start none (rxe's
/// `started_retry`), so the resends are the ACK timer's, at most `retry_cnt` (7), and then
/// the manager puts its QP in error. Amplification is at most one WRITE per NAK.
#[test]
fn sequence_naks_cost_retries_and_end_in_error() {
    let s = Setup::start();
    let (peer, sess, first) = triggered_session(&s, 0x42);
    peer.reply(
        &sess,
        opcode::ACKNOWLEDGE,
        first.psn,
        Syndrome::NAK_SEQUENCE,
        &[],
    );
    let stop = Arc::new(AtomicBool::new(false));
    let t = hostile_thread(peer, sess, Arc::clone(&stop), |p, s, h| {
        Some(p.reply(s, opcode::ACKNOWLEDGE, h.psn, Syndrome::NAK_SEQUENCE, &[]))
    });
    std::thread::sleep(Duration::from_millis(1000));
    stop.store(true, Ordering::Release);
    let seen = t.join().unwrap();
    eprintln!(
        "sequence NAKs: the attacker sent {} NAKs ({} B), the manager {} WRITEs ({} B), the \
         last at {:?}",
        seen.sent + 1,
        seen.sent_bytes,
        seen.requests,
        seen.request_bytes,
        seen.last_request
    );
    assert!(seen.requests <= 8, "{seen:?}");
    let good = s.server_loop.door.good_client();
    drop(good);
}

/// Attack 5: forged responses to a QP with one WRITE outstanding: ACKs of PSNs never sent (one
/// ahead, far ahead, half the circle away), of an old PSN, an ACK with a wild MSN at a
/// PSN before the WRITE, READ responses and an atomic ACK nobody asked for. None may
/// complete the WRITE: it is resent (its ACK timer runs), and once properly ACKed the QP
/// serves the next trigger. Then a reserved AETH syndrome: the QP goes to error (as for a
/// NAK the requester does not know), the next trigger is not answered, and another client
/// is served.
#[test]
fn forged_responses_complete_nothing_and_a_reserved_syndrome_ends_only_that_qp() {
    let s = Setup::start();
    // server-loop: its answer asks for its ACK itself (signaled), so no solicitation
    // resends it before its ACK timeout.
    let (peer, mut sess, first) = triggered_session(&s, 0x42);
    let p = first.psn;
    let forged: Vec<(u8, u32, u8, Vec<u8>)> = vec![
        (opcode::ACKNOWLEDGE, psn::add(p, 1), Syndrome::ACK, vec![]),
        (
            opcode::ACKNOWLEDGE,
            psn::add(p, 1000),
            Syndrome::ACK,
            vec![],
        ),
        (
            opcode::ACKNOWLEDGE,
            psn::add(p, 1 << 23),
            Syndrome::ACK,
            vec![],
        ),
        (
            opcode::ACKNOWLEDGE,
            psn::add(p, psn::MASK),
            Syndrome::ACK,
            vec![],
        ),
        (
            opcode::ACKNOWLEDGE,
            psn::add(p, 0x80_0001),
            Syndrome::ACK,
            vec![],
        ),
        (opcode::ATOMIC_ACKNOWLEDGE, p, Syndrome::ACK, vec![]),
        (opcode::READ_RESPONSE_ONLY, p, Syndrome::ACK, vec![0xee; 8]),
        (
            opcode::READ_RESPONSE_FIRST,
            p,
            Syndrome::ACK,
            vec![0xee; 4096],
        ),
        (opcode::READ_RESPONSE_MIDDLE, p, 0, vec![0xee; 4096]),
        (opcode::READ_RESPONSE_LAST, p, Syndrome::ACK, vec![0xee; 4]),
        // Sequence and RNR NAKs far outside the window.
        (
            opcode::ACKNOWLEDGE,
            psn::add(p, 5000),
            Syndrome::NAK_SEQUENCE,
            vec![],
        ),
        (opcode::ACKNOWLEDGE, psn::add(p, 5000), 0x21, vec![]),
        (
            opcode::ACKNOWLEDGE,
            psn::add(p, 0x80_0000),
            Syndrome::NAK_ACCESS,
            vec![],
        ),
    ];
    for (op, at, syn, payload) in &forged {
        peer.reply(&sess, *op, *at, *syn, payload);
    }
    // The WRITE was not completed: it comes again (ACK timeout, 67 ms).
    let again = peer
        .answer_within(Duration::from_secs(2))
        .expect("the WRITE was not resent: a forged response completed or failed it");
    assert_eq!(again.psn, p, "{again:?}");
    peer.ack(&sess, p);
    // Nothing more of it comes, and the QP serves the next trigger at the next PSN.
    std::thread::sleep(Duration::from_millis(200));
    while let Some((h, _)) = peer.recv(Duration::from_millis(1)) {
        assert!(packet::is_response(h.opcode) || h.psn == p, "{h:?}");
    }
    let second = peer.trigger_answered(&mut sess);
    assert_eq!(second.psn, psn::add(p, 1));
    // A reserved syndrome (AETH type 0b10) at the outstanding PSN.
    peer.reply(&sess, opcode::ACKNOWLEDGE, second.psn, 0x40, &[]);
    std::thread::sleep(Duration::from_millis(100));
    while peer.recv(Duration::from_millis(1)).is_some() {}
    peer.trigger(&mut sess);
    let third = peer.answer_within(Duration::from_millis(500));
    eprintln!("after a reserved syndrome the next trigger got {third:?}");
    assert!(third.is_none(), "the QP still serves: {third:?}");
    let mut good = s.server_loop.door.good_client();
    assert_eq!(good.get(0x2a).unwrap().as_deref(), Some(&b"hello"[..]));
}

/// Send `packets` (opcode, payload) to `s`'s QP from its expected PSN, reliably: in
/// windows of 64, the last asking for an ACK, going back to where a sequence NAK points.
/// The syndrome of the last reply.
fn send_reliably(peer: &Peer, s: &mut Session, packets: &[(u8, Vec<u8>)]) -> u8 {
    let base = s.epsn;
    let mut at = 0usize;
    let mut last = 0u8;
    let mut rnr_naks = 0;
    while at < packets.len() {
        let end = (at + 64).min(packets.len());
        for (i, (op, payload)) in packets.iter().enumerate().take(end).skip(at) {
            let mut h = Header::new(*op, s.server.qpn, psn::add(base, u32::try_from(i).unwrap()));
            h.ack_req = i + 1 == end;
            peer.send(&s.server, &h, payload);
        }
        let reply = loop {
            let Some((h, _)) = peer.recv(Duration::from_secs(2)) else {
                panic!("no reply to packets {at}..{end}")
            };
            if h.opcode == opcode::ACKNOWLEDGE {
                break h;
            }
        };
        let syn = reply.aeth.unwrap().syndrome;
        last = syn;
        match Syndrome::of(syn) {
            Syndrome::Ack if reply.psn == psn::add(base, u32::try_from(end - 1).unwrap()) => {
                at = end
            }
            Syndrome::Ack => {}
            Syndrome::SequenceError => at = usize::try_from(psn::diff(reply.psn, base)).unwrap(),
            // The offload enables its receive a moment after the hello: resend from the
            // packet refused, as a requester does after the RNR timer.
            Syndrome::Rnr(_) if rnr_naks < 1000 => {
                rnr_naks += 1;
                std::thread::sleep(Duration::from_millis(2));
                at = usize::try_from(psn::diff(reply.psn, base)).unwrap();
            }
            _ => return syn,
        }
    }
    s.epsn = psn::add(base, u32::try_from(packets.len()).unwrap());
    last
}

/// Attack 6: a SEND in many packets far longer than any receive the offload posts (its trigger is
/// 14 bytes): SEND_FIRST and 4,095 SEND_MIDDLEs of 4 KiB (16 MiB), never its LAST, on two
/// sessions. IBTA has the responder place a SEND into the receive's buffers as it comes
/// (rxe copies each packet into the receive WQE's SGEs) and NAK it (invalid request, the
/// QP to error) once it overflows them. What must hold: the manager's memory does not grow
/// by what the client sends (it grows by the receive buffers at most).
#[test]
fn a_send_longer_than_the_receive_is_refused_not_buffered() {
    let s = Setup::start();
    let before = rss_kib(&s.m);
    let mut held = Vec::new();
    let mut syndromes = Vec::new();
    for i in 0..2 {
        let peer = Peer::new();
        let mut sess = peer.hello(&s.hash_get.door, 0x50 + i);
        let mut packets = vec![(opcode::SEND_FIRST, vec![0x5a; 4096])];
        packets.extend((0..4095).map(|_| (opcode::SEND_MIDDLE, vec![0x5a; 4096])));
        let syn = send_reliably(&peer, &mut sess, &packets);
        syndromes.push(syn);
        held.push((peer, sess));
    }
    // Let the manager settle (nothing should be freed: the SENDs are still in progress).
    std::thread::sleep(Duration::from_millis(200));
    let after = rss_kib(&s.m);
    eprintln!(
        "two unfinished 16 MiB SENDs: last replies {syndromes:02x?}; the manager's RSS \
         {before} KiB -> {after} KiB (+{} KiB)",
        after.saturating_sub(before)
    );
    // Another client is served meanwhile.
    let mut good = s.hash_get.door.good_client();
    assert_eq!(good.get(0x2a).unwrap().as_deref(), Some(&b"hello"[..]));
    assert!(
        after.saturating_sub(before) < 8 * 1024,
        "the manager holds {} KiB more for two clients' unfinished SENDs to a 14-byte \
         receive (replies {syndromes:02x?})",
        after.saturating_sub(before)
    );
}

/// Packets by opcode and payload, in the order they are sent.
type Packets = Vec<(u8, Vec<u8>)>;

/// Attack 7: opcode sequence and segmentation at the manager's responder: a LAST without a FIRST, a
/// MIDDLE of the wrong length, a FIRST then an ONLY, each on its own session at the
/// expected PSN: an invalid-request NAK (0x61) and that QP in error (the next trigger goes
/// unanswered); a good client served after.
#[test]
fn segmentation_out_of_order_is_an_invalid_request_for_that_qp_only() {
    let s = Setup::start();
    let cases: Vec<(&str, Packets)> = vec![
        ("LAST without FIRST", vec![(opcode::SEND_LAST, vec![1; 14])]),
        (
            "MIDDLE without FIRST",
            vec![(opcode::SEND_MIDDLE, vec![1; 4096])],
        ),
        (
            "FIRST shorter than the MTU",
            vec![(opcode::SEND_FIRST, vec![1; 100])],
        ),
        (
            "MIDDLE shorter than the MTU",
            vec![
                (opcode::SEND_FIRST, vec![1; 4096]),
                (opcode::SEND_MIDDLE, vec![1; 4092]),
            ],
        ),
        (
            "FIRST then ONLY",
            vec![
                (opcode::SEND_FIRST, vec![1; 4096]),
                (opcode::SEND_ONLY, vec![1; 14]),
            ],
        ),
        (
            "SEND FIRST then WRITE LAST",
            vec![
                (opcode::SEND_FIRST, vec![1; 4096]),
                (opcode::WRITE_LAST, vec![1; 14]),
            ],
        ),
        (
            "LAST empty",
            vec![
                (opcode::SEND_FIRST, vec![1; 4096]),
                (opcode::SEND_LAST, vec![]),
            ],
        ),
    ];
    // At a path MTU of 1,024 (ours), a FIRST or MIDDLE longer than it.
    let at_1024: Vec<(&str, Packets)> = vec![
        (
            "FIRST longer than the MTU",
            vec![(opcode::SEND_FIRST, vec![1; 2048])],
        ),
        (
            "MIDDLE longer than the MTU",
            vec![
                (opcode::SEND_FIRST, vec![1; 1024]),
                (opcode::SEND_MIDDLE, vec![1; 1028]),
            ],
        ),
        (
            "ONLY longer than the MTU",
            vec![(opcode::SEND_ONLY, vec![1; 1040])],
        ),
    ];
    let all = cases
        .iter()
        .map(|(w, p)| (w, p, 4096))
        .chain(at_1024.iter().map(|(w, p)| (w, p, 1024)));
    for (i, (what, packets, mtu)) in all.enumerate() {
        let peer = Peer::new();
        let mut sess = peer.hello_with(
            &s.hash_get.door,
            0x60 + u32::try_from(i).unwrap(),
            START_PSN,
            mtu,
        );
        let syn = send_reliably(&peer, &mut sess, packets);
        assert_eq!(syn, Syndrome::NAK_INVALID, "{what}");
        peer.trigger(&mut sess);
        let a = peer.answer_within(Duration::from_millis(300));
        assert!(a.is_none(), "{what}: the QP still serves: {a:?}");
    }
    let mut good = s.hash_get.door.good_client();
    assert_eq!(good.get(0x2a).unwrap().as_deref(), Some(&b"hello"[..]));
}

/// Attack 8: PSN wrap at 2^24: the client's requests start at 0xff_fffe, so its four triggers run
/// across the wrap; duplicates from before the wrap sent after it are re-ACKed with the
/// newest PSN (never a sequence NAK, never run again), and a PSN half the circle away is
/// taken as old (a duplicate). All four answers come, each once acknowledged.
#[test]
fn psns_wrapping_at_2_24_with_duplicates_are_served_in_order() {
    let s = Setup::start();
    let peer = Peer::new();
    let start = 0xff_fffe;
    let mut sess = peer.hello_with(&s.hash_get.door, 0x42, start, 4096);
    let mut answers = 0;
    for round in 0..4u32 {
        let a = peer.trigger_answered(&mut sess);
        peer.ack(&sess, a.psn);
        answers += 1;
        // Duplicates of every PSN taken so far, the one half the circle away, asking.
        for back in 1..=round + 1 {
            let mut h = Header::new(
                opcode::SEND_ONLY,
                sess.server.qpn,
                psn::add(sess.epsn, psn::MASK + 1 - back),
            );
            h.ack_req = true;
            peer.send(&sess.server, &h, &[0; 14]);
        }
        let mut h = Header::new(
            opcode::SEND_ONLY,
            sess.server.qpn,
            psn::add(sess.epsn, 1 << 23),
        );
        h.ack_req = true;
        peer.send(&sess.server, &h, &[0; 14]);
        // Every reply is an ACK of the newest PSN taken (coalesced), none a NAK; no
        // answer comes again.
        let newest = psn::add(sess.epsn, psn::MASK);
        let end = Instant::now() + Duration::from_millis(150);
        let mut acks = 0;
        while let Some((h, _)) = peer.recv(end.saturating_duration_since(Instant::now())) {
            if h.opcode == opcode::ACKNOWLEDGE {
                let syn = h.aeth.unwrap().syndrome;
                assert_eq!(syn & 0xe0, 0, "round {round}: a NAK {h:?}");
                assert!(psn::diff(h.psn, newest) <= 0, "round {round}: {h:?}");
                acks += 1;
            } else {
                // A solicitation of the (unsignaled) answer may still come; nothing new.
                assert!(
                    packet::is_response(h.opcode) || h.psn == a.psn,
                    "round {round}: ran again: {h:?}"
                );
            }
        }
        assert!(acks >= 1, "round {round}: duplicates not re-ACKed");
    }
    assert_eq!(answers, 4);
    assert_eq!(sess.epsn, psn::add(start, 4));
}
