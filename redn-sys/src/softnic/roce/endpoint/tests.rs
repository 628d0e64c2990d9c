//! The endpoint against scripted sockets: what a PU sends, holds and takes, datagram by datagram.

use super::*;
use crate::mem::SharedBuffer;
use crate::nic::{CqConfig, Nic, QpConfig};
use crate::softnic::idle::Found;
use crate::softnic::roce::io::RecvBatch;
use crate::softnic::roce::packet::{self, decode, opcode, Aeth, Header, Reth, Route, Syndrome};
use crate::softnic::SoftNicConfig;
use crate::types::{Access, Rkey};
use crate::wqe::RemoteAddr;
use std::collections::VecDeque;
use std::thread::ThreadId;

/// Datagrams handed only to one thread's non-blocking receives (so neither the receive
/// thread nor the PU's own idle polls take them), and every send call recorded.
struct Script {
    local: SocketAddrV4,
    reader: ThreadId,
    inbox: Mutex<VecDeque<(SocketAddrV4, Vec<u8>)>>,
    sent: Mutex<Vec<Vec<Vec<u8>>>>,
}

impl DatagramIo for Arc<Script> {
    fn send(&self, batch: &[(SocketAddrV4, &[u8])]) -> std::io::Result<()> {
        let calls = batch.iter().map(|(_, d)| d.to_vec()).collect();
        self.sent.lock().unwrap().push(calls);
        Ok(())
    }

    fn recv(&self, batch: &mut RecvBatch, wait: Option<Duration>) -> std::io::Result<usize> {
        if wait.is_some() || std::thread::current().id() != self.reader {
            // The receive thread's blocking wait, as a poll that times out.
            std::thread::sleep(wait.unwrap_or_default().min(Duration::from_millis(1)));
            return Ok(0);
        }
        Ok(hand_over(&mut self.inbox.lock().unwrap(), batch))
    }

    fn local_addr(&self) -> SocketAddrV4 {
        self.local
    }
}

/// A softnic on `io` with one QP (start PSN 100, ACK timeout code `timeout`) connected
/// to QP 0x99 at `peer` (its PSNs from 500), and 4 KiB of memory registered.
struct Rig {
    nic: SoftNic,
    ep: RoceEndpoint,
    buf: Arc<SharedBuffer>,
    mr: crate::nic::MrInfo,
    cq: crate::types::Cqn,
    qp: Qpn,
}

impl Rig {
    fn new(io: Box<dyn DatagramIo>, peer: SocketAddrV4, timeout: u8) -> Rig {
        let nic = SoftNic::new(SoftNicConfig::new("endpoint-unit")).unwrap();
        let ep = RoceEndpoint::with_io(&nic, io, Duration::ZERO);
        let pd = nic.alloc_pd().unwrap();
        let buf = SharedBuffer::new(4096);
        let mr = nic.reg_mr(pd, &buf, 0, 4096, Access::ALL).unwrap();
        let cq = nic.create_cq(CqConfig::new(16)).unwrap();
        let qp = nic.create_qp(QpConfig::new(pd, cq)).unwrap().qpn;
        let mut ours = ep.record(qp, 100);
        ours.timeout = timeout;
        ep.connect(&ours, &QpRecord::new(0x99, 500, peer)).unwrap();
        Rig {
            nic,
            ep,
            buf,
            mr,
            cq,
            qp,
        }
    }
}

/// Move every datagram of `inbox` into `batch`; how many.
fn hand_over(inbox: &mut VecDeque<(SocketAddrV4, Vec<u8>)>, batch: &mut RecvBatch) -> usize {
    let mut n = 0;
    while let Some((from, d)) = inbox.pop_front() {
        batch.set(n, &d, from);
        n += 1;
    }
    n
}

