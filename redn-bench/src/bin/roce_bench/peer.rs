//! The peer process (`--peer`): the raw UDP echoes and sinks, and the softnic that answers
//! this side's rows, by host or by an offload posted before the row.

use super::client::Side;
use super::raw::udp_socket;
use super::{Control, ECHO_AT, MTU};
use redn_program::wqe::{Payload, WorkRequest, WqeFlags, WrOp};
use redn_sys::nic::{CqConfig, MrInfo, Nic, QpConfig};
use redn_sys::softnic::roce::io::{DatagramIo, RecvBatch, UdpIo};
use redn_sys::softnic::roce::{read_record, write_record, QpRecord, RegionRecord, RoceEndpoint};
use redn_sys::softnic::SoftNic;
use redn_sys::{Pdn, Rkey, VirtAddr};
use std::io::{BufReader, Write};
use std::net::{Ipv4Addr, SocketAddrV4, TcpListener};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// The peer: serve the control connection's commands until "done".
pub(crate) fn serve(spin: Duration) {
    let l = TcpListener::bind("127.0.0.1:0").expect("bind control");
    println!("PORT {}", l.local_addr().expect("addr").port());
    std::io::stdout().flush().expect("stdout");
    let (s, _) = l.accept().expect("accept");
    let mut c = Control {
        reader: BufReader::new(s.try_clone().expect("clone")),
        writer: s,
    };
    let mut softnic: Option<Server> = None;
    loop {
        let cmd = c.hear();
        match cmd.as_str() {
            "echo spin" | "echo block" => {
                let (u, a) = udp_socket();
                u.set_nonblocking(cmd == "echo spin").expect("mode");
                c.say(&format!("port {}", a.port()));
                let mut buf = [0u8; 2048];
                loop {
                    match u.recv_from(&mut buf) {
                        Ok((1, _)) => break,
                        Ok((n, from)) => {
                            u.send_to(&buf[..n], from).expect("echo");
                        }
                        Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                            std::hint::spin_loop()
                        }
                        Err(e) => panic!("echo recv: {e}"),
                    }
                }
                c.say("ok");
            }
            "sink" => {
                let io = UdpIo::bind(SocketAddrV4::new(Ipv4Addr::LOCALHOST, 0)).expect("bind");
                c.say(&format!("port {}", io.local_addr().port()));
                let mut batch = RecvBatch::default();
                let (mut bytes, mut first, mut last) = (0usize, None, Instant::now());
                'outer: loop {
                    let n = io
                        .recv(&mut batch, Some(Duration::from_millis(200)))
                        .expect("recv");
                    if n == 0 && first.is_some() {
                        break; // the end marker was lost
                    }
                    for i in 0..n {
                        let (d, _) = batch.get(i);
                        if d.len() == 1 {
                            break 'outer;
                        }
                        first.get_or_insert_with(Instant::now);
                        last = Instant::now();
                        bytes += d.len();
                    }
                }
                let secs = first.map_or(1.0, |f: Instant| (last - f).as_secs_f64().max(1e-9));
                c.say(&format!("bytes {bytes}"));
                c.say(&format!("secs {secs}"));
            }
            "softnic" => softnic = Some(serve_softnic(&mut c, spin)),
            "counters" => {
                let k = softnic
                    .as_ref()
                    .map(|s| s.ep.counters())
                    .unwrap_or_default();
                c.say(&format!("{} {}", k.received, k.by_receive_thread));
            }
            cmd if cmd.starts_with("offload ") => {
                let rounds: usize = cmd["offload ".len()..].parse().expect("rounds");
                let s = softnic.as_ref().expect("the softnic comes first");
                serve_offload(&mut c, s, rounds);
            }
            _ => break,
        }
    }
    if let Some(Server { answers, stop, .. }) = softnic {
        stop.store(true, std::sync::atomic::Ordering::Release);
        let _ = answers.join();
    }
}

/// The peer's softnic: memory for the client's operations, receives for its SENDs and
/// WRITE_IMMs, and a host thread that answers each WRITE_IMM with a WRITE of 64 B whose
/// first word is the immediate.
/// The peer's softnic, kept alive until the end, and its answering thread.
struct Server {
    nic: Arc<SoftNic>,
    ep: RoceEndpoint,
    pd: Pdn,
    mr: MrInfo,
    answers: std::thread::JoinHandle<()>,
    stop: Arc<std::sync::atomic::AtomicBool>,
    /// The answering thread sleeps while this is set (the offload rows: it has no work,
    /// and its polls would take turns on the cores from the threads that have).
    paused: Arc<std::sync::atomic::AtomicBool>,
}

