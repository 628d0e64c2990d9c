//! Time the hypervisor took from this VM's CPUs while something was measured.
//!
//! On a virtual machine the host may run other guests on the physical cores that back this
//! one's vCPUs. The guest's kernel counts that time as *steal* (the eighth figure of the
//! `cpu` line of `/proc/stat`, in `USER_HZ` ticks). A stolen millisecond is one in which
//! nothing of ours ran, so a rate measured over a stretch with 20 % steal is about a fifth
//! low, through no cost of the code measured. The benchmarks print the share beside each
//! target so that a figure missed in such a stretch is told from one missed by the code.
//! A tick is 10 ms (`USER_HZ` is 100 on Linux), so a 2-CPU machine counts 200 a second: over
//! a stretch of a tenth of a second the share moves in steps of 5 %.

/// A reading of the whole machine's CPU time, by kind, from `/proc/stat`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CpuTimes {
    /// Ticks the hypervisor took (`steal`).
    pub steal: u64,
    /// Ticks of every kind, `steal` included (`user` through `steal`; `guest` is counted in
    /// `user` already).
    pub total: u64,
}

impl CpuTimes {
    /// Read `/proc/stat` now; `None` where it cannot be read or has no steal figure (not
    /// Linux, or a kernel before 2.6.11).
    #[must_use]
    pub fn now() -> Option<CpuTimes> {
        CpuTimes::parse(&std::fs::read_to_string("/proc/stat").ok()?)
    }

    /// The first line of `/proc/stat` as `CpuTimes`: `cpu  user nice system idle iowait irq
    /// softirq steal ...`.
    #[must_use]
    pub fn parse(stat: &str) -> Option<CpuTimes> {
        let line = stat.lines().next()?;
        let mut fields = line.split_whitespace();
        if fields.next()? != "cpu" {
            return None;
        }
        let ticks: Vec<u64> = fields
            .take(8)
            .map(str::parse)
            .collect::<Result<_, _>>()
            .ok()?;
        let steal = *ticks.get(7)?;
        Some(CpuTimes {
            steal,
            total: ticks.iter().sum(),
        })
    }

    /// The share (0 to 1) of all CPUs' time from `earlier` to `self` that the hypervisor
    /// took; `None` if no tick passed between the two (too short a stretch to say).
    #[must_use]
    pub fn steal_since(&self, earlier: &CpuTimes) -> Option<f64> {
        let total = self.total.checked_sub(earlier.total)?;
        let steal = self.steal.checked_sub(earlier.steal)?;
        #[allow(clippy::cast_precision_loss)] // tick counts far below 2^52
        (total > 0).then(|| steal as f64 / total as f64)
    }
}

/// Steal over a stretch that began when this was made.
#[derive(Clone, Copy, Debug)]
pub struct StealMeter {
    start: Option<CpuTimes>,
}

impl StealMeter {
    /// Start counting now.
    #[must_use]
    pub fn start() -> StealMeter {
        StealMeter {
            start: CpuTimes::now(),
        }
    }

    /// The share of the CPUs' time stolen since [`StealMeter::start`] (`None`: unknown, or
    /// no tick passed), and start again from now.
    pub fn lap(&mut self) -> Option<f64> {
        let now = CpuTimes::now();
        let share = match (now, self.start) {
            (Some(now), Some(start)) => now.steal_since(&start),
            _ => None,
        };
        self.start = now;
        share
    }
}

/// A share of stolen time for a table cell: "14%", or "-" when unknown.
#[must_use]
pub fn fmt_share(share: Option<f64>) -> String {
    share.map_or_else(|| "-".to_owned(), |s| format!("{:.0}%", s * 100.0))
}

/// Words to put after a target's verdict: empty when little was stolen, else how much, and
/// that the figure is low by about as much.
#[must_use]
pub fn verdict_note(share: Option<f64>) -> String {
    match share {
        Some(s) if s >= NOTABLE => format!(
            " (the hypervisor took {} of the CPUs' time while it ran: the rate is low by about as much)",
            fmt_share(Some(s))
        ),
        _ => String::new(),
    }
}

/// From how much steal a verdict says so: a few percent is in the noise of these figures.
pub const NOTABLE: f64 = 0.05;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_eighth_figure_of_the_cpu_line_is_steal_and_the_first_eight_the_total() {
        let stat = "cpu  100 5 50 800 10 0 5 30 7 0\ncpu0 1 2 3 4 5 6 7 8 0 0\n";
        let t = CpuTimes::parse(stat).expect("parsed");
        assert_eq!(t.steal, 30);
        assert_eq!(t.total, 1000);
    }

    #[test]
    fn a_line_without_steal_or_not_the_cpu_line_is_not_read() {
        assert_eq!(CpuTimes::parse("cpu  1 2 3 4 5 6 7\n"), None);
        assert_eq!(CpuTimes::parse("intr 1 2 3 4 5 6 7 8\n"), None);
        assert_eq!(CpuTimes::parse("cpu  1 2 x 4 5 6 7 8\n"), None);
        assert_eq!(CpuTimes::parse(""), None);
    }

    #[test]
    fn the_share_is_of_the_ticks_between_two_readings() {
        let a = CpuTimes {
            steal: 10,
            total: 1000,
        };
        let b = CpuTimes {
            steal: 40,
            total: 1200,
        };
        assert_eq!(b.steal_since(&a), Some(0.15));
        assert_eq!(a.steal_since(&a), None, "no tick: unknown");
        assert_eq!(a.steal_since(&b), None, "backwards: unknown");
        assert_eq!(fmt_share(b.steal_since(&a)), "15%");
        assert!(verdict_note(Some(0.15)).contains("15%"));
        assert_eq!(verdict_note(Some(0.01)), "");
        assert_eq!(verdict_note(None), "");
    }

    #[test]
    fn this_machine_has_a_steal_figure() {
        // Linux since 2.6.11 writes it, zero on bare metal.
        assert!(CpuTimes::now().is_some());
    }
}