#[test]
fn a_pus_replies_ride_on_its_next_send() {
    let local = SocketAddrV4::new(Ipv4Addr::LOCALHOST, 4791);
    let peer = SocketAddrV4::new(Ipv4Addr::LOCALHOST, 4792);
    let script = Arc::new(Script {
        local,
        reader: std::thread::current().id(),
        inbox: Mutex::new(VecDeque::new()),
        sent: Mutex::new(Vec::new()),
    });
    // The softnic stays up for the test (its PUs run the QP).
    let Rig {
        nic,
        ep,
        buf,
        mr,
        qp,
        ..
    } = Rig::new(Box::new(Arc::clone(&script)), peer, 14);

    // A WRITE that asks for an ACK, taken off the socket by a PU's poll.
    let mut h = Header::new(opcode::WRITE_ONLY, qp.0, 500);
    h.ack_req = true;
    h.reth = Some(Reth {
        va: mr.addr.0 + 64,
        rkey: mr.lkey.0,
        len: 8,
    });
    let mut d = Vec::new();
    let route = Route {
        src: peer,
        dst: local,
    };
    packet::encode(&mut d, &route, &h, &[7; 8]);
    script.inbox.lock().unwrap().push_back((peer, d));
    let poller = PuPoller::new(Arc::clone(&ep.inner));
    assert!(!poller.host, "a softnic with PU threads");
    // A WRITE leaves the queues nothing new (a host-driven call returns at once).
    assert_eq!(poller.poll_with(&ep.inner), (1, Found::Placed));
    let mut placed = [0u8; 8];
    buf.read(64, &mut placed);
    assert_eq!(placed, [7; 8], "placed at once");
    assert!(script.sent.lock().unwrap().is_empty(), "the ACK is held");

    // The PU's next send carries it, after its own packet, in one system call.
    poller.send_with_replies(&ep.inner, peer, b"request", &[(0, 7)]);
    let sent = std::mem::take(&mut *script.sent.lock().unwrap());
    assert_eq!(sent.len(), 1, "one call");
    assert_eq!(sent[0].len(), 2);
    assert_eq!(sent[0][0], b"request");
    let back = Route {
        src: local,
        dst: peer,
    };
    let ack = decode(&back, &sent[0][1]).expect("a valid ACK").header;
    assert_eq!(
        (ack.opcode, ack.dest_qp, ack.psn),
        (opcode::ACKNOWLEDGE, 0x99, 500)
    );

    // A reply that no send of the round carries goes at the next poll, with nothing to
    // receive: a READ's response is not kept waiting for a send that may never come.
    let mut h2 = h;
    h2.psn = 501;
    let mut d2 = Vec::new();
    packet::encode(&mut d2, &route, &h2, &[8; 8]);
    script.inbox.lock().unwrap().push_back((peer, d2));
    assert_eq!(poller.poll_with(&ep.inner).0, 1);
    assert!(script.sent.lock().unwrap().is_empty(), "held for the round");
    assert_eq!(poller.poll_with(&ep.inner), (0, Found::Nothing));
    let sent = std::mem::take(&mut *script.sent.lock().unwrap());
    assert_eq!(sent.len(), 1, "sent at the next poll");
    let ack = decode(&back, &sent[0][0]).expect("a valid ACK").header;
    assert_eq!((ack.opcode, ack.psn), (opcode::ACKNOWLEDGE, 501));

    // What other arrivals leave the queues: a WRITE with immediate a receive's
    // completion (or an RNR NAK, with none posted), a response the requester takes and a
    // refused request (its QP in error) are queue work; a datagram dropped is not.
    let mut imm = Header::new(opcode::WRITE_ONLY_IMM, qp.0, 502);
    imm.reth = h.reth;
    imm.imm = Some(9);
    let mut ack = Header::new(opcode::ACKNOWLEDGE, qp.0, 0);
    ack.aeth = Some(Aeth {
        syndrome: 0,
        msn: 0,
    });
    // A WRITE its responder refuses (a wrong key) puts the QP in error: its queues flush.
    let mut refused = Header::new(opcode::WRITE_ONLY, qp.0, 502);
    refused.reth = Some(Reth {
        va: mr.addr.0 + 64,
        rkey: mr.lkey.0 ^ 0xff,
        len: 8,
    });
    for (header, payload, found) in [
        (imm, &[9u8; 8][..], Found::QueueWork),
        (ack, &[][..], Found::QueueWork),
        (refused, &[1u8; 8][..], Found::QueueWork),
    ] {
        let mut d = Vec::new();
        packet::encode(&mut d, &route, &header, payload);
        script.inbox.lock().unwrap().push_back((peer, d));
        assert_eq!(
            poller.poll_with(&ep.inner),
            (1, found),
            "{header:?} {:?}",
            ep.inner.drops.snapshot()
        );
    }
    assert_eq!(nic.qp_state(qp).unwrap(), QpState::Error);
    script.inbox.lock().unwrap().push_back((peer, vec![0; 3]));
    assert_eq!(poller.poll_with(&ep.inner), (1, Found::Placed), "a runt");
    poller.flush(&ep.inner);
    script.sent.lock().unwrap().clear();

    // Nothing held: leaving sends nothing and gives up this poller's presence (the
    // count also has the softnic's own PU while it is awake, so only the flag is
    // checked).
    assert!(poller.present.load(Ordering::Acquire));
    poller.leave(&ep.inner);
    assert!(script.sent.lock().unwrap().is_empty());
    assert!(!poller.present.load(Ordering::Acquire));
}

