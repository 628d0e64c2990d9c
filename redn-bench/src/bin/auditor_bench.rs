//! auditor_bench: how fast the manager's auditor stops a runaway recycled loop, and what
//! auditing costs while offloads run.
//!
//! In process, on the softnic (2 PUs), with the manager's state and its auditor driven the
//! way the event loop drives them (a round every interval). Rows:
//! - **budget broken → terminated**: a runaway server-loop (24 WQEs a round against a budget
//!   of 16 per trigger) is fed triggers; from the moment its counters break the budget (as
//!   an observer polling them between rounds sees it) until the auditor has moved its queues
//!   to error and freed it. The sampling interval bounds the detection part. Also from its
//!   first trigger (the loop needs three rounds to break its budget).
//! - **terminating round**: the auditor round that found and terminated it (detection plus
//!   teardown, the manager's own work).
//! - **auditor CPU share**: the time audit rounds take over wall time, while N well-behaved
//!   server-loops serve triggers; next to the same run's native floor, a round that only
//!   reads the NIC's counters of every queue (what any sampling must pay).
//! - **a well-behaved neighbour**: one GET's latency through a server-loop (trigger posted
//!   to the round's WQEs run), with an idle neighbour and with a neighbour flooding its own
//!   server-loop, which the auditor throttles to its budget.

use redn_bench::opts::{parse_in, read_command_line};
use redn_bench::report::verdict;
use redn_bench::stats::{ns, stats};
use redn_client::SealedRegion;
use redn_manager::auditor::Auditor;
use redn_manager::state::{server_loop_over, Manager};
use redn_policy::PeerIdentity;
use redn_proto::api;
use redn_sys::clock::SystemClock;
use std::os::fd::AsFd;
use std::sync::Arc;
use std::time::{Duration, Instant};

const USAGE: &str = "\
auditor_bench: the auditor's detection-to-termination latency and CPU share

USAGE:
    cargo run --release -p redn-bench --bin auditor_bench -- [--quick] [--runs N] [--offloads N]

OPTIONS:
    --quick        fewer runs (50 terminations and GETs, 1 s of load instead of 3 s)
    --runs N       runaway loops to terminate, and GETs per row of the neighbour rows
                   (default 200; 10..=10000)
    --offloads N   well-behaved offloads under load for the CPU row (default 16; 1..=64)
    -h, --help     this text

Goals (issue 21): onset to termination <= 10 ms at p99; the auditor's CPU share <= 1 %;
a well-behaved client's p99 with a flooding neighbour within 2x its idle p99.
";

fn manager(wqes_per_invocation: u32) -> (Manager, u64) {
    let uid = nix::unistd::getuid().as_raw();
    let policy = redn_policy::parse_policy(
        &format!(
            "[[app]]\nname = \"bench\"\nuid = {uid}\noffloads = [\"server-loop\"]\n\
             max_regions = 64\nmax_pinned = \"1G\"\nmax_queues = 1024\nmax_remote_clients = 4\n\
             [app.client]\nrate_limit_kbps = \"infinity\"\nwqes_per_second = \"infinity\"\n\
             wqes_per_invocation = {wqes_per_invocation}\non_violation = \"terminate\"\n"
        ),
        "policy.toml",
    )
    .expect("policy");
    let nic = Arc::new(redn_sys::softnic::SoftNic::with_pus(2).expect("softnic"));
    let mut m = Manager::with_catalog(policy, nic, "softnic").expect("catalog");
    let client = m.connect(identity(uid));
    (m, client)
}

/// This process as an app of uid `uid`.
fn identity(uid: u32) -> PeerIdentity {
    PeerIdentity {
        uid,
        gid: 0,
        pid: std::process::id(),
        exe: "/bench".into(),
        cgroup: "/".into(),
        start_time: 0,
    }
}

/// A region for the tables (the manager keeps its own mapping).
fn region(m: &mut Manager, client: u64) -> api::RegionRegistered {
    let region = SealedRegion::create("table", 1 << 16).expect("region");
    let fd = region.fd().as_fd().try_clone_to_owned().expect("dup");
    m.register_region(client, fd).expect("register")
}

/// Install server-loop over region `r`: its handle and a trigger for bucket 0.
fn install(m: &mut Manager, client: u64, r: &api::RegionRegistered) -> (u64, Vec<u8>) {
    let (request, trigger) = server_loop_over(r);
    (m.install(client, request).expect("install").handle, trigger)
}

