//! Pinning PU threads to CPUs ([`SoftNicConfig::pu_cpus`](super::SoftNicConfig::pu_cpus)).
//!
//! Unpinned, the kernel sometimes leaves two PUs that hand work to each other on one CPU
//! for many milliseconds while another idles, and every hand-off then waits for a context
//! switch (`docs/softnic-performance.md`, "Both PUs on one CPU"). Pinned, each PU keeps its
//! core. But a pinned PU cannot move away from another busy thread on its CPU either, so
//! pinning is the operator's choice, for cores that other threads are kept off
//! (`isolcpus`, other services' `CPUAffinity=`), as a poll-mode driver's cores are. Off by
//! default.
//!
//! Unpinned, a busy PU that finds a lower-numbered awake PU of its softnic on its CPU moves
//! itself off that PU's CPU ([`step_aside`], called from the PU loop): its CPU set narrowed,
//! which migrates it at once, then given back whole.

use crate::{Error, Result};
use std::os::unix::thread::JoinHandleExt;
use std::thread::JoinHandle;

/// CPUs a `cpu_set_t` can name (`CPU_SETSIZE`): [`SoftNicConfig::pu_cpus`] takes CPUs below it.
///
/// [`SoftNicConfig::pu_cpus`]: super::SoftNicConfig::pu_cpus
pub const MAX_CPUS: usize = 1024;

/// The CPUs the calling thread may run on (`sched_getaffinity(2)`), in order: the set the
/// PU threads it starts inherit, so the CPUs they may be pinned to.
pub fn allowed_cpus() -> Result<Vec<usize>> {
    let set = own_set().map_err(|e| Error::InvalidConfig {
        what: "pu_cpus",
        detail: format!("cannot read this process's CPUs: {e}"),
    })?;
    let is_set = |cpu: usize| {
        // SAFETY: `CPU_ISSET` reads bit `cpu` of `set`; `cpu` < CPU_SETSIZE, the set's size.
        unsafe { libc::CPU_ISSET(cpu, &set) }
    };
    Ok((0..MAX_CPUS).filter(|&cpu| is_set(cpu)).collect())
}

/// The calling thread's CPU set.
fn own_set() -> std::io::Result<libc::cpu_set_t> {
    let mut set = empty_set();
    // SAFETY: `set` is a valid, writable `cpu_set_t` of the size passed; pid 0 is this
    // thread, whose mask the kernel copies into it.
    let rc = unsafe { libc::sched_getaffinity(0, std::mem::size_of_val(&set), &mut set) };
    if rc == 0 {
        Ok(set)
    } else {
        Err(std::io::Error::last_os_error())
    }
}

/// Check that every CPU of `cpus` is one this process may run on (by [`allowed_cpus`]).
pub(crate) fn check(cpus: &[usize]) -> Result<()> {
    if cpus.is_empty() {
        return Ok(());
    }
    let allowed = allowed_cpus()?;
    match cpus.iter().find(|c| !allowed.contains(c)) {
        None => Ok(()),
        Some(cpu) => Err(Error::InvalidConfig {
            what: "pu_cpus",
            detail: format!(
                "CPU {cpu} is not one this process may run on ({})",
                ranges(&allowed)
            ),
        }),
    }
}

/// Pin the thread of `handle` to `cpu` (one [`check`] accepted).
pub(crate) fn pin(handle: &JoinHandle<()>, cpu: usize) -> Result<()> {
    // The thread of `handle` has not been joined (we hold the handle), so its `pthread_t`
    // is valid.
    pin_thread(handle.as_pthread_t(), cpu, "a PU")
}

/// Pin the calling thread to `cpu`, one of [`allowed_cpus`] (the benchmarks place their
/// native baselines' threads so).
pub fn pin_calling_thread(cpu: usize) -> Result<()> {
    // SAFETY: `pthread_self` has no preconditions and always succeeds.
    let me = unsafe { libc::pthread_self() };
    pin_thread(me, cpu, "a thread")
}

/// Pin `thread`, a thread of this process not yet joined or detached, to `cpu`; `who` names
/// it in the error.
fn pin_thread(thread: libc::pthread_t, cpu: usize, who: &str) -> Result<()> {
    let mut set = empty_set();
    if cpu < MAX_CPUS {
        // SAFETY: `set` is a valid `cpu_set_t` and `cpu` < CPU_SETSIZE, its size in bits.
        unsafe { libc::CPU_SET(cpu, &mut set) };
    }
    // SAFETY: `thread` is neither joined nor detached (`pin` borrows its JoinHandle,
    // `pin_calling_thread` passes the caller's own), so the id stays valid even if the thread
    // has exited (the call then fails, ESRCH); `set` is a valid `cpu_set_t` of the size
    // passed, which the kernel only reads.
    let rc = unsafe { libc::pthread_setaffinity_np(thread, std::mem::size_of_val(&set), &set) };
    if rc == 0 {
        Ok(())
    } else {
        Err(Error::InvalidConfig {
            what: "pu_cpus",
            detail: format!(
                "cannot pin {who} to CPU {cpu}: {}",
                std::io::Error::from_raw_os_error(rc)
            ),
        })
    }
}

