//! manager_bench: the manager's control plane over its varlink socket: a call's round trip,
//! InstallOffload's latency, and the memory an idle connection costs; and its data plane: a
//! remote client's GET served over RoCEv2, and the hello that gives a client its instance.
//!
//! The manager's event loop runs on a thread of this process (the same loop the daemon
//! runs, on the softnic), clients on the main thread over a real unix socket. Beside the
//! round trip, in the same run: a plain unix-socket echo of the same size (the floor any
//! request/reply over a socket pays), and a UDP loopback echo of a GET's size (the floor a
//! GET over RoCEv2 on this host pays).

use redn_bench::opts::{parse_in, read_command_line};
use redn_bench::report::verdict;
use redn_bench::stats::{ns, stats};
use redn_client::kv::TwoChoiceTable;
use redn_client::remote::{RemoteClient, RemoteOptions};
use redn_client::Client;
use redn_manager::dataplane::Dataplane;
use redn_manager::server::{Server, SocketKind};
use redn_manager::state::{Limits, Manager};
use redn_proto::api;
use redn_proto::client::Connection;
use std::io::{Read, Write};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

const USAGE: &str = "\
manager_bench: the manager's varlink control plane (round trip, install, idle connections)
and its data plane (a remote client's GET, a hello)

USAGE:
    cargo run --release -p redn-bench --bin manager_bench -- [--quick] [--runs N] [--idle N]

OPTIONS:
    --quick     fewer runs (500 round trips and GETs, 50 installs and hellos)
    --runs N    round trips and remote GETs per row (installs and hellos: N / 10, at
                least 10); default 5000, 10..=1000000
    --idle N    idle connections for the memory row (default 1000; 1..=4000)
    -h, --help  this text

Goal (issue 20): InstallOffload of a catalog offload at most 1 ms at p50.
";

/// What `start_manager` hands back: the stop flag, the loop's thread, the two socket paths
/// and the data plane's address.
type Started = (
    Arc<AtomicBool>,
    std::thread::JoinHandle<()>,
    PathBuf,
    PathBuf,
    std::net::SocketAddr,
);

fn start_manager(dir: &Path) -> Started {
    let api = dir.join("manager.sock");
    let admin = dir.join("admin.sock");
    let listeners = vec![
        (UnixListener::bind(&api).expect("bind api"), SocketKind::Api),
        (
            UnixListener::bind(&admin).expect("bind admin"),
            SocketKind::Admin,
        ),
    ];
    let stop = Arc::new(AtomicBool::new(false));
    let stop2 = Arc::clone(&stop);
    let uid = nix::unistd::getuid().as_raw();
    let (dataplane_tx, dataplane_rx) = std::sync::mpsc::channel();
    let handle = std::thread::spawn(move || {
        let policy = redn_policy::parse_policy(
            &format!(
                "[[app]]\nname = \"bench\"\nuid = {uid}\noffloads = [\"hash-get\", \"echo\", \"server-loop\"]\n\
                 max_regions = 8\nmax_pinned = \"64M\"\nmax_queues = 64\nmax_remote_clients = 4\n\
                 [app.client]\nrate_limit_kbps = \"infinity\"\nwqes_per_second = \"infinity\"\n\
                 wqes_per_invocation = 64\non_violation = \"terminate\"\n"
            ),
            "policy.toml",
        )
        .expect("policy");
        let offloads = redn_policy::shipped_offloads()
            .expect("catalog")
            .into_iter()
            .map(|s| s.program)
            .collect();
        let softnic = Arc::new(redn_sys::softnic::SoftNic::with_pus(1).expect("softnic"));
        let nic = Arc::clone(&softnic);
        let limits = Limits {
            requests_per_second: u32::MAX,
            max_connections_per_uid: 8192,
            max_connections: 8192,
            ..Limits::default()
        };
        let m = Manager::new(
            "policy.toml".into(),
            policy,
            offloads,
            nic,
            "softnic".into(),
            limits,
        );
        // Audit records to a socket nobody listens on, not copied to stderr: counted as
        // dropped.
        let audit_config = redn_policy::parse_manager_config(
            "[backend]\nkind = \"softnic\"\n[audit]\nsocket = \"/nonexistent/redn-bench-log\"\n",
            "bench.toml",
        )
        .expect("config")
        .audit;
        let audit = redn_manager::audit::Audit::new(audit_config).quiet();
        let mut server = Server::new(m, listeners, None, audit).expect("server");
        let dp = Dataplane::bind("127.0.0.1:0".parse().expect("addr"), softnic).expect("dataplane");
        dataplane_tx.send(dp.local_addr()).expect("send");
        server.set_dataplane(dp).expect("dataplane");
        while !stop2.load(Ordering::Relaxed) {
            server.turn(Some(Duration::from_millis(20))).expect("poll");
        }
    });
    let dataplane = dataplane_rx.recv().expect("the data plane's address");
    (stop, handle, api, admin, dataplane)
}

fn rss_kib() -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("VmRSS:"))
                .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        })
        .unwrap_or(0)
}