fn main() {
    // `--runs` wins over `--quick`'s count wherever it stands on the command line.
    let mut runs = None;
    let mut quick = false;
    let mut n_offloads = 16usize;
    let whole = |n: u64| usize::try_from(n).map_err(|e| e.to_string());
    read_command_line("auditor_bench", USAGE, &mut |name, value| {
        match name {
            "--quick" => quick = true,
            "--runs" => runs = Some(whole(parse_in("--runs", value(), 10..=10_000)?)?),
            "--offloads" => n_offloads = whole(parse_in("--offloads", value(), 1..=64)?)?,
            _ => return Ok(false),
        }
        Ok(true)
    });
    let runs = runs.unwrap_or(if quick { 50 } else { 200 });
    let load = Duration::from_secs(if quick { 1 } else { 3 });
    let interval = redn_manager::auditor::DEFAULT_INTERVAL;
    println!(
        "auditor_bench: softnic with 2 PUs, auditor round every {} µs; times in µs",
        interval.as_micros()
    );
    println!("{:<52} {:>10} {:>10}", "", "p50", "p99");
    termination(runs, interval);
    cpu_share(n_offloads, load, interval);
    neighbour(runs, interval);
}

/// One GET through a well-behaved server-loop: from posting its trigger until the offload
/// has run the round's WQEs (the response is the round's last WQE), in µs.
fn one_get(m: &mut Manager, auditor: &mut Auditor, handle: u64, trigger: &[u8]) -> f64 {
    let wqes = |m: &Manager| {
        m.admin_offloads()
            .offloads
            .iter()
            .find(|o| o.handle == handle)
            .map_or(0, |o| o.wqes)
    };
    let before = wqes(m);
    let t0 = Instant::now();
    m.test_run(handle, trigger, 1).expect("test run");
    let deadline = t0 + Duration::from_secs(10);
    while wqes(m) < before + 24 {
        if auditor.due(SystemClock) {
            m.audit_round(auditor, SystemClock);
        }
        assert!(Instant::now() < deadline, "the GET was never served");
        std::hint::spin_loop();
    }
    ns(t0.elapsed()) / 1000.0
}

/// A well-behaved client's GET latency, idle and while a neighbour floods (throttled by the
/// auditor to its 100k WQEs/s budget).
fn neighbour(runs: usize, interval: Duration) {
    let uid = nix::unistd::getuid().as_raw();
    let policy = redn_policy::parse_policy(
        &format!(
            "[[app]]\nname = \"bench\"\nuid = {uid}\noffloads = [\"server-loop\"]\n\
             max_regions = 4\nmax_pinned = \"1G\"\nmax_queues = 64\nmax_remote_clients = 4\n\
             [app.client]\nrate_limit_kbps = \"infinity\"\nwqes_per_second = \"100k\"\n\
             wqes_per_invocation = 64\non_violation = \"throttle\"\n"
        ),
        "policy.toml",
    )
    .expect("policy");
    let nic = Arc::new(redn_sys::softnic::SoftNic::with_pus(2).expect("softnic"));
    let mut m = Manager::with_catalog(policy, nic, "softnic").expect("catalog");
    let client = m.connect(identity(uid));
    let mut auditor = Auditor::new(interval);
    let r = region(&mut m, client);
    let (calm, calm_trigger) = install(&mut m, client, &r);
    let (flood, flood_trigger) = install(&mut m, client, &r);
    m.audit_round(&mut auditor, SystemClock);
    let idle: Vec<f64> = (0..runs)
        .map(|_| one_get(&mut m, &mut auditor, calm, &calm_trigger))
        .collect();
    let mut loaded = Vec::with_capacity(runs);
    for _ in 0..runs {
        let _ = m.test_run(flood, &flood_trigger, 4096);
        loaded.push(one_get(&mut m, &mut auditor, calm, &calm_trigger));
    }
    let throttled = auditor.is_throttled(flood);
    let (i, l) = (stats(&idle), stats(&loaded));
    println!(
        "{:<52} {:>10.1} {:>10.1}",
        "well-behaved GET, idle neighbour", i.median, i.p99
    );
    println!(
        "{:<52} {:>10.1} {:>10.1}  goal p99 <= 2x idle: {}",
        "well-behaved GET, neighbour flooding",
        l.median,
        l.p99,
        verdict(l.p99 <= 2.0 * i.p99)
    );
    println!(
        "  the flooding neighbour was {}throttled; the well-behaved one {}",
        if throttled { "" } else { "NOT " },
        if auditor.is_throttled(calm) {
            "was throttled too"
        } else {
            "was left alone"
        }
    );
}