/// Move the calling thread off the CPUs in `avoid` if its CPU set has others: narrow the
/// set to those (the kernel migrates a running thread out of a set it leaves before the call
/// returns), then give it its whole set back, so the thread stays where it landed and the
/// scheduler may move it again later. The CPU it landed on, or None if it did not move (no
/// CPU of its set to avoid, no other CPU in its set, or the kernel refused).
pub(crate) fn step_aside(avoid: &[u32]) -> Option<u32> {
    let whole = own_set().ok()?;
    let mut narrowed = whole;
    for cpu in avoid.iter().filter_map(|&c| usize::try_from(c).ok()) {
        if cpu < MAX_CPUS {
            // SAFETY: `narrowed` is a valid `cpu_set_t` and `cpu` < CPU_SETSIZE, its size.
            unsafe { libc::CPU_CLR(cpu, &mut narrowed) };
        }
    }
    // SAFETY: `CPU_COUNT` only reads the valid set `narrowed`.
    let others = unsafe { libc::CPU_COUNT(&narrowed) };
    // SAFETY: `CPU_EQUAL` only reads the valid sets `narrowed` and `whole`.
    let unchanged = unsafe { libc::CPU_EQUAL(&narrowed, &whole) };
    if others == 0 || unchanged {
        // Nowhere else to go, or nothing to leave.
        return None;
    }
    // SAFETY: pid 0 is the calling thread; `narrowed` is a valid `cpu_set_t` of the size
    // passed.
    let rc = unsafe { libc::sched_setaffinity(0, std::mem::size_of_val(&narrowed), &narrowed) };
    if rc != 0 {
        return None;
    }
    let landed = super::wake::current_cpu();
    // SAFETY: as above, with the set the thread had; the kernel accepted it before, so the
    // call only fails if the CPUs went offline, and then the thread keeps the narrowed set,
    // which the kernel also accepted.
    let _ = unsafe { libc::sched_setaffinity(0, std::mem::size_of_val(&whole), &whole) };
    landed
}

fn empty_set() -> libc::cpu_set_t {
    // SAFETY: `cpu_set_t` is a plain bit array, for which all zeros is the empty set.
    unsafe { std::mem::zeroed() }
}