fn ack(qp: u32, psn: u32, syndrome: u8) -> Header {
    let mut h = Header::new(opcode::ACKNOWLEDGE, qp, psn);
    h.aeth = Some(Aeth { syndrome, msn: 0 });
    h
}

#[test]
fn a_batch_sends_only_the_newest_plain_ack_to_a_qp() {
    let a = SocketAddrV4::new(Ipv4Addr::LOCALHOST, 1000);
    let b = SocketAddrV4::new(Ipv4Addr::LOCALHOST, 2000);
    let mut out = Outbox::default();
    out.push(a, b, &ack(7, 1, Syndrome::ACK), &[]);
    out.push(a, b, &ack(7, 2, Syndrome::ACK), &[]);
    out.push(a, b, &ack(7, 3, Syndrome::ACK), &[]);
    assert_eq!(
        out.frames.len(),
        1,
        "cumulative: the newest covers the others"
    );
    // Another QP's ACK, a NAK or a response between keeps what came before.
    out.push(a, b, &ack(8, 9, Syndrome::ACK), &[]);
    out.push(a, b, &ack(7, 4, Syndrome::NAK_SEQUENCE), &[]);
    out.push(a, b, &ack(7, 5, Syndrome::ACK), &[]);
    let route = Route { src: a, dst: b };
    let psns: Vec<(u32, u32)> = out
        .frames
        .iter()
        .map(|&(_, s, e)| {
            let h = decode(&route, &out.bytes[s..e]).expect("valid").header;
            (h.dest_qp, h.psn)
        })
        .collect();
    assert_eq!(psns, [(7, 3), (8, 9), (7, 4), (7, 5)]);
}

/// The frames `out` holds, as (destination port, QP, PSN, syndrome).
fn held(out: &Outbox, local: SocketAddrV4) -> Vec<(u16, u32, u32, u8)> {
    out.frames
        .iter()
        .map(|&(to, s, e)| {
            let route = Route {
                src: local,
                dst: to,
            };
            let h = decode(&route, &out.bytes[s..e]).expect("valid").header;
            (
                to.port(),
                h.dest_qp,
                h.psn,
                h.aeth.map_or(0, |a| a.syndrome),
            )
        })
        .collect()
}

/// A peer flooding duplicates on two QPs in turn, or SENDs its QP has no receive for, gets
/// one reply a QP a batch, not one a datagram; and a peer whose QP has the number of
/// another peer's QP never has its ACK taken by that one's (the numbers are the peers' own
/// choice, and every remote client's first QP has the same one).
#[test]
fn a_batch_answers_each_peers_qp_once_for_its_acks_and_once_for_its_rnr_naks() {
    let me = SocketAddrV4::new(Ipv4Addr::LOCALHOST, 1000);
    let (victim, attacker) = (
        SocketAddrV4::new(Ipv4Addr::LOCALHOST, 2000),
        SocketAddrV4::new(Ipv4Addr::LOCALHOST, 3000),
    );
    let rnr = 0x20 | 14;
    let mut out = Outbox::default();
    for psn in 0..32 {
        out.push(me, attacker, &ack(0x100, psn, Syndrome::ACK), &[]);
        out.push(me, attacker, &ack(0x101, psn, Syndrome::ACK), &[]);
        out.push(me, attacker, &ack(0x102, 7, rnr), &[]);
        if psn == 3 {
            out.push(me, victim, &ack(0x100, 40, Syndrome::ACK), &[]);
        }
    }
    let ack = Syndrome::ACK;
    assert_eq!(
        held(&out, me),
        [
            (3000, 0x100, 31, ack),
            (3000, 0x101, 31, ack),
            (3000, 0x102, 7, rnr),
            (2000, 0x100, 40, ack),
        ],
        "the newest of each kind a QP, where its first stood; the victim's ACK kept"
    );
    assert!(!out.only_acks, "an RNR NAK is held");
    // Bytes of superseded replies are not kept.
    assert_eq!(
        out.bytes.len(),
        out.frames.iter().map(|&(_, s, e)| e - s).sum()
    );
}