fn termination(runs: usize, interval: Duration) {
    let (mut m, client) = manager(16);
    let mut auditor = Auditor::new(interval);
    let r = region(&mut m, client);
    let mut onset = Vec::with_capacity(runs);
    let mut detect = Vec::with_capacity(runs);
    let mut round = Vec::with_capacity(runs);
    let counts = |m: &Manager| {
        let o = m.admin_offloads().offloads;
        o.first().map_or((0, 0), |o| (o.wqes, o.triggers))
    };
    for _ in 0..runs {
        let (handle, trigger) = install(&mut m, client, &r);
        // The baseline sample, as the loop takes it right after an install.
        m.audit_round(&mut auditor, SystemClock);
        let (base, _) = counts(&m);
        let t0 = Instant::now();
        m.test_run(handle, &trigger, 64).expect("test run");
        let deadline = t0 + Duration::from_secs(10);
        // When the counters first break the budget, as an observer polling them between
        // rounds sees it.
        let mut broken: Option<Instant> = None;
        loop {
            while !auditor.due(SystemClock) {
                if broken.is_none() {
                    let (wqes, triggers) = counts(&m);
                    if wqes - base > (triggers + 1) * 16 {
                        broken = Some(Instant::now());
                    }
                }
                std::hint::spin_loop();
            }
            let r0 = Instant::now();
            m.audit_round(&mut auditor, SystemClock);
            if m.installed_count() == 0 {
                let end = Instant::now();
                round.push(ns(end - r0) / 1000.0);
                onset.push(ns(end - t0) / 1000.0);
                detect.push(ns(end - broken.unwrap_or(r0)) / 1000.0);
                break;
            }
            assert!(Instant::now() < deadline, "the runaway was never stopped");
        }
        let _ = m.take_records();
    }
    let s = stats(&detect);
    println!(
        "{:<52} {:>10.1} {:>10.1}  goal p99 <= 10000: {}",
        "runaway server-loop: budget broken -> terminated",
        s.median,
        s.p99,
        verdict(s.p99 <= 10_000.0)
    );
    let s = stats(&onset);
    println!(
        "{:<52} {:>10.1} {:>10.1}",
        "  from its first trigger (3 rounds to break it)", s.median, s.p99
    );
    let s = stats(&round);
    println!(
        "{:<52} {:>10.1} {:>10.1}",
        "  the terminating round (detect + tear down)", s.median, s.p99
    );
}

fn cpu_share(n: usize, load: Duration, interval: Duration) {
    // 64 WQEs per trigger: server-loop's 56 stay within budget.
    let (mut m, client) = manager(64);
    let mut auditor = Auditor::new(interval);
    let r = region(&mut m, client);
    let offloads: Vec<(u64, Vec<u8>)> = (0..n).map(|_| install(&mut m, client, &r)).collect();
    let nic = Arc::clone(m.nic());
    let qpns: Vec<redn_sys::Qpn> = {
        let list = m.admin_offloads();
        assert_eq!(list.offloads.len(), n);
        // Every queue the NIC has: the floor reads all of them, as a round does.
        (0..4096u32)
            .map(redn_sys::Qpn)
            .filter(|q| nic.counters(*q).is_ok())
            .collect()
    };
    let mut spent = Duration::ZERO;
    let mut floor = Duration::ZERO;
    let mut rounds = 0u64;
    let mut served_before = 0u64;
    for o in m.admin_offloads().offloads {
        served_before += o.triggers;
    }
    let start = Instant::now();
    while start.elapsed() < load {
        for (h, t) in &offloads {
            let _ = m.test_run(*h, t, 64);
        }
        if auditor.due(SystemClock) {
            let r0 = Instant::now();
            m.audit_round(&mut auditor, SystemClock);
            spent += r0.elapsed();
            let f0 = Instant::now();
            let mut sum = 0u64;
            for q in &qpns {
                if let Ok(c) = nic.counters(*q) {
                    sum = sum.wrapping_add(c.total_wqes());
                }
            }
            std::hint::black_box(sum);
            floor += f0.elapsed();
            rounds += 1;
        } else {
            std::thread::yield_now();
        }
    }
    let wall = start.elapsed();
    let mut served = 0u64;
    for o in m.admin_offloads().offloads {
        served += o.triggers;
    }
    assert_eq!(
        m.installed_count(),
        n,
        "a well-behaved offload was terminated"
    );
    let share = spent.as_secs_f64() / wall.as_secs_f64() * 100.0;
    let floor_share = floor.as_secs_f64() / wall.as_secs_f64() * 100.0;
    let completions = (served - served_before) as f64 * 24.0 / wall.as_secs_f64();
    println!(
        "auditor CPU share, {n} server-loops serving ({:.2} M WQEs/s, {rounds} rounds): \
         {share:.3} % of one core  goal <= 1 %: {}",
        completions / 1e6,
        verdict(share <= 1.0)
    );
    println!("  native floor, reading every queue's counters each round: {floor_share:.3} %");
}