/// `0-3,6` for the CPUs 0, 1, 2, 3 and 6 (as `taskset -c` and the kernel's lists write them).
fn ranges(cpus: &[usize]) -> String {
    let mut out: Vec<String> = Vec::new();
    let mut i = 0;
    while i < cpus.len() {
        let start = cpus[i];
        while i + 1 < cpus.len() && cpus[i + 1] == cpus[i] + 1 {
            i += 1;
        }
        out.push(if cpus[i] == start {
            start.to_string()
        } else {
            format!("{start}-{}", cpus[i])
        });
        i += 1;
    }
    out.join(",")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::softnic::{SoftNic, SoftNicConfig};

    /// `Cpus_allowed_list` of the thread called `name`, once it has named itself (a new
    /// thread sets its name when it starts running).
    fn cpus_of_started(name: &str) -> Vec<String> {
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        loop {
            let found = cpus_of_threads(name);
            if !found.is_empty() || std::time::Instant::now() > deadline {
                return found;
            }
            std::thread::sleep(std::time::Duration::from_millis(1));
        }
    }

    /// `Cpus_allowed_list` of each of this process's threads called `name`.
    fn cpus_of_threads(name: &str) -> Vec<String> {
        let mut found = Vec::new();
        for task in std::fs::read_dir("/proc/self/task").unwrap() {
            let dir = task.unwrap().path();
            let Ok(comm) = std::fs::read_to_string(dir.join("comm")) else {
                continue;
            };
            if comm.trim_end() != name {
                continue;
            }
            let status = std::fs::read_to_string(dir.join("status")).unwrap();
            let line = status
                .lines()
                .find_map(|l| l.strip_prefix("Cpus_allowed_list:"))
                .unwrap();
            found.push(line.trim().to_owned());
        }
        found
    }

    #[test]
    fn each_pu_thread_runs_only_on_its_cpu() {
        let cpus = allowed_cpus().unwrap();
        let last = *cpus.last().unwrap();
        let mut cfg = SoftNicConfig::new("pin-test");
        cfg.pus = 3;
        cfg.pu_cpus = vec![last, cpus[0]];
        let nic = SoftNic::new(cfg).unwrap();
        assert_eq!(cpus_of_started("pin-test-pu0"), [last.to_string()]);
        assert_eq!(cpus_of_started("pin-test-pu1"), [cpus[0].to_string()]);
        // PU 2 takes the list from its start again.
        assert_eq!(cpus_of_started("pin-test-pu2"), [last.to_string()]);
        drop(nic);
        assert!(
            cpus_of_threads("pin-test-pu0").is_empty(),
            "the PUs stop with the NIC"
        );

        let mut cfg = SoftNicConfig::new("unpinned");
        cfg.pus = 1;
        let nic = SoftNic::new(cfg).unwrap();
        assert_eq!(cpus_of_started("unpinned-pu0"), [ranges(&cpus)]);
        drop(nic);
    }

    /// The calling thread's `Cpus_allowed_list`.
    fn own_cpus() -> String {
        let status = std::fs::read_to_string("/proc/thread-self/status").unwrap();
        let line = status
            .lines()
            .find_map(|l| l.strip_prefix("Cpus_allowed_list:"))
            .unwrap();
        line.trim().to_owned()
    }

    /// A thread steps off the CPUs it is told to avoid, to one of its set, and keeps its
    /// whole set afterwards; with no other CPU in its set it stays and says so.
    #[test]
    fn a_thread_steps_off_the_cpus_it_avoids_and_keeps_its_set() {
        std::thread::spawn(|| {
            let cpus = allowed_cpus().unwrap();
            let before = own_cpus();
            let all: Vec<u32> = cpus.iter().map(|&c| u32::try_from(c).unwrap()).collect();
            assert_eq!(step_aside(&all), None, "every CPU of its set avoided");
            assert_eq!(own_cpus(), before);
            let outside: Vec<u32> = (0..=MAX_CPUS)
                .filter(|c| !cpus.contains(c))
                .map(|c| u32::try_from(c).unwrap())
                .collect();
            assert_eq!(step_aside(&outside), None, "no CPU of its set avoided");
            assert_eq!(own_cpus(), before);
            if cpus.len() < 2 {
                eprintln!("skipped the move: this process may run on one CPU only ({before})");
                return;
            }
            for &avoid in &all {
                let landed = step_aside(&[avoid]).expect("another CPU to go to");
                assert_ne!(landed, avoid, "still on the CPU it avoids");
                assert!(
                    all.contains(&landed),
                    "landed on CPU {landed}, outside {before}"
                );
                assert_eq!(own_cpus(), before, "the whole set given back");
            }
        })
        .join()
        .unwrap();
    }

    #[test]
    fn pinning_to_a_cpu_no_set_can_name_is_an_error() {
        let (tx, rx) = std::sync::mpsc::channel::<()>();
        let t = std::thread::spawn(move || {
            let _ = rx.recv();
        });
        let err = pin(&t, MAX_CPUS).unwrap_err().to_string();
        assert!(err.contains("cannot pin a PU to CPU 1024"), "{err}");
        drop(tx);
        t.join().unwrap();
    }

    #[test]
    fn a_softnic_refuses_a_cpu_it_may_not_run_on_and_starts_no_pu() {
        let cpus = allowed_cpus().unwrap();
        let outside = (0..MAX_CPUS).find(|c| !cpus.contains(c)).unwrap();
        let mut cfg = SoftNicConfig::new("pin-refused");
        cfg.pu_cpus = vec![outside];
        let err = SoftNic::new(cfg).err().unwrap().to_string();
        assert!(err.contains(&format!("CPU {outside}")), "{err}");
        assert!(cpus_of_threads("pin-refused-pu0").is_empty());
    }

    #[test]
    fn cpu_lists_are_written_as_ranges() {
        assert_eq!(ranges(&[]), "");
        assert_eq!(ranges(&[0]), "0");
        assert_eq!(ranges(&[0, 1, 2, 3, 6]), "0-3,6");
        assert_eq!(ranges(&[1, 3, 4, 7, 8, 9]), "1,3-4,7-9");
    }

    #[test]
    fn a_cpu_this_process_may_not_run_on_is_named() {
        let cpus = allowed_cpus().unwrap();
        assert!(!cpus.is_empty());
        check(&cpus).unwrap();
        let outside = (0..MAX_CPUS).find(|c| !cpus.contains(c)).unwrap();
        let err = check(&[cpus[0], outside]).unwrap_err().to_string();
        assert!(
            err.contains(&format!("CPU {outside} is not one this process may run on")),
            "{err}"
        );
    }
}