/// Superseding never reorders a QP's replies: a plain ACK or RNR NAK is replaced only while
/// it is the QP's last reply held, so one after a response or another kind of reply to
/// the same QP is held as well (an ACK must not overtake the READ response it follows).
#[test]
fn a_reply_after_another_kind_to_the_same_qp_is_held_after_it() {
    let me = SocketAddrV4::new(Ipv4Addr::LOCALHOST, 1000);
    let to = SocketAddrV4::new(Ipv4Addr::LOCALHOST, 2000);
    let rnr = 0x20 | 14;
    let mut out = Outbox::default();
    out.push(me, to, &ack(7, 1, Syndrome::ACK), &[]);
    let mut read = Header::new(opcode::READ_RESPONSE_ONLY, 7, 2);
    read.aeth = Some(Aeth {
        syndrome: Syndrome::ACK,
        msn: 1,
    });
    out.push(me, to, &read, &[5; 8]);
    out.push(me, to, &ack(7, 3, Syndrome::ACK), &[]);
    out.push(me, to, &ack(7, 4, rnr), &[]);
    out.push(me, to, &ack(7, 5, Syndrome::ACK), &[]);
    let ack = Syndrome::ACK;
    assert_eq!(
        held(&out, me),
        [
            (2000, 7, 1, ack),
            (2000, 7, 2, ack),
            (2000, 7, 3, ack),
            (2000, 7, 4, rnr),
            (2000, 7, 5, ack),
        ]
    );
}

/// Datagrams the test releases to whoever receives (the PU's polls, its waits, the
/// receive thread), and every datagram sent.
struct Held {
    local: SocketAddrV4,
    inbox: Mutex<VecDeque<(SocketAddrV4, Vec<u8>)>>,
    sent: Mutex<Vec<Vec<u8>>>,
}

impl DatagramIo for Arc<Held> {
    fn send(&self, batch: &[(SocketAddrV4, &[u8])]) -> std::io::Result<()> {
        let mut sent = self.sent.lock().unwrap();
        sent.extend(batch.iter().map(|(_, d)| d.to_vec()));
        Ok(())
    }

    fn recv(&self, batch: &mut RecvBatch, wait: Option<Duration>) -> std::io::Result<usize> {
        let mut inbox = self.inbox.lock().unwrap();
        if inbox.is_empty() {
            drop(inbox);
            // The receive thread's blocking wait, as a poll that times out.
            if let Some(w) = wait {
                std::thread::sleep(w.min(Duration::from_millis(1)));
            }
            return Ok(0);
        }
        Ok(hand_over(&mut inbox, batch))
    }

    fn local_addr(&self) -> SocketAddrV4 {
        self.local
    }
}

/// Wait (with a deadline) until `cond`.
fn wait_for(what: &str, mut cond: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while !cond() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::yield_now();
    }
}