fn main() {
    // `--runs` wins over `--quick`'s count wherever it stands on the command line.
    let mut runs = None;
    let mut quick = false;
    let mut idle = 1000usize;
    let whole = |n: u64| usize::try_from(n).map_err(|e| e.to_string());
    read_command_line("manager_bench", USAGE, &mut |name, value| {
        match name {
            "--quick" => quick = true,
            "--runs" => runs = Some(whole(parse_in("--runs", value(), 10..=1_000_000)?)?),
            "--idle" => idle = whole(parse_in("--idle", value(), 1..=4000)?)?,
            _ => return Ok(false),
        }
        Ok(true)
    });
    run(runs.unwrap_or(if quick { 500 } else { 5000 }), idle);
}

fn run(runs: usize, idle: usize) {
    let dir = std::env::temp_dir().join(format!("redn-manager-bench-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("temp dir");
    let (stop, thread, api_path, _admin, dataplane) = start_manager(&dir);
    println!("manager_bench: one event loop thread, softnic with 1 PU; times in µs");
    println!("{:<44} {:>10} {:>10}", "", "p50", "p99");

    // Native floor: a 48-byte request and reply over a unix socket pair, echoed by a thread.
    let (mut a, mut b) = UnixStream::pair().expect("pair");
    let echo = std::thread::spawn(move || {
        let mut buf = [0u8; 48];
        while b.read_exact(&mut buf).is_ok() {
            if b.write_all(&buf).is_err() {
                break;
            }
        }
    });
    let mut v = Vec::with_capacity(runs);
    let mut buf = [0u8; 48];
    for _ in 0..runs {
        let t = Instant::now();
        a.write_all(&buf).expect("write");
        a.read_exact(&mut buf).expect("read");
        v.push(ns(t.elapsed()) / 1000.0);
    }
    drop(a);
    let _ = echo.join();
    let s = stats(&v);
    println!(
        "{:<44} {:>10.1} {:>10.1}",
        "native: unix socket echo, 48 B", s.median, s.p99
    );

    let mut conn = Connection::connect(&api_path, Duration::from_secs(30)).expect("connect");
    for (label, method) in [
        (
            "org.varlink.service.GetInfo round trip",
            "org.varlink.service.GetInfo",
        ),
        (
            "io.redn.Manager.GetInfo round trip",
            "io.redn.Manager.GetInfo",
        ),
    ] {
        let mut v = Vec::with_capacity(runs);
        for _ in 0..runs {
            let t = Instant::now();
            let r: Any = conn.call(method, &(), &[]).expect("call");
            std::hint::black_box(r);
            v.push(ns(t.elapsed()) / 1000.0);
        }
        let s = stats(&v);
        println!("{label:<44} {:>10.1} {:>10.1}", s.median, s.p99);
    }

    let mut client = Client::connect(&api_path).expect("client");
    let mut table = TwoChoiceTable::create(1024).expect("table");
    let (r, first) = client
        .install_table("hash-get", &mut table)
        .expect("install");
    client.uninstall(first.handle).expect("uninstall");
    let bindings = table.bindings(r.region);
    let installs = (runs / 10).max(10);
    let mut v = Vec::with_capacity(installs);
    for _ in 0..installs {
        let t = Instant::now();
        let i: api::Installed = client.install("hash-get", &bindings).expect("install");
        v.push(ns(t.elapsed()) / 1000.0);
        client.uninstall(i.handle).expect("uninstall");
    }
    let s = stats(&v);
    println!(
        "{:<44} {:>10.1} {:>10.1}  goal p50 <= 1000: {}",
        "InstallOffload hash-get (policy+verify+NIC)",
        s.median,
        s.p99,
        verdict(s.median <= 1000.0)
    );

    let before = rss_kib();
    let mut conns = Vec::with_capacity(idle);
    for _ in 0..idle {
        let mut c = Connection::connect(&api_path, Duration::from_secs(30)).expect("idle connect");
        // One call, so the manager has accepted and identified it.
        let _: Any = c
            .call("org.varlink.service.GetInfo", &(), &[])
            .expect("call");
        conns.push(c);
    }
    let after = rss_kib();
    println!(
        "memory per idle connection at {idle}: {:.1} KiB of process RSS (manager and client \
         halves; kernel socket buffers not included)",
        kib_per(after.saturating_sub(before), idle)
    );
    drop(conns);

    remote_rows(&mut client, dataplane, runs);
    stop.store(true, Ordering::Relaxed);
    let _ = thread.join();
    let _ = std::fs::remove_dir_all(&dir);
}

/// A remote client's GETs: the floor (a UDP echo on loopback), a GET served by the
/// recycled `server-loop` (one instance serves every GET), and the hello that installs and
/// connects a client's instance (`hash-get`, bounded to 4 triggers an instance).
fn remote_rows(client: &mut Client, dataplane: std::net::SocketAddr, runs: usize) {
    let sock = std::net::UdpSocket::bind("127.0.0.1:0").expect("udp");
    let peer = std::net::UdpSocket::bind("127.0.0.1:0").expect("udp");
    let to = peer.local_addr().expect("addr");
    sock.connect(to).expect("connect");
    peer.connect(sock.local_addr().expect("addr"))
        .expect("connect");
    let echo = std::thread::spawn(move || {
        let mut buf = [0u8; 64];
        while let Ok(n) = peer.recv(&mut buf) {
            if n == 0 || peer.send(&buf[..n]).is_err() {
                break;
            }
        }
    });
    let mut v = Vec::with_capacity(runs);
    let mut buf = [0u8; 64];
    for _ in 0..runs {
        let t = Instant::now();
        sock.send(&buf[..14]).expect("send");
        sock.recv(&mut buf).expect("recv");
        v.push(ns(t.elapsed()) / 1000.0);
    }
    sock.send(&[]).expect("stop the echo");
    let _ = echo.join();
    let s = stats(&v);
    println!(
        "{:<44} {:>10.1} {:>10.1}",
        "native: UDP loopback echo, 14 B", s.median, s.p99
    );

    let options = RemoteOptions {
        timeout: Duration::from_secs(10),
        ..Default::default()
    };
    let mut table = TwoChoiceTable::create(1024).expect("table");
    let (_, looped) = client
        .install_table("server-loop", &mut table)
        .expect("install server-loop");
    table
        .set(0x2a, b"a value of 32 bytes, as a bench")
        .expect("set");
    let mut remote =
        RemoteClient::connect(dataplane, looped.handle, &looped.token, options).expect("hello");
    let mut v = Vec::with_capacity(runs);
    for _ in 0..runs {
        let t = Instant::now();
        let got = remote.get(0x2a).expect("get");
        v.push(ns(t.elapsed()) / 1000.0);
        assert!(got.is_some(), "the GET missed");
    }
    // Both are far below 2^52: exact as f64.
    #[allow(clippy::cast_precision_loss)]
    let per_get = remote.triggers_sent() as f64 / runs as f64;
    drop(remote);
    let s = stats(&v);
    println!(
        "{:<44} {:>10.1} {:>10.1}  ({per_get:.1} triggers a GET)",
        "remote GET hit, server-loop over RoCEv2", s.median, s.p99
    );

    let (_, bounded) = client
        .install_table("hash-get", &mut table)
        .expect("install hash-get");
    let mut remote =
        RemoteClient::connect(dataplane, bounded.handle, &bounded.token, options).expect("hello");
    let hellos = (runs / 10).max(10);
    let mut v = Vec::with_capacity(hellos);
    for _ in 0..hellos {
        let t = Instant::now();
        remote.reconnect().expect("hello");
        v.push(ns(t.elapsed()) / 1000.0);
    }
    let s = stats(&v);
    println!(
        "{:<44} {:>10.1} {:>10.1}",
        "remote hello: a new instance of hash-get", s.median, s.p99
    );
}

/// Any reply, kept opaque.
type Any = redn_proto::api::Empty;

/// `kib / n`, for a table.
fn kib_per(kib: u64, n: usize) -> f64 {
    // Both are far below 2^52: exact as f64.
    #[allow(clippy::cast_precision_loss)]
    let per = kib as f64 / n as f64;
    per
}