/// The offload row's server side: a QP whose send queue holds, for each of `rounds`
/// requests, a WAIT on its receive CQ for that request's completion and a WRITE of the 64 B
/// the request wrote back to the client; all posted before the client starts, so no host
/// post runs during the row (reported back as a count of host posts).
fn serve_offload(c: &mut Control, s: &Server, rounds: usize) {
    let nic = &s.nic;
    // No host on the path, and none taking turns on the cores with it.
    s.paused.store(true, std::sync::atomic::Ordering::Release);
    // Only the chain's WAITs count these (its WRITEs are unsignaled; nobody polls): counted
    // CQs, as RedN's chains use, whose entries carry no completion timestamp (a clock read
    // a receive, which a ConnectX's hardware clock does not cost).
    let send_cq = nic.create_cq(CqConfig::counted(1 << 16)).expect("cq");
    let recv_cq = nic.create_cq(CqConfig::counted(1 << 16)).expect("cq");
    let slots = u32::try_from(rounds.next_power_of_two().max(64)).expect("rounds");
    let mut qc = QpConfig::new(s.pd, send_cq);
    qc.recv_cq = recv_cq;
    qc.rq_slots = slots;
    // A WAIT and a 1-entry WRITE are one 64 B block each.
    qc.sq_bbs = 2 * slots;
    let qp = nic.create_qp(qc).expect("offload qp").qpn;
    let theirs: QpRecord = read_record(&mut c.reader).expect("client record");
    let mut ours = s.ep.record(qp, 0x7000);
    ours.mtu = MTU;
    ours.regions.push(RegionRecord {
        name: "echo".into(),
        addr: s.mr.addr.0 + ECHO_AT,
        rkey: s.mr.lkey.0,
        len: 64,
        rights: 2,
    });
    s.ep.connect(&ours, &theirs).expect("connect");
    let pong = theirs.region("pong").expect("pong region").clone();
    let mut chain = Vec::with_capacity(2 * rounds);
    for i in 0..rounds {
        nic.post_recv(qp, i as u64, &[]).expect("recv");
        chain.push(WorkRequest {
            wr_id: 0,
            flags: WqeFlags::NONE,
            op: WrOp::Wait {
                cq: recv_cq,
                count: u32::try_from(i).expect("rounds"),
            },
        });
        chain.push(WorkRequest {
            wr_id: i as u64,
            flags: WqeFlags::NONE,
            op: WrOp::Write {
                remote: redn_program::wqe::RemoteAddr {
                    addr: VirtAddr(pong.addr),
                    rkey: Rkey(pong.rkey),
                },
                payload: Payload::Sgl(vec![s.mr.sge(ECHO_AT, 64)]),
                imm: None,
            },
        });
    }
    for part in chain.chunks(256) {
        nic.post_send(qp, part).expect("post the chain");
    }
    let before = nic.counters(qp).expect("counters").host_posts;
    write_record(&mut c.writer, &ours).expect("record");
    // This thread sleeps in the control read until the client has had every answer.
    assert_eq!(c.hear(), "offload done");
    s.paused.store(false, std::sync::atomic::Ordering::Release);
    s.answers.thread().unpark();
    let posts = nic.counters(qp).expect("counters").host_posts - before;
    // Gone before the next block's: a parked queue left behind would add its visit to
    // every later block's PU rounds.
    nic.destroy_qp(qp).expect("destroy the offload qp");
    for cq in [send_cq, recv_cq] {
        nic.destroy_cq(cq).expect("destroy an offload cq");
    }
    c.say(&format!("host_posts {posts}"));
}

fn serve_softnic(c: &mut Control, spin: Duration) -> Server {
    let Side {
        nic,
        ep,
        pd,
        buf,
        mr,
        cq,
        qp,
    } = Side::new("server", spin, false);
    for i in 0..1024u64 {
        nic.post_recv(qp, i, &[mr.sge(4 << 20, 4096)])
            .expect("recv");
    }
    let theirs: QpRecord = read_record(&mut c.reader).expect("client record");
    let mut ours = ep.record(qp, 0xfff000);
    ours.mtu = MTU;
    ours.regions.push(RegionRecord {
        name: "mem".into(),
        addr: mr.addr.0,
        rkey: mr.lkey.0,
        len: 4 << 20,
        rights: 7,
    });
    ep.connect(&ours, &theirs).expect("connect");
    write_record(&mut c.writer, &ours).expect("record");
    let pong = theirs.region("pong").expect("pong region").clone();
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let stop2 = Arc::clone(&stop);
    let paused = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let paused2 = Arc::clone(&paused);
    let nic2 = Arc::clone(&nic);
    let answer_mr = mr.clone();
    let t = std::thread::spawn(move || {
        let mr = answer_mr;
        let mut out = Vec::new();
        let mut answered = 0u64;
        let mut last_work = Instant::now();
        while !stop2.load(std::sync::atomic::Ordering::Acquire) {
            if paused2.load(std::sync::atomic::Ordering::Acquire) {
                std::thread::park_timeout(Duration::from_millis(50));
                continue;
            }
            out.clear();
            nic2.poll_cq(cq, 64, &mut out).expect("poll");
            for comp in &out {
                if comp.opcode == redn_program::wqe::CqeOpcode::Req || !comp.is_ok() {
                    continue;
                }
                nic2.post_recv(qp, comp.wr_id, &[mr.sge(4 << 20, 4096)])
                    .expect("recv");
                if let Some(imm) = comp
                    .imm
                    .filter(|_| comp.opcode == redn_program::wqe::CqeOpcode::RespWriteImm)
                {
                    answered += 1;
                    let at = 6 << 20;
                    buf.store_u64(at, u64::from(imm));
                    let op = WrOp::Write {
                        remote: redn_program::wqe::RemoteAddr {
                            addr: VirtAddr(pong.addr),
                            rkey: Rkey(pong.rkey),
                        },
                        payload: Payload::Sgl(vec![mr.sge(at as u64, 64)]),
                        imm: None,
                    };
                    let flags = if answered % 256 == 0 {
                        WqeFlags::SIGNALED
                    } else {
                        WqeFlags::NONE
                    };
                    nic2.post_send(
                        qp,
                        &[WorkRequest {
                            wr_id: answered,
                            flags,
                            op,
                        }],
                    )
                    .expect("answer");
                }
            }
            if !out.is_empty() {
                last_work = Instant::now();
            } else if last_work.elapsed() < Duration::from_micros(200) {
                // Two cores carry both processes' PUs and hosts: give them the CPU.
                std::thread::yield_now();
            } else {
                // Idle (other rows run): out of the way of the threads that have work.
                std::thread::sleep(Duration::from_micros(500));
            }
        }
    });
    Server {
        nic,
        ep,
        pd,
        mr,
        answers: t,
        stop,
        paused,
    }
}