/// Through the executor and the transport: signaled WRITEs posted at once all go out
/// before any ACK, complete only when ACKs cover them, in order; a sequence NAK in the
/// middle of the window resends from the PSN it names and no earlier.
#[test]
fn writes_in_flight_complete_in_order_as_their_acks_come() {
    use crate::wqe::{Payload, WorkRequest, WqeFlags, WrOp};
    let local = SocketAddrV4::new(Ipv4Addr::LOCALHOST, 4791);
    let peer = SocketAddrV4::new(Ipv4Addr::LOCALHOST, 4792);
    let io = Arc::new(Held {
        local,
        inbox: Mutex::new(VecDeque::new()),
        sent: Mutex::new(Vec::new()),
    });
    // No ACK timer: only the ACKs and NAKs below move the window.
    let Rig {
        nic,
        ep: _ep,
        buf,
        mr,
        cq,
        qp,
    } = Rig::new(Box::new(Arc::clone(&io)), peer, 0);
    let wrs: Vec<WorkRequest> = (0..4u32)
        .map(|i| WorkRequest {
            wr_id: u64::from(i),
            flags: WqeFlags::SIGNALED,
            op: WrOp::Write {
                remote: RemoteAddr {
                    addr: crate::types::VirtAddr(0x10_0000 + u64::from(i) * 64),
                    rkey: Rkey(7),
                },
                payload: Payload::Sgl(vec![mr.sge(u64::from(i) * 64, 64)]),
                imm: None,
            },
        })
        .collect();
    buf.write(0, &(0..=255).collect::<Vec<u8>>());
    nic.post_send(qp, &wrs).unwrap();

    let out = Route {
        src: local,
        dst: peer,
    };
    let sent_psns = |from: usize| -> Vec<u32> {
        io.sent.lock().unwrap()[from..]
            .iter()
            .map(|d| decode(&out, d).expect("a valid packet").header)
            .filter(|h| h.opcode == opcode::WRITE_ONLY)
            .map(|h| h.psn)
            .collect()
    };
    wait_for("four WRITEs on the wire", || sent_psns(0).len() >= 4);
    assert_eq!(sent_psns(0), [100, 101, 102, 103], "no ACK was needed");
    let payload = decode(&out, &io.sent.lock().unwrap()[2])
        .unwrap()
        .payload
        .to_vec();
    assert_eq!(
        payload,
        (128..192).collect::<Vec<u8>>(),
        "the third WRITE's bytes"
    );
    assert_eq!(nic.cq_produced(cq).unwrap(), 0, "nothing acknowledged yet");

    let back = Route {
        src: peer,
        dst: local,
    };
    let answer = |h: Header| {
        let mut d = Vec::new();
        packet::encode(&mut d, &back, &h, &[]);
        io.inbox.lock().unwrap().push_back((peer, d));
    };
    let mut got = Vec::new();
    let mut take = |n: usize| {
        wait_for("completions", || nic.cq_produced(cq).unwrap() >= n as u64);
        nic.poll_cq(cq, 16, &mut got).unwrap();
        got.iter().map(|c| (c.wr_id, c.is_ok())).collect::<Vec<_>>()
    };
    // One ACK covers the first two.
    answer(ack(qp.0, 101, Syndrome::ACK));
    assert_eq!(take(2), [(0, true), (1, true)]);
    // The responder lost 103: its NAK acknowledges 102 and asks from 103.
    let before = io.sent.lock().unwrap().len();
    answer(ack(qp.0, 103, Syndrome::NAK_SEQUENCE));
    assert_eq!(take(3), [(0, true), (1, true), (2, true)]);
    wait_for("the resend", || !sent_psns(before).is_empty());
    assert_eq!(sent_psns(before), [103], "from the PSN named");
    answer(ack(qp.0, 103, Syndrome::ACK));
    assert_eq!(take(4), [(0, true), (1, true), (2, true), (3, true)]);
    assert_eq!(nic.qp_state(qp).unwrap(), QpState::ReadyToSend);
}

/// Destroying a connected QP lets go of its connection at once: before, the endpoint's map
/// kept it (and through it the destroyed QP, its rings, CQ and responder, ~66 KiB a remote
/// client's session) until a datagram for that QP number came from its peer, which a
/// departed client never sends, so a manager's memory grew with every session ended.
#[test]
fn a_destroyed_qp_leaves_nothing_in_its_endpoint() {
    let local = SocketAddrV4::new(Ipv4Addr::LOCALHOST, 4791);
    let peer = SocketAddrV4::new(Ipv4Addr::LOCALHOST, 4792);
    let script = Arc::new(Script {
        local,
        reader: std::thread::current().id(),
        inbox: Mutex::new(VecDeque::new()),
        sent: Mutex::new(Vec::new()),
    });
    let rig = Rig::new(Box::new(Arc::clone(&script)), peer, 14);
    let conns = |ep: &RoceEndpoint| ep.inner.conns.read().unwrap().len();
    assert_eq!(conns(&rig.ep), 1);
    let target = Arc::downgrade(&rig.nic.shared.qp(rig.qp).unwrap());
    rig.nic.destroy_qp(rig.qp).unwrap();
    assert_eq!(conns(&rig.ep), 0, "the connection is still registered");
    // Nothing else holds the destroyed QP once its PU has let go of its queues.
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while target.strong_count() > 0 {
        assert!(
            std::time::Instant::now() < deadline,
            "the destroyed QP is still held ({} references)",
            target.strong_count()
        );
        std::thread::sleep(Duration::from_millis(1));
    }
}

