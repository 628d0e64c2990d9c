//! An idle softnic parks its processing units instead of burning a core. Alone in its own
//! test binary so that no other test's threads add CPU time to the measurement.

mod common;
use common::*;
use redn_sys::nic::Nic;
use redn_sys::softnic::Prefetch;
use std::time::Duration;

/// CPU time (user + system) of this process, from /proc/self/stat, in clock ticks.
fn cpu_ticks() -> u64 {
    let s = std::fs::read_to_string("/proc/self/stat").unwrap();
    let after = &s[s.rfind(')').unwrap() + 2..];
    let f: Vec<&str> = after.split_whitespace().collect();
    f[11].parse::<u64>().unwrap() + f[12].parse::<u64>().unwrap()
}

#[test]
fn idle_softnic_does_not_burn_a_core() {
    let nic = nic(4, Prefetch::Depth(8));
    let pd = nic.alloc_pd().unwrap();
    let ep = endpoint(&nic, pd, |_| {});
    nic.connect(ep.qp.qpn, ep.qp.qpn).unwrap();
    nic.post_send(ep.qp.qpn, &nops(10)).unwrap();
    wait_cqes(&nic, ep.cq, 1);
    std::thread::sleep(Duration::from_millis(50));
    let t0 = cpu_ticks();
    std::thread::sleep(Duration::from_millis(500));
    let used = cpu_ticks() - t0;
    // Four spinning PUs would use ~200 ticks (at 100 Hz) in half a second, on any core count
    // >= 1 at least 50. Parked PUs use none; allow a little for other tests' threads.
    assert!(used < 15, "idle softnic used {used} ticks of CPU in 0.5 s");
    // And it still answers promptly after parking.
    nic.post_send(ep.qp.qpn, &nops(1)).unwrap();
    wait_cqes(&nic, ep.cq, 1);
}