/// A connect that looked its QP up before another thread destroyed it refuses, and leaves
/// neither a connection nor a peer socket behind (`destroy_qp` took no transport: there
/// was none yet).
#[test]
fn a_connect_racing_the_destroy_of_its_qp_leaves_nothing_behind() {
    let nic = SoftNic::new(SoftNicConfig::new("endpoint-race")).unwrap();
    let ep = RoceEndpoint::start(&nic, &RoceConfig::new(Ipv4Addr::LOCALHOST)).unwrap();
    let pd = nic.alloc_pd().unwrap();
    let cq = nic.create_cq(CqConfig::new(16)).unwrap();
    let qp = nic.create_qp(QpConfig::new(pd, cq)).unwrap().qpn;
    let looked_up = nic.shared.qp(qp).unwrap();
    // A whole `destroy_qp` lands after the connect checked the QP's state and before it
    // takes the QP's peer lock: the QP is marked destroyed and its (empty) peer was taken.
    // Modelled on the QP the connect holds, whose state it has already checked.
    looked_up.destroyed.store(true, Ordering::Release);
    let peer = SocketAddrV4::new(Ipv4Addr::LOCALHOST, 4799);
    let got = ep.connect_qp(looked_up, &ep.record(qp, 1), &QpRecord::new(0x99, 1, peer));
    assert!(matches!(got, Err(Error::NoSuchQp(q)) if q == qp), "{got:?}");
    assert_eq!(
        ep.inner.conns.read().unwrap().len(),
        0,
        "a connection was left"
    );
}

/// Datagrams any thread's receive takes (the receive thread's waits as short sleeps).
struct Open {
    local: SocketAddrV4,
    inbox: Mutex<VecDeque<(SocketAddrV4, Vec<u8>)>>,
}

impl DatagramIo for Arc<Open> {
    fn send(&self, _: &[(SocketAddrV4, &[u8])]) -> std::io::Result<()> {
        Ok(())
    }

    fn recv(&self, batch: &mut RecvBatch, wait: Option<Duration>) -> std::io::Result<usize> {
        let n = hand_over(&mut self.inbox.lock().unwrap(), batch);
        if n == 0 {
            std::thread::sleep(wait.unwrap_or_default().min(Duration::from_millis(1)));
        }
        Ok(n)
    }

    fn local_addr(&self) -> SocketAddrV4 {
        self.local
    }
}

#[test]
fn a_present_pu_that_does_not_poll_does_not_keep_the_socket_from_the_receive_thread() {
    // A PU counts as present at the socket from its first poll until it parks, and the
    // receive thread stands down meanwhile. A PU off the CPU on a busy machine polls
    // nothing for as long: the receive thread must take what arrives within a nap or two,
    // not leave it for the sender's retransmission timer (docs/attacks.md, the 67 ms stall).
    let local = SocketAddrV4::new(Ipv4Addr::LOCALHOST, 4791);
    let peer = SocketAddrV4::new(Ipv4Addr::LOCALHOST, 4792);
    let io = Arc::new(Open {
        local,
        inbox: Mutex::new(VecDeque::new()),
    });
    let rig = Rig::new(Box::new(Arc::clone(&io)), peer, 14);
    // The rig's own PU, idle, has polled and left the socket to park (and polls no more).
    wait_for("the PU to poll and leave the socket", || {
        let pollers = rig.ep.inner.pu_pollers.lock().unwrap();
        !pollers.is_empty()
            && pollers
                .values()
                .all(|p| p.polls.load(Ordering::Relaxed) > 0 && !p.present.load(Ordering::Acquire))
    });
    // As a present PU that stopped running: counted, never polling.
    rig.ep.inner.pollers.fetch_add(1, Ordering::AcqRel);
    let before = rig.ep.inner.by_receive_thread.load(Ordering::Relaxed);
    // An ACK for a QP nobody has (dropped, but taken and counted).
    let mut d = Vec::new();
    let route = Route {
        src: peer,
        dst: local,
    };
    packet::encode(&mut d, &route, &ack(0x4242, 1, 0), &[]);
    io.inbox.lock().unwrap().push_back((peer, d));
    wait_for("the receive thread to take the datagram", || {
        rig.ep.inner.by_receive_thread.load(Ordering::Relaxed) > before
    });
    rig.ep.inner.pollers.fetch_sub(1, Ordering::AcqRel);
}
